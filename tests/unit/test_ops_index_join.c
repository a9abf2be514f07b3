/* test_ops_index_join.c — embedding, index_select, gather, cat, stack, split
 * and chunk: values on small hand-checked cases, f64 gradient checks
 * (including repeated indices, whose gradients must add up), views sharing
 * storage, unbind (one node for all slices), argument errors naming the op
 * and shapes, and out-of-range or negative indices, class targets and view
 * arguments refused before any access. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "mpirpc/nn_functional.h"
#include "nn_test_util.h"

typedef struct {
    mpr_tensor_t *idx;
    int dim;
} idx_ctx_t;

static mpr_tensor_t *f_embedding(mpr_tensor_t **in, void *c) {
    return mpr_embedding(in[0], ((idx_ctx_t *)c)->idx);
}
static mpr_tensor_t *f_index_select(mpr_tensor_t **in, void *c) {
    idx_ctx_t *k = c;
    return mpr_index_select(in[0], k->dim, k->idx);
}
static mpr_tensor_t *f_gather(mpr_tensor_t **in, void *c) {
    idx_ctx_t *k = c;
    return mpr_gather(in[0], k->dim, k->idx);
}

static void test_embedding(void **state) {
    mpr_tensor_t *w = tu_randn(MPR_SHAPE(5, 3), 1, true);
    idx_ctx_t c = {tu_i64(MPR_SHAPE(2, 3), (int64_t[]){4, 0, 4, 1, 1, 4}), 0};
    mpr_tensor_t *y = mpr_embedding(w, c.idx);
    assert_non_null(y);
    assert_int_equal(mpr_tensor_ndim(y), 3);
    assert_int_equal(mpr_tensor_shape(y)[2], 3);
    const double *wd = mpr_tensor_data(w), *yd = mpr_tensor_data(y);
    for (int j = 0; j < 3; j++) assert_true(yd[3 * 3 + j] == wd[1 * 3 + j]); /* y[1,0] = w[1] */
    mpr_tensor_release(y);
    TU_GRADCHECK("embedding", f_embedding, &c, 1, &w, 1e-8, 1e-6);
    /* unused row gets exactly zero gradient, row 4 (used 3 times) the sum */
    const double *g = mpr_tensor_data(mpr_tensor_grad(w));
    for (int j = 0; j < 3; j++) assert_true(g[2 * 3 + j] == 0.0 && g[3 * 3 + j] == 0.0);
    mpr_tensor_t *bad = tu_i64(MPR_SHAPE(2), (int64_t[]){1, 5});
    TU_EXPECT_ERR(mpr_embedding(w, bad), MPR_ERR_INVALID_ARG, "index 5 at position 1");
    mpr_tensor_t *fidx = mpr_zeros(MPR_F32, MPR_SHAPE(2));
    TU_EXPECT_ERR(mpr_embedding(w, fidx), MPR_ERR_DTYPE, "int64");
    mpr_tensor_release(bad);
    mpr_tensor_release(fidx);
    mpr_tensor_release(c.idx);
    mpr_tensor_release(w);
}

static void test_index_select(void **state) {
    mpr_tensor_t *x = tu_randn(MPR_SHAPE(3, 4, 2), 2, true);
    idx_ctx_t c = {tu_i64(MPR_SHAPE(5), (int64_t[]){3, 0, 3, 2, 3}), 1};
    mpr_tensor_t *y = mpr_index_select(x, 1, c.idx);
    assert_non_null(y);
    assert_int_equal(mpr_tensor_shape(y)[1], 5);
    const double *xd = mpr_tensor_data(x), *yd = mpr_tensor_data(y);
    /* y[2, 3, 1] = x[2, idx[3] = 2, 1] */
    assert_true(yd[(2 * 5 + 3) * 2 + 1] == xd[(2 * 4 + 2) * 2 + 1]);
    mpr_tensor_release(y);
    for (int dim = 0; dim < 3; dim++) {
        idx_ctx_t cd = {tu_i64(MPR_SHAPE(3), (int64_t[]){1, 1, 0}), dim};
        TU_GRADCHECK("index_select", f_index_select, &cd, 1, &x, 1e-8, 1e-6);
        mpr_tensor_release(cd.idx);
    }
    mpr_tensor_t *i2 = tu_i64(MPR_SHAPE(1, 2), (int64_t[]){0, 1});
    TU_EXPECT_ERR(mpr_index_select(x, 0, i2), MPR_ERR_SHAPE, "1-D");
    TU_EXPECT_ERR(mpr_index_select(x, 0, c.idx), MPR_ERR_INVALID_ARG, "out of range [0, 3)");
    mpr_tensor_release(i2);
    mpr_tensor_release(c.idx);
    mpr_tensor_release(x);
}

