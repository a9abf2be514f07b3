// cuda_device.cu — device discovery, device memory, transfers and the cuBLAS
// GEMM behind mpri_cuda_k_gemm.
//
// Invariants: one cuBLAS handle per device, created on first use under a
// mutex and kept for the process; every entry point selects its device first;
// transfers are synchronous (cudaMemcpy), so a returned host buffer is ready.
// Row-major GEMM maps to column-major cuBLAS as C^T = op(B)^T op(A)^T.
#include <cublas_v2.h>
#include <mutex>

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
        return mpr_error_set(MPR_ERR_NOMEM, "cuda_malloc: %zu bytes on cuda:%d: %s", nbytes, device,
                             cudaGetErrorString(e));
    }
    return MPR_OK;
}

extern "C" void mpri_cuda_free(void *data, int device) {
    if (!data) return;
    cudaSetDevice(device);
    cudaFree(data);
}

extern "C" mpr_err_t mpri_cuda_memcpy(void *dst, int dst_device, const void *src, int src_device, size_t nbytes) {
    if (nbytes == 0) return MPR_OK;
    cudaMemcpyKind kind = dst_device < 0 ? (src_device < 0 ? cudaMemcpyHostToHost : cudaMemcpyDeviceToHost)
                                         : (src_device < 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice);
    if (dst_device >= 0 && src_device >= 0 && dst_device != src_device) {
        MPRI_CUDA_CHECK(cudaMemcpyPeer(dst, dst_device, src, src_device, nbytes), "cuda_memcpy (peer)");
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

extern "C" mpr_err_t mpri_cuda_k_gemm(int device, mpr_dtype_t dt, bool trans_a, bool trans_b, int64_t M, int64_t N,
                                      int64_t K, double alpha, const void *A, int64_t lda, const void *B,
                                      int64_t ldb, double beta, void *C, int64_t ldc) {
    if (M == 0 || N == 0) return MPR_OK;
    if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX || ldc > INT32_MAX)
        return mpr_error_set(MPR_ERR_UNSUPPORTED, "cuda gemm: dimensions beyond 2^31 are not supported");
    MPRI_CUDA_SET_DEVICE(device, "cuda gemm");
    cublasHandle_t h;
    mpr_err_t rc = get_handle(device, &h);
    if (rc != MPR_OK) return rc;
    // Row-major C = op(A) op(B)  <=>  column-major C^T = op(B)^T op(A)^T: swap the operands.
    cublasOperation_t ta = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t s;
    if (dt == MPR_F32) {
        float al = (float)alpha, be = (float)beta;
        s = cublasSgemm(h, ta, tb, (int)N, (int)M, (int)K, &al, (const float *)B, (int)ldb, (const float *)A,
                        (int)lda, &be, (float *)C, (int)ldc);
    } else if (dt == MPR_F64) {
        s = cublasDgemm(h, ta, tb, (int)N, (int)M, (int)K, &alpha, (const double *)B, (int)ldb,
                        (const double *)A, (int)lda, &beta, (double *)C, (int)ldc);
    } else {
        return mpr_error_set(MPR_ERR_DTYPE, "cuda gemm: dtype %s (float32/float64 only)", mpr_dtype_name(dt));
    }
    if (s != CUBLAS_STATUS_SUCCESS)
        return mpr_error_set(MPR_ERR_STATE, "cuda gemm: cuBLAS %s (M=%lld N=%lld K=%lld)", cublas_name(s),
                             (long long)M, (long long)N, (long long)K);
    return MPR_OK;
}
