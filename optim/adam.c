/* adam.c — Adam with PyTorch 1.13's update rule (torch.optim.Adam,
 * _single_tensor_adam, capturable off): with d = (maximize ? -g : g) +
 * weight_decay * p (coupled L2) and t the parameter's step count,
 *   m = beta1 m + (1 - beta1) d          (mul_ then add_)
 *   v = beta2 v + (1 - beta2) d d        (mul_ then addcmul_)
 *   amsgrad: vmax = max(vmax, v), then vmax is used for v below
 *   denom = sqrt(v) / sqrt(1 - beta2^t) + eps   (eps after the correction)
 *   p += (-lr / (1 - beta1^t)) m / denom        (addcdiv_)
 * Bias corrections are computed in double (Python floats) and cast to the
 * dtype where the tensor op takes them. AdamW (adamw.c) reuses this update
 * after its decoupled decay.
 *
 * Invariants: slots "exp_avg" and "exp_avg_sq" always exist once a
 * parameter has stepped, "max_exp_avg_sq" only with amsgrad; all start at
 * zero; each operation rounds where PyTorch's tensor op rounds. */
#include <math.h>

#include "mpri_optim.h"

static void adam_defaults(mpr_optim_options_t *o) {
    *o = (mpr_optim_options_t){.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
}

/* Adam's and AdamW's checks (PyTorch's order and wording). */
mpr_err_t mpri_adam_check_named(const char *name, const mpr_optim_options_t *o) {
    mpr_err_t e;
    if ((e = mpri_optim_check_nonneg(name, "learning rate", o->lr)) ||
        (e = mpri_optim_check_nonneg(name, "epsilon value", o->eps)) ||
        (e = mpri_optim_check_beta(name, 0, o->beta1)) || (e = mpri_optim_check_beta(name, 1, o->beta2)) ||
        (e = mpri_optim_check_nonneg(name, "weight_decay value", o->weight_decay)))
        return e;
    return MPR_OK;
}

static mpr_err_t adam_check(const mpr_optim_options_t *o) { return mpri_adam_check_named("Adam", o); }

bool mpri_adam_slot_used(const mpr_optim_options_t *o, int k, double *init) {
    *init = 0;
    return k < 2 || o->amsgrad;
}

/* One specialized loop (HAS_WD, AMS literal 0/1) over ADAM_UPDATE's locals. */
#define ADAM_LOOP(HAS_WD, AMS)                                                                   \
    for (int64_t j = 0; j < n; j++) {                                                            \
        __typeof__(*p) d = MPRI_OPTIM_D(HAS_WD, sign, wd, g[j], p[j]);                           \
        m[j] = m[j] * b1;                                                                        \
        m[j] = m[j] + c1 * d;                                                                    \
        v[j] = v[j] * b2;                                                                        \
        v[j] = v[j] + c2 * d * d;                                                                \
        __typeof__(*p) vv = v[j];                                                                \
        if (AMS) {                                                                               \
            __typeof__(*p) mx = vmax[j];                                                         \
            vv = mx > vv || mx != mx ? mx : vv; /* torch.maximum: NaN wins */                    \
            vmax[j] = vv;                                                                        \
        }                                                                                        \
        __typeof__(*p) denom = MPRI_OPTIM_SQRT(vv) / bc2_sqrt + eps;                             \
        p[j] = p[j] + neg_step * m[j] / denom;                                                   \
    }

#define ADAM_UPDATE(T, NAME)                                                                     \
    static void NAME(const mpr_optim_options_t *o, int64_t n, T *p_, const T *g_, T *const *slots, \
                     int64_t step) {                                                             \
        double bc1 = 1 - pow(o->beta1, (double)step), bc2 = 1 - pow(o->beta2, (double)step);     \
        T b1 = (T)o->beta1, c1 = (T)(1 - o->beta1), b2 = (T)o->beta2, c2 = (T)(1 - o->beta2);    \
        T bc2_sqrt = (T)sqrt(bc2), eps = (T)o->eps, neg_step = (T)(-(o->lr / bc1));              \
        T sign = o->maximize ? -1 : 1, wd = (T)o->weight_decay;                                  \
        T *restrict p = p_, *restrict m = slots[0], *restrict v = slots[1], *restrict vmax = slots[2]; \
        const T *restrict g = g_;                                                                \
        MPRI_OPTIM_SPECIALIZE2(o->weight_decay != 0, vmax != NULL, ADAM_LOOP);                   \
    }
ADAM_UPDATE(float, adam_f32)
ADAM_UPDATE(double, adam_f64)

const mpri_optimizer_vtable_t mpri_adam_vt = {
    .name = "Adam",
    .kind = "adam",
    .defaults = adam_defaults,
    .check = adam_check,
    .n_slots = 3,
    .slot_names = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
    .slot_used = mpri_adam_slot_used,
    .update_f32 = adam_f32,
    .update_f64 = adam_f64,
    .update_cuda = MPRI_OPTIM_CUDA_UPDATE(mpri_optim_cuda_adam),
};
