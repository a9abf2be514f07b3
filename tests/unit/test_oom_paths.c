/* test_oom_paths.c — every public function that returns a pointer, run while
 * allocations fail: a NULL result must come with the error set
 * (mpr_last_error_code() != MPR_OK, a non-empty message), nothing may crash,
 * and nothing may leak.
 *
 * How: this program interposes the allocator (malloc, calloc, realloc,
 * aligned_alloc, memalign, posix_memalign, valloc, pvalloc; free) for the
 * whole process, libmpirpc and libc's strdup included, forwarding to glibc's
 * __libc_* functions. Allocations fail only on the thread that runs the
 * case and only while it is armed, so the progress thread and the worker
 * pool keep working. Each case (one per function, generated from the public
 * headers by tests/tools/gen_oom_cases.py into oom_cases.inc, with valid
 * fixtures from api_fixtures.h) runs with the Nth allocation failing, for
 * N = 1, 2, ... until a run makes fewer than N allocations: every allocation
 * point of the call fails once. A second pass fails every allocation from the
 * Nth on (persistent out-of-memory). Live blocks are counted process-wide;
 * after each run (fixtures released, the pool idle, caches trimmed) the count
 * must be back where it was (the caches of small blocks are off, so no
 * block waits in a thread's cache). A few hand-written cases go deeper than the
 * generic fixtures reach (an RPC returning a value, remote() to self, an
 * RRef proxy, then-callbacks, .npy and safetensors round trips, a call in
 * a dist autograd context, the gradient made from a number on the wire).
 * MPIRPC_OOM_ONLY=<part of a case's name> runs only those cases;
 * MPIRPC_OOM_WHERE=1 prints the stack of each run's first failed
 * allocation, MPIRPC_OOM_LEAKS=1 where a leaking run's blocks were made.
 *
 * Interposing the allocator conflicts with AddressSanitizer's own: in
 * sanitizer builds (MPIRPC_SANITIZE) the test is compiled without it and
 * exits with 77, which ctest reports as skipped. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>

#include <cmocka.h>

#include "mpirpc/mpirpc.h"

#ifndef MPIRPC_TEST_NO_INTERPOSE

#include "api_fixtures.h"
#include "dist/mpri_grad_wire.h"
#include "mpri_host_alloc.h"
#include "mpri_runtime.h"
#include "mpri_small_alloc.h"

/* ---- the allocator interposer ---- */

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t each);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t align, size_t n);
extern void __libc_free(void *p);

static atomic_long live_blocks;    /* blocks allocated and not freed, all threads */
static _Thread_local bool armed;   /* this thread's allocations may fail */
static _Thread_local long seen;    /* allocations this thread made while armed */
static _Thread_local long fail_at; /* the first one to fail (1-based) */
static _Thread_local bool persistent, injected;

static void print_where(void);

static bool inject(void) {
    if (!armed) return false;
    seen++;
    if (seen == fail_at || (persistent && seen > fail_at)) {
        if (!injected) print_where();
        injected = true;
        return true;
    }
    return false;
}

/* Debugging aid (MPIRPC_OOM_LEAKS=1): remember where each block of the
 * current run was allocated, and print the ones a leaking run left. */
#include <execinfo.h>
#define TRACK_SLOTS (1 << 16)
#define TRACK_DEPTH 8
typedef struct {
    void *p;
    void *where[TRACK_DEPTH];
} track_ent_t;
static track_ent_t *track; /* NULL: not tracking */
static pthread_mutex_t track_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local bool in_track;

static void track_add(void *p) {
    if (!track || in_track || !p) return;
    in_track = true;
    void *where[TRACK_DEPTH + 1];
    int n = backtrace(where, TRACK_DEPTH + 1);
    pthread_mutex_lock(&track_lock);
    for (size_t i = ((uintptr_t)p >> 4) % TRACK_SLOTS, k = 0; k < TRACK_SLOTS; k++, i = (i + 1) % TRACK_SLOTS)
        if (!track[i].p || track[i].p == (void *)1) {
            track[i].p = p;
            memset(track[i].where, 0, sizeof track[i].where);
            for (int j = 1; j < n; j++) track[i].where[j - 1] = where[j];
            break;
        }
    pthread_mutex_unlock(&track_lock);
    in_track = false;
}

