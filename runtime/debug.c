/* debug.c — helpers of mpr_debug_dump (world.c) shared by the files that
 * describe their state: taking a lock without hanging on a stuck holder.
 *
 * Invariant: a describe function never waits more than 200 ms for any one
 * lock, so a dump finishes even while a thread is stuck holding one; it
 * then names the holder (glibc records it in the mutex) instead. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include "mpri_runtime.h"

#define DESCRIBE_LOCK_WAIT_NS 200000000L

bool mpri_describe_lock(FILE *out, pthread_mutex_t *m, const char *what) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* pthread_mutex_timedlock's clock */
    ts.tv_nsec += DESCRIBE_LOCK_WAIT_NS;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    int rc = pthread_mutex_timedlock(m, &ts);
    if (rc == 0) return true;
#ifdef __GLIBC__
    int owner = m->__data.__owner; /* a racy read, for a person to look at */
    fprintf(out, "  %s: not listed: its lock is held (by thread %d) for over 200 ms\n", what, owner);
#else
    fprintf(out, "  %s: not listed: its lock is held for over 200 ms\n", what);
#endif
    return false;
}
