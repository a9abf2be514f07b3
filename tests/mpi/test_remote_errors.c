/* test_remote_errors.c — a function's failure reaches its caller as
 * MPR_ERR_REMOTE with the function's own code and the origin worker kept,
 * through nested chains A -> B -> C (sync, async-execution, then-callback
 * and remote()/to_here), with the chain shown once. Run with 2 ranks
 * (C == A) and 3 (three workers). */
#include "mpitest.h"

#define SELF() mpitest_rank()
#define NEXT() ((SELF() + 1) % mpr_world_size())

/* [depth, code]: depth 0 fails with `code`; otherwise calls the next rank
 * with depth-1 and passes its failure on unchanged. */
static mpr_err_t fn_fail_at(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t depth, code;
    mpr_err_t e;
    if ((e = mpr_args_int(args, 0, &depth)) || (e = mpr_args_int(args, 1, &code))) return e;
    if (depth == 0) return mpr_error_set((mpr_err_t)code, "deep failure on rank %d", SELF());
    mpr_value_t *a = ints2(depth - 1, code);
    e = mpr_rpc_sync(mpr_to_rank(NEXT()), "fail_at", a, 30, result);
    mpr_value_release(a);
    return e; /* the remote failure is still the thread's last error: passed on */
}

/* The same, async: the next hop's future is the outcome. */
static mpr_err_t fn_fail_async(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_future_t **out) {
    int64_t depth, code;
    mpr_err_t e;
    if ((e = mpr_args_int(args, 0, &depth)) || (e = mpr_args_int(args, 1, &code))) return e;
    if (depth == 0) return mpr_error_set((mpr_err_t)code, "async failure on rank %d", SELF());
    mpr_value_t *a = ints2(depth - 1, code);
    *out = mpr_rpc_async(mpr_to_rank(NEXT()), "fail_async", a, 30);
    mpr_value_release(a);
    return MPR_OK;
}

static mpr_err_t then_get(mpr_future_t *parent, void *user_data, mpr_value_t **result) {
    return mpr_future_get(parent, 0, result); /* fails with the parent's error: passed on */
}

/* One hop through a then-callback, then fail_at on the next rank at depth 0. */
static mpr_err_t fn_fail_then(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_future_t **out) {
    int64_t code;
    mpr_err_t e = mpr_args_int(args, 0, &code);
    if (e) return e;
    mpr_value_t *a = ints2(0, code);
    mpr_future_t *f = mpr_rpc_async(mpr_to_rank(NEXT()), "fail_at", a, 30);
    mpr_value_release(a);
    *out = mpr_future_then(f, then_get, NULL);
    mpr_future_release(f);
    return *out ? MPR_OK : mpr_last_error_code();
}

/* Calls fail_at on the next rank and reports a failure of its own: it is
 * the new origin. */
static mpr_err_t fn_wrap(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    mpr_value_t *a = ints2(0, MPR_ERR_NOT_FOUND);
    mpr_err_t e = mpr_rpc_sync(mpr_to_rank(NEXT()), "fail_at", a, 30, result);
    mpr_value_release(a);
    if (e) return mpr_error_set(MPR_ERR_STATE, "wrap gave up: %s", mpr_last_error());
    return MPR_OK;
}

