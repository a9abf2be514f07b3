/* mpri_cuda.h — internal CUDA backend: device memory, transfers, and device
 * versions of the CPU kernels of mpri_kernels.h / mpri_nn_kernels.h (not
 * installed). Only compiled when configured with -DMPIRPC_CUDA=ON (then
 * MPIRPC_HAVE_CUDA is defined for the library's C sources).
 *
 * Conventions: every pointer argument named like a tensor is a DEVICE pointer
 * on `device`; shapes and strides are host arrays in elements with the same
 * meaning as the CPU kernels of the same name. Kernels run on the calling
 * thread's current stream of `device` (the default stream); functions that
 * return a host value (losses) synchronize. Every function returns MPR_OK or
 * MPR_ERR_STATE / MPR_ERR_NOMEM with a detail naming the kernel and the CUDA
 * error string (device errors are recoverable failures, not asserts).
 *
 * Dispatch: runtime/kernels/cuda/cuda_backend.c puts these functions in an
 * mpri_backend_t table (mpri_kernels.h), registered by the kernels layer's
 * ordered init (mpri_kernels_init, backend.c); ops
 * reach them through mpri_backend_for(device), never by name (the nn kernels
 * and mpri_cuda_memcpy included). */
#ifndef MPRI_CUDA_H
#define MPRI_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/mpri_kernels.h"
#include "mpirpc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Visible devices (0 when the driver reports none or is missing). */
int mpri_cuda_device_count(void);
/* nbytes of device memory on `device` (*out NULL for nbytes 0). */
mpr_err_t mpri_cuda_malloc(int device, size_t nbytes, void **out);
/* Storage free hook: frees device memory (NULL is a no-op). */
void mpri_cuda_free(void *data, int device);
/* Synchronous copy of nbytes between any two of host (device -1) and devices. */
mpr_err_t mpri_cuda_memcpy(void *dst, int dst_device, const void *src, int src_device, size_t nbytes);
mpr_err_t mpri_cuda_synchronize(int device);

/* ---- elementwise (contracts as mpri_k_*) ---- */
mpr_err_t mpri_cuda_k_unary(int device, mpri_unop_t op, mpr_dtype_t dt, int64_t n, void *out,
                            const void *x, double p0, double p1);
mpr_err_t mpri_cuda_k_unary_backward(int device, mpri_unop_t op, mpr_dtype_t dt, int64_t n, void *gin,
                                     const void *gout, const void *x, const void *y, double p0, double p1);
mpr_err_t mpri_cuda_k_binary(int device, mpri_binop_t op, mpr_dtype_t dt, int ndim, const int64_t *shape,
                             void *o, const int64_t *so, const void *a, const int64_t *sa, const void *b,
                             const int64_t *sb, double alpha);
mpr_err_t mpri_cuda_k_copy(int device, int ndim, const int64_t *shape, mpr_dtype_t dst_dt, void *dst,
                           const int64_t *sd, mpr_dtype_t src_dt, const void *src, const int64_t *ss);
mpr_err_t mpri_cuda_k_fill(int device, mpr_dtype_t dt, int ndim, const int64_t *shape, void *dst,
                           const int64_t *sd, double value);
/* out[...] += in[...] (out strides 0 on reduced dims). */
mpr_err_t mpri_cuda_k_sum_into(int device, mpr_dtype_t dt, int ndim, const int64_t *shape, void *out,
                               const int64_t *so, const void *in, const int64_t *si);
/* Max over the middle dim of contiguous [outer, n, inner]: vals/idx [outer, inner]
 * (idx may be NULL); backward adds gout at idx into gin (zeroed by the caller). */
mpr_err_t mpri_cuda_k_max_dim(int device, mpr_dtype_t dt, int64_t outer, int64_t n, int64_t inner, const void *in,
                              void *vals, int64_t *idx);
mpr_err_t mpri_cuda_k_max_dim_backward(int device, mpr_dtype_t dt, int64_t outer, int64_t n, int64_t inner,
                                       const void *gout, const int64_t *idx, void *gin);

/* ---- BLAS (cuBLAS; row-major like mpri_k_gemm) ---- */
mpr_err_t mpri_cuda_k_gemm(int device, mpr_dtype_t dt, bool trans_a, bool trans_b, int64_t M, int64_t N,
                           int64_t K, double alpha, const void *A, int64_t lda, const void *B, int64_t ldb,
                           double beta, void *C, int64_t ldc);

/* How mpri_cuda_k_gemm calls column-major cuBLAS for a row-major product
 * (host-only, no GPU needed; unit-tested against the CPU GEMM). Row-major
 * C[M,N] = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS's first
 * operand is B (transposed iff trans_b) with ld ldb, its second is A
 * (transposed iff trans_a) with ld lda, and (m, n, k) = (N, M, K). The leading
 * dimensions are checked against cuBLAS's rules (ld >= max(1, rows of the
 * stored column-major matrix)), which are the row-major rules of cblas: a
 * violation is MPR_ERR_INVALID_ARG naming the argument instead of a cuBLAS
 * "invalid value". Sizes or lds beyond 2^31 - 1 are MPR_ERR_UNSUPPORTED.
 * K == 0 is valid with any ld >= 0 (no operand is read: C = beta C). */
