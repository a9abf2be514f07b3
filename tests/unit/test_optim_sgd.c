/* test_optim_sgd.c — SGD numerics (plain, weight decay, momentum, dampening,
 * nesterov) over two steps, checked against values worked out by hand and
 * confirmed with torch.optim.SGD in PyTorch 1.13; parameters without a
 * gradient are skipped; explicit-gradient steps; the version bump that makes
 * a graph saved before the step fail in backward; zero_grad; argument errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "mpirpc/optim.h"
#include "nn_test_util.h"

static mpr_tensor_t *vec3(double a, double b, double c, bool rg) {
    mpr_tensor_t *t = mpr_from_buffer(MPR_F64, MPR_SHAPE(3), (double[]){a, b, c});
    assert_non_null(t);
    if (rg) mpr_set_requires_grad(t, true);
    return t;
}

/* Two steps with gradients g1 = [0.5, -1, 2], g2 = [0.25, 0.5, -1] from p = [1, 2, -3]. */
static void two_steps(const mpr_sgd_options_t *o, const double want[3]) {
    mpr_tensor_t *p = vec3(1, 2, -3, true);
    mpr_optimizer_t *opt = mpr_sgd_create(&p, 1, o);
    assert_non_null(opt);
    const double g[2][3] = {{0.5, -1, 2}, {0.25, 0.5, -1}};
    for (int s = 0; s < 2; s++) {
        mpr_tensor_t *gt = vec3(g[s][0], g[s][1], g[s][2], false);
        assert_int_equal(mpr_set_grad(p, gt), MPR_OK);
        mpr_tensor_release(gt);
        assert_int_equal(mpr_optimizer_step(opt), MPR_OK);
    }
    const double *pd = mpr_tensor_data(p);
    for (int i = 0; i < 3; i++)
        if (fabs(pd[i] - want[i]) > 1e-12)
            fail_msg("SGD lr %g mom %g: p[%d] = %.15g, want %.15g", o->lr, o->momentum, i, pd[i],
                     want[i]);
    mpr_optimizer_destroy(opt);
    mpr_tensor_release(p);
}

static void test_sgd_numerics(void **state) {
    /* plain: p - 0.1 (g1 + g2) */
    two_steps(&(mpr_sgd_options_t){.lr = 0.1}, (double[]){0.925, 2.05, -3.1});
    /* weight decay: d = g + 0.01 p, step by step */
    two_steps(&(mpr_sgd_options_t){.lr = 0.1, .weight_decay = 0.01},
              (double[]){0.923051, 2.045902, -3.093803});
    /* momentum 0.9: buf1 = g1, buf2 = 0.9 g1 + g2 = [0.7, -0.4, 0.8];
     * p = p0 - 0.1 (buf1 + buf2) */
    two_steps(&(mpr_sgd_options_t){.lr = 0.1, .momentum = 0.9}, (double[]){0.88, 2.14, -3.28});
    /* dampening 0.5 with weight decay 0.1 (buf2 = 0.9 buf1 + 0.5 d2) */
    two_steps(&(mpr_sgd_options_t){.lr = 0.1, .momentum = 0.9, .dampening = 0.5, .weight_decay = 0.1},
              (double[]){0.8688, 2.1166, -3.25715});
    /* nesterov: p -= lr (g + 0.9 buf) */
    two_steps(&(mpr_sgd_options_t){.lr = 0.1, .momentum = 0.9, .nesterov = true},
              (double[]){0.817, 2.176, -3.352});
}

