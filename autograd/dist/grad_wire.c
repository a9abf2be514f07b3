/* grad_wire.c — gradients in dist autograd's backward messages: their byte
 * layout, written straight into a message (no value tree), and read back
 * into tensors.
 *
 * Gradients (host byte order; every rank of a job shares one architecture):
 *   u32 k, then k gradients, each a u8 form and its fields:
 *     GRAD_TENSOR     u32 index                          the tensor itself
 *     GRAD_BROADCAST  u32 index, u8 ndim, i64 size[ndim] a broadcast gradient
 *                     (such as sum's): the tensor has size 1 on each
 *                     stride-0 dim and is expanded again by the receiver (no
 *                     copy; a 256x256 ones gradient travels as one float)
 *     GRAD_SINGLE     f64 value, u8 dtype, u8 ndim, i64 size[ndim]
 *                     every dim stride-0 (one CPU f32/f64 value): no tensor
 *                     at all, so the message has no tensor data
 *   An index names a tensor of the message's tensor list (a request) or of
 *   the answers value (a reply: item index + 1 of the list).
 *
 * Answers (the reply to a backward request, BACKWARD_AUTOGRAD_RESP): the
 * body is u32 n, then n times (u64 message id, gradients), naming the
 * reply's tensors; the requester's reply decoder (mpri_grad_answers_decode)
 * makes it the value [bytes: the body, tensor...] its future holds, read
 * with mpri_grad_answers_open (index i = item i + 1).
 *
 * Invariants: a gradient written is read back with the same shape, dtype,
 * device and values; every read is bounds-checked (MPR_ERR_DECODE naming
 * what is wrong, never a read past the bytes or an index past the tensors);
 * the tensors written are referenced by the message or the answers until
 * they are sent or released. */
#include <stdlib.h>
#include <string.h>

#include "mpri_autograd.h"
#include "mpri_assert.h"
#include "mpri_codec.h"
#include "mpri_error.h"
#include "mpri_grad_wire.h"
#include "mpri_runtime.h"
#include "mpri_tensor.h"

enum { GRAD_TENSOR = 0, GRAD_BROADCAST = 1, GRAD_SINGLE = 2 };

mpr_tensor_t *mpri_grad_filled(int device, mpr_dtype_t dt, int nd, const int64_t *shape, const int64_t *strides,
                               double x) {
    if (device >= 0 || (dt != MPR_F32 && dt != MPR_F64)) {
        mpr_scope_begin(); /* ours to release, whether or not the thread has a scope open */
        mpr_tensor_t *t = mpr_scope_keep(mpri_full_on(device, dt, nd, shape, x));
        mpr_scope_end();
        return t;
    }
    mpri_storage_t *s = mpri_storage_create(mpr_dtype_size(dt));
    if (!s) { /* the storage layer sets no error: a NULL gradient must not read as "none" */
        mpr_error_set(MPR_ERR_NOMEM, "dist backward: out of memory for a gradient");
        return NULL;
    }
    if (dt == MPR_F32)
        *(float *)s->data = (float)x;
    else
        *(double *)s->data = x;
    mpr_tensor_t *t = mpri_tensor_view(s, dt, nd, shape, strides, 0);
    mpri_storage_release(s);
    return t;
}

static void put_sizes(mpri_buf_t *out, const mpr_tensor_t *g) {
    mpri_buf_put_u8(out, (uint8_t)g->ndim);
    mpri_buf_put(out, g->shape, sizeof(int64_t) * (size_t)g->ndim);
}

