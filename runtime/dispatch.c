/* dispatch.c — the handler table and the dispatch of complete incoming
 * messages: a reply completes the future waiting for it, a request goes to
 * the handler installed for its kind (inline on the polling thread, or on the
 * worker pool).
 *
 * Invariants:
 * - A kind's handler is installed once (mpri_set_handler); installing a
 *   different one over it is a bug in the layer above (MPRI_ASSERT).
 * - Every message given to mpri_dispatch is finished exactly once: by its
 *   handler (which calls mpri_msg_done), or here when it is a reply or has
 *   no handler, or by its kind's reject handler (else here) when it cannot
 *   be queued or the pool stops before running it: a request that does not
 *   run still settles the RRef forks it carries.
 * - A reply whose request is no longer pending (timed out, failed) is
 *   dropped: mpri_pending_take hands each future out once.
 * - Dispatch never blocks: it runs in the progress context. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_assert.h"
#include "mpri_error.h"
#include "mpri_event.h"
#include "mpri_future.h"
#include "mpri_pool.h"
#include "mpri_runtime.h"
#include "mpri_trace.h"
#include "mpirpc/tensor.h"

typedef struct {
    mpri_msg_handler_t fn;
    bool run_inline;
    mpri_msg_reject_t reject; /* optional: settles a request that will not run */
} handler_entry_t;

/* Written before mpr_init (by the layers' init), read afterwards. */
static handler_entry_t handlers[MPRI_MSG_KIND_COUNT];

mpr_err_t mpri_set_handler(int kind, mpri_msg_handler_t fn, bool run_inline) {
    if (kind < 0 || kind >= MPRI_MSG_KIND_COUNT || !fn)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "mpri_set_handler: bad kind %d or NULL handler", kind);
    handler_entry_t *h = &handlers[kind];
    MPRI_ASSERT(!h->fn || (h->fn == fn && h->run_inline == run_inline),
                "a different handler is already installed for this message kind");
    h->fn = fn;
    h->run_inline = run_inline;
    return MPR_OK;
}

mpr_err_t mpri_set_reject_handler(int kind, mpri_msg_reject_t reject) {
    if (kind < 0 || kind >= MPRI_MSG_KIND_COUNT || !reject)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "mpri_set_reject_handler: bad kind %d or NULL function", kind);
    handler_entry_t *h = &handlers[kind];
    MPRI_ASSERT(!h->reject || h->reject == reject,
                "a different reject handler is already installed for this message kind");
    h->reject = reject;
    return MPR_OK;
}

/* A request that will not reach its handler: its kind settles it (or it is
 * answered with the error), and it is finished. */
static void reject_request(mpri_msg_t *msg, mpr_err_t code, const char *text, bool reply) {
    mpri_msg_reject_t reject = handlers[msg->hdr.kind].reject;
    if (reject) {
        reject(msg, code, text, reply);
        return;
    }
    if (reply) mpri_reply_error(msg, code, text);
    mpri_msg_done(msg);
}

static mpr_err_t (*reply_value_hook)(const mpri_msg_t *msg, mpr_value_t *v);

void mpri_set_reply_value_hook(mpr_err_t (*hook)(const mpri_msg_t *msg, mpr_value_t *v)) { reply_value_hook = hook; }

static mpri_reply_decoder_t reply_decoders[MPRI_MSG_KIND_COUNT];

mpr_err_t mpri_set_reply_decoder(int kind, mpri_reply_decoder_t decode) {
    if (kind < 0 || kind >= MPRI_MSG_KIND_COUNT || !decode)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "reply decoder: kind %d or decoder invalid", kind);
    MPRI_ASSERT(!reply_decoders[kind] || reply_decoders[kind] == decode,
                "one reply decoder per message kind (installed twice with different functions)");
    reply_decoders[kind] = decode;
    return MPR_OK;
}

