/* batch_ps.c — a batch-updating parameter server on Fashion-MNIST (PyTorch's
 * "batch RPC processing" tutorial with @rpc.functions.async_execution, as an
 * MPI program):
 *
 *   mpirun -np 3 build/apps/batch_ps --epochs 1            # 1 PS, 2 trainers
 *   mpirun -np 5 build/apps/batch_ps --ps 2 --optimizer adam
 *
 * Ranks 0 .. K-1 (--ps K) are parameter servers, each holding one group of
 * the model's stages (fmnist_models.h) and a local optimizer over it; the
 * other ranks are trainers, each with a local copy of the whole model. A
 * trainer's step: forward and backward locally on its batch, then UPDATE_FN
 * on every server at once with the gradients of that server's parameters;
 * each reply is the server's new parameters, copied into the local model.
 *
 * PROTOCOL on a server (UPDATE_FN is an async function: a waiting trainer
 * holds no pool thread):
 *   UPDATE_FN(trainer t, grads): under `lock`, keep grads as trainer t's,
 *     arrived++, return a reference to the round's future `round`.
 *   when arrived == T (the call that completes the round): sum the T
 *     gradient lists in trainer order (deterministic whatever the arrival
 *     order), divide by T, one optimizer step, copy the parameters into a
 *     new list value; reset the round (arrived = 0, a new `round` future)
 *     under the lock; complete the old future with the list outside it, so
 *     every waiting trainer gets the same new parameters.
 *   FETCH_FN: the parameters as they are (a trainer's start).
 *   STATE_FN / LOAD_FN: the parameters and the optimizer state as
 *     .safetensors bytes, and back (the leader's checkpoint and --resume);
 *     called only at sync points, when no round is open.
 * Start: every rank builds its state, then mpr_barrier; the leader restores
 * a checkpoint (--resume) into the servers before it sends the other
 * trainers the start state (SET_START_FN); then every trainer fetches the
 * parameters.
 *
 * Invariants: a round holds at most one gradient list per trainer; a
 * trainer sends its next update only after the round's reply, so rounds
 * never mix; parameters change only in the completing call, under `lock`. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fmnist_models.h"
#include "mpirpc/mpirpc.h"
#include "ps_common.h"

#define UPDATE_FN "batch_ps.update"
#define FETCH_FN "batch_ps.fetch"
#define STATE_FN "batch_ps.state"
#define LOAD_FN "batch_ps.load"
#define SET_START_FN "batch_ps.set_start"

static const char *summary =
    "batch_ps: a batch-updating parameter server on Fashion-MNIST.\n"
    "Ranks 0..K-1 hold the model (sharded when --ps K > 1) and its optimizer; the other ranks compute gradients\n"
    "locally and send them; a server steps once all trainers reported and answers them all with the new model.\n"
    "usage: mpirun -np N batch_ps [options]      (N > --ps)";

/* ---- a parameter server ---- */

static struct server {
    pthread_mutex_t lock;
    int index; /* g: this server is "ps<g>" */
    mpr_module_t *group;
    mpr_tensor_t **params; /* borrowed from group */
    char **names;          /* the parameters' names in the whole model ("<stage>.<layer>.weight") */
    int n;
    mpr_optimizer_t *opt;
    int ntrainers, arrived;
    mpr_value_t **grads; /* [ntrainers]: this round's gradient lists */
    mpr_future_t *round;
} srv = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* A list value of copies of the parameters (the live ones change in place). */
static mpr_value_t *params_copy(void) {
    mpr_value_t *list = mpr_value_new_list();
    bool prev = mpr_set_grad_enabled(false);
    mpr_scope_begin(); /* the clones are the scope's; the list takes its own references */
    for (int i = 0; list && i < srv.n; i++) {
        mpr_tensor_t *copy = mpr_clone(srv.params[i]);
        mpr_value_t *v = copy ? mpr_value_new_tensor(copy) : NULL;
        if (!v || mpr_value_list_append(list, v)) {
            mpr_value_release(list);
            list = NULL;
        }
    }
    mpr_scope_end();
    mpr_set_grad_enabled(prev);
    return list;
}

