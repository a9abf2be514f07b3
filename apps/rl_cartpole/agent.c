/* agent.c — the Agent of agent.h: policy forward and action sampling for the
 * observers' calls, reward records, REINFORCE with Adam.
 *
 * Invariants: during an episode, observer k's record holds one kept
 * log-probability tensor (shape [1], with its graph) per select_action and
 * one reward per report_reward; agent_finish_episode consumes and releases
 * them all (and agent_begin_episode drops leftovers of a failed episode), so
 * no graph outlives its episode. Handlers never hold the agent's lock while
 * running the policy. */
#include "agent.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"

typedef struct ob_record {
    mpr_generator_t *gen;    /* dropout masks and action draws of this observer's steps */
    mpr_tensor_t **log_probs; /* owned references, [1] each */
    double *rewards;
    int n_log_probs, n_rewards, cap_log_probs, cap_rewards;
} ob_record_t;

struct agent {
    agent_config_t cfg;
    mpr_module_t *policy; /* "Policy": children affine1, affine2 */
    mpr_tensor_t *w1, *b1, *w2, *b2; /* borrowed from policy */
    mpr_optimizer_t *opt;
    ob_record_t *obs; /* [n_observers], observer id k at k - 1 */
    double running_reward;
    pthread_mutex_t lock; /* the records' arrays */
};

static const mpr_type_t *agent_type;

static mpr_tensor_t *policy_probs(agent_t *a, mpr_tensor_t *x, mpr_generator_t *gen) {
    mpr_tensor_t *h = mpr_linear(x, a->w1, a->b1);
    h = mpr_relu(mpr_dropout(h, a->cfg.dropout, mpr_module_is_training(a->policy), gen));
    return mpr_softmax(mpr_linear(h, a->w2, a->b2), 1);
}

/* The module's own forward (used by nothing here but kept truthful): default generator. */
static mpr_tensor_t *policy_forward(mpr_module_t *self, mpr_tensor_t *x, void *ctx) {
    (void)self;
    return policy_probs(ctx, x, NULL);
}

agent_t *agent_create(const agent_config_t *cfg) {
    agent_t *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->cfg = *cfg;
    pthread_mutex_init(&a->lock, NULL);
    a->obs = calloc((size_t)cfg->n_observers, sizeof *a->obs);
    mpr_generator_t *init = mpr_generator_create(cfg->seed);
    a->policy = mpr_module_create("Policy", policy_forward, a, NULL);
    if (!a->obs || !init || !a->policy) goto fail;
    if (mpr_module_add_child(a->policy, "affine1", mpr_linear_create(4, 128, true, MPR_F32, init)) ||
        mpr_module_add_child(a->policy, "affine2", mpr_linear_create(128, 2, true, MPR_F32, init)))
        goto fail;
    a->w1 = mpr_module_get_parameter(a->policy, "affine1.weight");
    a->b1 = mpr_module_get_parameter(a->policy, "affine1.bias");
    a->w2 = mpr_module_get_parameter(a->policy, "affine2.weight");
    a->b2 = mpr_module_get_parameter(a->policy, "affine2.bias");
    mpr_tensor_t *params[4] = {a->w1, a->b1, a->w2, a->b2};
    mpr_optim_options_t o;
    mpr_optim_options_default("adam", &o);
    o.lr = cfg->lr;
    if (!(a->opt = mpr_optimizer_create("adam", params, 4, &o))) goto fail;
    for (int k = 0; k < cfg->n_observers; k++)
        if (!(a->obs[k].gen = mpr_generator_create(0))) goto fail;
    mpr_generator_destroy(init);
    return a;
fail:
    mpr_generator_destroy(init);
    agent_destroy(a);
    return NULL;
}

static void clear_record(ob_record_t *r) {
    for (int i = 0; i < r->n_log_probs; i++) mpr_tensor_release(r->log_probs[i]);
    r->n_log_probs = r->n_rewards = 0;
}

