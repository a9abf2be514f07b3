/* ops_nn_lstm_cell.c — the fused LSTM cell op: gates [B, 4H] and c_prev
 * [B, H] in, h and c [B, H] out, with backward (one node, two outputs).
 *
 * Invariants: saved tensors are the activated gates (a tensor private to
 * the node), c_prev and the new c; the engine supplies a zero gradient for
 * an output nobody used, so backward always sees both; inputs are made
 * contiguous (a select of the projected sequence is already contiguous). */
#include "mpri_args.h"
#include "mpri_nn_ops.h"

static mpr_err_t lstm_cell_backward(mpri_node_t *n, mpr_tensor_t *const *gout,
                                    mpr_tensor_t **gin) {
    mpr_tensor_t *act = mpri_node_saved(n, 0), *cp = mpri_node_saved(n, 1),
                 *c = mpri_node_saved(n, 2);
    if (!act || !cp || !c) return mpr_last_error_code();
    bool need_g = mpri_node_needs_grad(n, 0), need_c = mpri_node_needs_grad(n, 1);
    if (!need_g && !need_c) return MPR_OK;
    int64_t B = c->shape[0], H = c->shape[1];
    mpr_tensor_t *gh = mpr_tensor_contiguous(gout[0]), *gc = mpr_tensor_contiguous(gout[1]);
    mpr_tensor_t *gg = mpr_tensor_empty(c->dtype, 2, (int64_t[]){B, 4 * H});
    mpr_tensor_t *gcp = need_c ? mpr_tensor_empty(c->dtype, 2, (int64_t[]){B, H}) : NULL;
    if (!gh || !gc || !gg || (need_c && !gcp)) {
        mpr_tensor_release(gh);
        mpr_tensor_release(gc);
        mpr_tensor_release(gg);
        mpr_tensor_release(gcp);
        return mpr_last_error_code();
    }
    int dev = c->storage->device;
    const mpri_backend_t *bk = mpri_backend_for(n->def->name, dev);
    mpr_err_t e = bk ? MPRI_BK(bk, lstm_cell_bwd, dev, c->dtype, mpr_tensor_data(act), mpr_tensor_data(cp),
                               mpr_tensor_data(c), mpr_tensor_data(gh), mpr_tensor_data(gc), B, H,
                               mpr_tensor_data(gg), gcp ? mpr_tensor_data(gcp) : NULL)
                     : mpr_last_error_code();
    mpr_tensor_release(gh);
    mpr_tensor_release(gc);
    if (e != MPR_OK) {
        mpr_tensor_release(gg);
        mpr_tensor_release(gcp);
        return e;
    }
    if (need_g)
        gin[0] = mpri_result(gg);
    else
        mpr_tensor_release(gg);
    gin[1] = mpri_result(gcp);
    return MPR_OK;
}

static const mpri_op_def_t lstm_cell_def = {.name = "lstm_cell", .backward = lstm_cell_backward};

mpr_err_t mpr_lstm_cell(mpr_tensor_t *gates, mpr_tensor_t *c_prev, mpr_tensor_t **h_out,
                        mpr_tensor_t **c_out) {
    if (h_out) *h_out = NULL;
    if (c_out) *c_out = NULL;
    MPRI_ARG_NONNULL(gates);
    MPRI_ARG_NONNULL(c_prev);
    MPRI_ARG_NONNULL(h_out);
    MPRI_ARG_NONNULL(c_out);
    const char *op = "lstm_cell";
    if (!h_out || !c_out) return mpr_error_set(MPR_ERR_INVALID_ARG, "lstm_cell: h_out and c_out are required");
    if (!gates || !c_prev) {
        mpr_err_t e = mpr_last_error_code();
        return e != MPR_OK ? e : mpr_error_set(MPR_ERR_INVALID_ARG, "lstm_cell: NULL input");
    }
    mpr_err_t e;
    if ((e = mpri_nn_check_float_cpu(op, gates)) != MPR_OK ||
        (e = mpri_nn_check_cpu(op, c_prev)) != MPR_OK ||
        (e = mpri_check_same_dtype(op, gates, c_prev)) != MPR_OK)
        return e;
    if (gates->ndim != 2 || c_prev->ndim != 2 || gates->shape[0] != c_prev->shape[0] ||
        gates->shape[1] != 4 * c_prev->shape[1])
        return mpri_err_shape2(op, "expected gates [B, 4H] and c_prev [B, H], got", gates, c_prev);
    int64_t B = c_prev->shape[0], H = c_prev->shape[1];
    mpr_tensor_t *gc = mpr_tensor_contiguous(gates), *cc = mpr_tensor_contiguous(c_prev);
    mpr_tensor_t *act = mpr_tensor_empty(gates->dtype, 2, (int64_t[]){B, 4 * H});
    mpr_tensor_t *h = mpr_tensor_empty(gates->dtype, 2, (int64_t[]){B, H});
    mpr_tensor_t *c = mpr_tensor_empty(gates->dtype, 2, (int64_t[]){B, H});
    if (!gc || !cc || !act || !h || !c) {
        e = mpr_last_error_code();
        mpr_tensor_release(gc);
        mpr_tensor_release(cc);
        mpr_tensor_release(act);
        mpr_tensor_release(h);
        mpr_tensor_release(c);
        return e;
    }
    int dev = gates->storage->device;
    const mpri_backend_t *bk = mpri_backend_for("lstm_cell", dev);
    e = bk ? MPRI_BK(bk, lstm_cell_fwd, dev, gates->dtype, mpr_tensor_data(gc), mpr_tensor_data(cc), B, H,
                     mpr_tensor_data(act), mpr_tensor_data(h), mpr_tensor_data(c))
           : mpr_last_error_code();
    mpr_tensor_release(gc);
    if (e != MPR_OK) {
        mpr_tensor_release(cc);
        mpr_tensor_release(act);
        mpr_tensor_release(h);
        mpr_tensor_release(c);
        return e;
    }
    mpri_node_t *n = mpri_record_multi(&lstm_cell_def, 2, (mpr_tensor_t *[]){gates, c_prev}, 2,
                                       (mpr_tensor_t *[]){h, c});
    if (n) {
        mpri_node_save(n, act);
        mpri_node_save(n, cc);
        mpri_node_save(n, c);
    }
    mpr_tensor_release(act);
    mpr_tensor_release(cc);
    *h_out = mpri_result(h);
    *c_out = mpri_result(c);
    return MPR_OK;
}
