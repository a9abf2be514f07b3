/* mpirpc/optim.h — local optimizers over a list of parameter tensors, their
 * state checkpoints, and learning-rate schedulers.
 *
 * An optimizer (opaque mpr_optimizer_t) holds references to its parameters
 * (leaf float tensors, contiguous, on the CPU or, built with -DMPIRPC_CUDA=ON,
 * on a CUDA device: a parameter's state lives on its device and is updated
 * there, bit for bit as on the CPU) and its per-parameter state (step
 * count, momentum / moment buffers, ...). step() updates each parameter IN
 * PLACE under no-grad mode, so the storage version counter is bumped (a graph
 * that saved a parameter before the step cannot be run backward after it, as
 * in PyTorch). Parameters whose gradient is NULL are skipped (no state change
 * either), as PyTorch skips p.grad is None.
 *
 * Algorithms (kind strings of mpr_optimizer_create) follow PyTorch 1.13's
 * single-tensor update rules operation by operation, in the parameter's dtype
 * (float32 arithmetic for float32 parameters): "sgd" (torch.optim.SGD),
 * "adagrad", "adam" (amsgrad), "adamw" (decoupled decay), "rmsprop"
 * (centered, momentum); all take weight_decay and maximize.
 *
 * Gradients come from the parameters' .grad (mpr_optimizer_step) or from an
 * explicit array (mpr_optimizer_step_grads), which is what a distributed
 * optimizer uses with the gradients held by a dist-autograd context.
 *
 * Ownership: create takes its own references to the parameters (the caller
 * keeps its own); destroy releases them and accepts NULL. Options structs are
 * plain values (copied at create). Not thread-safe: one optimizer is stepped
 * by one thread at a time. */
#ifndef MPIRPC_OPTIM_H
#define MPIRPC_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "mpirpc/tensor.h"
#include "mpirpc/tensor_io.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mpr_optimizer mpr_optimizer_t;

/* Hyperparameters of every optimizer kind in one flat, copyable struct (no
 * pointers: it can be sent over the wire as bytes). Names and meaning are
 * PyTorch 1.13's; each kind reads only its own fields (betas = beta1, beta2):
 *   sgd:     lr (required), momentum, dampening, weight_decay, nesterov, maximize
 *   adagrad: lr, lr_decay, weight_decay, initial_accumulator_value, eps, maximize
 *   adam:    lr, beta1, beta2, eps, weight_decay, amsgrad, maximize
 *   adamw:   lr, beta1, beta2, eps, weight_decay (decoupled), amsgrad, maximize
 *   rmsprop: lr, alpha, eps, weight_decay, momentum, centered, maximize
 * Start from mpr_optim_options_default(kind, &o) and change what differs
 * (it zeroes every byte first, padding included, so the struct can be sent
 * or compared as bytes). */
typedef struct mpr_optim_options {
    double lr, momentum, dampening, weight_decay, beta1, beta2, eps, alpha, lr_decay,
        initial_accumulator_value;
    bool nesterov, amsgrad, centered, maximize;
} mpr_optim_options_t;

/* Fill *out with PyTorch 1.13's defaults for `kind` (see above; "sgd" has no
 * default learning rate in PyTorch: lr is NaN, which create rejects until it
 * is set; "adamw" has weight_decay 1e-2). An unknown kind zeroes *out and sets
 * MPR_ERR_INVALID_ARG (naming the known kinds). */
void mpr_optim_options_default(const char *kind, mpr_optim_options_t *out);

/* The generic constructor: an optimizer of `kind` ("sgd", "adagrad", "adam",
 * "adamw", "rmsprop") over params[n] (n >= 1, borrowed; references taken) with
 * *opts (copied). NULL with MPR_ERR_INVALID_ARG for an unknown kind or a
 * hyperparameter PyTorch rejects (lr < 0, eps < 0, weight_decay < 0, momentum
 * < 0, alpha < 0, lr_decay < 0, initial_accumulator_value < 0, a beta outside
 * [0, 1), nesterov without momentum or with dampening; the message names the
 * value as PyTorch's "Invalid ... value"), MPR_ERR_DTYPE / INVALID_ARG for a
 * parameter that is not a contiguous float tensor. */
mpr_optimizer_t *mpr_optimizer_create(const char *kind, mpr_tensor_t *const *params, int n,
                                      const mpr_optim_options_t *opts);
/* "sgd", ... (the kind given at create; static string). */
const char *mpr_optimizer_kind(const mpr_optimizer_t *opt);
/* Copy of the optimizer's current options (lr included, as set_lr leaves it). */
mpr_err_t mpr_optimizer_get_options(const mpr_optimizer_t *opt, mpr_optim_options_t *out);

/* torch.optim.SGD's options (PyTorch's update rule, including dampening and
 * nesterov). Zero-initialize and set lr at least: {.lr = 0.05}. */
typedef struct {
    double lr;           /* > 0 */
    double momentum;     /* >= 0 */
    double dampening;    /* >= 0 */
    double weight_decay; /* >= 0 (L2 added to the gradient) */
    bool nesterov;       /* needs momentum > 0 and dampening == 0 */
} mpr_sgd_options_t;

