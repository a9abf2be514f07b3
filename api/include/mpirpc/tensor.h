/* mpirpc/tensor.h — the tensor container: dtype, shape, strides, refcounted storage.
 *
 * This is the part of the tensor library the runtime needs (RPC values carry
 * tensors; their storage goes to and from the wire without a serialization
 * copy). Ops, autograd and nn live in the autograd layer and extend this
 * header's type (see mpirpc/tensor_ops.h when present).
 *
 * Ownership: every function returning `mpr_tensor_t *` returns a new reference
 * the caller must mpr_tensor_release(), or NULL with mpr_last_error() set.
 * Functions taking `const mpr_tensor_t *` or `mpr_tensor_t *` borrow it.
 * mpr_tensor_release(NULL) is a no-op. Getters given NULL set
 * MPR_ERR_INVALID_ARG and return 0 (ndim, numel, nbytes), NULL (shape,
 * strides, data), false, -1 (device) or MPR_DTYPE_COUNT (dtype).
 *
 * Misuse is detected, not silent: using a tensor after its last release,
 * releasing it twice, or releasing a reference a scope owns (the result of
 * an op made while a scope is open, see tensor_ops.h) aborts with
 * "mpirpc: ... tensor 0x... (float32 [2, 3]) ..." naming the tensor —
 * reliably in Debug/sanitizer builds (freed tensors are quarantined), best
 * effort otherwise. */
#ifndef MPIRPC_TENSOR_H
#define MPIRPC_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mpirpc/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MPR_F32 = 0,
    MPR_F64 = 1,
    MPR_I64 = 2,
    MPR_I32 = 3,
    MPR_U8 = 4,
    MPR_DTYPE_COUNT
} mpr_dtype_t;

#define MPR_MAX_DIMS 8

typedef struct mpr_tensor mpr_tensor_t;

/* Bytes per element; 0 for an invalid dtype. */
size_t mpr_dtype_size(mpr_dtype_t dtype);
/* "float32", "float64", "int64", "int32", "uint8"; "?" for an invalid dtype. */
const char *mpr_dtype_name(mpr_dtype_t dtype);

/* A new contiguous CPU tensor with uninitialized data. shape: [ndim], each >= 0;
 * 0 <= ndim <= MPR_MAX_DIMS. */
mpr_tensor_t *mpr_tensor_empty(mpr_dtype_t dtype, int ndim, const int64_t *shape);

mpr_tensor_t *mpr_tensor_retain(mpr_tensor_t *t);
void mpr_tensor_release(mpr_tensor_t *t);

mpr_dtype_t mpr_tensor_dtype(const mpr_tensor_t *t);
int mpr_tensor_ndim(const mpr_tensor_t *t);
/* Borrowed arrays of length ndim, valid while `t` lives. */
const int64_t *mpr_tensor_shape(const mpr_tensor_t *t);
const int64_t *mpr_tensor_strides(const mpr_tensor_t *t); /* in elements */
int64_t mpr_tensor_numel(const mpr_tensor_t *t);
/* numel * element size (the bytes a contiguous copy occupies). */
size_t mpr_tensor_nbytes(const mpr_tensor_t *t);
bool mpr_tensor_is_contiguous(const mpr_tensor_t *t);
/* Pointer to the first element (storage + offset); borrowed, valid while `t`
 * lives. For a CUDA tensor this is a device pointer. */
void *mpr_tensor_data(const mpr_tensor_t *t);
/* Device: -1 for CPU, N for cuda:N. */
int mpr_tensor_device(const mpr_tensor_t *t);

/* `t` itself (a new reference) if already contiguous, else a contiguous copy. */
mpr_tensor_t *mpr_tensor_contiguous(mpr_tensor_t *t);

/* Number of live tensor objects in this process (for leak tests). */
int64_t mpr_tensor_live_count(void);

#ifdef __cplusplus
}
#endif
#endif
