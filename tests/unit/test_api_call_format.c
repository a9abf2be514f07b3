/* test_api_call_format.c — the format language of mpirpc/call_format.h:
 * every format character packs and unpacks the value kind the header's table
 * says; bad formats, wrong kinds and wrong counts fail with the documented
 * code and a message naming the item; unpack is all-or-nothing; and the
 * ownership rules hold: lowercase borrows, uppercase moves a reference, stolen
 * references are released on failure too (checked with the tensor live count
 * in every build, and by LeakSanitizer in the sanitizer build). RRef items
 * ('r', 'R') need a running runtime and are covered by tests/mpi/test_rpc_helpers.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "mpirpc/call_format.h"

static mpr_tensor_t *vector3(float a) {
    int64_t n = 3;
    mpr_tensor_t *t = mpr_tensor_empty(MPR_F32, 1, &n);
    float *p = mpr_tensor_data(t);
    p[0] = a, p[1] = a + 1, p[2] = a + 2;
    return t;
}

static void assert_error(mpr_err_t got, mpr_err_t want, const char *needle) {
    assert_int_equal(got, want);
    if (!strstr(mpr_last_error(), needle)) fail_msg("error text \"%s\" lacks \"%s\"", mpr_last_error(), needle);
}

static void test_pack_every_char(void **state) {
    (void)state;
    int64_t live = mpr_tensor_live_count();
    mpr_tensor_t *t = vector3(1), *stolen = vector3(4);
    mpr_worker_info_t w = {.name = "worker7", .rank = 7};
    mpr_value_t *inner = mpr_value_new_string("inner"), *inner_stolen = mpr_value_new_int(-5);
    mpr_value_t *v = mpr_value_pack("n b i l d s y w t T v V [i [s]]", 1, -3, (int64_t)1 << 40, 2.5, "str", "ab\0c",
                                    (size_t)4, &w, t, stolen, inner, inner_stolen, 9, "deep");
    assert_non_null(v);
    mpr_value_t *want = mpr_value_list_of(
        13, mpr_value_new_none(), mpr_value_new_bool(true), mpr_value_new_int(-3), mpr_value_new_int((int64_t)1 << 40),
        mpr_value_new_double(2.5), mpr_value_new_string("str"), mpr_value_new_bytes("ab\0c", 4),
        mpr_value_new_worker(&w), mpr_value_new_tensor(t), mpr_value_pack("T", vector3(4)),
        mpr_value_retain(inner), mpr_value_new_int(-5),
        mpr_value_list_of(2, mpr_value_new_int(9), mpr_value_list_of(1, mpr_value_new_string("deep"))));
    assert_int_equal(mpr_value_list_len(v), mpr_value_list_len(want));
    for (size_t k = 0; k < mpr_value_list_len(want); k++)
        if (!mpr_value_equal(mpr_value_list_get(v, k), mpr_value_list_get(want, k))) fail_msg("item %zu differs", k);
    mpr_tensor_t *item8, *item9;
    assert_int_equal(mpr_value_get_tensor(mpr_value_list_get(v, 8), &item8), MPR_OK);
    assert_int_equal(mpr_value_get_tensor(mpr_value_list_get(v, 9), &item9), MPR_OK);
    assert_ptr_equal(item8, t);      /* 't' shares the caller's tensor */
    assert_ptr_equal(item9, stolen); /* 'T' too, and took the caller's reference */
    assert_ptr_equal(mpr_value_list_get(v, 10), inner);
    assert_ptr_equal(mpr_value_list_get(v, 11), inner_stolen);
    mpr_value_release(want);
    mpr_value_release(v);
    /* 't' and 'v' left the caller's references: still valid, released here. */
    assert_float_equal(((float *)mpr_tensor_data(t))[2], 3.0f, 0);
    const char *inner_text = NULL;
    assert_int_equal(mpr_value_get_string(inner, &inner_text), MPR_OK);
    assert_string_equal(inner_text, "inner");
    mpr_tensor_release(t);
    mpr_value_release(inner);
    assert_int_equal(mpr_tensor_live_count(), live);
}

