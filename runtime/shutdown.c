/* shutdown.c — leaving the mpirpc world: graceful shutdown (distributed
 * termination detection in point-to-point rounds, in two phases around the
 * layers' quiescent hooks), the non-graceful leave announced to the peers,
 * and the local stop.
 *
 * Rank lifecycle (mpri_rt.state; set_state() asserts every transition):
 *   RUNNING --mpr_shutdown(true)--> STOPPING --rounds reach DONE--> STOPPED
 *   STOPPING --a round not complete by the deadline--> STOPPED (MPR_ERR_TIMEOUT)
 *   RUNNING --mpr_shutdown(false)--> LEAVING --peers acked, or LEAVE_WAIT_S--> STOPPED
 * mpr_shutdown called inside a handler or a callback (a pool thread, or the
 * progress context) is refused with MPR_ERR_STATE and changes nothing: the
 * rank cannot wait for the job to go quiet while it is part of the work, and
 * the handler's caller still gets its reply.
 *
 * Graceful rounds (run by the thread calling mpr_shutdown(true); phases in
 * `g.phase`, set_phase() asserts every transition, check_rounds() checks the
 * round state in Debug builds):
 *   SERVING: the rank keeps serving: its progress thread and pool run, its
 *     handlers may still call out and use their RRefs, which stay valid; only
 *     application threads' new calls fail. The shutting-down thread itself
 *     only runs rounds and never polls MPI for messages (the progress thread
 *     does; a second polling thread would slow the ranks still working on a
 *     2-core machine). A round: the rank sends every live peer its report on
 *     ctrl_comm (tag = round number) and receives theirs. A report is (phase,
 *     messages sent to live ranks, messages processed from live ranks, busy
 *     work: pending requests + pool tasks + messages assembling or sending,
 *     the set of departed ranks). A rank reports only once it called
 *     mpr_shutdown(true), so a complete round means every live rank is in
 *     shutdown. A peer that leaves (LEAVE received) is no longer waited for:
 *     the receive of its report is cancelled, and a round missing a report
 *     is not quiet. (Only a rank that never reported can leave: a rank in
 *     graceful shutdown cannot call mpr_shutdown again.)
 *     A round is quiet when it is complete, every report carries the same
 *     departed set and phase as this rank's, sum(sent) == sum(processed) and
 *     nothing is busy. Two consecutive quiet rounds with equal sums mean the
 *     job is quiescent: a message counted sent but not yet processed in one
 *     round would change a sum or a busy count in the next, so nothing was in
 *     flight between them, and with every rank in shutdown nothing new can
 *     start. Every live rank receives the same reports, so all decide alike.
 *     --quiescent--> the on_quiescent hooks run (the RRef layer deletes every
 *     user RRef: USER_DELETEs leave now) --> DRAINING
 *   DRAINING: the same rounds again until quiescent again: every delete and
 *     its ack has been processed everywhere. --> DONE
 *   DONE: tracing and statistics finish (mpri_observe_finish, collective on
 *     their own communicator: the trace file, the MPIRPC_STATS tables), stop
 *     locally (below), free the communicators, finalize MPI if mpirpc
 *     initialized it.
 *   TIMED_OUT: a round was not complete by the deadline (a live rank did not
 *     call mpr_shutdown, or never went quiet): stop locally, keep the
 *     communicators (a late peer may still send its report) and do not
 *     finalize MPI; the round's buffers stay allocated for MPI for good.
 *
 * Non-graceful leave (LEAVING): API calls fail at once. A LEAVE goes to
 * every live peer; a peer handles it inline (handle_leave): marks the rank
 * departed, fails its pending requests to it with MPR_ERR_SHUTDOWN, refuses
 * new sends to it ("... has left the job"), leaves its traffic out of its
 * termination rounds, and answers LEAVE_ACK, after which it sends it nothing
 * more. MPI keeps each sender's messages in order, so once every live peer
 * acked, everything they sent here has arrived. The rank waits for the acks
 * (its progress thread still runs) and for incoming data to finish
 * assembling, at most LEAVE_WAIT_S (a peer that stopped does not answer),
 * then stops locally. A self-initialized MPI is finalized at process exit
 * (MPI_Finalize waits for every rank, which "stop now" must not).
 * Known limit: a send a peer started to this rank just before handling the
 * LEAVE may still go out after the ack; a small one completes anyway, a
 * large tensor message would wait for a receiver that is gone.
 *
 * Local stop: fail pending futures (MPR_ERR_SHUTDOWN), stop the progress
 * thread and the pool, run the after_stop hooks (the RRef leak report). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpri_assert.h"
#include "mpri_deferred.h"
#include "mpri_doorbell.h"
#include "mpri_event.h"
#include "mpri_host_alloc.h"
#include "mpri_pool.h"
#include "mpri_runtime.h"
#include "mpri_trace.h"

double mpri_shutdown_timeout_s = 0.0; /* no limit, as PyTorch's DEFAULT_SHUTDOWN_TIMEOUT */

