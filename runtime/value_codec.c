/* value_codec.c — encoding and bounds-checked decoding of values, and of
 * the descriptors of the tensors they name.
 *
 * Wire form of a value (host byte order; mpri_buf_t): one kind byte, then
 *   none: nothing; bool: u8 (0 or 1); int: i64; double: f64;
 *   string/bytes: u32 length + bytes (a string has no NUL byte);
 *   tensor: u32 index into the message's tensor list;
 *   worker: i32 rank + u32 length + name; list: u32 count + items;
 *   rref/object: whatever the kind's registered opaque hooks write (an object
 *   without an encode hook cannot be sent).
 * Tensor descriptors (mpri_tensor_descs_encode/_decode), one per list entry:
 * u8 dtype with bit 7 (MPRI_DESC_REQUIRES_GRAD) set when the tensor requires
 * grad (the receiver's copy is a leaf that requires grad) and bit 6
 * (MPRI_DESC_ON_DEVICE) when it was on a CUDA device, u8 ndim, then for a
 * device tensor a u8 device index, then ndim i64 sizes; the data travels
 * separately (mpri_tensor_batches.h), through host memory for device tensors
 * (the list holds a host copy; the receiver copies it to the same device
 * index when the value is decoded: mpri_tensor_placement_apply).
 *
 * Encoding: the tensor list de-duplicates by object (a linear scan up to 16
 * entries, then a pointer hash index), so the same tensor named twice is sent
 * once and decoded as one shared tensor; it holds a contiguous version of
 * each (a copy only when the tensor is not contiguous, a host copy for a
 * device tensor) and refuses tensors over MPRI_MAX_TENSOR_BYTES, more than
 * MPRI_MAX_TENSORS_PER_MESSAGE tensors and more than
 * MPRI_MAX_MESSAGE_TENSOR_BYTES in all. mpri_value_encode brackets the walk
 * with the RRef kind's encode_begin/encode_end hooks, so a failed encode
 * undoes the forks its RRefs recorded; a failed buffer growth is reported
 * once at the end as MPR_ERR_NOMEM.
 *
 * Decoding a list gives its tensor items' values one slab (value.c) made
 * at the first tensor item, so a list of thousands of parameters costs one
 * allocation for its values (the tensors themselves come in blocks per
 * batch: tensor_block.c).
 *
 * Invariants: decoding never reads past the buffer, never recurses deeper
 * than MPRI_MAX_VALUE_DEPTH, never allocates more list slots than bytes
 * remain (nor more slab values than tensor items could remain, or than the
 * message has tensors), and rejects unknown kinds and out-of-range tensor indices;
 * descriptors are all validated (and their total checked against the
 * message limit) before any tensor storage is allocated; on any failure
 * everything decoded so far is released and the opaque values not reached
 * are settled (the kind's `settle` hook: an RRef's fork is undone), walking
 * the bytes again without allocating. */
#include "mpri_codec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_error.h"
#include "mpri_tensor.h"
#include "mpri_tensor_batches.h"
#include "mpri_wire.h"

void mpri_tensor_list_init(mpri_tensor_list_t *l) {
    l->items = l->inline_items;
    l->orig = l->inline_orig;
    l->spans = l->inline_spans;
    l->len = 0;
    l->cap = MPRI_TENSOR_LIST_INLINE;
    l->total_bytes = 0;
    l->slots = NULL;
    l->nslots = 0;
}

static bool list_inline(const mpri_tensor_list_t *l) { return l->items == l->inline_items; }

void mpri_tensor_list_move(mpri_tensor_list_t *dst, mpri_tensor_list_t *src) {
    *dst = *src;
    if (list_inline(src)) { /* the inline entries came with the copy: point at dst's */
        dst->items = dst->inline_items;
        dst->orig = dst->inline_orig;
        dst->spans = dst->inline_spans;
    }
    mpri_tensor_list_init(src);
}

void mpri_tensor_list_fini(mpri_tensor_list_t *l) {
    /* The shared counters (live tensors, a block's references) dropped once
     * per run, not once per tensor: a sent list of thousands. */
    mpri_tensor_release_batch_t batch = {0};
    for (uint32_t i = 0; i < l->len; i++) mpri_tensor_release_deferred(l->items[i], &batch);
    mpri_tensor_release_flush(&batch);
    if (!list_inline(l)) {
        free(l->items);
        free(l->orig);
        free(l->spans);
    }
    free(l->slots);
    mpri_tensor_list_init(l);
}

/* De-duplication of the tensors a value names: a linear scan for short lists,
 * a pointer hash index beyond (a value of 65536 tensors must not cost 2^31
 * comparisons). */
#define LINEAR_SCAN_MAX 16

static uint32_t slot_of(const mpr_tensor_t *t, uint32_t nslots) {
    uint64_t h = (uint64_t)(uintptr_t)t * 0x9e3779b97f4a7c15ull;
    return (uint32_t)(h >> 32) & (nslots - 1);
}

