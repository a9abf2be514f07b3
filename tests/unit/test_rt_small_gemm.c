/* test_rt_small_gemm.c — the GEMM for tiny products that bypasses OpenBLAS
 * (runtime/kernels/cpu_small_gemm.c):
 * - which products it takes (mpri_k_gemm_small_fits boundaries), and that
 *   it returns false without touching C for the others;
 * - every transpose combination, f32 and f64, row counts around its 4-row
 *   blocks, column counts around its vector width (partial last vectors),
 *   padded leading dimensions, alpha and beta: the same bits as the scalar
 *   sum in increasing p (both compiled without contraction), and within
 *   rounding of OpenBLAS; beta == 0 never reads C (NaN there stays out),
 *   and C's padding columns stay untouched;
 * - any element strides, 0 included (broadcast rows, columns, or a single
 *   element read in place), padded and transposed: the scalar sum's bits;
 * - mpri_k_gemm sends a tiny product there (same bits) and a product just
 *   too deep to BLAS (still the right numbers).
 * Built a second time as test_rt_small_gemm_baseline with its own copy of
 * the kernel without the AVX2 clone (tests/unit/CMakeLists.txt): the same
 * checks then hold for the baseline x86-64 code, and the dispatch test
 * compares its bits with the library's kernel, the AVX2 clone where the CPU
 * has AVX2. */
#include <cblas.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/mpri_kernels.h"

static void test_fits(void **state) {
    (void)state;
    assert_true(mpri_k_gemm_small_fits(MPR_F32, 8, 8, 8));
    assert_true(mpri_k_gemm_small_fits(MPR_F32, 1, 32, 64));
    assert_false(mpri_k_gemm_small_fits(MPR_F32, 1, 33, 8));  /* wider than 4 vectors */
    assert_true(mpri_k_gemm_small_fits(MPR_F64, 1, 16, 8));
    assert_false(mpri_k_gemm_small_fits(MPR_F64, 1, 17, 8));
    assert_false(mpri_k_gemm_small_fits(MPR_F32, 1, 8, 65)); /* deeper than the packing buffer */
    assert_true(mpri_k_gemm_small_fits(MPR_F32, 16, 16, 16)); /* 4096 */
    assert_false(mpri_k_gemm_small_fits(MPR_F32, 17, 16, 16));
    assert_false(mpri_k_gemm_small_fits(MPR_F32, 0, 8, 8));
    assert_false(mpri_k_gemm_small_fits(MPR_F32, 8, 0, 8));
    assert_false(mpri_k_gemm_small_fits(MPR_F32, 8, 8, 0));

    float a[4] = {1, 2, 3, 4}, b[33 * 2], c[33];
    for (int i = 0; i < 66; i++) b[i] = (float)i;
    for (int i = 0; i < 33; i++) c[i] = -1.0f;
    assert_false(mpri_k_gemm_small(MPR_F32, false, false, 1, 33, 2, 1.0, a, 2, b, 33, 0.0, c, 33));
    for (int i = 0; i < 33; i++) assert_true(c[i] == -1.0f);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double next_uniform(void) { /* [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) / (double)(1ull << 52) - 1.0;
}

/* op(X)[r][c] of a row-major X with leading dimension ld. */
#define OP(X, trans, r, c, ld) ((trans) ? (X)[(int64_t)(c) * (ld) + (r)] : (X)[(int64_t)(r) * (ld) + (c)])

#define CHECK_PRODUCT(T, DT, CBLAS_GEMM, REL_TOL)                                                       \
    static void check_##T(bool ta, bool tb, int M, int N, int K, T alpha, T beta) {                   \
        const int pad = 3;                                                                             \
        int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;                     \
        int64_t arows = ta ? K : M, brows = tb ? N : K;                                                \
        T *A = malloc(sizeof(T) * (size_t)(arows * lda)), *B = malloc(sizeof(T) * (size_t)(brows * ldb)); \
        T *C = malloc(sizeof(T) * (size_t)(M * ldc)), *want = malloc(sizeof(T) * (size_t)(M * ldc));  \
        T *blas = malloc(sizeof(T) * (size_t)(M * ldc));                                               \
        assert_non_null(A), assert_non_null(B), assert_non_null(C), assert_non_null(want);             \
        assert_non_null(blas);                                                                         \
        for (int64_t i = 0; i < arows * lda; i++) A[i] = (T)next_uniform();                            \
        for (int64_t i = 0; i < brows * ldb; i++) B[i] = (T)next_uniform();                            \
        for (int64_t i = 0; i < M * ldc; i++) {                                                        \
            bool padding = i % ldc >= N;                                                               \
            C[i] = padding ? (T)1234.5 : beta == 0 ? (T)NAN : (T)next_uniform();                       \
            want[i] = blas[i] = C[i];                                                                  \
        }                                                                                              \
        for (int i = 0; i < M; i++)                                                                    \
            for (int j = 0; j < N; j++) {                                                              \
                T acc = 0;                                                                             \
                for (int p = 0; p < K; p++) acc += OP(A, ta, i, p, lda) * OP(B, tb, p, j, ldb);        \
                T *w = &want[(int64_t)i * ldc + j];                                                    \
                *w = beta == 0 ? alpha * acc : alpha * acc + beta * *w;                                \
            }                                                                                          \
        assert_true(mpri_k_gemm_small(DT, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc));      \
        if (beta == 0)                                                                                 \
            for (int64_t i = 0; i < M * ldc; i++) blas[i] = 0;                                         \
        CBLAS_GEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, \
                   alpha, A, (int)lda, B, (int)ldb, beta, blas, (int)ldc);                             \
        for (int i = 0; i < M; i++)                                                                    \
            for (int64_t j = 0; j < ldc; j++) {                                                        \
                int64_t at = (int64_t)i * ldc + j;                                                     \
                if (j >= N) { /* padding: untouched */                                                 \
                    assert_true(C[at] == (T)1234.5);                                                   \
                    continue;                                                                          \
                }                                                                                      \
                if (C[at] != want[at])                                                                 \
                    fail_msg(#T " ta=%d tb=%d %dx%dx%d alpha=%g beta=%g: C[%d][%d] = %.17g, the scalar " \
                             "sum %.17g", ta, tb, M, N, K, (double)alpha, (double)beta, i, (int)j,     \
                             (double)C[at], (double)want[at]);                                         \
                double scale = 0; /* the size of the terms, for the rounding bound */                 \
                for (int p = 0; p < K; p++)                                                            \
                    scale += fabs((double)OP(A, ta, i, p, lda) * (double)OP(B, tb, p, j, ldb));        \
                scale = scale * fabs((double)alpha) + 1.0;                                             \
                assert_true(fabs((double)C[at] - (double)blas[at]) <= REL_TOL * scale);                \
            }                                                                                          \
        free(A), free(B), free(C), free(want), free(blas);                                             \
    }