#define LEAVE_WAIT_S 5.0

/* ---- rank state transitions ---- */

static void set_state(int from, int to) {
    MPRI_ASSERT((from == MPRI_STOPPING && to == MPRI_STOPPED) || (from == MPRI_LEAVING && to == MPRI_STOPPED),
                "illegal runtime state transition in shutdown");
    int expected = from;
    MPRI_ASSERT(atomic_compare_exchange_strong(&mpri_rt.state, &expected, to),
                "the runtime state changed under the shutting-down thread");
}

/* ---- per-peer state (sized at init) ---- */

/* Owned here (mpr_init clears mpri_rt, which only borrows them). */
static struct {
    atomic_uint_fast64_t *sent_to, *processed_from;
    atomic_bool *peer_gone;
} peers;
static atomic_bool *leave_acked; /* [size]: the peer acknowledged our LEAVE */
static bool finalize_at_exit_registered;

static void *realloc_zeroed(void *p, size_t n, size_t each) {
    free(p);
    return calloc(n ? n : 1, each);
}

bool mpri_finalize_pending_at_exit(void) { return finalize_at_exit_registered; }

/* ---- graceful rounds ---- */

enum { PHASE_IDLE = 0, PHASE_SERVING, PHASE_DRAINING, PHASE_DONE, PHASE_TIMED_OUT };

/* Report layout (u64 words): phase, sent, processed, busy, then the departed
 * set as a bitmap of ceil(size / 64) words. */
enum { R_PHASE, R_SENT, R_PROCESSED, R_BUSY, R_GONE };

typedef struct round {
    uint64_t *mine;  /* [words] */
    uint64_t *peers; /* [size][words] */
    MPI_Request *reqs; /* [size] receives, then [size] sends */
    bool *got;         /* [size] report received (self: true) */
    struct round *next;
} round_t;

static struct {
    int phase;
    uint64_t round; /* rounds started so far (the tag of the next one is round + 1) */
    int quiet_streak; /* consecutive quiet rounds with equal sums, 0..2 */
    uint64_t prev_sent, prev_processed;
    size_t words;
    round_t *parked; /* rounds MPI may still use (timed out, or sends not complete) */
} g;

static void set_phase(int to) {
    static const bool legal[5][5] = {
        [PHASE_IDLE] = {[PHASE_SERVING] = true},
        [PHASE_SERVING] = {[PHASE_DRAINING] = true, [PHASE_TIMED_OUT] = true},
        [PHASE_DRAINING] = {[PHASE_DONE] = true, [PHASE_TIMED_OUT] = true},
        [PHASE_DONE] = {[PHASE_IDLE] = true},
        [PHASE_TIMED_OUT] = {[PHASE_IDLE] = true},
    };
    MPRI_ASSERT(g.phase >= 0 && g.phase < 5 && legal[g.phase][to], "illegal graceful shutdown phase transition");
    g.phase = to;
    g.quiet_streak = 0;
    if (to == PHASE_IDLE) g.round = 0;
}

