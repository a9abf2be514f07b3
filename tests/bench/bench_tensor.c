/* bench_tensor.c — tensor-library benchmarks, one JSON object per line.
 *
 *   {"name":"sgemm","n":512,"gflops":G,"ratio_vs_cblas":R,...,"blas_core":K}
 *       C = A @ B for 512x512 f32 through mpr_matmul vs raw cblas_sgemm on the
 *       same buffers in the same run, repetitions interleaved (alternating
 *       which goes first). G and R use the best time of each path (noise from
 *       other processes on a shared machine only adds time);
 *       R = cblas time / mpr_matmul time, target >= 0.95. The line also gives
 *       the ratio of the medians and OpenBLAS's kernel set K (OpenBLAS picks
 *       it from the CPU, or from OPENBLAS_CORETYPE when that is set).
 *   {"name":"mlp_step","batch":64,"median_us":T,"samples_per_s":S,"blas_core":K}
 *       One training step of MLP 784-256-10 (zero_grad, forward,
 *       cross-entropy, backward, SGD lr 0.05) on fixed random data, like
 *       ../shared/anchors/torch_mlp_step.py (200 warm-up, 2000 timed steps).
 *   {"name":"mlp_step_raw_cblas",...,"mpirpc_time_vs_raw":Q}
 *       The same step written by hand on cblas_sgemm/saxpy with preallocated
 *       buffers, timed in alternating blocks with mlp_step: Q = mpirpc time /
 *       hand-written time, the library's overhead over its BLAS (1.0 = none).
 *       Its first step is checked against mpirpc's.
 *
 * Usage: bench_tensor [--quick] [sgemm|mlp]   (BLAS threads: MPIRPC_BLAS_THREADS, default 1)
 *        bench_tensor --better-kernels   prints mpr_blas_better_kernels() (an empty line when
 *        OpenBLAS recognised the CPU): the set the apps re-execute themselves with, which the
 *        *_vs_torch.sh scripts give PyTorch too (tests/bench/same_blas_kernels.sh)
 * tests/bench/mlp_vs_torch.sh alternates the MLP step with PyTorch's. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpirpc/nn.h"
#include "mpirpc/optim.h"
#include "mpirpc/tensor_ops.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die(const char *what) {
    fprintf(stderr, "bench_tensor: %s: %s\n", what, mpr_last_error());
    exit(1);
}

static void bench_sgemm(int n, int reps) {
    mpr_generator_t *g = mpr_generator_create(1);
    mpr_tensor_t *a = mpr_rand(MPR_F32, MPR_SHAPE(n, n), g);
    mpr_tensor_t *b = mpr_rand(MPR_F32, MPR_SHAPE(n, n), g);
    mpr_tensor_t *c = mpr_zeros(MPR_F32, MPR_SHAPE(n, n));
    if (!a || !b || !c) die("sgemm setup");
    const float *pa = mpr_tensor_data(a), *pb = mpr_tensor_data(b);
    float *pc = mpr_tensor_data(c);
    double *t_api = malloc(sizeof(double) * (size_t)reps), *t_raw = malloc(sizeof(double) * (size_t)reps);
    /* Warm up both paths (first BLAS call sets threads, faults pages). */
    for (int w = 0; w < 3; w++) {
        mpr_scope_begin();
        if (!mpr_matmul(a, b)) die("matmul");
        mpr_scope_end();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, pa, n, pb, n, 0.0f, pc, n);
    }
    for (int r = 0; r < reps; r++) {
        for (int k = 0; k < 2; k++) {
            if ((k == 0) == (r % 2 == 0)) {
                mpr_scope_begin();
                double t0 = now();
                mpr_tensor_t *y = mpr_matmul(a, b);
                t_api[r] = now() - t0;
                if (!y) die("matmul");
                mpr_scope_end();
            } else {
                double t0 = now();
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, pa, n, pb, n, 0.0f, pc, n);
                t_raw[r] = now() - t0;
            }
        }
    }
    /* Check the two paths agree. */
    mpr_tensor_t *y = mpr_matmul(a, b);
    if (!mpr_allclose(y, c, 1e-4, 1e-4)) {
        fprintf(stderr, "bench_tensor: mpr_matmul and cblas_sgemm disagree\n");
        exit(1);
    }
    mpr_tensor_release(y);
    double ma = median(t_api, reps), mr = median(t_raw, reps); /* sorts both */
    double ba = t_api[0], br = t_raw[0];
    double flop = 2.0 * n * n * (double)n;
    printf("{\"name\":\"sgemm\",\"n\":%d,\"gflops\":%.2f,\"ratio_vs_cblas\":%.3f,\"cblas_gflops\":%.2f,"
           "\"median_ratio\":%.3f,\"reps\":%d,\"blas_threads\":%d,\"blas_core\":\"%s\"}\n",
           n, flop / ba * 1e-9, br / ba, flop / br * 1e-9, mr / ma, reps, mpr_blas_num_threads(),
           openblas_get_corename());
    fflush(stdout);
    free(t_api);
    free(t_raw);
    mpr_tensor_release(a);
    mpr_tensor_release(b);
    mpr_tensor_release(c);
    mpr_generator_destroy(g);
}

