/* test_gradcheck_elementwise.c — finite-difference gradient checks (float64)
 * of the elementwise ops: broadcasting add/sub/mul/div, scalar ops, neg, exp,
 * log, sqrt, abs, pow, clamp, relu, tanh, sigmoid, gelu. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "gradcheck.h"

static mpr_tensor_t *f_add(mpr_tensor_t **in, void *c) { return mpr_add(in[0], in[1]); }
static mpr_tensor_t *f_sub(mpr_tensor_t **in, void *c) { return mpr_sub(in[0], in[1]); }
static mpr_tensor_t *f_mul(mpr_tensor_t **in, void *c) { return mpr_mul(in[0], in[1]); }
static mpr_tensor_t *f_div(mpr_tensor_t **in, void *c) { return mpr_div(in[0], mpr_add_scalar(mpr_abs(in[1]), 0.5)); }

static void check_binary(const char *name, gc_fn f, int na, const int64_t *sa, int nb, const int64_t *sb) {
    mpr_tensor_t *in[2] = {gc_input(na, sa, 1), gc_input(nb, sb, 2)};
    assert_true(gradcheck(name, f, NULL, 2, in, NULL));
    gc_release(2, in);
}

static void test_binary_same_shape(void **state) {
    check_binary("add", f_add, MPR_SHAPE(3, 4), MPR_SHAPE(3, 4));
    check_binary("sub", f_sub, MPR_SHAPE(3, 4), MPR_SHAPE(3, 4));
    check_binary("mul", f_mul, MPR_SHAPE(3, 4), MPR_SHAPE(3, 4));
    check_binary("div", f_div, MPR_SHAPE(3, 4), MPR_SHAPE(3, 4));
}

static void test_binary_broadcast(void **state) {
    check_binary("add bcast", f_add, MPR_SHAPE(2, 3, 4), MPR_SHAPE(4));
    check_binary("sub bcast", f_sub, MPR_SHAPE(3, 1), MPR_SHAPE(2, 1, 4));
    check_binary("mul bcast", f_mul, MPR_SHAPE(2, 1, 4), MPR_SHAPE(3, 1));
    check_binary("div bcast", f_div, MPR_SHAPE(1), MPR_SHAPE(2, 3));
    check_binary("mul scalar-tensor", f_mul, 0, NULL, MPR_SHAPE(2, 3));
}

typedef mpr_tensor_t *(*unary_fn)(mpr_tensor_t *);
static mpr_tensor_t *f_unary(mpr_tensor_t **in, void *c) { return ((unary_fn)c)(in[0]); }
/* Keep inputs away from kinks/poles: log/sqrt on 0.5 + |x|. */
static mpr_tensor_t *f_log(mpr_tensor_t **in, void *c) { return mpr_log(mpr_add_scalar(mpr_abs(in[0]), 0.5)); }
static mpr_tensor_t *f_sqrt(mpr_tensor_t **in, void *c) { return mpr_sqrt(mpr_add_scalar(mpr_abs(in[0]), 0.5)); }
static mpr_tensor_t *f_pow3(mpr_tensor_t **in, void *c) { return mpr_pow(in[0], 3.0); }
static mpr_tensor_t *f_pow2(mpr_tensor_t **in, void *c) { return mpr_pow(in[0], 2.0); }
static mpr_tensor_t *f_powf(mpr_tensor_t **in, void *c) { return mpr_pow(mpr_add_scalar(mpr_abs(in[0]), 0.5), -1.5); }
static mpr_tensor_t *f_clamp(mpr_tensor_t **in, void *c) { return mpr_clamp(in[0], -0.5, 0.4); }
static mpr_tensor_t *f_scalars(mpr_tensor_t **in, void *c) {
    return mpr_rsub_scalar(mpr_mul_scalar(mpr_add_scalar(in[0], 0.3), -2.5), 1.25);
}

static void check_unary(const char *name, gc_fn f, void *ctx) {
    mpr_tensor_t *in[1] = {gc_input(MPR_SHAPE(4, 5), 7)};
    assert_true(gradcheck(name, f, ctx, 1, in, NULL));
    gc_release(1, in);
}

static void test_unary(void **state) {
    check_unary("neg", f_unary, (void *)mpr_neg);
    check_unary("exp", f_unary, (void *)mpr_exp);
    check_unary("abs", f_unary, (void *)mpr_abs);
    check_unary("relu", f_unary, (void *)mpr_relu);
    check_unary("tanh", f_unary, (void *)mpr_tanh);
    check_unary("sigmoid", f_unary, (void *)mpr_sigmoid);
    check_unary("gelu", f_unary, (void *)mpr_gelu);
    check_unary("log", f_log, NULL);
    check_unary("sqrt", f_sqrt, NULL);
    check_unary("pow3", f_pow3, NULL);
    check_unary("pow2", f_pow2, NULL);
    check_unary("pow-1.5", f_powf, NULL);
    check_unary("clamp", f_clamp, NULL);
    check_unary("scalar ops", f_scalars, NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_binary_same_shape),
        cmocka_unit_test(test_binary_broadcast),
        cmocka_unit_test(test_unary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