/* State checker of the rounds (Debug builds; like SQLite's assert_pager_state). */
static void check_rounds(void) {
#if MPRI_DEBUG_CHECKS
    int s = mpri_state();
    MPRI_DEBUG_ASSERT(g.phase >= PHASE_IDLE && g.phase <= PHASE_TIMED_OUT, "phase out of range");
    MPRI_DEBUG_ASSERT(g.phase == PHASE_IDLE || g.phase == PHASE_DONE || g.phase == PHASE_TIMED_OUT ||
                          s == MPRI_STOPPING,
                      "graceful rounds run only while the runtime is STOPPING");
    MPRI_DEBUG_ASSERT(g.quiet_streak >= 0 && g.quiet_streak <= 2, "quiet streak out of range");
    MPRI_DEBUG_ASSERT(g.phase != PHASE_IDLE || g.round == 0, "rounds counted outside a graceful shutdown");
    MPRI_DEBUG_ASSERT(g.words == (size_t)(mpri_rt.size + 63) / 64, "report size does not match the world");
    MPRI_DEBUG_ASSERT(mpri_rt.sent_to && mpri_rt.processed_from && mpri_rt.peer_gone,
                      "per-peer counters missing (mpri_shutdown_prepare not run)");
#endif
}

static void park(round_t *r) {
    r->next = g.parked;
    g.parked = r;
}

static void round_free(round_t *r) {
    if (!r) return;
    free(r->mine);
    free(r->peers);
    free(r->reqs);
    free(r->got);
    free(r);
}

/* Free parked rounds whose requests all completed. */
static void reap_parked(void) {
    for (round_t **l = &g.parked; *l;) {
        round_t *r = *l;
        int flag = 0;
        MPI_Testall(2 * mpri_rt.size, r->reqs, &flag, MPI_STATUSES_IGNORE);
        if (flag) {
            *l = r->next;
            round_free(r);
        } else {
            l = &r->next;
        }
    }
}

static void fill_report(uint64_t *rep) {
    memset(rep, 0, (R_GONE + g.words) * sizeof *rep);
    rep[R_PHASE] = (uint64_t)g.phase;
    for (int j = 0; j < mpri_rt.size; j++) {
        if (mpri_peer_gone(j)) {
            rep[R_GONE + (size_t)j / 64] |= 1ull << (j % 64);
            continue;
        }
        rep[R_SENT] += atomic_load(&mpri_rt.sent_to[j]);
        rep[R_PROCESSED] += atomic_load(&mpri_rt.processed_from[j]);
    }
    rep[R_BUSY] = (uint64_t)(mpri_pending_count() + mpri_pool_busy() + mpri_progress_busy());
}

static bool rank_in(const uint64_t *rep, int j) { return (rep[R_GONE + (size_t)j / 64] >> (j % 64)) & 1u; }

typedef enum { ROUND_QUIET, ROUND_BUSY, ROUND_TIMEOUT, ROUND_ERROR } round_result_t;