static void track_del(void *p) {
    if (!track || !p) return;
    pthread_mutex_lock(&track_lock);
    for (size_t i = ((uintptr_t)p >> 4) % TRACK_SLOTS, k = 0; k < TRACK_SLOTS && track[i].p; k++, i = (i + 1) % TRACK_SLOTS)
        if (track[i].p == p) {
            track[i].p = (void *)1; /* tombstone */
            break;
        }
    pthread_mutex_unlock(&track_lock);
}

static void track_reset(void) {
    if (!track) return;
    pthread_mutex_lock(&track_lock);
    memset(track, 0, TRACK_SLOTS * sizeof *track);
    pthread_mutex_unlock(&track_lock);
}

static void track_print(void) {
    if (!track) return;
    pthread_mutex_lock(&track_lock);
    for (size_t i = 0; i < TRACK_SLOTS; i++)
        if (track[i].p && track[i].p != (void *)1) {
            int n = 0;
            while (n < TRACK_DEPTH && track[i].where[n]) n++;
            fprintf(stderr, "  left: %p from\n", track[i].p);
            backtrace_symbols_fd(track[i].where, n, 2);
        }
    pthread_mutex_unlock(&track_lock);
}

/* Debugging aid (MPIRPC_OOM_WHERE=1): the stack of each run's first failed
 * allocation. */
static void print_where(void) {
    static int on = -1;
    if (on < 0) on = getenv("MPIRPC_OOM_WHERE") != NULL;
    if (!on) return;
    bool was = armed;
    armed = false; /* backtrace_symbols_fd allocates nothing, backtrace may once */
    void *where[16];
    int n = backtrace(where, 16);
    fprintf(stderr, "allocation %ld fails at:\n", seen);
    backtrace_symbols_fd(where, n, 2);
    armed = was;
}

static void *counted(void *p) {
    if (p) atomic_fetch_add_explicit(&live_blocks, 1, memory_order_relaxed);
    track_add(p);
    return p;
}

void *malloc(size_t n) {
    if (inject()) {
        errno = ENOMEM;
        return NULL;
    }
    return counted(__libc_malloc(n));
}

void *calloc(size_t n, size_t each) {
    if (inject()) {
        errno = ENOMEM;
        return NULL;
    }
    return counted(__libc_calloc(n, each));
}

void *realloc(void *p, size_t n) {
    if (!p) return malloc(n);
    if (n == 0) {
        free(p);
        return NULL;
    }
    if (inject()) {
        errno = ENOMEM;
        return NULL;
    }
    void *q = __libc_realloc(p, n);
    if (q) {
        track_del(p);
        track_add(q);
    }
    return q;
}

void free(void *p) {
    if (p) atomic_fetch_sub_explicit(&live_blocks, 1, memory_order_relaxed);
    track_del(p);
    __libc_free(p);
}

void *memalign(size_t align, size_t n) {
    if (inject()) {
        errno = ENOMEM;
        return NULL;
    }
    return counted(__libc_memalign(align, n));
}

void *aligned_alloc(size_t align, size_t n) { return memalign(align, n); }

int posix_memalign(void **out, size_t align, size_t n) {
    void *p = memalign(align, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}

void *valloc(size_t n) { return memalign((size_t)sysconf(_SC_PAGESIZE), n); }

void *pvalloc(size_t n) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return memalign(page, (n + page - 1) / page * page);
}

/* glibc's own strdup/strndup allocate internally, past the interposer. */
char *strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

