/* error.c — names and texts of the error codes, and the per-thread detail.
 *
 * Invariant: the detail buffer is thread-local, so setting an error never
 * races with another thread reading its own. mpr_error_set() always returns
 * the code it was given so callers can `return mpr_error_set(...)`. */
#include "mpirpc/error.h"

#include <stdarg.h>
#include <stdio.h>

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
    vsnprintf(last_detail, sizeof last_detail, fmt, ap);
    va_end(ap);
    last_code = code;
    return code;
}

void mpr_error_clear(void) {
    last_detail[0] = '\0';
    last_code = MPR_OK;
}
