/* ops_device.c — tensors on CUDA devices: allocation on cuda:N, the
 * differentiable device copy mpr_to_device, device queries.
 *
 * Invariants: a CUDA storage comes from the registered device backend
 * (mpri_backend_storage) and is freed through it; device copies are made from
 * contiguous data (a strided CPU source is made contiguous first, a strided
 * CUDA source is packed on its device), so the bytes moved are exactly
 * numel * itemsize; the backward of a device copy copies the gradient back to
 * the source device. Without MPIRPC_HAVE_CUDA every cuda:N request fails with
 * MPR_ERR_UNSUPPORTED and device -1 behaves as the identity. */
#include <stdlib.h>

#include "mpirpc/cuda.h"
#include "mpri_autograd.h"
#ifdef MPIRPC_HAVE_CUDA
#include "kernels/cuda/mpri_cuda.h"
#endif

bool mpr_cuda_is_built(void) {
#ifdef MPIRPC_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

int mpr_cuda_device_count(void) {
#ifdef MPIRPC_HAVE_CUDA
    return mpri_cuda_device_count();
#else
    return 0;
#endif
}

mpr_err_t mpr_cuda_synchronize(int device) {
    if (device < 0) return MPR_OK;
#ifdef MPIRPC_HAVE_CUDA
    if (device >= mpri_cuda_device_count())
        return mpr_error_set(MPR_ERR_INVALID_ARG, "cuda_synchronize: cuda:%d is not visible", device);
    return mpri_cuda_synchronize(device);
#else
    return mpr_error_set(MPR_ERR_UNSUPPORTED, "cuda_synchronize: mpirpc was built without CUDA");
#endif
}

/* MPR_OK if `device` can hold tensors; `op` names the caller in the error. */
static mpr_err_t check_device(const char *op, int device) {
    if (device < -1) return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: invalid device %d", op, device);
    if (device == -1) return MPR_OK;
#ifdef MPIRPC_HAVE_CUDA
    int n = mpri_cuda_device_count();
    if (device >= n)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: cuda:%d is not visible (%d CUDA device%s)", op, device, n,
                             n == 1 ? "" : "s");
    return MPR_OK;
#else
    return mpr_error_set(MPR_ERR_UNSUPPORTED,
                         "%s: cuda:%d requested but mpirpc was built without CUDA (configure with -DMPIRPC_CUDA=ON)",
                         op, device);
#endif
}

mpr_tensor_t *mpr_tensor_empty_on(int device, mpr_dtype_t dtype, int ndim, const int64_t *shape) {
    if (check_device("empty_on", device) != MPR_OK) return NULL;
    if (device == -1) return mpr_tensor_empty(dtype, ndim, shape);
    int64_t numel;
    if (mpri_tensor_check_shape("empty_on", dtype, ndim, shape, &numel) != MPR_OK) return NULL;
    /* Device memory from the registered backend (runtime/kernels/cuda/cuda_backend.c). */
    mpri_storage_t *s = mpri_backend_storage("empty_on", device, (size_t)numel * mpr_dtype_size(dtype));
    if (!s) return NULL;
    mpr_tensor_t *t = mpri_tensor_view(s, dtype, ndim, shape, NULL, 0);
    mpri_storage_release(s);
    return t;
}

#ifdef MPIRPC_HAVE_CUDA
/* A contiguous copy of `t` on `device` (caller-owned, no history). */
static mpr_tensor_t *copy_to(mpr_tensor_t *t, int device) {
    int src_dev = t->storage->device;
    mpr_tensor_t *src = NULL;
    if (mpr_tensor_is_contiguous(t)) {
        src = mpr_tensor_retain(t);
    } else if (src_dev < 0) {
        src = mpr_tensor_contiguous(t);
    } else {
        src = mpr_tensor_empty_on(src_dev, t->dtype, t->ndim, t->shape);
        if (src && mpri_cuda_k_copy(src_dev, t->ndim, t->shape, t->dtype, mpr_tensor_data(src), src->strides,
                                    t->dtype, mpr_tensor_data(t), t->strides) != MPR_OK) {
            mpr_tensor_release(src);
            src = NULL;
        }
    }
    if (!src) return NULL;
    mpr_tensor_t *out = mpr_tensor_empty_on(device, t->dtype, t->ndim, t->shape);
    if (out && mpri_cuda_memcpy(mpr_tensor_data(out), device, mpr_tensor_data(src), src_dev,
                                mpr_tensor_nbytes(t)) != MPR_OK) {
        mpr_tensor_release(out);
        out = NULL;
    }
    mpr_tensor_release(src);
    return out;
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

static const mpri_op_def_t to_device_def = {.name = "to_device", .backward = to_device_backward, MPRI_OP_STATE(mpri_ctx_to_device_t)};
#endif

mpr_tensor_t *mpr_to_device(mpr_tensor_t *t, int device) {
    if (!t) return NULL;
    if (check_device("to_device", device) != MPR_OK) return NULL;
    if (t->storage->device == device) return mpri_result(mpr_tensor_retain(t));
#ifdef MPIRPC_HAVE_CUDA
    int src_dev = t->storage->device;
    mpr_tensor_t *out = copy_to(t, device);
    if (!out) return NULL;
    mpri_node_t *n = mpri_record(&to_device_def, 1, (mpr_tensor_t *[]){t}, out);
    if (n) MPRI_NODE_STATE(n, mpri_ctx_to_device_t)->src_device = src_dev;
    return mpri_result(out);
#else
    mpr_error_set(MPR_ERR_UNSUPPORTED, "to_device: tensor on device %d in a build without CUDA", t->storage->device);
    return NULL;
#endif
}
