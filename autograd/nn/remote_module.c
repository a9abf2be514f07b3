/* remote_module.c — RemoteModule (mpirpc/remote_module.h): module kinds
 * registered by name, modules built on their owner and kept in an
 * OwnerRRef, forward / parameters / train as proxy calls on that RRef.
 *
 * PROTOCOL (caller's handle -> owner's object):
 *   create: parse "<worker>/<device>", then mpr_remote(owner, CREATE_FN,
 *     [kind, device]) + args...: the owner looks the kind up, runs its
 *     constructor on the device and keeps the module as an object value of
 *     type "mpirpc.RemoteModule" (or the error, shown at first use).
 *   forward(x): the proxy call FORWARD_FN(rref, x) inside the caller's dist
 *     autograd context: on the owner, x -> device, module forward,
 *     output -> CPU (all recorded: the gradient comes back through the
 *     call's send/recv functions).
 *   remote_parameters: PARAMS_FN(rref) -> a list of RRefs, one per
 *     parameter, made on the owner from the module's own tensors (so the
 *     gradients a context holds for them are found by a
 *     DistributedOptimizer there).
 *   train(b): TRAIN_FN(rref, b).
 *   destroy: release the RRef; the owner frees the module with its last
 *     user (the RRef protocol).
 *
 * Invariants: a handle holds one reference to the module's RRef and the
 * device it was made for; the kind table only grows and is read under its
 * lock; a module object is used only on its owner. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpirpc/cuda.h"
#include "mpirpc/remote_module.h"
#include "mpirpc/rpc.h"
#include "mpri_args.h"
#include "mpri_nn.h" /* mpri_remote_module_install */

#define CREATE_FN "mpirpc.remote_module.create"
#define FORWARD_FN "mpirpc.remote_module.forward"
#define PARAMS_FN "mpirpc.remote_module.parameters"
#define TRAIN_FN "mpirpc.remote_module.train"
#define TYPE_NAME "mpirpc.RemoteModule"
#define MAX_KIND 127

/* ---- module kinds ---- */

typedef struct {
    char name[MAX_KIND + 1];
    mpr_module_ctor_t ctor;
    void *user_data;
} kind_t;

static pthread_mutex_t kinds_lock = PTHREAD_MUTEX_INITIALIZER;
static kind_t *kinds;
static int nkinds, capkinds;

mpr_err_t mpr_register_module_kind(const char *kind, mpr_module_ctor_t ctor, void *user_data) {
    MPRI_ARG_NONNULL(kind);
    MPRI_ARG_NONNULL(ctor);
    if (!*kind || strlen(kind) > MAX_KIND)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_register_module_kind: a kind name has 1 to %d bytes",
                             MAX_KIND);
    mpr_err_t e = MPR_OK;
    pthread_mutex_lock(&kinds_lock);
    for (int i = 0; i < nkinds && !e; i++)
        if (strcmp(kinds[i].name, kind) == 0)
            e = mpr_error_set(MPR_ERR_EXISTS, "mpr_register_module_kind: '%s' is already registered", kind);
    if (!e && nkinds == capkinds) {
        int cap = capkinds ? capkinds * 2 : 8;
        kind_t *k = realloc(kinds, (size_t)cap * sizeof *k);
        if (!k)
            e = mpr_error_set(MPR_ERR_NOMEM, "mpr_register_module_kind: out of memory");
        else {
            kinds = k;
            capkinds = cap;
        }
    }
    if (!e) {
        kind_t *k = &kinds[nkinds++];
        snprintf(k->name, sizeof k->name, "%s", kind);
        k->ctor = ctor;
        k->user_data = user_data;
    }
    pthread_mutex_unlock(&kinds_lock);
    return e;
}

static bool find_kind(const char *name, kind_t *out) {
    bool found = false;
    pthread_mutex_lock(&kinds_lock);
    for (int i = 0; i < nkinds && !found; i++)
        if (strcmp(kinds[i].name, name) == 0) {
            *out = kinds[i];
            found = true;
        }
    pthread_mutex_unlock(&kinds_lock);
    return found;
}

/* ---- the owner's side ---- */

typedef struct {
    mpr_module_t *module;
    int device;
} owned_module_t;

