/* backward.c — the backward pass of distributed autograd (FAST mode):
 * mpr_dist_backward on the root, BACKWARD_AUTOGRAD_REQ on the others, the
 * recv function's backward that sends gradients to the worker they came
 * from, and mpr_rref_backward.
 *
 * A pass has an id P (root rank << 48 | counter) and is made of pieces. A
 * piece is one engine run on one worker — the root's run from its roots, or
 * the run an incoming BACKWARD_AUTOGRAD_REQ starts from the send function it
 * names — together with the backward requests that run sends.
 *
 * STATE MACHINE of a piece (piece_t):
 *
 *   RUNNING --run returned, no request outstanding-----------> DONE(ok)
 *   RUNNING --run returned, k requests outstanding-----------> WAITING
 *   RUNNING --the run failed (a node, the sink)--------------> DONE(error)
 *   WAITING --a request answered ok, others outstanding-----> WAITING
 *   WAITING --the last request answered ok-------------------> DONE(ok)
 *   WAITING --a request answered with an error---------------> DONE(error)
 *   DONE: on the root mpr_dist_backward returns its outcome; elsewhere the
 *         request that began the piece is answered (BACKWARD_AUTOGRAD_RESP,
 *         or the error as MPR_ERR_REMOTE with its origin worker kept).
 *
 *   RUNNING: piece_run on one thread; the recv functions the engine reaches
 *   call mpri_dist_recv_backward, which sends BACKWARD_AUTOGRAD_REQ to the
 *   worker the recv's tensors came from and adds the request to the piece
 *   (thread-local `running_piece`). `sealed` is set when the run returns:
 *   from then on no request is added.
 *   WAITING: the same thread waits on the piece's requests in order
 *   (piece_wait; on a pool thread, other queued work runs meanwhile, so a
 *   piece that needs this worker again cannot starve): no thread hand-off
 *   between a reply and the piece it completes.
 *
 * What ends a pass: the root's piece reaching DONE. A piece is DONE(ok) only
 * after every request it sent was answered, and a request is answered only
 * when the piece it began is DONE, so DONE(ok) at the root means every piece
 * of the pass, on every worker, has finished. After an error the pass ends
 * at once; pieces still running elsewhere finish on their own and their
 * answers are dropped (their pending requests are gone).
 *
 * Messages: BACKWARD_AUTOGRAD_REQ — header: context id and the message id of
 * the send function on the receiver; body: u64 pass id, u8 retain_graph,
 * then a list of k gradient tensors (k = the send function's outputs).
 * Answered with BACKWARD_AUTOGRAD_RESP (no value) or an error.
 *
 * Each piece runs its own graph task over the subgraph its roots reach
 * (dependencies counted from those roots only): backward functions are
 * linear in their incoming gradient, so nodes reached by several pieces
 * run once per piece and the gradients add up to the same sums. A send
 * function whose recv never runs costs nothing and blocks nothing. Pieces
 * keep saved tensors (a later piece of the same pass may need them); they
 * go when the context ends. retain_graph=false is enforced per context and
 * worker: the first pass without it marks the context consumed
 * (consumed_by_pass); any other pass touching it there fails MPR_ERR_STATE.
 *
 * Invariants (MPRI_ASSERT): a piece completes exactly once; `outstanding`
 * never goes below zero; no request is added to a sealed piece; the
 * root's wait ends only in DONE. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "mpri_assert.h"
#include "mpri_args.h"
#include "mpri_dist.h"
#include "mpri_engine.h"
#include "mpri_error.h"
#include "mpri_future.h"

#define PASS_BITS 48

typedef struct piece {
    atomic_long refcount;
    mpri_dist_ctx_t *ctx; /* reference */
    uint64_t pass_id;
    bool retain_graph;
    mpri_msg_t *msg; /* the request that began it (NULL on the root); answered at DONE */
    pthread_mutex_t lock;
    int outstanding;  /* requests sent and not answered */
    bool sealed;      /* the run returned */
    bool done;
    mpr_future_t *result; /* completed at DONE: none, or the error */
    /* The requests the run sent, waited on by the thread that ran it. */
    mpr_future_t **reqs;
    int n_reqs, cap_reqs;
} piece_t;

