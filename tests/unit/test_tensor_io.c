/* test_tensor_io.c — .npy and .safetensors round trips, files written by NumPy
 * (tests/data/io_*.npy from tests/ref/gen_refs.py), and rejection of
 * malformed, truncated and unsupported files with the right error codes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "mpirpc/tensor_io.h"
#include "mpri_tensor.h"

static char tmpdir[256];

static const char *tmp_path(const char *name) {
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", tmpdir, name);
    return buf;
}

static int setup(void **state) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/mpirpc_io_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* A tensor of `dtype` and `shape` whose element i holds i*3+1 (as that dtype). */
static mpr_tensor_t *iota(mpr_dtype_t dtype, int ndim, const int64_t *shape) {
    mpr_tensor_t *t = mpr_tensor_empty(dtype, ndim, shape);
    assert_non_null(t);
    int64_t n = mpr_tensor_numel(t);
    void *d = mpr_tensor_data(t);
    for (int64_t i = 0; i < n; i++) {
        double v = (double)(i * 3 + 1) * (dtype == MPR_F32 || dtype == MPR_F64 ? 0.25 : 1);
        switch (dtype) {
        case MPR_F32: ((float *)d)[i] = (float)v; break;
        case MPR_F64: ((double *)d)[i] = v; break;
        case MPR_I64: ((int64_t *)d)[i] = (int64_t)v - 50; break;
        case MPR_I32: ((int32_t *)d)[i] = (int32_t)v - 50; break;
        case MPR_U8: ((uint8_t *)d)[i] = (uint8_t)v; break;
        default: fail();
        }
    }
    return t;
}

static void assert_same(const mpr_tensor_t *a, const mpr_tensor_t *b) {
    assert_int_equal(mpr_tensor_dtype(a), mpr_tensor_dtype(b));
    assert_int_equal(mpr_tensor_ndim(a), mpr_tensor_ndim(b));
    for (int i = 0; i < mpr_tensor_ndim(a); i++) assert_int_equal(mpr_tensor_shape(a)[i], mpr_tensor_shape(b)[i]);
    /* (empty tensors: mpr_tensor_is_contiguous is false for [3, 0, 2] in runtime/tensor.c) */
    if (mpr_tensor_numel(b) > 0) assert_true(mpr_tensor_is_contiguous(b));
    assert_memory_equal(mpr_tensor_data(a), mpr_tensor_data(b), mpr_tensor_nbytes(a));
}

static void test_npy_roundtrip_all_dtypes(void **state) {
    int64_t live = mpr_tensor_live_count();
    const int64_t shapes[][3] = {{2, 3, 4}, {5, 0, 0}, {7, 0, 0}, {0, 0, 0}, {3, 0, 2}};
    const int ndims[] = {3, 1, 1, 0, 3};
    for (int dt = 0; dt < MPR_DTYPE_COUNT; dt++)
        for (size_t s = 0; s < sizeof ndims / sizeof ndims[0]; s++) {
            mpr_tensor_t *t = iota((mpr_dtype_t)dt, ndims[s], shapes[s]);
            assert_int_equal(mpr_tensor_save_npy(t, tmp_path("a.npy")), MPR_OK);
            mpr_tensor_t *u = mpr_tensor_load_npy(tmp_path("a.npy"));
            assert_non_null(u);
            assert_same(t, u);
            /* NumPy requires the data to start on a 64-byte boundary (v1.0). */
            void *buf;
            size_t len;
            assert_int_equal(mpr_tensor_npy_encode(t, &buf, &len), MPR_OK);
            size_t hlen = ((unsigned char *)buf)[8] | ((unsigned char *)buf)[9] << 8;
            assert_int_equal((10 + hlen) % 64, 0);
            assert_int_equal(((char *)buf)[10 + hlen - 1], '\n');
            free(buf);
            mpr_tensor_release(t);
            mpr_tensor_release(u);
        }
    assert_int_equal(mpr_tensor_live_count(), live);
}

