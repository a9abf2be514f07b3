/* rref_context.c — the RRef layer's per-rank state: ids, owner records and
 * their fork sets, handles (owner and user), pending users and children,
 * counters for debug info, and the graceful-shutdown sweep.
 *
 * Layering: this file keeps state and sends nothing. The protocol
 * (rref_proto.c) sits above it: it drives the transitions below from the
 * messages it handles and is the only part that sends. The one message the
 * context itself must cause, USER_DELETE when a user is deleted, goes through
 * the sender the protocol registers at install (mpri_rref_set_delete_sender).
 *
 * Protocol state machine (PyTorch rref.rst semantics; messages in rref_proto.c):
 *
 * Owner record (on the owner), per RRef id:
 *   ABSENT --REMOTE_CALL | FETCH | FORK_REQUEST | USER_DELETE | decode--> PENDING
 *     (in the owners table; value future not complete)
 *   ABSENT --mpr_rref_create_local--> CREATED (not in the table: only the
 *     local handle refers to it)
 *   PENDING --function done (mpri_owner_set_value)--> CREATED
 *   CREATED: in the table while its fork set is non-empty; leaves it when the
 *     last fork is deleted; freed (value released, destructor runs) when the
 *     last reference (table, owner handles, in-flight fetches) goes.
 *   CREATED is final (`created` is only ever set); owner_check_locked() checks,
 *   in Debug builds, after every change: in the table <=> (forks or not
 *   created), the table's reference counted, the fork array consistent.
 * Fork set: add (creator fork from REMOTE_CALL, FORK_REQUEST from a new
 *   user, the owner itself sharing the RRef) and delete (USER_DELETE) are
 *   idempotent. A delete that arrives before the creation (the creator's
 *   remote() timed out and its user was dropped) leaves a tombstone that the
 *   late add cancels, so no fork outlives its user.
 *
 * User handle (UserRRef, one per fork id; user_set_state_locked() asserts
 * the transitions, user_check_locked() checks each handle in Debug builds):
 *   (decode from the owner) --> CONFIRMED; (mpr_remote, decode from a user) --> PENDING
 *   PENDING --REMOTE_RET ok | FORK_REQUEST acked--> CONFIRMED
 *   PENDING --creation error/timeout | fork request failed--> FAILED
 *   CONFIRMED, FAILED: final.
 *   Orthogonal "deleted" flag (the handle leaves the live-user list):
 *   live --last reference dropped (not PENDING: the pending state holds a
 *     reference, dropped in the locked step that clears pending_ref after
 *     leaving PENDING, with mpr_remote's own reference when its reply is what
 *     settles it; mpr_rref_confirmed_by_owner waits for that step, so a
 *     confirmed handle's user holds its last reference)
 *     | graceful-shutdown sweep--> deleted: a USER_DELETE goes
 *     to the owner if the owner recorded (or will record) this fork (G1).
 *   A PENDING user swept by shutdown is deleted with delete_due set: its
 *     USER_DELETE goes when it leaves PENDING (confirmed, or failed with the
 *     owner knowing the fork), so the owner is never left with its fork.
 *   G2: a user that forks its RRef keeps a reference in the pending-children
 *   table until the child's CHILD_ACCEPT arrives (after the owner confirmed
 *   the child), so the parent's delete cannot overtake the child's fork.
 *
 * Graceful shutdown (runtime/shutdown.c runs the rounds): while the rank is
 * in graceful shutdown but the job is not quiescent, nothing here changes:
 * handlers still use, send and receive RRefs, which stay valid. Once every
 * live rank called mpr_shutdown(true) and nothing is in flight anywhere, the
 * on_quiescent hook (rref_on_quiescent) deletes every live user (the
 * application may still hold some; later uses fail with MPR_ERR_SHUTDOWN
 * "deleted by shutdown"); shutdown then drains those deletes and their acks
 * before stopping. Since nothing runs anywhere at that point, no fork can
 * reach a rank after its sweep. After the runtime stopped (after_stop),
 * whatever is left (possible only when a peer left with mpr_shutdown(false)
 * or shutdown timed out) is reported on stderr with its id, and dropped.
 *
 * Invariants: the lock is never held while sending, completing futures,
 * running callbacks or releasing values; counters are changed under it
 * (owners_live and unacked_ctrl_msgs are atomics). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "mpri_args.h"
#include "mpri_assert.h"
#include "mpri_error.h"
#include "mpri_event.h"
#include "mpri_future.h"
#include "mpri_pool.h"
#include "mpri_rref.h"
#include "mpri_runtime.h"

mpri_rref_ctx_t mpri_rref_ctx = {.lock = PTHREAD_MUTEX_INITIALIZER};
#define CTX mpri_rref_ctx

static atomic_uint_fast64_t gid_counter;

/* Registered once by rref_proto.c in the api layer's ordered init, before any
 * user can exist; read without the lock afterwards. */
