/* ops_nn_join.c — joining and splitting along one dim: cat (with its own
 * backward: the gradient is cut back into the inputs' slices), stack
 * (unsqueeze + cat), split and chunk (narrow views, whose backward is the
 * views' own), and unbind (all slices along a dim as views, recorded as ONE
 * node with one output per slice, so backward assembles the input gradient
 * in one pass instead of one full-size zero-padded gradient per slice — what
 * an RNN stepping through a projected sequence needs).
 *
 * Copies go through the strided copy of the tensors' device backend
 * (kernels/mpri_kernels.h), so cat, stack and unbind work on any device.
 *
 * Invariants: cat checks every input against the first (one device, dtype,
 * ndim, sizes outside dim) and names the offending input and both shapes; the
 * result is a new contiguous tensor on that device; split/chunk/unbind
 * results share the input's storage.
 * Composite functions run inside a private scope and only their results
 * escape it, so they follow the ownership rule of every op. */
#include <stdlib.h>

#include "mpri_args.h"
#include "mpri_nn_ops.h"

/* dst[r, 0:width] = src[r, 0:width] for r < rows, the rows dst_pitch and
 * src_pitch elements apart, through the backend of `device` (its strided
 * copy: a memcpy per row, or one, on the CPU; exact bytes for any dtype). */
static mpr_err_t copy_rows(const char *op, int device, mpr_dtype_t dt, void *dst, int64_t dst_pitch, const void *src,
                           int64_t src_pitch, int64_t rows, int64_t width) {
    const mpri_backend_t *B = mpri_backend_for(op, device);
    if (!B) return mpr_last_error_code();
    int64_t shape[2] = {rows, width}, sd[2] = {dst_pitch, 1}, ss[2] = {src_pitch, 1};
    return B->copy ? B->copy(device, 2, shape, dt, dst, sd, dt, src, ss) : mpri_backend_missing(op, B, "copy");
}

/* ------------------------------------------------------------------- cat
 * State: mpri_ctx_dim_t. The inputs' sizes along dim are in node->in_meta. */

static mpr_err_t cat_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    int d = MPRI_NODE_STATE(n, mpri_ctx_dim_t)->dim;
    mpr_tensor_t *gy = mpri_contiguous_raw(gout[0]);
    if (!gy) return mpr_last_error_code();
    int64_t outer, inner;
    mpri_nn_split_dims(gy->ndim, gy->shape, d, &outer, &inner);
    int64_t pitch = gy->shape[d] * inner, off = 0;
    size_t esz = mpr_dtype_size(gy->dtype);
    mpr_err_t err = MPR_OK;
    for (int i = 0; i < n->n_next; i++) {
        const mpri_tensor_meta_t *m = &n->in_meta[i];
        int64_t w = m->shape[d] * inner;
        if (mpri_node_needs_grad(n, i)) {
            mpr_tensor_t *g = mpri_empty_on(m->device, m->dtype, m->ndim, m->shape);
            if (!g || (err = copy_rows(n->def->name, m->device, m->dtype, mpr_tensor_data(g), w,
                                       (char *)mpr_tensor_data(gy) + (size_t)off * esz, pitch, outer, w)) != MPR_OK) {
                mpr_tensor_release(g);
                err = err ? err : mpr_last_error_code();
                break;
            }
            gin[i] = mpri_result(g);
        }
        off += w;
    }
    mpr_tensor_release(gy);
    return err;
}

static const mpri_op_def_t cat_def = {.name = "cat", .backward = cat_backward, MPRI_OP_STATE(mpri_ctx_dim_t)};

