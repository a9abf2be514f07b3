/* test_rt_codec.c — value encode/decode round trips for every kind and nesting,
 * and rejection (never a crash or out-of-bounds read) of truncated, corrupted
 * and oversized input; wire header validation. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mpri_codec.h"
#include "mpri_tensor.h"
#include "mpri_tensor_batches.h"
#include "mpri_wire.h"

/* The placement the decodes below make: they hold host tensors only, so it
 * stays NULL (test_device_descriptor checks the device case). */
static mpri_tensor_placement_t *placement;

/* Encode v into fresh buf/tl (the caller finis both); returns the code. */
static mpr_err_t encode_fresh(const mpr_value_t *v, mpri_buf_t *buf, mpri_tensor_list_t *tl) {
    mpri_buf_init(buf);
    mpri_tensor_list_init(tl);
    return mpri_value_encode(v, buf, tl, 0);
}

/* Encode v; decode through freshly allocated tensors (data copied the way the
 * transport would receive it). Returns the decoded value. */
static mpr_value_t *round_trip(const mpr_value_t *v) {
    mpri_buf_t buf, descs;
    mpri_tensor_list_t tl;
    mpri_buf_init(&buf);
    mpri_buf_init(&descs);
    mpri_tensor_list_init(&tl);
    assert_int_equal(mpri_value_encode(v, &buf, &tl, 0), MPR_OK);
    mpri_tensor_descs_encode(&tl, &descs);
    mpr_tensor_t *recv[32] = {0};
    assert_true(tl.len <= 32);
    if (tl.len) { /* the spans the encode noted are the sent tensors' own */
        mpri_tensor_span_t walked[32];
        mpri_tensor_spans(tl.items, tl.len, walked);
        assert_memory_equal(tl.spans, walked, sizeof *walked * tl.len);
    }
    mpri_reader_t dr;
    mpri_reader_init(&dr, descs.data, descs.len);
    assert_int_equal(mpri_tensor_descs_decode(&dr, tl.len, recv, &placement), MPR_OK);
    assert_int_equal(dr.left, 0);
    for (uint32_t i = 0; i < tl.len; i++)
        memcpy(mpr_tensor_data(recv[i]), mpr_tensor_data(tl.items[i]), mpr_tensor_nbytes(tl.items[i]));
    mpri_reader_t r;
    mpri_reader_init(&r, buf.data, buf.len);
    mpr_value_t *out = NULL;
    assert_int_equal(mpri_value_decode(&r, recv, tl.len, 0, &out), MPR_OK);
    assert_int_equal(r.left, 0);
    for (uint32_t i = 0; i < tl.len; i++) mpr_tensor_release(recv[i]);
    mpri_tensor_list_fini(&tl);
    mpri_buf_fini(&buf);
    mpri_buf_fini(&descs);
    return out;
}

static mpr_tensor_t *make_tensor(mpr_dtype_t dt, int ndim, const int64_t *shape) {
    mpr_tensor_t *t = mpr_tensor_empty(dt, ndim, shape);
    uint8_t *p = mpr_tensor_data(t);
    for (size_t i = 0; i < mpr_tensor_nbytes(t); i++) p[i] = (uint8_t)(i * 7 + 3);
    return t;
}

static void test_scalars_round_trip(void **state) {
    mpr_value_t *vals[] = {mpr_value_new_none(),       mpr_value_new_bool(true),
                           mpr_value_new_bool(false),  mpr_value_new_int(INT64_MIN),
                           mpr_value_new_int(42),      mpr_value_new_double(-0.125),
                           mpr_value_new_string(""),   mpr_value_new_string("héllo wörld"),
                           mpr_value_new_bytes("\0\xff\x01", 3)};
    for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) {
        mpr_value_t *out = round_trip(vals[i]);
        assert_int_equal(mpr_value_kind(out), mpr_value_kind(vals[i]));
        assert_true(mpr_value_equal(out, vals[i]));
        mpr_value_release(out);
        mpr_value_release(vals[i]);
    }
    mpr_worker_info_t w = {.name = "trainer:3", .rank = 3};
    mpr_value_t *wv = mpr_value_new_worker(&w), *out = round_trip(wv);
    mpr_worker_info_t got;
    assert_int_equal(mpr_value_get_worker(out, &got), MPR_OK);
    assert_string_equal(got.name, "trainer:3");
    assert_int_equal(got.rank, 3);
    mpr_value_release(out);
    mpr_value_release(wv);
}

static void test_tensors_round_trip(void **state) {
    int64_t s0[1] = {0}, s1[1] = {5}, s3[3] = {2, 3, 4};
    mpr_dtype_t dts[] = {MPR_F32, MPR_F64, MPR_I64, MPR_I32, MPR_U8};
    for (size_t d = 0; d < 5; d++) {
        mpr_tensor_t *ts[4] = {make_tensor(dts[d], 0, NULL), make_tensor(dts[d], 1, s0),
                               make_tensor(dts[d], 1, s1), make_tensor(dts[d], 3, s3)};
        for (int i = 0; i < 4; i++) {
            mpr_value_t *v = mpr_value_new_tensor(ts[i]), *out = round_trip(v);
            mpr_tensor_t *t;
            assert_int_equal(mpr_value_get_tensor(out, &t), MPR_OK);
            assert_int_equal(mpr_tensor_dtype(t), dts[d]);
            assert_int_equal(mpr_tensor_ndim(t), mpr_tensor_ndim(ts[i]));
            assert_true(mpr_value_equal(v, out));
            mpr_value_release(out);
            mpr_value_release(v);
            mpr_tensor_release(ts[i]);
        }
    }
    /* empty tensors are contiguous whatever their strides */
    int64_t empty_shape[3] = {3, 0, 2};
    mpr_tensor_t *empty = mpr_tensor_empty(MPR_F32, 3, empty_shape);
    assert_true(mpr_tensor_is_contiguous(empty));
    mpr_value_t *ev = mpr_value_new_tensor(empty), *eout = round_trip(ev);
    assert_true(mpr_value_equal(ev, eout));
    mpr_value_release(eout);
    mpr_value_release(ev);
    mpr_tensor_release(empty);
    /* a non-contiguous view is sent as its contiguous copy */
    int64_t shape[2] = {3, 4}, tshape[2] = {4, 3}, tstrides[2] = {1, 4};
    mpr_tensor_t *base = make_tensor(MPR_F32, 2, shape);
    mpr_tensor_t *tr = mpri_tensor_view(base->storage, MPR_F32, 2, tshape, tstrides, 0);
    assert_false(mpr_tensor_is_contiguous(tr));
    mpr_value_t *v = mpr_value_new_tensor(tr), *out = round_trip(v);
    mpr_tensor_t *t;
    assert_int_equal(mpr_value_get_tensor(out, &t), MPR_OK);
    const float *src = mpr_tensor_data(base), *dst = mpr_tensor_data(t);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++) assert_true(dst[i * 3 + j] == src[j * 4 + i]);
    mpr_value_release(out);
    mpr_value_release(v);
    mpr_tensor_release(tr);
    mpr_tensor_release(base);
}

