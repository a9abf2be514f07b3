/* state_io.c — optimizer state checkpoints: export to / import from a tensor
 * dict, and .safetensors files written atomically.
 *
 * Layout (names after the caller's prefix): "state.<i>.step" (int64, 0-d)
 * and "state.<i>.<slot>" (the parameter's dtype and shape, PyTorch's state
 * keys) for each parameter i that has stepped; metadata "<prefix>kind",
 * "<prefix>format" and one "<prefix><option>" per field of
 * mpr_optim_options_t ("%.17g" doubles, so they read back exactly; bools as
 * true/false).
 *
 * A DistributedOptimizer's owners each hold a slice of one parameter list;
 * the _indexed forms name local parameter i "state.<index[i]>" (its index in
 * that list of n_total) and, on import, skip the entries of other owners'
 * parameters, so the owners' exports together read like one optimizer's.
 *
 * Exported buffers are CPU tensors whatever the parameters' device (a
 * checkpoint does not depend on where it was made); import copies each
 * buffer to its parameter's device.
 *
 * Invariants: export copies (later steps do not change an exported dict);
 * import builds the complete new state aside and swaps it in only when every
 * entry checked out (kind, options, indices, keys, shapes, dtypes, a buffer
 * for every slot of every stepped parameter), so a failed import changes
 * nothing; save writes "<path>.tmp.<pid>", syncs it, then renames it over
 * `path`, so readers see the old file or the new one, never a torn one. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/mpri_kernels.h"
#include "mpirpc/cuda.h"
#include "mpirpc/tensor_ops.h"
#include "mpri_args.h"
#include "mpri_optim.h"

#define STATE_FORMAT "mpirpc-optim-state-1"

static void key(char *buf, size_t cap, const char *prefix, const char *name) {
    snprintf(buf, cap, "%s%s", prefix, name);
}

/* A new caller-owned copy of contiguous `t` on `device` (-1: CPU; never
 * handed to a scope). */
static mpr_tensor_t *copy_tensor(const mpr_tensor_t *t, int device) {
    mpr_tensor_t *c = mpr_tensor_empty_on(device, t->dtype, t->ndim, t->shape);
    size_t nbytes = (size_t)mpr_tensor_numel(t) * mpr_dtype_size(t->dtype);
    if (c && mpri_backend_transfer("optimizer state", mpr_tensor_data(c), device,
                                   mpr_tensor_data((mpr_tensor_t *)t), t->storage->device, nbytes) != MPR_OK) {
        mpr_tensor_release(c);
        c = NULL;
    }
    return c;
}

static mpr_err_t put(mpr_tensor_dict_t *d, const char *name, mpr_tensor_t *t) {
    if (!t) return mpr_last_error_code();
    mpr_err_t e = mpr_tensor_dict_set(d, name, t);
    mpr_tensor_release(t);
    return e;
}

mpr_err_t mpr_optimizer_state_export(const mpr_optimizer_t *opt, mpr_tensor_dict_t *d,
                                     const char *prefix) {
    MPRI_ARG_NONNULL(opt);
    MPRI_ARG_NONNULL(d);
    if (!opt || !d) return mpr_error_set(MPR_ERR_INVALID_ARG, "optimizer_state_export: NULL argument");
    return mpri_optimizer_state_export_indexed(opt, d, prefix, NULL);
}

