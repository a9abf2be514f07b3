/* test_ops_softmax_loss.c — softmax, log_softmax, nll_loss, cross_entropy and
 * mse_loss: values against PyTorch 1.13 (numbers printed by torch for the same
 * inputs), f64 gradient checks against central differences, numerical
 * stability on large logits, argument errors, and (when a GPU is visible) the
 * CUDA path against the CPU one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "mpirpc/cuda.h"
#include "nn_test_util.h"

static const double X34[12] = {1, 2, 3, 4, -1, 0.5, 0, 2, 100, 100, -100, 0};

static void test_softmax_values(void **state) {
    mpr_tensor_t *x = mpr_from_buffer(MPR_F64, MPR_SHAPE(3, 4), X34);
    mpr_tensor_t *y = mpr_softmax(x, 1), *ly = mpr_log_softmax(x, 0);
    assert_non_null(y);
    assert_non_null(ly);
    const double *yd = mpr_tensor_data(y), *lyd = mpr_tensor_data(ly);
    const double ey[12] = {3.2058603280e-02, 8.7144318742e-02, 2.3688281809e-01, 6.4391425989e-01,
                           3.5353793409e-02, 1.5844470951e-01, 9.6101574190e-02, 7.1009992289e-01,
                           0.5, 0.5, 6.9194826337e-88, 1.8600379880e-44};
    const double ely[12] = {-99, -98, -4.8587351574e-02, -1.4293162850e-01, -101, -99.5,
                            -3.0485873516e+00, -2.1429316285e+00, 0, 0, -1.0304858735e+02,
                            -4.1429316285e+00};
    for (int i = 0; i < 12; i++) {
        assert_true(fabs(yd[i] - ey[i]) <= 1e-10 + 1e-8 * fabs(ey[i]));
        assert_true(fabs(lyd[i] - ely[i]) <= 1e-9 + 1e-9 * fabs(ely[i]));
    }
    /* f32 with large logits stays finite */
    float big[3] = {1000.f, 1001.f, -1000.f};
    mpr_tensor_t *xf = mpr_from_buffer(MPR_F32, MPR_SHAPE(3), big);
    mpr_tensor_t *lf = mpr_log_softmax(xf, -1);
    const float *lfd = mpr_tensor_data(lf);
    assert_true(isfinite(lfd[0]) && isfinite(lfd[1]) && isfinite(lfd[2]));
    if (!(fabsf(lfd[1] - (-0.31326169f)) < 1e-5f)) fail_msg("log_softmax f32: %g %g %g", lfd[0], lfd[1], lfd[2]);
    mpr_tensor_release(x);
    mpr_tensor_release(y);
    mpr_tensor_release(ly);
    mpr_tensor_release(xf);
    mpr_tensor_release(lf);
}

static mpr_tensor_t *f_softmax(mpr_tensor_t **in, void *ctx) { return mpr_softmax(in[0], *(int *)ctx); }
static mpr_tensor_t *f_log_softmax(mpr_tensor_t **in, void *ctx) {
    return mpr_log_softmax(in[0], *(int *)ctx);
}

static void test_softmax_grad(void **state) {
    mpr_tensor_t *x = tu_randn(MPR_SHAPE(2, 3, 4), 1, true);
    for (int dim = -3; dim < 3; dim++) {
        TU_GRADCHECK("softmax", f_softmax, &dim, 1, &x, 1e-7, 1e-5);
        TU_GRADCHECK("log_softmax", f_log_softmax, &dim, 1, &x, 1e-7, 1e-5);
    }
    /* non-contiguous input */
    mpr_tensor_t *xt = mpr_transpose(x, 0, 2);
    mpr_tensor_t *y = mpr_softmax(xt, 1);
    assert_non_null(y);
    assert_int_equal(mpr_tensor_shape(y)[0], 4);
    mpr_tensor_release(y);
    mpr_tensor_release(xt);
    mpr_tensor_release(x);
}

typedef struct {
    mpr_tensor_t *target;
    int64_t ignore;
} loss_ctx_t;

