/* pool.c — the worker pool: a mutex-protected ring of tasks and N threads.
 *
 * Invariants: `queued` mirrors the ring's length and is read without the lock
 * only as a hint by spinning workers; a worker sleeps only after re-checking
 * the ring under the lock, and a submitter signals under the lock when
 * `sleeping` > 0, so no wake-up is lost. Idle workers spin briefly (with
 * sched_yield, so an oversubscribed machine still runs the thread with real
 * work) and then sleep, so an idle pool uses no CPU. Pool threads get a
 * 16 MiB stack: helping while waiting nests handlers on the same stack. */
#include "mpri_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "mpri_event.h"
#include "mpri_runtime.h"
#include "mpri_trace.h"

typedef struct {
    mpri_task_fn_t fn, drop;
    void *arg;
} task_t;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    task_t *ring;
    size_t cap, head, len;
    atomic_int queued;
    atomic_int running_tasks;
    atomic_int nested_tasks;  /* running inside another task's wait (helping) */
    atomic_int deepest;       /* the deepest nesting seen (mpri_pool_describe) */
    int sleeping;
    atomic_bool stopping;
    atomic_bool poller_taken; /* one idle worker at a time polls MPI */
    atomic_int spinning;      /* idle workers that will see a new task without a wake-up */
    atomic_bool started;
    pthread_t *threads;
    int nthreads;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static _Atomic(const mpri_pool_poller_t *) poller_hooks;

void mpri_pool_set_poller(const mpri_pool_poller_t *poller) { atomic_store(&poller_hooks, poller); }

static _Thread_local bool is_pool_thread;
static _Thread_local int task_depth; /* > 0 while this thread runs a task */

#define POOL_SPIN_NS 20000   /* how long an idle worker spins before sleeping */
#define POOL_POLL_NS 300000  /* ... and how long the polling one keeps polling */
#define POOL_HOT_NS 100000   /* the first part of it without yielding the core */

bool mpri_on_pool_thread(void) { return is_pool_thread || task_depth > 0; }
bool mpri_pool_running(void) { return atomic_load(&pool.started); }
int mpri_pool_queued(void) { return atomic_load(&pool.queued); }
int mpri_pool_spinning(void) { return atomic_load(&pool.spinning); }
int mpri_pool_busy(void) { return atomic_load(&pool.queued) + atomic_load(&pool.running_tasks); }

/* Pop under the lock. */
static bool pop_locked(task_t *out) {
    if (pool.len == 0) return false;
    *out = pool.ring[pool.head];
    pool.head = (pool.head + 1) % pool.cap;
    pool.len--;
    atomic_fetch_sub(&pool.queued, 1);
    atomic_fetch_add(&pool.running_tasks, 1);
    return true;
}

static void run_task(task_t *t) {
    if (++task_depth > 1) {
        atomic_fetch_add_explicit(&pool.nested_tasks, 1, memory_order_relaxed);
        if (task_depth > atomic_load_explicit(&pool.deepest, memory_order_relaxed))
            atomic_store_explicit(&pool.deepest, task_depth, memory_order_relaxed); /* a hint: races lose a max */
    }
    t->fn(t->arg);
    if (task_depth-- > 1) atomic_fetch_sub_explicit(&pool.nested_tasks, 1, memory_order_relaxed);
    atomic_fetch_sub(&pool.running_tasks, 1);
}

void mpri_pool_describe(FILE *out) {
    int sleeping = -1; /* -1: unknown (the lock is stuck) */
    if (mpri_describe_lock(out, &pool.lock, "worker pool's sleepers")) {
        sleeping = pool.sleeping;
        pthread_mutex_unlock(&pool.lock);
    }
    fprintf(out,
            "  worker pool: %d worker threads; %d tasks queued, %d running (%d of them inside another task's wait), "
            "%d workers spinning, %s%d asleep; deepest nesting seen %d\n",
            pool.nthreads, atomic_load(&pool.queued), atomic_load(&pool.running_tasks),
            atomic_load(&pool.nested_tasks), atomic_load(&pool.spinning), sleeping < 0 ? "? (lock held) " : "",
            sleeping < 0 ? 0 : sleeping, atomic_load(&pool.deepest));
}

bool mpri_pool_try_run_one(void) {
    if (atomic_load_explicit(&pool.queued, memory_order_relaxed) == 0) return false;
    task_t t;
    pthread_mutex_lock(&pool.lock);
    bool got = pop_locked(&t);
    pthread_mutex_unlock(&pool.lock);
    if (got) run_task(&t);
    return got;
}

/* An idle worker that holds the poller token polls MPI itself: a request it
 * receives lands in the queue and the same thread runs it at once, with no
 * cross-thread wake-up (leader/follower). Other idle workers just spin
 * briefly. Returns when a task is queued or the spin time is over. */
