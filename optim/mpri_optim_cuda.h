/* mpri_optim_cuda.h — the local optimizers' update kernels for parameters on
 * a CUDA device (optim/cuda/optim_update.cu, compiled by nvcc only with
 * -DMPIRPC_CUDA=ON; not installed). Plain C / C++ declarations: nvcc reads
 * this header, so it includes public headers only.
 *
 * Contract: each function applies one step of its algorithm to the n
 * contiguous elements of p on `device` from gradient g (same device, shape
 * and dtype), updating the used slots in place (slots[k] NULL for an unused
 * slot, exactly the slot layout of the CPU vtable in mpri_optim.h), `step`
 * the parameter's step count including this one. The arithmetic is the CPU
 * kernel's, operation by operation: the scalars are computed on the host in
 * double as the CPU kernels compute them and cast to the dtype at the same
 * places; the kernels are compiled without FMA contraction (-fmad=false) and
 * with IEEE division and square root, so a CUDA parameter follows the same
 * trajectory as a CPU one, bit for bit (tests/unit/test_cuda_optim.c).
 *
 * Kernels run on the device's default stream (as every CUDA op of the
 * library), so they are ordered after the kernels that produced g and
 * before any later op or copy of p. Returns MPR_OK, or MPR_ERR_STATE /
 * MPR_ERR_DTYPE with a detail naming the optimizer and the CUDA error. */
#ifndef MPRI_OPTIM_CUDA_H
#define MPRI_OPTIM_CUDA_H

#include <stdint.h>

#include "mpirpc/optim.h"
#include "mpirpc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef mpr_err_t (*mpri_optim_cuda_update_fn)(const mpr_optim_options_t *o, int device, mpr_dtype_t dt,
                                               int64_t n, void *p, const void *g, void *const *slots,
                                               int64_t step);

mpr_err_t mpri_optim_cuda_sgd(const mpr_optim_options_t *o, int device, mpr_dtype_t dt, int64_t n, void *p,
                              const void *g, void *const *slots, int64_t step);
mpr_err_t mpri_optim_cuda_adagrad(const mpr_optim_options_t *o, int device, mpr_dtype_t dt, int64_t n, void *p,
                                  const void *g, void *const *slots, int64_t step);
mpr_err_t mpri_optim_cuda_adam(const mpr_optim_options_t *o, int device, mpr_dtype_t dt, int64_t n, void *p,
                               const void *g, void *const *slots, int64_t step);
/* AdamW: p *= 1 - lr * weight_decay, then Adam without weight decay. */
mpr_err_t mpri_optim_cuda_adamw(const mpr_optim_options_t *o, int device, mpr_dtype_t dt, int64_t n, void *p,
                                const void *g, void *const *slots, int64_t step);
mpr_err_t mpri_optim_cuda_rmsprop(const mpr_optim_options_t *o, int device, mpr_dtype_t dt, int64_t n, void *p,
                                  const void *g, void *const *slots, int64_t step);

#ifdef __cplusplus
}
#endif
#endif
