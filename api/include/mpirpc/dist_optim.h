/* mpirpc/dist_optim.h — DistributedOptimizer: the C form of
 * torch.distributed.optim.DistributedOptimizer.
 *
 *   mpr_optim_options_t o;
 *   mpr_optim_options_default("sgd", &o);
 *   o.lr = 0.05;
 *   mpr_dist_optimizer_t *opt = mpr_dist_optimizer_create("sgd", &o, param_rrefs, n);
 *   for (each step) {
 *       mpr_dist_context_begin(&ctx);
 *       ... forward through RPCs, mpr_dist_backward(ctx, &loss, 1, false) ...
 *       mpr_dist_optimizer_step(opt, ctx);   // every owner updates its own parameters
 *       mpr_dist_context_end(ctx);
 *   }
 *   mpr_dist_optimizer_destroy(opt);
 *
 * The parameters are RRefs to tensors (leaves that require grad) owned
 * anywhere. Creation groups them by owner and creates one local optimizer
 * of `kind` (mpr_optimizer_create's kinds: "sgd", "adagrad", "adam",
 * "adamw", "rmsprop") on each owner with mpr_remote, without waiting: an
 * error of a creation (an unknown kind, bad options, a parameter that is
 * not a tensor) shows at the first step, naming the owner.
 *
 * step(ctx) asks every owner at once to update its parameters with the
 * gradients context `ctx` holds there (parameters without a gradient in it
 * are skipped, as PyTorch skips p.grad is None; an owner whose parameters
 * have none at all fails: backward was not run in that context), and
 * returns when all are done, or with the first failure, naming the owner.
 * Steps on one owner are serialized (one lock per worker, as PyTorch's
 * _LocalOptimizer.global_lock), so two trainers stepping the same
 * parameters lose no update. No zero_grad: gradients live in the context.
 *
 * State checkpoints: state_export writes what one local optimizer over the
 * same parameter list would (mpr_optimizer_state_export: "state.<i>.*" with
 * i the parameter's index in `params` at create, plus the kind and options
 * as metadata), gathered from every owner; so a file saved here loads into a
 * local optimizer over the same parameters, and the other way round.
 * state_import sends each owner its parameters' entries and replaces every
 * owner's state or none: if any owner rejects its part (kind, options,
 * shapes, an index outside the list), no owner changes, and the error names
 * the owner. A step running concurrently on another handle is not lost
 * mid-update (owners serialize), but it lands before or after the import.
 *
 * Ownership: create borrows `opts` and the RRefs (it keeps its own
 * references); destroy releases the remote optimizers (their owners free
 * them) and accepts NULL. A handle may be used by several threads at once. */
#ifndef MPIRPC_DIST_OPTIM_H
#define MPIRPC_DIST_OPTIM_H

#include <stdint.h>

#include "mpirpc/optim.h"
#include "mpirpc/rref.h"
#include "mpirpc/tensor_io.h"

typedef struct mpr_dist_optimizer mpr_dist_optimizer_t;

/* n >= 1 parameter RRefs. NULL with MPR_ERR_INVALID_ARG on a NULL or empty
 * input, or the runtime's error (not running, out of memory). */
mpr_dist_optimizer_t *mpr_dist_optimizer_create(const char *kind, const mpr_optim_options_t *opts,
                                                mpr_rref_t *const *params, int n);
/* One update on every owner with context `ctx_id`'s gradients. */
mpr_err_t mpr_dist_optimizer_step(mpr_dist_optimizer_t *opt, int64_t ctx_id);
/* Add the state to `d` (names after `prefix`, NULL for none; tensors
 * owned by d). On failure d is unchanged. */
mpr_err_t mpr_dist_optimizer_state_export(mpr_dist_optimizer_t *opt, mpr_tensor_dict_t *d, const char *prefix);
/* Replace every owner's state with the entries of `d` under `prefix` (d
 * borrowed); all owners or none. */
mpr_err_t mpr_dist_optimizer_state_import(mpr_dist_optimizer_t *opt, const mpr_tensor_dict_t *d,
                                          const char *prefix);
/* export to a .safetensors file written atomically / import from one. */
mpr_err_t mpr_dist_optimizer_state_save(mpr_dist_optimizer_t *opt, const char *path);
mpr_err_t mpr_dist_optimizer_state_load(mpr_dist_optimizer_t *opt, const char *path);
/* Workers holding parameters of `opt` (each has one local optimizer). */
int mpr_dist_optimizer_num_owners(const mpr_dist_optimizer_t *opt);
void mpr_dist_optimizer_destroy(mpr_dist_optimizer_t *opt);

#endif