static const mpr_type_t *module_type;

static void owned_destroy(void *obj) {
    owned_module_t *om = obj;
    mpr_module_destroy(om->module);
    free(om);
}

/* [kind, device, args] -> RemoteModule object */
static mpr_err_t create_fn(mpr_call_ctx_t *call, const mpr_value_t *args, mpr_value_t **result) {
    (void)call;
    const char *name;
    int64_t device;
    mpr_err_t e;
    if ((e = mpr_args_string(args, 0, &name)) || (e = mpr_args_int(args, 1, &device))) return e;
    kind_t k;
    if (!find_kind(name, &k))
        return mpr_error_set(MPR_ERR_NOT_FOUND, "RemoteModule: module kind '%s' is not registered here", name);
    const mpr_value_t *ctor_args = mpr_value_list_get(args, 2);
    if (mpr_value_kind(ctor_args) == MPR_VALUE_NONE) ctor_args = NULL;
    mpr_error_clear();
    mpr_module_t *m = k.ctor(ctor_args, (int)device, k.user_data);
    if (!m)
        return mpr_last_error_code() ? mpr_last_error_code()
                                     : mpr_error_set(MPR_ERR_STATE, "RemoteModule: the constructor of '%s' returned NULL",
                                                     name);
    owned_module_t *om = malloc(sizeof *om);
    if (!om) {
        mpr_module_destroy(m);
        return mpr_error_set(MPR_ERR_NOMEM, "RemoteModule: out of memory");
    }
    om->module = m;
    om->device = (int)device;
    if (!(*result = mpr_value_new_object(module_type, om))) {
        owned_destroy(om);
        return mpr_last_error_code();
    }
    return MPR_OK;
}

/* [rref, x] -> module(x on its device), back on the CPU */
static mpr_err_t forward_fn(mpr_call_ctx_t *call, const mpr_value_t *args, mpr_value_t **result) {
    (void)call;
    owned_module_t *om;
    mpr_tensor_t *x;
    mpr_err_t e;
    if ((e = mpr_rref_self(args, module_type, (void **)&om)) || (e = mpr_args_tensor(args, 1, &x))) return e;
    mpr_scope_begin();
    mpr_tensor_t *in = om->device >= 0 ? mpr_to_device(x, om->device) : x;
    mpr_tensor_t *y = in ? mpr_module_forward(om->module, in) : NULL;
    if (y && om->device >= 0) y = mpr_to_device(y, -1);
    if (y) *result = mpr_value_new_tensor(y);
    e = y ? (*result ? MPR_OK : mpr_last_error_code()) : mpr_last_error_code();
    mpr_scope_end();
    return e;
}

/* [rref] -> [RRef per parameter] */
static mpr_err_t params_fn(mpr_call_ctx_t *call, const mpr_value_t *args, mpr_value_t **result) {
    (void)call;
    owned_module_t *om;
    mpr_err_t e = mpr_rref_self(args, module_type, (void **)&om);
    if (e) return e;
    mpr_value_t *list = mpr_value_new_list();
    int n = mpr_module_num_parameters(om->module);
    for (int i = 0; list && i < n; i++) {
        mpr_value_t *v = mpr_value_new_tensor(mpr_module_parameter(om->module, i, NULL));
        mpr_rref_t *r = v ? mpr_rref_create_local(v) : NULL;
        mpr_value_release(v);
        if (!r || mpr_value_list_append(list, mpr_value_new_rref(r)) != MPR_OK) {
            mpr_value_release(list);
            list = NULL;
        }
        mpr_rref_release(r);
    }
    if (!list) return mpr_last_error_code() ? mpr_last_error_code() : MPR_ERR_NOMEM;
    *result = list;
    return MPR_OK;
}

/* [rref, training] -> none */
static mpr_err_t train_fn(mpr_call_ctx_t *call, const mpr_value_t *args, mpr_value_t **result) {
    (void)call;
    owned_module_t *om;
    bool training;
    mpr_err_t e;
    if ((e = mpr_rref_self(args, module_type, (void **)&om)) ||
        (e = mpr_value_get_bool(mpr_value_list_get(args, 1), &training)))
        return e;
    mpr_module_train(om->module, training);
    *result = mpr_value_new_none();
    return MPR_OK;
}

