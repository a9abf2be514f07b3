/* rref_proto.c — the RRef control messages and the RRef value codec hooks
 * (REMOTE_CALL, which runs a function, is a kind of call: remote_call.c).
 *
 * Wire forms (bodies; gid = u32 creator rank + u64 counter):
 *   RREF_FETCH   gid rref id; reply RREF_FETCH_RET: the value     inline handler
 *                (inside a dist autograd context: the call hooks record
 *                the request and the reply, as for a CALL)
 *   RREF_FORK_REQUEST  gid rref id, gid fork id; one-way          inline handler
 *   RREF_USER_DELETE   gid rref id, gid fork id; one-way          inline handler
 *   RREF_ACK           u8 what (0 delete, 1 fork), gid fork id: the owner's
 *                      one-way answer to either                   inline handler
 *   RREF_CHILD_ACCEPT  gid fork id; one-way                       inline handler
 *   RRef value   gid rref id, i32 owner rank, gid fork id (the parent is the sender)
 *
 * Encoding an RRef value forks it (PyTorch prepareChildFork): the owner adds
 * the fork to its set at once; a user keeps itself alive as the parent of a
 * pending child. Decoding it (notifyOwnerAndParentOfFork): on the owner, the
 * owner handle is returned and the parent gets CHILD_ACCEPT (or, when the
 * owner sent it to itself, the fork is dropped again); on a user whose parent
 * is the owner, the user is confirmed at once; otherwise the new user is
 * pending, asks the owner with FORK_REQUEST, and on the ack is confirmed and
 * sends CHILD_ACCEPT to its parent. A fork that arrives but never becomes a
 * handle (out of memory making it, or its message's decode failed before
 * it: the codec's `settle` hook) is undone as releasing the handle would
 * have (settle_fork), so it never pins its OwnerRRef or a parent. An
 * encode records its fork in the journal (below) before it makes it, so a
 * message that never leaves takes every fork back. Every control message is answered or
 * consumed inline: none of them ever waits for, or occupies, a pool thread.
 *
 * Layering: this file sits above the RRef context (rref_context.c, which
 * keeps the owner records, handles and their states) and is the only part of
 * the RRef layer that sends. The context reaches back only through the
 * USER_DELETE sender registered here at install (mpri_rref_set_delete_sender).
 *
 * Invariants: the control handlers (fetch, fork request, user delete, child
 * accept) run on the progress thread and never block: a fetch of a value not
 * yet created parks the request on the value future; every handled message
 * is passed to mpri_msg_done exactly once, after its reply. A request
 * handler decoding RRefs runs its user function only once they are ready
 * (users confirmed, owner values created), as a continuation: it brackets
 * the decode with mpri_rref_record_begin/end (call.c does). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "mpri_assert.h"
#include "mpri_call.h"
#include "mpri_error.h"
#include "mpri_future.h"
#include "mpri_rref.h"
#include "mpri_rref_proto.h"
#include "mpri_runtime.h"
#include "mpri_value.h"

#define CTX mpri_rref_ctx

static const char *self_name(void) { return mpri_rt.workers ? mpri_rt.workers[mpri_rt.rank].name : "?"; }

static bool runtime_alive(void) {
    int s = mpri_state();
    return s == MPRI_RUNNING || s == MPRI_STOPPING;
}

/* ---- control messages out ----
 * USER_DELETE and FORK_REQUEST are one-way; the owner answers each with a
 * one-way RREF_ACK handled inline, so no future, pending-request entry or
 * pool task is spent on them. Graceful shutdown waits for the acks. */

static mpr_err_t send_control(int dst, int kind, mpri_gid_t id, mpri_gid_t fork) {
    mpri_outmsg_t m;
    mpri_outmsg_init(&m, kind);
    mpri_gid_put(&m.wire, id);
    mpri_gid_put(&m.wire, fork);
    return mpri_send(dst, &m);
}