static mpri_rref_delete_sender_t delete_sender;

#define OWNER_BUCKETS 4096
#define CHILD_BUCKETS 1024
#define QUARANTINE 1024

/* fork id -> handle (+ a rank): pending children (a parent waiting for
 * CHILD_ACCEPT) and fork waits (a new user waiting for its fork's ack). */
typedef struct fork_ent {
    mpri_gid_t fork;
    mpr_rref_t *handle;
    int rank;
    struct fork_ent *next;
} fork_ent_t;

typedef struct {
    fork_ent_t *b[CHILD_BUCKETS];
} fork_table_t;

static struct {
    mpri_owner_t *owners[OWNER_BUCKETS];
    long owners_in_table;
    fork_table_t children, waits;
    mpr_rref_t users; /* sentinel of the live-user list */
    mpr_rref_t *quarantine[QUARANTINE];
    size_t quarantine_next;
    bool graceful;
} st = {.users = {.prev = &st.users, .next = &st.users}};

mpri_gid_t mpri_gid_new(void) {
    mpri_gid_t g = {(uint32_t)mpri_rt.rank, (uint64_t)atomic_fetch_add(&gid_counter, 1) + 1};
    return g;
}

void mpri_gid_put(mpri_buf_t *b, mpri_gid_t g) {
    mpri_buf_put_u32(b, g.rank);
    mpri_buf_put_u64(b, g.seq);
}

mpr_err_t mpri_gid_read(mpri_reader_t *r, mpri_gid_t *g) {
    mpr_err_t e = mpri_read_u32(r, &g->rank);
    if (!e) e = mpri_read_u64(r, &g->seq);
    if (!e && (int64_t)g->rank >= mpri_rt.size)
        e = mpr_error_set(MPR_ERR_DECODE, "RRef id names rank %u (world size %d)", g->rank, mpri_rt.size);
    return e;
}

void mpri_rref_set_delete_sender(mpri_rref_delete_sender_t send) {
    MPRI_ASSERT(send && (!delete_sender || delete_sender == send), "the RRef delete sender is registered once");
    delete_sender = send;
}

/* Tell the owner that user `r` (now deleted, lock not held) is gone (G1). */
static void send_user_delete(const mpr_rref_t *r) {
    MPRI_ASSERT(delete_sender, "a user RRef exists before the RRef protocol was installed (mpri_api_init)");
    delete_sender(r->owner_rank, r->id, r->fork);
}

/* ---- deferred releases (destructors are user code: never on the progress thread) ---- */

static void release_future_task(void *arg) { mpr_future_release(arg); }

/* ---- owner records ---- */

static mpri_owner_t **owner_bucket(mpri_gid_t id) { return &st.owners[mpri_gid_hash(id) % OWNER_BUCKETS]; }

static mpri_owner_t *owner_find_locked(mpri_gid_t id) {
    for (mpri_owner_t *o = *owner_bucket(id); o; o = o->hnext)
        if (mpri_gid_eq(o->id, id)) return o;
    return NULL;
}

static void owner_link_locked(mpri_owner_t *o) {
    mpri_owner_t **b = owner_bucket(o->id);
    o->hnext = *b;
    *b = o;
    o->in_table = true;
    atomic_fetch_add(&o->refcount, 1);
    st.owners_in_table++;
}

/* Unlink; the caller drops the table's reference after unlocking. */
static void owner_unlink_locked(mpri_owner_t *o) {
    for (mpri_owner_t **l = owner_bucket(o->id); *l; l = &(*l)->hnext)
        if (*l == o) {
            *l = o->hnext;
            break;
        }
    o->hnext = NULL;
    o->in_table = false;
    st.owners_in_table--;
}

