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
struct mpri_tensor_block;

typedef struct mpri_storage {
    atomic_long refcount;
    void *data;
    size_t nbytes;
    int device;             /* -1 CPU, N cuda:N */
    bool bytes_inline;      /* `data` lies in this record's own allocation, right after it (tensor.c) */
    atomic_ulong version;   /* bumped by every in-place write */
    atomic_long saved_refs; /* graph nodes' saved aliases of it, leaves requiring grad left out
                             * (autograd/node.c: mpr_autograd_saved_bytes) */
    void (*free_data)(void *data, int device); /* NULL: free() */
    /* Non-NULL: this storage and its bytes live inside a block shared with
     * other storages (tensor_block.c); releasing it drops the block. */
    struct mpri_tensor_block *block;
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
    /* This struct lives inside its storage's tensor block (tensor_block.c),
     * not in an allocation of its own: freed with the block. */
    bool in_block;
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

/* A block holding the bytes, the storage records and the tensor structs of
 * up to `nstorages` small CPU tensors in one allocation (what a received
 * batch of small tensors is written into: tensor_block.c). Each tensor
 * carved from it has a storage of its own (own refcount, own version
 * counter) whose bytes are a slice of the block; the block is freed when its
 * last storage is released, so any one tensor (or a view of it) keeps the
 * whole block (at most MPRI_BATCH_MAX_BYTES of data) alive. The block starts
 * with one reference, its creator's, dropped by mpri_tensor_block_carved
 * once carving is done. */
typedef struct mpri_tensor_block mpri_tensor_block_t;
/* NULL (error set) when out of memory. Data starts 64-byte aligned. */
mpri_tensor_block_t *mpri_tensor_block_create(size_t data_bytes, uint32_t nstorages);
/* A contiguous tensor whose bytes are [offset, offset + its nbytes) of the
 * block, its storage being record `index` (each index carved once). All
 * carving is done by the block's creator before it shares or releases any
 * carved tensor (the block's count is then bumped without an atomic
 * read-modify-write), and before mpri_tensor_block_carved. The
 * caller checks the shape (mpri_tensor_check_shape), that the slice fits the
 * block and that `offset` is a multiple of the dtype size. NULL on failure. */
mpr_tensor_t *mpri_tensor_block_carve(mpri_tensor_block_t *b, uint32_t index, size_t offset,
                                      mpr_dtype_t dtype, int ndim, const int64_t *shape);
/* Carving is done: the carved tensors join the live-tensor count, all at
 * once (one atomic per block, not per tensor), and the creator's reference
 * is dropped. Call it once, before sharing or releasing a carved tensor. */
void mpri_tensor_block_carved(mpri_tensor_block_t *b);
void mpri_tensor_block_release(mpri_tensor_block_t *b);
/* Drop `n` >= 1 references to `b` at once (the block's storages released by
 * one batch: mpri_tensor_release_flush). */
void mpri_tensor_block_release_many(mpri_tensor_block_t *b, long n);

/* Releases of many tensors by one thread (a dying list's items), with the
 * shared counters dropped once per batch instead of once per tensor: the
 * live-tensor count, and the block reference of a run of tensors carved
 * from the same block. Start from {0}, pass each tensor to
 * mpri_tensor_release_deferred (it does what mpr_tensor_release does but
 * for those two drops), end with mpri_tensor_release_flush. Until the
 * flush a block whose last storage died stays allocated, and
 * mpr_tensor_live_count counts the released tensors: flush before anything
 * that reads it. */
typedef struct {
    long live_tensors;          /* released tensors not yet taken off the count */
    mpri_tensor_block_t *block; /* the run's block, NULL for none */
    long block_refs;            /* references to `block` to drop */
} mpri_tensor_release_batch_t;
void mpri_tensor_release_deferred(mpr_tensor_t *t, mpri_tensor_release_batch_t *batch);
void mpri_tensor_release_flush(mpri_tensor_release_batch_t *batch);
/* Add `n` tensors made by mpri_tensor_init_whole to the live-tensor count. */
void mpri_tensor_count_live(long n);

/* A tensor viewing `storage` (a new reference is taken). strides NULL means
 * contiguous row-major. Checks that the view stays inside the storage. */
mpr_tensor_t *mpri_tensor_view(mpri_storage_t *storage, mpr_dtype_t dtype, int ndim,
                               const int64_t *shape, const int64_t *strides, int64_t offset);

/* Make `t` (any memory, in a tensor block when `in_block`; every field is
 * set, unused dims to 0) a live contiguous tensor over the whole of
 * `storage`, taking over the caller's reference to it. dtype/ndim/shape are
 * already checked and storage->nbytes is their size. It is not counted
 * live: the caller adds it with mpri_tensor_count_live (tensor_block.c does,
 * once per block; mpr_tensor_empty per tensor). */
mpr_tensor_t *mpri_tensor_init_whole(mpr_tensor_t *t, bool in_block, mpri_storage_t *storage,
                                     mpr_dtype_t dtype, int ndim, const int64_t *shape);

/* Bytes of one element of a valid dtype (inline: the per-tensor paths of a
 * message with thousands of tensors; mpr_dtype_size is the checked form). */
static inline size_t mpri_dtype_bytes(mpr_dtype_t dtype) {
    static const unsigned char sizes[MPR_DTYPE_COUNT] = {4, 8, 8, 4, 1};
    return sizes[dtype];
}

/* The error of a failed mpri_tensor_check_shape (out of line: its text). */
mpr_err_t mpri_tensor_shape_error(const char *op, mpr_dtype_t dtype, int ndim, const int64_t *shape);

/* Validates dtype/ndim/shape; returns MPR_OK or MPR_ERR_INVALID_ARG with detail
 * naming `op`. Both the element count and the product of the dims with 0 taken
 * as 1 (the largest contiguous stride) must stay within INT64_MAX / 16. On
 * success *numel_out holds the element count. Inline: decoding a message
 * checks every descriptor's shape. */
static inline mpr_err_t mpri_tensor_check_shape(const char *op, mpr_dtype_t dtype, int ndim,
                                                const int64_t *shape, int64_t *numel_out) {
    *numel_out = 0;
    if ((int)dtype < 0 || dtype >= MPR_DTYPE_COUNT || ndim < 0 || ndim > MPR_MAX_DIMS || (ndim > 0 && !shape))
        return mpri_tensor_shape_error(op, dtype, ndim, shape);
    /* Contiguous strides are products of the dims with 0 taken as 1, so bound
     * that product (not only numel, which a 0 dim makes 0): an empty shape such
     * as [0, 2^40, 2^40] would otherwise overflow the strides. */
    int64_t numel = 1, stride_span = 1;
    for (int i = 0; i < ndim; i++) {
        int64_t d = shape[i] > 0 ? shape[i] : 1;
        if (shape[i] < 0 || __builtin_mul_overflow(stride_span, d, &stride_span) ||
            stride_span > INT64_MAX / 16)
            return mpri_tensor_shape_error(op, dtype, ndim, shape);
        numel *= shape[i];
    }
    *numel_out = numel;
    return MPR_OK;
}

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
