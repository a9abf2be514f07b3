/* insitu_heat.c — in-situ training inside an existing MPI code (issue #17):
 *
 *   mpirun -np 3 build/apps/insitu_heat/insitu_heat                 # 2 simulation ranks, 1 learner
 *   mpirun -np 3 build/apps/insitu_heat/insitu_heat --no-stream     # the same simulation without mpirpc
 *
 * An ordinary MPI program, written the way simulation codes are: it calls
 * MPI_Init_thread itself, splits MPI_COMM_WORLD into simulation ranks (the
 * first N - L) and learner ranks (the last L, --learners), and the
 * simulation ranks solve the 2-D heat equation (with a logistic heat source,
 * heat.h) on their own communicator (heat.h: --decomp strips with
 * MPI_Sendrecv halos, or 2d on an MPI_Cart_create grid with non-blocking
 * halos overlapped with the update; MPI_Allreduce residual, MPI-IO output).
 *
 * mpirpc is added in the lines marked "mpirpc:" below: mpr_init on the
 * communicator the host chooses (MPI_COMM_WORLD: both roles; mpirpc
 * duplicates it and never finalizes MPI), a streamer per simulation rank
 * (stream.h: every --every K steps, the block and its next state to a
 * learner with rpc_async, at most --max-inflight in flight), the learner's
 * inbox and training loop (inbox.h, learner.h), and mpr_shutdown(true)
 * before the host's MPI_Finalize. Simulation rank s streams to learner
 * s mod L. With --no-stream, mpirpc is never initialized. With
 * --learners-share the learners train one surrogate held by learner 0
 * (shared.h: dist autograd + a DistributedOptimizer per learner).
 *
 * Checkpoints (--checkpoint-dir, at the end of the run only: the one
 * consistent cut of simulation and learners without extra coordination):
 * the field and every learner's state; --resume continues from them, after
 * every rank checked they are of the same step (see "checkpoints" below).
 *
 * If the host's MPI gives less than MPI_THREAD_MULTIPLE (try --thread-level
 * serialized), mpr_init fails with MPR_ERR_MPI naming the level; the program
 * says so and runs the simulation without in-situ training ("stream":false
 * in the summary), as a production code should rather than lose the run.
 *
 * Output: progress on stderr; the learner 0's metrics CSV (--metrics) and
 * its validation error against simulation steps as a PNG; one JSON summary
 * line on stdout from rank 0 (counts of samples sent, received, trained,
 * held out, skipped, failed, per learner; steps/s, bytes/s and the time
 * loop's CPU time of the simulation, and apart from them the drain after the
 * loop (drain_s: the last replies and "done"); the learners' time on samples
 * and on validation; the final field's checksum, the same
 * for every decomposition). Exit status 0 when every sample sent was
 * received and trained on or held out, 1 otherwise, 2 for bad options. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "app.h"
#include "heat.h"
#include "inbox.h"
#include "learner.h"
#include "shared.h"
#include "mpirpc/mpirpc.h"
#include "stream.h"

static const char *summary =
    "insitu_heat: a 2-D heat-equation simulation (plain MPI) that streams its state to learner ranks\n"
    "training a surrogate of one time step while it runs (mpirpc, added in a few lines).\n"
    "The last --learners ranks learn, the others simulate.\n"
    "usage: mpirun -np N insitu_heat [options]      (N > --learners)";

typedef struct config {
    int64_t nx, ny, steps, every, learners, max_inflight, inbox, progress_pu;
    int64_t channels, crop, batch, steps_per_sample, replay, holdout, val_keep, eval_every, val_cells;
    double r, q, lr;
    bool no_stream, share;
    const char *when_full, *thread_level, *field, *decomp;
    app_common_t common;
} config_t;

static void parse(int argc, char **argv, config_t *c) {
    *c = (config_t){.nx = 512, .ny = 512, .steps = 400, .every = 20, .learners = 1, .max_inflight = 4, .inbox = 4,
                    .progress_pu = -1, .channels = 8, .crop = 16, .batch = 16, .steps_per_sample = 8, .replay = 8,
                    .holdout = 5, .val_keep = 4, .eval_every = 25, .val_cells = 16384, .r = 0.2, .q = 0.05,
                    .lr = 0.01, .when_full = "wait", .thread_level = "multiple", .decomp = "auto"};
    app_option_t opts[] = {
        {"nx", APP_OPT_INT, &c->nx, 4, 1 << 16, NULL, "grid columns"},
        {"ny", APP_OPT_INT, &c->ny, 4, 1 << 16, NULL, "grid rows (split in strips over the simulation ranks)"},
        {"steps", APP_OPT_INT, &c->steps, 1, 1e9, NULL, "time steps"},
        {"r", APP_OPT_DOUBLE, &c->r, 1e-6, 0.25, NULL, "alpha dt / dx^2 (stable up to 0.25)"},
        {"q", APP_OPT_DOUBLE, &c->q, 0, 1, NULL, "k dt, the rate of the logistic heat source k u (1 - u) (0: plain heat)"},
        {"decomp", APP_OPT_CHOICE, &c->decomp, 0, 0, "auto|strips|2d",
         "domain decomposition: row strips (MPI_Sendrecv halos) or a 2-D Cartesian grid (non-blocking halos "
         "overlapped with the update); auto: 2d when the process grid divides the grid"},
        {"field", APP_OPT_STRING, &c->field, 0, 0, NULL, "write the final field here (ny x nx float64, MPI-IO)"},
        {"thread-level", APP_OPT_CHOICE, &c->thread_level, 0, 0, "multiple|serialized|funneled|single",
         "thread level the host asks MPI_Init_thread for (mpirpc needs multiple)"},
        {"no-stream", APP_OPT_FLAG, &c->no_stream, 0, 0, NULL, "run the simulation only, without mpirpc"},
        {"learners", APP_OPT_INT, &c->learners, 1, 1024, NULL, "learner ranks (the last ones)"},
        {"learners-share", APP_OPT_FLAG, &c->share, 0, 0, NULL,
         "the learners train ONE surrogate held by learner 0 (dist autograd + DistributedOptimizer)"},
        {"every", APP_OPT_INT, &c->every, 1, 1e9, NULL, "stream a sample every K steps"},
        {"max-inflight", APP_OPT_INT, &c->max_inflight, 1, 1024, NULL, "samples in flight per simulation rank"},
        {"when-full", APP_OPT_CHOICE, &c->when_full, 0, 0, "wait|skip",
         "window full: wait for the learner, or skip the sample (counted)"},
        {"inbox", APP_OPT_INT, &c->inbox, 1, 1 << 20, NULL, "samples a learner acknowledges before training on them"},
        {"progress-pu", APP_OPT_INT, &c->progress_pu, -1, 1 << 20, NULL,
         "bind mpirpc's progress thread to hwloc PU P + the rank's index on its node (-1: no binding)"},
        {"channels", APP_OPT_INT, &c->channels, 1, 256, NULL, "surrogate hidden channels"},
        {"crop", APP_OPT_INT, &c->crop, 1, 4096, NULL, "training crop size (cells)"},
        {"batch", APP_OPT_INT, &c->batch, 1, 4096, NULL, "crops per Adam step"},
        {"steps-per-sample", APP_OPT_INT, &c->steps_per_sample, 1, 1e6, NULL, "Adam steps per training sample"},
        {"replay", APP_OPT_INT, &c->replay, 1, 1 << 16, NULL, "samples kept for replay"},
        {"holdout", APP_OPT_INT, &c->holdout, 2, 1e6, NULL, "hold out one of every N sampled steps"},
        {"val-keep", APP_OPT_INT, &c->val_keep, 1, 1 << 16, NULL, "held-out samples kept for validation"},
        {"eval-every", APP_OPT_INT, &c->eval_every, 1, 1e9, NULL, "Adam steps between validations"},
        {"val-cells", APP_OPT_INT, &c->val_cells, 0, 1e9, NULL,
         "validate (and scale) on every s-th row and column of a block, "
         "s the largest leaving this many cells (0: all)"},
        {"lr", APP_OPT_DOUBLE, &c->lr, 0, 10, NULL, "Adam learning rate"},
        {0}};
    app_parse_options_or_exit(argc, argv, summary, opts, &c->common);
    if (c->common.checkpoint_every) {
        if (app_launch_rank() == 0)
            fprintf(stderr, "insitu_heat: --checkpoint-every: checkpoints are written at the end of the run only "
                            "(a consistent cut of the simulation and the learners); try --help\n");
        exit(2);
    }
}

static int thread_level(const char *name) {
    return !strcmp(name, "multiple")     ? MPI_THREAD_MULTIPLE
           : !strcmp(name, "serialized") ? MPI_THREAD_SERIALIZED
           : !strcmp(name, "funneled")   ? MPI_THREAD_FUNNELED
                                         : MPI_THREAD_SINGLE;
}

/* What every rank contributes to the summary (summed, or max for the times). */
enum { N_SENT, N_ACKED, N_FAILED, N_SKIPPED, N_BYTES, N_WAITS, N_RECEIVED, N_TRAINED, N_HELD, N_ADAM, N_COUNTS };
enum { T_SIM, T_WAIT, T_TRAIN, T_FIRST_ERR, T_FINAL_ERR, T_SIM_CPU, T_BUSY, T_VALIDATE, T_DRAIN, N_TIMES };

