/* mpri_wire.h — the wire format: message kinds and the fixed header
 * (not installed).
 *
 * Every active message is one MPI message on MPRI_TAG_AM:
 *   [header (56 bytes)] [body: body_len bytes] [tensor descriptors]
 * followed, when tensor_count > 0, by batch_count MPI messages on tag
 * `data_tag` carrying the tensors' bytes straight from/into their storage,
 * batched as mpri_tensor_batches.h describes (version 2; version 1 sent one
 * message per tensor). Small tensors travel inside the active message
 * instead (version 3): with MPRI_FLAG_TENSORS_INLINE the tensors' bytes, one
 * tensor after the other in list order, follow the descriptors, and
 * batch_count is 0 (a message to another rank whose tensors hold at most
 * MPRI_INLINE_TENSOR_BYTES and that stays within MPRI_INLINE_MESSAGE_BYTES in
 * all: one MPI message instead of two, no data receive to post). Version 4:
 * dist autograd's backward requests carry their gradients in their own byte
 * layout (autograd/dist/grad_wire.c), and their replies a flat answers
 * value, instead of value trees. The header
 * is versioned; a receiver rejects a wrong magic/version, an unknown kind,
 * lengths that disagree with the received size, a batch count that cannot
 * fit the tensor count, and inline bytes that do not add up to the
 * descriptors' sizes. */
#ifndef MPRI_WIRE_H
#define MPRI_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "mpirpc/error.h"

#define MPRI_WIRE_MAGIC 0x4d52u /* "RM" */
#define MPRI_WIRE_VERSION 4
#define MPRI_TAG_AM 1
#define MPRI_TAG_DATA_FIRST 2

/* Message kinds (mirroring PyTorch's rpc/message.h), in one list. */
#define MPRI_MSG_KIND_LIST(X)                                                         \
    X(MPRI_MSG_CALL, "call")                 /* run a registered function */          \
    X(MPRI_MSG_RETURN, "return")             /* its result */                          \
    X(MPRI_MSG_REMOTE_CALL, "remote_call")   /* run and keep the result in an OwnerRRef */ \
    X(MPRI_MSG_REMOTE_RET, "remote_ret")                                               \
    X(MPRI_MSG_RREF_FETCH, "rref_fetch")     /* to_here */                             \
    X(MPRI_MSG_RREF_FETCH_RET, "rref_fetch_ret")                                       \
    X(MPRI_MSG_RREF_USER_DELETE, "rref_user_delete")                                   \
    X(MPRI_MSG_RREF_FORK_REQUEST, "rref_fork_request")                                 \
    X(MPRI_MSG_RREF_CHILD_ACCEPT, "rref_child_accept")                                 \
    X(MPRI_MSG_RREF_ACK, "rref_ack")                                                   \
    X(MPRI_MSG_FORWARD_AUTOGRAD_REQ, "forward_autograd_req")                           \
    X(MPRI_MSG_FORWARD_AUTOGRAD_RESP, "forward_autograd_resp")                         \
    X(MPRI_MSG_BACKWARD_AUTOGRAD_REQ, "backward_autograd_req")                         \
    X(MPRI_MSG_BACKWARD_AUTOGRAD_RESP, "backward_autograd_resp")                       \
    X(MPRI_MSG_CLEANUP_AUTOGRAD_CONTEXT, "cleanup_autograd_context")                   \
    X(MPRI_MSG_EXCEPTION, "exception")       /* an error in reply to a request */   \
    X(MPRI_MSG_LEAVE, "leave")               /* the sender leaves the job (shutdown.c) */ \
    X(MPRI_MSG_LEAVE_ACK, "leave_ack")       /* the receiver will send it nothing more */

typedef enum {
#define MPRI_X_KIND(kind, name) kind,
    MPRI_MSG_KIND_LIST(MPRI_X_KIND)
#undef MPRI_X_KIND
    MPRI_MSG_KIND_COUNT
} mpri_msg_kind_t;

const char *mpri_msg_kind_name(int kind);

enum {
    MPRI_FLAG_RESPONSE = 1u << 0, /* answers request `request_id` */
    MPRI_FLAG_ERROR = 1u << 1,    /* body is an error: u32 code + message blob, then for
                                   * MPR_ERR_REMOTE its origin (mpri_error.h); readers
                                   * that stop after the blob still read a whole error */
    MPRI_FLAG_EXPECTS_REPLY = 1u << 2,
    MPRI_FLAG_TENSORS_INLINE = 1u << 3, /* the tensors' bytes follow the descriptors; batch_count 0 */
};

/* The inline limits: the tensors' bytes, and the whole active message (under
 * Open MPI's 4 KiB shared-memory eager limit, so it stays one eager send).
 * An 8x8 f32 tensor echoed took 1.5-1.75 us more than a no-op call with its
 * bytes in a message of their own (2.8-3.0 us no-op, 2 cores). */
#define MPRI_INLINE_TENSOR_BYTES 2048
#define MPRI_INLINE_MESSAGE_BYTES 4000

typedef struct mpri_wire_header {
    uint16_t magic;
    uint8_t version;
    uint8_t kind;
    uint16_t flags;
    uint16_t reserved;
    uint32_t tensor_count;
    uint32_t body_len;
    uint64_t request_id;
    uint64_t function_id;
    uint64_t autograd_context_id;
    uint64_t autograd_message_id;
    uint32_t data_tag;
    uint32_t batch_count; /* MPI messages carrying the tensors: 0 without tensors, else 1..tensor_count */
} mpri_wire_header_t;

_Static_assert(sizeof(mpri_wire_header_t) == 56, "wire header must be 56 bytes");

#define MPRI_MAX_MESSAGE_BYTES ((size_t)1 << 30)
#define MPRI_MAX_TENSORS_PER_MESSAGE 65536

/* Read and validate the header of a received message of `len` bytes. */
mpr_err_t mpri_wire_header_read(const void *data, size_t len, mpri_wire_header_t *out);

/* 64-bit FNV-1a hash of a function name (its wire id). */
uint64_t mpri_hash_name(const char *name);

#endif
