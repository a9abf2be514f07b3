/* mpirpc/nn_functional.h — the neural-network ops of torch.nn.functional, each
 * with backward: softmax/log_softmax, losses (nll, cross entropy, mse),
 * embedding, dropout, joining and splitting (cat, stack, split, chunk),
 * indexing (index_select, gather), 2-D convolution and max pooling, and a
 * fused LSTM cell.
 *
 * Conventions are those of mpirpc/tensor_ops.h: every function returning
 * `mpr_tensor_t *` returns a new reference owned by the innermost open scope
 * (or by the caller when no scope is open), or NULL with mpr_last_error()
 * naming the op and the shapes; a NULL input gives NULL without touching the
 * error already recorded. Inputs are borrowed. Float ops take float32 or
 * float64 (all float operands of one call share the dtype); indices and class
 * targets are int64 and are bounds-checked (MPR_ERR_INVALID_ARG naming the
 * offending index) before anything is written. Negative dims count from the
 * end. */
#ifndef MPIRPC_NN_FUNCTIONAL_H
#define MPIRPC_NN_FUNCTIONAL_H

#include <stdbool.h>
#include <stdint.h>

#include "mpirpc/tensor_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* PyTorch's default ignore_index for nll_loss / cross_entropy. */
#define MPR_IGNORE_INDEX_DEFAULT (-100)

/* x: any shape; softmax along dim (numerically stable). Same shape as x. */
mpr_tensor_t *mpr_softmax(mpr_tensor_t *x, int dim);
/* x: any shape; log(softmax(x)) along dim computed as x - logsumexp(x). */
mpr_tensor_t *mpr_log_softmax(mpr_tensor_t *x, int dim);

/* logp: [N, C] log-probabilities (or [C] with target [] 0-d); target: [N]
 * int64 class indices in [0, C). Mean of -logp[i, target[i]]: a 0-d tensor. */
mpr_tensor_t *mpr_nll_loss(mpr_tensor_t *logp, mpr_tensor_t *target);
/* As mpr_nll_loss, rows whose target == ignore_index are left out of the mean
 * (PyTorch's ignore_index; a mean over zero rows is 0). */
mpr_tensor_t *mpr_nll_loss_ex(mpr_tensor_t *logp, mpr_tensor_t *target, int64_t ignore_index);
/* logits: [N, C]; target: [N] int64. log_softmax + nll_loss fused (mean): 0-d. */
mpr_tensor_t *mpr_cross_entropy(mpr_tensor_t *logits, mpr_tensor_t *target);
mpr_tensor_t *mpr_cross_entropy_ex(mpr_tensor_t *logits, mpr_tensor_t *target,
                                   int64_t ignore_index);
/* input, target: same shape (no broadcasting; MPR_ERR_SHAPE otherwise), both
 * may require grad. mean((input - target)^2): 0-d. */
mpr_tensor_t *mpr_mse_loss(mpr_tensor_t *input, mpr_tensor_t *target);

/* weight: [V, D]; indices: any shape [*] int64 in [0, V). Result [*, D]; the
 * gradient scatters (adds) into the rows of weight that were used. A weight
 * on a CUDA device takes indices on the CPU or on that device (as
 * index_select and gather do). */
mpr_tensor_t *mpr_embedding(mpr_tensor_t *weight, mpr_tensor_t *indices);

/* Inverted dropout: when training and p > 0, each element is zeroed with
 * probability p and the others scaled by 1/(1-p); the mask is drawn from
 * `gen` (NULL: the default generator). When !training or p == 0 the result is
 * x itself (a new reference, no copy). p in [0, 1]; p == 1 gives zeros. On a
 * CUDA device the mask is the one the CPU would draw from the same state. */
mpr_tensor_t *mpr_dropout(mpr_tensor_t *x, double p, bool training, mpr_generator_t *gen);

/* xs: n >= 1 tensors of the same ndim and dtype whose shapes agree except in
 * dim. Concatenation along dim. */
mpr_tensor_t *mpr_cat(mpr_tensor_t *const *xs, int n, int dim);
/* xs: n >= 1 tensors of identical shape [*]; result has a new dim at `dim`
 * (in [-(ndim+1), ndim]) of size n. */
mpr_tensor_t *mpr_stack(mpr_tensor_t *const *xs, int n, int dim);
/* Views of x along dim of split_size elements each (the last may be smaller),
 * written to out[0 .. *n_out-1]; out has room for `cap` tensors
 * (MPR_ERR_INVALID_ARG if more are needed). Each view is owned like an op
 * result (scope or caller). On error nothing is left owned by the caller. */
mpr_err_t mpr_split(mpr_tensor_t *x, int64_t split_size, int dim, mpr_tensor_t **out, int cap,
                    int *n_out);
/* torch.chunk: ceil(size / chunks)-sized views (so possibly fewer than
 * `chunks` of them); out has room for `chunks` tensors. */
mpr_err_t mpr_chunk(mpr_tensor_t *x, int chunks, int dim, mpr_tensor_t **out, int *n_out);

/* torch.unbind: the x.size(dim) slices of x along dim (views without that
 * dim) into out[0 .. *n_out-1] (room for `cap`), owned like op results.
 * Recorded as one graph node, so backward writes the input gradient once
 * (use it to step through a sequence instead of select() per step). */
mpr_err_t mpr_unbind(mpr_tensor_t *x, int dim, mpr_tensor_t **out, int cap, int *n_out);

/* x: [..., n, ...] (n at dim); index: [k] int64 in [0, n). Result has k at dim. */
mpr_tensor_t *mpr_index_select(mpr_tensor_t *x, int dim, mpr_tensor_t *index);
/* torch.gather: index (int64) has x's ndim, index.size(d) <= x.size(d) for
 * d != dim, values in [0, x.size(dim)). Result has index's shape:
 * out[..i..] = x[..index[..i..] at dim..]. */
mpr_tensor_t *mpr_gather(mpr_tensor_t *x, int dim, mpr_tensor_t *index);

/* x: [N, C, H, W]; weight: [OC, C, kh, kw]; bias: [OC] or NULL. Zero padding
 * (ph, pw), stride (sh, sw) >= 1. Result [N, OC, OH, OW] with
 * OH = (H + 2ph - kh) / sh + 1. im2col + one GEMM per image. */
mpr_tensor_t *mpr_conv2d(mpr_tensor_t *x, mpr_tensor_t *weight, mpr_tensor_t *bias, int64_t sh,
                         int64_t sw, int64_t ph, int64_t pw);
/* x: [N, C, H, W] (or [C, H, W]); window (kh, kw), stride (sh, sw) (0 means
 * the window size, as PyTorch's default), padding (ph, pw) <= half the
 * window, padded with -inf. Result [N, C, OH, OW]; the gradient goes to the
 * (first) maximum of each window. */
mpr_tensor_t *mpr_max_pool2d(mpr_tensor_t *x, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                             int64_t ph, int64_t pw);

/* One fused LSTM step (PyTorch's gate order i, f, g, o). gates: [B, 4H]
 * pre-activations (x W_ih^T + b_ih + h W_hh^T + b_hh); c_prev: [B, H].
 *   i, f, o = sigmoid(...), g = tanh(...); c = f * c_prev + i * g;
 *   h = o * tanh(c).
 * *h_out and *c_out (both required) receive [B, H] tensors owned like op
 * results; one graph node with two outputs. */
mpr_err_t mpr_lstm_cell(mpr_tensor_t *gates, mpr_tensor_t *c_prev, mpr_tensor_t **h_out,
                        mpr_tensor_t **c_out);

#ifdef __cplusplus
}
#endif
#endif
