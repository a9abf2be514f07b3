/* io/safetensors.c — ordered named-tensor dicts and the .safetensors format.
 *
 * Format: u64 LE header length N, N bytes of JSON (padded with spaces to a
 * multiple of 8), then the data section. Each tensor's entry gives dtype
 * (F32/F64/I64/I32/U8), shape and data_offsets [begin, end) relative to the
 * data section; "__metadata__" maps strings to strings.
 *
 * The header JSON is read and written with cJSON. cJSON accepts some things
 * a safetensors header must not contain, so the decoder checks them itself:
 * repeated keys in any object it reads, anything but whitespace after the
 * JSON value, and sizes/offsets that are not integers in [0, 2^53) (cJSON
 * reads numbers as doubles; 2^53 keeps them exact; "8.0" reads as 8).
 * The encoder writes integers as plain decimal digits.
 *
 * Invariants: the decoder validates the whole header before creating any
 * tensor: the header fits in the buffer, every entry has a known dtype, a
 * non-negative shape, offsets inside the data section whose length equals
 * numel * itemsize, and no two entries overlap. A dict keeps insertion order
 * and unique names; it owns one reference to every tensor it holds.
 * copy_into checks every destination before writing any of them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "mpri_args.h"
#include "mpirpc/tensor_io.h"
#include "mpri_io.h"
#include "mpri_tensor.h"

#define MAX_HEADER_BYTES ((uint64_t)100 << 20)

struct mpr_tensor_dict {
    size_t count, cap;
    char **names;
    mpr_tensor_t **tensors;
    size_t meta_count, meta_cap;
    char **meta_keys;
    char **meta_values;
};

mpr_tensor_dict_t *mpr_tensor_dict_create(void) {
    mpr_tensor_dict_t *d = calloc(1, sizeof *d);
    if (!d) mpr_error_set(MPR_ERR_NOMEM, "tensor_dict_create: out of memory");
    return d;
}

void mpr_tensor_dict_destroy(mpr_tensor_dict_t *d) {
    if (!d) return;
    for (size_t i = 0; i < d->count; i++) {
        free(d->names[i]);
        mpr_tensor_release(d->tensors[i]);
    }
    for (size_t i = 0; i < d->meta_count; i++) {
        free(d->meta_keys[i]);
        free(d->meta_values[i]);
    }
    free(d->names);
    free(d->tensors);
    free(d->meta_keys);
    free(d->meta_values);
    free(d);
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *c = malloc(n);
    if (c) memcpy(c, s, n);
    return c;
}

/* Room for one more entry in two parallel arrays *a, *b (element sizes ea,
 * eb) holding `count` entries with capacity *cap: doubles it (`first` the
 * first time). Each pointer is updated as soon as its realloc succeeds, so
 * the caller stores both back even when this fails (out of memory: false,
 * *cap unchanged, no entry lost). */
static bool grow_pair(void **a, size_t ea, void **b, size_t eb, size_t count, size_t *cap, size_t first) {
    if (count < *cap) return true;
    size_t n = *cap ? *cap * 2 : first;
    void *na = realloc(*a, n * ea);
    if (!na) return false;
    *a = na;
    void *nb = realloc(*b, n * eb);
    if (!nb) return false;
    *b = nb;
    *cap = n;
    return true;
}

mpr_err_t mpr_tensor_dict_set(mpr_tensor_dict_t *d, const char *name, mpr_tensor_t *t) {
    MPRI_ARG_NONNULL(d);
    MPRI_ARG_NONNULL(name);
    MPRI_ARG_NONNULL(t);
    if (!d || !name || !t) return mpr_error_set(MPR_ERR_INVALID_ARG, "tensor_dict_set: NULL argument");
    if (!name[0]) return mpr_error_set(MPR_ERR_INVALID_ARG, "tensor_dict_set: empty name");
    if (strcmp(name, "__metadata__") == 0)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "tensor_dict_set: the name '__metadata__' is reserved");
    for (size_t i = 0; i < d->count; i++)
        if (strcmp(d->names[i], name) == 0) {
            mpr_tensor_retain(t);
            mpr_tensor_release(d->tensors[i]);
            d->tensors[i] = t;
            return MPR_OK;
        }
    void *names = d->names, *ts = d->tensors;
    bool room = grow_pair(&names, sizeof *d->names, &ts, sizeof *d->tensors, d->count, &d->cap, 8);
    d->names = names;
    d->tensors = ts;
    if (!room) return mpr_error_set(MPR_ERR_NOMEM, "tensor_dict_set: out of memory");
    char *copy = dup_str(name);
    if (!copy) return mpr_error_set(MPR_ERR_NOMEM, "tensor_dict_set: out of memory");
    d->names[d->count] = copy;
    d->tensors[d->count] = mpr_tensor_retain(t);
    d->count++;
    return MPR_OK;
}

