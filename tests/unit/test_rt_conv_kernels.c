/* test_rt_conv_kernels.c — the CPU convolution and pooling kernels
 * (runtime/kernels/cpu_conv_impl.h) against plain reference loops written
 * here, element by element and bit for bit:
 * - im2col, whose stride-1 "same"-width convolutions copy whole blocks of
 *   rows, equals a reference loop for every kernel, stride and padding
 *   combination of a few small images;
 * - col2im, whose stride-1 rows add a run of columns without a test per
 *   element, equals the reference adjoint of im2col for strides 1 and 2,
 *   paddings 0-2 and kernels 1-5 (f32 and f64), and <im2col(x), c> equals
 *   <x, col2im(c)>;
 * - max_pool2d's forward, whose 2x2 windows inside the plane are unrolled
 *   (and, 2x2 stride 2 on a plane without NaN, vectorized row by row),
 *   equals the reference (values and argmax: the first maximum wins, a NaN
 *   wins and stops its window) on inputs with ties and NaNs, for 2x2 and
 *   3x3 windows, strides 1 and 2, paddings 0 and 1;
 * - the strided copy's broadcast rows (a value repeated along a contiguous
 *   row: the convolution's bias) equal the general copy, f32 and f64, and
 *   write nothing past the rows. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/mpri_kernels.h"
#include "kernels/mpri_nn_kernels.h"

/* Deterministic values in [-1, 1) with many repeats (ties), from a small LCG. */
static double next_value(uint32_t *state) {
    *state = *state * 1664525u + 1013904223u;
    return (double)((*state >> 16) % 16) / 8.0 - 1.0;
}

/* The reference col2im for element type T, named col2im_ref_S: every
 * column element in order, added where its window lands inside the image. */
#define DEFINE_COL2IM_REF(S, T)                                                                              \
    static void col2im_ref_##S(const T *col, int64_t C, int64_t H, int64_t W, int64_t kh, int64_t kw,       \
                               int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t oh, int64_t ow,      \
                               T *gx) {                                                                     \
        for (int64_t c = 0; c < C; c++)                                                                     \
            for (int64_t ki = 0; ki < kh; ki++)                                                             \
                for (int64_t kj = 0; kj < kw; kj++)                                                         \
                    for (int64_t oy = 0; oy < oh; oy++)                                                     \
                        for (int64_t ox = 0; ox < ow; ox++) {                                               \
                            int64_t iy = oy * sh - ph + ki, ix = ox * sw - pw + kj;                         \
                            if (iy >= 0 && iy < H && ix >= 0 && ix < W)                                     \
                                gx[(c * H + iy) * W + ix] +=                                                \
                                    col[(((c * kh + ki) * kw + kj) * oh + oy) * ow + ox];                   \
                        }                                                                                   \
    }
DEFINE_COL2IM_REF(f64, double)
DEFINE_COL2IM_REF(f32, float)

/* The reference im2col: every column element, zero where the window hangs
 * over the padding. */
static void im2col_ref_f32(const float *x, int64_t C, int64_t H, int64_t W, int64_t kh, int64_t kw, int64_t sh,
                           int64_t sw, int64_t ph, int64_t pw, int64_t oh, int64_t ow, float *col) {
    for (int64_t c = 0; c < C; c++)
        for (int64_t ki = 0; ki < kh; ki++)
            for (int64_t kj = 0; kj < kw; kj++)
                for (int64_t oy = 0; oy < oh; oy++)
                    for (int64_t ox = 0; ox < ow; ox++) {
                        int64_t iy = oy * sh - ph + ki, ix = ox * sw - pw + kj;
                        col[(((c * kh + ki) * kw + kj) * oh + oy) * ow + ox] =
                            iy >= 0 && iy < H && ix >= 0 && ix < W ? x[(c * H + iy) * W + ix] : 0.0f;
                    }
}

/* im2col, whose stride-1 "same"-width convolutions copy each (c, ki, kj)
 * block of rows at once, equals the reference bit for bit (and writes every
 * element: the buffer starts as NaNs), for kernels 1-5 of either side,
 * strides 1-2, paddings 0-3 on either side, and narrow images where a shift
 * reaches across the whole row. */
