// cuda_nn.cu — device versions of the softmax family and the losses of
// mpri_nn_kernels.h (nll, cross entropy, mse), with the CPU kernels' formulas:
// cross entropy keeps lse[r] = log(sum(exp(x - rowmax))) for backward.
//
// Invariants: one thread per (outer, inner) line for softmax and one per row
// for the cross-entropy / nll forward; one block per row for the
// cross-entropy backward (row max by a block reduction); scalar losses are summed
// in double with atomicAdd into a device accumulator that is copied back
// synchronously, so the returned value is final; temporary device buffers are
// freed on every path.
#include <math.h>

#include "cuda_common.cuh"

#define THREADS 256

template <typename T>
__global__ void softmax_fwd_kernel(const T *x, T *y, int64_t outer, int64_t n, int64_t inner, int is_log) {
    int64_t lines = outer * inner;
    for (int64_t l = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; l < lines; l += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = l / inner, i = l % inner;
        const T *xl = x + o * n * inner + i;
        T *yl = y + o * n * inner + i;
        T m = -INFINITY;
        for (int64_t j = 0; j < n; j++) m = xl[j * inner] > m ? xl[j * inner] : m;
        if (m == -INFINITY) m = 0;
        T s = 0;
        for (int64_t j = 0; j < n; j++) s += exp(xl[j * inner] - m);
        T ls = log(s);
        for (int64_t j = 0; j < n; j++)
            yl[j * inner] = is_log ? xl[j * inner] - m - ls : exp(xl[j * inner] - m) / s;
    }
}

template <typename T>
__global__ void softmax_bwd_kernel(const T *y, const T *gy, T *gx, int64_t outer, int64_t n, int64_t inner,
                                   int is_log) {
    int64_t lines = outer * inner;
    for (int64_t l = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; l < lines; l += (int64_t)gridDim.x * blockDim.x) {
        int64_t base = (l / inner) * n * inner + l % inner;
        T s = 0;
        for (int64_t j = 0; j < n; j++) {
            int64_t k = base + j * inner;
            s += is_log ? gy[k] : gy[k] * y[k];
        }
        for (int64_t j = 0; j < n; j++) {
            int64_t k = base + j * inner;
            gx[k] = is_log ? gy[k] - exp(y[k]) * s : y[k] * (gy[k] - s);
        }
    }
}

#define DISPATCH_FLOAT(dt, what, CALL_F32, CALL_F64)                                                  \
    do {                                                                                              \
        if ((dt) == MPR_F32) {                                                                        \
            CALL_F32;                                                                                 \
        } else if ((dt) == MPR_F64) {                                                                 \
            CALL_F64;                                                                                 \
        } else {                                                                                      \
            return mpr_error_set(MPR_ERR_DTYPE, "%s: dtype %s (float32/float64 only)", (what),        \
                                 mpr_dtype_name(dt));                                                 \
        }                                                                                             \
        MPRI_CUDA_LAUNCHED(what);                                                                     \
    } while (0)

extern "C" mpr_err_t mpri_cuda_softmax_fwd(int device, mpr_dtype_t dt, const void *x, void *y, int64_t outer,
                                           int64_t n, int64_t inner, int is_log) {
    int64_t lines = outer * inner;
    if (lines == 0 || n == 0) return MPR_OK;
    MPRI_CUDA_SET_DEVICE(device, "cuda softmax");
    unsigned b = mpri_cuda_blocks(lines, THREADS);
    DISPATCH_FLOAT(dt, "cuda softmax",
                   (softmax_fwd_kernel<float><<<b, THREADS>>>((const float *)x, (float *)y, outer, n, inner, is_log)),
                   (softmax_fwd_kernel<double><<<b, THREADS>>>((const double *)x, (double *)y, outer, n, inner,
                                                               is_log)));
    return MPR_OK;
}

