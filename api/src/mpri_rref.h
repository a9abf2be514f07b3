/* mpri_rref.h — internal state of the RRef layer (not installed): the
 * interface of rref_context.c. The protocol (mpri_rref_proto.h, rref_proto.c)
 * sits above it: it uses this state and is the only part that sends; this
 * header names nothing of it.
 *
 * Objects (see rref_context.c for the protocol state machine):
 *  - mpri_gid_t: a globally unique id (creator rank, per-rank counter); RRef
 *    ids and fork ids share the counter.
 *  - mpri_owner_t: the OwnerRRef record on the owner: the value future
 *    (completed with the value or the creation error), the set of forks (user
 *    RRefs the owner knows of, plus "tombstones" of deletes that arrived
 *    before the creation), refcounted by the owners table (while any fork
 *    exists or the creation is pending), by owner handles and by in-flight
 *    fetches. The last reference releases the value (destructor runs).
 *  - struct mpr_rref: a handle. On the owner it points to the record; on a
 *    user it is one UserRRef with its fork id and state PENDING ->
 *    CONFIRMED | FAILED. Refcounted by the application, by values, by the
 *    pending-user state (until confirmed) and by pending children (G2).
 * One mutex guards the tables, fork sets and user states. It is never held
 * while sending, completing a future, running a callback or releasing a
 * value (a loopback send runs inline handlers that take it again). */
#ifndef MPRI_RREF_H
#define MPRI_RREF_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "mpirpc/rref.h"
#include "mpri_buf.h"
#include "mpri_registry.h"

typedef struct mpri_gid {
    uint32_t rank;
    uint64_t seq;
} mpri_gid_t;

static inline bool mpri_gid_eq(mpri_gid_t a, mpri_gid_t b) { return a.rank == b.rank && a.seq == b.seq; }
static inline uint64_t mpri_gid_hash(mpri_gid_t g) {
    return (g.seq * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)g.rank * 0xc2b2ae3d27d4eb4full);
}
mpri_gid_t mpri_gid_new(void);
void mpri_gid_put(mpri_buf_t *b, mpri_gid_t g);
mpr_err_t mpri_gid_read(mpri_reader_t *r, mpri_gid_t *g);

enum { FORK_LIVE = 0, FORK_TOMBSTONE = 1 };
typedef struct mpri_fork_ent {
    mpri_gid_t fork;
    int kind; /* FORK_LIVE: a user the owner knows; FORK_TOMBSTONE: deleted before creation */
} mpri_fork_ent_t;

typedef struct mpri_owner {
    mpri_gid_t id;
    atomic_long refcount;
    mpr_future_t *value; /* completes once: the value or the creation error */
    bool created;        /* creation finished (value future completed); under the lock */
    bool in_table;       /* the owners table holds a reference; under the lock */
    mpri_fork_ent_t *forks;
    size_t nforks, capforks;
    struct mpri_owner *hnext;
} mpri_owner_t;

enum { USER_PENDING = 0, USER_CONFIRMED, USER_FAILED };

#define MPRI_RREF_MAGIC 0x52524546u /* "RREF" */
#define MPRI_RREF_DEAD 0xdead4eefu

struct mpr_rref {
    uint32_t magic;
    atomic_long refcount;
    mpri_gid_t id;
    int owner_rank;
    char owner_name[MPR_MAX_NAME_LEN];
    bool is_owner;
    mpri_owner_t *owner; /* is_owner: one reference */
    /* user side (under the lock) */
    mpri_gid_t fork;
    int state;
    bool creator;      /* made by mpr_remote: confirmed by REMOTE_RET */
    bool owner_knows;  /* the owner recorded (or will record) this fork: deletion must be sent */
    bool deleted;      /* no longer usable: released, swept by shutdown, or the runtime stopped;
                        * deleted <=> not in the live-user list */
    bool delete_due;   /* swept while PENDING: the USER_DELETE goes when it leaves PENDING */
    bool pending_ref;  /* the pending state's reference is held: set while PENDING and cleared,
                        * under the lock, in the same step that drops it, so that a caller who
                        * sees CONFIRMED and releases its last reference frees the handle */
    mpr_err_t err;
    char *errmsg;
    struct mpri_remote_error *remote; /* err MPR_ERR_REMOTE: its origin, or NULL */
    mpr_future_t *ready; /* completes when the user leaves PENDING (NULL if born confirmed) */
    struct mpr_rref *prev, *next; /* live user handles */
};

