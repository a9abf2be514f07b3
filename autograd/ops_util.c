/* ops_util.c — helpers shared by the op files: shape formatting and error
 * messages, broadcasting rules, dim normalization, dtype checks, and sum_to
 * (undo a broadcast in backward).
 *
 * Invariants: every error names the op and the shapes involved; sum_to only
 * reduces dims that a broadcast could have introduced (leading dims, or dims
 * of size 1 in the target), anything else is MPR_ERR_SHAPE. */
#include <stdio.h>
#include <string.h>

#include "mpri_args.h"
#include "mpri_autograd.h"
#include "kernels/mpri_kernels.h"

char *mpr_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap) {
    MPRI_ARG_NONNULL_OR(buf, NULL);
    if (cap == 0) return buf;
    if (ndim > 0 && !shape) {
        buf[0] = '\0';
        mpri_null_arg(__func__, "shape");
        return buf;
    }
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

mpr_err_t mpri_err_shape2(const char *op, const char *what, const mpr_tensor_t *a,
                          const mpr_tensor_t *b) {
    char sa[96], sb[96];
    return mpr_error_set(MPR_ERR_SHAPE, "%s: %s %s and %s", op, what,
                         mpr_shape_str(a->ndim, a->shape, sa, sizeof sa),
                         mpr_shape_str(b->ndim, b->shape, sb, sizeof sb));
}

mpr_err_t mpri_check_same_dtype(const char *op, const mpr_tensor_t *a, const mpr_tensor_t *b) {
    if (a->dtype == b->dtype) return MPR_OK;
    char sa[96], sb[96];
    return mpr_error_set(MPR_ERR_DTYPE, "%s: dtypes differ: %s %s and %s %s", op,
                         mpr_dtype_name(a->dtype), mpr_shape_str(a->ndim, a->shape, sa, sizeof sa),
                         mpr_dtype_name(b->dtype), mpr_shape_str(b->ndim, b->shape, sb, sizeof sb));
}

mpr_err_t mpri_broadcast_shape(const char *op, int na, const int64_t *sa, int nb, const int64_t *sb,
                               int *nout, int64_t *out) {
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int ia = na - n + i, ib = nb - n + i;
        int64_t da = ia >= 0 ? sa[ia] : 1, db = ib >= 0 ? sb[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            char s1[96], s2[96];
            return mpr_error_set(MPR_ERR_SHAPE, "%s: shapes %s and %s cannot be broadcast (dim %d: %lld vs %lld)",
                                 op, mpr_shape_str(na, sa, s1, sizeof s1),
                                 mpr_shape_str(nb, sb, s2, sizeof s2), i, (long long)da, (long long)db);
        }
        out[i] = da == 1 ? db : da;
    }
    *nout = n;
    return MPR_OK;
}

mpr_err_t mpri_norm_dim(const char *op, int dim, int ndim, int *out) {
    int n = ndim > 0 ? ndim : 1;
    if (dim < -n || dim >= n)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: dim %d out of range for a %d-d tensor", op,
                             dim, ndim);
    *out = dim < 0 ? dim + n : dim;
    return MPR_OK;
}

mpr_tensor_t *mpri_sum_to_shape(mpr_tensor_t *g, int ndim, const int64_t *shape) {
    if (!g) return NULL;
    bool same = g->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = g->shape[i] == shape[i];
    if (same) return mpri_result(mpr_tensor_retain(g));
    char s1[96], s2[96];
    if (ndim > g->ndim) goto bad;
    /* out strides over g's dims: 0 where the dim is reduced. */
    int lead = g->ndim - ndim;
    int64_t so[MPR_MAX_DIMS], cs[MPR_MAX_DIMS];
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        cs[i] = s;
        s *= shape[i];
    }
    for (int i = 0; i < g->ndim; i++) {
        if (i < lead) { so[i] = 0; continue; }
        int64_t t = shape[i - lead];
        if (t == g->shape[i]) so[i] = cs[i - lead];
        else if (t == 1) so[i] = 0;
        else goto bad;
    }
    if (mpri_check_float("sum_to", g) != MPR_OK) return NULL;
    const mpri_backend_t *B = mpri_backend_of("sum_to", 1, &g);
    if (!B) return NULL;
    int dev = g->storage->device;
    mpr_tensor_t *out = mpri_empty_on(dev, g->dtype, ndim, shape);
    if (!out) return NULL;
    mpr_err_t rc = MPRI_BK(B, fill, dev, g->dtype, ndim, out->shape, mpr_tensor_data(out), out->strides, 0.0);
    if (rc == MPR_OK)
        rc = MPRI_BK(B, sum_into, dev, g->dtype, g->ndim, g->shape, mpr_tensor_data(out), so, mpr_tensor_data(g),
                     g->strides);
    if (rc != MPR_OK) {
        mpr_tensor_release(out);
        return NULL;
    }
    return mpri_result(out);
