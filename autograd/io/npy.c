/* io/npy.c — NumPy .npy encode/decode for CPU tensors.
 *
 * Format: "\x93NUMPY", major, minor, header length (uint16 LE for 1.0,
 * uint32 LE for 2.0/3.0), a Python dict literal
 * {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with
 * spaces and a newline so the data starts on a 64-byte boundary, then the
 * raw C-order data.
 *
 * Invariants: the decoder reads only buf[0, len) and checks every length
 * before using it; the dict parser accepts exactly the three keys above
 * (each once) with literal values; the data size must equal
 * prod(shape) * itemsize (a truncated or padded file is an error). Errors:
 * MPR_ERR_DECODE for malformed input, MPR_ERR_UNSUPPORTED for valid NumPy
 * files we do not handle (fortran order, big-endian, other dtypes),
 * MPR_ERR_IO for file-system failures. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_args.h"
#include "mpirpc/tensor_io.h"
#include "mpri_io.h"
#include "mpri_tensor.h"

static const char npy_magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

static const char *npy_descr(mpr_dtype_t dt) {
    switch (dt) {
    case MPR_F32: return "<f4";
    case MPR_F64: return "<f8";
    case MPR_I64: return "<i8";
    case MPR_I32: return "<i4";
    case MPR_U8: return "|u1";
    default: return NULL;
    }
}

mpr_err_t mpr_tensor_npy_encode(mpr_tensor_t *t, void **out, size_t *out_len) {
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    MPRI_ARG_NONNULL(t);
    MPRI_ARG_NONNULL(out);
    MPRI_ARG_NONNULL(out_len);
    if (!out || !out_len) return mpr_error_set(MPR_ERR_INVALID_ARG, "npy_encode: output pointer is NULL");
    *out = NULL;
    *out_len = 0;
    if (!t) return mpr_error_set(MPR_ERR_INVALID_ARG, "npy_encode: tensor is NULL");
    if (mpr_tensor_device(t) >= 0)
        return mpr_error_set(MPR_ERR_UNSUPPORTED, "npy_encode: tensor is on cuda:%d; move it to the CPU first",
                             mpr_tensor_device(t));
    const char *descr = npy_descr(t->dtype);
    if (!descr) return mpr_error_set(MPR_ERR_INVALID_ARG, "npy_encode: invalid dtype %d", (int)t->dtype);
    char header[64 + 24 * MPR_MAX_DIMS];
    int n = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int i = 0; i < t->ndim; i++)
        n += snprintf(header + n, sizeof header - (size_t)n, "%lld,%s", (long long)t->shape[i],
                      i + 1 < t->ndim ? " " : "");
    /* NumPy writes (5,) for 1-D and (2, 3) otherwise. */
    if (t->ndim > 1) n--; /* drop the trailing comma */
    n += snprintf(header + n, sizeof header - (size_t)n, "), }");
    size_t hlen = (size_t)n;
    size_t total_hdr = 10 + hlen + 1; /* magic+version+u16 len, dict, '\n' */
    size_t pad = (64 - total_hdr % 64) % 64;
    size_t hdr_bytes = hlen + pad + 1;
    size_t data_bytes = mpr_tensor_nbytes(t);
    size_t len = 10 + hdr_bytes + data_bytes;
    unsigned char *buf = malloc(len);
    if (!buf) return mpr_error_set(MPR_ERR_NOMEM, "npy_encode: cannot allocate %zu bytes", len);
    memcpy(buf, npy_magic, 6);
    buf[6] = 1;
    buf[7] = 0;
    buf[8] = (unsigned char)(hdr_bytes & 0xff);
    buf[9] = (unsigned char)(hdr_bytes >> 8);
    memcpy(buf + 10, header, hlen);
    memset(buf + 10 + hlen, ' ', pad);
    buf[10 + hlen + pad] = '\n';
    mpri_io_copy_out(t, buf + 10 + hdr_bytes);
    *out = buf;
    *out_len = len;
    return MPR_OK;
}

mpr_err_t mpr_tensor_save_npy(mpr_tensor_t *t, const char *path) {
    MPRI_ARG_NONNULL(t);
    MPRI_ARG_NONNULL(path);
    void *buf;
    size_t len;
    mpr_err_t rc = mpr_tensor_npy_encode(t, &buf, &len);
    if (rc != MPR_OK) return rc;
    rc = mpri_io_write_file(path, "save_npy", buf, len);
    free(buf);
    return rc;
}

