/* transport.c — messages out and in: non-blocking sends (MPI, or the local
 * inbox for messages to ourselves) and the sends still in flight; freeing
 * and decoding incoming messages; replies. (Requests with reply futures:
 * request.c; dispatch of complete incoming messages: dispatch.c; receiving:
 * progress.c, which drives the sends in flight and the local inbox.)
 *
 * Invariants:
 * - A message's tensors travel in batches on the message's data tag, sent
 *   from the tensors' own storage, except that small tensors apart in
 *   memory are packed into one buffer per message, owned like the encoded
 *   bytes (no copy of a tensor of 64 KiB or more; see
 *   mpri_tensor_batches.h), and that a message to another rank whose
 *   tensors hold at most MPRI_INLINE_TENSOR_BYTES carries their bytes
 *   itself, after the descriptors (mpri_wire.h), with no batch.
 * - msgs_sent is incremented before a message can be received anywhere and
 *   msgs_processed only after the receiver finished with it (mpri_msg_done),
 *   including any reply it sent; graceful shutdown relies on this.
 * - No send blocks in MPI: every MPI request is posted with MPI_Isend and
 *   tested once; what is not complete becomes a send in flight, which owns
 *   the encoded bytes and a reference to each tensor until MPI is done with
 *   them. No lock is held across an MPI call.
 * - A send in flight past its give-up time (the deadline of the call it
 *   belongs to, else the default timeout) is abandoned: it no longer counts
 *   as busy and is tested only now and then; its buffers are freed only once
 *   MPI completes it, or never (a peer that stopped never receives it).
 * - A message to ourselves is queued in the local inbox and dispatched by
 *   the next poll, like any received message. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_doorbell.h"
#include "mpri_error.h"
#include "mpri_event.h"
#include "mpri_future.h"
#include "mpri_host_alloc.h"
#include "mpri_runtime.h"
#include "mpri_tensor.h"
#include "mpri_tensor_batches.h"
#include "mpri_trace.h"

const char *mpri_mpi_error_string(int code, char *buf, int len) {
    int n = 0;
    if (MPI_Error_string(code, buf, &n) != MPI_SUCCESS) snprintf(buf, (size_t)len, "MPI error %d", code);
    return buf;
}

/* Each thread keeps one spare encode buffer (up to 64 KiB), so building and
 * sending a small message allocates nothing in the steady state. A thread
 * key frees it when the thread exits. */
#define SPARE_MAX ((size_t)64 << 10)
#define OUTMSG_FIRST_BYTES 1024 /* a fresh encode buffer's size */
static pthread_key_t spare_key;
static pthread_once_t spare_once = PTHREAD_ONCE_INIT;
static _Thread_local mpri_buf_t spare;

static void spare_free(void *unused) {
    mpri_buf_fini(&spare);
}

static void spare_key_create(void) { pthread_key_create(&spare_key, spare_free); }

/* Fresh-sized buffers (OUTMSG_FIRST_BYTES) whose send completed on a thread
 * that had a spare already: a message carrying a tensor completes only once
 * the receiver took it, usually on another thread than the one that built
 * it, which would otherwise allocate a buffer for each such message. A few
 * lock-free slots; each holds a buffer or NULL, and a buffer is in one
 * slot at most (exchanged in, exchanged out). Emptied at stop. */
#define STASH_SLOTS 4
static _Atomic(uint8_t *) stash[STASH_SLOTS];

static bool stash_put(uint8_t *data) {
    for (int i = 0; i < STASH_SLOTS; i++) {
        uint8_t *expected = NULL;
        if (atomic_compare_exchange_strong(&stash[i], &expected, data)) return true;
    }
    return false;
}

static uint8_t *stash_take(void) {
    for (int i = 0; i < STASH_SLOTS; i++)
        if (atomic_load_explicit(&stash[i], memory_order_relaxed)) {
            uint8_t *d = atomic_exchange(&stash[i], NULL);
            if (d) return d;
        }
    return NULL;
}

void mpri_transport_cache_trim(void) {
    for (uint8_t *d; (d = stash_take());) free(d);
}

/* A buffer of `cap` bytes that is no longer needed: kept for reuse when it
 * has the fresh size, else freed. */
