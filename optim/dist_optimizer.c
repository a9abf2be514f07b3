/* dist_optimizer.c — DistributedOptimizer (mpirpc/dist_optim.h): one local
 * optimizer per parameter owner, created with remote(), stepped
 * concurrently with the gradients a dist autograd context holds there, and
 * its state checkpointed as if it were one optimizer over the whole list.
 *
 * PROTOCOL (the caller's handle; the owners' local optimizers):
 *
 *   create (caller): group the parameter RRefs by owner; for each owner
 *     mpr_remote(owner, CREATE_FN, [kind, options bytes, [param RRefs],
 *     [their indices in the caller's list], list length]): the owner builds
 *     a LocalOptimizer object (CREATING -> READY, or FAILED: the RRef's
 *     value is the error) and keeps it in an OwnerRRef. Nothing waits: a
 *     failure shows at the first call that uses it.
 *   step(ctx) (caller): for every owner at once, the proxy call
 *     STEP_FN(local optimizer RRef, ctx) -> futures; wait for all; the first
 *     failure is returned, prefixed with the owner's name.
 *   STEP_FN (owner): under this worker's lock: each parameter's gradient in
 *     `ctx` (mpr_dist_get_gradient; none -> skipped), then
 *     mpr_optimizer_step_grads. An unknown context, or no gradient for any
 *     parameter, fails the call.
 *   state_export (caller): EXPORT_FN on every owner at once; each returns
 *     its part as safetensors bytes, parameters named by their index in the
 *     caller's list; all parts are decoded before any is merged into the
 *     caller's dict (a failure leaves it unchanged).
 *   state_import (caller), two phases so that either every owner takes the
 *     new state or none does:
 *       PREPARE_FN(local RRef, id, prefix, bytes) on every owner: the owner
 *         imports its part into a new optimizer beside the live one
 *         (READY -> PREPARED(id); a PREPARED(old) is replaced);
 *       all prepared: COMMIT_FN(local RRef, id) on every owner: the prepared
 *         optimizer replaces the live one (PREPARED(id) -> READY);
 *       any prepare failed: ABORT_FN(local RRef, id) on every owner
 *         (PREPARED(id) -> READY; nothing else changes), and the first
 *         failure is returned naming its owner.
 *     A COMMIT whose id is not the one prepared (two imports raced and the
 *     other's prepare came later) fails: that caller's import lost.
 *   destroy (caller): release the local optimizer RRefs; each owner frees
 *     its LocalOptimizer when the last user is gone (the RRef protocol), so
 *     nothing outlives a graceful shutdown.
 *
 * Invariants: a handle holds exactly one RRef per distinct owner, and each
 * parameter is in exactly one owner's group (MPRI_ASSERT); a LocalOptimizer
 * is used by one thread at a time on its worker (`owner_lock`, shared by
 * every LocalOptimizer of the worker, so two handles over the same
 * parameters never interleave their in-place updates); its `pending` is
 * NULL exactly when pending_id is 0 (READY), and pending has the live
 * optimizer's parameters (MPRI_ASSERT at commit). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpirpc/dist_autograd.h"
#include "mpirpc/dist_optim.h"
#include "mpirpc/rpc.h"
#include "mpirpc/tensor_io.h"
#include "mpri_args.h"
#include "mpri_assert.h"
#include "mpri_optim.h"
#include "mpri_trace.h"

#define CREATE_FN "mpirpc.dist_optim.create"
#define STEP_FN "mpirpc.dist_optim.step"
#define EXPORT_FN "mpirpc.dist_optim.state_export"
#define PREPARE_FN "mpirpc.dist_optim.import_prepare"
#define COMMIT_FN "mpirpc.dist_optim.import_commit"
#define ABORT_FN "mpirpc.dist_optim.import_abort"
#define TYPE_NAME "mpirpc.LocalOptimizer"

/* ---- the owner's side ---- */