/* CPU seconds of the calling thread (the simulation's time loop, without mpirpc's threads). */
static double thread_cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct run_state {
    const config_t *cfg;
    int world_rank, world_size, sims, learners;
    bool stream;
    int64_t counts[N_COUNTS];
    double times[N_TIMES];
    uint64_t checksum;
    double field_sum, residual;
    const char *decomp; /* the simulation's decomposition (heat_decomp_name) */
    int dims[2];        /* its process grid, rows x columns */
    char stream_error[512];
    char progress_binding[64]; /* where rank 0's progress thread runs (mpr_debug_info_t) */
    int64_t *per_learner;      /* [3 x learners]: samples trained, Adam steps, steps applied by the owner (shared) */
    int64_t start_step;        /* 0, or the step a --resume continues from */
    char sim_ckpt[4096];       /* sim ranks, --resume: the field file of start_step */
    mpr_tensor_dict_t *learner_ckpt; /* learner ranks, --resume: its checkpoint */
    app_ckpt_state_t learner_state;
    bool failed;
} run_state_t;

/* ---- checkpoints (--checkpoint-dir, at the end of the run) ----
 * DIR/sim-<step, 10 digits>.bin: the field after that many steps (heat_write_field
 * to DIR/sim.tmp, then renamed by sim rank 0: a crash leaves the older files whole);
 * DIR/learner<i>/: learner i's checkpoints (learner.h). --resume continues from
 * the newest field and the learners' newest checkpoints, which must all be of
 * the same step (checked on every rank). */

