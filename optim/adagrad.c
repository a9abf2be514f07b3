/* adagrad.c — Adagrad with PyTorch 1.13's update rule (torch.optim.Adagrad,
 * _single_tensor_adagrad, dense gradients): with d = (maximize ? -g : g) +
 * weight_decay * p and t the parameter's step count,
 *   clr = lr / (1 + (t - 1) lr_decay)     (double)
 *   sum = sum + 1 * d * d                  (addcmul_, value 1)
 *   p += (-clr) d / (sqrt(sum) + eps)      (addcdiv_)
 *
 * Invariants: slot "sum" starts at initial_accumulator_value (PyTorch fills
 * it at construction; here at the parameter's first step, which gives the
 * same numbers since it is not read before); each operation rounds where
 * PyTorch's tensor op rounds. */
#include <math.h>

#include "mpri_optim.h"

static void adagrad_defaults(mpr_optim_options_t *o) {
    *o = (mpr_optim_options_t){.lr = 1e-2, .eps = 1e-10};
}

static mpr_err_t adagrad_check(const mpr_optim_options_t *o) {
    mpr_err_t e;
    if ((e = mpri_optim_check_nonneg("Adagrad", "learning rate", o->lr)) ||
        (e = mpri_optim_check_nonneg("Adagrad", "lr_decay value", o->lr_decay)) ||
        (e = mpri_optim_check_nonneg("Adagrad", "weight_decay value", o->weight_decay)) ||
        (e = mpri_optim_check_nonneg("Adagrad", "initial_accumulator_value value",
                                     o->initial_accumulator_value)) ||
        (e = mpri_optim_check_nonneg("Adagrad", "epsilon value", o->eps)))
        return e;
    return MPR_OK;
}

static bool adagrad_slot_used(const mpr_optim_options_t *o, int k, double *init) {
    (void)k;
    *init = o->initial_accumulator_value;
    return true;
}

/* One specialized loop (HAS_WD literal 0/1) over ADAGRAD_UPDATE's locals. */
#define ADAGRAD_LOOP(HAS_WD, UNUSED)                                                             \
    for (int64_t j = 0; j < n; j++) {                                                            \
        __typeof__(*p) d = MPRI_OPTIM_D(HAS_WD, sign, wd, g[j], p[j]);                           \
        sum[j] = sum[j] + one * d * d;                                                           \
        __typeof__(*p) std = MPRI_OPTIM_SQRT(sum[j]) + eps;                                      \
        p[j] = p[j] + neg_clr * d / std;                                                         \
    }

#define ADAGRAD_UPDATE(T, NAME)                                                                  \
    static void NAME(const mpr_optim_options_t *o, int64_t n, T *p_, const T *g_, T *const *slots, \
                     int64_t step) {                                                             \
        double clr = o->lr / (1 + (double)(step - 1) * o->lr_decay);                             \
        T neg_clr = (T)-clr, eps = (T)o->eps, one = 1;                                           \
        T sign = o->maximize ? -1 : 1, wd = (T)o->weight_decay;                                  \
        T *restrict p = p_, *restrict sum = slots[0];                                            \
        const T *restrict g = g_;                                                                \
        MPRI_OPTIM_SPECIALIZE2(o->weight_decay != 0, 0, ADAGRAD_LOOP);                           \
    }
ADAGRAD_UPDATE(float, adagrad_f32)
ADAGRAD_UPDATE(double, adagrad_f64)

const mpri_optimizer_vtable_t mpri_adagrad_vt = {
    .name = "Adagrad",
    .kind = "adagrad",
    .defaults = adagrad_defaults,
    .check = adagrad_check,
    .n_slots = 1,
    .slot_names = {"sum"},
    .slot_used = adagrad_slot_used,
    .update_f32 = adagrad_f32,
    .update_f64 = adagrad_f64,
    .update_cuda = MPRI_OPTIM_CUDA_UPDATE(mpri_optim_cuda_adagrad),
};
