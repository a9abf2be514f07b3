/* value.c — construction, sharing, access and comparison of values.
 *
 * Invariants: refcounts are atomic; the none value is a single immortal
 * object (no allocation on the no-op RPC path); a list owns one reference to
 * each item; string values are always NUL-terminated; opaque kinds (RRef,
 * object) are retained/released only through their registered hooks. A live
 * value carries MPRI_VALUE_MAGIC; the last release poisons it (magic DEAD)
 * and frees it through the quarantine (mpri_quarantine.h), and every public
 * entry that takes a value checks the magic, so a use after release aborts
 * with a message naming the value. Releasing a list frees its items with an
 * explicit work list, never by recursion, so any nesting depth is released
 * in constant stack. Every getter with an output sets it to NULL/zero first.
 * A value in a slab (mpri_value.h) is poisoned like any other; its struct is
 * freed with the slab, whose refcount is the number of its live values plus
 * one while its decoder holds it. One release batches the drops of shared
 * counters over a list's dying tensor items (the slab's, the tensors' live
 * count and blocks: one atomic per run instead of one per item) and flushes
 * them before it returns. */
#include "mpri_value.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_args.h"
#include "mpri_host_alloc.h"
#include "mpri_quarantine.h"
#include "mpri_refcount.h"
#include "mpri_small_alloc.h"
#include "mpri_tensor.h"

static mpr_value_t none_value = {.kind = MPR_VALUE_NONE, .immortal = true, .magic = MPRI_VALUE_MAGIC};
static const mpri_opaque_value_ops_t *opaque_ops[MPR_VALUE_KIND_COUNT];

static const char *const kind_names[MPR_VALUE_KIND_COUNT] = {
    "none", "bool", "int", "double", "string", "bytes", "tensor", "worker", "list", "rref", "object"};

const char *mpr_value_kind_name(mpr_value_kind_t kind) {
    if ((int)kind < 0 || kind >= MPR_VALUE_KIND_COUNT) return "?";
    return kind_names[kind];
}

void mpri_value_set_opaque_ops(mpr_value_kind_t kind, const mpri_opaque_value_ops_t *ops) {
    opaque_ops[kind] = ops;
}

const mpri_opaque_value_ops_t *mpri_value_opaque_ops(mpr_value_kind_t kind) {
    return opaque_ops[kind];
}

static mpr_value_t *value_alloc(mpr_value_kind_t kind) {
    mpr_value_t *v = mpri_small_calloc(sizeof *v);
    if (!v) {
        mpr_error_set(MPR_ERR_NOMEM, "value: out of memory");
        return NULL;
    }
    v->kind = kind;
    v->magic = MPRI_VALUE_MAGIC;
    atomic_init(&v->refcount, 1);
    return v;
}

void mpri_value_check_live(const mpr_value_t *v, const char *what) {
    if (v->magic == MPRI_VALUE_MAGIC) return;
    if (v->magic == MPRI_VALUE_DEAD)
        mpri_misuse_abort("%s: value %p (%s) used after its last mpr_value_release (released twice, "
                          "or used after release)",
                          what, (const void *)v, mpr_value_kind_name(v->kind));
    mpri_misuse_abort("%s: %p is not a live mpr_value_t (freed or corrupt memory)", what, (const void *)v);
}

mpr_value_t *mpr_value_new_none(void) { return &none_value; }

mpr_value_t *mpr_value_new_bool(bool b) {
    mpr_value_t *v = value_alloc(MPR_VALUE_BOOL);
    if (v) v->u.b = b;
    return v;
}

mpr_value_t *mpr_value_new_int(int64_t i) {
    mpr_value_t *v = value_alloc(MPR_VALUE_INT);
    if (v) v->u.i = i;
    return v;
}

mpr_value_t *mpr_value_new_double(double d) {
    mpr_value_t *v = value_alloc(MPR_VALUE_DOUBLE);
    if (v) v->u.d = d;
    return v;
}

