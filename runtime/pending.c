/* pending.c — requests awaiting a reply: id -> (future, deadline, peer,
 * label), and the timer thread that fails them when their deadline passes.
 *
 * Invariants: an entry is removed exactly once — by the reply, by its
 * deadline, by a failed send, or at shutdown — and whoever removes it
 * completes the future, so a late reply finds nothing and is dropped.
 * Deadlines are expired by a thread of their own that sleeps until the
 * earliest one (re-armed when an earlier one is added), so a call's timeout
 * fires on time whatever the polling threads are doing (a poll stuck in a
 * long MPI copy holds nobody's deadline back). `earliest_ns` is never later
 * than the earliest deadline in the table (it may be earlier, stale, after
 * its entry left: one scan then recomputes it); only a scan that finds an
 * expired entry walks the buckets. The sleeping timer is woken only for a
 * deadline earlier than its planned wake-up (`timer_wake_ns`), so it never
 * sleeps past one, and ordinary calls (60 s deadlines) never wake it. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpri_assert.h"
#include "mpri_event.h"
#include "mpri_future.h"
#include "mpri_runtime.h"
#include "mpri_trace.h"

#define NBUCKETS 4096
/* Entries kept for reuse after a burst of calls in flight: enough for the
 * steady concurrency of a training job, bounded so that one burst of 100k
 * calls does not pin their entries for the rest of the run. */
#define FREE_LIST_MAX 1024

typedef struct entry {
    uint64_t id;
    mpr_future_t *future;
    int64_t deadline_ns;
    int64_t started_ns;
    uint64_t function_id; /* statistics: the call's function, or 0 */
    int dst;
    char label[64];
    struct entry *next;
} entry_t;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t timer_cond; /* CLOCK_MONOTONIC; signalled for an earlier deadline or stop */
    pthread_t timer;
    bool timer_running, timer_stop;
    entry_t *buckets[NBUCKETS];
    entry_t *free_list; /* recycled entries, at most FREE_LIST_MAX */
    long free_count;
    long count, with_deadline;
    int64_t earliest_ns; /* no deadline before this; 0: none pending */
    int64_t timer_wake_ns; /* when the sleeping timer thread wakes next; 0: it is awake */
} table = {.lock = PTHREAD_MUTEX_INITIALIZER};

long mpri_pending_count(void) {
    pthread_mutex_lock(&table.lock);
    long n = table.count;
    pthread_mutex_unlock(&table.lock);
    return n;
}

void mpri_pending_describe(FILE *out, int64_t now) {
    /* Copied under the lock, printed after: a slow `out` must not hold up
     * every call's reply behind the table's lock. */
    enum { MAX_LISTED = 32 };
    struct {
        uint64_t id;
        int dst;
        int64_t started_ns;
        char label[64];
    } copy[MAX_LISTED];
    if (!mpri_describe_lock(out, &table.lock, "requests awaiting replies")) return;
    long count = table.count;
    int listed = 0;
    for (int b = 0; b < NBUCKETS && listed < MAX_LISTED; b++)
        for (const entry_t *e = table.buckets[b]; e && listed < MAX_LISTED; e = e->next, listed++) {
            copy[listed].id = e->id;
            copy[listed].dst = e->dst;
            copy[listed].started_ns = e->started_ns;
            memcpy(copy[listed].label, e->label, sizeof copy[listed].label);
        }
    pthread_mutex_unlock(&table.lock);
    fprintf(out, "  requests awaiting replies: %ld\n", count);
    for (int i = 0; i < listed; i++)
        if (copy[i].started_ns)
            fprintf(out, "  awaiting: request %llu to rank %d, %s, sent %.3f ms ago\n", (unsigned long long)copy[i].id,
                    copy[i].dst, copy[i].label, (double)(now - copy[i].started_ns) / 1e6);
        else /* no deadline and no statistics: the time was not taken */
            fprintf(out, "  awaiting: request %llu to rank %d, %s, no deadline\n", (unsigned long long)copy[i].id,
                    copy[i].dst, copy[i].label);
    if (listed < count) fprintf(out, "  awaiting: ... (%d listed)\n", listed);
}

mpr_err_t mpri_pending_add(uint64_t id, mpr_future_t *f, int64_t deadline_ns, int dst,
                           const char *label) {
    return mpri_pending_add_call(id, f, deadline_ns, dst, label, 0);
}

