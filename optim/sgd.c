/* sgd.c — stochastic gradient descent with PyTorch 1.13's update rule
 * (torch.optim.SGD, _single_tensor_sgd): with d = (maximize ? -g : g) +
 * weight_decay * p,
 *   momentum == 0:  p += -lr * d
 *   otherwise:      buf = d on the parameter's first step, else
 *                   buf = momentum * buf + (1 - dampening) * d;
 *                   d = nesterov ? d + momentum * buf : buf;  p += -lr * d.
 *
 * Invariants: one elementwise pass per parameter in the parameter's dtype,
 * each operation rounded where PyTorch's tensor op rounds (scalars cast to
 * the dtype first, as PyTorch casts them); the momentum buffer (slot 0,
 * "momentum_buffer") exists only with momentum != 0 and is overwritten with
 * d on step 1, which is when PyTorch creates it. */
#include <math.h>

#include "mpri_optim.h"

static void sgd_defaults(mpr_optim_options_t *o) {
    *o = (mpr_optim_options_t){0};
    o->lr = NAN; /* torch.optim.SGD's lr is required */
}

static mpr_err_t sgd_check(const mpr_optim_options_t *o) {
    if (isnan(o->lr))
        return mpr_error_set(MPR_ERR_INVALID_ARG, "SGD: lr is required (PyTorch has no default)");
    mpr_err_t e;
    if ((e = mpri_optim_check_nonneg("SGD", "learning rate", o->lr)) ||
        (e = mpri_optim_check_nonneg("SGD", "momentum value", o->momentum)) ||
        (e = mpri_optim_check_nonneg("SGD", "weight_decay value", o->weight_decay)))
        return e;
    if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
        return mpr_error_set(MPR_ERR_INVALID_ARG,
                             "SGD: Nesterov momentum requires a momentum and zero dampening (nesterov)");
    return MPR_OK;
}

static bool sgd_slot_used(const mpr_optim_options_t *o, int k, double *init) {
    (void)k;
    *init = 0;
    return o->momentum != 0;
}

/* One specialized loop (HAS_WD, MODE literal: 0 no momentum, 1 first step
 * (buf = d), 2 momentum, 3 nesterov) over SGD_UPDATE's locals. */
#define SGD_LOOP(HAS_WD, MODE)                                                                   \
    for (int64_t j = 0; j < n; j++) {                                                            \
        __typeof__(*p) d = MPRI_OPTIM_D(HAS_WD, sign, wd, g[j], p[j]);                           \
        if (MODE >= 1) {                                                                         \
            buf[j] = MODE == 1 ? d : buf[j] * mom + damp * d;                                    \
            d = nesterov ? d + mom * buf[j] : buf[j];                                            \
        }                                                                                        \
        p[j] = p[j] + neg_lr * d;                                                                \
    }
#define SGD_MODES(HAS_WD)                                                                        \
    do {                                                                                         \
        if (!buf) { SGD_LOOP(HAS_WD, 0); }                                                       \
        else if (step == 1) { SGD_LOOP(HAS_WD, 1); }                                             \
        else { SGD_LOOP(HAS_WD, 2); }                                                            \
    } while (0)

#define SGD_UPDATE(T, NAME)                                                                      \
    static void NAME(const mpr_optim_options_t *o, int64_t n, T *p_, const T *g_, T *const *slots, \
                     int64_t step) {                                                             \
        T neg_lr = (T)-o->lr, mom = (T)o->momentum, damp = (T)(1 - o->dampening);               \
        T sign = o->maximize ? -1 : 1, wd = (T)o->weight_decay;                                  \
        bool nesterov = o->nesterov;                                                             \
        T *restrict p = p_, *restrict buf = slots[0];                                            \
        const T *restrict g = g_;                                                                \
        if (o->weight_decay != 0)                                                                \
            SGD_MODES(1);                                                                        \
        else                                                                                     \
            SGD_MODES(0);                                                                        \
    }
SGD_UPDATE(float, sgd_f32)
SGD_UPDATE(double, sgd_f64)

const mpri_optimizer_vtable_t mpri_sgd_vt = {
    .name = "SGD",
    .kind = "sgd",
    .defaults = sgd_defaults,
    .check = sgd_check,
    .n_slots = 1,
    .slot_names = {"momentum_buffer"},
    .slot_used = sgd_slot_used,
    .update_f32 = sgd_f32,
    .update_f64 = sgd_f64,
    .update_cuda = MPRI_OPTIM_CUDA_UPDATE(mpri_optim_cuda_sgd),
};
