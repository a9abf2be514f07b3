/* test_cuda_rpc.c — cuda:N tensors over RPC and through distributed autograd
 * (np 2, a CUDA build with a visible GPU; exits 77, skipped, otherwise).
 *
 * Scenarios:
 *  - a cuda:0 tensor sent to a peer arrives there on cuda:0 with its values,
 *    and a device result comes back on cuda:0; host and device tensors mix in
 *    one message; a self-call's callee gets its own device copy;
 *  - distributed autograd with the parameter on cuda:0 on the caller and the
 *    work on the callee's GPU: the gradient is on cuda:0 and equals a local
 *    backward of the same computation; and a CPU leaf whose callee moves it to
 *    its GPU and returns a CPU result gets its gradient on the CPU;
 *  - a RemoteModule on "worker1/cuda:0" trained for 10 steps with dist
 *    autograd and a DistributedOptimizer (Adam, amsgrad, weight decay) ends
 *    with the parameters of the same module trained locally on the CPU
 *    (f32, cuBLAS against OpenBLAS: within 1e-5), and its parameters stay
 *    on cuda:0. */
#include <math.h>
#include <stdio.h>

#include "mpirpc/cuda.h"
#include "mpirpc/dist_autograd.h"
#include "mpirpc/dist_optim.h"
#include "mpirpc/remote_module.h"
#include "mpitest.h"

static int me;

/* A CPU f32 [r, c] tensor of sin(seed + 0.37 i). */
static mpr_tensor_t *cpu_filled(int64_t r, int64_t c, double seed) {
    mpr_tensor_t *t = mpr_tensor_empty(MPR_F32, 2, (const int64_t[]){r, c});
    CHECK(t != NULL);
    float *d = mpr_tensor_data(t);
    for (int64_t i = 0; i < r * c; i++) d[i] = (float)sin(seed + 0.37 * (double)i);
    return t;
}

/* A leaf on `device` with cpu's values (new reference). */
static mpr_tensor_t *leaf_on(mpr_tensor_t *cpu, int device, bool requires_grad) {
    mpr_scope_begin();
    mpr_tensor_t *t = mpr_detach(mpr_to_device(cpu, device));
    CHECK(t != NULL);
    mpr_tensor_retain(t);
    mpr_scope_end();
    if (requires_grad) CHECK_OK(mpr_set_requires_grad(t, true));
    return t;
}

/* Host copy of any tensor (new reference). */
static mpr_tensor_t *host(mpr_tensor_t *t) {
    mpr_scope_begin();
    mpr_tensor_t *h = mpr_detach(mpr_to_device(t, -1));
    CHECK(h != NULL);
    mpr_tensor_retain(h);
    mpr_scope_end();
    return h;
}

