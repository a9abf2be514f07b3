/* mpi_tuning.c — the one Open MPI setting mpirpc chooses for an MPI it starts
 * itself: eager messages on one host are sent by copy, not "in place".
 *
 * Why: Open MPI's ob1 sends a message of at most 256 bytes inline (sendi:
 * written straight into the peer's shared-memory fast box, complete when
 * MPI_Isend returns), a number fixed in its source. A bigger eager message
 * to a rank of the same host takes vader's in-place path (the "inplace"
 * BTL flag): a fragment of the sender's segment is posted to the
 * receiver's FIFO and handed back once read, so the send stays in flight
 * (transport.c tests it at every poll) until the receiver has consumed it,
 * and both sides do the extra hand-back. Messages carrying a small tensor
 * (an 8x8 f32 tensor is 256 bytes of data alone) are all over 256 bytes.
 * Without "inplace" ob1 copies them the way it copies the small ones:
 * into the fast box, done at once. Large messages are unaffected (their
 * rendezvous uses vader's put/get, which stay). Measured on the 2-core
 * development machine, each kind of call timed in turn in one loop (4 runs
 * each way, alternated): the 8x8 distributed autograd step (three of its
 * four messages carry a tensor) took 3.38-3.58 no-op round trips against
 * 3.59-3.83, an echo of an 8x8 tensor 1.17-1.26 against 1.25-1.30; the
 * polling of sends in flight fell from ~2,500 to ~500 instructions a step
 * on the worker that answers.
 *
 * Rules (mpri_mpi_tune_before_init, called just before MPI_Init_thread):
 * - only when mpr_init starts MPI: a host that initialised MPI keeps its
 *   settings (it may pass `--mca btl_vader_flags send,put,get,atomics,
 *   fetching-atomics` to mpirun for the same effect);
 * - only Open MPI 3.x and 4.x (their shared-memory BTL is vader; checked with
 *   MPI_Get_library_version, which may be called before MPI_Init) on x86-64
 *   and AArch64, where vader's default flags are
 *   send,put,get,inplace,atomics,fetching-atomics; vader itself drops put and
 *   get when no single-copy mechanism works;
 * - never over a choice someone made: nothing is set when the environment
 *   names the parameter (OMPI_MCA_btl_vader_flags; `mpirun --mca` passes its
 *   parameters that way), names other parameter files
 *   (OMPI_MCA_mca_base_param_files), when one of Open MPI's parameter files
 *   mentions btl_vader_flags (/etc/openmpi, $OPAL_SYSCONFDIR,
 *   $OPAL_PREFIX/etc, ~/.openmpi), or when MPIRPC_KEEP_MPI_DEFAULTS is set;
 * - the variable exists only for MPI_Init_thread: mpri_mpi_tune_after_init
 *   removes it, so programs this process starts do not inherit it (setenv
 *   is not safe beside threads reading the environment: like MPI_Init
 *   itself, mpr_init comes before a program starts such threads).
 *
 * Invariant: after mpri_mpi_tune_after_init the environment is as it was
 * before mpri_mpi_tune_before_init (only a variable this file set is
 * removed). */
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_runtime.h"

#define FLAGS_VAR "OMPI_MCA_btl_vader_flags"
#define FLAGS_VALUE "send,put,get,atomics,fetching-atomics"

static bool set_here;   /* FLAGS_VAR was set by mpri_mpi_tune_before_init */
static bool applied;    /* the last MPI this process started got FLAGS_VALUE from here */

/* The running library is Open MPI 3.x or 4.x. */
static bool open_mpi_with_vader(void) {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (MPI_Get_library_version(version, &len) != MPI_SUCCESS) return false;
    version[len < MPI_MAX_LIBRARY_VERSION_STRING ? len : MPI_MAX_LIBRARY_VERSION_STRING - 1] = '\0';
    return strncmp(version, "Open MPI v4.", 12) == 0 || strncmp(version, "Open MPI v3.", 12) == 0;
}

/* `path` exists and mentions the vader flags parameter. */
static bool file_mentions_flags(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[1024];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        const char *p = line + strspn(line, " \t");
        if (*p != '#' && strstr(p, "btl_vader_flags")) found = true;
    }
    fclose(f);
    return found;
}

/* One of Open MPI's usual parameter files sets the flags. */
static bool param_files_set_flags(void) {
    char path[4096];
    if (file_mentions_flags("/etc/openmpi/openmpi-mca-params.conf")) return true;
    const char *dirs[] = {getenv("OPAL_SYSCONFDIR"), getenv("OPAL_PREFIX")};
    for (int i = 0; i < 2; i++) {
        if (!dirs[i] || !*dirs[i]) continue;
        snprintf(path, sizeof path, "%s%s/openmpi-mca-params.conf", dirs[i], i == 1 ? "/etc" : "");
        if (file_mentions_flags(path)) return true;
    }
    const char *home = getenv("HOME");
    if (home && *home) {
        snprintf(path, sizeof path, "%s/.openmpi/mca-params.conf", home);
        if (file_mentions_flags(path)) return true;
    }
    return false;
}

void mpri_mpi_tune_before_init(void) {
    set_here = applied = false;
#if defined(__x86_64__) || defined(__aarch64__)
    if (getenv("MPIRPC_KEEP_MPI_DEFAULTS") || getenv(FLAGS_VAR) || getenv("OMPI_MCA_mca_base_param_files"))
        return;
    if (!open_mpi_with_vader() || param_files_set_flags()) return;
    if (setenv(FLAGS_VAR, FLAGS_VALUE, 0) == 0) set_here = applied = true;
#endif
}

void mpri_mpi_tune_after_init(void) {
    if (set_here) unsetenv(FLAGS_VAR);
    set_here = false;
}

bool mpri_mpi_tuned(void) { return applied; }
