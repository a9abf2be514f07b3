/* future.c — futures: completion, callbacks, waiting.
 *
 * States: PENDING -> DONE, exactly once, under the future's lock; the result
 * fields are written before `state` is released and never change afterwards,
 * so readers that observed DONE read them without the lock. In DONE, either
 * `value` is set (code MPR_OK) or `message` may be (an error), and no
 * callback is left; check_future() asserts this (Debug builds) at every
 * transition, and the reference count never goes below zero (every build).
 * Callbacks registered while PENDING run after completion: inline for user
 * completions, on the worker pool for runtime completions (the progress
 * thread and pollers never run user code). Waiting spins briefly while
 * helping the runtime progress (the waiter polls MPI itself, so on a 2-core
 * machine no second thread has to spin for it), then sleeps with timeouts:
 * on the future's own keyed event (mpri_event.h: a completion wakes only the
 * waiters of its shard), or on the process-wide event when something else
 * may end the wait (a `ready` condition, a pool task for a pool thread). A
 * completion signals both. This file reaches the pool and the progress code
 * only through the hooks the runtime installs (mpri_wait_hooks_t). */
#include "mpri_future.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_args.h"
#include "mpri_deferred.h"
#include "mpri_error.h"
#include "mpri_assert.h"
#include "mpri_small_alloc.h"
#include "mpri_event.h"
#include "mpri_trace.h"

enum { FUTURE_PENDING = 0, FUTURE_DONE = 1 };

typedef struct callback {
    void (*fn)(mpr_future_t *f, void *arg);
    void (*drop)(void *arg); /* NULL, or run instead of fn if f dies pending */
    void *arg;
    struct callback *next;
} callback_t;

struct mpr_future {
    atomic_long refcount;
    atomic_int state;
    pthread_mutex_t lock;
    mpr_err_t code;
    char *message;
    mpri_remote_error_t *remote; /* code MPR_ERR_REMOTE: its origin (NULL if unknown) */
    mpr_value_t *value;
    callback_t *callbacks;
    bool runtime_owned; /* completed by the runtime only (an RPC's reply); set before sharing */
};

static _Atomic(const mpri_wait_hooks_t *) hooks_installed;

void mpri_future_set_wait_hooks(const mpri_wait_hooks_t *hooks) { atomic_store(&hooks_installed, hooks); }

/* The state invariants (see the top of the file). Call with f->lock held, or
 * on a future no other thread can reach. */
static void check_future(const mpr_future_t *f) {
    if (!MPRI_DEBUG_CHECKS) return;
    int state = atomic_load_explicit(&((mpr_future_t *)f)->state, memory_order_relaxed);
    MPRI_DEBUG_ASSERT(state == FUTURE_PENDING || state == FUTURE_DONE, "a future is PENDING or DONE");
    if (state == FUTURE_PENDING) {
        MPRI_DEBUG_ASSERT(!f->value && !f->message && f->code == MPR_OK, "a pending future has no result yet");
    } else {
        MPRI_DEBUG_ASSERT(!f->callbacks, "completion takes every callback");
        MPRI_DEBUG_ASSERT(f->code == MPR_OK ? f->value && !f->message : !f->value,
                          "a done future holds a value (success) or an error, not both");
    }
}

mpr_future_t *mpr_future_create(void) {
    mpr_future_t *f = mpri_small_calloc(sizeof *f);
    if (!f) {
        mpr_error_set(MPR_ERR_NOMEM, "future: out of memory");
        return NULL;
    }
    atomic_init(&f->refcount, 1);
    atomic_init(&f->state, FUTURE_PENDING);
    pthread_mutex_init(&f->lock, NULL);
    return f;
}

void mpri_future_mark_runtime_owned(mpr_future_t *f) { f->runtime_owned = true; }

mpr_future_t *mpr_future_retain(mpr_future_t *f) {
    MPRI_ARG_NONNULL_OR(f, NULL);
    if (f) {
        long before = atomic_fetch_add_explicit(&f->refcount, 1, memory_order_relaxed);
        MPRI_ASSERT(before > 0, "retain of a released future");
    }
    return f;
}

