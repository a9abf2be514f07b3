/* apps/insitu_heat/learner.c — the surrogate and its training loop (see
 * learner.h). Runs on the learner rank's main thread; the samples arrive on
 * mpirpc's pool threads and wait in the inbox. */
#include "learner.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "inbox.h"
#include "insitu.h"
#include "mpirpc/mpirpc.h"
#include "shared.h"
#include "surrogate.h"

typedef struct learner {
    const learner_config_t *cfg;
    surrogate_t own;            /* the learner's own model (not shared) */
    surrogate_t *model;         /* &own, or on learner 0 with sharing the shared one; NULL on the other sharing learners */
    mpr_optimizer_t *opt;       /* not shared: Adam on own's parameters */
    mpr_dist_optimizer_t *dopt; /* shared: this learner's DistributedOptimizer over learner 0's parameters */
    mpr_generator_t *gen;
    uint64_t rng;
    inbox_sample_t *ring; /* replay samples, ring_n of them (reservoir) */
    inbox_sample_t *val;  /* the first val_keep held-out samples */
    int ring_n, val_n;
    double scale; /* target scale (0 until the first training sample) */
    int64_t last_step, adam_steps;
    double loss_sum;
    int loss_count;
    app_metrics_t *csv;
    learner_result_t res; /* counts of the whole run, a resumed one's included */
    int64_t base[4];      /* received, trained, held out, Adam steps at the checkpoint resumed from (else 0) */
    double t0, last_log;
} learner_t;

static uint64_t next_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void sample_release(inbox_sample_t *s) {
    mpr_tensor_release(s->x);
    mpr_tensor_release(s->y);
    s->x = s->y = NULL;
}

/* Reservoir sampling: after `seen` training samples the ring holds a
 * uniform random subset of them (so early states are not forgotten as the
 * simulation moves on). Takes s; releases it or what it replaces. */
static void replay_offer(learner_t *l, inbox_sample_t s, int64_t seen) {
    int cap = l->cfg->replay;
    if (l->ring_n < cap) {
        l->ring[l->ring_n++] = s;
        return;
    }
    uint64_t k = next_u64(&l->rng) % (uint64_t)seen;
    if (k < (uint64_t)cap) {
        sample_release(&l->ring[k]);
        l->ring[k] = s;
    } else {
        sample_release(&s);
    }
}

static int sample_rows(const inbox_sample_t *s) { return (int)mpr_tensor_shape(s->y)[0]; }
static int sample_cols(const inbox_sample_t *s) { return (int)mpr_tensor_shape(s->y)[1]; }

/* Scope-owned views: the c x c interior crop at (i, j) of s's y, its frame crop of x, and the matching x interior. */
static void crop(const inbox_sample_t *s, int64_t i, int64_t j, int64_t c, mpr_tensor_t **xf, mpr_tensor_t **inc) {
    *xf = mpr_narrow(mpr_narrow(s->x, 0, i, c + 2), 1, j, c + 2);
    mpr_tensor_t *xc = mpr_narrow(mpr_narrow(s->x, 0, i + 1, c), 1, j + 1, c);
    *inc = mpr_sub(mpr_narrow(mpr_narrow(s->y, 0, i, c), 1, j, c), xc);
}