void agent_destroy(agent_t *a) {
    if (!a) return;
    for (int k = 0; a->obs && k < a->cfg.n_observers; k++) {
        clear_record(&a->obs[k]);
        free(a->obs[k].log_probs);
        free(a->obs[k].rewards);
        mpr_generator_destroy(a->obs[k].gen);
    }
    free(a->obs);
    mpr_optimizer_destroy(a->opt);
    mpr_module_destroy(a->policy);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

static void agent_value_free(void *obj) { agent_destroy(obj); }

mpr_value_t *agent_value(agent_t *a) { return mpr_value_new_object(agent_type, a); }

double agent_running_reward(const agent_t *a) { return a->running_reward; }

void agent_begin_episode(agent_t *a, int64_t episode) {
    pthread_mutex_lock(&a->lock);
    for (int k = 0; k < a->cfg.n_observers; k++) {
        clear_record(&a->obs[k]);
        mpr_generator_seed(a->obs[k].gen, app_epoch_seed(a->cfg.seed, episode, k + 1));
    }
    pthread_mutex_unlock(&a->lock);
}

/* The observer's record, or NULL with an error for a bad id. */
static ob_record_t *record_of(agent_t *a, int64_t ob_id) {
    if (ob_id < 1 || ob_id > a->cfg.n_observers) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "agent: unknown observer id %lld (expected 1..%d)", (long long)ob_id,
                      a->cfg.n_observers);
        return NULL;
    }
    return &a->obs[ob_id - 1];
}

static bool grow(void **arr, int *cap, int need, size_t elem) {
    if (need <= *cap) return true;
    int nc = *cap ? *cap * 2 : 64;
    while (nc < need) nc *= 2;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p) return false;
    *arr = p, *cap = nc;
    return true;
}

/* [agent, ob_id, state f32[4]] -> action: sample from the policy's
 * probabilities (Categorical by inverse CDF) and keep log(prob[action]). */
static mpr_err_t fn_select_action(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    agent_t *a;
    int64_t ob_id;
    mpr_tensor_t *state;
    mpr_err_t e = mpr_rref_self(args, agent_type, (void **)&a);
    if (!e) e = mpr_args_int(args, 1, &ob_id);
    if (!e) e = mpr_args_tensor(args, 2, &state);
    if (e) return e;
    ob_record_t *r = record_of(a, ob_id);
    if (!r) return mpr_last_error_code();
    if (mpr_tensor_numel(state) != 4 || mpr_tensor_dtype(state) != MPR_F32)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "agent: a state is 4 float32 numbers");
    mpr_scope_begin();
    mpr_tensor_t *probs = policy_probs(a, mpr_reshape(state, MPR_SHAPE(1, 4)), r->gen);
    float p[2];
    int action = 0;
    e = probs ? mpr_copy_to_buffer(probs, MPR_F32, p, sizeof p) : mpr_last_error_code();
    if (!e) {
        action = mpr_generator_next_double(r->gen) < (double)p[0] ? 0 : 1;
        mpr_tensor_t *lp = mpr_reshape(mpr_log(mpr_select(mpr_select(probs, 0, 0), 0, action)), MPR_SHAPE(1));
        if (!lp) e = mpr_last_error_code();
        else {
            pthread_mutex_lock(&a->lock);
            if (grow((void **)&r->log_probs, &r->cap_log_probs, r->n_log_probs + 1, sizeof *r->log_probs))
                r->log_probs[r->n_log_probs++] = mpr_scope_keep(lp);
            else
                e = mpr_error_set(MPR_ERR_NOMEM, "agent: out of memory");
            pthread_mutex_unlock(&a->lock);
        }
    }
    mpr_scope_end();
    return e ? e : mpr_return(result, "l", (int64_t)action);
}

/* [agent, ob_id, reward] */
static mpr_err_t fn_report_reward(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx, (void)result;
    agent_t *a;
    int64_t ob_id;
    double reward;
    mpr_err_t e = mpr_rref_self(args, agent_type, (void **)&a);
    if (!e) e = mpr_args_int(args, 1, &ob_id);
    if (!e) e = mpr_args_double(args, 2, &reward);
    if (e) return e;
    ob_record_t *r = record_of(a, ob_id);
    if (!r) return mpr_last_error_code();
    pthread_mutex_lock(&a->lock);
    if (grow((void **)&r->rewards, &r->cap_rewards, r->n_rewards + 1, sizeof *r->rewards))
        r->rewards[r->n_rewards++] = reward;
    else
        e = mpr_error_set(MPR_ERR_NOMEM, "agent: out of memory");
    pthread_mutex_unlock(&a->lock);
    return e;
}

mpr_err_t agent_register_functions(void) {
    mpr_err_t e = mpr_register_type("rl.Agent", agent_value_free, &agent_type);
    if (!e) e = mpr_register_function(AGENT_FN_SELECT_ACTION, fn_select_action, NULL);
    if (!e) e = mpr_register_function(AGENT_FN_REPORT_REWARD, fn_report_reward, NULL);
    return e;
}

