/* test_ref_ops.c — values and gradients of every op against PyTorch 1.13.
 *
 * tests/data/ref_ops.safetensors (written by tests/ref/gen_refs.py) holds,
 * for each case NAME: the inputs NAME.in0.., the output NAME.out, the
 * upstream gradient NAME.gout and the input gradients NAME.grad0... This test
 * loads the same inputs, runs our op, runs backward with the same upstream
 * gradient and compares output and gradients (f32, rtol 1e-4, atol 1e-5).
 * ref_audit_ops.safetensors (gen_audit_ops, same layout) adds variants: other
 * dims and keepdim, 1-D and doubly broadcast matmul operands, linear on 3-D
 * input and without bias, softmax over dim 0, ignore_index and 1-D inputs for
 * the losses, 3-D embedding indices, index_select/gather along other dims,
 * cat of three, stack along the last dim, conv2d without bias with a
 * rectangular kernel/stride/padding and 1x1, max_pool2d with padding and
 * rectangular windows. Every case of a file must have its C counterpart. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mpirpc/nn_functional.h"
#include "mpirpc/tensor_io.h"
#include "mpirpc/tensor_ops.h"

#define RTOL 1e-4
#define ATOL 1e-5

typedef mpr_tensor_t *(*op_fn)(mpr_tensor_t **in);

static mpr_tensor_t *f_add(mpr_tensor_t **in) { return mpr_add(in[0], in[1]); }
static mpr_tensor_t *f_sub(mpr_tensor_t **in) { return mpr_sub(in[0], in[1]); }
static mpr_tensor_t *f_mul(mpr_tensor_t **in) { return mpr_mul(in[0], in[1]); }
static mpr_tensor_t *f_div(mpr_tensor_t **in) { return mpr_div(in[0], in[1]); }
static mpr_tensor_t *f_neg(mpr_tensor_t **in) { return mpr_neg(in[0]); }
static mpr_tensor_t *f_pow(mpr_tensor_t **in) { return mpr_pow(in[0], 3.0); }
static mpr_tensor_t *f_pow_half(mpr_tensor_t **in) { return mpr_pow(in[0], 0.5); }
static mpr_tensor_t *f_exp(mpr_tensor_t **in) { return mpr_exp(in[0]); }
static mpr_tensor_t *f_log(mpr_tensor_t **in) { return mpr_log(in[0]); }
static mpr_tensor_t *f_sqrt(mpr_tensor_t **in) { return mpr_sqrt(in[0]); }
static mpr_tensor_t *f_abs(mpr_tensor_t **in) { return mpr_abs(in[0]); }
static mpr_tensor_t *f_clamp(mpr_tensor_t **in) { return mpr_clamp(in[0], -0.5, 0.4); }
static mpr_tensor_t *f_relu(mpr_tensor_t **in) { return mpr_relu(in[0]); }
static mpr_tensor_t *f_tanh(mpr_tensor_t **in) { return mpr_tanh(in[0]); }
static mpr_tensor_t *f_sigmoid(mpr_tensor_t **in) { return mpr_sigmoid(in[0]); }
static mpr_tensor_t *f_gelu(mpr_tensor_t **in) { return mpr_gelu(in[0]); }
static mpr_tensor_t *f_sum(mpr_tensor_t **in) { return mpr_sum(in[0]); }
static mpr_tensor_t *f_mean(mpr_tensor_t **in) { return mpr_mean(in[0]); }
static mpr_tensor_t *f_sum_dim1(mpr_tensor_t **in) { return mpr_sum_dims(in[0], 1, (const int[]){1}, false); }
static mpr_tensor_t *f_mean_dim0_keep(mpr_tensor_t **in) {
    return mpr_mean_dims(in[0], 1, (const int[]){0}, true);
}
static mpr_tensor_t *f_max_dim1(mpr_tensor_t **in) { return mpr_max_dim(in[0], 1, false, NULL); }
static mpr_tensor_t *f_matmul(mpr_tensor_t **in) { return mpr_matmul(in[0], in[1]); }
static mpr_tensor_t *f_linear(mpr_tensor_t **in) { return mpr_linear(in[0], in[1], in[2]); }
static mpr_tensor_t *f_softmax(mpr_tensor_t **in) { return mpr_softmax(in[0], 1); }
static mpr_tensor_t *f_log_softmax(mpr_tensor_t **in) { return mpr_log_softmax(in[0], 1); }
static mpr_tensor_t *f_cross_entropy(mpr_tensor_t **in) { return mpr_cross_entropy(in[0], in[1]); }
static mpr_tensor_t *f_nll_loss(mpr_tensor_t **in) { return mpr_nll_loss(in[0], in[1]); }
static mpr_tensor_t *f_mse_loss(mpr_tensor_t **in) { return mpr_mse_loss(in[0], in[1]); }
static mpr_tensor_t *f_embedding(mpr_tensor_t **in) { return mpr_embedding(in[0], in[1]); }
static mpr_tensor_t *f_index_select(mpr_tensor_t **in) { return mpr_index_select(in[0], 0, in[1]); }
static mpr_tensor_t *f_gather(mpr_tensor_t **in) { return mpr_gather(in[0], 1, in[1]); }
static mpr_tensor_t *f_cat(mpr_tensor_t **in) { return mpr_cat(in, 2, 1); }
static mpr_tensor_t *f_stack(mpr_tensor_t **in) { return mpr_stack(in, 2, 0); }
static mpr_tensor_t *f_conv2d(mpr_tensor_t **in) { return mpr_conv2d(in[0], in[1], in[2], 1, 1, 1, 1); }
static mpr_tensor_t *f_conv2d_s2(mpr_tensor_t **in) { return mpr_conv2d(in[0], in[1], in[2], 2, 2, 0, 0); }
static mpr_tensor_t *f_max_pool2d(mpr_tensor_t **in) { return mpr_max_pool2d(in[0], 2, 2, 0, 0, 0, 0); }

static mpr_tensor_t *f_split1(mpr_tensor_t **in) {
    mpr_tensor_t *out[4];
    int n = 0;
    if (mpr_split(in[0], 2, 1, out, 4, &n) != MPR_OK || n != 3) return NULL;
    return mpr_mul_scalar(out[1], 2.0);
}
static mpr_tensor_t *f_chunk2(mpr_tensor_t **in) {
    mpr_tensor_t *out[3];
    int n = 0;
    if (mpr_chunk(in[0], 3, 0, out, &n) != MPR_OK || n != 3) return NULL;
    return mpr_exp(out[2]);
}
static mpr_tensor_t *f_max_all(mpr_tensor_t **in) { return mpr_max(in[0]); }
static mpr_tensor_t *f_sum_dims02(mpr_tensor_t **in) { return mpr_sum_dims(in[0], 2, (const int[]){0, 2}, false); }
static mpr_tensor_t *f_transpose_matmul(mpr_tensor_t **in) { return mpr_matmul(mpr_transpose(in[0], 0, 1), in[1]); }
static mpr_tensor_t *f_permute3(mpr_tensor_t **in) {
    return mpr_mul_scalar(mpr_contiguous(mpr_permute(in[0], 3, (const int[]){2, 0, 1})), 3.0);
}
static mpr_tensor_t *f_narrow_mul(mpr_tensor_t **in) { return mpr_mul(mpr_narrow(in[0], 1, 1, 2), in[1]); }
static mpr_tensor_t *f_reshape_sum(mpr_tensor_t **in) {
    return mpr_sum_dims(mpr_reshape(in[0], MPR_SHAPE(4, 3)), 1, (const int[]){0}, false);
}
static mpr_tensor_t *f_unsqueeze_add(mpr_tensor_t **in) { return mpr_add(mpr_unsqueeze(in[0], 1), in[1]); }
static mpr_tensor_t *f_log_softmax_dim0(mpr_tensor_t **in) { return mpr_log_softmax(in[0], 0); }
static mpr_tensor_t *f_dropout_eval(mpr_tensor_t **in) {
    return mpr_mul_scalar(mpr_dropout(in[0], 0.5, false, NULL), 1.5);
}

/* Variants (ref_audit_ops.safetensors). */
static mpr_tensor_t *f_pow_neg(mpr_tensor_t **in) { return mpr_pow(in[0], -1.5); }
static mpr_tensor_t *f_clamp_min(mpr_tensor_t **in) { return mpr_clamp(in[0], -0.2, INFINITY); }
static mpr_tensor_t *f_mean_dims12(mpr_tensor_t **in) { return mpr_mean_dims(in[0], 2, (const int[]){1, 2}, false); }
static mpr_tensor_t *f_sum_last_keep(mpr_tensor_t **in) { return mpr_sum_dims(in[0], 1, (const int[]){-1}, true); }
static mpr_tensor_t *f_max_dim0_keep(mpr_tensor_t **in) { return mpr_max_dim(in[0], 0, true, NULL); }
static mpr_tensor_t *f_linear_nobias(mpr_tensor_t **in) { return mpr_linear(in[0], in[1], NULL); }
static mpr_tensor_t *f_softmax0(mpr_tensor_t **in) { return mpr_softmax(in[0], 0); }
static mpr_tensor_t *f_log_softmax_last(mpr_tensor_t **in) { return mpr_log_softmax(in[0], -1); }
static mpr_tensor_t *f_index_select1(mpr_tensor_t **in) { return mpr_index_select(in[0], 1, in[1]); }
static mpr_tensor_t *f_gather0(mpr_tensor_t **in) { return mpr_gather(in[0], 0, in[1]); }
static mpr_tensor_t *f_cat3(mpr_tensor_t **in) { return mpr_cat(in, 3, 0); }
static mpr_tensor_t *f_stack2(mpr_tensor_t **in) { return mpr_stack(in, 2, 2); }
static mpr_tensor_t *f_conv_rect(mpr_tensor_t **in) { return mpr_conv2d(in[0], in[1], NULL, 2, 1, 1, 2); }
static mpr_tensor_t *f_conv_1x1(mpr_tensor_t **in) { return mpr_conv2d(in[0], in[1], in[2], 1, 1, 0, 0); }
static mpr_tensor_t *f_pool_k3s2p1(mpr_tensor_t **in) { return mpr_max_pool2d(in[0], 3, 3, 2, 2, 1, 1); }
static mpr_tensor_t *f_pool_rect(mpr_tensor_t **in) { return mpr_max_pool2d(in[0], 2, 3, 1, 2, 0, 0); }

