/* ops_view.c — view ops with backward: reshape/view/flatten, transpose,
 * permute, narrow/slice/select, unsqueeze/squeeze, expand, contiguous.
 *
 * Invariants: a view shares its input's storage (and so its version
 * counter); views are made by mpri_tensor_view, which checks the view stays
 * inside the storage. Backward maps the gradient back to the input's shape:
 * reshape it, permute it back, scatter it into zeros (slices), or sum it
 * (expand). reshape copies only when the strides admit no view (the stride
 * rule of PyTorch's computeStride). */
#include <string.h>

#include "mpri_args.h"
#include "mpri_autograd.h"
#include "kernels/mpri_kernels.h"

static mpr_tensor_t *make_view(const mpr_tensor_t *t, int ndim, const int64_t *shape,
                               const int64_t *strides, int64_t offset) {
    return mpri_tensor_view(t->storage, t->dtype, ndim, shape, strides, offset);
}

/* ---- reshape family: backward reshapes the gradient to the input shape ---- */

static mpr_err_t reshape_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    gin[0] = mpr_reshape(gout[0], n->in_meta[0].ndim, n->in_meta[0].shape);
    return gin[0] ? MPR_OK : mpr_last_error_code();
}
static const mpri_op_def_t reshape_def = {.name = "reshape", .backward = reshape_backward};
static const mpri_op_def_t view_def = {.name = "view", .backward = reshape_backward};
static const mpri_op_def_t squeeze_def = {.name = "squeeze", .backward = reshape_backward};
static const mpri_op_def_t unsqueeze_def = {.name = "unsqueeze", .backward = reshape_backward};

