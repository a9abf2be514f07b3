/* cpu_small_gemm.c — row-major GEMM for tiny products, without OpenBLAS.
 *
 * OpenBLAS spends most of a tiny product (8x8x8: ~150 ns with its generic
 * "Prescott" kernels, which Debian 12's 0.3.21 runs on CPUs newer than it)
 * on its interface: argument checks, a buffer from its memory pool, packing
 * both operands. The model layers of small RPC examples (the 8x8 dist
 * autograd step, RNN cells and policy nets of the tutorial apps) are that
 * small. This kernel keeps 4 rows x up to 4 vectors of C in registers (8
 * rows when a row of C is one vector) (GCC vector extensions, 32-byte
 * vectors), streams A by scalars and reads
 * B in place when its rows are unit-strided whole vectors, else from a
 * zero-padded copy (a single row when B is broadcast along the inner
 * dimension). Operands take any element strides, 0 included, so a
 * broadcast gradient (from sum or mean) needs no contiguous copy; when A's
 * rows are all the same (row stride 0) and C is not read, one row of C is
 * computed and copied to the others.
 *
 * Invariants: mpri_k_gemm_small() and mpri_k_gemm_small_strided() take a
 * product only when mpri_k_gemm_small_fits() (N <= 32 f32 or 16 f64
 * columns, K <= 64, M*N*K <= 4096) and return false otherwise, touching
 * nothing. Each element of C is
 * alpha * (sum over p in increasing order of op(A)[i][p] * op(B)[p][j])
 * (+ beta * C[i][j] when beta != 0; C is not read when beta == 0, as BLAS),
 * with separate multiplies and adds (no -ffast-math, no fused multiply-add):
 * the same bits on every x86-64 CPU, whichever clone (AVX2 or baseline SSE2)
 * the loader picked. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "mpri_kernels.h"

#define MAX_VECTORS 4 /* per row of C: 32 f32 or 16 f64 columns */
#define SMALL_MAX_K 64
#define SMALL_MAX_MNK 4096
#define ROW_BLOCK 4      /* rows of C kept in registers at once ... */
#define WIDE_ROW_BLOCK 8 /* ... when a row is one vector (8 accumulators, 16 registers in all) */

/* One clone with 256-bit registers, one for any x86-64; both round alike
 * (test_rt_small_gemm_baseline builds the file without the AVX2 clone and
 * compares the two). */
#include "cpu_clones.h"
#define SMALL_GEMM_CLONES MPRI_CPU_CLONES

bool mpri_k_gemm_small_fits(mpr_dtype_t dt, int64_t M, int64_t N, int64_t K) {
    int64_t max_cols = MAX_VECTORS * 32 / (dt == MPR_F32 ? 4 : 8);
    return M > 0 && N > 0 && K > 0 && N <= max_cols && K <= SMALL_MAX_K && M * N * K <= SMALL_MAX_MNK;
}

/* SMALL_GEMM(T, VT, LANES): defines small_gemm_<T>. VT is a 32-byte vector
 * of LANES elements of T; nb = ceil(N / LANES) vectors cover a row of C.
 * A's element (i, p) is A[i * a_rs + p * a_cs]; B's (p, j) B[p * b_rs + j * b_cs]
 * (any strides, 0 included: a broadcast operand is read in place). */