static void buffer_done(uint8_t *data, size_t cap) {
    if (data && cap == OUTMSG_FIRST_BYTES && stash_put(data)) return;
    free(data);
}

void mpri_outmsg_init(mpri_outmsg_t *m, int kind) {
    memset(&m->hdr, 0, sizeof m->hdr);
    m->left = false;
    m->hdr.kind = (uint8_t)kind;
    uint8_t *stashed;
    if (spare.data) {
        m->wire = spare;
        m->wire.len = 0;
        memset(&spare, 0, sizeof spare);
    } else if ((stashed = stash_take())) {
        m->wire = (mpri_buf_t){.data = stashed, .cap = OUTMSG_FIRST_BYTES};
    } else {
        mpri_buf_init(&m->wire);
    }
    /* Room for a message carrying a small tensor inline (mpri_wire.h): the
     * spare is often gone (a send that completes later frees its buffer on
     * the thread that sees it done), and a buffer grown while sending costs
     * a realloc and a copy. */
    if (mpri_buf_reserve(&m->wire, OUTMSG_FIRST_BYTES)) { /* else `failed` is set and mpri_send reports it */
        m->wire.len = sizeof(mpri_wire_header_t); /* room for the header */
        memset(m->wire.data, 0, m->wire.len);
    }
    mpri_tensor_list_init(&m->tensors);
}

void mpri_outmsg_fini(mpri_outmsg_t *m) {
    if (m->wire.data && !m->wire.failed && m->wire.cap <= SPARE_MAX && !spare.data) {
        pthread_once(&spare_once, spare_key_create);
        pthread_setspecific(spare_key, &spare); /* non-NULL: the destructor runs at exit */
        spare = m->wire;
        memset(&m->wire, 0, sizeof m->wire);
    }
    buffer_done(m->wire.data, m->wire.cap);
    memset(&m->wire, 0, sizeof m->wire);
    mpri_tensor_list_fini(&m->tensors);
}

bool mpri_msg_tensors_alloc(mpri_msg_t *msg, uint32_t n) {
    if (n <= sizeof msg->inline_tensors / sizeof msg->inline_tensors[0]) {
        memset(msg->inline_tensors, 0, sizeof msg->inline_tensors);
        msg->tensors = msg->inline_tensors;
    } else {
        msg->tensors = calloc(n, sizeof *msg->tensors);
    }
    return msg->tensors != NULL;
}

void mpri_msg_tensors_free(mpri_msg_t *msg) {
    if (msg->tensors != msg->inline_tensors) free(msg->tensors);
    msg->tensors = NULL;
}

static void msg_free(mpri_msg_t *msg) {
    if (msg->tensors) {
        /* Shared counters dropped once per run of tensors (mpri_tensor.h);
         * entries a decode took over are NULL. */
        mpri_tensor_release_batch_t batch = {0};
        for (uint32_t i = 0; i < msg->hdr.tensor_count; i++) mpri_tensor_release_deferred(msg->tensors[i], &batch);
        mpri_tensor_release_flush(&batch);
        mpri_msg_tensors_free(msg);
    }
    free(msg->placement);
    free(msg->reqs);
    if (msg->plan) {
        mpri_batch_scratch_fini(msg->plan);
        free(msg->plan);
    }
    if (!msg->data_inline) free(msg->data);
    free(msg);
}

void mpri_msg_done(mpri_msg_t *msg) {
    int src = msg->src;
    msg_free(msg);
    mpri_count_processed(src);
}

/* mpri_msg_decode_value and mpri_msg_take_value. */
static mpr_err_t msg_decode(mpri_msg_t *msg, size_t skip, bool take, mpr_value_t **out) {
    if (skip > msg->hdr.body_len) return mpr_error_set(MPR_ERR_DECODE, "body shorter than %zu bytes", skip);
    /* Device tensors arrived in host memory: to their devices first, once,
     * on the thread that decodes (a handler's pool thread; for a reply, the
     * progress thread that completes its future). */
    mpri_reader_t r;
    mpri_reader_init(&r, msg->body + skip, msg->hdr.body_len - skip);
    mpr_err_t placed = mpri_tensor_placement_apply(msg->placement, msg->tensors);
    if (placed) {
        mpri_value_settle(&r, msg->src); /* the RRefs it carries are undone */
        return placed;
    }
    mpr_err_t e = take ? mpri_value_decode_taking(&r, msg->tensors, msg->hdr.tensor_count, msg->src, out)
                       : mpri_value_decode(&r, msg->tensors, msg->hdr.tensor_count, msg->src, out);
    if (e == MPR_OK && r.left != 0) {
        mpr_value_release(*out);
        *out = NULL;
        e = mpr_error_set(MPR_ERR_DECODE, "%zu trailing bytes after the value", r.left);
    }
    return e;
}