static mpr_tensor_t *f_ce(mpr_tensor_t **in, void *c) {
    loss_ctx_t *l = c;
    return mpr_cross_entropy_ex(in[0], l->target, l->ignore);
}
static mpr_tensor_t *f_nll(mpr_tensor_t **in, void *c) {
    loss_ctx_t *l = c;
    return mpr_nll_loss_ex(mpr_log_softmax(in[0], 1), l->target, l->ignore);
}
static mpr_tensor_t *f_mse(mpr_tensor_t **in, void *c) { return mpr_mse_loss(in[0], in[1]); }

static void test_loss_values(void **state) {
    mpr_tensor_t *x = mpr_from_buffer(MPR_F64, MPR_SHAPE(3, 4), X34);
    mpr_tensor_t *t = tu_i64(MPR_SHAPE(3), (int64_t[]){3, 0, 1});
    mpr_tensor_t *ti = tu_i64(MPR_SHAPE(3), (int64_t[]){3, -100, 1});
    double v;
    mpr_scope_begin();
    assert_int_equal(mpr_item(mpr_cross_entropy(x, t), &v), MPR_OK);
    assert_true(fabs(v - 1.4918954871703212) < 1e-12);
    assert_int_equal(mpr_item(mpr_nll_loss(mpr_log_softmax(x, 1), t), &v), MPR_OK);
    assert_true(fabs(v - 1.4918954871703212) < 1e-12);
    assert_int_equal(mpr_item(mpr_cross_entropy(x, ti), &v), MPR_OK);
    assert_true(fabs(v - 0.5666684395605703) < 1e-12);
    mpr_tensor_t *a = mpr_from_buffer(MPR_F32, MPR_SHAPE(3), (float[]){1, 2, 3});
    mpr_tensor_t *b = mpr_from_buffer(MPR_F32, MPR_SHAPE(3), (float[]){0, 4, 3.5f});
    assert_int_equal(mpr_item(mpr_mse_loss(a, b), &v), MPR_OK);
    assert_true(fabs(v - 1.75) < 1e-6);
    /* a 1-D input with a 0-d target */
    mpr_tensor_t *x1 = mpr_select(x, 0, 0), *t0 = mpr_from_buffer(MPR_I64, 0, NULL, (int64_t[]){2});
    assert_int_equal(mpr_item(mpr_cross_entropy(x1, t0), &v), MPR_OK);
    assert_true(fabs(v - 1.4401896985611953) < 1e-12);
    mpr_scope_end();
    mpr_tensor_release(x);
    mpr_tensor_release(t);
    mpr_tensor_release(ti);
}

static void test_loss_grad(void **state) {
    mpr_tensor_t *x = tu_randn(MPR_SHAPE(5, 4), 2, true);
    loss_ctx_t c = {tu_i64(MPR_SHAPE(5), (int64_t[]){0, 3, 3, 1, 2}), MPR_IGNORE_INDEX_DEFAULT};
    TU_GRADCHECK("cross_entropy", f_ce, &c, 1, &x, 1e-8, 1e-5);
    TU_GRADCHECK("nll_loss", f_nll, &c, 1, &x, 1e-8, 1e-5);
    loss_ctx_t ci = {tu_i64(MPR_SHAPE(5), (int64_t[]){0, 7, 3, 7, 2}), 7};
    TU_GRADCHECK("cross_entropy ignore_index", f_ce, &ci, 1, &x, 1e-8, 1e-5);
    TU_GRADCHECK("nll_loss ignore_index", f_nll, &ci, 1, &x, 1e-8, 1e-5);
    mpr_tensor_t *ab[2] = {tu_randn(MPR_SHAPE(3, 2), 3, true), tu_randn(MPR_SHAPE(3, 2), 4, true)};
    TU_GRADCHECK("mse_loss", f_mse, NULL, 2, ab, 1e-8, 1e-5);
    /* only the target requires grad */
    mpr_set_requires_grad(ab[0], false);
    TU_GRADCHECK("mse_loss target", f_mse, NULL, 2, ab, 1e-8, 1e-5);
    mpr_tensor_release(ab[0]);
    mpr_tensor_release(ab[1]);
    mpr_tensor_release(c.target);
    mpr_tensor_release(ci.target);
    mpr_tensor_release(x);
}

