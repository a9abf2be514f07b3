/* test_ref_models.c — small models against PyTorch 1.13: MLP, CNN, 2-layer
 * LSTM (batch_first) + linear, embedding + linear.
 *
 * tests/data/ref_<model>.safetensors (tests/ref/gen_refs.py) holds the
 * PyTorch weights under their state_dict names, the input, the target, the
 * output, the loss and "<param>.grad" for every parameter. The C test builds
 * the same architecture from mpirpc/nn.h modules, loads the weights by name,
 * runs forward + loss + backward and compares output, loss and every
 * parameter gradient (f32: rtol 1e-4, atol 1e-5). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "mpirpc/nn.h"
#include "mpirpc/tensor_io.h"
#include "mpirpc/tensor_ops.h"

#define RTOL 1e-4
#define ATOL 1e-5

static mpr_tensor_dict_t *load_ref(const char *model) {
    const char *dir = getenv("MPIRPC_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/ref_%s.safetensors", dir ? dir : "tests/data", model);
    mpr_tensor_dict_t *d = mpr_safetensors_load(path);
    if (!d) fail_msg("cannot load %s: %s", path, mpr_last_error());
    return d;
}

/* Copy the file's "<prefix><name>" into each parameter <name> of m. */
static void load_params(mpr_module_t *m, const mpr_tensor_dict_t *d, const char *prefix) {
    int n = mpr_module_num_parameters(m);
    assert_true(n > 0 && n <= 32);
    char keys[32][96];
    const char *names[32];
    mpr_tensor_t *ts[32];
    for (int i = 0; i < n; i++) {
        const char *pname;
        ts[i] = mpr_module_parameter(m, i, &pname);
        snprintf(keys[i], sizeof keys[i], "%s%s", prefix, pname);
        names[i] = keys[i];
    }
    if (mpr_tensor_dict_copy_into(d, (size_t)n, names, ts, false) != MPR_OK)
        fail_msg("loading weights: %s", mpr_last_error());
}

static int check(const char *model, const char *what, mpr_tensor_t *got, mpr_tensor_t *want) {
    if (!got) {
        print_error("%s %s: missing (%s)\n", model, what, mpr_last_error());
        return 1;
    }
    if (!want) {
        print_error("%s %s: no reference\n", model, what);
        return 1;
    }
    if (mpr_allclose(got, want, RTOL, ATOL)) return 0;
    char a[96], b[96];
    print_error("%s %s: mismatch (got %s, want %s)\n", model, what,
                mpr_shape_str(mpr_tensor_ndim(got), mpr_tensor_shape(got), a, sizeof a),
                mpr_shape_str(mpr_tensor_ndim(want), mpr_tensor_shape(want), b, sizeof b));
    return 1;
}

/* Compare loss and every parameter's gradient with the file's "<prefix><name>.grad". */
static int check_grads(const char *model, mpr_module_t *m, const mpr_tensor_dict_t *d, const char *prefix) {
    int bad = 0;
    for (int i = 0; i < mpr_module_num_parameters(m); i++) {
        const char *pname;
        mpr_tensor_t *p = mpr_module_parameter(m, i, &pname);
        char key[128];
        snprintf(key, sizeof key, "%s%s.grad", prefix, pname);
        bad += check(model, key, mpr_tensor_grad(p), mpr_tensor_dict_get(d, key));
    }
    return bad;
}

static mpr_module_t *seq(mpr_module_t **children, int n) {
    mpr_module_t *s = mpr_sequential_create();
    assert_non_null(s);
    for (int i = 0; i < n; i++) {
        assert_non_null(children[i]);
        assert_int_equal(mpr_sequential_append(s, children[i]), MPR_OK);
    }
    return s;
}

static void test_mlp(void **state) {
    int64_t live = mpr_tensor_live_count();
    mpr_tensor_dict_t *d = load_ref("mlp");
    mpr_module_t *m = seq((mpr_module_t *[]){mpr_linear_create(12, 16, true, MPR_F32, NULL), mpr_relu_create(),
                                             mpr_linear_create(16, 10, true, MPR_F32, NULL)},
                          3);
    load_params(m, d, "");
    mpr_scope_begin();
    mpr_tensor_t *y = mpr_module_forward(m, mpr_tensor_dict_get(d, "input"));
    mpr_tensor_t *loss = mpr_cross_entropy(y, mpr_tensor_dict_get(d, "target"));
    int bad = check("mlp", "output", y, mpr_tensor_dict_get(d, "output"));
    bad += check("mlp", "loss", loss, mpr_tensor_dict_get(d, "loss"));
    assert_int_equal(mpr_backward(loss, NULL, false), MPR_OK);
    bad += check_grads("mlp", m, d, "");
    mpr_scope_end();
    assert_int_equal(bad, 0);
    mpr_module_destroy(m);
    mpr_tensor_dict_destroy(d);
    assert_int_equal(mpr_tensor_live_count(), live);
}