/* ---- MLP step: mpirpc vs the same step written by hand on cblas ---- */

enum { MLP_IN = 784, MLP_HID = 256, MLP_OUT = 10 };

/* The hand-written baseline: the same five GEMMs (bias folded in with
 * beta = 1, no input gradient), ReLU, softmax cross-entropy and SGD on plain
 * buffers allocated once. What a framework adds on top of this is overhead. */
typedef struct {
    int batch;
    float *w1, *b1, *w2, *b2;              /* parameters, [out, in] like nn.Linear */
    float *h, *o, *go, *gh, *gw1, *gb1, *gw2, *gb2; /* activations and gradients */
} raw_mlp_t;

static float *alloc_floats(size_t n) {
    float *p = calloc(n, sizeof(float));
    if (!p) die("raw mlp alloc");
    return p;
}

static void raw_mlp_init(raw_mlp_t *r, int batch, mpr_module_t *m) {
    r->batch = batch;
    r->w1 = alloc_floats((size_t)MLP_HID * MLP_IN), r->b1 = alloc_floats(MLP_HID);
    r->w2 = alloc_floats((size_t)MLP_OUT * MLP_HID), r->b2 = alloc_floats(MLP_OUT);
    r->h = alloc_floats((size_t)batch * MLP_HID), r->o = alloc_floats((size_t)batch * MLP_OUT);
    r->go = alloc_floats((size_t)batch * MLP_OUT), r->gh = alloc_floats((size_t)batch * MLP_HID);
    r->gw1 = alloc_floats((size_t)MLP_HID * MLP_IN), r->gb1 = alloc_floats(MLP_HID);
    r->gw2 = alloc_floats((size_t)MLP_OUT * MLP_HID), r->gb2 = alloc_floats(MLP_OUT);
    float *dst[4] = {r->w1, r->b1, r->w2, r->b2}; /* module order: 0.weight 0.bias 2.weight 2.bias */
    for (int i = 0; i < 4; i++) {
        mpr_tensor_t *p = mpr_module_parameter(m, i, NULL);
        memcpy(dst[i], mpr_tensor_data(p), (size_t)mpr_tensor_numel(p) * sizeof(float));
    }
}

