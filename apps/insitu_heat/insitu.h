/* apps/insitu_heat/insitu.h — what the simulation side (stream.c) and the
 * learner side (learner.c) of insitu_heat agree on: the names of the
 * learner's functions and their arguments, and the app's invariant check.
 *
 *   INSITU_SAMPLE_FN [step, sim rank, x f32 (rows+2, cols+2), y f32 (rows, cols)] -> none
 *     x: a simulation rank's block at `step` with its one-cell frame (halos
 *     and walls), y: the block's interior one step later. The reply comes
 *     once the sample is in the learner's bounded inbox.
 *   INSITU_DONE_FN [sim rank, samples sent] -> none
 *     the simulation rank has sent its last sample, every one acknowledged. */
#ifndef INSITU_HEAT_INSITU_H
#define INSITU_HEAT_INSITU_H

#include "app.h"

#define INSITU_SAMPLE_FN "insitu.sample"
#define INSITU_DONE_FN "insitu.done"

/* A broken invariant of the app aborts (in every build type, unlike assert):
 * the apps' shared check. */
#define INSITU_ASSERT(cond) APP_ASSERT(cond, "insitu_heat")

#endif
