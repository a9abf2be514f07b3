/* param_server.c — a parameter server with distributed autograd on
 * Fashion-MNIST (PyTorch's "parameter server with RPC" tutorial, as an MPI
 * program):
 *
 *   mpirun -np 3 build/apps/param_server --epochs 1            # 1 PS, 2 trainers
 *   mpirun -np 4 build/apps/param_server --ps 2 --model cnn    # model sharded on 2 PS
 *
 * Ranks 0 .. K-1 (--ps K) are parameter servers: each holds one contiguous
 * group of the model's stages as a RemoteModule (fmnist_models.h), so with
 * K > 1 the model is sharded. The other ranks are trainers; trainer 0 (the
 * leader) creates the RemoteModules and hands them to the others. Every
 * trainer, on its own shard of the training set, runs per step:
 *
 *   dist context begin -> forward through the PS groups (RemoteModule
 *   forward, one RPC per group) -> nll_loss -> mpr_dist_backward ->
 *   DistributedOptimizer step (every PS updates its own parameters) -> end
 *
 * with its own DistributedOptimizer, as in PyTorch. With several trainers
 * their steps interleave without coordination (Hogwild-style, as in the
 * tutorial): another trainer's optimizer step may update a parameter between
 * this trainer's forward and backward, which autograd's version check
 * rejects for a saved parameter (PyTorch fails the same way); so with
 * several trainers the servers run the groups' forward on clones of the
 * parameters (app_fmnist_group_create_snapshot), and the clone reads the
 * parameters as they are at that moment, possibly mid-update by another
 * trainer's step. With one trainer the groups use the parameters directly.
 *
 * PROTOCOL among the trainers (besides the training RPCs):
 *   start: the leader creates the groups (mpr_remote_module_create), and if
 *     --resume, restores the newest checkpoint's parameters into them
 *     (ASSIGN_FN on each owner); then SET_MODEL_FN on every other trainer
 *     delivers [the RemoteModules, the run state, the checkpoint's bytes
 *     when resuming]; followers wait for it. Every trainer then creates its
 *     DistributedOptimizer and, when resuming, imports its own part of the
 *     checkpoint ("optim.trainer<t>.").
 *   sync points (app_sync: all trainers stop; the leader works, then all go
 *     on): every --checkpoint-every steps (a checkpoint), at every epoch's
 *     end and at the run's end (test accuracy, metrics row, checkpoint).
 * A checkpoint holds the parameters (fetched from their owners with
 * to_here) under "model.<name>", every trainer's DistributedOptimizer state
 * under "optim.trainer<t>." (the leader's own, the others' fetched with
 * OPTIM_STATE_FN while they wait at the sync point) and the run state.
 *
 * Invariants: every trainer runs the same number of steps per epoch and
 * reaches the same sync points in the same order; the leader's parameter
 * names are those of the whole model built locally (same order as the
 * concatenated groups' remote parameters, checked at start). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "fmnist_models.h"
#include "mpirpc/mpirpc.h"
#include "ps_common.h"

#define GROUP_KIND "ps_app.group"
#define SET_MODEL_FN "ps_app.set_model"
#define ASSIGN_FN "ps_app.assign"
#define OPTIM_STATE_FN "ps_app.optim_state"

static const char *summary =
    "param_server: a parameter server with distributed autograd on Fashion-MNIST.\n"
    "Ranks 0..K-1 hold the model (sharded when --ps K > 1), the other ranks train on their share of the data:\n"
    "forward through the servers by RPC (RemoteModule), distributed backward, DistributedOptimizer step.\n"
    "usage: mpirun -np N param_server [options]      (N > --ps)";

/* ---- on every rank: the RemoteModule kind and the functions ---- */

/* [model kind, first stage, stage count, seed, snapshot] -> the group's module
 * (snapshot: forward on clones of the parameters, for several trainers) */
