/* mpirpc/value.h — the values RPCs take and return.
 *
 * A value is one of: none, bool, int64, double, string, bytes, tensor,
 * worker info, a list of values (nesting allowed), an RRef, or a local object
 * of a registered type (objects never leave their rank; they live behind
 * RRefs). Values are immutable once built, except that a list may be appended
 * to until it is shared; they are refcounted and safe to share across threads.
 *
 * Ownership: every mpr_value_new_* returns a new reference (or NULL with
 * mpr_last_error() set: MPR_ERR_INVALID_ARG for a NULL argument it needs,
 * MPR_ERR_NOMEM); release it with mpr_value_release().
 * mpr_value_list_append() takes ownership of `item`. Getters borrow: a
 * tensor/string/list item returned by a getter stays valid while the value
 * lives. mpr_value_release(NULL) is a no-op.
 *
 * Nesting: lists nest to any depth locally (releasing a deep list uses no
 * recursion), but a value sent in an RPC may nest at most MPR_MAX_VALUE_DEPTH
 * lists deep: a deeper one fails the call with MPR_ERR_INVALID_ARG before it
 * is sent (and a receiver rejects one as MPR_ERR_DECODE).
 *
 * NULL and misuse: a NULL pointer a function needs gives MPR_ERR_INVALID_ARG
 * naming the function and the argument ("mpr_value_get_int: argument 'out'
 * is NULL"); getters returning a plain value then return the default stated
 * below. Using a value after its last release, or releasing it twice, is a
 * caller bug: every retain/release/getter checks the value's magic word and
 * aborts with "mpirpc: ... value 0x... (int) used after its last
 * mpr_value_release" (reliably in Debug/sanitizer builds, where freed values
 * are quarantined; best effort otherwise). */
#ifndef MPIRPC_VALUE_H
#define MPIRPC_VALUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mpirpc/error.h"
#include "mpirpc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MPR_MAX_NAME_LEN 128 /* worker names are shorter than this */
#define MPR_MAX_VALUE_DEPTH 64 /* list nesting an RPC can carry */

/* A worker: its name and its rank in the mpirpc communicator. */
typedef struct mpr_worker_info {
    char name[MPR_MAX_NAME_LEN];
    int rank;
} mpr_worker_info_t;

typedef enum {
    MPR_VALUE_NONE = 0,
    MPR_VALUE_BOOL,
    MPR_VALUE_INT,
    MPR_VALUE_DOUBLE,
    MPR_VALUE_STRING,
    MPR_VALUE_BYTES,
    MPR_VALUE_TENSOR,
    MPR_VALUE_WORKER,
    MPR_VALUE_LIST,
    MPR_VALUE_RREF,
    MPR_VALUE_OBJECT,
    MPR_VALUE_KIND_COUNT
} mpr_value_kind_t;

typedef struct mpr_value mpr_value_t;
struct mpr_rref;

/* "none", "bool", ... for messages. */
const char *mpr_value_kind_name(mpr_value_kind_t kind);

mpr_value_t *mpr_value_new_none(void);
mpr_value_t *mpr_value_new_bool(bool b);
mpr_value_t *mpr_value_new_int(int64_t i);
mpr_value_t *mpr_value_new_double(double d);
/* Copies the NUL-terminated string. */
mpr_value_t *mpr_value_new_string(const char *s);
/* Copies `len` bytes. */
mpr_value_t *mpr_value_new_bytes(const void *data, size_t len);
/* Takes a new reference to `t` (the caller keeps its own). */
mpr_value_t *mpr_value_new_tensor(mpr_tensor_t *t);
mpr_value_t *mpr_value_new_worker(const mpr_worker_info_t *w);
/* An empty list; fill it with mpr_value_list_append(). */
mpr_value_t *mpr_value_new_list(void);
/* A list of `n` items, taking ownership of each (convenience for argument
 * lists: mpr_value_list_of(2, mpr_value_new_int(1), mpr_value_new_int(2))).
 * If any item is NULL, every item is released and NULL is returned; a
 * negative `n` is MPR_ERR_INVALID_ARG. */
mpr_value_t *mpr_value_list_of(int n, ...);

/* Returns `v`; NULL gives NULL (with MPR_ERR_INVALID_ARG set). */
mpr_value_t *mpr_value_retain(mpr_value_t *v);
void mpr_value_release(mpr_value_t *v);

/* MPR_VALUE_NONE (and MPR_ERR_INVALID_ARG set) for NULL. */
mpr_value_kind_t mpr_value_kind(const mpr_value_t *v);

/* Getters return MPR_ERR_TYPE (detail names expected and actual kinds) on a
 * kind mismatch, MPR_ERR_INVALID_ARG for a NULL argument; on any failure the
 * outputs are cleared (0, false, NULL; a worker's rank -1), never stale. */
mpr_err_t mpr_value_get_bool(const mpr_value_t *v, bool *out);
mpr_err_t mpr_value_get_int(const mpr_value_t *v, int64_t *out);
/* Accepts int too (converted). */
mpr_err_t mpr_value_get_double(const mpr_value_t *v, double *out);
/* Borrowed NUL-terminated string. */
mpr_err_t mpr_value_get_string(const mpr_value_t *v, const char **out);
/* Borrowed bytes (string values too). */
mpr_err_t mpr_value_get_bytes(const mpr_value_t *v, const void **data, size_t *len);
/* Borrowed tensor: retain it to keep it beyond the value. */
mpr_err_t mpr_value_get_tensor(const mpr_value_t *v, mpr_tensor_t **out);
mpr_err_t mpr_value_get_worker(const mpr_value_t *v, mpr_worker_info_t *out);

/* List access. mpr_value_list_len returns 0 for a non-list (and for NULL,
 * setting MPR_ERR_INVALID_ARG). */
size_t mpr_value_list_len(const mpr_value_t *v);
/* Borrowed item, or NULL (with MPR_ERR_INVALID_ARG/MPR_ERR_TYPE set) if `v`
 * is not a list or `i` is out of range. */
mpr_value_t *mpr_value_list_get(const mpr_value_t *v, size_t i);
/* Appends, taking ownership of `item` (released on failure too). A NULL
 * item is MPR_ERR_INVALID_ARG, or, when an earlier call on this thread failed
 * (typically the constructor that returned the NULL item), that call's code,
 * with both messages in the detail. */
mpr_err_t mpr_value_list_append(mpr_value_t *list, mpr_value_t *item);

/* Typed access to item i of an argument list, with an error naming the
 * position when the list is too short or the kind is wrong. *out is cleared
 * on failure. */
mpr_err_t mpr_args_int(const mpr_value_t *args, size_t i, int64_t *out);
mpr_err_t mpr_args_double(const mpr_value_t *args, size_t i, double *out);
mpr_err_t mpr_args_string(const mpr_value_t *args, size_t i, const char **out);
mpr_err_t mpr_args_tensor(const mpr_value_t *args, size_t i, mpr_tensor_t **out);

/* Deep equality (tensors: same dtype, shape and element bytes). False (with
 * MPR_ERR_INVALID_ARG set) if either is NULL. */
bool mpr_value_equal(const mpr_value_t *a, const mpr_value_t *b);

#ifdef __cplusplus
}
#endif
#endif
