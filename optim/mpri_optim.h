/* mpri_optim.h — internal layout shared by the local optimizers (the .c
 * files of optim/), not installed: a vtable per algorithm, the common
 * optimizer object and the per-parameter state every algorithm keeps.
 *
 * The generic layer (optimizer.c) owns the parameter references (contiguous
 * float tensors on the CPU, or on a CUDA device when the backend is built,
 * checked by mpri_optimizer_new), validates gradients
 * (shape, dtype, contiguity), keeps per parameter a step count and the
 * algorithm's state buffers ("slots", named with PyTorch's state keys,
 * created zero- or value-filled on the parameter's first step with a
 * gradient), and calls the algorithm's update once per parameter that has a
 * gradient; the algorithm updates the parameter and its slots in place, the
 * generic layer bumps the parameter's storage version.
 *
 * Invariants: bufs[i * n_slots + k] is NULL or a contiguous tensor of
 * params[i]'s shape, dtype and device, owned by the optimizer; it is non-NULL only
 * for slots the options use (vt->slot_used); steps[i] counts the updates
 * parameter i received (PyTorch's state["step"]). */
#ifndef MPRI_OPTIM_H
#define MPRI_OPTIM_H

#include <math.h>

#include "mpirpc/optim.h"
#include "mpirpc/tensor_io.h"
#include "mpri_optim_cuda.h"
#include "mpri_tensor.h"

#define MPRI_OPTIM_MAX_SLOTS 3

typedef struct mpri_optimizer_vtable {
    const char *name; /* PyTorch's class name: "Adam" */
    const char *kind; /* mpr_optimizer_create's kind: "adam" */
    void (*defaults)(mpr_optim_options_t *o);
    /* MPR_OK or MPR_ERR_INVALID_ARG with PyTorch's message for bad options. */
    mpr_err_t (*check)(const mpr_optim_options_t *o);
    int n_slots;
    const char *slot_names[MPRI_OPTIM_MAX_SLOTS]; /* PyTorch's state keys */
    /* Whether slot k exists under options o, and the value it starts with. */
    bool (*slot_used)(const mpr_optim_options_t *o, int k, double *init);
    /* Update contiguous p (n elements) from contiguous g: slots[k] are the data
     * of the used slots (NULL otherwise), step the count including this step. */
    void (*update_f32)(const mpr_optim_options_t *o, int64_t n, float *p, const float *g,
                       float *const *slots, int64_t step);
    void (*update_f64)(const mpr_optim_options_t *o, int64_t n, double *p, const double *g,
                       double *const *slots, int64_t step);
    /* The same update for a parameter on a CUDA device (mpri_optim_cuda.h);
     * NULL without the CUDA backend. */
    mpri_optim_cuda_update_fn update_cuda;
} mpri_optimizer_vtable_t;

/* A vtable's update_cuda: fn with the CUDA backend, else NULL (fn is then
 * never referenced, so nothing needs to define it). */
#ifdef MPIRPC_HAVE_CUDA
#define MPRI_OPTIM_CUDA_UPDATE(fn) (fn)
#else
#define MPRI_OPTIM_CUDA_UPDATE(fn) NULL
#endif

struct mpr_optimizer {
    const mpri_optimizer_vtable_t *vt;
    int n_params;
    mpr_tensor_t **params; /* owned references */
    mpr_optim_options_t o; /* o.lr is the current learning rate */
    int64_t *steps;        /* [n_params] */
    mpr_tensor_t **bufs;   /* [n_params * vt->n_slots], NULL until used */
};

/* The algorithms (one file each). */
extern const mpri_optimizer_vtable_t mpri_sgd_vt, mpri_adagrad_vt, mpri_adam_vt, mpri_adamw_vt,
    mpri_rmsprop_vt;

/* The vtable of `kind`, or NULL with MPR_ERR_INVALID_ARG naming the known
 * kinds (`what` starts the message). */
const mpri_optimizer_vtable_t *mpri_optim_find(const char *kind, const char *what);

