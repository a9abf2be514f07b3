/* mpri_refcount.h — dropping one reference to a refcounted runtime object
 * (values, tensors, storages, tensor blocks) without an atomic
 * read-modify-write when the caller holds the last one.
 *
 * Invariant this relies on (kept by every object that uses it): a
 * reference is only ever taken by a thread that already holds one — no
 * table or weak pointer revives an object from its count. So when the
 * count reads 1 while the caller holds a reference, that reference is the
 * only one and no other thread can change the count: the object dies
 * without the locked instruction (the acquire load pairs with the
 * acq_rel decrements of earlier releases on other threads, exactly as the
 * fetch_sub would). Counts below 1 mean a release too many: abort. */
#ifndef MPRI_REFCOUNT_H
#define MPRI_REFCOUNT_H

#include <stdatomic.h>
#include <stdbool.h>

#include "mpri_assert.h"

/* Drop `n` >= 1 references the caller holds; returns how many references
 * are left (0: they were the last; the caller frees the object). */
static inline long mpri_refcount_drop_n(atomic_long *count, long n) {
    long seen = atomic_load_explicit(count, memory_order_acquire);
    if (seen == n) {
        atomic_store_explicit(count, 0, memory_order_relaxed); /* only for debuggers: nobody reads it */
        return 0;
    }
    seen = atomic_fetch_sub_explicit(count, n, memory_order_acq_rel);
    MPRI_ASSERT(seen >= n, "a reference count stays positive while references are held "
                           "(released more often than retained?)");
    return seen - n;
}

/* Drop the caller's one reference; true if it was the last. */
static inline bool mpri_refcount_drop(atomic_long *count) { return mpri_refcount_drop_n(count, 1) == 0; }

#endif