static void test_im2col_matches_reference(void **state) {
    (void)state;
    uint32_t seed = 5;
    int configs = 0, same_rows = 0;
    const int64_t sizes[][3] = {{2, 5, 7}, {3, 4, 3}, {1, 2, 2}, {2, 1, 5}};
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
        const int64_t C = sizes[z][0], H = sizes[z][1], W = sizes[z][2];
        for (int64_t kh = 1; kh <= 5; kh += 2)
            for (int64_t kw = 1; kw <= 5; kw += 2)
                for (int64_t s = 1; s <= 2; s++)
                    for (int64_t ph = 0; ph <= 3; ph++)
                        for (int64_t pw = 0; pw <= 3; pw++) {
                            int64_t oh = (H + 2 * ph - kh) / s + 1, ow = (W + 2 * pw - kw) / s + 1;
                            if (H + 2 * ph < kh || W + 2 * pw < kw) continue;
                            size_t ncol = (size_t)(C * kh * kw * oh * ow), nx = (size_t)(C * H * W);
                            float *x = malloc(sizeof *x * nx), *got = malloc(sizeof *got * ncol),
                                  *want = malloc(sizeof *want * ncol);
                            assert_true(x && got && want);
                            for (size_t i = 0; i < nx; i++) x[i] = (float)next_value(&seed);
                            for (size_t i = 0; i < ncol; i++) got[i] = NAN;
                            mpri_im2col_f32(x, C, H, W, kh, kw, s, s, ph, pw, oh, ow, got);
                            im2col_ref_f32(x, C, H, W, kh, kw, s, s, ph, pw, oh, ow, want);
                            assert_memory_equal(got, want, sizeof *got * ncol);
                            free(x), free(got), free(want);
                            configs++;
                            same_rows += s == 1 && ow == W;
                        }
    }
    assert_true(configs >= 300);
    assert_true(same_rows >= 40);
}

static void test_col2im_matches_reference(void **state) {
    (void)state;
    const int64_t C = 2, H = 5, W = 7;
    uint32_t seed = 7;
    int configs = 0;
    for (int64_t k = 1; k <= 5; k += 2)
        for (int64_t s = 1; s <= 2; s++)
            for (int64_t p = 0; p <= 2; p++) {
                int64_t oh = (H + 2 * p - k) / s + 1, ow = (W + 2 * p - k) / s + 1;
                if (oh <= 0 || ow <= 0) continue;
                size_t ncol = (size_t)(C * k * k * oh * ow), nx = (size_t)(C * H * W);
                double *col = malloc(sizeof *col * ncol), *x = malloc(sizeof *x * nx);
                double *got = malloc(sizeof *got * nx), *want = malloc(sizeof *want * nx);
                float *colf = malloc(sizeof *colf * ncol), *gotf = malloc(sizeof *gotf * nx),
                      *wantf = malloc(sizeof *wantf * nx);
                double *xcol = malloc(sizeof *xcol * ncol);
                assert_true(col && x && got && want && colf && gotf && wantf && xcol);
                for (size_t i = 0; i < ncol; i++) colf[i] = (float)(col[i] = next_value(&seed));
                for (size_t i = 0; i < nx; i++) {
                    x[i] = next_value(&seed);
                    got[i] = want[i] = x[i]; /* col2im accumulates */
                    gotf[i] = wantf[i] = (float)x[i];
                }
                mpri_col2im_f64(col, C, H, W, k, k, s, s, p, p, oh, ow, got);
                col2im_ref_f64(col, C, H, W, k, k, s, s, p, p, oh, ow, want);
                assert_memory_equal(got, want, sizeof *got * nx);
                mpri_col2im_f32(colf, C, H, W, k, k, s, s, p, p, oh, ow, gotf);
                col2im_ref_f32(colf, C, H, W, k, k, s, s, p, p, oh, ow, wantf);
                assert_memory_equal(gotf, wantf, sizeof *gotf * nx);
                /* The adjoint identity <im2col(x), c> = <x, col2im(c)>. */
                mpri_im2col_f64(x, C, H, W, k, k, s, s, p, p, oh, ow, xcol);
                memset(got, 0, sizeof *got * nx);
                mpri_col2im_f64(col, C, H, W, k, k, s, s, p, p, oh, ow, got);
                double lhs = 0, rhs = 0;
                for (size_t i = 0; i < ncol; i++) lhs += xcol[i] * col[i];
                for (size_t i = 0; i < nx; i++) rhs += x[i] * got[i];
                assert_true(fabs(lhs - rhs) <= 1e-12 * (1 + fabs(lhs)));
                free(col), free(x), free(got), free(want), free(colf), free(gotf), free(wantf), free(xcol);
                configs++;
            }
    assert_true(configs >= 15);
}

/* The reference: every window element in order, padding as -inf, the first
 * maximum wins, a NaN wins and ends the window. */
static void max_pool_ref(const float *x, int64_t NC, int64_t H, int64_t W, int64_t k, int64_t s, int64_t p,
                         int64_t oh, int64_t ow, float *y, int64_t *arg) {
    for (int64_t q = 0; q < NC; q++)
        for (int64_t oy = 0; oy < oh; oy++)
            for (int64_t ox = 0; ox < ow; ox++) {
                float best = -INFINITY;
                int64_t bi = -1;
                bool stop = false;
                for (int64_t ki = 0; ki < k && !stop; ki++)
                    for (int64_t kj = 0; kj < k && !stop; kj++) {
                        int64_t iy = oy * s - p + ki, ix = ox * s - p + kj;
                        if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                        float v = x[(q * H + iy) * W + ix];
                        if (bi < 0 || v > best || isnan(v)) {
                            best = v;
                            bi = iy * W + ix;
                            stop = isnan(v);
                        }
                    }
                y[(q * oh + oy) * ow + ox] = best;
                arg[(q * oh + oy) * ow + ox] = bi < 0 ? 0 : bi;
            }
}