CHECK_PRODUCT(float, MPR_F32, cblas_sgemm, 1e-5)
CHECK_PRODUCT(double, MPR_F64, cblas_dgemm, 1e-13)

static void test_matches_reference(void **state) {
    (void)state;
    static const int rows[] = {1, 3, 4, 5, 8, 9, 13};
    static const int cols32[] = {1, 7, 8, 9, 16, 17, 24, 31, 32};
    static const int cols64[] = {1, 3, 4, 5, 8, 9, 12, 16};
    static const int depth[] = {1, 3, 8, 17, 64};
    static const double alphas[] = {1.0, -0.5}, betas[] = {0.0, 0.25};
    int checked = 0;
    for (int t = 0; t < 4; t++)
        for (size_t mi = 0; mi < sizeof rows / sizeof *rows; mi++)
            for (size_t ki = 0; ki < sizeof depth / sizeof *depth; ki++)
                for (size_t ab = 0; ab < 4; ab++) {
                    bool ta = t & 1, tb = t & 2;
                    int M = rows[mi], K = depth[ki];
                    double alpha = alphas[ab & 1], beta = betas[ab >> 1];
                    for (size_t ni = 0; ni < sizeof cols32 / sizeof *cols32; ni++)
                        if (mpri_k_gemm_small_fits(MPR_F32, M, cols32[ni], K)) {
                            check_float(ta, tb, M, cols32[ni], K, (float)alpha, (float)beta);
                            checked++;
                        }
                    for (size_t ni = 0; ni < sizeof cols64 / sizeof *cols64; ni++)
                        if (mpri_k_gemm_small_fits(MPR_F64, M, cols64[ni], K)) {
                            check_double(ta, tb, M, cols64[ni], K, alpha, beta);
                            checked++;
                        }
                }
    assert_true(checked > 1000); /* the tables above, not an empty loop */
}