/* A reply: the error it carries, or its value, completes `f`. */
static void complete_from_reply(mpr_future_t *f, mpri_msg_t *msg) {
    if (msg->hdr.flags & MPRI_FLAG_ERROR) {
        mpri_reader_t r;
        mpri_reader_init(&r, msg->body, msg->hdr.body_len);
        uint32_t code;
        const void *text;
        size_t len;
        if (mpri_read_u32(&r, &code) || mpri_read_blob(&r, &text, &len) || code == 0 ||
            code >= MPR_ERR_COUNT) {
            mpri_future_complete(f, MPR_ERR_DECODE, "malformed error reply", NULL);
            return;
        }
        if (code == MPR_ERR_REMOTE && r.left > 0) { /* the failure's origin follows (mpri_error.h) */
            mpri_remote_error_t *re = malloc(sizeof *re);
            if (re && mpri_remote_error_read(&r, re) == MPR_OK)
                mpri_future_complete_remote(f, re);
            else
                mpri_future_complete(f, re ? MPR_ERR_DECODE : MPR_ERR_NOMEM,
                                     re ? "malformed remote error reply" : "out of memory", NULL);
            free(re);
            return;
        }
        char *message = strndup(text, len);
        mpri_future_complete(f, (mpr_err_t)code, message ? message : "remote error", NULL);
        free(message);
        return;
    }
    mpr_value_t *v = NULL;
    mpri_reply_decoder_t decode = reply_decoders[msg->hdr.kind]; /* the header read checked the kind */
    if (decode) { /* a body of the kind's own */
        mpr_err_t e = decode(msg, &v);
        mpri_future_complete(f, e, e ? mpr_last_error() : NULL, e ? NULL : v);
        return;
    }
    /* Outside an autograd context nothing reads the message's tensors after
     * this decode: the value takes them over. */
    mpr_err_t e = msg->hdr.autograd_context_id ? mpri_msg_decode_value(msg, 0, &v) : mpri_msg_take_value(msg, 0, &v);
    if (e)
        mpri_future_complete(f, e, mpr_last_error(), NULL);
    else {
        mpr_err_t he = msg->hdr.autograd_context_id && reply_value_hook ? reply_value_hook(msg, v) : MPR_OK;
        if (he) {
            mpri_future_complete(f, he, mpr_last_error(), NULL);
            mpr_value_release(v);
        } else {
            mpri_future_complete(f, MPR_OK, NULL, v);
        }
    }
}

/* A reply whose call is gone (it timed out, or its caller could not wait
 * for it): its value is decoded and released all the same, so the RRefs it
 * carries settle their fork protocol (a fork the sender added when it
 * encoded the reply is confirmed and then deleted) instead of pinning
 * their OwnerRRef until shutdown. An error reply carries no value. */
static void settle_orphan_reply(mpri_msg_t *msg) {
    if (msg->hdr.flags & MPRI_FLAG_ERROR) return;
    if (reply_decoders[msg->hdr.kind]) return; /* a body of its own: no RRef to settle */
    mpr_value_t *v = NULL;
    if (mpri_msg_decode_value(msg, 0, &v) == MPR_OK) mpr_value_release(v);
}

/* Run `fn` on request `msg` (which it consumes); traced: the run as a slice. */
static void run_handler(mpri_msg_handler_t fn, mpri_msg_t *msg) {
    if (!mpri_observing(MPRI_OBSERVE_TRACE)) {
        fn(msg);
        return;
    }
    mpri_wire_header_t h = msg->hdr;
    int src = msg->src;
    uint64_t bytes = msg->wire_bytes;
    int64_t t0 = mpri_now_ns();
    (void)mpri_trace_take_handoff();
    fn(msg);
    int type = mpri_trace_take_handoff() ? MPRI_TEV_HANDOFF : MPRI_TEV_HANDLER;
    mpri_trace_msg(type, t0, mpri_now_ns() - t0, h.kind, h.flags, h.request_id, h.function_id, src,
                   bytes);
}

void mpri_dispatch_run_handler(mpri_msg_handler_t fn, mpri_msg_t *msg) { run_handler(fn, msg); }

static void run_handler_task(void *arg) {
    mpri_msg_t *msg = arg;
    run_handler(handlers[msg->hdr.kind].fn, msg);
}

/* Tracing/statistics on: note a complete incoming message (its time and
 * bytes on the message; a request's receipt as an instant). */