/* ---- header dict parser ---- */

typedef struct {
    const char *s;
    size_t len, pos;
    const char *what;
} hdr_t;

static void hskip(hdr_t *h) {
    while (h->pos < h->len && (h->s[h->pos] == ' ' || h->s[h->pos] == '\t' || h->s[h->pos] == '\n' ||
                               h->s[h->pos] == '\r'))
        h->pos++;
}

static mpr_err_t hbad(hdr_t *h, const char *msg) {
    return mpr_error_set(MPR_ERR_DECODE, "%s: malformed .npy header at byte %zu: %s", h->what, h->pos, msg);
}

static bool heat(hdr_t *h, char c) {
    hskip(h);
    if (h->pos < h->len && h->s[h->pos] == c) {
        h->pos++;
        return true;
    }
    return false;
}

/* A quoted literal (single or double quotes, no escapes) into out[cap]. */
static mpr_err_t hstring(hdr_t *h, char *out, size_t cap) {
    hskip(h);
    if (h->pos >= h->len || (h->s[h->pos] != '\'' && h->s[h->pos] != '"')) return hbad(h, "expected a string");
    char q = h->s[h->pos++];
    size_t n = 0;
    while (h->pos < h->len && h->s[h->pos] != q) {
        if (h->s[h->pos] == '\\') return hbad(h, "escapes are not supported");
        if (n + 1 >= cap) return hbad(h, "string too long");
        out[n++] = h->s[h->pos++];
    }
    if (h->pos >= h->len) return hbad(h, "unterminated string");
    h->pos++;
    out[n] = '\0';
    return MPR_OK;
}

static mpr_err_t hshape(hdr_t *h, int *ndim, int64_t *shape) {
    if (!heat(h, '(')) return hbad(h, "expected '(' for shape");
    *ndim = 0;
    for (;;) {
        if (heat(h, ')')) return MPR_OK;
        hskip(h);
        if (h->pos >= h->len || h->s[h->pos] < '0' || h->s[h->pos] > '9')
            return hbad(h, "expected a non-negative integer in shape");
        int64_t v = 0;
        while (h->pos < h->len && h->s[h->pos] >= '0' && h->s[h->pos] <= '9') {
            if (v > (INT64_MAX - 9) / 10) return hbad(h, "dimension too large");
            v = v * 10 + (h->s[h->pos++] - '0');
        }
        if (h->pos < h->len && h->s[h->pos] == 'L') h->pos++; /* Python 2 long */
        if (*ndim >= MPR_MAX_DIMS)
            return mpr_error_set(MPR_ERR_UNSUPPORTED, "%s: .npy array has more than %d dimensions", h->what,
                                 MPR_MAX_DIMS);
        shape[(*ndim)++] = v;
        if (heat(h, ',')) continue;
        if (heat(h, ')')) return MPR_OK;
        return hbad(h, "expected ',' or ')' in shape");
    }
}

