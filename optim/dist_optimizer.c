/* dist_optimizer.c — DistributedOptimizer (mpirpc/dist_optim.h): one local
 * optimizer per parameter owner, created with remote(), stepped
 * concurrently with the gradients a dist autograd context holds there.
 *
 * PROTOCOL (the caller's handle; the owners' local optimizers):
 *
 *   create (caller): group the parameter RRefs by owner; for each owner
 *     mpr_remote(owner, CREATE_FN, [kind, options bytes, [param RRefs]]):
 *     the owner builds a LocalOptimizer object (CREATING -> READY, or
 *     FAILED: the RRef's value is the error) and keeps it in an OwnerRRef.
 *     Nothing waits: a failure shows at the first step.
 *   step(ctx) (caller): for every owner at once, the proxy call
 *     STEP_FN(local optimizer RRef, ctx) -> futures; wait for all; the first
 *     failure is returned, prefixed with the owner's name.
 *   STEP_FN (owner): under this worker's step lock: each parameter's
 *     gradient in `ctx` (mpr_dist_get_gradient; none -> skipped), then
 *     mpr_optimizer_step_grads. An unknown context, or no gradient for any
 *     parameter, fails the call.
 *   destroy (caller): release the local optimizer RRefs; each owner frees
 *     its LocalOptimizer when the last user is gone (the RRef protocol), so
 *     nothing outlives a graceful shutdown.
 *
 * Invariants: a handle holds exactly one RRef per distinct owner, and each
 * parameter is in exactly one owner's group (MPRI_ASSERT); a LocalOptimizer
 * is stepped by one thread at a time on its worker (`step_lock`, shared by
 * every LocalOptimizer of the worker, so two handles over the same
 * parameters never interleave their in-place updates). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpirpc/dist_autograd.h"
#include "mpirpc/dist_optim.h"
#include "mpirpc/rpc.h"
#include "mpri_args.h"
#include "mpri_assert.h"
#include "mpri_optim.h"

#define CREATE_FN "mpirpc.dist_optim.create"
#define STEP_FN "mpirpc.dist_optim.step"
#define TYPE_NAME "mpirpc.LocalOptimizer"

/* ---- the owner's side ---- */

typedef struct local_optimizer {
    mpr_optimizer_t *opt; /* holds references to the parameters */
} local_optimizer_t;

static const mpr_type_t *local_type;
static pthread_mutex_t step_lock = PTHREAD_MUTEX_INITIALIZER;

static void local_destroy(void *obj) {
    local_optimizer_t *lo = obj;
    mpr_optimizer_destroy(lo->opt);
    free(lo);
}

/* [kind, options bytes, [param RRefs owned here]] -> LocalOptimizer object */
static mpr_err_t create_fn(mpr_call_ctx_t *call, const mpr_value_t *args, mpr_value_t **result) {
    (void)call;
    const char *kind;
    const void *opt_bytes;
    size_t opt_len;
    mpr_err_t e;
    if ((e = mpr_args_string(args, 0, &kind)) ||
        (e = mpr_value_get_bytes(mpr_value_list_get(args, 1), &opt_bytes, &opt_len)))
        return e;
    if (opt_len != sizeof(mpr_optim_options_t))
        return mpr_error_set(MPR_ERR_DECODE, "DistributedOptimizer: options of %zu bytes, expected %zu", opt_len,
                             sizeof(mpr_optim_options_t));
    mpr_optim_options_t opts;
    memcpy(&opts, opt_bytes, sizeof opts);
    const mpr_value_t *list = mpr_value_list_get(args, 2);
    int n = (int)mpr_value_list_len(list);
    if (n < 1) return mpr_error_set(MPR_ERR_INVALID_ARG, "DistributedOptimizer: no parameter for this owner");
    mpr_value_t **vals = calloc((size_t)n, sizeof *vals);
    mpr_tensor_t **params = calloc((size_t)n, sizeof *params);
    if (!vals || !params) e = mpr_error_set(MPR_ERR_NOMEM, "DistributedOptimizer: out of memory");
    for (int i = 0; !e && i < n; i++) {
        mpr_rref_t *r;
        if ((e = mpr_value_get_rref(mpr_value_list_get(list, (size_t)i), &r))) break;
        if ((e = mpr_rref_local_value(r, &vals[i]))) break;
        if ((e = mpr_value_get_tensor(vals[i], &params[i])))
            mpr_error_set(e, "DistributedOptimizer: parameter %d is not a tensor", i);
    }
    local_optimizer_t *lo = NULL;
    if (!e) {
        mpr_optimizer_t *opt = mpr_optimizer_create(kind, params, n, &opts);
        if (!opt) e = mpr_last_error_code();
        if (!e && !(lo = malloc(sizeof *lo))) {
            mpr_optimizer_destroy(opt);
            e = mpr_error_set(MPR_ERR_NOMEM, "DistributedOptimizer: out of memory");
        }
        if (!e) {
            lo->opt = opt;
            if (!(*result = mpr_value_new_object(local_type, lo))) {
                local_destroy(lo);
                e = mpr_last_error_code();
            }
        }
    }
    for (int i = 0; vals && i < n; i++) mpr_value_release(vals[i]);
    free(vals);
    free(params);
    return e;
}

