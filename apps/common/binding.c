/* binding.c — cores for compute ranks (app.h app_bind_compute_rank): a rank
 * that computes (a pipeline stage) and that its launcher left free to run on
 * more cores than its share is bound, all its threads, to its share of its
 * host's cores (one core each when the stages fill the host).
 *
 * Why: ranks that float over a host's cores follow each other's wake-ups.
 * Linux places a woken thread near its waker, so the thread of a stage that
 * receives a message (its progress thread, then the pool thread that runs the
 * work) lands on the core of the stage that sent it and displaces that
 * stage's compute, while the waker waits for a core. With the two stages of
 * the pipeline app and its driver on 2 cores (mpirun --bind-to none, or Open
 * MPI's default socket binding for more than 2 ranks), a backward request
 * from stage 2 reached stage 1 after a median 1.2-1.8 ms, and 0.07-0.74 ms
 * with each stage bound to a core of its own; a mini-batch (S = 2, M = 8)
 * took 0.852x the time (median of 10 alternated pairs, every pair faster).
 * A stage's other threads mostly wait, so sharing its core with them costs
 * little.
 *
 * Which cores: an equal share of those the process may use for each compute
 * rank of its host, at least one: with n compute ranks and c cores, the
 * i-th gets cores [i*s, (i+1)*s) in hwloc's order, s = c / n (with more
 * ranks than cores, core i mod c). A host's only compute rank keeps every
 * core (S = 1 beside the driver: one core would only take the second from
 * its own helper threads; measured 1.024x the time bound, 8 alternated
 * pairs, within the noise, so the only stage runs as the launcher placed
 * it, as before --bind-stages existed). Ranks that do not compute (the
 * driver) and ranks bound to no more cores than their share (mpirun
 * --bind-to core, srun --cpu-bind=cores, a rankfile) keep their placement:
 * the launcher's binding is the user's choice.
 *
 * Invariants: collective over MPI_COMM_WORLD (every rank calls it once,
 * right after mpr_init, or none does); the binding only ever narrows the
 * process's cpuset to a subset of what it was; on any hwloc failure the
 * process keeps its placement and the failure is returned (the caller
 * reports it and goes on), never fatal. */
#include <hwloc.h>
#include <stdio.h>
#include <string.h>

#include "app.h"

/* Bind this process to its share of the cores it may use: the `index`-th of
 * `total` equal shares, at least one core (round robin past the core
 * count); its description into `what`. Returns the first core's logical
 * index (*bound: how many), -1 when the process was left as it was by
 * design, -2 when hwloc failed (also left as it was). */
static int bind_to_share(int index, int total, int *bound, char *what, size_t cap) {
    *bound = 0;
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0) {
        snprintf(what, cap, "left as launched (hwloc could not start)");
        return -2;
    }
    int chosen = -1;
    hwloc_bitmap_t allowed = hwloc_bitmap_alloc(), target = hwloc_bitmap_alloc();
    if (!allowed || !target || hwloc_topology_load(topo) != 0 ||
        hwloc_get_cpubind(topo, allowed, HWLOC_CPUBIND_PROCESS) != 0) {
        snprintf(what, cap, "left as launched (hwloc could not read the binding)");
        chosen = -2;
        goto done;
    }
    int ncores = 0;
    for (hwloc_obj_t core = NULL; (core = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_CORE, core));)
        ncores += hwloc_bitmap_intersects(core->cpuset, allowed);
    int share = total > 0 && ncores / total > 1 ? ncores / total : 1;
    if (ncores <= share) {
        snprintf(what, cap, "left as launched (%d cores to use, %d for it)", ncores, share);
        goto done;
    }
    int from = (index * share) % ncores, seen = 0;
    hwloc_bitmap_zero(target);
    for (hwloc_obj_t core = NULL; (core = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_CORE, core));) {
        if (!hwloc_bitmap_intersects(core->cpuset, allowed)) continue;
        int at = seen++;
        if (at < from || at >= from + share) continue;
        if (chosen < 0) chosen = (int)core->logical_index;
        hwloc_bitmap_or(target, target, core->cpuset);
        (*bound)++;
    }
    hwloc_bitmap_and(target, target, allowed);
    if (chosen < 0 || hwloc_set_cpubind(topo, target, HWLOC_CPUBIND_PROCESS) != 0) {
        snprintf(what, cap, "left as launched (binding to %d cores failed)", share);
        chosen = -2;
        *bound = 0;
    } else {
        snprintf(what, cap, "bound to %d core(s) from core %d, of the %d it could use", *bound, chosen, ncores);
    }
done:
    hwloc_bitmap_free(allowed);
    hwloc_bitmap_free(target);
    hwloc_topology_destroy(topo);
    return chosen;
}

mpr_err_t app_bind_compute_rank(bool compute, int *core, int *ncores, char *what, size_t cap) {
    *core = -1;
    *ncores = 0;
    snprintf(what, cap, "left as launched (not a compute rank)");
    MPI_Comm host;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host) != MPI_SUCCESS)
        return mpr_error_set(MPR_ERR_MPI, "binding: MPI_Comm_split_type failed");
    int mine = compute ? 1 : 0, before = 0, total = 0, host_rank = 0;
    MPI_Comm_rank(host, &host_rank);
    int rc = MPI_Exscan(&mine, &before, 1, MPI_INT, MPI_SUM, host);
    if (rc == MPI_SUCCESS) rc = MPI_Allreduce(&mine, &total, 1, MPI_INT, MPI_SUM, host);
    MPI_Comm_free(&host);
    if (rc != MPI_SUCCESS) return mpr_error_set(MPR_ERR_MPI, "binding: MPI_Exscan/MPI_Allreduce failed");
    if (host_rank == 0) before = 0; /* MPI_Exscan leaves the first rank's result undefined */
    if (!compute) return MPR_OK;
    *core = bind_to_share(before, total, ncores, what, cap);
    if (*core == -2) {
        *core = -1;
        return mpr_error_set(MPR_ERR_UNSUPPORTED, "binding: %s", what);
    }
    return MPR_OK;
}
