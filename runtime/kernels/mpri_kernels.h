/* mpri_kernels.h — internal CPU compute kernels (no autograd, no allocation).
 *
 * Kernels work on raw pointers plus shapes/strides in elements; the op layer
 * (autograd/ops_*.c) validates shapes and dtypes before calling them. Strided
 * loops go through mpri_iter_t, which coalesces dims so the inner loop runs
 * over the longest contiguous run; inner loops are specialized per op and
 * dtype (no per-element function pointers). Float kernels take MPR_F32 or
 * MPR_F64. */
#ifndef MPRI_KERNELS_H
#define MPRI_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "mpirpc/tensor.h"
#include "mpri_tensor.h"

/* ---- N-d iteration over up to 3 operands sharing a shape ---- */
#define MPRI_ITER_MAX_OPS 3
typedef struct mpri_iter {
    int ndim;  /* >= 1 after init */
    int nops;
    int64_t shape[MPR_MAX_DIMS];
    int64_t st[MPRI_ITER_MAX_OPS][MPR_MAX_DIMS];
} mpri_iter_t;

/* strides[k]: strides (elements) of operand k over `shape`; 0 = broadcast. */
void mpri_iter_init(mpri_iter_t *it, int ndim, const int64_t *shape, int nops,
                    const int64_t *const *strides);
/* True when strides `st` lay `shape` out row-major with no gaps (dims of
 * size 1 may have any stride): a kernel then runs one flat loop over the
 * elements instead of the iterator (whose set-up costs more than the loop
 * for a tensor of a few dozen elements). */
static inline bool mpri_flat_layout(int ndim, const int64_t *shape, const int64_t *st) {
    int64_t expect = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        if (shape[d] != 1 && st[d] != expect) return false;
        expect *= shape[d];
    }
    return true;
}
/* True when strides `st` are 0 on every dim of `shape` longer than 1 (one
 * element broadcast over it all: a full reduction's output). */
static inline bool mpri_single_layout(int ndim, const int64_t *shape, const int64_t *st) {
    for (int d = 0; d < ndim; d++)
        if (shape[d] != 1 && st[d] != 0) return false;
    return true;
}
/* Advance the outer index (all dims but the last) and the offsets. */
static inline void mpri_iter_next(const mpri_iter_t *it, int64_t *idx, int64_t *off) {
    for (int d = it->ndim - 2; d >= 0; d--) {
        idx[d]++;
        for (int k = 0; k < it->nops; k++) off[k] += it->st[k][d];
        if (idx[d] < it->shape[d]) return;
        for (int k = 0; k < it->nops; k++) off[k] -= it->st[k][d] * it->shape[d];
        idx[d] = 0;
    }
}

/* ---- elementwise ---- */
typedef enum {
    MPRI_UN_NEG, MPRI_UN_EXP, MPRI_UN_LOG, MPRI_UN_SQRT, MPRI_UN_ABS, MPRI_UN_RELU,
    MPRI_UN_TANH, MPRI_UN_SIGMOID, MPRI_UN_GELU,
    MPRI_UN_POW,     /* p0 = exponent */
    MPRI_UN_CLAMP,   /* p0 = lo, p1 = hi */
    MPRI_UN_ADD_S,   /* x + p0 */
    MPRI_UN_MUL_S,   /* x * p0 */
    MPRI_UN_RSUB_S,  /* p0 - x */
    MPRI_UN_COUNT
} mpri_unop_t;

/* out[i] = f(x[i]), n contiguous elements. */
void mpri_k_unary(mpri_unop_t op, mpr_dtype_t dt, int64_t n, void *out, const void *x, double p0,
                  double p1);
/* gin[i] = gout[i] * f'(x[i]) (x: forward input, y: forward output; either
 * may be unused by op). Contiguous, n elements. */
void mpri_k_unary_backward(mpri_unop_t op, mpr_dtype_t dt, int64_t n, void *gin, const void *gout,
                           const void *x, const void *y, double p0, double p1);

typedef enum { MPRI_BIN_ADD, MPRI_BIN_SUB, MPRI_BIN_MUL, MPRI_BIN_DIV } mpri_binop_t;
/* o = a (op) b elementwise over `shape`, all three strided (o may alias a for
 * in-place updates when their strides match). ADD/SUB compute a +/- alpha*b. */
void mpri_k_binary(mpri_binop_t op, mpr_dtype_t dt, int ndim, const int64_t *shape, void *o,
                   const int64_t *so, const void *a, const int64_t *sa, const void *b,
                   const int64_t *sb, double alpha);

