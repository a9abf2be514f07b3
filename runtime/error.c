/* error.c — names and texts of the error codes, the per-thread detail, and
 * remote failures with their origin (mpri_error.h: text, wire form).
 *
 * Invariants: the detail buffer is thread-local, so setting an error never
 * races with another thread reading its own. mpr_error_set() always returns
 * the code it was given so callers can `return mpr_error_set(...)`, and
 * accepts mpr_last_error() among its arguments. The
 * thread's remote error is valid only while `last_remote_on`: every other
 * way of setting or clearing the thread's error turns it off.
 * mpri_error_save/_restore copy all of it (code, text, remote origin). */
#include "mpirpc/error.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "mpri_error.h"

static const char *const error_texts[] = {
#define MPR_X_TEXT(code, text) text,
    MPR_ERROR_LIST(MPR_X_TEXT)
#undef MPR_X_TEXT
};

static const char *const error_names[] = {
#define MPR_X_NAME(code, text) #code,
    MPR_ERROR_LIST(MPR_X_NAME)
#undef MPR_X_NAME
};

static _Thread_local char last_detail[MPR_ERROR_TEXT_MAX];
static _Thread_local mpr_err_t last_code;
static _Thread_local bool last_remote_on;
static _Thread_local mpri_remote_error_t last_remote;

const char *mpr_strerror(mpr_err_t code) {
    if ((int)code < 0 || code >= MPR_ERR_COUNT) return "unknown error code";
    return error_texts[code];
}

const char *mpr_error_name(mpr_err_t code) {
    if ((int)code < 0 || code >= MPR_ERR_COUNT) return "MPR_ERR_?";
    return error_names[code];
}

const char *mpr_last_error(void) { return last_detail; }

mpr_err_t mpr_last_error_code(void) { return last_code; }

mpr_err_t mpr_error_set(mpr_err_t code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    /* Formatted aside first: the arguments may be mpr_last_error() itself
     * ("...: %s", mpr_last_error()), which vsnprintf must not overwrite. */
    char text[MPR_ERROR_TEXT_MAX];
    if (fmt)
        vsnprintf(text, sizeof text, fmt, ap);
    else /* no detail given: the code's own text, never a NULL format */
        snprintf(text, sizeof text, "%s", mpr_strerror(code));
    va_end(ap);
    memcpy(last_detail, text, sizeof text);
    last_code = code;
    last_remote_on = false;
    return code;
}

void mpr_error_clear(void) {
    last_detail[0] = '\0';
    last_code = MPR_OK;
    last_remote_on = false;
}

void mpri_error_save(mpri_error_saved_t *s) {
    s->code = last_code;
    s->remote_on = last_remote_on;
    memcpy(s->detail, last_detail, sizeof s->detail);
    if (last_remote_on) s->remote = last_remote;
}

void mpri_error_restore(const mpri_error_saved_t *s) {
    last_code = s->code;
    last_remote_on = s->remote_on;
    memcpy(last_detail, s->detail, sizeof last_detail);
    if (s->remote_on) last_remote = s->remote;
}

mpr_err_t mpr_last_error_remote_code(void) {
    return last_remote_on && last_code == MPR_ERR_REMOTE ? last_remote.code : MPR_OK;
}

int mpr_last_error_origin(void) { return last_remote_on && last_code == MPR_ERR_REMOTE ? last_remote.origin_rank : -1; }

/* ---- remote errors ---- */

/* snprintf that truncates silently: every error text is capped at
 * MPR_ERROR_TEXT_MAX by design. */
static void format_text(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void format_text(char *buf, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}

void mpri_remote_error_init(mpri_remote_error_t *re, const char *worker, int rank, const char *fn,
                            mpr_err_t code, const char *detail) {
    re->code = code;
    re->origin_rank = rank;
    re->hops = 1;
    format_text(re->origin, sizeof re->origin, "On %s (rank %d): function '%s' failed: %s: %s", worker, rank, fn,
             mpr_error_name(code), detail && *detail ? detail : mpr_strerror(code));
    format_text(re->chain, sizeof re->chain, "%s '%s'", worker, fn);
}

void mpri_remote_error_pass(mpri_remote_error_t *re, const char *worker, const char *fn) {
    char rest[MPR_ERROR_TEXT_MAX];
    memcpy(rest, re->chain, sizeof rest);
    format_text(re->chain, sizeof re->chain, "%s '%s' -> %s", worker, fn, rest);
    re->hops++;
}

void mpri_remote_error_text(const mpri_remote_error_t *re, char *buf, size_t len) {
    if (re->hops <= 1)
        format_text(buf, len, "%s", re->origin);
    else
        format_text(buf, len, "%s (call chain: %s)", re->origin, re->chain);
}

mpr_err_t mpri_error_set_remote(const mpri_remote_error_t *re) {
    if (re != &last_remote) last_remote = *re;
    mpri_remote_error_text(&last_remote, last_detail, sizeof last_detail);
    last_code = MPR_ERR_REMOTE;
    last_remote_on = true;
    return MPR_ERR_REMOTE;
}

const mpri_remote_error_t *mpri_last_remote_error(void) {
    return last_remote_on && last_code == MPR_ERR_REMOTE ? &last_remote : NULL;
}

const mpri_remote_error_t *mpri_remote_error_matching(mpr_err_t code, const char *message) {
    const mpri_remote_error_t *re = mpri_last_remote_error();
    return re && code == MPR_ERR_REMOTE && message && strcmp(message, last_detail) == 0 ? re : NULL;
}

void mpri_remote_error_write(mpri_buf_t *b, const mpri_remote_error_t *re) {
    mpri_buf_put_u32(b, (uint32_t)re->code);
    mpri_buf_put_u32(b, (uint32_t)re->origin_rank);
    mpri_buf_put_u32(b, (uint32_t)re->hops);
    mpri_buf_put_blob(b, re->origin, strlen(re->origin));
    mpri_buf_put_blob(b, re->chain, strlen(re->chain));
}

static mpr_err_t read_text(mpri_reader_t *r, char *out, size_t cap) {
    const void *p;
    size_t n;
    mpr_err_t e = mpri_read_blob(r, &p, &n);
    if (e) return e;
    if (n >= cap) n = cap - 1; /* truncated like every error text */
    memcpy(out, p, n);
    out[n] = '\0';
    return MPR_OK;
}

mpr_err_t mpri_remote_error_read(mpri_reader_t *r, mpri_remote_error_t *re) {
    uint32_t code, rank, hops;
    mpr_err_t e;
    if ((e = mpri_read_u32(r, &code)) || (e = mpri_read_u32(r, &rank)) || (e = mpri_read_u32(r, &hops)) ||
        (e = read_text(r, re->origin, sizeof re->origin)) || (e = read_text(r, re->chain, sizeof re->chain)))
        return e;
    /* MPR_ERR_REMOTE as the origin's code: a function returned it without
     * an origin (e.g. mpr_error_set(MPR_ERR_REMOTE, ...)): the code is unknown. */
    if (code == MPR_OK || code >= MPR_ERR_COUNT || (int32_t)rank < 0 ||
        (int32_t)hops < 1)
        return mpr_error_set(MPR_ERR_DECODE, "remote error: code %u, origin rank %d, %d hops", code, (int32_t)rank,
                             (int32_t)hops);
    re->code = (mpr_err_t)code;
    re->origin_rank = (int32_t)rank;
    re->hops = (int32_t)hops;
    return MPR_OK;
}
