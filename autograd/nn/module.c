/* module.c — the generic part of nn modules: creation, parameters and their
 * PyTorch-style dotted names, children, train/eval, zero_grad, forward
 * dispatch and destruction.
 *
 * Also custom modules (mpr_module_create: user forward, user-registered
 * children and parameters).
 *
 * Invariants: a module owns one reference to each of its parameters and owns
 * its children; a child has at most one parent; names within a module are
 * unique and dot-free; the flat parameter list is
 * rebuilt on demand after any structural change (flat_valid is cleared up the
 * parent chain), and its order is own parameters first (registration order),
 * then each child's list prefixed by "<child name>.".
 *
 * Threads: building and changing a module (constructors, registering
 * parameters and children, destroy) is one thread's work. A built module's
 * parameter accessors may be called from several threads at once (a
 * parameter server's handlers serving several trainers do): the first one
 * builds the flat list under flat_lock and publishes it with flat_valid
 * (release); readers that see flat_valid (acquire) read the finished list
 * without the lock. Without that, two first calls at once freed each other's
 * list (param_server crashed in strcmp on a NULL name). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_args.h"
#include "mpri_assert.h"
#include "mpri_autograd.h"
#include "nn/mpri_nn.h"

mpr_module_t *mpri_module_new(const mpri_module_vtable_t *vt) {
    mpr_module_t *m = calloc(1, sizeof *m);
    if (!m) {
        mpr_error_set(MPR_ERR_NOMEM, "%s: out of memory", vt->kind);
        return NULL;
    }
    m->vt = vt;
    m->training = true;
    return m;
}

mpr_err_t mpri_module_check_dtype(const char *op, mpr_dtype_t dtype) {
    if (dtype != MPR_F32 && dtype != MPR_F64)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: parameters must be float32 or float64, got %s",
                             op, mpr_dtype_name(dtype));
    return MPR_OK;
}

static void invalidate(mpr_module_t *m) {
    for (; m; m = m->parent) m->flat_valid = false;
}

static char *dupstr(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* MPR_OK if `name` can name a new parameter or child of m. */
static mpr_err_t check_name(const mpr_module_t *m, const char *name) {
    const char *kind = mpr_module_kind(m);
    if (!name || !*name || strchr(name, '.'))
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: invalid name '%s' (non-empty, no '.')", kind,
                             name ? name : "(null)");
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0)
            return mpr_error_set(MPR_ERR_EXISTS, "%s: a parameter named '%s' already exists", kind,
                                 name);
    for (int i = 0; i < m->n_children; i++)
        if (strcmp(m->children[i].name, name) == 0)
            return mpr_error_set(MPR_ERR_EXISTS, "%s: a child named '%s' already exists", kind,
                                 name);
    return MPR_OK;
}

/* Appends (name, t) to m's own parameters, taking a reference to t. */
static mpr_err_t push_param(mpr_module_t *m, const char *name, mpr_tensor_t *t) {
    if (m->n_params == m->cap_params) {
        int cap = m->cap_params ? 2 * m->cap_params : 4;
        mpri_named_tensor_t *p = realloc(m->params, (size_t)cap * sizeof *p);
        if (!p) return mpr_error_set(MPR_ERR_NOMEM, "%s: out of memory", mpr_module_kind(m));
        m->params = p;
        m->cap_params = cap;
    }
    char *nm = dupstr(name);
    if (!nm) return mpr_error_set(MPR_ERR_NOMEM, "%s: out of memory", mpr_module_kind(m));
    m->params[m->n_params].name = nm;
    m->params[m->n_params].t = mpr_tensor_retain(t);
    m->n_params++;
    invalidate(m);
    return MPR_OK;
}

