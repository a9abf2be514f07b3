/* lr_scheduler.c — StepLR and CosineAnnealingLR (torch.optim.lr_scheduler,
 * PyTorch 1.13), stepping an optimizer's learning rate with PyTorch's
 * recursive ("chainable") get_lr formulas, so the sequence of rates equals
 * PyTorch's to the last bit of double arithmetic.
 *
 * Invariants: base_lr is the optimizer's lr at create; last_epoch counts
 * mpr_lr_scheduler_step calls (0 after create, as PyTorch's constructor
 * leaves it after its initial step); each step sets the optimizer's lr from
 * the lr it has now (a rate changed by hand in between is carried on, as
 * PyTorch does). The scheduler borrows the optimizer. */
#include <math.h>
#include <stdlib.h>

#include "mpri_args.h"
#include "mpri_optim.h"

typedef enum { LR_STEP, LR_COSINE } lr_kind_t;

struct mpr_lr_scheduler {
    lr_kind_t kind;
    mpr_optimizer_t *opt; /* borrowed */
    double base_lr;
    int64_t last_epoch;
    int64_t period;       /* step_size (StepLR) or T_max (cosine) */
    double gamma_or_eta;  /* gamma (StepLR) or eta_min (cosine) */
};

static mpr_lr_scheduler_t *sched_new(lr_kind_t kind, mpr_optimizer_t *opt, int64_t period, double x,
                                     const char *what) {
    if (period < 1) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "%s: %s must be >= 1 (got %lld)", what,
                      kind == LR_STEP ? "step_size" : "T_max", (long long)period);
        return NULL;
    }
    mpr_lr_scheduler_t *s = calloc(1, sizeof *s);
    if (!s) {
        mpr_error_set(MPR_ERR_NOMEM, "%s: out of memory", what);
        return NULL;
    }
    *s = (mpr_lr_scheduler_t){kind, opt, opt->o.lr, 0, period, x};
    return s;
}

mpr_lr_scheduler_t *mpr_lr_step_create(mpr_optimizer_t *opt, int64_t step_size, double gamma) {
    MPRI_ARG_NONNULL_OR(opt, NULL);
    if (!opt) return NULL;
    return sched_new(LR_STEP, opt, step_size, gamma, "StepLR");
}

mpr_lr_scheduler_t *mpr_lr_cosine_create(mpr_optimizer_t *opt, int64_t t_max, double eta_min) {
    MPRI_ARG_NONNULL_OR(opt, NULL);
    if (!opt) return NULL;
    return sched_new(LR_COSINE, opt, t_max, eta_min, "CosineAnnealingLR");
}

/* PyTorch's get_lr at epoch e from the current lr. */
static double next_lr(const mpr_lr_scheduler_t *s, int64_t e, double lr) {
    if (s->kind == LR_STEP) {
        if (e == 0 || e % s->period != 0) return lr;
        return lr * s->gamma_or_eta;
    }
    double t = (double)s->period, eta = s->gamma_or_eta;
    if (e == 0) return lr;
    if ((e - 1 - s->period) % (2 * s->period) == 0)
        return lr + (s->base_lr - eta) * (1 - cos(M_PI / t)) / 2;
    return (1 + cos(M_PI * (double)e / t)) / (1 + cos(M_PI * (double)(e - 1) / t)) * (lr - eta) + eta;
}

mpr_err_t mpr_lr_scheduler_step(mpr_lr_scheduler_t *s) {
    MPRI_ARG_NONNULL(s);
    if (!s) return mpr_error_set(MPR_ERR_INVALID_ARG, "lr_scheduler_step: NULL argument");
    s->last_epoch++;
    s->opt->o.lr = next_lr(s, s->last_epoch, s->opt->o.lr);
    return MPR_OK;
}

int64_t mpr_lr_scheduler_last_epoch(const mpr_lr_scheduler_t *s) {
    MPRI_ARG_NONNULL_OR(s, 0);
    return s ? s->last_epoch : 0;
}

mpr_err_t mpr_lr_scheduler_set_last_epoch(mpr_lr_scheduler_t *s, int64_t last_epoch) {
    MPRI_ARG_NONNULL(s);
    if (!s) return mpr_error_set(MPR_ERR_INVALID_ARG, "lr_scheduler_set_last_epoch: NULL argument");
    if (last_epoch < 0)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "lr_scheduler_set_last_epoch: %lld < 0", (long long)last_epoch);
    s->last_epoch = last_epoch;
    return MPR_OK;
}

void mpr_lr_scheduler_destroy(mpr_lr_scheduler_t *s) { free(s); }