mpr_err_t mpri_msg_tensors(mpri_msg_t *msg, mpr_tensor_t *const **tensors, uint32_t *count) {
    mpr_err_t placed = mpri_tensor_placement_apply(msg->placement, msg->tensors);
    if (placed) return placed;
    *tensors = msg->tensors;
    *count = msg->hdr.tensor_count;
    return MPR_OK;
}

mpr_err_t mpri_msg_decode_value(const mpri_msg_t *msg, size_t skip, mpr_value_t **out) {
    /* Not taking, the message is not changed: only placement writes its
     * tensors array, as it always has. */
    return msg_decode((mpri_msg_t *)msg, skip, false, out);
}

mpr_err_t mpri_msg_take_value(mpri_msg_t *msg, size_t skip, mpr_value_t **out) {
    return msg_decode(msg, skip, true, out);
}

/* ---- sends in flight ---- */

typedef struct inflight {
    MPI_Request *reqs; /* n: the message, then its tensor batches (inline_reqs when n <= 2) */
    MPI_Request inline_reqs[2];
    int n;
    int dst;
    int64_t give_up_ns; /* 0: never */
    int64_t posted_ns;  /* when it was handed over (mpri_transport_describe) */
    void *bytes;        /* the encoded message */
    size_t bytes_cap;   /* its buffer's size (buffer_done) */
    void *packed;       /* small tensors packed for their batches (mpri_host_alloc), or NULL */
    size_t packed_bytes;
    mpri_tensor_list_t tensors;
    struct inflight *next;
} inflight_t;

static struct {
    pthread_mutex_t lock;
    inflight_t *active;    /* counted in `active_count` (busy) */
    inflight_t *abandoned; /* past their give-up time */
    atomic_long active_count, abandoned_count;
    atomic_ullong batches_posted; /* tensor data messages posted to other ranks (tests) */
    int64_t abandoned_tested_ns;
    pthread_mutex_t inbox_lock;
    mpri_msg_t *inbox_head, *inbox_tail; /* messages to ourselves */
} tx = {.lock = PTHREAD_MUTEX_INITIALIZER, .inbox_lock = PTHREAD_MUTEX_INITIALIZER};

long mpri_transport_sends_in_flight(void) { return atomic_load(&tx.active_count); }
long mpri_transport_sends_abandoned(void) { return atomic_load(&tx.abandoned_count); }
unsigned long long mpri_transport_batches_posted(void) { return atomic_load(&tx.batches_posted); }

static void inflight_free(inflight_t *s) {
    if (s->reqs != s->inline_reqs) free(s->reqs);
    buffer_done(s->bytes, s->bytes_cap);
    mpri_host_free(s->packed, s->packed_bytes);
    mpri_tensor_list_fini(&s->tensors);
    free(s);
}

/* Test the sends of `*list` (taken out of the table); complete ones are
 * freed, the rest returned. Counts completions in *done. */
static inflight_t *test_list(inflight_t *list, int *done) {
    inflight_t *keep = NULL;
    while (list) {
        inflight_t *s = list;
        list = s->next;
        int flag = 0;
        MPI_Testall(s->n, s->reqs, &flag, MPI_STATUSES_IGNORE);
        if (flag) {
            inflight_free(s);
            (*done)++;
        } else {
            s->next = keep;
            keep = s;
        }
    }
    return keep;
}

static void put_back(inflight_t **table_list, inflight_t *keep) {
    if (!keep) return;
    inflight_t *tail = keep;
    while (tail->next) tail = tail->next;
    tail->next = *table_list;
    *table_list = keep;
}

