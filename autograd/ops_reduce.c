/* ops_reduce.c — reductions with backward: sum/mean over all elements or a
 * set of dims (keepdim), max over all elements (gradient split between ties
 * as PyTorch) or along one dim (gradient to the argmax), argmax.
 *
 * Invariants: results are new contiguous tensors; sum/mean backward expands
 * the gradient back to the input shape as a stride-0 view (no copy);
 * max_dim keeps its int64 indices as a saved tensor. */
#include <math.h>
#include <string.h>

#include "mpri_args.h"
#include "mpri_autograd.h"
#include "kernels/mpri_kernels.h"

/* Parse dims into a mask; MPR_ERR_INVALID_ARG on repeats/out of range. */
static mpr_err_t dims_mask(const char *op, const mpr_tensor_t *t, int ndims, const int *dims, bool *mask) {
    for (int i = 0; i < MPR_MAX_DIMS; i++) mask[i] = false;
    if (ndims < 0 || (ndims > 0 && !dims))
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: bad dims list (%d dims)", op, ndims);
    for (int i = 0; i < ndims; i++) {
        int d;
        if (mpri_norm_dim(op, dims[i], t->ndim, &d) != MPR_OK) return MPR_ERR_INVALID_ARG;
        if (t->ndim == 0) continue;
        if (mask[d]) return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: dim %d repeated", op, dims[i]);
        mask[d] = true;
    }
    return MPR_OK;
}

typedef struct mpri_ctx_sum {
    bool reduced[MPR_MAX_DIMS]; /* dims of the input summed over */
    double scale;               /* 1 (sum) or 1/count (mean) */
} mpri_ctx_sum_t;

static mpr_err_t sum_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    const mpri_tensor_meta_t *m = &n->in_meta[0];
    const mpri_ctx_sum_t *st = MPRI_NODE_STATE(n, mpri_ctx_sum_t);
    int64_t keep[MPR_MAX_DIMS];
    for (int i = 0; i < m->ndim; i++) keep[i] = st->reduced[i] ? 1 : m->shape[i];
    mpr_tensor_t *g = gout[0];
    if (st->scale != 1.0 && !(g = mpr_mul_scalar(g, st->scale))) return mpr_last_error_code();
    /* Every element's gradient is g's element at the kept dims: one view of
     * g with stride 0 on the reduced dims (what reshape then expand made,
     * without the intermediate view). g has the kept dims in order, with
     * the reduced ones as size 1 when keepdim. */
    bool keepdim = g->ndim == m->ndim;
    int64_t strides[MPR_MAX_DIMS];
    for (int i = 0, j = 0; i < m->ndim; i++) {
        if (st->reduced[i]) {
            strides[i] = 0;
            j += keepdim;
            continue;
        }
        MPRI_ASSERT(j < g->ndim && g->shape[j] == keep[i], "the engine hands sum's backward a gradient of its output's shape");
        strides[i] = g->strides[j++];
    }
    gin[0] = mpri_result(mpri_tensor_view(g->storage, g->dtype, m->ndim, m->shape, strides, g->offset));
    return gin[0] ? MPR_OK : mpr_last_error_code();
}
static const mpri_op_def_t sum_def = {.name = "sum", .backward = sum_backward, MPRI_OP_STATE(mpri_ctx_sum_t)};
static const mpri_op_def_t mean_def = {.name = "mean", .backward = sum_backward, MPRI_OP_STATE(mpri_ctx_sum_t)};

static mpr_tensor_t *sum_impl(const mpri_op_def_t *def, mpr_tensor_t *a, const bool *mask, bool keepdim,
                              bool mean) {
    if (mpri_check_float(def->name, a) != MPR_OK) return NULL;
    int64_t keep[MPR_MAX_DIMS], outsh[MPR_MAX_DIMS], so[MPR_MAX_DIMS];
    int nout = 0;
    int64_t count = 1;
    for (int i = 0; i < a->ndim; i++) {
        keep[i] = mask[i] ? 1 : a->shape[i];
        if (mask[i]) count *= a->shape[i];
        if (!mask[i] || keepdim) outsh[nout++] = keep[i];
    }
    const mpri_backend_t *B = mpri_backend_of(def->name, 1, &a);
    mpr_tensor_t *out = B ? mpri_empty_on(a->storage->device, a->dtype, nout, outsh) : NULL;
    if (!out) return NULL;
    int dev = a->storage->device;
    mpr_err_t rc = MPRI_BK(B, fill, dev, a->dtype, nout, out->shape, mpr_tensor_data(out), out->strides, 0.0);
    int64_t s = 1;
    for (int i = a->ndim - 1; i >= 0; i--) {
        so[i] = mask[i] ? 0 : s;
        s *= keep[i];
    }
    if (rc == MPR_OK)
        rc = MPRI_BK(B, sum_into, dev, a->dtype, a->ndim, a->shape, mpr_tensor_data(out), so, mpr_tensor_data(a),
                     a->strides);
    double scale = 1.0;
    if (mean && rc == MPR_OK) {
        scale = count ? 1.0 / (double)count : NAN;
        rc = MPRI_BK(B, unary, dev, MPRI_UN_MUL_S, out->dtype, mpr_tensor_numel(out), mpr_tensor_data(out),
                     mpr_tensor_data(out), scale, 0);
    }
    if (rc != MPR_OK) {
        mpr_tensor_release(out);
        return NULL;
    }
    mpri_node_t *n = mpri_record(def, 1, &a, out);
    if (n) {
        mpri_ctx_sum_t *st = MPRI_NODE_STATE(n, mpri_ctx_sum_t);
        for (int i = 0; i < a->ndim; i++) st->reduced[i] = mask[i];
        st->scale = scale;
    }
    return mpri_result(out);
}

