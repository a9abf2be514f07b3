/* mpri_codec.h — value <-> bytes, with tensor data kept out of the bytes
 * (not installed).
 *
 * A value encodes to a compact byte string in which each tensor is only an
 * index into a tensor list; the list's tensors travel as separate messages
 * straight from/into their storage. The tensor descriptors (dtype, shape)
 * are encoded separately so a receiver can allocate storage and post the data
 * receives before it decodes the value itself. */
#ifndef MPRI_CODEC_H
#define MPRI_CODEC_H

#include "mpri_buf.h"
#include "mpri_value.h"

#define MPRI_MAX_VALUE_DEPTH MPR_MAX_VALUE_DEPTH
#define MPRI_MAX_TENSOR_BYTES ((size_t)0x7fffffff) /* a large tensor is one MPI message (int count) */
/* Tensor data of one message, all tensors together: the receiver allocates
 * it all before the first byte arrives, so a corrupt header must not make it
 * reserve more. Checked by the sender (a clear error) and the receiver. */
#define MPRI_MAX_MESSAGE_TENSOR_BYTES ((uint64_t)1 << 36) /* 64 GiB */

/* Where a contiguous CPU tensor's bytes lie and how many there are (see
 * mpri_tensor_batches.h, which plans, packs and posts from these). */
typedef struct mpri_tensor_span {
    uint8_t *data;
    size_t nbytes;
} mpri_tensor_span_t;

#define MPRI_TENSOR_LIST_INLINE 2 /* entries kept inside the list (a small message allocates none) */
typedef struct mpri_tensor_list {
    mpr_tensor_t **items;    /* contiguous CPU tensors to send, one reference each */
    const mpr_tensor_t **orig; /* the tensors the value named (for de-duplication) */
    mpri_tensor_span_t *spans; /* where each item's bytes lie, noted as it is added */
    uint32_t len, cap;
    uint64_t total_bytes;    /* data bytes of items, bounded by MPRI_MAX_MESSAGE_TENSOR_BYTES */
    uint32_t *slots;         /* open-addressing index orig -> position + 1, once len > 16 */
    uint32_t nslots;         /* power of two, > 2 * len; 0 while the list is scanned linearly */
    /* The three arrays above point here until the list outgrows them: a
     * list is never copied by value (mpri_tensor_list_move moves one). */
    mpr_tensor_t *inline_items[MPRI_TENSOR_LIST_INLINE];
    const mpr_tensor_t *inline_orig[MPRI_TENSOR_LIST_INLINE];
    mpri_tensor_span_t inline_spans[MPRI_TENSOR_LIST_INLINE];
} mpri_tensor_list_t;

void mpri_tensor_list_init(mpri_tensor_list_t *l);
/* Releases the tensors. */
void mpri_tensor_list_fini(mpri_tensor_list_t *l);
/* Move `src`'s contents (tensor references included) to `dst`, which need
 * not be initialized; `src` is left empty (initialized). */
void mpri_tensor_list_move(mpri_tensor_list_t *dst, mpri_tensor_list_t *src);

/* Add live tensor `t` to the list (once: a tensor already there gives its
 * first index) and set *index to its position; what travels is a
 * contiguous host copy when `t` is strided or on a device (its descriptor
 * names the device). For encoders that write tensor indices themselves
 * (dist autograd's gradients); errors: a device over 127, a tensor over
 * 2 GiB, too many tensors or bytes for one message, out of memory. */
mpr_err_t mpri_tensor_list_add(mpri_tensor_list_t *l, mpr_tensor_t *t, uint32_t *index);

/* Append the encoding of `v` to `out`, adding its tensors to `tensors`.
 * `dst_rank` is where the value goes (RRef values need it). */
mpr_err_t mpri_value_encode(const mpr_value_t *v, mpri_buf_t *out, mpri_tensor_list_t *tensors,
                            int dst_rank);

/* Bit 7 of a descriptor's dtype byte: the tensor requires grad (its receiver
 * gets a leaf that requires grad, as PyTorch's RPC does). */
