/* test_rpc_calls.c — rpc_sync/rpc_async between ranks: results, then-chains,
 * self-calls, remote errors, unknown functions, timeouts, tensors, the
 * per-message tensor limits, nested and async-execution chains, the runtime's
 * thread names. Run with 2, 3 and 4 ranks. */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <unistd.h>

#include "mpitest.h"

static int rank, size;
/* Handlers may run before main() has stored rank/size: ask the runtime. */
#define SELF_RANK() mpitest_rank()
#define WORLD() mpr_world_size()

static mpr_err_t fn_add(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t a, b;
    mpr_err_t e;
    if ((e = mpr_args_int(args, 0, &a)) || (e = mpr_args_int(args, 1, &b))) return e;
    *result = mpr_value_new_int(a + b);
    return MPR_OK;
}

static mpr_err_t fn_whoami(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    mpr_worker_info_t self;
    mpr_get_self_worker_info(&self);
    *result = mpr_value_list_of(2, mpr_value_new_string(self.name),
                                mpr_value_new_string(mpr_call_caller(ctx)->name));
    return MPR_OK;
}

static mpr_err_t fn_fail(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    return mpr_error_set(MPR_ERR_INVALID_ARG, "the handler refuses: %s", "bad input 42");
}

static mpr_err_t fn_sleep(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    double s;
    mpr_err_t e = mpr_args_double(args, 0, &s);
    if (e) return e;
    usleep((useconds_t)(s * 1e6));
    *result = mpr_value_new_string("slept");
    return MPR_OK;
}

static mpr_err_t fn_echo(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    *result = mpr_value_retain((mpr_value_t *)args);
    return MPR_OK;
}

/* tensor -> tensor * 2 (f32) */
static mpr_err_t fn_double_tensor(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    mpr_tensor_t *t;
    mpr_err_t e = mpr_args_tensor(args, 0, &t);
    if (e) return e;
    if (mpr_tensor_dtype(t) != MPR_F32) return mpr_error_set(MPR_ERR_DTYPE, "want float32");
    mpr_tensor_t *out = mpr_tensor_empty(MPR_F32, mpr_tensor_ndim(t), mpr_tensor_shape(t));
    const float *src = mpr_tensor_data(t);
    float *dst = mpr_tensor_data(out);
    for (int64_t i = 0; i < mpr_tensor_numel(t); i++) dst[i] = 2 * src[i];
    *result = mpr_value_new_tensor(out);
    mpr_tensor_release(out);
    return MPR_OK;
}

/* Nested: depth d on rank r calls depth d-1 on rank (r+1)%size, sync inside a handler. */
/* The argument list, reversed (its items shared). */
static mpr_err_t fn_reverse(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    mpr_value_t *l = mpr_value_new_list();
    for (size_t i = mpr_value_list_len(args); i-- > 0;)
        mpr_value_list_append(l, mpr_value_retain((mpr_value_t *)mpr_value_list_get(args, i)));
    *result = l;
    return MPR_OK;
}

/* A list of n distinct 0-d u8 tensors. */
static mpr_value_t *many_tensors(int n) {
    mpr_value_t *l = mpr_value_new_list();
    for (int i = 0; i < n; i++) {
        mpr_tensor_t *t = mpr_tensor_empty(MPR_U8, 0, NULL);
        *(uint8_t *)mpr_tensor_data(t) = (uint8_t)i;
        mpr_value_list_append(l, mpr_value_new_tensor(t));
        mpr_tensor_release(t);
    }
    return l;
}

/* (n) -> a list of n tensors */
static mpr_err_t fn_many_tensors(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t n;
    mpr_err_t e = mpr_args_int(args, 0, &n);
    if (e) return e;
    *result = many_tensors((int)n);
    return MPR_OK;
}

static mpr_err_t fn_nested(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t depth;
    mpr_err_t e = mpr_args_int(args, 0, &depth);
    if (e) return e;
    if (depth == 0) {
        *result = mpr_value_new_int(0);
        return MPR_OK;
    }
    mpr_value_t *a = mpr_value_list_of(1, mpr_value_new_int(depth - 1));
    mpr_value_t *r = NULL;
    e = mpr_rpc_sync(mpr_to_rank((SELF_RANK() + 1) % WORLD()), "nested", a, MPR_TIMEOUT_DEFAULT, &r);
    mpr_value_release(a);
    if (e) return e;
    int64_t below;
    e = mpr_value_get_int(r, &below);
    mpr_value_release(r);
    if (e) return e;
    *result = mpr_value_new_int(below + 1);
    return MPR_OK;
}

