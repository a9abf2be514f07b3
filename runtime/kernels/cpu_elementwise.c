/* cpu_elementwise.c — CPU elementwise kernels: unary forward/backward pairs
 * over contiguous buffers and broadcasting binary ops over strided operands,
 * plus the N-d iterator they share.
 *
 * Invariants: no allocation; inner loops are specialized by op and dtype via
 * macros (the switch runs once per call or per row, never per element);
 * binary kernels take the fast contiguous path when every inner stride is 1
 * and a scalar-broadcast path when one operand's inner stride is 0; the
 * unary loops (but tanh's) and the binary rows come in an AVX2 clone and a
 * baseline one (cpu_clones.h: the same bits either way). */

/* Vectorize the inner loops at the default -O2 (whose "very cheap" cost model
 * skips loops with an unknown trip count). */
#pragma GCC optimize("O3")

#include <math.h>
#include <string.h>

#include "cpu_clones.h"
#include "cpu_simd_math.h"
#include "mpri_kernels.h"

void mpri_iter_init(mpri_iter_t *it, int ndim, const int64_t *shape, int nops,
                    const int64_t *const *strides) {
    it->nops = nops;
    int n = 0;
    /* Drop size-1 dims, then merge dim pairs that are contiguous for every operand. */
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1) continue;
        it->shape[n] = shape[d];
        for (int k = 0; k < nops; k++) it->st[k][n] = strides[k][d];
        n++;
    }
    if (n == 0) {
        it->ndim = 1;
        it->shape[0] = 1;
        for (int k = 0; k < nops; k++) it->st[k][0] = 0;
        return;
    }
    int m = 0;
    for (int d = 1; d < n; d++) {
        bool merge = true;
        for (int k = 0; k < nops; k++)
            if (it->st[k][m] != it->st[k][d] * it->shape[d]) merge = false;
        if (merge) {
            it->shape[m] *= it->shape[d];
            for (int k = 0; k < nops; k++) it->st[k][m] = it->st[k][d];
        } else {
            m++;
            it->shape[m] = it->shape[d];
            for (int k = 0; k < nops; k++) it->st[k][m] = it->st[k][d];
        }
    }
    it->ndim = m + 1;
}

/* ---------------------------------------------------------------- unary */

static const double kSqrt1_2 = 0.70710678118654752440;
static const double kInvSqrt2Pi = 0.39894228040143267794;

/* ivdep: out may be x itself (in-place), never a shifted alias, so the
 * loops carry no dependence and vectorize without runtime alias checks. */
#define MPRI_IVDEP _Pragma("GCC ivdep")

#define UNARY_LOOP(T, EXPR)                                                    \
    MPRI_IVDEP for (int64_t i = 0; i < n; i++) {                                          \
        T v = x[i];                                                            \
        o[i] = (T)(EXPR);                                                      \
    }

#define UNARY_BODY(T, EXPF, LOGF, SQRTF, FABSF, TANHF, ERFF, POWF)             \
    {                                                                          \
        T *o = out;                                                            \
        const T *x = xin;                                                      \
        T q0 = (T)p0, q1 = (T)p1;                                              \
        (void)q1;                                                              \
        switch (op) {                                                          \
        case MPRI_UN_NEG: UNARY_LOOP(T, -v) break;                             \
        case MPRI_UN_EXP: UNARY_LOOP(T, EXPF(v)) break;                        \
        case MPRI_UN_LOG: UNARY_LOOP(T, LOGF(v)) break;                        \
        case MPRI_UN_SQRT: UNARY_LOOP(T, SQRTF(v)) break;                      \
        case MPRI_UN_ABS: UNARY_LOOP(T, FABSF(v)) break;                       \
        case MPRI_UN_RELU: UNARY_LOOP(T, v > 0 ? v : (v != v ? v : 0)) break;  \
        case MPRI_UN_SIGMOID: UNARY_LOOP(T, 1 / (1 + EXPF(-v))) break;         \
        case MPRI_UN_GELU:                                                     \
            UNARY_LOOP(T, v * (T)0.5 * (1 + ERFF(v * (T)kSqrt1_2))) break;     \
        case MPRI_UN_POW:                                                      \
            if (p0 == 2.0) { UNARY_LOOP(T, v * v) }                            \
            else { UNARY_LOOP(T, POWF(v, q0)) }                                \
            break;                                                             \
        case MPRI_UN_CLAMP:                                                    \
            UNARY_LOOP(T, v < q0 ? q0 : (v > q1 ? q1 : v)) break;              \
        case MPRI_UN_ADD_S: UNARY_LOOP(T, v + q0) break;                       \
        case MPRI_UN_MUL_S: UNARY_LOOP(T, v * q0) break;                       \
        case MPRI_UN_RSUB_S: UNARY_LOOP(T, q0 - v) break;                      \
        default: break;                                                        \
        }                                                                      \
    }