mpr_tensor_t *mpr_tensor_dict_get(const mpr_tensor_dict_t *d, const char *name) {
    MPRI_ARG_NONNULL_OR(d, NULL);
    MPRI_ARG_NONNULL_OR(name, NULL);
    if (!d || !name) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "tensor_dict_get: NULL argument");
        return NULL;
    }
    for (size_t i = 0; i < d->count; i++)
        if (strcmp(d->names[i], name) == 0) return d->tensors[i];
    mpr_error_set(MPR_ERR_NOT_FOUND, "tensor_dict_get: no tensor named '%s'", name);
    return NULL;
}

size_t mpr_tensor_dict_count(const mpr_tensor_dict_t *d) {
    MPRI_ARG_NONNULL_OR(d, 0);
    return d ? d->count : 0;
}

const char *mpr_tensor_dict_name(const mpr_tensor_dict_t *d, size_t i) {
    MPRI_ARG_NONNULL_OR(d, NULL);
    if (d && i < d->count) return d->names[i];
    if (d) mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_tensor_dict_name: entry %zu out of range (%zu entries)", i, d->count);
    return NULL;
}

mpr_tensor_t *mpr_tensor_dict_tensor(const mpr_tensor_dict_t *d, size_t i) {
    MPRI_ARG_NONNULL_OR(d, NULL);
    if (d && i < d->count) return d->tensors[i];
    if (d) mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_tensor_dict_tensor: entry %zu out of range (%zu entries)", i, d->count);
    return NULL;
}

mpr_err_t mpr_tensor_dict_set_meta(mpr_tensor_dict_t *d, const char *key, const char *value) {
    MPRI_ARG_NONNULL(d);
    MPRI_ARG_NONNULL(key);
    MPRI_ARG_NONNULL(value);
    if (!d || !key || !value) return mpr_error_set(MPR_ERR_INVALID_ARG, "tensor_dict_set_meta: NULL argument");
    char *v = dup_str(value);
    if (!v) return mpr_error_set(MPR_ERR_NOMEM, "tensor_dict_set_meta: out of memory");
    for (size_t i = 0; i < d->meta_count; i++)
        if (strcmp(d->meta_keys[i], key) == 0) {
            free(d->meta_values[i]);
            d->meta_values[i] = v;
            return MPR_OK;
        }
    void *keys = d->meta_keys, *values = d->meta_values;
    bool room =
        grow_pair(&keys, sizeof *d->meta_keys, &values, sizeof *d->meta_values, d->meta_count, &d->meta_cap, 4);
    d->meta_keys = keys;
    d->meta_values = values;
    if (!room) {
        free(v);
        return mpr_error_set(MPR_ERR_NOMEM, "tensor_dict_set_meta: out of memory");
    }
    char *k = dup_str(key);
    if (!k) {
        free(v);
        return mpr_error_set(MPR_ERR_NOMEM, "tensor_dict_set_meta: out of memory");
    }
    d->meta_keys[d->meta_count] = k;
    d->meta_values[d->meta_count] = v;
    d->meta_count++;
    return MPR_OK;
}

const char *mpr_tensor_dict_get_meta(const mpr_tensor_dict_t *d, const char *key) {
    MPRI_ARG_NONNULL_OR(d, NULL);
    MPRI_ARG_NONNULL_OR(key, NULL);
    if (!d || !key) return NULL;
    for (size_t i = 0; i < d->meta_count; i++)
        if (strcmp(d->meta_keys[i], key) == 0) return d->meta_values[i];
    return NULL;
}

size_t mpr_tensor_dict_meta_count(const mpr_tensor_dict_t *d) {
    MPRI_ARG_NONNULL_OR(d, 0);
    return d ? d->meta_count : 0;
}

