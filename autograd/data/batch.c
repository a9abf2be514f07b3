/* data/batch.c — the shuffled mini-batch iterator.
 *
 * Invariants: data and labels are held as contiguous references for the
 * iterator's life; `perm` is a permutation of 0..n-1 drawn (Fisher-Yates,
 * unbiased bounded draws) from the iterator's own generator at the start of
 * every epoch, so a seed fixes the whole sequence of batches; `pos` never
 * exceeds n; batches are fresh contiguous copies (the caller may modify them). */
#include <stdlib.h>
#include <string.h>

#include "mpri_args.h"
#include "mpirpc/data.h"
#include "mpirpc/tensor_ops.h"
#include "mpri_tensor.h"

struct mpr_batch_iter {
    mpr_tensor_t *data, *labels; /* contiguous, [n, ...] */
    int64_t n, batch, pos;
    bool shuffle, drop_last, in_epoch;
    int64_t *perm;
    mpr_generator_t *gen;
};

mpr_batch_iter_t *mpr_batch_iter_create(mpr_tensor_t *data, mpr_tensor_t *labels, int64_t batch_size,
                                        bool shuffle, bool drop_last, uint64_t seed) {
    MPRI_ARG_NONNULL_OR(data, NULL);
    if (!data) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "batch_iter_create: data is NULL");
        return NULL;
    }
    if (data->ndim < 1 || batch_size < 1) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "batch_iter_create: need data with >= 1 dim and batch_size >= 1 (got %d dims, "
                      "batch %lld)", data->ndim, (long long)batch_size);
        return NULL;
    }
    if (labels && (labels->ndim < 1 || labels->shape[0] != data->shape[0])) {
        mpr_error_set(MPR_ERR_SHAPE, "batch_iter_create: data has %lld rows but labels have %lld",
                      (long long)data->shape[0], labels->ndim ? (long long)labels->shape[0] : 0LL);
        return NULL;
    }
    if (data->storage->device >= 0 || (labels && labels->storage->device >= 0)) {
        mpr_error_set(MPR_ERR_UNSUPPORTED, "batch_iter_create: data must be on the CPU");
        return NULL;
    }
    mpr_batch_iter_t *it = calloc(1, sizeof *it);
    if (!it) goto nomem;
    it->n = data->shape[0];
    it->batch = batch_size;
    it->shuffle = shuffle;
    it->drop_last = drop_last;
    it->perm = malloc((size_t)(it->n ? it->n : 1) * sizeof *it->perm);
    it->gen = mpr_generator_create(seed);
    if (!it->perm || !it->gen) goto nomem;
    it->data = mpr_tensor_contiguous(data);
    if (!it->data) goto fail;
    if (labels) {
        it->labels = mpr_tensor_contiguous(labels);
        if (!it->labels) goto fail;
    }
    return it;
nomem:
    mpr_error_set(MPR_ERR_NOMEM, "batch_iter_create: out of memory");
fail:
    mpr_batch_iter_destroy(it);
    return NULL;
}

void mpr_batch_iter_destroy(mpr_batch_iter_t *it) {
    if (!it) return;
    mpr_tensor_release(it->data);
    mpr_tensor_release(it->labels);
    mpr_generator_destroy(it->gen);
    free(it->perm);
    free(it);
}

int64_t mpr_batch_iter_num_batches(const mpr_batch_iter_t *it) {
    MPRI_ARG_NONNULL_OR(it, 0);
    if (!it) return 0;
    return it->drop_last ? it->n / it->batch : (it->n + it->batch - 1) / it->batch;
}

void mpr_batch_iter_reset(mpr_batch_iter_t *it) {
    MPRI_ARG_NONNULL_OR(it, );
    if (it) it->in_epoch = false;
}

/* Uniform integer in [0, bound) without modulo bias (Lemire's method). */
static uint64_t bounded(mpr_generator_t *gen, uint64_t bound) {
    for (;;) {
        unsigned __int128 m = (unsigned __int128)mpr_generator_next_u64(gen) * bound;
        uint64_t lo = (uint64_t)m;
        if (lo >= bound || lo >= (-bound) % bound) return (uint64_t)(m >> 64);
    }
}

static void start_epoch(mpr_batch_iter_t *it) {
    for (int64_t i = 0; i < it->n; i++) it->perm[i] = i;
    if (it->shuffle)
        for (int64_t i = it->n - 1; i > 0; i--) {
            int64_t j = (int64_t)bounded(it->gen, (uint64_t)i + 1);
            int64_t t = it->perm[i];
            it->perm[i] = it->perm[j];
            it->perm[j] = t;
        }
    it->pos = 0;
    it->in_epoch = true;
}

/* Rows perm[pos, pos+b) of `src` [n, ...] as a new [b, ...] tensor. */
static mpr_tensor_t *gather_rows(const mpr_tensor_t *src, const int64_t *rows, int64_t b) {
    int64_t shape[MPR_MAX_DIMS];
    memcpy(shape, src->shape, sizeof shape);
    shape[0] = b;
    mpr_tensor_t *out = mpr_tensor_empty(src->dtype, src->ndim, shape);
    if (!out) return NULL;
    size_t row_bytes = src->shape[0] ? mpr_tensor_nbytes(src) / (size_t)src->shape[0] : 0;
    const char *s = mpr_tensor_data(src);
    char *d = mpr_tensor_data(out);
    for (int64_t i = 0; i < b; i++) memcpy(d + (size_t)i * row_bytes, s + (size_t)rows[i] * row_bytes, row_bytes);
    return out;
}

bool mpr_batch_iter_next(mpr_batch_iter_t *it, mpr_tensor_t **x, mpr_tensor_t **y) {
    if (x) *x = NULL;
    if (y) *y = NULL;
    MPRI_ARG_NONNULL_OR(it, false);
    MPRI_ARG_NONNULL_OR(x, false);
    if (!it || !x) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "batch_iter_next: NULL argument");
        return false;
    }
    if (!it->in_epoch) start_epoch(it);
    int64_t left = it->n - it->pos;
    int64_t b = left < it->batch ? left : it->batch;
    if (b == 0 || (it->drop_last && b < it->batch)) {
        it->in_epoch = false;
        return false;
    }
    const int64_t *rows = it->perm + it->pos;
    mpr_tensor_t *bx = gather_rows(it->data, rows, b);
    mpr_tensor_t *by = it->labels && y ? gather_rows(it->labels, rows, b) : NULL;
    if (!bx || (it->labels && y && !by)) {
        mpr_tensor_release(bx);
        mpr_tensor_release(by);
        return false;
    }
    it->pos += b;
    *x = mpr_scope_adopt(bx);
    if (y) *y = by ? mpr_scope_adopt(by) : NULL;
    return true;
}
