/* observer.h — the RPC tutorial's Observer: owns a CartPole-v1 environment on
 * its rank and, when the agent asks, runs one episode, asking the agent for
 * every action and reporting every reward through the agent's RRef.
 *
 * Functions (registered on every rank by observer_register_functions):
 *   OBSERVER_FN_NEW(seed) -> an Observer object (use with mpr_remote: the
 *       caller gets an RRef, the observer's rank owns it); its id is its rank.
 *   OBSERVER_FN_RUN_EPISODE(observer, agent_rref, episode, max_steps) ->
 *       the episode's reward (a proxy call: mpr_rref_rpc_async on the
 *       observer's RRef). The environment is reseeded per (seed, episode), so
 *       an episode's start does not depend on earlier episodes.
 * Ownership: the Observer object value owns the environment; it is freed
 * when the last RRef to it goes. */
#ifndef RL_OBSERVER_H
#define RL_OBSERVER_H

#include <mpirpc/mpirpc.h>

#define OBSERVER_FN_NEW "rl.observer.new"
#define OBSERVER_FN_RUN_EPISODE "rl.observer.run_episode"

mpr_err_t observer_register_functions(void);

#endif
