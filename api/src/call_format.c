/* call_format.c — the format language of mpirpc/call_format.h: packing
 * values from varargs and unpacking argument lists into pointers.
 *
 * Every entry point works in three steps, so that no failure can leave a
 * half-done state behind:
 *   1. parse_format: the whole format is checked (characters, brackets,
 *      '|', limits) before any vararg is read;
 *   2. collect_slots: the varargs are read, in format order, into an array
 *      of slots (one per item; brackets and 'n' take none);
 *   3. pack: values are built from the slots; unpack: the value is checked
 *      against the format, then (only if everything matched) written out.
 * Invariants: a stolen slot ('T', 'R', 'V') is disposed of exactly once —
 * when used to build an item, or by release_untaken() after a failure (its
 * `taken` flag says which); unpack writes no output unless the check pass
 * succeeded, and its write pass cannot fail. */
#include "mpirpc/call_format.h"

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "mpri_assert.h"

enum { PATH_LEN = 96 };

typedef struct slot {
    char c;
    bool taken;            /* pack: the caller's reference was used or released */
    union {
        int i;
        int64_t l;
        double d;
        const void *p;     /* s, y, w, t, T, r, R, v, V (pack); first output (unpack) */
    } a;
    size_t n;              /* pack 'y': length */
    void *out2;            /* unpack 'y': the size_t * output */
} slot_t;

static bool takes_slot(char c) { return c != '[' && c != ']' && c != '|' && c != ' ' && c != 'n'; }

static bool is_item_char(char c) { return c && strchr("nbildsywtTrRvV", c) != NULL; }

/* Step 1. Counts the items that take a slot into *nslots and the top-level
 * items into *ntop ('|' at the top level makes *ntop negative). */
static mpr_err_t parse_format(const char *who, const char *fmt, bool unpack, int *nslots, int *ntop) {
    if (!fmt) return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: argument 'fmt' is NULL", who);
    int depth = 0, items = 0, top = 0;
    bool bar_seen[MPR_FORMAT_MAX_DEPTH + 1] = {false};
    for (const char *p = fmt; *p; p++) {
        char c = *p;
        long pos = (long)(p - fmt);
        if (c == ' ') continue;
        if (c == '|') {
            if (!unpack)
                return mpr_error_set(MPR_ERR_INVALID_ARG,
                                     "%s: format \"%s\": '|' (optional items) is for unpacking only", who, fmt);
            if (bar_seen[depth])
                return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: format \"%s\": second '|' at position %ld", who,
                                     fmt, pos);
            bar_seen[depth] = true;
            continue;
        }
        if (c == ']') {
            if (depth == 0)
                return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: format \"%s\": unmatched ']' at position %ld",
                                     who, fmt, pos);
            depth--;
            continue;
        }
        if (c != '[' && !is_item_char(c))
            return mpr_error_set(MPR_ERR_INVALID_ARG,
                                 "%s: format \"%s\": unknown format character '%c' (0x%02x) at position %ld", who,
                                 fmt, c >= 32 && c < 127 ? c : '?', (unsigned char)c, pos);
        if (depth == 0) top++;
        if (c == '[') {
            if (depth == MPR_FORMAT_MAX_DEPTH)
                return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: format \"%s\": lists nest deeper than %d", who,
                                     fmt, MPR_FORMAT_MAX_DEPTH);
            bar_seen[++depth] = false;
            continue;
        }
        if (takes_slot(c) && ++items > MPR_FORMAT_MAX_ITEMS)
            return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: format \"%.40s...\" has more than %d items", who, fmt,
                                 MPR_FORMAT_MAX_ITEMS);
    }
    if (depth != 0) return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: format \"%s\": unclosed '['", who, fmt);
    *nslots = items;
    *ntop = bar_seen[0] ? -1 : top;
    return MPR_OK;
}

/* Step 2. The format was parsed, so every character is known. */
static void collect_slots(const char *fmt, bool unpack, slot_t *slots, va_list *ap) {
    int k = 0;
    for (const char *p = fmt; *p; p++) {
        char c = *p;
        if (!takes_slot(c)) continue;
        slot_t *s = &slots[k++];
        memset(s, 0, sizeof *s);
        s->c = c;
        if (unpack) {
            s->a.p = va_arg(*ap, void *);
            if (c == 'y') s->out2 = va_arg(*ap, size_t *);
            continue;
        }
        switch (c) {
        case 'b':
        case 'i': s->a.i = va_arg(*ap, int); break;
        case 'l': s->a.l = va_arg(*ap, int64_t); break;
        case 'd': s->a.d = va_arg(*ap, double); break;
        case 'y':
            s->a.p = va_arg(*ap, const void *);
            s->n = va_arg(*ap, size_t);
            break;
        default: s->a.p = va_arg(*ap, const void *); break;
        }
    }
}

