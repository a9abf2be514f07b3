/* cpu_backend.c — the backend table of the CPU kernels (elementwise, copies,
 * reductions, GEMM, and the nn kernels of mpri_nn_kernels.h picked by dtype).
 * The registry that picks a backend per device is backend.c.
 *
 * Invariants: the CPU backend is always present and never changes; its
 * entries fail only on allocation (cpu_alloc), never on data. */
#include <stdlib.h>

#include <string.h>

#include "mpri_kernels.h"
#include "mpri_nn_kernels.h"

static mpr_err_t cpu_alloc(int device, size_t nbytes, void **out) {
    size_t a = (nbytes + 63) & ~(size_t)63;
    *out = aligned_alloc(64, a ? a : 64);
    return *out ? MPR_OK : mpr_error_set(MPR_ERR_NOMEM, "cpu: cannot allocate %zu bytes", nbytes);
}
static void cpu_free(void *data, int device) { free(data); }

static mpr_err_t cpu_unary(int dev, mpri_unop_t op, mpr_dtype_t dt, int64_t n, void *out, const void *x, double p0,
                           double p1) {
    mpri_k_unary(op, dt, n, out, x, p0, p1);
    return MPR_OK;
}
static mpr_err_t cpu_unary_backward(int dev, mpri_unop_t op, mpr_dtype_t dt, int64_t n, void *gin, const void *gout,
                                    const void *x, const void *y, double p0, double p1) {
    mpri_k_unary_backward(op, dt, n, gin, gout, x, y, p0, p1);
    return MPR_OK;
}
static mpr_err_t cpu_binary(int dev, mpri_binop_t op, mpr_dtype_t dt, int ndim, const int64_t *shape, void *o,
                            const int64_t *so, const void *a, const int64_t *sa, const void *b, const int64_t *sb,
                            double alpha) {
    mpri_k_binary(op, dt, ndim, shape, o, so, a, sa, b, sb, alpha);
    return MPR_OK;
}
static mpr_err_t cpu_copy(int dev, int ndim, const int64_t *shape, mpr_dtype_t dst_dt, void *dst, const int64_t *sd,
                          mpr_dtype_t src_dt, const void *src, const int64_t *ss) {
    mpri_k_copy(ndim, shape, dst_dt, dst, sd, src_dt, src, ss);
    return MPR_OK;
}
static mpr_err_t cpu_fill(int dev, mpr_dtype_t dt, int ndim, const int64_t *shape, void *dst, const int64_t *sd,
                          double value) {
    mpri_k_fill(dt, ndim, shape, dst, sd, value);
    return MPR_OK;
}
static mpr_err_t cpu_sum_into(int dev, mpr_dtype_t dt, int ndim, const int64_t *shape, void *out, const int64_t *so,
                              const void *in, const int64_t *si) {
    mpri_k_sum_into(dt, ndim, shape, out, so, in, si);
    return MPR_OK;
}
static mpr_err_t cpu_max_dim(int dev, mpr_dtype_t dt, int64_t outer, int64_t n, int64_t inner, const void *in,
                             void *vals, int64_t *idx) {
    mpri_k_max_dim(dt, outer, n, inner, in, vals, idx);
    return MPR_OK;
}
static mpr_err_t cpu_max_dim_backward(int dev, mpr_dtype_t dt, int64_t outer, int64_t n, int64_t inner,
                                      const void *gout, const int64_t *idx, void *gin) {
    mpri_k_max_dim_backward(dt, outer, n, inner, gout, idx, gin);
    return MPR_OK;
}
static mpr_err_t cpu_gemm(int dev, mpr_dtype_t dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                          const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
    mpri_k_gemm(dt, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return MPR_OK;
}
static bool cpu_gemm_small(int dev, mpr_dtype_t dt, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
                           int64_t a_rs, int64_t a_cs, const void *B, int64_t b_rs, int64_t b_cs, double beta,
                           void *C, int64_t ldc) {
    (void)dev;
    return mpri_k_gemm_small_strided(dt, M, N, K, alpha, A, a_rs, a_cs, B, b_rs, b_cs, beta, C, ldc);
}

static mpr_err_t cpu_transfer(void *dst, int dst_device, const void *src, int src_device, size_t nbytes) {
    if (nbytes) memcpy(dst, src, nbytes);
    return MPR_OK;
}

/* nn kernels: the _f32 / _f64 flavour for dt (float dtypes only; ops check). */
#define CPU_BY_DTYPE(dt, fn, ...) ((dt) == MPR_F32 ? fn##_f32(__VA_ARGS__) : fn##_f64(__VA_ARGS__))
static mpr_err_t cpu_softmax_fwd(int dev, mpr_dtype_t dt, const void *x, void *y, int64_t outer, int64_t n,
                                 int64_t inner, int is_log) {
    CPU_BY_DTYPE(dt, mpri_softmax_fwd, x, y, outer, n, inner, is_log);
    return MPR_OK;
}
static mpr_err_t cpu_softmax_bwd(int dev, mpr_dtype_t dt, const void *y, const void *gy, void *gx, int64_t outer,
                                 int64_t n, int64_t inner, int is_log) {
    CPU_BY_DTYPE(dt, mpri_softmax_bwd, y, gy, gx, outer, n, inner, is_log);
    return MPR_OK;
}
static mpr_err_t cpu_cross_entropy_fwd(int dev, mpr_dtype_t dt, const void *x, const int64_t *target, int64_t N,
                                       int64_t C, int64_t ignore_index, void *lse, double *loss, int64_t *count) {
    *loss = CPU_BY_DTYPE(dt, mpri_cross_entropy_fwd, x, target, N, C, ignore_index, lse, count);
    return MPR_OK;
}
static mpr_err_t cpu_cross_entropy_bwd(int dev, mpr_dtype_t dt, const void *x, const int64_t *target,
                                       const void *lse, int64_t N, int64_t C, int64_t ignore_index, int64_t count,
                                       double g, void *gx) {
    CPU_BY_DTYPE(dt, mpri_cross_entropy_bwd, x, target, lse, N, C, ignore_index, count, g, gx);
    return MPR_OK;
}
static mpr_err_t cpu_nll_loss_fwd(int dev, mpr_dtype_t dt, const void *logp, const int64_t *target, int64_t N,
                                  int64_t C, int64_t ignore_index, double *loss, int64_t *count) {
    *loss = CPU_BY_DTYPE(dt, mpri_nll_loss_fwd, logp, target, N, C, ignore_index, count);
    return MPR_OK;
}
static mpr_err_t cpu_nll_loss_bwd(int dev, mpr_dtype_t dt, const int64_t *target, int64_t N, int64_t C,
                                  int64_t ignore_index, int64_t count, double g, void *glogp) {
    CPU_BY_DTYPE(dt, mpri_nll_loss_bwd, target, N, C, ignore_index, count, g, glogp);
    return MPR_OK;
}
static mpr_err_t cpu_mse_loss_fwd(int dev, mpr_dtype_t dt, const void *a, const void *b, int64_t n, double *loss) {
    *loss = CPU_BY_DTYPE(dt, mpri_mse_loss_fwd, a, b, n);
    return MPR_OK;
}
static mpr_err_t cpu_mse_loss_bwd(int dev, mpr_dtype_t dt, const void *a, const void *b, int64_t n, double g,
                                  void *ga, void *gb) {
    CPU_BY_DTYPE(dt, mpri_mse_loss_bwd, a, b, n, g, ga, gb);
    return MPR_OK;
}

#define CPU_INDEX_KERNEL(name)                                                                              \
    static mpr_err_t cpu_##name(int dev, mpr_dtype_t dt, const void *src, const int64_t *idx, void *dst,     \
                                int64_t outer, int64_t n, int64_t k, int64_t inner) {                        \
        CPU_BY_DTYPE(dt, mpri_##name, src, idx, dst, outer, n, k, inner);                                    \
        return MPR_OK;                                                                                       \
    }
CPU_INDEX_KERNEL(index_select_fwd)
CPU_INDEX_KERNEL(index_select_bwd)
CPU_INDEX_KERNEL(gather_fwd)
CPU_INDEX_KERNEL(gather_bwd)
#undef CPU_INDEX_KERNEL
static mpr_err_t cpu_max_pool2d_fwd(int dev, mpr_dtype_t dt, const void *x, int64_t NC, int64_t H, int64_t W,
                                    int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                                    int64_t oh, int64_t ow, void *y, int64_t *arg) {
    CPU_BY_DTYPE(dt, mpri_max_pool2d_fwd, x, NC, H, W, kh, kw, sh, sw, ph, pw, oh, ow, y, arg);
    return MPR_OK;
}
static mpr_err_t cpu_max_pool2d_bwd(int dev, mpr_dtype_t dt, const void *gy, const int64_t *arg, int64_t NC,
                                    int64_t H, int64_t W, int64_t oh, int64_t ow, void *gx) {
    CPU_BY_DTYPE(dt, mpri_max_pool2d_bwd, gy, arg, NC, H, W, oh, ow, gx);
    return MPR_OK;
}
static mpr_err_t cpu_lstm_cell_fwd(int dev, mpr_dtype_t dt, const void *gates, const void *c_prev, int64_t B,
                                   int64_t H, void *act, void *h, void *c) {
    CPU_BY_DTYPE(dt, mpri_lstm_cell_fwd, gates, c_prev, B, H, act, h, c);
    return MPR_OK;
}
static mpr_err_t cpu_lstm_cell_bwd(int dev, mpr_dtype_t dt, const void *act, const void *c_prev, const void *c,
                                   const void *gh, const void *gc, int64_t B, int64_t H, void *ggates,
                                   void *gc_prev) {
    CPU_BY_DTYPE(dt, mpri_lstm_cell_bwd, act, c_prev, c, gh, gc, B, H, ggates, gc_prev);
    return MPR_OK;
}

static mpr_err_t cpu_im2col(int dev, mpr_dtype_t dt, const mpri_conv2d_geom_t *g, const void *x, void *col) {
    CPU_BY_DTYPE(dt, mpri_im2col, x, g->C, g->H, g->W, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->oh, g->ow, col);
    return MPR_OK;
}
static mpr_err_t cpu_col2im(int dev, mpr_dtype_t dt, const mpri_conv2d_geom_t *g, const void *col, void *gx) {
    CPU_BY_DTYPE(dt, mpri_col2im, col, g->C, g->H, g->W, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->oh, g->ow, gx);
    return MPR_OK;
}

const mpri_backend_t mpri_cpu_backend = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .unary = cpu_unary,
    .unary_backward = cpu_unary_backward,
    .binary = cpu_binary,
    .copy = cpu_copy,
    .fill = cpu_fill,
    .sum_into = cpu_sum_into,
    .max_dim = cpu_max_dim,
    .max_dim_backward = cpu_max_dim_backward,
    .gemm = cpu_gemm,
    .gemm_small = cpu_gemm_small,
    .transfer = cpu_transfer,
    .softmax_fwd = cpu_softmax_fwd,
    .softmax_bwd = cpu_softmax_bwd,
    .cross_entropy_fwd = cpu_cross_entropy_fwd,
    .cross_entropy_bwd = cpu_cross_entropy_bwd,
    .nll_loss_fwd = cpu_nll_loss_fwd,
    .nll_loss_bwd = cpu_nll_loss_bwd,
    .mse_loss_fwd = cpu_mse_loss_fwd,
    .mse_loss_bwd = cpu_mse_loss_bwd,
    .index_select_fwd = cpu_index_select_fwd,
    .index_select_bwd = cpu_index_select_bwd,
    .gather_fwd = cpu_gather_fwd,
    .gather_bwd = cpu_gather_bwd,
    .max_pool2d_fwd = cpu_max_pool2d_fwd,
    .max_pool2d_bwd = cpu_max_pool2d_bwd,
    .lstm_cell_fwd = cpu_lstm_cell_fwd,
    .lstm_cell_bwd = cpu_lstm_cell_bwd,
    .im2col = cpu_im2col,
    .col2im = cpu_col2im,
};