/* One Adam step on a batch of crops: the first from `fresh`, the others from the replay samples. */
static mpr_err_t train_step(learner_t *l, const inbox_sample_t *fresh) {
    const learner_config_t *cfg = l->cfg;
    int b = cfg->batch;
    mpr_tensor_t **xs = calloc((size_t)b * 2, sizeof *xs), **ts = xs ? xs + b : NULL;
    if (!xs) return mpr_error_set(MPR_ERR_NOMEM, "learner: out of memory");
    mpr_scope_begin();
    int64_t c = cfg->crop;
    for (int k = -1; k < l->ring_n; k++) { /* the crop fits the fresh sample and every one in the ring */
        const inbox_sample_t *s = k < 0 ? fresh : &l->ring[k];
        if (sample_rows(s) < c) c = sample_rows(s);
        if (sample_cols(s) < c) c = sample_cols(s);
    }
    for (int k = 0; k < b; k++) {
        const inbox_sample_t *s = k == 0 || l->ring_n == 0 ? fresh : &l->ring[next_u64(&l->rng) % (uint64_t)l->ring_n];
        int64_t i = (int64_t)(next_u64(&l->rng) % (uint64_t)(sample_rows(s) - c + 1));
        int64_t j = (int64_t)(next_u64(&l->rng) % (uint64_t)(sample_cols(s) - c + 1));
        crop(s, i, j, c, &xs[k], &ts[k]);
    }
    mpr_tensor_t *x = mpr_unsqueeze(mpr_stack(xs, b, 0), 1);
    mpr_tensor_t *target = mpr_mul_scalar(mpr_unsqueeze(mpr_stack(ts, b, 0), 1), 1.0 / l->scale);
    mpr_tensor_t *loss = NULL;
    double v = NAN;
    mpr_err_t e = MPR_OK;
    if (!cfg->shared) {
        mpr_optimizer_zero_grad(l->opt);
        loss = mpr_mse_loss(surrogate_forward(l->model, x, 1, false), target);
        e = loss ? mpr_backward(loss, NULL, false) : mpr_last_error_code();
        if (!e) e = mpr_optimizer_step(l->opt);
    } else { /* the forward on learner 0, the gradients to its parameters, its optimizer steps them */
        int64_t ctx = 0;
        e = mpr_dist_context_begin(&ctx);
        if (!e) {
            loss = mpr_mse_loss(shared_forward(x), target);
            e = loss ? mpr_dist_backward(ctx, &loss, 1, false) : mpr_last_error_code();
            if (!e) e = mpr_dist_optimizer_step(l->dopt, ctx);
            mpr_err_t e2 = mpr_dist_context_end(ctx);
            if (!e) e = e2;
        }
    }
    if (!e) e = mpr_item(loss, &v);
    mpr_scope_end();
    free(xs);
    if (e) return e;
    l->adam_steps++;
    l->loss_sum += v;
    l->loss_count++;
    return MPR_OK;
}

/* The stride of validation (and of the first sample's scales) on an h x w
 * block: the largest that leaves at least val_cells cells (every
 * stride-th row and column), 1 with val_cells 0 or a smaller block. A
 * uniform subsample covers the block's hot spots, which a few windows miss;
 * whole 512 x 512 blocks made validation cost the learner 4-5x its
 * training and a K = 20 simulation wait for it. */
static int eval_stride(const learner_t *l, int64_t h, int64_t w) {
    int64_t want = l->cfg->val_cells, s = 1;
    if (want <= 0) return 1;
    while (s < h && s < w && ((h + s) / (s + 1)) * ((w + s) / (s + 1)) >= want) s++;
    return (int)s;
}

/* Validation error over the kept held-out samples (every eval_stride-th
 * row and column of each block, no grad). */
static mpr_err_t validate(learner_t *l, double *err) {
    double se = 0, ref = 0, t0 = app_now();
    bool prev = mpr_set_grad_enabled(false);
    mpr_err_t e = MPR_OK;
    for (int k = 0; k < l->val_n && !e; k++) {
        const inbox_sample_t *s = &l->val[k];
        int64_t h = sample_rows(s), w = sample_cols(s);
        int stride = eval_stride(l, h, w);
        mpr_scope_begin();
        mpr_tensor_t *xf = mpr_unsqueeze(mpr_unsqueeze(s->x, 0), 0);
        mpr_tensor_t *inc = surrogate_subsample(mpr_sub(s->y, mpr_narrow(mpr_narrow(s->x, 0, 1, h), 1, 1, w)), stride);
        mpr_tensor_t *pred = mpr_mul_scalar(surrogate_forward(l->model, xf, stride, false), l->scale);
        mpr_tensor_t *d = inc ? mpr_sub(mpr_reshape(pred, 2, mpr_tensor_shape(inc)), inc) : NULL;
        double a = NAN, b = NAN;
        if (!d || mpr_item(mpr_sum(mpr_mul(d, d)), &a) || mpr_item(mpr_sum(mpr_mul(inc, inc)), &b))
            e = mpr_last_error_code();
        mpr_scope_end();
        se += a, ref += b;
    }
    mpr_set_grad_enabled(prev);
    *err = ref > 0 ? sqrt(se / ref) : NAN;
    l->res.validate_s += app_now() - t0;
    return e;
}