/* Strides for viewing `t` as `shape`, or false (PyTorch's computeStride). */
static bool view_strides(const mpr_tensor_t *t, int ndim, const int64_t *shape, int64_t *out) {
    int64_t numel = mpr_tensor_numel(t);
    if (numel == 0 || mpr_tensor_is_contiguous(t)) {
        int64_t s = 1;
        for (int i = ndim - 1; i >= 0; i--) {
            out[i] = s;
            s *= shape[i] ? shape[i] : 1;
        }
        return true;
    }
    int view_d = ndim - 1;
    int64_t chunk_base_stride = t->ndim ? t->strides[t->ndim - 1] : 1;
    int64_t tensor_numel = 1, view_numel = 1;
    for (int td = t->ndim - 1; td >= 0; td--) {
        tensor_numel *= t->shape[td];
        if (td == 0 || (t->shape[td - 1] != 1 && t->strides[td - 1] != tensor_numel * chunk_base_stride)) {
            while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
                out[view_d] = view_numel * chunk_base_stride;
                view_numel *= shape[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel) return false;
            if (td > 0) {
                chunk_base_stride = t->strides[td - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return view_d == -1;
}

/* Resolve a -1 and check the element count. */
static mpr_err_t infer_shape(const char *op, const mpr_tensor_t *t, int ndim, const int64_t *shape,
                             int64_t *out) {
    if (ndim < 0 || ndim > MPR_MAX_DIMS || (ndim > 0 && !shape))
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: bad ndim %d", op, ndim);
    int infer = -1;
    for (int i = 0; i < ndim; i++) {
        out[i] = shape[i];
        if (shape[i] == -1) {
            if (infer >= 0) return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: more than one -1 in shape", op);
            infer = i;
            out[i] = 1; /* resolved below, once the other dims are known valid */
        }
    }
    /* Negative sizes and products that overflow (also through a 0 dim) are
     * refused here, before any arithmetic on the new shape. */
    int64_t prod;
    if (mpri_tensor_check_shape(op, t->dtype, ndim, out, &prod) != MPR_OK) return mpr_last_error_code();
    int64_t numel = mpr_tensor_numel(t);
    char s1[96], s2[96];
    if (infer >= 0) {
        if (prod == 0 || numel % prod != 0) goto bad;
        out[infer] = numel / prod;
    } else if (prod != numel) {
        goto bad;
    }
    return MPR_OK;
bad:
    return mpr_error_set(MPR_ERR_SHAPE, "%s: shape %s is invalid for a tensor of shape %s (%lld elements)",
                         op, mpr_shape_str(ndim, shape, s1, sizeof s1),
                         mpr_shape_str(t->ndim, t->shape, s2, sizeof s2), (long long)numel);
}

static mpr_tensor_t *reshape_impl(const mpri_op_def_t *def, mpr_tensor_t *t, int ndim,
                                  const int64_t *shape, bool allow_copy) {
    if (!t) return NULL;
    int64_t sh[MPR_MAX_DIMS] = {0}, st[MPR_MAX_DIMS]; /* = {0}: gcc -O2 cannot see infer_shape fill it */
    if (infer_shape(def->name, t, ndim, shape, sh) != MPR_OK) return NULL;
    mpr_tensor_t *out;
    if (view_strides(t, ndim, sh, st)) {
        out = make_view(t, ndim, sh, st, t->offset);
    } else if (!allow_copy) {
        char s1[96], s2[96];
        mpr_error_set(MPR_ERR_SHAPE, "view: shape %s is not compatible with the strides of a %s tensor; use reshape",
                      mpr_shape_str(ndim, sh, s1, sizeof s1), mpr_shape_str(t->ndim, t->shape, s2, sizeof s2));
        return NULL;
    } else {
        mpr_tensor_t *c = mpri_contiguous_raw(t);
        if (!c) return NULL;
        out = make_view(c, ndim, sh, NULL, 0);
        mpr_tensor_release(c);
    }
    if (!out) return NULL;
    mpri_record(def, 1, &t, out);
    return mpri_result(out);
}

mpr_tensor_t *mpr_reshape(mpr_tensor_t *t, int ndim, const int64_t *shape) {
    MPRI_OP_INPUT(t);
    if (ndim > 0) MPRI_ARG_NONNULL_OR(shape, NULL);
    return reshape_impl(&reshape_def, t, ndim, shape, true);
}
mpr_tensor_t *mpr_view(mpr_tensor_t *t, int ndim, const int64_t *shape) {
    MPRI_OP_INPUT(t);
    if (ndim > 0) MPRI_ARG_NONNULL_OR(shape, NULL);
    return reshape_impl(&view_def, t, ndim, shape, false);
}

mpr_tensor_t *mpr_flatten(mpr_tensor_t *t, int start_dim, int end_dim) {
    MPRI_OP_INPUT(t);
    if (!t) return NULL;
    int s, e;
    if (mpri_norm_dim("flatten", start_dim, t->ndim, &s) || mpri_norm_dim("flatten", end_dim, t->ndim, &e))
        return NULL;
    if (t->ndim == 0) return reshape_impl(&reshape_def, t, 1, (int64_t[]){1}, true);
    if (s > e) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "flatten: start_dim %d after end_dim %d", start_dim, end_dim);
        return NULL;
    }
    int64_t sh[MPR_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < s; i++) sh[n++] = t->shape[i];
    int64_t m = 1;
    for (int i = s; i <= e; i++) m *= t->shape[i];
    sh[n++] = m;
    for (int i = e + 1; i < t->ndim; i++) sh[n++] = t->shape[i];
    return reshape_impl(&reshape_def, t, n, sh, true);
}

mpr_tensor_t *mpr_unsqueeze(mpr_tensor_t *t, int dim) {
    MPRI_OP_INPUT(t);
    if (!t) return NULL;
    int d;
    if (mpri_norm_dim("unsqueeze", dim, t->ndim + 1, &d) != MPR_OK) return NULL;
    if (t->ndim == MPR_MAX_DIMS) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "unsqueeze: tensor already has %d dims", MPR_MAX_DIMS);
        return NULL;
    }
    int64_t sh[MPR_MAX_DIMS], st[MPR_MAX_DIMS];
    for (int i = 0, j = 0; i <= t->ndim; i++) {
        if (i == d) {
            sh[i] = 1;
            st[i] = j < t->ndim ? t->strides[j] * t->shape[j] : 1;
        } else {
            sh[i] = t->shape[j];
            st[i] = t->strides[j];
            j++;
        }
    }
    mpr_tensor_t *out = make_view(t, t->ndim + 1, sh, st, t->offset);
    if (!out) return NULL;
    mpri_record(&unsqueeze_def, 1, &t, out);
    return mpri_result(out);
}

static mpr_tensor_t *squeeze_mask(mpr_tensor_t *t, const bool *drop) {
    int64_t sh[MPR_MAX_DIMS], st[MPR_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (drop[i]) continue;
        sh[n] = t->shape[i];
        st[n] = t->strides[i];
        n++;
    }
    mpr_tensor_t *out = make_view(t, n, sh, st, t->offset);
    if (!out) return NULL;
    mpri_record(&squeeze_def, 1, &t, out);
    return mpri_result(out);
}

