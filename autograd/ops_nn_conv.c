/* ops_nn_conv.c — 2-D convolution (conv2d) by im2col + GEMM, with backward.
 *
 * Forward, per image n: col = im2col(x[n]) [C*kh*kw, OH*OW];
 * y[n] = W [OC, C*kh*kw] @ col, added onto the bias broadcast over images
 * and positions. Backward, per image: gW += gy[n] @ col^T, gcol = W^T @ gy[n],
 * gx[n] = col2im(gcol); gbias = sum of gy over images and positions. The
 * column buffer is recomputed in backward rather than saved (it is
 * kh*kw times larger than the input), and skipped for 1x1 stride-1 unpadded
 * kernels (col is then x[n] itself).
 *
 * Every kernel (im2col, col2im, the GEMMs, the bias copy and sum) goes
 * through the backend of the inputs' device (kernels/mpri_kernels.h); a
 * backend without im2col/col2im (CUDA today) makes conv2d fail with
 * MPR_ERR_UNSUPPORTED naming the kernel, except for 1x1 stride-1 unpadded
 * kernels, which need neither.
 *
 * Invariants: the inputs share one device and a float dtype; saved tensors
 * are the contiguous input and weight; the node's mpri_ctx_conv2d_t holds
 * strides and paddings; the column buffers are scratch tensors on that
 * device, released before return. */
#include "mpri_args.h"
#include "mpri_nn_ops.h"

static bool geom_is_identity(const mpri_conv2d_geom_t *g) {
    return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

typedef struct mpri_ctx_conv2d {
    int64_t stride_h, stride_w, pad_h, pad_w;
} mpri_ctx_conv2d_t;

static mpr_err_t conv_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    mpr_tensor_t *x = mpri_node_saved(n, 0), *w = mpri_node_saved(n, 1);
    if (!x || !w) return mpr_last_error_code();
    mpr_dtype_t dt = x->dtype;
    int dev = mpri_nn_dev(x);
    const mpri_ctx_conv2d_t *st = MPRI_NODE_STATE(n, mpri_ctx_conv2d_t);
    int64_t N = x->shape[0], OC = w->shape[0];
    mpri_conv2d_geom_t g = {x->shape[1], x->shape[2], x->shape[3], w->shape[2], w->shape[3], st->stride_h,
                            st->stride_w, st->pad_h, st->pad_w, 0, 0};
    bool need_x = mpri_node_needs_grad(n, 0), need_w = mpri_node_needs_grad(n, 1),
         need_b = n->n_next > 2 && mpri_node_needs_grad(n, 2);
    const mpri_backend_t *B = mpri_backend_for(n->def->name, dev);
    if (!B) return mpr_last_error_code();
    mpr_tensor_t *gy = mpri_contiguous_raw(gout[0]);
    if (!gy) return mpr_last_error_code();
    g.oh = gy->shape[2];
    g.ow = gy->shape[3];
    int64_t ckk = g.C * g.kh * g.kw, hw = g.oh * g.ow;
    size_t esz = mpr_dtype_size(dt);
    bool ident = geom_is_identity(&g);
    mpr_tensor_t *gx = need_x ? mpri_full_on(dev, dt, 4, x->shape, 0.0) : NULL;
    mpr_tensor_t *gw = need_w ? mpri_full_on(dev, dt, 4, w->shape, 0.0) : NULL;
    mpr_tensor_t *gb = need_b ? mpri_full_on(dev, dt, 1, (int64_t[]){OC}, 0.0) : NULL;
    mpr_tensor_t *col = ident ? NULL : mpri_empty_on(dev, dt, 2, (int64_t[]){ckk, hw});
    mpr_tensor_t *gcol = (need_x && !ident) ? mpri_empty_on(dev, dt, 2, (int64_t[]){ckk, hw}) : NULL;
    mpr_err_t e = MPR_OK;
    if ((need_x && !gx) || (need_w && !gw) || (need_b && !gb) || (!ident && !col) || (need_x && !ident && !gcol)) {
        e = mpr_last_error_code();
        goto out;
    }
    const char *xd = mpr_tensor_data(x), *gyd = mpr_tensor_data(gy);
    for (int64_t i = 0; i < N && e == MPR_OK; i++) {
        const void *xi = xd + (size_t)(i * g.C * g.H * g.W) * esz;
        const void *gyi = gyd + (size_t)(i * OC * hw) * esz;
        if (need_w) {
            const void *ci = xi;
            if (!ident) {
                e = MPRI_BK(B, im2col, dev, dt, &g, xi, mpr_tensor_data(col));
                ci = mpr_tensor_data(col);
            }
            if (e == MPR_OK)
                e = MPRI_BK(B, gemm, dev, dt, false, true, OC, ckk, hw, 1.0, gyi, hw, ci, hw, 1.0, mpr_tensor_data(gw),
                            ckk);
        }
        if (need_x && e == MPR_OK) {
            void *gxi = (char *)mpr_tensor_data(gx) + (size_t)(i * g.C * g.H * g.W) * esz;
            void *dst = ident ? gxi : mpr_tensor_data(gcol);
            e = MPRI_BK(B, gemm, dev, dt, true, false, ckk, hw, OC, 1.0, mpr_tensor_data(w), ckk, gyi, hw, 0.0, dst,
                        hw);
            if (e == MPR_OK && !ident) e = MPRI_BK(B, col2im, dev, dt, &g, mpr_tensor_data(gcol), gxi);
        }
    }
    if (need_b && e == MPR_OK) { /* gb[oc] += gy[n, oc, q] over n and q */
        int64_t shape[3] = {N, OC, hw}, sb[3] = {0, 1, 0}, sy[3] = {OC * hw, hw, 1};
        e = MPRI_BK(B, sum_into, dev, dt, 3, shape, mpr_tensor_data(gb), sb, gyd, sy);
    }
    if (e == MPR_OK) {
        gin[0] = gx;
        gin[1] = gw;
        if (need_b) gin[2] = gb;
    }
out: /* gx, gw, gb are results in the engine's scope: it frees them on failure */
    mpr_tensor_release(col);
    mpr_tensor_release(gcol);
    mpr_tensor_release(gy);
    return e;
}