static void send_user_delete(int owner_rank, mpri_gid_t id, mpri_gid_t fork) {
    if (!runtime_alive() || mpri_peer_gone(owner_rank)) return; /* no owner left to tell */
    atomic_fetch_add(&CTX.unacked_ctrl_msgs, 1);
    if (send_control(owner_rank, MPRI_MSG_RREF_USER_DELETE, id, fork) != MPR_OK) {
        atomic_fetch_sub(&CTX.unacked_ctrl_msgs, 1);
        fprintf(stderr, "mpirpc: %s: RRef user delete to rank %d failed: %s\n", self_name(), owner_rank,
                mpr_last_error());
    }
}

void mpri_rref_send_fork_request(mpr_rref_t *user, int parent) {
    if (!runtime_alive() || !mpri_rref_add_fork_wait(mpr_rref_retain(user), parent)) {
        if (runtime_alive()) mpr_rref_release(user);
        mpri_rref_user_fail(user, runtime_alive() ? MPR_ERR_NOMEM : MPR_ERR_SHUTDOWN,
                            "RRef fork request: cannot be sent");
        mpri_rref_send_child_accept(parent, user->fork);
        return;
    }
    atomic_fetch_add(&CTX.unacked_ctrl_msgs, 1);
    if (send_control(user->owner_rank, MPRI_MSG_RREF_FORK_REQUEST, user->id, user->fork) != MPR_OK) {
        char text[MPR_ERROR_TEXT_MAX];
        snprintf(text, sizeof text, "RRef fork request to %s failed: %s", user->owner_name, mpr_last_error());
        mpr_rref_t *w = mpri_rref_take_fork_wait(user->fork, NULL);
        if (w) {
            mpri_rref_user_fail(w, MPR_ERR_MPI, text);
            mpri_rref_send_child_accept(parent, w->fork);
            atomic_fetch_sub(&CTX.unacked_ctrl_msgs, 1);
            mpr_rref_release(w);
        }
    }
}

enum { ACK_DELETE = 0, ACK_FORK = 1 };

static void send_ack(int dst, uint8_t what, mpri_gid_t fork) {
    mpri_outmsg_t m;
    mpri_outmsg_init(&m, MPRI_MSG_RREF_ACK);
    mpri_buf_put_u8(&m.wire, what);
    mpri_gid_put(&m.wire, fork);
    mpri_send(dst, &m);
}

void mpri_rref_send_child_accept(int parent, mpri_gid_t fork) {
    if (!runtime_alive()) return;
    mpri_outmsg_t m;
    mpri_outmsg_init(&m, MPRI_MSG_RREF_CHILD_ACCEPT);
    mpri_gid_put(&m.wire, fork);
    mpri_send(parent, &m);
}

/* ---- thread-local recording of RRefs decoded while handling a request ---- */

static _Thread_local struct {
    bool on;
    mpr_future_t **items;
    size_t n, cap;
} rec;

void mpri_rref_record_begin(void) {
    rec.on = true;
    rec.n = 0;
}

void mpri_rref_record_ready_future(mpr_future_t *f) {
    if (!rec.on || !f || mpr_future_done(f)) return;
    if (rec.n == rec.cap) {
        size_t cap = rec.cap ? rec.cap * 2 : 8;
        mpr_future_t **items = realloc(rec.items, cap * sizeof *items);
        if (!items) return; /* best effort: the call then runs without waiting */
        rec.items = items;
        rec.cap = cap;
    }
    rec.items[rec.n++] = mpr_future_retain(f);
}

typedef struct {
    atomic_long left;
    mpr_future_t *done;
} gate_t;

static void gate_arrive(mpr_future_t *f, void *arg) {
    gate_t *g = arg;
    mpr_future_release(f);
    if (atomic_fetch_sub(&g->left, 1) != 1) return;
    mpri_future_complete(g->done, MPR_OK, NULL, NULL); /* continuations go to the pool */
    mpr_future_release(g->done);
    free(g);
}

