/* rpc.c — the caller side: mpr_rpc_async / mpr_rpc_sync.
 *
 * Invariant: mpr_rpc_async never fails silently — every problem (runtime not
 * running, unknown destination, bad function name, unencodable arguments)
 * completes the returned future with an error naming the call. */
#include <stdio.h>
#include <string.h>

#include "mpri_args.h"
#include "mpri_future.h"
#include "mpri_registry.h"
#include "mpri_rpc.h"
#include "mpri_rref_proto.h"
#include "mpri_runtime.h"

static mpr_future_t *failed_future(mpr_err_t code) {
    mpr_future_t *f = mpr_future_create();
    if (f) mpr_future_set_error(f, code, mpr_last_error());
    return f;
}

mpr_future_t *mpri_rpc_async_sent(mpr_dest_t to, const char *fn, const mpr_value_t *args, double timeout_s,
                                  bool *left) {
    *left = false;
    if (!fn) return failed_future(mpri_null_arg("mpr_rpc_async", "fn"));
    mpr_err_t e = mpri_check_running("rpc");
    if (e) return failed_future(e);
    int rank;
    if ((e = mpr_dest_rank(to, &rank))) return failed_future(e);
    mpri_outmsg_t m;
    if ((e = mpri_call_msg_begin(&m, MPRI_MSG_CALL, "rpc", fn, args))) return failed_future(e);
    /* RRefs in the arguments register forks as they are encoded: kept only
     * if the message leaves (a reply future or a send that fails first
     * would otherwise leave the owner's value forked for good). */
    size_t mark = mpri_rref_encode_begin();
    if ((e = mpri_call_msg_args(&m, "rpc", fn, args, rank))) {
        mpri_rref_encode_end(mark, false);
        return failed_future(e);
    }
    char label[80] = "rpc '"; /* "rpc '<fn, at most 60 chars>'", without printf's cost on every call */
    size_t fn_len = strnlen(fn, 60);
    memcpy(label + 5, fn, fn_len);
    memcpy(label + 5 + fn_len, "'", 2);
    mpr_future_t *f = mpri_request(rank, &m, timeout_s, label);
    mpri_rref_encode_end(mark, m.left);
    *left = m.left;
    return f;
}

mpr_future_t *mpr_rpc_async(mpr_dest_t to, const char *fn, const mpr_value_t *args, double timeout_s) {
    bool left;
    return mpri_rpc_async_sent(to, fn, args, timeout_s, &left);
}

mpr_err_t mpr_rpc_sync(mpr_dest_t to, const char *fn, const mpr_value_t *args, double timeout_s,
                       mpr_value_t **result) {
    if (result) *result = NULL;
    MPRI_ARG_NONNULL(fn);
    MPRI_ARG_NONNULL(result);
    if (!result) return mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_rpc_sync: result pointer is NULL");
    mpr_future_t *f = mpr_rpc_async(to, fn, args, timeout_s);
    if (!f) return mpr_last_error_code();
    mpr_err_t e = mpr_future_get(f, MPR_WAIT_FOREVER, result);
    mpr_future_release(f);
    return e;
}
