/* placement.c — --verbose: where every rank of the job runs (app.h
 * app_print_placement): rank -> worker name, host, pid and the cores the
 * process may run on, with the Slurm task ids when Slurm launched it, printed
 * once by rank 0 in rank order, as HPC users check a job's binding.
 *
 * Invariants: collective over MPI_COMM_WORLD (every rank calls it, or none:
 * the apps call it right after mpr_init on every rank); a line is at most
 * LINE bytes (longer ones are cut, never overflow); nothing is printed when
 * --verbose was not given, and no MPI call is made then either. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app.h"
#include "mpirpc/init.h"

#define LINE 512

/* The CPUs in `set` as a list "0-3,8,10-11" into buf. */
static void cpu_list(const cpu_set_t *set, char *buf, size_t cap) {
    size_t used = 0;
    buf[0] = '\0';
    for (int c = 0; c < CPU_SETSIZE && used < cap; c++) {
        if (!CPU_ISSET(c, set)) continue;
        int last = c;
        while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, set)) last++;
        int n = last == c ? snprintf(buf + used, cap - used, "%s%d", used ? "," : "", c)
                          : snprintf(buf + used, cap - used, "%s%d-%d", used ? "," : "", c, last);
        if (n < 0) break;
        used += (size_t)n;
        c = last;
    }
}

/* This rank's line. */
static void describe(char *line, size_t cap) {
    mpr_worker_info_t self;
    char host[128] = "?", cores[256] = "?";
    gethostname(host, sizeof host);
    host[sizeof host - 1] = '\0';
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) cpu_list(&set, cores, sizeof cores);
    bool known = mpr_get_self_worker_info(&self) == MPR_OK;
    int n = snprintf(line, cap, "rank %d: worker %s, host %s, pid %ld, cores %s (%d)", known ? self.rank : -1,
                     known ? self.name : "?", host, (long)getpid(), cores, CPU_COUNT(&set));
    const char *job = getenv("SLURM_JOB_ID");
    if (job && n >= 0 && (size_t)n < cap) {
        const char *task = getenv("SLURM_PROCID"), *local = getenv("SLURM_LOCALID"), *node = getenv("SLURMD_NODENAME");
        snprintf(line + n, cap - (size_t)n, ", slurm job %s task %s (local %s on %s)", job, task ? task : "?",
                 local ? local : "?", node ? node : "?");
    }
}

mpr_err_t app_print_placement(const app_common_t *common, FILE *out) {
    if (!common || !common->verbose) return MPR_OK;
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    char mine[LINE];
    describe(mine, sizeof mine);
    char *all = rank == 0 ? malloc((size_t)size * LINE) : NULL;
    int bad = rank == 0 && !all;
    MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD); /* everyone skips the gather together */
    if (bad) return mpr_error_set(MPR_ERR_NOMEM, "--verbose: out of memory for %d lines", size);
    if (MPI_Gather(mine, LINE, MPI_CHAR, all, LINE, MPI_CHAR, 0, MPI_COMM_WORLD) != MPI_SUCCESS) {
        free(all);
        return mpr_error_set(MPR_ERR_MPI, "--verbose: MPI_Gather of the ranks' placement failed");
    }
    if (rank == 0) {
        for (int r = 0; r < size; r++) fprintf(out ? out : stderr, "%.*s\n", LINE, all + (size_t)r * LINE);
        fflush(out ? out : stderr);
    }
    free(all);
    return MPR_OK;
}
