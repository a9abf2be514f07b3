/* mpri_pool.h — the worker pool that runs request handlers and callbacks
 * (not installed).
 *
 * Tasks are (function, argument) pairs in a ring buffer (no allocation per
 * task). A pool thread that must wait (a handler calling rpc_sync) runs other
 * queued tasks meanwhile (mpri_pool_try_run_one), so nested calls never
 * deadlock the pool however small it is. */
#ifndef MPRI_POOL_H
#define MPRI_POOL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>

#include "mpirpc/error.h"

typedef void (*mpri_task_fn_t)(void *arg);

mpr_err_t mpri_pool_start(int nthreads);
/* Stop and join the threads. Tasks still queued are passed to their `drop`
 * function (see mpri_pool_submit) or run if they have none. */
void mpri_pool_stop(void);

/* Queue `fn(arg)`. `drop(arg)` (may be NULL) is called instead of `fn` if the
 * pool stops before running it. Returns MPR_ERR_NOMEM if the queue cannot grow. */
mpr_err_t mpri_pool_submit(mpri_task_fn_t fn, mpri_task_fn_t drop, void *arg);
/* Fault injection for tests: while positive, each submit fails with
 * MPR_ERR_NOMEM (as when the queue cannot grow) and decrements it. */
extern atomic_int mpri_pool_fail_submits;

/* How an idle worker polls the runtime (progress.c installs it; the pool
 * knows nothing of progress): enter/leave bracket a polling stretch, poll
 * returns the events handled. Until installed, idle workers only spin. */
typedef struct mpri_pool_poller {
    void (*enter)(void);
    void (*leave)(bool handoff); /* as mpri_wait_hooks_t's */
    int (*poll)(void);
} mpri_pool_poller_t;
void mpri_pool_set_poller(const mpri_pool_poller_t *poller);

/* Run one queued task in the calling thread, if any. */
bool mpri_pool_try_run_one(void);

/* Tasks queued plus running. */
int mpri_pool_busy(void);
/* Tasks queued, not yet running. */
int mpri_pool_queued(void);
/* Idle workers spinning (they take a queued task without a wake-up). */
int mpri_pool_spinning(void);
bool mpri_pool_running(void);
/* True on a pool thread, or on any thread while it runs a pool task (a
 * waiter helping): such code is serving incoming work. */
bool mpri_on_pool_thread(void);
/* A few lines on the pool's state (mpr_debug_dump). */
void mpri_pool_describe(FILE *out);

#endif
