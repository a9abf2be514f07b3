/* mpirpc/error.h — the one error enum of mpirpc and the thread-local detail message.
 *
 * Every recoverable failure is a returned mpr_err_t. Functions that return a
 * pointer return NULL on failure and leave the code in mpr_last_error_code().
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
 * The formatted text is copied (truncated to MPR_ERROR_TEXT_MAX - 1 bytes). */
mpr_err_t mpr_error_set(mpr_err_t code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Forget the calling thread's last failure. */
void mpr_error_clear(void);

#ifdef __cplusplus
}
#endif
#endif
