/* pipeline_grad_check.c — test tool (an MPI program): the gradients of one
 * pipelined mini-batch equal those of the same model run unsplit on one rank.
 *
 *   mpiexec -n S+1 pipeline_grad_check MODEL MICRO_BATCHES BATCH SEED
 *
 * Rank 0 builds the pipeline app's S stages on ranks 1..S (pipeline_gpipe.h),
 * runs one GPipe forward + dist backward of the first BATCH training images
 * of Fashion-MNIST in MICRO_BATCHES micro-batches, and fetches every stage's
 * gradients from the dist context. Then it builds the unsplit model
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
 * Prints one line per parameter and a JSON line
 * {"ok":..., "parameters":..., "max_rel":...}; exit 0 if all match, 1 if
 * not, 2 on usage or setup errors. */
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

static int check(const char *kind, int M, int64_t B, uint64_t seed) {
    app_dataset_t data;
    if (app_fmnist_load(NULL, app_fmnist_model_flat(kind), &data)) return fail_setup("data");
    int S = mpr_world_size() - 1;
    pipeline_t *p = pipeline_create(kind, S, seed);
    if (!p) {
        app_dataset_free(&data);
        return fail_setup("stages");
    }
    mpr_scope_begin();
    mpr_tensor_t *x = mpr_narrow(data.train_x, 0, 0, B), *y = mpr_narrow(data.train_y, 0, 0, B);
    int64_t ctx = 0;
    double loss = NAN;
    mpr_tensor_t **gd = NULL;
    mpr_module_t *m = NULL;
    int rc = 2;
    if (mpr_dist_context_begin(&ctx) || pipeline_forward_backward(p, ctx, x, y, M, &loss) ||
        pipeline_gradients(p, ctx, &gd))
        fail_setup("the pipelined step");
    else if (!(m = local_gradients(kind, seed, x, y, M)))
        fail_setup("the local step");
    else if (mpr_module_num_parameters(m) != p->nparams)
        fprintf(stderr, "pipeline_grad_check: %d local parameters, %d in the stages\n", mpr_module_num_parameters(m),
                p->nparams);
    else
        rc = 0;
    double max_rel = 0;
    for (int i = 0; rc == 0 && i < p->nparams; i++) {
        const char *name;
        mpr_tensor_t *param = mpr_module_parameter(m, i, &name), *gl = mpr_tensor_grad(param);
        if (!gl || mpr_tensor_numel(gl) != mpr_tensor_numel(gd[i])) {
            printf("%s: no local gradient or a different size\n", name);
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
        max_rel = fmax(max_rel, worst);
        printf("%-14s %8lld elements, largest |g| %.3g, largest |difference| / largest |g| %.3g%s\n", name, (long long)n, gmax,
               worst, bad ? " MISMATCH" : "");
        if (bad || gmax == 0) rc = 1;
    }
    printf("{\"ok\":%s,\"model\":\"%s\",\"stages\":%d,\"micro_batches\":%d,\"parameters\":%d,\"loss\":%.6f,"
           "\"max_rel\":%.3g}\n",
           rc == 0 ? "true" : "false", kind, S, M, p->nparams, loss, max_rel);
    for (int i = 0; gd && i < p->nparams; i++) mpr_tensor_release(gd[i]);
    free(gd);
    if (ctx) mpr_dist_context_end(ctx);
    mpr_scope_end();
    mpr_module_destroy(m);
    pipeline_destroy(p);
    app_dataset_free(&data);
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: mpiexec -n S+1 %s MODEL MICRO_BATCHES BATCH SEED\n", argv[0]);
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
        rc = check(kind, M, B, seed);
    }
    /* the stages' exit status is 0: mpiexec reports the driver's */
    mpr_shutdown(true);
    return rc;
}