/* ---- rref_context.c ---- */
typedef struct mpri_rref_ctx {
    pthread_mutex_t lock;
    atomic_long owners_live;     /* owner records alive */
    long users_live;             /* user handles not yet deleted (lock) */
    long pending_users;          /* users awaiting confirmation (lock) */
    long pending_children;       /* forks sent by this user awaiting CHILD_ACCEPT (lock) */
    atomic_long unacked_ctrl_msgs; /* deletes/fork requests awaiting RREF_ACK, creations awaiting REMOTE_RET */
} mpri_rref_ctx_t;
extern mpri_rref_ctx_t mpri_rref_ctx;

/* Owner records. get_or_create returns a new reference. */
mpri_owner_t *mpri_owner_get_or_create(mpri_gid_t id);
mpri_owner_t *mpri_owner_new_local(mpri_gid_t id, mpr_value_t *value);
void mpri_owner_retain(mpri_owner_t *o);
void mpri_owner_release(mpri_owner_t *o);
/* Fork set changes (idempotent). */
bool mpri_owner_add_fork(mpri_owner_t *o, mpri_gid_t fork); /* false: out of memory (error set) */
void mpri_owner_del_fork(mpri_gid_t id, mpri_gid_t fork);
/* Complete the creation: value (borrowed) or error. Idempotent (later calls ignored). */
void mpri_owner_set_value(mpri_owner_t *o, mpr_err_t code, const char *message, mpr_value_t *value);

/* Handles. */
mpr_rref_t *mpri_rref_new_owner_handle(mpri_owner_t *o); /* takes a new reference to o */
mpr_rref_t *mpri_rref_new_user(mpri_gid_t id, int owner_rank, mpri_gid_t fork, int state);
/* MPR_OK if `r` is a live handle, else MPR_ERR_INVALID_ARG / MPR_ERR_STATE. */
mpr_err_t mpri_rref_check(const mpr_rref_t *r, const char *what);
/* User state transitions PENDING -> FAILED / CONFIRMED (lock taken inside;
 * no-ops in any other state); they drop the pending state's reference. A
 * failure passed on as the thread's last remote error keeps its origin
 * (mpri_error.h), which mpri_rref_user_error reports again. The _release
 * forms drop the caller's reference to `r` too (in the same locked step when
 * `r` was PENDING, else as a plain release), so no reference of the creation
 * is left once the handle reads confirmed (mpr_rref_confirmed_by_owner) and
 * the user's last release is the handle's; `r` may be gone when they return. */
void mpri_rref_user_fail(mpr_rref_t *r, mpr_err_t code, const char *message);
void mpri_rref_user_confirm_release(mpr_rref_t *r);
void mpri_rref_user_fail_release(mpr_rref_t *r, mpr_err_t code, const char *message);
/* The creation error of a failed user, copied into the thread's error. */
mpr_err_t mpri_rref_user_error(mpr_rref_t *r);
/* Pending children (G2): keep `parent` (the reference is taken over on
 * success) alive until CHILD_ACCEPT(fork). MPR_ERR_NOMEM: nothing recorded,
 * the reference stays the caller's. */
mpr_err_t mpri_rref_add_pending_child(mpri_gid_t fork, mpr_rref_t *parent);
mpr_rref_t *mpri_rref_take_pending_child(mpri_gid_t fork);
/* Fork waits: a new user (reference taken over) waiting for the owner's ack
 * of its FORK_REQUEST; `parent` gets CHILD_ACCEPT afterwards. */
bool mpri_rref_add_fork_wait(mpr_rref_t *user, int parent);
mpr_rref_t *mpri_rref_take_fork_wait(mpri_gid_t fork, int *parent);

/* How the context tells an owner that one of its users is gone (G1: last
 * reference dropped, or the graceful-shutdown sweep). The context sends
 * nothing itself: the protocol above it (rref_proto.c) registers its sender
 * once, from mpri_rref_proto_install; a user can exist only after that. */
typedef void (*mpri_rref_delete_sender_t)(int owner_rank, mpri_gid_t id, mpri_gid_t fork);
void mpri_rref_set_delete_sender(mpri_rref_delete_sender_t send);

/* ---- installation, in the api layer's ordered init (init.c) ---- */
void mpri_rref_object_install(void);       /* object value ops (rref_object.c) */
mpr_err_t mpri_rref_context_install(void); /* debug-info and shutdown hooks (rref_context.c) */
/* (the protocol's install, mpri_rref_proto_install, is in mpri_rref_proto.h) */

#endif
