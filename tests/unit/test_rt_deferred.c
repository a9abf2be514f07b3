/* test_rt_deferred.c — the queue of releases put off to an idle moment
 * (runtime/mpri_deferred.h): items run once each, in queue order, when a
 * thread runs some or flushes; a full queue runs its items in the caller
 * that queues one more; the progress thread's turn runs them once the
 * oldest is old enough; an item may queue another and ask for a flush
 * (no deadlock, nothing lost); items queued from several threads while
 * others run them all run exactly once; a count of live tensors runs what
 * is queued first (a tensor whose release was put off is not live); a wait
 * on a future runs them. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include <cmocka.h>

#include "mpirpc/future.h"
#include "mpirpc/tensor.h"
#include "mpri_deferred.h"

static int order[64];
static int n_order;

static void record(void *arg) { order[n_order++] = (int)(intptr_t)arg; }

static void test_runs_in_order_once(void **state) {
    (void)state;
    mpri_deferred_flush();
    n_order = 0;
    for (int i = 1; i <= 3; i++) mpri_defer(record, (void *)(intptr_t)i);
    assert_int_equal(mpri_deferred_pending(), 3);
    assert_int_equal(n_order, 0); /* nothing ran at queue time */
    mpri_deferred_run_some();
    assert_int_equal(mpri_deferred_pending(), 0);
    assert_int_equal(n_order, 3);
    for (int i = 0; i < 3; i++) assert_int_equal(order[i], i + 1);
    mpri_deferred_run_some(); /* empty: nothing runs again */
    mpri_deferred_flush();
    assert_int_equal(n_order, 3);
}

static void test_full_queue_runs_in_the_caller(void **state) {
    (void)state;
    mpri_deferred_flush();
    n_order = 0;
    for (int i = 0; i < MPRI_DEFERRED_MAX; i++) mpri_defer(record, (void *)(intptr_t)i);
    assert_int_equal(n_order, 0);
    assert_int_equal(mpri_deferred_pending(), MPRI_DEFERRED_MAX);
    mpri_defer(record, (void *)(intptr_t)100); /* full: the queued ones run now, this one waits */
    assert_int_equal(n_order, MPRI_DEFERRED_MAX);
    assert_int_equal(mpri_deferred_pending(), 1);
    mpri_deferred_flush();
    assert_int_equal(n_order, MPRI_DEFERRED_MAX + 1);
    assert_int_equal(order[MPRI_DEFERRED_MAX], 100);
}

static void reentrant(void *arg) {
    (void)arg;
    order[n_order++] = 7;
    mpri_defer(record, (void *)(intptr_t)8); /* queued from inside a run: runs in the same run */
    mpri_deferred_flush();                   /* from inside a run: returns at once */
    mpri_deferred_run_some();
}

static void test_item_may_queue_and_flush(void **state) {
    (void)state;
    mpri_deferred_flush();
    n_order = 0;
    mpri_defer(reentrant, NULL);
    mpri_deferred_flush();
    assert_int_equal(n_order, 2);
    assert_int_equal(order[0], 7);
    assert_int_equal(order[1], 8);
    assert_int_equal(mpri_deferred_pending(), 0);
}

static void fill_from_inside(void *arg) {
    (void)arg;
    /* more than the ring holds, queued while this thread runs items: the
     * overflow runs at once in here, the rest later in the same run */
    for (int i = 0; i < MPRI_DEFERRED_MAX + 3; i++) mpri_defer(record, (void *)(intptr_t)i);
}

static void test_full_queue_inside_a_run(void **state) {
    (void)state;
    mpri_deferred_flush();
    n_order = 0;
    mpri_defer(fill_from_inside, NULL);
    mpri_deferred_flush();
    assert_int_equal(n_order, MPRI_DEFERRED_MAX + 3);
    assert_int_equal(mpri_deferred_pending(), 0);
}

static void test_overdue(void **state) {
    (void)state;
    mpri_deferred_flush();
    n_order = 0;
    mpri_defer(record, (void *)(intptr_t)9);
    mpri_deferred_run_overdue(1000000000); /* not a second old yet */
    assert_int_equal(n_order, 0);
    usleep(3000);
    mpri_deferred_run_overdue(1000000); /* 3 ms old: overdue */
    assert_int_equal(n_order, 1);
    mpri_deferred_run_overdue(0); /* empty: nothing */
    assert_int_equal(n_order, 1);
}

static atomic_int ran;
static atomic_bool producers_done;

static void count(void *arg) {
    (void)arg;
    atomic_fetch_add(&ran, 1);
}

static void *producer(void *arg) {
    (void)arg;
    for (int i = 0; i < 2000; i++) mpri_defer(count, NULL);
    return NULL;
}

static void *runner(void *arg) {
    (void)arg;
    while (!atomic_load(&producers_done)) mpri_deferred_run_some();
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    mpri_deferred_flush();
    atomic_store(&ran, 0);
    atomic_store(&producers_done, false);
    pthread_t p[4], r;
    assert_int_equal(pthread_create(&r, NULL, runner, NULL), 0);
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&p[i], NULL, producer, NULL), 0);
    for (int i = 0; i < 4; i++) pthread_join(p[i], NULL);
    atomic_store(&producers_done, true);
    pthread_join(r, NULL);
    mpri_deferred_flush();
    assert_int_equal(atomic_load(&ran), 4 * 2000);
    assert_int_equal(mpri_deferred_pending(), 0);
}

static void release_tensor(void *arg) { mpr_tensor_release(arg); }

static void test_live_count_and_wait_run_them(void **state) {
    (void)state;
    mpri_deferred_flush();
    int64_t before = mpr_tensor_live_count();
    mpr_tensor_t *t = mpr_tensor_empty(MPR_F32, 1, (const int64_t[]){4});
    assert_non_null(t);
    mpri_defer(release_tensor, t);
    assert_int_equal(mpri_deferred_pending(), 1);
    assert_int_equal(mpr_tensor_live_count(), before); /* the put-off release ran first */
    assert_int_equal(mpri_deferred_pending(), 0);

    /* a wait on a future that is not done yet runs what is queued */
    n_order = 0;
    mpri_defer(record, (void *)(intptr_t)5);
    mpr_future_t *f = mpr_future_create();
    assert_non_null(f);
    assert_int_equal(mpr_future_wait(f, 0.001), MPR_ERR_TIMEOUT);
    assert_int_equal(n_order, 1);
    assert_int_equal(order[0], 5);
    mpr_future_release(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runs_in_order_once),
        cmocka_unit_test(test_full_queue_runs_in_the_caller),
        cmocka_unit_test(test_item_may_queue_and_flush),
        cmocka_unit_test(test_full_queue_inside_a_run),
        cmocka_unit_test(test_overdue),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_live_count_and_wait_run_them),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