mpr_tensor_t *mpri_module_add_param(mpr_module_t *m, const char *name, mpr_dtype_t dtype,
                                    int ndim, const int64_t *shape, double bound, bool normal,
                                    mpr_generator_t *gen) {
    if (check_name(m, name) != MPR_OK) return NULL;
    mpr_tensor_t *t = mpr_tensor_empty(dtype, ndim, shape);
    if (!t) return NULL;
    mpr_err_t e = normal ? mpr_normal_(t, 0.0, bound, gen) : mpr_uniform_(t, -bound, bound, gen);
    if (e == MPR_OK) e = mpr_set_requires_grad(t, true);
    if (e == MPR_OK) e = push_param(m, name, t);
    mpr_tensor_release(t); /* the module holds its own reference on success */
    return e == MPR_OK ? t : NULL;
}

mpr_err_t mpri_module_add_child(mpr_module_t *m, const char *name, mpr_module_t *child) {
    if (!child) return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: child module is NULL", mpr_module_kind(m));
    if (child->parent || child == m) {
        /* not ours to destroy: it belongs to another container */
        return mpr_error_set(MPR_ERR_STATE, "%s: module %s already has a parent",
                             mpr_module_kind(m), mpr_module_kind(child));
    }
    if (check_name(m, name) != MPR_OK) {
        mpr_err_t e = mpr_last_error_code();
        mpr_module_destroy(child);
        return e;
    }
    if (m->n_children == m->cap_children) {
        int cap = m->cap_children ? 2 * m->cap_children : 4;
        mpri_named_module_t *c = realloc(m->children, (size_t)cap * sizeof *c);
        if (!c) {
            mpr_module_destroy(child);
            return mpr_error_set(MPR_ERR_NOMEM, "%s: out of memory", m->vt->kind);
        }
        m->children = c;
        m->cap_children = cap;
    }
    char *nm = dupstr(name);
    if (!nm) {
        mpr_module_destroy(child);
        return mpr_error_set(MPR_ERR_NOMEM, "%s: out of memory", m->vt->kind);
    }
    m->children[m->n_children].name = nm;
    m->children[m->n_children].m = child;
    m->n_children++;
    child->parent = m;
    invalidate(m);
    return MPR_OK;
}

static void free_flat(mpr_module_t *m) {
    for (int i = 0; i < m->n_flat; i++) free(m->flat[i].name);
    free(m->flat);
    m->flat = NULL;
    m->n_flat = 0;
    m->flat_valid = false;
}

void mpr_module_destroy(mpr_module_t *m) {
    if (!m) return;
    if (m->vt->destroy) m->vt->destroy(m);
    if (m->ctx_free) m->ctx_free(m->ctx);
    free(m->custom_kind);
    for (int i = 0; i < m->n_params; i++) {
        free(m->params[i].name);
        mpr_tensor_release(m->params[i].t);
    }
    free(m->params);
    for (int i = 0; i < m->n_children; i++) {
        free(m->children[i].name);
        m->children[i].m->parent = NULL;
        mpr_module_destroy(m->children[i].m);
    }
    free(m->children);
    free_flat(m);
    free(m);
}

const char *mpr_module_kind(const mpr_module_t *m) {
    MPRI_ARG_NONNULL_OR(m, "?");
    if (!m) return "?";
    return m->custom_kind ? m->custom_kind : m->vt->kind;
}

/* ------------------------------------------------------- custom modules */

static mpr_tensor_t *custom_forward(mpr_module_t *m, mpr_tensor_t *x) {
    return m->custom_forward(m, x, m->ctx);
}

static const mpri_module_vtable_t custom_vt = {"Module", custom_forward, NULL};

mpr_module_t *mpr_module_create(const char *kind, mpr_module_forward_fn forward, void *ctx,
                                void (*ctx_free)(void *ctx)) {
    MPRI_ARG_NONNULL_OR(kind, NULL);
    MPRI_ARG_NONNULL_OR(forward, NULL);
    if (!forward) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "module_create: forward function is NULL");
        return NULL;
    }
    mpr_module_t *m = mpri_module_new(&custom_vt);
    if (!m) return NULL;
    m->custom_kind = dupstr(kind && *kind ? kind : "Module");
    if (!m->custom_kind) {
        mpr_module_destroy(m);
        mpr_error_set(MPR_ERR_NOMEM, "module_create: out of memory");
        return NULL;
    }
    m->custom_forward = forward;
    m->ctx = ctx;
    m->ctx_free = ctx_free;
    return m;
}