mpr_err_t mpri_optimizer_state_export_indexed(const mpr_optimizer_t *opt, mpr_tensor_dict_t *d,
                                              const char *prefix, const int *index) {
    if (!prefix) prefix = "";
    const mpri_optimizer_vtable_t *vt = opt->vt;
    char k[256], v[64];
    mpr_err_t e;
    key(k, sizeof k, prefix, "kind");
    if ((e = mpr_tensor_dict_set_meta(d, k, vt->kind))) return e;
    key(k, sizeof k, prefix, "format");
    if ((e = mpr_tensor_dict_set_meta(d, k, STATE_FORMAT))) return e;
#define EXPORT_D(f)                                       \
    key(k, sizeof k, prefix, #f);                         \
    snprintf(v, sizeof v, "%.17g", opt->o.f);             \
    if ((e = mpr_tensor_dict_set_meta(d, k, v))) return e;
#define EXPORT_B(f)                                                          \
    key(k, sizeof k, prefix, #f);                                            \
    if ((e = mpr_tensor_dict_set_meta(d, k, opt->o.f ? "true" : "false"))) return e;
    MPRI_OPTIM_DOUBLES(EXPORT_D)
    MPRI_OPTIM_BOOLS(EXPORT_B)
    for (int i = 0; i < opt->n_params; i++) {
        if (opt->steps[i] == 0) continue;
        int gi = index ? index[i] : i;
        snprintf(k, sizeof k, "%sstate.%d.step", prefix, gi);
        mpr_tensor_t *st = mpr_tensor_empty(MPR_I64, 0, NULL);
        if (st) *(int64_t *)mpr_tensor_data(st) = opt->steps[i];
        if ((e = put(d, k, st))) return e;
        for (int s = 0; s < vt->n_slots; s++) {
            mpr_tensor_t *b = opt->bufs[i * vt->n_slots + s];
            if (!b) continue;
            snprintf(k, sizeof k, "%sstate.%d.%s", prefix, gi, vt->slot_names[s]);
            if ((e = put(d, k, copy_tensor(b, -1)))) return e;
        }
    }
    return MPR_OK;
}

/* Read the options from d's metadata into *o. */
static mpr_err_t import_options(const mpr_tensor_dict_t *d, const char *prefix, mpr_optim_options_t *o) {
    char k[256];
    const char *s;
#define IMPORT_D(f)                                                                              \
    key(k, sizeof k, prefix, #f);                                                                \
    if (!(s = mpr_tensor_dict_get_meta(d, k)))                                                   \
        return mpr_error_set(MPR_ERR_NOT_FOUND, "optimizer state: option '%s' missing", k);      \
    {                                                                                            \
        char *end;                                                                               \
        errno = 0;                                                                               \
        o->f = strtod(s, &end);                                                                  \
        if (end == s || *end)                                                                    \
            return mpr_error_set(MPR_ERR_DECODE, "optimizer state: option '%s' is '%s', not a number", \
                                 k, s);                                                          \
    }
#define IMPORT_B(f)                                                                               \
    key(k, sizeof k, prefix, #f);                                                                 \
    if (!(s = mpr_tensor_dict_get_meta(d, k)))                                                    \
        return mpr_error_set(MPR_ERR_NOT_FOUND, "optimizer state: option '%s' missing", k);       \
    if (strcmp(s, "true") && strcmp(s, "false"))                                                  \
        return mpr_error_set(MPR_ERR_DECODE, "optimizer state: option '%s' is '%s', not true/false", \
                             k, s);                                                               \
    o->f = strcmp(s, "true") == 0;
    MPRI_OPTIM_DOUBLES(IMPORT_D)
    MPRI_OPTIM_BOOLS(IMPORT_B)
    return MPR_OK;
}

/* Parse "<i>.<rest>" into i (0 <= i < n) and *rest. */
static bool parse_index(const char *s, int n, int *i, const char **rest) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '.' || errno || v < 0 || v >= n || s[0] == '+' || s[0] == '-') return false;
    *i = (int)v;
    *rest = end + 1;
    return true;
}

/* Put entry `name` (t) of the dict into the new state (steps, bufs); an
 * entry of a parameter outside `index` (another owner's) is skipped. */
static mpr_err_t import_entry(const mpr_optimizer_t *opt, const mpr_optim_options_t *o, const char *name,
                              const char *rel, const mpr_tensor_t *t, const int *index, int n_total,
                              int64_t *steps, mpr_tensor_t **bufs) {
    const mpri_optimizer_vtable_t *vt = opt->vt;
    int i, gi;
    const char *what;
    if (!parse_index(rel, n_total, &gi, &what))
        return mpr_error_set(MPR_ERR_INVALID_ARG,
                             "optimizer state: entry '%s' names no parameter (the optimizer has %d)",
                             name, n_total);
    for (i = 0; index && i < opt->n_params && index[i] != gi; i++) continue;
    if (!index) i = gi;
    if (i == opt->n_params) return MPR_OK; /* another owner's parameter */
    if (!mpr_tensor_is_contiguous(t))
        return mpr_error_set(MPR_ERR_INVALID_ARG, "optimizer state: '%s' must be a contiguous tensor", name);
    if (strcmp(what, "step") == 0) {
        if (t->storage->device != -1)
            return mpr_error_set(MPR_ERR_INVALID_ARG, "optimizer state: '%s' must be a CPU tensor", name);
        if (t->dtype != MPR_I64 || mpr_tensor_numel(t) != 1)
            return mpr_error_set(MPR_ERR_DTYPE, "optimizer state: '%s' must be one int64", name);
        int64_t v = *(const int64_t *)mpr_tensor_data((mpr_tensor_t *)t);
        if (v < 0) return mpr_error_set(MPR_ERR_INVALID_ARG, "optimizer state: '%s' is negative", name);
        steps[i] = v;
        return MPR_OK;
    }
    const mpr_tensor_t *p = opt->params[i];
    for (int s = 0; s < vt->n_slots; s++) {
        double init;
        if (strcmp(what, vt->slot_names[s]) != 0 || !vt->slot_used(o, s, &init)) continue;
        bool shape_ok = t->ndim == p->ndim;
        for (int dd = 0; shape_ok && dd < p->ndim; dd++) shape_ok = t->shape[dd] == p->shape[dd];
        if (t->dtype != p->dtype || !shape_ok) {
            char a[96], b[96];
            return mpr_error_set(MPR_ERR_SHAPE, "optimizer state: '%s' is %s %s but parameter %d is %s %s",
                                 name, mpr_dtype_name(t->dtype), mpr_shape_str(t->ndim, t->shape, a, sizeof a),
                                 i, mpr_dtype_name(p->dtype), mpr_shape_str(p->ndim, p->shape, b, sizeof b));
        }
        mpr_tensor_t *c = copy_tensor(t, p->storage->device);
        if (!c) return mpr_last_error_code();
        mpr_tensor_release(bufs[i * vt->n_slots + s]);
        bufs[i * vt->n_slots + s] = c;
        return MPR_OK;
    }
    return mpr_error_set(MPR_ERR_INVALID_ARG, "optimizer state: unknown entry '%s' for %s with these options",
                         name, vt->name);
}

mpr_err_t mpr_optimizer_state_import(mpr_optimizer_t *opt, const mpr_tensor_dict_t *d, const char *prefix) {
    MPRI_ARG_NONNULL(opt);
    MPRI_ARG_NONNULL(d);
    if (!opt || !d) return mpr_error_set(MPR_ERR_INVALID_ARG, "optimizer_state_import: NULL argument");
    return mpri_optimizer_state_import_indexed(opt, d, prefix, NULL, opt->n_params);
}

mpr_err_t mpri_optimizer_state_import_indexed(mpr_optimizer_t *opt, const mpr_tensor_dict_t *d,
                                              const char *prefix, const int *index, int n_total) {
    if (!prefix) prefix = "";
    const mpri_optimizer_vtable_t *vt = opt->vt;
    char k[256];
    key(k, sizeof k, prefix, "kind");
    const char *kind = mpr_tensor_dict_get_meta(d, k);
    if (!kind)
        return mpr_error_set(MPR_ERR_NOT_FOUND, "optimizer state: no '%s' metadata (not an optimizer state)", k);
    if (strcmp(kind, vt->kind) != 0)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "optimizer state: saved by a '%s' optimizer, loading into '%s'",
                             kind, vt->kind);
    mpr_optim_options_t o;
    mpr_err_t e = import_options(d, prefix, &o);
    if (e || (e = vt->check(&o))) return e;
    size_t nb = (size_t)opt->n_params * (size_t)vt->n_slots;
    int64_t *steps = calloc((size_t)opt->n_params, sizeof *steps);
    mpr_tensor_t **bufs = calloc(nb ? nb : 1, sizeof *bufs);
    if (!steps || !bufs) e = mpr_error_set(MPR_ERR_NOMEM, "optimizer state: out of memory");
    char sp[256];
    key(sp, sizeof sp, prefix, "state.");
    size_t splen = strlen(sp);
    for (size_t j = 0; !e && j < mpr_tensor_dict_count(d); j++) {
        const char *name = mpr_tensor_dict_name(d, j);
        if (strncmp(name, sp, splen) != 0) continue; /* e.g. a model's parameters in the same file */
        e = import_entry(opt, &o, name, name + splen, mpr_tensor_dict_tensor(d, j), index, n_total, steps, bufs);
    }
    for (int i = 0; !e && i < opt->n_params; i++) {
        for (int s = 0; s < vt->n_slots; s++) {
            double init;
            if (!vt->slot_used(&o, s, &init)) continue;
            bool have = bufs[i * vt->n_slots + s] != NULL;
            if (steps[i] > 0 && !have)
                e = mpr_error_set(MPR_ERR_NOT_FOUND, "optimizer state: parameter %d stepped %" PRId64
                                  " times but has no '%s'", index ? index[i] : i, steps[i], vt->slot_names[s]);
            else if (steps[i] == 0 && have)
                e = mpr_error_set(MPR_ERR_INVALID_ARG, "optimizer state: parameter %d has '%s' but no step",
                                  index ? index[i] : i, vt->slot_names[s]);
            if (e) break;
        }
    }
    if (e) {
        for (size_t j = 0; bufs && j < nb; j++) mpr_tensor_release(bufs[j]);
        free(bufs);
        free(steps);
        return e;
    }
    for (size_t j = 0; j < nb; j++) mpr_tensor_release(opt->bufs[j]);
    free(opt->bufs);
    free(opt->steps);
    opt->bufs = bufs;
    opt->steps = steps;
    opt->o = o;
    return MPR_OK;
}

mpr_err_t mpri_safetensors_save_atomic(const mpr_tensor_dict_t *d, const char *path, const char *what) {
    size_t cap = strlen(path) + 32;
    char *tmp = malloc(cap);
    if (!tmp) return mpr_error_set(MPR_ERR_NOMEM, "%s: out of memory", what);
    snprintf(tmp, cap, "%s.tmp.%ld", path, (long)getpid());
    mpr_err_t e = mpr_safetensors_save(d, tmp);
    if (!e) {
        int fd = open(tmp, O_RDONLY);
        if (fd < 0 || fsync(fd) != 0) e = mpr_error_set(MPR_ERR_IO, "%s: cannot sync '%s': %s", what, tmp, strerror(errno));
        if (fd >= 0) close(fd);
    }
    if (!e && rename(tmp, path) != 0)
        e = mpr_error_set(MPR_ERR_IO, "%s: cannot rename '%s' to '%s': %s", what, tmp, path, strerror(errno));
    if (e) unlink(tmp);
    free(tmp);
    return e;
}

mpr_err_t mpr_optimizer_state_save(const mpr_optimizer_t *opt, const char *path) {
    MPRI_ARG_NONNULL(opt);
    MPRI_ARG_NONNULL(path);
    if (!opt || !path) return mpr_error_set(MPR_ERR_INVALID_ARG, "optimizer_state_save: NULL argument");
    mpr_tensor_dict_t *d = mpr_tensor_dict_create();
    if (!d) return mpr_last_error_code();
    mpr_err_t e = mpr_optimizer_state_export(opt, d, NULL);
    if (!e) e = mpri_safetensors_save_atomic(d, path, "optimizer_state_save");
    mpr_tensor_dict_destroy(d);
    return e;
}

mpr_err_t mpr_optimizer_state_load(mpr_optimizer_t *opt, const char *path) {
    MPRI_ARG_NONNULL(opt);
    MPRI_ARG_NONNULL(path);
    if (!opt || !path) return mpr_error_set(MPR_ERR_INVALID_ARG, "optimizer_state_load: NULL argument");
    mpr_tensor_dict_t *d = mpr_safetensors_load(path);
    if (!d) return mpr_last_error_code();
    mpr_err_t e = mpr_optimizer_state_import(opt, d, NULL);
    mpr_tensor_dict_destroy(d);
    return e;
}