static int count(const char *h, const char *needle) {
    int n = 0;
    for (const char *p = strstr(h, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* The thread's error is the remote failure of 'fn' on rank `origin`, with
 * `code`, passed through the functions `chain` (NULL: a direct failure). */
static void check_remote(mpr_err_t e, mpr_err_t code, int origin, const char *fn, const char *chain) {
    CHECK_ERR(e, MPR_ERR_REMOTE);
    CHECK(mpr_last_error_code() == MPR_ERR_REMOTE);
    CHECK(mpr_last_error_remote_code() == code);
    CHECK(mpr_last_error_origin() == origin);
    char head[256];
    snprintf(head, sizeof head, "On worker%d (rank %d): function '%s' failed: %s: ", origin, origin, fn,
             mpr_error_name(code));
    const char *text = mpr_last_error();
    CHECK(strncmp(text, head, strlen(head)) == 0);
    CHECK(count(text, "On worker") == 1); /* the chain once, not one "On ..." per hop */
    CHECK(count(text, "failed:") == 1);
    if (chain) {
        char tail[512];
        snprintf(tail, sizeof tail, " (call chain: %s)", chain);
        CHECK(strlen(text) > strlen(tail) && strcmp(text + strlen(text) - strlen(tail), tail) == 0);
    } else {
        CHECK(!strstr(text, "call chain"));
    }
}

static void test_direct(void) {
    if (SELF() != 0) return;
    mpr_value_t *a = ints2(0, MPR_ERR_TIMEOUT), *r = NULL;
    /* a remote MPR_ERR_TIMEOUT: the call fails with MPR_ERR_REMOTE, the code is kept */
    check_remote(mpr_rpc_sync(mpr_to_rank(1), "fail_at", a, 30, &r), MPR_ERR_TIMEOUT, 1, "fail_at", NULL);
    CHECK_CONTAINS(mpr_last_error(), "deep failure on rank 1");
    CHECK(r == NULL);
    /* a later local error forgets the remote part */
    mpr_error_set(MPR_ERR_INVALID_ARG, "local");
    CHECK(mpr_last_error_remote_code() == MPR_OK);
    CHECK(mpr_last_error_origin() == -1);
    /* an unknown function is not a remote failure */
    CHECK_ERR(mpr_rpc_sync(mpr_to_rank(1), "no_such_fn", NULL, 30, &r), MPR_ERR_UNKNOWN_FUNCTION);
    CHECK(mpr_last_error_remote_code() == MPR_OK);
    CHECK(mpr_last_error_origin() == -1);
    mpr_value_release(a);
}

static void test_sync_chain(void) {
    if (SELF() != 0) return;
    int n = mpr_world_size(), b = 1 % n, c = 2 % n;
    char chain[128];
    snprintf(chain, sizeof chain, "worker%d 'fail_at' -> worker%d 'fail_at'", b, c);
    mpr_value_t *a = ints2(1, MPR_ERR_NOT_FOUND), *r = NULL;
    check_remote(mpr_rpc_sync(mpr_to_rank(b), "fail_at", a, 30, &r), MPR_ERR_NOT_FOUND, c, "fail_at", chain);
    /* futures: the same without waiting, and mpr_future_get reports it */
    mpr_future_t *f = mpr_rpc_async(mpr_to_rank(b), "fail_at", a, 30);
    CHECK_OK(mpr_future_wait(f, 30));
    CHECK(mpr_future_error(f) == MPR_ERR_REMOTE);
    CHECK(mpr_future_remote_code(f) == MPR_ERR_NOT_FOUND);
    CHECK(mpr_future_error_origin(f) == c);
    mpr_error_clear();
    check_remote(mpr_future_get(f, 0, &r), MPR_ERR_NOT_FOUND, c, "fail_at", chain);
    CHECK(strcmp(mpr_future_error_message(f), mpr_last_error()) == 0);
    mpr_future_release(f);
    /* three hops: the chain grows, the origin text does not repeat */
    mpr_value_release(a);
    a = ints2(2, MPR_ERR_DTYPE);
    int d = 3 % n;
    snprintf(chain, sizeof chain, "worker%d 'fail_at' -> worker%d 'fail_at' -> worker%d 'fail_at'", b, c, d);
    check_remote(mpr_rpc_sync(mpr_to_rank(b), "fail_at", a, 30, &r), MPR_ERR_DTYPE, d, "fail_at", chain);
    mpr_value_release(a);
}

static void test_async_and_then_chains(void) {
    if (SELF() != 0) return;
    int n = mpr_world_size(), b = 1 % n, c = 2 % n;
    char chain[128];
    snprintf(chain, sizeof chain, "worker%d 'fail_async' -> worker%d 'fail_async'", b, c);
    mpr_value_t *a = ints2(1, MPR_ERR_SHAPE), *r = NULL;
    check_remote(mpr_rpc_sync(mpr_to_rank(b), "fail_async", a, 30, &r), MPR_ERR_SHAPE, c, "fail_async", chain);
    mpr_value_release(a);
    a = mpr_value_list_of(1, mpr_value_new_int(MPR_ERR_IO));
    snprintf(chain, sizeof chain, "worker%d 'fail_then' -> worker%d 'fail_at'", b, c);
    check_remote(mpr_rpc_sync(mpr_to_rank(b), "fail_then", a, 30, &r), MPR_ERR_IO, c, "fail_at", chain);
    mpr_value_release(a);
}

static void test_new_origin(void) {
    if (SELF() != 0) return;
    int n = mpr_world_size(), b = 1 % n, c = 2 % n;
    mpr_value_t *r = NULL;
    CHECK_ERR(mpr_rpc_sync(mpr_to_rank(b), "wrap", NULL, 30, &r), MPR_ERR_REMOTE);
    CHECK(mpr_last_error_remote_code() == MPR_ERR_STATE);
    CHECK(mpr_last_error_origin() == b);
    char inner[64];
    snprintf(inner, sizeof inner, "wrap gave up: On worker%d", c);
    CHECK_CONTAINS(mpr_last_error(), inner); /* its own text quotes what it wrapped */
}

static void test_rref_chain(void) {
    if (SELF() != 0) return;
    int n = mpr_world_size(), b = 1 % n, c = 2 % n;
    char chain[128];
    snprintf(chain, sizeof chain, "worker%d 'fail_at' -> worker%d 'fail_at'", b, c);
    mpr_value_t *a = ints2(1, MPR_ERR_NOT_FOUND), *r = NULL;
    mpr_rref_t *rr = mpr_remote(mpr_to_rank(b), "fail_at", a, 30);
    CHECK(rr != NULL);
    check_remote(mpr_rref_to_here(rr, 30, &r), MPR_ERR_NOT_FOUND, c, "fail_at", chain);
    mpr_rref_release(rr);
    mpr_value_release(a);
}

int main(int argc, char **argv) {
    CHECK_OK(mpr_register_function("fail_at", fn_fail_at, NULL));
    CHECK_OK(mpr_register_async_function("fail_async", fn_fail_async, NULL));
    CHECK_OK(mpr_register_async_function("fail_then", fn_fail_then, NULL));
    CHECK_OK(mpr_register_function("wrap", fn_wrap, NULL));
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = &argc;
    opts.argv = &argv;
    CHECK_OK(mpr_init(&opts));
    CHECK(mpr_world_size() >= 2);
    RUN_TEST(test_direct);
    RUN_TEST(test_sync_chain);
    RUN_TEST(test_async_and_then_chains);
    RUN_TEST(test_new_origin);
    RUN_TEST(test_rref_chain);
    CHECK_OK(mpr_shutdown(true));
    MPITEST_REPORT();
    return 0;
}