static void idle_spin(void) {
    int64_t idle_since = mpri_now_ns();
    bool expected = false;
    const mpri_pool_poller_t *hooks = atomic_load(&poller_hooks);
    bool poller = hooks && atomic_compare_exchange_strong(&pool.poller_taken, &expected, true);
    if (poller) hooks->enter();
    atomic_fetch_add(&pool.spinning, 1);
    while (atomic_load_explicit(&pool.queued, memory_order_relaxed) == 0 &&
           mpri_now_ns() - idle_since < (poller ? POOL_POLL_NS : POOL_SPIN_NS) &&
           !atomic_load(&pool.stopping)) {
        if (poller) {
            (void)mpri_event_take_woke(); /* what this thread's earlier tasks woke is not the poll's doing */
            if (hooks->poll() > 0) {
                if (mpri_event_take_woke()) sched_yield(); /* a thread it woke may share this core (progress.c) */
                continue;
            }
        }
        /* Keep the core for a short while (a reply usually brings the next
         * request within microseconds; a yield on a loaded machine can cost a
         * whole time slice), then be polite. */
        if (mpri_now_ns() - idle_since < POOL_HOT_NS)
            mpri_cpu_relax();
        else
            sched_yield();
    }
    atomic_fetch_sub(&pool.spinning, 1);
    if (poller) {
        /* With a task to run it polls again right after; out of time, it
         * goes to sleep: the progress thread takes over at once. */
        hooks->leave(atomic_load_explicit(&pool.queued, memory_order_relaxed) == 0);
        atomic_store(&pool.poller_taken, false);
    }
}

static void *worker_main(void *index) {
    is_pool_thread = true;
    char name[32];
    snprintf(name, sizeof name, "pool %d", (int)(intptr_t)index);
    mpri_trace_name_thread(name);
    for (;;) {
        idle_spin();
        task_t t;
        pthread_mutex_lock(&pool.lock);
        while (!pop_locked(&t)) {
            if (pool.stopping) {
                pthread_mutex_unlock(&pool.lock);
                return NULL;
            }
            pool.sleeping++;
            pthread_cond_wait(&pool.cond, &pool.lock);
            pool.sleeping--;
        }
        pthread_mutex_unlock(&pool.lock);
        run_task(&t);
    }
}

atomic_int mpri_pool_fail_submits;

mpr_err_t mpri_pool_submit(mpri_task_fn_t fn, mpri_task_fn_t drop, void *arg) {
    if (atomic_load_explicit(&mpri_pool_fail_submits, memory_order_relaxed) > 0 &&
        atomic_fetch_sub(&mpri_pool_fail_submits, 1) > 0)
        return mpr_error_set(MPR_ERR_NOMEM, "worker pool: cannot grow the task queue (injected)");
    pthread_mutex_lock(&pool.lock);
    if (pool.len == pool.cap) {
        size_t cap = pool.cap ? pool.cap * 2 : 256;
        task_t *ring = malloc(cap * sizeof *ring);
        if (!ring) {
            pthread_mutex_unlock(&pool.lock);
            return mpr_error_set(MPR_ERR_NOMEM, "worker pool: cannot grow the task queue");
        }
        for (size_t i = 0; i < pool.len; i++) ring[i] = pool.ring[(pool.head + i) % pool.cap];
        free(pool.ring);
        pool.ring = ring;
        pool.cap = cap;
        pool.head = 0;
    }
    pool.ring[(pool.head + pool.len) % pool.cap] = (task_t){fn, drop, arg};
    pool.len++;
    atomic_fetch_add(&pool.queued, 1);
    /* A spinning worker re-checks the ring under the lock before it sleeps,
     * so skipping the signal while one spins loses no task. */
    if (pool.sleeping && atomic_load(&pool.spinning) == 0) pthread_cond_signal(&pool.cond);
    pthread_mutex_unlock(&pool.lock);
    mpri_event_signal(); /* pool threads waiting on futures help with tasks */
    return MPR_OK;
}

mpr_err_t mpri_pool_start(int nthreads) {
    atomic_store(&pool.stopping, false);
    pool.threads = calloc((size_t)nthreads, sizeof *pool.threads);
    if (!pool.threads) return mpr_error_set(MPR_ERR_NOMEM, "worker pool: out of memory");
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 16u << 20);
    for (int i = 0; i < nthreads; i++) {
        if (pthread_create(&pool.threads[i], &attr, worker_main, (void *)(intptr_t)i) != 0) {
            pthread_attr_destroy(&attr);
            pool.nthreads = i;
            mpri_pool_stop();
            return mpr_error_set(MPR_ERR_NOMEM, "worker pool: cannot start thread %d", i);
        }
        char name[32];
        snprintf(name, sizeof name, "pool %d", i);
        mpri_name_runtime_thread(pool.threads[i], name);
    }
    pthread_attr_destroy(&attr);
    pool.nthreads = nthreads;
    atomic_store(&pool.started, true);
    return MPR_OK;
}

void mpri_pool_stop(void) {
    pthread_mutex_lock(&pool.lock);
    atomic_store(&pool.stopping, true);
    pthread_cond_broadcast(&pool.cond);
    pthread_mutex_unlock(&pool.lock);
    for (int i = 0; i < pool.nthreads; i++) pthread_join(pool.threads[i], NULL);
    free(pool.threads);
    pool.threads = NULL;
    pool.nthreads = 0;
    atomic_store(&pool.started, false);
    /* Whatever is left: drop it (or run it, for tasks without a drop). */
    task_t t;
    for (;;) {
        pthread_mutex_lock(&pool.lock);
        bool got = pop_locked(&t);
        pthread_mutex_unlock(&pool.lock);
        if (!got) break;
        if (t.drop) t.drop(t.arg); else t.fn(t.arg);
        atomic_fetch_sub(&pool.running_tasks, 1);
    }
    free(pool.ring);
    pool.ring = NULL;
    pool.cap = pool.head = pool.len = 0;
}