typedef struct local_optimizer {
    mpr_optimizer_t *opt;     /* holds references to the parameters */
    char kind[16];            /* mpr_optimizer_create's kind, to build `pending` */
    int *index;               /* [num params]: each parameter's index in the caller's list */
    int n_total;              /* the caller's list length */
    mpr_optimizer_t *pending; /* PREPARED: the imported state, waiting for COMMIT */
    int64_t pending_id;       /* the import it belongs to; 0 when READY */
} local_optimizer_t;

static const mpr_type_t *local_type;
static pthread_mutex_t owner_lock = PTHREAD_MUTEX_INITIALIZER;

static void local_destroy(void *obj) {
    local_optimizer_t *lo = obj;
    mpr_optimizer_destroy(lo->opt);
    mpr_optimizer_destroy(lo->pending);
    free(lo->index);
    free(lo);
}

/* [kind, options bytes, [param RRefs owned here], [their indices], list
 * length] -> LocalOptimizer object */
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
    const mpr_value_t *list = mpr_value_list_get(args, 2), *indices = mpr_value_list_get(args, 3);
    int64_t n_total;
    if ((e = mpr_args_int(args, 4, &n_total))) return e;
    int n = (int)mpr_value_list_len(list);
    if (n < 1) return mpr_error_set(MPR_ERR_INVALID_ARG, "DistributedOptimizer: no parameter for this owner");
    if (strlen(kind) >= sizeof ((local_optimizer_t *)0)->kind)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "DistributedOptimizer: unknown optimizer kind '%s'", kind);
    if ((int)mpr_value_list_len(indices) != n || n_total < n || n_total > INT32_MAX)
        return mpr_error_set(MPR_ERR_DECODE, "DistributedOptimizer: %d parameters but %zu indices into a list of %lld",
                             n, mpr_value_list_len(indices), (long long)n_total);
    mpr_value_t **vals = calloc((size_t)n, sizeof *vals);
    mpr_tensor_t **params = calloc((size_t)n, sizeof *params);
    int *index = calloc((size_t)n, sizeof *index);
    if (!vals || !params || !index) e = mpr_error_set(MPR_ERR_NOMEM, "DistributedOptimizer: out of memory");
    for (int i = 0; !e && i < n; i++) {
        int64_t gi;
        if ((e = mpr_value_get_int(mpr_value_list_get(indices, (size_t)i), &gi))) break;
        if (gi < 0 || gi >= n_total)
            e = mpr_error_set(MPR_ERR_DECODE, "DistributedOptimizer: parameter index %lld outside [0, %lld)",
                              (long long)gi, (long long)n_total);
        index[i] = (int)gi;
    }
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
        if (!e && !(lo = calloc(1, sizeof *lo))) {
            mpr_optimizer_destroy(opt);
            e = mpr_error_set(MPR_ERR_NOMEM, "DistributedOptimizer: out of memory");
        }
        if (!e) {
            lo->opt = opt;
            snprintf(lo->kind, sizeof lo->kind, "%s", kind);
            lo->index = index;
            index = NULL;
            lo->n_total = (int)n_total;
            if (!(*result = mpr_value_new_object(local_type, lo))) {
                local_destroy(lo);
                e = mpr_last_error_code();
            }
        }
    }
    for (int i = 0; vals && i < n; i++) mpr_value_release(vals[i]);
    free(vals);
    free(params);
    free(index);
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
        pthread_mutex_lock(&owner_lock);
        e = mpr_optimizer_step_grads(lo->opt, grads, n);
        pthread_mutex_unlock(&owner_lock);
    }
    for (int i = 0; i < n; i++) mpr_tensor_release(grads[i]);
    free(grads);
    if (!e) *result = mpr_value_new_none();
    return e;
}