/* Async execution: depth d forwards to the next rank and returns a future
 * chained with +1, holding no thread while the chain is in flight. */
static mpr_err_t add_one(mpr_future_t *parent, void *unused, mpr_value_t **result) {
    mpr_value_t *v;
    mpr_err_t e = mpr_future_get(parent, 0, &v);
    if (e) return e;
    int64_t i;
    e = mpr_value_get_int(v, &i);
    mpr_value_release(v);
    if (e) return e;
    *result = mpr_value_new_int(i + 1);
    return MPR_OK;
}

static mpr_err_t fn_async_chain(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_future_t **out) {
    int64_t depth;
    mpr_err_t e = mpr_args_int(args, 0, &depth);
    if (e) return e;
    if (depth == 0) {
        *out = mpr_future_create();
        mpr_future_set_result(*out, mpr_value_new_int(0));
        return MPR_OK;
    }
    mpr_value_t *a = mpr_value_list_of(1, mpr_value_new_int(depth - 1));
    mpr_future_t *f = mpr_rpc_async(mpr_to_rank((SELF_RANK() + 1) % WORLD()), "async_chain", a, MPR_TIMEOUT_DEFAULT);
    mpr_value_release(a);
    *out = mpr_future_then(f, add_one, NULL);
    mpr_future_release(f);
    return MPR_OK;
}

/* The runtime's own threads carry OS names (top -H, gdb, perf): one
 * "mpirpc progress", one "mpirpc deadline", one "mpirpc pool N" per worker
 * (1 here); the user's main thread keeps its name. */
static void test_thread_names(void) {
    int progress = 0, timer = 0, pool = 0;
    DIR *d = opendir("/proc/self/task");
    CHECK(d != NULL);
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[300], name[64] = {0};
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue; /* a thread that just exited */
        if (fgets(name, sizeof name, f)) name[strcspn(name, "\n")] = '\0';
        fclose(f);
        progress += strcmp(name, "mpirpc progress") == 0;
        timer += strcmp(name, "mpirpc deadline") == 0;
        pool += strncmp(name, "mpirpc pool ", 12) == 0;
        if (atoi(e->d_name) == getpid()) CHECK(strncmp(name, "mpirpc", 6) != 0);
    }
    closedir(d);
    CHECK(progress == 1);
    CHECK(timer == 1);
    CHECK(pool == 1);
}

static void test_sync_and_names(void) {
    if (rank != 0) return;
    for (int dst = 0; dst < size; dst++) {
        mpr_value_t *args = ints2(40, dst), *r = NULL;
        CHECK_OK(mpr_rpc_sync(mpr_to_rank(dst), "add", args, MPR_TIMEOUT_DEFAULT, &r));
        int64_t sum;
        CHECK_OK(mpr_value_get_int(r, &sum));
        CHECK(sum == 40 + dst);
        mpr_value_release(r);
        mpr_value_release(args);
    }
    /* destinations by name and by worker info */
    mpr_worker_info_t w;
    CHECK_OK(mpr_get_worker_info("worker1", &w));
    CHECK(w.rank == 1);
    mpr_value_t *r = NULL;
    CHECK_OK(mpr_rpc_sync(mpr_to_name("worker1"), "whoami", NULL, 0, &r));
    const char *callee, *caller;
    CHECK_OK(mpr_value_get_string(mpr_value_list_get(r, 0), &callee));
    CHECK_OK(mpr_value_get_string(mpr_value_list_get(r, 1), &caller));
    CHECK(strcmp(callee, "worker1") == 0 && strcmp(caller, "worker0") == 0);
    mpr_value_release(r);
    CHECK_OK(mpr_rpc_sync(mpr_to_worker(&w), "whoami", NULL, 0, &r));
    mpr_value_release(r);
    /* unknown destination */
    CHECK_ERR(mpr_rpc_sync(mpr_to_name("nobody"), "whoami", NULL, 0, &r), MPR_ERR_NOT_FOUND);
    CHECK_ERR(mpr_rpc_sync(mpr_to_rank(size), "whoami", NULL, 0, &r), MPR_ERR_NOT_FOUND);
}

