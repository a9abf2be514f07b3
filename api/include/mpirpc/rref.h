/* mpirpc/rref.h — remote references (RRefs), object values and RRef proxies.
 *
 * An RRef names a value that lives on exactly one worker, its owner. The
 * owner holds the value in an OwnerRRef; every other worker holding the RRef
 * has a UserRRef (a handle with its own fork id). The owner keeps the value
 * alive while any UserRRef exists anywhere and destroys it (for an object
 * value, the registered destructor runs) as soon as none remains and no local
 * handle on the owner refers to it. Reference counting across workers is
 * transparent: RRefs travel as values (arguments and results of any call,
 * nested in lists) and the fork protocol of PyTorch's rref.rst keeps the
 * counts right.
 *
 * Errors of mpr_remote() (the function failed, it is unknown, the call timed
 * out) are not returned by mpr_remote(): they surface, naming the remote
 * worker, at the next use of the RRef (to_here, a proxy call, sending it).
 * This is best effort, as in PyTorch: a use that starts before the error
 * arrived may still succeed or wait.
 *
 * Threads: every function is thread-safe. Blocking functions (to_here,
 * local_value while the value is being created, the sync proxy) help the
 * runtime progress while they wait, as mpr_future_wait() does.
 *
 * Ownership: functions returning mpr_rref_t * return a new reference; drop it
 * with mpr_rref_release() (NULL is a no-op). When the last reference to a
 * UserRRef goes, the owner is told. Using an RRef after its last release is
 * a caller bug; the library detects it on a best-effort basis (MPR_ERR_STATE
 * "used after release") while the handle's memory is still quarantined.
 * Shutdown: while a rank is in graceful shutdown, its RRefs stay valid for
 * its handlers (which still run, call out and receive RRefs) until every
 * worker has called mpr_shutdown(true) and the whole job is quiescent; then
 * every UserRRef is deleted (the owners are told and free their values), and
 * later uses of a handle the application still holds fail with
 * MPR_ERR_SHUTDOWN "deleted by shutdown". A UserRRef whose owner left the
 * job (mpr_shutdown(false)) is dropped without a message; an OwnerRRef whose
 * users were on a rank that left keeps their forks, and the graceful
 * shutdown's leak report on stderr lists it ("RRef leak: OwnerRRef(r:n)
 * still has k fork(s)"). After mpr_shutdown() every operation that needs the
 * runtime returns MPR_ERR_SHUTDOWN. */
#ifndef MPIRPC_RREF_H
#define MPIRPC_RREF_H

#include <stdbool.h>

#include "mpirpc/error.h"
#include "mpirpc/future.h"
#include "mpirpc/init.h"
#include "mpirpc/rpc.h"
#include "mpirpc/value.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mpr_rref mpr_rref_t;

/* ---- creating RRefs ---- */

/* Run registered function `fn` on `to` with `args` (borrowed list, NULL: no
 * arguments) and return at once an RRef to its result; `to` becomes the
 * owner. On `to` == self the result is an OwnerRRef. timeout_s as for
 * mpr_rpc_async (the creation must complete within it, else the next use
 * fails with MPR_ERR_TIMEOUT). Returns NULL (with the error set) only for
 * local problems: runtime not running, unknown destination, bad function
 * name, arguments that are not a list or cannot be sent. */
mpr_rref_t *mpr_remote(mpr_dest_t to, const char *fn, const mpr_value_t *args, double timeout_s);

/* An OwnerRRef on this worker holding `value` (borrowed: the RRef takes its
 * own reference). NULL with the error set if the runtime is not running. */
mpr_rref_t *mpr_rref_create_local(mpr_value_t *value);

mpr_rref_t *mpr_rref_retain(mpr_rref_t *r);
/* Drop a reference. The last reference to a UserRRef sends the owner a
 * delete (once the owner confirmed this user; before that, the protocol
 * keeps the handle alive and sends the delete after the confirmation). */
void mpr_rref_release(mpr_rref_t *r);

/* ---- using RRefs ---- */

/* A copy of the value fetched from the owner (on the owner: the value itself).
 * New reference in *out. Waits up to timeout_s (MPR_TIMEOUT_DEFAULT: the
 * default RPC timeout; 0: none). Errors: the creation error of the RRef
 * (MPR_ERR_REMOTE, MPR_ERR_UNKNOWN_FUNCTION, MPR_ERR_TIMEOUT with the remote
 * worker named), MPR_ERR_TIMEOUT, MPR_ERR_UNSUPPORTED for an object value
 * (objects cannot leave their owner: use a proxy), MPR_ERR_SHUTDOWN. */
mpr_err_t mpr_rref_to_here(mpr_rref_t *r, double timeout_s, mpr_value_t **out);

