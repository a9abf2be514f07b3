/* mpirpc/tensor_io.h — save and load tensors as NumPy .npy files and sets of
 * named tensors as .safetensors files, so numbers can be exchanged with
 * PyTorch/NumPy tooling.
 *
 * .npy: format versions 1.0, 2.0 and 3.0 are read; 1.0 is written (2.0 when the
 * header would exceed 64 KiB). Supported dtypes: '<f4' (f32), '<f8' (f64),
 * '<i8' (i64), '<i4' (i32), '|u1' (u8); C order only. Fortran order, big-endian
 * data, other dtypes are rejected with MPR_ERR_UNSUPPORTED; bad magic, a
 * malformed header or a truncated file with MPR_ERR_DECODE; file system
 * failures with MPR_ERR_IO. Every message names the file.
 *
 * .safetensors: 8-byte little-endian header length, a JSON header
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {"key": "value", ...}} padded with spaces to 8 bytes, then
 * the raw little-endian data. dtypes F32, F64, I64, I32, U8.
 *
 * Only CPU tensors can be saved (a CUDA tensor gives MPR_ERR_UNSUPPORTED);
 * strided tensors are written in C order. Loaded tensors are new contiguous
 * CPU tensors without requires_grad.
 *
 * Ownership: functions returning `mpr_tensor_t *` or `mpr_tensor_dict_t *`
 * return a new object the caller releases/destroys, or NULL with
 * mpr_last_error() set. Tensor arguments are borrowed unless stated. */
#ifndef MPIRPC_TENSOR_IO_H
#define MPIRPC_TENSOR_IO_H

#include <stddef.h>

#include "mpirpc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- .npy ---- */

/* Write `t` (any shape, any strides, CPU) to `path`, replacing the file. */
mpr_err_t mpr_tensor_save_npy(mpr_tensor_t *t, const char *path);
/* Read a .npy file into a new contiguous tensor. */
mpr_tensor_t *mpr_tensor_load_npy(const char *path);
/* Encode `t` as .npy bytes: *out is a new malloc'd buffer (caller free()s),
 * *out_len its length. */
mpr_err_t mpr_tensor_npy_encode(mpr_tensor_t *t, void **out, size_t *out_len);
/* Decode .npy bytes buf[0, len) (borrowed; copied) into a new tensor. `what`
 * names the source in error messages (NULL: "npy"). */
mpr_tensor_t *mpr_tensor_npy_decode(const void *buf, size_t len, const char *what);

/* ---- named tensor sets ---- */

/* An ordered map name -> tensor plus string metadata (insertion order kept). */
typedef struct mpr_tensor_dict mpr_tensor_dict_t;

mpr_tensor_dict_t *mpr_tensor_dict_create(void);
/* Releases every tensor the dict holds. NULL is a no-op. */
void mpr_tensor_dict_destroy(mpr_tensor_dict_t *d);
/* Store `t` under `name` (copied; non-empty). The dict takes a new reference
 * to `t` (the caller keeps its own); an existing entry of that name is replaced. */
mpr_err_t mpr_tensor_dict_set(mpr_tensor_dict_t *d, const char *name, mpr_tensor_t *t);
/* Borrowed tensor stored under `name`, valid while the dict holds it; NULL with
 * MPR_ERR_NOT_FOUND when absent. */
mpr_tensor_t *mpr_tensor_dict_get(const mpr_tensor_dict_t *d, const char *name);
size_t mpr_tensor_dict_count(const mpr_tensor_dict_t *d);
/* Name / borrowed tensor of entry i (0 <= i < count); NULL with MPR_ERR_INVALID_ARG
 * when out of range. */
const char *mpr_tensor_dict_name(const mpr_tensor_dict_t *d, size_t i);
mpr_tensor_t *mpr_tensor_dict_tensor(const mpr_tensor_dict_t *d, size_t i);
/* String metadata (both strings copied); saved as safetensors "__metadata__". */
mpr_err_t mpr_tensor_dict_set_meta(mpr_tensor_dict_t *d, const char *key, const char *value);
/* Borrowed value, or NULL when absent. */
const char *mpr_tensor_dict_get_meta(const mpr_tensor_dict_t *d, const char *key);
/* Metadata entries in insertion order: count, and the borrowed key / value
 * of entry i (0 <= i < count; NULL with MPR_ERR_INVALID_ARG out of range). */
size_t mpr_tensor_dict_meta_count(const mpr_tensor_dict_t *d);
const char *mpr_tensor_dict_meta_key(const mpr_tensor_dict_t *d, size_t i);
const char *mpr_tensor_dict_meta_value(const mpr_tensor_dict_t *d, size_t i);
/* Put every tensor (a new reference) and metadata entry of `src` (borrowed)
 * into `d`, replacing entries of the same name, like Python's dict.update. */
mpr_err_t mpr_tensor_dict_update(mpr_tensor_dict_t *d, const mpr_tensor_dict_t *src);

/* ---- .safetensors ---- */

mpr_err_t mpr_safetensors_save(const mpr_tensor_dict_t *d, const char *path);
mpr_tensor_dict_t *mpr_safetensors_load(const char *path);
/* Decode safetensors bytes buf[0, len) (borrowed; copied). */
mpr_tensor_dict_t *mpr_safetensors_decode(const void *buf, size_t len, const char *what);
/* Encode to a new malloc'd buffer (*out, caller free()s) of *out_len bytes. */
mpr_err_t mpr_safetensors_encode(const mpr_tensor_dict_t *d, void **out, size_t *out_len);

/* Save a list of named tensors (e.g. a module's named parameters):
 * names[n], tensors[n] borrowed. */
mpr_err_t mpr_safetensors_save_list(const char *path, size_t n, const char *const *names,
                                    mpr_tensor_t *const *tensors);
/* Copy the values stored in `d` into existing tensors in place (e.g. a module's
 * parameters): for each i, d[names[i]] must exist with exactly the shape and
 * dtype of tensors[i] (else MPR_ERR_NOT_FOUND / MPR_ERR_SHAPE / MPR_ERR_DTYPE
 * naming the entry; nothing is written unless every entry matches). When
 * `strict`, entries of `d` not named in names[] are an error too. The storage
 * version of each written tensor is bumped (like an in-place op). */
mpr_err_t mpr_tensor_dict_copy_into(const mpr_tensor_dict_t *d, size_t n,
                                    const char *const *names, mpr_tensor_t *const *tensors,
                                    bool strict);
/* mpr_safetensors_load + mpr_tensor_dict_copy_into. */
mpr_err_t mpr_safetensors_load_into(const char *path, size_t n, const char *const *names,
                                    mpr_tensor_t *const *tensors, bool strict);

/* ---- module parameters (mpirpc/nn.h) ---- */

struct mpr_module;
/* Save every named parameter of module `m` (names as its named_parameters(),
 * e.g. "0.weight") to `path`; readable by PyTorch's load_state_dict after
 * safetensors.torch.load_file. Borrows m. */
mpr_err_t mpr_module_save_safetensors(struct mpr_module *m, const char *path);
/* Copy the tensors of a .safetensors file into the parameters of `m` by name
 * (shapes and dtypes must match; see mpr_tensor_dict_copy_into). With
 * `strict`, file entries that are not parameters of m are an error too (as
 * load_state_dict(strict=True)). Nothing is written unless all match. */
mpr_err_t mpr_module_load_safetensors(struct mpr_module *m, const char *path, bool strict);

#ifdef __cplusplus
}
#endif
#endif
