/* test_init_errors.c — bad and duplicate worker names fail mpr_init on every
 * rank with the same clear error (no rank hangs), after which a correct init
 * works; an insufficient MPI thread level is named in the error. The host
 * initializes MPI (so a failed init can be retried). Run with 3 ranks. */
#include "mpitest.h"

int main(int argc, char **argv) {
    int provided, rank;
    int want = (argc > 1 && strcmp(argv[1], "serialized") == 0) ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE;
    MPI_Init_thread(&argc, &argv, want, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    if (want == MPI_THREAD_SERIALIZED) {
        if (provided == MPI_THREAD_MULTIPLE) {
            if (rank == 0) printf("MPI gave MPI_THREAD_MULTIPLE anyway; nothing to check\n0 passed, 0 failed, 1 skipped\n");
        } else {
            CHECK_ERR(mpr_init(&opts), MPR_ERR_MPI);
            CHECK_CONTAINS(mpr_last_error(), "MPI_THREAD_MULTIPLE");
            if (rank == 0) printf("1 passed, 0 failed\n");
        }
        MPI_Finalize();
        return 0;
    }

    /* rank 1 has an invalid name: every rank fails and names rank 1 */
    char name[64];
    snprintf(name, sizeof name, rank == 1 ? "bad name!" : "w%d", rank);
    opts.name = name;
    CHECK_ERR(mpr_init(&opts), MPR_ERR_INVALID_ARG);
    CHECK_CONTAINS(mpr_last_error(), "rank 1");
    CHECK_CONTAINS(mpr_last_error(), "bad name!");
    CHECK(!mpr_is_running());

    /* ranks 0 and 2 share a name */
    snprintf(name, sizeof name, rank == 1 ? "solo" : "twin");
    CHECK_ERR(mpr_init(&opts), MPR_ERR_INVALID_ARG);
    CHECK_CONTAINS(mpr_last_error(), "duplicate worker name 'twin' on ranks 0 and 2");

    /* a too-long name */
    char longname[200];
    memset(longname, 'x', 150);
    longname[150] = '\0';
    opts.name = rank == 2 ? longname : (snprintf(name, sizeof name, "w%d", rank), name);
    CHECK_ERR(mpr_init(&opts), MPR_ERR_INVALID_ARG);
    CHECK_CONTAINS(mpr_last_error(), "rank 2");

    /* bad options */
    mpr_init_options_t bad = opts;
    bad.num_worker_threads = -1;
    CHECK_ERR(mpr_init(&bad), MPR_ERR_INVALID_ARG);

    /* now a good init, with defaults for the names */
    opts.name = NULL;
    CHECK_OK(mpr_init(&opts));
    CHECK_ERR(mpr_init(&opts), MPR_ERR_ALREADY_INITIALIZED);
    mpr_worker_info_t w;
    CHECK_OK(mpr_get_worker_info("worker2", &w));
    CHECK(w.rank == 2);
    CHECK_OK(mpr_get_worker_info_by_rank(1, &w));
    CHECK(strcmp(w.name, "worker1") == 0);
    CHECK_ERR(mpr_get_worker_info("w9", &w), MPR_ERR_NOT_FOUND);
    CHECK_ERR(mpr_get_worker_info_by_rank(3, &w), MPR_ERR_NOT_FOUND);
    CHECK_OK(mpr_shutdown(true));
    if (rank == 0) printf("1 passed, 0 failed\n");
    MPI_Finalize();
    return 0;
}