static mpr_err_t report(learner_t *l, bool final) {
    /* nothing to validate on yet, or no training sample yet (the scales come from the first one:
     * samples may arrive out of order, handlers run on several pool threads) */
    if (l->val_n == 0 || l->scale == 0 || !l->model) return MPR_OK; /* (sharing: learner 0 validates) */
    double err;
    mpr_err_t e = validate(l, &err);
    if (e) return e;
    if (l->res.evals++ == 0) l->res.first_val_err = err;
    l->res.final_val_err = err;
    double now = app_now(), wall = now - l->t0;
    double loss = l->loss_count ? l->loss_sum / l->loss_count : NAN;
    double extra[4] = {(double)l->last_step, err, (double)l->res.trained, (double)l->res.received};
    if (l->csv && (e = app_metrics_write(l->csv, l->adam_steps, 0, wall, loss,
                                         wall > 0 ? (double)l->res.trained / wall : NAN, NAN, extra)))
        return e;
    if (final || now - l->last_log >= l->cfg->log_interval) {
        fprintf(stderr, "%s: sim step %lld, %lld samples trained, %lld Adam steps, loss %.4g, validation error %.4f\n",
                l->cfg->label, (long long)l->last_step, (long long)l->res.trained, (long long)l->adam_steps, loss, err);
        l->last_log = now;
    }
    l->loss_sum = 0, l->loss_count = 0;
    return MPR_OK;
}

/* A popped sample: hold it out, or train on it. */
static mpr_err_t take(learner_t *l, inbox_sample_t s) {
    const learner_config_t *cfg = l->cfg;
    l->res.received++;
    if (s.step > l->last_step) l->last_step = s.step;
    if ((s.step / cfg->every) % cfg->holdout == 1) {
        l->res.held_out++;
        if (l->val_n < cfg->val_keep)
            l->val[l->val_n++] = s;
        else
            sample_release(&s);
        return l->res.evals == 0 ? report(l, false) : MPR_OK; /* the untrained (or barely trained) error */
    }
    if (l->scale == 0) { /* the scales of the target and of the moments: from this first sample */
        int stride = eval_stride(l, sample_rows(&s), sample_cols(&s));
        mpr_err_t e = cfg->shared ? shared_scale(s.x, s.y, stride, &l->scale)
                                  : surrogate_set_scales(l->model, s.x, s.y, stride, &l->scale);
        if (!e && l->res.evals == 0) e = report(l, false); /* held-out samples came first: the untrained error */
        if (e) {
            sample_release(&s);
            return e;
        }
    }
    mpr_err_t e = MPR_OK;
    for (int k = 0; k < cfg->steps_per_sample && !e; k++) {
        e = train_step(l, &s);
        if (!e && l->adam_steps % cfg->eval_every == 0) e = report(l, false);
    }
    if (e) {
        sample_release(&s);
        return e;
    }
    l->res.trained++;
    replay_offer(l, s, l->res.trained);
    return MPR_OK;
}

/* ---- checkpoint (see learner.h) ---- */


static mpr_err_t meta_i64(mpr_tensor_dict_t *d, const char *key, int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return mpr_tensor_dict_set_meta(d, key, buf);
}

static mpr_err_t meta_f64(mpr_tensor_dict_t *d, const char *key, double v) {
    char buf[48];
    snprintf(buf, sizeof buf, "%a", v); /* exact */
    return mpr_tensor_dict_set_meta(d, key, buf);
}

/* A metadata entry of the checkpoint as a number (strtoll / strtod, which reads %a). */
static mpr_err_t get_meta(const mpr_tensor_dict_t *d, const char *key, bool is_int, int64_t *i, double *f) {
    const char *v = mpr_tensor_dict_get_meta(d, key);
    char *end = NULL;
    errno = 0;
    if (v && is_int) *i = strtoll(v, &end, 10);
    if (v && !is_int) *f = strtod(v, &end);
    if (!v || !end || end == v || *end || errno)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "learner checkpoint: metadata %s missing or not a number", key);
    return MPR_OK;
}

/* The samples set[n] as "<what>.<k>.x/.y" tensors and "<what>.<k>.step/.sim" metadata. */
static mpr_err_t save_samples(mpr_tensor_dict_t *d, const char *what, const inbox_sample_t *set, int n) {
    mpr_err_t e = MPR_OK;
    char key[64];
    for (int k = 0; k < n && !e; k++) {
        snprintf(key, sizeof key, "%s.%d.x", what, k);
        e = mpr_tensor_dict_set(d, key, set[k].x);
        snprintf(key, sizeof key, "%s.%d.y", what, k);
        if (!e) e = mpr_tensor_dict_set(d, key, set[k].y);
        snprintf(key, sizeof key, "%s.%d.step", what, k);
        if (!e) e = meta_i64(d, key, set[k].step);
        snprintf(key, sizeof key, "%s.%d.sim", what, k);
        if (!e) e = meta_i64(d, key, set[k].sim_rank);
    }
    return e;
}

