/* apps/insitu_heat/stream.c — bounded window of asynchronous sample sends
 * (see stream.h). The window is a ring of futures in send order; replies
 * are reaped from its head without blocking before every send.
 *
 * Each slot of the ring keeps the two float32 tensors of its sample after
 * the reply (the call borrows them: "tt"), and the next sample sent from
 * that slot is converted into them: no allocation per sample, so no fresh
 * pages to fault in and no munmap (with its TLB shoot-down) per sample on
 * the simulation's core. Invariant: a slot's tensors are written only while
 * the slot is outside [head, head + count), i.e. after its call's future
 * completed (rpc.h: argument tensors stay untouched until then). */
#include "stream.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "insitu.h"
#include "mpirpc/mpirpc.h"

struct streamer {
    int learner, sim_rank, cap;
    stream_policy_t policy;
    double timeout_s;
    mpr_future_t **ring; /* cap slots; [head, head + count) in flight, oldest first */
    mpr_tensor_t **xs, **ys; /* cap slots: the slot's sample tensors, kept for reuse (NULL: none yet) */
    int head, count;
    stream_counts_t n;
    char first_error[256];
};

streamer_t *streamer_create(int learner, int sim_rank, int max_inflight, stream_policy_t policy, double timeout_s) {
    streamer_t *s = calloc(1, sizeof *s);
    if (s && max_inflight > 0) {
        s->ring = calloc((size_t)max_inflight, sizeof *s->ring);
        s->xs = calloc((size_t)max_inflight, sizeof *s->xs);
        s->ys = calloc((size_t)max_inflight, sizeof *s->ys);
    }
    if (!s || !s->ring || !s->xs || !s->ys || max_inflight < 1) {
        if (s) free(s->ring), free(s->xs), free(s->ys);
        free(s);
        mpr_error_set(MPR_ERR_NOMEM, "streamer: out of memory (or a window of %d)", max_inflight);
        return NULL;
    }
    s->learner = learner, s->sim_rank = sim_rank, s->cap = max_inflight;
    s->policy = policy, s->timeout_s = timeout_s;
    return s;
}

/* Account for the oldest send, which has completed, and drop it. */
static void pop_oldest(streamer_t *s) {
    mpr_future_t *f = s->ring[s->head];
    INSITU_ASSERT(f && mpr_future_done(f));
    if (mpr_future_error(f) == MPR_OK) {
        s->n.acked++;
    } else {
        if (s->n.failed++ == 0)
            snprintf(s->first_error, sizeof s->first_error, "%s", mpr_future_error_message(f));
    }
    mpr_future_release(f);
    s->ring[s->head] = NULL;
    s->head = (s->head + 1) % s->cap;
    s->count--;
}

static void reap_done(streamer_t *s) {
    while (s->count > 0 && mpr_future_done(s->ring[s->head])) pop_oldest(s);
}

/* One row, doubles to floats. The copy is on the simulation's critical
 * path: in blocks of 8 with restrict pointers (the tensor is never the
 * caller's array), which GCC vectorizes at -O2 (its cheap cost model leaves
 * a loop of unknown length scalar). */
static void row_f32(float *restrict d, const double *restrict s, int n) {
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int k = 0; k < 8; k++) d[j + k] = (float)s[j + k];
    for (; j < n; j++) d[j] = (float)s[j];
}

/* *slot as a rows x cols float32 tensor: kept when it has that shape, else made. */
static bool slot_tensor(mpr_tensor_t **slot, int rows, int cols) {
    mpr_tensor_t *t = *slot;
    if (t && mpr_tensor_ndim(t) == 2 && mpr_tensor_shape(t)[0] == rows && mpr_tensor_shape(t)[1] == cols) return true;
    mpr_tensor_release(t);
    *slot = mpr_tensor_empty(MPR_F32, 2, (int64_t[]){rows, cols});
    return *slot != NULL;
}

mpr_err_t streamer_prepare(streamer_t *s, int xrows, int xcols) {
    for (int i = 0; i < s->cap; i++) {
        if (!slot_tensor(&s->xs[i], xrows, xcols) || !slot_tensor(&s->ys[i], xrows - 2, xcols - 2))
            return mpr_last_error_code();
        memset(mpr_tensor_data(s->xs[i]), 0, mpr_tensor_nbytes(s->xs[i])); /* map the pages now */
        memset(mpr_tensor_data(s->ys[i]), 0, mpr_tensor_nbytes(s->ys[i]));
    }
    return MPR_OK;
}

/* A float32 copy of a rows x cols block of doubles with row stride `stride`,
 * into *slot (reused when its shape matches, else replaced by a new tensor).
 * false with the error set when out of memory. */
static bool block_f32(mpr_tensor_t **slot, const double *src, int rows, int cols, int stride) {
    if (!slot_tensor(slot, rows, cols)) return false;
    float *d = mpr_tensor_data(*slot);
    for (int i = 0; i < rows; i++) row_f32(d + (size_t)i * cols, src + (size_t)i * stride, cols);
    return true;
}

mpr_err_t streamer_send(streamer_t *s, int64_t step, const double *x, const double *next, int xrows, int xcols,
                        int stride) {
    reap_done(s);
    if (s->count == s->cap) {
        if (s->policy == STREAM_SKIP) {
            s->n.skipped++;
            return MPR_OK;
        }
        double t0 = app_now();
        mpr_future_wait(s->ring[s->head], MPR_WAIT_FOREVER);
        s->n.wait_s += app_now() - t0;
        s->n.waits++;
        reap_done(s);
    }
    int slot = (s->head + s->count) % s->cap; /* outside the window: its last call (if any) completed */
    if (!block_f32(&s->xs[slot], x, xrows, xcols, stride) ||
        !block_f32(&s->ys[slot], next + stride + 1, xrows - 2, xcols - 2, stride))
        return mpr_last_error_code();
    int64_t bytes = (int64_t)(mpr_tensor_nbytes(s->xs[slot]) + mpr_tensor_nbytes(s->ys[slot]));
    /* "tt": the call borrows the slot's tensors; they are written again only
     * once this call's future completed */
    mpr_future_t *f = mpr_call_async(mpr_to_rank(s->learner), INSITU_SAMPLE_FN, s->timeout_s, "lltt", step,
                                     (int64_t)s->sim_rank, s->xs[slot], s->ys[slot]);
    if (!f) return mpr_last_error_code();
    s->ring[slot] = f;
    s->count++;
    s->n.sent++;
    s->n.bytes += bytes;
    return MPR_OK;
}

mpr_err_t streamer_finish(streamer_t *s) {
    while (s->count > 0) {
        mpr_future_wait(s->ring[s->head], MPR_WAIT_FOREVER);
        pop_oldest(s);
    }
    return mpr_call_sync(mpr_to_rank(s->learner), INSITU_DONE_FN, s->timeout_s, NULL, "ll", (int64_t)s->sim_rank,
                         s->n.sent);
}

stream_counts_t streamer_counts(const streamer_t *s) { return s->n; }
const char *streamer_first_error(const streamer_t *s) { return s->first_error; }

void streamer_destroy(streamer_t *s) {
    if (!s) return;
    while (s->count > 0) {
        mpr_future_release(s->ring[s->head]);
        s->head = (s->head + 1) % s->cap;
        s->count--;
    }
    for (int i = 0; i < s->cap; i++) {
        mpr_tensor_release(s->xs[i]);
        mpr_tensor_release(s->ys[i]);
    }
    free(s->ring);
    free(s->xs);
    free(s->ys);
    free(s);
}