bad:
    mpr_error_set(MPR_ERR_SHAPE, "sum_to: cannot reduce %s to %s",
                  mpr_shape_str(g->ndim, g->shape, s1, sizeof s1), mpr_shape_str(ndim, shape, s2, sizeof s2));
    return NULL;
}

mpr_tensor_t *mpri_sum_to(mpr_tensor_t *g, const mpr_tensor_t *like) {
    if (!g || !like) return NULL;
    return mpri_sum_to_shape(g, like->ndim, like->shape);
}

/* ---------------------------------------------------------------- devices */

static const char *dev_str(int device, char *buf, size_t cap) {
    if (device < 0) snprintf(buf, cap, "cpu");
    else snprintf(buf, cap, "cuda:%d", device);
    return buf;
}

const mpri_backend_t *mpri_backend_of(const char *op, int n, mpr_tensor_t *const *ts) {
    int dev = -2;
    for (int i = 0; i < n; i++) {
        if (!ts[i]) continue;
        int d = ts[i]->storage->device;
        if (dev == -2) {
            dev = d;
        } else if (d != dev) {
            char b1[24], b2[24];
            mpr_error_set(MPR_ERR_INVALID_ARG, "%s: tensors on different devices (%s and %s)", op,
                          dev_str(dev, b1, sizeof b1), dev_str(d, b2, sizeof b2));
            return NULL;
        }
    }
    return mpri_backend_for(op, dev == -2 ? -1 : dev);
}

mpr_tensor_t *mpri_empty_on(int device, mpr_dtype_t dtype, int ndim, const int64_t *shape) {
    if (device < 0) return mpr_tensor_empty(dtype, ndim, shape);
    int64_t numel;
    if (mpri_tensor_check_shape("empty", dtype, ndim, shape, &numel) != MPR_OK) return NULL;
    mpri_storage_t *s = mpri_backend_storage("empty", device, (size_t)numel * mpr_dtype_size(dtype));
    if (!s) return NULL;
    mpr_tensor_t *t = mpri_tensor_view(s, dtype, ndim, shape, NULL, 0);
    mpri_storage_release(s);
    return t;
}

mpr_tensor_t *mpri_full_on(int device, mpr_dtype_t dtype, int ndim, const int64_t *shape, double value) {
    const mpri_backend_t *B = mpri_backend_for("full", device);
    if (!B) return NULL;
    mpr_tensor_t *t = mpri_empty_on(device, dtype, ndim, shape);
    if (!t) return NULL;
    if (device < 0 && value == 0.0) {
        memset(mpr_tensor_data(t), 0, mpr_tensor_nbytes(t));
    } else if (MPRI_BK(B, fill, device, dtype, ndim, t->shape, mpr_tensor_data(t), t->strides, value) != MPR_OK) {
        mpr_tensor_release(t);
        return NULL;
    }
    return mpri_result(t);
}

mpr_tensor_t *mpri_contiguous_raw(mpr_tensor_t *t) {
    if (mpr_tensor_is_contiguous(t)) return mpr_tensor_retain(t);
    const mpri_backend_t *B = mpri_backend_of("contiguous", 1, &t);
    if (!B) return NULL;
    mpr_tensor_t *out = mpri_empty_on(t->storage->device, t->dtype, t->ndim, t->shape);
    if (!out) return NULL;
    if (MPRI_BK(B, copy, t->storage->device, t->ndim, t->shape, t->dtype, mpr_tensor_data(out), out->strides,
                t->dtype, mpr_tensor_data(t), t->strides) != MPR_OK) {
        mpr_tensor_release(out);
        return NULL;
    }
    return out;
}

mpr_err_t mpri_check_cpu(const char *op, const mpr_tensor_t *t) {
    if (t->storage->device < 0) return MPR_OK;
    return mpr_error_set(MPR_ERR_UNSUPPORTED, "%s: runs on CPU tensors only; this one is on cuda:%d", op,
                         t->storage->device);
}