static void raw_mlp_free(raw_mlp_t *r) {
    float *all[] = {r->w1, r->b1, r->w2, r->b2, r->h, r->o, r->go, r->gh, r->gw1, r->gb1, r->gw2, r->gb2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

static void raw_mlp_step(raw_mlp_t *r, const float *x, const int64_t *y, float lr) {
    const int B = r->batch;
    for (int i = 0; i < B; i++) memcpy(r->h + (size_t)i * MLP_HID, r->b1, MLP_HID * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, MLP_HID, MLP_IN, 1.0f, x, MLP_IN, r->w1, MLP_IN, 1.0f,
                r->h, MLP_HID);
    for (int i = 0; i < B * MLP_HID; i++) r->h[i] = r->h[i] > 0 ? r->h[i] : 0.0f;
    for (int i = 0; i < B; i++) memcpy(r->o + (size_t)i * MLP_OUT, r->b2, MLP_OUT * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, MLP_OUT, MLP_HID, 1.0f, r->h, MLP_HID, r->w2, MLP_HID,
                1.0f, r->o, MLP_OUT);
    for (int i = 0; i < B; i++) { /* d(mean cross-entropy)/d logits = (softmax - onehot) / B */
        const float *o = r->o + (size_t)i * MLP_OUT;
        float *g = r->go + (size_t)i * MLP_OUT, mx = o[0], sum = 0;
        for (int j = 1; j < MLP_OUT; j++) mx = o[j] > mx ? o[j] : mx;
        for (int j = 0; j < MLP_OUT; j++) sum += g[j] = expf(o[j] - mx);
        for (int j = 0; j < MLP_OUT; j++) g[j] = g[j] / sum / (float)B;
        g[y[i]] -= 1.0f / (float)B;
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, MLP_OUT, MLP_HID, B, 1.0f, r->go, MLP_OUT, r->h, MLP_HID,
                0.0f, r->gw2, MLP_HID);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, MLP_HID, MLP_OUT, 1.0f, r->go, MLP_OUT, r->w2, MLP_HID,
                0.0f, r->gh, MLP_HID);
    for (int i = 0; i < B * MLP_HID; i++) r->gh[i] = r->h[i] > 0 ? r->gh[i] : 0.0f;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, MLP_HID, MLP_IN, B, 1.0f, r->gh, MLP_HID, x, MLP_IN, 0.0f,
                r->gw1, MLP_IN);
    memset(r->gb1, 0, MLP_HID * sizeof(float));
    memset(r->gb2, 0, MLP_OUT * sizeof(float));
    for (int i = 0; i < B; i++) {
        for (int j = 0; j < MLP_HID; j++) r->gb1[j] += r->gh[(size_t)i * MLP_HID + j];
        for (int j = 0; j < MLP_OUT; j++) r->gb2[j] += r->go[(size_t)i * MLP_OUT + j];
    }
    cblas_saxpy(MLP_HID * MLP_IN, -lr, r->gw1, 1, r->w1, 1);
    cblas_saxpy(MLP_HID, -lr, r->gb1, 1, r->b1, 1);
    cblas_saxpy(MLP_OUT * MLP_HID, -lr, r->gw2, 1, r->w2, 1);
    cblas_saxpy(MLP_OUT, -lr, r->gb2, 1, r->b2, 1);
}

static void mlp_step(mpr_module_t *m, mpr_optimizer_t *opt, mpr_tensor_t *x, mpr_tensor_t *y) {
    mpr_scope_begin();
    mpr_optimizer_zero_grad(opt);
    mpr_tensor_t *loss = mpr_cross_entropy(mpr_module_forward(m, x), y);
    if (!loss || mpr_backward(loss, NULL, false) != MPR_OK || mpr_optimizer_step(opt) != MPR_OK) die("step");
    mpr_scope_end();
}

/* Blocks of `block` steps alternate between the two (each keeps its own
 * buffers warm within a block); medians over `steps` steps each. The first
 * step of both is compared (updated first-layer weights) to make sure they
 * compute the same thing. */
