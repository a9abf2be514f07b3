/* test_audit_nn.c — nn checks added by the issue #3 audit:
 *   - PyTorch's default inits as distributions, not only as bounds: Linear
 *     and Conv2d weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in))
 *     (kaiming_uniform with a = sqrt(5)), every LSTM parameter
 *     U(-1/sqrt(H), 1/sqrt(H)) — max near the bound, standard deviation
 *     bound/sqrt(3), mean near 0;
 *   - LSTM hidden state in/out: running a sequence in two halves, feeding
 *     (hn, cn) of the first as (h0, c0) of the second, gives the outputs and
 *     final state of one run over the whole sequence (batch-first and
 *     time-major), with gradients reaching the first half's input;
 *   - train/eval of the LSTM's inter-layer dropout (train: masks differ per
 *     call; eval: deterministic and equal to the same LSTM without dropout;
 *     a 1-layer LSTM applies none, as PyTorch);
 *   - train/eval reaches modules nested in Sequentials and custom modules. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "nn_test_util.h"

typedef struct {
    double mean, std, maxabs;
    int64_t n;
} stats_t;

static stats_t stats(mpr_tensor_t *t) {
    stats_t s = {0};
    double v[8192];
    s.n = mpr_tensor_numel(t);
    assert_true(s.n <= 8192);
    assert_int_equal(mpr_copy_to_buffer(t, MPR_F64, v, sizeof v), MPR_OK);
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < s.n; i++) {
        sum += v[i];
        sq += v[i] * v[i];
        s.maxabs = fmax(s.maxabs, fabs(v[i]));
    }
    s.mean = sum / (double)s.n;
    s.std = sqrt(sq / (double)s.n - s.mean * s.mean);
    return s;
}

/* U(-b, b): |x| <= b, max close to b, std b/sqrt(3) (within a tolerance that
 * depends on the sample size), mean ~ 0. */
static void expect_uniform(const char *what, mpr_tensor_t *t, double b) {
    stats_t s = stats(t);
    double n = (double)s.n;
    double std_tol = 4.0 * 0.9 / sqrt(n); /* relative sd of the sample std of U is ~0.9/sqrt(n) */
    bool ok = s.maxabs <= b && s.maxabs > b * (1.0 - 8.0 / n) &&
              fabs(s.std / (b / sqrt(3.0)) - 1.0) < std_tol &&
              fabs(s.mean) < 4.0 * b / sqrt(3.0 * n);
    if (!ok)
        fail_msg("%s: n %lld mean %g std %g (want %g) max|x| %g (bound %g)", what, (long long)s.n, s.mean,
                 s.std, b / sqrt(3.0), s.maxabs, b);
}

static void test_default_inits(void **state) {
    mpr_generator_t *g = mpr_generator_create(2718);
    mpr_module_t *lin = mpr_linear_create(300, 20, true, MPR_F32, g);
    expect_uniform("Linear.weight", mpr_module_get_parameter(lin, "weight"), 1.0 / sqrt(300.0));
    expect_uniform("Linear.bias", mpr_module_get_parameter(lin, "bias"), 1.0 / sqrt(300.0));
    mpr_module_t *conv = mpr_conv2d_create(6, 64, 3, 3, 1, 1, true, MPR_F64, g);
    expect_uniform("Conv2d.weight", mpr_module_get_parameter(conv, "weight"), 1.0 / sqrt(54.0));
    expect_uniform("Conv2d.bias", mpr_module_get_parameter(conv, "bias"), 1.0 / sqrt(54.0));
    mpr_module_t *lstm = mpr_lstm_create(10, 25, 2, true, true, 0.0, MPR_F32, g);
    assert_int_equal(mpr_module_num_parameters(lstm), 8);
    for (int i = 0; i < 8; i++) {
        const char *name;
        mpr_tensor_t *p = mpr_module_parameter(lstm, i, &name);
        expect_uniform(name, p, 1.0 / sqrt(25.0));
    }
    /* Embedding: N(0, 1) — an unbounded distribution (a uniform would stay within sqrt(3)) */
    mpr_module_t *emb = mpr_embedding_create(400, 20, MPR_F64, g);
    stats_t s = stats(mpr_module_get_parameter(emb, "weight"));
    assert_true(fabs(s.std - 1.0) < 0.05 && fabs(s.mean) < 0.05 && s.maxabs > 2.5);
    mpr_module_destroy(lin);
    mpr_module_destroy(conv);
    mpr_module_destroy(lstm);
    mpr_module_destroy(emb);
    mpr_generator_destroy(g);
}

