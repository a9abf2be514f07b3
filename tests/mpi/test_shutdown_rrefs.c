/* test_shutdown_rrefs.c — graceful shutdown keeps RRefs valid until the
 * whole job is quiescent, then deletes them all and leaks nothing.
 * One scenario per run (argv[1]); the host program owns MPI so the checks can
 * add up counters over ranks after mpirpc stopped. Every scenario captures
 * each rank's stderr during shutdown and requires an empty RRef leak report,
 * zero RRef debug counters, and every tracked object destroyed.
 *
 *   observers (np >= 2): the RPC tutorial's agent/observer pattern. Rank 0,
 *     the agent, owns agent_rref and drives episodes through observers whose
 *     run_episode handler holds a UserRRef of agent_rref and calls the agent
 *     through it at every step. Each observer calls mpr_shutdown(true) as soon
 *     as its first episode started, and the handler waits until its rank is
 *     in shutdown before using its RRef: a handler holding a user RRef when
 *     its rank enters shutdown. Every episode must succeed.
 *   late_fork (np 2): rank 0 is in shutdown when rank 1 sends it an RRef that
 *     a handler keeps: the fork reaches rank 0 while it is shutting down, and
 *     must still be deleted (no "OwnerRRef ... still has 1 fork(s)").
 *   stress (np 4): ranks shut down at staggered times while the others keep
 *     calling through them with relay chains that pass RRefs from rank to
 *     rank and end in a proxy call on the owner: no call lost (every future
 *     succeeds, every leaf ran once), nothing leaked. */
#include <fcntl.h>
#include <stdatomic.h>
#include <unistd.h>

#include "rref_test_util.h"

static atomic_long leaf_calls;
static atomic_int episode_started;

/* ---- capture of this rank's stderr during shutdown ---- */

static int saved_fd = -1, capture_fd = -1;
static char capture_path[96];

