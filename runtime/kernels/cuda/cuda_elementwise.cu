// cuda_elementwise.cu — device versions of the elementwise, copy, fill and
// sum-into kernels of mpri_kernels.h (same formulas as cpu_elementwise.c /
// cpu_copy.c / cpu_reduce.c, so CPU and GPU results agree to rounding).
//
// Invariants: grid-stride loops cover any n with a bounded grid; strided
// operands are addressed through mpri_cuda_nd (C-order linear index ->
// per-operand offsets), so broadcasting (stride 0) and views work unchanged;
// sum_into sums each output's inputs in double in up to
// MPRI_CUDA_SUM_MAX_CHUNKS interleaved chunks, one atomicAdd per chunk
// (several chunks meet in one output element); nothing here allocates.
#include <math.h>

#include "cuda_common.cuh"

#define THREADS 256

// pw: the exponent class of MPRI_UN_POW decided on the host in double, as the
// CPU kernel does (p0 == 2.0 / p0 == 0.0 tested before the cast to float).
enum { POW_ANY = 0, POW_TWO = 1, POW_ZERO = 2 };
static inline int pow_class(double p0) { return p0 == 2.0 ? POW_TWO : (p0 == 0.0 ? POW_ZERO : POW_ANY); }

template <typename T> __device__ static inline T unary_f(int op, int pw, T v, T q0, T q1) {
    switch (op) {
    case MPRI_UN_NEG: return -v;
    case MPRI_UN_EXP: return exp(v);
    case MPRI_UN_LOG: return log(v);
    case MPRI_UN_SQRT: return sqrt(v);
    case MPRI_UN_ABS: return fabs(v);
    case MPRI_UN_RELU: return v > 0 ? v : (v != v ? v : (T)0);
    case MPRI_UN_TANH: return tanh(v);
    case MPRI_UN_SIGMOID: return (T)1 / ((T)1 + exp(-v));
    case MPRI_UN_GELU: return v * (T)0.5 * ((T)1 + erf(v * (T)0.70710678118654752440));
    case MPRI_UN_POW: return pw == POW_TWO ? v * v : pow(v, q0);
    case MPRI_UN_CLAMP: return v < q0 ? q0 : (v > q1 ? q1 : v);
    case MPRI_UN_ADD_S: return v + q0;
    case MPRI_UN_MUL_S: return v * q0;
    case MPRI_UN_RSUB_S: return q0 - v;
    default: return v;
    }
}

template <typename T>
__device__ static inline T unary_bw_f(int op, int pw, T g, const T *x, const T *y, int64_t i, T q0, T q1) {
    switch (op) {
    case MPRI_UN_NEG: return -g;
    case MPRI_UN_EXP: return g * y[i];
    case MPRI_UN_LOG: return g / x[i];
    case MPRI_UN_SQRT: return g / (2 * y[i]);
    case MPRI_UN_ABS: return x[i] > 0 ? g : (x[i] < 0 ? -g : (T)0);
    case MPRI_UN_RELU: return y[i] > 0 ? g : (T)0;
    case MPRI_UN_TANH: return g * (1 - y[i] * y[i]);
    case MPRI_UN_SIGMOID: return g * y[i] * (1 - y[i]);
    case MPRI_UN_GELU:
        return g * ((T)0.5 * (1 + erf(x[i] * (T)0.70710678118654752440)) +
                    x[i] * (T)0.39894228040143267794 * exp(-(T)0.5 * x[i] * x[i]));
    case MPRI_UN_POW:
        if (pw == POW_ZERO) return 0 * g;
        if (pw == POW_TWO) return g * 2 * x[i];
        return g * q0 * pow(x[i], q0 - 1);
    case MPRI_UN_CLAMP: return (x[i] >= q0 && x[i] <= q1) ? g : (T)0;
    case MPRI_UN_ADD_S: return g;
    case MPRI_UN_MUL_S: return g * q0;
    case MPRI_UN_RSUB_S: return -g;
    default: return g;
    }
}

