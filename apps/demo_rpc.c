/* demo_rpc.c — the flagship demo until the training apps exist: what
 * torch.distributed.rpc users do, over MPI. Run: mpirun -np 2 ./demo_rpc
 *
 * Every rank registers the same functions; rank 0 (worker0) then calls
 * worker1 synchronously, asynchronously with a `then` continuation, with a
 * tensor argument, with an async-execution function, and with a failing
 * function, and measures a no-op round trip. */
#include <mpirpc/mpirpc.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

static mpr_err_t add(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t a, b;
    mpr_err_t e;
    if ((e = mpr_args_int(args, 0, &a)) || (e = mpr_args_int(args, 1, &b))) return e;
    *result = mpr_value_new_int(a + b);
    return MPR_OK;
}

/* Scales a float tensor in place on the callee's copy and sends it back. */
static mpr_err_t scale(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    mpr_tensor_t *t;
    double k;
    mpr_err_t e;
    if ((e = mpr_args_tensor(args, 0, &t)) || (e = mpr_args_double(args, 1, &k))) return e;
    if (mpr_tensor_dtype(t) != MPR_F32) return mpr_error_set(MPR_ERR_DTYPE, "scale wants float32");
    float *p = mpr_tensor_data(t);
    for (int64_t i = 0; i < mpr_tensor_numel(t); i++) p[i] *= (float)k;
    *result = mpr_value_new_tensor(t);
    return MPR_OK;
}

static mpr_err_t divide(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t a, b;
    mpr_err_t e;
    if ((e = mpr_args_int(args, 0, &a)) || (e = mpr_args_int(args, 1, &b))) return e;
    if (b == 0) return mpr_error_set(MPR_ERR_INVALID_ARG, "division of %lld by zero", (long long)a);
    *result = mpr_value_new_int(a / b);
    return MPR_OK;
}

static mpr_err_t noop(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    *result = NULL;
    return MPR_OK;
}

/* Async execution: forwards to worker0's add and answers when that answers,
 * holding no thread meanwhile (PyTorch's @rpc.functions.async_execution). */
static mpr_err_t relay_add(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_future_t **out) {
    *out = mpr_rpc_async(mpr_to_name("worker0"), "add", args, MPR_TIMEOUT_DEFAULT);
    return MPR_OK;
}

static mpr_err_t square_then(mpr_future_t *parent, void *unused, mpr_value_t **result) {
    mpr_value_t *v;
    mpr_err_t e = mpr_future_get(parent, 0, &v);
    if (e) return e;
    int64_t x;
    e = mpr_value_get_int(v, &x);
    mpr_value_release(v);
    if (!e) *result = mpr_value_new_int(x * x);
    return e;
}

static void check(mpr_err_t e, const char *what) {
    if (e != MPR_OK) {
        fprintf(stderr, "demo: %s failed: %s: %s\n", what, mpr_error_name(e), mpr_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

static int64_t as_int(mpr_value_t *v) {
    int64_t x = 0;
    check(mpr_value_get_int(v, &x), "reading an int");
    return x;
}

int main(int argc, char **argv) {
    check(mpr_register_function("add", add, NULL), "register");
    check(mpr_register_function("scale", scale, NULL), "register");
    check(mpr_register_function("divide", divide, NULL), "register");
    check(mpr_register_function("noop", noop, NULL), "register");
    check(mpr_register_async_function("relay_add", relay_add, NULL), "register");
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = &argc;
    opts.argv = &argv;
    check(mpr_init(&opts), "mpr_init");
    mpr_worker_info_t self;
    check(mpr_get_self_worker_info(&self), "self");
    if (mpr_world_size() < 2) {
        if (self.rank == 0) fprintf(stderr, "demo: run with mpirun -np 2 (or more)\n");
        mpr_shutdown(true);
        return 2;
    }
    if (self.rank == 0) {
        mpr_dest_t w1 = mpr_to_name("worker1");
        mpr_value_t *args = mpr_value_list_of(2, mpr_value_new_int(3), mpr_value_new_int(4)), *r;
        check(mpr_rpc_sync(w1, "add", args, MPR_TIMEOUT_DEFAULT, &r), "rpc_sync add");
        printf("rpc_sync:   worker1 add(3, 4) = %lld\n", (long long)as_int(r));
        mpr_value_release(r);

        mpr_future_t *f = mpr_rpc_async(w1, "add", args, MPR_TIMEOUT_DEFAULT);
        mpr_future_t *sq = mpr_future_then(f, square_then, NULL);
        check(mpr_future_get(sq, 10, &r), "rpc_async + then");
        printf("rpc_async:  add(3, 4) then square = %lld\n", (long long)as_int(r));
        mpr_value_release(r);
        mpr_future_release(sq);
        mpr_future_release(f);

        check(mpr_rpc_sync(w1, "relay_add", args, MPR_TIMEOUT_DEFAULT, &r), "async execution");
        printf("async exec: worker1 relayed add(3, 4) to worker0 = %lld\n", (long long)as_int(r));
        mpr_value_release(r);
        mpr_value_release(args);

        int64_t n = 1 << 18;
        mpr_tensor_t *t = mpr_tensor_empty(MPR_F32, 1, &n);
        float *p = mpr_tensor_data(t);
        for (int64_t i = 0; i < n; i++) p[i] = (float)i;
        args = mpr_value_list_of(2, mpr_value_new_tensor(t), mpr_value_new_double(0.5));
        check(mpr_rpc_sync(w1, "scale", args, MPR_TIMEOUT_DEFAULT, &r), "tensor rpc");
        mpr_tensor_t *out;
        check(mpr_value_get_tensor(r, &out), "tensor result");
        const float *q = mpr_tensor_data(out);
        printf("tensors:    scale(1 MiB tensor, 0.5) -> out[1000] = %.1f (ours unchanged: %.1f)\n", q[1000], p[1000]);
        mpr_value_release(r);
        mpr_value_release(args);
        mpr_tensor_release(t);

        args = mpr_value_list_of(2, mpr_value_new_int(1), mpr_value_new_int(0));
        mpr_err_t e = mpr_rpc_sync(w1, "divide", args, MPR_TIMEOUT_DEFAULT, &r);
        printf("errors:     divide(1, 0) -> %s: %s\n", mpr_error_name(e), mpr_last_error());
        e = mpr_rpc_sync(w1, "no_such_function", args, MPR_TIMEOUT_DEFAULT, &r);
        printf("            no_such_function -> %s: %s\n", mpr_error_name(e), mpr_last_error());
        mpr_value_release(args);

        enum { N = 2000 };
        double t0 = MPI_Wtime();
        for (int i = 0; i < N; i++) {
            check(mpr_rpc_sync(w1, "noop", NULL, MPR_TIMEOUT_DEFAULT, &r), "noop");
            mpr_value_release(r);
        }
        printf("latency:    %d no-op rpc_sync round trips, mean %.1f us\n", N, (MPI_Wtime() - t0) / N * 1e6);
    }
    check(mpr_shutdown(true), "shutdown");
    if (self.rank == 0) printf("graceful shutdown done on every rank\n");
    return 0;
}