mpr_tensor_t *mpr_squeeze(mpr_tensor_t *t, int dim) {
    MPRI_OP_INPUT(t);
    if (!t) return NULL;
    int d;
    if (mpri_norm_dim("squeeze", dim, t->ndim, &d) != MPR_OK) return NULL;
    bool drop[MPR_MAX_DIMS] = {false};
    if (t->ndim > 0) drop[d] = t->shape[d] == 1;
    return squeeze_mask(t, drop);
}

mpr_tensor_t *mpr_squeeze_all(mpr_tensor_t *t) {
    MPRI_OP_INPUT(t);
    if (!t) return NULL;
    bool drop[MPR_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) drop[i] = t->shape[i] == 1;
    return squeeze_mask(t, drop);
}

/* ---- permute / transpose: backward applies the inverse permutation ---- */

typedef struct mpri_ctx_permute {
    int8_t perm[MPR_MAX_DIMS]; /* output dim i is input dim perm[i] */
} mpri_ctx_permute_t;

static mpr_err_t permute_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    const mpri_ctx_permute_t *st = MPRI_NODE_STATE(n, mpri_ctx_permute_t);
    int nd = n->in_meta[0].ndim, inv[MPR_MAX_DIMS];
    for (int i = 0; i < nd; i++) inv[st->perm[i]] = i;
    gin[0] = mpr_permute(gout[0], nd, inv);
    return gin[0] ? MPR_OK : mpr_last_error_code();
}
static const mpri_op_def_t permute_def = {.name = "permute", .backward = permute_backward, MPRI_OP_STATE(mpri_ctx_permute_t)};
static const mpri_op_def_t transpose_def = {.name = "transpose", .backward = permute_backward, MPRI_OP_STATE(mpri_ctx_permute_t)};

static mpr_tensor_t *permute_impl(const mpri_op_def_t *def, mpr_tensor_t *t, const int *perm) {
    int64_t sh[MPR_MAX_DIMS], st[MPR_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) {
        sh[i] = t->shape[perm[i]];
        st[i] = t->strides[perm[i]];
    }
    mpr_tensor_t *out = make_view(t, t->ndim, sh, st, t->offset);
    if (!out) return NULL;
    mpri_node_t *n = mpri_record(def, 1, &t, out);
    if (n)
        for (int i = 0; i < t->ndim; i++) MPRI_NODE_STATE(n, mpri_ctx_permute_t)->perm[i] = (int8_t)perm[i];
    return mpri_result(out);
}

mpr_tensor_t *mpr_permute(mpr_tensor_t *t, int ndim, const int *dims) {
    MPRI_OP_INPUT(t);
    if (ndim > 0) MPRI_ARG_NONNULL_OR(dims, NULL);
    if (!t) return NULL;
    char sb[96];
    if (ndim != t->ndim || (ndim > 0 && !dims)) {
        mpr_error_set(MPR_ERR_SHAPE, "permute: %d dims given for a tensor of shape %s", ndim,
                      mpr_shape_str(t->ndim, t->shape, sb, sizeof sb));
        return NULL;
    }
    int perm[MPR_MAX_DIMS];
    bool seen[MPR_MAX_DIMS] = {false};
    for (int i = 0; i < ndim; i++) {
        if (mpri_norm_dim("permute", dims[i], ndim, &perm[i]) != MPR_OK) return NULL;
        if (seen[perm[i]]) {
            mpr_error_set(MPR_ERR_INVALID_ARG, "permute: dim %d repeated", dims[i]);
            return NULL;
        }
        seen[perm[i]] = true;
    }
    return permute_impl(&permute_def, t, perm);
}

mpr_tensor_t *mpr_transpose(mpr_tensor_t *t, int dim0, int dim1) {
    MPRI_OP_INPUT(t);
    if (!t) return NULL;
    int a, b;
    if (mpri_norm_dim("transpose", dim0, t->ndim, &a) || mpri_norm_dim("transpose", dim1, t->ndim, &b))
        return NULL;
    int perm[MPR_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) perm[i] = i;
    if (t->ndim > 0) {
        perm[a] = b;
        perm[b] = a;
    }
    return permute_impl(&transpose_def, t, perm);
}

/* ---- slices: backward scatters the gradient into zeros of the input shape ---- */

