/* test_rpc_helpers.c — mpirpc/rpc_helpers.h on 2 ranks: format calls give
 * the result and their argument errors; the *_take calls release their
 * argument list on success and failure (tensor live count; LeakSanitizer in
 * the sanitizer build); RRefs pack ('r') and unpack ('R') through a call;
 * one-way calls reach the peer, a failure after sending is counted (never
 * lost), a failure before sending is returned; and a graceful shutdown waits
 * for a one-way call still running on the peer. */
#include <stdatomic.h>
#include <unistd.h>

#include "mpitest.h"

static atomic_long marks;          /* sum of the "mark" arguments this rank received */
static atomic_int slow_mark_done;  /* "slow_mark" ran to its end on this rank */

static mpr_err_t fn_add(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t a, b;
    mpr_err_t e = mpr_args_unpack(args, "ll", &a, &b);
    return e ? e : mpr_return(result, "l", a + b);
}

static mpr_err_t fn_mark(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t k;
    mpr_err_t e = mpr_args_unpack(args, "l", &k);
    if (!e) atomic_fetch_add(&marks, (long)k);
    return e;
}

static mpr_err_t fn_marks(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    return mpr_return(result, "l", (int64_t)atomic_load(&marks));
}

static mpr_err_t fn_slow_mark(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    usleep(300 * 1000);
    atomic_store(&slow_mark_done, 1);
    return MPR_OK;
}

static mpr_err_t fn_fail(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    return mpr_error_set(MPR_ERR_STATE, "fails on purpose");
}

/* Takes an RRef ('R': a new reference, released here) and returns [owner rank, value]. */
static mpr_err_t fn_rref_info(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    mpr_rref_t *r;
    mpr_err_t e = mpr_args_unpack(args, "R", &r);
    if (e) return e;
    mpr_worker_info_t owner;
    mpr_value_t *v = NULL;
    if (!(e = mpr_rref_owner(r, &owner)) && !(e = mpr_rref_to_here(r, 10.0, &v)))
        e = mpr_return(result, "[i V]", owner.rank, v);
    mpr_rref_release(r);
    return e;
}

static mpr_tensor_t *ones(int64_t n) {
    mpr_tensor_t *t = mpr_tensor_empty(MPR_F32, 1, &n);
    for (int64_t i = 0; i < n; i++) ((float *)mpr_tensor_data(t))[i] = 1.0f;
    return t;
}

static int64_t result_int(mpr_value_t *r) {
    int64_t x = -1;
    CHECK_OK(mpr_value_unpack(r, "l", &x));
    mpr_value_release(r);
    return x;
}

/* Polls `fn` on worker1 until it returns `want` (10 s at most). */
static void wait_for_marks(int64_t want) {
    for (int i = 0; i < 2000; i++) {
        mpr_value_t *r;
        CHECK_OK(mpr_call_sync(mpr_to_rank(1), "marks", 10.0, &r, ""));
        if (result_int(r) == want) return;
        usleep(5000);
    }
    CHECK(!"the one-way calls did not all reach worker1");
}

static void wait_for_failures(uint64_t want) {
    for (int i = 0; i < 2000 && mpr_oneway_failure_count() < want; i++) usleep(5000);
    CHECK(mpr_oneway_failure_count() == want);
}

