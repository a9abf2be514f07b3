/* host_alloc.c — 64-byte-aligned CPU allocations with a cache of large
 * freed blocks (at least 1 MiB), so repeated large tensors skip the
 * allocator's mmap/munmap round trip.
 *
 * The cache has 8 slots and a byte budget (MPIRPC_HOST_CACHE_MB, default
 * 512, read once); one mutex guards it; mpri_host_cache_trim empties it.
 *
 * Invariants: a cached block is owned by the cache alone until handed out;
 * blocks are matched by their rounded size (a multiple of 64 B below 1 MiB,
 * of 64 KiB from 1 MiB), which both alloc and free compute from the
 * caller's `nbytes`, so free must be given the nbytes of the alloc; the
 * cache never holds more than its byte budget. */
#include "mpri_host_alloc.h"

#include <pthread.h>
#include <stdlib.h>

#define CACHE_MIN ((size_t)1 << 20)
#define CACHE_SLOTS 8

static struct {
    pthread_mutex_t lock;
    void *block[CACHE_SLOTS];
    size_t size[CACHE_SLOTS];
    size_t total, budget;
    int budget_read;
} cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

static size_t rounded(size_t nbytes) {
    size_t g = nbytes >= CACHE_MIN ? (size_t)1 << 16 : 64;
    size_t r = (nbytes + g - 1) & ~(g - 1);
    return r ? r : 64;
}

static size_t budget_locked(void) {
    if (!cache.budget_read) {
        const char *env = getenv("MPIRPC_HOST_CACHE_MB");
        cache.budget = (env ? (size_t)strtoull(env, NULL, 10) : 512) << 20;
        cache.budget_read = 1;
    }
    return cache.budget;
}

void *mpri_host_alloc(size_t nbytes) {
    size_t r = rounded(nbytes);
    if (r >= CACHE_MIN) {
        pthread_mutex_lock(&cache.lock);
        for (int i = 0; i < CACHE_SLOTS; i++)
            if (cache.block[i] && cache.size[i] == r) {
                void *p = cache.block[i];
                cache.block[i] = NULL;
                cache.total -= r;
                pthread_mutex_unlock(&cache.lock);
                return p;
            }
        pthread_mutex_unlock(&cache.lock);
    }
    return aligned_alloc(64, r);
}

void mpri_host_free(void *p, size_t nbytes) {
    if (!p) return;
    size_t r = rounded(nbytes);
    if (r >= CACHE_MIN) {
        pthread_mutex_lock(&cache.lock);
        if (cache.total + r <= budget_locked())
            for (int i = 0; i < CACHE_SLOTS; i++)
                if (!cache.block[i]) {
                    cache.block[i] = p;
                    cache.size[i] = r;
                    cache.total += r;
                    pthread_mutex_unlock(&cache.lock);
                    return;
                }
        pthread_mutex_unlock(&cache.lock);
    }
    free(p);
}

void mpri_host_cache_trim(void) {
    pthread_mutex_lock(&cache.lock);
    for (int i = 0; i < CACHE_SLOTS; i++) {
        free(cache.block[i]);
        cache.block[i] = NULL;
    }
    cache.total = 0;
    pthread_mutex_unlock(&cache.lock);
}