typedef struct mpri_ctx_slice {
    int dim;         /* sliced dim of the input */
    bool removed;    /* select: the dim is gone from the output */
    int64_t start, step;
} mpri_ctx_slice_t;

static mpr_err_t slice_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    const mpri_tensor_meta_t *m = &n->in_meta[0];
    const mpri_backend_t *B = mpri_backend_of(n->def->name, 1, gout);
    mpr_tensor_t *z = B ? mpri_full_on(gout[0]->storage->device, m->dtype, m->ndim, m->shape, 0.0) : NULL;
    if (!z) return mpr_last_error_code();
    const mpri_ctx_slice_t *sl = MPRI_NODE_STATE(n, mpri_ctx_slice_t);
    int dim = sl->dim;
    int64_t sh[MPR_MAX_DIMS], st[MPR_MAX_DIMS];
    memcpy(sh, z->shape, sizeof sh);
    memcpy(st, z->strides, sizeof st);
    int64_t off = sl->start * z->strides[dim];
    sh[dim] = sl->removed ? 1 : gout[0]->shape[dim];
    st[dim] *= sl->step;
    /* Region of z that the forward slice read; gout fills it (select: plus a size-1 dim). */
    int64_t gst[MPR_MAX_DIMS];
    const mpr_tensor_t *g = gout[0];
    for (int i = 0, j = 0; i < m->ndim; i++) gst[i] = (sl->removed && i == dim) ? 0 : g->strides[j++];
    mpr_err_t rc = MPRI_BK(B, copy, g->storage->device, m->ndim, sh, m->dtype,
                           (char *)mpr_tensor_data(z) + off * (int64_t)mpr_dtype_size(m->dtype), st, g->dtype,
                           mpr_tensor_data(g), gst);
    if (rc != MPR_OK) return rc;
    gin[0] = z;
    return MPR_OK;
}
static const mpri_op_def_t narrow_def = {.name = "narrow", .backward = slice_backward, MPRI_OP_STATE(mpri_ctx_slice_t)};
static const mpri_op_def_t slice_def = {.name = "slice", .backward = slice_backward, MPRI_OP_STATE(mpri_ctx_slice_t)};
static const mpri_op_def_t select_def = {.name = "select", .backward = slice_backward, MPRI_OP_STATE(mpri_ctx_slice_t)};

static mpr_tensor_t *slice_impl(const mpri_op_def_t *def, mpr_tensor_t *t, int d, int64_t start,
                                int64_t len, int64_t step, bool remove) {
    int64_t sh[MPR_MAX_DIMS], st[MPR_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (i == d) {
            if (remove) continue;
            sh[n] = len;
            st[n] = t->strides[i] * step;
        } else {
            sh[n] = t->shape[i];
            st[n] = t->strides[i];
        }
        n++;
    }
    mpr_tensor_t *out = make_view(t, n, sh, st, t->offset + start * t->strides[d]);
    if (!out) return NULL;
    mpri_node_t *node = mpri_record(def, 1, &t, out);
    if (node)
        *MPRI_NODE_STATE(node, mpri_ctx_slice_t) =
            (mpri_ctx_slice_t){.dim = d, .removed = remove, .start = start, .step = step};
    return mpri_result(out);
}

mpr_tensor_t *mpr_narrow(mpr_tensor_t *t, int dim, int64_t start, int64_t length) {
    MPRI_OP_INPUT(t);
    if (!t) return NULL;
    int d;
    char sb[96];
    if (t->ndim == 0) {
        mpr_error_set(MPR_ERR_SHAPE, "narrow: cannot narrow a 0-d tensor");
        return NULL;
    }
    if (mpri_norm_dim("narrow", dim, t->ndim, &d) != MPR_OK) return NULL;
    if (start < 0) start += t->shape[d];
    if (start < 0 || length < 0 || start + length > t->shape[d]) {
        mpr_error_set(MPR_ERR_SHAPE, "narrow: [%lld, %lld) out of range of dim %d of %s", (long long)start,
                      (long long)(start + length), d, mpr_shape_str(t->ndim, t->shape, sb, sizeof sb));
        return NULL;
    }
    return slice_impl(&narrow_def, t, d, start, length, 1, false);
}

