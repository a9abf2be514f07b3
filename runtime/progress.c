/* progress.c — the receive side: polling MPI for active messages (and the
 * local inbox), assembling their tensor data, draining the data of rejected
 * messages, driving the sends in flight (transport.c); the dedicated progress
 * thread; the hooks that let waiting threads and idle pool workers poll.
 *
 * Invariants:
 * - One thread at a time matches (poll_lock, taken with trylock: no thread
 *   ever waits for it): Improbe, Mrecv of the message Improbe matched,
 *   dispatch of messages without tensors in the order MPI matched them, and
 *   the tests of what is assembling, draining or sending (the progress
 *   thread matches up to 32 messages per poll, any other thread one, so a
 *   waiter sees its reply at once). Only non-blocking
 *   MPI calls are made in a poll (Improbe, Mrecv of a matched message,
 *   Irecv, Isend, Test*).
 * - A message whose tensors came inside it (MPRI_FLAG_TENSORS_INLINE) is
 *   complete when its header is: their bytes are copied into the tensors
 *   and it is dispatched in the same poll, with no receive posted.
 * - The data receives of a message with more than POST_LOCKED_MAX_BYTES of
 *   tensors are posted by the thread that matched it after it released
 *   poll_lock (Open MPI copies a batch that has already arrived inside
 *   MPI_Irecv: a CMA read of megabytes), so such a copy never keeps the
 *   other threads from polling; a message with less (eager data: at most
 *   that much copied) is posted under the lock, and so dispatched in the same
 *   poll. Either way the message joins `assembling` through `posted`.
 *   `posting` counts messages between the two, and a stop waits for it to
 *   drop to zero. Under the lock
 *   remain the Mrecv of an active message itself (beyond the eager limit
 *   only for big inline payloads or many tensor descriptors) and whatever
 *   Open MPI's progress engine does inside Improbe and Test.
 * - The data of a rejected message (bad descriptors, wrong batch count) is
 *   drained without blocking: each poll receives what has arrived of it, and
 *   the drain gives up after the announced count or DRAIN_NS, whichever
 *   comes first, so a sender announcing more than it sends costs nothing.
 * - A thread waiting on a future polls for itself while it waits actively,
 *   an idle pool worker polls between requests, and a caller polls once after
 *   each send; meanwhile (active_waiters > 0, or another thread polled in the
 *   last 50 us) the progress thread sleeps, so one thread per rank polls, not
 *   two: it naps up to 1 ms while others poll actively, woken at once when
 *   the last of them leaves to sleep or to run a task (a handoff), and polls
 *   after a nap only if their polls paused for 1 ms, so nothing depends on
 *   them.
 * - The progress thread stays hot while messages assemble or drain, and
 *   awake (polling, yielding between polls) while sends are in flight, whose
 *   rendezvous the sender's side must drive too; otherwise it backs off:
 *   spin, then yield, then sleep in growing steps up to 1 ms, so an idle
 *   rank uses well under 5% of a core.
 * - Code running in the progress context (the progress thread, or any thread
 *   inside a poll) never blocks: sends never do (transport.c), and future
 *   callbacks it triggers go to the worker pool.
 * - Deadlines are not checked here: pending.c's timer thread expires them. */
#include <hwloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpri_assert.h"
#include "mpri_deferred.h"
#include "mpri_doorbell.h"
#include "mpri_event.h"
#include "mpri_future.h"
#include "mpri_pool.h"
#include "mpri_runtime.h"
#include "mpri_tensor_batches.h"
#include "mpri_trace.h"

/* The data messages of a rejected message, still to be received and
 * discarded (at most `left` more, until `give_up_ns`). */
typedef struct drain {
    int src, tag;
    uint32_t left;
    int64_t give_up_ns;
    struct drain *next;
} drain_t;

#define DRAIN_NS 10000000000LL /* a rejected message's data is awaited 10 s at most */

