/* mpirpc/nn.h — torch.nn-style modules: Linear, Embedding, LSTM, Dropout,
 * Conv2d, MaxPool2d, ReLU, Tanh, Flatten, LogSoftmax and a Sequential
 * container, with named parameter iteration, train/eval mode and PyTorch's
 * default initialization.
 *
 * A module (opaque mpr_module_t) owns its parameters: leaf tensors with
 * requires_grad set, created at construction and released by
 * mpr_module_destroy(). Parameter names follow PyTorch's state_dict keys
 * ("weight", "bias", "weight_ih_l0", and "0.weight" inside a Sequential), so
 * a .safetensors file written by PyTorch maps 1:1. Iteration order is
 * registration order, children after the module's own parameters, like
 * nn.Module.named_parameters().
 *
 * Initialization (as PyTorch 1.13): Linear/Conv2d weight
 * kaiming_uniform(a=sqrt(5)) i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)), bias
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)); Embedding N(0, 1); LSTM every tensor
 * U(-1/sqrt(hidden), 1/sqrt(hidden)). Draws come from `gen` (NULL: the
 * default generator of tensor_ops.h), so a seed gives the same model on
 * every run (not PyTorch's numbers: its generator differs).
 *
 * Ownership: constructors return a module the caller destroys (or hands to a
 * container, which then owns it). mpr_module_forward() returns a tensor owned
 * like any op result (the innermost scope, else the caller). Parameter
 * accessors return BORROWED pointers valid while the module lives.
 * mpr_module_destroy(NULL) is a no-op.
 *
 * Threads: building or changing a module (constructors, registering
 * parameters or children, destroy) is one thread's work, with no other
 * thread using the module meanwhile. A built module's parameter accessors
 * (mpr_module_num_parameters, _parameter, _get_parameter, _parameter_numel)
 * may be called from several threads at once, e.g. by RPC handlers serving
 * several trainers. */
#ifndef MPIRPC_NN_H
#define MPIRPC_NN_H

#include <stdbool.h>
#include <stdint.h>

#include "mpirpc/nn_functional.h"
#include "mpirpc/tensor_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mpr_module mpr_module_t;

/* ------------------------------------------------------------- generic */

/* y = module(x). For LSTM this is the output sequence with a zero initial
 * state (use mpr_lstm_forward for the state). Borrows x. */
mpr_tensor_t *mpr_module_forward(mpr_module_t *m, mpr_tensor_t *x);
/* Frees the module, its children and its references to its parameters. */
void mpr_module_destroy(mpr_module_t *m);
/* "Linear", "Sequential", ... (static string). */
const char *mpr_module_kind(const mpr_module_t *m);

/* Number of parameter tensors of m and all its descendants. */
int mpr_module_num_parameters(mpr_module_t *m);
/* i-th parameter in named_parameters() order (BORROWED), NULL if out of
 * range; *name (may be NULL) receives its dotted name, owned by the module. */
mpr_tensor_t *mpr_module_parameter(mpr_module_t *m, int i, const char **name);
/* The parameter called `name` (BORROWED), or NULL with MPR_ERR_NOT_FOUND. */
mpr_tensor_t *mpr_module_get_parameter(mpr_module_t *m, const char *name);
/* Total number of parameter elements. */
int64_t mpr_module_parameter_numel(mpr_module_t *m);

/* Train (true) or eval (false) mode for m and all descendants (affects
 * Dropout). Modules start in train mode. */
void mpr_module_train(mpr_module_t *m, bool training);
bool mpr_module_is_training(const mpr_module_t *m);
/* Drop the .grad of every parameter (set_to_none semantics). */
void mpr_module_zero_grad(mpr_module_t *m);

/* ------------------------------------------------------- custom modules
 * The C form of `class Net(nn.Module)`: a module whose forward is a user
 * function, with named children and parameters registered by the user, so
 * names come out as PyTorch's ("encoder.weight", "rnn.weight_ih_l0", ...).
 * Names are non-empty, contain no '.', and are unique within a module. */
typedef mpr_tensor_t *(*mpr_module_forward_fn)(mpr_module_t *self, mpr_tensor_t *x, void *ctx);
/* kind: shown by mpr_module_kind (copied). ctx: user data passed to forward;
 * if ctx_free is not NULL the module calls it on ctx when destroyed.
 * forward must return a tensor owned like an op result (what ops and
 * mpr_module_forward return; to return x itself, return
 * mpr_scope_adopt(mpr_tensor_retain(x))), or NULL with an error set. */
mpr_module_t *mpr_module_create(const char *kind, mpr_module_forward_fn forward, void *ctx,
                                void (*ctx_free)(void *ctx));
/* The ctx given to mpr_module_create (NULL for built-in modules). */
void *mpr_module_ctx(const mpr_module_t *m);
/* Registers `child` under `name`; m takes ownership, also on failure (then it
 * destroys the child) — except for a child that already has a parent
 * (MPR_ERR_STATE, nothing changes). Works on any module that is not a
 * built-in layer (custom modules and Sequential). */
