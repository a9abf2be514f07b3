/* test_dist_grad_wire.c — gradients in dist autograd's backward messages
 * (autograd/dist/grad_wire.c): each form written and read back (a plain
 * tensor, a strided one made contiguous, a broadcast one kept as its one-row
 * tensor plus sizes and expanded again with stride 0, a single value with
 * no tensor at all, f32 and f64); answers collected, written as a reply
 * (each tensor once), decoded and read back group by group; every malformed
 * input — cut at each byte, unknown form, index past the tensors, dims that
 * disagree, a bad dtype, too many dims, a shape too large (found by the
 * fuzzer), a negative size, answers that are not [bytes, tensor...], a
 * reply too short for its count — refused with MPR_ERR_DECODE and nothing
 * leaked. Also a message's tensor list: inline, moved, grown. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dist/mpri_grad_wire.h"
#include "mpirpc/tensor_ops.h"
#include "mpri_codec.h"
#include "mpri_runtime.h"
#include "mpri_tensor.h"

/* A few gradients of every form (new references). */
enum { N_GRADS = 5 };
static void make_grads(mpr_tensor_t **g) {
    mpr_scope_begin();
    float vals[6] = {1, 2, 3, 4, 5, 6};
    g[0] = mpr_scope_keep(mpr_from_buffer(MPR_F32, MPR_SHAPE(2, 3), vals));
    /* strided: the transpose of a 2x3 */
    g[1] = mpr_scope_keep(mpr_transpose(g[0], 0, 1));
    /* broadcast: a 1x3 row expanded to 4x3 (stride 0 on dim 0) */
    mpr_tensor_t *row = mpr_from_buffer(MPR_F32, MPR_SHAPE(1, 3), (float[]){7, 8, 9});
    g[2] = mpr_scope_keep(mpr_expand(row, 2, (const int64_t[]){4, 3}));
    /* single values: every dim stride 0 (sum's gradient) */
    mpr_tensor_t *one32 = mpr_from_buffer(MPR_F32, MPR_SHAPE(1, 1), (float[]){0.5f});
    g[3] = mpr_scope_keep(mpr_expand(one32, 2, (const int64_t[]){8, 8}));
    mpr_tensor_t *one64 = mpr_from_buffer(MPR_F64, MPR_SHAPE(1), (double[]){-2.25});
    g[4] = mpr_scope_keep(mpr_expand(one64, 1, (const int64_t[]){5}));
    mpr_scope_end();
}

static void release_all(mpr_tensor_t **g, int n) {
    for (int i = 0; i < n; i++) mpr_tensor_release(g[i]);
}

static void assert_same_values(mpr_tensor_t *a, mpr_tensor_t *b) {
    assert_int_equal(mpr_tensor_dtype(a), mpr_tensor_dtype(b));
    assert_int_equal(mpr_tensor_ndim(a), mpr_tensor_ndim(b));
    for (int d = 0; d < mpr_tensor_ndim(a); d++) assert_int_equal(mpr_tensor_shape(a)[d], mpr_tensor_shape(b)[d]);
    assert_true(mpr_allclose(a, b, 0, 0));
}

/* The gradients of make_grads written as a request carries them: the bytes
 * to `buf`, their tensors to `tl` (both initialized here). */
static void write_grads(mpr_tensor_t **g, mpri_buf_t *buf, mpri_tensor_list_t *tl) {
    make_grads(g);
    mpri_buf_init(buf);
    mpri_tensor_list_init(tl);
    assert_int_equal(mpri_grads_write(buf, mpri_grad_tensor_list_add, tl, N_GRADS, g), MPR_OK);
}