#define MPRI_DESC_REQUIRES_GRAD 0x80u

/* Bit 6: the tensor was on a CUDA device at the sender; one u8 device index
 * follows the ndim byte. Its bytes travel through host memory and the
 * receiver's copy is put on the device of the same index (PyTorch's default
 * identity device map) when the value is decoded. */
#define MPRI_DESC_ON_DEVICE 0x40u
#define MPRI_DESC_FLAGS (MPRI_DESC_REQUIRES_GRAD | MPRI_DESC_ON_DEVICE)

/* Where the received tensors of a message go once their bytes are in: made
 * by mpri_tensor_descs_decode only when some tensor came from a device;
 * applied (and marked done) by mpri_tensor_placement_apply when the message's
 * value is decoded, on the decoding thread. */
typedef struct mpri_tensor_placement {
    bool done;
    mpr_err_t error; /* of the first apply, reported again by later ones */
    uint32_t count;
    struct {
        int16_t device; /* -1: stays on the host */
        bool requires_grad;
    } items[];
} mpri_tensor_placement_t;

/* Descriptors of `tensors` (dtype with the flag bits, ndim, [device], shape
 * each); a device tensor's list entry (tensors->orig) names its device. */
void mpri_tensor_descs_encode(const mpri_tensor_list_t *tensors, mpri_buf_t *out);
/* Read `count` descriptors and allocate an empty CPU tensor for each into
 * out[0..count), flagged requires_grad as its descriptor says, except the
 * tensors that came from a device: those are listed in a new *placement
 * (caller-owned, free()), which stays NULL when there are none. All
 * descriptors are validated (each tensor and their total within the limits
 * above) before anything is allocated. On failure no tensor is left
 * allocated and *placement is NULL. */
mpr_err_t mpri_tensor_descs_decode(mpri_reader_t *in, uint32_t count, mpr_tensor_t **out,
                                   mpri_tensor_placement_t **placement);
/* The same, also writing spans[i] (mpri_tensor_batches.h) of each tensor
 * made: what the receives are posted from, without another walk over the
 * tensors. */
struct mpri_tensor_span;
mpr_err_t mpri_tensor_descs_decode_spans(mpri_reader_t *in, uint32_t count, mpr_tensor_t **out,
                                         struct mpri_tensor_span *spans, mpri_tensor_placement_t **placement);
/* Replace each tensor `placement` sends to a device with its device copy
 * (a leaf that requires grad when flagged); once per message (then `done`).
 * Errors name the tensor and the device (e.g. a device this worker lacks). */
mpr_err_t mpri_tensor_placement_apply(mpri_tensor_placement_t *placement, mpr_tensor_t **tensors);

/* Decode one value; tensor indices refer to tensors[0..ntensors) (borrowed;
 * the value takes its own references). New reference in *out. On failure
 * nothing is left half done: the opaque values made are released, and
 * those not reached (from where the decode stopped on) are settled (the
 * opaque ops' `settle`: an RRef's fork is undone), so a fork in a message
 * that could not be decoded does not pin its RRef. The thread's last error
 * stays the decode's. */
mpr_err_t mpri_value_decode(mpri_reader_t *in, mpr_tensor_t *const *tensors, uint32_t ntensors,
                            int src_rank, mpr_value_t **out);
/* The same, but the value takes over the caller's references to the
 * tensors it names instead of taking its own (no atomic per tensor, and
 * the caller has fewer to drop): each tensors[i] whose reference was taken
 * becomes NULL, on success and on failure alike (a failed decode released
 * it with the values it made). The others stay the caller's. */
mpr_err_t mpri_value_decode_taking(mpri_reader_t *in, mpr_tensor_t **tensors, uint32_t ntensors, int src_rank,
                                   mpr_value_t **out);
/* Read past one value that will not be decoded, settling the opaque values
 * in it as a failed decode does. Stops at the first malformed byte; keeps
 * the thread's last error. */
void mpri_value_settle(mpri_reader_t *in, int src_rank);

#endif
