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
 * events (default 32768), later ones are dropped and counted. At the
 * graceful mpr_shutdown(true) the ranks' clocks are aligned (offsets measured
 * over MPI at mpr_init when MPIRPC_TRACE is set, and again at shutdown;
 * linear in between) and rank 0 writes one file, <prefix>.json, in the
 * Chrome trace-event JSON format that Perfetto (ui.perfetto.dev) and
 * chrome://tracing open: one process per rank, one track per thread, and a
 * flow arrow from each call to its handler and from the reply back to the
 * caller. A non-graceful shutdown writes no trace.
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
/* Stop recording on this rank; what was recorded is written at shutdown.
 * MPR_ERR_STATE if not recording. */
mpr_err_t mpr_trace_stop(void);
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
