/* apps/ps_common/ps_common.h — what the two parameter-server apps
 * (apps/param_server, apps/batch_ps) share: their options, the ranks' roles,
 * each trainer's shard of Fashion-MNIST, the optimizer options, and the
 * final summary (a human line and one JSON line for scripts).
 *
 * Roles: ranks 0 .. ps-1 are parameter servers named "ps<r>", the others
 * trainers named "trainer<t>" (t = rank - ps); trainer 0 leads (evaluates,
 * writes metrics and checkpoints, prints). Each trainer trains on rows
 * t, t + T, t + 2T, ... of the training set (the anchor's split), cut to
 * the same number of rows on every trainer, so all run the same number of
 * steps per epoch.
 *
 * Ownership: ps_trainer_data_t's tensors are the holder's (ps_trainer_data_free). */
#ifndef MPIRPC_PS_COMMON_H
#define MPIRPC_PS_COMMON_H

#include "app.h"
#include "mpirpc/optim.h"

typedef struct ps_config {
    int64_t epochs, batch, ps, max_steps, train_limit, metrics_every, keep, threads;
    double lr, momentum, weight_decay;
    const char *optimizer, *model;
    app_common_t common;
} ps_config_t;

/* Parse argv (app_parse_options_or_exit: --help exits 0, bad options 2). */
void ps_config_parse(int argc, char **argv, const char *summary, ps_config_t *cfg);
/* The optimizer's options from cfg (PyTorch's defaults, then lr, momentum,
 * weight decay where the kind has them). */
void ps_optim_options(const ps_config_t *cfg, mpr_optim_options_t *o);

typedef struct ps_layout {
    int rank, world, nps, ntrainers;
    int trainer;     /* index among trainers, -1 on a parameter server */
    int leader_rank; /* rank of trainer 0 */
} ps_layout_t;
/* The worker name of `rank` ("ps<r>" / "trainer<t>") into buf. */
void ps_worker_name(int rank, int nps, char *buf, size_t cap);
/* The layout after mpr_init; MPR_ERR_INVALID_ARG (message for the user)
 * when the job has no trainer rank. */
mpr_err_t ps_layout_get(int nps, ps_layout_t *out);

typedef struct ps_trainer_data {
    mpr_tensor_t *x, *y;           /* this trainer's rows */
    mpr_tensor_t *test_x, *test_y; /* the test set */
    int64_t steps_per_epoch;
} ps_trainer_data_t;
/* Load Fashion-MNIST (flat or images, as the model wants) and keep
 * trainer t's shard. */
mpr_err_t ps_trainer_data_load(const ps_config_t *cfg, const ps_layout_t *lay, ps_trainer_data_t *out);
void ps_trainer_data_free(ps_trainer_data_t *d);

/* What an app does in the shared training loop (ps_train). */
typedef struct ps_loop_ops {
    /* One training step on batch (x, y) (owned by the loop's scope); its loss in *loss. */
    mpr_err_t (*step)(void *app, mpr_tensor_t *x, mpr_tensor_t *y, double *loss);
    /* Leader, at a sync point: test accuracy of the model as it is now. */
    mpr_err_t (*evaluate)(void *app, double *acc);
    /* Leader, at a sync point with --checkpoint-dir: write a checkpoint with state *st. */
    mpr_err_t (*checkpoint)(void *app, const app_ckpt_state_t *st);
} ps_loop_ops_t;

/* Run the training loop on a trainer from *start (a fresh run: all zero but
 * the seed): epochs of ops->step over data in the resumable order, sync
 * points (all trainers stop; the leader evaluates and checkpoints) after
 * every epoch, every --checkpoint-every steps and at the end; the leader
 * shows progress, writes the metrics and the plot and prints the summary.
 * Any failure aborts the job (ps_fatal). */
void ps_train(const ps_config_t *cfg, const ps_layout_t *lay, const ps_trainer_data_t *data,
              const app_ckpt_state_t *start, const char *mode, const ps_loop_ops_t *ops, void *app);
/* Print "rank r: what: <mpr_last_error()>" and abort the MPI job. */
void ps_fatal(int rank, const char *what) __attribute__((noreturn));

/* The leader's last words: a summary line on stderr and on stdout one JSON
 * line {"name":"ps_app","mode":...,"trainers":...,"ps":...,"model":...,
 * "samples_per_s":...,"test_acc":...,...} for scripts (tests/bench). */
void ps_print_summary(const ps_config_t *cfg, const ps_layout_t *lay, const char *mode, int64_t steps,
                      double samples_per_s, double train_s, double test_acc);

#endif
