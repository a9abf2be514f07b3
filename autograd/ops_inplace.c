/* ops_inplace.c — in-place updates: add_, add_scaled_ (axpy), mul_,
 * mul_scalar_, fill_, zero_, copy_.
 *
 * Invariants: every successful write bumps the storage version counter (so a
 * graph that saved this storage refuses to backward); writes into a tensor
 * that requires grad are refused while grad mode is on; the source is
 * broadcast to the destination's shape (never the other way round). */
#include <string.h>

#include "mpri_args.h"
#include "mpri_autograd.h"
#include "kernels/mpri_kernels.h"

/* Strides of `src` broadcast to dst's shape, or MPR_ERR_SHAPE naming op. */
static mpr_err_t bcast_to(const char *op, const mpr_tensor_t *dst, const mpr_tensor_t *src, int64_t *st) {
    int lead = dst->ndim - src->ndim;
    if (lead < 0) return mpri_err_shape2(op, "cannot broadcast source into destination:", src, dst);
    for (int i = 0; i < dst->ndim; i++) {
        if (i < lead) { st[i] = 0; continue; }
        int64_t s = src->shape[i - lead];
        if (s == dst->shape[i]) st[i] = src->strides[i - lead];
        else if (s == 1) st[i] = 0;
        else return mpri_err_shape2(op, "cannot broadcast source into destination:", src, dst);
    }
    return MPR_OK;
}

/* Checks the destination (and source, if any) and returns their backend. */
static const mpri_backend_t *check_dst(const char *op, mpr_tensor_t *t, mpr_tensor_t *src, bool has_src) {
    if (!t) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "%s: tensor is NULL", op);
        return NULL;
    }
    if (has_src && !src) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "%s: source tensor is NULL", op);
        return NULL;
    }
    if (mpri_check_inplace(op, t) != MPR_OK) return NULL;
    return mpri_backend_of(op, has_src ? 2 : 1, (mpr_tensor_t *[]){t, src});
}

static mpr_err_t binary_(const char *op, mpri_binop_t bop, mpr_tensor_t *t, mpr_tensor_t *other, double alpha) {
    const mpri_backend_t *B = check_dst(op, t, other, true);
    if (!B) return mpr_last_error_code();
    int dev = t->storage->device;
    mpr_err_t rc;
    if ((rc = mpri_check_float(op, t)) || (rc = mpri_check_same_dtype(op, t, other))) return rc;
    int64_t so[MPR_MAX_DIMS];
    if ((rc = bcast_to(op, t, other, so)) != MPR_OK) return rc;
    /* `other` may share t's storage (t += t): the kernel reads each element
     * before writing it only when the layouts agree, so copy otherwise. */
    mpr_tensor_t *src = other;
    bool same_layout = other->storage == t->storage && other->offset == t->offset &&
                       memcmp(so, t->strides, sizeof(int64_t) * (size_t)t->ndim) == 0;
    if (other->storage == t->storage && !same_layout) {
        src = mpri_empty_on(dev, other->dtype, other->ndim, other->shape);
        if (!src) return mpr_last_error_code();
        rc = MPRI_BK(B, copy, dev, other->ndim, other->shape, other->dtype, mpr_tensor_data(src), src->strides,
                     other->dtype, mpr_tensor_data(other), other->strides);
        bcast_to(op, t, src, so);
    } else {
        mpr_tensor_retain(src);
    }
    if (rc == MPR_OK)
        rc = MPRI_BK(B, binary, dev, bop, t->dtype, t->ndim, t->shape, mpr_tensor_data(t), t->strides,
                     mpr_tensor_data(t), t->strides, mpr_tensor_data(src), so, alpha);
    mpr_tensor_release(src);
    if (rc == MPR_OK) mpri_bump_version(t);
    return rc;
}

mpr_err_t mpr_add_(mpr_tensor_t *t, mpr_tensor_t *other) {
    MPRI_ARG_NONNULL(t);
    MPRI_ARG_NONNULL(other);
    return binary_("add_", MPRI_BIN_ADD, t, other, 1.0);
}
mpr_err_t mpr_add_scaled_(mpr_tensor_t *t, mpr_tensor_t *other, double alpha) {
    MPRI_ARG_NONNULL(t);
    MPRI_ARG_NONNULL(other);
    return binary_("add_scaled_", MPRI_BIN_ADD, t, other, alpha);
}
mpr_err_t mpr_mul_(mpr_tensor_t *t, mpr_tensor_t *other) {
    MPRI_ARG_NONNULL(t);
    MPRI_ARG_NONNULL(other);
    return binary_("mul_", MPRI_BIN_MUL, t, other, 1.0);
}

