/* mpirpc/data.h — data utilities: IDX files (MNIST / Fashion-MNIST, plain or
 * gzip'd) and a shuffled mini-batch iterator with a seeded generator.
 *
 * Debian's dataset-fashion-mnist installs
 *   /usr/share/datasets/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
 * (MPR_FASHION_MNIST_DIR). IDX: a big-endian header (0, 0, type, ndim), ndim
 * big-endian u32 sizes, then the big-endian data.
 *
 * Ownership: mpr_idx_load and mpr_mnist_load give the caller new references
 * (like mpr_tensor_empty; they do not go to a scope). The batch iterator
 * retains the tensors it is created with; the batches it returns are owned
 * like op results (mpirpc/tensor_ops.h: by the innermost open scope, else by
 * the caller). */
#ifndef MPIRPC_DATA_H
#define MPIRPC_DATA_H

#include <stdbool.h>
#include <stdint.h>

#include "mpirpc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MPR_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

/* Read an IDX file (gzip'd or not: detected from the content) into a new
 * contiguous tensor with the file's shape. Element types: 0x08 (u8) -> MPR_U8,
 * 0x0C (i32) -> MPR_I32, 0x0D (f32) -> MPR_F32, 0x0E (f64) -> MPR_F64 (converted
 * from big-endian); 0x09/0x0B give MPR_ERR_UNSUPPORTED. Missing/unreadable
 * file: MPR_ERR_IO; bad magic, corrupt gzip, truncated or over-long data:
 * MPR_ERR_DECODE. Messages name the file. */
mpr_tensor_t *mpr_idx_load(const char *path);

/* Load one split of an MNIST-format dataset from `dir` (NULL: the environment
 * variable MPIRPC_FASHION_MNIST_DIR if set, else MPR_FASHION_MNIST_DIR):
 * files "<split>-images-idx3-ubyte.gz" and "<split>-labels-idx1-ubyte.gz"
 * where split is "train" or "t10k" (`train` selects).
 * *images: f32 in [0, 1] (pixel / 255), shape [N, rows*cols] when `flat`, else
 * [N, 1, rows, cols]. *labels: i64 [N]. Both new references for the caller;
 * on failure both are NULL. Errors: image and label counts differ
 * (MPR_ERR_SHAPE), labels > 255 impossible by type, wrong ranks (MPR_ERR_DECODE). */
mpr_err_t mpr_mnist_load(const char *dir, bool train, bool flat, mpr_tensor_t **images,
                         mpr_tensor_t **labels);

/* ---- mini-batch iterator ---- */
typedef struct mpr_batch_iter mpr_batch_iter_t;

/* Iterate over the first dim of data [N, ...] and labels [N, ...] (same N;
 * labels may be NULL) in batches of `batch_size`. With `shuffle`, every epoch
 * visits a new permutation drawn from a generator seeded with `seed` (the same
 * seed gives the same batches on every run). `drop_last` skips a final partial
 * batch. Takes its own references to data and labels. */
mpr_batch_iter_t *mpr_batch_iter_create(mpr_tensor_t *data, mpr_tensor_t *labels, int64_t batch_size,
                                        bool shuffle, bool drop_last, uint64_t seed);
void mpr_batch_iter_destroy(mpr_batch_iter_t *it);
/* Next batch of the current epoch: *x [B, ...], *y [B, ...] (NULL when no
 * labels), contiguous copies of the selected rows, owned like op results.
 * Returns true with a batch, false at the end of the epoch (then the next call
 * starts a new epoch with a fresh permutation). On an allocation failure it
 * returns false with *x NULL and the error set. */
bool mpr_batch_iter_next(mpr_batch_iter_t *it, mpr_tensor_t **x, mpr_tensor_t **y);
/* Abandon the current epoch; the next call to _next starts a new one. */
void mpr_batch_iter_reset(mpr_batch_iter_t *it);
/* Batches per epoch. */
int64_t mpr_batch_iter_num_batches(const mpr_batch_iter_t *it);

#ifdef __cplusplus
}
#endif
#endif