static mpr_value_t *new_bytes_kind(mpr_value_kind_t kind, const void *data, size_t len) {
    if (!data && len) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "value: NULL data with length %zu", len);
        return NULL;
    }
    mpr_value_t *v = value_alloc(kind);
    if (!v) return NULL;
    v->u.bytes.data = malloc(len + 1);
    if (!v->u.bytes.data) {
        mpri_small_free(v, sizeof *v);
        mpr_error_set(MPR_ERR_NOMEM, "value: out of memory for %zu bytes", len);
        return NULL;
    }
    if (len) memcpy(v->u.bytes.data, data, len);
    v->u.bytes.data[len] = '\0';
    v->u.bytes.len = len;
    return v;
}

mpr_value_t *mpr_value_new_string(const char *s) {
    MPRI_ARG_NONNULL_OR(s, NULL);
    return new_bytes_kind(MPR_VALUE_STRING, s, strlen(s));
}

mpr_value_t *mpr_value_new_bytes(const void *data, size_t len) {
    if (len > 0) MPRI_ARG_NONNULL_OR(data, NULL);
    return new_bytes_kind(MPR_VALUE_BYTES, data, len);
}

mpr_value_t *mpr_value_new_tensor(mpr_tensor_t *t) {
    MPRI_ARG_NONNULL_OR(t, NULL);
    mpri_tensor_check_live(t, __func__);
    mpr_value_t *v = value_alloc(MPR_VALUE_TENSOR);
    if (v) v->u.tensor = mpr_tensor_retain(t);
    return v;
}

mpr_value_t *mpr_value_new_worker(const mpr_worker_info_t *w) {
    MPRI_ARG_NONNULL_OR(w, NULL);
    mpr_worker_info_t *copy = malloc(sizeof *copy);
    if (!copy) {
        mpr_error_set(MPR_ERR_NOMEM, "value: out of memory");
        return NULL;
    }
    *copy = *w;
    copy->name[MPR_MAX_NAME_LEN - 1] = '\0';
    mpr_value_t *v = value_alloc(MPR_VALUE_WORKER);
    if (v)
        v->u.worker = copy;
    else
        free(copy);
    return v;
}

mpr_value_t *mpr_value_new_list(void) { return value_alloc(MPR_VALUE_LIST); }

mpr_value_t *mpri_value_new_opaque(mpr_value_kind_t kind, void *p) {
    mpr_value_t *v = value_alloc(kind);
    if (v) v->u.opaque = p;
    return v;
}

mpr_value_t *mpr_value_list_of(int n, ...) {
    if (n < 0) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_value_list_of: negative item count %d", n);
        return NULL;
    }
    va_list ap;
    va_start(ap, n);
    mpr_value_t **items = calloc(n > 0 ? (size_t)n : 1, sizeof *items);
    bool ok = items != NULL;
    bool null_item = false;
    for (int i = 0; i < n; i++) {
        mpr_value_t *item = va_arg(ap, mpr_value_t *);
        if (items)
            items[i] = item;
        else
            mpr_value_release(item); /* owned even when the list cannot be made */
        if (!item) ok = false, null_item = true;
    }
    va_end(ap);
    mpr_value_t *list = ok ? value_alloc(MPR_VALUE_LIST) : NULL;
    if (!list) {
        if (items)
            for (int i = 0; i < n; i++) mpr_value_release(items[i]);
        free(items);
        if (ok) return NULL; /* value_alloc set the error */
        if (null_item)
            mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_value_list_of: an item is NULL");
        else
            mpr_error_set(MPR_ERR_NOMEM, "mpr_value_list_of: out of memory");
        return NULL;
    }
    list->u.list.items = items;
    list->u.list.len = list->u.list.cap = (size_t)n;
    return list;
}

mpr_value_t *mpr_value_retain(mpr_value_t *v) {
    MPRI_ARG_NONNULL_OR(v, NULL);
    mpri_value_check_live(v, __func__);
    if (!v->immortal) atomic_fetch_add_explicit(&v->refcount, 1, memory_order_relaxed);
    return v;
}

/* Drop one reference; true if it was the last (the caller then frees `v`). */
static bool drop_ref(mpr_value_t *v) {
    mpri_value_check_live(v, "mpr_value_release");
    if (v->immortal) return false;
    return mpri_refcount_drop(&v->refcount);
}

/* One release's state: values whose last reference is gone and whose
 * items are still to drop, and the shared counters whose drops are batched
 * over a list's tensor items (the tensors' live count and blocks, the
 * values' slab), flushed when the release ends. */