const char *mpr_tensor_dict_meta_key(const mpr_tensor_dict_t *d, size_t i) {
    MPRI_ARG_NONNULL_OR(d, NULL);
    if (d && i < d->meta_count) return d->meta_keys[i];
    if (d) mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_tensor_dict_meta_key: entry %zu out of range (%zu entries)", i,
                         d->meta_count);
    return NULL;
}

const char *mpr_tensor_dict_meta_value(const mpr_tensor_dict_t *d, size_t i) {
    MPRI_ARG_NONNULL_OR(d, NULL);
    if (d && i < d->meta_count) return d->meta_values[i];
    if (d) mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_tensor_dict_meta_value: entry %zu out of range (%zu entries)", i,
                         d->meta_count);
    return NULL;
}

mpr_err_t mpr_tensor_dict_update(mpr_tensor_dict_t *d, const mpr_tensor_dict_t *src) {
    MPRI_ARG_NONNULL(d);
    MPRI_ARG_NONNULL(src);
    mpr_err_t e = MPR_OK;
    for (size_t i = 0; !e && i < src->count; i++) e = mpr_tensor_dict_set(d, src->names[i], src->tensors[i]);
    for (size_t i = 0; !e && i < src->meta_count; i++) e = mpr_tensor_dict_set_meta(d, src->meta_keys[i], src->meta_values[i]);
    return e;
}

/* ---- encode ---- */

static const char *const st_dtypes[MPR_DTYPE_COUNT] = {"F32", "F64", "I64", "I32", "U8"};

/* Append `v` to array `arr` as plain decimal digits (cJSON's own number
 * printer switches to exponent notation from 1e15 on). */
static bool add_int(cJSON *arr, int64_t v) {
    char digits[24];
    snprintf(digits, sizeof digits, "%lld", (long long)v);
    return cJSON_AddItemToArray(arr, cJSON_CreateRaw(digits));
}

/* The JSON header of `d`, unpadded, as a string the caller frees with
 * cJSON_free; NULL with the error set. */
static char *encode_header(const mpr_tensor_dict_t *d) {
    for (size_t i = 0; i < d->count; i++)
        if (mpr_tensor_device(d->tensors[i]) >= 0) {
            mpr_error_set(MPR_ERR_UNSUPPORTED, "safetensors_encode: tensor '%s' is on cuda:%d; move it to the CPU first",
                          d->names[i], mpr_tensor_device(d->tensors[i]));
            return NULL;
        }
    cJSON *root = cJSON_CreateObject();
    bool ok = root != NULL;
    if (ok && d->meta_count) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        ok = meta != NULL;
        for (size_t i = 0; ok && i < d->meta_count; i++)
            ok = cJSON_AddStringToObject(meta, d->meta_keys[i], d->meta_values[i]) != NULL;
    }
    uint64_t off = 0;
    for (size_t i = 0; ok && i < d->count; i++) {
        const mpr_tensor_t *t = d->tensors[i];
        uint64_t nb = mpr_tensor_nbytes(t);
        cJSON *e = cJSON_AddObjectToObject(root, d->names[i]);
        ok = e && cJSON_AddStringToObject(e, "dtype", st_dtypes[t->dtype]);
        cJSON *shape = ok ? cJSON_AddArrayToObject(e, "shape") : NULL;
        ok = shape != NULL;
        for (int k = 0; ok && k < t->ndim; k++) ok = add_int(shape, t->shape[k]);
        cJSON *offsets = ok ? cJSON_AddArrayToObject(e, "data_offsets") : NULL;
        ok = offsets && add_int(offsets, (int64_t)off) && add_int(offsets, (int64_t)(off + nb));
        off += nb;
    }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!text) mpr_error_set(MPR_ERR_NOMEM, "safetensors_encode: out of memory building the header");
    return text;
}

