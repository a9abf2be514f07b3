/* ps_common.c — options, roles, data shards and the summary of the
 * parameter-server apps (ps_common.h).
 *
 * Invariants: every trainer's shard has exactly floor(N / T) rows, so
 * steps_per_epoch is the same on every trainer (the batch PS waits for all
 * of them at every step; the dist PS's syncs count on it too). */
#include <stdlib.h>
#include <string.h>

#include "fmnist_models.h"
#include "mpirpc/init.h"
#include "mpirpc/tensor_ops.h"
#include "ps_common.h"

void ps_config_parse(int argc, char **argv, const char *summary, ps_config_t *cfg) {
    *cfg = (ps_config_t){.epochs = 1, .batch = 64, .ps = 1, .max_steps = 0, .train_limit = 0,
                         .metrics_every = 50, .keep = 2, .threads = 4, .lr = 0.05, .momentum = 0,
                         .weight_decay = 0, .optimizer = "sgd", .model = "mlp"};
    app_option_t opts[] = {
        {"model", APP_OPT_CHOICE, &cfg->model, 0, 0, APP_FMNIST_MODELS, "model"},
        {"epochs", APP_OPT_INT, &cfg->epochs, 1, 10000, NULL, "passes over the training set"},
        {"batch", APP_OPT_INT, &cfg->batch, 1, 60000, NULL, "mini-batch size per trainer"},
        {"lr", APP_OPT_DOUBLE, &cfg->lr, 0, 100, NULL, "learning rate"},
        {"optimizer", APP_OPT_CHOICE, &cfg->optimizer, 0, 0, "sgd|adam|adamw|adagrad|rmsprop", "optimizer"},
        {"momentum", APP_OPT_DOUBLE, &cfg->momentum, 0, 1, NULL, "momentum (sgd, rmsprop)"},
        {"weight-decay", APP_OPT_DOUBLE, &cfg->weight_decay, 0, 1, NULL, "weight decay"},
        {"ps", APP_OPT_INT, &cfg->ps, 1, 64, NULL, "parameter-server ranks (the model is sharded across them)"},
        {"max-steps", APP_OPT_INT, &cfg->max_steps, 0, 1e12, NULL, "stop after this many steps in all (0: no limit)"},
        {"train-limit", APP_OPT_INT, &cfg->train_limit, 0, 60000, NULL, "use only the first N training images (0: all)"},
        {"metrics-every", APP_OPT_INT, &cfg->metrics_every, 1, 1e9, NULL, "steps per metrics row"},
        {"keep", APP_OPT_INT, &cfg->keep, 1, 1000, NULL, "checkpoints kept"},
        {"threads", APP_OPT_INT, &cfg->threads, 1, 256, NULL, "RPC worker threads per rank"},
        {0}};
    app_parse_options_or_exit(argc, argv, summary, opts, &cfg->common);
    int stages = app_fmnist_model_stages(cfg->model);
    if (cfg->ps > stages) {
        if (app_launch_rank() == 0)
            fprintf(stderr, "%s: option --ps: model %s has %d shardable stages, so at most --ps %d (try --help)\n",
                    argv[0], cfg->model, stages, stages);
        exit(2);
    }
}

void ps_optim_options(const ps_config_t *cfg, mpr_optim_options_t *o) {
    mpr_optim_options_default(cfg->optimizer, o);
    o->lr = cfg->lr;
    o->weight_decay = cfg->weight_decay;
    if (!strcmp(cfg->optimizer, "sgd") || !strcmp(cfg->optimizer, "rmsprop")) o->momentum = cfg->momentum;
}


void ps_worker_name(int rank, int nps, char *buf, size_t cap) {
    if (rank < nps)
        snprintf(buf, cap, "ps%d", rank);
    else
        snprintf(buf, cap, "trainer%d", rank - nps);
}

