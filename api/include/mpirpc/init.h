/* mpirpc/init.h — starting and stopping the runtime, workers, a barrier,
 * debug info.
 *
 * mpr_init() joins the calling rank to the mpirpc world (collective over the
 * communicator). If MPI is not initialized, it calls
 * MPI_Init_thread(MPI_THREAD_MULTIPLE) and mpr_shutdown() finalizes MPI. If
 * the host program already initialized MPI, mpirpc adopts `comm` (any
 * communicator, default MPI_COMM_WORLD), duplicates it so its traffic never
 * meets the host's, requires MPI_THREAD_MULTIPLE, and never finalizes MPI.
 * A failed mpr_init can be retried: an MPI that mpirpc initialized stays
 * initialized after the failure (the retry adopts it and mpr_shutdown later
 * finalizes it); if no retry succeeds, mpirpc finalizes it at process exit.
 *
 * NULL arguments: every function here returns MPR_ERR_INVALID_ARG naming the
 * function and the argument for a NULL pointer it needs (mpr_init(NULL) means
 * the defaults), with or without a running runtime. Outputs (*out, *rank) are
 * cleared (zeroed; worker rank -1) first, so on failure they hold no stale data.
 *
 * Worker names: letters, digits, '_', ':' and '-', 1 to 127 characters;
 * default "worker<rank>"; gathered at init, and an invalid or duplicate name
 * anywhere fails mpr_init on every rank with the same error. */
#ifndef MPIRPC_INIT_H
#define MPIRPC_INIT_H

#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>

#include "mpirpc/error.h"
#include "mpirpc/value.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mpr_init_options {
    const char *name;         /* this rank's worker name; NULL: "worker<rank>" */
    int num_worker_threads;   /* worker pool size; 0: 4 */
    double rpc_timeout_s;     /* default per-call timeout; 0: none (default 60) */
    double shutdown_timeout_s;/* graceful shutdown limit in s; 0 (default, as PyTorch): none, serve until all are done */
    MPI_Comm comm;            /* communicator to adopt; MPI_COMM_NULL: MPI_COMM_WORLD */
    int progress_thread_pu;   /* bind the progress thread to this hwloc PU; -1: no binding */
    int *argc;                /* passed to MPI_Init_thread when mpirpc initializes MPI */
    char ***argv;
} mpr_init_options_t;

/* Fill `opts` with the defaults. */
void mpr_init_options_default(mpr_init_options_t *opts);

/* Collective over the communicator. `opts` NULL: defaults. Errors:
 * MPR_ERR_INVALID_ARG (bad or duplicate names, bad options),
 * MPR_ERR_ALREADY_INITIALIZED, MPR_ERR_MPI (including an insufficient thread
 * level, named in the detail). */
mpr_err_t mpr_init(const mpr_init_options_t *opts);

/* graceful (true): returns once every worker still in the job has called
 * mpr_shutdown(true) and every request, reply and internal message anywhere
 * has been processed. Until then this rank keeps serving: its handlers run,
 * may call other workers and use their RRefs, which stay valid; only new
 * calls from application threads fail (MPR_ERR_SHUTDOWN). Once the job is
 * quiescent every UserRRef is deleted and those deletions are completed
 * before the rank stops; an RRef still leaked then is reported on stderr
 * ("RRef leak: ..."). Workers that left with mpr_shutdown(false) are not
 * waited for. If the shutdown timeout passes first: MPR_ERR_TIMEOUT, the
 * runtime is stopped locally and a self-initialized MPI is not finalized,
 * since the peers may still send this rank their shutdown reports: end such
 * a job with MPI_Abort; a host that initialized MPI keeps using it and
 * finalizes it as usual.
 *
 * Non-graceful (false): stops this rank now, without waiting for the other
 * workers: it tells every peer it leaves, waits (at most a few seconds) for
 * their acknowledgement, and for handlers already running on it to return
 * (their replies are dropped), then stops. Its own pending futures fail with
 * MPR_ERR_SHUTDOWN. What the peers see: their calls to it still waiting fail
 * at once with MPR_ERR_SHUTDOWN ("<name> (rank r) left the job ... before
 * replying"), new calls to it fail at once with MPR_ERR_SHUTDOWN ("<name>
 * (rank r) has left the job"), and their graceful shutdown completes without
 * it. If mpirpc initialized MPI, MPI_Finalize runs at process exit (it waits
 * for every rank); mpr_init then fails with MPR_ERR_SHUTDOWN.
 *
 * Either way, afterwards every API call returns MPR_ERR_SHUTDOWN, and a
 * second mpr_shutdown returns MPR_ERR_SHUTDOWN. Called inside a handler or a
 * future callback (a worker-pool thread), mpr_shutdown returns MPR_ERR_STATE
 * and changes nothing (the handler's caller still gets its reply): call it
 * from an application thread. */
