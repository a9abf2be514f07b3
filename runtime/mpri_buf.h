/* mpri_buf.h — a growable byte buffer for encoding and a bounds-checked reader
 * for decoding (not installed).
 *
 * Writers append fixed-width fields in host byte order (all ranks of an MPI
 * job share one architecture). Every reader call checks the remaining length
 * first and fails with MPR_ERR_DECODE instead of reading past the end. */
#ifndef MPRI_BUF_H
#define MPRI_BUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "mpirpc/error.h"

typedef struct mpri_buf {
    uint8_t *data;
    size_t len, cap;
    bool failed; /* an append ran out of memory; the buffer is unusable */
} mpri_buf_t;

void mpri_buf_init(mpri_buf_t *b);
void mpri_buf_fini(mpri_buf_t *b);
/* Ensure room for `extra` more bytes; false (and failed set) on OOM. */
bool mpri_buf_reserve(mpri_buf_t *b, size_t extra);
/* The appends are inline: an encoded list of thousands of tensors makes
 * a few per tensor. Nothing is appended once `failed` is set. */
static inline void mpri_buf_put(mpri_buf_t *b, const void *p, size_t n) {
    if (!n || b->failed || (b->len + n > b->cap && !mpri_buf_reserve(b, n))) return;
    memcpy(b->data + b->len, p, n);
    b->len += n;
}
static inline void mpri_buf_put_u8(mpri_buf_t *b, uint8_t v) { mpri_buf_put(b, &v, 1); }
static inline void mpri_buf_put_u16(mpri_buf_t *b, uint16_t v) { mpri_buf_put(b, &v, 2); }
static inline void mpri_buf_put_u32(mpri_buf_t *b, uint32_t v) { mpri_buf_put(b, &v, 4); }
static inline void mpri_buf_put_u64(mpri_buf_t *b, uint64_t v) { mpri_buf_put(b, &v, 8); }
/* u32 length followed by the bytes. */
void mpri_buf_put_blob(mpri_buf_t *b, const void *p, size_t n);
/* Hand the bytes to the caller (free() them); the buffer is reset. */
uint8_t *mpri_buf_steal(mpri_buf_t *b, size_t *len);

typedef struct mpri_reader {
    const uint8_t *p;
    size_t left;
} mpri_reader_t;

void mpri_reader_init(mpri_reader_t *r, const void *data, size_t len);
mpr_err_t mpri_read(mpri_reader_t *r, void *out, size_t n);
mpr_err_t mpri_read_u8(mpri_reader_t *r, uint8_t *out);
mpr_err_t mpri_read_u16(mpri_reader_t *r, uint16_t *out);
mpr_err_t mpri_read_u32(mpri_reader_t *r, uint32_t *out);
mpr_err_t mpri_read_u64(mpri_reader_t *r, uint64_t *out);
/* A u32-length blob; *data points into the reader's buffer (borrowed). */
mpr_err_t mpri_read_blob(mpri_reader_t *r, const void **data, size_t *len);

#endif
