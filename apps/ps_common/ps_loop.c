/* ps_loop.c — the training loop both parameter-server apps run on every
 * trainer (ps_common.h, ps_train): epochs of steps over the trainer's
 * shard in the resumable data order, the leader's progress line and
 * metrics rows, and the sync points where all trainers stop while the
 * leader evaluates and writes a checkpoint.
 *
 * Sync points, in this order, the same on every trainer (each trainer runs
 * the same number of steps per epoch): every --checkpoint-every steps
 * unless it is an epoch's last step or the run's last (checkpoint only);
 * at the end of every whole epoch (test accuracy, metrics row,
 * checkpoint); at the end of a run stopped mid-epoch by --max-steps (the
 * same). A checkpoint records where the next step starts: (step, epoch,
 * step in epoch).
 *
 * Invariants: `now` is the state after the last finished step; the
 * leader's work time is left out of the samples/s figures. */
#include <math.h>
#include <signal.h>
#include <stdlib.h>

#include "mpirpc/mpirpc.h"
#include "ps_common.h"

typedef struct loop {
    const ps_config_t *cfg;
    const ps_layout_t *lay;
    const ps_loop_ops_t *ops;
    void *app;
    app_ckpt_state_t start, now;
    bool evaluate; /* what the next leader work does */
    /* the leader's */
    app_progress_t *bar;
    app_metrics_t *csv;
    double t_run, work_s; /* app_now() at the loop's start; time spent in leader work */
    int64_t samples_per_step;
    double row_loss, row_t; /* losses and start time of the current metrics row */
    int64_t row_n, row_samples;
    double last_acc;
} loop_t;

void ps_fatal(int rank, const char *what) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, what, mpr_last_error());
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

static double wall(const loop_t *l) { return l->start.wall_s + app_now() - l->t_run; }

/* All trainers' samples per second in this run, leader work left out. */
static double train_rate(const loop_t *l) {
    double s = app_now() - l->t_run - l->work_s;
    return s > 0 ? (double)((l->now.step - l->start.step) * l->samples_per_step) / s : 0;
}

static int64_t shown_epoch(const app_ckpt_state_t *st) { return st->epoch + (st->step_in_epoch ? 1 : 0); }

/* Leader: a metrics row for the steps since the previous one. */
static void metrics_row(loop_t *l, double test_acc) {
    double now = app_now();
    double rate = l->row_samples && now > l->row_t ? (double)l->row_samples / (now - l->row_t) : NAN;
    if (app_metrics_write(l->csv, l->now.step, shown_epoch(&l->now), wall(l),
                          l->row_n ? l->row_loss / (double)l->row_n : NAN, rate, test_acc, NULL))
        fprintf(stderr, "warning: %s\n", mpr_last_error());
    l->row_loss = 0, l->row_n = 0, l->row_samples = 0, l->row_t = now;
}

static mpr_err_t leader_work(void *arg) {
    loop_t *l = arg;
    double t0 = app_now();
    mpr_err_t e = MPR_OK;
    if (l->evaluate) {
        double acc = NAN;
        if ((e = l->ops->evaluate(l->app, &acc))) return e;
        l->last_acc = acc;
        app_progress_print(l->bar, "epoch %lld/%lld: test accuracy %.4f (step %lld, %.0f samples/s)",
                           (long long)shown_epoch(&l->now), (long long)l->cfg->epochs, acc, (long long)l->now.step,
                           train_rate(l));
        metrics_row(l, acc);
    }
    if (l->cfg->common.checkpoint_dir) {
        l->now.wall_s = wall(l);
        e = l->ops->checkpoint(l->app, &l->now);
    }
    double spent = app_now() - t0;
    l->work_s += spent;
    l->row_t += spent;
    return e;
}

static void sync_point(loop_t *l, bool evaluate) {
    l->evaluate = evaluate;
    if (app_sync(l->lay->leader_rank, l->lay->rank, l->lay->ntrainers - 1, leader_work, l))
        ps_fatal(l->lay->rank, evaluate ? "end of epoch" : "checkpoint");
}

/* Test hook: with MPIRPC_APP_KILL_AFTER_EPOCH=E the leader dies of SIGKILL right
 * after epoch E's sync point (its checkpoint written), as a crashed or killed job
 * would: no shutdown, the launcher then takes the other ranks down. */
static void kill_hook(const loop_t *l, int64_t epoch) {
    const char *v = getenv("MPIRPC_APP_KILL_AFTER_EPOCH");
    if (l->lay->trainer != 0 || !v || atoll(v) != epoch) return;
    fprintf(stderr, "MPIRPC_APP_KILL_AFTER_EPOCH=%s: killing this process (test hook)\n", v);
    fflush(stderr);
    raise(SIGKILL);
}