#define ABANDONED_TEST_NS 100000000 /* abandoned sends are tested every 100 ms */

int mpri_transport_progress_sends(int64_t now_ns) {
    if (!tx.active && !tx.abandoned) return 0; /* racy hint; the next poll sees a new one */
    pthread_mutex_lock(&tx.lock);
    inflight_t *active = tx.active, *abandoned = NULL;
    tx.active = NULL;
    if (tx.abandoned && now_ns - tx.abandoned_tested_ns > ABANDONED_TEST_NS) {
        abandoned = tx.abandoned;
        tx.abandoned = NULL;
        tx.abandoned_tested_ns = now_ns;
    }
    pthread_mutex_unlock(&tx.lock);
    int done = 0, abandoned_done = 0;
    active = test_list(active, &done);
    abandoned = test_list(abandoned, &abandoned_done);
    atomic_fetch_sub(&tx.active_count, done);
    atomic_fetch_sub(&tx.abandoned_count, abandoned_done);
    /* Sends past their give-up time stop counting as busy. */
    inflight_t *late = NULL, **link = &active;
    while (*link) {
        inflight_t *s = *link;
        if (s->give_up_ns && now_ns > s->give_up_ns) {
            *link = s->next;
            s->next = late;
            late = s;
            atomic_fetch_sub(&tx.active_count, 1);
            atomic_fetch_add(&tx.abandoned_count, 1);
        } else {
            link = &s->next;
        }
    }
    pthread_mutex_lock(&tx.lock);
    put_back(&tx.active, active);
    put_back(&tx.abandoned, abandoned);
    put_back(&tx.abandoned, late);
    pthread_mutex_unlock(&tx.lock);
    return done + abandoned_done;
}

/* Up to 16 sends of a list, copied under tx.lock (printed after it). */
typedef struct {
    int dst, n;
    int64_t posted_ns;
} send_seen_t;

static int copy_list(const inflight_t *s, send_seen_t *copy, int *total) {
    int n = 0;
    for (; s; s = s->next, (*total)++)
        if (n < 16) copy[n++] = (send_seen_t){s->dst, s->n, s->posted_ns};
    return n;
}

static void describe_list(FILE *out, const char *what, const send_seen_t *copy, int n, int total, int64_t now) {
    for (int i = 0; i < n; i++)
        fprintf(out, "  %s: to rank %d, %d parts (message and tensor batches), posted %.3f ms ago\n", what,
                copy[i].dst, copy[i].n, (double)(now - copy[i].posted_ns) / 1e6);
    if (total > n) fprintf(out, "  %s: ... %d in all\n", what, total);
}

void mpri_transport_describe(FILE *out, int64_t now) {
    fprintf(out, "  sends in flight: %ld, abandoned past their deadline: %ld\n", atomic_load(&tx.active_count),
            atomic_load(&tx.abandoned_count));
    /* Copied under the locks, printed after: a slow `out` must not hold up
     * the sends. A poll testing them holds them out of the table meanwhile. */
    send_seen_t active[16], abandoned[16];
    int n_active = 0, n_abandoned = 0, total_active = 0, total_abandoned = 0;
    if (mpri_describe_lock(out, &tx.lock, "sends in flight")) {
        n_active = copy_list(tx.active, active, &total_active);
        n_abandoned = copy_list(tx.abandoned, abandoned, &total_abandoned);
        pthread_mutex_unlock(&tx.lock);
    }
    describe_list(out, "send in flight", active, n_active, total_active, now);
    describe_list(out, "send abandoned", abandoned, n_abandoned, total_abandoned, now);
    if (mpri_describe_lock(out, &tx.inbox_lock, "messages to self")) {
        int local = 0;
        for (const mpri_msg_t *m = tx.inbox_head; m; m = m->next) local++;
        pthread_mutex_unlock(&tx.inbox_lock);
        if (local) fprintf(out, "  messages to self not yet taken: %d\n", local);
    }
}