/* [LocalOptimizer RRef, ctx id] -> none */
static mpr_err_t step_fn(mpr_call_ctx_t *call, const mpr_value_t *args, mpr_value_t **result) {
    (void)call;
    local_optimizer_t *lo;
    int64_t ctx;
    mpr_err_t e;
    if ((e = mpr_rref_self(args, local_type, (void **)&lo)) || (e = mpr_args_int(args, 1, &ctx))) return e;
    int n = mpr_optimizer_num_params(lo->opt);
    mpr_tensor_t **grads = calloc((size_t)n, sizeof *grads);
    if (!grads) return mpr_error_set(MPR_ERR_NOMEM, "DistributedOptimizer: out of memory");
    int found = 0;
    for (int i = 0; !e && i < n; i++) {
        e = mpr_dist_get_gradient(ctx, mpr_optimizer_param(lo->opt, i), &grads[i]);
        found += grads[i] != NULL;
    }
    if (!e && !found)
        e = mpr_error_set(MPR_ERR_NOT_FOUND,
                          "context %lld holds no gradient for any of the %d parameter(s) here (was backward "
                          "run in this context?)",
                          (long long)ctx, n);
    if (!e) {
        pthread_mutex_lock(&step_lock);
        e = mpr_optimizer_step_grads(lo->opt, grads, n);
        pthread_mutex_unlock(&step_lock);
    }
    for (int i = 0; i < n; i++) mpr_tensor_release(grads[i]);
    free(grads);
    if (!e) *result = mpr_value_new_none();
    return e;
}

mpr_err_t mpri_dist_optim_install(void) {
    mpr_err_t e = mpr_register_type(TYPE_NAME, local_destroy, &local_type);
    if (!e) e = mpr_register_function(CREATE_FN, create_fn, NULL);
    if (!e) e = mpr_register_function(STEP_FN, step_fn, NULL);
    return e;
}

/* ---- the caller's handle ---- */

struct mpr_dist_optimizer {
    int n_owners;
    int *owner_ranks;
    mpr_rref_t **locals; /* [n_owners]: RRef to each owner's LocalOptimizer */
};

