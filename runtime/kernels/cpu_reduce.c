/* cpu_reduce.c — CPU reductions: strided sum-into (sum over any dims, also
 * used to undo broadcasts in backward) and max along one dim with its
 * backward scatter.
 *
 * Invariants: no allocation; the caller zeroes / prepares outputs; rows
 * reduced along their innermost dim accumulate in double so f32 sums of long
 * rows keep precision (a contiguous row in 8 interleaved partial sums, in a
 * fixed order: deterministic); max picks the first maximum (NaN propagates).
 * The sum-into has an AVX2 clone beside the baseline one (cpu_clones.h): the
 * same partial sums in the same order, 4 doubles a register instead of 2,
 * so the same bits (test_rt_reduce_clones), but for the sign of a NaN sum,
 * which follows the add instruction's operand order. */

/* Vectorize the inner loops at the default -O2 (whose "very cheap" cost model
 * skips loops with an unknown trip count). */
#pragma GCC optimize("O3")

#include <math.h>

#include "cpu_clones.h"
#include "mpri_kernels.h"

/* A contiguous row's sum in double, in 8 interleaved partial sums: one
 * running sum is a chain of dependent adds (~4 cycles each, not
 * vectorizable without reordering), which made the bias gradient of a
 * convolution (rows of H*W) a visible part of a CNN's backward. The order
 * is fixed, so results are deterministic. */
#define DEFINE_SUM_ROW(T)                                                      \
    MPRI_CPU_CLONES static double sum_row_##T(const T *p, int64_t n) {         \
        double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};                             \
        int64_t i = 0;                                                         \
        for (; i + 8 <= n; i += 8)                                             \
            for (int k = 0; k < 8; k++) part[k] += p[i + k];                   \
        for (; i < n; i++) part[0] += p[i];                                    \
        return ((part[0] + part[1]) + (part[2] + part[3])) +                   \
               ((part[4] + part[5]) + (part[6] + part[7]));                    \
    }
DEFINE_SUM_ROW(float)
DEFINE_SUM_ROW(double)

#define SUM_BODY(T)                                                            \
    {                                                                          \
        T *O = out;                                                            \
        const T *I = in;                                                       \
        for (int64_t r = 0; r < rows; r++) {                                   \
            T *op = O + off[0];                                                \
            const T *ip = I + off[1];                                          \
            if (s0 == 0) {                                                     \
                double acc = 0;                                                \
                if (s1 == 1)                                                   \
                    acc = sum_row_##T(ip, inner);                              \
                else                                                           \
                    for (int64_t i = 0; i < inner; i++) acc += ip[i * s1];     \
                *op += (T)acc;                                                 \
            } else if (s0 == 1 && s1 == 1) {                                   \
                _Pragma("GCC ivdep") for (int64_t i = 0; i < inner; i++) op[i] += ip[i]; \
            } else {                                                           \
                for (int64_t i = 0; i < inner; i++) op[i * s0] += ip[i * s1];  \
            }                                                                  \
            mpri_iter_next(&it, idx, off);                                     \
        }                                                                      \
    }

MPRI_CPU_CLONES void mpri_k_sum_into(mpr_dtype_t dt, int ndim, const int64_t *shape, void *out, const int64_t *so,
                     const void *in, const int64_t *si) {
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) numel *= shape[d];
    if (numel == 0) return;
    if (mpri_flat_layout(ndim, shape, si) && mpri_single_layout(ndim, shape, so)) {
        /* everything into one element: what the iterator does with one merged row */
        if (dt == MPR_F32)
            *(float *)out += (float)sum_row_float(in, numel);
        else
            *(double *)out += sum_row_double(in, numel);
        return;
    }
    const int64_t *strides[2] = {so, si};
    mpri_iter_t it;
    mpri_iter_init(&it, ndim, shape, 2, strides);
    int last = it.ndim - 1;
    int64_t inner = it.shape[last], rows = numel / inner;
    int64_t s0 = it.st[0][last], s1 = it.st[1][last];
    int64_t idx[MPR_MAX_DIMS] = {0}, off[2] = {0, 0};
    if (dt == MPR_F32)
        SUM_BODY(float)
    else
        SUM_BODY(double)
}

#define MAX_BODY(T)                                                            \
    {                                                                          \
        const T *I = in;                                                       \
        T *V = vals;                                                           \
        for (int64_t o = 0; o < outer; o++) {                                  \
            for (int64_t j = 0; j < inner; j++) {                              \
                const T *p = I + o * n * inner + j;                            \
                T best = p[0];                                                 \
                int64_t bi = 0;                                                \
                for (int64_t k = 1; k < n && !isnan(best); k++) {              \
                    T v = p[k * inner];                                        \
                    if (v > best || isnan(v)) { best = v; bi = k; }            \
                }                                                              \
                V[o * inner + j] = best;                                       \
                if (idx) idx[o * inner + j] = bi;                              \
            }                                                                  \
        }                                                                      \
    }

void mpri_k_max_dim(mpr_dtype_t dt, int64_t outer, int64_t n, int64_t inner, const void *in,
                    void *vals, int64_t *idx) {
    if (dt == MPR_F32)
        MAX_BODY(float)
    else
        MAX_BODY(double)
}

void mpri_k_max_dim_backward(mpr_dtype_t dt, int64_t outer, int64_t n, int64_t inner,
                             const void *gout, const int64_t *idx, void *gin) {
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++) {
            int64_t k = idx[o * inner + j];
            if (dt == MPR_F32)
                ((float *)gin)[(o * n + k) * inner + j] += ((const float *)gout)[o * inner + j];
            else
                ((double *)gin)[(o * n + k) * inner + j] += ((const double *)gout)[o * inner + j];
        }
}