/* Completes the round: mean gradient in trainer order, one step. Under lock. */
static mpr_value_t *step_round(void) {
    mpr_value_t *out = NULL;
    mpr_tensor_t **mean = calloc((size_t)srv.n, sizeof *mean);
    if (!mean) {
        mpr_error_set(MPR_ERR_NOMEM, "batch_ps: out of memory");
        return NULL;
    }
    bool prev = mpr_set_grad_enabled(false);
    mpr_scope_begin(); /* owns the means */
    mpr_err_t e = MPR_OK;
    for (int i = 0; !e && i < srv.n; i++) {
        for (int t = 0; !e && t < srv.ntrainers; t++) {
            mpr_tensor_t *g;
            if ((e = mpr_value_get_tensor(mpr_value_list_get(srv.grads[t], (size_t)i), &g))) break;
            if (t == 0) {
                if (!(mean[i] = mpr_clone(g))) e = mpr_last_error_code();
            } else {
                e = mpr_add_(mean[i], g);
            }
        }
        if (!e) e = mpr_mul_scalar_(mean[i], 1.0 / srv.ntrainers);
    }
    if (!e) e = mpr_optimizer_step_grads(srv.opt, mean, srv.n);
    mpr_scope_end();
    mpr_set_grad_enabled(prev);
    if (!e) out = params_copy();
    free(mean);
    return out;
}

/* [trainer index, [grads of this server's parameters]] -> future of [new parameters] */
static mpr_err_t update_fn(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_future_t **result) {
    int64_t t;
    mpr_value_t *grads;
    mpr_err_t e = mpr_args_unpack(args, "lv", &t, &grads);
    if (e) return e;
    if (t < 0 || t >= srv.ntrainers || (int)mpr_value_list_len(grads) != srv.n)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "batch_ps: update from trainer %lld with %zu gradients (%d expected)",
                             (long long)t, mpr_value_list_len(grads), srv.n);
    pthread_mutex_lock(&srv.lock);
    if (srv.grads[t]) {
        pthread_mutex_unlock(&srv.lock);
        return mpr_error_set(MPR_ERR_STATE, "batch_ps: trainer %lld sent two updates in one round", (long long)t);
    }
    srv.grads[t] = mpr_value_retain(grads);
    *result = mpr_future_retain(srv.round);
    mpr_future_t *done = NULL;
    mpr_value_t *model = NULL;
    if (++srv.arrived == srv.ntrainers) {
        model = step_round();
        if (!model) e = mpr_last_error_code();
        for (int i = 0; i < srv.ntrainers; i++) {
            mpr_value_release(srv.grads[i]);
            srv.grads[i] = NULL;
        }
        done = srv.round;
        srv.round = mpr_future_create();
        srv.arrived = 0;
        if (!srv.round) e = mpr_last_error_code();
    }
    char msg[MPR_ERROR_TEXT_MAX];
    if (e) snprintf(msg, sizeof msg, "batch_ps: the update failed: %s", mpr_last_error());
    pthread_mutex_unlock(&srv.lock);
    if (done) {
        if (e)
            mpr_future_set_error(done, e, msg);
        else
            mpr_future_set_result(done, model);
        mpr_future_release(done);
    }
    return MPR_OK;
}

/* [] -> [parameters] */
static mpr_err_t fetch_fn(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    pthread_mutex_lock(&srv.lock);
    *result = params_copy();
    pthread_mutex_unlock(&srv.lock);
    return *result ? MPR_OK : mpr_last_error_code();
}

/* [] -> bytes: .safetensors of this server's parameters ("model.<name>") and
 * optimizer state ("ps<g>.optim.*"), the leader's part of a checkpoint */