mpr_err_t mpri_pending_add_call(uint64_t id, mpr_future_t *f, int64_t deadline_ns, int dst, const char *label,
                                uint64_t function_id) {
    int64_t now = deadline_ns || (function_id && mpri_observing(MPRI_OBSERVE_STATS)) ? mpri_now_ns() : 0;
    pthread_mutex_lock(&table.lock);
    entry_t *e = table.free_list;
    if (e) {
        table.free_list = e->next;
        table.free_count--;
    } else if (!(e = malloc(sizeof *e))) {
        pthread_mutex_unlock(&table.lock);
        return mpr_error_set(MPR_ERR_NOMEM, "pending request table: out of memory");
    }
    e->id = id;
    e->future = f;
    e->deadline_ns = deadline_ns;
    e->started_ns = now;
    e->function_id = function_id;
    e->dst = dst;
    if (!label) label = "request";
    size_t label_len = strnlen(label, sizeof e->label - 1); /* truncated as snprintf would, at less cost */
    memcpy(e->label, label, label_len);
    e->label[label_len] = '\0';
    entry_t **b = &table.buckets[id % NBUCKETS];
    e->next = *b;
    *b = e;
    table.count++;
    if (deadline_ns) {
        table.with_deadline++;
        if (table.earliest_ns == 0 || deadline_ns < table.earliest_ns) {
            table.earliest_ns = deadline_ns;
            /* Wake the timer only if it would sleep past this deadline: a
             * wake-up per call (the table empties after each reply) cost the
             * caller 10-15 us on a loaded 2-core machine (the woken timer
             * thread took the core, then the lock). Awake, it re-reads
             * earliest_ns before it sleeps again. */
            if (table.timer_running && table.timer_wake_ns && deadline_ns < table.timer_wake_ns)
                pthread_cond_signal(&table.timer_cond); /* sleep less */
        }
    }
    pthread_mutex_unlock(&table.lock);
    return MPR_OK;
}

/* Unlink under the lock; returns the entry (caller recycles it). */
static entry_t *unlink_locked(entry_t **link) {
    entry_t *e = *link;
    *link = e->next;
    table.count--;
    if (e->deadline_ns && --table.with_deadline == 0) table.earliest_ns = 0; /* none: the next add re-arms */
    return e;
}

static void recycle_locked(entry_t *e) {
    if (table.free_count >= FREE_LIST_MAX) {
        free(e);
        return;
    }
    e->next = table.free_list;
    table.free_list = e;
    table.free_count++;
}

static void free_list_drop_locked(void) {
    while (table.free_list) {
        entry_t *e = table.free_list;
        table.free_list = e->next;
        free(e);
    }
    table.free_count = 0;
}

void mpri_pending_cache_trim(void) {
    pthread_mutex_lock(&table.lock);
    free_list_drop_locked();
    pthread_mutex_unlock(&table.lock);
}

mpr_future_t *mpri_pending_take(uint64_t id) { return mpri_pending_take_call(id, NULL, NULL); }

mpr_future_t *mpri_pending_take_call(uint64_t id, uint64_t *function_id, int64_t *started_ns) {
    pthread_mutex_lock(&table.lock);
    for (entry_t **link = &table.buckets[id % NBUCKETS]; *link; link = &(*link)->next) {
        if ((*link)->id != id) continue;
        entry_t *e = unlink_locked(link);
        mpr_future_t *f = e->future;
        if (function_id) *function_id = e->function_id;
        if (started_ns) *started_ns = e->started_ns;
        recycle_locked(e);
        pthread_mutex_unlock(&table.lock);
        return f;
    }
    pthread_mutex_unlock(&table.lock);
    return NULL;
}

void mpri_pending_expire(int64_t now_ns) {
    entry_t *expired = NULL;
    pthread_mutex_lock(&table.lock);
    /* Scan only once the earliest deadline has passed (it may be stale, i.e.
     * early, after its entry left: then one scan recomputes it). */
    if (table.with_deadline == 0 || now_ns < table.earliest_ns) {
        pthread_mutex_unlock(&table.lock);
        return;
    }
    int64_t earliest = 0;
    for (int i = 0; i < NBUCKETS; i++) {
        entry_t **link = &table.buckets[i];
        while (*link) {
            int64_t d = (*link)->deadline_ns;
            if (d && d > now_ns && (earliest == 0 || d < earliest)) earliest = d;
            if (d && d <= now_ns) {
                entry_t *e = unlink_locked(link);
                e->next = expired;
                expired = e;
            } else {
                link = &(*link)->next;
            }
        }
    }
    table.earliest_ns = earliest;
    pthread_mutex_unlock(&table.lock);
    while (expired) {
        entry_t *e = expired;
        expired = e->next;
        char text[MPR_ERROR_TEXT_MAX];
        const char *peer = mpri_rt.workers ? mpri_rt.workers[e->dst].name : "?";
        snprintf(text, sizeof text, "%s to %s (rank %d) timed out after %.3f s", e->label, peer,
                 e->dst, (double)(e->deadline_ns - e->started_ns) / 1e9);
        if (mpri_observing(MPRI_OBSERVE_TRACE))
            mpri_trace_msg(MPRI_TEV_TIMEOUT, now_ns, 0, MPRI_MSG_CALL, 0, e->id, e->function_id, e->dst, 0);
        if (e->function_id && mpri_observing(MPRI_OBSERVE_STATS))
            mpri_stats_call_done(e->function_id, -1, 0, true, true);
        mpri_future_complete(e->future, MPR_ERR_TIMEOUT, text, NULL);
        mpr_future_release(e->future);
        pthread_mutex_lock(&table.lock);
        recycle_locked(e);
        pthread_mutex_unlock(&table.lock);
    }
}