char *strndup(const char *s, size_t max) {
    size_t n = strnlen(s, max);
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

static void arm(long nth, bool persist) {
    seen = 0;
    fail_at = nth;
    persistent = persist;
    armed = true;
}

static void disarm(void) { armed = false; }

/* ---- the harness ---- */

typedef struct {
    const char *fn;
    int failures;
} oom_case_t;

typedef struct {
    void (*run)(oom_case_t *c);
    const char *fn;
} oom_table_entry_t;

static long run_nth;
static bool run_persistent;

static void oom_fail(oom_case_t *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL %s (allocation %ld%s fails): ", c->fn, run_nth, run_persistent ? " and later" : "");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " [last error %s: '%s']\n", mpr_error_name(mpr_last_error_code()), mpr_last_error());
    va_end(ap);
    c->failures++;
}

static void oom_before_call(void) {
    mpr_error_clear();
    arm(run_nth, run_persistent);
}

/* Right after the call: NULL (unless a documented value) needs the error set. */
static void oom_check_result(oom_case_t *c, bool non_null, bool null_is_value) {
    disarm();
    if (non_null || null_is_value) return;
    if (mpr_last_error_code() == MPR_OK)
        oom_fail(c, "returned NULL without setting an error");
    else if (!mpr_last_error()[0])
        oom_fail(c, "returned NULL with an empty error message");
}

/* A future result: wait for it (the work finishes before the leak check);
 * a failure carries a message. */
static void oom_check_future(oom_case_t *c, mpr_future_t *f) {
    if (!f) return;
    mpr_err_t e = mpr_future_wait(f, 30);
    if (e == MPR_ERR_TIMEOUT) {
        oom_fail(c, "the future did not complete in 30 s");
        return;
    }
    if (mpr_future_error(f) != MPR_OK && !mpr_future_error_message(f)[0])
        oom_fail(c, "the future failed with %s and no message", mpr_error_name(mpr_future_error(f)));
}

/* ---- fixtures beyond api_fixtures.h ---- */

static void *oom_npy_bytes, *oom_safetensors_bytes;
static size_t oom_npy_len, oom_safetensors_len;
static char oom_npy_path[64], oom_safetensors_path[64]; /* the same, as files */
static int oom_object;

static mpr_err_t oom_echo(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    *result = mpr_value_list_of(2, mpr_value_retain((mpr_value_t *)args), mpr_value_new_string("echo"));
    return *result ? MPR_OK : mpr_last_error_code();
}

static void extra_setup(void) {
    assert_int_equal(mpr_tensor_dict_set(fx.d, "t", fx.t), MPR_OK);
    assert_int_equal(mpr_tensor_dict_set_meta(fx.d, "k", "v"), MPR_OK);
}

static void setup_bytes(void) {
    fx_setup(true);
    extra_setup();
    assert_int_equal(mpr_tensor_npy_encode(fx.t, &oom_npy_bytes, &oom_npy_len), MPR_OK);
    assert_int_equal(mpr_safetensors_encode(fx.d, &oom_safetensors_bytes, &oom_safetensors_len), MPR_OK);
    snprintf(oom_npy_path, sizeof oom_npy_path, "/tmp/mpirpc_oom_%d.npy", (int)getpid());
    snprintf(oom_safetensors_path, sizeof oom_safetensors_path, "/tmp/mpirpc_oom_%d.safetensors", (int)getpid());
    assert_int_equal(mpr_tensor_save_npy(fx.t, oom_npy_path), MPR_OK);
    assert_int_equal(mpr_safetensors_save(fx.d, oom_safetensors_path), MPR_OK);
    fx_teardown();
}

/* Everything the runtime has in flight is finished, caches are empty; a
 * block the pool or the progress thread frees just after may take a moment:
 * wait (at most 1 s) for the count to come back to `expect`. */
static long settle(long expect) {
    for (int i = 0; i < 10000; i++) {
        mpr_debug_info_t d;
        assert_int_equal(mpr_get_debug_info(&d), MPR_OK);
        /* RRef control messages (deletes of the fixtures' remote objects,
         * their acks) and dist autograd cleanups run after the case too. */
        if (d.pending_requests == 0 && d.pool_busy == 0 && d.progress_busy == 0 && d.rref_unacked_ctrl_msgs == 0 &&
            d.rref_pending_users == 0 && d.rref_pending_children == 0 && d.dist_contexts == 0)
            break;
        usleep(1000);
    }
    mpri_host_cache_trim();
    mpri_pending_cache_trim(); /* entries kept for reuse: more calls were in flight at once than before */
    /* This thread's spare message buffer (transport.c) is kept filled, so
     * whether a run ended with it taken or given back does not count. */
    mpri_outmsg_t m;
    mpri_outmsg_init(&m, MPRI_MSG_CALL);
    mpri_outmsg_fini(&m);
    /* Buffers kept for any thread (sends completed on another thread than
     * their sender's) come and go with the sends: none kept when counting. */
    mpri_transport_cache_trim();
    long now = atomic_load(&live_blocks);
    for (int i = 0; expect >= 0 && i < 1000 && now != expect; i++) {
        usleep(1000);
        mpri_host_cache_trim();
        mpri_transport_cache_trim();
        now = atomic_load(&live_blocks);
    }
    return now;
}

#include "oom_cases.inc"

/* ---- hand-written cases: deeper paths than the generic fixtures reach ---- */

static mpr_err_t then_add_one(mpr_future_t *parent, void *user_data, mpr_value_t **result) {
    mpr_value_t *v = NULL;
    mpr_err_t e = mpr_future_get(parent, 0, &v);
    if (e) return e;
    *result = mpr_value_list_of(2, v, mpr_value_new_int(1));
    return *result ? MPR_OK : mpr_last_error_code();
}

/* An RPC to self whose handler builds a result; its value read back. */
static void case_rpc_roundtrip(oom_case_t *c) {
    oom_before_call();
    mpr_value_t *args = mpr_value_pack("[lsd]t", (int64_t)1, "two", 3.0, fx.t);
    mpr_future_t *f = args ? mpr_rpc_async(mpr_to_rank(0), "oom_echo", args, 30) : NULL;
    oom_check_result(c, args && f, false);
    oom_check_future(c, f);
    mpr_value_release(args);
    mpr_future_release(f);
}

/* remote() to self, then a proxy call through the RRef and a fetch. */
static void case_remote_proxy(oom_case_t *c) {
    oom_before_call();
    mpr_rref_t *r = mpr_remote(mpr_to_rank(0), "oom_echo", fx.v, 30);
    oom_check_result(c, r != NULL, false);
    if (!r) return;
    oom_before_call();
    mpr_future_t *f = mpr_rref_rpc_async(r, "oom_echo", NULL, 30);
    oom_check_result(c, f != NULL, false);
    oom_check_future(c, f);
    mpr_future_release(f);
    oom_before_call();
    mpr_rref_t *r2 = mpr_rref_remote(r, "oom_echo", NULL, 30);
    oom_check_result(c, r2 != NULL, false);
    disarm();
    mpr_value_t *v = NULL;
    if (r2) mpr_rref_to_here(r2, 30, &v); /* the creation finished before the check */
    mpr_value_release(v);
    mpr_rref_release(r2);
    mpr_rref_release(r);
}

/* A then-chain on a completed and on a pending future. */
static void case_then(oom_case_t *c) {
    disarm();
    mpr_future_t *done = mpr_future_create(), *later = mpr_future_create();
    assert_non_null(done);
    assert_non_null(later);
    assert_int_equal(mpr_future_set_result(done, mpr_value_new_int(1)), MPR_OK);
    oom_before_call();
    mpr_future_t *a = mpr_future_then(done, then_add_one, NULL);
    oom_check_result(c, a != NULL, false);
    oom_before_call();
    mpr_future_t *b = mpr_future_then(later, then_add_one, NULL);
    oom_check_result(c, b != NULL, false);
    mpr_future_set_result(later, mpr_value_new_int(2));
    oom_check_future(c, a);
    oom_check_future(c, b);
    mpr_future_release(a);
    mpr_future_release(b);
    mpr_future_release(done);
    mpr_future_release(later);
}

/* Tensor ops with autograd recording, and a backward pass. */
static void case_autograd(oom_case_t *c) {
    disarm();
    mpr_tensor_t *x = mpr_ones(MPR_F32, 2, fx.shape);
    assert_non_null(x);
    mpr_set_requires_grad(x, true);
    oom_before_call();
    mpr_tensor_t *y = mpr_mul(x, x);
    mpr_tensor_t *z = y ? mpr_sum(y) : NULL;
    oom_check_result(c, y && z, false);
    if (z) {
        oom_before_call();
        mpr_err_t e = mpr_backward(z, NULL, false);
        disarm();
        if (e != MPR_OK && (mpr_last_error_code() != e || !mpr_last_error()[0]))
            oom_fail(c, "mpr_backward returned %s without that error set", mpr_error_name(e));
    }
    mpr_tensor_release(z);
    mpr_tensor_release(y);
    mpr_tensor_release(x);
}

/* A call to self inside a dist autograd context: the caller records a recv
 * function for the result on this thread, where allocations fail. Either
 * the call fails with its error, or the result comes with its gradient path
 * (a result without it would make a later backward "succeed" without these
 * gradients). */
static void case_dist_call(oom_case_t *c) {
    disarm();
    mpr_tensor_t *x = mpr_ones(MPR_F32, 2, fx.shape);
    assert_non_null(x);
    assert_int_equal(mpr_set_requires_grad(x, true), MPR_OK);
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_tensor(x)), *r = NULL;
    assert_non_null(args);
    int64_t ctx = 0;
    assert_int_equal(mpr_dist_context_begin(&ctx), MPR_OK);
    oom_before_call();
    mpr_err_t e = mpr_rpc_sync(mpr_to_rank(0), "oom_echo", args, 30, &r);
    disarm();
    if (e != MPR_OK && (mpr_last_error_code() != e || !mpr_last_error()[0]))
        oom_fail(c, "mpr_rpc_sync returned %s without that error set", mpr_error_name(e));
    if (e == MPR_OK) { /* [[x], "echo"]: the x that came back */
        mpr_tensor_t *y = NULL;
        assert_int_equal(mpr_value_get_tensor(mpr_value_list_get(mpr_value_list_get(r, 0), 0), &y), MPR_OK);
        if (!mpr_grad_fn_name(y) || strcmp(mpr_grad_fn_name(y), "RecvRpcBackward") != 0)
            oom_fail(c, "the result came back without its recv function (grad_fn %s)",
                     mpr_grad_fn_name(y) ? mpr_grad_fn_name(y) : "none");
    }
    mpr_value_release(r);
    assert_int_equal(mpr_dist_context_end(ctx), MPR_OK);
    mpr_value_release(args);
    mpr_tensor_release(x);
}