mpr_tensor_t *mpr_cat(mpr_tensor_t *const *xs, int n, int dim) {
    if (n > 0) MPRI_ARG_NONNULL_OR(xs, NULL);
    if (!xs || n < 1) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "cat: expected a non-empty list of tensors (n = %d)", n);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!xs[i]) return NULL;
    const char *op = "cat";
    mpr_tensor_t *x0 = xs[0];
    int d;
    if (x0->ndim == 0) {
        mpr_error_set(MPR_ERR_SHAPE, "cat: zero-dimensional tensor (input 0) cannot be concatenated");
        return NULL;
    }
    if (mpri_norm_dim(op, dim, x0->ndim, &d) != MPR_OK) return NULL;
    int64_t total = 0;
    if (!mpri_backend_of(op, n, xs)) return NULL; /* one device for all */
    for (int i = 0; i < n; i++) {
        mpr_tensor_t *x = xs[i];
        if (x->dtype != x0->dtype) {
            mpr_error_set(MPR_ERR_DTYPE, "cat: input %d has dtype %s, input 0 has %s", i,
                          mpr_dtype_name(x->dtype), mpr_dtype_name(x0->dtype));
            return NULL;
        }
        bool ok = x->ndim == x0->ndim;
        for (int j = 0; ok && j < x->ndim; j++) ok = j == d || x->shape[j] == x0->shape[j];
        if (!ok) {
            char b0[96], bi[96];
            mpr_error_set(MPR_ERR_SHAPE,
                          "cat: input %d has shape %s, incompatible with input 0 %s along dim %d",
                          i, mpri_nn_shape(x, bi, sizeof bi), mpri_nn_shape(x0, b0, sizeof b0), d);
            return NULL;
        }
        total += x->shape[d];
    }
    int64_t oshape[MPR_MAX_DIMS];
    for (int j = 0; j < x0->ndim; j++) oshape[j] = x0->shape[j];
    oshape[d] = total;
    int dev = x0->storage->device;
    mpr_tensor_t *y = mpri_empty_on(dev, x0->dtype, x0->ndim, oshape);
    if (!y) return NULL;
    int64_t outer, inner;
    mpri_nn_split_dims(x0->ndim, oshape, d, &outer, &inner);
    size_t esz = mpr_dtype_size(x0->dtype);
    int64_t pitch = total * inner, off = 0;
    for (int i = 0; i < n; i++) {
        mpr_tensor_t *xc = mpri_contiguous_raw(xs[i]);
        int64_t w = xs[i]->shape[d] * inner;
        if (!xc || copy_rows(op, dev, x0->dtype, (char *)mpr_tensor_data(y) + (size_t)off * esz, pitch,
                             mpr_tensor_data(xc), w, outer, w) != MPR_OK) {
            mpr_tensor_release(xc);
            mpr_tensor_release(y);
            return NULL;
        }
        mpr_tensor_release(xc);
        off += w;
    }
    mpri_node_t *node = mpri_record(&cat_def, n, xs, y);
    if (node) MPRI_NODE_STATE(node, mpri_ctx_dim_t)->dim = d;
    return mpri_result(y);
}

/* ----------------------------------------------------------------- stack */

mpr_tensor_t *mpr_stack(mpr_tensor_t *const *xs, int n, int dim) {
    if (n > 0) MPRI_ARG_NONNULL_OR(xs, NULL);
    if (!xs || n < 1) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "stack: expected a non-empty list of tensors (n = %d)",
                      n);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!xs[i]) return NULL;
    int d;
    if (mpri_norm_dim("stack", dim, xs[0]->ndim + 1, &d) != MPR_OK) return NULL;
    for (int i = 1; i < n; i++) {
        bool ok = xs[i]->ndim == xs[0]->ndim;
        for (int j = 0; ok && j < xs[0]->ndim; j++) ok = xs[i]->shape[j] == xs[0]->shape[j];
        if (!ok) {
            char b0[96], bi[96];
            mpr_error_set(MPR_ERR_SHAPE,
                          "stack: every tensor must have the same shape, input %d is %s and "
                          "input 0 is %s",
                          i, mpri_nn_shape(xs[i], bi, sizeof bi), mpri_nn_shape(xs[0], b0, sizeof b0));
            return NULL;
        }
    }
    mpr_tensor_t *small[16];
    mpr_tensor_t **us = n <= 16 ? small : malloc(sizeof(mpr_tensor_t *) * (size_t)n);
    if (!us) {
        mpr_error_set(MPR_ERR_NOMEM, "stack: out of memory");
        return NULL;
    }
    mpr_scope_begin();
    mpr_tensor_t *y = NULL;
    int i = 0;
    for (; i < n; i++)
        if (!(us[i] = mpr_unsqueeze(xs[i], d))) break;
    if (i == n) y = mpr_scope_escape(mpr_cat(us, n, d));
    mpr_scope_end();
    if (us != small) free(us);
    return y;
}

/* ------------------------------------------------------------ split/chunk */

mpr_err_t mpr_split(mpr_tensor_t *x, int64_t split_size, int dim, mpr_tensor_t **out, int cap,
                    int *n_out) {
    if (out) *out = NULL;
    if (n_out) *n_out = 0;
    MPRI_ARG_NONNULL(x);
    MPRI_ARG_NONNULL(out);
    MPRI_ARG_NONNULL(n_out);
    if (!x || !out || !n_out)
        return x ? mpr_error_set(MPR_ERR_INVALID_ARG, "split: out and n_out must not be NULL")
                 : mpr_last_error_code();
    int d;
    if (x->ndim == 0)
        return mpr_error_set(MPR_ERR_SHAPE, "split: cannot split a zero-dimensional tensor");
    mpr_err_t e = mpri_norm_dim("split", dim, x->ndim, &d);
    if (e != MPR_OK) return e;
    int64_t size = x->shape[d];
    if (split_size <= 0 && !(split_size == 0 && size == 0))
        return mpr_error_set(MPR_ERR_INVALID_ARG, "split: split_size must be positive, got %lld",
                             (long long)split_size);
    int64_t pieces = size == 0 ? 1 : (size + split_size - 1) / split_size;
    if (pieces > cap)
        return mpr_error_set(MPR_ERR_INVALID_ARG,
                             "split: %lld pieces of size %lld along dim %d (size %lld) do not "
                             "fit in %d output slots",
                             (long long)pieces, (long long)split_size, d, (long long)size, cap);
    mpr_scope_begin();
    int k = 0;
    for (; k < pieces; k++) {
        int64_t start = k * split_size, len = size - start < split_size ? size - start : split_size;
        if (size == 0) start = len = 0;
        if (!(out[k] = mpr_narrow(x, d, start, len))) break;
    }
    if (k == pieces)
        for (int i = 0; i < k; i++) mpr_scope_escape(out[i]);
    else
        e = mpr_last_error_code();
    mpr_scope_end();
    if (e != MPR_OK) {
        for (int i = 0; i < k; i++) out[i] = NULL;
        return e;
    }
    *n_out = (int)pieces;
    return MPR_OK;
}