static mpr_err_t load_samples(const mpr_tensor_dict_t *d, const char *what, inbox_sample_t *set, int *n, int cap) {
    char key[64];
    int64_t count = 0;
    snprintf(key, sizeof key, "learner.%s_n", what);
    mpr_err_t e = get_meta(d, key, true, &count, NULL);
    if (!e && (count < 0 || count > cap))
        e = mpr_error_set(MPR_ERR_INVALID_ARG, "learner checkpoint: %lld %s samples, this run keeps at most %d",
                          (long long)count, what, cap);
    for (int k = 0; k < count && !e; k++) {
        int64_t step = 0, sim = 0;
        snprintf(key, sizeof key, "%s.%d.x", what, k);
        mpr_tensor_t *x = mpr_tensor_dict_get(d, key);
        snprintf(key, sizeof key, "%s.%d.y", what, k);
        mpr_tensor_t *y = mpr_tensor_dict_get(d, key);
        snprintf(key, sizeof key, "%s.%d.step", what, k);
        e = x && y ? get_meta(d, key, true, &step, NULL) : mpr_error_set(MPR_ERR_NOT_FOUND, "learner checkpoint: no %s", key);
        snprintf(key, sizeof key, "%s.%d.sim", what, k);
        if (!e) e = get_meta(d, key, true, &sim, NULL);
        if (!e) set[(*n)++] = (inbox_sample_t){step, (int)sim, mpr_tensor_retain(x), mpr_tensor_retain(y)};
    }
    return e;
}

static mpr_err_t learner_save(learner_t *l) {
    const learner_config_t *cfg = l->cfg;
    mpr_tensor_dict_t *d = mpr_tensor_dict_create();
    if (!d) return mpr_last_error_code();
    mpr_err_t e = MPR_OK;
    for (int k = 0; k < SURROGATE_MODULES && !e && l->model; k++) /* (sharing: learner 0 holds the model) */
        e = app_dict_add_module(d, surrogate_module_prefix[k], surrogate_module(l->model, k));
    if (!e) e = l->dopt ? mpr_dist_optimizer_state_export(l->dopt, d, "optim.") : mpr_optimizer_state_export(l->opt, d, "optim.");
    if (!e && l->model && l->model->inv_scale) e = mpr_tensor_dict_set(d, "learner.inv_scale", l->model->inv_scale);
    if (!e) e = save_samples(d, "replay", l->ring, l->ring_n);
    if (!e) e = save_samples(d, "val", l->val, l->val_n);
    if (!e) e = meta_i64(d, "learner.replay_n", l->ring_n);
    if (!e) e = meta_i64(d, "learner.val_n", l->val_n);
    if (!e) e = meta_f64(d, "learner.scale", l->scale);
    if (!e) e = meta_i64(d, "learner.rng", (int64_t)l->rng);
    if (!e) e = meta_i64(d, "learner.adam_steps", l->adam_steps);
    if (!e) e = meta_i64(d, "learner.last_step", l->last_step);
    if (!e) e = meta_i64(d, "learner.received", l->res.received);
    if (!e) e = meta_i64(d, "learner.trained", l->res.trained);
    if (!e) e = meta_i64(d, "learner.held_out", l->res.held_out);
    if (!e) e = meta_i64(d, "learner.evals", l->res.evals);
    if (!e) e = meta_f64(d, "learner.first_val_err", l->res.first_val_err);
    app_ckpt_state_t st = {.step = cfg->sim_steps, .wall_s = app_now() - l->t0, .seed = cfg->seed};
    if (!e) e = app_ckpt_save(cfg->checkpoint_dir, d, &st, 2);
    mpr_tensor_dict_destroy(d);
    return e;
}