/* The gradient dist backward makes from a number that came on the wire (a
 * broadcast one-element tensor): NULL only with the error set, never read as
 * "no gradient". */
static void case_grad_filled(oom_case_t *c) {
    oom_before_call();
    mpr_tensor_t *g = mpri_grad_filled(-1, MPR_F32, 2, fx.shape, (const int64_t[]){0, 0}, 1.0);
    oom_check_result(c, g != NULL, false);
    mpr_tensor_release(g);
}

static const oom_table_entry_t oom_extra_cases[] = {
    {case_rpc_roundtrip, "rpc_async round trip"},
    {case_remote_proxy, "remote + rref proxy"},
    {case_then, "future_then"},
    {case_autograd, "ops with autograd + backward"},
    {case_dist_call, "dist autograd call to self"},
    {case_grad_filled, "mpri_grad_filled"},
};

/* Run one case under every failure point; returns its failures. */
static int run_case(const oom_table_entry_t *e, bool persist, long *points) {
    oom_case_t c = {e->fn, 0};
    const char *only = getenv("MPIRPC_OOM_ONLY"); /* debugging: the cases whose name contains it */
    if (only && !strstr(e->fn, only)) return 0;
    run_persistent = persist;
    /* Once without failures: lazily made state (registries, pools, thread
     * buffers) is made here, not counted as a leak below. */
    run_nth = 0;
    fx_setup(true);
    extra_setup();
    if (getenv("MPIRPC_OOM_TRACE")) fprintf(stderr, "case %s%s\n", e->fn, persist ? " (persistent)" : "");
    e->run(&c);
    fx_teardown();
    settle(-1);
    for (long n = 1; n < 100000; n++) {
        long before = atomic_load(&live_blocks);
        mpr_debug_info_t d0, d1;
        mpr_get_debug_info(&d0);
        track_reset();
        run_nth = n;
        injected = false;
        fx_setup(true);
        extra_setup();
        e->run(&c);
        bool hit = injected;
        disarm();
        fx_teardown();
        long after = settle(before);
        mpr_get_debug_info(&d1);
        if (after != before && track) /* MPIRPC_OOM_LEAKS: which kind of object stayed */
            fprintf(stderr, "  owners %ld->%ld users %ld->%ld tensors %ld->%ld nodes %ld->%ld\n", d0.rref_owners,
                    d1.rref_owners, d0.rref_users, d1.rref_users, d0.tensors, d1.tensors, d0.autograd_nodes,
                    d1.autograd_nodes);
        if (after != before) {
            oom_fail(&c, "%ld block(s) leaked", after - before);
            track_print();
            if (c.failures > 20) break;
        }
        if (!hit) { /* the call made fewer than n allocations: every point was tried */
            *points += n - 1;
            break;
        }
    }
    if (getenv("MPIRPC_OOM_TRACE")) fprintf(stderr, "%s: %d failures\n", e->fn, c.failures);
    return c.failures;
}

