/* test_shutdown_timeout.c — a graceful shutdown that cannot finish returns
 * MPR_ERR_TIMEOUT instead of hanging, and leaves the host's MPI usable.
 *
 * The host program initializes MPI (run with 2 ranks). After a normal call,
 * rank 0 shuts down with a 0.5 s limit while rank 1 has not called
 * mpr_shutdown: rank 0 gets MPR_ERR_TIMEOUT, no sooner than the limit, with
 * a message that says what happened; mpirpc is stopped there (calls and a
 * second shutdown fail cleanly). Rank 1, told by a host message, finds that
 * rank 0 no longer answers (its call times out), then shuts down and times
 * out too, its peer being gone. Both ranks then use MPI_COMM_WORLD for their
 * own traffic and finalize MPI themselves. */
#include "mpitest.h"

static mpr_err_t fn_echo(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    int64_t x;
    mpr_err_t e = mpr_args_int(args, 0, &x);
    if (e) return e;
    *result = mpr_value_new_int(x);
    return MPR_OK;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Host traffic on MPI_COMM_WORLD, waited for without spinning. */
static void host_wait(MPI_Request *req) {
    for (int done = 0;;) {
        MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (done) return;
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
}

static void timed_out_shutdown(double limit_s) {
    double t0 = now_s();
    CHECK_ERR(mpr_shutdown(true), MPR_ERR_TIMEOUT);
    double took = now_s() - t0;
    CHECK_CONTAINS(mpr_last_error(), "graceful shutdown timed out");
    CHECK(took >= limit_s * 0.9);
    /* mpirpc is stopped: no new calls, no second shutdown. */
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_int(1)), *r = NULL;
    CHECK(mpr_rpc_sync(mpr_to_rank(0), "echo", args, 1.0, &r) != MPR_OK);
    CHECK(r == NULL);
    mpr_value_release(args);
    CHECK_ERR(mpr_shutdown(true), MPR_ERR_SHUTDOWN);
}

int main(int argc, char **argv) {
    int provided, rank, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    CHECK(provided == MPI_THREAD_MULTIPLE);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    CHECK(size == 2);
    const double limit_s = 0.5;

    CHECK_OK(mpr_register_function("echo", fn_echo, NULL));
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.shutdown_timeout_s = limit_s;
    CHECK_OK(mpr_init(&opts));

    /* A normal call each way first. */
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_int(40 + rank)), *r = NULL;
    CHECK_OK(mpr_rpc_sync(mpr_to_rank(1 - rank), "echo", args, 10.0, &r));
    int64_t v = -1;
    CHECK_OK(mpr_value_get_int(r, &v));
    CHECK(v == 40 + rank);
    mpr_value_release(r);
    mpr_value_release(args);
    mpitest_barrier();

    int token = 0;
    MPI_Request req;
    if (rank == 0) {
        timed_out_shutdown(limit_s);
        token = 7;
        MPI_Isend(&token, 1, MPI_INT, 1, 5, MPI_COMM_WORLD, &req);
        host_wait(&req);
    } else {
        MPI_Irecv(&token, 1, MPI_INT, 0, 5, MPI_COMM_WORLD, &req);
        host_wait(&req);
        CHECK(token == 7);
        /* Rank 0 no longer serves calls. */
        args = mpr_value_list_of(1, mpr_value_new_int(3));
        r = NULL;
        CHECK_ERR(mpr_rpc_sync(mpr_to_rank(0), "echo", args, 0.3, &r), MPR_ERR_TIMEOUT);
        CHECK(r == NULL);
        mpr_value_release(args);
        timed_out_shutdown(limit_s);
    }

    /* The host's MPI is intact. */
    int mine = rank + 1, sum = 0;
    MPI_Iallreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &req);
    host_wait(&req);
    CHECK(sum == 3);
    mpitest_barrier();
    if (rank == 0) printf("[ok] graceful shutdown timeout on both ranks\n1 passed, 0 failed\n"), fflush(stdout);
    MPI_Finalize();
    return 0;
}
