/* mpirpc/autograd.h — local reverse-mode autograd: requires_grad, backward,
 * .grad on leaves, no-grad mode, detach.
 *
 * Model (PyTorch's): a tensor produced by an op from inputs that require grad
 * records a graph node (its grad_fn) holding what the backward needs. The
 * graph is owned by the tensors: it lives as long as some tensor whose
 * history it is, and is freed with them (the scope mechanism of
 * mpirpc/tensor_ops.h frees a training step's graph in one call).
 * mpr_backward() runs the graph in dependency order (each node runs once all
 * of its consumers have delivered their gradient, so shared subexpressions
 * accumulate correctly) and accumulates into the .grad of every leaf that
 * requires grad. Without retain_graph the tensors saved for backward are
 * freed, and a second backward through the same nodes fails with
 * MPR_ERR_STATE. Every storage has a version counter bumped by in-place ops;
 * a saved tensor modified in place after it was saved makes backward fail
 * with MPR_ERR_STATE naming the op.
 *
 * Gradients are only propagated to inputs that need them (x in linear(x, W, b)
 * gets no gradient computed unless it requires grad). No create_graph: the
 * backward pass itself is not recorded (no double backward).
 *
 * Thread model: grad mode is thread-local. Several threads may record ops on
 * the same leaves and run backward passes at the same time (a parameter
 * server serving many trainers): accumulation into a leaf's .grad is
 * serialized. A graph may be built on one thread and run backward on
 * another, but two backward passes must not run over the same non-leaf nodes
 * at the same time, and .grad must not be read or reset while a backward that
 * writes it is running.
 *
 * Ownership: mpr_tensor_grad() returns a BORROWED pointer owned by the leaf;
 * mpr_detach() returns a new tensor like any op in tensor_ops.h (owned by the
 * current scope if one is open, else by the caller). All functions here accept
 * NULL tensors and then return an error / false / NULL. */
#ifndef MPIRPC_AUTOGRAD_H
#define MPIRPC_AUTOGRAD_H

#include <stdbool.h>

#include "mpirpc/error.h"
#include "mpirpc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Mark a leaf tensor (one with no grad_fn) as requiring grad, or clear the
 * mark. Only float32/float64 tensors can require grad (MPR_ERR_DTYPE);
 * a non-leaf gives MPR_ERR_STATE (use mpr_detach first). */
mpr_err_t mpr_set_requires_grad(mpr_tensor_t *t, bool requires_grad);
/* True if `t` is a leaf marked requires_grad or has a grad_fn. */
bool mpr_requires_grad(const mpr_tensor_t *t);
/* True if `t` has no grad_fn (every tensor not produced by a recording op). */
bool mpr_is_leaf(const mpr_tensor_t *t);
/* Name of the op that produced `t` ("mul", "linear", ...) or NULL for a leaf. */
const char *mpr_grad_fn_name(const mpr_tensor_t *t);

/* The gradient accumulated in leaf `t` by backward passes, or NULL if none.
 * BORROWED: valid until the next mpr_zero_grad(t) / mpr_set_grad(t) or until
 * `t` dies. Same shape and dtype as `t`, contiguous. Optimizers update the
 * parameter in place through mpr_add_() etc. under no-grad mode. */
mpr_tensor_t *mpr_tensor_grad(const mpr_tensor_t *t);
/* Drop the gradient of `t` (PyTorch's zero_grad(set_to_none=True)): the next
 * backward stores a fresh gradient. Accepts NULL. */
void mpr_zero_grad(mpr_tensor_t *t);
/* Replace the gradient of `t` by `grad` (a new reference is taken; NULL drops
 * it). grad must have t's shape and dtype (MPR_ERR_SHAPE / MPR_ERR_DTYPE). */
mpr_err_t mpr_set_grad(mpr_tensor_t *t, mpr_tensor_t *grad);

/* Run backward from `root`. grad: d(objective)/d(root), same shape and dtype
 * as root; NULL is allowed only for a one-element root (then 1 is used,
 * otherwise MPR_ERR_SHAPE: "backward: grad can be implicitly created only for
 * scalar outputs"). root must require grad (MPR_ERR_STATE otherwise).
 * retain_graph=false frees the saved tensors of every node it ran.
 * Borrows root and grad. */
mpr_err_t mpr_backward(mpr_tensor_t *root, mpr_tensor_t *grad, bool retain_graph);

/* Grad mode of the calling thread (true by default). While false, ops record
 * no graph (PyTorch's torch.no_grad()). mpr_set_grad_enabled returns the
 * previous mode so blocks nest:
 *     bool prev = mpr_set_grad_enabled(false); ...; mpr_set_grad_enabled(prev); */
bool mpr_grad_enabled(void);
bool mpr_set_grad_enabled(bool enabled);

/* A new tensor sharing `t`'s storage (and version counter) with no history and
 * requires_grad=false. Owned like any op result (see tensor_ops.h scopes). */
mpr_tensor_t *mpr_detach(mpr_tensor_t *t);

/* The activation memory of the graphs alive in this process: the bytes of
 * the distinct storages that graph nodes keep saved for backward (each
 * storage once, however many nodes saved it), leaves that require grad
 * (parameters) left out. It grows as ops record nodes and shrinks when
 * their saved tensors are freed (a backward without retain_graph, or the
 * graph dying). Process-wide, thread-safe; for measurements (the pipeline
 * app's per-stage peak activation memory). */
int64_t mpr_autograd_saved_bytes(void);

#ifdef __cplusplus
}
#endif
#endif