mpr_err_t mpr_module_add_child(mpr_module_t *m, const char *name, mpr_module_t *child);
/* The child called `name` (BORROWED), or NULL with MPR_ERR_NOT_FOUND. */
mpr_module_t *mpr_module_child(mpr_module_t *m, const char *name);
/* Registers leaf float tensor `t` as parameter `name` (a reference is taken;
 * requires_grad is set on it). */
mpr_err_t mpr_module_add_parameter(mpr_module_t *m, const char *name, mpr_tensor_t *t);

/* ---------------------------------------------------------- constructors
 * dtype: MPR_F32 or MPR_F64 for the parameters. gen: NULL for the default
 * generator; borrowed during the call only (Dropout keeps its pointer, see
 * there). Invalid sizes give NULL with MPR_ERR_INVALID_ARG. */

/* y = x W^T + b. Parameters "weight" [out, in], "bias" [out] (if bias). */
mpr_module_t *mpr_linear_create(int64_t in_features, int64_t out_features, bool bias,
                                mpr_dtype_t dtype, mpr_generator_t *gen);
/* Parameter "weight" [num, dim]; forward takes int64 indices [*] -> [*, dim]. */
mpr_module_t *mpr_embedding_create(int64_t num_embeddings, int64_t embedding_dim,
                                   mpr_dtype_t dtype, mpr_generator_t *gen);
/* Parameters "weight" [OC, C, kh, kw], "bias" [OC]; forward [N, C, H, W]. */
mpr_module_t *mpr_conv2d_create(int64_t in_channels, int64_t out_channels, int64_t kh,
                                int64_t kw, int64_t stride, int64_t padding, bool bias,
                                mpr_dtype_t dtype, mpr_generator_t *gen);
/* Dropout with probability p in [0, 1). Masks are drawn from `gen` at each
 * training-mode forward: gen must outlive the module (NULL: the default). */
mpr_module_t *mpr_dropout_create(double p, mpr_generator_t *gen);
/* Window k x k, stride (0: k), no padding. */
mpr_module_t *mpr_max_pool2d_create(int64_t kernel, int64_t stride);
mpr_module_t *mpr_relu_create(void);
mpr_module_t *mpr_tanh_create(void);
/* mpr_flatten(x, start_dim, end_dim) (PyTorch's nn.Flatten defaults: 1, -1). */
mpr_module_t *mpr_flatten_create(int start_dim, int end_dim);
mpr_module_t *mpr_log_softmax_create(int dim);

/* Sequential container: forward runs the children in order. Children are
 * named "0", "1", ... */
mpr_module_t *mpr_sequential_create(void);
/* Appends `child`; the container takes ownership, also on failure (it then
 * destroys the child) — except for a child that already has a parent
 * (MPR_ERR_STATE, nothing changes) or NULL (MPR_ERR_INVALID_ARG). */
mpr_err_t mpr_sequential_append(mpr_module_t *seq, mpr_module_t *child);
/* Number of children / the i-th child (BORROWED) of a Sequential. */
int mpr_sequential_size(const mpr_module_t *seq);
mpr_module_t *mpr_sequential_child(mpr_module_t *seq, int i);

/* ------------------------------------------------------------------ LSTM
 * Multi-layer LSTM with PyTorch's equations and gate order (i, f, g, o):
 *   i = sigmoid(W_ii x + b_ii + W_hi h + b_hi), f = ..., g = tanh(...), o = ...
 *   c' = f * c + i * g, h' = o * tanh(c').
 * Parameters per layer k: "weight_ih_l{k}" [4H, in_k], "weight_hh_l{k}"
 * [4H, H], "bias_ih_l{k}" [4H], "bias_hh_l{k}" [4H] (in_0 = input_size,
 * in_k = H). Input [T, B, input_size], or [B, T, input_size] when
 * batch_first; output [T, B, H] (or [B, T, H]); states [layers, B, H].
 * dropout (between layers, training mode only) as PyTorch's. */
mpr_module_t *mpr_lstm_create(int64_t input_size, int64_t hidden_size, int num_layers,
                              bool bias, bool batch_first, double dropout, mpr_dtype_t dtype,
                              mpr_generator_t *gen);
/* Runs the LSTM on x with initial state (h0, c0) ([layers, B, H] each; both
 * NULL for zeros, or both given). *out, *hn, *cn (each may be NULL if not
 * wanted) receive tensors owned like op results. */
mpr_err_t mpr_lstm_forward(mpr_module_t *lstm, mpr_tensor_t *x, mpr_tensor_t *h0,
                           mpr_tensor_t *c0, mpr_tensor_t **out, mpr_tensor_t **hn,
                           mpr_tensor_t **cn);

#ifdef __cplusplus
}
#endif
#endif
