/* cpu_conv.c — CPU kernels for 2-D convolution by im2col + GEMM (im2col and
 * its adjoint col2im; the GEMMs are the backend's gemm, called by
 * autograd/ops_nn_conv.c) and for 2-D max pooling with saved argmax, f32 and
 * f64.
 *
 * Fast paths, each giving exactly the general loop's bits: im2col of a
 * stride-1 convolution as wide as its input ("same" padding) copies each
 * (channel, ki, kj) block of rows at once and zeroes the padding after (one
 * micro-batch of the pipeline app's 16-channel 28x28 layer: 196 -> ~110 us);
 * 2x2 stride-2 max pooling of a plane without NaN runs row by row in
 * vectorized selects (190 -> ~100 us for 256 28x28 planes).
 *
 * Invariants: im2col writes every element of its column buffer (zeros where
 * the window hangs over the padding) and col2im is its exact adjoint
 * (accumulating), so conv backward is the transpose of forward; max pooling
 * pads with -inf, the first maximum in a window wins ties, and the argmax is
 * the flat index inside the H*W plane. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kernels/mpri_nn_kernels.h"

#define MPRI_KERNEL_BODY "cpu_conv_impl.h"
#include "cpu_dtypes.h"