static mpr_module_t *make_group(const mpr_value_t *args, int device, void *user_data) {
    const char *kind;
    int64_t first, count, seed;
    bool snapshot;
    if (mpr_args_unpack(args, "slllb", &kind, &first, &count, &seed, &snapshot)) return NULL;
    return snapshot ? app_fmnist_group_create_snapshot(kind, (int)first, (int)count, (uint64_t)seed)
                    : app_fmnist_group_create(kind, (int)first, (int)count, (uint64_t)seed);
}

/* [param RRef owned here, tensor] -> none: the parameter takes the tensor's values */
static mpr_err_t assign_fn(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    mpr_rref_t *r;
    mpr_tensor_t *src, *p;
    mpr_value_t *v = NULL;
    mpr_err_t e = mpr_args_unpack(args, "rt", &r, &src);
    if (!e) e = mpr_rref_local_value(r, &v);
    if (!e) e = mpr_value_get_tensor(v, &p);
    if (!e) {
        bool prev = mpr_set_grad_enabled(false);
        e = mpr_copy_(p, src);
        mpr_set_grad_enabled(prev);
    }
    mpr_value_release(v);
    return e;
}

/* The followers' inbox for SET_MODEL_FN. */
static pthread_mutex_t inbox_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t inbox_cond = PTHREAD_COND_INITIALIZER;
static mpr_value_t *inbox;

/* [[RemoteModule values], step, epoch, step in epoch, wall_s] -> none */
static mpr_err_t set_model_fn(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    pthread_mutex_lock(&inbox_lock);
    mpr_value_release(inbox);
    inbox = mpr_value_retain((mpr_value_t *)args);
    pthread_cond_broadcast(&inbox_cond);
    pthread_mutex_unlock(&inbox_lock);
    return MPR_OK;
}

/* ---- a trainer ---- */

typedef struct trainer {
    const ps_config_t *cfg;
    ps_layout_t lay;
    ps_trainer_data_t data;
    int ngroups;
    mpr_remote_module_t **groups;
    mpr_rref_t **params; /* all groups' parameters, in the whole model's order */
    int nparams;
    mpr_module_t *names_model; /* leader: the whole model, for parameter names */
    mpr_dist_optimizer_t *opt;
    app_ckpt_state_t start;     /* where this run starts (a resumed run: the checkpoint's state) */
    mpr_tensor_dict_t *resume;  /* --resume: the checkpoint, until the optimizer state is imported */
    char resume_from[512];      /* ... and where it came from, for messages */
} trainer_t;

/* This process's trainer once its optimizer exists, for OPTIM_STATE_FN
 * (called by the leader while this trainer waits at a sync point). */
static _Atomic(trainer_t *) this_trainer;

static void optim_prefix(int trainer, char *buf, size_t cap) { snprintf(buf, cap, "optim.trainer%d.", trainer); }

/* [] -> bytes: .safetensors of this trainer's DistributedOptimizer state */
static mpr_err_t optim_state_fn(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx, (void)args;
    trainer_t *t = this_trainer;
    if (!t) return mpr_error_set(MPR_ERR_STATE, "this trainer has no optimizer yet");
    char prefix[64];
    optim_prefix(t->lay.trainer, prefix, sizeof prefix);
    mpr_tensor_dict_t *d = mpr_tensor_dict_create();
    void *buf = NULL;
    size_t len = 0;
    mpr_err_t e = d ? mpr_dist_optimizer_state_export(t->opt, d, prefix) : mpr_last_error_code();
    if (!e) e = mpr_safetensors_encode(d, &buf, &len);
    mpr_tensor_dict_destroy(d);
    if (!e && !(*result = mpr_value_new_bytes(buf, len))) e = mpr_last_error_code();
    free(buf);
    return e;
}

static void fatal(const trainer_t *t, const char *what) { ps_fatal(t->lay.rank, what); }

