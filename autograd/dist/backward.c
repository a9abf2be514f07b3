/* backward.c — the backward pass of distributed autograd (FAST mode):
 * mpr_dist_backward on the root, BACKWARD_AUTOGRAD_REQ on the others, the
 * recv function's backward that sends gradients to the worker they came
 * from, and mpr_rref_backward.
 *
 * A pass has an id P (root rank << 48 | counter) and is made of pieces. A
 * piece is one engine run on one worker from gradients for one send function
 * (or, on the root, from its roots), together with the backward requests
 * that run sends. Pieces begin three ways: the root's run; an incoming
 * BACKWARD_AUTOGRAD_REQ; an ANSWER — gradients for one of this worker's send
 * functions that came back inside the reply to one of its requests.
 *
 * STATE MACHINE of a piece (piece_t), all on the one thread that runs it:
 *
 *   RUNNING --run returned, no request sent-------------------> DONE(ok)
 *   RUNNING --run returned, k requests sent--------------------> WAITING
 *   RUNNING --the run failed (a node, the sink, bad input)------> DONE(error)
 *   WAITING --some request answered ok (in the order the replies
 *             arrive): its answers run here as pieces; each such
 *             piece's own requests join this piece's waiting set-> WAITING
 *   WAITING --every request of the set answered ok, answers run-> DONE(ok)
 *   WAITING --a request, or a piece run from an answer, failed--> DONE(error)
 *   DONE: on the root mpr_dist_backward returns the outcome; for a piece
 *         begun by a request the request is answered (BACKWARD_AUTOGRAD_RESP
 *         carrying the piece's answers, or the error as MPR_ERR_REMOTE with
 *         its origin worker kept); for a piece run from an answer, the outcome
 *         is the piece that ran it's (its failure fails that piece).
 *
 *   A piece run from an answer (ANSWER piece) never waits itself: when its
 *   run returns it is DONE, and the requests it sent are adopted by the
 *   WAITING piece that ran it (their answers belong to the same reply chain:
 *   both pieces have the same `answering`). So one thread waits on every
 *   outstanding request of a chain at once and handles whichever reply comes
 *   first: the gradients of micro-batch i go on to the previous stage as
 *   soon as the next stage answered them, while micro-batch i+1 is still
 *   there (a pipeline's backward overlaps across stages).
 *
 *   RUNNING: the recv functions the engine reaches call
 *   mpri_dist_recv_backward (thread-local `running_piece`). Gradients for
 *   the worker whose request the piece (or the piece it was run from, up the
 *   chain of answers) is answering are not sent: they join that request's
 *   answers and travel back in its reply, where the requester — the thread
 *   waiting for that reply — runs them (one message each way instead of a
 *   nested request and its reply). Gradients for any other worker go in a
 *   BACKWARD_AUTOGRAD_REQ added to the piece. `sealed` is set when the run
 *   returns: from then on no request is added.
 *   WAITING: the same thread waits on the piece's requests, any of them
 *   (piece_wait). Meanwhile it runs the backward requests of the same
 *   context that reach this worker (route_backward hands them to the threads
 *   waiting in the context, which are awake and polling, instead of waking a
 *   pool thread) and, on a pool thread, other queued work, so a piece that
 *   needs this worker again cannot starve.
 *
 * What ends a pass: the root's piece reaching DONE. A piece is DONE(ok) only
 * after every request it sent was answered and every answer it got was run
 * to DONE(ok); a request is answered only when the piece it began is DONE;
 * so DONE(ok) at the root means every piece of the pass, on every worker,
 * has finished. After an error the pass ends at once; pieces still running
 * elsewhere finish on their own and their answers are dropped (their
 * pending requests are gone).
 *
 * Messages: BACKWARD_AUTOGRAD_REQ — header: context id and the message id of
 * the send function on the receiver; body: u64 pass id, u8 retain_graph,
 * then the k gradients (k = the send function's outputs) in grad_wire.c's
 * byte layout, naming the message's tensors by index (no value tree).
 * Answered with BACKWARD_AUTOGRAD_RESP: the answers in grad_wire.c's layout
 * (groups of a message id of a send function on the requester and its
 * gradients; none is a count of 0), read by its reply decoder; or an error.
 * A broadcast gradient (sum's: stride-0 dims) travels as its one-row tensor
 * plus the sizes, and a single value (every dim stride-0, on the CPU) as a
 * number: no tensor at all, so the message has no data behind it.
 *
 * A piece run from gradients for a send function whose edges all end at
 * leaves (the usual ANSWER: parameters this worker sent) puts them in the
 * context without a graph task (mpri_engine_sink_passthrough). The root's
 * graph task is freed at the next idle moment (mpri_deferred.h), not
 * before mpr_dist_backward returns.
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
 * Invariants (MPRI_ASSERT): a piece reaches DONE exactly once; no request is
 * added to a sealed piece, except adopted into a WAITING one from a sealed
 * ANSWER piece; requests are taken (absorbed) at most once each; answers are added only to a piece begun by a
 * request and not yet answered; a context's waiters never go below zero and
 * requests are handed to it only while it has one (the last to leave runs
 * what is left); the root's wait ends only in DONE. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "mpri_args.h"
#include "mpri_assert.h"
#include "mpri_deferred.h"
#include "mpri_dist.h"
#include "mpri_engine.h"
#include "mpri_error.h"
#include "mpri_event.h"
#include "mpri_future.h"
#include "mpri_grad_wire.h"
#include "mpri_pool.h"
#include "mpri_small_alloc.h"
#include "mpri_tensor.h"
#include "mpri_trace.h"

#define PASS_BITS 48

typedef struct piece {
    mpri_dist_ctx_t *ctx; /* reference */
    uint64_t pass_id;
    bool retain_graph;
    mpri_msg_t *msg; /* the request that began it (NULL: the root, or run from an answer) */
    /* The piece whose reply carries this one's answers: itself when begun by
     * a request, the running piece's `answering` for one run from an answer,
     * NULL on the root's side. */
    struct piece *answering;
    mpri_grad_answers_t answers; /* when begun by a request: its answers so far (grad_wire.c) */
    bool sealed;          /* the run returned */
    /* DONE, and how: ok, or an error kept in `failure` (a completed future,
     * made only then, so a remote origin travels on), or `fail_code` alone
     * when no future could be made for it (out of memory). */
    bool done;
    mpr_future_t *failure;
    mpr_err_t fail_code;
    /* The requests the run sent (and, when WAITING, those adopted from its
     * ANSWER pieces), waited on by the thread that ran it: reqs[0, n_taken)
     * were answered and absorbed, reqs[n_taken, n_reqs) are outstanding. */
    mpr_future_t **reqs;
    int n_reqs, cap_reqs, n_taken;
    /* While RUNNING from a message's gradients: those decoded tensors (only
     * the message's value and this piece hold them), each given to the
     * context's map without a copy at most once (piece_sink), then NULL. */
    mpr_tensor_t **wire;
    int n_wire;
    /* The run's graph task, kept from the run's end to piece_fini: a piece
     * begun by a request is answered first, then its task is destroyed
     * (the requester does not wait for the node and buffer releases). */
    mpri_graph_task_t *task;
    /* The gradients a run from a send function was fed and that send
     * function (references), likewise released by piece_fini: after the
     * reply, not before it. */
    mpr_tensor_t *held_grads[8];
    int n_held;
    mpri_node_t *held_send;
} piece_t;

