/* optim_test_util.h — shared by the optimizer tests that read
 * tests/data/ref_optim.safetensors (see tests/ref/gen_optim_refs.py): loading
 * it, the case list, option specs ("kind=adam,lr=0.01,amsgrad=1") parsed into
 * mpr_optim_options_t, fresh copies of the initial parameters, the gradients
 * of step s. Include after <cmocka.h>; tensors returned are caller-owned. */
#ifndef OPTIM_TEST_UTIL_H
#define OPTIM_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpirpc/optim.h"
#include "mpirpc/tensor_io.h"
#include "mpirpc/tensor_ops.h"

#define OT_NP 2     /* parameters per case */
#define OT_STEPS 10 /* steps per case */

static inline mpr_tensor_dict_t *ot_load_ref(void) {
    const char *dir = getenv("MPIRPC_TEST_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/ref_optim.safetensors", dir ? dir : "tests/data");
    mpr_tensor_dict_t *d = mpr_safetensors_load(path);
    if (!d) fprintf(stderr, "cannot load %s: %s\n", path, mpr_last_error());
    return d;
}

/* Element i of contiguous f32/f64 t as a double. */
static inline double ot_at(mpr_tensor_t *t, int64_t i) {
    return mpr_tensor_dtype(t) == MPR_F32 ? ((const float *)mpr_tensor_data(t))[i]
                               : ((const double *)mpr_tensor_data(t))[i];
}

/* The value of `name=` in a spec (0 when absent). */
static inline double ot_spec_num(const char *spec, const char *name) {
    size_t n = strlen(name);
    for (const char *s = spec; s && *s; s = strchr(s, ',') ? strchr(s, ',') + 1 : NULL)
        if (strncmp(s, name, n) == 0 && s[n] == '=') return strtod(s + n + 1, NULL);
    return 0;
}

/* kind and options (the kind's defaults, then the spec's fields). */
static inline void ot_parse_options(const char *spec, char *kind, size_t cap, mpr_optim_options_t *o) {
    assert_true(strncmp(spec, "kind=", 5) == 0);
    size_t k = strcspn(spec + 5, ",");
    assert_true(k < cap);
    memcpy(kind, spec + 5, k);
    kind[k] = '\0';
    mpr_optim_options_default(kind, o);
#define OT_D(f) \
    if (strstr(spec, #f "=")) o->f = ot_spec_num(spec, #f);
#define OT_B(f) \
    if (strstr(spec, #f "=")) o->f = ot_spec_num(spec, #f) != 0;
    OT_D(lr) OT_D(momentum) OT_D(dampening) OT_D(weight_decay) OT_D(beta1) OT_D(beta2) OT_D(eps) OT_D(alpha)
    OT_D(lr_decay) OT_D(initial_accumulator_value) OT_B(nesterov) OT_B(amsgrad) OT_B(centered) OT_B(maximize)
#undef OT_D
#undef OT_B
}

/* Case `cs`'s kind and options (its "case.<cs>" metadata spec). */
static inline void ot_case_options(mpr_tensor_dict_t *d, const char *cs, char *kind, size_t cap,
                                   mpr_optim_options_t *o) {
    char key[160];
    snprintf(key, sizeof key, "case.%s", cs);
    const char *spec = mpr_tensor_dict_get_meta(d, key);
    assert_non_null(spec);
    ot_parse_options(spec, kind, cap, o);
}

/* A copy of tensor `name` (rows [row, row + 1) of its first dimension when
 * row >= 0), caller-owned. */
static inline mpr_tensor_t *ot_copy(mpr_tensor_dict_t *d, const char *name, int row) {
    mpr_tensor_t *src = mpr_tensor_dict_get(d, name);
    assert_non_null(src);
    int ndim = mpr_tensor_ndim(src) - (row >= 0);
    const int64_t *shape = mpr_tensor_shape(src) + (row >= 0);
    mpr_tensor_t *t = mpr_tensor_empty(mpr_tensor_dtype(src), ndim, shape);
    assert_non_null(t);
    size_t bytes = (size_t)mpr_tensor_numel(t) * mpr_dtype_size(mpr_tensor_dtype(t));
    memcpy(mpr_tensor_data(t), (char *)mpr_tensor_data(src) + (row >= 0 ? (size_t)row * bytes : 0), bytes);
    return t;
}

/* Fresh leaf parameters (requires_grad) from init.<dt>.p<j>. */
static inline void ot_init_params(mpr_tensor_dict_t *d, const char *dt, mpr_tensor_t **ps) {
    char key[64];
    for (int j = 0; j < OT_NP; j++) {
        snprintf(key, sizeof key, "init.%s.p%d", dt, j);
        ps[j] = ot_copy(d, key, -1);
        assert_int_equal(mpr_set_requires_grad(ps[j], true), MPR_OK);
    }
}

/* The gradients of step s (0-based). */
static inline void ot_grads_at(mpr_tensor_dict_t *d, const char *dt, int s, mpr_tensor_t **gs) {
    char key[64];
    for (int j = 0; j < OT_NP; j++) {
        snprintf(key, sizeof key, "grads.%s.p%d", dt, j);
        gs[j] = ot_copy(d, key, s);
    }
}

/* The case names (borrowed from d: "<case>" of every "<case>.f32.p0" entry,
 * written into a static buffer). */
static inline int ot_case_names(mpr_tensor_dict_t *d, const char **out, int cap) {
    static char names[64][64];
    int n = 0;
    for (size_t i = 0; i < mpr_tensor_dict_count(d) && n < cap && n < 64; i++) {
        const char *nm = mpr_tensor_dict_name(d, i);
        size_t len = strlen(nm);
        if (len < 8 || strcmp(nm + len - 7, ".f32.p0") != 0 || strncmp(nm, "init.", 5) == 0 ||
            strncmp(nm, "grads.", 6) == 0 || len - 7 >= sizeof names[0])
            continue;
        memcpy(names[n], nm, len - 7);
        names[n][len - 7] = '\0';
        out[n] = names[n];
        n++;
    }
    return n;
}

#endif