mpr_err_t mpr_safetensors_encode(const mpr_tensor_dict_t *d, void **out, size_t *out_len) {
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    MPRI_ARG_NONNULL(d);
    MPRI_ARG_NONNULL(out);
    MPRI_ARG_NONNULL(out_len);
    if (!out || !out_len) return mpr_error_set(MPR_ERR_INVALID_ARG, "safetensors_encode: output pointer is NULL");
    *out = NULL;
    *out_len = 0;
    if (!d) return mpr_error_set(MPR_ERR_INVALID_ARG, "safetensors_encode: dict is NULL");
    char *header = encode_header(d);
    if (!header) return mpr_last_error_code();
    size_t hlen = strlen(header);
    size_t padded = (hlen + 7) / 8 * 8;
    uint64_t data_len = 0;
    for (size_t i = 0; i < d->count; i++) data_len += mpr_tensor_nbytes(d->tensors[i]);
    size_t len = 8 + padded + (size_t)data_len;
    unsigned char *buf = malloc(len);
    if (!buf) {
        cJSON_free(header);
        return mpr_error_set(MPR_ERR_NOMEM, "safetensors_encode: cannot allocate %zu bytes", len);
    }
    for (int k = 0; k < 8; k++) buf[k] = (unsigned char)((uint64_t)padded >> (8 * k));
    memcpy(buf + 8, header, hlen);
    memset(buf + 8 + hlen, ' ', padded - hlen);
    cJSON_free(header);
    unsigned char *data = buf + 8 + padded;
    for (size_t i = 0; i < d->count; i++) {
        mpri_io_copy_out(d->tensors[i], data);
        data += mpr_tensor_nbytes(d->tensors[i]);
    }
    *out = buf;
    *out_len = len;
    return MPR_OK;
}

mpr_err_t mpr_safetensors_save(const mpr_tensor_dict_t *d, const char *path) {
    MPRI_ARG_NONNULL(d);
    MPRI_ARG_NONNULL(path);
    void *buf;
    size_t len;
    mpr_err_t rc = mpr_safetensors_encode(d, &buf, &len);
    if (rc != MPR_OK) return rc;
    rc = mpri_io_write_file(path, "safetensors_save", buf, len);
    free(buf);
    return rc;
}

mpr_err_t mpr_safetensors_save_list(const char *path, size_t n, const char *const *names,
                                    mpr_tensor_t *const *tensors) {
    MPRI_ARG_NONNULL(path);
    if (n > 0) MPRI_ARG_NONNULL(names);
    if (n > 0) MPRI_ARG_NONNULL(tensors);
    if (n && (!names || !tensors))
        return mpr_error_set(MPR_ERR_INVALID_ARG, "safetensors_save_list: names or tensors is NULL");
    mpr_tensor_dict_t *d = mpr_tensor_dict_create();
    if (!d) return mpr_last_error_code();
    mpr_err_t rc = MPR_OK;
    for (size_t i = 0; i < n && rc == MPR_OK; i++) {
        /* A repeated name would silently drop one tensor: reject it. */
        for (size_t j = 0; j < i && names[i]; j++)
            if (names[j] && strcmp(names[j], names[i]) == 0) {
                rc = mpr_error_set(MPR_ERR_INVALID_ARG, "safetensors_save_list: duplicate name '%s'", names[i]);
                break;
            }
        if (rc == MPR_OK) rc = mpr_tensor_dict_set(d, names[i], tensors[i]);
    }
    if (rc == MPR_OK) rc = mpr_safetensors_save(d, path);
    mpr_tensor_dict_destroy(d);
    return rc;
}

/* ---- decode ---- */

typedef struct {
    uint64_t begin, end;
} range_t;

static int range_cmp(const void *a, const void *b) {
    const range_t *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

/* A JSON number that is an integer in [0, 2^53), exact in the double cJSON
 * reads it into. */
static bool json_size(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    double x = v->valuedouble;
    if (!(x >= 0 && x < 9007199254740992.0) || x != floor(x)) return false;
    *out = (uint64_t)x;
    return true;
}

static int key_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* MPR_ERR_DECODE naming `where` when two members of object `obj` share a key
 * (cJSON keeps both; the first would shadow the second). */
static mpr_err_t check_keys_unique(const char *what, const char *where, const cJSON *obj) {
    size_t n = (size_t)cJSON_GetArraySize(obj);
    if (n < 2) return MPR_OK;
    const char **keys = malloc(n * sizeof *keys);
    if (!keys) return mpr_error_set(MPR_ERR_NOMEM, "%s: out of memory", what);
    size_t i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, obj) keys[i++] = m->string;
    qsort(keys, n, sizeof *keys, key_cmp);
    mpr_err_t rc = MPR_OK;
    for (i = 1; i < n && rc == MPR_OK; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0)
            rc = mpr_error_set(MPR_ERR_DECODE, "%s: safetensors %s has the key '%s' twice", what, where, keys[i]);
    free(keys);
    return rc;
}