typedef struct {
    mpr_value_t **items;
    size_t len, cap;
    mpri_tensor_release_batch_t tensors;
    struct mpri_value_slab *slab; /* the run's slab, NULL for none */
    long slab_refs;               /* references to `slab` to drop */
} worklist_t;

static void destroy_recursive(mpr_value_t *v);

struct mpri_value_slab {
    atomic_long refcount; /* live values taken from it, + 1 until mpri_value_slab_done */
    uint32_t cap, used;
    mpr_value_t values[];
};

static size_t slab_bytes(uint32_t cap) { return sizeof(mpri_value_slab_t) + (size_t)cap * sizeof(mpr_value_t); }

static void slab_drop(mpri_value_slab_t *s, long n) {
    if (mpri_refcount_drop_n(&s->refcount, n) == 0) mpri_host_free(s, slab_bytes(s->cap));
}

mpri_value_slab_t *mpri_value_slab_create(uint32_t cap) {
    /* From the host allocator: a slab of thousands of values (256 KiB for
     * 4096) comes back warm from its cache instead of fresh pages. */
    mpri_value_slab_t *s = mpri_host_alloc(slab_bytes(cap));
    if (!s) {
        mpr_error_set(MPR_ERR_NOMEM, "value: out of memory for %u values", cap);
        return NULL;
    }
    atomic_init(&s->refcount, 1);
    s->cap = cap;
    s->used = 0;
    return s;
}

mpr_value_t *mpri_value_slab_new_tensor(mpri_value_slab_t *s, mpr_tensor_t *t, bool take_ref) {
    if (!s || s->used == s->cap) {
        mpr_value_t *v = mpr_value_new_tensor(t);
        if (take_ref) mpr_tensor_release(t); /* the value's own, or none: out of memory */
        return v;
    }
    if (t->magic != MPRI_TENSOR_MAGIC) mpri_tensor_check_live(t, "decode"); /* aborts */
    mpr_value_t *v = &s->values[s->used++];
    memset(v, 0, sizeof *v);
    v->kind = MPR_VALUE_TENSOR;
    v->magic = MPRI_VALUE_MAGIC;
    v->slab = s;
    atomic_init(&v->refcount, 1);
    if (!take_ref) atomic_fetch_add_explicit(&t->refcount, 1, memory_order_relaxed); /* live: checked above */
    v->u.tensor = t;
    return v;
}

void mpri_value_slab_done(mpri_value_slab_t *s) {
    /* No value of it died before (mpri_value.h): the count is exact. One
     * atomic for all the values taken, minus the decoder's reference. */
    if (!s) return;
    if (s->used == 0)
        slab_drop(s, 1);
    else if (s->used > 1)
        atomic_fetch_add_explicit(&s->refcount, (long)s->used - 1, memory_order_relaxed);
}

/* Drop `v`'s slab reference (the struct goes with the slab's last), batched
 * in `w` with those of the values before it from the same slab. */
static void slab_drop_batched(mpr_value_t *v, worklist_t *w) {
    if (w->slab == v->slab) {
        w->slab_refs++;
        return;
    }
    if (w->slab) slab_drop(w->slab, w->slab_refs);
    w->slab = v->slab;
    w->slab_refs = 1;
}

/* A dead tensor item of a list (most of a decoded parameter list): its
 * tensor and slab drops batched in `w`. */
static void destroy_tensor_item(mpr_value_t *v, worklist_t *w) {
    mpri_tensor_release_deferred(v->u.tensor, &w->tensors);
    v->magic = MPRI_VALUE_DEAD;
    v->u.tensor = NULL;
    slab_drop_batched(v, w);
}

/* Free `v`'s own resources and memory; a list's items whose last reference
 * this was go to `w` (or are destroyed recursively if `w` cannot grow). */
