/* cpu_copy.c — strided copies with dtype conversion, and fills.
 *
 * Invariants: no allocation; same-dtype copies whose inner run is contiguous
 * on both sides use memcpy per row; conversions go through double (exact for
 * f32/i32/u8 and for i64 up to 2^53) and only run for to(dtype)/copy_. */

/* Vectorize the inner loops at the default -O2 (whose "very cheap" cost model
 * skips loops with an unknown trip count). */
#pragma GCC optimize("O3")

#include <string.h>

#include "mpri_kernels.h"

static double load(mpr_dtype_t dt, const char *p) {
    switch (dt) {
    case MPR_F32: return *(const float *)p;
    case MPR_F64: return *(const double *)p;
    case MPR_I64: return (double)*(const int64_t *)p;
    case MPR_I32: return *(const int32_t *)p;
    case MPR_U8: return *(const uint8_t *)p;
    default: return 0;
    }
}

static void store(mpr_dtype_t dt, char *p, double v) {
    switch (dt) {
    case MPR_F32: *(float *)p = (float)v; break;
    case MPR_F64: *(double *)p = v; break;
    case MPR_I64: *(int64_t *)p = (int64_t)v; break;
    case MPR_I32: *(int32_t *)p = (int32_t)v; break;
    case MPR_U8: *(uint8_t *)p = (uint8_t)v; break;
    default: break;
    }
}

void mpri_k_copy(int ndim, const int64_t *shape, mpr_dtype_t dst_dt, void *dst, const int64_t *sd,
                 mpr_dtype_t src_dt, const void *src, const int64_t *ss) {
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) numel *= shape[d];
    if (numel == 0) return;
    const int64_t *strides[2] = {sd, ss};
    mpri_iter_t it;
    mpri_iter_init(&it, ndim, shape, 2, strides);
    int last = it.ndim - 1;
    int64_t inner = it.shape[last], rows = numel / inner;
    int64_t idx[MPR_MAX_DIMS] = {0}, off[2] = {0, 0};
    size_t dsz = mpr_dtype_size(dst_dt), ssz = mpr_dtype_size(src_dt);
    int64_t s0 = it.st[0][last], s1 = it.st[1][last];
    char *D = dst;
    const char *S = src;
    for (int64_t r = 0; r < rows; r++) {
        char *dp = D + off[0] * (int64_t)dsz;
        const char *sp = S + off[1] * (int64_t)ssz;
        if (dst_dt == src_dt && s0 == 1 && s1 == 1) {
            memcpy(dp, sp, (size_t)inner * dsz);
        } else if (dst_dt == src_dt && dsz == 4 && s0 == 1 && s1 == 0) { /* a broadcast value (a bias) */
            const int32_t v = *(const int32_t *)sp;
            for (int64_t i = 0; i < inner; i++) ((int32_t *)dp)[i] = v;
        } else if (dst_dt == src_dt && dsz == 8 && s0 == 1 && s1 == 0) {
            const int64_t v = *(const int64_t *)sp;
            for (int64_t i = 0; i < inner; i++) ((int64_t *)dp)[i] = v;
        } else if (dst_dt == src_dt && dsz == 4) {
            for (int64_t i = 0; i < inner; i++)
                ((int32_t *)dp)[i * s0] = ((const int32_t *)sp)[i * s1];
        } else if (dst_dt == src_dt && dsz == 8) {
            for (int64_t i = 0; i < inner; i++)
                ((int64_t *)dp)[i * s0] = ((const int64_t *)sp)[i * s1];
        } else if (dst_dt == src_dt) {
            for (int64_t i = 0; i < inner; i++) dp[i * s0] = sp[i * s1];
        } else {
            for (int64_t i = 0; i < inner; i++)
                store(dst_dt, dp + i * s0 * (int64_t)dsz, load(src_dt, sp + i * s1 * (int64_t)ssz));
        }
        mpri_iter_next(&it, idx, off);
    }
}

void mpri_k_fill(mpr_dtype_t dt, int ndim, const int64_t *shape, void *dst, const int64_t *sd,
                 double value) {
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) numel *= shape[d];
    if (numel == 0) return;
    if (dt == MPR_F32 && mpri_flat_layout(ndim, shape, sd)) {
        float v = (float)value, *fp = dst;
        for (int64_t i = 0; i < numel; i++) fp[i] = v;
        return;
    }
    const int64_t *strides[1] = {sd};
    mpri_iter_t it;
    mpri_iter_init(&it, ndim, shape, 1, strides);
    int last = it.ndim - 1;
    int64_t inner = it.shape[last], rows = numel / inner, s0 = it.st[0][last];
    int64_t idx[MPR_MAX_DIMS] = {0}, off[1] = {0};
    size_t esz = mpr_dtype_size(dt);
    char elem[8];
    store(dt, elem, value);
    for (int64_t r = 0; r < rows; r++) {
        char *dp = (char *)dst + off[0] * (int64_t)esz;
        if (dt == MPR_F32) {
            float v = (float)value;
            for (int64_t i = 0; i < inner; i++) ((float *)dp)[i * s0] = v;
        } else if (dt == MPR_F64) {
            for (int64_t i = 0; i < inner; i++) ((double *)dp)[i * s0] = value;
        } else {
            for (int64_t i = 0; i < inner; i++) memcpy(dp + i * s0 * (int64_t)esz, elem, esz);
        }
        mpri_iter_next(&it, idx, off);
    }
}