static void test_async_and_then(void) {
    enum { N = 200 };
    mpr_future_t *fs[N];
    for (int i = 0; i < N; i++) {
        mpr_value_t *args = ints2(i, rank);
        mpr_future_t *f = mpr_rpc_async(mpr_to_rank(i % size), "add", args, MPR_TIMEOUT_DEFAULT);
        fs[i] = mpr_future_then(f, add_one, NULL);
        mpr_future_release(f);
        mpr_value_release(args);
    }
    CHECK_OK(mpr_future_wait_all(N, fs, 30));
    for (int i = 0; i < N; i++) {
        mpr_value_t *v;
        CHECK_OK(mpr_future_get(fs[i], 0, &v));
        int64_t x;
        CHECK_OK(mpr_value_get_int(v, &x));
        CHECK(x == i + rank + 1);
        mpr_value_release(v);
        mpr_future_release(fs[i]);
    }
}

static void test_self_call(void) {
    mpr_value_t *args = ints2(1, 2), *r;
    CHECK_OK(mpr_rpc_sync(mpr_to_rank(rank), "add", args, MPR_TIMEOUT_DEFAULT, &r));
    int64_t x;
    CHECK_OK(mpr_value_get_int(r, &x));
    CHECK(x == 3);
    mpr_value_release(r);
    mpr_value_release(args);
    /* tensors to self come back without MPI */
    int64_t shape[1] = {5};
    mpr_tensor_t *t = mpr_tensor_empty(MPR_F32, 1, shape);
    for (int i = 0; i < 5; i++) ((float *)mpr_tensor_data(t))[i] = (float)i;
    args = mpr_value_list_of(1, mpr_value_new_tensor(t));
    CHECK_OK(mpr_rpc_sync(mpr_to_rank(rank), "double_tensor", args, 0, &r));
    mpr_tensor_t *out;
    CHECK_OK(mpr_value_get_tensor(r, &out));
    for (int i = 0; i < 5; i++) CHECK(((float *)mpr_tensor_data(out))[i] == 2.0f * i);
    mpr_value_release(r);
    mpr_value_release(args);
    mpr_tensor_release(t);
}

static void test_remote_error(void) {
    int dst = (SELF_RANK() + 1) % WORLD();
    mpr_value_t *r = NULL;
    CHECK_ERR(mpr_rpc_sync(mpr_to_rank(dst), "fail", NULL, 0, &r), MPR_ERR_REMOTE);
    char expect[64];
    snprintf(expect, sizeof expect, "On worker%d", dst);
    CHECK_CONTAINS(mpr_last_error(), expect);
    CHECK_CONTAINS(mpr_last_error(), "'fail'");
    CHECK_CONTAINS(mpr_last_error(), "the handler refuses: bad input 42");
    CHECK(r == NULL);
    /* unknown function: a remote error naming the function and the worker */
    CHECK_ERR(mpr_rpc_sync(mpr_to_rank(dst), "no_such_fn", NULL, 0, &r), MPR_ERR_UNKNOWN_FUNCTION);
    CHECK_CONTAINS(mpr_last_error(), "no_such_fn");
    CHECK_CONTAINS(mpr_last_error(), expect);
    /* A name with the same 64-bit wire id as a registered function is still
     * unknown: calls resolve by id and name (the pair collides in FNV-1a 64). */
    CHECK_OK(mpr_rpc_sync(mpr_to_rank(dst), "fe8b35413ef19461e", NULL, 0, &r));
    mpr_value_release(r);
    r = NULL;
    CHECK_ERR(mpr_rpc_sync(mpr_to_rank(dst), "ff29a81dc8450be11", NULL, 0, &r), MPR_ERR_UNKNOWN_FUNCTION);
    CHECK_CONTAINS(mpr_last_error(), "'ff29a81dc8450be11'");
    CHECK(r == NULL);
    mpr_rref_t *rr = mpr_remote(mpr_to_rank(dst), "ff29a81dc8450be11", NULL, 0);
    CHECK(rr != NULL);
    CHECK_ERR(mpr_rref_to_here(rr, 10, &r), MPR_ERR_UNKNOWN_FUNCTION);
    CHECK_CONTAINS(mpr_last_error(), "'ff29a81dc8450be11'");
    mpr_rref_release(rr);
    /* handler argument errors surface too */
    mpr_value_t *bad = mpr_value_list_of(1, mpr_value_new_string("x"));
    CHECK_ERR(mpr_rpc_sync(mpr_to_rank(dst), "add", bad, 0, &r), MPR_ERR_REMOTE);
    CHECK_CONTAINS(mpr_last_error(), "argument 0: expected int, got string");
    mpr_value_release(bad);
    /* arguments must be a list */
    mpr_value_t *notlist = mpr_value_new_int(3);
    CHECK_ERR(mpr_rpc_sync(mpr_to_rank(dst), "add", notlist, 0, &r), MPR_ERR_TYPE);
    mpr_value_release(notlist);
}

