/* ops_nn_index.c — indexing along one dim with backward: index_select,
 * embedding (index_select of rows of a [V, D] table by an index tensor of any
 * shape) and gather.
 *
 * Devices: the input may be on the CPU or a CUDA device; the index may be on
 * the CPU or on the input's device (a CPU index for a device table is copied
 * there, as the tutorial's token ids reach a GPU embedding). The range check
 * reads the index on the host (a device index is copied back for it).
 *
 * Invariants: index tensors are int64 and every value is checked to lie in
 * range before any output is written; the index tensor is saved for backward,
 * on the input's device (asserted there; its version is checked like any
 * saved tensor); backward scatter-adds so repeated indices accumulate, and
 * the gradient of the indexed input is dense (same shape as the input). gather with an index smaller than the input in
 * the other dims narrows the input first (views with their own backward). */
#include "mpri_args.h"
#include "mpri_nn_ops.h"

/* ------------------------------------- shared by index_select and gather
 * Both read x as [outer, n, inner] around the indexed dim d and write
 * [outer, k, inner]; index_select takes one index row for every outer/inner
 * position (k = numel of the index), gather one index per output element
 * (k = the index's extent at d). State: mpri_ctx_dim_t (d); saved[0] = the
 * contiguous, range-checked index. */

/* The kernel of the op (gather or index_select) and direction, through the
 * backend of `device`: forward src = x, dst = y; backward src = gy, dst = gx
 * (accumulates). */
static mpr_err_t index_kernel(bool gather, bool backward, int device, mpr_dtype_t dt, const void *src,
                              const int64_t *idx, void *dst, int64_t outer, int64_t n, int64_t k, int64_t inner) {
    const mpri_backend_t *B = mpri_backend_for(gather ? "gather" : "index_select", device);
    if (!B) return mpr_last_error_code();
    if (gather && backward) return MPRI_BK(B, gather_bwd, device, dt, src, idx, dst, outer, n, k, inner);
    if (gather) return MPRI_BK(B, gather_fwd, device, dt, src, idx, dst, outer, n, k, inner);
    if (backward) return MPRI_BK(B, index_select_bwd, device, dt, src, idx, dst, outer, n, k, inner);
    return MPRI_BK(B, index_select_fwd, device, dt, src, idx, dst, outer, n, k, inner);
}

static bool is_gather(const mpri_op_def_t *def);

static mpr_err_t index_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    mpr_tensor_t *idx = mpri_node_saved(n, 0);
    if (!idx) return mpr_last_error_code();
    if (!mpri_node_needs_grad(n, 0)) return MPR_OK;
    const mpri_tensor_meta_t *m = &n->in_meta[0];
    MPRI_ASSERT(idx->storage->device == m->device, "the saved index is on the indexed input's device");
    int dim = MPRI_NODE_STATE(n, mpri_ctx_dim_t)->dim;
    bool gather = is_gather(n->def);
    int64_t outer, inner;
    mpri_nn_split_dims(m->ndim, m->shape, dim, &outer, &inner);
    int64_t n_at = m->ndim ? m->shape[dim] : 1;
    int64_t k = gather ? (idx->ndim ? idx->shape[dim] : 1) : mpr_tensor_numel(idx);
    mpr_tensor_t *gx = mpri_full_on(m->device, m->dtype, m->ndim, m->shape, 0.0); /* scope-owned */
    mpr_tensor_t *gy = mpr_tensor_contiguous(gout[0]);
    if (!gx || !gy) {
        mpr_tensor_release(gy);
        return mpr_last_error_code();
    }
    mpr_err_t e = index_kernel(gather, true, m->device, m->dtype, mpr_tensor_data(gy), mpr_tensor_data(idx),
                               mpr_tensor_data(gx), outer, n_at, k, inner);
    mpr_tensor_release(gy);
    gin[0] = gx;
    return e;
}

static const mpri_op_def_t index_select_def = {.name = "index_select", .backward = index_backward,
                                               MPRI_OP_STATE(mpri_ctx_dim_t)};
static const mpri_op_def_t embedding_def = {.name = "embedding", .backward = index_backward,
                                            MPRI_OP_STATE(mpri_ctx_dim_t)};
static const mpri_op_def_t gather_def = {.name = "gather", .backward = index_backward,
                                         MPRI_OP_STATE(mpri_ctx_dim_t)};

static bool is_gather(const mpri_op_def_t *def) { return def == &gather_def; }

