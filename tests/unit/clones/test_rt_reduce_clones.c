/* test_rt_reduce_clones.c — the sum-into kernel's AVX2 clone gives the
 * baseline clone's bits (runtime/kernels/cpu_clones.h, cpu_reduce.c).
 *
 * Built with its own copy of cpu_reduce.c compiled for baseline x86-64 only
 * (MPRI_KERNELS_BASELINE_ONLY); the library's mpri_k_sum_into, looked up in
 * libmpirpc with dlsym, runs the clone the CPU picks (AVX2 where it has it).
 * Full sums (one output: the 8 interleaved partial sums of a contiguous
 * row), sums along the last dim (one output per row), along the first dim
 * (outputs added elementwise) and over strided input, f32 and f64, lengths
 * around every vector width and long rows, values of mixed magnitudes with
 * zeros of both signs and, in some rows, NaN and infinities: the outputs
 * (which the kernel adds into, so they start non-zero) must agree bit for
 * bit, but for NaN results, which must be NaN in both (the sign of a NaN made
 * from inf - inf or carried from two NaNs follows the operand order of the
 * add instruction, which IEEE 754 leaves open: the AVX2 clone's NaN sums had
 * the other sign). On a CPU without AVX2 both run the baseline and the test
 * still checks the dispatch. */
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

typedef void (*sum_into_fn)(mpr_dtype_t, int, const int64_t *, void *, const int64_t *, const void *,
                            const int64_t *);

static sum_into_fn library_sum_into(void) {
    /* the test calls its own copy; the library's is loaded here */
    void *lib = dlopen("libmpirpc.so.0", RTLD_NOW | RTLD_LOCAL);
    assert_non_null(lib);
    void *f = dlsym(lib, "mpri_k_sum_into");
    assert_non_null(f);
    assert_true(f != (void *)mpri_k_sum_into); /* the test's own copy is another function */
    return (sum_into_fn)f; /* the library stays loaded (no dlclose) */
}

#define MAXN 70000

static double *values(int64_t n, uint32_t seed, bool specials) {
    double *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    const double odd[] = {0.0, -0.0, NAN, INFINITY, -INFINITY, 1e-30, -3e20, 1.0};
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        double mag = ldexp(1.0, (int)(seed >> 27) - 12); /* 2^-12 .. 2^19 */
        v[i] = ((double)((seed >> 8) & 0xffff) / 65536.0 - 0.5) * mag;
        if (i % 97 == 5) v[i] = specials ? odd[(i / 97) % 8] : odd[(i / 97) % 2];
    }
    return v;
}

/* One case: shape/strides as mpri_k_sum_into takes them, `nout` outputs, `nin` inputs. */
static void check_case(sum_into_fn lib, mpr_dtype_t dt, int ndim, const int64_t *shape, const int64_t *so,
                       const int64_t *si, int64_t nout, int64_t nin, uint32_t seed, bool specials) {
    double *in = values(nin, seed, specials), *out0 = values(nout, seed + 7, false);
    size_t es = dt == MPR_F32 ? 4 : 8;
    void *xin = malloc((size_t)nin * es), *a = malloc((size_t)nout * es), *b = malloc((size_t)nout * es);
    assert_true(xin && a && b);
    for (int64_t i = 0; i < nin; i++) {
        if (dt == MPR_F32)
            ((float *)xin)[i] = (float)in[i];
        else
            ((double *)xin)[i] = in[i];
    }
    for (int64_t i = 0; i < nout; i++) {
        if (dt == MPR_F32)
            ((float *)a)[i] = (float)out0[i];
        else
            ((double *)a)[i] = out0[i];
    }
    memcpy(b, a, (size_t)nout * es);
    mpri_k_sum_into(dt, ndim, shape, a, so, xin, si); /* baseline (this test's copy) */
    lib(dt, ndim, shape, b, so, xin, si);             /* the library's clone */
    for (int64_t i = 0; i < nout; i++) {
        double x = dt == MPR_F32 ? ((float *)a)[i] : ((double *)a)[i];
        double y = dt == MPR_F32 ? ((float *)b)[i] : ((double *)b)[i];
        if (isnan(x) && isnan(y)) continue; /* a NaN either way: IEEE 754 leaves its sign to the operand order */
        if (memcmp((char *)a + i * es, (char *)b + i * es, es) != 0)
            fail_msg("%s ndim %d shape[0] %lld: output %lld differs: baseline %a, library %a",
                     dt == MPR_F32 ? "f32" : "f64", ndim, (long long)shape[0], (long long)i, x, y);
    }
    free(in);
    free(out0);
    free(xin);
    free(a);
    free(b);
}

static void test_full_sums_agree(void **state) {
    (void)state;
    sum_into_fn lib = library_sum_into();
    for (int t = 0; t < 2; t++) {
        mpr_dtype_t dt = t ? MPR_F64 : MPR_F32;
        for (int64_t n = 1; n <= 80; n++) { /* every tail of 2-, 4- and 8-wide steps */
            int64_t shape[1] = {n}, so[1] = {0}, si[1] = {1};
            check_case(lib, dt, 1, shape, so, si, 1, n, (uint32_t)n, n % 3 == 0);
        }
        const int64_t longs[] = {255, 1024, 4097, 65536, MAXN - 3};
        for (int k = 0; k < 5; k++) {
            int64_t shape[2] = {longs[k] / 64 + 1, 64}, so[2] = {0, 0}, si[2] = {64, 1}; /* flat: one row */
            check_case(lib, dt, 2, shape, so, si, 1, shape[0] * 64, 100u + (uint32_t)k, false);
            int64_t s1[1] = {longs[k]}, o1[1] = {0}, i1[1] = {1};
            check_case(lib, dt, 1, s1, o1, i1, 1, longs[k], 200u + (uint32_t)k, k == 2);
        }
    }
}

static void test_row_column_and_strided_sums_agree(void **state) {
    (void)state;
    sum_into_fn lib = library_sum_into();
    const int64_t dims[][2] = {{3, 7}, {5, 8}, {8, 9}, {16, 33}, {64, 196}, {2, 1000}, {31, 1}};
    for (int t = 0; t < 2; t++) {
        mpr_dtype_t dt = t ? MPR_F64 : MPR_F32;
        for (int k = 0; k < 7; k++) {
            int64_t r = dims[k][0], c = dims[k][1], shape[2] = {r, c};
            int64_t rows_so[2] = {1, 0}, rows_si[2] = {c, 1}; /* a sum per row (the conv bias gradient) */
            check_case(lib, dt, 2, shape, rows_so, rows_si, r, r * c, 300u + (uint32_t)k, k == 3);
            int64_t cols_so[2] = {0, 1}, cols_si[2] = {c, 1}; /* rows added elementwise (a broadcast undone) */
            check_case(lib, dt, 2, shape, cols_so, cols_si, c, r * c, 400u + (uint32_t)k, false);
            int64_t str_so[2] = {1, 0}, str_si[2] = {2 * c, 2}; /* every other element of wider rows */
            check_case(lib, dt, 2, shape, str_so, str_si, r, 2 * r * c, 500u + (uint32_t)k, false);
            int64_t tr_so[2] = {0, 1}, tr_si[2] = {1, r}; /* a transposed input: strided rows */
            int64_t tshape[2] = {r, c};
            check_case(lib, dt, 2, tshape, tr_so, tr_si, c, r * c, 600u + (uint32_t)k, k == 1);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_sums_agree),
        cmocka_unit_test(test_row_column_and_strided_sums_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