static struct {
    pthread_mutex_t poll_lock;
    mpri_msg_t *assembling; /* guarded by poll_lock */
    drain_t *draining;      /* guarded by poll_lock */
    _Atomic(mpri_msg_t *) posted; /* receives posted, not yet in `assembling` (a lock-free stack) */
    atomic_int posting;     /* messages matched whose receives are being posted */
    atomic_long busy;       /* matched with tensors (posting, posted, assembling) + draining */
    atomic_int active_waiters;
    atomic_bool stop;
    atomic_int_fast64_t last_other_poll_ns; /* when a thread other than ours last polled */
    /* For mpri_progress_describe only (relaxed, approximate): */
    atomic_int_fast64_t last_poll_ns;       /* when any thread last took poll_lock */
    atomic_int_fast64_t lock_taken_ns;      /* when the thread now holding poll_lock took it; 0: free */
    atomic_int thread_phase;                /* what the progress thread is doing (phase_names) */
    pthread_t thread;
    bool thread_started;
    /* The progress thread naps here while other threads poll actively;
     * the last active waiter to leave wakes it (see progress_main). */
    pthread_mutex_t nap_lock;
    pthread_cond_t nap_cond; /* CLOCK_MONOTONIC */
    atomic_bool napping;
} prog = {.poll_lock = PTHREAD_MUTEX_INITIALIZER, .nap_lock = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local bool in_progress_context;
static _Thread_local bool is_progress_thread;

bool mpri_in_progress_context(void) { return in_progress_context; }
long mpri_progress_busy(void) { return atomic_load(&prog.busy) + mpri_transport_sends_in_flight(); }

/* Receive and discard what has arrived of the rejected messages' data. */
static int test_draining(int64_t now_ns) {
    int done = 0;
    drain_t **link = &prog.draining;
    while (*link) {
        drain_t *d = *link;
        for (;;) {
            int flag = 0, count = 0;
            MPI_Message m;
            MPI_Status st;
            if (d->left == 0 ||
                MPI_Improbe(d->src, d->tag, mpri_rt.comm, &flag, &m, &st) != MPI_SUCCESS || !flag)
                break;
            MPI_Get_count(&st, MPI_BYTE, &count);
            void *scratch = malloc(count > 0 ? (size_t)count : 1);
            MPI_Mrecv(scratch, scratch ? count : 0, MPI_BYTE, &m, MPI_STATUS_IGNORE);
            free(scratch);
            d->left--;
            done++;
        }
        if (d->left == 0 || now_ns > d->give_up_ns) {
            *link = d->next;
            free(d);
            atomic_fetch_sub(&prog.busy, 1);
        } else {
            link = &d->next;
        }
    }
    return done;
}

/* A message whose header or descriptors are unusable: discard its tensor
 * data (sent right behind it) as it arrives, without waiting for it; reply
 * with the error if the sender waits for one (or, for a reply, fail the call
 * waiting for it), and count it processed. */
static void reject_incoming(mpri_msg_t *msg, bool header_ok, mpr_err_t code) {
    char text[MPR_ERROR_TEXT_MAX];
    snprintf(text, sizeof text, "On %s: rejected a malformed message from rank %d: %s",
             mpri_rt.workers[mpri_rt.rank].name, msg->src, mpr_last_error());
    if (header_ok) {
        drain_t *d = msg->hdr.batch_count ? malloc(sizeof *d) : NULL;
        if (d) {
            *d = (drain_t){.src = msg->src, .tag = (int)msg->hdr.data_tag, .left = msg->hdr.batch_count,
                           .give_up_ns = mpri_now_ns() + DRAIN_NS, .next = prog.draining};
            prog.draining = d;
            atomic_fetch_add(&prog.busy, 1);
        }
        if (!(msg->hdr.flags & MPRI_FLAG_RESPONSE)) {
            mpri_reply_error(msg, code, text);
        } else { /* a reply we cannot read: its caller gets the error, not a wait */
            mpr_future_t *f = mpri_pending_take(msg->hdr.request_id);
            if (f) {
                mpri_future_complete(f, code, text, NULL);
                mpr_future_release(f);
            }
        }
    } else {
        fprintf(stderr, "mpirpc: %s\n", text);
    }
    if (msg->tensors) mpri_msg_tensors_free(msg); /* none allocated on this path */
    mpri_msg_done(msg);
}

/* The most tensor data a message may carry and still have its receives
 * posted under the poll lock (below Open MPI's shared-memory and TCP eager
 * limits, 4 KiB and 64 KiB: no CMA read of megabytes inside MPI_Irecv). */
#define POST_LOCKED_MAX_BYTES 4096

static void post_receives(mpri_msg_t *msg);

/* Release the tensors decoded for `msg` (its data will not come). */
static void drop_decoded_tensors(mpri_msg_t *msg) {
    for (uint32_t i = 0; i < msg->hdr.tensor_count; i++) {
        mpr_tensor_release(msg->tensors[i]);
        msg->tensors[i] = NULL;
    }
    free(msg->placement);
    msg->placement = NULL;
}

/* The tensors' bytes came inside the message (mpri_wire.h, `r` at the
 * descriptors): decoded, copied into the tensors just made, and the message
 * is complete. No batch plan and no receive: small tensors on the way in
 * cost their own allocations only. */
static void start_inline(mpri_msg_t *msg, mpri_reader_t *r, uint32_t n) {
    mpri_tensor_span_t stack_spans[MPRI_BATCH_SCRATCH_INLINE];
    mpri_tensor_span_t *spans = n <= MPRI_BATCH_SCRATCH_INLINE ? stack_spans : malloc(sizeof *spans * n);
    mpr_err_t e = spans ? mpri_tensor_descs_decode_spans(r, n, msg->tensors, spans, &msg->placement)
                        : mpr_error_set(MPR_ERR_NOMEM, "out of memory for %u tensors", n);
    size_t inline_bytes = 0;
    for (uint32_t i = 0; !e && i < n; i++) inline_bytes += spans[i].nbytes;
    if (!e && r->left != inline_bytes) {
        drop_decoded_tensors(msg);
        e = mpr_error_set(MPR_ERR_DECODE, "%zu bytes of inline tensor data for tensors of %zu", r->left,
                          inline_bytes);
    }
    if (!e) {
        const uint8_t *from = r->p;
        for (uint32_t i = 0; i < n; i++) {
            if (spans[i].nbytes) memcpy(spans[i].data, from, spans[i].nbytes);
            from += spans[i].nbytes;
        }
    }
    if (spans != stack_spans) free(spans);
    if (e) {
        reject_incoming(msg, true, e);
        return;
    }
    mpri_dispatch(msg);
}

/* Header received into `msg` (its bytes follow the struct): validate,
 * allocate the tensors and plan their batches; a message without tensors is
 * dispatched at once; one with more than POST_LOCKED_MAX_BYTES of tensors
 * goes to `*to_post`, whose receives the polling thread posts once it
 * released the poll lock, one with less has them posted here. */
static void start_incoming(mpri_msg_t *msg, size_t len, int src, mpri_msg_t **to_post) {
    uint8_t *data = msg->data;
    msg->len = len;
    msg->src = src;
    mpr_err_t e = mpri_wire_header_read(data, len, &msg->hdr);
    if (e) {
        reject_incoming(msg, false, e);
        return;
    }
    msg->body = data + sizeof(mpri_wire_header_t);
    uint32_t n = msg->hdr.tensor_count;
    mpri_reader_t r;
    mpri_reader_init(&r, msg->body + msg->hdr.body_len, len - sizeof(mpri_wire_header_t) - msg->hdr.body_len);
    if (n == 0) {
        if (r.left != 0) {
            mpr_error_set(MPR_ERR_DECODE, "%zu stray bytes after the body", r.left);
            reject_incoming(msg, true, MPR_ERR_DECODE);
            return;
        }
        mpri_dispatch(msg);
        return;
    }
    mpri_msg_tensors_alloc(msg, n);
    if (msg->tensors && (msg->hdr.flags & MPRI_FLAG_TENSORS_INLINE)) {
        start_inline(msg, &r, n);
        return;
    }
    msg->reqs = malloc(sizeof *msg->reqs * n);
    msg->plan = malloc(sizeof *msg->plan);
    if (msg->plan && !mpri_batch_scratch_init(msg->plan, n, NULL)) {
        free(msg->plan);
        msg->plan = NULL;
    }
    if (!msg->tensors || !msg->reqs || !msg->plan) {
        mpr_error_set(MPR_ERR_NOMEM, "out of memory for %u tensors", n);
        reject_incoming(msg, true, MPR_ERR_NOMEM);
        return;
    }
    e = mpri_tensor_descs_decode_spans(&r, n, msg->tensors, msg->plan->spans, &msg->placement);
    if (!e && r.left != 0) {
        drop_decoded_tensors(msg);
        e = mpr_error_set(MPR_ERR_DECODE, "%zu stray bytes after the tensor descriptors", r.left);
    }
    if (e) {
        reject_incoming(msg, true, e);
        return;
    }
    /* The same batches the sender made (mpri_tensor_batches.h). */
    msg->nreqs = (int)mpri_batches_plan(msg->plan->spans, n, msg->plan->starts);
    if ((uint32_t)msg->nreqs != msg->hdr.batch_count) {
        for (uint32_t i = 0; i < n; i++) {
            mpr_tensor_release(msg->tensors[i]);
            msg->tensors[i] = NULL;
        }
        mpr_error_set(MPR_ERR_DECODE, "%u tensor batches announced, the descriptors make %d",
                      msg->hdr.batch_count, msg->nreqs);
        reject_incoming(msg, true, MPR_ERR_DECODE);
        return;
    }
    atomic_fetch_add(&prog.busy, 1);
    atomic_fetch_add(&prog.posting, 1);
    /* A few KiB of data came with the message (Open MPI's eager path: the
     * receive copies at most that much): posted now, under the lock, and
     * dispatched by this same poll (test_assembling), not the next one. */
    size_t data_bytes = 0;
    for (uint32_t i = 0; i < n && data_bytes <= POST_LOCKED_MAX_BYTES; i++)
        data_bytes += msg->plan->spans[i].nbytes;
    if (data_bytes <= POST_LOCKED_MAX_BYTES) {
        post_receives(msg);
        return;
    }
    msg->next = *to_post;
    *to_post = msg;
}

/* Post the data receives of `msg` (outside the poll lock: Open MPI copies a
 * batch whose data has already arrived inside MPI_Irecv), then hand it to
 * the pollers through `posted`. */
static void post_receives(mpri_msg_t *msg) {
    mpri_batch_scratch_t *plan = msg->plan;
    for (int b = 0; b < msg->nreqs; b++) {
        int rc = mpri_batch_post(false, plan->spans, plan->starts[b], plan->starts[b + 1], msg->src,
                                 (int)msg->hdr.data_tag, mpri_rt.comm, NULL, &msg->reqs[b]);
        if (rc != MPI_SUCCESS) {
            msg->reqs[b] = MPI_REQUEST_NULL;
            if (!msg->post_error) msg->post_error = rc;
        }
    }
    mpri_batch_scratch_fini(plan);
    free(plan);
    msg->plan = NULL;
    mpri_msg_t *head = atomic_load(&prog.posted);
    do {
        msg->next = head;
    } while (!atomic_compare_exchange_weak(&prog.posted, &head, msg));
    atomic_fetch_sub(&prog.posting, 1);
}

/* Move the messages whose receives were posted to `assembling` (under the
 * poll lock). */
static void take_posted(void) {
    mpri_msg_t *list = atomic_exchange(&prog.posted, NULL);
    while (list) {
        mpri_msg_t *msg = list;
        list = msg->next;
        msg->next = prog.assembling;
        prog.assembling = msg;
    }
}

static int test_assembling(void) {
    int done = 0;
    mpri_msg_t **link = &prog.assembling;
    while (*link) {
        mpri_msg_t *msg = *link;
        int flag = 0;
        MPI_Testall(msg->nreqs, msg->reqs, &flag, MPI_STATUSES_IGNORE);
        if (!flag) {
            link = &msg->next;
            continue;
        }
        *link = msg->next;
        msg->next = NULL;
        free(msg->reqs);
        msg->reqs = NULL;
        atomic_fetch_sub(&prog.busy, 1);
        if (msg->post_error) { /* a batch never posted: its data is drained, the message rejected */
            char text[MPI_MAX_ERROR_STRING];
            for (uint32_t i = 0; i < msg->hdr.tensor_count; i++) {
                mpr_tensor_release(msg->tensors[i]);
                msg->tensors[i] = NULL;
            }
            mpr_error_set(MPR_ERR_MPI, "posting a tensor receive failed: %s",
                          mpri_mpi_error_string(msg->post_error, text, sizeof text));
            reject_incoming(msg, true, MPR_ERR_MPI);
        } else {
            mpri_dispatch(msg);
        }
        done++;
    }
    return done;
}

int mpri_progress_poll(void) {
    if (mpri_state() == MPRI_UNINIT || mpri_state() == MPRI_STOPPED) return 0;
    if (pthread_mutex_trylock(&prog.poll_lock) != 0) return 0;
    bool was_in_context = in_progress_context;
    in_progress_context = true;
    int64_t now = mpri_now_ns();
    atomic_store_explicit(&prog.last_poll_ns, now, memory_order_relaxed);
    atomic_store_explicit(&prog.lock_taken_ns, now, memory_order_relaxed);
    if (!is_progress_thread) atomic_store_explicit(&prog.last_other_poll_ns, now, memory_order_relaxed);
    int events = 0;
    mpri_msg_t *to_post = NULL; /* matched messages whose data receives are still to post */
    /* Messages to ourselves: those queued when the poll began. */
    for (int i = 0; i < 32; i++) {
        mpri_msg_t *msg = mpri_transport_take_local();
        if (!msg) break;
        mpri_dispatch(msg);
        events++;
    }
    for (int i = 0; i < 32; i++) {
        int flag = 0;
        MPI_Message m;
        MPI_Status st;
        if (MPI_Improbe(MPI_ANY_SOURCE, MPRI_TAG_AM, mpri_rt.comm, &flag, &m, &st) != MPI_SUCCESS || !flag)
            break;
        int count = 0;
        MPI_Get_count(&st, MPI_BYTE, &count);
        /* One allocation: the message struct with its bytes behind it. */
        mpri_msg_t *msg = malloc(sizeof *msg + (count > 0 ? (size_t)count : 1));
        if (!msg) { /* nowhere to put it: the message is lost, say so */
            char *scratch = malloc(count > 0 ? (size_t)count : 1);
            MPI_Mrecv(scratch, scratch ? count : 0, MPI_BYTE, &m, MPI_STATUS_IGNORE);
            free(scratch);
            fprintf(stderr, "mpirpc: out of memory receiving from rank %d; message dropped\n", st.MPI_SOURCE);
            mpri_count_processed(st.MPI_SOURCE);
            continue;
        }
        memset(msg, 0, sizeof *msg);
        msg->data = (uint8_t *)(msg + 1);
        msg->data_inline = true;
        MPI_Mrecv(msg->data, count, MPI_BYTE, &m, MPI_STATUS_IGNORE);
        start_incoming(msg, (size_t)count, st.MPI_SOURCE, &to_post);
        events++;
        /* A waiter or a pool poller takes one message per poll: the reply
         * it waits for, or the request it will run, is then handled at
         * once instead of after another probe, which over TCP is an epoll
         * (and a yield with mpi_yield_when_idle) of 5-15 us on each side:
         * no-op calls between two netns "hosts" took 137 us against raw
         * MPI's 56, now 60-74. The progress thread drains up to 32. */
        if (!is_progress_thread) break;
    }
    take_posted();
    if (prog.assembling) events += test_assembling();
    if (prog.draining) events += test_draining(now);
    events += mpri_transport_progress_sends(now);
    atomic_store_explicit(&prog.lock_taken_ns, 0, memory_order_relaxed);
    pthread_mutex_unlock(&prog.poll_lock);
    /* The data receives of the messages matched above, without the lock:
     * meanwhile another thread may poll. */
    while (to_post) {
        mpri_msg_t *msg = to_post;
        to_post = msg->next;
        post_receives(msg);
    }
    in_progress_context = was_in_context;
    return events;
}

/* ---- hooks for waiting threads ---- */

void mpri_progress_waiter_enter(void) { atomic_fetch_add(&prog.active_waiters, 1); }

void mpri_progress_waiter_leave(bool handoff) {
    /* The last active poller leaves: wake the napping progress thread at
     * once, or nobody would poll until its nap ended. (Dekker: the thread
     * sets `napping` before it reads the count, this reads `napping` after
     * it dropped the count; both seq_cst.) */
    if (atomic_fetch_sub(&prog.active_waiters, 1) == 1 && handoff && atomic_load(&prog.napping)) {
        pthread_mutex_lock(&prog.nap_lock);
        pthread_cond_signal(&prog.nap_cond);
        pthread_mutex_unlock(&prog.nap_lock);
    }
    mpri_event_signal(); /* sleeping waiters may take the polling role */
}

static bool waiter_help(void) {
    if (in_progress_context) return false; /* never poll re-entrantly */
    return mpri_progress_poll() > 0;
}

static bool runtime_stopped(void) { return mpri_state() == MPRI_STOPPED; }

/* Callbacks of futures the runtime completes run on the pool, never in the
 * progress context (false: the pool is not running; run them inline). */
static bool defer_to_pool(void (*fn)(void *), void (*drop)(void *), void *arg) {
    return mpri_pool_running() && mpri_pool_submit(fn, drop, arg) == MPR_OK;
}

static bool pool_work_waiting(void) { return mpri_on_pool_thread() && mpri_pool_queued() > 0; }

/* The runtime's side of future waits (installed at start): the future code
 * reaches polling and the pool only through these. */
static const mpri_wait_hooks_t wait_hooks = {
    .enter = mpri_progress_waiter_enter,
    .leave = mpri_progress_waiter_leave,
    .help = waiter_help,
    .stopped = runtime_stopped,
    .defer = defer_to_pool,
    .pool_work_waiting = pool_work_waiting,
    .on_pool_thread = mpri_on_pool_thread,
    .run_pool_task = mpri_pool_try_run_one,
};

/* An idle pool worker polls through these (pool.c knows no progress code). */
static int idle_poll(void) { return mpri_progress_poll(); }
static const mpri_pool_poller_t idle_poller = {mpri_progress_waiter_enter, mpri_progress_waiter_leave,
                                               idle_poll};

/* ---- the progress thread ---- */

/* Bind the progress thread (from the thread that started it, so the binding
 * is in place and reported when mpr_init returns). */
static void bind_progress_thread(pthread_t thread) {
    if (mpri_rt.progress_pu < 0) {
        snprintf(mpri_rt.progress_binding, sizeof mpri_rt.progress_binding, "unbound");
        return;
    }
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0 || hwloc_topology_load(topo) != 0) {
        snprintf(mpri_rt.progress_binding, sizeof mpri_rt.progress_binding, "hwloc failed");
        return;
    }
    hwloc_obj_t pu = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PU, (unsigned)mpri_rt.progress_pu);
    if (!pu) {
        snprintf(mpri_rt.progress_binding, sizeof mpri_rt.progress_binding, "no PU %d", mpri_rt.progress_pu);
    } else if (hwloc_set_thread_cpubind(topo, thread, pu->cpuset, HWLOC_CPUBIND_THREAD) != 0) {
        snprintf(mpri_rt.progress_binding, sizeof mpri_rt.progress_binding, "binding to PU %d failed",
                 mpri_rt.progress_pu);
    } else {
        snprintf(mpri_rt.progress_binding, sizeof mpri_rt.progress_binding, "PU %d (os index %u)",
                 mpri_rt.progress_pu, pu->os_index);
    }
    hwloc_topology_destroy(topo);
}

