/* test_rt_error.c — the thread's error kept aside and put back
 * (mpri_error_save/_restore): cleanup that sets errors of its own (an RRef
 * fork undone after a failed decode) leaves the caller's failure as it was,
 * a remote failure with its origin included. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "mpri_error.h"

static void test_plain_error_restored(void **state) {
    mpr_error_set(MPR_ERR_DECODE, "bool value %d", 2);
    mpri_error_saved_t saved;
    mpri_error_save(&saved);
    mpr_error_set(MPR_ERR_NOMEM, "cleanup: out of memory");
    mpri_error_restore(&saved);
    assert_int_equal(mpr_last_error_code(), MPR_ERR_DECODE);
    assert_string_equal(mpr_last_error(), "bool value 2");
    assert_null(mpri_last_remote_error());
}

static void test_remote_error_restored(void **state) {
    mpri_remote_error_t re;
    mpri_remote_error_init(&re, "worker2", 2, "g", MPR_ERR_NOT_FOUND, "no such key");
    mpri_error_set_remote(&re);
    char text[MPR_ERROR_TEXT_MAX];
    snprintf(text, sizeof text, "%s", mpr_last_error());
    mpri_error_saved_t saved;
    mpri_error_save(&saved);
    mpr_error_set(MPR_ERR_MPI, "cleanup: send failed");
    assert_null(mpri_last_remote_error());
    mpri_error_restore(&saved);
    assert_int_equal(mpr_last_error_code(), MPR_ERR_REMOTE);
    assert_string_equal(mpr_last_error(), text);
    assert_int_equal(mpr_last_error_remote_code(), MPR_ERR_NOT_FOUND);
    assert_int_equal(mpr_last_error_origin(), 2);
}

static void test_no_error_restored(void **state) {
    mpr_error_clear();
    mpri_error_saved_t saved;
    mpri_error_save(&saved);
    mpr_error_set(MPR_ERR_MPI, "cleanup: send failed");
    mpri_error_restore(&saved);
    assert_int_equal(mpr_last_error_code(), MPR_OK);
    assert_string_equal(mpr_last_error(), "");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_error_restored),
        cmocka_unit_test(test_remote_error_restored),
        cmocka_unit_test(test_no_error_restored),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
