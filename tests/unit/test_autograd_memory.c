/* test_autograd_memory.c — 10,000 iterations of a small MLP forward/backward
 * plus an SGD-style in-place update inside scopes; the live-tensor count
 * must return to its start value after every scope and at the end, and the
 * loss must go down (the loop really trains). Also checks scope_keep,
 * scope_escape and scope_adopt ownership rules, and mpr_autograd_saved_bytes
 * (the activation memory of the live graphs: each saved storage once,
 * parameters left out, freed by backward and with the graph). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "mpirpc/autograd.h"
#include "mpirpc/tensor_ops.h"

static void test_training_loop_no_leak(void **state) {
    mpr_generator_t *g = mpr_generator_create(42);
    mpr_tensor_t *w1 = mpr_uniform(MPR_F32, MPR_SHAPE(16, 8), -0.3, 0.3, g);
    mpr_tensor_t *b1 = mpr_zeros(MPR_F32, MPR_SHAPE(16));
    mpr_tensor_t *w2 = mpr_uniform(MPR_F32, MPR_SHAPE(1, 16), -0.3, 0.3, g);
    mpr_tensor_t *x = mpr_randn(MPR_F32, MPR_SHAPE(32, 8), g);
    mpr_tensor_t *y = mpr_sum_dims(x, 1, (const int[]){1}, true); /* target: sum of inputs */
    mpr_tensor_t *params[3] = {w1, b1, w2};
    for (int i = 0; i < 3; i++) mpr_set_requires_grad(params[i], true);
    int64_t start = mpr_tensor_live_count();
    double first = 0, last = 0;
    for (int it = 0; it < 10000; it++) {
        mpr_scope_begin();
        mpr_tensor_t *h = mpr_tanh(mpr_linear(x, w1, b1));
        mpr_tensor_t *d = mpr_sub(mpr_linear(h, w2, NULL), y);
        mpr_tensor_t *loss = mpr_mean(mpr_mul(d, d));
        assert_non_null(loss);
        assert_int_equal(mpr_backward(loss, NULL, false), MPR_OK);
        bool prev = mpr_set_grad_enabled(false);
        for (int i = 0; i < 3; i++) {
            assert_int_equal(mpr_add_scaled_(params[i], mpr_tensor_grad(params[i]), -0.05), MPR_OK);
            mpr_zero_grad(params[i]);
        }
        mpr_set_grad_enabled(prev);
        if (it == 0) mpr_item(loss, &first);
        if (it == 9999) mpr_item(loss, &last);
        mpr_scope_end();
        if (it % 1000 == 0) assert_int_equal(mpr_tensor_live_count(), start);
    }
    assert_int_equal(mpr_tensor_live_count(), start);
    assert_true(last < first * 0.1);
    mpr_tensor_release(x);
    mpr_tensor_release(y);
    for (int i = 0; i < 3; i++) mpr_tensor_release(params[i]);
    mpr_generator_destroy(g);
}

static void test_scope_ownership(void **state) {
    int64_t start = mpr_tensor_live_count();
    mpr_tensor_t *kept, *escaped, *adopted;
    mpr_scope_begin();
    assert_int_equal(mpr_scope_depth(), 1);
    kept = mpr_scope_keep(mpr_ones(MPR_F32, MPR_SHAPE(2)));
    mpr_scope_begin();
    escaped = mpr_scope_escape(mpr_ones(MPR_F32, MPR_SHAPE(3)));
    adopted = mpr_scope_adopt(mpr_tensor_empty(MPR_F32, MPR_SHAPE(4)));
    mpr_scope_end(); /* adopted is gone, escaped lives in the outer scope */
    assert_int_equal(mpr_tensor_live_count(), start + 2);
    assert_int_equal(mpr_tensor_numel(escaped), 3);
    mpr_scope_end();
    (void)adopted;
    assert_int_equal(mpr_scope_depth(), 0);
    assert_int_equal(mpr_tensor_live_count(), start + 1); /* only `kept` */
    mpr_tensor_release(kept);
    assert_int_equal(mpr_tensor_live_count(), start);
    mpr_scope_end(); /* no scope open: no-op */
    /* NULL chains keep the first error and create nothing */
    mpr_scope_begin();
    mpr_tensor_t *bad = mpr_relu(mpr_add(mpr_ones(MPR_F32, MPR_SHAPE(2)), mpr_ones(MPR_F32, MPR_SHAPE(3))));
    assert_null(bad);
    assert_int_equal(mpr_last_error_code(), MPR_ERR_SHAPE);
    mpr_scope_end();
    assert_int_equal(mpr_tensor_live_count(), start);
}

static void test_saved_bytes(void **state) {
    (void)state;
    int64_t start = mpr_autograd_saved_bytes();
    mpr_tensor_t *a = mpr_ones(MPR_F32, MPR_SHAPE(16)), *w = mpr_ones(MPR_F32, MPR_SHAPE(16));
    assert_int_equal(mpr_set_requires_grad(w, true), MPR_OK);
    mpr_tensor_t *y = mpr_mul(a, w); /* saves a (64 B) and w (a parameter: not counted) */
    assert_int_equal(mpr_autograd_saved_bytes() - start, 64);
    mpr_tensor_t *z = mpr_mul(y, a); /* saves y (64 B more) and a again (counted once) */
    assert_int_equal(mpr_autograd_saved_bytes() - start, 128);
    mpr_tensor_t *v = mpr_narrow(y, 0, 0, 8), *u = mpr_mul(v, v); /* a view of y: y's storage, already counted */
    assert_int_equal(mpr_autograd_saved_bytes() - start, 128);
    mpr_tensor_release(u);
    mpr_tensor_release(v);
    mpr_tensor_t *loss = mpr_sum(z);
    assert_int_equal(mpr_backward(loss, NULL, false), MPR_OK); /* frees what it ran through */
    assert_int_equal(mpr_autograd_saved_bytes(), start);
    mpr_tensor_release(loss);
    mpr_tensor_release(z);
    mpr_tensor_t *kept = mpr_mul(y, y); /* a graph that dies with its output */
    assert_int_equal(mpr_autograd_saved_bytes() - start, 64);
    mpr_tensor_release(kept);
    assert_int_equal(mpr_autograd_saved_bytes(), start);
    bool prev = mpr_set_grad_enabled(false); /* no graph: nothing saved */
    mpr_tensor_t *n = mpr_mul(a, w);
    assert_int_equal(mpr_autograd_saved_bytes(), start);
    mpr_set_grad_enabled(prev);
    mpr_tensor_release(n);
    mpr_tensor_release(y);
    mpr_tensor_release(a);
    mpr_tensor_release(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_training_loop_no_leak),
        cmocka_unit_test(test_scope_ownership),
        cmocka_unit_test(test_saved_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
