/* test_ops_conv_pool.c — conv2d, max_pool2d and dropout: values against
 * PyTorch 1.13 (numbers printed by torch for the same sin/cos-filled inputs),
 * f64 gradient checks (stride, padding, 1x1 kernels, no bias), shape errors,
 * and dropout's train/eval behaviour, scaling, determinism and f64 gradient
 * checks (training mode with a fixed mask, eval mode, p = 0). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "nn_test_util.h"

/* A caller-owned f64 tensor with v[i] = sin(i) (or cos(i)). */
static mpr_tensor_t *trig(int ndim, const int64_t *shape, bool use_cos) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    double *v = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = use_cos ? cos((double)i) : sin((double)i);
    mpr_tensor_t *t = mpr_from_buffer(MPR_F64, ndim, shape, v);
    free(v);
    assert_non_null(t);
    return t;
}

static double sum_all(mpr_tensor_t *t) {
    double s = 0;
    const double *d = mpr_tensor_data(t);
    for (int64_t i = 0; i < mpr_tensor_numel(t); i++) s += d[i];
    return s;
}

static void test_conv_values(void **state) {
    mpr_tensor_t *x = trig(MPR_SHAPE(2, 2, 5, 5), false), *w = trig(MPR_SHAPE(3, 2, 3, 3), true);
    mpr_tensor_t *b = mpr_from_buffer(MPR_F64, MPR_SHAPE(3), (double[]){0.1, -0.2, 0.3});
    mpr_tensor_t *y = mpr_conv2d(x, w, b, 2, 2, 1, 1);
    assert_non_null(y);
    assert_int_equal(mpr_tensor_ndim(y), 4);
    const int64_t *s = mpr_tensor_shape(y);
    assert_true(s[0] == 2 && s[1] == 3 && s[2] == 3 && s[3] == 3);
    const double *yd = mpr_tensor_data(y);
    const int at[5] = {0, 7, 20, 40, 53};
    const double ref[5] = {0.6979554410274108, 0.22057099783234527, 0.9583637041077826,
                           -0.15855017876052813, 0.4781513822381394};
    for (int i = 0; i < 5; i++) assert_true(fabs(yd[at[i]] - ref[i]) < 1e-12);
    assert_true(fabs(sum_all(y) - 3.961307066256107) < 1e-11);
    mpr_tensor_t *p = mpr_max_pool2d(x, 3, 3, 2, 2, 1, 1);
    assert_non_null(p);
    const double *pd = mpr_tensor_data(p);
    assert_true(fabs(pd[0] - 0.8414709848078965) < 1e-15 && fabs(pd[5] - 0.9906073556948704) < 1e-15);
    assert_true(fabs(pd[17] - 0.017701925105413577) < 1e-15);
    assert_true(fabs(pd[35] - -0.24525198546765434) < 1e-15);
    assert_true(fabs(sum_all(p) - 29.021030979425966) < 1e-12);
    mpr_tensor_t *p2 = mpr_max_pool2d(x, 2, 2, 0, 0, 0, 0); /* stride 0: the window */
    assert_int_equal(mpr_tensor_shape(p2)[2], 2);
    assert_true(fabs(sum_all(p2) - 10.857545123724591) < 1e-12);
    /* f32 path agrees with f64 */
    mpr_scope_begin();
    mpr_tensor_t *yf = mpr_conv2d(mpr_to_dtype(x, MPR_F32), mpr_to_dtype(w, MPR_F32),
                                  mpr_to_dtype(b, MPR_F32), 2, 2, 1, 1);
    assert_true(mpr_allclose(yf, y, 1e-5, 1e-5));
    mpr_scope_end();
    mpr_tensor_release(x);
    mpr_tensor_release(w);
    mpr_tensor_release(b);
    mpr_tensor_release(y);
    mpr_tensor_release(p);
    mpr_tensor_release(p2);
}

typedef struct {
    int64_t sh, sw, ph, pw;
    bool bias;
} conv_ctx_t;

static mpr_tensor_t *f_conv(mpr_tensor_t **in, void *c) {
    conv_ctx_t *k = c;
    return mpr_conv2d(in[0], in[1], k->bias ? in[2] : NULL, k->sh, k->sw, k->ph, k->pw);
}