#define IDLE_SPIN_NS 50000
#define IDLE_YIELD_NS 2000000
#define DEFERRED_MAX_AGE_NS 1000000 /* releases put off longer than this run on this thread */
#define IDLE_SLEEP_MAX_NS 1000000
#define NAP_NS 1000000        /* the longest nap while another thread polls actively */
#define OTHERS_STALE_NS 1000000 /* ... and how long their polls may pause before this thread polls anyway */

/* Sleep while other threads poll actively, until the last of them leaves
 * (mpri_progress_waiter_leave signals) or NAP_NS passes. */
static void nap_while_others_poll(void) {
    int64_t until = mpri_now_ns() + NAP_NS;
    struct timespec ts = {.tv_sec = until / 1000000000LL, .tv_nsec = until % 1000000000LL};
    pthread_mutex_lock(&prog.nap_lock);
    atomic_store(&prog.napping, true);
    while (atomic_load(&prog.active_waiters) > 0 && !atomic_load(&prog.stop))
        if (pthread_cond_timedwait(&prog.nap_cond, &prog.nap_lock, &ts) != 0) break; /* timed out */
    atomic_store(&prog.napping, false);
    pthread_mutex_unlock(&prog.nap_lock);
}

/* What the progress thread is doing, for mpri_progress_describe. */
enum { PHASE_NOT_RUNNING, PHASE_POLLING, PHASE_NAPPING, PHASE_STEPPING_BACK, PHASE_YIELDING_FOR_SENDS,
       PHASE_IDLE_SPIN, PHASE_IDLE_YIELD, PHASE_BELL_SLEEP };
