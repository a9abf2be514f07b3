/* mpri_future.h — runtime-side completion of futures (not installed). */
#ifndef MPRI_FUTURE_H
#define MPRI_FUTURE_H

#include <stdint.h>

#include "mpirpc/future.h"

/* Complete `f` from inside the runtime: with `value` (ownership taken; NULL =
 * none) when code is MPR_OK, else with the error (message copied). Callbacks
 * are handed to the worker pool when the pool runs (never run on the progress
 * thread or inside a poll). Returns MPR_ERR_STATE if already completed. */
mpr_err_t mpri_future_complete(mpr_future_t *f, mpr_err_t code, const char *message,
                               mpr_value_t *value);

/* Complete `f` (as mpri_future_complete) with remote failure `re` (copied):
 * code MPR_ERR_REMOTE, its text as the message (runtime/mpri_error.h). */
struct mpri_remote_error;
mpr_err_t mpri_future_complete_remote(mpr_future_t *f, const struct mpri_remote_error *re);
/* The origin of a completed future's MPR_ERR_REMOTE failure (borrowed), or
 * NULL (pending, another outcome, or unknown). */
const struct mpri_remote_error *mpri_future_remote_error(const mpr_future_t *f);
/* Mark a future the runtime creates for an outgoing request: the user's
 * mpr_future_set_result/_error on it is refused (MPR_ERR_STATE). Call before
 * the future is shared. */
void mpri_future_mark_runtime_owned(mpr_future_t *f);

/* Borrowed result of a completed successful future (NULL otherwise). */
mpr_value_t *mpri_future_value(const mpr_future_t *f);

/* Run `fn(f, arg)` once `f` completes (now, in this thread, if it already
 * has; otherwise as mpr_future_then's callbacks run). */
mpr_err_t mpri_future_on_complete(mpr_future_t *f, void (*fn)(mpr_future_t *f, void *arg), void *arg);
/* The same, and when `f` is released for the last time without ever having
 * completed, `drop(arg)` runs instead of `fn` (so `arg` is never leaked). */
mpr_err_t mpri_future_on_complete_or_drop(mpr_future_t *f, void (*fn)(mpr_future_t *f, void *arg),
                                          void (*drop)(void *arg), void *arg);

/* Wait (as mpr_future_wait) until `f` is done or `ready(arg)` returns true
 * (MPR_OK either way; the caller tells which). `ready` is called often and
 * must be cheap; whoever makes it true must call mpri_event_signal so a
 * waiter that went to sleep wakes at once. */
mpr_err_t mpri_future_wait_or(mpr_future_t *f, double timeout_s, bool (*ready)(void *arg), void *arg);

/* Hooks the runtime installs (progress.c, at start) so waits drive progress
 * and observe shutdown, and callbacks go to the worker pool: future.c knows
 * neither the pool nor the progress code, only these. Before they are
 * installed, waits only sleep and callbacks run inline. */
typedef struct mpri_wait_hooks {
    void (*enter)(void);  /* a thread starts actively waiting */
    /* ... and stops; `handoff`: it will not poll again soon (it goes to
     * sleep or runs a task), so the progress thread takes over at once;
     * false when its future is done and it returns to its caller. */
    void (*leave)(bool handoff);
    bool (*help)(void);   /* poll once; true if something happened */
    bool (*stopped)(void);/* the runtime has shut down */
    /* Queue fn(arg) on the pool (drop(arg) if the pool stops first); false
     * if it cannot (the pool is not running): the caller runs it inline. */
    bool (*defer)(void (*fn)(void *), void (*drop)(void *), void *arg);
    bool (*pool_work_waiting)(void); /* on a pool thread, with tasks queued */
    bool (*on_pool_thread)(void);    /* a pool worker (it also wakes for queued tasks) */
    bool (*run_pool_task)(void);     /* run one queued task; true if it did */
} mpri_wait_hooks_t;
void mpri_future_set_wait_hooks(const mpri_wait_hooks_t *hooks);

/* A thread context of the layer above (distributed autograd's current
 * context id; 0 = none) that mpr_future_then carries from the registering
 * thread to the thread running its callback: current() reads it, swap(x)
 * installs x and returns what was there. Installed once, before mpr_init. */
typedef struct mpri_thread_ctx_hooks {
    uint64_t (*current)(void);
    uint64_t (*swap)(uint64_t ctx);
} mpri_thread_ctx_hooks_t;
void mpri_future_set_thread_ctx_hooks(const mpri_thread_ctx_hooks_t *hooks);

#endif
