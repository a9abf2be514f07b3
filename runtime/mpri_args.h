/* mpri_args.h — the one way public functions check their pointer arguments
 * (not installed).
 *
 * Every public function checks each pointer argument it needs at entry, before
 * it looks at the runtime state, so a NULL gives the same answer with or
 * without mpr_init: MPR_ERR_INVALID_ARG with the detail
 * "<function>: argument '<name>' is NULL". Functions returning a pointer
 * return NULL, getters their documented default value; both set that error.
 *
 * Tensor ops are the one exception to "set the error": a NULL input is how
 * an earlier op's failure flows through a nested expression
 * (mpr_relu(mpr_linear(x, w, b))), so MPRI_OP_INPUT keeps an error already
 * recorded on the thread and records MPR_ERR_INVALID_ARG only when there is
 * none. A returned NULL is therefore never paired with MPR_OK.
 *
 * tests/tools/gen_null_args.py generates tests/unit/test_null_args from the
 * public headers and holds every function to this contract. */
#ifndef MPRI_ARGS_H
#define MPRI_ARGS_H

#include "mpirpc/error.h"

static inline mpr_err_t mpri_null_arg(const char *fn, const char *arg) {
    return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: argument '%s' is NULL", fn, arg);
}

/* In a function returning mpr_err_t. */
#define MPRI_ARG_NONNULL(arg)                                                 \
    do {                                                                      \
        if (!(arg)) return mpri_null_arg(__func__, #arg);                    \
    } while (0)

/* In a function returning something else: return `ret` after setting the error. */
#define MPRI_ARG_NONNULL_OR(arg, ret)                                         \
    do {                                                                      \
        if (!(arg)) {                                                         \
            mpri_null_arg(__func__, #arg);                                    \
            return ret;                                                       \
        }                                                                     \
    } while (0)

/* In a tensor op: NULL input -> NULL result, keeping an earlier error. */
#define MPRI_OP_INPUT(arg)                                                    \
    do {                                                                      \
        if (!(arg)) {                                                         \
            if (mpr_last_error_code() == MPR_OK) mpri_null_arg(__func__, #arg); \
            return NULL;                                                      \
        }                                                                     \
    } while (0)

#endif
