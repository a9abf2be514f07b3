/* mpri_autograd.h — internal: graph nodes, op definitions, saved tensors and
 * the helpers every op file uses (not installed).
 *
 * HOW TO WRITE AN OP (pattern of autograd/ops_*.c):
 *
 *   static mpr_err_t mul_backward(mpri_node_t *n, mpr_tensor_t *const *gout,
 *                                 mpr_tensor_t **gin) {
 *       // gout[0]: grad of the output, [*out shape]; never NULL.
 *       mpr_tensor_t *a = mpri_node_saved(n, 0), *b = mpri_node_saved(n, 1);
 *       if (!a || !b) return mpr_last_error_code();   // freed / modified in place
 *       if (mpri_node_needs_grad(n, 0)) gin[0] = mpri_sum_to(mpr_mul(gout[0], b), a);
 *       if (mpri_node_needs_grad(n, 1)) gin[1] = mpri_sum_to(mpr_mul(gout[0], a), b);
 *       return (needed grads non-NULL) ? MPR_OK : mpr_last_error_code();
 *   }
 *   static const mpri_op_def_t mul_def = {.name = "mul", .backward = mul_backward};
 *
 *   mpr_tensor_t *mpr_mul(mpr_tensor_t *a, mpr_tensor_t *b) {
 *       if (!a || !b) return NULL;                    // keep the first error
 *       mpr_tensor_t *out = ...kernel...;             // caller-owned reference
 *       mpri_node_t *n = mpri_record(&mul_def, 2, (mpr_tensor_t *[]){a, b}, out);
 *       if (n) { mpri_node_save(n, a); mpri_node_save(n, b); }
 *       return mpri_result(out);                      // scope registration
 *   }
 *
 * An op that needs scalars or dims in backward declares a state struct and
 * names it in its def (see MPRI_NODE_STATE below):
 *
 *   typedef struct mpri_ctx_conv2d { int64_t stride_h, stride_w, pad_h, pad_w; } mpri_ctx_conv2d_t;
 *   static const mpri_op_def_t conv_def = {.name = "conv2d", .backward = conv_backward,
 *                                          MPRI_OP_STATE(mpri_ctx_conv2d_t)};
 *   forward:  *MPRI_NODE_STATE(n, mpri_ctx_conv2d_t) = (mpri_ctx_conv2d_t){.stride_h = sh, ...};
 *   backward: const mpri_ctx_conv2d_t *st = MPRI_NODE_STATE(n, mpri_ctx_conv2d_t);
 *
 * Backward functions run with grad mode OFF inside a scope opened by the
 * engine, so they may call the public ops freely: temporaries are freed when
 * the node finishes; the engine takes its own reference to every gin[i].
 * gin[i] must have the shape and dtype of input i (use mpri_sum_to after a
 * broadcast). Leave gin[i] NULL when input i needs no grad. A backward returns
 * MPR_OK or an error code with mpr_error_set detail (the engine stops).
 *
 * Saved tensors are stored as detached aliases (same storage, no autograd
 * meta), which breaks the output -> grad_fn -> saved output cycle and records
 * the storage version at save time; mpri_node_saved() checks it. */
#ifndef MPRI_AUTOGRAD_H
#define MPRI_AUTOGRAD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/mpri_kernels.h"
#include "mpirpc/tensor_ops.h"
#include "mpri_assert.h"
#include "mpri_tensor.h"

typedef struct mpri_node mpri_node_t;

typedef mpr_err_t (*mpri_backward_fn)(mpri_node_t *node, mpr_tensor_t *const *grad_out,
                                      mpr_tensor_t **grad_in);

typedef struct mpri_op_def {
    const char *name;          /* op name used in errors and mpr_grad_fn_name */
    mpri_backward_fn backward; /* NULL only for the engine's leaf accumulator */
    void (*release_ctx)(void *ctx); /* frees node->ctx when the node dies; may be NULL */
    /* The op's inline state type (see MPRI_NODE_STATE), set with MPRI_OP_STATE;
     * 0 / NULL for ops that keep none. */
    size_t state_size;
    const char *state_type;
} mpri_op_def_t;

