/* mpirpc/optim.h — local optimizers over a list of parameter tensors.
 *
 * An optimizer (opaque mpr_optimizer_t) holds references to its parameters
 * (leaf float tensors, contiguous) and its per-parameter state (momentum
 * buffers, ...). step() updates each parameter IN PLACE through the in-place
 * ops of tensor_ops.h under no-grad mode, so the storage version counter is
 * bumped (a graph that saved a parameter before the step cannot be run
 * backward after it, as in PyTorch). Parameters whose gradient is NULL are
 * skipped, as PyTorch skips p.grad is None.
 *
 * Gradients come from the parameters' .grad (mpr_optimizer_step) or from an
 * explicit array (mpr_optimizer_step_grads), which is what a distributed
 * optimizer uses with the gradients held by a dist-autograd context. New
 * optimizers (Adam, ...) plug in behind the same type: a create function with
 * their own options struct, and the same step/zero_grad/destroy.
 *
 * Ownership: create takes its own references to the parameters (the caller
 * keeps its own); destroy releases them and accepts NULL. Not thread-safe. */
#ifndef MPIRPC_OPTIM_H
#define MPIRPC_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "mpirpc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mpr_optimizer mpr_optimizer_t;

/* torch.optim.SGD's options (PyTorch's update rule, including dampening and
 * nesterov). Zero-initialize and set lr at least: {.lr = 0.05}. */
typedef struct {
    double lr;           /* > 0 */
    double momentum;     /* >= 0 */
    double dampening;    /* >= 0 */
    double weight_decay; /* >= 0 (L2 added to the gradient) */
    bool nesterov;       /* needs momentum > 0 and dampening == 0 */
} mpr_sgd_options_t;

/* params: n >= 1 float tensors (borrowed; references taken). NULL with
 * MPR_ERR_INVALID_ARG on bad options or parameters. */
mpr_optimizer_t *mpr_sgd_create(mpr_tensor_t *const *params, int n, const mpr_sgd_options_t *opts);

/* One update from each parameter's .grad. */
mpr_err_t mpr_optimizer_step(mpr_optimizer_t *opt);
/* One update from grads[i] for params[i] (borrowed; NULL entries skip that
 * parameter). Each grad must match its parameter's shape and dtype. */
mpr_err_t mpr_optimizer_step_grads(mpr_optimizer_t *opt, mpr_tensor_t *const *grads, int n);
/* Drop every parameter's .grad (set_to_none). */
void mpr_optimizer_zero_grad(mpr_optimizer_t *opt);
void mpr_optimizer_destroy(mpr_optimizer_t *opt);

/* Learning rate (for schedules). */
double mpr_optimizer_get_lr(const mpr_optimizer_t *opt);
void mpr_optimizer_set_lr(mpr_optimizer_t *opt, double lr);
/* Parameter count and the i-th parameter (BORROWED). */
int mpr_optimizer_num_params(const mpr_optimizer_t *opt);
mpr_tensor_t *mpr_optimizer_param(const mpr_optimizer_t *opt, int i);
/* "SGD", ... */
const char *mpr_optimizer_name(const mpr_optimizer_t *opt);

#ifdef __cplusplus
}
#endif
#endif
