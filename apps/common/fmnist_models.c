/* fmnist_models.c — the parameter-server apps' models (fmnist_models.h),
 * built stage by stage with a generator per stage.
 *
 * Invariants: a stage's parameters depend only on (kind, stage, seed); a
 * group's children are its stages in order, so names and orders compose
 * as the header says. */
#include <string.h>

#include "app.h"
#include "fmnist_models.h"
#include "mpirpc/tensor_ops.h"

int app_fmnist_model_stages(const char *kind) {
    if (kind && strcmp(kind, "mlp") == 0) return 2;
    if (kind && strcmp(kind, "cnn") == 0) return 3;
    return 0;
}

bool app_fmnist_model_flat(const char *kind) { return kind && strcmp(kind, "mlp") == 0; }

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

static mpr_module_t *stage_create(const char *kind, int s, mpr_generator_t *g) {
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

mpr_module_t *app_fmnist_group_create(const char *kind, int first, int count, uint64_t seed) {
    int stages = app_fmnist_model_stages(kind);
    if (!stages || first < 0 || count < 1 || first + count > stages) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "fmnist model: unknown kind '%s' or bad stage range [%d, %d) (models: %s)",
                      kind ? kind : "(null)", first, first + count, APP_FMNIST_MODELS);
        return NULL;
    }
    mpr_module_t *group = mpr_sequential_create();
    for (int s = first; group && s < first + count; s++) {
        mpr_generator_t *g = mpr_generator_create(app_epoch_seed(seed, -1 - s, 0));
        mpr_module_t *stage = g ? stage_create(kind, s, g) : NULL;
        mpr_generator_destroy(g);
        if (!stage || mpr_sequential_append(group, stage) != MPR_OK) {
            mpr_module_destroy(group);
            group = NULL;
        }
    }
    return group;
}

mpr_module_t *app_fmnist_model_create(const char *kind, uint64_t seed) {
    return app_fmnist_group_create(kind, 0, app_fmnist_model_stages(kind), seed);
}

int app_fmnist_group_first(int stages, int groups, int g) { return (int)((int64_t)stages * g / groups); }
