/* test_rt_misuse.c — misuse of values and tensors is reported, not silent:
 * use after release and double release of a value or a tensor, and releasing
 * a scope-owned tensor, abort with a message naming the object (death tests:
 * the misuse runs in a forked child; the parent checks the abnormal exit and
 * the message); failed getters clear their outputs; releasing a list nested
 * 1,000,000 deep does not recurse; mpr_value_list_append(l, NULL) and
 * mpr_sgd_create(NULL, 1) say what is wrong. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "mpirpc/mpirpc.h"

/* Run `fn` in a child with stderr captured; expect it to die by a signal
 * (abort) and to have printed `needle`. */
static void expect_death(void (*fn)(void), const char *needle) {
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(pipefd[1], 2);
        close(pipefd[0]);
        fn();
        _exit(0); /* survived: the parent reports it */
    }
    close(pipefd[1]);
    char out[4096];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof out - 1 && (r = read(pipefd[0], out + n, sizeof out - 1 - n)) > 0) n += (size_t)r;
    out[n] = '\0';
    close(pipefd[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFSIGNALED(status) || !strstr(out, needle)) {
        fprintf(stderr, "child status %d, expected death with '%s'; its stderr:\n%s\n", status, needle, out);
        fail();
    }
}

static void value_double_release(void) {
    mpr_value_t *v = mpr_value_new_int(7);
    mpr_value_release(v);
    mpr_value_release(v);
}

static void value_use_after_release(void) {
    mpr_value_t *v = mpr_value_new_string("gone");
    mpr_value_release(v);
    const char *s;
    mpr_value_get_string(v, &s);
}

static void tensor_double_release(void) {
    mpr_tensor_t *t = mpr_zeros(MPR_F32, MPR_SHAPE(2, 3));
    mpr_tensor_release(t);
    mpr_tensor_release(t);
}

static void tensor_use_after_release(void) {
    mpr_tensor_t *t = mpr_zeros(MPR_F64, MPR_SHAPE(4));
    mpr_tensor_release(t);
    (void)mpr_tensor_numel(t);
}

static void scope_owned_released_by_user(void) {
    mpr_scope_begin();
    mpr_tensor_t *t = mpr_ones(MPR_F32, MPR_SHAPE(5));
    mpr_tensor_release(t); /* the scope owns it */
    mpr_scope_end();
}

static void test_value_misuse_is_reported(void **state) {
    expect_death(value_double_release, "value");
    expect_death(value_double_release, "used after its last mpr_value_release");
    expect_death(value_use_after_release, "mpr_value_get_string: value");
}

static void test_tensor_misuse_is_reported(void **state) {
    expect_death(tensor_double_release, "mpr_tensor_release: tensor");
    expect_death(tensor_double_release, "(float32 [2, 3]) used after its last mpr_tensor_release");
    expect_death(tensor_use_after_release, "mpr_tensor_numel: tensor");
    expect_death(scope_owned_released_by_user, "(float32 [5]) is owned by an open scope");
}

static void test_scope_keep_then_release_is_fine(void **state) {
    int64_t live = mpr_tensor_live_count();
    mpr_scope_begin();
    mpr_tensor_t *t = mpr_scope_keep(mpr_ones(MPR_F32, MPR_SHAPE(5)));
    mpr_scope_end();
    assert_int_equal(mpr_tensor_numel(t), 5);
    mpr_tensor_release(t);
    mpr_scope_begin();
    mpr_tensor_t *u = mpr_ones(MPR_F32, MPR_SHAPE(2));
    mpr_scope_begin();
    mpr_tensor_t *e = mpr_scope_escape(mpr_add(u, u)); /* to the outer scope */
    mpr_scope_end();
    assert_int_equal(mpr_tensor_numel(e), 2);
    mpr_scope_end();
    assert_int_equal(mpr_tensor_live_count(), live);
}