static int make_dir(const char *dir) {
    if (mkdir(dir, 0777) == 0 || errno == EEXIST) return 0;
    fprintf(stderr, "insitu_heat: cannot create %s: %s\n", dir, strerror(errno));
    return -1;
}

static int save_field(heat_t *h, const char *dir, int64_t step) {
    char tmp[4096], path[4096];
    int ok = h->rank != 0 || make_dir(dir) == 0, all;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, h->comm);
    if (!all) return -1;
    snprintf(tmp, sizeof tmp, "%s/sim.tmp", dir);
    snprintf(path, sizeof path, "%s/sim-%010lld.bin", dir, (long long)step);
    if (heat_write_field(h, tmp)) return -1;
    ok = h->rank != 0 || rename(tmp, path) == 0;
    if (!ok) fprintf(stderr, "insitu_heat: cannot rename %s to %s: %s\n", tmp, path, strerror(errno));
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, h->comm);
    return all ? 0 : -1;
}

/* The newest DIR/sim-<step>.bin: its step, or -1 when there is none. */
static int64_t newest_field(const char *dir, char *path, size_t cap) {
    DIR *d = opendir(dir);
    int64_t best = -1;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        long long step;
        char tail[8];
        if (sscanf(e->d_name, "sim-%10lld%7s", &step, tail) == 2 && !strcmp(tail, ".bin") && step > best) best = step;
    }
    if (d) closedir(d);
    if (best >= 0) snprintf(path, cap, "%s/sim-%010lld.bin", dir, (long long)best);
    return best;
}

