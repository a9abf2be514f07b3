/* tensor_batches.c — the batch plan of a message's tensors, its scratch,
 * and posting one batch as one non-blocking MPI message (see
 * mpri_tensor_batches.h).
 *
 * A batch's bytes on the wire are its tensors' bytes one after the other
 * (no padding), however each side lays them out in memory:
 * - a batch of one tensor, or of tensors whose bytes already lie back to
 *   back in memory (a received batch: one tensor block, mpri_tensor.h), is
 *   sent from / received into that memory as plain bytes;
 * - a send of small tensors apart in memory is first packed (memcpy) into a
 *   buffer the caller provides, when they average at most
 *   MPRI_BATCH_PACK_MAX_AVG bytes (no datatype to build per batch);
 * - otherwise (a receive into tensors apart in memory, or a send of larger
 *   tensors) an hindexed datatype over their storages, freed right after
 *   posting (MPI keeps it alive for the pending request).
 * Scratch for up to MPRI_BATCH_SCRATCH_INLINE tensors lives in the caller's
 * struct.
 *
 * Invariants: the plan depends only on the tensors' byte sizes, which the
 * receiver knows from the descriptors, so both sides agree on it; a tensor
 * of MPRI_BATCH_ALONE_BYTES or more is never copied by this code; MPI errors
 * are returned as MPI codes for the caller to report. */
#include "mpri_tensor_batches.h"

#include <stdlib.h>
#include <string.h>

#include "mpri_tensor.h"

void mpri_tensor_spans(mpr_tensor_t *const *tensors, uint32_t n, mpri_tensor_span_t *spans) {
    /* The tensors of a message are contiguous and live: no public-getter
     * checks on this per-tensor path. */
    for (uint32_t i = 0; i < n; i++) {
        const mpr_tensor_t *t = tensors[i];
        if (i + 4 < n) __builtin_prefetch(tensors[i + 4]);
        size_t elem = mpri_dtype_bytes(t->dtype), nbytes = elem;
        for (int d = 0; d < t->ndim; d++) nbytes *= (size_t)t->shape[d];
        spans[i].data = (uint8_t *)t->storage->data + t->offset * (int64_t)elem;
        spans[i].nbytes = nbytes;
    }
}

bool mpri_batch_planner_next(mpri_batch_planner_t *p, size_t nbytes) {
    if (nbytes >= MPRI_BATCH_ALONE_BYTES) {
        p->run_open = false;
        return true;
    }
    if (p->run_open && p->run_bytes + nbytes <= MPRI_BATCH_MAX_BYTES) {
        p->run_bytes += nbytes;
        return false;
    }
    p->run_open = true;
    p->run_bytes = nbytes;
    return true;
}

uint32_t mpri_batches_plan(const mpri_tensor_span_t *spans, uint32_t n, uint32_t *starts) {
    uint32_t nb = 0;
    mpri_batch_planner_t p = {0};
    for (uint32_t i = 0; i < n; i++)
        if (mpri_batch_planner_next(&p, spans[i].nbytes)) {
            if (starts) starts[nb] = i;
            nb++;
        }
    if (starts) starts[nb] = n;
    return nb;
}

bool mpri_batch_scratch_init(mpri_batch_scratch_t *s, uint32_t n, mpri_tensor_span_t *spans) {
    s->own_spans = !spans;
    if (n <= MPRI_BATCH_SCRATCH_INLINE) {
        s->spans = spans ? spans : s->inline_spans;
        s->starts = s->inline_starts;
        return true;
    }
    s->spans = spans ? spans : malloc(sizeof *s->spans * n);
    s->starts = malloc(sizeof *s->starts * ((size_t)n + 1));
    if (s->spans && s->starts) return true;
    mpri_batch_scratch_fini(s);
    return false;
}