void mpri_transport_stop(void) {
    mpri_transport_progress_sends(mpri_now_ns() + 2 * (int64_t)ABANDONED_TEST_NS);
    /* What is still in flight stays parked (MPI may still read the bytes). */
    pthread_mutex_lock(&tx.lock);
    put_back(&tx.abandoned, tx.active);
    tx.active = NULL;
    pthread_mutex_unlock(&tx.lock);
    atomic_fetch_add(&tx.abandoned_count, atomic_exchange(&tx.active_count, 0));
    mpri_msg_t *msg;
    while ((msg = mpri_transport_take_local())) mpri_msg_done(msg);
    mpri_transport_cache_trim();
}

/* Hand the posted requests of `m` to the sends in flight (the encoded bytes
 * and the tensor references move there). false: out of memory. */
static bool track(MPI_Request *reqs, int n, int dst, int64_t give_up_ns, mpri_outmsg_t *m, void *packed,
                  size_t packed_bytes) {
    inflight_t *s = malloc(sizeof *s);
    MPI_Request *copy = !s ? NULL : n <= 2 ? s->inline_reqs : malloc(sizeof *copy * (size_t)n);
    if (!s || !copy) {
        free(s);
        return false;
    }
    memcpy(copy, reqs, sizeof *copy * (size_t)n);
    s->reqs = copy;
    s->n = n;
    s->dst = dst;
    s->give_up_ns = give_up_ns;
    s->posted_ns = mpri_now_ns();
    size_t len;
    s->bytes_cap = m->wire.cap;
    s->bytes = mpri_buf_steal(&m->wire, &len);
    s->packed = packed;
    s->packed_bytes = packed_bytes;
    mpri_tensor_list_move(&s->tensors, &m->tensors);
    atomic_fetch_add(&tx.active_count, 1);
    pthread_mutex_lock(&tx.lock);
    s->next = tx.active;
    tx.active = s;
    pthread_mutex_unlock(&tx.lock);
    return true;
}

/* ---- the local inbox ---- */

mpri_msg_t *mpri_transport_take_local(void) {
    if (!tx.inbox_head) return NULL; /* racy hint, as above */
    pthread_mutex_lock(&tx.inbox_lock);
    mpri_msg_t *msg = tx.inbox_head;
    if (msg) {
        tx.inbox_head = msg->next;
        if (!tx.inbox_head) tx.inbox_tail = NULL;
        msg->next = NULL;
    }
    pthread_mutex_unlock(&tx.inbox_lock);
    return msg;
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
    msg->data = mpri_buf_steal(&m->wire, &msg->len);
    msg->body = msg->data + sizeof(mpri_wire_header_t);
    /* The callee gets its own tensor objects on the same bytes, flagged as a
     * remote callee's would be (autograd state is never shared with it); a
     * device tensor's callee copy is on its device, as a remote one's is. */
    uint32_t n = m->tensors.len;
    msg->tensors = NULL;
    mpr_err_t e = n && !mpri_msg_tensors_alloc(msg, n) ? mpr_error_set(MPR_ERR_NOMEM, "send: out of memory") : MPR_OK;
    for (uint32_t i = 0; !e && i < n; i++) {
        bool requires_grad = mpri_tensor_wire_requires_grad(m->tensors.orig[i]);
        int device = mpr_tensor_device(m->tensors.orig[i]);
        if (device < 0) {
            msg->tensors[i] = mpri_tensor_wire_alias(m->tensors.items[i], requires_grad);
            if (!msg->tensors[i]) e = mpr_error_set(MPR_ERR_NOMEM, "send: out of memory");
        } else if (!(msg->tensors[i] = mpri_tensor_wire_to_device(m->tensors.items[i], device))) {
            e = mpr_last_error_code();
        } else if (requires_grad && (e = mpri_tensor_wire_set_requires_grad(msg->tensors[i]))) {
            mpr_tensor_release(msg->tensors[i]);
            msg->tensors[i] = NULL;
        }
    }
    mpri_tensor_list_fini(&m->tensors);
    if (e) {
        for (uint32_t j = 0; msg->tensors && j < n; j++) mpr_tensor_release(msg->tensors[j]);
        mpri_msg_tensors_free(msg);
        free(msg->data);
        free(msg);
        return e;
    }
    mpri_count_sent(msg->src);
    pthread_mutex_lock(&tx.inbox_lock);
    if (tx.inbox_tail)
        tx.inbox_tail->next = msg;
    else
        tx.inbox_head = msg;
    tx.inbox_tail = msg;
    pthread_mutex_unlock(&tx.inbox_lock);
    m->left = true;
    mpri_event_signal();
    return MPR_OK;
}