extern "C" mpr_err_t mpri_cuda_softmax_bwd(int device, mpr_dtype_t dt, const void *y, const void *gy, void *gx,
                                           int64_t outer, int64_t n, int64_t inner, int is_log) {
    int64_t lines = outer * inner;
    if (lines == 0 || n == 0) return MPR_OK;
    MPRI_CUDA_SET_DEVICE(device, "cuda softmax backward");
    unsigned b = mpri_cuda_blocks(lines, THREADS);
    DISPATCH_FLOAT(dt, "cuda softmax backward",
                   (softmax_bwd_kernel<float><<<b, THREADS>>>((const float *)y, (const float *)gy, (float *)gx,
                                                              outer, n, inner, is_log)),
                   (softmax_bwd_kernel<double><<<b, THREADS>>>((const double *)y, (const double *)gy,
                                                               (double *)gx, outer, n, inner, is_log)));
    return MPR_OK;
}

// acc[0] += loss term (double), cnt[0] += counted rows.
struct accum {
    double sum;
    unsigned long long count;
};

template <typename T>
__global__ void ce_fwd_kernel(const T *x, const int64_t *target, int64_t N, int64_t C, int64_t ignore, T *lse,
                              accum *acc) {
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < N; r += (int64_t)gridDim.x * blockDim.x) {
        const T *xr = x + r * C;
        T m = -INFINITY;
        for (int64_t j = 0; j < C; j++) m = xr[j] > m ? xr[j] : m;
        if (m == -INFINITY) m = 0;
        T e = 0;
        for (int64_t j = 0; j < C; j++) e += exp(xr[j] - m);
        lse[r] = log(e);
        int64_t t = target[r];
        if (t == ignore) continue;
        // Out-of-range targets are rejected by the op layer before the launch.
        atomicAdd(&acc->sum, (double)lse[r] - (double)(xr[t] - m));
        atomicAdd(&acc->count, 1ULL);
    }
}

// One block per row (grid-stride over rows): the block finds the row max
// (a tree over per-thread maxima: NaNs are skipped by the comparison as in
// the CPU loop and max is order-free, so the result is the CPU's m exactly),
// then writes the row. Work is O(N C), not O(N C^2) as with a per-element
// rescan of the row. Launched with blockDim.x == THREADS (a power of two).
template <typename T>
__global__ void ce_bwd_kernel(const T *x, const int64_t *target, const T *lse, int64_t N, int64_t C, int64_t ignore,
                              int64_t count, T scale, T *gx) {
    __shared__ T red[THREADS];
    const int tid = threadIdx.x;
    for (int64_t r = blockIdx.x; r < N; r += gridDim.x) { // uniform per block: no divergent __syncthreads
        const T *xr = x + r * C;
        T *gr = gx + r * C;
        int64_t t = target[r];
        if (t == ignore || count == 0) {
            for (int64_t j = tid; j < C; j += blockDim.x) gr[j] = 0;
            continue;
        }
        T m = -INFINITY;
        for (int64_t j = tid; j < C; j += blockDim.x) m = xr[j] > m ? xr[j] : m;
        red[tid] = m;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if (tid < s && red[tid + s] > red[tid]) red[tid] = red[tid + s];
            __syncthreads();
        }
        m = red[0];
        __syncthreads(); // everyone read red[0] before the next row overwrites it
        if (m == -INFINITY) m = 0;
        T l = lse[r];
        for (int64_t j = tid; j < C; j += blockDim.x) {
            T v = exp((xr[j] - m) - l) * scale;
            gr[j] = j == t ? v - scale : v;
        }
    }
}

