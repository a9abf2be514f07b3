/* rref_api.c — the public RRef functions: remote(), create_local, to_here,
 * local_value, queries, RRef values and proxies.
 *
 * Invariants: mpr_remote returns its handle before the owner answers; the
 * creator's user stays PENDING (holding itself alive) until REMOTE_RET or an
 * error/timeout arrives, which confirms or fails it (rref_context.c). A
 * failed user reports its creation error at every later use. Every blocking
 * call waits on a future, so the waiting thread helps progress. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_args.h"
#include "mpri_call.h"
#include "mpri_error.h"
#include "mpri_future.h"
#include "mpri_rref.h"
#include "mpri_rref_proto.h"
#include "mpri_runtime.h"
#include "mpri_value.h"

#define CTX mpri_rref_ctx

/* ---- remote() ---- */

typedef struct {
    mpr_rref_t *user;    /* creator handle on a remote owner, or NULL */
    mpri_owner_t *owner; /* remote on self: the local record */
    bool left;           /* the REMOTE_CALL left (mpri_outmsg_t.left) */
} creation_t;

static void creation_done(mpr_future_t *f, void *arg) {
    creation_t *c = arg;
    mpr_err_t e = mpr_future_error(f);
    if (c->user) {
        if (e == MPR_OK) {
            mpri_rref_user_confirm_release(c->user); /* and the creation's reference */
        } else {
            /* Never reached the owner: nothing to delete. Any answer from the
             * owner, errors included (out of memory there too), means it
             * recorded the fork: a request it could not run is settled there
             * (mpri_call_reject) as a failed call is. */
            if (!c->left || e == MPR_ERR_MPI) {
                pthread_mutex_lock(&CTX.lock);
                c->user->owner_knows = false;
                pthread_mutex_unlock(&CTX.lock);
            }
            if (mpri_future_remote_error(f)) mpri_error_set_remote(mpri_future_remote_error(f)); /* kept by the user */
            mpri_rref_user_fail_release(c->user, e, mpr_future_error_message(f));
        }
    } else {
        if (e != MPR_OK) mpri_owner_set_value(c->owner, e, mpr_future_error_message(f), NULL);
        mpri_owner_release(c->owner);
    }
    atomic_fetch_sub(&CTX.unacked_ctrl_msgs, 1);
    mpr_future_release(f);
    free(c);
}

