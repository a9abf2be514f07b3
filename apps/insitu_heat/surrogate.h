/* apps/insitu_heat/surrogate.h — the surrogate model of insitu_heat (a
 * PDE-Net-style model, learner.h describes it): fixed finite-difference
 * "moment" filters scaled per channel, a learned linear stencil on them and
 * a small MLP of the value. Used by a learner's own model (learner.c) and by
 * the model learner 0 shares with the others (shared.h).
 *
 * Ownership: surrogate_init creates the tensors and modules,
 * surrogate_destroy releases them (a zeroed struct is fine). The parameters
 * are the three modules' (weight, bias each) in that order. */
#ifndef INSITU_HEAT_SURROGATE_H
#define INSITU_HEAT_SURROGATE_H

#include <stdbool.h>

#include "mpirpc/mpirpc.h"

enum { SURROGATE_MODULES = 3, SURROGATE_PARAMS = 6 };

typedef struct surrogate {
    mpr_tensor_t *moments;   /* [9, 1, 3, 3], fixed: outer products of (centre, d/dx, d2/dx2) */
    mpr_tensor_t *inv_scale; /* [1, 9, 1, 1]: 1 / RMS of each moment over the first training sample (NULL before) */
    mpr_module_t *stencil;   /* Conv2d(9, 1, 1x1) */
    mpr_module_t *hidden;    /* Conv2d(1, C, 1x1) on the value channel */
    mpr_module_t *out;       /* Conv2d(C, 1, 1x1) */
} surrogate_t;

/* The names of the modules in checkpoints: "model.stencil.", "model.hidden.", "model.out.". */
extern const char *const surrogate_module_prefix[SURROGATE_MODULES];

mpr_err_t surrogate_init(surrogate_t *m, int channels, mpr_generator_t *gen);
void surrogate_destroy(surrogate_t *m);
/* Module k (0: stencil, 1: hidden, 2: out), borrowed. */
mpr_module_t *surrogate_module(surrogate_t *m, int k);
/* The SURROGATE_PARAMS parameters (borrowed) into p. */
void surrogate_parameters(surrogate_t *m, mpr_tensor_t **p);

/* From a sample (x: the patch with its frame [h+2, w+2], y: the next
 * interior [h, w]): set the moment scales and return in *target_scale the
 * RMS of its increment (1 if 0), the scale the model's output is measured in.
 * Both are taken over the interior cells (i, j) with i and j multiples of
 * `stride` (1: every cell; the model is a local stencil, so a uniform
 * subsample estimates them at 1 / stride^2 of the cost). */
mpr_err_t surrogate_set_scales(surrogate_t *m, mpr_tensor_t *x, mpr_tensor_t *y, int stride, double *target_scale);

/* x [B, 1, h+2, w+2] -> the predicted increment / target scale of the
 * interior cells (stride * i, stride * j), [B, 1, ceil(h / stride),
 * ceil(w / stride)] (scope-owned; stride 1: every cell, [B, 1, h, w]).
 * snapshot: the convolutions use clones of the parameters (the graph saves
 * the clones, gradients flow through them to the parameters), so that an
 * optimizer step on the parameters between this forward and its backward
 * does not trip autograd's version check. */
mpr_tensor_t *surrogate_forward(surrogate_t *m, mpr_tensor_t *x, int stride, bool snapshot);

/* The interior cells (stride * i, stride * j) of t [..., h, w]: a view (scope-owned). */
mpr_tensor_t *surrogate_subsample(mpr_tensor_t *t, int stride);

#endif
