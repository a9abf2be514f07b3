/* pipeline_stage.c — the pipeline app's stage (pipeline_stage.h): the
 * RemoteModule kind and the per-rank calls on the stage it holds.
 *
 * Invariants: `held` points to this rank's stage while its module lives
 * (set by the constructor, cleared by the module's ctx destructor, both
 * under held_lock); a stage's module and parameters are touched only under
 * its own lock (forward, profile, gradients, state, load), so the
 * micro-batches' forwards never run concurrently on one stage. The one
 * exception, accumulate, reads only `params` and `n` (set by the
 * constructor, never changed) and the contexts' gradients (thread-safe);
 * the stage outlives it (the driver destroys the stage after its last
 * call); chain keeps the stage pointer across its wait for the stage
 * before it on the same grounds and takes the lock for the forward only.
 * `peak` only grows between two memory calls (atomic max).
 *
 * The first stage's chain forwards (k = 0) run on the stage's own thread
 * (`runner`, started at the first one), in arrival order, and that thread
 * completes each call's future, so its reply leaves right after its
 * forward. With one pool thread per call waiting on the stage's lock, a
 * trace (S = 2, M = 8) showed the thread that finished a forward wait
 * 1.5-3 ms for a core to send its reply while the next one computed, and
 * stage 2 idle meanwhile. Queue invariants (under queue_lock): `jobs`
 * holds the calls not yet taken, oldest first; each job holds a reference
 * to its input and to its call's future, which is completed exactly once
 * (by the runner, or failed by stage_free); once `stopping` is set no job
 * is added and the runner exits. */
#define _GNU_SOURCE /* pthread_setname_np */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "fmnist_models.h"
#include "mpirpc/mpirpc.h"
#include "pipeline_stage.h"

typedef struct fwd_job {
    mpr_tensor_t *x;    /* reference */
    int64_t ctx;        /* the call's dist autograd context (0: none) */
    mpr_future_t *done; /* reference: the call's outcome */
    struct fwd_job *next;
} fwd_job_t;

typedef struct stage {
    pthread_mutex_t lock;
    /* The first stage's forward thread and its queue. */
    pthread_mutex_t queue_lock;
    pthread_cond_t queue_cond;
    fwd_job_t *jobs, *jobs_tail;
    bool runner_started, stopping;
    pthread_t runner;
    mpr_module_t *net; /* borrowed: the module's child "net" */
    int n;             /* parameters */
    mpr_tensor_t **params; /* borrowed from net */
    char **keys;       /* "model.<group>.<name>" per parameter */
    atomic_llong peak; /* largest mpr_autograd_saved_bytes sampled since the last memory call */
    bool input_grad;   /* not the first stage: its backward also makes its input's gradient */
} stage_t;

static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static stage_t *held;

void pipeline_param_key(int group, const char *name, char *buf, size_t cap) {
    snprintf(buf, cap, "model.%d.%s", group, name);
}

static void job_fail(fwd_job_t *j, mpr_err_t code, const char *message) {
    mpr_future_set_error(j->done, code, message);
    mpr_future_release(j->done);
    mpr_tensor_release(j->x);
    free(j);
}

