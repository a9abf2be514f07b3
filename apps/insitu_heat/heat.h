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
 * Decomposition (heat_decomp_t):
 *   HEAT_STRIPS: rows in contiguous strips, one per rank of `comm` (the
 *     first ny % size ranks get one row more); halos: two blocking
 *     MPI_Sendrecv of whole rows per step.
 *   HEAT_2D: a py x px process grid from MPI_Dims_create on a Cartesian
 *     communicator (MPI_Cart_create, not periodic, reorder = 0 so cart rank
 *     == rank of `comm`), rows and columns split like the strips' rows.
 *     Halos: non-blocking MPI_Irecv/MPI_Isend with the 8 neighbours (rows as
 *     contiguous doubles, columns as an MPI_Type_vector, the 4 corner cells
 *     as single doubles — the stencil does not need the corners, the
 *     learner's 3x3 filters do); the subdomain's inner cells (those that
 *     read no halo) are updated while the messages travel, then
 *     MPI_Waitall and the ring of cells along the halo.
 *   HEAT_AUTO: HEAT_2D when the process grid divides the grid evenly
 *     (ny % py == 0 and nx % px == 0), else HEAT_STRIPS.
 * Every rank stores its block with a one-cell frame: (rows + 2) x (cols + 2)
 * doubles, row-major, stride cols + 2; frame cells are halos from the
 * neighbours or the wall (0). One step: halo exchange, the update into the
 * second buffer, the global residual sqrt(sum (u' - u)^2) with
 * MPI_Allreduce, then the buffers swap. After a step, heat_prev() is the
 * state before it (its halos filled) and heat_cur() the state after it
 * (interior valid, halos not yet exchanged): a (state, next state) pair
 * ready to be read.
 *
 * Invariants: frame cells on a wall are 0 in both buffers at all times
 * (receives from MPI_PROC_NULL leave them alone). Every cell's update is the
 * same expression of the same five values (one static function for every
 * path), so the field is bit-identical across decompositions and rank
 * counts; only the residual's summation order (its last bits) differs.
 * Ownership: heat_create allocates (and creates the Cartesian communicator
 * and datatype), heat_destroy frees them (NULL-safe). */
#ifndef INSITU_HEAT_HEAT_H
#define INSITU_HEAT_HEAT_H

#include <mpi.h>
#include <stdint.h>

typedef enum { HEAT_AUTO, HEAT_STRIPS, HEAT_2D } heat_decomp_t;

typedef struct heat {
    MPI_Comm comm; /* HEAT_STRIPS: borrowed (the host's simulation communicator); HEAT_2D: owned Cartesian one */
    heat_decomp_t decomp; /* HEAT_STRIPS or HEAT_2D after create */
    int rank, size;
    int nx, ny;         /* global interior size */
    int py, px;         /* process grid (strips: size x 1) */
    int row0, col0;     /* first global row / column of this rank's block */
    int rows, cols;     /* size of the block (>= 1 each) */
    double r;           /* alpha dt / dx^2 */
    double q;           /* k dt, the source term's rate */
    int up, down, left, right;              /* neighbours, MPI_PROC_NULL at the walls */
    int up_left, up_right, down_left, down_right; /* diagonal neighbours (HEAT_2D) */
    MPI_Datatype column; /* HEAT_2D: `rows` doubles with stride cols + 2 */
    double *cur, *prev;  /* (rows + 2) x (cols + 2) each */
} heat_t;

/* NULL (message on stderr) if the grid cannot be split (fewer rows or
 * columns than ranks along them), r outside (0, 0.25], q outside [0, 1] or
 * no memory. Collective over comm. */
heat_t *heat_create(MPI_Comm comm, int nx, int ny, double r, double q, uint64_t seed, heat_decomp_t decomp);
void heat_destroy(heat_t *h);

/* One time step; *residual (may be NULL) gets the global residual. MPI errors abort (MPI_ERRORS_ARE_FATAL). */
void heat_step(heat_t *h, double *residual);

/* Row stride of both buffers (cols + 2). */
static inline int heat_stride(const heat_t *h) { return h->cols + 2; }

/* "strips" or "2d". */
const char *heat_decomp_name(heat_decomp_t d);

/* Global checksum of the interior, the same bits on every rank and for every
 * decomposition: the sum mod 2^64 over the cells of mix(global index, the
 * value's bits) (mix: splitmix64), and the sum of the interior values (its
 * last bits depend on the decomposition: summation order). Collective. */
void heat_checksum(const heat_t *h, uint64_t *hash, double *sum);

/* Write the interior (ny x nx doubles, row-major, native byte order) to
 * `path` with MPI-IO, collectively. Returns 0, or -1 with a message on stderr. */
int heat_write_field(const heat_t *h, const char *path);
/* Read such a file into the interior (a restart), collectively; the file
 * must hold exactly ny x nx doubles. Returns 0, or -1 with a message. */
int heat_read_field(heat_t *h, const char *path);

#endif
