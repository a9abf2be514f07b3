/* mpirpc/trace.h — seeing what a run did: a timeline of every rank (tracing)
 * and per-function / per-peer RPC statistics.
 *
 * Tracing. With MPIRPC_TRACE=<prefix> in the environment (every rank), or
 * between mpr_trace_start(prefix) and mpr_trace_stop() on a rank, the rank
 * records into per-thread buffers: every message sent (calls, replies, RRef
 * protocol and distributed-autograd messages), every request received and
 * its handler's run, every reply that completed a future, timeouts,
 * distributed-autograd backward passes, optimizer steps, and the ranges the
 * program names with mpr_trace_begin/end. Recording takes no lock and
 * allocates nothing per event; each thread keeps at most MPIRPC_TRACE_EVENTS
 * events (default 32768), later ones are dropped and counted. Future
 * callbacks (mpr_future_then) are slices "then" where they run. A
 * distributed-backward request's arrow ends in the slice that runs its piece
 * (a pool thread, or the thread waiting in that context), not in the
 * progress thread's short "hand off" slice that routed it there.
 *
 * Where the trace goes, by how the run stops:
 * - graceful mpr_shutdown(true): the ranks' clocks are aligned (offsets
 *   measured over MPI at mpr_init when MPIRPC_TRACE is set, and again at
 *   shutdown; linear in between) and rank 0 writes one file, <prefix>.json,
 *   in the Chrome trace-event JSON format that Perfetto (ui.perfetto.dev)
 *   and chrome://tracing open: one process per rank, one track per thread,
 *   and a flow arrow from each call to its handler and from the reply back
 *   to the caller.
 * - mpr_trace_flush (below, collective): the same file with the events so
 *   far, while the job goes on.
 * - mpr_shutdown(false), a graceful shutdown that timed out or found that a
 *   rank left the job, and a process that exits (exit(), return from main)
 *   while the runtime runs: each rank that recorded writes its own file,
 *   <prefix>.rank<r>.json (same format, one process, otherData.reason says
 *   why; timestamps moved into rank 0's clock by the offset measured at
 *   mpr_init, so the ranks' files lie side by side: tests/tools/trace_plot.py
 *   draws several files as one).
 * - a process killed by a signal (a crash, MPI_Abort, SIGKILL) writes
 *   nothing: a program that wants data from such a stop calls
 *   mpr_trace_write_rank itself (every N steps, or in its error path).
 *
 * Statistics. With MPIRPC_STATS=1 (or after mpr_stats_enable(true)) each rank
 * counts per registered function: calls, errors, timeouts, bytes out and in,
 * and latency percentiles, on the caller (request sent to reply received)
 * and on the callee (request received to reply sent); per peer: messages and
 * bytes each way. mpr_get_function_stats / mpr_get_peer_stats read them while
 * the job runs; with MPIRPC_STATS=1 every rank prints its table at graceful
 * shutdown.
 *
 * Off (the default), each recording site costs one flag test. Misuse (an
 * unwritable path, starting twice) returns an error with a clear message and
 * leaves the run alone. */
#ifndef MPIRPC_TRACE_H
#define MPIRPC_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "mpirpc/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Start recording on this rank; the trace goes to <path_prefix>.json (the
 * prefix of rank 0, else of the lowest rank that gave one). The path is
 * checked now by creating and removing the file. Errors: MPR_ERR_INVALID_ARG
 * (NULL or empty prefix, or a file that cannot be created: the message names
 * it and the reason), MPR_ERR_STATE (already recording: MPIRPC_TRACE or an
 * earlier mpr_trace_start; the message says which), MPR_ERR_NOT_INITIALIZED /
 * MPR_ERR_SHUTDOWN. `path_prefix` is copied. */
mpr_err_t mpr_trace_start(const char *path_prefix);
/* Stop recording on this rank; what was recorded is written at shutdown
 * (or by mpr_trace_flush / mpr_trace_write_rank).
 * MPR_ERR_STATE if not recording. */
