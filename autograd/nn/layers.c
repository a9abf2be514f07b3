/* layers.c — the single-op nn modules: Linear, Embedding, Conv2d, Dropout,
 * MaxPool2d, ReLU, Tanh, Flatten, LogSoftmax. Each forward is one call of
 * the matching op (mpirpc/tensor_ops.h, mpirpc/nn_functional.h).
 *
 * Invariants: parameters are created at construction with PyTorch 1.13's
 * default initialization (see mpirpc/nn.h) from the given generator, in
 * PyTorch's order (weight before bias) so named_parameters() matches;
 * configuration is validated at construction, never at forward. */
#include <math.h>

#include "nn/mpri_nn.h"

/* ----------------------------------------------------------------- Linear */

static mpr_tensor_t *linear_forward(mpr_module_t *m, mpr_tensor_t *x) {
    return mpr_linear(x, mpri_module_param(m, 0), m->n_params > 1 ? mpri_module_param(m, 1) : NULL);
}
static const mpri_module_vtable_t linear_vt = {"Linear", linear_forward, NULL};

mpr_module_t *mpr_linear_create(int64_t in_features, int64_t out_features, bool bias,
                                mpr_dtype_t dtype, mpr_generator_t *gen) {
    if (mpri_module_check_dtype("Linear", dtype) != MPR_OK) return NULL;
    if (in_features < 1 || out_features < 1) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "Linear: sizes must be >= 1, got in %lld out %lld",
                      (long long)in_features, (long long)out_features);
        return NULL;
    }
    mpr_module_t *m = mpri_module_new(&linear_vt);
    if (!m) return NULL;
    double bound = 1.0 / sqrt((double)in_features); /* kaiming_uniform(a=sqrt(5)) */
    if (!mpri_module_add_param(m, "weight", dtype, 2, (int64_t[]){out_features, in_features},
                               bound, false, gen) ||
        (bias && !mpri_module_add_param(m, "bias", dtype, 1, (int64_t[]){out_features}, bound,
                                        false, gen))) {
        mpr_module_destroy(m);
        return NULL;
    }
    return m;
}

/* -------------------------------------------------------------- Embedding */

static mpr_tensor_t *embedding_forward(mpr_module_t *m, mpr_tensor_t *x) {
    return mpr_embedding(mpri_module_param(m, 0), x);
}
static const mpri_module_vtable_t embedding_vt = {"Embedding", embedding_forward, NULL};

mpr_module_t *mpr_embedding_create(int64_t num_embeddings, int64_t embedding_dim,
                                   mpr_dtype_t dtype, mpr_generator_t *gen) {
    if (mpri_module_check_dtype("Embedding", dtype) != MPR_OK) return NULL;
    if (num_embeddings < 1 || embedding_dim < 1) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "Embedding: sizes must be >= 1, got %lld x %lld",
                      (long long)num_embeddings, (long long)embedding_dim);
        return NULL;
    }
    mpr_module_t *m = mpri_module_new(&embedding_vt);
    if (!m) return NULL;
    if (!mpri_module_add_param(m, "weight", dtype, 2, (int64_t[]){num_embeddings, embedding_dim},
                               1.0, true, gen)) {
        mpr_module_destroy(m);
        return NULL;
    }
    return m;
}

/* ----------------------------------------------------------------- Conv2d */

static mpr_tensor_t *conv2d_forward(mpr_module_t *m, mpr_tensor_t *x) {
    return mpr_conv2d(x, mpri_module_param(m, 0), m->n_params > 1 ? mpri_module_param(m, 1) : NULL,
                      m->cfg.conv2d.stride, m->cfg.conv2d.stride, m->cfg.conv2d.padding,
                      m->cfg.conv2d.padding);
}
static const mpri_module_vtable_t conv2d_vt = {"Conv2d", conv2d_forward, NULL};

