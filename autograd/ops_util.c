/* ops_util.c — helpers shared by the op files: shape formatting and error
 * messages, broadcasting rules, dim normalization, dtype checks, and sum_to
 * (undo a broadcast in backward).
 *
 * Invariants: every error names the op and the shapes involved; sum_to only
 * reduces dims that a broadcast could have introduced (leading dims, or dims
 * of size 1 in the target), anything else is MPR_ERR_SHAPE. */
#include <stdio.h>
#include <string.h>

#include "mpri_autograd.h"
#include "kernels/mpri_kernels.h"

char *mpr_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap) {
    if (!buf || cap == 0) return buf;
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
    mpr_tensor_t *out = mpr_zeros(g->dtype, ndim, shape); /* result registered by zeros */
    if (!out) return NULL;
    mpri_k_sum_into(g->dtype, g->ndim, g->shape, mpr_tensor_data(out), so, mpr_tensor_data(g), g->strides);
    /* mpr_zeros already handed `out` to the scope (or to us when none is open). */
    return out;
bad:
    mpr_error_set(MPR_ERR_SHAPE, "sum_to: cannot reduce %s to %s",
                  mpr_shape_str(g->ndim, g->shape, s1, sizeof s1), mpr_shape_str(ndim, shape, s2, sizeof s2));
    return NULL;
}

mpr_tensor_t *mpri_sum_to(mpr_tensor_t *g, const mpr_tensor_t *like) {
    if (!g || !like) return NULL;
    return mpri_sum_to_shape(g, like->ndim, like->shape);
}
