/* test_rref_wire.c — RRef messages built by hand: malformed bodies and RRef
 * values are rejected with a clear error (never a crash), and repeated fork
 * requests are idempotent, and the RRefs of a message whose decode fails part
 * way, or that the callee's pool cannot queue, are settled. Run with 2 ranks; rank 0 sends to rank 1. */
#include "mpri_rref.h"
#include "mpri_codec.h"
#include "mpri_pool.h"
#include "mpri_runtime.h"
#include "rref_test_util.h"

/* Send `kind` with `body` to rank 1 as a request; expect an error reply
 * with `code` whose text contains `needle`. */
static void expect_rejected(int kind, const void *body, size_t len, uint64_t fn_id, mpr_err_t code,
                            const char *needle) {
    mpri_outmsg_t m;
    mpri_outmsg_init(&m, kind);
    m.hdr.function_id = fn_id;
    mpri_buf_put(&m.wire, body, len);
    mpr_future_t *f = mpri_request(1, &m, 10, "wire test");
    CHECK(f != NULL);
    CHECK_OK(mpr_future_wait(f, 10));
    if (mpr_future_error(f) != code)
        fprintf(stderr, "kind %s: got %s: %s\n", mpri_msg_kind_name(kind), mpr_error_name(mpr_future_error(f)),
                mpr_future_error_message(f));
    CHECK(mpr_future_error(f) == code);
    CHECK_CONTAINS(mpr_future_error_message(f), needle);
    mpr_future_release(f);
}

/* A CALL of "echo" whose argument list holds one hand-written RRef value. */
static void call_with_rref_bytes(const void *rref_bytes, size_t len, const char *needle) {
    mpri_buf_t b;
    mpri_buf_init(&b);
    mpri_buf_put_u16(&b, 4);
    mpri_buf_put(&b, "echo", 4);
    mpri_buf_put_u8(&b, MPR_VALUE_LIST);
    mpri_buf_put_u32(&b, 1);
    mpri_buf_put_u8(&b, MPR_VALUE_RREF);
    mpri_buf_put(&b, rref_bytes, len);
    expect_rejected(MPRI_MSG_CALL, b.data, b.len, mpri_hash_name("echo"), MPR_ERR_DECODE, needle);
    mpri_buf_fini(&b);
}

static void put_gid(mpri_buf_t *b, uint32_t rank_, uint64_t seq) {
    mpri_buf_put_u32(b, rank_);
    mpri_buf_put_u64(b, seq);
}

static void test_malformed(void) {
    if (rank != 0) return;
    uint8_t junk[3] = {1, 2, 3};
    expect_rejected(MPRI_MSG_RREF_FETCH, junk, sizeof junk, 0, MPR_ERR_DECODE, "malformed fetch");
    expect_rejected(MPRI_MSG_RREF_FORK_REQUEST, junk, sizeof junk, 0, MPR_ERR_DECODE, "malformed fork request");
    expect_rejected(MPRI_MSG_RREF_USER_DELETE, junk, sizeof junk, 0, MPR_ERR_DECODE, "malformed user delete");
    expect_rejected(MPRI_MSG_RREF_CHILD_ACCEPT, junk, sizeof junk, 0, MPR_ERR_DECODE, "malformed child accept");
    expect_rejected(MPRI_MSG_RREF_ACK, junk, sizeof junk, 0, MPR_ERR_DECODE, "malformed rref ack");
    expect_rejected(MPRI_MSG_REMOTE_CALL, junk, sizeof junk, 0, MPR_ERR_DECODE, "malformed remote call");
    /* an RRef id naming a rank outside the world */
    mpri_buf_t b;
    mpri_buf_init(&b);
    put_gid(&b, 77, 1);
    put_gid(&b, 0, 2);
    expect_rejected(MPRI_MSG_RREF_FORK_REQUEST, b.data, b.len, 0, MPR_ERR_DECODE, "names rank 77");
    mpri_buf_fini(&b);
    /* RRef values: bad owner rank, truncated */
    mpri_buf_init(&b);
    put_gid(&b, 0, 5);
    int32_t owner = 99;
    mpri_buf_put(&b, &owner, 4);
    put_gid(&b, 0, 6);
    call_with_rref_bytes(b.data, b.len, "RRef owner rank 99 outside [0, 2)");
    call_with_rref_bytes(b.data, 14, "cannot decode the arguments of 'echo'");
    mpri_buf_fini(&b);
}