/* Any element strides, 0 included (a broadcast operand read in place): the
 * scalar sum's bits. */
static void test_strided_operands(void **state) {
    (void)state;
    enum { BUF = 4096 };
    static float A[BUF], B[BUF], C[32 * 40], want[32 * 40];
    for (int i = 0; i < BUF; i++) A[i] = (float)next_uniform(), B[i] = (float)next_uniform();
    static const int shapes[][3] = {{8, 8, 8}, {5, 7, 3}, {4, 16, 9}, {9, 32, 2}, {1, 1, 1}, {3, 24, 16}};
    int checked = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        /* (row stride, column stride) pairs: row-major, transposed, padded, broadcast rows,
         * broadcast columns, a single broadcast element */
        const int64_t as[][2] = {{K, 1}, {1, M}, {2 * K + 1, 2}, {0, 1}, {K, 0}, {0, 0}};
        const int64_t bs[][2] = {{N, 1}, {1, K}, {2 * N + 3, 2}, {0, 1}, {N, 0}, {0, 0}};
        for (size_t ai = 0; ai < 6; ai++)
            for (size_t bi = 0; bi < 6; bi++)
                for (int with_beta = 0; with_beta < 2; with_beta++) {
                    float beta = with_beta ? 0.5f : 0.0f;
                    int64_t ldc = N + 1;
                    for (int64_t i = 0; i < M * ldc; i++) C[i] = want[i] = with_beta ? (float)next_uniform() : NAN;
                    for (int i = 0; i < M; i++)
                        for (int j = 0; j < N; j++) {
                            float acc = 0;
                            for (int p = 0; p < K; p++) acc += A[i * as[ai][0] + p * as[ai][1]] * B[p * bs[bi][0] + j * bs[bi][1]];
                            float *w = &want[i * ldc + j];
                            *w = with_beta ? 2.0f * acc + beta * *w : 2.0f * acc;
                        }
                    assert_true(mpri_k_gemm_small_strided(MPR_F32, M, N, K, 2.0, A, as[ai][0], as[ai][1], B, bs[bi][0],
                                                          bs[bi][1], beta, C, ldc));
                    for (int i = 0; i < M; i++)
                        for (int j = 0; j < N; j++)
                            if (C[i * ldc + j] != want[i * ldc + j])
                                fail_msg("%dx%dx%d A strides (%lld, %lld) B strides (%lld, %lld) beta %g: C[%d][%d] = %.9g, "
                                         "the scalar sum %.9g", M, N, K, (long long)as[ai][0], (long long)as[ai][1],
                                         (long long)bs[bi][0], (long long)bs[bi][1], (double)beta, i, j,
                                         (double)C[i * ldc + j], (double)want[i * ldc + j]);
                    checked++;
                }
    }
    assert_int_equal(checked, 6 * 6 * 6 * 2);
}

static void test_gemm_dispatch(void **state) {
    (void)state;
    /* A tiny product through the library's kernel entry: the small kernel's
     * bits (in the baseline build, those of the library's clone against this
     * test's baseline copy). */
    float a[8 * 65], b[65 * 8], c1[64], c2[64];
    for (int i = 0; i < 8 * 65; i++) a[i] = (float)next_uniform(), b[i] = (float)next_uniform();
    mpri_k_gemm(MPR_F32, false, true, 8, 8, 8, 1.0, a, 8, b, 8, 0.0, c1, 8);
    assert_true(mpri_k_gemm_small(MPR_F32, false, true, 8, 8, 8, 1.0, a, 8, b, 8, 0.0, c2, 8));
    assert_memory_equal(c1, c2, sizeof c1);
    /* K = 65 goes to BLAS: compare with the sum in double. */
    mpri_k_gemm(MPR_F32, false, false, 8, 8, 65, 1.0, a, 65, b, 8, 0.0, c1, 8);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++) {
            double s = 0, scale = 1;
            for (int p = 0; p < 65; p++) s += (double)a[i * 65 + p] * b[p * 8 + j], scale += fabs(a[i * 65 + p] * b[p * 8 + j]);
            assert_true(fabs(c1[i * 8 + j] - s) <= 1e-5 * scale);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fits),
        cmocka_unit_test(test_matches_reference),
        cmocka_unit_test(test_strided_operands),
        cmocka_unit_test(test_gemm_dispatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