static void test_format_calls(void) {
    if (mpitest_rank() != 0) return;
    mpr_dest_t w1 = mpr_to_name("worker1");
    mpr_value_t *r = NULL;
    CHECK_OK(mpr_call_sync(w1, "add", 10.0, &r, "ll", (int64_t)3, (int64_t)4));
    CHECK(result_int(r) == 7);
    CHECK_OK(mpr_call_sync(w1, "add", 10.0, NULL, "ll", (int64_t)3, (int64_t)4)); /* result dropped */

    /* The handler's unpack error reaches the caller naming the argument. */
    r = mpr_value_new_none();
    mpr_err_t e = mpr_call_sync(w1, "add", 10.0, &r, "ls", (int64_t)3, "four");
    CHECK(e != MPR_OK && r == NULL);
    CHECK_CONTAINS(mpr_last_error(), "argument 1: expected int ('l'), got string");
    CHECK(mpr_call_sync(w1, "add", 10.0, &r, "l", (int64_t)3) != MPR_OK);
    CHECK_CONTAINS(mpr_last_error(), "expected 2 arguments, got 1");

    /* A bad format fails locally; a stolen tensor is released. */
    int64_t live = mpr_tensor_live_count();
    CHECK_ERR(mpr_call_sync(w1, "add", 10.0, &r, "T?", ones(4)), MPR_ERR_INVALID_ARG);
    CHECK_CONTAINS(mpr_last_error(), "unknown format character '?'");
    CHECK(r == NULL && mpr_tensor_live_count() == live);

    mpr_future_t *f = mpr_call_async(w1, "add", 10.0, "ll", (int64_t)5, (int64_t)6);
    CHECK_OK(mpr_future_get(f, 10.0, &r));
    CHECK(result_int(r) == 11);
    mpr_future_release(f);
    f = mpr_call_async(w1, "add", 10.0, "l)", (int64_t)5);
    CHECK(f != NULL && mpr_future_done(f));
    CHECK_ERR(mpr_future_get(f, 10.0, &r), MPR_ERR_INVALID_ARG);
    CHECK_CONTAINS(mpr_future_error_message(f), "unknown format character ')'");
    mpr_future_release(f);
}

static void test_take_calls(void) {
    if (mpitest_rank() != 0) return;
    mpr_dest_t w1 = mpr_to_rank(1);
    int64_t live = mpr_tensor_live_count();
    mpr_value_t *r = NULL;
    CHECK_OK(mpr_rpc_sync_take(w1, "add", mpr_value_list_of(2, mpr_value_new_int(1), mpr_value_new_int(2)), 10.0, &r));
    CHECK(result_int(r) == 3);
    /* Released on failure too: a tensor argument the handler rejects. */
    CHECK(mpr_rpc_sync_take(w1, "add", mpr_args_pack("Tl", ones(1000), (int64_t)1), 10.0, &r) != MPR_OK);
    CHECK(r == NULL);
    CHECK_CONTAINS(mpr_last_error(), "argument 0: expected int ('l'), got tensor");
    CHECK(mpr_tensor_live_count() == live);
    /* ... and on a local failure (bad destination). */
    CHECK(mpr_rpc_sync_take(mpr_to_name("nobody"), "add", mpr_args_pack("T", ones(8)), 10.0, &r) != MPR_OK);
    CHECK(mpr_tensor_live_count() == live);
    /* NULL args (a failed builder) is an error naming the builder's failure. */
    CHECK_ERR(mpr_rpc_sync_take(w1, "add", mpr_value_list_of(1, NULL), 10.0, &r), MPR_ERR_INVALID_ARG);
    CHECK_CONTAINS(mpr_last_error(), "argument 'args' is NULL");
    CHECK_CONTAINS(mpr_last_error(), "an item is NULL");

    mpr_future_t *f = mpr_rpc_async_take(w1, "add", mpr_args_pack("ll", (int64_t)20, (int64_t)22), 10.0);
    CHECK_OK(mpr_future_get(f, 10.0, &r));
    CHECK(result_int(r) == 42);
    mpr_future_release(f);
    f = mpr_rpc_async_take(w1, "add", NULL, 10.0);
    CHECK_ERR(mpr_future_get(f, 10.0, &r), MPR_ERR_INVALID_ARG);
    mpr_future_release(f);
}

static void test_rref_items(void) {
    if (mpitest_rank() != 0) return;
    mpr_value_t *v = mpr_value_new_string("held by worker0");
    mpr_rref_t *rr = mpr_rref_create_local(v);
    mpr_value_release(v);
    CHECK(rr != NULL);
    mpr_value_t *r = NULL;
    CHECK_OK(mpr_call_sync(mpr_to_rank(1), "rref_info", 10.0, &r, "r", rr)); /* 'r': we keep ours */
    int owner = -1;
    const char *text = NULL;
    CHECK_OK(mpr_value_unpack(r, "[is]", &owner, &text));
    CHECK(owner == 0);
    CHECK(strcmp(text, "held by worker0") == 0);
    mpr_value_release(r);
    CHECK_OK(mpr_call_sync(mpr_to_rank(1), "rref_info", 10.0, &r, "R", rr)); /* 'R': ours is taken */
    mpr_value_release(r);
}

