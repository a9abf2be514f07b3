// cuda_index.cu — device versions of the index_select / gather kernels of
// mpri_nn_kernels.h (cpu_index_impl.h): x read as [outer, n, inner] around
// the indexed dim, y as [outer, k, inner].
//
// Invariants: one thread per output element (grid-stride); the indices are
// device int64 already range-checked by the op layer (autograd/ops_nn_index.c),
// so no kernel reads out of bounds; backward adds into a zeroed gx with
// atomicAdd, so repeated indices accumulate (in an order that may differ
// from the CPU loop's, hence results equal to rounding, not bit for bit).
#include "kernels/cuda/cuda_common.cuh"

namespace {

constexpr int kThreads = 256;

// Where output element e = (o, j, i) of [outer, k, inner] reads x, in x's
// [outer, n, inner]: row idx[j] (index_select) or idx[e] (gather).
template <bool GATHER>
__device__ inline int64_t source_offset(int64_t e, const int64_t *idx, int64_t n, int64_t k, int64_t inner) {
    int64_t i = e % inner, j = (e / inner) % k, o = e / (inner * k);
    return (o * n + (GATHER ? idx[e] : idx[j])) * inner + i;
}

// y[e] = x[source of e]
template <typename T, bool GATHER>
__global__ void index_fwd_kernel(const T *x, const int64_t *idx, T *y, int64_t outer, int64_t n, int64_t k,
                                 int64_t inner) {
    int64_t total = outer * k * inner;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x)
        y[e] = x[source_offset<GATHER>(e, idx, n, k, inner)];
}

// gx[source of e] += gy[e]
template <typename T, bool GATHER>
__global__ void index_bwd_kernel(const T *gy, const int64_t *idx, T *gx, int64_t outer, int64_t n, int64_t k,
                                 int64_t inner) {
    int64_t total = outer * k * inner;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x)
        atomicAdd(&gx[source_offset<GATHER>(e, idx, n, k, inner)], gy[e]);
}

template <bool GATHER>
mpr_err_t index_run(const char *what, bool backward, int device, mpr_dtype_t dt, const void *src, const int64_t *idx,
                    void *dst, int64_t outer, int64_t n, int64_t k, int64_t inner) {
    if (dt != MPR_F32 && dt != MPR_F64)
        return mpr_error_set(MPR_ERR_DTYPE, "%s: dtype %s (float32/float64 only)", what, mpr_dtype_name(dt));
    int64_t total = outer * k * inner;
    if (total == 0) return MPR_OK;
    MPRI_CUDA_SET_DEVICE(device, what);
    unsigned b = mpri_cuda_blocks(total, kThreads);
    if (dt == MPR_F32 && backward)
        index_bwd_kernel<float, GATHER><<<b, kThreads>>>((const float *)src, idx, (float *)dst, outer, n, k, inner);
    else if (dt == MPR_F32)
        index_fwd_kernel<float, GATHER><<<b, kThreads>>>((const float *)src, idx, (float *)dst, outer, n, k, inner);
    else if (backward)
        index_bwd_kernel<double, GATHER><<<b, kThreads>>>((const double *)src, idx, (double *)dst, outer, n, k, inner);
    else
        index_fwd_kernel<double, GATHER><<<b, kThreads>>>((const double *)src, idx, (double *)dst, outer, n, k, inner);
    MPRI_CUDA_LAUNCHED(what);
    return MPR_OK;
}

} // namespace

extern "C" mpr_err_t mpri_cuda_index_select_fwd(int device, mpr_dtype_t dt, const void *x, const int64_t *idx,
                                                void *y, int64_t outer, int64_t n, int64_t k, int64_t inner) {
    return index_run<false>("cuda index_select", false, device, dt, x, idx, y, outer, n, k, inner);
}

extern "C" mpr_err_t mpri_cuda_index_select_bwd(int device, mpr_dtype_t dt, const void *gy, const int64_t *idx,
                                                void *gx, int64_t outer, int64_t n, int64_t k, int64_t inner) {
    return index_run<false>("cuda index_select backward", true, device, dt, gy, idx, gx, outer, n, k, inner);
}

extern "C" mpr_err_t mpri_cuda_gather_fwd(int device, mpr_dtype_t dt, const void *x, const int64_t *idx, void *y,
                                          int64_t outer, int64_t n, int64_t k, int64_t inner) {
    return index_run<true>("cuda gather", false, device, dt, x, idx, y, outer, n, k, inner);
}

extern "C" mpr_err_t mpri_cuda_gather_bwd(int device, mpr_dtype_t dt, const void *gy, const int64_t *idx, void *gx,
                                          int64_t outer, int64_t n, int64_t k, int64_t inner) {
    return index_run<true>("cuda gather backward", true, device, dt, gy, idx, gx, outer, n, k, inner);
}
