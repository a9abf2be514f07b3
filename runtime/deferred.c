/* deferred.c — the queue of releases put off to an idle moment
 * (mpri_deferred.h): a ring of MPRI_DEFERRED_MAX items under queue_lock,
 * run by whichever thread holds run_lock.
 *
 * Why: after mpr_dist_context_end the caller's next step is usually an RPC,
 * and it then spins waiting for the reply; freeing the ended context's
 * gradients and graph there instead of before the call takes that work off
 * the step's critical path (an 8x8 dist autograd step, issue #12).
 *
 * Invariants (MPRI_ASSERT): 0 <= len <= MPRI_DEFERRED_MAX; an item is taken
 * out of the ring under queue_lock before it runs, so it runs once; one
 * thread runs items at a time (run_lock), so a flush that got run_lock
 * knows every item queued before it began has run or is run by it; a
 * thread running items never starts another run (a release that asks for a
 * count of live objects does not deadlock on run_lock). */
#include "mpri_deferred.h"

#include <pthread.h>
#include <stdatomic.h>

#include "mpri_assert.h"
#include "mpri_event.h"

typedef struct {
    mpri_deferred_fn_t fn;
    void *arg;
} item_t;

static struct {
    pthread_mutex_t queue_lock; /* guards items, head, len */
    pthread_mutex_t run_lock;   /* held by the one thread running items */
    item_t items[MPRI_DEFERRED_MAX];
    int head, len;
    atomic_int pending;        /* mirrors len, for the lock-free check of run_some */
    _Atomic int64_t oldest_ns; /* when the ring last went from empty to not (mpri_now_ns) */
} q = {.queue_lock = PTHREAD_MUTEX_INITIALIZER, .run_lock = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local bool running_here;

/* Run items until the ring is empty (run_lock held by this thread). */
static void run_items_locked(void) {
    running_here = true;
    for (;;) {
        pthread_mutex_lock(&q.queue_lock);
        MPRI_ASSERT(q.len >= 0 && q.len <= MPRI_DEFERRED_MAX, "the deferred ring holds 0..MAX items");
        if (q.len == 0) {
            pthread_mutex_unlock(&q.queue_lock);
            break;
        }
        item_t it = q.items[q.head];
        q.items[q.head] = (item_t){0};
        q.head = (q.head + 1) % MPRI_DEFERRED_MAX;
        q.len--;
        atomic_store_explicit(&q.pending, q.len, memory_order_relaxed);
        pthread_mutex_unlock(&q.queue_lock);
        MPRI_ASSERT(it.fn, "a queued deferred item has a function");
        it.fn(it.arg);
    }
    running_here = false;
}

void mpri_deferred_flush(void) {
    if (running_here) return; /* called from inside an item: the run in progress finishes the ring */
    pthread_mutex_lock(&q.run_lock);
    run_items_locked();
    pthread_mutex_unlock(&q.run_lock);
}

void mpri_deferred_run_some(void) {
    if (atomic_load_explicit(&q.pending, memory_order_relaxed) == 0 || running_here) return;
    if (pthread_mutex_trylock(&q.run_lock) != 0) return; /* another thread is at it */
    run_items_locked();
    pthread_mutex_unlock(&q.run_lock);
}

void mpri_defer(mpri_deferred_fn_t fn, void *arg) {
    MPRI_ASSERT(fn, "mpri_defer needs a function");
    for (;;) {
        pthread_mutex_lock(&q.queue_lock);
        if (q.len < MPRI_DEFERRED_MAX) {
            q.items[(q.head + q.len) % MPRI_DEFERRED_MAX] = (item_t){fn, arg};
            if (q.len++ == 0) atomic_store_explicit(&q.oldest_ns, mpri_now_ns(), memory_order_relaxed);
            atomic_store_explicit(&q.pending, q.len, memory_order_relaxed);
            pthread_mutex_unlock(&q.queue_lock);
            return;
        }
        pthread_mutex_unlock(&q.queue_lock);
        if (running_here) { /* full while this thread runs items: no room will come, run it now */
            fn(arg);
            return;
        }
        mpri_deferred_flush(); /* full: the queued items run here, then this one is queued */
    }
}

void mpri_deferred_run_overdue(int64_t age_ns) {
    if (atomic_load_explicit(&q.pending, memory_order_relaxed) == 0) return;
    if (mpri_now_ns() - atomic_load_explicit(&q.oldest_ns, memory_order_relaxed) < age_ns) return;
    mpri_deferred_run_some();
}

int mpri_deferred_pending(void) { return atomic_load(&q.pending); }