void mpr_future_release(mpr_future_t *f) {
    if (!f) return;
    long before = atomic_fetch_sub_explicit(&f->refcount, 1, memory_order_acq_rel);
    MPRI_ASSERT(before > 0, "future released more often than retained");
    if (before != 1) return;
    check_future(f);
    mpr_value_release(f->value);
    free(f->message);
    free(f->remote);
    callback_t *cb = f->callbacks; /* only when never completed */
    while (cb) {
        callback_t *next = cb->next;
        if (cb->drop) cb->drop(cb->arg);
        free(cb);
        cb = next;
    }
    pthread_mutex_destroy(&f->lock);
    mpri_small_free(f, sizeof *f);
}

typedef struct {
    callback_t *cb;
    mpr_future_t *f;
} deferred_t;

static void run_deferred(void *arg) {
    deferred_t *d = arg;
    d->cb->fn(d->f, d->cb->arg);
    mpr_future_release(d->f);
    free(d->cb);
    free(d);
}

/* Called when the pool stops before running a deferred callback: run it
 * anyway (the future is complete; the callback must see its outcome). */
static void drop_deferred(void *arg) { run_deferred(arg); }

/* `re`: the origin of a remote failure (code MPR_ERR_REMOTE), or NULL: then
 * a remote failure passed on as it was read keeps its origin. */
static mpr_err_t complete(mpr_future_t *f, mpr_err_t code, const char *message, mpr_value_t *value,
                          bool defer, const mpri_remote_error_t *re) {
    if (!re) re = mpri_remote_error_matching(code, message);
    mpri_remote_error_t *remote = re ? malloc(sizeof *remote) : NULL;
    if (remote) *remote = *re;
    const mpri_wait_hooks_t *hooks = defer ? atomic_load(&hooks_installed) : NULL;
    if (!f) {
        free(remote);
        mpr_value_release(value);
        return mpr_error_set(MPR_ERR_INVALID_ARG, "future is NULL");
    }
    pthread_mutex_lock(&f->lock);
    check_future(f);
    if (atomic_load_explicit(&f->state, memory_order_relaxed) != FUTURE_PENDING) {
        pthread_mutex_unlock(&f->lock);
        mpr_value_release(value);
        free(remote);
        return mpr_error_set(MPR_ERR_STATE, "future already completed");
    }
    f->code = code;
    f->remote = remote;
    if (code == MPR_OK) {
        f->value = value ? value : mpr_value_new_none();
    } else {
        mpr_value_release(value);
        f->message = strdup(message ? message : mpr_strerror(code));
    }
    callback_t *cbs = f->callbacks;
    f->callbacks = NULL;
    atomic_store_explicit(&f->state, FUTURE_DONE, memory_order_release);
    check_future(f);
    pthread_mutex_unlock(&f->lock);
    mpri_event_signal_key(f); /* its own waiters (wait_many) */
    mpri_event_signal();      /* waits that also watch a condition, or run pool tasks */

    /* Callbacks were pushed in LIFO order; run them in registration order. */
    callback_t *ordered = NULL;
    while (cbs) {
        callback_t *next = cbs->next;
        cbs->next = ordered;
        ordered = cbs;
        cbs = next;
    }
    while (ordered) {
        callback_t *cb = ordered;
        ordered = cb->next;
        deferred_t *d = hooks ? malloc(sizeof *d) : NULL;
        if (d) {
            d->cb = cb;
            d->f = mpr_future_retain(f);
            if (hooks->defer(run_deferred, drop_deferred, d)) continue;
            mpr_future_release(f);
            free(d);
        }
        cb->fn(f, cb->arg);
        free(cb);
    }
    return MPR_OK;
}

mpr_err_t mpri_future_complete(mpr_future_t *f, mpr_err_t code, const char *message,
                               mpr_value_t *value) {
    return complete(f, code, message, value, true, NULL);
}

