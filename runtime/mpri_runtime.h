/* mpri_runtime.h — the runtime's process-wide state and its internal API:
 * world (ranks, names), messages in and out, requests awaiting replies,
 * progress, termination counters (not installed).
 *
 * Lifecycle (one per process; transitions in shutdown.c, which documents them):
 *   UNINIT --mpr_init--> RUNNING --shutdown(graceful)--> STOPPING --> STOPPED
 *                               \--shutdown(non-graceful)--> LEAVING --> STOPPED
 * In STOPPING the rank still serves: threads serving incoming work (pool
 * threads) may still call and use RRefs; every other API call returns
 * MPR_ERR_SHUTDOWN. In LEAVING the progress thread still runs (to receive the
 * peers' LEAVE_ACKs) but every API call fails. */
#ifndef MPRI_RUNTIME_H
#define MPRI_RUNTIME_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>

#include "mpri_buf.h"
#include "mpri_codec.h"
#include "mpri_wire.h"
#include "mpirpc/future.h"
#include "mpirpc/init.h"
#include "mpirpc/value.h"

enum { MPRI_UNINIT = 0, MPRI_RUNNING, MPRI_STOPPING, MPRI_LEAVING, MPRI_STOPPED };

typedef struct mpri_runtime {
    atomic_int state;
    MPI_Comm comm;      /* private duplicate: active messages and tensor data */
    MPI_Comm ctrl_comm; /* private duplicate: shutdown collectives */
    MPI_Comm barrier_comm; /* private duplicate: mpr_barrier (runtime/barrier.c) */
    int rank, size;
    bool own_mpi;       /* we called MPI_Init_thread and will finalize at shutdown */
    mpr_worker_info_t *workers; /* [size] */
    int num_worker_threads;
    double default_timeout_s;
    int tag_ub;
    atomic_uint_fast64_t next_request_id;
    atomic_uint data_tag_counter;
    /* termination detection: messages sent, messages fully processed, also
     * per peer ([size], allocated by mpri_shutdown_prepare) so that the
     * traffic with a departed peer can be left out */
    atomic_uint_fast64_t msgs_sent, msgs_processed;
    atomic_uint_fast64_t *sent_to, *processed_from;
    atomic_bool *peer_gone; /* [size]: the peer left (LEAVE received); nothing more is sent to it */
    int progress_pu;           /* -1: progress thread not bound */
    char progress_binding[64]; /* what binding was applied, for debug info */
} mpri_runtime_t;

extern mpri_runtime_t mpri_rt;

static inline int mpri_state(void) { return atomic_load_explicit(&mpri_rt.state, memory_order_acquire); }

/* Message accounting for termination detection: every message is counted
 * sent (by its sender, before it can be received) and processed (by its
 * receiver, in mpri_msg_done), globally and per peer. */
static inline void mpri_count_sent(int dst) {
    atomic_fetch_add(&mpri_rt.msgs_sent, 1);
    if (mpri_rt.sent_to) atomic_fetch_add(&mpri_rt.sent_to[dst], 1);
}
static inline void mpri_uncount_sent(int dst) { /* the send failed before anything left */
    atomic_fetch_sub(&mpri_rt.msgs_sent, 1);
    if (mpri_rt.sent_to) atomic_fetch_sub(&mpri_rt.sent_to[dst], 1);
}
static inline void mpri_count_processed(int src) {
    atomic_fetch_add(&mpri_rt.msgs_processed, 1);
    if (mpri_rt.processed_from) atomic_fetch_add(&mpri_rt.processed_from[src], 1);
}
/* True once `rank` announced that it left the job (mpr_shutdown(false)). */
static inline bool mpri_peer_gone(int rank) {
    return mpri_rt.peer_gone && rank >= 0 && rank < mpri_rt.size && atomic_load(&mpri_rt.peer_gone[rank]);
}
/* Allocate the per-peer state of shutdown.c and install its handlers (LEAVE,
 * LEAVE_ACK); called by mpr_init once the world size is known. */