/* Everything learner_save wrote, into a learner whose model and optimizer exist. */
static mpr_err_t learner_restore(learner_t *l, const mpr_tensor_dict_t *d) {
    mpr_err_t e = MPR_OK;
    int64_t rng = 0, trained = 0, received = 0, held = 0, evals = 0;
    /* sharing: learner 0's model was restored before any learner trained (shared_restore) */
    for (int k = 0; k < SURROGATE_MODULES && !e && !l->cfg->shared; k++)
        e = app_dict_copy_into_module(d, surrogate_module_prefix[k], surrogate_module(l->model, k));
    if (!e) e = l->dopt ? mpr_dist_optimizer_state_import(l->dopt, d, "optim.") : mpr_optimizer_state_import(l->opt, d, "optim.");
    if (!e) e = get_meta(d, "learner.scale", false, NULL, &l->scale);
    if (!e) e = get_meta(d, "learner.rng", true, &rng, NULL);
    if (!e) e = get_meta(d, "learner.adam_steps", true, &l->adam_steps, NULL);
    if (!e) e = get_meta(d, "learner.last_step", true, &l->last_step, NULL);
    if (!e) e = get_meta(d, "learner.received", true, &received, NULL);
    if (!e) e = get_meta(d, "learner.trained", true, &trained, NULL);
    if (!e) e = get_meta(d, "learner.held_out", true, &held, NULL);
    if (!e) e = get_meta(d, "learner.evals", true, &evals, NULL);
    if (!e) e = get_meta(d, "learner.first_val_err", false, NULL, &l->res.first_val_err);
    mpr_tensor_t *inv = mpr_tensor_dict_get(d, "learner.inv_scale");
    if (!e && !l->cfg->shared && (l->scale != 0) != (inv != NULL))
        e = mpr_error_set(MPR_ERR_INVALID_ARG, "learner checkpoint: the target scale and the moment scales disagree");
    if (!e && inv && !l->cfg->shared) l->model->inv_scale = mpr_tensor_retain(inv);
    if (!e) e = load_samples(d, "replay", l->ring, &l->ring_n, l->cfg->replay);
    if (!e) e = load_samples(d, "val", l->val, &l->val_n, l->cfg->val_keep);
    l->rng = (uint64_t)rng;
    l->res.received = received, l->res.trained = trained, l->res.held_out = held, l->res.evals = evals;
    l->base[0] = received, l->base[1] = trained, l->base[2] = held, l->base[3] = l->adam_steps;
    return e;
}

/* Before the first sample arrives: one training step and one validation-
 * sized forward on a throwaway model and random data, so the first real
 * sample does not pay for first use (BLAS buffers, the tensor library's
 * caches, fresh heap pages): the learner's first sample took ~40 ms and its
 * first validation ~20 ms, ~9 samples of the simulation's time at K = 20,
 * more than the window and the inbox hold. Nothing of the real model, the
 * optimizer or the random state is touched. */
static mpr_err_t warm_up(const learner_config_t *cfg) {
    mpr_generator_t *gen = mpr_generator_create(cfg->seed);
    surrogate_t m = {0};
    mpr_err_t e = gen ? surrogate_init(&m, cfg->channels, gen) : mpr_last_error_code();
    /* first use needs no real sizes: a batch of at most 16 crops of at most 32 cells, and a
     * validation-sized forward on a 130 x 130 block (~16k cells) */
    int64_t c = cfg->crop < 32 ? cfg->crop : 32, b = cfg->batch < 16 ? cfg->batch : 16, side = 130;
    mpr_scope_begin();
    mpr_tensor_t *x = e ? NULL : mpr_rand(MPR_F32, MPR_SHAPE(side + 2, side + 2), gen);
    mpr_tensor_t *y = x ? mpr_rand(MPR_F32, MPR_SHAPE(side, side), gen) : NULL;
    double scale = 1;
    if (!e) e = y ? surrogate_set_scales(&m, x, y, 1, &scale) : mpr_last_error_code();
    if (!e) {
        mpr_tensor_t *xb = mpr_expand(mpr_narrow(mpr_narrow(x, 0, 0, c + 2), 1, 0, c + 2), 4,
                                      (int64_t[]){b, 1, c + 2, c + 2});
        mpr_tensor_t *loss = xb ? mpr_mean(surrogate_forward(&m, mpr_contiguous(xb), 1, false)) : NULL;
        e = loss ? mpr_backward(loss, NULL, false) : mpr_last_error_code();
    }
    if (!e) {
        bool prev = mpr_set_grad_enabled(false);
        double v;
        mpr_tensor_t *pred = surrogate_forward(&m, mpr_unsqueeze(mpr_unsqueeze(x, 0), 0), 1, false);
        e = pred ? mpr_item(mpr_sum(pred), &v) : mpr_last_error_code();
        mpr_set_grad_enabled(prev);
    }
    mpr_scope_end();
    surrogate_destroy(&m);
    mpr_generator_destroy(gen);
    return e;
}