/* ---- copies and fills ---- */
/* dst[...] = (dst_dt) src[...] over `shape`, both strided, any dtypes. */
void mpri_k_copy(int ndim, const int64_t *shape, mpr_dtype_t dst_dt, void *dst, const int64_t *sd,
                 mpr_dtype_t src_dt, const void *src, const int64_t *ss);
void mpri_k_fill(mpr_dtype_t dt, int ndim, const int64_t *shape, void *dst, const int64_t *sd,
                 double value);

/* ---- reductions ---- */
/* out[...] += in[...] over in's `shape`; out strides are 0 on reduced dims.
 * Float dtypes; rows reduced along the innermost dim accumulate in double. */
void mpri_k_sum_into(mpr_dtype_t dt, int ndim, const int64_t *shape, void *out, const int64_t *so,
                     const void *in, const int64_t *si);
/* Max over the middle dim of a contiguous [outer, n, inner] block (n >= 1):
 * vals [outer, inner], idx [outer, inner] (first maximum; NaN wins). idx may be NULL. */
void mpri_k_max_dim(mpr_dtype_t dt, int64_t outer, int64_t n, int64_t inner, const void *in,
                    void *vals, int64_t *idx);
/* Backward of max_dim: gin [outer, n, inner] (zeroed by caller) gets gout at idx. */
void mpri_k_max_dim_backward(mpr_dtype_t dt, int64_t outer, int64_t n, int64_t inner,
                             const void *gout, const int64_t *idx, void *gin);

/* ---- BLAS ---- */
/* Row-major C[M,N] = alpha * op(A) op(B) + beta * C with cblas_sgemm/dgemm
 * (tiny products with mpri_k_gemm_small).
 * lda/ldb/ldc are row strides of the stored matrices. */
void mpri_k_gemm(mpr_dtype_t dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                 double alpha, const void *A, int64_t lda, const void *B, int64_t ldb, double beta,
                 void *C, int64_t ldc);
/* The same product without BLAS when mpri_k_gemm_small_fits(dt, M, N, K) (tiny
 * products, where OpenBLAS's call overhead dominates; cpu_small_gemm.c);
 * false, touching nothing, otherwise. F32/F64. */
bool mpri_k_gemm_small_fits(mpr_dtype_t dt, int64_t M, int64_t N, int64_t K);
bool mpri_k_gemm_small(mpr_dtype_t dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                       double alpha, const void *A, int64_t lda, const void *B, int64_t ldb, double beta,
                       void *C, int64_t ldc);
/* The same with any element strides: A's (i, p) at A[i * a_rs + p * a_cs],
 * B's (p, j) at B[p * b_rs + j * b_cs] (0 allowed: a broadcast operand is
 * read in place, no copy). */
bool mpri_k_gemm_small_strided(mpr_dtype_t dt, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
                               int64_t a_rs, int64_t a_cs, const void *B, int64_t b_rs, int64_t b_cs, double beta,
                               void *C, int64_t ldc);
/* Apply the thread setting once (MPIRPC_BLAS_THREADS env, default 1), and
 * print the kernel-set advice once if mpr_blas_better_kernels() has one. */
void mpri_blas_init(void);
/* The kernel set to ask OpenBLAS for: "" when OPENBLAS_CORETYPE is set
 * (non-empty) or `corename` is not OpenBLAS's generic fallback "Prescott";
 * otherwise "SkylakeX" on a CPU with AVX-512 (F, BW, DQ, VL), "Haswell" on
 * one with AVX2 and FMA, "" on older ones. Pure: mpr_blas_better_kernels
 * passes this process's values. */
const char *mpri_blas_pick_kernels(const char *corename, const char *coretype_env, bool avx512, bool avx2_fma);

/* ---- device backends ----
 * Ops never call the CPU kernels (above and in mpri_nn_kernels.h) directly
 * for tensor data: they look up
 * the backend of the tensors' device with mpri_backend_for() and call through
 * its table (one indirect call per op, never per element). Every entry takes
 * the device first and returns MPR_OK or an error with detail (device errors
 * are recoverable). The CPU table is built in; a CUDA build registers its
 * table with mpri_backend_register() from mpri_kernels_init — the signatures are exactly those of
 * mpri_cuda_malloc / mpri_cuda_free / mpri_cuda_k_* in kernels/cuda/mpri_cuda.h,
 * so the table is just those function names. Entries may be NULL where a
 * backend has no kernel: the op then fails with MPR_ERR_UNSUPPORTED naming it.
 * The nn entries (softmax, losses, index/gather, max pooling, LSTM cell,
 * im2col/col2im) take
 * raw contiguous buffers on `device`
 * with the contracts of the _f32/_f64 kernels of the same name in
 * mpri_nn_kernels.h, dtype MPR_F32 or MPR_F64; losses return their value
 * (and counted rows) through host pointers. */