static void test_loss_errors(void **state) {
    mpr_tensor_t *x = tu_randn(MPR_SHAPE(3, 4), 5, false);
    mpr_tensor_t *t_bad = tu_i64(MPR_SHAPE(3), (int64_t[]){0, 4, 1});
    mpr_tensor_t *t_short = tu_i64(MPR_SHAPE(2), (int64_t[]){0, 1});
    mpr_tensor_t *t_f = mpr_zeros(MPR_F64, MPR_SHAPE(3));
    TU_EXPECT_ERR(mpr_cross_entropy(x, t_bad), MPR_ERR_INVALID_ARG, "target 4 at position 1");
    TU_EXPECT_ERR(mpr_cross_entropy(x, t_short), MPR_ERR_SHAPE, "[3, 4] and target [2]");
    TU_EXPECT_ERR(mpr_nll_loss(x, t_f), MPR_ERR_DTYPE, "int64");
    mpr_tensor_t *y = mpr_zeros(MPR_F64, MPR_SHAPE(4, 3));
    TU_EXPECT_ERR(mpr_mse_loss(x, y), MPR_ERR_SHAPE, "[3, 4] and [4, 3]");
    mpr_tensor_t *yf = mpr_zeros(MPR_F32, MPR_SHAPE(3, 4));
    TU_EXPECT_ERR(mpr_mse_loss(x, yf), MPR_ERR_DTYPE, "mse_loss");
    TU_EXPECT_ERR(mpr_softmax(x, 2), MPR_ERR_INVALID_ARG, "softmax");
    /* NULL propagates without overwriting the first error */
    mpr_error_set(MPR_ERR_SHAPE, "first failure");
    assert_null(mpr_cross_entropy(NULL, t_bad));
    assert_string_equal(mpr_last_error(), "first failure");
    mpr_tensor_release(x);
    mpr_tensor_release(t_bad);
    mpr_tensor_release(t_short);
    mpr_tensor_release(t_f);
    mpr_tensor_release(y);
    mpr_tensor_release(yf);
}

/* The same loss on CPU and on cuda:0 (through the differentiable device
 * copy): values and the gradient reaching the CPU leaf must agree. */
typedef mpr_tensor_t *(*loss2_fn)(mpr_tensor_t *x, mpr_tensor_t *t, mpr_tensor_t *u);
static mpr_tensor_t *l_ce(mpr_tensor_t *x, mpr_tensor_t *t, mpr_tensor_t *u) { return mpr_cross_entropy(x, t); }
static mpr_tensor_t *l_nll(mpr_tensor_t *x, mpr_tensor_t *t, mpr_tensor_t *u) {
    return mpr_nll_loss(mpr_log_softmax(x, 1), t);
}
static mpr_tensor_t *l_sm(mpr_tensor_t *x, mpr_tensor_t *t, mpr_tensor_t *u) {
    return mpr_mse_loss(mpr_softmax(x, 0), u);
}

