/* rref_object.c — registered types and object values (MPR_VALUE_OBJECT).
 *
 * An object value owns one instance of a registered type; the type's
 * destructor runs exactly once, when the value's last reference goes (for an
 * object behind an RRef: when the owner drops the value, i.e. when no user
 * remains and no local handle refers to it). Objects are local: encoding one
 * fails with MPR_ERR_UNSUPPORTED naming the type, so an object never leaves
 * its worker by accident; there is no decoder.
 * Invariants: types are never freed (pointers stay valid for the process);
 * type names are unique; registration is thread-safe. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_args.h"
#include "mpri_init.h"
#include "mpri_rref.h"
#include "mpri_value.h"

struct mpr_type {
    char *name;
    mpr_destructor_t destructor;
    struct mpr_type *next;
};

typedef struct object_box {
    const mpr_type_t *type;
    void *obj;
} object_box_t;

static pthread_mutex_t types_lock = PTHREAD_MUTEX_INITIALIZER;
static mpr_type_t *types;

static const mpr_type_t *find_locked(const char *name) {
    for (mpr_type_t *t = types; t; t = t->next)
        if (strcmp(t->name, name) == 0) return t;
    return NULL;
}

mpr_err_t mpr_register_type(const char *name, mpr_destructor_t destructor, const mpr_type_t **out) {
    if (out) *out = NULL;
    MPRI_ARG_NONNULL(name);
    MPRI_ARG_NONNULL(out);
    if (!name || !*name || strlen(name) >= MPR_MAX_NAME_LEN)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_register_type: name must be 1 to %d bytes",
                             MPR_MAX_NAME_LEN - 1);
    pthread_mutex_lock(&types_lock);
    if (find_locked(name)) {
        pthread_mutex_unlock(&types_lock);
        return mpr_error_set(MPR_ERR_EXISTS, "mpr_register_type: type '%s' is already registered", name);
    }
    mpr_type_t *t = calloc(1, sizeof *t);
    char *copy = strdup(name);
    if (!t || !copy) {
        pthread_mutex_unlock(&types_lock);
        free(t);
        free(copy);
        return mpr_error_set(MPR_ERR_NOMEM, "mpr_register_type: out of memory");
    }
    t->name = copy;
    t->destructor = destructor;
    t->next = types;
    types = t;
    pthread_mutex_unlock(&types_lock);
    if (out) *out = t;
    return MPR_OK;
}

const mpr_type_t *mpr_type_find(const char *name) {
    MPRI_ARG_NONNULL_OR(name, NULL);
    if (!name) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_type_find: name is NULL");
        return NULL;
    }
    pthread_mutex_lock(&types_lock);
    const mpr_type_t *t = find_locked(name);
    pthread_mutex_unlock(&types_lock);
    if (!t) mpr_error_set(MPR_ERR_NOT_FOUND, "no type named '%s' is registered", name);
    return t;
}

const char *mpr_type_name(const mpr_type_t *type) {
    MPRI_ARG_NONNULL_OR(type, NULL);
    return type ? type->name : "?";
}

mpr_value_t *mpr_value_new_object(const mpr_type_t *type, void *obj) {
    MPRI_ARG_NONNULL_OR(type, NULL);
    MPRI_ARG_NONNULL_OR(obj, NULL);
    if (!type || !obj) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_value_new_object: NULL %s", type ? "object" : "type");
        return NULL;
    }
    if (mpri_api_init() != MPR_OK) return NULL; /* installs the object kind's ops, also before mpr_init */
    object_box_t *box = malloc(sizeof *box);
    if (!box) {
        mpr_error_set(MPR_ERR_NOMEM, "mpr_value_new_object: out of memory");
        return NULL;
    }
    box->type = type;
    box->obj = obj;
    mpr_value_t *v = mpri_value_new_opaque(MPR_VALUE_OBJECT, box);
    if (!v) free(box);
    return v;
}

mpr_err_t mpr_value_get_object(const mpr_value_t *v, const mpr_type_t *type, void **obj) {
    if (obj) *obj = NULL;
    MPRI_ARG_NONNULL(v);
    MPRI_ARG_NONNULL(obj);
    if (!v || v->kind != MPR_VALUE_OBJECT)
        return mpr_error_set(MPR_ERR_TYPE, "expected an object value%s%s, got %s", type ? " of type " : "",
                             type ? type->name : "", v ? mpr_value_kind_name(v->kind) : "NULL");
    const object_box_t *box = v->u.opaque;
    if (type && box->type != type)
        return mpr_error_set(MPR_ERR_TYPE, "expected an object of type '%s', got one of type '%s'", type->name,
                             box->type->name);
    if (obj) *obj = box->obj;
    return MPR_OK;
}

/* The value owns its box: there is exactly one reference, so retain is never
 * needed (values are shared by refcount, not by copying the box). */
static void object_retain(void *p) { (void)p; }

static void object_release(void *p) {
    object_box_t *box = p;
    if (box->type->destructor) box->type->destructor(box->obj);
    free(box);
}

static mpr_err_t object_encode(void *p, mpri_buf_t *out, int dst_rank) {
    const object_box_t *box = p;
    return mpr_error_set(MPR_ERR_UNSUPPORTED,
                         "an object of type '%s' cannot be sent to another worker (objects live on "
                         "their owner): share it with mpr_rref_create_local() and call it through "
                         "mpr_rref_rpc_sync()/mpr_rref_remote()",
                         box->type->name);
}

static const mpri_opaque_value_ops_t object_ops = {object_retain, object_release, object_encode, NULL, NULL, NULL, NULL};

void mpri_rref_object_install(void) { mpri_value_set_opaque_ops(MPR_VALUE_OBJECT, &object_ops); }