typedef struct mpri_cuda_gemm_plan {
    bool trans_first, trans_second; /* cuBLAS transa / transb */
    int m, n, k;
    int ld_first, ld_second, ldc; /* lds of B, A and C */
} mpri_cuda_gemm_plan_t;
mpr_err_t mpri_cuda_gemm_plan(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda,
                              int64_t ldb, int64_t ldc, mpri_cuda_gemm_plan_t *plan);

/* How mpri_cuda_k_sum_into splits its work (host-only, unit-tested): dims of
 * size 1 are dropped; a dim where out's stride is 0 is reduced (shape rshape,
 * input strides rsi), every other dim is kept (kshape, input strides ksi, out
 * strides kso). P = number of kept positions, R = reduction length. Work item
 * w in [0, P * nchunks) takes p = w / nchunks, c = w % nchunks and sums
 * in[p, r] for r = c, c + nchunks, ... < R in double before ONE atomic add
 * into out[p], so at most nchunks (<= 4096) partial sums meet in an f32
 * output (a plain per-element f32 atomicAdd stops counting at 2^24). */
#define MPRI_CUDA_SUM_MAX_CHUNKS 4096
typedef struct mpri_cuda_sum_plan {
    int nk, nr;
    int64_t kshape[MPR_MAX_DIMS], ksi[MPR_MAX_DIMS], kso[MPR_MAX_DIMS];
    int64_t rshape[MPR_MAX_DIMS], rsi[MPR_MAX_DIMS];
    int64_t P, R, nchunks;
} mpri_cuda_sum_plan_t;
void mpri_cuda_sum_plan(int ndim, const int64_t *shape, const int64_t *so, const int64_t *si,
                        mpri_cuda_sum_plan_t *plan);

/* ---- nn kernels (contracts as mpri_*_<f32|f64> of mpri_nn_kernels.h) ---- */
mpr_err_t mpri_cuda_softmax_fwd(int device, mpr_dtype_t dt, const void *x, void *y, int64_t outer, int64_t n,
                                int64_t inner, int is_log);
mpr_err_t mpri_cuda_softmax_bwd(int device, mpr_dtype_t dt, const void *y, const void *gy, void *gx,
                                int64_t outer, int64_t n, int64_t inner, int is_log);
/* *loss = mean over counted rows; *count = counted rows; lse [N] (device) saved for backward. */
mpr_err_t mpri_cuda_cross_entropy_fwd(int device, mpr_dtype_t dt, const void *x, const int64_t *target,
                                      int64_t N, int64_t C, int64_t ignore_index, void *lse, double *loss,
                                      int64_t *count);
mpr_err_t mpri_cuda_cross_entropy_bwd(int device, mpr_dtype_t dt, const void *x, const int64_t *target,
                                      const void *lse, int64_t N, int64_t C, int64_t ignore_index,
                                      int64_t count, double g, void *gx);
mpr_err_t mpri_cuda_nll_loss_fwd(int device, mpr_dtype_t dt, const void *logp, const int64_t *target, int64_t N,
                                 int64_t C, int64_t ignore_index, double *loss, int64_t *count);
mpr_err_t mpri_cuda_nll_loss_bwd(int device, mpr_dtype_t dt, const int64_t *target, int64_t N, int64_t C,
                                 int64_t ignore_index, int64_t count, double g, void *glogp);
mpr_err_t mpri_cuda_mse_loss_fwd(int device, mpr_dtype_t dt, const void *a, const void *b, int64_t n,
                                 double *loss);
/* ga, gb may be NULL. */
mpr_err_t mpri_cuda_mse_loss_bwd(int device, mpr_dtype_t dt, const void *a, const void *b, int64_t n, double g,
                                 void *ga, void *gb);

/* index_select / gather (contracts as mpri_index_select_* / mpri_gather_* of
 * mpri_nn_kernels.h; idx is a device pointer to range-checked int64). Backward
 * accumulates into a zeroed gx with atomics. */
mpr_err_t mpri_cuda_index_select_fwd(int device, mpr_dtype_t dt, const void *x, const int64_t *idx, void *y,
                                     int64_t outer, int64_t n, int64_t k, int64_t inner);
mpr_err_t mpri_cuda_index_select_bwd(int device, mpr_dtype_t dt, const void *gy, const int64_t *idx, void *gx,
                                     int64_t outer, int64_t n, int64_t k, int64_t inner);
mpr_err_t mpri_cuda_gather_fwd(int device, mpr_dtype_t dt, const void *x, const int64_t *idx, void *y, int64_t outer,
                               int64_t n, int64_t k, int64_t inner);
mpr_err_t mpri_cuda_gather_bwd(int device, mpr_dtype_t dt, const void *gy, const int64_t *idx, void *gx,
                               int64_t outer, int64_t n, int64_t k, int64_t inner);

#ifdef __cplusplus
}
#endif
#endif