/* One round; on ROUND_QUIET/BUSY `sums` gets (sent, processed). */
static round_result_t run_round(int64_t deadline, uint64_t sums[2], mpr_err_t *err) {
    int n = mpri_rt.size, me = mpri_rt.rank;
    size_t len = R_GONE + g.words;
    round_t *r = calloc(1, sizeof *r);
    if (r) {
        r->mine = calloc(len, sizeof *r->mine);
        r->peers = calloc((size_t)n * len, sizeof *r->peers);
        r->reqs = malloc(2 * (size_t)n * sizeof *r->reqs);
        r->got = calloc((size_t)n, sizeof *r->got);
    }
    if (!r || !r->mine || !r->peers || !r->reqs || !r->got) {
        round_free(r);
        *err = mpr_error_set(MPR_ERR_NOMEM, "shutdown: out of memory");
        return ROUND_ERROR;
    }
    for (int j = 0; j < 2 * n; j++) r->reqs[j] = MPI_REQUEST_NULL;
    g.round++;
    int tag = 1 + (int)(g.round % (uint64_t)(mpri_rt.tag_ub - 1));
    fill_report(r->mine);
    r->got[me] = true;
    /* The snapshot's departed set decides whom to wait for. */
    for (int j = 0; j < n; j++) {
        if (j == me) continue;
        if (rank_in(r->mine, j)) {
            r->got[j] = true; /* not waited for */
            continue;
        }
        if (MPI_Irecv(r->peers + (size_t)j * len, (int)len, MPI_UINT64_T, j, tag, mpri_rt.ctrl_comm, &r->reqs[j]) !=
                MPI_SUCCESS ||
            MPI_Isend(r->mine, (int)len, MPI_UINT64_T, j, tag, mpri_rt.ctrl_comm, &r->reqs[n + j]) != MPI_SUCCESS) {
            park(r);
            *err = mpr_error_set(MPR_ERR_MPI, "shutdown: posting a termination report failed");
            return ROUND_ERROR;
        }
    }
    bool missing = false;
    int64_t sleep_ns = 20000;
    for (;;) {
        bool all = true;
        for (int j = 0; j < n; j++) {
            if (r->got[j]) continue;
            int flag = 0;
            MPI_Test(&r->reqs[j], &flag, MPI_STATUS_IGNORE);
            if (flag) {
                r->got[j] = true;
                continue;
            }
            if (mpri_peer_gone(j)) { /* it left without reporting: stop waiting for it */
                MPI_Cancel(&r->reqs[j]);
                MPI_Status st;
                MPI_Wait(&r->reqs[j], &st);
                int cancelled = 0;
                MPI_Test_cancelled(&st, &cancelled);
                r->got[j] = true;
                if (cancelled)
                    missing = true;
                continue;
            }
            all = false;
        }
        if (all) break;
        if (deadline && mpri_now_ns() > deadline) {
            park(r); /* MPI owns the buffers until the peers' reports come, if ever */
            *err = mpr_error_set(MPR_ERR_TIMEOUT,
                                 "graceful shutdown timed out after %.1f s (a rank did not call "
                                 "mpr_shutdown, or work never finished)",
                                 mpri_shutdown_timeout_s);
            return ROUND_TIMEOUT;
        }
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < 1000000) sleep_ns *= 2;
    }
    bool agree = !missing;
    uint64_t sent = 0, processed = 0, busy = 0;
    for (int j = 0; j < n; j++) {
        const uint64_t *rep = j == me ? r->mine : r->peers + (size_t)j * len;
        if (j != me && rank_in(r->mine, j)) continue;
        if (rep[R_PHASE] != r->mine[R_PHASE] || memcmp(rep + R_GONE, r->mine + R_GONE, g.words * 8) != 0)
            agree = false;
        sent += rep[R_SENT];
        processed += rep[R_PROCESSED];
        busy += rep[R_BUSY];
    }
    int flag = 0;
    MPI_Testall(n, r->reqs + n, &flag, MPI_STATUSES_IGNORE);
    if (flag)
        round_free(r);
    else
        park(r); /* a send not complete yet (a peer still receiving, or gone) */
    sums[0] = sent;
    sums[1] = processed;
    return agree && sent == processed && busy == 0 ? ROUND_QUIET : ROUND_BUSY;
}

