/* test_rt_small_alloc.c — the per-thread caches of small blocks
 * (runtime/mpri_small_alloc.h): blocks are 64-byte aligned and a freed one
 * is handed out again (last in, first out) for any size of its 64-byte
 * class; each class keeps at most MPRI_SMALL_CACHE_BLOCKS; larger blocks
 * are never cached; a block freed on another thread joins that thread's
 * cache, which its exit gives back (LeakSanitizer checks that in the
 * sanitizer build); a flush empties the cache; under AddressSanitizer a
 * cached block is poisoned past its link word. And the objects that use
 * it: tensors, storages and graph nodes made and released in a loop are
 * served from the cache. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mpirpc/mpirpc.h"
#include "mpri_small_alloc.h"

#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif
#ifdef TEST_ASAN
#include <sanitizer/asan_interface.h>
#endif

static void test_reuse_within_a_class(void **state) {
    (void)state;
    mpri_small_cache_flush();
    char *a = mpri_small_alloc(100); /* class of 65..128 bytes */
    assert_non_null(a);
    assert_int_equal((uintptr_t)a % 64, 0);
    memset(a, 0x5a, 128); /* the whole class size is usable */
    mpri_small_free(a, 100);
    assert_int_equal(mpri_small_cache_blocks(), 1);
    char *b = mpri_small_alloc(128); /* same class: the same block */
    assert_ptr_equal(a, b);
    assert_int_equal(mpri_small_cache_blocks(), 0);
    char *c = mpri_small_calloc(65);
    for (int i = 0; i < 65; i++) assert_int_equal(c[i], 0);
    mpri_small_free(b, 128);
    mpri_small_free(c, 65);
    assert_int_equal(mpri_small_cache_blocks(), 2);
    char *d = mpri_small_alloc(64); /* another class: a fresh block */
    assert_true(d != b && d != c);
    mpri_small_free(d, 64);
    mpri_small_cache_flush();
    assert_int_equal(mpri_small_cache_blocks(), 0);
}

static void test_each_class_is_bounded(void **state) {
    (void)state;
    mpri_small_cache_flush();
    enum { N = MPRI_SMALL_CACHE_BLOCKS + 9 };
    void *blocks[N];
    for (int i = 0; i < N; i++) assert_non_null(blocks[i] = mpri_small_alloc(MPRI_SMALL_MAX));
    for (int i = 0; i < N; i++) mpri_small_free(blocks[i], MPRI_SMALL_MAX);
    assert_int_equal(mpri_small_cache_blocks(), MPRI_SMALL_CACHE_BLOCKS);
    mpri_small_cache_flush();
}

static void test_large_blocks_are_not_cached(void **state) {
    (void)state;
    mpri_small_cache_flush();
    char *p = mpri_small_alloc(MPRI_SMALL_MAX + 1);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 64, 0);
    memset(p, 1, MPRI_SMALL_MAX + 1);
    mpri_small_free(p, MPRI_SMALL_MAX + 1);
    assert_int_equal(mpri_small_cache_blocks(), 0);
    /* free() is always a valid release too (the block is just not cached). */
    free(mpri_small_alloc(200));
    mpri_small_free(NULL, 200);
    assert_int_equal(mpri_small_cache_blocks(), 0);
}

static void *free_here(void *p) {
    mpri_small_free(p, 300);
    return (void *)(uintptr_t)mpri_small_cache_blocks();
}

static void test_a_block_freed_elsewhere_joins_that_threads_cache(void **state) {
    (void)state;
    mpri_small_cache_flush();
    void *p = mpri_small_alloc(300);
    assert_non_null(p);
    pthread_t th;
    void *seen = NULL;
    assert_int_equal(pthread_create(&th, NULL, free_here, p), 0);
    assert_int_equal(pthread_join(th, &seen), 0);
    assert_int_equal((uintptr_t)seen, 1);        /* it was in the thread's cache ... */
    assert_int_equal(mpri_small_cache_blocks(), 0); /* ... not ours; its exit freed it (LSan) */
}

static void test_cached_blocks_are_poisoned(void **state) {
    (void)state;
#ifdef TEST_ASAN
    mpri_small_cache_flush();
    char *p = mpri_small_alloc(256);
    assert_false(__asan_region_is_poisoned(p, 256));
    mpri_small_free(p, 256);
    assert_true(__asan_address_is_poisoned(p + 8));
    assert_true(__asan_address_is_poisoned(p + 255));
    char *q = mpri_small_alloc(256);
    assert_ptr_equal(p, q);
    assert_false(__asan_region_is_poisoned(q, 256));
    mpri_small_free(q, 256);
    mpri_small_cache_flush();
#else
    skip();
#endif
}

/* An 8x8 autograd step's objects come from this thread's cache once it is
 * warm: a second step takes as many blocks as it gives back. */
static void test_tensors_and_nodes_use_the_cache(void **state) {
    (void)state;
    int64_t shape[2] = {8, 8};
    mpr_tensor_t *w = mpr_full(MPR_F32, 2, shape, 0.5);
    assert_non_null(w);
    assert_int_equal(mpr_set_requires_grad(w, true), MPR_OK);
    size_t cached[3];
    for (int step = 0; step < 3; step++) {
        mpr_tensor_t *y = mpr_matmul(w, w);
        mpr_tensor_t *loss = mpr_sum(y);
        assert_non_null(loss);
        if (step == 2) assert_true(mpri_small_cache_blocks() < cached[1]); /* the forward took cached blocks */
        assert_int_equal(mpr_backward(loss, NULL, false), MPR_OK);
        float g = ((const float *)mpr_tensor_data(mpr_tensor_grad(w)))[0];
        assert_true(g == 8.0f); /* d sum(w w) / d w[0][0] = sum_j w[0][j] + sum_i w[i][0] = 8 * 0.5 * 2 */
        mpr_zero_grad(w);
        mpr_tensor_release(loss);
        mpr_tensor_release(y);
        cached[step] = mpri_small_cache_blocks();
    }
    assert_true(cached[0] > 0);
    assert_int_equal(cached[1], cached[2]); /* steady state: every block came back */
    mpr_tensor_release(w);
    mpri_small_cache_flush();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reuse_within_a_class),
        cmocka_unit_test(test_each_class_is_bounded),
        cmocka_unit_test(test_large_blocks_are_not_cached),
        cmocka_unit_test(test_a_block_freed_elsewhere_joins_that_threads_cache),
        cmocka_unit_test(test_cached_blocks_are_poisoned),
        cmocka_unit_test(test_tensors_and_nodes_use_the_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
