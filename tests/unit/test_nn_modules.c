/* test_nn_modules.c — nn modules: PyTorch-style parameter names and order,
 * iteration and lookup, default initialization ranges and seeding, train/eval
 * propagation, zero_grad, forward of each layer, LSTM values against PyTorch
 * 1.13 (same parameters set in both), LSTM f64 gradient check through time
 * and layers, custom modules (PyTorch's word_language_model RNNModel with its
 * state_dict names), and argument errors. Also: PyTorch's default inits as
 * distributions, not only as bounds (Linear/Conv2d U(-1/sqrt(fan_in),
 * 1/sqrt(fan_in)), LSTM U(-1/sqrt(H), 1/sqrt(H)): max near the bound, std
 * bound/sqrt(3), mean near 0); LSTM hidden state chaining (two halves fed
 * (hn, cn) equal one run, batch-first and time-major, gradients reaching the
 * first half); the LSTM's inter-layer dropout in train/eval (none for one
 * layer, as PyTorch); train/eval reaching modules nested in Sequentials and
 * custom modules. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "nn_test_util.h"

static double max_abs(mpr_tensor_t *t) {
    double m = 0;
    mpr_scope_begin();
    mpr_tensor_t *c = mpr_to_dtype(t, MPR_F64);
    const double *d = mpr_tensor_data(c);
    for (int64_t i = 0; i < mpr_tensor_numel(c); i++) m = fmax(m, fabs(d[i]));
    mpr_scope_end();
    return m;
}

static void test_sequential_names(void **state) {
    mpr_generator_t *g = mpr_generator_create(1);
    mpr_module_t *seq = mpr_sequential_create();
    assert_int_equal(mpr_sequential_append(seq, mpr_linear_create(4, 3, true, MPR_F32, g)), MPR_OK);
    assert_int_equal(mpr_sequential_append(seq, mpr_relu_create()), MPR_OK);
    assert_int_equal(mpr_sequential_append(seq, mpr_linear_create(3, 2, false, MPR_F32, g)), MPR_OK);
    mpr_module_t *inner = mpr_sequential_create();
    assert_int_equal(mpr_sequential_append(inner, mpr_tanh_create()), MPR_OK);
    assert_int_equal(mpr_sequential_append(inner, mpr_linear_create(2, 5, true, MPR_F32, g)), MPR_OK);
    assert_int_equal(mpr_sequential_append(seq, inner), MPR_OK);
    const char *want[] = {"0.weight", "0.bias", "2.weight", "3.1.weight", "3.1.bias"};
    assert_int_equal(mpr_module_num_parameters(seq), 5);
    for (int i = 0; i < 5; i++) {
        const char *name;
        mpr_tensor_t *p = mpr_module_parameter(seq, i, &name);
        assert_non_null(p);
        assert_string_equal(name, want[i]);
        assert_true(mpr_requires_grad(p) && mpr_is_leaf(p));
        assert_ptr_equal(mpr_module_get_parameter(seq, want[i]), p);
    }
    assert_null(mpr_module_parameter(seq, 5, NULL));
    assert_int_equal(mpr_module_parameter_numel(seq), 12 + 3 + 6 + 10 + 5);
    assert_null(mpr_module_get_parameter(seq, "1.weight"));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_NOT_FOUND);
    assert_int_equal(mpr_tensor_shape(mpr_module_get_parameter(seq, "3.1.weight"))[0], 5);
    assert_int_equal(mpr_sequential_size(seq), 4);
    assert_string_equal(mpr_module_kind(mpr_sequential_child(seq, 1)), "ReLU");
    /* a child that already has a parent is refused and left alone */
    assert_int_equal(mpr_sequential_append(seq, inner), MPR_ERR_STATE);
    assert_int_equal(mpr_sequential_size(seq), 4);
    /* forward: [6, 4] -> [6, 5], equal to composing the ops by hand */
    mpr_scope_begin();
    mpr_tensor_t *x = mpr_randn(MPR_F32, MPR_SHAPE(6, 4), g);
    mpr_tensor_t *y = mpr_module_forward(seq, x);
    assert_non_null(y);
    assert_int_equal(mpr_tensor_shape(y)[1], 5);
    mpr_tensor_t *h = mpr_linear(mpr_relu(mpr_linear(x, mpr_module_get_parameter(seq, "0.weight"),
                                                    mpr_module_get_parameter(seq, "0.bias"))),
                                 mpr_module_get_parameter(seq, "2.weight"), NULL);
    mpr_tensor_t *ref = mpr_linear(mpr_tanh(h), mpr_module_get_parameter(seq, "3.1.weight"),
                                   mpr_module_get_parameter(seq, "3.1.bias"));
    assert_true(mpr_allclose(y, ref, 1e-6, 1e-6));
    /* zero_grad drops every .grad */
    assert_int_equal(mpr_backward(mpr_sum(y), NULL, false), MPR_OK);
    mpr_scope_end();
    for (int i = 0; i < 5; i++) assert_non_null(mpr_tensor_grad(mpr_module_parameter(seq, i, NULL)));
    mpr_module_zero_grad(seq);
    for (int i = 0; i < 5; i++) assert_null(mpr_tensor_grad(mpr_module_parameter(seq, i, NULL)));
    /* errors in the middle of a Sequential propagate */
    mpr_scope_begin();
    TU_EXPECT_ERR(mpr_module_forward(seq, mpr_zeros(MPR_F32, MPR_SHAPE(6, 5))), MPR_ERR_SHAPE,
                  "linear");
    mpr_scope_end();
    mpr_module_destroy(seq);
    mpr_module_destroy(NULL);
    mpr_generator_destroy(g);
}