mpr_err_t ps_layout_get(int nps, ps_layout_t *out) {
    mpr_worker_info_t me;
    mpr_err_t e = mpr_get_self_worker_info(&me);
    if (e) return e;
    int world = mpr_world_size();
    *out = (ps_layout_t){.rank = me.rank, .world = world, .nps = nps, .ntrainers = world - nps,
                         .trainer = me.rank >= nps ? me.rank - nps : -1, .leader_rank = nps};
    if (world <= nps)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%d ranks and --ps %d leave no trainer: start more ranks (mpirun -np %d or more)",
                             world, nps, nps + 1);
    return MPR_OK;
}

mpr_err_t ps_trainer_data_load(const ps_config_t *cfg, const ps_layout_t *lay, ps_trainer_data_t *out) {
    *out = (ps_trainer_data_t){0};
    app_dataset_t d;
    mpr_err_t e = app_fmnist_load(cfg->common.data_dir, app_fmnist_model_flat(cfg->model), &d);
    if (e) return e;
    int64_t n = mpr_tensor_shape(d.train_x)[0];
    if (cfg->train_limit > 0 && cfg->train_limit < n) n = cfg->train_limit;
    int64_t rows = n / lay->ntrainers;
    out->steps_per_epoch = rows / cfg->batch;
    if (out->steps_per_epoch < 1) {
        app_dataset_free(&d);
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%lld training images over %d trainers give no batch of %lld",
                             (long long)n, lay->ntrainers, (long long)cfg->batch);
    }
    mpr_scope_begin();
    mpr_tensor_t *xs = mpr_narrow(d.train_x, 0, 0, n), *ys = mpr_narrow(d.train_y, 0, 0, n);
    mpr_tensor_t *sx = xs ? app_shard_rows(xs, lay->trainer, lay->ntrainers) : NULL;
    mpr_tensor_t *sy = ys ? app_shard_rows(ys, lay->trainer, lay->ntrainers) : NULL;
    if (sx && sy) {
        out->x = mpr_scope_keep(mpr_narrow(sx, 0, 0, rows));
        out->y = mpr_scope_keep(mpr_narrow(sy, 0, 0, rows));
    }
    mpr_tensor_release(sx);
    mpr_tensor_release(sy);
    mpr_scope_end();
    out->test_x = mpr_tensor_retain(d.test_x);
    out->test_y = mpr_tensor_retain(d.test_y);
    app_dataset_free(&d);
    if (!out->x || !out->y) {
        ps_trainer_data_free(out);
        return mpr_last_error_code() ? mpr_last_error_code() : MPR_ERR_NOMEM;
    }
    return MPR_OK;
}

void ps_trainer_data_free(ps_trainer_data_t *d) {
    mpr_tensor_release(d->x);
    mpr_tensor_release(d->y);
    mpr_tensor_release(d->test_x);
    mpr_tensor_release(d->test_y);
    *d = (ps_trainer_data_t){0};
}

void ps_print_summary(const ps_config_t *cfg, const ps_layout_t *lay, const char *mode, int64_t steps,
                      double samples_per_s, double train_s, double test_acc) {
    fprintf(stderr, "done: %lld steps per trainer, %d trainer(s), %d PS: %.1f samples/s, test accuracy %.4f\n",
            (long long)steps, lay->ntrainers, lay->nps, samples_per_s, test_acc);
    printf("{\"name\":\"ps_app\",\"mode\":\"%s\",\"model\":\"%s\",\"trainers\":%d,\"ps\":%d,\"epochs\":%lld,"
           "\"batch\":%lld,\"lr\":%g,\"optimizer\":\"%s\",\"steps\":%lld,\"train_s\":%.3f,\"samples_per_s\":%.1f,"
           "\"test_acc\":%.4f}\n",
           mode, cfg->model, lay->ntrainers, lay->nps, (long long)cfg->epochs, (long long)cfg->batch, cfg->lr,
           cfg->optimizer, (long long)steps, train_s, samples_per_s, test_acc);
    fflush(stdout);
}
