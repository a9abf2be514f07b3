/* test_stop_mid_message.c — a non-graceful stop while a tensor message is
 * still arriving. Rank 0 sends rank 1, with raw MPI on the runtime's
 * communicator, a CALL whose tensor data it only partly sends; once rank 1
 * holds the message half-assembled it stops with mpr_shutdown(false). The
 * stop must cancel exactly the receives that exist and are still open (one
 * per batch, not one per tensor; finished ones are MPI_REQUEST_NULL) and free
 * the message, without crashing or leaking.
 *   small: 200 x 60 KiB tensors = one batch, none of it sent;
 *   large: 8 x 1 KiB then 3 x 1 MiB tensors = four batches (the small ones
 *          share one), the first two sent.
 * The host initializes MPI, so both ranks meet again after the stop. Run with
 * 2 ranks and "small" (the default) or "large". */
#include "mpitest.h"
#include "mpri_event.h"
#include "mpri_runtime.h"
#include "mpri_tensor_batches.h"

static mpr_err_t fn_echo(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    *result = mpr_value_retain((mpr_value_t *)args);
    return MPR_OK;
}

/* A CALL of `n` U8 tensors of sizes[i] bytes to rank 1, announcing
 * `batches` batches and sending the first `sent` of them (`batch_bytes[b]`
 * bytes each: the receiver's datatype scatters them). */
static void send_partial_call(uint32_t n, const int64_t *sizes, uint32_t batches, uint32_t sent,
                              const int *batch_bytes) {
    mpri_buf_t b;
    mpri_buf_init(&b);
    mpri_wire_header_t h = {.magic = MPRI_WIRE_MAGIC, .version = MPRI_WIRE_VERSION, .kind = MPRI_MSG_CALL,
                            .tensor_count = n, .request_id = 1, .data_tag = (uint32_t)mpri_rt.tag_ub - 1,
                            .batch_count = batches, .function_id = mpri_hash_name("echo")};
    mpri_buf_put(&b, &h, sizeof h);
    size_t body_start = b.len;
    mpri_buf_put_u16(&b, 4);
    mpri_buf_put(&b, "echo", 4);
    mpri_buf_put_u8(&b, MPR_VALUE_LIST);
    mpri_buf_put_u32(&b, n);
    for (uint32_t i = 0; i < n; i++) {
        mpri_buf_put_u8(&b, MPR_VALUE_TENSOR);
        mpri_buf_put_u32(&b, i);
    }
    h.body_len = (uint32_t)(b.len - body_start);
    for (uint32_t i = 0; i < n; i++) { /* descriptors: U8 [sizes[i]] */
        mpri_buf_put_u8(&b, MPR_U8);
        mpri_buf_put_u8(&b, 1);
        mpri_buf_put(&b, &sizes[i], sizeof sizes[i]);
    }
    CHECK(!b.failed);
    memcpy(b.data, &h, sizeof h);
    atomic_fetch_add(&mpri_rt.msgs_sent, 1);
    CHECK(MPI_Send(b.data, (int)b.len, MPI_BYTE, 1, MPRI_TAG_AM, mpri_rt.comm) == MPI_SUCCESS);
    for (uint32_t i = 0; i < sent; i++) {
        uint8_t *data = calloc(1, (size_t)batch_bytes[i]);
        CHECK(data != NULL);
        CHECK(MPI_Send(data, batch_bytes[i], MPI_BYTE, 1, (int)h.data_tag, mpri_rt.comm) == MPI_SUCCESS);
        free(data);
    }
    mpri_buf_fini(&b);
}

static long progress_busy(void) {
    mpr_debug_info_t info;
    CHECK_OK(mpr_get_debug_info(&info));
    return info.progress_busy;
}

int main(int argc, char **argv) {
    int provided, rank;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    CHECK(provided == MPI_THREAD_MULTIPLE);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const char *shape = argc > 1 ? argv[1] : "small";
    bool large = strcmp(shape, "large") == 0;
    CHECK(large || strcmp(shape, "small") == 0);
    CHECK_OK(mpr_register_function("echo", fn_echo, NULL));
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    CHECK_OK(mpr_init(&opts));
    CHECK(mpr_world_size() == 2);
    if (rank == 0) {
        int64_t sizes[200];
        if (large) {
            for (int i = 0; i < 11; i++) sizes[i] = i < 8 ? 1 << 10 : 1 << 20;
            const int batch_bytes[2] = {8 << 10, 1 << 20};
            send_partial_call(11, sizes, 4, 2, batch_bytes);
        } else {
            for (int i = 0; i < 200; i++) sizes[i] = 60 << 10;
            send_partial_call(200, sizes, 1, 0, NULL);
        }
    } else {
        /* Wait until the message is half-assembled (its receives posted and,
         * for the large case, the two sent batches received). */
        int64_t deadline = mpri_now_ns() + (int64_t)30e9;
        while (progress_busy() == 0) {
            CHECK(mpri_now_ns() < deadline);
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        struct timespec settle = {0, 100000000};
        nanosleep(&settle, NULL);
        CHECK(progress_busy() == 1); /* still assembling: two batches never come */
    }
    mpitest_barrier(); /* rank 0 has sent what it sends */
    if (rank == 1) {
        CHECK_OK(mpr_shutdown(false));
        CHECK(progress_busy() == 0);
    }
    mpitest_barrier();
    if (rank == 0) CHECK_OK(mpr_shutdown(false));
    mpr_registry_clear();
    mpitest_barrier();
    if (rank == 0) printf("stop mid-message (%s): 1 passed, 0 failed\n", shape);
    MPI_Finalize();
    return 0;
}
