/* backend.c — the backend registry of the kernels layer: which table serves
 * a device (the built-in CPU one for device -1, the one registered device
 * backend, CUDA, for devices >= 0), the layer's ordered init that registers
 * that device backend, and storage allocation and host/device transfers
 * through a backend.
 *
 * Init (mpri_kernels_init): one ordered list, run once per process, as the
 * api layer's init.c runs its own; today its one step installs the CUDA
 * backend (mpri_cuda_backend_install: registers it in a CUDA build, nothing
 * otherwise). It runs at the first lookup of a device >= 0 (mpri_backend_for),
 * the first moment a device backend is needed: tensors are made before and
 * without mpr_init, and the api layer does not see this one in core-only
 * builds, so mpr_init cannot be the place. A failed step is kept and
 * reported by every later lookup of a device. The CPU backend needs no init,
 * so CPU-only code never runs the list.
 *
 * Invariants: at most one device backend is registered at a time. It is
 * written by the init (inside pthread_once, which every device lookup passes
 * first, so readers see it) and otherwise only by single-threaded tests that
 * swap in a fake; it is read without a lock. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "mpri_kernels.h"
#include "mpri_small_alloc.h"

static const mpri_backend_t *device_backend;

mpr_err_t mpri_backend_register(const mpri_backend_t *b) {
    if (b && (!b->name || !b->alloc || !b->free || !b->transfer))
        return mpr_error_set(MPR_ERR_INVALID_ARG, "backend %s: a device backend needs alloc, free and transfer",
                             b->name ? b->name : "(unnamed)");
    device_backend = b;
    return MPR_OK;
}

/* ---- the layer's ordered init ---- */

static const struct {
    const char *name;
    mpr_err_t (*install)(void);
} kernel_steps[] = {
    {"CUDA backend", mpri_cuda_backend_install},
};

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static mpr_err_t init_result;
static char init_failure[MPR_ERROR_TEXT_MAX];

static void run_kernel_steps(void) {
    for (size_t i = 0; i < sizeof kernel_steps / sizeof kernel_steps[0] && !init_result; i++) {
        mpr_err_t e = kernel_steps[i].install();
        if (e)
            snprintf(init_failure, sizeof init_failure, "mpirpc kernels init: installing the %s failed: %s",
                     kernel_steps[i].name, mpr_last_error()[0] ? mpr_last_error() : mpr_strerror(e));
        init_result = e;
    }
}

mpr_err_t mpri_kernels_init(void) {
    pthread_once(&init_once, run_kernel_steps);
    return init_result ? mpr_error_set(init_result, "%s", init_failure) : MPR_OK;
}

const mpri_backend_t *mpri_backend_for(const char *op, int device) {
    if (device < 0) return &mpri_cpu_backend;
    if (mpri_kernels_init() != MPR_OK) return NULL;
    if (!device_backend) {
        mpr_error_set(MPR_ERR_UNSUPPORTED, "%s: tensor on cuda:%d but this build has no CUDA backend", op, device);
        return NULL;
    }
    return device_backend;
}

mpr_err_t mpri_backend_transfer(const char *op, void *dst, int dst_device, const void *src, int src_device,
                                size_t nbytes) {
    const mpri_backend_t *b = mpri_backend_for(op, dst_device >= 0 ? dst_device : src_device);
    if (!b) return mpr_last_error_code();
    if (!b->transfer) return mpri_backend_missing(op, b, "transfer");
    return b->transfer(dst, dst_device, src, src_device, nbytes);
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
    /* mpri_storage_release gives the record back with mpri_small_free. */
    mpri_storage_t *s = mpri_small_calloc(sizeof *s);
    if (!s) {
        mpr_error_set(MPR_ERR_NOMEM, "%s: out of memory", op);
        return NULL;
    }
    if (b->alloc(device, nbytes, &s->data) != MPR_OK) {
        mpri_small_free(s, sizeof *s);
        return NULL;
    }
    s->nbytes = nbytes;
    s->device = device;
    s->free_data = b->free;
    atomic_init(&s->refcount, 1);
    atomic_init(&s->version, 0);
    return s;
}
