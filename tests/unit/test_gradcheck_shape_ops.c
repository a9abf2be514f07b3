/* test_gradcheck_shape_ops.c — finite-difference gradient checks (float64)
 * of views (reshape, view, flatten, transpose, permute, narrow, slice,
 * select, unsqueeze, squeeze, expand, contiguous), reductions (sum, mean,
 * max, over all and over dims), matmul (2-D, batched, broadcast batch, 1-D,
 * with a broadcast gradient from sum or mean, tiny and not,
 * transposed operands), linear, clone and to_dtype. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <cmocka.h>

#include "gradcheck.h"

#define CHECK1(name, fn, ...)                                                  \
    do {                                                                       \
        mpr_tensor_t *in_[1] = {gc_input(__VA_ARGS__, 11)};                    \
        assert_true(gradcheck(name, fn, NULL, 1, in_, NULL));                  \
        gc_release(1, in_);                                                    \
    } while (0)

/* Views are followed by a mul with a non-uniform tensor so every position
 * gets a distinct gradient (a misplaced element would be caught). */
static mpr_tensor_t *f_reshape(mpr_tensor_t **in, void *c) { return mpr_reshape(in[0], MPR_SHAPE(4, -1)); }
static mpr_tensor_t *f_view(mpr_tensor_t **in, void *c) { return mpr_view(in[0], MPR_SHAPE(2, 2, 6)); }
static mpr_tensor_t *f_flatten(mpr_tensor_t **in, void *c) { return mpr_flatten(in[0], 1, 2); }
static mpr_tensor_t *f_transpose(mpr_tensor_t **in, void *c) { return mpr_transpose(in[0], 0, 2); }
static mpr_tensor_t *f_permute(mpr_tensor_t **in, void *c) {
    return mpr_permute(in[0], 3, (const int[]){2, 0, 1});
}
static mpr_tensor_t *f_reshape_strided(mpr_tensor_t **in, void *c) {
    return mpr_reshape(mpr_transpose(in[0], 0, 1), MPR_SHAPE(-1)); /* needs a copy */
}
static mpr_tensor_t *f_narrow(mpr_tensor_t **in, void *c) { return mpr_narrow(in[0], 1, 1, 2); }
static mpr_tensor_t *f_slice(mpr_tensor_t **in, void *c) { return mpr_slice(in[0], -1, 0, 4, 2); }
static mpr_tensor_t *f_select(mpr_tensor_t **in, void *c) { return mpr_select(in[0], 1, -1); }
static mpr_tensor_t *f_unsq(mpr_tensor_t **in, void *c) { return mpr_squeeze(mpr_unsqueeze(in[0], 1), 1); }
static mpr_tensor_t *f_squeeze_all(mpr_tensor_t **in, void *c) { return mpr_squeeze_all(in[0]); }
static mpr_tensor_t *f_expand(mpr_tensor_t **in, void *c) { return mpr_expand(in[0], MPR_SHAPE(2, 3, -1)); }
static mpr_tensor_t *f_contig(mpr_tensor_t **in, void *c) { return mpr_contiguous(mpr_transpose(in[0], 0, 1)); }
static mpr_tensor_t *f_view_chain(mpr_tensor_t **in, void *c) {
    /* a view of a view of a view, then an op reading the strided result */
    return mpr_exp(mpr_narrow(mpr_transpose(mpr_reshape(in[0], MPR_SHAPE(3, 8)), 0, 1), 0, 2, 5));
}

static void test_views(void **state) {
    CHECK1("reshape", f_reshape, MPR_SHAPE(2, 3, 4));
    CHECK1("view", f_view, MPR_SHAPE(2, 3, 4));
    CHECK1("flatten", f_flatten, MPR_SHAPE(2, 3, 4));
    CHECK1("transpose", f_transpose, MPR_SHAPE(2, 3, 4));
    CHECK1("permute", f_permute, MPR_SHAPE(2, 3, 4));
    CHECK1("reshape of transposed", f_reshape_strided, MPR_SHAPE(3, 4));
    CHECK1("narrow", f_narrow, MPR_SHAPE(2, 4, 3));
    CHECK1("slice", f_slice, MPR_SHAPE(3, 5));
    CHECK1("select", f_select, MPR_SHAPE(2, 3, 4));
    CHECK1("unsqueeze/squeeze", f_unsq, MPR_SHAPE(3, 4));
    CHECK1("squeeze_all", f_squeeze_all, MPR_SHAPE(1, 3, 1, 4));
    CHECK1("expand", f_expand, MPR_SHAPE(3, 1));
    CHECK1("contiguous", f_contig, MPR_SHAPE(3, 4));
    CHECK1("view chain", f_view_chain, MPR_SHAPE(2, 3, 4));
}