template <typename T> __global__ void unary_kernel(int op, int pw, int64_t n, T *out, const T *x, T q0, T q1) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = unary_f<T>(op, pw, x[i], q0, q1);
}

template <typename T>
__global__ void unary_bw_kernel(int op, int pw, int64_t n, T *gin, const T *gout, const T *x, const T *y, T q0,
                                T q1) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        gin[i] = unary_bw_f<T>(op, pw, gout[i], x, y, i, q0, q1);
}

extern "C" mpr_err_t mpri_cuda_k_unary(int device, mpri_unop_t op, mpr_dtype_t dt, int64_t n, void *out,
                                       const void *x, double p0, double p1) {
    if (n == 0) return MPR_OK;
    MPRI_CUDA_SET_DEVICE(device, "cuda unary");
    unsigned b = mpri_cuda_blocks(n, THREADS);
    int pw = pow_class(p0);
    if (dt == MPR_F32)
        unary_kernel<float><<<b, THREADS>>>((int)op, pw, n, (float *)out, (const float *)x, (float)p0, (float)p1);
    else if (dt == MPR_F64)
        unary_kernel<double><<<b, THREADS>>>((int)op, pw, n, (double *)out, (const double *)x, p0, p1);
    else
        return mpr_error_set(MPR_ERR_DTYPE, "cuda unary: dtype %s", mpr_dtype_name(dt));
    MPRI_CUDA_LAUNCHED("cuda unary");
    return MPR_OK;
}

extern "C" mpr_err_t mpri_cuda_k_unary_backward(int device, mpri_unop_t op, mpr_dtype_t dt, int64_t n, void *gin,
                                                const void *gout, const void *x, const void *y, double p0,
                                                double p1) {
    if (n == 0) return MPR_OK;
    MPRI_CUDA_SET_DEVICE(device, "cuda unary backward");
    unsigned b = mpri_cuda_blocks(n, THREADS);
    int pw = pow_class(p0);
    if (dt == MPR_F32)
        unary_bw_kernel<float><<<b, THREADS>>>((int)op, pw, n, (float *)gin, (const float *)gout, (const float *)x,
                                               (const float *)y, (float)p0, (float)p1);
    else if (dt == MPR_F64)
        unary_bw_kernel<double><<<b, THREADS>>>((int)op, pw, n, (double *)gin, (const double *)gout,
                                                (const double *)x, (const double *)y, p0, p1);
    else
        return mpr_error_set(MPR_ERR_DTYPE, "cuda unary backward: dtype %s", mpr_dtype_name(dt));
    MPRI_CUDA_LAUNCHED("cuda unary backward");
    return MPR_OK;
}

template <typename T>
__global__ void binary_kernel(int op, int64_t n, mpri_cuda_nd nd, T *o, const T *a, const T *b, T alpha) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t oo, oa, ob;
        mpri_cuda_offsets(nd, i, &oo, &oa, &ob);
        T x = a[oa], y = b[ob], r;
        switch (op) {
        case MPRI_BIN_ADD: r = x + alpha * y; break;
        case MPRI_BIN_SUB: r = x - alpha * y; break;
        case MPRI_BIN_MUL: r = x * y; break;
        default: r = x / y; break;
        }
        o[oo] = r;
    }
}

