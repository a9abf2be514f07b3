/* cpu_backend.c — the backend table of the CPU kernels and the registry of
 * the device backend (CUDA) that serves devices >= 0.
 *
 * Invariants: the CPU backend is always present and never changes; at most
 * one device backend is registered (it is read without a lock, so it must be
 * registered before tensors are created on a device, e.g. from a library
 * constructor of the CUDA build). */
#include "mpri_kernels.h"

static mpri_storage_t *cpu_storage_create(size_t nbytes, int device) {
    (void)device;
    return mpri_storage_create(nbytes);
}

static void cpu_activate(int device) { (void)device; }

const mpri_backend_t mpri_cpu_backend = {
    .name = "cpu",
    .activate = cpu_activate,
    .storage_create = cpu_storage_create,
    .unary = mpri_k_unary,
    .unary_backward = mpri_k_unary_backward,
    .binary = mpri_k_binary,
    .copy = mpri_k_copy,
    .fill = mpri_k_fill,
    .sum_into = mpri_k_sum_into,
    .max_dim = mpri_k_max_dim,
    .max_dim_backward = mpri_k_max_dim_backward,
    .gemm = mpri_k_gemm,
};

static const mpri_backend_t *device_backend;

void mpri_backend_register(const mpri_backend_t *cuda) { device_backend = cuda; }

const mpri_backend_t *mpri_backend_for(const char *op, int device) {
    if (device < 0) return &mpri_cpu_backend;
    if (!device_backend) {
        mpr_error_set(MPR_ERR_UNSUPPORTED, "%s: tensor on cuda:%d but this build has no CUDA backend", op, device);
        return NULL;
    }
    device_backend->activate(device);
    return device_backend;
}
