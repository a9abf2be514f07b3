/* mpri_nn_kernels.h — CPU kernels behind the nn ops (softmax family, losses,
 * index/gather/embedding, im2col convolution, max pooling, the fused LSTM
 * cell). Concatenation needs none: cat uses the backends' strided copy.
 *
 * Every kernel is a pure function on raw, contiguous, row-major buffers; the
 * autograd layer (autograd/ops_*.c) checks shapes and dtypes, makes inputs
 * contiguous and allocates outputs before calling them — through the CPU
 * backend table (cpu_backend.c picks the flavour by dtype), never directly.
 * Each kernel exists in an f32 and an f64 flavour (suffix _f32/_f64)
 * generated from one body, and forward/backward come in pairs. Unless a comment says "accumulates", a
 * kernel overwrites its output. Index arguments are int64 and must already be
 * validated (in range) by the caller — kernels do not bounds-check them.
 *
 * Shape notation: a tensor reduced/indexed along one dim is viewed as
 * [outer, n, inner] where outer is the product of the dims before it and
 * inner the product of the dims after it. */
#ifndef MPRI_NN_KERNELS_H
#define MPRI_NN_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#define MPRI_NN_KERNEL_DECLS(T, S)                                                              \
    /* x, y: [outer, n, inner]; y = softmax(x) (or log_softmax when is_log) along n. */         \
    void mpri_softmax_fwd_##S(const T *x, T *y, int64_t outer, int64_t n, int64_t inner,        \
                              int is_log);                                                      \
    /* y, gy, gx: [outer, n, inner]; y is the forward output. gx = dL/dx (overwrites). */        \
    void mpri_softmax_bwd_##S(const T *y, const T *gy, T *gx, int64_t outer, int64_t n,         \
                              int64_t inner, int is_log);                                       \
    /* logp: [N, C]; target: [N]; weight per row 1/count. Returns the mean of                   \
     * -logp[i, target[i]] over rows whose target != ignore_index (0 if none); *count gets     \
     * the number of such rows. */                                                              \
    double mpri_nll_loss_fwd_##S(const T *logp, const int64_t *target, int64_t N, int64_t C,    \
                                 int64_t ignore_index, int64_t *count);                         \
    /* glogp: [N, C] (overwritten: zero except -g/count at each counted target). */             \
    void mpri_nll_loss_bwd_##S(const int64_t *target, int64_t N, int64_t C,                    \
                               int64_t ignore_index, int64_t count, double g, T *glogp);        \
    /* x: [N, C] logits; target: [N]; lse: [N] out, log(sum(exp(x - rowmax))) per row (saved   \
     * for backward). Returns the mean cross entropy over rows with target != ignore_index. */  \
    double mpri_cross_entropy_fwd_##S(const T *x, const int64_t *target, int64_t N, int64_t C,  \
                                      int64_t ignore_index, T *lse, int64_t *count);            \
    /* gx: [N, C] (overwritten) = (softmax(x) - onehot(target)) * g / count per counted row. */ \
    void mpri_cross_entropy_bwd_##S(const T *x, const int64_t *target, const T *lse, int64_t N, \
                                    int64_t C, int64_t ignore_index, int64_t count, double g,   \
                                    T *gx);                                                     \
    /* a, b: [n]. Returns mean((a - b)^2). */                                                   \
    double mpri_mse_loss_fwd_##S(const T *a, const T *b, int64_t n);                            \
    /* ga, gb: [n] (overwritten; either may be NULL): ga = 2 (a - b) g / n, gb = -ga. */        \
    void mpri_mse_loss_bwd_##S(const T *a, const T *b, int64_t n, double g, T *ga, T *gb);      \
    /* x: [outer, n, inner]; idx: [k] in [0, n); y: [outer, k, inner]. y[o,j,i] =              \
     * x[o, idx[j], i]. (embedding is outer = 1, inner = embedding dim.) */                     \
    void mpri_index_select_fwd_##S(const T *x, const int64_t *idx, T *y, int64_t outer,         \
                                   int64_t n, int64_t k, int64_t inner);                        \
    /* gx: [outer, n, inner] (accumulates: gx[o, idx[j], i] += gy[o, j, i]); gy: [outer,k,inner] */\
    void mpri_index_select_bwd_##S(const T *gy, const int64_t *idx, T *gx, int64_t outer,       \
                                   int64_t n, int64_t k, int64_t inner);                        \
    /* x: [outer, n, inner]; idx, y: [outer, k, inner] (gather along the middle axis with an    \
     * index of the same outer/inner extent). y[o,j,i] = x[o, idx[o,j,i], i]. */                \
    void mpri_gather_fwd_##S(const T *x, const int64_t *idx, T *y, int64_t outer, int64_t n,    \
                             int64_t k, int64_t inner);                                         \
    /* gx: [outer, n, inner] (accumulates); gy, idx: [outer, k, inner]. */                      \
    void mpri_gather_bwd_##S(const T *gy, const int64_t *idx, T *gx, int64_t outer, int64_t n,  \
                             int64_t k, int64_t inner);                                         \
    /* x: [C, H, W] one image; col: [C*kh*kw, oh*ow] (overwritten). Zero padding. */            \
    void mpri_im2col_##S(const T *x, int64_t C, int64_t H, int64_t W, int64_t kh, int64_t kw,   \
                         int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t oh, int64_t ow,\
                         T *col);                                                               \
    /* col: [C*kh*kw, oh*ow]; gx: [C, H, W] (accumulates, the adjoint of im2col). */            \
    void mpri_col2im_##S(const T *col, int64_t C, int64_t H, int64_t W, int64_t kh, int64_t kw, \
                         int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t oh, int64_t ow,\
                         T *gx);                                                                \
    /* x: [N, C, H, W] (padded with -inf); y: [N, C, oh, ow]; arg: [N, C, oh, ow] (flat index   \
     * h*W+w of the max inside its plane, saved for backward). */                               \
    void mpri_max_pool2d_fwd_##S(const T *x, int64_t NC, int64_t H, int64_t W, int64_t kh,      \
                                 int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,    \
                                 int64_t oh, int64_t ow, T *y, int64_t *arg);                   \
    /* gy, arg: [N, C, oh, ow]; gx: [N, C, H, W] (accumulates). */                              \
    void mpri_max_pool2d_bwd_##S(const T *gy, const int64_t *arg, int64_t NC, int64_t H,        \
                                 int64_t W, int64_t oh, int64_t ow, T *gx);                     \
    /* LSTM cell. gates: [B, 4H] pre-activations (i, f, g, o); c_prev: [B, H]; act: [B, 4H]     \
     * out (activated gates, saved for backward); h, c: [B, H] out. */                          \
    void mpri_lstm_cell_fwd_##S(const T *gates, const T *c_prev, int64_t B, int64_t H, T *act,  \
                                T *h, T *c);                                                    \
    /* act: [B, 4H]; c_prev, c, gh, gc: [B, H] (gh, gc: gradients of h and c); ggates: [B, 4H]  \
     * out; gc_prev: [B, H] out or NULL. */                                                     \
    void mpri_lstm_cell_bwd_##S(const T *act, const T *c_prev, const T *c, const T *gh,         \
                                const T *gc, int64_t B, int64_t H, T *ggates, T *gc_prev);

MPRI_NN_KERNEL_DECLS(float, f32)
MPRI_NN_KERNEL_DECLS(double, f64)

#endif
