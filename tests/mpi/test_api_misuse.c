/* test_api_misuse.c — misuse with a running runtime gets a clear answer:
 * completing an rpc_async future by hand is refused and the real reply still
 * arrives; a failed call clears *result; a handler whose library call
 * returned NULL finds the error recorded (never MPR_OK), so its caller gets
 * a failure, not a silent None. Run with 2 ranks. */
#include <signal.h>

#include "mpitest.h"

static mpr_err_t fn_slow_echo(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    struct timespec ts = {0, 200000000};
    nanosleep(&ts, NULL);
    *result = mpr_value_retain(mpr_value_list_get(args, 0));
    return MPR_OK;
}

/* The trainer/PS pattern: state not built yet -> an op on NULL. */
static mpr_err_t fn_uses_missing_state(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    mpr_tensor_t *missing_weights = NULL;
    mpr_error_clear();
    mpr_tensor_t *y = mpr_relu(missing_weights);
    if (!y) return mpr_last_error_code();
    *result = mpr_value_new_tensor(y);
    mpr_tensor_release(y);
    return MPR_OK;
}

static void test_rpc_future_cannot_be_completed_by_hand(void) {
    int peer = 1 - mpitest_rank();
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_int(42));
    mpr_future_t *f = mpr_rpc_async(mpr_to_rank(peer), "slow_echo", args, 30);
    CHECK(f != NULL);
    CHECK_ERR(mpr_future_set_result(f, mpr_value_new_int(7)), MPR_ERR_STATE);
    CHECK_CONTAINS(mpr_last_error(), "mpr_future_set_result: this future belongs to an RPC");
    CHECK_ERR(mpr_future_set_error(f, MPR_ERR_REMOTE, "fake"), MPR_ERR_STATE);
    mpr_value_t *v = NULL;
    CHECK_OK(mpr_future_get(f, 30, &v));
    int64_t got = 0;
    CHECK_OK(mpr_value_get_int(v, &got));
    CHECK(got == 42); /* the real reply, not the 7 */
    mpr_value_release(v);
    mpr_future_release(f);
    mpr_value_release(args);
}

static void test_failed_call_clears_result(void) {
    int peer = 1 - mpitest_rank();
    mpr_value_t *stale = mpr_value_new_int(1);
    mpr_value_t *r = stale;
    CHECK(mpr_rpc_sync(mpr_to_rank(peer), "no_such_function", NULL, 30, &r) != MPR_OK);
    CHECK(r == NULL);
    r = stale;
    CHECK_ERR(mpr_rpc_sync(mpr_to_rank(99), "slow_echo", NULL, 30, &r), MPR_ERR_NOT_FOUND);
    CHECK(r == NULL);
    mpr_value_release(stale);
}

static void test_handler_null_from_library_is_an_error(void) {
    int peer = 1 - mpitest_rank();
    mpr_value_t *r = NULL;
    mpr_err_t e = mpr_rpc_sync(mpr_to_rank(peer), "uses_missing_state", NULL, 30, &r);
    CHECK(e != MPR_OK);
    CHECK(r == NULL);
    CHECK_CONTAINS(mpr_last_error(), "mpr_relu: argument 'a' is NULL");
}

/* mpr_init started MPI here, and SIGPIPE was at its default: it is ignored
 * now, so a write to a dead TCP peer fails instead of killing this rank
 * (runtime/world.c). */
static void test_sigpipe_ignored_when_mpirpc_started_mpi(void) {
    struct sigaction sa;
    CHECK(sigaction(SIGPIPE, NULL, &sa) == 0);
    CHECK(!(sa.sa_flags & SA_SIGINFO) && sa.sa_handler == SIG_IGN);
}

int main(int argc, char **argv) {
    CHECK_OK(mpr_register_function("slow_echo", fn_slow_echo, NULL));
    CHECK_OK(mpr_register_function("uses_missing_state", fn_uses_missing_state, NULL));
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = &argc;
    opts.argv = &argv;
    CHECK_OK(mpr_init(&opts));
    RUN_TEST(test_rpc_future_cannot_be_completed_by_hand);
    RUN_TEST(test_failed_call_clears_result);
    RUN_TEST(test_handler_null_from_library_is_an_error);
    RUN_TEST(test_sigpipe_ignored_when_mpirpc_started_mpi);
    MPITEST_REPORT();
    CHECK_OK(mpr_shutdown(true));
    return 0;
}