mpr_err_t agent_finish_episode(agent_t *a, episode_result_t *out) {
    int n = 0, nk = a->cfg.n_observers;
    double min_reward = INFINITY, sum_reward = 0;
    for (int k = 0; k < nk; k++) {
        ob_record_t *r = &a->obs[k];
        if (r->n_log_probs != r->n_rewards || r->n_rewards == 0)
            return mpr_error_set(MPR_ERR_STATE, "agent: observer %d recorded %d actions and %d rewards", k + 1,
                                 r->n_log_probs, r->n_rewards);
        double total = 0;
        for (int i = 0; i < r->n_rewards; i++) total += r->rewards[i];
        min_reward = fmin(min_reward, total);
        sum_reward += total;
        n += r->n_rewards;
    }
    a->running_reward = 0.05 * min_reward + (1 - 0.05) * a->running_reward;
    /* discounted returns, per observer (each observer's episode is its own
     * trajectory), then normalized over all steps */
    float *ret = malloc((size_t)n * sizeof *ret);
    mpr_tensor_t **lps = malloc((size_t)n * sizeof *lps);
    if (!ret || !lps) {
        free(ret), free(lps);
        return mpr_error_set(MPR_ERR_NOMEM, "agent: out of memory");
    }
    double sum = 0, sq = 0;
    for (int k = 0, at = 0; k < nk; k++) {
        ob_record_t *r = &a->obs[k];
        double R = 0;
        for (int i = r->n_rewards - 1; i >= 0; i--) {
            R = r->rewards[i] + a->cfg.gamma * R;
            ret[at + i] = (float)R;
            sum += R;
        }
        memcpy(lps + at, r->log_probs, (size_t)r->n_log_probs * sizeof *lps);
        at += r->n_rewards;
    }
    double mean = sum / n;
    for (int i = 0; i < n; i++) sq += ((double)ret[i] - mean) * ((double)ret[i] - mean);
    double std = n > 1 ? sqrt(sq / (n - 1)) : 0; /* torch.std: unbiased */
    const double eps = 1.1920928955078125e-07;     /* np.finfo(np.float32).eps */
    for (int i = 0; i < n; i++) ret[i] = (float)(-((double)ret[i] - mean) / (std + eps)); /* negated: loss */
    mpr_err_t e = MPR_OK;
    mpr_scope_begin();
    mpr_tensor_t *neg_returns = mpr_from_buffer(MPR_F32, MPR_SHAPE(n), ret);
    mpr_tensor_t *loss = mpr_sum(mpr_mul(mpr_cat(lps, n, 0), neg_returns));
    double loss_value = NAN;
    mpr_optimizer_zero_grad(a->opt);
    if (!loss) e = mpr_last_error_code();
    if (!e) e = mpr_item(loss, &loss_value);
    if (!e) e = mpr_backward(loss, NULL, false);
    if (!e) e = mpr_optimizer_step(a->opt);
    mpr_scope_end();
    free(ret);
    free(lps);
    for (int k = 0; k < nk; k++) clear_record(&a->obs[k]);
    if (e) return e;
    out->min_reward = min_reward;
    out->mean_reward = sum_reward / nk;
    out->running_reward = a->running_reward;
    out->policy_loss = loss_value;
    out->env_steps = n;
    return MPR_OK;
}

mpr_err_t agent_export(const agent_t *a, mpr_tensor_dict_t *d) {
    char buf[64];
    mpr_err_t e = app_dict_add_module(d, "model.", a->policy);
    if (!e) e = mpr_optimizer_state_export(a->opt, d, "optim.");
    snprintf(buf, sizeof buf, "%.17g", a->running_reward);
    if (!e) e = mpr_tensor_dict_set_meta(d, "rl.running_reward", buf);
    return e;
}

mpr_err_t agent_import(agent_t *a, const mpr_tensor_dict_t *d) {
    const char *rr = mpr_tensor_dict_get_meta(d, "rl.running_reward");
    if (!rr) return mpr_error_set(MPR_ERR_DECODE, "checkpoint: no rl.running_reward: not an rl_cartpole checkpoint");
    mpr_err_t e = app_dict_copy_into_module(d, "model.", a->policy);
    if (!e) e = mpr_optimizer_state_import(a->opt, d, "optim.");
    if (!e) a->running_reward = strtod(rr, NULL);
    return e;
}
