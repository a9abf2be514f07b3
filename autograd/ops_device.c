/* ops_device.c — tensors on devices: allocation on cuda:N, the
 * differentiable device copy mpr_to_device.
 *
 * Invariants: a device storage comes from the registered device backend
 * (mpri_backend_storage) and is freed through it; device copies are made from
 * contiguous data (a strided source is packed on its own device first), so
 * the bytes moved are exactly numel * itemsize, through the backend's
 * transfer; the backward of a device copy copies the gradient back to the
 * source device. Which devices exist is asked of mpirpc/cuda.h's queries
 * (runtime/kernels/cuda/cuda_backend.c): without CUDA every cuda:N request
 * fails with MPR_ERR_UNSUPPORTED and device -1 behaves as the identity. */
#include <stdlib.h>

#include "mpri_args.h"
#include "mpirpc/cuda.h"
#include "mpri_autograd.h"

/* MPR_OK if `device` can hold tensors; `op` names the caller in the error. */
static mpr_err_t check_device(const char *op, int device) {
    if (device < -1) return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: invalid device %d", op, device);
    if (device == -1) return MPR_OK;
    if (!mpr_cuda_is_built())
        return mpr_error_set(MPR_ERR_UNSUPPORTED,
                             "%s: cuda:%d requested but mpirpc was built without CUDA (configure with "
                             "-DMPIRPC_CUDA=ON)",
                             op, device);
    int n = mpr_cuda_device_count();
    if (device >= n)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: cuda:%d is not visible (%d CUDA device%s)", op, device, n,
                             n == 1 ? "" : "s");
    return MPR_OK;
}

mpr_tensor_t *mpr_tensor_empty_on(int device, mpr_dtype_t dtype, int ndim, const int64_t *shape) {
    if (ndim > 0) MPRI_ARG_NONNULL_OR(shape, NULL);
    if (check_device("empty_on", device) != MPR_OK) return NULL;
    return mpri_empty_on(device, dtype, ndim, shape); /* device memory from the registered backend */
}

/* A contiguous copy of `t` on `device` (caller-owned, no history). */
static mpr_tensor_t *copy_to(mpr_tensor_t *t, int device) {
    int src_dev = t->storage->device;
    mpr_tensor_t *src = mpri_contiguous_raw(t); /* packed on its own device */
    if (!src) return NULL;
    mpr_tensor_t *out = mpri_empty_on(device, t->dtype, t->ndim, t->shape);
    if (out && mpri_backend_transfer("to_device", mpr_tensor_data(out), device, mpr_tensor_data(src), src_dev,
                                     mpr_tensor_nbytes(t)) != MPR_OK) {
        mpr_tensor_release(out);
        out = NULL;
    }
    mpr_tensor_release(src);
    return out;
}

/* The runtime's wire copies (mpri_tensor_device_hooks_t): no history. */
static mpr_tensor_t *wire_to_host(mpr_tensor_t *t) { return copy_to(t, -1); }
static mpr_tensor_t *wire_to_device(mpr_tensor_t *t, int device) {
    return check_device("receive", device) == MPR_OK ? copy_to(t, device) : NULL;
}
static const mpri_tensor_device_hooks_t wire_device_hooks = {wire_to_host, wire_to_device};

mpr_err_t mpri_device_wire_install(void) {
    mpri_tensor_set_device_hooks(&wire_device_hooks);
    return MPR_OK;
}

typedef struct mpri_ctx_to_device {
    int src_device; /* where the input lived: the gradient goes back there */
} mpri_ctx_to_device_t;

static mpr_err_t to_device_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    /* gout[0]: [*shape] on the destination device -> gin[0] on the source device. */
    if (!mpri_node_needs_grad(n, 0)) return MPR_OK;
    gin[0] = mpr_to_device(gout[0], MPRI_NODE_STATE(n, mpri_ctx_to_device_t)->src_device);
    return gin[0] ? MPR_OK : mpr_last_error_code();
}

static const mpri_op_def_t to_device_def = {.name = "to_device", .backward = to_device_backward,
                                            MPRI_OP_STATE(mpri_ctx_to_device_t)};

mpr_tensor_t *mpr_to_device(mpr_tensor_t *t, int device) {
    MPRI_OP_INPUT(t);
    if (!t) return NULL;
    if (check_device("to_device", device) != MPR_OK) return NULL;
    if (t->storage->device == device) return mpri_result(mpr_tensor_retain(t));
    int src_dev = t->storage->device;
    mpr_tensor_t *out = copy_to(t, device);
    if (!out) return NULL;
    mpri_node_t *n = mpri_record(&to_device_def, 1, (mpr_tensor_t *[]){t}, out);
    if (n) MPRI_NODE_STATE(n, mpri_ctx_to_device_t)->src_device = src_dev;
    return mpri_result(out);
}