typedef struct {
    const char *name;
    int nin;
    op_fn fn;
} op_case_t;

static const op_case_t cases[] = {
    {"add", 2, f_add},
    {"sub", 2, f_sub},
    {"mul", 2, f_mul},
    {"div", 2, f_div},
    {"neg", 1, f_neg},
    {"pow", 1, f_pow},
    {"pow_half", 1, f_pow_half},
    {"exp", 1, f_exp},
    {"log", 1, f_log},
    {"sqrt", 1, f_sqrt},
    {"abs", 1, f_abs},
    {"clamp", 1, f_clamp},
    {"relu", 1, f_relu},
    {"tanh", 1, f_tanh},
    {"sigmoid", 1, f_sigmoid},
    {"gelu", 1, f_gelu},
    {"sum", 1, f_sum},
    {"mean", 1, f_mean},
    {"sum_dim1", 1, f_sum_dim1},
    {"mean_dim0_keep", 1, f_mean_dim0_keep},
    {"max_dim1", 1, f_max_dim1},
    {"matmul", 2, f_matmul},
    {"matmul_batched", 2, f_matmul},
    {"matmul_bcast", 2, f_matmul},
    {"linear", 3, f_linear},
    {"softmax", 1, f_softmax},
    {"log_softmax", 1, f_log_softmax},
    {"cross_entropy", 2, f_cross_entropy},
    {"nll_loss", 2, f_nll_loss},
    {"mse_loss", 2, f_mse_loss},
    {"embedding", 2, f_embedding},
    {"index_select", 2, f_index_select},
    {"gather", 2, f_gather},
    {"cat", 2, f_cat},
    {"stack", 2, f_stack},
    {"split1", 1, f_split1},
    {"chunk2", 1, f_chunk2},
    {"max_all", 1, f_max_all},
    {"sum_dims02", 1, f_sum_dims02},
    {"transpose_matmul", 2, f_transpose_matmul},
    {"permute3", 1, f_permute3},
    {"narrow_mul", 2, f_narrow_mul},
    {"reshape_sum", 1, f_reshape_sum},
    {"unsqueeze_add", 2, f_unsqueeze_add},
    {"log_softmax_dim0", 1, f_log_softmax_dim0},
    {"dropout_eval", 1, f_dropout_eval},
    {"mse_loss_both", 2, f_mse_loss},
    {"conv2d", 3, f_conv2d},
    {"conv2d_s2", 3, f_conv2d_s2},
    {"max_pool2d", 1, f_max_pool2d},
};

