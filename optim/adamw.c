/* adamw.c — AdamW with PyTorch 1.13's update rule (torch.optim.AdamW,
 * _single_tensor_adamw): decoupled weight decay p *= 1 - lr * weight_decay
 * first (the scale computed in double, cast to the dtype), then Adam's update
 * (adam.c) from -g or g with no L2 term. Defaults differ from Adam only in
 * weight_decay = 1e-2.
 *
 * Invariants: the same slots and bias corrections as Adam (the vtable
 * shares adam.c's update); the decay multiplies every element once per step,
 * before the moments are updated, as PyTorch does. */
#include "mpri_optim.h"

static void adamw_defaults(mpr_optim_options_t *o) {
    *o = (mpr_optim_options_t){.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                               .weight_decay = 1e-2};
}

static mpr_err_t adamw_check(const mpr_optim_options_t *o) { return mpri_adam_check_named("AdamW", o); }

/* Adam's options with the decay taken out (AdamW applies it to p itself). */
static mpr_optim_options_t without_decay(const mpr_optim_options_t *o) {
    mpr_optim_options_t a = *o;
    a.weight_decay = 0;
    return a;
}

static void adamw_f32(const mpr_optim_options_t *o, int64_t n, float *p, const float *g,
                      float *const *slots, int64_t step) {
    float keep = (float)(1 - o->lr * o->weight_decay);
    for (int64_t j = 0; j < n; j++) p[j] = p[j] * keep;
    mpr_optim_options_t a = without_decay(o);
    mpri_adam_vt.update_f32(&a, n, p, g, slots, step);
}

static void adamw_f64(const mpr_optim_options_t *o, int64_t n, double *p, const double *g,
                      double *const *slots, int64_t step) {
    double keep = 1 - o->lr * o->weight_decay;
    for (int64_t j = 0; j < n; j++) p[j] = p[j] * keep;
    mpr_optim_options_t a = without_decay(o);
    mpri_adam_vt.update_f64(&a, n, p, g, slots, step);
}

const mpri_optimizer_vtable_t mpri_adamw_vt = {
    .name = "AdamW",
    .kind = "adamw",
    .defaults = adamw_defaults,
    .check = adamw_check,
    .n_slots = 3,
    .slot_names = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
    .slot_used = mpri_adam_slot_used,
    .update_f32 = adamw_f32,
    .update_f64 = adamw_f64,
    .update_cuda = MPRI_OPTIM_CUDA_UPDATE(mpri_optim_cuda_adamw),
};
