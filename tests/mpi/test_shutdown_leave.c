/* test_shutdown_leave.c — mpr_shutdown(false) stops one rank now, and what
 * its peers see; mpr_shutdown inside a handler or a callback is refused.
 * Run with 3 ranks; mpirpc initializes MPI (so the departed rank's
 * MPI_Finalize is left to process exit).
 *
 * 1. Inside a handler (rank 1) and inside a future callback (rank 0),
 *    mpr_shutdown(true/false) returns MPR_ERR_STATE, changes nothing, and
 *    the handler's caller gets its reply.
 * 2. Rank 2 leaves with mpr_shutdown(false) while rank 0 waits for a slow
 *    call to it: that call fails with MPR_ERR_SHUTDOWN ("left the job") long
 *    before the handler would have replied; rank 2's mpr_shutdown returns
 *    while ranks 0 and 1 are still running (it tells them so with a plain MPI
 *    message they wait for before going on); new calls to rank 2 fail at once
 *    with MPR_ERR_SHUTDOWN ("has left the job"); ranks 0 and 1 then shut down
 *    gracefully without it, well before their shutdown timeout. */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "mpitest.h"

static atomic_int slow_started;
static pthread_t main_thread;
static atomic_int callback_code = -1;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* slow(ms) -> 7 after ms milliseconds */
static mpr_err_t fn_slow(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t ms = 0;
    mpr_err_t e = mpr_args_int(args, 0, &ms);
    if (e) return e;
    atomic_store(&slow_started, 1);
    usleep((useconds_t)ms * 1000);
    *result = mpr_value_new_int(7);
    return MPR_OK;
}

static mpr_err_t fn_echo(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    *result = mpr_value_retain((mpr_value_t *)args);
    return MPR_OK;
}

/* shutdown_inside() -> [code of mpr_shutdown(true), code of mpr_shutdown(false)] */
static mpr_err_t fn_shutdown_inside(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    mpr_err_t a = mpr_shutdown(true);
    CHECK_CONTAINS(mpr_last_error(), "inside a handler or callback");
    mpr_err_t b = mpr_shutdown(false);
    *result = mpr_value_list_of(2, mpr_value_new_int(a), mpr_value_new_int(b));
    return MPR_OK;
}

static mpr_err_t then_shutdown(mpr_future_t *parent, void *user_data, mpr_value_t **result) {
    CHECK(!pthread_equal(pthread_self(), main_thread)); /* a callback, not the caller */
    atomic_store(&callback_code, mpr_shutdown(true));
    *result = NULL;
    return MPR_OK;
}

/* A plain MPI message on MPI_COMM_WORLD, received without spinning. */
static void host_recv_token(int src) {
    int token = 0;
    MPI_Request req;
    MPI_Irecv(&token, 1, MPI_INT, src, 9, MPI_COMM_WORLD, &req);
    for (int done = 0; !done;) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (!done) usleep(500);
    }
    CHECK(token == 42);
}

static void call_fails_as_departed(int dst) {
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_int(1)), *r = NULL;
    double t0 = now_s();
    CHECK_ERR(mpr_rpc_sync(mpr_to_rank(dst), "echo", args, 10, &r), MPR_ERR_SHUTDOWN);
    CHECK(r == NULL && now_s() - t0 < 5.0); /* failed at once, not by the 10 s timeout */
    CHECK_CONTAINS(mpr_last_error(), "worker2 (rank 2) has left the job");
    mpr_value_release(args);
}