/* Per-image geometry of a 2-D convolution: input [C, H, W], kernel kh x kw,
 * stride sh, sw, zero padding ph, pw, output oh x ow. */
typedef struct mpri_conv2d_geom {
    int64_t C, H, W, kh, kw, sh, sw, ph, pw, oh, ow;
} mpri_conv2d_geom_t;

typedef struct mpri_backend {
    const char *name;
    mpr_err_t (*alloc)(int device, size_t nbytes, void **out); /* *out NULL allowed for nbytes 0 */
    void (*free)(void *data, int device);
    mpr_err_t (*unary)(int device, mpri_unop_t op, mpr_dtype_t dt, int64_t n, void *out, const void *x,
                       double p0, double p1);
    mpr_err_t (*unary_backward)(int device, mpri_unop_t op, mpr_dtype_t dt, int64_t n, void *gin,
                                const void *gout, const void *x, const void *y, double p0, double p1);
    mpr_err_t (*binary)(int device, mpri_binop_t op, mpr_dtype_t dt, int ndim, const int64_t *shape, void *o,
                        const int64_t *so, const void *a, const int64_t *sa, const void *b, const int64_t *sb,
                        double alpha);
    mpr_err_t (*copy)(int device, int ndim, const int64_t *shape, mpr_dtype_t dst_dt, void *dst,
                      const int64_t *sd, mpr_dtype_t src_dt, const void *src, const int64_t *ss);
    mpr_err_t (*fill)(int device, mpr_dtype_t dt, int ndim, const int64_t *shape, void *dst, const int64_t *sd,
                      double value);
    mpr_err_t (*sum_into)(int device, mpr_dtype_t dt, int ndim, const int64_t *shape, void *out,
                          const int64_t *so, const void *in, const int64_t *si);
    mpr_err_t (*max_dim)(int device, mpr_dtype_t dt, int64_t outer, int64_t n, int64_t inner, const void *in,
                         void *vals, int64_t *idx);
    mpr_err_t (*max_dim_backward)(int device, mpr_dtype_t dt, int64_t outer, int64_t n, int64_t inner,
                                  const void *gout, const int64_t *idx, void *gin);
    mpr_err_t (*gemm)(int device, mpr_dtype_t dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                      double alpha, const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C,
                      int64_t ldc);
    /* A tiny product (mpri_k_gemm_small_fits) with any strides, read in place
     * (mpri_k_gemm_small_strided); false when not taken: the caller makes its
     * operands BLAS-ready and calls gemm. NULL in a backend without one. */
    bool (*gemm_small)(int device, mpr_dtype_t dt, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
                       int64_t a_rs, int64_t a_cs, const void *B, int64_t b_rs, int64_t b_cs, double beta, void *C,
                       int64_t ldc);
    /* Synchronous copy of nbytes between the host (device -1) and a device of
     * this backend, or within it (use mpri_backend_transfer). */
    mpr_err_t (*transfer)(void *dst, int dst_device, const void *src, int src_device, size_t nbytes);
    /* ---- nn kernels ---- */
    mpr_err_t (*softmax_fwd)(int device, mpr_dtype_t dt, const void *x, void *y, int64_t outer, int64_t n,
                             int64_t inner, int is_log);
    mpr_err_t (*softmax_bwd)(int device, mpr_dtype_t dt, const void *y, const void *gy, void *gx, int64_t outer,
                             int64_t n, int64_t inner, int is_log);
    mpr_err_t (*cross_entropy_fwd)(int device, mpr_dtype_t dt, const void *x, const int64_t *target, int64_t N,
                                   int64_t C, int64_t ignore_index, void *lse, double *loss, int64_t *count);
    mpr_err_t (*cross_entropy_bwd)(int device, mpr_dtype_t dt, const void *x, const int64_t *target,
                                   const void *lse, int64_t N, int64_t C, int64_t ignore_index, int64_t count,
                                   double g, void *gx);
    mpr_err_t (*nll_loss_fwd)(int device, mpr_dtype_t dt, const void *logp, const int64_t *target, int64_t N,
                              int64_t C, int64_t ignore_index, double *loss, int64_t *count);
    mpr_err_t (*nll_loss_bwd)(int device, mpr_dtype_t dt, const int64_t *target, int64_t N, int64_t C,
                              int64_t ignore_index, int64_t count, double g, void *glogp);
    mpr_err_t (*mse_loss_fwd)(int device, mpr_dtype_t dt, const void *a, const void *b, int64_t n, double *loss);
    /* ga, gb may be NULL */
    mpr_err_t (*mse_loss_bwd)(int device, mpr_dtype_t dt, const void *a, const void *b, int64_t n, double g,
                              void *ga, void *gb);
    /* index_select / gather: forward src = x, dst = y; backward src = gy,
     * dst = gx (accumulates). */
    mpr_err_t (*index_select_fwd)(int device, mpr_dtype_t dt, const void *src, const int64_t *idx, void *dst,
                                  int64_t outer, int64_t n, int64_t k, int64_t inner);
    mpr_err_t (*index_select_bwd)(int device, mpr_dtype_t dt, const void *src, const int64_t *idx, void *dst,
                                  int64_t outer, int64_t n, int64_t k, int64_t inner);
    mpr_err_t (*gather_fwd)(int device, mpr_dtype_t dt, const void *src, const int64_t *idx, void *dst,
                            int64_t outer, int64_t n, int64_t k, int64_t inner);
    mpr_err_t (*gather_bwd)(int device, mpr_dtype_t dt, const void *src, const int64_t *idx, void *dst,
                            int64_t outer, int64_t n, int64_t k, int64_t inner);
    mpr_err_t (*max_pool2d_fwd)(int device, mpr_dtype_t dt, const void *x, int64_t NC, int64_t H, int64_t W,
                                int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t oh,
                                int64_t ow, void *y, int64_t *arg);
    mpr_err_t (*max_pool2d_bwd)(int device, mpr_dtype_t dt, const void *gy, const int64_t *arg, int64_t NC,
                                int64_t H, int64_t W, int64_t oh, int64_t ow, void *gx);
    mpr_err_t (*lstm_cell_fwd)(int device, mpr_dtype_t dt, const void *gates, const void *c_prev, int64_t B,
                               int64_t H, void *act, void *h, void *c);
    /* gc_prev may be NULL */
    mpr_err_t (*lstm_cell_bwd)(int device, mpr_dtype_t dt, const void *act, const void *c_prev, const void *c,
                               const void *gh, const void *gc, int64_t B, int64_t H, void *ggates, void *gc_prev);
    /* conv2d by im2col + GEMM, one image at a time: x, gx: [C, H, W];
     * col: [C*kh*kw, oh*ow]. im2col overwrites col (zeros where the window
     * covers padding); col2im is its adjoint and accumulates into gx. */
    mpr_err_t (*im2col)(int device, mpr_dtype_t dt, const mpri_conv2d_geom_t *g, const void *x, void *col);
    mpr_err_t (*col2im)(int device, mpr_dtype_t dt, const mpri_conv2d_geom_t *g, const void *col, void *gx);
} mpri_backend_t;

