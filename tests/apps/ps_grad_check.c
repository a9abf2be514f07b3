/* ps_grad_check.c — test tool: the gradients of one param_server step equal
 * a local computation of the same model on the same batch.
 *
 *   ps_grad_check CKPT_DIR MODEL SEED BATCH LR [TRAIN_LIMIT]
 *
 * CKPT_DIR holds the checkpoint of a one-step run (param_server --max-steps 1
 * --optimizer sgd --lr LR, one trainer, --seed SEED --batch BATCH); its
 * parameters are p1 = p0 - LR * g with g the distributed gradients. This
 * builds the same model locally (p0), takes the run's first batch
 * (app_epoch_batches with the same seed, epoch 0, shard 0 of 1), runs
 * forward and backward locally (g_local) and checks (p0 - p1) / LR against
 * g_local element by element (|diff| <= 1e-6 + 1e-4 |g_local|). Exit 0 if
 * all match, 1 if not, 2 on usage or read errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "app.h"
#include "fmnist_models.h"
#include "mpirpc/autograd.h"
#include "mpirpc/tensor_ops.h"

int main(int argc, char **argv) {
    if (argc < 6 || argc > 7) {
        fprintf(stderr, "usage: %s CKPT_DIR MODEL SEED BATCH LR [TRAIN_LIMIT]\n", argv[0]);
        return 2;
    }
    const char *model = argv[2];
    uint64_t seed = strtoull(argv[3], NULL, 10);
    int64_t batch = atoll(argv[4]), limit = argc == 7 ? atoll(argv[6]) : 0;
    double lr = atof(argv[5]);
    mpr_tensor_dict_t *ck;
    app_ckpt_state_t st;
    app_dataset_t data;
    if (app_ckpt_load_latest(argv[1], &ck, &st, NULL) || app_fmnist_load(NULL, app_fmnist_model_flat(model), &data)) {
        fprintf(stderr, "%s\n", mpr_last_error());
        return 2;
    }
    if (st.step != 1) {
        fprintf(stderr, "the checkpoint is at step %lld, not 1\n", (long long)st.step);
        return 2;
    }
    mpr_module_t *m = app_fmnist_model_create(model, seed);
    int64_t n = mpr_tensor_shape(data.train_x)[0];
    if (limit > 0 && limit < n) n = limit;
    mpr_scope_begin();
    mpr_tensor_t *xs = mpr_narrow(data.train_x, 0, 0, n), *ys = mpr_narrow(data.train_y, 0, 0, n);
    mpr_batch_iter_t *it = app_epoch_batches(xs, ys, batch, seed, 0, 0, 0);
    mpr_tensor_t *x, *y;
    if (!m || !it || !mpr_batch_iter_next(it, &x, &y)) {
        fprintf(stderr, "%s\n", mpr_last_error());
        return 2;
    }
    mpr_tensor_t *loss = mpr_nll_loss(mpr_module_forward(m, x), y);
    if (!loss || mpr_backward(loss, NULL, false)) {
        fprintf(stderr, "%s\n", mpr_last_error());
        return 2;
    }
    int rc = 0;
    for (int i = 0; i < mpr_module_num_parameters(m); i++) {
        const char *name;
        mpr_tensor_t *p0 = mpr_module_parameter(m, i, &name);
        char key[256];
        snprintf(key, sizeof key, "model.%s", name);
        mpr_tensor_t *p1 = mpr_tensor_dict_get(ck, key), *g = mpr_tensor_grad(p0);
        if (!p1 || !g || mpr_tensor_numel(p1) != mpr_tensor_numel(p0)) {
            fprintf(stderr, "%s: missing in the checkpoint, or no local gradient\n", key);
            rc = 1;
            continue;
        }
        const float *a = mpr_tensor_data(p0), *b = mpr_tensor_data(p1), *gl = mpr_tensor_data(g);
        double worst = 0, gmax = 0;
        int64_t bad = 0;
        for (int64_t k = 0; k < mpr_tensor_numel(p0); k++) {
            double gd = ((double)a[k] - (double)b[k]) / lr, d = fabs(gd - gl[k]);
            worst = fmax(worst, d);
            gmax = fmax(gmax, fabs(gl[k]));
            bad += d > 1e-6 + 1e-4 * fabs(gl[k]);
        }
        printf("%-12s %8lld elements, largest |g| %.3g, largest |g_dist - g_local| %.3g%s\n", name,
               (long long)mpr_tensor_numel(p0), gmax, worst, bad ? "  MISMATCH" : "");
        if (bad || gmax == 0) rc = 1;
    }
    mpr_scope_end();
    mpr_batch_iter_destroy(it);
    mpr_module_destroy(m);
    mpr_tensor_dict_destroy(ck);
    app_dataset_free(&data);
    return rc;
}
