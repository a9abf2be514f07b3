/* options.c — the generic constructor: the table of optimizer kinds,
 * PyTorch's default options per kind, the option checks the algorithms
 * share, and mpr_optimizer_create / mpr_sgd_create.
 *
 * Invariants: the kind table lists every algorithm once; an unknown kind or
 * options an algorithm's check rejects create nothing and leave an
 * MPR_ERR_INVALID_ARG whose message names the known kinds or the bad value
 * (PyTorch's wording, "Invalid learning rate: -1"). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "mpri_args.h"
#include "mpri_optim.h"

static const mpri_optimizer_vtable_t *const kinds[] = {&mpri_sgd_vt, &mpri_adagrad_vt, &mpri_adam_vt,
                                                       &mpri_adamw_vt, &mpri_rmsprop_vt};
#define N_KINDS ((int)(sizeof kinds / sizeof kinds[0]))

const mpri_optimizer_vtable_t *mpri_optim_find(const char *kind, const char *what) {
    for (int i = 0; kind && i < N_KINDS; i++)
        if (strcmp(kinds[i]->kind, kind) == 0) return kinds[i];
    char known[128] = "";
    for (int i = 0; i < N_KINDS; i++) {
        strncat(known, i ? ", " : "", sizeof known - strlen(known) - 1);
        strncat(known, kinds[i]->kind, sizeof known - strlen(known) - 1);
    }
    mpr_error_set(MPR_ERR_INVALID_ARG, "%s: unknown optimizer kind '%s' (known: %s)", what,
                  kind ? kind : "(null)", known);
    return NULL;
}

mpr_err_t mpri_optim_check_nonneg(const char *name, const char *what, double v) {
    if (v >= 0) return MPR_OK;
    return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: Invalid %s: %g", name, what, v);
}

mpr_err_t mpri_optim_check_beta(const char *name, int index, double v) {
    if (v >= 0 && v < 1) return MPR_OK;
    return mpr_error_set(MPR_ERR_INVALID_ARG,
                         "%s: Invalid beta parameter at index %d: %g (must be in [0, 1))", name, index,
                         v);
}

void mpr_optim_options_default(const char *kind, mpr_optim_options_t *out) {
    if (out) memset(out, 0, sizeof *out);
    MPRI_ARG_NONNULL_OR(kind, );
    MPRI_ARG_NONNULL_OR(out, );
    if (!kind || !out) return;
    const mpri_optimizer_vtable_t *vt = mpri_optim_find(kind, "optim_options_default");
    if (!vt) return;
    mpr_optim_options_t d;
    vt->defaults(&d);
    /* field by field into the zeroed *out: its padding bytes stay zero, so the
     * struct can be sent (or compared) as bytes */
#define COPY_FIELD(f) out->f = d.f;
    MPRI_OPTIM_DOUBLES(COPY_FIELD)
    MPRI_OPTIM_BOOLS(COPY_FIELD)
#undef COPY_FIELD
}

mpr_optimizer_t *mpr_optimizer_create(const char *kind, mpr_tensor_t *const *params, int n,
                                      const mpr_optim_options_t *opts) {
    MPRI_ARG_NONNULL_OR(kind, NULL);
    MPRI_ARG_NONNULL_OR(params, NULL);
    MPRI_ARG_NONNULL_OR(opts, NULL);
    if (!kind || !params || !opts) return NULL;
    const mpri_optimizer_vtable_t *vt = mpri_optim_find(kind, "optimizer_create");
    return vt ? mpri_optimizer_new(vt, params, n, opts) : NULL;
}

mpr_optimizer_t *mpr_sgd_create(mpr_tensor_t *const *params, int n, const mpr_sgd_options_t *opts) {
    if (n > 0) MPRI_ARG_NONNULL_OR(params, NULL);
    MPRI_ARG_NONNULL_OR(opts, NULL);
    if (!opts) return NULL;
    if (!(opts->lr > 0) || !(opts->dampening >= 0)) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "SGD: need lr > 0 and dampening >= 0, got lr %g dampening %g",
                      opts->lr, opts->dampening);
        return NULL;
    }
    mpr_optim_options_t o;
    mpr_optim_options_default("sgd", &o);
    o.lr = opts->lr;
    o.momentum = opts->momentum;
    o.dampening = opts->dampening;
    o.weight_decay = opts->weight_decay;
    o.nesterov = opts->nesterov;
    return mpri_optimizer_new(&mpri_sgd_vt, params, n, &o);
}