mpr_err_t mpri_shutdown_prepare(void);
/* True once mpr_shutdown(false) left MPI_Finalize to process exit. */
bool mpri_finalize_pending_at_exit(void);

/* MPR_OK if API calls are allowed now from this thread; else an error
 * (not initialized / shut down) with detail naming `what`. */
mpr_err_t mpri_check_running(const char *what);

/* ---- outgoing messages ---- */
typedef struct mpri_outmsg {
    mpri_wire_header_t hdr;   /* kind, flags, ids; lengths are filled by send */
    mpri_buf_t wire;          /* the encoded message: room for the header, the body, then
                               * (added by send) the tensor descriptors */
    mpri_tensor_list_t tensors;
    bool left;                /* set by send once the message is on its way (its header
                               * posted to MPI, or queued for this rank): the receiver
                               * will see it, whatever send returns afterwards */
} mpri_outmsg_t;

void mpri_outmsg_init(mpri_outmsg_t *m, int kind);
void mpri_outmsg_fini(mpri_outmsg_t *m);
/* Send `m` to `dst` (self included: queued in the local inbox, no MPI).
 * Consumes `m` whatever the outcome. Never blocks: what MPI has not finished
 * at return stays in flight (owning the bytes and tensor references) and is
 * completed by polling; past `give_up_ns` (0: never) it is abandoned
 * (transport.c). mpri_send gives up after the default timeout. */
mpr_err_t mpri_send(int dst, mpri_outmsg_t *m);
mpr_err_t mpri_send_until(int dst, mpri_outmsg_t *m, int64_t give_up_ns);
/* Test the sends in flight (the progress context calls it); returns how many
 * completed. */
int mpri_transport_progress_sends(int64_t now_ns);
/* Sends in flight not yet abandoned (busy work), and abandoned ones. */
long mpri_transport_sends_in_flight(void);
long mpri_transport_sends_abandoned(void);
/* Tensor data messages (batches) this rank posted to others so far: tests
 * check that small tensors went inside their message (mpri_wire.h). */
unsigned long long mpri_transport_batches_posted(void);
/* For the describe functions (mpr_debug_dump): lock `m` within 200 ms, or
 * write "<what>: not listed: the lock is held (by thread <tid>)" to `out`
 * and return false. A dump must not hang on the lock of a stuck thread,
 * and naming the holder tells which thread it is (debug.c). */
bool mpri_describe_lock(FILE *out, pthread_mutex_t *m, const char *what);
/* A few lines on the sends in flight and the local inbox (mpr_debug_dump). */
void mpri_transport_describe(FILE *out, int64_t now_ns);
/* Next message sent to ourselves, or NULL (the poller dispatches it). */
struct mpri_msg *mpri_transport_take_local(void);
/* At stop: test the sends once more, park the rest, drop the local inbox. */
void mpri_transport_stop(void);

/* ---- incoming messages ---- */
typedef struct mpri_msg {
    mpri_wire_header_t hdr;
    int src;
    uint8_t *data; /* the whole received message (header, body, descriptors) */
    size_t len;
    bool data_inline; /* `data` lives in the same allocation as the struct */
    const uint8_t *body;
    mpr_tensor_t **tensors; /* [hdr.tensor_count], received (inline_tensors for a few: mpri_msg_tensors_alloc) */
    mpr_tensor_t *inline_tensors[2];
    struct mpri_tensor_placement *placement; /* device tensors: copied to their devices at value decode */
    MPI_Request *reqs;      /* data receives (one per batch) while assembling */
    int nreqs;
    struct mpri_batch_scratch *plan; /* the batch plan, from validation until the receives are posted */
    int post_error;                  /* an MPI error posting a receive (progress.c) */
    int64_t recv_ns;     /* tracing/statistics on: when it was dispatched (else 0) */
    uint64_t wire_bytes; /* tracing/statistics on: its bytes, tensor data included */
    struct mpri_msg *next;
} mpri_msg_t;

