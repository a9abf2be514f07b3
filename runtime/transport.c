/* transport.c — messages out and in: send (MPI or local loopback), freeing
 * and decoding incoming messages, requests with reply futures, replies.
 * (Dispatch of complete incoming messages: dispatch.c.)
 *
 * Invariants:
 * - A message's tensors travel in batches on the message's data tag, sent
 *   from the tensors' own storage (no serialization copy; see
 *   mpri_tensor_batches.h).
 * - msgs_sent is incremented before a message can be received anywhere and
 *   msgs_processed only after the receiver finished with it (mpri_msg_done),
 *   including any reply it sent; graceful shutdown relies on this.
 * - Sends never hold a lock across MPI calls. Outside the progress context a
 *   send waits for its MPI requests; inside it they are tracked and polled.
 * - A reply whose request is no longer pending (timed out) is dropped. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_error.h"
#include "mpri_event.h"
#include "mpri_future.h"
#include "mpri_runtime.h"
#include "mpri_tensor.h"
#include "mpri_tensor_batches.h"

const char *mpri_mpi_error_string(int code, char *buf, int len) {
    int n = 0;
    if (MPI_Error_string(code, buf, &n) != MPI_SUCCESS) snprintf(buf, (size_t)len, "MPI error %d", code);
    return buf;
}

/* Each thread keeps one spare encode buffer (up to 64 KiB), so building and
 * sending a small message allocates nothing in the steady state. A thread
 * key frees it when the thread exits. */
#define SPARE_MAX ((size_t)64 << 10)
static pthread_key_t spare_key;
static pthread_once_t spare_once = PTHREAD_ONCE_INIT;
static _Thread_local mpri_buf_t spare;

static void spare_free(void *unused) {
    mpri_buf_fini(&spare);
}

static void spare_key_create(void) { pthread_key_create(&spare_key, spare_free); }

void mpri_outmsg_init(mpri_outmsg_t *m, int kind) {
    memset(&m->hdr, 0, sizeof m->hdr);
    m->hdr.kind = (uint8_t)kind;
    if (spare.data) {
        m->body = spare;
        m->body.len = 0;
        memset(&spare, 0, sizeof spare);
    } else {
        mpri_buf_init(&m->body);
    }
    if (mpri_buf_reserve(&m->body, 256)) { /* else `failed` is set and mpri_send reports it */
        m->body.len = sizeof(mpri_wire_header_t); /* room for the header */
        memset(m->body.data, 0, m->body.len);
    }
    mpri_tensor_list_init(&m->tensors);
}

void mpri_outmsg_fini(mpri_outmsg_t *m) {
    if (m->body.data && !m->body.failed && m->body.cap <= SPARE_MAX && !spare.data) {
        pthread_once(&spare_once, spare_key_create);
        pthread_setspecific(spare_key, &spare); /* non-NULL: the destructor runs at exit */
        spare = m->body;
        memset(&m->body, 0, sizeof m->body);
    }
    mpri_buf_fini(&m->body);
    mpri_tensor_list_fini(&m->tensors);
}

static void msg_free(mpri_msg_t *msg) {
    if (msg->tensors) {
        for (uint32_t i = 0; i < msg->hdr.tensor_count; i++) mpr_tensor_release(msg->tensors[i]);
        free(msg->tensors);
    }
    free(msg->reqs);
    if (!msg->data_inline) free(msg->data);
    free(msg);
}

void mpri_msg_done(mpri_msg_t *msg) {
    int src = msg->src;
    msg_free(msg);
    mpri_count_processed(src);
}

mpr_err_t mpri_msg_decode_value(const mpri_msg_t *msg, size_t skip, mpr_value_t **out) {
    if (skip > msg->hdr.body_len) return mpr_error_set(MPR_ERR_DECODE, "body shorter than %zu bytes", skip);
    mpri_reader_t r;
    mpri_reader_init(&r, msg->body + skip, msg->hdr.body_len - skip);
    mpr_err_t e = mpri_value_decode(&r, msg->tensors, msg->hdr.tensor_count, msg->src, out);
    if (e == MPR_OK && r.left != 0) {
        mpr_value_release(*out);
        *out = NULL;
        e = mpr_error_set(MPR_ERR_DECODE, "%zu trailing bytes after the value", r.left);
    }
    return e;
}

/* Deliver to ourselves without MPI: the message shares the tensors. */
static mpr_err_t send_local(mpri_outmsg_t *m) {
    mpri_msg_t *msg = calloc(1, sizeof *msg);
    if (!msg) {
        mpri_outmsg_fini(m);
        return mpr_error_set(MPR_ERR_NOMEM, "send: out of memory");
    }
    msg->hdr = m->hdr;
    msg->src = mpri_rt.rank;
    msg->data = mpri_buf_steal(&m->body, &msg->len);
    msg->body = msg->data + sizeof(mpri_wire_header_t);
    msg->tensors = m->tensors.items; /* references move to the message */
    m->tensors.items = NULL;
    m->tensors.len = 0;
    mpri_tensor_list_fini(&m->tensors);
    mpri_count_sent(msg->src);
    mpri_dispatch(msg);
    return MPR_OK;
}

