/* mpri_engine.h — internal: the backward engine as a reusable "graph task",
 * for local backward and for distributed autograd (not installed).
 *
 * A graph task is one backward pass over a subgraph:
 *   1. mpri_graph_task_create(opts)
 *   2. mpri_graph_task_add_roots(task, edges): walks everything reachable from
 *      the edges and counts, for every node, how many edges of the subgraph
 *      point at it (its dependencies). Each root edge itself counts as one
 *      dependency of its node (from a virtual "graph root"), so a node is only
 *      run after gradient for it has been fed. Can be called several times
 *      (local loss roots plus every send function of a dist context).
 *   3. mpri_graph_task_run(task, edges, grads): adds grads[i] into the input
 *      buffer of edges[i] (output_nr slot), consumes one dependency per edge,
 *      and runs every node that becomes ready, repeatedly, until nothing is
 *      ready. Nodes whose dependencies are not yet met stay pending; a later
 *      run() (e.g. when a remote gradient arrives for a send function) resumes
 *      them with the same counts.
 *   4. mpri_graph_task_pending(task): nodes that received some gradient but
 *      did not run (useful to detect an incomplete dist backward).
 *   5. mpri_graph_task_destroy(task).
 *
 * Gradient sinks: when a leaf accumulator node runs, the gradient goes to
 * opts.sink(ctx, leaf, grad) if set (dist autograd: accumulate in the
 * context's map), else into leaf .grad. Custom nodes (send/recv) are ordinary
 * nodes with their own backward functions (mpri_node_create).
 *
 * Distributed autograd recipe (PyTorch's send/recv functions):
 *  - sender, for tensors t[0..k-1] that require grad and go into an RPC:
 *      send = mpri_node_create(&send_def, k, k);   // k inputs, k outputs
 *      mpri_node_set_next(send, i, mpri_tensor_edge(t[i]));
 *      mpri_node_set_input_meta(send, i, t[i]); mpri_node_set_output_meta(send, i, t[i]);
 *    send_def.backward passes gout[i] through as gin[i]; the context keeps
 *    `send` (one reference) under the autograd message id.
 *  - receiver, for the k tensors r[i] it got:
 *      recv = mpri_node_create(&recv_def, 0, k);
 *      mpri_tensor_set_grad_fn(r[i], recv, i); mpri_node_set_output_meta(recv, i, r[i]);
 *      mpri_node_release(recv);                   // the tensors own it
 *    recv_def.backward ships gout[0..k-1] to the peer (message id in node->ctx).
 *  - backward on a worker: one task per context with a .grad-free sink into
 *    the context's map; add_roots(local loss edges + every send node of the
 *    context); run(loss, ones); then run({send_edge}, {grads}) for each send
 *    as its gradient arrives (NULL grads for sends that will get none).
 *
 * Thread safety: one task is driven by one thread at a time (callers
 * serialize run() calls of a task); tasks over disjoint graphs may run
 * concurrently. */
#ifndef MPRI_ENGINE_H
#define MPRI_ENGINE_H

#include "mpri_autograd.h"

/* Receives the gradient for leaf tensor `leaf` (BORROWED; if the leaf died
 * since the graph was built the gradient is dropped without calling).
 * `grad` is BORROWED: retain it to keep it. The sink runs with grad mode off
 * inside a scope of the engine: op results it creates are freed when it
 * returns unless it takes them with mpr_scope_keep(). Return MPR_OK or an
 * error that stops the pass. */
typedef mpr_err_t (*mpri_grad_sink_fn)(void *ctx, mpr_tensor_t *leaf, mpr_tensor_t *grad);

typedef struct mpri_engine_opts {
    bool retain_graph;      /* false: free saved tensors of every node run */
    mpri_grad_sink_fn sink; /* NULL: accumulate into leaf .grad */
    void *sink_ctx;
} mpri_engine_opts_t;

typedef struct mpri_graph_task mpri_graph_task_t;

/* opts is copied; NULL means defaults (retain_graph=false, .grad sink). */
mpri_graph_task_t *mpri_graph_task_create(const mpri_engine_opts_t *opts);
void mpri_graph_task_destroy(mpri_graph_task_t *task); /* accepts NULL */
/* Add root edges and count dependencies of everything reachable. Edges with a
 * NULL node are ignored. */
mpr_err_t mpri_graph_task_add_roots(mpri_graph_task_t *task, int n, const mpri_edge_t *edges);
/* Feed gradients (BORROWED; shape of the edge's output) and run what becomes
 * ready. Every edge must be an outstanding root: added with add_roots and not
 * fed yet (once per time it was added); otherwise MPR_ERR_STATE, and a
 * gradient of the wrong dtype/shape is MPR_ERR_SHAPE — a refused edge changes
 * nothing, the edges before it are fed and run. grads[i] may be NULL: that
 * releases the root's dependency without a gradient (e.g. a send function
 * whose peer will send none), so the nodes waiting on it can run. When a node
 * fails (its backward, the sink or an accumulation returns an error) the task
 * is failed: later run() and add_roots() calls return MPR_ERR_STATE; destroy
 * it. add_roots() also fails (MPR_ERR_STATE) when a new root reaches a node
 * that already ran. */
mpr_err_t mpri_graph_task_run(mpri_graph_task_t *task, int n, const mpri_edge_t *edges,
                              mpr_tensor_t *const *grads);
/* Without a graph task: `node` passes each gradient it gets straight to its
 * next edge (as a dist send function does; the caller vouches for that) and
 * every next edge is a leaf accumulator, and opts has a sink. Then grads[i]
 * (BORROWED, one per output of `node`) go to opts->sink for those leaves, checked
 * against the leaves' shapes as a task's run would, and true is returned
 * with the outcome in *rc; false (nothing done) when the graph is not that
 * shape, for the caller to run a task. Gradients of parameters that came
 * back from a peer take this path: no task to create, count and destroy. */
bool mpri_engine_sink_passthrough(const mpri_engine_opts_t *opts, mpri_node_t *node, mpr_tensor_t *const *grads,
                                  mpr_err_t *rc);
/* Nodes of the subgraph (as counted so far). */
int mpri_graph_task_num_nodes(const mpri_graph_task_t *task);
/* Dependencies still outstanding for `node` (-1 if not in the subgraph). */
int mpri_graph_task_dependencies(const mpri_graph_task_t *task, const mpri_node_t *node);
/* Number of nodes holding buffered gradient that have not run yet. */
int mpri_graph_task_pending(const mpri_graph_task_t *task);

#endif