/* Written into a message's buffer and tensor list, read back from them. */
static void test_round_trip_every_form(void **state) {
    (void)state;
    int64_t live = mpr_tensor_live_count();
    mpr_tensor_t *g[N_GRADS];
    mpri_buf_t buf;
    mpri_tensor_list_t tl;
    write_grads(g, &buf, &tl);
    /* tensors: the plain one, the strided one's contiguous copy, the broadcast's row; none for singles */
    assert_int_equal(tl.len, 3);
    assert_int_equal(mpr_tensor_numel(tl.items[2]), 3);
    mpri_grads_reader_t rd = {.tensors = tl.items, .ntensors = tl.len};
    mpri_reader_init(&rd.r, buf.data, buf.len);
    uint32_t k = 0;
    assert_int_equal(mpri_grads_read_count(&rd, &k), MPR_OK);
    assert_int_equal(k, N_GRADS);
    mpr_tensor_t *back[N_GRADS];
    for (int i = 0; i < N_GRADS; i++) {
        assert_int_equal(mpri_grads_read_one(&rd, &back[i]), MPR_OK);
        assert_same_values(back[i], g[i]);
    }
    assert_int_equal(rd.r.left, 0);
    assert_ptr_equal(back[0], tl.items[0]); /* a plain tensor is the received one, no copy */
    /* broadcast and single values come back as stride-0 views (no copy of 4x3 or 8x8) */
    assert_int_equal(mpr_tensor_strides(back[2])[0], 0);
    assert_int_equal(mpr_tensor_strides(back[2])[1], 1);
    assert_int_equal(mpr_tensor_strides(back[3])[0], 0);
    assert_int_equal(mpr_tensor_strides(back[3])[1], 0);
    assert_int_equal(mpr_tensor_dtype(back[4]), MPR_F64);
    release_all(back, N_GRADS);
    release_all(g, N_GRADS);
    mpri_tensor_list_fini(&tl);
    mpri_buf_fini(&buf);
    assert_int_equal(mpr_tensor_live_count(), live);
}

/* Every prefix of a valid layout, and single corrupted fields: refused
 * with MPR_ERR_DECODE, no tensor made or kept. */
static void test_malformed_refused(void **state) {
    (void)state;
    mpr_tensor_t *g[N_GRADS];
    mpri_buf_t buf;
    mpri_tensor_list_t tl;
    write_grads(g, &buf, &tl);
    int64_t live = mpr_tensor_live_count();
    for (size_t cut = 0; cut < buf.len; cut++) {
        mpri_grads_reader_t rd = {.tensors = tl.items, .ntensors = tl.len};
        mpri_reader_init(&rd.r, buf.data, cut);
        uint32_t k = 0;
        mpr_err_t e = mpri_grads_read_count(&rd, &k);
        mpr_tensor_t *got[N_GRADS] = {0};
        int n = 0;
        while (!e && n < (int)k) {
            e = mpri_grads_read_one(&rd, &got[n]);
            if (!e) n++;
        }
        assert_int_equal(e, MPR_ERR_DECODE);
        assert_non_null(strstr(mpr_last_error(), "malformed"));
        release_all(got, n);
        assert_int_equal(mpr_tensor_live_count(), live);
    }
    /* Hand-made single gradients: u32 1, then the gradient. */
    struct {
        const char *why;
        uint8_t bytes[64];
        size_t len;
        uint32_t ntensors;
    } bad[] = {
        {"unknown form", {1, 0, 0, 0, 9}, 5, 1},
        {"tensor index past the tensors", {1, 0, 0, 0, 0, 1, 0, 0, 0}, 9, 1},
        {"broadcast dims differ from the tensor's", {1, 0, 0, 0, 1, 0, 0, 0, 0, 1, 4, 0, 0, 0, 0, 0, 0, 0}, 18, 1},
        {"broadcast that does not expand", {1, 0, 0, 0, 1, 0, 0, 0, 0, 2, 3, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0},
         26, 1},
        {"single of a bad dtype", {1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 99, 0}, 15, 0},
        {"more dims than MPR_MAX_DIMS", {1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, MPR_F32, 9}, 15, 0},
        {"a shape too large", {1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, MPR_F32, 2, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0,
                               0, 0, 1, 0, 0},
         31, 0},
        {"a negative size", {1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, MPR_F32, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                             0xff, 0xff},
         23, 0},
    };
    mpr_tensor_t *plain = g[0]; /* a 2x3 */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mpri_grads_reader_t rd = {.tensors = &plain, .ntensors = bad[i].ntensors};
        mpri_reader_init(&rd.r, bad[i].bytes, bad[i].len);
        uint32_t k = 0;
        mpr_tensor_t *got = NULL;
        assert_int_equal(mpri_grads_read_count(&rd, &k), MPR_OK);
        assert_int_equal(k, 1);
        print_message("%s\n", bad[i].why);
        assert_int_equal(mpri_grads_read_one(&rd, &got), MPR_ERR_DECODE);
        assert_null(got);
        assert_int_equal(mpr_tensor_live_count(), live);
    }
    release_all(g, N_GRADS);
    mpri_tensor_list_fini(&tl);
    mpri_buf_fini(&buf);
}

