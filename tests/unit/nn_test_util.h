/* nn_test_util.h — helpers for the nn/optim unit tests: seeded f64 inputs,
 * int64 index tensors, error assertions, and the gradient check of
 * gradcheck.h wrapped as a cmocka assertion. Include after <cmocka.h>. */
#ifndef NN_TEST_UTIL_H
#define NN_TEST_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "mpirpc/nn.h"

/* A new caller-owned f64 tensor of N(0,1) numbers from `seed`, a leaf
 * requiring grad when `rg`. Call with no scope open. */
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

/* T1's finite-difference check (tests/unit/gradcheck.h) with explicit tolerances. */
#define TU_GRADCHECK(name, f, ctx, n, in, atol, rtol) \
    assert_true(gradcheck((name), (f), (ctx), (n), (in), &(gc_opts_t){1e-6, (atol), (rtol)}))

/* Asserts that `t` is NULL and the last error has `code` and mentions `needle`. */
#define TU_EXPECT_ERR(t, code, needle)                                                        \
    do {                                                                                      \
        mpr_tensor_t *tu_t_ = (t);                                                            \
        if (tu_t_) fail_msg("expected an error, got a tensor");                               \
        assert_int_equal(mpr_last_error_code(), (code));                                      \
        if (!strstr(mpr_last_error(), (needle)))                                              \
            fail_msg("error '%s' does not mention '%s'", mpr_last_error(), (needle));         \
    } while (0)

/* Run a cmocka group and fail it if the live-tensor count changed across
 * the whole group (a leak in any test): main() ends with
 * `return tu_run_group_no_leaks(tests, n)`. */
static inline int tu_run_group_no_leaks_(const struct CMUnitTest *tests, size_t n, const char *name) {
    int64_t live = mpr_tensor_live_count();
    int rc = _cmocka_run_group_tests(name, tests, n, NULL, NULL);
    if (mpr_tensor_live_count() != live) {
        fprintf(stderr, "leak: %lld live tensors\n", (long long)(mpr_tensor_live_count() - live));
        return 1;
    }
    return rc;
}
#define tu_run_group_no_leaks(tests) tu_run_group_no_leaks_(tests, sizeof(tests) / sizeof((tests)[0]), #tests)

#endif