static void test_cnn(void **state) {
    int64_t live = mpr_tensor_live_count();
    mpr_tensor_dict_t *d = load_ref("cnn");
    mpr_module_t *m = seq(
        (mpr_module_t *[]){mpr_conv2d_create(1, 4, 3, 3, 1, 1, true, MPR_F32, NULL), mpr_relu_create(),
                           mpr_max_pool2d_create(2, 0), mpr_conv2d_create(4, 8, 3, 3, 1, 1, true, MPR_F32, NULL),
                           mpr_relu_create(), mpr_max_pool2d_create(2, 0), mpr_flatten_create(1, -1),
                           mpr_linear_create(72, 10, true, MPR_F32, NULL)},
        8);
    load_params(m, d, "");
    mpr_scope_begin();
    mpr_tensor_t *y = mpr_module_forward(m, mpr_tensor_dict_get(d, "input"));
    mpr_tensor_t *loss = mpr_cross_entropy(y, mpr_tensor_dict_get(d, "target"));
    int bad = check("cnn", "output", y, mpr_tensor_dict_get(d, "output"));
    bad += check("cnn", "loss", loss, mpr_tensor_dict_get(d, "loss"));
    assert_int_equal(mpr_backward(loss, NULL, false), MPR_OK);
    bad += check_grads("cnn", m, d, "");
    mpr_scope_end();
    assert_int_equal(bad, 0);
    mpr_module_destroy(m);
    mpr_tensor_dict_destroy(d);
    assert_int_equal(mpr_tensor_live_count(), live);
}

static void test_lstm(void **state) {
    int64_t live = mpr_tensor_live_count();
    mpr_tensor_dict_t *d = load_ref("lstm");
    mpr_module_t *lstm = mpr_lstm_create(4, 6, 2, true, true, 0.0, MPR_F32, NULL);
    mpr_module_t *fc = mpr_linear_create(6, 3, true, MPR_F32, NULL);
    assert_non_null(lstm);
    assert_non_null(fc);
    load_params(lstm, d, "lstm.");
    load_params(fc, d, "fc.");
    mpr_scope_begin();
    mpr_tensor_t *h = NULL;
    assert_int_equal(mpr_lstm_forward(lstm, mpr_tensor_dict_get(d, "input"), NULL, NULL, &h, NULL, NULL), MPR_OK);
    mpr_tensor_t *y = mpr_module_forward(fc, h);
    mpr_tensor_t *loss = mpr_mse_loss(y, mpr_tensor_dict_get(d, "target"));
    int bad = check("lstm", "output", y, mpr_tensor_dict_get(d, "output"));
    bad += check("lstm", "loss", loss, mpr_tensor_dict_get(d, "loss"));
    assert_int_equal(mpr_backward(loss, NULL, false), MPR_OK);
    bad += check_grads("lstm", lstm, d, "lstm.");
    bad += check_grads("lstm", fc, d, "fc.");
    mpr_scope_end();
    assert_int_equal(bad, 0);
    mpr_module_destroy(lstm);
    mpr_module_destroy(fc);
    mpr_tensor_dict_destroy(d);
    assert_int_equal(mpr_tensor_live_count(), live);
}

/* Time-major 2-layer LSTM with (h0, c0) given; the loss uses output, hn and cn,
 * so gradients also flow to h0 and c0. */
static void test_lstm_state(void **state) {
    int64_t live = mpr_tensor_live_count();
    mpr_tensor_dict_t *d = load_ref("lstm_state");
    mpr_module_t *lstm = mpr_lstm_create(3, 4, 2, true, false, 0.0, MPR_F32, NULL);
    assert_non_null(lstm);
    load_params(lstm, d, "");
    mpr_scope_begin();
    mpr_tensor_t *h0 = mpr_clone(mpr_tensor_dict_get(d, "h0")), *c0 = mpr_clone(mpr_tensor_dict_get(d, "c0"));
    assert_int_equal(mpr_set_requires_grad(h0, true), MPR_OK);
    assert_int_equal(mpr_set_requires_grad(c0, true), MPR_OK);
    mpr_tensor_t *y = NULL, *hn = NULL, *cn = NULL;
    assert_int_equal(mpr_lstm_forward(lstm, mpr_tensor_dict_get(d, "input"), h0, c0, &y, &hn, &cn), MPR_OK);
    mpr_tensor_t *loss = mpr_add(mpr_add(mpr_mean(mpr_pow(y, 2.0)), mpr_mul_scalar(mpr_sum(hn), 0.1)),
                                 mpr_mul_scalar(mpr_sum(mpr_pow(cn, 2.0)), 0.1));
    int bad = check("lstm_state", "output", y, mpr_tensor_dict_get(d, "output"));
    bad += check("lstm_state", "hn", hn, mpr_tensor_dict_get(d, "hn"));
    bad += check("lstm_state", "cn", cn, mpr_tensor_dict_get(d, "cn"));
    bad += check("lstm_state", "loss", loss, mpr_tensor_dict_get(d, "loss"));
    assert_int_equal(mpr_backward(loss, NULL, false), MPR_OK);
    bad += check_grads("lstm_state", lstm, d, "");
    bad += check("lstm_state", "h0.grad", mpr_tensor_grad(h0), mpr_tensor_dict_get(d, "h0.grad"));
    bad += check("lstm_state", "c0.grad", mpr_tensor_grad(c0), mpr_tensor_dict_get(d, "c0.grad"));
    mpr_scope_end();
    assert_int_equal(bad, 0);
    mpr_module_destroy(lstm);
    mpr_tensor_dict_destroy(d);
    assert_int_equal(mpr_tensor_live_count(), live);
}

