/* test_remote_module.c — RemoteModule (mpirpc/remote_module.h) with 3 ranks:
 * a model of two Linear layers on ranks 1 and 2, driven by rank 0, trained
 * for 20 steps with dist autograd and a DistributedOptimizer over
 * remote_parameters, ends with the same parameters (f64, 1e-9) as the same
 * model trained locally; a RemoteModule sent to another worker as a value
 * is used there; train/eval reach the owner; creating modules does not wait
 * for their constructors; misuse (unknown kind, bad
 * device string, unknown worker) gives clear errors naming the owner; a
 * module stays usable by any worker holding it after its creator released
 * its handle, and a handle kept past mpr_shutdown fails cleanly. */
#include <math.h>
#include <stdatomic.h>
#include <unistd.h>

#include "mpitest.h"

static int me;

/* args [in, out, seed] -> Linear(in, out) in f64, seeded */
static mpr_module_t *make_linear(const mpr_value_t *args, int device, void *user_data) {
    (void)user_data;
    int64_t in, out, seed;
    if (mpr_args_int(args, 0, &in) || mpr_args_int(args, 1, &out) || mpr_args_int(args, 2, &seed)) return NULL;
    if (device >= 0) {
        mpr_error_set(MPR_ERR_UNSUPPORTED, "this test builds CPU modules only");
        return NULL;
    }
    mpr_generator_t *g = mpr_generator_create((uint64_t)seed);
    mpr_module_t *m = mpr_linear_create(in, out, true, MPR_F64, g);
    mpr_generator_destroy(g);
    return m;
}

/* A constructor that waits until the test opens a gate on its worker:
 * creating a module must not wait for its constructor. */
static atomic_bool gate_open;

static mpr_module_t *make_gated_linear(const mpr_value_t *args, int device, void *user_data) {
    while (!atomic_load(&gate_open)) usleep(1000);
    return make_linear(args, device, user_data);
}

static mpr_value_t *linear_args(int in, int out, int seed) {
    return mpr_value_list_of(3, mpr_value_new_int(in), mpr_value_new_int(out), mpr_value_new_int(seed));
}

static mpr_tensor_t *input(void) {
    int64_t shape[2] = {5, 12};
    mpr_tensor_t *x = mpr_tensor_empty(MPR_F64, 2, shape);
    double *d = mpr_tensor_data(x);
    for (int i = 0; i < 60; i++) d[i] = sin(0.3 * i);
    return x;
}

static mpr_tensor_t *labels(void) {
    int64_t shape[1] = {5};
    mpr_tensor_t *y = mpr_tensor_empty(MPR_I64, 1, shape);
    int64_t *d = mpr_tensor_data(y);
    for (int i = 0; i < 5; i++) d[i] = (i * 3) % 10;
    return y;
}

/* [remote module value, x] -> its forward, run from this worker */
static mpr_err_t fn_use_module(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    mpr_remote_module_t *rm = mpr_remote_module_from_value(mpr_value_list_get(args, 0));
    if (!rm) return mpr_last_error_code();
    mpr_tensor_t *x, *y = NULL;
    mpr_err_t e = mpr_args_tensor(args, 1, &x);
    if (!e) e = mpr_remote_module_forward(rm, x, &y);
    if (!e) *result = mpr_value_new_tensor(y);
    mpr_tensor_release(y);
    mpr_remote_module_destroy(rm);
    return e;
}

