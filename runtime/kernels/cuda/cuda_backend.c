/* cuda_backend.c — the CUDA backend table (mpri_backend_t of mpri_kernels.h)
 * over the functions of kernels/cuda/mpri_cuda.h, and its install step
 * (mpri_cuda_backend_install), which the kernels layer's ordered init
 * (backend.c, mpri_kernels_init) runs so tensors on cuda:N reach cuBLAS and
 * the CUDA kernels; and the public device queries of mpirpc/cuda.h (built?,
 * device count, synchronize).
 *
 * Compiled into every build (runtime/kernels/ is globbed). This is the one C
 * file that tests MPIRPC_HAVE_CUDA: with it, the install step registers the
 * table; without it, the step registers nothing, no device backend exists
 * and the queries answer "not built" (ops then refuse cuda:N tensors through
 * mpri_backend_for). Installing does not touch the CUDA driver (a machine
 * without a GPU pays nothing). */
#include "kernels/mpri_kernels.h"
#include "mpirpc/cuda.h"

#ifdef MPIRPC_HAVE_CUDA
#include "kernels/cuda/mpri_cuda.h"

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
    .transfer = mpri_cuda_memcpy,
    .softmax_fwd = mpri_cuda_softmax_fwd,
    .softmax_bwd = mpri_cuda_softmax_bwd,
    .cross_entropy_fwd = mpri_cuda_cross_entropy_fwd,
    .cross_entropy_bwd = mpri_cuda_cross_entropy_bwd,
    .nll_loss_fwd = mpri_cuda_nll_loss_fwd,
    .nll_loss_bwd = mpri_cuda_nll_loss_bwd,
    .mse_loss_fwd = mpri_cuda_mse_loss_fwd,
    .mse_loss_bwd = mpri_cuda_mse_loss_bwd,
    .index_select_fwd = mpri_cuda_index_select_fwd,
    .index_select_bwd = mpri_cuda_index_select_bwd,
    .gather_fwd = mpri_cuda_gather_fwd,
    .gather_bwd = mpri_cuda_gather_bwd,
};

mpr_err_t mpri_cuda_backend_install(void) { return mpri_backend_register(&cuda_backend); }

bool mpr_cuda_is_built(void) { return true; }

int mpr_cuda_device_count(void) { return mpri_cuda_device_count(); }

mpr_err_t mpr_cuda_synchronize(int device) {
    if (device < 0) return MPR_OK;
    if (device >= mpri_cuda_device_count())
        return mpr_error_set(MPR_ERR_INVALID_ARG, "cuda_synchronize: cuda:%d is not visible", device);
    return mpri_cuda_synchronize(device);
}
#else
mpr_err_t mpri_cuda_backend_install(void) { return MPR_OK; /* no device backend in this build */ }

bool mpr_cuda_is_built(void) { return false; }

int mpr_cuda_device_count(void) { return 0; }

mpr_err_t mpr_cuda_synchronize(int device) {
    if (device < 0) return MPR_OK;
    return mpr_error_set(MPR_ERR_UNSUPPORTED, "cuda_synchronize: mpirpc was built without CUDA");
}
#endif
