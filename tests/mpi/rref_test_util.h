/* rref_test_util.h — shared helpers of the RRef multi-rank tests: a tracked
 * object type whose destructor counts, and registered functions to create,
 * keep, drop, read and inspect RRefs on any rank. */
#ifndef RREF_TEST_UTIL_H
#define RREF_TEST_UTIL_H

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "mpitest.h"

static int rank, size;
static const mpr_type_t *tracked_type;
static atomic_long tracked_created, tracked_destroyed;

typedef struct tracked {
    pthread_mutex_t lock;
    int64_t v;
    int64_t calls;
} tracked_t;

static void tracked_destroy(void *p) {
    tracked_t *t = p;
    pthread_mutex_destroy(&t->lock);
    free(t);
    atomic_fetch_add(&tracked_destroyed, 1);
}

static mpr_value_t *new_tracked(int64_t v) {
    tracked_t *t = calloc(1, sizeof *t);
    pthread_mutex_init(&t->lock, NULL);
    t->v = v;
    atomic_fetch_add(&tracked_created, 1);
    return mpr_value_new_object(tracked_type, t);
}

/* make_tracked(v) -> a tracked object holding v */
static mpr_err_t fn_make_tracked(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t v;
    mpr_err_t e = mpr_args_int(args, 0, &v);
    if (e) return e;
    *result = new_tracked(v);
    return MPR_OK;
}

/* make_int(v) -> v */
static mpr_err_t fn_make_int(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t v;
    mpr_err_t e = mpr_args_int(args, 0, &v);
    if (e) return e;
    *result = mpr_value_new_int(v);
    return MPR_OK;
}

/* Proxy: tracked_get(self) -> self.v */
static mpr_err_t fn_tracked_get(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    tracked_t *t;
    mpr_err_t e = mpr_rref_self(args, tracked_type, (void **)&t);
    if (e) return e;
    pthread_mutex_lock(&t->lock);
    *result = mpr_value_new_int(t->v);
    pthread_mutex_unlock(&t->lock);
    return MPR_OK;
}

/* Proxy: tracked_add(self, d) -> self.v += d; returns the new v */
static mpr_err_t fn_tracked_add(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    tracked_t *t;
    int64_t d;
    mpr_err_t e = mpr_rref_self(args, tracked_type, (void **)&t);
    if (e || (e = mpr_args_int(args, 1, &d))) return e;
    pthread_mutex_lock(&t->lock);
    t->v += d;
    t->calls++;
    *result = mpr_value_new_int(t->v);
    pthread_mutex_unlock(&t->lock);
    return MPR_OK;
}

/* stats() -> [created, destroyed, rref_owners, rref_users] on this rank */
static mpr_err_t fn_stats(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    mpr_debug_info_t d;
    mpr_get_debug_info(&d);
    *result = mpr_value_list_of(4, mpr_value_new_int(atomic_load(&tracked_created)),
                                mpr_value_new_int(atomic_load(&tracked_destroyed)),
                                mpr_value_new_int(d.rref_owners), mpr_value_new_int(d.rref_users));
    return MPR_OK;
}

/* RRefs kept by handlers on this rank (keep / drop_kept). */
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static mpr_rref_t *kept[4096];
static int nkept;

/* keep(rref...) -> number kept now */
static mpr_err_t fn_keep(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    pthread_mutex_lock(&kept_lock);
    for (size_t i = 0; i < mpr_value_list_len(args); i++) {
        mpr_rref_t *r;
        mpr_err_t e = mpr_args_rref(args, i, &r);
        if (e) {
            pthread_mutex_unlock(&kept_lock);
            return e;
        }
        if (nkept == 4096) {
            pthread_mutex_unlock(&kept_lock);
            return mpr_error_set(MPR_ERR_NOMEM, "keep: full");
        }
        kept[nkept++] = mpr_rref_retain(r);
    }
    *result = mpr_value_new_int(nkept);
    pthread_mutex_unlock(&kept_lock);
    return MPR_OK;
}

static void drop_kept_local(void) {
    pthread_mutex_lock(&kept_lock);
    int n = nkept;
    mpr_rref_t *copy[4096];
    memcpy(copy, kept, sizeof(mpr_rref_t *) * (size_t)n);
    nkept = 0;
    pthread_mutex_unlock(&kept_lock);
    for (int i = 0; i < n; i++) mpr_rref_release(copy[i]);
}

static mpr_err_t fn_drop_kept(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    drop_kept_local();
    *result = NULL;
    return MPR_OK;
}

/* read(rref) -> the value: local_value on the owner, to_here elsewhere; for a
 * tracked object, its v (objects cannot be copied) */