static mpr_value_t *group_args(const ps_config_t *cfg, int g, int ngroups, bool snapshot) {
    int stages = app_fmnist_model_stages(cfg->model);
    int first = app_fmnist_group_first(stages, ngroups, g);
    int count = app_fmnist_group_first(stages, ngroups, g + 1) - first;
    return mpr_args_pack("slllb", cfg->model, (int64_t)first, (int64_t)count, (int64_t)cfg->common.seed, snapshot);
}

/* Collect every group's parameter RRefs in order. */
static mpr_err_t gather_params(trainer_t *t) {
    t->nparams = 0;
    for (int g = 0; g < t->ngroups; g++) {
        mpr_rref_t **ps;
        int n;
        mpr_err_t e = mpr_remote_module_remote_parameters(t->groups[g], &ps, &n);
        if (e) return e;
        mpr_rref_t **grown = realloc(t->params, (size_t)(t->nparams + n) * sizeof *grown);
        if (!grown) {
            for (int i = 0; i < n; i++) mpr_rref_release(ps[i]);
            free(ps);
            return mpr_error_set(MPR_ERR_NOMEM, "out of memory");
        }
        t->params = grown;
        memcpy(t->params + t->nparams, ps, (size_t)n * sizeof *ps);
        t->nparams += n;
        free(ps);
    }
    return MPR_OK;
}

/* Leader, --resume: the newest checkpoint's parameters into the groups. */
static mpr_err_t restore(trainer_t *t) {
    mpr_tensor_dict_t *d = NULL;
    char *path = NULL;
    const char *const run[] = {"ps_app.model", t->cfg->model, NULL};
    mpr_err_t e = app_ckpt_load_run(t->cfg->common.checkpoint_dir, (uint64_t)t->cfg->common.seed, run, &d, &t->start,
                                    &path);
    if (e) return e;
    const char *trainers = mpr_tensor_dict_get_meta(d, "ps_app.trainers");
    char want[24];
    snprintf(want, sizeof want, "%d", t->lay.ntrainers);
    if (!e && (!trainers || strcmp(trainers, want) != 0))
        e = mpr_error_set(MPR_ERR_INVALID_ARG,
                          "checkpoint %s holds the optimizer state of %s trainer(s); this run has %d (start the "
                          "job with %d trainer ranks)",
                          path, trainers ? trainers : "no", t->lay.ntrainers, trainers ? atoi(trainers) : 0);
    for (int i = 0; !e && i < t->nparams; i++) {
        const char *name;
        mpr_module_parameter(t->names_model, i, &name);
        char key[256];
        snprintf(key, sizeof key, "model.%s", name);
        mpr_tensor_t *v = mpr_tensor_dict_get(d, key);
        if (!v) {
            e = mpr_error_set(MPR_ERR_NOT_FOUND, "checkpoint %s has no %s", path, key);
            break;
        }
        e = mpr_call_sync(mpr_to_name(mpr_rref_owner_name(t->params[i])), ASSIGN_FN, MPR_TIMEOUT_DEFAULT, NULL, "rt",
                          t->params[i], v);
    }
    if (!e)
        fprintf(stderr, "resuming from %s (step %lld, epoch %lld)\n", path, (long long)t->start.step,
                (long long)t->start.epoch + 1);
    if (e) {
        mpr_tensor_dict_destroy(d);
        free(path);
        return e;
    }
    t->resume = d; /* the optimizer state is imported once the optimizer exists */
    snprintf(t->resume_from, sizeof t->resume_from, "%s", path);
    free(path);
    return MPR_OK;
}

