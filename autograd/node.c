/* node.c — graph nodes: creation, recording an op's node on its outputs,
 * saved tensors with version checks, and reference-counted lifetime.
 *
 * Invariants: a node holds one reference to every node on its `next` edges and
 * one alias (no autograd meta) per saved tensor, so the graph is a DAG of
 * strong references with no cycles: it dies when its last output tensor dies.
 * Release is iterative (an explicit stack), so a 100k-op chain cannot
 * overflow the C stack. Edge and meta indices are set by this library's own
 * op code, so an index out of range, an edge to an output its node does not
 * have, or a reference count going below zero is a bug: MPRI_ASSERT. */
#include <stdlib.h>
#include <string.h>

#include "mpri_assert.h"
#include "mpri_autograd.h"
#include "mpri_deferred.h"
#include "mpri_small_alloc.h"

static atomic_ullong node_seq;
static atomic_long live_nodes; /* created and not yet freed (leak checks) */
/* Bytes of the storages with saved_refs > 0 (mpr_autograd_saved_bytes): a
 * storage's bytes are added when its count goes 0 -> 1, taken off at 1 -> 0. */
static atomic_llong saved_bytes;

int64_t mpr_autograd_saved_bytes(void) { return (int64_t)atomic_load(&saved_bytes); }

static void saved_count(mpri_storage_t *s, long delta) {
    long before = atomic_fetch_add_explicit(&s->saved_refs, delta, memory_order_acq_rel);
    MPRI_ASSERT(before + delta >= 0, "a storage's saved count goes below zero");
    if (before == 0 && delta > 0) atomic_fetch_add_explicit(&saved_bytes, (long long)s->nbytes, memory_order_relaxed);
    if (before == 1 && delta < 0) atomic_fetch_sub_explicit(&saved_bytes, (long long)s->nbytes, memory_order_relaxed);
}

int64_t mpri_node_live_count(void) {
    mpri_deferred_flush(); /* releases put off to an idle moment are not live objects */
    return atomic_load(&live_nodes);
}

/* A node's one block: the struct, then its metadata and edges. */
static size_t node_bytes(int n_next, int n_outputs) {
    return sizeof(mpri_node_t) + (size_t)n_next * (sizeof(mpri_edge_t) + sizeof(mpri_tensor_meta_t)) +
           (size_t)n_outputs * sizeof(mpri_tensor_meta_t);
}

mpri_node_t *mpri_node_create(const mpri_op_def_t *def, int n_next, int n_outputs) {
    if (n_next < 0 || n_outputs < 1) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "%s: node with %d inputs and %d outputs",
                      def ? def->name : "?", n_next, n_outputs);
        return NULL;
    }
    mpri_node_t *n = mpri_small_calloc(node_bytes(n_next, n_outputs));
    if (!n) {
        mpr_error_set(MPR_ERR_NOMEM, "%s: out of memory for a graph node", def ? def->name : "?");
        return NULL;
    }
    char *p = (char *)(n + 1);
    n->in_meta = (mpri_tensor_meta_t *)p;
    p += (size_t)n_next * sizeof(mpri_tensor_meta_t);
    n->out_meta = (mpri_tensor_meta_t *)p;
    p += (size_t)n_outputs * sizeof(mpri_tensor_meta_t);
    n->next = (mpri_edge_t *)p;
    for (int i = 0; i < n_next; i++) n->in_meta[i].ndim = -1;
    for (int i = 0; i < n_outputs; i++) n->out_meta[i].ndim = -1;
    atomic_init(&n->refcount, 1);
    n->def = def;
    n->n_next = n_next;
    n->n_outputs = n_outputs;
    n->seq = atomic_fetch_add(&node_seq, 1);
    atomic_fetch_add_explicit(&live_nodes, 1, memory_order_relaxed);
    return n;
}

mpri_node_t *mpri_node_retain(mpri_node_t *n) {
    if (n) atomic_fetch_add_explicit(&n->refcount, 1, memory_order_relaxed);
    return n;
}

void mpri_node_release_saved(mpri_node_t *n) {
    for (int i = 0; i < n->n_saved; i++) {
        if (n->saved[i].counted) saved_count(n->saved[i].t->storage, -1);
        n->saved[i].counted = false;
        mpr_tensor_release(n->saved[i].t);
        n->saved[i].t = NULL;
    }
    n->n_saved = 0;
}

void mpri_node_release(mpri_node_t *n) {
    if (!n) return;
    mpri_node_t *small[64];
    mpri_node_t **stack = small;
    int64_t sp = 0, cap = 64;
    stack[sp++] = n;
    while (sp > 0) {
        mpri_node_t *x = stack[--sp];
        long before = atomic_fetch_sub_explicit(&x->refcount, 1, memory_order_acq_rel);
        MPRI_ASSERT(before > 0, "graph node released more often than retained");
        if (before != 1) continue;
        mpri_node_release_saved(x);
        if (x->ctx && x->def && x->def->release_ctx) x->def->release_ctx(x->ctx);
        for (int i = 0; i < x->n_next; i++) {
            if (!x->next[i].node) continue;
            if (sp == cap) {
                mpri_node_t **ns = malloc((size_t)cap * 2 * sizeof *ns);
                MPRI_ASSERT(ns != NULL, "out of memory while freeing a graph (its release stack)");
                memcpy(ns, stack, (size_t)sp * sizeof *ns);
                if (stack != small) free(stack);
                stack = ns;
                cap *= 2;
            }
            stack[sp++] = x->next[i].node;
        }
        mpri_small_free(x, node_bytes(x->n_next, x->n_outputs));
        atomic_fetch_sub_explicit(&live_nodes, 1, memory_order_relaxed);
    }
    if (stack != small) free(stack);
}

