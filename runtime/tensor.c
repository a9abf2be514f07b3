/* tensor.c — the tensor container: creation, refcounting, views on storages,
 * contiguity, and a contiguous copy for any strided CPU tensor.
 *
 * Invariants: a tensor's view (offset + strides * (shape-1)) always lies inside
 * its storage (checked when the view is made); refcounts are atomic so tensors
 * can be shared across the progress thread, the worker pool and user threads;
 * the live-tensor counter is exact (tests use it to detect leaks) but
 * inside a release batch, which takes its tensors off at its flush
 * (mpri_tensor_release_deferred; mpri_refcount.h: a last reference is
 * dropped without a locked instruction). A live
 * tensor carries MPRI_TENSOR_MAGIC; the last release poisons it (magic DEAD,
 * storage cleared) and frees it through the quarantine, and every public
 * entry checks the magic (mpri_misuse_abort naming the tensor otherwise).
 * refcount >= scope_refs always: a release that would break it is a caller
 * releasing a scope-owned result, reported the same way. Getters given NULL
 * set MPR_ERR_INVALID_ARG and return 0 / NULL / MPR_DTYPE_COUNT. */
#include "mpri_tensor.h"

#include "mpri_args.h"
#include "mpri_deferred.h"
#include "mpri_host_alloc.h"
#include "mpri_quarantine.h"
#include "mpri_refcount.h"
#include "mpri_small_alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_long live_tensors;
static void (*autograd_release_hook)(struct mpri_autograd_meta *meta);

static const char *const dtype_names[MPR_DTYPE_COUNT] = {"float32", "float64", "int64",
                                                         "int32", "uint8"};

size_t mpr_dtype_size(mpr_dtype_t dtype) {
    if ((int)dtype < 0 || dtype >= MPR_DTYPE_COUNT) return 0;
    return mpri_dtype_bytes(dtype);
}

const char *mpr_dtype_name(mpr_dtype_t dtype) {
    if ((int)dtype < 0 || dtype >= MPR_DTYPE_COUNT) return "?";
    return dtype_names[dtype];
}

void mpri_tensor_set_autograd_release_hook(void (*hook)(struct mpri_autograd_meta *meta)) {
    autograd_release_hook = hook;
}

/* Storages of at most this many bytes get their record and their bytes in
 * one allocation (record first, bytes 64-byte aligned right after it): the
 * small tensors an autograd step makes by the dozen (an 8x8 step: ~10)
 * pay one malloc and one free each instead of two. Larger ones keep
 * separate bytes from the host allocator, whose cache of blocks from
 * 64 KiB they need. */
#define STORAGE_INLINE_MAX ((size_t)16 << 10)
#define STORAGE_RECORD_BYTES ((sizeof(mpri_storage_t) + 63) & ~(size_t)63)

_Static_assert(sizeof(mpri_storage_t) <= 64, "a storage record fills one cache line (and STORAGE_RECORD_BYTES)");

/* The one block of an inline storage of `nbytes`: record, then the bytes. */
static size_t inline_storage_bytes(size_t nbytes) { return STORAGE_RECORD_BYTES + ((nbytes + 63) & ~(size_t)63); }

mpri_storage_t *mpri_storage_create(size_t nbytes) {
    mpri_storage_t *s;
    if (nbytes > 0 && nbytes <= STORAGE_INLINE_MAX) {
        s = mpri_small_alloc(inline_storage_bytes(nbytes));
        if (!s) return NULL;
        memset(s, 0, sizeof *s);
        s->data = (uint8_t *)s + STORAGE_RECORD_BYTES;
        s->bytes_inline = true;
    } else {
        if (!(s = mpri_small_calloc(sizeof *s))) return NULL;
        if (!(s->data = mpri_host_alloc(nbytes))) {
            mpri_small_free(s, sizeof *s);
            return NULL;
        }
    }
    s->nbytes = nbytes;
    s->device = -1;
    atomic_init(&s->refcount, 1);
    atomic_init(&s->version, 0);
    return s;
}