// Run `launch` with a zeroed device accumulator and copy it back.
template <typename F> static mpr_err_t with_accum(const char *what, accum *host, F launch) {
    accum *dev = NULL;
    MPRI_CUDA_CHECK(cudaMalloc(&dev, sizeof *dev), what);
    cudaError_t e = cudaMemset(dev, 0, sizeof *dev);
    if (e == cudaSuccess) {
        launch(dev);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaMemcpy(host, dev, sizeof *host, cudaMemcpyDeviceToHost);
    cudaFree(dev);
    if (e != cudaSuccess) return mpri_cuda_fail(e, what);
    return MPR_OK;
}

// Shared body of the class losses' forward: check the dtype, run `launch(acc)`
// over the N rows with a zeroed accumulator, and turn its (sum, count) into
// the mean loss (0 when no row counts).
template <typename F>
static mpr_err_t class_loss_fwd(const char *what, int device, mpr_dtype_t dt, int64_t N, double *loss,
                                int64_t *count, F launch) {
    if (dt != MPR_F32 && dt != MPR_F64)
        return mpr_error_set(MPR_ERR_DTYPE, "%s: dtype %s", what, mpr_dtype_name(dt));
    MPRI_CUDA_SET_DEVICE(device, what);
    accum h = {0, 0};
    if (N > 0) {
        mpr_err_t rc = with_accum(what, &h, launch);
        if (rc != MPR_OK) return rc;
    }
    *count = (int64_t)h.count;
    *loss = h.count ? h.sum / (double)h.count : 0.0;
    return MPR_OK;
}

extern "C" mpr_err_t mpri_cuda_cross_entropy_fwd(int device, mpr_dtype_t dt, const void *x, const int64_t *target,
                                                 int64_t N, int64_t C, int64_t ignore_index, void *lse, double *loss,
                                                 int64_t *count) {
    unsigned b = mpri_cuda_blocks(N, THREADS);
    return class_loss_fwd("cuda cross_entropy", device, dt, N, loss, count, [&](accum *acc) {
        if (dt == MPR_F32)
            ce_fwd_kernel<float><<<b, THREADS>>>((const float *)x, target, N, C, ignore_index, (float *)lse, acc);
        else
            ce_fwd_kernel<double><<<b, THREADS>>>((const double *)x, target, N, C, ignore_index, (double *)lse, acc);
    });
}

extern "C" mpr_err_t mpri_cuda_cross_entropy_bwd(int device, mpr_dtype_t dt, const void *x, const int64_t *target,
                                                 const void *lse, int64_t N, int64_t C, int64_t ignore_index,
                                                 int64_t count, double g, void *gx) {
    if (N * C == 0) return MPR_OK;
    MPRI_CUDA_SET_DEVICE(device, "cuda cross_entropy backward");
    unsigned b = (unsigned)(N < 65535 ? N : 65535); // one block per row

    double scale = count ? g / (double)count : 0.0;
    DISPATCH_FLOAT(dt, "cuda cross_entropy backward",
                   (ce_bwd_kernel<float><<<b, THREADS>>>((const float *)x, target, (const float *)lse, N, C,
                                                         ignore_index, count, (float)scale, (float *)gx)),
                   (ce_bwd_kernel<double><<<b, THREADS>>>((const double *)x, target, (const double *)lse, N, C,
                                                          ignore_index, count, scale, (double *)gx)));
    return MPR_OK;
}

template <typename T>
__global__ void nll_fwd_kernel(const T *logp, const int64_t *target, int64_t N, int64_t C, int64_t ignore,
                               accum *acc) {
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < N; r += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = target[r];
        if (t == ignore) continue;
        atomicAdd(&acc->sum, -(double)logp[r * C + t]);
        atomicAdd(&acc->count, 1ULL);
    }
}

template <typename T>
__global__ void nll_bwd_kernel(const int64_t *target, int64_t N, int64_t C, int64_t ignore, T v, T *g) {
    int64_t total = N * C;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total; k += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = k / C, j = k % C;
        g[k] = (target[r] != ignore && target[r] == j) ? v : (T)0;
    }
}

extern "C" mpr_err_t mpri_cuda_nll_loss_fwd(int device, mpr_dtype_t dt, const void *logp, const int64_t *target,
                                            int64_t N, int64_t C, int64_t ignore_index, double *loss,
                                            int64_t *count) {
    unsigned b = mpri_cuda_blocks(N, THREADS);
    return class_loss_fwd("cuda nll_loss", device, dt, N, loss, count, [&](accum *acc) {
        if (dt == MPR_F32)
            nll_fwd_kernel<float><<<b, THREADS>>>((const float *)logp, target, N, C, ignore_index, acc);
        else
            nll_fwd_kernel<double><<<b, THREADS>>>((const double *)logp, target, N, C, ignore_index, acc);
    });
}

