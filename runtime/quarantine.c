/* quarantine.c — delayed free of released values and tensors (debug builds)
 * and the abort used when a caller touches a released object.
 *
 * Invariant: the ring holds at most MPRI_QUARANTINE_SLOTS pointers, each freed
 * exactly once (when pushed out of the ring); the ring is guarded by one
 * mutex and only used when MPRI_DEBUG_CHECKS is on. */
#include "mpri_quarantine.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "mpri_assert.h"

#if MPRI_DEBUG_CHECKS
static void *ring[MPRI_QUARANTINE_SLOTS];
static size_t ring_next;
static pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER;
#endif

void mpri_quarantine_free(void *p) {
#if MPRI_DEBUG_CHECKS
    pthread_mutex_lock(&ring_lock);
    void *old = ring[ring_next];
    ring[ring_next] = p;
    ring_next = (ring_next + 1) % MPRI_QUARANTINE_SLOTS;
    pthread_mutex_unlock(&ring_lock);
    free(old);
#else
    free(p);
#endif
}

void mpri_misuse_abort(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("mpirpc: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    abort();
}