static void test_init(void **state) {
    mpr_generator_t *g = mpr_generator_create(5);
    mpr_module_t *lin = mpr_linear_create(400, 300, true, MPR_F32, g);
    double bound = 1.0 / sqrt(400.0);
    mpr_tensor_t *w = mpr_module_get_parameter(lin, "weight");
    assert_true(max_abs(w) <= bound && max_abs(w) > 0.95 * bound);
    assert_true(max_abs(mpr_module_get_parameter(lin, "bias")) <= bound);
    mpr_module_t *conv = mpr_conv2d_create(3, 8, 5, 5, 1, 0, true, MPR_F64, g);
    double cb = 1.0 / sqrt(3.0 * 25);
    mpr_tensor_t *cw = mpr_module_get_parameter(conv, "weight");
    assert_int_equal(mpr_tensor_ndim(cw), 4);
    assert_true(max_abs(cw) <= cb && max_abs(cw) > 0.9 * cb);
    mpr_module_t *emb = mpr_embedding_create(1000, 20, MPR_F64, g);
    mpr_tensor_t *ew = mpr_module_get_parameter(emb, "weight");
    const double *ed = mpr_tensor_data(ew);
    double s = 0, s2 = 0;
    for (int i = 0; i < 20000; i++) {
        s += ed[i];
        s2 += ed[i] * ed[i];
    }
    assert_true(fabs(s / 20000) < 0.05 && fabs(sqrt(s2 / 20000) - 1.0) < 0.05);
    mpr_module_t *lstm = mpr_lstm_create(3, 16, 1, true, false, 0, MPR_F32, g);
    for (int i = 0; i < mpr_module_num_parameters(lstm); i++)
        assert_true(max_abs(mpr_module_parameter(lstm, i, NULL)) <= 0.25);
    /* same seed, same model */
    mpr_generator_t *g1 = mpr_generator_create(42), *g2 = mpr_generator_create(42);
    mpr_module_t *a = mpr_linear_create(5, 4, true, MPR_F32, g1), *b = mpr_linear_create(5, 4, true, MPR_F32, g2);
    for (int i = 0; i < 2; i++)
        assert_true(mpr_allclose(mpr_module_parameter(a, i, NULL), mpr_module_parameter(b, i, NULL), 0, 0));
    /* bad configurations */
    assert_null(mpr_linear_create(0, 3, true, MPR_F32, g));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_INVALID_ARG);
    assert_null(mpr_linear_create(3, 3, true, MPR_I64, g));
    assert_null(mpr_dropout_create(1.0, NULL));
    assert_null(mpr_lstm_create(3, 4, 0, true, false, 0, MPR_F32, g));
    mpr_module_destroy(a);
    mpr_module_destroy(b);
    mpr_module_destroy(lin);
    mpr_module_destroy(conv);
    mpr_module_destroy(emb);
    mpr_module_destroy(lstm);
    mpr_generator_destroy(g);
    mpr_generator_destroy(g1);
    mpr_generator_destroy(g2);
}

