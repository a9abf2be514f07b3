/* test_rt_host_alloc.c — the cache of large host blocks: a freed block of
 * >= 64 KiB is handed out again for the same rounded size (4 KiB steps
 * below 1 MiB, 64 KiB from 1 MiB; no fresh mmap and page faults), small blocks are not cached, a full cache keeps the 64
 * most recent frees (the oldest are freed), and trimming empties the
 * cache. Tensors use it through their storages. Blocks of >= 1 MiB are
 * mapped prefaulted (resident before the first touch, mincore), from 2 MiB
 * on a 2 MiB boundary (for transparent huge pages), and unmapped when the
 * cache lets them go; a mapping the system refuses is a NULL block (a
 * tensor: MPR_ERR_NOMEM). Storages of up to 16 KiB carry their bytes in
 * their own allocation instead. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

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

/* From 64 KiB to 1 MiB sizes round to 4 KiB: a batch of activations
 * (64 x 784 f32, 196 KiB) comes back for the same rounded size, not for
 * the next 4 KiB. (Caching these keeps glibc's mmap/trim thresholds from
 * making such blocks fresh at every step: host_alloc.c.) */
static void test_medium_blocks_are_reused(void **state) {
    mpri_host_cache_trim();
    size_t n = (size_t)64 * 784 * 4, blocks, bytes; /* 200,704 B = 49 pages */
    void *a = mpri_host_alloc(n);
    assert_non_null(a);
    mpri_host_free(a, n);
    mpri_host_cache_stats(&blocks, &bytes);
    assert_int_equal(blocks, 1);
    assert_int_equal(bytes, (size_t)49 << 12);
    void *b = mpri_host_alloc(n - 3000); /* still 49 pages */
    assert_ptr_equal(a, b);
    void *c = mpri_host_alloc(n);
    mpri_host_free(c, n);
    void *d = mpri_host_alloc(n + 100); /* 50 pages: not the cached block */
    assert_ptr_not_equal(d, c);
    mpri_host_free(b, n - 3000);
    mpri_host_free(d, n + 100);
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

/* Small storages (up to 16 KiB) hold their bytes in their own allocation,
 * right after the record, still 64-byte aligned; larger ones keep bytes of
 * their own (from the host allocator); every size is writable to its end
 * and freed with the tensor (ASan: no overflow, no leak). */
static void test_small_storage_bytes_inline(void **state) {
    const int64_t lens[] = {1, 5, 16, 4096, 4097, 1 << 14};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        mpr_tensor_t *t = mpr_tensor_empty(MPR_F32, 1, &lens[i]);
        assert_non_null(t);
        mpri_storage_t *s = t->storage;
        assert_int_equal((uintptr_t)s->data % 64, 0);
        bool inline_bytes = (uint8_t *)s->data == (uint8_t *)s + 64;
        assert_true(inline_bytes == (s->nbytes <= ((size_t)16 << 10)));
        assert_true(s->bytes_inline == inline_bytes);
        memset(s->data, 0x5a, s->nbytes);
        mpr_tensor_release(t);
    }
    int64_t zero = 0; /* no bytes: a storage like any other */
    mpr_tensor_t *z = mpr_tensor_empty(MPR_F32, 1, &zero);
    assert_non_null(z);
    assert_int_equal(mpr_tensor_nbytes(z), 0);
    mpr_tensor_release(z);
}

static void test_small_blocks_not_cached(void **state) {
    mpri_host_cache_trim();
    size_t blocks, bytes;
    void *s = mpri_host_alloc(1000), *m = mpri_host_alloc((size_t)60 << 10);
    assert_non_null(s);
    assert_non_null(m);
    assert_int_equal((uintptr_t)s % 64, 0);
    mpri_host_free(s, 1000); /* below 64 KiB: freed, not cached */
    mpri_host_free(m, (size_t)60 << 10);
    mpri_host_cache_stats(&blocks, &bytes);
    assert_int_equal(blocks, 0);
    assert_int_equal(bytes, 0);
    mpri_host_free(NULL, 5);
}

/* More distinct sizes than slots: the cache keeps the 64 most recent frees,
 * each of them handed out again, and the first ones went back to the system. */
static void test_full_cache_keeps_the_newest(void **state) {
    mpri_host_cache_trim();
    enum { N = 70, SLOTS = 64 };
    size_t blocks, bytes, total = 0;
    for (int i = 0; i < N; i++) {
        size_t n = ((size_t)256 << 10) + ((size_t)i << 16);
        mpri_host_free(mpri_host_alloc(n), n);
        if (i >= N - SLOTS) total += n;
    }
    mpri_host_cache_stats(&blocks, &bytes);
    assert_int_equal(blocks, SLOTS);
    assert_int_equal(bytes, total);
    void *held[N]; /* kept out of the cache until the end */
    for (int i = N - SLOTS; i < N; i++) { /* each comes from the cache */
        size_t n = ((size_t)256 << 10) + ((size_t)i << 16);
        held[i] = mpri_host_alloc(n);
        mpri_host_cache_stats(&blocks, &bytes);
        assert_int_equal(blocks, (size_t)(N - 1 - i));
        total -= n;
        assert_int_equal(bytes, total);
    }
    for (int i = 0; i < N - SLOTS; i++) { /* evicted: a fresh block, the cache stays empty */
        size_t n = ((size_t)256 << 10) + ((size_t)i << 16);
        held[i] = mpri_host_alloc(n);
        assert_non_null(held[i]);
    }
    mpri_host_cache_stats(&blocks, &bytes);
    assert_int_equal(blocks, 0);
    assert_int_equal(bytes, 0);
    for (int i = 0; i < N; i++) mpri_host_free(held[i], ((size_t)256 << 10) + ((size_t)i << 16));
    mpri_host_cache_trim();
}

