/* cpu_conv_impl.h — typed body of im2col/col2im and max_pool2d, included by
 * cpu_conv.c once per dtype (cpu_dtypes.h) with KT and KN(name) defined. */

void KN(mpri_im2col)(const KT *x, int64_t C, int64_t H, int64_t W, int64_t kh, int64_t kw,
                     int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t oh, int64_t ow,
                     KT *col) {
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

void KN(mpri_max_pool2d_fwd)(const KT *x, int64_t NC, int64_t H, int64_t W, int64_t kh,
                             int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                             int64_t oh, int64_t ow, KT *y, int64_t *arg) {
    for (int64_t p = 0; p < NC; p++) {
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