extern "C" mpr_err_t mpri_cuda_nll_loss_bwd(int device, mpr_dtype_t dt, const int64_t *target, int64_t N, int64_t C,
                                            int64_t ignore_index, int64_t count, double g, void *glogp) {
    if (N * C == 0) return MPR_OK;
    MPRI_CUDA_SET_DEVICE(device, "cuda nll_loss backward");
    unsigned b = mpri_cuda_blocks(N * C, THREADS);
    double v = count ? -g / (double)count : 0.0;
    DISPATCH_FLOAT(dt, "cuda nll_loss backward",
                   (nll_bwd_kernel<float><<<b, THREADS>>>(target, N, C, ignore_index, (float)v, (float *)glogp)),
                   (nll_bwd_kernel<double><<<b, THREADS>>>(target, N, C, ignore_index, v, (double *)glogp)));
    return MPR_OK;
}

// Per-thread sums, reduced in the block (warp shuffles, then the warp sums
// in shared memory) before one atomicAdd per block: not one double atomic
// on a single address per thread (up to 16M of them). blockDim.x == THREADS.
template <typename T> __global__ void mse_fwd_kernel(const T *a, const T *b, int64_t n, accum *acc) {
    __shared__ double warp_sum[THREADS / 32];
    double local = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        double d = (double)a[i] - (double)b[i];
        local += d * d;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int off = 16; off > 0; off >>= 1) local += __shfl_down_sync(0xffffffffu, local, off);
    if (lane == 0) warp_sum[warp] = local;
    __syncthreads();
    if (warp == 0) {
        local = lane < (int)(blockDim.x >> 5) ? warp_sum[lane] : 0.0;
        for (int off = 16; off > 0; off >>= 1) local += __shfl_down_sync(0xffffffffu, local, off);
        if (lane == 0) atomicAdd(&acc->sum, local);
    }
}

template <typename T> __global__ void mse_bwd_kernel(const T *a, const T *b, int64_t n, T scale, T *ga, T *gb) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        T d = (a[i] - b[i]) * scale;
        if (ga) ga[i] = d;
        if (gb) gb[i] = -d;
    }
}

extern "C" mpr_err_t mpri_cuda_mse_loss_fwd(int device, mpr_dtype_t dt, const void *a, const void *b, int64_t n,
                                            double *loss) {
    const char *what = "cuda mse_loss";
    if (dt != MPR_F32 && dt != MPR_F64)
        return mpr_error_set(MPR_ERR_DTYPE, "%s: dtype %s", what, mpr_dtype_name(dt));
    if (n == 0) {
        *loss = NAN; // PyTorch: mean over nothing is nan (as the CPU kernel)
        return MPR_OK;
    }
    MPRI_CUDA_SET_DEVICE(device, what);
    accum h = {0, 0};
    unsigned bl = mpri_cuda_blocks(n, THREADS);
    mpr_err_t rc = with_accum(what, &h, [&](accum *acc) {
        if (dt == MPR_F32)
            mse_fwd_kernel<float><<<bl, THREADS>>>((const float *)a, (const float *)b, n, acc);
        else
            mse_fwd_kernel<double><<<bl, THREADS>>>((const double *)a, (const double *)b, n, acc);
    });
    if (rc != MPR_OK) return rc;
    *loss = h.sum / (double)n;
    return MPR_OK;
}

extern "C" mpr_err_t mpri_cuda_mse_loss_bwd(int device, mpr_dtype_t dt, const void *a, const void *b, int64_t n,
                                            double g, void *ga, void *gb) {
    if (n == 0) return MPR_OK;
    MPRI_CUDA_SET_DEVICE(device, "cuda mse_loss backward");
    unsigned bl = mpri_cuda_blocks(n, THREADS);
    double scale = 2.0 * g / (double)n;
    DISPATCH_FLOAT(dt, "cuda mse_loss backward",
                   (mse_bwd_kernel<float><<<bl, THREADS>>>((const float *)a, (const float *)b, n, (float)scale,
                                                           (float *)ga, (float *)gb)),
                   (mse_bwd_kernel<double><<<bl, THREADS>>>((const double *)a, (const double *)b, n, scale,
                                                            (double *)ga, (double *)gb)));
    return MPR_OK;
}
