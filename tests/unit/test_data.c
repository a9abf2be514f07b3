/* test_data.c — IDX loading (Debian's Fashion-MNIST files and hand-made good
 * and bad files) and the seeded, shuffled mini-batch iterator. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "mpirpc/data.h"
#include "mpirpc/tensor_ops.h"

static char tmpdir[256];

static const char *tmp_path(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", tmpdir, name);
    return buf;
}

static int setup(void **state) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/mpirpc_data_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_gz(const char *path, const void *buf, size_t len) {
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(gzwrite(f, buf, (unsigned)len), (int)len);
    assert_int_equal(gzclose(f), Z_OK);
}

static void write_plain(const char *path, const void *buf, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    fclose(f);
}

static bool have_fmnist(void) {
    return access(MPR_FASHION_MNIST_DIR "/t10k-images-idx3-ubyte.gz", R_OK) == 0;
}

static void test_fashion_mnist(void **state) {
    if (!have_fmnist()) {
        print_message("skipping: %s not installed (Debian package dataset-fashion-mnist)\n", MPR_FASHION_MNIST_DIR);
        skip();
    }
    int64_t live = mpr_tensor_live_count();
    mpr_tensor_t *x, *y;
    assert_int_equal(mpr_mnist_load(NULL, false, true, &x, &y), MPR_OK);
    assert_int_equal(mpr_tensor_ndim(x), 2);
    assert_int_equal(mpr_tensor_shape(x)[0], 10000);
    assert_int_equal(mpr_tensor_shape(x)[1], 784);
    assert_int_equal(mpr_tensor_dtype(y), MPR_I64);
    assert_int_equal(mpr_tensor_shape(y)[0], 10000);
    const float *px = mpr_tensor_data(x);
    float lo = 1, hi = 0;
    for (int64_t i = 0; i < 10000 * 784; i++) {
        lo = px[i] < lo ? px[i] : lo;
        hi = px[i] > hi ? px[i] : hi;
    }
    assert_true(lo == 0.0f && hi == 1.0f);
    int64_t counts[10] = {0};
    const int64_t *py = mpr_tensor_data(y);
    for (int i = 0; i < 10000; i++) {
        assert_true(py[i] >= 0 && py[i] < 10);
        counts[py[i]]++;
    }
    for (int c = 0; c < 10; c++) assert_int_equal(counts[c], 1000); /* the test split is balanced */
    /* Fashion-MNIST's first test label is 9 (ankle boot), its second 2 (pullover). */
    assert_int_equal(py[0], 9);
    assert_int_equal(py[1], 2);
    mpr_tensor_release(x);
    mpr_tensor_release(y);
    /* Image layout [N, 1, 28, 28]. */
    assert_int_equal(mpr_mnist_load(MPR_FASHION_MNIST_DIR, true, false, &x, &y), MPR_OK);
    assert_int_equal(mpr_tensor_ndim(x), 4);
    assert_int_equal(mpr_tensor_shape(x)[0], 60000);
    assert_int_equal(mpr_tensor_shape(x)[1], 1);
    assert_int_equal(mpr_tensor_shape(x)[3], 28);
    mpr_tensor_release(x);
    mpr_tensor_release(y);
    /* A directory without the files: an I/O error naming the file. */
    assert_int_equal(mpr_mnist_load(tmpdir, true, true, &x, &y), MPR_ERR_IO);
    assert_null(x);
    assert_null(y);
    assert_non_null(strstr(mpr_last_error(), "train-images-idx3-ubyte.gz"));
    assert_int_equal(mpr_tensor_live_count(), live);
}

