/* fmnist_models.c — the parameter-server apps' models (fmnist_models.h),
 * built stage by stage with a generator per stage.
 *
 * Invariants: a stage's parameters depend only on (kind, stage, seed); a
 * group's children are its stages in order, so names and orders compose
 * as the header says. */
#include <stdio.h>
#include <stdlib.h>
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
                      kind ? kind : "(null)", first, first + count, APP_FMNIST_MODELS);
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
