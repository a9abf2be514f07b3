/* test_cuda.c — the CUDA backend: device queries and errors everywhere; when a
 * GPU is visible, transfers (any strides and dtypes), the differentiable
 * device copy, and every CUDA kernel against its CPU twin on random data.
 *
 * Without a GPU (or in a build without -DMPIRPC_CUDA=ON) the device tests are
 * skipped with a message; the error-path test always runs. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mpirpc/cuda.h"
#include "mpirpc/nn_functional.h"
#include "mpirpc/tensor_ops.h"
#include "mpri_tensor.h"
#ifdef MPIRPC_TEST_CUDA_KERNELS
#include "kernels/cuda/mpri_cuda.h"
#include "kernels/mpri_nn_kernels.h"
#endif

/* A call that must succeed; on failure the library's message is printed. */
#define assert_ok(call)                                                             \
    do {                                                                            \
        mpr_err_t assert_ok_err_ = (call);                                          \
        if (assert_ok_err_ != MPR_OK) print_error("%s: %s\n", #call, mpr_last_error()); \
        assert_int_equal(assert_ok_err_, MPR_OK);                                   \
    } while (0)

static bool have_gpu(void) {
    if (mpr_cuda_device_count() > 0) return true;
    print_message("skipping: %s\n", mpr_cuda_is_built() ? "no CUDA device visible"
                                                         : "mpirpc built without CUDA (-DMPIRPC_CUDA=ON)");
    return false;
}

/* Errors that hold on every machine. */
static void test_device_errors(void **state) {
    int64_t live = mpr_tensor_live_count();
    int n = mpr_cuda_device_count();
    assert_true(n >= 0);
    if (!mpr_cuda_is_built()) assert_int_equal(n, 0);
    mpr_tensor_t *t = mpr_ones(MPR_F32, MPR_SHAPE(2, 3));
    /* device -1 is the identity for a CPU tensor */
    mpr_tensor_t *same = mpr_to_device(t, -1);
    assert_ptr_equal(same, t);
    mpr_tensor_release(same);
    assert_null(mpr_to_device(t, -2));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_INVALID_ARG);
    assert_null(mpr_to_device(t, n)); /* one past the last device */
    assert_int_equal(mpr_last_error_code(), mpr_cuda_is_built() ? MPR_ERR_INVALID_ARG : MPR_ERR_UNSUPPORTED);
    assert_non_null(strstr(mpr_last_error(), "to_device"));
    assert_null(mpr_tensor_empty_on(n, MPR_F32, MPR_SHAPE(4)));
    assert_int_equal(mpr_cuda_synchronize(-1), MPR_OK);
    assert_null(mpr_to_device(NULL, -1));
    mpr_tensor_release(t);
    assert_int_equal(mpr_tensor_live_count(), live);
}

static mpr_tensor_t *to_cpu(mpr_tensor_t *t) {
    mpr_tensor_t *c = mpr_to_device(t, -1);
    assert_non_null(c);
    assert_int_equal(mpr_tensor_device(c), -1);
    return c;
}

static void test_transfers(void **state) {
    if (!have_gpu()) skip();
    int64_t live = mpr_tensor_live_count();
    mpr_generator_t *g = mpr_generator_create(3);
    const mpr_dtype_t dts[] = {MPR_F32, MPR_F64, MPR_I64};
    for (size_t k = 0; k < 3; k++) {
        mpr_tensor_t *r = mpr_rand(MPR_F64, MPR_SHAPE(5, 7), g), *r100 = mpr_mul_scalar(r, 100);
        mpr_tensor_t *a = mpr_to_dtype(r100, dts[k]);
        assert_non_null(a);
        mpr_tensor_release(r);
        mpr_tensor_release(r100);
        mpr_tensor_t *d = mpr_to_device(a, 0);
        assert_non_null(d);
        assert_int_equal(mpr_tensor_device(d), 0);
        mpr_tensor_t *back = to_cpu(d);
        assert_memory_equal(mpr_tensor_data(back), mpr_tensor_data(a), mpr_tensor_nbytes(a));
        /* Strided sources: a transposed CPU view, and a transposed view on the device. */
        mpr_tensor_t *at = mpr_transpose(a, 0, 1);
        mpr_tensor_t *want = mpr_contiguous(at);
        mpr_tensor_t *atd = mpr_to_device(at, 0), *b1 = to_cpu(atd);
        mpr_tensor_release(atd);
        assert_memory_equal(mpr_tensor_data(b1), mpr_tensor_data(want), mpr_tensor_nbytes(want));
        mpr_tensor_t *dt = mpri_tensor_view(d->storage, d->dtype, 2, (const int64_t[]){7, 5},
                                            (const int64_t[]){1, 7}, 0);
        mpr_tensor_t *b2 = to_cpu(dt);
        assert_memory_equal(mpr_tensor_data(b2), mpr_tensor_data(want), mpr_tensor_nbytes(want));
        mpr_tensor_release(dt);
        mpr_tensor_release(a);
        mpr_tensor_release(d);
        mpr_tensor_release(back);
        mpr_tensor_release(at);
        mpr_tensor_release(want);
        mpr_tensor_release(b1);
        mpr_tensor_release(b2);
    }
    /* The gradient of a device copy comes back to the CPU leaf. */
    mpr_tensor_t *x = mpr_rand(MPR_F32, MPR_SHAPE(3, 4), g);
    assert_int_equal(mpr_set_requires_grad(x, true), MPR_OK);
    mpr_scope_begin();
    mpr_tensor_t *xd = mpr_to_device(x, 0);
    assert_string_equal(mpr_grad_fn_name(xd), "to_device");
    mpr_tensor_t *gd = mpr_to_device(mpr_full(MPR_F32, MPR_SHAPE(3, 4), 2.5), 0);
    assert_ok(mpr_backward(xd, gd, false));
    mpr_scope_end();
    mpr_tensor_t *gx = mpr_tensor_grad(x);
    assert_non_null(gx);
    assert_int_equal(mpr_tensor_device(gx), -1);
    for (int i = 0; i < 12; i++) assert_true(((float *)mpr_tensor_data(gx))[i] == 2.5f);
    mpr_tensor_release(x);
    mpr_generator_destroy(g);
    assert_int_equal(mpr_tensor_live_count(), live);
}

