/* ops_nn_conv.c — 2-D convolution (conv2d) by im2col + GEMM, with backward.
 *
 * Forward, per image n: col = im2col(x[n]) [C*kh*kw, OH*OW];
 * y[n] = W [OC, C*kh*kw] @ col (+ bias per output channel) — one cblas
 * GEMM. Backward, per image: gW += gy[n] @ col^T, gcol = W^T @ gy[n],
 * gx[n] = col2im(gcol); gbias = sum of gy over images and positions. The
 * column buffer is recomputed in backward rather than saved (it is
 * kh*kw times larger than the input), and skipped for 1x1 stride-1 unpadded
 * kernels (col is then x[n] itself).
 *
 * Invariants: saved tensors are the contiguous input and weight; the node's
 * mpri_ctx_conv2d_t holds strides and paddings; the column buffer is private scratch freed before return. */
#include <cblas.h>
#include <stdlib.h>

#include "mpri_args.h"
#include "mpri_nn_ops.h"

/* C[m, n] = alpha op(A) op(B) + beta C, row-major, in the tensor's dtype. */
static void gemm(mpr_dtype_t dt, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void *A,
                 int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
    enum CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
    if (dt == MPR_F32)
        cblas_sgemm(CblasRowMajor, TA, TB, (int)m, (int)n, (int)k, 1.0f, A, (int)lda, B, (int)ldb,
                    (float)beta, C, (int)ldc);
    else
        cblas_dgemm(CblasRowMajor, TA, TB, (int)m, (int)n, (int)k, 1.0, A, (int)lda, B, (int)ldb,
                    beta, C, (int)ldc);
}

typedef struct {
    int64_t N, C, H, W, OC, kh, kw, sh, sw, ph, pw, oh, ow;
} conv_geom_t;

static bool geom_is_identity(const conv_geom_t *g) {
    return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

static void im2col(mpr_dtype_t dt, const conv_geom_t *g, const void *x, void *col) {
    if (dt == MPR_F32)
        mpri_im2col_f32(x, g->C, g->H, g->W, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->oh,
                        g->ow, col);
    else
        mpri_im2col_f64(x, g->C, g->H, g->W, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->oh,
                        g->ow, col);
}

typedef struct mpri_ctx_conv2d {
    int64_t stride_h, stride_w, pad_h, pad_w;
} mpri_ctx_conv2d_t;

static mpr_err_t conv_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    mpr_tensor_t *x = mpri_node_saved(n, 0), *w = mpri_node_saved(n, 1);
    if (!x || !w) return mpr_last_error_code();
    mpr_dtype_t dt = x->dtype;
    const mpri_ctx_conv2d_t *st = MPRI_NODE_STATE(n, mpri_ctx_conv2d_t);
    conv_geom_t g = {x->shape[0], x->shape[1], x->shape[2], x->shape[3], w->shape[0],
                     w->shape[2], w->shape[3], st->stride_h, st->stride_w, st->pad_h,
                     st->pad_w, 0, 0};
    bool need_x = mpri_node_needs_grad(n, 0), need_w = mpri_node_needs_grad(n, 1),
         need_b = n->n_next > 2 && mpri_node_needs_grad(n, 2);
    mpr_tensor_t *gy = mpr_tensor_contiguous(gout[0]);
    if (!gy) return mpr_last_error_code();
    g.oh = gy->shape[2];
    g.ow = gy->shape[3];
    int64_t ckk = g.C * g.kh * g.kw, hw = g.oh * g.ow;
    size_t esz = mpr_dtype_size(dt);
    bool ident = geom_is_identity(&g);
    mpr_tensor_t *gx = need_x ? mpr_zeros(dt, 4, x->shape) : NULL;
    mpr_tensor_t *gw = need_w ? mpr_zeros(dt, 4, w->shape) : NULL;
    mpr_tensor_t *gb = need_b ? mpr_zeros(dt, 1, (int64_t[]){g.OC}) : NULL;
    void *col = ident ? NULL : malloc((size_t)(ckk * hw) * esz);
    void *gcol = (need_x && !ident) ? malloc((size_t)(ckk * hw) * esz) : NULL;
    mpr_err_t err = MPR_OK;
    if ((need_x && !gx) || (need_w && !gw) || (need_b && !gb) || (!ident && !col) ||
        (need_x && !ident && !gcol)) {
        err = mpr_error_set(MPR_ERR_NOMEM, "conv2d backward: out of memory");
        goto out;
    }
    const char *xd = mpr_tensor_data(x), *gyd = mpr_tensor_data(gy);
    for (int64_t i = 0; i < g.N; i++) {
        const void *xi = xd + (size_t)(i * g.C * g.H * g.W) * esz;
        const void *gyi = gyd + (size_t)(i * g.OC * hw) * esz;
        if (need_w) {
            const void *ci = xi;
            if (!ident) {
                im2col(dt, &g, xi, col);
                ci = col;
            }
            gemm(dt, false, true, g.OC, ckk, hw, gyi, hw, ci, hw, 1.0, mpr_tensor_data(gw), ckk);
        }
        if (need_x) {
            void *gxi = (char *)mpr_tensor_data(gx) + (size_t)(i * g.C * g.H * g.W) * esz;
            if (ident) {
                gemm(dt, true, false, ckk, hw, g.OC, mpr_tensor_data(w), ckk, gyi, hw, 0.0, gxi, hw);
            } else {
                gemm(dt, true, false, ckk, hw, g.OC, mpr_tensor_data(w), ckk, gyi, hw, 0.0, gcol, hw);
                if (dt == MPR_F32)
                    mpri_col2im_f32(gcol, g.C, g.H, g.W, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.oh,
                                    g.ow, gxi);
                else
                    mpri_col2im_f64(gcol, g.C, g.H, g.W, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.oh,
                                    g.ow, gxi);
            }
        }
        if (need_b) {
            for (int64_t oc = 0; oc < g.OC; oc++) {
                if (dt == MPR_F32) {
                    const float *r = (const float *)gyi + oc * hw;
                    float s = 0;
                    for (int64_t q = 0; q < hw; q++) s += r[q];
                    ((float *)mpr_tensor_data(gb))[oc] += s;
                } else {
                    const double *r = (const double *)gyi + oc * hw;
                    double s = 0;
                    for (int64_t q = 0; q < hw; q++) s += r[q];
                    ((double *)mpr_tensor_data(gb))[oc] += s;
                }
            }
        }
    }
    gin[0] = gx;
    gin[1] = gw;
    if (need_b) gin[2] = gb;
out:
    free(col);
    free(gcol);
    mpr_tensor_release(gy);
    return err;
}