void mpri_node_set_next(mpri_node_t *n, int i, mpri_edge_t edge) {
    MPRI_ASSERT(i >= 0 && i < n->n_next, "mpri_node_set_next: edge index out of range");
    MPRI_ASSERT(!edge.node || (edge.output_nr >= 0 && edge.output_nr < edge.node->n_outputs),
                "mpri_node_set_next: edge to an output the target node does not have");
    mpri_node_retain(edge.node);
    mpri_node_release(n->next[i].node);
    n->next[i] = edge;
}

static void meta_of(const mpr_tensor_t *t, mpri_tensor_meta_t *m) {
    m->dtype = t->dtype;
    m->device = t->storage->device;
    m->ndim = t->ndim;
    memcpy(m->shape, t->shape, sizeof m->shape);
}

void mpri_node_set_input_meta(mpri_node_t *n, int i, const mpr_tensor_t *t) {
    MPRI_ASSERT(i >= 0 && i < n->n_next, "mpri_node_set_input_meta: input index out of range");
    meta_of(t, &n->in_meta[i]);
}
void mpri_node_set_output_meta(mpri_node_t *n, int k, const mpr_tensor_t *t) {
    MPRI_ASSERT(k >= 0 && k < n->n_outputs, "mpri_node_set_output_meta: output index out of range");
    meta_of(t, &n->out_meta[k]);
}

bool mpri_any_requires_grad(int n, mpr_tensor_t *const *inputs) {
    if (!mpr_grad_enabled()) return false;
    for (int i = 0; i < n; i++)
        if (inputs[i] && mpr_requires_grad(inputs[i])) return true;
    return false;
}

mpri_node_t *mpri_record_multi(const mpri_op_def_t *def, int n_inputs, mpr_tensor_t *const *inputs,
                               int n_outputs, mpr_tensor_t *const *outputs) {
    if (!mpri_any_requires_grad(n_inputs, inputs)) return NULL;
    mpri_node_t *n = mpri_node_create(def, n_inputs, n_outputs);
    if (!n) return NULL;
    for (int i = 0; i < n_inputs; i++) {
        if (!inputs[i]) continue;
        meta_of(inputs[i], &n->in_meta[i]);
        mpri_edge_t e = mpri_tensor_edge(inputs[i]);
        if (e.node) n->next[i] = (mpri_edge_t){mpri_node_retain(e.node), e.output_nr};
    }
    for (int k = 0; k < n_outputs; k++) {
        meta_of(outputs[k], &n->out_meta[k]);
        if (mpri_tensor_set_grad_fn(outputs[k], n, k) != MPR_OK) {
            for (int j = 0; j < k; j++) mpri_tensor_set_grad_fn(outputs[j], NULL, 0);
            mpri_node_release(n);
            return NULL;
        }
    }
    mpri_node_release(n); /* the outputs own it now */
    return n;
}

mpri_node_t *mpri_record(const mpri_op_def_t *def, int n_inputs, mpr_tensor_t *const *inputs,
                         mpr_tensor_t *out) {
    return mpri_record_multi(def, n_inputs, inputs, 1, &out);
}

int mpri_node_save(mpri_node_t *n, mpr_tensor_t *t) {
    if (!n || !t) return -1;
    if (n->n_saved == MPRI_NODE_MAX_SAVED) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "%s: more than %d saved tensors", n->def->name,
                      MPRI_NODE_MAX_SAVED);
        return -1;
    }
    mpr_tensor_t *a = mpri_alias(t);
    if (!a) return -1;
    int i = n->n_saved++;
    n->saved[i].t = a;
    n->saved[i].version = atomic_load(&t->storage->version);
    n->saved[i].counted = !(mpr_is_leaf(t) && mpr_requires_grad(t)); /* an activation, not a parameter */
    if (n->saved[i].counted) saved_count(a->storage, +1);
    n->has_saved = true;
    return i;
}

mpr_tensor_t *mpri_node_saved(mpri_node_t *n, int i) {
    if (n->released || i < 0 || i >= n->n_saved || !n->saved[i].t) {
        mpr_error_set(MPR_ERR_STATE,
                      "%s: trying to backward through the graph a second time (its saved tensors "
                      "were freed by the first backward); pass retain_graph=true to the first",
                      n->def->name);
        return NULL;
    }
    mpr_tensor_t *t = n->saved[i].t;
    unsigned long v = atomic_load(&t->storage->version);
    if (v != n->saved[i].version) {
        char sb[96];
        mpr_error_set(MPR_ERR_STATE,
                      "%s: a tensor of shape %s %s saved for backward was modified by an in-place "
                      "operation (version %lu, expected %lu)",
                      n->def->name, mpr_shape_str(t->ndim, t->shape, sb, sizeof sb),
                      mpr_dtype_name(t->dtype), v, n->saved[i].version);
        return NULL;
    }
    return t;
}

bool mpri_node_needs_grad(const mpri_node_t *n, int i) {
    return i >= 0 && i < n->n_next && n->next[i].node != NULL;
}