/* mpr_debug_dump names what the rank waits for: a call to a sleeping peer. */
static void test_debug_dump(void) {
    CHECK_ERR(mpr_debug_dump(NULL), MPR_ERR_INVALID_ARG);
    if (rank != 0) return;
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_double(0.3)), *r = NULL;
    /* Pending from before the send until the reply, which comes after the
     * callee's 0.3 s sleep: the dump, taken at once, sees it (no timing). */
    mpr_future_t *f = mpr_rpc_async(mpr_to_rank(1), "sleep", args, 10);
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    CHECK(out != NULL);
    CHECK_OK(mpr_debug_dump(out));
    fclose(out);
    CHECK_CONTAINS(text, "mpirpc state of rank 0 (worker0, pid ");
    CHECK_CONTAINS(text, "runtime running");
    CHECK_CONTAINS(text, "requests awaiting replies: 1\n");
    CHECK_CONTAINS(text, "awaiting: request ");
    CHECK_CONTAINS(text, " to rank 1, rpc 'sleep', sent ");
    CHECK_CONTAINS(text, "progress thread: ");
    CHECK_CONTAINS(text, "worker pool: ");
    CHECK_CONTAINS(text, "sends in flight: ");
    if (getenv("SHOW_DUMP")) fputs(text, stderr);
    free(text);
    CHECK_OK(mpr_future_get(f, 10, &r));
    mpr_value_release(r);
    mpr_future_release(f);
    mpr_value_release(args);
}

static void test_timeout(void) {
    if (rank != 0) return;
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_double(0.5)), *r = NULL;
    CHECK_ERR(mpr_rpc_sync(mpr_to_rank(1), "sleep", args, 0.05, &r), MPR_ERR_TIMEOUT);
    CHECK_CONTAINS(mpr_last_error(), "timed out");
    CHECK_CONTAINS(mpr_last_error(), "worker1");
    /* No wall-clock check needed: had the timeout not fired before the 0.5 s
     * reply arrived, the call would have succeeded instead. */
    /* the late reply is dropped; the next call still works and gets its own answer */
    mpr_value_t *args2 = ints2(5, 6);
    CHECK_OK(mpr_rpc_sync(mpr_to_rank(1), "add", args2, 5, &r));
    int64_t x;
    CHECK_OK(mpr_value_get_int(r, &x));
    CHECK(x == 11);
    mpr_value_release(r);
    /* a future wait with a timeout leaves the future pending; it still completes */
    mpr_future_t *f = mpr_rpc_async(mpr_to_rank(1), "sleep", args, 0);
    CHECK_ERR(mpr_future_wait(f, 0.02), MPR_ERR_TIMEOUT);
    CHECK(!mpr_future_done(f));
    CHECK_OK(mpr_future_get(f, 10, &r));
    const char *s;
    CHECK_OK(mpr_value_get_string(r, &s));
    CHECK(strcmp(s, "slept") == 0);
    mpr_value_release(r);
    mpr_future_release(f);
    mpr_value_release(args2);
    mpr_value_release(args);
}

