/* test_rt_flat_kernels.c — the flat-loop fast paths of the CPU kernels
 * (mpri_flat_layout, mpri_single_layout in runtime/kernels/mpri_kernels.h):
 * - the predicates: row-major without gaps is flat whatever the strides of
 *   size-1 dims; a transposed, padded, broadcast or 0-d-looking layout is
 *   judged right; a full reduction's output (strides 0 on every dim longer
 *   than 1) is "single";
 * - mpri_k_binary, mpri_k_sum_into and mpri_k_fill on such operands (a
 *   size-1 dim with a stray stride included) equal plain reference loops,
 *   and a binary op whose output is not flat (transposed) still does: the
 *   fast path is taken only when every operand is flat. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "kernels/mpri_kernels.h"

static void test_predicates(void **state) {
    (void)state;
    const int64_t s234[3] = {2, 3, 4};
    assert_true(mpri_flat_layout(3, s234, (const int64_t[]){12, 4, 1}));
    assert_false(mpri_flat_layout(3, s234, (const int64_t[]){1, 2, 6}));  /* column-major */
    assert_false(mpri_flat_layout(3, s234, (const int64_t[]){15, 5, 1})); /* padded rows */
    assert_false(mpri_flat_layout(3, s234, (const int64_t[]){0, 4, 1}));  /* broadcast */
    const int64_t s214[3] = {2, 1, 4};
    assert_true(mpri_flat_layout(3, s214, (const int64_t[]){4, 999, 1})); /* a size-1 dim's stride is free */
    assert_true(mpri_flat_layout(0, NULL, NULL));                        /* a scalar */
    assert_true(mpri_single_layout(3, s234, (const int64_t[]){0, 0, 0}));
    assert_true(mpri_single_layout(3, s214, (const int64_t[]){0, 7, 0}));
    assert_false(mpri_single_layout(3, s234, (const int64_t[]){0, 1, 0}));
}

static void test_kernels_on_flat_operands(void **state) {
    (void)state;
    enum { N = 2 * 1 * 37 };
    const int64_t shape[3] = {2, 1, 37}, flat[3] = {37, 5, 1}; /* the size-1 dim's stride is a stray 5 */
    float a[N], b[N], o[N];
    double ad[N], bd[N], od[N];
    for (int i = 0; i < N; i++) {
        a[i] = (float)(i % 9) - 4.0f, b[i] = (float)(i % 5) + 0.5f;
        ad[i] = a[i], bd[i] = b[i];
    }
    const mpri_binop_t ops[4] = {MPRI_BIN_ADD, MPRI_BIN_SUB, MPRI_BIN_MUL, MPRI_BIN_DIV};
    for (int k = 0; k < 4; k++) {
        mpri_k_binary(ops[k], MPR_F32, 3, shape, o, flat, a, flat, b, flat, 2.0);
        mpri_k_binary(ops[k], MPR_F64, 3, shape, od, flat, ad, flat, bd, flat, 2.0);
        for (int i = 0; i < N; i++) {
            float x = a[i], y = b[i], want = k == 0 ? x + 2.0f * y : k == 1 ? x - 2.0f * y : k == 2 ? x * y : x / y;
            double xd = ad[i], yd = bd[i], wantd = k == 0 ? xd + 2.0 * yd : k == 1 ? xd - 2.0 * yd : k == 2 ? xd * yd : xd / yd;
            assert_true(o[i] == want);
            assert_true(od[i] == wantd);
        }
    }
    /* A transposed output is not flat: the iterator writes it, the same values. */
    const int64_t shape2[2] = {2, 37}, rowmajor[2] = {37, 1}, colmajor[2] = {1, 2};
    mpri_k_binary(MPRI_BIN_ADD, MPR_F32, 2, shape2, o, colmajor, a, rowmajor, b, rowmajor, 1.0);
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 37; c++) assert_true(o[c * 2 + r] == a[r * 37 + c] + b[r * 37 + c]);
    /* A full reduction adds onto the one output element (here 1.5 already). */
    float sum = 1.5f;
    double sumd = 1.5, want = 0;
    mpri_k_sum_into(MPR_F32, 3, shape, &sum, (const int64_t[]){0, 3, 0}, a, flat);
    mpri_k_sum_into(MPR_F64, 3, shape, &sumd, (const int64_t[]){0, 0, 0}, ad, flat);
    for (int i = 0; i < N; i++) want += ad[i]; /* small integers: exact */
    assert_true(sum == (float)(1.5 + want));
    assert_true(sumd == 1.5 + want);
    /* A fill of a flat f32 tensor writes every element, and only those. */
    float buf[N + 1];
    buf[N] = -7.0f;
    mpri_k_fill(MPR_F32, 3, shape, buf, flat, 0.25);
    for (int i = 0; i < N; i++) assert_true(buf[i] == 0.25f);
    assert_true(buf[N] == -7.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_predicates),
        cmocka_unit_test(test_kernels_on_flat_operands),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