/* [LocalOptimizer RRef, prefix] -> bytes: this owner's part of the state */
static mpr_err_t export_fn(mpr_call_ctx_t *call, const mpr_value_t *args, mpr_value_t **result) {
    (void)call;
    local_optimizer_t *lo;
    const char *prefix;
    mpr_err_t e;
    if ((e = mpr_rref_self(args, local_type, (void **)&lo)) || (e = mpr_args_string(args, 1, &prefix))) return e;
    mpr_tensor_dict_t *d = mpr_tensor_dict_create();
    if (!d) return mpr_last_error_code();
    pthread_mutex_lock(&owner_lock);
    e = mpri_optimizer_state_export_indexed(lo->opt, d, prefix, lo->index);
    pthread_mutex_unlock(&owner_lock);
    void *buf = NULL;
    size_t len = 0;
    if (!e) e = mpr_safetensors_encode(d, &buf, &len);
    mpr_tensor_dict_destroy(d);
    if (!e && !(*result = mpr_value_new_bytes(buf, len))) e = mpr_last_error_code();
    free(buf);
    return e;
}

/* [LocalOptimizer RRef, import id, prefix, bytes] -> none: READY or
 * PREPARED(any) -> PREPARED(id), or unchanged on failure */
static mpr_err_t prepare_fn(mpr_call_ctx_t *call, const mpr_value_t *args, mpr_value_t **result) {
    (void)call;
    local_optimizer_t *lo;
    int64_t id;
    const char *prefix;
    const void *bytes;
    size_t len;
    mpr_err_t e;
    if ((e = mpr_rref_self(args, local_type, (void **)&lo)) || (e = mpr_args_int(args, 1, &id)) ||
        (e = mpr_args_string(args, 2, &prefix)) ||
        (e = mpr_value_get_bytes(mpr_value_list_get(args, 3), &bytes, &len)))
        return e;
    if (id == 0) return mpr_error_set(MPR_ERR_DECODE, "DistributedOptimizer: import id 0");
    mpr_tensor_dict_t *d = mpr_safetensors_decode(bytes, len, "optimizer state");
    if (!d) return mpr_last_error_code();
    int n = mpr_optimizer_num_params(lo->opt);
    mpr_tensor_t **params = calloc((size_t)n, sizeof *params);
    mpr_optimizer_t *fresh = NULL;
    if (!params) e = mpr_error_set(MPR_ERR_NOMEM, "DistributedOptimizer: out of memory");
    pthread_mutex_lock(&owner_lock);
    for (int i = 0; !e && i < n; i++) params[i] = mpr_optimizer_param(lo->opt, i);
    if (!e) {
        mpr_optim_options_t opts;
        e = mpr_optimizer_get_options(lo->opt, &opts);
        if (!e && !(fresh = mpr_optimizer_create(lo->kind, params, n, &opts))) e = mpr_last_error_code();
    }
    if (!e) e = mpri_optimizer_state_import_indexed(fresh, d, prefix, lo->index, lo->n_total);
    if (!e) {
        mpr_optimizer_destroy(lo->pending); /* an earlier import that never committed */
        lo->pending = fresh;
        lo->pending_id = id;
        fresh = NULL;
    }
    pthread_mutex_unlock(&owner_lock);
    mpr_optimizer_destroy(fresh);
    free(params);
    mpr_tensor_dict_destroy(d);
    if (!e) *result = mpr_value_new_none();
    return e;
}

/* [LocalOptimizer RRef, import id, commit?] -> none: PREPARED(id) -> READY,
 * the prepared state replacing the live one (commit) or dropped (abort). */
static mpr_err_t finish_import(const mpr_value_t *args, bool commit, mpr_value_t **result) {
    local_optimizer_t *lo;
    int64_t id;
    mpr_err_t e;
    if ((e = mpr_rref_self(args, local_type, (void **)&lo)) || (e = mpr_args_int(args, 1, &id))) return e;
    mpr_optimizer_t *drop = NULL;
    pthread_mutex_lock(&owner_lock);
    MPRI_ASSERT((lo->pending == NULL) == (lo->pending_id == 0), "a LocalOptimizer is PREPARED exactly when it holds an import");
    if (lo->pending_id == id) {
        MPRI_ASSERT(mpr_optimizer_num_params(lo->pending) == mpr_optimizer_num_params(lo->opt),
                    "a prepared import has the live optimizer's parameters");
        drop = commit ? lo->opt : lo->pending;
        if (commit) lo->opt = lo->pending;
        lo->pending = NULL;
        lo->pending_id = 0;
    } else if (commit) {
        e = mpr_error_set(MPR_ERR_STATE, "DistributedOptimizer: state import %lld was replaced by a concurrent import",
                          (long long)id);
    }
    pthread_mutex_unlock(&owner_lock);
    mpr_optimizer_destroy(drop);
    if (!e) *result = mpr_value_new_none();
    return e;
}

