/* mpirpc/cuda.h — CUDA devices for tensors (built with -DMPIRPC_CUDA=ON).
 *
 * A tensor lives on the CPU (device -1) or on cuda:N (device N); its storage
 * then holds device memory (mpr_tensor_data() is a device pointer).
 * mpr_to_device() copies between devices and is differentiable (the gradient
 * is copied back to the source device). Without CUDA support, or with no GPU
 * visible, mpr_cuda_device_count() is 0 and asking for a cuda:N tensor fails
 * with MPR_ERR_UNSUPPORTED (not built with CUDA) or MPR_ERR_INVALID_ARG
 * (device not visible), never a crash.
 *
 * Which ops run on CUDA tensors is decided by the op layer (tensor_ops.h):
 * matmul/linear go to cuBLAS, elementwise ops and the losses to the kernels
 * in runtime/kernels/cuda/. Ops that have no CUDA path refuse CUDA inputs
 * with MPR_ERR_UNSUPPORTED naming the op.
 *
 * Ownership: mpr_to_device returns a tensor owned like any op result (the
 * innermost scope, else the caller); mpr_tensor_empty_on gives the caller a
 * new reference (like mpr_tensor_empty). */
#ifndef MPIRPC_CUDA_H
#define MPIRPC_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include "mpirpc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* True if the library was built with the CUDA backend. */
bool mpr_cuda_is_built(void);
/* Number of visible CUDA devices; 0 without the backend or without a GPU. */
int mpr_cuda_device_count(void);

/* A new contiguous tensor with uninitialized data on `device` (-1: CPU). */
mpr_tensor_t *mpr_tensor_empty_on(int device, mpr_dtype_t dtype, int ndim, const int64_t *shape);

/* `t` on `device` (-1: CPU, N: cuda:N): a new reference to `t` itself when it
 * is already there, else a contiguous copy (any strides in, same dtype out)
 * recorded for autograd. */
mpr_tensor_t *mpr_to_device(mpr_tensor_t *t, int device);

/* Wait until all queued work on `device` finished (errors of earlier async
 * kernels surface here). MPR_OK for device -1. */
mpr_err_t mpr_cuda_synchronize(int device);

#ifdef __cplusplus
}
#endif
#endif
