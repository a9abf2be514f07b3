/* mpri_nn.h — internal layout of nn modules (the .c files of autograd/nn), not installed.
 *
 * A module is a vtable (kind, forward, optional destroy hook) plus what every
 * module has: a training flag, its own named parameters (owned references to
 * leaf tensors with requires_grad), named children (owned), a weak parent
 * pointer, and a lazily built flat list of (dotted name, parameter) in
 * named_parameters() order. Layer-specific settings live in `cfg`, a union
 * with one named struct per layer kind (only the member of the module's own
 * kind is meaningful). Adding a parameter or child invalidates the flat list of the
 * module and of all its ancestors. */
#ifndef MPRI_NN_H
#define MPRI_NN_H

#include <stdatomic.h>

#include "mpirpc/nn.h"
#include "mpri_tensor.h"

typedef struct mpri_module_vtable {
    const char *kind;
    mpr_tensor_t *(*forward)(mpr_module_t *m, mpr_tensor_t *x);
    void (*destroy)(mpr_module_t *m); /* extra cleanup; may be NULL */
} mpri_module_vtable_t;

typedef struct mpri_named_tensor {
    char *name;
    mpr_tensor_t *t;
} mpri_named_tensor_t;

typedef struct mpri_named_module {
    char *name;
    mpr_module_t *m;
} mpri_named_module_t;

struct mpr_module {
    const mpri_module_vtable_t *vt;
    bool training;
    mpr_module_t *parent; /* weak */
    int n_params, cap_params;
    mpri_named_tensor_t *params;
    int n_children, cap_children;
    mpri_named_module_t *children;
    /* flat named_parameters() cache: names owned, tensors borrowed; built
     * once under module.c's flat_lock, read by any thread after flat_valid
     * (release/acquire) */
    atomic_bool flat_valid;
    int n_flat;
    mpri_named_tensor_t *flat;
    /* layer settings: the member named after the module's kind */
    union {
        struct { int64_t stride, padding; } conv2d;
        struct { double p; } dropout;
        struct { int64_t kernel, stride; } max_pool2d;
        struct { int start_dim, end_dim; } flatten;
        struct { int dim; } log_softmax;
        struct {
            int64_t input_size, hidden_size, num_layers;
            double dropout; /* between layers, training only */
            bool bias, batch_first;
        } lstm;
    } cfg;
    mpr_generator_t *gen; /* borrowed (Dropout, LSTM dropout) */
    /* custom modules (mpr_module_create) */
    char *custom_kind;
    mpr_module_forward_fn custom_forward;
    void *ctx;
    void (*ctx_free)(void *ctx);
};

/* A new module of the given vtable in train mode (NULL + MPR_ERR_NOMEM). */
mpr_module_t *mpri_module_new(const mpri_module_vtable_t *vt);
/* Adds a new parameter `name` of `shape` and `dtype` filled with
 * U(-bound, bound) (normal(0, bound) if `normal`), marked requires_grad.
 * Returns it (BORROWED) or NULL with an error. */
mpr_tensor_t *mpri_module_add_param(mpr_module_t *m, const char *name, mpr_dtype_t dtype,
                                    int ndim, const int64_t *shape, double bound, bool normal,
                                    mpr_generator_t *gen);
/* Adds `child` under `name`; takes ownership (destroys the child on failure,
 * unless it already has a parent). Checks the name (non-empty, no '.',
 * unique among m's parameters and children). */
mpr_err_t mpri_module_add_child(mpr_module_t *m, const char *name, mpr_module_t *child);
/* The own parameter at index i (BORROWED). */
static inline mpr_tensor_t *mpri_module_param(const mpr_module_t *m, int i) {
    return m->params[i].t;
}
/* MPR_ERR_INVALID_ARG unless dtype is float32/float64 (naming `op`). */
mpr_err_t mpri_module_check_dtype(const char *op, mpr_dtype_t dtype);

/* RemoteModule's functions and object type (remote_module.c); run by the
 * autograd layer's init. */
mpr_err_t mpri_remote_module_install(void);

#endif