/* Users complete only the futures they created (mpr_future_create). */
static mpr_err_t refuse_runtime_owned(const char *fn) {
    return mpr_error_set(MPR_ERR_STATE,
                         "%s: this future belongs to an RPC (mpr_rpc_async, an RRef proxy) and only "
                         "its reply completes it; create your own with mpr_future_create()",
                         fn);
}

mpr_err_t mpr_future_set_result(mpr_future_t *f, mpr_value_t *value) {
    if (!f) mpr_value_release(value);
    MPRI_ARG_NONNULL(f);
    if (f->runtime_owned) {
        mpr_value_release(value);
        return refuse_runtime_owned(__func__);
    }
    return complete(f, MPR_OK, NULL, value, false, NULL);
}

mpr_err_t mpr_future_set_error(mpr_future_t *f, mpr_err_t code, const char *message) {
    MPRI_ARG_NONNULL(f);
    if (code == MPR_OK)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_future_set_error: code must not be MPR_OK");
    if (f->runtime_owned) return refuse_runtime_owned(__func__);
    return complete(f, code, message, NULL, false, NULL);
}

bool mpr_future_done(const mpr_future_t *f) {
    MPRI_ARG_NONNULL_OR(f, false);
    return atomic_load_explicit(&((mpr_future_t *)f)->state, memory_order_acquire) == FUTURE_DONE;
}

mpr_err_t mpr_future_error(const mpr_future_t *f) {
    MPRI_ARG_NONNULL(f);
    if (!mpr_future_done(f)) return MPR_ERR_STATE;
    return f->code;
}

const char *mpr_future_error_message(const mpr_future_t *f) {
    MPRI_ARG_NONNULL_OR(f, "");
    if (!mpr_future_done(f) || f->code == MPR_OK) return "";
    return f->message ? f->message : mpr_strerror(f->code); /* NULL: its copy failed (out of memory) */
}

mpr_err_t mpr_future_remote_code(const mpr_future_t *f) {
    MPRI_ARG_NONNULL(f);
    return mpr_future_done(f) && f->remote ? f->remote->code : MPR_OK;
}

int mpr_future_error_origin(const mpr_future_t *f) {
    MPRI_ARG_NONNULL_OR(f, -1);
    return mpr_future_done(f) && f->remote ? f->remote->origin_rank : -1;
}

const mpri_remote_error_t *mpri_future_remote_error(const mpr_future_t *f) {
    return mpr_future_done(f) ? f->remote : NULL;
}

mpr_err_t mpri_future_complete_remote(mpr_future_t *f, const mpri_remote_error_t *re) {
    char text[MPR_ERROR_TEXT_MAX];
    mpri_remote_error_text(re, text, sizeof text);
    return complete(f, MPR_ERR_REMOTE, text, NULL, true, re);
}

mpr_value_t *mpri_future_value(const mpr_future_t *f) {
    return mpr_future_done(f) && f->code == MPR_OK ? f->value : NULL;
}

mpr_err_t mpri_future_on_complete(mpr_future_t *f, void (*fn)(mpr_future_t *f, void *arg), void *arg) {
    return mpri_future_on_complete_or_drop(f, fn, NULL, arg);
}

mpr_err_t mpri_future_on_complete_or_drop(mpr_future_t *f, void (*fn)(mpr_future_t *f, void *arg),
                                          void (*drop)(void *arg), void *arg) {
    callback_t *cb = malloc(sizeof *cb);
    if (!cb) return mpr_error_set(MPR_ERR_NOMEM, "future: out of memory");
    cb->fn = fn;
    cb->drop = drop;
    cb->arg = arg;
    pthread_mutex_lock(&f->lock);
    if (atomic_load_explicit(&f->state, memory_order_relaxed) == FUTURE_PENDING) {
        cb->next = f->callbacks;
        f->callbacks = cb;
        pthread_mutex_unlock(&f->lock);
        return MPR_OK;
    }
    pthread_mutex_unlock(&f->lock);
    fn(f, arg);
    free(cb);
    return MPR_OK;
}

typedef struct {
    mpr_future_t *child;
    mpr_then_fn_t fn;
    void *user_data;
    uint64_t thread_ctx; /* the registering thread's context (mpri_thread_ctx_hooks_t) */
} then_t;

