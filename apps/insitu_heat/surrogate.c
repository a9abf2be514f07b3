/* apps/insitu_heat/surrogate.c — the surrogate model (see surrogate.h). */
#include "surrogate.h"

#include <math.h>

const char *const surrogate_module_prefix[SURROGATE_MODULES] = {"model.stencil.", "model.hidden.", "model.out."};

mpr_err_t surrogate_init(surrogate_t *m, int channels, mpr_generator_t *gen) {
    static const float p[3][3] = {{0, 1, 0}, {-0.5f, 0, 0.5f}, {1, -2, 1}}; /* value, d/dx, d2/dx2 */
    float w[9][3][3];
    for (int a = 0; a < 3; a++) /* filter 3a + b: p[a] along rows (y) times p[b] along columns (x) */
        for (int b = 0; b < 3; b++)
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 3; j++) w[3 * a + b][i][j] = p[a][i] * p[b][j];
    m->moments = mpr_from_buffer(MPR_F32, MPR_SHAPE(9, 1, 3, 3), w);
    m->stencil = mpr_conv2d_create(9, 1, 1, 1, 1, 0, true, MPR_F32, gen);
    m->hidden = mpr_conv2d_create(1, channels, 1, 1, 1, 0, true, MPR_F32, gen);
    m->out = mpr_conv2d_create(channels, 1, 1, 1, 1, 0, true, MPR_F32, gen);
    return m->moments && m->stencil && m->hidden && m->out ? MPR_OK : mpr_last_error_code();
}

void surrogate_destroy(surrogate_t *m) {
    mpr_tensor_release(m->moments);
    mpr_tensor_release(m->inv_scale);
    mpr_module_destroy(m->stencil);
    mpr_module_destroy(m->hidden);
    mpr_module_destroy(m->out);
    *m = (surrogate_t){0};
}

mpr_module_t *surrogate_module(surrogate_t *m, int k) { return k == 0 ? m->stencil : k == 1 ? m->hidden : m->out; }

void surrogate_parameters(surrogate_t *m, mpr_tensor_t **p) {
    int n = 0;
    for (int k = 0; k < SURROGATE_MODULES; k++)
        for (int i = 0; i < mpr_module_num_parameters(surrogate_module(m, k)) && n < SURROGATE_PARAMS; i++)
            p[n++] = mpr_module_parameter(surrogate_module(m, k), i, NULL);
}

mpr_tensor_t *surrogate_subsample(mpr_tensor_t *t, int stride) {
    int n = mpr_tensor_ndim(t);
    if (stride == 1 || n < 2) return t;
    return mpr_slice(mpr_slice(t, n - 2, 0, mpr_tensor_shape(t)[n - 2], stride), n - 1, 0, mpr_tensor_shape(t)[n - 1],
                     stride);
}

mpr_err_t surrogate_set_scales(surrogate_t *m, mpr_tensor_t *x, mpr_tensor_t *y, int stride, double *target_scale) {
    int64_t h = mpr_tensor_shape(y)[0], w = mpr_tensor_shape(y)[1];
    double ms = 0;
    mpr_scope_begin();
    mpr_tensor_t *inc = surrogate_subsample(mpr_sub(y, mpr_narrow(mpr_narrow(x, 0, 1, h), 1, 1, w)), stride);
    mpr_err_t e = mpr_item(mpr_mean(mpr_mul(inc, inc)), &ms);
    if (!e) { /* per moment: 1 / RMS over the (subsampled) sample */
        mpr_tensor_t *f = mpr_conv2d(mpr_unsqueeze(mpr_unsqueeze(x, 0), 0), m->moments, NULL, stride, stride, 0, 0);
        mpr_tensor_t *inv =
            mpr_pow(mpr_add_scalar(mpr_mean_dims(mpr_mul(f, f), 3, (int[]){0, 2, 3}, true), 1e-20), -0.5);
        if (inv) {
            mpr_tensor_release(m->inv_scale);
            m->inv_scale = mpr_scope_keep(inv);
        } else {
            e = mpr_last_error_code();
        }
    }
    mpr_scope_end();
    *target_scale = ms > 0 ? sqrt(ms) : 1.0;
    return e;
}

/* A 1x1 convolution module applied with clones of its parameters. */
static mpr_tensor_t *conv_snapshot(mpr_module_t *conv, mpr_tensor_t *x) {
    mpr_tensor_t *w = mpr_clone(mpr_module_get_parameter(conv, "weight"));
    mpr_tensor_t *b = mpr_clone(mpr_module_get_parameter(conv, "bias"));
    return w && b ? mpr_conv2d(x, w, b, 1, 1, 0, 0) : NULL;
}

mpr_tensor_t *surrogate_forward(surrogate_t *m, mpr_tensor_t *x, int stride, bool snapshot) {
    mpr_tensor_t *f = mpr_mul(mpr_conv2d(x, m->moments, NULL, stride, stride, 0, 0), m->inv_scale);
    mpr_tensor_t *value = mpr_narrow(f, 1, 0, 1);
    if (snapshot)
        return mpr_add(conv_snapshot(m->stencil, f), conv_snapshot(m->out, mpr_tanh(conv_snapshot(m->hidden, value))));
    return mpr_add(mpr_module_forward(m->stencil, f),
                   mpr_module_forward(m->out, mpr_tanh(mpr_module_forward(m->hidden, value))));
}
