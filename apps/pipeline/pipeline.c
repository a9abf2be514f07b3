/* pipeline.c — pipeline-parallel training on Fashion-MNIST (PyTorch's
 * "Distributed Pipeline Parallelism Using RPC" tutorial, as an MPI program):
 *
 *   mpirun -np 3 build/apps/pipeline/pipeline --micro-batches 8       # 2 stages
 *   mpirun -np 4 build/apps/pipeline/pipeline --model mlp-deep        # 3 stages
 *
 * Rank 0 ("driver") drives; ranks 1..S ("stage1".."stage<S>", --stages S,
 * default every other rank) each hold one stage of the model, a
 * RemoteModule (pipeline_stage.h); further ranks idle. The model is split
 * into S stages of similar compute (pipeline_gpipe.h says how), and each
 * stage's measured forward + backward time on one micro-batch is printed.
 * One training step of a mini-batch of B rows:
 *
 *   dist context begin -> GPipe forward of M micro-batches of B / M rows
 *   (stage to stage with async calls, pipeline_gpipe.h) -> outputs
 *   concatenated -> cross entropy -> one mpr_dist_backward -> one
 *   DistributedOptimizer (SGD) step on every stage -> context end
 *
 * or with --schedule 1f1b (pipeline_1f1b.c): a context per micro-batch, its
 * backward as soon as its forward is done, at most S in flight, its
 * gradients added into the mini-batch's context and its context ended at
 * once; then the same one DistributedOptimizer step. Each stage's peak
 * activation memory (the bytes its graphs keep saved for backward,
 * mpr_autograd_saved_bytes, sampled after every forward and backward on the
 * stage) over the training steps is printed for either schedule.
 *
 * The driver shows a progress line, writes the metrics CSV and PNG (with
 * test accuracy after every epoch) and checkpoints (the stages' parameters,
 * fetched with PIPELINE_STATE_FN, and the DistributedOptimizer's state under
 * "optim.", so --resume continues exactly). Last, one JSON line on stdout:
 * {"name":"pipeline","schedule":...,"stages":S,"micro_batches":M,"ms_per_batch":...,
 * "peak_act_bytes":[per stage],...}
 * where ms_per_batch is the median step time after two warm-up steps.
 *
 * Invariants: only the driver calls the stages, one step at a time; a
 * checkpoint is taken between steps (no context alive). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "fmnist_models.h"
#include "mpirpc/mpirpc.h"
#include "pipeline_gpipe.h"
#include "pipeline_stage.h"

static const char *summary =
    "pipeline: pipeline-parallel training on Fashion-MNIST (GPipe or 1F1B schedule over RPC).\n"
    "Rank 0 drives; ranks 1..S each hold one stage of the model; every mini-batch flows through the stages\n"
    "as micro-batches; gpipe: all forwards, then one distributed backward; 1f1b: each micro-batch's backward\n"
    "as soon as its forward is done, at most S in flight; then one DistributedOptimizer step.\n"
    "usage: mpirun -np N pipeline [options]      (N > --stages)";

typedef struct config {
    int64_t stages, micro, batch, epochs, max_steps, train_limit, test_limit, metrics_every, keep, threads, reps;
    double lr;
    const char *model; /* option value: cnn | mlp-deep */
    const char *schedule_name; /* option value: gpipe | 1f1b */
    const char *bind_stages;   /* option value: auto | off */
    pipeline_schedule_t schedule;
    const char *kind;  /* fmnist_models.h kind */
    app_common_t common;
} config_t;

static void usage_error(const char *prog, const char *msg) {
    if (app_launch_rank() == 0) fprintf(stderr, "%s: %s (try --help)\n", prog, msg);
    exit(2);
}