mpr_err_t mpri_send(int dst, mpri_outmsg_t *m) {
    if (m->body.failed) {
        mpri_outmsg_fini(m);
        return mpr_error_set(MPR_ERR_NOMEM, "send: out of memory while encoding");
    }
    if (dst < 0 || dst >= mpri_rt.size) {
        mpri_outmsg_fini(m);
        return mpr_error_set(MPR_ERR_INVALID_ARG, "send: rank %d outside [0, %d)", dst, mpri_rt.size);
    }
    if (mpri_peer_gone(dst) && m->hdr.kind != MPRI_MSG_LEAVE_ACK) { /* shutdown.c: it left the job */
        mpri_outmsg_fini(m);
        return mpr_error_set(MPR_ERR_SHUTDOWN, "%s (rank %d) has left the job (it called mpr_shutdown(false))",
                             mpri_rt.workers ? mpri_rt.workers[dst].name : "?", dst);
    }
    mpri_wire_header_t *h = &m->hdr;
    h->magic = MPRI_WIRE_MAGIC;
    h->version = MPRI_WIRE_VERSION;
    h->body_len = (uint32_t)(m->body.len - sizeof *h);
    h->tensor_count = m->tensors.len;
    if (h->tensor_count) {
        unsigned c = atomic_fetch_add(&mpri_rt.data_tag_counter, 1);
        h->data_tag = MPRI_TAG_DATA_FIRST + c % (unsigned)(mpri_rt.tag_ub - MPRI_TAG_DATA_FIRST);
        h->batch_count = mpri_batches_plan(m->tensors.items, m->tensors.len, NULL);
        mpri_tensor_descs_encode(&m->tensors, &m->body);
    }
    if (m->body.failed || m->body.len > MPRI_MAX_MESSAGE_BYTES) {
        size_t len = m->body.len;
        mpri_outmsg_fini(m);
        return mpr_error_set(MPR_ERR_INVALID_ARG, "send: message of %zu bytes is too large", len);
    }
    memcpy(m->body.data, h, sizeof *h);
    if (dst == mpri_rt.rank) return send_local(m);

    if (h->tensor_count == 0 && !mpri_in_progress_context()) {
        /* Small control-free path: one blocking standard send. */
        mpri_count_sent(dst);
        int rc = MPI_Send(m->body.data, (int)m->body.len, MPI_BYTE, dst, MPRI_TAG_AM, mpri_rt.comm);
        mpri_outmsg_fini(m);
        if (rc != MPI_SUCCESS) {
            char text[MPI_MAX_ERROR_STRING];
            mpri_uncount_sent(dst);
            return mpr_error_set(MPR_ERR_MPI, "send to rank %d failed: %s", dst,
                                 mpri_mpi_error_string(rc, text, sizeof text));
        }
        return MPR_OK;
    }
    /* The body, then the tensors in batches (mpri_tensor_batches.h). */
    uint32_t nt = h->tensor_count;
    mpri_batch_scratch_t scratch;
    MPI_Request stack_reqs[MPRI_BATCH_SCRATCH_INLINE + 1];
    MPI_Request *reqs = nt <= MPRI_BATCH_SCRATCH_INLINE ? stack_reqs : malloc(sizeof *reqs * (nt + 1));
    if (!reqs || !mpri_batch_scratch_init(&scratch, nt)) {
        if (reqs != stack_reqs) free(reqs);
        mpri_outmsg_fini(m);
        return mpr_error_set(MPR_ERR_NOMEM, "send: out of memory");
    }
    uint32_t nbatches = mpri_batches_plan(m->tensors.items, nt, scratch.starts);
    int n = 1 + (int)nbatches;
    mpri_count_sent(dst);
    int posted = 0, rc = MPI_Isend(m->body.data, (int)m->body.len, MPI_BYTE, dst, MPRI_TAG_AM,
                                   mpri_rt.comm, &reqs[0]);
    if (rc == MPI_SUCCESS) posted = 1;
    for (uint32_t b = 0; rc == MPI_SUCCESS && b < nbatches; b++) {
        rc = mpri_batch_post(true, m->tensors.items, scratch.starts[b], scratch.starts[b + 1], dst,
                             (int)h->data_tag, mpri_rt.comm, scratch.lens, scratch.displs, &reqs[1 + b]);
        if (rc == MPI_SUCCESS) posted++;
    }
    mpri_batch_scratch_fini(&scratch);
    if (rc != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING];
        if (posted == 0) mpri_uncount_sent(dst);
        MPI_Waitall(posted, reqs, MPI_STATUSES_IGNORE);
        if (reqs != stack_reqs) free(reqs);
        mpri_outmsg_fini(m);
        return mpr_error_set(MPR_ERR_MPI, "send to rank %d failed: %s", dst,
                             mpri_mpi_error_string(rc, text, sizeof text));
    }
    if (mpri_in_progress_context()) {
        MPI_Request *heap = reqs;
        if (reqs == stack_reqs) {
            heap = malloc(sizeof *heap * (size_t)n);
            if (!heap) { /* cannot track: complete it here (small control messages) */
                MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE);
                mpri_outmsg_fini(m);
                return MPR_OK;
            }
            memcpy(heap, reqs, sizeof *heap * (size_t)n);
        }
        size_t len;
        void *buf = mpri_buf_steal(&m->body, &len);
        mpri_progress_track_send(heap, n, buf, &m->tensors);
        mpri_tensor_list_init(&m->tensors);
        return MPR_OK;
    }
    rc = MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE);
    if (reqs != stack_reqs) free(reqs);
    mpri_outmsg_fini(m);
    if (rc != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING];
        return mpr_error_set(MPR_ERR_MPI, "send to rank %d failed: %s", dst,
                             mpri_mpi_error_string(rc, text, sizeof text));
    }
    return MPR_OK;
}