mpr_err_t mpri_remote_module_install(void) {
    mpr_err_t e = mpr_register_type(TYPE_NAME, owned_destroy, &module_type);
    if (!e) e = mpr_register_function(CREATE_FN, create_fn, NULL);
    if (!e) e = mpr_register_function(FORWARD_FN, forward_fn, NULL);
    if (!e) e = mpr_register_function(PARAMS_FN, params_fn, NULL);
    if (!e) e = mpr_register_function(TRAIN_FN, train_fn, NULL);
    return e;
}

/* ---- the caller's handle ---- */

struct mpr_remote_module {
    mpr_rref_t *rref;
    int device;
};

/* "<worker>/cpu" or "<worker>/cuda:<N>" */
static mpr_err_t parse_remote_device(const char *s, char *worker, size_t len, int *device) {
    const char *slash = strchr(s, '/');
    if (!slash || slash == s || (size_t)(slash - s) >= len)
        return mpr_error_set(MPR_ERR_INVALID_ARG,
                             "RemoteModule: bad remote device '%s' (expected \"<worker>/cpu\" or \"<worker>/cuda:<N>\")",
                             s);
    memcpy(worker, s, (size_t)(slash - s));
    worker[slash - s] = '\0';
    const char *dev = slash + 1;
    if (strcmp(dev, "cpu") == 0) {
        *device = -1;
        return MPR_OK;
    }
    char *end = NULL;
    long n = strncmp(dev, "cuda:", 5) == 0 ? strtol(dev + 5, &end, 10) : -1;
    if (n < 0 || n > 1024 || !end || end == dev + 5 || *end)
        return mpr_error_set(MPR_ERR_INVALID_ARG,
                             "RemoteModule: bad device '%s' in '%s' (expected \"cpu\" or \"cuda:<N>\")", dev, s);
    *device = (int)n;
    return MPR_OK;
}

mpr_remote_module_t *mpr_remote_module_create(const char *remote_device, const char *kind, const mpr_value_t *args) {
    MPRI_ARG_NONNULL_OR(remote_device, NULL);
    MPRI_ARG_NONNULL_OR(kind, NULL);
    char worker[MPR_MAX_NAME_LEN];
    int device = -1;
    mpr_worker_info_t w;
    if (parse_remote_device(remote_device, worker, sizeof worker, &device)) return NULL;
    if (mpr_get_worker_info(worker, &w)) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "RemoteModule: no worker named '%s' (in '%s')", worker, remote_device);
        return NULL;
    }
    mpr_remote_module_t *rm = malloc(sizeof *rm);
    mpr_value_t *call_args = rm ? mpr_value_list_of(3, mpr_value_new_string(kind), mpr_value_new_int(device),
                                                    args ? mpr_value_retain((mpr_value_t *)args) : mpr_value_new_none())
                                : NULL;
    if (!call_args) {
        free(rm);
        if (!mpr_last_error_code()) mpr_error_set(MPR_ERR_NOMEM, "RemoteModule: out of memory");
        return NULL;
    }
    rm->device = device;
    rm->rref = mpr_remote(mpr_to_worker(&w), CREATE_FN, call_args, MPR_TIMEOUT_DEFAULT);
    mpr_value_release(call_args);
    if (!rm->rref) {
        free(rm);
        return NULL;
    }
    return rm;
}

mpr_future_t *mpr_remote_module_forward_async(mpr_remote_module_t *rm, mpr_tensor_t *x) {
    mpr_value_t *args = rm && x ? mpr_value_list_of(1, mpr_value_new_tensor(x)) : NULL;
    if (!args) {
        mpr_future_t *f = mpr_future_create();
        if (f)
            mpr_future_set_error(f, MPR_ERR_INVALID_ARG,
                                 !rm ? "mpr_remote_module_forward_async: argument 'rm' is NULL"
                                     : !x ? "mpr_remote_module_forward_async: argument 'x' is NULL" : "out of memory");
        return f;
    }
    mpr_future_t *f = mpr_rref_rpc_async(rm->rref, FORWARD_FN, args, MPR_TIMEOUT_DEFAULT);
    mpr_value_release(args);
    return f;
}

