/* call_msg.c — building the messages that ask a worker to run a registered
 * function (CALL for rpc, REMOTE_CALL for remote): the checks, the function
 * id and name, the argument list.
 *
 * Invariant: a message that fails to build is freed here, and every error
 * detail names the kind of call and the function. The call hooks'
 * on_send_request (mpri_call.h) sees every message built, after its
 * arguments. */
#include <stdio.h>
#include <string.h>

#include "mpri_call.h"
#include "mpri_registry.h"
#include "mpri_runtime.h"

mpr_err_t mpri_call_msg_begin(mpri_outmsg_t *m, int kind, const char *what, const char *fn,
                              const mpr_value_t *args) {
    if (!fn || !*fn || strlen(fn) > MPRI_MAX_FUNCTION_NAME)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: function name must be 1 to %d bytes", what,
                             MPRI_MAX_FUNCTION_NAME);
    if (args && mpr_value_kind(args) != MPR_VALUE_LIST)
        return mpr_error_set(MPR_ERR_TYPE, "%s '%s': arguments must be a list value (got %s)", what, fn,
                             mpr_value_kind_name(mpr_value_kind(args)));
    mpri_outmsg_init(m, kind);
    m->hdr.function_id = mpri_hash_name(fn);
    size_t len = strlen(fn);
    mpri_buf_put_u16(&m->wire, (uint16_t)len);
    mpri_buf_put(&m->wire, fn, len);
    return MPR_OK;
}

mpr_err_t mpri_call_msg_args(mpri_outmsg_t *m, const char *what, const char *fn, const mpr_value_t *args,
                             int dst_rank) {
    mpr_err_t e = MPR_OK;
    if (!args) { /* no arguments: an empty list, written without building one */
        mpri_buf_put_u8(&m->wire, MPR_VALUE_LIST);
        mpri_buf_put_u32(&m->wire, 0);
    } else {
        e = mpri_value_encode(args, &m->wire, &m->tensors, dst_rank);
    }
    const mpri_call_hooks_t *hooks = mpri_call_hooks();
    if (!e && hooks->on_send_request) {
        mpr_error_clear();
        e = hooks->on_send_request(m, args, dst_rank);
        if (e && !mpr_last_error()[0]) mpr_error_set(e, "%s", mpr_strerror(e));
    }
    if (e) {
        char detail[MPR_ERROR_TEXT_MAX];
        snprintf(detail, sizeof detail, "%s", mpr_last_error());
        mpri_outmsg_fini(m);
        mpr_error_set(e, "%s '%s': cannot send the arguments: %s", what, fn, detail);
    }
    return e;
}