/* Per-op state kept for backward (dims, scalars, flags): each op that needs
 * some declares a struct `mpri_ctx_<op>_t` with named fields, names it in its
 * def with MPRI_OP_STATE, and reaches it with MPRI_NODE_STATE(node, type) in
 * forward (to fill it) and backward (to read it). The state lives inline in
 * the node (no allocation), at most MPRI_NODE_STATE_BYTES (checked at compile
 * time), zeroed at creation. MPRI_NODE_STATE checks that the node's def
 * declared that type (its size in every build, its name in Debug builds). */
#define MPRI_NODE_STATE_BYTES 48
#define MPRI_OP_STATE(T)                                                                        \
    .state_size = sizeof(T) + 0 * sizeof(char[sizeof(T) <= MPRI_NODE_STATE_BYTES ? 1 : -1]),   \
    .state_type = #T
#define MPRI_NODE_STATE(node, T) ((T *)mpri_node_state((node), sizeof(T), #T))

/* The state of ops working along one (normalized) dim: softmax, index_select,
 * gather, cat, stack/unbind. */
typedef struct mpri_ctx_dim {
    int dim;
} mpri_ctx_dim_t;

/* An edge: gradient for output `output_nr` of `node`. node NULL = no gradient needed. */
typedef struct mpri_edge {
    mpri_node_t *node;
    int output_nr;
} mpri_edge_t;

#define MPRI_NODE_MAX_SAVED 6

typedef struct mpri_tensor_meta {
    mpr_dtype_t dtype;
    int device;             /* -1 CPU, N cuda:N */
    int ndim;
    int64_t shape[MPR_MAX_DIMS];
} mpri_tensor_meta_t;

typedef struct mpri_saved {
    mpr_tensor_t *t;         /* detached alias, owned */
    unsigned long version;   /* storage version when saved */
    bool counted;            /* counted in the storage's saved_refs (not a leaf requiring grad) */
} mpri_saved_t;

struct mpri_node {
    atomic_long refcount;
    const mpri_op_def_t *def;
    int n_next;              /* inputs of the op = edges to follow in backward */
    int n_outputs;           /* outputs of the op = gradients it receives */
    mpri_edge_t *next;       /* [n_next], strong references to next nodes */
    int n_saved;
    bool has_saved;          /* saved anything (backward-twice detection) */
    bool released;           /* saved tensors freed by a backward without retain_graph */
    mpri_saved_t saved[MPRI_NODE_MAX_SAVED];
    /* The op's state for backward (MPRI_NODE_STATE; aligned for any field). */
    union {
        unsigned char bytes[MPRI_NODE_STATE_BYTES];
        int64_t align_i64;
        double align_f64;
        void *align_ptr;
    } state;
    void *ctx;               /* op-owned extra state, freed by def->release_ctx */
    /* Shapes of the op's inputs (to check the gradients a backward returns)
     * and outputs (to make zero gradients for outputs nobody used). ndim -1
     * means unknown (custom nodes that did not set it). */
    mpri_tensor_meta_t *in_meta;  /* [n_next] */
    mpri_tensor_meta_t *out_meta; /* [n_outputs] */
    /* Leaf accumulator only: the leaf tensor (weak; cleared when it dies). */
    mpr_tensor_t *leaf;
    uint64_t seq;            /* creation order (later nodes run first on ties) */
};

/* Per-tensor autograd state (the `autograd` slot of struct mpr_tensor). */
struct mpri_autograd_meta {
    bool requires_grad;      /* leaf flag */
    mpr_tensor_t *grad;      /* leaf .grad, owned */
    mpri_node_t *grad_fn;    /* producer, owned reference; NULL for a leaf */
    int output_nr;
    mpri_node_t *accumulator; /* leaf accumulator, owned; created lazily */
};

