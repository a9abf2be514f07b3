/* test_autograd_threads.c — several threads record ops on the same leaf
 * (like a parameter server serving many trainers on its pool) and run
 * backward concurrently: every gradient must land in the shared .grad
 * exactly once, scopes and grad mode stay per thread, and nothing leaks. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>

#include "mpirpc/tensor_ops.h"

#define NTHREADS 4
#define ITERS 300

static mpr_tensor_t *shared_w; /* [8], requires grad */
static int failures;

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    if (id % 2) mpr_set_grad_enabled(true); /* thread-local: does not leak to others */
    for (int it = 0; it < ITERS; it++) {
        mpr_scope_begin();
        /* d/dw sum(w * (id+1)) = id + 1 for every element */
        mpr_tensor_t *x = mpr_full(MPR_F64, MPR_SHAPE(8), id + 1);
        mpr_tensor_t *loss = mpr_sum(mpr_mul(mpr_relu(mpr_add_scalar(shared_w, 10.0)), x));
        if (!loss || mpr_backward(loss, NULL, false) != MPR_OK) __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
        mpr_scope_end();
        if (mpr_scope_depth() != 0) __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

static void test_concurrent_backward(void **state) {
    int64_t start = mpr_tensor_live_count();
    shared_w = mpr_zeros(MPR_F64, MPR_SHAPE(8));
    mpr_set_requires_grad(shared_w, true);
    bool prev = mpr_set_grad_enabled(false); /* main thread's mode must not affect workers */
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
    mpr_set_grad_enabled(prev);
    assert_int_equal(failures, 0);
    double g[8];
    assert_int_equal(mpr_copy_to_buffer(mpr_tensor_grad(shared_w), MPR_F64, g, sizeof g), MPR_OK);
    double expect = 0;
    for (int i = 0; i < NTHREADS; i++) expect += (double)(i + 1) * ITERS;
    for (int k = 0; k < 8; k++) assert_true(fabs(g[k] - expect) < 1e-9);
    mpr_tensor_release(shared_w);
    assert_int_equal(mpr_tensor_live_count(), start);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_concurrent_backward)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
