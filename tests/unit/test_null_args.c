/* test_null_args.c — every public function called with NULL in each pointer
 * argument, from a table generated out of the public headers at build time
 * (tests/tools/gen_null_args.py writes null_cases.inc), so a function added
 * to a header is tested without anyone remembering to.
 *
 * The contract (runtime/mpri_args.h): MPR_ERR_INVALID_ARG with a detail
 * naming the function and the argument; pointer results NULL with that
 * error; other results their documented default with that error; releases
 * and destroys a no-op; outputs given are cleared. Cases run twice over:
 * every pointer NULL before mpr_init (nothing may need the runtime to reject
 * NULL, and nothing may crash), then each pointer NULL in turn with valid
 * fixtures in the others while the runtime runs (single rank). All failures
 * are listed before the test fails. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mpirpc/mpirpc.h"

typedef struct {
    const char *fn, *null_args;
    int failures;
} fx_case_t;

enum { FX_UNINIT, FX_RUNNING };

typedef struct {
    void (*run)(fx_case_t *c);
    const char *fn, *null_args;
    int phase;
    bool strict; /* held to the contract (else: only must not crash) */
} fx_table_entry_t;

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
    mpr_init_options_t opts;
    mpr_debug_info_t dbg;
} fx;

static char fx_sentinel_byte;
#define FX_SENTINEL(type) ((type)(void *)&fx_sentinel_byte)
#define FX_IS_SENTINEL(p) ((const void *)(p) == (const void *)&fx_sentinel_byte)
#define FX_STALE_WORKER ((mpr_worker_info_t){"stale", 5})

/* NULL through a call the compiler cannot see into, so no -Wnonnull. */
__attribute__((noinline)) static void *fx_null_ptr(void) {
    static void *volatile null_value = NULL;
    return null_value;
}
#define FX_NULL(type) ((type)fx_null_ptr())

static mpr_err_t fx_fn(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    *result = NULL;
    return MPR_OK;
}
static mpr_err_t fx_async_fn(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_future_t **result) {
    *result = mpr_future_create();
    return MPR_OK;
}
static mpr_err_t fx_then(mpr_future_t *parent, void *user_data, mpr_value_t **result) {
    *result = NULL;
    return MPR_OK;
}
static void fx_dtor(void *p) { (void)p; }
static mpr_tensor_t *fx_forward(mpr_module_t *self, mpr_tensor_t *x, void *ctx) {
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
    fx.it = mpr_batch_iter_create(fx.t, NULL, 1, false, false, 1);
    fx.d = mpr_tensor_dict_create();
    fx.gen = mpr_generator_create(1);
    static const mpr_type_t *type;
    if (!type) assert_int_equal(mpr_register_type("null_args_type", fx_dtor, &type), MPR_OK);
    fx.type = type;
    if (running) fx.r = mpr_rref_create_local(fx.v);
    assert_non_null(fx.t);
    assert_non_null(fx.v);
    assert_non_null(fx.f);
    assert_non_null(fx.m);
    assert_non_null(fx.opt);
    assert_non_null(fx.it);
    assert_non_null(fx.d);
    assert_non_null(fx.gen);
    if (running) assert_non_null(fx.r);
}

static void fx_teardown(void) {
    mpr_rref_release(fx.r);
    mpr_generator_destroy(fx.gen);
    mpr_tensor_dict_destroy(fx.d);
    mpr_batch_iter_destroy(fx.it);
    mpr_optimizer_destroy(fx.opt);
    mpr_module_destroy(fx.m);
    mpr_future_release(fx.f);
    mpr_value_release(fx.v);
    mpr_tensor_release(fx.tarr[1]);
    mpr_tensor_release(fx.tarr[0]);
    mpr_tensor_release(fx.t);
}

static void fx_before_call(void) { mpr_error_clear(); }

static void fx_fail(fx_case_t *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL %s(NULL %s): ", c->fn, c->null_args);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " [last error %s: '%s']\n", mpr_error_name(mpr_last_error_code()), mpr_last_error());
    va_end(ap);
    c->failures++;
}