static void test_oneway(void) {
    if (mpitest_rank() != 0) return;
    mpr_dest_t w1 = mpr_to_name("worker1");
    uint64_t failures = mpr_oneway_failure_count();
    for (int i = 1; i <= 10; i++) CHECK_OK(mpr_call_oneway(w1, "mark", "l", (int64_t)i));
    CHECK_OK(mpr_rpc_oneway_take(w1, "mark", mpr_args_pack("l", (int64_t)45)));
    wait_for_marks(100);
    CHECK(mpr_oneway_failure_count() == failures);

    /* Failures after sending are counted (and printed on stderr). */
    CHECK_OK(mpr_call_oneway(w1, "no_such_function", ""));
    wait_for_failures(failures + 1);
    CHECK_OK(mpr_call_oneway(w1, "fail", ""));
    wait_for_failures(failures + 2);
    CHECK_OK(mpr_call_oneway(w1, "mark", "s", "not an int"));
    wait_for_failures(failures + 3);
    /* A request that left is the callback's, however fast its failure comes
     * back: even when the reply is drained before the call returns (a
     * sleeping progress thread, a loaded machine), the caller sees MPR_OK. */
    enum { QUICK_FAILURES = 300 };
    for (int i = 0; i < QUICK_FAILURES; i++) {
        CHECK_OK(mpr_call_oneway(i % 2 ? w1 : mpr_to_rank(0), "fail", "")); /* to a peer, to self */
        if (i % 3 == 0) usleep(50); /* let some replies arrive while the next call is made */
    }
    failures += QUICK_FAILURES;
    wait_for_failures(failures + 3);

    /* Failures before sending are returned, not counted. */
    CHECK(mpr_call_oneway(mpr_to_name("nobody"), "mark", "l", (int64_t)1) != MPR_OK);
    CHECK_CONTAINS(mpr_last_error(), "nobody");
    CHECK_ERR(mpr_call_oneway(w1, "mark", "q"), MPR_ERR_INVALID_ARG);
    CHECK_ERR(mpr_rpc_oneway_take(w1, "mark", NULL), MPR_ERR_INVALID_ARG);
    CHECK(mpr_oneway_failure_count() == failures + 3);
    wait_for_marks(100);
}

int main(int argc, char **argv) {
    CHECK_OK(mpr_register_function("add", fn_add, NULL));
    CHECK_OK(mpr_register_function("mark", fn_mark, NULL));
    CHECK_OK(mpr_register_function("marks", fn_marks, NULL));
    CHECK_OK(mpr_register_function("slow_mark", fn_slow_mark, NULL));
    CHECK_OK(mpr_register_function("fail", fn_fail, NULL));
    CHECK_OK(mpr_register_function("rref_info", fn_rref_info, NULL));
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = &argc;
    opts.argv = &argv;
    CHECK_OK(mpr_init(&opts));
    CHECK(mpr_world_size() == 2);
    int rank = mpitest_rank();

    RUN_TEST(test_format_calls);
    RUN_TEST(test_take_calls);
    RUN_TEST(test_rref_items);
    RUN_TEST(test_oneway);

    /* Graceful shutdown right after a one-way call: it waits until the call
     * has run on worker1 and its reply is back (no failure counted). */
    uint64_t failures = mpr_oneway_failure_count();
    if (rank == 0) CHECK_OK(mpr_call_oneway(mpr_to_rank(1), "slow_mark", ""));
    int passed = mpitest_passed + 1;
    CHECK_OK(mpr_shutdown(true)); /* finalizes MPI: no CHECK (MPI_Abort) after this */
    if (rank == 1 && atomic_load(&slow_mark_done) != 1) {
        fprintf(stderr, "[rank 1] graceful shutdown returned before the one-way call ran\n");
        return 1;
    }
    if (mpr_oneway_failure_count() != failures) {
        fprintf(stderr, "[rank %d] the one-way call in flight at shutdown failed\n", rank);
        return 1;
    }
    if (rank == 0) printf("[ok] graceful shutdown waited for a one-way call\n%d passed, 0 failed\n", passed);
    return 0;
}
