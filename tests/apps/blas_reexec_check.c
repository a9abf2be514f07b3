/* blas_reexec_check.c — app_blas_choose_kernels (apps/common/blas.c) as the
 * apps use it, run by ctest alone and under mpiexec:
 *   blas_reexec_check alpha "b e t a" [--mpi]
 * Checks, exiting 1 with a message on the first failure:
 * - after the call the process runs on kernels nobody could improve
 *   (mpr_blas_better_kernels() is "");
 * - a re-executed process runs the set it asked for, has the same pid, name
 *   (/proc/self/comm) and arguments (spaces kept), and its launch rank 0
 *   said so once;
 * - with MPIRPC_APP_BLAS_REEXEC_OFF=1 nothing is re-executed and the
 *   kernels stay as OpenBLAS picked them;
 * - with --mpi, MPI then starts and every rank took part (an exec before
 *   MPI_Init is invisible to the launcher).
 * Prints one JSON line: {"reexecuted":…,"kernels":…,"pid_kept":…}. Where
 * OpenBLAS recognises the CPU nothing is re-executed, and the checks that
 * need a re-execution are skipped (the JSON says so). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app.h"
#include "mpirpc/tensor_ops.h"

static int fail(const char *why) {
    fprintf(stderr, "blas_reexec_check: FAILED: %s\n", why);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 3 || strcmp(argv[1], "alpha") != 0 || strcmp(argv[2], "b e t a") != 0)
        return fail("arguments not as given (expected: alpha \"b e t a\" [--mpi])");
    bool mpi = argc > 3 && strcmp(argv[3], "--mpi") == 0;
    char pid_text[32];
    snprintf(pid_text, sizeof pid_text, "%ld", (long)getpid());
    const char *first_pid = getenv("BLAS_CHECK_FIRST_PID"); /* set by the first process only */
    const char *asked = getenv("MPIRPC_APP_BLAS_REEXEC");   /* set in a re-executed process only */
    char asked_copy[32] = "";
    if (asked) snprintf(asked_copy, sizeof asked_copy, "%s", asked);
    if (!first_pid) setenv("BLAS_CHECK_FIRST_PID", pid_text, 1);
    const char *better_before = mpr_blas_better_kernels();
    app_blas_choose_kernels(argv);
    /* Still here: either nothing to choose, or this is the re-executed process. */
    bool reexecuted = asked != NULL;
    const char *off = getenv("MPIRPC_APP_BLAS_REEXEC_OFF");
    if (off && strcmp(off, "1") == 0) {
        if (reexecuted) return fail("re-executed although MPIRPC_APP_BLAS_REEXEC_OFF=1");
        if (strcmp(mpr_blas_better_kernels(), better_before) != 0) return fail("the kernels changed with the re-execution off");
        printf("{\"reexecuted\":false,\"kernels\":\"%s\",\"off\":true,\"ranks\":1}\n", mpr_blas_kernels());
        return 0;
    }
    if (*mpr_blas_better_kernels()) return fail("still on kernels that a better set exists for");
    if (!reexecuted && *better_before) return fail("a better set existed but the program was not re-executed");
    if (reexecuted) {
        if (!first_pid || strcmp(first_pid, pid_text) != 0) return fail("the re-executed process has another pid");
        if (strcmp(mpr_blas_kernels(), asked_copy) != 0) return fail("the re-executed process runs another set");
        if (getenv("MPIRPC_APP_BLAS_REEXEC")) return fail("the re-execution mark was left in the environment");
        char comm[64] = "";
        FILE *f = fopen("/proc/self/comm", "r");
        if (f) {
            if (!fgets(comm, sizeof comm, f)) comm[0] = '\0';
            fclose(f);
        }
        if (strncmp(comm, "blas_reexec_che", 15) != 0) return fail("the re-executed process has another name");
    }
    int size = 1, total = 0;
    if (mpi) {
        int provided;
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
        int one = 1;
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        MPI_Allreduce(&one, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Finalize();
        if (total != size) return fail("not every rank took part in MPI");
    }
    if (app_launch_rank() == 0)
        printf("{\"reexecuted\":%s,\"kernels\":\"%s\",\"pid_kept\":%s,\"ranks\":%d}\n", reexecuted ? "true" : "false",
               mpr_blas_kernels(), reexecuted ? "true" : "null", size);
    return 0;
}