static mpr_err_t commit_fn(mpr_call_ctx_t *call, const mpr_value_t *args, mpr_value_t **result) {
    (void)call;
    return finish_import(args, true, result);
}

static mpr_err_t abort_fn(mpr_call_ctx_t *call, const mpr_value_t *args, mpr_value_t **result) {
    (void)call;
    return finish_import(args, false, result);
}

mpr_err_t mpri_dist_optim_install(void) {
    mpr_err_t e = mpr_register_type(TYPE_NAME, local_destroy, &local_type);
    if (!e) e = mpr_register_function(CREATE_FN, create_fn, NULL);
    if (!e) e = mpr_register_function(STEP_FN, step_fn, NULL);
    if (!e) e = mpr_register_function(EXPORT_FN, export_fn, NULL);
    if (!e) e = mpr_register_function(PREPARE_FN, prepare_fn, NULL);
    if (!e) e = mpr_register_function(COMMIT_FN, commit_fn, NULL);
    if (!e) e = mpr_register_function(ABORT_FN, abort_fn, NULL);
    return e;
}

/* ---- the caller's handle ---- */

struct mpr_dist_optimizer {
    int n_params;
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
    if (!e) o->n_params = n;
    mpr_value_t *opt_bytes = e ? NULL : mpr_value_new_bytes(opts, sizeof *opts);
    if (!e && !opt_bytes) e = mpr_last_error_code();
    for (int k = 0; !e && k < o->n_owners; k++) {
        mpr_value_t *group = mpr_value_new_list(), *indices = mpr_value_new_list();
        bool ok = group && indices;
        int in_group = 0;
        for (int i = 0; ok && i < n; i++)
            if (owner_of[i] == k) {
                ok = mpr_value_list_append(group, mpr_value_new_rref(params[i])) == MPR_OK &&
                     mpr_value_list_append(indices, mpr_value_new_int(i)) == MPR_OK;
                in_group++;
            }
        MPRI_ASSERT(!ok || in_group >= 1, "every owner found holds at least one parameter");
        mpr_value_t *args = NULL;
        if (ok) { /* list_of takes group and indices, even when it fails */
            args = mpr_value_list_of(5, mpr_value_new_string(kind), mpr_value_retain(opt_bytes), group, indices,
                                     mpr_value_new_int(n));
        } else {
            mpr_value_release(group);
            mpr_value_release(indices);
        }
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

/* Call `fn` with [local RRef, args...] on every owner at once and wait for
 * all. MPR_OK when every call succeeded; else the first failure, its message
 * prefixed with "DistributedOptimizer <what> on <owner>". When `ok` is
 * given, ok[k] tells whether owner k's call succeeded; when `results` is
 * given, results[k] is owner k's result (a new reference, NULL on failure). */
static mpr_err_t call_owners(mpr_dist_optimizer_t *o, const char *fn, mpr_value_t *args, const char *what,
                             bool *ok, mpr_value_t **results) {
    mpr_future_t **fs = calloc((size_t)o->n_owners, sizeof *fs);
    mpr_err_t e = fs && args ? MPR_OK : mpr_error_set(MPR_ERR_NOMEM, "DistributedOptimizer %s: out of memory", what);
    for (int k = 0; k < o->n_owners; k++) {
        if (ok) ok[k] = false;
        if (results) results[k] = NULL;
    }
    for (int k = 0; !e && k < o->n_owners; k++) /* all owners at once */
        if (!(fs[k] = mpr_rref_rpc_async(o->locals[k], fn, args, MPR_TIMEOUT_DEFAULT))) e = mpr_last_error_code();
    for (int k = 0; fs && k < o->n_owners; k++) {
        if (!fs[k]) continue;
        mpr_value_t *v = NULL;
        mpr_err_t fe = mpr_future_get(fs[k], MPR_WAIT_FOREVER, &v);
        if (fe && !e) {
            const char *msg = mpr_future_error_message(fs[k]);
            e = mpr_error_set(fe, "DistributedOptimizer %s on %s: %s", what, mpr_rref_owner_name(o->locals[k]),
                              msg && *msg ? msg : mpr_strerror(fe));
        }
        if (!fe && ok) ok[k] = true;
        if (!fe && results) results[k] = v;
        else mpr_value_release(v);
        mpr_future_release(fs[k]);
    }
    free(fs);
    return e;
}

mpr_err_t mpr_dist_optimizer_step(mpr_dist_optimizer_t *opt, int64_t ctx_id) {
    MPRI_ARG_NONNULL(opt);
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_int(ctx_id));
    bool traced = mpri_observing(MPRI_OBSERVE_TRACE);
    if (traced) mpri_trace_range_begin(MPRI_TCAT_OPTIM, "DistributedOptimizer step");
    mpr_err_t e = call_owners(opt, STEP_FN, args, "step", NULL, NULL);
    if (traced) mpri_trace_range_end();
    mpr_value_release(args);
    return e;
}

/* Put every tensor and metadata entry of `part` into `d` (both borrowed).
 * The owners' parts name disjoint parameters and share the metadata (kind,
 * options), which must agree. */
static mpr_err_t merge_part(mpr_tensor_dict_t *d, const mpr_tensor_dict_t *part, const mpr_tensor_dict_t *first) {
    mpr_err_t e = MPR_OK;
    for (size_t m = 0; !e && m < mpr_tensor_dict_meta_count(part); m++) {
        const char *k = mpr_tensor_dict_meta_key(part, m), *v = mpr_tensor_dict_meta_value(part, m);
        const char *v0 = mpr_tensor_dict_get_meta(first, k);
        if (!v0 || strcmp(v0, v) != 0)
            return mpr_error_set(MPR_ERR_STATE, "DistributedOptimizer state_export: owners disagree on '%s' ('%s' / '%s')",
                                 k, v0 ? v0 : "(absent)", v);
    }
    return e ? e : mpr_tensor_dict_update(d, part);
}

mpr_err_t mpr_dist_optimizer_state_export(mpr_dist_optimizer_t *opt, mpr_tensor_dict_t *d, const char *prefix) {
    MPRI_ARG_NONNULL(opt);
    MPRI_ARG_NONNULL(d);
    if (!prefix) prefix = "";
    mpr_value_t **results = calloc((size_t)opt->n_owners, sizeof *results);
    mpr_tensor_dict_t **parts = calloc((size_t)opt->n_owners, sizeof *parts);
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_string(prefix));
    mpr_err_t e = results && parts ? call_owners(opt, EXPORT_FN, args, "state_export", NULL, results)
                                   : mpr_error_set(MPR_ERR_NOMEM, "DistributedOptimizer state_export: out of memory");
    for (int k = 0; !e && k < opt->n_owners; k++) { /* decode every part before merging any */
        const void *buf;
        size_t len;
        if (!(e = mpr_value_get_bytes(results[k], &buf, &len)) &&
            !(parts[k] = mpr_safetensors_decode(buf, len, "optimizer state")))
            e = mpr_last_error_code();
    }
    for (int k = 0; !e && k < opt->n_owners; k++) e = merge_part(d, parts[k], parts[0]);
    for (int k = 0; k < opt->n_owners; k++) {
        if (results) mpr_value_release(results[k]);
        if (parts) mpr_tensor_dict_destroy(parts[k]);
    }
    free(results);
    free(parts);
    mpr_value_release(args);
    return e;
}