mpr_future_t *mpri_rref_record_end(void) {
    rec.on = false;
    size_t n = rec.n;
    rec.n = 0;
    size_t pending = 0;
    if (!rec.items) return NULL;
    for (size_t i = 0; i < n; i++) {
        if (mpr_future_done(rec.items[i])) {
            mpr_future_release(rec.items[i]);
            continue;
        }
        rec.items[pending++] = rec.items[i];
    }
    /* The buffer is freed every time: a thread-local pointer would leak when
     * the thread exits. */
    mpr_future_t **items = rec.items;
    rec.items = NULL;
    rec.cap = 0;
    if (pending == 0) {
        free(items);
        return NULL;
    }
    gate_t *g = malloc(sizeof *g);
    mpr_future_t *done = mpr_future_create();
    if (!g || !done) { /* best effort: run without waiting */
        free(g);
        mpr_future_release(done);
        for (size_t i = 0; i < pending; i++) mpr_future_release(items[i]);
        free(items);
        return NULL;
    }
    atomic_init(&g->left, (long)pending + 1);
    g->done = mpr_future_retain(done);
    for (size_t i = 0; i < pending; i++)
        if (mpri_future_on_complete(items[i], gate_arrive, g) != MPR_OK) gate_arrive(items[i], g);
    free(items);
    gate_arrive(mpr_future_retain(done), g); /* the extra count */
    return done;
}

/* ---- encode journal: forks of a message that never leaves are undone ----
 * A thread's journal lists the forks its open brackets registered, oldest
 * first; a bracket owns the entries from its mark on. Closing it with
 * ok == false undoes and drops them (the message they were written into
 * will never reach anyone); with ok == true they stay for the enclosing
 * bracket, and the outermost one drops them for good. Invariant: depth 0
 * <=> no entry (MPRI_ASSERT). */

typedef struct {
    mpr_rref_t *r;
    mpri_gid_t fork;
} journal_ent_t;

static _Thread_local struct {
    int depth;
    journal_ent_t *items;
    size_t n, cap;
} jr;

size_t mpri_rref_encode_begin(void) {
    MPRI_ASSERT(jr.depth > 0 || jr.n == 0, "an RRef encode journal is empty outside every bracket");
    jr.depth++;
    return jr.n;
}

void mpri_rref_encode_end(size_t mark, bool ok) {
    MPRI_ASSERT(jr.depth > 0 && mark <= jr.n, "encode brackets close in the order they opened");
    jr.depth--;
    if (ok && jr.depth > 0) return; /* the enclosing bracket decides */
    for (size_t i = mark; i < jr.n; i++) {
        journal_ent_t *j = &jr.items[i];
        if (!ok) { /* the message will never be sent: take the fork back */
            if (j->r->is_owner)
                mpri_owner_del_fork(j->r->id, j->fork);
            else
                mpr_rref_release(mpri_rref_take_pending_child(j->fork));
        }
        mpr_rref_release(j->r);
    }
    jr.n = mark;
    if (jr.depth == 0) {
        free(jr.items);
        jr.items = NULL;
        jr.cap = 0;
    }
}

/* Room for one more entry, made before the fork it will record: a fork
 * that could not be journaled would outlive a message that never left. */
static mpr_err_t journal_reserve(void) {
    if (jr.depth == 0 || jr.n < jr.cap) return MPR_OK;
    size_t cap = jr.cap ? jr.cap * 2 : 4;
    journal_ent_t *items = realloc(jr.items, cap * sizeof *items);
    if (!items) return mpr_error_set(MPR_ERR_NOMEM, "sending an RRef: out of memory");
    jr.items = items;
    jr.cap = cap;
    return MPR_OK;
}

static void journal_add(mpr_rref_t *r, mpri_gid_t fork) {
    if (jr.depth == 0) return;
    MPRI_ASSERT(jr.n < jr.cap, "journal_reserve made room before the fork");
    jr.items[jr.n++] = (journal_ent_t){mpr_rref_retain(r), fork};
}

/* ---- RRef value codec hooks ---- */

static void rref_retain_hook(void *p) { mpr_rref_retain(p); }
static void rref_release_hook(void *p) { mpr_rref_release(p); }

