/* mpri_trace.h — the tracing core and the RPC statistics (not installed).
 *
 * Two switches, one word (`mpri_observe`): MPRI_OBSERVE_TRACE (events into
 * per-thread buffers, trace.c; written as one Chrome/Perfetto JSON file at
 * graceful shutdown, trace_write.c) and MPRI_OBSERVE_STATS (per-function and
 * per-peer counters, stats.c). Every recording site is
 *     if (mpri_observing(MPRI_OBSERVE_...)) mpri_trace_...(...);
 * so with both off the cost is one relaxed load and a branch not taken.
 *
 * Recording never locks and never allocates per event: each thread owns one
 * buffer of a fixed number of 64-byte events (MPIRPC_TRACE_EVENTS, default
 * 32768: 2 MiB), allocated with its pages populated at its first event
 * (registration takes a lock once per thread; no page fault while recording);
 * when it is full further events of that thread are dropped and counted.
 * Only the owning thread writes its buffer; the writer at shutdown reads
 * `len` (release/acquire) with recording off.
 *
 * Layers above record through this header: rpc messages are recorded by the
 * runtime itself (send, receipt, handler run, reply, future completion,
 * timeouts); autograd and optim record named ranges (category per layer);
 * users record ranges through mpirpc/trace.h. */
#ifndef MPRI_TRACE_H
#define MPRI_TRACE_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "mpirpc/error.h"
#include "mpirpc/trace.h"

enum { MPRI_OBSERVE_TRACE = 1u, MPRI_OBSERVE_STATS = 2u };
extern atomic_uint mpri_observe;

static inline bool mpri_observing(unsigned what) {
    return __builtin_expect((atomic_load_explicit(&mpri_observe, memory_order_relaxed) & what) != 0, 0);
}

/* What an event records (the JSON writer's switch). */
enum {
    MPRI_TEV_SEND = 1, /* a message left (request, one-way or reply): peer = destination */
    MPRI_TEV_RECV,     /* a request arrived complete (instant): peer = source */
    MPRI_TEV_HANDLER,  /* a request's handler ran: peer = source */
    MPRI_TEV_REPLY_IN, /* a reply arrived and completed its future: peer = source */
    MPRI_TEV_TIMEOUT,  /* a pending request failed by its deadline (instant): peer = destination */
    MPRI_TEV_RANGE,    /* a named range (user, autograd, optim): name, category */
    MPRI_TEV_HANDOFF,  /* a request's handler only handed it on (mpri_trace_handoff): peer = source;
                        * its HANDLER slice follows where it runs (mpri_dispatch_run_handler) */
};

/* Categories of named ranges (the JSON "cat"). */
enum { MPRI_TCAT_USER = 0, MPRI_TCAT_AUTOGRAD, MPRI_TCAT_OPTIM, MPRI_TCAT_RUNTIME, MPRI_TCAT_COUNT };

#define MPRI_TRACE_NAME_MAX 40

/* One cache line: a message event's ids and bytes share their place with a
 * range's name (a range has neither), so the buffers hold 64-byte events. */
typedef struct mpri_trace_event {
    int64_t ts_ns, dur_ns; /* mpri_now_ns() of the start; duration (0: instant) */
    uint8_t type, kind, category; /* MPRI_TEV_*, wire kind, MPRI_TCAT_* */
    uint8_t flags;                /* wire flags (low 8 bits) */
    int32_t peer;
    union {
        struct {                  /* every type but RANGE */
            uint64_t request_id;  /* the request's id on its caller (flows), 0 if none */
            uint64_t function_id; /* wire function id (CALL, REMOTE_CALL), else 0 */
            uint64_t bytes;       /* message bytes, tensors' data included */
        };
        char name[MPRI_TRACE_NAME_MAX]; /* RANGE only */
    };
} mpri_trace_event_t;
_Static_assert(sizeof(mpri_trace_event_t) == 64, "a trace event is one cache line");

/* ---- recording (trace.c); call only under mpri_observing(MPRI_OBSERVE_TRACE) ---- */
/* Append `ev` to the calling thread's buffer (or count it dropped). */
void mpri_trace_record(const mpri_trace_event_t *ev);
/* A message event: `type`, the header's kind/flags/ids, the peer, bytes. */
void mpri_trace_msg(int type, int64_t ts_ns, int64_t dur_ns, int kind, unsigned flags, uint64_t request_id,
                    uint64_t function_id, int peer, uint64_t bytes);
/* Named ranges on the calling thread (nested, at most 32 deep; an end
 * without a begin is ignored). `name` is copied (truncated). Begin only
 * under mpri_observing(MPRI_OBSERVE_TRACE); end may be called always (it
 * records only while tracing is on). */
