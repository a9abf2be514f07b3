/* cpu_conv_impl.h — typed body of im2col/col2im and max_pool2d, included by
 * cpu_conv.c once per dtype (cpu_dtypes.h) with KT and KN(name) defined. */

/* im2col of a stride-1 convolution whose output rows are as wide as the
 * input's (ow == W: "same" padding, 2 pw == kw - 1): for each (c, ki, kj)
 * the rows inside the image form one block, the input's rows shifted by
 * kj - pw columns, copied at once; the columns the shift wraps to the next
 * row are then zeroed, as are the rows above and below the image. */
static void KN(im2col_same_rows)(const KT *x, int64_t C, int64_t H, int64_t W, int64_t kh, int64_t kw,
                                 int64_t ph, int64_t pw, int64_t oh, KT *col) {
    for (int64_t c = 0; c < C; c++)
        for (int64_t ki = 0; ki < kh; ki++) {
            /* rows [oy_lo, oy_hi) read input rows iy = oy - ph + ki inside [0, H) */
            int64_t oy_lo = ph - ki > 0 ? ph - ki : 0, oy_hi = H + ph - ki < oh ? H + ph - ki : oh;
            if (oy_lo > oh) oy_lo = oh;
            if (oy_hi < oy_lo) oy_hi = oy_lo;
            const int64_t rows = oy_hi - oy_lo, n = rows * W;
            for (int64_t kj = 0; kj < kw; kj++) {
                KT *dst = col + ((c * kh + ki) * kw + kj) * oh * W;
                memset(dst, 0, (size_t)(oy_lo * W) * sizeof(KT));
                memset(dst + oy_hi * W, 0, (size_t)((oh - oy_hi) * W) * sizeof(KT));
                if (!rows) continue;
                KT *d = dst + oy_lo * W;
                const KT *s = x + (c * H + oy_lo - ph + ki) * W;
                const int64_t shift = kj - pw; /* |shift| < W: the caller checked */
                if (shift >= 0) {
                    /* d[p] = s[p + shift]; each row's last `shift` columns are padding */
                    memcpy(d, s + shift, (size_t)(n - shift) * sizeof(KT));
                    for (int64_t r = 0; r < rows; r++)
                        for (int64_t ox = W - shift; ox < W; ox++) d[r * W + ox] = 0;
                } else {
                    /* d[p] = s[p + shift] from p = -shift; each row's first -shift columns are padding */
                    memcpy(d - shift, s, (size_t)(n + shift) * sizeof(KT));
                    for (int64_t r = 0; r < rows; r++)
                        for (int64_t ox = 0; ox < -shift; ox++) d[r * W + ox] = 0;
                }
            }
        }
}

void KN(mpri_im2col)(const KT *x, int64_t C, int64_t H, int64_t W, int64_t kh, int64_t kw,
                     int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t oh, int64_t ow,
                     KT *col) {
    if (sh == 1 && sw == 1 && ow == W && pw < W && kw - 1 - pw < W) {
        KN(im2col_same_rows)(x, C, H, W, kh, kw, ph, pw, oh, col);
        return;
    }
    for (int64_t c = 0; c < C; c++)
        for (int64_t ki = 0; ki < kh; ki++)
            for (int64_t kj = 0; kj < kw; kj++) {
                KT *dst = col + ((c * kh + ki) * kw + kj) * oh * ow;
                const KT *xc = x + c * H * W;
                for (int64_t oy = 0; oy < oh; oy++) {
                    int64_t iy = oy * sh - ph + ki;
                    KT *d = dst + oy * ow;
                    if (iy < 0 || iy >= H) {
                        memset(d, 0, (size_t)ow * sizeof(KT));
                        continue;
                    }
                    const KT *xr = xc + iy * W;
                    if (sw == 1) {
                        /* contiguous run [ox_lo, ox_hi) of valid columns, zeros around it */
                        int64_t ox_lo = pw - kj > 0 ? pw - kj : 0;
                        int64_t ox_hi = W + pw - kj < ow ? W + pw - kj : ow;
                        if (ox_hi < ox_lo) ox_hi = ox_lo;
                        for (int64_t ox = 0; ox < ox_lo; ox++) d[ox] = 0;
                        if (ox_hi > ox_lo)
                            memcpy(d + ox_lo, xr + ox_lo - pw + kj,
                                   (size_t)(ox_hi - ox_lo) * sizeof(KT));
                        for (int64_t ox = ox_hi; ox < ow; ox++) d[ox] = 0;
                    } else {
                        for (int64_t ox = 0; ox < ow; ox++) {
                            int64_t ix = ox * sw - pw + kj;
                            d[ox] = (ix >= 0 && ix < W) ? xr[ix] : 0;
                        }
                    }
                }
            }
}