/* One MLP step (linear, relu, linear, then the mean of squares, or
 * cross-entropy against cpu_target when given) on `device` through the public
 * ops; returns the loss and the weight gradients copied to the CPU. */
static void mlp_grads(int device, mpr_tensor_t *const *cpu_params, mpr_tensor_t *cpu_x, mpr_tensor_t *cpu_target,
                      double *loss, mpr_tensor_t **grads) {
    mpr_scope_begin();
    mpr_tensor_t *p[4];
    for (int i = 0; i < 4; i++) {
        p[i] = mpr_detach(mpr_to_device(cpu_params[i], device)); /* a leaf on the device */
        assert_non_null(p[i]);
        assert_int_equal(mpr_set_requires_grad(p[i], true), MPR_OK);
    }
    mpr_tensor_t *x = mpr_to_device(cpu_x, device);
    mpr_tensor_t *h = mpr_relu(mpr_linear(x, p[0], p[1]));
    mpr_tensor_t *y = mpr_linear(h, p[2], p[3]);
    mpr_tensor_t *l = cpu_target ? mpr_cross_entropy(y, mpr_to_device(cpu_target, device)) : mpr_mean(mpr_mul(y, y));
    if (!l) fail_msg("forward on device %d: %s", device, mpr_last_error());
    if (mpr_backward(l, NULL, false) != MPR_OK) fail_msg("backward on device %d: %s", device, mpr_last_error());
    assert_int_equal(mpr_item(mpr_to_device(l, -1), loss), MPR_OK);
    for (int i = 0; i < 4; i++) grads[i] = mpr_scope_keep(mpr_to_device(mpr_tensor_grad(p[i]), -1));
    mpr_scope_end();
}

/* The same small MLP step on the CPU and on cuda:0 (ops dispatched through the
 * CUDA backend: cuBLAS GEMMs, elementwise kernels, reductions, the
 * cross-entropy kernels) agrees, with a mean-of-squares and a cross-entropy loss. */
static void test_mlp_step_on_gpu(void **state) {
    if (!have_gpu()) skip();
    int64_t live = mpr_tensor_live_count();
    mpr_generator_t *g = mpr_generator_create(21);
    mpr_tensor_t *params[4] = {mpr_uniform(MPR_F32, MPR_SHAPE(32, 20), -0.3, 0.3, g),
                               mpr_uniform(MPR_F32, MPR_SHAPE(32), -0.3, 0.3, g),
                               mpr_uniform(MPR_F32, MPR_SHAPE(5, 32), -0.3, 0.3, g),
                               mpr_uniform(MPR_F32, MPR_SHAPE(5), -0.3, 0.3, g)};
    mpr_tensor_t *x = mpr_rand(MPR_F32, MPR_SHAPE(16, 20), g);
    int64_t th[16];
    for (int i = 0; i < 16; i++) th[i] = (i * 7) % 5;
    mpr_tensor_t *target = mpr_from_buffer(MPR_I64, MPR_SHAPE(16), th);
    for (int with_ce = 0; with_ce < 2; with_ce++) {
        double lc, lg;
        mpr_tensor_t *gc[4], *gg[4];
        mlp_grads(-1, params, x, with_ce ? target : NULL, &lc, gc);
        mlp_grads(0, params, x, with_ce ? target : NULL, &lg, gg);
        assert_true(fabs(lc - lg) <= 1e-5 * fabs(lc) + 1e-6);
        for (int i = 0; i < 4; i++) {
            if (!mpr_allclose(gg[i], gc[i], 1e-4, 1e-5))
                fail_msg("gradient %d differs between CPU and cuda:0 (%s)", i, with_ce ? "cross-entropy" : "mse");
            mpr_tensor_release(gc[i]);
            mpr_tensor_release(gg[i]);
        }
    }
    for (int i = 0; i < 4; i++) mpr_tensor_release(params[i]);
    mpr_tensor_release(target);
    mpr_tensor_release(x);
    mpr_generator_destroy(g);
    assert_int_equal(mpr_tensor_live_count(), live);
}

