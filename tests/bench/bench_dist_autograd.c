/* bench_dist_autograd.c — distributed autograd benchmark, one JSON object per
 * line.
 *
 * Run: mpirun -np 2 ./bench_dist_autograd [--quick]
 * The step of ../shared/anchors/torch_rpc_bench.py: inside a context, the
 * forward y = rpc_sync(matmul(w, w)) on the peer, backward from y.sum(), the
 * gradient of w read from the context, the context ended; next to the same
 * step computed locally (matmul, sum, mpr_backward, read and zero w.grad)
 * and the rpc_sync no-op round trip, interleaved iteration by iteration in
 * the same run, for w of 256x256 and 8x8 (f32). Medians; rank 0 prints:
 *   {"name":"rpc_sync_noop","median_us":...}
 *   {"name":"dist_autograd_step","n":256,"median_us":...,"local_median_us":...,
 *    "ratio_vs_local":...,"noop_round_trips":...,"trainer_local_median_us":...}
 * As for ps_mlp_step below, local_median_us is the local step timed on the
 * peer (rank 1), where the dist step's matrix products run, and
 * trainer_local_median_us the same on rank 0.
 * Targets (issue #12): the 256 step within 1.2x the local one, the 8 step
 * within 4 no-op round trips. The context's CLEANUP goes out at the
 * caller's next wait (autograd/dist/context.c), so the timed no-op follows
 * an untimed one that meets the peer handling it. Then the 8x8 step run
 * back to back, as a training loop runs it (each step's cleanup handled
 * by the peer during the next step):
 *   {"name":"dist_autograd_steps_back_to_back","n":8,"median_us":...,
 *    "noop_round_trips":...} PyTorch 1.13 on this machine: 2,586-3,184 us.
 * Then (issue #13) one training step of the parameter-server MLP
 * (784-256-10, batch 64, f32): the PS (rank 1) owns the model, the trainer
 * drives the forward through an RPC, dist backward, a DistributedOptimizer
 * SGD step; next to the same step computed locally with a copy of the model
 * (every rank builds it from the same seed), interleaved step by step:
 *   {"name":"ps_mlp_step","batch":64,"median_us":...,"samples_per_s":...,
 *    "local_median_us":...,"ratio_vs_local":...,
 *    "trainer_local_median_us":...,"ratio_vs_trainer_local":...}
 * local_median_us is the local step timed on the PS (rank 1), whose core
 * does the dist step's matrix work; the trainer_ fields time it on rank 0.
 * Each rank is bound to its own core, and on a shared VM the two cores'
 * speeds differ from run to run (the two local medians of one run differed
 * by up to ~40% here), which the trainer-side ratio mixes into the
 * distribution overhead.
 * PyTorch 1.13: ~17.2k samples/s with 1 trainer (torch_ps_fmnist.py).
 * The step lines end with "blas_core": OpenBLAS's kernel set (the compute
 * part of the ratios depends on it; a program, unlike the apps, keeps the
 * set OpenBLAS picked: OPENBLAS_CORETYPE=<mpr_blas_better_kernels()> gives
 * it the CPU's where OpenBLAS fell back to its generic ones). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpirpc/mpirpc.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void die(const char *what, mpr_err_t e) {
    fprintf(stderr, "bench_dist_autograd: %s: %s: %s\n", what, mpr_error_name(e), mpr_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static mpr_err_t fn_noop(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    (void)args;
    *result = NULL;
    return MPR_OK;
}

/* [w] -> matmul(w, w) */
static mpr_err_t fn_matmul_self(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    mpr_tensor_t *w;
    mpr_err_t e = mpr_args_tensor(args, 0, &w);
    if (e) return e;
    mpr_tensor_t *y = mpr_matmul(w, w);
    if (!y) return mpr_last_error_code();
    *result = mpr_value_new_tensor(y);
    mpr_tensor_release(y);
    return MPR_OK;
}

/* ---- the parameter-server MLP step (issue #13): 784-256-10, batch 64 ---- */
static mpr_module_t *ps_model; /* on the PS (rank 1) and, for the local step, on rank 0 */
static mpr_module_t *make_mlp(void);