/* Disposes of the stolen references that were not used (after a failure). */
static void release_untaken(slot_t *slots, int n) {
    for (int k = 0; k < n; k++) {
        slot_t *s = &slots[k];
        if (s->taken) continue;
        s->taken = true;
        switch (s->c) {
        case 'T': mpr_tensor_release((mpr_tensor_t *)s->a.p); break;
        case 'R': mpr_rref_release((mpr_rref_t *)s->a.p); break;
        case 'V': mpr_value_release((mpr_value_t *)s->a.p); break;
        default: break;
        }
    }
}

/* After a bad pack format: reads the varargs of the known characters before
 * the first unknown one and releases the stolen references among them (what
 * follows an unknown character cannot be read safely). */
static void release_stolen_prefix(const char *fmt, va_list *ap) {
    for (const char *p = fmt; p && *p; p++) {
        char c = *p;
        if (c == '[' || c == ']' || c == '|' || c == ' ' || c == 'n') continue;
        if (!is_item_char(c)) return;
        switch (c) {
        case 'b':
        case 'i': (void)va_arg(*ap, int); break;
        case 'l': (void)va_arg(*ap, int64_t); break;
        case 'd': (void)va_arg(*ap, double); break;
        case 'y':
            (void)va_arg(*ap, const void *);
            (void)va_arg(*ap, size_t);
            break;
        case 'T': mpr_tensor_release(va_arg(*ap, mpr_tensor_t *)); break;
        case 'R': mpr_rref_release(va_arg(*ap, mpr_rref_t *)); break;
        case 'V': mpr_value_release(va_arg(*ap, mpr_value_t *)); break;
        default: (void)va_arg(*ap, const void *); break;
        }
    }
}

/* ---------------------------------------------------------------- packing */

typedef struct packer {
    const char *who;
    const char *p;   /* next format character */
    slot_t *slots;
    int k;           /* next slot */
} packer_t;

static mpr_value_t *pack_list(packer_t *pk, char close, const char *path_prefix);

static mpr_value_t *null_item(const packer_t *pk, const char *path, char c, const char *what) {
    mpr_err_t prev = mpr_last_error_code();
    if (c >= 'A' && c <= 'Z' && prev != MPR_OK) {
        char why[256]; /* mpr_error_set must not read the buffer it writes */
        snprintf(why, sizeof why, "%s", mpr_last_error());
        mpr_error_set(MPR_ERR_INVALID_ARG, "%s: %s ('%c') is a NULL %s (last error on this thread: %s: %s)",
                      pk->who, path, c, what, mpr_error_name(prev), why);
    } else
        mpr_error_set(MPR_ERR_INVALID_ARG, "%s: %s ('%c') is a NULL %s", pk->who, path, c, what);
    return NULL;
}

/* One item at pk->p (not a space); advances past it. */
static mpr_value_t *pack_item(packer_t *pk, const char *path) {
    char c = *pk->p++;
    if (c == '[') return pack_list(pk, ']', path);
    if (c == 'n') return mpr_value_new_none();
    slot_t *s = &pk->slots[pk->k++];
    MPRI_ASSERT(s->c == c, "slots follow the format");
    mpr_value_t *v = NULL;
    switch (c) {
    case 'b': return mpr_value_new_bool(s->a.i != 0);
    case 'i': return mpr_value_new_int(s->a.i);
    case 'l': return mpr_value_new_int(s->a.l);
    case 'd': return mpr_value_new_double(s->a.d);
    case 's': return s->a.p ? mpr_value_new_string(s->a.p) : null_item(pk, path, c, "string");
    case 'y':
        if (!s->a.p && s->n) return null_item(pk, path, c, "byte pointer with a nonzero length");
        return mpr_value_new_bytes(s->a.p ? s->a.p : "", s->n);
    case 'w': return s->a.p ? mpr_value_new_worker(s->a.p) : null_item(pk, path, c, "worker info");
    case 't':
    case 'T':
        v = s->a.p ? mpr_value_new_tensor((mpr_tensor_t *)s->a.p) : null_item(pk, path, c, "tensor");
        if (c == 'T') mpr_tensor_release((mpr_tensor_t *)s->a.p);
        break;
    case 'r':
    case 'R':
        v = s->a.p ? mpr_value_new_rref((mpr_rref_t *)s->a.p) : null_item(pk, path, c, "RRef");
        if (c == 'R') mpr_rref_release((mpr_rref_t *)s->a.p);
        break;
    case 'v': v = s->a.p ? mpr_value_retain((mpr_value_t *)s->a.p) : null_item(pk, path, c, "value"); break;
    case 'V': v = s->a.p ? (mpr_value_t *)s->a.p : null_item(pk, path, c, "value"); break;
    default: MPRI_ASSERT(false, "parse_format accepted only known characters");
    }
    s->taken = true;
    return v;
}

