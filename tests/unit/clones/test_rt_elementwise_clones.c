/* test_rt_elementwise_clones.c — the elementwise kernels' AVX2 clone gives
 * the baseline clone's bits (runtime/kernels/cpu_clones.h).
 *
 * This test is built with its own copy of cpu_elementwise.c compiled for
 * baseline x86-64 only (MPRI_KERNELS_BASELINE_ONLY); the library's kernels,
 * looked up in libmpirpc with dlsym, run the clone the CPU picks (AVX2 where
 * it has it). Every unary op forward and backward, f32 and f64, and every
 * binary op over contiguous, broadcast and strided rows, on inputs with
 * zeros of both signs, NaN, infinities, tiny and huge values and odd lengths
 * (vector tails): the two must agree bit for bit. On a CPU without AVX2 the
 * library runs the baseline clone too and the test still checks the
 * dispatch. */
#include <dlfcn.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/mpri_kernels.h"

typedef void (*unary_fn)(mpri_unop_t, mpr_dtype_t, int64_t, void *, const void *, double, double);
typedef void (*unary_bw_fn)(mpri_unop_t, mpr_dtype_t, int64_t, void *, const void *, const void *, const void *,
                            double, double);
typedef void (*binary_fn)(mpri_binop_t, mpr_dtype_t, int, const int64_t *, void *, const int64_t *, const void *,
                          const int64_t *, const void *, const int64_t *, double);

static void *library_symbol(const char *name) {
    /* the test uses no symbol of the library itself (its kernels are its own
     * copy), so the linker may have left it out: load it here */
    void *lib = dlopen("libmpirpc.so.0", RTLD_NOW | RTLD_LOCAL);
    assert_non_null(lib);
    void *f = dlsym(lib, name);
    assert_non_null(f);
    assert_true(f != dlsym(RTLD_DEFAULT, name)); /* the test's own copy is another function */
    return f; /* the library stays loaded (no dlclose) */
}

#define N 1031 /* not a multiple of any vector width */

static void fill(double *v, uint32_t seed) {
    const double specials[] = {0.0, -0.0, NAN, INFINITY, -INFINITY, 1e-310, -1e-40, 3e38, -7e300, 1.0, -1.0, 0.5};
    for (int i = 0; i < N; i++) {
        seed = seed * 1664525u + 1013904223u;
        v[i] = i % 17 == 0 ? specials[(i / 17) % 12] : ((double)(seed >> 8) / (1 << 24) - 0.5) * 8.0;
    }
}

static void test_unary_clones_agree(void **state) {
    (void)state;
    unary_fn lib_unary = (unary_fn)library_symbol("mpri_k_unary");
    unary_bw_fn lib_bw = (unary_bw_fn)library_symbol("mpri_k_unary_backward");
    double x[N], g[N], y[N];
    fill(x, 1);
    fill(g, 2);
    float xf[N], gf[N], yf[N];
    for (int i = 0; i < N; i++) xf[i] = (float)x[i], gf[i] = (float)g[i];
    const double params[][2] = {{0, 0}, {2.0, 0}, {0.5, 0}, {-1.25, 2.5}};
    for (int op = 0; op < MPRI_UN_COUNT; op++)
        for (size_t p = 0; p < sizeof params / sizeof params[0]; p++)
            for (int f64 = 0; f64 <= 1; f64++) {
                mpr_dtype_t dt = f64 ? MPR_F64 : MPR_F32;
                size_t sz = f64 ? sizeof(double) : sizeof(float);
                const void *in = f64 ? (const void *)x : (const void *)xf, *go = f64 ? (const void *)g : (const void *)gf;
                double a[N], b[N]; /* room for N of either type, aligned for both */
                mpri_k_unary((mpri_unop_t)op, dt, N, a, in, params[p][0], params[p][1]);
                lib_unary((mpri_unop_t)op, dt, N, b, in, params[p][0], params[p][1]);
                assert_memory_equal(a, b, N * sz);
                memcpy(f64 ? (void *)y : (void *)yf, a, N * sz); /* the forward's output, for backward */
                const void *out = f64 ? (const void *)y : (const void *)yf;
                mpri_k_unary_backward((mpri_unop_t)op, dt, N, a, go, in, out, params[p][0], params[p][1]);
                lib_bw((mpri_unop_t)op, dt, N, b, go, in, out, params[p][0], params[p][1]);
                assert_memory_equal(a, b, N * sz);
            }
}

static void test_binary_clones_agree(void **state) {
    (void)state;
    binary_fn lib_binary = (binary_fn)library_symbol("mpri_k_binary");
    double x[N], z[N];
    fill(x, 3);
    fill(z, 4);
    float xf[N], zf[N];
    for (int i = 0; i < N; i++) xf[i] = (float)x[i], zf[i] = (float)z[i];
    /* [rows, cols] with strides for o, a, b: contiguous; b broadcast along a
     * row (stride 0); a broadcast; everything strided by 2 */
    const int64_t shape[2] = {3, 301};
    const int64_t cases[][3][2] = {{{301, 1}, {301, 1}, {301, 1}},
                                   {{301, 1}, {301, 1}, {1, 0}},
                                   {{301, 1}, {0, 1}, {301, 1}},
                                   {{301, 1}, {2, 2}, {3, 3}}};
    for (int op = MPRI_BIN_ADD; op <= MPRI_BIN_DIV; op++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (int f64 = 0; f64 <= 1; f64++) {
                mpr_dtype_t dt = f64 ? MPR_F64 : MPR_F32;
                size_t sz = f64 ? sizeof(double) : sizeof(float);
                const void *a = f64 ? (const void *)x : (const void *)xf, *b = f64 ? (const void *)z : (const void *)zf;
                double o1[N], o2[N];
                mpri_k_binary((mpri_binop_t)op, dt, 2, shape, o1, cases[c][0], a, cases[c][1], b, cases[c][2], 0.75);
                lib_binary((mpri_binop_t)op, dt, 2, shape, o2, cases[c][0], a, cases[c][1], b, cases[c][2], 0.75);
                assert_memory_equal(o1, o2, (size_t)(shape[0] * shape[1]) * sz);
            }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unary_clones_agree),
        cmocka_unit_test(test_binary_clones_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