/* The batch both ranks use (the same seed). */
static void ps_batch(mpr_tensor_t **x, mpr_tensor_t **y) {
    const int batch = 64;
    int64_t xs[2] = {batch, 784}, ys[1] = {batch};
    mpr_generator_t *g = mpr_generator_create(9);
    *x = mpr_rand(MPR_F32, 2, xs, g);
    *y = mpr_tensor_empty(MPR_I64, 1, ys);
    mpr_generator_destroy(g);
    for (int i = 0; i < batch; i++) ((int64_t *)mpr_tensor_data(*y))[i] = i % 10;
}

/* One local step (forward, loss, backward, SGD) of `m` with optimizer `opt`; its duration in us. */
static double local_ps_step(mpr_module_t *m, mpr_optimizer_t *opt, mpr_tensor_t *x, mpr_tensor_t *y) {
    double t0 = now_us();
    mpr_scope_begin();
    mpr_optimizer_zero_grad(opt);
    mpr_tensor_t *ll = mpr_cross_entropy(mpr_module_forward(m, x), y);
    mpr_err_t e = mpr_backward(ll, NULL, false);
    if (!e) e = mpr_optimizer_step(opt);
    mpr_scope_end();
    if (e) die("local ps step", e);
    return now_us() - t0;
}

/* The PS's own copy for the local step timed there (rank 1 only). */
static mpr_module_t *twin_model;
static mpr_optimizer_t *twin_opt;
static mpr_tensor_t *twin_x, *twin_y;

/* [] -> the duration (us, a float) of one local step on this rank. */
static mpr_err_t fn_ps_local_step(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    (void)args;
    if (!twin_model) {
        twin_model = make_mlp();
        mpr_optim_options_t oo;
        mpr_optim_options_default("sgd", &oo);
        oo.lr = 0.05;
        mpr_tensor_t *tp[8];
        int np = mpr_module_num_parameters(twin_model);
        for (int i = 0; i < np && i < 8; i++) tp[i] = mpr_module_parameter(twin_model, i, NULL);
        twin_opt = mpr_optimizer_create("sgd", tp, np, &oo);
        ps_batch(&twin_x, &twin_y);
        if (!twin_opt) return mpr_last_error_code();
    }
    *result = mpr_value_new_double(local_ps_step(twin_model, twin_opt, twin_x, twin_y));
    return MPR_OK;
}

static mpr_module_t *make_mlp(void) {
    mpr_generator_t *g = mpr_generator_create(5);
    mpr_module_t *m = mpr_sequential_create();
    mpr_sequential_append(m, mpr_linear_create(784, 256, true, MPR_F32, g));
    mpr_sequential_append(m, mpr_relu_create());
    mpr_sequential_append(m, mpr_linear_create(256, 10, true, MPR_F32, g));
    mpr_generator_destroy(g);
    return m;
}

/* [x] -> model(x) on the PS */
static mpr_err_t fn_ps_forward(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    mpr_tensor_t *x;
    mpr_err_t e = mpr_args_tensor(args, 0, &x);
    if (e) return e;
    mpr_tensor_t *y = mpr_module_forward(ps_model, x);
    if (!y) return mpr_last_error_code();
    *result = mpr_value_new_tensor(y);
    mpr_tensor_release(y);
    return MPR_OK;
}

/* [] -> [RRef per parameter of the PS model] */
static mpr_err_t fn_ps_params(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    (void)args;
    mpr_value_t *list = mpr_value_new_list();
    for (int i = 0; i < mpr_module_num_parameters(ps_model); i++) {
        mpr_value_t *v = mpr_value_new_tensor(mpr_module_parameter(ps_model, i, NULL));
        mpr_rref_t *r = mpr_rref_create_local(v);
        mpr_value_list_append(list, mpr_value_new_rref(r));
        mpr_rref_release(r);
        mpr_value_release(v);
    }
    *result = list;
    return MPR_OK;
}