static void test_sgd_f32_skip_and_explicit(void **state) {
    mpr_tensor_t *a = mpr_ones(MPR_F32, MPR_SHAPE(2, 2)), *b = mpr_ones(MPR_F32, MPR_SHAPE(3));
    mpr_set_requires_grad(a, true);
    mpr_set_requires_grad(b, true);
    mpr_tensor_t *ps[2] = {a, b};
    mpr_optimizer_t *opt = mpr_sgd_create(ps, 2, &(mpr_sgd_options_t){.lr = 0.5});
    assert_string_equal(mpr_optimizer_name(opt), "SGD");
    assert_int_equal(mpr_optimizer_num_params(opt), 2);
    assert_ptr_equal(mpr_optimizer_param(opt, 1), b);
    /* b has no grad: skipped */
    mpr_scope_begin();
    assert_int_equal(mpr_backward(mpr_sum(mpr_mul_scalar(a, 2.0)), NULL, false), MPR_OK);
    mpr_scope_end();
    assert_int_equal(mpr_optimizer_step(opt), MPR_OK);
    const float *ad = mpr_tensor_data(a), *bd = mpr_tensor_data(b);
    for (int i = 0; i < 4; i++) assert_true(ad[i] == 0.0f); /* 1 - 0.5 * 2 */
    for (int i = 0; i < 3; i++) assert_true(bd[i] == 1.0f);
    /* explicit gradients (a distributed optimizer's path); NULL skips */
    mpr_tensor_t *gb = mpr_full(MPR_F32, MPR_SHAPE(3), 4.0);
    assert_int_equal(mpr_optimizer_step_grads(opt, (mpr_tensor_t *[]){NULL, gb}, 2), MPR_OK);
    for (int i = 0; i < 3; i++) assert_true(bd[i] == -1.0f);
    for (int i = 0; i < 4; i++) assert_true(ad[i] == 0.0f);
    /* wrong shape / count: nothing changes */
    mpr_tensor_t *gbad = mpr_ones(MPR_F32, MPR_SHAPE(4));
    assert_int_equal(mpr_optimizer_step_grads(opt, (mpr_tensor_t *[]){NULL, gbad}, 2), MPR_ERR_SHAPE);
    assert_non_null(strstr(mpr_last_error(), "gradient 1 is float32 [4] but its parameter is float32 [3]"));
    assert_int_equal(mpr_optimizer_step_grads(opt, (mpr_tensor_t *[]){gb}, 1), MPR_ERR_INVALID_ARG);
    for (int i = 0; i < 3; i++) assert_true(bd[i] == -1.0f);
    /* lr schedule and zero_grad */
    mpr_optimizer_set_lr(opt, 0.25);
    assert_true(mpr_optimizer_get_lr(opt) == 0.25);
    assert_non_null(mpr_tensor_grad(a));
    mpr_optimizer_zero_grad(opt);
    assert_null(mpr_tensor_grad(a));
    mpr_optimizer_destroy(opt);
    mpr_optimizer_destroy(NULL);
    mpr_tensor_release(gb);
    mpr_tensor_release(gbad);
    mpr_tensor_release(a);
    mpr_tensor_release(b);
}

static void test_sgd_version_bump(void **state) {
    mpr_tensor_t *p = vec3(1, 2, 3, true);
    mpr_optimizer_t *opt = mpr_sgd_create(&p, 1, &(mpr_sgd_options_t){.lr = 0.1});
    mpr_tensor_t *g = vec3(1, 1, 1, false);
    mpr_set_grad(p, g);
    mpr_tensor_release(g);
    mpr_scope_begin();
    mpr_tensor_t *y = mpr_sum(mpr_mul(p, p)); /* saves p for backward */
    assert_int_equal(mpr_optimizer_step(opt), MPR_OK);
    assert_int_equal(mpr_backward(y, NULL, false), MPR_ERR_STATE); /* p changed in place */
    mpr_scope_end();
    mpr_optimizer_destroy(opt);
    mpr_tensor_release(p);
}

static void test_sgd_errors(void **state) {
    mpr_tensor_t *p = vec3(1, 2, 3, true), *i = mpr_zeros(MPR_I64, MPR_SHAPE(2));
    assert_null(mpr_sgd_create(&p, 1, &(mpr_sgd_options_t){.lr = 0}));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_INVALID_ARG);
    assert_null(mpr_sgd_create(&p, 1, &(mpr_sgd_options_t){.lr = 0.1, .momentum = -1}));
    assert_null(mpr_sgd_create(&p, 1, &(mpr_sgd_options_t){.lr = 0.1, .nesterov = true}));
    assert_non_null(strstr(mpr_last_error(), "nesterov"));
    assert_null(mpr_sgd_create(&p, 0, &(mpr_sgd_options_t){.lr = 0.1}));
    assert_null(mpr_sgd_create(&i, 1, &(mpr_sgd_options_t){.lr = 0.1}));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_DTYPE);
    assert_null(mpr_sgd_create(&p, 1, NULL));
    mpr_tensor_t *z = mpr_zeros(MPR_F32, MPR_SHAPE(2, 3)), *t = mpr_transpose(z, 0, 1);
    assert_null(mpr_sgd_create(&t, 1, &(mpr_sgd_options_t){.lr = 0.1}));
    assert_non_null(strstr(mpr_last_error(), "contiguous"));
    mpr_tensor_release(t);
    mpr_tensor_release(z);
    mpr_tensor_release(p);
    mpr_tensor_release(i);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_numerics), cmocka_unit_test(test_sgd_f32_skip_and_explicit),
        cmocka_unit_test(test_sgd_version_bump), cmocka_unit_test(test_sgd_errors),
    };
    return tu_run_group_no_leaks(tests);
}
