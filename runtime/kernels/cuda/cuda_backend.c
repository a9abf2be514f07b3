/* cuda_backend.c — the CUDA backend table (mpri_backend_t of mpri_kernels.h)
 * over the functions of kernels/cuda/mpri_cuda.h, registered when the library
 * is loaded so tensors on cuda:N reach cuBLAS and the CUDA kernels.
 *
 * Compiled into every build (runtime/kernels/ is globbed) but empty unless
 * the CUDA backend is configured (MPIRPC_HAVE_CUDA). Registration happens in
 * a constructor, before any tensor can exist, because the registry is read
 * without a lock; it does not touch the CUDA driver (a machine without a GPU
 * pays nothing). */
#ifdef MPIRPC_HAVE_CUDA
#include "kernels/cuda/mpri_cuda.h"
#include "kernels/mpri_kernels.h"

static const mpri_backend_t cuda_backend = {
    .name = "cuda",
    .alloc = mpri_cuda_malloc,
    .free = mpri_cuda_free,
    .unary = mpri_cuda_k_unary,
    .unary_backward = mpri_cuda_k_unary_backward,
    .binary = mpri_cuda_k_binary,
    .copy = mpri_cuda_k_copy,
    .fill = mpri_cuda_k_fill,
    .sum_into = mpri_cuda_k_sum_into,
    .max_dim = mpri_cuda_k_max_dim,
    .max_dim_backward = mpri_cuda_k_max_dim_backward,
    .gemm = mpri_cuda_k_gemm,
};

__attribute__((constructor)) static void register_cuda_backend(void) { mpri_backend_register(&cuda_backend); }
#else
/* ISO C forbids an empty translation unit. */
typedef int mpri_cuda_backend_unused_t;
#endif
