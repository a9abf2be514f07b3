/* test_rt_future.c — future semantics without MPI: set_result/set_error,
 * double completion, then-chains (value and error propagation, callbacks on
 * an already completed future, a parent released pending), wait with timeout, wait_all; error enum
 * names; worker name validation; keyed wake-up events (a sleeper on a key wakes on that key's
 * signal and on signal_all_keys, and a signal between reading the generation and sleeping is
 * not lost). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "mpirpc/mpirpc.h"
#include "mpri_event.h"

static mpr_err_t times_two(mpr_future_t *parent, void *user, mpr_value_t **result) {
    mpr_value_t *v;
    mpr_err_t e = mpr_future_get(parent, 0, &v);
    if (e) return e;
    int64_t i;
    e = mpr_value_get_int(v, &i);
    mpr_value_release(v);
    if (e) return e;
    (*(int *)user)++;
    *result = mpr_value_new_int(i * 2);
    return MPR_OK;
}

static mpr_err_t refuse(mpr_future_t *parent, void *user, mpr_value_t **result) {
    return mpr_error_set(MPR_ERR_INVALID_ARG, "refused by callback");
}

static void test_set_result_and_get(void **state) {
    mpr_future_t *f = mpr_future_create();
    assert_false(mpr_future_done(f));
    assert_int_equal(mpr_future_error(f), MPR_ERR_STATE);
    assert_int_equal(mpr_future_set_result(f, mpr_value_new_int(21)), MPR_OK);
    assert_true(mpr_future_done(f));
    assert_int_equal(mpr_future_set_result(f, mpr_value_new_int(1)), MPR_ERR_STATE);
    assert_int_equal(mpr_future_set_error(f, MPR_ERR_REMOTE, "x"), MPR_ERR_STATE);
    mpr_value_t *v;
    assert_int_equal(mpr_future_get(f, 0, &v), MPR_OK);
    int64_t i;
    assert_int_equal(mpr_value_get_int(v, &i), MPR_OK);
    assert_int_equal(i, 21);
    mpr_value_release(v);
    mpr_future_release(f);
}

static void test_set_error(void **state) {
    mpr_future_t *f = mpr_future_create();
    assert_int_equal(mpr_future_set_error(f, MPR_OK, "no"), MPR_ERR_INVALID_ARG);
    assert_int_equal(mpr_future_set_error(f, MPR_ERR_REMOTE, "boom on worker3"), MPR_OK);
    mpr_value_t *v = NULL;
    assert_int_equal(mpr_future_get(f, 0, &v), MPR_ERR_REMOTE);
    assert_null(v);
    assert_string_equal(mpr_last_error(), "boom on worker3");
    assert_string_equal(mpr_future_error_message(f), "boom on worker3");
    mpr_future_release(f);
}

static void test_then_chain(void **state) {
    int calls = 0;
    mpr_future_t *f = mpr_future_create();
    mpr_future_t *g = mpr_future_then(f, times_two, &calls);
    mpr_future_t *h = mpr_future_then(g, times_two, &calls);
    mpr_future_t *k = mpr_future_then(h, refuse, NULL);
    mpr_future_t *m = mpr_future_then(k, times_two, &calls); /* error passes through */
    assert_false(mpr_future_done(h));
    assert_int_equal(mpr_future_set_result(f, mpr_value_new_int(5)), MPR_OK);
    mpr_value_t *v;
    assert_int_equal(mpr_future_get(h, 0, &v), MPR_OK);
    int64_t i;
    mpr_value_get_int(v, &i);
    assert_int_equal(i, 20);
    mpr_value_release(v);
    assert_int_equal(calls, 2);
    assert_int_equal(mpr_future_error(k), MPR_ERR_INVALID_ARG);
    assert_string_equal(mpr_future_error_message(k), "refused by callback");
    assert_int_equal(mpr_future_error(m), MPR_ERR_INVALID_ARG);
    assert_int_equal(calls, 2);
    /* then on an already completed future runs at once */
    mpr_future_t *n = mpr_future_then(h, times_two, &calls);
    assert_true(mpr_future_done(n));
    assert_int_equal(calls, 3);
    mpr_future_release(n);
    mpr_future_release(m);
    mpr_future_release(k);
    mpr_future_release(h);
    mpr_future_release(g);
    mpr_future_release(f);
    assert_null(mpr_future_then(NULL, times_two, NULL));
}