static void capture_begin(void) {
    snprintf(capture_path, sizeof capture_path, "/tmp/mpirpc_shutdown_rrefs_%d_%d.txt", (int)getpid(), rank);
    fflush(stderr);
    saved_fd = dup(2);
    capture_fd = open(capture_path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    CHECK(saved_fd >= 0 && capture_fd >= 0);
    dup2(capture_fd, 2);
}

static void capture_end_expect_no_leak(void) {
    fflush(stderr);
    dup2(saved_fd, 2);
    close(capture_fd);
    close(saved_fd);
    static char text[1 << 16];
    FILE *f = fopen(capture_path, "r");
    CHECK(f != NULL);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    unlink(capture_path);
    if (n) fprintf(stderr, "[rank %d] stderr during shutdown:\n%s", rank, text);
    CHECK(strstr(text, "RRef leak") == NULL);
}

/* After mpr_shutdown: counters zero here, tracked objects all destroyed. */
static void check_nothing_left(void) {
    mpr_debug_info_t d;
    CHECK_OK(mpr_get_debug_info(&d));
    CHECK(d.rref_owners == 0 && d.rref_users == 0 && d.rref_pending_users == 0 && d.rref_pending_children == 0 &&
          d.rref_unacked_ctrl_msgs == 0);
    CHECK(d.pending_requests == 0 && d.pool_busy == 0 && d.progress_busy == 0);
    long local[2] = {atomic_load(&tracked_created), atomic_load(&tracked_destroyed)}, sum[2];
    MPI_Allreduce(local, sum, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    CHECK(sum[0] == sum[1]);
    unsigned long long mine[2] = {d.msgs_sent, d.msgs_processed}, all[2];
    MPI_Allreduce(mine, all, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    CHECK(all[0] == all[1]);
}

static void shutdown_checked(void) {
    capture_begin();
    mpr_err_t e = mpr_shutdown(true);
    capture_end_expect_no_leak();
    CHECK_OK(e);
    check_nothing_left();
}

static int64_t arg_int(const mpr_value_t *args, size_t i) {
    int64_t v = -1;
    CHECK_OK(mpr_args_int(args, i, &v));
    return v;
}

/* ---- observers ---- */

/* run_episode(ob_rref, agent_rref, steps) -> reward (the agent's counter
 * after the last step) */
static mpr_err_t fn_run_episode(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    mpr_rref_t *ob, *agent;
    int64_t steps;
    mpr_err_t e;
    if ((e = mpr_args_rref(args, 0, &ob)) || (e = mpr_args_rref(args, 1, &agent)) ||
        (e = mpr_args_int(args, 2, &steps)))
        return e;
    if (!mpr_rref_is_owner(ob)) return mpr_error_set(MPR_ERR_STATE, "the observer RRef should be owned here");
    atomic_store(&episode_started, 1);
    /* Use the agent's RRef only once this rank is in shutdown (bounded). */
    for (int i = 0; i < 5000 && mpr_is_running(); i++) usleep(1000);
    mpr_value_t *one = mpr_value_list_of(1, mpr_value_new_int(1)), *r = NULL;
    for (int64_t s = 0; s < steps && !e; s++) {
        mpr_value_release(r);
        r = NULL;
        e = mpr_rref_rpc_sync(agent, "tracked_add", one, 10, &r); /* agent.select_action(...) */
        if (!e) {
            mpr_value_t *own = NULL; /* the observer's own state, through its owner handle */
            e = mpr_rref_rpc_sync(ob, "tracked_add", one, 10, &own);
            mpr_value_release(own);
        }
    }
    mpr_value_release(one);
    if (e) {
        mpr_value_release(r);
        return e;
    }
    *result = r;
    return MPR_OK;
}

static void scenario_observers(void) {
    enum { EPISODES = 4, STEPS = 5 };
    if (rank != 0) {
        for (int i = 0; i < 10000 && !atomic_load(&episode_started); i++) usleep(1000);
        CHECK(atomic_load(&episode_started));
        shutdown_checked(); /* at once, while the agent still drives episodes */
        return;
    }
    mpr_value_t *obj = new_tracked(0);
    mpr_rref_t *agent = mpr_rref_create_local(obj);
    mpr_value_release(obj);
    CHECK(agent != NULL);
    int nobs = size - 1;
    mpr_rref_t *obs[64];
    for (int o = 0; o < nobs; o++) {
        mpr_value_t *a = mpr_value_list_of(1, mpr_value_new_int(100 * (o + 1)));
        obs[o] = mpr_remote(mpr_to_rank(o + 1), "make_tracked", a, 10);
        mpr_value_release(a);
        CHECK(obs[o] != NULL);
    }
    for (int ep = 0; ep < EPISODES; ep++) {
        mpr_future_t *fs[64];
        for (int o = 0; o < nobs; o++) {
            mpr_value_t *a = mpr_value_list_of(3, mpr_value_new_rref(obs[o]), mpr_value_new_rref(agent),
                                               mpr_value_new_int(STEPS));
            fs[o] = mpr_rpc_async(mpr_to_rank(o + 1), "run_episode", a, 20);
            mpr_value_release(a);
        }
        for (int o = 0; o < nobs; o++) {
            mpr_value_t *v = NULL;
            mpr_err_t e = mpr_future_get(fs[o], 30, &v);
            if (e) fprintf(stderr, "[agent] episode %d on observer %d: %s\n", ep, o + 1, mpr_last_error());
            CHECK_OK(e);
            CHECK(mpr_value_kind(v) == MPR_VALUE_INT);
            mpr_value_release(v);
            mpr_future_release(fs[o]);
        }
    }
    mpr_value_t *v = NULL;
    CHECK_OK(mpr_rref_local_value(agent, &v));
    tracked_t *t;
    CHECK_OK(mpr_value_get_object(v, tracked_type, (void **)&t));
    CHECK(t->v == (int64_t)EPISODES * nobs * STEPS); /* every step reached the agent once */
    mpr_value_release(v);
    for (int o = 0; o < nobs; o++) mpr_rref_release(obs[o]);
    mpr_rref_release(agent);
    shutdown_checked();
}

/* ---- late_fork ---- */

static void scenario_late_fork(void) {
    CHECK(size == 2);
    if (rank == 0) {
        shutdown_checked(); /* serves rank 1's keep() while shutting down */
        drop_kept_local();  /* released after shutdown: nothing more is sent */
        return;
    }
    usleep(300000); /* rank 0 is in shutdown by now */
    mpr_value_t *obj = new_tracked(5);
    mpr_rref_t *r = mpr_rref_create_local(obj);
    mpr_value_release(obj);
    mpr_value_t *a = mpr_value_list_of(1, mpr_value_new_rref(r)), *res = NULL;
    CHECK_OK(mpr_rpc_sync(mpr_to_rank(0), "keep", a, 10, &res));
    mpr_value_release(res);
    mpr_value_release(a);
    mpr_rref_release(r); /* rank 0's user keeps the object alive until its sweep */
    shutdown_checked();
}

/* ---- stress ---- */

/* relay(hops, rref, salt): forward through a random other rank until hops is
 * 0, then add 1 to the tracked object through the RRef (a proxy call on its
 * owner). Returns the object's new value. */
static mpr_err_t fn_relay(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t hops = arg_int(args, 0), salt = arg_int(args, 2);
    mpr_rref_t *r;
    mpr_err_t e = mpr_args_rref(args, 1, &r);
    if (e) return e;
    int me = mpitest_rank(), n = mpr_world_size();
    if (hops > 0) {
        int next = (me + 1 + (int)(salt % (n - 1))) % n;
        mpr_value_t *a = mpr_value_list_of(3, mpr_value_new_int(hops - 1), mpr_value_new_rref(r),
                                           mpr_value_new_int(salt / 3 + 7));
        e = mpr_rpc_sync(mpr_to_rank(next), "relay", a, 20, result);
        mpr_value_release(a);
        return e;
    }
    mpr_value_t *one = mpr_value_list_of(1, mpr_value_new_int(1));
    e = mpr_rref_rpc_sync(r, "tracked_add", one, 20, result);
    mpr_value_release(one);
    if (!e) atomic_fetch_add(&leaf_calls, 1);
    return e;
}

static void scenario_stress(void) {
    enum { OWN = 3, OUTSTANDING = 12, MAX_CALLS = 300 };
    /* RRefs to use: objects owned here and users of objects owned by peers. */
    mpr_rref_t *pool[OWN + 16];
    int npool = 0;
    for (int i = 0; i < OWN; i++) {
        mpr_value_t *obj = new_tracked(0);
        pool[npool++] = mpr_rref_create_local(obj);
        mpr_value_release(obj);
    }
    for (int p = 0; p < size && npool < OWN + 16; p++) {
        if (p == rank) continue;
        mpr_value_t *a = mpr_value_list_of(1, mpr_value_new_int(p)), *v = NULL;
        CHECK_OK(mpr_rpc_sync(mpr_to_rank(p), "make_local", a, 10, &v));
        CHECK_OK(mpr_value_get_rref(v, &pool[npool]));
        mpr_rref_retain(pool[npool++]);
        mpr_value_release(v);
        mpr_value_release(a);
    }
    mpitest_barrier();
    static mpr_future_t *fs[MAX_CALLS];
    long issued = 0;
    unsigned seed = 17u + 31u * (unsigned)rank;
    double stop_at = now_s() + 0.15 * (rank + 1); /* rank 3 keeps calling the longest */
    while (now_s() < stop_at && issued < MAX_CALLS) {
        long waiting = 0;
        for (long i = 0; i < issued; i++) waiting += !mpr_future_done(fs[i]);
        if (waiting >= OUTSTANDING) {
            usleep(200);
            continue;
        }
        mpr_rref_t *r = pool[rand_r(&seed) % npool];
        int dst = (rank + 1 + rand_r(&seed) % (size - 1)) % size;
        mpr_value_t *a = mpr_value_list_of(3, mpr_value_new_int(1 + rand_r(&seed) % 3), mpr_value_new_rref(r),
                                           mpr_value_new_int(rand_r(&seed) % 1000));
        fs[issued++] = mpr_rpc_async(mpr_to_rank(dst), "relay", a, 30);
        mpr_value_release(a);
    }
    for (int i = 0; i < npool; i++) mpr_rref_release(pool[i]);
    shutdown_checked(); /* the others still call through this rank */
    for (long i = 0; i < issued; i++) {
        mpr_value_t *v = NULL;
        mpr_err_t e = mpr_future_get(fs[i], 0, &v);
        if (e) fprintf(stderr, "[rank %d] call %ld failed: %s\n", rank, i, mpr_future_error_message(fs[i]));
        CHECK_OK(e);
        mpr_value_release(v);
        mpr_future_release(fs[i]);
    }
    long mine[2] = {issued, atomic_load(&leaf_calls)}, all[2];
    MPI_Allreduce(mine, all, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("stress: %ld calls, %ld leaves\n", all[0], all[1]);
    CHECK(all[0] == all[1] && all[0] > 0);
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    CHECK(provided == MPI_THREAD_MULTIPLE && argc == 2);
    (void)init_runtime; /* shared helpers this test does not use: it owns MPI */
    register_common();
    CHECK_OK(mpr_register_function("run_episode", fn_run_episode, NULL));
    CHECK_OK(mpr_register_function("relay", fn_relay, NULL));
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.shutdown_timeout_s = 60;
    CHECK_OK(mpr_init(&opts));
    rank = mpitest_rank();
    size = mpr_world_size();
    if (strcmp(argv[1], "observers") == 0)
        scenario_observers();
    else if (strcmp(argv[1], "late_fork") == 0)
        scenario_late_fork();
    else if (strcmp(argv[1], "stress") == 0)
        scenario_stress();
    else
        CHECK(!"unknown scenario");
    mpitest_barrier();
    if (rank == 0) printf("[ok] %s\n1 passed, 0 failed\n", argv[1]);
    mpr_registry_clear();
    MPI_Finalize();
    return 0;
}