/* An int64 CPU tensor of shape [n] or [r, c] from vals. */
static mpr_tensor_t *i64(int ndim, const int64_t *shape, const int64_t *vals) {
    mpr_tensor_t *t = mpr_scope_adopt(mpr_tensor_empty(MPR_I64, ndim, shape));
    memcpy(mpr_tensor_data(t), vals, (size_t)mpr_tensor_numel(t) * sizeof(int64_t));
    return t;
}

/* max |a - b| over host copies of a (any device) and b (CPU). */
static double max_diff(mpr_tensor_t *a, mpr_tensor_t *b) {
    mpr_tensor_t *h = to_cpu(a), *d = mpr_sub(mpr_to_dtype(h, MPR_F64), mpr_to_dtype(b, MPR_F64));
    double m = 0;
    for (int64_t i = 0; i < mpr_tensor_numel(d); i++) m = fmax(m, fabs(((double *)mpr_tensor_data(d))[i]));
    return m;
}

/* embedding, index_select and gather with the input on cuda:0 (index on the
 * CPU or on cuda:0): forward equal to the CPU op, gradients (scatter-add
 * with repeated indices, atomics on the GPU) equal to rounding; dropout's
 * mask on cuda:0 is the CPU's for the same seed; bad indices are refused. */
static void test_index_ops_and_dropout_on_gpu(void **state) {
    if (!have_gpu()) skip();
    int64_t live = mpr_tensor_live_count();
    mpr_generator_t *g = mpr_generator_create(21);
    mpr_scope_begin();
    mpr_tensor_t *w = mpr_uniform(MPR_F32, MPR_SHAPE(7, 5), -1, 1, g);
    assert_ok(mpr_set_requires_grad(w, true));
    mpr_tensor_t *wd = mpr_detach(mpr_to_device(w, 0));
    assert_ok(mpr_set_requires_grad(wd, true));
    const int64_t ids[6] = {3, 0, 3, 6, 1, 3}; /* 3 three times: its gradient rows add up */
    mpr_tensor_t *idx = i64(2, (const int64_t[]){2, 3}, ids), *idx_d = mpr_to_device(idx, 0);
    mpr_tensor_t *gy = mpr_uniform(MPR_F32, MPR_SHAPE(2, 3, 5), -1, 1, g);
    for (int on_device = 0; on_device < 2; on_device++) {
        mpr_tensor_t *yc = mpr_embedding(w, idx), *yd = mpr_embedding(wd, on_device ? idx_d : idx);
        assert_non_null(yd);
        assert_int_equal(mpr_tensor_device(yd), 0);
        assert_true(max_diff(yd, yc) == 0);
        assert_ok(mpr_backward(yc, gy, false));
        assert_ok(mpr_backward(yd, mpr_to_device(gy, 0), false));
    }
    assert_int_equal(mpr_tensor_device(mpr_tensor_grad(wd)), 0);
    assert_true(max_diff(mpr_tensor_grad(wd), mpr_tensor_grad(w)) < 1e-6);
    /* index_select along dim 1 and gather along dim 0, f64 */
    mpr_tensor_t *x = mpr_uniform(MPR_F64, MPR_SHAPE(4, 6), -1, 1, g), *xd = mpr_to_device(x, 0);
    mpr_tensor_t *sel = i64(1, (const int64_t[]){4}, (const int64_t[]){5, 0, 5, 2});
    assert_true(max_diff(mpr_index_select(xd, 1, sel), mpr_index_select(x, 1, sel)) == 0);
    const int64_t gi[12] = {0, 3, 1, 1, 2, 0, 3, 3, 0, 2, 1, 0};
    mpr_tensor_t *gidx = i64(2, (const int64_t[]){2, 6}, gi);
    assert_true(max_diff(mpr_gather(xd, 0, mpr_to_device(gidx, 0)), mpr_gather(x, 0, gidx)) == 0);
    /* refused: an index out of range (checked on the host), a device index for a CPU input */
    mpr_tensor_t *bad = i64(1, (const int64_t[]){2}, (const int64_t[]){1, 7});
    assert_null(mpr_embedding(wd, mpr_to_device(bad, 0)));
    assert_int_not_equal(mpr_last_error_code(), MPR_OK);
    assert_null(mpr_embedding(w, idx_d));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_INVALID_ARG);
    assert_non_null(strstr(mpr_last_error(), "cuda:0"));
    /* dropout: the same seed gives the same mask on cuda:0 as on the CPU */
    mpr_tensor_t *ones = mpr_full(MPR_F32, MPR_SHAPE(64), 1.0);
    mpr_generator_t *g1 = mpr_generator_create(5), *g2 = mpr_generator_create(5);
    mpr_tensor_t *dc = mpr_dropout(ones, 0.5, true, g1), *dd = mpr_dropout(mpr_to_device(ones, 0), 0.5, true, g2);
    assert_non_null(dd);
    assert_int_equal(mpr_tensor_device(dd), 0);
    assert_true(max_diff(dd, dc) == 0);
    mpr_generator_destroy(g1);
    mpr_generator_destroy(g2);
    mpr_scope_end(); /* w, wd and every result were the scope's */
    mpr_generator_destroy(g);
    assert_int_equal(mpr_tensor_live_count(), live);
}