int main(int argc, char **argv) {
    main_thread = pthread_self();
    CHECK_OK(mpr_register_function("slow", fn_slow, NULL));
    CHECK_OK(mpr_register_function("echo", fn_echo, NULL));
    CHECK_OK(mpr_register_function("shutdown_inside", fn_shutdown_inside, NULL));
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = &argc;
    opts.argv = &argv;
    opts.shutdown_timeout_s = 30;
    CHECK_OK(mpr_init(&opts));
    int rank = mpitest_rank(), size = mpr_world_size();
    CHECK(size == 3);

    /* 1. mpr_shutdown inside a handler and inside a callback */
    if (rank == 0) {
        mpr_value_t *r = NULL;
        CHECK_OK(mpr_rpc_sync(mpr_to_rank(1), "shutdown_inside", NULL, 10, &r));
        int64_t a = 0, b = 0;
        CHECK_OK(mpr_value_get_int(mpr_value_list_get(r, 0), &a));
        CHECK_OK(mpr_value_get_int(mpr_value_list_get(r, 1), &b));
        CHECK(a == MPR_ERR_STATE && b == MPR_ERR_STATE);
        mpr_value_release(r);
        mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_int(300));
        mpr_future_t *f = mpr_rpc_async(mpr_to_rank(1), "slow", args, 10); /* not done for 0.3 s */
        mpr_future_t *g = mpr_future_then(f, then_shutdown, NULL);
        CHECK(g != NULL);
        CHECK_OK(mpr_future_wait(g, 10));
        CHECK(atomic_load(&callback_code) == MPR_ERR_STATE);
        mpr_future_release(g);
        mpr_future_release(f);
        CHECK_OK(mpr_rpc_sync(mpr_to_rank(1), "echo", args, 10, &r)); /* rank 1 still serves */
        mpr_value_release(r);
        mpr_value_release(args);
        CHECK(mpr_is_running());
    }
    mpitest_barrier();
    if (rank == 0) printf("[ok] mpr_shutdown inside a handler or callback: MPR_ERR_STATE\n"), fflush(stdout);

    /* 2. rank 2 leaves */
    if (rank == 2) {
        for (int i = 0; i < 10000 && !atomic_load(&slow_started); i++) usleep(1000);
        CHECK(atomic_load(&slow_started));
        CHECK_OK(mpr_shutdown(false));
        /* Back while ranks 0 and 1 still run: tell them. */
        int token = 42;
        MPI_Send(&token, 1, MPI_INT, 0, 9, MPI_COMM_WORLD);
        MPI_Send(&token, 1, MPI_INT, 1, 9, MPI_COMM_WORLD);
        mpr_value_t *r = NULL;
        CHECK_ERR(mpr_rpc_sync(mpr_to_rank(0), "echo", NULL, 1, &r), MPR_ERR_SHUTDOWN);
        CHECK_ERR(mpr_shutdown(false), MPR_ERR_SHUTDOWN);
        CHECK_ERR(mpr_init(&opts), MPR_ERR_SHUTDOWN); /* MPI is finalized at exit */
        CHECK_CONTAINS(mpr_last_error(), "finalized at exit");
        mpr_registry_clear();
        return 0; /* MPI_Finalize runs at exit */
    }
    if (rank == 0) {
        double t0 = now_s();
        mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_int(2000));
        mpr_future_t *f = mpr_rpc_async(mpr_to_rank(2), "slow", args, 30);
        mpr_value_release(args);
        mpr_value_t *v = NULL;
        CHECK_ERR(mpr_future_get(f, 30, &v), MPR_ERR_SHUTDOWN);
        double took = now_s() - t0;
        CHECK_CONTAINS(mpr_last_error(), "left the job");
        printf("[ok] a pending call to the departed rank failed after %.3f s: %s\n", took, mpr_last_error());
        CHECK(took < 1.9); /* the handler takes 2 s; its reply would have been 7, not an error */
        mpr_future_release(f);
    }
    host_recv_token(2);
    call_fails_as_departed(2);
    double t0 = now_s();
    CHECK_OK(mpr_shutdown(true));
    double took = now_s() - t0;
    if (rank == 0) printf("[ok] graceful shutdown without the departed rank took %.3f s\n", took);
    CHECK(took < 20.0); /* not waiting for rank 2 until the 30 s timeout */
    if (rank == 0) printf("1 passed, 0 failed\n");
    mpr_registry_clear();
    return 0;
}