/* mpr_tensor_is_contiguous without its entry checks. */
static bool contiguous(const mpr_tensor_t *t) {
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] == 0) return true;
        if (t->shape[i] != 1 && t->strides[i] != expect) return false;
        expect *= t->shape[i];
    }
    return true;
}

/* Position of `t` in the list, or -1. */
static int64_t tensor_list_find(const mpri_tensor_list_t *l, const mpr_tensor_t *t) {
    if (!l->nslots) {
        for (uint32_t i = 0; i < l->len; i++)
            if (l->orig[i] == t) return i;
        return -1;
    }
    for (uint32_t s = slot_of(t, l->nslots);; s = (s + 1) & (l->nslots - 1)) {
        if (!l->slots[s]) return -1;
        if (l->orig[l->slots[s] - 1] == t) return l->slots[s] - 1;
    }
}

/* Make room in the index for `more` more entries (built once the list
 * outgrows the linear scan; grown by doubling to stay at most half full). */
static mpr_err_t tensor_list_reserve_index(mpri_tensor_list_t *l, uint32_t more) {
    uint64_t want = (uint64_t)l->len + more;
    if (want <= LINEAR_SCAN_MAX || want * 2 < l->nslots) return MPR_OK;
    uint32_t nslots = l->nslots ? l->nslots * 2 : 64;
    while ((uint64_t)nslots <= want * 2) nslots *= 2;
    uint32_t *slots = calloc(nslots, sizeof *slots);
    if (!slots) return mpr_error_set(MPR_ERR_NOMEM, "encode: out of memory");
    for (uint32_t i = 0; i < l->len; i++) {
        uint32_t s = slot_of(l->orig[i], nslots);
        while (slots[s]) s = (s + 1) & (nslots - 1);
        slots[s] = i + 1;
    }
    free(l->slots);
    l->slots = slots;
    l->nslots = nslots;
    return MPR_OK;
}

/* The list's arrays to `cap` entries (cap > l->cap); on failure the list
 * is unchanged but for an array that already grew (still valid). */
static mpr_err_t tensor_list_grow(mpri_tensor_list_t *l, uint32_t cap) {
    if (list_inline(l)) { /* off the inline entries: to the heap, all three at once */
        mpr_tensor_t **items = malloc(cap * sizeof *items);
        const mpr_tensor_t **orig = malloc(cap * sizeof *orig);
        mpri_tensor_span_t *spans = malloc(cap * sizeof *spans);
        if (!items || !orig || !spans) {
            free(items);
            free(orig);
            free(spans);
            return mpr_error_set(MPR_ERR_NOMEM, "encode: out of memory");
        }
        memcpy(items, l->items, l->len * sizeof *items);
        memcpy(orig, l->orig, l->len * sizeof *orig);
        memcpy(spans, l->spans, l->len * sizeof *spans);
        l->items = items;
        l->orig = orig;
        l->spans = spans;
        l->cap = cap;
        return MPR_OK;
    }
    mpr_tensor_t **items = realloc(l->items, cap * sizeof *items);
    if (!items) return mpr_error_set(MPR_ERR_NOMEM, "encode: out of memory");
    l->items = items;
    const mpr_tensor_t **orig = realloc(l->orig, cap * sizeof *orig);
    if (!orig) return mpr_error_set(MPR_ERR_NOMEM, "encode: out of memory");
    l->orig = orig;
    mpri_tensor_span_t *spans = realloc(l->spans, cap * sizeof *spans);
    if (!spans) return mpr_error_set(MPR_ERR_NOMEM, "encode: out of memory");
    l->spans = spans;
    l->cap = cap;
    return MPR_OK;
}

/* Room for `more` more tensors in the list and its index at once (a list
 * value of many tensors), within the per-message limit. */
static mpr_err_t tensor_list_reserve(mpri_tensor_list_t *l, uint32_t more) {
    if (more > MPRI_MAX_TENSORS_PER_MESSAGE - l->len) more = MPRI_MAX_TENSORS_PER_MESSAGE - l->len;
    if (l->len + more > l->cap) {
        mpr_err_t e = tensor_list_grow(l, l->len + more);
        if (e) return e;
    }
    return tensor_list_reserve_index(l, more);
}