/* SGD through the older options struct (kept for existing callers): the same
 * as mpr_optimizer_create("sgd") with these fields and maximize off, except
 * that lr must be > 0 and dampening >= 0 here. params: n >= 1 float tensors (borrowed; references
 * taken). NULL with MPR_ERR_INVALID_ARG on bad options or parameters. */
mpr_optimizer_t *mpr_sgd_create(mpr_tensor_t *const *params, int n, const mpr_sgd_options_t *opts);

/* One update from each parameter's .grad. */
mpr_err_t mpr_optimizer_step(mpr_optimizer_t *opt);
/* One update from grads[i] for params[i] (borrowed; NULL entries skip that
 * parameter). Each grad must match its parameter's shape and dtype and be on
 * its device (any strides); otherwise nothing changes (MPR_ERR_SHAPE /
 * MPR_ERR_INVALID_ARG naming both devices). A parameter's state is created on its first step
 * with a gradient. */
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
/* "SGD", "Adagrad", "Adam", "AdamW", "RMSprop" (PyTorch's class names). */
const char *mpr_optimizer_name(const mpr_optimizer_t *opt);

/* ---- state checkpoints ----
 * The state is what PyTorch keeps in optimizer.state plus the options:
 * per parameter i that has state, "state.<i>.step" (int64 0-d) and its
 * buffers "state.<i>.<key>" with PyTorch's keys (momentum_buffer, sum,
 * exp_avg, exp_avg_sq, max_exp_avg_sq, square_avg, grad_avg); the kind and
 * every option (lr as last set) in the metadata. Loading restores all of it
 * (as load_state_dict overwrites param_groups' hyperparameters), so a run
 * restored after step k continues bit-identically to one that never stopped. */

/* Add the state entries to `d` (tensors are CPU copies whatever the
 * parameters' device, owned by d; names get `prefix` in front, NULL or ""
 * for none, e.g. "optim." to keep them apart from a model's parameters in
 * one file). */
mpr_err_t mpr_optimizer_state_export(const mpr_optimizer_t *opt, mpr_tensor_dict_t *d,
                                     const char *prefix);
/* Replace the optimizer's state with the entries of `d` under `prefix` (d
 * borrowed; values copied to each parameter's device). The kind must match
 * and every buffer must have its parameter's shape and dtype; a parameter
 * index >= num_params, an unknown key or an option that fails validation is
 * an error. Nothing changes unless everything checks out. */
mpr_err_t mpr_optimizer_state_import(mpr_optimizer_t *opt, const mpr_tensor_dict_t *d,
                                     const char *prefix);
/* export into a new .safetensors file at `path`, written atomically (a
 * temporary file beside it, then rename): a crash leaves the old file. */
mpr_err_t mpr_optimizer_state_save(const mpr_optimizer_t *opt, const char *path);
/* import from a .safetensors file written by mpr_optimizer_state_save. */
mpr_err_t mpr_optimizer_state_load(mpr_optimizer_t *opt, const char *path);

/* ---- learning-rate schedulers (torch.optim.lr_scheduler) ----
 * A scheduler borrows its optimizer (which must outlive it) and sets its lr.
 * Creating one records base_lr = the optimizer's lr and leaves last_epoch 0
 * (PyTorch's constructor step); each mpr_lr_scheduler_step increments
 * last_epoch and sets lr with PyTorch's recursive (chainable) formula:
 *   StepLR:            lr *= gamma when last_epoch % step_size == 0
 *   CosineAnnealingLR: lr = eta_min + (lr - eta_min) (1 + cos(pi e / T)) /
 *                      (1 + cos(pi (e - 1) / T)), with PyTorch's special
 *                      cases at e == 0 and (e - 1 - T) % 2T == 0. */
typedef struct mpr_lr_scheduler mpr_lr_scheduler_t;
/* step_size >= 1; gamma any (PyTorch's default 0.1). NULL + INVALID_ARG. */
mpr_lr_scheduler_t *mpr_lr_step_create(mpr_optimizer_t *opt, int64_t step_size, double gamma);
/* t_max >= 1, eta_min (PyTorch's default 0). */
mpr_lr_scheduler_t *mpr_lr_cosine_create(mpr_optimizer_t *opt, int64_t t_max, double eta_min);
/* Advance one epoch and set the optimizer's lr. */
mpr_err_t mpr_lr_scheduler_step(mpr_lr_scheduler_t *s);
/* Epochs stepped so far (0 after create). */
int64_t mpr_lr_scheduler_last_epoch(const mpr_lr_scheduler_t *s);
/* Resume from a checkpoint, as PyTorch's load_state_dict: create the
 * optimizer and the scheduler as at the start (base_lr = the initial lr),
 * load the optimizer state (which restores the current lr), then set the
 * saved last_epoch; the following steps give the rates of a run that never
 * stopped. */
mpr_err_t mpr_lr_scheduler_set_last_epoch(mpr_lr_scheduler_t *s, int64_t last_epoch);
void mpr_lr_scheduler_destroy(mpr_lr_scheduler_t *s);

#ifdef __cplusplus
}
#endif
#endif
