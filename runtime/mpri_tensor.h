/* mpri_tensor.h — internal layout of tensors and storages (not installed).
 *
 * A tensor is a view (dtype, shape, strides, offset in elements) on a
 * refcounted storage. The storage carries a version counter that in-place ops
 * bump so autograd can detect modification of tensors saved for backward.
 * The autograd layer attaches its per-tensor metadata through `autograd` and
 * registers a release hook (the runtime never looks inside it). */
#ifndef MPRI_TENSOR_H
#define MPRI_TENSOR_H

#ifdef __cplusplus
/* The CUDA kernel files (C++) see this layout through mpri_kernels.h but never
 * touch the counters: the names only have to exist with the C11 types' size
 * and alignment. <stdatomic.h> has no C++17 spelling (GCC 13's is C-only). */
#include <atomic>
typedef std::atomic<long> atomic_long;
typedef std::atomic<unsigned long> atomic_ulong;
#else
#include <stdatomic.h>
#endif

#include "mpirpc/tensor.h"

struct mpri_autograd_meta;

typedef struct mpri_storage {
    atomic_long refcount;
    void *data;
    size_t nbytes;
    int device;             /* -1 CPU, N cuda:N */
    atomic_ulong version;   /* bumped by every in-place write */
    void (*free_data)(void *data, int device); /* NULL: free() */
} mpri_storage_t;

#define MPRI_TENSOR_MAGIC 0x54454e53u /* "TENS": a live tensor */
#define MPRI_TENSOR_DEAD 0x64656164u  /* "dead": released (see mpri_quarantine.h) */

struct mpr_tensor {
    atomic_long refcount;
    atomic_long scope_refs; /* how many of the references are held by scopes (autograd/scope.c) */
    /* MPRI_TENSOR_MAGIC while alive; checked by every public entry. Not in the
     * first 16 bytes, which free() may overwrite with its own links. */
    uint32_t magic;
    mpr_dtype_t dtype;
    int ndim;
    int64_t shape[MPR_MAX_DIMS];
    int64_t strides[MPR_MAX_DIMS]; /* in elements */
    int64_t offset;                /* in elements */
    mpri_storage_t *storage;
    struct mpri_autograd_meta *autograd; /* owned by the autograd layer */
};

/* Abort with a message naming `t` unless it is a live tensor (use after
 * release, double release, not a tensor). `what` names the caller. */
void mpri_tensor_check_live(const mpr_tensor_t *t, const char *what);

/* Scopes (autograd/scope.c) take and drop their references through these, so
 * that mpr_tensor_release can tell when a caller releases a reference a scope
 * owns (it aborts naming the tensor). */
void mpri_tensor_scope_acquire(mpr_tensor_t *t);
void mpri_tensor_scope_release(mpr_tensor_t *t);

/* New storage of `nbytes` CPU bytes (64-byte aligned), refcount 1. */
mpri_storage_t *mpri_storage_create(size_t nbytes);
mpri_storage_t *mpri_storage_retain(mpri_storage_t *s);
void mpri_storage_release(mpri_storage_t *s);

/* A tensor viewing `storage` (a new reference is taken). strides NULL means
 * contiguous row-major. Checks that the view stays inside the storage. */
mpr_tensor_t *mpri_tensor_view(mpri_storage_t *storage, mpr_dtype_t dtype, int ndim,
                               const int64_t *shape, const int64_t *strides, int64_t offset);

/* Validates dtype/ndim/shape; returns MPR_OK or MPR_ERR_INVALID_ARG with detail
 * naming `op`. Both the element count and the product of the dims with 0 taken
 * as 1 (the largest contiguous stride) must stay within INT64_MAX / 16. On
 * success *numel_out holds the element count. */
mpr_err_t mpri_tensor_check_shape(const char *op, mpr_dtype_t dtype, int ndim,
                                  const int64_t *shape, int64_t *numel_out);

/* Hook the autograd layer installs to free `autograd` when a tensor dies. */
void mpri_tensor_set_autograd_release_hook(void (*hook)(struct mpri_autograd_meta *meta));

/* The requires_grad flag as the wire carries it (value_codec.c: bit 7 of
 * each tensor descriptor's dtype byte; transport.c: self-calls). The
 * autograd layer installs the two functions before mpr_init; without them
 * no tensor requires grad and a received flag is ignored. */
typedef struct mpri_tensor_grad_flag_hooks {
    bool (*requires_grad)(const mpr_tensor_t *t);
    mpr_err_t (*set_requires_grad)(mpr_tensor_t *t); /* make `t` a leaf that requires grad */
} mpri_tensor_grad_flag_hooks_t;
void mpri_tensor_set_grad_flag_hooks(const mpri_tensor_grad_flag_hooks_t *hooks);
bool mpri_tensor_wire_requires_grad(const mpr_tensor_t *t);
mpr_err_t mpri_tensor_wire_set_requires_grad(mpr_tensor_t *t);
/* A new tensor object viewing the same bytes as contiguous `t` (no autograd
 * state), carrying `t`'s requires_grad flag: what a self-call's callee
 * receives, as a remote callee would receive a copy. NULL on failure. */
mpr_tensor_t *mpri_tensor_wire_alias(mpr_tensor_t *t, bool requires_grad);

/* Copies between the host and a device for the wire (CUDA tensors travel
 * through host memory: MPI here is not device-aware). The device code lives
 * above the runtime; the autograd layer installs the two functions at init.
 * Both return a new contiguous tensor without autograd state, or NULL with
 * the error set (MPR_ERR_UNSUPPORTED when no hooks are installed: a build or
 * a process without device support). */
typedef struct mpri_tensor_device_hooks {
    mpr_tensor_t *(*to_host)(mpr_tensor_t *t);
    mpr_tensor_t *(*to_device)(mpr_tensor_t *t, int device);
} mpri_tensor_device_hooks_t;
void mpri_tensor_set_device_hooks(const mpri_tensor_device_hooks_t *hooks);
mpr_tensor_t *mpri_tensor_wire_to_host(mpr_tensor_t *t);
mpr_tensor_t *mpri_tensor_wire_to_device(mpr_tensor_t *t, int device);

#endif