/* The byte budget (512 MiB by default): freeing past it frees the oldest
 * cached blocks first (the blocks are prefaulted: 600 MiB for a moment). */
static void test_budget_evicts_the_oldest(void **state) {
    mpri_host_cache_trim();
    size_t big = (size_t)120 << 20, blocks, bytes;
    void *b[5];
    for (int i = 0; i < 5; i++) assert_non_null(b[i] = mpri_host_alloc(big));
    for (int i = 0; i < 5; i++) mpri_host_free(b[i], big);
    mpri_host_cache_stats(&blocks, &bytes);
    assert_int_equal(blocks, 4); /* 5 x 120 MiB > 512 MiB: the first went */
    assert_int_equal(bytes, 4 * big);
    mpri_host_cache_trim();
    mpri_host_cache_stats(&blocks, &bytes);
    assert_int_equal(blocks, 0);
}

/* How many of the pages of [p, p + n) are resident (mincore); -1 when the
 * range is not mapped. */
static long resident_pages(void *p, size_t n) {
    long page = sysconf(_SC_PAGESIZE), count = 0;
    size_t pages = (n + (size_t)page - 1) / (size_t)page;
    unsigned char *vec = malloc(pages);
    assert_non_null(vec);
    if (mincore(p, n, vec) != 0) {
        free(vec);
        return -1;
    }
    for (size_t i = 0; i < pages; i++) count += vec[i] & 1;
    free(vec);
    return count;
}

/* Does this kernel prefault on request (MADV_POPULATE_WRITE, Linux 5.14)? */
static bool kernel_populates(void) {
#ifdef MADV_POPULATE_WRITE
    size_t n = (size_t)1 << 16;
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    bool ok = madvise(p, n, MADV_POPULATE_WRITE) == 0;
    munmap(p, n);
    return ok;
#else
    return false;
#endif
}

/* A fresh block of 1 MiB or more is resident before anything touches it
 * (no demand faults in the caller's first write: ~10 us a page on a VM),
 * from 2 MiB it starts on a 2 MiB boundary (huge pages can back it), and
 * trimming the cache unmaps it. Smaller fresh blocks come from malloc. */
static void test_large_blocks_are_prefaulted(void **state) {
    mpri_host_cache_trim();
    size_t one = ((size_t)1 << 20) + 12345, eight = (size_t)8 << 20;
    void *a = mpri_host_alloc(one), *b = mpri_host_alloc(eight);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal((uintptr_t)a % 64, 0);
    assert_int_equal((uintptr_t)b % ((size_t)2 << 20), 0);
    long page = sysconf(_SC_PAGESIZE);
    assert_int_equal(resident_pages(a, one), (long)((one + (size_t)page - 1) / (size_t)page)); /* MAP_POPULATE */
    if (kernel_populates())
        assert_int_equal(resident_pages(b, eight), (long)(eight / (size_t)page));
    memset(a, 7, one);
    memset(b, 7, eight);
    mpri_host_free(a, one);
    mpri_host_free(b, eight);
    mpri_host_cache_trim(); /* unmapped now */
    assert_int_equal(resident_pages(b, eight), -1);
}

/* A mapping the system refuses (the address-space limit lowered under the
 * request) is a NULL block, and a tensor of that size fails with
 * MPR_ERR_NOMEM, nothing left behind. Not under ASan: its shadow memory
 * needs an unlimited address space. */
static void test_refused_mapping_is_null(void **state) {
#if defined(__SANITIZE_ADDRESS__)
    skip();
#else
    mpri_host_cache_trim();
    struct rlimit old;
    assert_int_equal(getrlimit(RLIMIT_AS, &old), 0);
    long vm_kib = 0;
    FILE *f = fopen("/proc/self/status", "r");
    assert_non_null(f);
    char line[256];
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %ld kB", &vm_kib) == 1) break;
    fclose(f);
    assert_true(vm_kib > 0);
    struct rlimit low = old;
    low.rlim_cur = (rlim_t)(vm_kib + 64 * 1024) * 1024; /* 64 MiB of room */
    if (old.rlim_max != RLIM_INFINITY && low.rlim_cur > old.rlim_max) skip(); /* a tighter hard limit already */
    int64_t live = mpr_tensor_live_count();
    assert_int_equal(setrlimit(RLIMIT_AS, &low), 0);
    void *p = mpri_host_alloc((size_t)256 << 20);
    mpr_tensor_t *t = mpr_tensor_empty(MPR_F32, 1, (int64_t[]){(int64_t)64 << 20}); /* 256 MiB */
    mpr_err_t code = mpr_last_error_code();
    assert_int_equal(setrlimit(RLIMIT_AS, &old), 0);
    assert_null(p);
    assert_null(t);
    assert_int_equal(code, MPR_ERR_NOMEM);
    assert_int_equal(mpr_tensor_live_count(), live);
    void *q = mpri_host_alloc((size_t)256 << 20); /* and with room again it maps */
    assert_non_null(q);
    mpri_host_free(q, (size_t)256 << 20);
    mpri_host_cache_trim();
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_large_blocks_are_reused),
        cmocka_unit_test(test_tensor_storage_uses_cache),
        cmocka_unit_test(test_small_blocks_not_cached),
        cmocka_unit_test(test_small_storage_bytes_inline),
        cmocka_unit_test(test_medium_blocks_are_reused),
        cmocka_unit_test(test_full_cache_keeps_the_newest),
        cmocka_unit_test(test_budget_evicts_the_oldest),
        cmocka_unit_test(test_large_blocks_are_prefaulted),
        cmocka_unit_test(test_refused_mapping_is_null),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