static mpr_tensor_t *f_sum(mpr_tensor_t **in, void *c) { return mpr_sum(in[0]); }
static mpr_tensor_t *f_mean(mpr_tensor_t **in, void *c) { return mpr_mean(in[0]); }
static mpr_tensor_t *f_sum_dims(mpr_tensor_t **in, void *c) { return mpr_sum_dims(in[0], 2, (const int[]){0, 2}, false); }
static mpr_tensor_t *f_sum_keep(mpr_tensor_t **in, void *c) { return mpr_sum_dims(in[0], 1, (const int[]){-1}, true); }
static mpr_tensor_t *f_mean_dims(mpr_tensor_t **in, void *c) { return mpr_mean_dims(in[0], 1, (const int[]){1}, false); }
static mpr_tensor_t *f_mean_keep(mpr_tensor_t **in, void *c) { return mpr_mean_dims(in[0], 2, (const int[]){1, 2}, true); }
static mpr_tensor_t *f_max(mpr_tensor_t **in, void *c) { return mpr_max(in[0]); }
static mpr_tensor_t *f_max_dim(mpr_tensor_t **in, void *c) { return mpr_max_dim(in[0], 1, false, NULL); }
static mpr_tensor_t *f_max_dim_keep(mpr_tensor_t **in, void *c) { return mpr_max_dim(in[0], -1, true, NULL); }
static mpr_tensor_t *f_sum_strided(mpr_tensor_t **in, void *c) {
    return mpr_sum_dims(mpr_transpose(in[0], 0, 2), 1, (const int[]){0}, false);
}

static void test_reductions(void **state) {
    CHECK1("sum", f_sum, MPR_SHAPE(2, 3, 4));
    CHECK1("mean", f_mean, MPR_SHAPE(2, 3, 4));
    CHECK1("sum dims", f_sum_dims, MPR_SHAPE(2, 3, 4));
    CHECK1("sum keepdim", f_sum_keep, MPR_SHAPE(2, 3, 4));
    CHECK1("mean dims", f_mean_dims, MPR_SHAPE(2, 3, 4));
    CHECK1("mean keepdim", f_mean_keep, MPR_SHAPE(2, 3, 4));
    CHECK1("max", f_max, MPR_SHAPE(3, 4));
    CHECK1("max_dim", f_max_dim, MPR_SHAPE(2, 5, 3));
    CHECK1("max_dim keepdim", f_max_dim_keep, MPR_SHAPE(4, 6));
    CHECK1("sum of strided", f_sum_strided, MPR_SHAPE(2, 3, 4));
}

static mpr_tensor_t *f_mm(mpr_tensor_t **in, void *c) { return mpr_matmul(in[0], in[1]); }
static mpr_tensor_t *f_mm_tt(mpr_tensor_t **in, void *c) {
    return mpr_matmul(mpr_transpose(in[0], 0, 1), mpr_transpose(in[1], 0, 1));
}
/* The product's gradient arrives as a transposed view (a BLAS operand with the Trans flag). */
static mpr_tensor_t *f_mm_out_t(mpr_tensor_t **in, void *c) { return mpr_transpose(mpr_matmul(in[0], in[1]), 0, 1); }
/* Reduced to a scalar: the product's gradient is a broadcast (stride 0) view, which a tiny
 * product's backward reads in place and a larger one copies first. */
static mpr_tensor_t *f_mm_sum(mpr_tensor_t **in, void *c) { return mpr_sum(mpr_matmul(in[0], in[1])); }
static mpr_tensor_t *f_mm_tt_mean(mpr_tensor_t **in, void *c) {
    return mpr_mean(mpr_matmul(mpr_transpose(in[0], 0, 1), mpr_transpose(in[1], 0, 1)));
}
static mpr_tensor_t *f_linear(mpr_tensor_t **in, void *c) { return mpr_linear(in[0], in[1], in[2]); }
static mpr_tensor_t *f_linear_nob(mpr_tensor_t **in, void *c) { return mpr_linear(in[0], in[1], NULL); }
static mpr_tensor_t *f_linear_tw(mpr_tensor_t **in, void *c) {
    return mpr_linear(in[0], mpr_transpose(in[1], 0, 1), in[2]); /* weight given as a transposed view */
}

static void check_mm(const char *name, gc_fn f, int na, const int64_t *sa, int nb, const int64_t *sb) {
    mpr_tensor_t *in[2] = {gc_input(na, sa, 3), gc_input(nb, sb, 4)};
    assert_true(gradcheck(name, f, NULL, 2, in, NULL));
    gc_release(2, in);
}

/* a [3, 4] @ b [4, 5] with only b, then only a requiring grad. */
static void check_mm_one_side(const char *name, gc_fn f) {
    char label[64];
    mpr_tensor_t *in[2] = {gc_input(MPR_SHAPE(3, 4), 3), gc_input(MPR_SHAPE(4, 5), 4)};
    assert_int_equal(mpr_set_requires_grad(in[0], false), MPR_OK);
    snprintf(label, sizeof label, "%s, b only", name);
    assert_true(gradcheck(label, f, NULL, 2, in, NULL));
    assert_int_equal(mpr_set_requires_grad(in[0], true), MPR_OK);
    assert_int_equal(mpr_set_requires_grad(in[1], false), MPR_OK);
    snprintf(label, sizeof label, "%s, a only", name);
    assert_true(gradcheck(label, f, NULL, 2, in, NULL));
    gc_release(2, in);
}

