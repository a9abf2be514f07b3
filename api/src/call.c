/* call.c — the one callee path of CALL and REMOTE_CALL (mpri_call.h says
 * the steps, the hooks and the invariants), and the CALL kind itself.
 *
 * CALL body: u16 name length, the function name (the registry is looked up
 * by the header's function id AND the name), then the argument value; the
 * reply is RETURN with the result, or an error.
 *
 * Ownership along the path: an in_call_t owns the message, the decoded
 * arguments, the kind's state and the hook state until finish() has replied,
 * settled and freed them. An async function's message is kept until its
 * future completes, without holding a thread; a call whose arguments carry
 * RRefs not yet confirmed runs as a continuation of their confirmation.
 * A request that will not run (mpri_call_reject: the pool could not queue
 * it, the runtime stopped first, its state could not be allocated) is
 * settled without decoding: its kind's fields as a failed call, the RRefs
 * among its arguments through mpri_value_settle. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_args.h"
#include "mpri_assert.h"
#include "mpri_call.h"
#include "mpri_error.h"
#include "mpri_future.h"
#include "mpri_rref_proto.h"

const mpr_worker_info_t *mpr_call_caller(const mpr_call_ctx_t *ctx) {
    MPRI_ARG_NONNULL_OR(ctx, NULL);
    return ctx->caller;
}
const char *mpr_call_function(const mpr_call_ctx_t *ctx) {
    MPRI_ARG_NONNULL_OR(ctx, NULL);
    return ctx->function->name;
}
void *mpr_call_user_data(const mpr_call_ctx_t *ctx) {
    MPRI_ARG_NONNULL_OR(ctx, NULL);
    return ctx->function->user_data;
}

static const char *self_name(void) { return mpri_rt.workers[mpri_rt.rank].name; }

/* ---- hooks ---- */

static mpri_call_hooks_t hooks;
static bool hooks_set;

mpr_err_t mpri_call_set_hooks(const mpri_call_hooks_t *h) {
    if (!h) return mpr_error_set(MPR_ERR_INVALID_ARG, "mpri_call_set_hooks: NULL hooks");
    if (mpri_state() != MPRI_UNINIT)
        return mpr_error_set(MPR_ERR_STATE, "mpri_call_set_hooks: the runtime is already running");
    if (hooks_set) return mpr_error_set(MPR_ERR_EXISTS, "mpri_call_set_hooks: call hooks are already installed");
    hooks = *h;
    hooks_set = true;
    return MPR_OK;
}

const mpri_call_hooks_t *mpri_call_hooks(void) { return &hooks; }

/* ---- running the function ---- */

/* A completed future failing with `code` and `text` (NULL out of memory). */
static mpr_future_t *failed_outcome(mpr_err_t code, const char *text) {
    mpr_future_t *f = mpr_future_create();
    if (f) mpr_future_set_error(f, code, text);
    return f;
}

/* The thread's error detail after a function failed with `e`, or the code's
 * text when the function set none. */
static const char *failure_detail(mpr_err_t e) { return mpr_last_error()[0] ? mpr_last_error() : mpr_strerror(e); }

/* Run `fn` with `args` (borrowed) for `caller`, the hooks entered around it:
 * a future of its outcome (new reference; NULL only out of memory). A
 * failure carries the function's own code and detail. */
static mpr_future_t *invoke(const mpri_function_t *fn, const mpr_worker_info_t *caller, const mpr_value_t *args,
                            void *hook_state) {
    mpr_call_ctx_t ctx = {fn, caller};
    mpr_error_clear();
    if (hooks.enter) hooks.enter(hook_state);
    mpr_future_t *fut = NULL;
    mpr_err_t e;
    if (fn->fn) {
        mpr_value_t *result = NULL;
        e = fn->fn(&ctx, args, &result);
        if (e == MPR_OK) {
            if ((fut = mpr_future_create())) mpr_future_set_result(fut, result);
            else mpr_value_release(result);
        } else {
            mpr_value_release(result);
            fut = failed_outcome(e, failure_detail(e));
        }
    } else {
        e = fn->afn(&ctx, args, &fut);
        if (e != MPR_OK || !fut) {
            if (e == MPR_OK) mpr_error_set(e = MPR_ERR_STATE, "async function returned no future");
            mpr_future_release(fut);
            fut = failed_outcome(e, failure_detail(e));
        }
    }
    if (hooks.leave) hooks.leave(hook_state);
    return fut;
}

/* ---- the path ---- */

typedef struct in_call {
    mpri_msg_t *msg;
    const mpri_call_kind_t *kind;
    void *kind_state;
    void *hook_state;
    bool hooked; /* on_request returned MPR_OK: release is owed */
    const mpri_function_t *fn;
    char name[MPRI_MAX_FUNCTION_NAME + 1];
    mpr_value_t *args;
} in_call_t;