/* The entries of `d` an import reads: "<prefix>state.*" and the metadata
 * (a checkpoint may hold a model's parameters too; they stay here). */
static mpr_tensor_dict_t *state_entries(const mpr_tensor_dict_t *d, const char *prefix) {
    mpr_tensor_dict_t *s = mpr_tensor_dict_create();
    size_t plen = strlen(prefix);
    mpr_err_t e = s ? MPR_OK : mpr_last_error_code();
    for (size_t j = 0; !e && j < mpr_tensor_dict_count(d); j++) {
        const char *name = mpr_tensor_dict_name(d, j);
        if (strncmp(name, prefix, plen) == 0 && strncmp(name + plen, "state.", 6) == 0)
            e = mpr_tensor_dict_set(s, name, mpr_tensor_dict_tensor(d, j));
    }
    for (size_t m = 0; !e && m < mpr_tensor_dict_meta_count(d); m++)
        e = mpr_tensor_dict_set_meta(s, mpr_tensor_dict_meta_key(d, m), mpr_tensor_dict_meta_value(d, m));
    if (e) {
        mpr_tensor_dict_destroy(s);
        return NULL;
    }
    return s;
}

mpr_err_t mpr_dist_optimizer_state_import(mpr_dist_optimizer_t *opt, const mpr_tensor_dict_t *d, const char *prefix) {
    MPRI_ARG_NONNULL(opt);
    MPRI_ARG_NONNULL(d);
    if (!prefix) prefix = "";
    static _Atomic int64_t next_import = 1;
    mpr_worker_info_t self;
    mpr_err_t e = mpr_get_self_worker_info(&self);
    if (e) return e;
    /* Unique across the job: this worker's rank, then a per-process count. */
    int64_t id = ((int64_t)self.rank << 40) | (next_import++ & (((int64_t)1 << 40) - 1));
    if (id == 0) id = (int64_t)1 << 40;
    mpr_tensor_dict_t *s = state_entries(d, prefix);
    void *buf = NULL;
    size_t len = 0;
    e = s ? mpr_safetensors_encode(s, &buf, &len) : mpr_last_error_code();
    mpr_tensor_dict_destroy(s);
    mpr_value_t *args = e ? NULL
                          : mpr_value_list_of(3, mpr_value_new_int(id), mpr_value_new_string(prefix),
                                              mpr_value_new_bytes(buf, len));
    free(buf);
    if (e) return e;
    bool *prepared = calloc((size_t)opt->n_owners, sizeof *prepared);
    if (!prepared) {
        mpr_value_release(args);
        return mpr_error_set(MPR_ERR_NOMEM, "DistributedOptimizer state_import: out of memory");
    }
    e = call_owners(opt, PREPARE_FN, args, "state_import", prepared, NULL);
    mpr_value_release(args);
    args = mpr_value_list_of(1, mpr_value_new_int(id));
    if (!e) {
        e = call_owners(opt, COMMIT_FN, args, "state_import (commit)", NULL, NULL);
    } else {
        char saved[512]; /* the prepare failure is what the caller needs to see */
        snprintf(saved, sizeof saved, "%s", mpr_last_error());
        (void)call_owners(opt, ABORT_FN, args, "state_import (abort)", NULL, NULL);
        mpr_error_set(e, "%s", saved);
    }
    mpr_value_release(args);
    free(prepared);
    return e;
}

mpr_err_t mpr_dist_optimizer_state_save(mpr_dist_optimizer_t *opt, const char *path) {
    MPRI_ARG_NONNULL(opt);
    MPRI_ARG_NONNULL(path);
    mpr_tensor_dict_t *d = mpr_tensor_dict_create();
    if (!d) return mpr_last_error_code();
    mpr_err_t e = mpr_dist_optimizer_state_export(opt, d, NULL);
    if (!e) e = mpri_safetensors_save_atomic(d, path, "dist_optimizer_state_save");
    mpr_tensor_dict_destroy(d);
    return e;
}

mpr_err_t mpr_dist_optimizer_state_load(mpr_dist_optimizer_t *opt, const char *path) {
    MPRI_ARG_NONNULL(opt);
    MPRI_ARG_NONNULL(path);
    mpr_tensor_dict_t *d = mpr_safetensors_load(path);
    if (!d) return mpr_last_error_code();
    mpr_err_t e = mpr_dist_optimizer_state_import(opt, d, NULL);
    mpr_tensor_dict_destroy(d);
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
