/* blas.c — the apps start on OpenBLAS kernels that fit the CPU
 * (app_blas_choose_kernels, app.h).
 *
 * OpenBLAS picks its kernel set once, when it loads, from the CPU's model
 * number or OPENBLAS_CORETYPE; a CPU newer than the OpenBLAS build gets its
 * generic "Prescott" kernels, 5x slower at sgemm on the Intel Xeon (model
 * 207) this was measured on with Debian 12's OpenBLAS 0.3.21 (30 against 155
 * GFLOPS, one thread, n = 512). An app owns its process, so before MPI
 * starts it executes itself again (its binary, found through
 * /proc/self/exe; same argv and environment, same pid and process name: the
 * launcher sees the same process) with
 * OPENBLAS_CORETYPE set to mpr_blas_better_kernels()'s set.
 *
 * MPIRPC_APP_BLAS_REEXEC_OFF=1 turns the re-execution off: a tool that
 * follows the process only until exec (valgrind without
 * --trace-children=yes) would lose it; the library then prints its advice.
 *
 * Invariants: at most one re-execution (the new process has
 * OPENBLAS_CORETYPE set, so mpr_blas_better_kernels() is "" there); never
 * after MPI_Init (a process in an MPI job must not exec); a failed exec
 * leaves the process running as it was (the library then prints its advice
 * at the first matrix product). The re-executed process's launch rank 0
 * says which set it chose, once. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app.h"
#include "mpirpc/tensor_ops.h"

#define REEXEC_MARK "MPIRPC_APP_BLAS_REEXEC" /* set for the re-executed process: the set it asked for */

void app_blas_choose_kernels(char **argv) {
    const char *mark = getenv(REEXEC_MARK);
    if (mark) { /* the re-executed process */
        if (app_launch_rank() == 0)
            fprintf(stderr, "%s: OpenBLAS did not know this CPU (its generic kernels were several times slower); "
                            "running with OPENBLAS_CORETYPE=%s (OpenBLAS kernels now: %s)\n",
                    argv && argv[0] ? argv[0] : "app", mark, mpr_blas_kernels());
        unsetenv(REEXEC_MARK);
        return;
    }
    const char *off = getenv("MPIRPC_APP_BLAS_REEXEC_OFF");
    if (off && *off && strcmp(off, "0") != 0) return;
    const char *better = mpr_blas_better_kernels();
    int mpi_started = 0;
    MPI_Initialized(&mpi_started);
    if (!*better || mpi_started || !argv || !argv[0]) return;
    if (setenv("OPENBLAS_CORETYPE", better, 1) != 0 || setenv(REEXEC_MARK, better, 1) != 0) return;
    /* The binary's own path, not /proc/self/exe: the process's name (ps,
     * top, pkill, /proc/PID/comm) comes from the path executed. */
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0 && (size_t)n < sizeof self - 1) {
        self[n] = '\0';
    } else {
        snprintf(self, sizeof self, "/proc/self/exe");
    }
    fflush(NULL);
    execv(self, argv);
    /* exec failed: go on with the kernels we have */
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv(REEXEC_MARK);
}
