/* cpu_backend.c — the backend table of the CPU kernels, the registry of the
 * device backend (CUDA) that serves devices >= 0, and storage allocation
 * through a backend.
 *
 * Invariants: the CPU backend is always present and never changes and its
 * entries never fail; at most one device backend is registered (read without
 * a lock, so it must be registered before tensors are created on a device). */
#include <stdlib.h>

#include "mpri_kernels.h"

static mpr_err_t cpu_alloc(int device, size_t nbytes, void **out) {
    size_t a = (nbytes + 63) & ~(size_t)63;
    *out = aligned_alloc(64, a ? a : 64);
    return *out ? MPR_OK : mpr_error_set(MPR_ERR_NOMEM, "cpu: cannot allocate %zu bytes", nbytes);
}
static void cpu_free(void *data, int device) { free(data); }

static mpr_err_t cpu_unary(int dev, mpri_unop_t op, mpr_dtype_t dt, int64_t n, void *out, const void *x, double p0,
                           double p1) {
    mpri_k_unary(op, dt, n, out, x, p0, p1);
    return MPR_OK;
}
static mpr_err_t cpu_unary_backward(int dev, mpri_unop_t op, mpr_dtype_t dt, int64_t n, void *gin, const void *gout,
                                    const void *x, const void *y, double p0, double p1) {
    mpri_k_unary_backward(op, dt, n, gin, gout, x, y, p0, p1);
    return MPR_OK;
}
static mpr_err_t cpu_binary(int dev, mpri_binop_t op, mpr_dtype_t dt, int ndim, const int64_t *shape, void *o,
                            const int64_t *so, const void *a, const int64_t *sa, const void *b, const int64_t *sb,
                            double alpha) {
    mpri_k_binary(op, dt, ndim, shape, o, so, a, sa, b, sb, alpha);
    return MPR_OK;
}
static mpr_err_t cpu_copy(int dev, int ndim, const int64_t *shape, mpr_dtype_t dst_dt, void *dst, const int64_t *sd,
                          mpr_dtype_t src_dt, const void *src, const int64_t *ss) {
    mpri_k_copy(ndim, shape, dst_dt, dst, sd, src_dt, src, ss);
    return MPR_OK;
}
static mpr_err_t cpu_fill(int dev, mpr_dtype_t dt, int ndim, const int64_t *shape, void *dst, const int64_t *sd,
                          double value) {
    mpri_k_fill(dt, ndim, shape, dst, sd, value);
    return MPR_OK;
}
static mpr_err_t cpu_sum_into(int dev, mpr_dtype_t dt, int ndim, const int64_t *shape, void *out, const int64_t *so,
                              const void *in, const int64_t *si) {
    mpri_k_sum_into(dt, ndim, shape, out, so, in, si);
    return MPR_OK;
}
static mpr_err_t cpu_max_dim(int dev, mpr_dtype_t dt, int64_t outer, int64_t n, int64_t inner, const void *in,
                             void *vals, int64_t *idx) {
    mpri_k_max_dim(dt, outer, n, inner, in, vals, idx);
    return MPR_OK;
}
static mpr_err_t cpu_max_dim_backward(int dev, mpr_dtype_t dt, int64_t outer, int64_t n, int64_t inner,
                                      const void *gout, const int64_t *idx, void *gin) {
    mpri_k_max_dim_backward(dt, outer, n, inner, gout, idx, gin);
    return MPR_OK;
}
static mpr_err_t cpu_gemm(int dev, mpr_dtype_t dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                          const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
    mpri_k_gemm(dt, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return MPR_OK;
}

const mpri_backend_t mpri_cpu_backend = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .unary = cpu_unary,
    .unary_backward = cpu_unary_backward,
    .binary = cpu_binary,
    .copy = cpu_copy,
    .fill = cpu_fill,
    .sum_into = cpu_sum_into,
    .max_dim = cpu_max_dim,
    .max_dim_backward = cpu_max_dim_backward,
    .gemm = cpu_gemm,
};

static const mpri_backend_t *device_backend;

void mpri_backend_register(const mpri_backend_t *cuda) { device_backend = cuda; }

const mpri_backend_t *mpri_backend_for(const char *op, int device) {
    if (device < 0) return &mpri_cpu_backend;
    if (!device_backend) {
        mpr_error_set(MPR_ERR_UNSUPPORTED, "%s: tensor on cuda:%d but this build has no CUDA backend", op, device);
        return NULL;
    }
    return device_backend;
}

mpr_err_t mpri_backend_missing(const char *op, const mpri_backend_t *b, const char *kernel) {
    return mpr_error_set(MPR_ERR_UNSUPPORTED, "%s: the %s backend has no %s kernel", op, b->name, kernel);
}

mpri_storage_t *mpri_backend_storage(const char *op, int device, size_t nbytes) {
    if (device < 0) {
        mpri_storage_t *s = mpri_storage_create(nbytes);
        if (!s) mpr_error_set(MPR_ERR_NOMEM, "%s: cannot allocate %zu bytes", op, nbytes);
        return s;
    }
    const mpri_backend_t *b = mpri_backend_for(op, device);
    if (!b) return NULL;
    if (!b->alloc || !b->free) {
        mpri_backend_missing(op, b, "alloc");
        return NULL;
    }
    mpri_storage_t *s = calloc(1, sizeof *s);
    if (!s) {
        mpr_error_set(MPR_ERR_NOMEM, "%s: out of memory", op);
        return NULL;
    }
    if (b->alloc(device, nbytes, &s->data) != MPR_OK) {
        free(s);
        return NULL;
    }
    s->nbytes = nbytes;
    s->device = device;
    s->free_data = b->free;
    atomic_init(&s->refcount, 1);
    atomic_init(&s->version, 0);
    return s;
}