void mpri_batch_scratch_fini(mpri_batch_scratch_t *s) {
    if (s->own_spans && s->spans != s->inline_spans) free(s->spans);
    if (s->starts != s->inline_starts) free(s->starts);
    s->spans = NULL;
    s->starts = NULL;
}

/* Total bytes of spans[first..end) if they lie back to back in memory
 * (one contiguous range starting at spans[first]), else 0 with *total
 * still set. */
static bool batch_adjacent(const mpri_tensor_span_t *spans, uint32_t first, uint32_t end, size_t *total) {
    bool adjacent = true;
    size_t sum = 0;
    const uint8_t *expect = spans[first].data;
    for (uint32_t i = first; i < end; i++) {
        adjacent &= spans[i].data == expect;
        expect += spans[i].nbytes;
        sum += spans[i].nbytes;
    }
    *total = sum;
    return adjacent;
}

size_t mpri_batch_pack_bytes(const mpri_tensor_span_t *spans, uint32_t first, uint32_t end) {
    if (end - first < 2) return 0;
    size_t total;
    if (batch_adjacent(spans, first, end, &total)) return 0;
    return total / (end - first) <= MPRI_BATCH_PACK_MAX_AVG ? total : 0;
}

int mpri_batch_post(bool send, const mpri_tensor_span_t *spans, uint32_t first, uint32_t end, int peer,
                    int tag, MPI_Comm comm, void *pack, MPI_Request *req) {
    /* A pack buffer: the caller found the batch apart in memory
     * (mpri_batch_pack_bytes > 0), so no second look. */
    if (send && pack) {
        uint8_t *p = pack;
        for (uint32_t i = first; i < end; i++) {
            memcpy(p, spans[i].data, spans[i].nbytes);
            p += spans[i].nbytes;
        }
        return MPI_Isend(pack, (int)(p - (uint8_t *)pack), MPI_BYTE, peer, tag, comm, req);
    }
    size_t total;
    if (end - first == 1 || batch_adjacent(spans, first, end, &total)) {
        void *at = spans[first].data;
        int bytes = (int)(end - first == 1 ? spans[first].nbytes : total); /* <= 2 GiB */
        return send ? MPI_Isend(at, bytes, MPI_BYTE, peer, tag, comm, req)
                    : MPI_Irecv(at, bytes, MPI_BYTE, peer, tag, comm, req);
    }
    uint32_t k = end - first;
    int inline_lens[MPRI_BATCH_SCRATCH_INLINE];
    MPI_Aint inline_displs[MPRI_BATCH_SCRATCH_INLINE];
    int *lens = k <= MPRI_BATCH_SCRATCH_INLINE ? inline_lens : malloc(sizeof *lens * k);
    MPI_Aint *displs = k <= MPRI_BATCH_SCRATCH_INLINE ? inline_displs : malloc(sizeof *displs * k);
    int rc = lens && displs ? MPI_SUCCESS : MPI_ERR_NO_MEM;
    for (uint32_t i = 0; rc == MPI_SUCCESS && i < k; i++) {
        lens[i] = (int)spans[first + i].nbytes; /* < MPRI_BATCH_ALONE_BYTES */
        rc = MPI_Get_address(spans[first + i].data, &displs[i]);
    }
    MPI_Datatype type = MPI_DATATYPE_NULL;
    if (rc == MPI_SUCCESS) rc = MPI_Type_create_hindexed((int)k, lens, displs, MPI_BYTE, &type);
    if (lens != inline_lens) free(lens);
    if (displs != inline_displs) free(displs);
    if (rc != MPI_SUCCESS) return rc;
    rc = MPI_Type_commit(&type);
    if (rc == MPI_SUCCESS)
        rc = send ? MPI_Isend(MPI_BOTTOM, 1, type, peer, tag, comm, req)
                  : MPI_Irecv(MPI_BOTTOM, 1, type, peer, tag, comm, req);
    MPI_Type_free(&type); /* a pending operation keeps the type alive */
    return rc;
}