static void test_values_roundtrip(void) {
    int dst = (SELF_RANK() + 1) % WORLD();
    int64_t shape[2] = {3, 4};
    mpr_tensor_t *t = mpr_tensor_empty(MPR_F64, 2, shape);
    for (int i = 0; i < 12; i++) ((double *)mpr_tensor_data(t))[i] = i * 0.5;
    mpr_worker_info_t w;
    mpr_get_self_worker_info(&w);
    mpr_value_t *inner = mpr_value_list_of(3, mpr_value_new_bool(true), mpr_value_new_double(-2.5),
                                           mpr_value_new_bytes("\0\1\2", 3));
    mpr_value_t *args = mpr_value_list_of(7, mpr_value_new_none(), mpr_value_new_int(-7),
                                          mpr_value_new_string("héllo"), mpr_value_new_tensor(t),
                                          mpr_value_new_worker(&w), inner, mpr_value_new_tensor(t));
    mpr_value_t *r = NULL;
    CHECK_OK(mpr_rpc_sync(mpr_to_rank(dst), "echo", args, 0, &r));
    CHECK(mpr_value_equal(args, r));
    /* the same tensor named twice arrives as one shared tensor */
    mpr_tensor_t *a, *b;
    CHECK_OK(mpr_value_get_tensor(mpr_value_list_get(r, 3), &a));
    CHECK_OK(mpr_value_get_tensor(mpr_value_list_get(r, 6), &b));
    CHECK(a == b);
    mpr_value_release(r);
    mpr_value_release(args);
    mpr_tensor_release(t);
}

static void test_large_tensor(void) {
    if (rank != 0) return;
    int64_t shape[1] = {4 << 20}; /* 16 MiB of f32 */
    mpr_tensor_t *t = mpr_tensor_empty(MPR_F32, 1, shape);
    float *p = mpr_tensor_data(t);
    for (int64_t i = 0; i < shape[0]; i++) p[i] = (float)(i % 1000);
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_tensor(t)), *r;
    CHECK_OK(mpr_rpc_sync(mpr_to_rank(size - 1), "double_tensor", args, 0, &r));
    mpr_tensor_t *out;
    CHECK_OK(mpr_value_get_tensor(r, &out));
    CHECK(mpr_tensor_numel(out) == shape[0]);
    const float *q = mpr_tensor_data(out);
    for (int64_t i = 0; i < shape[0]; i++) CHECK(q[i] == 2.0f * (float)(i % 1000));
    mpr_value_release(r);
    mpr_value_release(args);
    mpr_tensor_release(t);
}

/* More tensors than one message may carry: a clear error on the side that
 * encodes (arguments: the caller; result: the callee, reported to the caller),
 * and the runtime goes on. 65536 still travel. */
static void test_message_limits(void) {
    if (rank != 0) return;
    int dst = size - 1;
    mpr_value_t *args = many_tensors(65537), *r = NULL;
    CHECK_ERR(mpr_rpc_sync(mpr_to_rank(dst), "echo", args, 30, &r), MPR_ERR_INVALID_ARG);
    CHECK_CONTAINS(mpr_last_error(), "more than 65536 tensors in one message");
    CHECK(r == NULL);
    mpr_value_release(args);
    mpr_value_t *n = mpr_value_list_of(1, mpr_value_new_int(65537));
    CHECK_ERR(mpr_rpc_sync(mpr_to_rank(dst), "many_tensors", n, 30, &r), MPR_ERR_INVALID_ARG);
    CHECK_CONTAINS(mpr_last_error(), "cannot send the result");
    CHECK_CONTAINS(mpr_last_error(), "more than 65536 tensors in one message");
    CHECK(r == NULL);
    mpr_value_release(n);
    n = mpr_value_list_of(1, mpr_value_new_int(65536));
    CHECK_OK(mpr_rpc_sync(mpr_to_rank(dst), "many_tensors", n, 60, &r));
    CHECK(mpr_value_list_len(r) == 65536);
    mpr_tensor_t *last;
    CHECK_OK(mpr_value_get_tensor(mpr_value_list_get(r, 65535), &last));
    CHECK(*(const uint8_t *)mpr_tensor_data(last) == (uint8_t)65535);
    mpr_value_release(r);
    mpr_value_release(n);
}

