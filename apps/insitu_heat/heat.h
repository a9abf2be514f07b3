/* apps/insitu_heat/heat.h — the simulation of insitu_heat: the 2-D heat
 * equation, solved the way an ordinary MPI code solves it, with no mpirpc in
 * it at all (plain MPI on the communicator the host gives it).
 *
 * Model: the heat equation with a logistic heat source (Fisher-KPP
 * reaction-diffusion), u_t = alpha (u_xx + u_yy) + k u (1 - u), on an
 * ny x nx grid, explicit FTCS steps
 *   u'[i][j] = u[i][j] + r (u[i-1][j] + u[i+1][j] + u[i][j-1] + u[i][j+1] - 4 u[i][j])
 *              + q u[i][j] (1 - u[i][j])
 * with r = alpha dt / dx^2 <= 0.25 (stable) and q = k dt (q = 0: the plain
 * heat equation). Dirichlet walls held at 0. Initial state: a few
 * Gaussian hot spots drawn from the seed in global coordinates, so the
 * field does not depend on the decomposition.
 *
 * Decomposition: rows in contiguous strips, one per rank of `comm` (the
 * first ny % size ranks get one row more). Each rank stores its strip with a
 * one-cell frame: (rows + 2) x (nx + 2) doubles, row-major; frame rows are
 * halos from the neighbours (or the wall), frame columns the side walls.
 * One step: halo exchange with MPI_Sendrecv, the update into the second
 * buffer, the global residual sqrt(sum (u' - u)^2) with MPI_Allreduce, then
 * the buffers swap. After a step, heat_prev() is the state before it (its
 * halos filled) and heat_cur() the state after it (interior valid, halos
 * not yet exchanged): a (state, next state) pair ready to be read.
 *
 * Invariants: the frame columns are 0 in both buffers at all times, and so
 * are the frame rows at the top and bottom walls (MPI_Sendrecv with
 * MPI_PROC_NULL leaves them alone). Nothing here
 * depends on anything but the arguments, so the same arguments on the same
 * number of ranks give the same bits. Ownership: heat_create allocates,
 * heat_destroy frees (NULL-safe). */
#ifndef INSITU_HEAT_HEAT_H
#define INSITU_HEAT_HEAT_H

#include <mpi.h>
#include <stdint.h>

typedef struct heat {
    MPI_Comm comm; /* borrowed: the host's simulation communicator */
    int rank, size;
    int nx, ny;   /* global interior size */
    int row0;     /* first global row of this rank's strip */
    int rows;     /* rows of the strip (>= 1) */
    double r;     /* alpha dt / dx^2 */
    double q;     /* k dt, the source term's rate */
    int up, down; /* neighbour ranks, MPI_PROC_NULL at the walls */
    double *cur, *prev; /* (rows + 2) x (nx + 2) each */
} heat_t;

/* NULL (message on stderr) if ny < size of comm, r outside (0, 0.25], q outside [0, 1] or no memory. */
heat_t *heat_create(MPI_Comm comm, int nx, int ny, double r, double q, uint64_t seed);
void heat_destroy(heat_t *h);

/* One time step; *residual (may be NULL) gets the global residual. MPI errors abort (MPI_ERRORS_ARE_FATAL). */
void heat_step(heat_t *h, double *residual);

/* Row stride of both buffers (nx + 2). */
static inline int heat_stride(const heat_t *h) { return h->nx + 2; }

/* Global checksum of the interior (FNV-1a over each rank's bytes, combined
 * in rank order on every rank) and the sum of the interior values. */
void heat_checksum(const heat_t *h, uint64_t *hash, double *sum);

/* Write the interior (ny x nx doubles, row-major, native byte order) to
 * `path` with MPI-IO, collectively. Returns 0, or -1 with a message on stderr. */
int heat_write_field(const heat_t *h, const char *path);

#endif