/* msg->tensors for `n` tensors, zeroed: inside the message for a few, else
 * from the heap; false when out of memory. mpri_msg_tensors_free gives it
 * back (msg->tensors becomes NULL). */
bool mpri_msg_tensors_alloc(mpri_msg_t *msg, uint32_t n);
void mpri_msg_tensors_free(mpri_msg_t *msg);

/* Free a message and count it processed (termination detection). Every
 * handler calls this exactly once per message it was given. */
void mpri_msg_done(mpri_msg_t *msg);

/* The message's received tensors, for a body that names them by index
 * itself instead of holding a value: device tensors are put on their
 * devices first (as a value decode does). Borrowed: valid until
 * mpri_msg_done. */
mpr_err_t mpri_msg_tensors(mpri_msg_t *msg, mpr_tensor_t *const **tensors, uint32_t *count);
/* Decode the message body as one value (after `skip` bytes). */
mpr_err_t mpri_msg_decode_value(const mpri_msg_t *msg, size_t skip, mpr_value_t **out);
/* The same, the value taking over the message's references to the tensors
 * it names (mpri_value_decode_taking): two atomics fewer per tensor, and
 * mpri_msg_done has those no more to drop. For the last decode of a
 * message whose tensors nobody reads afterwards (not one with an autograd
 * context: the recording hooks read msg->tensors after the decode). */
mpr_err_t mpri_msg_take_value(mpri_msg_t *msg, size_t skip, mpr_value_t **out);

/* ---- dispatch (dispatch.c) ---- */
typedef void (*mpri_msg_handler_t)(mpri_msg_t *msg);
/* Install the handler of request kind `kind` (before mpr_init). Inline
 * handlers run in the progress context and must never block; the others run
 * on the worker pool. Returns MPR_ERR_INVALID_ARG for a kind outside the wire
 * format's kinds or a NULL handler; installing a different handler over an
 * installed one is a bug (MPRI_ASSERT). */
mpr_err_t mpri_set_handler(int kind, mpri_msg_handler_t fn, bool run_inline);
/* A pool-run request kind's rejection: `msg` will not reach its handler (the
 * pool could not queue it, or the runtime stopped before a worker ran it).
 * The kind settles what the request carries as a failed request would (the
 * RRef forks among its arguments, the owner record a REMOTE_CALL creates),
 * replies `code` and `text` when `reply` (not at a stop: nothing is sent
 * then) and finishes the message (mpri_msg_done). Installed once per kind,
 * before mpr_init; kinds without one are answered with the error and
 * finished. */
typedef void (*mpri_msg_reject_t)(mpri_msg_t *msg, mpr_err_t code, const char *text, bool reply);
mpr_err_t mpri_set_reject_handler(int kind, mpri_msg_reject_t reject);
/* Run `fn` on request `msg` as its handler (consumes msg): traced, the run is
 * the request's "handle" slice, where its call arrow ends. For a handler that
 * hands a request on (its own queue, a pool task): call this where the
 * request finally runs, and mpri_trace_handoff() in the routing handler. */
void mpri_dispatch_run_handler(mpri_msg_handler_t fn, mpri_msg_t *msg);
/* Dispatch a complete incoming message: a reply completes its pending
 * future (or is dropped), a request goes to its kind's handler. Takes the
 * message; never blocks. */
void mpri_dispatch(mpri_msg_t *msg);
/* Hook run on every successful reply whose header carries an autograd
 * context id, after its value was decoded and before the future waiting for
 * it completes (distributed autograd records a recv function for the
 * value's tensors). `v` is the decoded value (borrowed). An error it returns
 * (its text in the thread's error) fails the future instead, the value
 * released: a reply whose gradient path could not be recorded is not handed
 * over as if it had one. Installed once, before mpr_init. */