static void *complete_later(void *arg) {
    usleep(50000);
    mpr_future_set_result(arg, mpr_value_new_string("late"));
    return NULL;
}

/* A parent released without ever completing: its then-callback can never
 * run, so the child fails (not pending forever) and nothing leaks (LSan). */
static void test_then_on_abandoned_parent(void **state) {
    int calls = 0;
    mpr_future_t *parent = mpr_future_create();
    mpr_future_t *child = mpr_future_then(parent, times_two, &calls);
    assert_non_null(child);
    assert_false(mpr_future_done(child));
    mpr_future_release(parent);
    assert_true(mpr_future_done(child));
    mpr_value_t *v = (mpr_value_t *)1;
    assert_int_equal(mpr_future_get(child, 0, &v), MPR_ERR_STATE);
    assert_null(v);
    assert_non_null(strstr(mpr_last_error(), "released without ever completing"));
    assert_int_equal(calls, 0);
    mpr_future_release(child);
}

static void test_wait_timeout_and_wait_all(void **state) {
    mpr_future_t *f = mpr_future_create();
    assert_int_equal(mpr_future_wait(f, 0.01), MPR_ERR_TIMEOUT);
    assert_false(mpr_future_done(f));
    mpr_future_t *done = mpr_future_create();
    mpr_future_set_result(done, NULL);
    mpr_future_t *both[2] = {done, f};
    assert_int_equal(mpr_future_wait_all(2, both, 0.01), MPR_ERR_TIMEOUT);
    pthread_t th;
    pthread_create(&th, NULL, complete_later, f);
    assert_int_equal(mpr_future_wait_all(2, both, 10), MPR_OK);
    pthread_join(th, NULL);
    mpr_value_t *v;
    assert_int_equal(mpr_future_get(f, 0, &v), MPR_OK);
    const char *s;
    assert_int_equal(mpr_value_get_string(v, &s), MPR_OK);
    assert_string_equal(s, "late");
    mpr_value_release(v);
    /* a completed none future */
    assert_int_equal(mpr_future_get(done, 0, &v), MPR_OK);
    assert_int_equal(mpr_value_kind(v), MPR_VALUE_NONE);
    mpr_value_release(v);
    mpr_future_release(f);
    mpr_future_release(done);
}

/* Keyed events: a sleeper with a 30 s timeout wakes on its key's signal (or
 * on signal_all_keys), sent 50 ms later, long before the timeout; a signal
 * sent after the generation was read makes the wait return at once. The
 * bound (20 s) only tells a wake-up from the timeout, even on a machine that
 * freezes a process for seconds. */
static const int key_a = 0;
static atomic_int signalled;
static atomic_int signal_woke; /* the signaller's mpri_event_take_woke() right after its signal */
static void *signal_key_later(void *all) {
    usleep(50000);
    atomic_store(&signalled, 1);
    (void)mpri_event_take_woke(); /* this thread's flag starts clear */
    if (all)
        mpri_event_signal_all_keys();
    else
        mpri_event_signal_key(&key_a);
    atomic_store(&signal_woke, mpri_event_take_woke());
    return NULL;
}

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void test_keyed_events(void **state) {
    int woke_seen = 0;
    for (int all = 0; all < 2; all++) {
        atomic_store(&signalled, 0);
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, signal_key_later, all ? (void *)1 : NULL), 0);
        double t0 = seconds_now();
        while (!atomic_load(&signalled) && seconds_now() - t0 < 30) {
            uint64_t gen = mpri_event_generation_key(&key_a);
            if (atomic_load(&signalled)) break;
            mpri_event_wait_key(&key_a, gen, 30000000000LL);
        }
        double waited = seconds_now() - t0;
        assert_true(atomic_load(&signalled));
        assert_true(waited < 20.0); /* woken by the signal, not by the 30 s timeout */
        pthread_join(th, NULL);
        woke_seen += atomic_load(&signal_woke);
    }
    /* The signaller learnt that it woke a sleeper (this thread, asleep for
     * 50 ms: in both rounds, unless it was descheduled before its futex
     * wait), and a signal that wakes nobody leaves the flag clear. */
    assert_true(woke_seen >= 1);
    assert_false(mpri_event_take_woke()); /* this thread woke nobody */
    mpri_event_signal_key(&key_a);         /* nobody asleep */
    assert_false(mpri_event_take_woke());
    /* A signal after reading the generation: the wait returns at once. */
    uint64_t gen = mpri_event_generation_key(&key_a);
    mpri_event_signal_key(&key_a);
    double t0 = seconds_now();
    mpri_event_wait_key(&key_a, gen, 30000000000LL);
    assert_true(seconds_now() - t0 < 20.0);
}

