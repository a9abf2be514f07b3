/* mpri_registry.h — the function registry (not installed). */
#ifndef MPRI_REGISTRY_H
#define MPRI_REGISTRY_H

#include "mpirpc/rpc.h"

typedef struct mpri_function {
    uint64_t id;
    char *name;
    mpr_fn_t fn;         /* exactly one of fn / afn is set */
    mpr_async_fn_t afn;
    void *user_data;
} mpri_function_t;

/* The registration with wire id `id`, or NULL. The pointer stays valid until
 * mpr_registry_clear(). */
const mpri_function_t *mpri_registry_find(uint64_t id);
/* The registration with wire id `id` AND this exact name, or NULL: a call
 * resolves through this, so a caller's name that merely shares the 64-bit id
 * of a registered one is an unknown function, not a call of the other. */
const mpri_function_t *mpri_registry_find_named(uint64_t id, const char *name);

/* What a handler sees (call.c). */
struct mpr_call_ctx {
    const mpri_function_t *function;
    const mpr_worker_info_t *caller;
};

#define MPRI_MAX_FUNCTION_NAME 255

/* Let traces and statistics (runtime/mpri_trace.h) name function ids by
 * their registrations (mpri_api_init). */
mpr_err_t mpri_registry_install_namer(void);

struct mpri_outmsg;

/* Start a call message of `kind` (CALL or REMOTE_CALL) to `fn`: checks the
 * function name and that `args` (NULL = none) is a list, sets the function
 * id and writes the name. `what` ("rpc", "remote") prefixes error details.
 * On failure nothing needs freeing. (call_msg.c) */
mpr_err_t mpri_call_msg_begin(struct mpri_outmsg *m, int kind, const char *what, const char *fn,
                              const mpr_value_t *args);
/* Append the argument list for `dst_rank` (RRef forks are undone if this
 * fails); on failure the message is freed and the detail names the call. */
mpr_err_t mpri_call_msg_args(struct mpri_outmsg *m, const char *what, const char *fn,
                             const mpr_value_t *args, int dst_rank);

#endif
