// cuda_device.cu — device discovery, device memory, transfers and the cuBLAS
// GEMM behind mpri_cuda_k_gemm.
//
// Invariants: one cuBLAS handle per device, created on first use under a
// mutex and kept for the process; every entry point selects its device first;
// transfers are synchronous (cudaMemcpy), so a returned host buffer is ready.
// Row-major GEMM maps to column-major cuBLAS as C^T = op(B)^T op(A)^T.
#include <cublas_v2.h>
#include <mutex>
#include <string.h>

#include "cuda_common.cuh"

#define MAX_DEVICES 64

static std::mutex handle_mu;
static cublasHandle_t handles[MAX_DEVICES];

extern "C" int mpri_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); // clear the sticky "no driver / no device" error
        return 0;
    }
    return n;
}

extern "C" mpr_err_t mpri_cuda_malloc(int device, size_t nbytes, void **out) {
    *out = NULL;
    if (nbytes == 0) return MPR_OK;
    MPRI_CUDA_SET_DEVICE(device, "cuda_malloc");
    cudaError_t e = cudaMalloc(out, nbytes);
    if (e != cudaSuccess) {
        *out = NULL;
        (void)cudaGetLastError(); // not left for the next launch check to report
        // Only an allocation failure is "out of memory"; a sticky error of an
        // earlier kernel also fails cudaMalloc and must not read as one.
        return mpr_error_set(e == cudaErrorMemoryAllocation ? MPR_ERR_NOMEM : MPR_ERR_STATE,
                             "cuda_malloc: %zu bytes on cuda:%d: %s", nbytes, device, cudaGetErrorString(e));
    }
    return MPR_OK;
}

extern "C" void mpri_cuda_free(void *data, int device) {
    if (!data) return;
    // Errors cannot be returned from a free hook (and at process exit the
    // runtime may already be unloading); they are dropped, not left as the
    // thread's last error for an unrelated later launch check.
    if (cudaSetDevice(device) == cudaSuccess) cudaFree(data);
    (void)cudaGetLastError();
}

extern "C" mpr_err_t mpri_cuda_memcpy(void *dst, int dst_device, const void *src, int src_device, size_t nbytes) {
    if (nbytes == 0) return MPR_OK;
    if (dst_device < 0 && src_device < 0) { // host to host: no CUDA call (works without a device)
        memcpy(dst, src, nbytes);
        return MPR_OK;
    }
    cudaMemcpyKind kind = dst_device < 0 ? (src_device < 0 ? cudaMemcpyHostToHost : cudaMemcpyDeviceToHost)
                                         : (src_device < 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice);
    if (dst_device >= 0 && src_device >= 0 && dst_device != src_device) {
        // cudaMemcpyPeer returns before the copy is done (it is only ordered
        // with the work of both devices): wait, so the copy is synchronous as
        // promised and its errors are reported here.
        MPRI_CUDA_SET_DEVICE(dst_device, "cuda_memcpy (peer)");
        MPRI_CUDA_CHECK(cudaMemcpyPeer(dst, dst_device, src, src_device, nbytes), "cuda_memcpy (peer)");
        MPRI_CUDA_CHECK(cudaDeviceSynchronize(), "cuda_memcpy (peer)");
        return MPR_OK;
    }
    int dev = dst_device >= 0 ? dst_device : src_device;
    if (dev >= 0) MPRI_CUDA_SET_DEVICE(dev, "cuda_memcpy");
    MPRI_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, kind), "cuda_memcpy");
    return MPR_OK;
}

extern "C" mpr_err_t mpri_cuda_synchronize(int device) {
    MPRI_CUDA_SET_DEVICE(device, "cuda_synchronize");
    MPRI_CUDA_CHECK(cudaDeviceSynchronize(), "cuda_synchronize");
    return MPR_OK;
}

static const char *cublas_name(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "error";
    }
}

static mpr_err_t get_handle(int device, cublasHandle_t *out) {
    if (device < 0 || device >= MAX_DEVICES)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "cuda gemm: device %d out of range", device);
    std::lock_guard<std::mutex> lock(handle_mu);
    if (!handles[device]) {
        cublasStatus_t s = cublasCreate(&handles[device]);
        if (s != CUBLAS_STATUS_SUCCESS) {
            handles[device] = NULL;
            return mpr_error_set(MPR_ERR_STATE, "cuda gemm: cublasCreate on cuda:%d: %s", device, cublas_name(s));
        }
    }
    *out = handles[device];
    return MPR_OK;
}