mpri_storage_t *mpri_storage_retain(mpri_storage_t *s) {
    if (s) atomic_fetch_add_explicit(&s->refcount, 1, memory_order_relaxed);
    return s;
}

/* Drop a storage reference; a block storage's last one drops a block
 * reference now, or adds it to `batch` (NULL: now). */
static void storage_release(mpri_storage_t *s, mpri_tensor_release_batch_t *batch) {
    if (!s || !mpri_refcount_drop(&s->refcount)) return;
    if (s->block) { /* bytes and record belong to a shared block (tensor_block.c) */
        if (!batch) {
            mpri_tensor_block_release(s->block);
        } else if (batch->block == s->block) {
            batch->block_refs++;
        } else {
            if (batch->block) mpri_tensor_block_release_many(batch->block, batch->block_refs);
            batch->block = s->block;
            batch->block_refs = 1;
        }
        return;
    }
    if (s->bytes_inline) {
        mpri_small_free(s, inline_storage_bytes(s->nbytes));
        return;
    }
    if (s->free_data)
        s->free_data(s->data, s->device);
    else
        mpri_host_free(s->data, s->nbytes);
    mpri_small_free(s, sizeof *s);
}

void mpri_storage_release(mpri_storage_t *s) { storage_release(s, NULL); }

mpr_err_t mpri_tensor_shape_error(const char *op, mpr_dtype_t dtype, int ndim, const int64_t *shape) {
    if ((int)dtype < 0 || dtype >= MPR_DTYPE_COUNT)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: invalid dtype %d", op, (int)dtype);
    if (ndim < 0 || ndim > MPR_MAX_DIMS)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: ndim %d outside [0, %d]", op, ndim,
                             MPR_MAX_DIMS);
    if (ndim > 0 && !shape)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: shape is NULL", op);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: negative size %lld in dim %d", op,
                                 (long long)shape[i], i);
    return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: shape too large", op);
}

static void contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
}

mpr_tensor_t *mpri_tensor_view(mpri_storage_t *storage, mpr_dtype_t dtype, int ndim,
                               const int64_t *shape, const int64_t *strides, int64_t offset) {
    int64_t numel;
    if (mpri_tensor_check_shape("view", dtype, ndim, shape, &numel) != MPR_OK) return NULL;
    if (!storage) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "view: storage is NULL");
        return NULL;
    }
    mpr_tensor_t *t = mpri_small_calloc(sizeof *t);
    if (!t) {
        mpr_error_set(MPR_ERR_NOMEM, "view: out of memory");
        return NULL;
    }
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    if (strides)
        for (int i = 0; i < ndim; i++) t->strides[i] = strides[i];
    else
        contiguous_strides(ndim, shape, t->strides);
    t->offset = offset;
    /* The furthest elements reached by the view must lie inside the storage. */
    if (numel > 0) {
        int64_t lo = offset, hi = offset;
        for (int i = 0; i < ndim; i++) {
            int64_t span = t->strides[i] * (shape[i] - 1);
            if (span < 0) lo += span; else hi += span;
        }
        size_t esz = mpr_dtype_size(dtype);
        if (lo < 0 || (uint64_t)(hi + 1) * esz > storage->nbytes) {
            mpri_small_free(t, sizeof *t);
            mpr_error_set(MPR_ERR_INVALID_ARG, "view: elements [%lld, %lld] outside storage of %zu bytes",
                          (long long)lo, (long long)hi, storage->nbytes);
            return NULL;
        }
    }
    t->storage = mpri_storage_retain(storage);
    t->magic = MPRI_TENSOR_MAGIC;
    atomic_init(&t->scope_refs, 0);
    atomic_init(&t->refcount, 1);
    atomic_fetch_add_explicit(&live_tensors, 1, memory_order_relaxed);
    return t;
}