/* ---- recording ---- */

/* If grad mode is on and some input requires grad: create a node for `def`
 * with one edge per input, make it the grad_fn of `out` (output 0) and return
 * it (BORROWED: owned by out). Otherwise return NULL (nothing to record). On
 * allocation failure returns NULL with an error set; callers treat that like
 * "no record" (the forward result is still right). */
mpri_node_t *mpri_record(const mpri_op_def_t *def, int n_inputs, mpr_tensor_t *const *inputs,
                         mpr_tensor_t *out);
/* Same for ops with several outputs (outputs[i] gets output_nr i). */
mpri_node_t *mpri_record_multi(const mpri_op_def_t *def, int n_inputs, mpr_tensor_t *const *inputs,
                               int n_outputs, mpr_tensor_t *const *outputs);
/* True if any of the inputs requires grad and grad mode is on (to skip work
 * only needed for backward, e.g. saving a mask). */
bool mpri_any_requires_grad(int n, mpr_tensor_t *const *inputs);
/* Save `t` for backward; returns its index (0, 1, ...) or -1 on failure. */
int mpri_node_save(mpri_node_t *n, mpr_tensor_t *t);
/* The saved tensor `i` (BORROWED, owned by the node), or NULL with
 * MPR_ERR_STATE set if it was freed by an earlier backward or modified in
 * place since it was saved. */
mpr_tensor_t *mpri_node_saved(mpri_node_t *n, int i);
/* The inline state of node n (use MPRI_NODE_STATE): asserts that n's op def
 * declared a state of `size` bytes named `type`. */
static inline void *mpri_node_state(mpri_node_t *n, size_t size, const char *type) {
    MPRI_ASSERT(n->def->state_size == size, "op state accessed with a type its op def does not declare");
    MPRI_DEBUG_ASSERT(n->def->state_type && strcmp(n->def->state_type, type) == 0,
                      "op state accessed with a type its op def does not declare");
    (void)type;
    return n->state.bytes;
}
/* True if the gradient of input `i` is wanted (its edge leads somewhere). */
bool mpri_node_needs_grad(const mpri_node_t *n, int i);

/* Node lifetime (graph ownership is by reference counts). */
mpri_node_t *mpri_node_retain(mpri_node_t *n);
void mpri_node_release(mpri_node_t *n);
/* A bare node (for custom graph functions such as dist autograd's send/recv):
 * n_next edges all empty, 1 output. Caller owns the reference. */
mpri_node_t *mpri_node_create(const mpri_op_def_t *def, int n_next, int n_outputs);
/* Set edge i (takes a reference to edge.node). */
void mpri_node_set_next(mpri_node_t *n, int i, mpri_edge_t edge);
/* Record dtype/device/shape of input i / output k from `t` (enables the
 * engine's gradient shape checks and zero-filling of missing gradients). */
void mpri_node_set_input_meta(mpri_node_t *n, int i, const mpr_tensor_t *t);
void mpri_node_set_output_meta(mpri_node_t *n, int k, const mpr_tensor_t *t);
/* Graph nodes alive in this process (leak checks; mpr_get_debug_info). */
int64_t mpri_node_live_count(void);
/* Free saved tensors (after a backward without retain_graph). */
void mpri_node_release_saved(mpri_node_t *n);

/* ---- tensors and their autograd meta ---- */

/* The op def of leaf accumulators ("AccumulateGrad"; backward NULL). */
extern const mpri_op_def_t mpri_accumulate_def;

/* The meta of `t`, created if missing (NULL on OOM). */
struct mpri_autograd_meta *mpri_meta_get(mpr_tensor_t *t);
/* The edge through which gradient for `t` flows: its grad_fn, or the leaf
 * accumulator if t is a leaf requiring grad (created lazily), else {NULL,0}.
 * The returned node is BORROWED. */
