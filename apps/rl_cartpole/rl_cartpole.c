/* rl_cartpole.c — the RPC tutorial's distributed reinforcement learning
 * example as an MPI program: one agent (rank 0) and N-1 observers, RRefs both
 * ways, REINFORCE with Adam on CartPole-v1.
 *
 *   mpirun -np 3 build/apps/rl_cartpole/rl_cartpole --seed 1 --metrics rl.csv
 *
 * The agent creates an Observer on every other rank with mpr_remote (it keeps
 * their RRefs) and an RRef to itself; each episode it asks every observer at
 * once to run one (mpr_rref_rpc_async on the observer's RRef, passing the
 * agent's RRef); each observer steps its own environment and asks the agent
 * for every action and reports every reward through the agent's RRef
 * (mpr_rref_rpc_sync). At the end of the episode the agent trains its policy
 * (agent.h), updates the running reward 0.05 * min_reward + 0.95 * running
 * and stops with "Solved!" once it exceeds the threshold (475, CartPole-v1's).
 *
 * Exit status: 0 the run ended (solved, or not within --max-episodes: the
 * summary says which), 1 a runtime failure (printed), 2 bad options or fewer
 * than 2 ranks. The last line on stdout is a JSON summary (observers, seed,
 * episodes, solved, running reward, wall time). */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpirpc/mpirpc.h>

#include "agent.h"
#include "app.h"
#include "cartpole.h"
#include "observer.h"

#define MAX_STEPS_PER_EPISODE 10000 /* the tutorial's loop bound; the env truncates at 500 */

typedef struct run_config {
    int64_t max_episodes, log_every;
    double threshold;
    agent_config_t agent;
    app_common_t common;
} run_config_t;

static int fail(const char *what) {
    fprintf(stderr, "rl_cartpole: %s: %s: %s\n", what, mpr_error_name(mpr_last_error_code()), mpr_last_error());
    return 1;
}

static mpr_err_t save_checkpoint(const run_config_t *rc, agent_t *agent, int64_t episode, double wall_s) {
    mpr_tensor_dict_t *d = mpr_tensor_dict_create();
    if (!d) return mpr_last_error_code();
    app_ckpt_state_t st = {.step = episode, .epoch = 0, .step_in_epoch = 0, .wall_s = wall_s,
                           .seed = rc->agent.seed};
    mpr_err_t e = agent_export(agent, d);
    if (!e) e = app_ckpt_save(rc->common.checkpoint_dir, d, &st, 2);
    mpr_tensor_dict_destroy(d);
    return e;
}

/* Resume: load the newest checkpoint into the agent; *episode and *wall_s
 * continue from it. No checkpoint yet: a fresh start (said on stderr). */
static mpr_err_t load_checkpoint(const run_config_t *rc, agent_t *agent, int64_t *episode, double *wall_s) {
    mpr_tensor_dict_t *d = NULL;
    app_ckpt_state_t st;
    char *path = NULL;
    mpr_err_t e = app_ckpt_load_latest(rc->common.checkpoint_dir, &d, &st, &path);
    if (e == MPR_ERR_NOT_FOUND) {
        fprintf(stderr, "rl_cartpole: --resume: no checkpoint in '%s' yet: starting from episode 1\n",
                rc->common.checkpoint_dir);
        return MPR_OK;
    }
    if (!e && st.seed != rc->agent.seed)
        e = mpr_error_set(MPR_ERR_INVALID_ARG, "--resume: '%s' was written with --seed %llu, not %llu", path,
                          (unsigned long long)st.seed, (unsigned long long)rc->agent.seed);
    if (!e) e = agent_import(agent, d);
    if (!e) {
        *episode = st.step, *wall_s = st.wall_s;
        printf("Resumed from %s: episode %lld, running reward %.2f\n", path, (long long)st.step,
               agent_running_reward(agent));
    }
    mpr_tensor_dict_destroy(d);
    free(path);
    return e;
}

/* Every observer runs episode `ep` at once; waits for all of them. The
 * episode call has no time limit (up to 1000 calls to the agent each, which
 * on a loaded machine can outlast the default RPC timeout); each of those
 * calls keeps the default one, so a dead agent or observer still surfaces. */
