// cuda_common.cuh — helpers shared by the CUDA kernel files (internal):
// error reporting into mpr_error_set, device selection, launch geometry and
// the strided N-d indexer used by the elementwise kernels.
#ifndef MPRI_CUDA_COMMON_CUH
#define MPRI_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/mpri_cuda.h"

// The mpr error for a failed CUDA call. A failed runtime call also records its
// error as the thread's "last error", which cudaGetLastError() would report
// again after the NEXT kernel launch (a successful call does not reset it), so
// the stale copy is consumed here: a recoverable failure (out of memory, bad
// argument) is reported once, by the call that caused it. Sticky errors
// (a kernel fault) keep failing every later call on their own.
static inline mpr_err_t mpri_cuda_fail(cudaError_t e, const char *what) {
    (void)cudaGetLastError();
    return mpr_error_set(e == cudaErrorMemoryAllocation ? MPR_ERR_NOMEM : MPR_ERR_STATE, "%s: CUDA error: %s", what,
                         cudaGetErrorString(e));
}

// Return an mpr error naming `what` when a CUDA call fails.
#define MPRI_CUDA_CHECK(call, what)                                                                  \
    do {                                                                                             \
        cudaError_t e_ = (call);                                                                     \
        if (e_ != cudaSuccess) return mpri_cuda_fail(e_, (what));                                    \
    } while (0)

// Check the last launch of `what` (configuration errors surface here,
// execution errors at the next synchronizing call).
#define MPRI_CUDA_LAUNCHED(what) MPRI_CUDA_CHECK(cudaGetLastError(), (what))

static inline unsigned mpri_cuda_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    return (unsigned)(b > 65535 ? 65535 : b); // grid-stride loops cover the rest
}

// Shape and strides (elements) of up to 3 operands, passed by value to kernels.
struct mpri_cuda_nd {
    int ndim;
    int64_t shape[MPR_MAX_DIMS];
    int64_t st[3][MPR_MAX_DIMS];
};

static inline mpri_cuda_nd mpri_cuda_make_nd(int ndim, const int64_t *shape, const int64_t *s0,
                                             const int64_t *s1, const int64_t *s2) {
    mpri_cuda_nd nd;
    nd.ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        nd.shape[d] = shape[d];
        nd.st[0][d] = s0 ? s0[d] : 0;
        nd.st[1][d] = s1 ? s1[d] : 0;
        nd.st[2][d] = s2 ? s2[d] : 0;
    }
    return nd;
}

// Offsets of linear element i (C order over nd.shape) in each operand.
__device__ static inline void mpri_cuda_offsets(const mpri_cuda_nd &nd, int64_t i, int64_t *o0, int64_t *o1,
                                                int64_t *o2) {
    int64_t a = 0, b = 0, c = 0;
    for (int d = nd.ndim - 1; d >= 0; d--) {
        int64_t s = nd.shape[d];
        int64_t k = i % s;
        i /= s;
        a += k * nd.st[0][d];
        b += k * nd.st[1][d];
        c += k * nd.st[2][d];
    }
    *o0 = a;
    *o1 = b;
    *o2 = c;
}

static inline int64_t mpri_cuda_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

// Select `device` for the calls that follow, and drop any non-sticky error
// left behind by an earlier call whose result was ignored (mpri_cuda_free,
// cudaGetDeviceCount): MPRI_CUDA_LAUNCHED must only see this entry's launches.
#define MPRI_CUDA_SET_DEVICE(device, what)                                                           \
    do {                                                                                             \
        MPRI_CUDA_CHECK(cudaSetDevice(device), (what));                                              \
        (void)cudaGetLastError();                                                                    \
    } while (0)

#endif