/* --resume: every rank finds its checkpoint; all must agree on the step. 0, or -1 (message from rank 0). */
static int find_resume_point(run_state_t *st, bool learner, int role_rank, MPI_Comm role_comm) {
    const config_t *cfg = st->cfg;
    const char *dir = cfg->common.checkpoint_dir;
    int64_t step = -1;
    if (!learner) {
        if (role_rank == 0) step = newest_field(dir, st->sim_ckpt, sizeof st->sim_ckpt);
        MPI_Bcast(&step, 1, MPI_INT64_T, 0, role_comm);
        MPI_Bcast(st->sim_ckpt, sizeof st->sim_ckpt, MPI_CHAR, 0, role_comm);
    } else if (st->stream) {
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/learner%d", dir, role_rank);
        mpr_err_t e = app_ckpt_load_latest(sub, &st->learner_ckpt, &st->learner_state, NULL);
        if (e && e != MPR_ERR_NOT_FOUND) fprintf(stderr, "insitu_heat: learner %d: %s\n", role_rank, mpr_last_error());
        if (!e && st->learner_state.seed != (uint64_t)cfg->common.seed + (uint64_t)role_rank)
            fprintf(stderr, "insitu_heat: learner %d: its checkpoint is of another --seed\n", role_rank);
        else if (!e && cfg->share && role_rank == 0 && shared_restore(st->learner_ckpt))
            fprintf(stderr, "insitu_heat: learner 0: the shared model: %s\n", mpr_last_error()); /* before the others train */
        else if (!e)
            step = st->learner_state.step;
    }
    int64_t mine[2] = {step, -step}, all[2]; /* min and max at once; learners without mpirpc do not count */
    if (learner && !st->stream) mine[0] = INT64_MAX, mine[1] = INT64_MIN + 1;
    MPI_Allreduce(mine, all, 2, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD);
    int64_t lo = all[0], hi = -all[1];
    if (lo >= 0 && lo == hi && lo < cfg->steps) {
        st->start_step = lo;
        if (st->world_rank == 0) fprintf(stderr, "insitu_heat: resuming at step %lld from %s\n", (long long)lo, dir);
        return 0;
    }
    if (st->world_rank == 0) {
        if (lo < 0)
            fprintf(stderr, "insitu_heat: --resume: %s lacks the simulation's field or a learner's checkpoint\n", dir);
        else if (lo != hi)
            fprintf(stderr, "insitu_heat: --resume: the checkpoints in %s are of different steps (%lld to %lld)\n", dir,
                    (long long)lo, (long long)hi);
        else
            fprintf(stderr, "insitu_heat: --resume: the checkpoint is at step %lld, nothing to do for --steps %lld\n",
                    (long long)lo, (long long)cfg->steps);
    }
    return -1;
}