static const char *const phase_names[] = {
    "not running", "polling", "napping while other threads poll", "stepping back (another thread polled < 50 us ago)",
    "polling and yielding (sends in flight)", "idle, spinning", "idle, yielding", "idle, asleep on its bell"};

static void set_phase(int phase) { atomic_store_explicit(&prog.thread_phase, phase, memory_order_relaxed); }

static void *progress_main(void *unused) {
    mpri_trace_name_thread("progress");
    in_progress_context = true;
    is_progress_thread = true;
    int64_t idle_since = mpri_now_ns();
    int64_t sleep_ns = 10000;
    while (!atomic_load(&prog.stop)) {
        /* Step back while another thread polls: one that waits actively
         * (nap up to 1 ms, ended by its handoff), or one that polled in the last 50 us, e.g.
         * a caller issuing pipelined calls (sleep 50 us). Two threads polling
         * one rank only fight over the cores and MPI's locks. */
        bool other_active = atomic_load(&prog.active_waiters) > 0;
        if (other_active || mpri_now_ns() - atomic_load_explicit(&prog.last_other_poll_ns,
                                                                 memory_order_relaxed) < 50000) {
            /* Not the global event: it fires on every completion and would
             * wake this thread for nothing. Few wake-ups are the point: each
             * preempts a spinning poller on a busy core (with 200 us sleeps,
             * ~2% of back-to-back no-op calls took 50-400 us on 2 cores;
             * with 1 ms naps ~0.6%; raw MPI ping-pong 0.2%). A poller that
             * hands off ends the nap at once (without that, calls spaced
             * 500 us apart took over 400 us: nobody polled until it ended). */
            if (other_active) {
                set_phase(PHASE_NAPPING);
                nap_while_others_poll();
            } else {
                set_phase(PHASE_STEPPING_BACK);
                struct timespec ts = {0, 50000};
                nanosleep(&ts, NULL);
            }
            set_phase(PHASE_POLLING);
            mpri_deferred_run_overdue(DEFERRED_MAX_AGE_NS); /* queued during another's wait */
            /* The others poll for us; poll only if they paused (so nothing
             * depends on them), not beside them for poll_lock. */
            if (mpri_now_ns() - atomic_load_explicit(&prog.last_other_poll_ns, memory_order_relaxed) >
                OTHERS_STALE_NS)
                mpri_progress_poll();
            idle_since = mpri_now_ns();
            continue;
        }
        /* The thread is in the progress context throughout; poll() keeps it. */
        /* Messages half-received need MPI progress: stay hot. */
        set_phase(PHASE_POLLING);
        (void)mpri_event_take_woke(); /* only what this poll wakes counts below */
        int events = mpri_progress_poll();
        bool woke = mpri_event_take_woke(); /* a thread asleep in a long wait, its future done */
        mpri_deferred_run_overdue(DEFERRED_MAX_AGE_NS); /* no waiter ran them for a while */
        /* A request queued for a pool worker that was asleep (none spins):
         * give the woken worker this core now, or on a busy machine it
         * waits for a time slice while this thread polls on. Calls spaced
         * 0.5-2 ms apart (the pool's poller gone to sleep between them)
         * took 50-100 us, now 20-50 us, on 2 cores. Never while a worker
         * spins: it takes the task itself, and a yield then only costs
         * (c139c7a's unconditional yield made remote() + to_here() 25x
         * slower). Likewise when the poll woke a thread asleep in a long
         * wait (over 2 ms; its future done): on a rank bound to one core it
         * ran only when this thread's spin ended, 50-80 us later, twice in
         * each 256x256 dist autograd step. */
        if (events > 0 && (woke || (mpri_pool_queued() > 0 && mpri_pool_spinning() == 0))) sched_yield();
        if (events > 0 || atomic_load(&prog.busy) > 0) {
            idle_since = mpri_now_ns();
            sleep_ns = 10000;
            continue;
        }
        /* Sends in flight (e.g. a reply a pool worker sent and left behind)
         * need the sender's progress too (a rendezvous, the peer's FIN), and
         * their peer is about to answer: stay awake, but yield the core each
         * time, since these can last as long as the peer takes (4 ranks on 2
         * cores under ASan starved otherwise). */
        if (mpri_transport_sends_in_flight() > 0) {
            idle_since = mpri_now_ns();
            sleep_ns = 10000;
            set_phase(PHASE_YIELDING_FOR_SENDS);
            sched_yield();
            continue;
        }
        int64_t idle = mpri_now_ns() - idle_since;
        if (idle < IDLE_SPIN_NS) {
            set_phase(PHASE_IDLE_SPIN);
            mpri_cpu_relax();
        } else if (idle < IDLE_YIELD_NS) {
            set_phase(PHASE_IDLE_YIELD);
            sched_yield();
        } else {
            mpri_deferred_run_some(); /* idle for 2 ms: no waiter ran them */
            set_phase(PHASE_BELL_SLEEP);
            /* Asleep on this rank's bell: a peer on this host that posts a
             * message rings it (doorbell.c); the timeout bounds the wait
             * for the others. */
            if (mpri_doorbell_sleep(sleep_ns, mpri_progress_poll) > 0) {
                idle_since = mpri_now_ns();
                sleep_ns = 10000;
                continue;
            }
            if (sleep_ns < IDLE_SLEEP_MAX_NS) sleep_ns *= 2;
        }
    }
    set_phase(PHASE_NOT_RUNNING);
    return NULL;
}