static _Thread_local piece_t *running_piece;

static const char *self_name(void) { return mpri_rt.workers[mpri_rt.rank].name; }

static mpr_err_t piece_init(piece_t *p, mpri_dist_ctx_t *ctx, uint64_t pass_id, bool retain_graph, mpri_msg_t *msg,
                            piece_t *answering) {
    *p = (piece_t){.ctx = ctx, .pass_id = pass_id, .retain_graph = retain_graph, .msg = msg};
    p->answering = msg ? p : answering;
    mpri_dist_ctx_retain(ctx);
    return MPR_OK;
}

static void piece_fini(piece_t *p) {
    MPRI_ASSERT(p->done, "a piece is finished only after DONE");
    for (int i = 0; i < p->n_held; i++) mpr_tensor_release(p->held_grads[i]);
    mpri_node_release(p->held_send);
    mpri_graph_task_destroy(p->task);
    for (int i = 0; i < p->n_reqs; i++) mpr_future_release(p->reqs[i]);
    free(p->reqs);
    mpri_grad_answers_fini(&p->answers);
    mpri_dist_ctx_release(p->ctx);
    if (p->failure) mpr_future_release(p->failure);
}

static bool piece_done(const piece_t *p) { return p->done; }

/* MPR_OK for DONE(ok), else the error's code. */
static mpr_err_t piece_error(const piece_t *p) { return p->failure ? mpr_future_error(p->failure) : p->fail_code; }

static void destroy_task(void *task) { mpri_graph_task_destroy(task); }

/* A finished piece's requests, NULL-terminated (the replies they hold, with
 * their messages), released off the caller's path (mpri_defer). */
static void release_requests(void *arg) {
    mpr_future_t **reqs = arg;
    for (mpr_future_t **f = reqs; *f; f++) mpr_future_release(*f);
    free(reqs);
}