#ifdef MPIRPC_TEST_CUDA_KERNELS
/* ---- host-side planning of the CUDA kernels (no GPU needed) ---- */

/* Column-major GEMM with cuBLAS's argument meaning: C[m,n] = alpha op(A) op(B) + beta C,
 * X(i, j) = X[i + j * ld]; returns false where cuBLAS would reject an ld. */
static bool colmajor_sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *A, int lda,
                           const float *B, int ldb, float beta, float *C, int ldc) {
    if (lda < (ta ? (k > 1 ? k : 1) : (m > 1 ? m : 1))) return false;
    if (ldb < (tb ? (n > 1 ? n : 1) : (k > 1 ? k : 1))) return false;
    if (ldc < (m > 1 ? m : 1)) return false;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double acc = 0;
            for (int l = 0; l < k; l++) {
                float a = ta ? A[l + (int64_t)i * lda] : A[i + (int64_t)l * lda];
                float b = tb ? B[j + (int64_t)l * ldb] : B[l + (int64_t)j * ldb];
                acc += (double)a * b;
            }
            float *c = &C[i + (int64_t)j * ldc];
            *c = (float)(alpha * acc + (beta == 0 ? 0.0 : beta * *c));
        }
    return true;
}

/* The row-major -> column-major mapping of mpri_cuda_k_gemm, run through a
 * column-major reference, equals the CPU row-major GEMM: all transposes,
 * padded leading dimensions, vectors; bad lds are refused up front. */
static void test_gemm_plan(void **state) {
    (void)state;
    mpr_generator_t *g = mpr_generator_create(5);
    const int64_t dims[][3] = {{7, 5, 3}, {1, 6, 4}, {6, 1, 4}, {5, 4, 1}, {1, 1, 9}};
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
        for (int tr = 0; tr < 4; tr++)
            for (int pad = 0; pad < 2; pad++) {
                bool ta = tr & 1, tb = tr & 2;
                int64_t M = dims[di][0], N = dims[di][1], K = dims[di][2];
                int64_t lda = (ta ? M : K) + pad * 3, ldb = (tb ? K : N) + pad * 2, ldc = N + pad;
                mpr_tensor_t *A = mpr_rand(MPR_F32, MPR_SHAPE(ta ? K : M, lda), g);
                mpr_tensor_t *B = mpr_rand(MPR_F32, MPR_SHAPE(tb ? N : K, ldb), g);
                mpr_tensor_t *C = mpr_rand(MPR_F32, MPR_SHAPE(M, ldc), g);
                mpr_tensor_t *C2 = mpr_clone(C);
                mpri_k_gemm(MPR_F32, ta, tb, M, N, K, 0.5, mpr_tensor_data(A), lda, mpr_tensor_data(B), ldb, 2.0,
                            mpr_tensor_data(C), ldc);
                mpri_cuda_gemm_plan_t p;
                assert_int_equal(mpri_cuda_gemm_plan(ta, tb, M, N, K, lda, ldb, ldc, &p), MPR_OK);
                /* cuBLAS's first operand is B, its second A. */
                assert_true(colmajor_sgemm(p.trans_first, p.trans_second, p.m, p.n, p.k, 0.5f, mpr_tensor_data(B),
                                           p.ld_first, mpr_tensor_data(A), p.ld_second, 2.0f, mpr_tensor_data(C2),
                                           p.ldc));
                if (!mpr_allclose(C2, C, 1e-5, 1e-6))
                    fail_msg("gemm plan M=%lld N=%lld K=%lld ta=%d tb=%d pad=%d differs from the CPU GEMM",
                             (long long)M, (long long)N, (long long)K, ta, tb, pad);
                mpr_tensor_release(A);
                mpr_tensor_release(B);
                mpr_tensor_release(C);
                mpr_tensor_release(C2);
            }
    mpri_cuda_gemm_plan_t p;
    /* K == 0: the empty operands' lds of 0 are fine (C = beta C, nothing read). */
    assert_int_equal(mpri_cuda_gemm_plan(false, false, 4, 3, 0, 0, 3, 3, &p), MPR_OK);
    assert_int_equal(mpri_cuda_gemm_plan(false, true, 4, 3, 0, 0, 0, 3, &p), MPR_OK);
    /* lda < K, ldb < N, ldc < N, and a transposed A with lda < M are refused. */
    assert_int_equal(mpri_cuda_gemm_plan(false, false, 4, 3, 5, 4, 3, 3, &p), MPR_ERR_INVALID_ARG);
    assert_non_null(strstr(mpr_last_error(), "lda"));
    assert_int_equal(mpri_cuda_gemm_plan(false, false, 4, 3, 5, 5, 2, 3, &p), MPR_ERR_INVALID_ARG);
    assert_non_null(strstr(mpr_last_error(), "ldb"));
    assert_int_equal(mpri_cuda_gemm_plan(false, false, 4, 3, 5, 5, 3, 2, &p), MPR_ERR_INVALID_ARG);
    assert_int_equal(mpri_cuda_gemm_plan(true, false, 4, 3, 5, 3, 3, 3, &p), MPR_ERR_INVALID_ARG);
    assert_int_equal(mpri_cuda_gemm_plan(false, false, (int64_t)1 << 31, 3, 5, 5, 3, 3, &p), MPR_ERR_UNSUPPORTED);
    mpr_generator_destroy(g);
}