/* Fork requests are idempotent: the same fork recorded twice is one fork. */
static void test_idempotent_fork_request(void) {
    if (rank != 0) return;
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_int(5));
    mpr_rref_t *r = mpr_remote(mpr_to_rank(1), "make_tracked", args, MPR_TIMEOUT_DEFAULT);
    mpr_value_release(args);
    while (!mpr_rref_confirmed_by_owner(r)) usleep(100);
    mpri_gid_t extra = {0, (uint64_t)1 << 40};
    for (int i = 0; i < 3; i++) {
        mpri_outmsg_t m;
        mpri_outmsg_init(&m, MPRI_MSG_RREF_FORK_REQUEST);
        mpri_gid_put(&m.wire, r->id);
        mpri_gid_put(&m.wire, extra);
        CHECK_OK(mpri_send(1, &m)); /* the acks find no waiting user here: ignored */
    }
    /* repeated child accepts for an unknown fork are ignored as well */
    for (int i = 0; i < 2; i++) {
        mpri_outmsg_t m;
        mpri_outmsg_init(&m, MPRI_MSG_RREF_CHILD_ACCEPT);
        mpri_gid_put(&m.wire, extra);
        CHECK_OK(mpri_send(1, &m));
    }
    mpri_gid_t id = r->id;
    mpr_rref_release(r);
    wait_owner_state(1, 1, 1); /* the extra fork keeps it */
    atomic_fetch_add(&mpri_rref_ctx.unacked_ctrl_msgs, 1); /* as a real delete does */
    mpri_outmsg_t m;
    mpri_outmsg_init(&m, MPRI_MSG_RREF_USER_DELETE);
    mpri_gid_put(&m.wire, id);
    mpri_gid_put(&m.wire, extra);
    CHECK_OK(mpri_send(1, &m));
    wait_owner_state(1, 0, 0); /* one delete removed the thrice-requested fork */
}

/* Rank 0 holds no owner record and no unacknowledged control message
 * (within 20 s). */
static void wait_no_owner_here(void) {
    mpr_debug_info_t d;
    double t0 = now_s();
    do {
        usleep(1000);
        CHECK_OK(mpr_get_debug_info(&d));
    } while ((d.rref_owners != 0 || d.rref_unacked_ctrl_msgs != 0) && now_s() - t0 < 20);
    if (d.rref_owners != 0) fprintf(stderr, "[rank 0] the owner record stayed: a fork was not settled\n");
    CHECK(d.rref_owners == 0);
}

/* A call whose arguments fail to decode part way settles every RRef they
 * carry: [r, bool 2, r] reaches rank 1 as a user of rank 0's r twice; the
 * first is decoded and released when the bool fails, the second is never
 * made and is undone (a USER_DELETE for its fork). Both forks leave the
 * owner, so the owner record goes when this rank drops r. */
