/* test_dist_optim.c — DistributedOptimizer (mpirpc/dist_optim.h) with 4
 * ranks: parameters on 3 owners (ranks 1-3), a driver on rank 0, trained
 * for 5 steps with dist autograd, equal (f64, 1e-9 relative) to a local
 * optimizer of the same kind run by rank 0 over copies of the same
 * parameters with the same gradients; two trainers stepping one owner's
 * parameter at once lose no update (the result is one of the two serial
 * orders); the state checkpoint (export/save/load/import) reads like a
 * local optimizer's over the same list, a restored optimizer continues
 * exactly, and an import one owner rejects changes no owner; misuse and
 * failures give errors naming the owner; nothing leaks. */
#include <math.h>
#include <unistd.h>

#include "mpitest.h"

static int me;
static mpr_tensor_t *param; /* this owner's parameter (ranks 1-3) */

static mpr_tensor_t *filled(int64_t r, int64_t c, double seed, bool requires_grad) {
    int64_t shape[2] = {r, c};
    mpr_tensor_t *t = mpr_tensor_empty(MPR_F64, 2, shape);
    double *d = mpr_tensor_data(t);
    for (int64_t i = 0; i < r * c; i++) d[i] = sin(seed + 0.37 * (double)i);
    if (requires_grad) CHECK_OK(mpr_set_requires_grad(t, true));
    return t;
}

/* [seed] -> RRef to a new parameter owned here (also kept in `param`) */
static mpr_err_t fn_make_param(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    int64_t seed;
    mpr_err_t e = mpr_args_int(args, 0, &seed);
    if (e) return e;
    mpr_tensor_release(param);
    param = filled(3, 3, (double)seed, true);
    mpr_value_t *v = mpr_value_new_tensor(param);
    mpr_rref_t *r = mpr_rref_create_local(v);
    mpr_value_release(v);
    if (!r) return mpr_last_error_code();
    *result = mpr_value_new_rref(r);
    mpr_rref_release(r);
    return MPR_OK;
}

/* [x] -> param @ x */
static mpr_err_t fn_apply(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    mpr_tensor_t *x;
    mpr_err_t e = mpr_args_tensor(args, 0, &x);
    if (e) return e;
    mpr_tensor_t *y = mpr_matmul(param, x);
    *result = mpr_value_new_tensor(y);
    mpr_tensor_release(y);
    return MPR_OK;
}

