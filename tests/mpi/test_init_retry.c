/* test_init_retry.c — a failed mpr_init that initialized MPI itself leaves
 * MPI initialized, so a retry succeeds (and the later mpr_shutdown finalizes
 * it); a program that gives up after the failure exits cleanly (mpirpc
 * finalizes the MPI it started at exit, so mpiexec sees a normal end).
 * No MPI_Init here: mpirpc starts MPI. Run with 2 ranks; argument "give-up"
 * runs the second case. */
#include "mpitest.h"

int main(int argc, char **argv) {
    bool give_up = argc > 1 && strcmp(argv[1], "give-up") == 0;
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = &argc;
    opts.argv = &argv;
    opts.name = "same-name"; /* duplicate on both ranks: init fails everywhere */
    CHECK_ERR(mpr_init(&opts), MPR_ERR_INVALID_ARG);
    CHECK_CONTAINS(mpr_last_error(), "duplicate worker name 'same-name'");
    CHECK(!mpr_is_running());
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    CHECK(initialized && !finalized); /* kept for a retry */
    if (give_up) {
        if (mpitest_rank() == 0) printf("[ok] init failed; exiting without a retry\n1 passed, 0 failed\n");
        return 0; /* mpirpc finalizes MPI at exit */
    }

    opts.name = NULL;
    CHECK_OK(mpr_init(&opts));
    mpr_worker_info_t w;
    CHECK_OK(mpr_get_worker_info("worker1", &w));
    CHECK(w.rank == 1);
    CHECK_OK(mpr_barrier(30));
    int rank = mpitest_rank();
    MPITEST_REPORT();
    CHECK_OK(mpr_shutdown(true));
    MPI_Finalized(&finalized);
    if (!finalized) {
        fprintf(stderr, "[rank %d] mpr_shutdown did not finalize the MPI mpirpc started\n", rank);
        return 1;
    }
    return 0;
}
