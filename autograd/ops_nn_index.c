/* ops_nn_index.c — indexing along one dim with backward: index_select,
 * embedding (index_select of rows of a [V, D] table by an index tensor of any
 * shape) and gather.
 *
 * Invariants: index tensors are int64 and every value is checked to lie in
 * range before any output is written; the index tensor is saved for backward
 * (its version is checked like any saved tensor); backward scatter-adds so
 * repeated indices accumulate, and the gradient of the indexed input is dense
 * (same shape as the input). gather with an index smaller than the input in
 * the other dims narrows the input first (views with their own backward). */
#include "mpri_nn_ops.h"

/* ------------------------------------------------- index_select / embedding
 * State: mpri_ctx_dim_t (the indexed axis of the input). saved[0] = flat index. */

static mpr_err_t index_select_backward(mpri_node_t *n, mpr_tensor_t *const *gout,
                                       mpr_tensor_t **gin) {
    mpr_tensor_t *idx = mpri_node_saved(n, 0);
    if (!idx) return mpr_last_error_code();
    if (!mpri_node_needs_grad(n, 0)) return MPR_OK;
    const mpri_tensor_meta_t *m = &n->in_meta[0];
    int dim = MPRI_NODE_STATE(n, mpri_ctx_dim_t)->dim;
    int64_t outer, inner;
    mpri_nn_split_dims(m->ndim, m->shape, dim, &outer, &inner);
    int64_t k = mpr_tensor_numel(idx);
    mpr_tensor_t *gx = mpr_zeros(m->dtype, m->ndim, m->shape); /* scope-owned */
    mpr_tensor_t *gy = mpr_tensor_contiguous(gout[0]);
    if (!gx || !gy) {
        mpr_tensor_release(gy);
        return mpr_last_error_code();
    }
    if (m->dtype == MPR_F32)
        mpri_index_select_bwd_f32(mpr_tensor_data(gy), mpr_tensor_data(idx), mpr_tensor_data(gx),
                                  outer, m->shape[dim], k, inner);
    else
        mpri_index_select_bwd_f64(mpr_tensor_data(gy), mpr_tensor_data(idx), mpr_tensor_data(gx),
                                  outer, m->shape[dim], k, inner);
    mpr_tensor_release(gy);
    gin[0] = gx;
    return MPR_OK;
}

static const mpri_op_def_t index_select_def = {.name = "index_select", .backward = index_select_backward, MPRI_OP_STATE(mpri_ctx_dim_t)};
static const mpri_op_def_t embedding_def = {.name = "embedding", .backward = index_select_backward, MPRI_OP_STATE(mpri_ctx_dim_t)};

/* out shape: x's shape with dim replaced by the index's shape (index_select:
 * index 1-D; embedding: dim 0 of a 2-D table replaced by an index of any shape). */
static mpr_tensor_t *index_common(const mpri_op_def_t *def, mpr_tensor_t *x, int d,
                                  mpr_tensor_t *index) {
    const char *op = def->name;
    int64_t k = mpr_tensor_numel(index);
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
    mpr_tensor_t *ic = mpr_tensor_contiguous(index);
    if (!ic) return NULL;
    if (mpri_nn_check_range(op, "index", mpr_tensor_data(ic), k, x->shape[d], INT64_MIN) != MPR_OK) {
        mpr_tensor_release(ic);
        return NULL;
    }
    mpr_tensor_t *xc = mpr_tensor_contiguous(x);
    mpr_tensor_t *y = mpr_tensor_empty(x->dtype, ondim, oshape);
    if (!xc || !y) {
        mpr_tensor_release(ic);
        mpr_tensor_release(xc);
        mpr_tensor_release(y);
        return NULL;
    }
    int64_t outer, inner;
    mpri_nn_split_dims(x->ndim, x->shape, d, &outer, &inner);
    if (x->dtype == MPR_F32)
        mpri_index_select_fwd_f32(mpr_tensor_data(xc), mpr_tensor_data(ic), mpr_tensor_data(y),
                                  outer, x->shape[d], k, inner);
    else
        mpri_index_select_fwd_f64(mpr_tensor_data(xc), mpr_tensor_data(ic), mpr_tensor_data(y),
                                  outer, x->shape[d], k, inner);
    mpr_tensor_release(xc);
    mpri_node_t *n = mpri_record(def, 1, &x, y);
    if (n) {
        MPRI_NODE_STATE(n, mpri_ctx_dim_t)->dim = d;
        mpri_node_save(n, ic);
    }
    mpr_tensor_release(ic);
    return mpri_result(y);
}