static void parse(int argc, char **argv, config_t *c) {
    *c = (config_t){.stages = 0, .micro = 4, .batch = 64, .epochs = 1, .metrics_every = 50, .keep = 2,
                    .threads = 8, .reps = 5, .lr = 0.05, .model = "cnn",
                    .schedule_name = "gpipe", .bind_stages = "auto"};
    app_option_t opts[] = {
        {"stages", APP_OPT_INT, &c->stages, 0, 64, NULL, "pipeline stages, one rank each (0: every rank but the driver)"},
        {"micro-batches", APP_OPT_INT, &c->micro, 1, 60000, NULL, "micro-batches per mini-batch (must divide --batch)"},
        {"batch", APP_OPT_INT, &c->batch, 1, 60000, NULL, "mini-batch size"},
        {"model", APP_OPT_CHOICE, &c->model, 0, 0, "cnn|mlp-deep", "model (cnn: the PyTorch anchor's CNN)"},
        {"schedule", APP_OPT_CHOICE, &c->schedule_name, 0, 0, "gpipe|1f1b",
         "gpipe: all forwards, one backward; 1f1b: one forward, one backward, at most S micro-batches in flight"},
        {"epochs", APP_OPT_INT, &c->epochs, 1, 10000, NULL, "passes over the training set"},
        {"lr", APP_OPT_DOUBLE, &c->lr, 0, 100, NULL, "learning rate (SGD)"},
        {"max-steps", APP_OPT_INT, &c->max_steps, 0, 1e12, NULL, "stop after this many steps in all (0: no limit)"},
        {"train-limit", APP_OPT_INT, &c->train_limit, 0, 60000, NULL, "use only the first N training images (0: all)"},
        {"test-limit", APP_OPT_INT, &c->test_limit, 0, 10000, NULL, "evaluate on the first N test images (0: all)"},
        {"metrics-every", APP_OPT_INT, &c->metrics_every, 1, 1e9, NULL, "steps per metrics row"},
        {"keep", APP_OPT_INT, &c->keep, 1, 1000, NULL, "checkpoints kept"},
        {"threads", APP_OPT_INT, &c->threads, 1, 256, NULL, "RPC worker threads per rank"},
        {"profile-reps", APP_OPT_INT, &c->reps, 0, 1000, NULL, "timed runs per stage for the stage times (0: none)"},
        {"bind-stages", APP_OPT_CHOICE, &c->bind_stages, 0, 0, "auto|off",
         "auto: each stage rank the launcher left free gets an equal share of its host's cores, at least "
         "one (a host's only stage keeps them all; the driver is not bound); off: keep the launcher's placement"},
        {0}};
    app_parse_options_or_exit(argc, argv, summary, opts, &c->common);
    c->kind = strcmp(c->model, "cnn") == 0 ? "tutorial-cnn" : c->model;
    c->schedule = strcmp(c->schedule_name, "1f1b") == 0 ? PIPELINE_1F1B : PIPELINE_GPIPE;
    char msg[256];
    int groups = app_fmnist_model_stages(c->kind);
    if (c->stages > groups) {
        snprintf(msg, sizeof msg, "option --stages: model %s has %d layers to split, so at most --stages %d", c->model,
                 groups, groups);
        usage_error(argv[0], msg);
    }
    if (c->batch % c->micro) {
        snprintf(msg, sizeof msg, "option --micro-batches: %lld does not divide --batch %lld", (long long)c->micro,
                 (long long)c->batch);
        usage_error(argv[0], msg);
    }
}

/* --bind-stages auto (collective: every rank calls it after mpr_init): each
 * stage rank on its share of the host's cores unless the launcher bound it
 * already (app_bind_compute_rank says how and why); the driver says where
 * they went. */
static void bind_stages(const config_t *c, int rank, int world) {
    if (strcmp(c->bind_stages, "off") == 0) return;
    int mine[2] = {-1, 0}; /* first core, how many */
    char what[160];
    if (app_bind_compute_rank(rank >= 1 && rank <= c->stages, &mine[0], &mine[1], what, sizeof what))
        fprintf(stderr, "pipeline: --bind-stages on rank %d: %s\n", rank, mpr_last_error());
    int *cores = rank == 0 ? malloc(sizeof *cores * 2 * (size_t)world) : NULL;
    int have = rank != 0 || cores != NULL;
    MPI_Bcast(&have, 1, MPI_INT, 0, MPI_COMM_WORLD); /* everyone skips the gather together */
    if (!have) return;
    MPI_Gather(mine, 2, MPI_INT, cores, 2, MPI_INT, 0, MPI_COMM_WORLD);
    if (!cores) return;
    char line[512];
    int n = 0;
    for (int r = 1; r < world && n < (int)sizeof line; r++) {
        int first = cores[2 * r], count = cores[2 * r + 1];
        if (first < 0) continue;
        if (count == 1)
            n += snprintf(line + n, sizeof line - (size_t)n, "%sstage%d core %d", n ? ", " : "", r, first);
        else
            n += snprintf(line + n, sizeof line - (size_t)n, "%sstage%d %d cores from core %d", n ? ", " : "", r,
                          count, first);
    }
    if (n > 0)
        fprintf(stderr, "pipeline: stage ranks bound to cores (%s); --bind-stages off keeps the "
                        "launcher's placement\n", line);
    free(cores);
}