mpr_err_t learner_run(const learner_config_t *cfg, learner_result_t *out) {
    learner_t l = {.cfg = cfg, .rng = cfg->seed ^ 0x5eed, .last_step = -1};
    l.res.first_val_err = l.res.final_val_err = NAN;
    l.t0 = l.last_log = app_now();
    mpr_err_t e = MPR_OK;
    l.ring = calloc((size_t)cfg->replay, sizeof *l.ring);
    l.val = calloc((size_t)cfg->val_keep, sizeof *l.val);
    l.gen = mpr_generator_create(cfg->seed);
    if (!l.ring || !l.val || !l.gen) e = mpr_error_set(MPR_ERR_NOMEM, "learner: out of memory");
    if (!e && !cfg->shared) { /* its own model and Adam */
        l.model = &l.own;
        e = surrogate_init(&l.own, cfg->channels, l.gen);
        mpr_tensor_t *params[SURROGATE_PARAMS];
        if (!e) surrogate_parameters(&l.own, params);
        mpr_optim_options_t o;
        mpr_optim_options_default("adam", &o);
        o.lr = cfg->lr;
        if (!e && !(l.opt = mpr_optimizer_create("adam", params, SURROGATE_PARAMS, &o))) e = mpr_last_error_code();
    } else if (!e) { /* learner 0's model, a DistributedOptimizer over its parameters */
        l.model = shared_model(); /* learner 0 only */
        if (!(l.dopt = shared_optimizer(cfg->lr))) e = mpr_last_error_code();
    }
    if (!e && cfg->resume) {
        e = learner_restore(&l, cfg->resume);
        l.t0 -= cfg->resume_state->wall_s; /* the metrics' clock continues */
    }
    static const char *const extra[] = {"sim_step", "val_rel_err", "samples_trained", "samples_received"};
    if (!e && cfg->metrics_path &&
        !(l.csv = app_metrics_open(cfg->metrics_path, extra, 4, cfg->resume ? l.adam_steps : -1)))
        e = mpr_last_error_code();
    if (!e) e = warm_up(cfg);
    inbox_sample_t s;
    while (!e && inbox_pop(&s)) {
        double t0 = app_now();
        e = take(&l, s);
        l.res.busy_s += app_now() - t0;
    }
    /* on an error, keep draining so that the simulation ranks are never left waiting */
    while (e && inbox_pop(&s)) {
        l.res.received++;
        sample_release(&s);
    }
    if (!e && cfg->shared) /* every learner's last step is in the model before it is validated and saved */
        e = app_sync(cfg->first_learner_rank, cfg->first_learner_rank + cfg->index, cfg->learners - 1, NULL, NULL);
    if (!e) e = report(&l, true);
    if (!e && cfg->checkpoint_dir) e = learner_save(&l);
    l.res.owner_steps = -1;
    if (!e && l.dopt) { /* what learner 0 applied of this learner's steps: its Adam's step count there */
        mpr_tensor_dict_t *d = mpr_tensor_dict_create();
        double steps = -1;
        e = d ? mpr_dist_optimizer_state_export(l.dopt, d, NULL) : mpr_last_error_code();
        mpr_tensor_t *t = e ? NULL : mpr_tensor_dict_get(d, "state.0.step");
        if (t && !mpr_item(t, &steps)) l.res.owner_steps = (int64_t)steps;
        mpr_tensor_dict_destroy(d);
    }
    l.res.train_s = app_now() - l.t0;
    l.res.adam_steps = l.adam_steps;
    *out = l.res; /* this run's counts: the sim ranks count only theirs */
    out->received -= l.base[0], out->trained -= l.base[1], out->held_out -= l.base[2], out->adam_steps -= l.base[3];
    app_metrics_close(l.csv);
    for (int i = 0; i < l.ring_n; i++) sample_release(&l.ring[i]);
    for (int i = 0; i < l.val_n; i++) sample_release(&l.val[i]);
    free(l.ring);
    free(l.val);
    mpr_optimizer_destroy(l.opt);
    mpr_dist_optimizer_destroy(l.dopt);
    surrogate_destroy(&l.own);
    mpr_generator_destroy(l.gen);
    if (!e) INSITU_ASSERT(out->received == out->trained + out->held_out);
    return e;
}
