/* apps/insitu_heat/learner.h — a learner rank of insitu_heat: trains a
 * small convolutional surrogate of one simulation step on the samples its
 * simulation ranks stream in (inbox.h), with local autograd and Adam, and
 * reports its error on held-out steps as training goes.
 *
 * Surrogate (a PDE-Net-style model: fixed finite-difference "moment"
 * filters, learned combinations): the 9 products of (value, d/dx, d2/dx2)
 * along y and x, taken on each cell's 3x3 neighbourhood and divided by their
 * RMS over the first training sample, feed a learned linear stencil
 * (Conv2d(9, 1, 1x1)); the value alone also feeds a small MLP
 * (Conv2d(1, C, 1x1) -> tanh -> Conv2d(C, 1, 1x1)) for pointwise
 * nonlinear terms. The sum is the increment of the h x w interior over one
 * step, divided by a fixed scale (the RMS increment of the first training
 * sample); input: the patch with a one-cell frame, (h+2) x (w+2).
 * (A plain Conv2d(1, C, 3x3) -> tanh -> Conv2d(C, 1, 1x1) learns the same
 * data badly: neighbouring values are nearly equal, so the stencil
 * directions are ill-conditioned for first-order optimizers.)
 *
 * Samples: one of every `holdout` sampled steps (those whose sample index
 * step / every is 1 modulo holdout) is held out for validation: the first
 * `val_keep` of them form the validation set (fixed once full, so the
 * curve is comparable along the run; the others are counted and dropped);
 * the other samples are trained on. Each training sample, when popped, is
 * trained on at once: `steps_per_sample` Adam steps, each on `batch` random
 * crop x crop crops, the first from the new sample, the others from the
 * replay set; then it is offered to the replay set, `replay` samples kept by
 * reservoir sampling (a uniform subset of all training samples so far, so
 * the early states are not forgotten as the simulation moves on). So every
 * sample popped is trained on or held out:
 * received == trained + held_out at the end (checked).
 *
 * Validation error: sqrt(sum (prediction - true increment)^2 / sum (true
 * increment)^2) over the validation set: 1 is the error of predicting
 * "nothing changes", 0 a perfect surrogate. On each block it covers every
 * s-th row and column, s the largest stride leaving at least `val_cells`
 * cells (all of a smaller block; all with val_cells 0); the moment and
 * target scales of the first training sample are taken the same way.
 * Evaluated when the first held-out sample arrives, every `eval_every` Adam
 * steps and at the end; each evaluation is a row of the metrics CSV
 * (app.h's columns plus sim_step, val_rel_err, samples_trained,
 * samples_received).
 *
 * Shared (shared.h): the learners train learner 0's model instead of their
 * own, each with its DistributedOptimizer (Adam) stepping it in a
 * dist-autograd context; the target scale comes from learner 0. Only
 * learner 0 (which holds the model) validates and writes the CSV; the
 * others hold out the same samples but only count them. At the end all
 * learners meet (app_sync) before learner 0's final validation and the
 * checkpoints, so both see the model after every learner's last step. Checkpoints: the
 * model only in learner 0's, "optim." is the learner's DistributedOptimizer
 * state (its Adam on learner 0).
 *
 * Checkpoint (checkpoint_dir, written once every simulation rank is done and
 * the inbox is empty, app_ckpt_save: atomic): everything the training loop's
 * future depends on, so that a resumed learner fed the same samples
 * continues bit for bit like one that never stopped: the surrogate's
 * parameters ("model.stencil.*", "model.hidden.*", "model.out.*"), Adam's
 * state (mpr_optimizer_state_export, "optim."), the moment scales
 * ("learner.inv_scale"), the replay and validation samples ("replay.<k>.x",
 * ".y", "val.<k>.x", ".y", their steps in the metadata), and in the
 * metadata the target scale, the random state, the counts and the first
 * validation error (doubles as %a hex). `resume` restores all of it before
 * the first sample (the metrics CSV keeps its rows up to the checkpoint's
 * Adam step). */
#ifndef INSITU_HEAT_LEARNER_H
#define INSITU_HEAT_LEARNER_H

#include <stdbool.h>
#include <stdint.h>

#include "app.h"
#include "mpirpc/error.h"

typedef struct learner_config {
    int channels, crop, batch, steps_per_sample, replay, holdout, val_keep, eval_every;
    int val_cells; /* validation (and scales): subsample blocks to about this many cells (0: every cell) */
    int64_t every; /* the simulation's sampling interval K (to know held-out steps) */
    double lr;
    uint64_t seed;
    const char *metrics_path; /* NULL: no CSV */
    const char *label;        /* e.g. "learner 0", for the progress lines */
    double log_interval;      /* seconds between progress lines */
    bool shared;                /* train learner 0's model with the others (shared.h; learner 0 hosts it) */
    int index, learners;        /* shared: this learner's index, how many there are */
    int first_learner_rank;     /* shared: learner 0's mpirpc rank (the end barrier's leader, app_sync) */
    const char *checkpoint_dir; /* NULL: none; else this learner's folder, written at the end of the run */
    int64_t sim_steps;          /* the simulation steps done at the end (the checkpoint's app.step) */
    const mpr_tensor_dict_t *resume;     /* NULL, or a checkpoint (borrowed) to continue from */
    const app_ckpt_state_t *resume_state; /* its run state (with resume) */
} learner_config_t;

typedef struct learner_result { /* counts of this run (a resumed learner: since the resume) */
    int64_t received, trained, held_out, adam_steps, evals;
    int64_t owner_steps; /* shared: the step count of this learner's Adam on learner 0 (its state.0.step), else -1 */
    double first_val_err, final_val_err; /* NaN when never evaluated */
    double train_s;              /* wall time of the learner's loop, waits for samples included */
    double busy_s, validate_s;   /* of which: on samples (training and validation), on validation alone */
} learner_result_t;

/* Train until every simulation rank is done and the inbox is empty. */
mpr_err_t learner_run(const learner_config_t *cfg, learner_result_t *out);

#endif