/* ------------------------------------------------------------ the driver */

typedef struct driver {
    const config_t *cfg;
    pipeline_t *pipe;
    mpr_dist_optimizer_t *opt;
    mpr_tensor_t *x, *y, *test_x, *test_y;
    int64_t steps_per_epoch;
    app_ckpt_state_t start, now;
    app_progress_t *bar;
    app_metrics_t *csv;
    double t_run, work_s;          /* the run's start; time spent evaluating / checkpointing */
    double row_loss, row_t;        /* the current metrics row */
    int64_t row_n;
    double first_loss, last_loss, last_acc;
    double *step_ms;               /* this run's step times */
    int64_t nsteps;
    double *stage_ms;
    int64_t *peak_bytes;           /* per stage: peak activation memory over the training steps */
} driver_t;

static void fatal(const char *what) {
    fprintf(stderr, "pipeline: %s: %s\n", what, mpr_last_error());
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

static mpr_err_t load_data(driver_t *d) {
    app_dataset_t ds;
    mpr_err_t e = app_fmnist_load(d->cfg->common.data_dir, app_fmnist_model_flat(d->cfg->kind), &ds);
    if (e) return e;
    int64_t n = mpr_tensor_shape(ds.train_x)[0], nt = mpr_tensor_shape(ds.test_x)[0];
    if (d->cfg->train_limit > 0 && d->cfg->train_limit < n) n = d->cfg->train_limit;
    if (d->cfg->test_limit > 0 && d->cfg->test_limit < nt) nt = d->cfg->test_limit;
    d->steps_per_epoch = n / d->cfg->batch;
    mpr_scope_begin();
    d->x = mpr_scope_keep(mpr_narrow(ds.train_x, 0, 0, n));
    d->y = mpr_scope_keep(mpr_narrow(ds.train_y, 0, 0, n));
    d->test_x = mpr_scope_keep(mpr_narrow(ds.test_x, 0, 0, nt));
    d->test_y = mpr_scope_keep(mpr_narrow(ds.test_y, 0, 0, nt));
    mpr_scope_end();
    app_dataset_free(&ds);
    if (!d->x || !d->y || !d->test_x || !d->test_y) return mpr_last_error_code();
    if (d->steps_per_epoch < 1)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%lld training images give no batch of %lld", (long long)n,
                             (long long)d->cfg->batch);
    return MPR_OK;
}

/* Test accuracy through the pipeline (no dist context: the stages record nothing). */
static mpr_err_t evaluate(driver_t *d, double *acc) {
    int64_t n = mpr_tensor_shape(d->test_x)[0], correct = 0, M = d->cfg->micro;
    int64_t chunk = (1024 / M) * M > 0 ? (1024 / M) * M : M;
    for (int64_t i = 0; i < n; i += chunk) {
        int64_t len = n - i < chunk ? n - i : chunk;
        mpr_scope_begin();
        mpr_tensor_t *x = mpr_narrow(d->test_x, 0, i, len), *y = mpr_narrow(d->test_y, 0, i, len), *out = NULL;
        mpr_err_t e = x && y ? pipeline_forward(d->pipe, x, len % M ? 1 : (int)M, &out) : mpr_last_error_code();
        int64_t c = e ? -1 : app_count_correct(out, y);
        mpr_tensor_release(out);
        mpr_scope_end();
        if (c < 0) return mpr_last_error_code();
        correct += c;
    }
    *acc = (double)correct / (double)n;
    return MPR_OK;
}