mpr_err_t mpr_remote_module_forward(mpr_remote_module_t *rm, mpr_tensor_t *x, mpr_tensor_t **y) {
    if (y) *y = NULL;
    MPRI_ARG_NONNULL(rm);
    MPRI_ARG_NONNULL(x);
    MPRI_ARG_NONNULL(y);
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_tensor(x)), *r = NULL;
    if (!args) return mpr_last_error_code();
    mpr_err_t e = mpr_rref_rpc_sync(rm->rref, FORWARD_FN, args, MPR_TIMEOUT_DEFAULT, &r);
    mpr_value_release(args);
    mpr_tensor_t *t = NULL;
    if (!e && !(e = mpr_value_get_tensor(r, &t))) *y = mpr_tensor_retain(t);
    mpr_value_release(r);
    return e;
}

mpr_err_t mpr_remote_module_remote_parameters(mpr_remote_module_t *rm, mpr_rref_t ***params, int *n) {
    if (params) *params = NULL;
    if (n) *n = 0;
    MPRI_ARG_NONNULL(rm);
    MPRI_ARG_NONNULL(params);
    MPRI_ARG_NONNULL(n);
    mpr_value_t *r = NULL;
    mpr_err_t e = mpr_rref_rpc_sync(rm->rref, PARAMS_FN, NULL, MPR_TIMEOUT_DEFAULT, &r);
    int k = e ? 0 : (int)mpr_value_list_len(r);
    mpr_rref_t **out = e ? NULL : calloc((size_t)(k ? k : 1), sizeof *out);
    if (!e && !out) e = mpr_error_set(MPR_ERR_NOMEM, "mpr_remote_module_remote_parameters: out of memory");
    for (int i = 0; !e && i < k; i++) {
        mpr_rref_t *p;
        if (!(e = mpr_value_get_rref(mpr_value_list_get(r, (size_t)i), &p))) out[i] = mpr_rref_retain(p);
    }
    if (e) {
        for (int i = 0; out && i < k; i++) mpr_rref_release(out[i]);
        free(out);
    } else {
        *params = out;
        *n = k;
    }
    mpr_value_release(r);
    return e;
}

mpr_rref_t *mpr_remote_module_get_module_rref(const mpr_remote_module_t *rm) {
    MPRI_ARG_NONNULL_OR(rm, NULL);
    return rm->rref;
}

mpr_err_t mpr_remote_module_train(mpr_remote_module_t *rm, bool training) {
    MPRI_ARG_NONNULL(rm);
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_bool(training)), *r = NULL;
    if (!args) return mpr_last_error_code();
    mpr_err_t e = mpr_rref_rpc_sync(rm->rref, TRAIN_FN, args, MPR_TIMEOUT_DEFAULT, &r);
    mpr_value_release(args);
    mpr_value_release(r);
    return e;
}

mpr_value_t *mpr_value_new_remote_module(const mpr_remote_module_t *rm) {
    MPRI_ARG_NONNULL_OR(rm, NULL);
    return mpr_value_list_of(2, mpr_value_new_rref(rm->rref), mpr_value_new_int(rm->device));
}

mpr_remote_module_t *mpr_remote_module_from_value(const mpr_value_t *v) {
    MPRI_ARG_NONNULL_OR(v, NULL);
    mpr_rref_t *r;
    int64_t device;
    if (mpr_value_list_len(v) != 2 || mpr_value_get_rref(mpr_value_list_get(v, 0), &r) ||
        mpr_value_get_int(mpr_value_list_get(v, 1), &device)) {
        mpr_error_set(MPR_ERR_TYPE, "mpr_remote_module_from_value: not a RemoteModule value ([rref, device])");
        return NULL;
    }
    mpr_remote_module_t *rm = malloc(sizeof *rm);
    if (!rm) {
        mpr_error_set(MPR_ERR_NOMEM, "mpr_remote_module_from_value: out of memory");
        return NULL;
    }
    rm->rref = mpr_rref_retain(r);
    rm->device = (int)device;
    return rm;
}

void mpr_remote_module_destroy(mpr_remote_module_t *rm) {
    if (!rm) return;
    mpr_rref_release(rm->rref);
    free(rm);
}