static mpr_err_t state_fn(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    mpr_tensor_dict_t *d = mpr_tensor_dict_create();
    if (!d) return mpr_last_error_code();
    char prefix[32];
    snprintf(prefix, sizeof prefix, "ps%d.optim.", srv.index);
    void *buf = NULL;
    size_t len = 0;
    pthread_mutex_lock(&srv.lock);
    mpr_err_t e = app_dict_add_tensors(d, "model.", srv.n, (const char *const *)srv.names, srv.params);
    if (!e) e = mpr_optimizer_state_export(srv.opt, d, prefix);
    if (!e) e = mpr_safetensors_encode(d, &buf, &len);
    pthread_mutex_unlock(&srv.lock);
    mpr_tensor_dict_destroy(d);
    if (!e && !(*result = mpr_value_new_bytes(buf, len))) e = mpr_last_error_code();
    free(buf);
    return e;
}

/* [bytes of a whole checkpoint] -> none: this server's parameters and optimizer state from it */
static mpr_err_t load_fn(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    const void *buf;
    size_t len;
    mpr_err_t e = mpr_args_unpack(args, "y", &buf, &len);
    if (e) return e;
    mpr_tensor_dict_t *d = mpr_safetensors_decode(buf, len, "checkpoint");
    if (!d) return mpr_last_error_code();
    char prefix[32];
    snprintf(prefix, sizeof prefix, "ps%d.optim.", srv.index);
    pthread_mutex_lock(&srv.lock);
    e = app_dict_copy_into_tensors(d, "model.", srv.n, (const char *const *)srv.names, srv.params);
    if (!e) e = mpr_optimizer_state_import(srv.opt, d, prefix);
    pthread_mutex_unlock(&srv.lock);
    mpr_tensor_dict_destroy(d);
    return e;
}

static mpr_err_t server_init(const ps_config_t *cfg, const ps_layout_t *lay) {
    int stages = app_fmnist_model_stages(cfg->model);
    int first = app_fmnist_group_first(stages, lay->nps, lay->rank);
    int count = app_fmnist_group_first(stages, lay->nps, lay->rank + 1) - first;
    if (!(srv.group = app_fmnist_group_create(cfg->model, first, count, (uint64_t)cfg->common.seed)))
        return mpr_last_error_code();
    srv.index = lay->rank;
    srv.n = mpr_module_num_parameters(srv.group);
    srv.ntrainers = lay->ntrainers;
    srv.params = calloc((size_t)srv.n, sizeof *srv.params);
    srv.names = calloc((size_t)srv.n, sizeof *srv.names);
    srv.grads = calloc((size_t)srv.ntrainers, sizeof *srv.grads);
    srv.round = mpr_future_create();
    if (!srv.params || !srv.names || !srv.grads || !srv.round)
        return mpr_error_set(MPR_ERR_NOMEM, "batch_ps: out of memory");
    for (int i = 0; i < srv.n; i++) { /* "<local stage>.<rest>" -> "<first + local stage>.<rest>" */
        const char *local;
        srv.params[i] = mpr_module_parameter(srv.group, i, &local);
        const char *dot = strchr(local, '.');
        size_t len = strlen(local) + 16;
        if (!(srv.names[i] = malloc(len))) return mpr_error_set(MPR_ERR_NOMEM, "batch_ps: out of memory");
        snprintf(srv.names[i], len, "%d%s", first + atoi(local), dot ? dot : "");
    }
    mpr_optim_options_t o;
    ps_optim_options(cfg, &o);
    if (!(srv.opt = mpr_optimizer_create(cfg->optimizer, srv.params, srv.n, &o))) return mpr_last_error_code();
    return MPR_OK;
}

static void server_free(void) {
    mpr_optimizer_destroy(srv.opt);
    for (int i = 0; srv.grads && i < srv.ntrainers; i++) mpr_value_release(srv.grads[i]);
    free(srv.grads);
    for (int i = 0; srv.names && i < srv.n; i++) free(srv.names[i]);
    free(srv.names);
    free(srv.params);
    mpr_future_release(srv.round);
    mpr_module_destroy(srv.group);
}

/* ---- a trainer ---- */

/* The followers' start state from the leader (SET_START_FN). */
static pthread_mutex_t inbox_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t inbox_cond = PTHREAD_COND_INITIALIZER;
static mpr_value_t *inbox;