static mpr_err_t mpi_failure(int dst, int rc) {
    char text[MPI_MAX_ERROR_STRING];
    return mpr_error_set(MPR_ERR_MPI, "send to rank %d failed: %s", dst, mpri_mpi_error_string(rc, text, sizeof text));
}

mpr_err_t mpri_send(int dst, mpri_outmsg_t *m) {
    int64_t give_up = 0;
    if (mpri_rt.default_timeout_s > 0) give_up = mpri_now_ns() + (int64_t)(mpri_rt.default_timeout_s * 1e9);
    return mpri_send_until(dst, m, give_up);
}

static mpr_err_t send_until(int dst, mpri_outmsg_t *m, int64_t give_up_ns);

/* Tracing/statistics on: the send, timed and counted (the header as it
 * leaves: kind, flags, ids; bytes: body and tensor data). */
static mpr_err_t send_observed(int dst, mpri_outmsg_t *m, int64_t give_up_ns) {
    mpri_wire_header_t h = m->hdr;
    uint64_t bytes = m->wire.len + m->tensors.total_bytes;
    bool traced = mpri_observing(MPRI_OBSERVE_TRACE);
    int64_t t0 = traced ? mpri_now_ns() : 0;
    mpr_err_t e = send_until(dst, m, give_up_ns);
    if (e == MPR_OK) {
        if (traced)
            mpri_trace_msg(MPRI_TEV_SEND, t0, mpri_now_ns() - t0, h.kind, h.flags, h.request_id, h.function_id, dst,
                           bytes);
        if (mpri_observing(MPRI_OBSERVE_STATS)) mpri_stats_peer_sent(dst, bytes);
    }
    return e;
}

mpr_err_t mpri_send_until(int dst, mpri_outmsg_t *m, int64_t give_up_ns) {
    if (mpri_observing(MPRI_OBSERVE_TRACE | MPRI_OBSERVE_STATS)) return send_observed(dst, m, give_up_ns);
    return send_until(dst, m, give_up_ns);
}

