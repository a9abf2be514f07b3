/* request.c — requests with reply futures: register the future as pending
 * (with the call's deadline), send, and let the caller drain what has
 * arrived.
 *
 * Invariants: the future is pending before the request can be received, so
 * a reply always finds it (or finds it already timed out and is dropped);
 * the send never blocks and gives up when the call's deadline passes, so no
 * caller waits in MPI past its deadline (the timer in pending.c fails the
 * future on time). */
#include "mpri_event.h"
#include "mpri_future.h"
#include "mpri_runtime.h"
#include "mpri_trace.h"

mpr_future_t *mpri_request(int dst, mpri_outmsg_t *m, double timeout_s, const char *label) {
    mpr_future_t *f = mpr_future_create();
    if (!f) {
        mpri_outmsg_fini(m);
        return NULL;
    }
    mpri_future_mark_runtime_owned(f);
    uint64_t id = atomic_fetch_add(&mpri_rt.next_request_id, 1);
    m->hdr.request_id = id;
    m->hdr.flags |= MPRI_FLAG_EXPECTS_REPLY;
    if (timeout_s < 0) timeout_s = mpri_rt.default_timeout_s;
    int64_t deadline = timeout_s > 0 ? mpri_now_ns() + (int64_t)(timeout_s * 1e9) : 0;
    uint64_t fn = m->hdr.function_id;
    mpr_err_t e = mpri_pending_add_call(id, mpr_future_retain(f), deadline, dst, label, fn);
    if (e) {
        mpr_future_release(f); /* the reference meant for the table */
        mpri_outmsg_fini(m);
        mpri_future_complete(f, e, mpr_last_error(), NULL);
        return f;
    }
    uint64_t bytes_out = m->wire.len + m->tensors.total_bytes;
    e = mpri_send_until(dst, m, deadline);
    if (e == MPR_OK && fn && mpri_observing(MPRI_OBSERVE_STATS)) mpri_stats_call_sent(fn, label, bytes_out);
    /* The caller drains what has arrived (one try, no waiting): with calls
     * in flight, replies are received by the thread that issues the calls
     * instead of a second thread per rank competing for the cores and for
     * MPI's locks (pipelined no-op calls: ~250k/s -> ~450-650k/s). */
    if (e == MPR_OK && !mpri_in_progress_context()) mpri_progress_poll();
    if (e) {
        mpr_future_t *pending = mpri_pending_take(id);
        if (pending) {
            mpri_future_complete(pending, e, mpr_last_error(), NULL);
            mpr_future_release(pending);
        }
    }
    return f;
}