static void test_pack_shapes(void **state) {
    (void)state;
    mpr_value_t *v = mpr_value_pack("l", (int64_t)7);
    assert_int_equal(mpr_value_kind(v), MPR_VALUE_INT); /* one item: the item itself */
    mpr_value_release(v);
    v = mpr_value_pack(" [ l ] ", (int64_t)7);
    assert_int_equal(mpr_value_kind(v), MPR_VALUE_LIST);
    assert_int_equal(mpr_value_list_len(v), 1);
    mpr_value_release(v);
    v = mpr_value_pack("");
    assert_int_equal(mpr_value_kind(v), MPR_VALUE_LIST);
    assert_int_equal(mpr_value_list_len(v), 0);
    mpr_value_release(v);
    v = mpr_args_pack("l", (int64_t)7); /* argument lists are always lists */
    assert_int_equal(mpr_value_kind(v), MPR_VALUE_LIST);
    assert_int_equal(mpr_value_list_len(v), 1);
    mpr_value_release(v);
    v = mpr_args_pack("");
    assert_int_equal(mpr_value_list_len(v), 0);
    mpr_value_release(v);
    v = mpr_value_pack("y", (const void *)NULL, (size_t)0); /* empty bytes may be NULL */
    assert_int_equal(mpr_value_kind(v), MPR_VALUE_BYTES);
    mpr_value_release(v);
}

static void test_unpack_every_char(void **state) {
    (void)state;
    int64_t live = mpr_tensor_live_count();
    mpr_tensor_t *t1 = vector3(1), *t2 = vector3(10);
    mpr_worker_info_t w = {.name = "worker3", .rank = 3};
    mpr_value_t *any1 = mpr_value_new_string("any"), *any2 = mpr_value_new_int(5);
    mpr_value_t *args = mpr_args_pack("n b i l d l s y s w t t v v [l [s]]", 0, -42, -((int64_t)1 << 50), 1.5, (int64_t)2, "s",
                         "xyz", (size_t)3, "str", &w, t1, t2, any1, any2, (int64_t)8, "deep");
    assert_non_null(args);
    bool b = true;
    int i = 0;
    int64_t l = 0, nested_l = 0;
    double d1 = 0, d2 = 0;
    const char *s = NULL, *deep = NULL;
    const void *y1 = NULL, *y2 = NULL;
    size_t n1 = 0, n2 = 0;
    mpr_worker_info_t wo;
    memset(&wo, 0, sizeof wo);
    mpr_tensor_t *bt = NULL, *nt = NULL;
    mpr_value_t *bv = NULL, *nv = NULL;
    assert_int_equal(mpr_args_unpack(args, "n b i l d d s y y w t T v V [l [s]]", &b, &i, &l, &d1, &d2, &s, &y1,
                                     &n1, &y2, &n2, &wo, &bt, &nt, &bv, &nv, &nested_l, &deep),
                     MPR_OK);
    assert_false(b);
    assert_int_equal(i, -42);
    assert_true(l == -((int64_t)1 << 50));
    assert_float_equal(d1, 1.5, 0);
    assert_float_equal(d2, 2.0, 0); /* 'd' accepts an int */
    assert_string_equal(s, "s");
    assert_int_equal(n1, 3);
    assert_memory_equal(y1, "xyz", 3);
    assert_int_equal(n2, 3); /* 'y' accepts a string */
    assert_memory_equal(y2, "str", 3);
    assert_string_equal(wo.name, "worker3");
    assert_int_equal(wo.rank, 3);
    assert_ptr_equal(bt, t1);
    assert_ptr_equal(nt, t2);
    assert_ptr_equal(bv, any1);
    assert_ptr_equal(nv, any2);
    assert_int_equal(nested_l, 8);
    assert_string_equal(deep, "deep");
    mpr_value_release(any1);
    mpr_value_release(any2);
    mpr_tensor_release(t1);
    mpr_tensor_release(t2);
    mpr_value_release(args);
    /* 'T' and 'V' gave new references: they outlive the argument list. */
    assert_float_equal(((float *)mpr_tensor_data(nt))[0], 10.0f, 0);
    int64_t five = 0;
    assert_int_equal(mpr_value_get_int(nv, &five), MPR_OK);
    assert_int_equal(five, 5);
    mpr_tensor_release(nt);
    mpr_value_release(nv);
    assert_int_equal(mpr_tensor_live_count(), live);
}

static void test_unpack_optional_and_value(void **state) {
    (void)state;
    mpr_value_t *args = mpr_args_pack("l", (int64_t)1);
    int64_t a = 0, b = 99;
    double c = 7.5;
    assert_int_equal(mpr_args_unpack(args, "l|ld", &a, &b, &c), MPR_OK);
    assert_int_equal(a, 1);
    assert_int_equal(b, 99); /* absent optional items leave their outputs alone */
    assert_float_equal(c, 7.5, 0);
    assert_error(mpr_args_unpack(args, "l|", &a), MPR_OK, "");
    mpr_value_release(args);
    args = mpr_args_pack("l[l]", (int64_t)1, (int64_t)2);
    int64_t x = 0, y = 0, z = 42;
    assert_int_equal(mpr_args_unpack(args, "l[l|l]", &x, &y, &z), MPR_OK);
    assert_int_equal(y, 2);
    assert_int_equal(z, 42);
    assert_int_equal(mpr_args_unpack(args, "l|[l]l", &x, &y, &z), MPR_OK);
    mpr_value_release(args);

    mpr_value_t *v = mpr_value_pack("[ls]", (int64_t)3, "three");
    const char *s = NULL;
    assert_int_equal(mpr_value_unpack(v, "[ls]", &x, &s), MPR_OK);
    assert_int_equal(x, 3);
    assert_string_equal(s, "three");
    assert_error(mpr_value_unpack(v, "ls", &x, &s), MPR_ERR_INVALID_ARG, "exactly one value");
    assert_error(mpr_value_unpack(v, "|l", &x), MPR_ERR_INVALID_ARG, "exactly one value");
    assert_error(mpr_value_unpack(v, "l", &x), MPR_ERR_TYPE, "value: expected int ('l'), got list");
    mpr_value_release(v);
}