void mpri_pending_fail_all(mpr_err_t code, const char *message) {
    for (;;) {
        entry_t *e = NULL;
        pthread_mutex_lock(&table.lock);
        for (int i = 0; i < NBUCKETS && !e; i++)
            if (table.buckets[i]) e = unlink_locked(&table.buckets[i]);
        pthread_mutex_unlock(&table.lock);
        if (!e) break;
        mpri_future_complete(e->future, code, message, NULL);
        mpr_future_release(e->future);
        free(e);
    }
    mpri_pending_cache_trim();
}

void mpri_pending_fail_dst(int dst, mpr_err_t code, const char *message) {
    entry_t *failed = NULL;
    pthread_mutex_lock(&table.lock);
    for (int i = 0; i < NBUCKETS; i++) {
        entry_t **link = &table.buckets[i];
        while (*link) {
            if ((*link)->dst == dst) {
                entry_t *e = unlink_locked(link);
                e->next = failed;
                failed = e;
            } else {
                link = &(*link)->next;
            }
        }
    }
    pthread_mutex_unlock(&table.lock);
    while (failed) {
        entry_t *e = failed;
        failed = e->next;
        char text[512];
        snprintf(text, sizeof text, "%s to %s (rank %d) failed: %s", e->label,
                 mpri_rt.workers ? mpri_rt.workers[dst].name : "?", dst, message);
        if (e->function_id && mpri_observing(MPRI_OBSERVE_STATS)) mpri_stats_call_done(e->function_id, -1, 0, true, false);
        mpri_future_complete(e->future, code, text, NULL);
        mpr_future_release(e->future);
        pthread_mutex_lock(&table.lock);
        recycle_locked(e);
        pthread_mutex_unlock(&table.lock);
    }
}

/* ---- the timer thread ---- */

#define TIMER_IDLE_NS 1000000000LL /* re-check at least once a second */

static void *timer_main(void *unused) {
    mpri_trace_name_thread("deadline timer");
    pthread_mutex_lock(&table.lock);
    while (!table.timer_stop) {
        int64_t now = mpri_now_ns();
        int64_t wake = table.with_deadline && table.earliest_ns ? table.earliest_ns : now + TIMER_IDLE_NS;
        if (wake > now) {
            struct timespec ts = {.tv_sec = wake / 1000000000LL, .tv_nsec = wake % 1000000000LL};
            table.timer_wake_ns = wake;
            pthread_cond_timedwait(&table.timer_cond, &table.lock, &ts);
            table.timer_wake_ns = 0;
            continue;
        }
        pthread_mutex_unlock(&table.lock);
        mpri_pending_expire(now);
        pthread_mutex_lock(&table.lock);
    }
    pthread_mutex_unlock(&table.lock);
    return NULL;
}

mpr_err_t mpri_pending_timer_start(void) {
    pthread_mutex_lock(&table.lock);
    MPRI_ASSERT(!table.timer_running, "the deadline timer is started once per run");
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&table.timer_cond, &attr);
    pthread_condattr_destroy(&attr);
    table.timer_stop = false;
    bool ok = pthread_create(&table.timer, NULL, timer_main, NULL) == 0;
    if (ok) mpri_name_runtime_thread(table.timer, "deadline timer");
    table.timer_running = ok;
    pthread_mutex_unlock(&table.lock);
    if (!ok) {
        pthread_cond_destroy(&table.timer_cond);
        return mpr_error_set(MPR_ERR_NOMEM, "cannot start the deadline timer thread");
    }
    return MPR_OK;
}

void mpri_pending_timer_stop(void) {
    pthread_mutex_lock(&table.lock);
    if (!table.timer_running) {
        pthread_mutex_unlock(&table.lock);
        return;
    }
    table.timer_stop = true;
    pthread_cond_signal(&table.timer_cond);
    pthread_mutex_unlock(&table.lock);
    pthread_join(table.timer, NULL);
    pthread_mutex_lock(&table.lock);
    table.timer_running = false;
    pthread_mutex_unlock(&table.lock);
    pthread_cond_destroy(&table.timer_cond);
}