static void test_train_eval_layers(void **state) {
    mpr_generator_t *g = mpr_generator_create(3);
    mpr_module_t *net = mpr_sequential_create();
    mpr_sequential_append(net, mpr_conv2d_create(1, 4, 3, 3, 1, 1, true, MPR_F32, g));
    mpr_sequential_append(net, mpr_relu_create());
    mpr_sequential_append(net, mpr_max_pool2d_create(2, 0));
    mpr_sequential_append(net, mpr_dropout_create(0.5, g));
    mpr_sequential_append(net, mpr_flatten_create(1, -1));
    mpr_sequential_append(net, mpr_linear_create(4 * 4 * 4, 3, true, MPR_F32, g));
    mpr_sequential_append(net, mpr_log_softmax_create(1));
    assert_true(mpr_module_is_training(net));
    assert_true(mpr_module_is_training(mpr_sequential_child(net, 3)));
    mpr_module_train(net, false);
    assert_false(mpr_module_is_training(mpr_sequential_child(net, 3)));
    mpr_scope_begin();
    mpr_tensor_t *x = mpr_randn(MPR_F32, MPR_SHAPE(2, 1, 8, 8), g);
    mpr_tensor_t *y1 = mpr_module_forward(net, x), *y2 = mpr_module_forward(net, x);
    assert_non_null(y1);
    assert_int_equal(mpr_tensor_shape(y1)[1], 3);
    assert_true(mpr_allclose(y1, y2, 0, 0)); /* eval: deterministic */
    mpr_module_train(net, true);
    mpr_tensor_t *y3 = mpr_module_forward(net, x), *y4 = mpr_module_forward(net, x);
    assert_false(mpr_allclose(y3, y4, 0, 0)); /* train: dropout masks differ */
    /* Embedding module */
    mpr_module_t *emb = mpr_embedding_create(7, 2, MPR_F32, g);
    mpr_tensor_t *idx = tu_i64(MPR_SHAPE(3), (int64_t[]){6, 0, 6}); /* scope-owned */
    mpr_tensor_t *e = mpr_module_forward(emb, idx);
    assert_int_equal(mpr_tensor_shape(e)[0], 3);
    const float *ed = mpr_tensor_data(e), *wd = mpr_tensor_data(mpr_module_get_parameter(emb, "weight"));
    assert_true(ed[0] == wd[12] && ed[3] == wd[1]);
    mpr_scope_end();
    mpr_module_destroy(emb);
    mpr_module_destroy(net);
    mpr_generator_destroy(g);
}

/* Parameters filled like the PyTorch reference: 0.3 * sin(k + offset), k
 * counting through all parameters in named order. */
static void fill_like_reference(mpr_module_t *m) {
    int64_t off = 0;
    for (int i = 0; i < mpr_module_num_parameters(m); i++) {
        mpr_tensor_t *p = mpr_module_parameter(m, i, NULL);
        double *d = mpr_tensor_data(p);
        for (int64_t k = 0; k < mpr_tensor_numel(p); k++) d[k] = 0.3 * sin((double)(k + off));
        off += mpr_tensor_numel(p);
    }
}

static mpr_tensor_t *seq_tensor(int ndim, const int64_t *shape, double scale, bool use_cos) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    double v[64];
    for (int64_t i = 0; i < n; i++) v[i] = scale * (use_cos ? cos((double)i) : sin((double)i));
    return mpr_from_buffer(MPR_F64, ndim, shape, v);
}