/* ---- state checkers (Debug builds; like SQLite's assert_pager_state) ---- */

/* An owner record after a settled change; `table_ref_pending`: the caller
 * still holds the reference the table just gave up. */
static void owner_check_locked(const mpri_owner_t *o, bool table_ref_pending) {
#if MPRI_DEBUG_CHECKS
    MPRI_DEBUG_ASSERT(o->in_table == (o->nforks > 0 || !o->created),
                      "owner record: in the table iff it has forks or is not created");
    MPRI_DEBUG_ASSERT(atomic_load(&o->refcount) >= (long)o->in_table + (long)table_ref_pending,
                      "owner record: the table's reference is not counted");
    MPRI_DEBUG_ASSERT(o->nforks <= o->capforks && (o->capforks == 0) == (o->forks == NULL),
                      "owner record: fork array inconsistent");
    for (size_t i = 0; i < o->nforks; i++)
        MPRI_DEBUG_ASSERT(o->forks[i].kind == FORK_LIVE || o->forks[i].kind == FORK_TOMBSTONE,
                          "owner record: bad fork kind");
#else
    (void)o, (void)table_ref_pending;
#endif
}

/* A user handle (any state). */
static void user_check_locked(const mpr_rref_t *r) {
#if MPRI_DEBUG_CHECKS
    MPRI_DEBUG_ASSERT(!r->is_owner && r->magic == MPRI_RREF_MAGIC, "user check on a non-user handle");
    MPRI_DEBUG_ASSERT(r->state == USER_PENDING || r->state == USER_CONFIRMED || r->state == USER_FAILED,
                      "user state out of range");
    MPRI_DEBUG_ASSERT(r->state != USER_PENDING || (r->ready && r->pending_ref),
                      "a PENDING user has its ready future and the pending state's reference");
    MPRI_DEBUG_ASSERT(!r->pending_ref || atomic_load(&r->refcount) >= 1,
                      "the pending state's reference is counted");
    MPRI_DEBUG_ASSERT(r->state != USER_CONFIRMED || r->owner_knows, "a CONFIRMED user is known to its owner");
    MPRI_DEBUG_ASSERT(r->deleted == (r->next == NULL && r->prev == NULL),
                      "a user is in the live-user list iff it is not deleted");
    MPRI_DEBUG_ASSERT(!r->delete_due || (r->deleted && r->state == USER_PENDING),
                      "a delete is due only for a deleted user still PENDING");
    MPRI_DEBUG_ASSERT(CTX.users_live >= 0 && CTX.pending_users >= 0 && CTX.pending_children >= 0,
                      "RRef counters negative");
#else
    (void)r;
#endif
}

/* PENDING -> CONFIRMED | FAILED; anything else is a bug. */
static void user_set_state_locked(mpr_rref_t *r, int to) {
    MPRI_ASSERT(r->state == USER_PENDING && (to == USER_CONFIRMED || to == USER_FAILED),
                "illegal UserRRef state transition");
    r->state = to;
    if (to == USER_CONFIRMED) r->owner_knows = true;
}

/* Put `o` in or out of the table per its state; true if the caller must drop
 * the table's reference (after unlocking). */
static bool owner_settle_locked(mpri_owner_t *o) {
    bool want = o->nforks > 0 || !o->created;
    bool drop = false;
    if (want && !o->in_table) owner_link_locked(o);
    if (!want && o->in_table) {
        owner_unlink_locked(o);
        drop = true;
    }
    owner_check_locked(o, drop);
    return drop;
}

static mpri_owner_t *owner_alloc(mpri_gid_t id) {
    mpri_owner_t *o = calloc(1, sizeof *o);
    if (!o || !(o->value = mpr_future_create())) {
        free(o);
        mpr_error_set(MPR_ERR_NOMEM, "RRef: out of memory");
        return NULL;
    }
    o->id = id;
    atomic_init(&o->refcount, 1);
    atomic_fetch_add(&CTX.owners_live, 1);
    return o;
}

mpri_owner_t *mpri_owner_get_or_create(mpri_gid_t id) {
    pthread_mutex_lock(&CTX.lock);
    mpri_owner_t *o = owner_find_locked(id);
    if (o) {
        atomic_fetch_add(&o->refcount, 1);
    } else if ((o = owner_alloc(id))) {
        owner_link_locked(o); /* pending creation: the table keeps it */
    }
    pthread_mutex_unlock(&CTX.lock);
    return o;
}