static mpr_err_t run_episode(mpr_rref_t *agent_rref, mpr_rref_t **obs, int n_obs, int64_t ep) {
    mpr_future_t **futs = calloc((size_t)n_obs, sizeof *futs);
    if (!futs) return mpr_error_set(MPR_ERR_NOMEM, "out of memory");
    mpr_value_t *args = mpr_value_list_of(3, mpr_value_new_rref(agent_rref), mpr_value_new_int(ep),
                                          mpr_value_new_int(MAX_STEPS_PER_EPISODE));
    mpr_err_t e = args ? MPR_OK : mpr_last_error_code();
    for (int i = 0; !e && i < n_obs; i++)
        if (!(futs[i] = mpr_rref_rpc_async(obs[i], OBSERVER_FN_RUN_EPISODE, args, 0)))
            e = mpr_last_error_code();
    for (int i = 0; i < n_obs; i++) { /* wait for every started call, even after a failure */
        if (!futs[i]) continue;
        mpr_err_t fe = mpr_future_wait(futs[i], MPR_WAIT_FOREVER);
        if (!fe) fe = mpr_future_error(futs[i]);
        if (fe && !e) e = mpr_error_set(fe, "observer %d: %s", i + 1, mpr_future_error_message(futs[i]));
        mpr_future_release(futs[i]);
    }
    mpr_value_release(args);
    free(futs);
    return e;
}

