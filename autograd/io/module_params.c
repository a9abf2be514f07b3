/* io/module_params.c — save/load a module's named parameters as .safetensors.
 *
 * A thin layer over io/safetensors.c: the module's named_parameters() list is
 * turned into (names[], tensors[]) arrays and handed to save_list /
 * load_into, which validate everything before writing anything. */
#include <stdlib.h>

#include "mpri_args.h"
#include "mpirpc/nn.h"
#include "mpirpc/tensor_io.h"

/* The module's parameter names and tensors (borrowed) in two new arrays. */
static mpr_err_t collect(mpr_module_t *m, const char *op, int *n_out, const char ***names, mpr_tensor_t ***ts) {
    if (!m) return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: module is NULL", op);
    int n = mpr_module_num_parameters(m);
    *names = calloc((size_t)(n > 0 ? n : 1), sizeof **names);
    *ts = calloc((size_t)(n > 0 ? n : 1), sizeof **ts);
    if (!*names || !*ts) {
        free(*names);
        free(*ts);
        return mpr_error_set(MPR_ERR_NOMEM, "%s: out of memory", op);
    }
    for (int i = 0; i < n; i++) (*ts)[i] = mpr_module_parameter(m, i, &(*names)[i]);
    *n_out = n;
    return MPR_OK;
}

mpr_err_t mpr_module_save_safetensors(struct mpr_module *m, const char *path) {
    MPRI_ARG_NONNULL(m);
    MPRI_ARG_NONNULL(path);
    int n;
    const char **names;
    mpr_tensor_t **ts;
    mpr_err_t rc = collect(m, "module_save_safetensors", &n, &names, &ts);
    if (rc != MPR_OK) return rc;
    rc = mpr_safetensors_save_list(path, (size_t)n, names, ts);
    free(names);
    free(ts);
    return rc;
}

mpr_err_t mpr_module_load_safetensors(struct mpr_module *m, const char *path, bool strict) {
    MPRI_ARG_NONNULL(m);
    MPRI_ARG_NONNULL(path);
    int n;
    const char **names;
    mpr_tensor_t **ts;
    mpr_err_t rc = collect(m, "module_load_safetensors", &n, &names, &ts);
    if (rc != MPR_OK) return rc;
    rc = mpr_safetensors_load_into(path, (size_t)n, names, ts, strict);
    free(names);
    free(ts);
    return rc;
}