/* ------------------------------------------------------- LSTM state chaining */

static void check_chaining(bool batch_first) {
    const int64_t T = 6, B = 3, IN = 4, H = 5, L = 2, T1 = 2;
    mpr_generator_t *g = mpr_generator_create(batch_first ? 77 : 78);
    mpr_module_t *m = mpr_lstm_create(IN, H, (int)L, true, batch_first, 0.0, MPR_F64, g);
    assert_non_null(m);
    int tdim = batch_first ? 1 : 0;
    mpr_tensor_t *x = batch_first ? tu_randn(MPR_SHAPE(3, 6, 4), 5, true) : tu_randn(MPR_SHAPE(6, 3, 4), 5, true);
    mpr_tensor_t *h0 = tu_randn(MPR_SHAPE(2, 3, 5), 6, false), *c0 = tu_randn(MPR_SHAPE(2, 3, 5), 7, false);
    mpr_scope_begin();
    mpr_tensor_t *o, *hn, *cn, *o1, *h1, *c1, *o2, *h2, *c2;
    assert_int_equal(mpr_lstm_forward(m, x, h0, c0, &o, &hn, &cn), MPR_OK);
    assert_int_equal(mpr_tensor_shape(o)[tdim], T);
    assert_int_equal(mpr_tensor_shape(o)[1 - tdim], B);
    assert_int_equal(mpr_tensor_shape(hn)[0], L);
    /* first T1 steps, then the rest starting from the state the first half left */
    assert_int_equal(mpr_lstm_forward(m, mpr_narrow(x, tdim, 0, T1), h0, c0, &o1, &h1, &c1), MPR_OK);
    assert_int_equal(mpr_lstm_forward(m, mpr_narrow(x, tdim, T1, T - T1), h1, c1, &o2, &h2, &c2), MPR_OK);
    mpr_tensor_t *parts[2] = {o1, o2};
    mpr_tensor_t *ocat = mpr_cat(parts, 2, tdim);
    assert_true(mpr_allclose(ocat, o, 1e-12, 1e-12));
    assert_true(mpr_allclose(h2, hn, 1e-12, 1e-12));
    assert_true(mpr_allclose(c2, cn, 1e-12, 1e-12));
    /* the last layer's final h is the output at the last step */
    mpr_tensor_t *olast = mpr_select(o, tdim, T - 1), *hlast = mpr_select(hn, 0, L - 1);
    assert_true(mpr_allclose(olast, hlast, 0, 0));
    /* gradients through the chained state reach the first half's input */
    assert_int_equal(mpr_backward(mpr_sum(mpr_mul(o2, o2)), NULL, false), MPR_OK);
    mpr_tensor_t *gx = mpr_tensor_grad(x);
    assert_non_null(gx);
    stats_t s = stats(mpr_narrow(gx, tdim, 0, T1));
    assert_true(s.maxabs > 0);
    mpr_scope_end();
    mpr_tensor_release(x);
    mpr_tensor_release(h0);
    mpr_tensor_release(c0);
    mpr_module_destroy(m);
    mpr_generator_destroy(g);
}

static void test_lstm_state_chaining(void **state) {
    check_chaining(true);
    check_chaining(false);
}

/* ------------------------------------------------------ LSTM dropout modes */

static void copy_params(mpr_module_t *dst, mpr_module_t *src) {
    bool prev = mpr_set_grad_enabled(false);
    for (int i = 0; i < mpr_module_num_parameters(src); i++)
        assert_int_equal(mpr_copy_(mpr_module_parameter(dst, i, NULL), mpr_module_parameter(src, i, NULL)),
                         MPR_OK);
    mpr_set_grad_enabled(prev);
}

