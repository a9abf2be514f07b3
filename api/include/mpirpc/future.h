/* mpirpc/future.h — futures: the result of an asynchronous call.
 *
 * A future completes exactly once, with a value or with an error (code and
 * message). Futures returned by mpr_rpc_async() are completed by the runtime;
 * futures from mpr_future_create() are completed by the user with
 * mpr_future_set_result()/mpr_future_set_error().
 *
 * Callbacks added with mpr_future_then() run once the future completes: in
 * the completing thread when the user completes it, on a worker-pool thread
 * when the runtime does (callbacks never run on the progress thread).
 *
 * Timeouts are in seconds; 0 (MPR_WAIT_FOREVER) waits without limit.
 *
 * Ownership: mpr_future_create() and mpr_future_then() return new references;
 * release them with mpr_future_release() (NULL is a no-op). A pending future
 * released by everyone is still completed by the runtime and then freed.
 *
 * NULL: a NULL future (or other needed pointer) gives MPR_ERR_INVALID_ARG
 * naming the function and argument; mpr_future_done(NULL) is false and
 * mpr_future_error_message(NULL) "", both with that error set. *value of
 * mpr_future_get is NULL on every failure.
 *
 * Only futures from mpr_future_create() (and mpr_future_then()) may be
 * completed by hand: mpr_future_set_result/_error on a future that belongs
 * to an RPC (mpr_rpc_async, an RRef proxy) return MPR_ERR_STATE, so the real
 * reply is never silently dropped. */
#ifndef MPIRPC_FUTURE_H
#define MPIRPC_FUTURE_H

#include <stdbool.h>
#include <stddef.h>

#include "mpirpc/error.h"
#include "mpirpc/value.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MPR_WAIT_FOREVER 0.0

typedef struct mpr_future mpr_future_t;

mpr_future_t *mpr_future_create(void);
mpr_future_t *mpr_future_retain(mpr_future_t *f);
void mpr_future_release(mpr_future_t *f);

/* Complete with a value; takes ownership of `value` (NULL means none; it is
 * released on every failure). MPR_ERR_STATE if already completed or if `f`
 * belongs to an RPC (see above). */
mpr_err_t mpr_future_set_result(mpr_future_t *f, mpr_value_t *value);
/* Complete with an error; `message` is copied (NULL: the code's text). `code`
 * must not be MPR_OK. MPR_ERR_STATE if already completed. Passing on the
 * thread's last failure as it is (code MPR_ERR_REMOTE and message
 * mpr_last_error()) keeps its remote code and origin (error.h). */
mpr_err_t mpr_future_set_error(mpr_future_t *f, mpr_err_t code, const char *message);

bool mpr_future_done(const mpr_future_t *f);

/* Block until completed or `timeout_s` elapsed. Returns MPR_OK once completed
 * (whatever the outcome), MPR_ERR_TIMEOUT if the wait timed out (the future
 * stays pending), MPR_ERR_SHUTDOWN if the runtime shut down while it was
 * pending. A waiting thread helps the runtime make progress. */
mpr_err_t mpr_future_wait(mpr_future_t *f, double timeout_s);

/* Wait, then return the outcome: MPR_OK with a new reference in *value, or the
 * error code (mpr_last_error() holds the future's error message; for
 * MPR_ERR_REMOTE, mpr_last_error_remote_code()/_origin() its origin). */
mpr_err_t mpr_future_get(mpr_future_t *f, double timeout_s, mpr_value_t **value);

/* Outcome of a completed future (MPR_ERR_STATE if still pending). */
mpr_err_t mpr_future_error(const mpr_future_t *f);
/* Error message of a completed failed future; "" otherwise. Borrowed. */
const char *mpr_future_error_message(const mpr_future_t *f);
/* A completed future failed with MPR_ERR_REMOTE: the code the function
 * failed with on its origin worker, and that worker's rank (error.h);
 * otherwise (pending, succeeded, another error) MPR_OK and -1; for NULL,
 * MPR_ERR_INVALID_ARG and -1. */
mpr_err_t mpr_future_remote_code(const mpr_future_t *f);
int mpr_future_error_origin(const mpr_future_t *f);

/* Callback for mpr_future_then(): `parent` is completed (borrowed). Return
 * MPR_OK and put a new reference (or NULL for none) in *result, or return an
 * error (its mpr_last_error() text becomes the child's message). */
typedef mpr_err_t (*mpr_then_fn_t)(mpr_future_t *parent, void *user_data, mpr_value_t **result);

/* A new future completed with what `fn` returns once `f` completes. If `f` is
 * already complete, `fn` runs now in the calling thread. If `f` is released
 * for the last time without ever completing, `fn` never runs and the child
 * fails with MPR_ERR_STATE. */
mpr_future_t *mpr_future_then(mpr_future_t *f, mpr_then_fn_t fn, void *user_data);

/* Wait for all `n` futures (total timeout). MPR_OK once all completed;
 * MPR_ERR_TIMEOUT / MPR_ERR_SHUTDOWN as mpr_future_wait(). Outcomes are read
 * per future. */
mpr_err_t mpr_future_wait_all(size_t n, mpr_future_t *const *futures, double timeout_s);

#ifdef __cplusplus
}
#endif
#endif