/* Messages whose data receives could be neither cancelled nor completed at
 * stop: MPI may still write into their tensors, so they are kept, never
 * freed (reachable from here, not leaked). */
static mpri_msg_t *abandoned;

#define ABANDON_WAIT_NS 100000000 /* how long a stop waits for cancelled receives */

/* Stop assembling `msg` (non-graceful stop): cancel its open batch receives
 * (msg->nreqs of them; finished ones are MPI_REQUEST_NULL), wait a bounded
 * time for the cancellations to complete, then free the message. A receive
 * that MPI already matched cannot be cancelled and completes only when its
 * data arrives: if that does not happen in time, the message is parked in
 * `abandoned` instead of freeing tensors MPI may still write. */
static void abandon_incoming(mpri_msg_t *msg) {
    MPRI_ASSERT(msg->reqs && msg->nreqs > 0 && (uint32_t)msg->nreqs <= msg->hdr.tensor_count,
                "an assembling message has one receive per batch");
    for (int b = 0; b < msg->nreqs; b++)
        if (msg->reqs[b] != MPI_REQUEST_NULL) MPI_Cancel(&msg->reqs[b]);
    int64_t deadline = mpri_now_ns() + ABANDON_WAIT_NS;
    int flag = 0;
    for (;;) {
        MPI_Testall(msg->nreqs, msg->reqs, &flag, MPI_STATUSES_IGNORE);
        if (flag || mpri_now_ns() > deadline) break;
        sched_yield();
    }
    if (!flag) {
        msg->next = abandoned;
        abandoned = msg;
        return;
    }
    mpri_msg_done(msg);
}

