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

#define KT float
#define KN(name) name##_f32
#define KEXP expf
#define KLOG logf
#include "cpu_loss_impl.h"
#undef KT
#undef KN
#undef KEXP
#undef KLOG

#define KT double
#define KN(name) name##_f64
#define KEXP exp
#define KLOG log
#include "cpu_loss_impl.h"