/* ---- replies ---- */

/* Error reply body: u32 code, blob text, and for a remote failure with a
 * known origin its extension (mpri_error.h). */
static mpr_err_t reply_error_body(mpri_outmsg_t *m, const mpri_msg_t *req, mpr_err_t code,
                                  const char *message, const mpri_remote_error_t *re) {
    m->hdr.flags = MPRI_FLAG_RESPONSE | MPRI_FLAG_ERROR;
    m->hdr.request_id = req->hdr.request_id;
    mpri_buf_put_u32(&m->body, (uint32_t)code);
    mpri_buf_put_blob(&m->body, message, strlen(message));
    if (re && code == MPR_ERR_REMOTE) mpri_remote_error_write(&m->body, re);
    return mpri_send(req->src, m);
}

mpr_err_t mpri_reply_error(const mpri_msg_t *req, mpr_err_t code, const char *message) {
    if (!(req->hdr.flags & MPRI_FLAG_EXPECTS_REPLY)) return MPR_OK;
    mpri_outmsg_t m;
    mpri_outmsg_init(&m, MPRI_MSG_EXCEPTION);
    return reply_error_body(&m, req, code, message ? message : mpr_strerror(code), NULL);
}

mpr_err_t mpri_reply_future_error(const mpri_msg_t *req, const mpr_future_t *f) {
    if (!(req->hdr.flags & MPRI_FLAG_EXPECTS_REPLY)) return MPR_OK;
    mpri_outmsg_t m;
    mpri_outmsg_init(&m, MPRI_MSG_EXCEPTION);
    return reply_error_body(&m, req, mpr_future_error(f), mpr_future_error_message(f), mpri_future_remote_error(f));
}

mpr_err_t mpri_reply_value(const mpri_msg_t *req, int kind, const mpr_value_t *v) {
    if (!(req->hdr.flags & MPRI_FLAG_EXPECTS_REPLY)) return MPR_OK;
    mpri_outmsg_t m;
    mpri_outmsg_init(&m, kind);
    m.hdr.flags = MPRI_FLAG_RESPONSE;
    m.hdr.request_id = req->hdr.request_id;
    mpr_err_t e = mpri_value_encode(v ? v : mpr_value_new_none(), &m.body, &m.tensors, req->src);
    if (e) {
        char text[MPR_ERROR_TEXT_MAX];
        snprintf(text, sizeof text, "On %s: cannot send the result: %s",
                 mpri_rt.workers[mpri_rt.rank].name, mpr_last_error());
        mpri_outmsg_fini(&m);
        return mpri_reply_error(req, e, text);
    }
    return mpri_send(req->src, &m);
}

/* ---- requests ---- */

mpr_future_t *mpri_request(int dst, mpri_outmsg_t *m, double timeout_s, const char *label) {
    mpr_future_t *f = mpr_future_create();
    if (!f) {
        mpri_outmsg_fini(m);
        return NULL;
    }
    uint64_t id = atomic_fetch_add(&mpri_rt.next_request_id, 1);
    m->hdr.request_id = id;
    m->hdr.flags |= MPRI_FLAG_EXPECTS_REPLY;
    if (timeout_s < 0) timeout_s = mpri_rt.default_timeout_s;
    int64_t deadline = timeout_s > 0 ? mpri_now_ns() + (int64_t)(timeout_s * 1e9) : 0;
    mpr_err_t e = mpri_pending_add(id, mpr_future_retain(f), deadline, dst, label);
    if (e) {
        mpr_future_release(f); /* the reference meant for the table */
        mpri_outmsg_fini(m);
        mpri_future_complete(f, e, mpr_last_error(), NULL);
        return f;
    }
    e = mpri_send(dst, m);
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
