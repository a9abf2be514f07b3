/* apps/insitu_heat/heat.c — the heat-equation solver (see heat.h): strips of
 * rows, MPI_Sendrecv halos, MPI_Allreduce residual, MPI-IO field output. */
#include "heat.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TAG_TO_UP = 101, TAG_TO_DOWN = 102 };

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
        for (int j = 1; j <= h->nx; j++) {
            double x = j - 1, v = 0;
            for (int k = 0; k < HOT_SPOTS; k++)
                v += a[k] * exp(-((x - cx[k]) * (x - cx[k]) + (y - cy[k]) * (y - cy[k])) / (2 * w[k] * w[k]));
            h->cur[i * st + j] = v;
        }
    }
}

heat_t *heat_create(MPI_Comm comm, int nx, int ny, double r, double q, uint64_t seed) {
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    if (ny < size || nx < 1 || !(r > 0 && r <= 0.25) || !(q >= 0 && q <= 1)) {
        fprintf(stderr, "heat: a %d x %d grid with r = %g, q = %g cannot be split on %d ranks (need ny >= ranks, 0 < r <= 0.25, 0 <= q <= 1)\n",
                ny, nx, r, q, size);
        return NULL;
    }
    heat_t *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    *h = (heat_t){.comm = comm, .rank = rank, .size = size, .nx = nx, .ny = ny, .r = r, .q = q};
    int base = ny / size, extra = ny % size;
    h->rows = base + (rank < extra);
    h->row0 = rank * base + (rank < extra ? rank : extra);
    h->up = rank > 0 ? rank - 1 : MPI_PROC_NULL;
    h->down = rank < size - 1 ? rank + 1 : MPI_PROC_NULL;
    size_t n = (size_t)(h->rows + 2) * (size_t)heat_stride(h);
    h->cur = calloc(n, sizeof(double));
    h->prev = calloc(n, sizeof(double));
    if (!h->cur || !h->prev) {
        fprintf(stderr, "heat: out of memory for a %d x %d strip\n", h->rows, nx);
        heat_destroy(h);
        return NULL;
    }
    initial_state(h, seed);
    return h;
}

void heat_destroy(heat_t *h) {
    if (!h) return;
    free(h->cur);
    free(h->prev);
    free(h);
}

void heat_step(heat_t *h, double *residual) {
    int st = heat_stride(h), n = h->rows;
    double *u = h->cur, *v = h->prev;
    /* halos: my first row goes up, my last row down */
    MPI_Sendrecv(u + st, st, MPI_DOUBLE, h->up, TAG_TO_UP, u + (size_t)(n + 1) * st, st, MPI_DOUBLE, h->down,
                 TAG_TO_UP, h->comm, MPI_STATUS_IGNORE);
    MPI_Sendrecv(u + (size_t)n * st, st, MPI_DOUBLE, h->down, TAG_TO_DOWN, u, st, MPI_DOUBLE, h->up, TAG_TO_DOWN,
                 h->comm, MPI_STATUS_IGNORE);
    double local = 0, r = h->r, q = h->q;
    for (int i = 1; i <= n; i++) {
        const double *c = u + (size_t)i * st, *a = c - st, *b = c + st;
        double *o = v + (size_t)i * st;
        for (int j = 1; j <= h->nx; j++) {
            double d = r * (a[j] + b[j] + c[j - 1] + c[j + 1] - 4.0 * c[j]) + q * c[j] * (1.0 - c[j]);
            o[j] = c[j] + d;
            local += d * d;
        }
    }
    double global;
    MPI_Allreduce(&local, &global, 1, MPI_DOUBLE, MPI_SUM, h->comm);
    if (residual) *residual = sqrt(global);
    /* v now holds the next state; u (halos filled) becomes prev */
    h->cur = v;
    h->prev = u;
}

void heat_checksum(const heat_t *h, uint64_t *hash, double *sum) {
    uint64_t x = 0xcbf29ce484222325ull;
    double s = 0;
    int st = heat_stride(h);
    for (int i = 1; i <= h->rows; i++) {
        const unsigned char *p = (const unsigned char *)(h->cur + (size_t)i * st + 1);
        for (size_t k = 0; k < (size_t)h->nx * sizeof(double); k++) x = (x ^ p[k]) * 0x100000001b3ull;
        for (int j = 1; j <= h->nx; j++) s += h->cur[(size_t)i * st + j];
    }
    uint64_t *all = malloc((size_t)h->size * sizeof *all);
    double *sums = malloc((size_t)h->size * sizeof *sums);
    if (!all || !sums) {
        fprintf(stderr, "heat: out of memory\n");
        MPI_Abort(h->comm, 1);
    }
    MPI_Allgather(&x, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, h->comm);
    MPI_Allgather(&s, 1, MPI_DOUBLE, sums, 1, MPI_DOUBLE, h->comm);
    uint64_t c = 0xcbf29ce484222325ull;
    double total = 0;
    for (int k = 0; k < h->size; k++) { /* rank order: the same bits on every rank */
        for (int b = 0; b < 8; b++) c = (c ^ ((all[k] >> (8 * b)) & 0xff)) * 0x100000001b3ull;
        total += sums[k];
    }
    free(all);
    free(sums);
    *hash = c;
    *sum = total;
}

int heat_write_field(const heat_t *h, const char *path) {
    MPI_File f;
    int rc = MPI_File_open(h->comm, path, MPI_MODE_CREATE | MPI_MODE_WRONLY, MPI_INFO_NULL, &f);
    if (rc != MPI_SUCCESS) {
        if (h->rank == 0) fprintf(stderr, "heat: cannot open %s for writing\n", path);
        return -1;
    }
    int st = heat_stride(h), ok = 1;
    MPI_File_set_size(f, 0);
    for (int i = 1; i <= h->rows && ok; i++) {
        MPI_Offset off = ((MPI_Offset)(h->row0 + i - 1) * h->nx) * (MPI_Offset)sizeof(double);
        ok = MPI_File_write_at(f, off, h->cur + (size_t)i * st + 1, h->nx, MPI_DOUBLE, MPI_STATUS_IGNORE) ==
             MPI_SUCCESS;
    }
    int all_ok;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, h->comm);
    MPI_File_close(&f);
    if (!all_ok && h->rank == 0) fprintf(stderr, "heat: writing %s failed\n", path);
    return all_ok ? 0 : -1;
}