static mpr_value_t *nest(int depth) {
    if (depth == 0) return mpr_value_new_int(depth);
    return mpr_value_list_of(3, mpr_value_new_string("level"), nest(depth - 1), mpr_value_new_list());
}

static void test_nested_lists_round_trip(void **state) {
    mpr_value_t *v = nest(MPRI_MAX_VALUE_DEPTH), *out = round_trip(v);
    assert_true(mpr_value_equal(v, out));
    mpr_value_release(out);
    mpr_value_release(v);
    /* the same tensor twice is sent once and shared on arrival */
    int64_t s[1] = {4};
    mpr_tensor_t *t = make_tensor(MPR_F32, 1, s);
    v = mpr_value_list_of(2, mpr_value_new_tensor(t), mpr_value_list_of(1, mpr_value_new_tensor(t)));
    out = round_trip(v);
    mpr_tensor_t *a, *b;
    assert_int_equal(mpr_value_get_tensor(mpr_value_list_get(out, 0), &a), MPR_OK);
    assert_int_equal(mpr_value_get_tensor(mpr_value_list_get(mpr_value_list_get(out, 1), 0), &b), MPR_OK);
    assert_ptr_equal(a, b);
    mpr_value_release(out);
    mpr_value_release(v);
    mpr_tensor_release(t);
    /* too deep to encode */
    v = nest(MPRI_MAX_VALUE_DEPTH + 1);
    mpri_buf_t buf;
    mpri_tensor_list_t tl;
    assert_int_equal(encode_fresh(v, &buf, &tl), MPR_ERR_INVALID_ARG);
    mpri_buf_fini(&buf);
    mpri_tensor_list_fini(&tl);
    mpr_value_release(v);
}

static mpr_err_t decode_bytes(const void *data, size_t len, uint32_t ntensors, mpr_tensor_t **tensors) {
    mpri_reader_t r;
    mpri_reader_init(&r, data, len);
    mpr_value_t *out = NULL;
    mpr_err_t e = mpri_value_decode(&r, tensors, ntensors, 0, &out);
    if (e == MPR_OK) mpr_value_release(out);
    return e;
}

static void test_truncated_and_corrupt_rejected(void **state) {
    int64_t s[1] = {3};
    mpr_tensor_t *t = make_tensor(MPR_F64, 1, s);
    mpr_value_t *v = mpr_value_list_of(4, mpr_value_new_string("abc"), mpr_value_new_tensor(t),
                                       mpr_value_new_double(1.5), nest(5));
    mpri_buf_t buf;
    mpri_tensor_list_t tl;
    assert_int_equal(encode_fresh(v, &buf, &tl), MPR_OK);
    /* every strict prefix is rejected as truncated */
    for (size_t n = 0; n < buf.len; n++) {
        uint8_t *copy = malloc(n ? n : 1); /* exact size: ASan catches any overread */
        memcpy(copy, buf.data, n);
        assert_int_equal(decode_bytes(copy, n, tl.len, tl.items), MPR_ERR_DECODE);
        free(copy);
    }
    /* random single-byte corruptions: decode fails cleanly or yields some value */
    srand(7);
    for (int trial = 0; trial < 20000; trial++) {
        uint8_t *copy = malloc(buf.len);
        memcpy(copy, buf.data, buf.len);
        int flips = 1 + rand() % 3;
        for (int f = 0; f < flips; f++) copy[rand() % buf.len] = (uint8_t)rand();
        mpr_err_t e = decode_bytes(copy, buf.len, tl.len, tl.items);
        assert_true(e == MPR_OK || e == MPR_ERR_DECODE || e == MPR_ERR_NOMEM);
        free(copy);
    }
    /* specific corruptions */
    uint8_t unknown_kind[] = {200};
    assert_int_equal(decode_bytes(unknown_kind, 1, 0, NULL), MPR_ERR_DECODE);
    uint8_t bad_tensor_index[] = {MPR_VALUE_TENSOR, 9, 0, 0, 0};
    assert_int_equal(decode_bytes(bad_tensor_index, sizeof bad_tensor_index, tl.len, tl.items), MPR_ERR_DECODE);
    uint8_t huge_list[] = {MPR_VALUE_LIST, 0xff, 0xff, 0xff, 0x7f};
    assert_int_equal(decode_bytes(huge_list, sizeof huge_list, 0, NULL), MPR_ERR_DECODE);
    uint8_t huge_string[] = {MPR_VALUE_STRING, 0xff, 0xff, 0xff, 0xff, 'a'};
    assert_int_equal(decode_bytes(huge_string, sizeof huge_string, 0, NULL), MPR_ERR_DECODE);
    uint8_t bad_bool[] = {MPR_VALUE_BOOL, 7};
    assert_int_equal(decode_bytes(bad_bool, sizeof bad_bool, 0, NULL), MPR_ERR_DECODE);
    uint8_t nul_string[] = {MPR_VALUE_STRING, 2, 0, 0, 0, 'a', 0};
    assert_int_equal(decode_bytes(nul_string, sizeof nul_string, 0, NULL), MPR_ERR_DECODE);
    /* nesting bomb: deeper than the limit is refused, not a stack overflow */
    uint8_t bomb[5 * 1000];
    for (int i = 0; i < 1000; i++) {
        bomb[5 * i] = MPR_VALUE_LIST;
        bomb[5 * i + 1] = 1, bomb[5 * i + 2] = bomb[5 * i + 3] = bomb[5 * i + 4] = 0;
    }
    assert_int_equal(decode_bytes(bomb, sizeof bomb, 0, NULL), MPR_ERR_DECODE);
    mpri_buf_fini(&buf);
    mpri_tensor_list_fini(&tl);
    mpr_value_release(v);
    mpr_tensor_release(t);
}

