/* observer.c — the Observer of observer.h. Each step costs two synchronous
 * RPCs to the agent (select_action, report_reward), as in the tutorial.
 *
 * Invariant: an episode reports exactly one reward per action it received,
 * and stops at the environment's end (terminated or truncated) or after
 * max_steps. */
#include "observer.h"

#include <stdlib.h>

#include "agent.h"
#include "app.h"
#include "cartpole.h"

typedef struct observer {
    int id;
    uint64_t seed;
    cartpole_t *env;
} observer_t;

static const mpr_type_t *observer_type;

static void observer_free(void *obj) {
    observer_t *o = obj;
    cartpole_destroy(o->env);
    free(o);
}

/* [seed] -> Observer object */
static mpr_err_t fn_new(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    int64_t seed;
    mpr_err_t e = mpr_args_int(args, 0, &seed);
    if (e) return e;
    mpr_worker_info_t self;
    if ((e = mpr_get_self_worker_info(&self))) return e;
    observer_t *o = calloc(1, sizeof *o);
    if (o) o->env = cartpole_create((uint64_t)seed);
    if (!o || !o->env) {
        free(o);
        return mpr_error_set(MPR_ERR_NOMEM, "observer: out of memory");
    }
    o->id = self.rank;
    o->seed = (uint64_t)seed;
    *result = mpr_value_new_object(observer_type, o);
    return *result ? MPR_OK : (observer_free(o), mpr_last_error_code());
}

/* agent.fn(args...) through the agent's RRef; takes `args`; *result (may be
 * NULL: not wanted) a new reference. */
static mpr_err_t call_agent(mpr_rref_t *agent, const char *fn, mpr_value_t *args, mpr_value_t **result) {
    mpr_value_t *r = NULL;
    mpr_err_t e = args ? mpr_rref_rpc_sync(agent, fn, args, MPR_TIMEOUT_DEFAULT, &r) : mpr_last_error_code();
    mpr_value_release(args);
    if (result) *result = r;
    else mpr_value_release(r);
    return e;
}

/* [observer, agent_rref, episode, max_steps] -> episode reward */
static mpr_err_t fn_run_episode(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    observer_t *o;
    mpr_rref_t *agent;
    int64_t episode, max_steps;
    mpr_err_t e = mpr_rref_self(args, observer_type, (void **)&o);
    if (!e) e = mpr_args_rref(args, 1, &agent);
    if (!e) e = mpr_args_int(args, 2, &episode);
    if (!e) e = mpr_args_int(args, 3, &max_steps);
    if (e) return e;
    /* part ids 1000+ keep the env's stream apart from the agent's (1..N) */
    cartpole_seed(o->env, app_epoch_seed(o->seed, episode, 1000 + o->id));
    double s[4], total = 0;
    cartpole_reset(o->env, s);
    for (int64_t step = 0; step < max_steps; step++) {
        float sf[4] = {(float)s[0], (float)s[1], (float)s[2], (float)s[3]}; /* gym's float32 observation */
        mpr_tensor_t *state = mpr_from_buffer(MPR_F32, MPR_SHAPE(4), sf);
        mpr_value_t *r = NULL;
        e = call_agent(agent, AGENT_FN_SELECT_ACTION,
                       mpr_value_list_of(2, mpr_value_new_int(o->id), mpr_value_new_tensor(state)), &r);
        mpr_tensor_release(state);
        int64_t action = 0;
        if (!e) e = mpr_value_get_int(r, &action);
        mpr_value_release(r);
        if (e) return e;
        double reward;
        bool term, trunc;
        if (cartpole_step(o->env, (int)action, s, &reward, &term, &trunc) != CARTPOLE_OK)
            return mpr_error_set(MPR_ERR_INVALID_ARG, "observer %d: the agent chose action %lld", o->id,
                                 (long long)action);
        total += reward;
        e = call_agent(agent, AGENT_FN_REPORT_REWARD,
                       mpr_value_list_of(2, mpr_value_new_int(o->id), mpr_value_new_double(reward)), NULL);
        if (e) return e;
        if (term || trunc) break;
    }
    return mpr_return(result, "d", total);
}

mpr_err_t observer_register_functions(void) {
    mpr_err_t e = mpr_register_type("rl.Observer", observer_free, &observer_type);
    if (!e) e = mpr_register_function(OBSERVER_FN_NEW, fn_new, NULL);
    if (!e) e = mpr_register_function(OBSERVER_FN_RUN_EPISODE, fn_run_episode, NULL);
    return e;
}