static void test_gather(void **state) {
    /* torch.gather(tensor([[1,2],[3,4]]), 1, tensor([[0,0],[1,0]])) == [[1,1],[4,3]] */
    mpr_tensor_t *x = mpr_from_buffer(MPR_F64, MPR_SHAPE(2, 2), (double[]){1, 2, 3, 4});
    mpr_tensor_t *ix = tu_i64(MPR_SHAPE(2, 2), (int64_t[]){0, 0, 1, 0});
    mpr_tensor_t *y = mpr_gather(x, 1, ix);
    const double *yd = mpr_tensor_data(y);
    assert_true(yd[0] == 1 && yd[1] == 1 && yd[2] == 4 && yd[3] == 3);
    mpr_tensor_release(y);
    mpr_tensor_release(x);
    mpr_tensor_release(ix);

    mpr_tensor_t *x3 = tu_randn(MPR_SHAPE(3, 4, 2), 3, true);
    idx_ctx_t c = {tu_i64(MPR_SHAPE(3, 5, 2), (int64_t[]){0, 1, 2, 3, 3, 3, 1, 0, 2, 2,
                                                          1, 1, 1, 1, 0, 0, 3, 2, 2, 3,
                                                          0, 0, 0, 3, 3, 3, 2, 1, 1, 2}),
                   1};
    TU_GRADCHECK("gather dim 1", f_gather, &c, 1, &x3, 1e-8, 1e-6);
    /* index smaller than the input in the other dims (narrowed input) */
    idx_ctx_t cs = {tu_i64(MPR_SHAPE(2, 2, 1), (int64_t[]){2, 0, 1, 1}), 0};
    TU_GRADCHECK("gather narrowed", f_gather, &cs, 1, &x3, 1e-8, 1e-6);
    mpr_tensor_t *big = tu_i64(MPR_SHAPE(3, 5, 3), (int64_t[45]){0});
    TU_EXPECT_ERR(mpr_gather(x3, 1, big), MPR_ERR_SHAPE, "larger than input [3, 4, 2] in dim 2");
    mpr_tensor_t *oor = tu_i64(MPR_SHAPE(1, 1, 1), (int64_t[]){4});
    TU_EXPECT_ERR(mpr_gather(x3, 1, oor), MPR_ERR_INVALID_ARG, "out of range [0, 4)");
    mpr_tensor_release(big);
    mpr_tensor_release(oor);
    mpr_tensor_release(c.idx);
    mpr_tensor_release(cs.idx);
    mpr_tensor_release(x3);
}

static mpr_tensor_t *f_cat(mpr_tensor_t **in, void *c) { return mpr_cat(in, 3, *(int *)c); }
static mpr_tensor_t *f_stack(mpr_tensor_t **in, void *c) { return mpr_stack(in, 3, *(int *)c); }
static mpr_tensor_t *f_split_mix(mpr_tensor_t **in, void *c) {
    /* split into pieces of 2 along dim 1, weight each piece differently, cat back */
    mpr_tensor_t *p[4];
    int n;
    if (mpr_split(in[0], 2, 1, p, 4, &n) != MPR_OK) return NULL;
    mpr_tensor_t *q[4];
    for (int i = 0; i < n; i++) q[i] = mpr_mul_scalar(p[i], (double)(i + 1));
    return mpr_cat(q, n, 1);
}

