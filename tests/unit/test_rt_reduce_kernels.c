/* test_rt_reduce_kernels.c — mpri_k_sum_into's contiguous-row path (8
 * interleaved partial sums in double, runtime/kernels/cpu_reduce.c):
 * - every row length 0..40 and 1000, on values whose sums are exact in
 *   double, equals the plain sum (the partial sums and the tail cover every
 *   element once);
 * - f32 rows accumulate in double (a row where a float running sum would
 *   lose the small terms);
 * - a convolution's bias-gradient reduction ([N, C, H*W] summed over N and
 *   H*W) equals a plain reference loop. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "kernels/mpri_kernels.h"

static void test_row_lengths(void **state) {
    (void)state;
    for (int64_t n = 0; n <= 1000; n = n < 40 ? n + 1 : 1000) {
        const int64_t rows = 3;
        double *in = malloc(sizeof *in * (size_t)(rows * n + 1));
        assert_non_null(in);
        double want[3] = {0, 0, 0};
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < n; i++) {
                in[r * n + i] = (double)((r + 1) * (i % 7) - 3); /* small integers: exact sums */
                want[r] += in[r * n + i];
            }
        double out[3] = {0.5, 0.5, 0.5}; /* sum_into adds to what is there */
        int64_t shape[2] = {rows, n}, so[2] = {1, 0}, si[2] = {n, 1};
        mpri_k_sum_into(MPR_F64, 2, shape, out, so, in, si);
        for (int r = 0; r < rows; r++) assert_true(out[r] == 0.5 + (n ? want[r] : 0));
        free(in);
        if (n == 1000) break;
    }
}

static void test_f32_rows_sum_in_double(void **state) {
    (void)state;
    enum { REPEATS = 512 };
    float in[8 * REPEATS + 3];
    /* 1e8, 1, -1e8, 0, ...: a float running sum drops every 1 (1e8 + 1 == 1e8 in float). */
    for (int i = 0; i < 8 * REPEATS + 3; i++) in[i] = i % 8 == 0 ? 1e8f : i % 8 == 1 ? 1.0f : i % 8 == 2 ? -1e8f : 0.0f;
    float out = 0;
    int64_t shape[1] = {8 * REPEATS + 3}, so[1] = {0}, si[1] = {1};
    mpri_k_sum_into(MPR_F32, 1, shape, &out, so, in, si);
    /* REPEATS full groups, and the tail 1e8, 1, -1e8. */
    assert_true(out == (float)(REPEATS + 1));
}

static void test_bias_gradient_reduction(void **state) {
    (void)state;
    enum { N = 3, C = 5, HW = 29 };
    float gy[N * C * HW];
    for (int i = 0; i < N * C * HW; i++) gy[i] = (float)((i * 37) % 11) - 5.0f; /* exact in f32 and double */
    float gb[C] = {0}, want[C] = {0};
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            for (int q = 0; q < HW; q++) want[c] += gy[(n * C + c) * HW + q];
    int64_t shape[3] = {N, C, HW}, sb[3] = {0, 1, 0}, sy[3] = {C * HW, HW, 1};
    mpri_k_sum_into(MPR_F32, 3, shape, gb, sb, gy, sy);
    for (int c = 0; c < C; c++) assert_true(gb[c] == want[c]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_row_lengths),
        cmocka_unit_test(test_f32_rows_sum_in_double),
        cmocka_unit_test(test_bias_gradient_reduction),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
