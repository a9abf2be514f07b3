/* ops_nn_loss.c — nll_loss, cross_entropy (fused log_softmax + nll) and
 * mse_loss, mean reduction, with backward, on the tensors' device through
 * its backend table (CPU kernels, or their CUDA twins in a CUDA build).
 *
 * Invariants: class targets are int64, on the input's device, and validated
 * to lie in [0, C) (or equal ignore_index) before any computation (GPU
 * targets are copied to the host for the check); the loss is a 0-d tensor of
 * the input's dtype on its device; the number of counted rows is fixed at
 * forward time and stored in the node, so backward divides by the same
 * count. cross_entropy saves only the logits, the targets and the per-row
 * log-sum-exp (not the [N, C] probabilities). */
#include <stdlib.h>

#include "mpri_args.h"
#include "mpri_assert.h"
#include "mpri_nn_ops.h"

/* Checks input [N, C] / target [N] (or input [C] / target 0-d), same device. */
static mpr_err_t check_class_args(const char *op, const mpr_tensor_t *x, const mpr_tensor_t *t,
                                  int64_t *N, int64_t *C) {
    mpr_err_t e = mpri_check_float(op, x);
    if (e != MPR_OK) return e;
    if (t->dtype != MPR_I64)
        return mpr_error_set(MPR_ERR_DTYPE, "%s: target must be int64, got %s", op,
                             mpr_dtype_name(t->dtype));
    int dev = mpri_nn_dev(x);
    if (mpri_nn_dev(t) != dev)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: input is on device %d, target on device %d",
                             op, dev, mpri_nn_dev(t));
    if (!mpri_backend_for(op, dev)) return mpr_last_error_code();
    char bx[96], bt[96];
    if (!((x->ndim == 2 && t->ndim == 1 && t->shape[0] == x->shape[0]) ||
          (x->ndim == 1 && t->ndim == 0)))
        return mpr_error_set(MPR_ERR_SHAPE,
                             "%s: expected input [N, C] with target [N] (or [C] with a 0-d "
                             "target), got input %s and target %s",
                             op, mpri_nn_shape(x, bx, sizeof bx), mpri_nn_shape(t, bt, sizeof bt));
    *N = x->ndim == 2 ? x->shape[0] : 1;
    *C = x->shape[x->ndim - 1];
    return MPR_OK;
}

/* Range check of the contiguous target tc [N] (copied to the host if on a GPU). */
static mpr_err_t check_targets(const char *op, const mpr_tensor_t *tc, int64_t N, int64_t C,
                               int64_t ignore_index) {
    int dev = mpri_nn_dev(tc);
    if (dev < 0) return mpri_nn_check_range(op, "target", mpr_tensor_data(tc), N, C, ignore_index);
    int64_t *h = malloc(sizeof(int64_t) * (size_t)(N ? N : 1));
    if (!h) return mpr_error_set(MPR_ERR_NOMEM, "%s: out of memory", op);
    mpr_err_t e = mpri_nn_to_host(h, mpr_tensor_data(tc), dev, sizeof(int64_t) * (size_t)N);
    if (e == MPR_OK) e = mpri_nn_check_range(op, "target", h, N, C, ignore_index);
    free(h);
    return e;
}

/* State of nll_loss and cross_entropy nodes: rows counted at forward time. */
typedef struct mpri_ctx_class_loss {
    int64_t ignore_index; /* target value that counts no row */
    int64_t count;        /* rows with another target: the mean's divisor */
} mpri_ctx_class_loss_t;

/* ---- shared by nll_loss and cross_entropy ---- */

/* The kernel writing dL/dx ([N, C], overwritten) of a class loss from its
 * node's saved tensors, the state and the upstream scalar g. */
typedef mpr_err_t (*class_grad_kernel_t)(const mpri_backend_t *B, int dev, mpr_dtype_t dt, mpr_tensor_t *const *saved,
                                         int64_t N, int64_t C, const mpri_ctx_class_loss_t *st, double g, void *gx);

