/* pipeline_grad_check.c — test tool (an MPI program): the gradients of one
 * pipelined mini-batch equal those of the same model run unsplit on one rank.
 *
 *   mpiexec -n S+1 pipeline_grad_check MODEL MICRO_BATCHES BATCH SEED [gpipe|1f1b|both]
 *
 * Rank 0 builds the pipeline app's S stages on ranks 1..S (pipeline_gpipe.h),
 * runs one step's forward + dist backward of the first BATCH training
 * images of Fashion-MNIST in MICRO_BATCHES micro-batches with the schedule
 * (default gpipe; both: GPipe, then 1F1B, on the same stages), and fetches
 * every stage's gradients from the mini-batch's dist context. It also reads
 * every stage's peak activation memory during the step (PIPELINE_MEMORY_FN;
 * before each step it waits until no graph is left on any stage, so one
 * step's activations never count in the next one's peak). Then it builds the unsplit model
 * (app_fmnist_model_create, the same parameters) locally, runs each
 * micro-batch through it separately, with loss = sum over micro-batches of
 * (summed cross entropy of the micro-batch) / BATCH, i.e. the mean over the
 * mini-batch, and backward. Every parameter's gradient must match within
 * 1e-5 relative in the max norm: max|g_pipe - g_local| <= 1e-5 max|g_local|
 * over the tensor's elements. (Element by element the relative difference
 * of elements near zero can be larger: the stages add the micro-batches'
 * contributions in the order their backward passes arrive, the reference
 * in micro-batch order, and float sums depend on the order; measured:
 * up to 4e-5 of |g| + 1e-3 max|g| for the Linear 3136-128 weight at S = 3,
 * M = 8, while its max-norm difference is about 1e-7.)
 * With GPipe it then sends a micro-batch the first stage cannot take and
 * checks the failure comes back from that stage as it is.
 * Prints one line per parameter and schedule and a JSON line
 * {"ok":..., "parameters":..., "max_rel":... (over the schedules run),
 *  "max_rel_<schedule>":..., "peak_<schedule>":[bytes per stage]}; exit 0 if
 * all match, 1 if not, 2 on usage or setup errors. */
#include <time.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "fmnist_models.h"
#include "mpirpc/mpirpc.h"
#include "pipeline_gpipe.h"
#include "pipeline_stage.h"

static int fail_setup(const char *what) {
    fprintf(stderr, "pipeline_grad_check: %s: %s\n", what, mpr_last_error());
    return 2;
}

/* The local reference: gradients of the unsplit model, into the parameters' .grad. */
static mpr_module_t *local_gradients(const char *kind, uint64_t seed, mpr_tensor_t *x, mpr_tensor_t *y, int M) {
    mpr_module_t *m = app_fmnist_model_create(kind, seed);
    if (!m) return NULL;
    int64_t B = mpr_tensor_shape(x)[0], mb = B / M;
    mpr_scope_begin();
    mpr_tensor_t *total = NULL;
    for (int i = 0; i < M; i++) {
        mpr_tensor_t *xi = mpr_narrow(x, 0, (int64_t)i * mb, mb), *yi = mpr_narrow(y, 0, (int64_t)i * mb, mb);
        mpr_tensor_t *li = mpr_mul_scalar(mpr_cross_entropy(mpr_module_forward(m, xi), yi), (double)mb / (double)B);
        total = !li ? NULL : total ? mpr_add(total, li) : li;
        if (!total) break;
    }
    bool ok = total && mpr_backward(total, NULL, false) == MPR_OK;
    mpr_scope_end();
    if (!ok) {
        mpr_module_destroy(m);
        return NULL;
    }
    return m;
}

/* Wait (up to 20 s) until no stage holds a graph (the cleanup of an ended
 * context reaches the stages after mpr_dist_context_end returns), then start
 * a new period of the stages' peaks. */
