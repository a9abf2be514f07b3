/* record.c — recording distributed autograd on the call path: send
 * functions on the sender and recv functions on the receiver of every
 * request and reply made inside a context, the context made current on the
 * thread running a callee's function and on mpr_future_then callbacks, and
 * the requires_grad flag of tensors on the wire.
 *
 * Where it plugs in (hooks of the lower layers, installed before mpr_init):
 *  - caller, each outgoing CALL / REMOTE_CALL / RREF_FETCH
 *    (mpri_call_hooks_t.on_send_request): with a current context, the header
 *    gets the context id and a fresh autograd message id, the destination
 *    becomes a worker of the context, and the message's tensors that require
 *    grad get one send function (edges to those tensors) kept in the context
 *    under the message id. Without a current context: nothing, no cost.
 *  - callee (on_request): a request with a context id finds or creates the
 *    context (its sender becomes a worker of it) and makes the received
 *    tensors flagged requires_grad the outputs of one recv function that
 *    remembers (context, message id, sender); enter/leave make the context
 *    current on the thread running the function.
 *  - callee's reply (on_reply): as the caller's request: ids stamped, a send
 *    function for the result's tensors that require grad.
 *  - caller, the reply arriving (mpri_set_reply_value_hook): a recv function
 *    for the reply's flagged tensors, if the context is still alive here (a
 *    reply outliving its context records nothing: pytorch#38513).
 * Recording that fails for want of memory fails the call (an error reply
 * from the callee, a failed future on the caller) rather than handing over a
 * result whose gradients a later backward would silently miss.
 * Sender and receiver agree on which tensors a function covers without a
 * list on the wire: the tensors of the message's tensor list whose
 * descriptor carries the requires_grad bit, in list order.
 *
 * Invariants: a send function has one input per covered tensor, and the
 * recv function of the same message id has one output per covered tensor
 * (the same count: both sides filter the same list by the same flag);
 * enter/leave restore the thread's previous context (LIFO). */
#include <inttypes.h>
#include <stdlib.h>

#include "mpri_assert.h"
#include "mpri_call.h"
#include "mpri_dist.h"
#include "mpri_future.h"
#include "mpri_small_alloc.h"
#include "mpri_tensor.h"

/* ---- send and recv functions ---- */

static mpr_err_t send_backward(mpri_node_t *node, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    for (int i = 0; i < node->n_next; i++) gin[i] = gout[i]; /* passed through to the sent tensors */
    return MPR_OK;
}

static const mpri_op_def_t send_def = {.name = "SendRpcBackward", .backward = send_backward};

mpr_err_t mpri_dist_record_send(mpri_dist_ctx_t *c, mpri_outmsg_t *m, int dst) {
    m->hdr.autograd_context_id = (uint64_t)c->id;
    int k = 0;
    for (uint32_t i = 0; i < m->tensors.len; i++) k += mpri_tensor_wire_requires_grad(m->tensors.orig[i]);
    mpri_node_t *node = NULL;
    if (k) {
        if (!(node = mpri_node_create(&send_def, k, k))) return mpr_last_error_code();
        int j = 0;
        for (uint32_t i = 0; i < m->tensors.len; i++) {
            mpr_tensor_t *t = (mpr_tensor_t *)m->tensors.orig[i];
            if (!mpri_tensor_wire_requires_grad(t)) continue;
            mpri_edge_t edge = mpri_tensor_edge(t);
            if (!edge.node) {
                mpri_node_release(node);
                return mpr_last_error_code() ? mpr_last_error_code()
                                             : mpr_error_set(MPR_ERR_NOMEM, "dist autograd: out of memory");
            }
            mpri_node_set_next(node, j, edge);
            mpri_node_set_input_meta(node, j, t);
            mpri_node_set_output_meta(node, j, t);
            j++;
        }
        MPRI_ASSERT(j == k, "a send function covers every tensor flagged requires_grad");
    }
    pthread_mutex_lock(&c->lock);
    /* The id is drawn under the context's lock: threads sending in one context at
     * once (e.g. callbacks on the pool) then append their send functions in id
     * order, which the context's sorted list of sends requires. */
    uint64_t msg_id = mpri_dist_next_msg_id();
    m->hdr.autograd_message_id = msg_id;
    mpr_err_t e = MPR_OK;
    if (c->ended)
        e = mpr_error_set(MPR_ERR_STATE, "dist autograd context %" PRId64 " was ended (by another thread)", c->id);
    if (!e) e = mpri_dist_ctx_add_worker_locked(c, dst);
    if (!e && node) e = mpri_dist_ctx_add_send_locked(c, msg_id, node);
    pthread_mutex_unlock(&c->lock);
    mpri_node_release(node);
    return e;
}