static mpr_err_t checkpoint(driver_t *d) {
    mpr_tensor_dict_t *dict = mpr_tensor_dict_create();
    if (!dict) return mpr_last_error_code();
    mpr_err_t e = MPR_OK;
    for (int k = 0; !e && k < d->pipe->nstages; k++) {
        char name[32];
        snprintf(name, sizeof name, "stage%d", k + 1);
        mpr_value_t *r = NULL;
        const void *buf;
        size_t len;
        if (!(e = mpr_rpc_sync(mpr_to_name(name), PIPELINE_STATE_FN, NULL, MPR_TIMEOUT_DEFAULT, &r)) &&
            !(e = mpr_value_get_bytes(r, &buf, &len)))
            e = app_dict_merge_encoded(dict, buf, len, "a stage's parameters");
        mpr_value_release(r);
    }
    if (!e) e = mpr_dist_optimizer_state_export(d->opt, dict, "optim."); /* gathered from the stages */
    if (!e) e = mpr_tensor_dict_set_meta(dict, "pipeline.model", d->cfg->kind);
    if (!e) e = app_ckpt_save(d->cfg->common.checkpoint_dir, dict, &d->now, (int)d->cfg->keep);
    mpr_tensor_dict_destroy(dict);
    return e;
}

/* --resume: the newest checkpoint's parameters into every stage, and the
 * DistributedOptimizer's state into every stage's local optimizer. */
static mpr_err_t restore(driver_t *d) {
    mpr_tensor_dict_t *dict = NULL;
    char *path = NULL;
    const char *const run[] = {"pipeline.model", d->cfg->kind, NULL};
    mpr_err_t e = app_ckpt_load_run(d->cfg->common.checkpoint_dir, (uint64_t)d->cfg->common.seed, run, &dict, &d->start,
                                    &path);
    if (e) return e;
    mpr_dest_t *stages = calloc((size_t)d->pipe->nstages, sizeof *stages);
    char (*names)[32] = calloc((size_t)d->pipe->nstages, sizeof *names);
    if (!stages || !names) e = mpr_error_set(MPR_ERR_NOMEM, "out of memory");
    for (int k = 0; !e && k < d->pipe->nstages; k++) {
        snprintf(names[k], sizeof names[k], "stage%d", k + 1);
        stages[k] = mpr_to_name(names[k]);
    }
    if (!e) e = app_ckpt_send(dict, d->pipe->nstages, stages, PIPELINE_LOAD_FN);
    free(stages);
    free(names);
    if (!e) e = mpr_dist_optimizer_state_import(d->opt, dict, "optim.");
    if (!e)
        fprintf(stderr, "Resumed from %s (step %lld, epoch %lld)\n", path, (long long)d->start.step,
                (long long)d->start.epoch + 1);
    free(path);
    mpr_tensor_dict_destroy(dict);
    return e;
}

static double wall(const driver_t *d) { return d->start.wall_s + app_now() - d->t_run; }

static void metrics_row(driver_t *d, double test_acc) {
    double now = app_now(), samples = (double)(d->row_n * d->cfg->batch);
    double rate = d->row_n && now > d->row_t ? samples / (now - d->row_t) : NAN;
    int64_t epoch = d->now.epoch + (d->now.step_in_epoch ? 1 : 0);
    if (app_metrics_write(d->csv, d->now.step, epoch, wall(d), d->row_n ? d->row_loss / (double)d->row_n : NAN, rate,
                          test_acc, NULL))
        fprintf(stderr, "warning: %s\n", mpr_last_error());
    d->row_loss = 0, d->row_n = 0, d->row_t = now;
}

/* Between steps: test accuracy (evaluate) and a checkpoint (if asked for); not counted as training time. */
static void pause_work(driver_t *d, bool evaluate_now) {
    double t0 = app_now();
    d->now.wall_s = wall(d);
    if (evaluate_now) {
        double acc = NAN;
        if (evaluate(d, &acc)) fatal("evaluation");
        d->last_acc = acc;
        app_progress_print(d->bar, "epoch %lld/%lld: test accuracy %.4f (step %lld)",
                           (long long)(d->now.epoch + (d->now.step_in_epoch ? 1 : 0)), (long long)d->cfg->epochs, acc,
                           (long long)d->now.step);
        metrics_row(d, acc);
    }
    if (d->cfg->common.checkpoint_dir && checkpoint(d)) fatal("checkpoint");
    double spent = app_now() - t0;
    d->work_s += spent;
    d->row_t += spent;
}