/* Items up to `close` (']' or '\0'), consumed. Items are named
 * "<path_prefix>[k]", or "item k" at the top (path_prefix NULL). */
static mpr_value_t *pack_list(packer_t *pk, char close, const char *path_prefix) {
    mpr_value_t *list = mpr_value_new_list();
    if (!list) return NULL;
    size_t idx = 0;
    for (;;) {
        while (*pk->p == ' ') pk->p++;
        if (*pk->p == close) break;
        char path[PATH_LEN];
        if (path_prefix)
            snprintf(path, sizeof path, "%s[%zu]", path_prefix, idx);
        else
            snprintf(path, sizeof path, "item %zu", idx);
        mpr_value_t *item = pack_item(pk, path);
        if (!item || mpr_value_list_append(list, item) != MPR_OK) {
            mpr_value_release(list);
            return NULL;
        }
        idx++;
    }
    if (close) pk->p++;
    return list;
}

/* as_list: always a list; otherwise a single top-level item is returned bare. */
static mpr_value_t *vpack(const char *who, const char *fmt, bool as_list, va_list ap) {
    int nslots, ntop;
    slot_t slots[MPR_FORMAT_MAX_ITEMS];
    va_list copy;
    va_copy(copy, ap);
    if (parse_format(who, fmt, false, &nslots, &ntop) != MPR_OK) {
        mpr_err_t e = mpr_last_error_code();
        char msg[256];
        snprintf(msg, sizeof msg, "%s", mpr_last_error());
        release_stolen_prefix(fmt, &copy); /* releasing may overwrite the error: keep ours */
        va_end(copy);
        mpr_error_set(e, "%s", msg);
        return NULL;
    }
    collect_slots(fmt, false, slots, &copy);
    va_end(copy);
    packer_t pk = {.who = who, .p = fmt, .slots = slots, .k = 0};
    mpr_value_t *list = pack_list(&pk, '\0', NULL);
    release_untaken(slots, nslots);
    if (!list || as_list || ntop != 1) return list;
    mpr_value_t *only = mpr_value_retain(mpr_value_list_get(list, 0));
    mpr_value_release(list);
    return only;
}

mpr_value_t *mpr_value_vpack(const char *fmt, va_list ap) { return vpack("mpr_value_pack", fmt, false, ap); }

mpr_value_t *mpr_value_pack(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    mpr_value_t *v = vpack("mpr_value_pack", fmt, false, ap);
    va_end(ap);
    return v;
}

mpr_value_t *mpr_args_vpack(const char *fmt, va_list ap) { return vpack("mpr_args_pack", fmt, true, ap); }

mpr_value_t *mpr_args_pack(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    mpr_value_t *v = vpack("mpr_args_pack", fmt, true, ap);
    va_end(ap);
    return v;
}

mpr_err_t mpr_return(mpr_value_t **result, const char *fmt, ...) {
    if (!result) {
        /* Still dispose of stolen references, as the header promises. */
        va_list ap;
        va_start(ap, fmt);
        mpr_value_release(vpack("mpr_return", fmt, false, ap));
        va_end(ap);
        return mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_return: argument 'result' is NULL");
    }
    va_list ap;
    va_start(ap, fmt);
    *result = vpack("mpr_return", fmt, false, ap);
    va_end(ap);
    return *result ? MPR_OK : mpr_last_error_code();
}