#define SMALL_GEMM(T, VT, LANES)                                                                        \
    typedef T VT __attribute__((vector_size(32)));                                                     \
    /* rows rows of C from i0, with nb vectors a row and A's columns unit-strided or not (constants). */ \
    static inline __attribute__((always_inline)) void rows_##T(                                       \
        int rows, int nb, bool a_unit, int64_t i0, int64_t N, int64_t K, T alpha, const T *A,           \
        int64_t a_rs, int64_t a_cs, const T *bbase, int64_t bstride, T beta, T *C, int64_t ldc) {       \
        VT acc[WIDE_ROW_BLOCK][MAX_VECTORS];                                                           \
        const T *arow[WIDE_ROW_BLOCK];                                                                 \
        _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++) {                                        \
            arow[r] = A + (i0 + r) * a_rs;                                                             \
            _Pragma("GCC unroll 4") for (int q = 0; q < nb; q++) acc[r][q] = (VT){0};                  \
        }                                                                                              \
        for (int64_t p = 0; p < K; p++) {                                                              \
            VT b[MAX_VECTORS];                                                                         \
            _Pragma("GCC unroll 4") for (int q = 0; q < nb; q++)                                        \
                memcpy(&b[q], bbase + p * bstride + q * LANES, sizeof(VT));                            \
            _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++) {                                    \
                T a = arow[r][a_unit ? p : p * a_cs];                                                  \
                _Pragma("GCC unroll 4") for (int q = 0; q < nb; q++) acc[r][q] += a * b[q];            \
            }                                                                                          \
        }                                                                                              \
        _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++) {                                        \
            T *c = C + (i0 + r) * ldc;                                                                  \
            _Pragma("GCC unroll 4") for (int q = 0; q < nb; q++) {                                      \
                VT v = alpha * acc[r][q];                                                              \
                int64_t j0 = q * LANES, n = N - j0 < LANES ? N - j0 : LANES;                           \
                if (n == LANES) {                                                                      \
                    if (beta != 0) {                                                                   \
                        VT old;                                                                        \
                        memcpy(&old, c + j0, sizeof(VT));                                              \
                        v += beta * old;                                                               \
                    }                                                                                  \
                    memcpy(c + j0, &v, sizeof(VT));                                                    \
                } else { /* the last, partial vector of the row */                                     \
                    T part[LANES];                                                                     \
                    memcpy(part, &v, sizeof(VT));                                                      \
                    for (int64_t j = 0; j < n; j++) c[j0 + j] = beta == 0 ? part[j] : part[j] + beta * c[j0 + j]; \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
    }                                                                                                  \
    SMALL_GEMM_CLONES static void small_gemm_##T(int64_t M, int64_t N, int64_t K, T alpha, const T *A,  \
                                                 int64_t a_rs, int64_t a_cs, const T *B, int64_t b_rs,  \
                                                 int64_t b_cs, T beta, T *C, int64_t ldc) {             \
        int nb = (int)((N + LANES - 1) / LANES);                                                       \
        VT pack[SMALL_MAX_K * MAX_VECTORS]; /* op(B) as rows of nb vectors, zero-padded */             \
        const T *bbase = B;                                                                            \
        int64_t bstride = b_rs; /* elements from one row of op(B) to the next as read */               \
        if (b_cs != 1 || N % LANES) {                                                                  \
            int64_t rows = b_rs == 0 ? 1 : K; /* a broadcast along p: one row serves all */            \
            for (int64_t p = 0; p < rows; p++) {                                                       \
                T *row = (T *)(pack + p * nb);                                                         \
                const T *src = B + p * b_rs;                                                           \
                if (b_cs == 1)                                                                         \
                    memcpy(row, src, sizeof(T) * (size_t)N);                                           \
                else                                                                                   \
                    for (int64_t j = 0; j < N; j++) row[j] = src[j * b_cs];                            \
                for (int64_t j = N; j < nb * LANES; j++) row[j] = 0;                                   \
            }                                                                                          \
            bbase = (const T *)pack;                                                                   \
            bstride = b_rs == 0 ? 0 : nb * LANES;                                                      \
        }                                                                                              \
        /* Every row of A the same (a broadcast along M, e.g. the gradient of a sum) and C not read:  \
         * every row of C is the same too. One is computed, the others are copies (same bits). */   \
        int64_t rows_computed = a_rs == 0 && beta == 0 ? 1 : M;                                         \
        if (a_cs == 1)                                                                                 \
            DISPATCH(T, true, rows_computed);                                                          \
        else                                                                                           \
            DISPATCH(T, false, rows_computed);                                                         \
        for (int64_t i = rows_computed; i < M; i++) memcpy(C + i * ldc, C, sizeof(T) * (size_t)N);     \
    }

/* The first `m` rows of C, for nb = ceil(N / LANES) vectors a row, a constant in each case. */
#define DISPATCH(T, a_unit, m)                                                                         \
    do {                                                                                               \
        switch (nb) {                                                                                  \
        case 1: ROWS(T, 1, a_unit, m, WIDE_ROW_BLOCK); break;                                          \
        case 2: ROWS(T, 2, a_unit, m, ROW_BLOCK); break;                                               \
        case 3: ROWS(T, 3, a_unit, m, ROW_BLOCK); break;                                               \
        default: ROWS(T, 4, a_unit, m, ROW_BLOCK); break;                                              \
        }                                                                                              \
    } while (0)

/* Rows [0, m) of C with nb vectors a row (a constant): blocks of `block` rows, then single rows. */
#define ROWS(T, nb, a_unit, m, block)                                                                  \
    do {                                                                                               \
        int64_t i = 0;                                                                                 \
        for (; i + (block) <= (m); i += (block))                                                       \
            rows_##T((block), nb, a_unit, i, N, K, alpha, A, a_rs, a_cs, bbase, bstride, beta, C, ldc); \
        for (; i < (m); i++) rows_##T(1, nb, a_unit, i, N, K, alpha, A, a_rs, a_cs, bbase, bstride, beta, C, ldc); \
    } while (0)

SMALL_GEMM(float, v8f, 8)
SMALL_GEMM(double, v4d, 4)

bool mpri_k_gemm_small_strided(mpr_dtype_t dt, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
                               int64_t a_rs, int64_t a_cs, const void *B, int64_t b_rs, int64_t b_cs, double beta,
                               void *C, int64_t ldc) {
    if (!mpri_k_gemm_small_fits(dt, M, N, K)) return false;
    if (dt == MPR_F32)
        small_gemm_float(M, N, K, (float)alpha, A, a_rs, a_cs, B, b_rs, b_cs, (float)beta, C, ldc);
    else
        small_gemm_double(M, N, K, alpha, A, a_rs, a_cs, B, b_rs, b_cs, beta, C, ldc);
    return true;
}

bool mpri_k_gemm_small(mpr_dtype_t dt, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                       double alpha, const void *A, int64_t lda, const void *B, int64_t ldb, double beta,
                       void *C, int64_t ldc) {
    return mpri_k_gemm_small_strided(dt, M, N, K, alpha, A, trans_a ? 1 : lda, trans_a ? lda : 1, B,
                                     trans_b ? 1 : ldb, trans_b ? ldb : 1, beta, C, ldc);
}