static void test_failed_getters_clear_outputs(void **state) {
    mpr_value_t *s = mpr_value_new_string("x");
    int64_t i = 99;
    assert_int_equal(mpr_value_get_int(s, &i), MPR_ERR_TYPE);
    assert_int_equal(i, 0);
    mpr_tensor_t *t = (mpr_tensor_t *)0x1;
    assert_int_equal(mpr_value_get_tensor(s, &t), MPR_ERR_TYPE);
    assert_null(t);
    const void *data = s;
    size_t len = 5;
    mpr_value_t *n = mpr_value_new_int(1);
    assert_int_equal(mpr_value_get_bytes(n, &data, &len), MPR_ERR_TYPE);
    assert_null(data);
    assert_int_equal(len, 0);
    mpr_worker_info_t w = {"stale", 3};
    assert_int_equal(mpr_value_get_worker(n, &w), MPR_ERR_TYPE);
    assert_int_equal(w.rank, -1);
    assert_string_equal(w.name, "");
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_int(5));
    const char *str = "stale";
    assert_int_equal(mpr_args_string(args, 0, &str), MPR_ERR_TYPE);
    assert_null(str);
    double d = 3;
    assert_int_equal(mpr_args_double(args, 1, &d), MPR_ERR_INVALID_ARG);
    assert_true(d == 0);
    mpr_value_release(args);
    mpr_value_release(n);
    mpr_value_release(s);
}

static void test_deep_list_release_is_iterative(void **state) {
    enum { DEPTH = 1000000 };
    mpr_value_t *v = mpr_value_new_int(0);
    for (int i = 0; i < DEPTH; i++) {
        mpr_value_t *outer = mpr_value_new_list();
        assert_non_null(outer);
        assert_int_equal(mpr_value_list_append(outer, v), MPR_OK);
        v = outer;
    }
    /* shared sub-lists must survive: keep one level alive */
    mpr_value_t *inner = mpr_value_retain(mpr_value_list_get(mpr_value_list_get(v, 0), 0));
    mpr_value_release(v); /* 1,000,000 levels: recursion would overflow the stack */
    assert_int_equal(mpr_value_kind(inner), MPR_VALUE_LIST);
    assert_int_equal(mpr_value_list_len(inner), 1);
    mpr_value_release(inner);
}

static void test_list_append_null_message(void **state) {
    mpr_value_t *l = mpr_value_new_list();
    mpr_error_clear();
    assert_int_equal(mpr_value_list_append(l, NULL), MPR_ERR_INVALID_ARG);
    assert_string_equal(mpr_last_error(), "mpr_value_list_append: argument 'item' is NULL");
    /* an item whose constructor failed: that failure is kept and named */
    assert_int_equal(mpr_value_list_append(l, mpr_value_new_string(NULL)), MPR_ERR_INVALID_ARG);
    assert_non_null(strstr(mpr_last_error(), "mpr_value_list_append: argument 'item' is NULL (it failed earlier: "
                                             "mpr_value_new_string: argument 's' is NULL)"));
    assert_int_equal(mpr_value_list_len(l), 0);
    mpr_value_release(l);
}

static void test_sgd_create_null_params_message(void **state) {
    mpr_sgd_options_t o = {.lr = 0.1};
    mpr_error_clear();
    assert_null(mpr_sgd_create(NULL, 1, &o));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_INVALID_ARG);
    assert_string_equal(mpr_last_error(), "mpr_sgd_create: argument 'params' is NULL");
    mpr_tensor_t *p = mpr_zeros(MPR_F32, MPR_SHAPE(2));
    assert_null(mpr_sgd_create(&p, 0, &o));
    assert_non_null(strstr(mpr_last_error(), "at least one parameter (got 0)"));
    mpr_tensor_release(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_value_misuse_is_reported),
        cmocka_unit_test(test_tensor_misuse_is_reported),
        cmocka_unit_test(test_scope_keep_then_release_is_fine),
        cmocka_unit_test(test_failed_getters_clear_outputs),
        cmocka_unit_test(test_deep_list_release_is_iterative),
        cmocka_unit_test(test_list_append_null_message),
        cmocka_unit_test(test_sgd_create_null_params_message),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