static void test_npy_strided_save(void **state) {
    /* A transposed view [3, 2] of a [2, 3] tensor is written in C order. */
    mpr_tensor_t *t = iota(MPR_F32, 2, (const int64_t[]){2, 3});
    mpr_tensor_t *v = mpri_tensor_view(t->storage, MPR_F32, 2, (const int64_t[]){3, 2}, (const int64_t[]){1, 3}, 0);
    assert_non_null(v);
    assert_int_equal(mpr_tensor_save_npy(v, tmp_path("t.npy")), MPR_OK);
    mpr_tensor_t *u = mpr_tensor_load_npy(tmp_path("t.npy"));
    assert_non_null(u);
    const float *a = mpr_tensor_data(t), *b = mpr_tensor_data(u);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) assert_true(b[i * 2 + j] == a[j * 3 + i]);
    mpr_tensor_release(u);
    mpr_tensor_release(v);
    mpr_tensor_release(t);
}

/* Files written by numpy.save (tests/ref/gen_refs.py). */
static void test_npy_numpy_files(void **state) {
    const char *dir = getenv("MPIRPC_TEST_DATA");
    if (!dir) skip();
    char path[512];
    const struct {
        const char *name;
        mpr_dtype_t dt;
    } files[] = {{"io_f32.npy", MPR_F32}, {"io_f64.npy", MPR_F64}, {"io_i64.npy", MPR_I64},
                 {"io_i32.npy", MPR_I32}, {"io_u8.npy", MPR_U8}};
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[f].name);
        mpr_tensor_t *t = mpr_tensor_load_npy(path);
        assert_non_null(t);
        /* np.arange(24).reshape(2, 3, 4) as that dtype. */
        assert_int_equal(mpr_tensor_dtype(t), files[f].dt);
        assert_int_equal(mpr_tensor_ndim(t), 3);
        assert_int_equal(mpr_tensor_shape(t)[0], 2);
        assert_int_equal(mpr_tensor_shape(t)[2], 4);
        for (int i = 0; i < 24; i++) {
            double v = 0;
            void *d = mpr_tensor_data(t);
            switch (files[f].dt) {
            case MPR_F32: v = ((float *)d)[i]; break;
            case MPR_F64: v = ((double *)d)[i]; break;
            case MPR_I64: v = (double)((int64_t *)d)[i]; break;
            case MPR_I32: v = ((int32_t *)d)[i]; break;
            case MPR_U8: v = ((uint8_t *)d)[i]; break;
            default: fail();
            }
            assert_true(v == i);
        }
        mpr_tensor_release(t);
    }
    snprintf(path, sizeof path, "%s/io_scalar_f64.npy", dir);
    mpr_tensor_t *s = mpr_tensor_load_npy(path);
    assert_non_null(s);
    assert_int_equal(mpr_tensor_ndim(s), 0);
    assert_true(*(double *)mpr_tensor_data(s) == 2.5);
    mpr_tensor_release(s);
    snprintf(path, sizeof path, "%s/io_fortran.npy", dir);
    assert_null(mpr_tensor_load_npy(path));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_UNSUPPORTED);
    assert_non_null(strstr(mpr_last_error(), "Fortran"));
    snprintf(path, sizeof path, "%s/io_bigendian.npy", dir);
    assert_null(mpr_tensor_load_npy(path));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_UNSUPPORTED);
    assert_non_null(strstr(mpr_last_error(), "big-endian"));
}

static mpr_tensor_t *decode_str(const char *header, size_t data_bytes) {
    unsigned char buf[512] = {0};
    size_t hl = strlen(header);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)hl;
    buf[9] = 0;
    memcpy(buf + 10, header, hl);
    return mpr_tensor_npy_decode(buf, 10 + hl + data_bytes, "test");
}

