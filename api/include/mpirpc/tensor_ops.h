/* mpirpc/tensor_ops.h — tensor creation, views, math ops (each with backward),
 * in-place updates, seeded random numbers, and scopes that free a training
 * step's temporaries in one call.
 *
 * RESULTS AND OWNERSHIP
 * Every op returns a new tensor reference, or NULL with mpr_last_error() set
 * (MPR_ERR_SHAPE / MPR_ERR_DTYPE / MPR_ERR_INVALID_ARG, with a detail naming
 * the op and the shapes, e.g. "add: shapes [2, 3] and [4] cannot be
 * broadcast"). Every op accepts NULL inputs and then returns NULL keeping the
 * error already recorded on the thread, so nested expressions are safe and
 * the first failure is the one reported; when no error is recorded (the NULL
 * did not come from a failed op) it records MPR_ERR_INVALID_ARG "mpr_relu:
 * argument 'a' is NULL", so a NULL result never comes with MPR_OK:
 *     mpr_tensor_t *y = mpr_relu(mpr_linear(x, w, b));   // NULL if any step failed
 * Ops borrow their inputs (they take their own references where they keep one).
 *
 * Who owns a returned reference depends on whether a scope is open on the
 * calling thread:
 *   - no scope open: the caller owns it and must mpr_tensor_release() it;
 *   - a scope open: the innermost scope owns it; the caller must NOT release
 *     it (doing so aborts with "mpirpc: mpr_tensor_release: tensor ... is
 *     owned by an open scope"); it stays valid until that scope ends.
 *     mpr_scope_keep(t) gives the caller its own extra reference that
 *     outlives the scope (that one the caller releases).
 * This applies to every function in this header and mpirpc/autograd.h that
 * returns `mpr_tensor_t *`, and only to those (mpr_tensor_empty() and the
 * RPC runtime always give the caller the reference; mpr_scope_adopt() hands
 * such a reference to the scope).
 *
 * WHY SCOPES (and not a tracing GC or manual release of every temporary):
 * a C training step creates ~20-50 temporaries (activations, graph nodes,
 * gradients of intermediates). Releasing each by hand makes nested
 * expressions impossible and leaks on every error path. A thread-local stack
 * of scopes — each an array of references that mpr_scope_end() releases —
 * gives PyTorch's loop shape:
 *     for (...) {
 *         mpr_scope_begin();
 *         mpr_tensor_t *loss = mpr_cross_entropy(mpr_linear(x, w, b), y);
 *         mpr_backward(loss, NULL, false);
 *         sgd_step(...);                       // in place, creates nothing
 *         mpr_scope_end();                     // frees activations + graph
 *     }
 * Refcounting stays the one source of truth (a scope only holds references),
 * so a tensor that is both scope-owned and kept elsewhere (a parameter's
 * .grad, a graph node's saved input, an RPC in flight) lives on exactly as
 * long as needed; there is no separate lifetime rule to get wrong. The scope
 * arrays are reused across iterations (no allocation per step in steady
 * state). Scopes are per thread, so RPC worker threads are unaffected.
 *
 * SHAPES are (ndim, const int64_t *shape) pairs; MPR_SHAPE(2, 3) expands to
 * `2, (const int64_t[]){2, 3}` for literals: mpr_zeros(MPR_F32, MPR_SHAPE(2, 3)).
 * Negative dims count from the end (-1 is the last) wherever a dim is taken.
 *
 * DTYPES: float ops work on float32 and float64 (both operands the same dtype;
 * no implicit promotion: MPR_ERR_DTYPE); int64 is supported by creation,
 * copies/conversion, views and index ops.
 *
 * DEVICES: an op runs on the device of its inputs (all inputs on one device,
 * else MPR_ERR_INVALID_ARG naming both) and returns its result there; CUDA
 * tensors need a build with the CUDA backend (MPR_ERR_UNSUPPORTED otherwise).
 * Creation functions make CPU tensors; functions that read or write element
 * values on the host (mpr_item, mpr_copy_to_buffer, mpr_allclose, random
 * fills, mpr_max over all elements) take CPU tensors only.
 *
 * THREADS: ops on distinct tensors may run concurrently on any threads; a
 * tensor that is being written in place must not be read at the same time. */
#ifndef MPIRPC_TENSOR_OPS_H
#define MPIRPC_TENSOR_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "mpirpc/autograd.h"
#include "mpirpc/error.h"
#include "mpirpc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MPR_SHAPE(...)                                                        \
    (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),          \
        (const int64_t[]) { __VA_ARGS__ }

/* ------------------------------------------------------------------ scopes */

/* Open a scope on the calling thread (scopes nest). */
void mpr_scope_begin(void);
/* Release every reference the innermost scope owns and close it. Calling it
 * with no scope open is a no-op. */
