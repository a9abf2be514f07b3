/* fmnist_models.c — the Fashion-MNIST models of the apps (fmnist_models.h),
 * built stage by stage with a generator per stage.
 *
 * Invariants: a stage's parameters depend only on (kind, stage, seed); a
 * group's children are its stages in order, so names and orders compose
 * as the header says. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "fmnist_models.h"
#include "mpirpc/tensor_ops.h"

#define DEEP_HIDDEN 512
#define DEEP_MIDDLE 6 /* 512-512 stages of mlp-deep */

int app_fmnist_model_stages(const char *kind) {
    if (kind && strcmp(kind, "mlp") == 0) return 2;
    if (kind && strcmp(kind, "cnn") == 0) return 3;
    if (kind && strcmp(kind, "tutorial-cnn") == 0) return 5;
    if (kind && strcmp(kind, "mlp-deep") == 0) return DEEP_MIDDLE + 2;
    return 0;
}

bool app_fmnist_model_flat(const char *kind) { return kind && (!strcmp(kind, "mlp") || !strcmp(kind, "mlp-deep")); }

int64_t app_fmnist_stage_macs(const char *kind, int s) {
    int stages = app_fmnist_model_stages(kind);
    if (s < 0 || s >= stages) return -1;
    int64_t conv3x3 = 9; /* per output element and input channel */
    if (!strcmp(kind, "mlp")) return s == 0 ? 784 * 256 : 256 * 10;
    if (!strcmp(kind, "cnn")) return s == 0 ? 16 * conv3x3 * 28 * 28 : s == 1 ? 32 * 16 * conv3x3 * 14 * 14 : 1568 * 128 + 128 * 10;
    if (!strcmp(kind, "tutorial-cnn")) {
        const int64_t macs[] = {16 * 1 * conv3x3 * 28 * 28, 32 * 16 * conv3x3 * 28 * 28, 64 * 32 * conv3x3 * 14 * 14,
                                3136 * 128, 128 * 10};
        return macs[s];
    }
    return s == 0 ? 784 * DEEP_HIDDEN : s == stages - 1 ? DEEP_HIDDEN * 10 : DEEP_HIDDEN * DEEP_HIDDEN;
}

/* Append every module of mods[n] to seq (which owns them even on failure). */
static mpr_module_t *sequence(mpr_module_t **mods, int n) {
    mpr_module_t *seq = mpr_sequential_create();
    bool ok = seq != NULL;
    for (int i = 0; i < n; i++) {
        if (!mods[i]) ok = false;
        if (ok) {
            if (mpr_sequential_append(seq, mods[i]) != MPR_OK) ok = false;
        } else {
            mpr_module_destroy(mods[i]);
        }
    }
    if (!ok) {
        mpr_module_destroy(seq);
        return NULL;
    }
    return seq;
}

static mpr_module_t *tutorial_cnn_stage(int s, mpr_generator_t *g) {
    switch (s) {
    case 0: return sequence((mpr_module_t *[]){mpr_conv2d_create(1, 16, 3, 3, 1, 1, true, MPR_F32, g), mpr_relu_create()}, 2);
    case 1:
        return sequence((mpr_module_t *[]){mpr_conv2d_create(16, 32, 3, 3, 1, 1, true, MPR_F32, g), mpr_relu_create(),
                                           mpr_max_pool2d_create(2, 2)},
                        3);
    case 2:
        return sequence((mpr_module_t *[]){mpr_conv2d_create(32, 64, 3, 3, 1, 1, true, MPR_F32, g), mpr_relu_create(),
                                           mpr_max_pool2d_create(2, 2), mpr_flatten_create(1, -1)},
                        4);
    case 3: return sequence((mpr_module_t *[]){mpr_linear_create(3136, 128, true, MPR_F32, g), mpr_relu_create()}, 2);
    default: return sequence((mpr_module_t *[]){mpr_linear_create(128, 10, true, MPR_F32, g)}, 1);
    }
}

/* A Linear whose weight is redrawn from He's normal(0, sqrt(2 / in)) (kaiming_normal_ for
 * ReLU): with PyTorch's default U(+-1/sqrt(in)) the signal shrinks about 6-fold per layer,
 * and 8 layers barely train in a short run. */
static mpr_module_t *linear_he(int64_t in, int64_t out, mpr_generator_t *g) {
    mpr_module_t *l = mpr_linear_create(in, out, true, MPR_F32, g);
    if (!l) return NULL;
    bool prev = mpr_set_grad_enabled(false);
    mpr_scope_begin();
    mpr_tensor_t *w = mpr_normal(MPR_F32, MPR_SHAPE(out, in), 0.0, sqrt(2.0 / (double)in), g);
    mpr_err_t e = w ? mpr_copy_(mpr_module_get_parameter(l, "weight"), w) : mpr_last_error_code();
    mpr_scope_end();
    mpr_set_grad_enabled(prev);
    if (e) {
        mpr_module_destroy(l);
        return NULL;
    }
    return l;
}

static mpr_module_t *mlp_deep_stage(int s, mpr_generator_t *g) {
    int64_t in = s == 0 ? 784 : DEEP_HIDDEN;
    if (s == DEEP_MIDDLE + 1) return sequence((mpr_module_t *[]){linear_he(in, 10, g)}, 1);
    return sequence((mpr_module_t *[]){linear_he(in, DEEP_HIDDEN, g), mpr_relu_create()}, 2);
}

