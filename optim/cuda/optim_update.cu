// optim_update.cu — the local optimizers' updates for parameters on a CUDA
// device: the device twins of the loops in optim/{sgd,adagrad,adam,adamw,
// rmsprop}.c (contract in optim/mpri_optim_cuda.h).
//
// Invariants: every element's arithmetic is the CPU loop's, operation by
// operation and in the same order (this file is compiled with -fmad=false,
// IEEE division and square root: see optim/CMakeLists.txt); the scalars are
// computed on the host in double exactly as the CPU kernels compute them and
// reach the kernels already cast to the dtype, so a CUDA parameter's
// trajectory equals a CPU parameter's bit for bit. One thread per element
// (grid-stride), no inter-element dependence, so any launch geometry gives
// the same result.
#include <math.h>

#include "kernels/cuda/cuda_common.cuh"
#include "mpri_optim_cuda.h"

namespace {

constexpr int kThreads = 256;

// ---- SGD (sgd.c): mode 0 no momentum, 1 first step (buf = d), 2 momentum ----
template <typename T>
struct SgdScalars {
    T neg_lr, mom, damp, sign, wd;
    bool has_wd, nesterov;
    int mode;
};

template <typename T>
__global__ void sgd_kernel(int64_t n, T *__restrict__ p, const T *__restrict__ g, T *__restrict__ buf,
                           SgdScalars<T> s) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < n; j += (int64_t)gridDim.x * blockDim.x) {
        T d = s.has_wd ? s.sign * g[j] + s.wd * p[j] : s.sign * g[j];
        if (s.mode >= 1) {
            buf[j] = s.mode == 1 ? d : buf[j] * s.mom + s.damp * d;
            d = s.nesterov ? d + s.mom * buf[j] : buf[j];
        }
        p[j] = p[j] + s.neg_lr * d;
    }
}

template <typename T>
void sgd_launch(const mpr_optim_options_t *o, int64_t n, void *p, const void *g, void *const *slots, int64_t step) {
    SgdScalars<T> s;
    s.neg_lr = (T)-o->lr;
    s.mom = (T)o->momentum;
    s.damp = (T)(1 - o->dampening);
    s.sign = o->maximize ? (T)-1 : (T)1;
    s.wd = (T)o->weight_decay;
    s.has_wd = o->weight_decay != 0;
    s.nesterov = o->nesterov;
    s.mode = !slots[0] ? 0 : step == 1 ? 1 : 2;
    sgd_kernel<T><<<mpri_cuda_blocks(n, kThreads), kThreads>>>(n, (T *)p, (const T *)g, (T *)slots[0], s);
}

// ---- Adagrad (adagrad.c) ----
template <typename T>
struct AdagradScalars {
    T neg_clr, eps, one, sign, wd;
    bool has_wd;
};

template <typename T>
__global__ void adagrad_kernel(int64_t n, T *__restrict__ p, const T *__restrict__ g, T *__restrict__ sum,
                               AdagradScalars<T> s) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < n; j += (int64_t)gridDim.x * blockDim.x) {
        T d = s.has_wd ? s.sign * g[j] + s.wd * p[j] : s.sign * g[j];
        sum[j] = sum[j] + s.one * d * d;
        T std = sqrt(sum[j]) + s.eps;
        p[j] = p[j] + s.neg_clr * d / std;
    }
}

template <typename T>
void adagrad_launch(const mpr_optim_options_t *o, int64_t n, void *p, const void *g, void *const *slots,
                    int64_t step) {
    double clr = o->lr / (1 + (double)(step - 1) * o->lr_decay);
    AdagradScalars<T> s;
    s.neg_clr = (T)-clr;
    s.eps = (T)o->eps;
    s.one = 1;
    s.sign = o->maximize ? (T)-1 : (T)1;
    s.wd = (T)o->weight_decay;
    s.has_wd = o->weight_decay != 0;
    adagrad_kernel<T><<<mpri_cuda_blocks(n, kThreads), kThreads>>>(n, (T *)p, (const T *)g, (T *)slots[0], s);
}

