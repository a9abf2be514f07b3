/* sync.c — a barrier among an app's trainer ranks in which the leader does
 * some work (evaluate, checkpoint) while the others wait (app.h, app_sync).
 *
 * PROTOCOL (one round):
 *   follower: mpr_rpc_sync(leader, "mpirpc_app.sync") — an async function:
 *     the leader's handler appends a new future to `waiting`, increments
 *     `arrived`, wakes the leader and returns the future (no pool thread is
 *     held while the follower waits).
 *   leader: waits until arrived == followers, runs `work`, then takes the
 *     waiting futures, resets the round (arrived = 0) and completes them,
 *     with an error carrying work's message if work failed.
 * A follower can arrive for round k+1 only after its round-k future
 * completed, i.e. after the reset: rounds never mix.
 *
 * Invariants: arrived == number of futures in `waiting`; both are touched
 * only under `lock`; futures are completed outside the lock. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "mpirpc/rpc.h"

#define SYNC_FN "mpirpc_app.sync"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t arrived_cond = PTHREAD_COND_INITIALIZER;
static mpr_future_t **waiting;
static int arrived, capacity;

static mpr_err_t sync_fn(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_future_t **result) {
    mpr_future_t *f = mpr_future_create();
    if (!f) return mpr_last_error_code();
    pthread_mutex_lock(&lock);
    if (arrived == capacity) {
        int cap = capacity ? 2 * capacity : 8;
        mpr_future_t **grown = realloc(waiting, (size_t)cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&lock);
            mpr_future_release(f);
            return mpr_error_set(MPR_ERR_NOMEM, "app_sync: out of memory");
        }
        waiting = grown, capacity = cap;
    }
    waiting[arrived++] = mpr_future_retain(f);
    pthread_cond_broadcast(&arrived_cond);
    pthread_mutex_unlock(&lock);
    *result = f;
    return MPR_OK;
}

mpr_err_t app_sync_register(void) { return mpr_register_async_function(SYNC_FN, sync_fn, NULL); }

mpr_err_t app_sync(int leader_rank, int my_rank, int followers, mpr_err_t (*work)(void *arg), void *arg) {
    if (my_rank != leader_rank) {
        mpr_value_t *r = NULL;
        mpr_err_t e = mpr_rpc_sync(mpr_to_rank(leader_rank), SYNC_FN, NULL, 0, &r);
        mpr_value_release(r);
        return e;
    }
    pthread_mutex_lock(&lock);
    while (arrived < followers) pthread_cond_wait(&arrived_cond, &lock);
    pthread_mutex_unlock(&lock);
    mpr_err_t e = work ? work(arg) : MPR_OK;
    char msg[MPR_ERROR_TEXT_MAX];
    snprintf(msg, sizeof msg, "the leader (rank %d) failed: %s", leader_rank, e ? mpr_last_error() : "");
    pthread_mutex_lock(&lock);
    int n = arrived;
    mpr_future_t **done = malloc((size_t)(n ? n : 1) * sizeof *done);
    if (done && n) memcpy(done, waiting, (size_t)n * sizeof *done);
    arrived = 0;
    pthread_mutex_unlock(&lock);
    if (!done) return mpr_error_set(MPR_ERR_NOMEM, "app_sync: out of memory");
    for (int i = 0; i < n; i++) {
        if (e)
            mpr_future_set_error(done[i], e, msg);
        else
            mpr_future_set_result(done[i], NULL);
        mpr_future_release(done[i]);
    }
    free(done);
    return e;
}

void app_sync_cleanup(void) {
    pthread_mutex_lock(&lock);
    free(waiting);
    waiting = NULL, capacity = 0;
    pthread_mutex_unlock(&lock);
}
