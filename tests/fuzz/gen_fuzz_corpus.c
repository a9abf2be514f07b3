/* gen_fuzz_corpus.c — writes the seed inputs of fuzz_wire_decode into a folder:
 * one complete message (header, body, tensor descriptors) per file, a valid
 * encoding of every value kind in a RETURN, plus a CALL, a REMOTE_CALL with an
 * RRef argument, an error reply, and a dist autograd backward request and
 * its answers. Usage: gen_fuzz_corpus DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/mpri_grad_wire.h"
#include "mpirpc/tensor_ops.h"
#include "mpri_codec.h"
#include "mpri_error.h"
#include "mpri_tensor_batches.h"
#include "mpri_wire.h"

static const char *dir;

static void put_gid(mpri_buf_t *b, uint32_t rank, uint64_t seq) {
    mpri_buf_put_u32(b, rank);
    mpri_buf_put_u64(b, seq);
}

/* Write header + prefix + body + descriptors of `tl` to DIR/name. */
static void write_msg(const char *name, int kind, uint16_t flags, uint32_t data_tag, const mpri_buf_t *body,
                      const mpri_tensor_list_t *tl) {
    mpri_buf_t descs, all;
    mpri_buf_init(&descs);
    mpri_buf_init(&all);
    if (tl) mpri_tensor_descs_encode(tl, &descs);
    uint32_t nbatches = tl && tl->len ? mpri_batches_plan(tl->spans, tl->len, NULL) : 0;
    mpri_wire_header_t h = {.magic = MPRI_WIRE_MAGIC, .version = MPRI_WIRE_VERSION, .kind = (uint8_t)kind,
                            .flags = flags, .tensor_count = tl ? tl->len : 0, .body_len = (uint32_t)body->len,
                            .request_id = 1, .function_id = mpri_hash_name("f"), .data_tag = data_tag,
                            .batch_count = nbatches};
    mpri_buf_put(&all, &h, sizeof h);
    mpri_buf_put(&all, body->data, body->len);
    mpri_buf_put(&all, descs.data, descs.len);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(all.data, 1, all.len, f) != all.len || fclose(f)) {
        perror(path);
        exit(1);
    }
    mpri_buf_fini(&descs);
    mpri_buf_fini(&all);
}