// ---- Adam (adam.c) and AdamW (adamw.c: p *= keep first, then Adam without decay) ----
template <typename T>
struct AdamScalars {
    T b1, c1, b2, c2, bc2_sqrt, eps, neg_step, sign, wd, keep;
    bool has_wd, amsgrad, decoupled;
};

template <typename T>
__global__ void adam_kernel(int64_t n, T *__restrict__ p, const T *__restrict__ g, T *__restrict__ m,
                            T *__restrict__ v, T *__restrict__ vmax, AdamScalars<T> s) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < n; j += (int64_t)gridDim.x * blockDim.x) {
        if (s.decoupled) p[j] = p[j] * s.keep;
        T d = s.has_wd ? s.sign * g[j] + s.wd * p[j] : s.sign * g[j];
        m[j] = m[j] * s.b1;
        m[j] = m[j] + s.c1 * d;
        v[j] = v[j] * s.b2;
        v[j] = v[j] + s.c2 * d * d;
        T vv = v[j];
        if (s.amsgrad) {
            T mx = vmax[j];
            vv = mx > vv || mx != mx ? mx : vv; // torch.maximum: NaN wins
            vmax[j] = vv;
        }
        T denom = sqrt(vv) / s.bc2_sqrt + s.eps;
        p[j] = p[j] + s.neg_step * m[j] / denom;
    }
}

template <typename T>
void adam_launch(const mpr_optim_options_t *o, bool decoupled, int64_t n, void *p, const void *g,
                 void *const *slots, int64_t step) {
    double bc1 = 1 - pow(o->beta1, (double)step), bc2 = 1 - pow(o->beta2, (double)step);
    AdamScalars<T> s;
    s.b1 = (T)o->beta1;
    s.c1 = (T)(1 - o->beta1);
    s.b2 = (T)o->beta2;
    s.c2 = (T)(1 - o->beta2);
    s.bc2_sqrt = (T)sqrt(bc2);
    s.eps = (T)o->eps;
    s.neg_step = (T)(-(o->lr / bc1));
    s.sign = o->maximize ? (T)-1 : (T)1;
    s.decoupled = decoupled;
    s.keep = (T)(1 - o->lr * o->weight_decay);
    s.wd = decoupled ? (T)0 : (T)o->weight_decay;
    s.has_wd = !decoupled && o->weight_decay != 0;
    s.amsgrad = slots[2] != NULL;
    adam_kernel<T><<<mpri_cuda_blocks(n, kThreads), kThreads>>>(n, (T *)p, (const T *)g, (T *)slots[0],
                                                                (T *)slots[1], (T *)slots[2], s);
}

// ---- RMSprop (rmsprop.c): slots square_avg, momentum_buffer, grad_avg ----
template <typename T>
struct RmspropScalars {
    T a, c, eps, neg_lr, mom, one, minus_one, sign, wd;
    bool has_wd, centered, momentum;
};

template <typename T>
__global__ void rmsprop_kernel(int64_t n, T *__restrict__ p, const T *__restrict__ g, T *__restrict__ sq,
                               T *__restrict__ buf, T *__restrict__ ga, RmspropScalars<T> s) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < n; j += (int64_t)gridDim.x * blockDim.x) {
        T d = s.has_wd ? s.sign * g[j] + s.wd * p[j] : s.sign * g[j], avg;
        sq[j] = sq[j] * s.a;
        sq[j] = sq[j] + s.c * d * d;
        if (s.centered) {
            ga[j] = ga[j] * s.a;
            ga[j] = ga[j] + s.c * d;
            avg = sqrt(sq[j] + s.minus_one * ga[j] * ga[j]);
        } else {
            avg = sqrt(sq[j]);
        }
        avg = avg + s.eps;
        if (s.momentum) {
            buf[j] = buf[j] * s.mom;
            buf[j] = buf[j] + s.one * d / avg;
            p[j] = p[j] + s.neg_lr * buf[j];
        } else {
            p[j] = p[j] + s.neg_lr * d / avg;
        }
    }
}