static mpr_err_t send_until(int dst, mpri_outmsg_t *m, int64_t give_up_ns) {
    if (m->wire.failed) {
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
    h->body_len = (uint32_t)(m->wire.len - sizeof *h);
    uint32_t nt = h->tensor_count = m->tensors.len;
    /* The batch plan, made once: its count goes in the header, its batches
     * are posted below (mpri_tensor_batches.h). */
    mpri_batch_scratch_t scratch;
    if (!mpri_batch_scratch_init(&scratch, nt, m->tensors.spans)) {
        mpri_outmsg_fini(m);
        return mpr_error_set(MPR_ERR_NOMEM, "send: out of memory");
    }
    /* The plan, packing and posting read the spans the encode noted. */
    uint32_t nbatches = nt ? mpri_batches_plan(scratch.spans, nt, scratch.starts) : 0;
    if (nt) {
        mpri_tensor_descs_encode(&m->tensors, &m->wire);
        /* A few small tensors to another rank travel inside the message
         * (mpri_wire.h, MPRI_FLAG_TENSORS_INLINE): no batch to send, and the
         * receiver has nothing to post. */
        size_t inline_bytes = 0;
        for (uint32_t i = 0; i < nt && inline_bytes <= MPRI_INLINE_TENSOR_BYTES; i++)
            inline_bytes += scratch.spans[i].nbytes;
        if (dst != mpri_rt.rank && inline_bytes <= MPRI_INLINE_TENSOR_BYTES &&
            m->wire.len + inline_bytes <= MPRI_INLINE_MESSAGE_BYTES) {
            h->flags |= MPRI_FLAG_TENSORS_INLINE;
            h->data_tag = 0;
            h->batch_count = nbatches = 0;
            for (uint32_t i = 0; i < nt; i++)
                if (scratch.spans[i].nbytes) mpri_buf_put(&m->wire, scratch.spans[i].data, scratch.spans[i].nbytes);
        } else {
            unsigned c = atomic_fetch_add(&mpri_rt.data_tag_counter, 1);
            h->data_tag = MPRI_TAG_DATA_FIRST + c % (unsigned)(mpri_rt.tag_ub - MPRI_TAG_DATA_FIRST);
            h->batch_count = nbatches;
        }
    }
    if (m->wire.failed || m->wire.len > MPRI_MAX_MESSAGE_BYTES) {
        size_t len = m->wire.len;
        mpri_batch_scratch_fini(&scratch);
        mpri_outmsg_fini(m);
        return mpr_error_set(MPR_ERR_INVALID_ARG, "send: message of %zu bytes is too large", len);
    }
    memcpy(m->wire.data, h, sizeof *h);
    if (dst == mpri_rt.rank) {
        mpri_batch_scratch_fini(&scratch);
        return send_local(m);
    }

    /* The message, then the tensors in batches. */
    MPI_Request stack_reqs[MPRI_BATCH_SCRATCH_INLINE + 1];
    MPI_Request *reqs = nt <= MPRI_BATCH_SCRATCH_INLINE ? stack_reqs : malloc(sizeof *reqs * (nt + 1));
    /* Each batch's packed bytes (0: sent from its own memory), found once. */
    size_t stack_pack[MPRI_BATCH_SCRATCH_INLINE];
    size_t *batch_pack =
        nbatches <= MPRI_BATCH_SCRATCH_INLINE ? stack_pack : malloc(sizeof *batch_pack * nbatches);
    if (!reqs || !batch_pack) {
        if (reqs != stack_reqs) free(reqs);
        if (batch_pack != stack_pack) free(batch_pack);
        mpri_batch_scratch_fini(&scratch);
        mpri_outmsg_fini(m);
        return mpr_error_set(MPR_ERR_NOMEM, "send: out of memory");
    }
    /* One buffer for the batches of small tensors that are packed. */
    size_t pack_total = 0;
    for (uint32_t b = 0; b < nbatches; b++) {
        batch_pack[b] = mpri_batch_pack_bytes(scratch.spans, scratch.starts[b], scratch.starts[b + 1]);
        pack_total += batch_pack[b];
    }
    /* From the host allocator: a buffer of 64 KiB or more comes back warm
     * from its cache, not fresh pages to fault in while packing. */
    uint8_t *packed = pack_total ? mpri_host_alloc(pack_total) : NULL;
    if (pack_total && !packed) {
        mpri_batch_scratch_fini(&scratch);
        if (reqs != stack_reqs) free(reqs);
        if (batch_pack != stack_pack) free(batch_pack);
        mpri_outmsg_fini(m);
        return mpr_error_set(MPR_ERR_NOMEM, "send: out of memory packing %zu bytes of tensors", pack_total);
    }
    mpri_count_sent(dst);
    int posted = 0, rc = MPI_Isend(m->wire.data, (int)m->wire.len, MPI_BYTE, dst, MPRI_TAG_AM,
                                   mpri_rt.comm, &reqs[0]);
    if (rc == MPI_SUCCESS) posted = 1;
    m->left = posted > 0;
    size_t pack_at = 0;
    for (uint32_t b = 0; rc == MPI_SUCCESS && b < nbatches; b++) {
        rc = mpri_batch_post(true, scratch.spans, scratch.starts[b], scratch.starts[b + 1], dst,
                             (int)h->data_tag, mpri_rt.comm,
                             batch_pack[b] ? packed + pack_at : NULL, &reqs[1 + b]);
        pack_at += batch_pack[b];
        if (rc == MPI_SUCCESS) posted++;
    }
    mpri_batch_scratch_fini(&scratch);
    if (batch_pack != stack_pack) free(batch_pack);
    if (posted > 1) atomic_fetch_add_explicit(&tx.batches_posted, (unsigned long long)(posted - 1), memory_order_relaxed);
    if (posted) mpri_doorbell_ring(dst); /* an idle peer on this host wakes now, not at its next poll */
    mpr_err_t err = MPR_OK;
    if (rc != MPI_SUCCESS) {
        if (posted == 0) mpri_uncount_sent(dst);
        err = mpi_failure(dst, rc);
        give_up_ns = mpri_now_ns(); /* what was posted is abandoned at once */
    }
    int flag = 1;
    if (posted) rc = MPI_Testall(posted, reqs, &flag, MPI_STATUSES_IGNORE);
    if (flag) {
        mpri_host_free(packed, pack_total);
    } else if (!track(reqs, posted, dst, give_up_ns, m, packed, pack_total)) {
        /* No memory to track it: the buffers must outlive MPI's use of them. */
        (void)mpri_buf_steal(&m->wire, &(size_t){0});
        mpri_tensor_list_init(&m->tensors); /* the references are kept for good */
        if (!err) err = mpr_error_set(MPR_ERR_NOMEM, "send: out of memory tracking a send in flight");
    }
    if (reqs != stack_reqs) free(reqs);
    mpri_outmsg_fini(m);
    if (!err && flag && rc != MPI_SUCCESS) err = mpi_failure(dst, rc);
    return err;
}

/* ---- replies ---- */

/* Error reply body: u32 code, blob text, and for a remote failure with a
 * known origin its extension (mpri_error.h). */
/* Statistics on: request `req` served, its reply `m` about to leave. */
static void count_served(const mpri_msg_t *req, const mpri_outmsg_t *m, bool error) {
    if (req->recv_ns && req->hdr.function_id)
        mpri_stats_serve_done(req->hdr.function_id, mpri_now_ns() - req->recv_ns, req->wire_bytes,
                              m->wire.len + m->tensors.total_bytes, error);
}

static mpr_err_t reply_error_body(mpri_outmsg_t *m, const mpri_msg_t *req, mpr_err_t code,
                                  const char *message, const mpri_remote_error_t *re) {
    m->hdr.flags = MPRI_FLAG_RESPONSE | MPRI_FLAG_ERROR;
    m->hdr.request_id = req->hdr.request_id;
    mpri_buf_put_u32(&m->wire, (uint32_t)code);
    mpri_buf_put_blob(&m->wire, message, strlen(message));
    if (re && code == MPR_ERR_REMOTE) mpri_remote_error_write(&m->wire, re);
    if (mpri_observing(MPRI_OBSERVE_STATS)) count_served(req, m, true);
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
    return mpri_reply_value_stamped(req, kind, v, NULL, NULL);
}

void mpri_reply_begin(const mpri_msg_t *req, int kind, mpri_outmsg_t *m) {
    mpri_outmsg_init(m, kind);
    m->hdr.flags = MPRI_FLAG_RESPONSE;
    m->hdr.request_id = req->hdr.request_id;
}

mpr_err_t mpri_reply_send(const mpri_msg_t *req, mpri_outmsg_t *m) {
    if (!(req->hdr.flags & MPRI_FLAG_EXPECTS_REPLY)) {
        mpri_outmsg_fini(m);
        return MPR_OK;
    }
    if (mpri_observing(MPRI_OBSERVE_STATS)) count_served(req, m, false);
    return mpri_send(req->src, m);
}

mpr_err_t mpri_reply_value_stamped(const mpri_msg_t *req, int kind, const mpr_value_t *v,
                                   mpr_err_t (*stamp)(mpri_outmsg_t *reply, void *arg), void *arg) {
    if (!(req->hdr.flags & MPRI_FLAG_EXPECTS_REPLY)) return MPR_OK;
    mpri_outmsg_t m;
    mpri_reply_begin(req, kind, &m);
    mpr_err_t e = mpri_value_encode(v ? v : mpr_value_new_none(), &m.wire, &m.tensors, req->src);
    if (e) {
        char text[MPR_ERROR_TEXT_MAX];
        snprintf(text, sizeof text, "On %s: cannot send the result: %s",
                 mpri_rt.workers[mpri_rt.rank].name, mpr_last_error());
        mpri_outmsg_fini(&m);
        return mpri_reply_error(req, e, text);
    }
    if (stamp && (e = stamp(&m, arg)) != MPR_OK) {
        char text[MPR_ERROR_TEXT_MAX];
        snprintf(text, sizeof text, "On %s: cannot record the result for distributed autograd: %s",
                 mpri_rt.workers[mpri_rt.rank].name, mpr_last_error());
        mpri_outmsg_fini(&m);
        return mpri_reply_error(req, e, text);
    }
    return mpri_reply_send(req, &m);
}