/* tanh stays out of the AVX2 clone: its f32 loop calls libmvec's vector
 * tanhf (cpu_simd_math.h), and libmvec's AVX2 variant need not round as
 * the SSE one every build uses does (glibc promises a few ulp, not equal
 * bits; on this project's machine they agreed on the clone test's inputs). */
static void unary_tanh(mpr_dtype_t dt, int64_t n, void *out, const void *xin) {
    if (dt == MPR_F32) {
        float *o = out;
        const float *x = xin;
        UNARY_LOOP(float, tanhf(v))
    } else {
        double *o = out;
        const double *x = xin;
        UNARY_LOOP(double, tanh(v))
    }
}

MPRI_CPU_CLONES static void unary_cloned(mpri_unop_t op, mpr_dtype_t dt, int64_t n, void *out, const void *xin,
                                         double p0, double p1) {
    if (dt == MPR_F32)
        UNARY_BODY(float, expf, logf, sqrtf, fabsf, tanhf, erff, powf)
    else
        UNARY_BODY(double, exp, log, sqrt, fabs, tanh, erf, pow)
}

void mpri_k_unary(mpri_unop_t op, mpr_dtype_t dt, int64_t n, void *out, const void *xin, double p0, double p1) {
    if (op == MPRI_UN_TANH)
        unary_tanh(dt, n, out, xin);
    else
        unary_cloned(op, dt, n, out, xin, p0, p1);
}

#define UNARY_BW_LOOP(T, EXPR)                                                 \
    MPRI_IVDEP for (int64_t i = 0; i < n; i++) {                                          \
        T g = go[i];                                                           \
        gi[i] = (T)(EXPR);                                                     \
    }

#define UNARY_BW_BODY(T, EXPF, ERFF, POWF)                                     \
    {                                                                          \
        T *gi = gin;                                                           \
        const T *go = gout, *x = xin, *y = yin;                                \
        T q0 = (T)p0, q1 = (T)p1;                                              \
        switch (op) {                                                          \
        case MPRI_UN_NEG: UNARY_BW_LOOP(T, -g) break;                          \
        case MPRI_UN_EXP: UNARY_BW_LOOP(T, g * y[i]) break;                    \
        case MPRI_UN_LOG: UNARY_BW_LOOP(T, g / x[i]) break;                    \
        case MPRI_UN_SQRT: UNARY_BW_LOOP(T, g / (2 * y[i])) break;             \
        case MPRI_UN_ABS:                                                      \
            UNARY_BW_LOOP(T, x[i] > 0 ? g : (x[i] < 0 ? -g : 0)) break;        \
        case MPRI_UN_RELU: UNARY_BW_LOOP(T, y[i] > 0 ? g : 0) break;           \
        case MPRI_UN_TANH: UNARY_BW_LOOP(T, g * (1 - y[i] * y[i])) break;      \
        case MPRI_UN_SIGMOID: UNARY_BW_LOOP(T, g * y[i] * (1 - y[i])) break;   \
        case MPRI_UN_GELU:                                                     \
            UNARY_BW_LOOP(T, g * ((T)0.5 * (1 + ERFF(x[i] * (T)kSqrt1_2)) +    \
                                  x[i] * (T)kInvSqrt2Pi * EXPF(-(T)0.5 * x[i] * x[i]))) \
            break;                                                             \
        case MPRI_UN_POW:                                                      \
            if (p0 == 0.0) { UNARY_BW_LOOP(T, 0 * g) }                         \
            else if (p0 == 2.0) { UNARY_BW_LOOP(T, g * 2 * x[i]) }             \
            else { UNARY_BW_LOOP(T, g * q0 * POWF(x[i], q0 - 1)) }             \
            break;                                                             \
        case MPRI_UN_CLAMP:                                                    \
            UNARY_BW_LOOP(T, (x[i] >= q0 && x[i] <= q1) ? g : 0) break;        \
        case MPRI_UN_ADD_S: UNARY_BW_LOOP(T, g) break;                         \
        case MPRI_UN_MUL_S: UNARY_BW_LOOP(T, g * q0) break;                    \
        case MPRI_UN_RSUB_S: UNARY_BW_LOOP(T, -g) break;                       \
        default: break;                                                        \
        }                                                                      \
    }

MPRI_CPU_CLONES void mpri_k_unary_backward(mpri_unop_t op, mpr_dtype_t dt, int64_t n, void *gin,
                                           const void *gout, const void *xin, const void *yin, double p0,
                                           double p1) {
    if (dt == MPR_F32)
        UNARY_BW_BODY(float, expf, erff, powf)
    else
        UNARY_BW_BODY(double, exp, erf, pow)
}

/* --------------------------------------------------------------- binary */