/* C-order offsets of linear index i over shape[n] with strides st. */
static int64_t host_offset(int n, const int64_t *shape, const int64_t *st, int64_t i) {
    int64_t off = 0;
    for (int d = n - 1; d >= 0; d--) {
        off += (i % shape[d]) * st[d];
        i /= shape[d];
    }
    return off;
}

/* The sum_into work split, executed on the host item by item as the kernel
 * does (double per item, then one f32 add into out). */
static void run_sum_plan(const mpri_cuda_sum_plan_t *p, float *out, const float *in) {
    for (int64_t w = 0; w < p->P * p->nchunks; w++) {
        int64_t pp = w / p->nchunks, c = w % p->nchunks;
        int64_t oo = host_offset(p->nk, p->kshape, p->kso, pp), oi = host_offset(p->nk, p->kshape, p->ksi, pp);
        double acc = 0;
        for (int64_t r = c; r < p->R; r += p->nchunks) acc += in[oi + host_offset(p->nr, p->rshape, p->rsi, r)];
        out[oo] += (float)acc;
    }
}

/* The sum_into split covers every (output, input) pair exactly once for
 * reductions over inner, outer, middle and all dims (with size-1 dims and a
 * transposed input), and a long f32 sum of ones is exact: the former one
 * f32 atomicAdd per element stops counting at 2^24. */
static void test_sum_plan(void **state) {
    (void)state;
    mpr_generator_t *g = mpr_generator_create(11);
    mpr_tensor_t *x = mpr_rand(MPR_F32, MPR_SHAPE(4, 1, 6, 5), g);
    const int64_t shp[4] = {4, 1, 6, 5}, si[4] = {30, 30, 5, 1}, sit[4] = {1, 4, 4, 24}; /* sit: a permuted layout */
    const int64_t so_cases[][4] = {{6, 0, 1, 0}, {0, 0, 5, 1}, {5, 5, 0, 1}, {0, 0, 0, 0}, {30, 30, 5, 1}};
    for (size_t k = 0; k < sizeof so_cases / sizeof so_cases[0]; k++)
        for (int t = 0; t < 2; t++) {
            const int64_t *sin = t ? sit : si;
            float want[120] = {0}, got[120] = {0};
            mpri_k_sum_into(MPR_F32, 4, shp, want, so_cases[k], mpr_tensor_data(x), sin);
            mpri_cuda_sum_plan_t p;
            mpri_cuda_sum_plan(4, shp, so_cases[k], sin, &p);
            assert_true(p.nchunks >= 1 && p.nchunks <= MPRI_CUDA_SUM_MAX_CHUNKS && p.nchunks <= p.R);
            assert_int_equal(p.P * p.R, 120);
            run_sum_plan(&p, got, mpr_tensor_data(x));
            for (int i = 0; i < 120; i++)
                if (fabsf(want[i] - got[i]) > 1e-5f * (1 + fabsf(want[i])))
                    fail_msg("sum plan case %zu (transposed %d): out[%d] = %g, want %g", k, t, i, got[i], want[i]);
        }
    /* 2^25 ones (one element broadcast with stride 0) into one f32 output. */
    const int64_t big[1] = {(int64_t)1 << 25}, zero[1] = {0};
    mpri_cuda_sum_plan_t p;
    mpri_cuda_sum_plan(1, big, zero, zero, &p);
    assert_int_equal(p.P, 1);
    assert_int_equal(p.nchunks, MPRI_CUDA_SUM_MAX_CHUNKS);
    float one = 1.0f, out = 0.0f;
    run_sum_plan(&p, &out, &one);
    assert_true(out == 33554432.0f);
    mpr_tensor_release(x);
    mpr_generator_destroy(g);
}

/* Without a GPU the kernels fail with MPR_ERR_STATE naming themselves (a
 * clear error, no crash); argument errors are found before any device call. */
static void test_kernel_errors_without_gpu(void **state) {
    (void)state;
    mpri_cuda_gemm_plan_t unused;
    (void)unused;
    float host[4] = {0};
    assert_int_equal(mpri_cuda_k_gemm(0, MPR_I64, false, false, 2, 2, 2, 1.0, host, 2, host, 2, 0.0, host, 2),
                     MPR_ERR_DTYPE);
    assert_int_equal(mpri_cuda_k_gemm(0, MPR_F32, false, false, 2, 2, 2, 1.0, host, 1, host, 2, 0.0, host, 2),
                     MPR_ERR_INVALID_ARG);
    assert_int_equal(mpri_cuda_k_gemm(0, MPR_F32, false, false, 0, 2, 2, 1.0, host, 2, host, 2, 0.0, host, 2), MPR_OK);
    if (mpr_cuda_device_count() > 0) {
        print_message("skipping the no-device half: a CUDA device is visible\n");
        return;
    }
    void *d = host;
    assert_int_not_equal(mpri_cuda_malloc(0, 64, &d), MPR_OK);
    assert_null(d);
    assert_non_null(strstr(mpr_last_error(), "cuda_malloc"));
    assert_int_equal(mpri_cuda_k_fill(0, MPR_F32, 1, (const int64_t[]){4}, host, (const int64_t[]){1}, 1.0),
                     MPR_ERR_STATE);
    assert_non_null(strstr(mpr_last_error(), "cuda fill"));
    assert_int_equal(mpri_cuda_k_gemm(0, MPR_F32, false, false, 2, 2, 2, 1.0, host, 2, host, 2, 0.0, host, 2),
                     MPR_ERR_STATE);
    assert_non_null(strstr(mpr_last_error(), "cuda gemm"));
    mpri_cuda_free(NULL, 0);
}

