/* sgd.c — stochastic gradient descent with PyTorch's update rule
 * (torch.optim.SGD): with d = g + weight_decay * p,
 *   momentum == 0:  p -= lr * d
 *   otherwise:      buf = d on the first step, else momentum * buf + (1 - dampening) * d;
 *                   d = nesterov ? d + momentum * buf : buf;  p -= lr * d.
 *
 * Invariants: one fused pass over each parameter (and its momentum buffer)
 * per step, directly on the contiguous storage, followed by a version bump of
 * the parameter (mpri_bump_version, what every in-place op does); momentum
 * buffers are created on a parameter's first step with a gradient and are
 * owned by the optimizer. */
#include <stdlib.h>

#include "mpri_autograd.h"
#include "mpri_optim.h"

typedef struct {
    mpr_sgd_options_t o;
    mpr_tensor_t **buf; /* [n_params], NULL until first used */
} sgd_state_t;

#define SGD_UPDATE(T)                                                                   \
    do {                                                                                \
        T *pd = mpr_tensor_data(p);                                                     \
        const T *gd = mpr_tensor_data(g);                                               \
        const T lr = (T)opt->lr, wd = (T)s->o.weight_decay, mom = (T)s->o.momentum;     \
        const T damp = (T)(1.0 - s->o.dampening);                                       \
        if (s->o.momentum == 0.0) {                                                     \
            if (wd == 0)                                                                \
                for (int64_t j = 0; j < n; j++) pd[j] -= lr * gd[j];                    \
            else                                                                        \
                for (int64_t j = 0; j < n; j++) pd[j] -= lr * (gd[j] + wd * pd[j]);     \
        } else {                                                                        \
            T *bd = mpr_tensor_data(buf);                                               \
            for (int64_t j = 0; j < n; j++) {                                           \
                T d = gd[j] + wd * pd[j];                                               \
                T b = first ? d : mom * bd[j] + damp * d;                               \
                bd[j] = b;                                                              \
                pd[j] -= lr * (s->o.nesterov ? d + mom * b : b);                        \
            }                                                                           \
        }                                                                               \
    } while (0)

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
        if (p->dtype == MPR_F32)
            SGD_UPDATE(float);
        else
            SGD_UPDATE(double);
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
    if (!opts) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "SGD: options are NULL");
        return NULL;
    }
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