void KN(mpri_col2im)(const KT *col, int64_t C, int64_t H, int64_t W, int64_t kh, int64_t kw,
                     int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t oh, int64_t ow,
                     KT *gx) {
    for (int64_t c = 0; c < C; c++)
        for (int64_t ki = 0; ki < kh; ki++)
            for (int64_t kj = 0; kj < kw; kj++) {
                const KT *src = col + ((c * kh + ki) * kw + kj) * oh * ow;
                KT *gc = gx + c * H * W;
                /* With stride 1 the columns that land inside the row are
                 * one run [ox_lo, ox_hi): added without a test per element
                 * (vectorized), in the same order as the general loop. */
                int64_t ox_lo = 0, ox_hi = 0;
                if (sw == 1) {
                    ox_lo = pw - kj > 0 ? pw - kj : 0;
                    ox_hi = W + pw - kj < ow ? W + pw - kj : ow;
                    if (ox_hi < ox_lo) ox_hi = ox_lo;
                }
                for (int64_t oy = 0; oy < oh; oy++) {
                    int64_t iy = oy * sh - ph + ki;
                    if (iy < 0 || iy >= H) continue;
                    const KT *s = src + oy * ow;
                    KT *gr = gc + iy * W;
                    if (sw == 1) {
                        const int64_t shift = kj - pw; /* ix = ox + shift, inside [0, W) on the run */
                        for (int64_t ox = ox_lo; ox < ox_hi; ox++) gr[ox + shift] += s[ox];
                        continue;
                    }
                    for (int64_t ox = 0; ox < ow; ox++) {
                        int64_t ix = ox * sw - pw + kj;
                        if (ix >= 0 && ix < W) gr[ix] += s[ox];
                    }
                }
            }
}

/* One output row of a 2x2, stride-2, unpadded pooling whose two input rows
 * w0, w1 hold no NaN: the first maximum by selects (ReLU outputs tie often),
 * in loops the compiler vectorizes (the window's offset of the maximum as a
 * 32-bit lane first, then widened into the flat index); `at` is the flat
 * index of w0[0]. */
static void KN(max_pool2x2_row)(const KT *restrict w0, const KT *restrict w1, int64_t W, int64_t at, int64_t ow,
                                KT *restrict y, int64_t *restrict arg) {
    int32_t off[64];
    const int32_t w = (int32_t)W; /* W < 2^31: the caller checked */
    for (int64_t o0 = 0; o0 < ow; o0 += 64) {
        const int64_t m = ow - o0 < 64 ? ow - o0 : 64;
        const KT *r0 = w0 + 2 * o0, *r1 = w1 + 2 * o0;
        KT *yo = y + o0;
        for (int64_t i = 0; i < m; i++) {
            const KT a = r0[2 * i], b = r0[2 * i + 1], c = r1[2 * i], d = r1[2 * i + 1];
            /* masks, all ones where the later value beats the best so far */
            const int32_t tb = -(int32_t)(b > a);
            const KT m1 = b > a ? b : a;
            const int32_t tc = -(int32_t)(c > m1);
            const KT m2 = c > m1 ? c : m1;
            const int32_t td = -(int32_t)(d > m2);
            yo[i] = d > m2 ? d : m2;
            int32_t k = tb & 1;
            k = (k & ~tc) | (w & tc);
            off[i] = (k & ~td) | ((w + 1) & td);
        }
        int64_t *ao = arg + o0;
        const int64_t base = at + 2 * o0;
        for (int64_t i = 0; i < m; i++) ao[i] = base + 2 * i + off[i];
    }
}

static bool KN(has_nan)(const KT *v, int64_t n) {
    int any = 0;
    for (int64_t i = 0; i < n; i++) any |= v[i] != v[i];
    return any != 0;
}

