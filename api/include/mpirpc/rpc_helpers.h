/* mpirpc/rpc_helpers.h — shorter calls: arguments from a format string,
 * calls that take ownership of their argument list, fire-and-forget calls.
 *
 *     mpr_value_t *r;
 *     mpr_call_sync(mpr_to_name("worker1"), "add", MPR_TIMEOUT_DEFAULT, &r, "ll", (int64_t)3, (int64_t)4);
 *     mpr_call_oneway(mpr_to_rank(1), "log", "s", "hello");          (no reply awaited)
 *
 * Everything here is built on mpr_rpc_sync / mpr_rpc_async (mpirpc/rpc.h):
 * same destinations, timeouts, errors and result ownership. The format
 * language is mpirpc/call_format.h's; the arguments are always a list of
 * the format's items ("" = no arguments, "l" = one int).
 *
 * Ownership: the *_take functions take ownership of `args` — it is released
 * when the call no longer needs it, on success and on every failure — so
 * `mpr_rpc_sync_take(to, "f", mpr_value_list_of(...), ...)` written inline
 * leaks nothing. A NULL `args` there is MPR_ERR_INVALID_ARG (it usually
 * means building the list failed; the message repeats that failure): for
 * "no arguments" pass mpr_value_new_list() or use mpr_call_* with "". The
 * format calls own the list they build; stolen items ('T', 'R', 'V') are
 * released on failure too, as mpr_value_pack does.
 *
 * Fire-and-forget (one-way) calls: mpr_call_oneway / mpr_rpc_oneway_take
 * send the call and return without waiting; the callee runs it like any
 * other call and its result is dropped. A failure known before the call
 * leaves (bad format or destination, runtime not running, unencodable
 * arguments) is returned, as is any failure already known when the call
 * returns (possible for a call to this rank itself). A later failure
 * (unknown function, handler error, timeout after the default timeout of
 * mpr_init_options_t, the runtime shut down before the reply) is never
 * lost: it is counted
 * (mpr_oneway_failure_count) and printed on stderr as
 * "mpirpc: one-way call 'fn' to rank N failed: MPR_ERR_...: detail".
 * The call stays outstanding until its (empty) reply arrives, so a graceful
 * mpr_shutdown(true) waits for it like for any call in flight: the handler
 * has run to completion on the callee when shutdown returns. A non-graceful
 * mpr_shutdown(false) fails what is still outstanding (counted and printed
 * as MPR_ERR_SHUTDOWN; the callee may or may not have run it). */
#ifndef MPIRPC_RPC_HELPERS_H
#define MPIRPC_RPC_HELPERS_H

#include <stdint.h>

#include "mpirpc/call_format.h"
#include "mpirpc/future.h"
#include "mpirpc/rpc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* mpr_rpc_sync / mpr_rpc_async taking ownership of `args`. */
mpr_err_t mpr_rpc_sync_take(mpr_dest_t to, const char *fn, mpr_value_t *args, double timeout_s,
                            mpr_value_t **result);
mpr_future_t *mpr_rpc_async_take(mpr_dest_t to, const char *fn, mpr_value_t *args, double timeout_s);

/* Call with arguments packed from `fmt`. `result` may be NULL to drop the
 * result; otherwise *result is a new reference, or NULL on failure. */
mpr_err_t mpr_call_sync(mpr_dest_t to, const char *fn, double timeout_s, mpr_value_t **result, const char *fmt,
                        ...);
/* Never NULL except out of memory: every error (a bad format included)
 * completes the returned future, as with mpr_rpc_async. */
mpr_future_t *mpr_call_async(mpr_dest_t to, const char *fn, double timeout_s, const char *fmt, ...);

/* Fire-and-forget, see above. MPR_OK once the call is on its way. */
mpr_err_t mpr_call_oneway(mpr_dest_t to, const char *fn, const char *fmt, ...);
mpr_err_t mpr_rpc_oneway_take(mpr_dest_t to, const char *fn, mpr_value_t *args);

/* One-way calls of this process that failed after they were sent. */
uint64_t mpr_oneway_failure_count(void);

#ifdef __cplusplus
}
#endif
#endif
