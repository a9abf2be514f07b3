/* io/file.c — whole-file read/write and C-order element copies shared by the
 * .npy and .safetensors readers and writers.
 *
 * Invariants: a read returns exactly the file's bytes (a short read or a file
 * that changes size under us is an MPR_ERR_IO error, never a partial buffer);
 * a failed write reports MPR_ERR_IO and closes the file; strided copies touch
 * only elements inside the tensor's view. */
#include "mpri_io.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_tensor.h"

mpr_err_t mpri_io_read_file(const char *path, const char *what, void **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    if (!path) return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: path is NULL", what);
    FILE *f = fopen(path, "rb");
    if (!f) return mpr_error_set(MPR_ERR_IO, "%s: cannot open '%s': %s", what, path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) goto io_fail;
    long size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) goto io_fail;
    char *buf = malloc((size_t)size + 1);
    if (!buf) {
        fclose(f);
        return mpr_error_set(MPR_ERR_NOMEM, "%s: cannot allocate %ld bytes for '%s'", what, size, path);
    }
    size_t got = fread(buf, 1, (size_t)size, f);
    if (got != (size_t)size || ferror(f)) {
        free(buf);
        goto io_fail;
    }
    fclose(f);
    buf[size] = '\0';
    *out = buf;
    *out_len = (size_t)size;
    return MPR_OK;
io_fail: {
    int e = errno;
    fclose(f);
    return mpr_error_set(MPR_ERR_IO, "%s: cannot read '%s': %s", what, path, e ? strerror(e) : "short read");
}
}

mpr_err_t mpri_io_write_file(const char *path, const char *what, const void *buf, size_t len) {
    if (!path) return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: path is NULL", what);
    FILE *f = fopen(path, "wb");
    if (!f) return mpr_error_set(MPR_ERR_IO, "%s: cannot create '%s': %s", what, path, strerror(errno));
    size_t put = len ? fwrite(buf, 1, len, f) : 0;
    int e = errno;
    bool ok = put == len && !ferror(f);
    if (fclose(f) != 0) {
        e = errno;
        ok = false;
    }
    if (!ok)
        return mpr_error_set(MPR_ERR_IO, "%s: cannot write '%s': %s", what, path, strerror(e));
    return MPR_OK;
}

/* Walk every element of `t` in C order, copying between it and a packed buffer. */
static void copy_strided(mpr_tensor_t *t, char *packed, bool to_packed) {
    size_t esz = mpr_dtype_size(t->dtype);
    int64_t numel = mpr_tensor_numel(t);
    if (mpr_tensor_is_contiguous(t)) {
        char *data = mpr_tensor_data(t);
        if (to_packed)
            memcpy(packed, data, (size_t)numel * esz);
        else
            memcpy(data, packed, (size_t)numel * esz);
        return;
    }
    int64_t idx[MPR_MAX_DIMS] = {0};
    char *base = (char *)t->storage->data;
    for (int64_t n = 0; n < numel; n++) {
        int64_t off = t->offset;
        for (int d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
        if (to_packed)
            memcpy(packed + (size_t)n * esz, base + off * (int64_t)esz, esz);
        else
            memcpy(base + off * (int64_t)esz, packed + (size_t)n * esz, esz);
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
}

void mpri_io_copy_out(const mpr_tensor_t *t, void *dst) {
    copy_strided((mpr_tensor_t *)t, dst, true);
}

void mpri_io_copy_in(mpr_tensor_t *t, const void *src) {
    copy_strided(t, (char *)src, false);
}