void mpr_scope_end(void);
/* Number of scopes open on the calling thread. */
int mpr_scope_depth(void);
/* A new reference to `t` owned by the caller (to survive the scope): the
 * scope keeps and later drops its own. Returns `t`; NULL gives NULL. */
mpr_tensor_t *mpr_scope_keep(mpr_tensor_t *t);
/* Move ownership of a reference from the innermost scope to the one around it
 * (or to the caller when there is none). Returns `t`. */
mpr_tensor_t *mpr_scope_escape(mpr_tensor_t *t);
/* Hand a caller-owned reference (e.g. from mpr_tensor_empty or an RPC result)
 * to the innermost scope. With no scope open the caller keeps owning it.
 * Returns `t`. */
mpr_tensor_t *mpr_scope_adopt(mpr_tensor_t *t);

/* --------------------------------------------------------------- creation */

mpr_tensor_t *mpr_zeros(mpr_dtype_t dtype, int ndim, const int64_t *shape);
mpr_tensor_t *mpr_ones(mpr_dtype_t dtype, int ndim, const int64_t *shape);
mpr_tensor_t *mpr_full(mpr_dtype_t dtype, int ndim, const int64_t *shape, double value);
/* 1-D [ceil((end-start)/step)]: start, start+step, ... < end (step != 0). */
mpr_tensor_t *mpr_arange(mpr_dtype_t dtype, double start, double end, double step);
/* A new contiguous tensor holding a COPY of `data` (numel * dtype size bytes,
 * row-major); the caller keeps ownership of `data`. */
mpr_tensor_t *mpr_from_buffer(mpr_dtype_t dtype, int ndim, const int64_t *shape, const void *data);
/* Same shape/dtype as `like`. */
mpr_tensor_t *mpr_zeros_like(const mpr_tensor_t *like);
mpr_tensor_t *mpr_ones_like(const mpr_tensor_t *like);
/* A contiguous copy with history (PyTorch's clone): gradients flow back to `t`. */
mpr_tensor_t *mpr_clone(mpr_tensor_t *t);
/* Conversion to `dtype` (a copy; differentiable between float dtypes). */
mpr_tensor_t *mpr_to_dtype(mpr_tensor_t *t, mpr_dtype_t dtype);
/* Read a one-element tensor as double (MPR_ERR_SHAPE if numel != 1). */
mpr_err_t mpr_item(const mpr_tensor_t *t, double *out);
/* Copy `t` (any strides) as `dtype` into `out` (capacity `out_bytes`), row-major. */
mpr_err_t mpr_copy_to_buffer(const mpr_tensor_t *t, mpr_dtype_t dtype, void *out, size_t out_bytes);

/* ------------------------------------------------------- random numbers
 * A generator is a seeded counter-based stream (xoshiro256**), so the same
 * seed gives the same numbers on every run and machine. `gen` NULL means the
 * process-wide default generator (seeded 0 until mpr_manual_seed; guarded by
 * a mutex). A generator object is not thread-safe: one per thread. */
typedef struct mpr_generator mpr_generator_t;
mpr_generator_t *mpr_generator_create(uint64_t seed);   /* caller destroys */
void mpr_generator_destroy(mpr_generator_t *gen);       /* accepts NULL */
void mpr_generator_seed(mpr_generator_t *gen, uint64_t seed);
void mpr_manual_seed(uint64_t seed);                    /* the default generator */
/* Uniform in [0, 1). Float dtypes only. */
mpr_tensor_t *mpr_rand(mpr_dtype_t dtype, int ndim, const int64_t *shape, mpr_generator_t *gen);
/* Standard normal. */
mpr_tensor_t *mpr_randn(mpr_dtype_t dtype, int ndim, const int64_t *shape, mpr_generator_t *gen);
/* Uniform in [lo, hi). */
mpr_tensor_t *mpr_uniform(mpr_dtype_t dtype, int ndim, const int64_t *shape, double lo, double hi,
                          mpr_generator_t *gen);
/* Normal(mean, std). */
mpr_tensor_t *mpr_normal(mpr_dtype_t dtype, int ndim, const int64_t *shape, double mean, double std,
                         mpr_generator_t *gen);
/* In place: fill `t` (float) with uniform [lo, hi) / normal(mean, std) numbers
 * (used by nn init). Bumps the version; needs no-grad mode if t requires grad. */
mpr_err_t mpr_uniform_(mpr_tensor_t *t, double lo, double hi, mpr_generator_t *gen);
mpr_err_t mpr_normal_(mpr_tensor_t *t, double mean, double std, mpr_generator_t *gen);
/* Raw draws for callers that need them (dropout masks, shuffling). */
uint64_t mpr_generator_next_u64(mpr_generator_t *gen);
double mpr_generator_next_double(mpr_generator_t *gen); /* [0, 1) */

