/* cpu_conv.c — CPU kernels for 2-D convolution by im2col + GEMM (im2col and
 * its adjoint col2im; the GEMMs are the backend's gemm, called by
 * autograd/ops_nn_conv.c) and for 2-D max pooling with saved argmax, f32 and
 * f64.
 *
 * Invariants: im2col writes every element of its column buffer (zeros where
 * the window hangs over the padding) and col2im is its exact adjoint
 * (accumulating), so conv backward is the transpose of forward; max pooling
 * pads with -inf, the first maximum in a window wins ties, and the argmax is
 * the flat index inside the H*W plane. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/mpri_nn_kernels.h"

#define MPRI_KERNEL_BODY "cpu_conv_impl.h"
#include "cpu_dtypes.h"