#define BIN_ROW(T, NAME, EXPR)                                                 \
    MPRI_CPU_CLONES static void NAME(T *o, int64_t so, const T *a, int64_t sa, const T *b, int64_t sb, int64_t n, \
                     T alpha) {                                                \
        (void)alpha;                                                           \
        if (so == 1 && sa == 1 && sb == 1) {                                   \
            MPRI_IVDEP for (int64_t i = 0; i < n; i++) { T x = a[i], y = b[i]; o[i] = EXPR; } \
        } else if (so == 1 && sa == 1 && sb == 0) {                            \
            T y = b[0];                                                        \
            MPRI_IVDEP for (int64_t i = 0; i < n; i++) { T x = a[i]; o[i] = EXPR; } \
        } else if (so == 1 && sa == 0 && sb == 1) {                            \
            T x = a[0];                                                        \
            MPRI_IVDEP for (int64_t i = 0; i < n; i++) { T y = b[i]; o[i] = EXPR; } \
        } else {                                                               \
            for (int64_t i = 0; i < n; i++) {                                  \
                T x = a[i * sa], y = b[i * sb];                                \
                o[i * so] = EXPR;                                              \
            }                                                                  \
        }                                                                      \
    }

BIN_ROW(float, add_f32, x + alpha * y)
BIN_ROW(float, sub_f32, x - alpha * y)
BIN_ROW(float, mul_f32, x * y)
BIN_ROW(float, div_f32, x / y)
BIN_ROW(double, add_f64, x + alpha * y)
BIN_ROW(double, sub_f64, x - alpha * y)
BIN_ROW(double, mul_f64, x * y)
BIN_ROW(double, div_f64, x / y)

#define BIN_DRIVE(T, FN)                                                       \
    {                                                                          \
        T *O = o;                                                              \
        const T *A = a, *B = b;                                                \
        T al = (T)alpha;                                                       \
        for (int64_t r = 0; r < rows; r++) {                                   \
            FN(O + off[0], it.st[0][last], A + off[1], it.st[1][last], B + off[2], \
               it.st[2][last], inner, al);                                     \
            mpri_iter_next(&it, idx, off);                                     \
        }                                                                      \
    }

void mpri_k_binary(mpri_binop_t op, mpr_dtype_t dt, int ndim, const int64_t *shape, void *o,
                   const int64_t *so, const void *a, const int64_t *sa, const void *b,
                   const int64_t *sb, double alpha) {
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) numel *= shape[d];
    if (numel == 0) return;
    if (mpri_flat_layout(ndim, shape, so) && mpri_flat_layout(ndim, shape, sa) && mpri_flat_layout(ndim, shape, sb)) {
        if (dt == MPR_F32) {
            float al = (float)alpha;
            switch (op) {
            case MPRI_BIN_ADD: add_f32(o, 1, a, 1, b, 1, numel, al); break;
            case MPRI_BIN_SUB: sub_f32(o, 1, a, 1, b, 1, numel, al); break;
            case MPRI_BIN_MUL: mul_f32(o, 1, a, 1, b, 1, numel, al); break;
            case MPRI_BIN_DIV: div_f32(o, 1, a, 1, b, 1, numel, al); break;
            }
        } else {
            switch (op) {
            case MPRI_BIN_ADD: add_f64(o, 1, a, 1, b, 1, numel, alpha); break;
            case MPRI_BIN_SUB: sub_f64(o, 1, a, 1, b, 1, numel, alpha); break;
            case MPRI_BIN_MUL: mul_f64(o, 1, a, 1, b, 1, numel, alpha); break;
            case MPRI_BIN_DIV: div_f64(o, 1, a, 1, b, 1, numel, alpha); break;
            }
        }
        return;
    }
    const int64_t *strides[3] = {so, sa, sb};
    mpri_iter_t it;
    mpri_iter_init(&it, ndim, shape, 3, strides);
    int last = it.ndim - 1;
    int64_t inner = it.shape[last], rows = numel / inner;
    int64_t idx[MPR_MAX_DIMS] = {0}, off[3] = {0, 0, 0};
    if (dt == MPR_F32) {
        switch (op) {
        case MPRI_BIN_ADD: BIN_DRIVE(float, add_f32) break;
        case MPRI_BIN_SUB: BIN_DRIVE(float, sub_f32) break;
        case MPRI_BIN_MUL: BIN_DRIVE(float, mul_f32) break;
        case MPRI_BIN_DIV: BIN_DRIVE(float, div_f32) break;
        }
    } else {
        switch (op) {
        case MPRI_BIN_ADD: BIN_DRIVE(double, add_f64) break;
        case MPRI_BIN_SUB: BIN_DRIVE(double, sub_f64) break;
        case MPRI_BIN_MUL: BIN_DRIVE(double, mul_f64) break;
        case MPRI_BIN_DIV: BIN_DRIVE(double, div_f64) break;
        }
    }
}