static void observe_incoming(mpri_msg_t *msg) {
    msg->recv_ns = mpri_now_ns();
    uint64_t bytes = msg->len;
    for (uint32_t i = 0; msg->tensors && i < msg->hdr.tensor_count; i++)
        bytes += msg->tensors[i] ? mpr_tensor_nbytes(msg->tensors[i]) : 0;
    msg->wire_bytes = bytes;
    if (mpri_observing(MPRI_OBSERVE_STATS)) mpri_stats_peer_received(msg->src, bytes);
    if (!(msg->hdr.flags & MPRI_FLAG_RESPONSE) && mpri_observing(MPRI_OBSERVE_TRACE))
        mpri_trace_msg(MPRI_TEV_RECV, msg->recv_ns, 0, msg->hdr.kind, msg->hdr.flags, msg->hdr.request_id,
                       msg->hdr.function_id, msg->src, bytes);
}

/* Tracing/statistics on: a reply completes its future, timed (trace) and
 * counted against its call (statistics) before the future completes, so a
 * caller that got its result sees its call counted. */
static void complete_observed(mpri_msg_t *msg) {
    uint64_t fn = 0;
    int64_t started = 0;
    mpr_future_t *f = mpri_pending_take_call(msg->hdr.request_id, &fn, &started);
    if (!f) { /* a late reply to a request that timed out */
        settle_orphan_reply(msg);
        return;
    }
    if (fn && mpri_observing(MPRI_OBSERVE_STATS))
        mpri_stats_call_done(fn, started ? msg->recv_ns - started : -1, msg->wire_bytes,
                             (msg->hdr.flags & MPRI_FLAG_ERROR) != 0, false);
    int64_t t0 = msg->recv_ns; /* taken just before (observe_incoming) */
    complete_from_reply(f, msg);
    mpr_future_release(f);
    if (mpri_observing(MPRI_OBSERVE_TRACE))
        mpri_trace_msg(MPRI_TEV_REPLY_IN, t0, mpri_now_ns() - t0, msg->hdr.kind, msg->hdr.flags, msg->hdr.request_id, fn,
                       msg->src, msg->wire_bytes);
}

/* The pool stopped before a worker ran the request: nothing is sent now. */
static void drop_handler_task(void *arg) {
    reject_request(arg, MPR_ERR_SHUTDOWN, "the runtime stopped before a worker ran the request", false);
}

void mpri_dispatch(mpri_msg_t *msg) {
    if (mpri_observing(MPRI_OBSERVE_TRACE | MPRI_OBSERVE_STATS)) {
        observe_incoming(msg);
        if (msg->hdr.flags & MPRI_FLAG_RESPONSE) {
            complete_observed(msg);
            mpri_msg_done(msg);
            return;
        }
    }
    if (msg->hdr.flags & MPRI_FLAG_RESPONSE) {
        mpr_future_t *f = mpri_pending_take(msg->hdr.request_id);
        if (f) {
            complete_from_reply(f, msg);
            mpr_future_release(f);
        } else { /* a late reply to a request that timed out */
            settle_orphan_reply(msg);
        }
        mpri_msg_done(msg);
        return;
    }
    MPRI_ASSERT(msg->hdr.kind < MPRI_MSG_KIND_COUNT, "mpri_wire_header_read lets only known kinds through");
    handler_entry_t h = handlers[msg->hdr.kind];
    if (!h.fn) {
        char text[MPR_ERROR_TEXT_MAX];
        snprintf(text, sizeof text, "On %s: no handler for message kind '%s'",
                 mpri_rt.workers[mpri_rt.rank].name, mpri_msg_kind_name(msg->hdr.kind));
        mpri_reply_error(msg, MPR_ERR_UNSUPPORTED, text);
        mpri_msg_done(msg);
        return;
    }
    if (h.run_inline) {
        run_handler(h.fn, msg);
        return;
    }
    if (mpri_pool_submit(run_handler_task, drop_handler_task, msg) != MPR_OK) {
        char text[MPR_ERROR_TEXT_MAX];
        snprintf(text, sizeof text, "On %s: out of memory queueing the request for the worker pool",
                 mpri_rt.workers[mpri_rt.rank].name);
        reject_request(msg, MPR_ERR_NOMEM, text, true);
    }
}
