/* api_fixtures.h — valid objects for every argument type of the public
 * headers (`fx`), shared by the tests generated from them: test_null_args.c
 * (NULL in each pointer argument) and test_oom_paths.c (allocation failures).
 * fx_setup() makes them (cmocka asserts), fx_teardown() releases them. */
#ifndef API_FIXTURES_H
#define API_FIXTURES_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "mpirpc/mpirpc.h"

/* Fixtures: valid objects for every argument type the headers use. */
static struct {
    mpr_tensor_t *t, *tarr[2];
    mpr_value_t *v;
    mpr_future_t *f, *farr[1];
    mpr_rref_t *r;
    mpr_module_t *m;
    mpr_optimizer_t *opt;
    mpr_batch_iter_t *it;
    mpr_tensor_dict_t *d;
    mpr_generator_t *gen;
    const mpr_type_t *type;
    const char *str;
    const char *names[2];
    int dims[2];
    int64_t shape[2];
    char buf[4096];
    mpr_worker_info_t w;
    mpr_sgd_options_t sgd;
    mpr_optim_options_t optim;
    mpr_lr_scheduler_t *sched;
    mpr_init_options_t opts;
    mpr_debug_info_t dbg;
    mpr_rref_t *rarr[1];
    mpr_dist_optimizer_t *dopt;
    mpr_remote_module_t *rm;
} fx;

static char fx_sentinel_byte;
#define FX_SENTINEL(type) ((type)(void *)&fx_sentinel_byte)
#define FX_IS_SENTINEL(p) ((const void *)(p) == (const void *)&fx_sentinel_byte)
#define FX_STALE_WORKER ((mpr_worker_info_t){"stale", 5})

/* NULL through a call the compiler cannot see into, so no -Wnonnull. */
__attribute__((noinline, unused)) static void *fx_null_ptr(void) {
    static void *volatile null_value = NULL;
    return null_value;
}
#define FX_NULL(type) ((type)fx_null_ptr())

__attribute__((unused)) static mpr_err_t fx_fn(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    *result = NULL;
    return MPR_OK;
}
__attribute__((unused)) static mpr_err_t fx_async_fn(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_future_t **result) {
    *result = mpr_future_create();
    return MPR_OK;
}
__attribute__((unused)) static mpr_err_t fx_then(mpr_future_t *parent, void *user_data, mpr_value_t **result) {
    *result = NULL;
    return MPR_OK;
}
__attribute__((unused)) static void fx_dtor(void *p) { (void)p; }
__attribute__((unused)) static mpr_module_t *fx_ctor(const mpr_value_t *args, int device, void *user_data) {
    (void)args;
    (void)device;
    (void)user_data;
    return mpr_relu_create();
}
__attribute__((unused)) static mpr_tensor_t *fx_forward(mpr_module_t *self, mpr_tensor_t *x, void *ctx) {
    return mpr_scope_adopt(mpr_tensor_retain(x));
}

static void fx_setup(bool running) {
    memset(&fx, 0, sizeof fx);
    fx.str = "/nonexistent-mpirpc-null-args/x"; /* a path nothing can write */
    fx.names[0] = "a";
    fx.names[1] = "b";
    fx.dims[0] = 0;
    fx.dims[1] = 1;
    fx.shape[0] = 2;
    fx.shape[1] = 3;
    snprintf(fx.w.name, sizeof fx.w.name, "worker0");
    fx.sgd.lr = 0.1;
    mpr_init_options_default(&fx.opts);
    fx.t = mpr_zeros(MPR_F32, 2, fx.shape);
    fx.tarr[0] = mpr_zeros(MPR_F32, 2, fx.shape);
    fx.tarr[1] = mpr_zeros(MPR_F32, 2, fx.shape);
    fx.v = mpr_value_list_of(1, mpr_value_new_int(1));
    fx.f = mpr_future_create();
    fx.farr[0] = fx.f;
    fx.m = mpr_linear_create(3, 2, true, MPR_F32, NULL);
    fx.opt = mpr_sgd_create(fx.tarr, 2, &fx.sgd);
    mpr_optim_options_default("adam", &fx.optim);
    fx.sched = fx.opt ? mpr_lr_step_create(fx.opt, 2, 0.5) : NULL;
    fx.it = mpr_batch_iter_create(fx.t, NULL, 1, false, false, 1);
    fx.d = mpr_tensor_dict_create();
    fx.gen = mpr_generator_create(1);
    static const mpr_type_t *type;
    if (!type) assert_int_equal(mpr_register_type("null_args_type", fx_dtor, &type), MPR_OK);
    fx.type = type;
    if (running) fx.r = mpr_rref_create_local(fx.v);
    fx.rarr[0] = fx.r;
    if (running) fx.dopt = mpr_dist_optimizer_create("sgd", &fx.optim, fx.rarr, 1);
    if (running) fx.rm = mpr_remote_module_create("worker0/cpu", "null_args_kind", NULL);
    assert_non_null(fx.t);
    assert_non_null(fx.v);
    assert_non_null(fx.f);
    assert_non_null(fx.m);
    assert_non_null(fx.opt);
    assert_non_null(fx.sched);
    assert_non_null(fx.it);
    assert_non_null(fx.d);
    assert_non_null(fx.gen);
    if (running) assert_non_null(fx.r);
    if (running) assert_non_null(fx.dopt);
    if (running) assert_non_null(fx.rm);
}

static void fx_teardown(void) {
    mpr_remote_module_destroy(fx.rm);
    mpr_dist_optimizer_destroy(fx.dopt);
    mpr_rref_release(fx.r);
    mpr_generator_destroy(fx.gen);
    mpr_tensor_dict_destroy(fx.d);
    mpr_batch_iter_destroy(fx.it);
    mpr_lr_scheduler_destroy(fx.sched);
    mpr_optimizer_destroy(fx.opt);
    mpr_module_destroy(fx.m);
    mpr_future_release(fx.f);
    mpr_value_release(fx.v);
    mpr_tensor_release(fx.tarr[1]);
    mpr_tensor_release(fx.tarr[0]);
    mpr_tensor_release(fx.t);
}

#endif