static void test_lstm_values(void **state) {
    mpr_module_t *m = mpr_lstm_create(3, 4, 2, true, true, 0.0, MPR_F64, NULL);
    assert_non_null(m);
    const char *names[] = {"weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0",
                           "weight_ih_l1", "weight_hh_l1", "bias_ih_l1", "bias_hh_l1"};
    assert_int_equal(mpr_module_num_parameters(m), 8);
    for (int i = 0; i < 8; i++) {
        const char *n;
        mpr_module_parameter(m, i, &n);
        assert_string_equal(n, names[i]);
    }
    assert_int_equal(mpr_tensor_shape(mpr_module_get_parameter(m, "weight_ih_l1"))[1], 4);
    fill_like_reference(m);
    mpr_tensor_t *x = seq_tensor(MPR_SHAPE(2, 5, 3), 1.0, true);
    mpr_tensor_t *h0 = seq_tensor(MPR_SHAPE(2, 2, 4), 0.2, false);
    mpr_tensor_t *c0 = seq_tensor(MPR_SHAPE(2, 2, 4), 0.2, true);
    mpr_scope_begin();
    mpr_tensor_t *o, *h, *c;
    assert_int_equal(mpr_lstm_forward(m, x, h0, c0, &o, &h, &c), MPR_OK);
    assert_int_equal(mpr_tensor_shape(o)[0], 2);
    assert_int_equal(mpr_tensor_shape(o)[1], 5);
    double s;
    assert_int_equal(mpr_item(mpr_sum(o), &s), MPR_OK);
    assert_true(fabs(s - -0.26981325054481176) < 1e-12);
    const double *od = mpr_tensor_data(mpr_contiguous(o));
    const double o14[4] = {0.051923713458394825, -0.0053730161888816295, -0.042683013885573294,
                           -0.026597656118505168};
    for (int j = 0; j < 4; j++) assert_true(fabs(od[(1 * 5 + 4) * 4 + j] - o14[j]) < 1e-13);
    assert_int_equal(mpr_item(mpr_sum(h), &s), MPR_OK);
    assert_true(fabs(s - 0.018364139058618615) < 1e-12);
    assert_int_equal(mpr_item(mpr_sum(c), &s), MPR_OK);
    assert_true(fabs(s - -0.043712122431548595) < 1e-12);
    const double *cd = mpr_tensor_data(c);
    const double c10[4] = {0.09611582068672989, -0.02148402511912177, -0.07943790676139473,
                           -0.05700893099610266};
    for (int j = 0; j < 4; j++) assert_true(fabs(cd[(1 * 2 + 0) * 4 + j] - c10[j]) < 1e-13);
    /* zero initial state, and the generic forward */
    assert_int_equal(mpr_lstm_forward(m, x, NULL, NULL, NULL, &h, &c), MPR_OK);
    assert_int_equal(mpr_item(mpr_sum(h), &s), MPR_OK);
    assert_true(fabs(s - 0.014978142429361095) < 1e-12);
    assert_int_equal(mpr_item(mpr_sum(c), &s), MPR_OK);
    assert_true(fabs(s - -0.05216957082584056) < 1e-12);
    assert_int_equal(mpr_item(mpr_sum(mpr_module_forward(m, x)), &s), MPR_OK);
    assert_true(fabs(s - -0.2413989492738625) < 1e-12);
    /* errors (tensors made inside the scope are owned by it) */
    mpr_tensor_t *bad = mpr_zeros(MPR_F64, MPR_SHAPE(2, 5, 4));
    assert_int_equal(mpr_lstm_forward(m, bad, NULL, NULL, &o, NULL, NULL), MPR_ERR_SHAPE);
    assert_non_null(strstr(mpr_last_error(), "expected input [B, T, 3], got [2, 5, 4]"));
    assert_int_equal(mpr_lstm_forward(m, x, h0, NULL, &o, NULL, NULL), MPR_ERR_INVALID_ARG);
    assert_int_equal(mpr_lstm_forward(m, x, c0, mpr_zeros(MPR_F64, MPR_SHAPE(2, 3, 4)), &o, NULL, NULL),
                     MPR_ERR_SHAPE);
    assert_non_null(strstr(mpr_last_error(), "c0 must be [2, 2, 4], got [2, 3, 4]"));
    mpr_tensor_t *xf = mpr_zeros(MPR_F32, MPR_SHAPE(2, 5, 3));
    assert_int_equal(mpr_lstm_forward(m, xf, NULL, NULL, &o, NULL, NULL), MPR_ERR_DTYPE);
    mpr_scope_end();
    mpr_tensor_release(x);
    mpr_tensor_release(h0);
    mpr_tensor_release(c0);
    mpr_module_destroy(m);
}