static mpr_err_t write_one(mpri_buf_t *out, mpri_grad_tensor_add_t add, void *sink, mpr_tensor_t *g) {
    int64_t compact[MPR_MAX_DIMS];
    bool broadcast = false, single = g->storage->device < 0 && (g->dtype == MPR_F32 || g->dtype == MPR_F64);
    for (int d = 0; d < g->ndim; d++) {
        compact[d] = g->strides[d] == 0 ? 1 : g->shape[d];
        if (compact[d] != g->shape[d]) broadcast = true;
        if (compact[d] != 1) single = false;
    }
    if (broadcast && single) {
        const void *at = mpr_tensor_data(g); /* a CPU f32/f64 element (`single` says so) */
        double x = g->dtype == MPR_F32 ? (double)*(const float *)at : *(const double *)at;
        mpri_buf_put_u8(out, GRAD_SINGLE);
        mpri_buf_put(out, &x, sizeof x);
        mpri_buf_put_u8(out, (uint8_t)g->dtype);
        put_sizes(out, g);
        return MPR_OK;
    }
    mpr_tensor_t *c = broadcast ? mpri_tensor_view(g->storage, g->dtype, g->ndim, compact, g->strides, g->offset)
                                : mpr_tensor_retain(g);
    /* A strided gradient is made contiguous by the backend's copy (the
     * codec's generic one goes element by element). */
    if (c && !mpr_tensor_is_contiguous(c)) {
        mpr_tensor_t *packed = mpri_contiguous_raw(c);
        mpr_tensor_release(c);
        c = packed;
    }
    if (!c) return mpr_last_error_code() ? mpr_last_error_code() : MPR_ERR_NOMEM;
    uint32_t index = 0;
    mpr_err_t e = add(sink, c, &index);
    mpr_tensor_release(c);
    if (e) return e;
    mpri_buf_put_u8(out, broadcast ? GRAD_BROADCAST : GRAD_TENSOR);
    mpri_buf_put_u32(out, index);
    if (broadcast) put_sizes(out, g);
    return MPR_OK;
}

mpr_err_t mpri_grads_write(mpri_buf_t *out, mpri_grad_tensor_add_t add, void *sink, int k, mpr_tensor_t *const *gs) {
    mpri_buf_put_u32(out, (uint32_t)k);
    for (int i = 0; i < k; i++) {
        mpr_err_t e = write_one(out, add, sink, gs[i]);
        if (e) return e;
    }
    return out->failed ? mpr_error_set(MPR_ERR_NOMEM, "dist backward: out of memory") : MPR_OK;
}

mpr_err_t mpri_grad_tensor_list_add(void *tensor_list, mpr_tensor_t *t, uint32_t *index) {
    return mpri_tensor_list_add(tensor_list, t, index);
}

/* ---- reading ---- */

static mpr_err_t malformed(const char *what) {
    return mpr_error_set(MPR_ERR_DECODE, "malformed gradient in a backward message: %s", what);
}

/* The sizes of a gradient of `dtype`: within what a tensor may have (the
 * view made of them would refuse more, as an invalid argument). */
static mpr_err_t read_sizes(mpri_reader_t *r, mpr_dtype_t dtype, int *nd, int64_t *shape) {
    uint8_t n;
    if (mpri_read_u8(r, &n)) return malformed("truncated");
    if (n > MPR_MAX_DIMS) return malformed("more dims than MPR_MAX_DIMS");
    if (mpri_read(r, shape, sizeof(int64_t) * n)) return malformed("truncated");
    for (int d = 0; d < n; d++)
        if (shape[d] < 0) return malformed("a negative size");
    int64_t numel;
    if (mpri_tensor_check_shape("dist backward", dtype, n, shape, &numel) != MPR_OK)
        return malformed("a shape too large");
    *nd = n;
    return MPR_OK;
}

mpr_err_t mpri_grads_read_count(mpri_grads_reader_t *rd, uint32_t *k) {
    return mpri_read_u32(&rd->r, k) ? malformed("truncated") : MPR_OK;
}

