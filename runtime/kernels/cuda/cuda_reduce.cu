// cuda_reduce.cu — max over the middle dim of [outer, n, inner] and its
// backward (the CUDA side of mpri_k_max_dim / mpri_k_max_dim_backward).
//
// Invariants: one thread per (outer, inner) line; the first maximum wins and
// a NaN wins over numbers (as the CPU kernel); backward adds gout at the
// argmax with plain adds (no atomics): every (outer, inner) line
// writes distinct elements (the caller zeroes gin).
#include <math.h>

#include "cuda_common.cuh"

#define THREADS 256

template <typename T>
__global__ void max_dim_kernel(int64_t outer, int64_t n, int64_t inner, const T *in, T *vals, int64_t *idx) {
    int64_t lines = outer * inner;
    for (int64_t l = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; l < lines; l += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = l / inner, j = l % inner;
        const T *p = in + o * n * inner + j;
        T best = p[0];
        int64_t bi = 0;
        for (int64_t k = 1; k < n && !isnan(best); k++) {
            T v = p[k * inner];
            if (v > best || isnan(v)) {
                best = v;
                bi = k;
            }
        }
        vals[l] = best;
        if (idx) idx[l] = bi;
    }
}

template <typename T>
__global__ void max_dim_bw_kernel(int64_t outer, int64_t n, int64_t inner, const T *gout, const int64_t *idx, T *gin) {
    int64_t lines = outer * inner;
    for (int64_t l = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; l < lines; l += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = l / inner, j = l % inner;
        gin[(o * n + idx[l]) * inner + j] += gout[l];
    }
}

extern "C" mpr_err_t mpri_cuda_k_max_dim(int device, mpr_dtype_t dt, int64_t outer, int64_t n, int64_t inner,
                                         const void *in, void *vals, int64_t *idx) {
    int64_t lines = outer * inner;
    if (lines == 0) return MPR_OK;
    if (n < 1) return mpr_error_set(MPR_ERR_INVALID_ARG, "cuda max_dim: empty reduced dim");
    MPRI_CUDA_SET_DEVICE(device, "cuda max_dim");
    unsigned b = mpri_cuda_blocks(lines, THREADS);
    if (dt == MPR_F32)
        max_dim_kernel<float><<<b, THREADS>>>(outer, n, inner, (const float *)in, (float *)vals, idx);
    else if (dt == MPR_F64)
        max_dim_kernel<double><<<b, THREADS>>>(outer, n, inner, (const double *)in, (double *)vals, idx);
    else
        return mpr_error_set(MPR_ERR_DTYPE, "cuda max_dim: dtype %s", mpr_dtype_name(dt));
    MPRI_CUDA_LAUNCHED("cuda max_dim");
    return MPR_OK;
}

extern "C" mpr_err_t mpri_cuda_k_max_dim_backward(int device, mpr_dtype_t dt, int64_t outer, int64_t n,
                                                  int64_t inner, const void *gout, const int64_t *idx, void *gin) {
    int64_t lines = outer * inner;
    if (lines == 0) return MPR_OK;
    MPRI_CUDA_SET_DEVICE(device, "cuda max_dim backward");
    unsigned b = mpri_cuda_blocks(lines, THREADS);
    if (dt == MPR_F32)
        max_dim_bw_kernel<float><<<b, THREADS>>>(outer, n, inner, (const float *)gout, idx, (float *)gin);
    else if (dt == MPR_F64)
        max_dim_bw_kernel<double><<<b, THREADS>>>(outer, n, inner, (const double *)gout, idx, (double *)gin);
    else
        return mpr_error_set(MPR_ERR_DTYPE, "cuda max_dim backward: dtype %s", mpr_dtype_name(dt));
    MPRI_CUDA_LAUNCHED("cuda max_dim backward");
    return MPR_OK;
}