/* The owner's value (new reference in *out). MPR_ERR_NOT_OWNER on a user
 * (the detail names the owner). If the value is still being created, waits
 * for it up to the default RPC timeout. */
mpr_err_t mpr_rref_local_value(mpr_rref_t *r, mpr_value_t **out);

/* True on the owner. False for NULL. */
bool mpr_rref_is_owner(const mpr_rref_t *r);
/* The owner's worker info (MPR_ERR_INVALID_ARG for NULL). */
mpr_err_t mpr_rref_owner(const mpr_rref_t *r, mpr_worker_info_t *out);
/* The owner's worker name (borrowed, valid while `r` lives); "" for NULL. */
const char *mpr_rref_owner_name(const mpr_rref_t *r);
/* OwnerRRef: always true. UserRRef: true once the owner knows of it. */
bool mpr_rref_confirmed_by_owner(const mpr_rref_t *r);

/* "(creator rank, counter)" text of the RRef id, e.g. "RRef(1:7)", into buf. */
const char *mpr_rref_id_string(const mpr_rref_t *r, char *buf, size_t len);

/* ---- RRefs as values ---- */

/* A value holding `r` (takes a new reference; the caller keeps its own). */
mpr_value_t *mpr_value_new_rref(mpr_rref_t *r);
/* Borrowed RRef of an RRef value (retain it to keep it beyond the value). */
mpr_err_t mpr_value_get_rref(const mpr_value_t *v, mpr_rref_t **out);
/* Item i of an argument list as an RRef (borrowed), error naming the position. */
mpr_err_t mpr_args_rref(const mpr_value_t *args, size_t i, mpr_rref_t **out);

/* ---- object values (registered types) ---- */

typedef struct mpr_type mpr_type_t;
typedef void (*mpr_destructor_t)(void *obj);

/* Register a type by name (1 to 127 bytes) with the destructor run on an
 * instance when its last value reference goes (NULL: nothing to run).
 * *out receives the type (valid until the process ends). MPR_ERR_EXISTS for
 * a name already registered. Objects never leave their worker: sending an
 * object value fails with MPR_ERR_UNSUPPORTED; share it through an RRef. */
mpr_err_t mpr_register_type(const char *name, mpr_destructor_t destructor, const mpr_type_t **out);
/* The type registered as `name`, or NULL (MPR_ERR_NOT_FOUND). */
const mpr_type_t *mpr_type_find(const char *name);
const char *mpr_type_name(const mpr_type_t *type);

/* An object value owning `obj` (the type's destructor runs on it when the
 * value's last reference goes). NULL on bad input (obj is then NOT freed). */
mpr_value_t *mpr_value_new_object(const mpr_type_t *type, void *obj);
/* Borrowed object pointer; `type` NULL accepts any type. MPR_ERR_TYPE (naming
 * both types) on a mismatch. */
mpr_err_t mpr_value_get_object(const mpr_value_t *v, const mpr_type_t *type, void **obj);

/* ---- proxies: run a function on the owner with the owner's value as self ----
 *
 * mpr_rref_rpc_sync(r, fn, args, ...) is the C form of
 * rref.rpc_sync().fn(*args): it calls registered function `fn` on r's owner
 * with the argument list [r, args...] (the RRef is prepended). On the owner,
 * the handler gets `self` with mpr_rref_self(args, type, &obj) (or, for any
 * value, mpr_args_rref(args, 0, ...) then mpr_rref_local_value()). The owner
 * runs the handler only after the RRef argument is confirmed, like every
 * call receiving RRefs. Errors of a failed creation surface here. */
mpr_err_t mpr_rref_rpc_sync(mpr_rref_t *r, const char *fn, const mpr_value_t *args, double timeout_s,
                            mpr_value_t **result);
/* Never NULL except out of memory: every error completes the future. */
mpr_future_t *mpr_rref_rpc_async(mpr_rref_t *r, const char *fn, const mpr_value_t *args,
                                 double timeout_s);
/* An RRef (on r's owner) to the result of fn(r, args...). NULL as mpr_remote. */
mpr_rref_t *mpr_rref_remote(mpr_rref_t *r, const char *fn, const mpr_value_t *args, double timeout_s);

/* Inside a proxy handler: the object behind args[0] (an RRef owned here) as
 * a borrowed pointer of `type` (NULL: any type). MPR_ERR_NOT_OWNER if the
 * RRef is not owned by this worker, MPR_ERR_TYPE for a non-object or another
 * type. The pointer stays valid while the call's arguments live. */
mpr_err_t mpr_rref_self(const mpr_value_t *args, const mpr_type_t *type, void **obj);

#ifdef __cplusplus
}
#endif
#endif