mpr_tensor_t *mpri_tensor_init_whole(mpr_tensor_t *t, bool in_block, mpri_storage_t *storage,
                                     mpr_dtype_t dtype, int ndim, const int64_t *shape) {
    t->dtype = dtype;
    t->ndim = ndim;
    t->in_block = in_block;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    contiguous_strides(ndim, shape, t->strides);
    for (int i = ndim; i < MPR_MAX_DIMS; i++) t->shape[i] = t->strides[i] = 0; /* as a zeroed struct's */
    t->offset = 0;
    t->storage = storage;
    t->autograd = NULL;
    t->magic = MPRI_TENSOR_MAGIC;
    atomic_init(&t->scope_refs, 0);
    atomic_init(&t->refcount, 1);
    return t;
}

void mpri_tensor_count_live(long n) { atomic_fetch_add_explicit(&live_tensors, n, memory_order_relaxed); }

mpr_tensor_t *mpr_tensor_empty(mpr_dtype_t dtype, int ndim, const int64_t *shape) {
    int64_t numel;
    if (ndim > 0) MPRI_ARG_NONNULL_OR(shape, NULL);
    if (mpri_tensor_check_shape("empty", dtype, ndim, shape, &numel) != MPR_OK) return NULL;
    mpri_storage_t *s = mpri_storage_create((size_t)numel * mpr_dtype_size(dtype));
    mpr_tensor_t *t = s ? mpri_small_alloc(sizeof *t) : NULL;
    if (!t) {
        mpri_storage_release(s);
        mpr_error_set(MPR_ERR_NOMEM, "empty: cannot allocate %lld elements", (long long)numel);
        return NULL;
    }
    /* The whole of a storage made for this shape: nothing to check against
     * it, and the storage's one reference passes to the tensor. */
    mpri_tensor_init_whole(t, false, s, dtype, ndim, shape);
    mpri_tensor_count_live(1);
    return t;
}

/* "float32 [2, 3]" for messages. */
static const char *describe(const mpr_tensor_t *t, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "%s [", mpr_dtype_name(t->dtype));
    for (int i = 0; i < t->ndim && i < MPR_MAX_DIMS && n > 0 && (size_t)n < cap; i++)
        n += snprintf(buf + n, cap - (size_t)n, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (n > 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, "]");
    return buf;
}

void mpri_tensor_check_live(const mpr_tensor_t *t, const char *what) {
    if (t->magic == MPRI_TENSOR_MAGIC) return;
    char d[128];
    if (t->magic == MPRI_TENSOR_DEAD)
        mpri_misuse_abort("%s: tensor %p (%s) used after its last mpr_tensor_release (released twice, "
                          "or used after release; a result owned by a scope is released by "
                          "mpr_scope_end, not by you)",
                          what, (const void *)t, describe(t, d, sizeof d));
    mpri_misuse_abort("%s: %p is not a live mpr_tensor_t (freed or corrupt memory)", what, (const void *)t);
}

void mpri_tensor_scope_acquire(mpr_tensor_t *t) { atomic_fetch_add(&t->scope_refs, 1); }

void mpri_tensor_scope_release(mpr_tensor_t *t) {
    mpri_tensor_check_live(t, "mpr_scope_end");
    atomic_fetch_sub(&t->scope_refs, 1);
    mpr_tensor_release(t);
}

mpr_tensor_t *mpr_tensor_retain(mpr_tensor_t *t) {
    MPRI_ARG_NONNULL_OR(t, NULL);
    mpri_tensor_check_live(t, __func__);
    atomic_fetch_add_explicit(&t->refcount, 1, memory_order_relaxed);
    return t;
}

/* Drop one reference to `t`; the last one frees it. With a batch, the
 * live-tensor count and a block storage's block reference are dropped at
 * mpri_tensor_release_flush instead of here. */
