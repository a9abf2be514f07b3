/* ops_elementwise.c — elementwise ops with backward: broadcasting add, sub,
 * mul, div; unary neg, exp, log, sqrt, abs, pow(scalar), clamp, scalar
 * add/mul/rsub, relu, tanh, sigmoid, gelu (erf form).
 *
 * Invariants: results are new contiguous tensors of the broadcast shape;
 * binary backward reduces each gradient back to its operand's shape with
 * mpri_sum_to; unary ops save only what their derivative needs (the input
 * for log/abs/pow/clamp/gelu, the output for exp/sqrt/relu/tanh/sigmoid). */
#include "mpri_args.h"
#include "mpri_autograd.h"
#include "kernels/mpri_kernels.h"

/* ------------------------------------------------------------- binary */

static const char *const bin_names[] = {"add", "sub", "mul", "div"};

static void bcast_strides(const mpr_tensor_t *t, int n, const int64_t *shape, int64_t *st) {
    int lead = n - t->ndim;
    for (int i = 0; i < n; i++) {
        if (i < lead) st[i] = 0;
        else st[i] = (t->shape[i - lead] == 1 && shape[i] != 1) ? 0 : t->strides[i - lead];
    }
}

/* Forward of a binary op without recording (also used by backward). */
static mpr_tensor_t *binary_raw(mpri_binop_t op, mpr_tensor_t *a, mpr_tensor_t *b) {
    const char *name = bin_names[op];
    if (mpri_check_float(name, a) || mpri_check_float(name, b) || mpri_check_same_dtype(name, a, b))
        return NULL;
    int n;
    int64_t shape[MPR_MAX_DIMS], sa[MPR_MAX_DIMS], sb[MPR_MAX_DIMS];
    if (mpri_broadcast_shape(name, a->ndim, a->shape, b->ndim, b->shape, &n, shape) != MPR_OK)
        return NULL;
    const mpri_backend_t *B = mpri_backend_of(name, 2, (mpr_tensor_t *[]){a, b});
    mpr_tensor_t *out = B ? mpri_empty_on(a->storage->device, a->dtype, n, shape) : NULL;
    if (!out) return NULL;
    bcast_strides(a, n, shape, sa);
    bcast_strides(b, n, shape, sb);
    if (MPRI_BK(B, binary, a->storage->device, op, a->dtype, n, shape, mpr_tensor_data(out), out->strides,
                mpr_tensor_data(a), sa, mpr_tensor_data(b), sb, 1.0) != MPR_OK) {
        mpr_tensor_release(out);
        return NULL;
    }
    return out;
}

static const mpri_op_def_t sub_def;

static mpr_err_t add_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    mpr_tensor_t *g = gout[0];
    if (mpri_node_needs_grad(n, 0))
        gin[0] = mpri_sum_to_shape(g, n->in_meta[0].ndim, n->in_meta[0].shape);
    if (mpri_node_needs_grad(n, 1)) {
        mpr_tensor_t *gb = n->def == &sub_def ? mpr_neg(g) : g; /* d(a - b)/db = -1 */
        gin[1] = mpri_sum_to_shape(gb, n->in_meta[1].ndim, n->in_meta[1].shape);
    }
    if ((mpri_node_needs_grad(n, 0) && !gin[0]) || (mpri_node_needs_grad(n, 1) && !gin[1]))
        return mpr_last_error_code();
    return MPR_OK;
}

static mpr_err_t mul_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    mpr_tensor_t *a = mpri_node_saved(n, 0), *b = mpri_node_saved(n, 1);
    if (!a || !b) return mpr_last_error_code();
    if (mpri_node_needs_grad(n, 0) && !(gin[0] = mpri_sum_to(mpr_mul(gout[0], b), a)))
        return mpr_last_error_code();
    if (mpri_node_needs_grad(n, 1) && !(gin[1] = mpri_sum_to(mpr_mul(gout[0], a), b)))
        return mpr_last_error_code();
    return MPR_OK;
}

static mpr_err_t div_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    mpr_tensor_t *a = mpri_node_saved(n, 0), *b = mpri_node_saved(n, 1);
    if (!a || !b) return mpr_last_error_code();
    /* d(a/b)/da = 1/b ; d(a/b)/db = -a/b^2 */
    if (mpri_node_needs_grad(n, 0) && !(gin[0] = mpri_sum_to(mpr_div(gout[0], b), a)))
        return mpr_last_error_code();
    if (mpri_node_needs_grad(n, 1) &&
        !(gin[1] = mpri_sum_to(mpr_neg(mpr_div(mpr_mul(gout[0], a), mpr_mul(b, b))), b)))
        return mpr_last_error_code();
    return MPR_OK;
}

static const mpri_op_def_t add_def = {.name = "add", .backward = add_backward};
static const mpri_op_def_t sub_def = {.name = "sub", .backward = add_backward};
static const mpri_op_def_t mul_def = {.name = "mul", .backward = mul_backward};
static const mpri_op_def_t div_def = {.name = "div", .backward = div_backward};