static int run_agent(const run_config_t *rc, int world) {
    int n_obs = world - 1;
    agent_config_t ac = rc->agent;
    ac.n_observers = n_obs;
    agent_t *agent = agent_create(&ac);
    if (!agent) return fail("creating the agent");
    int64_t done_episodes = 0;
    double wall_before = 0;
    if (rc->common.resume && load_checkpoint(rc, agent, &done_episodes, &wall_before)) {
        agent_destroy(agent);
        return fail("resuming");
    }
    mpr_value_t *av = agent_value(agent); /* owns the agent from here on */
    if (!av) {
        agent_destroy(agent);
        return fail("agent value");
    }
    mpr_rref_t *agent_rref = mpr_rref_create_local(av);
    mpr_value_release(av);
    mpr_rref_t **obs = calloc((size_t)n_obs, sizeof *obs);
    mpr_value_t *seed_args = mpr_value_list_of(1, mpr_value_new_int((int64_t)rc->agent.seed));
    for (int i = 0; obs && agent_rref && seed_args && i < n_obs; i++)
        obs[i] = mpr_remote(mpr_to_rank(i + 1), OBSERVER_FN_NEW, seed_args, MPR_TIMEOUT_DEFAULT);
    mpr_value_release(seed_args);

    static const char *extra[] = {"last_reward", "running_reward", "mean_reward", "env_steps"};
    app_metrics_t *csv = NULL;
    if (rc->common.metrics_path &&
        !(csv = app_metrics_open(rc->common.metrics_path, extra, 4, rc->common.resume ? done_episodes : -1)))
        fail("metrics");
    app_progress_t *bar = app_progress_create(&(app_progress_config_t){
        .out = stdout, .total_steps = rc->max_episodes, .first_step = done_episodes,
        .interval_s = rc->common.log_interval, .unit = "env steps"});
    printf("This will run until reward threshold of %.1f is reached (%d observer%s, seed %lld).\n", rc->threshold,
           n_obs, n_obs == 1 ? "" : "s", (long long)rc->agent.seed);
    int status = 0;
    bool solved = false;
    double t0 = app_now();
    int64_t ep = done_episodes;
    for (ep = done_episodes + 1; ep <= rc->max_episodes; ep++) {
        episode_result_t res;
        double te = app_now();
        agent_begin_episode(agent, ep);
        mpr_err_t e = run_episode(agent_rref, obs, n_obs, ep);
        if (!e) e = agent_finish_episode(agent, &res);
        if (e) {
            status = fail("episode");
            break;
        }
        double wall = wall_before + (app_now() - t0), dt = app_now() - te;
        app_progress_update(bar, ep, 1, res.env_steps, res.policy_loss);
        if (ep % rc->log_every == 0)
            app_progress_print(bar, "Episode %lld\tLast reward: %.2f\tAverage reward: %.2f", (long long)ep,
                               res.min_reward, res.running_reward);
        double row[4] = {res.min_reward, res.running_reward, res.mean_reward, (double)res.env_steps};
        if (csv && app_metrics_write(csv, ep, 1, wall, res.policy_loss, res.env_steps / dt, NAN, row))
            fail("metrics");
        if (rc->common.checkpoint_dir && rc->common.checkpoint_every > 0 && ep % rc->common.checkpoint_every == 0 &&
            save_checkpoint(rc, agent, ep, wall))
            fail("checkpoint");
        if (res.running_reward > rc->threshold) {
            app_progress_print(bar, "Solved! Running reward is now %.6f!", res.running_reward);
            solved = true;
            break;
        }
    }
    int64_t episodes = solved ? ep : ep - 1; /* completed episodes */
    double wall = wall_before + (app_now() - t0);
    app_progress_finish(bar);
    app_progress_destroy(bar);
    if (!solved && !status)
        printf("Not solved within %lld episodes (running reward %.2f)\n", (long long)rc->max_episodes,
               agent_running_reward(agent));
    if (!status && rc->common.checkpoint_dir && save_checkpoint(rc, agent, episodes, wall)) status = fail("checkpoint");
    app_metrics_close(csv);
    char *png = app_plot_path(&rc->common);
    if (png && rc->common.metrics_path &&
        app_plot_series(rc->common.metrics_path, png, "rl_cartpole: REINFORCE on CartPole-v1", "step", "episode",
                        (const char *[]){"last_reward", "running_reward"}, 2, "reward") == MPR_OK)
        printf("plot: %s\n", png);
    free(png);
    printf("{\"app\":\"rl_cartpole\",\"observers\":%d,\"seed\":%lld,\"episodes\":%lld,\"solved\":%s,"
           "\"running_reward\":%.3f,\"wall_s\":%.3f}\n",
           n_obs, (long long)rc->agent.seed, (long long)episodes, solved ? "true" : "false",
           agent_running_reward(agent), wall);
    for (int i = 0; obs && i < n_obs; i++) mpr_rref_release(obs[i]);
    free(obs);
    mpr_rref_release(agent_rref); /* the last reference: the agent is freed */
    return status;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    run_config_t rc = {.max_episodes = 2000, .log_every = 10, .threshold = CARTPOLE_REWARD_THRESHOLD,
                       .agent = {.gamma = 0.99, .lr = 1e-2, .dropout = 0.6}};
    app_option_t opts[] = {
        {"max-episodes", APP_OPT_INT, &rc.max_episodes, 1, 1e9, NULL, "give up after this many episodes"},
        {"threshold", APP_OPT_DOUBLE, &rc.threshold, 0, 500, NULL, "solved when the running reward exceeds this"},
        {"gamma", APP_OPT_DOUBLE, &rc.agent.gamma, 0, 1, NULL, "discount of future rewards"},
        {"lr", APP_OPT_DOUBLE, &rc.agent.lr, 1e-9, 10, NULL, "Adam's learning rate"},
        {"dropout", APP_OPT_DOUBLE, &rc.agent.dropout, 0, 0.99, NULL, "the policy's dropout probability"},
        {"log-every", APP_OPT_INT, &rc.log_every, 1, 1e9, NULL, "episodes between the tutorial's progress lines"},
        {0}};
    app_parse_options_or_exit(argc, argv,
                              "rl_cartpole: the RPC tutorial's RL example: an agent (rank 0) and observers\n"
                              "(every other rank) learn CartPole-v1 with REINFORCE.\n"
                              "usage: mpirun -np N rl_cartpole [options]   (N >= 2: N-1 observers)",
                              opts, &rc.common);
    if (rc.common.resume && !rc.common.checkpoint_dir) {
        if (app_launch_rank() == 0) fprintf(stderr, "rl_cartpole: --resume needs --checkpoint-dir (try --help)\n");
        return 2;
    }
    rc.agent.seed = (uint64_t)rc.common.seed;
    if (agent_register_functions() || observer_register_functions()) return fail("registering functions");
    int provided, rank, world;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world < 2) {
        fprintf(stderr, "rl_cartpole: needs at least 2 ranks (an agent and an observer): mpirun -np 2 ... (try --help)\n");
        MPI_Finalize();
        return 2;
    }
    char name[32];
    snprintf(name, sizeof name, rank == 0 ? "agent" : "obs%d", rank);
    mpr_init_options_t io;
    mpr_init_options_default(&io);
    io.name = name;
    /* the serving ranks enter mpr_shutdown at once and wait there for the whole
     * run: no limit (the default 300 s stopped their runtime mid-training) */
    io.shutdown_timeout_s = 0;
    if (mpr_init(&io)) {
        fail("mpr_init");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (app_print_placement(&rc.common, NULL)) fail("--verbose");
    int status = rank == 0 ? run_agent(&rc, world) : 0; /* observers serve the agent's calls */
    mpr_shutdown(true);
    MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    return status;
}
