/* apps/insitu_heat/shared.c — the surrogate learner 0 shares (see shared.h). */
#include "shared.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "app.h"

static struct {
    pthread_mutex_t lock;
    bool hosted;                          /* CREATED */
    surrogate_t model;
    mpr_generator_t *gen;
    double scale;                         /* SCALED when > 0 */
    mpr_rref_t *params[SURROGATE_PARAMS]; /* created on the first SHARED_PARAMS_FN */
} sh = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* [] -> [RRef, ...] */
static mpr_err_t params_fn(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx, (void)args;
    mpr_err_t e = MPR_OK;
    pthread_mutex_lock(&sh.lock);
    if (!sh.hosted) e = mpr_error_set(MPR_ERR_STATE, "this worker does not hold the shared surrogate");
    if (!e && !sh.params[0]) {
        mpr_tensor_t *p[SURROGATE_PARAMS];
        surrogate_parameters(&sh.model, p);
        for (int i = 0; i < SURROGATE_PARAMS && !e; i++) {
            mpr_value_t *v = mpr_value_new_tensor(p[i]);
            if (!v || !(sh.params[i] = mpr_rref_create_local(v))) e = mpr_last_error_code();
            mpr_value_release(v);
        }
    }
    mpr_value_t *list = e ? NULL : mpr_value_new_list();
    for (int i = 0; list && i < SURROGATE_PARAMS; i++)
        if (mpr_value_list_append(list, mpr_value_new_rref(sh.params[i]))) {
            mpr_value_release(list);
            list = NULL;
        }
    if (!e && !list) e = mpr_last_error_code();
    pthread_mutex_unlock(&sh.lock);
    *result = list;
    return e;
}

/* [x, y, stride] -> double */
static mpr_err_t scale_fn(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    mpr_tensor_t *x, *y;
    int stride = 1;
    mpr_err_t e = mpr_args_unpack(args, "tti", &x, &y, &stride);
    if (!e && (stride < 1 || stride > 1 << 16))
        e = mpr_error_set(MPR_ERR_INVALID_ARG, "shared scale: stride %d out of range", stride);
    if (e) return e;
    pthread_mutex_lock(&sh.lock);
    if (!sh.hosted) e = mpr_error_set(MPR_ERR_STATE, "this worker does not hold the shared surrogate");
    if (!e && sh.scale == 0) {
        bool prev = mpr_set_grad_enabled(false);
        e = surrogate_set_scales(&sh.model, x, y, stride, &sh.scale);
        mpr_set_grad_enabled(prev);
        if (e) sh.scale = 0;
    }
    double s = sh.scale;
    pthread_mutex_unlock(&sh.lock);
    if (!e && !(*result = mpr_value_new_double(s))) e = mpr_last_error_code();
    return e;
}

/* [x] -> prediction; runs in the caller's dist-autograd context */
static mpr_err_t forward_fn(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    mpr_tensor_t *x;
    mpr_err_t e = mpr_args_unpack(args, "t", &x);
    if (e) return e;
    pthread_mutex_lock(&sh.lock);
    bool ready = sh.hosted && sh.scale > 0; /* inv_scale is not changed once set */
    pthread_mutex_unlock(&sh.lock);
    if (!ready) return mpr_error_set(MPR_ERR_STATE, "the shared surrogate has no scales yet (call %s first)", SHARED_SCALE_FN);
    mpr_scope_begin();
    mpr_tensor_t *pred = surrogate_forward(&sh.model, x, 1, true);
    if (!pred || !(*result = mpr_value_new_tensor(pred))) e = mpr_last_error_code();
    mpr_scope_end();
    return e;
}

mpr_err_t shared_register(void) {
    mpr_err_t e = mpr_register_function(SHARED_PARAMS_FN, params_fn, NULL);
    if (!e) e = mpr_register_function(SHARED_SCALE_FN, scale_fn, NULL);
    if (!e) e = mpr_register_function(SHARED_FORWARD_FN, forward_fn, NULL);
    return e;
}

