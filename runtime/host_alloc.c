/* host_alloc.c — 64-byte-aligned CPU allocations with a cache of freed
 * blocks of at least 64 KiB, so the tensors a training step frees and makes
 * again skip the allocator's mmap/munmap round trip and the page faults of
 * fresh memory (a pipeline stage's CPU time fell 10-16%, its page faults
 * 29k -> 9k over 30 steps).
 *
 * Why from 64 KiB, not only for large blocks: glibc raises its mmap and
 * trim thresholds when it sees a large mmapped block freed. A cache that
 * keeps every large block from glibc leaves them at 128 KiB for the whole
 * run, so the medium blocks it does not keep (64-256 KiB: a batch of
 * activations) were mmapped, or trimmed off the heap, and faulted in again
 * at every step: bench_tensor's MLP step took 1.03-1.05 ms after its sgemm
 * part instead of 0.59 (6.3k page faults against 3.6k); from 64 KiB, 0.59 ms
 * and 2.5k.
 *
 * The cache has 64 slots and a byte budget (MPIRPC_HOST_CACHE_MB, default
 * 512, read once); when it is full, or a block would go over the budget,
 * cached blocks are freed in slot order from a rotating position (a ring:
 * the oldest first while the slots fill in order, roughly the oldest
 * after that), so the cache follows the sizes in use now. One mutex
 * guards it; mpri_host_cache_trim empties it.
 *
 * Blocks of 1 MiB and more are this file's own anonymous mappings,
 * prefaulted when made (MAP_POPULATE, or MADV_POPULATE_WRITE), and from
 * 2 MiB aligned to 2 MiB and marked MADV_HUGEPAGE (transparent huge pages;
 * MPIRPC_HOST_HUGEPAGES=0 turns that off). On the development VM a demand
 * fault costs ~10 us a 4 KiB page: a fresh 1 MiB block took 2.6 ms to
 * allocate and fill, 0.47 ms prefaulted; 16 MiB 45 ms, 0.73 ms prefaulted
 * on huge pages; 64 MiB 188 ms, 5.5 ms. A kernel without the madvise
 * requests just ignores them (demand faults as before).
 *
 * Invariants: a cached block is owned by the cache alone until handed out;
 * blocks are matched by their rounded size (a multiple of 64 B below
 * 64 KiB, of 4 KiB up to 1 MiB, of 64 KiB from 1 MiB: at most 1/16 more
 * than asked), which both alloc and free compute from
 * the caller's `nbytes`, so free must be given the nbytes of the alloc; a
 * block of rounded size >= MAP_MIN is a mapping of exactly that size and
 * goes back with munmap (release_block), never free(); the cache never
 * holds more than its byte budget; `total` is the sum of the cached blocks'
 * sizes. */
#include "mpri_host_alloc.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h> /* own mappings are leak-check roots: tensors in a slab point to storages */
#define ROOT_REGION_ADD(p, n) __lsan_register_root_region((p), (n))
#define ROOT_REGION_DEL(p, n) __lsan_unregister_root_region((p), (n))
#else
#define ROOT_REGION_ADD(p, n) ((void)0)
#define ROOT_REGION_DEL(p, n) ((void)0)
#endif

#define CACHE_MIN ((size_t)64 << 10)
#define COARSE_MIN ((size_t)1 << 20) /* from here sizes round to 64 KiB, below to 4 KiB */
#define MAP_MIN COARSE_MIN           /* from here blocks are own mappings (map_block) */
#define HUGE_PAGE ((size_t)2 << 20)
#define CACHE_SLOTS 64

static struct {
    pthread_mutex_t lock;
    void *block[CACHE_SLOTS];
    size_t size[CACHE_SLOTS];
    uint64_t freed_at[CACHE_SLOTS]; /* `clock` when the block came in */
    uint64_t clock;
    size_t total, budget;
    int budget_read;
    int next_evict; /* the slot to evict next when the cache is full or over budget */
} cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

