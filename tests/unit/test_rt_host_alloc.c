/* test_rt_host_alloc.c — the cache of large host blocks: a freed block of
 * >= 1 MiB is handed out again for the same rounded size (no fresh mmap and
 * page faults), small blocks are not cached, the byte budget is respected,
 * and trimming empties the cache. Tensors use it through their storages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mpri_host_alloc.h"
#include "mpri_tensor.h"

static void test_large_blocks_are_reused(void **state) {
    mpri_host_cache_trim();
    size_t n = ((size_t)3 << 20) - 1000; /* rounds up to 3 MiB, as does n + 100 */
    void *a = mpri_host_alloc(n);
    assert_non_null(a);
    assert_int_equal((uintptr_t)a % 64, 0);
    memset(a, 1, n);
    mpri_host_free(a, n);
    void *b = mpri_host_alloc(n + 100); /* same 64 KiB-rounded size */
    assert_ptr_equal(a, b);
    void *c = mpri_host_alloc(n); /* cache now empty for this size: a new block */
    assert_ptr_not_equal(b, c);
    mpri_host_free(b, n + 100);
    mpri_host_free(c, n);
    mpri_host_cache_trim();
}

static void test_tensor_storage_uses_cache(void **state) {
    mpri_host_cache_trim();
    int64_t shape[1] = {1 << 20}; /* 4 MiB of f32 */
    mpr_tensor_t *t = mpr_tensor_empty(MPR_F32, 1, shape);
    void *p = t->storage->data;
    mpr_tensor_release(t);
    mpr_tensor_t *u = mpr_tensor_empty(MPR_F32, 1, shape);
    assert_ptr_equal(u->storage->data, p);
    mpr_tensor_release(u);
    mpri_host_cache_trim();
}

static void test_small_blocks_not_cached_and_budget(void **state) {
    mpri_host_cache_trim();
    void *s = mpri_host_alloc(1000);
    assert_non_null(s);
    assert_int_equal((uintptr_t)s % 64, 0);
    mpri_host_free(s, 1000); /* freed, not cached: nothing to assert but no leak under ASan */
    /* more large blocks than slots: the extras are freed, the cache keeps at most 8 */
    void *blocks[12];
    for (int i = 0; i < 12; i++) blocks[i] = mpri_host_alloc((size_t)(i + 1) << 20);
    for (int i = 0; i < 12; i++) mpri_host_free(blocks[i], (size_t)(i + 1) << 20);
    int hits = 0;
    for (int i = 0; i < 12; i++) {
        void *again = mpri_host_alloc((size_t)(i + 1) << 20);
        hits += again == blocks[i];
        mpri_host_free(again, (size_t)(i + 1) << 20);
    }
    assert_true(hits >= 1 && hits <= 8);
    mpri_host_free(NULL, 5);
    mpri_host_cache_trim();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_large_blocks_are_reused),
        cmocka_unit_test(test_tensor_storage_uses_cache),
        cmocka_unit_test(test_small_blocks_not_cached_and_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