mpri_edge_t mpri_tensor_edge(mpr_tensor_t *t);
/* Make `node` (output `output_nr`) the grad_fn of `t` (takes a reference). */
mpr_err_t mpri_tensor_set_grad_fn(mpr_tensor_t *t, mpri_node_t *node, int output_nr);
/* A tensor object sharing t's storage, view and version, without autograd meta. */
mpr_tensor_t *mpri_alias(const mpr_tensor_t *t);

/* ---- scopes ---- */

/* Register a caller-owned result with the innermost scope (if any) and return
 * it: `return mpri_result(out);` ends every op. NULL passes through. */
mpr_tensor_t *mpri_result(mpr_tensor_t *t);

/* ---- helpers shared by ops ---- */

/* Sum `g` (caller/scope-owned as usual) down to the shape of `like` (undo a
 * broadcast); returns g itself (as a new result) when shapes already match.
 * Returns a scope/caller-owned result like any op; NULL passes through. */
mpr_tensor_t *mpri_sum_to(mpr_tensor_t *g, const mpr_tensor_t *like);
/* Sum to an explicit shape. */
mpr_tensor_t *mpri_sum_to_shape(mpr_tensor_t *g, int ndim, const int64_t *shape);
/* Broadcast shapes of a and b into out (ndim_out); MPR_ERR_SHAPE naming `op`. */
mpr_err_t mpri_broadcast_shape(const char *op, int na, const int64_t *sa, int nb, const int64_t *sb,
                               int *nout, int64_t *out);
/* Normalize a possibly negative dim for a tensor of `ndim` dims (ndim 0 accepts
 * 0 and -1); MPR_ERR_INVALID_ARG naming `op` when out of range. */
mpr_err_t mpri_norm_dim(const char *op, int dim, int ndim, int *out);
/* Error helpers writing "op: <what> [shape a] and [shape b]". */
mpr_err_t mpri_err_shape2(const char *op, const char *what, const mpr_tensor_t *a,
                          const mpr_tensor_t *b);
/* MPR_ERR_DTYPE unless t is float32/float64. */
mpr_err_t mpri_check_float(const char *op, const mpr_tensor_t *t);
/* MPR_ERR_DTYPE unless a and b have the same dtype. */
mpr_err_t mpri_check_same_dtype(const char *op, const mpr_tensor_t *a, const mpr_tensor_t *b);
/* ---- devices ----
 * Ops run their kernels through the backend of their inputs' device (see
 * kernels/mpri_kernels.h); every input must be on the same device. */

/* Backend of the (non-NULL) tensors ts[0..n-1], or NULL with an error naming
 * `op` when they are on different devices or the device has no backend. */
const mpri_backend_t *mpri_backend_of(const char *op, int n, mpr_tensor_t *const *ts);
/* A new contiguous tensor on `device`, uninitialized (caller-owned). */
mpr_tensor_t *mpri_empty_on(int device, mpr_dtype_t dtype, int ndim, const int64_t *shape);
/* Install the runtime's host/device copies for sending CUDA tensors
 * (ops_device.c; an autograd init step). */
mpr_err_t mpri_device_wire_install(void);
/* A new contiguous tensor on `device` filled with `value`, registered as a result. */
mpr_tensor_t *mpri_full_on(int device, mpr_dtype_t dtype, int ndim, const int64_t *shape, double value);
/* `t` itself (new reference) if contiguous, else a contiguous copy on t's device
 * (no history, caller-owned). */
mpr_tensor_t *mpri_contiguous_raw(mpr_tensor_t *t);
/* MPR_ERR_UNSUPPORTED naming `op` unless t is a CPU tensor (host-only ops). */
mpr_err_t mpri_check_cpu(const char *op, const mpr_tensor_t *t);

/* Refuse in-place writes to a tensor that requires grad while grad mode is on. */
mpr_err_t mpri_check_inplace(const char *op, const mpr_tensor_t *t);
/* Bump the storage version of `t` (every in-place write calls this). */
void mpri_bump_version(mpr_tensor_t *t);

#endif