/* Backward of a class loss whose node saved `nsaved` tensors (at most 3):
 * gx like input 0, on its device, filled by `kernel`. */
static mpr_err_t class_loss_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin, int nsaved,
                                     class_grad_kernel_t kernel) {
    mpr_tensor_t *saved[3];
    MPRI_ASSERT(nsaved <= 3, "a class loss saves at most 3 tensors");
    bool ok = true;
    for (int i = 0; i < nsaved; i++) ok &= (saved[i] = mpri_node_saved(n, i)) != NULL;
    if (!ok) return mpr_last_error_code();
    if (!mpri_node_needs_grad(n, 0)) return MPR_OK;
    double g;
    if (mpri_nn_item(gout[0], &g) != MPR_OK) return mpr_last_error_code();
    const mpri_tensor_meta_t *m = &n->in_meta[0];
    int64_t N = m->ndim == 2 ? m->shape[0] : 1, C = m->shape[m->ndim - 1];
    mpr_tensor_t *gx = mpri_empty_on(m->device, m->dtype, m->ndim, m->shape);
    if (!gx) return mpr_last_error_code();
    const mpri_backend_t *B = mpri_backend_for(n->def->name, m->device);
    mpr_err_t e = B ? kernel(B, m->device, m->dtype, saved, N, C, MPRI_NODE_STATE(n, mpri_ctx_class_loss_t), g,
                             mpr_tensor_data(gx))
                    : mpr_last_error_code();
    if (e != MPR_OK) {
        mpr_tensor_release(gx);
        return e;
    }
    gin[0] = mpri_result(gx);
    return MPR_OK;
}

/* Forward tail: the loss `out` (NULL after a failure passes through) gets a
 * node of `def` on input x with the state and the `saved` tensors. */
static void record_class_loss(const mpri_op_def_t *def, mpr_tensor_t *x, mpr_tensor_t *out, int64_t ignore_index,
                              int64_t count, int nsaved, mpr_tensor_t *const *saved) {
    mpri_node_t *n = out ? mpri_record(def, 1, &x, out) : NULL;
    if (!n) return;
    *MPRI_NODE_STATE(n, mpri_ctx_class_loss_t) = (mpri_ctx_class_loss_t){.ignore_index = ignore_index, .count = count};
    for (int i = 0; i < nsaved; i++) mpri_node_save(n, saved[i]);
}

/* ------------------------------------------------------------- nll_loss
 * Saved: the contiguous target. */

static mpr_err_t nll_grad(const mpri_backend_t *B, int dev, mpr_dtype_t dt, mpr_tensor_t *const *saved, int64_t N,
                          int64_t C, const mpri_ctx_class_loss_t *st, double g, void *gx) {
    return MPRI_BK(B, nll_loss_bwd, dev, dt, mpr_tensor_data(saved[0]), N, C, st->ignore_index, st->count, g, gx);
}

static mpr_err_t nll_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    return class_loss_backward(n, gout, gin, 1, nll_grad);
}

static const mpri_op_def_t nll_def = {.name = "nll_loss", .backward = nll_backward, MPRI_OP_STATE(mpri_ctx_class_loss_t)};

mpr_tensor_t *mpr_nll_loss_ex(mpr_tensor_t *logp, mpr_tensor_t *target, int64_t ignore_index) {
    MPRI_OP_INPUT(logp);
    MPRI_OP_INPUT(target);
    if (!logp || !target) return NULL;
    const char *op = "nll_loss";
    int64_t N, C;
    if (check_class_args(op, logp, target, &N, &C) != MPR_OK) return NULL;
    int dev = mpri_nn_dev(logp);
    const mpri_backend_t *B = mpri_backend_for(op, dev); /* non-NULL: checked above */
    mpr_tensor_t *xc = mpri_contiguous_raw(logp), *tc = mpri_contiguous_raw(target), *out = NULL;
    mpr_err_t e = (!xc || !tc) ? mpr_last_error_code() : check_targets(op, tc, N, C, ignore_index);
    int64_t count = 0;
    double loss = 0;
    if (e == MPR_OK) {
        e = MPRI_BK(B, nll_loss_fwd, dev, logp->dtype, mpr_tensor_data(xc), mpr_tensor_data(tc), N, C,
                    ignore_index, &loss, &count);
    }
    if (e == MPR_OK) out = mpri_nn_scalar_on(dev, logp->dtype, loss);
    mpr_tensor_release(xc);
    record_class_loss(&nll_def, logp, out, ignore_index, count, 1, &tc);
    mpr_tensor_release(tc);
    return mpri_result(out);
}