/* [step, epoch, step in epoch, wall_s] -> none */
static mpr_err_t set_start_fn(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    pthread_mutex_lock(&inbox_lock);
    mpr_value_release(inbox);
    inbox = mpr_value_retain((mpr_value_t *)args);
    pthread_cond_broadcast(&inbox_cond);
    pthread_mutex_unlock(&inbox_lock);
    return MPR_OK;
}

typedef struct trainer {
    const ps_config_t *cfg;
    ps_layout_t lay;
    ps_trainer_data_t data;
    mpr_module_t *model;   /* the whole model, local */
    int *group_first;      /* [nps + 1]: server g holds parameters [group_first[g], group_first[g + 1]) */
    mpr_future_t **pending; /* [nps] */
    app_ckpt_state_t start;
} trainer_t;

static void fatal(const trainer_t *t, const char *what) { ps_fatal(t->lay.rank, what); }

/* Copy server g's parameter list into the local model. */
static mpr_err_t take_params(trainer_t *t, int g, const mpr_value_t *list) {
    int first = t->group_first[g], n = t->group_first[g + 1] - first;
    if ((int)mpr_value_list_len(list) != n)
        return mpr_error_set(MPR_ERR_DECODE, "ps%d sent %zu parameters, %d expected", g, mpr_value_list_len(list), n);
    bool prev = mpr_set_grad_enabled(false);
    mpr_err_t e = MPR_OK;
    for (int i = 0; !e && i < n; i++) {
        mpr_tensor_t *src;
        if (!(e = mpr_value_get_tensor(mpr_value_list_get(list, (size_t)i), &src)))
            e = mpr_copy_(mpr_module_parameter(t->model, first + i, NULL), src);
    }
    mpr_set_grad_enabled(prev);
    return e;
}

static mpr_err_t fetch_all(trainer_t *t) {
    for (int g = 0; g < t->lay.nps; g++) {
        mpr_value_t *r = NULL;
        mpr_err_t e = mpr_rpc_sync(mpr_to_rank(g), FETCH_FN, NULL, MPR_TIMEOUT_DEFAULT, &r);
        if (!e) e = take_params(t, g, r);
        mpr_value_release(r);
        if (e) return e;
    }
    return MPR_OK;
}

/* One step: local forward/backward, gradients to the servers, their new parameters back. */
static mpr_err_t train_step(void *app, mpr_tensor_t *x, mpr_tensor_t *y, double *loss) {
    trainer_t *t = app;
    mpr_tensor_t *l = mpr_nll_loss(mpr_module_forward(t->model, x), y);
    mpr_err_t e = l ? mpr_backward(l, NULL, false) : mpr_last_error_code();
    if (!e) e = mpr_item(l, loss);
    for (int g = 0; !e && g < t->lay.nps; g++) {
        mpr_value_t *grads = mpr_value_new_list();
        for (int i = t->group_first[g]; grads && i < t->group_first[g + 1]; i++) {
            mpr_tensor_t *gr = mpr_tensor_grad(mpr_module_parameter(t->model, i, NULL));
            if (!gr || mpr_value_list_append(grads, mpr_value_new_tensor(gr))) {
                if (!gr) mpr_error_set(MPR_ERR_STATE, "parameter %d has no gradient", i);
                mpr_value_release(grads);
                grads = NULL;
            }
        }
        t->pending[g] = grads ? mpr_rpc_async_take(mpr_to_rank(g), UPDATE_FN,
                                                   mpr_args_pack("lV", (int64_t)t->lay.trainer, grads), 0)
                              : NULL;
        if (!t->pending[g]) e = mpr_last_error_code();
    }
    for (int g = 0; g < t->lay.nps; g++) {
        mpr_value_t *r = NULL;
        mpr_err_t e2 = t->pending[g] ? mpr_future_get(t->pending[g], MPR_WAIT_FOREVER, &r) : MPR_OK;
        if (!e2 && r) e2 = take_params(t, g, r);
        if (!e) e = e2;
        mpr_value_release(r);
        mpr_future_release(t->pending[g]);
        t->pending[g] = NULL;
    }
    mpr_module_zero_grad(t->model);
    return e;
}