/* ------------------------------------------------------------------ views
 * Views share storage (and version counter) with their input; gradients flow
 * back through them. */

/* shape may contain one -1 (inferred). Returns a view when `t`'s strides
 * allow, else a contiguous copy (as torch.reshape). */
mpr_tensor_t *mpr_reshape(mpr_tensor_t *t, int ndim, const int64_t *shape);
/* As reshape but never copies: MPR_ERR_SHAPE if the strides do not allow a view. */
mpr_tensor_t *mpr_view(mpr_tensor_t *t, int ndim, const int64_t *shape);
/* Merge dims start..end (inclusive) into one. */
mpr_tensor_t *mpr_flatten(mpr_tensor_t *t, int start_dim, int end_dim);
mpr_tensor_t *mpr_transpose(mpr_tensor_t *t, int dim0, int dim1);
/* dims: a permutation of 0..ndim-1, length ndim. */
mpr_tensor_t *mpr_permute(mpr_tensor_t *t, int ndim, const int *dims);
/* Elements start .. start+length-1 along dim. */
mpr_tensor_t *mpr_narrow(mpr_tensor_t *t, int dim, int64_t start, int64_t length);
/* Python's t[..., start:end:step, ...] along dim; step >= 1; start/end are
 * clamped to the size like Python slices (negative counts from the end). */
mpr_tensor_t *mpr_slice(mpr_tensor_t *t, int dim, int64_t start, int64_t end, int64_t step);
/* Element `index` along dim, removing dim. */
mpr_tensor_t *mpr_select(mpr_tensor_t *t, int dim, int64_t index);
mpr_tensor_t *mpr_unsqueeze(mpr_tensor_t *t, int dim);
/* Remove dim if its size is 1 (else returns a view of t unchanged, as torch). */
mpr_tensor_t *mpr_squeeze(mpr_tensor_t *t, int dim);
/* Remove every size-1 dim. */
mpr_tensor_t *mpr_squeeze_all(mpr_tensor_t *t);
/* Broadcast view to `shape` (stride 0 on expanded dims; -1 keeps a size). */
mpr_tensor_t *mpr_expand(mpr_tensor_t *t, int ndim, const int64_t *shape);
/* `t` itself (new reference) if contiguous, else a contiguous copy with history. */
mpr_tensor_t *mpr_contiguous(mpr_tensor_t *t);

/* ------------------------------------------------ elementwise (broadcasting)
 * Binary ops: a [A...], b [B...] broadcast like NumPy/PyTorch to the result
 * [broadcast(A, B)]; both operands must have the same float dtype. Unary ops:
 * a [*] -> [*]. Results are new contiguous tensors. */
mpr_tensor_t *mpr_add(mpr_tensor_t *a, mpr_tensor_t *b);
mpr_tensor_t *mpr_sub(mpr_tensor_t *a, mpr_tensor_t *b);
mpr_tensor_t *mpr_mul(mpr_tensor_t *a, mpr_tensor_t *b);
mpr_tensor_t *mpr_div(mpr_tensor_t *a, mpr_tensor_t *b);
mpr_tensor_t *mpr_add_scalar(mpr_tensor_t *a, double s);  /* a + s */
mpr_tensor_t *mpr_mul_scalar(mpr_tensor_t *a, double s);  /* a * s */
mpr_tensor_t *mpr_rsub_scalar(mpr_tensor_t *a, double s); /* s - a */
mpr_tensor_t *mpr_neg(mpr_tensor_t *a);
mpr_tensor_t *mpr_pow(mpr_tensor_t *a, double exponent);  /* a ** exponent */
mpr_tensor_t *mpr_exp(mpr_tensor_t *a);
mpr_tensor_t *mpr_log(mpr_tensor_t *a);
mpr_tensor_t *mpr_sqrt(mpr_tensor_t *a);
mpr_tensor_t *mpr_abs(mpr_tensor_t *a);
/* Clamp to [lo, hi]; pass -INFINITY / INFINITY for no bound. Gradient 1
 * where lo <= a <= hi, else 0 (as PyTorch). */
mpr_tensor_t *mpr_clamp(mpr_tensor_t *a, double lo, double hi);
mpr_tensor_t *mpr_relu(mpr_tensor_t *a);
mpr_tensor_t *mpr_tanh(mpr_tensor_t *a);
mpr_tensor_t *mpr_sigmoid(mpr_tensor_t *a);
/* Exact (erf) form, PyTorch's default: x * 0.5 * (1 + erf(x / sqrt(2))). */
mpr_tensor_t *mpr_gelu(mpr_tensor_t *a);