static void setup_leader(trainer_t *t) {
    const ps_config_t *cfg = t->cfg;
    if (!(t->names_model = app_fmnist_model_create(cfg->model, (uint64_t)cfg->common.seed))) fatal(t, "model");
    for (int g = 0; g < t->ngroups; g++) {
        char dev[64];
        snprintf(dev, sizeof dev, "ps%d/cpu", g);
        mpr_value_t *a = group_args(cfg, g, t->ngroups, t->lay.ntrainers > 1);
        if (!a || !(t->groups[g] = mpr_remote_module_create(dev, GROUP_KIND, a))) fatal(t, "creating the model");
        mpr_value_release(a);
    }
    if (gather_params(t)) fatal(t, "the model's parameters");
    if (t->nparams != mpr_module_num_parameters(t->names_model)) {
        mpr_error_set(MPR_ERR_STATE, "%d remote parameters, the model has %d", t->nparams,
                      mpr_module_num_parameters(t->names_model));
        fatal(t, "the model's parameters");
    }
    if (cfg->common.resume && restore(t)) fatal(t, "--resume");
    /* hand the model and the start state to the other trainers */
    mpr_value_t *rms = mpr_value_new_list();
    for (int g = 0; rms && g < t->ngroups; g++)
        if (mpr_value_list_append(rms, mpr_value_new_remote_module(t->groups[g]))) fatal(t, "sending the model");
    mpr_value_t *msg = mpr_args_pack("Vllld", rms, t->start.step, t->start.epoch, t->start.step_in_epoch,
                                     t->start.wall_s);
    if (!msg) fatal(t, "sending the model");
    if (t->resume) { /* the followers import their optimizer state from it */
        void *buf = NULL;
        size_t len = 0;
        if (mpr_safetensors_encode(t->resume, &buf, &len) || mpr_value_list_append(msg, mpr_value_new_bytes(buf, len)))
            fatal(t, "sending the checkpoint");
        free(buf);
    }
    for (int r = t->lay.leader_rank + 1; r < t->lay.world; r++) {
        mpr_value_t *none = NULL;
        if (mpr_rpc_sync(mpr_to_rank(r), SET_MODEL_FN, msg, MPR_TIMEOUT_DEFAULT, &none)) fatal(t, "sending the model");
        mpr_value_release(none);
    }
    mpr_value_release(msg);
}

static void setup_follower(trainer_t *t) {
    pthread_mutex_lock(&inbox_lock);
    while (!inbox) pthread_cond_wait(&inbox_cond, &inbox_lock);
    mpr_value_t *msg = inbox;
    inbox = NULL;
    pthread_mutex_unlock(&inbox_lock);
    mpr_value_t *rms;
    const void *ckpt = NULL;
    size_t ckpt_len = 0;
    if (mpr_args_unpack(msg, "vllld|y", &rms, &t->start.step, &t->start.epoch, &t->start.step_in_epoch,
                        &t->start.wall_s, &ckpt, &ckpt_len))
        fatal(t, "receiving the model");
    if (ckpt && !(t->resume = mpr_safetensors_decode(ckpt, ckpt_len, "the leader's checkpoint")))
        fatal(t, "receiving the checkpoint");
    snprintf(t->resume_from, sizeof t->resume_from, "the leader's checkpoint");
    if ((int)mpr_value_list_len(rms) != t->ngroups) fatal(t, "receiving the model");
    for (int g = 0; g < t->ngroups; g++)
        if (!(t->groups[g] = mpr_remote_module_from_value(mpr_value_list_get(rms, (size_t)g))))
            fatal(t, "receiving the model");
    mpr_value_release(msg);
    if (gather_params(t)) fatal(t, "the model's parameters");
}

/* Forward x through the groups; the output (log-probabilities) as a new reference. */
static mpr_err_t forward(trainer_t *t, mpr_tensor_t *x, mpr_tensor_t **out) {
    mpr_tensor_t *h = mpr_tensor_retain(x);
    for (int g = 0; g < t->ngroups; g++) {
        mpr_tensor_t *next = NULL;
        mpr_err_t e = mpr_remote_module_forward(t->groups[g], h, &next);
        mpr_tensor_release(h);
        if (e) return e;
        h = next;
    }
    *out = h;
    return MPR_OK;
}