static mpr_err_t check_entry(const char *what, const cJSON *e, uint64_t data_len, mpr_dtype_t *dtype, int *ndim,
                             int64_t *shape, range_t *r) {
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return mpr_error_set(MPR_ERR_DECODE, "%s: safetensors entry '%s' is not an object", what, name);
    if (check_keys_unique(what, "entry", e) != MPR_OK) return MPR_ERR_DECODE;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of))
        return mpr_error_set(MPR_ERR_DECODE,
                             "%s: safetensors entry '%s' needs string 'dtype', array 'shape' and 'data_offsets'",
                             what, name);
    int found = -1;
    for (int k = 0; k < MPR_DTYPE_COUNT; k++)
        if (strcmp(dt->valuestring, st_dtypes[k]) == 0) found = k;
    if (found < 0)
        return mpr_error_set(MPR_ERR_UNSUPPORTED, "%s: safetensors entry '%s' has unsupported dtype '%s'", what,
                             name, dt->valuestring);
    *dtype = (mpr_dtype_t)found;
    int dims = cJSON_GetArraySize(sh);
    if (dims > MPR_MAX_DIMS)
        return mpr_error_set(MPR_ERR_UNSUPPORTED, "%s: safetensors entry '%s' has %d dims (max %d)", what, name,
                             dims, MPR_MAX_DIMS);
    *ndim = dims;
    int k = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, sh) {
        uint64_t size;
        if (!json_size(v, &size))
            return mpr_error_set(MPR_ERR_DECODE, "%s: safetensors entry '%s': shape[%d] is not a size", what,
                                 name, k);
        shape[k++] = (int64_t)size;
    }
    int64_t numel;
    if (mpri_tensor_check_shape(what, *dtype, *ndim, shape, &numel) != MPR_OK) return MPR_ERR_DECODE;
    if (cJSON_GetArraySize(of) != 2)
        return mpr_error_set(MPR_ERR_DECODE, "%s: safetensors entry '%s': data_offsets needs 2 numbers", what,
                             name);
    if (!json_size(cJSON_GetArrayItem(of, 0), &r->begin) || !json_size(cJSON_GetArrayItem(of, 1), &r->end))
        return mpr_error_set(MPR_ERR_DECODE, "%s: safetensors entry '%s': bad data_offsets", what, name);
    if (r->begin > r->end || r->end > data_len)
        return mpr_error_set(MPR_ERR_DECODE,
                             "%s: safetensors entry '%s': data_offsets [%llu, %llu) outside the %llu data bytes "
                             "(truncated file?)",
                             what, name, (unsigned long long)r->begin, (unsigned long long)r->end,
                             (unsigned long long)data_len);
    if (r->end - r->begin != (uint64_t)numel * mpr_dtype_size(*dtype))
        return mpr_error_set(MPR_ERR_DECODE,
                             "%s: safetensors entry '%s': %llu data bytes for %lld elements of %s", what, name,
                             (unsigned long long)(r->end - r->begin), (long long)numel, dt->valuestring);
    return MPR_OK;
}

/* Parse the `len`-byte header at `text` as one JSON object followed only by
 * whitespace (the format pads with spaces). NULL with MPR_ERR_DECODE. */
static cJSON *parse_header(const char *what, const char *text, size_t len) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!root) {
        size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
        mpr_error_set(MPR_ERR_DECODE, "%s: safetensors header is not valid JSON (at byte %zu of %zu)", what, at,
                      len);
        return NULL;
    }
    for (const char *p = end; p < text + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            mpr_error_set(MPR_ERR_DECODE, "%s: safetensors header has trailing characters after the JSON at byte %zu",
                          what, (size_t)(p - text));
            cJSON_Delete(root);
            return NULL;
        }
    if (!cJSON_IsObject(root)) {
        mpr_error_set(MPR_ERR_DECODE, "%s: safetensors header is not a JSON object", what);
        cJSON_Delete(root);
        return NULL;
    }
    if (check_keys_unique(what, "header", root) != MPR_OK) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

