/* test_rt_registry.c — the function registry: names are checked and unique,
 * a name whose 64-bit wire id equals a registered one is refused with both
 * names, and lookups for calls need the exact name, so a caller's colliding
 * name can never run the other function. The colliding pair was found by a
 * cycle search over FNV-1a 64 (names "f" + 16 hex digits). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "mpirpc/rpc.h"
#include "mpri_registry.h"
#include "mpri_wire.h"

static const char *const NAME_A = "fe8b35413ef19461e";
static const char *const NAME_B = "ff29a81dc8450be11";

static mpr_err_t fn_noop(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx, (void)args, (void)result;
    return MPR_OK;
}

static int clear_registry(void **state) {
    (void)state;
    mpr_registry_clear();
    return 0;
}

static void test_pair_collides(void **state) {
    (void)state;
    assert_string_not_equal(NAME_A, NAME_B);
    assert_true(mpri_hash_name(NAME_A) == mpri_hash_name(NAME_B));
    assert_true(mpri_hash_name(NAME_A) != mpri_hash_name("fe8b35413ef19461f"));
}

static void test_colliding_registration_refused(void **state) {
    (void)state;
    assert_int_equal(mpr_register_function(NAME_A, fn_noop, NULL), MPR_OK);
    assert_int_equal(mpr_register_function(NAME_B, fn_noop, NULL), MPR_ERR_EXISTS);
    assert_non_null(strstr(mpr_last_error(), NAME_A));
    assert_non_null(strstr(mpr_last_error(), NAME_B));
    assert_non_null(strstr(mpr_last_error(), "same 64-bit id"));
    assert_int_equal(mpr_register_async_function(NAME_B, NULL, NULL), MPR_ERR_INVALID_ARG);
    /* The first registration is untouched. */
    const mpri_function_t *f = mpri_registry_find(mpri_hash_name(NAME_A));
    assert_non_null(f);
    assert_string_equal(f->name, NAME_A);
}

static void test_calls_resolve_by_name(void **state) {
    (void)state;
    assert_int_equal(mpr_register_function(NAME_A, fn_noop, NULL), MPR_OK);
    uint64_t id = mpri_hash_name(NAME_A);
    assert_non_null(mpri_registry_find_named(id, NAME_A));
    assert_null(mpri_registry_find_named(id, NAME_B)); /* same id, other name: unknown */
    assert_null(mpri_registry_find_named(mpri_hash_name("other"), "other"));
}

static void test_names_checked(void **state) {
    (void)state;
    char long_name[MPRI_MAX_FUNCTION_NAME + 2];
    memset(long_name, 'x', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    assert_int_equal(mpr_register_function(long_name, fn_noop, NULL), MPR_ERR_INVALID_ARG);
    long_name[MPRI_MAX_FUNCTION_NAME] = '\0';
    assert_int_equal(mpr_register_function(long_name, fn_noop, NULL), MPR_OK);
    assert_int_equal(mpr_register_function("", fn_noop, NULL), MPR_ERR_INVALID_ARG);
    assert_int_equal(mpr_register_function(NULL, fn_noop, NULL), MPR_ERR_INVALID_ARG);
    assert_int_equal(mpr_register_function("f", NULL, NULL), MPR_ERR_INVALID_ARG);
    assert_int_equal(mpr_register_function("f", fn_noop, NULL), MPR_OK);
    assert_int_equal(mpr_register_function("f", fn_noop, NULL), MPR_ERR_EXISTS);
    assert_non_null(strstr(mpr_last_error(), "already registered"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pair_collides),
        cmocka_unit_test_teardown(test_colliding_registration_refused, clear_registry),
        cmocka_unit_test_teardown(test_calls_resolve_by_name, clear_registry),
        cmocka_unit_test_teardown(test_names_checked, clear_registry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