static void destroy_one(mpr_value_t *v, worklist_t *w) {
    switch (v->kind) {
    case MPR_VALUE_STRING:
    case MPR_VALUE_BYTES: free(v->u.bytes.data); break;
    case MPR_VALUE_WORKER: free(v->u.worker); break;
    case MPR_VALUE_TENSOR: mpr_tensor_release(v->u.tensor); break;
    case MPR_VALUE_LIST:
        for (size_t i = 0; i < v->u.list.len; i++) {
            mpr_value_t *item = v->u.list.items[i];
            if (!drop_ref(item)) continue;
            if (item->kind == MPR_VALUE_TENSOR && item->slab) {
                destroy_tensor_item(item, w);
                continue;
            }
            if (w->len == w->cap) {
                size_t cap = w->cap ? w->cap * 2 : 64;
                mpr_value_t **grown = realloc(w->items, cap * sizeof *grown);
                if (!grown) {
                    destroy_recursive(item); /* out of memory: bounded by the nesting left */
                    continue;
                }
                w->items = grown;
                w->cap = cap;
            }
            w->items[w->len++] = item;
        }
        free(v->u.list.items);
        break;
    case MPR_VALUE_RREF:
    case MPR_VALUE_OBJECT:
        if (opaque_ops[v->kind] && v->u.opaque) opaque_ops[v->kind]->release(v->u.opaque);
        break;
    default: break;
    }
    v->magic = MPRI_VALUE_DEAD;
    memset(&v->u, 0, sizeof v->u);
    if (v->slab)
        slab_drop_batched(v, w);
    else if (MPRI_DEBUG_CHECKS)
        mpri_quarantine_free(v); /* a use after release still meets a dead magic */
    else
        mpri_small_free(v, sizeof *v);
}

static void destroy_recursive(mpr_value_t *v) {
    worklist_t w = {0};
    destroy_one(v, &w);
    while (w.len) destroy_one(w.items[--w.len], &w);
    free(w.items);
    mpri_tensor_release_flush(&w.tensors);
    if (w.slab) slab_drop(w.slab, w.slab_refs);
}

void mpr_value_release(mpr_value_t *v) {
    if (!v || !drop_ref(v)) return;
    destroy_recursive(v);
}

mpr_value_kind_t mpr_value_kind(const mpr_value_t *v) {
    MPRI_ARG_NONNULL_OR(v, MPR_VALUE_NONE);
    mpri_value_check_live(v, __func__);
    return v->kind;
}

static mpr_err_t kind_mismatch(const mpr_value_t *v, mpr_value_kind_t want) {
    return mpr_error_set(MPR_ERR_TYPE, "expected a %s value, got %s", kind_names[want],
                         mpr_value_kind_name(v->kind));
}

/* Entry checks of a getter: output cleared, both pointers non-NULL, `v` live. */
#define GETTER_ENTRY(v, out)                                                  \
    do {                                                                      \
        if (out) memset((out), 0, sizeof *(out));                             \
        MPRI_ARG_NONNULL(v);                                                  \
        MPRI_ARG_NONNULL(out);                                                \
        mpri_value_check_live((v), __func__);                                 \
    } while (0)

mpr_err_t mpr_value_get_bool(const mpr_value_t *v, bool *out) {
    GETTER_ENTRY(v, out);
    if (v->kind != MPR_VALUE_BOOL) return kind_mismatch(v, MPR_VALUE_BOOL);
    *out = v->u.b;
    return MPR_OK;
}

mpr_err_t mpr_value_get_int(const mpr_value_t *v, int64_t *out) {
    GETTER_ENTRY(v, out);
    if (v->kind != MPR_VALUE_INT) return kind_mismatch(v, MPR_VALUE_INT);
    *out = v->u.i;
    return MPR_OK;
}

mpr_err_t mpr_value_get_double(const mpr_value_t *v, double *out) {
    GETTER_ENTRY(v, out);
    if (v->kind == MPR_VALUE_INT) {
        *out = (double)v->u.i;
        return MPR_OK;
    }
    if (v->kind != MPR_VALUE_DOUBLE) return kind_mismatch(v, MPR_VALUE_DOUBLE);
    *out = v->u.d;
    return MPR_OK;
}

mpr_err_t mpr_value_get_string(const mpr_value_t *v, const char **out) {
    GETTER_ENTRY(v, out);
    if (v->kind != MPR_VALUE_STRING) return kind_mismatch(v, MPR_VALUE_STRING);
    *out = v->u.bytes.data;
    return MPR_OK;
}