static _Thread_local piece_t *running_piece;

static const char *self_name(void) { return mpri_rt.workers[mpri_rt.rank].name; }

static piece_t *piece_new(mpri_dist_ctx_t *ctx, uint64_t pass_id, bool retain_graph, mpri_msg_t *msg) {
    piece_t *p = calloc(1, sizeof *p);
    mpr_future_t *result = mpr_future_create();
    if (!p || !result) {
        free(p);
        mpr_future_release(result);
        mpr_error_set(MPR_ERR_NOMEM, "dist backward: out of memory");
        return NULL;
    }
    atomic_init(&p->refcount, 1);
    mpri_dist_ctx_retain(ctx);
    p->ctx = ctx;
    p->pass_id = pass_id;
    p->retain_graph = retain_graph;
    p->msg = msg;
    pthread_mutex_init(&p->lock, NULL);
    p->result = result;
    return p;
}

static void piece_release(piece_t *p) {
    if (atomic_fetch_sub_explicit(&p->refcount, 1, memory_order_acq_rel) != 1) return;
    MPRI_ASSERT(p->done, "a piece is freed only after DONE");
    for (int i = 0; i < p->n_reqs; i++) mpr_future_release(p->reqs[i]);
    free(p->reqs);
    mpri_dist_ctx_release(p->ctx);
    mpr_future_release(p->result);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

/* Move to DONE once (lock held by the caller, released here): false if it
 * was DONE already. */
static bool piece_take_done_locked(piece_t *p) {
    bool first = !p->done;
    p->done = true;
    pthread_mutex_unlock(&p->lock);
    return first;
}

static void piece_succeed(piece_t *p) { mpr_future_set_result(p->result, mpr_value_new_none()); }

/* DONE(error) with this worker as the origin (the root keeps the code). */
static void piece_fail(piece_t *p, mpr_err_t code, const char *detail) {
    pthread_mutex_lock(&p->lock);
    if (!piece_take_done_locked(p)) return;
    if (!p->msg) {
        mpr_future_set_error(p->result, code, detail);
        return;
    }
    mpri_remote_error_t *re = malloc(sizeof *re);
    if (!re) {
        mpr_future_set_error(p->result, MPR_ERR_NOMEM, "dist backward: out of memory");
        return;
    }
    mpri_remote_error_init(re, self_name(), mpri_rt.rank, "dist backward", code, detail);
    mpri_future_complete_remote(p->result, re);
    free(re);
}

/* A request of the piece was answered. */
static void request_answered(mpr_future_t *f, void *arg) {
    piece_t *p = arg;
    mpr_err_t e = mpr_future_error(f);
    pthread_mutex_lock(&p->lock);
    MPRI_ASSERT(p->outstanding > 0, "a piece's outstanding requests never go below zero");
    p->outstanding--;
    bool last = p->outstanding == 0 && p->sealed;
    if (e == MPR_OK && !last) {
        pthread_mutex_unlock(&p->lock);
    } else if (e == MPR_OK) {
        if (piece_take_done_locked(p)) piece_succeed(p);
    } else if (piece_take_done_locked(p)) {
        const mpri_remote_error_t *passed = mpri_future_remote_error(f);
        mpri_remote_error_t *re = passed ? malloc(sizeof *re) : NULL;
        if (re) { /* keep the failing worker as the origin; one hop more unless we are the root */
            *re = *passed;
            if (p->msg) mpri_remote_error_pass(re, self_name(), "dist backward");
            mpri_future_complete_remote(p->result, re);
            free(re);
        } else {
            char text[MPR_ERROR_TEXT_MAX];
            snprintf(text, sizeof text, "a backward request of context %" PRId64 " failed: %s", p->ctx->id,
                     mpr_future_error_message(f) ? mpr_future_error_message(f) : mpr_strerror(e));
            /* not DONE-checked again: build the failure by hand */
            if (!p->msg) {
                mpr_future_set_error(p->result, e, text);
            } else {
                mpri_remote_error_t local;
                mpri_remote_error_init(&local, self_name(), mpri_rt.rank, "dist backward", e, text);
                mpri_future_complete_remote(p->result, &local);
            }
        }
    }
    piece_release(p);
}

/* Add request future `f` (new reference, taken) to the running piece: the
 * thread running the piece waits on it when the run returns (piece_wait). */
static mpr_err_t piece_add_request(piece_t *p, mpr_future_t *f) {
    MPRI_ASSERT(!p->sealed, "no request is added to a piece after its run returned");
    if (p->n_reqs == p->cap_reqs) {
        int cap = p->cap_reqs ? p->cap_reqs * 2 : 8;
        mpr_future_t **r = realloc(p->reqs, (size_t)cap * sizeof *r);
        if (!r) {
            mpr_future_release(f);
            return mpr_error_set(MPR_ERR_NOMEM, "dist backward: out of memory");
        }
        p->reqs = r;
        p->cap_reqs = cap;
    }
    p->reqs[p->n_reqs++] = f;
    pthread_mutex_lock(&p->lock);
    p->outstanding++;
    pthread_mutex_unlock(&p->lock);
    return MPR_OK;
}

/* WAITING: the thread that ran the piece waits on its requests, in order
 * (a pool thread runs other queued work meanwhile, so nested pieces on this
 * worker cannot starve); the first failure ends the piece (the others'
 * answers are dropped). No thread hand-off between a reply and the piece. */
static void piece_wait(piece_t *p) {
    for (int i = 0; i < p->n_reqs && !mpr_future_done(p->result); i++) {
        atomic_fetch_add_explicit(&p->refcount, 1, memory_order_relaxed); /* request_answered drops it */
        mpr_future_wait(p->reqs[i], MPR_WAIT_FOREVER); /* bounded by the request's timeout */
        request_answered(p->reqs[i], p);
    }
    MPRI_ASSERT(mpr_future_done(p->result), "a piece is DONE once every request was answered or one failed");
}

/* RUNNING: run the engine from `edges` fed with `grads`, then seal. */
static void piece_run(piece_t *p, int n, const mpri_edge_t *edges, mpr_tensor_t *const *grads) {
    mpri_engine_opts_t opts = {.retain_graph = true, .sink = mpri_dist_ctx_sink, .sink_ctx = p->ctx};
    mpri_graph_task_t *task = mpri_graph_task_create(&opts);
    mpr_err_t e = task ? mpri_graph_task_add_roots(task, n, edges) : mpr_last_error_code();
    piece_t *outer = running_piece; /* a pool thread may run a piece while it waits in another */
    running_piece = p;
    if (!e) e = mpri_graph_task_run(task, n, edges, grads);
    running_piece = outer;
    char detail[MPR_ERROR_TEXT_MAX];
    if (e) snprintf(detail, sizeof detail, "%s", mpr_last_error()[0] ? mpr_last_error() : mpr_strerror(e));
    mpri_graph_task_destroy(task);
    if (e) piece_fail(p, e, detail);
    pthread_mutex_lock(&p->lock);
    p->sealed = true;
    if (p->outstanding > 0)
        pthread_mutex_unlock(&p->lock); /* WAITING */
    else if (piece_take_done_locked(p))
        piece_succeed(p);
}

/* ---- the recv function's backward: gradients go back to the sender ---- */

mpr_err_t mpri_dist_recv_backward(mpri_node_t *node, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    (void)gin; /* a recv function has no inputs here: its inputs are on the peer */
    uint64_t msg_id;
    int peer;
    int64_t ctx_id = mpri_dist_recv_target(node, &msg_id, &peer);
    piece_t *p = running_piece;
    if (!p)
        return mpr_error_set(MPR_ERR_STATE,
                             "backward reached a tensor received by an RPC in dist autograd context %" PRId64
                             ": run mpr_dist_backward in that context, not mpr_backward",
                             ctx_id);
    mpr_value_t *grads = mpr_value_new_list();
    for (int i = 0; grads && i < node->n_outputs; i++)
        if (mpr_value_list_append(grads, mpr_value_new_tensor(gout[i])) != MPR_OK) {
            mpr_value_release(grads);
            grads = NULL;
        }
    if (!grads) return mpr_last_error_code();
    mpri_outmsg_t m;
    mpri_outmsg_init(&m, MPRI_MSG_BACKWARD_AUTOGRAD_REQ);
    m.hdr.autograd_context_id = (uint64_t)ctx_id;
    m.hdr.autograd_message_id = msg_id;
    mpri_buf_put_u64(&m.wire, p->pass_id);
    mpri_buf_put_u8(&m.wire, p->retain_graph);
    mpr_err_t e = mpri_value_encode(grads, &m.wire, &m.tensors, peer);
    mpr_value_release(grads);
    if (e) {
        mpri_outmsg_fini(&m);
        return e;
    }
    mpr_future_t *f = mpri_request(peer, &m, MPR_TIMEOUT_DEFAULT, "dist backward");
    if (!f) return mpr_last_error_code();
    return piece_add_request(p, f);
}

/* ---- a pass reaching this worker ---- */

/* Mark the context used by pass `pass_id` (lock taken here): an error if a
 * pass without retain_graph consumed it already. */
static mpr_err_t enter_pass(mpri_dist_ctx_t *c, uint64_t pass_id, bool retain_graph) {
    pthread_mutex_lock(&c->lock);
    mpr_err_t e = MPR_OK;
    if (c->ended)
        e = mpr_error_set(MPR_ERR_NOT_FOUND, "dist autograd context %" PRId64 " was ended", c->id);
    else if (c->consumed_by_pass && c->consumed_by_pass != pass_id)
        e = mpr_error_set(MPR_ERR_STATE,
                          "dist backward: the graph of context %" PRId64
                          " was already used by a backward pass without retain_graph; pass "
                          "retain_graph=true to the first to run backward again",
                          c->id);
    else if (!retain_graph)
        c->consumed_by_pass = pass_id;
    pthread_mutex_unlock(&c->lock);
    return e;
}

/* DONE on a worker that is not the root: answer the request. */
static void answer_request(mpr_future_t *result, void *arg) {
    piece_t *p = arg;
    if (mpr_future_error(result) == MPR_OK)
        mpri_reply_value(p->msg, MPRI_MSG_BACKWARD_AUTOGRAD_RESP, NULL);
    else
        mpri_reply_future_error(p->msg, result);
    mpri_msg_done(p->msg);
    p->msg = NULL;
    piece_release(p);
}

/* Answer `msg` with a failure of this worker before any piece began. */
static void refuse(mpri_msg_t *msg, mpr_err_t code, const char *detail) {
    mpri_remote_error_t re;
    mpri_remote_error_init(&re, self_name(), mpri_rt.rank, "dist backward", code, detail);
    mpr_future_t *f = mpr_future_create();
    if (f && mpri_future_complete_remote(f, &re) == MPR_OK)
        mpri_reply_future_error(msg, f);
    else
        mpri_reply_error(msg, MPR_ERR_NOMEM, "dist backward: out of memory");
    mpr_future_release(f);
    mpri_msg_done(msg);
}

static void handle_backward(mpri_msg_t *msg) {
    int64_t ctx_id = (int64_t)msg->hdr.autograd_context_id;
    mpri_reader_t r;
    mpri_reader_init(&r, msg->body, msg->hdr.body_len);
    uint64_t pass_id = 0;
    uint8_t retain = 0;
    mpr_value_t *grads = NULL;
    if (mpri_read_u64(&r, &pass_id) || mpri_read_u8(&r, &retain) || retain > 1 ||
        mpri_msg_decode_value(msg, 9, &grads) != MPR_OK)
        return refuse(msg, MPR_ERR_DECODE, "malformed backward request");
    mpri_dist_ctx_t *c = mpri_dist_ctx_find(ctx_id);
    char text[MPR_ERROR_TEXT_MAX];
    if (!c) {
        mpr_value_release(grads);
        snprintf(text, sizeof text, "dist autograd context %" PRId64 " is not alive on %s (ended, or never known)",
                 ctx_id, self_name());
        return refuse(msg, MPR_ERR_NOT_FOUND, text);
    }
    mpri_node_t *send = NULL;
    mpr_err_t e = enter_pass(c, pass_id, retain);
    if (!e) {
        pthread_mutex_lock(&c->lock);
        send = mpri_dist_ctx_find_send_locked(c, msg->hdr.autograd_message_id);
        pthread_mutex_unlock(&c->lock);
        if (!send)
            e = mpr_error_set(MPR_ERR_NOT_FOUND, "context %" PRId64 " has no send function for message %" PRIu64,
                              ctx_id, msg->hdr.autograd_message_id);
    }
    int k = send ? send->n_outputs : 0;
    if (!e && (mpr_value_kind(grads) != MPR_VALUE_LIST || (int)mpr_value_list_len(grads) != k))
        e = mpr_error_set(MPR_ERR_DECODE, "backward request with %zu gradients for a send function of %d tensors",
                          mpr_value_list_len(grads), k);
    mpri_edge_t *edges = NULL;
    mpr_tensor_t **gs = NULL;
    if (!e && (!(edges = calloc((size_t)k, sizeof *edges)) || !(gs = calloc((size_t)k, sizeof *gs))))
        e = mpr_error_set(MPR_ERR_NOMEM, "dist backward: out of memory");
    for (int i = 0; !e && i < k; i++) {
        edges[i] = (mpri_edge_t){send, i};
        e = mpr_value_get_tensor(mpr_value_list_get(grads, (size_t)i), &gs[i]);
    }
    piece_t *p = e ? NULL : piece_new(c, pass_id, retain, msg);
    if (!p) {
        snprintf(text, sizeof text, "%s", mpr_last_error());
        if (!e) e = mpr_last_error_code();
    }
    if (p) {
        piece_run(p, k, edges, gs);
        piece_wait(p);
        answer_request(p->result, p); /* DONE: the piece's reference moves to it */
    }
    free(edges);
    free(gs);
    mpri_node_release(send);
    mpr_value_release(grads);
    mpri_dist_ctx_release(c);
    if (!p) refuse(msg, e, text);
}

/* ---- the root ---- */

mpr_err_t mpr_dist_backward(int64_t ctx_id, mpr_tensor_t *const *roots, int n, bool retain_graph) {
    MPRI_ARG_NONNULL(roots);
    mpr_err_t e = mpri_check_running("mpr_dist_backward");
    if (e) return e;
    if (n < 1) return mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_dist_backward: %d roots (needs at least one)", n);
    for (int i = 0; i < n; i++) {
        if (!roots[i]) return mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_dist_backward: root %d is NULL", i);
        if (!mpr_requires_grad(roots[i]))
            return mpr_error_set(MPR_ERR_STATE, "mpr_dist_backward: root %d does not require grad", i);
        if (mpr_tensor_numel(roots[i]) != 1)
            return mpr_error_set(MPR_ERR_SHAPE, "mpr_dist_backward: root %d is not a scalar (%" PRId64 " elements)", i,
                                 mpr_tensor_numel(roots[i]));
    }
    mpri_dist_ctx_t *c = mpri_dist_ctx_find(ctx_id);
    if (!c)
        return mpr_error_set(MPR_ERR_NOT_FOUND,
                             "mpr_dist_backward: dist autograd context %" PRId64
                             " is not alive on %s (never known here, or ended)",
                             ctx_id, self_name());
    pthread_mutex_lock(&c->lock);
    uint64_t pass_id = ((uint64_t)mpri_rt.rank << PASS_BITS) | ++c->passes_begun;
    pthread_mutex_unlock(&c->lock);
    mpri_edge_t *edges = calloc((size_t)n, sizeof *edges);
    mpr_tensor_t **ones = calloc((size_t)n, sizeof *ones);
    piece_t *p = NULL;
    e = edges && ones ? enter_pass(c, pass_id, retain_graph) : mpr_error_set(MPR_ERR_NOMEM, "mpr_dist_backward: out of memory");
    for (int i = 0; !e && i < n; i++) {
        edges[i] = mpri_tensor_edge(roots[i]);
        const mpr_tensor_t *t = roots[i];
        mpr_scope_begin(); /* ours to release, whether or not the caller has a scope open */
        ones[i] = mpr_scope_keep(
            mpri_full_on(mpr_tensor_device(t), mpr_tensor_dtype(t), mpr_tensor_ndim(t), mpr_tensor_shape(t), 1.0));
        mpr_scope_end();
        if (!edges[i].node || !ones[i]) e = mpr_last_error_code() ? mpr_last_error_code() : MPR_ERR_NOMEM;
    }
    if (!e && !(p = piece_new(c, pass_id, retain_graph, NULL))) e = mpr_last_error_code();
    if (!e) {
        piece_run(p, n, edges, ones);
        piece_wait(p);
        e = mpr_future_wait(p->result, MPR_WAIT_FOREVER);
        MPRI_ASSERT(e != MPR_OK || mpr_future_done(p->result), "the root's wait ends only in DONE");
        if (!e) e = mpr_future_error(p->result);
        if (e) {
            const mpri_remote_error_t *re = mpri_future_remote_error(p->result);
            if (re)
                mpri_error_set_remote(re);
            else
                mpr_error_set(e, "mpr_dist_backward on %s: %s", self_name(),
                              mpr_future_error_message(p->result) ? mpr_future_error_message(p->result)
                                                                  : mpr_strerror(e));
        }
        piece_release(p);
    }
    for (int i = 0; ones && i < n; i++) mpr_tensor_release(ones[i]);
    free(ones);
    free(edges);
    mpri_dist_ctx_release(c);
    return e;
}

/* ---- RRef.backward ---- */

#define RREF_BACKWARD_FN "mpirpc.dist_autograd.rref_backward"

static mpr_err_t rref_backward_local(mpr_rref_t *rref, int64_t ctx_id, bool retain_graph) {
    mpr_value_t *v = NULL;
    mpr_tensor_t *t = NULL;
    mpr_err_t e = mpr_rref_local_value(rref, &v);
    if (!e && (e = mpr_value_get_tensor(v, &t)))
        mpr_error_set(e, "mpr_rref_backward: the RRef's value is not a tensor");
    if (!e) e = mpr_dist_backward(ctx_id, &t, 1, retain_graph);
    mpr_value_release(v);
    return e;
}

/* On the owner: args [rref, ctx id, retain_graph]. */
static mpr_err_t rref_backward_fn(mpr_call_ctx_t *call, const mpr_value_t *args, mpr_value_t **result) {
    (void)call;
    mpr_rref_t *rref = NULL;
    int64_t ctx_id = 0;
    bool retain = false;
    mpr_err_t e;
    if ((e = mpr_args_rref(args, 0, &rref)) || (e = mpr_value_get_int(mpr_value_list_get(args, 1), &ctx_id)) ||
        (e = mpr_value_get_bool(mpr_value_list_get(args, 2), &retain)))
        return e;
    if ((e = rref_backward_local(rref, ctx_id, retain))) return e;
    *result = mpr_value_new_none();
    return *result ? MPR_OK : mpr_last_error_code();
}

mpr_err_t mpr_rref_backward(mpr_rref_t *rref, int64_t ctx_id, bool retain_graph) {
    MPRI_ARG_NONNULL(rref);
    if (mpr_rref_is_owner(rref)) return rref_backward_local(rref, ctx_id, retain_graph);
    mpr_value_t *args = mpr_value_new_list();
    if (!args || mpr_value_list_append(args, mpr_value_new_rref(rref)) ||
        mpr_value_list_append(args, mpr_value_new_int(ctx_id)) ||
        mpr_value_list_append(args, mpr_value_new_bool(retain_graph))) {
        mpr_value_release(args);
        return mpr_last_error_code();
    }
    mpr_worker_info_t owner;
    mpr_value_t *res = NULL;
    mpr_err_t e = mpr_rref_owner(rref, &owner);
    if (!e) e = mpr_rpc_sync(mpr_to_worker(&owner), RREF_BACKWARD_FN, args, MPR_TIMEOUT_DEFAULT, &res);
    mpr_value_release(res);
    mpr_value_release(args);
    return e;
}

mpr_err_t mpri_dist_backward_install(void) {
    mpr_err_t e = mpri_set_handler(MPRI_MSG_BACKWARD_AUTOGRAD_REQ, handle_backward, false);
    if (!e) e = mpr_register_function(RREF_BACKWARD_FN, rref_backward_fn, NULL);
    return e;
}