static void test_matmul(void **state) {
    check_mm("mm 2d", f_mm, MPR_SHAPE(3, 4), MPR_SHAPE(4, 5));
    check_mm("mm transposed views", f_mm_tt, MPR_SHAPE(4, 3), MPR_SHAPE(5, 4));
    check_mm("mm, gradient transposed", f_mm_out_t, MPR_SHAPE(3, 4), MPR_SHAPE(4, 5));
    check_mm_one_side("mm", f_mm); /* only one side requires grad: the other gets no product */
    check_mm("bmm", f_mm, MPR_SHAPE(2, 3, 4), MPR_SHAPE(2, 4, 5));
    check_mm("batch @ 2d", f_mm, MPR_SHAPE(2, 3, 4), MPR_SHAPE(4, 5));
    check_mm("2d @ batch", f_mm, MPR_SHAPE(3, 4), MPR_SHAPE(2, 4, 5));
    check_mm("broadcast batch", f_mm, MPR_SHAPE(2, 1, 3, 4), MPR_SHAPE(3, 4, 2));
    check_mm("vec @ mat", f_mm, MPR_SHAPE(4), MPR_SHAPE(4, 5));
    check_mm("mat @ vec", f_mm, MPR_SHAPE(3, 4), MPR_SHAPE(4));
    check_mm("vec @ vec", f_mm, MPR_SHAPE(4), MPR_SHAPE(4));
    check_mm("mm, summed", f_mm_sum, MPR_SHAPE(3, 4), MPR_SHAPE(4, 5));
    check_mm("mm transposed views, mean", f_mm_tt_mean, MPR_SHAPE(4, 3), MPR_SHAPE(5, 4));
    check_mm("mm, summed, wider than the small kernel", f_mm_sum, MPR_SHAPE(2, 40), MPR_SHAPE(40, 3));
    check_mm_one_side("mm summed", f_mm_sum);
}

static void test_linear(void **state) {
    mpr_tensor_t *in[3] = {gc_input(MPR_SHAPE(5, 4), 1), gc_input(MPR_SHAPE(3, 4), 2), gc_input(MPR_SHAPE(3), 3)};
    assert_true(gradcheck("linear", f_linear, NULL, 3, in, NULL));
    assert_true(gradcheck("linear no bias", f_linear_nob, NULL, 2, in, NULL));
    gc_release(3, in);
    mpr_tensor_t *in3[3] = {gc_input(MPR_SHAPE(2, 3, 4), 1), gc_input(MPR_SHAPE(3, 4), 2), gc_input(MPR_SHAPE(3), 3)};
    assert_true(gradcheck("linear 3-d x", f_linear, NULL, 3, in3, NULL));
    gc_release(3, in3);
    mpr_tensor_t *tw[3] = {gc_input(MPR_SHAPE(5, 4), 1), gc_input(MPR_SHAPE(4, 3), 2), gc_input(MPR_SHAPE(3), 3)};
    assert_true(gradcheck("linear transposed weight", f_linear_tw, NULL, 3, tw, NULL));
    gc_release(3, tw);
    /* x without requires_grad: only w and b get gradients */
    mpr_tensor_t *nx[3] = {gc_input(MPR_SHAPE(5, 4), 1), gc_input(MPR_SHAPE(3, 4), 2), gc_input(MPR_SHAPE(3), 3)};
    mpr_set_requires_grad(nx[0], false);
    assert_true(gradcheck("linear x const", f_linear, NULL, 3, nx, NULL));
    assert_null(mpr_tensor_grad(nx[0]));
    gc_release(3, nx);
}

static mpr_tensor_t *f_clone(mpr_tensor_t **in, void *c) { return mpr_mul(mpr_clone(in[0]), in[0]); }
static mpr_tensor_t *f_to32(mpr_tensor_t **in, void *c) {
    /* f64 -> f32 -> f64: gradient flows through both conversions */
    return mpr_to_dtype(mpr_mul_scalar(mpr_to_dtype(in[0], MPR_F32), 2.0), MPR_F64);
}

static void test_copies(void **state) {
    CHECK1("clone", f_clone, MPR_SHAPE(3, 4));
    mpr_tensor_t *in[1] = {gc_input(MPR_SHAPE(3, 4), 5)};
    gc_opts_t loose = {1e-3, 1e-3, 1e-3}; /* float32 in the middle */
    assert_true(gradcheck("to_dtype", f_to32, NULL, 1, in, &loose));
    gc_release(1, in);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_views),   cmocka_unit_test(test_reductions), cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_linear),  cmocka_unit_test(test_copies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