mpr_err_t mpr_shutdown(bool graceful);

/* True between a successful mpr_init and mpr_shutdown. */
bool mpr_is_running(void);

/* Worker lookups. MPR_ERR_NOT_FOUND for an unknown name or rank. */
mpr_err_t mpr_get_worker_info(const char *name, mpr_worker_info_t *out);
mpr_err_t mpr_get_worker_info_by_rank(int rank, mpr_worker_info_t *out);
mpr_err_t mpr_get_self_worker_info(mpr_worker_info_t *out);
/* Number of workers (0 before init and after shutdown). */
int mpr_world_size(void);

/* Wait until every worker called mpr_barrier (collective over all workers,
 * like MPI_Barrier on the mpirpc communicator): e.g. after each rank built the
 * state its handlers need and before anyone calls them. The waiting thread
 * sleeps (exponential backoff up to 1 ms), so it does not burn a core; calls
 * to this rank are served meanwhile. timeout_s: MPR_TIMEOUT_DEFAULT (< 0) the
 * default RPC timeout, 0 none, > 0 seconds. Errors: MPR_ERR_TIMEOUT (the
 * barrier stays pending: the next mpr_barrier on this rank keeps waiting for
 * that same barrier rather than starting a new one), MPR_ERR_NOT_INITIALIZED,
 * MPR_ERR_SHUTDOWN, MPR_ERR_MPI. Do not call it from a handler while other
 * ranks wait for that handler's reply (they cannot reach the barrier). */
mpr_err_t mpr_barrier(double timeout_s);

/* Checks a worker name (MPR_ERR_INVALID_ARG with the reason). */
mpr_err_t mpr_validate_worker_name(const char *name);

/* Where a call goes: a worker name, a rank, or a worker info. */
typedef struct mpr_dest {
    enum { MPR_DEST_NAME, MPR_DEST_RANK } kind;
    const char *name;
    int rank;
} mpr_dest_t;

static inline mpr_dest_t mpr_to_name(const char *name) {
    mpr_dest_t d = {MPR_DEST_NAME, name, -1};
    return d;
}
static inline mpr_dest_t mpr_to_rank(int rank) {
    mpr_dest_t d = {MPR_DEST_RANK, 0, rank};
    return d;
}
static inline mpr_dest_t mpr_to_worker(const mpr_worker_info_t *w) {
    mpr_dest_t d = {MPR_DEST_RANK, 0, w ? w->rank : -1};
    return d;
}
/* Resolve to a rank (MPR_ERR_NOT_FOUND / MPR_ERR_INVALID_ARG). */
mpr_err_t mpr_dest_rank(mpr_dest_t to, int *rank);

typedef struct mpr_debug_info {
    int rank, world_size, num_worker_threads;
    char progress_binding[64]; /* "unbound", "PU 1 (os index 1)", or why not */
    long pending_requests;     /* outgoing requests awaiting replies */
    long pool_busy;            /* tasks queued or running */
    long progress_busy;        /* incoming messages assembling or drained, sends in flight
                                * (not those abandoned past their call's deadline) */
    unsigned long long msgs_sent, msgs_processed;
    /* RRef protocol (zero until the RRef layer reports); rref_unacked_ctrl_msgs:
     * control messages sent (user deletes, fork requests, creations) whose
     * acknowledgement has not arrived */
    long rref_owners, rref_users, rref_pending_users, rref_pending_children, rref_unacked_ctrl_msgs;
    /* Distributed autograd (mpirpc/dist_autograd.h): contexts alive on this
     * worker; graph nodes and tensors alive in this process (leak checks). */
    long dist_contexts, autograd_nodes, tensors;
} mpr_debug_info_t;

/* Snapshot of this rank's runtime counters (works after shutdown too). */
mpr_err_t mpr_get_debug_info(mpr_debug_info_t *out);

/* Write what this rank's runtime is doing and waiting for to `out`, as
 * lines of text for a person diagnosing a hang or a slow job: the counters
 * above; the requests awaiting replies (peer, function, age); the sends in
 * flight (peer, age); the incoming messages whose tensors are arriving; the
 * progress thread's state and when MPI was last polled; the worker pool.
 * Callable from any thread at any time (not from a signal handler: it
 * takes locks); the lists are snapshots taken one after another, not one
 * atomic picture. `out` is borrowed and flushed. */
mpr_err_t mpr_debug_dump(FILE *out);

#ifdef __cplusplus
}
#endif
#endif
