/* mpri_dist.h — distributed autograd inside the autograd layer (not
 * installed): the context table (context.c), send/recv recording on the call
 * path (record.c) and the backward pass protocol (backward.c). The public
 * side is mpirpc/dist_autograd.h; the protocol is described at the top of
 * context.c (contexts) and backward.c (passes).
 *
 * Ownership: mpri_dist_ctx_find/_get_or_create return a new reference,
 * dropped with mpri_dist_ctx_release; the table holds one reference per
 * alive context. */
#ifndef MPRI_DIST_H
#define MPRI_DIST_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "mpirpc/dist_autograd.h"
#include "mpri_autograd.h"
#include "mpri_runtime.h"

#define MPRI_DIST_INLINE 4         /* send functions and gradients kept inline */
#define MPRI_DIST_INLINE_WORKERS 2 /* workers kept inline (a 2- or 3-rank step) */

/* A send function of the context, under its autograd message id. */
typedef struct mpri_dist_send {
    uint64_t msg_id;
    mpri_node_t *node; /* owned reference */
} mpri_dist_send_t;

/* A leaf's gradient accumulated in the context. */
typedef struct mpri_dist_grad {
    mpr_tensor_t *leaf; /* owned reference (PyTorch keys the map by the tensor) */
    mpr_tensor_t *grad; /* owned reference; replaced (never written in place) on accumulation */
} mpri_dist_grad_t;

typedef struct mpri_dist_ctx {
    atomic_long refcount;
    int64_t id;
    pthread_mutex_t lock; /* guards everything below */
    bool ended;           /* ALIVE -> ENDED (context.c); nothing is added once ENDED */
    int *workers;         /* ranks that took part (sent to us / received from us), no repeats */
    int nworkers, capworkers;
    mpri_dist_send_t *sends; /* sorted by msg_id (ids grow: appended) */
    int nsends, capsends;
    mpri_dist_grad_t *grads;
    int ngrads, capgrads;
    /* The first entries of each array above live here (a small context's
     * step allocates none); an array that outgrows them moves to the heap
     * (context.c: grow_array, free_array). */
    int inline_workers[MPRI_DIST_INLINE_WORKERS];
    mpri_dist_send_t inline_sends[MPRI_DIST_INLINE];
    mpri_dist_grad_t inline_grads[MPRI_DIST_INLINE];
    uint64_t consumed_by_pass; /* a pass without retain_graph ran here (0: none) */
    uint64_t passes_begun;     /* root passes begun on this worker */
    /* Backward requests handed to the threads waiting in a piece of this
     * context (backward.c): FIFO through mpri_msg_t.next, only while
     * bw_waiters > 0; bw_inbox_len mirrors its length for lock-free checks. */
    int bw_waiters;
    struct mpri_msg *bw_inbox, *bw_inbox_tail;
    atomic_int bw_inbox_len;
    struct mpri_dist_ctx *next; /* table chain */
} mpri_dist_ctx_t;

/* ---- context.c ---- */
mpri_dist_ctx_t *mpri_dist_ctx_find(int64_t id);
/* Find, or create for a message from `from_rank` (a worker that took part). */
mpri_dist_ctx_t *mpri_dist_ctx_get_or_create(int64_t id, int from_rank);
void mpri_dist_ctx_retain(mpri_dist_ctx_t *c);
void mpri_dist_ctx_release(mpri_dist_ctx_t *c);
/* Record `rank` as a worker that took part (lock held). */
mpr_err_t mpri_dist_ctx_add_worker_locked(mpri_dist_ctx_t *c, int rank);
/* Keep send function `node` under `msg_id` (takes a reference; lock held). */
mpr_err_t mpri_dist_ctx_add_send_locked(mpri_dist_ctx_t *c, uint64_t msg_id, mpri_node_t *node);
/* The send function under `msg_id` (new reference) or NULL (lock held). */
mpri_node_t *mpri_dist_ctx_find_send_locked(mpri_dist_ctx_t *c, uint64_t msg_id);
/* Accumulate `grad` (borrowed) for `leaf` in context `c`. The first gradient
 * of a leaf is kept as it is, without a copy, when nothing else can write it
 * later: it is contiguous, alone on its storage, and either its only
 * reference is the caller's or `private_grad` says its other references are
 * internal to the pass (a decoded message's value, released unwritten);
 * otherwise a copy is kept. */
mpr_err_t mpri_dist_ctx_accumulate(mpri_dist_ctx_t *c, mpr_tensor_t *leaf, mpr_tensor_t *grad, bool private_grad);
/* The thread's current context id (0: none). */
int64_t mpri_dist_current(void);
/* Make `id` (alive or not: a call that uses an ended one fails then) the
 * thread's current context; returns the previous one. */
int64_t mpri_dist_swap_current(int64_t id);
/* A new autograd message id, unique in the job: rank << 48 | counter. */
uint64_t mpri_dist_next_msg_id(void);
mpr_err_t mpri_dist_context_install(void);

/* ---- record.c ---- */
/* Install the call hooks, the reply hook and the thread-context hooks. */
mpr_err_t mpri_dist_record_install(void);
/* Make the tensors of `msg` that arrived with requires_grad outputs of one
 * recv function of context `c` (message `msg_id` from `peer`). */
mpr_err_t mpri_dist_record_recv(mpri_dist_ctx_t *c, mpr_tensor_t *const *tensors, uint32_t n, uint64_t msg_id,
                                int peer);
/* Give outgoing `m` (to `dst`) context `c`'s ids and a send function for its
 * tensors that require grad. */
mpr_err_t mpri_dist_record_send(mpri_dist_ctx_t *c, mpri_outmsg_t *m, int dst);

/* Where recv function `node`'s gradients go: its context id, and in
 * *msg_id / *peer the message and the worker that sent its tensors. */
int64_t mpri_dist_recv_target(mpri_node_t *node, uint64_t *msg_id, int *peer);

/* ---- backward.c ---- */
/* The recv function's backward (record.c's op def uses it). */
mpr_err_t mpri_dist_recv_backward(mpri_node_t *node, mpr_tensor_t *const *gout, mpr_tensor_t **gin);
mpr_err_t mpri_dist_backward_install(void);

#endif
