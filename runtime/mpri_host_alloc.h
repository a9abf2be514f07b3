/* mpri_host_alloc.h — CPU memory for tensor storages, with a small cache of
 * large blocks (not installed).
 *
 * Fresh multi-megabyte allocations would pay a page fault per 4 KiB on
 * first touch; a receive of a 64 MiB tensor would spend as long faulting as
 * copying. So blocks of 1 MiB and more are mapped prefaulted (on
 * transparent huge pages from 2 MiB; MPIRPC_HOST_HUGEPAGES=0: not), and
 * freed blocks of at least 64 KiB are kept (up to 64 blocks, 512 MiB in
 * all, or MPIRPC_HOST_CACHE_MB; the oldest go first) and handed out again
 * for the same rounded size. */
#ifndef MPRI_HOST_ALLOC_H
#define MPRI_HOST_ALLOC_H

#include <stddef.h>

/* 64-byte aligned block of at least `nbytes`; NULL when out of memory. */
void *mpri_host_alloc(size_t nbytes);
/* Return a block from mpri_host_alloc(nbytes) (same `nbytes`). NULL is a no-op. */
void mpri_host_free(void *p, size_t nbytes);
/* How many blocks and bytes the cache holds now (tests, debugging). */
void mpri_host_cache_stats(size_t *blocks, size_t *bytes);
/* Free every cached block (runtime shutdown, tests). */
void mpri_host_cache_trim(void);

#endif
