/* bench_tensor.c — tensor-library benchmarks, one JSON object per line.
 *
 *   {"name":"sgemm","n":512,"gflops":G,"ratio_vs_cblas":R}
 *       C = A @ B for 512x512 f32 through mpr_matmul vs raw cblas_sgemm on the
 *       same buffers in the same run, repetitions interleaved (alternating
 *       which goes first). G and R use the best time of each path (noise from
 *       other processes on a shared machine only adds time);
 *       R = cblas time / mpr_matmul time, target >= 0.95. The line also gives
 *       the ratio of the medians and OpenBLAS's kernel ("blas_core"): on AMD
 *       Zen 4 OpenBLAS 0.3.21 picks its Haswell kernels unless
 *       OPENBLAS_CORETYPE=SkylakeX is set, about 1.6x slower.
 *   {"name":"mlp_step","batch":64,"median_us":T,"samples_per_s":S}
 *       One training step of MLP 784-256-10 (zero_grad, forward,
 *       cross-entropy, backward, SGD lr 0.05) on fixed random data, like
 *       ../shared/anchors/torch_mlp_step.py (200 warm-up, 2000 timed steps).
 *
 * Usage: bench_tensor [--quick]   (BLAS threads: MPIRPC_BLAS_THREADS, default 1) */
#include <cblas.h>
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

static void bench_mlp_step(int batch, int warmup, int steps) {
    mpr_generator_t *g = mpr_generator_create(0);
    mpr_module_t *m = mpr_sequential_create();
    if (!m || mpr_sequential_append(m, mpr_linear_create(784, 256, true, MPR_F32, g)) != MPR_OK ||
        mpr_sequential_append(m, mpr_relu_create()) != MPR_OK ||
        mpr_sequential_append(m, mpr_linear_create(256, 10, true, MPR_F32, g)) != MPR_OK)
        die("model");
    mpr_tensor_t *params[4];
    int np = mpr_module_num_parameters(m);
    for (int i = 0; i < np; i++) params[i] = mpr_module_parameter(m, i, NULL);
    mpr_sgd_options_t opts = {.lr = 0.05};
    mpr_optimizer_t *opt = mpr_sgd_create(params, np, &opts);
    mpr_tensor_t *x = mpr_rand(MPR_F32, MPR_SHAPE(batch, 784), g);
    mpr_tensor_t *y = mpr_tensor_empty(MPR_I64, 1, (const int64_t[]){batch});
    if (!opt || !x || !y) die("setup");
    int64_t *py = mpr_tensor_data(y);
    for (int i = 0; i < batch; i++) py[i] = (int64_t)(mpr_generator_next_u64(g) % 10);
    double *ts = malloc(sizeof(double) * (size_t)steps);
    for (int s = 0; s < warmup + steps; s++) {
        double t0 = now();
        mpr_scope_begin();
        mpr_optimizer_zero_grad(opt);
        mpr_tensor_t *loss = mpr_cross_entropy(mpr_module_forward(m, x), y);
        if (!loss || mpr_backward(loss, NULL, false) != MPR_OK || mpr_optimizer_step(opt) != MPR_OK) die("step");
        mpr_scope_end();
        if (s >= warmup) ts[s - warmup] = now() - t0;
    }
    double med = median(ts, steps);
    printf("{\"name\":\"mlp_step\",\"batch\":%d,\"median_us\":%.1f,\"samples_per_s\":%.0f}\n", batch, med * 1e6,
           batch / med);
    fflush(stdout);
    free(ts);
    mpr_optimizer_destroy(opt);
    mpr_module_destroy(m);
    mpr_tensor_release(x);
    mpr_tensor_release(y);
    mpr_generator_destroy(g);
}

int main(int argc, char **argv) {
    bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    bench_sgemm(512, quick ? 6 : 40);
    bench_mlp_step(64, quick ? 20 : 200, quick ? 100 : 2000);
    return 0;
}
