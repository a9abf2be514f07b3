/* test_dist_autograd.c — distributed autograd (mpirpc/dist_autograd.h),
 * PyTorch's dist_autograd_test.py scenarios in spirit. Every gradient is
 * compared with the same computation done locally with mpr_backward on one
 * rank (f64, 1e-6 relative). Runs with 3 ranks (the chains need three); the
 * leak loop runs `leak_steps` training steps (argv[1], default 10000).
 *
 * Scenarios: a simple graph over 2 ranks; nested chains A->B->C->A; the same
 * parameter used twice across ranks; remote() results consumed through
 * RRefs elsewhere and RRef.backward; tensors that do not require grad mixed
 * in; several roots; an async function whose then-callback extends the
 * graph; retain_graph twice; two concurrent contexts over
 * shared parameters; several threads sending in one context; an error in backward on a remote rank; cleanup on
 * every rank (counted); the leak loop; use after end; replies outliving
 * their context; requires_grad on the wire (self and remote). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "mpitest.h"
#include "mpri_autograd.h"

static int me, n_ranks;

/* ---- tensors ---- */

static mpr_tensor_t *filled(int64_t r, int64_t c, double seed, bool requires_grad) {
    int64_t shape[2] = {r, c};
    mpr_tensor_t *t = mpr_tensor_empty(MPR_F64, 2, shape);
    double *d = mpr_tensor_data(t);
    for (int64_t i = 0; i < r * c; i++) d[i] = sin(seed + 0.37 * (double)i);
    if (requires_grad) CHECK_OK(mpr_set_requires_grad(t, true));
    return t;
}