static void quiet_barrier(void) {
    MPI_Request req;
    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    for (int done = 0;;) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (done) return;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

/* Phases of the last dist_step: forward RPC, backward, the rest. */
static double phase_fwd, phase_bwd;

static double dist_step(mpr_tensor_t *w, mpr_value_t *args) {
    double t0 = now_us();
    int64_t ctx;
    mpr_err_t e;
    if ((e = mpr_dist_context_begin(&ctx))) die("context", e);
    mpr_value_t *r = NULL;
    if ((e = mpr_rpc_sync(mpr_to_rank(1), "matmul_self", args, 60, &r))) die("rpc", e);
    mpr_tensor_t *y;
    if ((e = mpr_value_get_tensor(r, &y))) die("result", e);
    mpr_tensor_t *loss = mpr_sum(y);
    double t1 = now_us();
    if ((e = mpr_dist_backward(ctx, &loss, 1, false))) die("dist backward", e);
    double t2 = now_us();
    mpr_tensor_t *g = NULL;
    if ((e = mpr_dist_get_gradient(ctx, w, &g)) || !g) die("gradient", e);
    mpr_tensor_release(g);
    mpr_tensor_release(loss);
    mpr_value_release(r);
    if ((e = mpr_dist_context_end(ctx))) die("end", e);
    phase_fwd = t1 - t0;
    phase_bwd = t2 - t1;
    return now_us() - t0;
}

static double local_step(mpr_tensor_t *w) {
    double t0 = now_us();
    mpr_tensor_t *y = mpr_matmul(w, w);
    mpr_tensor_t *loss = mpr_sum(y);
    mpr_err_t e = mpr_backward(loss, NULL, false);
    if (e || !mpr_tensor_grad(w)) die("local backward", e);
    mpr_zero_grad(w);
    mpr_tensor_release(loss);
    mpr_tensor_release(y);
    return now_us() - t0;
}

/* The peer's own w per size, for the local step timed there (rank 1 only). */
static mpr_tensor_t *peer_w[2];

/* [n] -> the duration (us, a double) of one local step with an n x n w on this rank. */
static mpr_err_t fn_local_step(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    int64_t n;
    mpr_err_t e = mpr_args_int(args, 0, &n);
    if (e) return e;
    mpr_tensor_t **w = &peer_w[n == 8];
    if (!*w) {
        *w = mpr_full(MPR_F32, 2, (const int64_t[]){n, n}, 0.01);
        if (!*w || (e = mpr_set_requires_grad(*w, true))) return e ? e : mpr_last_error_code();
    }
    *result = mpr_value_new_double(local_step(*w));
    return MPR_OK;
}

/* One local step timed on rank 1. */
static double peer_local_step(int n) {
    mpr_value_t *r = NULL;
    double us = 0;
    mpr_err_t e = mpr_rpc_sync_take(mpr_to_rank(1), "local_step", mpr_value_list_of(1, mpr_value_new_int(n)), 60, &r);
    if (e || (e = mpr_value_get_double(r, &us))) die("local_step on the peer", e);
    mpr_value_release(r);
    return us;
}

static double noop_call(void) {
    double t0 = now_us();
    mpr_value_t *r = NULL;
    mpr_err_t e = mpr_rpc_sync(mpr_to_rank(1), "noop", NULL, 60, &r);
    if (e) die("noop", e);
    mpr_value_release(r);
    return now_us() - t0;
}

int main(int argc, char **argv) {
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    mpr_err_t e;
    if ((e = mpr_register_function("noop", fn_noop, NULL)) ||
        (e = mpr_register_function("matmul_self", fn_matmul_self, NULL)) ||
        (e = mpr_register_function("ps_forward", fn_ps_forward, NULL)) ||
        (e = mpr_register_function("ps_params", fn_ps_params, NULL)) ||
        (e = mpr_register_function("ps_local_step", fn_ps_local_step, NULL)) ||
        (e = mpr_register_function("local_step", fn_local_step, NULL)))
        die("register", e);
    ps_model = make_mlp();
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = &argc;
    opts.argv = &argv;
    if ((e = mpr_init(&opts))) die("init", e);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (mpr_world_size() < 2) die("needs 2 ranks", MPR_ERR_INVALID_ARG);
    double noop_med = 0, b2b_med = 0;
    const int sizes[2] = {256, 8};
    double step_med[2], local_med[2], trainer_local_med[2], fwd_med[2], bwd_med[2];
    if (rank == 0) {
        for (int s = 0; s < 2; s++) {
            int n = sizes[s];
            int iters = quick ? (n >= 256 ? 60 : 300) : (n >= 256 ? 300 : 3000);
            int64_t shape[2] = {n, n};
            mpr_tensor_t *w = mpr_full(MPR_F32, 2, shape, 0.01);
            mpr_set_requires_grad(w, true);
            mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_tensor(w));
            double *ds = malloc(sizeof(double) * iters), *ls = malloc(sizeof(double) * iters),
                   *ns = malloc(sizeof(double) * iters), *fs = malloc(sizeof(double) * iters),
                   *bs = malloc(sizeof(double) * iters), *ps = malloc(sizeof(double) * iters);
            for (int i = 0; i < iters / 10 + 5; i++) { /* warm up */
                dist_step(w, args);
                local_step(w);
                peer_local_step(n);
                noop_call();
            }
            for (int i = 0; i < iters; i++) {
                ds[i] = dist_step(w, args);
                fs[i] = phase_fwd;
                bs[i] = phase_bwd;
                ls[i] = local_step(w);
                ps[i] = peer_local_step(n);
                /* Untimed: the step's context cleanup goes out at the caller's
                 * next wait (here, peer_local_step's) and the peer handles it
                 * after answering that call; this call meets it, the timed
                 * no-op below finds the peer idle, as the base should. */
                noop_call();
                ns[i] = noop_call();
            }
            step_med[s] = median(ds, iters);
            fwd_med[s] = median(fs, iters);
            bwd_med[s] = median(bs, iters);
            free(fs);
            free(bs);
            trainer_local_med[s] = median(ls, iters);
            local_med[s] = median(ps, iters);
            free(ps);
            double nm = median(ns, iters);
            if (s == 1) noop_med = nm;
            if (s == 1) { /* steps one after the other, as a training loop runs them: each
                           * step's cleanup is sent during the next one's forward */
                for (int i = 0; i < iters; i++) ds[i] = dist_step(w, args);
                b2b_med = median(ds, iters);
            }
            free(ds);
            free(ls);
            free(ns);
            mpr_value_release(args);
            mpr_tensor_release(w);
        }
        /* the PS step: forward through the PS, dist backward, DistributedOptimizer SGD step */
        {
            const int batch = 64, iters = quick ? 30 : 200;
            mpr_tensor_t *x, *y;
            ps_batch(&x, &y);
            mpr_value_t *pr = NULL;
            if ((e = mpr_rpc_sync(mpr_to_rank(1), "ps_params", NULL, 60, &pr))) die("ps_params", e);
            int np = (int)mpr_value_list_len(pr);
            mpr_rref_t *prefs[8];
            for (int i = 0; i < np && i < 8; i++) mpr_value_get_rref(mpr_value_list_get(pr, (size_t)i), &prefs[i]);
            mpr_optim_options_t oo;
            mpr_optim_options_default("sgd", &oo);
            oo.lr = 0.05;
            mpr_dist_optimizer_t *dopt = mpr_dist_optimizer_create("sgd", &oo, prefs, np);
            mpr_tensor_t *lp[8];
            for (int i = 0; i < np; i++) lp[i] = mpr_module_parameter(ps_model, i, NULL);
            mpr_optimizer_t *lopt = mpr_optimizer_create("sgd", lp, np, &oo);
            if (!dopt || !lopt) die("optimizers", mpr_last_error_code());
            mpr_value_t *xargs = mpr_value_list_of(1, mpr_value_new_tensor(x));
            double *ds = malloc(sizeof(double) * iters), *ls = malloc(sizeof(double) * iters),
                   *pls = malloc(sizeof(double) * iters);
            for (int i = -5; i < iters; i++) {
                double t0 = now_us();
                int64_t ctx;
                mpr_dist_context_begin(&ctx);
                mpr_scope_begin();
                mpr_value_t *r = NULL;
                if ((e = mpr_rpc_sync(mpr_to_rank(1), "ps_forward", xargs, 60, &r))) die("ps_forward", e);
                mpr_tensor_t *out;
                mpr_value_get_tensor(r, &out);
                mpr_tensor_t *loss = mpr_cross_entropy(out, y);
                if ((e = mpr_dist_backward(ctx, &loss, 1, false))) die("ps backward", e);
                if ((e = mpr_dist_optimizer_step(dopt, ctx))) die("ps step", e);
                mpr_value_release(r);
                mpr_scope_end();
                mpr_dist_context_end(ctx);
                double t1 = now_us();
                noop_call(); /* untimed: the context's cleanup goes out in its wait, the PS handles it
                              * now, not during the local step timed on it below */
                double local_here = local_ps_step(ps_model, lopt, x, y);
                mpr_value_t *lr = NULL;
                double local_on_ps = 0;
                if ((e = mpr_rpc_sync(mpr_to_rank(1), "ps_local_step", NULL, 60, &lr)) ||
                    (e = mpr_value_get_double(lr, &local_on_ps)))
                    die("ps_local_step", e);
                mpr_value_release(lr);
                if (i >= 0) {
                    ds[i] = t1 - t0;
                    ls[i] = local_here;
                    pls[i] = local_on_ps;
                }
            }
            double dm = median(ds, iters), lm = median(pls, iters), tm = median(ls, iters);
            printf("{\"name\":\"ps_mlp_step\",\"batch\":%d,\"median_us\":%.1f,\"samples_per_s\":%.0f,"
                   "\"local_median_us\":%.1f,\"ratio_vs_local\":%.3f,\"trainer_local_median_us\":%.1f,"
                   "\"ratio_vs_trainer_local\":%.3f,\"blas_core\":\"%s\"}\n",
                   batch, dm, batch / dm * 1e6, lm, dm / lm, tm, dm / tm, mpr_blas_kernels());
            free(ds);
            free(ls);
            free(pls);
            mpr_value_release(xargs);
            mpr_dist_optimizer_destroy(dopt);
            mpr_optimizer_destroy(lopt);
            mpr_value_release(pr);
            mpr_tensor_release(x);
            mpr_tensor_release(y);
        }
        printf("{\"name\":\"rpc_sync_noop\",\"median_us\":%.3f}\n", noop_med);
        for (int s = 0; s < 2; s++)
            printf("{\"name\":\"dist_autograd_step\",\"n\":%d,\"median_us\":%.1f,\"local_median_us\":%.1f,"
                   "\"ratio_vs_local\":%.3f,\"noop_round_trips\":%.2f,\"forward_median_us\":%.1f,"
                   "\"backward_median_us\":%.1f,\"trainer_local_median_us\":%.1f,\"ratio_vs_trainer_local\":%.3f,"
                   "\"blas_core\":\"%s\"}\n",
                   sizes[s], step_med[s], local_med[s], step_med[s] / local_med[s], step_med[s] / noop_med,
                   fwd_med[s], bwd_med[s], trainer_local_med[s], step_med[s] / trainer_local_med[s],
                   mpr_blas_kernels());
        printf("{\"name\":\"dist_autograd_steps_back_to_back\",\"n\":8,\"median_us\":%.1f,"
               "\"noop_round_trips\":%.2f}\n",
               b2b_med, b2b_med / noop_med);
        fflush(stdout);
    }
    quiet_barrier();
    mpr_shutdown(true);
    mpr_module_destroy(ps_model);
    mpr_optimizer_destroy(twin_opt);
    mpr_module_destroy(twin_model);
    mpr_tensor_release(twin_x);
    mpr_tensor_release(twin_y);
    mpr_tensor_release(peer_w[0]);
    mpr_tensor_release(peer_w[1]);
    return 0;
}
