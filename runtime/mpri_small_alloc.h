/* mpri_small_alloc.h — per-thread caches of small blocks for the objects an
 * autograd step or a message makes by the dozen (not installed).
 *
 * An 8x8 autograd step allocates and frees ~30 small objects (tensor
 * structs, storages with their bytes, graph nodes, autograd metadata).
 * glibc's per-thread cache holds 7 blocks per size, so most of them reach
 * its arena, where frees next to the top chunk consolidate the fast bins:
 * malloc and free were ~40% of a local step and of a backward piece.
 * Each thread here keeps up to MPRI_SMALL_CACHE_BLOCKS freed blocks per
 * 64-byte size class up to MPRI_SMALL_MAX bytes and hands them out again
 * without a lock or an atomic.
 *
 * Contract:
 * - Blocks are 64-byte aligned and come from aligned_alloc, so free() is
 *   always a valid way to release one (a block freed that way is simply not
 *   cached). mpri_small_free needs the size given at allocation.
 * - A block may be freed on any thread: it joins that thread's cache (a
 *   producer/consumer pair of threads makes the consumer's cache fill and
 *   overflow to free(); memory stays bounded).
 * - A thread's cache goes back to the system when the thread exits (a key
 *   destructor) or on mpri_small_cache_flush; the main thread's, at exit,
 *   stays reachable from its thread-local storage (not a leak).
 * - Larger requests go straight to aligned_alloc / free.
 * - Under AddressSanitizer a cached block is poisoned (but for the link
 *   word), so a use after mpri_small_free is still reported. */
#ifndef MPRI_SMALL_ALLOC_H
#define MPRI_SMALL_ALLOC_H

#include <stddef.h>

#define MPRI_SMALL_MAX 1024        /* the largest cached block size */
#define MPRI_SMALL_CACHE_BLOCKS 32 /* per size class and thread */

/* A 64-byte aligned block of at least `nbytes` (> 0), uninitialised; NULL
 * when out of memory. */
void *mpri_small_alloc(size_t nbytes);
/* The same, zeroed. */
void *mpri_small_calloc(size_t nbytes);
/* Release `p` from mpri_small_alloc/_calloc(nbytes). NULL is a no-op. */
void mpri_small_free(void *p, size_t nbytes);
/* Give this thread's cached blocks back to the system. */
void mpri_small_cache_flush(void);
/* From now on every block goes straight to the system, on every thread
 * (this thread's cache is flushed; others' only by their own flush or exit).
 * For tests that count live blocks or inject allocation failures: call it
 * before any other thread starts. */
void mpri_small_cache_disable(void);
/* How many blocks this thread's cache holds (tests). */
size_t mpri_small_cache_blocks(void);

#endif
