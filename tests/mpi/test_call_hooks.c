/* test_call_hooks.c — the call hooks (api/src/mpri_call.h) that distributed
 * autograd will plug into: the caller's hook stamps a context id on every
 * CALL / REMOTE_CALL, the callee's on_request sees it, the context is active
 * on the thread running the function (enter/leave), on_reply sees the
 * result, release balances on_request, and an on_request failure fails the
 * call without running the function. Run with 2 ranks. */
#include <stdatomic.h>

#include "mpitest.h"
#include "mpri_call.h"

#define CONTEXT_BASE 1000

static atomic_int sends, requests, enters, leaves, replies, releases, refused_runs;
static _Thread_local int64_t current_context; /* what "the active context" is here */

typedef struct {
    int64_t context;
} hook_state_t;

static mpr_err_t on_send_request(mpri_outmsg_t *m, const mpr_value_t *args, int dst_rank) {
    m->hdr.autograd_context_id = CONTEXT_BASE + (uint64_t)mpitest_rank();
    m->hdr.autograd_message_id = (uint64_t)atomic_fetch_add(&sends, 1);
    return MPR_OK;
}

static mpr_err_t on_request(const mpri_msg_t *msg, const mpr_value_t *args, void **state) {
    if (msg->hdr.function_id == mpri_hash_name("refused"))
        return mpr_error_set(MPR_ERR_STATE, "no autograd context %llu here",
                             (unsigned long long)msg->hdr.autograd_context_id);
    hook_state_t *s = malloc(sizeof *s);
    if (!s) return mpr_error_set(MPR_ERR_NOMEM, "hook state");
    s->context = (int64_t)msg->hdr.autograd_context_id;
    *state = s;
    atomic_fetch_add(&requests, 1);
    return MPR_OK;
}

static void enter(void *state) {
    current_context = ((hook_state_t *)state)->context;
    atomic_fetch_add(&enters, 1);
}

static void leave(void *state) {
    current_context = 0;
    atomic_fetch_add(&leaves, 1);
}

static void on_reply(void *state, const mpr_value_t *result) { atomic_fetch_add(&replies, 1); }

static void release(void *state) {
    free(state);
    atomic_fetch_add(&releases, 1);
}

/* The context active while this function runs. */
static mpr_err_t fn_context(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    *result = mpr_value_new_int(current_context);
    return MPR_OK;
}

static mpr_err_t fn_refused(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    atomic_fetch_add(&refused_runs, 1);
    return MPR_OK;
}

static void test_context_reaches_the_function(void) {
    if (mpitest_rank() != 0) return;
    mpr_value_t *r = NULL;
    int64_t got;
    CHECK_OK(mpr_rpc_sync(mpr_to_rank(1), "context", NULL, 30, &r));
    CHECK_OK(mpr_value_get_int(r, &got));
    CHECK(got == CONTEXT_BASE + 0);
    mpr_value_release(r);
    mpr_rref_t *rr = mpr_remote(mpr_to_rank(1), "context", NULL, 30);
    CHECK(rr != NULL);
    CHECK_OK(mpr_rref_to_here(rr, 30, &r));
    CHECK_OK(mpr_value_get_int(r, &got));
    CHECK(got == CONTEXT_BASE + 0);
    mpr_value_release(r);
    mpr_rref_release(rr);
    CHECK(current_context == 0); /* only on the thread running the function */
}

static void test_refused_and_unknown(void) {
    if (mpitest_rank() != 0) return;
    mpr_value_t *r = NULL;
    CHECK_ERR(mpr_rpc_sync(mpr_to_rank(1), "refused", NULL, 30, &r), MPR_ERR_STATE);
    CHECK_CONTAINS(mpr_last_error(), "no autograd context 1000 here");
    CHECK_ERR(mpr_rpc_sync(mpr_to_rank(1), "no_such_fn", NULL, 30, &r), MPR_ERR_UNKNOWN_FUNCTION);
}

static void test_balanced(void) {
    /* the callee (rank 1) saw 2 runs; every hook call is paired */
    if (mpitest_rank() == 1) {
        CHECK(atomic_load(&requests) == 2);
        CHECK(atomic_load(&enters) == 2 && atomic_load(&leaves) == 2);
        CHECK(atomic_load(&replies) == 2 && atomic_load(&releases) == 2);
        CHECK(atomic_load(&refused_runs) == 0);
    } else {
        CHECK(atomic_load(&sends) == 4); /* rpc, remote, refused, unknown */
        CHECK(atomic_load(&requests) == 0);
    }
}

int main(int argc, char **argv) {
    CHECK_OK(mpr_register_function("context", fn_context, NULL));
    CHECK_OK(mpr_register_function("refused", fn_refused, NULL));
    mpri_call_hooks_t hooks = {on_send_request, on_request, enter, leave, on_reply, release};
    CHECK_OK(mpri_call_set_hooks(&hooks));
    CHECK_ERR(mpri_call_set_hooks(&hooks), MPR_ERR_EXISTS);
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = &argc;
    opts.argv = &argv;
    CHECK_OK(mpr_init(&opts));
    CHECK(mpr_world_size() == 2);
    CHECK_ERR(mpri_call_set_hooks(&hooks), MPR_ERR_STATE);
    RUN_TEST(test_context_reaches_the_function);
    RUN_TEST(test_refused_and_unknown);
    RUN_TEST(test_balanced);
    CHECK_OK(mpr_shutdown(true));
    MPITEST_REPORT();
    return 0;
}
