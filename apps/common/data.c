/* data.c — the apps' data (app.h): Fashion-MNIST with an error that tells
 * the user what to install, shards of the training set per trainer, a data
 * order that depends only on (seed, epoch, shard) so runs can resume
 * mid-training, and the count of correct predictions.
 *
 * Invariants: app_dataset_t holds either four tensors or none; epoch
 * iterators are fresh per epoch (no generator state carried between
 * epochs), so skipping k batches of epoch e reproduces an uninterrupted run. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app.h"
#include "mpirpc/nn_functional.h"
#include "mpirpc/tensor_ops.h"

static const char *split_files[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                    "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};

mpr_err_t app_fmnist_check(const char *dir) {
    if (!dir) dir = MPR_FASHION_MNIST_DIR;
    for (size_t i = 0; i < sizeof split_files / sizeof split_files[0]; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, split_files[i]);
        if (access(path, R_OK) != 0)
            return mpr_error_set(MPR_ERR_IO,
                                 "Fashion-MNIST not found: cannot read %s (%s). Install the Debian package %s "
                                 "(apt-get install %s) or point --data to a folder with the four "
                                 "*-ubyte.gz files",
                                 path, strerror(errno), APP_FMNIST_PACKAGE, APP_FMNIST_PACKAGE);
    }
    return MPR_OK;
}

mpr_err_t app_fmnist_load(const char *dir, bool flat, app_dataset_t *out) {
    *out = (app_dataset_t){0};
    if (!dir) dir = MPR_FASHION_MNIST_DIR;
    mpr_err_t e = app_fmnist_check(dir);
    if (e) return e;
    e = mpr_mnist_load(dir, true, flat, &out->train_x, &out->train_y);
    if (!e) e = mpr_mnist_load(dir, false, flat, &out->test_x, &out->test_y);
    if (e) app_dataset_free(out);
    return e;
}

void app_dataset_free(app_dataset_t *d) {
    if (!d) return;
    mpr_tensor_release(d->train_x);
    mpr_tensor_release(d->train_y);
    mpr_tensor_release(d->test_x);
    mpr_tensor_release(d->test_y);
    *d = (app_dataset_t){0};
}

mpr_tensor_t *app_shard_rows(mpr_tensor_t *t, int part, int nparts) {
    if (!t || nparts < 1 || part < 0 || part >= nparts || mpr_tensor_ndim(t) < 1) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "app_shard_rows: need a tensor and 0 <= part (%d) < nparts (%d)", part,
                      nparts);
        return NULL;
    }
    mpr_scope_begin();
    mpr_tensor_t *rows = mpr_slice(t, 0, part, mpr_tensor_shape(t)[0], nparts);
    mpr_tensor_t *out = rows ? mpr_contiguous(rows) : NULL;
    if (out) mpr_scope_keep(out); /* the caller's reference; the scope drops its own */
    mpr_scope_end();
    return out;
}

/* splitmix64's finalizer: nearby inputs give unrelated outputs. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t app_epoch_seed(uint64_t seed, int64_t epoch, int part) {
    return mix64(mix64(mix64(seed) ^ (uint64_t)epoch) ^ (uint64_t)(uint32_t)part);
}

mpr_batch_iter_t *app_epoch_batches(mpr_tensor_t *x, mpr_tensor_t *y, int64_t batch, uint64_t seed,
                                    int64_t epoch, int part, int64_t skip) {
    mpr_batch_iter_t *it = mpr_batch_iter_create(x, y, batch, true, true, app_epoch_seed(seed, epoch, part));
    if (!it) return NULL;
    if (skip > mpr_batch_iter_num_batches(it)) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "app_epoch_batches: skip %lld > %lld batches per epoch", (long long)skip,
                      (long long)mpr_batch_iter_num_batches(it));
        mpr_batch_iter_destroy(it);
        return NULL;
    }
    for (int64_t i = 0; i < skip; i++) {
        mpr_scope_begin();
        mpr_tensor_t *bx, *by;
        bool ok = mpr_batch_iter_next(it, &bx, &by);
        mpr_scope_end();
        if (!ok) {
            mpr_batch_iter_destroy(it);
            return NULL;
        }
    }
    return it;
}

int64_t app_count_correct(mpr_tensor_t *scores, mpr_tensor_t *labels) {
    if (!scores || !labels || mpr_tensor_ndim(scores) != 2 || mpr_tensor_ndim(labels) != 1 ||
        mpr_tensor_shape(scores)[0] != mpr_tensor_shape(labels)[0] || mpr_tensor_dtype(labels) != MPR_I64) {
        mpr_error_set(MPR_ERR_SHAPE, "app_count_correct: need scores [N, C] and i64 labels [N]");
        return -1;
    }
    int64_t n = mpr_tensor_shape(labels)[0];
    mpr_scope_begin();
    mpr_tensor_t *pred = mpr_argmax(scores, 1, false);
    int64_t correct = -1;
    int64_t *p = pred ? malloc((size_t)(n ? n : 1) * sizeof *p) : NULL;
    int64_t *l = p ? malloc((size_t)(n ? n : 1) * sizeof *l) : NULL;
    if (l && !mpr_copy_to_buffer(pred, MPR_I64, p, (size_t)n * sizeof *p) &&
        !mpr_copy_to_buffer(labels, MPR_I64, l, (size_t)n * sizeof *l)) {
        correct = 0;
        for (int64_t i = 0; i < n; i++) correct += p[i] == l[i];
    } else if (pred && !l) {
        mpr_error_set(MPR_ERR_NOMEM, "app_count_correct: out of memory");
    }
    free(p);
    free(l);
    mpr_scope_end();
    return correct;
}
