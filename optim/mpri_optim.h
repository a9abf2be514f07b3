/* mpri_optim.h — internal layout shared by the local optimizers (the .c
 * files of optim/), not installed: a vtable per algorithm and common fields.
 *
 * The generic layer (optimizer.c) owns the parameter references (contiguous
 * CPU float tensors, checked by mpri_optimizer_new), validates
 * gradients (shape, dtype, contiguity) and calls the algorithm's step with
 * one contiguous gradient per parameter (NULL = skip that parameter); the
 * algorithm updates parameters in place and bumps their storage version. */
#ifndef MPRI_OPTIM_H
#define MPRI_OPTIM_H

#include "mpirpc/optim.h"
#include "mpri_tensor.h"

typedef struct mpri_optimizer_vtable {
    const char *name;
    /* grads[n_params]: contiguous, parameter's shape/dtype, or NULL. */
    mpr_err_t (*step)(mpr_optimizer_t *opt, mpr_tensor_t *const *grads);
    void (*destroy)(mpr_optimizer_t *opt); /* frees `state`; may be NULL */
} mpri_optimizer_vtable_t;

struct mpr_optimizer {
    const mpri_optimizer_vtable_t *vt;
    int n_params;
    mpr_tensor_t **params; /* owned references */
    double lr;
    void *state;           /* algorithm-specific */
};

/* Allocates an optimizer over params[n] (references taken) after checking
 * each is a contiguous CPU float tensor; NULL with an error naming `name`. */
mpr_optimizer_t *mpri_optimizer_new(const mpri_optimizer_vtable_t *vt, mpr_tensor_t *const *params,
                                    int n, double lr);

#endif
