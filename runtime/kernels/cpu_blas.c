/* cpu_blas.c — GEMM through OpenBLAS (cblas_sgemm/dgemm), the per-process
 * BLAS thread setting, and the check of OpenBLAS's kernel set.
 *
 * Kernel set: a DYNAMIC_ARCH OpenBLAS picks its kernels when it loads, from
 * the CPU's model number, unless OPENBLAS_CORETYPE names a set. A CPU newer
 * than the OpenBLAS build gets its generic "Prescott" kernels (SSE3): Debian
 * 12's 0.3.21 does that on Intel Xeon family 6 model 207 (Emerald Rapids),
 * where sgemm (n = 512, one thread) ran at 30 GFLOPS against 155 with
 * OPENBLAS_CORETYPE=SkylakeX. mpr_blas_better_kernels() names the set to ask
 * for in that case (from the CPU's features, not its model), and the first
 * GEMM of a process prints the advice once (one line per host: only the
 * launcher's local rank 0, or a process started without a launcher). The
 * set can only be chosen before OpenBLAS loads: the apps re-execute
 * themselves with it (apps/common/blas.c); a library cannot.
 *
 * Invariants: the thread count is applied once before the first GEMM
 * (default 1 thread: MPI ranks already fill the cores; MPIRPC_BLAS_THREADS
 * overrides, mpr_blas_set_num_threads changes it at any time). Degenerate
 * sizes (M, N or K == 0) never reach BLAS: K == 0 scales C by beta. */
#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpirpc/tensor_ops.h"
#include "mpri_kernels.h"

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static int launcher_local_rank(void);
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
    const char *better = mpr_blas_better_kernels();
    if (*better && launcher_local_rank() == 0)
        fprintf(stderr,
                "mpirpc: OpenBLAS did not recognise this CPU and runs its generic \"%s\" kernels, several "
                "times slower here: set OPENBLAS_CORETYPE=%s before the program starts (the mpirpc apps do "
                "that themselves)\n",
                mpr_blas_kernels(), better);
}

/* The rank of this process among the job's processes on its host, from the
 * launcher's environment (Open MPI, Slurm, MPICH/Hydra); 0 without one. */
static int launcher_local_rank(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

const char *mpri_blas_pick_kernels(const char *corename, const char *coretype_env, bool avx512, bool avx2_fma) {
    if (coretype_env && *coretype_env) return ""; /* the user chose */
    if (!corename || strcmp(corename, "Prescott") != 0) return "";
    /* Prescott is OpenBLAS's fallback for a model it does not know; no
     * Prescott has AVX2, so a CPU with it was not recognised. */
    if (avx512) return "SkylakeX";
    if (avx2_fma) return "Haswell";
    return "";
}

const char *mpr_blas_kernels(void) {
    const char *name = openblas_get_corename();
    return name ? name : "";
}

const char *mpr_blas_better_kernels(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    bool avx512 = false, avx2_fma = false;
#endif
    return mpri_blas_pick_kernels(mpr_blas_kernels(), getenv("OPENBLAS_CORETYPE"), avx512, avx2_fma);
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
    if (mpri_k_gemm_small(dt, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
    enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
    if (dt == MPR_F32)
        cblas_sgemm(CblasRowMajor, ta, tb, (blasint)M, (blasint)N, (blasint)K, (float)alpha, A,
                    (blasint)lda, B, (blasint)ldb, (float)beta, C, (blasint)ldc);
    else
        cblas_dgemm(CblasRowMajor, ta, tb, (blasint)M, (blasint)N, (blasint)K, alpha, A,
                    (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
}