static mpr_err_t rref_encode(void *p, mpri_buf_t *out, int dst_rank) {
    mpr_rref_t *r = p;
    mpr_err_t e = mpri_rref_check(r, "sending an RRef");
    if (e) return e;
    if (!runtime_alive()) return mpr_error_set(MPR_ERR_SHUTDOWN, "sending an RRef: the runtime is shut down");
    if (!r->is_owner) {
        pthread_mutex_lock(&CTX.lock);
        bool deleted = r->deleted, failed = r->state == USER_FAILED;
        pthread_mutex_unlock(&CTX.lock);
        if (failed) {
            char text[MPR_ERROR_TEXT_MAX];
            mpri_rref_user_error(r);
            snprintf(text, sizeof text, "%s", mpr_last_error());
            return mpr_error_set(mpr_last_error_code(), "cannot send RRef(%u:%llu): its creation on %s failed: %s",
                                 r->id.rank, (unsigned long long)r->id.seq, r->owner_name, text);
        }
        if (deleted)
            return mpr_error_set(MPR_ERR_SHUTDOWN, "cannot send RRef(%u:%llu): it was deleted by shutdown",
                                 r->id.rank, (unsigned long long)r->id.seq);
    }
    if ((e = journal_reserve())) return e;
    mpri_gid_t fork = mpri_gid_new();
    if (r->is_owner) {
        if (!mpri_owner_add_fork(r->owner, fork)) return mpr_last_error_code(); /* early fork registration */
    } else {
        if ((e = mpri_rref_add_pending_child(fork, mpr_rref_retain(r)))) { /* G2: kept until CHILD_ACCEPT */
            mpr_rref_release(r);
            return e;
        }
    }
    journal_add(r, fork);
    mpri_gid_put(out, r->id);
    int32_t owner = r->owner_rank;
    mpri_buf_put(out, &owner, 4);
    mpri_gid_put(out, fork);
    return MPR_OK;
}

static mpr_err_t read_wire_form(mpri_reader_t *in, mpri_gid_t *id, int32_t *owner, mpri_gid_t *fork) {
    mpr_err_t e;
    if ((e = mpri_gid_read(in, id)) || (e = mpri_read(in, owner, 4)) || (e = mpri_gid_read(in, fork))) return e;
    if (*owner < 0 || *owner >= mpri_rt.size)
        return mpr_error_set(MPR_ERR_DECODE, "RRef owner rank %d outside [0, %d)", *owner, mpri_rt.size);
    return MPR_OK;
}

/* A fork that arrived but gets no handle (out of memory making it, or its
 * message dropped before it was decoded) is undone as releasing its handle
 * would have: the owner forgets it, a parent keeping itself alive for it
 * (G2) is let go. Best effort: the messages it sends may fail too. */
static void settle_fork(mpri_gid_t id, int owner, mpri_gid_t fork, int parent) {
    int self = mpri_rt.rank;
    mpri_error_saved_t saved; /* the caller reports its own failure */
    mpri_error_save(&saved);
    if (owner == self && parent == self)
        mpri_owner_del_fork(id, fork); /* added at encode, on this worker */
    else if (owner == self)
        mpri_rref_send_child_accept(parent, fork); /* phantom fork: never in the fork set */
    else if (parent == owner)
        send_user_delete(owner, id, fork); /* the owner added it at encode */
    else
        mpri_rref_send_child_accept(parent, fork); /* the owner never heard of it */
    mpri_error_restore(&saved);
}

static mpr_err_t rref_settle(mpri_reader_t *in, int src_rank, bool undo) {
    mpri_gid_t id, fork;
    int32_t owner;
    mpr_err_t e = read_wire_form(in, &id, &owner, &fork);
    if (e == MPR_OK && undo) settle_fork(id, owner, fork, src_rank);
    return e;
}