void *mpr_module_ctx(const mpr_module_t *m) {
    MPRI_ARG_NONNULL_OR(m, NULL);
    return m ? m->ctx : NULL;
}

/* Built-in layers have a fixed structure their forward relies on. */
static bool is_container(const mpr_module_t *m) {
    return m->vt == &custom_vt || strcmp(m->vt->kind, "Sequential") == 0;
}

mpr_err_t mpr_module_add_child(mpr_module_t *m, const char *name, mpr_module_t *child) {
    MPRI_ARG_NONNULL(child);
    if (!m || !name) { /* ownership is taken on failure too */
        if (!child->parent) mpr_module_destroy(child);
        return mpri_null_arg(__func__, !m ? "m" : "name");
    }
    if (!is_container(m)) {
        if (child && !child->parent) mpr_module_destroy(child);
        return mpr_error_set(MPR_ERR_INVALID_ARG, "module_add_child: %s cannot take children",
                             m ? mpr_module_kind(m) : "NULL module");
    }
    return mpri_module_add_child(m, name, child);
}

mpr_module_t *mpr_module_child(mpr_module_t *m, const char *name) {
    MPRI_ARG_NONNULL_OR(m, NULL);
    MPRI_ARG_NONNULL_OR(name, NULL);
    for (int i = 0; m && name && i < m->n_children; i++)
        if (strcmp(m->children[i].name, name) == 0) return m->children[i].m;
    mpr_error_set(MPR_ERR_NOT_FOUND, "%s has no child named '%s'", mpr_module_kind(m),
                  name ? name : "(null)");
    return NULL;
}

mpr_err_t mpr_module_add_parameter(mpr_module_t *m, const char *name, mpr_tensor_t *t) {
    MPRI_ARG_NONNULL(m);
    MPRI_ARG_NONNULL(name);
    MPRI_ARG_NONNULL(t);
    if (!m || !t)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "module_add_parameter: NULL argument");
    if (m->vt != &custom_vt)
        return mpr_error_set(MPR_ERR_INVALID_ARG,
                             "module_add_parameter: %s has a fixed set of parameters",
                             mpr_module_kind(m));
    mpr_err_t e = check_name(m, name);
    if (e == MPR_OK) e = mpr_set_requires_grad(t, true);
    if (e == MPR_OK) e = push_param(m, name, t);
    return e;
}

mpr_tensor_t *mpr_module_forward(mpr_module_t *m, mpr_tensor_t *x) {
    MPRI_ARG_NONNULL_OR(m, NULL);
    MPRI_OP_INPUT(x);
    if (!m) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "module forward: module is NULL");
        return NULL;
    }
    if (!x) return NULL;
    return m->vt->forward(m, x);
}

/* Counts the flat list of m (own + descendants). */
static int count_params(const mpr_module_t *m) {
    int n = m->n_params;
    for (int i = 0; i < m->n_children; i++) n += count_params(m->children[i].m);
    return n;
}

/* Appends m's parameters with `prefix` to out[*k]. */
static mpr_err_t fill_flat(const mpr_module_t *m, const char *prefix, mpri_named_tensor_t *out,
                           int *k) {
    for (int i = 0; i < m->n_params; i++) {
        size_t len = strlen(prefix) + strlen(m->params[i].name) + 1;
        char *nm = malloc(len);
        if (!nm) return MPR_ERR_NOMEM;
        snprintf(nm, len, "%s%s", prefix, m->params[i].name);
        out[*k].name = nm;
        out[*k].t = m->params[i].t;
        (*k)++;
    }
    for (int i = 0; i < m->n_children; i++) {
        size_t len = strlen(prefix) + strlen(m->children[i].name) + 2;
        char *pre = malloc(len);
        if (!pre) return MPR_ERR_NOMEM;
        snprintf(pre, len, "%s%s.", prefix, m->children[i].name);
        mpr_err_t e = fill_flat(m->children[i].m, pre, out, k);
        free(pre);
        if (e != MPR_OK) return e;
    }
    return MPR_OK;
}

