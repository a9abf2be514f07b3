/* test_rref_storm.c — 10,000 random RRef operations spread over all ranks:
 * remote() creations (objects and ints) on random owners, forks to random
 * workers (user->user, user->owner, owner->user, to self), releases, to_here
 * and proxy calls, all interleaved and asynchronous. At the end every rank
 * drops what it holds; the test then requires, on every rank, zero live
 * owners, zero users, nothing pending, every object destroyed exactly once
 * (global created == destroyed), and after graceful shutdown that every
 * message sent was processed (MPI stays initialized by the test to check). */
#include "rref_test_util.h"

#define TOTAL_OPS 10000
#define MAX_INFLIGHT 32

static uint64_t rng_state;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* A random kept RRef (new reference) or NULL. */
static mpr_rref_t *pick(void) {
    pthread_mutex_lock(&kept_lock);
    mpr_rref_t *r = nkept ? mpr_rref_retain(kept[rnd() % (uint32_t)nkept]) : NULL;
    pthread_mutex_unlock(&kept_lock);
    return r;
}

/* Remove and return a random kept RRef (its reference passes over). */
static mpr_rref_t *take(void) {
    pthread_mutex_lock(&kept_lock);
    mpr_rref_t *r = NULL;
    if (nkept) {
        uint32_t i = rnd() % (uint32_t)nkept;
        r = kept[i];
        kept[i] = kept[--nkept];
    }
    pthread_mutex_unlock(&kept_lock);
    return r;
}

static void put(mpr_rref_t *r) {
    pthread_mutex_lock(&kept_lock);
    if (nkept < 4096) {
        kept[nkept++] = r;
        r = NULL;
    }
    pthread_mutex_unlock(&kept_lock);
    mpr_rref_release(r);
}

typedef struct {
    mpr_future_t *f;
    int kind; /* 0 fork (keep), 1 read, 2 proxy add */
} inflight_t;

static inflight_t inflight[MAX_INFLIGHT];
static int ninflight;
static long counts[6];

static void settle(inflight_t *x) {
    mpr_value_t *v = NULL;
    mpr_err_t e = mpr_future_get(x->f, 60, &v);
    /* reads of objects fall back to a proxy inside "read"; every op must succeed */
    if (e) fprintf(stderr, "[rank %d] storm op kind %d failed: %s\n", rank, x->kind, mpr_last_error());
    CHECK(e == MPR_OK);
    if (x->kind != 0) CHECK(mpr_value_kind(v) == MPR_VALUE_INT);
    mpr_value_release(v);
    mpr_future_release(x->f);
}

static void add_inflight(mpr_future_t *f, int kind) {
    if (ninflight == MAX_INFLIGHT) {
        settle(&inflight[0]);
        inflight[0] = inflight[--ninflight];
    }
    inflight[ninflight++] = (inflight_t){f, kind};
}

static void storm(void) {
    int ops = TOTAL_OPS / size + (rank < TOTAL_OPS % size);
    rng_state = 0x9e3779b97f4a7c15ull ^ ((uint64_t)rank + 1) * 0x100000001b3ull;
    for (int i = 0; i < ops; i++) {
        uint32_t dice = rnd() % 100;
        int dst = (int)(rnd() % (uint32_t)size);
        if (nkept > 300) dice = 60; /* keep the working set bounded */
        if (dice < 35 || nkept == 0) { /* create */
            bool obj = rnd() % 2;
            mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_int(i));
            mpr_rref_t *r = mpr_remote(mpr_to_rank(dst), obj ? "make_tracked" : "make_int", args, MPR_TIMEOUT_DEFAULT);
            mpr_value_release(args);
            CHECK(r != NULL);
            put(r);
            counts[0]++;
        } else if (dice < 57) { /* fork to dst (it keeps it) */
            mpr_rref_t *r = pick();
            mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_rref(r));
            mpr_rref_release(r);
            add_inflight(mpr_rpc_async(mpr_to_rank(dst), "keep", args, MPR_TIMEOUT_DEFAULT), 0);
            mpr_value_release(args);
            counts[1]++;
        } else if (dice < 85) { /* release */
            mpr_rref_release(take());
            counts[2]++;
        } else if (dice < 93) { /* read on dst (local_value, to_here or proxy there) */
            mpr_rref_t *r = pick();
            mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_rref(r));
            mpr_rref_release(r);
            add_inflight(mpr_rpc_async(mpr_to_rank(dst), "read", args, MPR_TIMEOUT_DEFAULT), 1);
            mpr_value_release(args);
            counts[3]++;
        } else { /* proxy on the owner (objects) or to_here (ints) */
            mpr_rref_t *r = pick();
            mpr_value_t *v = NULL;
            mpr_err_t e = mpr_rref_to_here(r, MPR_TIMEOUT_DEFAULT, &v);
            if (e == MPR_ERR_UNSUPPORTED) {
                mpr_value_t *one = mpr_value_list_of(1, mpr_value_new_int(1));
                add_inflight(mpr_rref_rpc_async(r, "tracked_add", one, MPR_TIMEOUT_DEFAULT), 2);
                mpr_value_release(one);
                counts[4]++;
            } else {
                CHECK_OK(e);
                counts[5]++;
            }
            mpr_value_release(v);
            mpr_rref_release(r);
        }
    }
    while (ninflight) settle(&inflight[--ninflight]);
}

