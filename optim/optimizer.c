/* optimizer.c — the algorithm-independent part of local optimizers:
 * parameter references, per-parameter state (step counts and the
 * algorithm's slot buffers, created on first use), gradient collection and
 * validation, the step loop, zero_grad, learning rate, destruction.
 * mpr_optimizer_step uses each parameter's .grad; mpr_optimizer_step_grads
 * takes the gradients explicitly (e.g. from a distributed autograd context);
 * a NULL gradient skips its parameter (its state is left alone).
 *
 * Invariants: parameters are contiguous float tensors on the CPU or, with
 * the CUDA backend, on a CUDA device (checked at creation); a parameter's
 * slot buffers live on its device and its gradients must too (a CUDA
 * parameter is updated by the algorithm's device kernel, mpri_optim_cuda.h,
 * on the default stream, after the ops that made its gradient); an
 * optimizer holds one reference to each parameter for its whole life; step
 * runs with grad mode off (restored afterwards) and hands the algorithm only
 * gradients that match their parameter's shape and dtype and are
 * contiguous; a failed validation changes no parameter. State
 * buffers are created for every parameter with a gradient before any
 * parameter is updated, so an allocation failure changes nothing either. */
#include <stdlib.h>
#include <string.h>

#include "kernels/mpri_kernels.h"
#include "mpirpc/cuda.h"
#include "mpirpc/tensor_ops.h"
#include "mpri_args.h"
#include "mpri_autograd.h"
#include "mpri_optim.h"
#include "mpri_trace.h"

mpr_optimizer_t *mpri_optimizer_new(const mpri_optimizer_vtable_t *vt, mpr_tensor_t *const *params,
                                    int n, const mpr_optim_options_t *opts) {
    if (vt->check(opts) != MPR_OK) return NULL;
    if (!params || n < 1) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "%s: needs at least one parameter (got %d)", vt->name, n);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        mpr_tensor_t *p = params[i];
        if (!p) {
            mpr_error_set(MPR_ERR_INVALID_ARG, "%s: parameter %d is NULL", vt->name, i);
            return NULL;
        }
        if (p->dtype != MPR_F32 && p->dtype != MPR_F64) {
            mpr_error_set(MPR_ERR_DTYPE, "%s: parameter %d has dtype %s (float32/float64 needed)",
                          vt->name, i, mpr_dtype_name(p->dtype));
            return NULL;
        }
        if (!mpr_tensor_is_contiguous(p)) {
            mpr_error_set(MPR_ERR_INVALID_ARG, "%s: parameter %d must be contiguous", vt->name, i);
            return NULL;
        }
        if (p->storage->device >= 0 && !vt->update_cuda) {
            mpr_error_set(MPR_ERR_UNSUPPORTED, "%s: parameter %d is on cuda:%d but the library was built without CUDA",
                          vt->name, i, p->storage->device);
            return NULL;
        }
    }
    mpr_optimizer_t *o = calloc(1, sizeof *o);
    mpr_tensor_t **ps = calloc((size_t)n, sizeof *ps);
    int64_t *steps = calloc((size_t)n, sizeof *steps);
    mpr_tensor_t **bufs = calloc((size_t)n * (size_t)(vt->n_slots ? vt->n_slots : 1), sizeof *bufs);
    if (!o || !ps || !steps || !bufs) {
        free(o);
        free(ps);
        free(steps);
        free(bufs);
        mpr_error_set(MPR_ERR_NOMEM, "%s: out of memory", vt->name);
        return NULL;
    }
    for (int i = 0; i < n; i++) ps[i] = mpr_tensor_retain(params[i]);
    o->vt = vt;
    o->n_params = n;
    o->params = ps;
    o->o = *opts;
    o->steps = steps;
    o->bufs = bufs;
    return o;
}