/* A reply as the requester's progress thread hands it over: `body` and
 * its tensors (borrowed). */
static mpri_msg_t reply_of(mpri_buf_t *body, mpri_tensor_list_t *tl) {
    mpri_msg_t msg;
    memset(&msg, 0, sizeof msg);
    msg.hdr.kind = MPRI_MSG_BACKWARD_AUTOGRAD_RESP;
    msg.hdr.flags = MPRI_FLAG_RESPONSE;
    msg.hdr.body_len = (uint32_t)body->len;
    msg.hdr.tensor_count = tl->len;
    msg.body = body->data;
    msg.tensors = tl->items;
    return msg;
}

/* Answers: groups collected on the answering worker, written as the reply
 * (each tensor once), decoded into the value the requester's future holds
 * and read back group by group with their message ids. */
static void test_answers_round_trip(void **state) {
    (void)state;
    int64_t live = mpr_tensor_live_count();
    mpr_tensor_t *g[N_GRADS];
    make_grads(g);
    for (int none = 1; none >= 0; none--) {
        mpri_grad_answers_t a;
        mpri_grad_answers_init(&a);
        const uint64_t ids[3] = {41, 7, 9};
        const int counts[3] = {2, 3, 1};
        mpr_tensor_t *const *firsts[3] = {g, g + 2, g}; /* the third group repeats g[0] */
        int groups = none ? 0 : 3;
        for (int i = 0; i < groups; i++)
            assert_int_equal(mpri_grad_answers_add(&a, ids[i], counts[i], firsts[i]), MPR_OK);
        mpri_buf_t body;
        mpri_buf_init(&body);
        mpri_tensor_list_t tl;
        mpri_tensor_list_init(&tl);
        assert_int_equal(mpri_grad_answers_write(&a, &body, &tl), MPR_OK);
        mpri_grad_answers_fini(&a);
        /* the plain tensor (once), the strided one's copy, the broadcast's row */
        assert_int_equal(tl.len, none ? 0 : 3);
        mpri_msg_t msg = reply_of(&body, &tl);
        mpr_value_t *v = NULL;
        assert_int_equal(mpri_grad_answers_decode(&msg, &v), MPR_OK);
        assert_int_equal(mpr_value_list_len(v), 1 + tl.len);
        mpri_grads_reader_t rd;
        mpr_tensor_t *stack[2], **heap = NULL; /* 3 tensors: more than the stack room, so the heap is used */
        uint32_t n = 99;
        assert_int_equal(mpri_grad_answers_open(v, &rd, &n, stack, 2, &heap), MPR_OK);
        assert_true(none ? heap == NULL : heap != NULL);
        assert_int_equal(n, (uint32_t)groups);
        for (uint32_t i = 0; i < n; i++) {
            uint64_t id = 0;
            uint32_t k = 0;
            assert_int_equal(mpri_grad_answers_next(&rd, &id), MPR_OK);
            assert_int_equal(id, ids[i]);
            assert_int_equal(mpri_grads_read_count(&rd, &k), MPR_OK);
            assert_int_equal(k, (uint32_t)counts[i]);
            for (uint32_t j = 0; j < k; j++) {
                mpr_tensor_t *t = NULL;
                assert_int_equal(mpri_grads_read_one(&rd, &t), MPR_OK);
                assert_same_values(t, firsts[i][j]);
                mpr_tensor_release(t);
            }
        }
        assert_int_equal(rd.r.left, 0);
        free(heap);
        mpr_value_release(v);
        /* a body too short for its count is refused */
        msg.hdr.body_len = 3;
        v = NULL;
        assert_int_equal(mpri_grad_answers_decode(&msg, &v), MPR_ERR_DECODE);
        assert_null(v);
        mpri_tensor_list_fini(&tl);
        mpri_buf_fini(&body);
    }
    release_all(g, N_GRADS);
    assert_int_equal(mpr_tensor_live_count(), live);
}

