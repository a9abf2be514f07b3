/* test_tensor_device_dispatch.c — ops run their kernels through the backend
 * of their inputs' device. A counting fake "cuda" backend (host memory,
 * device id 0, CPU kernels underneath) checks that: ops and backward on
 * device-0 tensors go through it and give the CPU results; results stay on
 * the device; mixing devices is refused naming both; host-only functions
 * (item, copy_to_buffer, rand fills) refuse device tensors instead of
 * touching device memory; without a registered backend device tensors are
 * refused with a message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

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

/* A CUDA build registers its backend at load time: keep it aside while the
 * tests swap in none / the fake one, and put it back at the end. */
static const mpri_backend_t *saved_backend;

static void test_no_backend(void **state) {
    saved_backend = mpri_backend_for("test", 0); /* NULL when none is registered */
    mpr_error_clear();
    mpri_backend_register(NULL);
    assert_null(mpri_empty_on(0, MPR_F32, MPR_SHAPE(2)));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_UNSUPPORTED);
    assert_non_null(strstr(mpr_last_error(), "cuda:0"));
}

static void test_dispatch(void **state) {
    init_fake();
    mpri_backend_register(&fake);
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
    mpri_backend_register(saved_backend);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_backend),
        cmocka_unit_test(test_dispatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