static void check_close(const mpr_tensor_t *got, const mpr_tensor_t *want, const char *what) {
    if (!got || !want) {
        fprintf(stderr, "[rank %d] %s: gradient %s missing\n", me, what, got ? "expected" : "computed");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    CHECK(mpr_tensor_numel(got) == mpr_tensor_numel(want));
    const double *a = mpr_tensor_data((mpr_tensor_t *)got), *b = mpr_tensor_data((mpr_tensor_t *)want);
    for (int64_t i = 0; i < mpr_tensor_numel(got); i++)
        if (fabs(a[i] - b[i]) > 1e-6 * fmax(1.0, fabs(b[i]))) {
            fprintf(stderr, "[rank %d] %s: element %lld: %.17g vs local %.17g\n", me, what, (long long)i, a[i], b[i]);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
}

/* The gradient of `t` in context `ctx` (new reference; CHECKed present). */
static mpr_tensor_t *ctx_grad(int64_t ctx, const mpr_tensor_t *t) {
    mpr_tensor_t *g = NULL;
    CHECK_OK(mpr_dist_get_gradient(ctx, t, &g));
    CHECK(g != NULL);
    return g;
}

static mpr_tensor_t *call_tensor(int rank, const char *fn, mpr_value_t *args) {
    mpr_value_t *r = NULL;
    CHECK_OK(mpr_rpc_sync_take(mpr_to_rank(rank), fn, args, 60, &r));
    mpr_tensor_t *t = NULL;
    CHECK_OK(mpr_value_get_tensor(r, &t));
    mpr_tensor_retain(t);
    mpr_value_release(r);
    return t;
}

static mpr_value_t *tensors2(mpr_tensor_t *a, mpr_tensor_t *b) {
    return mpr_value_list_of(2, mpr_value_new_tensor(a), mpr_value_new_tensor(b));
}

/* ---- functions the ranks serve ---- */

static mpr_err_t fn_mm(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    mpr_tensor_t *a, *b;
    mpr_err_t e;
    if ((e = mpr_args_tensor(args, 0, &a)) || (e = mpr_args_tensor(args, 1, &b))) return e;
    mpr_tensor_t *y = mpr_matmul(a, b);
    if (!y) return mpr_last_error_code();
    *result = mpr_value_new_tensor(y);
    mpr_tensor_release(y);
    return MPR_OK;
}

/* [x] -> x * 3 on the rank it runs. */
static mpr_err_t fn_triple(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    mpr_tensor_t *x;
    mpr_err_t e = mpr_args_tensor(args, 0, &x);
    if (e) return e;
    mpr_tensor_t *y = mpr_mul_scalar(x, 3.0);
    *result = mpr_value_new_tensor(y);
    mpr_tensor_release(y);
    return MPR_OK;
}

/* Chain [x, hops...]: h = tanh(x) (first hop) or h*h (later), then the next
 * hop with h, or h itself at the end. Runs inside the caller's context, so
 * its own call extends the same graph. */
static mpr_err_t fn_chain(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    mpr_tensor_t *x;
    mpr_err_t e = mpr_args_tensor(args, 0, &x);
    if (e) return e;
    if (!mpr_dist_context_current()) return mpr_error_set(MPR_ERR_STATE, "chain runs without a context");
    size_t n = mpr_value_list_len(args);
    mpr_tensor_t *h = n == 3 ? mpr_tanh(x) : mpr_mul(x, x);
    if (n == 2) { /* last hop: back to the caller's rank through triple */
        int64_t next;
        CHECK_OK(mpr_args_int(args, 1, &next));
        mpr_tensor_t *r = call_tensor((int)next, "triple", mpr_value_list_of(1, mpr_value_new_tensor(h)));
        mpr_tensor_release(h);
        h = r;
    } else {
        int64_t next;
        CHECK_OK(mpr_args_int(args, 1, &next));
        mpr_value_t *rest = mpr_value_list_of(2, mpr_value_new_tensor(h), mpr_value_retain(mpr_value_list_get(args, 2)));
        mpr_tensor_t *r = call_tensor((int)next, "chain", rest);
        mpr_tensor_release(h);
        h = r;
    }
    *result = mpr_value_new_tensor(h);
    mpr_tensor_release(h);
    return MPR_OK;
}

/* A backward function that fails (on the rank it runs). */
static mpr_err_t failing_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    (void)n;
    (void)gout;
    (void)gin;
    return mpr_error_set(MPR_ERR_SHAPE, "injected backward failure");
}
static const mpri_op_def_t failing_def = {.name = "FailingBackward", .backward = failing_backward};

/* [x] -> y = x*2 whose backward fails. */
static mpr_err_t fn_fail_in_backward(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    mpr_tensor_t *x;
    mpr_err_t e = mpr_args_tensor(args, 0, &x);
    if (e) return e;
    mpr_tensor_t *y = mpr_mul_scalar(x, 2.0);
    mpri_node_t *n = mpri_record(&failing_def, 1, &x, y); /* replaces mul's grad_fn */
    CHECK(n != NULL);
    *result = mpr_value_new_tensor(y);
    mpr_tensor_release(y);
    return MPR_OK;
}

/* mm that first waits until its worker's main thread opens a gate
 * (test_reply_outlives_context). */
static atomic_bool mm_gate_open;

static mpr_err_t fn_gated_mm(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    while (!atomic_load(&mm_gate_open)) usleep(1000);
    return fn_mm(ctx, args, result);
}

static mpr_err_t fn_requires_grad(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    mpr_tensor_t *x;
    mpr_err_t e = mpr_args_tensor(args, 0, &x);
    if (e) return e;
    *result = mpr_value_new_bool(mpr_requires_grad(x));
    return MPR_OK;
}

static mpr_err_t fn_ctx_exists(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    int64_t id;
    mpr_err_t e = mpr_args_int(args, 0, &id);
    if (e) return e;
    *result = mpr_value_new_bool(mpr_dist_context_exists(id));
    return MPR_OK;
}

/* [rref] -> sum(to_here(rref) * 2): consumes a remote() result elsewhere. */
static mpr_err_t fn_rref_double_sum(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    mpr_rref_t *rr;
    mpr_err_t e = mpr_args_rref(args, 0, &rr);
    if (e) return e;
    mpr_value_t *v = NULL;
    if ((e = mpr_rref_to_here(rr, 60, &v))) return e;
    mpr_tensor_t *t;
    CHECK_OK(mpr_value_get_tensor(v, &t));
    mpr_tensor_t *d = mpr_mul_scalar(t, 2.0);
    mpr_tensor_t *s = mpr_sum(d);
    *result = mpr_value_new_tensor(s);
    mpr_tensor_release(d);
    mpr_tensor_release(s);
    mpr_value_release(v);
    return MPR_OK;
}

/* Async function on rank 1: mm on rank 2, then (in a then-callback, on
 * another thread, later) triple on rank 0 — the callback must extend the
 * same graph. */
static mpr_err_t then_triple(mpr_future_t *parent, void *user_data, mpr_value_t **result) {
    (void)user_data;
    mpr_value_t *v = NULL;
    mpr_err_t e = mpr_future_get(parent, 0, &v);
    if (e) return e;
    mpr_tensor_t *y;
    CHECK_OK(mpr_value_get_tensor(v, &y));
    if (!mpr_dist_context_current()) return mpr_error_set(MPR_ERR_STATE, "then-callback runs without the context");
    e = mpr_rpc_sync_take(mpr_to_rank(0), "triple", mpr_value_list_of(1, mpr_value_new_tensor(y)), 60, result);
    mpr_value_release(v);
    return e;
}

static mpr_err_t fn_async_chain(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_future_t **out) {
    (void)ctx;
    mpr_tensor_t *x;
    mpr_err_t e = mpr_args_tensor(args, 0, &x);
    if (e) return e;
    mpr_value_t *args2 = tensors2(x, x);
    mpr_future_t *f = mpr_rpc_async(mpr_to_rank(2), "mm", args2, 60);
    mpr_value_release(args2);
    *out = mpr_future_then(f, then_triple, NULL);
    mpr_future_release(f);
    return *out ? MPR_OK : mpr_last_error_code();
}

/* ---- scenarios ---- */

static void test_async_function_keeps_context(void) {
    if (me != 0) return;
    mpr_tensor_t *x = filled(3, 3, 0.45, true);
    int64_t ctx;
    CHECK_OK(mpr_dist_context_begin(&ctx));
    mpr_scope_begin();
    mpr_tensor_t *z = call_tensor(1, "async_chain", mpr_value_list_of(1, mpr_value_new_tensor(x)));
    mpr_tensor_t *loss = mpr_sum(mpr_mul(z, z));
    CHECK_OK(mpr_dist_backward(ctx, &loss, 1, false));
    mpr_tensor_release(z);
    mpr_scope_end();
    mpr_tensor_t *g = ctx_grad(ctx, x);
    mpr_scope_begin();
    mpr_tensor_t *zz = mpr_mul_scalar(mpr_matmul(x, x), 3.0);
    CHECK_OK(mpr_backward(mpr_sum(mpr_mul(zz, zz)), NULL, false));
    mpr_scope_end();
    check_close(g, mpr_tensor_grad(x), "async function + then-callback dL/dx");
    mpr_tensor_release(g);
    CHECK_OK(mpr_dist_context_end(ctx));
    mpr_tensor_release(x);
}


/* y = mm(w, x) on rank 1; loss = sum(tanh(y)); dL/dw vs local. */
static void test_simple(void) {
    if (me != 0) return;
    mpr_tensor_t *w = filled(4, 3, 0.1, true), *x = filled(3, 5, 0.7, false);
    int64_t ctx;
    CHECK_OK(mpr_dist_context_begin(&ctx));
    CHECK(ctx != 0 && (ctx >> 48) == me && mpr_dist_context_current() == ctx);
    mpr_scope_begin();
    mpr_tensor_t *y = call_tensor(1, "mm", tensors2(w, x));
    CHECK(mpr_requires_grad(y));
    mpr_tensor_t *loss = mpr_sum(mpr_tanh(y));
    CHECK_OK(mpr_dist_backward(ctx, &loss, 1, false));
    mpr_tensor_release(y);
    mpr_scope_end();
    CHECK(mpr_tensor_grad(w) == NULL); /* never in .grad */
    mpr_tensor_t *g = ctx_grad(ctx, w);
    mpr_tensor_t *none = NULL;
    CHECK_OK(mpr_dist_get_gradient(ctx, x, &none));
    CHECK(none == NULL); /* x does not require grad */
    /* the same locally */
    mpr_scope_begin();
    mpr_tensor_t *ll = mpr_sum(mpr_tanh(mpr_matmul(w, x)));
    CHECK_OK(mpr_backward(ll, NULL, false));
    mpr_scope_end();
    check_close(g, mpr_tensor_grad(w), "simple dL/dw");
    mpr_tensor_release(g);
    CHECK_OK(mpr_dist_context_end(ctx));
    CHECK(mpr_dist_context_current() == 0);
    mpr_tensor_release(w);
    mpr_tensor_release(x);
}

/* Broadcast gradients on the wire (backward.c): mean's, whose every dim is
 * stride 0 (one value, sent as a double), and a sum over dim 0's, stride 0
 * in one dim only (sent as [tensor, sizes]); each reaches its own recv
 * function, and the gradient of w equals the local one. The root also keeps
 * the decoded gradient of w without a copy: it must not alias anything the
 * next pass writes (a second context over the same w gets the same value). */
static void test_broadcast_gradients(void) {
    if (me != 0) return;
    mpr_tensor_t *w = filled(4, 3, 0.3, true), *x = filled(3, 5, 0.9, false), *c = filled(1, 5, 1.7, false);
    mpr_tensor_t *g[2];
    for (int round = 0; round < 2; round++) {
        int64_t ctx;
        CHECK_OK(mpr_dist_context_begin(&ctx));
        mpr_scope_begin();
        mpr_tensor_t *y1 = call_tensor(1, "mm", tensors2(w, x)), *y2 = call_tensor(2, "mm", tensors2(w, x));
        int dim0 = 0;
        mpr_tensor_t *roots[2] = {mpr_mean(y1), mpr_sum(mpr_mul(mpr_sum_dims(y2, 1, &dim0, true), c))};
        CHECK_OK(mpr_dist_backward(ctx, roots, 2, false));
        mpr_tensor_release(y1);
        mpr_tensor_release(y2);
        mpr_scope_end();
        g[round] = ctx_grad(ctx, w);
        CHECK_OK(mpr_dist_context_end(ctx));
    }
    mpr_scope_begin();
    mpr_tensor_t *l1 = mpr_mean(mpr_matmul(w, x));
    int dim0 = 0;
    mpr_tensor_t *l2 = mpr_sum(mpr_mul(mpr_sum_dims(mpr_matmul(w, x), 1, &dim0, true), c));
    CHECK_OK(mpr_backward(mpr_add(l1, l2), NULL, false));
    mpr_scope_end();
    check_close(g[0], mpr_tensor_grad(w), "broadcast gradients dL/dw");
    check_close(g[1], mpr_tensor_grad(w), "broadcast gradients dL/dw (second context)");
    mpr_tensor_release(g[0]);
    mpr_tensor_release(g[1]);
    mpr_tensor_release(w);
    mpr_tensor_release(x);
    mpr_tensor_release(c);
}

/* The same graph through a call to self: recorded like any other. */
static void test_call_to_self(void) {
    mpr_tensor_t *w = filled(3, 3, 0.25 + me, true), *x = filled(3, 3, 0.5, false);
    int64_t ctx;
    CHECK_OK(mpr_dist_context_begin(&ctx));
    mpr_scope_begin();
    mpr_tensor_t *y = call_tensor(me, "mm", tensors2(w, x));
    CHECK(y != w && mpr_requires_grad(y));
    CHECK_OK(mpr_dist_backward(ctx, (mpr_tensor_t *[]){mpr_sum(mpr_mul(y, y))}, 1, false));
    mpr_tensor_release(y);
    mpr_scope_end();
    mpr_tensor_t *g = ctx_grad(ctx, w);
    mpr_scope_begin();
    mpr_tensor_t *yy = mpr_matmul(w, x);
    CHECK_OK(mpr_backward(mpr_sum(mpr_mul(yy, yy)), NULL, false));
    mpr_scope_end();
    check_close(g, mpr_tensor_grad(w), "call to self dL/dw");
    mpr_tensor_release(g);
    CHECK_OK(mpr_dist_context_end(ctx));
    mpr_tensor_release(w);
    mpr_tensor_release(x);
}

/* rank0 -> chain on 1 (tanh) -> chain on 2 (square) -> triple on 0: A->B->C->A. */
static void test_nested_chain(void) {
    if (me != 0) return;
    mpr_tensor_t *x = filled(3, 3, 1.3, true);
    int64_t ctx;
    CHECK_OK(mpr_dist_context_begin(&ctx));
    mpr_scope_begin();
    /* chain args are [x, next, rest...]: rank 1 gets [x, 2, 0] */
    mpr_tensor_t *y = call_tensor(1, "chain", mpr_value_list_of(3, mpr_value_new_tensor(x), mpr_value_new_int(2),
                                                               mpr_value_new_int(0)));
    mpr_tensor_t *loss = mpr_sum(mpr_mul(y, y));
    CHECK_OK(mpr_dist_backward(ctx, &loss, 1, false));
    mpr_tensor_release(y);
    mpr_scope_end();
    mpr_tensor_t *g = ctx_grad(ctx, x);
    mpr_scope_begin();
    mpr_tensor_t *h = mpr_tanh(x);
    mpr_tensor_t *yy = mpr_mul_scalar(mpr_mul(h, h), 3.0);
    CHECK_OK(mpr_backward(mpr_sum(mpr_mul(yy, yy)), NULL, false));
    mpr_scope_end();
    check_close(g, mpr_tensor_grad(x), "chain A->B->C->A dL/dx");
    mpr_tensor_release(g);
    CHECK_OK(mpr_dist_context_end(ctx));
    mpr_tensor_release(x);
}

/* w goes to rank 1 and rank 2; c (no grad) mixed in; two roots. */
static void test_param_twice_mixed_two_roots(void) {
    if (me != 0) return;
    mpr_tensor_t *w = filled(3, 3, 0.2, true), *x1 = filled(3, 2, 0.4, false), *x2 = filled(3, 3, 0.9, true);
    int64_t ctx;
    CHECK_OK(mpr_dist_context_begin(&ctx));
    mpr_scope_begin();
    mpr_tensor_t *y1 = call_tensor(1, "mm", tensors2(w, x1));
    mpr_tensor_t *y2 = call_tensor(2, "mm", tensors2(w, x2));
    mpr_tensor_t *roots[2] = {mpr_sum(mpr_tanh(y1)), mpr_sum(mpr_mul(y2, w))};
    CHECK_OK(mpr_dist_backward(ctx, roots, 2, false));
    mpr_tensor_release(y1);
    mpr_tensor_release(y2);
    mpr_scope_end();
    mpr_tensor_t *gw = ctx_grad(ctx, w), *gx2 = ctx_grad(ctx, x2);
    mpr_scope_begin();
    mpr_tensor_t *l1 = mpr_sum(mpr_tanh(mpr_matmul(w, x1)));
    mpr_tensor_t *l2 = mpr_sum(mpr_mul(mpr_matmul(w, x2), w));
    CHECK_OK(mpr_backward(mpr_add(l1, l2), NULL, false));
    mpr_scope_end();
    check_close(gw, mpr_tensor_grad(w), "param twice dL/dw");
    check_close(gx2, mpr_tensor_grad(x2), "param twice dL/dx2");
    mpr_tensor_release(gw);
    mpr_tensor_release(gx2);
    CHECK_OK(mpr_dist_context_end(ctx));
    mpr_tensor_release(w);
    mpr_tensor_release(x1);
    mpr_tensor_release(x2);
}

/* retain_graph: twice with it accumulates; without it, a further pass fails. */
static void test_retain_graph(void) {
    if (me != 0) return;
    mpr_tensor_t *w = filled(2, 2, 0.3, true), *x = filled(2, 2, 0.5, false);
    int64_t ctx;
    CHECK_OK(mpr_dist_context_begin(&ctx));
    mpr_scope_begin();
    mpr_tensor_t *y = call_tensor(1, "mm", tensors2(w, x));
    mpr_tensor_t *loss = mpr_sum(mpr_tanh(y));
    CHECK_OK(mpr_dist_backward(ctx, &loss, 1, true));
    mpr_tensor_t *g1 = ctx_grad(ctx, w);
    CHECK_OK(mpr_dist_backward(ctx, &loss, 1, false));
    mpr_tensor_t *g2 = ctx_grad(ctx, w);
    CHECK_ERR(mpr_dist_backward(ctx, &loss, 1, true), MPR_ERR_STATE);
    CHECK_CONTAINS(mpr_last_error(), "retain_graph");
    mpr_tensor_t *twice = mpr_mul_scalar(g1, 2.0);
    check_close(g2, twice, "retain_graph accumulation");
    mpr_tensor_release(y);
    mpr_scope_end();
    mpr_tensor_release(g1);
    mpr_tensor_release(g2);
    CHECK_OK(mpr_dist_context_end(ctx));
    mpr_tensor_release(w);
    mpr_tensor_release(x);
}

/* remote() on rank 1, the RRef consumed on rank 2 (to_here there), the loss
 * back on rank 0; then RRef.backward from an RRef rank 0 holds. */
static void test_rref_paths(void) {
    if (me != 0) return;
    mpr_tensor_t *w = filled(3, 3, 0.8, true), *x = filled(3, 3, 0.1, false);
    int64_t ctx;
    CHECK_OK(mpr_dist_context_begin(&ctx));
    mpr_scope_begin();
    mpr_value_t *margs = tensors2(w, x);
    mpr_rref_t *rr = mpr_remote(mpr_to_rank(1), "mm", margs, 60);
    mpr_value_release(margs);
    CHECK(rr != NULL);
    mpr_tensor_t *s = call_tensor(2, "rref_double_sum", mpr_value_list_of(1, mpr_value_new_rref(rr)));
    mpr_tensor_t *loss = mpr_mul(s, s);
    CHECK_OK(mpr_dist_backward(ctx, &loss, 1, false));
    mpr_tensor_release(s);
    mpr_scope_end();
    mpr_tensor_t *g = ctx_grad(ctx, w);
    mpr_scope_begin();
    mpr_tensor_t *ls = mpr_sum(mpr_mul_scalar(mpr_matmul(w, x), 2.0));
    CHECK_OK(mpr_backward(mpr_mul(ls, ls), NULL, false));
    mpr_scope_end();
    check_close(g, mpr_tensor_grad(w), "remote + RRef elsewhere dL/dw");
    mpr_tensor_release(g);
    CHECK_OK(mpr_dist_context_end(ctx));
    mpr_rref_release(rr);

    /* RRef.backward: the owner (rank 2) holds loss = sum(mm(w, x)) */
    mpr_zero_grad(w);
    CHECK_OK(mpr_dist_context_begin(&ctx));
    mpr_value_t *args = tensors2(w, x);
    mpr_rref_t *lr = mpr_remote(mpr_to_rank(2), "chain_sum", args, 60);
    mpr_value_release(args);
    CHECK(lr != NULL);
    CHECK_OK(mpr_rref_backward(lr, ctx, false));
    g = ctx_grad(ctx, w);
    mpr_scope_begin();
    CHECK_OK(mpr_backward(mpr_sum(mpr_matmul(w, x)), NULL, false));
    mpr_scope_end();
    check_close(g, mpr_tensor_grad(w), "RRef.backward dL/dw");
    mpr_tensor_release(g);
    CHECK_OK(mpr_dist_context_end(ctx));
    mpr_rref_release(lr);
    mpr_tensor_release(w);
    mpr_tensor_release(x);
}

static mpr_err_t fn_chain_sum(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    mpr_value_t *y = NULL;
    mpr_err_t e = fn_mm(ctx, args, &y);
    if (e) return e;
    mpr_tensor_t *t;
    mpr_value_get_tensor(y, &t);
    mpr_tensor_t *s = mpr_sum(t);
    *result = mpr_value_new_tensor(s);
    mpr_tensor_release(s);
    mpr_value_release(y);
    return MPR_OK;
}

/* Two threads, two contexts, the same parameter, concurrently. */
typedef struct {
    mpr_tensor_t *w;
    double seed;
    int peer;
    atomic_int *failures;
} conc_arg_t;

static void *concurrent_step(void *arg) {
    conc_arg_t *a = arg;
    mpr_tensor_t *x = filled(4, 4, a->seed, false);
    for (int it = 0; it < 20; it++) {
        int64_t ctx;
        CHECK_OK(mpr_dist_context_begin(&ctx));
        mpr_scope_begin();
        mpr_tensor_t *y = call_tensor(a->peer, "mm", tensors2(a->w, x));
        mpr_tensor_t *loss = mpr_sum(mpr_mul(y, y));
        CHECK_OK(mpr_dist_backward(ctx, &loss, 1, false));
        mpr_tensor_release(y);
        /* expected: d/dw sum((w x)^2) = 2 (w x) x^T, computed without autograd */
        bool prev = mpr_set_grad_enabled(false);
        mpr_tensor_t *wx = mpr_matmul(a->w, x);
        mpr_tensor_t *want = mpr_mul_scalar(mpr_matmul(wx, mpr_transpose(x, 0, 1)), 2.0);
        mpr_set_grad_enabled(prev);
        mpr_tensor_t *g = ctx_grad(ctx, a->w);
        check_close(g, want, "concurrent contexts dL/dw");
        mpr_tensor_release(g);
        mpr_scope_end();
        CHECK_OK(mpr_dist_context_end(ctx));
    }
    mpr_tensor_release(x);
    return NULL;
}

static void test_concurrent_contexts(void) {
    if (me != 0) return;
    mpr_tensor_t *w = filled(4, 4, 0.6, true);
    pthread_t th[2];
    conc_arg_t args[2] = {{w, 1.0, 1, NULL}, {w, 2.0, 2, NULL}};
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, concurrent_step, &args[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    mpr_tensor_release(w);
}

/* Several threads of this rank sending in ONE context at once (as a
 * pipeline's future callbacks do): every call is recorded and the gradient
 * sums them all. Before the fix, two threads could draw message ids in one
 * order and append their send functions in the other: an invariant abort
 * in about half the runs on 2 cores; a race, so not in every run). */
#define SHARED_THREADS 4
#define SHARED_CALLS 100

typedef struct {
    int64_t ctx;
    mpr_tensor_t *w, *x;
    mpr_tensor_t **ys; /* [SHARED_CALLS]: this thread's outputs */
} shared_arg_t;

static void *shared_context_sender(void *arg) {
    shared_arg_t *a = arg;
    CHECK_OK(mpr_dist_context_set_current(a->ctx, NULL));
    mpr_future_t *fs[SHARED_CALLS];
    for (int i = 0; i < SHARED_CALLS; i++) {
        mpr_value_t *args = tensors2(a->w, a->x);
        fs[i] = mpr_rpc_async(mpr_to_rank(1 + i % 2), "mm", args, 60);
        mpr_value_release(args);
    }
    for (int i = 0; i < SHARED_CALLS; i++) {
        mpr_value_t *r = NULL;
        mpr_tensor_t *t = NULL;
        CHECK_OK(mpr_future_get(fs[i], 60, &r));
        CHECK_OK(mpr_value_get_tensor(r, &t));
        a->ys[i] = mpr_tensor_retain(t);
        mpr_value_release(r);
        mpr_future_release(fs[i]);
    }
    CHECK_OK(mpr_dist_context_set_current(0, NULL));
    return NULL;
}

static void test_threads_share_context(void) {
    if (me != 0) return;
    mpr_tensor_t *w = filled(3, 4, 0.2, true), *x = filled(4, 2, 0.9, false);
    mpr_tensor_t *ys[SHARED_THREADS * SHARED_CALLS];
    int64_t ctx;
    CHECK_OK(mpr_dist_context_begin(&ctx));
    pthread_t th[SHARED_THREADS];
    shared_arg_t args[SHARED_THREADS];
    for (int t = 0; t < SHARED_THREADS; t++) {
        args[t] = (shared_arg_t){ctx, w, x, ys + t * SHARED_CALLS};
        pthread_create(&th[t], NULL, shared_context_sender, &args[t]);
    }
    for (int t = 0; t < SHARED_THREADS; t++) pthread_join(th[t], NULL);
    mpr_scope_begin();
    mpr_tensor_t *loss = NULL;
    for (int i = 0; i < SHARED_THREADS * SHARED_CALLS; i++) {
        mpr_tensor_t *l = mpr_sum(mpr_tanh(ys[i]));
        loss = loss ? mpr_add(loss, l) : l;
    }
    CHECK_OK(mpr_dist_backward(ctx, &loss, 1, false));
    mpr_scope_end();
    mpr_tensor_t *g = ctx_grad(ctx, w);
    /* the same locally: every call's sum(tanh(w x)) */
    mpr_scope_begin();
    mpr_tensor_t *ll = mpr_mul_scalar(mpr_sum(mpr_tanh(mpr_matmul(w, x))), SHARED_THREADS * SHARED_CALLS);
    CHECK_OK(mpr_backward(ll, NULL, false));
    mpr_scope_end();
    check_close(g, mpr_tensor_grad(w), "threads sharing a context dL/dw");
    mpr_tensor_release(g);
    CHECK_OK(mpr_dist_context_end(ctx));
    for (int i = 0; i < SHARED_THREADS * SHARED_CALLS; i++) mpr_tensor_release(ys[i]);
    mpr_tensor_release(w);
    mpr_tensor_release(x);
}

static void test_remote_error_in_backward(void) {
    if (me != 0) return;
    mpr_tensor_t *w = filled(2, 2, 0.3, true);
    int64_t ctx;
    CHECK_OK(mpr_dist_context_begin(&ctx));
    mpr_scope_begin();
    mpr_tensor_t *y = call_tensor(2, "fail_in_backward", mpr_value_list_of(1, mpr_value_new_tensor(w)));
    mpr_tensor_t *loss = mpr_sum(y);
    CHECK_ERR(mpr_dist_backward(ctx, &loss, 1, false), MPR_ERR_REMOTE);
    CHECK_CONTAINS(mpr_last_error(), "worker2");
    CHECK_CONTAINS(mpr_last_error(), "injected backward failure");
    CHECK(mpr_last_error_remote_code() == MPR_ERR_SHAPE);
    mpr_tensor_release(y);
    mpr_scope_end();
    CHECK_OK(mpr_dist_context_end(ctx)); /* still releasable */
    mpr_tensor_release(w);
}

/* Cleanup reaches every worker that took part: counted on each. */
static void test_cleanup_everywhere(void) {
    if (me != 0) return;
    mpr_tensor_t *w = filled(2, 2, 0.3, true);
    int64_t ctx;
    CHECK_OK(mpr_dist_context_begin(&ctx));
    /* rank 1 takes part directly, rank 2 only through rank 1 (a chain) */
    mpr_tensor_t *y = call_tensor(1, "chain", mpr_value_list_of(3, mpr_value_new_tensor(w), mpr_value_new_int(2),
                                                               mpr_value_new_int(0)));
    mpr_tensor_release(y);
    for (int r = 1; r < 3; r++) {
        mpr_value_t *b = NULL;
        bool alive = false;
        CHECK_OK(mpr_rpc_sync_take(mpr_to_rank(r), "ctx_exists", mpr_value_list_of(1, mpr_value_new_int(ctx)), 60, &b));
        CHECK_OK(mpr_value_get_bool(b, &alive));
        CHECK(alive);
        mpr_value_release(b);
    }
    CHECK_OK(mpr_dist_context_end(ctx));
    for (int r = 1; r < 3; r++) { /* cleanup messages are one-way: wait for them (bounded) */
        bool alive = true;
        for (int tries = 0; alive && tries < 500; tries++) {
            mpr_value_t *b = NULL;
            CHECK_OK(mpr_rpc_sync_take(mpr_to_rank(r), "ctx_exists", mpr_value_list_of(1, mpr_value_new_int(ctx)), 60,
                                       &b));
            CHECK_OK(mpr_value_get_bool(b, &alive));
            mpr_value_release(b);
            if (alive) usleep(10000);
        }
        CHECK(!alive);
    }
    mpr_tensor_release(w);
}

/* mpr_dist_context_end puts the CLEANUP off to an idle moment (the next
 * wait, usually): a thread that never waits again still gets it out, by
 * the idle progress thread, and the peer ends its copy. Rank 0 ends the
 * context and then blocks in plain MPI only; rank 1 watches its copy. */
static void test_cleanup_without_a_wait(void) {
    int64_t ctx = 0;
    if (me == 0) {
        mpr_tensor_t *w = filled(2, 2, 0.3, true);
        CHECK_OK(mpr_dist_context_begin(&ctx));
        mpr_tensor_t *y = call_tensor(1, "mm", tensors2(w, w));
        mpr_tensor_release(y);
        CHECK_OK(mpr_dist_context_end(ctx));
        mpr_tensor_release(w);
        MPI_Send(&ctx, 1, MPI_INT64_T, 1, 94, MPI_COMM_WORLD);
        int gone = 0;
        MPI_Recv(&gone, 1, MPI_INT, 1, 95, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        CHECK(gone);
    } else if (me == 1) {
        MPI_Recv(&ctx, 1, MPI_INT64_T, 0, 94, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        int gone = 0;
        for (int tries = 0; !gone && tries < 5000; tries++) { /* up to 5 s; it takes a few ms */
            gone = !mpr_dist_context_exists(ctx);
            if (!gone) usleep(1000);
        }
        CHECK(gone);
        MPI_Send(&gone, 1, MPI_INT, 0, 95, MPI_COMM_WORLD);
    }
}

static void test_misuse(void) {
    int64_t ctx, other;
    CHECK_OK(mpr_dist_context_begin(&ctx));
    CHECK_ERR(mpr_dist_context_begin(&other), MPR_ERR_STATE);
    CHECK(other == 0);
    CHECK_CONTAINS(mpr_last_error(), "already has");
    CHECK_OK(mpr_dist_context_end(ctx));
    CHECK_ERR(mpr_dist_context_end(ctx), MPR_ERR_NOT_FOUND);
    mpr_tensor_t *w = filled(1, 1, 0.3, true);
    mpr_tensor_t *l = mpr_mul(w, w);
    CHECK_ERR(mpr_dist_backward(ctx, &l, 1, false), MPR_ERR_NOT_FOUND);
    mpr_tensor_t *g = (mpr_tensor_t *)1;
    CHECK_ERR(mpr_dist_get_gradient(ctx, w, &g), MPR_ERR_NOT_FOUND);
    CHECK(g == NULL);
    CHECK_ERR(mpr_dist_backward(12345, &l, 1, false), MPR_ERR_NOT_FOUND);
    CHECK_OK(mpr_dist_context_begin(&ctx));
    CHECK_ERR(mpr_dist_backward(ctx, &l, 0, false), MPR_ERR_INVALID_ARG);
    mpr_tensor_t *plain = filled(1, 1, 0.1, false);
    CHECK_ERR(mpr_dist_backward(ctx, &plain, 1, false), MPR_ERR_STATE);
    mpr_tensor_t *big = filled(2, 2, 0.1, true);
    CHECK_ERR(mpr_dist_backward(ctx, &big, 1, false), MPR_ERR_SHAPE);
    /* a local backward through a received tensor names the fix */
    if (me == 0) {
        mpr_tensor_t *y = call_tensor(1, "mm", tensors2(w, w));
        mpr_tensor_t *s = mpr_sum(y);
        CHECK_ERR(mpr_backward(s, NULL, false), MPR_ERR_STATE);
        CHECK_CONTAINS(mpr_last_error(), "mpr_dist_backward");
        mpr_tensor_release(s);
        mpr_tensor_release(y);
    }
    CHECK_OK(mpr_dist_context_end(ctx));
    mpr_tensor_release(plain);
    mpr_tensor_release(big);
    mpr_tensor_release(l);
    mpr_tensor_release(w);
}

/* A reply arriving after its context ended is dropped safely. The order is
 * fixed, not timed: the call's handler on rank 1 waits on a gate that rank
 * 1's main thread opens only when rank 0 says so over plain MPI (no pool
 * thread needed), which rank 0 does after it ended the context; so the
 * reply is sent, and arrives, after the end. */
static void test_reply_outlives_context(void) {
    if (me == 1) { /* the gate's keeper */
        int go = 0;
        MPI_Request req;
        MPI_Irecv(&go, 1, MPI_INT, 0, 93, MPI_COMM_WORLD, &req);
        for (int done = 0; !done;) {
            MPI_Test(&req, &done, MPI_STATUS_IGNORE);
            if (!done) usleep(1000);
        }
        atomic_store(&mm_gate_open, true);
    }
    if (me != 0) return;
    mpr_tensor_t *w = filled(2, 2, 0.3, true);
    int64_t ctx;
    CHECK_OK(mpr_dist_context_begin(&ctx));
    mpr_value_t *args = tensors2(w, w);
    mpr_future_t *f = mpr_rpc_async(mpr_to_rank(1), "gated_mm", args, 60);
    mpr_value_release(args);
    CHECK_OK(mpr_dist_context_end(ctx));
    CHECK(!mpr_future_done(f)); /* the gate is still closed */
    int go = 1;
    MPI_Send(&go, 1, MPI_INT, 1, 93, MPI_COMM_WORLD);
    mpr_value_t *v = NULL;
    CHECK_OK(mpr_future_get(f, 60, &v));
    mpr_tensor_t *y;
    CHECK_OK(mpr_value_get_tensor(v, &y));
    CHECK(mpr_requires_grad(y) && mpr_is_leaf(y)); /* flagged, but no recv function */
    mpr_value_release(v);
    mpr_future_release(f);
    mpr_tensor_release(w);
}

/* requires_grad travels with a tensor, to self and to a peer, outside any context. */
static void test_requires_grad_on_the_wire(void) {
    mpr_tensor_t *a = filled(2, 2, 0.1, true), *b = filled(2, 2, 0.1, false);
    for (int dst = 0; dst < 2; dst++) {
        int rank = dst == 0 ? me : (me + 1) % n_ranks;
        mpr_value_t *r = NULL;
        bool flag = false;
        CHECK_OK(mpr_rpc_sync_take(mpr_to_rank(rank), "requires_grad", mpr_value_list_of(1, mpr_value_new_tensor(a)),
                                   60, &r));
        CHECK_OK(mpr_value_get_bool(r, &flag));
        CHECK(flag);
        mpr_value_release(r);
        CHECK_OK(mpr_rpc_sync_take(mpr_to_rank(rank), "requires_grad", mpr_value_list_of(1, mpr_value_new_tensor(b)),
                                   60, &r));
        CHECK_OK(mpr_value_get_bool(r, &flag));
        CHECK(!flag);
        mpr_value_release(r);
    }
    mpr_tensor_release(a);
    mpr_tensor_release(b);
}

/* ---- parity with PyTorch 1.13: an MLP whose layers sit on two ranks ----
 * tests/data/ref_mlp.safetensors (tests/ref/gen_refs.py): Linear(12,16) ->
 * ReLU -> Linear(16,10), cross-entropy; its weights, input, target, loss and
 * every parameter gradient as PyTorch computed them. Rank 1 holds layer 0,
 * rank 2 layer 2, rank 0 drives and holds the loss. */
static mpr_tensor_dict_t *ref;
static mpr_tensor_t *mlp_w, *mlp_b; /* this rank's layer (ranks 1 and 2) */

static mpr_err_t fn_mlp_layer(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    mpr_tensor_t *x;
    mpr_err_t e = mpr_args_tensor(args, 0, &x);
    if (e) return e;
    mpr_tensor_t *y = mpr_linear(x, mlp_w, mlp_b);
    if (me == 1) {
        mpr_tensor_t *r = mpr_relu(y);
        mpr_tensor_release(y);
        y = r;
    }
    if (!y) return mpr_last_error_code();
    *result = mpr_value_new_tensor(y);
    mpr_tensor_release(y);
    return MPR_OK;
}

/* [ctx] -> [dW, db] of this rank's layer in that context. */
static mpr_err_t fn_mlp_grads(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    int64_t id;
    mpr_err_t e = mpr_args_int(args, 0, &id);
    if (e) return e;
    mpr_tensor_t *gw = NULL, *gb = NULL;
    if ((e = mpr_dist_get_gradient(id, mlp_w, &gw)) || (e = mpr_dist_get_gradient(id, mlp_b, &gb))) return e;
    if (!gw || !gb) return mpr_error_set(MPR_ERR_NOT_FOUND, "no gradient for this rank's layer");
    *result = mpr_value_list_of(2, mpr_value_new_tensor(gw), mpr_value_new_tensor(gb));
    mpr_tensor_release(gw);
    mpr_tensor_release(gb);
    return MPR_OK;
}

static void load_mlp_reference(void) {
    const char *dir = getenv("MPIRPC_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/ref_mlp.safetensors", dir ? dir : "tests/data");
    ref = mpr_safetensors_load(path);
    CHECK(ref != NULL);
    if (me == 1 || me == 2) {
        const char *w = me == 1 ? "0.weight" : "2.weight", *b = me == 1 ? "0.bias" : "2.bias";
        /* leaves of our own (the dict keeps its tensors) */
        mlp_w = mpr_detach(mpr_tensor_dict_get(ref, w));
        mlp_b = mpr_detach(mpr_tensor_dict_get(ref, b));
        CHECK(mlp_w && mlp_b);
        CHECK_OK(mpr_set_requires_grad(mlp_w, true));
        CHECK_OK(mpr_set_requires_grad(mlp_b, true));
    }
}

static void check_ref_close(const mpr_tensor_t *got, const char *name) {
    const mpr_tensor_t *want = mpr_tensor_dict_get(ref, name);
    CHECK(want != NULL);
    if (!mpr_allclose(got, want, 1e-5, 1e-7)) {
        fprintf(stderr, "[rank %d] %s differs from PyTorch 1.13's beyond 1e-5\n", me, name);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

static void test_mlp_parity_with_pytorch(void) {
    if (me != 0) return;
    int64_t ctx;
    CHECK_OK(mpr_dist_context_begin(&ctx));
    mpr_scope_begin();
    mpr_tensor_t *h = call_tensor(1, "mlp_layer", mpr_value_list_of(1, mpr_value_new_tensor(mpr_tensor_dict_get(ref, "input"))));
    mpr_tensor_t *out = call_tensor(2, "mlp_layer", mpr_value_list_of(1, mpr_value_new_tensor(h)));
    check_ref_close(out, "output");
    mpr_tensor_t *loss = mpr_cross_entropy(out, mpr_tensor_dict_get(ref, "target"));
    check_ref_close(loss, "loss");
    CHECK_OK(mpr_dist_backward(ctx, &loss, 1, false));
    mpr_tensor_release(h);
    mpr_tensor_release(out);
    mpr_scope_end();
    for (int r = 1; r <= 2; r++) {
        mpr_value_t *g = NULL;
        CHECK_OK(mpr_rpc_sync_take(mpr_to_rank(r), "mlp_grads", mpr_value_list_of(1, mpr_value_new_int(ctx)), 60, &g));
        mpr_tensor_t *gw, *gb;
        CHECK_OK(mpr_args_tensor(g, 0, &gw));
        CHECK_OK(mpr_args_tensor(g, 1, &gb));
        check_ref_close(gw, r == 1 ? "0.weight.grad" : "2.weight.grad");
        check_ref_close(gb, r == 1 ? "0.bias.grad" : "2.bias.grad");
        mpr_value_release(g);
    }
    CHECK_OK(mpr_dist_context_end(ctx));
    printf("MLP over ranks 1 and 2: output, loss and the 4 parameter gradients match PyTorch 1.13 (1e-5)\n");
}

static int leak_steps = 10000;

/* This rank's counters once nothing is in flight here (one-way cleanups
 * landed, sends completed, no task queued), bounded at 10 s. */
static mpr_debug_info_t quiet_counters(void) {
    mpr_debug_info_t d;
    for (int tries = 0; tries < 1000; tries++) {
        CHECK_OK(mpr_get_debug_info(&d));
        if (d.dist_contexts == 0 && d.progress_busy == 0 && d.pool_busy == 0 && d.pending_requests == 0) break;
        usleep(10000);
    }
    return d;
}

/* Contexts, graph nodes and tensors come back to their start on every rank
 * (a leak of one per step would show as thousands). */
static void test_leak_loop(void) {
    mpr_debug_info_t before = quiet_counters(), after;
    CHECK(before.dist_contexts == 0);
    mpitest_barrier();
    if (me == 0) {
        mpr_tensor_t *w = filled(2, 2, 0.3, true), *x = filled(2, 2, 0.2, false);
        for (int i = 0; i < leak_steps; i++) {
            int64_t ctx;
            CHECK_OK(mpr_dist_context_begin(&ctx));
            mpr_scope_begin();
            mpr_tensor_t *y = call_tensor(1 + i % 2, "mm", tensors2(w, x));
            mpr_tensor_t *loss = mpr_sum(y);
            CHECK_OK(mpr_dist_backward(ctx, &loss, 1, false));
            mpr_tensor_release(y);
            mpr_scope_end();
            CHECK_OK(mpr_dist_context_end(ctx));
        }
        mpr_tensor_release(w);
        mpr_tensor_release(x);
    }
    mpitest_barrier();
    for (int tries = 0; tries < 1000; tries++) {
        after = quiet_counters();
        if (after.autograd_nodes <= before.autograd_nodes && after.tensors <= before.tensors) break;
        usleep(10000);
    }
    if (after.dist_contexts != 0 || after.autograd_nodes > before.autograd_nodes || after.tensors > before.tensors)
        fprintf(stderr, "[rank %d] after %d steps: contexts %ld, nodes %ld (was %ld), tensors %ld (was %ld)\n", me,
                leak_steps, after.dist_contexts, after.autograd_nodes, before.autograd_nodes, after.tensors,
                before.tensors);
    CHECK(after.dist_contexts == 0);
    CHECK(after.autograd_nodes <= before.autograd_nodes);
    CHECK(after.tensors <= before.tensors);
    if (me == 0) printf("leak loop: %d steps, contexts/nodes/tensors back to start on every rank\n", leak_steps);
}

/* `leak-report` mode (np2): rank 0 begins a context, calls rank 1 inside it
 * and never ends it; graceful shutdown must name it on both ranks (ctest
 * matches the report). */
static int leak_report_mode(void) {
    if (me == 0) {
        int64_t ctx;
        mpr_tensor_t *w = filled(2, 2, 0.3, true);
        CHECK_OK(mpr_dist_context_begin(&ctx));
        mpr_tensor_t *y = call_tensor(1, "mm", tensors2(w, w));
        printf("context %lld left alive\n", (long long)ctx);
        fflush(stdout);
        mpr_tensor_release(y);
        mpr_tensor_release(w);
    }
    mpitest_barrier();
    mpr_debug_info_t d;
    CHECK_OK(mpr_get_debug_info(&d));
    CHECK(d.dist_contexts == 1); /* on both ranks: the root's and rank 1's copy */
    CHECK_OK(mpr_shutdown(true));
    return 0;
}

/* mpr_dist_accumulate_gradient: two contexts' gradients of w (y = mm(w, x_i)
 * on rank 1) added into a third context equal the sum (gradient
 * accumulation with a context per micro-batch, the pipeline's 1F1B); the
 * context keeps a copy; bad input fails clearly. */
static void test_accumulate_gradient(void) {
    if (me != 0) return;
    mpr_tensor_t *w = filled(4, 3, 0.1, true), *x[2] = {filled(3, 5, 0.7, false), filled(3, 5, -0.3, false)};
    int64_t ctx[2], into;
    mpr_tensor_t *g[2];
    for (int i = 0; i < 2; i++) {
        CHECK_OK(mpr_dist_context_begin(&ctx[i]));
        mpr_scope_begin();
        mpr_tensor_t *y = call_tensor(1, "mm", tensors2(w, x[i]));
        mpr_tensor_t *loss = mpr_sum(mpr_tanh(y));
        CHECK_OK(mpr_dist_backward(ctx[i], &loss, 1, false));
        mpr_tensor_release(y);
        mpr_scope_end();
        g[i] = ctx_grad(ctx[i], w);
        CHECK_OK(mpr_dist_context_set_current(0, NULL));
    }
    CHECK_OK(mpr_dist_context_begin(&into));
    mpr_tensor_t *copy = mpr_clone(g[0]);
    CHECK_OK(mpr_dist_accumulate_gradient(into, w, copy));
    CHECK_OK(mpr_fill_(copy, 1e6)); /* the context kept its own copy */
    CHECK_OK(mpr_dist_accumulate_gradient(into, w, g[1]));
    for (int i = 0; i < 2; i++) CHECK_OK(mpr_dist_context_end(ctx[i])); /* the sum outlives them */
    mpr_tensor_t *sum = ctx_grad(into, w), *want = mpr_add(g[0], g[1]);
    check_close(sum, want, "accumulated dL/dw");
    /* bad input */
    mpr_tensor_t *wrong = filled(3, 4, 0.5, false), *nonleaf = mpr_mul_scalar(w, 2.0);
    CHECK(mpr_dist_accumulate_gradient(into, w, wrong) == MPR_ERR_SHAPE);
    CHECK(mpr_dist_accumulate_gradient(into, nonleaf, g[0]) == MPR_ERR_INVALID_ARG);
    CHECK(mpr_dist_accumulate_gradient(into, x[0], x[0]) == MPR_ERR_INVALID_ARG); /* no requires_grad */
    CHECK(mpr_dist_accumulate_gradient(ctx[0], w, g[0]) == MPR_ERR_NOT_FOUND); /* ended */
    check_close(sum, want, "accumulated dL/dw after the failed calls");
    CHECK_OK(mpr_dist_context_end(into));
    mpr_tensor_t *all[] = {w, x[0], x[1], g[0], g[1], copy, sum, want, wrong, nonleaf};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) mpr_tensor_release(all[i]);
}

int main(int argc, char **argv) {
    bool report = argc > 1 && strcmp(argv[1], "leak-report") == 0;
    if (argc > 1 && !report) leak_steps = atoi(argv[1]);
    CHECK_OK(mpr_register_function("mm", fn_mm, NULL));
    CHECK_OK(mpr_register_function("gated_mm", fn_gated_mm, NULL));
    CHECK_OK(mpr_register_function("triple", fn_triple, NULL));
    CHECK_OK(mpr_register_function("chain", fn_chain, NULL));
    CHECK_OK(mpr_register_function("chain_sum", fn_chain_sum, NULL));
    CHECK_OK(mpr_register_function("fail_in_backward", fn_fail_in_backward, NULL));
    CHECK_OK(mpr_register_function("requires_grad", fn_requires_grad, NULL));
    CHECK_OK(mpr_register_function("ctx_exists", fn_ctx_exists, NULL));
    CHECK_OK(mpr_register_function("rref_double_sum", fn_rref_double_sum, NULL));
    CHECK_OK(mpr_register_function("mlp_layer", fn_mlp_layer, NULL));
    CHECK_OK(mpr_register_async_function("async_chain", fn_async_chain, NULL));
    CHECK_OK(mpr_register_function("mlp_grads", fn_mlp_grads, NULL));
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = &argc;
    opts.argv = &argv;
    CHECK_OK(mpr_init(&opts));
    me = mpitest_rank();
    n_ranks = mpr_world_size();
    if (report) return leak_report_mode();
    CHECK(n_ranks >= 3);
    load_mlp_reference();
    RUN_TEST(test_requires_grad_on_the_wire);
    RUN_TEST(test_simple);
    RUN_TEST(test_broadcast_gradients);
    RUN_TEST(test_call_to_self);
    RUN_TEST(test_nested_chain);
    RUN_TEST(test_param_twice_mixed_two_roots);
    RUN_TEST(test_async_function_keeps_context);
    RUN_TEST(test_retain_graph);
    RUN_TEST(test_rref_paths);
    RUN_TEST(test_concurrent_contexts);
    RUN_TEST(test_threads_share_context);
    RUN_TEST(test_remote_error_in_backward);
    RUN_TEST(test_cleanup_everywhere);
    RUN_TEST(test_cleanup_without_a_wait);
    RUN_TEST(test_misuse);
    RUN_TEST(test_reply_outlives_context);
    RUN_TEST(test_mlp_parity_with_pytorch);
    RUN_TEST(test_leak_loop);
    RUN_TEST(test_accumulate_gradient);
    CHECK_OK(mpr_shutdown(true));
    mpr_tensor_release(mlp_w);
    mpr_tensor_release(mlp_b);
    mpr_tensor_dict_destroy(ref);
    MPITEST_REPORT();
    return 0;
}