mpri_owner_t *mpri_owner_new_local(mpri_gid_t id, mpr_value_t *value) {
    mpri_owner_t *o = owner_alloc(id);
    if (!o) return NULL;
    o->created = true;
    mpr_future_set_result(o->value, mpr_value_retain(value));
    return o;
}

void mpri_owner_retain(mpri_owner_t *o) { atomic_fetch_add(&o->refcount, 1); }

void mpri_owner_release(mpri_owner_t *o) {
    if (!o || atomic_fetch_sub(&o->refcount, 1) != 1) return;
    /* The value (inside the future) may hold objects whose destructors are
     * user code: never run them on the progress thread. */
    if (mpri_in_progress_context() && mpri_pool_running() &&
        mpri_pool_submit(release_future_task, release_future_task, o->value) == MPR_OK)
        o->value = NULL;
    mpr_future_release(o->value);
    free(o->forks);
    free(o);
    atomic_fetch_sub(&CTX.owners_live, 1);
}

static ssize_t fork_find(const mpri_owner_t *o, mpri_gid_t fork) {
    for (size_t i = 0; i < o->nforks; i++)
        if (mpri_gid_eq(o->forks[i].fork, fork)) return (ssize_t)i;
    return -1;
}

static void fork_remove(mpri_owner_t *o, size_t i) { o->forks[i] = o->forks[--o->nforks]; }

static bool fork_append(mpri_owner_t *o, mpri_gid_t fork, int kind) {
    if (o->nforks == o->capforks) {
        size_t cap = o->capforks ? o->capforks * 2 : 4;
        mpri_fork_ent_t *f = realloc(o->forks, cap * sizeof *f);
        if (!f) return false;
        o->forks = f;
        o->capforks = cap;
    }
    o->forks[o->nforks++] = (mpri_fork_ent_t){fork, kind};
    return true;
}

bool mpri_owner_add_fork(mpri_owner_t *o, mpri_gid_t fork) {
    pthread_mutex_lock(&CTX.lock);
    ssize_t i = fork_find(o, fork);
    bool ok = true;
    if (i >= 0 && o->forks[i].kind == FORK_TOMBSTONE)
        fork_remove(o, (size_t)i); /* its delete came first: both seen */
    else if (i < 0 && !(ok = fork_append(o, fork, FORK_LIVE)))
        fprintf(stderr, "mpirpc: out of memory recording a fork of RRef(%u:%llu)\n", o->id.rank,
                (unsigned long long)o->id.seq);
    bool drop = owner_settle_locked(o);
    pthread_mutex_unlock(&CTX.lock);
    if (drop) mpri_owner_release(o);
    if (!ok) mpr_error_set(MPR_ERR_NOMEM, "RRef(%u:%llu): out of memory recording a fork", o->id.rank,
                           (unsigned long long)o->id.seq);
    return ok;
}

void mpri_owner_del_fork(mpri_gid_t id, mpri_gid_t fork) {
    pthread_mutex_lock(&CTX.lock);
    mpri_owner_t *o = owner_find_locked(id);
    if (!o && (o = owner_alloc(id))) {
        /* The creation has not arrived yet: keep a pending record with a
         * tombstone for this fork. (owner_alloc's reference becomes the
         * table's below.) */
        owner_link_locked(o);
        atomic_fetch_sub(&o->refcount, 1);
    }
    bool drop = false;
    if (o) {
        ssize_t i = fork_find(o, fork);
        if (i >= 0 && o->forks[i].kind == FORK_LIVE)
            fork_remove(o, (size_t)i);
        else if (i < 0 && !o->created)
            fork_append(o, fork, FORK_TOMBSTONE);
        /* else: a repeated delete, ignored (idempotent) */
        drop = owner_settle_locked(o);
    }
    pthread_mutex_unlock(&CTX.lock);
    if (drop) mpri_owner_release(o);
}

