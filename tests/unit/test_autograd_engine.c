/* test_autograd_engine.c — engine semantics: shared subexpressions
 * accumulate, gradient accumulation across backward calls, retain_graph,
 * backward twice without it, non-scalar root without grad, in-place
 * modification of a saved tensor (version counter), no-grad mode, detach,
 * requires_grad rules, in-place on a leaf that requires grad, a leaf dying
 * before its graph, and a deep chain (iterative release). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>
#include <math.h>

#include "mpirpc/tensor_ops.h"

#define assert_near(a, b, eps) assert_true(fabs((double)(a) - (double)(b)) <= (eps))

static double item(mpr_tensor_t *t) {
    double v = 0;
    assert_int_equal(mpr_item(t, &v), MPR_OK);
    return v;
}

static double at(mpr_tensor_t *t, int64_t i) {
    double v[64];
    assert_int_equal(mpr_copy_to_buffer(t, MPR_F64, v, sizeof v), MPR_OK);
    return v[i];
}

static mpr_tensor_t *leaf(double v0, double v1, double v2) {
    double d[3] = {v0, v1, v2};
    mpr_tensor_t *t = mpr_from_buffer(MPR_F64, MPR_SHAPE(3), d);
    assert_int_equal(mpr_set_requires_grad(t, true), MPR_OK);
    return t;
}

static void test_shared_subexpression(void **state) {
    mpr_tensor_t *x = leaf(1, 2, 3);
    mpr_scope_begin();
    /* y = x*x; z = y + y*x ; dz/dx = 2x + 3x^2 */
    mpr_tensor_t *y = mpr_mul(x, x);
    mpr_tensor_t *z = mpr_sum(mpr_add(y, mpr_mul(y, x)));
    assert_int_equal(mpr_backward(z, NULL, false), MPR_OK);
    mpr_scope_end();
    mpr_tensor_t *g = mpr_tensor_grad(x);
    assert_non_null(g);
    for (int i = 0; i < 3; i++) {
        double xi = i + 1;
        assert_near(at(g, i), 2 * xi + 3 * xi * xi, 1e-12);
    }
    mpr_tensor_release(x);
}

static void test_accumulate_and_zero_grad(void **state) {
    mpr_tensor_t *x = leaf(1, 2, 3);
    for (int k = 0; k < 2; k++) {
        mpr_scope_begin();
        assert_int_equal(mpr_backward(mpr_sum(mpr_mul_scalar(x, 2.0)), NULL, false), MPR_OK);
        mpr_scope_end();
    }
    assert_near(at(mpr_tensor_grad(x), 1), 4.0, 0);
    mpr_zero_grad(x);
    assert_null(mpr_tensor_grad(x));
    mpr_tensor_release(x);
}

static void test_retain_graph_and_twice(void **state) {
    mpr_tensor_t *x = leaf(1, 2, 3);
    mpr_scope_begin();
    mpr_tensor_t *z = mpr_sum(mpr_exp(x));
    assert_int_equal(mpr_backward(z, NULL, true), MPR_OK);
    assert_int_equal(mpr_backward(z, NULL, false), MPR_OK); /* graph kept by the first */
    assert_near(at(mpr_tensor_grad(x), 0), 2 * exp(1.0), 1e-12);
    assert_int_equal(mpr_backward(z, NULL, false), MPR_ERR_STATE);
    assert_non_null(strstr(mpr_last_error(), "second time"));
    assert_non_null(strstr(mpr_last_error(), "exp"));
    mpr_scope_end();
    mpr_tensor_release(x);
}

static void test_nonscalar_root(void **state) {
    mpr_tensor_t *x = leaf(1, 2, 3);
    mpr_scope_begin();
    mpr_tensor_t *y = mpr_mul_scalar(x, 3.0);
    assert_int_equal(mpr_backward(y, NULL, false), MPR_ERR_SHAPE);
    assert_non_null(strstr(mpr_last_error(), "scalar"));
    mpr_tensor_t *g = mpr_ones(MPR_F64, MPR_SHAPE(2));
    assert_int_equal(mpr_backward(y, g, true), MPR_ERR_SHAPE); /* wrong shape */
    g = mpr_full(MPR_F64, MPR_SHAPE(3), 0.5);
    assert_int_equal(mpr_backward(y, g, false), MPR_OK);
    assert_near(at(mpr_tensor_grad(x), 2), 1.5, 0);
    mpr_scope_end();
    mpr_tensor_release(x);
}