static const mpri_op_def_t conv_def = {.name = "conv2d", .backward = conv_backward, MPRI_OP_STATE(mpri_ctx_conv2d_t)};

/* y = bias (broadcast) + W @ im2col(x), image by image, on the backend B of device dev. */
static mpr_err_t conv_forward(const mpri_backend_t *B, int dev, mpr_dtype_t dt, const mpri_conv2d_geom_t *g,
                              int64_t N, int64_t OC, mpr_tensor_t *xc, mpr_tensor_t *wc, mpr_tensor_t *bc,
                              mpr_tensor_t *col, mpr_tensor_t *y) {
    size_t esz = mpr_dtype_size(dt);
    int64_t ckk = g->C * g->kh * g->kw, hw = g->oh * g->ow;
    mpr_err_t e = MPR_OK;
    const char *xd = mpr_tensor_data(xc);
    char *yd = mpr_tensor_data(y);
    if (bc) { /* y[n, oc, q] = bias[oc]; the GEMMs then add W @ col */
        int64_t shape[3] = {N, OC, hw}, sy[3] = {OC * hw, hw, 1}, sb[3] = {0, 1, 0};
        e = MPRI_BK(B, copy, dev, 3, shape, dt, yd, sy, dt, mpr_tensor_data(bc), sb);
    }
    for (int64_t i = 0; i < N && e == MPR_OK; i++) {
        const void *xi = xd + (size_t)(i * g->C * g->H * g->W) * esz;
        void *yi = yd + (size_t)(i * OC * hw) * esz;
        const void *ci = xi;
        if (col) {
            e = MPRI_BK(B, im2col, dev, dt, g, xi, mpr_tensor_data(col));
            ci = mpr_tensor_data(col);
        }
        if (e == MPR_OK)
            e = MPRI_BK(B, gemm, dev, dt, false, false, OC, hw, ckk, 1.0, mpr_tensor_data(wc), ckk, ci, hw,
                        bc ? 1.0 : 0.0, yi, hw);
    }
    return e;
}