static void bench_mlp_step(int batch, int warmup, int steps) {
    const float lr = 0.05f;
    const int block = 50;
    mpr_generator_t *g = mpr_generator_create(0);
    mpr_module_t *m = mpr_sequential_create();
    if (!m || mpr_sequential_append(m, mpr_linear_create(MLP_IN, MLP_HID, true, MPR_F32, g)) != MPR_OK ||
        mpr_sequential_append(m, mpr_relu_create()) != MPR_OK ||
        mpr_sequential_append(m, mpr_linear_create(MLP_HID, MLP_OUT, true, MPR_F32, g)) != MPR_OK)
        die("model");
    mpr_tensor_t *params[4];
    int np = mpr_module_num_parameters(m);
    for (int i = 0; i < np; i++) params[i] = mpr_module_parameter(m, i, NULL);
    mpr_sgd_options_t opts = {.lr = lr};
    mpr_optimizer_t *opt = mpr_sgd_create(params, np, &opts);
    mpr_tensor_t *x = mpr_rand(MPR_F32, MPR_SHAPE(batch, MLP_IN), g);
    mpr_tensor_t *y = mpr_tensor_empty(MPR_I64, 1, (const int64_t[]){batch});
    if (!opt || !x || !y) die("setup");
    int64_t *py = mpr_tensor_data(y);
    for (int i = 0; i < batch; i++) py[i] = (int64_t)(mpr_generator_next_u64(g) % MLP_OUT);
    const float *px = mpr_tensor_data(x);

    raw_mlp_t raw;
    raw_mlp_init(&raw, batch, m);
    mlp_step(m, opt, x, y);
    raw_mlp_step(&raw, px, py, lr);
    const float *w1 = mpr_tensor_data(params[0]);
    for (int i = 0; i < MLP_HID * MLP_IN; i++)
        if (fabsf(w1[i] - raw.w1[i]) > 1e-5f + 1e-4f * fabsf(raw.w1[i])) {
            fprintf(stderr, "bench_tensor: mpirpc and the hand-written step disagree at w1[%d]: %g vs %g\n", i,
                    (double)w1[i], (double)raw.w1[i]);
            exit(1);
        }

    double *ts = malloc(sizeof(double) * (size_t)steps), *tr = malloc(sizeof(double) * (size_t)steps);
    if (!ts || !tr) die("alloc");
    for (int s = 0; s < warmup; s++) {
        mlp_step(m, opt, x, y);
        raw_mlp_step(&raw, px, py, lr);
    }
    for (int s0 = 0; s0 < steps; s0 += block) {
        int n = steps - s0 < block ? steps - s0 : block;
        for (int s = s0; s < s0 + n; s++) {
            double t0 = now();
            mlp_step(m, opt, x, y);
            ts[s] = now() - t0;
        }
        for (int s = s0; s < s0 + n; s++) {
            double t0 = now();
            raw_mlp_step(&raw, px, py, lr);
            tr[s] = now() - t0;
        }
    }
    double med = median(ts, steps), medr = median(tr, steps);
    printf("{\"name\":\"mlp_step\",\"batch\":%d,\"median_us\":%.1f,\"samples_per_s\":%.0f,\"blas_core\":\"%s\"}\n",
           batch, med * 1e6, batch / med, openblas_get_corename());
    printf("{\"name\":\"mlp_step_raw_cblas\",\"batch\":%d,\"median_us\":%.1f,\"samples_per_s\":%.0f,"
           "\"mpirpc_time_vs_raw\":%.3f}\n",
           batch, medr * 1e6, batch / medr, med / medr);
    fflush(stdout);
    free(ts);
    free(tr);
    raw_mlp_free(&raw);
    mpr_optimizer_destroy(opt);
    mpr_module_destroy(m);
    mpr_tensor_release(x);
    mpr_tensor_release(y);
    mpr_generator_destroy(g);
}

int main(int argc, char **argv) {
    bool quick = false, sgemm = true, mlp = true;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) quick = true;
        else if (strcmp(argv[i], "sgemm") == 0) mlp = false;
        else if (strcmp(argv[i], "mlp") == 0) sgemm = false;
        else if (strcmp(argv[i], "--better-kernels") == 0 && argc == 2) {
            printf("%s\n", mpr_blas_better_kernels());
            return 0;
        } else {
            fprintf(stderr, "usage: bench_tensor [--quick] [sgemm|mlp] | --better-kernels\n");
            return 2;
        }
    }
    if (sgemm) bench_sgemm(512, quick ? 6 : 40);
    if (mlp) bench_mlp_step(64, quick ? 20 : 200, quick ? 100 : 2000);
    return 0;
}