extern "C" mpr_err_t mpri_cuda_k_binary(int device, mpri_binop_t op, mpr_dtype_t dt, int ndim, const int64_t *shape,
                                        void *o, const int64_t *so, const void *a, const int64_t *sa, const void *b,
                                        const int64_t *sb, double alpha) {
    int64_t n = mpri_cuda_numel(ndim, shape);
    if (n == 0) return MPR_OK;
    MPRI_CUDA_SET_DEVICE(device, "cuda binary");
    mpri_cuda_nd nd = mpri_cuda_make_nd(ndim, shape, so, sa, sb);
    unsigned bl = mpri_cuda_blocks(n, THREADS);
    if (dt == MPR_F32)
        binary_kernel<float><<<bl, THREADS>>>((int)op, n, nd, (float *)o, (const float *)a, (const float *)b,
                                              (float)alpha);
    else if (dt == MPR_F64)
        binary_kernel<double><<<bl, THREADS>>>((int)op, n, nd, (double *)o, (const double *)a, (const double *)b,
                                               alpha);
    else
        return mpr_error_set(MPR_ERR_DTYPE, "cuda binary: dtype %s", mpr_dtype_name(dt));
    MPRI_CUDA_LAUNCHED("cuda binary");
    return MPR_OK;
}

__device__ static inline double load_any(int dt, const char *p) {
    switch (dt) {
    case MPR_F32: return *(const float *)p;
    case MPR_F64: return *(const double *)p;
    case MPR_I64: return (double)*(const int64_t *)p;
    case MPR_I32: return *(const int32_t *)p;
    default: return *(const uint8_t *)p;
    }
}

__device__ static inline void store_any(int dt, char *p, double v) {
    switch (dt) {
    case MPR_F32: *(float *)p = (float)v; break;
    case MPR_F64: *(double *)p = v; break;
    case MPR_I64: *(int64_t *)p = (int64_t)v; break;
    case MPR_I32: *(int32_t *)p = (int32_t)v; break;
    default: *(uint8_t *)p = (uint8_t)v; break;
    }
}

// Same dtype: copy the bytes (exact for int64 beyond 2^53); else convert through double like the CPU kernel.
__global__ void copy_kernel(int64_t n, mpri_cuda_nd nd, int ddt, char *dst, int dsz, int sdt, const char *src,
                            int ssz) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t od, os, unused;
        mpri_cuda_offsets(nd, i, &od, &os, &unused);
        char *dp = dst + od * dsz;
        const char *sp = src + os * ssz;
        if (ddt == sdt)
            for (int k = 0; k < dsz; k++) dp[k] = sp[k];
        else
            store_any(ddt, dp, load_any(sdt, sp));
    }
}

extern "C" mpr_err_t mpri_cuda_k_copy(int device, int ndim, const int64_t *shape, mpr_dtype_t dst_dt, void *dst,
                                      const int64_t *sd, mpr_dtype_t src_dt, const void *src, const int64_t *ss) {
    int64_t n = mpri_cuda_numel(ndim, shape);
    if (n == 0) return MPR_OK;
    MPRI_CUDA_SET_DEVICE(device, "cuda copy");
    mpri_cuda_nd nd = mpri_cuda_make_nd(ndim, shape, sd, ss, NULL);
    copy_kernel<<<mpri_cuda_blocks(n, THREADS), THREADS>>>(n, nd, (int)dst_dt, (char *)dst,
                                                           (int)mpr_dtype_size(dst_dt), (int)src_dt,
                                                           (const char *)src, (int)mpr_dtype_size(src_dt));
    MPRI_CUDA_LAUNCHED("cuda copy");
    return MPR_OK;
}

__global__ void fill_kernel(int64_t n, mpri_cuda_nd nd, int dt, char *dst, int esz, double value) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t od, u1, u2;
        mpri_cuda_offsets(nd, i, &od, &u1, &u2);
        store_any(dt, dst + od * esz, value);
    }
}

extern "C" mpr_err_t mpri_cuda_k_fill(int device, mpr_dtype_t dt, int ndim, const int64_t *shape, void *dst,
                                      const int64_t *sd, double value) {
    int64_t n = mpri_cuda_numel(ndim, shape);
    if (n == 0) return MPR_OK;
    MPRI_CUDA_SET_DEVICE(device, "cuda fill");
    mpri_cuda_nd nd = mpri_cuda_make_nd(ndim, shape, sd, NULL, NULL);
    fill_kernel<<<mpri_cuda_blocks(n, THREADS), THREADS>>>(n, nd, (int)dt, (char *)dst, (int)mpr_dtype_size(dt),
                                                           value);
    MPRI_CUDA_LAUNCHED("cuda fill");
    return MPR_OK;
}

