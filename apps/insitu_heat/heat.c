/* apps/insitu_heat/heat.c — the heat-equation solver (see heat.h): strips
 * with MPI_Sendrecv halos, or a 2-D Cartesian decomposition with
 * non-blocking halos overlapped with the inner update; MPI_Allreduce
 * residual; MPI-IO field output and restart. */
#include "heat.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tags name the direction a message travels. */
enum { TAG_TO_UP = 101, TAG_TO_DOWN, TAG_TO_LEFT, TAG_TO_RIGHT, TAG_TO_UL, TAG_TO_UR, TAG_TO_DL, TAG_TO_DR };

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *s) { return (double)(splitmix64(s) >> 11) * 0x1.0p-53; }

/* The initial state: HOT_SPOTS Gaussians with seeded centres, widths, heights. */
enum { HOT_SPOTS = 6 };

static void initial_state(heat_t *h, uint64_t seed) {
    double cx[HOT_SPOTS], cy[HOT_SPOTS], w[HOT_SPOTS], a[HOT_SPOTS];
    uint64_t s = seed;
    for (int k = 0; k < HOT_SPOTS; k++) {
        cx[k] = uniform01(&s) * h->nx;
        cy[k] = uniform01(&s) * h->ny;
        w[k] = (0.03 + 0.07 * uniform01(&s)) * (h->nx < h->ny ? h->nx : h->ny);
        a[k] = 0.5 + uniform01(&s);
    }
    int st = heat_stride(h);
    for (int i = 1; i <= h->rows; i++) {
        double y = h->row0 + i - 1;
        for (int j = 1; j <= h->cols; j++) {
            double x = h->col0 + j - 1, v = 0;
            for (int k = 0; k < HOT_SPOTS; k++)
                v += a[k] * exp(-((x - cx[k]) * (x - cx[k]) + (y - cy[k]) * (y - cy[k])) / (2 * w[k] * w[k]));
            h->cur[i * st + j] = v;
        }
    }
}

/* n cells over p parts: part k gets n / p, the first n % p one more. */
static void split(int n, int p, int k, int *first, int *count) {
    int base = n / p, extra = n % p;
    *count = base + (k < extra);
    *first = k * base + (k < extra ? k : extra);
}

const char *heat_decomp_name(heat_decomp_t d) { return d == HEAT_2D ? "2d" : "strips"; }

/* The neighbour at (cy + dy, cx + dx) of the Cartesian grid, MPI_PROC_NULL outside. */
static int cart_neighbour(const heat_t *h, int cy, int cx, int dy, int dx) {
    int c[2] = {cy + dy, cx + dx}, r;
    if (c[0] < 0 || c[0] >= h->py || c[1] < 0 || c[1] >= h->px) return MPI_PROC_NULL;
    MPI_Cart_rank(h->comm, c, &r);
    return r;
}