static void piece_succeed(piece_t *p) {
    MPRI_ASSERT(!piece_done(p), "a piece reaches DONE exactly once");
    p->done = true;
}

/* DONE(error `code`): the future to complete with the error, or NULL when
 * none could be made (the piece then keeps the code alone). */
static mpr_future_t *piece_failure(piece_t *p, mpr_err_t code) {
    MPRI_ASSERT(!piece_done(p), "a piece reaches DONE exactly once");
    MPRI_ASSERT(code != MPR_OK, "a failed piece has an error code");
    p->done = true;
    p->fail_code = code;
    p->failure = mpr_future_create();
    return p->failure;
}

/* DONE(error) with this worker as the origin (a piece not begun by a request
 * keeps the plain code: the root returns it, a piece run from an answer
 * hands it to the piece that ran it). */
static void piece_fail(piece_t *p, mpr_err_t code, const char *detail) {
    mpr_future_t *f = piece_failure(p, code);
    if (!f) return;
    if (!p->msg) {
        mpr_future_set_error(f, code, detail);
        return;
    }
    mpri_remote_error_t re;
    mpri_remote_error_init(&re, self_name(), mpri_rt.rank, "dist backward", code, detail);
    mpri_future_complete_remote(f, &re);
}

/* The outcome `f` (done) of a request of `p`, or of a piece `p` ran from an
 * answer: true if ok; else `p` is DONE(error), a remote failure keeping its
 * origin (one hop more unless `p` is not begun by a request). */
static bool piece_absorb(piece_t *p, mpr_future_t *f, bool is_request) {
    mpr_err_t e = mpr_future_error(f);
    if (e == MPR_OK) return true;
    const mpri_remote_error_t *passed = mpri_future_remote_error(f);
    if (passed) {
        mpri_remote_error_t re = *passed;
        if (p->msg) mpri_remote_error_pass(&re, self_name(), "dist backward");
        mpr_future_t *failed = piece_failure(p, e);
        if (failed) mpri_future_complete_remote(failed, &re);
        return false;
    }
    const char *why = mpr_future_error_message(f)[0] ? mpr_future_error_message(f) : mpr_strerror(e);
    if (!is_request) {
        piece_fail(p, e, why);
    } else {
        char text[MPR_ERROR_TEXT_MAX];
        snprintf(text, sizeof text, "a backward request of context %" PRId64 " failed: %s", p->ctx->id, why);
        piece_fail(p, e, text);
    }
    return false;
}

