/* meta.c — per-tensor autograd state: requires_grad, grad_fn, .grad, leaf
 * accumulators, detach and aliases.
 *
 * Invariants: a tensor's meta is created lazily and freed by the release hook
 * installed before the first meta exists. A leaf's accumulator node holds a
 * WEAK pointer to its leaf (graph nodes hold the accumulator strongly, the
 * leaf's meta holds it strongly too); when the leaf dies the hook clears that
 * pointer, so a graph that outlives a leaf drops its gradient instead of
 * touching freed memory. grad_fn is a strong reference; graphs therefore die
 * with their last output.
 *
 * Threads: several threads may record ops on the same leaf at once (a
 * parameter server runs forward for many trainers on its pool), so the lazy
 * creation of a meta and of a leaf accumulator is published under a mutex
 * with release/acquire ordering; everything else in a meta is written by the
 * thread that owns the tensor (or under the engine's gradient lock). */
#include <pthread.h>
#include <stdlib.h>

#include "mpri_args.h"
#include "mpri_autograd.h"
#include "mpri_small_alloc.h"

const mpri_op_def_t mpri_accumulate_def = {.name = "AccumulateGrad", .backward = NULL};

static void meta_release_hook(struct mpri_autograd_meta *m) {
    mpr_tensor_release(m->grad);
    mpri_node_release(m->grad_fn);
    if (m->accumulator) {
        m->accumulator->leaf = NULL;
        mpri_node_release(m->accumulator);
    }
    mpri_small_free(m, sizeof *m);
}

static pthread_once_t hook_once = PTHREAD_ONCE_INIT;
static void install_hook(void) { mpri_tensor_set_autograd_release_hook(meta_release_hook); }
static pthread_mutex_t create_lock = PTHREAD_MUTEX_INITIALIZER;

