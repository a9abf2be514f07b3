/* test_tensor_device_dispatch.c — ops run their kernels through the backend
 * of their inputs' device. A counting fake "cuda" backend (host memory,
 * device id 0, CPU kernels underneath) checks that: ops and backward on
 * device-0 tensors go through it and give the CPU results; results stay on
 * the device; mixing devices is refused naming both; host-only functions
 * (item, copy_to_buffer, rand fills) refuse device tensors instead of
 * touching device memory; without a registered backend device tensors are
 * refused with a message. First, the kernels layer's init registers the
 * build's own device backend (CUDA or none) and refuses an incomplete table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "mpirpc/cuda.h"
#include "mpirpc/nn_functional.h"
#include "mpri_autograd.h"

static int calls;

/* The fake device backend: CPU kernels and host memory behind device ids >= 0,
 * counting calls (gemm counts 1000) so the test sees the dispatch. */
static mpr_err_t fake_alloc(int device, size_t nbytes, void **out) {
    calls++;
    return mpri_cpu_backend.alloc(device, nbytes, out);
}
static void fake_free(void *data, int device) { mpri_cpu_backend.free(data, device); }
static mpr_err_t fake_gemm(int dev, mpr_dtype_t dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                           const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
    calls += 1000;
    return mpri_cpu_backend.gemm(dev, dt, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
static mpr_err_t failing_fill(int dev, mpr_dtype_t dt, int ndim, const int64_t *shape, void *dst, const int64_t *sd,
                              double value) {
    return mpr_error_set(MPR_ERR_STATE, "fake fill: device error");
}

static mpri_backend_t fake;

static void init_fake(void) {
    fake = mpri_cpu_backend;
    fake.name = "fake-cuda";
    fake.alloc = fake_alloc;
    fake.free = fake_free;
    fake.gemm = fake_gemm;
    fake.max_dim_backward = NULL; /* a kernel the backend lacks */
}

/* A device-0 copy of a CPU tensor (host memory, so the test can read it). */
static mpr_tensor_t *on_device(mpr_tensor_t *cpu) {
    mpr_tensor_t *d = mpri_empty_on(0, mpr_tensor_dtype(cpu), mpr_tensor_ndim(cpu), mpr_tensor_shape(cpu));
    assert_non_null(d);
    memcpy(mpr_tensor_data(d), mpr_tensor_data(cpu), mpr_tensor_nbytes(cpu));
    return mpr_scope_adopt(d);
}

/* The first device lookup runs the kernels layer's init, which registers the
 * CUDA backend in a CUDA build and nothing otherwise; an incomplete device
 * table is refused and leaves the registered one in place. */
static void test_kernels_init(void **state) {
    const mpri_backend_t *b = mpri_backend_for("test", 0);
    assert_int_equal(mpri_kernels_init(), MPR_OK);
    if (mpr_cuda_is_built()) {
        assert_non_null(b);
        assert_string_equal(b->name, "cuda");
    } else {
        assert_null(b);
        assert_int_equal(mpr_last_error_code(), MPR_ERR_UNSUPPORTED);
    }
    mpri_backend_t bad = mpri_cpu_backend;
    bad.name = "no-transfer";
    bad.transfer = NULL;
    assert_int_equal(mpri_backend_register(&bad), MPR_ERR_INVALID_ARG);
    assert_non_null(strstr(mpr_last_error(), "no-transfer"));
    mpr_error_clear();
    assert_ptr_equal(mpri_backend_for("test", 0), b);
}

/* The build's own backend (see above) is kept aside while the tests swap in
 * none / the fake one, and put back at the end. */
static const mpri_backend_t *saved_backend;

static void test_no_backend(void **state) {
    saved_backend = mpri_backend_for("test", 0); /* NULL when none is registered */
    mpr_error_clear();
    assert_int_equal(mpri_backend_register(NULL), MPR_OK);
    assert_null(mpri_empty_on(0, MPR_F32, MPR_SHAPE(2)));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_UNSUPPORTED);
    assert_non_null(strstr(mpr_last_error(), "cuda:0"));
}

static void test_dispatch(void **state) {
    init_fake();
    assert_int_equal(mpri_backend_register(&fake), MPR_OK);
    mpr_scope_begin();
    mpr_generator_t *g = mpr_generator_create(5);
    mpr_tensor_t *xc = mpr_randn(MPR_F64, MPR_SHAPE(4, 3), g), *wc = mpr_randn(MPR_F64, MPR_SHAPE(2, 3), g);
    mpr_tensor_t *x = on_device(xc), *w = on_device(wc);
    mpr_set_requires_grad(w, true);
    mpr_set_requires_grad(wc, true);
    calls = 0;
    mpr_tensor_t *y = mpr_sum(mpr_tanh(mpr_linear(x, w, NULL)));
    assert_non_null(y);
    assert_int_equal(mpr_tensor_device(y), 0);
    assert_true(calls >= 1000); /* the gemm went through the device backend */
    assert_int_equal(mpr_backward(y, NULL, false), MPR_OK);
    assert_true(calls >= 2000);
    assert_int_equal(mpr_tensor_device(mpr_tensor_grad(w)), 0);
    /* same numbers as the CPU path */
    mpr_tensor_t *yc = mpr_sum(mpr_tanh(mpr_linear(xc, wc, NULL)));
    assert_int_equal(mpr_backward(yc, NULL, false), MPR_OK);
    assert_int_equal(memcmp(mpr_tensor_data(y), mpr_tensor_data(yc), 8), 0);
    assert_int_equal(memcmp(mpr_tensor_data(mpr_tensor_grad(w)), mpr_tensor_data(mpr_tensor_grad(wc)), 6 * 8), 0);
    /* views, reductions, in-place stay on the device */
    mpr_tensor_t *t = mpr_transpose(x, 0, 1);
    assert_int_equal(mpr_tensor_device(mpr_contiguous(t)), 0);
    assert_int_equal(mpr_tensor_device(mpr_max_dim(x, 1, false, NULL)), 0);
    assert_int_equal(mpr_tensor_device(mpr_zeros_like(x)), 0);
    assert_int_equal(mpr_mul_scalar_(t, 2.0), MPR_OK);
    /* mixing devices is refused */
    assert_null(mpr_add(x, xc));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_INVALID_ARG);
    assert_non_null(strstr(mpr_last_error(), "cpu"));
    assert_non_null(strstr(mpr_last_error(), "cuda:0"));
    assert_int_equal(mpr_copy_(x, xc), MPR_ERR_INVALID_ARG);
    /* host-only functions refuse device tensors */
    double v;
    assert_int_equal(mpr_item(y, &v), MPR_ERR_UNSUPPORTED);
    assert_int_equal(mpr_copy_to_buffer(x, MPR_F64, &v, sizeof v), MPR_ERR_UNSUPPORTED);
    assert_int_equal(mpr_uniform_(x, 0, 1, g), MPR_ERR_UNSUPPORTED);
    assert_null(mpr_max(x));
    /* a missing kernel is reported, not called */
    mpr_tensor_t *xr = on_device(xc);
    mpr_set_requires_grad(xr, true);
    mpr_tensor_t *mx = mpr_sum(mpr_max_dim(xr, 1, false, NULL));
    assert_int_equal(mpr_backward(mx, NULL, false), MPR_ERR_UNSUPPORTED);
    assert_non_null(strstr(mpr_last_error(), "max_dim_backward"));
    /* a failing kernel surfaces as the op's error, without leaking */
    int64_t live = mpr_tensor_live_count();
    fake.fill = failing_fill;
    assert_null(mpr_sum(x));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_STATE);
    assert_int_equal(mpr_fill_(x, 1.0), MPR_ERR_STATE);
    assert_int_equal(mpr_tensor_live_count(), live);
    mpr_generator_destroy(g);
    mpr_scope_end();
    assert_int_equal(mpri_backend_register(saved_backend), MPR_OK);
}