static mpr_err_t rref_decode(mpri_reader_t *in, int src_rank, void **out) {
    mpri_gid_t id, fork;
    int32_t owner;
    mpr_err_t e = read_wire_form(in, &id, &owner, &fork);
    if (e) return e;
    int self = mpri_rt.rank, parent = src_rank;
    mpr_rref_t *r;
    if (owner == self) {
        mpri_owner_t *o = mpri_owner_get_or_create(id);
        r = o ? mpri_rref_new_owner_handle(o) : NULL;
        if (o) mpri_owner_release(o);
        if (!r) {
            e = mpr_last_error_code();
            settle_fork(id, owner, fork, parent);
            return e;
        }
        if (parent == self)
            mpri_owner_del_fork(id, fork); /* sent to ourselves: the fork added at encode goes */
        else
            mpri_rref_send_child_accept(parent, fork); /* phantom fork: never in the fork set */
        mpri_rref_record_ready_future(r->owner->value);
    } else {
        r = mpri_rref_new_user(id, owner, fork, parent == owner ? USER_CONFIRMED : USER_PENDING);
        if (!r) {
            e = mpr_last_error_code();
            settle_fork(id, owner, fork, parent);
            return e;
        }
    }
    if (owner != self && parent != owner) {
        mpri_rref_record_ready_future(r->ready);
        mpri_rref_send_fork_request(r, parent);
    }
    *out = r;
    return MPR_OK;
}

static const mpri_opaque_value_ops_t rref_ops = {rref_retain_hook, rref_release_hook, rref_encode, rref_decode,
                                                 mpri_rref_encode_begin, mpri_rref_encode_end, rref_settle};

/* ---- handlers ---- */

static void reply_decode_error(mpri_msg_t *msg, const char *what) {
    char text[MPR_ERROR_TEXT_MAX];
    snprintf(text, sizeof text, "On %s: malformed %s: %s", self_name(), what, mpr_last_error());
    mpri_reply_error(msg, MPR_ERR_DECODE, text);
    mpri_msg_done(msg);
}

static void handle_fork_request(mpri_msg_t *msg) {
    mpri_reader_t r;
    mpri_reader_init(&r, msg->body, msg->hdr.body_len);
    mpri_gid_t id, fork;
    if (mpri_gid_read(&r, &id) || mpri_gid_read(&r, &fork)) return reply_decode_error(msg, "fork request");
    mpri_owner_t *o = mpri_owner_get_or_create(id);
    if (o) {
        mpri_owner_add_fork(o, fork);
        mpri_owner_release(o);
        send_ack(msg->src, ACK_FORK, fork);
    } else {
        fprintf(stderr, "mpirpc: %s: out of memory recording fork (%u:%llu); not acknowledged\n", self_name(),
                fork.rank, (unsigned long long)fork.seq);
    }
    mpri_msg_done(msg);
}

static void handle_user_delete(mpri_msg_t *msg) {
    mpri_reader_t r;
    mpri_reader_init(&r, msg->body, msg->hdr.body_len);
    mpri_gid_t id, fork;
    if (mpri_gid_read(&r, &id) || mpri_gid_read(&r, &fork)) return reply_decode_error(msg, "user delete");
    mpri_owner_del_fork(id, fork);
    send_ack(msg->src, ACK_DELETE, fork);
    mpri_msg_done(msg);
}

static void handle_ack(mpri_msg_t *msg) {
    mpri_reader_t r;
    mpri_reader_init(&r, msg->body, msg->hdr.body_len);
    uint8_t what;
    mpri_gid_t fork;
    if (mpri_read_u8(&r, &what) || mpri_gid_read(&r, &fork) || what > ACK_FORK)
        return reply_decode_error(msg, "rref ack");
    if (what == ACK_DELETE) {
        atomic_fetch_sub(&CTX.unacked_ctrl_msgs, 1);
    } else {
        int parent = -1;
        mpr_rref_t *u = mpri_rref_take_fork_wait(fork, &parent);
        if (u) { /* else a repeated ack (idempotent) */
            mpri_rref_user_confirm_release(u); /* and the fork wait's reference: u may be gone now */
            mpri_rref_send_child_accept(parent, fork);
            atomic_fetch_sub(&CTX.unacked_ctrl_msgs, 1);
        }
    }
    mpri_msg_done(msg);
}

static void handle_child_accept(mpri_msg_t *msg) {
    mpri_reader_t r;
    mpri_reader_init(&r, msg->body, msg->hdr.body_len);
    mpri_gid_t fork;
    if (mpri_gid_read(&r, &fork)) return reply_decode_error(msg, "child accept");
    mpr_rref_release(mpri_rref_take_pending_child(fork));
    mpri_msg_done(msg);
}

