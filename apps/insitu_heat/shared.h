/* apps/insitu_heat/shared.h — several learners training ONE surrogate
 * (insitu_heat --learners-share): learner 0 owns the model's parameters;
 * every learner (learner 0 included, through a call to itself) computes its
 * gradients on its own samples inside a distributed-autograd context, and a
 * DistributedOptimizer (one per learner, as in PyTorch; Adam on learner 0
 * over RRefs to the parameters) steps them:
 *
 *   ctx begin -> pred = rpc_sync(learner0, SHARED_FORWARD_FN, [crops]) ->
 *   loss = mse(pred, target) locally -> dist_backward (the gradients reach
 *   the parameters on learner 0, in the context) -> dist optimizer step ->
 *   ctx end
 *
 * PROTOCOL (functions served by learner 0; every learner calls them):
 *   SHARED_PARAMS_FN  [] -> [RRef x SURROGATE_PARAMS]: OwnerRRefs to the
 *     parameters, created once, for the learner's DistributedOptimizer.
 *   SHARED_SCALE_FN   [x, y, stride] -> double: the target scale. The first
 *     call sets the model's moment scales and the target scale from its
 *     sample (surrogate_set_scales, every stride-th row and column);
 *     later calls return the same scale (every learner measures the same
 *     model's output in the same unit).
 *   SHARED_FORWARD_FN [x (B, 1, h+2, w+2)] -> the prediction (B, 1, h, w),
 *     computed on clones of the parameters (surrogate_forward snapshot), so
 *     another learner's optimizer step between this forward and its
 *     backward does not trip the version check. Error (MPR_ERR_STATE) before
 *     the scales are set.
 * States of the model on learner 0: CREATED (shared_host, before mpr_init)
 * -> SCALED (first SHARED_SCALE_FN, or shared_restore) -> destroyed (shared_cleanup after
 * mpr_shutdown). Updates are Hogwild-style, as in apps/param_server with
 * several trainers: a forward's clones (and learner 0's validation) may read
 * a parameter while another learner's step writes it; the owner serializes
 * the optimizer steps themselves (one lock per worker), so no update is lost.
 *
 * Checkpoints: learner 0's holds the model (and the scales); every
 * learner's holds its DistributedOptimizer's state (its Adam on learner 0,
 * gathered by mpr_dist_optimizer_state_export) and its own samples and
 * counts (learner.h).
 *
 * Counts: each learner's Adam steps are its own DistributedOptimizer steps
 * (learner_result_t.adam_steps), so the summary shows who contributed. */
#ifndef INSITU_HEAT_SHARED_H
#define INSITU_HEAT_SHARED_H

#include "mpirpc/mpirpc.h"
#include "surrogate.h"

#define SHARED_PARAMS_FN "insitu.shared_params"
#define SHARED_SCALE_FN "insitu.shared_scale"
#define SHARED_FORWARD_FN "insitu.shared_forward"
#define SHARED_OWNER "learner0"

/* On every rank, before mpr_init. */
mpr_err_t shared_register(void);
/* On learner 0, before mpr_init: create the model (seeded). */
mpr_err_t shared_host(int channels, uint64_t seed);
/* Learner 0: the model (borrowed; NULL before shared_host). */
surrogate_t *shared_model(void);
/* Learner 0, --resume: the model, its moment scales and the target scale
 * from learner 0's checkpoint (learner.h's names), before any other learner
 * trains (insitu_heat.c restores it before the ranks agree on the resume step). */
mpr_err_t shared_restore(const mpr_tensor_dict_t *d);
/* Learner 0, after mpr_shutdown: release the model and the RRefs. NULL-safe / idempotent. */
void shared_cleanup(void);

/* A learner: its DistributedOptimizer over the shared parameters (Adam, lr). NULL with the error set. */
mpr_dist_optimizer_t *shared_optimizer(double lr);
/* A learner: the target scale, from its first training sample (see SHARED_SCALE_FN; stride: surrogate_set_scales'). */
mpr_err_t shared_scale(mpr_tensor_t *x, mpr_tensor_t *y, int stride, double *scale);
/* A learner, inside a dist-autograd context: the shared model's prediction for x (scope-owned). */
mpr_tensor_t *shared_forward(mpr_tensor_t *x);

#endif