static void test_tensor_descriptors_rejected(void **state) {
    mpr_tensor_t *out[2] = {0};
    uint8_t bad_dtype[] = {99, 1, 1, 0, 0, 0, 0, 0, 0, 0};
    mpri_reader_t r;
    mpri_reader_init(&r, bad_dtype, sizeof bad_dtype);
    assert_int_equal(mpri_tensor_descs_decode(&r, 1, out, &placement), MPR_ERR_DECODE);
    uint8_t bad_ndim[] = {MPR_F32, 9};
    mpri_reader_init(&r, bad_ndim, sizeof bad_ndim);
    assert_int_equal(mpri_tensor_descs_decode(&r, 1, out, &placement), MPR_ERR_DECODE);
    /* 2^40 elements: oversized, refused before any allocation */
    uint8_t huge[2 + 8] = {MPR_F32, 1};
    int64_t n = (int64_t)1 << 40;
    memcpy(huge + 2, &n, 8);
    mpri_reader_init(&r, huge, sizeof huge);
    assert_int_equal(mpri_tensor_descs_decode(&r, 1, out, &placement), MPR_ERR_DECODE);
    uint8_t negative[2 + 8] = {MPR_F32, 1};
    n = -5;
    memcpy(negative + 2, &n, 8);
    mpri_reader_init(&r, negative, sizeof negative);
    assert_int_equal(mpri_tensor_descs_decode(&r, 1, out, &placement), MPR_ERR_DECODE);
    /* second descriptor truncated: the first tensor is freed again */
    uint8_t two[2 + 8 + 2] = {MPR_F32, 1};
    n = 4;
    memcpy(two + 2, &n, 8);
    two[10] = MPR_F32, two[11] = 1;
    mpri_reader_init(&r, two, sizeof two);
    int64_t live = mpr_tensor_live_count();
    assert_int_equal(mpri_tensor_descs_decode(&r, 2, out, &placement), MPR_ERR_DECODE);
    assert_int_equal(mpr_tensor_live_count(), live);
    assert_null(out[0]);
}

static void test_wire_header(void **state) {
    mpri_wire_header_t h = {.magic = MPRI_WIRE_MAGIC, .version = MPRI_WIRE_VERSION, .kind = MPRI_MSG_CALL,
                            .body_len = 4};
    uint8_t msg[sizeof h + 4] = {0};
    memcpy(msg, &h, sizeof h);
    mpri_wire_header_t out;
    assert_int_equal(mpri_wire_header_read(msg, sizeof msg, &out), MPR_OK);
    assert_int_equal(mpri_wire_header_read(msg, sizeof h - 1, &out), MPR_ERR_DECODE);
    assert_int_equal(mpri_wire_header_read(msg, sizeof h + 3, &out), MPR_ERR_DECODE); /* body too long */
    mpri_wire_header_t bad = h;
    bad.magic = 0x1234;
    memcpy(msg, &bad, sizeof bad);
    assert_int_equal(mpri_wire_header_read(msg, sizeof msg, &out), MPR_ERR_DECODE);
    bad = h;
    bad.version = 9;
    memcpy(msg, &bad, sizeof bad);
    assert_int_equal(mpri_wire_header_read(msg, sizeof msg, &out), MPR_ERR_DECODE);
    assert_non_null(strstr(mpr_last_error(), "version"));
    bad = h;
    bad.kind = MPRI_MSG_KIND_COUNT;
    memcpy(msg, &bad, sizeof bad);
    assert_int_equal(mpri_wire_header_read(msg, sizeof msg, &out), MPR_ERR_DECODE);
    /* the batch count must fit the tensor count (wire version 2) */
    bad = h;
    bad.tensor_count = 3;
    bad.batch_count = 0;
    memcpy(msg, &bad, sizeof bad);
    assert_int_equal(mpri_wire_header_read(msg, sizeof msg, &out), MPR_ERR_DECODE);
    assert_non_null(strstr(mpr_last_error(), "0 tensor batches for 3 tensors"));
    bad.batch_count = 4;
    memcpy(msg, &bad, sizeof bad);
    assert_int_equal(mpri_wire_header_read(msg, sizeof msg, &out), MPR_ERR_DECODE);
    bad.batch_count = 3;
    memcpy(msg, &bad, sizeof bad);
    assert_int_equal(mpri_wire_header_read(msg, sizeof msg, &out), MPR_OK);
    bad = h;
    bad.batch_count = 1; /* batches without tensors */
    memcpy(msg, &bad, sizeof bad);
    assert_int_equal(mpri_wire_header_read(msg, sizeof msg, &out), MPR_ERR_DECODE);
    assert_string_equal(mpri_msg_kind_name(MPRI_MSG_CALL), "call");
    assert_int_not_equal(mpri_hash_name("add"), mpri_hash_name("sub"));
}

static void test_value_accessors(void **state) {
    mpr_value_t *v = mpr_value_new_int(3);
    const char *s;
    assert_int_equal(mpr_value_get_string(v, &s), MPR_ERR_TYPE);
    assert_non_null(strstr(mpr_last_error(), "expected a string value, got int"));
    double d;
    assert_int_equal(mpr_value_get_double(v, &d), MPR_OK);
    assert_true(d == 3.0);
    assert_null(mpr_value_list_get(v, 0));
    assert_int_equal(mpr_value_list_append(v, mpr_value_new_int(1)), MPR_ERR_TYPE);
    mpr_value_release(v);
    mpr_value_t *l = mpr_value_list_of(2, mpr_value_new_int(1), NULL);
    assert_null(l);
    assert_null(mpr_value_list_of(-1));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_INVALID_ARG);
    l = mpr_value_list_of(0);
    assert_int_equal(mpr_value_list_len(l), 0);
    assert_int_equal(mpr_value_kind(l), MPR_VALUE_LIST);
    mpr_value_release(l);
    mpr_value_release(NULL);
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_string("x"));
    int64_t i;
    assert_int_equal(mpr_args_int(args, 0, &i), MPR_ERR_TYPE);
    assert_int_equal(mpr_args_int(args, 1, &i), MPR_ERR_INVALID_ARG);
    assert_non_null(strstr(mpr_last_error(), "argument 1 missing"));
    mpr_value_release(args);
}