/* The built-in CPU backend (device -1). */
extern const mpri_backend_t mpri_cpu_backend;
/* Install the backend serving every device >= 0 (one CUDA backend); NULL
 * removes it. MPR_ERR_INVALID_ARG if the table lacks name, alloc, free or
 * transfer. `b` is borrowed and must outlive its use. */
mpr_err_t mpri_backend_register(const mpri_backend_t *b);
/* The kernels layer's ordered init (backend.c): registers the device backend
 * of this build. Runs once; later calls return the first run's result. Run by
 * the first lookup of a device >= 0 (mpri_backend_for). */
mpr_err_t mpri_kernels_init(void);
/* Registers the CUDA backend in a CUDA build (cuda/cuda_backend.c); MPR_OK
 * and nothing registered in others. A step of mpri_kernels_init. */
mpr_err_t mpri_cuda_backend_install(void);
/* Backend for `device`, or NULL with MPR_ERR_UNSUPPORTED naming `op` when no
 * backend serves that device (or the error of a failed mpri_kernels_init). */
const mpri_backend_t *mpri_backend_for(const char *op, int device);
/* New storage of nbytes on `device` through its backend (refcount 1, version
 * 0, freed through the backend). NULL with an error naming `op` on failure. */
mpri_storage_t *mpri_backend_storage(const char *op, int device, size_t nbytes);
/* Copy nbytes between devices (-1 = host) through the backend of the device
 * side (plain memcpy host to host); errors name `op`. */
mpr_err_t mpri_backend_transfer(const char *op, void *dst, int dst_device, const void *src, int src_device,
                                size_t nbytes);
/* MPR_ERR_UNSUPPORTED naming `op` and the backend when `fn` is NULL. */
mpr_err_t mpri_backend_missing(const char *op, const mpri_backend_t *b, const char *kernel);
/* Call kernel `fn` of backend `b` on device `dev`: evaluates to its mpr_err_t,
 * or to MPR_ERR_UNSUPPORTED when the backend lacks it. */
#define MPRI_BK(b, fn, dev, ...) \
    ((b)->fn ? (b)->fn((dev), __VA_ARGS__) : mpri_backend_missing(__func__, (b), #fn))

#endif
