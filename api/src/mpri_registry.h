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

/* What a handler sees (call.c). */
struct mpr_call_ctx {
    const mpri_function_t *function;
    const mpr_worker_info_t *caller;
};

#define MPRI_MAX_FUNCTION_NAME 255

#endif
