/* rpc_helpers.c — mpirpc/rpc_helpers.h: calls taking ownership of their
 * arguments, calls with format-string arguments, fire-and-forget calls.
 *
 * Invariants: every function here releases the argument list it owns (given
 * or built) exactly once, on every path; a one-way call either returns its
 * error to the caller (its request did not leave: the future was already
 * failed when the call returned) or has a completion callback that counts
 * and prints a failure (its request left, however quickly it was answered)
 * — there is no third path. */
#include "mpirpc/rpc_helpers.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_args.h"
#include "mpri_assert.h"
#include "mpri_future.h"
#include "mpri_rpc.h"

static atomic_uint_fast64_t oneway_failures;

uint64_t mpr_oneway_failure_count(void) { return (uint64_t)atomic_load(&oneway_failures); }

static mpr_err_t null_args(const char *who) {
    mpr_err_t prev = mpr_last_error_code();
    if (prev != MPR_OK) {
        char why[256]; /* mpr_error_set must not read the buffer it writes */
        snprintf(why, sizeof why, "%s", mpr_last_error());
        return mpr_error_set(MPR_ERR_INVALID_ARG,
                             "%s: argument 'args' is NULL (building them failed? last error: %s: %s)",
                             who, mpr_error_name(prev), why);
    }
    return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: argument 'args' is NULL (for no arguments pass an empty list)",
                         who);
}

static mpr_future_t *failed_future(mpr_err_t code) {
    mpr_future_t *f = mpr_future_create();
    if (f) mpr_future_set_error(f, code, mpr_last_error());
    return f;
}

/* mpr_rpc_async_take, also telling whether the request left. */
static mpr_future_t *async_take_sent(mpr_dest_t to, const char *fn, mpr_value_t *args, double timeout_s,
                                     bool *left) {
    *left = false;
    if (!args) return failed_future(null_args("mpr_rpc_async_take"));
    if (!fn) {
        mpr_value_release(args); /* ownership is taken on failure too */
        return failed_future(mpri_null_arg("mpr_rpc_async_take", "fn"));
    }
    mpr_future_t *f = mpri_rpc_async_sent(to, fn, args, timeout_s, left); /* the message holds what it needs */
    mpr_value_release(args);
    return f;
}

mpr_future_t *mpr_rpc_async_take(mpr_dest_t to, const char *fn, mpr_value_t *args, double timeout_s) {
    bool left;
    return async_take_sent(to, fn, args, timeout_s, &left);
}

mpr_err_t mpr_rpc_sync_take(mpr_dest_t to, const char *fn, mpr_value_t *args, double timeout_s,
                            mpr_value_t **result) {
    if (result) *result = NULL;
    if (!args) return null_args("mpr_rpc_sync_take");
    if (!fn || !result) {
        mpr_value_release(args); /* ownership is taken on failure too */
        return mpri_null_arg(__func__, !fn ? "fn" : "result");
    }
    mpr_err_t e = mpr_rpc_sync(to, fn, args, timeout_s, result);
    mpr_value_release(args);
    return e;
}

/* The argument list of a format call (`who`, the function the user called,
 * names it in errors): fmt checked, the items packed from `ap`, fn checked.
 * NULL with the error set on failure; the packed items (stolen references
 * included) are released when fn is NULL. */
static mpr_value_t *format_call_args(const char *who, const char *fn, const char *fmt, va_list ap) {
    if (!fmt) {
        mpri_null_arg(who, "fmt");
        return NULL;
    }
    mpr_value_t *args = mpr_args_vpack(fmt, ap);
    if (args && !fn) {
        mpr_value_release(args); /* releases the stolen items too */
        mpri_null_arg(who, "fn");
        return NULL;
    }
    return args;
}

mpr_err_t mpr_call_sync(mpr_dest_t to, const char *fn, double timeout_s, mpr_value_t **result, const char *fmt,
                        ...) {
    if (result) *result = NULL;
    va_list ap;
    va_start(ap, fmt);
    mpr_value_t *args = format_call_args(__func__, fn, fmt, ap);
    va_end(ap);
    if (!args) return mpr_last_error_code();
    mpr_value_t *r = NULL;
    mpr_err_t e = mpr_rpc_sync(to, fn, args, timeout_s, &r);
    mpr_value_release(args);
    if (result)
        *result = r;
    else
        mpr_value_release(r);
    return e;
}

mpr_future_t *mpr_call_async(mpr_dest_t to, const char *fn, double timeout_s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    mpr_value_t *args = format_call_args(__func__, fn, fmt, ap);
    va_end(ap);
    if (!args) return failed_future(mpr_last_error_code());
    return mpr_rpc_async_take(to, fn, args, timeout_s);
}

/* ---- one-way calls ---- */

typedef struct oneway {
    int rank;
    char fn[64];
} oneway_t;

static void oneway_done(mpr_future_t *f, void *arg) {
    oneway_t *ow = arg;
    mpr_err_t e = mpr_future_error(f);
    if (e != MPR_OK) {
        atomic_fetch_add(&oneway_failures, 1);
        fprintf(stderr, "mpirpc: one-way call '%s' to rank %d failed: %s: %s\n", ow->fn, ow->rank,
                mpr_error_name(e), mpr_future_error_message(f));
    }
    free(ow);
}

mpr_err_t mpr_rpc_oneway_take(mpr_dest_t to, const char *fn, mpr_value_t *args) {
    if (!args) return null_args("mpr_rpc_oneway_take");
    if (!fn) {
        mpr_value_release(args); /* ownership is taken on failure too */
        return mpri_null_arg(__func__, "fn");
    }
    oneway_t *ow = calloc(1, sizeof *ow);
    mpr_err_t e = ow ? mpr_dest_rank(to, &ow->rank) : mpr_error_set(MPR_ERR_NOMEM, "one-way call: out of memory");
    if (e) {
        free(ow);
        mpr_value_release(args);
        return e;
    }
    snprintf(ow->fn, sizeof ow->fn, "%s", fn ? fn : "(null)");
    bool left;
    mpr_future_t *f = async_take_sent(to, fn, args, MPR_TIMEOUT_DEFAULT, &left);
    if (!f) {
        free(ow);
        return mpr_last_error_code();
    }
    if (!left) {
        /* Failed before leaving (a request that did not leave is failed by
         * the time the call returns): the caller hears of it directly. A
         * request that left may be answered, even with an error, before the
         * call returns: that goes to the callback like any later outcome. */
        MPRI_ASSERT(mpr_future_done(f) && mpr_future_error(f) != MPR_OK,
                    "a request that did not leave has a failed future");
        e = mpr_future_error(f);
        mpr_error_set(e, "%s", mpr_future_error_message(f));
        free(ow);
    } else if (mpri_future_on_complete(f, oneway_done, ow) != MPR_OK) {
        /* Out of memory for the watch: wait here rather than lose an error. */
        free(ow);
        e = mpr_future_wait(f, MPR_WAIT_FOREVER);
        if (e == MPR_OK && (e = mpr_future_error(f)) != MPR_OK) mpr_error_set(e, "%s", mpr_future_error_message(f));
    }
    mpr_future_release(f);
    return e;
}

mpr_err_t mpr_call_oneway(mpr_dest_t to, const char *fn, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    mpr_value_t *args = format_call_args(__func__, fn, fmt, ap);
    va_end(ap);
    if (!args) return mpr_last_error_code();
    return mpr_rpc_oneway_take(to, fn, args);
}