/* Tensors of every batch shape (mpri_tensor_batches.h) arrive intact: small
 * ones gathered into shared batches (two, past 16 MiB), large ones alone,
 * empty ones, a tensor named twice, mixed dtypes, both ways. */
static void test_tensor_batches(void) {
    if (rank != 0) return;
    int dst = size - 1;
    mpr_value_t *args = mpr_value_new_list();
    int64_t n = 0;
    const int64_t sizes[] = {1, 16384 /* 64 KiB of f32: alone */, 0, 3, 262144 /* 1 MiB */, 5};
    for (int i = 0; i < 6; i++) {
        mpr_tensor_t *t = mpr_tensor_empty(MPR_F32, 1, &sizes[i]);
        float *p = mpr_tensor_data(t);
        for (int64_t j = 0; j < sizes[i]; j++) p[j] = (float)(n++ % 9973) - 0.5f;
        mpr_value_list_append(args, mpr_value_new_tensor(t));
        mpr_tensor_release(t);
    }
    const int64_t small_u8[1] = {60 << 10}; /* 300 of these: 18 MB of small tensors */
    for (int i = 0; i < 300; i++) {
        mpr_tensor_t *t = mpr_tensor_empty(MPR_U8, 1, small_u8);
        uint8_t *p = mpr_tensor_data(t);
        for (int64_t j = 0; j < small_u8[0]; j++) p[j] = (uint8_t)(i * 31 + j);
        mpr_value_list_append(args, mpr_value_new_tensor(t));
        mpr_tensor_release(t);
    }
    const int64_t shape2[2] = {4, 6};
    mpr_tensor_t *m = mpr_tensor_empty(MPR_F64, 2, shape2);
    for (int j = 0; j < 24; j++) ((double *)mpr_tensor_data(m))[j] = j * 0.25;
    mpr_value_list_append(args, mpr_value_new_int(7)); /* not a tensor, between tensors */
    mpr_value_list_append(args, mpr_value_new_tensor(m));
    mpr_value_list_append(args, mpr_value_new_tensor(m)); /* the same tensor again */
    mpr_value_t *r = NULL;
    CHECK_OK(mpr_rpc_sync(mpr_to_rank(dst), "echo", args, 60, &r));
    CHECK(mpr_value_equal(args, r));
    CHECK(mpr_value_list_len(r) == 309);
    mpr_tensor_t *a, *b;
    CHECK_OK(mpr_value_get_tensor(mpr_value_list_get(r, 307), &a));
    CHECK_OK(mpr_value_get_tensor(mpr_value_list_get(r, 308), &b));
    CHECK(a == b);
    mpr_value_release(r);
    /* reversed on the way back: the two directions batch differently, so a
     * misplaced tensor in either cannot be undone by the other */
    CHECK_OK(mpr_rpc_sync(mpr_to_rank(dst), "reverse", args, 60, &r));
    CHECK(mpr_value_list_len(r) == 309);
    for (size_t i = 0; i < 309; i++)
        CHECK(mpr_value_equal(mpr_value_list_get(args, i), mpr_value_list_get(r, 308 - i)));
    mpr_value_release(r);
    mpr_value_release(args);
    mpr_tensor_release(m);
}

/* Batches of small tensors only, through every layout (tensor_batches.c):
 * mixed dtypes whose sizes leave the receiver alignment gaps (an hindexed
 * receive) and f32 ones that lie back to back (one plain receive), sent
 * packed by the caller, echoed straight from the block they were received
 * into, and reversed (the callee packs them apart from their block). Every
 * received tensor is aligned for its dtype. */