/* Create the slot buffers parameter i lacks (those its options use). */
static mpr_err_t ensure_slots(mpr_optimizer_t *opt, int i) {
    const mpri_optimizer_vtable_t *vt = opt->vt;
    mpr_tensor_t *p = opt->params[i];
    for (int k = 0; k < vt->n_slots; k++) {
        double init = 0;
        mpr_tensor_t **b = &opt->bufs[i * vt->n_slots + k];
        if (*b || !vt->slot_used(&opt->o, k, &init)) continue;
        /* mpr_tensor_empty_on: the optimizer owns it even inside an open scope */
        int device = p->storage->device;
        mpr_tensor_t *t = mpr_tensor_empty_on(device, p->dtype, p->ndim, p->shape);
        if (!t) return mpr_last_error_code();
        int64_t n = mpr_tensor_numel(t);
        if (device >= 0) {
            const mpri_backend_t *be = mpri_backend_for(vt->name, device);
            mpr_err_t e = be ? MPRI_BK(be, fill, device, t->dtype, t->ndim, t->shape, mpr_tensor_data(t), t->strides,
                                       init)
                             : mpr_last_error_code();
            if (e != MPR_OK) {
                mpr_tensor_release(t);
                return e;
            }
        } else if (p->dtype == MPR_F32) {
            for (int64_t j = 0; j < n; j++) ((float *)mpr_tensor_data(t))[j] = (float)init;
        } else {
            for (int64_t j = 0; j < n; j++) ((double *)mpr_tensor_data(t))[j] = init;
        }
        *b = t;
    }
    return MPR_OK;
}

/* One parameter's update through the algorithm's kernel of its dtype and
 * device (a CUDA kernel can fail: its step is then not counted). */
static mpr_err_t update_param(mpr_optimizer_t *opt, int i, mpr_tensor_t *g) {
    const mpri_optimizer_vtable_t *vt = opt->vt;
    mpr_tensor_t *p = opt->params[i];
    void *slots[MPRI_OPTIM_MAX_SLOTS] = {0};
    for (int k = 0; k < vt->n_slots; k++) {
        mpr_tensor_t *b = opt->bufs[i * vt->n_slots + k];
        slots[k] = b ? mpr_tensor_data(b) : NULL;
    }
    int64_t n = mpr_tensor_numel(p), step = opt->steps[i] + 1;
    if (p->storage->device >= 0) {
        mpr_err_t e = vt->update_cuda(&opt->o, p->storage->device, p->dtype, n, mpr_tensor_data(p),
                                      mpr_tensor_data(g), slots, step);
        if (e != MPR_OK) return e;
    } else if (p->dtype == MPR_F32)
        vt->update_f32(&opt->o, n, mpr_tensor_data(p), mpr_tensor_data(g), (float *const *)slots, step);
    else
        vt->update_f64(&opt->o, n, mpr_tensor_data(p), mpr_tensor_data(g), (double *const *)slots,
                       step);
    opt->steps[i] = step;
    mpri_bump_version(p);
    return MPR_OK;
}

static mpr_err_t run_step(mpr_optimizer_t *opt, mpr_tensor_t *const *gs) {
    for (int i = 0; i < opt->n_params; i++) {
        if (!gs[i]) continue;
        mpr_err_t e = ensure_slots(opt, i);
        if (e != MPR_OK) return e;
    }
    for (int i = 0; i < opt->n_params; i++) {
        if (!gs[i]) continue;
        mpr_err_t e = update_param(opt, i, gs[i]);
        if (e != MPR_OK) return e;
    }
    return MPR_OK;
}

/* "cpu" or "cuda:N". */
static const char *device_name(int device, char *buf, size_t cap) {
    if (device < 0) return "cpu";
    snprintf(buf, cap, "cuda:%d", device);
    return buf;
}

static bool same_shape(const mpr_tensor_t *a, const mpr_tensor_t *b) {
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

mpr_err_t mpr_optimizer_step_grads(mpr_optimizer_t *opt, mpr_tensor_t *const *grads, int n) {
    MPRI_ARG_NONNULL(opt);
    if (n > 0) MPRI_ARG_NONNULL(grads);
    if (!opt || !grads) return mpr_error_set(MPR_ERR_INVALID_ARG, "optimizer step: NULL argument");
    if (n != opt->n_params)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%s step: %d gradients for %d parameters",
                             opt->vt->name, n, opt->n_params);
    mpr_tensor_t *small[64];
    mpr_tensor_t **gs = n <= 64 ? small : calloc((size_t)n, sizeof *gs);
    if (!gs) return mpr_error_set(MPR_ERR_NOMEM, "%s step: out of memory", opt->vt->name);
    mpr_err_t e = MPR_OK;
    int k = 0;
    for (; k < n; k++) {
        mpr_tensor_t *g = grads[k], *p = opt->params[k];
        gs[k] = NULL;
        if (!g) continue;
        if (g->dtype != p->dtype || !same_shape(g, p)) {
            char bg[96], bp[96];
            e = mpr_error_set(MPR_ERR_SHAPE,
                              "%s step: gradient %d is %s %s but its parameter is %s %s",
                              opt->vt->name, k, mpr_dtype_name(g->dtype),
                              mpr_shape_str(g->ndim, g->shape, bg, sizeof bg),
                              mpr_dtype_name(p->dtype),
                              mpr_shape_str(p->ndim, p->shape, bp, sizeof bp));
            break;
        }
        if (g->storage->device != p->storage->device) {
            char dg[16], dp[16];
            e = mpr_error_set(MPR_ERR_INVALID_ARG, "%s step: gradient %d is on %s but its parameter is on %s",
                              opt->vt->name, k, device_name(g->storage->device, dg, sizeof dg),
                              device_name(p->storage->device, dp, sizeof dp));
            break;
        }
        if (!(gs[k] = mpr_tensor_contiguous(g))) {
            e = mpr_last_error_code();
            break;
        }
    }
    if (e == MPR_OK) {
        bool prev = mpr_set_grad_enabled(false);
        bool traced = mpri_observing(MPRI_OBSERVE_TRACE);
        if (traced) {
            char name[48];
            snprintf(name, sizeof name, "%s step", opt->vt->name);
            mpri_trace_range_begin(MPRI_TCAT_OPTIM, name);
        }
        e = run_step(opt, gs);
        if (traced) mpri_trace_range_end();
        mpr_set_grad_enabled(prev);
    }
    for (int i = 0; i < k && i < n; i++) mpr_tensor_release(gs[i]);
    if (gs != small) free(gs);
    return e;
}