void KN(mpri_max_pool2d_fwd)(const KT *x, int64_t NC, int64_t H, int64_t W, int64_t kh,
                             int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                             int64_t oh, int64_t ow, KT *y, int64_t *arg) {
    /* The usual pooling, 2x2 windows side by side inside the plane: row by
     * row in vectorized selects when the plane's windows hold no NaN; a
     * plane with one goes to the loop below. */
    const bool tiled = kh == 2 && kw == 2 && sh == 2 && sw == 2 && ph == 0 && pw == 0 && 2 * oh <= H && 2 * ow <= W &&
                       W < INT32_MAX;
    for (int64_t p = 0; p < NC; p++) {
        if (tiled) {
            const KT *xp = x + p * H * W;
            bool clean = true;
            for (int64_t oy = 0; oy < oh && clean; oy++) {
                const KT *w0 = xp + 2 * oy * W;
                clean = !KN(has_nan)(w0, 2 * ow) && !KN(has_nan)(w0 + W, 2 * ow);
            }
            if (clean) {
                for (int64_t oy = 0; oy < oh; oy++)
                    KN(max_pool2x2_row)(xp + 2 * oy * W, xp + (2 * oy + 1) * W, W, 2 * oy * W, ow,
                                        y + (p * oh + oy) * ow, arg + (p * oh + oy) * ow);
                continue;
            }
        }
        const KT *xp = x + p * H * W;
        for (int64_t oy = 0; oy < oh; oy++)
            for (int64_t ox = 0; ox < ow; ox++) {
                int64_t iy0 = oy * sh - ph, ix0 = ox * sw - pw;
                if (kh == 2 && kw == 2 && iy0 >= 0 && ix0 >= 0 && iy0 + 1 < H && ix0 + 1 < W) {
                    /* A 2x2 window inside the plane (the usual pooling): the
                     * loop below unrolled, the same order and rules. */
                    const KT *w0 = xp + iy0 * W + ix0, *w1 = w0 + W;
                    const KT a = w0[0], b = w0[1], c = w1[0], d = w1[1];
                    /* A NaN (rare, so this branch predicts well) goes to
                     * the general loop. Otherwise the first maximum by
                     * selects, not branches: ReLU outputs tie often, and
                     * mispredicted compares cost more than the pooling. */
                    if (isnan(a) || isnan(b) || isnan(c) || isnan(d)) goto general;
                    const int64_t at0 = iy0 * W + ix0;
                    KT best = a;
                    int64_t bi = at0, take;
                    /* take: all ones when the value beats the best so far */
                    take = -(int64_t)(b > best);
                    bi = (bi & ~take) | ((at0 + 1) & take);
                    best = b > best ? b : best;
                    take = -(int64_t)(c > best);
                    bi = (bi & ~take) | ((at0 + W) & take);
                    best = c > best ? c : best;
                    take = -(int64_t)(d > best);
                    bi = (bi & ~take) | ((at0 + W + 1) & take);
                    best = d > best ? d : best;
                    y[(p * oh + oy) * ow + ox] = best;
                    arg[(p * oh + oy) * ow + ox] = bi;
                    continue;
                }
            general:;
                KT best = -INFINITY;
                int64_t bi = -1;
                for (int64_t ki = 0; ki < kh; ki++) {
                    int64_t iy = oy * sh - ph + ki;
                    if (iy < 0 || iy >= H) continue;
                    for (int64_t kj = 0; kj < kw; kj++) {
                        int64_t ix = ox * sw - pw + kj;
                        if (ix < 0 || ix >= W) continue;
                        KT v = xp[iy * W + ix];
                        /* first max wins; a nan propagates like PyTorch */
                        if (bi < 0 || v > best || isnan(v)) {
                            best = v;
                            bi = iy * W + ix;
                            if (isnan(v)) goto done;
                        }
                    }
                }
            done:
                y[(p * oh + oy) * ow + ox] = best;
                arg[(p * oh + oy) * ow + ox] = bi < 0 ? 0 : bi;
            }
    }
}

void KN(mpri_max_pool2d_bwd)(const KT *gy, const int64_t *arg, int64_t NC, int64_t H, int64_t W,
                             int64_t oh, int64_t ow, KT *gx) {
    for (int64_t p = 0; p < NC; p++) {
        const KT *g = gy + p * oh * ow;
        const int64_t *a = arg + p * oh * ow;
        KT *gp = gx + p * H * W;
        for (int64_t q = 0; q < oh * ow; q++) gp[a[q]] += g[q];
    }
}
