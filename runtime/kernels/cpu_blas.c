/* cpu_blas.c — GEMM through OpenBLAS (cblas_sgemm/dgemm) and the per-process
 * BLAS thread setting.
 *
 * Invariants: the thread count is applied once before the first GEMM
 * (default 1 thread: MPI ranks already fill the cores; MPIRPC_BLAS_THREADS
 * overrides, mpr_blas_set_num_threads changes it at any time). Degenerate
 * sizes (M, N or K == 0) never reach BLAS: K == 0 scales C by beta. */
#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>

#include "mpirpc/tensor_ops.h"
#include "mpri_kernels.h"

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static int blas_threads = 1;

static void blas_apply_env(void) {
    const char *env = getenv("MPIRPC_BLAS_THREADS");
    int n = 1;
    if (env && *env) {
        n = atoi(env);
        if (n < 1) n = 1;
    }
    blas_threads = n;
    openblas_set_num_threads(n);
}

void mpri_blas_init(void) { pthread_once(&blas_once, blas_apply_env); }

void mpr_blas_set_num_threads(int n) {
    mpri_blas_init();
    if (n < 1) n = 1;
    blas_threads = n;
    openblas_set_num_threads(n);
}

int mpr_blas_num_threads(void) {
    mpri_blas_init();
    return blas_threads;
}

void mpri_k_gemm(mpr_dtype_t dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                 double alpha, const void *A, int64_t lda, const void *B, int64_t ldb, double beta,
                 void *C, int64_t ldc) {
    if (M == 0 || N == 0) return;
    if (K == 0) {
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                if (dt == MPR_F32) {
                    float *c = (float *)C + i * ldc + j;
                    *c = beta == 0 ? 0.0f : (float)beta * *c;
                } else {
                    double *c = (double *)C + i * ldc + j;
                    *c = beta == 0 ? 0.0 : beta * *c;
                }
            }
        return;
    }
    mpri_blas_init();
    enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
    if (dt == MPR_F32)
        cblas_sgemm(CblasRowMajor, ta, tb, (blasint)M, (blasint)N, (blasint)K, (float)alpha, A,
                    (blasint)lda, B, (blasint)ldb, (float)beta, C, (blasint)ldc);
    else
        cblas_dgemm(CblasRowMajor, ta, tb, (blasint)M, (blasint)N, (blasint)K, alpha, A,
                    (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
}