static void test_unpack_errors_name_the_argument(void **state) {
    (void)state;
    mpr_value_t *args = mpr_args_pack("ls[d]", (int64_t)5000000000, "x", 1.0);
    int64_t a = 1;
    int ai = 1;
    const char *s = NULL;
    double d = 0;
    assert_error(mpr_args_unpack(args, "lls", &a, &a, &s), MPR_ERR_TYPE, "argument 1: expected int ('l'), got string");
    assert_int_equal(a, 1); /* all or nothing: argument 0 matched but was not written */
    assert_error(mpr_args_unpack(args, "ls[s]", &a, &s, &s), MPR_ERR_TYPE,
                 "argument 2[0]: expected string ('s'), got double");
    assert_error(mpr_args_unpack(args, "lsd", &a, &s, &d), MPR_ERR_TYPE, "argument 2: expected double ('d'), got list");
    assert_error(mpr_args_unpack(args, "is[d]", &ai, &s, &d), MPR_ERR_INVALID_ARG,
                 "argument 0: 5000000000 does not fit in an int");
    assert_int_equal(ai, 1);
    assert_error(mpr_args_unpack(args, "ls", &a, &s), MPR_ERR_INVALID_ARG, "expected 2 arguments, got 3");
    assert_error(mpr_args_unpack(args, "ls[d]l", &a, &s, &d, &a), MPR_ERR_INVALID_ARG, "expected 4 arguments, got 3");
    assert_error(mpr_args_unpack(args, "l|s", &a, &s), MPR_ERR_INVALID_ARG, "expected at most 2 arguments, got 3");
    assert_error(mpr_args_unpack(args, "ls[dd]", &a, &s, &d, &d), MPR_ERR_INVALID_ARG,
                 "argument 2: expected a list of 2 items, got 1");
    assert_error(mpr_args_unpack(args, "ls[d]", &a, NULL, &d), MPR_ERR_INVALID_ARG, "output pointer for format item 1");
    assert_error(mpr_args_unpack(NULL, "l", &a), MPR_ERR_INVALID_ARG, "NULL");
    assert_error(mpr_args_unpack(args, NULL), MPR_ERR_INVALID_ARG, "argument 'fmt' is NULL");
    mpr_value_t *one = mpr_value_new_int(1);
    assert_error(mpr_args_unpack(one, "l", &a), MPR_ERR_TYPE, "arguments: expected a list, got int");
    mpr_value_release(one);
    mpr_value_release(args);
    mpr_value_t *empty = mpr_args_pack("");
    assert_error(mpr_args_unpack(empty, "l", &a), MPR_ERR_INVALID_ARG, "expected 1 argument, got 0");
    assert_int_equal(mpr_args_unpack(empty, ""), MPR_OK);
    mpr_value_release(empty);
}

static void test_bad_formats_are_errors(void **state) {
    (void)state;
    int64_t a = 0;
    mpr_value_t *args = mpr_args_pack("l", (int64_t)1);
    assert_error(mpr_args_unpack(args, "lx", &a), MPR_ERR_INVALID_ARG, "unknown format character 'x' (0x78) at position 1");
    assert_error(mpr_args_unpack(args, "l]", &a), MPR_ERR_INVALID_ARG, "unmatched ']' at position 1");
    assert_error(mpr_args_unpack(args, "[l", &a), MPR_ERR_INVALID_ARG, "unclosed '['");
    assert_error(mpr_args_unpack(args, "l||", &a), MPR_ERR_INVALID_ARG, "second '|' at position 2");
    assert_error(mpr_args_unpack(args, "l\x01", &a), MPR_ERR_INVALID_ARG, "(0x01)");
    assert_int_equal(a, 0);
    mpr_value_release(args);
    assert_null(mpr_value_pack("l%", (int64_t)1));
    assert_error(mpr_last_error_code(), MPR_ERR_INVALID_ARG, "unknown format character '%'");
    assert_null(mpr_value_pack("l|l", (int64_t)1, (int64_t)2));
    assert_error(mpr_last_error_code(), MPR_ERR_INVALID_ARG, "for unpacking only");
    assert_null(mpr_value_pack(NULL));
    assert_error(mpr_last_error_code(), MPR_ERR_INVALID_ARG, "argument 'fmt' is NULL");
    char deep[2 * MPR_FORMAT_MAX_DEPTH + 4] = {0};
    for (int k = 0; k <= MPR_FORMAT_MAX_DEPTH; k++) deep[k] = '[', deep[2 * MPR_FORMAT_MAX_DEPTH + 1 - k] = ']';
    assert_null(mpr_value_pack(deep));
    assert_error(mpr_last_error_code(), MPR_ERR_INVALID_ARG, "nest deeper than");
    deep[0] = ' ', deep[2 * MPR_FORMAT_MAX_DEPTH + 1] = ' '; /* exactly at the limit: fine */
    mpr_value_t *ok = mpr_value_pack(deep);
    assert_non_null(ok);
    mpr_value_release(ok);
}