/* Rounds until quiescent (two consecutive quiet rounds with equal sums). */
static mpr_err_t rounds_until_quiescent(int64_t deadline) {
    for (;;) {
        check_rounds();
        uint64_t sums[2];
        mpr_err_t err = MPR_OK;
        round_result_t res = run_round(deadline, sums, &err);
        if (res == ROUND_TIMEOUT || res == ROUND_ERROR) return err;
        if (res == ROUND_QUIET) {
            bool same = g.quiet_streak > 0 && sums[0] == g.prev_sent && sums[1] == g.prev_processed;
            g.quiet_streak = same ? 2 : 1;
            g.prev_sent = sums[0];
            g.prev_processed = sums[1];
            if (g.quiet_streak == 2) return MPR_OK;
        } else {
            g.quiet_streak = 0;
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
    }
}

/* ---- non-graceful leave ---- */

static const char *name_of(int rank) { return mpri_rt.workers ? mpri_rt.workers[rank].name : "?"; }

static void send_plain(int dst, int kind) {
    mpri_outmsg_t m;
    mpri_outmsg_init(&m, kind);
    if (mpri_send(dst, &m) != MPR_OK && kind == MPRI_MSG_LEAVE) atomic_store(&leave_acked[dst], true);
}

/* A peer leaves the job (inline, progress thread). */
static void handle_leave(mpri_msg_t *msg) {
    int src = msg->src;
    if (src != mpri_rt.rank && !atomic_exchange(&mpri_rt.peer_gone[src], true)) {
        char text[256];
        snprintf(text, sizeof text, "%s (rank %d) left the job (it called mpr_shutdown(false)) before replying",
                 name_of(src), src);
        mpri_pending_fail_dst(src, MPR_ERR_SHUTDOWN, text);
    }
    send_plain(src, MPRI_MSG_LEAVE_ACK); /* the one message a departed peer still gets */
    mpri_msg_done(msg);
    mpri_event_signal(); /* rounds waiting for its report look again */
}

static void handle_leave_ack(mpri_msg_t *msg) {
    atomic_store(&leave_acked[msg->src], true);
    mpri_msg_done(msg);
    mpri_event_signal();
}

static bool all_peers_acked(void) {
    for (int j = 0; j < mpri_rt.size; j++)
        if (j != mpri_rt.rank && !atomic_load(&leave_acked[j]) && !mpri_peer_gone(j)) return false;
    return mpri_progress_busy() == 0;
}

static void finalize_at_exit(void) {
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
}

static void leave_job(void) {
    for (int j = 0; j < mpri_rt.size; j++)
        if (j != mpri_rt.rank && !mpri_peer_gone(j)) send_plain(j, MPRI_MSG_LEAVE);
    int64_t deadline = mpri_now_ns() + (int64_t)(LEAVE_WAIT_S * 1e9);
    while (!all_peers_acked() && mpri_now_ns() < deadline) {
        uint64_t gen = mpri_event_generation();
        if (all_peers_acked()) break;
        mpri_event_wait(gen, 1000000);
    }
    if (!all_peers_acked())
        fprintf(stderr, "mpirpc: %s: leaving without every peer's acknowledgement after %.0f s\n",
                name_of(mpri_rt.rank), LEAVE_WAIT_S);
}

/* ---- local stop ---- */

static void stop_local(int from, bool free_comms) {
    set_state(from, MPRI_STOPPED);
    /* Fail what is pending first, so waiters return at once; replies that
     * handlers still send while the pool drains find nothing and are dropped. */
    mpri_pending_fail_all(MPR_ERR_SHUTDOWN, "the runtime shut down before the reply arrived");
    mpri_event_signal();
    mpri_event_signal_all_keys(); /* waiters on other futures look at the state again */
    mpri_progress_stop();
    mpri_pool_stop();
    mpri_deferred_flush(); /* before the leak reports count anything */
    mpri_run_after_stop_hooks();
    mpri_doorbell_fini(); /* after the pool: no handler rings any more */
    mpri_observe_release(free_comms);
    if (free_comms) {
        MPI_Comm_free(&mpri_rt.comm);
        MPI_Comm_free(&mpri_rt.ctrl_comm);
        MPI_Comm_free(&mpri_rt.barrier_comm);
    }
}

mpr_err_t mpri_shutdown_prepare(void) {
    size_t n = (size_t)mpri_rt.size;
    peers.sent_to = realloc_zeroed(peers.sent_to, n, sizeof *peers.sent_to);
    peers.processed_from = realloc_zeroed(peers.processed_from, n, sizeof *peers.processed_from);
    peers.peer_gone = realloc_zeroed(peers.peer_gone, n, sizeof *peers.peer_gone);
    leave_acked = realloc_zeroed(leave_acked, n, sizeof *leave_acked);
    if (!peers.sent_to || !peers.processed_from || !peers.peer_gone || !leave_acked)
        return mpr_error_set(MPR_ERR_NOMEM, "mpr_init: out of memory");
    mpri_rt.sent_to = peers.sent_to;
    mpri_rt.processed_from = peers.processed_from;
    mpri_rt.peer_gone = peers.peer_gone;
    g.phase = PHASE_IDLE;
    g.round = 0;
    g.quiet_streak = 0;
    g.words = (n + 63) / 64;
    mpr_err_t e = mpri_set_handler(MPRI_MSG_LEAVE, handle_leave, true);
    return e ? e : mpri_set_handler(MPRI_MSG_LEAVE_ACK, handle_leave_ack, true);
}

static mpr_err_t graceful(void) {
    int64_t deadline =
        mpri_shutdown_timeout_s > 0 ? mpri_now_ns() + (int64_t)(mpri_shutdown_timeout_s * 1e9) : 0;
    set_phase(PHASE_SERVING);
    mpr_err_t err = rounds_until_quiescent(deadline);
    if (!err) {
        set_phase(PHASE_DRAINING);
        mpri_run_quiescent_hooks();
        err = rounds_until_quiescent(deadline);
    }
    if (!err) mpri_observe_finish(); /* every live rank is DONE: write the trace, print statistics */
    set_phase(err ? PHASE_TIMED_OUT : PHASE_DONE);
    check_rounds();
    return err;
}

mpr_err_t mpr_shutdown(bool graceful_stop) {
    if (mpri_on_pool_thread() || mpri_in_progress_context())
        return mpr_error_set(MPR_ERR_STATE,
                             "mpr_shutdown: called inside a handler or callback; a rank cannot wait for "
                             "the job to finish while it is part of the work: call it from an application "
                             "thread (e.g. the one that called mpr_init) after the handler returned");
    mpri_deferred_flush(); /* what the caller put off (a context's CLEANUPs) goes out while the runtime runs */
    int from = graceful_stop ? MPRI_STOPPING : MPRI_LEAVING;
    int expected = MPRI_RUNNING;
    if (!atomic_compare_exchange_strong(&mpri_rt.state, &expected, from))
        return expected == MPRI_UNINIT
                   ? mpr_error_set(MPR_ERR_NOT_INITIALIZED, "mpr_shutdown: not initialized")
                   : mpr_error_set(MPR_ERR_SHUTDOWN, "mpr_shutdown: already shut down");
    mpr_err_t err = MPR_OK;
    bool finished = true;
    if (graceful_stop) {
        err = graceful();
        finished = err == MPR_OK;
    } else {
        leave_job();
    }
    /* After a timed-out round a peer may still send its report: keep the
     * communicators (and MPI) as they are. */
    stop_local(from, finished);
    if (finished) reap_parked();
    if (finished && graceful_stop) set_phase(PHASE_IDLE);
    free(mpri_rt.workers);
    mpri_rt.workers = NULL;
    mpri_host_cache_trim();
    if (mpri_rt.own_mpi && finished) {
        if (graceful_stop || mpri_rt.size == 1) {
            MPI_Finalize();
        } else if (!finalize_at_exit_registered) {
            /* MPI_Finalize waits for every rank: this rank leaves now and
             * finalizes when the process exits. */
            atexit(finalize_at_exit);
            finalize_at_exit_registered = true;
        }
        mpri_rt.own_mpi = false;
    }
    return err;
}
