/* test_rpc_stress.c — concurrency: 8 user threads x 10,000 rpc_sync calls
 * from rank 0 with every result checked, then an all-to-all random storm of
 * async calls (plain, nested, with tensors) across every rank. */
#include <pthread.h>

#include "mpitest.h"

static int rank, size;
/* Handlers may run before main() has stored rank/size: ask the runtime. */
#define SELF_RANK() mpitest_rank()
#define WORLD() mpr_world_size()

static mpr_err_t fn_mix(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t a, b;
    mpr_err_t e;
    if ((e = mpr_args_int(args, 0, &a)) || (e = mpr_args_int(args, 1, &b))) return e;
    *result = mpr_value_new_int(a * 1000003 + b);
    return MPR_OK;
}

/* Sum of a float tensor plus a forwarded hop count: exercises tensors and nesting. */
static mpr_err_t fn_sum_hop(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    mpr_tensor_t *t;
    int64_t hops;
    mpr_err_t e;
    if ((e = mpr_args_tensor(args, 0, &t)) || (e = mpr_args_int(args, 1, &hops))) return e;
    if (hops > 0) {
        mpr_value_t *fwd = mpr_value_list_of(2, mpr_value_new_tensor(t), mpr_value_new_int(hops - 1));
        e = mpr_rpc_sync(mpr_to_rank((SELF_RANK() + 1) % WORLD()), "sum_hop", fwd, 60, result);
        mpr_value_release(fwd);
        return e;
    }
    double s = 0;
    const float *p = mpr_tensor_data(t);
    for (int64_t i = 0; i < mpr_tensor_numel(t); i++) s += p[i];
    *result = mpr_value_new_double(s);
    return MPR_OK;
}

typedef struct {
    int id;
    int failures;
} thread_arg_t;

static void *caller_thread(void *p) {
    thread_arg_t *arg = p;
    for (int i = 0; i < 10000; i++) {
        int dst = 1 + (i + arg->id) % (size - 1);
        mpr_value_t *args = ints2(arg->id, i), *r = NULL;
        int64_t x = -1;
        if (mpr_rpc_sync(mpr_to_rank(dst), "mix", args, 60, &r) != MPR_OK || mpr_value_get_int(r, &x) != MPR_OK ||
            x != (int64_t)arg->id * 1000003 + i)
            arg->failures++;
        mpr_value_release(r);
        mpr_value_release(args);
    }
    return NULL;
}

static void test_eight_threads(void) {
    if (rank != 0) return;
    pthread_t th[8];
    thread_arg_t args[8];
    for (int i = 0; i < 8; i++) {
        args[i] = (thread_arg_t){i, 0};
        pthread_create(&th[i], NULL, caller_thread, &args[i]);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        CHECK(args[i].failures == 0);
    }
}

static void test_storm(void) {
    enum { N = 3000 };
    unsigned seed = 1234u + (unsigned)rank;
    mpr_future_t **fs = calloc(N, sizeof *fs);
    double *expect = calloc(N, sizeof *expect);
    int64_t *kind = calloc(N, sizeof *kind);
    for (int i = 0; i < N; i++) {
        int dst = rand_r(&seed) % size;
        kind[i] = rand_r(&seed) % 3;
        mpr_value_t *args;
        if (kind[i] == 0) {
            args = ints2(rank, i);
            expect[i] = (double)rank * 1000003 + i;
            fs[i] = mpr_rpc_async(mpr_to_rank(dst), "mix", args, 60);
        } else {
            int64_t n = 1 + rand_r(&seed) % (kind[i] == 1 ? 16 : 70000);
            mpr_tensor_t *t = mpr_tensor_empty(MPR_F32, 1, &n);
            float *p = mpr_tensor_data(t);
            double s = 0;
            for (int64_t k = 0; k < n; k++) s += (p[k] = (float)((k + i) % 7));
            args = mpr_value_list_of(2, mpr_value_new_tensor(t), mpr_value_new_int(rand_r(&seed) % 3));
            mpr_tensor_release(t);
            expect[i] = s;
            fs[i] = mpr_rpc_async(mpr_to_rank(dst), "sum_hop", args, 60);
        }
        mpr_value_release(args);
        CHECK(fs[i] != NULL);
    }
    CHECK_OK(mpr_future_wait_all(N, fs, 120));
    for (int i = 0; i < N; i++) {
        mpr_value_t *v;
        CHECK_OK(mpr_future_get(fs[i], 0, &v));
        double got;
        CHECK_OK(mpr_value_get_double(v, &got));
        CHECK(got == expect[i]);
        mpr_value_release(v);
        mpr_future_release(fs[i]);
    }
    free(fs);
    free(expect);
    free(kind);
}

int main(int argc, char **argv) {
    CHECK_OK(mpr_register_function("mix", fn_mix, NULL));
    CHECK_OK(mpr_register_function("sum_hop", fn_sum_hop, NULL));
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = &argc;
    opts.argv = &argv;
    CHECK_OK(mpr_init(&opts));
    rank = mpitest_rank();
    size = mpr_world_size();
    RUN_TEST(test_eight_threads);
    RUN_TEST(test_storm);
    MPITEST_REPORT();
    mpr_debug_info_t info;
    CHECK_OK(mpr_shutdown(true));
    CHECK_OK(mpr_get_debug_info(&info));
    CHECK(info.pending_requests == 0 && info.pool_busy == 0 && info.progress_busy == 0);
    mpr_registry_clear();
    return 0;
}