/* A simulation rank: the time loop, streaming every K steps when asked. */
static void run_simulation(run_state_t *st, MPI_Comm sim_comm) {
    const config_t *cfg = st->cfg;
    heat_decomp_t decomp = !strcmp(cfg->decomp, "strips") ? HEAT_STRIPS : !strcmp(cfg->decomp, "2d") ? HEAT_2D : HEAT_AUTO;
    heat_t *h = heat_create(sim_comm, (int)cfg->nx, (int)cfg->ny, cfg->r, cfg->q, (uint64_t)cfg->common.seed, decomp);
    if (!h) MPI_Abort(MPI_COMM_WORLD, 1);
    if (st->start_step > 0 && heat_read_field(h, st->sim_ckpt)) MPI_Abort(MPI_COMM_WORLD, 1);
    streamer_t *stream = NULL;
    if (st->stream) { /* mpirpc: a streamer to this rank's learner */
        char name[32];
        int learner = -1;
        snprintf(name, sizeof name, "learner%d", h->rank % st->learners);
        if (mpr_dest_rank(mpr_to_name(name), &learner) ||
            !(stream = streamer_create(learner, h->rank, (int)cfg->max_inflight,
                                       strcmp(cfg->when_full, "skip") ? STREAM_WAIT : STREAM_SKIP,
                                       MPR_TIMEOUT_DEFAULT))) {
            fprintf(stderr, "insitu_heat: sim %d: %s\n", h->rank, mpr_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        if (streamer_prepare(stream, h->rows + 2, h->cols + 2)) { /* the window's buffers, before the time loop */
            fprintf(stderr, "insitu_heat: sim %d: %s\n", h->rank, mpr_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    app_progress_t *bar = NULL;
    if (h->rank == 0)
        bar = app_progress_create(&(app_progress_config_t){.total_steps = cfg->steps, .first_step = st->start_step,
                                                           .unit = "steps",
                                                           .interval_s = cfg->common.log_interval});
    MPI_Barrier(sim_comm);
    double t0 = MPI_Wtime(), cpu0 = thread_cpu_s(), residual = 0;
    for (int64_t step = st->start_step; step < cfg->steps; step++) {
        heat_step(h, &residual);
        if (stream && step % cfg->every == 0 && /* mpirpc: (state, next state) to the learner, not waiting */
            streamer_send(stream, step, h->prev, h->cur, h->rows + 2, h->cols + 2, heat_stride(h))) {
            fprintf(stderr, "insitu_heat: sim %d: %s\n", h->rank, mpr_last_error());
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        if (bar) app_progress_update(bar, step + 1, 0, 1, NAN);
    }
    /* the time loop's figures; the drain after it (waiting for the learner to
     * take the last samples) is measured apart: the host could overlap it with
     * its own end of run (output, checkpoints) */
    double t_sim = MPI_Wtime() - t0, cpu_sim = thread_cpu_s() - cpu0, t_drain = MPI_Wtime();
    if (stream && streamer_finish(stream)) { /* mpirpc: the last replies, then "done" */
        fprintf(stderr, "insitu_heat: sim %d: telling the learner we are done: %s\n", h->rank, mpr_last_error());
        st->failed = true;
    }
    t_drain = MPI_Wtime() - t_drain;
    if (bar) app_progress_finish(bar);
    app_progress_destroy(bar);
    MPI_Allreduce(&t_sim, &st->times[T_SIM], 1, MPI_DOUBLE, MPI_MAX, sim_comm);
    MPI_Allreduce(&cpu_sim, &st->times[T_SIM_CPU], 1, MPI_DOUBLE, MPI_MAX, sim_comm);
    MPI_Allreduce(&t_drain, &st->times[T_DRAIN], 1, MPI_DOUBLE, MPI_MAX, sim_comm);
    heat_checksum(h, &st->checksum, &st->field_sum);
    st->decomp = heat_decomp_name(h->decomp), st->dims[0] = h->py, st->dims[1] = h->px;
    st->residual = residual;
    if (cfg->field && heat_write_field(h, cfg->field)) st->failed = true;
    if (cfg->common.checkpoint_dir && save_field(h, cfg->common.checkpoint_dir, cfg->steps)) st->failed = true;
    if (stream) {
        stream_counts_t n = streamer_counts(stream);
        int64_t *c = st->counts;
        c[N_SENT] = n.sent, c[N_ACKED] = n.acked, c[N_FAILED] = n.failed, c[N_SKIPPED] = n.skipped;
        c[N_BYTES] = n.bytes, c[N_WAITS] = n.waits;
        st->times[T_WAIT] = n.wait_s;
        if (n.failed)
            fprintf(stderr, "insitu_heat: sim %d: %lld samples failed, the first: %s\n", h->rank, (long long)n.failed,
                    streamer_first_error(stream));
        streamer_destroy(stream);
    }
    heat_destroy(h);
}

/* A learner rank: train until its simulation ranks are done. */
static void run_learner(run_state_t *st, int index) {
    const config_t *cfg = st->cfg;
    char label[32], *plot = NULL;
    snprintf(label, sizeof label, "learner %d", index);
    learner_config_t lc = {.channels = (int)cfg->channels, .crop = (int)cfg->crop, .batch = (int)cfg->batch,
                           .steps_per_sample = (int)cfg->steps_per_sample, .replay = (int)cfg->replay,
                           .holdout = (int)cfg->holdout, .val_keep = (int)cfg->val_keep,
                           .eval_every = (int)cfg->eval_every, .val_cells = (int)cfg->val_cells,
                           .every = cfg->every, .lr = cfg->lr,
                           .seed = (uint64_t)cfg->common.seed + (uint64_t)index,
                           .metrics_path = index == 0 ? cfg->common.metrics_path : NULL, .label = label,
                           .log_interval = cfg->common.log_interval, .sim_steps = cfg->steps,
                           .resume = st->learner_ckpt, .resume_state = &st->learner_state, .shared = cfg->share,
                           .index = index, .learners = st->learners, .first_learner_rank = st->sims};
    char dir[4096];
    if (cfg->common.checkpoint_dir) {
        snprintf(dir, sizeof dir, "%s/learner%d", cfg->common.checkpoint_dir, index);
        if (make_dir(cfg->common.checkpoint_dir) == 0) lc.checkpoint_dir = dir;
        else st->failed = true;
    }
    learner_result_t res;
    if (learner_run(&lc, &res)) {
        fprintf(stderr, "insitu_heat: %s: %s\n", label, mpr_last_error());
        st->failed = true;
    }
    int64_t *c = st->counts;
    c[N_RECEIVED] = res.received, c[N_TRAINED] = res.trained, c[N_HELD] = res.held_out, c[N_ADAM] = res.adam_steps;
    st->per_learner[index] = res.trained, st->per_learner[st->learners + index] = res.adam_steps;
    st->per_learner[2 * st->learners + index] = res.owner_steps;
    st->times[T_TRAIN] = res.train_s;
    st->times[T_BUSY] = res.busy_s, st->times[T_VALIDATE] = res.validate_s;
    if (index == 0) {
        st->times[T_FIRST_ERR] = isnan(res.first_val_err) ? -1 : res.first_val_err;
        st->times[T_FINAL_ERR] = isnan(res.final_val_err) ? -1 : res.final_val_err;
        if (lc.metrics_path && (plot = app_plot_path(&cfg->common))) {
            const char *y[] = {"val_rel_err"};
            app_plot_series(lc.metrics_path, plot, "insitu_heat: surrogate error on held-out steps", "sim_step",
                            "simulation step", y, 1, "relative error (1 = persistence)");
            free(plot);
        }
    }
}

/* MPI_Allreduce that sleeps while it waits (a learner with nothing to do
 * must not take a core from the simulation by polling). */
static void allreduce_sleeping(const void *in, void *out, int n, MPI_Datatype t, MPI_Op op) {
    MPI_Request req;
    int done = 0;
    MPI_Iallreduce(in, out, n, t, op, MPI_COMM_WORLD, &req);
    while (MPI_Test(&req, &done, MPI_STATUS_IGNORE), !done) nanosleep(&(struct timespec){0, 1000000}, NULL);
}

static void print_summary(const run_state_t *st, const int64_t *c, const double *t) {
    const config_t *cfg = st->cfg;
    bool counts_ok = !st->stream || (c[N_SENT] == c[N_ACKED] && c[N_FAILED] == 0 && c[N_SENT] == c[N_RECEIVED] &&
                                     c[N_RECEIVED] == c[N_TRAINED] + c[N_HELD]);
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)st->checksum);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "name", "insitu_heat");
    cJSON_AddBoolToObject(j, "stream", st->stream);
    if (st->stream_error[0]) cJSON_AddStringToObject(j, "stream_error", st->stream_error);
    if (st->progress_binding[0]) cJSON_AddStringToObject(j, "progress_binding", st->progress_binding);
    cJSON_AddNumberToObject(j, "sims", st->sims);
    cJSON_AddNumberToObject(j, "learners", st->learners);
    cJSON_AddNumberToObject(j, "nx", (double)cfg->nx);
    cJSON_AddNumberToObject(j, "ny", (double)cfg->ny);
    cJSON_AddNumberToObject(j, "steps", (double)cfg->steps);
    if (st->decomp) {
        cJSON_AddStringToObject(j, "decomp", st->decomp);
        cJSON_AddItemToObject(j, "dims", cJSON_CreateIntArray(st->dims, 2));
    }
    cJSON_AddNumberToObject(j, "every", (double)cfg->every);
    cJSON_AddNumberToObject(j, "sim_s", t[T_SIM]);
    cJSON_AddNumberToObject(j, "sim_cpu_s", t[T_SIM_CPU]); /* the busiest simulation thread's CPU time */
    cJSON_AddNumberToObject(j, "drain_s", t[T_DRAIN]);     /* after the time loop: the last replies and "done" */
    if (st->start_step) cJSON_AddNumberToObject(j, "resumed_at", (double)st->start_step);
    cJSON_AddNumberToObject(j, "steps_per_s", (double)(cfg->steps - st->start_step) / t[T_SIM]);
    cJSON_AddNumberToObject(j, "bytes_sent", (double)c[N_BYTES]);
    cJSON_AddNumberToObject(j, "bytes_per_s", (double)c[N_BYTES] / t[T_SIM]);
    cJSON_AddStringToObject(j, "checksum", hex);
    cJSON_AddNumberToObject(j, "field_sum", st->field_sum);
    cJSON_AddNumberToObject(j, "residual", st->residual);
    static const char *const names[N_COUNTS] = {"samples_sent",     "samples_acked",   "samples_failed",
                                                "samples_skipped",  "bytes",           "send_waits",
                                                "samples_received", "samples_trained", "samples_held_out",
                                                "adam_steps"};
    for (int k = 0; k < N_COUNTS; k++)
        if (k != N_BYTES) cJSON_AddNumberToObject(j, names[k], (double)c[k]);
    cJSON_AddNumberToObject(j, "wait_s", t[T_WAIT]);
    cJSON_AddNumberToObject(j, "train_s", t[T_TRAIN]);
    if (st->stream) { /* the busiest learner's time on samples, and on validation alone */
        cJSON_AddNumberToObject(j, "learner_busy_s", t[T_BUSY]);
        cJSON_AddNumberToObject(j, "learner_validate_s", t[T_VALIDATE]);
    }
    if (st->stream) {
        cJSON_AddBoolToObject(j, "learners_share", cfg->share);
        static const char *const arrays[3] = {"learner_trained", "learner_adam_steps", "learner_owner_steps"};
        for (int a = 0; a < (cfg->share ? 3 : 2); a++) {
            cJSON *arr = cJSON_AddArrayToObject(j, arrays[a]);
            for (int k = 0; k < st->learners; k++)
                cJSON_AddItemToArray(arr, cJSON_CreateNumber((double)st->per_learner[a * st->learners + k]));
        }
    }
    if (t[T_FIRST_ERR] >= 0) cJSON_AddNumberToObject(j, "first_val_err", t[T_FIRST_ERR]);
    if (t[T_FINAL_ERR] >= 0) cJSON_AddNumberToObject(j, "final_val_err", t[T_FINAL_ERR]);
    cJSON_AddBoolToObject(j, "ok", counts_ok && !st->failed);
    char *s = cJSON_PrintUnformatted(j);
    if (s) printf("%s\n", s);
    fflush(stdout);
    cJSON_free(s);
    cJSON_Delete(j);
}

int main(int argc, char **argv) {
    config_t cfg;
    parse(argc, argv, &cfg);
    int provided;
    MPI_Init_thread(&argc, &argv, thread_level(cfg.thread_level), &provided);
    run_state_t st = {.cfg = &cfg, .stream = !cfg.no_stream, .learners = (int)cfg.learners};
    st.times[T_FIRST_ERR] = st.times[T_FINAL_ERR] = -1; /* none (only learner 0 reports them) */
    MPI_Comm_rank(MPI_COMM_WORLD, &st.world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &st.world_size);
    st.sims = st.world_size - st.learners;
    if (st.sims < 1) {
        if (st.world_rank == 0)
            fprintf(stderr, "insitu_heat: %d ranks: needs at least one simulation rank besides %d learner(s) (try --help)\n",
                    st.world_size, st.learners);
        MPI_Finalize();
        return 2;
    }
    bool learner = st.world_rank >= st.sims;
    int64_t *per_learner = calloc((size_t)st.learners * 3, sizeof *per_learner);
    st.per_learner = calloc((size_t)st.learners * 3, sizeof *st.per_learner);
    if (!per_learner || !st.per_learner) {
        fprintf(stderr, "insitu_heat: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    int role_rank = learner ? st.world_rank - st.sims : st.world_rank;
    MPI_Comm role_comm; /* the simulation's own communicator (and the learners') */
    MPI_Comm_split(MPI_COMM_WORLD, learner, st.world_rank, &role_comm);

    if (st.stream) { /* mpirpc: join the runtime on MPI_COMM_WORLD (it dups it; MPI stays the host's) */
        char name[32];
        snprintf(name, sizeof name, learner ? "learner%d" : "sim%d", role_rank);
        if (learner) inbox_configure((int)cfg.inbox, (st.sims - role_rank + st.learners - 1) / st.learners);
        mpr_init_options_t o;
        mpr_init_options_default(&o);
        o.comm = MPI_COMM_WORLD;
        o.name = name;
        o.num_worker_threads = 2;
        o.rpc_timeout_s = 300;
        if (cfg.progress_pu >= 0) { /* one PU per rank of this node: P, P + 1, ... */
            MPI_Comm node;
            int local;
            MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, st.world_rank, MPI_INFO_NULL, &node);
            MPI_Comm_rank(node, &local);
            MPI_Comm_free(&node);
            o.progress_thread_pu = (int)cfg.progress_pu + local;
        }
        mpr_err_t e = inbox_register();
        if (!e) e = shared_register();
        if (!e) e = app_sync_register();
        if (!e && learner && role_rank == 0 && cfg.share) e = shared_host((int)cfg.channels, (uint64_t)cfg.common.seed);
        if (!e) e = mpr_init(&o);
        mpr_debug_info_t d;
        if (!e && !mpr_get_debug_info(&d)) snprintf(st.progress_binding, sizeof st.progress_binding, "%s", d.progress_binding);
        if (e) {
            snprintf(st.stream_error, sizeof st.stream_error, "%s", mpr_last_error());
            if (st.world_rank == 0)
                fprintf(stderr, "insitu_heat: %s; the simulation runs without in-situ training\n",
                        st.stream_error);
            st.stream = false;
        }
    }
    app_print_placement(&cfg.common, NULL); /* --verbose: where every rank runs */
    if (cfg.common.resume && find_resume_point(&st, learner, role_rank, role_comm)) {
        if (st.stream) mpr_shutdown(true);
        mpr_tensor_dict_destroy(st.learner_ckpt);
        inbox_cleanup();
        shared_cleanup();
        free(per_learner);
        free(st.per_learner);
        MPI_Comm_free(&role_comm);
        MPI_Finalize();
        return 1;
    }
    if (!learner)
        run_simulation(&st, role_comm);
    else if (st.stream)
        run_learner(&st, role_rank);
    if (st.stream) mpr_shutdown(true); /* mpirpc: graceful shutdown, before the host's MPI_Finalize */

    int64_t counts[N_COUNTS];
    double times[N_TIMES];
    int failed = st.failed, any_failed;
    allreduce_sleeping(st.counts, counts, N_COUNTS, MPI_INT64_T, MPI_SUM);
    allreduce_sleeping(st.times, times, N_TIMES, MPI_DOUBLE, MPI_MAX);
    allreduce_sleeping(&failed, &any_failed, 1, MPI_INT, MPI_MAX);
    allreduce_sleeping(st.per_learner, per_learner, 3 * st.learners, MPI_INT64_T, MPI_SUM);
    memcpy(st.per_learner, per_learner, (size_t)st.learners * 3 * sizeof *per_learner);
    st.failed = any_failed;
    int rc = st.failed;
    if (st.world_rank == 0) {
        print_summary(&st, counts, times);
        if (st.stream && (counts[N_SENT] != counts[N_RECEIVED] || counts[N_RECEIVED] != counts[N_TRAINED] + counts[N_HELD] ||
                          counts[N_FAILED]))
            rc = 1;
    }
    inbox_cleanup();
    shared_cleanup();
    app_sync_cleanup();
    mpr_tensor_dict_destroy(st.learner_ckpt);
    free(per_learner);
    free(st.per_learner);
    MPI_Comm_free(&role_comm);
    MPI_Finalize();
    return rc;
}