static mpr_tensor_t *binary(mpri_binop_t op, mpr_tensor_t *a, mpr_tensor_t *b) {
    if (!a || !b) return NULL;
    mpr_tensor_t *out = binary_raw(op, a, b);
    if (!out) return NULL;
    static const mpri_op_def_t *const defs[] = {&add_def, &sub_def, &mul_def, &div_def};
    mpri_node_t *n = mpri_record(defs[op], 2, (mpr_tensor_t *[]){a, b}, out);
    if (n && (op == MPRI_BIN_MUL || op == MPRI_BIN_DIV)) {
        mpri_node_save(n, a);
        mpri_node_save(n, b);
    }
    return mpri_result(out);
}

mpr_tensor_t *mpr_add(mpr_tensor_t *a, mpr_tensor_t *b) {
    MPRI_OP_INPUT(a);
    MPRI_OP_INPUT(b);
    return binary(MPRI_BIN_ADD, a, b);
}
mpr_tensor_t *mpr_sub(mpr_tensor_t *a, mpr_tensor_t *b) {
    MPRI_OP_INPUT(a);
    MPRI_OP_INPUT(b);
    return binary(MPRI_BIN_SUB, a, b);
}
mpr_tensor_t *mpr_mul(mpr_tensor_t *a, mpr_tensor_t *b) {
    MPRI_OP_INPUT(a);
    MPRI_OP_INPUT(b);
    return binary(MPRI_BIN_MUL, a, b);
}
mpr_tensor_t *mpr_div(mpr_tensor_t *a, mpr_tensor_t *b) {
    MPRI_OP_INPUT(a);
    MPRI_OP_INPUT(b);
    return binary(MPRI_BIN_DIV, a, b);
}

/* -------------------------------------------------------------- unary */

typedef struct unary_info {
    const char *name;
    bool save_x, save_y;
} unary_info_t;

static const unary_info_t un_info[MPRI_UN_COUNT] = {
    [MPRI_UN_NEG] = {"neg", false, false},      [MPRI_UN_EXP] = {"exp", false, true},
    [MPRI_UN_LOG] = {"log", true, false},       [MPRI_UN_SQRT] = {"sqrt", false, true},
    [MPRI_UN_ABS] = {"abs", true, false},       [MPRI_UN_RELU] = {"relu", false, true},
    [MPRI_UN_TANH] = {"tanh", false, true},     [MPRI_UN_SIGMOID] = {"sigmoid", false, true},
    [MPRI_UN_GELU] = {"gelu", true, false},     [MPRI_UN_POW] = {"pow", true, false},
    [MPRI_UN_CLAMP] = {"clamp", true, false},   [MPRI_UN_ADD_S] = {"add_scalar", false, false},
    [MPRI_UN_MUL_S] = {"mul_scalar", false, false}, [MPRI_UN_RSUB_S] = {"rsub_scalar", false, false},
};

/* State of every unary node: the kernel op and its scalar parameters. */
typedef struct mpri_ctx_unary {
    mpri_unop_t op;
    double p0, p1; /* exponent (pow), bounds (clamp), scalar (add/mul/rsub_scalar) */
} mpri_ctx_unary_t;

static mpr_err_t unary_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    const mpri_ctx_unary_t *st = MPRI_NODE_STATE(n, mpri_ctx_unary_t);
    mpri_unop_t op = st->op;
    const mpr_tensor_t *x = NULL, *y = NULL;
    int k = 0;
    if (un_info[op].save_x && !(x = mpri_node_saved(n, k++))) return mpr_last_error_code();
    if (un_info[op].save_y && !(y = mpri_node_saved(n, k++))) return mpr_last_error_code();
    const mpri_backend_t *B = mpri_backend_of(n->def->name, 1, gout);
    if (!B) return mpr_last_error_code();
    mpr_tensor_t *g = mpri_result(mpri_contiguous_raw(gout[0]));
    if (!g) return mpr_last_error_code();
    mpr_tensor_t *out = mpri_result(mpri_empty_on(g->storage->device, g->dtype, g->ndim, g->shape));
    if (!out) return mpr_last_error_code();
    mpr_err_t rc = MPRI_BK(B, unary_backward, g->storage->device, op, g->dtype, mpr_tensor_numel(g),
                           mpr_tensor_data(out), mpr_tensor_data(g), x ? mpr_tensor_data(x) : NULL,
                           y ? mpr_tensor_data(y) : NULL, st->p0, st->p1);
    if (rc != MPR_OK) return rc;
    gin[0] = out;
    return gin[0] ? MPR_OK : mpr_last_error_code();
}