static pthread_mutex_t flat_lock = PTHREAD_MUTEX_INITIALIZER; /* builds of flat lists (rare) */

/* Builds m's flat list (under flat_lock) unless it is valid. */
static mpr_err_t build_flat_locked(mpr_module_t *m) {
    if (atomic_load_explicit(&m->flat_valid, memory_order_relaxed)) return MPR_OK; /* built meanwhile */
    free_flat(m);
    int n = count_params(m), k = 0;
    m->flat = calloc(n ? (size_t)n : 1, sizeof *m->flat);
    if (!m->flat) return mpr_error_set(MPR_ERR_NOMEM, "module parameters: out of memory");
    mpr_err_t e = fill_flat(m, "", m->flat, &k);
    m->n_flat = k;
    if (e != MPR_OK) {
        free_flat(m);
        return mpr_error_set(MPR_ERR_NOMEM, "module parameters: out of memory");
    }
    MPRI_ASSERT(k == n, "a module's flat list holds every parameter of it and its descendants");
    atomic_store_explicit(&m->flat_valid, true, memory_order_release); /* publishes flat and n_flat */
    return MPR_OK;
}

static mpr_err_t ensure_flat(mpr_module_t *m) {
    if (atomic_load_explicit(&m->flat_valid, memory_order_acquire)) return MPR_OK;
    pthread_mutex_lock(&flat_lock);
    mpr_err_t e = build_flat_locked(m);
    pthread_mutex_unlock(&flat_lock);
    return e;
}

int mpr_module_num_parameters(mpr_module_t *m) {
    MPRI_ARG_NONNULL_OR(m, 0);
    if (!m || ensure_flat(m) != MPR_OK) return 0;
    return m->n_flat;
}

mpr_tensor_t *mpr_module_parameter(mpr_module_t *m, int i, const char **name) {
    if (name) *name = NULL;
    MPRI_ARG_NONNULL_OR(m, NULL);
    if (!m || ensure_flat(m) != MPR_OK) return NULL;
    if (i < 0 || i >= m->n_flat) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "module parameter: index %d out of range [0, %d)", i,
                      m->n_flat);
        return NULL;
    }
    if (name) *name = m->flat[i].name;
    return m->flat[i].t;
}

mpr_tensor_t *mpr_module_get_parameter(mpr_module_t *m, const char *name) {
    MPRI_ARG_NONNULL_OR(m, NULL);
    MPRI_ARG_NONNULL_OR(name, NULL);
    if (!m || !name) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "module get_parameter: NULL argument");
        return NULL;
    }
    if (ensure_flat(m) != MPR_OK) return NULL;
    for (int i = 0; i < m->n_flat; i++)
        if (strcmp(m->flat[i].name, name) == 0) return m->flat[i].t;
    mpr_error_set(MPR_ERR_NOT_FOUND, "%s has no parameter named '%s'", m->vt->kind, name);
    return NULL;
}

int64_t mpr_module_parameter_numel(mpr_module_t *m) {
    MPRI_ARG_NONNULL_OR(m, 0);
    int64_t n = 0;
    int k = mpr_module_num_parameters(m);
    for (int i = 0; i < k; i++) n += mpr_tensor_numel(m->flat[i].t);
    return n;
}

void mpr_module_train(mpr_module_t *m, bool training) {
    MPRI_ARG_NONNULL_OR(m, );
    if (!m) return;
    m->training = training;
    for (int i = 0; i < m->n_children; i++) mpr_module_train(m->children[i].m, training);
}

bool mpr_module_is_training(const mpr_module_t *m) {
    MPRI_ARG_NONNULL_OR(m, false);
    return m && m->training;
}

void mpr_module_zero_grad(mpr_module_t *m) {
    MPRI_ARG_NONNULL_OR(m, );
    if (!m) return;
    for (int i = 0; i < m->n_params; i++) mpr_zero_grad(m->params[i].t);
    for (int i = 0; i < m->n_children; i++) mpr_module_zero_grad(m->children[i].m);
}
