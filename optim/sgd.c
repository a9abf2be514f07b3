/* sgd.c — stochastic gradient descent with PyTorch's update rule
 * (torch.optim.SGD): with d = g + weight_decay * p,
 *   momentum == 0:  p -= lr * d
 *   otherwise:      buf = d on the first step, else momentum * buf + (1 - dampening) * d;
 *                   d = nesterov ? d + momentum * buf : buf;  p -= lr * d.
 *
 * Invariants: the update is a few BLAS axpy/scal passes directly on the
 * contiguous storage (vectorized; the momentum buffer is updated from the
 * old parameter before the parameter moves), followed by a version bump of
 * the parameter (mpri_bump_version, what every in-place op does); momentum
 * buffers are created on a parameter's first step with a gradient and are
 * owned by the optimizer. Parameters are updated one after the other: if a
 * momentum buffer cannot be allocated, the step fails with the parameters
 * before it already updated. */
#include <cblas.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_args.h"
#include "mpri_autograd.h"
#include "mpri_optim.h"

typedef struct {
    mpr_sgd_options_t o;
    mpr_tensor_t **buf; /* [n_params], NULL until first used */
} sgd_state_t;

/* y += a x, x/y contiguous, n elements of dtype dt (BLAS axpy, chunked so
 * every call's length fits an int). */
static void axpy(mpr_dtype_t dt, int64_t n, double a, const void *x, void *y) {
    size_t esz = mpr_dtype_size(dt);
    for (int64_t off = 0; off < n; off += INT_MAX / 2) {
        int len = (int)(n - off < INT_MAX / 2 ? n - off : INT_MAX / 2);
        const char *xs = (const char *)x + (size_t)off * esz;
        char *ys = (char *)y + (size_t)off * esz;
        if (dt == MPR_F32)
            cblas_saxpy(len, (float)a, (const float *)xs, 1, (float *)ys, 1);
        else
            cblas_daxpy(len, a, (const double *)xs, 1, (double *)ys, 1);
    }
}

/* x *= a. */
static void scal(mpr_dtype_t dt, int64_t n, double a, void *x) {
    size_t esz = mpr_dtype_size(dt);
    for (int64_t off = 0; off < n; off += INT_MAX / 2) {
        int len = (int)(n - off < INT_MAX / 2 ? n - off : INT_MAX / 2);
        char *xs = (char *)x + (size_t)off * esz;
        if (dt == MPR_F32)
            cblas_sscal(len, (float)a, (float *)xs, 1);
        else
            cblas_dscal(len, a, (double *)xs, 1);
    }
}

static mpr_err_t sgd_step(mpr_optimizer_t *opt, mpr_tensor_t *const *grads) {
    sgd_state_t *s = opt->state;
    for (int i = 0; i < opt->n_params; i++) {
        mpr_tensor_t *p = opt->params[i], *g = grads[i], *buf = NULL;
        if (!g) continue;
        bool first = false;
        if (s->o.momentum != 0.0) {
            if (!s->buf[i]) {
                s->buf[i] = mpr_tensor_empty(p->dtype, p->ndim, p->shape);
                if (!s->buf[i]) return mpr_last_error_code();
                first = true;
            }
            buf = s->buf[i];
        }
        int64_t n = mpr_tensor_numel(p);
        mpr_dtype_t dt = p->dtype;
        void *pd = mpr_tensor_data(p);
        const void *gd = mpr_tensor_data(g);
        double lr = opt->lr, wd = s->o.weight_decay, mom = s->o.momentum;
        double damp = 1.0 - s->o.dampening;
        if (mom != 0.0) {
            /* buf = d (first) or mom * buf + damp * d, with d = g + wd * p (old p) */
            void *bd = mpr_tensor_data(buf);
            if (first) {
                memcpy(bd, gd, (size_t)n * mpr_dtype_size(dt));
                if (wd != 0.0) axpy(dt, n, wd, pd, bd);
            } else {
                scal(dt, n, mom, bd);
                axpy(dt, n, damp, gd, bd);
                if (wd != 0.0) axpy(dt, n, damp * wd, pd, bd);
            }
            if (s->o.nesterov) { /* p -= lr (g + wd p + mom buf) */
                if (wd != 0.0) scal(dt, n, 1.0 - lr * wd, pd);
                axpy(dt, n, -lr, gd, pd);
                axpy(dt, n, -lr * mom, bd, pd);
            } else {
                axpy(dt, n, -lr, bd, pd);
            }
        } else { /* p -= lr (g + wd p) */
            if (wd != 0.0) scal(dt, n, 1.0 - lr * wd, pd);
            axpy(dt, n, -lr, gd, pd);
        }
        mpri_bump_version(p);
    }
    return MPR_OK;
}

static void sgd_destroy(mpr_optimizer_t *opt) {
    sgd_state_t *s = opt->state;
    if (!s) return;
    for (int i = 0; i < opt->n_params; i++) mpr_tensor_release(s->buf[i]);
    free(s->buf);
    free(s);
}

static const mpri_optimizer_vtable_t sgd_vt = {"SGD", sgd_step, sgd_destroy};

mpr_optimizer_t *mpr_sgd_create(mpr_tensor_t *const *params, int n, const mpr_sgd_options_t *opts) {
    if (n > 0) MPRI_ARG_NONNULL_OR(params, NULL);
    MPRI_ARG_NONNULL_OR(opts, NULL);
    if (!(opts->lr > 0) || !(opts->momentum >= 0) || !(opts->dampening >= 0) ||
        !(opts->weight_decay >= 0)) {
        mpr_error_set(MPR_ERR_INVALID_ARG,
                      "SGD: need lr > 0 and momentum, dampening, weight_decay >= 0, got lr %g "
                      "momentum %g dampening %g weight_decay %g",
                      opts->lr, opts->momentum, opts->dampening, opts->weight_decay);
        return NULL;
    }
    if (opts->nesterov && (opts->momentum <= 0 || opts->dampening != 0)) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "SGD: nesterov momentum requires a momentum and zero "
                                           "dampening");
        return NULL;
    }
    mpr_optimizer_t *o = mpri_optimizer_new(&sgd_vt, params, n, opts->lr);
    if (!o) return NULL;
    sgd_state_t *s = calloc(1, sizeof *s);
    mpr_tensor_t **buf = calloc((size_t)n, sizeof *buf);
    if (!s || !buf) {
        free(s);
        free(buf);
        mpr_optimizer_destroy(o);
        mpr_error_set(MPR_ERR_NOMEM, "SGD: out of memory");
        return NULL;
    }
    s->o = *opts;
    s->buf = buf;
    o->state = s;
    return o;
}