static void check_close(const mpr_tensor_t *got, const mpr_tensor_t *want, const char *what) {
    CHECK(mpr_tensor_numel(got) == mpr_tensor_numel(want));
    const double *a = mpr_tensor_data((mpr_tensor_t *)got), *b = mpr_tensor_data((mpr_tensor_t *)want);
    for (int64_t i = 0; i < mpr_tensor_numel(got); i++)
        if (fabs(a[i] - b[i]) > 1e-9 * fmax(1.0, fabs(b[i]))) {
            fprintf(stderr, "%s: element %lld: %.17g vs local %.17g\n", what, (long long)i, a[i], b[i]);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
}

static void test_train_two_remote_layers(void) {
    if (me != 0) return;
    mpr_value_t *a1 = linear_args(12, 16, 1), *a2 = linear_args(16, 10, 2);
    mpr_remote_module_t *l1 = mpr_remote_module_create("worker1/cpu", "linear", a1);
    mpr_remote_module_t *l2 = mpr_remote_module_create("worker2/cpu", "linear", a2);
    CHECK(l1 && l2);
    mpr_module_t *m1 = make_linear(a1, -1, NULL), *m2 = make_linear(a2, -1, NULL);
    mpr_value_release(a1);
    mpr_value_release(a2);
    mpr_rref_t **p1, **p2;
    int n1, n2;
    CHECK_OK(mpr_remote_module_remote_parameters(l1, &p1, &n1));
    CHECK_OK(mpr_remote_module_remote_parameters(l2, &p2, &n2));
    CHECK(n1 == 2 && n2 == 2);
    mpr_rref_t *all[4] = {p1[0], p1[1], p2[0], p2[1]};
    mpr_optim_options_t o;
    mpr_optim_options_default("sgd", &o);
    o.lr = 0.1;
    mpr_dist_optimizer_t *dopt = mpr_dist_optimizer_create("sgd", &o, all, 4);
    CHECK(dopt != NULL);
    CHECK(mpr_dist_optimizer_num_owners(dopt) == 2);
    mpr_tensor_t *lp[4] = {mpr_module_parameter(m1, 0, NULL), mpr_module_parameter(m1, 1, NULL),
                           mpr_module_parameter(m2, 0, NULL), mpr_module_parameter(m2, 1, NULL)};
    mpr_optimizer_t *lopt = mpr_optimizer_create("sgd", lp, 4, &o);
    CHECK(lopt != NULL);
    mpr_tensor_t *x = input(), *y = labels();
    for (int step = 0; step < 20; step++) {
        int64_t ctx;
        CHECK_OK(mpr_dist_context_begin(&ctx));
        mpr_scope_begin();
        mpr_tensor_t *h = NULL, *out = NULL;
        CHECK_OK(mpr_remote_module_forward(l1, x, &h));
        mpr_tensor_t *a = mpr_relu(h);
        mpr_future_t *f = mpr_remote_module_forward_async(l2, a); /* the async form */
        mpr_value_t *v = NULL;
        CHECK_OK(mpr_future_get(f, 60, &v));
        CHECK_OK(mpr_value_get_tensor(v, &out));
        mpr_tensor_t *loss = mpr_cross_entropy(out, y);
        CHECK_OK(mpr_dist_backward(ctx, &loss, 1, false));
        CHECK_OK(mpr_dist_optimizer_step(dopt, ctx));
        mpr_value_release(v);
        mpr_future_release(f);
        mpr_tensor_release(h);
        mpr_scope_end();
        CHECK_OK(mpr_dist_context_end(ctx));
        /* locally */
        mpr_scope_begin();
        mpr_optimizer_zero_grad(lopt);
        mpr_tensor_t *ll = mpr_cross_entropy(mpr_module_forward(m2, mpr_relu(mpr_module_forward(m1, x))), y);
        CHECK_OK(mpr_backward(ll, NULL, false));
        CHECK_OK(mpr_optimizer_step(lopt));
        mpr_scope_end();
    }
    for (int i = 0; i < 4; i++) {
        mpr_value_t *v = NULL;
        mpr_tensor_t *t;
        CHECK_OK(mpr_rref_to_here(all[i], 60, &v));
        CHECK_OK(mpr_value_get_tensor(v, &t));
        check_close(t, lp[i], "RemoteModule parameter after 20 steps");
        mpr_value_release(v);
    }
    printf("two RemoteModule Linear layers on ranks 1 and 2: 20 steps equal the local model\n");
    /* eval/train reach the owner */
    CHECK_OK(mpr_remote_module_train(l1, false));
    CHECK_OK(mpr_remote_module_train(l1, true));
    /* sent to rank 2 as a value and used there */
    mpr_value_t *r = NULL;
    CHECK_OK(mpr_rpc_sync_take(mpr_to_rank(2), "use_module",
                               mpr_value_list_of(2, mpr_value_new_remote_module(l1), mpr_value_new_tensor(x)), 60, &r));
    mpr_tensor_t *remote_out;
    CHECK_OK(mpr_value_get_tensor(r, &remote_out));
    mpr_scope_begin();
    check_close(remote_out, mpr_module_forward(m1, x), "forward of a RemoteModule used on another worker");
    mpr_scope_end();
    mpr_value_release(r);
    for (int i = 0; i < 2; i++) {
        mpr_rref_release(p1[i]);
        mpr_rref_release(p2[i]);
    }
    free(p1);
    free(p2);
    mpr_dist_optimizer_destroy(dopt);
    mpr_optimizer_destroy(lopt);
    mpr_module_destroy(m1);
    mpr_module_destroy(m2);
    mpr_tensor_release(x);
    mpr_tensor_release(y);
    mpr_remote_module_destroy(l1);
    mpr_remote_module_destroy(l2);
}

/* Creating modules does not wait for their construction (pytorch#58098):
 * three modules whose constructors block until worker1's main thread opens
 * a gate are all created first (a creation that waited would never return:
 * the test would time out); then rank 0 tells rank 1's main thread over
 * plain MPI to open the gate (no pool thread needed), and each module
 * works. */
static void test_creation_does_not_wait(void) {
    if (me == 1) { /* the gate's keeper: open it when rank 0 says so */
        int go = 0;
        MPI_Request req;
        MPI_Irecv(&go, 1, MPI_INT, 0, 91, MPI_COMM_WORLD, &req);
        for (int done = 0; !done;) {
            MPI_Test(&req, &done, MPI_STATUS_IGNORE);
            if (!done) usleep(1000);
        }
        atomic_store(&gate_open, true);
    }
    if (me != 0) return;
    mpr_remote_module_t *rms[3];
    mpr_value_t *a = linear_args(12, 4, 3);
    for (int i = 0; i < 3; i++) CHECK((rms[i] = mpr_remote_module_create("worker1/cpu", "gated_linear", a)) != NULL);
    mpr_value_release(a);
    int go = 1;
    MPI_Send(&go, 1, MPI_INT, 1, 91, MPI_COMM_WORLD);
    mpr_tensor_t *x = input();
    for (int i = 0; i < 3; i++) {
        mpr_tensor_t *y = NULL;
        CHECK_OK(mpr_remote_module_forward(rms[i], x, &y));
        CHECK(mpr_tensor_numel(y) == 5 * 4);
        mpr_tensor_release(y);
        mpr_remote_module_destroy(rms[i]);
    }
    mpr_tensor_release(x);
}

static void test_misuse(void) {
    if (me != 0) return;
    CHECK(mpr_remote_module_create("worker1/gpu", "linear", NULL) == NULL);
    CHECK(mpr_last_error_code() == MPR_ERR_INVALID_ARG);
    CHECK_CONTAINS(mpr_last_error(), "bad device");
    CHECK(mpr_remote_module_create("worker1", "linear", NULL) == NULL);
    CHECK(mpr_last_error_code() == MPR_ERR_INVALID_ARG);
    CHECK(mpr_remote_module_create("nobody/cpu", "linear", NULL) == NULL);
    CHECK_CONTAINS(mpr_last_error(), "nobody");
    /* creation does not wait: an unknown kind shows at first use, naming the owner */
    mpr_remote_module_t *rm = mpr_remote_module_create("worker1/cpu", "no_such_kind", NULL);
    CHECK(rm != NULL);
    mpr_tensor_t *x = input(), *y = (mpr_tensor_t *)1;
    CHECK(mpr_remote_module_forward(rm, x, &y) != MPR_OK);
    CHECK(y == NULL);
    CHECK_CONTAINS(mpr_last_error(), "worker1");
    CHECK_CONTAINS(mpr_last_error(), "no_such_kind");
    mpr_remote_module_destroy(rm);
    /* a constructor that fails on the owner: its error, at first use */
    rm = mpr_remote_module_create("worker2/cuda:99", "linear", NULL); /* no such device, GPU or not */
    CHECK(rm != NULL);
    CHECK(mpr_remote_module_forward(rm, x, &y) != MPR_OK);
    CHECK_CONTAINS(mpr_last_error(), "worker2");
    mpr_remote_module_destroy(rm);
    CHECK_ERR(mpr_register_module_kind("linear", make_linear, NULL), MPR_ERR_EXISTS);
    mpr_tensor_release(x);
}

/* The creator sends the module to worker2 and destroys its own handle at
 * once: worker2's copy keeps the module alive (the RRef protocol), and its
 * forward equals the module's, computed locally from the same seed. */
static void test_forward_after_creator_released(void) {
    if (me != 0) return;
    mpr_value_t *a = linear_args(12, 4, 77);
    mpr_remote_module_t *rm = mpr_remote_module_create("worker1/cpu", "linear", a);
    mpr_value_release(a);
    CHECK(rm != NULL);
    mpr_value_t *v = mpr_value_new_remote_module(rm);
    mpr_remote_module_destroy(rm); /* released before anyone used it */
    mpr_tensor_t *x = input();
    mpr_value_t *r = NULL;
    CHECK_OK(mpr_rpc_sync_take(mpr_to_name("worker2"), "use_module",
                               mpr_value_list_of(2, v, mpr_value_new_tensor(x)), 60, &r));
    mpr_tensor_t *y;
    CHECK_OK(mpr_value_get_tensor(r, &y));
    a = linear_args(12, 4, 77);
    mpr_module_t *local = make_linear(a, -1, NULL);
    mpr_value_release(a);
    mpr_tensor_t *want = mpr_module_forward(local, x);
    check_close(y, want, "forward through a released creator's module");
    mpr_tensor_release(want);
    mpr_module_destroy(local);
    mpr_value_release(r);
    mpr_tensor_release(x);
}

int main(int argc, char **argv) {
    CHECK_OK(mpr_register_module_kind("linear", make_linear, NULL));
    CHECK_OK(mpr_register_module_kind("gated_linear", make_gated_linear, NULL));
    CHECK_OK(mpr_register_function("use_module", fn_use_module, NULL));
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = &argc;
    opts.argv = &argv;
    CHECK_OK(mpr_init(&opts));
    me = mpitest_rank();
    CHECK(mpr_world_size() == 3);
    RUN_TEST(test_train_two_remote_layers);
    RUN_TEST(test_creation_does_not_wait);
    RUN_TEST(test_misuse);
    RUN_TEST(test_forward_after_creator_released);
    /* a handle kept past shutdown: forward fails with a clear error, destroy is safe */
    mpr_remote_module_t *kept = NULL;
    if (me == 0) {
        mpr_value_t *a = linear_args(12, 4, 5);
        kept = mpr_remote_module_create("worker1/cpu", "linear", a);
        mpr_value_release(a);
        CHECK(kept != NULL);
    }
    CHECK_OK(mpr_shutdown(true));
    if (kept) {
        mpr_tensor_t *x = input(), *y = NULL;
        CHECK(mpr_remote_module_forward(kept, x, &y) == MPR_ERR_SHUTDOWN);
        CHECK(y == NULL);
        mpr_future_t *f = mpr_remote_module_forward_async(kept, x);
        CHECK(f != NULL && mpr_future_done(f) && mpr_future_error(f) == MPR_ERR_SHUTDOWN);
        mpr_future_release(f);
        mpr_remote_module_destroy(kept);
        mpr_tensor_release(x);
    }
    MPITEST_REPORT();
    return 0;
}
