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

#define KT float
#define KN(name) name##_f32
#include "cpu_index_impl.h"
#undef KT
#undef KN

#define KT double
#define KN(name) name##_f64
#include "cpu_index_impl.h"
