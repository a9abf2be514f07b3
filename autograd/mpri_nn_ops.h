/* mpri_nn_ops.h — internal helpers shared by the nn ops (autograd/ops_nn_*.c):
 * argument checks with op-named errors, the [outer, n, inner] decomposition
 * around one dim, and index validation. Not installed. */
#ifndef MPRI_NN_OPS_H
#define MPRI_NN_OPS_H

#include <stdio.h>

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

/* MPR_ERR_DTYPE unless `t` is int64 (`what` names the argument). */
static inline mpr_err_t mpri_nn_check_index(const char *op, const char *what,
                                            const mpr_tensor_t *t) {
    if (t->dtype != MPR_I64)
        return mpr_error_set(MPR_ERR_DTYPE, "%s: %s must be int64, got %s", op, what,
                             mpr_dtype_name(t->dtype));
    return mpri_nn_check_cpu(op, t);
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

#endif