/* -------------------------------------------------------------- unpacking */

typedef struct unpacker {
    const char *who;
    const char *p;
    slot_t *slots;
    int k;
    bool write;   /* false: check only; true: write outputs (cannot fail) */
} unpacker_t;

static const char *format_kind_name(char c) {
    switch (c) {
    case 'n': return "none";
    case 'b': return "bool";
    case 'i':
    case 'l': return "int";
    case 'd': return "double";
    case 's': return "string";
    case 'y': return "bytes";
    case 'w': return "worker";
    case 't':
    case 'T': return "tensor";
    case 'r':
    case 'R': return "rref";
    case '[': return "list";
    default: return "value";
    }
}

static bool kind_matches(char c, mpr_value_kind_t k) {
    switch (c) {
    case 'n': return k == MPR_VALUE_NONE;
    case 'b': return k == MPR_VALUE_BOOL;
    case 'i':
    case 'l': return k == MPR_VALUE_INT;
    case 'd': return k == MPR_VALUE_DOUBLE || k == MPR_VALUE_INT;
    case 's': return k == MPR_VALUE_STRING;
    case 'y': return k == MPR_VALUE_BYTES || k == MPR_VALUE_STRING;
    case 'w': return k == MPR_VALUE_WORKER;
    case 't':
    case 'T': return k == MPR_VALUE_TENSOR;
    case 'r':
    case 'R': return k == MPR_VALUE_RREF;
    case '[': return k == MPR_VALUE_LIST;
    default: return true; /* v, V */
    }
}

/* Skips one item at u->p (with its slots), for an absent optional item. */
static void skip_item(unpacker_t *u) {
    int depth = 0;
    do {
        char c = *u->p++;
        if (c == '[') depth++;
        else if (c == ']') depth--;
        else if (takes_slot(c)) u->k++;
    } while (depth > 0);
}

static mpr_err_t unpack_list(unpacker_t *u, const mpr_value_t *list, char close, const char *path_prefix);

static mpr_err_t unpack_item(unpacker_t *u, const mpr_value_t *v, const char *path) {
    char c = *u->p++;
    mpr_value_kind_t kind = mpr_value_kind(v);
    if (!u->write && !kind_matches(c, kind))
        return mpr_error_set(MPR_ERR_TYPE, "%s: %s: expected %s ('%c'), got %s", u->who, path, format_kind_name(c),
                             c, mpr_value_kind_name(kind));
    if (c == '[') return unpack_list(u, v, ']', path);
    if (c == 'n') return MPR_OK;
    slot_t *s = &u->slots[u->k++];
    MPRI_ASSERT(s->c == c, "slots follow the format");
    int64_t l = 0;
    if (c == 'i' || c == 'l') mpr_value_get_int(v, &l);
    if (c == 'i' && (l < INT_MIN || l > INT_MAX))
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: %s: %lld does not fit in an int ('i'; use 'l')", u->who,
                             path, (long long)l);
    if (!u->write) return MPR_OK;
    void *out = (void *)s->a.p;
    mpr_err_t e = MPR_OK;
    switch (c) {
    case 'b': e = mpr_value_get_bool(v, out); break;
    case 'i': *(int *)out = (int)l; break;
    case 'l': *(int64_t *)out = l; break;
    case 'd': e = mpr_value_get_double(v, out); break;
    case 's': e = mpr_value_get_string(v, out); break;
    case 'y': e = mpr_value_get_bytes(v, out, s->out2); break;
    case 'w': e = mpr_value_get_worker(v, out); break;
    case 't':
    case 'T':
        e = mpr_value_get_tensor(v, out);
        if (c == 'T') mpr_tensor_retain(*(mpr_tensor_t **)out);
        break;
    case 'r':
    case 'R':
        e = mpr_value_get_rref(v, out);
        if (c == 'R') mpr_rref_retain(*(mpr_rref_t **)out);
        break;
    case 'v': *(mpr_value_t **)out = (mpr_value_t *)v; break;
    case 'V': *(mpr_value_t **)out = mpr_value_retain((mpr_value_t *)v); break;
    default: MPRI_ASSERT(false, "parse_format accepted only known characters");
    }
    MPRI_ASSERT(e == MPR_OK, "the check pass matched every kind");
    return MPR_OK;
}

