/* apps/insitu_heat/stream.h — the simulation side of the in-situ coupling:
 * a simulation rank streams (state, next state) samples of its subdomain to
 * one learner rank with mpr_rpc_async, never waiting for a reply unless its
 * window of sends in flight is full.
 *
 * Back-pressure: at most `max_inflight` samples are in flight (sent, reply
 * not yet seen). The learner replies once the sample is in its bounded
 * inbox (learner.h), so a learner that falls behind fills the window. When
 * the window is full, streamer_send either waits for the oldest reply
 * (policy WAIT: the simulation slows down, nothing is lost) or does not
 * send this sample (policy SKIP: counted in `skipped`, never silent).
 * Memory held on the simulation side is therefore at most max_inflight
 * samples. A sample whose call fails (learner gone, timeout) is counted in
 * `failed` with the first error kept; it is never retried.
 *
 * Invariants: sent == acked + failed + (in flight); after streamer_finish,
 * nothing is in flight, so sent == acked + failed. Each sample is a copy
 * (converted to float32) of the caller's buffers, made before
 * streamer_send returns: the simulation may overwrite its buffers at once.
 * Not thread-safe: one simulation thread uses a streamer. */
#ifndef INSITU_HEAT_STREAM_H
#define INSITU_HEAT_STREAM_H

#include <stdbool.h>
#include <stdint.h>

#include "mpirpc/error.h"

typedef enum { STREAM_WAIT, STREAM_SKIP } stream_policy_t;

typedef struct stream_counts {
    int64_t sent, acked, failed, skipped; /* samples */
    int64_t bytes;                        /* tensor bytes of the samples sent */
    int64_t waits;                        /* sends that found the window full (WAIT) */
    double wait_s;                        /* time streamer_send spent waiting for the window (not finish's) */
} stream_counts_t;

typedef struct streamer streamer_t;

/* To learner rank `learner` (an mpirpc worker rank), from simulation rank
 * `sim_rank`. NULL with the error set when out of memory. */
streamer_t *streamer_create(int learner, int sim_rank, int max_inflight, stream_policy_t policy, double timeout_s);

/* Optional, before the time loop: allocate every window slot's sample
 * tensors for blocks of xrows x xcols (the frame included) and write them
 * once, so that the loop's first sends do not pay for fresh memory (on the
 * development VM, first-touch page faults made each of the first
 * max_inflight sends cost 7-8 ms, 20x a steady-state send). Error: out of
 * memory. */
mpr_err_t streamer_prepare(streamer_t *s, int xrows, int xcols);

/* Stream the sample of simulation step `step`: x = the block with its frame,
 * xrows x xcols doubles with row stride `stride`, and y = the next state's
 * interior, the (xrows - 2) x (xcols - 2) block inside the frame of `next`
 * (same layout). MPR_OK also when the sample was skipped; an error only for
 * a failure to build the sample (out of memory). */
mpr_err_t streamer_send(streamer_t *s, int64_t step, const double *x, const double *next, int xrows, int xcols,
                        int stride);

/* Wait for every sample in flight, then tell the learner how many samples
 * this rank sent (INSITU_DONE_FN): the learner ends when all its
 * simulation ranks did. Error: the done call failed. */
mpr_err_t streamer_finish(streamer_t *s);

/* The counts so far; first_error: the first failed sample's message ("" if none). */
stream_counts_t streamer_counts(const streamer_t *s);
const char *streamer_first_error(const streamer_t *s);

/* Frees the streamer; samples still in flight are released (their replies
 * are dropped by the runtime). NULL-safe. */
void streamer_destroy(streamer_t *s);

#endif