/* The encoded reply of a hooked call, before it is sent: hooks.on_reply. */
static mpr_err_t stamp_reply(mpri_outmsg_t *reply, void *arg) {
    in_call_t *c = arg;
    return hooks.on_reply ? hooks.on_reply(c->hook_state, reply) : MPR_OK;
}

/* The outcome is known: the kind's settle, the reply (hooks.on_reply sees
 * it encoded), hooks.release; frees `c`.
 * Takes over `outcome` (NULL: out of memory). */
static void finish(in_call_t *c, mpr_future_t *outcome) {
    if (!outcome) outcome = failed_outcome(MPR_ERR_NOMEM, "out of memory");
    if (!outcome) { /* not even a future: answer without one */
        c->kind->settle(c->kind_state, NULL);
        mpri_reply_error(c->msg, MPR_ERR_NOMEM, "out of memory");
    } else {
        MPRI_ASSERT(mpr_future_done(outcome), "a call is finished with a completed outcome");
        mpr_err_t e = mpr_future_error(outcome);
        const mpr_value_t *reply = c->kind->settle(c->kind_state, outcome);
        if (e == MPR_OK)
            mpri_reply_value_stamped(c->msg, c->kind->reply_kind, reply, c->hooked ? stamp_reply : NULL, c);
        else
            mpri_reply_future_error(c->msg, outcome);
        mpr_future_release(outcome);
    }
    if (c->hooked && hooks.release) hooks.release(c->hook_state);
    mpr_value_release(c->args);
    mpri_msg_done(c->msg);
    free(c);
}