static mpr_tensor_t *f_lstm(mpr_tensor_t **in, void *ctx) {
    mpr_tensor_t *o, *h, *c;
    if (mpr_lstm_forward(ctx, in[0], in[1], in[2], &o, &h, &c) != MPR_OK) return NULL;
    mpr_tensor_t *parts[3] = {mpr_flatten(o, 0, -1), mpr_flatten(h, 0, -1), mpr_flatten(c, 0, -1)};
    return mpr_cat(parts, 3, 0);
}

static void test_lstm_grad(void **state) {
    mpr_generator_t *g = mpr_generator_create(11);
    for (int bf = 0; bf < 2; bf++) {
        mpr_module_t *m = mpr_lstm_create(2, 3, 2, true, bf, 0.0, MPR_F64, g);
        mpr_tensor_t *in[11];
        in[0] = tu_randn(3, bf ? (int64_t[]){2, 4, 2} : (int64_t[]){4, 2, 2}, 1, true);
        in[1] = tu_randn(MPR_SHAPE(2, 2, 3), 2, true);
        in[2] = tu_randn(MPR_SHAPE(2, 2, 3), 3, true);
        for (int i = 0; i < 8; i++) in[3 + i] = mpr_tensor_retain(mpr_module_parameter(m, i, NULL));
        TU_GRADCHECK("lstm", f_lstm, m, 11, in, 1e-7, 1e-5);
        for (int i = 0; i < 11; i++) mpr_tensor_release(in[i]);
        mpr_module_destroy(m);
    }
    mpr_generator_destroy(g);
}

static mpr_tensor_t *f_cell(mpr_tensor_t **in, void *ctx) {
    mpr_tensor_t *h, *c;
    if (mpr_lstm_cell(in[0], in[1], &h, &c) != MPR_OK) return NULL;
    if (*(int *)ctx == 1) return h; /* c unused: its gradient is zero */
    if (*(int *)ctx == 2) return c;
    return mpr_cat((mpr_tensor_t *[]){h, c}, 2, 1);
}

static void test_lstm_cell(void **state) {
    mpr_tensor_t *in[2] = {tu_randn(MPR_SHAPE(3, 8), 21, true), tu_randn(MPR_SHAPE(3, 2), 22, true)};
    for (int mode = 0; mode < 3; mode++) TU_GRADCHECK("lstm_cell", f_cell, &mode, 2, in, 1e-8, 1e-6);
    /* values: h = o * tanh(f * c + i * g) by hand for row 0, unit 1 */
    mpr_tensor_t *h, *c;
    mpr_scope_begin();
    assert_int_equal(mpr_lstm_cell(in[0], in[1], &h, &c), MPR_OK);
    const double *G = mpr_tensor_data(in[0]), *cp = mpr_tensor_data(in[1]);
    double i = 1 / (1 + exp(-G[1])), f = 1 / (1 + exp(-G[3])), g = tanh(G[5]),
           o = 1 / (1 + exp(-G[7]));
    double cn = f * cp[1] + i * g;
    assert_true(fabs(((double *)mpr_tensor_data(c))[1] - cn) < 1e-15);
    assert_true(fabs(((double *)mpr_tensor_data(h))[1] - o * tanh(cn)) < 1e-15);
    assert_int_equal(mpr_lstm_cell(in[1], in[1], &h, &c), MPR_ERR_SHAPE);
    assert_non_null(strstr(mpr_last_error(), "gates [B, 4H] and c_prev [B, H], got [3, 2] and [3, 2]"));
    assert_null(h);
    mpr_scope_end();
    mpr_tensor_release(in[0]);
    mpr_tensor_release(in[1]);
}