/* Milliseconds from `then` to `now` (a store racing the reader may be a
 * little after `now`: 0). */
static double ms_since(int64_t now, int64_t then) { return then && then < now ? (double)(now - then) / 1e6 : 0.0; }

void mpri_progress_describe(FILE *out, int64_t now) {
    int64_t taken = atomic_load_explicit(&prog.lock_taken_ns, memory_order_relaxed);
    fprintf(out, "  progress thread: %s; last poll %.3f ms ago (by another thread: %.3f ms ago)\n",
            phase_names[atomic_load_explicit(&prog.thread_phase, memory_order_relaxed)],
            ms_since(now, atomic_load_explicit(&prog.last_poll_ns, memory_order_relaxed)),
            ms_since(now, atomic_load_explicit(&prog.last_other_poll_ns, memory_order_relaxed)));
    fprintf(out, "  polling: active waiters %d, poll lock %s", atomic_load(&prog.active_waiters),
            taken ? "held" : "free");
    if (taken) fprintf(out, " (for %.3f ms)", ms_since(now, taken));
    fprintf(out, ", messages with tensors %ld (posting receives outside the lock: %d)\n", atomic_load(&prog.busy),
            atomic_load(&prog.posting));
    /* The lists are the polling thread's: read them between polls. Polls
     * are short and never wait for this lock (trylock); one stuck inside
     * MPI must not hang the dump. Copied under the lock and printed after,
     * so that a slow `out` does not stop the polling. */
    enum { MAX_LISTED = 16 };
    struct {
        int src;
        unsigned kind, tensors, left;
        int nreqs;
        int64_t give_up_ns;
    } assembling[MAX_LISTED], draining[MAX_LISTED];
    int n_asm = 0, n_drain = 0, total_asm = 0;
    if (!mpri_describe_lock(out, &prog.poll_lock, "incoming messages assembling")) return;
    for (const mpri_msg_t *m = prog.assembling; m; m = m->next, total_asm++)
        if (n_asm < MAX_LISTED) {
            assembling[n_asm].src = m->src;
            assembling[n_asm].kind = m->hdr.kind;
            assembling[n_asm].tensors = m->hdr.tensor_count;
            assembling[n_asm++].nreqs = m->nreqs;
        }
    for (const drain_t *d = prog.draining; d && n_drain < MAX_LISTED; d = d->next, n_drain++) {
        draining[n_drain].src = d->src;
        draining[n_drain].left = d->left;
        draining[n_drain].give_up_ns = d->give_up_ns;
    }
    pthread_mutex_unlock(&prog.poll_lock);
    for (int i = 0; i < n_asm; i++)
        fprintf(out, "  assembling: from rank %d, kind %u, %u tensors in %d receives\n", assembling[i].src,
                assembling[i].kind, assembling[i].tensors, assembling[i].nreqs);
    if (total_asm > n_asm) fprintf(out, "  assembling: ... %d in all\n", total_asm);
    for (int i = 0; i < n_drain; i++)
        fprintf(out, "  draining a rejected message's data: from rank %d, %u parts left, giving up in %.0f ms\n",
                draining[i].src, draining[i].left, (double)(draining[i].give_up_ns - now) / 1e6);
}