/* ---- kernel-by-kernel comparison with the CPU kernels ---- */

static mpr_tensor_t *dev(mpr_tensor_t *cpu) { return mpr_to_device(cpu, 0); }

static void expect_close(const char *what, mpr_tensor_t *gpu, mpr_tensor_t *cpu, double tol) {
    mpr_tensor_t *c = to_cpu(gpu);
    if (!mpr_allclose(c, cpu, tol, tol)) fail_msg("%s: GPU result differs from the CPU kernel", what);
}

static void test_kernels(void **state) {
    if (!have_gpu()) skip();
    int64_t live = mpr_tensor_live_count();
    mpr_generator_t *g = mpr_generator_create(9);
    mpr_scope_begin();
    const int64_t n = 1000;
    mpr_tensor_t *x = mpr_uniform(MPR_F32, MPR_SHAPE(n), 0.1, 2.0, g);
    mpr_tensor_t *gy = mpr_uniform(MPR_F32, MPR_SHAPE(n), -1, 1, g);
    mpr_tensor_t *xd = dev(x), *gyd = dev(gy);
    for (int op = 0; op < MPRI_UN_COUNT; op++) {
        double p0 = op == MPRI_UN_CLAMP ? 0.5 : 1.7, p1 = 1.5;
        mpr_tensor_t *yc = mpr_scope_adopt(mpr_tensor_empty(MPR_F32, 1, (const int64_t[]){n}));
        mpr_tensor_t *yg = mpr_scope_adopt(mpr_tensor_empty_on(0, MPR_F32, 1, (const int64_t[]){n}));
        mpri_k_unary((mpri_unop_t)op, MPR_F32, n, mpr_tensor_data(yc), mpr_tensor_data(x), p0, p1);
        assert_int_equal(mpri_cuda_k_unary(0, (mpri_unop_t)op, MPR_F32, n, mpr_tensor_data(yg), mpr_tensor_data(xd),
                                           p0, p1), MPR_OK);
        expect_close("unary", yg, yc, 1e-5);
        mpr_tensor_t *gc = mpr_scope_adopt(mpr_tensor_empty(MPR_F32, 1, (const int64_t[]){n}));
        mpr_tensor_t *gg = mpr_scope_adopt(mpr_tensor_empty_on(0, MPR_F32, 1, (const int64_t[]){n}));
        mpri_k_unary_backward((mpri_unop_t)op, MPR_F32, n, mpr_tensor_data(gc), mpr_tensor_data(gy),
                              mpr_tensor_data(x), mpr_tensor_data(yc), p0, p1);
        assert_int_equal(mpri_cuda_k_unary_backward(0, (mpri_unop_t)op, MPR_F32, n, mpr_tensor_data(gg),
                                                    mpr_tensor_data(gyd), mpr_tensor_data(xd), mpr_tensor_data(yg),
                                                    p0, p1), MPR_OK);
        expect_close("unary backward", gg, gc, 1e-5);
    }
    /* Broadcasting binary ops: [4, 5] (op) [5] via stride 0. */
    mpr_tensor_t *a = mpr_uniform(MPR_F64, MPR_SHAPE(4, 5), 0.5, 2, g), *b = mpr_uniform(MPR_F64, MPR_SHAPE(5), 0.5, 2, g);
    mpr_tensor_t *ad = dev(a), *bd = dev(b);
    const int64_t shp[2] = {4, 5}, so[2] = {5, 1}, sb[2] = {0, 1};
    for (int op = 0; op < 4; op++) {
        mpr_tensor_t *oc = mpr_scope_adopt(mpr_tensor_empty(MPR_F64, 2, shp));
        mpr_tensor_t *og = mpr_scope_adopt(mpr_tensor_empty_on(0, MPR_F64, 2, shp));
        mpri_k_binary((mpri_binop_t)op, MPR_F64, 2, shp, mpr_tensor_data(oc), so, mpr_tensor_data(a), so,
                      mpr_tensor_data(b), sb, 0.5);
        assert_int_equal(mpri_cuda_k_binary(0, (mpri_binop_t)op, MPR_F64, 2, shp, mpr_tensor_data(og), so,
                                            mpr_tensor_data(ad), so, mpr_tensor_data(bd), sb, 0.5), MPR_OK);
        expect_close("binary", og, oc, 1e-12);
    }
    /* sum_into over dim 0 ([4, 5] -> [5]); fill; strided copy with conversion. */
    mpr_tensor_t *sc = mpr_scope_adopt(mpr_tensor_empty(MPR_F64, 1, (const int64_t[]){5}));
    mpr_tensor_t *sg = mpr_scope_adopt(mpr_tensor_empty_on(0, MPR_F64, 1, (const int64_t[]){5}));
    const int64_t s1[1] = {1};
    mpri_k_fill(MPR_F64, 1, (const int64_t[]){5}, mpr_tensor_data(sc), s1, 1.0);
    assert_int_equal(mpri_cuda_k_fill(0, MPR_F64, 1, (const int64_t[]){5}, mpr_tensor_data(sg), s1, 1.0), MPR_OK);
    mpri_k_sum_into(MPR_F64, 2, shp, mpr_tensor_data(sc), sb, mpr_tensor_data(a), so);
    assert_int_equal(mpri_cuda_k_sum_into(0, MPR_F64, 2, shp, mpr_tensor_data(sg), sb, mpr_tensor_data(ad), so), MPR_OK);
    expect_close("fill + sum_into", sg, sc, 1e-12);
    const int64_t tshape[2] = {5, 4}, tst[2] = {1, 5}, cst[2] = {4, 1};
    mpr_tensor_t *cc = mpr_scope_adopt(mpr_tensor_empty(MPR_F32, 2, tshape));
    mpr_tensor_t *cg = mpr_scope_adopt(mpr_tensor_empty_on(0, MPR_F32, 2, tshape));
    mpri_k_copy(2, tshape, MPR_F32, mpr_tensor_data(cc), cst, MPR_F64, mpr_tensor_data(a), tst);
    assert_int_equal(mpri_cuda_k_copy(0, 2, tshape, MPR_F32, mpr_tensor_data(cg), cst, MPR_F64, mpr_tensor_data(ad), tst),
                     MPR_OK);
    expect_close("strided converting copy", cg, cc, 0);
    /* GEMM, all four transpose combinations, with beta. */
    for (int tr = 0; tr < 4; tr++) {
        bool ta = tr & 1, tb = tr & 2;
        const int64_t M = 33, N = 17, K = 29;
        mpr_tensor_t *A = ta ? mpr_rand(MPR_F32, MPR_SHAPE(K, M), g) : mpr_rand(MPR_F32, MPR_SHAPE(M, K), g);
        mpr_tensor_t *B = tb ? mpr_rand(MPR_F32, MPR_SHAPE(N, K), g) : mpr_rand(MPR_F32, MPR_SHAPE(K, N), g);
        mpr_tensor_t *C = mpr_rand(MPR_F32, MPR_SHAPE(M, N), g);
        mpr_tensor_t *Ad = dev(A), *Bd = dev(B), *Cd = dev(mpr_clone(C));
        mpri_k_gemm(MPR_F32, ta, tb, M, N, K, 0.5, mpr_tensor_data(A), ta ? M : K, mpr_tensor_data(B), tb ? K : N, 2.0,
                    mpr_tensor_data(C), N);
        assert_int_equal(mpri_cuda_k_gemm(0, MPR_F32, ta, tb, M, N, K, 0.5, mpr_tensor_data(Ad), ta ? M : K,
                                          mpr_tensor_data(Bd), tb ? K : N, 2.0, mpr_tensor_data(Cd), N), MPR_OK);
        expect_close("gemm", Cd, C, 1e-4);
    }
    /* Softmax / log_softmax over the middle dim of [3, 6, 2]. */
    mpr_tensor_t *s = mpr_uniform(MPR_F32, MPR_SHAPE(3, 6, 2), -3, 3, g), *sgy = mpr_rand(MPR_F32, MPR_SHAPE(3, 6, 2), g);
    mpr_tensor_t *sd = dev(s), *sgyd = dev(sgy);
    for (int is_log = 0; is_log < 2; is_log++) {
        mpr_tensor_t *yc = mpr_scope_adopt(mpr_tensor_empty(MPR_F32, 3, (const int64_t[]){3, 6, 2}));
        mpr_tensor_t *yg = mpr_scope_adopt(mpr_tensor_empty_on(0, MPR_F32, 3, (const int64_t[]){3, 6, 2}));
        mpri_softmax_fwd_f32(mpr_tensor_data(s), mpr_tensor_data(yc), 3, 6, 2, is_log);
        assert_int_equal(mpri_cuda_softmax_fwd(0, MPR_F32, mpr_tensor_data(sd), mpr_tensor_data(yg), 3, 6, 2, is_log),
                         MPR_OK);
        expect_close("softmax", yg, yc, 1e-5);
        mpr_tensor_t *gc = mpr_scope_adopt(mpr_tensor_empty(MPR_F32, 3, (const int64_t[]){3, 6, 2}));
        mpr_tensor_t *gg = mpr_scope_adopt(mpr_tensor_empty_on(0, MPR_F32, 3, (const int64_t[]){3, 6, 2}));
        mpri_softmax_bwd_f32(mpr_tensor_data(yc), mpr_tensor_data(sgy), mpr_tensor_data(gc), 3, 6, 2, is_log);
        assert_int_equal(mpri_cuda_softmax_bwd(0, MPR_F32, mpr_tensor_data(yg), mpr_tensor_data(sgyd), mpr_tensor_data(gg),
                                               3, 6, 2, is_log), MPR_OK);
        expect_close("softmax backward", gg, gc, 1e-5);
    }
    /* Cross entropy and nll with an ignored row; mse. */
    const int64_t N = 6, Cn = 5;
    mpr_tensor_t *lg = mpr_uniform(MPR_F32, MPR_SHAPE(N, Cn), -2, 2, g);
    int64_t tgt_h[6] = {0, 4, 2, -100, 1, 3};
    mpr_tensor_t *tgt = mpr_from_buffer(MPR_I64, MPR_SHAPE(N), tgt_h);
    mpr_tensor_t *lgd = dev(lg), *tgtd = dev(tgt);
    mpr_tensor_t *lse_c = mpr_scope_adopt(mpr_tensor_empty(MPR_F32, 1, (const int64_t[]){N}));
    mpr_tensor_t *lse_g = mpr_scope_adopt(mpr_tensor_empty_on(0, MPR_F32, 1, (const int64_t[]){N}));
    int64_t cnt_c, cnt_g;
    double lc = mpri_cross_entropy_fwd_f32(mpr_tensor_data(lg), tgt_h, N, Cn, -100, mpr_tensor_data(lse_c), &cnt_c);
    double lgv;
    assert_int_equal(mpri_cuda_cross_entropy_fwd(0, MPR_F32, mpr_tensor_data(lgd), mpr_tensor_data(tgtd), N, Cn, -100,
                                                 mpr_tensor_data(lse_g), &lgv, &cnt_g), MPR_OK);
    assert_int_equal(cnt_c, cnt_g);
    assert_true(fabs(lc - lgv) < 1e-5);
    mpr_tensor_t *gxc = mpr_scope_adopt(mpr_tensor_empty(MPR_F32, 2, (const int64_t[]){N, Cn}));
    mpr_tensor_t *gxg = mpr_scope_adopt(mpr_tensor_empty_on(0, MPR_F32, 2, (const int64_t[]){N, Cn}));
    mpri_cross_entropy_bwd_f32(mpr_tensor_data(lg), tgt_h, mpr_tensor_data(lse_c), N, Cn, -100, cnt_c, 1.5,
                               mpr_tensor_data(gxc));
    assert_int_equal(mpri_cuda_cross_entropy_bwd(0, MPR_F32, mpr_tensor_data(lgd), mpr_tensor_data(tgtd),
                                                 mpr_tensor_data(lse_g), N, Cn, -100, cnt_g, 1.5, mpr_tensor_data(gxg)),
                     MPR_OK);
    expect_close("cross_entropy backward", gxg, gxc, 1e-5);
    lc = mpri_nll_loss_fwd_f32(mpr_tensor_data(lg), tgt_h, N, Cn, -100, &cnt_c);
    assert_int_equal(mpri_cuda_nll_loss_fwd(0, MPR_F32, mpr_tensor_data(lgd), mpr_tensor_data(tgtd), N, Cn, -100, &lgv,
                                            &cnt_g), MPR_OK);
    assert_true(fabs(lc - lgv) < 1e-5 && cnt_c == cnt_g);
    mpri_nll_loss_bwd_f32(tgt_h, N, Cn, -100, cnt_c, 0.7, mpr_tensor_data(gxc));
    assert_int_equal(mpri_cuda_nll_loss_bwd(0, MPR_F32, mpr_tensor_data(tgtd), N, Cn, -100, cnt_g, 0.7,
                                            mpr_tensor_data(gxg)), MPR_OK);
    expect_close("nll_loss backward", gxg, gxc, 1e-6);
    double mc = mpri_mse_loss_fwd_f32(mpr_tensor_data(x), mpr_tensor_data(gy), n), mg;
    assert_int_equal(mpri_cuda_mse_loss_fwd(0, MPR_F32, mpr_tensor_data(xd), mpr_tensor_data(gyd), n, &mg), MPR_OK);
    assert_true(fabs(mc - mg) < 1e-5 * fabs(mc));
    mpr_tensor_t *gac = mpr_scope_adopt(mpr_tensor_empty(MPR_F32, 1, (const int64_t[]){n}));
    mpr_tensor_t *gag = mpr_scope_adopt(mpr_tensor_empty_on(0, MPR_F32, 1, (const int64_t[]){n}));
    mpri_mse_loss_bwd_f32(mpr_tensor_data(x), mpr_tensor_data(gy), n, 1.0, mpr_tensor_data(gac), NULL);
    assert_int_equal(mpri_cuda_mse_loss_bwd(0, MPR_F32, mpr_tensor_data(xd), mpr_tensor_data(gyd), n, 1.0,
                                            mpr_tensor_data(gag), NULL), MPR_OK);
    expect_close("mse_loss backward", gag, gac, 1e-6);
    assert_int_equal(mpr_cuda_synchronize(0), MPR_OK);
    mpr_scope_end();
    mpr_generator_destroy(g);
    assert_int_equal(mpr_tensor_live_count(), live);
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_errors),
        cmocka_unit_test(test_transfers),
        cmocka_unit_test(test_mlp_step_on_gpu),
        cmocka_unit_test(test_index_ops_and_dropout_on_gpu),
#ifdef MPIRPC_TEST_CUDA_KERNELS
        cmocka_unit_test(test_gemm_plan),
        cmocka_unit_test(test_sum_plan),
        cmocka_unit_test(test_kernel_errors_without_gpu),
        cmocka_unit_test(test_kernels),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