/* A contiguous copy of contiguous `t` on `device` (caller-owned, no history). */
static mpr_tensor_t *copy_to(mpr_tensor_t *t, int device) {
    mpr_tensor_t *c = mpri_empty_on(device, t->dtype, t->ndim, t->shape);
    if (c && mpri_backend_transfer("index", mpr_tensor_data(c), device, mpr_tensor_data(t), t->storage->device,
                                   (size_t)mpr_tensor_numel(t) * mpr_dtype_size(t->dtype)) != MPR_OK) {
        mpr_tensor_release(c);
        return NULL;
    }
    return c;
}

/* The index as the kernel of an input on `device` reads it: contiguous, on
 * `device`, every value checked against [0, n_at) on the host first. A new
 * reference, or NULL with the range error. */
static mpr_tensor_t *checked_index(const char *op, mpr_tensor_t *index, int device, int64_t n_at) {
    mpr_tensor_t *ic = mpri_contiguous_raw(index);
    if (!ic) return NULL;
    mpr_tensor_t *host = ic->storage->device < 0 ? mpr_tensor_retain(ic) : copy_to(ic, -1);
    mpr_err_t e = host ? mpri_nn_check_range(op, "index", mpr_tensor_data(host), mpr_tensor_numel(host), n_at,
                                             INT64_MIN)
                       : mpr_last_error_code();
    mpr_tensor_release(host);
    if (e == MPR_OK && ic->storage->device != device) {
        mpr_tensor_t *moved = copy_to(ic, device);
        mpr_tensor_release(ic);
        ic = moved;
    }
    if (e != MPR_OK) {
        mpr_tensor_release(ic);
        return NULL;
    }
    return ic;
}

/* MPR_ERR_DTYPE unless `index` is int64; MPR_ERR_INVALID_ARG unless it is on
 * the CPU or on x's device. */
static mpr_err_t check_index(const char *op, const char *what, const mpr_tensor_t *x, const mpr_tensor_t *index) {
    if (index->dtype != MPR_I64)
        return mpr_error_set(MPR_ERR_DTYPE, "%s: %s must be int64, got %s", op, what, mpr_dtype_name(index->dtype));
    int di = index->storage->device, dx = x->storage->device;
    if (di < 0 || di == dx) return MPR_OK;
    if (dx < 0)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: %s is on cuda:%d but the input is on the CPU", op, what, di);
    return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: %s is on cuda:%d but the input is on cuda:%d", op, what, di, dx);
}

/* The forward of def on x along d (checked by the caller) with `index`
 * (checked by check_index): range check, kernel into a new [oshape] tensor on
 * x's device, record. */
static mpr_tensor_t *index_forward(const mpri_op_def_t *def, mpr_tensor_t *x, int d, mpr_tensor_t *index,
                                   int ondim, const int64_t *oshape) {
    bool gather = is_gather(def);
    int64_t n_at = x->ndim ? x->shape[d] : 1;
    int64_t k = gather ? (index->ndim ? index->shape[d] : 1) : mpr_tensor_numel(index);
    mpr_tensor_t *ic = checked_index(def->name, index, x->storage->device, n_at);
    if (!ic) return NULL;
    mpr_tensor_t *xc = mpri_contiguous_raw(x);
    mpr_tensor_t *y = mpri_empty_on(x->storage->device, x->dtype, ondim, oshape);
    if (!xc || !y) {
        mpr_tensor_release(ic);
        mpr_tensor_release(xc);
        mpr_tensor_release(y);
        return NULL;
    }
    int64_t outer, inner;
    mpri_nn_split_dims(x->ndim, x->shape, d, &outer, &inner);
    mpr_err_t e = index_kernel(gather, false, x->storage->device, x->dtype, mpr_tensor_data(xc), mpr_tensor_data(ic),
                               mpr_tensor_data(y), outer, n_at, k, inner);
    mpr_tensor_release(xc);
    if (e != MPR_OK) {
        mpr_tensor_release(ic);
        mpr_tensor_release(y);
        return NULL;
    }
    mpri_node_t *n = mpri_record(def, 1, &x, y);
    if (n) {
        MPRI_NODE_STATE(n, mpri_ctx_dim_t)->dim = d;
        mpri_node_save(n, ic);
    }
    mpr_tensor_release(ic);
    return mpri_result(y);
}

/* ------------------------------------------------- index_select / embedding */

/* out shape: x's shape with dim replaced by the index's shape (index_select:
 * index 1-D; embedding: dim 0 of a 2-D table replaced by an index of any shape). */