static void fx_expect(fx_case_t *c, bool ok, const char *what) {
    if (!ok) fx_fail(c, "%s", what);
}

/* The recorded detail names the function and (when one argument is NULL) it. */
static void fx_expect_message(fx_case_t *c, const char *message, const char *fn, const char *arg) {
    char quoted[128];
    snprintf(quoted, sizeof quoted, "'%s'", arg);
    if (!strstr(message, fn)) fx_fail(c, "the message '%s' does not name the function", message);
    else if (arg[0] && !strstr(message, quoted))
        fx_fail(c, "the message '%s' does not name the argument %s", message, quoted);
}

static void fx_expect_error_set(fx_case_t *c, const char *fn, const char *arg) {
    if (mpr_last_error_code() != MPR_ERR_INVALID_ARG) {
        fx_fail(c, "MPR_ERR_INVALID_ARG was not recorded");
        return;
    }
    fx_expect_message(c, mpr_last_error(), fn, arg);
}

static void fx_expect_err(fx_case_t *c, mpr_err_t rc, const char *fn, const char *arg) {
    if (rc != MPR_ERR_INVALID_ARG) {
        fx_fail(c, "returned %s, expected MPR_ERR_INVALID_ARG", mpr_error_name(rc));
        return;
    }
    fx_expect_error_set(c, fn, arg);
}

static void fx_expect_null(fx_case_t *c, bool returned_non_null, const char *fn, const char *arg) {
    if (returned_non_null) {
        fx_fail(c, "returned non-NULL");
        return;
    }
    fx_expect_error_set(c, fn, arg);
}

static void fx_expect_failed_future(fx_case_t *c, mpr_future_t *f, const char *fn, const char *arg) {
    if (!f) {
        fx_fail(c, "returned no future");
        return;
    }
    if (!mpr_future_done(f) || mpr_future_error(f) != MPR_ERR_INVALID_ARG) {
        fx_fail(c, "the future is not failed with MPR_ERR_INVALID_ARG");
        return;
    }
    fx_expect_message(c, mpr_future_error_message(f), fn, arg);
}

static void fx_expect_noop(fx_case_t *c) {
    if (mpr_last_error_code() != MPR_OK) fx_fail(c, "releasing NULL recorded an error");
}

#include "null_cases.inc"

static int run_phase(int phase) {
    int failures = 0, ran = 0;
    for (size_t i = 0; i < NULL_CASE_COUNT; i++) {
        const fx_table_entry_t *e = &null_cases[i];
        if (e->phase != phase) continue;
        fx_case_t c = {e->fn, e->null_args, 0};
        if (getenv("MPIRPC_NULL_ARGS_TRACE")) fprintf(stderr, "case %zu: %s(NULL %s)\n", i, e->fn, e->null_args);
        if (phase == FX_RUNNING) fx_setup(true);
        e->run(&c);
        if (phase == FX_RUNNING) fx_teardown();
        failures += c.failures;
        ran++;
    }
    printf("%d NULL-argument cases (%s), %d failures\n", ran, phase == FX_UNINIT ? "before mpr_init" : "runtime running",
           failures);
    return failures;
}

static void test_null_args_before_init(void **state) {
    assert_false(mpr_is_running());
    assert_int_equal(run_phase(FX_UNINIT), 0);
}

static void test_null_args_while_running(void **state) {
    assert_int_equal(mpr_init(NULL), MPR_OK);
    int failures = run_phase(FX_RUNNING);
    assert_int_equal(mpr_shutdown(true), MPR_OK);
    assert_int_equal(failures, 0);
}

/* The table is the header set: every function with a pointer parameter is in it. */
static void test_table_covers_the_headers(void **state) {
    printf("%d public functions, %d cases\n", NULL_FUNCTION_COUNT, NULL_CASE_COUNT);
    assert_true(NULL_FUNCTION_COUNT > 250);
    assert_true(NULL_CASE_COUNT > 400);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_covers_the_headers),
        cmocka_unit_test(test_null_args_before_init),
        cmocka_unit_test(test_null_args_while_running),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