static void test_npy_rejects_bad_input(void **state) {
    int64_t live = mpr_tensor_live_count();
    /* Sanity: a well-formed header decodes. */
    mpr_tensor_t *ok = decode_str("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", 24);
    assert_non_null(ok);
    mpr_tensor_release(ok);
    struct {
        const char *hdr;
        size_t data;
        mpr_err_t code;
    } cases[] = {
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", 23, MPR_ERR_DECODE}, /* truncated */
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", 25, MPR_ERR_DECODE}, /* trailing */
        {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }\n", 24, MPR_ERR_UNSUPPORTED},
        {"{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }\n", 24, MPR_ERR_UNSUPPORTED},
        {"{'descr': '<f2', 'fortran_order': False, 'shape': (2, 3), }\n", 12, MPR_ERR_UNSUPPORTED},
        {"{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }\n", 16, MPR_ERR_UNSUPPORTED},
        {"{'descr': '<f4', 'shape': (2, 3), }\n", 24, MPR_ERR_DECODE},                       /* missing key */
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }\n", 24, MPR_ERR_DECODE},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, }\n", 24, MPR_ERR_DECODE},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}\n", 24, MPR_ERR_DECODE},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}\n", 24, MPR_ERR_DECODE},
        {"{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2, 3)}\n", 24, MPR_ERR_DECODE},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999, 99999999999)}\n", 24,
         MPR_ERR_INVALID_ARG},
        {"['descr']\n", 0, MPR_ERR_DECODE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mpr_error_clear();
        assert_null(decode_str(cases[i].hdr, cases[i].data));
        if (mpr_last_error_code() != cases[i].code)
            fail_msg("case %zu: got %s (%s)", i, mpr_error_name(mpr_last_error_code()), mpr_last_error());
        assert_non_null(strstr(mpr_last_error(), "test"));
    }
    /* Bad magic, short buffers, header length past the end, unknown version. */
    assert_null(mpr_tensor_npy_decode("\x93NUMPZ\x01\x00\x00\x00", 10, "m"));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_DECODE);
    assert_null(mpr_tensor_npy_decode("\x93NUMPY\x01", 7, "m"));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_DECODE);
    assert_null(mpr_tensor_npy_decode("\x93NUMPY\x01\x00\xff\x00{", 11, "m"));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_DECODE);
    assert_null(mpr_tensor_npy_decode("\x93NUMPY\x02\x00\x00\x00", 10, "m"));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_DECODE);
    assert_null(mpr_tensor_npy_decode("\x93NUMPY\x09\x00\x00\x00", 10, "m"));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_UNSUPPORTED);
    /* Every truncation of a valid file fails cleanly. */
    mpr_tensor_t *t = iota(MPR_F64, 2, (const int64_t[]){3, 5});
    void *buf;
    size_t len;
    assert_int_equal(mpr_tensor_npy_encode(t, &buf, &len), MPR_OK);
    for (size_t cut = 0; cut < len; cut++) {
        void *copy = malloc(cut ? cut : 1);
        memcpy(copy, buf, cut);
        assert_null(mpr_tensor_npy_decode(copy, cut, "cut"));
        free(copy);
    }
    free(buf);
    mpr_tensor_release(t);
    /* Missing file: an I/O error naming the path. */
    assert_null(mpr_tensor_load_npy("/nonexistent/dir/x.npy"));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_IO);
    assert_non_null(strstr(mpr_last_error(), "/nonexistent/dir/x.npy"));
    assert_int_equal(mpr_tensor_live_count(), live);
}