void mpri_owner_set_value(mpri_owner_t *o, mpr_err_t code, const char *message, mpr_value_t *value) {
    pthread_mutex_lock(&CTX.lock);
    if (o->created) { /* idempotent: a repeated completion is ignored */
        pthread_mutex_unlock(&CTX.lock);
        return;
    }
    o->created = true; /* PENDING -> CREATED */
    mpri_owner_retain(o); /* keep it through the completion even if it leaves the table */
    bool drop = owner_settle_locked(o);
    pthread_mutex_unlock(&CTX.lock);
    /* Completing runs waiting fetches' callbacks in this thread. */
    if (code == MPR_OK)
        mpr_future_set_result(o->value, mpr_value_retain(value));
    else
        mpr_future_set_error(o->value, code, message);
    if (drop) mpri_owner_release(o);
    mpri_owner_release(o);
}

/* ---- handles ---- */

static void users_link_locked(mpr_rref_t *r) {
    r->next = &st.users;
    r->prev = st.users.prev;
    st.users.prev->next = r;
    st.users.prev = r;
}

static void users_unlink_locked(mpr_rref_t *r) {
    if (!r->next) return;
    r->prev->next = r->next;
    r->next->prev = r->prev;
    r->next = r->prev = NULL;
}

static mpr_rref_t *handle_alloc(mpri_gid_t id, int owner_rank) {
    mpr_rref_t *r = calloc(1, sizeof *r);
    if (!r) {
        mpr_error_set(MPR_ERR_NOMEM, "RRef: out of memory");
        return NULL;
    }
    r->magic = MPRI_RREF_MAGIC;
    atomic_init(&r->refcount, 1);
    r->id = id;
    r->owner_rank = owner_rank;
    if (mpri_rt.workers) snprintf(r->owner_name, sizeof r->owner_name, "%s", mpri_rt.workers[owner_rank].name);
    return r;
}

mpr_rref_t *mpri_rref_new_owner_handle(mpri_owner_t *o) {
    mpr_rref_t *r = handle_alloc(o->id, mpri_rt.rank);
    if (!r) return NULL;
    r->is_owner = true;
    r->state = USER_CONFIRMED;
    mpri_owner_retain(o);
    r->owner = o;
    return r;
}

mpr_rref_t *mpri_rref_new_user(mpri_gid_t id, int owner_rank, mpri_gid_t fork, int state) {
    mpr_rref_t *r = handle_alloc(id, owner_rank);
    if (!r) return NULL;
    r->fork = fork;
    r->state = state;
    r->owner_knows = state == USER_CONFIRMED;
    if (state == USER_PENDING) {
        if (!(r->ready = mpr_future_create())) {
            free(r);
            return NULL;
        }
        atomic_fetch_add(&r->refcount, 1); /* held by the pending state */
        r->pending_ref = true;
    }
    MPRI_ASSERT(state == USER_PENDING || state == USER_CONFIRMED, "a new user is PENDING or CONFIRMED");
    pthread_mutex_lock(&CTX.lock);
    users_link_locked(r);
    CTX.users_live++;
    if (state == USER_PENDING) CTX.pending_users++;
    user_check_locked(r);
    pthread_mutex_unlock(&CTX.lock);
    return r;
}

mpr_err_t mpri_rref_check(const mpr_rref_t *r, const char *what) {
    if (!r) return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: RRef is NULL", what);
    if (r->magic == MPRI_RREF_DEAD)
        return mpr_error_set(MPR_ERR_STATE, "%s: RRef used after release", what);
    if (r->magic != MPRI_RREF_MAGIC) return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: not an RRef", what);
    return MPR_OK;
}

mpr_rref_t *mpr_rref_retain(mpr_rref_t *r) {
    MPRI_ARG_NONNULL_OR(r, NULL);
    if (r && r->magic == MPRI_RREF_MAGIC) atomic_fetch_add(&r->refcount, 1);
    return r;
}

static void handle_free(mpr_rref_t *r) {
    free(r->errmsg);
    r->errmsg = NULL;
    free(r->remote);
    r->remote = NULL;
    mpr_future_release(r->ready);
    r->ready = NULL;
    r->magic = MPRI_RREF_DEAD;
    /* Keep the memory a while so a use after release is reported, not UB. */
    pthread_mutex_lock(&CTX.lock);
    mpr_rref_t *old = st.quarantine[st.quarantine_next];
    st.quarantine[st.quarantine_next] = r;
    st.quarantine_next = (st.quarantine_next + 1) % QUARANTINE;
    pthread_mutex_unlock(&CTX.lock);
    free(old);
}

