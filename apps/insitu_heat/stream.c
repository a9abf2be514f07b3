/* apps/insitu_heat/stream.c — bounded window of asynchronous sample sends
 * (see stream.h). The window is a ring of futures in send order; replies
 * are reaped from its head without blocking before every send. */
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
    int head, count;
    stream_counts_t n;
    char first_error[256];
};

streamer_t *streamer_create(int learner, int sim_rank, int max_inflight, stream_policy_t policy, double timeout_s) {
    streamer_t *s = calloc(1, sizeof *s);
    if (s) s->ring = calloc((size_t)max_inflight, sizeof *s->ring);
    if (!s || !s->ring || max_inflight < 1) {
        free(s ? s->ring : NULL);
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

/* A float32 copy of a rows x cols block of doubles with row stride `stride`. */
static mpr_tensor_t *block_f32(const double *src, int rows, int cols, int stride) {
    int64_t shape[2] = {rows, cols};
    mpr_tensor_t *t = mpr_tensor_empty(MPR_F32, 2, shape);
    if (!t) return NULL;
    float *d = mpr_tensor_data(t);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) d[(size_t)i * cols + j] = (float)src[(size_t)i * stride + j];
    return t;
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
    mpr_tensor_t *xt = block_f32(x, xrows, xcols, stride);
    mpr_tensor_t *yt = block_f32(next + stride + 1, xrows - 2, xcols - 2, stride);
    if (!xt || !yt) {
        mpr_tensor_release(xt);
        mpr_tensor_release(yt);
        return mpr_last_error_code();
    }
    int64_t bytes = (int64_t)(mpr_tensor_nbytes(xt) + mpr_tensor_nbytes(yt));
    /* "T": the call takes the tensors; they stay alive while MPI sends them */
    mpr_future_t *f =
        mpr_call_async(mpr_to_rank(s->learner), INSITU_SAMPLE_FN, s->timeout_s, "llTT", step, (int64_t)s->sim_rank, xt, yt);
    if (!f) return mpr_last_error_code();
    s->ring[(s->head + s->count) % s->cap] = f;
    s->count++;
    s->n.sent++;
    s->n.bytes += bytes;
    return MPR_OK;
}

mpr_err_t streamer_finish(streamer_t *s) {
    double t0 = app_now();
    while (s->count > 0) {
        mpr_future_wait(s->ring[s->head], MPR_WAIT_FOREVER);
        pop_oldest(s);
    }
    s->n.wait_s += app_now() - t0;
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
    free(s->ring);
    free(s);
}