/* Bitwise equal data of a device-0 tensor of the fake backend (host memory)
 * and its CPU twin. */
static void assert_same(mpr_tensor_t *dev, mpr_tensor_t *cpu) {
    if (!dev || !cpu) fprintf(stderr, "last error: %s\n", mpr_last_error());
    assert_non_null(dev);
    assert_non_null(cpu);
    assert_int_equal(mpr_tensor_device(dev), 0);
    assert_int_equal(mpr_tensor_nbytes(dev), mpr_tensor_nbytes(cpu));
    assert_int_equal(memcmp(mpr_tensor_data(dev), mpr_tensor_data(cpu), mpr_tensor_nbytes(cpu)), 0);
}

/* conv2d and cat run on a device through its backend (im2col, col2im, gemm,
 * copy, sum_into) and give the CPU numbers, forward and backward; mixing
 * devices is refused; a backend without im2col refuses conv2d naming the
 * kernel, except for a 1x1 stride-1 unpadded kernel, which needs none. */
static void test_dispatch_conv_cat(void **state) {
    init_fake();
    assert_int_equal(mpri_backend_register(&fake), MPR_OK);
    mpr_scope_begin();
    mpr_generator_t *g = mpr_generator_create(7);
    mpr_tensor_t *xc = mpr_randn(MPR_F64, MPR_SHAPE(2, 3, 5, 4), g);
    mpr_tensor_t *wc = mpr_randn(MPR_F64, MPR_SHAPE(4, 3, 3, 2), g);
    mpr_tensor_t *bc = mpr_randn(MPR_F64, MPR_SHAPE(4), g);
    mpr_tensor_t *x = on_device(xc), *w = on_device(wc), *b = on_device(bc);
    mpr_tensor_t *all[] = {x, w, b, xc, wc, bc};
    for (int i = 0; i < 6; i++) mpr_set_requires_grad(all[i], true);
    calls = 0;
    mpr_tensor_t *y = mpr_conv2d(x, w, b, 2, 1, 1, 1), *yc = mpr_conv2d(xc, wc, bc, 2, 1, 1, 1);
    assert_true(calls >= 1000); /* the GEMMs went through the device backend */
    assert_same(y, yc);
    assert_int_equal(mpr_backward(mpr_sum(mpr_tanh(y)), NULL, false), MPR_OK);
    assert_int_equal(mpr_backward(mpr_sum(mpr_tanh(yc)), NULL, false), MPR_OK);
    assert_same(mpr_tensor_grad(x), mpr_tensor_grad(xc));
    assert_same(mpr_tensor_grad(w), mpr_tensor_grad(wc));
    assert_same(mpr_tensor_grad(b), mpr_tensor_grad(bc));
    /* cat along dim 1 and its backward */
    mpr_tensor_t *zc = mpr_randn(MPR_F64, MPR_SHAPE(2, 1, 5, 4), g), *z = on_device(zc);
    mpr_set_requires_grad(z, true);
    mpr_set_requires_grad(zc, true);
    mpr_tensor_t *cd = mpr_cat((mpr_tensor_t *[]){z, x}, 2, 1), *cc = mpr_cat((mpr_tensor_t *[]){zc, xc}, 2, 1);
    assert_same(cd, cc);
    assert_int_equal(mpr_backward(mpr_sum(mpr_mul(cd, cd)), NULL, false), MPR_OK);
    assert_int_equal(mpr_backward(mpr_sum(mpr_mul(cc, cc)), NULL, false), MPR_OK);
    assert_same(mpr_tensor_grad(z), mpr_tensor_grad(zc));
    /* a strided device input is packed on its device */
    mpr_tensor_t *vc = mpr_randn(MPR_F64, MPR_SHAPE(2, 2, 4, 5), g), *v = mpr_transpose(on_device(vc), 2, 3);
    assert_same(mpr_cat((mpr_tensor_t *[]){x, v}, 2, 1), mpr_cat((mpr_tensor_t *[]){xc, mpr_transpose(vc, 2, 3)}, 2, 1));
    assert_same(mpr_conv2d(v, mpr_narrow(w, 1, 0, 2), NULL, 1, 1, 1, 1),
                mpr_conv2d(mpr_transpose(vc, 2, 3), mpr_narrow(wc, 1, 0, 2), NULL, 1, 1, 1, 1));
    assert_null(mpr_cat((mpr_tensor_t *[]){z, xc}, 2, 1));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_INVALID_ARG);
    assert_non_null(strstr(mpr_last_error(), "cuda:0"));
    /* a backend without im2col */
    fake.im2col = NULL;
    assert_null(mpr_conv2d(x, w, b, 1, 1, 0, 0));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_UNSUPPORTED);
    assert_non_null(strstr(mpr_last_error(), "im2col"));
    mpr_tensor_t *w1c = mpr_randn(MPR_F64, MPR_SHAPE(4, 3, 1, 1), g), *w1 = on_device(w1c);
    assert_same(mpr_conv2d(x, w1, b, 1, 1, 0, 0), mpr_conv2d(xc, w1c, bc, 1, 1, 0, 0));
    mpr_generator_destroy(g);
    mpr_scope_end();
    assert_int_equal(mpri_backend_register(saved_backend), MPR_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels_init),
        cmocka_unit_test(test_no_backend),
        cmocka_unit_test(test_dispatch),
        cmocka_unit_test(test_dispatch_conv_cat),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
