/* test_shutdown.c — graceful shutdown loses nothing: every rank fires
 * requests (some of which fire further requests from inside their handlers
 * without waiting) and calls mpr_shutdown(true) at once; afterwards every
 * future has its result and every handler ran exactly as often as requested.
 * The host program owns MPI here, so MPI outlives mpirpc for the checks.
 * Also: API calls after shutdown fail with MPR_ERR_SHUTDOWN, and waiting on a
 * future nobody will complete returns an error instead of hanging. */
#include <stdatomic.h>
#include <unistd.h>

#include "mpitest.h"

static int rank, size;
/* Handlers may run before main() has stored rank/size: ask the runtime. */
#define SELF_RANK() mpitest_rank()
#define WORLD() mpr_world_size()
static atomic_long executed;

static mpr_err_t fn_count(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t forward, token;
    mpr_err_t e;
    if ((e = mpr_args_int(args, 0, &forward)) || (e = mpr_args_int(args, 1, &token))) return e;
    atomic_fetch_add(&executed, 1);
    usleep((useconds_t)(token % 3) * 500);
    if (forward > 0) { /* fire and forget: nobody waits for this one */
        mpr_value_t *fwd = ints2(forward - 1, token + 1);
        mpr_future_release(mpr_rpc_async(mpr_to_rank((SELF_RANK() + 1) % WORLD()), "count", fwd, 0));
        mpr_value_release(fwd);
    }
    *result = mpr_value_new_int(token);
    return MPR_OK;
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    CHECK_OK(mpr_register_function("count", fn_count, NULL));
    CHECK_OK(mpr_init(NULL));
    size = mpr_world_size();

    enum { N = 400 };
    mpr_future_t *fs[N];
    long issued = 0;
    unsigned seed = 99u + (unsigned)rank;
    for (int i = 0; i < N; i++) {
        int64_t forward = rand_r(&seed) % 3;
        issued += 1 + forward;
        mpr_value_t *args = ints2(forward, i);
        fs[i] = mpr_rpc_async(mpr_to_rank(rand_r(&seed) % size), "count", args, 0);
        mpr_value_release(args);
    }
    mpr_future_t *orphan = mpr_future_create(); /* never completed by anyone */
    CHECK_OK(mpr_shutdown(true));               /* nothing waited for yet */

    for (int i = 0; i < N; i++) {
        CHECK(mpr_future_done(fs[i]));
        mpr_value_t *v;
        CHECK_OK(mpr_future_get(fs[i], 0, &v));
        int64_t token;
        CHECK_OK(mpr_value_get_int(v, &token));
        CHECK(token == i);
        mpr_value_release(v);
        mpr_future_release(fs[i]);
    }
    long total_issued = 0, total_executed = 0, mine = atomic_load(&executed);
    MPI_Allreduce(&issued, &total_issued, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&mine, &total_executed, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    CHECK(total_issued == total_executed);

    mpr_debug_info_t info;
    CHECK_OK(mpr_get_debug_info(&info));
    CHECK(info.pending_requests == 0 && info.pool_busy == 0 && info.progress_busy == 0);
    unsigned long long sent = info.msgs_sent, processed = info.msgs_processed, all_sent = 0, all_processed = 0;
    MPI_Allreduce(&sent, &all_sent, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&processed, &all_processed, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    CHECK(all_sent == all_processed);

    /* after shutdown */
    CHECK_ERR(mpr_future_wait(orphan, 0), MPR_ERR_SHUTDOWN);
    mpr_future_release(orphan);
    mpr_value_t *r = NULL;
    mpr_value_t *args = ints2(0, 0);
    CHECK_ERR(mpr_rpc_sync(mpr_to_rank(0), "count", args, 0, &r), MPR_ERR_SHUTDOWN);
    mpr_future_t *f = mpr_rpc_async(mpr_to_rank(0), "count", args, 0);
    CHECK(mpr_future_done(f) && mpr_future_error(f) == MPR_ERR_SHUTDOWN);
    mpr_future_release(f);
    mpr_value_release(args);
    CHECK_ERR(mpr_shutdown(true), MPR_ERR_SHUTDOWN);
    mpr_worker_info_t w;
    CHECK_ERR(mpr_get_self_worker_info(&w), MPR_ERR_SHUTDOWN);
    int finalized = 1;
    MPI_Finalized(&finalized);
    CHECK(!finalized); /* the host's MPI is never finalized by mpirpc */
    if (rank == 0) printf("1 passed, 0 failed\n");
    mpr_registry_clear();
    MPI_Finalize();
    return 0;
}