mpr_tensor_t *mpr_slice(mpr_tensor_t *t, int dim, int64_t start, int64_t end, int64_t step) {
    MPRI_OP_INPUT(t);
    if (!t) return NULL;
    int d;
    if (t->ndim == 0) {
        mpr_error_set(MPR_ERR_SHAPE, "slice: cannot slice a 0-d tensor");
        return NULL;
    }
    if (mpri_norm_dim("slice", dim, t->ndim, &d) != MPR_OK) return NULL;
    if (step < 1) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "slice: step %lld must be >= 1", (long long)step);
        return NULL;
    }
    int64_t n = t->shape[d];
    if (start < 0) start += n;
    if (end < 0) end += n;
    if (start < 0) start = 0;
    if (start > n) start = n;
    if (end > n) end = n;
    if (end < start) end = start;
    int64_t len = (end - start + step - 1) / step;
    return slice_impl(&slice_def, t, d, start, len, step, false);
}

mpr_tensor_t *mpr_select(mpr_tensor_t *t, int dim, int64_t index) {
    MPRI_OP_INPUT(t);
    if (!t) return NULL;
    int d;
    char sb[96];
    if (t->ndim == 0) {
        mpr_error_set(MPR_ERR_SHAPE, "select: cannot index a 0-d tensor");
        return NULL;
    }
    if (mpri_norm_dim("select", dim, t->ndim, &d) != MPR_OK) return NULL;
    if (index < 0) index += t->shape[d];
    if (index < 0 || index >= t->shape[d]) {
        mpr_error_set(MPR_ERR_SHAPE, "select: index %lld out of range for dim %d of %s", (long long)index, d,
                      mpr_shape_str(t->ndim, t->shape, sb, sizeof sb));
        return NULL;
    }
    return slice_impl(&select_def, t, d, index, 1, 1, true);
}

/* ---- expand: backward sums over the expanded dims ---- */

static mpr_err_t expand_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    gin[0] = mpri_sum_to_shape(gout[0], n->in_meta[0].ndim, n->in_meta[0].shape);
    return gin[0] ? MPR_OK : mpr_last_error_code();
}
static const mpri_op_def_t expand_def = {.name = "expand", .backward = expand_backward};

mpr_tensor_t *mpr_expand(mpr_tensor_t *t, int ndim, const int64_t *shape) {
    MPRI_OP_INPUT(t);
    if (ndim > 0) MPRI_ARG_NONNULL_OR(shape, NULL);
    if (!t) return NULL;
    char s1[96], s2[96];
    if (ndim < t->ndim || ndim > MPR_MAX_DIMS || (ndim > 0 && !shape)) goto bad;
    int64_t sh[MPR_MAX_DIMS], st[MPR_MAX_DIMS];
    int lead = ndim - t->ndim;
    for (int i = 0; i < ndim; i++) {
        int64_t want = shape[i];
        if (i < lead) {
            if (want < 0) goto bad;
            sh[i] = want;
            st[i] = 0;
            continue;
        }
        int64_t have = t->shape[i - lead];
        if (want == -1) want = have;
        if (want == have) {
            sh[i] = have;
            st[i] = t->strides[i - lead];
        } else if (have == 1 && want >= 0) {
            sh[i] = want;
            st[i] = 0;
        } else {
            goto bad;
        }
    }
    mpr_tensor_t *out = make_view(t, ndim, sh, st, t->offset);
    if (!out) return NULL;
    mpri_record(&expand_def, 1, &t, out);
    return mpri_result(out);
bad:
    mpr_error_set(MPR_ERR_SHAPE, "expand: cannot expand %s to %s",
                  mpr_shape_str(t->ndim, t->shape, s1, sizeof s1),
                  mpr_shape_str(ndim > 0 && shape ? ndim : 0, shape, s2, sizeof s2));
    return NULL;
}

/* ---- contiguous: identity when already contiguous, else a copy with history ---- */

static mpr_err_t contiguous_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    gin[0] = gout[0];
    return MPR_OK;
}
static const mpri_op_def_t contiguous_def = {.name = "contiguous", .backward = contiguous_backward};

mpr_tensor_t *mpr_contiguous(mpr_tensor_t *t) {
    MPRI_OP_INPUT(t);
    if (!t) return NULL;
    if (mpr_tensor_is_contiguous(t)) return mpri_result(mpr_tensor_retain(t));
    mpr_tensor_t *out = mpri_contiguous_raw(t);
    if (!out) return NULL;
    mpri_record(&contiguous_def, 1, &t, out);
    return mpri_result(out);
}
