/* test_rt_blas_kernels.c — the choice of OpenBLAS kernel set
 * (runtime/kernels/cpu_blas.c):
 * - mpri_blas_pick_kernels: a set is suggested only for OpenBLAS's generic
 *   fallback "Prescott" on a CPU with AVX2+FMA ("Haswell") or AVX-512
 *   ("SkylakeX"), never when OPENBLAS_CORETYPE names a set, never for a set
 *   OpenBLAS chose itself;
 * - this process: mpr_blas_kernels() names a set, mpr_blas_better_kernels()
 *   suggests one only while the kernels are Prescott, and says nothing once
 *   OPENBLAS_CORETYPE is set;
 * - a GEMM with the suggestion pending still computes the right product
 *   (the advice is printed, nothing else changes). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/mpri_kernels.h"
#include "mpirpc/tensor_ops.h"

static void test_pick_table(void **state) {
    (void)state;
    /* The fallback on CPUs OpenBLAS did not recognise. */
    assert_string_equal(mpri_blas_pick_kernels("Prescott", NULL, true, true), "SkylakeX");
    assert_string_equal(mpri_blas_pick_kernels("Prescott", "", true, true), "SkylakeX"); /* empty: unset */
    assert_string_equal(mpri_blas_pick_kernels("Prescott", NULL, false, true), "Haswell");
    assert_string_equal(mpri_blas_pick_kernels("Prescott", NULL, false, false), ""); /* a real old CPU */
    /* The user chose, whatever it is. */
    assert_string_equal(mpri_blas_pick_kernels("Prescott", "Prescott", true, true), "");
    assert_string_equal(mpri_blas_pick_kernels("Prescott", "Haswell", true, true), "");
    /* OpenBLAS chose a set itself. */
    assert_string_equal(mpri_blas_pick_kernels("Cooperlake", NULL, true, true), "");
    assert_string_equal(mpri_blas_pick_kernels("Haswell", NULL, true, true), "");
    assert_string_equal(mpri_blas_pick_kernels("Zen", NULL, false, true), "");
    assert_string_equal(mpri_blas_pick_kernels(NULL, NULL, true, true), "");
}

static void test_this_process(void **state) {
    (void)state;
    const char *kernels = mpr_blas_kernels();
    assert_non_null(kernels);
    assert_true(kernels[0] != '\0');
    const char *better = mpr_blas_better_kernels();
    assert_non_null(better);
    if (*better) { /* only for the generic fallback, and only to a real set */
        assert_string_equal(kernels, "Prescott");
        assert_true(strcmp(better, "SkylakeX") == 0 || strcmp(better, "Haswell") == 0);
    }
    /* Once the variable is set, the choice is the user's. */
    char *saved = getenv("OPENBLAS_CORETYPE") ? strdup(getenv("OPENBLAS_CORETYPE")) : NULL;
    setenv("OPENBLAS_CORETYPE", "Prescott", 1);
    assert_string_equal(mpr_blas_better_kernels(), "");
    if (saved) {
        setenv("OPENBLAS_CORETYPE", saved, 1);
        free(saved);
    } else {
        unsetenv("OPENBLAS_CORETYPE");
    }
}

static void test_gemm_after_advice(void **state) {
    (void)state;
    /* [2,3] @ [3,2]^T... as plain row-major C = A B. */
    const float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {7, 8, 9, 10, 11, 12};
    float c[4] = {0};
    mpri_k_gemm(MPR_F32, false, false, 2, 2, 3, 1.0, a, 3, b, 2, 0.0, c, 2);
    const float want[4] = {58, 64, 139, 154};
    for (int i = 0; i < 4; i++) assert_true(c[i] == want[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pick_table),
        cmocka_unit_test(test_this_process),
        cmocka_unit_test(test_gemm_after_advice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
