/* data/idx.c — IDX file reader (MNIST / Fashion-MNIST format, gzip'd or
 * plain) and the MNIST-style dataset loader built on it.
 *
 * Invariants: every byte count is checked against what zlib delivered (a short
 * read is "truncated", extra bytes after the declared data are "trailing
 * data"), the declared size is overflow-checked and capped before anything is
 * allocated, big-endian elements are converted to host order, and on any
 * failure nothing is returned and nothing leaks. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "mpri_args.h"
#include "mpirpc/data.h"
#include "mpri_tensor.h"

#define IDX_MAX_BYTES ((int64_t)1 << 34) /* 16 GiB: refuse absurd headers */

/* Read exactly n bytes; MPR_OK, or an error naming `path`. */
static mpr_err_t gz_read_exact(gzFile f, const char *path, void *dst, size_t n, const char *part) {
    char *p = dst;
    while (n > 0) {
        unsigned chunk = n > (1u << 30) ? (1u << 30) : (unsigned)n;
        int got = gzread(f, p, chunk);
        if (got < 0) {
            int zerr;
            const char *msg = gzerror(f, &zerr);
            return mpr_error_set(zerr == Z_ERRNO ? MPR_ERR_IO : MPR_ERR_DECODE, "idx_load: '%s': %s while reading %s",
                                 path, zerr == Z_ERRNO ? strerror(errno) : msg, part);
        }
        if (got == 0)
            return mpr_error_set(MPR_ERR_DECODE, "idx_load: '%s' is truncated (%zu bytes of %s missing)", path, n,
                                 part);
        p += got;
        n -= (size_t)got;
    }
    return MPR_OK;
}

static uint32_t be32(const unsigned char *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | (uint32_t)b[3];
}

/* Reverse the bytes of each of n elements of size esz (big-endian -> host). */
static void swap_elements(void *data, int64_t n, size_t esz) {
    unsigned char *p = data;
    for (int64_t i = 0; i < n; i++, p += esz)
        for (size_t a = 0, b = esz - 1; a < b; a++, b--) {
            unsigned char t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

mpr_tensor_t *mpr_idx_load(const char *path) {
    MPRI_ARG_NONNULL_OR(path, NULL);
    if (!path) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "idx_load: path is NULL");
        return NULL;
    }
    gzFile f = gzopen(path, "rb");
    if (!f) {
        mpr_error_set(MPR_ERR_IO, "idx_load: cannot open '%s': %s", path, errno ? strerror(errno) : "gzopen failed");
        return NULL;
    }
    mpr_tensor_t *t = NULL;
    unsigned char hdr[4];
    if (gz_read_exact(f, path, hdr, 4, "the header") != MPR_OK) goto out;
    if (hdr[0] != 0 || hdr[1] != 0) {
        mpr_error_set(MPR_ERR_DECODE, "idx_load: '%s' is not an IDX file (magic %02x %02x %02x %02x)", path, hdr[0],
                      hdr[1], hdr[2], hdr[3]);
        goto out;
    }
    mpr_dtype_t dtype;
    switch (hdr[2]) {
    case 0x08: dtype = MPR_U8; break;
    case 0x0C: dtype = MPR_I32; break;
    case 0x0D: dtype = MPR_F32; break;
    case 0x0E: dtype = MPR_F64; break;
    case 0x09:
    case 0x0B:
        mpr_error_set(MPR_ERR_UNSUPPORTED, "idx_load: '%s': IDX element type 0x%02x (i8/i16) is not supported", path,
                      hdr[2]);
        goto out;
    default:
        mpr_error_set(MPR_ERR_DECODE, "idx_load: '%s': unknown IDX element type 0x%02x", path, hdr[2]);
        goto out;
    }
    int ndim = hdr[3];
    if (ndim < 1 || ndim > MPR_MAX_DIMS) {
        mpr_error_set(MPR_ERR_DECODE, "idx_load: '%s': %d dimensions (expected 1..%d)", path, ndim, MPR_MAX_DIMS);
        goto out;
    }
    unsigned char dims[4 * MPR_MAX_DIMS];
    if (gz_read_exact(f, path, dims, 4 * (size_t)ndim, "the dimensions") != MPR_OK) goto out;
    int64_t shape[MPR_MAX_DIMS], numel;
    for (int i = 0; i < ndim; i++) shape[i] = be32(dims + 4 * i);
    if (mpri_tensor_check_shape("idx_load", dtype, ndim, shape, &numel) != MPR_OK) {
        mpr_error_set(MPR_ERR_DECODE, "idx_load: '%s': dimensions too large", path);
        goto out;
    }
    size_t esz = mpr_dtype_size(dtype);
    if (numel > IDX_MAX_BYTES / (int64_t)esz) {
        mpr_error_set(MPR_ERR_DECODE, "idx_load: '%s' declares %lld elements (more than the %lld-byte limit)", path,
                      (long long)numel, (long long)IDX_MAX_BYTES);
        goto out;
    }
    t = mpr_tensor_empty(dtype, ndim, shape);
    if (!t) goto out;
    if (gz_read_exact(f, path, mpr_tensor_data(t), (size_t)numel * esz, "the data") != MPR_OK) goto fail;
    unsigned char extra;
    int more = gzread(f, &extra, 1);
    if (more != 0) {
        int zerr;
        const char *msg = gzerror(f, &zerr);
        if (more > 0)
            mpr_error_set(MPR_ERR_DECODE, "idx_load: '%s' has trailing data after the %lld declared elements", path,
                          (long long)numel);
        else
            mpr_error_set(MPR_ERR_DECODE, "idx_load: '%s': %s after the data", path, msg);
        goto fail;
    }
    if (esz > 1) swap_elements(mpr_tensor_data(t), numel, esz);
    goto out;
fail:
    mpr_tensor_release(t);
    t = NULL;
out:
    gzclose(f);
    return t;
}