extern "C" void mpri_cuda_sum_plan(int ndim, const int64_t *shape, const int64_t *so, const int64_t *si,
                                   mpri_cuda_sum_plan_t *p) {
    p->nk = p->nr = 0;
    p->P = p->R = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1) continue;
        if (so[d] == 0) {
            p->rshape[p->nr] = shape[d];
            p->rsi[p->nr] = si[d];
            p->nr++;
            p->R *= shape[d];
        } else {
            p->kshape[p->nk] = shape[d];
            p->ksi[p->nk] = si[d];
            p->kso[p->nk] = so[d];
            p->nk++;
            p->P *= shape[d];
        }
    }
    // Enough work items to fill the GPU (about 2^20 threads), never more
    // chunks than reduced elements, and at most MPRI_CUDA_SUM_MAX_CHUNKS
    // partial sums per output element.
    int64_t want = ((int64_t)1 << 20) / (p->P > 0 ? p->P : 1);
    if (want > p->R) want = p->R;
    if (want > MPRI_CUDA_SUM_MAX_CHUNKS) want = MPRI_CUDA_SUM_MAX_CHUNKS;
    p->nchunks = want > 1 ? want : 1;
}

// Work item w: kept position p = w / nchunks, chunk c = w % nchunks; sums
// in[p, r] over r = c, c + nchunks, ... in double, then one atomic add.
// kept: st[0] = out strides, st[1] = in strides; red: st[1] = in strides.
template <typename T>
__global__ void sum_into_kernel(int64_t items, int64_t nchunks, int64_t R, mpri_cuda_nd kept, mpri_cuda_nd red,
                                T *out, const T *in) {
    for (int64_t w = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; w < items;
         w += (int64_t)gridDim.x * blockDim.x) {
        int64_t p = w / nchunks, c = w % nchunks, oo, oi, u;
        mpri_cuda_offsets(kept, p, &oo, &oi, &u);
        double acc = 0;
        for (int64_t r = c; r < R; r += nchunks) {
            int64_t u0, ri, u2;
            mpri_cuda_offsets(red, r, &u0, &ri, &u2);
            acc += (double)in[oi + ri];
        }
        atomicAdd(out + oo, (T)acc);
    }
}

extern "C" mpr_err_t mpri_cuda_k_sum_into(int device, mpr_dtype_t dt, int ndim, const int64_t *shape, void *out,
                                          const int64_t *so, const void *in, const int64_t *si) {
    int64_t n = mpri_cuda_numel(ndim, shape);
    if (n == 0) return MPR_OK;
    if (dt != MPR_F32 && dt != MPR_F64)
        return mpr_error_set(MPR_ERR_DTYPE, "cuda sum_into: dtype %s", mpr_dtype_name(dt));
    MPRI_CUDA_SET_DEVICE(device, "cuda sum_into");
    mpri_cuda_sum_plan_t p;
    mpri_cuda_sum_plan(ndim, shape, so, si, &p);
    mpri_cuda_nd kept = mpri_cuda_make_nd(p.nk, p.kshape, p.kso, p.ksi, NULL);
    mpri_cuda_nd red = mpri_cuda_make_nd(p.nr, p.rshape, NULL, p.rsi, NULL);
    int64_t items = p.P * p.nchunks;
    unsigned b = mpri_cuda_blocks(items, THREADS);
    if (dt == MPR_F32)
        sum_into_kernel<float><<<b, THREADS>>>(items, p.nchunks, p.R, kept, red, (float *)out, (const float *)in);
    else
        sum_into_kernel<double><<<b, THREADS>>>(items, p.nchunks, p.R, kept, red, (double *)out, (const double *)in);
    MPRI_CUDA_LAUNCHED("cuda sum_into");
    return MPR_OK;
}
