/* shutdown.c — graceful (distributed termination detection) and local stop.
 *
 * Graceful shutdown state machine (per rank):
 *   RUNNING --mpr_shutdown(true)--> STOPPING: new calls from user threads fail;
 *     the layers above release what they hold (before_graceful hook);
 *   STOPPING: rounds of a non-blocking allreduce on the control communicator
 *     sum (messages sent, messages processed, local busy work) over all ranks;
 *     the first round also waits for every rank to enter shutdown. While a
 *     round is in flight this thread keeps polling, so work still arriving is
 *     served. Termination = two consecutive rounds with equal sums, sent ==
 *     processed and nothing busy anywhere (a message processed on one rank
 *     after being counted sent is visible in the next round, so two identical
 *     quiet rounds mean nothing was in flight between them);
 *   --> STOPPED: progress thread and pool stopped, communicators freed, MPI
 *     finalized if mpirpc initialized it. On timeout (MPR_ERR_TIMEOUT) a
 *     round is still pending: the communicators stay, MPI is not finalized,
 *     and the round's buffers are kept alive for MPI for good.
 * Non-graceful: RUNNING --> STOPPED at once; pending futures fail with
 * MPR_ERR_SHUTDOWN. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpri_event.h"
#include "mpri_host_alloc.h"
#include "mpri_pool.h"
#include "mpri_runtime.h"

double mpri_shutdown_timeout_s = 300.0;

static void stop_local(bool free_comms) {
    atomic_store(&mpri_rt.state, MPRI_STOPPED);
    /* Fail what is pending first, so waiters return at once; replies that
     * handlers still send while the pool drains find nothing and are dropped. */
    mpri_pending_fail_all(MPR_ERR_SHUTDOWN, "the runtime shut down before the reply arrived");
    mpri_event_signal();
    mpri_progress_stop();
    mpri_pool_stop();
    mpri_run_after_stop_hooks();
    if (free_comms) {
        MPI_Comm_free(&mpri_rt.comm);
        MPI_Comm_free(&mpri_rt.ctrl_comm);
    }
}

/* The buffers and request of one termination round. MPI owns the buffers
 * until the collective completes, which after a timeout may be long after
 * mpr_shutdown returned (a late rank joins it, and the host's own MPI calls
 * progress it): a round that timed out is parked here, never freed. */
typedef struct round {
    uint64_t local[3], out[3];
    MPI_Request req;
    struct round *next;
} round_t;
static round_t *abandoned_rounds;
static pthread_mutex_t abandoned_lock = PTHREAD_MUTEX_INITIALIZER;

/* One termination round; false on timeout or MPI failure. */
static bool termination_round(uint64_t out[3], int64_t deadline, mpr_err_t *err) {
    round_t *r = calloc(1, sizeof *r);
    if (!r) {
        *err = mpr_error_set(MPR_ERR_NOMEM, "shutdown: out of memory");
        return false;
    }
    r->local[0] = atomic_load(&mpri_rt.msgs_sent);
    r->local[1] = atomic_load(&mpri_rt.msgs_processed);
    r->local[2] = (uint64_t)(mpri_pending_count() + mpri_pool_busy() + mpri_progress_busy());
    if (MPI_Iallreduce(r->local, r->out, 3, MPI_UINT64_T, MPI_SUM, mpri_rt.ctrl_comm, &r->req) != MPI_SUCCESS) {
        free(r);
        *err = mpr_error_set(MPR_ERR_MPI, "shutdown: allreduce failed");
        return false;
    }
    /* This thread only watches the collective: the progress thread and the
     * pool serve the traffic that still flows. Polling here too would put a
     * second spinning thread on the rank (and on a 2-core machine slow every
     * other rank's calls down while this one waits for them). */
    int64_t sleep_ns = 20000;
    for (;;) {
        int flag = 0;
        MPI_Test(&r->req, &flag, MPI_STATUS_IGNORE);
        if (flag) {
            memcpy(out, r->out, sizeof r->out);
            free(r);
            return true;
        }
        if (deadline && mpri_now_ns() > deadline) {
            pthread_mutex_lock(&abandoned_lock);
            r->next = abandoned_rounds;
            abandoned_rounds = r;
            pthread_mutex_unlock(&abandoned_lock);
            *err = mpr_error_set(MPR_ERR_TIMEOUT,
                                 "graceful shutdown timed out after %.1f s (a rank did not call "
                                 "mpr_shutdown, or work never finished)",
                                 mpri_shutdown_timeout_s);
            return false;
        }
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < 1000000) sleep_ns *= 2;
    }
}

mpr_err_t mpr_shutdown(bool graceful) {
    int expected = MPRI_RUNNING;
    if (!atomic_compare_exchange_strong(&mpri_rt.state, &expected, graceful ? MPRI_STOPPING : MPRI_STOPPED))
        return expected == MPRI_UNINIT
                   ? mpr_error_set(MPR_ERR_NOT_INITIALIZED, "mpr_shutdown: not initialized")
                   : mpr_error_set(MPR_ERR_SHUTDOWN, "mpr_shutdown: already shut down");
    mpr_err_t err = MPR_OK;
    bool finished = true;
    if (graceful) {
        mpri_run_before_graceful_hooks();
        int64_t deadline =
            mpri_shutdown_timeout_s > 0 ? mpri_now_ns() + (int64_t)(mpri_shutdown_timeout_s * 1e9) : 0;
        uint64_t prev[3] = {~0ull, ~0ull, ~0ull}, cur[3];
        for (;;) {
            if (!termination_round(cur, deadline, &err)) {
                finished = false;
                break;
            }
            bool quiet = cur[0] == cur[1] && cur[2] == 0;
            if (quiet && cur[0] == prev[0] && cur[1] == prev[1] && prev[2] == 0) break;
            prev[0] = cur[0], prev[1] = cur[1], prev[2] = cur[2];
            if (!quiet) {
                struct timespec ts = {0, 200000};
                nanosleep(&ts, NULL);
            }
        }
    }
    /* After a timed-out round a collective may still be pending: keep the
     * communicators (and MPI) as they are. */
    stop_local(finished);
    free(mpri_rt.workers);
    mpri_rt.workers = NULL;
    mpri_host_cache_trim();
    if (mpri_rt.own_mpi && finished) {
        MPI_Finalize();
        mpri_rt.own_mpi = false;
    }
    return err;
}
