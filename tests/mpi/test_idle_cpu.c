/* test_idle_cpu.c — an initialized rank with no traffic must not hold a core:
 * after some calls (so the pool and progress thread have been hot), each rank
 * measures its own CPU time over 2 s of idleness and must stay under 5% of
 * one core. CPU time, not wall time, is asserted, so machine load does not
 * make this flaky. */
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "mpitest.h"

static mpr_err_t fn_noop(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    *result = NULL;
    return MPR_OK;
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    CHECK_OK(mpr_register_function("noop", fn_noop, NULL));
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = &argc;
    opts.argv = &argv;
    opts.progress_thread_pu = 0; /* also exercise the hwloc binding */
    CHECK_OK(mpr_init(&opts));
    int rank = mpitest_rank(), size = mpr_world_size();
    mpr_debug_info_t info;
    CHECK_OK(mpr_get_debug_info(&info));
    CHECK_CONTAINS(info.progress_binding, "PU 0");
    for (int i = 0; i < 2000; i++) {
        mpr_value_t *r;
        CHECK_OK(mpr_rpc_sync(mpr_to_rank((rank + 1) % size), "noop", NULL, 30, &r));
        mpr_value_release(r);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    sleep(1); /* back-off reaches its idle state */
    double c0 = cpu_seconds(), w0 = wall_seconds();
    sleep(2);
    double pct = 100.0 * (cpu_seconds() - c0) / (wall_seconds() - w0);
    printf("[rank %d] idle CPU over 2 s: %.2f%% of one core\n", rank, pct);
    CHECK(pct < 5.0);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK_OK(mpr_shutdown(true));
    if (rank == 0) printf("1 passed, 0 failed\n");
    mpr_registry_clear();
    return 0;
}