static void test_safetensors_roundtrip(void **state) {
    int64_t live = mpr_tensor_live_count();
    mpr_tensor_dict_t *d = mpr_tensor_dict_create();
    const char *names[] = {"fc1.weight", "fc1.bias", "idx", "count32", "bytes", "scalar", "empty"};
    mpr_tensor_t *ts[7];
    ts[0] = iota(MPR_F32, 2, (const int64_t[]){4, 3});
    ts[1] = iota(MPR_F64, 1, (const int64_t[]){4});
    ts[2] = iota(MPR_I64, 1, (const int64_t[]){5});
    ts[3] = iota(MPR_I32, 2, (const int64_t[]){2, 2});
    ts[4] = iota(MPR_U8, 1, (const int64_t[]){7});
    ts[5] = iota(MPR_F32, 0, NULL);
    ts[6] = iota(MPR_F32, 2, (const int64_t[]){0, 3});
    for (int i = 0; i < 7; i++) assert_int_equal(mpr_tensor_dict_set(d, names[i], ts[i]), MPR_OK);
    assert_int_equal(mpr_tensor_dict_set_meta(d, "format", "pt"), MPR_OK);
    assert_int_equal(mpr_tensor_dict_set_meta(d, "note", "quote \" and \\ and \n"), MPR_OK);
    assert_int_equal(mpr_tensor_dict_set(d, "__metadata__", ts[0]), MPR_ERR_INVALID_ARG);
    assert_int_equal(mpr_safetensors_save(d, tmp_path("m.safetensors")), MPR_OK);
    mpr_tensor_dict_t *e = mpr_safetensors_load(tmp_path("m.safetensors"));
    assert_non_null(e);
    assert_int_equal(mpr_tensor_dict_count(e), 7);
    for (int i = 0; i < 7; i++) {
        mpr_tensor_t *u = mpr_tensor_dict_get(e, names[i]);
        assert_non_null(u);
        assert_same(ts[i], u);
    }
    assert_string_equal(mpr_tensor_dict_get_meta(e, "format"), "pt");
    assert_string_equal(mpr_tensor_dict_get_meta(e, "note"), "quote \" and \\ and \n");
    /* Metadata enumerates in insertion order, with bounds checked. */
    assert_int_equal(mpr_tensor_dict_meta_count(e), 2);
    assert_string_equal(mpr_tensor_dict_meta_key(e, 0), "format");
    assert_string_equal(mpr_tensor_dict_meta_value(e, 0), "pt");
    assert_string_equal(mpr_tensor_dict_meta_key(e, 1), "note");
    assert_null(mpr_tensor_dict_meta_key(e, 2));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_INVALID_ARG);
    assert_null(mpr_tensor_dict_meta_value(e, 2));
    /* update: new entries added, same names replaced, src unchanged */
    mpr_tensor_dict_t *u = mpr_tensor_dict_create();
    assert_int_equal(mpr_tensor_dict_set(u, names[0], ts[1]), MPR_OK);
    assert_int_equal(mpr_tensor_dict_set(u, "only_in_u", ts[2]), MPR_OK);
    assert_int_equal(mpr_tensor_dict_set_meta(u, "format", "old"), MPR_OK);
    assert_int_equal(mpr_tensor_dict_update(u, e), MPR_OK);
    assert_int_equal(mpr_tensor_dict_count(u), 8);
    assert_ptr_equal(mpr_tensor_dict_get(u, names[0]), mpr_tensor_dict_get(e, names[0]));
    assert_ptr_equal(mpr_tensor_dict_get(u, "only_in_u"), ts[2]);
    assert_string_equal(mpr_tensor_dict_get_meta(u, "format"), "pt");
    assert_int_equal(mpr_tensor_dict_meta_count(u), 2);
    assert_int_equal(mpr_tensor_dict_count(e), 7);
    assert_int_equal(mpr_tensor_dict_update(u, NULL), MPR_ERR_INVALID_ARG);
    mpr_tensor_dict_destroy(u);
    assert_null(mpr_tensor_dict_get(e, "nope"));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_NOT_FOUND);
    /* The header length is a multiple of 8 and the header is JSON. */
    void *buf;
    size_t len;
    assert_int_equal(mpr_safetensors_encode(d, &buf, &len), MPR_OK);
    uint64_t hl;
    memcpy(&hl, buf, 8);
    assert_int_equal(hl % 8, 0);
    assert_int_equal(((char *)buf)[8], '{');
    free(buf);
    /* Replacing an entry keeps the count. */
    assert_int_equal(mpr_tensor_dict_set(d, "fc1.bias", ts[1]), MPR_OK);
    assert_int_equal(mpr_tensor_dict_count(d), 7);
    mpr_tensor_dict_destroy(e);
    mpr_tensor_dict_destroy(d);
    for (int i = 0; i < 7; i++) mpr_tensor_release(ts[i]);
    mpr_tensor_dict_destroy(NULL);
    assert_int_equal(mpr_tensor_live_count(), live);
}

static mpr_tensor_dict_t *st_decode(const char *json, size_t data_bytes) {
    unsigned char buf[1024] = {0};
    uint64_t hl = strlen(json);
    memcpy(buf, &hl, 8);
    memcpy(buf + 8, json, hl);
    return mpr_safetensors_decode(buf, 8 + hl + data_bytes, "st");
}