/* One training step on (x, y): forward by RPC, dist backward, DistributedOptimizer step. */
static mpr_err_t train_step(void *app, mpr_tensor_t *x, mpr_tensor_t *y, double *loss) {
    trainer_t *t = app;
    int64_t ctx;
    mpr_err_t e = mpr_dist_context_begin(&ctx);
    if (e) return e;
    mpr_scope_begin();
    mpr_tensor_t *logp = NULL;
    e = forward(t, x, &logp);
    mpr_tensor_t *l = e ? NULL : mpr_nll_loss(mpr_scope_adopt(logp), y);
    if (!e && !l) e = mpr_last_error_code();
    if (!e) e = mpr_dist_backward(ctx, &l, 1, false);
    if (!e) e = mpr_dist_optimizer_step(t->opt, ctx);
    if (!e) e = mpr_item(l, loss);
    mpr_scope_end();
    mpr_err_t e2 = mpr_dist_context_end(ctx);
    return e ? e : e2;
}

/* Leader: test accuracy of the model as it is now (forward by RPC, no context). */
static mpr_err_t evaluate(void *app, double *acc) {
    trainer_t *t = app;
    int64_t n = mpr_tensor_shape(t->data.test_x)[0], correct = 0;
    for (int64_t i = 0; i < n; i += 1000) {
        int64_t len = n - i < 1000 ? n - i : 1000;
        mpr_scope_begin();
        mpr_tensor_t *x = mpr_narrow(t->data.test_x, 0, i, len), *y = mpr_narrow(t->data.test_y, 0, i, len);
        mpr_tensor_t *logp = NULL;
        mpr_err_t e = forward(t, x, &logp);
        int64_t c = e ? -1 : app_count_correct(mpr_scope_adopt(logp), y);
        mpr_scope_end();
        if (e) return e;
        if (c < 0) return mpr_last_error_code();
        correct += c;
    }
    *acc = (double)correct / (double)n;
    return MPR_OK;
}

/* Leader: parameters (fetched from their owners) + run state -> checkpoint. */
static mpr_err_t checkpoint(void *app, const app_ckpt_state_t *st) {
    trainer_t *t = app;
    mpr_tensor_dict_t *d = mpr_tensor_dict_create();
    if (!d) return mpr_last_error_code();
    mpr_err_t e = MPR_OK;
    for (int i = 0; !e && i < t->nparams; i++) {
        mpr_value_t *v = NULL;
        mpr_tensor_t *p;
        const char *name;
        mpr_module_parameter(t->names_model, i, &name);
        if (!(e = mpr_rref_to_here(t->params[i], MPR_TIMEOUT_DEFAULT, &v)) && !(e = mpr_value_get_tensor(v, &p)))
            e = app_dict_add_tensors(d, "model.", 1, &name, &p);
        mpr_value_release(v);
    }
    char prefix[64], ntrainers[24];
    optim_prefix(0, prefix, sizeof prefix);
    if (!e) e = mpr_dist_optimizer_state_export(t->opt, d, prefix);
    for (int r = t->lay.leader_rank + 1; !e && r < t->lay.world; r++) { /* the others wait at this sync point */
        mpr_value_t *v = NULL;
        const void *buf;
        size_t len;
        if (!(e = mpr_rpc_sync(mpr_to_rank(r), OPTIM_STATE_FN, NULL, MPR_TIMEOUT_DEFAULT, &v)) &&
            !(e = mpr_value_get_bytes(v, &buf, &len)))
            e = app_dict_merge_encoded(d, buf, len, "a trainer's optimizer state");
        mpr_value_release(v);
    }
    snprintf(ntrainers, sizeof ntrainers, "%d", t->lay.ntrainers);
    if (!e) e = mpr_tensor_dict_set_meta(d, "ps_app.trainers", ntrainers);
    if (!e) e = mpr_tensor_dict_set_meta(d, "ps_app.model", t->cfg->model);
    if (!e) e = mpr_tensor_dict_set_meta(d, "ps_app.mode", "dist");
    if (!e) e = app_ckpt_save(t->cfg->common.checkpoint_dir, d, st, (int)t->cfg->keep);
    mpr_tensor_dict_destroy(d);
    return e;
}

