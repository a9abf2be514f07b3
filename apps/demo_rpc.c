/* demo_rpc.c — the flagship demo: what torch.distributed.rpc users do, over
 * MPI. Run: mpirun -np 2 ./demo_rpc
 *
 * Every rank registers the same functions; rank 0 (worker0) then calls
 * worker1 synchronously, asynchronously with a `then` continuation, with an
 * async-execution function, as a small parameter server (tensor in, tensor
 * out), fire-and-forget, and with failing calls, and measures a no-op round
 * trip. Handlers unpack their arguments and pack their results with the
 * format strings of mpirpc/call_format.h ('l' int64_t, 'd' double, 's'
 * string, 't' tensor, ...); calls pass their arguments the same way
 * (mpirpc/rpc_helpers.h). */
#include <mpirpc/mpirpc.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>

static mpr_err_t add(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t a, b;
    mpr_err_t e = mpr_args_unpack(args, "ll", &a, &b);
    return e ? e : mpr_return(result, "l", a + b);
}

static mpr_err_t divide(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t a, b;
    mpr_err_t e = mpr_args_unpack(args, "ll", &a, &b);
    if (!e && b == 0) e = mpr_error_set(MPR_ERR_INVALID_ARG, "division of %lld by zero", (long long)a);
    return e ? e : mpr_return(result, "l", a / b);
}

static mpr_err_t noop(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) { return MPR_OK; }

static mpr_err_t greet(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    const char *text;
    mpr_err_t e = mpr_args_unpack(args, "s", &text);
    if (!e) printf("one-way:    worker1 got \"%s\" from %s\n", text, mpr_call_caller(ctx)->name), fflush(stdout);
    return e;
}

/* Async execution: forwards to worker0's add and answers when that answers,
 * holding no thread meanwhile (PyTorch's @rpc.functions.async_execution). */
static mpr_err_t relay_add(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_future_t **out) {
    *out = mpr_rpc_async(mpr_to_name("worker0"), "add", args, MPR_TIMEOUT_DEFAULT);
    return MPR_OK;
}

/* A parameter server: the weights live on worker1; update(grad, lr) applies
 * w -= lr * grad and returns [step, w]. */
static struct {
    pthread_mutex_t lock;
    mpr_tensor_t *w;
    int64_t step;
} ps = {PTHREAD_MUTEX_INITIALIZER, NULL, 0};

static mpr_err_t ps_update(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    mpr_tensor_t *grad;
    double lr;
    mpr_err_t e = mpr_args_unpack(args, "td", &grad, &lr);
    if (e) return e;
    pthread_mutex_lock(&ps.lock);
    if (!ps.w) ps.w = mpr_zeros_like(grad);
    if (!(e = mpr_add_scaled_(ps.w, grad, -lr))) e = mpr_return(result, "[l T]", ++ps.step, mpr_clone(ps.w));
    pthread_mutex_unlock(&ps.lock);
    return e;
}

static mpr_err_t square_then(mpr_future_t *parent, void *unused, mpr_value_t **result) {
    mpr_value_t *v;
    int64_t x;
    mpr_err_t e = mpr_future_get(parent, 0, &v);
    if (!e) e = mpr_value_unpack(v, "l", &x);
    mpr_value_release(v);
    return e ? e : mpr_return(result, "l", x * x);
}

static void check(mpr_err_t e, const char *what) {
    if (e != MPR_OK) {
        fprintf(stderr, "demo: %s failed: %s: %s\n", what, mpr_error_name(e), mpr_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

/* The int result of a call (released). */
static int64_t int_result(mpr_value_t *r) {
    int64_t x = 0;
    check(mpr_value_unpack(r, "l", &x), "reading an int");
    mpr_value_release(r);
    return x;
}

static void parameter_server(mpr_dest_t server) {
    int64_t n = 1 << 18, step = 0;
    mpr_tensor_t *grad = mpr_ones(MPR_F32, 1, &n), *w = NULL;
    mpr_value_t *r;
    for (int i = 0; i < 3; i++) {
        check(mpr_call_sync(server, "ps_update", MPR_TIMEOUT_DEFAULT, &r, "td", grad, 0.5), "ps_update");
        check(mpr_value_unpack(r, "[lT]", &step, &w), "ps_update result");
        mpr_value_release(r);
        if (i < 2) mpr_tensor_release(w);
    }
    printf("tensors:    3 updates of a 1 MiB tensor on worker1 (w -= 0.5 * grad): step %lld, w[1000] = %.1f\n",
           (long long)step, ((const float *)mpr_tensor_data(w))[1000]);
    mpr_tensor_release(w);
    mpr_tensor_release(grad);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines in order under mpirun */
    check(mpr_register_function("add", add, NULL), "register");
    check(mpr_register_function("divide", divide, NULL), "register");
    check(mpr_register_function("noop", noop, NULL), "register");
    check(mpr_register_function("greet", greet, NULL), "register");
    check(mpr_register_function("ps_update", ps_update, NULL), "register");
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
        mpr_value_t *r;
        check(mpr_call_sync(w1, "add", MPR_TIMEOUT_DEFAULT, &r, "ll", (int64_t)3, (int64_t)4), "add");
        printf("rpc_sync:   worker1 add(3, 4) = %lld\n", (long long)int_result(r));

        mpr_future_t *f = mpr_call_async(w1, "add", MPR_TIMEOUT_DEFAULT, "ll", (int64_t)3, (int64_t)4);
        mpr_future_t *sq = mpr_future_then(f, square_then, NULL);
        check(mpr_future_get(sq, 10, &r), "rpc_async + then");
        printf("rpc_async:  add(3, 4) then square = %lld\n", (long long)int_result(r));
        mpr_future_release(sq);
        mpr_future_release(f);

        check(mpr_call_sync(w1, "relay_add", MPR_TIMEOUT_DEFAULT, &r, "ll", (int64_t)3, (int64_t)4), "relay");
        printf("async exec: worker1 relayed add(3, 4) to worker0 = %lld\n", (long long)int_result(r));

        parameter_server(w1);

        check(mpr_call_oneway(w1, "greet", "s", "hello"), "one-way call");

        mpr_err_t e = mpr_call_sync(w1, "divide", MPR_TIMEOUT_DEFAULT, &r, "ll", (int64_t)1, (int64_t)0);
        printf("errors:     divide(1, 0) -> %s: %s\n", mpr_error_name(e), mpr_last_error());
        e = mpr_call_sync(w1, "add", MPR_TIMEOUT_DEFAULT, &r, "ls", (int64_t)1, "two");
        printf("            add(1, \"two\") -> %s: %s\n", mpr_error_name(e), mpr_last_error());
        e = mpr_call_sync(w1, "no_such_function", MPR_TIMEOUT_DEFAULT, &r, "");
        printf("            no_such_function -> %s: %s\n", mpr_error_name(e), mpr_last_error());

        enum { N = 2000 };
        double t0 = MPI_Wtime();
        for (int i = 0; i < N; i++) {
            check(mpr_rpc_sync(w1, "noop", NULL, MPR_TIMEOUT_DEFAULT, &r), "noop");
            mpr_value_release(r);
        }
        printf("latency:    %d no-op rpc_sync round trips, mean %.1f us\n", N, (MPI_Wtime() - t0) / N * 1e6);
        fflush(stdout);
    }
    check(mpr_shutdown(true), "shutdown");
    mpr_tensor_release(ps.w);
    if (self.rank == 0) printf("graceful shutdown done on every rank (it waited for the one-way call too)\n");
    return 0;
}