mpr_err_t shared_host(int channels, uint64_t seed) {
    if (!(sh.gen = mpr_generator_create(seed))) return mpr_last_error_code();
    mpr_err_t e = surrogate_init(&sh.model, channels, sh.gen);
    sh.hosted = !e;
    return e;
}

surrogate_t *shared_model(void) { return sh.hosted ? &sh.model : NULL; }

void shared_cleanup(void) {
    for (int i = 0; i < SURROGATE_PARAMS; i++) {
        mpr_rref_release(sh.params[i]);
        sh.params[i] = NULL;
    }
    if (sh.hosted) surrogate_destroy(&sh.model);
    sh.hosted = false;
    mpr_generator_destroy(sh.gen);
    sh.gen = NULL;
}

mpr_err_t shared_restore(const mpr_tensor_dict_t *d) {
    mpr_err_t e = MPR_OK;
    pthread_mutex_lock(&sh.lock);
    if (!sh.hosted) e = mpr_error_set(MPR_ERR_STATE, "this worker does not hold the shared surrogate");
    for (int k = 0; k < SURROGATE_MODULES && !e; k++)
        e = app_dict_copy_into_module(d, surrogate_module_prefix[k], surrogate_module(&sh.model, k));
    const char *scale = mpr_tensor_dict_get_meta(d, "learner.scale");
    mpr_tensor_t *inv = mpr_tensor_dict_get(d, "learner.inv_scale");
    double s = scale ? strtod(scale, NULL) : 0;
    if (!e && (!scale || (s > 0) != (inv != NULL)))
        e = mpr_error_set(MPR_ERR_INVALID_ARG, "learner checkpoint: the target scale and the moment scales disagree");
    if (!e && inv) {
        mpr_tensor_release(sh.model.inv_scale);
        sh.model.inv_scale = mpr_tensor_retain(inv);
        sh.scale = s;
    }
    pthread_mutex_unlock(&sh.lock);
    return e;
}

mpr_dist_optimizer_t *shared_optimizer(double lr) {
    mpr_value_t *list = NULL;
    if (mpr_call_sync(mpr_to_name(SHARED_OWNER), SHARED_PARAMS_FN, MPR_TIMEOUT_DEFAULT, &list, "")) return NULL;
    mpr_rref_t *p[SURROGATE_PARAMS];
    int n = 0;
    for (; n < SURROGATE_PARAMS && n < (int)mpr_value_list_len(list); n++)
        if (mpr_value_get_rref(mpr_value_list_get(list, (size_t)n), &p[n])) break;
    mpr_dist_optimizer_t *opt = NULL;
    if (n != SURROGATE_PARAMS) {
        mpr_error_set(MPR_ERR_STATE, "%s returned %d parameters, expected %d", SHARED_PARAMS_FN, n, SURROGATE_PARAMS);
    } else {
        mpr_optim_options_t o;
        mpr_optim_options_default("adam", &o);
        o.lr = lr;
        opt = mpr_dist_optimizer_create("adam", &o, p, n);
    }
    mpr_value_release(list);
    return opt;
}

mpr_err_t shared_scale(mpr_tensor_t *x, mpr_tensor_t *y, int stride, double *scale) {
    mpr_value_t *v = NULL;
    mpr_err_t e = mpr_call_sync(mpr_to_name(SHARED_OWNER), SHARED_SCALE_FN, MPR_TIMEOUT_DEFAULT, &v, "tti", x, y, stride);
    if (!e) e = mpr_value_get_double(v, scale);
    mpr_value_release(v);
    return e;
}

mpr_tensor_t *shared_forward(mpr_tensor_t *x) {
    mpr_value_t *v = NULL;
    mpr_tensor_t *t = NULL;
    if (mpr_call_sync(mpr_to_name(SHARED_OWNER), SHARED_FORWARD_FN, MPR_TIMEOUT_DEFAULT, &v, "t", x)) return NULL;
    if (!mpr_value_get_tensor(v, &t)) t = mpr_scope_adopt(mpr_tensor_retain(t));
    mpr_value_release(v);
    return t;
}