static mpr_err_t parse_header(hdr_t *h, mpr_dtype_t *dtype, int *ndim, int64_t *shape) {
    bool have_descr = false, have_order = false, have_shape = false;
    if (!heat(h, '{')) return hbad(h, "expected '{'");
    for (;;) {
        if (heat(h, '}')) break;
        char key[32];
        mpr_err_t rc = hstring(h, key, sizeof key);
        if (rc != MPR_OK) return rc;
        if (!heat(h, ':')) return hbad(h, "expected ':'");
        if (strcmp(key, "descr") == 0 && !have_descr) {
            char d[32];
            if ((rc = hstring(h, d, sizeof d)) != MPR_OK) return rc;
            have_descr = true;
            if (d[0] == '>')
                return mpr_error_set(MPR_ERR_UNSUPPORTED, "%s: big-endian .npy data ('%s') is not supported",
                                     h->what, d);
            const char *body = (d[0] == '<' || d[0] == '|' || d[0] == '=') ? d + 1 : d;
            if (strcmp(body, "f4") == 0) *dtype = MPR_F32;
            else if (strcmp(body, "f8") == 0) *dtype = MPR_F64;
            else if (strcmp(body, "i8") == 0) *dtype = MPR_I64;
            else if (strcmp(body, "i4") == 0) *dtype = MPR_I32;
            else if (strcmp(body, "u1") == 0) *dtype = MPR_U8;
            else
                return mpr_error_set(MPR_ERR_UNSUPPORTED,
                                     "%s: .npy dtype '%s' is not supported (use <f4, <f8, <i8, <i4, |u1)",
                                     h->what, d);
        } else if (strcmp(key, "fortran_order") == 0 && !have_order) {
            hskip(h);
            bool fortran;
            if (h->len - h->pos >= 4 && memcmp(h->s + h->pos, "True", 4) == 0) {
                fortran = true;
                h->pos += 4;
            } else if (h->len - h->pos >= 5 && memcmp(h->s + h->pos, "False", 5) == 0) {
                fortran = false;
                h->pos += 5;
            } else {
                return hbad(h, "fortran_order must be True or False");
            }
            have_order = true;
            if (fortran)
                return mpr_error_set(MPR_ERR_UNSUPPORTED,
                                     "%s: Fortran-order .npy arrays are not supported (save in C order)", h->what);
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            if ((rc = hshape(h, ndim, shape)) != MPR_OK) return rc;
            have_shape = true;
        } else {
            return hbad(h, "unknown or repeated key");
        }
        if (heat(h, ',')) continue;
        if (heat(h, '}')) break;
        return hbad(h, "expected ',' or '}'");
    }
    hskip(h);
    if (h->pos != h->len) return hbad(h, "characters after the dict");
    if (!have_descr || !have_order || !have_shape)
        return hbad(h, "missing 'descr', 'fortran_order' or 'shape'");
    return MPR_OK;
}

mpr_tensor_t *mpr_tensor_npy_decode(const void *buf, size_t len, const char *what) {
    MPRI_ARG_NONNULL_OR(buf, NULL);
    const unsigned char *b = buf;
    if (!what) what = "npy";
    if (!buf && len) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "%s: buffer is NULL", what);
        return NULL;
    }
    if (len < 10 || memcmp(b, npy_magic, 6) != 0) {
        mpr_error_set(MPR_ERR_DECODE, "%s: not a .npy file (bad magic or shorter than 10 bytes)", what);
        return NULL;
    }
    unsigned major = b[6];
    size_t hlen, hstart;
    if (major == 1) {
        hlen = (size_t)b[8] | (size_t)b[9] << 8;
        hstart = 10;
    } else if (major == 2 || major == 3) {
        if (len < 12) {
            mpr_error_set(MPR_ERR_DECODE, "%s: truncated .npy header", what);
            return NULL;
        }
        hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
        hstart = 12;
    } else {
        mpr_error_set(MPR_ERR_UNSUPPORTED, "%s: .npy format version %u.%u is not supported", what, major, b[7]);
        return NULL;
    }
    if (hlen > len - hstart) {
        mpr_error_set(MPR_ERR_DECODE, "%s: truncated .npy header (%zu header bytes declared, %zu present)", what,
                      hlen, len - hstart);
        return NULL;
    }
    hdr_t h = {.s = (const char *)b + hstart, .len = hlen, .pos = 0, .what = what};
    mpr_dtype_t dtype = MPR_F32;
    int ndim = 0;
    int64_t shape[MPR_MAX_DIMS];
    if (parse_header(&h, &dtype, &ndim, shape) != MPR_OK) return NULL;
    int64_t numel;
    if (mpri_tensor_check_shape(what, dtype, ndim, shape, &numel) != MPR_OK) return NULL;
    size_t data_off = hstart + hlen;
    size_t have = len - data_off;
    size_t need = (size_t)numel * mpr_dtype_size(dtype);
    if (have != need) {
        mpr_error_set(MPR_ERR_DECODE, "%s: .npy data is %zu bytes, expected %zu for %s %d-d array (%s)", what,
                      have, need, mpr_dtype_name(dtype), ndim, have < need ? "truncated" : "trailing bytes");
        return NULL;
    }
    mpr_tensor_t *t = mpr_tensor_empty(dtype, ndim, shape);
    if (!t) return NULL;
    if (need) memcpy(mpr_tensor_data(t), b + data_off, need);
    return t;
}

mpr_tensor_t *mpr_tensor_load_npy(const char *path) {
    MPRI_ARG_NONNULL_OR(path, NULL);
    void *buf;
    size_t len;
    if (mpri_io_read_file(path, "load_npy", &buf, &len) != MPR_OK) return NULL;
    mpr_tensor_t *t = mpr_tensor_npy_decode(buf, len, path);
    free(buf);
    return t;
}
