/* ops_nn_softmax.c — softmax and log_softmax along one dim, with backward.
 *
 * Invariants: the forward output is what backward saves (both gradients are
 * functions of y alone: softmax dx = y (dy - <dy, y>), log_softmax
 * dx = dy - exp(y) sum(dy)); inputs of any strides are made contiguous first;
 * the kernels (runtime/kernels/cpu_softmax.c, and their CUDA twins for
 * tensors on a GPU, both reached through the device's backend table) are
 * numerically stable. */
#include "mpri_args.h"
#include "mpri_nn_ops.h"

static mpr_err_t softmax_backward_common(mpri_node_t *n, mpr_tensor_t *const *gout,
                                         mpr_tensor_t **gin, int is_log) {
    mpr_tensor_t *y = mpri_node_saved(n, 0);
    if (!y) return mpr_last_error_code();
    if (!mpri_node_needs_grad(n, 0)) return MPR_OK;
    int dim = MPRI_NODE_STATE(n, mpri_ctx_dim_t)->dim;
    int64_t outer, inner;
    mpri_nn_split_dims(y->ndim, y->shape, dim, &outer, &inner);
    int64_t len = y->ndim ? y->shape[dim] : 1;
    int dev = mpri_nn_dev(y);
    mpr_tensor_t *gy = mpri_contiguous_raw(gout[0]);
    mpr_tensor_t *gx = mpri_empty_on(dev, y->dtype, y->ndim, y->shape);
    if (!gy || !gx) {
        mpr_tensor_release(gy);
        mpr_tensor_release(gx);
        return mpr_last_error_code();
    }
    const mpri_backend_t *B = mpri_backend_for(n->def->name, dev);
    mpr_err_t e = B ? MPRI_BK(B, softmax_bwd, dev, y->dtype, mpr_tensor_data(y), mpr_tensor_data(gy),
                              mpr_tensor_data(gx), outer, len, inner, is_log)
                    : mpr_last_error_code();
    mpr_tensor_release(gy);
    if (e != MPR_OK) {
        mpr_tensor_release(gx);
        return e;
    }
    gin[0] = mpri_result(gx);
    return MPR_OK;
}

static mpr_err_t softmax_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    return softmax_backward_common(n, gout, gin, 0);
}
static mpr_err_t log_softmax_backward(mpri_node_t *n, mpr_tensor_t *const *gout,
                                      mpr_tensor_t **gin) {
    return softmax_backward_common(n, gout, gin, 1);
}

static const mpri_op_def_t softmax_def = {.name = "softmax", .backward = softmax_backward, MPRI_OP_STATE(mpri_ctx_dim_t)};
static const mpri_op_def_t log_softmax_def = {.name = "log_softmax", .backward = log_softmax_backward, MPRI_OP_STATE(mpri_ctx_dim_t)};

static mpr_tensor_t *softmax_common(const mpri_op_def_t *def, mpr_tensor_t *x, int dim,
                                    int is_log) {
    if (!x) return NULL;
    const char *op = def->name;
    int d;
    int dev = mpri_nn_dev(x);
    const mpri_backend_t *B;
    if (mpri_check_float(op, x) != MPR_OK || !(B = mpri_backend_for(op, dev)) ||
        mpri_norm_dim(op, dim, x->ndim, &d) != MPR_OK)
        return NULL;
    int64_t outer, inner;
    mpri_nn_split_dims(x->ndim, x->shape, d, &outer, &inner);
    int64_t len = x->ndim ? x->shape[d] : 1;
    mpr_tensor_t *xc = mpri_contiguous_raw(x);
    if (!xc) return NULL;
    mpr_tensor_t *y = mpri_empty_on(dev, x->dtype, x->ndim, x->shape);
    if (!y) {
        mpr_tensor_release(xc);
        return NULL;
    }
    mpr_err_t e = MPRI_BK(B, softmax_fwd, dev, x->dtype, mpr_tensor_data(xc), mpr_tensor_data(y), outer, len,
                          inner, is_log);
    mpr_tensor_release(xc);
    if (e != MPR_OK) {
        mpr_tensor_release(y);
        return NULL;
    }
    mpri_node_t *n = mpri_record(def, 1, &x, y);
    if (n) {
        MPRI_NODE_STATE(n, mpri_ctx_dim_t)->dim = d;
        mpri_node_save(n, y);
    }
    return mpri_result(y);
}

mpr_tensor_t *mpr_softmax(mpr_tensor_t *x, int dim) {
    MPRI_OP_INPUT(x);
    return softmax_common(&softmax_def, x, dim, 0);
}

mpr_tensor_t *mpr_log_softmax(mpr_tensor_t *x, int dim) {
    MPRI_OP_INPUT(x);
    return softmax_common(&log_softmax_def, x, dim, 1);
}
