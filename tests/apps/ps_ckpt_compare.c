/* ps_ckpt_compare.c — test tool: are the newest checkpoints of two folders
 * (apps/common app_ckpt_save) the same, bit for bit?
 *
 *   ps_ckpt_compare DIR_A DIR_B [PREFIX]
 *
 * Every tensor of A whose name starts with PREFIX (default: all) must be in
 * B with the same dtype, shape and bytes, and B must have no other such
 * tensor; the run states' steps must match too. Exit 0 if so, 1 (naming the
 * first difference and its largest element difference) if not, 2 on usage
 * or read errors. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "app.h"
#include "mpirpc/tensor_ops.h"

static size_t count_prefixed(const mpr_tensor_dict_t *d, const char *prefix) {
    size_t n = 0;
    for (size_t i = 0; i < mpr_tensor_dict_count(d); i++) n += strncmp(mpr_tensor_dict_name(d, i), prefix, strlen(prefix)) == 0;
    return n;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: %s DIR_A DIR_B [PREFIX]\n", argv[0]);
        return 2;
    }
    const char *prefix = argc == 4 ? argv[3] : "";
    mpr_tensor_dict_t *a, *b;
    app_ckpt_state_t sa, sb;
    if (app_ckpt_load_latest(argv[1], &a, &sa, NULL) || app_ckpt_load_latest(argv[2], &b, &sb, NULL)) {
        fprintf(stderr, "%s\n", mpr_last_error());
        return 2;
    }
    int rc = 0;
    size_t compared = 0;
    if (sa.step != sb.step) {
        fprintf(stderr, "steps differ: %lld vs %lld\n", (long long)sa.step, (long long)sb.step);
        rc = 1;
    }
    for (size_t i = 0; !rc && i < mpr_tensor_dict_count(a); i++) {
        const char *name = mpr_tensor_dict_name(a, i);
        if (strncmp(name, prefix, strlen(prefix)) != 0) continue;
        mpr_tensor_t *ta = mpr_tensor_dict_tensor(a, i), *tb = mpr_tensor_dict_get(b, name);
        if (!tb || mpr_tensor_dtype(ta) != mpr_tensor_dtype(tb) || mpr_tensor_numel(ta) != mpr_tensor_numel(tb)) {
            fprintf(stderr, "%s: missing in %s or another dtype/size\n", name, argv[2]);
            rc = 1;
            break;
        }
        size_t bytes = (size_t)mpr_tensor_numel(ta) * mpr_dtype_size(mpr_tensor_dtype(ta));
        if (memcmp(mpr_tensor_data(ta), mpr_tensor_data(tb), bytes) != 0) {
            double worst = 0;
            mpr_scope_begin();
            mpr_tensor_t *da = mpr_to_dtype(ta, MPR_F64), *db = mpr_to_dtype(tb, MPR_F64);
            const double *pa = mpr_tensor_data(da), *pb = mpr_tensor_data(db);
            for (int64_t k = 0; k < mpr_tensor_numel(ta); k++) worst = fmax(worst, fabs(pa[k] - pb[k]));
            mpr_scope_end();
            fprintf(stderr, "%s differs (largest element difference %.3g)\n", name, worst);
            rc = 1;
        }
        compared++;
    }
    if (!rc && count_prefixed(b, prefix) != compared) {
        fprintf(stderr, "%s has %zu tensors named %s*, %s has %zu\n", argv[2], count_prefixed(b, prefix), prefix,
                argv[1], compared);
        rc = 1;
    }
    if (!rc) printf("%zu tensors bit-identical at step %lld\n", compared, (long long)sa.step);
    mpr_tensor_dict_destroy(a);
    mpr_tensor_dict_destroy(b);
    return rc;
}