mpr_module_t *mpr_conv2d_create(int64_t in_channels, int64_t out_channels, int64_t kh,
                                int64_t kw, int64_t stride, int64_t padding, bool bias,
                                mpr_dtype_t dtype, mpr_generator_t *gen) {
    if (mpri_module_check_dtype("Conv2d", dtype) != MPR_OK) return NULL;
    if (in_channels < 1 || out_channels < 1 || kh < 1 || kw < 1 || stride < 1 || padding < 0) {
        mpr_error_set(MPR_ERR_INVALID_ARG,
                      "Conv2d: need channels, kernel, stride >= 1 and padding >= 0, got in %lld "
                      "out %lld kernel %lldx%lld stride %lld padding %lld",
                      (long long)in_channels, (long long)out_channels, (long long)kh,
                      (long long)kw, (long long)stride, (long long)padding);
        return NULL;
    }
    mpr_module_t *m = mpri_module_new(&conv2d_vt);
    if (!m) return NULL;
    m->cfg.conv2d.stride = stride;
    m->cfg.conv2d.padding = padding;
    double bound = 1.0 / sqrt((double)(in_channels * kh * kw));
    if (!mpri_module_add_param(m, "weight", dtype, 4,
                               (int64_t[]){out_channels, in_channels, kh, kw}, bound, false, gen) ||
        (bias && !mpri_module_add_param(m, "bias", dtype, 1, (int64_t[]){out_channels}, bound,
                                        false, gen))) {
        mpr_module_destroy(m);
        return NULL;
    }
    return m;
}

/* ---------------------------------------------------------------- Dropout */

static mpr_tensor_t *dropout_forward(mpr_module_t *m, mpr_tensor_t *x) {
    return mpr_dropout(x, m->cfg.dropout.p, m->training, m->gen);
}
static const mpri_module_vtable_t dropout_vt = {"Dropout", dropout_forward, NULL};

mpr_module_t *mpr_dropout_create(double p, mpr_generator_t *gen) {
    if (!(p >= 0.0 && p < 1.0)) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "Dropout: probability must be in [0, 1), got %g", p);
        return NULL;
    }
    mpr_module_t *m = mpri_module_new(&dropout_vt);
    if (!m) return NULL;
    m->cfg.dropout.p = p;
    m->gen = gen;
    return m;
}

/* -------------------------------------------------------------- MaxPool2d */

static mpr_tensor_t *max_pool2d_forward(mpr_module_t *m, mpr_tensor_t *x) {
    return mpr_max_pool2d(x, m->cfg.max_pool2d.kernel, m->cfg.max_pool2d.kernel, m->cfg.max_pool2d.stride,
                          m->cfg.max_pool2d.stride, 0, 0);
}
static const mpri_module_vtable_t max_pool2d_vt = {"MaxPool2d", max_pool2d_forward, NULL};

mpr_module_t *mpr_max_pool2d_create(int64_t kernel, int64_t stride) {
    if (kernel < 1 || stride < 0) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "MaxPool2d: need kernel >= 1 and stride >= 0, got %lld, %lld",
                      (long long)kernel, (long long)stride);
        return NULL;
    }
    mpr_module_t *m = mpri_module_new(&max_pool2d_vt);
    if (!m) return NULL;
    m->cfg.max_pool2d.kernel = kernel;
    m->cfg.max_pool2d.stride = stride ? stride : kernel;
    return m;
}

/* ----------------------------------------------- parameterless activations */

static mpr_tensor_t *relu_forward(mpr_module_t *m, mpr_tensor_t *x) { return mpr_relu(x); }
static mpr_tensor_t *tanh_forward(mpr_module_t *m, mpr_tensor_t *x) { return mpr_tanh(x); }
static mpr_tensor_t *flatten_forward(mpr_module_t *m, mpr_tensor_t *x) {
    return mpr_flatten(x, m->cfg.flatten.start_dim, m->cfg.flatten.end_dim);
}
static mpr_tensor_t *log_softmax_forward(mpr_module_t *m, mpr_tensor_t *x) {
    return mpr_log_softmax(x, m->cfg.log_softmax.dim);
}
static const mpri_module_vtable_t relu_vt = {"ReLU", relu_forward, NULL};
static const mpri_module_vtable_t tanh_vt = {"Tanh", tanh_forward, NULL};
static const mpri_module_vtable_t flatten_vt = {"Flatten", flatten_forward, NULL};
static const mpri_module_vtable_t log_softmax_vt = {"LogSoftmax", log_softmax_forward, NULL};

mpr_module_t *mpr_relu_create(void) { return mpri_module_new(&relu_vt); }
mpr_module_t *mpr_tanh_create(void) { return mpri_module_new(&tanh_vt); }

mpr_module_t *mpr_flatten_create(int start_dim, int end_dim) {
    mpr_module_t *m = mpri_module_new(&flatten_vt);
    if (m) {
        m->cfg.flatten.start_dim = start_dim;
        m->cfg.flatten.end_dim = end_dim;
    }
    return m;
}

mpr_module_t *mpr_log_softmax_create(int dim) {
    mpr_module_t *m = mpri_module_new(&log_softmax_vt);
    if (m) m->cfg.log_softmax.dim = dim;
    return m;
}