void mpri_trace_range_begin(int category, const char *name);
void mpri_trace_range_end(void);
/* The handler running on this thread hands its request on (to a pool task,
 * a waiting thread): its slice is "hand off", and the call's arrow goes to
 * the HANDLER slice recorded where the request finally runs. Call only
 * under mpri_observing(MPRI_OBSERVE_TRACE), inside a handler. */
void mpri_trace_handoff(void);
/* Read and clear the calling thread's hand-off mark (dispatch.c). */
bool mpri_trace_take_handoff(void);
/* Name the calling thread's track ("progress", "pool", ...). Cheap; may be
 * called while tracing is off (the name is kept for later). */
void mpri_trace_name_thread(const char *name);
/* Give `thread`, which the runtime just started (progress, pool workers,
 * deadline timer), the OS name "mpirpc <name>" (top -H, gdb, perf; cut to
 * 15 characters). Called by the creator right after pthread_create, so the
 * name is in place when mpr_init returns. Never for a user's thread. */
void mpri_name_runtime_thread(pthread_t thread, const char *name);

/* Start recording for MPIRPC_TRACE=<p> (mpri_observe_init); errors as mpr_trace_start. */
mpr_err_t mpri_trace_start_from_env(const char *p);

/* ---- lifecycle (trace.c, trace_write.c, called by world.c and shutdown.c) ---- */
/* At mpri_world_init, after the communicators exist: reads MPIRPC_TRACE and
 * MPIRPC_STATS, duplicates the tracing communicator, measures clock offsets
 * when tracing from the start. Collective; never fails the init (problems
 * are printed and tracing stays off). */
void mpri_observe_init(MPI_Comm base);
/* During a graceful shutdown, once every rank is quiescent (collective):
 * measure the clocks again, gather the events to rank 0, write the trace;
 * print the statistics table when MPIRPC_STATS=1. */
void mpri_observe_finish(void);
/* After the runtime stopped (any shutdown): recording off, buffers freed, the
 * communicator freed when `free_comm` (not after a timed-out shutdown). */
void mpri_observe_release(bool free_comm);

/* Buffers of the calling process (trace_write.c walks them). */
typedef struct mpri_trace_ring {
    mpri_trace_event_t *events; /* cap events, mapped with its pages populated (trace.c) */
    uint32_t cap;
    int thread_index; /* registration order: the track id */
    char thread_name[32];
    struct mpri_trace_ring *next;
    /* Written by the owning thread at every event: a cache line of its own,
     * shared with no other thread's ring. */
    _Alignas(64) atomic_uint len;
    atomic_uint_fast64_t dropped;
} mpri_trace_ring_t;
/* The list of buffers (registration order reversed). New buffers are only
 * pushed at its head, so a walk from the head read here is safe while
 * threads record (mpr_trace_flush, mpr_trace_write_rank, the exit handler);
 * buffers are freed only by mpri_trace_rings_free. */
mpri_trace_ring_t *mpri_trace_rings(void);
/* Drop every buffer (the next event allocates a fresh one). Only with recording off and no other thread recording. */
void mpri_trace_rings_free(void);
/* The output path prefix set by MPIRPC_TRACE or mpr_trace_start ("" if none). */
const char *mpri_trace_prefix(void);

/* ---- statistics (stats.c); call only under mpri_observing(MPRI_OBSERVE_STATS) ---- */
/* The caller side of a request (CALL / REMOTE_CALL with a function id):
 * sent (bytes out), then exactly one of reply (latency, bytes in, error or not)
 * or timeout. */
void mpri_stats_call_sent(uint64_t function_id, const char *label, uint64_t bytes_out);
void mpri_stats_call_done(uint64_t function_id, int64_t latency_ns, uint64_t bytes_in, bool error, bool timeout);
/* The callee side: a request received (bytes in), its reply sent. */
void mpri_stats_serve_done(uint64_t function_id, int64_t latency_ns, uint64_t bytes_in, uint64_t bytes_out,
                           bool error);
/* Per peer: every message sent to / received from `peer`. */
void mpri_stats_peer_sent(int peer, uint64_t bytes);
void mpri_stats_peer_received(int peer, uint64_t bytes);
/* (Re)allocate the per-peer counters for a world of `size` ranks (mpr_init). */
mpr_err_t mpri_stats_prepare(int size);
/* Print this rank's table to `out` (one write). */
void mpri_stats_print(FILE *out);
/* The api layer names function ids (its registry) for the tables and the trace. */
void mpri_observe_set_function_namer(const char *(*namer)(uint64_t function_id));
const char *mpri_observe_function_name(uint64_t function_id);

#endif