static void test_conv_grad(void **state) {
    const conv_ctx_t cases[] = {{1, 1, 0, 0, true}, {2, 1, 1, 2, true}, {2, 2, 1, 1, false},
                                {1, 1, 0, 0, false}};
    const int64_t kk[][2] = {{3, 3}, {3, 2}, {2, 2}, {1, 1}};
    for (int c = 0; c < 4; c++) {
        mpr_tensor_t *in[3] = {tu_randn(MPR_SHAPE(2, 3, 5, 6), 10 + c, true),
                               tu_randn(MPR_SHAPE(4, 3, kk[c][0], kk[c][1]), 20 + c, true),
                               tu_randn(MPR_SHAPE(4), 30 + c, true)};
        conv_ctx_t k = cases[c];
        TU_GRADCHECK("conv2d", f_conv, &k, k.bias ? 3 : 2, in, 1e-7, 1e-5);
        for (int i = 0; i < 3; i++) mpr_tensor_release(in[i]);
    }
}

typedef struct {
    int64_t k, s, p;
} pool_ctx_t;

static mpr_tensor_t *f_pool(mpr_tensor_t **in, void *c) {
    pool_ctx_t *k = c;
    return mpr_max_pool2d(in[0], k->k, k->k, k->s, k->s, k->p, k->p);
}

static void test_pool_grad(void **state) {
    /* random inputs have no ties, so the max is differentiable */
    const pool_ctx_t cases[] = {{2, 2, 0}, {3, 2, 1}, {3, 1, 0}};
    for (int c = 0; c < 3; c++) {
        mpr_tensor_t *x = tu_randn(MPR_SHAPE(2, 2, 6, 5), 40 + c, true);
        pool_ctx_t k = cases[c];
        TU_GRADCHECK("max_pool2d", f_pool, &k, 1, &x, 1e-8, 1e-6);
        mpr_tensor_release(x);
    }
    mpr_tensor_t *x3 = tu_randn(MPR_SHAPE(2, 4, 4), 50, true);
    pool_ctx_t k = {2, 2, 0};
    TU_GRADCHECK("max_pool2d 3-D", f_pool, &k, 1, &x3, 1e-8, 1e-6);
    mpr_tensor_release(x3);
}

static void test_conv_pool_errors(void **state) {
    mpr_tensor_t *x = mpr_zeros(MPR_F32, MPR_SHAPE(1, 3, 4, 4));
    mpr_tensor_t *w = mpr_zeros(MPR_F32, MPR_SHAPE(2, 2, 3, 3));
    mpr_tensor_t *w5 = mpr_zeros(MPR_F32, MPR_SHAPE(2, 3, 5, 5));
    mpr_tensor_t *b = mpr_zeros(MPR_F32, MPR_SHAPE(3));
    mpr_tensor_t *wd = mpr_zeros(MPR_F64, MPR_SHAPE(2, 3, 3, 3));
    TU_EXPECT_ERR(mpr_conv2d(x, w, NULL, 1, 1, 0, 0), MPR_ERR_SHAPE,
                  "input [1, 3, 4, 4] and weight [2, 2, 3, 3]");
    TU_EXPECT_ERR(mpr_conv2d(x, w5, NULL, 1, 1, 0, 0), MPR_ERR_SHAPE, "larger than the padded input");
    TU_EXPECT_ERR(mpr_conv2d(x, w5, b, 1, 1, 1, 1), MPR_ERR_SHAPE, "bias [3]");
    TU_EXPECT_ERR(mpr_conv2d(x, w5, NULL, 0, 1, 1, 1), MPR_ERR_INVALID_ARG, "stride");
    TU_EXPECT_ERR(mpr_conv2d(x, wd, NULL, 1, 1, 0, 0), MPR_ERR_DTYPE, "conv2d");
    TU_EXPECT_ERR(mpr_max_pool2d(b, 2, 2, 2, 2, 0, 0), MPR_ERR_SHAPE, "got [3]");
    TU_EXPECT_ERR(mpr_max_pool2d(x, 5, 5, 1, 1, 0, 0), MPR_ERR_SHAPE, "larger than the input");
    TU_EXPECT_ERR(mpr_max_pool2d(x, 2, 2, 1, 1, 2, 2), MPR_ERR_INVALID_ARG, "padding");
    mpr_tensor_release(x);
    mpr_tensor_release(w);
    mpr_tensor_release(w5);
    mpr_tensor_release(b);
    mpr_tensor_release(wd);
}