#define UNARY_DEF(NAME) {.name = #NAME, .backward = unary_backward, MPRI_OP_STATE(mpri_ctx_unary_t)}
static const mpri_op_def_t un_defs[MPRI_UN_COUNT] = {
    [MPRI_UN_NEG] = UNARY_DEF(neg),         [MPRI_UN_EXP] = UNARY_DEF(exp),
    [MPRI_UN_LOG] = UNARY_DEF(log),         [MPRI_UN_SQRT] = UNARY_DEF(sqrt),
    [MPRI_UN_ABS] = UNARY_DEF(abs),         [MPRI_UN_RELU] = UNARY_DEF(relu),
    [MPRI_UN_TANH] = UNARY_DEF(tanh),       [MPRI_UN_SIGMOID] = UNARY_DEF(sigmoid),
    [MPRI_UN_GELU] = UNARY_DEF(gelu),       [MPRI_UN_POW] = UNARY_DEF(pow),
    [MPRI_UN_CLAMP] = UNARY_DEF(clamp),     [MPRI_UN_ADD_S] = UNARY_DEF(add_scalar),
    [MPRI_UN_MUL_S] = UNARY_DEF(mul_scalar), [MPRI_UN_RSUB_S] = UNARY_DEF(rsub_scalar),
};

static mpr_tensor_t *unary(mpri_unop_t op, mpr_tensor_t *a, double p0, double p1) {
    if (!a) return NULL;
    if (mpri_check_float(un_info[op].name, a) != MPR_OK) return NULL;
    /* Inputs are read contiguously; a strided input is copied first (and the
     * copy is what gets saved, so strides never reach the kernels). */
    const mpri_backend_t *B = mpri_backend_of(un_info[op].name, 1, &a);
    mpr_tensor_t *x = B ? mpri_contiguous_raw(a) : NULL;
    if (!x) return NULL;
    mpr_tensor_t *out = mpri_empty_on(a->storage->device, a->dtype, a->ndim, a->shape);
    if (!out) {
        mpr_tensor_release(x);
        return NULL;
    }
    if (MPRI_BK(B, unary, a->storage->device, op, a->dtype, mpr_tensor_numel(a), mpr_tensor_data(out),
                mpr_tensor_data(x), p0, p1) != MPR_OK) {
        mpr_tensor_release(x);
        mpr_tensor_release(out);
        return NULL;
    }
    mpri_node_t *n = mpri_record(&un_defs[op], 1, &a, out);
    if (n) {
        *MPRI_NODE_STATE(n, mpri_ctx_unary_t) = (mpri_ctx_unary_t){.op = op, .p0 = p0, .p1 = p1};
        if (un_info[op].save_x) mpri_node_save(n, x);
        if (un_info[op].save_y) mpri_node_save(n, out);
    }
    mpr_tensor_release(x);
    return mpri_result(out);
}

mpr_tensor_t *mpr_neg(mpr_tensor_t *a) {
    MPRI_OP_INPUT(a);
    return unary(MPRI_UN_NEG, a, 0, 0);
}
mpr_tensor_t *mpr_exp(mpr_tensor_t *a) {
    MPRI_OP_INPUT(a);
    return unary(MPRI_UN_EXP, a, 0, 0);
}
mpr_tensor_t *mpr_log(mpr_tensor_t *a) {
    MPRI_OP_INPUT(a);
    return unary(MPRI_UN_LOG, a, 0, 0);
}
mpr_tensor_t *mpr_sqrt(mpr_tensor_t *a) {
    MPRI_OP_INPUT(a);
    return unary(MPRI_UN_SQRT, a, 0, 0);
}
mpr_tensor_t *mpr_abs(mpr_tensor_t *a) {
    MPRI_OP_INPUT(a);
    return unary(MPRI_UN_ABS, a, 0, 0);
}
mpr_tensor_t *mpr_relu(mpr_tensor_t *a) {
    MPRI_OP_INPUT(a);
    return unary(MPRI_UN_RELU, a, 0, 0);
}
mpr_tensor_t *mpr_tanh(mpr_tensor_t *a) {
    MPRI_OP_INPUT(a);
    return unary(MPRI_UN_TANH, a, 0, 0);
}
mpr_tensor_t *mpr_sigmoid(mpr_tensor_t *a) {
    MPRI_OP_INPUT(a);
    return unary(MPRI_UN_SIGMOID, a, 0, 0);
}
mpr_tensor_t *mpr_gelu(mpr_tensor_t *a) {
    MPRI_OP_INPUT(a);
    return unary(MPRI_UN_GELU, a, 0, 0);
}
mpr_tensor_t *mpr_pow(mpr_tensor_t *a, double e) {
    MPRI_OP_INPUT(a);
    return unary(MPRI_UN_POW, a, e, 0);
}
mpr_tensor_t *mpr_add_scalar(mpr_tensor_t *a, double s) {
    MPRI_OP_INPUT(a);
    return unary(MPRI_UN_ADD_S, a, s, 0);
}
mpr_tensor_t *mpr_mul_scalar(mpr_tensor_t *a, double s) {
    MPRI_OP_INPUT(a);
    return unary(MPRI_UN_MUL_S, a, s, 0);
}
mpr_tensor_t *mpr_rsub_scalar(mpr_tensor_t *a, double s) {
    MPRI_OP_INPUT(a);
    return unary(MPRI_UN_RSUB_S, a, s, 0);
}

mpr_tensor_t *mpr_clamp(mpr_tensor_t *a, double lo, double hi) {
    MPRI_OP_INPUT(a);
    if (a && lo > hi) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "clamp: lo %g > hi %g", lo, hi);
        return NULL;
    }
    return unary(MPRI_UN_CLAMP, a, lo, hi);
}