/* reqs always has room for a NULL after its last entry (release_requests). */
static mpr_err_t piece_push_request(piece_t *p, mpr_future_t *f) {
    if (p->n_reqs + 1 >= p->cap_reqs) {
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
    return MPR_OK;
}

/* Add request future `f` (new reference, taken) to the running piece: the
 * thread running the piece waits on it when the run returns (piece_wait). */
static mpr_err_t piece_add_request(piece_t *p, mpr_future_t *f) {
    MPRI_ASSERT(!p->sealed, "no request is added to a piece after its run returned");
    return piece_push_request(p, f);
}

/* WAITING `p` adopts the requests of `q`, an ANSWER piece it ran whose run
 * returned (sealed, none of its requests taken); q keeps none. On failure
 * (out of memory) `p` is DONE(error); q's requests are released either way
 * when not adopted (their replies are dropped). */
static void piece_adopt_requests(piece_t *p, piece_t *q) {
    MPRI_ASSERT(p->sealed && !piece_done(p), "only a WAITING piece adopts requests");
    MPRI_ASSERT(q->sealed && !q->msg && q->n_taken == 0 && q->answering == p->answering,
                "requests are adopted only from a sealed ANSWER piece of the same reply chain");
    int i = 0;
    for (; i < q->n_reqs; i++)
        if (piece_push_request(p, q->reqs[i]) != MPR_OK) {
            i++; /* released by piece_push_request */
            piece_fail(p, MPR_ERR_NOMEM, "dist backward: out of memory");
            break;
        }
    for (; i < q->n_reqs; i++) mpr_future_release(q->reqs[i]);
    q->n_reqs = 0;
}

/* ---- running pieces ---- */

/* The engine's sink of a piece: the leaf's gradient into the context; a
 * decoded wire tensor of the piece reaching it unchanged is kept without a
 * copy (once: a second leaf reached by the same tensor gets a copy). */
static mpr_err_t piece_sink(void *arg, mpr_tensor_t *leaf, mpr_tensor_t *grad) {
    piece_t *p = arg;
    int found = -1, seen = 0;
    for (int i = 0; i < p->n_wire; i++)
        if (p->wire[i] == grad) {
            found = i;
            seen++;
        }
    if (seen != 1) return mpri_dist_ctx_accumulate(p->ctx, leaf, grad, false);
    p->wire[found] = NULL;
    return mpri_dist_ctx_accumulate(p->ctx, leaf, grad, true);
}

/* RUNNING: run the engine from `edges` fed with `grads`, then seal. With
 * `send` (the node of every edge, a send function: it passes its gradients
 * through), gradients that only reach leaves go to the sink without a
 * graph task (the usual answer: parameters this worker sent). */
static void piece_run(piece_t *p, int n, const mpri_edge_t *edges, mpr_tensor_t *const *grads, mpri_node_t *send) {
    mpri_engine_opts_t opts = {.retain_graph = true, .sink = piece_sink, .sink_ctx = p};
    mpr_err_t rc = MPR_OK;
    if (send && mpri_engine_sink_passthrough(&opts, send, grads, &rc)) {
        MPRI_ASSERT(!p->task, "a piece runs once");
        p->sealed = true;
        if (rc) {
            char detail[MPR_ERROR_TEXT_MAX];
            snprintf(detail, sizeof detail, "%s", mpr_last_error()[0] ? mpr_last_error() : mpr_strerror(rc));
            piece_fail(p, rc, detail);
        }
        return;
    }
    mpri_graph_task_t *task = mpri_graph_task_create(&opts);
    mpr_err_t e = task ? mpri_graph_task_add_roots(task, n, edges) : mpr_last_error_code();
    piece_t *outer = running_piece; /* a thread may run a piece while it waits in another */
    running_piece = p;
    if (!e) e = mpri_graph_task_run(task, n, edges, grads);
    running_piece = outer;
    char detail[MPR_ERROR_TEXT_MAX];
    if (e) snprintf(detail, sizeof detail, "%s", mpr_last_error()[0] ? mpr_last_error() : mpr_strerror(e));
    MPRI_ASSERT(!p->task, "a piece runs once");
    p->task = task; /* destroyed by piece_fini */
    p->sealed = true;
    if (e) piece_fail(p, e, detail);
}

/* Run `p` (initialized, RUNNING) from the send function `msg_id` of its
 * context fed with the next group of gradients of `rd` (grad_wire.c), until
 * its run returns (the caller waits, or adopts its requests). With `last`
 * the group must end the bytes. Bad input (no such send function, a wrong
 * count, a malformed gradient, trailing bytes) is DONE(error) without a
 * run. */
static void piece_run_send(piece_t *p, uint64_t msg_id, mpri_grads_reader_t *rd, bool last) {
    mpri_dist_ctx_t *c = p->ctx;
    pthread_mutex_lock(&c->lock);
    mpri_node_t *send = mpri_dist_ctx_find_send_locked(c, msg_id);
    pthread_mutex_unlock(&c->lock);
    uint32_t count = 0;
    mpr_err_t e = mpri_grads_read_count(rd, &count);
    int k = send ? send->n_outputs : 0;
    if (!e && !send)
        e = mpr_error_set(MPR_ERR_NOT_FOUND, "context %" PRId64 " has no send function for message %" PRIu64, c->id,
                          msg_id);
    else if (!e && count != (uint32_t)k)
        e = mpr_error_set(MPR_ERR_DECODE, "backward message with %" PRIu32 " gradients for a send function of %d tensors",
                          count, k);
    /* A send function's few gradients: on the stack (no allocation). */
    mpri_edge_t stack_edges[8];
    mpr_tensor_t *stack_gs[8] = {0}, *stack_wire[8];
    bool small = k <= 8;
    mpri_edge_t *edges = small ? stack_edges : NULL;
    mpr_tensor_t **gs = small ? stack_gs : NULL;
    if (!e && !small && (!(edges = calloc((size_t)k, sizeof *edges)) || !(gs = calloc((size_t)k, sizeof *gs))))
        e = mpr_error_set(MPR_ERR_NOMEM, "dist backward: out of memory");
    for (int i = 0; !e && i < k; i++) {
        edges[i] = (mpri_edge_t){send, i};
        e = mpri_grads_read_one(rd, &gs[i]);
    }
    if (!e && last && rd->r.left)
        e = mpr_error_set(MPR_ERR_DECODE, "%zu trailing bytes after the gradients of a backward message", rd->r.left);
    if (e) {
        char text[MPR_ERROR_TEXT_MAX];
        snprintf(text, sizeof text, "%s", mpr_last_error());
        piece_fail(p, e, text);
    } else {
        /* NULL (out of memory): every gradient is copied */
        p->wire = small ? stack_wire : malloc((size_t)k * sizeof *p->wire);
        p->n_wire = p->wire ? k : 0;
        for (int i = 0; i < p->n_wire; i++) p->wire[i] = gs[i];
        piece_run(p, k, edges, gs, send);
        if (p->wire != stack_wire) free(p->wire);
        p->wire = NULL;
        p->n_wire = 0;
    }
    if (small) { /* released by piece_fini, after the reply */
        MPRI_ASSERT(p->n_held == 0 && !p->held_send, "a piece is run from one send function");
        for (int i = 0; i < k; i++) p->held_grads[i] = gs[i];
        p->n_held = k;
        p->held_send = send;
        return;
    }
    for (int i = 0; gs && i < k; i++) mpr_tensor_release(gs[i]);
    free(edges);
    free(gs);
    mpri_node_release(send);
}

/* Run the answers of a reply (grad_wire.c: groups of a message id and its
 * gradients) as ANSWER pieces of WAITING `p`'s pass: each runs to DONE and
 * `p` adopts the requests it sent; the first failure fails `p`. */
static void piece_run_answers(piece_t *p, const mpr_value_t *answers) {
    mpri_grads_reader_t rd;
    mpr_tensor_t *stack[8], **heap = NULL;
    uint32_t n = 0;
    if (mpri_grad_answers_open(answers, &rd, &n, stack, 8, &heap) != MPR_OK) {
        char text[MPR_ERROR_TEXT_MAX];
        snprintf(text, sizeof text, "%s", mpr_last_error());
        piece_fail(p, mpr_last_error_code(), text);
        return;
    }
    for (uint32_t i = 0; i < n && !piece_done(p); i++) {
        uint64_t msg_id = 0;
        if (mpri_grad_answers_next(&rd, &msg_id) != MPR_OK) {
            piece_fail(p, MPR_ERR_DECODE, "malformed answer in a backward reply");
            break;
        }
        piece_t q;
        if (piece_init(&q, p->ctx, p->pass_id, p->retain_graph, NULL, p->answering) != MPR_OK) {
            piece_fail(p, MPR_ERR_NOMEM, "dist backward: out of memory");
            break;
        }
        piece_run_send(&q, msg_id, &rd, i + 1 == n);
        if (!piece_done(&q)) {
            piece_adopt_requests(p, &q);
            piece_succeed(&q);
        } else if (q.failure) {
            piece_absorb(p, q.failure, false);
        } else if (q.fail_code != MPR_OK) { /* failed, and no future could hold the error */
            piece_fail(p, q.fail_code, "dist backward: out of memory");
        }
        piece_fini(&q);
    }
    free(heap);
}

/* ---- handing backward requests to the threads that wait for them ---- */

static void handle_backward(mpri_msg_t *msg);

static bool inbox_ready(void *arg) {
    mpri_dist_ctx_t *c = arg;
    return atomic_load_explicit(&c->bw_inbox_len, memory_order_acquire) > 0;
}

static mpri_msg_t *inbox_take(mpri_dist_ctx_t *c) {
    pthread_mutex_lock(&c->lock);
    mpri_msg_t *m = c->bw_inbox;
    if (m) {
        c->bw_inbox = m->next;
        if (!c->bw_inbox) c->bw_inbox_tail = NULL;
        m->next = NULL;
        atomic_fetch_sub_explicit(&c->bw_inbox_len, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&c->lock);
    return m;
}

static void waiter_enter(mpri_dist_ctx_t *c) {
    pthread_mutex_lock(&c->lock);
    c->bw_waiters++;
    pthread_mutex_unlock(&c->lock);
}

/* The last waiter to leave runs what is still handed to the waiters (or,
 * with `run_left` false, drops it: the pool is stopping), keeping its place
 * while it does, so requests that arrive meanwhile queue behind (the pieces
 * of the context stay one after the other); it leaves when the inbox is
 * empty. After the count dropped to zero nothing more is handed
 * (route_backward checks it under the same lock), so no request is left
 * behind. */
static void waiter_leave_or_drop(mpri_dist_ctx_t *c, bool run_left) {
    for (;;) {
        pthread_mutex_lock(&c->lock);
        MPRI_ASSERT(c->bw_waiters > 0, "a context's backward waiters never go below zero");
        mpri_msg_t *left = NULL;
        if (c->bw_waiters == 1 && c->bw_inbox) {
            left = c->bw_inbox;
            c->bw_inbox = c->bw_inbox_tail = NULL;
            atomic_store_explicit(&c->bw_inbox_len, 0, memory_order_relaxed);
        } else {
            c->bw_waiters--;
        }
        pthread_mutex_unlock(&c->lock);
        if (!left) return;
        while (left) {
            mpri_msg_t *m = left;
            left = m->next;
            m->next = NULL;
            if (run_left)
                mpri_dispatch_run_handler(handle_backward, m); /* traced: the request's handle slice */
            else
                mpri_msg_done(m); /* as a request the stopping pool drops */
        }
    }
}

static void waiter_leave(mpri_dist_ctx_t *c) { waiter_leave_or_drop(c, true); }

/* A backward request given to a pool thread, with the waiter place that
 * route_backward took for it in its context (NULL: none was taken). */
typedef struct {
    mpri_msg_t *msg;
    mpri_dist_ctx_t *ctx; /* reference, with one of ctx->bw_waiters held */
} backward_task_t;

static void run_backward_task(void *arg) {
    backward_task_t *t = arg;
    mpri_dispatch_run_handler(handle_backward, t->msg); /* traced: the request's handle slice */
    if (t->ctx) {
        waiter_leave(t->ctx); /* runs the requests that came meanwhile, in order */
        mpri_dist_ctx_release(t->ctx);
    }
    mpri_small_free(t, sizeof *t);
}

static void drop_backward_task(void *arg) {
    backward_task_t *t = arg;
    mpri_msg_done(t->msg);
    if (t->ctx) {
        waiter_leave_or_drop(t->ctx, false);
        mpri_dist_ctx_release(t->ctx);
    }
    mpri_small_free(t, sizeof *t);
}

/* The handler of BACKWARD_AUTOGRAD_REQ, in the progress context (never
 * blocks). A request for a context some thread of this worker waits in (a
 * root in mpr_dist_backward, a piece waiting for its requests, or a pool
 * thread running a piece of it) is handed to that thread, which runs it
 * when it is free: a waiting one is awake and polling, so it runs at once
 * and no pool thread has to be woken (on a loaded 2-core machine that
 * wake-up took 100 us and more). Otherwise it goes to a pool thread, which
 * holds a waiter place of the context from here on, so the requests that
 * follow queue behind it and run in arrival order on that thread: the
 * pieces of one context run one after the other on a worker, as PyTorch's
 * engine runs a graph task's work on one thread, and the first micro-batch's
 * gradients leave a stage when its piece is done, not when all the
 * micro-batches' pieces, time-sliced against each other, are. */
static void route_backward(mpri_msg_t *msg) {
    if (mpri_observing(MPRI_OBSERVE_TRACE)) mpri_trace_handoff(); /* the arrow goes to where the piece runs */
    mpri_dist_ctx_t *c = mpri_dist_ctx_find((int64_t)msg->hdr.autograd_context_id);
    bool handed = false;
    backward_task_t *t = mpri_small_alloc(sizeof *t);
    if (t) *t = (backward_task_t){.msg = msg, .ctx = NULL};
    if (c) {
        pthread_mutex_lock(&c->lock);
        if (c->bw_waiters > 0) {
            msg->next = NULL;
            if (c->bw_inbox_tail)
                c->bw_inbox_tail->next = msg;
            else
                c->bw_inbox = msg;
            c->bw_inbox_tail = msg;
            atomic_fetch_add_explicit(&c->bw_inbox_len, 1, memory_order_release);
            handed = true;
        } else if (t && !c->ended) {
            c->bw_waiters++; /* the pool task's place */
            mpri_dist_ctx_retain(c);
            t->ctx = c;
        }
        pthread_mutex_unlock(&c->lock);
        mpri_dist_ctx_release(c);
    }
    if (handed) {
        mpri_small_free(t, sizeof *t);
        mpri_event_signal();
        return;
    }
    if (!t || !mpri_pool_running() || mpri_pool_submit(run_backward_task, drop_backward_task, t) != MPR_OK) {
        mpri_reply_error(msg, MPR_ERR_NOMEM, "dist backward: the worker pool cannot take the request");
        mpri_msg_done(msg);
        if (t && t->ctx) {
            waiter_leave_or_drop(t->ctx, false);
            mpri_dist_ctx_release(t->ctx);
        }
        mpri_small_free(t, sizeof *t);
    }
}

/* Move an outstanding request of `p` that is done, if any, to the taken
 * part (reqs[n_taken]) and return it; NULL when none is done yet. */
static mpr_future_t *piece_take_answered(piece_t *p) {
    for (int i = p->n_taken; i < p->n_reqs; i++)
        if (mpr_future_done(p->reqs[i])) {
            mpr_future_t *f = p->reqs[i];
            p->reqs[i] = p->reqs[p->n_taken];
            p->reqs[p->n_taken++] = f;
            return f;
        }
    return NULL;
}

/* What wakes a waiting piece: a request of the context handed to the
 * waiters, or any outstanding request answered. */
static bool piece_wake(void *arg) {
    piece_t *p = arg;
    if (inbox_ready(p->ctx)) return true;
    for (int i = p->n_taken; i < p->n_reqs; i++)
        if (mpr_future_done(p->reqs[i])) return true;
    return false;
}

/* WAITING -> DONE: the thread that ran the piece waits on all its
 * outstanding requests at once and takes their replies in the order they
 * complete, running the answers of each (the requests those send join the
 * set), and meanwhile the backward requests of the same context handed to it
 * (route_backward) and, on a pool thread, other queued work; the first
 * failure ends the piece (the other requests' replies are dropped). No
 * thread hand-off between a reply and the piece. */
static void piece_wait(piece_t *p) {
    MPRI_ASSERT(p->sealed || piece_done(p), "a piece waits only after its run returned");
    if (p->n_reqs == 0) { /* nothing to wait for (a leaf piece): no waiter place */
        if (!piece_done(p)) piece_succeed(p);
        return;
    }
    waiter_enter(p->ctx);
    while (!piece_done(p) && p->n_taken < p->n_reqs) {
        mpr_future_t *f = piece_take_answered(p);
        if (!f) {
            /* bounded by the requests' timeouts */
            mpr_err_t e = mpri_future_wait_or(p->reqs[p->n_taken], MPR_WAIT_FOREVER, piece_wake, p);
            mpri_msg_t *m = inbox_ready(p->ctx) ? inbox_take(p->ctx) : NULL; /* no lock for a reply */
            if (m)
                mpri_dispatch_run_handler(handle_backward, m); /* traced: the request's handle slice */
            else if (e && !piece_wake(p)) { /* the wait failed: the runtime stopped */
                piece_fail(p, MPR_ERR_SHUTDOWN, "the runtime shut down during dist backward");
                break;
            }
            continue;
        }
        MPRI_ASSERT(p->n_taken <= p->n_reqs, "requests are taken at most once each");
        if (!piece_absorb(p, f, true)) break;
        const mpr_value_t *answers = mpri_future_value(f);
        if (mpr_value_kind(answers) == MPR_VALUE_LIST) piece_run_answers(p, answers);
    }
    waiter_leave(p->ctx);
    if (!piece_done(p)) piece_succeed(p);
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
    piece_t *a = p->answering;
    if (a && peer == a->msg->src && (int64_t)a->msg->hdr.autograd_context_id == ctx_id) {
        /* The worker waiting for a's reply: the gradients go back in it. */
        MPRI_ASSERT(!piece_done(a), "answers are added only to a piece not yet answered");
        return mpri_grad_answers_add(&a->answers, msg_id, node->n_outputs, gout);
    }
    mpri_outmsg_t m;
    mpri_outmsg_init(&m, MPRI_MSG_BACKWARD_AUTOGRAD_REQ);
    m.hdr.autograd_context_id = (uint64_t)ctx_id;
    m.hdr.autograd_message_id = msg_id;
    mpri_buf_put_u64(&m.wire, p->pass_id);
    mpri_buf_put_u8(&m.wire, p->retain_graph);
    mpr_err_t e = mpri_grads_write(&m.wire, mpri_grad_tensor_list_add, &m.tensors, node->n_outputs, gout);
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
    mpri_grads_reader_t grads;
    if (mpri_read_u64(&r, &pass_id) || mpri_read_u8(&r, &retain) || retain > 1)
        return refuse(msg, MPR_ERR_DECODE, "malformed backward request");
    if (mpri_msg_tensors(msg, &grads.tensors, &grads.ntensors) != MPR_OK) {
        char why[MPR_ERROR_TEXT_MAX];
        snprintf(why, sizeof why, "%s", mpr_last_error());
        return refuse(msg, mpr_last_error_code(), why);
    }
    grads.r = r;
    mpri_dist_ctx_t *c = mpri_dist_ctx_find(ctx_id);
    char text[MPR_ERROR_TEXT_MAX];
    mpr_err_t e = c ? enter_pass(c, pass_id, retain) : MPR_OK;
    if (!c)
        snprintf(text, sizeof text, "dist autograd context %" PRId64 " is not alive on %s (ended, or never known)",
                 ctx_id, self_name());
    else if (e)
        snprintf(text, sizeof text, "%s", mpr_last_error());
    piece_t p;
    if (c && !e && (e = piece_init(&p, c, pass_id, retain, msg, NULL)) != MPR_OK)
        snprintf(text, sizeof text, "%s", mpr_last_error());
    mpri_dist_ctx_release(c);
    if (!c || e) return refuse(msg, c ? e : MPR_ERR_NOT_FOUND, text);
    bool traced = mpri_observing(MPRI_OBSERVE_TRACE);
    if (traced) mpri_trace_range_begin(MPRI_TCAT_AUTOGRAD, "dist backward (piece)");
    piece_run_send(&p, msg->hdr.autograd_message_id, &grads, true);
    piece_wait(&p);
    if (traced) mpri_trace_range_end();
    /* DONE: answer the request. */
    if (piece_error(&p) == MPR_OK) {
        mpri_outmsg_t reply;
        mpri_reply_begin(msg, MPRI_MSG_BACKWARD_AUTOGRAD_RESP, &reply);
        mpr_err_t we = mpri_grad_answers_write(&p.answers, &reply.wire, &reply.tensors);
        if (we == MPR_OK) {
            mpri_reply_send(msg, &reply);
        } else {
            char why[MPR_ERROR_TEXT_MAX];
            snprintf(why, sizeof why, "dist backward on %s: cannot send the answers: %s", self_name(),
                     mpr_last_error());
            mpri_outmsg_fini(&reply);
            mpri_reply_error(msg, we, why);
        }
    } else if (p.failure) {
        mpri_reply_future_error(msg, p.failure);
    } else {
        mpri_reply_error(msg, p.fail_code, "dist backward: out of memory");
    }
    mpri_msg_done(msg);
    p.msg = NULL;
    piece_fini(&p);
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
    mpri_edge_t stack_edges[4];
    mpr_tensor_t *stack_ones[4] = {0};
    bool small = n <= 4; /* the usual one loss: no allocation */
    mpri_edge_t *edges = small ? stack_edges : calloc((size_t)n, sizeof *edges);
    mpr_tensor_t **ones = small ? stack_ones : calloc((size_t)n, sizeof *ones);
    e = edges && ones ? enter_pass(c, pass_id, retain_graph) : mpr_error_set(MPR_ERR_NOMEM, "mpr_dist_backward: out of memory");
    for (int i = 0; !e && i < n; i++) {
        edges[i] = mpri_tensor_edge(roots[i]);
        const mpr_tensor_t *t = roots[i];
        /* a root is a scalar: one element, contiguous strides */
        ones[i] = mpri_grad_filled(mpr_tensor_device(t), mpr_tensor_dtype(t), mpr_tensor_ndim(t), mpr_tensor_shape(t), NULL, 1.0);
        if (!edges[i].node || !ones[i]) e = mpr_last_error_code() ? mpr_last_error_code() : MPR_ERR_NOMEM;
    }
    piece_t p;
    if (!e && !(e = piece_init(&p, c, pass_id, retain_graph, NULL, NULL))) {
        bool traced = mpri_observing(MPRI_OBSERVE_TRACE);
        if (traced) mpri_trace_range_begin(MPRI_TCAT_AUTOGRAD, "dist backward (root)");
        piece_run(&p, n, edges, ones, NULL);
        piece_wait(&p);
        if (traced) mpri_trace_range_end();
        MPRI_ASSERT(piece_done(&p), "the root's wait ends only in DONE");
        e = piece_error(&p);
        if (e) {
            const mpri_remote_error_t *re = p.failure ? mpri_future_remote_error(p.failure) : NULL;
            if (re)
                mpri_error_set_remote(re);
            else
                mpr_error_set(e, "mpr_dist_backward on %s: %s", self_name(),
                              p.failure && mpr_future_error_message(p.failure)[0] ? mpr_future_error_message(p.failure)
                                                                    : mpr_strerror(e));
        }
        /* The caller's next step need not wait for the graph task's frees,
         * nor for the replies' releases: they run at the next idle moment
         * (mpri_deferred.h). */
        if (p.task) mpri_defer(destroy_task, p.task);
        p.task = NULL;
        if (p.n_reqs > 0) { /* and the answered requests, with the replies they hold */
            MPRI_ASSERT(p.n_reqs < p.cap_reqs, "a piece's requests keep room for their terminator");
            p.reqs[p.n_reqs] = NULL;
            mpri_defer(release_requests, p.reqs);
            p.reqs = NULL;
            p.n_reqs = p.cap_reqs = 0;
        }
        piece_fini(&p);
    }
    for (int i = 0; ones && i < n; i++) mpr_tensor_release(ones[i]);
    if (!small) {
        free(ones);
        free(edges);
    }
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
    mpr_err_t e = mpri_set_handler(MPRI_MSG_BACKWARD_AUTOGRAD_REQ, route_backward, true);
    if (!e) e = mpri_set_reply_decoder(MPRI_MSG_BACKWARD_AUTOGRAD_RESP, mpri_grad_answers_decode);
    if (!e) e = mpr_register_function(RREF_BACKWARD_FN, rref_backward_fn, NULL);
    return e;
}