mpr_tensor_t *mpr_index_select(mpr_tensor_t *x, int dim, mpr_tensor_t *index) {
    if (!x || !index) return NULL;
    const char *op = "index_select";
    int d;
    if (mpri_nn_check_float_cpu(op, x) != MPR_OK || mpri_nn_check_index(op, "index", index) != MPR_OK)
        return NULL;
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
    if (!weight || !indices) return NULL;
    const char *op = "embedding";
    if (mpri_nn_check_float_cpu(op, weight) != MPR_OK ||
        mpri_nn_check_index(op, "indices", indices) != MPR_OK)
        return NULL;
    if (weight->ndim != 2) {
        char b[96];
        mpr_error_set(MPR_ERR_SHAPE, "embedding: weight must be [num_embeddings, dim], got %s",
                      mpri_nn_shape(weight, b, sizeof b));
        return NULL;
    }
    return index_common(&embedding_def, weight, 0, indices);
}

/* ----------------------------------------------------------------- gather
 * Only called with an index whose extents equal x's except at dim.
 * State: mpri_ctx_dim_t; saved[0] = contiguous index. */

static mpr_err_t gather_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    mpr_tensor_t *idx = mpri_node_saved(n, 0);
    if (!idx) return mpr_last_error_code();
    if (!mpri_node_needs_grad(n, 0)) return MPR_OK;
    const mpri_tensor_meta_t *m = &n->in_meta[0];
    int dim = MPRI_NODE_STATE(n, mpri_ctx_dim_t)->dim;
    int64_t outer, inner;
    mpri_nn_split_dims(m->ndim, m->shape, dim, &outer, &inner);
    mpr_tensor_t *gx = mpr_zeros(m->dtype, m->ndim, m->shape);
    mpr_tensor_t *gy = mpr_tensor_contiguous(gout[0]);
    if (!gx || !gy) {
        mpr_tensor_release(gy);
        return mpr_last_error_code();
    }
    int64_t k = idx->ndim ? idx->shape[dim] : 1;
    if (m->dtype == MPR_F32)
        mpri_gather_bwd_f32(mpr_tensor_data(gy), mpr_tensor_data(idx), mpr_tensor_data(gx), outer,
                            m->ndim ? m->shape[dim] : 1, k, inner);
    else
        mpri_gather_bwd_f64(mpr_tensor_data(gy), mpr_tensor_data(idx), mpr_tensor_data(gx), outer,
                            m->ndim ? m->shape[dim] : 1, k, inner);
    mpr_tensor_release(gy);
    gin[0] = gx;
    return MPR_OK;
}

static const mpri_op_def_t gather_def = {.name = "gather", .backward = gather_backward, MPRI_OP_STATE(mpri_ctx_dim_t)};

static mpr_tensor_t *gather_same(mpr_tensor_t *x, int d, mpr_tensor_t *index) {
    int64_t n_at = x->ndim ? x->shape[d] : 1;
    int64_t k = index->ndim ? index->shape[d] : 1;
    mpr_tensor_t *ic = mpr_tensor_contiguous(index);
    if (!ic) return NULL;
    if (mpri_nn_check_range("gather", "index", mpr_tensor_data(ic), mpr_tensor_numel(ic), n_at,
                            INT64_MIN) != MPR_OK) {
        mpr_tensor_release(ic);
        return NULL;
    }
    mpr_tensor_t *xc = mpr_tensor_contiguous(x);
    mpr_tensor_t *y = mpr_tensor_empty(x->dtype, index->ndim, index->shape);
    if (!xc || !y) {
        mpr_tensor_release(ic);
        mpr_tensor_release(xc);
        mpr_tensor_release(y);
        return NULL;
    }
    int64_t outer, inner;
    mpri_nn_split_dims(x->ndim, x->shape, d, &outer, &inner);
    if (x->dtype == MPR_F32)
        mpri_gather_fwd_f32(mpr_tensor_data(xc), mpr_tensor_data(ic), mpr_tensor_data(y), outer,
                            n_at, k, inner);
    else
        mpri_gather_fwd_f64(mpr_tensor_data(xc), mpr_tensor_data(ic), mpr_tensor_data(y), outer,
                            n_at, k, inner);
    mpr_tensor_release(xc);
    mpri_node_t *n = mpri_record(&gather_def, 1, &x, y);
    if (n) {
        MPRI_NODE_STATE(n, mpri_ctx_dim_t)->dim = d;
        mpri_node_save(n, ic);
    }
    mpr_tensor_release(ic);
    return mpri_result(y);
}

mpr_tensor_t *mpr_gather(mpr_tensor_t *x, int dim, mpr_tensor_t *index) {
    if (!x || !index) return NULL;
    const char *op = "gather";
    int d;
    if (mpri_nn_check_float_cpu(op, x) != MPR_OK || mpri_nn_check_index(op, "index", index) != MPR_OK ||
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
