/* test_wire_tensors.c — tensor-carrying messages built by hand, sent with raw
 * MPI on the runtime's communicator: a batch count that disagrees with the
 * descriptors is rejected with a clear error (the data messages drained, the
 * runtime still serving), both for a request (the sender gets an error
 * reply) and for a reply (the waiting caller gets the error instead of
 * waiting for its timeout); tensors inline in the message (mpri_wire.h,
 * MPRI_FLAG_TENSORS_INLINE) arrive whole, and inline bytes that do not add up
 * to the descriptors, or an inline header with batches, are rejected; real
 * calls around the inline limits echo their tensors exactly. Run with 2
 * ranks. */
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
static void send_two_tensors_inline(int dst, int kind, uint16_t flags, uint64_t request_id, uint32_t batch_count,
                                    int inline_bytes);
static void send_two_tensors(int dst, int kind, uint16_t flags, uint64_t request_id, uint32_t batch_count) {
    send_two_tensors_inline(dst, kind, flags, request_id, batch_count, -1);
}

/* The same with inline_bytes >= 0: MPRI_FLAG_TENSORS_INLINE, no data
 * message, and that many of the tensors' 8 bytes (1, 2, ...) after the
 * descriptors. */
static void send_two_tensors_inline(int dst, int kind, uint16_t flags, uint64_t request_id, uint32_t batch_count,
                                    int inline_bytes) {
    if (inline_bytes >= 0) flags |= MPRI_FLAG_TENSORS_INLINE;
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
    uint8_t data[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}; /* both tensors' bytes (and more) */
    if (inline_bytes >= 0) mpri_buf_put(&b, data, (size_t)inline_bytes);
    memcpy(b.data, &h, sizeof h);
    mpri_count_sent(dst); /* as mpri_send counts it (termination detection) */
    CHECK(MPI_Send(b.data, (int)b.len, MPI_BYTE, dst, MPRI_TAG_AM, mpri_rt.comm) == MPI_SUCCESS);
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

static void test_inline_request(void) {
    if (rank != 0) return;
    uint64_t id;
    mpr_future_t *f = await_reply(&id, 1);
    send_two_tensors_inline(1, MPRI_MSG_CALL, MPRI_FLAG_EXPECTS_REPLY, id, 0, 8);
    mpr_value_t *r = NULL;
    CHECK_OK(mpr_future_get(f, 30, &r));
    CHECK(mpr_value_list_len(r) == 2);
    for (int i = 0; i < 2; i++) {
        mpr_tensor_t *t;
        CHECK_OK(mpr_value_get_tensor(mpr_value_list_get(r, (size_t)i), &t));
        const uint8_t *d = mpr_tensor_data(t);
        CHECK(mpr_tensor_numel(t) == 4 && d[0] == 1 + 4 * i && d[3] == 4 + 4 * i);
    }
    mpr_value_release(r);
    mpr_future_release(f);
}

static void test_inline_wrong_length(void) {
    if (rank != 0) return;
    for (int n = 7; n <= 9; n += 2) { /* one byte short, one too many */
        uint64_t id;
        mpr_future_t *f = await_reply(&id, 1);
        send_two_tensors_inline(1, MPRI_MSG_CALL, MPRI_FLAG_EXPECTS_REPLY, id, 0, n);
        CHECK_OK(mpr_future_wait(f, 30));
        CHECK(mpr_future_error(f) == MPR_ERR_DECODE);
        CHECK_CONTAINS(mpr_future_error_message(f), "rejected a malformed message from rank 0");
        CHECK_CONTAINS(mpr_future_error_message(f), n == 7 ? "7 bytes of inline tensor data for tensors of 8"
                                                           : "9 bytes of inline tensor data for tensors of 8");
        mpr_future_release(f);
    }
    /* An inline header that also announces batches, or inline with no tensor, never passes the header check. */
    mpri_wire_header_t h = {.magic = MPRI_WIRE_MAGIC, .version = MPRI_WIRE_VERSION, .kind = MPRI_MSG_CALL,
                            .flags = MPRI_FLAG_TENSORS_INLINE, .tensor_count = 2, .batch_count = 1}, out;
    CHECK(mpri_wire_header_read(&h, sizeof h, &out) == MPR_ERR_DECODE);
    CHECK_CONTAINS(mpr_last_error(), "inline tensor data with 2 tensors and 1 batches");
    h.tensor_count = h.batch_count = 0;
    CHECK(mpri_wire_header_read(&h, sizeof h, &out) == MPR_ERR_DECODE);
    h.tensor_count = 2;
    CHECK_OK(mpri_wire_header_read(&h, sizeof h, &out));
}

/* Real calls around the limits: 2048 bytes of tensors go inline, 2049 in a
 * batch; 300 tiny tensors have too many descriptors for one eager message
 * and go in a batch too. Every byte comes back. */
static void test_inline_limits(void) {
    if (rank != 0) return;
    const int64_t counts[][2] = {{1, 2048}, {1, 2049}, {2, 1024}, {3, 700}, {200, 4}, {300, 4}, {1, 0}};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        mpr_value_t *args = mpr_value_new_list();
        for (int64_t k = 0; k < counts[c][0]; k++) {
            int64_t n = counts[c][1];
            mpr_tensor_t *t = mpr_tensor_empty(MPR_U8, 1, &n);
            for (int64_t i = 0; i < n; i++) ((uint8_t *)mpr_tensor_data(t))[i] = (uint8_t)(i * 7 + k);
            CHECK_OK(mpr_value_list_append(args, mpr_value_new_tensor(t)));
            mpr_tensor_release(t);
        }
        mpr_value_t *r = NULL;
        CHECK_OK(mpr_rpc_sync(mpr_to_rank(1), "echo", args, 30, &r));
        CHECK(mpr_value_equal(args, r));
        mpr_value_release(r);
        mpr_value_release(args);
    }
    /* The sender's choice: 2048 bytes of tensors post no data message, 2049 one. */
    for (int64_t n = 2048; n <= 2049; n++) {
        mpr_tensor_t *t = mpr_tensor_empty(MPR_U8, 1, &n);
        memset(mpr_tensor_data(t), 7, (size_t)n);
        mpr_value_t *a = mpr_value_list_of(1, mpr_value_new_tensor(t)), *back = NULL;
        unsigned long long before = mpri_transport_batches_posted();
        CHECK_OK(mpr_rpc_sync(mpr_to_rank(1), "echo", a, 30, &back));
        CHECK(mpri_transport_batches_posted() - before == (n == 2048 ? 0u : 1u));
        CHECK(mpr_value_equal(a, back));
        mpr_value_release(back);
        mpr_value_release(a);
        mpr_tensor_release(t);
    }
    /* requires_grad travels with an inline tensor */
    mpr_tensor_t *w = mpr_full(MPR_F32, 2, (int64_t[]){8, 8}, 0.5);
    CHECK_OK(mpr_set_requires_grad(w, true));
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_tensor(w)), *r = NULL;
    CHECK_OK(mpr_rpc_sync(mpr_to_rank(1), "echo", args, 30, &r));
    mpr_tensor_t *back;
    CHECK_OK(mpr_value_get_tensor(mpr_value_list_get(r, 0), &back));
    CHECK(mpr_requires_grad(back) && ((const float *)mpr_tensor_data(back))[63] == 0.5f);
    mpr_value_release(r);
    mpr_value_release(args);
    mpr_tensor_release(w);
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
    RUN_TEST(test_inline_request);
    RUN_TEST(test_inline_wrong_length);
    RUN_TEST(test_inline_limits);
    MPITEST_REPORT();
    CHECK_OK(mpr_shutdown(true));
    mpr_registry_clear();
    return 0;
}