/* Found by tests/fuzz/fuzz_wire_decode: an empty tensor (a zero dim) whose
 * other dims multiply past INT64_MAX passed the shape check (numel 0) and
 * overflowed the contiguous strides in mpr_tensor_empty (signed overflow, UB).
 * Such descriptors are now rejected; an empty tensor with large dims whose
 * strides fit is still accepted. */
static void test_fuzz_regressions(void **state) {
    /* the fuzzer's input, minimized: a whole message (header, no body, 256
     * tensors; the first descriptor is F32 [0, 0x6c6f6c6f000000af, ...]);
     * header updated to wire version 2 (version byte, batch_count 1), then 3, 4 */
    static const uint8_t crash_strides[] = {
        0x52, 0x4d, 0x04, 0x01, 0x01, 0x80, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x01, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x00, 0x02, 0x68, 0x65, 0x00, 0x01,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x04, 0x02, 0x68, 0x65, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
        0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xaf, 0x00, 0x00, 0x00,
        0x6c, 0x6f, 0x6c, 0x6f, 0x00, 0x00, 0x6c, 0x6f, 0x6c, 0x6f, 0x6c, 0x6f,
    };
    mpri_wire_header_t h;
    assert_int_equal(mpri_wire_header_read(crash_strides, sizeof crash_strides, &h), MPR_OK);
    assert_int_equal(h.tensor_count, 256);
    mpr_tensor_t *out[256] = {0};
    mpri_reader_t r;
    mpri_reader_init(&r, crash_strides + sizeof h + h.body_len, sizeof crash_strides - sizeof h - h.body_len);
    int64_t live = mpr_tensor_live_count();
    assert_int_equal(mpri_tensor_descs_decode(&r, h.tensor_count, out, &placement), MPR_ERR_DECODE);
    assert_int_equal(mpr_tensor_live_count(), live);
    assert_null(out[0]);
    /* the same defect in one readable descriptor: F32 [0, 2^40, 2^40] */
    uint8_t empty_huge[2 + 3 * 8] = {MPR_F32, 3};
    int64_t dims[3] = {0, (int64_t)1 << 40, (int64_t)1 << 40};
    memcpy(empty_huge + 2, dims, sizeof dims);
    mpri_reader_init(&r, empty_huge, sizeof empty_huge);
    assert_int_equal(mpri_tensor_descs_decode(&r, 1, out, &placement), MPR_ERR_DECODE);
    assert_null(out[0]);
    /* F32 [0, 2^40]: empty, strides fit, still accepted */
    uint8_t empty_ok[2 + 2 * 8] = {MPR_F32, 2};
    memcpy(empty_ok + 2, dims, 2 * sizeof *dims);
    mpri_reader_init(&r, empty_ok, sizeof empty_ok);
    assert_int_equal(mpri_tensor_descs_decode(&r, 1, out, &placement), MPR_OK);
    assert_int_equal(mpr_tensor_numel(out[0]), 0);
    mpr_tensor_release(out[0]);
    assert_int_equal(mpr_tensor_live_count(), live);
}

/* The batch plan (mpri_tensor_batches.h): tensors of 64 KiB or more alone,
 * runs of smaller ones together up to 16 MiB, order kept. */
static void test_batch_plan(void **state) {
    /* sizes in bytes (u8 tensors): small, alone, empty, 300 x 60 KiB (18 MB:
     * two runs), alone (1 MiB), small */
    enum { N = 305 };
    int64_t sizes[N];
    int k = 0;
    sizes[k++] = 4;
    sizes[k++] = 64 << 10;
    sizes[k++] = 0;
    for (int i = 0; i < 300; i++) sizes[k++] = 60 << 10;
    sizes[k++] = 1 << 20;
    sizes[k++] = 3;
    assert_int_equal(k, N);
    mpr_tensor_t *ts[N];
    int64_t live = mpr_tensor_live_count();
    for (int i = 0; i < N; i++) ts[i] = mpr_tensor_empty(MPR_U8, 1, &sizes[i]);
    uint32_t starts[N + 1];
    mpri_tensor_span_t spans[N];
    mpri_tensor_spans(ts, N, spans);
    for (int i = 0; i < N; i++) {
        assert_int_equal(spans[i].nbytes, mpr_tensor_nbytes(ts[i]));
        assert_ptr_equal(spans[i].data, mpr_tensor_data(ts[i]));
    }
    uint32_t nb = mpri_batches_plan(spans, N, starts);
    assert_int_equal(mpri_batches_plan(spans, N, NULL), nb);
    /* [4] [64K] [0, 60K x 273 (16,773,120 bytes <= 16 MiB < + 60K)] [60K x 27] [1M] [3] */
    const uint32_t want[] = {0, 1, 2, 2 + 1 + 273, 303, 304, 305};
    assert_int_equal(nb, 6);
    for (uint32_t b = 0; b <= nb; b++) assert_int_equal(starts[b], want[b]);
    for (uint32_t b = 0; b < nb; b++) {
        size_t bytes = 0;
        for (uint32_t i = starts[b]; i < starts[b + 1]; i++) bytes += mpr_tensor_nbytes(ts[i]);
        assert_true(starts[b + 1] - starts[b] == 1 || bytes <= MPRI_BATCH_MAX_BYTES);
    }
    assert_int_equal(mpri_batches_plan(spans, 0, starts), 0);
    assert_int_equal(starts[0], 0);
    for (int i = 0; i < N; i++) mpr_tensor_release(ts[i]);
    assert_int_equal(mpr_tensor_live_count(), live);
}

/* A tensor named more than once is sent once, also past the linear scan
 * (the list switches to a hash index beyond 16 tensors). */