mpr_err_t mpri_tensor_list_add(mpri_tensor_list_t *l, mpr_tensor_t *t, uint32_t *index) {
    /* Found, or the free slot of the index where `t` goes. */
    uint32_t slot = UINT32_MAX;
    if (!l->nslots) {
        int64_t found = tensor_list_find(l, t);
        if (found >= 0) {
            *index = (uint32_t)found;
            return MPR_OK;
        }
    } else {
        for (uint32_t s = slot_of(t, l->nslots);; s = (s + 1) & (l->nslots - 1)) {
            if (!l->slots[s]) {
                slot = s;
                break;
            }
            if (l->orig[l->slots[s] - 1] == t) {
                *index = l->slots[s] - 1;
                return MPR_OK;
            }
        }
    }
    /* Fields read directly (per tensor of a list of thousands): the value
     * holding `t` keeps it alive, checked here once. */
    if (t->magic != MPRI_TENSOR_MAGIC) mpri_tensor_check_live(t, "encode"); /* aborts */
    int device = t->storage->device;
    if (device > 127)
        return mpr_error_set(MPR_ERR_UNSUPPORTED, "encode: tensor on cuda:%d (devices 0..127 can be sent)",
                             device);
    size_t nbytes = mpri_dtype_bytes(t->dtype);
    for (int i = 0; i < t->ndim; i++) nbytes *= (size_t)t->shape[i];
    if (nbytes > MPRI_MAX_TENSOR_BYTES)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "encode: tensor of %zu bytes exceeds the 2 GiB limit",
                             nbytes);
    if (l->len == MPRI_MAX_TENSORS_PER_MESSAGE)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "encode: more than %d tensors in one message",
                             MPRI_MAX_TENSORS_PER_MESSAGE);
    if (l->total_bytes + nbytes > MPRI_MAX_MESSAGE_TENSOR_BYTES)
        return mpr_error_set(MPR_ERR_INVALID_ARG,
                             "encode: tensors of one message exceed the 64 GiB limit (%llu + %zu bytes)",
                             (unsigned long long)l->total_bytes, nbytes);
    if (l->len == l->cap) {
        mpr_err_t e = tensor_list_grow(l, l->cap ? l->cap * 2 : 4);
        if (e) return e;
    }
    if ((uint64_t)l->len + 1 > LINEAR_SCAN_MAX && ((uint64_t)l->len + 1) * 2 >= l->nslots) {
        mpr_err_t e = tensor_list_reserve_index(l, 1);
        if (e) return e;
        slot = UINT32_MAX; /* the index was rebuilt */
    }
    mpr_tensor_t *c;
    if (device < 0 && contiguous(t)) /* the common case, without the getters' checks (live: checked) */
        atomic_fetch_add_explicit(&(c = t)->refcount, 1, memory_order_relaxed);
    else
        c = device >= 0 ? mpri_tensor_wire_to_host(t) : mpr_tensor_contiguous(t);
    if (!c) return mpr_last_error_code();
    l->items[l->len] = c;
    l->orig[l->len] = t;
    /* The copy's bytes (c is t in the common case: its storage line is
     * already here): the send plans, packs and posts from these. */
    l->spans[l->len] = (mpri_tensor_span_t){(uint8_t *)c->storage->data + c->offset * (int64_t)mpri_dtype_bytes(c->dtype),
                                            nbytes};
    l->total_bytes += nbytes;
    if (l->nslots) {
        if (slot == UINT32_MAX)
            for (slot = slot_of(t, l->nslots); l->slots[slot]; slot = (slot + 1) & (l->nslots - 1)) {
            }
        l->slots[slot] = l->len + 1;
    }
    *index = l->len++;
    return MPR_OK;
}