mpr_rref_t *mpr_remote(mpr_dest_t to, const char *fn, const mpr_value_t *args, double timeout_s) {
    MPRI_ARG_NONNULL_OR(fn, NULL);
    mpr_err_t e = mpri_check_running("remote");
    int rank;
    if (e || (e = mpr_dest_rank(to, &rank))) return NULL;
    bool self = rank == mpri_rt.rank;
    mpri_gid_t id = mpri_gid_new();
    mpri_gid_t fork = self ? id : mpri_gid_new();
    mpri_outmsg_t m;
    if ((e = mpri_call_msg_begin(&m, MPRI_MSG_REMOTE_CALL, "remote", fn, args))) return NULL;
    mpri_gid_put(&m.wire, id);
    mpri_gid_put(&m.wire, fork);
    size_t mark = mpri_rref_encode_begin(); /* the arguments' forks stay only if the message leaves */
    if ((e = mpri_call_msg_args(&m, "remote", fn, args, rank))) {
        mpri_rref_encode_end(mark, false);
        return NULL;
    }
    creation_t *c = calloc(1, sizeof *c);
    mpr_rref_t *r = NULL;
    if (c && self) {
        mpri_owner_t *o = mpri_owner_get_or_create(id);
        if (o) {
            r = mpri_rref_new_owner_handle(o);
            c->owner = o; /* the creation's reference */
        }
    } else if (c) {
        r = mpri_rref_new_user(id, rank, fork, USER_PENDING);
        if (r) {
            pthread_mutex_lock(&CTX.lock);
            r->creator = true;
            r->owner_knows = true; /* the REMOTE_CALL registers this fork */
            pthread_mutex_unlock(&CTX.lock);
            c->user = mpr_rref_retain(r);
        }
    }
    if (!r) {
        if (c && c->owner) { /* the pending record leaves the owners table */
            mpri_owner_set_value(c->owner, MPR_ERR_NOMEM, "remote: out of memory", NULL);
            mpri_owner_release(c->owner);
        }
        free(c);
        mpri_outmsg_fini(&m);
        mpri_rref_encode_end(mark, false);
        mpr_error_set(MPR_ERR_NOMEM, "remote '%s': out of memory", fn);
        return NULL;
    }
    char label[80];
    snprintf(label, sizeof label, "remote '%.60s'", fn);
    atomic_fetch_add(&CTX.unacked_ctrl_msgs, 1);
    mpr_future_t *f = mpri_request(rank, &m, timeout_s, label);
    c->left = m.left;
    mpri_rref_encode_end(mark, m.left);
    if (!f) {
        mpr_future_t *failed = mpr_future_create();
        if (failed) mpr_future_set_error(failed, MPR_ERR_NOMEM, "remote: out of memory");
        f = failed;
    }
    if (!f || mpri_future_on_complete(f, creation_done, c) != MPR_OK) {
        /* Out of memory: the RRef can never be confirmed; fail it now. */
        if (c->user) {
            mpri_rref_user_fail_release(c->user, MPR_ERR_NOMEM, "remote: out of memory");
        } else { /* the pending record fails (to_here reports it) and leaves the table */
            mpri_owner_set_value(c->owner, MPR_ERR_NOMEM, "remote: out of memory", NULL);
            mpri_owner_release(c->owner);
        }
        atomic_fetch_sub(&CTX.unacked_ctrl_msgs, 1);
        mpr_future_release(f);
        free(c);
    }
    return r;
}

mpr_rref_t *mpr_rref_create_local(mpr_value_t *value) {
    MPRI_ARG_NONNULL_OR(value, NULL);
    if (mpri_check_running("mpr_rref_create_local")) return NULL;
    if (!value) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_rref_create_local: value is NULL");
        return NULL;
    }
    mpri_owner_t *o = mpri_owner_new_local(mpri_gid_new(), value);
    if (!o) return NULL;
    mpr_rref_t *r = mpri_rref_new_owner_handle(o);
    mpri_owner_release(o);
    return r;
}

/* ---- using an RRef ---- */

/* Common checks: a live handle, a running runtime, not deleted by shutdown. */
static mpr_err_t check_use(mpr_rref_t *r, const char *what) {
    mpr_err_t e = mpri_rref_check(r, what);
    if (e || (e = mpri_check_running(what))) return e;
    if (!r->is_owner) {
        pthread_mutex_lock(&CTX.lock);
        bool deleted = r->deleted;
        pthread_mutex_unlock(&CTX.lock);
        if (deleted) return mpr_error_set(MPR_ERR_SHUTDOWN, "%s: the RRef was deleted by shutdown", what);
    }
    return MPR_OK;
}

static bool user_failed(mpr_rref_t *r) {
    pthread_mutex_lock(&CTX.lock);
    bool failed = r->state == USER_FAILED;
    pthread_mutex_unlock(&CTX.lock);
    return failed;
}

static bool user_pending(mpr_rref_t *r) {
    pthread_mutex_lock(&CTX.lock);
    bool pending = r->state == USER_PENDING;
    pthread_mutex_unlock(&CTX.lock);
    return pending;
}

/* The owner's value future, waited for up to timeout_s. */
static mpr_err_t owner_value(mpr_rref_t *r, double timeout_s, const char *what, mpr_value_t **out) {
    if (timeout_s < 0) timeout_s = mpri_rt.default_timeout_s;
    mpr_err_t e = mpr_future_wait(r->owner->value, timeout_s);
    if (e == MPR_ERR_TIMEOUT) {
        char id[64];
        return mpr_error_set(e, "%s: the value of %s is still being created after %.3f s", what,
                             mpr_rref_id_string(r, id, sizeof id), timeout_s);
    }
    if (e) return e;
    return mpr_future_get(r->owner->value, 0, out);
}

