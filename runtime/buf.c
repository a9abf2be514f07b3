/* buf.c — growable encode buffer and bounds-checked decode reader.
 *
 * Numbers are copied in the host's byte order (the ranks of a job share one
 * architecture); a blob is a u32 length and its bytes. The buffer doubles
 * from 256 bytes; mpri_buf_steal hands its memory to the caller.
 *
 * Invariants: a writer that fails to grow (or is given a blob over 4 GiB)
 * sets `failed` and ignores further appends (the encoder checks once at the
 * end); a reader never advances past `left` and reports truncation as
 * MPR_ERR_DECODE with the field size; mpri_read_blob returns a pointer into
 * the reader's buffer (no copy), valid as long as that buffer. */
#include "mpri_buf.h"

#include <stdlib.h>
#include <string.h>

void mpri_buf_init(mpri_buf_t *b) { memset(b, 0, sizeof *b); }

void mpri_buf_fini(mpri_buf_t *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

bool mpri_buf_reserve(mpri_buf_t *b, size_t extra) {
    if (b->failed) return false;
    if (b->len + extra <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) cap *= 2;
    uint8_t *d = realloc(b->data, cap);
    if (!d) {
        b->failed = true;
        return false;
    }
    b->data = d;
    b->cap = cap;
    return true;
}

void mpri_buf_put_blob(mpri_buf_t *b, const void *p, size_t n) {
    if (n > UINT32_MAX) {
        b->failed = true;
        return;
    }
    mpri_buf_put_u32(b, (uint32_t)n);
    mpri_buf_put(b, p, n);
}

uint8_t *mpri_buf_steal(mpri_buf_t *b, size_t *len) {
    uint8_t *d = b->data;
    *len = b->len;
    memset(b, 0, sizeof *b);
    return d;
}

void mpri_reader_init(mpri_reader_t *r, const void *data, size_t len) {
    r->p = data;
    r->left = len;
}

mpr_err_t mpri_read(mpri_reader_t *r, void *out, size_t n) {
    if (n > r->left)
        return mpr_error_set(MPR_ERR_DECODE, "truncated message: need %zu bytes, %zu left", n,
                             r->left);
    if (n) memcpy(out, r->p, n);
    r->p += n;
    r->left -= n;
    return MPR_OK;
}

mpr_err_t mpri_read_u8(mpri_reader_t *r, uint8_t *out) { return mpri_read(r, out, 1); }
mpr_err_t mpri_read_u16(mpri_reader_t *r, uint16_t *out) { return mpri_read(r, out, 2); }
mpr_err_t mpri_read_u32(mpri_reader_t *r, uint32_t *out) { return mpri_read(r, out, 4); }
mpr_err_t mpri_read_u64(mpri_reader_t *r, uint64_t *out) { return mpri_read(r, out, 8); }

mpr_err_t mpri_read_blob(mpri_reader_t *r, const void **data, size_t *len) {
    uint32_t n = 0; /* set on success; zero keeps -Wmaybe-uninitialized quiet once inlined */
    mpr_err_t e = mpri_read_u32(r, &n);
    if (e) return e;
    if (n > r->left)
        return mpr_error_set(MPR_ERR_DECODE, "truncated message: blob of %u bytes, %zu left", n,
                             r->left);
    *data = r->p;
    *len = n;
    r->p += n;
    r->left -= n;
    return MPR_OK;
}