/* The layer above's thread context, carried from mpr_future_then to its
 * callback (distributed autograd: the callback extends the same graph). */
static _Atomic(const mpri_thread_ctx_hooks_t *) ctx_hooks;

void mpri_future_set_thread_ctx_hooks(const mpri_thread_ctx_hooks_t *hooks) { atomic_store(&ctx_hooks, hooks); }

static void run_then(mpr_future_t *parent, void *arg) {
    then_t *t = arg;
    mpr_value_t *result = NULL;
    mpr_error_clear();
    const mpri_thread_ctx_hooks_t *h = t->thread_ctx ? atomic_load(&ctx_hooks) : NULL;
    uint64_t saved = h ? h->swap(t->thread_ctx) : 0;
    bool traced = mpri_observing(MPRI_OBSERVE_TRACE); /* the callback's run as a slice "then" */
    if (traced) mpri_trace_range_begin(MPRI_TCAT_RUNTIME, "then");
    mpr_err_t e = t->fn(parent, t->user_data, &result);
    if (traced) mpri_trace_range_end();
    if (h) h->swap(saved);
    if (e == MPR_OK)
        mpr_future_set_result(t->child, result);
    else {
        mpr_value_release(result);
        mpr_future_set_error(t->child, e, mpr_last_error()[0] ? mpr_last_error() : mpr_strerror(e));
    }
    mpr_future_release(t->child);
    free(t);
}

/* The parent was released without ever completing: the callback can never
 * run, so the child fails instead of staying pending forever. */
static void drop_then(void *arg) {
    then_t *t = arg;
    mpr_future_set_error(t->child, MPR_ERR_STATE,
                         "mpr_future_then: the parent future was released without ever completing");
    mpr_future_release(t->child);
    free(t);
}

mpr_future_t *mpr_future_then(mpr_future_t *f, mpr_then_fn_t fn, void *user_data) {
    MPRI_ARG_NONNULL_OR(f, NULL);
    MPRI_ARG_NONNULL_OR(fn, NULL);
    mpr_future_t *child = mpr_future_create();
    then_t *t = malloc(sizeof *t);
    if (!child || !t) {
        mpr_future_release(child);
        free(t);
        mpr_error_set(MPR_ERR_NOMEM, "mpr_future_then: out of memory");
        return NULL;
    }
    t->child = mpr_future_retain(child);
    t->fn = fn;
    t->user_data = user_data;
    const mpri_thread_ctx_hooks_t *h = atomic_load(&ctx_hooks);
    t->thread_ctx = h ? h->current() : 0;
    if (mpri_future_on_complete_or_drop(f, run_then, drop_then, t) != MPR_OK) {
        mpr_future_release(child);
        mpr_future_release(child);
        free(t);
        return NULL;
    }
    return child;
}

#define WAIT_ACTIVE_NS 2000000 /* poll actively this long before sleeping */
#define WAIT_SPIN_NS 100000    /* pure spinning (no yield) at the very start */
#define WAIT_SLEEP_MAX_NS 1000000

/* Wait until every future in `fs` is done, or `ready(arg)` (if given) is
 * true: checked before each poll or sleep; whoever makes it true signals
 * the event, so a sleeping waiter sees it at once. */