static size_t rounded(size_t nbytes) {
    size_t g = nbytes >= COARSE_MIN ? (size_t)1 << 16 : nbytes >= CACHE_MIN ? (size_t)1 << 12 : 64;
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

static bool hugepages_wanted(void) {
    static int wanted = -1; /* read once; a race reads the same value twice */
    if (wanted < 0) {
        const char *env = getenv("MPIRPC_HOST_HUGEPAGES");
        wanted = !(env && !strcmp(env, "0"));
    }
    return wanted;
}

/* A prefaulted anonymous mapping of r bytes (a multiple of 64 KiB, >= MAP_MIN). */
static void *map_block(size_t r) {
#if defined(MADV_HUGEPAGE) && defined(MADV_POPULATE_WRITE)
    if (r >= HUGE_PAGE && hugepages_wanted()) { /* map more, keep the 2 MiB-aligned part, then fault it in */
        size_t len = r + HUGE_PAGE;
        char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
        char *a = (char *)(((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
        if (a > p) munmap(p, (size_t)(a - p));
        if (p + len > a + r) munmap(a + r, (size_t)(p + len - (a + r)));
        (void)madvise(a, r, MADV_HUGEPAGE);       /* advice: refused where THP is off */
        (void)madvise(a, r, MADV_POPULATE_WRITE); /* an older kernel: demand faults instead */
        ROOT_REGION_ADD(a, r);
        return a;
    }
#endif
    void *p = mmap(NULL, r, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) return NULL;
    ROOT_REGION_ADD(p, r);
    return p;
}

/* Give a block of rounded size r back to the system. */
static void release_block(void *p, size_t r) {
    if (!p) return;
    if (r >= MAP_MIN) {
        ROOT_REGION_DEL(p, r);
        munmap(p, r);
    } else
        free(p);
}

void *mpri_host_alloc(size_t nbytes) {
    size_t r = rounded(nbytes);
    if (r >= CACHE_MIN) {
        pthread_mutex_lock(&cache.lock);
        int best = -1; /* the matching block freed last: still in the CPU caches */
        for (int i = 0; i < CACHE_SLOTS; i++)
            if (cache.block[i] && cache.size[i] == r && (best < 0 || cache.freed_at[i] > cache.freed_at[best]))
                best = i;
        if (best >= 0) {
            void *p = cache.block[best];
            cache.block[best] = NULL;
            cache.total -= r;
            pthread_mutex_unlock(&cache.lock);
            return p;
        }
        pthread_mutex_unlock(&cache.lock);
    }
    return r >= MAP_MIN ? map_block(r) : aligned_alloc(64, r);
}

void mpri_host_free(void *p, size_t nbytes) {
    if (!p) return;
    size_t r = rounded(nbytes);
    if (r >= CACHE_MIN) {
        pthread_mutex_lock(&cache.lock);
        void *evicted = NULL;
        size_t evicted_size = 0;
        if (r <= budget_locked()) {
            int slot = -1;
            for (int i = 0; i < CACHE_SLOTS && slot < 0; i++)
                if (!cache.block[i]) slot = i;
            if (slot < 0) { /* full: the oldest block makes room */
                slot = cache.next_evict;
                cache.next_evict = (cache.next_evict + 1) % CACHE_SLOTS;
                evicted = cache.block[slot];
                evicted_size = cache.size[slot];
                cache.total -= cache.size[slot];
                cache.block[slot] = NULL;
            }
            while (cache.total + r > cache.budget) { /* over budget: evict in order */
                int j = cache.next_evict;
                cache.next_evict = (cache.next_evict + 1) % CACHE_SLOTS;
                if (cache.block[j]) {
                    release_block(cache.block[j], cache.size[j]);
                    cache.total -= cache.size[j];
                    cache.block[j] = NULL;
                }
            }
            cache.block[slot] = p;
            cache.size[slot] = r;
            cache.freed_at[slot] = ++cache.clock;
            cache.total += r;
            pthread_mutex_unlock(&cache.lock);
            release_block(evicted, evicted_size);
            return;
        }
        pthread_mutex_unlock(&cache.lock);
    }
    release_block(p, r);
}

void mpri_host_cache_stats(size_t *blocks, size_t *bytes) {
    pthread_mutex_lock(&cache.lock);
    size_t n = 0;
    for (int i = 0; i < CACHE_SLOTS; i++) n += cache.block[i] != NULL;
    *blocks = n;
    *bytes = cache.total;
    pthread_mutex_unlock(&cache.lock);
}

void mpri_host_cache_trim(void) {
    pthread_mutex_lock(&cache.lock);
    for (int i = 0; i < CACHE_SLOTS; i++) {
        release_block(cache.block[i], cache.size[i]);
        cache.block[i] = NULL;
    }
    cache.total = 0;
    pthread_mutex_unlock(&cache.lock);
}