mpr_err_t mpr_rref_to_here(mpr_rref_t *r, double timeout_s, mpr_value_t **out) {
    if (out) *out = NULL;
    MPRI_ARG_NONNULL(r);
    MPRI_ARG_NONNULL(out);
    mpr_err_t e = check_use(r, "to_here");
    if (e) return e;
    if (!out) return mpr_error_set(MPR_ERR_INVALID_ARG, "to_here: out is NULL");
    if (r->is_owner) return owner_value(r, timeout_s, "to_here", out);
    if (user_failed(r)) return mpri_rref_user_error(r);
    mpri_outmsg_t m;
    mpri_outmsg_init(&m, MPRI_MSG_RREF_FETCH);
    mpri_gid_put(&m.wire, r->id);
    const mpri_call_hooks_t *hooks = mpri_call_hooks(); /* inside a dist autograd context: recorded */
    if (hooks->on_send_request && (e = hooks->on_send_request(&m, NULL, r->owner_rank))) {
        mpri_outmsg_fini(&m);
        return e;
    }
    mpr_future_t *f = mpri_request(r->owner_rank, &m, timeout_s, "to_here");
    if (!f) return mpr_last_error_code();
    /* While the creating remote() is unanswered, its error (a timeout the
     * owner never saw) must end the wait too: wait in slices. */
    while ((e = mpr_future_wait(f, user_pending(r) ? 0.05 : MPR_WAIT_FOREVER)) == MPR_ERR_TIMEOUT) {
        if (user_failed(r)) break;
    }
    if (!mpr_future_done(f) && user_failed(r)) {
        mpr_future_release(f);
        return mpri_rref_user_error(r);
    }
    if (e == MPR_OK) e = mpr_future_get(f, 0, out);
    mpr_future_release(f);
    if (e && user_pending(r)) { /* the owner's creation failed: its answer to remote() is on the way */
        char text[MPR_ERROR_TEXT_MAX];
        snprintf(text, sizeof text, "%s", mpr_last_error());
        mpr_future_wait(r->ready, 1.0);
        mpr_error_set(e, "%s", text);
    }
    if (e && user_failed(r)) return mpri_rref_user_error(r);
    return e;
}

mpr_err_t mpr_rref_local_value(mpr_rref_t *r, mpr_value_t **out) {
    if (out) *out = NULL;
    MPRI_ARG_NONNULL(r);
    MPRI_ARG_NONNULL(out);
    mpr_err_t e = check_use(r, "local_value");
    if (e) return e;
    if (!out) return mpr_error_set(MPR_ERR_INVALID_ARG, "local_value: out is NULL");
    if (!r->is_owner) {
        char id[64];
        return mpr_error_set(MPR_ERR_NOT_OWNER,
                             "local_value: %s is owned by %s (rank %d), not by this worker (%s); use "
                             "mpr_rref_to_here() for a copy",
                             mpr_rref_id_string(r, id, sizeof id), r->owner_name, r->owner_rank,
                             mpri_rt.workers[mpri_rt.rank].name);
    }
    return owner_value(r, MPR_TIMEOUT_DEFAULT, "local_value", out);
}

bool mpr_rref_is_owner(const mpr_rref_t *r) {
    MPRI_ARG_NONNULL_OR(r, false);
    return mpri_rref_check(r, "is_owner") == MPR_OK && r->is_owner;
}

mpr_err_t mpr_rref_owner(const mpr_rref_t *r, mpr_worker_info_t *out) {
    if (out) memset(out, 0, sizeof *out), out->rank = -1;
    MPRI_ARG_NONNULL(r);
    MPRI_ARG_NONNULL(out);
    mpr_err_t e = mpri_rref_check(r, "owner");
    if (e) return e;
    if (!out) return mpr_error_set(MPR_ERR_INVALID_ARG, "owner: out is NULL");
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", r->owner_name);
    out->rank = r->owner_rank;
    return MPR_OK;
}