static const op_case_t variants[] = {
    {"div_bcast_both", 2, f_div},
    {"pow_neg", 1, f_pow_neg},
    {"clamp_min_only", 1, f_clamp_min},
    {"mean_dims12", 1, f_mean_dims12},
    {"sum_last_keep", 1, f_sum_last_keep},
    {"max_dim0_keep", 1, f_max_dim0_keep},
    {"matmul_vec_mat", 2, f_matmul},
    {"matmul_mat_vec", 2, f_matmul},
    {"matmul_bcast_both", 2, f_matmul},
    {"linear_3d", 3, f_linear},
    {"linear_nobias", 2, f_linear_nobias},
    {"softmax_dim0", 1, f_softmax0},
    {"log_softmax_3d", 1, f_log_softmax_last},
    {"cross_entropy_ignore", 2, f_cross_entropy},
    {"nll_loss_ignore", 2, f_nll_loss},
    {"cross_entropy_1d", 2, f_cross_entropy},
    {"mse_loss_3d", 2, f_mse_loss},
    {"embedding_3d", 2, f_embedding},
    {"index_select_dim1", 2, f_index_select1},
    {"gather_dim0", 2, f_gather0},
    {"cat_dim0_3", 3, f_cat3},
    {"stack_dim2", 2, f_stack2},
    {"conv2d_nobias_rect", 2, f_conv_rect},
    {"conv2d_1x1", 3, f_conv_1x1},
    {"max_pool2d_k3s2p1", 1, f_pool_k3s2p1},
    {"max_pool2d_rect", 1, f_pool_rect},
};

