/* small_alloc.c — per-thread caches of small 64-byte-aligned blocks (the
 * contract is in mpri_small_alloc.h).
 *
 * Invariants: class c holds blocks of (c + 1) * 64 bytes; a thread's list c
 * holds exactly count[c] <= MPRI_SMALL_CACHE_BLOCKS blocks, each owned by
 * nobody else; a thread with a non-empty cache has it registered with the
 * key, so its exit flushes it (a flush unregisters it; a later push
 * registers it again, also from inside another key's destructor). */
#include "mpri_small_alloc.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_assert.h"

#if defined(__SANITIZE_ADDRESS__)
#define SMALL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SMALL_ASAN 1
#endif
#endif
#ifdef SMALL_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define CLASS_BYTES 64
#define NCLASSES (MPRI_SMALL_MAX / CLASS_BYTES)

typedef struct free_block {
    struct free_block *next;
} free_block_t;

typedef struct {
    free_block_t *head[NCLASSES];
    uint8_t count[NCLASSES];
    bool registered;
} thread_cache_t;

_Static_assert(MPRI_SMALL_CACHE_BLOCKS <= UINT8_MAX, "counts fit a byte");

static _Thread_local thread_cache_t cache;
static atomic_bool caching_off; /* mpri_small_cache_disable */
static pthread_key_t cache_key;
static pthread_once_t cache_key_once = PTHREAD_ONCE_INIT;
static bool cache_key_ok;

static void flush(thread_cache_t *c) {
    for (int k = 0; k < NCLASSES; k++) {
        while (c->head[k]) {
            free_block_t *b = c->head[k];
            UNPOISON(b, (size_t)(k + 1) * CLASS_BYTES);
            c->head[k] = b->next;
            free(b);
        }
        c->count[k] = 0;
    }
    c->registered = false;
}

static void on_thread_exit(void *arg) { flush(arg); }

static void make_key(void) { cache_key_ok = pthread_key_create(&cache_key, on_thread_exit) == 0; }

/* The size class of `nbytes` (<= MPRI_SMALL_MAX), or -1. */
static inline int class_of(size_t nbytes) {
    return nbytes - 1 < MPRI_SMALL_MAX ? (int)((nbytes - 1) / CLASS_BYTES) : -1;
}

void *mpri_small_alloc(size_t nbytes) {
    int k = class_of(nbytes);
    if (k < 0) return nbytes ? aligned_alloc(CLASS_BYTES, (nbytes + CLASS_BYTES - 1) & ~(size_t)(CLASS_BYTES - 1)) : NULL;
    free_block_t *b = cache.head[k];
    if (b) { /* (empty while caching is off) */
        UNPOISON(b, (size_t)(k + 1) * CLASS_BYTES);
        cache.head[k] = b->next;
        cache.count[k]--;
        return b;
    }
    return aligned_alloc(CLASS_BYTES, (size_t)(k + 1) * CLASS_BYTES);
}

void *mpri_small_calloc(size_t nbytes) {
    void *p = mpri_small_alloc(nbytes);
    if (p) memset(p, 0, nbytes);
    return p;
}

void mpri_small_free(void *p, size_t nbytes) {
    if (!p) return;
    int k = class_of(nbytes);
    if (k < 0 || cache.count[k] >= MPRI_SMALL_CACHE_BLOCKS ||
        atomic_load_explicit(&caching_off, memory_order_relaxed)) {
        free(p);
        return;
    }
    MPRI_ASSERT(((uintptr_t)p & (CLASS_BYTES - 1)) == 0, "mpri_small_free: a block not from mpri_small_alloc");
    if (!cache.registered) {
        pthread_once(&cache_key_once, make_key);
        /* No key: the cache would outlive its thread; do not cache. */
        if (!cache_key_ok || pthread_setspecific(cache_key, &cache) != 0) {
            free(p);
            return;
        }
        cache.registered = true;
    }
    free_block_t *b = p;
    b->next = cache.head[k];
    cache.head[k] = b;
    cache.count[k]++;
    POISON((char *)b + sizeof *b, (size_t)(k + 1) * CLASS_BYTES - sizeof *b);
}

void mpri_small_cache_flush(void) {
    if (cache.registered && cache_key_ok) pthread_setspecific(cache_key, NULL);
    flush(&cache);
}

void mpri_small_cache_disable(void) {
    atomic_store(&caching_off, true);
    mpri_small_cache_flush();
}

size_t mpri_small_cache_blocks(void) {
    size_t n = 0;
    for (int k = 0; k < NCLASSES; k++) n += cache.count[k];
    return n;
}