static void test_idx_files(void **state) {
    int64_t live = mpr_tensor_live_count();
    /* u8 [2, 3] gzip'd and plain. */
    unsigned char u8[] = {0, 0, 0x08, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 4, 5, 255};
    write_gz(tmp_path("u8.gz"), u8, sizeof u8);
    write_plain(tmp_path("u8.idx"), u8, sizeof u8);
    const char *both[] = {"u8.gz", "u8.idx"};
    for (int k = 0; k < 2; k++) {
        mpr_tensor_t *t = mpr_idx_load(tmp_path(both[k]));
        assert_non_null(t);
        assert_int_equal(mpr_tensor_dtype(t), MPR_U8);
        assert_int_equal(mpr_tensor_ndim(t), 2);
        assert_int_equal(mpr_tensor_shape(t)[1], 3);
        assert_memory_equal(mpr_tensor_data(t), u8 + 12, 6);
        mpr_tensor_release(t);
    }
    /* Big-endian i32 and f32 are converted. */
    unsigned char i32[] = {0, 0, 0x0C, 1, 0, 0, 0, 2, 0x00, 0x00, 0x01, 0x02, 0xff, 0xff, 0xff, 0xfe};
    write_gz(tmp_path("i32.gz"), i32, sizeof i32);
    mpr_tensor_t *t = mpr_idx_load(tmp_path("i32.gz"));
    assert_non_null(t);
    assert_int_equal(((int32_t *)mpr_tensor_data(t))[0], 258);
    assert_int_equal(((int32_t *)mpr_tensor_data(t))[1], -2);
    mpr_tensor_release(t);
    unsigned char f32[] = {0, 0, 0x0D, 1, 0, 0, 0, 1, 0x3f, 0xc0, 0x00, 0x00};
    write_gz(tmp_path("f32.gz"), f32, sizeof f32);
    t = mpr_idx_load(tmp_path("f32.gz"));
    assert_non_null(t);
    assert_true(((float *)mpr_tensor_data(t))[0] == 1.5f);
    mpr_tensor_release(t);

    struct {
        const char *name;
        unsigned char bytes[24];
        size_t len;
        mpr_err_t code;
        const char *msg;
    } bad[] = {
        {"magic.gz", {1, 0, 0x08, 1, 0, 0, 0, 1, 7}, 9, MPR_ERR_DECODE, "not an IDX file"},
        {"type.gz", {0, 0, 0x07, 1, 0, 0, 0, 1, 7}, 9, MPR_ERR_DECODE, "unknown IDX element type"},
        {"i16.gz", {0, 0, 0x0B, 1, 0, 0, 0, 1, 7, 7}, 10, MPR_ERR_UNSUPPORTED, "not supported"},
        {"ndim0.gz", {0, 0, 0x08, 0}, 4, MPR_ERR_DECODE, "dimensions"},
        {"short_hdr.gz", {0, 0, 0x08}, 3, MPR_ERR_DECODE, "truncated"},
        {"short_dims.gz", {0, 0, 0x08, 2, 0, 0, 0, 1}, 8, MPR_ERR_DECODE, "truncated"},
        {"short_data.gz", {0, 0, 0x08, 1, 0, 0, 0, 5, 1, 2, 3}, 11, MPR_ERR_DECODE, "truncated"},
        {"trailing.gz", {0, 0, 0x08, 1, 0, 0, 0, 2, 1, 2, 3}, 11, MPR_ERR_DECODE, "trailing"},
        {"huge.gz", {0, 0, 0x0E, 2, 0, 1, 0, 0, 0, 1, 0, 0}, 12, MPR_ERR_DECODE, "limit"},
        {"overflow.gz", {0, 0, 0x0E, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 16,
         MPR_ERR_DECODE, "too large"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_gz(tmp_path(bad[i].name), bad[i].bytes, bad[i].len);
        assert_null(mpr_idx_load(tmp_path(bad[i].name)));
        if (mpr_last_error_code() != bad[i].code || !strstr(mpr_last_error(), bad[i].msg))
            fail_msg("%s: got %s: %s", bad[i].name, mpr_error_name(mpr_last_error_code()), mpr_last_error());
        assert_non_null(strstr(mpr_last_error(), bad[i].name));
    }
    /* A gzip stream cut short, and corrupted compressed bytes. */
    unsigned char big[4096 + 12] = {0, 0, 0x08, 2, 0, 0, 0, 64, 0, 0, 0, 64};
    for (int i = 12; i < (int)sizeof big; i++) big[i] = (unsigned char)(i * 7 + (i >> 5));
    write_gz(tmp_path("full.gz"), big, sizeof big);
    FILE *f = fopen(tmp_path("full.gz"), "rb");
    unsigned char comp[8192];
    size_t clen = fread(comp, 1, sizeof comp, f);
    fclose(f);
    write_plain(tmp_path("cut.gz"), comp, clen / 2);
    assert_null(mpr_idx_load(tmp_path("cut.gz")));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_DECODE);
    for (size_t i = 20; i < clen - 8; i++) comp[i] ^= 0x5a;
    write_plain(tmp_path("corrupt.gz"), comp, clen);
    assert_null(mpr_idx_load(tmp_path("corrupt.gz")));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_DECODE);
    assert_null(mpr_idx_load(tmp_path("does_not_exist.gz")));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_IO);
    assert_int_equal(mpr_tensor_live_count(), live);
}