/* Fail the call before its function ran: code and text as formatted. */
static void finish_failed(in_call_t *c, mpr_err_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void finish_failed(in_call_t *c, mpr_err_t code, const char *fmt, ...) {
    char text[MPR_ERROR_TEXT_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    finish(c, failed_outcome(code, text));
}

/* A function's outcome: a failure becomes MPR_ERR_REMOTE with this worker
 * as its origin, or, passed on from a call the function made, keeps its
 * origin and gains this hop (runtime/mpri_error.h). */
static void function_done(mpr_future_t *f, void *arg) {
    in_call_t *c = arg;
    mpr_err_t e = mpr_future_error(f);
    if (e == MPR_OK) return finish(c, f);
    mpri_remote_error_t *re = malloc(sizeof *re);
    if (!re) {
        mpr_future_release(f);
        return finish(c, NULL);
    }
    const mpri_remote_error_t *passed = mpri_future_remote_error(f);
    if (passed) { /* a remote failure the function passed on: one hop more */
        *re = *passed;
        mpri_remote_error_pass(re, self_name(), c->fn->name);
    } else {
        mpri_remote_error_init(re, self_name(), mpri_rt.rank, c->fn->name, e, mpr_future_error_message(f));
    }
    mpr_future_release(f);
    mpr_future_t *out = mpr_future_create();
    if (out) mpri_future_complete_remote(out, re);
    free(re);
    finish(c, out);
}

static void run(in_call_t *c) {
    if (hooks.on_request) {
        mpr_error_clear();
        mpr_err_t e = hooks.on_request(c->msg, c->args, &c->hook_state);
        if (e) return finish_failed(c, e, "On %s: %s '%s': %s", self_name(), c->kind->what, c->name, failure_detail(e));
        c->hooked = true;
    }
    mpr_future_t *f = invoke(c->fn, &mpri_rt.workers[c->msg->src], c->args, c->hook_state);
    if (!f) return finish(c, NULL);
    /* Sync functions: no callback to allocate; the reply goes before the
     * arguments are released (finish), since releasing an RRef argument
     * sends its USER_DELETE, and sent first it delayed every such reply
     * (rref_arg_fork 1.1-1.2x d7c3197, which replied first). */
    if (mpr_future_done(f)) return function_done(f, c);
    mpr_value_release(c->args); /* an async function had them borrowed: not kept while it runs */
    c->args = NULL;
    if (mpri_future_on_complete(f, function_done, c) != MPR_OK) { /* out of memory: wait here */
        mpr_future_wait(f, MPR_WAIT_FOREVER);
        function_done(f, c);
    }
}

static void run_when_ready(mpr_future_t *ready, void *arg) {
    mpr_future_release(ready);
    run(arg);
}

/* A request that will not run: the kind's fields are read and settled as a
 * failed call settles them (settle with no outcome: out of memory), and the
 * arguments are read past without decoding, their RRefs settled
 * (mpri_value_settle), so no fork is left waiting. Allocates nothing for the
 * arguments. */
void mpri_call_reject(mpri_msg_t *msg, const mpri_call_kind_t *kind, mpr_err_t code, const char *text,
                      bool reply) {
    mpri_reader_t r;
    mpri_reader_init(&r, msg->body, msg->hdr.body_len);
    uint16_t name_len = 0;
    char name[MPRI_MAX_FUNCTION_NAME + 1];
    void *state = NULL;
    mpri_error_saved_t saved;
    mpri_error_save(&saved);
    if (!mpri_read_u16(&r, &name_len) && name_len <= MPRI_MAX_FUNCTION_NAME && !mpri_read(&r, name, name_len) &&
        kind->read_fields(&r, msg, &state) == MPR_OK) {
        mpri_value_settle(&r, msg->src);
        kind->settle(state, NULL);
    }
    mpri_error_restore(&saved);
    if (reply) mpri_reply_error(msg, code, text);
    mpri_msg_done(msg);
}

void mpri_call_handle(mpri_msg_t *msg, const mpri_call_kind_t *kind) {
    mpri_reader_t r;
    mpri_reader_init(&r, msg->body, msg->hdr.body_len);
    uint16_t name_len = 0;
    char name[MPRI_MAX_FUNCTION_NAME + 1];
    in_call_t *c = NULL;
    mpr_err_t e = MPR_OK;
    if (mpri_read_u16(&r, &name_len) || name_len > MPRI_MAX_FUNCTION_NAME || mpri_read(&r, name, name_len))
        e = MPR_ERR_DECODE;
    else if (!(c = calloc(1, sizeof *c))) {
        char text[MPR_ERROR_TEXT_MAX];
        snprintf(text, sizeof text, "On %s: cannot take %s: out of memory", self_name(), kind->what);
        mpri_call_reject(msg, kind, MPR_ERR_NOMEM, text, true);
        return;
    } else
        e = kind->read_fields(&r, msg, &c->kind_state);
    if (e) { /* malformed, or the kind's fields could not be taken: nothing to settle */
        char text[MPR_ERROR_TEXT_MAX];
        snprintf(text, sizeof text, "On %s: %s %s: %s", self_name(), e == MPR_ERR_DECODE ? "malformed" : "cannot take",
                 kind->what, mpr_last_error());
        free(c);
        mpri_reply_error(msg, e, text);
        mpri_msg_done(msg);
        return;
    }
    name[name_len] = '\0';
    memcpy(c->name, name, (size_t)name_len + 1);
    c->msg = msg;
    c->kind = kind;
    size_t args_at = msg->hdr.body_len - r.left;
    c->fn = mpri_registry_find_named(msg->hdr.function_id, name);
    if (!c->fn) {
        /* Decode anyway: RRefs among the arguments must complete their fork
         * protocol (their senders wait for the child accepts). */
        mpr_value_t *unused = NULL;
        if (mpri_msg_decode_value(msg, args_at, &unused) == MPR_OK) mpr_value_release(unused);
        return finish_failed(c, MPR_ERR_UNKNOWN_FUNCTION,
                             "On %s (rank %d): unknown function '%s' (not registered on %s)", self_name(),
                             mpri_rt.rank, name, self_name());
    }
    mpri_rref_record_begin();
    /* Outside an autograd context nothing reads the message's tensors after
     * this decode (the recording hooks do inside one): the arguments take
     * them over. */
    e = msg->hdr.autograd_context_id ? mpri_msg_decode_value(msg, args_at, &c->args)
                                     : mpri_msg_take_value(msg, args_at, &c->args);
    mpr_future_t *ready = mpri_rref_record_end();
    if (e) {
        mpr_future_release(ready);
        return finish_failed(c, e, "On %s: cannot decode the arguments of '%s' (%s): %s", self_name(), name,
                             kind->what, mpr_last_error());
    }
    /* RRef arguments not confirmed yet: run once they are, holding no thread.
     * (If the continuation cannot be registered, run now: best effort.) */
    if (ready && mpri_future_on_complete(ready, run_when_ready, c) == MPR_OK) return;
    mpr_future_release(ready);
    run(c);
}

/* ---- the CALL kind ---- */

static mpr_err_t call_read_fields(mpri_reader_t *r, const mpri_msg_t *msg, void **state) {
    (void)r;
    (void)msg;
    *state = NULL;
    return MPR_OK;
}

static const mpr_value_t *call_settle(void *state, mpr_future_t *outcome) {
    (void)state;
    return outcome ? mpri_future_value(outcome) : NULL;
}

static const mpri_call_kind_t call_kind = {"call", MPRI_MSG_RETURN, call_read_fields, call_settle};

static void handle_call(mpri_msg_t *msg) { mpri_call_handle(msg, &call_kind); }

static void reject_call(mpri_msg_t *msg, mpr_err_t code, const char *text, bool reply) {
    mpri_call_reject(msg, &call_kind, code, text, reply);
}

mpr_err_t mpri_call_install(void) {
    mpr_err_t e = mpri_set_handler(MPRI_MSG_CALL, handle_call, false);
    return e ? e : mpri_set_reject_handler(MPRI_MSG_CALL, reject_call);
}