static void tensor_release(mpr_tensor_t *t, mpri_tensor_release_batch_t *batch) {
    mpri_tensor_check_live(t, "mpr_tensor_release");
    /* Read before dropping our reference: once it is dropped, another
     * thread's release may free `t` at any moment. */
    long scope_refs = atomic_load(&t->scope_refs);
    long left = mpri_refcount_drop_n(&t->refcount, 1);
    if (left < scope_refs) {
        char d[128];
        mpri_misuse_abort("mpr_tensor_release: tensor %p (%s) is owned by an open scope: results of ops "
                          "made while a scope is open (mpr_scope_begin) are released by mpr_scope_end; "
                          "do not release them yourself (mpr_scope_keep() gives you a reference to release)",
                          (void *)t, describe(t, d, sizeof d));
    }
    if (left != 0) return;
    if (t->autograd && autograd_release_hook) autograd_release_hook(t->autograd);
    mpri_storage_t *s = t->storage;
    if (batch)
        batch->live_tensors++;
    else
        atomic_fetch_sub_explicit(&live_tensors, 1, memory_order_relaxed);
    t->magic = MPRI_TENSOR_DEAD;
    t->storage = NULL;
    t->autograd = NULL;
    bool in_block = t->in_block;
    if (!in_block) {
        if (MPRI_DEBUG_CHECKS)
            mpri_quarantine_free(t); /* a use after release still meets a dead magic */
        else
            mpri_small_free(t, sizeof *t);
    }
    /* A struct in a tensor block goes with the block, which its storage's
     * last release frees (with a batch: at its flush): `t` is not touched
     * after this. */
    storage_release(s, batch);
}

void mpr_tensor_release(mpr_tensor_t *t) {
    if (t) tensor_release(t, NULL);
}

void mpri_tensor_release_deferred(mpr_tensor_t *t, mpri_tensor_release_batch_t *batch) {
    if (t) tensor_release(t, batch);
}

void mpri_tensor_release_flush(mpri_tensor_release_batch_t *batch) {
    if (batch->live_tensors) atomic_fetch_sub_explicit(&live_tensors, batch->live_tensors, memory_order_relaxed);
    if (batch->block) mpri_tensor_block_release_many(batch->block, batch->block_refs);
    batch->live_tensors = 0;
    batch->block = NULL;
    batch->block_refs = 0;
}

static _Atomic(const mpri_tensor_grad_flag_hooks_t *) grad_flag_hooks;

void mpri_tensor_set_grad_flag_hooks(const mpri_tensor_grad_flag_hooks_t *hooks) {
    atomic_store(&grad_flag_hooks, hooks);
}

bool mpri_tensor_wire_requires_grad(const mpr_tensor_t *t) {
    const mpri_tensor_grad_flag_hooks_t *h = atomic_load(&grad_flag_hooks);
    return h && t->autograd && h->requires_grad(t);
}

mpr_err_t mpri_tensor_wire_set_requires_grad(mpr_tensor_t *t) {
    const mpri_tensor_grad_flag_hooks_t *h = atomic_load(&grad_flag_hooks);
    return h ? h->set_requires_grad(t) : MPR_OK;
}

mpr_tensor_t *mpri_tensor_wire_alias(mpr_tensor_t *t, bool requires_grad) {
    mpr_tensor_t *a = mpri_tensor_view(t->storage, t->dtype, t->ndim, t->shape, NULL, t->offset);
    if (a && requires_grad && mpri_tensor_wire_set_requires_grad(a) != MPR_OK) {
        mpr_tensor_release(a);
        return NULL;
    }
    return a;
}

static _Atomic(const mpri_tensor_device_hooks_t *) device_hooks;

void mpri_tensor_set_device_hooks(const mpri_tensor_device_hooks_t *hooks) { atomic_store(&device_hooks, hooks); }

mpr_tensor_t *mpri_tensor_wire_to_host(mpr_tensor_t *t) {
    const mpri_tensor_device_hooks_t *h = atomic_load(&device_hooks);
    if (!h) {
        mpr_error_set(MPR_ERR_UNSUPPORTED, "send: tensor on cuda:%d and no device support installed",
                      t->storage->device);
        return NULL;
    }
    return h->to_host(t);
}