static void test_tensor_dedup_many(void **state) {
    enum { N = 40 };
    mpr_tensor_t *ts[N];
    mpr_value_t *l = mpr_value_new_list();
    for (int i = 0; i < N; i++) {
        ts[i] = mpr_tensor_empty(MPR_I64, 0, NULL);
        *(int64_t *)mpr_tensor_data(ts[i]) = i;
        mpr_value_list_append(l, mpr_value_new_tensor(ts[i]));
    }
    for (int i = N - 1; i >= 0; i--) mpr_value_list_append(l, mpr_value_new_tensor(ts[i]));
    mpri_buf_t buf;
    mpri_tensor_list_t tl;
    assert_int_equal(encode_fresh(l, &buf, &tl), MPR_OK);
    assert_int_equal(tl.len, N);
    assert_true(tl.nslots > 2 * N);
    mpri_reader_t r;
    mpri_reader_init(&r, buf.data, buf.len);
    mpr_value_t *out = NULL;
    assert_int_equal(mpri_value_decode(&r, tl.items, tl.len, 0, &out), MPR_OK);
    for (int i = 0; i < N; i++) {
        mpr_tensor_t *a, *b;
        assert_int_equal(mpr_value_get_tensor(mpr_value_list_get(out, (size_t)i), &a), MPR_OK);
        assert_int_equal(mpr_value_get_tensor(mpr_value_list_get(out, (size_t)(2 * N - 1 - i)), &b), MPR_OK);
        assert_ptr_equal(a, b);
        assert_int_equal(*(int64_t *)mpr_tensor_data(a), i);
    }
    mpr_value_release(out);
    mpri_tensor_list_fini(&tl);
    mpri_buf_fini(&buf);
    mpr_value_release(l);
    for (int i = 0; i < N; i++) mpr_tensor_release(ts[i]);
}

/* Encode `v` and expect `code` with `text` in the message. */
static void encode_fails(const mpr_value_t *v, mpr_err_t code, const char *text) {
    mpri_buf_t buf;
    mpri_tensor_list_t tl;
    assert_int_equal(encode_fresh(v, &buf, &tl), code);
    assert_non_null(strstr(mpr_last_error(), text));
    mpri_tensor_list_fini(&tl);
    mpri_buf_fini(&buf);
}

/* One message carries at most MPRI_MAX_TENSORS_PER_MESSAGE tensors and
 * MPRI_MAX_MESSAGE_TENSOR_BYTES of their data: the sender refuses more with a
 * clear error (before, the receiver dropped the message and the call hung);
 * the receiver refuses descriptors over the total before allocating any. */
static void test_message_tensor_limits(void **state) {
    int64_t live = mpr_tensor_live_count();
    /* count: 65536 distinct 0-d tensors encode, one more is refused */
    mpr_value_t *many = mpr_value_new_list();
    for (int i = 0; i < MPRI_MAX_TENSORS_PER_MESSAGE; i++) {
        mpr_tensor_t *t = mpr_tensor_empty(MPR_U8, 0, NULL);
        assert_int_equal(mpr_value_list_append(many, mpr_value_new_tensor(t)), MPR_OK);
        mpr_tensor_release(t);
    }
    mpri_buf_t buf;
    mpri_tensor_list_t tl;
    assert_int_equal(encode_fresh(many, &buf, &tl), MPR_OK);
    assert_int_equal(tl.len, MPRI_MAX_TENSORS_PER_MESSAGE);
    assert_int_equal(tl.total_bytes, MPRI_MAX_TENSORS_PER_MESSAGE);
    mpri_tensor_list_fini(&tl);
    mpri_buf_fini(&buf);
    mpr_tensor_t *extra = mpr_tensor_empty(MPR_U8, 0, NULL);
    assert_int_equal(mpr_value_list_append(many, mpr_value_new_tensor(extra)), MPR_OK);
    mpr_tensor_release(extra);
    encode_fails(many, MPR_ERR_INVALID_ARG, "more than 65536 tensors in one message");
    mpr_value_release(many);

    /* bytes: 65 views of one 1 GiB storage (never touched) are 65 GiB */
    const int64_t gib_f32[1] = {(int64_t)1 << 28};
    mpr_tensor_t *base = mpr_tensor_empty(MPR_F32, 1, gib_f32);
    assert_non_null(base);
    mpr_value_t *big = mpr_value_new_list();
    for (int i = 0; i < 65; i++) {
        mpr_tensor_t *v = mpri_tensor_view(base->storage, MPR_F32, 1, gib_f32, NULL, 0);
        assert_int_equal(mpr_value_list_append(big, mpr_value_new_tensor(v)), MPR_OK);
        mpr_tensor_release(v);
    }
    encode_fails(big, MPR_ERR_INVALID_ARG, "exceed the 64 GiB limit");
    mpr_value_release(big);
    mpr_tensor_release(base);

    /* receiver: 33 descriptors of F32 [2^29 - 1] (just under 2 GiB each) are
     * 66 GiB in all: refused, nothing allocated */
    uint8_t descs[33][2 + 8];
    int64_t n = ((int64_t)1 << 29) - 1;
    for (int i = 0; i < 33; i++) {
        descs[i][0] = MPR_F32;
        descs[i][1] = 1;
        memcpy(&descs[i][2], &n, sizeof n);
    }
    mpr_tensor_t *out[33] = {0};
    mpri_reader_t r;
    mpri_reader_init(&r, descs, sizeof descs);
    assert_int_equal(mpri_tensor_descs_decode(&r, 33, out, &placement), MPR_ERR_DECODE);
    assert_non_null(strstr(mpr_last_error(), "exceed the 64 GiB limit"));
    assert_null(out[0]);
    /* the same descriptors one by one are each fine (shape check only) */
    mpri_reader_init(&r, descs, sizeof descs[0]);
    assert_int_equal(mpri_tensor_descs_decode(&r, 1, out, &placement), MPR_OK);
    assert_int_equal(mpr_tensor_nbytes(out[0]), (size_t)n * 4);
    mpr_tensor_release(out[0]);
    assert_int_equal(mpr_tensor_live_count(), live);
}

/* A descriptor with the device bit: the tensor is allocated on the host and
 * listed in the placement (its requires_grad flag kept there for the device
 * copy); applying it without that device fails with a message naming it,
 * again at a second apply. A device index over 127, or a missing one, is
 * malformed. */