static bool runtime_alive(void) {
    int s = mpri_state();
    return s == MPRI_RUNNING || s == MPRI_STOPPING;
}

/* The last reference went: an owner handle drops its record; a user is
 * unlinked (live -> deleted) and its owner told. */
static void release_last(mpr_rref_t *r) {
    if (r->is_owner) {
        mpri_owner_release(r->owner);
        r->owner = NULL;
        handle_free(r);
        return;
    }
    pthread_mutex_lock(&CTX.lock);
    MPRI_ASSERT(r->state != USER_PENDING && !r->pending_ref, "a PENDING user lost the pending state's reference");
    bool send = false;
    if (!r->deleted) { /* live -> deleted (else the sweep already deleted it) */
        users_unlink_locked(r);
        r->deleted = true;
        CTX.users_live--;
        send = r->owner_knows;
    }
    user_check_locked(r);
    pthread_mutex_unlock(&CTX.lock);
    if (send && runtime_alive()) send_user_delete(r);
    handle_free(r);
}

void mpr_rref_release(mpr_rref_t *r) {
    if (!r) return;
    if (r->magic != MPRI_RREF_MAGIC) {
        fprintf(stderr, "mpirpc: mpr_rref_release: %s (ignored)\n",
                r->magic == MPRI_RREF_DEAD ? "RRef released twice" : "not an RRef");
        return;
    }
    if (atomic_fetch_sub(&r->refcount, 1) == 1) release_last(r);
}

/* PENDING -> `state`, dropping the pending state's reference and, with
 * `callers_ref`, the caller's one in the same locked step: a handle that
 * reads confirmed (mpr_rref_confirmed_by_owner) then holds no reference of
 * its creation any more, so the user's last release frees it and a later use
 * is reported. In any other state the caller's reference is dropped as a
 * plain release. */
static bool leave_pending(mpr_rref_t *r, int state, mpr_err_t code, const char *message, bool callers_ref) {
    const mpri_remote_error_t *re = state == USER_FAILED ? mpri_remote_error_matching(code, message) : NULL;
    mpri_remote_error_t *remote = re ? malloc(sizeof *remote) : NULL;
    if (remote) *remote = *re;
    pthread_mutex_lock(&CTX.lock);
    if (r->state != USER_PENDING) {
        pthread_mutex_unlock(&CTX.lock);
        free(remote);
        if (callers_ref) mpr_rref_release(r);
        return false;
    }
    user_set_state_locked(r, state);
    if (state == USER_FAILED) {
        r->err = code;
        r->errmsg = strdup(message && *message ? message : mpr_strerror(code));
        r->remote = remote;
    }
    CTX.pending_users--;
    /* Swept by shutdown while PENDING: now that the owner's view is known,
     * tell it (G1). */
    bool send_delete = r->delete_due && r->owner_knows;
    r->delete_due = false;
    user_check_locked(r);
    pthread_mutex_unlock(&CTX.lock);
    if (send_delete) send_user_delete(r);
    /* Drop the pending state's reference in the step that clears pending_ref
     * (mpr_rref_confirmed_by_owner reads it under the lock), before the
     * ready future completes: whoever saw CONFIRMED (or woke on ready) and
     * released its last reference frees the handle, so a later use reports
     * "used after release". r may be freed once the lock is left. */
    mpr_future_t *ready = mpr_future_retain(r->ready);
    pthread_mutex_lock(&CTX.lock);
    MPRI_ASSERT(r->pending_ref, "a user left PENDING twice");
    r->pending_ref = false;
    long drop = callers_ref ? 2 : 1;
    MPRI_ASSERT(atomic_load(&r->refcount) >= drop, "the references dropped on leaving PENDING are held");
    bool last = atomic_fetch_sub(&r->refcount, drop) == drop;
    pthread_mutex_unlock(&CTX.lock);
    if (last) release_last(r);
    mpri_future_complete(ready, MPR_OK, NULL, NULL);
    mpr_future_release(ready);
    return true;
}

void mpri_rref_user_fail(mpr_rref_t *r, mpr_err_t code, const char *message) {
    leave_pending(r, USER_FAILED, code, message, false);
}

void mpri_rref_user_confirm_release(mpr_rref_t *r) { leave_pending(r, USER_CONFIRMED, MPR_OK, NULL, true); }

