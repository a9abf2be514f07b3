/* io_json.c — the small JSON reader and writer used by the tensor file formats.
 *
 * Invariants: the reader only touches text[0, len); every read is preceded by a
 * bounds check; nesting is limited to MAX_DEPTH so hostile input cannot blow
 * the stack; on any error the partial tree is freed and NULL is returned with
 * MPR_ERR_DECODE and the byte offset. The writer never truncates silently: an
 * allocation failure sets `failed`, which callers check. */
#include "mpri_json.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

typedef struct {
    const char *s;
    size_t len, pos;
    const char *what;
    bool failed;
} parser_t;

static void fail(parser_t *p, const char *msg) {
    if (p->failed) return;
    p->failed = true;
    mpr_error_set(MPR_ERR_DECODE, "%s: bad JSON at byte %zu: %s", p->what, p->pos, msg);
}

static void skip_ws(parser_t *p) {
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static mpri_json_t *new_value(parser_t *p, mpri_json_kind_t kind) {
    mpri_json_t *v = calloc(1, sizeof *v);
    if (!v) {
        p->failed = true;
        mpr_error_set(MPR_ERR_NOMEM, "%s: out of memory parsing JSON", p->what);
        return NULL;
    }
    v->kind = kind;
    return v;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool read_hex4(parser_t *p, unsigned *out) {
    if (p->len - p->pos < 4) {
        fail(p, "truncated \\u escape");
        return false;
    }
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p->s[p->pos + i]);
        if (h < 0) {
            fail(p, "bad hex digit in \\u escape");
            return false;
        }
        v = v * 16 + (unsigned)h;
    }
    p->pos += 4;
    *out = v;
    return true;
}

