/* cpu_index.c — CPU kernels for indexing along one axis: index_select (also
 * embedding: outer = 1) and gather, forward and scatter-add backward, f32 and
 * f64.
 *
 * Invariants: indices are trusted to be in range (the op layer validates them
 * once, before any write); backward kernels accumulate so repeated indices sum
 * their gradients, as in PyTorch. */
#include <stdint.h>
#include <string.h>

#include "kernels/mpri_nn_kernels.h"

#define MPRI_KERNEL_BODY "cpu_index_impl.h"
#include "cpu_dtypes.h"
