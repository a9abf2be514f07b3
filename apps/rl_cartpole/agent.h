/* agent.h — the RPC tutorial's Agent (rank 0): the policy network, Adam, the
 * log-probabilities and rewards recorded per observer during an episode, and
 * REINFORCE at its end.
 *
 * Policy (the tutorial's): Linear(4,128) -> Dropout(0.6) -> ReLU ->
 * Linear(128,2) -> softmax, float32, parameters named as PyTorch's
 * ("affine1.weight", ...). Observers reach the agent through its RRef with
 * two proxy functions (registered by agent_register_functions on every rank):
 *   AGENT_FN_SELECT_ACTION(agent, ob_id, state f32[4]) -> action (int 0/1)
 *   AGENT_FN_REPORT_REWARD(agent, ob_id, reward)
 * Observers run concurrently, so both may run at the same time on several
 * pool threads. Each observer's record and its sampling generator are
 * touched only by that observer's calls (which come one at a time), the
 * arrays are guarded by the agent's lock, and forward passes on the shared
 * parameters run concurrently (autograd allows it). An episode's randomness
 * (dropout masks and action draws per observer) comes from generators seeded
 * per (seed, episode, observer), so a run is reproducible whatever the
 * interleaving and a resumed run continues exactly.
 *
 * Ownership: agent_create returns an agent owned by the caller until it is
 * wrapped in an object value (agent_value), which then owns it and runs
 * agent_destroy when its last reference goes. */
#ifndef RL_AGENT_H
#define RL_AGENT_H

#include <stdint.h>

#include <mpirpc/mpirpc.h>

#define AGENT_FN_SELECT_ACTION "rl.agent.select_action"
#define AGENT_FN_REPORT_REWARD "rl.agent.report_reward"

typedef struct agent agent_t;

typedef struct agent_config {
    int n_observers;   /* observer ids are 1..n_observers (their ranks) */
    double gamma;      /* discount (0.99) */
    double lr;         /* Adam's learning rate (1e-2) */
    double dropout;    /* the policy's dropout (0.6) */
    uint64_t seed;     /* policy initialization and every episode's draws */
} agent_config_t;

/* Registers the agent's type and proxy functions (every rank, before mpr_init). */
mpr_err_t agent_register_functions(void);

agent_t *agent_create(const agent_config_t *cfg);
void agent_destroy(agent_t *a);
/* A new object value owning `a` (for mpr_rref_create_local). */
mpr_value_t *agent_value(agent_t *a);

/* Prepare episode `episode` (1-based): clears the records and seeds the
 * per-observer generators. Call before asking the observers to run it. */
void agent_begin_episode(agent_t *a, int64_t episode);

typedef struct episode_result {
    double min_reward;     /* the smallest observer's episode reward (the tutorial's "last reward") */
    double mean_reward;    /* mean over observers */
    double running_reward; /* 0.05 * min_reward + 0.95 * previous */
    double policy_loss;    /* sum of -log_prob * normalized return */
    int64_t env_steps;     /* steps of all observers in this episode */
} episode_result_t;

/* REINFORCE on the recorded episode: discounted returns per observer,
 * normalized over all steps, loss = sum(-log_prob * return), one Adam step.
 * MPR_ERR_STATE if an observer's log-probabilities and rewards differ in number
 * or none were recorded. */
mpr_err_t agent_finish_episode(agent_t *a, episode_result_t *out);

double agent_running_reward(const agent_t *a);

/* Checkpoint support: policy parameters ("model.*"), Adam's state ("optim.*")
 * and the running reward (metadata "rl.running_reward") into / from d. */
mpr_err_t agent_export(const agent_t *a, mpr_tensor_dict_t *d);
mpr_err_t agent_import(agent_t *a, const mpr_tensor_dict_t *d);

#endif
