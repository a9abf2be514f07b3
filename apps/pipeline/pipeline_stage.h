/* apps/pipeline/pipeline_stage.h — one stage of the pipeline app: a
 * contiguous group of a Fashion-MNIST model's layers (fmnist_models.h)
 * living on a stage rank as a RemoteModule, and the calls the driver makes
 * on the rank that holds it.
 *
 * The stage is the RemoteModule kind PIPELINE_STAGE_KIND, built from the
 * arguments [model kind, first layer group, group count, seed]: a module
 * "PipelineStage" whose child "net" is app_fmnist_group_create(kind, first,
 * count, seed), so the stage has the same parameters as those groups of the
 * unsplit model. Its forward runs under the stage's lock (micro-batches
 * that arrive together run one after the other, as the anchor's
 * Stage.forward under self.lock); without a current dist autograd context
 * it runs without recording a graph (evaluation).
 *
 * A rank holds at most one stage (creating a second fails). The functions
 * below act on it, each under the stage's lock:
 *   PIPELINE_PROFILE_FN [x, reps] -> [ms, y]: the stage's forward + local
 *     backward (from sum(y)) on x, timed: the median of `reps` runs after
 *     one warm-up; y = the stage's output (no graph), the next stage's input.
 *   PIPELINE_GRADS_FN [ctx id] -> [gradients]: this stage's gradients in
 *     dist autograd context `ctx id`, in parameter order (a zero tensor for
 *     a parameter without one).
 *   PIPELINE_STATE_FN [] -> bytes: .safetensors of the parameters named
 *     "model.<layer group>.<name in the group>", the names of the unsplit
 *     model (app_fmnist_model_create) with prefix "model.".
 *   PIPELINE_LOAD_FN [bytes] -> none: the parameters from such bytes (a
 *     whole checkpoint: the entries of the other stages are ignored).
 *   PIPELINE_ACCUMULATE_FN [ctx id], called inside a dist autograd context
 *     (the mini-batch's): this stage's gradients in context `ctx id` (a
 *     micro-batch's, its backward done) added into the calling context's
 *     (mpr_dist_accumulate_gradient). Not under the stage's lock (it reads
 *     only the parameter list, fixed at construction), so it never waits
 *     for a forward.
 *   PIPELINE_CHAIN_FN [x, k, S] -> stage k's output (async; under the lock
 *     for the forward only): stage 0 runs its forward on x (on the stage's
 *     own thread, in arrival order, which sends each reply as soon as its
 *     forward is done); stage k > 0
 *     makes the same call on stage k - 1 and runs its forward on that
 *     reply (a future callback, in the caller's dist autograd context,
 *     which the calls carry). Called on the last stage (k = S - 1) with a
 *     micro-batch, activations go from stage to stage directly (and their
 *     gradients back the same way), never through the driver.
 *   PIPELINE_MEMORY_FN [] -> [peak bytes, bytes now]: the largest activation memory of
 *     this rank's graphs (mpr_autograd_saved_bytes: the storages saved for
 *     backward, parameters left out) sampled after every forward of the
 *     stage and at every accumulate (after a micro-batch's backward) since
 *     the previous call; the call starts a new period. Activations only
 *     grow during a forward (a backward saves nothing, the dist engine keeps
 *     a context's saved tensors until the context ends), so the samples
 *     after the forwards catch the peak.
 *
 * Ownership: the stage module belongs to its RemoteModule (the RRef's
 * owner frees it); nothing here is the caller's. */
#ifndef MPIRPC_PIPELINE_STAGE_H
#define MPIRPC_PIPELINE_STAGE_H

#include <stddef.h>

#include "mpirpc/error.h"
#include "mpirpc/nn.h"

#define PIPELINE_STAGE_KIND "pipeline.stage"
#define PIPELINE_PROFILE_FN "pipeline.profile"
#define PIPELINE_GRADS_FN "pipeline.grads"
#define PIPELINE_STATE_FN "pipeline.state"
#define PIPELINE_LOAD_FN "pipeline.load"
#define PIPELINE_ACCUMULATE_FN "pipeline.accumulate"
#define PIPELINE_MEMORY_FN "pipeline.memory"
#define PIPELINE_CHAIN_FN "pipeline.chain"

/* The worker name of stage k (0-based): "stage<k+1>". */
void pipeline_stage_worker(int k, char *buf, size_t cap);

/* Register the module kind and the functions above: on every rank, before
 * mpr_init. */
mpr_err_t pipeline_stage_register(void);

/* The name of the parameter `name` of layer group `group` in the unsplit
 * model, with prefix "model." ("model.3.0.weight"), into buf. */
void pipeline_param_key(int group, const char *name, char *buf, size_t cap);

#endif
