/* ops_nn_loss.c — nll_loss, cross_entropy (fused log_softmax + nll) and
 * mse_loss, mean reduction, with backward.
 *
 * Invariants: class targets are int64, validated to lie in [0, C) (or equal
 * ignore_index) before any computation; the loss is a 0-d tensor of the
 * input's dtype; the number of counted rows is fixed at forward time and
 * stored in the node, so backward divides by the same count. cross_entropy
 * saves only the logits, the targets and the per-row log-sum-exp (not the
 * [N, C] probabilities). */
#include "mpri_nn_ops.h"

/* Checks input [N, C] / target [N] (or input [C] / target 0-d) and gives N, C. */
static mpr_err_t check_class_args(const char *op, const mpr_tensor_t *x, const mpr_tensor_t *t,
                                  int64_t ignore_index, int64_t *N, int64_t *C) {
    mpr_err_t e = mpri_nn_check_float_cpu(op, x);
    if (e == MPR_OK) e = mpri_nn_check_index(op, "target", t);
    if (e != MPR_OK) return e;
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

/* ------------------------------------------------------------- nll_loss */

static mpr_err_t nll_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    mpr_tensor_t *t = mpri_node_saved(n, 0);
    if (!t) return mpr_last_error_code();
    if (!mpri_node_needs_grad(n, 0)) return MPR_OK;
    double g;
    if (mpr_item(gout[0], &g) != MPR_OK) return mpr_last_error_code();
    const mpri_tensor_meta_t *m = &n->in_meta[0];
    int64_t N = m->ndim == 2 ? m->shape[0] : 1, C = m->shape[m->ndim - 1];
    mpr_tensor_t *gx = mpr_tensor_empty(m->dtype, m->ndim, m->shape);
    if (!gx) return mpr_last_error_code();
    if (m->dtype == MPR_F32)
        mpri_nll_loss_bwd_f32(mpr_tensor_data(t), N, C, n->iparam[0], n->iparam[1], g,
                              mpr_tensor_data(gx));
    else
        mpri_nll_loss_bwd_f64(mpr_tensor_data(t), N, C, n->iparam[0], n->iparam[1], g,
                              mpr_tensor_data(gx));
    gin[0] = mpri_result(gx);
    return MPR_OK;
}

static const mpri_op_def_t nll_def = {"nll_loss", nll_backward, NULL};

mpr_tensor_t *mpr_nll_loss_ex(mpr_tensor_t *logp, mpr_tensor_t *target, int64_t ignore_index) {
    if (!logp || !target) return NULL;
    int64_t N, C;
    if (check_class_args("nll_loss", logp, target, ignore_index, &N, &C) != MPR_OK) return NULL;
    mpr_tensor_t *xc = mpr_tensor_contiguous(logp), *tc = mpr_tensor_contiguous(target);
    mpr_tensor_t *out = mpr_tensor_empty(logp->dtype, 0, NULL);
    if (!xc || !tc || !out ||
        mpri_nn_check_range("nll_loss", "target", mpr_tensor_data(tc), N, C, ignore_index) != MPR_OK) {
        mpr_tensor_release(xc);
        mpr_tensor_release(tc);
        mpr_tensor_release(out);
        return NULL;
    }
    int64_t count;
    double loss;
    if (logp->dtype == MPR_F32) {
        loss = mpri_nll_loss_fwd_f32(mpr_tensor_data(xc), mpr_tensor_data(tc), N, C, ignore_index,
                                     &count);
        *(float *)mpr_tensor_data(out) = (float)loss;
    } else {
        loss = mpri_nll_loss_fwd_f64(mpr_tensor_data(xc), mpr_tensor_data(tc), N, C, ignore_index,
                                     &count);
        *(double *)mpr_tensor_data(out) = loss;
    }
    mpr_tensor_release(xc);
    mpri_node_t *n = mpri_record(&nll_def, 1, &logp, out);
    if (n) {
        n->iparam[0] = ignore_index;
        n->iparam[1] = count;
        mpri_node_save(n, tc);
    }
    mpr_tensor_release(tc);
    return mpri_result(out);
}