/* MPI_Allreduce(MPI_SUM) of longs that sleeps while it waits (Open MPI's
 * blocking collectives busy-poll and would starve the ranks doing work). */
static void quiet_allreduce(const long *in, long *out, int n) {
    MPI_Request req;
    MPI_Iallreduce(in, out, n, MPI_LONG, MPI_SUM, MPI_COMM_WORLD, &req);
    for (int done = 0;;) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (done) return;
        usleep(200);
    }
}

/* Sum of this rank's leftovers: owners, users, pending, live objects. */
static long leftovers(void) {
    mpr_debug_info_t d;
    mpr_get_debug_info(&d);
    return d.rref_owners + d.rref_users + d.rref_pending_users + d.rref_pending_children +
           d.rref_unacked_ctrl_msgs + (atomic_load(&tracked_created) - atomic_load(&tracked_destroyed));
}

static void test_storm(void) {
    double t0 = now_s();
    storm();
    mpitest_barrier(); /* everyone done sending forks */
    drop_kept_local();
    /* Wait for the deletes to land everywhere. */
    long total = 1;
    while (total != 0) {
        long mine = leftovers();
        quiet_allreduce(&mine, &total, 1);
        if (total && now_s() - t0 > 50) {
            mpr_debug_info_t d;
            mpr_get_debug_info(&d);
            fprintf(stderr, "[rank %d] leftovers: owners %ld users %ld pu %ld pc %ld pf %ld live %ld\n", rank,
                    d.rref_owners, d.rref_users, d.rref_pending_users, d.rref_pending_children,
                    d.rref_unacked_ctrl_msgs, (long)(atomic_load(&tracked_created) - atomic_load(&tracked_destroyed)));
            CHECK(!"RRef state did not drain");
        }
        if (total) usleep(2000);
    }
    long created = atomic_load(&tracked_created), destroyed = atomic_load(&tracked_destroyed), sums[2];
    long mine[2] = {created, destroyed};
    quiet_allreduce(mine, sums, 2);
    CHECK(sums[0] == sums[1] && sums[0] > 0);
    long all[6];
    quiet_allreduce(counts, all, 6);
    if (rank == 0)
        printf("storm: %ld creates, %ld forks, %ld releases, %ld remote reads, %ld proxy adds, %ld to_here; "
               "%ld objects created and destroyed; %.2f s\n",
               all[0], all[1], all[2], all[3], all[4], all[5], sums[0], now_s() - t0);
    CHECK(all[0] + all[1] + all[2] + all[3] + all[4] + all[5] == TOTAL_OPS);
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided); /* kept past mpr_shutdown */
    register_common();
    init_runtime(&argc, &argv, 4);
    RUN_TEST(test_storm);
    MPITEST_REPORT();
    CHECK_OK(mpr_shutdown(true));
    mpr_debug_info_t d;
    CHECK_OK(mpr_get_debug_info(&d));
    CHECK(d.rref_owners == 0 && d.rref_users == 0 && d.rref_pending_users == 0 &&
          d.rref_pending_children == 0 && d.rref_unacked_ctrl_msgs == 0);
    /* no message lost: every message sent anywhere was processed */
    unsigned long long local[2] = {d.msgs_sent, d.msgs_processed}, sum[2];
    MPI_Allreduce(local, sum, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    CHECK(sum[0] == sum[1] && sum[0] > TOTAL_OPS);
    if (rank == 0) printf("messages: %llu sent, %llu processed\n", sum[0], sum[1]);
    mpr_registry_clear();
    MPI_Finalize();
    return 0;
}