mpr_err_t mpr_optimizer_step(mpr_optimizer_t *opt) {
    MPRI_ARG_NONNULL(opt);
    if (!opt) return mpr_error_set(MPR_ERR_INVALID_ARG, "optimizer step: optimizer is NULL");
    mpr_tensor_t *small[64] = {0};
    int n = opt->n_params;
    mpr_tensor_t **gs = n <= 64 ? small : calloc((size_t)n, sizeof *gs);
    if (!gs) return mpr_error_set(MPR_ERR_NOMEM, "%s step: out of memory", opt->vt->name);
    for (int i = 0; i < n; i++) gs[i] = mpr_tensor_grad(opt->params[i]); /* borrowed */
    mpr_err_t e = mpr_optimizer_step_grads(opt, gs, n);
    if (gs != small) free(gs);
    return e;
}

void mpr_optimizer_zero_grad(mpr_optimizer_t *opt) {
    MPRI_ARG_NONNULL_OR(opt, );
    if (!opt) return;
    for (int i = 0; i < opt->n_params; i++) mpr_zero_grad(opt->params[i]);
}

void mpr_optimizer_destroy(mpr_optimizer_t *opt) {
    if (!opt) return;
    for (int i = 0; i < opt->n_params * opt->vt->n_slots; i++) mpr_tensor_release(opt->bufs[i]);
    for (int i = 0; i < opt->n_params; i++) mpr_tensor_release(opt->params[i]);
    free(opt->bufs);
    free(opt->steps);
    free(opt->params);
    free(opt);
}

double mpr_optimizer_get_lr(const mpr_optimizer_t *opt) {
    MPRI_ARG_NONNULL_OR(opt, 0);
    return opt ? opt->o.lr : 0.0;
}
void mpr_optimizer_set_lr(mpr_optimizer_t *opt, double lr) {
    MPRI_ARG_NONNULL_OR(opt, );
    if (opt) opt->o.lr = lr;
}
int mpr_optimizer_num_params(const mpr_optimizer_t *opt) {
    MPRI_ARG_NONNULL_OR(opt, 0);
    return opt ? opt->n_params : 0;
}
mpr_tensor_t *mpr_optimizer_param(const mpr_optimizer_t *opt, int i) {
    MPRI_ARG_NONNULL_OR(opt, NULL);
    return opt && i >= 0 && i < opt->n_params ? opt->params[i] : NULL;
}
const char *mpr_optimizer_name(const mpr_optimizer_t *opt) {
    MPRI_ARG_NONNULL_OR(opt, NULL);
    return opt ? opt->vt->name : "?";
}
const char *mpr_optimizer_kind(const mpr_optimizer_t *opt) {
    MPRI_ARG_NONNULL_OR(opt, NULL);
    return opt ? opt->vt->kind : "?";
}
mpr_err_t mpr_optimizer_get_options(const mpr_optimizer_t *opt, mpr_optim_options_t *out) {
    if (out) memset(out, 0, sizeof *out);
    MPRI_ARG_NONNULL(opt);
    MPRI_ARG_NONNULL(out);
    if (!opt || !out) return mpr_error_set(MPR_ERR_INVALID_ARG, "optimizer_get_options: NULL argument");
    *out = opt->o;
    return MPR_OK;
}
