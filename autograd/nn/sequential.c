/* sequential.c — the Sequential container: children "0", "1", ... run in
 * order.
 *
 * Invariants: forward runs inside a private scope and only the last result
 * escapes it, so the intermediate activations are owned by the graph (and
 * freed with it) whether or not the caller has a scope open; an empty
 * Sequential returns its input (a new reference), like PyTorch. */
#include <stdio.h>

#include "mpri_args.h"
#include "nn/mpri_nn.h"

static mpr_tensor_t *sequential_forward(mpr_module_t *m, mpr_tensor_t *x) {
    if (m->n_children == 0) return mpr_scope_adopt(mpr_tensor_retain(x));
    mpr_scope_begin();
    mpr_tensor_t *y = x;
    for (int i = 0; i < m->n_children && y; i++) y = mpr_module_forward(m->children[i].m, y);
    if (y) mpr_scope_escape(y);
    mpr_scope_end();
    return y;
}

static const mpri_module_vtable_t sequential_vt = {"Sequential", sequential_forward, NULL};

mpr_module_t *mpr_sequential_create(void) { return mpri_module_new(&sequential_vt); }

static bool is_sequential(const mpr_module_t *m) { return m && m->vt == &sequential_vt; }

mpr_err_t mpr_sequential_append(mpr_module_t *seq, mpr_module_t *child) {
    MPRI_ARG_NONNULL(child);
    if (!seq) {
        if (!child->parent) mpr_module_destroy(child); /* ownership is taken on failure too */
        return mpri_null_arg(__func__, "seq");
    }
    if (!is_sequential(seq)) {
        if (!child || !child->parent) mpr_module_destroy(child);
        return mpr_error_set(MPR_ERR_INVALID_ARG, "sequential_append: not a Sequential (%s)",
                             seq ? seq->vt->kind : "NULL");
    }
    char name[16];
    snprintf(name, sizeof name, "%d", seq->n_children);
    return mpri_module_add_child(seq, name, child);
}

int mpr_sequential_size(const mpr_module_t *seq) {
    MPRI_ARG_NONNULL_OR(seq, 0);
    return is_sequential(seq) ? seq->n_children : 0;
}

mpr_module_t *mpr_sequential_child(mpr_module_t *seq, int i) {
    MPRI_ARG_NONNULL_OR(seq, NULL);
    if (!is_sequential(seq) || i < 0 || i >= seq->n_children) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "sequential_child: index %d out of range", i);
        return NULL;
    }
    return seq->children[i].m;
}