/* PyTorch's word_language_model RNNModel: encoder -> rnn -> decoder. */
static mpr_tensor_t *rnn_model_forward(mpr_module_t *self, mpr_tensor_t *tokens, void *ctx) {
    int *calls = ctx;
    (*calls)++;
    mpr_tensor_t *emb = mpr_module_forward(mpr_module_child(self, "encoder"), tokens);
    mpr_tensor_t *out = mpr_module_forward(mpr_module_child(self, "rnn"), emb);
    return mpr_module_forward(mpr_module_child(self, "decoder"), out);
}

static void test_custom_module(void **state) {
    mpr_generator_t *g = mpr_generator_create(17);
    int *calls = calloc(1, sizeof *calls);
    mpr_module_t *m = mpr_module_create("RNNModel", rnn_model_forward, calls, free);
    assert_string_equal(mpr_module_kind(m), "RNNModel");
    assert_ptr_equal(mpr_module_ctx(m), calls);
    assert_int_equal(mpr_module_add_child(m, "encoder", mpr_embedding_create(10, 4, MPR_F32, g)), MPR_OK);
    assert_int_equal(mpr_module_add_child(m, "rnn", mpr_lstm_create(4, 5, 2, true, false, 0.0, MPR_F32, g)), MPR_OK);
    assert_int_equal(mpr_module_add_child(m, "decoder", mpr_linear_create(5, 10, true, MPR_F32, g)), MPR_OK);
    mpr_tensor_t *extra = mpr_zeros(MPR_F32, MPR_SHAPE(3));
    assert_int_equal(mpr_module_add_parameter(m, "scale", extra), MPR_OK);
    const char *want[] = {"scale", "encoder.weight", "rnn.weight_ih_l0", "rnn.weight_hh_l0",
                          "rnn.bias_ih_l0", "rnn.bias_hh_l0", "rnn.weight_ih_l1", "rnn.weight_hh_l1",
                          "rnn.bias_ih_l1", "rnn.bias_hh_l1", "decoder.weight", "decoder.bias"};
    assert_int_equal(mpr_module_num_parameters(m), 12);
    for (int i = 0; i < 12; i++) {
        const char *n;
        mpr_module_parameter(m, i, &n);
        assert_string_equal(n, want[i]);
    }
    assert_true(mpr_requires_grad(extra));
    /* bad names and duplicates; built-in layers take no children/parameters */
    assert_int_equal(mpr_module_add_parameter(m, "scale", extra), MPR_ERR_EXISTS);
    assert_int_equal(mpr_module_add_child(m, "rnn", mpr_relu_create()), MPR_ERR_EXISTS);
    assert_int_equal(mpr_module_add_child(m, "a.b", mpr_relu_create()), MPR_ERR_INVALID_ARG);
    assert_int_equal(mpr_module_add_parameter(mpr_module_child(m, "decoder"), "w2", extra),
                     MPR_ERR_INVALID_ARG);
    assert_int_equal(mpr_module_add_child(mpr_module_child(m, "decoder"), "x", mpr_relu_create()),
                     MPR_ERR_INVALID_ARG);
    assert_null(mpr_module_child(m, "nope"));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_NOT_FOUND);
    /* forward [T=3, B=2] tokens -> [3, 2, 10]; gradients reach the encoder */
    mpr_scope_begin();
    mpr_tensor_t *tok = tu_i64(MPR_SHAPE(3, 2), (int64_t[]){1, 2, 3, 4, 5, 9});
    mpr_tensor_t *y = mpr_module_forward(m, tok);
    assert_non_null(y);
    assert_int_equal(mpr_tensor_shape(y)[2], 10);
    assert_int_equal(*calls, 1);
    mpr_tensor_t *tgt = tu_i64(MPR_SHAPE(6), (int64_t[]){2, 3, 4, 5, 6, 0});
    assert_int_equal(mpr_backward(mpr_cross_entropy(mpr_reshape(y, 2, (int64_t[]){6, 10}), tgt),
                                  NULL, false), MPR_OK);
    mpr_scope_end();
    const float *ge = mpr_tensor_data(mpr_tensor_grad(mpr_module_get_parameter(m, "encoder.weight")));
    assert_true(ge[9 * 4] != 0.0f && ge[0] == 0.0f); /* token 9 used, token 0 not */
    assert_non_null(mpr_tensor_grad(mpr_module_get_parameter(m, "rnn.weight_hh_l1")));
    mpr_tensor_release(extra);
    mpr_module_destroy(m); /* frees calls through ctx_free */
    mpr_generator_destroy(g);
}

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