static mpr_err_t evaluate(void *app, double *acc) {
    trainer_t *t = app;
    int64_t n = mpr_tensor_shape(t->data.test_x)[0], correct = 0;
    bool prev = mpr_set_grad_enabled(false);
    for (int64_t i = 0; i < n; i += 1000) {
        int64_t len = n - i < 1000 ? n - i : 1000;
        mpr_scope_begin();
        mpr_tensor_t *x = mpr_narrow(t->data.test_x, 0, i, len), *y = mpr_narrow(t->data.test_y, 0, i, len);
        int64_t c = app_count_correct(mpr_module_forward(t->model, x), y);
        mpr_scope_end();
        if (c < 0) {
            mpr_set_grad_enabled(prev);
            return mpr_last_error_code();
        }
        correct += c;
    }
    mpr_set_grad_enabled(prev);
    *acc = (double)correct / (double)n;
    return MPR_OK;
}

/* Leader: every server's parameters and optimizer state + the run state. */
static mpr_err_t checkpoint(void *app, const app_ckpt_state_t *st) {
    trainer_t *t = app;
    mpr_tensor_dict_t *d = mpr_tensor_dict_create();
    if (!d) return mpr_last_error_code();
    mpr_err_t e = MPR_OK;
    for (int g = 0; !e && g < t->lay.nps; g++) {
        mpr_value_t *r = NULL;
        const void *buf;
        size_t len;
        if (!(e = mpr_rpc_sync(mpr_to_rank(g), STATE_FN, NULL, MPR_TIMEOUT_DEFAULT, &r)) &&
            !(e = mpr_value_get_bytes(r, &buf, &len)))
            e = app_dict_merge_encoded(d, buf, len, "a server's state");
        mpr_value_release(r);
    }
    if (!e) e = mpr_tensor_dict_set_meta(d, "ps_app.model", t->cfg->model);
    if (!e) e = mpr_tensor_dict_set_meta(d, "ps_app.mode", "batch");
    if (!e) e = app_ckpt_save(t->cfg->common.checkpoint_dir, d, st, (int)t->cfg->keep);
    mpr_tensor_dict_destroy(d);
    return e;
}

/* Leader, --resume: the newest checkpoint into every server. */
static mpr_err_t restore(trainer_t *t) {
    mpr_tensor_dict_t *d = NULL;
    char *path = NULL;
    const char *const run[] = {"ps_app.model", t->cfg->model, "ps_app.mode", "batch", NULL};
    mpr_err_t e = app_ckpt_load_run(t->cfg->common.checkpoint_dir, (uint64_t)t->cfg->common.seed, run, &d, &t->start,
                                    &path);
    if (e) return e;
    mpr_dest_t *servers = calloc((size_t)t->lay.nps, sizeof *servers);
    if (!servers) e = mpr_error_set(MPR_ERR_NOMEM, "out of memory");
    for (int g = 0; !e && g < t->lay.nps; g++) servers[g] = mpr_to_rank(g);
    if (!e) e = app_ckpt_send(d, t->lay.nps, servers, LOAD_FN);
    free(servers);
    if (!e)
        fprintf(stderr, "resuming from %s (step %lld, epoch %lld)\n", path, (long long)t->start.step,
                (long long)t->start.epoch + 1);
    free(path);
    mpr_tensor_dict_destroy(d);
    return e;
}

static void send_start(trainer_t *t) {
    mpr_value_t *msg = mpr_args_pack("llld", t->start.step, t->start.epoch, t->start.step_in_epoch, t->start.wall_s);
    if (!msg) fatal(t, "starting the trainers");
    for (int r = t->lay.leader_rank + 1; r < t->lay.world; r++) {
        mpr_value_t *none = NULL;
        if (mpr_rpc_sync(mpr_to_rank(r), SET_START_FN, msg, MPR_TIMEOUT_DEFAULT, &none))
            fatal(t, "starting the trainers");
        mpr_value_release(none);
    }
    mpr_value_release(msg);
}