mpr_tensor_dict_t *mpr_safetensors_decode(const void *buf, size_t len, const char *what) {
    MPRI_ARG_NONNULL_OR(buf, NULL);
    const unsigned char *b = buf;
    if (!what) what = "safetensors";
    if (!buf && len) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "%s: buffer is NULL", what);
        return NULL;
    }
    if (len < 8) {
        mpr_error_set(MPR_ERR_DECODE, "%s: not a safetensors file (shorter than 8 bytes)", what);
        return NULL;
    }
    uint64_t hlen = 0;
    for (int k = 0; k < 8; k++) hlen |= (uint64_t)b[k] << (8 * k);
    if (hlen > MAX_HEADER_BYTES || hlen > len - 8) {
        mpr_error_set(MPR_ERR_DECODE, "%s: safetensors header length %llu exceeds the %zu bytes after it", what,
                      (unsigned long long)hlen, len - 8);
        return NULL;
    }
    if (hlen == 0 || b[8] != '{') {
        mpr_error_set(MPR_ERR_DECODE, "%s: safetensors header does not start with '{'", what);
        return NULL;
    }
    cJSON *root = parse_header(what, (const char *)b + 8, (size_t)hlen);
    if (!root) return NULL;
    const unsigned char *data = b + 8 + hlen;
    uint64_t data_len = len - 8 - hlen;
    range_t *ranges = calloc((size_t)cJSON_GetArraySize(root) + 1, sizeof *ranges);
    mpr_tensor_dict_t *d = mpr_tensor_dict_create();
    if (!ranges || !d) {
        mpr_error_set(MPR_ERR_NOMEM, "%s: out of memory", what);
        goto fail;
    }
    /* Pass 1: validate every entry and check that no two overlap. */
    size_t nr = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        const char *name = e->string;
        if (strcmp(name, "__metadata__") == 0) {
            if (!cJSON_IsObject(e)) {
                mpr_error_set(MPR_ERR_DECODE, "%s: safetensors __metadata__ is not an object", what);
                goto fail;
            }
            if (check_keys_unique(what, "__metadata__", e) != MPR_OK) goto fail;
            const cJSON *m;
            cJSON_ArrayForEach(m, e) {
                if (!cJSON_IsString(m)) {
                    mpr_error_set(MPR_ERR_DECODE, "%s: safetensors __metadata__ value '%s' is not a string", what,
                                  m->string);
                    goto fail;
                }
                if (mpr_tensor_dict_set_meta(d, m->string, m->valuestring) != MPR_OK) goto fail;
            }
            continue;
        }
        if (!name[0]) {
            mpr_error_set(MPR_ERR_DECODE, "%s: safetensors entry with an empty name", what);
            goto fail;
        }
        mpr_dtype_t dt;
        int ndim;
        int64_t shape[MPR_MAX_DIMS];
        if (check_entry(what, e, data_len, &dt, &ndim, shape, &ranges[nr]) != MPR_OK) goto fail;
        nr++;
    }
    qsort(ranges, nr, sizeof *ranges, range_cmp);
    for (size_t i = 1; i < nr; i++)
        if (ranges[i].begin < ranges[i - 1].end && ranges[i].begin != ranges[i].end &&
            ranges[i - 1].begin != ranges[i - 1].end) {
            mpr_error_set(MPR_ERR_DECODE, "%s: safetensors entries overlap at data byte %llu", what,
                          (unsigned long long)ranges[i].begin);
            goto fail;
        }
    /* Pass 2: create the tensors. */
    cJSON_ArrayForEach(e, root) {
        if (strcmp(e->string, "__metadata__") == 0) continue;
        mpr_dtype_t dt;
        int ndim;
        int64_t shape[MPR_MAX_DIMS];
        range_t r;
        if (check_entry(what, e, data_len, &dt, &ndim, shape, &r) != MPR_OK) goto fail;
        mpr_tensor_t *t = mpr_tensor_empty(dt, ndim, shape);
        if (!t) goto fail;
        if (r.end > r.begin) memcpy(mpr_tensor_data(t), data + r.begin, (size_t)(r.end - r.begin));
        mpr_err_t rc = mpr_tensor_dict_set(d, e->string, t);
        mpr_tensor_release(t);
        if (rc != MPR_OK) goto fail;
    }
    goto out;