/* A RETURN message carrying `v` (released). */
static void value_msg(const char *name, mpr_value_t *v) {
    mpri_buf_t body;
    mpri_tensor_list_t tl;
    mpri_buf_init(&body);
    mpri_tensor_list_init(&tl);
    if (mpri_value_encode(v, &body, &tl, 1) != MPR_OK) {
        fprintf(stderr, "%s: %s\n", name, mpr_last_error());
        exit(1);
    }
    write_msg(name, MPRI_MSG_RETURN, MPRI_FLAG_RESPONSE, 2, &body, &tl);
    mpri_tensor_list_fini(&tl);
    mpri_buf_fini(&body);
    mpr_value_release(v);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    int64_t shape[2] = {2, 3}, one[1] = {4};
    mpr_tensor_t *t = mpr_tensor_empty(MPR_F32, 2, shape), *u = mpr_tensor_empty(MPR_I64, 1, one);
    memset(mpr_tensor_data(t), 0, mpr_tensor_nbytes(t));
    memset(mpr_tensor_data(u), 0, mpr_tensor_nbytes(u));
    mpr_worker_info_t w = {.rank = 3};
    strcpy(w.name, "worker3");
    value_msg("none", mpr_value_new_none());
    value_msg("bool", mpr_value_new_bool(true));
    value_msg("int", mpr_value_new_int(-42));
    value_msg("double", mpr_value_new_double(0.5));
    value_msg("string", mpr_value_new_string("hello"));
    value_msg("bytes", mpr_value_new_bytes("\0\xff", 2));
    value_msg("tensor", mpr_value_new_tensor(t));
    value_msg("worker", mpr_value_new_worker(&w));
    value_msg("list", mpr_value_list_of(4, mpr_value_new_tensor(t), mpr_value_new_tensor(u),
                                        mpr_value_list_of(1, mpr_value_new_tensor(t)), mpr_value_new_string("x")));
    /* A parameter list: 40 small tensors of mixed dtypes (one batch, gaps
     * for alignment; past the encoder's linear de-duplication), named twice
     * at the end, and a nested list: the decoder's tensor blocks and value
     * slabs (value.c). */
    mpr_value_t *params = mpr_value_new_list();
    mpr_tensor_t *ps[40];
    static const mpr_dtype_t kinds[4] = {MPR_U8, MPR_F32, MPR_I64, MPR_F64};
    for (int i = 0; i < 40; i++) {
        int64_t len[1] = {1 + i % 7};
        ps[i] = mpr_tensor_empty(kinds[i % 4], 1, len);
        memset(mpr_tensor_data(ps[i]), i, mpr_tensor_nbytes(ps[i]));
        mpr_value_list_append(params, mpr_value_new_tensor(ps[i]));
    }
    mpr_value_list_append(params, mpr_value_new_tensor(ps[3]));
    mpr_value_list_append(params, mpr_value_list_of(2, mpr_value_new_tensor(ps[5]), mpr_value_new_int(7)));
    value_msg("tensor_list", params);
    for (int i = 0; i < 40; i++) mpr_tensor_release(ps[i]);

    /* RRef values: written by hand (encoding one needs a running runtime).
     * gid rref id, i32 owner, gid fork id; the fuzz world is rank 0 of 4. */
    static const struct { const char *name; uint32_t owner, src; } rrefs[] = {
        {"rref_owner_self", 0, 0}, {"rref_owner_remote", 0, 2}, {"rref_user_from_owner", 1, 1},
        {"rref_user_from_other", 1, 2}};
    for (size_t i = 0; i < sizeof rrefs / sizeof *rrefs; i++) {
        mpri_buf_t body;
        mpri_buf_init(&body);
        mpri_buf_put_u8(&body, MPR_VALUE_RREF);
        put_gid(&body, rrefs[i].owner, 7);
        int32_t owner = (int32_t)rrefs[i].owner;
        mpri_buf_put(&body, &owner, 4);
        put_gid(&body, rrefs[i].src, 9);
        write_msg(rrefs[i].name, MPRI_MSG_RETURN, MPRI_FLAG_RESPONSE, rrefs[i].src, &body, NULL);
        mpri_buf_fini(&body);
    }

    /* BACKWARD_AUTOGRAD_REQ: u64 pass id, u8 retain_graph, then gradients
     * (autograd/dist/grad_wire.c): a tensor, a broadcast row, one value. */
    mpri_buf_t body;
    mpri_tensor_list_t tl;
    {
        mpr_tensor_t *row = mpr_tensor_empty(MPR_F32, 2, (const int64_t[]){1, 3});
        memset(mpr_tensor_data(row), 0, mpr_tensor_nbytes(row));
        mpr_tensor_t *scalar = mpr_full(MPR_F32, 0, NULL, 1.0);
        mpr_tensor_t *gs[3] = {t, mpr_expand(row, 2, (const int64_t[]){4, 3}),
                               mpr_expand(scalar, 2, (const int64_t[]){8, 8})};
        mpri_buf_init(&body);
        mpri_tensor_list_init(&tl);
        mpri_buf_put_u64(&body, ((uint64_t)1 << 48) | 1);
        mpri_buf_put_u8(&body, 0);
        if (mpri_grads_write(&body, mpri_grad_tensor_list_add, &tl, 3, gs) != MPR_OK) {
            fprintf(stderr, "backward request: %s\n", mpr_last_error());
            exit(1);
        }
        write_msg("backward_request", MPRI_MSG_BACKWARD_AUTOGRAD_REQ, MPRI_FLAG_EXPECTS_REPLY, 1, &body, &tl);
        mpri_tensor_list_fini(&tl);
        mpri_buf_fini(&body);
        /* BACKWARD_AUTOGRAD_RESP: the answers (two groups) */
        mpri_grad_answers_t a;
        mpri_grad_answers_init(&a);
        mpri_buf_init(&body);
        mpri_tensor_list_init(&tl);
        if (mpri_grad_answers_add(&a, 5, 2, gs) != MPR_OK || mpri_grad_answers_add(&a, 9, 1, gs + 2) != MPR_OK ||
            mpri_grad_answers_write(&a, &body, &tl) != MPR_OK) {
            fprintf(stderr, "backward answers: %s\n", mpr_last_error());
            exit(1);
        }
        mpri_grad_answers_fini(&a);
        write_msg("backward_answers", MPRI_MSG_BACKWARD_AUTOGRAD_RESP, MPRI_FLAG_RESPONSE, 1, &body, &tl);
        mpri_tensor_list_fini(&tl);
        mpri_buf_fini(&body);
        mpr_tensor_release(gs[1]);
        mpr_tensor_release(gs[2]);
        mpr_tensor_release(row);
        mpr_tensor_release(scalar);
    }

    /* CALL: u16 name length, name, args value */
    mpri_buf_init(&body);
    mpri_tensor_list_init(&tl);
    mpri_buf_put_u16(&body, 1);
    mpri_buf_put(&body, "f", 1);
    mpr_value_t *args = mpr_value_list_of(2, mpr_value_new_int(1), mpr_value_new_tensor(u));
    mpri_value_encode(args, &body, &tl, 0);
    write_msg("call", MPRI_MSG_CALL, MPRI_FLAG_EXPECTS_REPLY, 1, &body, &tl);
    mpr_value_release(args);
    mpri_tensor_list_fini(&tl);
    mpri_buf_fini(&body);

    /* REMOTE_CALL: name, gid rref id, gid fork id, args (one RRef) */
    mpri_buf_init(&body);
    mpri_buf_put_u16(&body, 1);
    mpri_buf_put(&body, "f", 1);
    put_gid(&body, 0, 11);
    put_gid(&body, 1, 12);
    mpri_buf_put_u8(&body, MPR_VALUE_LIST);
    mpri_buf_put_u32(&body, 1);
    mpri_buf_put_u8(&body, MPR_VALUE_RREF);
    put_gid(&body, 2, 3);
    int32_t owner = 2;
    mpri_buf_put(&body, &owner, 4);
    put_gid(&body, 1, 13);
    write_msg("remote_call", MPRI_MSG_REMOTE_CALL, MPRI_FLAG_EXPECTS_REPLY, 1, &body, NULL);
    mpri_buf_fini(&body);

    /* error reply: u32 code + message blob */
    mpri_buf_init(&body);
    mpri_buf_put_u32(&body, MPR_ERR_DECODE);
    mpri_buf_put_blob(&body, "boom", 4);
    write_msg("error_reply", MPRI_MSG_EXCEPTION, MPRI_FLAG_RESPONSE | MPRI_FLAG_ERROR, 1, &body, NULL);
    mpri_buf_fini(&body);

    /* remote error reply: MPR_ERR_REMOTE, its text, then its origin */
    mpri_remote_error_t re;
    mpri_remote_error_init(&re, "worker2", 2, "g", MPR_ERR_NOT_FOUND, "no key");
    mpri_remote_error_pass(&re, "worker1", "f");
    char text[MPR_ERROR_TEXT_MAX];
    mpri_remote_error_text(&re, text, sizeof text);
    mpri_buf_init(&body);
    mpri_buf_put_u32(&body, MPR_ERR_REMOTE);
    mpri_buf_put_blob(&body, text, strlen(text));
    mpri_remote_error_write(&body, &re);
    write_msg("remote_error_reply", MPRI_MSG_EXCEPTION, MPRI_FLAG_RESPONSE | MPRI_FLAG_ERROR, 1, &body, NULL);
    mpri_buf_fini(&body);

    mpr_tensor_release(t);
    mpr_tensor_release(u);
    return 0;
}