void ps_train(const ps_config_t *cfg, const ps_layout_t *lay, const ps_trainer_data_t *data,
              const app_ckpt_state_t *start, const char *mode, const ps_loop_ops_t *ops, void *app) {
    loop_t l = {.cfg = cfg, .lay = lay, .ops = ops, .app = app, .start = *start, .now = *start, .last_acc = NAN};
    bool leader = lay->trainer == 0;
    int64_t spe = data->steps_per_epoch;
    int64_t total = cfg->epochs * spe;
    if (cfg->max_steps > 0 && cfg->max_steps < total) total = cfg->max_steps;
    int64_t step = start->step;
    l.samples_per_step = cfg->batch * lay->ntrainers;
    uint64_t seed = (uint64_t)cfg->common.seed;
    if (leader) {
        l.bar = app_progress_create(&(app_progress_config_t){.total_steps = total, .first_step = step,
                                                             .epochs = cfg->epochs,
                                                             .interval_s = cfg->common.log_interval});
        l.csv = app_metrics_open(cfg->common.metrics_path, NULL, 0, cfg->common.resume ? step : -1);
        if (!l.bar || (cfg->common.metrics_path && !l.csv)) ps_fatal(lay->rank, "--metrics");
        fprintf(stderr, "%s mode: %s on %d PS, %d trainer(s), %lld steps/epoch of %lld, %s lr %g\n", mode,
                cfg->model, lay->nps, lay->ntrainers, (long long)spe, (long long)cfg->batch, cfg->optimizer, cfg->lr);
    }
    l.t_run = l.row_t = app_now();
    int64_t synced_at = -1;
    for (int64_t epoch = start->epoch; epoch < cfg->epochs && step < total; epoch++) {
        int64_t s = epoch == start->epoch ? start->step_in_epoch : 0;
        mpr_batch_iter_t *it = app_epoch_batches(data->x, data->y, cfg->batch, seed, epoch, lay->trainer, s);
        if (!it) ps_fatal(lay->rank, "data");
        for (; s < spe && step < total; s++) {
            double loss = NAN;
            mpr_scope_begin();
            mpr_tensor_t *x, *y;
            if (!mpr_batch_iter_next(it, &x, &y)) ps_fatal(lay->rank, "data");
            if (ops->step(app, x, y, &loss)) ps_fatal(lay->rank, "training step");
            mpr_scope_end();
            step++;
            l.now = (app_ckpt_state_t){.step = step, .epoch = epoch, .step_in_epoch = s + 1, .seed = seed};
            if (leader) {
                app_progress_update(l.bar, step, epoch + 1, l.samples_per_step, loss);
                l.row_loss += loss, l.row_n++, l.row_samples += l.samples_per_step;
                if (step % cfg->metrics_every == 0) metrics_row(&l, NAN);
            }
            if (cfg->common.checkpoint_every && step % cfg->common.checkpoint_every == 0 && step < total &&
                s + 1 < spe) {
                sync_point(&l, false);
                synced_at = step;
            }
        }
        mpr_batch_iter_destroy(it);
        if (s == spe) { /* a whole epoch */
            l.now = (app_ckpt_state_t){.step = step, .epoch = epoch + 1, .step_in_epoch = 0, .seed = seed};
            sync_point(&l, true);
            synced_at = step;
            kill_hook(&l, epoch + 1);
        }
    }
    if (synced_at != step) sync_point(&l, true); /* stopped mid-epoch (--max-steps) */
    if (!leader) return;
    app_progress_finish(l.bar);
    double train_s = app_now() - l.t_run - l.work_s, rate = train_rate(&l);
    app_metrics_close(l.csv);
    char *png = app_plot_path(&cfg->common);
    if (png && cfg->common.metrics_path) {
        char title[256];
        snprintf(title, sizeof title, "%s PS: %s, %s lr %g, batch %lld, %d trainer(s), %d PS", mode, cfg->model,
                 cfg->optimizer, cfg->lr, (long long)cfg->batch, lay->ntrainers, lay->nps);
        if (app_plot_metrics(cfg->common.metrics_path, png, title) == MPR_OK) fprintf(stderr, "plot: %s\n", png);
    }
    free(png);
    app_progress_destroy(l.bar);
    ps_print_summary(cfg, lay, mode, step, rate, train_s, l.last_acc);
}
