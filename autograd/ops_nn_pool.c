/* ops_nn_pool.c — 2-D max pooling (max_pool2d) with backward.
 *
 * Invariants: the argmax of every window (flat index inside its H*W plane)
 * is computed in forward and saved as an int64 tensor; backward scatters the
 * output gradient to those positions (accumulating, so overlapping windows
 * that share a maximum add up). A 3-D input [C, H, W] is treated as one image. */
#include "mpri_args.h"
#include "mpri_nn_ops.h"

static mpr_err_t pool_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    mpr_tensor_t *arg = mpri_node_saved(n, 0);
    if (!arg) return mpr_last_error_code();
    if (!mpri_node_needs_grad(n, 0)) return MPR_OK;
    const mpri_tensor_meta_t *m = &n->in_meta[0];
    int64_t H = m->shape[m->ndim - 2], W = m->shape[m->ndim - 1];
    int64_t oh = arg->shape[arg->ndim - 2], ow = arg->shape[arg->ndim - 1];
    int64_t NC = mpr_tensor_numel(arg) / (oh * ow > 0 ? oh * ow : 1);
    mpr_tensor_t *gx = mpr_zeros(m->dtype, m->ndim, m->shape);
    mpr_tensor_t *gy = mpr_tensor_contiguous(gout[0]);
    if (!gx || !gy) {
        mpr_tensor_release(gy);
        return mpr_last_error_code();
    }
    const mpri_backend_t *B = mpri_backend_for(n->def->name, m->device);
    mpr_err_t e = B ? MPRI_BK(B, max_pool2d_bwd, m->device, m->dtype, mpr_tensor_data(gy), mpr_tensor_data(arg),
                              NC, H, W, oh, ow, mpr_tensor_data(gx))
                    : mpr_last_error_code();
    mpr_tensor_release(gy);
    gin[0] = gx;
    return e;
}

static const mpri_op_def_t pool_def = {.name = "max_pool2d", .backward = pool_backward};

mpr_tensor_t *mpr_max_pool2d(mpr_tensor_t *x, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                             int64_t ph, int64_t pw) {
    MPRI_OP_INPUT(x);
    if (!x) return NULL;
    const char *op = "max_pool2d";
    if (mpri_nn_check_float_cpu(op, x) != MPR_OK) return NULL;
    char bx[96];
    if (x->ndim != 4 && x->ndim != 3) {
        mpr_error_set(MPR_ERR_SHAPE, "max_pool2d: expected input [N, C, H, W] or [C, H, W], got %s",
                      mpri_nn_shape(x, bx, sizeof bx));
        return NULL;
    }
    if (sh == 0) sh = kh;
    if (sw == 0) sw = kw;
    if (kh < 1 || kw < 1 || sh < 1 || sw < 1 || ph < 0 || pw < 0 || 2 * ph > kh || 2 * pw > kw) {
        mpr_error_set(MPR_ERR_INVALID_ARG,
                      "max_pool2d: need kernel >= 1, stride >= 1 and 0 <= padding <= kernel/2, "
                      "got kernel (%lld, %lld) stride (%lld, %lld) padding (%lld, %lld)",
                      (long long)kh, (long long)kw, (long long)sh, (long long)sw, (long long)ph,
                      (long long)pw);
        return NULL;
    }
    int nd = x->ndim;
    int64_t H = x->shape[nd - 2], W = x->shape[nd - 1];
    if (H + 2 * ph < kh || W + 2 * pw < kw) {
        mpr_error_set(MPR_ERR_SHAPE, "max_pool2d: kernel %lldx%lld is larger than the input %s",
                      (long long)kh, (long long)kw, mpri_nn_shape(x, bx, sizeof bx));
        return NULL;
    }
    int64_t oh = (H + 2 * ph - kh) / sh + 1, ow = (W + 2 * pw - kw) / sw + 1;
    int64_t oshape[4];
    for (int i = 0; i < nd - 2; i++) oshape[i] = x->shape[i];
    oshape[nd - 2] = oh;
    oshape[nd - 1] = ow;
    int64_t NC = 1;
    for (int i = 0; i < nd - 2; i++) NC *= x->shape[i];
    mpr_tensor_t *xc = mpr_tensor_contiguous(x);
    mpr_tensor_t *y = mpr_tensor_empty(x->dtype, nd, oshape);
    mpr_tensor_t *arg = mpr_tensor_empty(MPR_I64, nd, oshape);
    if (!xc || !y || !arg) {
        mpr_tensor_release(xc);
        mpr_tensor_release(y);
        mpr_tensor_release(arg);
        return NULL;
    }
    int dev = x->storage->device;
    const mpri_backend_t *B = mpri_backend_for("max_pool2d", dev);
    mpr_err_t e = B ? MPRI_BK(B, max_pool2d_fwd, dev, x->dtype, mpr_tensor_data(xc), NC, H, W, kh, kw, sh, sw, ph,
                              pw, oh, ow, mpr_tensor_data(y), mpr_tensor_data(arg))
                    : mpr_last_error_code();
    mpr_tensor_release(xc);
    if (e != MPR_OK) {
        mpr_tensor_release(y);
        mpr_tensor_release(arg);
        return NULL;
    }
    mpri_node_t *n = mpri_record(&pool_def, 1, &x, y);
    if (n) mpri_node_save(n, arg);
    mpr_tensor_release(arg);
    return mpri_result(y);
}