/* Counts the items at this level from u->p up to `close`: required ones
 * (before '|') and all. */
static void count_items(const char *p, char close, size_t *required, size_t *all) {
    int depth = 0;
    bool optional = false;
    *required = *all = 0;
    for (; *p && !(depth == 0 && *p == close); p++) {
        if (*p == ']') {
            depth--;
            continue;
        }
        if (depth == 0 && *p == '|') optional = true;
        if (depth == 0 && (*p == '[' || is_item_char(*p))) {
            (*all)++;
            if (!optional) (*required)++;
        }
        if (*p == '[') depth++;
    }
}

static mpr_err_t unpack_list(unpacker_t *u, const mpr_value_t *list, char close, const char *path_prefix) {
    size_t required, all, len = mpr_value_list_len(list);
    count_items(u->p, close, &required, &all);
    if (!u->write && (len < required || len > all)) {
        char expected[64];
        if (required == all)
            snprintf(expected, sizeof expected, "%zu", all);
        else if (len < required)
            snprintf(expected, sizeof expected, "at least %zu", required);
        else
            snprintf(expected, sizeof expected, "at most %zu", all);
        if (path_prefix)
            return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: %s: expected a list of %s items, got %zu", u->who,
                                 path_prefix, expected, len);
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: expected %s argument%s, got %zu", u->who, expected,
                             all == 1 ? "" : "s", len);
    }
    size_t idx = 0;
    for (;;) {
        while (*u->p == ' ' || *u->p == '|') u->p++;
        if (*u->p == close) break;
        if (idx >= len) {
            skip_item(u);
            continue;
        }
        char path[PATH_LEN];
        if (path_prefix)
            snprintf(path, sizeof path, "%s[%zu]", path_prefix, idx);
        else
            snprintf(path, sizeof path, "argument %zu", idx);
        mpr_err_t e = unpack_item(u, mpr_value_list_get(list, idx), path);
        if (e) return e;
        idx++;
    }
    if (close) u->p++;
    return MPR_OK;
}

/* single: unpack `v` itself with a one-item format; otherwise `v` is the
 * argument list. Check pass, then write pass. */
static mpr_err_t vunpack(const char *who, const mpr_value_t *v, bool single, const char *fmt, va_list ap) {
    int nslots, ntop;
    slot_t slots[MPR_FORMAT_MAX_ITEMS];
    if (!v) return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: argument '%s' is NULL", who, single ? "v" : "args");
    mpr_err_t e = parse_format(who, fmt, true, &nslots, &ntop);
    if (e) return e;
    if (single && ntop != 1)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: format \"%s\" must describe exactly one value", who, fmt);
    if (!single && mpr_value_kind(v) != MPR_VALUE_LIST)
        return mpr_error_set(MPR_ERR_TYPE, "%s: arguments: expected a list, got %s", who,
                             mpr_value_kind_name(mpr_value_kind(v)));
    va_list copy;
    va_copy(copy, ap);
    collect_slots(fmt, true, slots, &copy);
    va_end(copy);
    for (int k = 0; k < nslots; k++)
        if (!slots[k].a.p || (slots[k].c == 'y' && !slots[k].out2))
            return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: the output pointer for format item %d ('%c') is NULL",
                                 who, k, slots[k].c);
    for (int pass = 0; pass < 2; pass++) {
        unpacker_t u = {.who = who, .p = fmt, .slots = slots, .k = 0, .write = pass == 1};
        if (single) {
            while (*u.p == ' ') u.p++;
            e = unpack_item(&u, v, "value");
        } else {
            e = unpack_list(&u, v, '\0', NULL);
        }
        if (e) {
            MPRI_ASSERT(pass == 0, "the write pass cannot fail");
            return e;
        }
    }
    return MPR_OK;
}

mpr_err_t mpr_args_vunpack(const mpr_value_t *args, const char *fmt, va_list ap) {
    return vunpack("mpr_args_unpack", args, false, fmt, ap);
}

mpr_err_t mpr_args_unpack(const mpr_value_t *args, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    mpr_err_t e = vunpack("mpr_args_unpack", args, false, fmt, ap);
    va_end(ap);
    return e;
}

mpr_err_t mpr_value_unpack(const mpr_value_t *v, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    mpr_err_t e = vunpack("mpr_value_unpack", v, true, fmt, ap);
    va_end(ap);
    return e;
}