const char *mpr_rref_owner_name(const mpr_rref_t *r) {
    MPRI_ARG_NONNULL_OR(r, NULL);
    return mpri_rref_check(r, "owner_name") == MPR_OK ? r->owner_name : "";
}

bool mpr_rref_confirmed_by_owner(const mpr_rref_t *r) {
    MPRI_ARG_NONNULL_OR(r, false);
    if (mpri_rref_check(r, "confirmed_by_owner")) return false;
    if (r->is_owner) return true;
    pthread_mutex_lock(&CTX.lock);
    /* confirmed once the confirmation is done, the pending state's reference
     * dropped included (see pending_ref) */
    bool confirmed = r->state == USER_CONFIRMED && !r->pending_ref;
    pthread_mutex_unlock(&CTX.lock);
    return confirmed;
}

const char *mpr_rref_id_string(const mpr_rref_t *r, char *buf, size_t len) {
    MPRI_ARG_NONNULL_OR(r, NULL);
    MPRI_ARG_NONNULL_OR(buf, NULL);
    if (!buf || !len) return "";
    if (mpri_rref_check(r, "id"))
        snprintf(buf, len, "RRef(?)");
    else
        snprintf(buf, len, "RRef(%u:%llu)", r->id.rank, (unsigned long long)r->id.seq);
    return buf;
}

/* ---- RRef values ---- */

mpr_value_t *mpr_value_new_rref(mpr_rref_t *r) {
    MPRI_ARG_NONNULL_OR(r, NULL);
    if (mpri_rref_check(r, "mpr_value_new_rref")) return NULL;
    mpr_value_t *v = mpri_value_new_opaque(MPR_VALUE_RREF, mpr_rref_retain(r));
    if (!v) mpr_rref_release(r);
    return v;
}

mpr_err_t mpr_value_get_rref(const mpr_value_t *v, mpr_rref_t **out) {
    if (out) *out = NULL;
    MPRI_ARG_NONNULL(v);
    MPRI_ARG_NONNULL(out);
    if (!v || v->kind != MPR_VALUE_RREF)
        return mpr_error_set(MPR_ERR_TYPE, "expected an rref value, got %s", v ? mpr_value_kind_name(v->kind) : "NULL");
    *out = v->u.opaque;
    return MPR_OK;
}

mpr_err_t mpr_args_rref(const mpr_value_t *args, size_t i, mpr_rref_t **out) {
    if (out) *out = NULL;
    MPRI_ARG_NONNULL(args);
    MPRI_ARG_NONNULL(out);
    if (!args || args->kind != MPR_VALUE_LIST)
        return mpr_error_set(MPR_ERR_TYPE, "arguments: expected a list");
    if (i >= args->u.list.len)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "argument %zu missing (got %zu arguments)", i, args->u.list.len);
    const mpr_value_t *v = args->u.list.items[i];
    if (v->kind != MPR_VALUE_RREF)
        return mpr_error_set(MPR_ERR_TYPE, "argument %zu: expected rref, got %s", i, mpr_value_kind_name(v->kind));
    *out = v->u.opaque;
    return MPR_OK;
}

/* ---- proxies ---- */

/* [r, args...] (new reference) or NULL with the error set. */
static mpr_value_t *proxy_args(mpr_rref_t *r, const char *what, const mpr_value_t *args) {
    if (args && mpr_value_kind(args) != MPR_VALUE_LIST) {
        mpr_error_set(MPR_ERR_TYPE, "%s: arguments must be a list value (got %s)", what,
                      mpr_value_kind_name(mpr_value_kind(args)));
        return NULL;
    }
    mpr_value_t *list = mpr_value_new_list();
    if (!list || mpr_value_list_append(list, mpr_value_new_rref(r))) {
        mpr_value_release(list);
        return NULL;
    }
    for (size_t i = 0; i < mpr_value_list_len(args); i++)
        if (mpr_value_list_append(list, mpr_value_retain(args->u.list.items[i]))) {
            mpr_value_release(list);
            return NULL;
        }
    return list;
}