static void receive_start(trainer_t *t) {
    pthread_mutex_lock(&inbox_lock);
    while (!inbox) pthread_cond_wait(&inbox_cond, &inbox_lock);
    mpr_value_t *msg = inbox;
    inbox = NULL;
    pthread_mutex_unlock(&inbox_lock);
    if (mpr_args_unpack(msg, "llld", &t->start.step, &t->start.epoch, &t->start.step_in_epoch, &t->start.wall_s))
        fatal(t, "starting");
    mpr_value_release(msg);
}

static void run_trainer(const ps_config_t *cfg, const ps_layout_t *lay) {
    trainer_t t = {.cfg = cfg, .lay = *lay, .start = {.seed = (uint64_t)cfg->common.seed}};
    if (ps_trainer_data_load(cfg, lay, &t.data)) fatal(&t, "data");
    if (!(t.model = app_fmnist_model_create(cfg->model, (uint64_t)cfg->common.seed))) fatal(&t, "model");
    t.group_first = calloc((size_t)lay->nps + 1, sizeof *t.group_first);
    t.pending = calloc((size_t)lay->nps, sizeof *t.pending);
    if (!t.group_first || !t.pending) fatal(&t, "out of memory");
    int stages = app_fmnist_model_stages(cfg->model);
    for (int g = 0; g <= lay->nps; g++) { /* parameter offsets of the groups */
        int s = app_fmnist_group_first(stages, lay->nps, g);
        mpr_module_t *before = s ? app_fmnist_group_create(cfg->model, 0, s, 0) : NULL;
        t.group_first[g] = before ? mpr_module_num_parameters(before) : 0;
        mpr_module_destroy(before);
    }
    if (lay->trainer == 0) {
        if (cfg->common.resume && restore(&t)) fatal(&t, "--resume");
        send_start(&t);
    } else {
        receive_start(&t);
    }
    if (fetch_all(&t)) fatal(&t, "fetching the model");
    ps_train(cfg, lay, &t.data, &t.start, "batch", &(ps_loop_ops_t){train_step, evaluate, checkpoint}, &t);
    free(t.group_first);
    free(t.pending);
    mpr_module_destroy(t.model);
    ps_trainer_data_free(&t.data);
}

int main(int argc, char **argv) {
    ps_config_t cfg;
    ps_config_parse(argc, argv, summary, &cfg);
    if (app_fmnist_check(cfg.common.data_dir)) { /* every rank stops, before MPI starts */
        if (app_launch_rank() == 0) fprintf(stderr, "batch_ps: %s\n", mpr_last_error());
        return 1;
    }
    mpr_blas_set_num_threads(1); /* one BLAS thread per rank, as the anchor's torch.set_num_threads(1) */
    if (mpr_register_async_function(UPDATE_FN, update_fn, NULL) || mpr_register_function(FETCH_FN, fetch_fn, NULL) ||
        mpr_register_function(STATE_FN, state_fn, NULL) || mpr_register_function(LOAD_FN, load_fn, NULL) ||
        mpr_register_function(SET_START_FN, set_start_fn, NULL) || app_sync_register()) {
        fprintf(stderr, "batch_ps: %s\n", mpr_last_error());
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
        fprintf(stderr, "batch_ps: mpr_init: %s\n", mpr_last_error());
        return 1;
    }
    if (app_print_placement(&cfg.common, NULL)) fprintf(stderr, "batch_ps: %s\n", mpr_last_error());
    ps_layout_t lay = {.rank = -1};
    int rc = 0;
    if (ps_layout_get((int)cfg.ps, &lay)) {
        if (lay.rank == 0) fprintf(stderr, "batch_ps: %s\n", mpr_last_error());
        rc = 2;
    } else {
        if (lay.trainer < 0 && server_init(&cfg, &lay)) ps_fatal(lay.rank, "server");
        /* every server is ready before any trainer calls it */
        if (mpr_barrier(MPR_TIMEOUT_DEFAULT)) ps_fatal(lay.rank, "barrier");
        if (lay.trainer >= 0) run_trainer(&cfg, &lay);
    }
    mpr_shutdown(true);
    server_free();
    app_sync_cleanup();
    mpr_value_release(inbox);
    return rc;
}
