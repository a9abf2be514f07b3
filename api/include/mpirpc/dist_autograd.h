/* mpirpc/dist_autograd.h — distributed autograd: the C form of
 * torch.distributed.autograd (FAST mode).
 *
 * A forward pass stitched across workers by RPCs is differentiated by one
 * mpr_dist_backward() on the worker holding the loss; every worker that took
 * part computes its part, and the gradients of the leaves each worker holds
 * accumulate in the context on that worker (never in .grad):
 *
 *   int64_t ctx;
 *   mpr_dist_context_begin(&ctx);                  // with dist_autograd.context() as ctx:
 *   mpr_value_t *r = NULL;
 *   mpr_rpc_sync(mpr_to_name("ps"), "forward", args, 0, &r);   // records send/recv functions
 *   mpr_tensor_t *loss = mpr_sum(...r's tensor...);
 *   mpr_dist_backward(ctx, &loss, 1, false);        // dist_autograd.backward(ctx, [loss])
 *   mpr_dist_get_gradient(ctx, w, &g);              // dist_autograd.get_gradients(ctx)[w]
 *   mpr_dist_context_end(ctx);                      // cleans up on every worker that took part
 *
 * Recording. While a thread has a current context, every call it makes
 * (rpc_sync, rpc_async, remote, RRef proxy calls, to_here) carries the
 * context id; the callee runs the function with that context current (so
 * its own calls extend the same graph), and the tensors that require grad
 * in the arguments, and then in the reply, get a send function on the
 * sender and a recv function on the receiver. A tensor's requires_grad flag
 * travels with it in every call (inside a context or not): the receiver
 * gets a leaf that requires grad. Calls outside a context record nothing.
 * Callbacks of mpr_future_then run with the context that was current where
 * they were registered (async functions keep their context).
 *
 * Backward (FAST mode, as PyTorch): gradients reaching a recv function are
 * sent to the worker that sent its tensors, which runs the subgraph of the
 * matching send function; mpr_dist_backward returns when every backward
 * message of the pass, on every worker, has been processed. Each incoming
 * gradient runs as its own pass over the subgraph it reaches, so a send
 * function that never gets a gradient costs nothing and blocks nothing
 * (PyTorch's FAST mode assumes every send function gets one). Saved
 * tensors are kept until the context ends; after a backward without
 * retain_graph, a second backward in the same context fails with
 * MPR_ERR_STATE.
 *
 * Ids. A context id is (16-bit rank << 48 | 48-bit counter), never 0; it is
 * known on every worker that took part. Threads: every function is
 * thread-safe; the current context is per thread.
 *
 * Ownership: tensors passed in are borrowed; tensors returned are new
 * references the caller releases. */
#ifndef MPIRPC_DIST_AUTOGRAD_H
#define MPIRPC_DIST_AUTOGRAD_H

#include <stdbool.h>
#include <stdint.h>

#include "mpirpc/error.h"
#include "mpirpc/rref.h"
#include "mpirpc/tensor.h"

/* Begin a context and make it the calling thread's current one; its id in
 * *ctx_id (0 on failure). MPR_ERR_STATE if the thread already has a current
 * context (end it first), or the runtime is not running. */
mpr_err_t mpr_dist_context_begin(int64_t *ctx_id);

/* End (release) context `ctx_id`: it is removed here and a cleanup message
 * goes to every worker that took part, which releases its own copy and
 * passes the cleanup on (idempotent: a worker that no longer has it ignores
 * it). If it is the calling thread's current context, the thread has none
 * afterwards. A backward still running in it fails. MPR_ERR_NOT_FOUND for
 * an unknown or already ended id. */
mpr_err_t mpr_dist_context_end(int64_t ctx_id);

/* The calling thread's current context id, or 0. */
int64_t mpr_dist_context_current(void);

/* True if context `ctx_id` is alive on this worker (begun here, or this
 * worker took part and it was not ended yet). */
bool mpr_dist_context_exists(int64_t ctx_id);

/* Make `ctx_id` (alive on this worker) the calling thread's current
 * context, or with 0 clear it; the previous one in *prev (may be NULL).
 * For threads of the user's own that must extend a graph. */
mpr_err_t mpr_dist_context_set_current(int64_t ctx_id, int64_t *prev);

/* Run backward from `roots` (n >= 1 scalar tensors that require grad, all
 * made on this worker inside context `ctx_id`) across every worker the
 * graph reaches. Returns when the whole pass has finished everywhere, or
 * with the first error anywhere: MPR_ERR_REMOTE naming the worker and the
 * cause (the RPC timeout bounds every step), MPR_ERR_NOT_FOUND for an
 * unknown context, MPR_ERR_STATE for a second backward after one without
 * retain_graph. Gradients accumulate in the context. */
mpr_err_t mpr_dist_backward(int64_t ctx_id, mpr_tensor_t *const *roots, int n, bool retain_graph);

/* The gradient accumulated in context `ctx_id` on this worker for leaf
 * `t`: a new reference in *grad, or NULL when it has none (MPR_OK both).
 * MPR_ERR_NOT_FOUND for an unknown context. */
mpr_err_t mpr_dist_get_gradient(int64_t ctx_id, const mpr_tensor_t *t, mpr_tensor_t **grad);

/* Add `grad` to the gradient that context `ctx_id` holds on this worker for
 * leaf `t`, as a backward pass reaching `t` in that context would (the
 * context keeps a copy: `grad` is borrowed and may change afterwards).
 * Gradient accumulation over several contexts: with one context per
 * micro-batch, each ended as soon as its gradients are added into the
 * mini-batch's context, whose mpr_dist_optimizer_step then applies the sum
 * (the pipeline app's 1F1B schedule). MPR_ERR_NOT_FOUND for an unknown
 * context, MPR_ERR_INVALID_ARG unless `t` is a leaf that requires grad,
 * MPR_ERR_SHAPE / MPR_ERR_DTYPE unless `grad` has t's shape and dtype. */
mpr_err_t mpr_dist_accumulate_gradient(int64_t ctx_id, mpr_tensor_t *t, mpr_tensor_t *grad);

/* Every (leaf, gradient) pair of context `ctx_id` on this worker (PyTorch's
 * get_gradients dict): *leaves and *grads are malloc'ed arrays of *n new
 * references each; the caller releases every tensor (mpr_tensor_release)
 * and frees both arrays (free). */
mpr_err_t mpr_dist_get_gradients(int64_t ctx_id, mpr_tensor_t ***leaves, mpr_tensor_t ***grads, int *n);

/* RRef.backward: run mpr_dist_backward in context `ctx_id` from the scalar
 * tensor `rref` holds, on its owner (a call to the owner when this worker
 * is a user; the context must be alive there, i.e. the owner took part). */
mpr_err_t mpr_rref_backward(mpr_rref_t *rref, int64_t ctx_id, bool retain_graph);

#endif