/* [] -> a detached copy of param */
static mpr_err_t fn_get_param(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    (void)args;
    mpr_tensor_t *c = mpr_detach(param);
    *result = mpr_value_new_tensor(c);
    mpr_tensor_release(c);
    return MPR_OK;
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

static mpr_rref_t *make_param(int owner, int seed) {
    mpr_value_t *r = NULL;
    CHECK_OK(mpr_rpc_sync_take(mpr_to_rank(owner), "make_param", mpr_value_list_of(1, mpr_value_new_int(seed)), 60, &r));
    mpr_rref_t *rr;
    CHECK_OK(mpr_value_get_rref(r, &rr));
    mpr_rref_retain(rr);
    mpr_value_release(r);
    return rr;
}

static void check_close(const mpr_tensor_t *got, const mpr_tensor_t *want, double rtol, const char *what) {
    const double *a = mpr_tensor_data((mpr_tensor_t *)got), *b = mpr_tensor_data((mpr_tensor_t *)want);
    for (int64_t i = 0; i < mpr_tensor_numel(got); i++)
        if (fabs(a[i] - b[i]) > rtol * fmax(1.0, fabs(b[i]))) {
            fprintf(stderr, "[rank %d] %s: element %lld: %.17g vs %.17g\n", me, what, (long long)i, a[i], b[i]);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
}

/* 5 steps over parameters on ranks 1-3 vs the same locally, for `kind`. */
static void train_and_compare(const char *kind) {
    if (me != 0) return;
    mpr_optim_options_t o;
    mpr_optim_options_default(kind, &o);
    o.lr = 0.05;
    if (strcmp(kind, "sgd") == 0) o.momentum = 0.9;
    mpr_rref_t *rrefs[3];
    mpr_tensor_t *local[3];
    for (int r = 1; r <= 3; r++) {
        rrefs[r - 1] = make_param(r, r);
        local[r - 1] = filled(3, 3, (double)r, true);
    }
    mpr_dist_optimizer_t *dopt = mpr_dist_optimizer_create(kind, &o, rrefs, 3);
    CHECK(dopt != NULL);
    CHECK(mpr_dist_optimizer_num_owners(dopt) == 3);
    mpr_optimizer_t *lopt = mpr_optimizer_create(kind, local, 3, &o);
    CHECK(lopt != NULL);
    for (int step = 0; step < 5; step++) {
        mpr_tensor_t *x = filled(3, 2, 0.3 * step, false);
        int64_t ctx;
        CHECK_OK(mpr_dist_context_begin(&ctx));
        mpr_scope_begin();
        mpr_tensor_t *loss = NULL;
        for (int r = 1; r <= 3; r++) {
            mpr_tensor_t *y = call_tensor(r, "apply", mpr_value_list_of(1, mpr_value_new_tensor(x)));
            mpr_tensor_t *l = mpr_sum(mpr_tanh(mpr_mul_scalar(y, (double)r)));
            loss = loss ? mpr_add(loss, l) : l;
            mpr_tensor_release(y);
        }
        CHECK_OK(mpr_dist_backward(ctx, &loss, 1, false));
        CHECK_OK(mpr_dist_optimizer_step(dopt, ctx));
        mpr_scope_end();
        CHECK_OK(mpr_dist_context_end(ctx));
        /* the same step locally */
        mpr_scope_begin();
        mpr_optimizer_zero_grad(lopt);
        mpr_tensor_t *ll = NULL;
        for (int r = 1; r <= 3; r++) {
            mpr_tensor_t *l = mpr_sum(mpr_tanh(mpr_mul_scalar(mpr_matmul(local[r - 1], x), (double)r)));
            ll = ll ? mpr_add(ll, l) : l;
        }
        CHECK_OK(mpr_backward(ll, NULL, false));
        CHECK_OK(mpr_optimizer_step(lopt));
        mpr_scope_end();
        mpr_tensor_release(x);
    }
    for (int r = 1; r <= 3; r++) {
        mpr_tensor_t *got = call_tensor(r, "get_param", mpr_value_new_list());
        check_close(got, local[r - 1], 1e-9, kind);
        mpr_tensor_release(got);
        mpr_rref_release(rrefs[r - 1]);
        mpr_tensor_release(local[r - 1]);
    }
    mpr_optimizer_destroy(lopt);
    mpr_dist_optimizer_destroy(dopt);
    printf("DistributedOptimizer(%s) over 3 owners: 5 steps equal the local optimizer\n", kind);
}

static void test_sgd_momentum(void) { train_and_compare("sgd"); }
static void test_adam(void) { train_and_compare("adam"); }

/* Trainers on ranks 0 and 2 step rank 1's parameter at once (plain SGD):
 * both gradients are computed from the same parameter, so the result must
 * be w - lr*gA - lr*gB in one of the two orders, never a lost update. */
static mpr_rref_t *shared;

/* [rref] -> none: keep the RRef (rank 2 gets rank 0's parameter RRef) */
static mpr_err_t fn_take_shared(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    mpr_rref_t *r;
    mpr_err_t e = mpr_args_rref(args, 0, &r);
    if (e) return e;
    shared = mpr_rref_retain(r);
    *result = mpr_value_new_none();
    return MPR_OK;
}

static void test_concurrent_trainers(void) {
    mpr_tensor_t *w0 = filled(3, 3, 7.0, false);
    if (me == 0) {
        shared = make_param(1, 7);
        mpr_value_t *r = NULL;
        CHECK_OK(mpr_rpc_sync_take(mpr_to_rank(2), "take_shared", mpr_value_list_of(1, mpr_value_new_rref(shared)), 60,
                                   &r));
        mpr_value_release(r);
    }
    mpitest_barrier();
    mpr_tensor_t *x = filled(3, 2, me == 0 ? 0.5 : 1.5, false), *g = NULL;
    mpr_dist_optimizer_t *dopt = NULL;
    int64_t ctx = 0;
    if (me == 0 || me == 2) {
        mpr_optim_options_t o;
        mpr_optim_options_default("sgd", &o);
        o.lr = 0.1;
        dopt = mpr_dist_optimizer_create("sgd", &o, &shared, 1);
        CHECK(dopt != NULL);
        CHECK_OK(mpr_dist_context_begin(&ctx));
        mpr_tensor_t *y = call_tensor(1, "apply", mpr_value_list_of(1, mpr_value_new_tensor(x)));
        mpr_scope_begin(); /* the op results below */
        mpr_tensor_t *loss = mpr_sum(mpr_mul(y, y));
        CHECK_OK(mpr_dist_backward(ctx, &loss, 1, false));
        mpr_scope_end();
        mpr_tensor_release(y);
        /* this trainer's gradient, computed locally: 2 (w0 x) x^T */
        bool prev = mpr_set_grad_enabled(false);
        mpr_tensor_t *wx = mpr_matmul(w0, x), *xt = mpr_transpose(x, 0, 1);
        mpr_tensor_t *p = mpr_matmul(wx, xt);
        g = mpr_mul_scalar(p, 2.0);
        mpr_tensor_release(wx);
        mpr_tensor_release(xt);
        mpr_tensor_release(p);
        mpr_set_grad_enabled(prev);
    }
    mpitest_barrier(); /* both forwards done before either step */
    if (dopt) {
        CHECK_OK(mpr_dist_optimizer_step(dopt, ctx));
        CHECK_OK(mpr_dist_context_end(ctx));
    }
    mpitest_barrier();
    /* rank 0 gathers rank 2's gradient and checks rank 1's parameter */
    if (me == 2) MPI_Send(mpr_tensor_data(g), 9, MPI_DOUBLE, 0, 77, MPI_COMM_WORLD);
    if (me == 0) {
        mpr_tensor_t *gb = filled(3, 3, 0, false);
        MPI_Recv(mpr_tensor_data(gb), 9, MPI_DOUBLE, 2, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        mpr_tensor_t *got = call_tensor(1, "get_param", mpr_value_new_list());
        const double *w = mpr_tensor_data(w0), *a = mpr_tensor_data(g), *b = mpr_tensor_data(gb),
                     *r = mpr_tensor_data(got);
        for (int i = 0; i < 9; i++) {
            double ab = (w[i] - 0.1 * a[i]) - 0.1 * b[i], ba = (w[i] - 0.1 * b[i]) - 0.1 * a[i];
            if (r[i] != ab && r[i] != ba) {
                fprintf(stderr, "element %d: %.17g is neither serial order (%.17g, %.17g)\n", i, r[i], ab, ba);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        }
        mpr_tensor_release(got);
        mpr_tensor_release(gb);
    }
    mpr_tensor_release(g);
    mpr_tensor_release(x);
    mpr_tensor_release(w0);
    mpr_dist_optimizer_destroy(dopt);
    mpr_rref_release(shared);
    shared = NULL;
}

static void test_failures_name_the_owner(void) {
    if (me != 0) return;
    mpr_optim_options_t o;
    mpr_optim_options_default("sgd", &o);
    o.lr = 0.1;
    mpr_rref_t *p = make_param(3, 1);
    /* an unknown kind: creation is asynchronous, the step names the owner */
    mpr_dist_optimizer_t *bad = mpr_dist_optimizer_create("no_such_optimizer", &o, &p, 1);
    CHECK(bad != NULL);
    int64_t ctx;
    CHECK_OK(mpr_dist_context_begin(&ctx));
    CHECK(mpr_dist_optimizer_step(bad, ctx) != MPR_OK);
    CHECK_CONTAINS(mpr_last_error(), "worker3");
    CHECK_CONTAINS(mpr_last_error(), "no_such_optimizer");
    mpr_dist_optimizer_destroy(bad);
    /* a context without backward: no gradient there */
    mpr_dist_optimizer_t *opt = mpr_dist_optimizer_create("sgd", &o, &p, 1);
    CHECK(opt != NULL);
    CHECK(mpr_dist_optimizer_step(opt, ctx) != MPR_OK);
    CHECK_CONTAINS(mpr_last_error(), "worker3");
    CHECK_CONTAINS(mpr_last_error(), "no gradient");
    CHECK_OK(mpr_dist_context_end(ctx));
    /* a dead context */
    CHECK(mpr_dist_optimizer_step(opt, ctx) != MPR_OK);
    CHECK_CONTAINS(mpr_last_error(), "worker3");
    mpr_dist_optimizer_destroy(opt);
    CHECK(mpr_dist_optimizer_create("sgd", &o, &p, 0) == NULL);
    CHECK(mpr_last_error_code() == MPR_ERR_INVALID_ARG);
    mpr_rref_release(p);
}

/* One step of loss = sum_k tanh(owner_k * (p_k @ x)) on both optimizers:
 * rrefs[k] lives on owner[k], local[k] is its local twin. */
static void step_both(mpr_dist_optimizer_t *dopt, mpr_optimizer_t *lopt, const int *owner, mpr_tensor_t **local,
                      int step) {
    mpr_tensor_t *x = filled(3, 2, 0.3 * step, false);
    int64_t ctx;
    CHECK_OK(mpr_dist_context_begin(&ctx));
    mpr_scope_begin();
    mpr_tensor_t *loss = NULL, *ll = NULL;
    for (int k = 0; k < 3; k++) {
        mpr_tensor_t *y = call_tensor(owner[k], "apply", mpr_value_list_of(1, mpr_value_new_tensor(x)));
        mpr_tensor_t *l = mpr_sum(mpr_tanh(mpr_mul_scalar(y, (double)owner[k])));
        loss = loss ? mpr_add(loss, l) : l;
        mpr_tensor_release(y);
        mpr_tensor_t *m = mpr_sum(mpr_tanh(mpr_mul_scalar(mpr_matmul(local[k], x), (double)owner[k])));
        ll = ll ? mpr_add(ll, m) : m;
    }
    CHECK_OK(mpr_dist_backward(ctx, &loss, 1, false));
    CHECK_OK(mpr_dist_optimizer_step(dopt, ctx));
    mpr_optimizer_zero_grad(lopt);
    CHECK_OK(mpr_backward(ll, NULL, false));
    CHECK_OK(mpr_optimizer_step(lopt));
    mpr_scope_end();
    CHECK_OK(mpr_dist_context_end(ctx));
    mpr_tensor_release(x);
}

/* The same names, metadata and values (1e-9 relative) in both dicts. */
static void check_same_dict(const mpr_tensor_dict_t *got, const mpr_tensor_dict_t *want, const char *what) {
    CHECK(mpr_tensor_dict_count(got) == mpr_tensor_dict_count(want));
    CHECK(mpr_tensor_dict_meta_count(got) == mpr_tensor_dict_meta_count(want));
    for (size_t j = 0; j < mpr_tensor_dict_count(want); j++) {
        const char *name = mpr_tensor_dict_name(want, j);
        mpr_tensor_t *g = mpr_tensor_dict_get(got, name), *w = mpr_tensor_dict_tensor(want, j);
        if (!g) {
            fprintf(stderr, "[rank %d] %s: no '%s'\n", me, what, name);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        CHECK(mpr_tensor_dtype(g) == mpr_tensor_dtype(w) && mpr_tensor_numel(g) == mpr_tensor_numel(w));
        if (mpr_tensor_dtype(w) == MPR_I64)
            CHECK(*(int64_t *)mpr_tensor_data(g) == *(int64_t *)mpr_tensor_data(w));
        else
            check_close(g, w, 1e-9, name);
    }
    for (size_t m = 0; m < mpr_tensor_dict_meta_count(want); m++) {
        const char *k = mpr_tensor_dict_meta_key(want, m), *v = mpr_tensor_dict_get_meta(got, k);
        CHECK(v != NULL);
        CHECK(strcmp(v, mpr_tensor_dict_meta_value(want, m)) == 0);
    }
}

static void test_state_checkpoint(void) {
    if (me != 0) return;
    const int owner[3] = {3, 1, 2}; /* list order differs from rank order */
    mpr_optim_options_t o;
    mpr_optim_options_default("adam", &o);
    o.lr = 0.05;
    mpr_rref_t *rrefs[3];
    mpr_tensor_t *local[3];
    for (int k = 0; k < 3; k++) {
        rrefs[k] = make_param(owner[k], owner[k]);
        local[k] = filled(3, 3, (double)owner[k], true);
    }
    mpr_dist_optimizer_t *dopt = mpr_dist_optimizer_create("adam", &o, rrefs, 3);
    mpr_optimizer_t *lopt = mpr_optimizer_create("adam", local, 3, &o);
    CHECK(dopt && lopt);
    for (int step = 0; step < 3; step++) step_both(dopt, lopt, owner, local, step);

    /* export: the local optimizer's dict, name for name */
    mpr_tensor_dict_t *dist_state = mpr_tensor_dict_create(), *local_state = mpr_tensor_dict_create();
    CHECK_OK(mpr_dist_optimizer_state_export(dopt, dist_state, "optim."));
    CHECK_OK(mpr_optimizer_state_export(lopt, local_state, "optim."));
    CHECK(mpr_tensor_dict_count(local_state) == 3 * 3); /* step, exp_avg, exp_avg_sq per parameter */
    check_same_dict(dist_state, local_state, "export");

    /* save, then a new DistributedOptimizer with other options loads it and
     * continues exactly as the local one that never stopped */
    char path[128];
    snprintf(path, sizeof path, "/tmp/mpirpc_test_dist_optim_%ld.safetensors", (long)getpid());
    CHECK_OK(mpr_dist_optimizer_state_save(dopt, path));
    mpr_dist_optimizer_destroy(dopt);
    mpr_optim_options_t other = o;
    other.lr = 0.5;
    other.beta1 = 0.5;
    dopt = mpr_dist_optimizer_create("adam", &other, rrefs, 3);
    CHECK(dopt != NULL);
    CHECK_OK(mpr_dist_optimizer_state_load(dopt, path));
    mpr_tensor_dict_t *reloaded = mpr_tensor_dict_create();
    CHECK_OK(mpr_dist_optimizer_state_export(dopt, reloaded, "optim."));
    check_same_dict(reloaded, local_state, "reloaded");
    mpr_tensor_dict_destroy(reloaded);

    /* a local optimizer reads the distributed file too */
    mpr_tensor_t *copies[3];
    for (int k = 0; k < 3; k++) copies[k] = filled(3, 3, 0.0, true);
    mpr_optimizer_t *from_file = mpr_optimizer_create("adam", copies, 3, &other);
    CHECK_OK(mpr_optimizer_state_load(from_file, path));
    CHECK(mpr_optimizer_get_lr(from_file) == 0.05);
    mpr_optimizer_destroy(from_file);
    for (int k = 0; k < 3; k++) mpr_tensor_release(copies[k]);

    /* an import that owner 2 rejects (a wrong shape for list index 2) changes no owner */
    mpr_tensor_dict_t *bad = mpr_tensor_dict_create();
    for (size_t j = 0; j < mpr_tensor_dict_count(local_state); j++)
        CHECK_OK(mpr_tensor_dict_set(bad, mpr_tensor_dict_name(local_state, j), mpr_tensor_dict_tensor(local_state, j)));
    for (size_t m = 0; m < mpr_tensor_dict_meta_count(local_state); m++)
        CHECK_OK(mpr_tensor_dict_set_meta(bad, mpr_tensor_dict_meta_key(local_state, m),
                                          mpr_tensor_dict_meta_value(local_state, m)));
    CHECK_OK(mpr_tensor_dict_set_meta(bad, "optim.lr", "0.25"));
    mpr_tensor_t *wrong = filled(2, 2, 0.0, false);
    CHECK_OK(mpr_tensor_dict_set(bad, "optim.state.2.exp_avg", wrong));
    mpr_tensor_release(wrong);
    CHECK(mpr_dist_optimizer_state_import(dopt, bad, "optim.") == MPR_ERR_REMOTE);
    CHECK_CONTAINS(mpr_last_error(), "worker2");
    CHECK_CONTAINS(mpr_last_error(), "state.2.exp_avg");
    /* an index outside the list, and another kind's state */
    mpr_tensor_t *st = mpr_tensor_empty(MPR_I64, 0, NULL);
    *(int64_t *)mpr_tensor_data(st) = 1;
    CHECK_OK(mpr_tensor_dict_set(bad, "optim.state.2.exp_avg", mpr_tensor_dict_get(local_state, "optim.state.2.exp_avg")));
    CHECK_OK(mpr_tensor_dict_set(bad, "optim.state.3.step", st));
    mpr_tensor_release(st);
    CHECK(mpr_dist_optimizer_state_import(dopt, bad, "optim.") != MPR_OK);
    CHECK_CONTAINS(mpr_last_error(), "names no parameter");
    CHECK(mpr_dist_optimizer_state_import(dopt, bad, "nothing_here.") != MPR_OK);
    CHECK_CONTAINS(mpr_last_error(), "kind");
    mpr_tensor_dict_destroy(bad);
    mpr_tensor_dict_t *after = mpr_tensor_dict_create();
    CHECK_OK(mpr_dist_optimizer_state_export(dopt, after, "optim."));
    check_same_dict(after, local_state, "after rejected imports");
    mpr_tensor_dict_destroy(after);
    /* misuse */
    CHECK_ERR(mpr_dist_optimizer_state_export(NULL, local_state, NULL), MPR_ERR_INVALID_ARG);
    CHECK_ERR(mpr_dist_optimizer_state_import(dopt, NULL, NULL), MPR_ERR_INVALID_ARG);
    CHECK(mpr_dist_optimizer_state_load(dopt, "/nonexistent/dir/x.safetensors") != MPR_OK);
    CHECK_CONTAINS(mpr_last_error(), "/nonexistent/dir/x.safetensors");

    /* continue: 2 more steps on both, parameters equal */
    for (int step = 3; step < 5; step++) step_both(dopt, lopt, owner, local, step);
    for (int k = 0; k < 3; k++) {
        mpr_tensor_t *got = call_tensor(owner[k], "get_param", mpr_value_new_list());
        check_close(got, local[k], 1e-9, "resumed adam");
        mpr_tensor_release(got);
        mpr_rref_release(rrefs[k]);
        mpr_tensor_release(local[k]);
    }
    unlink(path);
    mpr_tensor_dict_destroy(dist_state);
    mpr_tensor_dict_destroy(local_state);
    mpr_optimizer_destroy(lopt);
    mpr_dist_optimizer_destroy(dopt);
    printf("DistributedOptimizer(adam) state: export equals the local optimizer's, a reload continues exactly, "
           "rejected imports change no owner\n");
}

int main(int argc, char **argv) {
    CHECK_OK(mpr_register_function("make_param", fn_make_param, NULL));
    CHECK_OK(mpr_register_function("apply", fn_apply, NULL));
    CHECK_OK(mpr_register_function("get_param", fn_get_param, NULL));
    CHECK_OK(mpr_register_function("take_shared", fn_take_shared, NULL));
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = &argc;
    opts.argv = &argv;
    CHECK_OK(mpr_init(&opts));
    me = mpitest_rank();
    CHECK(mpr_world_size() == 4);
    RUN_TEST(test_sgd_momentum);
    RUN_TEST(test_adam);
    RUN_TEST(test_concurrent_trainers);
    RUN_TEST(test_failures_name_the_owner);
    RUN_TEST(test_state_checkpoint);
    CHECK_OK(mpr_shutdown(true));
    mpr_tensor_release(param);
    MPITEST_REPORT();
    return 0;
}