static void test_too_many_items(void **state) {
    (void)state;
    char many[MPR_FORMAT_MAX_ITEMS + 2];
    memset(many, 'l', sizeof many - 1);
    many[sizeof many - 1] = 0;
    mpr_value_t *args = mpr_value_new_list();
    int64_t a;
    assert_error(mpr_args_unpack(args, many, &a), MPR_ERR_INVALID_ARG, "more than 256 items");
    mpr_value_release(args);
}

static void test_stolen_references_released_on_failure(void **state) {
    (void)state;
    int64_t live = mpr_tensor_live_count();
    /* A NULL string before a stolen tensor and a stolen value. */
    mpr_tensor_t *held = vector3(0);
    mpr_value_t *holder = mpr_value_new_tensor(held); /* a value that alone owns a tensor */
    mpr_tensor_release(held);
    assert_int_equal(mpr_tensor_live_count(), live + 1);
    assert_null(mpr_value_pack("s T V", (const char *)NULL, vector3(1), holder));
    assert_error(mpr_last_error_code(), MPR_ERR_INVALID_ARG, "item 0 ('s') is a NULL string");
    assert_int_equal(mpr_tensor_live_count(), live);
    /* A NULL stolen tensor (an op that failed): the message says why. */
    mpr_error_set(MPR_ERR_SHAPE, "add: shapes [2] and [3]");
    assert_null(mpr_value_pack("[l T] T", (int64_t)1, (mpr_tensor_t *)NULL, vector3(2)));
    assert_error(mpr_last_error_code(), MPR_ERR_INVALID_ARG, "item 0[1] ('T') is a NULL tensor");
    assert_error(mpr_last_error_code(), MPR_ERR_INVALID_ARG, "MPR_ERR_SHAPE: add: shapes [2] and [3]");
    assert_int_equal(mpr_tensor_live_count(), live);
    /* A bad format: the stolen items before the bad character are released. */
    assert_null(mpr_value_pack("T [T] %", vector3(3), vector3(4)));
    assert_error(mpr_last_error_code(), MPR_ERR_INVALID_ARG, "unknown format character '%'");
    assert_int_equal(mpr_tensor_live_count(), live);
    assert_null(mpr_value_pack("T [T", vector3(3), vector3(4)));
    assert_error(mpr_last_error_code(), MPR_ERR_INVALID_ARG, "unclosed");
    assert_int_equal(mpr_tensor_live_count(), live);
    /* mpr_return: *result NULL and the code returned; NULL result still releases. */
    mpr_value_t *r = mpr_value_new_int(1);
    mpr_value_t *old = r;
    assert_int_equal(mpr_return(&r, "T", (mpr_tensor_t *)NULL), MPR_ERR_INVALID_ARG);
    assert_null(r);
    mpr_value_release(old);
    assert_int_equal(mpr_return(NULL, "T", vector3(5)), MPR_ERR_INVALID_ARG);
    assert_int_equal(mpr_tensor_live_count(), live);
    assert_int_equal(mpr_return(&r, "T", vector3(6)), MPR_OK);
    assert_int_equal(mpr_value_kind(r), MPR_VALUE_TENSOR);
    mpr_value_release(r);
    assert_int_equal(mpr_tensor_live_count(), live);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_every_char),
        cmocka_unit_test(test_pack_shapes),
        cmocka_unit_test(test_unpack_every_char),
        cmocka_unit_test(test_unpack_optional_and_value),
        cmocka_unit_test(test_unpack_errors_name_the_argument),
        cmocka_unit_test(test_bad_formats_are_errors),
        cmocka_unit_test(test_too_many_items),
        cmocka_unit_test(test_stolen_references_released_on_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