/* Allocates an optimizer over params[n] (references taken) after checking
 * each is a contiguous CPU float tensor and vt->check accepts *o; NULL with
 * an error naming vt->name. */
mpr_optimizer_t *mpri_optimizer_new(const mpri_optimizer_vtable_t *vt, mpr_tensor_t *const *params,
                                    int n, const mpr_optim_options_t *o);

/* Checks shared by the algorithms' check functions: MPR_ERR_INVALID_ARG
 * "<name>: Invalid <what> value: <v>" unless v >= 0 (NaN fails too). */
mpr_err_t mpri_optim_check_nonneg(const char *name, const char *what, double v);
/* ... unless 0 <= v < 1 ("Invalid beta parameter at index <i>"). */
mpr_err_t mpri_optim_check_beta(const char *name, int index, double v);

/* Shared by Adam and AdamW (adam.c): their option checks (errors start with
 * `name`) and slots (exp_avg, exp_avg_sq, and max_exp_avg_sq with amsgrad). */
mpr_err_t mpri_adam_check_named(const char *name, const mpr_optim_options_t *o);
bool mpri_adam_slot_used(const mpr_optim_options_t *o, int k, double *init);

/* The gradient PyTorch's step starts from: sign * g (sign = -1 with
 * maximize, an exact negation) plus wd * p (L2, coupled) when HAS_WD.
 * Scalars are in the tensor's dtype, as PyTorch casts them. */
#define MPRI_OPTIM_D(HAS_WD, sign, wd, gj, pj) ((HAS_WD) ? (sign) * (gj) + (wd) * (pj) : (sign) * (gj))

/* Expand BODY(f1, f2[, f3]) once per combination of the run-time flags, with
 * literal 0/1 arguments, so each kernel loop is specialized (no branch inside
 * it: the compiler vectorizes it). */
#define MPRI_OPTIM_SPECIALIZE2(a, b, BODY) \
    do {                                   \
        if (a) {                           \
            if (b) { BODY(1, 1); }         \
            else { BODY(1, 0); }           \
        } else {                           \
            if (b) { BODY(0, 1); }         \
            else { BODY(0, 0); }           \
        }                                  \
    } while (0)
/* The fields of mpr_optim_options_t, X(name) each (doubles, then bools), so
 * code that walks every option (checkpoints, copies) cannot miss one. */
#define MPRI_OPTIM_DOUBLES(X)                                                                     \
    X(lr) X(momentum) X(dampening) X(weight_decay) X(beta1) X(beta2) X(eps) X(alpha) X(lr_decay) \
        X(initial_accumulator_value)
#define MPRI_OPTIM_BOOLS(X) X(nesterov) X(amsgrad) X(centered) X(maximize)

/* sqrtf for float, sqrt for double (both correctly rounded). */
#define MPRI_OPTIM_SQRT(x) _Generic((x), float: sqrtf, default: sqrt)(x)

/* mpr_optimizer_state_export/import with local parameter i named
 * "state.<index[i]>" (index NULL: i); import checks every entry's index is
 * < n_total and skips those of parameters not in index[] (state_io.c). */
mpr_err_t mpri_optimizer_state_export_indexed(const mpr_optimizer_t *opt, mpr_tensor_dict_t *d,
                                              const char *prefix, const int *index);
mpr_err_t mpri_optimizer_state_import_indexed(mpr_optimizer_t *opt, const mpr_tensor_dict_t *d,
                                              const char *prefix, const int *index, int n_total);

/* mpr_safetensors_save to "<path>.tmp.<pid>", fsync, rename over `path`:
 * readers see the old file or the new one, never a torn one; errors start
 * with `what`. */
mpr_err_t mpri_safetensors_save_atomic(const mpr_tensor_dict_t *d, const char *path, const char *what);

/* The DistributedOptimizer's functions and object type (dist_optimizer.c);
 * run by mpr_init (init.c). */
mpr_err_t mpri_dist_optim_install(void);

#endif