static void test_safetensors_rejects_bad_input(void **state) {
    int64_t live = mpr_tensor_live_count();
    mpr_tensor_dict_t *ok = st_decode("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    assert_non_null(ok);
    mpr_tensor_dict_destroy(ok);
    /* Whitespace after the JSON is the format's padding; 8.0 reads as 8. */
    ok = st_decode("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}  \n\t ", 8);
    assert_non_null(ok);
    assert_int_equal(mpr_tensor_shape(mpr_tensor_dict_get(ok, "a"))[0], 2);
    mpr_tensor_dict_destroy(ok);
    struct {
        const char *json;
        size_t data;
        mpr_err_t code;
    } cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 7, MPR_ERR_DECODE},  /* truncated */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, MPR_ERR_DECODE},  /* size */
        {"{\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]}}", 8, MPR_ERR_UNSUPPORTED},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, MPR_ERR_DECODE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, MPR_ERR_DECODE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, MPR_ERR_DECODE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, MPR_ERR_DECODE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         12, MPR_ERR_DECODE}, /* overlap */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
         8, MPR_ERR_DECODE}, /* duplicate key */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, MPR_ERR_DECODE}, /* bad JSON */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} x", 8, MPR_ERR_DECODE},
        {"{\"__metadata__\":{\"k\":1}}", 0, MPR_ERR_DECODE},
        {"{\"a\":[1,2]}", 0, MPR_ERR_DECODE},
        {"[1,2]", 0, MPR_ERR_DECODE},
        {"{\"a\":\"\\ud800\"}", 0, MPR_ERR_DECODE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8, MPR_ERR_DECODE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,99999999999999999999999]}}", 8,
         MPR_ERR_DECODE},
        /* What a general JSON reader (cJSON) accepts but a safetensors header must not contain: */
        {"{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         MPR_ERR_DECODE}, /* repeated key inside an entry */
        {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, MPR_ERR_DECODE}, /* repeated metadata key */
        {"{\"__metadata__\":{},\"__metadata__\":{}}", 0, MPR_ERR_DECODE},
        {"{\"a\":{\"DTYPE\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, MPR_ERR_DECODE}, /* keys are case-sensitive */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8.5]}}", 8, MPR_ERR_DECODE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-0.5,8]}}", 8, MPR_ERR_DECODE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1e400],\"data_offsets\":[0,8]}}", 8, MPR_ERR_DECODE},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[9007199254740993],\"data_offsets\":[0,8]}}", 8,
         MPR_ERR_DECODE}, /* above 2^53: not exact in a double */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8, MPR_ERR_DECODE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}{}", 8, MPR_ERR_DECODE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},}", 8, MPR_ERR_DECODE},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} /* */", 8, MPR_ERR_DECODE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mpr_error_clear();
        assert_null(st_decode(cases[i].json, cases[i].data));
        if (mpr_last_error_code() != cases[i].code)
            fail_msg("case %zu: got %s (%s)", i, mpr_error_name(mpr_last_error_code()), mpr_last_error());
    }
    /* Header length larger than the file; file shorter than 8 bytes. */
    unsigned char big[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'};
    assert_null(mpr_safetensors_decode(big, sizeof big, "st"));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_DECODE);
    assert_null(mpr_safetensors_decode(big, 5, "st"));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_DECODE);
    /* Deeply nested JSON is refused, not a stack overflow. */
    char deep[600];
    memset(deep, '[', sizeof deep - 1);
    deep[0] = '{';
    deep[sizeof deep - 1] = '\0';
    assert_null(st_decode("{\"a\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}", 0));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_DECODE);
    assert_null(st_decode(deep, 0));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_DECODE);
    /* Every truncation of a valid file fails cleanly. */
    mpr_tensor_dict_t *d = mpr_tensor_dict_create();
    mpr_tensor_t *t = iota(MPR_F32, 2, (const int64_t[]){2, 3});
    mpr_tensor_dict_set(d, "w", t);
    mpr_tensor_dict_set(d, "b", t);
    void *buf;
    size_t len;
    assert_int_equal(mpr_safetensors_encode(d, &buf, &len), MPR_OK);
    for (size_t cut = 0; cut < len; cut++) assert_null(mpr_safetensors_decode(buf, cut, "cut"));
    free(buf);
    mpr_tensor_dict_destroy(d);
    mpr_tensor_release(t);
    assert_null(mpr_safetensors_load("/nonexistent/m.safetensors"));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_IO);
    assert_int_equal(mpr_tensor_live_count(), live);
}