mpr_err_t mpri_progress_start(void) {
    atomic_store(&prog.stop, false);
    mpri_future_set_wait_hooks(&wait_hooks);
    mpri_pool_set_poller(&idle_poller);
    mpr_err_t e = mpri_pending_timer_start();
    if (e) return e;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&prog.nap_cond, &attr);
    pthread_condattr_destroy(&attr);
    if (pthread_create(&prog.thread, NULL, progress_main, NULL) != 0) {
        pthread_cond_destroy(&prog.nap_cond);
        mpri_pending_timer_stop();
        return mpr_error_set(MPR_ERR_NOMEM, "cannot start the progress thread");
    }
    prog.thread_started = true;
    mpri_name_runtime_thread(prog.thread, "progress");
    bind_progress_thread(prog.thread);
    return MPR_OK;
}

void mpri_progress_stop(void) {
    if (prog.thread_started) {
        atomic_store(&prog.stop, true);
        pthread_mutex_lock(&prog.nap_lock);
        pthread_cond_signal(&prog.nap_cond);
        pthread_mutex_unlock(&prog.nap_lock);
        mpri_doorbell_wake_self(); /* asleep on its bell: it sees `stop` now */
        pthread_join(prog.thread, NULL);
        prog.thread_started = false;
        pthread_cond_destroy(&prog.nap_cond);
    }
    /* Anything still assembling or sending is abandoned (non-graceful stop).
     * No poll starts any more (the state is STOPPED); one under way may
     * still be posting receives: wait for it. */
    while (atomic_load(&prog.posting) > 0) sched_yield();
    pthread_mutex_lock(&prog.poll_lock);
    take_posted();
    while (prog.assembling) {
        mpri_msg_t *msg = prog.assembling;
        prog.assembling = msg->next;
        atomic_fetch_sub(&prog.busy, 1);
        abandon_incoming(msg);
    }
    while (prog.draining) {
        drain_t *d = prog.draining;
        prog.draining = d->next;
        free(d);
        atomic_fetch_sub(&prog.busy, 1);
    }
    pthread_mutex_unlock(&prog.poll_lock);
    mpri_pending_timer_stop();
    mpri_transport_stop();
}
