/* cpu_lstm.c — CPU kernels of the fused LSTM cell (PyTorch's gate order
 * i, f, g, o), forward and backward, f32 and f64.
 *
 * Invariants: forward stores the activated gates (sigmoid/tanh already
 * applied) in `act`, which with c_prev and the new c is all backward needs;
 * backward overwrites its outputs (gate gradients [B, 4H], and c_prev's
 * gradient [B, H] when asked for). */
#include <math.h>
#include <stdint.h>

#include "cpu_simd_math.h"
#include "kernels/mpri_nn_kernels.h"

#define MPRI_KERNEL_BODY "cpu_lstm_impl.h"
#include "cpu_dtypes.h"