static void test_device_descriptor(void **state) {
    (void)state;
    int64_t live = mpr_tensor_live_count();
    uint8_t d[3 + 8] = {MPR_F32 | MPRI_DESC_ON_DEVICE | MPRI_DESC_REQUIRES_GRAD, 1, 3};
    int64_t n = 5;
    memcpy(&d[3], &n, sizeof n);
    mpr_tensor_t *out[1] = {0};
    mpri_reader_t r;
    mpri_reader_init(&r, d, sizeof d);
    mpri_tensor_placement_t *p = NULL;
    assert_int_equal(mpri_tensor_descs_decode(&r, 1, out, &p), MPR_OK);
    assert_int_equal(r.left, 0);
    assert_non_null(p);
    assert_int_equal(p->count, 1);
    assert_int_equal(p->items[0].device, 3);
    assert_true(p->items[0].requires_grad);
    assert_int_equal(mpr_tensor_device(out[0]), -1);
    assert_int_equal(mpr_tensor_numel(out[0]), 5);
    assert_int_not_equal(mpri_tensor_placement_apply(p, out), MPR_OK);
    assert_non_null(strstr(mpr_last_error(), "cuda:3"));
    assert_int_not_equal(mpri_tensor_placement_apply(p, out), MPR_OK);
    assert_int_equal(mpr_tensor_device(out[0]), -1); /* left as it was */
    free(p);
    mpr_tensor_release(out[0]);
    out[0] = NULL;
    d[2] = 200;
    mpri_reader_init(&r, d, sizeof d);
    assert_int_equal(mpri_tensor_descs_decode(&r, 1, out, &p), MPR_ERR_DECODE);
    assert_null(p);
    assert_null(out[0]);
    mpri_reader_init(&r, d, 2); /* the device byte is missing */
    assert_int_equal(mpri_tensor_descs_decode(&r, 1, out, &p), MPR_ERR_DECODE);
    assert_null(p);
    assert_int_equal(mpr_tensor_live_count(), live);
}

/* A batch of small tensors is decoded into one block (tensor_block.c): each
 * tensor aligned for its dtype, back to back when alignment allows (so one
 * plain receive fills them), each with its own storage and version counter;
 * writing one leaves its neighbours alone; released in any order (the block
 * goes with the last: ASan and the live count check it), a view outliving
 * its base keeps the bytes. A tensor of 64 KiB or more gets its own storage. */
static void test_small_tensors_share_a_block(void **state) {
    (void)state;
    int64_t live0 = mpr_tensor_live_count();
    mpr_value_t *list = mpr_value_new_list();
    const mpr_dtype_t dts[5] = {MPR_F32, MPR_F32, MPR_U8, MPR_F64, MPR_F32};
    const int64_t lens[5] = {4, 8, 3, 2, 5};
    for (int i = 0; i < 5; i++) {
        mpr_tensor_t *t = make_tensor(dts[i], 1, &lens[i]);
        assert_int_equal(mpr_value_list_append(list, mpr_value_new_tensor(t)), MPR_OK);
        mpr_tensor_release(t);
    }
    const int64_t big = 1 << 14; /* 64 KiB of f32: alone */
    mpr_tensor_t *bt = make_tensor(MPR_F32, 1, &big);
    assert_int_equal(mpr_value_list_append(list, mpr_value_new_tensor(bt)), MPR_OK);
    mpr_tensor_release(bt);
    mpri_buf_t buf, descs;
    mpri_tensor_list_t tl;
    assert_int_equal(encode_fresh(list, &buf, &tl), MPR_OK);
    mpri_buf_init(&descs);
    mpri_tensor_descs_encode(&tl, &descs);
    mpr_tensor_t *recv[6] = {0};
    mpri_reader_t dr;
    mpri_reader_init(&dr, descs.data, descs.len);
    mpri_tensor_span_t spans[6], walked[6];
    assert_int_equal(mpri_tensor_descs_decode_spans(&dr, 6, recv, spans, &placement), MPR_OK);
    mpri_tensor_spans(recv, 6, walked); /* the spans the decode wrote are the tensors' */
    assert_memory_equal(spans, walked, sizeof spans);
    uint32_t starts[7];
    assert_int_equal(mpri_batches_plan(spans, 6, starts), 2);
    assert_int_equal(starts[1], 5);
    for (int i = 0; i < 6; i++) {
        assert_true(recv[i]->storage->block == (i < 5 ? recv[0]->storage->block : NULL));
        assert_int_equal((uintptr_t)mpr_tensor_data(recv[i]) % mpr_dtype_size(dts[i < 5 ? i : 0]), 0);
        for (int j = 0; j < i; j++) assert_ptr_not_equal(recv[i]->storage, recv[j]->storage);
    }
    uint8_t *d[5];
    for (int i = 0; i < 5; i++) d[i] = mpr_tensor_data(recv[i]);
    assert_ptr_equal(d[1], d[0] + 16); /* f32 after f32: back to back */
    assert_ptr_equal(d[2], d[1] + 32); /* u8 after f32 */
    assert_ptr_equal(d[3], d[2] + 8);  /* f64 after 3 bytes: the next multiple of 8 */
    assert_ptr_equal(d[4], d[3] + 16);
    /* Own version counters and bytes. */
    atomic_fetch_add(&recv[1]->storage->version, 1);
    assert_int_equal(atomic_load(&recv[0]->storage->version), 0);
    assert_int_equal(atomic_load(&recv[2]->storage->version), 0);
    for (int i = 0; i < 5; i++) memset(d[i], i + 1, mpr_tensor_nbytes(recv[i]));
    memset(d[2], 0xab, 3);
    assert_int_equal(d[1][31], 2);
    assert_int_equal(d[3][0], 4);
    /* A view of one tensor outlives every tensor of the block. */
    mpr_tensor_t *view = mpri_tensor_view(recv[3]->storage, MPR_F64, 1, (int64_t[]){1}, NULL, 1);
    assert_non_null(view);
    ((double *)d[3])[1] = 2.5;
    const int order[6] = {2, 0, 5, 4, 1, 3};
    for (int k = 0; k < 6; k++) mpr_tensor_release(recv[order[k]]);
    assert_true(((double *)mpr_tensor_data(view))[0] == 2.5);
    mpr_tensor_release(view);
    mpri_tensor_list_fini(&tl);
    mpri_buf_fini(&buf);
    mpri_buf_fini(&descs);
    mpr_value_release(list);
    assert_int_equal(mpr_tensor_live_count(), live0);
}

