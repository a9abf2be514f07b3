/* tensor_batches.c — the batch plan of a message's tensors, its scratch,
 * and posting one batch as one non-blocking MPI message (see
 * mpri_tensor_batches.h).
 *
 * A batch of one tensor is its storage as plain bytes; a batch of several
 * small ones is an hindexed datatype over their storages, freed right after
 * posting (MPI keeps it alive for the pending request). Scratch for up to
 * MPRI_BATCH_SCRATCH_INLINE tensors lives in the caller's struct.
 *
 * Invariants: the plan depends only on the tensors' byte sizes, which the
 * receiver knows from the descriptors, so both sides agree on it; tensor
 * data is never copied by this code; MPI errors are returned as MPI codes
 * for the caller to report. */
#include "mpri_tensor_batches.h"

#include <stdlib.h>

uint32_t mpri_batches_plan(mpr_tensor_t *const *tensors, uint32_t n, uint32_t *starts) {
    uint32_t nb = 0;
    size_t run_bytes = 0;
    bool run_open = false; /* the last batch is a run of small tensors that may grow */
    for (uint32_t i = 0; i < n; i++) {
        size_t b = mpr_tensor_nbytes(tensors[i]);
        if (b >= MPRI_BATCH_ALONE_BYTES) {
            if (starts) starts[nb] = i;
            nb++;
            run_open = false;
        } else if (run_open && run_bytes + b <= MPRI_BATCH_MAX_BYTES) {
            run_bytes += b;
        } else {
            if (starts) starts[nb] = i;
            nb++;
            run_open = true;
            run_bytes = b;
        }
    }
    if (starts) starts[nb] = n;
    return nb;
}

bool mpri_batch_scratch_init(mpri_batch_scratch_t *s, uint32_t n) {
    if (n <= MPRI_BATCH_SCRATCH_INLINE) {
        s->starts = s->inline_starts;
        s->lens = s->inline_lens;
        s->displs = s->inline_displs;
        return true;
    }
    s->starts = malloc(sizeof *s->starts * ((size_t)n + 1));
    s->lens = malloc(sizeof *s->lens * n);
    s->displs = malloc(sizeof *s->displs * n);
    if (s->starts && s->lens && s->displs) return true;
    mpri_batch_scratch_fini(s);
    return false;
}

void mpri_batch_scratch_fini(mpri_batch_scratch_t *s) {
    if (s->starts != s->inline_starts) {
        free(s->starts);
        free(s->lens);
        free(s->displs);
    }
    s->starts = NULL;
    s->lens = NULL;
    s->displs = NULL;
}

int mpri_batch_post(bool send, mpr_tensor_t *const *tensors, uint32_t first, uint32_t end, int peer,
                    int tag, MPI_Comm comm, int *lens, MPI_Aint *displs, MPI_Request *req) {
    if (end - first == 1) {
        mpr_tensor_t *t = tensors[first];
        int bytes = (int)mpr_tensor_nbytes(t); /* <= MPRI_MAX_TENSOR_BYTES */
        return send ? MPI_Isend(mpr_tensor_data(t), bytes, MPI_BYTE, peer, tag, comm, req)
                    : MPI_Irecv(mpr_tensor_data(t), bytes, MPI_BYTE, peer, tag, comm, req);
    }
    uint32_t k = end - first;
    for (uint32_t i = 0; i < k; i++) {
        mpr_tensor_t *t = tensors[first + i];
        lens[i] = (int)mpr_tensor_nbytes(t); /* < MPRI_BATCH_ALONE_BYTES */
        int rc = MPI_Get_address(mpr_tensor_data(t), &displs[i]);
        if (rc != MPI_SUCCESS) return rc;
    }
    MPI_Datatype type;
    int rc = MPI_Type_create_hindexed((int)k, lens, displs, MPI_BYTE, &type);
    if (rc != MPI_SUCCESS) return rc;
    rc = MPI_Type_commit(&type);
    if (rc == MPI_SUCCESS)
        rc = send ? MPI_Isend(MPI_BOTTOM, 1, type, peer, tag, comm, req)
                  : MPI_Irecv(MPI_BOTTOM, 1, type, peer, tag, comm, req);
    MPI_Type_free(&type); /* a pending operation keeps the type alive */
    return rc;
}