mpr_err_t mpr_value_get_bytes(const mpr_value_t *v, const void **data, size_t *len) {
    if (len) *len = 0;
    GETTER_ENTRY(v, data);
    MPRI_ARG_NONNULL(len);
    if ((v->kind != MPR_VALUE_BYTES && v->kind != MPR_VALUE_STRING))
        return kind_mismatch(v, MPR_VALUE_BYTES);
    *data = v->u.bytes.data;
    *len = v->u.bytes.len;
    return MPR_OK;
}

mpr_err_t mpr_value_get_tensor(const mpr_value_t *v, mpr_tensor_t **out) {
    GETTER_ENTRY(v, out);
    if (v->kind != MPR_VALUE_TENSOR) return kind_mismatch(v, MPR_VALUE_TENSOR);
    *out = v->u.tensor;
    return MPR_OK;
}

mpr_err_t mpr_value_get_worker(const mpr_value_t *v, mpr_worker_info_t *out) {
    if (out) memset(out, 0, sizeof *out), out->rank = -1;
    MPRI_ARG_NONNULL(v);
    MPRI_ARG_NONNULL(out);
    mpri_value_check_live(v, __func__);
    if (v->kind != MPR_VALUE_WORKER) return kind_mismatch(v, MPR_VALUE_WORKER);
    *out = *v->u.worker;
    return MPR_OK;
}

size_t mpr_value_list_len(const mpr_value_t *v) {
    MPRI_ARG_NONNULL_OR(v, 0);
    mpri_value_check_live(v, __func__);
    return v->kind == MPR_VALUE_LIST ? v->u.list.len : 0;
}

mpr_value_t *mpr_value_list_get(const mpr_value_t *v, size_t i) {
    MPRI_ARG_NONNULL_OR(v, NULL);
    mpri_value_check_live(v, __func__);
    if (v->kind != MPR_VALUE_LIST) {
        kind_mismatch(v, MPR_VALUE_LIST);
        return NULL;
    }
    if (i >= v->u.list.len) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "list index %zu out of range (length %zu)", i,
                      v->u.list.len);
        return NULL;
    }
    return v->u.list.items[i];
}

mpr_err_t mpr_value_list_append(mpr_value_t *list, mpr_value_t *item) {
    if (!item) {
        /* Usually the item's constructor failed: keep its error in the detail. */
        mpr_err_t code = mpr_last_error_code();
        if (code == MPR_OK)
            return mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_value_list_append: argument 'item' is NULL");
        char earlier[512];
        snprintf(earlier, sizeof earlier, "%s", mpr_last_error());
        return mpr_error_set(code, "mpr_value_list_append: argument 'item' is NULL (it failed earlier: %s)",
                             earlier);
    }
    mpri_value_check_live(item, __func__);
    if (!list) {
        mpr_value_release(item);
        return mpri_null_arg(__func__, "list");
    }
    mpri_value_check_live(list, __func__);
    if (list->kind != MPR_VALUE_LIST) {
        mpr_value_release(item);
        return kind_mismatch(list, MPR_VALUE_LIST);
    }
    if (list->u.list.len == list->u.list.cap) {
        size_t cap = list->u.list.cap ? list->u.list.cap * 2 : 4;
        mpr_value_t **items = realloc(list->u.list.items, cap * sizeof *items);
        if (!items) {
            mpr_value_release(item);
            return mpr_error_set(MPR_ERR_NOMEM, "list append: out of memory");
        }
        list->u.list.items = items;
        list->u.list.cap = cap;
    }
    list->u.list.items[list->u.list.len++] = item;
    return MPR_OK;
}

static mpr_err_t args_item(const mpr_value_t *args, size_t i, mpr_value_kind_t want,
                           const mpr_value_t **out) {
    if (args) mpri_value_check_live(args, "mpr_args");
    if (!args || args->kind != MPR_VALUE_LIST)
        return mpr_error_set(MPR_ERR_TYPE, "arguments: expected a list, got %s",
                             args ? mpr_value_kind_name(args->kind) : "no arguments");
    if (i >= args->u.list.len)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "argument %zu missing (got %zu arguments)", i,
                             args->u.list.len);
    const mpr_value_t *v = args->u.list.items[i];
    bool ok = v->kind == want || (want == MPR_VALUE_DOUBLE && v->kind == MPR_VALUE_INT);
    if (!ok)
        return mpr_error_set(MPR_ERR_TYPE, "argument %zu: expected %s, got %s", i,
                             mpr_value_kind_name(want), mpr_value_kind_name(v->kind));
    *out = v;
    return MPR_OK;
}