template <typename T>
void rmsprop_launch(const mpr_optim_options_t *o, int64_t n, void *p, const void *g, void *const *slots,
                    int64_t step) {
    (void)step;
    RmspropScalars<T> s;
    s.a = (T)o->alpha;
    s.c = (T)(1 - o->alpha);
    s.eps = (T)o->eps;
    s.neg_lr = (T)-o->lr;
    s.mom = (T)o->momentum;
    s.one = 1;
    s.minus_one = -1;
    s.sign = o->maximize ? (T)-1 : (T)1;
    s.wd = (T)o->weight_decay;
    s.has_wd = o->weight_decay != 0;
    s.centered = slots[2] != NULL;
    s.momentum = slots[1] != NULL;
    rmsprop_kernel<T><<<mpri_cuda_blocks(n, kThreads), kThreads>>>(n, (T *)p, (const T *)g, (T *)slots[0],
                                                                   (T *)slots[1], (T *)slots[2], s);
}

// Select the device, launch the dtype's kernel, report a failed launch.
template <typename F32, typename F64>
mpr_err_t run(const char *what, int device, mpr_dtype_t dt, int64_t n, F32 launch_f32, F64 launch_f64) {
    if (dt != MPR_F32 && dt != MPR_F64)
        return mpr_error_set(MPR_ERR_DTYPE, "%s: dtype %s on CUDA (float32/float64 needed)", what, mpr_dtype_name(dt));
    if (n <= 0) return MPR_OK;
    MPRI_CUDA_SET_DEVICE(device, what);
    if (dt == MPR_F32)
        launch_f32();
    else
        launch_f64();
    MPRI_CUDA_LAUNCHED(what);
    return MPR_OK;
}

} // namespace

extern "C" mpr_err_t mpri_optim_cuda_sgd(const mpr_optim_options_t *o, int device, mpr_dtype_t dt, int64_t n,
                                         void *p, const void *g, void *const *slots, int64_t step) {
    return run(
        "SGD step (CUDA)", device, dt, n, [&] { sgd_launch<float>(o, n, p, g, slots, step); },
        [&] { sgd_launch<double>(o, n, p, g, slots, step); });
}

extern "C" mpr_err_t mpri_optim_cuda_adagrad(const mpr_optim_options_t *o, int device, mpr_dtype_t dt, int64_t n,
                                             void *p, const void *g, void *const *slots, int64_t step) {
    return run(
        "Adagrad step (CUDA)", device, dt, n, [&] { adagrad_launch<float>(o, n, p, g, slots, step); },
        [&] { adagrad_launch<double>(o, n, p, g, slots, step); });
}

extern "C" mpr_err_t mpri_optim_cuda_adam(const mpr_optim_options_t *o, int device, mpr_dtype_t dt, int64_t n,
                                          void *p, const void *g, void *const *slots, int64_t step) {
    return run(
        "Adam step (CUDA)", device, dt, n, [&] { adam_launch<float>(o, false, n, p, g, slots, step); },
        [&] { adam_launch<double>(o, false, n, p, g, slots, step); });
}

extern "C" mpr_err_t mpri_optim_cuda_adamw(const mpr_optim_options_t *o, int device, mpr_dtype_t dt, int64_t n,
                                           void *p, const void *g, void *const *slots, int64_t step) {
    return run(
        "AdamW step (CUDA)", device, dt, n, [&] { adam_launch<float>(o, true, n, p, g, slots, step); },
        [&] { adam_launch<double>(o, true, n, p, g, slots, step); });
}

extern "C" mpr_err_t mpri_optim_cuda_rmsprop(const mpr_optim_options_t *o, int device, mpr_dtype_t dt, int64_t n,
                                             void *p, const void *g, void *const *slots, int64_t step) {
    return run(
        "RMSprop step (CUDA)", device, dt, n, [&] { rmsprop_launch<float>(o, n, p, g, slots, step); },
        [&] { rmsprop_launch<double>(o, n, p, g, slots, step); });
}
