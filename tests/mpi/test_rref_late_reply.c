/* test_rref_late_reply.c — a reply that arrives after its call timed out
 * still settles the RRefs it carries. Run with 2 ranks.
 *
 * Rank 1's function sleeps 300 ms, then returns an RRef it owns (its fork
 * is added to the OwnerRRef when the reply is encoded). Rank 0 calls it with
 * a 50 ms timeout, so the reply comes back to nobody. Before the fix the
 * runtime dropped such a reply undecoded: the fork was never confirmed nor
 * deleted, the OwnerRRef lived until shutdown and graceful shutdown reported
 * it as a leak. Now the orphan reply is decoded and released like any
 * value, so the fork is deleted: once the owner's handle is dropped too,
 * rank 1 holds no OwnerRRef and its tracked object is destroyed, both
 * before shutdown. */
#include "rref_test_util.h"

/* late_rref() -> (after 300 ms) an RRef to a tracked object owned here */
static mpr_err_t fn_late_rref(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    (void)args;
    usleep(300000);
    mpr_value_t *obj = new_tracked(7);
    mpr_rref_t *r = mpr_rref_create_local(obj);
    mpr_value_release(obj);
    if (!r) return mpr_last_error_code();
    *result = mpr_value_new_rref(r);
    mpr_rref_release(r);
    return *result ? MPR_OK : mpr_last_error_code();
}

static long owners_here(void) {
    mpr_debug_info_t d;
    CHECK_OK(mpr_get_debug_info(&d));
    return d.rref_owners;
}

int main(int argc, char **argv) {
    register_common();
    CHECK_OK(mpr_register_function("late_rref", fn_late_rref, NULL));
    init_runtime(&argc, &argv, 2);
    CHECK(size == 2);
    if (rank == 0) {
        mpr_value_t *res = NULL;
        CHECK_ERR(mpr_rpc_sync(mpr_to_rank(1), "late_rref", NULL, 0.05, &res), MPR_ERR_TIMEOUT);
        CHECK(res == NULL);
        usleep(600000); /* the late reply arrives meanwhile */
    }
    mpitest_barrier();
    if (rank == 1) {
        /* the fork of the reply is deleted once rank 0 has settled it */
        long owners = -1;
        for (int i = 0; i < 500 && (owners = owners_here()) != 0; i++) usleep(10000);
        if (owners != 0) fprintf(stderr, "rank 1 still holds %ld OwnerRRef(s) 5 s after the late reply\n", owners);
        CHECK(owners == 0);
        CHECK(atomic_load(&tracked_destroyed) == atomic_load(&tracked_created) && atomic_load(&tracked_created) == 1);
    }
    mpitest_barrier();
    MPITEST_REPORT();
    CHECK_OK(mpr_shutdown(true));
    mpr_registry_clear();
    return 0;
}