void mpri_set_reply_value_hook(mpr_err_t (*hook)(const mpri_msg_t *msg, mpr_value_t *v));
/* Replies of `kind` carry a body of their own (mpri_reply_begin), not a
 * value: `decode` makes the value their future completes with (a new
 * reference in *out; the message's tensors stay the message's unless it
 * takes them). Error replies are read as usual. Installed before mpr_init;
 * MPR_ERR_INVALID_ARG for a kind outside the wire's kinds or a NULL
 * decoder. */
typedef mpr_err_t (*mpri_reply_decoder_t)(mpri_msg_t *msg, mpr_value_t **out);
mpr_err_t mpri_set_reply_decoder(int kind, mpri_reply_decoder_t decode);

/* ---- requests (request.c) and replies (transport.c) ---- */
/* Send request `m` to `dst` and return a future for its reply (new
 * reference). timeout_s: < 0 the default, 0 none. `label` names the request
 * in timeout/error messages (e.g. the function name). Consumes `m`. Never
 * blocks: the future fails with MPR_ERR_TIMEOUT within a few milliseconds
 * of the deadline, whatever MPI is doing (pending.c's timer). */
mpr_future_t *mpri_request(int dst, mpri_outmsg_t *m, double timeout_s, const char *label);
/* Reply to `req` with a value (ownership kept by the caller). */
mpr_err_t mpri_reply_value(const mpri_msg_t *req, int kind, const mpr_value_t *v);
/* The same, and `stamp(reply, arg)` sees the encoded reply before it is sent
 * (its tensor list built, its header still open: distributed autograd sets
 * the autograd ids and records a send function for the result's tensors).
 * Not called when the value cannot be encoded; an error reply goes instead
 * of the value then, and when `stamp` fails (its text in the thread's error). */
mpr_err_t mpri_reply_value_stamped(const mpri_msg_t *req, int kind, const mpr_value_t *v,
                                   mpr_err_t (*stamp)(mpri_outmsg_t *reply, void *arg), void *arg);
/* A reply whose body its kind writes itself (no value): mpri_reply_begin
 * makes `m` the reply of `kind` to `req`; the caller appends the body and
 * tensors, then mpri_reply_send sends it (consumes `m`; nothing is sent
 * when `req` expects no reply). The requester turns the body into the
 * future's value with the kind's decoder (mpri_set_reply_decoder). */
void mpri_reply_begin(const mpri_msg_t *req, int kind, mpri_outmsg_t *m);
mpr_err_t mpri_reply_send(const mpri_msg_t *req, mpri_outmsg_t *m);
/* Reply to `req` with an error. */
mpr_err_t mpri_reply_error(const mpri_msg_t *req, mpr_err_t code, const char *message);
/* Reply to `req` with the error of failed future `f`, a remote failure's
 * origin included (mpri_error.h). */
mpr_err_t mpri_reply_future_error(const mpri_msg_t *req, const mpr_future_t *f);

/* ---- pending requests (pending.c) ---- */
mpr_err_t mpri_pending_add(uint64_t id, mpr_future_t *f, int64_t deadline_ns, int dst,
                           const char *label);
/* The same for a call of function `function_id` (0: none), whose timeout or
 * reply the statistics count. */
mpr_err_t mpri_pending_add_call(uint64_t id, mpr_future_t *f, int64_t deadline_ns, int dst, const char *label,
                                uint64_t function_id);
/* Remove and return the future (its reference passes to the caller), or NULL. */
mpr_future_t *mpri_pending_take(uint64_t id);
/* The same, and the request's function id (0 if none) and the time it was
 * added (0 unless it had a deadline or is a call counted by the statistics). */
mpr_future_t *mpri_pending_take_call(uint64_t id, uint64_t *function_id, int64_t *started_ns);
void mpri_pending_expire(int64_t now_ns);
/* The timer thread that expires deadlines on time, whoever holds the poll
 * lock (started and stopped with the progress thread). */