static void test_dropout(void **state) {
    const int64_t n = 100000;
    mpr_tensor_t *x = mpr_ones(MPR_F32, MPR_SHAPE(n));
    mpr_set_requires_grad(x, true);
    mpr_generator_t *g = mpr_generator_create(7);
    /* eval: identity (the same storage, no copy) */
    mpr_tensor_t *ye = mpr_dropout(x, 0.5, false, g);
    assert_ptr_equal(mpr_tensor_data(ye), mpr_tensor_data(x));
    mpr_tensor_release(ye);
    /* train: about p zeroed, survivors scaled by 1/(1-p), mean preserved */
    mpr_scope_begin();
    mpr_tensor_t *y = mpr_dropout(x, 0.3, true, g);
    const float *yd = mpr_tensor_data(y);
    int64_t zeros = 0;
    for (int64_t i = 0; i < n; i++) {
        if (yd[i] == 0.0f)
            zeros++;
        else
            assert_true(fabsf(yd[i] - 1.0f / 0.7f) < 1e-6f);
    }
    assert_true(zeros > 0.29 * n && zeros < 0.31 * n);
    /* gradient is the mask */
    assert_int_equal(mpr_backward(mpr_sum(y), NULL, false), MPR_OK);
    const float *gd = mpr_tensor_data(mpr_tensor_grad(x));
    for (int64_t i = 0; i < n; i++) assert_true(gd[i] == yd[i]);
    mpr_scope_end();
    /* same seed, same mask; p = 1 zeroes everything */
    mpr_generator_t *g1 = mpr_generator_create(99), *g2 = mpr_generator_create(99);
    mpr_scope_begin();
    mpr_tensor_t *a = mpr_dropout(x, 0.5, true, g1), *b = mpr_dropout(x, 0.5, true, g2);
    assert_true(mpr_allclose(a, b, 0, 0));
    mpr_tensor_t *c = mpr_dropout(x, 0.5, true, g1);
    assert_false(mpr_allclose(a, c, 0, 0));
    mpr_tensor_t *z = mpr_dropout(x, 1.0, true, g1);
    double s;
    assert_int_equal(mpr_item(mpr_sum(z), &s), MPR_OK);
    assert_true(s == 0.0);
    TU_EXPECT_ERR(mpr_dropout(x, 1.5, true, g1), MPR_ERR_INVALID_ARG, "[0, 1]");
    mpr_scope_end();
    mpr_generator_destroy(g);
    mpr_generator_destroy(g1);
    mpr_generator_destroy(g2);
    mpr_tensor_release(x);
}

/* Dropout f64 gradient checks in training mode (a fresh generator with the same
 * seed per call keeps the mask fixed), in eval mode and with p = 0. */
typedef struct {
    double p;
    bool training;
} drop_ctx_t;

static mpr_tensor_t *f_dropout(mpr_tensor_t **in, void *c) {
    drop_ctx_t *k = c;
    /* the same mask on every call: a fresh generator with a fixed seed */
    mpr_generator_t *g = mpr_generator_create(2024);
    mpr_tensor_t *y = mpr_dropout(in[0], k->p, k->training, g);
    mpr_generator_destroy(g);
    return mpr_mul(y, in[0]); /* y * x so the check is not linear in x */
}

static void test_dropout_gradcheck(void **state) {
    mpr_tensor_t *x = tu_randn(MPR_SHAPE(4, 6), 1, true);
    drop_ctx_t train = {0.4, true}, eval = {0.4, false}, p0 = {0.0, true};
    TU_GRADCHECK("dropout train", f_dropout, &train, 1, &x, 1e-8, 1e-6);
    TU_GRADCHECK("dropout eval", f_dropout, &eval, 1, &x, 1e-8, 1e-6);
    TU_GRADCHECK("dropout p=0", f_dropout, &p0, 1, &x, 1e-8, 1e-6);
    /* the training mask really zeroes some and keeps others */
    mpr_scope_begin();
    mpr_generator_t *g = mpr_generator_create(2024);
    mpr_tensor_t *y = mpr_dropout(x, 0.4, true, g);
    mpr_generator_destroy(g);
    const double *yd = mpr_tensor_data(y), *xd = mpr_tensor_data(x);
    int zeros = 0, kept = 0;
    for (int i = 0; i < 24; i++) {
        if (yd[i] == 0.0)
            zeros++;
        else if (fabs(yd[i] - xd[i] / 0.6) < 1e-12)
            kept++;
    }
    assert_int_equal(zeros + kept, 24);
    assert_true(zeros > 0 && kept > 0);
    mpr_scope_end();
    mpr_tensor_release(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_values), cmocka_unit_test(test_conv_grad),
        cmocka_unit_test(test_pool_grad),   cmocka_unit_test(test_conv_pool_errors),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_dropout_gradcheck),
    };
    return tu_run_group_no_leaks(tests);
}