static mpr_tensor_t *index_common(const mpri_op_def_t *def, mpr_tensor_t *x, int d,
                                  mpr_tensor_t *index) {
    const char *op = def->name;
    int ondim = x->ndim - 1 + index->ndim;
    if (ondim > MPR_MAX_DIMS) {
        mpr_error_set(MPR_ERR_SHAPE, "%s: result would have %d dims (max %d)", op, ondim,
                      MPR_MAX_DIMS);
        return NULL;
    }
    int64_t oshape[MPR_MAX_DIMS];
    int j = 0;
    for (int i = 0; i < d; i++) oshape[j++] = x->shape[i];
    for (int i = 0; i < index->ndim; i++) oshape[j++] = index->shape[i];
    for (int i = d + 1; i < x->ndim; i++) oshape[j++] = x->shape[i];
    return index_forward(def, x, d, index, ondim, oshape);
}

mpr_tensor_t *mpr_index_select(mpr_tensor_t *x, int dim, mpr_tensor_t *index) {
    MPRI_OP_INPUT(x);
    MPRI_OP_INPUT(index);
    if (!x || !index) return NULL;
    const char *op = "index_select";
    int d;
    if (mpri_check_float(op, x) != MPR_OK || check_index(op, "index", x, index) != MPR_OK) return NULL;
    if (x->ndim == 0) {
        mpr_error_set(MPR_ERR_SHAPE, "index_select: input must have at least 1 dim, got []");
        return NULL;
    }
    if (mpri_norm_dim(op, dim, x->ndim, &d) != MPR_OK) return NULL;
    if (index->ndim != 1) {
        char b[96];
        mpr_error_set(MPR_ERR_SHAPE, "index_select: index must be 1-D, got %s",
                      mpri_nn_shape(index, b, sizeof b));
        return NULL;
    }
    return index_common(&index_select_def, x, d, index);
}

mpr_tensor_t *mpr_embedding(mpr_tensor_t *weight, mpr_tensor_t *indices) {
    MPRI_OP_INPUT(weight);
    MPRI_OP_INPUT(indices);
    if (!weight || !indices) return NULL;
    const char *op = "embedding";
    if (mpri_check_float(op, weight) != MPR_OK || check_index(op, "indices", weight, indices) != MPR_OK)
        return NULL;
    if (weight->ndim != 2) {
        char b[96];
        mpr_error_set(MPR_ERR_SHAPE, "embedding: weight must be [num_embeddings, dim], got %s",
                      mpri_nn_shape(weight, b, sizeof b));
        return NULL;
    }
    return index_common(&embedding_def, weight, 0, indices);
}

/* ----------------------------------------------------------------- gather */

/* Only called with an index whose extents equal x's except at dim. */
static mpr_tensor_t *gather_same(mpr_tensor_t *x, int d, mpr_tensor_t *index) {
    return index_forward(&gather_def, x, d, index, index->ndim, index->shape);
}

mpr_tensor_t *mpr_gather(mpr_tensor_t *x, int dim, mpr_tensor_t *index) {
    MPRI_OP_INPUT(x);
    MPRI_OP_INPUT(index);
    if (!x || !index) return NULL;
    const char *op = "gather";
    int d;
    if (mpri_check_float(op, x) != MPR_OK || check_index(op, "index", x, index) != MPR_OK ||
        mpri_norm_dim(op, dim, x->ndim, &d) != MPR_OK)
        return NULL;
    char bx[96], bi[96];
    if (index->ndim != x->ndim) {
        mpr_error_set(MPR_ERR_SHAPE, "gather: index must have the input's number of dims, got "
                      "input %s and index %s", mpri_nn_shape(x, bx, sizeof bx),
                      mpri_nn_shape(index, bi, sizeof bi));
        return NULL;
    }
    bool narrow = false;
    for (int i = 0; i < x->ndim; i++) {
        if (i != d && index->shape[i] > x->shape[i]) {
            mpr_error_set(MPR_ERR_SHAPE, "gather: index %s is larger than input %s in dim %d",
                          mpri_nn_shape(index, bi, sizeof bi), mpri_nn_shape(x, bx, sizeof bx), i);
            return NULL;
        }
        if (i != d && index->shape[i] < x->shape[i]) narrow = true;
    }
    if (!narrow) return gather_same(x, d, index);
    /* Narrow x to the index's extent in the other dims (views with backward),
     * inside a private scope so only the result escapes. */
    mpr_scope_begin();
    mpr_tensor_t *xv = x;
    for (int i = 0; i < x->ndim && xv; i++)
        if (i != d && index->shape[i] < x->shape[i]) xv = mpr_narrow(xv, i, 0, index->shape[i]);
    mpr_tensor_t *y = xv ? gather_same(xv, d, index) : NULL;
    mpr_scope_escape(y);
    mpr_scope_end();
    return y;
}