mpr_tensor_t *mpr_conv2d(mpr_tensor_t *x, mpr_tensor_t *weight, mpr_tensor_t *bias, int64_t sh,
                         int64_t sw, int64_t ph, int64_t pw) {
    MPRI_OP_INPUT(x);
    MPRI_OP_INPUT(weight);
    if (!x || !weight) return NULL;
    const char *op = "conv2d";
    if (mpri_check_float(op, x) != MPR_OK || mpri_check_same_dtype(op, x, weight) != MPR_OK) return NULL;
    if (bias && mpri_check_same_dtype(op, x, bias) != MPR_OK) return NULL;
    const mpri_backend_t *B = mpri_backend_of(op, 3, (mpr_tensor_t *[]){x, weight, bias});
    if (!B) return NULL;
    char bx[96], bw[96], bb[96];
    if (x->ndim != 4 || weight->ndim != 4 || x->shape[1] != weight->shape[1]) {
        mpr_error_set(MPR_ERR_SHAPE,
                      "conv2d: expected input [N, C, H, W] and weight [OC, C, kh, kw] with the "
                      "same C, got input %s and weight %s",
                      mpri_nn_shape(x, bx, sizeof bx), mpri_nn_shape(weight, bw, sizeof bw));
        return NULL;
    }
    if (bias && (bias->ndim != 1 || bias->shape[0] != weight->shape[0])) {
        mpr_error_set(MPR_ERR_SHAPE, "conv2d: bias %s does not match weight %s (want [%lld])",
                      mpri_nn_shape(bias, bb, sizeof bb), mpri_nn_shape(weight, bw, sizeof bw),
                      (long long)weight->shape[0]);
        return NULL;
    }
    if (sh < 1 || sw < 1 || ph < 0 || pw < 0) {
        mpr_error_set(MPR_ERR_INVALID_ARG,
                      "conv2d: stride must be >= 1 and padding >= 0, got stride (%lld, %lld) "
                      "padding (%lld, %lld)",
                      (long long)sh, (long long)sw, (long long)ph, (long long)pw);
        return NULL;
    }
    int64_t N = x->shape[0], OC = weight->shape[0];
    mpri_conv2d_geom_t g = {x->shape[1], x->shape[2], x->shape[3], weight->shape[2], weight->shape[3], sh, sw, ph,
                            pw, 0, 0};
    if (g.H + 2 * ph < g.kh || g.W + 2 * pw < g.kw || g.kh < 1 || g.kw < 1) {
        mpr_error_set(MPR_ERR_SHAPE,
                      "conv2d: kernel %lldx%lld is larger than the padded input %s (padding "
                      "%lld, %lld)",
                      (long long)g.kh, (long long)g.kw, mpri_nn_shape(x, bx, sizeof bx),
                      (long long)ph, (long long)pw);
        return NULL;
    }
    g.oh = (g.H + 2 * ph - g.kh) / sh + 1;
    g.ow = (g.W + 2 * pw - g.kw) / sw + 1;
    if (!geom_is_identity(&g) && (!B->im2col || !B->col2im)) {
        mpri_backend_missing(op, B, B->im2col ? "col2im" : "im2col");
        return NULL;
    }
    mpr_dtype_t dt = x->dtype;
    int dev = mpri_nn_dev(x);
    int64_t ckk = g.C * g.kh * g.kw, hw = g.oh * g.ow;
    mpr_tensor_t *xc = mpri_contiguous_raw(x), *wc = mpri_contiguous_raw(weight);
    mpr_tensor_t *bc = bias ? mpri_contiguous_raw(bias) : NULL;
    mpr_tensor_t *y = mpri_empty_on(dev, dt, 4, (int64_t[]){N, OC, g.oh, g.ow});
    mpr_tensor_t *col = geom_is_identity(&g) ? NULL : mpri_empty_on(dev, dt, 2, (int64_t[]){ckk, hw});
    bool ok = xc && wc && (!bias || bc) && y && (geom_is_identity(&g) || col) &&
              conv_forward(B, dev, dt, &g, N, OC, xc, wc, bc, col, y) == MPR_OK;
    mpr_tensor_release(col);
    mpr_tensor_release(bc);
    mpri_node_t *n = NULL;
    if (ok)
        n = bias ? mpri_record(&conv_def, 3, (mpr_tensor_t *[]){x, weight, bias}, y)
                 : mpri_record(&conv_def, 2, (mpr_tensor_t *[]){x, weight}, y);
    if (n) {
        *MPRI_NODE_STATE(n, mpri_ctx_conv2d_t) =
            (mpri_ctx_conv2d_t){.stride_h = sh, .stride_w = sw, .pad_h = ph, .pad_w = pw};
        mpri_node_save(n, xc);
        mpri_node_save(n, wc);
    }
    mpr_tensor_release(xc);
    mpr_tensor_release(wc);
    if (!ok) {
        mpr_tensor_release(y);
        return NULL;
    }
    return mpri_result(y);
}