struct mpri_autograd_meta *mpri_meta_get(mpr_tensor_t *t) {
    struct mpri_autograd_meta *m = __atomic_load_n(&t->autograd, __ATOMIC_ACQUIRE);
    if (m) return m;
    pthread_once(&hook_once, install_hook);
    pthread_mutex_lock(&create_lock);
    m = t->autograd;
    if (!m) {
        m = mpri_small_calloc(sizeof *m);
        if (m) __atomic_store_n(&t->autograd, m, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&create_lock);
    if (!m) mpr_error_set(MPR_ERR_NOMEM, "autograd: out of memory for tensor meta");
    return m;
}

bool mpr_requires_grad(const mpr_tensor_t *t) {
    MPRI_ARG_NONNULL_OR(t, false);
    return t && t->autograd && (t->autograd->requires_grad || t->autograd->grad_fn);
}

bool mpr_is_leaf(const mpr_tensor_t *t) {
    MPRI_ARG_NONNULL_OR(t, false);
    return t && !(t->autograd && t->autograd->grad_fn);
}

const char *mpr_grad_fn_name(const mpr_tensor_t *t) {
    MPRI_ARG_NONNULL_OR(t, NULL);
    if (!t || !t->autograd || !t->autograd->grad_fn) return NULL;
    return t->autograd->grad_fn->def->name;
}

mpr_err_t mpri_check_float(const char *op, const mpr_tensor_t *t) {
    if (t->dtype == MPR_F32 || t->dtype == MPR_F64) return MPR_OK;
    char sb[96];
    return mpr_error_set(MPR_ERR_DTYPE, "%s: expected a float32/float64 tensor, got %s %s", op,
                         mpr_dtype_name(t->dtype), mpr_shape_str(t->ndim, t->shape, sb, sizeof sb));
}

mpr_err_t mpr_set_requires_grad(mpr_tensor_t *t, bool requires_grad) {
    MPRI_ARG_NONNULL(t);
    if (!t) return mpr_error_set(MPR_ERR_INVALID_ARG, "set_requires_grad: tensor is NULL");
    if (requires_grad && mpri_check_float("set_requires_grad", t) != MPR_OK) return MPR_ERR_DTYPE;
    if (!mpr_is_leaf(t))
        return mpr_error_set(MPR_ERR_STATE,
                             "set_requires_grad: only leaf tensors can be marked (this one comes "
                             "from %s); use mpr_detach first",
                             mpr_grad_fn_name(t));
    if (!requires_grad && !t->autograd) return MPR_OK;
    struct mpri_autograd_meta *m = mpri_meta_get(t);
    if (!m) return MPR_ERR_NOMEM;
    m->requires_grad = requires_grad;
    return MPR_OK;
}

mpr_tensor_t *mpr_tensor_grad(const mpr_tensor_t *t) {
    MPRI_ARG_NONNULL_OR(t, NULL);
    return (t && t->autograd) ? t->autograd->grad : NULL;
}

void mpr_zero_grad(mpr_tensor_t *t) {
    if (!t || !t->autograd) return;
    mpr_tensor_release(t->autograd->grad);
    t->autograd->grad = NULL;
}

mpr_err_t mpr_set_grad(mpr_tensor_t *t, mpr_tensor_t *grad) {
    MPRI_ARG_NONNULL(t);
    if (!t) return mpr_error_set(MPR_ERR_INVALID_ARG, "set_grad: tensor is NULL");
    if (grad) {
        if (grad->dtype != t->dtype)
            return mpr_error_set(MPR_ERR_DTYPE, "set_grad: grad dtype %s, tensor dtype %s",
                                 mpr_dtype_name(grad->dtype), mpr_dtype_name(t->dtype));
        bool same = grad->ndim == t->ndim;
        for (int i = 0; same && i < t->ndim; i++) same = grad->shape[i] == t->shape[i];
        if (!same) return mpri_err_shape2("set_grad", "grad and tensor shapes differ:", grad, t);
    }
    struct mpri_autograd_meta *m = mpri_meta_get(t);
    if (!m) return MPR_ERR_NOMEM;
    mpr_tensor_retain(grad);
    mpr_tensor_release(m->grad);
    m->grad = grad;
    return MPR_OK;
}

mpri_edge_t mpri_tensor_edge(mpr_tensor_t *t) {
    mpri_edge_t e = {NULL, 0};
    struct mpri_autograd_meta *m = t->autograd;
    if (!m) return e;
    if (m->grad_fn) return (mpri_edge_t){m->grad_fn, m->output_nr};
    if (!m->requires_grad) return e;
    mpri_node_t *acc = __atomic_load_n(&m->accumulator, __ATOMIC_ACQUIRE);
    if (!acc) {
        pthread_mutex_lock(&create_lock);
        acc = m->accumulator;
        if (!acc && (acc = mpri_node_create(&mpri_accumulate_def, 0, 1))) {
            acc->leaf = t;
            mpri_tensor_meta_t *om = &acc->out_meta[0];
            om->dtype = t->dtype;
            om->device = t->storage->device;
            om->ndim = t->ndim;
            for (int i = 0; i < t->ndim; i++) om->shape[i] = t->shape[i];
            __atomic_store_n(&m->accumulator, acc, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&create_lock);
        if (!acc) return e;
    }
    return (mpri_edge_t){acc, 0};
}

mpr_err_t mpri_tensor_set_grad_fn(mpr_tensor_t *t, mpri_node_t *node, int output_nr) {
    struct mpri_autograd_meta *m = mpri_meta_get(t);
    if (!m) return MPR_ERR_NOMEM;
    mpri_node_retain(node);
    mpri_node_release(m->grad_fn);
    m->grad_fn = node;
    m->output_nr = output_nr;
    if (node) m->requires_grad = false; /* non-leaf: requires grad through grad_fn */
    return MPR_OK;
}

mpr_tensor_t *mpri_alias(const mpr_tensor_t *t) {
    return mpri_tensor_view(t->storage, t->dtype, t->ndim, t->shape, t->strides, t->offset);
}

mpr_tensor_t *mpr_detach(mpr_tensor_t *t) {
    MPRI_OP_INPUT(t);
    if (!t) return NULL;
    return mpri_result(mpri_alias(t));
}

void mpri_bump_version(mpr_tensor_t *t) { atomic_fetch_add(&t->storage->version, 1); }

mpr_err_t mpri_check_inplace(const char *op, const mpr_tensor_t *t) {
    if (!mpr_grad_enabled() || !mpr_requires_grad(t)) return MPR_OK;
    char sb[96];
    return mpr_error_set(MPR_ERR_STATE,
                         "%s: in-place write to a tensor %s that requires grad; do it with grad "
                         "mode off (mpr_set_grad_enabled(false)), as optimizers do",
                         op, mpr_shape_str(t->ndim, t->shape, sb, sizeof sb));
}