static void test_max_pool_matches_reference(void **state) {
    (void)state;
    /* planes 0-2 hold NaNs, plane 3 none (2x2 stride-2 windows of a NaN-free
     * plane take the vectorized rows) */
    const int64_t NC = 4, H = 6, W = 7;
    const size_t nx = (size_t)(NC * H * W);
    float *x = malloc(sizeof *x * nx);
    assert_non_null(x);
    uint32_t seed = 11;
    for (size_t i = 0; i < nx; i++) x[i] = (float)next_value(&seed); /* ties: 16 distinct values */
    /* NaNs first, second and last in some windows. */
    x[0] = NAN;
    x[W + 3] = NAN;
    x[H * W + 2 * W + 1] = NAN;
    x[2 * H * W + 4 * W + 5] = NAN;
    int configs = 0;
    for (int64_t k = 2; k <= 3; k++)
        for (int64_t s = 1; s <= 2; s++)
            for (int64_t p = 0; p <= 1; p++) {
                int64_t oh = (H + 2 * p - k) / s + 1, ow = (W + 2 * p - k) / s + 1;
                size_t ny = (size_t)(NC * oh * ow);
                float *y = malloc(sizeof *y * ny), *yr = malloc(sizeof *yr * ny);
                int64_t *a = malloc(sizeof *a * ny), *ar = malloc(sizeof *ar * ny);
                assert_true(y && yr && a && ar);
                mpri_max_pool2d_fwd_f32(x, NC, H, W, k, k, s, s, p, p, oh, ow, y, a);
                max_pool_ref(x, NC, H, W, k, s, p, oh, ow, yr, ar);
                assert_memory_equal(y, yr, sizeof *y * ny); /* NaN bits included */
                assert_memory_equal(a, ar, sizeof *a * ny);
                free(y), free(yr), free(a), free(ar);
                configs++;
            }
    assert_int_equal(configs, 8);
    /* Planes of the usual pooling without a NaN, wide enough for several
     * vector lanes and more than one 64-window chunk: ties and +-0. */
    const int64_t NP = 5, PH = 4, PW = 2 * 70 + 1, POH = 2, POW = 70;
    float *px = malloc(sizeof *px * (size_t)(NP * PH * PW));
    float *py = malloc(sizeof *py * (size_t)(NP * POH * POW)), *pyr = malloc(sizeof *pyr * (size_t)(NP * POH * POW));
    int64_t *pa = malloc(sizeof *pa * (size_t)(NP * POH * POW)), *par = malloc(sizeof *par * (size_t)(NP * POH * POW));
    assert_true(px && py && pyr && pa && par);
    for (int64_t i = 0; i < NP * PH * PW; i++) {
        px[i] = (float)next_value(&seed);
        if (px[i] == 0.0f && (i & 1)) px[i] = -0.0f;
    }
    mpri_max_pool2d_fwd_f32(px, NP, PH, PW, 2, 2, 2, 2, 0, 0, POH, POW, py, pa);
    max_pool_ref(px, NP, PH, PW, 2, 2, 0, POH, POW, pyr, par);
    assert_memory_equal(py, pyr, sizeof *py * (size_t)(NP * POH * POW));
    assert_memory_equal(pa, par, sizeof *pa * (size_t)(NP * POH * POW));
    free(px), free(py), free(pyr), free(pa), free(par);
    free(x);
}

/* y[n, c, q] = b[c] through mpri_k_copy (stride 0 over n and q), against a
 * plain loop; a guard after the rows stays untouched. */
static void test_broadcast_copy(void **state) {
    (void)state;
    const int64_t N = 3, C = 5, Q = 37; /* Q: not a multiple of any vector width */
    float bf[5], *yf = malloc(sizeof *yf * (size_t)(N * C * Q + 1));
    double bd[5], *yd = malloc(sizeof *yd * (size_t)(N * C * Q + 1));
    assert_non_null(yf);
    assert_non_null(yd);
    for (int c = 0; c < C; c++) bf[c] = (float)(bd[c] = 0.25 * c - 1.0);
    yf[N * C * Q] = 7.0f;
    yd[N * C * Q] = 7.0;
    int64_t shape[3] = {N, C, Q}, sy[3] = {C * Q, Q, 1}, sb[3] = {0, 1, 0};
    mpri_k_copy(3, shape, MPR_F32, yf, sy, MPR_F32, bf, sb);
    mpri_k_copy(3, shape, MPR_F64, yd, sy, MPR_F64, bd, sb);
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t q = 0; q < Q; q++) {
                assert_true(yf[(n * C + c) * Q + q] == bf[c]);
                assert_true(yd[(n * C + c) * Q + q] == bd[c]);
            }
    assert_true(yf[N * C * Q] == 7.0f);
    assert_true(yd[N * C * Q] == 7.0);
    free(yf);
    free(yd);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_col2im_matches_reference),
        cmocka_unit_test(test_im2col_matches_reference),
        cmocka_unit_test(test_max_pool_matches_reference),
        cmocka_unit_test(test_broadcast_copy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
