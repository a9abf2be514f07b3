/* ops_create.c — tensor creation (zeros, ones, full, arange, from a buffer,
 * *_like), element access (item, copy to a buffer), clone and dtype
 * conversion with their backward, and allclose.
 *
 * Invariants: every created tensor is contiguous, owns fresh storage, and is
 * registered with the innermost scope (mpri_result); float<->float
 * conversion is differentiable, conversions involving integers are not. */
#include <math.h>
#include <string.h>

#include "mpri_args.h"
#include "mpri_autograd.h"
#include "kernels/mpri_kernels.h"

static mpr_tensor_t *filled(const char *op, mpr_dtype_t dtype, int ndim, const int64_t *shape,
                            double v, bool zero) {
    int64_t numel;
    if (mpri_tensor_check_shape(op, dtype, ndim, shape, &numel) != MPR_OK) return NULL;
    mpr_tensor_t *t = mpr_tensor_empty(dtype, ndim, shape);
    if (!t) return NULL;
    if (zero)
        memset(mpr_tensor_data(t), 0, mpr_tensor_nbytes(t));
    else
        mpri_k_fill(dtype, ndim, shape, mpr_tensor_data(t), t->strides, v);
    return mpri_result(t);
}

mpr_tensor_t *mpr_zeros(mpr_dtype_t dtype, int ndim, const int64_t *shape) {
    if (ndim > 0) MPRI_ARG_NONNULL_OR(shape, NULL);
    return filled("zeros", dtype, ndim, shape, 0, true);
}
mpr_tensor_t *mpr_ones(mpr_dtype_t dtype, int ndim, const int64_t *shape) {
    if (ndim > 0) MPRI_ARG_NONNULL_OR(shape, NULL);
    return filled("ones", dtype, ndim, shape, 1, false);
}
mpr_tensor_t *mpr_full(mpr_dtype_t dtype, int ndim, const int64_t *shape, double value) {
    if (ndim > 0) MPRI_ARG_NONNULL_OR(shape, NULL);
    return filled("full", dtype, ndim, shape, value, false);
}
mpr_tensor_t *mpr_zeros_like(const mpr_tensor_t *like) {
    MPRI_ARG_NONNULL_OR(like, NULL);
    return like ? mpri_full_on(like->storage->device, like->dtype, like->ndim, like->shape, 0.0) : NULL;
}
mpr_tensor_t *mpr_ones_like(const mpr_tensor_t *like) {
    MPRI_ARG_NONNULL_OR(like, NULL);
    return like ? mpri_full_on(like->storage->device, like->dtype, like->ndim, like->shape, 1.0) : NULL;
}

mpr_tensor_t *mpr_arange(mpr_dtype_t dtype, double start, double end, double step) {
    if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step)) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "arange: bad range start=%g end=%g step=%g", start, end, step);
        return NULL;
    }
    double n = ceil((end - start) / step);
    if (n > 0x1p53) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "arange: %g elements is too many (start=%g end=%g step=%g)", n, start,
                      end, step);
        return NULL;
    }
    int64_t len = n > 0 ? (int64_t)n : 0;
    mpr_tensor_t *t = mpr_tensor_empty(dtype, 1, &len);
    if (!t) return NULL;
    for (int64_t i = 0; i < len; i++) {
        double v = start + (double)i * step;
        switch (dtype) {
        case MPR_F32: ((float *)mpr_tensor_data(t))[i] = (float)v; break;
        case MPR_F64: ((double *)mpr_tensor_data(t))[i] = v; break;
        case MPR_I64: ((int64_t *)mpr_tensor_data(t))[i] = (int64_t)v; break;
        case MPR_I32: ((int32_t *)mpr_tensor_data(t))[i] = (int32_t)v; break;
        default: ((uint8_t *)mpr_tensor_data(t))[i] = (uint8_t)v; break;
        }
    }
    return mpri_result(t);
}

mpr_tensor_t *mpr_from_buffer(mpr_dtype_t dtype, int ndim, const int64_t *shape, const void *data) {
    if (ndim > 0) MPRI_ARG_NONNULL_OR(shape, NULL);
    MPRI_ARG_NONNULL_OR(data, NULL);
    int64_t numel;
    if (mpri_tensor_check_shape("from_buffer", dtype, ndim, shape, &numel) != MPR_OK) return NULL;
    if (!data && numel > 0) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "from_buffer: data is NULL");
        return NULL;
    }
    mpr_tensor_t *t = mpr_tensor_empty(dtype, ndim, shape);
    if (!t) return NULL;
    if (numel) memcpy(mpr_tensor_data(t), data, mpr_tensor_nbytes(t));
    return mpri_result(t);
}

mpr_err_t mpr_item(const mpr_tensor_t *t, double *out) {
    if (out) *out = 0;
    MPRI_ARG_NONNULL(t);
    MPRI_ARG_NONNULL(out);
    if (!t || !out) return mpr_error_set(MPR_ERR_INVALID_ARG, "item: tensor or out is NULL");
    if (mpr_tensor_numel(t) != 1) {
        char sb[96];
        return mpr_error_set(MPR_ERR_SHAPE, "item: tensor of shape %s has %lld elements, not 1",
                             mpr_shape_str(t->ndim, t->shape, sb, sizeof sb),
                             (long long)mpr_tensor_numel(t));
    }
    if (t->storage->device >= 0)
        return mpr_error_set(MPR_ERR_UNSUPPORTED, "item: tensor is on cuda:%d", t->storage->device);
    int64_t one = 1;
    mpri_k_copy(0, &one, MPR_F64, out, &one, t->dtype, mpr_tensor_data(t), &one);
    return MPR_OK;
}

