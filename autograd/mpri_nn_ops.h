/* mpri_nn_ops.h — internal helpers shared by the nn ops (autograd/ops_nn_*.c):
 * argument checks with op-named errors, the [outer, n, inner] decomposition
 * around one dim, and index validation. Not installed. */
#ifndef MPRI_NN_OPS_H
#define MPRI_NN_OPS_H

#include <stdio.h>
#include <string.h>

#include "kernels/mpri_nn_kernels.h"
#include "mpirpc/nn_functional.h"
#include "mpri_autograd.h"

/* MPR_ERR_UNSUPPORTED unless `t` lives on the CPU (the nn ops have CPU
 * kernels only; CUDA tensors must be moved to the CPU first). */
static inline mpr_err_t mpri_nn_check_cpu(const char *op, const mpr_tensor_t *t) {
    return mpri_check_cpu(op, t);
}

/* Float dtype and CPU device. */
static inline mpr_err_t mpri_nn_check_float_cpu(const char *op, const mpr_tensor_t *t) {
    mpr_err_t e = mpri_check_float(op, t);
    return e != MPR_OK ? e : mpri_nn_check_cpu(op, t);
}

/* Shape of t as "[2, 3]" into a caller buffer. */
static inline const char *mpri_nn_shape(const mpr_tensor_t *t, char *buf, size_t cap) {
    return mpr_shape_str(t->ndim, t->shape, buf, cap);
}

/* Products of the dims before / after `dim` of shape[ndim]. */
static inline void mpri_nn_split_dims(int ndim, const int64_t *shape, int dim, int64_t *outer,
                                      int64_t *inner) {
    int64_t o = 1, in = 1;
    for (int i = 0; i < dim; i++) o *= shape[i];
    for (int i = dim + 1; i < ndim; i++) in *= shape[i];
    *outer = o;
    *inner = in;
}

/* Every value of the contiguous int64 buffer idx[n] is in [0, bound) or equals
 * `allowed` (pass INT64_MIN for none); else MPR_ERR_INVALID_ARG naming op. */
static inline mpr_err_t mpri_nn_check_range(const char *op, const char *what, const int64_t *idx,
                                            int64_t n, int64_t bound, int64_t allowed) {
    for (int64_t i = 0; i < n; i++)
        if ((idx[i] < 0 || idx[i] >= bound) && idx[i] != allowed)
            return mpr_error_set(MPR_ERR_INVALID_ARG,
                                 "%s: %s %lld at position %lld is out of range [0, %lld)", op,
                                 what, (long long)idx[i], (long long)i, (long long)bound);
    return MPR_OK;
}

/* ---- device helpers (softmax and the losses also run on device tensors,
 * through the backend of their device: kernels/mpri_kernels.h) ---- */

/* Device of t: -1 CPU, N cuda:N. */
static inline int mpri_nn_dev(const mpr_tensor_t *t) { return t->storage->device; }

/* Copies nbytes from `src` on `device` (-1 CPU) to host memory. */
static inline mpr_err_t mpri_nn_to_host(void *dst, const void *src, int device, size_t nbytes) {
    return mpri_backend_transfer("copy to host", dst, -1, src, device, nbytes);
}

/* The value of a one-element float tensor on any device. */
static inline mpr_err_t mpri_nn_item(const mpr_tensor_t *t, double *out) {
    if (mpri_nn_dev(t) < 0) return mpr_item(t, out);
    if (mpr_tensor_numel(t) != 1)
        return mpr_error_set(MPR_ERR_SHAPE, "item: tensor has %lld elements, not 1",
                             (long long)mpr_tensor_numel(t));
    union { float f; double d; } v;
    mpr_err_t e = mpri_nn_to_host(&v, mpr_tensor_data(t), mpri_nn_dev(t), mpr_dtype_size(t->dtype));
    if (e == MPR_OK) *out = t->dtype == MPR_F32 ? (double)v.f : v.d;
    return e;
}

/* A new caller-owned 0-d float tensor holding `value` on `device`. */
static inline mpr_tensor_t *mpri_nn_scalar_on(int device, mpr_dtype_t dt, double value) {
    const mpri_backend_t *b = mpri_backend_for("scalar", device);
    mpr_tensor_t *t = b ? mpri_empty_on(device, dt, 0, NULL) : NULL;
    if (t && MPRI_BK(b, fill, device, dt, t->ndim, t->shape, mpr_tensor_data(t), t->strides, value) != MPR_OK) {
        mpr_tensor_release(t);
        t = NULL;
    }
    return t;
}

#endif