static mpr_value_t *proxy_prepare(mpr_rref_t *r, const char *what, const mpr_value_t *args) {
    if (check_use(r, what)) return NULL;
    if (!r->is_owner && user_failed(r)) {
        mpri_rref_user_error(r);
        return NULL;
    }
    return proxy_args(r, what, args);
}

static mpr_future_t *failed_future(mpr_err_t code) {
    mpr_future_t *f = mpr_future_create();
    if (f) mpr_future_set_error(f, code, mpr_last_error());
    return f;
}

mpr_future_t *mpr_rref_rpc_async(mpr_rref_t *r, const char *fn, const mpr_value_t *args, double timeout_s) {
    if (!r) return failed_future(mpri_null_arg(__func__, "r"));
    if (!fn) return failed_future(mpri_null_arg(__func__, "fn"));
    mpr_value_t *list = proxy_prepare(r, "rref rpc_async", args);
    if (!list) {
        mpr_err_t code = mpr_last_error_code() ? mpr_last_error_code() : MPR_ERR_INVALID_ARG;
        mpr_future_t *f = mpr_future_create();
        if (f) mpr_future_set_error(f, code, mpr_last_error());
        return f;
    }
    mpr_future_t *f = mpr_rpc_async(mpr_to_rank(r->owner_rank), fn, list, timeout_s);
    mpr_value_release(list);
    return f;
}

mpr_err_t mpr_rref_rpc_sync(mpr_rref_t *r, const char *fn, const mpr_value_t *args, double timeout_s,
                            mpr_value_t **result) {
    if (result) *result = NULL;
    MPRI_ARG_NONNULL(r);
    MPRI_ARG_NONNULL(fn);
    MPRI_ARG_NONNULL(result);
    if (!result) return mpr_error_set(MPR_ERR_INVALID_ARG, "rref rpc_sync: result pointer is NULL");
    mpr_future_t *f = mpr_rref_rpc_async(r, fn, args, timeout_s);
    if (!f) return mpr_last_error_code();
    mpr_err_t e = mpr_future_get(f, MPR_WAIT_FOREVER, result);
    mpr_future_release(f);
    return e;
}

mpr_rref_t *mpr_rref_remote(mpr_rref_t *r, const char *fn, const mpr_value_t *args, double timeout_s) {
    MPRI_ARG_NONNULL_OR(r, NULL);
    MPRI_ARG_NONNULL_OR(fn, NULL);
    mpr_value_t *list = proxy_prepare(r, "rref remote", args);
    if (!list) return NULL;
    mpr_rref_t *out = mpr_remote(mpr_to_rank(r->owner_rank), fn, list, timeout_s);
    mpr_value_release(list);
    return out;
}

mpr_err_t mpr_rref_self(const mpr_value_t *args, const mpr_type_t *type, void **obj) {
    if (obj) *obj = NULL;
    MPRI_ARG_NONNULL(args);
    MPRI_ARG_NONNULL(obj);
    mpr_rref_t *r;
    mpr_err_t e = mpr_args_rref(args, 0, &r);
    if (e) return e;
    if (!r->is_owner)
        return mpr_error_set(MPR_ERR_NOT_OWNER, "rref self: the RRef in argument 0 is owned by %s, not by this worker",
                             r->owner_name);
    if (!mpr_future_done(r->owner->value))
        return mpr_error_set(MPR_ERR_STATE, "rref self: the value is still being created");
    if (mpr_future_error(r->owner->value) != MPR_OK) {
        /* a creation that failed remotely keeps its origin (worker, code) */
        const mpri_remote_error_t *re = mpri_future_remote_error(r->owner->value);
        if (re) return mpri_error_set_remote(re);
        return mpr_error_set(mpr_future_error(r->owner->value), "rref self: %s",
                             mpr_future_error_message(r->owner->value));
    }
    return mpr_value_get_object(mpri_future_value(r->owner->value), type, obj);
}