static void test_version_counter(void **state) {
    mpr_tensor_t *x = leaf(1, 2, 3);
    mpr_tensor_t *w = mpr_from_buffer(MPR_F64, MPR_SHAPE(3), (double[]){4, 5, 6});
    mpr_scope_begin();
    mpr_tensor_t *z = mpr_sum(mpr_mul(x, w)); /* saves w */
    assert_int_equal(mpr_add_(w, w), MPR_OK); /* bumps w's version */
    assert_int_equal(mpr_backward(z, NULL, false), MPR_ERR_STATE);
    assert_non_null(strstr(mpr_last_error(), "in-place"));
    assert_non_null(strstr(mpr_last_error(), "mul"));
    /* a view shares the version counter */
    mpr_tensor_t *z2 = mpr_sum(mpr_mul(x, w));
    mpr_tensor_t *wv = mpr_narrow(w, 0, 1, 1);
    assert_int_equal(mpr_fill_(wv, 0.0), MPR_OK);
    assert_int_equal(mpr_backward(z2, NULL, false), MPR_ERR_STATE);
    /* an op that saves its output: exp */
    mpr_tensor_t *e = mpr_exp(x);
    mpr_tensor_t *z3 = mpr_sum(e);
    assert_int_equal(mpr_zero_(e), MPR_ERR_STATE); /* e requires grad: refused with grad mode on */
    bool prev = mpr_set_grad_enabled(false);
    assert_int_equal(mpr_zero_(e), MPR_OK);
    mpr_set_grad_enabled(prev);
    assert_int_equal(mpr_backward(z3, NULL, false), MPR_ERR_STATE); /* exp saved its output */
    assert_non_null(strstr(mpr_last_error(), "exp"));
    mpr_scope_end();
    mpr_tensor_release(w);
    mpr_tensor_release(x);
}

static void test_inplace_rules(void **state) {
    mpr_tensor_t *x = leaf(1, 2, 3);
    assert_int_equal(mpr_add_scaled_(x, x, 1.0), MPR_ERR_STATE); /* leaf requiring grad */
    bool prev = mpr_set_grad_enabled(false);
    assert_int_equal(mpr_add_scaled_(x, x, 1.0), MPR_OK); /* optimizer style */
    mpr_set_grad_enabled(prev);
    assert_near(at(x, 2), 6.0, 0);
    mpr_tensor_release(x);
}

static void test_no_grad_and_detach(void **state) {
    mpr_tensor_t *x = leaf(1, 2, 3);
    mpr_scope_begin();
    assert_true(mpr_grad_enabled());
    bool prev = mpr_set_grad_enabled(false);
    mpr_tensor_t *y = mpr_mul(x, x);
    assert_false(mpr_requires_grad(y));
    assert_true(mpr_is_leaf(y));
    assert_true(mpr_set_grad_enabled(prev) == false);
    mpr_tensor_t *y2 = mpr_mul(x, x);
    assert_true(mpr_requires_grad(y2));
    assert_string_equal(mpr_grad_fn_name(y2), "mul");
    mpr_tensor_t *d = mpr_detach(y2);
    assert_false(mpr_requires_grad(d));
    assert_ptr_equal(mpr_tensor_data(d), mpr_tensor_data(y2)); /* same storage */
    /* gradient stops at the detached tensor */
    mpr_tensor_t *z = mpr_sum(mpr_add(mpr_mul(d, x), x));
    assert_int_equal(mpr_backward(z, NULL, false), MPR_OK);
    assert_near(at(mpr_tensor_grad(x), 1), 4.0 + 1.0, 0);
    /* a tensor without history cannot be a root */
    assert_int_equal(mpr_backward(mpr_sum(d), NULL, false), MPR_ERR_STATE);
    /* set_requires_grad only on float leaves */
    assert_int_equal(mpr_set_requires_grad(y2, true), MPR_ERR_STATE);
    mpr_tensor_t *idx = mpr_arange(MPR_I64, 0, 3, 1);
    assert_int_equal(mpr_set_requires_grad(idx, true), MPR_ERR_DTYPE);
    mpr_scope_end();
    mpr_tensor_release(x);
}

static void test_leaf_dies_before_graph(void **state) {
    mpr_tensor_t *x = leaf(1, 2, 3);
    mpr_tensor_t *y = mpr_mul_scalar(x, 2.0); /* caller-owned: no scope */
    mpr_tensor_t *z = mpr_sum(y);
    mpr_tensor_release(x); /* graph still references x's accumulator */
    assert_int_equal(mpr_backward(z, NULL, false), MPR_OK); /* gradient dropped */
    mpr_tensor_release(z);
    mpr_tensor_release(y);
}

static void test_deep_chain(void **state) {
    int64_t start = mpr_tensor_live_count();
    mpr_tensor_t *x = leaf(1, 2, 3);
    mpr_scope_begin();
    mpr_tensor_t *y = x;
    for (int i = 0; i < 20000; i++) y = mpr_add_scalar(y, 1e-4);
    assert_int_equal(mpr_backward(mpr_sum(y), NULL, false), MPR_OK);
    mpr_scope_end();
    assert_near(at(mpr_tensor_grad(x), 0), 1.0, 0);
    mpr_tensor_release(x);
    assert_int_equal(mpr_tensor_live_count(), start);
}

static void test_leaf_root_and_item(void **state) {
    mpr_tensor_t *s = mpr_full(MPR_F32, 0, NULL, 2.5);
    assert_int_equal(mpr_set_requires_grad(s, true), MPR_OK);
    assert_int_equal(mpr_backward(s, NULL, false), MPR_OK);
    assert_near(item(mpr_tensor_grad(s)), 1.0, 0);
    mpr_tensor_release(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_subexpression), cmocka_unit_test(test_accumulate_and_zero_grad),
        cmocka_unit_test(test_retain_graph_and_twice), cmocka_unit_test(test_nonscalar_root),
        cmocka_unit_test(test_version_counter),       cmocka_unit_test(test_inplace_rules),
        cmocka_unit_test(test_no_grad_and_detach),    cmocka_unit_test(test_leaf_dies_before_graph),
        cmocka_unit_test(test_deep_chain),            cmocka_unit_test(test_leaf_root_and_item),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
