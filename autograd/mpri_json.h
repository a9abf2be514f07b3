/* mpri_json.h — a small, bounds-checked JSON reader and a string writer (internal).
 *
 * Enough JSON for file headers (safetensors): objects, arrays, strings with
 * escapes (\uXXXX decoded to UTF-8), integers/numbers, true/false/null. The
 * reader never reads past `len`, limits nesting depth, and reports the byte
 * offset of the first error. Numbers keep both an int64 (when exact) and a
 * double. */
#ifndef MPRI_JSON_H
#define MPRI_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mpirpc/error.h"

typedef enum {
    MPRI_JSON_NULL,
    MPRI_JSON_BOOL,
    MPRI_JSON_NUMBER,
    MPRI_JSON_STRING,
    MPRI_JSON_ARRAY,
    MPRI_JSON_OBJECT
} mpri_json_kind_t;

typedef struct mpri_json mpri_json_t;
struct mpri_json {
    mpri_json_kind_t kind;
    bool boolean;
    bool is_int;      /* NUMBER: integral and fits int64 */
    int64_t integer;  /* NUMBER with is_int */
    double number;    /* NUMBER */
    char *string;     /* STRING: NUL-terminated UTF-8 (owned) */
    size_t count;     /* ARRAY/OBJECT: number of items */
    char **keys;      /* OBJECT: count keys (owned) */
    mpri_json_t **items; /* ARRAY/OBJECT: count values (owned) */
};

/* Parse `len` bytes of `text` (need not be NUL-terminated) as one JSON value
 * followed only by whitespace. Returns a new tree the caller frees with
 * mpri_json_free(), or NULL with MPR_ERR_DECODE naming `what` and the offset. */
mpri_json_t *mpri_json_parse(const char *text, size_t len, const char *what);
void mpri_json_free(mpri_json_t *v);

/* Member `key` of an OBJECT, or NULL when absent or `obj` is not an object.
 * Borrowed from `obj`. */
const mpri_json_t *mpri_json_get(const mpri_json_t *obj, const char *key);

/* A growable string buffer for writing JSON. */
typedef struct {
    char *data;
    size_t len, cap;
    bool failed; /* an allocation failed; the content is incomplete */
} mpri_strbuf_t;

void mpri_strbuf_append(mpri_strbuf_t *b, const char *s, size_t n);
void mpri_strbuf_printf(mpri_strbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append `s` as a quoted JSON string with escapes. */
void mpri_strbuf_json_string(mpri_strbuf_t *b, const char *s);
void mpri_strbuf_fini(mpri_strbuf_t *b);

#endif