static void test_failed_decode_settles_forks(void) {
    if (rank != 0) return;
    mpr_value_t *v = mpr_value_new_int(3);
    mpr_rref_t *r = mpr_rref_create_local(v);
    mpr_value_release(v);
    CHECK(r != NULL);
    mpr_value_t *args = mpr_value_list_of(3, mpr_value_new_rref(r), mpr_value_new_bool(true), mpr_value_new_rref(r));
    mpri_buf_t b;
    mpri_buf_init(&b);
    mpri_buf_put_u16(&b, 4);
    mpri_buf_put(&b, "echo", 4);
    size_t at = b.len;
    mpri_tensor_list_t tl;
    mpri_tensor_list_init(&tl);
    CHECK_OK(mpri_value_encode(args, &b, &tl, 1)); /* two forks, recorded by the owner */
    mpri_tensor_list_fini(&tl);
    size_t bool_at = at + 1 + 4 + (1 + 12 + 4 + 12) + 1; /* list kind, count, an RRef, the bool's kind */
    CHECK(b.data[bool_at - 1] == MPR_VALUE_BOOL && b.data[bool_at] == 1);
    b.data[bool_at] = 2;
    expect_rejected(MPRI_MSG_CALL, b.data, b.len, mpri_hash_name("echo"), MPR_ERR_DECODE, "bool value 2");
    mpri_buf_fini(&b);
    mpr_value_release(args);
    mpr_rref_release(r);
    wait_no_owner_here();
}

/* On rank 1, by RPC: the next `n` worker-pool submits fail as when the
 * queue cannot grow (mpri_pool_fail_submits). */
static mpr_err_t fn_fail_pool_submits(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    int64_t n = 0;
    mpr_err_t e = mpr_value_get_int(mpr_value_list_get(args, 0), &n);
    if (e) return e;
    atomic_store(&mpri_pool_fail_submits, (int)n);
    *result = mpr_value_new_none();
    return MPR_OK;
}

static void fail_next_pool_submit_on_1(void) {
    mpr_value_t *a = mpr_value_list_of(1, mpr_value_new_int(1)), *v = NULL;
    CHECK_OK(mpr_rpc_sync(mpr_to_rank(1), "fail_pool_submits", a, 10, &v));
    mpr_value_release(v);
    mpr_value_release(a);
}

/* A request the callee's pool cannot queue never runs, but settles what it
 * carries: the fork of an RRef argument (CALL), and for a REMOTE_CALL also
 * the owner record of the RRef it would have made (its user fails with the
 * error and its delete then finds a record to remove, not a tombstone). */
static void test_rejected_request_settles_forks(void) {
    if (rank != 0) return;
    mpr_value_t *v = mpr_value_new_int(3);
    mpr_rref_t *r = mpr_rref_create_local(v);
    mpr_value_release(v);
    CHECK(r != NULL);
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_rref(r));
    fail_next_pool_submit_on_1();
    v = NULL;
    CHECK_ERR(mpr_rpc_sync(mpr_to_rank(1), "echo", args, 10, &v), MPR_ERR_NOMEM);
    CHECK_CONTAINS(mpr_last_error(), "out of memory queueing the request");
    fail_next_pool_submit_on_1();
    mpr_rref_t *made = mpr_remote(mpr_to_rank(1), "echo", args, 10);
    CHECK(made != NULL);
    CHECK_ERR(mpr_rref_to_here(made, 10, &v), MPR_ERR_NOMEM);
    mpr_rref_release(made);
    mpr_value_release(args);
    mpr_rref_release(r);
    wait_no_owner_here();   /* r: both forks sent to rank 1 were settled */
    wait_owner_state(1, 0, 0); /* the failed creation's record went with its delete */
}

int main(int argc, char **argv) {
    register_common();
    CHECK_OK(mpr_register_function("fail_pool_submits", fn_fail_pool_submits, NULL));
    init_runtime(&argc, &argv, 2);
    CHECK(size == 2);
    RUN_TEST(test_malformed);
    RUN_TEST(test_idempotent_fork_request);
    RUN_TEST(test_failed_decode_settles_forks);
    RUN_TEST(test_rejected_request_settles_forks);
    MPITEST_REPORT();
    CHECK_OK(mpr_shutdown(true));
    mpr_debug_info_t d;
    CHECK_OK(mpr_get_debug_info(&d));
    CHECK(d.rref_owners == 0 && d.rref_users == 0 && d.rref_unacked_ctrl_msgs == 0);
    mpr_registry_clear();
    return 0;
}