/* Releases batched by one thread (a dying list's items): the live count
 * and the block references are dropped at the flush, runs of tensors from
 * the same block (A A, then B, then A again) each drop their block once,
 * a tensor still referenced elsewhere survives the batch with its block,
 * and every block goes with its last tensor (ASan: no use after free when
 * the survivor is read, no leak of the small blocks). */
static void test_release_batch(void **state) {
    (void)state;
    int64_t live0 = mpr_tensor_live_count();
    const int64_t len = 4;
    mpri_tensor_block_t *blocks[2];
    mpr_tensor_t *ts[2][3];
    for (int b = 0; b < 2; b++) {
        blocks[b] = mpri_tensor_block_create(3 * 16, 3);
        assert_non_null(blocks[b]);
        for (uint32_t i = 0; i < 3; i++) {
            ts[b][i] = mpri_tensor_block_carve(blocks[b], i, 16 * i, MPR_F32, 1, &len);
            assert_non_null(ts[b][i]);
            memset(mpr_tensor_data(ts[b][i]), 10 * b + (int)i, 16);
        }
        mpri_tensor_block_carved(blocks[b]); /* counted live; the creator's reference dropped */
    }
    assert_int_equal(mpr_tensor_live_count(), live0 + 6);
    mpr_tensor_t *survivor = mpr_tensor_retain(ts[0][2]);
    mpri_tensor_release_batch_t batch = {0};
    mpr_tensor_t *order[6] = {ts[0][0], ts[0][1], ts[1][0], ts[0][2], ts[1][1], ts[1][2]};
    for (int i = 0; i < 6; i++) mpri_tensor_release_deferred(order[i], &batch);
    assert_int_equal(batch.live_tensors, 5);
    assert_int_equal(mpr_tensor_live_count(), live0 + 6); /* not yet taken off */
    mpri_tensor_release_flush(&batch);
    assert_int_equal(batch.live_tensors, 0);
    assert_null(batch.block);
    assert_int_equal(mpr_tensor_live_count(), live0 + 1);
    const uint8_t *d = mpr_tensor_data(survivor);
    for (int i = 0; i < 16; i++) assert_int_equal(d[i], 2);
    mpr_tensor_release(survivor);
    assert_int_equal(mpr_tensor_live_count(), live0);
    mpri_tensor_release_flush(&batch); /* an empty batch: nothing to drop */
    assert_int_equal(mpr_tensor_live_count(), live0);
}

/* Several threads drop their references to one tensor and one list at
 * the same moment: exactly one of them frees each (mpri_refcount.h: the
 * last reference is dropped without a locked instruction only by the
 * thread that reads the count at 1). Two frees abort (magic check, ASan),
 * none leaves the live count up. */
enum { RELEASERS = 4 };
typedef struct {
    pthread_barrier_t *start;
    mpr_tensor_t *t;
    mpr_value_t *v;
} releaser_t;

static void *release_together(void *arg) {
    releaser_t *r = arg;
    pthread_barrier_wait(r->start);
    mpr_value_release(r->v);
    mpr_tensor_release(r->t);
    return NULL;
}

static void test_concurrent_last_release(void **state) {
    (void)state;
    int64_t live0 = mpr_tensor_live_count();
    const int64_t len = 16;
    for (int round = 0; round < 500; round++) {
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, RELEASERS);
        mpr_tensor_t *t = make_tensor(MPR_F32, 1, &len);
        mpr_value_t *v = mpr_value_list_of(2, mpr_value_new_tensor(t), mpr_value_new_int(round));
        assert_non_null(v);
        for (int i = 1; i < RELEASERS; i++) {
            mpr_tensor_retain(t);
            mpr_value_retain(v);
        }
        pthread_t th[RELEASERS];
        releaser_t r[RELEASERS];
        for (int i = 0; i < RELEASERS; i++) {
            r[i] = (releaser_t){.start = &start, .t = t, .v = v};
            assert_int_equal(pthread_create(&th[i], NULL, release_together, &r[i]), 0);
        }
        for (int i = 0; i < RELEASERS; i++) pthread_join(th[i], NULL);
        pthread_barrier_destroy(&start);
        assert_int_equal(mpr_tensor_live_count(), live0);
    }
}

/* The tensor items of a decoded list share one slab of value structs
 * (value.c): distinct tensors' items come from it, repeats beyond the
 * message's tensor count and one-item lists from the heap; each value is
 * released on its own, in any order, and one that outlives its list keeps
 * working (ASan and the live count check the slab goes with the last). A
 * decode that fails partway releases the slab's values. */
/* The wire form of a list of three tensor items whose third index (99) is
 * out of range for the three tensors the decodes below are given. */
enum { BAD_LIST_BYTES = 1 + 4 + 3 * 5 };
static void write_bad_list(uint8_t bad[BAD_LIST_BYTES]) {
    bad[0] = MPR_VALUE_LIST;
    uint32_t three = 3;
    memcpy(bad + 1, &three, 4);
    const uint32_t idx[3] = {0, 1, 99};
    for (int i = 0; i < 3; i++) {
        bad[5 + 5 * i] = MPR_VALUE_TENSOR;
        memcpy(bad + 6 + 5 * i, &idx[i], 4);
    }
}

/* mpri_value_decode_taking: the values take over the first reference of
 * each tensor they name (its entry becomes NULL), later items naming the
 * same tensor take references of their own, tensors the value does not
 * name stay the caller's; a failed decode consumes what it took and leaks
 * nothing. References are counted through the tensors' refcounts. */