static void test_lstm_dropout_train_eval(void **state) {
    mpr_generator_t *g = mpr_generator_create(9);
    mpr_module_t *d = mpr_lstm_create(3, 6, 2, true, true, 0.5, MPR_F64, g);
    mpr_module_t *nd = mpr_lstm_create(3, 6, 2, true, true, 0.0, MPR_F64, g);
    mpr_module_t *d1 = mpr_lstm_create(3, 6, 1, true, true, 0.5, MPR_F64, g);
    mpr_module_t *nd1 = mpr_lstm_create(3, 6, 1, true, true, 0.0, MPR_F64, g);
    copy_params(nd, d);
    copy_params(nd1, d1);
    mpr_tensor_t *x = tu_randn(MPR_SHAPE(2, 4, 3), 3, false);
    mpr_scope_begin();
    assert_true(mpr_module_is_training(d));
    mpr_tensor_t *a = mpr_module_forward(d, x), *b = mpr_module_forward(d, x);
    mpr_tensor_t *ref = mpr_module_forward(nd, x);
    assert_non_null(a);
    assert_false(mpr_allclose(a, b, 1e-9, 1e-9)); /* fresh masks between layers */
    assert_false(mpr_allclose(a, ref, 1e-9, 1e-9));
    mpr_module_train(d, false);
    mpr_tensor_t *e1 = mpr_module_forward(d, x), *e2 = mpr_module_forward(d, x);
    assert_true(mpr_allclose(e1, e2, 0, 0));
    assert_true(mpr_allclose(e1, ref, 1e-13, 1e-13));
    /* one layer: no dropout anywhere even in training mode (torch applies it between layers only) */
    assert_true(mpr_module_is_training(d1));
    assert_true(mpr_allclose(mpr_module_forward(d1, x), mpr_module_forward(nd1, x), 0, 0));
    mpr_scope_end();
    mpr_tensor_release(x);
    mpr_module_destroy(d);
    mpr_module_destroy(nd);
    mpr_module_destroy(d1);
    mpr_module_destroy(nd1);
    mpr_generator_destroy(g);
}

/* --------------------------------------------- train/eval through nesting */

static mpr_tensor_t *wrap_forward(mpr_module_t *self, mpr_tensor_t *x, void *ctx) {
    return mpr_module_forward(mpr_module_child(self, "body"), x);
}

static void test_train_eval_nested(void **state) {
    mpr_generator_t *g = mpr_generator_create(4);
    mpr_module_t *inner = mpr_sequential_create();
    mpr_sequential_append(inner, mpr_linear_create(8, 8, true, MPR_F32, g));
    mpr_sequential_append(inner, mpr_tanh_create());
    mpr_sequential_append(inner, mpr_dropout_create(0.5, g));
    mpr_module_t *outer = mpr_sequential_create();
    mpr_sequential_append(outer, mpr_relu_create());
    mpr_sequential_append(outer, inner);
    mpr_module_t *top = mpr_module_create("Wrap", wrap_forward, NULL, NULL);
    assert_int_equal(mpr_module_add_child(top, "body", outer), MPR_OK);
    const char *name;
    mpr_module_parameter(top, 0, &name);
    assert_string_equal(name, "body.1.0.weight");
    mpr_module_t *dm = mpr_sequential_child(inner, 2);
    assert_true(mpr_module_is_training(dm));
    mpr_module_train(top, false);
    assert_false(mpr_module_is_training(dm));
    assert_false(mpr_module_is_training(inner));
    assert_false(mpr_module_is_training(outer));
    mpr_scope_begin();
    mpr_tensor_t *x = mpr_randn(MPR_F32, MPR_SHAPE(4, 8), g);
    assert_true(mpr_allclose(mpr_module_forward(top, x), mpr_module_forward(top, x), 0, 0));
    mpr_module_train(top, true);
    assert_true(mpr_module_is_training(dm));
    assert_false(mpr_allclose(mpr_module_forward(top, x), mpr_module_forward(top, x), 0, 0));
    mpr_scope_end();
    mpr_module_destroy(top);
    mpr_generator_destroy(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_inits),
        cmocka_unit_test(test_lstm_state_chaining),
        cmocka_unit_test(test_lstm_dropout_train_eval),
        cmocka_unit_test(test_train_eval_nested),
    };
    return tu_run_group_no_leaks(tests);
}
