/* io/mpri_io.h — file helpers shared by the tensor file formats in autograd/io/
 * (internal; io/file.c implements them). */
#ifndef MPRI_IO_H
#define MPRI_IO_H

#include <stddef.h>

#include "mpirpc/tensor.h"

/* Read the whole file at `path` into a new malloc'd buffer (*out, caller
 * free()s; NUL-terminated for convenience, not counted in *out_len).
 * MPR_ERR_IO naming `what` and the path on failure. */
mpr_err_t mpri_io_read_file(const char *path, const char *what, void **out, size_t *out_len);
/* Write buf[0, len) to `path` (replacing it). MPR_ERR_IO on failure. */
mpr_err_t mpri_io_write_file(const char *path, const char *what, const void *buf, size_t len);
/* Copy a CPU tensor's elements in C order into dst (numel * esize bytes). */
void mpri_io_copy_out(const mpr_tensor_t *t, void *dst);
/* Copy numel * esize contiguous bytes from src into (possibly strided) CPU `t`. */
void mpri_io_copy_in(mpr_tensor_t *t, const void *src);

#endif