static void test_emb_linear(void **state) {
    int64_t live = mpr_tensor_live_count();
    mpr_tensor_dict_t *d = load_ref("emb_linear");
    mpr_module_t *emb = mpr_embedding_create(20, 8, MPR_F32, NULL);
    mpr_module_t *fc = mpr_linear_create(8, 5, true, MPR_F32, NULL);
    assert_non_null(emb);
    assert_non_null(fc);
    load_params(emb, d, "emb.");
    load_params(fc, d, "fc.");
    mpr_scope_begin();
    mpr_tensor_t *y = mpr_module_forward(fc, mpr_module_forward(emb, mpr_tensor_dict_get(d, "input")));
    mpr_tensor_t *loss = mpr_cross_entropy(mpr_reshape(y, 2, (const int64_t[]){-1, 5}), mpr_tensor_dict_get(d, "target"));
    int bad = check("emb_linear", "output", y, mpr_tensor_dict_get(d, "output"));
    bad += check("emb_linear", "loss", loss, mpr_tensor_dict_get(d, "loss"));
    assert_int_equal(mpr_backward(loss, NULL, false), MPR_OK);
    bad += check_grads("emb_linear", emb, d, "emb.");
    bad += check_grads("emb_linear", fc, d, "fc.");
    mpr_scope_end();
    assert_int_equal(bad, 0);
    mpr_module_destroy(emb);
    mpr_module_destroy(fc);
    mpr_tensor_dict_destroy(d);
    assert_int_equal(mpr_tensor_live_count(), live);
}

/* A module's parameters survive a save/load round trip through .safetensors,
 * and loading PyTorch's file by state_dict names works with strict=false only
 * (the file also holds inputs and gradients). */
static void test_module_save_load(void **state) {
    int64_t live = mpr_tensor_live_count();
    mpr_generator_t *g = mpr_generator_create(5);
    mpr_module_t *a = seq((mpr_module_t *[]){mpr_linear_create(12, 16, true, MPR_F32, g), mpr_relu_create(),
                                             mpr_linear_create(16, 10, true, MPR_F32, g)},
                          3);
    mpr_module_t *b = seq((mpr_module_t *[]){mpr_linear_create(12, 16, true, MPR_F32, g), mpr_relu_create(),
                                             mpr_linear_create(16, 10, true, MPR_F32, g)},
                          3);
    char path[] = "/tmp/mpirpc_mod_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(mpr_module_save_safetensors(a, path), MPR_OK);
    assert_false(mpr_allclose(mpr_module_parameter(a, 0, NULL), mpr_module_parameter(b, 0, NULL), 0, 0));
    assert_int_equal(mpr_module_load_safetensors(b, path, true), MPR_OK);
    for (int i = 0; i < mpr_module_num_parameters(a); i++)
        assert_true(mpr_allclose(mpr_module_parameter(a, i, NULL), mpr_module_parameter(b, i, NULL), 0, 0));
    /* A differently shaped model is refused with the parameter's name. */
    mpr_module_t *c = seq((mpr_module_t *[]){mpr_linear_create(12, 8, true, MPR_F32, g)}, 1);
    assert_int_equal(mpr_module_load_safetensors(c, path, false), MPR_ERR_SHAPE);
    assert_non_null(strstr(mpr_last_error(), "0.weight"));
    /* PyTorch's file: strict fails on the extra entries, non-strict loads. */
    const char *dir = getenv("MPIRPC_TEST_DATA");
    char ref[1024];
    snprintf(ref, sizeof ref, "%s/ref_mlp.safetensors", dir ? dir : "tests/data");
    assert_int_equal(mpr_module_load_safetensors(b, ref, true), MPR_ERR_NOT_FOUND);
    assert_int_equal(mpr_module_load_safetensors(b, ref, false), MPR_OK);
    unlink(path);
    mpr_module_destroy(a);
    mpr_module_destroy(b);
    mpr_module_destroy(c);
    mpr_generator_destroy(g);
    assert_int_equal(mpr_tensor_live_count(), live);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp),         cmocka_unit_test(test_cnn),
        cmocka_unit_test(test_lstm),        cmocka_unit_test(test_lstm_state),
        cmocka_unit_test(test_emb_linear),
        cmocka_unit_test(test_module_save_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
