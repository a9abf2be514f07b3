/* test_doorbell.c — the same-host doorbells (runtime/doorbell.c), 3 ranks.
 *
 * Raw protocol, before mpr_init (MPI alone, the bells set up directly):
 * - a sleeper with a 20 s timeout is woken by a ring within seconds, and the
 *   ringer counts the ring; a ring of a rank that is not asleep is not sent;
 * - a sleep whose arming poll finds work does not sleep;
 * - no lost wake-up: 300 times, rank 0 posts an MPI message to rank 1 and
 *   rings; rank 1 sleeps (5 s timeout) with an MPI probe as the arming poll.
 *   Each round must end long before the timeout, whatever the interleaving;
 * - after fini a ring does nothing and a sleep is a plain timed sleep; a
 *   second init works (a runtime can start again).
 * Through the runtime: calls to a rank idle for 20 ms at a time (its
 * progress thread asleep on its bell) ring it, and every call succeeds. */
#include <stdatomic.h>
#include <unistd.h>

#include "mpitest.h"
#include "mpri_doorbell.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int poll_nothing(void) { return 0; }
static int poll_work(void) { return 1; }

static int probe_from_0(void) {
    int flag = 0;
    MPI_Iprobe(0, 7, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
    return flag;
}

/* Spin until `rank` sleeps on its bell (bounded: a broken arming fails). */
static void wait_until_asleep(int rank) {
    double t0 = now_s();
    while (!mpri_doorbell_is_sleeping(rank)) {
        CHECK(now_s() - t0 < 20.0);
        usleep(100);
    }
}

static void test_raw_protocol(int rank) {
    CHECK(mpri_doorbell_init(MPI_COMM_WORLD));
    CHECK(mpri_doorbell_covers_all()); /* mpiexec on one host */
    mpitest_barrier();

    /* A ring wakes a long sleep. */
    if (rank == 1) {
        double t0 = now_s();
        CHECK(mpri_doorbell_sleep(20000000000LL, poll_nothing) == 0);
        CHECK(now_s() - t0 < 10.0);
        CHECK(!mpri_doorbell_is_sleeping(1));
    } else if (rank == 0) {
        uint64_t before = mpri_doorbell_rings_sent();
        mpri_doorbell_ring(2); /* rank 2 is awake: nothing is sent */
        CHECK(mpri_doorbell_rings_sent() == before);
        wait_until_asleep(1);
        mpri_doorbell_ring(1);
        CHECK(mpri_doorbell_rings_sent() == before + 1);
    } else {
        /* Work found by the arming poll: no sleep at all. */
        double t0 = now_s();
        CHECK(mpri_doorbell_sleep(20000000000LL, poll_work) == 1);
        CHECK(now_s() - t0 < 5.0);
        CHECK(!mpri_doorbell_is_sleeping(2));
    }
    mpitest_barrier();

    /* No lost wake-up: a message posted, then a ring, against a sleeper
     * whose arming poll probes for that message. */
    for (int round = 0; round < 300; round++) {
        if (rank == 0) {
            int v = round;
            MPI_Send(&v, 1, MPI_INT, 1, 7, MPI_COMM_WORLD);
            mpri_doorbell_ring(1);
            int ack;
            MPI_Recv(&ack, 1, MPI_INT, 1, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            CHECK(ack == round);
        } else if (rank == 1) {
            double t0 = now_s();
            while (!probe_from_0()) {
                double t1 = now_s();
                int ev = mpri_doorbell_sleep(5000000000LL, probe_from_0);
                if (now_s() - t0 >= 2.5) fprintf(stderr, "round %d: sleep %.3f s ev %d probe now %d\n", round, now_s() - t1, ev, probe_from_0());
                CHECK(now_s() - t0 < 2.5); /* a lost wake-up would wait out the 5 s */
            }
            int v;
            MPI_Recv(&v, 1, MPI_INT, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            CHECK(v == round);
            MPI_Send(&v, 1, MPI_INT, 0, 8, MPI_COMM_WORLD);
        }
    }
    mpitest_barrier();
    mpri_doorbell_fini();
    CHECK(!mpri_doorbell_covers_all());
    mpri_doorbell_ring(1); /* retired: a ring does nothing, touches nothing */
    { /* without bells a sleep is a plain timed sleep */
        double t0 = now_s();
        CHECK(mpri_doorbell_sleep(2000000, poll_work) == 0);
        CHECK(now_s() - t0 >= 0.0019);
    }
    /* A second set-up, as a second mpr_init makes. */
    CHECK(mpri_doorbell_init(MPI_COMM_WORLD));
    CHECK(mpri_doorbell_covers_all());
    mpitest_barrier();
    mpri_doorbell_fini();
    if (rank == 0) printf("raw protocol: ok\n");
}

static mpr_err_t fn_echo(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    *result = mpr_value_retain((mpr_value_t *)args);
    return MPR_OK;
}

static void test_through_runtime(int rank, int *argc, char ***argv) {
    CHECK_OK(mpr_register_function("echo", fn_echo, NULL));
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = argc;
    opts.argv = argv;
    CHECK_OK(mpr_init(&opts));
    CHECK(mpri_doorbell_covers_all());
    if (rank == 0) {
        uint64_t before = mpri_doorbell_rings_sent();
        for (int i = 0; i < 30; i++) {
            usleep(20000); /* rank 1 idles: its progress thread goes to sleep on its bell */
            mpr_value_t *r = NULL;
            int64_t got = -1;
            mpr_value_t *args = mpr_args_pack("l", (int64_t)i);
            CHECK(args);
            CHECK_OK(mpr_rpc_sync(mpr_to_rank(1), "echo", args, 30, &r));
            mpr_value_release(args);
            CHECK_OK(mpr_value_unpack(r, "[l]", &got));
            CHECK(got == i);
            mpr_value_release(r);
        }
        /* Most calls found rank 1 asleep and rang it (not all need to: a
         * busy host may leave it awake). */
        uint64_t rings = mpri_doorbell_rings_sent() - before;
        printf("rings sent to an idle rank over 30 spaced calls: %llu\n", (unsigned long long)rings);
        CHECK(rings >= 1);
    }
    CHECK_OK(mpr_barrier(60));
    CHECK_OK(mpr_shutdown(true));
    CHECK(!mpri_doorbell_covers_all()); /* retired by the shutdown */
    mpr_registry_clear();
}

int main(int argc, char **argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    int rank = mpitest_rank();
    test_raw_protocol(rank);
    test_through_runtime(rank, &argc, &argv);
    if (rank == 0) printf("2 passed, 0 failed\n");
    MPI_Finalize();
    return 0;
}