static mpr_err_t wait_many(size_t n, mpr_future_t *const *fs, double timeout_s, bool (*ready)(void *),
                           void *ready_arg) {
    /* About to wait: releases put off by the caller's previous steps run
     * now, while the reply is on its way (mpri_deferred.h). */
    mpri_deferred_run_some();
    const mpri_wait_hooks_t *wait_hooks = atomic_load(&hooks_installed);
    int64_t start = mpri_now_ns();
    int64_t deadline = timeout_s > 0 ? start + (int64_t)(timeout_s * 1e9) : 0;
    bool active = false;
    size_t first_pending = 0;
    bool keyed = !ready && !(wait_hooks && wait_hooks->on_pool_thread());
    /* A keyed sleeper is woken by its future's completion (and by the stop),
     * so its timeout only bounds a missed signal: it sleeps the longest step
     * at once. On the process-wide event, steps start short and double. */
    int64_t sleep_ns = keyed ? WAIT_SLEEP_MAX_NS : 20000;
    mpr_err_t result = MPR_OK;
    for (;;) {
        while (first_pending < n && mpr_future_done(fs[first_pending])) first_pending++;
        if (first_pending == n) break;
        if (ready && ready(ready_arg)) break;
        if (wait_hooks && wait_hooks->stopped()) {
            result = mpr_error_set(MPR_ERR_SHUTDOWN, "wait: the runtime shut down while the future was pending");
            break;
        }
        int64_t now = mpri_now_ns();
        if (deadline && now >= deadline) {
            result = mpr_error_set(MPR_ERR_TIMEOUT, "wait: timed out after %.3f s", timeout_s);
            break;
        }
        /* A pool thread runs queued work while it waits (nested calls cannot
         * exhaust the pool). It gives up the active-poller role first: the
         * task may take long, and the progress thread must poll meanwhile. */
        if (wait_hooks && wait_hooks->pool_work_waiting()) {
            if (active) {
                wait_hooks->leave(true);
                active = false;
            }
            if (wait_hooks->run_pool_task()) continue;
        }
        if (wait_hooks && now - start < WAIT_ACTIVE_NS) {
            if (!active) {
                wait_hooks->enter();
                active = true;
            }
            if (wait_hooks->help()) continue;
            if (now - start < WAIT_SPIN_NS)
                mpri_cpu_relax();
            else
                sched_yield();
            continue;
        }
        if (active) {
            wait_hooks->leave(true);
            active = false;
        }
        /* Asleep on the future's own key unless something else may end the
         * wait: a `ready` condition, or (on a pool thread) a queued task;
         * those are signalled on the process-wide event. */
        const void *key = keyed ? (const void *)fs[first_pending] : NULL;
        uint64_t gen = key ? mpri_event_generation_key(key) : mpri_event_generation();
        if (mpr_future_done(fs[first_pending]) || (ready && ready(ready_arg))) continue;
        int64_t t = sleep_ns;
        if (deadline && deadline - now < t) t = deadline - now;
        if (key)
            mpri_event_wait_key(key, gen, t);
        else
            mpri_event_wait(gen, t);
        if (sleep_ns < WAIT_SLEEP_MAX_NS) sleep_ns *= 2;
    }
    if (active) wait_hooks->leave(false);
    return result;
}

mpr_err_t mpr_future_wait(mpr_future_t *f, double timeout_s) {
    MPRI_ARG_NONNULL(f);
    if (mpr_future_done(f)) return MPR_OK;
    return wait_many(1, &f, timeout_s, NULL, NULL);
}

mpr_err_t mpri_future_wait_or(mpr_future_t *f, double timeout_s, bool (*ready)(void *arg), void *arg) {
    if (mpr_future_done(f) || ready(arg)) return MPR_OK;
    return wait_many(1, &f, timeout_s, ready, arg);
}

mpr_err_t mpr_future_wait_all(size_t n, mpr_future_t *const *futures, double timeout_s) {
    if (n > 0) MPRI_ARG_NONNULL(futures);
    for (size_t i = 0; i < n; i++)
        if (!futures[i]) return mpr_error_set(MPR_ERR_INVALID_ARG, "wait_all: future %zu is NULL", i);
    return wait_many(n, futures, timeout_s, NULL, NULL);
}

mpr_err_t mpr_future_get(mpr_future_t *f, double timeout_s, mpr_value_t **value) {
    if (value) *value = NULL;
    MPRI_ARG_NONNULL(f);
    MPRI_ARG_NONNULL(value);
    mpr_err_t e = mpr_future_wait(f, timeout_s);
    if (e) return e;
    if (f->code != MPR_OK)
        return f->remote ? mpri_error_set_remote(f->remote) : mpr_error_set(f->code, "%s", mpr_future_error_message(f));
    *value = mpr_value_retain(f->value);
    return MPR_OK;
}