static mpr_err_t train_step(driver_t *d, mpr_tensor_t *x, mpr_tensor_t *y, double *loss) {
    int64_t ctx;
    mpr_err_t e = mpr_dist_context_begin(&ctx);
    if (e) return e;
    e = pipeline_step(d->pipe, d->cfg->schedule, ctx, x, y, (int)d->cfg->micro, loss);
    if (!e) e = mpr_dist_optimizer_step(d->opt, ctx);
    mpr_err_t e2 = mpr_dist_context_end(ctx);
    return e ? e : e2;
}

static void train(driver_t *d) {
    const config_t *c = d->cfg;
    int64_t spe = d->steps_per_epoch, total = c->epochs * spe;
    if (c->max_steps > 0 && c->max_steps < total) total = c->max_steps;
    int64_t step = d->start.step;
    uint64_t seed = (uint64_t)c->common.seed;
    d->now = d->start;
    d->step_ms = calloc((size_t)(total > step ? total - step : 1), sizeof *d->step_ms);
    d->bar = app_progress_create(&(app_progress_config_t){.total_steps = total, .first_step = step,
                                                          .epochs = c->epochs, .interval_s = c->common.log_interval});
    d->csv = app_metrics_open(c->common.metrics_path, NULL, 0, c->common.resume ? step : -1);
    if (!d->step_ms || !d->bar || (c->common.metrics_path && !d->csv)) fatal("--metrics");
    fprintf(stderr, "training: %s in %d stages, %s schedule, %lld steps/epoch of %lld in %lld micro-batches, SGD lr %g\n",
            c->model, d->pipe->nstages, pipeline_schedule_name(c->schedule), (long long)spe, (long long)c->batch,
            (long long)c->micro, c->lr);
    d->peak_bytes = calloc((size_t)d->pipe->nstages, sizeof *d->peak_bytes);
    if (!d->peak_bytes || pipeline_memory(d->pipe, d->peak_bytes, NULL)) fatal("activation memory"); /* a new period */
    d->t_run = d->row_t = app_now();
    int64_t paused_at = -1;
    for (int64_t epoch = d->start.epoch; epoch < c->epochs && step < total; epoch++) {
        int64_t s = epoch == d->start.epoch ? d->start.step_in_epoch : 0;
        mpr_batch_iter_t *it = app_epoch_batches(d->x, d->y, c->batch, seed, epoch, 0, s);
        if (!it) fatal("data");
        for (; s < spe && step < total; s++) {
            double loss = NAN, t0 = app_now();
            mpr_trace_begin("mini-batch"); /* a range on the driver's track when MPIRPC_TRACE is set */
            mpr_scope_begin();
            mpr_tensor_t *x, *y;
            if (!mpr_batch_iter_next(it, &x, &y)) fatal("data");
            if (train_step(d, x, y, &loss)) fatal("training step");
            mpr_scope_end();
            mpr_trace_end();
            d->step_ms[d->nsteps++] = (app_now() - t0) * 1e3;
            if (step == d->start.step) d->first_loss = loss;
            d->last_loss = loss;
            step++;
            d->now = (app_ckpt_state_t){.step = step, .epoch = epoch, .step_in_epoch = s + 1, .seed = seed};
            app_progress_update(d->bar, step, epoch + 1, c->batch, loss);
            d->row_loss += loss, d->row_n++;
            if (step % c->metrics_every == 0) metrics_row(d, NAN);
            if (c->common.checkpoint_every && step % c->common.checkpoint_every == 0 && step < total && s + 1 < spe) {
                pause_work(d, false);
                paused_at = step;
            }
        }
        mpr_batch_iter_destroy(it);
        if (s == spe) { /* a whole epoch */
            d->now = (app_ckpt_state_t){.step = step, .epoch = epoch + 1, .step_in_epoch = 0, .seed = seed};
            pause_work(d, true);
            paused_at = step;
        }
    }
    if (paused_at != step) pause_work(d, true); /* stopped mid-epoch (--max-steps) */
    if (pipeline_memory(d->pipe, d->peak_bytes, NULL)) fatal("activation memory"); /* the training steps' peaks */
    /* One write for the whole line: written piece by piece, mpirun's merged
     * output could put the JSON summary (stdout) in the middle of it. */
    char line[4096];
    int len = snprintf(line, sizeof line, "peak activation memory (%s, %lld micro-batches of %lld):",
                       pipeline_schedule_name(c->schedule), (long long)c->micro, (long long)(c->batch / c->micro));
    for (int k = 0; k < d->pipe->nstages && len > 0 && (size_t)len < sizeof line; k++)
        len += snprintf(line + len, sizeof line - (size_t)len, "%s stage %d %.3f MiB", k ? "," : "", k + 1,
                        (double)d->peak_bytes[k] / 1048576.0);
    fprintf(stderr, "%s\n", line);
    app_progress_finish(d->bar);
    app_metrics_close(d->csv);
    char *png = app_plot_path(&c->common);
    if (png && c->common.metrics_path) {
        char title[256];
        snprintf(title, sizeof title, "pipeline: %s, %d stages, %lld micro-batches of %lld, SGD lr %g", c->model,
                 d->pipe->nstages, (long long)c->micro, (long long)(c->batch / c->micro), c->lr);
        if (app_plot_metrics(c->common.metrics_path, png, title) == MPR_OK) fprintf(stderr, "plot: %s\n", png);
    }
    free(png);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void print_summary(driver_t *d) {
    const config_t *c = d->cfg;
    double train_s = app_now() - d->t_run - d->work_s;
    int64_t skip = d->nsteps > 4 ? 2 : 0; /* warm-up steps, as the anchor */
    double ms = NAN;
    if (d->nsteps > skip) {
        qsort(d->step_ms + skip, (size_t)(d->nsteps - skip), sizeof *d->step_ms, cmp_double);
        ms = d->step_ms[skip + (d->nsteps - skip) / 2];
    }
    fprintf(stderr, "done: %lld steps, %.2f ms per mini-batch (median), test accuracy %.4f\n", (long long)d->now.step,
            ms, d->last_acc);
    printf("{\"name\":\"pipeline\",\"model\":\"%s\",\"schedule\":\"%s\",\"stages\":%d,\"micro_batches\":%lld,\"batch\":%lld,\"lr\":%g,"
           "\"steps\":%lld,\"train_s\":%.3f,\"ms_per_batch\":%.3f,\"samples_per_s\":%.1f,\"first_loss\":%.5f,"
           "\"last_loss\":%.5f,\"test_acc\":%.4f,\"split\":[",
           c->model, pipeline_schedule_name(c->schedule), d->pipe->nstages, (long long)c->micro, (long long)c->batch, c->lr, (long long)d->now.step,
           train_s, ms, (double)c->batch / ms * 1e3, d->first_loss, d->last_loss, d->last_acc);
    for (int k = 0; k <= d->pipe->nstages; k++) printf("%s%d", k ? "," : "", d->pipe->first[k]);
    printf("],\"stage_ms\":[");
    for (int k = 0; k < d->pipe->nstages; k++) printf("%s%.3f", k ? "," : "", d->stage_ms ? d->stage_ms[k] : NAN);
    printf("],\"peak_act_bytes\":[");
    for (int k = 0; k < d->pipe->nstages; k++) printf("%s%lld", k ? "," : "", (long long)(d->peak_bytes ? d->peak_bytes[k] : -1));
    printf("]}\n");
    fflush(stdout);
}

/* The split and each stage's measured forward + backward time on one micro-batch. */
static void show_stages(driver_t *d) {
    const config_t *c = d->cfg;
    int64_t m = c->batch / c->micro;
    if (c->reps > 0) {
        d->stage_ms = calloc((size_t)d->pipe->nstages, sizeof *d->stage_ms);
        mpr_scope_begin();
        mpr_tensor_t *x = mpr_narrow(d->x, 0, 0, m);
        if (!d->stage_ms || !x || pipeline_profile(d->pipe, x, (int)c->reps, d->stage_ms)) fatal("stage timing");
        mpr_scope_end();
    }
    fprintf(stderr, "split of %s into %d stages (contiguous layer groups, the largest per-sample multiply-adds as "
                    "small as possible):\n", c->model, d->pipe->nstages);
    for (int k = 0; k < d->pipe->nstages; k++) {
        int64_t macs = 0;
        for (int g = d->pipe->first[k]; g < d->pipe->first[k + 1]; g++) macs += app_fmnist_stage_macs(c->kind, g);
        fprintf(stderr, "  stage %d (rank %d): layers %d..%d, %.2f M multiply-adds/sample", k + 1, k + 1,
                d->pipe->first[k], d->pipe->first[k + 1] - 1, (double)macs / 1e6);
        if (d->stage_ms) fprintf(stderr, ", forward+backward %.3f ms per micro-batch of %lld", d->stage_ms[k], (long long)m);
        fprintf(stderr, "\n");
    }
}

static void run_driver(const config_t *c) {
    driver_t d = {.cfg = c, .start = {.seed = (uint64_t)c->common.seed}, .last_acc = NAN, .first_loss = NAN,
                  .last_loss = NAN};
    if (load_data(&d)) fatal("data");
    if (!(d.pipe = pipeline_create(c->kind, (int)c->stages, (uint64_t)c->common.seed))) fatal("creating the stages");
    mpr_optim_options_t o;
    mpr_optim_options_default("sgd", &o);
    o.lr = c->lr;
    if (!(d.opt = mpr_dist_optimizer_create("sgd", &o, d.pipe->params, d.pipe->nparams))) fatal("optimizer");
    if (c->common.resume && restore(&d)) fatal("--resume");
    show_stages(&d);
    train(&d);
    print_summary(&d);
    app_progress_destroy(d.bar);
    mpr_dist_optimizer_destroy(d.opt);
    pipeline_destroy(d.pipe);
    mpr_tensor_release(d.x);
    mpr_tensor_release(d.y);
    mpr_tensor_release(d.test_x);
    mpr_tensor_release(d.test_y);
    free(d.step_ms);
    free(d.stage_ms);
    free(d.peak_bytes);
}

int main(int argc, char **argv) {
    config_t cfg;
    parse(argc, argv, &cfg);
    if (app_fmnist_check(cfg.common.data_dir)) { /* every rank stops, before MPI starts */
        if (app_launch_rank() == 0) fprintf(stderr, "pipeline: %s\n", mpr_last_error());
        return 1;
    }
    mpr_blas_set_num_threads(1); /* one BLAS thread per rank, as the anchor's torch.set_num_threads(1) */
    if (pipeline_stage_register()) {
        fprintf(stderr, "pipeline: %s\n", mpr_last_error());
        return 1;
    }
    int rank = app_launch_rank();
    char name[64];
    if (rank == 0)
        snprintf(name, sizeof name, "driver");
    else
        snprintf(name, sizeof name, "stage%d", rank); /* ranks beyond --stages stay idle */
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.name = name;
    opts.num_worker_threads = (int)cfg.threads;
    opts.rpc_timeout_s = 300;
    opts.argc = &argc, opts.argv = &argv;
    if (mpr_init(&opts)) {
        fprintf(stderr, "pipeline: mpr_init: %s\n", mpr_last_error());
        return 1;
    }
    int rc = 0, world = mpr_world_size();
    if (cfg.stages == 0) cfg.stages = world - 1;
    int groups = app_fmnist_model_stages(cfg.kind);
    if (world < 2 || cfg.stages > world - 1) {
        if (rank == 0)
            fprintf(stderr, "pipeline: --stages %lld needs %lld ranks (a driver and one per stage); start more "
                            "(mpirun -np %lld)\n", (long long)(cfg.stages ? cfg.stages : 1),
                    (long long)(cfg.stages ? cfg.stages : 1) + 1, (long long)(cfg.stages ? cfg.stages : 1) + 1);
        rc = 2;
    } else if (cfg.stages > groups) {
        if (rank == 0)
            fprintf(stderr, "pipeline: %d ranks give %lld stages but model %s has %d layers to split: pass --stages %d "
                            "or fewer (try --help)\n", world, (long long)cfg.stages, cfg.model, groups, groups);
        rc = 2;
    } else {
        bind_stages(&cfg, rank, world);
        if (app_print_placement(&cfg.common, NULL)) fprintf(stderr, "pipeline: %s\n", mpr_last_error());
        if (rank == 0) run_driver(&cfg);
    }
    mpr_shutdown(true);
    return rc;
}
