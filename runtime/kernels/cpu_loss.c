/* cpu_loss.c — CPU loss kernels: nll_loss over log-probabilities, fused
 * cross entropy (log_softmax + nll in one pass, saving only the row
 * log-sum-exp), and mean squared error; forward and backward, f32 and f64.
 *
 * Invariants: mean reduction over the rows whose target differs from
 * ignore_index (the count is returned by forward and passed back to backward
 * so both agree); sums are accumulated in double; targets are trusted to be
 * in [0, C) (the op layer validates them). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/mpri_nn_kernels.h"

#define MPRI_KERNEL_BODY "cpu_loss_impl.h"
#include "cpu_dtypes.h"