mpr_err_t mpr_copy_to_buffer(const mpr_tensor_t *t, mpr_dtype_t dtype, void *out, size_t out_bytes) {
    MPRI_ARG_NONNULL(t);
    MPRI_ARG_NONNULL(out);
    if (!t || (!out && out_bytes)) return mpr_error_set(MPR_ERR_INVALID_ARG, "copy_to_buffer: NULL argument");
    size_t need = (size_t)mpr_tensor_numel(t) * mpr_dtype_size(dtype);
    if (mpr_dtype_size(dtype) == 0)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "copy_to_buffer: invalid dtype %d", (int)dtype);
    if (mpri_check_cpu("copy_to_buffer", t) != MPR_OK) return MPR_ERR_UNSUPPORTED;
    if (need > out_bytes)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "copy_to_buffer: needs %zu bytes, buffer has %zu", need, out_bytes);
    int64_t cs[MPR_MAX_DIMS], s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) { cs[i] = s; s *= t->shape[i]; }
    mpri_k_copy(t->ndim, t->shape, dtype, out, cs, t->dtype, mpr_tensor_data(t), t->strides);
    return MPR_OK;
}

/* ---- clone / to_dtype: out = convert(t); grad_in = convert_back(grad_out) ---- */

static mpr_tensor_t *converted(mpr_tensor_t *t, mpr_dtype_t dtype) {
    const mpri_backend_t *B = mpri_backend_of("copy", 1, &t);
    mpr_tensor_t *out = B ? mpri_empty_on(t->storage->device, dtype, t->ndim, t->shape) : NULL;
    if (!out) return NULL;
    if (MPRI_BK(B, copy, t->storage->device, t->ndim, t->shape, dtype, mpr_tensor_data(out), out->strides,
                t->dtype, mpr_tensor_data(t), t->strides) != MPR_OK) {
        mpr_tensor_release(out);
        return NULL;
    }
    return out;
}

static mpr_err_t convert_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    mpr_dtype_t in_dt = n->in_meta[0].dtype;
    gin[0] = gout[0]->dtype == in_dt ? gout[0] : mpr_to_dtype(gout[0], in_dt);
    return gin[0] ? MPR_OK : mpr_last_error_code();
}
static const mpri_op_def_t clone_def = {.name = "clone", .backward = convert_backward};
static const mpri_op_def_t to_dtype_def = {.name = "to_dtype", .backward = convert_backward};

mpr_tensor_t *mpr_clone(mpr_tensor_t *t) {
    MPRI_OP_INPUT(t);
    if (!t) return NULL;
    mpr_tensor_t *out = converted(t, t->dtype);
    if (!out) return NULL;
    mpri_record(&clone_def, 1, &t, out);
    return mpri_result(out);
}

mpr_tensor_t *mpr_to_dtype(mpr_tensor_t *t, mpr_dtype_t dtype) {
    MPRI_OP_INPUT(t);
    if (!t) return NULL;
    if (mpr_dtype_size(dtype) == 0) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "to_dtype: invalid dtype %d", (int)dtype);
        return NULL;
    }
    mpr_tensor_t *out = converted(t, dtype);
    if (!out) return NULL;
    if (dtype == MPR_F32 || dtype == MPR_F64) mpri_record(&to_dtype_def, 1, &t, out);
    return mpri_result(out);
}

bool mpr_allclose(const mpr_tensor_t *a, const mpr_tensor_t *b, double rtol, double atol) {
    MPRI_ARG_NONNULL_OR(a, false);
    MPRI_ARG_NONNULL_OR(b, false);
    if (!a || !b || a->ndim != b->ndim || a->storage->device >= 0 || b->storage->device >= 0) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    int64_t n = mpr_tensor_numel(a);
    int64_t idx[MPR_MAX_DIMS] = {0};
    size_t ea = mpr_dtype_size(a->dtype), eb = mpr_dtype_size(b->dtype);
    int64_t one = 1;
    for (int64_t k = 0; k < n; k++) {
        int64_t oa = 0, ob = 0;
        for (int d = 0; d < a->ndim; d++) { oa += idx[d] * a->strides[d]; ob += idx[d] * b->strides[d]; }
        double x, y;
        mpri_k_copy(0, &one, MPR_F64, &x, &one, a->dtype, (const char *)mpr_tensor_data(a) + oa * (int64_t)ea, &one);
        mpri_k_copy(0, &one, MPR_F64, &y, &one, b->dtype, (const char *)mpr_tensor_data(b) + ob * (int64_t)eb, &one);
        if (isnan(x) != isnan(y)) return false;
        if (!isnan(x) && !(fabs(x - y) <= atol + rtol * fabs(y))) return false;
        for (int d = a->ndim - 1; d >= 0; d--) {
            if (++idx[d] < a->shape[d]) break;
            idx[d] = 0;
        }
    }
    return true;
}