mpr_err_t mpr_args_int(const mpr_value_t *args, size_t i, int64_t *out) {
    if (out) *out = 0;
    MPRI_ARG_NONNULL(args);
    MPRI_ARG_NONNULL(out);
    const mpr_value_t *v;
    mpr_err_t e = args_item(args, i, MPR_VALUE_INT, &v);
    return e ? e : mpr_value_get_int(v, out);
}

mpr_err_t mpr_args_double(const mpr_value_t *args, size_t i, double *out) {
    if (out) *out = 0;
    MPRI_ARG_NONNULL(args);
    MPRI_ARG_NONNULL(out);
    const mpr_value_t *v;
    mpr_err_t e = args_item(args, i, MPR_VALUE_DOUBLE, &v);
    return e ? e : mpr_value_get_double(v, out);
}

mpr_err_t mpr_args_string(const mpr_value_t *args, size_t i, const char **out) {
    if (out) *out = NULL;
    MPRI_ARG_NONNULL(args);
    MPRI_ARG_NONNULL(out);
    const mpr_value_t *v;
    mpr_err_t e = args_item(args, i, MPR_VALUE_STRING, &v);
    return e ? e : mpr_value_get_string(v, out);
}

mpr_err_t mpr_args_tensor(const mpr_value_t *args, size_t i, mpr_tensor_t **out) {
    if (out) *out = NULL;
    MPRI_ARG_NONNULL(args);
    MPRI_ARG_NONNULL(out);
    const mpr_value_t *v;
    mpr_err_t e = args_item(args, i, MPR_VALUE_TENSOR, &v);
    return e ? e : mpr_value_get_tensor(v, out);
}

static bool tensor_equal(mpr_tensor_t *a, mpr_tensor_t *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    if (a->storage->device >= 0 || b->storage->device >= 0) return a == b;
    mpr_tensor_t *ca = mpr_tensor_contiguous(a), *cb = mpr_tensor_contiguous(b);
    bool eq = ca && cb && memcmp(mpr_tensor_data(ca), mpr_tensor_data(cb), mpr_tensor_nbytes(ca)) == 0;
    mpr_tensor_release(ca);
    mpr_tensor_release(cb);
    return eq;
}

bool mpr_value_equal(const mpr_value_t *a, const mpr_value_t *b) {
    MPRI_ARG_NONNULL_OR(a, false);
    MPRI_ARG_NONNULL_OR(b, false);
    mpri_value_check_live(a, __func__);
    mpri_value_check_live(b, __func__);
    if (a == b) return true;
    if (a->kind != b->kind) return false;
    switch (a->kind) {
    case MPR_VALUE_NONE: return true;
    case MPR_VALUE_BOOL: return a->u.b == b->u.b;
    case MPR_VALUE_INT: return a->u.i == b->u.i;
    case MPR_VALUE_DOUBLE: return a->u.d == b->u.d || (a->u.d != a->u.d && b->u.d != b->u.d);
    case MPR_VALUE_STRING:
    case MPR_VALUE_BYTES:
        return a->u.bytes.len == b->u.bytes.len &&
               memcmp(a->u.bytes.data, b->u.bytes.data, a->u.bytes.len) == 0;
    case MPR_VALUE_TENSOR: return tensor_equal(a->u.tensor, b->u.tensor);
    case MPR_VALUE_WORKER:
        return a->u.worker->rank == b->u.worker->rank && strcmp(a->u.worker->name, b->u.worker->name) == 0;
    case MPR_VALUE_LIST:
        if (a->u.list.len != b->u.list.len) return false;
        for (size_t i = 0; i < a->u.list.len; i++)
            if (!mpr_value_equal(a->u.list.items[i], b->u.list.items[i])) return false;
        return true;
    default: return a->u.opaque == b->u.opaque;
    }
}