/* ------------------------------------------------------------- reductions */
/* Sum / mean of all elements: a [*] -> 0-d tensor []. */
mpr_tensor_t *mpr_sum(mpr_tensor_t *a);
mpr_tensor_t *mpr_mean(mpr_tensor_t *a);
/* Over `ndims` distinct dims (ndims 0 reduces nothing): a [*] -> [*] without
 * those dims, or with them as size 1 when keepdim. */
mpr_tensor_t *mpr_sum_dims(mpr_tensor_t *a, int ndims, const int *dims, bool keepdim);
mpr_tensor_t *mpr_mean_dims(mpr_tensor_t *a, int ndims, const int *dims, bool keepdim);
/* Max of all elements (0-d); the gradient is split evenly between ties. */
mpr_tensor_t *mpr_max(mpr_tensor_t *a);
/* Max along dim: a [*] -> values [*] without dim (size 1 when keepdim). If
 * indices_out is not NULL it receives the int64 argmax tensor of the same
 * shape (owned like the result). The gradient goes to the argmax element. */
mpr_tensor_t *mpr_max_dim(mpr_tensor_t *a, int dim, bool keepdim, mpr_tensor_t **indices_out);
/* int64 argmax along dim (first maximum), shaped as max_dim's values; not
 * differentiable. */
mpr_tensor_t *mpr_argmax(mpr_tensor_t *a, int dim, bool keepdim);

/* ----------------------------------------------------------------- matmul */
/* a [..., n, k] @ b [..., k, m] -> [..., n, m]; batch dims broadcast as
 * torch.matmul (a 1-D operand is treated as a row/column vector and that dim
 * removed from the result). Runs on cblas_sgemm/dgemm (tiny products on the
 * library's own kernel); transposed views are passed without a copy. */
mpr_tensor_t *mpr_matmul(mpr_tensor_t *a, mpr_tensor_t *b);
/* x [*, in] @ w[out, in]^T + b[out] -> [*, out]; b may be NULL. One gemm
 * forward, two (or one when x needs no grad) backward. */
mpr_tensor_t *mpr_linear(mpr_tensor_t *x, mpr_tensor_t *w, mpr_tensor_t *b);

/* BLAS threads of this process: default 1 (ranks already fill the cores),
 * or the MPIRPC_BLAS_THREADS environment variable at first BLAS use. */
void mpr_blas_set_num_threads(int n);
int mpr_blas_num_threads(void);
/* The kernel set OpenBLAS runs (its core name, e.g. "SkylakeX", "Haswell";
 * "" if it gives none). Static string. */
const char *mpr_blas_kernels(void);
/* The kernel set to start the program with (OPENBLAS_CORETYPE=<it>) when
 * OpenBLAS did not recognise this CPU and fell back to its generic
 * "Prescott" kernels although the CPU has AVX2 or AVX-512: "SkylakeX" or
 * "Haswell"; "" otherwise, or when OPENBLAS_CORETYPE is already set. The
 * set can only be chosen before OpenBLAS loads (at program start); the
 * first matrix product of such a process prints this advice once per host.
 * Static string. */
const char *mpr_blas_better_kernels(void);

/* ------------------------------------------------------ in-place updates
 * t [*] (any strides, a view writes through to its base); other/src [*]
 * broadcastable to t. Write into `t`'s storage and bump its version counter (backward through a
 * graph that saved `t` then fails). On a tensor that requires grad they are
 * refused (MPR_ERR_STATE) unless grad mode is off — wrap optimizer steps in
 * mpr_set_grad_enabled(false). `other` broadcasts to t's shape. */
mpr_err_t mpr_add_(mpr_tensor_t *t, mpr_tensor_t *other);
/* t += alpha * other (axpy; the SGD update p += -lr * g). */
mpr_err_t mpr_add_scaled_(mpr_tensor_t *t, mpr_tensor_t *other, double alpha);
mpr_err_t mpr_mul_(mpr_tensor_t *t, mpr_tensor_t *other);
mpr_err_t mpr_mul_scalar_(mpr_tensor_t *t, double s);
mpr_err_t mpr_fill_(mpr_tensor_t *t, double value);
mpr_err_t mpr_zero_(mpr_tensor_t *t);
/* Copy `src` (broadcast to t's shape, converted to t's dtype) into `t`. */
mpr_err_t mpr_copy_(mpr_tensor_t *t, mpr_tensor_t *src);

/* --------------------------------------------------------------- helpers */
/* Formats "[2, 3]" into buf (always NUL-terminated); returns buf. */
char *mpr_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap);
/* True if both have the same shape and |a-b| <= atol + rtol*|b| everywhere
 * (any strides/dtypes; false on NULL, shape mismatch or a CUDA tensor). */
bool mpr_allclose(const mpr_tensor_t *a, const mpr_tensor_t *b, double rtol, double atol);

#ifdef __cplusplus
}
#endif
#endif