mpr_err_t mpr_trace_stop(void);
/* Write the trace so far, like torch.profiler's export_chrome_trace but
 * for the whole job: collective — every rank calls it (from one
 * application thread each, not in a handler or callback; a rank's calls
 * pair with the other ranks' in order), it returns when rank 0 has written
 * the file. The ranks' clocks are measured again, every rank's events so
 * far are gathered to rank 0, which writes `path` (rank 0's argument; NULL:
 * <prefix>.json, the file the graceful shutdown overwrites later with the
 * complete trace). Recording goes on; nothing is discarded (the shutdown's
 * file holds these events again). Events of work still under way when a
 * rank entered may be missing, so an arrow may lack its end. Costs a few
 * round trips per rank plus the formatting and the gather.
 * Errors: MPR_ERR_STATE (no rank traces; a rank left the job; called in a
 * handler), MPR_ERR_IO (rank 0 could not write: every rank gets it),
 * MPR_ERR_INVALID_ARG (empty path), MPR_ERR_NOT_INITIALIZED / SHUTDOWN. */
mpr_err_t mpr_trace_flush(const char *path);
/* Write this rank's events so far to `path` (NULL: <prefix>.rank<r>.json),
 * alone: no other rank takes part, no MPI call; any thread, any time while
 * the runtime runs (concurrent writers on a rank take turns). Timestamps are
 * in rank 0's clock (offset measured at mpr_init when MPIRPC_TRACE was set;
 * 0 on rank 0's host). Recording goes on. Errors: MPR_ERR_STATE (no path and
 * this rank never had a prefix), MPR_ERR_IO (the message names the file and
 * the reason), MPR_ERR_INVALID_ARG (empty path), MPR_ERR_NOT_INITIALIZED /
 * SHUTDOWN. */
mpr_err_t mpr_trace_write_rank(const char *path);
/* True while this rank records. */
bool mpr_trace_enabled(void);
/* A named range on the calling thread's track (nestable, 32 deep): a slice
 * from begin to the matching end. No-ops while not recording. `name` is
 * copied (up to 39 bytes). */
void mpr_trace_begin(const char *name);
void mpr_trace_end(void);

/* Count statistics from now on (true) or stop counting (false); counts are
 * kept. Works before mpr_init too. */
void mpr_stats_enable(bool on);

typedef struct mpr_latency_stats {
    uint64_t count;           /* latencies recorded */
    double p50_s, p90_s, p99_s; /* from a log histogram: within 10% of the true value */
    double max_s;
} mpr_latency_stats_t;

typedef struct mpr_function_stats {
    uint64_t function_id; /* the wire id (hash of the name) */
    char name[64];        /* the registered name ("?" if this rank never saw it named) */
    struct {
        uint64_t calls, errors, timeouts; /* calls made; failed by an error reply; by their deadline */
        uint64_t bytes_out, bytes_in;     /* request and reply bytes, tensor data included */
        mpr_latency_stats_t latency;      /* request sent -> reply received */
    } caller;
    struct {
        uint64_t calls, errors;       /* requests served; answered with an error */
        uint64_t bytes_in, bytes_out;
        mpr_latency_stats_t latency;  /* request received -> reply sent */
    } callee;
} mpr_function_stats_t;

typedef struct mpr_peer_stats {
    int rank;
    uint64_t msgs_sent, bytes_sent, msgs_received, bytes_received;
} mpr_peer_stats_t;

/* Snapshots of this rank's statistics. *out is a new array of *count entries
 * that the caller frees with free(). Work before mpr_init (empty) and after
 * shutdown (the last counts, until the next mpr_init). */
mpr_err_t mpr_get_function_stats(mpr_function_stats_t **out, size_t *count);
mpr_err_t mpr_get_peer_stats(mpr_peer_stats_t **out, size_t *count);
/* This rank's table, as printed at shutdown with MPIRPC_STATS=1. */
mpr_err_t mpr_print_stats(FILE *out);

#ifdef __cplusplus
}
#endif
#endif