static void stage_free(void *ctx) {
    stage_t *st = ctx;
    pthread_mutex_lock(&held_lock);
    if (held == st) held = NULL;
    pthread_mutex_unlock(&held_lock);
    pthread_mutex_lock(&st->queue_lock);
    st->stopping = true;
    fwd_job_t *left = st->jobs;
    st->jobs = st->jobs_tail = NULL;
    pthread_cond_signal(&st->queue_cond);
    pthread_mutex_unlock(&st->queue_lock);
    if (st->runner_started) pthread_join(st->runner, NULL);
    while (left) {
        fwd_job_t *next = left->next;
        job_fail(left, MPR_ERR_SHUTDOWN, "pipeline: the stage was destroyed before this forward ran");
        left = next;
    }
    pthread_mutex_destroy(&st->queue_lock);
    pthread_cond_destroy(&st->queue_cond);
    for (int i = 0; st->keys && i < st->n; i++) free(st->keys[i]);
    free(st->keys);
    free(st->params);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

/* A sample of this rank's activation memory into st->peak. */
static void sample_memory(stage_t *st) {
    long long now = (long long)mpr_autograd_saved_bytes(), seen = atomic_load(&st->peak);
    while (now > seen && !atomic_compare_exchange_weak(&st->peak, &seen, now)) {
    }
}

static mpr_tensor_t *stage_forward(mpr_module_t *self, mpr_tensor_t *x, void *ctx) {
    (void)self;
    stage_t *st = ctx;
    bool prev = mpr_set_grad_enabled(mpr_dist_context_current() != 0 && mpr_grad_enabled());
    pthread_mutex_lock(&st->lock);
    mpr_trace_begin("stage forward"); /* the compute, without the wait for the lock */
    mpr_tensor_t *y = mpr_module_forward(st->net, x);
    mpr_trace_end();
    sample_memory(st); /* y's graph is alive: its context holds it until the context ends */
    pthread_mutex_unlock(&st->lock);
    mpr_set_grad_enabled(prev);
    return y;
}

/* The keys of net's parameters: "<local group>.<rest>" -> "model.<first + local group>.<rest>". */
static mpr_err_t make_keys(stage_t *st, int first) {
    st->params = calloc((size_t)st->n, sizeof *st->params);
    st->keys = calloc((size_t)st->n, sizeof *st->keys);
    if (!st->params || !st->keys) return mpr_error_set(MPR_ERR_NOMEM, "pipeline stage: out of memory");
    for (int i = 0; i < st->n; i++) {
        const char *name;
        st->params[i] = mpr_module_parameter(st->net, i, &name);
        char *rest;
        long local = strtol(name, &rest, 10);
        char key[256];
        pipeline_param_key(first + (int)local, *rest == '.' ? rest + 1 : rest, key, sizeof key);
        if (!(st->keys[i] = strdup(key))) return mpr_error_set(MPR_ERR_NOMEM, "pipeline stage: out of memory");
    }
    return MPR_OK;
}

/* [model kind, first group, group count, seed] -> the stage module */
static mpr_module_t *stage_ctor(const mpr_value_t *args, int device, void *user_data) {
    (void)user_data;
    const char *kind;
    int64_t first, count, seed;
    if (mpr_args_unpack(args, "slll", &kind, &first, &count, &seed)) return NULL;
    if (device >= 0) {
        mpr_error_set(MPR_ERR_UNSUPPORTED, "pipeline stage: CPU only");
        return NULL;
    }
    stage_t *st = calloc(1, sizeof *st);
    if (!st) {
        mpr_error_set(MPR_ERR_NOMEM, "pipeline stage: out of memory");
        return NULL;
    }
    pthread_mutex_init(&st->lock, NULL);
    pthread_mutex_init(&st->queue_lock, NULL);
    pthread_cond_init(&st->queue_cond, NULL);
    mpr_module_t *m = mpr_module_create("PipelineStage", stage_forward, st, stage_free);
    if (!m) {
        stage_free(st);
        return NULL;
    }
    mpr_module_t *net = app_fmnist_group_create(kind, (int)first, (int)count, (uint64_t)seed);
    if (!net || mpr_module_add_child(m, "net", net)) {
        mpr_module_destroy(m);
        return NULL;
    }
    st->net = net;
    st->input_grad = first > 0;
    st->n = mpr_module_num_parameters(net);
    if (make_keys(st, (int)first)) {
        mpr_module_destroy(m);
        return NULL;
    }
    pthread_mutex_lock(&held_lock);
    bool taken = held != NULL;
    if (!taken) held = st;
    pthread_mutex_unlock(&held_lock);
    if (taken) {
        mpr_module_destroy(m);
        mpr_error_set(MPR_ERR_EXISTS, "pipeline stage: this rank already holds a stage");
        return NULL;
    }
    return m;
}

/* This rank's stage, locked (unlock with pthread_mutex_unlock(&st->lock)). */
static stage_t *lock_held(void) {
    pthread_mutex_lock(&held_lock);
    stage_t *st = held;
    if (st) pthread_mutex_lock(&st->lock);
    pthread_mutex_unlock(&held_lock);
    if (!st) mpr_error_set(MPR_ERR_NOT_FOUND, "pipeline: this rank holds no stage");
    return st;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* [x, reps] -> [median ms of forward + backward, output] */
static mpr_err_t profile_fn(mpr_call_ctx_t *call, const mpr_value_t *args, mpr_value_t **result) {
    (void)call;
    mpr_tensor_t *x;
    int64_t reps;
    mpr_err_t e = mpr_args_unpack(args, "tl", &x, &reps);
    if (e) return e;
    if (reps < 1 || reps > 1000) return mpr_error_set(MPR_ERR_INVALID_ARG, "pipeline.profile: reps %lld", (long long)reps);
    stage_t *st = lock_held();
    if (!st) return mpr_last_error_code();
    double *ms = calloc((size_t)reps, sizeof *ms);
    mpr_tensor_t *out = NULL;
    if (!ms) e = mpr_error_set(MPR_ERR_NOMEM, "pipeline.profile: out of memory");
    bool prev = mpr_set_grad_enabled(true);
    /* A later stage's backward in the pipeline also makes the gradient of
     * its input (sent to the stage before): so does the profile's. */
    mpr_tensor_t *in = NULL;
    if (!e && st->input_grad) {
        mpr_scope_begin();
        in = mpr_scope_escape(mpr_detach(x)); /* ours, whatever scope the handler runs in */
        mpr_scope_end();
    } else if (!e) {
        in = mpr_tensor_retain(x);
    }
    if (!e && (!in || (st->input_grad && mpr_set_requires_grad(in, true)))) e = mpr_last_error_code();
    for (int64_t r = -1; !e && r < reps; r++) { /* r = -1: warm-up */
        mpr_scope_begin();
        double t0 = app_now();
        mpr_tensor_t *y = mpr_module_forward(st->net, in);
        mpr_tensor_t *loss = y ? mpr_sum(y) : NULL;
        if (!loss || mpr_backward(loss, NULL, false)) e = mpr_last_error_code();
        if (r >= 0) ms[r] = (app_now() - t0) * 1e3;
        if (!e && r == reps - 1) out = mpr_scope_escape(mpr_detach(y));
        mpr_scope_end();
        mpr_module_zero_grad(st->net);
    }
    mpr_tensor_release(in);
    mpr_set_grad_enabled(prev);
    pthread_mutex_unlock(&st->lock);
    if (!e) {
        qsort(ms, (size_t)reps, sizeof *ms, cmp_double);
        e = mpr_return(result, "dT", ms[reps / 2], out);
    } else {
        mpr_tensor_release(out);
    }
    free(ms);
    return e;
}

void pipeline_stage_worker(int k, char *buf, size_t cap) { snprintf(buf, cap, "stage%d", k + 1); }

/* Stage k's forward, once stage k - 1's reply (its output) came. */
typedef struct chain_step {
    stage_t *st;
    mpr_future_t *prev; /* the call to stage k - 1: kept until its callback ran */
} chain_step_t;

static mpr_err_t chain_after(mpr_future_t *parent, void *user_data, mpr_value_t **result) {
    chain_step_t *c = user_data;
    mpr_value_t *v = NULL;
    mpr_tensor_t *h = NULL, *y = NULL;
    mpr_err_t e = mpr_future_get(parent, MPR_WAIT_FOREVER, &v);
    if (!e) e = mpr_value_get_tensor(v, &h);
    if (!e && !(y = stage_forward(NULL, h, c->st))) e = mpr_last_error_code();
    mpr_value_release(v);
    mpr_future_release(c->prev); /* the runtime holds the parent while its callbacks run */
    free(c);
    if (e) return e;
    *result = mpr_value_new_tensor(y);
    mpr_tensor_release(y);
    return *result ? MPR_OK : mpr_last_error_code();
}

/* One first-stage forward, on the runner: in the call's context (its
 * input's recv function and its graph belong there); completing `done`
 * sends the reply from this thread (the reply's send function is recorded
 * from the call's own state, not from the thread's context). */
static void run_job(stage_t *st, fwd_job_t *j) {
    int64_t prev = 0;
    mpr_err_t e = j->ctx ? mpr_dist_context_set_current(j->ctx, &prev) : MPR_OK;
    mpr_tensor_t *y = e ? NULL : stage_forward(NULL, j->x, st);
    if (!e && !y) e = mpr_last_error_code();
    char why[MPR_ERROR_TEXT_MAX] = "";
    if (e) snprintf(why, sizeof why, "%s", mpr_last_error()); /* before another call can touch it */
    if (j->ctx) mpr_dist_context_set_current(prev, NULL);
    APP_ASSERT(!mpr_future_done(j->done), "a queued forward's call is completed once, by the runner");
    if (e) return job_fail(j, e, why);
    mpr_value_t *v = mpr_value_new_tensor(y);
    mpr_tensor_release(y);
    if (!v) return job_fail(j, mpr_last_error_code(), mpr_last_error());
    mpr_future_set_result(j->done, v); /* ours to complete: cannot fail */
    mpr_future_release(j->done);
    mpr_tensor_release(j->x);
    free(j);
}

static void *runner_main(void *arg) {
    stage_t *st = arg;
    /* Its own name, not the pool thread's it was created from (top -H, perf, gdb). */
    (void)pthread_setname_np(pthread_self(), "pipeline fwd");
    pthread_mutex_lock(&st->queue_lock);
    for (;;) {
        while (!st->jobs && !st->stopping) pthread_cond_wait(&st->queue_cond, &st->queue_lock);
        if (st->stopping) break;
        fwd_job_t *j = st->jobs;
        APP_ASSERT(st->jobs_tail && !st->jobs_tail->next, "the queue's tail is its last job");
        if (!(st->jobs = j->next)) st->jobs_tail = NULL;
        pthread_mutex_unlock(&st->queue_lock);
        run_job(st, j);
        pthread_mutex_lock(&st->queue_lock);
    }
    pthread_mutex_unlock(&st->queue_lock);
    return NULL;
}

/* Stage 0 of a chain: x's forward queued for the runner; *result is
 * completed when it ran. */
static mpr_err_t first_stage_enqueue(stage_t *st, mpr_tensor_t *x, mpr_future_t **result) {
    fwd_job_t *j = calloc(1, sizeof *j);
    mpr_future_t *done = j ? mpr_future_create() : NULL;
    if (!done) {
        free(j);
        return mpr_error_set(MPR_ERR_NOMEM, "pipeline: out of memory");
    }
    j->x = mpr_tensor_retain(x); /* the call's arguments go when this returns */
    j->ctx = mpr_dist_context_current();
    j->done = done;
    pthread_mutex_lock(&st->queue_lock);
    mpr_err_t e = MPR_OK;
    if (st->stopping)
        e = mpr_error_set(MPR_ERR_SHUTDOWN, "pipeline: the stage is being destroyed");
    else if (!st->runner_started) {
        int rc = pthread_create(&st->runner, NULL, runner_main, st);
        if (rc == 0)
            st->runner_started = true;
        else
            e = mpr_error_set(MPR_ERR_NOMEM, "pipeline: cannot start the stage's thread (error %d)", rc);
    }
    if (!e) {
        APP_ASSERT(!st->jobs == !st->jobs_tail, "an empty queue has no tail, a queue with jobs has one");
        *result = mpr_future_retain(done); /* the runtime's; the job keeps its own */
        if (st->jobs_tail)
            st->jobs_tail->next = j;
        else
            st->jobs = j;
        st->jobs_tail = j;
        pthread_cond_signal(&st->queue_cond);
    }
    pthread_mutex_unlock(&st->queue_lock);
    if (e) {
        mpr_future_release(done);
        mpr_tensor_release(j->x);
        free(j);
    }
    return e;
}

/* [x, k, S] -> stage k's output (async): stage 0 runs its forward on x;
 * stage k > 0 first calls stage k - 1 with x and runs its own forward on
 * that reply (chain_after), so activations go from stage to stage
 * directly, never through the driver. */
static mpr_err_t chain_fn(mpr_call_ctx_t *call, const mpr_value_t *args, mpr_future_t **result) {
    (void)call;
    mpr_tensor_t *x = NULL;
    int64_t k, S;
    mpr_err_t e = mpr_args_unpack(args, "tll", &x, &k, &S);
    if (e) return e;
    if (k < 0 || k >= S)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "pipeline: stage %lld of %lld", (long long)k, (long long)S);
    pthread_mutex_lock(&held_lock);
    stage_t *st = held; /* outlives the call: the driver destroys it after its last call */
    pthread_mutex_unlock(&held_lock);
    if (!st) return mpr_error_set(MPR_ERR_NOT_FOUND, "pipeline: this rank holds no stage");
    if (k > 0) {
        char prev[32];
        pipeline_stage_worker((int)k - 1, prev, sizeof prev);
        chain_step_t *c = malloc(sizeof *c);
        if (!c) return mpr_error_set(MPR_ERR_NOMEM, "pipeline: out of memory");
        c->st = st;
        c->prev = mpr_call_async(mpr_to_name(prev), PIPELINE_CHAIN_FN, MPR_TIMEOUT_DEFAULT, "tll", x, k - 1, S);
        if (c->prev && (*result = mpr_future_then(c->prev, chain_after, c))) return MPR_OK; /* c is chain_after's */
        e = mpr_last_error_code();
        mpr_future_release(c->prev);
        free(c);
        return e;
    }
    return first_stage_enqueue(st, x, result);
}

/* [ctx id] -> [gradient per parameter] */
static mpr_err_t grads_fn(mpr_call_ctx_t *call, const mpr_value_t *args, mpr_value_t **result) {
    (void)call;
    int64_t ctx;
    mpr_err_t e = mpr_args_unpack(args, "l", &ctx);
    if (e) return e;
    stage_t *st = lock_held();
    if (!st) return mpr_last_error_code();
    mpr_value_t *list = mpr_value_new_list();
    if (!list) e = mpr_last_error_code();
    for (int i = 0; !e && i < st->n; i++) {
        mpr_tensor_t *g = NULL;
        if ((e = mpr_dist_get_gradient(ctx, st->params[i], &g))) break;
        if (!g && !(g = mpr_zeros_like(st->params[i]))) e = mpr_last_error_code();
        if (!e) e = mpr_value_list_append(list, mpr_value_new_tensor(g));
        mpr_tensor_release(g);
    }
    pthread_mutex_unlock(&st->lock);
    if (e) {
        mpr_value_release(list);
        return e;
    }
    *result = list;
    return MPR_OK;
}

/* [] -> bytes (.safetensors of "model.<group>.<name>") */
static mpr_err_t state_fn(mpr_call_ctx_t *call, const mpr_value_t *args, mpr_value_t **result) {
    (void)call, (void)args;
    mpr_tensor_dict_t *d = mpr_tensor_dict_create();
    if (!d) return mpr_last_error_code();
    stage_t *st = lock_held();
    if (!st) {
        mpr_tensor_dict_destroy(d);
        return mpr_last_error_code();
    }
    void *buf = NULL;
    size_t len = 0;
    mpr_err_t e = app_dict_add_tensors(d, "", st->n, (const char *const *)st->keys, st->params);
    if (!e) e = mpr_safetensors_encode(d, &buf, &len);
    pthread_mutex_unlock(&st->lock);
    mpr_tensor_dict_destroy(d);
    if (!e && !(*result = mpr_value_new_bytes(buf, len))) e = mpr_last_error_code();
    free(buf);
    return e;
}

/* [bytes of a checkpoint] -> none */
static mpr_err_t load_fn(mpr_call_ctx_t *call, const mpr_value_t *args, mpr_value_t **result) {
    (void)call, (void)result;
    const void *buf;
    size_t len;
    mpr_err_t e = mpr_args_unpack(args, "y", &buf, &len);
    if (e) return e;
    mpr_tensor_dict_t *d = mpr_safetensors_decode(buf, len, "checkpoint");
    if (!d) return mpr_last_error_code();
    stage_t *st = lock_held();
    if (st) {
        e = app_dict_copy_into_tensors(d, "", st->n, (const char *const *)st->keys, st->params);
        pthread_mutex_unlock(&st->lock);
    } else {
        e = mpr_last_error_code();
    }
    mpr_tensor_dict_destroy(d);
    return e;
}

/* This rank's stage, not locked (accumulate, memory: see the invariants). */
static stage_t *get_held(void) {
    pthread_mutex_lock(&held_lock);
    stage_t *st = held;
    pthread_mutex_unlock(&held_lock);
    if (!st) mpr_error_set(MPR_ERR_NOT_FOUND, "pipeline: this rank holds no stage");
    return st;
}

/* [ctx id of a micro-batch] -> none, inside the mini-batch's context */
static mpr_err_t accumulate_fn(mpr_call_ctx_t *call, const mpr_value_t *args, mpr_value_t **result) {
    (void)call, (void)result;
    int64_t from, into = mpr_dist_context_current();
    mpr_err_t e = mpr_args_unpack(args, "l", &from);
    if (e) return e;
    if (!into) return mpr_error_set(MPR_ERR_STATE, "pipeline.accumulate: not called inside a dist autograd context");
    if (from == into) return mpr_error_set(MPR_ERR_INVALID_ARG, "pipeline.accumulate: a context into itself");
    stage_t *st = get_held();
    if (!st) return mpr_last_error_code();
    sample_memory(st); /* after the micro-batch's backward, before its context ends */
    for (int i = 0; !e && i < st->n; i++) {
        mpr_tensor_t *g = NULL;
        if (!(e = mpr_dist_get_gradient(from, st->params[i], &g)) && g)
            e = mpr_dist_accumulate_gradient(into, st->params[i], g);
        mpr_tensor_release(g);
    }
    return e;
}

/* [] -> [peak bytes since the last call, bytes now] */
static mpr_err_t memory_fn(mpr_call_ctx_t *call, const mpr_value_t *args, mpr_value_t **result) {
    (void)call, (void)args;
    stage_t *st = get_held();
    if (!st) return mpr_last_error_code();
    long long now = (long long)mpr_autograd_saved_bytes(), peak = atomic_exchange(&st->peak, now);
    return mpr_return(result, "ll", (int64_t)(peak > now ? peak : now), (int64_t)now);
}

mpr_err_t pipeline_stage_register(void) {
    mpr_err_t e = mpr_register_module_kind(PIPELINE_STAGE_KIND, stage_ctor, NULL);
    if (!e) e = mpr_register_function(PIPELINE_PROFILE_FN, profile_fn, NULL);
    if (!e) e = mpr_register_function(PIPELINE_GRADS_FN, grads_fn, NULL);
    if (!e) e = mpr_register_async_function(PIPELINE_CHAIN_FN, chain_fn, NULL);
    if (!e) e = mpr_register_function(PIPELINE_STATE_FN, state_fn, NULL);
    if (!e) e = mpr_register_function(PIPELINE_LOAD_FN, load_fn, NULL);
    if (!e) e = mpr_register_function(PIPELINE_ACCUMULATE_FN, accumulate_fn, NULL);
    if (!e) e = mpr_register_function(PIPELINE_MEMORY_FN, memory_fn, NULL);
    return e;
}
