/* tensor_block.c — the bytes and storage records of many small tensors in
 * one allocation (see mpri_tensor_block_t in mpri_tensor.h).
 *
 * A received batch of small tensors is written by one MPI receive into one
 * block, instead of three allocations (tensor, storage, bytes) per tensor.
 * Layout, in one allocation (mpri_host_alloc): the block header with its storage records,
 * the tensor structs, then the data, 64-byte aligned.
 *
 * Invariants: the block's refcount is the number of live storages carved
 * from it plus one while its creator holds it; carved tensors join the
 * live-tensor count together when the creator lets go of the block
 * (mpri_tensor_block_carved), before any of them can be released; each storage record and
 * tensor struct is initialized once (by carve) and never freed on its own:
 * a carved tensor holds its storage, whose last release drops one block
 * reference (mpri_storage_release), and the block is freed with its last
 * reference; a released carved tensor is poisoned (as any tensor) before it
 * drops its storage. Carved slices lie inside the data area (asserted). */
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_assert.h"
#include "mpri_host_alloc.h"
#include "mpri_refcount.h"
#include "mpri_tensor.h"

struct mpri_tensor_block {
    atomic_long refcount;
    size_t total_bytes; /* of the allocation (mpri_host_free needs it) */
    size_t data_bytes;
    uint8_t *data;
    mpr_tensor_t *tensors; /* nstorages structs, after the storage records */
    uint32_t nstorages;
    uint32_t carved; /* tensors carved so far (creator only, until mpri_tensor_block_carved) */
    mpri_storage_t storages[];
};

#define BLOCK_ALIGN 64

static size_t round_up(size_t n, size_t a) { return (n + a - 1) & ~(a - 1); }

mpri_tensor_block_t *mpri_tensor_block_create(size_t data_bytes, uint32_t nstorages) {
    size_t tensors_at = round_up(sizeof(mpri_tensor_block_t) + (size_t)nstorages * sizeof(mpri_storage_t),
                                 _Alignof(mpr_tensor_t));
    size_t data_at = round_up(tensors_at + (size_t)nstorages * sizeof(mpr_tensor_t), BLOCK_ALIGN);
    size_t total = round_up(data_at + data_bytes, BLOCK_ALIGN);
    /* From the host allocator: a block of 64 KiB or more comes back warm
     * from its cache (a fresh one pays a page fault per 4 KiB inside the
     * receive that fills it). */
    mpri_tensor_block_t *b = mpri_host_alloc(total);
    if (!b) {
        mpr_error_set(MPR_ERR_NOMEM, "out of memory for a block of %u tensors (%zu bytes)", nstorages,
                      data_bytes);
        return NULL;
    }
    atomic_init(&b->refcount, 1);
    b->total_bytes = total;
    b->data_bytes = data_bytes;
    b->data = (uint8_t *)b + data_at;
    b->tensors = (mpr_tensor_t *)((uint8_t *)b + tensors_at);
    b->nstorages = nstorages;
    b->carved = 0;
    return b;
}

mpr_tensor_t *mpri_tensor_block_carve(mpri_tensor_block_t *b, uint32_t index, size_t offset,
                                      mpr_dtype_t dtype, int ndim, const int64_t *shape) {
    size_t nbytes = mpri_dtype_bytes(dtype);
    for (int i = 0; i < ndim; i++) nbytes *= (size_t)shape[i];
    MPRI_ASSERT(index < b->nstorages && offset <= b->data_bytes && nbytes <= b->data_bytes - offset,
                "a carved tensor lies inside its block");
    mpri_storage_t *s = &b->storages[index];
    memset(s, 0, sizeof *s);
    atomic_init(&s->refcount, 1); /* the tensor's */
    atomic_init(&s->version, 0);
    s->data = b->data + offset;
    s->nbytes = nbytes;
    s->device = -1;
    s->block = b;
    /* Carving happens on the creating thread before any carved tensor is
     * shared (mpri_tensor.h): no other thread touches the count yet. */
    atomic_store_explicit(&b->refcount, atomic_load_explicit(&b->refcount, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    b->carved++;
    return mpri_tensor_init_whole(&b->tensors[index], true, s, dtype, ndim, shape);
}

void mpri_tensor_block_carved(mpri_tensor_block_t *b) {
    MPRI_ASSERT(b->carved <= b->nstorages, "each storage record of a block is carved at most once");
    if (b->carved) mpri_tensor_count_live(b->carved);
    mpri_tensor_block_release(b);
}
void mpri_tensor_block_release_many(mpri_tensor_block_t *b, long n) {
    if (b && mpri_refcount_drop_n(&b->refcount, n) == 0) mpri_host_free(b, b->total_bytes);
}

void mpri_tensor_block_release(mpri_tensor_block_t *b) { mpri_tensor_block_release_many(b, 1); }
