/* mpri_tensor_batches.h — how a message's tensors travel as MPI messages
 * (not installed).
 *
 * The tensors of one active message go, in order, as "batches" on the
 * message's data tag, one MPI message per batch:
 * - a tensor of at least MPRI_BATCH_ALONE_BYTES is a batch of its own, sent
 *   from and received into its storage as plain bytes (large transfers keep
 *   MPI's single-copy paths);
 * - a run of consecutive smaller tensors shares one batch of at most
 *   MPRI_BATCH_MAX_BYTES, described by an hindexed datatype over their
 *   storages (still no copy of ours: MPI gathers and scatters).
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

#define MPRI_BATCH_ALONE_BYTES ((size_t)64 << 10)
#define MPRI_BATCH_MAX_BYTES ((size_t)16 << 20)

/* Split tensors[0..n) into batches: starts[b] is the index of batch b's
 * first tensor, starts[nbatches] == n. `starts` holds n + 1 entries, or is
 * NULL to only count. Returns nbatches (0 when n is 0). */
uint32_t mpri_batches_plan(mpr_tensor_t *const *tensors, uint32_t n, uint32_t *starts);

/* Plan and datatype scratch for a message of n tensors: in the struct for up
 * to MPRI_BATCH_SCRATCH_INLINE tensors (the usual case, no malloc), else
 * allocated. The struct points into itself: do not copy it. */
#define MPRI_BATCH_SCRATCH_INLINE 8
typedef struct mpri_batch_scratch {
    uint32_t *starts; /* n + 1 entries */
    int *lens;        /* n entries */
    MPI_Aint *displs; /* n entries */
    uint32_t inline_starts[MPRI_BATCH_SCRATCH_INLINE + 1];
    int inline_lens[MPRI_BATCH_SCRATCH_INLINE];
    MPI_Aint inline_displs[MPRI_BATCH_SCRATCH_INLINE];
} mpri_batch_scratch_t;

/* false when out of memory (nothing left to free). */
bool mpri_batch_scratch_init(mpri_batch_scratch_t *s, uint32_t n);
void mpri_batch_scratch_fini(mpri_batch_scratch_t *s);

/* Post batch tensors[first..end) as one MPI_Isend (send) or MPI_Irecv to/from
 * `peer` on `tag`. `lens` and `displs` are scratch of at least end - first
 * entries (unused for a batch of one tensor). Returns an MPI error code. */
int mpri_batch_post(bool send, mpr_tensor_t *const *tensors, uint32_t first, uint32_t end, int peer,
                    int tag, MPI_Comm comm, int *lens, MPI_Aint *displs, MPI_Request *req);

#endif
