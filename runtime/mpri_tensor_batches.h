/* mpri_tensor_batches.h — how a message's tensors travel as MPI messages
 * (not installed).
 *
 * The tensors of one active message go, in order, as "batches" on the
 * message's data tag, one MPI message per batch:
 * - a tensor of at least MPRI_BATCH_ALONE_BYTES is a batch of its own, sent
 *   from and received into its storage as plain bytes (large transfers keep
 *   MPI's single-copy paths);
 * - a run of consecutive smaller tensors shares one batch of at most
 *   MPRI_BATCH_MAX_BYTES: one MPI message of MPI_BYTEs, the run's tensors'
 *   bytes one after the other with no padding. The sender sends it from
 *   memory where those bytes already lie back to back (e.g. tensors it
 *   received), else packs them (memcpy) when they average at most
 *   MPRI_BATCH_PACK_MAX_AVG bytes, else describes them with an hindexed
 *   datatype; the receiver receives it into one tensor block
 *   (mpri_tensor.h), or through an hindexed datatype when alignment kept
 *   its tensors apart (value_codec.c). Either side's choice is invisible to
 *   the other.
 * Sender and receiver compute the same plan from the tensor sizes alone, and
 * MPI's non-overtaking rule matches the batches in order. Before batching, a
 * message of 65536 small tensors was 65536 MPI messages and took ~18 s on
 * shared memory (Open MPI's out-of-order fragment list is linear). */
#ifndef MPRI_TENSOR_BATCHES_H
#define MPRI_TENSOR_BATCHES_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>

#include "mpirpc/tensor.h"
#include "mpri_codec.h"

#define MPRI_BATCH_ALONE_BYTES ((size_t)64 << 10)
#define MPRI_BATCH_MAX_BYTES ((size_t)16 << 20)
/* Batches of small tensors averaging at most this many bytes are packed
 * (memcpy) rather than described by an hindexed datatype. Measured with
 * `bench_rpc --pack` (Open MPI 4.1 vader, 2 ranks, batches of 256 KiB and
 * 1 MiB, each tensor its own allocation, methods alternating round trip by
 * round trip; 2026-11-24, loaded machine): the datatype costs 2.4-11x the
 * packed send for 16 and 64 B tensors, 1.1-1.3x for 256 B, 1.1-3x for 1 KiB,
 * but 0.24-0.69x from 4 KiB up (Open MPI then pipelines the pieces through
 * shared memory, while the packed buffer pays the memcpy and then the
 * single-copy path). The crossover lies between 1 and 4 KiB. */
#define MPRI_BATCH_PACK_MAX_AVG ((size_t)2 << 10)

/* The plan, one tensor at a time: true when a tensor of `nbytes` starts a
 * new batch. Start from a zeroed planner. */
typedef struct mpri_batch_planner {
    size_t run_bytes;
    bool run_open; /* the last batch is a run of small tensors that may grow */
} mpri_batch_planner_t;
bool mpri_batch_planner_next(mpri_batch_planner_t *p, size_t nbytes);

/* Where a contiguous CPU tensor's bytes lie and how many there are: all
 * that the plan, the adjacency test, packing and posting read, gathered by
 * one walk over a message's tensors (mpri_tensor_spans). A list of
 * thousands of small tensors otherwise has each tensor and storage record
 * fetched from memory again at every step. */
/* mpri_tensor_span_t itself is defined in mpri_codec.h (a tensor list
 * keeps its first spans inline). */
/* spans[i] of tensors[i], i < n (contiguous, live CPU tensors). */
void mpri_tensor_spans(mpr_tensor_t *const *tensors, uint32_t n, mpri_tensor_span_t *spans);

/* Split the tensors of spans[0..n) into batches: starts[b] is the index of
 * batch b's first tensor, starts[nbatches] == n. `starts` holds n + 1
 * entries, or is NULL to only count. Returns nbatches (0 when n is 0). */
uint32_t mpri_batches_plan(const mpri_tensor_span_t *spans, uint32_t n, uint32_t *starts);

/* The plan of a message of n tensors and their spans: in the struct for up
 * to MPRI_BATCH_SCRATCH_INLINE tensors (the usual case, no malloc), else
 * allocated. The struct points into itself: do not copy it. */
#define MPRI_BATCH_SCRATCH_INLINE 8
typedef struct mpri_batch_scratch {
    mpri_tensor_span_t *spans; /* n entries: the caller's (borrowed), or this scratch's */
    uint32_t *starts;          /* n + 1 entries */
    bool own_spans;
    mpri_tensor_span_t inline_spans[MPRI_BATCH_SCRATCH_INLINE];
    uint32_t inline_starts[MPRI_BATCH_SCRATCH_INLINE + 1];
} mpri_batch_scratch_t;

/* `spans`: the tensors' spans, already gathered by the caller (a sent
 * list's, mpri_tensor_list_t) and borrowed until fini; NULL: room for n
 * spans here, to be filled. false when out of memory (nothing left to free). */
bool mpri_batch_scratch_init(mpri_batch_scratch_t *s, uint32_t n, mpri_tensor_span_t *spans);
void mpri_batch_scratch_fini(mpri_batch_scratch_t *s);

/* Bytes a send of the batch spans[first..end) packs into a buffer (0: it is
 * sent without packing). */
size_t mpri_batch_pack_bytes(const mpri_tensor_span_t *spans, uint32_t first, uint32_t end);

/* Post the batch spans[first..end) as one MPI_Isend (send) or MPI_Irecv
 * to/from `peer` on `tag`. A send given `pack` (of mpri_batch_pack_bytes
 * bytes, kept until the request completes; given only when that is not 0)
 * packs the batch there. A batch whose tensors lie apart (and are not
 * packed) goes through an hindexed datatype built for this post. Returns an
 * MPI error code (MPI_ERR_NO_MEM: no memory for the datatype's arrays). */
int mpri_batch_post(bool send, const mpri_tensor_span_t *spans, uint32_t first, uint32_t end, int peer,
                    int tag, MPI_Comm comm, void *pack, MPI_Request *req);

#endif
