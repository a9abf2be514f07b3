/* call.c — the callee side of rpc: runs registered functions for CALL
 * messages on the worker pool and replies.
 *
 * CALL body: u16 name length, the function name (for error messages; the
 * registry is looked up by the header's function id), then the argument
 * value. Invariants: every CALL gets exactly one reply (result or error) and
 * is counted processed only after that reply was sent; an async function's
 * message is kept until its future completes, without holding a thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_future.h"
#include "mpri_registry.h"
#include "mpri_runtime.h"

const mpr_worker_info_t *mpr_call_caller(const mpr_call_ctx_t *ctx) { return ctx->caller; }
const char *mpr_call_function(const mpr_call_ctx_t *ctx) { return ctx->function->name; }
void *mpr_call_user_data(const mpr_call_ctx_t *ctx) { return ctx->function->user_data; }

static const char *self_name(void) { return mpri_rt.workers[mpri_rt.rank].name; }

static void reply_failure(const mpri_msg_t *msg, const char *fn, mpr_err_t code, const char *detail) {
    char text[1400];
    snprintf(text, sizeof text, "On %s (rank %d): function '%s' failed: %s: %s", self_name(), mpri_rt.rank,
             fn, mpr_error_name(code), detail && *detail ? detail : mpr_strerror(code));
    mpri_reply_error(msg, MPR_ERR_REMOTE, text);
}

static void reply_from_future(mpr_future_t *f, void *arg) {
    mpri_msg_t *msg = arg;
    const mpri_function_t *fn = mpri_registry_find(msg->hdr.function_id);
    mpr_err_t e = mpr_future_error(f);
    if (e == MPR_OK)
        mpri_reply_value(msg, MPRI_MSG_RETURN, mpri_future_value(f));
    else
        reply_failure(msg, fn ? fn->name : "?", e, mpr_future_error_message(f));
    mpr_future_release(f);
    mpri_msg_done(msg);
}

static void handle_call(mpri_msg_t *msg) {
    mpri_reader_t r;
    mpri_reader_init(&r, msg->body, msg->hdr.body_len);
    uint16_t name_len = 0;
    char name[MPRI_MAX_FUNCTION_NAME + 1] = "?";
    if (mpri_read_u16(&r, &name_len) || name_len > MPRI_MAX_FUNCTION_NAME || mpri_read(&r, name, name_len)) {
        char text[1200];
        snprintf(text, sizeof text, "On %s: malformed call: %s", self_name(), mpr_last_error());
        mpri_reply_error(msg, MPR_ERR_DECODE, text);
        mpri_msg_done(msg);
        return;
    }
    name[name_len] = '\0';
    const mpri_function_t *fn = mpri_registry_find(msg->hdr.function_id);
    if (!fn) {
        char text[600];
        snprintf(text, sizeof text, "On %s (rank %d): unknown function '%s' (not registered on %s)",
                 self_name(), mpri_rt.rank, name, self_name());
        mpri_reply_error(msg, MPR_ERR_UNKNOWN_FUNCTION, text);
        mpri_msg_done(msg);
        return;
    }
    mpr_value_t *args = NULL;
    mpr_err_t e = mpri_msg_decode_value(msg, 2u + name_len, &args);
    if (e) {
        char text[1400];
        snprintf(text, sizeof text, "On %s: cannot decode the arguments of '%s': %s", self_name(), name,
                 mpr_last_error());
        mpri_reply_error(msg, e, text);
        mpri_msg_done(msg);
        return;
    }
    mpr_call_ctx_t ctx = {fn, &mpri_rt.workers[msg->src]};
    mpr_error_clear();
    if (fn->fn) {
        mpr_value_t *result = NULL;
        e = fn->fn(&ctx, args, &result);
        if (e == MPR_OK)
            mpri_reply_value(msg, MPRI_MSG_RETURN, result);
        else
            reply_failure(msg, fn->name, e, mpr_last_error());
        mpr_value_release(result);
        mpr_value_release(args);
        mpri_msg_done(msg);
        return;
    }
    mpr_future_t *fut = NULL;
    e = fn->afn(&ctx, args, &fut);
    mpr_value_release(args);
    if (e != MPR_OK || !fut) {
        if (e == MPR_OK) mpr_error_set(e = MPR_ERR_STATE, "async function returned no future");
        reply_failure(msg, fn->name, e, mpr_last_error());
        mpri_msg_done(msg);
        return;
    }
    mpri_future_on_complete(fut, reply_from_future, msg); /* takes over `fut` and `msg` */
}

/* Installed when the library loads: the runtime below never names this layer. */
__attribute__((constructor)) static void install_call_handler(void) {
    mpri_set_handler(MPRI_MSG_CALL, handle_call, false);
}