static const mpri_op_def_t conv_def = {.name = "conv2d", .backward = conv_backward, MPRI_OP_STATE(mpri_ctx_conv2d_t)};

mpr_tensor_t *mpr_conv2d(mpr_tensor_t *x, mpr_tensor_t *weight, mpr_tensor_t *bias, int64_t sh,
                         int64_t sw, int64_t ph, int64_t pw) {
    MPRI_OP_INPUT(x);
    MPRI_OP_INPUT(weight);
    if (!x || !weight) return NULL;
    const char *op = "conv2d";
    if (mpri_nn_check_float_cpu(op, x) != MPR_OK || mpri_nn_check_cpu(op, weight) != MPR_OK ||
        mpri_check_same_dtype(op, x, weight) != MPR_OK)
        return NULL;
    if (bias && (mpri_nn_check_cpu(op, bias) != MPR_OK ||
                 mpri_check_same_dtype(op, x, bias) != MPR_OK))
        return NULL;
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
    conv_geom_t g = {x->shape[0], x->shape[1], x->shape[2], x->shape[3], weight->shape[0],
                     weight->shape[2], weight->shape[3], sh, sw, ph, pw, 0, 0};
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
    mpr_dtype_t dt = x->dtype;
    size_t esz = mpr_dtype_size(dt);
    int64_t ckk = g.C * g.kh * g.kw, hw = g.oh * g.ow;
    bool ident = geom_is_identity(&g);
    mpr_tensor_t *xc = mpr_tensor_contiguous(x), *wc = mpr_tensor_contiguous(weight);
    mpr_tensor_t *bc = bias ? mpr_tensor_contiguous(bias) : NULL;
    mpr_tensor_t *y = mpr_tensor_empty(dt, 4, (int64_t[]){g.N, g.OC, g.oh, g.ow});
    void *col = ident ? NULL : malloc((size_t)(ckk * hw) * esz + 1);
    if (!xc || !wc || (bias && !bc) || !y || (!ident && !col)) {
        if (!ident && !col) mpr_error_set(MPR_ERR_NOMEM, "conv2d: out of memory");
        mpr_tensor_release(xc);
        mpr_tensor_release(wc);
        mpr_tensor_release(bc);
        mpr_tensor_release(y);
        free(col);
        return NULL;
    }
    const char *xd = mpr_tensor_data(xc);
    char *yd = mpr_tensor_data(y);
    for (int64_t i = 0; i < g.N; i++) {
        const void *xi = xd + (size_t)(i * g.C * g.H * g.W) * esz;
        void *yi = yd + (size_t)(i * g.OC * hw) * esz;
        const void *ci = xi;
        if (!ident) {
            im2col(dt, &g, xi, col);
            ci = col;
        }
        if (bc) { /* y = bias broadcast, then y += W @ col */
            for (int64_t oc = 0; oc < g.OC; oc++) {
                if (dt == MPR_F32) {
                    float v = ((const float *)mpr_tensor_data(bc))[oc], *r = (float *)yi + oc * hw;
                    for (int64_t q = 0; q < hw; q++) r[q] = v;
                } else {
                    double v = ((const double *)mpr_tensor_data(bc))[oc],
                           *r = (double *)yi + oc * hw;
                    for (int64_t q = 0; q < hw; q++) r[q] = v;
                }
            }
        }
        gemm(dt, false, false, g.OC, hw, ckk, mpr_tensor_data(wc), ckk, ci, hw, bc ? 1.0 : 0.0, yi,
             hw);
    }
    free(col);
    mpri_node_t *n = bias ? mpri_record(&conv_def, 3, (mpr_tensor_t *[]){x, weight, bias}, y)
                          : mpri_record(&conv_def, 2, (mpr_tensor_t *[]){x, weight}, y);
    if (n) {
        *MPRI_NODE_STATE(n, mpri_ctx_conv2d_t) =
            (mpri_ctx_conv2d_t){.stride_h = sh, .stride_w = sw, .pad_h = ph, .pad_w = pw};
        mpri_node_save(n, xc);
        mpri_node_save(n, wc);
    }
    mpr_tensor_release(xc);
    mpr_tensor_release(wc);
    mpr_tensor_release(bc);
    return mpri_result(y);
}
