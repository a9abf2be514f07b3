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

#include "api_fixtures.h"

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