/* A built module's parameter accessors from several threads at once, on a
 * module whose flat list was never built (the first calls race to build it):
 * every thread gets the right tensors. Two first calls used to free each
 * other's list (param_server's handlers crashed in strcmp on a NULL name). */
#define RACE_THREADS 8
typedef struct {
    mpr_module_t *m;
    pthread_barrier_t *start;
    mpr_tensor_t *got[3];
    int count;
} race_arg_t;

static void *race_reader(void *p) {
    race_arg_t *a = p;
    pthread_barrier_wait(a->start);
    a->got[0] = mpr_module_get_parameter(a->m, "3.1.weight");
    a->count = mpr_module_num_parameters(a->m);
    a->got[1] = mpr_module_parameter(a->m, 1, NULL);
    a->got[2] = mpr_module_get_parameter(a->m, "0.weight");
    return NULL;
}

static void test_parameters_from_threads(void **state) {
    (void)state;
    mpr_generator_t *g = mpr_generator_create(3);
    for (int round = 0; round < 300; round++) {
        mpr_module_t *seq = mpr_sequential_create(), *inner = mpr_sequential_create();
        assert_int_equal(mpr_sequential_append(seq, mpr_linear_create(4, 3, true, MPR_F32, g)), MPR_OK);
        assert_int_equal(mpr_sequential_append(seq, mpr_relu_create()), MPR_OK);
        assert_int_equal(mpr_sequential_append(seq, mpr_linear_create(3, 2, false, MPR_F32, g)), MPR_OK);
        assert_int_equal(mpr_sequential_append(inner, mpr_tanh_create()), MPR_OK);
        assert_int_equal(mpr_sequential_append(inner, mpr_linear_create(2, 5, true, MPR_F32, g)), MPR_OK);
        assert_int_equal(mpr_sequential_append(seq, inner), MPR_OK);
        /* The expected tensors, read from the children (not through seq's list). */
        mpr_module_t *l0 = mpr_sequential_child(seq, 0), *l31 = mpr_sequential_child(inner, 1);
        mpr_tensor_t *want_w31 = mpr_module_get_parameter(l31, "weight");
        mpr_tensor_t *want_b0 = mpr_module_get_parameter(l0, "bias");
        mpr_tensor_t *want_w0 = mpr_module_get_parameter(l0, "weight");
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, RACE_THREADS);
        pthread_t th[RACE_THREADS];
        race_arg_t args[RACE_THREADS];
        for (int i = 0; i < RACE_THREADS; i++) {
            args[i] = (race_arg_t){.m = seq, .start = &start};
            assert_int_equal(pthread_create(&th[i], NULL, race_reader, &args[i]), 0);
        }
        for (int i = 0; i < RACE_THREADS; i++) pthread_join(th[i], NULL);
        pthread_barrier_destroy(&start);
        for (int i = 0; i < RACE_THREADS; i++) {
            assert_ptr_equal(args[i].got[0], want_w31);
            assert_int_equal(args[i].count, 5);
            assert_ptr_equal(args[i].got[1], want_b0);
            assert_ptr_equal(args[i].got[2], want_w0);
        }
        mpr_module_destroy(seq);
    }
    mpr_generator_destroy(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequential_names), cmocka_unit_test(test_init),
        cmocka_unit_test(test_train_eval_layers), cmocka_unit_test(test_lstm_values),
        cmocka_unit_test(test_lstm_grad),        cmocka_unit_test(test_lstm_cell),
        cmocka_unit_test(test_custom_module),
        cmocka_unit_test(test_default_inits),
        cmocka_unit_test(test_lstm_state_chaining),
        cmocka_unit_test(test_lstm_dropout_train_eval),
        cmocka_unit_test(test_train_eval_nested),
        cmocka_unit_test(test_parameters_from_threads),
    };
    return tu_run_group_no_leaks(tests);
}