fail:
    mpr_tensor_dict_destroy(d);
    d = NULL;
out:
    free(ranges);
    cJSON_Delete(root);
    return d;
}

mpr_tensor_dict_t *mpr_safetensors_load(const char *path) {
    MPRI_ARG_NONNULL_OR(path, NULL);
    void *buf;
    size_t len;
    if (mpri_io_read_file(path, "safetensors_load", &buf, &len) != MPR_OK) return NULL;
    mpr_tensor_dict_t *d = mpr_safetensors_decode(buf, len, path);
    free(buf);
    return d;
}

static void format_shape(const mpr_tensor_t *t, char *out, size_t cap) {
    size_t n = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < t->ndim && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (n < cap) snprintf(out + n, cap - n, "]");
}

mpr_err_t mpr_tensor_dict_copy_into(const mpr_tensor_dict_t *d, size_t n, const char *const *names,
                                    mpr_tensor_t *const *tensors, bool strict) {
    MPRI_ARG_NONNULL(d);
    if (n > 0) MPRI_ARG_NONNULL(names);
    if (n > 0) MPRI_ARG_NONNULL(tensors);
    if (!d || (n && (!names || !tensors)))
        return mpr_error_set(MPR_ERR_INVALID_ARG, "tensor_dict_copy_into: NULL argument");
    for (size_t i = 0; i < n; i++) {
        if (!names[i] || !tensors[i])
            return mpr_error_set(MPR_ERR_INVALID_ARG, "tensor_dict_copy_into: entry %zu is NULL", i);
        mpr_tensor_t *src = mpr_tensor_dict_get(d, names[i]);
        if (!src)
            return mpr_error_set(MPR_ERR_NOT_FOUND, "tensor_dict_copy_into: no tensor named '%s' in the file",
                                 names[i]);
        mpr_tensor_t *dst = tensors[i];
        if (mpr_tensor_device(dst) >= 0)
            return mpr_error_set(MPR_ERR_UNSUPPORTED, "tensor_dict_copy_into: '%s' is on cuda:%d", names[i],
                                 mpr_tensor_device(dst));
        if (src->dtype != dst->dtype)
            return mpr_error_set(MPR_ERR_DTYPE, "tensor_dict_copy_into: '%s' is %s in the file, %s in the target",
                                 names[i], mpr_dtype_name(src->dtype), mpr_dtype_name(dst->dtype));
        bool same = src->ndim == dst->ndim;
        for (int k = 0; same && k < src->ndim; k++) same = src->shape[k] == dst->shape[k];
        if (!same) {
            char a[160], b[160];
            format_shape(src, a, sizeof a);
            format_shape(dst, b, sizeof b);
            return mpr_error_set(MPR_ERR_SHAPE, "tensor_dict_copy_into: '%s' has shape %s in the file, %s in the target",
                                 names[i], a, b);
        }
    }
    if (strict)
        for (size_t k = 0; k < d->count; k++) {
            bool used = false;
            for (size_t i = 0; i < n && !used; i++) used = strcmp(names[i], d->names[k]) == 0;
            if (!used)
                return mpr_error_set(MPR_ERR_NOT_FOUND,
                                     "tensor_dict_copy_into: file has tensor '%s' that the target does not (strict)",
                                     d->names[k]);
        }
    for (size_t i = 0; i < n; i++) {
        mpr_tensor_t *src = mpr_tensor_dict_get(d, names[i]);
        mpri_io_copy_in(tensors[i], mpr_tensor_data(src));
        atomic_fetch_add(&tensors[i]->storage->version, 1);
    }
    return MPR_OK;
}

mpr_err_t mpr_safetensors_load_into(const char *path, size_t n, const char *const *names,
                                    mpr_tensor_t *const *tensors, bool strict) {
    MPRI_ARG_NONNULL(path);
    if (n > 0) MPRI_ARG_NONNULL(names);
    if (n > 0) MPRI_ARG_NONNULL(tensors);
    mpr_tensor_dict_t *d = mpr_safetensors_load(path);
    if (!d) return mpr_last_error_code();
    mpr_err_t rc = mpr_tensor_dict_copy_into(d, n, names, tensors, strict);
    mpr_tensor_dict_destroy(d);
    return rc;
}