/* Parses a string at p->pos (which is at the opening quote); returns malloc'd UTF-8. */
static char *parse_string(parser_t *p) {
    p->pos++; /* opening quote */
    /* The decoded string is never longer than the encoded one. */
    size_t start = p->pos;
    size_t end = start;
    while (end < p->len && p->s[end] != '"') {
        if (p->s[end] == '\\') end++;
        end++;
    }
    if (end >= p->len) {
        fail(p, "unterminated string");
        return NULL;
    }
    char *out = malloc(end - start + 1);
    if (!out) {
        p->failed = true;
        mpr_error_set(MPR_ERR_NOMEM, "%s: out of memory parsing JSON", p->what);
        return NULL;
    }
    size_t o = 0;
    while (p->pos < end) {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c < 0x20) {
            fail(p, "control character in string");
            free(out);
            return NULL;
        }
        if (c != '\\') {
            out[o++] = (char)c;
            p->pos++;
            continue;
        }
        p->pos++;
        char e = p->s[p->pos++];
        switch (e) {
        case '"': out[o++] = '"'; break;
        case '\\': out[o++] = '\\'; break;
        case '/': out[o++] = '/'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case 'u': {
            unsigned cp;
            if (!read_hex4(p, &cp)) {
                free(out);
                return NULL;
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (p->pos + 2 > end || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
                    fail(p, "unpaired surrogate");
                    free(out);
                    return NULL;
                }
                p->pos += 2;
                if (!read_hex4(p, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                    fail(p, "bad low surrogate");
                    free(out);
                    return NULL;
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                fail(p, "unpaired low surrogate");
                free(out);
                return NULL;
            }
            /* 6 hex-escape bytes always cover the <= 4 UTF-8 bytes written. */
            if (cp < 0x80) {
                out[o++] = (char)cp;
            } else if (cp < 0x800) {
                out[o++] = (char)(0xC0 | (cp >> 6));
                out[o++] = (char)(0x80 | (cp & 0x3F));
            } else if (cp < 0x10000) {
                out[o++] = (char)(0xE0 | (cp >> 12));
                out[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                out[o++] = (char)(0x80 | (cp & 0x3F));
            } else {
                out[o++] = (char)(0xF0 | (cp >> 18));
                out[o++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                out[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                out[o++] = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default:
            p->pos--;
            fail(p, "bad escape");
            free(out);
            return NULL;
        }
    }
    if (p->pos != end) { /* an escape ran past the closing quote */
        fail(p, "bad escape at end of string");
        free(out);
        return NULL;
    }
    p->pos = end + 1;
    out[o] = '\0';
    return out;
}

static mpri_json_t *parse_value(parser_t *p, int depth);

static mpri_json_t *parse_number(parser_t *p) {
    size_t start = p->pos;
    bool integral = true;
    if (p->pos < p->len && p->s[p->pos] == '-') p->pos++;
    size_t digits = p->pos;
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
    if (p->pos == digits) {
        fail(p, "expected a value");
        return NULL;
    }
    if (p->pos < p->len && p->s[p->pos] == '.') {
        integral = false;
        p->pos++;
        size_t f = p->pos;
        while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
        if (p->pos == f) {
            fail(p, "digits expected after '.'");
            return NULL;
        }
    }
    if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
        integral = false;
        p->pos++;
        if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-')) p->pos++;
        size_t f = p->pos;
        while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
        if (p->pos == f) {
            fail(p, "digits expected in exponent");
            return NULL;
        }
    }
    char tmp[64];
    size_t n = p->pos - start;
    if (n >= sizeof tmp) {
        fail(p, "number too long");
        return NULL;
    }
    memcpy(tmp, p->s + start, n);
    tmp[n] = '\0';
    mpri_json_t *v = new_value(p, MPRI_JSON_NUMBER);
    if (!v) return NULL;
    v->number = strtod(tmp, NULL);
    if (integral) {
        char *endp;
        errno = 0;
        long long ll = strtoll(tmp, &endp, 10);
        if (*endp == '\0' && errno != ERANGE) {
            v->is_int = true;
            v->integer = ll;
        }
    }
    return v;
}

static bool match_word(parser_t *p, const char *w) {
    size_t n = strlen(w);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, w, n) != 0) return false;
    p->pos += n;
    return true;
}

static bool push_item(parser_t *p, mpri_json_t *c, char *key, mpri_json_t *item) {
    if ((c->count & (c->count - 1)) == 0) { /* grow at powers of two */
        size_t cap = c->count ? c->count * 2 : 4;
        mpri_json_t **items = realloc(c->items, cap * sizeof *items);
        if (items) c->items = items;
        char **keys = NULL;
        if (items && c->kind == MPRI_JSON_OBJECT) {
            keys = realloc(c->keys, cap * sizeof *keys);
            if (keys) c->keys = keys;
        }
        if (!items || (c->kind == MPRI_JSON_OBJECT && !keys)) {
            p->failed = true;
            mpr_error_set(MPR_ERR_NOMEM, "%s: out of memory parsing JSON", p->what);
            return false;
        }
    }
    if (c->kind == MPRI_JSON_OBJECT) c->keys[c->count] = key;
    c->items[c->count++] = item;
    return true;
}

static mpri_json_t *parse_container(parser_t *p, int depth, bool object) {
    mpri_json_t *c = new_value(p, object ? MPRI_JSON_OBJECT : MPRI_JSON_ARRAY);
    if (!c) return NULL;
    char close = object ? '}' : ']';
    p->pos++;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        return c;
    }
    for (;;) {
        char *key = NULL;
        skip_ws(p);
        if (object) {
            if (p->pos >= p->len || p->s[p->pos] != '"') {
                fail(p, "expected a string key");
                goto bad;
            }
            key = parse_string(p);
            if (!key) goto bad;
            for (size_t i = 0; i < c->count; i++)
                if (strcmp(c->keys[i], key) == 0) {
                    fail(p, "duplicate key");
                    free(key);
                    goto bad;
                }
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') {
                fail(p, "expected ':'");
                free(key);
                goto bad;
            }
            p->pos++;
        }
        mpri_json_t *item = parse_value(p, depth + 1);
        if (!item) {
            free(key);
            goto bad;
        }
        if (!push_item(p, c, key, item)) {
            free(key);
            mpri_json_free(item);
            goto bad;
        }
        skip_ws(p);
        if (p->pos >= p->len) {
            fail(p, "unterminated container");
            goto bad;
        }
        if (p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->s[p->pos] == close) {
            p->pos++;
            return c;
        }
        fail(p, object ? "expected ',' or '}'" : "expected ',' or ']'");
        goto bad;
    }
bad:
    mpri_json_free(c);
    return NULL;
}

static mpri_json_t *parse_value(parser_t *p, int depth) {
    if (depth > MAX_DEPTH) {
        fail(p, "nesting too deep");
        return NULL;
    }
    skip_ws(p);
    if (p->pos >= p->len) {
        fail(p, "unexpected end of input");
        return NULL;
    }
    char c = p->s[p->pos];
    if (c == '{') return parse_container(p, depth, true);
    if (c == '[') return parse_container(p, depth, false);
    if (c == '"') {
        char *s = parse_string(p);
        if (!s) return NULL;
        mpri_json_t *v = new_value(p, MPRI_JSON_STRING);
        if (!v) {
            free(s);
            return NULL;
        }
        v->string = s;
        return v;
    }
    if (match_word(p, "true") || match_word(p, "false")) {
        mpri_json_t *v = new_value(p, MPRI_JSON_BOOL);
        if (v) v->boolean = p->s[p->pos - 1] == 'e' && p->s[p->pos - 2] == 'u';
        return v;
    }
    if (match_word(p, "null")) return new_value(p, MPRI_JSON_NULL);
    return parse_number(p);
}

mpri_json_t *mpri_json_parse(const char *text, size_t len, const char *what) {
    parser_t p = {.s = text, .len = len, .pos = 0, .what = what ? what : "json", .failed = false};
    if (!text) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "%s: JSON text is NULL", p.what);
        return NULL;
    }
    mpri_json_t *v = parse_value(&p, 0);
    if (!v) return NULL;
    skip_ws(&p);
    if (p.pos != p.len) {
        fail(&p, "trailing characters after the value");
        mpri_json_free(v);
        return NULL;
    }
    return v;
}