heat_t *heat_create(MPI_Comm comm, int nx, int ny, double r, double q, uint64_t seed, heat_decomp_t decomp) {
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    int dims[2] = {0, 0};
    MPI_Dims_create(size, 2, dims); /* dims[0] >= dims[1]: more parts along the rows */
    if (decomp == HEAT_AUTO) decomp = ny % dims[0] == 0 && nx % dims[1] == 0 ? HEAT_2D : HEAT_STRIPS;
    if (decomp == HEAT_STRIPS) dims[0] = size, dims[1] = 1;
    if (ny < dims[0] || nx < dims[1] || !(r > 0 && r <= 0.25) || !(q >= 0 && q <= 1)) {
        if (rank == 0)
            fprintf(stderr,
                    "heat: a %d x %d grid with r = %g, q = %g cannot be split in %d x %d blocks (%s; need rows >= %d, "
                    "columns >= %d, 0 < r <= 0.25, 0 <= q <= 1)\n",
                    ny, nx, r, q, dims[0], dims[1], heat_decomp_name(decomp), dims[0], dims[1]);
        return NULL;
    }
    heat_t *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    *h = (heat_t){.comm = comm, .decomp = decomp, .rank = rank, .size = size, .nx = nx, .ny = ny, .py = dims[0],
                  .px = dims[1], .r = r, .q = q, .column = MPI_DATATYPE_NULL};
    int cy = rank, cx = 0;
    if (decomp == HEAT_2D) {
        int periods[2] = {0, 0}, coords[2];
        MPI_Cart_create(comm, 2, dims, periods, 0, &h->comm);
        MPI_Comm_rank(h->comm, &h->rank);
        MPI_Cart_coords(h->comm, h->rank, 2, coords);
        cy = coords[0], cx = coords[1];
    }
    split(ny, h->py, cy, &h->row0, &h->rows);
    split(nx, h->px, cx, &h->col0, &h->cols);
    if (decomp == HEAT_2D) {
        h->up = cart_neighbour(h, cy, cx, -1, 0), h->down = cart_neighbour(h, cy, cx, 1, 0);
        h->left = cart_neighbour(h, cy, cx, 0, -1), h->right = cart_neighbour(h, cy, cx, 0, 1);
        h->up_left = cart_neighbour(h, cy, cx, -1, -1), h->up_right = cart_neighbour(h, cy, cx, -1, 1);
        h->down_left = cart_neighbour(h, cy, cx, 1, -1), h->down_right = cart_neighbour(h, cy, cx, 1, 1);
        MPI_Type_vector(h->rows, 1, heat_stride(h), MPI_DOUBLE, &h->column);
        MPI_Type_commit(&h->column);
    } else {
        h->up = rank > 0 ? rank - 1 : MPI_PROC_NULL;
        h->down = rank < size - 1 ? rank + 1 : MPI_PROC_NULL;
        h->left = h->right = h->up_left = h->up_right = h->down_left = h->down_right = MPI_PROC_NULL;
    }
    size_t n = (size_t)(h->rows + 2) * (size_t)heat_stride(h);
    h->cur = calloc(n, sizeof(double));
    h->prev = calloc(n, sizeof(double));
    if (!h->cur || !h->prev) {
        fprintf(stderr, "heat: out of memory for a %d x %d block\n", h->rows, h->cols);
        heat_destroy(h);
        return NULL;
    }
    initial_state(h, seed);
    return h;
}

void heat_destroy(heat_t *h) {
    if (!h) return;
    if (h->column != MPI_DATATYPE_NULL) MPI_Type_free(&h->column);
    if (h->decomp == HEAT_2D && h->comm != MPI_COMM_NULL) MPI_Comm_free(&h->comm);
    free(h->cur);
    free(h->prev);
    free(h);
}

/* The update of cells [i0, i1] x [j0, j1] (frame coordinates) from u into v;
 * returns the sum of the squared increments. The one place a cell's new value
 * is computed: every decomposition gets the same bits. */
static double update_block(const heat_t *h, const double *u, double *v, int i0, int i1, int j0, int j1) {
    int st = heat_stride(h);
    double local = 0, r = h->r, q = h->q;
    for (int i = i0; i <= i1; i++) {
        const double *c = u + (size_t)i * st, *a = c - st, *b = c + st;
        double *o = v + (size_t)i * st;
        for (int j = j0; j <= j1; j++) {
            double d = r * (a[j] + b[j] + c[j - 1] + c[j + 1] - 4.0 * c[j]) + q * c[j] * (1.0 - c[j]);
            o[j] = c[j] + d;
            local += d * d;
        }
    }
    return local;
}

/* Strips: two blocking MPI_Sendrecv of whole rows, then the whole update. */
static double step_strips(heat_t *h, double *u, double *v) {
    int st = heat_stride(h), n = h->rows;
    /* my first row goes up, my last row down */
    MPI_Sendrecv(u + st, st, MPI_DOUBLE, h->up, TAG_TO_UP, u + (size_t)(n + 1) * st, st, MPI_DOUBLE, h->down,
                 TAG_TO_UP, h->comm, MPI_STATUS_IGNORE);
    MPI_Sendrecv(u + (size_t)n * st, st, MPI_DOUBLE, h->down, TAG_TO_DOWN, u, st, MPI_DOUBLE, h->up, TAG_TO_DOWN,
                 h->comm, MPI_STATUS_IGNORE);
    return update_block(h, u, v, 1, n, 1, h->cols);
}