static void test_load_into_parameters(void **state) {
    int64_t live = mpr_tensor_live_count();
    mpr_tensor_t *w = iota(MPR_F32, 2, (const int64_t[]){3, 2});
    mpr_tensor_t *b = iota(MPR_F32, 1, (const int64_t[]){3});
    const char *names[] = {"w", "b"};
    mpr_tensor_t *params[] = {w, b};
    assert_int_equal(mpr_safetensors_save_list(tmp_path("p.safetensors"), 2, names, params), MPR_OK);
    const char *dup[] = {"w", "w"};
    assert_int_equal(mpr_safetensors_save_list(tmp_path("q.safetensors"), 2, dup, params), MPR_ERR_INVALID_ARG);
    /* Fresh targets of the same shapes receive the values; versions bump. */
    mpr_tensor_t *w2 = mpr_tensor_empty(MPR_F32, 2, (const int64_t[]){3, 2});
    mpr_tensor_t *b2 = mpr_tensor_empty(MPR_F32, 1, (const int64_t[]){3});
    mpr_tensor_t *targets[] = {w2, b2};
    unsigned long v0 = atomic_load(&w2->storage->version);
    assert_int_equal(mpr_safetensors_load_into(tmp_path("p.safetensors"), 2, names, targets, true), MPR_OK);
    assert_same(w, w2);
    assert_same(b, b2);
    assert_true(atomic_load(&w2->storage->version) > v0);
    /* Shape / dtype / name mismatches: errors, nothing written. */
    mpr_tensor_t *wrong = mpr_tensor_empty(MPR_F32, 2, (const int64_t[]){2, 3});
    mpr_tensor_t *t2[] = {b2, wrong};
    const char *n2[] = {"b", "w"};
    assert_int_equal(mpr_safetensors_load_into(tmp_path("p.safetensors"), 2, n2, t2, false), MPR_ERR_SHAPE);
    assert_non_null(strstr(mpr_last_error(), "[3, 2]"));
    assert_non_null(strstr(mpr_last_error(), "[2, 3]"));
    mpr_tensor_t *wd = mpr_tensor_empty(MPR_F64, 2, (const int64_t[]){3, 2});
    mpr_tensor_t *t3[] = {wd};
    assert_int_equal(mpr_safetensors_load_into(tmp_path("p.safetensors"), 1, names, t3, false), MPR_ERR_DTYPE);
    const char *n4[] = {"missing"};
    assert_int_equal(mpr_safetensors_load_into(tmp_path("p.safetensors"), 1, n4, targets, false),
                     MPR_ERR_NOT_FOUND);
    /* strict: the file's extra entry "b" is an error; non-strict loads just "w". */
    assert_int_equal(mpr_safetensors_load_into(tmp_path("p.safetensors"), 1, names, targets, true),
                     MPR_ERR_NOT_FOUND);
    assert_int_equal(mpr_safetensors_load_into(tmp_path("p.safetensors"), 1, names, targets, false), MPR_OK);
    /* Strided target (a transposed view) gets the values in C order. */
    mpr_tensor_t *base = mpr_tensor_empty(MPR_F32, 2, (const int64_t[]){2, 3});
    mpr_tensor_t *tv = mpri_tensor_view(base->storage, MPR_F32, 2, (const int64_t[]){3, 2},
                                        (const int64_t[]){1, 3}, 0);
    mpr_tensor_t *t5[] = {tv};
    assert_int_equal(mpr_safetensors_load_into(tmp_path("p.safetensors"), 1, names, t5, false), MPR_OK);
    const float *src = mpr_tensor_data(w), *dst = mpr_tensor_data(base);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) assert_true(dst[j * 3 + i] == src[i * 2 + j]);
    mpr_tensor_release(tv);
    mpr_tensor_release(base);
    mpr_tensor_release(wd);
    mpr_tensor_release(wrong);
    mpr_tensor_release(w2);
    mpr_tensor_release(b2);
    mpr_tensor_release(w);
    mpr_tensor_release(b);
    assert_int_equal(mpr_tensor_live_count(), live);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_npy_roundtrip_all_dtypes),
        cmocka_unit_test(test_npy_strided_save),
        cmocka_unit_test(test_npy_numpy_files),
        cmocka_unit_test(test_npy_rejects_bad_input),
        cmocka_unit_test(test_safetensors_roundtrip),
        cmocka_unit_test(test_safetensors_rejects_bad_input),
        cmocka_unit_test(test_load_into_parameters),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
