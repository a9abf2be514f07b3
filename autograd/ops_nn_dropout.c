/* ops_nn_dropout.c — inverted dropout: y = x * mask, mask[i] = 0 with
 * probability p and 1/(1-p) otherwise; the gradient is gy * mask (the
 * recorded op is mul, which saves the mask).
 *
 * Randomness: one 64-bit draw from the caller's generator (or the default
 * one) seeds a local splitmix64 stream that fills the whole mask, so a mask
 * costs one generator call (one mutex round trip on the default generator)
 * and the same seed gives the same masks on every run. Each 64-bit output
 * decides two elements (32 bits each). In eval mode or with p == 0 the input
 * is returned as is (a new reference), like torch.nn.functional.dropout.
 * For an input on a CUDA device the mask is drawn the same way on the host
 * and copied to the device, so a seed gives the same mask on either. */
#include <math.h>

#include "mpri_args.h"
#include "mpri_nn_ops.h"

static inline uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

mpr_tensor_t *mpr_dropout(mpr_tensor_t *x, double p, bool training, mpr_generator_t *gen) {
    MPRI_OP_INPUT(x);
    if (!x) return NULL;
    const char *op = "dropout";
    if (mpri_check_float(op, x) != MPR_OK) return NULL;
    if (!(p >= 0.0 && p <= 1.0)) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "dropout: probability must be in [0, 1], got %g", p);
        return NULL;
    }
    if (!training || p == 0.0) return mpri_result(mpr_tensor_retain(x));
    mpr_tensor_t *mask = mpr_tensor_empty(x->dtype, x->ndim, x->shape);
    if (!mask) return NULL;
    int64_t n = mpr_tensor_numel(x);
    uint64_t state = mpr_generator_next_u64(gen);
    /* keep when the 32-bit draw u >= p * 2^32 (so P(drop) = p up to 2^-32) */
    double tf = ldexp(p, 32);
    uint64_t thresh = tf >= 4294967296.0 ? UINT64_C(4294967296) : (uint64_t)tf;
    double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
    if (x->dtype == MPR_F32) {
        float *m = mpr_tensor_data(mask), s = (float)scale;
        for (int64_t i = 0; i < n; i += 2) {
            uint64_t r = splitmix64(&state);
            m[i] = (r & 0xffffffffu) >= thresh ? s : 0.0f;
            if (i + 1 < n) m[i + 1] = (r >> 32) >= thresh ? s : 0.0f;
        }
    } else {
        double *m = mpr_tensor_data(mask);
        for (int64_t i = 0; i < n; i += 2) {
            uint64_t r = splitmix64(&state);
            m[i] = (r & 0xffffffffu) >= thresh ? scale : 0.0;
            if (i + 1 < n) m[i + 1] = (r >> 32) >= thresh ? scale : 0.0;
        }
    }
    int device = x->storage->device;
    if (device >= 0) {
        mpr_tensor_t *on = mpri_empty_on(device, mask->dtype, mask->ndim, mask->shape);
        if (on && mpri_backend_transfer(op, mpr_tensor_data(on), device, mpr_tensor_data(mask), -1,
                                        (size_t)n * mpr_dtype_size(mask->dtype)) != MPR_OK) {
            mpr_tensor_release(on);
            on = NULL;
        }
        mpr_tensor_release(mask);
        if (!on) return NULL;
        mask = on;
    }
    mpr_tensor_t *y = mpr_mul(x, mask);
    mpr_tensor_release(mask);
    return y;
}