void mpri_rref_user_fail_release(mpr_rref_t *r, mpr_err_t code, const char *message) {
    leave_pending(r, USER_FAILED, code, message, true);
}

mpr_err_t mpri_rref_user_error(mpr_rref_t *r) {
    pthread_mutex_lock(&CTX.lock);
    mpr_err_t code = r->err ? r->err : MPR_ERR_STATE;
    char text[MPR_ERROR_TEXT_MAX];
    snprintf(text, sizeof text, "%s", r->errmsg ? r->errmsg : "RRef creation failed");
    mpri_remote_error_t *remote = r->remote ? malloc(sizeof *remote) : NULL;
    if (remote) *remote = *r->remote;
    pthread_mutex_unlock(&CTX.lock);
    if (remote) {
        mpri_error_set_remote(remote);
        free(remote);
        return MPR_ERR_REMOTE;
    }
    return mpr_error_set(code, "%s", text);
}

/* ---- pending children (G2) and fork waits ---- */

static bool fork_table_add(fork_table_t *t, mpri_gid_t fork, mpr_rref_t *handle, int rank) {
    fork_ent_t *c = malloc(sizeof *c);
    if (!c) return false;
    c->fork = fork;
    c->handle = handle;
    c->rank = rank;
    fork_ent_t **b = &t->b[mpri_gid_hash(fork) % CHILD_BUCKETS];
    pthread_mutex_lock(&CTX.lock);
    c->next = *b;
    *b = c;
    if (t == &st.children) CTX.pending_children++;
    pthread_mutex_unlock(&CTX.lock);
    return true;
}

static mpr_rref_t *fork_table_take(fork_table_t *t, mpri_gid_t fork, int *rank) {
    mpr_rref_t *h = NULL;
    pthread_mutex_lock(&CTX.lock);
    for (fork_ent_t **l = &t->b[mpri_gid_hash(fork) % CHILD_BUCKETS]; *l; l = &(*l)->next) {
        if (!mpri_gid_eq((*l)->fork, fork)) continue;
        fork_ent_t *c = *l;
        *l = c->next;
        h = c->handle;
        if (rank) *rank = c->rank;
        free(c);
        if (t == &st.children) CTX.pending_children--;
        break;
    }
    pthread_mutex_unlock(&CTX.lock);
    return h; /* NULL: a repeated message (idempotent) */
}

/* Unlink every entry (under the lock) into a list. */
static fork_ent_t *fork_table_drain_locked(fork_table_t *t) {
    fork_ent_t *all = NULL;
    for (int b = 0; b < CHILD_BUCKETS; b++)
        while (t->b[b]) {
            fork_ent_t *c = t->b[b];
            t->b[b] = c->next;
            c->next = all;
            all = c;
            if (t == &st.children) CTX.pending_children--;
        }
    return all;
}

mpr_err_t mpri_rref_add_pending_child(mpri_gid_t fork, mpr_rref_t *parent) {
    if (!fork_table_add(&st.children, fork, parent, -1))
        return mpr_error_set(MPR_ERR_NOMEM, "sending an RRef: out of memory recording its child");
    return MPR_OK;
}

mpr_rref_t *mpri_rref_take_pending_child(mpri_gid_t fork) { return fork_table_take(&st.children, fork, NULL); }

bool mpri_rref_add_fork_wait(mpr_rref_t *user, int parent) {
    return fork_table_add(&st.waits, user->fork, user, parent);
}

mpr_rref_t *mpri_rref_take_fork_wait(mpri_gid_t fork, int *parent) {
    return fork_table_take(&st.waits, fork, parent);
}

/* ---- debug info, shutdown ---- */

static void rref_debug_info(mpr_debug_info_t *info) {
    pthread_mutex_lock(&CTX.lock);
    info->rref_owners = atomic_load(&CTX.owners_live);
    info->rref_users = CTX.users_live;
    info->rref_pending_users = CTX.pending_users;
    info->rref_pending_children = CTX.pending_children;
    info->rref_unacked_ctrl_msgs = atomic_load(&CTX.unacked_ctrl_msgs);
    pthread_mutex_unlock(&CTX.lock);
}

/* The graceful-shutdown sweep: runs on the shutting-down thread once the
 * whole job is quiescent (every live rank in shutdown, nothing in flight);
 * shutdown drains the deletes sent here before it stops the runtime. */