static void test_cat_stack(void **state) {
    mpr_tensor_t *in[3] = {tu_randn(MPR_SHAPE(2, 3), 4, true), tu_randn(MPR_SHAPE(2, 1), 5, true),
                           tu_randn(MPR_SHAPE(2, 2), 6, true)};
    int dim = 1;
    mpr_tensor_t *y = mpr_cat(in, 3, 1);
    assert_int_equal(mpr_tensor_shape(y)[1], 6);
    const double *yd = mpr_tensor_data(y), *b = mpr_tensor_data(in[1]);
    assert_true(yd[6 + 3] == b[1]);
    mpr_tensor_release(y);
    TU_GRADCHECK("cat dim 1", f_cat, &dim, 3, in, 1e-8, 1e-6);
    dim = -1;
    TU_GRADCHECK("cat dim -1", f_cat, &dim, 3, in, 1e-8, 1e-6);
    TU_EXPECT_ERR(mpr_cat(in, 3, 0), MPR_ERR_SHAPE, "input 1 has shape [2, 1], incompatible with input 0 [2, 3]");
    mpr_tensor_t *sx[3] = {tu_randn(MPR_SHAPE(2, 3), 7, true), tu_randn(MPR_SHAPE(2, 3), 8, true),
                           tu_randn(MPR_SHAPE(2, 3), 9, false)};
    for (dim = -3; dim <= 2; dim++) {
        mpr_tensor_t *s = mpr_stack(sx, 3, dim);
        assert_non_null(s);
        assert_int_equal(mpr_tensor_ndim(s), 3);
        int d = dim < 0 ? dim + 3 : dim;
        assert_int_equal(mpr_tensor_shape(s)[d], 3);
        mpr_tensor_release(s);
        TU_GRADCHECK("stack", f_stack, &dim, 3, sx, 1e-8, 1e-6);
    }
    TU_EXPECT_ERR(mpr_stack(in, 3, 0), MPR_ERR_SHAPE, "same shape");
    mpr_tensor_t *fi[2] = {in[0], mpr_zeros(MPR_F32, MPR_SHAPE(2, 3))};
    TU_EXPECT_ERR(mpr_cat(fi, 2, 0), MPR_ERR_DTYPE, "input 1 has dtype float32");
    mpr_tensor_release(fi[1]);
    for (int i = 0; i < 3; i++) {
        mpr_tensor_release(in[i]);
        mpr_tensor_release(sx[i]);
    }
}

static void test_split_chunk(void **state) {
    mpr_tensor_t *x = tu_randn(MPR_SHAPE(3, 7), 10, true);
    mpr_tensor_t *p[8];
    int n;
    assert_int_equal(mpr_split(x, 3, 1, p, 8, &n), MPR_OK);
    assert_int_equal(n, 3);
    assert_int_equal(mpr_tensor_shape(p[2])[1], 1);
    /* views share x's storage */
    assert_ptr_equal(mpr_tensor_data(p[1]), (double *)mpr_tensor_data(x) + 3);
    for (int i = 0; i < n; i++) mpr_tensor_release(p[i]);
    assert_int_equal(mpr_chunk(x, 3, -1, p, &n), MPR_OK); /* torch: sizes 3, 3, 1 */
    assert_int_equal(n, 3);
    assert_int_equal(mpr_tensor_shape(p[0])[1], 3);
    assert_int_equal(mpr_tensor_shape(p[2])[1], 1);
    for (int i = 0; i < n; i++) mpr_tensor_release(p[i]);
    assert_int_equal(mpr_chunk(x, 4, 0, p, &n), MPR_OK); /* torch.chunk(3 rows, 4) -> 3 of 1 */
    assert_int_equal(n, 3);
    for (int i = 0; i < n; i++) mpr_tensor_release(p[i]);
    TU_GRADCHECK("split", f_split_mix, NULL, 1, &x, 1e-8, 1e-6);
    assert_int_equal(mpr_split(x, 2, 1, p, 3, &n), MPR_ERR_INVALID_ARG);
    assert_int_equal(n, 0);
    assert_non_null(strstr(mpr_last_error(), "4 pieces"));
    assert_int_equal(mpr_split(x, 0, 1, p, 3, &n), MPR_ERR_INVALID_ARG);
    mpr_tensor_release(x);
}

static mpr_tensor_t *f_unbind(mpr_tensor_t **in, void *c) {
    /* slices along dim, scaled by k+1, slice 1 left unused (zero gradient), re-stacked */
    mpr_tensor_t *p[8], *q[8];
    int n, m = 0;
    if (mpr_unbind(in[0], *(int *)c, p, 8, &n) != MPR_OK) return NULL;
    for (int k = 0; k < n; k++)
        if (k != 1) q[m++] = mpr_mul_scalar(p[k], (double)(k + 1));
    return mpr_stack(q, m, 0);
}

static void test_unbind(void **state) {
    mpr_tensor_t *x = tu_randn(MPR_SHAPE(3, 4, 2), 12, true);
    mpr_tensor_t *p[4];
    int n;
    assert_int_equal(mpr_unbind(x, 1, p, 4, &n), MPR_OK);
    assert_int_equal(n, 4);
    assert_int_equal(mpr_tensor_ndim(p[2]), 2);
    assert_ptr_equal(mpr_tensor_data(p[2]), (double *)mpr_tensor_data(x) + 4); /* a view */
    assert_true(((double *)mpr_tensor_data(p[3]))[0] == ((double *)mpr_tensor_data(x))[6]);
    for (int i = 0; i < n; i++) mpr_tensor_release(p[i]);
    for (int dim = -3; dim < 3; dim++) TU_GRADCHECK("unbind", f_unbind, &dim, 1, &x, 1e-8, 1e-6);
    assert_int_equal(mpr_unbind(x, 0, p, 2, &n), MPR_ERR_INVALID_ARG);
    assert_non_null(strstr(mpr_last_error(), "3 slices along dim 0 do not fit in 2"));
    mpr_tensor_release(x);
}

