/* test_host_comm.c — mpirpc inside a host MPI program: the host initializes
 * MPI itself and splits MPI_COMM_WORLD; the first half runs mpirpc on its
 * sub-communicator while the other half (and the first half, from its main
 * thread) exchange their own wildcard-received MPI messages on
 * MPI_COMM_WORLD. Neither side may see the other's traffic; mpirpc never
 * finalizes the host's MPI. Run with 4 ranks. */
#include <signal.h>

#include "mpitest.h"

static mpr_err_t fn_square(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t x;
    mpr_err_t e = mpr_args_int(args, 0, &x);
    if (e) return e;
    *result = mpr_value_new_int(x * x);
    return MPR_OK;
}

/* Host traffic: a ring of wildcard receives on MPI_COMM_WORLD, tag 0. */
static void host_ring(int rank, int size, int rounds) {
    for (int i = 0; i < rounds; i++) {
        int out = rank * 100000 + i, in = -1;
        MPI_Status st;
        MPI_Sendrecv(&out, 1, MPI_INT, (rank + 1) % size, 0, &in, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG,
                     MPI_COMM_WORLD, &st);
        int from = (rank + size - 1) % size;
        CHECK(st.MPI_SOURCE == from && st.MPI_TAG == 0 && in == from * 100000 + i);
    }
}

int main(int argc, char **argv) {
    int provided, rank, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    CHECK(provided == MPI_THREAD_MULTIPLE);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    CHECK(size >= 4);
    int half = rank < size / 2;
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, half ? 0 : 1, rank, &sub);
    if (half) {
        CHECK_OK(mpr_register_function("square", fn_square, NULL));
        mpr_init_options_t opts;
        mpr_init_options_default(&opts);
        opts.comm = sub;
        char name[32];
        snprintf(name, sizeof name, "sim-%d", rank);
        opts.name = name;
        CHECK_OK(mpr_init(&opts));
        CHECK(mpr_world_size() == size / 2);
        struct sigaction sa; /* the host started MPI: mpirpc leaves its signals alone */
        CHECK(sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL);
        mpr_worker_info_t self;
        CHECK_OK(mpr_get_self_worker_info(&self));
        CHECK(strcmp(self.name, name) == 0);
    }
    /* Host traffic on MPI_COMM_WORLD while mpirpc calls fly on the sub-communicator. */
    host_ring(rank, size, 200);
    if (half) {
        int sub_size = size / 2;
        for (int i = 0; i < 500; i++) {
            char peer[32];
            snprintf(peer, sizeof peer, "sim-%d", (rank + 1 + i) % sub_size);
            mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_int(i)), *r;
            CHECK_OK(mpr_rpc_sync(mpr_to_name(peer), "square", args, 30, &r));
            int64_t x;
            CHECK_OK(mpr_value_get_int(r, &x));
            CHECK(x == (int64_t)i * i);
            mpr_value_release(r);
            mpr_value_release(args);
        }
    }
    host_ring(rank, size, 200);
    if (half) CHECK_OK(mpr_shutdown(true));
    /* the host's MPI is alive and its communicators still work */
    int finalized = 1;
    MPI_Finalized(&finalized);
    CHECK(!finalized);
    int one = 1, sum = 0;
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, sub);
    CHECK(sum == size / 2);
    host_ring(rank, size, 10);
    if (rank == 0) printf("1 passed, 0 failed\n");
    MPI_Comm_free(&sub);
    mpr_registry_clear();
    MPI_Finalize();
    return 0;
}
