/* nn_test_util.h — helpers for the nn/optim unit tests: seeded f64 inputs and
 * a central-difference gradient check of d/d(inputs) sum(w * f(inputs)) with a
 * random w (so every output element gets a distinct upstream gradient).
 * Include after <cmocka.h>. */
#ifndef NN_TEST_UTIL_H
#define NN_TEST_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpirpc/nn.h"

/* A new caller-owned f64 tensor of N(0,1) numbers from seed (optionally scaled
 * and shifted), a leaf requiring grad when `rg`. Call with no scope open. */
static inline mpr_tensor_t *tu_randn(int ndim, const int64_t *shape, uint64_t seed, bool rg) {
    mpr_generator_t *g = mpr_generator_create(seed);
    mpr_tensor_t *t = mpr_randn(MPR_F64, ndim, shape, g);
    mpr_generator_destroy(g);
    assert_non_null(t);
    if (rg) assert_int_equal(mpr_set_requires_grad(t, true), MPR_OK);
    return t;
}

/* A new caller-owned int64 tensor from values. */
static inline mpr_tensor_t *tu_i64(int ndim, const int64_t *shape, const int64_t *vals) {
    mpr_tensor_t *t = mpr_from_buffer(MPR_I64, ndim, shape, vals);
    assert_non_null(t);
    return t;
}

typedef mpr_tensor_t *(*tu_fn)(mpr_tensor_t **in, void *ctx);

/* sum(w * f(in)) with grad mode off (NAN if f fails). */
static inline double tu_eval(tu_fn f, void *ctx, mpr_tensor_t **in, const mpr_tensor_t *w) {
    bool prev = mpr_set_grad_enabled(false);
    mpr_scope_begin();
    double s = NAN;
    mpr_tensor_t *y = mpr_contiguous(f(in, ctx));
    if (y) {
        const double *yd = mpr_tensor_data(y), *wd = mpr_tensor_data(w);
        s = 0;
        for (int64_t i = 0; i < mpr_tensor_numel(y); i++) s += yd[i] * wd[i];
    }
    mpr_scope_end();
    mpr_set_grad_enabled(prev);
    return s;
}

/* Checks the analytic gradient of every f64 input that requires grad against
 * central differences (eps 1e-6): |num - ana| <= atol + rtol * |num|. */
static inline void tu_gradcheck(const char *what, tu_fn f, void *ctx, int n, mpr_tensor_t **in,
                                double atol, double rtol) {
    mpr_scope_begin();
    mpr_tensor_t *y = f(in, ctx);
    if (!y) fail_msg("%s: forward failed: %s", what, mpr_last_error());
    mpr_tensor_t *w = mpr_scope_keep(mpr_randn(MPR_F64, mpr_tensor_ndim(y), mpr_tensor_shape(y),
                                                NULL));
    for (int i = 0; i < n; i++)
        if (mpr_tensor_dtype(in[i]) == MPR_F64) mpr_zero_grad(in[i]);
    if (mpr_backward(y, w, false) != MPR_OK)
        fail_msg("%s: backward failed: %s", what, mpr_last_error());
    mpr_scope_end();
    const double eps = 1e-6;
    for (int i = 0; i < n; i++) {
        if (mpr_tensor_dtype(in[i]) != MPR_F64 || !mpr_requires_grad(in[i])) continue;
        mpr_tensor_t *g = mpr_tensor_grad(in[i]);
        if (!g) fail_msg("%s: input %d got no gradient", what, i);
        assert_true(mpr_tensor_is_contiguous(in[i]));
        double *d = mpr_tensor_data(in[i]);
        const double *gd = mpr_tensor_data(g);
        for (int64_t j = 0; j < mpr_tensor_numel(in[i]); j++) {
            double old = d[j];
            d[j] = old + eps;
            double lp = tu_eval(f, ctx, in, w);
            d[j] = old - eps;
            double lm = tu_eval(f, ctx, in, w);
            d[j] = old;
            double num = (lp - lm) / (2 * eps);
            if (!(fabs(num - gd[j]) <= atol + rtol * fabs(num)))
                fail_msg("%s: d/d input %d [%lld]: analytic %.10g, numeric %.10g", what, i,
                         (long long)j, gd[j], num);
        }
    }
    mpr_tensor_release(w);
}

/* Asserts that `t` is NULL and the last error has `code` and mentions `needle`. */
#define TU_EXPECT_ERR(t, code, needle)                                                        \
    do {                                                                                      \
        mpr_tensor_t *tu_t_ = (t);                                                            \
        if (tu_t_) fail_msg("expected an error, got a tensor");                               \
        assert_int_equal(mpr_last_error_code(), (code));                                      \
        if (!strstr(mpr_last_error(), (needle)))                                              \
            fail_msg("error '%s' does not mention '%s'", mpr_last_error(), (needle));         \
    } while (0)

#endif
