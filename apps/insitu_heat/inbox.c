/* apps/insitu_heat/inbox.c — the learner's bounded sample queue with
 * deferred replies (see inbox.h for the protocol). Futures are completed
 * outside the lock: completing one sends its reply from this thread. */
#include "inbox.h"

#include <pthread.h>
#include <stdlib.h>

#include "insitu.h"
#include "mpirpc/mpirpc.h"

typedef struct node {
    struct node *next;
    inbox_sample_t s;
    mpr_future_t *reply; /* pending reply (QUEUED_WAITING), NULL once acked */
} node_t;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    node_t *head, *tail;
    node_t *first_waiting; /* first node whose reply is pending, NULL if none */
    int64_t len;
    int capacity, expected_sims;
    inbox_counts_t n;
} in = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER, .capacity = 1};

static void complete_reply(mpr_future_t *f) {
    if (!f) return;
    mpr_err_t e = mpr_future_set_result(f, NULL);
    INSITU_ASSERT(e == MPR_OK);
    mpr_future_release(f);
}

/* [step, sim rank, x, y] -> a future completed when the sample is within the window */
static mpr_err_t sample_fn(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_future_t **result) {
    (void)ctx;
    int64_t step, sim;
    mpr_tensor_t *x = NULL, *y = NULL;
    mpr_err_t e = mpr_args_unpack(args, "llTT", &step, &sim, &x, &y);
    node_t *nd = e ? NULL : calloc(1, sizeof *nd);
    mpr_future_t *f = nd ? mpr_future_create() : NULL;
    if (!f) {
        mpr_tensor_release(x);
        mpr_tensor_release(y);
        free(nd);
        return e ? e : mpr_error_set(MPR_ERR_NOMEM, "insitu: out of memory for a sample");
    }
    nd->s = (inbox_sample_t){step, (int)sim, x, y};
    mpr_future_t *ack_now = NULL;
    pthread_mutex_lock(&in.lock);
    if (in.tail)
        in.tail->next = nd;
    else
        in.head = nd;
    in.tail = nd;
    in.len++;
    in.n.received++;
    in.n.bytes += (int64_t)(mpr_tensor_nbytes(x) + mpr_tensor_nbytes(y));
    if (in.len > in.n.max_len) in.n.max_len = in.len;
    if (in.len <= in.capacity) {
        INSITU_ASSERT(!in.first_waiting);
        ack_now = mpr_future_retain(f);
    } else {
        nd->reply = mpr_future_retain(f);
        if (!in.first_waiting) in.first_waiting = nd;
    }
    pthread_cond_broadcast(&in.cond);
    pthread_mutex_unlock(&in.lock);
    complete_reply(ack_now);
    *result = f;
    return MPR_OK;
}

/* [sim rank, samples sent] -> none */
static mpr_err_t done_fn(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx, (void)result;
    int64_t sim, sent;
    mpr_err_t e = mpr_args_unpack(args, "ll", &sim, &sent);
    if (e) return e;
    pthread_mutex_lock(&in.lock);
    in.n.sims_done++;
    in.n.announced += sent;
    INSITU_ASSERT(in.n.sims_done <= in.expected_sims);
    pthread_cond_broadcast(&in.cond);
    pthread_mutex_unlock(&in.lock);
    return MPR_OK;
}

mpr_err_t inbox_register(void) {
    mpr_err_t e = mpr_register_async_function(INSITU_SAMPLE_FN, sample_fn, NULL);
    return e ? e : mpr_register_function(INSITU_DONE_FN, done_fn, NULL);
}

void inbox_configure(int capacity, int expected_sims) {
    pthread_mutex_lock(&in.lock);
    in.capacity = capacity;
    in.expected_sims = expected_sims;
    pthread_mutex_unlock(&in.lock);
}

/* Under the lock: unlink the head; returns the reply to complete (the sample that entered the window). */
static mpr_future_t *unlink_head(inbox_sample_t *out) {
    node_t *nd = in.head;
    INSITU_ASSERT(nd && !nd->reply);
    in.head = nd->next;
    if (!in.head) in.tail = NULL;
    in.len--;
    *out = nd->s;
    free(nd);
    mpr_future_t *ack = NULL;
    if (in.first_waiting) { /* the node at position capacity - 1 now: it enters the window */
        ack = in.first_waiting->reply;
        in.first_waiting->reply = NULL;
        in.first_waiting = in.first_waiting->next;
    }
    return ack;
}

static int pop(inbox_sample_t *out, int wait) {
    pthread_mutex_lock(&in.lock);
    while (wait && !in.head && in.n.sims_done < in.expected_sims) pthread_cond_wait(&in.cond, &in.lock);
    if (!in.head) {
        if (wait) INSITU_ASSERT(in.n.received == in.n.announced);
        pthread_mutex_unlock(&in.lock);
        return 0;
    }
    mpr_future_t *ack = unlink_head(out);
    pthread_mutex_unlock(&in.lock);
    complete_reply(ack);
    return 1;
}

int inbox_pop(inbox_sample_t *out) { return pop(out, 1); }
int inbox_try_pop(inbox_sample_t *out) { return pop(out, 0); }

inbox_counts_t inbox_counts(void) {
    pthread_mutex_lock(&in.lock);
    inbox_counts_t c = in.n;
    pthread_mutex_unlock(&in.lock);
    return c;
}

void inbox_cleanup(void) {
    pthread_mutex_lock(&in.lock);
    node_t *nd = in.head;
    in.head = in.tail = in.first_waiting = NULL;
    in.len = 0;
    pthread_mutex_unlock(&in.lock);
    while (nd) {
        node_t *next = nd->next;
        mpr_tensor_release(nd->s.x);
        mpr_tensor_release(nd->s.y);
        mpr_future_release(nd->reply);
        free(nd);
        nd = next;
    }
}
