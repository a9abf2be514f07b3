/* cartpole.h — OpenAI Gym's CartPole-v1 environment in C, with the same
 * physics, termination and time limit as gym/envs/classic_control/cartpole.py
 * (gym 0.26) wrapped in TimeLimit(max_episode_steps=500).
 *
 * Physics (Euler integration, tau = 0.02 s): gravity 9.8, cart mass 1.0,
 * pole mass 0.1, pole half-length 0.5, force +-10 N (action 1 pushes right,
 * 0 left). The state (x, x_dot, theta, theta_dot) is kept in double precision
 * as gym keeps it (its observation is that state rounded to float32).
 * An episode terminates when |theta| > 12 degrees or |x| > 2.4 and is
 * truncated after 500 steps; every step, the terminating one included, gives
 * reward 1. reset() draws each state component uniformly from [-0.05, 0.05)
 * with the environment's own seeded generator, so a seed fixes every episode.
 *
 * Invariants: a step after the episode ended (terminated or truncated) is a
 * caller error (CARTPOLE_ERR_DONE, state unchanged); an action other than 0 or
 * 1 is rejected (CARTPOLE_ERR_ACTION). Not thread-safe: one owner per env.
 * Ownership: cartpole_create returns an env the caller frees with
 * cartpole_destroy (NULL is a no-op). */
#ifndef CARTPOLE_H
#define CARTPOLE_H

#include <stdbool.h>
#include <stdint.h>

#define CARTPOLE_MAX_STEPS 500
#define CARTPOLE_REWARD_THRESHOLD 475.0 /* gym's spec.reward_threshold for v1 */
#define CARTPOLE_THETA_THRESHOLD (12.0 * 2.0 * 3.14159265358979323846 / 360.0)
#define CARTPOLE_X_THRESHOLD 2.4

typedef struct cartpole cartpole_t;

typedef enum { CARTPOLE_OK = 0, CARTPOLE_ERR_ACTION = 1, CARTPOLE_ERR_DONE = 2 } cartpole_status_t;

/* A new environment whose resets draw from a generator seeded with `seed`.
 * NULL when out of memory. Call cartpole_reset before the first step. */
cartpole_t *cartpole_create(uint64_t seed);
void cartpole_destroy(cartpole_t *env);
/* Reseed the reset generator (e.g. per episode, so that a resumed run draws
 * the same starts as one that never stopped). */
void cartpole_seed(cartpole_t *env, uint64_t seed);

/* Start an episode: new random state in [-0.05, 0.05)^4, step count 0.
 * Writes the state to state[4] (may be NULL). */
void cartpole_reset(cartpole_t *env, double state[4]);
/* Start an episode from a given state (tests replaying a trace). */
void cartpole_set_state(cartpole_t *env, const double state[4]);

/* Apply action (0: push left, 1: push right). On CARTPOLE_OK the new state
 * goes to state[4] (may be NULL), *reward is 1, *terminated says the pole fell
 * or the cart left the track, *truncated that the 500-step limit was reached
 * (any out pointer may be NULL). */
cartpole_status_t cartpole_step(cartpole_t *env, int action, double state[4], double *reward,
                                bool *terminated, bool *truncated);

/* The current state (copy) and the steps taken in this episode. */
void cartpole_state(const cartpole_t *env, double state[4]);
int cartpole_steps(const cartpole_t *env);

#endif