static void check_close(mpr_tensor_t *got, mpr_tensor_t *want, double scale, const char *what) {
    mpr_tensor_t *g = host(got), *w = host(want);
    CHECK(mpr_tensor_numel(g) == mpr_tensor_numel(w));
    const float *a = mpr_tensor_data(g), *b = mpr_tensor_data(w);
    for (int64_t i = 0; i < mpr_tensor_numel(g); i++)
        if (fabs(a[i] - scale * b[i]) > 1e-5 * fmax(1.0, fabs(b[i]))) {
            fprintf(stderr, "[rank %d] %s: element %lld: %.9g vs %.9g\n", me, what, (long long)i, a[i],
                    scale * b[i]);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    mpr_tensor_release(g);
    mpr_tensor_release(w);
}

/* [a, b] -> [device of a, device of b, 2a (where a is), b + 1 (where b is)] */
static mpr_err_t fn_inspect(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    mpr_tensor_t *a, *b;
    mpr_err_t e;
    if ((e = mpr_args_tensor(args, 0, &a)) || (e = mpr_args_tensor(args, 1, &b))) return e;
    mpr_scope_begin();
    mpr_tensor_t *a2 = mpr_mul_scalar(a, 2.0), *b1 = mpr_add_scalar(b, 1.0);
    if (!a2 || !b1) {
        mpr_scope_end();
        return mpr_last_error_code();
    }
    *result = mpr_value_list_of(4, mpr_value_new_int(mpr_tensor_device(a)), mpr_value_new_int(mpr_tensor_device(b)),
                                mpr_value_new_tensor(a2), mpr_value_new_tensor(b1));
    mpr_scope_end();
    return *result ? MPR_OK : mpr_last_error_code();
}

/* [w] -> w @ w on w's device. */
static mpr_err_t fn_square(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    mpr_tensor_t *w;
    mpr_err_t e = mpr_args_tensor(args, 0, &w);
    if (e) return e;
    if (mpr_tensor_device(w) != 0) return mpr_error_set(MPR_ERR_INVALID_ARG, "square: w on %d", mpr_tensor_device(w));
    mpr_tensor_t *y = mpr_matmul(w, w);
    if (!y) return mpr_last_error_code();
    *result = mpr_value_new_tensor(y);
    mpr_tensor_release(y);
    return MPR_OK;
}

/* [x (CPU)] -> to_cpu(tanh(to_gpu(x) @ to_gpu(x))): the callee's GPU in between. */
static mpr_err_t fn_via_gpu(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    mpr_tensor_t *x;
    mpr_err_t e = mpr_args_tensor(args, 0, &x);
    if (e) return e;
    mpr_scope_begin();
    mpr_tensor_t *xd = mpr_to_device(x, 0);
    mpr_tensor_t *y = xd ? mpr_to_device(mpr_tanh(mpr_matmul(xd, xd)), -1) : NULL;
    if (y) *result = mpr_value_new_tensor(y);
    mpr_scope_end();
    return y ? MPR_OK : mpr_last_error_code();
}

static mpr_value_t *call(int rank, const char *fn, mpr_value_t *args) {
    mpr_value_t *r = NULL;
    CHECK_OK(mpr_rpc_sync_take(mpr_to_rank(rank), fn, args, 60, &r));
    return r;
}

static mpr_tensor_t *item_tensor(const mpr_value_t *list, size_t i) {
    mpr_tensor_t *t = NULL;
    CHECK_OK(mpr_args_tensor(list, i, &t));
    return t;
}

static void round_trip_to(int peer) {
    mpr_tensor_t *a_cpu = cpu_filled(3, 5, 0.1), *b = cpu_filled(2, 2, 0.7);
    mpr_tensor_t *a = leaf_on(a_cpu, 0, false);
    mpr_value_t *r = call(peer, "inspect", mpr_value_list_of(2, mpr_value_new_tensor(a), mpr_value_new_tensor(b)));
    int64_t da = -9, db = -9;
    CHECK_OK(mpr_args_int(r, 0, &da));
    CHECK_OK(mpr_args_int(r, 1, &db));
    CHECK(da == 0 && db == -1);
    mpr_tensor_t *a2 = item_tensor(r, 2), *b1 = item_tensor(r, 3);
    CHECK(mpr_tensor_device(a2) == 0 && mpr_tensor_device(b1) == -1);
    check_close(a2, a_cpu, 2.0, "2a back from the peer");
    const float *bv = mpr_tensor_data(b1), *bw = mpr_tensor_data(b);
    for (int i = 0; i < 4; i++) CHECK(fabsf(bv[i] - (bw[i] + 1.0f)) < 1e-6f);
    mpr_value_release(r);
    mpr_tensor_release(a);
    mpr_tensor_release(a_cpu);
    mpr_tensor_release(b);
}

static void test_round_trip(void) {
    if (me != 0) return;
    round_trip_to(1);
}

static void test_self_call(void) {
    if (me != 0) return;
    round_trip_to(0);
}

static void test_dist_autograd_gpu_parameter(void) {
    if (me != 0) return;
    mpr_tensor_t *w_cpu = cpu_filled(4, 4, 0.3);
    mpr_tensor_t *w = leaf_on(w_cpu, 0, true);
    int64_t ctx;
    CHECK_OK(mpr_dist_context_begin(&ctx));
    mpr_scope_begin();
    mpr_value_t *r = call(1, "square", mpr_value_list_of(1, mpr_value_new_tensor(w)));
    mpr_tensor_t *y = NULL;
    CHECK_OK(mpr_value_get_tensor(r, &y)); /* the function returns a tensor, not a list */
    CHECK(mpr_tensor_device(y) == 0);
    mpr_tensor_t *loss = mpr_sum(mpr_tanh(y));
    CHECK_OK(mpr_dist_backward(ctx, &loss, 1, false));
    mpr_value_release(r);
    mpr_scope_end();
    mpr_tensor_t *g = NULL;
    CHECK_OK(mpr_dist_get_gradient(ctx, w, &g));
    CHECK(g != NULL && mpr_tensor_device(g) == 0);
    CHECK_OK(mpr_dist_context_end(ctx));
    /* the same computation, locally on the GPU */
    mpr_scope_begin();
    CHECK_OK(mpr_backward(mpr_sum(mpr_tanh(mpr_matmul(w, w))), NULL, false));
    mpr_scope_end();
    check_close(g, mpr_tensor_grad(w), 1.0, "dL/dw (cuda:0) vs local");
    mpr_tensor_release(g);
    mpr_tensor_release(w);
    mpr_tensor_release(w_cpu);
}

static void test_dist_autograd_callee_gpu(void) {
    if (me != 0) return;
    mpr_tensor_t *x = cpu_filled(3, 3, 1.1);
    CHECK_OK(mpr_set_requires_grad(x, true));
    int64_t ctx;
    CHECK_OK(mpr_dist_context_begin(&ctx));
    mpr_scope_begin();
    mpr_value_t *r = call(1, "via_gpu", mpr_value_list_of(1, mpr_value_new_tensor(x)));
    mpr_tensor_t *y = NULL;
    CHECK_OK(mpr_value_get_tensor(r, &y));
    CHECK(mpr_tensor_device(y) == -1);
    mpr_tensor_t *loss = mpr_sum(mpr_mul(y, y));
    CHECK_OK(mpr_dist_backward(ctx, &loss, 1, false));
    mpr_value_release(r);
    mpr_scope_end();
    mpr_tensor_t *g = NULL;
    CHECK_OK(mpr_dist_get_gradient(ctx, x, &g));
    CHECK(g != NULL && mpr_tensor_device(g) == -1);
    CHECK_OK(mpr_dist_context_end(ctx));
    mpr_scope_begin();
    mpr_tensor_t *yy = mpr_tanh(mpr_matmul(x, x));
    CHECK_OK(mpr_backward(mpr_sum(mpr_mul(yy, yy)), NULL, false));
    mpr_scope_end();
    check_close(g, mpr_tensor_grad(x), 1.0, "dL/dx through the callee's GPU vs local");
    mpr_tensor_release(g);
    mpr_tensor_release(x);
}

/* args [in, out, seed] -> "Affine": weight [out, in] and bias [out] of
 * sin(seed + 0.37 i) / 2, built on the CPU and moved to `device`;
 * forward = linear(x, weight, bias). */
static mpr_tensor_t *affine_forward(mpr_module_t *self, mpr_tensor_t *x, void *ctx) {
    (void)ctx;
    return mpr_linear(x, mpr_module_get_parameter(self, "weight"), mpr_module_get_parameter(self, "bias"));
}

static mpr_module_t *make_affine(const mpr_value_t *args, int device, void *user_data) {
    (void)user_data;
    int64_t in, out, seed;
    if (mpr_args_int(args, 0, &in) || mpr_args_int(args, 1, &out) || mpr_args_int(args, 2, &seed)) return NULL;
    mpr_module_t *m = mpr_module_create("Affine", affine_forward, NULL, NULL);
    mpr_err_t e = m ? MPR_OK : mpr_last_error_code();
    const char *names[2] = {"weight", "bias"};
    const int64_t shapes[2][2] = {{out, in}, {out, 0}};
    for (int k = 0; k < 2 && !e; k++) {
        mpr_tensor_t *cpu = mpr_tensor_empty(MPR_F32, 2 - k, shapes[k]);
        if (!cpu) {
            e = mpr_last_error_code();
            break;
        }
        float *d = mpr_tensor_data(cpu);
        for (int64_t i = 0; i < mpr_tensor_numel(cpu); i++) d[i] = 0.5f * (float)sin((double)(seed + k) + 0.37 * (double)i);
        mpr_tensor_t *on = leaf_on(cpu, device, true);
        mpr_tensor_release(cpu);
        e = mpr_module_add_parameter(m, names[k], on);
        mpr_tensor_release(on);
    }
    if (e) {
        mpr_module_destroy(m);
        return NULL;
    }
    return m;
}

static void test_remote_module_on_gpu_trains(void) {
    if (me != 0) return;
    mpr_value_t *args = mpr_value_list_of(3, mpr_value_new_int(6), mpr_value_new_int(3), mpr_value_new_int(5));
    mpr_remote_module_t *rm = mpr_remote_module_create("worker1/cuda:0", "affine", args);
    mpr_module_t *local = make_affine(args, -1, NULL);
    mpr_value_release(args);
    CHECK(rm && local);
    mpr_rref_t **params;
    int np;
    CHECK_OK(mpr_remote_module_remote_parameters(rm, &params, &np));
    CHECK(np == 2);
    mpr_optim_options_t o;
    mpr_optim_options_default("adam", &o);
    o.lr = 0.01;
    o.amsgrad = true;
    o.weight_decay = 0.01;
    mpr_dist_optimizer_t *dopt = mpr_dist_optimizer_create("adam", &o, params, np);
    CHECK(dopt != NULL);
    mpr_tensor_t *lp[2] = {mpr_module_get_parameter(local, "weight"), mpr_module_get_parameter(local, "bias")};
    mpr_optimizer_t *lopt = mpr_optimizer_create("adam", lp, 2, &o);
    CHECK(lopt != NULL);
    mpr_tensor_t *x = cpu_filled(4, 6, 2.0), *target = cpu_filled(4, 3, 0.9);
    for (int step = 0; step < 10; step++) {
        int64_t ctx;
        CHECK_OK(mpr_dist_context_begin(&ctx));
        mpr_scope_begin();
        mpr_tensor_t *y = NULL;
        CHECK_OK(mpr_remote_module_forward(rm, x, &y));
        CHECK(mpr_tensor_device(y) == -1); /* the output comes back to the input's device */
        mpr_tensor_t *loss = mpr_mse_loss(y, target);
        CHECK_OK(mpr_dist_backward(ctx, &loss, 1, false));
        CHECK_OK(mpr_dist_optimizer_step(dopt, ctx));
        mpr_tensor_release(y);
        mpr_scope_end();
        CHECK_OK(mpr_dist_context_end(ctx));
        mpr_scope_begin();
        mpr_optimizer_zero_grad(lopt);
        CHECK_OK(mpr_backward(mpr_mse_loss(mpr_module_forward(local, x), target), NULL, false));
        CHECK_OK(mpr_optimizer_step(lopt));
        mpr_scope_end();
    }
    for (int i = 0; i < 2; i++) {
        mpr_value_t *v = NULL;
        mpr_tensor_t *t;
        CHECK_OK(mpr_rref_to_here(params[i], 60, &v));
        CHECK_OK(mpr_value_get_tensor(v, &t));
        CHECK(mpr_tensor_device(t) == 0);
        check_close(t, lp[i], 1.0, "RemoteModule on cuda:0 after 10 Adam steps vs local CPU");
        mpr_value_release(v);
        mpr_rref_release(params[i]);
    }
    free(params);
    printf("RemoteModule on worker1/cuda:0: 10 DistributedOptimizer Adam steps equal the local CPU model\n");
    mpr_dist_optimizer_destroy(dopt);
    mpr_optimizer_destroy(lopt);
    mpr_module_destroy(local);
    mpr_remote_module_destroy(rm);
    mpr_tensor_release(x);
    mpr_tensor_release(target);
}

int main(int argc, char **argv) {
    CHECK_OK(mpr_register_function("inspect", fn_inspect, NULL));
    CHECK_OK(mpr_register_function("square", fn_square, NULL));
    CHECK_OK(mpr_register_function("via_gpu", fn_via_gpu, NULL));
    CHECK_OK(mpr_register_module_kind("affine", make_affine, NULL));
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = &argc;
    opts.argv = &argv;
    CHECK_OK(mpr_init(&opts));
    me = mpitest_rank();
    CHECK(mpr_world_size() == 2);
    int have = mpr_cuda_device_count() > 0, all = 0;
    MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
    if (!all) {
        if (me == 0)
            printf("skipping: %s\n", mpr_cuda_is_built() ? "no CUDA device visible on every rank"
                                                         : "mpirpc built without CUDA (-DMPIRPC_CUDA=ON)");
        CHECK_OK(mpr_shutdown(true));
        return 77;
    }
    RUN_TEST(test_round_trip);
    RUN_TEST(test_self_call);
    RUN_TEST(test_dist_autograd_gpu_parameter);
    RUN_TEST(test_dist_autograd_callee_gpu);
    RUN_TEST(test_remote_module_on_gpu_trains);
    CHECK_OK(mpr_shutdown(true));
    MPITEST_REPORT();
    return 0;
}