static mpr_err_t encode_rec(const mpr_value_t *v, mpri_buf_t *out, mpri_tensor_list_t *tensors,
                            int dst_rank, int depth) {
    if (!v) return mpr_error_set(MPR_ERR_INVALID_ARG, "encode: NULL value");
    if (depth > MPRI_MAX_VALUE_DEPTH)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "encode: value nested deeper than %d",
                             MPRI_MAX_VALUE_DEPTH);
    mpri_buf_put_u8(out, (uint8_t)v->kind);
    switch (v->kind) {
    case MPR_VALUE_NONE: return MPR_OK;
    case MPR_VALUE_BOOL: mpri_buf_put_u8(out, v->u.b); return MPR_OK;
    case MPR_VALUE_INT: mpri_buf_put(out, &v->u.i, 8); return MPR_OK;
    case MPR_VALUE_DOUBLE: mpri_buf_put(out, &v->u.d, 8); return MPR_OK;
    case MPR_VALUE_STRING:
    case MPR_VALUE_BYTES:
        if (v->u.bytes.len > UINT32_MAX)
            return mpr_error_set(MPR_ERR_INVALID_ARG, "encode: %s of %zu bytes is too long",
                                 mpr_value_kind_name(v->kind), v->u.bytes.len);
        mpri_buf_put_blob(out, v->u.bytes.data, v->u.bytes.len);
        return MPR_OK;
    case MPR_VALUE_TENSOR: {
        uint32_t index = 0;
        mpr_err_t e = mpri_tensor_list_add(tensors, v->u.tensor, &index);
        if (e) return e;
        mpri_buf_put_u32(out, index);
        return MPR_OK;
    }
    case MPR_VALUE_WORKER: {
        int32_t rank = v->u.worker->rank;
        mpri_buf_put(out, &rank, 4);
        mpri_buf_put_blob(out, v->u.worker->name, strlen(v->u.worker->name));
        return MPR_OK;
    }
    case MPR_VALUE_LIST:
        if (v->u.list.len > UINT32_MAX)
            return mpr_error_set(MPR_ERR_INVALID_ARG, "encode: list too long");
        mpri_buf_put_u32(out, (uint32_t)v->u.list.len);
        /* A list of tensors (its first item one): room for all at once. */
        if (v->u.list.len > LINEAR_SCAN_MAX && v->u.list.items[0] && v->u.list.items[0]->kind == MPR_VALUE_TENSOR) {
            mpr_err_t e = tensor_list_reserve(tensors, (uint32_t)(v->u.list.len < UINT32_MAX ? v->u.list.len : UINT32_MAX));
            if (e) return e;
        }
        for (size_t i = 0; i < v->u.list.len; i++) {
            /* The items, their tensors and storages are scattered
             * allocations: ask for them a few items ahead (a list of
             * thousands of parameters otherwise waits on each in turn). */
            mpr_value_t *const *items = v->u.list.items;
            if (i + 8 < v->u.list.len) __builtin_prefetch(items[i + 8]);
            if (i + 4 < v->u.list.len && items[i + 4] && items[i + 4]->kind == MPR_VALUE_TENSOR)
                __builtin_prefetch(items[i + 4]->u.tensor);
            if (i + 2 < v->u.list.len && items[i + 2] && items[i + 2]->kind == MPR_VALUE_TENSOR &&
                items[i + 2]->u.tensor)
                __builtin_prefetch(items[i + 2]->u.tensor->storage);
            const mpr_value_t *item = items[i];
            mpr_err_t e;
            if (item && item->kind == MPR_VALUE_TENSOR && depth < MPRI_MAX_VALUE_DEPTH) {
                /* A tensor item (most items of a parameter list) without
                 * the recursive call. */
                uint32_t index = 0;
                if ((e = mpri_tensor_list_add(tensors, item->u.tensor, &index))) return e;
                mpri_buf_put_u8(out, MPR_VALUE_TENSOR);
                mpri_buf_put_u32(out, index);
                continue;
            }
            if ((e = encode_rec(item, out, tensors, dst_rank, depth + 1))) return e;
        }
        return MPR_OK;
    case MPR_VALUE_RREF:
    case MPR_VALUE_OBJECT: {
        const mpri_opaque_value_ops_t *ops = mpri_value_opaque_ops(v->kind);
        if (!ops || !ops->encode)
            return mpr_error_set(MPR_ERR_UNSUPPORTED,
                                 "encode: %s values cannot be sent (an object lives on its owner; "
                                 "share it through an RRef)",
                                 mpr_value_kind_name(v->kind));
        return ops->encode(v->u.opaque, out, dst_rank);
    }
    default: return mpr_error_set(MPR_ERR_INVALID_ARG, "encode: unknown value kind %d", (int)v->kind);
    }
}

mpr_err_t mpri_value_encode(const mpr_value_t *v, mpri_buf_t *out, mpri_tensor_list_t *tensors,
                            int dst_rank) {
    const mpri_opaque_value_ops_t *rref = mpri_value_opaque_ops(MPR_VALUE_RREF);
    size_t mark = rref && rref->encode_begin ? rref->encode_begin() : 0;
    mpr_err_t e = encode_rec(v, out, tensors, dst_rank, 0);
    if (!e && out->failed) e = mpr_error_set(MPR_ERR_NOMEM, "encode: out of memory");
    if (rref && rref->encode_end) rref->encode_end(mark, e == MPR_OK);
    return e;
}