static void test_cuda_matches_cpu(void **state) {
    if (mpr_cuda_device_count() < 1) {
        print_message("skipping: %s\n", mpr_cuda_is_built() ? "no CUDA device visible"
                                                             : "mpirpc built without CUDA");
        return;
    }
    loss2_fn fns[3] = {l_ce, l_nll, l_sm};
    for (int dt = 0; dt < 2; dt++)
        for (int f = 0; f < 3; f++) {
            mpr_dtype_t dtype = dt ? MPR_F64 : MPR_F32;
            mpr_scope_begin();
            /* everything below is owned by the scope */
            mpr_tensor_t *x = mpr_randn(dtype, MPR_SHAPE(7, 5), NULL);
            mpr_tensor_t *u = mpr_rand(dtype, MPR_SHAPE(7, 5), NULL);
            assert_int_equal(mpr_set_requires_grad(x, true), MPR_OK);
            mpr_tensor_t *t = tu_i64(MPR_SHAPE(7), (int64_t[]){0, 4, 4, 2, -100, 1, 3});
            double lc, lg;
            mpr_tensor_t *loss_c = fns[f](x, t, u);
            assert_int_equal(mpr_item(loss_c, &lc), MPR_OK);
            assert_int_equal(mpr_backward(loss_c, NULL, false), MPR_OK);
            mpr_tensor_t *gc = mpr_clone(mpr_tensor_grad(x));
            mpr_zero_grad(x);
            mpr_tensor_t *loss_g = fns[f](mpr_to_device(x, 0), mpr_to_device(t, 0), mpr_to_device(u, 0));
            assert_non_null(loss_g);
            assert_int_equal(mpr_tensor_device(loss_g), 0);
            assert_int_equal(mpr_backward(loss_g, NULL, false), MPR_OK);
            assert_int_equal(mpr_item(mpr_to_device(loss_g, -1), &lg), MPR_OK);
            assert_true(fabs(lc - lg) <= 1e-5 * (1 + fabs(lc)));
            assert_true(mpr_allclose(mpr_tensor_grad(x), gc, 1e-4, 1e-6));
            mpr_scope_end();
        }
}

/* nll_loss on its own (not only behind log_softmax): f64 gradient checks on
 * arbitrary inputs, ignored targets, a 1-D input with a 0-d target, and its value. */
typedef struct {
    mpr_tensor_t *target;
    int64_t ignore;
} nll_ctx_t;

static mpr_tensor_t *f_nll_direct(mpr_tensor_t **in, void *c) {
    nll_ctx_t *k = c;
    return mpr_nll_loss_ex(in[0], k->target, k->ignore);
}

static void test_nll_loss_gradcheck(void **state) {
    /* nll_loss on arbitrary inputs (not log-probabilities): its own backward */
    mpr_tensor_t *x = tu_randn(MPR_SHAPE(5, 4), 3, true);
    nll_ctx_t c = {tu_i64(MPR_SHAPE(5), (int64_t[]){0, 3, 3, 1, 2}), MPR_IGNORE_INDEX_DEFAULT};
    TU_GRADCHECK("nll_loss direct", f_nll_direct, &c, 1, &x, 1e-8, 1e-6);
    nll_ctx_t ci = {tu_i64(MPR_SHAPE(5), (int64_t[]){1, 2, -100, 0, -100}), MPR_IGNORE_INDEX_DEFAULT};
    TU_GRADCHECK("nll_loss direct ignore", f_nll_direct, &ci, 1, &x, 1e-8, 1e-6);
    /* 1-D input with a 0-d target */
    mpr_tensor_t *x1 = tu_randn(MPR_SHAPE(4), 4, true);
    nll_ctx_t c0 = {mpr_from_buffer(MPR_I64, 0, NULL, (int64_t[]){2}), MPR_IGNORE_INDEX_DEFAULT};
    TU_GRADCHECK("nll_loss 1-D", f_nll_direct, &c0, 1, &x1, 1e-8, 1e-6);
    /* value: mean of -x[i, t[i]] */
    double v;
    mpr_scope_begin();
    assert_int_equal(mpr_item(mpr_nll_loss(x, c.target), &v), MPR_OK);
    const double *xd = mpr_tensor_data(x);
    const int64_t t[5] = {0, 3, 3, 1, 2};
    double want = 0;
    for (int i = 0; i < 5; i++) want -= xd[i * 4 + t[i]];
    assert_true(fabs(v - want / 5) < 1e-14);
    mpr_scope_end();
    mpr_tensor_release(c.target);
    mpr_tensor_release(ci.target);
    mpr_tensor_release(c0.target);
    mpr_tensor_release(x);
    mpr_tensor_release(x1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_softmax_values), cmocka_unit_test(test_softmax_grad),
        cmocka_unit_test(test_loss_values),    cmocka_unit_test(test_loss_grad),
        cmocka_unit_test(test_loss_errors),    cmocka_unit_test(test_cuda_matches_cpu),
        cmocka_unit_test(test_nll_loss_gradcheck),
    };
    return tu_run_group_no_leaks(tests);
}