/* A future completed by another thread (complete_later, 50 ms) ends the
 * wait of a thread asleep on the future's key (no runtime: every such wait
 * is keyed) with the value. (A missed wake-up would cost at most a 1 ms
 * sleep step; test_keyed_events checks that the wake-up itself works.) */
static void test_wait_woken_by_completion(void **state) {
    mpr_future_t *f = mpr_future_create();
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, complete_later, f), 0);
    mpr_value_t *v = NULL;
    assert_int_equal(mpr_future_get(f, 30.0, &v), MPR_OK);
    const char *text = NULL;
    assert_int_equal(mpr_value_get_string(v, &text), MPR_OK);
    assert_string_equal(text, "late");
    mpr_value_release(v);
    pthread_join(th, NULL);
    mpr_future_release(f);
}

static void test_error_names(void **state) {
    assert_string_equal(mpr_error_name(MPR_ERR_TIMEOUT), "MPR_ERR_TIMEOUT");
    assert_string_equal(mpr_strerror(MPR_ERR_TIMEOUT), "timed out");
    assert_string_equal(mpr_strerror(MPR_OK), "success");
    assert_string_equal(mpr_strerror((mpr_err_t)9999), "unknown error code");
    assert_int_equal(mpr_error_set(MPR_ERR_IO, "disk %d", 3), MPR_ERR_IO);
    assert_string_equal(mpr_last_error(), "disk 3");
    assert_int_equal(mpr_last_error_code(), MPR_ERR_IO);
}

static void test_worker_names(void **state) {
    assert_int_equal(mpr_validate_worker_name("worker0"), MPR_OK);
    assert_int_equal(mpr_validate_worker_name("ps:0_a-b"), MPR_OK);
    assert_int_equal(mpr_validate_worker_name(""), MPR_ERR_INVALID_ARG);
    assert_int_equal(mpr_validate_worker_name(NULL), MPR_ERR_INVALID_ARG);
    assert_int_equal(mpr_validate_worker_name("bad name"), MPR_ERR_INVALID_ARG);
    assert_non_null(strstr(mpr_last_error(), "invalid character ' '"));
    assert_int_equal(mpr_validate_worker_name("a/b"), MPR_ERR_INVALID_ARG);
    char longname[200];
    memset(longname, 'a', 127);
    longname[127] = '\0';
    assert_int_equal(mpr_validate_worker_name(longname), MPR_OK);
    longname[127] = 'a';
    longname[128] = '\0';
    assert_int_equal(mpr_validate_worker_name(longname), MPR_ERR_INVALID_ARG);
    assert_non_null(strstr(mpr_last_error(), "limit 127"));
}

static void test_api_before_init(void **state) {
    mpr_value_t *r = NULL;
    assert_int_equal(mpr_rpc_sync(mpr_to_rank(0), "f", NULL, 0, &r), MPR_ERR_NOT_INITIALIZED);
    mpr_future_t *f = mpr_rpc_async(mpr_to_rank(0), "f", NULL, 0);
    assert_int_equal(mpr_future_error(f), MPR_ERR_NOT_INITIALIZED);
    mpr_future_release(f);
    assert_int_equal(mpr_shutdown(true), MPR_ERR_NOT_INITIALIZED);
    mpr_worker_info_t w;
    assert_int_equal(mpr_get_self_worker_info(&w), MPR_ERR_NOT_INITIALIZED);
    assert_false(mpr_is_running());
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_set_result_and_get),  cmocka_unit_test(test_set_error),
        cmocka_unit_test(test_then_chain),          cmocka_unit_test(test_wait_timeout_and_wait_all),
        cmocka_unit_test(test_error_names),         cmocka_unit_test(test_worker_names),
        cmocka_unit_test(test_api_before_init),     cmocka_unit_test(test_then_on_abandoned_parent),
        cmocka_unit_test(test_keyed_events),        cmocka_unit_test(test_wait_woken_by_completion),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