static mpr_err_t fn_read(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    mpr_rref_t *r;
    mpr_err_t e = mpr_args_rref(args, 0, &r);
    if (e) return e;
    if (!mpr_rref_confirmed_by_owner(r))
        return mpr_error_set(MPR_ERR_STATE, "read: the RRef argument is not confirmed before the call");
    if (mpr_rref_is_owner(r)) {
        mpr_value_t *v;
        if ((e = mpr_rref_local_value(r, &v))) return e;
        if (mpr_value_kind(v) == MPR_VALUE_OBJECT) {
            tracked_t *t;
            e = mpr_value_get_object(v, tracked_type, (void **)&t);
            if (!e) *result = mpr_value_new_int(t->v);
            mpr_value_release(v);
            return e;
        }
        *result = v;
        return MPR_OK;
    }
    e = mpr_rref_to_here(r, MPR_TIMEOUT_DEFAULT, result);
    if (e == MPR_ERR_UNSUPPORTED) /* an object: ask the owner through a proxy */
        e = mpr_rref_rpc_sync(r, "tracked_get", NULL, MPR_TIMEOUT_DEFAULT, result);
    return e;
}

/* make_local(v) -> an RRef owned by this rank to a tracked object holding v */
static mpr_err_t fn_make_local(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t v;
    mpr_err_t e = mpr_args_int(args, 0, &v);
    if (e) return e;
    mpr_value_t *obj = new_tracked(v);
    mpr_rref_t *r = mpr_rref_create_local(obj);
    mpr_value_release(obj);
    if (!r) return mpr_last_error_code();
    *result = mpr_value_new_rref(r);
    mpr_rref_release(r);
    return MPR_OK;
}

/* echo(args...) -> args */
static mpr_err_t fn_echo(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    *result = mpr_value_retain((mpr_value_t *)args);
    return MPR_OK;
}

static mpr_err_t fn_fail(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    return mpr_error_set(MPR_ERR_INVALID_ARG, "make failed on purpose");
}

/* sleep(seconds) -> int 7 */
static mpr_err_t fn_sleep(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    double s;
    mpr_err_t e = mpr_args_double(args, 0, &s);
    if (e) return e;
    usleep((useconds_t)(s * 1e6));
    *result = mpr_value_new_int(7);
    return MPR_OK;
}

static void register_common(void) {
    CHECK_OK(mpr_register_type("Tracked", tracked_destroy, &tracked_type));
    CHECK_OK(mpr_register_function("make_tracked", fn_make_tracked, NULL));
    CHECK_OK(mpr_register_function("make_int", fn_make_int, NULL));
    CHECK_OK(mpr_register_function("tracked_get", fn_tracked_get, NULL));
    CHECK_OK(mpr_register_function("tracked_add", fn_tracked_add, NULL));
    CHECK_OK(mpr_register_function("stats", fn_stats, NULL));
    CHECK_OK(mpr_register_function("keep", fn_keep, NULL));
    CHECK_OK(mpr_register_function("drop_kept", fn_drop_kept, NULL));
    CHECK_OK(mpr_register_function("read", fn_read, NULL));
    CHECK_OK(mpr_register_function("make_local", fn_make_local, NULL));
    CHECK_OK(mpr_register_function("echo", fn_echo, NULL));
    CHECK_OK(mpr_register_function("fail", fn_fail, NULL));
    CHECK_OK(mpr_register_function("sleep", fn_sleep, NULL));
}

static void init_runtime(int *argc, char ***argv, int threads) {
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = argc;
    opts.argv = argv;
    opts.num_worker_threads = threads;
    CHECK_OK(mpr_init(&opts));
    rank = mpitest_rank();
    size = mpr_world_size();
    CHECK(size >= 2);
}

typedef struct {
    int64_t created, destroyed, owners, users;
} stats_t;

static stats_t get_stats(int dst) {
    mpr_value_t *r = NULL;
    CHECK_OK(mpr_rpc_sync(mpr_to_rank(dst), "stats", NULL, 10, &r));
    stats_t s;
    CHECK_OK(mpr_value_get_int(mpr_value_list_get(r, 0), &s.created));
    CHECK_OK(mpr_value_get_int(mpr_value_list_get(r, 1), &s.destroyed));
    CHECK_OK(mpr_value_get_int(mpr_value_list_get(r, 2), &s.owners));
    CHECK_OK(mpr_value_get_int(mpr_value_list_get(r, 3), &s.users));
    mpr_value_release(r);
    return s;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Wait (up to 20 s) until `dst` has no owner record and destroyed == created
 * + expect_extra_live... i.e. created - destroyed == live. */
__attribute__((unused)) static stats_t wait_owner_state(int dst, int64_t owners, int64_t live) {
    double t0 = now_s();
    stats_t s;
    for (;;) {
        s = get_stats(dst);
        if (s.owners == owners && s.created - s.destroyed == live) return s;
        if (now_s() - t0 > 20) {
            fprintf(stderr, "[rank %d] rank %d: owners %lld (want %lld), created %lld destroyed %lld (want %lld live)\n",
                    rank, dst, (long long)s.owners, (long long)owners, (long long)s.created,
                    (long long)s.destroyed, (long long)live);
            CHECK(!"owner state not reached");
        }
        usleep(1000);
    }
}

/* Read an RRef's value through fn "read" on `dst`. */
__attribute__((unused)) static int64_t read_on(int dst, mpr_rref_t *r) {
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_rref(r)), *res = NULL;
    CHECK_OK(mpr_rpc_sync(mpr_to_rank(dst), "read", args, 20, &res));
    int64_t v;
    CHECK_OK(mpr_value_get_int(res, &v));
    mpr_value_release(res);
    mpr_value_release(args);
    return v;
}

#endif