static void test_decode_taking(void **state) {
    (void)state;
    int64_t live0 = mpr_tensor_live_count();
    enum { N = 70 }; /* past the 64 tracked on the stack */
    mpr_tensor_t *ts[N + 1];
    for (int i = 0; i <= N; i++) {
        int64_t len = 2;
        ts[i] = make_tensor(MPR_F32, 1, &len);
    }
    /* The wire form of [t0, t1, ..., t(N-1), t0, t1]; tensor N is named by none. */
    mpri_buf_t buf;
    mpri_buf_init(&buf);
    mpri_buf_put_u8(&buf, MPR_VALUE_LIST);
    mpri_buf_put_u32(&buf, N + 2);
    for (uint32_t i = 0; i < N + 2; i++) {
        mpri_buf_put_u8(&buf, MPR_VALUE_TENSOR);
        mpri_buf_put_u32(&buf, i % N);
    }
    mpr_tensor_t *recv[N + 1];
    memcpy(recv, ts, sizeof recv);
    mpri_reader_t r;
    mpri_reader_init(&r, buf.data, buf.len);
    mpr_value_t *out = NULL;
    assert_int_equal(mpri_value_decode_taking(&r, recv, N + 1, 0, &out), MPR_OK);
    assert_int_equal(r.left, 0);
    for (int i = 0; i < N; i++) assert_null(recv[i]);
    assert_ptr_equal(recv[N], ts[N]);
    for (size_t i = 0; i < N + 2; i++) {
        mpr_tensor_t *t = NULL;
        assert_int_equal(mpr_value_get_tensor(mpr_value_list_get(out, i), &t), MPR_OK);
        assert_ptr_equal(t, ts[i % N]);
    }
    /* Named twice: the taken reference and one of its own; once: the taken one. */
    assert_int_equal(atomic_load(&ts[0]->refcount), 2);
    assert_int_equal(atomic_load(&ts[1]->refcount), 2);
    assert_int_equal(atomic_load(&ts[2]->refcount), 1);
    assert_int_equal(atomic_load(&ts[N]->refcount), 1);
    mpr_value_release(out);
    mpr_tensor_release(recv[N]);
    assert_int_equal(mpr_tensor_live_count(), live0);

    /* A list whose third item is out of range: the first two were taken
     * and are released with the failed decode; the third stays the caller's. */
    for (int i = 0; i < 3; i++) {
        int64_t len = 2;
        ts[i] = make_tensor(MPR_F32, 1, &len);
    }
    uint8_t bad[BAD_LIST_BYTES];
    write_bad_list(bad);
    memcpy(recv, ts, 3 * sizeof *recv);
    mpri_reader_init(&r, bad, sizeof bad);
    out = NULL;
    assert_int_equal(mpri_value_decode_taking(&r, recv, 3, 0, &out), MPR_ERR_DECODE);
    assert_null(out);
    assert_null(recv[0]);
    assert_null(recv[1]);
    assert_ptr_equal(recv[2], ts[2]);
    mpr_tensor_release(recv[2]);
    assert_int_equal(mpr_tensor_live_count(), live0);
    mpri_buf_fini(&buf);
}

static void test_tensor_values_share_a_slab(void **state) {
    (void)state;
    int64_t live0 = mpr_tensor_live_count();
    enum { N = 20 };
    mpr_tensor_t *ts[N];
    mpr_value_t *list = mpr_value_new_list();
    for (int i = 0; i < N; i++) {
        int64_t len = 1 + i % 5;
        ts[i] = make_tensor(MPR_F32, 1, &len);
        assert_int_equal(mpr_value_list_append(list, mpr_value_new_tensor(ts[i])), MPR_OK);
    }
    for (int i = 0; i < 3; i++) assert_int_equal(mpr_value_list_append(list, mpr_value_new_tensor(ts[0])), MPR_OK);
    assert_int_equal(mpr_value_list_append(list, mpr_value_list_of(1, mpr_value_new_tensor(ts[1]))), MPR_OK);
    assert_int_equal(mpr_value_list_append(list, mpr_value_new_int(9)), MPR_OK);
    mpr_value_t *out = round_trip(list);
    assert_int_equal(mpr_value_list_len(out), N + 5);
    const mpr_value_t *first = mpr_value_list_get(out, 0);
    assert_non_null(first->slab);
    for (int i = 0; i < N; i++) assert_ptr_equal(mpr_value_list_get(out, (size_t)i)->slab, first->slab);
    for (int i = N; i < N + 3; i++) assert_null(mpr_value_list_get(out, (size_t)i)->slab); /* repeats */
    assert_null(mpr_value_list_get(mpr_value_list_get(out, N + 3), 0)->slab);           /* one item */
    assert_true(mpr_value_equal(out, list));
    /* Items outliving the list, released after it in any order. */
    mpr_value_t *keep5 = mpr_value_retain(mpr_value_list_get(out, 5));
    mpr_value_t *keep21 = mpr_value_retain(mpr_value_list_get(out, 21));
    mpr_value_t *keep0 = mpr_value_retain(mpr_value_list_get(out, 0));
    mpr_value_release(out);
    mpr_tensor_t *t5 = NULL;
    assert_int_equal(mpr_value_get_tensor(keep5, &t5), MPR_OK);
    assert_memory_equal(mpr_tensor_data(t5), mpr_tensor_data(ts[5]), mpr_tensor_nbytes(ts[5]));
    mpr_value_release(keep0);
    mpr_value_release(keep21);
    mpr_value_release(keep5);
    /* A list whose third tensor item is out of range: nothing leaks. */
    uint8_t bad[BAD_LIST_BYTES];
    write_bad_list(bad);
    mpri_reader_t r;
    mpri_reader_init(&r, bad, sizeof bad);
    mpr_value_t *v = NULL;
    assert_int_equal(mpri_value_decode(&r, ts, 2, 0, &v), MPR_ERR_DECODE);
    assert_null(v);
    for (int i = 0; i < N; i++) mpr_tensor_release(ts[i]);
    mpr_value_release(list);
    assert_int_equal(mpr_tensor_live_count(), live0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalars_round_trip),
        cmocka_unit_test(test_tensors_round_trip),
        cmocka_unit_test(test_nested_lists_round_trip),
        cmocka_unit_test(test_truncated_and_corrupt_rejected),
        cmocka_unit_test(test_tensor_descriptors_rejected),
        cmocka_unit_test(test_wire_header),
        cmocka_unit_test(test_value_accessors),
        cmocka_unit_test(test_fuzz_regressions),
        cmocka_unit_test(test_message_tensor_limits),
        cmocka_unit_test(test_tensor_dedup_many),
        cmocka_unit_test(test_batch_plan),
        cmocka_unit_test(test_device_descriptor),
        cmocka_unit_test(test_small_tensors_share_a_block),
        cmocka_unit_test(test_tensor_values_share_a_slab),
        cmocka_unit_test(test_decode_taking),
        cmocka_unit_test(test_release_batch),
        cmocka_unit_test(test_concurrent_last_release),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