static void rref_on_quiescent(void) {
    st.graceful = true;
    for (;;) {
        pthread_mutex_lock(&CTX.lock);
        mpr_rref_t *victim = st.users.next != &st.users ? st.users.next : NULL;
        bool send = false;
        if (victim) { /* live -> deleted */
            users_unlink_locked(victim);
            victim->deleted = true;
            CTX.users_live--;
            if (victim->state == USER_PENDING)
                victim->delete_due = true; /* sent when it leaves PENDING */
            else
                send = victim->owner_knows;
            user_check_locked(victim);
        }
        pthread_mutex_unlock(&CTX.lock);
        if (!victim) break;
        if (send) send_user_delete(victim);
    }
}

/* Runs once the runtime stopped: report what is left (graceful only) and drop it. */
static void rref_after_stop(void) {
    const char *me = mpri_rt.workers ? mpri_rt.workers[mpri_rt.rank].name : "?";
    mpri_owner_t *drop = NULL;
    pthread_mutex_lock(&CTX.lock);
    for (int b = 0; b < OWNER_BUCKETS; b++) {
        while (st.owners[b]) {
            mpri_owner_t *o = st.owners[b];
            if (st.graceful) {
                fprintf(stderr, "mpirpc: %s: RRef leak: OwnerRRef(%u:%llu) still has %zu fork(s)%s:", me,
                        o->id.rank, (unsigned long long)o->id.seq, o->nforks,
                        o->created ? "" : " and was never created");
                for (size_t i = 0; i < o->nforks; i++)
                    fprintf(stderr, " %s(%u:%llu)", o->forks[i].kind == FORK_LIVE ? "user" : "tombstone",
                            o->forks[i].fork.rank, (unsigned long long)o->forks[i].fork.seq);
                fprintf(stderr, "\n");
            }
            owner_unlink_locked(o);
            o->hnext = drop;
            drop = o;
        }
    }
    while (st.users.next != &st.users) {
        mpr_rref_t *r = st.users.next;
        if (st.graceful)
            fprintf(stderr, "mpirpc: %s: RRef leak: UserRRef(%u:%llu) fork (%u:%llu) was never deleted\n", me,
                    r->id.rank, (unsigned long long)r->id.seq, r->fork.rank, (unsigned long long)r->fork.seq);
        users_unlink_locked(r);
        r->deleted = true;
        CTX.users_live--;
    }
    fork_ent_t *children = fork_table_drain_locked(&st.children);
    for (fork_ent_t *c = children; c && st.graceful; c = c->next)
        fprintf(stderr, "mpirpc: %s: RRef leak: child fork (%u:%llu) of RRef(%u:%llu) never accepted\n", me,
                c->fork.rank, (unsigned long long)c->fork.seq, c->handle->id.rank,
                (unsigned long long)c->handle->id.seq);
    fork_ent_t *waits = fork_table_drain_locked(&st.waits);
    if (st.graceful && CTX.pending_users)
        fprintf(stderr, "mpirpc: %s: RRef leak: %ld user(s) never confirmed\n", me, CTX.pending_users);
    long unacked = atomic_exchange(&CTX.unacked_ctrl_msgs, 0); /* their answers will never come */
    if (st.graceful && unacked)
        fprintf(stderr, "mpirpc: %s: RRef leak: %ld RRef control message(s) never acknowledged\n", me, unacked);
    st.graceful = false;
    pthread_mutex_unlock(&CTX.lock);
    while (drop) {
        mpri_owner_t *o = drop;
        drop = o->hnext;
        o->hnext = NULL;
        mpri_owner_release(o);
    }
    while (children) {
        fork_ent_t *c = children;
        children = c->next;
        mpr_rref_release(c->handle);
        free(c);
    }
    while (waits) { /* their fork acks will never come */
        fork_ent_t *w = waits;
        waits = w->next;
        mpri_rref_user_fail_release(w->handle, MPR_ERR_SHUTDOWN, "the runtime stopped before the owner confirmed this RRef");
        free(w);
    }
}

mpr_err_t mpri_rref_context_install(void) {
    mpr_err_t e = mpri_add_debug_info_hook(rref_debug_info);
    return e ? e : mpri_add_shutdown_hooks(rref_on_quiescent, rref_after_stop);
}
