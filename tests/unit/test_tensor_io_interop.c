/* test_tensor_io_interop.c — files written by this library are readable by
 * NumPy/PyTorch tooling, and files written by that tooling load here
 * (issue #3: ".npy and .safetensors readable by PyTorch/NumPy tooling").
 *
 * The C side writes .npy files (f32, a strided f64 view, i64 with values
 * beyond 2^32, 0-d, empty) and a Sequential(Linear, ReLU, Linear)'s
 * parameters as .safetensors, plus an input and the module's output. Then
 * tests/ref/check_interop.py (run with /usr/bin/python3) loads them with
 * numpy.load and a safetensors reader that validates the layout as the
 * `safetensors` package does, loads the state dict into the same torch model
 * (strict), checks torch's output against ours and writes back torch's
 * outputs (.npy from np.save) and modified parameters (.safetensors from a
 * plain Python writer); the C side loads those into its module (strict) and
 * checks its output against torch's. Skipped with a message when
 * /usr/bin/python3 with numpy and torch is not available. */
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

static char tmpdir[256];

static const char *path_in(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

static int setup(void **state) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/mpirpc_interop_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static bool have_python_torch(void) {
    if (access("/usr/bin/python3", X_OK) != 0) return false;
    return system("/usr/bin/python3 -c 'import numpy, torch' >/dev/null 2>&1") == 0;
}

static void save(mpr_tensor_t *t, const char *name) {
    assert_non_null(t);
    assert_int_equal(mpr_tensor_save_npy(t, path_in(name)), MPR_OK);
}

static void test_files_readable_by_numpy_and_torch(void **state) {
    if (!have_python_torch()) {
        print_message("skipped: /usr/bin/python3 with numpy and torch is not available\n");
        skip();
    }
    int64_t live = mpr_tensor_live_count();
    mpr_scope_begin();
    /* .npy files */
    save(mpr_sub(mpr_mul_scalar(mpr_reshape(mpr_arange(MPR_F32, 0, 24, 1), MPR_SHAPE(2, 3, 4)), 0.5),
                 mpr_full(MPR_F32, 0, NULL, 3.0)),
         "a_f32.npy");
    mpr_tensor_t *m = mpr_mul_scalar(mpr_reshape(mpr_arange(MPR_F64, 0, 12, 1), MPR_SHAPE(3, 4)), 1.1);
    mpr_tensor_t *mt = mpr_transpose(m, 0, 1);
    assert_false(mpr_tensor_is_contiguous(mt));
    save(mt, "a_f64_t.npy");
    int64_t iv[5];
    for (int i = 0; i < 5; i++) iv[i] = (int64_t)i * 1000000007LL - (1LL << 40);
    save(mpr_from_buffer(MPR_I64, MPR_SHAPE(5), iv), "a_i64.npy");
    save(mpr_full(MPR_F64, 0, NULL, 2.5), "a_scalar.npy");
    save(mpr_zeros(MPR_F32, MPR_SHAPE(0, 3)), "a_empty.npy");
    /* a module, an input and its output */
    mpr_generator_t *g = mpr_generator_create(31);
    mpr_module_t *net = mpr_sequential_create();
    assert_int_equal(mpr_sequential_append(net, mpr_linear_create(4, 3, true, MPR_F32, g)), MPR_OK);
    assert_int_equal(mpr_sequential_append(net, mpr_relu_create()), MPR_OK);
    assert_int_equal(mpr_sequential_append(net, mpr_linear_create(3, 2, true, MPR_F32, g)), MPR_OK);
    assert_int_equal(mpr_module_save_safetensors(net, path_in("model.safetensors")), MPR_OK);
    mpr_tensor_t *x = mpr_randn(MPR_F32, MPR_SHAPE(5, 4), g);
    save(x, "x.npy");
    bool prev = mpr_set_grad_enabled(false);
    mpr_tensor_t *y = mpr_module_forward(net, x);
    save(y, "y_c.npy");
    mpr_set_grad_enabled(prev);

    /* NumPy / torch read them and write back */
    const char *dir = getenv("MPIRPC_TEST_DATA");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/../ref/check_interop.py' '%s' 2>&1",
             dir ? dir : "tests/data", tmpdir);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[4096];
    bool ok = false;
    while (fgets(line, sizeof line, p)) {
        print_message("python: %s", line);
        if (strncmp(line, "interop ok", 10) == 0) ok = true;
    }
    int rc = pclose(p);
    assert_int_equal(rc, 0);
    assert_true(ok);

    /* torch's output for the same parameters equals ours */
    mpr_tensor_t *ty = mpr_scope_adopt(mpr_tensor_load_npy(path_in("torch_y.npy")));
    assert_non_null(ty);
    assert_true(mpr_allclose(ty, y, 1e-5, 1e-6));
    /* parameters written by Python load into the module; outputs agree */
    assert_int_equal(mpr_module_load_safetensors(net, path_in("model2.safetensors"), true), MPR_OK);
    prev = mpr_set_grad_enabled(false);
    mpr_tensor_t *y2 = mpr_module_forward(net, x);
    mpr_set_grad_enabled(prev);
    mpr_tensor_t *ty2 = mpr_scope_adopt(mpr_tensor_load_npy(path_in("torch_y2.npy")));
    assert_non_null(ty2);
    assert_int_equal(mpr_tensor_dtype(ty2), MPR_F32);
    assert_true(mpr_allclose(ty2, y2, 1e-5, 1e-6));
    assert_false(mpr_allclose(y2, y, 1e-3, 1e-3)); /* the parameters really changed */
    mpr_scope_end();
    mpr_module_destroy(net);
    mpr_generator_destroy(g);
    assert_int_equal(mpr_tensor_live_count(), live);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_files_readable_by_numpy_and_torch)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