mpr_tensor_t *mpri_tensor_wire_to_device(mpr_tensor_t *t, int device) {
    const mpri_tensor_device_hooks_t *h = atomic_load(&device_hooks);
    if (!h) {
        mpr_error_set(MPR_ERR_UNSUPPORTED,
                      "receive: a tensor sent from cuda:%d, and this worker has no CUDA support (built "
                      "without -DMPIRPC_CUDA=ON)",
                      device);
        return NULL;
    }
    return h->to_device(t, device);
}

int64_t mpr_tensor_live_count(void) {
    mpri_deferred_flush(); /* releases put off to an idle moment are not live objects */
    return atomic_load(&live_tensors);
}

/* Entry of a getter: NULL sets the error and returns `ret`; a dead tensor aborts. */
#define TENSOR_GETTER(t, ret)                                                 \
    do {                                                                      \
        MPRI_ARG_NONNULL_OR(t, ret);                                          \
        mpri_tensor_check_live(t, __func__);                                  \
    } while (0)

mpr_dtype_t mpr_tensor_dtype(const mpr_tensor_t *t) {
    TENSOR_GETTER(t, MPR_DTYPE_COUNT);
    return t->dtype;
}
int mpr_tensor_ndim(const mpr_tensor_t *t) {
    TENSOR_GETTER(t, 0);
    return t->ndim;
}
const int64_t *mpr_tensor_shape(const mpr_tensor_t *t) {
    TENSOR_GETTER(t, NULL);
    return t->shape;
}
const int64_t *mpr_tensor_strides(const mpr_tensor_t *t) {
    TENSOR_GETTER(t, NULL);
    return t->strides;
}
int mpr_tensor_device(const mpr_tensor_t *t) {
    TENSOR_GETTER(t, -1);
    return t->storage->device;
}

int64_t mpr_tensor_numel(const mpr_tensor_t *t) {
    TENSOR_GETTER(t, 0);
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t mpr_tensor_nbytes(const mpr_tensor_t *t) {
    TENSOR_GETTER(t, 0);
    return (size_t)mpr_tensor_numel(t) * mpr_dtype_size(t->dtype);
}

bool mpr_tensor_is_contiguous(const mpr_tensor_t *t) {
    TENSOR_GETTER(t, false);
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0) return true; /* no elements: any strides describe it */
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != expect) return false;
        expect *= t->shape[i];
    }
    return true;
}

void *mpr_tensor_data(const mpr_tensor_t *t) {
    TENSOR_GETTER(t, NULL);
    return (char *)t->storage->data + t->offset * (int64_t)mpr_dtype_size(t->dtype);
}

/* Copy a strided CPU tensor element by element into contiguous `dst`. */
static void copy_strided(const mpr_tensor_t *src, char *dst) {
    size_t esz = mpr_dtype_size(src->dtype);
    int64_t numel = mpr_tensor_numel(src);
    int64_t idx[MPR_MAX_DIMS] = {0};
    const char *base = (const char *)src->storage->data;
    for (int64_t n = 0; n < numel; n++) {
        int64_t off = src->offset;
        for (int d = 0; d < src->ndim; d++) off += idx[d] * src->strides[d];
        memcpy(dst + (size_t)n * esz, base + off * (int64_t)esz, esz);
        for (int d = src->ndim - 1; d >= 0; d--) {
            if (++idx[d] < src->shape[d]) break;
            idx[d] = 0;
        }
    }
}

mpr_tensor_t *mpr_tensor_contiguous(mpr_tensor_t *t) {
    TENSOR_GETTER(t, NULL);
    if (mpr_tensor_is_contiguous(t)) return mpr_tensor_retain(t);
    if (t->storage->device >= 0) {
        mpr_error_set(MPR_ERR_UNSUPPORTED, "contiguous: strided copy of a CUDA tensor is done by the autograd layer");
        return NULL;
    }
    mpr_tensor_t *out = mpr_tensor_empty(t->dtype, t->ndim, t->shape);
    if (!out) return NULL;
    copy_strided(t, mpr_tensor_data(out));
    return out;
}