mpr_tensor_t *mpr_nll_loss(mpr_tensor_t *logp, mpr_tensor_t *target) {
    MPRI_OP_INPUT(logp);
    MPRI_OP_INPUT(target);
    return mpr_nll_loss_ex(logp, target, MPR_IGNORE_INDEX_DEFAULT);
}

/* -------------------------------------------------------- cross_entropy
 * Saved: the contiguous logits, the contiguous target, the per-row lse. */

static mpr_err_t ce_grad(const mpri_backend_t *B, int dev, mpr_dtype_t dt, mpr_tensor_t *const *saved, int64_t N,
                         int64_t C, const mpri_ctx_class_loss_t *st, double g, void *gx) {
    return MPRI_BK(B, cross_entropy_bwd, dev, dt, mpr_tensor_data(saved[0]), mpr_tensor_data(saved[1]),
                   mpr_tensor_data(saved[2]), N, C, st->ignore_index, st->count, g, gx);
}

static mpr_err_t ce_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    return class_loss_backward(n, gout, gin, 3, ce_grad);
}

static const mpri_op_def_t ce_def = {.name = "cross_entropy", .backward = ce_backward, MPRI_OP_STATE(mpri_ctx_class_loss_t)};

mpr_tensor_t *mpr_cross_entropy_ex(mpr_tensor_t *logits, mpr_tensor_t *target,
                                   int64_t ignore_index) {
    MPRI_OP_INPUT(logits);
    MPRI_OP_INPUT(target);
    if (!logits || !target) return NULL;
    const char *op = "cross_entropy";
    int64_t N, C;
    if (check_class_args(op, logits, target, &N, &C) != MPR_OK) return NULL;
    int dev = mpri_nn_dev(logits);
    const mpri_backend_t *B = mpri_backend_for(op, dev); /* non-NULL: checked above */
    mpr_tensor_t *xc = mpri_contiguous_raw(logits), *tc = mpri_contiguous_raw(target);
    mpr_tensor_t *lse = mpri_empty_on(dev, logits->dtype, 1, (int64_t[]){N}), *out = NULL;
    mpr_err_t e = (!xc || !tc || !lse) ? mpr_last_error_code()
                                       : check_targets(op, tc, N, C, ignore_index);
    int64_t count = 0;
    double loss = 0;
    if (e == MPR_OK) {
        e = MPRI_BK(B, cross_entropy_fwd, dev, logits->dtype, mpr_tensor_data(xc), mpr_tensor_data(tc), N, C,
                    ignore_index, mpr_tensor_data(lse), &loss, &count);
    }
    if (e == MPR_OK) out = mpri_nn_scalar_on(dev, logits->dtype, loss);
    /* The contiguous logits: when `logits` was already contiguous this is the
     * same storage, so in-place changes are detected by version. */
    record_class_loss(&ce_def, logits, out, ignore_index, count, 3, (mpr_tensor_t *[]){xc, tc, lse});
    mpr_tensor_release(xc);
    mpr_tensor_release(tc);
    mpr_tensor_release(lse);
    return mpri_result(out);
}

mpr_tensor_t *mpr_cross_entropy(mpr_tensor_t *logits, mpr_tensor_t *target) {
    MPRI_OP_INPUT(logits);
    MPRI_OP_INPUT(target);
    return mpr_cross_entropy_ex(logits, target, MPR_IGNORE_INDEX_DEFAULT);
}

