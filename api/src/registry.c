/* registry.c — registered functions, by name hash.
 *
 * Invariants: ids are unique (a second name with the same 64-bit hash is
 * rejected with both names in the message); calls resolve by id and name;
 * entries are immutable once published and freed only by
 * mpr_registry_clear(), so lookups return stable pointers under a read lock. */
#include "mpri_args.h"
#include "mpri_registry.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_trace.h"
#include "mpri_wire.h"

static struct {
    pthread_rwlock_t lock;
    mpri_function_t **items;
    size_t len, cap;
} registry = {.lock = PTHREAD_RWLOCK_INITIALIZER};

static mpri_function_t *find_locked(uint64_t id) {
    for (size_t i = 0; i < registry.len; i++)
        if (registry.items[i]->id == id) return registry.items[i];
    return NULL;
}

const mpri_function_t *mpri_registry_find(uint64_t id) {
    pthread_rwlock_rdlock(&registry.lock);
    const mpri_function_t *f = find_locked(id);
    pthread_rwlock_unlock(&registry.lock);
    return f;
}

static const char *function_name(uint64_t id) {
    const mpri_function_t *f = mpri_registry_find(id);
    return f ? f->name : NULL;
}

mpr_err_t mpri_registry_install_namer(void) {
    mpri_observe_set_function_namer(function_name);
    return MPR_OK;
}

const mpri_function_t *mpri_registry_find_named(uint64_t id, const char *name) {
    const mpri_function_t *f = mpri_registry_find(id);
    return f && strcmp(f->name, name) == 0 ? f : NULL;
}

static mpr_err_t add(const char *name, mpr_fn_t fn, mpr_async_fn_t afn, void *user_data) {
    if (!name || !*name || strlen(name) > MPRI_MAX_FUNCTION_NAME)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "register: function name must be 1 to %d bytes",
                             MPRI_MAX_FUNCTION_NAME);
    if (!fn && !afn) return mpr_error_set(MPR_ERR_INVALID_ARG, "register '%s': NULL function", name);
    uint64_t id = mpri_hash_name(name);
    pthread_rwlock_wrlock(&registry.lock);
    mpri_function_t *existing = find_locked(id);
    if (existing) {
        mpr_err_t e = strcmp(existing->name, name) == 0
                          ? mpr_error_set(MPR_ERR_EXISTS, "register: function '%s' is already registered", name)
                          : mpr_error_set(MPR_ERR_EXISTS,
                                          "register: '%s' has the same 64-bit id as '%s'; rename one",
                                          name, existing->name);
        pthread_rwlock_unlock(&registry.lock);
        return e;
    }
    if (registry.len == registry.cap) {
        size_t cap = registry.cap ? registry.cap * 2 : 32;
        mpri_function_t **items = realloc(registry.items, cap * sizeof *items);
        if (!items) {
            pthread_rwlock_unlock(&registry.lock);
            return mpr_error_set(MPR_ERR_NOMEM, "register: out of memory");
        }
        registry.items = items;
        registry.cap = cap;
    }
    mpri_function_t *f = calloc(1, sizeof *f);
    char *copy = strdup(name);
    if (!f || !copy) {
        free(f);
        free(copy);
        pthread_rwlock_unlock(&registry.lock);
        return mpr_error_set(MPR_ERR_NOMEM, "register: out of memory");
    }
    *f = (mpri_function_t){id, copy, fn, afn, user_data};
    registry.items[registry.len++] = f;
    pthread_rwlock_unlock(&registry.lock);
    return MPR_OK;
}

mpr_err_t mpr_register_function(const char *name, mpr_fn_t fn, void *user_data) {
    MPRI_ARG_NONNULL(name);
    MPRI_ARG_NONNULL(fn);
    return add(name, fn, NULL, user_data);
}

mpr_err_t mpr_register_async_function(const char *name, mpr_async_fn_t fn, void *user_data) {
    MPRI_ARG_NONNULL(name);
    MPRI_ARG_NONNULL(fn);
    return add(name, NULL, fn, user_data);
}

void mpr_registry_clear(void) {
    pthread_rwlock_wrlock(&registry.lock);
    for (size_t i = 0; i < registry.len; i++) {
        free(registry.items[i]->name);
        free(registry.items[i]);
    }
    free(registry.items);
    registry.items = NULL;
    registry.len = registry.cap = 0;
    pthread_rwlock_unlock(&registry.lock);
}