/* Run one epoch; record the first column (the row id) of every row seen. */
static int64_t epoch(mpr_batch_iter_t *it, float *seen, int64_t *label_sum, int64_t *batches) {
    int64_t n = 0;
    mpr_tensor_t *x, *y;
    *batches = 0;
    *label_sum = 0;
    while (mpr_batch_iter_next(it, &x, &y)) {
        assert_int_equal(mpr_tensor_shape(x)[0], mpr_tensor_shape(y)[0]);
        const float *px = mpr_tensor_data(x);
        const int64_t *py = mpr_tensor_data(y);
        for (int64_t i = 0; i < mpr_tensor_shape(x)[0]; i++) {
            assert_true(px[i * 3 + 1] == px[i * 3] * 2); /* rows move as a whole */
            assert_int_equal(py[i], (int64_t)px[i * 3] + 100); /* labels follow their rows */
            seen[n++] = px[i * 3];
            *label_sum += py[i];
        }
        mpr_tensor_release(x);
        mpr_tensor_release(y);
        (*batches)++;
    }
    return n;
}

static void test_batch_iterator(void **state) {
    int64_t live = mpr_tensor_live_count();
    const int64_t n = 10;
    mpr_tensor_t *data = mpr_tensor_empty(MPR_F32, 2, (const int64_t[]){n, 3});
    mpr_tensor_t *labels = mpr_tensor_empty(MPR_I64, 1, (const int64_t[]){n});
    float *pd = mpr_tensor_data(data);
    int64_t *pl = mpr_tensor_data(labels);
    for (int64_t i = 0; i < n; i++) {
        pd[i * 3] = (float)i;
        pd[i * 3 + 1] = (float)(2 * i);
        pd[i * 3 + 2] = 0;
        pl[i] = i + 100;
    }
    float a[10], b[10], c[10];
    int64_t sum, batches;
    /* Unshuffled: rows in order, a final partial batch of 1. */
    mpr_batch_iter_t *it = mpr_batch_iter_create(data, labels, 3, false, false, 0);
    assert_non_null(it);
    assert_int_equal(mpr_batch_iter_num_batches(it), 4);
    assert_int_equal(epoch(it, a, &sum, &batches), n);
    assert_int_equal(batches, 4);
    for (int i = 0; i < n; i++) assert_true(a[i] == i);
    mpr_batch_iter_destroy(it);
    /* Shuffled: a permutation each epoch, different epochs differ, same seed repeats. */
    it = mpr_batch_iter_create(data, labels, 4, true, false, 42);
    assert_int_equal(epoch(it, a, &sum, &batches), n);
    assert_int_equal(sum, 100 * n + n * (n - 1) / 2);
    assert_int_equal(epoch(it, b, &sum, &batches), n);
    assert_int_equal(sum, 100 * n + n * (n - 1) / 2);
    assert_true(memcmp(a, b, sizeof a) != 0);
    bool in_order = true;
    for (int i = 0; i < n; i++) in_order &= a[i] == i;
    assert_false(in_order);
    mpr_batch_iter_destroy(it);
    it = mpr_batch_iter_create(data, labels, 4, true, false, 42);
    assert_int_equal(epoch(it, c, &sum, &batches), n);
    assert_memory_equal(a, c, sizeof a);
    /* reset abandons an epoch part-way. */
    mpr_tensor_t *x, *y;
    assert_true(mpr_batch_iter_next(it, &x, &y));
    mpr_tensor_release(x);
    mpr_tensor_release(y);
    mpr_batch_iter_reset(it);
    assert_int_equal(epoch(it, c, &sum, &batches), n);
    mpr_batch_iter_destroy(it);
    /* drop_last skips the partial batch. */
    it = mpr_batch_iter_create(data, labels, 4, true, true, 1);
    assert_int_equal(mpr_batch_iter_num_batches(it), 2);
    assert_int_equal(epoch(it, a, &sum, &batches), 8);
    assert_int_equal(batches, 2);
    mpr_batch_iter_destroy(it);
    /* Inside a scope the batches belong to the scope. */
    it = mpr_batch_iter_create(data, NULL, 5, true, false, 3);
    mpr_scope_begin();
    assert_true(mpr_batch_iter_next(it, &x, &y));
    assert_null(y);
    assert_int_equal(mpr_tensor_shape(x)[0], 5);
    mpr_scope_end();
    mpr_batch_iter_destroy(it);
    /* Bad arguments. */
    mpr_tensor_t *short_labels = mpr_tensor_empty(MPR_I64, 1, (const int64_t[]){n - 1});
    assert_null(mpr_batch_iter_create(data, short_labels, 4, true, false, 0));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_SHAPE);
    assert_null(mpr_batch_iter_create(data, labels, 0, true, false, 0));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_INVALID_ARG);
    mpr_batch_iter_destroy(NULL);
    mpr_tensor_release(short_labels);
    mpr_tensor_release(data);
    mpr_tensor_release(labels);
    assert_int_equal(mpr_tensor_live_count(), live);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idx_files),
        cmocka_unit_test(test_fashion_mnist),
        cmocka_unit_test(test_batch_iterator),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