static mpr_tensor_dict_t *refs;


static mpr_tensor_t *ref(const char *name, const char *suffix) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", name, suffix);
    return mpr_tensor_dict_get(refs, key);
}

/* Compare and report the worst element; returns true when close. */
static bool close_to(const char *what, const char *name, mpr_tensor_t *got, mpr_tensor_t *want) {
    if (!got) {
        print_error("%s %s: no tensor (%s)\n", name, what, mpr_last_error());
        return false;
    }
    if (mpr_allclose(got, want, RTOL, ATOL)) return true;
    char a[96], b[96];
    print_error("%s %s: mismatch, got shape %s want %s\n", name, what,
                mpr_shape_str(mpr_tensor_ndim(got), mpr_tensor_shape(got), a, sizeof a),
                mpr_shape_str(mpr_tensor_ndim(want), mpr_tensor_shape(want), b, sizeof b));
    return false;
}

static bool run_case(const op_case_t *c) {
    const char *name = c->name;
    bool ok = true;
    mpr_scope_begin();
    mpr_tensor_t *in[4] = {0};
    for (int i = 0; i < c->nin; i++) {
        char suffix[16];
        snprintf(suffix, sizeof suffix, "in%d", i);
        mpr_tensor_t *r = ref(name, suffix);
        assert_non_null(r);
        /* A fresh leaf per case so gradients do not leak between cases. */
        in[i] = mpr_clone(r);
        assert_non_null(in[i]);
        char key[128];
        snprintf(key, sizeof key, "%s.grad%d", name, i);
        bool has_grad = false;
        for (size_t k = 0; k < mpr_tensor_dict_count(refs); k++)
            has_grad |= strcmp(mpr_tensor_dict_name(refs, k), key) == 0;
        if (has_grad) assert_int_equal(mpr_set_requires_grad(in[i], true), MPR_OK);
    }
    mpr_tensor_t *y = c->fn(in);
    ok &= close_to("output", name, y, ref(name, "out"));
    if (y) {
        mpr_err_t rc = mpr_backward(y, ref(name, "gout"), false);
        if (rc != MPR_OK) {
            print_error("%s backward: %s\n", name, mpr_last_error());
            ok = false;
        } else {
            for (int i = 0; i < c->nin; i++) {
                char suffix[16];
                snprintf(suffix, sizeof suffix, "grad%d", i);
                if (!mpr_requires_grad(in[i])) continue;
                char what[32];
                snprintf(what, sizeof what, "grad of input %d", i);
                ok &= close_to(what, name, mpr_tensor_grad(in[i]), ref(name, suffix));
            }
        }
    }
    mpr_scope_end();
    return ok;
}

/* Run every case against the reference file `file` (in MPIRPC_TEST_DATA). */
static void run_file(const char *file, const op_case_t *cs, size_t n) {
    const char *dir = getenv("MPIRPC_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir ? dir : "tests/data", file);
    refs = mpr_safetensors_load(path);
    if (!refs) fail_msg("cannot load %s: %s", path, mpr_last_error());
    int64_t live = mpr_tensor_live_count();
    int failed = 0;
    for (size_t c = 0; c < n; c++) {
        bool ok = run_case(&cs[c]);
        print_message("%-20s %s\n", cs[c].name, ok ? "ok" : "FAILED");
        failed += !ok;
    }
    assert_int_equal(failed, 0);
    size_t n_out = 0; /* every case in the file has a C counterpart */
    for (size_t k = 0; k < mpr_tensor_dict_count(refs); k++) {
        const char *nm = mpr_tensor_dict_name(refs, k);
        size_t l = strlen(nm);
        n_out += l > 4 && strcmp(nm + l - 4, ".out") == 0;
    }
    assert_int_equal(n_out, n);
    assert_int_equal(mpr_tensor_live_count(), live);
    mpr_tensor_dict_destroy(refs);
    refs = NULL;
}

static void test_ops_against_pytorch(void **state) {
    (void)state;
    run_file("ref_ops.safetensors", cases, sizeof cases / sizeof cases[0]);
}

static void test_op_variants_against_pytorch(void **state) {
    (void)state;
    run_file("ref_audit_ops.safetensors", variants, sizeof variants / sizeof variants[0]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops_against_pytorch),
        cmocka_unit_test(test_op_variants_against_pytorch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