mpr_err_t mpri_pending_timer_start(void);
void mpri_pending_timer_stop(void);
/* Complete every pending future with `code` (shutdown). */
void mpri_pending_fail_all(mpr_err_t code, const char *message);
/* Complete the pending futures of requests sent to `dst` (it left). */
void mpri_pending_fail_dst(int dst, mpr_err_t code, const char *message);
long mpri_pending_count(void);
/* The requests awaiting replies, at most 32 listed (mpr_debug_dump). */
void mpri_pending_describe(FILE *out, int64_t now_ns);
/* Free the entries kept for reuse (at most 1024 are kept after a burst):
 * tests that count live blocks call it before they count. */
void mpri_pending_cache_trim(void);
/* Free the encode buffers kept for reuse across threads (transport.c's
 * stash): block counts compare equal around a call (test_oom_paths). */
void mpri_transport_cache_trim(void);

/* ---- progress (progress.c) ---- */
mpr_err_t mpri_progress_start(void);
void mpri_progress_stop(void);
/* Poll MPI once if no other thread is polling; returns events handled. */
int mpri_progress_poll(void);
/* A thread that polls in a loop (a waiter, an idle pool worker) registers
 * itself so the progress thread steps back meanwhile. Leaving with
 * `handoff` (the thread will not poll again soon) wakes the progress thread
 * when no other poller remains. */
void mpri_progress_waiter_enter(void);
void mpri_progress_waiter_leave(bool handoff);
/* True on the progress thread or inside a poll (where blocking is forbidden). */
bool mpri_in_progress_context(void);
/* Incoming messages still assembling or being drained, plus sends in flight
 * not yet abandoned. */
long mpri_progress_busy(void);
/* What the progress thread and the polling threads are doing, and the
 * incoming messages assembling (mpr_debug_dump). */
void mpri_progress_describe(FILE *out, int64_t now_ns);

/* Text of an MPI error code. */
const char *mpri_mpi_error_string(int code, char *buf, int len);

/* Start the runtime (world.c): MPI, communicators, names, pool, progress.
 * The public mpr_init (api/src/init.c) calls it after the layers above have
 * installed their handlers and hooks. */
mpr_err_t mpri_world_init(const mpr_init_options_t *opts);

/* The Open MPI setting mpirpc picks for an MPI it starts (mpi_tuning.c says
 * which and when): set just before MPI_Init_thread, removed just after;
 * mpri_mpi_tuned tells whether the last MPI this process started got it. */
void mpri_mpi_tune_before_init(void);
void mpri_mpi_tune_after_init(void);
bool mpri_mpi_tuned(void);

/* ---- hooks for the layers above (world.c) ----
 * Each layer adds its hooks once (in its init, before mpri_world_init); at most MPRI_MAX_HOOKS of each
 * kind; they run in the order added (after_stop in reverse order). */
#define MPRI_MAX_HOOKS 8
/* Called by mpr_get_debug_info to add a layer's counters. */
mpr_err_t mpri_add_debug_info_hook(void (*hook)(mpr_debug_info_t *info));
/* on_quiescent: during a graceful shutdown, on the shutting-down thread, once
 * every live rank called mpr_shutdown(true) and nothing is in flight or
 * running anywhere; the runtime still serves messages, and what the hook
 * sends is drained before the runtime stops (e.g. the RRef layer deletes its
 * user RRefs). after_stop: once the runtime has stopped (drop local state).
 * Either may be NULL. */
mpr_err_t mpri_add_shutdown_hooks(void (*on_quiescent)(void), void (*after_stop)(void));
/* Run them (shutdown.c). */
void mpri_run_quiescent_hooks(void);
void mpri_run_after_stop_hooks(void);

/* Seconds a graceful shutdown may take before it fails with a timeout (<= 0: no
 * limit). Defined in shutdown.c, set by mpri_world_init from opts.shutdown_timeout_s. */
extern double mpri_shutdown_timeout_s;

#endif
