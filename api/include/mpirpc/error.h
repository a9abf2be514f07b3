/* mpirpc/error.h — the one error enum of mpirpc and the thread-local detail message.
 *
 * Every recoverable failure is a returned mpr_err_t. Functions that return a
 * pointer return NULL on failure and leave the code in mpr_last_error_code()
 * (never MPR_OK after a NULL: a NULL argument is MPR_ERR_INVALID_ARG with a
 * detail "<function>: argument '<name>' is NULL"; tensor ops given a NULL
 * input keep the error an earlier op recorded, see tensor_ops.h). Outputs
 * (*out, *result, ...) are set to NULL/zero on every failure, never left
 * stale.
 * Either way, mpr_last_error() gives a human-readable detail for the calling
 * thread (the string is owned by the library and valid until the thread's next
 * failing call). The codes and their names come from one list (MPR_ERROR_LIST)
 * so the enum and mpr_strerror() cannot drift apart. */
#ifndef MPIRPC_ERROR_H
#define MPIRPC_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

#define MPR_ERROR_LIST(X)                                                   \
    X(MPR_OK, "success")                                                    \
    X(MPR_ERR_INVALID_ARG, "invalid argument")                              \
    X(MPR_ERR_NOMEM, "out of memory")                                       \
    X(MPR_ERR_TIMEOUT, "timed out")                                         \
    X(MPR_ERR_UNKNOWN_FUNCTION, "unknown function")                         \
    X(MPR_ERR_REMOTE, "remote error")                                       \
    X(MPR_ERR_SHUTDOWN, "runtime is shut down")                             \
    X(MPR_ERR_NOT_INITIALIZED, "runtime is not initialized")                \
    X(MPR_ERR_ALREADY_INITIALIZED, "runtime is already initialized")        \
    X(MPR_ERR_MPI, "MPI error")                                             \
    X(MPR_ERR_DECODE, "malformed message")                                  \
    X(MPR_ERR_TYPE, "wrong value type")                                     \
    X(MPR_ERR_SHAPE, "shape mismatch")                                      \
    X(MPR_ERR_DTYPE, "dtype mismatch")                                      \
    X(MPR_ERR_NOT_FOUND, "not found")                                       \
    X(MPR_ERR_EXISTS, "already exists")                                     \
    X(MPR_ERR_STATE, "invalid state")                                       \
    X(MPR_ERR_IO, "I/O error")                                              \
    X(MPR_ERR_UNSUPPORTED, "unsupported")                                   \
    X(MPR_ERR_NOT_OWNER, "not the owner")

typedef enum {
#define MPR_X_ENUM(code, text) code,
    MPR_ERROR_LIST(MPR_X_ENUM)
#undef MPR_X_ENUM
    MPR_ERR_COUNT
} mpr_err_t;

/* Size of every error text the library keeps or builds (the thread's detail,
 * a future's message, a remote failure's text), terminating NUL included:
 * longer texts are truncated. A buffer of this size holds any
 * mpr_last_error() in full. */
#define MPR_ERROR_TEXT_MAX 1024

/* Static text for a code ("timed out"); never NULL. */
const char *mpr_strerror(mpr_err_t code);
/* The enumerator's name ("MPR_ERR_TIMEOUT"); never NULL. */
const char *mpr_error_name(mpr_err_t code);

/* Detail of the calling thread's last failure; "" if none. Owned by the library. */
const char *mpr_last_error(void);
/* Code of the calling thread's last failure (MPR_OK if none). */
mpr_err_t mpr_last_error_code(void);

/* Record a failure for the calling thread and return `code`, so a handler or
 * a library function can write `return mpr_error_set(MPR_ERR_..., "...", ...)`.
 * The formatted text is copied (truncated to MPR_ERROR_TEXT_MAX - 1 bytes);
 * a NULL `fmt` records the code's own text (mpr_strerror). */
mpr_err_t mpr_error_set(mpr_err_t code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Forget the calling thread's last failure. */
void mpr_error_clear(void);

/* ---- remote failures ----
 * A function that fails on another worker (or on this one, called through
 * rpc/remote) fails the call with MPR_ERR_REMOTE: that code means "the
 * function failed", whatever it failed with, so a remote MPR_ERR_TIMEOUT is
 * never mistaken for the call's own timeout. What it failed with is kept:
 *  - mpr_last_error_remote_code(): the function's own code on the worker
 *    where the failure started (its origin), e.g. MPR_ERR_NOT_FOUND;
 *  - mpr_last_error_origin(): that worker's rank;
 *  - mpr_last_error(): "On worker2 (rank 2): function 'g' failed:
 *    MPR_ERR_NOT_FOUND: <its detail>", and for a nested chain (A calls f on
 *    B, f calls g on C, g fails and f passes the failure on) the same text
 *    once, followed by " (call chain: worker1 'f' -> worker2 'g')".
 * A function passes a remote failure on by returning MPR_ERR_REMOTE while it
 * is still the thread's last error (e.g. `if (e) return e;` after
 * mpr_rpc_sync, or mpr_future_set_error(out, code, mpr_last_error())); a
 * function that sets a new error instead (mpr_error_set) is the new origin.
 * Futures report the same: mpr_future_get sets all three, and
 * mpr_future_remote_code / mpr_future_error_origin (future.h) read them
 * without waiting. Unknown functions and undecodable calls are not remote
 * failures: they keep their own codes (MPR_ERR_UNKNOWN_FUNCTION, ...). */

/* When the calling thread's last failure is MPR_ERR_REMOTE: the code the
 * function failed with on its origin worker; otherwise MPR_OK. */
mpr_err_t mpr_last_error_remote_code(void);
/* When the calling thread's last failure is MPR_ERR_REMOTE: the rank of the
 * worker where it started; otherwise -1. */
int mpr_last_error_origin(void);

#ifdef __cplusplus
}
#endif
#endif