void mpri_tensor_descs_encode(const mpri_tensor_list_t *tensors, mpri_buf_t *out) {
    for (uint32_t i = 0; i < tensors->len; i++) {
        const mpr_tensor_t *t = tensors->items[i];
        /* The flag is the original's: items[i] may be a contiguous copy. */
        const mpr_tensor_t *orig = tensors->orig ? tensors->orig[i] : t;
        bool requires_grad = mpri_tensor_wire_requires_grad(orig);
        int device = orig->storage->device; /* items[i] is then its host copy */
        mpri_buf_put_u8(out, (uint8_t)t->dtype | (requires_grad ? MPRI_DESC_REQUIRES_GRAD : 0) |
                                 (device >= 0 ? MPRI_DESC_ON_DEVICE : 0));
        mpri_buf_put_u8(out, (uint8_t)t->ndim);
        if (device >= 0) mpri_buf_put_u8(out, (uint8_t)device);
        mpri_buf_put(out, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    }
}

/* One descriptor: dtype (bit 7: requires_grad, bit 6: on a device), ndim,
 * [device], shape; validated, not allocated. *device is -1 for the host. */
static mpr_err_t read_desc(mpri_reader_t *in, uint32_t index, uint8_t *dtype, bool *requires_grad,
                           int *device, uint8_t *ndim, int64_t *shape, uint64_t *nbytes) {
    mpr_err_t e;
    if (in->left >= 2) { /* the common case without a call per byte */
        *dtype = in->p[0];
        *ndim = in->p[1];
        in->p += 2;
        in->left -= 2;
    } else if ((e = mpri_read_u8(in, dtype)) || (e = mpri_read_u8(in, ndim))) {
        return e;
    }
    *requires_grad = (*dtype & MPRI_DESC_REQUIRES_GRAD) != 0;
    *device = -1;
    if (*dtype & MPRI_DESC_ON_DEVICE) {
        uint8_t d;
        if ((e = mpri_read_u8(in, &d))) return e;
        if (d > 127) return mpr_error_set(MPR_ERR_DECODE, "tensor %u: bad device index %u", index, d);
        *device = d;
    }
    *dtype &= (uint8_t)~MPRI_DESC_FLAGS;
    if (*dtype >= MPR_DTYPE_COUNT || *ndim > MPR_MAX_DIMS)
        return mpr_error_set(MPR_ERR_DECODE, "tensor %u: bad descriptor (dtype %u, ndim %u)", index,
                             *dtype, *ndim);
    if ((e = mpri_read(in, shape, sizeof(int64_t) * *ndim))) return e;
    int64_t numel;
    if (mpri_tensor_check_shape("decode", *dtype, *ndim, shape, &numel) ||
        (uint64_t)numel * mpri_dtype_bytes(*dtype) > MPRI_MAX_TENSOR_BYTES)
        return mpr_error_set(MPR_ERR_DECODE, "tensor %u: invalid or oversized shape", index);
    *nbytes = (uint64_t)numel * mpri_dtype_bytes(*dtype);
    return MPR_OK;
}

/* A validated descriptor: 24 bytes, its shape left in the message (a
 * message may describe 65536 tensors). */
typedef struct desc {
    uint64_t nbytes;
    const uint8_t *shape_at; /* ndim i64 sizes, unaligned, inside the message */
    uint8_t dtype, ndim;
    bool requires_grad;
    int16_t device;
} desc_t;

/* Size by size, each an 8-byte load: a memcpy of a variable multiple of 8
 * bytes is inlined as `rep movsq`, whose start-up (tens of cycles on this
 * machine's AMD Zen) was 40% of decoding a descriptor (perf annotate of a
 * 4096-tensor list echo). The sizes are unrolled for the usual ranks so no
 * loop is turned back into such a memcpy. */
static void desc_shape(const desc_t *d, int64_t *shape) {
    const uint8_t *at = d->shape_at;
    unsigned n = d->ndim; /* <= MPR_MAX_DIMS: read_desc checked it */
    switch (n) {
    case 4: memcpy(&shape[3], at + 24, 8); /* fall through */
    case 3: memcpy(&shape[2], at + 16, 8); /* fall through */
    case 2: memcpy(&shape[1], at + 8, 8);  /* fall through */
    case 1: memcpy(&shape[0], at, 8);      /* fall through */
    case 0: return;
    default:
        for (unsigned i = 0; i < n; i++) memcpy(&shape[i], at + 8 * i, 8);
    }
}

static void release_made(mpr_tensor_t **out, uint32_t made) {
    for (uint32_t i = 0; i < made; i++) {
        mpr_tensor_release(out[i]);
        out[i] = NULL;
    }
}

/* Tensors descs[first..end) (one batch of several small tensors) carved from
 * one block, each at the first offset that suits its dtype: back to back
 * (one plain receive) unless a dtype's alignment leaves a gap. */
static mpr_err_t make_batch_block(const desc_t *descs, uint32_t first, uint32_t end, mpr_tensor_t **out,
                                  mpri_tensor_span_t *spans) {
    size_t bytes = 0;
    for (uint32_t i = first; i < end; i++) {
        size_t align = mpri_dtype_bytes(descs[i].dtype);
        bytes = ((bytes + align - 1) & ~(align - 1)) + descs[i].nbytes; /* dtype sizes are powers of two */
    }
    mpri_tensor_block_t *block = mpri_tensor_block_create(bytes, end - first);
    if (!block) return mpr_last_error_code();
    size_t at = 0;
    mpr_err_t e = MPR_OK;
    for (uint32_t i = first; i < end; i++) {
        size_t align = mpri_dtype_bytes(descs[i].dtype);
        at = (at + align - 1) & ~(align - 1);
        int64_t shape[MPR_MAX_DIMS];
        desc_shape(&descs[i], shape);
        out[i] = mpri_tensor_block_carve(block, i - first, at, descs[i].dtype, descs[i].ndim, shape);
        if (out[i] && spans) spans[i] = (mpri_tensor_span_t){out[i]->storage->data, descs[i].nbytes};
        if (!out[i]) {
            e = mpr_last_error_code() ? mpr_last_error_code() : MPR_ERR_NOMEM;
            mpri_tensor_block_carved(block);
            release_made(out + first, i - first);
            return e;
        }
        at += descs[i].nbytes;
    }
    mpri_tensor_block_carved(block);
    return e;
}

mpr_err_t mpri_tensor_descs_decode(mpri_reader_t *in, uint32_t count, mpr_tensor_t **out,
                                   mpri_tensor_placement_t **placement) {
    return mpri_tensor_descs_decode_spans(in, count, out, NULL, placement);
}

mpr_err_t mpri_tensor_descs_decode_spans(mpri_reader_t *in, uint32_t count, mpr_tensor_t **out,
                                         mpri_tensor_span_t *spans, mpri_tensor_placement_t **placement) {
    *placement = NULL;
    if (count == 0) return MPR_OK;
    uint64_t total = 0;
    uint32_t on_device = 0;
    /* Every descriptor valid and the total within the message limit, before
     * any storage is reserved. */
    desc_t stack_descs[8]; /* a message's few tensors: no allocation */
    desc_t *descs = count <= 8 ? stack_descs : malloc(sizeof *descs * count);
    if (!descs) return mpr_error_set(MPR_ERR_NOMEM, "out of memory for %u tensor descriptors", count);
    for (uint32_t i = 0; i < count; i++) {
        desc_t *d = &descs[i];
        int64_t shape[MPR_MAX_DIMS];
        int device;
        mpr_err_t e = read_desc(in, i, &d->dtype, &d->requires_grad, &device, &d->ndim, shape, &d->nbytes);
        if (e) {
            if (descs != stack_descs) free(descs);
            return e;
        }
        d->device = (int16_t)device;
        d->shape_at = in->p - sizeof(int64_t) * d->ndim; /* read_desc read the shape last */
        total += d->nbytes; /* <= 65536 * 2 GiB: no overflow */
        on_device += d->device >= 0;
    }
    if (total > MPRI_MAX_MESSAGE_TENSOR_BYTES) {
        if (descs != stack_descs) free(descs);
        return mpr_error_set(MPR_ERR_DECODE, "%u tensors of %llu bytes in all exceed the 64 GiB limit",
                             count, (unsigned long long)total);
    }
    mpri_tensor_placement_t *p = NULL;
    if (on_device) {
        p = calloc(1, sizeof *p + count * sizeof p->items[0]);
        if (!p) {
            if (descs != stack_descs) free(descs);
            return mpr_error_set(MPR_ERR_NOMEM, "out of memory for %u tensor placements", count);
        }
        p->count = count;
        for (uint32_t i = 0; i < count; i++) {
            p->items[i].device = (int16_t)descs[i].device;
            p->items[i].requires_grad = descs[i].requires_grad;
        }
    }
    /* One allocation per batch of small tensors, one per tensor sent alone
     * (mpri_tensor_batches.h: the same plan as the sender's). */
    uint32_t made = 0;
    mpr_err_t e = MPR_OK;
    mpri_batch_planner_t plan = {0};
    (void)mpri_batch_planner_next(&plan, descs[0].nbytes);
    while (made < count) {
        uint32_t end = made + 1;
        while (end < count && !mpri_batch_planner_next(&plan, descs[end].nbytes)) end++;
        if (end - made == 1) {
            int64_t shape[MPR_MAX_DIMS];
            desc_shape(&descs[made], shape);
            out[made] = mpr_tensor_empty(descs[made].dtype, descs[made].ndim, shape);
            if (!out[made]) e = mpr_last_error_code() ? mpr_last_error_code() : MPR_ERR_NOMEM;
            else if (spans) spans[made] = (mpri_tensor_span_t){out[made]->storage->data, descs[made].nbytes};
        } else {
            e = make_batch_block(descs, made, end, out, spans);
        }
        if (e) break;
        /* A device tensor's leaf is its device copy (placement). */
        for (; made < end; made++)
            if (descs[made].requires_grad && descs[made].device < 0 &&
                (e = mpri_tensor_wire_set_requires_grad(out[made]))) {
                made = end;
                break;
            }
        if (e) break;
    }
    if (descs != stack_descs) free(descs);
    if (e) {
        release_made(out, made);
        free(p);
        return e;
    }
    *placement = p;
    return MPR_OK;
}

mpr_err_t mpri_tensor_placement_apply(mpri_tensor_placement_t *placement, mpr_tensor_t **tensors) {
    if (!placement) return MPR_OK;
    if (placement->done)
        return placement->error ? mpr_error_set(placement->error, "the message's tensors could not be placed on "
                                                                  "their devices (reported at its first decode)")
                                : MPR_OK;
    placement->done = true;
    for (uint32_t i = 0; i < placement->count; i++) {
        int device = placement->items[i].device;
        if (device < 0) continue;
        mpr_tensor_t *d = mpri_tensor_wire_to_device(tensors[i], device);
        mpr_err_t e = d ? MPR_OK : mpr_last_error_code();
        if (d && placement->items[i].requires_grad && (e = mpri_tensor_wire_set_requires_grad(d)))
            mpr_tensor_release(d);
        if (e) {
            char why[MPR_ERROR_TEXT_MAX];
            snprintf(why, sizeof why, "%s", mpr_last_error());
            placement->error = e;
            return mpr_error_set(e, "tensor %u sent from cuda:%d: %s", i, device, why);
        }
        mpr_tensor_release(tensors[i]);
        tensors[i] = d;
    }
    return MPR_OK;
}

/* Bytes of a tensor item on the wire (kind + index): a slab for the tensor
 * items left in a list never has more slots than the bytes left allow. */
#define TENSOR_ITEM_BYTES 5

/* `taken` (NULL: never) marks the tensors whose reference a value took
 * over (mpri_value_decode_taking): the first tensor item of a list naming
 * each index takes it; later ones take references of their own. */
static mpr_err_t decode_rec(mpri_reader_t *in, mpr_tensor_t *const *tensors, uint32_t ntensors, uint8_t *taken,
                            int src_rank, int depth, mpri_value_slab_t *slab, mpr_value_t **out) {
    if (depth > MPRI_MAX_VALUE_DEPTH)
        return mpr_error_set(MPR_ERR_DECODE, "value nested deeper than %d", MPRI_MAX_VALUE_DEPTH);
    uint8_t kind;
    mpr_err_t e = mpri_read_u8(in, &kind);
    if (e) return e;
    mpr_value_t *v = NULL;
    switch (kind) {
    case MPR_VALUE_NONE: v = mpr_value_new_none(); break;
    case MPR_VALUE_BOOL: {
        uint8_t b;
        if ((e = mpri_read_u8(in, &b))) return e;
        if (b > 1) return mpr_error_set(MPR_ERR_DECODE, "bool value %u", b);
        v = mpr_value_new_bool(b);
        break;
    }
    case MPR_VALUE_INT: {
        int64_t i;
        if ((e = mpri_read(in, &i, 8))) return e;
        v = mpr_value_new_int(i);
        break;
    }
    case MPR_VALUE_DOUBLE: {
        double d;
        if ((e = mpri_read(in, &d, 8))) return e;
        v = mpr_value_new_double(d);
        break;
    }
    case MPR_VALUE_STRING:
    case MPR_VALUE_BYTES: {
        const void *data;
        size_t len;
        if ((e = mpri_read_blob(in, &data, &len))) return e;
        if (kind == MPR_VALUE_STRING && memchr(data, 0, len))
            return mpr_error_set(MPR_ERR_DECODE, "string contains a NUL byte");
        v = mpr_value_new_bytes(data, len);
        if (v) v->kind = kind; /* strings are NUL-terminated bytes */
        break;
    }
    case MPR_VALUE_TENSOR: {
        uint32_t index;
        if ((e = mpri_read_u32(in, &index))) return e;
        if (index >= ntensors)
            return mpr_error_set(MPR_ERR_DECODE, "tensor index %u out of range (%u tensors)", index,
                                 ntensors);
        v = mpri_value_slab_new_tensor(slab, tensors[index], false);
        break;
    }
    case MPR_VALUE_WORKER: {
        int32_t rank;
        const void *name;
        size_t len;
        if ((e = mpri_read(in, &rank, 4)) || (e = mpri_read_blob(in, &name, &len))) return e;
        if (len >= MPR_MAX_NAME_LEN || rank < 0)
            return mpr_error_set(MPR_ERR_DECODE, "worker info: bad rank %d or name length %zu",
                                 rank, len);
        mpr_worker_info_t w = {.rank = rank};
        memcpy(w.name, name, len);
        v = mpr_value_new_worker(&w);
        break;
    }
    case MPR_VALUE_LIST: {
        uint32_t count;
        if ((e = mpri_read_u32(in, &count))) return e;
        if (count > in->left)
            return mpr_error_set(MPR_ERR_DECODE, "list of %u items in %zu bytes", count, in->left);
        v = mpr_value_new_list();
        if (!v) return mpr_last_error_code();
        if (count) { /* the items array at its final size at once (count <= bytes left) */
            v->u.list.items = malloc(sizeof *v->u.list.items * count);
            if (!v->u.list.items) {
                mpr_value_release(v);
                return mpr_error_set(MPR_ERR_NOMEM, "out of memory for a list of %u items", count);
            }
            v->u.list.cap = count;
        }
        /* The tensor items' values share one slab, made at the first one
         * when at least two items are left (mpri_value.h). */
        mpri_value_slab_t *items_slab = NULL;
        for (uint32_t i = 0; i < count; i++) {
            mpr_value_t *item;
            if (!items_slab && count - i >= 2 && in->left >= 2 * TENSOR_ITEM_BYTES &&
                in->p[0] == MPR_VALUE_TENSOR) {
                size_t room = in->left / TENSOR_ITEM_BYTES; /* tensor items left at most */
                if (room > count - i) room = count - i;
                if (room > ntensors) room = ntensors; /* more are repeats: from the heap */
                items_slab = mpri_value_slab_create((uint32_t)room);
                if (!items_slab) e = mpr_last_error_code();
            }
            uint32_t index;
            if (!e && items_slab && depth < MPRI_MAX_VALUE_DEPTH && in->left >= TENSOR_ITEM_BYTES &&
                in->p[0] == MPR_VALUE_TENSOR &&
                (memcpy(&index, in->p + 1, sizeof index), index < ntensors)) {
                /* A tensor item (most items of a parameter list), read here
                 * without the recursive call; anything else, or a bad
                 * index, goes through decode_rec. */
                in->p += TENSOR_ITEM_BYTES;
                in->left -= TENSOR_ITEM_BYTES;
                bool take = taken && !taken[index];
                if (take) taken[index] = 1;
                item = mpri_value_slab_new_tensor(items_slab, tensors[index], take);
                if (!item) e = mpr_last_error_code() ? mpr_last_error_code() : MPR_ERR_NOMEM;
            } else if (!e) {
                e = decode_rec(in, tensors, ntensors, taken, src_rank, depth + 1, items_slab, &item);
            }
            if (e) {
                mpri_value_slab_done(items_slab); /* before any of its values dies */
                mpr_value_release(v);
                return e;
            }
            v->u.list.items[v->u.list.len++] = item;
        }
        mpri_value_slab_done(items_slab);
        break;
    }
    case MPR_VALUE_RREF:
    case MPR_VALUE_OBJECT: {
        const mpri_opaque_value_ops_t *ops = mpri_value_opaque_ops(kind);
        if (!ops || !ops->decode)
            return mpr_error_set(MPR_ERR_DECODE, "%s value received but no decoder is registered",
                                 mpr_value_kind_name(kind));
        void *p;
        if ((e = ops->decode(in, src_rank, &p))) return e;
        v = mpri_value_new_opaque(kind, p);
        if (!v) ops->release(p);
        break;
    }
    default: return mpr_error_set(MPR_ERR_DECODE, "unknown value kind %u", kind);
    }
    if (!v) return mpr_last_error_code() ? mpr_last_error_code() : MPR_ERR_NOMEM;
    *out = v;
    return MPR_OK;
}

/* ---- settling values that will not be decoded ----
 * Walks the wire form as decode_rec does, making nothing; an opaque value
 * whose kind byte is at or after `from` is settled (undone), one before it
 * only read past (the decoder made it, or settled it when making it
 * failed). */
static mpr_err_t settle_rec(mpri_reader_t *in, int src_rank, int depth, const uint8_t *from) {
    if (depth > MPRI_MAX_VALUE_DEPTH) return MPR_ERR_DECODE;
    const uint8_t *at = in->p;
    uint8_t kind, u8;
    uint32_t u32;
    uint64_t u64;
    const void *data;
    size_t len;
    mpr_err_t e = mpri_read_u8(in, &kind);
    if (e) return e;
    switch (kind) {
    case MPR_VALUE_NONE: return MPR_OK;
    case MPR_VALUE_BOOL: return mpri_read_u8(in, &u8);
    case MPR_VALUE_INT:
    case MPR_VALUE_DOUBLE: return mpri_read_u64(in, &u64);
    case MPR_VALUE_STRING:
    case MPR_VALUE_BYTES: return mpri_read_blob(in, &data, &len);
    case MPR_VALUE_TENSOR: return mpri_read_u32(in, &u32);
    case MPR_VALUE_WORKER: return (e = mpri_read_u32(in, &u32)) ? e : mpri_read_blob(in, &data, &len);
    case MPR_VALUE_LIST: {
        uint32_t count;
        if ((e = mpri_read_u32(in, &count))) return e;
        for (uint32_t i = 0; i < count; i++)
            if ((e = settle_rec(in, src_rank, depth + 1, from))) return e;
        return MPR_OK;
    }
    case MPR_VALUE_RREF:
    case MPR_VALUE_OBJECT: {
        const mpri_opaque_value_ops_t *ops = mpri_value_opaque_ops(kind);
        if (!ops || !ops->settle) return MPR_ERR_DECODE; /* its length is unknown: stop */
        return ops->settle(in, src_rank, at >= from);
    }
    default: return MPR_ERR_DECODE;
    }
}

/* Settle what the value at `r` holds from `from` on (reading past it),
 * keeping the thread's last error (the caller reports the decode's). */
static void settle_from(mpri_reader_t *r, int src_rank, const uint8_t *from) {
    mpri_error_saved_t saved;
    mpri_error_save(&saved);
    (void)settle_rec(r, src_rank, 0, from);
    mpri_error_restore(&saved);
}

mpr_err_t mpri_value_decode(mpri_reader_t *in, mpr_tensor_t *const *tensors, uint32_t ntensors,
                            int src_rank, mpr_value_t **out) {
    mpri_reader_t whole = *in;
    mpr_err_t e = decode_rec(in, tensors, ntensors, NULL, src_rank, 0, NULL, out);
    if (e) settle_from(&whole, src_rank, in->p);
    return e;
}

mpr_err_t mpri_value_decode_taking(mpri_reader_t *in, mpr_tensor_t **tensors, uint32_t ntensors, int src_rank,
                                   mpr_value_t **out) {
    uint8_t stack_taken[64] = {0};
    uint8_t *taken = ntensors <= sizeof stack_taken ? stack_taken : calloc(ntensors, 1);
    if (!taken) return mpri_value_decode(in, tensors, ntensors, src_rank, out); /* no room to keep count */
    mpri_reader_t whole = *in;
    mpr_err_t e = decode_rec(in, tensors, ntensors, taken, src_rank, 0, NULL, out);
    if (e) settle_from(&whole, src_rank, in->p);
    /* Taken references belong to the values, decoded or (on failure)
     * already released with them. */
    for (uint32_t i = 0; i < ntensors; i++)
        if (taken[i]) tensors[i] = NULL;
    if (taken != stack_taken) free(taken);
    return e;
}

void mpri_value_settle(mpri_reader_t *in, int src_rank) { settle_from(in, src_rank, in->p); }