static int run_all(bool persist) {
    int failures = 0;
    long points = 0;
    for (size_t i = 0; i < OOM_CASE_COUNT; i++) failures += run_case(&oom_cases[i], persist, &points);
    for (size_t i = 0; i < sizeof oom_extra_cases / sizeof oom_extra_cases[0]; i++)
        failures += run_case(&oom_extra_cases[i], persist, &points);
    printf("%s out-of-memory: %d cases (+%zu hand-written), %ld allocation points, %d failures\n",
           persist ? "persistent" : "one-shot", OOM_CASE_COUNT,
           sizeof oom_extra_cases / sizeof oom_extra_cases[0], points, failures);
    return failures;
}

static int group_setup(void **state) {
    if (getenv("MPIRPC_OOM_LEAKS")) {
        void *warm[2];
        backtrace(warm, 2); /* loads what backtrace needs before tracking starts */
        track = __libc_calloc(TRACK_SLOTS, sizeof *track);
    }
    /* Every allocation point reaches the allocator, and no block waits in a
     * thread's cache of small blocks when live blocks are counted. */
    mpri_small_cache_disable();
    /* One pool worker: state a thread makes once for its life (its autograd
     * scope stack, when a piece of a dist backward first runs there) is made
     * by each case's first, uncounted run, not by whichever of several
     * workers a later run happens to land on. */
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.num_worker_threads = 1;
    if (mpr_init(&opts) != MPR_OK) return -1;
    /* With a GPU, the CUDA runtime allocates and frees blocks of its own at
     * its first use (the first device lookup): make it before counting. */
    mpr_tensor_release(mpr_tensor_empty_on(mpr_cuda_device_count(), MPR_F32, 1, (const int64_t[]){1}));
    if (mpr_register_function("oom_echo", oom_echo, NULL) != MPR_OK) return -1;
    setup_bytes();
    /* Fill the RRef layer's use-after-release ring, so a released handle
     * frees an older one from here on (the block count stays level). */
    mpr_value_t *v = mpr_value_new_int(1);
    for (int i = 0; i < 1100; i++) mpr_rref_release(mpr_rref_create_local(v));
    mpr_value_release(v);
    return 0;
}