mpr_err_t mpri_grads_read_one(mpri_grads_reader_t *rd, mpr_tensor_t **out) {
    *out = NULL;
    uint8_t form;
    int64_t shape[MPR_MAX_DIMS], strides[MPR_MAX_DIMS] = {0};
    int nd = 0;
    if (mpri_read_u8(&rd->r, &form)) return malformed("truncated");
    if (form == GRAD_SINGLE) {
        double x;
        uint8_t dt;
        mpr_err_t e = mpri_read(&rd->r, &x, sizeof x) || mpri_read_u8(&rd->r, &dt) ? malformed("truncated") : MPR_OK;
        if (!e && dt != MPR_F32 && dt != MPR_F64) e = malformed("a single value that is not f32 or f64");
        if (!e) e = read_sizes(&rd->r, (mpr_dtype_t)dt, &nd, shape);
        if (e) return e;
        *out = mpri_grad_filled(-1, (mpr_dtype_t)dt, nd, shape, strides, x);
        if (*out) return MPR_OK;
        return mpr_last_error_code() ? mpr_last_error_code() : mpr_error_set(MPR_ERR_NOMEM, "dist backward: out of memory");
    }
    if (form != GRAD_TENSOR && form != GRAD_BROADCAST) return malformed("an unknown form");
    uint32_t index;
    if (mpri_read_u32(&rd->r, &index)) return malformed("truncated");
    if (index >= rd->ntensors || !rd->tensors[index]) return malformed("a tensor index past the message's tensors");
    mpr_tensor_t *t = rd->tensors[index];
    if (form == GRAD_TENSOR) {
        *out = mpr_tensor_retain(t);
        return MPR_OK;
    }
    mpr_err_t e = read_sizes(&rd->r, t->dtype, &nd, shape);
    if (e) return e;
    if (nd != t->ndim) return malformed("a broadcast gradient whose dims differ from its tensor's");
    for (int d = 0; d < nd; d++) {
        if (t->shape[d] != 1 && t->shape[d] != shape[d])
            return malformed("a broadcast gradient that does not expand its tensor");
        strides[d] = t->shape[d] == shape[d] ? t->strides[d] : 0;
    }
    *out = mpri_tensor_view(t->storage, t->dtype, nd, shape, strides, t->offset);
    return *out ? MPR_OK : mpr_last_error_code();
}

/* ---- answers ---- */

void mpri_grad_answers_init(mpri_grad_answers_t *a) { memset(a, 0, sizeof *a); }

void mpri_grad_answers_fini(mpri_grad_answers_t *a) {
    for (uint32_t i = 0; i < a->ntensors; i++) mpr_tensor_release(a->tensors[i]);
    free(a->tensors);
    mpri_buf_fini(&a->layout);
    memset(a, 0, sizeof *a);
}

/* The answers' tensors, each once: index = position (in the reply's tensor
 * list, and in the answers value after its bytes). */
static mpr_err_t answers_add_tensor(void *arg, mpr_tensor_t *t, uint32_t *index) {
    mpri_grad_answers_t *a = arg;
    for (uint32_t i = 0; i < a->ntensors; i++)
        if (a->tensors[i] == t) {
            *index = i;
            return MPR_OK;
        }
    if (a->ntensors == a->cap) {
        uint32_t cap = a->cap ? a->cap * 2 : 4;
        mpr_tensor_t **ts = realloc(a->tensors, cap * sizeof *ts);
        if (!ts) return mpr_error_set(MPR_ERR_NOMEM, "dist backward: out of memory");
        a->tensors = ts;
        a->cap = cap;
    }
    *index = a->ntensors;
    a->tensors[a->ntensors++] = mpr_tensor_retain(t);
    return MPR_OK;
}

mpr_err_t mpri_grad_answers_add(mpri_grad_answers_t *a, uint64_t msg_id, int k, mpr_tensor_t *const *gs) {
    if (a->count == 0) mpri_buf_put_u32(&a->layout, 0); /* the count, set in mpri_grad_answers_value */
    mpri_buf_put_u64(&a->layout, msg_id);
    mpr_err_t e = mpri_grads_write(&a->layout, answers_add_tensor, a, k, gs);
    if (!e) a->count++;
    return e;
}

