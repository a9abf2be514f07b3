/* gradcheck.h — finite-difference gradient check for ops, header-only, for
 * the unit tests (tests/unit/test_gradcheck_*.c).
 *
 * Usage:
 *     static mpr_tensor_t *f(mpr_tensor_t **in, void *ctx) { return mpr_mul(in[0], in[1]); }
 *     mpr_tensor_t *in[2] = {gc_input(MPR_SHAPE(3, 4), 1), gc_input(MPR_SHAPE(4), 2)};
 *     assert_true(gradcheck("mul", f, NULL, 2, in, NULL));
 *     gc_release(2, in);
 *
 * What it checks: with L = sum(f(inputs) * W) for a fixed random W (so every
 * output element matters with a different weight), the gradient backward
 * puts in each input that requires grad equals the central difference
 * (L(x + eps) - L(x - eps)) / (2 eps) for every element, within
 * |analytic - numeric| <= atol + rtol * |numeric|. Inputs must be float64,
 * contiguous leaves; inputs that do not require grad (indices, targets) are
 * passed through unchecked. f may return any shape; it is called in a scope
 * and must return a result (not release it). Prints the first mismatch.
 * Checks also that backward fills a grad of the input's shape. */
#ifndef MPIRPC_TEST_GRADCHECK_H
#define MPIRPC_TEST_GRADCHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpirpc/tensor_ops.h"

typedef mpr_tensor_t *(*gc_fn)(mpr_tensor_t **inputs, void *ctx);

typedef struct gc_opts {
    double eps, atol, rtol;
} gc_opts_t;

/* A float64 leaf with uniform(-1, 1) values (seeded by `seed`) requiring grad.
 * Caller owns it (call outside scopes or mpr_scope_keep it). */
static inline mpr_tensor_t *gc_input(int ndim, const int64_t *shape, uint64_t seed) {
    mpr_generator_t *g = mpr_generator_create(seed);
    mpr_tensor_t *t = mpr_uniform(MPR_F64, ndim, shape, -1.0, 1.0, g);
    mpr_generator_destroy(g);
    if (t) mpr_set_requires_grad(t, true);
    return t;
}

static inline void gc_release(int n, mpr_tensor_t **in) {
    for (int i = 0; i < n; i++) mpr_tensor_release(in[i]);
}

/* L = sum(f(in) * w), evaluated with grad mode off. */
static inline double gc_loss(gc_fn f, void *ctx, mpr_tensor_t **in, mpr_tensor_t *w, bool *ok) {
    bool prev = mpr_set_grad_enabled(false);
    mpr_scope_begin();
    double v = NAN;
    mpr_tensor_t *l = mpr_sum(mpr_mul(f(in, ctx), w));
    if (!l || mpr_item(l, &v) != MPR_OK) *ok = false;
    mpr_scope_end();
    mpr_set_grad_enabled(prev);
    return v;
}

static inline bool gradcheck(const char *name, gc_fn f, void *ctx, int n, mpr_tensor_t **in,
                             const gc_opts_t *opts) {
    gc_opts_t o = opts ? *opts : (gc_opts_t){1e-6, 1e-6, 1e-4};
    bool ok = true;
    for (int i = 0; i < n; i++) {
        if (!in[i]) {
            fprintf(stderr, "gradcheck %s: input %d is NULL: %s\n", name, i, mpr_last_error());
            return false;
        }
        mpr_zero_grad(in[i]);
    }
    /* Analytic pass. */
    mpr_scope_begin();
    mpr_tensor_t *out = f(in, ctx);
    if (!out) {
        fprintf(stderr, "gradcheck %s: forward failed: %s\n", name, mpr_last_error());
        mpr_scope_end();
        return false;
    }
    mpr_generator_t *g = mpr_generator_create(12345);
    mpr_tensor_t *w = mpr_scope_keep(mpr_uniform(MPR_F64, mpr_tensor_ndim(out), mpr_tensor_shape(out), 0.5, 1.5, g));
    mpr_generator_destroy(g);
    mpr_tensor_t *l = mpr_sum(mpr_mul(out, w));
    if (!l || mpr_backward(l, NULL, false) != MPR_OK) {
        fprintf(stderr, "gradcheck %s: backward failed: %s\n", name, mpr_last_error());
        mpr_scope_end();
        mpr_tensor_release(w);
        return false;
    }
    mpr_scope_end();
    /* Numeric pass, element by element. */
    for (int i = 0; i < n && ok; i++) {
        if (!mpr_requires_grad(in[i])) continue;
        mpr_tensor_t *ga = mpr_tensor_grad(in[i]);
        int64_t numel = mpr_tensor_numel(in[i]);
        if (mpr_tensor_dtype(in[i]) != MPR_F64 || !mpr_tensor_is_contiguous(in[i])) {
            fprintf(stderr, "gradcheck %s: input %d must be a contiguous float64 tensor\n", name, i);
            ok = false;
            break;
        }
        if (!ga && numel > 0) {
            fprintf(stderr, "gradcheck %s: input %d got no gradient\n", name, i);
            ok = false;
            break;
        }
        if (ga && (mpr_tensor_ndim(ga) != mpr_tensor_ndim(in[i]) ||
                   memcmp(mpr_tensor_shape(ga), mpr_tensor_shape(in[i]),
                          sizeof(int64_t) * (size_t)mpr_tensor_ndim(ga)) != 0)) {
            fprintf(stderr, "gradcheck %s: input %d gradient has the wrong shape\n", name, i);
            ok = false;
            break;
        }
        double *x = mpr_tensor_data(in[i]);
        double *gbuf = malloc(sizeof(double) * (size_t)(numel ? numel : 1));
        if (ga) mpr_copy_to_buffer(ga, MPR_F64, gbuf, sizeof(double) * (size_t)numel);
        for (int64_t k = 0; k < numel && ok; k++) {
            double x0 = x[k];
            x[k] = x0 + o.eps;
            double lp = gc_loss(f, ctx, in, w, &ok);
            x[k] = x0 - o.eps;
            double lm = gc_loss(f, ctx, in, w, &ok);
            x[k] = x0;
            double num = (lp - lm) / (2 * o.eps), ana = gbuf[k];
            if (!ok || !(fabs(num - ana) <= o.atol + o.rtol * fabs(num))) {
                fprintf(stderr, "gradcheck %s: input %d element %lld: analytic %.10g numeric %.10g%s\n", name, i,
                        (long long)k, ana, num, ok ? "" : " (forward failed)");
                ok = false;
            }
        }
        free(gbuf);
    }
    mpr_tensor_release(w);
    return ok;
}

#endif