/* What a recv function remembers: where its gradients go. */
typedef struct mpri_ctx_recv {
    int64_t ctx_id;
    uint64_t msg_id;
    int peer;
} mpri_ctx_recv_t;

static const mpri_op_def_t recv_def = {.name = "RecvRpcBackward",
                                       .backward = mpri_dist_recv_backward,
                                       MPRI_OP_STATE(mpri_ctx_recv_t)};

int64_t mpri_dist_recv_target(mpri_node_t *node, uint64_t *msg_id, int *peer) {
    const mpri_ctx_recv_t *st = MPRI_NODE_STATE(node, mpri_ctx_recv_t);
    *msg_id = st->msg_id;
    *peer = st->peer;
    return st->ctx_id;
}

mpr_err_t mpri_dist_record_recv(mpri_dist_ctx_t *c, mpr_tensor_t *const *tensors, uint32_t n, uint64_t msg_id,
                                int peer) {
    int k = 0;
    for (uint32_t i = 0; i < n; i++) k += mpr_requires_grad(tensors[i]);
    if (!k) return MPR_OK;
    mpri_node_t *node = mpri_node_create(&recv_def, 0, k);
    if (!node) return mpr_last_error_code();
    *MPRI_NODE_STATE(node, mpri_ctx_recv_t) = (mpri_ctx_recv_t){c->id, msg_id, peer};
    mpr_err_t e = MPR_OK;
    int j = 0;
    for (uint32_t i = 0; i < n && !e; i++) {
        if (!mpr_requires_grad(tensors[i])) continue;
        mpri_node_set_output_meta(node, j, tensors[i]);
        e = mpri_tensor_set_grad_fn(tensors[i], node, j++);
    }
    mpri_node_release(node); /* the tensors own it */
    return e;
}

/* ---- the call hooks ---- */

static mpr_err_t on_send_request(mpri_outmsg_t *m, const mpr_value_t *args, int dst_rank) {
    (void)args;
    int64_t id = mpri_dist_current();
    if (!id) return MPR_OK;
    mpri_dist_ctx_t *c = mpri_dist_ctx_find(id);
    if (!c)
        return mpr_error_set(MPR_ERR_STATE,
                             "the thread's current dist autograd context %" PRId64 " was ended; end it on "
                             "this thread too, or begin a new one",
                             id);
    mpr_err_t e = mpri_dist_record_send(c, m, dst_rank);
    mpri_dist_ctx_release(c);
    return e;
}

typedef struct call_state {
    mpri_dist_ctx_t *ctx;
    int src;
    int64_t prev; /* the running thread's context before enter */
} call_state_t;