typedef struct {
    mpri_msg_t *msg;
    mpri_owner_t *owner;
    void *hook_state; /* the call hooks' (dist autograd: a fetch made inside a context) */
    bool hooked;
} fetch_t;

/* The encoded value reply of a hooked fetch: the call hooks record it. */
static mpr_err_t stamp_fetch_reply(mpri_outmsg_t *reply, void *arg) {
    const mpri_call_hooks_t *hooks = mpri_call_hooks();
    return hooks->on_reply ? hooks->on_reply(arg, reply) : MPR_OK;
}

static void fetch_reply(mpr_future_t *value, void *arg) {
    fetch_t *q = arg;
    mpr_err_t e = mpr_future_error(value);
    if (e == MPR_OK)
        mpri_reply_value_stamped(q->msg, MPRI_MSG_RREF_FETCH_RET, mpri_future_value(value),
                                 q->hooked ? stamp_fetch_reply : NULL, q->hook_state);
    else
        mpri_reply_future_error(q->msg, value); /* a remote failure keeps its origin */
    if (q->hooked && mpri_call_hooks()->release) mpri_call_hooks()->release(q->hook_state);
    mpri_msg_done(q->msg);
    mpri_owner_release(q->owner);
    free(q);
}

static void handle_fetch(mpri_msg_t *msg) {
    mpri_reader_t r;
    mpri_reader_init(&r, msg->body, msg->hdr.body_len);
    mpri_gid_t id;
    if (mpri_gid_read(&r, &id)) return reply_decode_error(msg, "fetch");
    fetch_t *q = malloc(sizeof *q);
    mpri_owner_t *o = q ? mpri_owner_get_or_create(id) : NULL;
    if (!o) {
        free(q);
        mpri_reply_error(msg, MPR_ERR_NOMEM, "fetch: out of memory");
        mpri_msg_done(msg);
        return;
    }
    q->msg = msg;
    q->owner = o;
    q->hook_state = NULL;
    q->hooked = false;
    /* A fetch made inside a dist autograd context: the reply's tensors get a
     * send function here, a recv function on the fetching worker. */
    const mpri_call_hooks_t *hooks = mpri_call_hooks();
    if (hooks->on_request && msg->hdr.autograd_context_id) {
        mpr_err_t he = hooks->on_request(msg, NULL, &q->hook_state);
        if (he) {
            char text[MPR_ERROR_TEXT_MAX];
            snprintf(text, sizeof text, "fetch: %s", mpr_last_error());
            mpri_reply_error(msg, he, text);
            mpri_msg_done(msg);
            mpri_owner_release(o);
            free(q);
            return;
        }
        q->hooked = true;
    }
    /* Parked on the value future if the creation has not finished (a fetch
     * that overtook its remote() waits for it); no thread is held. */
    if (mpri_future_on_complete(o->value, fetch_reply, q) != MPR_OK) {
        if (q->hooked && hooks->release) hooks->release(q->hook_state);
        mpri_reply_error(msg, MPR_ERR_NOMEM, "fetch: out of memory");
        mpri_msg_done(msg);
        mpri_owner_release(o);
        free(q);
    }
}

mpr_err_t mpri_rref_proto_install(void) {
    mpri_rref_set_delete_sender(send_user_delete);
    mpri_value_set_opaque_ops(MPR_VALUE_RREF, &rref_ops);
    mpr_err_t e;
    if ((e = mpri_set_handler(MPRI_MSG_RREF_FETCH, handle_fetch, true)) ||
        (e = mpri_set_handler(MPRI_MSG_RREF_FORK_REQUEST, handle_fork_request, true)) ||
        (e = mpri_set_handler(MPRI_MSG_RREF_USER_DELETE, handle_user_delete, true)) ||
        (e = mpri_set_handler(MPRI_MSG_RREF_CHILD_ACCEPT, handle_child_accept, true)) ||
        (e = mpri_set_handler(MPRI_MSG_RREF_ACK, handle_ack, true)))
        return e;
    return MPR_OK;
}
