/* test_shutdown_local.c — non-graceful shutdown stops this rank at once:
 * a pending call's future fails with MPR_ERR_SHUTDOWN (no hang), and later
 * calls fail too. Single rank (the slow call goes to self). */
#include <unistd.h>

#include "mpitest.h"

static mpr_err_t fn_slow(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    usleep(300000);
    *result = mpr_value_new_int(1);
    return MPR_OK;
}

int main(int argc, char **argv) {
    CHECK_OK(mpr_register_function("slow", fn_slow, NULL));
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = &argc;
    opts.argv = &argv;
    CHECK_OK(mpr_init(&opts));
    mpr_future_t *f = mpr_rpc_async(mpr_to_rank(0), "slow", NULL, 0);
    CHECK(!mpr_future_done(f));
    CHECK_OK(mpr_shutdown(false));
    CHECK_OK(mpr_future_wait(f, 0));
    mpr_value_t *v = NULL;
    CHECK_ERR(mpr_future_get(f, 0, &v), MPR_ERR_SHUTDOWN);
    CHECK_CONTAINS(mpr_last_error(), "shut down");
    mpr_future_release(f);
    CHECK_ERR(mpr_rpc_sync(mpr_to_rank(0), "slow", NULL, 0, &v), MPR_ERR_SHUTDOWN);
    CHECK_ERR(mpr_init(&opts), MPR_ERR_SHUTDOWN); /* MPI was finalized with the runtime */
    printf("1 passed, 0 failed\n");
    mpr_registry_clear();
    return 0;
}