static mpr_err_t on_request(const mpri_msg_t *msg, const mpr_value_t *args, void **state) {
    (void)args;
    *state = NULL;
    int64_t id = (int64_t)msg->hdr.autograd_context_id;
    if (!id) return MPR_OK;
    call_state_t *s = mpri_small_alloc(sizeof *s);
    if (!s) return mpr_error_set(MPR_ERR_NOMEM, "dist autograd: out of memory");
    if (!(s->ctx = mpri_dist_ctx_get_or_create(id, msg->src))) {
        mpri_small_free(s, sizeof *s);
        /* Ended already (its cleanup overtook this request): a plain call. */
        return mpr_last_error_code() == MPR_ERR_NOT_FOUND ? MPR_OK : mpr_last_error_code();
    }
    s->src = msg->src;
    s->prev = 0;
    mpr_err_t e = mpri_dist_record_recv(s->ctx, msg->tensors, msg->hdr.tensor_count, msg->hdr.autograd_message_id,
                                        msg->src);
    if (e) {
        mpri_dist_ctx_release(s->ctx);
        mpri_small_free(s, sizeof *s);
        return e;
    }
    *state = s;
    return MPR_OK;
}

static void enter(void *state) {
    call_state_t *s = state;
    if (s) s->prev = mpri_dist_swap_current(s->ctx->id);
}

static void leave(void *state) {
    call_state_t *s = state;
    if (s) mpri_dist_swap_current(s->prev);
}

static mpr_err_t on_reply(void *state, mpri_outmsg_t *reply) {
    call_state_t *s = state;
    if (!s) return MPR_OK;
    mpr_err_t e = mpri_dist_record_send(s->ctx, reply, s->src);
    if (e == MPR_ERR_STATE) { /* the caller ended the context meanwhile: plain leaves, nothing to backward */
        reply->hdr.autograd_context_id = 0;
        reply->hdr.autograd_message_id = 0;
        return MPR_OK;
    }
    return e; /* out of memory: an error reply, not a result whose gradients would be lost */
}

static void release(void *state) {
    call_state_t *s = state;
    if (!s) return;
    mpri_dist_ctx_release(s->ctx);
    mpri_small_free(s, sizeof *s);
}

/* The caller side: a reply with autograd ids. */
static mpr_err_t on_reply_value(const mpri_msg_t *msg, mpr_value_t *v) {
    (void)v; /* its tensors are msg->tensors */
    mpri_dist_ctx_t *c = mpri_dist_ctx_find((int64_t)msg->hdr.autograd_context_id);
    if (!c) return MPR_OK; /* the context ended before its reply arrived: nothing to record */
    pthread_mutex_lock(&c->lock);
    bool alive = !c->ended;
    pthread_mutex_unlock(&c->lock);
    /* Out of memory fails the call: a result without its recv function would
     * make a later backward "succeed" without these gradients. */
    mpr_err_t e = alive ? mpri_dist_record_recv(c, msg->tensors, msg->hdr.tensor_count, msg->hdr.autograd_message_id,
                                                msg->src)
                        : MPR_OK;
    mpri_dist_ctx_release(c);
    return e;
}

/* ---- the thread context carried by mpr_future_then ---- */

static uint64_t thread_ctx_current(void) { return (uint64_t)mpri_dist_current(); }

static uint64_t thread_ctx_swap(uint64_t id) { return (uint64_t)mpri_dist_swap_current((int64_t)id); }

/* ---- requires_grad on the wire ---- */

static bool wire_requires_grad(const mpr_tensor_t *t) { return mpr_requires_grad(t); }
static mpr_err_t wire_set_requires_grad(mpr_tensor_t *t) { return mpr_set_requires_grad(t, true); }

static const mpri_tensor_grad_flag_hooks_t grad_flag_hooks = {wire_requires_grad, wire_set_requires_grad};
static const mpri_thread_ctx_hooks_t thread_ctx_hooks = {thread_ctx_current, thread_ctx_swap};

mpr_err_t mpri_dist_record_install(void) {
    mpri_tensor_set_grad_flag_hooks(&grad_flag_hooks);
    mpri_future_set_thread_ctx_hooks(&thread_ctx_hooks);
    mpri_set_reply_value_hook(on_reply_value);
    mpri_call_hooks_t hooks = {on_send_request, on_request, enter, leave, on_reply, release};
    return mpri_call_set_hooks(&hooks);
}
