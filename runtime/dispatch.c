/* dispatch.c — the handler table and the dispatch of complete incoming
 * messages: a reply completes the future waiting for it, a request goes to
 * the handler installed for its kind (inline on the polling thread, or on the
 * worker pool).
 *
 * Invariants:
 * - A kind's handler is installed once (mpri_set_handler); installing a
 *   different one over it is a bug in the layer above (MPRI_ASSERT).
 * - Every message given to mpri_dispatch is finished exactly once: by its
 *   handler (which calls mpri_msg_done), or here when it is a reply, has no
 *   handler, or cannot be queued.
 * - A reply whose request is no longer pending (timed out, failed) is
 *   dropped: mpri_pending_take hands each future out once.
 * - Dispatch never blocks: it runs in the progress context. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_assert.h"
#include "mpri_error.h"
#include "mpri_future.h"
#include "mpri_pool.h"
#include "mpri_runtime.h"

typedef struct {
    mpri_msg_handler_t fn;
    bool run_inline;
} handler_entry_t;

/* Written before mpr_init (by the layers' init), read afterwards. */
static handler_entry_t handlers[MPRI_MSG_KIND_COUNT];

mpr_err_t mpri_set_handler(int kind, mpri_msg_handler_t fn, bool run_inline) {
    if (kind < 0 || kind >= MPRI_MSG_KIND_COUNT || !fn)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "mpri_set_handler: bad kind %d or NULL handler", kind);
    handler_entry_t *h = &handlers[kind];
    MPRI_ASSERT(!h->fn || (h->fn == fn && h->run_inline == run_inline),
                "a different handler is already installed for this message kind");
    *h = (handler_entry_t){fn, run_inline};
    return MPR_OK;
}

static void (*reply_value_hook)(const mpri_msg_t *msg, mpr_value_t *v);

void mpri_set_reply_value_hook(void (*hook)(const mpri_msg_t *msg, mpr_value_t *v)) { reply_value_hook = hook; }

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
    mpr_err_t e = mpri_msg_decode_value(msg, 0, &v);
    if (e)
        mpri_future_complete(f, e, mpr_last_error(), NULL);
    else {
        if (msg->hdr.autograd_context_id && reply_value_hook) reply_value_hook(msg, v);
        mpri_future_complete(f, MPR_OK, NULL, v);
    }
}

static void run_handler_task(void *arg) {
    mpri_msg_t *msg = arg;
    handlers[msg->hdr.kind].fn(msg);
}

static void drop_handler_task(void *arg) { mpri_msg_done(arg); }

void mpri_dispatch(mpri_msg_t *msg) {
    if (msg->hdr.flags & MPRI_FLAG_RESPONSE) {
        mpr_future_t *f = mpri_pending_take(msg->hdr.request_id);
        if (f) { /* else: a late reply to a request that timed out */
            complete_from_reply(f, msg);
            mpr_future_release(f);
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
        h.fn(msg);
        return;
    }
    if (mpri_pool_submit(run_handler_task, drop_handler_task, msg) != MPR_OK) {
        mpri_reply_error(msg, MPR_ERR_NOMEM, "worker pool queue is full");
        mpri_msg_done(msg);
    }
}
