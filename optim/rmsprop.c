/* rmsprop.c — RMSprop with PyTorch 1.13's update rule (torch.optim.RMSprop,
 * _single_tensor_rmsprop): with d = (maximize ? -g : g) + weight_decay * p,
 *   sq = alpha sq + (1 - alpha) d d              (mul_ then addcmul_)
 *   centered: ga = alpha ga + (1 - alpha) d;  avg = sqrt(sq - ga ga)
 *   else:     avg = sqrt(sq)
 *   avg = avg + eps                              (eps outside the sqrt)
 *   momentum > 0: buf = momentum buf + d / avg;  p += -lr buf
 *   else:         p += (-lr) d / avg             (addcdiv_)
 *
 * Invariants: slot "square_avg" always exists once a parameter has stepped,
 * "momentum_buffer" only with momentum > 0, "grad_avg" only when centered;
 * all start at zero; each operation rounds where PyTorch's tensor op rounds. */
#include <math.h>

#include "mpri_optim.h"

static void rmsprop_defaults(mpr_optim_options_t *o) {
    *o = (mpr_optim_options_t){.lr = 1e-2, .alpha = 0.99, .eps = 1e-8};
}

static mpr_err_t rmsprop_check(const mpr_optim_options_t *o) {
    mpr_err_t e;
    if ((e = mpri_optim_check_nonneg("RMSprop", "learning rate", o->lr)) ||
        (e = mpri_optim_check_nonneg("RMSprop", "epsilon value", o->eps)) ||
        (e = mpri_optim_check_nonneg("RMSprop", "momentum value", o->momentum)) ||
        (e = mpri_optim_check_nonneg("RMSprop", "weight_decay value", o->weight_decay)) ||
        (e = mpri_optim_check_nonneg("RMSprop", "alpha value", o->alpha)))
        return e;
    return MPR_OK;
}

enum { SQUARE_AVG, MOMENTUM_BUFFER, GRAD_AVG };

static bool rmsprop_slot_used(const mpr_optim_options_t *o, int k, double *init) {
    *init = 0;
    return k == SQUARE_AVG || (k == MOMENTUM_BUFFER && o->momentum > 0) || (k == GRAD_AVG && o->centered);
}

/* One specialized loop (HAS_WD, CENTERED, MOMENTUM literal 0/1) over
 * RMSPROP_UPDATE's locals. */
#define RMSPROP_LOOP(HAS_WD, CENTERED, MOMENTUM)                                                 \
    for (int64_t j = 0; j < n; j++) {                                                            \
        __typeof__(*p) d = MPRI_OPTIM_D(HAS_WD, sign, wd, g[j], p[j]), avg;                      \
        sq[j] = sq[j] * a;                                                                       \
        sq[j] = sq[j] + c * d * d;                                                               \
        if (CENTERED) {                                                                          \
            ga[j] = ga[j] * a;                                                                   \
            ga[j] = ga[j] + c * d;                                                               \
            avg = MPRI_OPTIM_SQRT(sq[j] + minus_one * ga[j] * ga[j]);                            \
        } else {                                                                                 \
            avg = MPRI_OPTIM_SQRT(sq[j]);                                                        \
        }                                                                                        \
        avg = avg + eps;                                                                         \
        if (MOMENTUM) {                                                                          \
            buf[j] = buf[j] * mom;                                                               \
            buf[j] = buf[j] + one * d / avg;                                                     \
            p[j] = p[j] + neg_lr * buf[j];                                                       \
        } else {                                                                                 \
            p[j] = p[j] + neg_lr * d / avg;                                                      \
        }                                                                                        \
    }
#define RMSPROP_LOOP_MOM(HAS_WD, CENTERED) RMSPROP_LOOP(HAS_WD, CENTERED, 1)
#define RMSPROP_LOOP_PLAIN(HAS_WD, CENTERED) RMSPROP_LOOP(HAS_WD, CENTERED, 0)

#define RMSPROP_UPDATE(T, NAME)                                                                  \
    static void NAME(const mpr_optim_options_t *o, int64_t n, T *p_, const T *g_, T *const *slots, \
                     int64_t step) {                                                             \
        (void)step;                                                                              \
        T a = (T)o->alpha, c = (T)(1 - o->alpha), eps = (T)o->eps, neg_lr = (T)-o->lr;           \
        T mom = (T)o->momentum, one = 1, minus_one = -1;                                         \
        T sign = o->maximize ? -1 : 1, wd = (T)o->weight_decay;                                  \
        T *restrict p = p_, *restrict sq = slots[SQUARE_AVG], *restrict buf = slots[MOMENTUM_BUFFER]; \
        T *restrict ga = slots[GRAD_AVG];                                                        \
        const T *restrict g = g_;                                                                \
        if (buf)                                                                                 \
            MPRI_OPTIM_SPECIALIZE2(o->weight_decay != 0, ga != NULL, RMSPROP_LOOP_MOM);          \
        else                                                                                     \
            MPRI_OPTIM_SPECIALIZE2(o->weight_decay != 0, ga != NULL, RMSPROP_LOOP_PLAIN);        \
    }
RMSPROP_UPDATE(float, rmsprop_f32)
RMSPROP_UPDATE(double, rmsprop_f64)

const mpri_optimizer_vtable_t mpri_rmsprop_vt = {
    .name = "RMSprop",
    .kind = "rmsprop",
    .defaults = rmsprop_defaults,
    .check = rmsprop_check,
    .n_slots = 3,
    .slot_names = {"square_avg", "momentum_buffer", "grad_avg"},
    .slot_used = rmsprop_slot_used,
    .update_f32 = rmsprop_f32,
    .update_f64 = rmsprop_f64,
    .update_cuda = MPRI_OPTIM_CUDA_UPDATE(mpri_optim_cuda_rmsprop),
};
