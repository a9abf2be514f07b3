/* call.c — the callee side of rpc: runs registered functions for CALL
 * messages on the worker pool and replies.
 *
 * CALL body: u16 name length, the function name (for error messages; the
 * registry is looked up by the header's function id), then the argument
 * value. Invariants: every CALL gets exactly one reply (result or error) and
 * is counted processed only after that reply was sent; an async function's
 * message is kept until its future completes, without holding a thread; a
 * call whose arguments carry RRefs not yet confirmed by their owners runs
 * only once they are (a continuation on their confirmation, no thread held).
 * mpri_call_invoke/mpri_call_failure_text are shared with REMOTE_CALL. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_future.h"
#include "mpri_registry.h"
#include "mpri_rref.h"
#include "mpri_runtime.h"

const mpr_worker_info_t *mpr_call_caller(const mpr_call_ctx_t *ctx) { return ctx->caller; }
const char *mpr_call_function(const mpr_call_ctx_t *ctx) { return ctx->function->name; }
void *mpr_call_user_data(const mpr_call_ctx_t *ctx) { return ctx->function->user_data; }

static const char *self_name(void) { return mpri_rt.workers[mpri_rt.rank].name; }

void mpri_call_failure_text(char *buf, size_t len, const char *fn, mpr_err_t code, const char *detail) {
    snprintf(buf, len, "On %s (rank %d): function '%s' failed: %s: %s", self_name(), mpri_rt.rank, fn,
             mpr_error_name(code), detail && *detail ? detail : mpr_strerror(code));
}

static void reply_failure(const mpri_msg_t *msg, const char *fn, mpr_err_t code, const char *detail) {
    char text[MPR_ERROR_TEXT_MAX];
    mpri_call_failure_text(text, sizeof text, fn, code, detail);
    mpri_reply_error(msg, MPR_ERR_REMOTE, text);
}

mpr_future_t *mpri_call_invoke(const mpri_function_t *fn, const mpr_worker_info_t *caller,
                               const mpr_value_t *args) {
    mpr_call_ctx_t ctx = {fn, caller};
    mpr_error_clear();
    mpr_future_t *fut = NULL;
    mpr_err_t e;
    if (fn->fn) {
        mpr_value_t *result = NULL;
        e = fn->fn(&ctx, args, &result);
        char detail[MPR_ERROR_TEXT_MAX];
        snprintf(detail, sizeof detail, "%s", mpr_last_error()[0] ? mpr_last_error() : mpr_strerror(e));
        if (e != MPR_OK) {
            mpr_value_release(result);
            result = NULL;
        }
        if (!(fut = mpr_future_create())) {
            mpr_value_release(result);
            return NULL;
        }
        if (e == MPR_OK) mpr_future_set_result(fut, result);
        else mpr_future_set_error(fut, e, detail);
        return fut;
    }
    e = fn->afn(&ctx, args, &fut);
    if (e == MPR_OK && fut) return fut;
    if (e == MPR_OK) mpr_error_set(e = MPR_ERR_STATE, "async function returned no future");
    mpr_future_release(fut);
    if ((fut = mpr_future_create()))
        mpr_future_set_error(fut, e, mpr_last_error()[0] ? mpr_last_error() : mpr_strerror(e));
    return fut;
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

typedef struct {
    mpri_msg_t *msg;
    const mpri_function_t *fn;
    mpr_value_t *args;
} deferred_call_t;

static void run_call(mpri_msg_t *msg, const mpri_function_t *fn, mpr_value_t *args);

static void run_deferred_call(mpr_future_t *ready, void *arg) {
    deferred_call_t d = *(deferred_call_t *)arg;
    free(arg);
    mpr_future_release(ready);
    run_call(d.msg, d.fn, d.args);
}

static void handle_call(mpri_msg_t *msg) {
    mpri_reader_t r;
    mpri_reader_init(&r, msg->body, msg->hdr.body_len);
    uint16_t name_len = 0;
    char name[MPRI_MAX_FUNCTION_NAME + 1] = "?";
    if (mpri_read_u16(&r, &name_len) || name_len > MPRI_MAX_FUNCTION_NAME || mpri_read(&r, name, name_len)) {
        char text[MPR_ERROR_TEXT_MAX];
        snprintf(text, sizeof text, "On %s: malformed call: %s", self_name(), mpr_last_error());
        mpri_reply_error(msg, MPR_ERR_DECODE, text);
        mpri_msg_done(msg);
        return;
    }
    name[name_len] = '\0';
    const mpri_function_t *fn = mpri_registry_find_named(msg->hdr.function_id, name);
    if (!fn) {
        /* Decode anyway: RRefs among the arguments must complete their fork
         * protocol (their senders wait for the child accepts). */
        mpr_value_t *unused = NULL;
        if (mpri_msg_decode_value(msg, 2u + name_len, &unused) == MPR_OK) mpr_value_release(unused);
        char text[MPR_ERROR_TEXT_MAX];
        snprintf(text, sizeof text, "On %s (rank %d): unknown function '%s' (not registered on %s)",
                 self_name(), mpri_rt.rank, name, self_name());
        mpri_reply_error(msg, MPR_ERR_UNKNOWN_FUNCTION, text);
        mpri_msg_done(msg);
        return;
    }
    mpr_value_t *args = NULL;
    mpri_rref_record_begin();
    mpr_err_t e = mpri_msg_decode_value(msg, 2u + name_len, &args);
    mpr_future_t *ready = mpri_rref_record_end();
    if (e) {
        mpr_future_release(ready);
        char text[MPR_ERROR_TEXT_MAX];
        snprintf(text, sizeof text, "On %s: cannot decode the arguments of '%s': %s", self_name(), name,
                 mpr_last_error());
        mpri_reply_error(msg, e, text);
        mpri_msg_done(msg);
        return;
    }
    if (ready) { /* RRef arguments not confirmed yet: run once they are, holding no thread */
        deferred_call_t *d = malloc(sizeof *d);
        if (d) {
            *d = (deferred_call_t){msg, fn, args};
            mpri_future_on_complete(ready, run_deferred_call, d); /* takes over `ready` */
            return;
        }
        mpr_future_release(ready);
    }
    run_call(msg, fn, args);
}

/* Run `fn` for CALL `msg` and reply; consumes `args` and `msg`. */
static void run_call(mpri_msg_t *msg, const mpri_function_t *fn, mpr_value_t *args) {
    mpr_err_t e;
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
