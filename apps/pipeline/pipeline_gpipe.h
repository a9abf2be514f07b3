/* apps/pipeline/pipeline_gpipe.h — the pipeline app's driver side: a model
 * split into S stages of similar compute placed on the stage ranks as
 * RemoteModules (pipeline_stage.h), and the GPipe schedule over them.
 *
 * The split (pipeline_split): the model's layer groups (fmnist_models.h:
 * one group per weight layer with its activation/pooling) are cut into S
 * contiguous, non-empty runs so that the largest run's cost is as small as
 * possible (exhaustive search; ties go to the earliest cut), the cost of a
 * group being its forward multiply-accumulates per sample
 * (app_fmnist_stage_macs). The measured forward + backward time of each
 * stage (pipeline_profile) shows how well that balances.
 *
 * The GPipe forward (pipeline_forward): the mini-batch is cut into M
 * micro-batches of B / M rows; micro-batch i goes to the last stage as one
 * async call (PIPELINE_CHAIN_FN), whose stage first gets its input from
 * the stage before it the same way, down to stage 1, which runs on the
 * micro-batch itself: activations travel stage to stage, not through the
 * driver. All M micro-batches enter stage 1 at once, where its lock runs
 * them one after the other, so stage k works on one micro-batch while
 * stage k + 1 works on an earlier one. The outputs are concatenated in
 * micro-batch order.
 * Inside a dist autograd context everything is recorded, so one
 * mpr_dist_backward over the mini-batch loss reaches every stage.
 *
 * The 1F1B schedule (pipeline_forward_backward_1f1b, pipeline_1f1b.c):
 * every micro-batch in its own dist autograd context, its backward started
 * as soon as its forward is done, at most S micro-batches in flight, each
 * micro-batch's gradients added into the mini-batch's context on every
 * stage and its context ended at once (freeing its activations), so a
 * stage holds at most about S micro-batches' activations instead of M.
 *
 * Ownership: a pipeline_t is the caller's (pipeline_destroy); tensors
 * passed in are borrowed; tensors returned are new references. */
#ifndef MPIRPC_PIPELINE_GPIPE_H
#define MPIRPC_PIPELINE_GPIPE_H

#include <stdint.h>

#include "mpirpc/mpirpc.h"

typedef struct pipeline {
    const char *model; /* fmnist_models.h kind (borrowed, static) */
    int nstages;
    int *first;        /* [nstages + 1]: stage k holds layer groups [first[k], first[k + 1]) */
    mpr_remote_module_t **stages;
    mpr_rref_t **params; /* every stage's parameter RRefs, stage after stage */
    int nparams;
} pipeline_t;

/* first[0..S]: the split described above of model `kind` into S stages.
 * MPR_ERR_INVALID_ARG (a message for the user) when S < 1 or S exceeds the
 * model's layer groups. */
mpr_err_t pipeline_split(const char *kind, int S, int *first);

/* Create the S stages on the workers "stage1" .. "stage<S>" (waits until
 * each is built: its parameters are fetched). NULL with the error set. */
pipeline_t *pipeline_create(const char *kind, int S, uint64_t seed);
void pipeline_destroy(pipeline_t *p);

/* out = model(x) through the stages, as M micro-batches (the rows of x
 * must be a multiple of M). *out is the caller's. */
mpr_err_t pipeline_forward(pipeline_t *p, mpr_tensor_t *x, int M, mpr_tensor_t **out);
/* One micro-batch `xi` (borrowed) through every stage, stage to stage (the
 * last stage's PIPELINE_CHAIN_FN call): the future of the last stage's
 * output (the caller's, to release), or NULL with the error set. Recorded
 * in the calling thread's current dist autograd context. */
mpr_future_t *pipeline_chain_async(pipeline_t *p, mpr_tensor_t *xi);

/* In dist autograd context `ctx` (made current here for the call): the
 * GPipe forward of x, loss = cross_entropy(outputs, y) (mean over the
 * mini-batch, i.e. the sum over micro-batches of each one's summed loss
 * divided by the rows), mpr_dist_backward over it; *loss its value. */
mpr_err_t pipeline_forward_backward(pipeline_t *p, int64_t ctx, mpr_tensor_t *x, mpr_tensor_t *y, int M,
                                    double *loss);

typedef enum pipeline_schedule { PIPELINE_GPIPE, PIPELINE_1F1B } pipeline_schedule_t;

/* "gpipe" / "1f1b" (the option's spelling) */
const char *pipeline_schedule_name(pipeline_schedule_t s);

/* In dist autograd context `ctx` (the mini-batch's, alive here; the
 * micro-batches run on threads of their own): the 1F1B schedule over M
 * micro-batches, each micro-batch's loss cross_entropy(out_i, y_i) * m / B
 * (so they sum to the mini-batch mean, as pipeline_forward_backward's);
 * afterwards `ctx` holds on every stage the gradients of that sum (the same
 * as the GPipe step's up to float summation order); *loss its value. */
mpr_err_t pipeline_forward_backward_1f1b(pipeline_t *p, int64_t ctx, mpr_tensor_t *x, mpr_tensor_t *y, int M,
                                         double *loss);

/* The step's forward and backward with schedule `s` (one of the two above). */
mpr_err_t pipeline_step(pipeline_t *p, pipeline_schedule_t s, int64_t ctx, mpr_tensor_t *x, mpr_tensor_t *y, int M,
                        double *loss);

/* Every stage's peak activation memory since the previous call
 * (PIPELINE_MEMORY_FN): peak[k] for stage k, and (now: NULL for none) its
 * activation bytes now. */
mpr_err_t pipeline_memory(pipeline_t *p, int64_t *peak, int64_t *now);

/* The measured forward + backward time of every stage on a micro-batch
 * like x (x passed through the stages in turn): ms[k] is stage k's median
 * over `reps` runs. */
mpr_err_t pipeline_profile(pipeline_t *p, mpr_tensor_t *x, int reps, double *ms);

/* Every stage's gradients in context `ctx` (PIPELINE_GRADS_FN), in the
 * order of p->params: *grads a malloc'ed array of p->nparams new
 * references (release each, free the array). */
mpr_err_t pipeline_gradients(pipeline_t *p, int64_t ctx, mpr_tensor_t ***grads);

#endif