/* Out-of-range and negative indices/targets are refused before any access
 * (embedding, index_select, gather, nll_loss, cross_entropy), and so are
 * out-of-range view arguments. */
/* NULL with an error that names the op (the code may be SHAPE or INVALID_ARG). */
#define EXPECT_FAILS(expr, op)                                                                   \
    do {                                                                                         \
        mpr_tensor_t *r_ = (expr);                                                               \
        if (r_) fail_msg("%s: expected an error, got a tensor", op);                            \
        mpr_err_t c_ = mpr_last_error_code();                                                    \
        assert_true(c_ == MPR_ERR_SHAPE || c_ == MPR_ERR_INVALID_ARG);                          \
        if (!strstr(mpr_last_error(), op)) fail_msg("error '%s' should name '%s'", mpr_last_error(), op); \
    } while (0)

static void test_bad_indices_refused(void **state) {
    mpr_scope_begin();
    mpr_tensor_t *w = tu_randn(MPR_SHAPE(5, 3), 1, false); /* scope-owned */
    mpr_tensor_t *neg = tu_i64(MPR_SHAPE(2), (int64_t[]){0, -1}); /* scope-owned */
    mpr_tensor_t *big = tu_i64(MPR_SHAPE(2), (int64_t[]){5, 0}); /* scope-owned */
    TU_EXPECT_ERR(mpr_embedding(w, neg), MPR_ERR_INVALID_ARG, "-1");
    TU_EXPECT_ERR(mpr_embedding(w, big), MPR_ERR_INVALID_ARG, "5");
    TU_EXPECT_ERR(mpr_index_select(w, 0, neg), MPR_ERR_INVALID_ARG, "index_select");
    TU_EXPECT_ERR(mpr_index_select(w, 1, big), MPR_ERR_INVALID_ARG, "index_select");
    mpr_tensor_t *gi = tu_i64(MPR_SHAPE(2, 1), (int64_t[]){0, -2}); /* scope-owned */
    TU_EXPECT_ERR(mpr_gather(w, 1, gi), MPR_ERR_INVALID_ARG, "gather");
    /* class targets: negative (not the ignore index) and too large */
    mpr_tensor_t *logits = tu_randn(MPR_SHAPE(2, 5), 2, false); /* scope-owned */
    TU_EXPECT_ERR(mpr_cross_entropy(logits, neg), MPR_ERR_INVALID_ARG, "-1");
    TU_EXPECT_ERR(mpr_nll_loss(logits, big), MPR_ERR_INVALID_ARG, "5");
    mpr_tensor_t *t7 = tu_i64(MPR_SHAPE(2), (int64_t[]){7, 1}); /* scope-owned */
    TU_EXPECT_ERR(mpr_cross_entropy(logits, t7), MPR_ERR_INVALID_ARG, "7");
    /* float index tensors are a dtype error */
    TU_EXPECT_ERR(mpr_index_select(w, 0, mpr_zeros(MPR_F64, MPR_SHAPE(2))), MPR_ERR_DTYPE, "index_select");
    TU_EXPECT_ERR(mpr_cross_entropy(logits, mpr_zeros(MPR_F64, MPR_SHAPE(2))), MPR_ERR_DTYPE, "cross_entropy");
    /* views out of range */
    TU_EXPECT_ERR(mpr_narrow(w, 1, 2, 2), MPR_ERR_SHAPE, "narrow");
    EXPECT_FAILS(mpr_transpose(w, 0, 2), "transpose");
    EXPECT_FAILS(mpr_permute(w, 2, (const int[]){0, 0}), "permute");
    EXPECT_FAILS(mpr_select(w, 0, 5), "select");
    EXPECT_FAILS(mpr_select(w, 1, -4), "select");
    EXPECT_FAILS(mpr_slice(w, 2, 0, 1, 1), "slice");
    EXPECT_FAILS(mpr_squeeze(w, 3), "squeeze");
    EXPECT_FAILS(mpr_unsqueeze(w, 4), "unsqueeze");
    mpr_scope_end();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding), cmocka_unit_test(test_index_select),
        cmocka_unit_test(test_gather),    cmocka_unit_test(test_cat_stack),
        cmocka_unit_test(test_split_chunk), cmocka_unit_test(test_unbind),
        cmocka_unit_test(test_bad_indices_refused),
    };
    return tu_run_group_no_leaks(tests);
}
