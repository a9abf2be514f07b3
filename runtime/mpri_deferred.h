/* mpri_deferred.h — releases put off to a moment when some thread has
 * nothing better to do (not installed).
 *
 * A caller on a critical path (mpr_dist_context_end: the gradients and the
 * graph of a whole context) queues the release instead of running it; it
 * runs when a thread next waits on a future (it is about to spin anyway),
 * when the progress thread goes idle or finds an item 1 ms old, when a
 * count of live objects is asked for, and at shutdown; and by the caller
 * itself when the queue is full (MPRI_DEFERRED_MAX items), so the memory
 * it holds stays bounded even if nothing ever waits.
 *
 * Ownership: an item's `arg` belongs to the queue until its `fn` has run;
 * `fn` runs exactly once, on some thread of this process: one about to
 * wait (never inside mpri_progress_poll), the progress thread between
 * polls, or a caller of the functions below. It may send messages and
 * release objects; it must not wait on a future or take a lock its queuer
 * could hold while waiting. */
#ifndef MPRI_DEFERRED_H
#define MPRI_DEFERRED_H

#include <stdbool.h>
#include <stdint.h>

#define MPRI_DEFERRED_MAX 16

typedef void (*mpri_deferred_fn_t)(void *arg);

/* Queue fn(arg); with the queue full, the queued items and this one run now. */
void mpri_defer(mpri_deferred_fn_t fn, void *arg);

/* Run what is queued unless another thread is running items already
 * (a waiter's or the idle progress thread's opportunistic turn); cheap when
 * nothing is queued. */
void mpri_deferred_run_some(void);

/* The progress thread's turn: run what is queued if the oldest item has
 * waited `age_ns` or more, so items get out within about that long even
 * while no thread waits and the progress thread is never idle for long (a
 * busy server, or sends in flight). Cheap when nothing is queued. */
void mpri_deferred_run_overdue(int64_t age_ns);

/* Run everything queued before the call, waiting for a thread that is
 * running items to finish them (counts of live objects, shutdown). */
void mpri_deferred_flush(void);

/* Items queued and not yet run (for tests). */
int mpri_deferred_pending(void);

#endif