static mpr_err_t check_ld(const char *name, int64_t ld, int64_t rows) {
    int64_t need = rows > 1 ? rows : 1;
    if (ld < need)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "cuda gemm: %s = %lld, must be >= %lld", name, (long long)ld,
                             (long long)need);
    return MPR_OK;
}

extern "C" mpr_err_t mpri_cuda_gemm_plan(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda,
                                         int64_t ldb, int64_t ldc, mpri_cuda_gemm_plan_t *plan) {
    if (M < 0 || N < 0 || K < 0)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "cuda gemm: negative size (M=%lld N=%lld K=%lld)", (long long)M,
                             (long long)N, (long long)K);
    if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX || ldc > INT32_MAX)
        return mpr_error_set(MPR_ERR_UNSUPPORTED, "cuda gemm: dimensions beyond 2^31 are not supported");
    // Row-major lds are row strides: stored A is [M, K] (or [K, M] when
    // trans_a), stored B is [K, N] (or [N, K]), C is [M, N].
    mpr_err_t rc = check_ld("ldc", ldc, N);
    if (rc == MPR_OK && K > 0) rc = check_ld("lda", lda, trans_a ? M : K);
    if (rc == MPR_OK && K > 0) rc = check_ld("ldb", ldb, trans_b ? K : N);
    if (rc != MPR_OK) return rc;
    plan->trans_first = trans_b;
    plan->trans_second = trans_a;
    plan->m = (int)N;
    plan->n = (int)M;
    plan->k = (int)K;
    plan->ld_first = (int)ldb;
    plan->ld_second = (int)lda;
    plan->ldc = (int)ldc;
    return MPR_OK;
}

// C[i, j] = beta * C[i, j] (0 when beta is 0, NaN-free like BLAS): GEMM with K == 0.
template <typename T> __global__ void scale_c_kernel(int64_t M, int64_t N, T beta, T *C, int64_t ldc) {
    int64_t total = M * N;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total; k += (int64_t)gridDim.x * blockDim.x) {
        T *c = C + (k / N) * ldc + k % N;
        *c = beta == (T)0 ? (T)0 : beta * *c;
    }
}

extern "C" mpr_err_t mpri_cuda_k_gemm(int device, mpr_dtype_t dt, bool trans_a, bool trans_b, int64_t M, int64_t N,
                                      int64_t K, double alpha, const void *A, int64_t lda, const void *B,
                                      int64_t ldb, double beta, void *C, int64_t ldc) {
    if (M == 0 || N == 0) return MPR_OK;
    if (dt != MPR_F32 && dt != MPR_F64)
        return mpr_error_set(MPR_ERR_DTYPE, "cuda gemm: dtype %s (float32/float64 only)", mpr_dtype_name(dt));
    mpri_cuda_gemm_plan_t p;
    mpr_err_t rc = mpri_cuda_gemm_plan(trans_a, trans_b, M, N, K, lda, ldb, ldc, &p);
    if (rc != MPR_OK) return rc;
    MPRI_CUDA_SET_DEVICE(device, "cuda gemm");
    if (K == 0) {
        // As the CPU kernel: C = beta C without calling BLAS (cuBLAS rejects
        // the lda/ldb of 0 that an empty operand [M, 0] has).
        unsigned b = mpri_cuda_blocks(M * N, 256);
        if (dt == MPR_F32)
            scale_c_kernel<float><<<b, 256>>>(M, N, (float)beta, (float *)C, ldc);
        else
            scale_c_kernel<double><<<b, 256>>>(M, N, beta, (double *)C, ldc);
        MPRI_CUDA_LAUNCHED("cuda gemm (K = 0)");
        return MPR_OK;
    }
    cublasHandle_t h;
    rc = get_handle(device, &h);
    if (rc != MPR_OK) return rc;
    // Row-major C = op(A) op(B)  <=>  column-major C^T = op(B)^T op(A)^T: swap the operands.
    cublasOperation_t ta = p.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = p.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t s;
    if (dt == MPR_F32) {
        float al = (float)alpha, be = (float)beta;
        s = cublasSgemm(h, ta, tb, p.m, p.n, p.k, &al, (const float *)B, p.ld_first, (const float *)A, p.ld_second,
                        &be, (float *)C, p.ldc);
    } else {
        s = cublasDgemm(h, ta, tb, p.m, p.n, p.k, &alpha, (const double *)B, p.ld_first, (const double *)A,
                        p.ld_second, &beta, (double *)C, p.ldc);
    }
    if (s != CUBLAS_STATUS_SUCCESS)
        return mpr_error_set(MPR_ERR_STATE, "cuda gemm: cuBLAS %s (M=%lld N=%lld K=%lld)", cublas_name(s),
                             (long long)M, (long long)N, (long long)K);
    return MPR_OK;
}
