/* cartpole.c — CartPole-v1 (see cartpole.h): gym 0.26's CartPoleEnv.step
 * equations, operation by operation in double precision, plus the 500-step
 * TimeLimit. The reset generator is mpirpc's seeded xoshiro256** stream. */
#include "cartpole.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <mpirpc/tensor_ops.h>

#define GRAVITY 9.8
#define MASSCART 1.0
#define MASSPOLE 0.1
#define TOTAL_MASS (MASSPOLE + MASSCART)
#define LENGTH 0.5 /* half the pole's length */
#define POLEMASS_LENGTH (MASSPOLE * LENGTH)
#define FORCE_MAG 10.0
#define TAU 0.02

struct cartpole {
    double s[4]; /* x, x_dot, theta, theta_dot */
    int steps;
    bool done;
    mpr_generator_t *gen;
};

cartpole_t *cartpole_create(uint64_t seed) {
    cartpole_t *env = calloc(1, sizeof *env);
    if (!env) return NULL;
    env->gen = mpr_generator_create(seed);
    if (!env->gen) {
        free(env);
        return NULL;
    }
    env->done = true; /* reset first */
    return env;
}

void cartpole_destroy(cartpole_t *env) {
    if (!env) return;
    mpr_generator_destroy(env->gen);
    free(env);
}

void cartpole_seed(cartpole_t *env, uint64_t seed) { mpr_generator_seed(env->gen, seed); }

void cartpole_set_state(cartpole_t *env, const double state[4]) {
    memcpy(env->s, state, sizeof env->s);
    env->steps = 0;
    env->done = false;
}

void cartpole_reset(cartpole_t *env, double state[4]) {
    double s[4];
    for (int i = 0; i < 4; i++) s[i] = -0.05 + 0.1 * mpr_generator_next_double(env->gen);
    cartpole_set_state(env, s);
    if (state) memcpy(state, env->s, sizeof env->s);
}

cartpole_status_t cartpole_step(cartpole_t *env, int action, double state[4], double *reward,
                                bool *terminated, bool *truncated) {
    if (action != 0 && action != 1) return CARTPOLE_ERR_ACTION;
    if (env->done) return CARTPOLE_ERR_DONE;
    double x = env->s[0], x_dot = env->s[1], theta = env->s[2], theta_dot = env->s[3];
    double force = action == 1 ? FORCE_MAG : -FORCE_MAG;
    double costheta = cos(theta), sintheta = sin(theta);
    double temp = (force + POLEMASS_LENGTH * (theta_dot * theta_dot) * sintheta) / TOTAL_MASS;
    double thetaacc = (GRAVITY * sintheta - costheta * temp) /
                      (LENGTH * (4.0 / 3.0 - MASSPOLE * (costheta * costheta) / TOTAL_MASS));
    double xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS;
    x = x + TAU * x_dot;
    x_dot = x_dot + TAU * xacc;
    theta = theta + TAU * theta_dot;
    theta_dot = theta_dot + TAU * thetaacc;
    env->s[0] = x, env->s[1] = x_dot, env->s[2] = theta, env->s[3] = theta_dot;
    env->steps++;
    bool term = x < -CARTPOLE_X_THRESHOLD || x > CARTPOLE_X_THRESHOLD || theta < -CARTPOLE_THETA_THRESHOLD ||
                theta > CARTPOLE_THETA_THRESHOLD;
    bool trunc = env->steps >= CARTPOLE_MAX_STEPS; /* TimeLimit: independent of term */
    env->done = term || trunc;
    if (state) memcpy(state, env->s, sizeof env->s);
    if (reward) *reward = 1.0;
    if (terminated) *terminated = term;
    if (truncated) *truncated = trunc;
    return CARTPOLE_OK;
}

void cartpole_state(const cartpole_t *env, double state[4]) { memcpy(state, env->s, sizeof env->s); }

int cartpole_steps(const cartpole_t *env) { return env->steps; }