static void test_small_tensor_layouts(void) {
    if (rank != 0) return;
    int dst = size - 1;
    static const mpr_dtype_t dts[] = {MPR_U8, MPR_F64, MPR_F32, MPR_I64, MPR_U8, MPR_I32, MPR_F64};
    for (int aligned = 0; aligned < 2; aligned++) {
        mpr_value_t *args = mpr_value_new_list();
        int n = 70;
        for (int i = 0; i < n; i++) {
            int64_t len = aligned ? 16 : 1 + (i * 7) % 13;
            mpr_tensor_t *t = mpr_tensor_empty(aligned ? MPR_F32 : dts[i % 7], 1, &len);
            uint8_t *p = mpr_tensor_data(t);
            for (size_t j = 0; j < mpr_tensor_nbytes(t); j++) p[j] = (uint8_t)(i * 13 + j);
            mpr_value_list_append(args, mpr_value_new_tensor(t));
            mpr_tensor_release(t);
        }
        for (int way = 0; way < 2; way++) {
            mpr_value_t *r = NULL;
            CHECK_OK(mpr_rpc_sync(mpr_to_rank(dst), way ? "reverse" : "echo", args, 60, &r));
            CHECK(mpr_value_list_len(r) == (size_t)n);
            for (int i = 0; i < n; i++) {
                const mpr_value_t *got = mpr_value_list_get(r, way ? (size_t)(n - 1 - i) : (size_t)i);
                CHECK(mpr_value_equal(mpr_value_list_get(args, (size_t)i), got));
                mpr_tensor_t *t;
                CHECK_OK(mpr_value_get_tensor(got, &t));
                CHECK((uintptr_t)mpr_tensor_data(t) % mpr_dtype_size(mpr_tensor_dtype(t)) == 0);
            }
            mpr_value_release(r);
        }
        mpr_value_release(args);
    }
}

static void test_nested_chain(void) {
    if (rank != 0) return;
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_int(100)), *r;
    CHECK_OK(mpr_rpc_sync(mpr_to_rank(1 % size), "nested", args, 60, &r));
    int64_t depth;
    CHECK_OK(mpr_value_get_int(r, &depth));
    CHECK(depth == 100);
    mpr_value_release(r);
    CHECK_OK(mpr_rpc_sync(mpr_to_rank(1 % size), "async_chain", args, 60, &r));
    CHECK_OK(mpr_value_get_int(r, &depth));
    CHECK(depth == 100);
    mpr_value_release(r);
    mpr_value_release(args);
}

int main(int argc, char **argv) {
    CHECK_OK(mpr_register_function("add", fn_add, NULL));
    CHECK_OK(mpr_register_function("whoami", fn_whoami, NULL));
    CHECK_OK(mpr_register_function("fail", fn_fail, NULL));
    CHECK_OK(mpr_register_function("sleep", fn_sleep, NULL));
    CHECK_OK(mpr_register_function("echo", fn_echo, NULL));
    CHECK_OK(mpr_register_function("double_tensor", fn_double_tensor, NULL));
    CHECK_OK(mpr_register_function("nested", fn_nested, NULL));
    CHECK_OK(mpr_register_function("many_tensors", fn_many_tensors, NULL));
    CHECK_OK(mpr_register_function("reverse", fn_reverse, NULL));
    CHECK_OK(mpr_register_async_function("async_chain", fn_async_chain, NULL));
    CHECK_OK(mpr_register_function("fe8b35413ef19461e", fn_whoami, NULL));
    CHECK_ERR(mpr_register_function("add", fn_add, NULL), MPR_ERR_EXISTS);
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = &argc;
    opts.argv = &argv;
    opts.num_worker_threads = 1; /* nested chains must complete even with one worker */
    CHECK_OK(mpr_init(&opts));
    rank = mpr_get_debug_info(&(mpr_debug_info_t){0}) == MPR_OK ? mpitest_rank() : -1;
    size = mpr_world_size();
    CHECK(size >= 2);
    RUN_TEST(test_thread_names);
    RUN_TEST(test_sync_and_names);
    RUN_TEST(test_async_and_then);
    RUN_TEST(test_self_call);
    RUN_TEST(test_remote_error);
    RUN_TEST(test_timeout);
    RUN_TEST(test_debug_dump);
    RUN_TEST(test_values_roundtrip);
    RUN_TEST(test_large_tensor);
    RUN_TEST(test_message_limits);
    RUN_TEST(test_tensor_batches);
    RUN_TEST(test_small_tensor_layouts);
    RUN_TEST(test_nested_chain);
    MPITEST_REPORT();
    CHECK_OK(mpr_shutdown(true));
    mpr_value_t *r = NULL;
    CHECK_ERR(mpr_rpc_sync(mpr_to_rank(0), "add", NULL, 0, &r), MPR_ERR_SHUTDOWN);
    mpr_registry_clear();
    return 0;
}