static mpr_module_t *stage_create(const char *kind, int s, mpr_generator_t *g) {
    if (strcmp(kind, "tutorial-cnn") == 0) return tutorial_cnn_stage(s, g);
    if (strcmp(kind, "mlp-deep") == 0) return mlp_deep_stage(s, g);
    if (strcmp(kind, "mlp") == 0) {
        if (s == 0) return sequence((mpr_module_t *[]){mpr_linear_create(784, 256, true, MPR_F32, g), mpr_relu_create()}, 2);
        return sequence((mpr_module_t *[]){mpr_linear_create(256, 10, true, MPR_F32, g), mpr_log_softmax_create(1)}, 2);
    }
    if (s == 0)
        return sequence((mpr_module_t *[]){mpr_conv2d_create(1, 16, 3, 3, 1, 1, true, MPR_F32, g), mpr_relu_create(),
                                           mpr_max_pool2d_create(2, 2)},
                        3);
    if (s == 1)
        return sequence((mpr_module_t *[]){mpr_conv2d_create(16, 32, 3, 3, 1, 1, true, MPR_F32, g), mpr_relu_create(),
                                           mpr_max_pool2d_create(2, 2), mpr_flatten_create(1, -1)},
                        4);
    return sequence((mpr_module_t *[]){mpr_linear_create(32 * 7 * 7, 128, true, MPR_F32, g), mpr_relu_create(),
                                       mpr_linear_create(128, 10, true, MPR_F32, g), mpr_log_softmax_create(1)},
                    4);
}

/* Stage s, from its own generator. */
static mpr_module_t *build_stage(const char *kind, int s, uint64_t seed) {
    mpr_generator_t *g = mpr_generator_create(app_epoch_seed(seed, -1 - s, 0));
    mpr_module_t *stage = g ? stage_create(kind, s, g) : NULL;
    mpr_generator_destroy(g);
    return stage;
}

static bool check_range(const char *kind, int first, int count) {
    int stages = app_fmnist_model_stages(kind);
    if (!stages || first < 0 || count < 1 || first + count > stages) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "fmnist model: unknown kind '%s' or bad stage range [%d, %d) (models: %s)",
                      kind ? kind : "(null)", first, first + count, APP_FMNIST_ALL_MODELS);
        return false;
    }
    return true;
}

mpr_module_t *app_fmnist_group_create(const char *kind, int first, int count, uint64_t seed) {
    if (!check_range(kind, first, count)) return NULL;
    mpr_module_t *group = mpr_sequential_create();
    for (int s = first; group && s < first + count; s++) {
        mpr_module_t *stage = build_stage(kind, s, seed);
        if (!stage || mpr_sequential_append(group, stage) != MPR_OK) {
            mpr_module_destroy(group);
            group = NULL;
        }
    }
    return group;
}

/* The snapshot group's forward: stage after stage, layer after layer, with
 * Linear and Conv2d applied to clones of their parameters (the graph saves
 * the clones; gradients flow through them to the parameters). */
static mpr_tensor_t *snapshot_forward(mpr_module_t *self, mpr_tensor_t *x, void *ctx) {
    int stages = *(int *)ctx;
    mpr_scope_begin();
    mpr_tensor_t *h = x;
    for (int s = 0; h && s < stages; s++) {
        char name[16];
        snprintf(name, sizeof name, "%d", s);
        mpr_module_t *stage = mpr_module_child(self, name);
        if (!stage) {
            h = NULL;
            break;
        }
        for (int i = 0; h && i < mpr_sequential_size(stage); i++) {
            mpr_module_t *layer = mpr_sequential_child(stage, i);
            const char *kind = mpr_module_kind(layer);
            if (!strcmp(kind, "Linear") || !strcmp(kind, "Conv2d")) {
                mpr_tensor_t *w = mpr_clone(mpr_module_get_parameter(layer, "weight"));
                mpr_tensor_t *b = mpr_clone(mpr_module_get_parameter(layer, "bias"));
                h = !w || !b ? NULL : kind[0] == 'L' ? mpr_linear(h, w, b) : mpr_conv2d(h, w, b, 1, 1, 1, 1);
            } else {
                h = mpr_module_forward(layer, h);
            }
        }
    }
    if (h) mpr_scope_escape(h);
    mpr_scope_end();
    return h;
}

mpr_module_t *app_fmnist_group_create_snapshot(const char *kind, int first, int count, uint64_t seed) {
    if (!check_range(kind, first, count)) return NULL;
    int *ctx = malloc(sizeof *ctx);
    if (!ctx) {
        mpr_error_set(MPR_ERR_NOMEM, "fmnist model: out of memory");
        return NULL;
    }
    *ctx = count;
    mpr_module_t *m = mpr_module_create("FmnistSnapshotGroup", snapshot_forward, ctx, free);
    if (!m) {
        free(ctx);
        return NULL;
    }
    for (int s = 0; s < count; s++) { /* children "0", "1", ...: the names of a plain group */
        char name[16];
        snprintf(name, sizeof name, "%d", s);
        mpr_module_t *stage = build_stage(kind, first + s, seed);
        if (!stage || mpr_module_add_child(m, name, stage) != MPR_OK) {
            mpr_module_destroy(m);
            return NULL;
        }
    }
    return m;
}

mpr_module_t *app_fmnist_model_create(const char *kind, uint64_t seed) {
    return app_fmnist_group_create(kind, 0, app_fmnist_model_stages(kind), seed);
}

int app_fmnist_group_first(int stages, int groups, int g) { return (int)((int64_t)stages * g / groups); }