mpr_err_t mpr_mnist_load(const char *dir, bool train, bool flat, mpr_tensor_t **images, mpr_tensor_t **labels) {
    if (images) *images = NULL;
    if (labels) *labels = NULL;
    MPRI_ARG_NONNULL(images);
    MPRI_ARG_NONNULL(labels);
    if (!images || !labels) return mpr_error_set(MPR_ERR_INVALID_ARG, "mnist_load: output pointer is NULL");
    *images = *labels = NULL;
    if (!dir) dir = getenv("MPIRPC_FASHION_MNIST_DIR");
    if (!dir) dir = MPR_FASHION_MNIST_DIR;
    const char *split = train ? "train" : "t10k";
    char ipath[4096], lpath[4096];
    snprintf(ipath, sizeof ipath, "%s/%s-images-idx3-ubyte.gz", dir, split);
    snprintf(lpath, sizeof lpath, "%s/%s-labels-idx1-ubyte.gz", dir, split);
    mpr_tensor_t *raw_i = mpr_idx_load(ipath);
    if (!raw_i) return mpr_last_error_code();
    mpr_tensor_t *raw_l = mpr_idx_load(lpath);
    if (!raw_l) {
        mpr_tensor_release(raw_i);
        return mpr_last_error_code();
    }
    mpr_err_t rc = MPR_OK;
    mpr_tensor_t *img = NULL, *lab = NULL;
    if (raw_i->dtype != MPR_U8 || raw_i->ndim != 3) {
        rc = mpr_error_set(MPR_ERR_DECODE, "mnist_load: '%s' must hold u8 images [N, rows, cols] (got %s, %d dims)",
                           ipath, mpr_dtype_name(raw_i->dtype), raw_i->ndim);
        goto out;
    }
    if (raw_l->dtype != MPR_U8 || raw_l->ndim != 1) {
        rc = mpr_error_set(MPR_ERR_DECODE, "mnist_load: '%s' must hold u8 labels [N] (got %s, %d dims)", lpath,
                           mpr_dtype_name(raw_l->dtype), raw_l->ndim);
        goto out;
    }
    int64_t n = raw_i->shape[0], rows = raw_i->shape[1], cols = raw_i->shape[2];
    if (raw_l->shape[0] != n) {
        rc = mpr_error_set(MPR_ERR_SHAPE, "mnist_load: %lld images in '%s' but %lld labels in '%s'", (long long)n,
                           ipath, (long long)raw_l->shape[0], lpath);
        goto out;
    }
    img = flat ? mpr_tensor_empty(MPR_F32, 2, (const int64_t[]){n, rows * cols})
               : mpr_tensor_empty(MPR_F32, 4, (const int64_t[]){n, 1, rows, cols});
    lab = mpr_tensor_empty(MPR_I64, 1, (const int64_t[]){n});
    if (!img || !lab) {
        rc = mpr_last_error_code();
        goto out;
    }
    const uint8_t *src = mpr_tensor_data(raw_i);
    float *dst = mpr_tensor_data(img);
    for (int64_t i = 0; i < n * rows * cols; i++) dst[i] = (float)src[i] * (1.0f / 255.0f);
    const uint8_t *ls = mpr_tensor_data(raw_l);
    int64_t *ld = mpr_tensor_data(lab);
    for (int64_t i = 0; i < n; i++) ld[i] = ls[i];
out:
    mpr_tensor_release(raw_i);
    mpr_tensor_release(raw_l);
    if (rc != MPR_OK) {
        mpr_tensor_release(img);
        mpr_tensor_release(lab);
        return rc;
    }
    *images = img;
    *labels = lab;
    return MPR_OK;
}