mpr_tensor_t *mpr_nll_loss(mpr_tensor_t *logp, mpr_tensor_t *target) {
    return mpr_nll_loss_ex(logp, target, MPR_IGNORE_INDEX_DEFAULT);
}

/* -------------------------------------------------------- cross_entropy */

static mpr_err_t ce_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    mpr_tensor_t *x = mpri_node_saved(n, 0), *t = mpri_node_saved(n, 1),
                 *lse = mpri_node_saved(n, 2);
    if (!x || !t || !lse) return mpr_last_error_code();
    if (!mpri_node_needs_grad(n, 0)) return MPR_OK;
    double g;
    if (mpr_item(gout[0], &g) != MPR_OK) return mpr_last_error_code();
    int64_t N = x->ndim == 2 ? x->shape[0] : 1, C = x->shape[x->ndim - 1];
    mpr_tensor_t *gx = mpr_tensor_empty(x->dtype, x->ndim, x->shape);
    if (!gx) return mpr_last_error_code();
    if (x->dtype == MPR_F32)
        mpri_cross_entropy_bwd_f32(mpr_tensor_data(x), mpr_tensor_data(t), mpr_tensor_data(lse), N,
                                   C, n->iparam[0], n->iparam[1], g, mpr_tensor_data(gx));
    else
        mpri_cross_entropy_bwd_f64(mpr_tensor_data(x), mpr_tensor_data(t), mpr_tensor_data(lse), N,
                                   C, n->iparam[0], n->iparam[1], g, mpr_tensor_data(gx));
    gin[0] = mpri_result(gx);
    return MPR_OK;
}

static const mpri_op_def_t ce_def = {"cross_entropy", ce_backward, NULL};

mpr_tensor_t *mpr_cross_entropy_ex(mpr_tensor_t *logits, mpr_tensor_t *target,
                                   int64_t ignore_index) {
    if (!logits || !target) return NULL;
    int64_t N, C;
    if (check_class_args("cross_entropy", logits, target, ignore_index, &N, &C) != MPR_OK)
        return NULL;
    mpr_tensor_t *xc = mpr_tensor_contiguous(logits), *tc = mpr_tensor_contiguous(target);
    mpr_tensor_t *out = mpr_tensor_empty(logits->dtype, 0, NULL);
    mpr_tensor_t *lse = mpr_tensor_empty(logits->dtype, 1, (int64_t[]){N});
    if (!xc || !tc || !out || !lse ||
        mpri_nn_check_range("cross_entropy", "target", mpr_tensor_data(tc), N, C, ignore_index) !=
            MPR_OK) {
        mpr_tensor_release(xc);
        mpr_tensor_release(tc);
        mpr_tensor_release(out);
        mpr_tensor_release(lse);
        return NULL;
    }
    int64_t count;
    if (logits->dtype == MPR_F32)
        *(float *)mpr_tensor_data(out) = (float)mpri_cross_entropy_fwd_f32(
            mpr_tensor_data(xc), mpr_tensor_data(tc), N, C, ignore_index, mpr_tensor_data(lse),
            &count);
    else
        *(double *)mpr_tensor_data(out) = mpri_cross_entropy_fwd_f64(
            mpr_tensor_data(xc), mpr_tensor_data(tc), N, C, ignore_index, mpr_tensor_data(lse),
            &count);
    mpri_node_t *n = mpri_record(&ce_def, 1, &logits, out);
    if (n) {
        n->iparam[0] = ignore_index;
        n->iparam[1] = count;
        /* The contiguous logits: when `logits` was already contiguous this is
         * the same storage, so in-place changes are detected by version. */
        mpri_node_save(n, xc);
        mpri_node_save(n, tc);
        mpri_node_save(n, lse);
    }
    mpr_tensor_release(xc);
    mpr_tensor_release(tc);
    mpr_tensor_release(lse);
    return mpri_result(out);
}