/* Values that are not answers: refused, nothing allocated. */
static void test_answers_malformed(void **state) {
    (void)state;
    mpr_tensor_t *stack[4], **heap = NULL;
    mpri_grads_reader_t rd;
    uint32_t n = 0;
    mpr_value_t *not_list = mpr_value_new_int(3);
    mpr_value_t *no_bytes = mpr_value_list_of(1, mpr_value_new_int(3));
    mpr_value_t *no_count = mpr_value_list_of(1, mpr_value_new_bytes("ab", 2));
    mpr_value_t *not_tensor = mpr_value_list_of(2, mpr_value_new_bytes("\0\0\0\0", 4), mpr_value_new_int(1));
    mpr_value_t *bad[] = {not_list, no_bytes, no_count, not_tensor};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(mpri_grad_answers_open(bad[i], &rd, &n, stack, 4, &heap), MPR_ERR_DECODE);
        assert_null(heap);
        mpr_value_release(bad[i]);
    }
}

/* A message's tensor list keeps its first entries inline, moves with
 * them (a send in flight takes the list over), and grows to the heap. */
static void test_tensor_list_inline_move_grow(void **state) {
    (void)state;
    int64_t live = mpr_tensor_live_count();
    mpr_tensor_t *ts[5];
    for (int i = 0; i < 5; i++) ts[i] = mpr_full(MPR_F32, 1, (const int64_t[]){i + 1}, i);
    for (int grown = 0; grown <= 1; grown++) {
        int n = grown ? 5 : MPRI_TENSOR_LIST_INLINE;
        mpri_tensor_list_t a, b;
        mpri_tensor_list_init(&a);
        for (int i = 0; i < n; i++) {
            uint32_t index = 99;
            assert_int_equal(mpri_tensor_list_add(&a, ts[i], &index), MPR_OK);
            assert_int_equal(index, (uint32_t)i);
        }
        uint32_t again = 99;
        assert_int_equal(mpri_tensor_list_add(&a, ts[0], &again), MPR_OK); /* once only */
        assert_int_equal(again, 0);
        assert_true((a.items == a.inline_items) == !grown);
        mpri_tensor_list_move(&b, &a);
        assert_int_equal(a.len, 0); /* left empty and usable */
        assert_int_equal(b.len, (uint32_t)n);
        for (int i = 0; i < n; i++) {
            assert_ptr_equal(b.items[i], ts[i]);
            assert_ptr_equal(b.orig[i], ts[i]);
            assert_ptr_equal(b.spans[i].data, mpr_tensor_data(ts[i]));
            assert_int_equal(b.spans[i].nbytes, sizeof(float) * (size_t)(i + 1));
        }
        if (!grown) assert_ptr_equal(b.items, b.inline_items); /* points into b, not into a */
        mpri_tensor_list_fini(&a);
        mpri_tensor_list_fini(&b);
    }
    release_all(ts, 5);
    assert_int_equal(mpr_tensor_live_count(), live);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_every_form),
        cmocka_unit_test(test_malformed_refused),
        cmocka_unit_test(test_answers_round_trip),
        cmocka_unit_test(test_answers_malformed),
        cmocka_unit_test(test_tensor_list_inline_move_grow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