/* 2-D: post the 8 receives and 8 sends, update the inner cells meanwhile,
 * wait, then the ring along the frame. */
static double step_2d(heat_t *h, double *u, double *v) {
    int st = heat_stride(h), n = h->rows, m = h->cols;
    MPI_Request req[16];
    int k = 0;
#define AT(i, j) (u + (size_t)(i) * st + (j))
    /* receives into the frame: the tag is the direction the message travels */
    MPI_Irecv(AT(0, 1), m, MPI_DOUBLE, h->up, TAG_TO_DOWN, h->comm, &req[k++]);
    MPI_Irecv(AT(n + 1, 1), m, MPI_DOUBLE, h->down, TAG_TO_UP, h->comm, &req[k++]);
    MPI_Irecv(AT(1, 0), 1, h->column, h->left, TAG_TO_RIGHT, h->comm, &req[k++]);
    MPI_Irecv(AT(1, m + 1), 1, h->column, h->right, TAG_TO_LEFT, h->comm, &req[k++]);
    MPI_Irecv(AT(0, 0), 1, MPI_DOUBLE, h->up_left, TAG_TO_DR, h->comm, &req[k++]);
    MPI_Irecv(AT(0, m + 1), 1, MPI_DOUBLE, h->up_right, TAG_TO_DL, h->comm, &req[k++]);
    MPI_Irecv(AT(n + 1, 0), 1, MPI_DOUBLE, h->down_left, TAG_TO_UR, h->comm, &req[k++]);
    MPI_Irecv(AT(n + 1, m + 1), 1, MPI_DOUBLE, h->down_right, TAG_TO_UL, h->comm, &req[k++]);
    /* sends of the block's edges (read only while the inner update also only reads u) */
    MPI_Isend(AT(1, 1), m, MPI_DOUBLE, h->up, TAG_TO_UP, h->comm, &req[k++]);
    MPI_Isend(AT(n, 1), m, MPI_DOUBLE, h->down, TAG_TO_DOWN, h->comm, &req[k++]);
    MPI_Isend(AT(1, 1), 1, h->column, h->left, TAG_TO_LEFT, h->comm, &req[k++]);
    MPI_Isend(AT(1, m), 1, h->column, h->right, TAG_TO_RIGHT, h->comm, &req[k++]);
    MPI_Isend(AT(1, 1), 1, MPI_DOUBLE, h->up_left, TAG_TO_UL, h->comm, &req[k++]);
    MPI_Isend(AT(1, m), 1, MPI_DOUBLE, h->up_right, TAG_TO_UR, h->comm, &req[k++]);
    MPI_Isend(AT(n, 1), 1, MPI_DOUBLE, h->down_left, TAG_TO_DL, h->comm, &req[k++]);
    MPI_Isend(AT(n, m), 1, MPI_DOUBLE, h->down_right, TAG_TO_DR, h->comm, &req[k++]);
#undef AT
    /* inner cells [2, n-1] x [2, m-1] read no frame cell: overlap them with the messages */
    double local = n > 2 && m > 2 ? update_block(h, u, v, 2, n - 1, 2, m - 1) : 0;
    MPI_Waitall(k, req, MPI_STATUSES_IGNORE);
    /* the ring: rows 1 and n whole, columns 1 and m between them */
    local += update_block(h, u, v, 1, 1, 1, m);
    if (n > 1) local += update_block(h, u, v, n, n, 1, m);
    if (n > 2) {
        local += update_block(h, u, v, 2, n - 1, 1, 1);
        if (m > 1) local += update_block(h, u, v, 2, n - 1, m, m);
    }
    return local;
}