static int group_teardown(void **state) {
    free(oom_npy_bytes);
    free(oom_safetensors_bytes);
    unlink(oom_npy_path);
    unlink(oom_safetensors_path);
    return mpr_shutdown(true) == MPR_OK ? 0 : -1;
}

static void test_the_interposer_fails_allocations(void **state) {
    run_nth = 1;
    run_persistent = false;
    void *(*volatile alloc)(size_t) = malloc; /* calls the compiler cannot drop or fold */
    char *(*volatile dup)(const char *) = strdup;
    oom_before_call();
    void *p = alloc(16);
    char *s = dup("x"); /* libc's own allocations go through it too */
    disarm();
    assert_null(p);
    assert_non_null(s);
    free(s);
    oom_before_call();
    s = dup("x");
    disarm();
    assert_null(s);
    long before = atomic_load(&live_blocks);
    p = alloc(8);
    assert_int_equal(atomic_load(&live_blocks), before + 1);
    free(p);
    assert_int_equal(atomic_load(&live_blocks), before);
}

static void test_table_covers_the_headers(void **state) {
    printf("%d pointer-returning public functions (%d skipped: they need a handler's context or a va_list)\n",
           OOM_CASE_COUNT, OOM_SKIPPED_COUNT);
    assert_true(OOM_CASE_COUNT > 140);
}

static void test_one_allocation_fails(void **state) { assert_int_equal(run_all(false), 0); }

static void test_allocations_keep_failing(void **state) { assert_int_equal(run_all(true), 0); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_interposer_fails_allocations),
        cmocka_unit_test(test_table_covers_the_headers),
        cmocka_unit_test(test_one_allocation_fails),
        cmocka_unit_test(test_allocations_keep_failing),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

#else /* sanitizer build: the interposer would fight AddressSanitizer's allocator */

int main(void) {
    printf("test_oom_paths: skipped in sanitizer builds (it replaces the allocator)\n");
    return 77;
}

#endif