mpr_err_t mpri_grad_answers_write(mpri_grad_answers_t *a, mpri_buf_t *out, mpri_tensor_list_t *tensors) {
    if (a->count == 0) {
        mpri_buf_put_u32(out, 0);
    } else {
        memcpy(a->layout.data, &a->count, sizeof a->count);
        mpri_buf_put(out, a->layout.data, a->layout.len);
    }
    if (out->failed) return mpr_error_set(MPR_ERR_NOMEM, "dist backward: out of memory for the answers");
    for (uint32_t i = 0; i < a->ntensors; i++) {
        uint32_t index = 0;
        mpr_err_t e = mpri_tensor_list_add(tensors, a->tensors[i], &index);
        if (e) return e;
        MPRI_ASSERT(index == i, "the answers' tensors are distinct, so each keeps its position in the reply");
    }
    return MPR_OK;
}

mpr_err_t mpri_grad_answers_decode(mpri_msg_t *msg, mpr_value_t **out) {
    *out = NULL;
    mpr_tensor_t *const *ts = NULL;
    uint32_t n = 0;
    mpr_err_t e = mpri_msg_tensors(msg, &ts, &n);
    if (e) return e;
    if (msg->hdr.body_len < sizeof(uint32_t))
        return mpr_error_set(MPR_ERR_DECODE, "malformed answers in a backward reply (no count)");
    mpr_value_t *v = mpr_value_new_list();
    e = v ? mpr_value_list_append(v, mpr_value_new_bytes(msg->body, msg->hdr.body_len)) : mpr_last_error_code();
    for (uint32_t i = 0; !e && i < n; i++) e = mpr_value_list_append(v, mpr_value_new_tensor(ts[i]));
    if (e) {
        mpr_value_release(v);
        return e;
    }
    *out = v;
    return MPR_OK;
}

mpr_err_t mpri_grad_answers_open(const mpr_value_t *v, mpri_grads_reader_t *rd, uint32_t *count,
                                 mpr_tensor_t **stack, uint32_t stack_n, mpr_tensor_t ***heap) {
    *heap = NULL;
    size_t n = mpr_value_list_len(v);
    const void *bytes = NULL;
    size_t len = 0;
    if (mpr_value_kind(v) != MPR_VALUE_LIST || n < 1 ||
        mpr_value_get_bytes(mpr_value_list_get(v, 0), &bytes, &len) != MPR_OK || n - 1 > UINT32_MAX)
        return mpr_error_set(MPR_ERR_DECODE, "malformed answers in a backward reply");
    uint32_t nt = (uint32_t)(n - 1);
    mpr_tensor_t **ts = stack;
    if (nt > stack_n && !(ts = *heap = malloc(nt * sizeof *ts)))
        return mpr_error_set(MPR_ERR_NOMEM, "dist backward: out of memory");
    for (uint32_t i = 0; i < nt; i++)
        if (mpr_value_get_tensor(mpr_value_list_get(v, i + 1), &ts[i]) != MPR_OK) {
            free(*heap);
            *heap = NULL;
            return mpr_error_set(MPR_ERR_DECODE, "malformed answers in a backward reply (item %u)", i + 1);
        }
    mpri_reader_init(&rd->r, bytes, len);
    rd->tensors = ts;
    rd->ntensors = nt;
    if (mpri_read_u32(&rd->r, count)) {
        free(*heap);
        *heap = NULL;
        return mpr_error_set(MPR_ERR_DECODE, "malformed answers in a backward reply (no count)");
    }
    return MPR_OK;
}

mpr_err_t mpri_grad_answers_next(mpri_grads_reader_t *rd, uint64_t *msg_id) {
    return mpri_read_u64(&rd->r, msg_id) ? malformed("truncated answers") : MPR_OK;
}