mpr_tensor_t *mpr_cross_entropy(mpr_tensor_t *logits, mpr_tensor_t *target) {
    return mpr_cross_entropy_ex(logits, target, MPR_IGNORE_INDEX_DEFAULT);
}

/* ------------------------------------------------------------- mse_loss */

static mpr_err_t mse_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    mpr_tensor_t *a = mpri_node_saved(n, 0), *b = mpri_node_saved(n, 1);
    if (!a || !b) return mpr_last_error_code();
    bool need_a = mpri_node_needs_grad(n, 0), need_b = mpri_node_needs_grad(n, 1);
    double g;
    if (mpr_item(gout[0], &g) != MPR_OK) return mpr_last_error_code();
    mpr_tensor_t *ga = need_a ? mpr_tensor_empty(a->dtype, a->ndim, a->shape) : NULL;
    mpr_tensor_t *gb = need_b ? mpr_tensor_empty(b->dtype, b->ndim, b->shape) : NULL;
    if ((need_a && !ga) || (need_b && !gb)) {
        mpr_tensor_release(ga);
        mpr_tensor_release(gb);
        return mpr_last_error_code();
    }
    int64_t numel = mpr_tensor_numel(a);
    if (a->dtype == MPR_F32)
        mpri_mse_loss_bwd_f32(mpr_tensor_data(a), mpr_tensor_data(b), numel, g,
                              ga ? mpr_tensor_data(ga) : NULL, gb ? mpr_tensor_data(gb) : NULL);
    else
        mpri_mse_loss_bwd_f64(mpr_tensor_data(a), mpr_tensor_data(b), numel, g,
                              ga ? mpr_tensor_data(ga) : NULL, gb ? mpr_tensor_data(gb) : NULL);
    gin[0] = mpri_result(ga);
    gin[1] = mpri_result(gb);
    return MPR_OK;
}

static const mpri_op_def_t mse_def = {"mse_loss", mse_backward, NULL};

mpr_tensor_t *mpr_mse_loss(mpr_tensor_t *input, mpr_tensor_t *target) {
    if (!input || !target) return NULL;
    const char *op = "mse_loss";
    if (mpri_nn_check_float_cpu(op, input) != MPR_OK || mpri_nn_check_cpu(op, target) != MPR_OK ||
        mpri_check_same_dtype(op, input, target) != MPR_OK)
        return NULL;
    bool same = input->ndim == target->ndim;
    for (int i = 0; same && i < input->ndim; i++) same = input->shape[i] == target->shape[i];
    if (!same) {
        mpri_err_shape2(op, "input and target must have the same shape, got", input, target);
        return NULL;
    }
    mpr_tensor_t *ac = mpr_tensor_contiguous(input), *bc = mpr_tensor_contiguous(target);
    mpr_tensor_t *out = mpr_tensor_empty(input->dtype, 0, NULL);
    if (!ac || !bc || !out) {
        mpr_tensor_release(ac);
        mpr_tensor_release(bc);
        mpr_tensor_release(out);
        return NULL;
    }
    int64_t numel = mpr_tensor_numel(input);
    if (input->dtype == MPR_F32)
        *(float *)mpr_tensor_data(out) =
            (float)mpri_mse_loss_fwd_f32(mpr_tensor_data(ac), mpr_tensor_data(bc), numel);
    else
        *(double *)mpr_tensor_data(out) =
            mpri_mse_loss_fwd_f64(mpr_tensor_data(ac), mpr_tensor_data(bc), numel);
    mpri_node_t *n = mpri_record(&mse_def, 2, (mpr_tensor_t *[]){input, target}, out);
    if (n) {
        mpri_node_save(n, ac);
        mpri_node_save(n, bc);
    }
    mpr_tensor_release(ac);
    mpr_tensor_release(bc);
    return mpri_result(out);
}
