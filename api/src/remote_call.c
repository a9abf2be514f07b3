/* remote_call.c — the REMOTE_CALL kind of the one call path (mpri_call.h):
 * run a registered function and keep its result in an OwnerRRef.
 *
 * REMOTE_CALL body: u16 name length, name, gid rref id, gid fork id, args
 * value (fork id == rref id: remote on self, no fork). Reply: REMOTE_RET with
 * no value, or the error.
 *
 * Invariants: the creator's fork is recorded in the owner record as soon as
 * the ids are read, before anything can fail (its user will send a delete
 * whatever the outcome); the owner record's creation completes exactly once,
 * in settle, before the reply, with the value or the same error the caller
 * gets (a remote failure with its origin: set as the thread's error first,
 * mpr_future_set_error keeps it). */
#include <stdlib.h>

#include "mpri_call.h"
#include "mpri_error.h"
#include "mpri_future.h"
#include "mpri_rref.h"

static mpr_err_t remote_read_fields(mpri_reader_t *r, const mpri_msg_t *msg, void **state) {
    (void)msg;
    mpri_gid_t id, fork;
    mpr_err_t e;
    if ((e = mpri_gid_read(r, &id)) || (e = mpri_gid_read(r, &fork))) return e;
    mpri_owner_t *o = mpri_owner_get_or_create(id);
    if (!o) return mpr_last_error_code();
    if (!mpri_gid_eq(fork, id)) mpri_owner_add_fork(o, fork);
    *state = o;
    return MPR_OK;
}

static const mpr_value_t *remote_settle(void *state, mpr_future_t *outcome) {
    mpri_owner_t *o = state;
    if (!outcome)
        mpri_owner_set_value(o, MPR_ERR_NOMEM, "remote call: out of memory", NULL);
    else if (mpr_future_error(outcome) == MPR_OK)
        mpri_owner_set_value(o, MPR_OK, NULL, mpri_future_value(outcome));
    else if (mpri_future_remote_error(outcome)) /* the owner's value keeps the failure's origin: */
        mpri_owner_set_value(o, mpri_error_set_remote(mpri_future_remote_error(outcome)), mpr_last_error(), NULL);
    else
        mpri_owner_set_value(o, mpr_future_error(outcome), mpr_future_error_message(outcome), NULL);
    mpri_owner_release(o);
    return NULL; /* REMOTE_RET carries no value */
}

static const mpri_call_kind_t remote_call_kind = {"remote call", MPRI_MSG_REMOTE_RET, remote_read_fields,
                                                  remote_settle};

static void handle_remote_call(mpri_msg_t *msg) { mpri_call_handle(msg, &remote_call_kind); }

static void reject_remote_call(mpri_msg_t *msg, mpr_err_t code, const char *text, bool reply) {
    mpri_call_reject(msg, &remote_call_kind, code, text, reply);
}

mpr_err_t mpri_remote_call_install(void) {
    mpr_err_t e = mpri_set_handler(MPRI_MSG_REMOTE_CALL, handle_remote_call, false);
    return e ? e : mpri_set_reject_handler(MPRI_MSG_REMOTE_CALL, reject_remote_call);
}