static mpr_err_t quiet_stages(pipeline_t *p) {
    int64_t peak[64], now[64];
    for (int tries = 0; tries < 2000; tries++) {
        mpr_err_t e = pipeline_memory(p, peak, now);
        if (e) return e;
        bool quiet = true;
        for (int k = 0; k < p->nstages; k++) quiet &= now[k] == 0;
        if (quiet) return pipeline_memory(p, peak, now);
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    return mpr_error_set(MPR_ERR_TIMEOUT, "a stage still holds a graph 20 s after its context ended");
}

/* One step of schedule s: its loss, gradients (new references) and every stage's peak activation bytes. */
static mpr_err_t pipelined(pipeline_t *p, pipeline_schedule_t s, mpr_tensor_t *x, mpr_tensor_t *y, int M, double *loss,
                           mpr_tensor_t ***gd, int64_t *peak) {
    int64_t ctx = 0;
    mpr_err_t e = quiet_stages(p);
    if (!e) e = mpr_dist_context_begin(&ctx);
    if (!e) e = pipeline_step(p, s, ctx, x, y, M, loss);
    if (!e) e = pipeline_gradients(p, ctx, gd);
    if (!e) e = pipeline_memory(p, peak, NULL);
    if (ctx) {
        mpr_err_t e2 = mpr_dist_context_end(ctx);
        if (!e) e = e2;
    }
    return e;
}

/* Compare gd with m's .grad: prints a line per parameter; *max_rel; 0 if all match, else 1. */
static int compare(mpr_module_t *m, pipeline_t *p, mpr_tensor_t **gd, const char *sched, double *max_rel) {
    int rc = 0;
    *max_rel = 0;
    for (int i = 0; i < p->nparams; i++) {
        const char *name;
        mpr_tensor_t *param = mpr_module_parameter(m, i, &name), *gl = mpr_tensor_grad(param);
        if (!gl || mpr_tensor_numel(gl) != mpr_tensor_numel(gd[i])) {
            printf("%s %s: no local gradient or a different size\n", sched, name);
            rc = 1;
            continue;
        }
        const float *a = mpr_tensor_data(gd[i]), *b = mpr_tensor_data(gl);
        int64_t n = mpr_tensor_numel(gl), bad = 0;
        double gmax = 0, dmax = 0;
        for (int64_t k = 0; k < n; k++) {
            gmax = fmax(gmax, fabs(b[k]));
            dmax = fmax(dmax, fabs((double)a[k] - (double)b[k]));
        }
        double worst = gmax > 0 ? dmax / gmax : INFINITY;
        for (int64_t k = 0; k < n; k++) bad += fabs((double)a[k] - (double)b[k]) > 1e-5 * gmax;
        *max_rel = fmax(*max_rel, worst);
        printf("%-5s %-14s %8lld elements, largest |g| %.3g, largest |difference| / largest |g| %.3g%s\n", sched, name,
               (long long)n, gmax, worst, bad ? " MISMATCH" : "");
        if (bad || gmax == 0) rc = 1;
    }
    return rc;
}

/* A micro-batch the first stage cannot take (its rows cut to 5 features):
 * the forward fails with the first stage's failure as it is, however many
 * stages it went through on the way (MPR_ERR_REMOTE, origin rank 1, the
 * call chain from the last stage down in the text), and the stages stay
 * usable. 0 if so. */
static int failure_reported(pipeline_t *p, mpr_tensor_t *x, int M) {
    int64_t ctx = 0, prev = 0;
    if (mpr_dist_context_begin(&ctx) || mpr_dist_context_set_current(ctx, &prev)) return fail_setup("context");
    mpr_scope_begin();
    mpr_tensor_t *bad = mpr_contiguous(mpr_narrow(mpr_reshape(x, 2, (int64_t[]){mpr_tensor_shape(x)[0], -1}), 1, 0, 5));
    mpr_tensor_t *out = NULL;
    mpr_err_t e = bad ? pipeline_forward(p, bad, M, &out) : mpr_last_error_code();
    int origin = mpr_last_error_origin();
    char msg[MPR_ERROR_TEXT_MAX];
    snprintf(msg, sizeof msg, "%s", mpr_last_error());
    mpr_scope_end();
    mpr_dist_context_set_current(prev, NULL);
    mpr_dist_context_end(ctx);
    int rc = 0;
    if (e != MPR_ERR_REMOTE || origin != 1 || !strstr(msg, "stage1") ||
        (p->nstages > 1 && !strstr(msg, "call chain"))) {
        fprintf(stderr, "pipeline_grad_check: a bad micro-batch gave %s, origin %d: %s\n", mpr_error_name(e), origin, msg);
        rc = 1;
    }
    mpr_tensor_release(out);
    printf("bad micro-batch: %s from rank %d: %s\n", mpr_error_name(e), origin, msg);
    return rc;
}

static int check(const char *kind, int M, int64_t B, uint64_t seed, const char *which) {
    app_dataset_t data;
    if (app_fmnist_load(NULL, app_fmnist_model_flat(kind), &data)) return fail_setup("data");
    int S = mpr_world_size() - 1;
    pipeline_t *p = pipeline_create(kind, S, seed);
    if (!p) {
        app_dataset_free(&data);
        return fail_setup("stages");
    }
    pipeline_schedule_t list[2];
    int ns = 0;
    if (strcmp(which, "1f1b")) list[ns++] = PIPELINE_GPIPE;
    if (strcmp(which, "gpipe")) list[ns++] = PIPELINE_1F1B;
    mpr_scope_begin();
    mpr_tensor_t *x = mpr_narrow(data.train_x, 0, 0, B), *y = mpr_narrow(data.train_y, 0, 0, B);
    double loss[2] = {NAN, NAN}, rel[2] = {0, 0};
    int64_t peak[2][64];
    mpr_tensor_t **gd[2] = {NULL, NULL};
    mpr_module_t *m = NULL;
    int rc = 0;
    for (int i = 0; rc == 0 && i < ns; i++)
        if (pipelined(p, list[i], x, y, M, &loss[i], &gd[i], peak[i])) rc = fail_setup(pipeline_schedule_name(list[i]));
    if (!rc && !(m = local_gradients(kind, seed, x, y, M)))
        rc = fail_setup("the local step");
    else if (!rc && mpr_module_num_parameters(m) != p->nparams) {
        fprintf(stderr, "pipeline_grad_check: %d local parameters, %d in the stages\n", mpr_module_num_parameters(m),
                p->nparams);
        rc = 2;
    }
    for (int i = 0; m && rc != 2 && i < ns; i++)
        if (compare(m, p, gd[i], pipeline_schedule_name(list[i]), &rel[i])) rc = 1;
    if (rc == 0 && list[0] == PIPELINE_GPIPE) rc = failure_reported(p, x, M);
    printf("{\"ok\":%s,\"model\":\"%s\",\"stages\":%d,\"micro_batches\":%d,\"parameters\":%d,\"loss\":%.6f,"
           "\"max_rel\":%.3g",
           rc == 0 ? "true" : "false", kind, S, M, p->nparams, loss[0], fmax(rel[0], rel[1]));
    for (int i = 0; rc != 2 && i < ns; i++) {
        const char *n = pipeline_schedule_name(list[i]);
        printf(",\"loss_%s\":%.6f,\"max_rel_%s\":%.3g,\"peak_%s\":[", n, loss[i], n, rel[i], n);
        for (int k = 0; k < S; k++) printf("%s%lld", k ? "," : "", (long long)peak[i][k]);
        printf("]");
    }
    printf("}\n");
    for (int j = 0; j < 2; j++)
        for (int i = 0; gd[j] && i < p->nparams; i++) mpr_tensor_release(gd[j][i]);
    free(gd[0]);
    free(gd[1]);
    mpr_scope_end();
    mpr_module_destroy(m);
    pipeline_destroy(p);
    app_dataset_free(&data);
    return rc;
}

int main(int argc, char **argv) {
    const char *which = argc == 6 ? argv[5] : "gpipe";
    if ((argc != 5 && argc != 6) || (strcmp(which, "gpipe") && strcmp(which, "1f1b") && strcmp(which, "both"))) {
        fprintf(stderr, "usage: mpiexec -n S+1 %s MODEL MICRO_BATCHES BATCH SEED [gpipe|1f1b|both]\n", argv[0]);
        return 2;
    }
    const char *kind = argv[1];
    int M = atoi(argv[2]);
    int64_t B = atoll(argv[3]);
    uint64_t seed = strtoull(argv[4], NULL, 10);
    if (M < 1 || B < M || B % M) {
        fprintf(stderr, "pipeline_grad_check: BATCH must be a multiple of MICRO_BATCHES >= 1\n");
        return 2;
    }
    mpr_blas_set_num_threads(1);
    if (pipeline_stage_register()) return fail_setup("register");
    int rank = app_launch_rank();
    char name[32];
    if (rank)
        snprintf(name, sizeof name, "stage%d", rank);
    else
        snprintf(name, sizeof name, "driver");
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.name = name;
    opts.argc = &argc, opts.argv = &argv;
    if (mpr_init(&opts)) return fail_setup("mpr_init");
    int rc = 0;
    if (mpr_world_size() < 2) {
        fprintf(stderr, "pipeline_grad_check: needs 2 ranks or more\n");
        rc = 2;
    } else if (rank == 0) {
        rc = check(kind, M, B, seed, which);
    }
    /* the stages' exit status is 0: mpiexec reports the driver's */
    mpr_shutdown(true);
    return rc;
}