mpr_err_t mpr_chunk(mpr_tensor_t *x, int chunks, int dim, mpr_tensor_t **out, int *n_out) {
    if (out) *out = NULL;
    if (n_out) *n_out = 0;
    MPRI_ARG_NONNULL(x);
    MPRI_ARG_NONNULL(out);
    MPRI_ARG_NONNULL(n_out);
    if (!x) return mpr_last_error_code();
    if (chunks < 1)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "chunk: chunks must be >= 1, got %d", chunks);
    int d;
    if (x->ndim == 0)
        return mpr_error_set(MPR_ERR_SHAPE, "chunk: cannot chunk a zero-dimensional tensor");
    mpr_err_t e = mpri_norm_dim("chunk", dim, x->ndim, &d);
    if (e != MPR_OK) return e;
    int64_t size = x->shape[d];
    int64_t split_size = (size + chunks - 1) / chunks;
    return mpr_split(x, split_size, d, out, chunks, n_out);
}

/* ---------------------------------------------------------------- unbind
 * State: mpri_ctx_dim_t. Output k is slice k; its gradient goes to slice k. */

static mpr_err_t unbind_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    if (!mpri_node_needs_grad(n, 0)) return MPR_OK;
    const mpri_tensor_meta_t *m = &n->in_meta[0];
    int d = MPRI_NODE_STATE(n, mpri_ctx_dim_t)->dim;
    int64_t outer, inner;
    mpri_nn_split_dims(m->ndim, m->shape, d, &outer, &inner);
    mpr_tensor_t *g = mpri_empty_on(m->device, m->dtype, m->ndim, m->shape);
    if (!g) return mpr_last_error_code();
    size_t esz = mpr_dtype_size(m->dtype);
    int64_t len = m->shape[d];
    for (int64_t k = 0; k < len; k++) {
        mpr_tensor_t *gk = mpri_contiguous_raw(gout[k]);
        if (!gk || copy_rows(n->def->name, m->device, m->dtype, (char *)mpr_tensor_data(g) + (size_t)(k * inner) * esz,
                             len * inner, mpr_tensor_data(gk), inner, outer, inner) != MPR_OK) {
            mpr_tensor_release(gk);
            mpr_tensor_release(g);
            return mpr_last_error_code();
        }
        mpr_tensor_release(gk);
    }
    gin[0] = mpri_result(g);
    return MPR_OK;
}

static const mpri_op_def_t unbind_def = {.name = "unbind", .backward = unbind_backward, MPRI_OP_STATE(mpri_ctx_dim_t)};

mpr_err_t mpr_unbind(mpr_tensor_t *x, int dim, mpr_tensor_t **out, int cap, int *n_out) {
    if (out) *out = NULL;
    if (n_out) *n_out = 0;
    MPRI_ARG_NONNULL(x);
    MPRI_ARG_NONNULL(out);
    MPRI_ARG_NONNULL(n_out);
    if (!x) return mpr_last_error_code();
    if (!out || !n_out)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "unbind: out and n_out must not be NULL");
    if (x->ndim == 0)
        return mpr_error_set(MPR_ERR_SHAPE, "unbind: cannot unbind a zero-dimensional tensor");
    int d;
    mpr_err_t e = mpri_norm_dim("unbind", dim, x->ndim, &d);
    if (e != MPR_OK) return e;
    int64_t len = x->shape[d];
    if (len > cap)
        return mpr_error_set(MPR_ERR_INVALID_ARG,
                             "unbind: %lld slices along dim %d do not fit in %d output slots",
                             (long long)len, d, cap);
    int64_t shape[MPR_MAX_DIMS], strides[MPR_MAX_DIMS];
    for (int i = 0, j = 0; i < x->ndim; i++)
        if (i != d) {
            shape[j] = x->shape[i];
            strides[j++] = x->strides[i];
        }
    int64_t k = 0;
    for (; k < len; k++)
        if (!(out[k] = mpri_tensor_view(x->storage, x->dtype, x->ndim - 1, shape, strides,
                                         x->offset + k * x->strides[d])))
            break;
    if (k < len) {
        e = mpr_last_error_code();
        for (int64_t i = 0; i < k; i++) {
            mpr_tensor_release(out[i]);
            out[i] = NULL;
        }
        return e;
    }
    mpri_node_t *node = mpri_record_multi(&unbind_def, 1, &x, (int)len, out);
    if (node) MPRI_NODE_STATE(node, mpri_ctx_dim_t)->dim = d;
    for (int64_t i = 0; i < len; i++) out[i] = mpri_result(out[i]);
    *n_out = (int)len;
    return MPR_OK;
}
