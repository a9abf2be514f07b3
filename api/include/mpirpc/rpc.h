/* mpirpc/rpc.h — registering functions and calling them on other workers.
 *
 * Functions are registered by name, identically on every rank (typically
 * before mpr_init). A function's wire id is the 64-bit hash of its name, so
 * ranks agree with no exchange; two names with the same hash are rejected at
 * registration.
 *
 * A handler receives the call's arguments (a list value, borrowed; "no
 * arguments" is an empty list) and returns MPR_OK with a result (a new
 * reference, or NULL for none), or an error code after mpr_error_set(): the
 * caller then gets MPR_ERR_REMOTE with a message naming the worker, the
 * function and the handler's text. An async handler returns a future instead;
 * the reply goes out when that future completes and no worker thread is held
 * meanwhile (PyTorch's @rpc.functions.async_execution).
 *
 * Handlers run on the callee's worker pool. A handler may itself call other
 * workers (nested calls); a pool thread that waits helps run other queued
 * requests, so nesting never exhausts the pool.
 *
 * Tensors travel without a serialization copy: a contiguous tensor is sent
 * from its storage and received into the new tensor's storage (a strided
 * view is made contiguous first). A call to the caller's own rank skips MPI
 * and the callee then shares the caller's tensor storages (mutating an
 * argument in place is visible to the caller, as with any shared tensor).
 * Limits per message (arguments or result): each tensor at most 2 GiB - 1
 * of data, at most 65536 distinct tensors and 64 GiB of tensor data in all;
 * a larger value fails the call with MPR_ERR_INVALID_ARG before it is sent.
 * Sends are non-blocking: the call keeps a reference to each argument tensor
 * while MPI may still read it, so releasing one early is safe, but writing
 * into an argument tensor before the call's future completes races with the
 * send (the peer may receive old or new data). Wait first, or send a copy.
 *
 * Timeouts: timeout_s < 0 (MPR_TIMEOUT_DEFAULT) uses the default from
 * mpr_init_options_t, 0 means none, > 0 seconds. A call that times out fails
 * with MPR_ERR_TIMEOUT; its late reply is dropped.
 *
 * Ownership: `args` are borrowed by every call here (keep or release them
 * afterwards; NULL means no arguments); the *_take variants and the
 * format-string calls in mpirpc/rpc_helpers.h own their arguments instead. mpr_rpc_sync's *result is a new
 * reference, and NULL after every failure. mpr_rpc_async
 * returns a new future reference (NULL only when out of memory); every error,
 * including a bad destination or a shut-down runtime, completes that future. */
#ifndef MPIRPC_RPC_H
#define MPIRPC_RPC_H

#include "mpirpc/error.h"
#include "mpirpc/future.h"
#include "mpirpc/init.h"
#include "mpirpc/value.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MPR_TIMEOUT_DEFAULT (-1.0)

typedef struct mpr_call_ctx mpr_call_ctx_t;

typedef mpr_err_t (*mpr_fn_t)(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result);
typedef mpr_err_t (*mpr_async_fn_t)(mpr_call_ctx_t *ctx, const mpr_value_t *args,
                                    mpr_future_t **result);

/* Register `fn` under `name` (any non-empty string up to 255 bytes).
 * MPR_ERR_EXISTS if the name, or another name with the same hash, is taken. */
mpr_err_t mpr_register_function(const char *name, mpr_fn_t fn, void *user_data);
/* Register an async function: it returns a future (new reference) that the
 * reply waits for. */
mpr_err_t mpr_register_async_function(const char *name, mpr_async_fn_t fn, void *user_data);
/* Remove every registration (tests). */
void mpr_registry_clear(void);

/* Inside a handler: who called, which function, the registered user data. */
const mpr_worker_info_t *mpr_call_caller(const mpr_call_ctx_t *ctx);
const char *mpr_call_function(const mpr_call_ctx_t *ctx);
void *mpr_call_user_data(const mpr_call_ctx_t *ctx);

/* Call `fn` on `to` and wait for its result. */
mpr_err_t mpr_rpc_sync(mpr_dest_t to, const char *fn, const mpr_value_t *args, double timeout_s,
                       mpr_value_t **result);
/* Call `fn` on `to`; the future completes with its result or error. */
mpr_future_t *mpr_rpc_async(mpr_dest_t to, const char *fn, const mpr_value_t *args, double timeout_s);

#ifdef __cplusplus
}
#endif
#endif