mpr_tensor_t *mpr_sum_dims(mpr_tensor_t *a, int ndims, const int *dims, bool keepdim) {
    MPRI_OP_INPUT(a);
    if (ndims > 0) MPRI_ARG_NONNULL_OR(dims, NULL);
    if (!a) return NULL;
    bool mask[MPR_MAX_DIMS];
    if (dims_mask("sum", a, ndims, dims, mask) != MPR_OK) return NULL;
    return sum_impl(&sum_def, a, mask, keepdim, false);
}
mpr_tensor_t *mpr_mean_dims(mpr_tensor_t *a, int ndims, const int *dims, bool keepdim) {
    MPRI_OP_INPUT(a);
    MPRI_OP_INPUT(a);
    if (ndims > 0) MPRI_ARG_NONNULL_OR(dims, NULL);
    if (!a) return NULL;
    bool mask[MPR_MAX_DIMS];
    if (dims_mask("mean", a, ndims, dims, mask) != MPR_OK) return NULL;
    return sum_impl(&mean_def, a, mask, keepdim, true);
}
mpr_tensor_t *mpr_sum(mpr_tensor_t *a) {
    MPRI_OP_INPUT(a);
    if (!a) return NULL;
    bool mask[MPR_MAX_DIMS];
    for (int i = 0; i < MPR_MAX_DIMS; i++) mask[i] = true;
    return sum_impl(&sum_def, a, mask, false, false);
}
mpr_tensor_t *mpr_mean(mpr_tensor_t *a) {
    MPRI_OP_INPUT(a);
    if (!a) return NULL;
    bool mask[MPR_MAX_DIMS];
    for (int i = 0; i < MPR_MAX_DIMS; i++) mask[i] = true;
    return sum_impl(&mean_def, a, mask, false, true);
}

/* ---- max over all elements: gradient split evenly between the maxima ---- */

typedef struct mpri_ctx_max {
    double best; /* the maximum found by forward */
} mpri_ctx_max_t;

static mpr_err_t max_all_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    mpr_tensor_t *x = mpri_node_saved(n, 0);
    if (!x) return mpr_last_error_code();
    double g, best = MPRI_NODE_STATE(n, mpri_ctx_max_t)->best;
    if (mpr_item(gout[0], &g) != MPR_OK) return mpr_last_error_code();
    mpr_tensor_t *z = mpr_zeros(x->dtype, x->ndim, x->shape);
    if (!z) return mpr_last_error_code();
    int64_t cnt = 0, numel = mpr_tensor_numel(x);
    for (int pass = 0; pass < 2; pass++)
        for (int64_t i = 0; i < numel; i++) {
            double v = x->dtype == MPR_F32 ? ((const float *)mpr_tensor_data(x))[i]
                                           : ((const double *)mpr_tensor_data(x))[i];
            if (!(v == best || (isnan(v) && isnan(best)))) continue;
            if (pass == 0) { cnt++; continue; }
            if (x->dtype == MPR_F32) ((float *)mpr_tensor_data(z))[i] = (float)(g / (double)cnt);
            else ((double *)mpr_tensor_data(z))[i] = g / (double)cnt;
        }
    gin[0] = z;
    return MPR_OK;
}
static const mpri_op_def_t max_def = {.name = "max", .backward = max_all_backward, MPRI_OP_STATE(mpri_ctx_max_t)};

mpr_tensor_t *mpr_max(mpr_tensor_t *a) {
    MPRI_OP_INPUT(a);
    if (!a) return NULL;
    if (mpri_check_float("max", a) != MPR_OK || mpri_check_cpu("max", a) != MPR_OK) return NULL;
    if (mpr_tensor_numel(a) == 0) {
        mpr_error_set(MPR_ERR_SHAPE, "max: empty tensor has no maximum");
        return NULL;
    }
    mpr_tensor_t *x = mpr_tensor_contiguous(a);
    if (!x) return NULL;
    mpr_tensor_t *out = mpr_tensor_empty(a->dtype, 0, NULL);
    if (!out) { mpr_tensor_release(x); return NULL; }
    mpri_k_max_dim(a->dtype, 1, mpr_tensor_numel(x), 1, mpr_tensor_data(x), mpr_tensor_data(out), NULL);
    mpri_node_t *n = mpri_record(&max_def, 1, &a, out);
    if (n) {
        mpri_node_save(n, x);
        mpr_item(out, &MPRI_NODE_STATE(n, mpri_ctx_max_t)->best);
    }
    mpr_tensor_release(x);
    return mpri_result(out);
}