void mpri_json_free(mpri_json_t *v) {
    if (!v) return;
    for (size_t i = 0; i < v->count; i++) {
        if (v->keys) free(v->keys[i]);
        mpri_json_free(v->items[i]);
    }
    free(v->keys);
    free(v->items);
    free(v->string);
    free(v);
}

const mpri_json_t *mpri_json_get(const mpri_json_t *obj, const char *key) {
    if (!obj || obj->kind != MPRI_JSON_OBJECT) return NULL;
    for (size_t i = 0; i < obj->count; i++)
        if (strcmp(obj->keys[i], key) == 0) return obj->items[i];
    return NULL;
}

/* ---- writer ---- */

static bool strbuf_reserve(mpri_strbuf_t *b, size_t extra) {
    if (b->failed) return false;
    if (b->len + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    char *d = realloc(b->data, cap);
    if (!d) {
        b->failed = true;
        return false;
    }
    b->data = d;
    b->cap = cap;
    return true;
}

void mpri_strbuf_append(mpri_strbuf_t *b, const char *s, size_t n) {
    if (!strbuf_reserve(b, n)) return;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void mpri_strbuf_printf(mpri_strbuf_t *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !strbuf_reserve(b, (size_t)n)) {
        b->failed = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void mpri_strbuf_json_string(mpri_strbuf_t *b, const char *s) {
    mpri_strbuf_append(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        switch (*c) {
        case '"': mpri_strbuf_append(b, "\\\"", 2); break;
        case '\\': mpri_strbuf_append(b, "\\\\", 2); break;
        case '\n': mpri_strbuf_append(b, "\\n", 2); break;
        case '\r': mpri_strbuf_append(b, "\\r", 2); break;
        case '\t': mpri_strbuf_append(b, "\\t", 2); break;
        default:
            if (*c < 0x20)
                mpri_strbuf_printf(b, "\\u%04x", *c);
            else
                mpri_strbuf_append(b, (const char *)c, 1);
        }
    }
    mpri_strbuf_append(b, "\"", 1);
}

void mpri_strbuf_fini(mpri_strbuf_t *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->failed = false;
}
