/* test_nn_train.c — end-to-end training on synthetic data: an MLP
 * (Linear-ReLU-Linear, cross entropy, SGD with momentum) learns a random
 * linear teacher's 4-class labels, and a tiny CNN (Conv2d-ReLU-MaxPool2d-
 * Flatten-Linear) learns to tell horizontal from vertical bars; both must cut
 * the loss by a fixed factor and reach a fixed accuracy. Also runs the
 * PyTorch MNIST example's CNN (Conv2d(1,32,3,1) ... log_softmax + nll_loss)
 * for a few steps on random 28x28 inputs, and checks that training loops
 * leave no tensor alive between iterations. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "mpirpc/optim.h"
#include "nn_test_util.h"

static mpr_optimizer_t *make_sgd(mpr_module_t *m, double lr, double momentum) {
    int n = mpr_module_num_parameters(m);
    mpr_tensor_t *ps[16];
    assert_true(n <= 16);
    for (int i = 0; i < n; i++) ps[i] = mpr_module_parameter(m, i, NULL);
    mpr_optimizer_t *o = mpr_sgd_create(ps, n, &(mpr_sgd_options_t){.lr = lr, .momentum = momentum});
    assert_non_null(o);
    return o;
}

/* One step: returns the loss before the update; *acc gets the batch accuracy. */
static double train_step(mpr_module_t *m, mpr_optimizer_t *opt, mpr_tensor_t *x, mpr_tensor_t *y,
                         double *acc) {
    mpr_scope_begin();
    mpr_optimizer_zero_grad(opt);
    mpr_tensor_t *logits = mpr_module_forward(m, x);
    mpr_tensor_t *loss = mpr_cross_entropy(logits, y);
    double l = NAN;
    assert_int_equal(mpr_item(loss, &l), MPR_OK);
    assert_int_equal(mpr_backward(loss, NULL, false), MPR_OK);
    assert_int_equal(mpr_optimizer_step(opt), MPR_OK);
    if (acc) {
        mpr_tensor_t *pred = mpr_argmax(logits, 1, false);
        const int64_t *pd = mpr_tensor_data(pred), *yd = mpr_tensor_data(y);
        int64_t ok = 0, n = mpr_tensor_shape(y)[0];
        for (int64_t i = 0; i < n; i++) ok += pd[i] == yd[i];
        *acc = (double)ok / (double)n;
    }
    mpr_scope_end();
    return l;
}

static void test_mlp_learns(void **state) {
    const int64_t N = 256, D = 20, C = 4;
    mpr_generator_t *g = mpr_generator_create(2024);
    mpr_tensor_t *x = mpr_randn(MPR_F32, MPR_SHAPE(N, D), g);
    mpr_tensor_t *teacher = mpr_randn(MPR_F32, MPR_SHAPE(D, C), g);
    mpr_tensor_t *scores = mpr_matmul(x, teacher);
    mpr_tensor_t *y = mpr_argmax(scores, 1, false);
    mpr_module_t *m = mpr_sequential_create();
    mpr_sequential_append(m, mpr_linear_create(D, 32, true, MPR_F32, g));
    mpr_sequential_append(m, mpr_relu_create());
    mpr_sequential_append(m, mpr_linear_create(32, C, true, MPR_F32, g));
    mpr_optimizer_t *opt = make_sgd(m, 0.1, 0.9);
    int64_t live = mpr_tensor_live_count();
    double first = 0, last = 0, acc = 0;
    for (int it = 0; it < 150; it++) {
        last = train_step(m, opt, x, y, &acc);
        if (it == 0) first = last;
        if (it == 1) live = mpr_tensor_live_count(); /* momentum buffers exist from here */
        if (it > 1) assert_int_equal(mpr_tensor_live_count(), live);
    }
    printf("mlp: loss %.4f -> %.4f, train accuracy %.3f\n", first, last, acc);
    assert_true(first > 1.0);
    assert_true(last < 0.2 * first);
    assert_true(acc >= 0.95);
    mpr_optimizer_destroy(opt);
    mpr_module_destroy(m);
    mpr_tensor_release(x);
    mpr_tensor_release(teacher);
    mpr_tensor_release(scores);
    mpr_tensor_release(y);
    mpr_generator_destroy(g);
}

/* Images [N, 1, 8, 8] of noise plus a bright bar: class 0 horizontal, 1 vertical. */
static void make_bars(int64_t N, mpr_generator_t *g, mpr_tensor_t **x, mpr_tensor_t **y) {
    *x = mpr_uniform(MPR_F32, MPR_SHAPE(N, 1, 8, 8), 0.0, 0.3, g);
    int64_t *labels = malloc(sizeof(int64_t) * (size_t)N);
    float *xd = mpr_tensor_data(*x);
    for (int64_t i = 0; i < N; i++) {
        uint64_t r = mpr_generator_next_u64(g);
        labels[i] = (int64_t)(r & 1);
        int pos = (int)((r >> 8) % 8);
        for (int k = 0; k < 8; k++) {
            int h = labels[i] == 0 ? pos : k, w = labels[i] == 0 ? k : pos;
            xd[i * 64 + h * 8 + w] += 1.0f;
        }
    }
    *y = mpr_from_buffer(MPR_I64, MPR_SHAPE(N), labels);
    free(labels);
}