/* ---- max along a dim: gradient to the argmax ---- */
/* saved 0: indices [outer*inner] int64. */
typedef struct mpri_ctx_max_dim {
    int64_t outer, n, inner; /* the input seen as [outer, n, inner] around the dim */
} mpri_ctx_max_dim_t;

static mpr_err_t max_dim_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    mpr_tensor_t *idx = mpri_node_saved(n, 0);
    if (!idx) return mpr_last_error_code();
    const mpri_tensor_meta_t *m = &n->in_meta[0];
    const mpri_backend_t *B = mpri_backend_of(n->def->name, 1, gout);
    if (!B) return mpr_last_error_code();
    mpr_tensor_t *g = mpri_result(mpri_contiguous_raw(gout[0]));
    mpr_tensor_t *z = mpri_full_on(m->device, m->dtype, m->ndim, m->shape, 0.0);
    if (!g || !z) return mpr_last_error_code();
    const mpri_ctx_max_dim_t *st = MPRI_NODE_STATE(n, mpri_ctx_max_dim_t);
    mpr_err_t rc = MPRI_BK(B, max_dim_backward, m->device, m->dtype, st->outer, st->n, st->inner, mpr_tensor_data(g), mpr_tensor_data(idx), mpr_tensor_data(z));
    if (rc != MPR_OK) return rc;
    gin[0] = z;
    return MPR_OK;
}
static const mpri_op_def_t max_dim_def = {.name = "max_dim", .backward = max_dim_backward, MPRI_OP_STATE(mpri_ctx_max_dim_t)};

static mpr_tensor_t *max_dim_impl(mpr_tensor_t *a, int dim, bool keepdim, mpr_tensor_t **indices_out,
                                  bool want_values, const char *op) {
    if (mpri_check_float(op, a) != MPR_OK) return NULL;
    int d;
    if (mpri_norm_dim(op, dim, a->ndim, &d) != MPR_OK) return NULL;
    int64_t nd = a->ndim ? a->shape[d] : 1;
    if (nd == 0 || (a->ndim && mpr_tensor_numel(a) == 0)) {
        char sb[96];
        mpr_error_set(MPR_ERR_SHAPE, "%s: cannot reduce an empty dim of %s", op,
                      mpr_shape_str(a->ndim, a->shape, sb, sizeof sb));
        return NULL;
    }
    int64_t outer = 1, inner = 1, sh[MPR_MAX_DIMS];
    int no = 0;
    for (int i = 0; i < a->ndim; i++) {
        if (i < d) outer *= a->shape[i];
        if (i > d) inner *= a->shape[i];
        if (i != d) sh[no++] = a->shape[i];
        else if (keepdim) sh[no++] = 1;
    }
    const mpri_backend_t *B = mpri_backend_of(op, 1, &a);
    int dev = a->storage->device;
    mpr_tensor_t *x = B ? mpri_contiguous_raw(a) : NULL;
    mpr_tensor_t *vals = x ? mpri_empty_on(dev, a->dtype, no, sh) : NULL;
    mpr_tensor_t *idx = vals ? mpri_empty_on(dev, MPR_I64, no, sh) : NULL;
    if (!idx) {
        mpr_tensor_release(x);
        mpr_tensor_release(vals);
        return NULL;
    }
    mpr_err_t rc = MPRI_BK(B, max_dim, dev, a->dtype, outer, nd, inner, mpr_tensor_data(x), mpr_tensor_data(vals),
                           mpr_tensor_data(idx));
    mpr_tensor_release(x);
    if (rc != MPR_OK) {
        mpr_tensor_release(vals);
        mpr_tensor_release(idx);
        return NULL;
    }
    if (!want_values) {
        mpr_tensor_release(vals);
        return mpri_result(idx);
    }
    mpri_node_t *n = mpri_record(&max_dim_def, 1, &a, vals);
    if (n) {
        *MPRI_NODE_STATE(n, mpri_ctx_max_dim_t) = (mpri_ctx_max_dim_t){.outer = outer, .n = nd, .inner = inner};
        mpri_node_save(n, idx);
    }
    if (indices_out)
        *indices_out = mpri_result(idx);
    else
        mpr_tensor_release(idx);
    return mpri_result(vals);
}

mpr_tensor_t *mpr_max_dim(mpr_tensor_t *a, int dim, bool keepdim, mpr_tensor_t **indices_out) {
    if (indices_out) *indices_out = NULL;
    MPRI_OP_INPUT(a);
    if (!a) return NULL;
    return max_dim_impl(a, dim, keepdim, indices_out, true, "max_dim");
}

mpr_tensor_t *mpr_argmax(mpr_tensor_t *a, int dim, bool keepdim) {
    MPRI_OP_INPUT(a);
    if (!a) return NULL;
    return max_dim_impl(a, dim, keepdim, NULL, false, "argmax");
}
