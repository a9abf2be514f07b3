/* test_wire_tensors.c — tensor-carrying messages built by hand, sent with raw
 * MPI on the runtime's communicator: a batch count that disagrees with the
 * descriptors is rejected with a clear error (the data messages drained, the
 * runtime still serving), both for a request (the sender gets an error
 * reply) and for a reply (the waiting caller gets the error instead of
 * waiting for its timeout). Run with 2 ranks. */
#include <stdatomic.h>

#include "mpitest.h"
#include "mpri_event.h"
#include "mpri_future.h"
#include "mpri_runtime.h"
#include "mpri_tensor_batches.h"

static int rank;

static mpr_err_t fn_echo(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    *result = mpr_value_retain((mpr_value_t *)args);
    return MPR_OK;
}

/* A message of `kind` to `dst` carrying two 4-byte u8 tensors (one batch by
 * the plan) in a list, announcing `batch_count` batches and sending that many
 * 8-byte data messages, as a request or as the reply to `request_id`. */
static void send_two_tensors(int dst, int kind, uint16_t flags, uint64_t request_id, uint32_t batch_count) {
    mpri_buf_t b;
    mpri_buf_init(&b);
    mpri_wire_header_t h = {.magic = MPRI_WIRE_MAGIC, .version = MPRI_WIRE_VERSION, .kind = (uint8_t)kind,
                            .flags = flags, .tensor_count = 2, .request_id = request_id,
                            .data_tag = (uint32_t)mpri_rt.tag_ub - 1, .batch_count = batch_count};
    mpri_buf_put(&b, &h, sizeof h);
    size_t body_start = b.len;
    if (kind == MPRI_MSG_CALL) { /* the function name, as a CALL carries it */
        h.function_id = mpri_hash_name("echo");
        mpri_buf_put_u16(&b, 4);
        mpri_buf_put(&b, "echo", 4);
    }
    mpri_buf_put_u8(&b, MPR_VALUE_LIST);
    mpri_buf_put_u32(&b, 2);
    for (uint32_t i = 0; i < 2; i++) {
        mpri_buf_put_u8(&b, MPR_VALUE_TENSOR);
        mpri_buf_put_u32(&b, i);
    }
    h.body_len = (uint32_t)(b.len - body_start);
    int64_t four = 4;
    for (int i = 0; i < 2; i++) { /* descriptors: U8 [4] */
        mpri_buf_put_u8(&b, MPR_U8);
        mpri_buf_put_u8(&b, 1);
        mpri_buf_put(&b, &four, sizeof four);
    }
    memcpy(b.data, &h, sizeof h);
    mpri_count_sent(dst); /* as mpri_send counts it (termination detection) */
    CHECK(MPI_Send(b.data, (int)b.len, MPI_BYTE, dst, MPRI_TAG_AM, mpri_rt.comm) == MPI_SUCCESS);
    uint8_t data[8] = {1, 2, 3, 4, 5, 6, 7, 8}; /* both tensors' bytes */
    for (uint32_t i = 0; i < batch_count; i++) /* what a sender with that count would send */
        CHECK(MPI_Send(data, 8, MPI_BYTE, dst, (int)h.data_tag, mpri_rt.comm) == MPI_SUCCESS);
    mpri_buf_fini(&b);
}

/* A future registered as awaiting the reply to a fresh request id. */
static mpr_future_t *await_reply(uint64_t *id, int dst) {
    mpr_future_t *f = mpr_future_create();
    CHECK(f != NULL);
    *id = atomic_fetch_add(&mpri_rt.next_request_id, 1);
    CHECK_OK(mpri_pending_add(*id, mpr_future_retain(f), mpri_now_ns() + (int64_t)30e9, dst, "wire test"));
    return f;
}

static void test_request_with_wrong_batch_count(void) {
    if (rank != 0) return;
    uint64_t id;
    mpr_future_t *f = await_reply(&id, 1);
    send_two_tensors(1, MPRI_MSG_CALL, MPRI_FLAG_EXPECTS_REPLY, id, 2); /* the plan makes 1 */
    CHECK_OK(mpr_future_wait(f, 30));
    CHECK(mpr_future_error(f) == MPR_ERR_DECODE);
    CHECK_CONTAINS(mpr_future_error_message(f), "rejected a malformed message from rank 0");
    CHECK_CONTAINS(mpr_future_error_message(f), "2 tensor batches announced, the descriptors make 1");
    mpr_future_release(f);
    /* the same message with the right count is a normal call */
    f = await_reply(&id, 1);
    send_two_tensors(1, MPRI_MSG_CALL, MPRI_FLAG_EXPECTS_REPLY, id, 1);
    mpr_value_t *r = NULL;
    CHECK_OK(mpr_future_get(f, 30, &r));
    CHECK(mpr_value_list_len(r) == 2);
    mpr_tensor_t *t;
    CHECK_OK(mpr_value_get_tensor(mpr_value_list_get(r, 1), &t));
    CHECK(mpr_tensor_numel(t) == 4 && ((const uint8_t *)mpr_tensor_data(t))[3] == 8);
    mpr_value_release(r);
    mpr_future_release(f);
}

static void test_reply_with_wrong_batch_count(void) {
    if (rank != 0) return;
    uint64_t id;
    mpr_future_t *f = await_reply(&id, 1);
    /* a RETURN for our request that cannot be read: sent to ourselves over MPI */
    send_two_tensors(0, MPRI_MSG_RETURN, MPRI_FLAG_RESPONSE, id, 2);
    CHECK_OK(mpr_future_wait(f, 30)); /* completes now, not at the 30 s deadline */
    CHECK(mpr_future_error(f) == MPR_ERR_DECODE);
    CHECK_CONTAINS(mpr_future_error_message(f), "2 tensor batches announced, the descriptors make 1");
    mpr_future_release(f);
    /* and the runtime goes on */
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_int(5)), *r = NULL;
    CHECK_OK(mpr_rpc_sync(mpr_to_rank(1), "echo", args, 30, &r));
    CHECK(mpr_value_equal(args, r));
    mpr_value_release(r);
    mpr_value_release(args);
}

int main(int argc, char **argv) {
    CHECK_OK(mpr_register_function("echo", fn_echo, NULL));
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = &argc;
    opts.argv = &argv;
    CHECK_OK(mpr_init(&opts));
    rank = mpitest_rank();
    CHECK(mpr_world_size() == 2);
    RUN_TEST(test_request_with_wrong_batch_count);
    RUN_TEST(test_reply_with_wrong_batch_count);
    MPITEST_REPORT();
    CHECK_OK(mpr_shutdown(true));
    mpr_registry_clear();
    return 0;
}