static void run_trainer(const ps_config_t *cfg, const ps_layout_t *lay) {
    trainer_t t = {.cfg = cfg, .lay = *lay, .ngroups = lay->nps, .start = {.seed = (uint64_t)cfg->common.seed}};
    if (ps_trainer_data_load(cfg, lay, &t.data)) fatal(&t, "data");
    t.groups = calloc((size_t)t.ngroups, sizeof *t.groups);
    if (!t.groups) fatal(&t, "out of memory");
    if (lay->trainer == 0)
        setup_leader(&t);
    else
        setup_follower(&t);
    mpr_optim_options_t o;
    ps_optim_options(cfg, &o);
    if (!(t.opt = mpr_dist_optimizer_create(cfg->optimizer, &o, t.params, t.nparams))) fatal(&t, "optimizer");
    if (t.resume) {
        char prefix[64];
        optim_prefix(lay->trainer, prefix, sizeof prefix);
        if (mpr_dist_optimizer_state_import(t.opt, t.resume, prefix)) {
            char what[600];
            snprintf(what, sizeof what, "--resume: the optimizer state in %s", t.resume_from);
            fatal(&t, what);
        }
        mpr_tensor_dict_destroy(t.resume);
        t.resume = NULL;
    }
    this_trainer = &t;
    ps_train(cfg, lay, &t.data, &t.start, "dist", &(ps_loop_ops_t){train_step, evaluate, checkpoint}, &t);
    this_trainer = NULL;
    mpr_dist_optimizer_destroy(t.opt);
    for (int i = 0; i < t.nparams; i++) mpr_rref_release(t.params[i]);
    free(t.params);
    for (int g = 0; g < t.ngroups; g++) mpr_remote_module_destroy(t.groups[g]);
    free(t.groups);
    mpr_module_destroy(t.names_model);
    ps_trainer_data_free(&t.data);
}

int main(int argc, char **argv) {
    ps_config_t cfg;
    ps_config_parse(argc, argv, summary, &cfg);
    if (app_fmnist_check(cfg.common.data_dir)) { /* every rank stops, before MPI starts */
        if (app_launch_rank() == 0) fprintf(stderr, "param_server: %s\n", mpr_last_error());
        return 1;
    }
    mpr_blas_set_num_threads(1); /* one BLAS thread per rank, as the anchor's torch.set_num_threads(1) */
    if (mpr_register_module_kind(GROUP_KIND, make_group, NULL) || mpr_register_function(ASSIGN_FN, assign_fn, NULL) ||
        mpr_register_function(OPTIM_STATE_FN, optim_state_fn, NULL) ||
        mpr_register_function(SET_MODEL_FN, set_model_fn, NULL) || app_sync_register()) {
        fprintf(stderr, "param_server: %s\n", mpr_last_error());
        return 1;
    }
    char name[64];
    ps_worker_name(app_launch_rank(), (int)cfg.ps, name, sizeof name);
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.name = name;
    opts.num_worker_threads = (int)cfg.threads;
    opts.rpc_timeout_s = 300;
    opts.argc = &argc, opts.argv = &argv;
    if (mpr_init(&opts)) {
        fprintf(stderr, "param_server: mpr_init: %s\n", mpr_last_error());
        return 1;
    }
    if (app_print_placement(&cfg.common, NULL)) fprintf(stderr, "param_server: %s\n", mpr_last_error());
    ps_layout_t lay = {.rank = -1};
    int rc = 0;
    if (ps_layout_get((int)cfg.ps, &lay)) {
        if (lay.rank == 0) fprintf(stderr, "param_server: %s\n", mpr_last_error());
        rc = 2;
    } else if (lay.trainer >= 0) {
        run_trainer(&cfg, &lay);
    }
    mpr_shutdown(true);
    app_sync_cleanup();
    mpr_value_release(inbox);
    return rc;
}