static void test_cnn_learns(void **state) {
    mpr_generator_t *g = mpr_generator_create(7);
    mpr_tensor_t *x, *y;
    make_bars(64, g, &x, &y);
    mpr_module_t *m = mpr_sequential_create();
    mpr_sequential_append(m, mpr_conv2d_create(1, 4, 3, 3, 1, 1, true, MPR_F32, g));
    mpr_sequential_append(m, mpr_relu_create());
    mpr_sequential_append(m, mpr_max_pool2d_create(2, 2));
    mpr_sequential_append(m, mpr_flatten_create(1, -1));
    mpr_sequential_append(m, mpr_linear_create(4 * 4 * 4, 2, true, MPR_F32, g));
    mpr_optimizer_t *opt = make_sgd(m, 0.05, 0.9);
    double first = 0, last = 0, acc = 0;
    for (int it = 0; it < 60; it++) {
        last = train_step(m, opt, x, y, &acc);
        if (it == 0) first = last;
    }
    /* held-out batch */
    mpr_tensor_t *xt, *yt;
    make_bars(64, g, &xt, &yt);
    mpr_module_train(m, false);
    mpr_scope_begin();
    mpr_tensor_t *pred = mpr_argmax(mpr_module_forward(m, xt), 1, false);
    const int64_t *pd = mpr_tensor_data(pred), *yd = mpr_tensor_data(yt);
    int ok = 0;
    for (int i = 0; i < 64; i++) ok += pd[i] == yd[i];
    mpr_scope_end();
    printf("cnn: loss %.4f -> %.4f, train accuracy %.3f, test accuracy %.3f\n", first, last, acc,
           ok / 64.0);
    assert_true(last < 0.3 * first);
    assert_true(acc >= 0.95);
    assert_true(ok >= 58);
    mpr_optimizer_destroy(opt);
    mpr_module_destroy(m);
    mpr_tensor_release(x);
    mpr_tensor_release(y);
    mpr_tensor_release(xt);
    mpr_tensor_release(yt);
    mpr_generator_destroy(g);
}

static void test_mnist_cnn_runs(void **state) {
    /* PyTorch's examples/mnist Net, as a Sequential, on 8 random images */
    mpr_generator_t *g = mpr_generator_create(1);
    mpr_module_t *m = mpr_sequential_create();
    mpr_sequential_append(m, mpr_conv2d_create(1, 32, 3, 3, 1, 0, true, MPR_F32, g));
    mpr_sequential_append(m, mpr_relu_create());
    mpr_sequential_append(m, mpr_conv2d_create(32, 64, 3, 3, 1, 0, true, MPR_F32, g));
    mpr_sequential_append(m, mpr_relu_create());
    mpr_sequential_append(m, mpr_max_pool2d_create(2, 0));
    mpr_sequential_append(m, mpr_dropout_create(0.25, g));
    mpr_sequential_append(m, mpr_flatten_create(1, -1));
    mpr_sequential_append(m, mpr_linear_create(9216, 128, true, MPR_F32, g));
    mpr_sequential_append(m, mpr_relu_create());
    mpr_sequential_append(m, mpr_dropout_create(0.5, g));
    mpr_sequential_append(m, mpr_linear_create(128, 10, true, MPR_F32, g));
    mpr_sequential_append(m, mpr_log_softmax_create(1));
    const char *names[] = {"0.weight", "0.bias", "2.weight", "2.bias", "7.weight", "7.bias",
                           "10.weight", "10.bias"};
    assert_int_equal(mpr_module_num_parameters(m), 8);
    for (int i = 0; i < 8; i++) {
        const char *n;
        mpr_module_parameter(m, i, &n);
        assert_string_equal(n, names[i]);
    }
    assert_int_equal(mpr_module_parameter_numel(m), 1199882); /* PyTorch's count */
    mpr_tensor_t *x = mpr_rand(MPR_F32, MPR_SHAPE(8, 1, 28, 28), g);
    mpr_tensor_t *y = tu_i64(MPR_SHAPE(8), (int64_t[]){0, 1, 2, 3, 4, 5, 6, 7});
    mpr_optimizer_t *opt = make_sgd(m, 0.01, 0.0);
    double first = 0, last = 0;
    for (int it = 0; it < 8; it++) {
        mpr_scope_begin();
        mpr_optimizer_zero_grad(opt);
        mpr_tensor_t *out = mpr_module_forward(m, x);
        assert_non_null(out);
        assert_int_equal(mpr_tensor_shape(out)[1], 10);
        mpr_tensor_t *loss = mpr_nll_loss(out, y);
        assert_int_equal(mpr_item(loss, &last), MPR_OK);
        if (it == 0) first = last;
        assert_int_equal(mpr_backward(loss, NULL, false), MPR_OK);
        assert_int_equal(mpr_optimizer_step(opt), MPR_OK);
        mpr_scope_end();
    }
    printf("mnist cnn: loss %.4f -> %.4f\n", first, last);
    assert_true(last < first);
    mpr_optimizer_destroy(opt);
    mpr_module_destroy(m);
    mpr_tensor_release(x);
    mpr_tensor_release(y);
    mpr_generator_destroy(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_learns),
        cmocka_unit_test(test_cnn_learns),
        cmocka_unit_test(test_mnist_cnn_runs),
    };
    return tu_run_group_no_leaks(tests);
}