mpr_err_t mpr_mul_scalar_(mpr_tensor_t *t, double s) {
    MPRI_ARG_NONNULL(t);
    const mpri_backend_t *B = check_dst("mul_scalar_", t, NULL, false);
    if (!B) return mpr_last_error_code();
    int dev = t->storage->device;
    mpr_err_t rc = mpri_check_float("mul_scalar_", t);
    if (rc) return rc;
    if (mpr_tensor_is_contiguous(t)) {
        rc = MPRI_BK(B, unary, dev, MPRI_UN_MUL_S, t->dtype, mpr_tensor_numel(t), mpr_tensor_data(t),
                     mpr_tensor_data(t), s, 0);
    } else {
        /* strided: multiply by a one-element tensor broadcast with stride 0 */
        mpr_tensor_t *sc = mpri_empty_on(dev, t->dtype, 0, NULL);
        if (!sc) return mpr_last_error_code();
        int64_t zero[MPR_MAX_DIMS] = {0}, one = 1;
        rc = MPRI_BK(B, fill, dev, t->dtype, 0, &one, mpr_tensor_data(sc), &one, s);
        if (rc == MPR_OK)
            rc = MPRI_BK(B, binary, dev, MPRI_BIN_MUL, t->dtype, t->ndim, t->shape, mpr_tensor_data(t), t->strides,
                         mpr_tensor_data(t), t->strides, mpr_tensor_data(sc), zero, 1.0);
        mpr_tensor_release(sc);
    }
    if (rc == MPR_OK) mpri_bump_version(t);
    return rc;
}

mpr_err_t mpr_fill_(mpr_tensor_t *t, double value) {
    MPRI_ARG_NONNULL(t);
    const mpri_backend_t *B = check_dst("fill_", t, NULL, false);
    if (!B) return mpr_last_error_code();
    mpr_err_t rc = MPRI_BK(B, fill, t->storage->device, t->dtype, t->ndim, t->shape, mpr_tensor_data(t), t->strides,
                           value);
    if (rc == MPR_OK) mpri_bump_version(t);
    return rc;
}

mpr_err_t mpr_zero_(mpr_tensor_t *t) {
    MPRI_ARG_NONNULL(t);
    const mpri_backend_t *B = check_dst("zero_", t, NULL, false);
    if (!B) return mpr_last_error_code();
    mpr_err_t rc = MPR_OK;
    if (t->storage->device < 0 && mpr_tensor_is_contiguous(t))
        memset(mpr_tensor_data(t), 0, mpr_tensor_nbytes(t));
    else
        rc = MPRI_BK(B, fill, t->storage->device, t->dtype, t->ndim, t->shape, mpr_tensor_data(t), t->strides, 0.0);
    if (rc == MPR_OK) mpri_bump_version(t);
    return rc;
}

mpr_err_t mpr_copy_(mpr_tensor_t *t, mpr_tensor_t *src) {
    MPRI_ARG_NONNULL(t);
    MPRI_ARG_NONNULL(src);
    const mpri_backend_t *B = check_dst("copy_", t, src, true);
    if (!B) return mpr_last_error_code();
    int dev = t->storage->device;
    mpr_err_t rc;
    int64_t ss[MPR_MAX_DIMS];
    if ((rc = bcast_to("copy_", t, src, ss)) != MPR_OK) return rc;
    mpr_tensor_t *s = src;
    if (src->storage == t->storage) {
        s = mpri_empty_on(dev, src->dtype, src->ndim, src->shape);
        if (!s) return mpr_last_error_code();
        rc = MPRI_BK(B, copy, dev, src->ndim, src->shape, src->dtype, mpr_tensor_data(s), s->strides, src->dtype,
                     mpr_tensor_data(src), src->strides);
        bcast_to("copy_", t, s, ss);
    } else {
        mpr_tensor_retain(s);
    }
    if (rc == MPR_OK)
        rc = MPRI_BK(B, copy, dev, t->ndim, t->shape, t->dtype, mpr_tensor_data(t), t->strides, s->dtype,
                     mpr_tensor_data(s), ss);
    mpr_tensor_release(s);
    if (rc == MPR_OK) mpri_bump_version(t);
    return rc;
}