void heat_step(heat_t *h, double *residual) {
    double *u = h->cur, *v = h->prev;
    double local = h->decomp == HEAT_2D ? step_2d(h, u, v) : step_strips(h, u, v);
    double global;
    MPI_Allreduce(&local, &global, 1, MPI_DOUBLE, MPI_SUM, h->comm);
    if (residual) *residual = sqrt(global);
    /* v now holds the next state; u (halos filled) becomes prev */
    h->cur = v;
    h->prev = u;
}

void heat_checksum(const heat_t *h, uint64_t *hash, double *sum) {
    uint64_t x = 0;
    double s = 0;
    int st = heat_stride(h);
    for (int i = 1; i <= h->rows; i++)
        for (int j = 1; j <= h->cols; j++) {
            double v = h->cur[(size_t)i * st + j];
            uint64_t bits, idx = (uint64_t)(h->row0 + i - 1) * (uint64_t)h->nx + (uint64_t)(h->col0 + j - 1);
            memcpy(&bits, &v, sizeof bits);
            uint64_t m = idx ^ splitmix64(&bits);
            x += splitmix64(&m); /* order-free: the same sum for every decomposition */
            s += v;
        }
    MPI_Allreduce(&x, hash, 1, MPI_UINT64_T, MPI_SUM, h->comm); /* unsigned: wraps mod 2^64 */
    MPI_Allreduce(&s, sum, 1, MPI_DOUBLE, MPI_SUM, h->comm);
}

/* Write or read the interior rows of this block at their global offsets. */
static int field_io(heat_t *h, MPI_File f, int write) {
    int st = heat_stride(h), ok = 1;
    for (int i = 1; i <= h->rows && ok; i++) {
        MPI_Offset off = ((MPI_Offset)(h->row0 + i - 1) * h->nx + h->col0) * (MPI_Offset)sizeof(double);
        double *p = h->cur + (size_t)i * st + 1;
        ok = (write ? MPI_File_write_at(f, off, p, h->cols, MPI_DOUBLE, MPI_STATUS_IGNORE)
                    : MPI_File_read_at(f, off, p, h->cols, MPI_DOUBLE, MPI_STATUS_IGNORE)) == MPI_SUCCESS;
    }
    return ok;
}

int heat_write_field(const heat_t *h, const char *path) {
    MPI_File f;
    int rc = MPI_File_open(h->comm, path, MPI_MODE_CREATE | MPI_MODE_WRONLY, MPI_INFO_NULL, &f);
    if (rc != MPI_SUCCESS) {
        if (h->rank == 0) fprintf(stderr, "heat: cannot open %s for writing\n", path);
        return -1;
    }
    MPI_File_set_size(f, 0);
    int ok = field_io((heat_t *)h, f, 1), all_ok;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, h->comm);
    MPI_File_close(&f);
    if (!all_ok && h->rank == 0) fprintf(stderr, "heat: writing %s failed\n", path);
    return all_ok ? 0 : -1;
}

int heat_read_field(heat_t *h, const char *path) {
    MPI_File f;
    if (MPI_File_open(h->comm, path, MPI_MODE_RDONLY, MPI_INFO_NULL, &f) != MPI_SUCCESS) {
        if (h->rank == 0) fprintf(stderr, "heat: cannot open %s\n", path);
        return -1;
    }
    MPI_Offset size = 0;
    MPI_File_get_size(f, &size);
    int ok = size == (MPI_Offset)h->nx * h->ny * (MPI_Offset)sizeof(double), all_ok;
    if (!ok && h->rank == 0)
        fprintf(stderr, "heat: %s holds %lld bytes, a %d x %d field needs %lld\n", path, (long long)size, h->ny, h->nx,
                (long long)h->nx * h->ny * (long long)sizeof(double));
    if (ok) ok = field_io(h, f, 0);
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, h->comm);
    MPI_File_close(&f);
    return all_ok ? 0 : -1;
}
