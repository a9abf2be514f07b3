/* mpri_grad_wire.h — gradients in dist autograd's backward messages
 * (grad_wire.c; not installed): written straight into a message's bytes and
 * tensor list, read back into tensors, and collected as the answers a reply
 * carries. The layout is described at the top of grad_wire.c.
 *
 * Ownership: writers take their own references to the tensors they keep
 * (the sink's); readers return new references; a reader's tensors are
 * borrowed from the message or the answers value it reads. */
#ifndef MPRI_GRAD_WIRE_H
#define MPRI_GRAD_WIRE_H

#include <stdint.h>

#include "mpri_buf.h"
#include "mpirpc/tensor.h"
#include "mpirpc/value.h"

/* Where a written gradient's tensor goes: the sink keeps a reference and
 * sets *index to the tensor's position (what the bytes name). */
typedef mpr_err_t (*mpri_grad_tensor_add_t)(void *sink, mpr_tensor_t *t, uint32_t *index);

/* The sink of a message being built: its mpri_tensor_list_t (mpri_codec.h). */
mpr_err_t mpri_grad_tensor_list_add(void *tensor_list, mpr_tensor_t *t, uint32_t *index);

/* Append `k` gradients (u32 k, then each) to `out`, their tensors to `sink`. */
mpr_err_t mpri_grads_write(mpri_buf_t *out, mpri_grad_tensor_add_t add, void *sink, int k, mpr_tensor_t *const *gs);

typedef struct mpri_grads_reader {
    mpri_reader_t r;
    mpr_tensor_t *const *tensors; /* borrowed: the message's, or the answers value's */
    uint32_t ntensors;
} mpri_grads_reader_t;

/* The u32 count that starts a group of gradients. */
mpr_err_t mpri_grads_read_count(mpri_grads_reader_t *rd, uint32_t *k);
/* One gradient: a new reference in *out (NULL on failure, MPR_ERR_DECODE
 * naming what is malformed, or out of memory). */
mpr_err_t mpri_grads_read_one(mpri_grads_reader_t *rd, mpr_tensor_t **out);

/* A tensor of `shape` whose every element is `x`: one element of storage
 * seen through `strides` (all 0; NULL for a shape of one element) on the
 * CPU, or a filled tensor on a device; a new reference, or NULL with the
 * error set. */
mpr_tensor_t *mpri_grad_filled(int device, mpr_dtype_t dt, int nd, const int64_t *shape, const int64_t *strides,
                               double x);

/* The answers a piece begun by a request collects for its reply: groups of
 * (message id of a send function on the requester, its gradients). */
typedef struct mpri_grad_answers {
    mpri_buf_t layout;      /* u32 count, then the groups */
    mpr_tensor_t **tensors; /* owned references */
    uint32_t ntensors, cap;
    uint32_t count; /* groups */
} mpri_grad_answers_t;

void mpri_grad_answers_init(mpri_grad_answers_t *a);
void mpri_grad_answers_fini(mpri_grad_answers_t *a);
mpr_err_t mpri_grad_answers_add(mpri_grad_answers_t *a, uint64_t msg_id, int k, mpr_tensor_t *const *gs);
/* The reply to the request: its body (the count, then the groups) to `out`
 * and its tensors, in order, to `tensors` (mpri_codec.h); none is a count
 * of 0. Errors: out of memory, a tensor the wire cannot carry. */
struct mpri_tensor_list;
mpr_err_t mpri_grad_answers_write(mpri_grad_answers_t *a, mpri_buf_t *out, struct mpri_tensor_list *tensors);
/* BACKWARD_AUTOGRAD_RESP's reply decoder (mpri_set_reply_decoder): the
 * value [bytes: the body, tensor...] (new reference) for
 * mpri_grad_answers_open. */
struct mpri_msg;
mpr_err_t mpri_grad_answers_decode(struct mpri_msg *msg, mpr_value_t **out);

/* Open an answers value for reading: *count groups follow, each read with
 * mpri_grad_answers_next, mpri_grads_read_count and mpri_grads_read_one.
 * The tensors' pointers go to `stack` when they fit in `stack_n`, else to
 * *heap (the caller free()s it; NULL when unused). */
mpr_err_t mpri_grad_answers_open(const mpr_value_t *v, mpri_grads_reader_t *rd, uint32_t *count,
                                 mpr_tensor_t **stack, uint32_t stack_n, mpr_tensor_t ***heap);
/* The next group's message id. */
mpr_err_t mpri_grad_answers_next(mpri_grads_reader_t *rd, uint64_t *msg_id);

#endif