/* ------------------------------------------------------------- mse_loss */

static mpr_err_t mse_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    mpr_tensor_t *a = mpri_node_saved(n, 0), *b = mpri_node_saved(n, 1);
    if (!a || !b) return mpr_last_error_code();
    bool need_a = mpri_node_needs_grad(n, 0), need_b = mpri_node_needs_grad(n, 1);
    double g;
    if (mpri_nn_item(gout[0], &g) != MPR_OK) return mpr_last_error_code();
    int dev = mpri_nn_dev(a);
    mpr_tensor_t *ga = need_a ? mpri_empty_on(dev, a->dtype, a->ndim, a->shape) : NULL;
    mpr_tensor_t *gb = need_b ? mpri_empty_on(dev, b->dtype, b->ndim, b->shape) : NULL;
    mpr_err_t e = ((need_a && !ga) || (need_b && !gb)) ? mpr_last_error_code() : MPR_OK;
    int64_t numel = mpr_tensor_numel(a);
    void *gad = ga ? mpr_tensor_data(ga) : NULL, *gbd = gb ? mpr_tensor_data(gb) : NULL;
    if (e == MPR_OK) {
        const mpri_backend_t *B = mpri_backend_for(n->def->name, dev);
        e = B ? MPRI_BK(B, mse_loss_bwd, dev, a->dtype, mpr_tensor_data(a), mpr_tensor_data(b), numel, g, gad, gbd)
              : mpr_last_error_code();
    }
    if (e != MPR_OK) {
        mpr_tensor_release(ga);
        mpr_tensor_release(gb);
        return e;
    }
    gin[0] = mpri_result(ga);
    gin[1] = mpri_result(gb);
    return MPR_OK;
}

static const mpri_op_def_t mse_def = {.name = "mse_loss", .backward = mse_backward};

mpr_tensor_t *mpr_mse_loss(mpr_tensor_t *input, mpr_tensor_t *target) {
    MPRI_OP_INPUT(input);
    MPRI_OP_INPUT(target);
    if (!input || !target) return NULL;
    const char *op = "mse_loss";
    int dev = mpri_nn_dev(input);
    if (mpri_check_float(op, input) != MPR_OK || mpri_check_same_dtype(op, input, target) != MPR_OK)
        return NULL;
    if (mpri_nn_dev(target) != dev) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "mse_loss: input is on device %d, target on device %d",
                      dev, mpri_nn_dev(target));
        return NULL;
    }
    const mpri_backend_t *B = mpri_backend_for(op, dev);
    if (!B) return NULL;
    bool same = input->ndim == target->ndim;
    for (int i = 0; same && i < input->ndim; i++) same = input->shape[i] == target->shape[i];
    if (!same) {
        mpri_err_shape2(op, "input and target must have the same shape, got", input, target);
        return NULL;
    }
    mpr_tensor_t *ac = mpri_contiguous_raw(input), *bc = mpri_contiguous_raw(target), *out = NULL;
    mpr_err_t e = (!ac || !bc) ? mpr_last_error_code() : MPR_OK;
    int64_t numel = mpr_tensor_numel(input);
    double loss = 0;
    if (e == MPR_OK) {
        e = MPRI_BK(B, mse_loss_fwd, dev, input->dtype, mpr_tensor_data(ac), mpr_tensor_data(bc), numel, &loss);
    }
    if (e == MPR_OK) out = mpri_nn_scalar_on(dev, input->dtype, loss);
    if (out) {
        mpri_node_t *n = mpri_record(&mse_def, 2, (mpr_tensor_t *[]){input, target}, out);
        if (n) {
            mpri_node_save(n, ac);
            mpri_node_save(n, bc);
        }
    }
    mpr_tensor_release(ac);
    mpr_tensor_release(bc);
    return mpri_result(out);
}