mpr_dist_optimizer_t *mpr_dist_optimizer_create(const char *kind, const mpr_optim_options_t *opts,
                                                mpr_rref_t *const *params, int n) {
    MPRI_ARG_NONNULL_OR(kind, NULL);
    MPRI_ARG_NONNULL_OR(opts, NULL);
    MPRI_ARG_NONNULL_OR(params, NULL);
    if (n < 1) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_dist_optimizer_create: %d parameters (needs at least one)", n);
        return NULL;
    }
    int *owner_of = calloc((size_t)n, sizeof *owner_of);
    mpr_dist_optimizer_t *o = calloc(1, sizeof *o);
    mpr_err_t e = owner_of && o ? MPR_OK : mpr_error_set(MPR_ERR_NOMEM, "mpr_dist_optimizer_create: out of memory");
    if (!e) {
        o->owner_ranks = calloc((size_t)n, sizeof *o->owner_ranks);
        o->locals = calloc((size_t)n, sizeof *o->locals);
        if (!o->owner_ranks || !o->locals) e = mpr_error_set(MPR_ERR_NOMEM, "mpr_dist_optimizer_create: out of memory");
    }
    for (int i = 0; !e && i < n; i++) {
        mpr_worker_info_t w;
        if (!params[i]) {
            e = mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_dist_optimizer_create: parameter %d is NULL", i);
            break;
        }
        if ((e = mpr_rref_owner(params[i], &w))) break;
        int k = 0;
        while (k < o->n_owners && o->owner_ranks[k] != w.rank) k++;
        if (k == o->n_owners) o->owner_ranks[o->n_owners++] = w.rank;
        owner_of[i] = k;
    }
    mpr_value_t *opt_bytes = e ? NULL : mpr_value_new_bytes(opts, sizeof *opts);
    if (!e && !opt_bytes) e = mpr_last_error_code();
    for (int k = 0; !e && k < o->n_owners; k++) {
        mpr_value_t *group = mpr_value_new_list();
        int in_group = 0;
        for (int i = 0; group && i < n; i++)
            if (owner_of[i] == k) {
                if (mpr_value_list_append(group, mpr_value_new_rref(params[i])) != MPR_OK) {
                    mpr_value_release(group);
                    group = NULL;
                }
                in_group++;
            }
        MPRI_ASSERT(!group || in_group >= 1, "every owner found holds at least one parameter");
        mpr_value_t *args = group ? mpr_value_list_of(3, mpr_value_new_string(kind), mpr_value_retain(opt_bytes), group)
                                  : NULL;
        if (!args) {
            e = mpr_last_error_code() ? mpr_last_error_code() : MPR_ERR_NOMEM;
            break;
        }
        o->locals[k] = mpr_remote(mpr_to_rank(o->owner_ranks[k]), CREATE_FN, args, MPR_TIMEOUT_DEFAULT);
        mpr_value_release(args);
        if (!o->locals[k]) e = mpr_last_error_code();
    }
    mpr_value_release(opt_bytes);
    free(owner_of);
    if (e) {
        mpr_dist_optimizer_destroy(o);
        return NULL;
    }
    return o;
}

mpr_err_t mpr_dist_optimizer_step(mpr_dist_optimizer_t *opt, int64_t ctx_id) {
    MPRI_ARG_NONNULL(opt);
    mpr_dist_optimizer_t *o = opt;
    mpr_future_t **fs = calloc((size_t)o->n_owners, sizeof *fs);
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_int(ctx_id));
    mpr_err_t e = fs && args ? MPR_OK : mpr_error_set(MPR_ERR_NOMEM, "mpr_dist_optimizer_step: out of memory");
    for (int k = 0; !e && k < o->n_owners; k++) /* all owners at once */
        if (!(fs[k] = mpr_rref_rpc_async(o->locals[k], STEP_FN, args, MPR_TIMEOUT_DEFAULT))) e = mpr_last_error_code();
    for (int k = 0; fs && k < o->n_owners; k++) {
        if (!fs[k]) continue;
        mpr_err_t fe = mpr_future_wait(fs[k], MPR_WAIT_FOREVER);
        if (!fe) fe = mpr_future_error(fs[k]);
        if (fe && !e) {
            const char *msg = mpr_future_error_message(fs[k]);
            e = mpr_error_set(fe, "DistributedOptimizer step on %s: %s", mpr_rref_owner_name(o->locals[k]),
                              msg ? msg : mpr_strerror(fe));
        }
        mpr_future_release(fs[k]);
    }
    free(fs);
    mpr_value_release(args);
    return e;
}

int mpr_dist_optimizer_num_owners(const mpr_dist_optimizer_t *opt) {
    MPRI_ARG_NONNULL_OR(opt, 0);
    return opt->n_owners;
}

void mpr_dist_optimizer_destroy(mpr_dist_optimizer_t *o) {
    if (!o) return;
    for (int k = 0; o->locals && k < o->n_owners; k++) mpr_rref_release(o->locals[k]);
    free(o->locals);
    free(o->owner_ranks);
    free(o);
}
