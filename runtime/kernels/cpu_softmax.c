/* cpu_softmax.c — CPU softmax and log_softmax along one axis of a contiguous
 * [outer, n, inner] block, forward and backward, for f32 and f64.
 *
 * Invariants: numerically stable (the row max is subtracted before exp, and
 * log_softmax is computed as x - (max + log(sum(exp(x - max))))); kernels only
 * touch the outer*n*inner elements of their buffers and overwrite outputs. */
#include <math.h>
#include <stdint.h>

#include "kernels/mpri_nn_kernels.h"

#define MPRI_KERNEL_BODY "cpu_softmax_impl.h"
#include "cpu_dtypes.h"
