/* test_barrier.c — mpr_barrier: waits for the slowest worker, serves calls
 * while waiting, sleeps instead of spinning (the waiting thread's CPU time
 * stays a small fraction of the wait), a timed-out barrier stays pending and
 * the next call waits for that same barrier, and it refuses to run before
 * mpr_init and after mpr_shutdown. Run with 3 ranks. */
#include <time.h>
#include <unistd.h>

#include "mpitest.h"

static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static mpr_err_t fn_rank(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    mpr_worker_info_t me;
    mpr_err_t e = mpr_get_self_worker_info(&me);
    if (e) return e;
    *result = mpr_value_new_int(me.rank);
    return *result ? MPR_OK : mpr_last_error_code();
}

/* Rank 0 arrives 1.5 s late and calls the others first: they must serve those
 * calls from inside the barrier, return only after rank 0 arrived, and spend
 * little CPU doing it. */
static void test_waits_for_the_slowest_without_spinning(void) {
    int rank = mpitest_rank(), size = mpr_world_size();
    if (rank == 0) {
        usleep(300000);
        for (int r = 1; r < size; r++) {
            mpr_value_t *v = NULL;
            CHECK_OK(mpr_rpc_sync(mpr_to_rank(r), "rank", NULL, 30, &v));
            int64_t got;
            CHECK_OK(mpr_value_get_int(v, &got));
            CHECK(got == r);
            mpr_value_release(v);
        }
        usleep(1200000);
        CHECK_OK(mpr_barrier(MPR_TIMEOUT_DEFAULT));
        return;
    }
    double w0 = wall_s(), c0 = thread_cpu_s();
    CHECK_OK(mpr_barrier(0));
    double waited = wall_s() - w0, cpu = thread_cpu_s() - c0;
    printf("[rank %d] barrier waited %.3f s using %.3f s of CPU\n", rank, waited, cpu);
    CHECK(waited > 1.3);
    CHECK(cpu < 0.15 * waited); /* a spinning wait would use about all of it */
}

static void test_timed_out_barrier_is_resumed(void) {
    int rank = mpitest_rank();
    if (rank == 0) {
        double w0 = wall_s();
        CHECK_ERR(mpr_barrier(0.2), MPR_ERR_TIMEOUT);
        CHECK_CONTAINS(mpr_last_error(), "stays pending");
        CHECK(wall_s() - w0 < 1.0);
        CHECK_OK(mpr_barrier(0)); /* the same barrier: completes when the others arrive */
        CHECK(wall_s() - w0 > 0.9);
    } else {
        usleep(1000000);
        CHECK_OK(mpr_barrier(30));
    }
    /* ranks are still matched: a fresh barrier completes everywhere */
    CHECK_OK(mpr_barrier(30));
}

int main(int argc, char **argv) {
    CHECK_ERR(mpr_barrier(1), MPR_ERR_NOT_INITIALIZED);
    CHECK_OK(mpr_register_function("rank", fn_rank, NULL));
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = &argc;
    opts.argv = &argv;
    CHECK_OK(mpr_init(&opts));
    RUN_TEST(test_waits_for_the_slowest_without_spinning);
    RUN_TEST(test_timed_out_barrier_is_resumed);
    CHECK_OK(mpr_barrier(30));
    MPITEST_REPORT();
    CHECK_OK(mpr_shutdown(true));
    CHECK_ERR(mpr_barrier(1), MPR_ERR_SHUTDOWN);
    return 0;
}
