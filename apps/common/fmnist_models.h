/* apps/common/fmnist_models.h — the Fashion-MNIST models of the parameter-
 * server apps and the pipeline app, built as a sequence of stages so that a model can be split
 * into contiguous groups of stages (shards) placed on different workers.
 *
 *   "mlp": 784-256-10, ReLU, log_softmax (the PyTorch anchor's model,
 *          ../shared/anchors/torch_ps_fmnist.py); stages: [Linear 784-256,
 *          ReLU], [Linear 256-10, LogSoftmax]. Input [N, 784].
 *   "cnn": [Conv 1-16 3x3 pad 1, ReLU, MaxPool 2], [Conv 16-32 3x3 pad 1,
 *          ReLU, MaxPool 2, Flatten], [Linear 1568-128, ReLU, Linear 128-10,
 *          LogSoftmax]. Input [N, 1, 28, 28].
 *   "tutorial-cnn": the CNN of the pipeline anchor
 *          (../shared/anchors/torch_pipeline.py), one stage per weight layer:
 *          [Conv 1-16 3x3 pad 1, ReLU], [Conv 16-32 3x3 pad 1, ReLU,
 *          MaxPool 2], [Conv 32-64 3x3 pad 1, ReLU, MaxPool 2, Flatten],
 *          [Linear 3136-128, ReLU], [Linear 128-10]. Input [N, 1, 28, 28];
 *          output logits (use cross entropy).
 *   "mlp-deep": [Linear 784-512, ReLU], 6 x [Linear 512-512, ReLU],
 *          [Linear 512-10], weights drawn from He's normal(0, sqrt(2/in))
 *          (biases as PyTorch). Input [N, 784]; output logits.
 *
 * Stage s of a model is initialized from its own generator seeded with
 * (seed, s), so a stage has the same parameters wherever and in whatever
 * group it is built. A group of stages is a Sequential whose children are
 * the stages (each a Sequential); the whole model is the group of all
 * stages, so its parameter names are "<stage>.<layer>.weight" and the
 * concatenation of the groups' parameters, in group order, is the whole
 * model's parameter order.
 *
 * Ownership: modules returned are the caller's (mpr_module_destroy). */
#ifndef MPIRPC_APP_FMNIST_MODELS_H
#define MPIRPC_APP_FMNIST_MODELS_H

#include <stdbool.h>
#include <stdint.h>

#include "mpirpc/nn.h"

#define APP_FMNIST_MODELS "mlp|cnn"
/* Every kind this file builds (the pipeline app's models too). */
#define APP_FMNIST_ALL_MODELS "mlp|cnn|tutorial-cnn|mlp-deep"

/* Number of stages of model `kind`, 0 for an unknown kind. */
int app_fmnist_model_stages(const char *kind);
/* Multiply-accumulates of stage s's forward pass per sample (its Linear
 * and Conv2d layers; the element-wise layers are not counted): the cost
 * model used to split a model into stages of similar compute. -1 for a bad
 * kind or stage. */
int64_t app_fmnist_stage_macs(const char *kind, int s);
/* Whether the model takes flat [N, 784] input (else [N, 1, 28, 28]). */
bool app_fmnist_model_flat(const char *kind);
/* Stages [first, first + count) as a Sequential; NULL with the error set
 * (MPR_ERR_INVALID_ARG for an unknown kind or a bad range). */
mpr_module_t *app_fmnist_group_create(const char *kind, int first, int count, uint64_t seed);
/* The same parameters (names, order, values), with a forward that applies
 * Linear and Conv2d layers to clones of their parameters, so the autograd
 * graph saves the clones: another thread may then update the parameters in
 * place (an optimizer step of another trainer) before this graph's backward
 * runs, which the version check forbids for the saved parameters themselves
 * (Hogwild-style training: the clone reads whatever the parameters hold at
 * that moment). */
mpr_module_t *app_fmnist_group_create_snapshot(const char *kind, int first, int count, uint64_t seed);
/* The whole model: app_fmnist_group_create(kind, 0, stages, seed). */
mpr_module_t *app_fmnist_model_create(const char *kind, uint64_t seed);
/* First stage of group g when `stages` stages are split into `groups`
 * contiguous groups as evenly as possible (g = groups gives `stages`). */
int app_fmnist_group_first(int stages, int groups, int g);

#endif
