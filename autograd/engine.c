/* engine.c — the backward engine: graph tasks with dependency counting,
 * gradient buffers, leaf accumulation or custom sinks, and mpr_backward.
 *
 * STATE MACHINE of a graph task (task->phase) and of its entries:
 *
 *   task:  OPEN --add_roots--> OPEN --run--> RUNNING --drained--> OPEN
 *                                               |
 *                                               +--a node failed--> FAILED
 *          OPEN: roots may be added and fed; nodes waiting on dependencies
 *                stay pending (a dist backward pauses here between remote
 *                gradients). RUNNING: inside mpri_graph_task_run, draining
 *                the ready queue; never re-entered (one driver per task).
 *                FAILED: a backward, sink or accumulation returned an error;
 *                the ready queue was dropped, so run() is refused from then on
 *                (MPR_ERR_STATE) and only destroy() is allowed.
 *
 *   entry: WAITING (deps > 0, !ran) --last dependency delivered--> READY
 *          (deps == 0, !ran, in the ready queue exactly once) --run_node-->
 *          RAN (ran, deps == 0, every buffer NULL). Nothing leaves RAN.
 *
 * Invariants (checked by check_task() at every task transition in Debug and
 * sanitizer builds, and cheaply per entry with MPRI_ASSERT in every build):
 *  - every node reachable from the added roots has one entry, found through
 *    the hash table; `deps` is the number of subgraph edges (plus virtual
 *    root edges, counted again in `root_deps`) pointing at it that have not
 *    delivered yet; 0 <= root_deps <= deps; a node runs exactly once;
 *  - outside FAILED, an entry is in the ready queue iff deps == 0 and !ran,
 *    and the queue is empty whenever the task is OPEN;
 *  - entry buffers hold one owned reference per output slot (NULL = no
 *    gradient yet); a node whose buffers are all NULL when it becomes ready
 *    runs as a no-op that only releases its children's dependencies;
 *  - backward functions run with grad mode off inside an engine scope, and
 *    every gradient they return is checked against the input's dtype/shape
 *    recorded at forward time.
 * The task owns a reference to each entry's node, so the graph cannot die
 * under a running (or paused, for dist autograd) backward.
 *
 * Errors vs asserts: what a caller can get wrong (feeding an edge that is not
 * an outstanding root, a gradient of the wrong shape, backward twice without
 * retain_graph, running a failed task) is a returned error; a broken count or
 * queue is a bug in this file and stops at an MPRI_ASSERT. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_args.h"
#include "kernels/mpri_kernels.h"
#include "mpri_assert.h"
#include "mpri_engine.h"
#include "mpri_small_alloc.h"

typedef struct entry {
    mpri_node_t *node;    /* owned reference */
    int deps;             /* undelivered edges into the node, root edges included */
    int root_deps;        /* of which virtual root edges (fed by run()) */
    bool ran;
    mpr_tensor_t **buf;   /* [node->n_outputs], owned references */
} entry_t;

typedef enum { TASK_OPEN, TASK_RUNNING, TASK_FAILED } task_phase_t;

/* A small backward (a dist piece of a few nodes, most local ones) keeps its
 * arrays inside the task: no allocation but the task's own. Larger graphs
 * move them to small blocks (mpri_small_alloc.h) as they grow; an array is
 * freed only when it is not one of the task's own (inline_array). */
#define INLINE_ENTRIES 8
#define INLINE_SLOTS 16 /* power of two, 2 x INLINE_ENTRIES: the load stays at most 1/2 */
#define INLINE_READY 8
#define INLINE_BUFS 16  /* output slots of the inline entries, handed out in order */

struct mpri_graph_task {
    mpri_engine_opts_t opts;
    task_phase_t phase;
    entry_t *entries;
    int n, cap;
    int *slots;           /* open addressing: index into entries, -1 empty */
    int nslots;           /* power of two */
    int *ready;
    int nready, capready;
    int nbufs_inline;     /* of bufs_inline handed out */
    entry_t entries_inline[INLINE_ENTRIES];
    int slots_inline[INLINE_SLOTS];
    int ready_inline[INLINE_READY];
    mpr_tensor_t *bufs_inline[INLINE_BUFS];
};

_Static_assert(sizeof(struct mpri_graph_task) <= MPRI_SMALL_MAX, "a graph task stays one cached small block");

/* An array of the task that lives in the task itself (not to be freed). */
static bool inline_array(const mpri_graph_task_t *t, const void *p) {
    const char *c = p, *lo = (const char *)t, *hi = (const char *)(t + 1);
    return c >= lo && c < hi;
}

static uint64_t hash_ptr(const void *p) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static int lookup(const mpri_graph_task_t *t, const mpri_node_t *node) {
    if (!t->nslots) return -1;
    uint64_t mask = (uint64_t)t->nslots - 1;
    for (uint64_t h = hash_ptr(node) & mask;; h = (h + 1) & mask) {
        int i = t->slots[h];
        if (i < 0) return -1;
        if (t->entries[i].node == node) return i;
    }
}

/* Beyond the inline arrays, a task's arrays and buffers are small blocks
 * (mpri_small_alloc.h). Grow an array of `old_cap` elements of `size` bytes,
 * `used` of them in use, to `new_cap`; NULL: out of memory (`old`
 * unchanged). An inline `old` is copied, not freed. */
static void *grow(const mpri_graph_task_t *t, void *old, int old_cap, int used, int new_cap, size_t size) {
    void *p = mpri_small_alloc((size_t)new_cap * size);
    if (!p) return NULL;
    if (old) {
        memcpy(p, old, (size_t)used * size);
        if (!inline_array(t, old)) mpri_small_free(old, (size_t)old_cap * size);
    }
    return p;
}

static mpr_err_t rehash(mpri_graph_task_t *t, int nslots) {
    int *s = nslots == INLINE_SLOTS && !t->slots ? t->slots_inline : mpri_small_alloc((size_t)nslots * sizeof *s);
    if (!s) return mpr_error_set(MPR_ERR_NOMEM, "backward: out of memory");
    for (int i = 0; i < nslots; i++) s[i] = -1;
    uint64_t mask = (uint64_t)nslots - 1;
    for (int i = 0; i < t->n; i++) {
        uint64_t h = hash_ptr(t->entries[i].node) & mask;
        while (s[h] >= 0) h = (h + 1) & mask;
        s[h] = i;
    }
    if (t->slots && !inline_array(t, t->slots)) mpri_small_free(t->slots, (size_t)t->nslots * sizeof *t->slots);
    t->slots = s;
    t->nslots = nslots;
    return MPR_OK;
}

/* Insert `node` (not present); returns its index or -1. */
static int insert(mpri_graph_task_t *t, mpri_node_t *node) {
    if ((t->n + 1) * 2 > t->nslots && rehash(t, t->nslots ? t->nslots * 2 : INLINE_SLOTS) != MPR_OK) return -1;
    if (t->n == t->cap) {
        int ncap = t->cap ? t->cap * 2 : INLINE_ENTRIES;
        entry_t *ne = t->cap ? grow(t, t->entries, t->cap, t->n, ncap, sizeof *ne) : t->entries_inline;
        if (!ne) {
            mpr_error_set(MPR_ERR_NOMEM, "backward: out of memory");
            return -1;
        }
        t->entries = ne;
        t->cap = ncap;
    }
    mpr_tensor_t **buf;
    if (t->nbufs_inline + node->n_outputs <= INLINE_BUFS) { /* zeroed with the task, never reused */
        buf = t->bufs_inline + t->nbufs_inline;
        t->nbufs_inline += node->n_outputs;
    } else {
        buf = mpri_small_calloc((size_t)node->n_outputs * sizeof *buf);
    }
    if (!buf) {
        mpr_error_set(MPR_ERR_NOMEM, "backward: out of memory");
        return -1;
    }
    int i = t->n++;
    t->entries[i] = (entry_t){mpri_node_retain(node), 0, 0, false, buf};
    uint64_t mask = (uint64_t)t->nslots - 1;
    uint64_t h = hash_ptr(node) & mask;
    while (t->slots[h] >= 0) h = (h + 1) & mask;
    t->slots[h] = i;
    return i;
}

/* The whole-task state checker (Debug/sanitizer builds; O(entries)). Runs at
 * the task's transitions: after add_roots, on entry to and exit from run. */
static void check_task(const mpri_graph_task_t *t) {
#if MPRI_DEBUG_CHECKS
    MPRI_ASSERT(t->n <= t->cap && t->nready <= t->n, "graph task: entry or ready counts out of range");
    MPRI_ASSERT(t->phase != TASK_OPEN || t->nready == 0, "graph task: ready nodes left while not running");
    int used = 0;
    for (int h = 0; h < t->nslots; h++) used += t->slots[h] >= 0;
    MPRI_ASSERT(used == t->n, "graph task: hash table and entries disagree");
    int *queued = calloc((size_t)t->n + 1, sizeof *queued);
    MPRI_ASSERT(queued != NULL, "graph task checker: out of memory");
    for (int q = 0; q < t->nready; q++) {
        int i = t->ready[q];
        MPRI_ASSERT(i >= 0 && i < t->n, "graph task: ready queue holds a bad index");
        MPRI_ASSERT(++queued[i] == 1, "graph task: node queued twice");
    }
    for (int i = 0; i < t->n; i++) {
        const entry_t *e = &t->entries[i];
        MPRI_ASSERT(lookup(t, e->node) == i, "graph task: entry not found through the hash table");
        MPRI_ASSERT(e->root_deps >= 0 && e->root_deps <= e->deps, "graph task: dependency counts out of range");
        if (e->ran) {
            MPRI_ASSERT(e->deps == 0 && !queued[i], "graph task: a node that ran still has dependencies");
            for (int k = 0; k < e->node->n_outputs; k++)
                MPRI_ASSERT(e->buf[k] == NULL, "graph task: a node that ran still holds a gradient");
        } else if (t->phase != TASK_FAILED) {
            MPRI_ASSERT((e->deps == 0) == (queued[i] == 1), "graph task: ready node not queued (or the reverse)");
        }
    }
    free(queued);
#else
    (void)t;
#endif
}

mpri_graph_task_t *mpri_graph_task_create(const mpri_engine_opts_t *opts) {
    mpri_graph_task_t *t = mpri_small_calloc(sizeof *t);
    if (!t) {
        mpr_error_set(MPR_ERR_NOMEM, "backward: out of memory");
        return NULL;
    }
    if (opts) t->opts = *opts;
    return t;
}

void mpri_graph_task_destroy(mpri_graph_task_t *t) {
    if (!t) return;
    for (int i = 0; i < t->n; i++) {
        entry_t *e = &t->entries[i];
        for (int k = 0; k < e->node->n_outputs; k++) mpr_tensor_release(e->buf[k]);
        if (!inline_array(t, e->buf)) mpri_small_free(e->buf, (size_t)e->node->n_outputs * sizeof *e->buf);
        mpri_node_release(e->node);
    }
    if (t->entries && !inline_array(t, t->entries)) mpri_small_free(t->entries, (size_t)t->cap * sizeof *t->entries);
    if (t->slots && !inline_array(t, t->slots)) mpri_small_free(t->slots, (size_t)t->nslots * sizeof *t->slots);
    if (t->ready && !inline_array(t, t->ready)) mpri_small_free(t->ready, (size_t)t->capready * sizeof *t->ready);
    mpri_small_free(t, sizeof *t);
}

static mpr_err_t already_ran(const mpri_node_t *node) {
    return mpr_error_set(MPR_ERR_STATE, "backward: a new root reaches node %s, which already ran in this task",
                         node->def->name);
}

/* The walk's stack doubled (moved to the heap from `inline_stack`); NULL
 * when out of memory, the old stack then still owned by the caller. */
static int *grow_stack(int *stack, int *inline_stack, int *cap) {
    int ncap = *cap * 2;
    int *ns = stack == inline_stack ? malloc((size_t)ncap * sizeof *ns) : realloc(stack, (size_t)ncap * sizeof *ns);
    if (!ns) return NULL;
    if (stack == inline_stack) memcpy(ns, stack, (size_t)*cap * sizeof *ns);
    *cap = ncap;
    return ns;
}

mpr_err_t mpri_graph_task_add_roots(mpri_graph_task_t *t, int n, const mpri_edge_t *edges) {
    if (t->phase != TASK_OPEN)
        return mpr_error_set(MPR_ERR_STATE, "backward: cannot add roots to a graph task that %s",
                             t->phase == TASK_FAILED ? "failed" : "is running");
    int stack_inline[64]; /* the walk's stack: on the C stack until a graph needs more */
    int *stack = stack_inline;
    int sp = 0, cap = 64;
    mpr_err_t rc = MPR_OK;
    for (int r = 0; r < n && rc == MPR_OK; r++) {
        if (!edges[r].node) continue;
        int i = lookup(t, edges[r].node);
        bool fresh = i < 0;
        if (fresh && (i = insert(t, edges[r].node)) < 0) { rc = mpr_last_error_code(); break; }
        if (t->entries[i].ran) { rc = already_ran(edges[r].node); break; }
        t->entries[i].deps++; /* the virtual root edge */
        t->entries[i].root_deps++;
        if (!fresh) continue;
        /* Walk the nodes first reached from this root. */
        if (sp == cap) {
            int *ns = grow_stack(stack, stack_inline, &cap);
            if (!ns) { rc = mpr_error_set(MPR_ERR_NOMEM, "backward: out of memory"); break; }
            stack = ns;
        }
        stack[sp++] = i;
        while (sp > 0 && rc == MPR_OK) {
            mpri_node_t *node = t->entries[stack[--sp]].node;
            for (int k = 0; k < node->n_next; k++) {
                mpri_node_t *child = node->next[k].node;
                if (!child) continue;
                int c = lookup(t, child);
                if (c < 0) {
                    if ((c = insert(t, child)) < 0) { rc = mpr_last_error_code(); break; }
                    if (sp == cap) {
                        int *ns = grow_stack(stack, stack_inline, &cap);
                        if (!ns) { rc = mpr_error_set(MPR_ERR_NOMEM, "backward: out of memory"); break; }
                        stack = ns;
                    }
                    stack[sp++] = c;
                }
                if (t->entries[c].ran) { rc = already_ran(child); break; }
                t->entries[c].deps++;
            }
        }
    }
    if (stack != stack_inline) free(stack);
    if (rc != MPR_OK) t->phase = TASK_FAILED; /* counts are incomplete */
    check_task(t);
    return rc;
}

int mpri_graph_task_num_nodes(const mpri_graph_task_t *t) { return t->n; }

int mpri_graph_task_dependencies(const mpri_graph_task_t *t, const mpri_node_t *node) {
    int i = lookup(t, node);
    return i < 0 ? -1 : t->entries[i].deps;
}

int mpri_graph_task_pending(const mpri_graph_task_t *t) {
    int c = 0;
    for (int i = 0; i < t->n; i++) {
        const entry_t *e = &t->entries[i];
        if (e->ran) continue;
        for (int k = 0; k < e->node->n_outputs; k++)
            if (e->buf[k]) { c++; break; }
    }
    return c;
}

static bool meta_matches(const mpri_tensor_meta_t *m, const mpr_tensor_t *g) {
    if (m->ndim < 0) return true;
    if (m->dtype != g->dtype || m->ndim != g->ndim || m->device != g->storage->device) return false;
    for (int i = 0; i < m->ndim; i++)
        if (m->shape[i] != g->shape[i]) return false;
    return true;
}

/* True if `g` is referenced only by the engine and owns its storage alone. */
static bool exclusive(const mpr_tensor_t *g) {
    return atomic_load(&g->refcount) == 1 && atomic_load(&g->storage->refcount) == 1 &&
           mpr_tensor_is_contiguous(g);
}

/* *slot += g (g borrowed). Adds in place when *slot is exclusively ours. */
static mpr_err_t accumulate(mpr_tensor_t **slot, mpr_tensor_t *g) {
    if (!*slot) {
        *slot = mpr_tensor_retain(g);
        return MPR_OK;
    }
    mpr_tensor_t *s = *slot;
    if (s->dtype != g->dtype || s->ndim != g->ndim || memcmp(s->shape, g->shape, sizeof(int64_t) * (size_t)s->ndim))
        return mpri_err_shape2("backward", "gradients to accumulate differ:", s, g);
    const mpri_backend_t *B = mpri_backend_of("backward", 2, (mpr_tensor_t *[]){s, g});
    if (!B) return mpr_last_error_code();
    int dev = s->storage->device;
    if (exclusive(s))
        return MPRI_BK(B, binary, dev, MPRI_BIN_ADD, s->dtype, s->ndim, s->shape, mpr_tensor_data(s), s->strides,
                       mpr_tensor_data(s), s->strides, mpr_tensor_data(g), g->strides, 1.0);
    mpr_tensor_t *sum = mpri_empty_on(dev, s->dtype, s->ndim, s->shape);
    if (!sum) return mpr_last_error_code();
    mpr_err_t rc = MPRI_BK(B, binary, dev, MPRI_BIN_ADD, s->dtype, s->ndim, s->shape, mpr_tensor_data(sum),
                           sum->strides, mpr_tensor_data(s), s->strides, mpr_tensor_data(g), g->strides, 1.0);
    if (rc != MPR_OK) {
        mpr_tensor_release(sum);
        return rc;
    }
    mpr_tensor_release(s);
    *slot = sum;
    return MPR_OK;
}

/* Leaf .grad accumulation (PyTorch's AccumulateGrad). Backward passes on
 * different threads may reach the same parameter: grad_lock serializes the
 * read-modify-write of .grad (uncontended in the single-threaded case). */
static pthread_mutex_t grad_lock = PTHREAD_MUTEX_INITIALIZER;

static mpr_err_t accumulate_leaf_locked(mpr_tensor_t *leaf, mpr_tensor_t *g);
static mpr_err_t accumulate_leaf(mpr_tensor_t *leaf, mpr_tensor_t *g) {
    pthread_mutex_lock(&grad_lock);
    mpr_err_t rc = accumulate_leaf_locked(leaf, g);
    pthread_mutex_unlock(&grad_lock);
    return rc;
}

static mpr_err_t accumulate_leaf_locked(mpr_tensor_t *leaf, mpr_tensor_t *g) {
    struct mpri_autograd_meta *m = mpri_meta_get(leaf);
    if (!m) return MPR_ERR_NOMEM;
    const mpri_backend_t *B = mpri_backend_of("backward", 2, (mpr_tensor_t *[]){leaf, g});
    if (!B) return mpr_last_error_code();
    int dev = g->storage->device;
    if (!m->grad) {
        if (exclusive(g)) {
            m->grad = mpr_tensor_retain(g);
        } else {
            mpr_tensor_t *c = mpri_empty_on(dev, g->dtype, g->ndim, g->shape);
            if (!c) return mpr_last_error_code();
            mpr_err_t rc = MPRI_BK(B, copy, dev, g->ndim, g->shape, g->dtype, mpr_tensor_data(c), c->strides,
                                   g->dtype, mpr_tensor_data(g), g->strides);
            if (rc != MPR_OK) {
                mpr_tensor_release(c);
                return rc;
            }
            m->grad = c;
        }
        return MPR_OK;
    }
    if (atomic_load(&m->grad->refcount) == 1)
        return accumulate(&m->grad, g) ;
    /* Someone else holds the old .grad: build a new one instead of writing into theirs. */
    mpr_tensor_t *old = m->grad;
    mpr_tensor_t *sum = mpri_empty_on(dev, g->dtype, g->ndim, g->shape);
    if (!sum) return mpr_last_error_code();
    mpr_err_t rc = MPRI_BK(B, binary, dev, MPRI_BIN_ADD, g->dtype, g->ndim, g->shape, mpr_tensor_data(sum),
                           sum->strides, mpr_tensor_data(old), old->strides, mpr_tensor_data(g), g->strides, 1.0);
    if (rc != MPR_OK) {
        mpr_tensor_release(sum);
        return rc;
    }
    m->grad = sum;
    mpr_tensor_release(old);
    return MPR_OK;
}

static mpr_err_t push_ready(mpri_graph_task_t *t, int i) {
    if (t->nready == t->capready) {
        int ncap = t->capready ? t->capready * 2 : INLINE_READY;
        int *nr = t->capready ? grow(t, t->ready, t->capready, t->nready, ncap, sizeof *nr) : t->ready_inline;
        if (!nr) return mpr_error_set(MPR_ERR_NOMEM, "backward: out of memory");
        t->ready = nr;
        t->capready = ncap;
    }
    t->ready[t->nready++] = i;
    return MPR_OK;
}

/* Deliver g (borrowed, may be NULL = no gradient on this edge) along an edge
 * of the subgraph: the edge was counted in the node's deps, so the node is in
 * the task, has not run and its output slot exists (checked by the caller for
 * root edges, by construction for node edges). */
static mpr_err_t deliver(mpri_graph_task_t *t, int c, int output_nr, mpr_tensor_t *g) {
    entry_t *e = &t->entries[c];
    MPRI_ASSERT(!e->ran && e->deps > 0, "backward: a gradient arrived for a node with no outstanding dependency");
    MPRI_ASSERT(output_nr >= 0 && output_nr < e->node->n_outputs, "backward: edge to an output that does not exist");
    if (g) {
        mpr_err_t rc = accumulate(&e->buf[output_nr], g);
        if (rc != MPR_OK) return rc;
    }
    if (--e->deps == 0) return push_ready(t, c);
    return MPR_OK;
}

/* Deliver along the internal edge `edge` of a node that ran. */
static mpr_err_t deliver_edge(mpri_graph_task_t *t, mpri_edge_t edge, mpr_tensor_t *g) {
    int c = lookup(t, edge.node);
    MPRI_ASSERT(c >= 0, "backward: a child of a node in the task was not counted by add_roots");
    return deliver(t, c, edge.output_nr, g);
}

/* Feed a root edge from the caller of run(): everything is checked and a
 * mistake is a returned error. */
static mpr_err_t feed_root(mpri_graph_task_t *t, mpri_edge_t edge, mpr_tensor_t *g) {
    int c = lookup(t, edge.node);
    if (c < 0 || t->entries[c].root_deps == 0)
        return mpr_error_set(MPR_ERR_STATE,
                             "backward: node %s is not an outstanding root of this graph task (never "
                             "added with add_roots, or already fed)",
                             edge.node->def->name);
    if (edge.output_nr < 0 || edge.output_nr >= edge.node->n_outputs)
        return mpr_error_set(MPR_ERR_STATE, "backward: output %d of node %s does not exist", edge.output_nr,
                             edge.node->def->name);
    const mpri_tensor_meta_t *m = &edge.node->out_meta[edge.output_nr];
    if (g && !meta_matches(m, g)) {
        char s1[96], s2[96];
        return mpr_error_set(MPR_ERR_SHAPE, "backward: gradient %s %s fed to %s, whose output is %s %s",
                             mpr_dtype_name(g->dtype), mpr_shape_str(g->ndim, g->shape, s1, sizeof s1),
                             edge.node->def->name, mpr_dtype_name(m->dtype),
                             mpr_shape_str(m->ndim, m->shape, s2, sizeof s2));
    }
    t->entries[c].root_deps--;
    return deliver(t, c, edge.output_nr, g);
}

static mpr_err_t run_node(mpri_graph_task_t *t, int idx) {
    entry_t *e = &t->entries[idx];
    mpri_node_t *node = e->node;
    MPRI_ASSERT(!e->ran && e->deps == 0, "backward: a node ran twice or before its dependencies");
    e->ran = true;
    bool any = false;
    for (int k = 0; k < node->n_outputs; k++) any |= e->buf[k] != NULL;

    if (node->def == &mpri_accumulate_def) {
        mpr_err_t rc = MPR_OK;
        if (any && node->leaf) {
            if (!meta_matches(&node->out_meta[0], e->buf[0])) {
                rc = mpri_err_shape2("backward", "leaf gradient shape differs from the leaf:", e->buf[0], node->leaf);
            } else if (t->opts.sink) {
                bool prev = mpr_set_grad_enabled(false);
                mpr_scope_begin();
                rc = t->opts.sink(t->opts.sink_ctx, node->leaf, e->buf[0]);
                mpr_scope_end();
                mpr_set_grad_enabled(prev);
            } else {
                rc = accumulate_leaf(node->leaf, e->buf[0]);
            }
        }
        mpr_tensor_release(e->buf[0]);
        e->buf[0] = NULL;
        return rc;
    }

    mpr_err_t rc = MPR_OK;
    mpr_tensor_t *gin_small[8] = {0};
    mpr_tensor_t **gin = node->n_next <= 8 ? gin_small : calloc((size_t)node->n_next, sizeof *gin);
    if (!gin) return mpr_error_set(MPR_ERR_NOMEM, "backward: out of memory");

    if (any) {
        if (node->released && node->has_saved) {
            rc = mpr_error_set(MPR_ERR_STATE,
                               "%s: trying to backward through the graph a second time (its saved "
                               "tensors were freed by the first backward); pass retain_graph=true "
                               "to the first",
                               node->def->name);
        }
        bool prev = mpr_set_grad_enabled(false);
        mpr_scope_begin();
        /* Missing output gradients are zeros of the output's shape. */
        for (int k = 0; rc == MPR_OK && k < node->n_outputs; k++) {
            if (e->buf[k]) continue;
            const mpri_tensor_meta_t *m = &node->out_meta[k];
            if (m->ndim < 0) {
                rc = mpr_error_set(MPR_ERR_STATE, "%s: output %d got no gradient and its shape is unknown",
                                   node->def->name, k);
                break;
            }
            e->buf[k] = mpr_scope_keep(mpri_full_on(m->device, m->dtype, m->ndim, m->shape, 0.0));
            if (!e->buf[k]) rc = mpr_last_error_code();
        }
        if (rc == MPR_OK) rc = node->def->backward(node, e->buf, gin);
        if (rc == MPR_OK) {
            for (int i = 0; i < node->n_next; i++) {
                if (!gin[i]) continue;
                if (!node->next[i].node) { gin[i] = NULL; continue; }
                if (!meta_matches(&node->in_meta[i], gin[i])) {
                    char s1[96], s2[96];
                    rc = mpr_error_set(MPR_ERR_SHAPE,
                                       "%s backward: gradient for input %d is %s %s, the input was %s %s",
                                       node->def->name, i, mpr_dtype_name(gin[i]->dtype),
                                       mpr_shape_str(gin[i]->ndim, gin[i]->shape, s1, sizeof s1),
                                       mpr_dtype_name(node->in_meta[i].dtype),
                                       mpr_shape_str(node->in_meta[i].ndim, node->in_meta[i].shape, s2, sizeof s2));
                    break;
                }
            }
            for (int i = 0; i < node->n_next; i++) mpr_tensor_retain(gin[i]);
            if (rc != MPR_OK)
                for (int i = 0; i < node->n_next; i++) { mpr_tensor_release(gin[i]); gin[i] = NULL; }
        } else {
            for (int i = 0; i < node->n_next; i++) gin[i] = NULL;
        }
        mpr_scope_end();
        mpr_set_grad_enabled(prev);
        for (int k = 0; k < node->n_outputs; k++) {
            mpr_tensor_release(e->buf[k]);
            e->buf[k] = NULL;
        }
    }
    if (rc == MPR_OK && !t->opts.retain_graph && any) {
        mpri_node_release_saved(node);
        node->released = true;
    }
    for (int i = 0; i < node->n_next; i++) {
        if (rc == MPR_OK && node->next[i].node) rc = deliver_edge(t, node->next[i], gin[i]);
        mpr_tensor_release(gin[i]);
    }
    if (gin != gin_small) free(gin);
    return rc;
}

bool mpri_engine_sink_passthrough(const mpri_engine_opts_t *opts, mpri_node_t *node, mpr_tensor_t *const *grads,
                                  mpr_err_t *rc) {
    if (!opts || !opts->sink || node->n_next != node->n_outputs) return false;
    for (int i = 0; i < node->n_next; i++) {
        const mpri_node_t *acc = node->next[i].node;
        if (!acc || acc->def != &mpri_accumulate_def || node->next[i].output_nr != 0) return false;
    }
    *rc = MPR_OK;
    for (int i = 0; i < node->n_next && *rc == MPR_OK; i++) {
        const mpri_node_t *acc = node->next[i].node;
        mpr_tensor_t *g = grads[i];
        if (!g || !acc->leaf) continue; /* no gradient, or the leaf died: dropped, as run_node does */
        if (!meta_matches(&node->out_meta[i], g)) {
            char s1[96], s2[96];
            const mpri_tensor_meta_t *m = &node->out_meta[i];
            *rc = mpr_error_set(MPR_ERR_SHAPE, "backward: gradient %s %s fed to %s, whose output is %s %s",
                                mpr_dtype_name(g->dtype), mpr_shape_str(g->ndim, g->shape, s1, sizeof s1),
                                node->def->name, mpr_dtype_name(m->dtype),
                                mpr_shape_str(m->ndim, m->shape, s2, sizeof s2));
        } else if (!meta_matches(&acc->out_meta[0], g)) {
            *rc = mpri_err_shape2("backward", "leaf gradient shape differs from the leaf:", g, acc->leaf);
        } else {
            bool prev = mpr_set_grad_enabled(false);
            mpr_scope_begin();
            *rc = opts->sink(opts->sink_ctx, acc->leaf, g);
            mpr_scope_end();
            mpr_set_grad_enabled(prev);
        }
    }
    return true;
}

mpr_err_t mpri_graph_task_run(mpri_graph_task_t *t, int n, const mpri_edge_t *edges,
                              mpr_tensor_t *const *grads) {
    MPRI_ASSERT(t->phase != TASK_RUNNING, "backward: graph task run re-entered (one driver per task)");
    if (t->phase == TASK_FAILED)
        return mpr_error_set(MPR_ERR_STATE, "backward: this graph task failed earlier; it cannot run again");
    check_task(t);
    t->phase = TASK_RUNNING;
    mpr_err_t rc = MPR_OK;
    for (int i = 0; i < n && rc == MPR_OK; i++)
        if (edges[i].node) rc = feed_root(t, edges[i], grads[i]);
    /* A refused feed leaves its entry untouched; nodes already made ready by
     * earlier edges of this call run (nothing is lost by the refusal). */
    mpr_err_t feed_rc = rc;
    rc = MPR_OK;
    while (rc == MPR_OK && t->nready > 0) rc = run_node(t, t->ready[--t->nready]);
    if (rc != MPR_OK) {
        t->nready = 0; /* nodes made ready will never run */
        t->phase = TASK_FAILED;
    } else {
        t->phase = TASK_OPEN;
        rc = feed_rc;
    }
    check_task(t);
    return rc;
}

mpr_err_t mpr_backward(mpr_tensor_t *root, mpr_tensor_t *grad, bool retain_graph) {
    MPRI_ARG_NONNULL(root);
    if (!root) return mpr_error_set(MPR_ERR_INVALID_ARG, "backward: root tensor is NULL");
    if (!mpr_requires_grad(root))
        return mpr_error_set(MPR_ERR_STATE,
                             "backward: the root tensor does not require grad and has no grad_fn");
    char s1[96], s2[96];
    mpr_tensor_t *ones = NULL;
    if (!grad) {
        if (mpr_tensor_numel(root) != 1)
            return mpr_error_set(MPR_ERR_SHAPE,
                                 "backward: grad can be implicitly created only for scalar outputs "
                                 "(root is %s)",
                                 mpr_shape_str(root->ndim, root->shape, s1, sizeof s1));
        const mpri_backend_t *B = mpri_backend_of("backward", 1, &root);
        ones = B ? mpri_empty_on(root->storage->device, root->dtype, root->ndim, root->shape) : NULL;
        if (!ones) return mpr_last_error_code();
        mpr_err_t rc = MPRI_BK(B, fill, root->storage->device, root->dtype, root->ndim, root->shape,
                               mpr_tensor_data(ones), ones->strides, 1.0);
        if (rc != MPR_OK) {
            mpr_tensor_release(ones);
            return rc;
        }
        grad = ones;
    } else {
        if (grad->dtype != root->dtype)
            return mpr_error_set(MPR_ERR_DTYPE, "backward: grad is %s, root is %s",
                                 mpr_dtype_name(grad->dtype), mpr_dtype_name(root->dtype));
        bool same = grad->ndim == root->ndim;
        for (int i = 0; same && i < root->ndim; i++) same = grad->shape[i] == root->shape[i];
        if (!same)
            return mpr_error_set(MPR_ERR_SHAPE, "backward: grad shape %s differs from root shape %s",
                                 mpr_shape_str(grad->ndim, grad->shape, s1, sizeof s1),
                                 mpr_shape_str(root->ndim, root->shape, s2, sizeof s2));
    }
    mpri_engine_opts_t opts = {.retain_graph = retain_graph};
    mpri_graph_task_t *task = mpri_graph_task_create(&opts);
    mpr_err_t rc = task ? MPR_OK : mpr_last_error_code();
    mpri_edge_t edge = mpri_tensor_edge(root);
    if (rc == MPR_OK && !edge.node) rc = mpr_last_error_code();
    if (rc == MPR_OK) rc = mpri_graph_task_add_roots(task, 1, &edge);
    if (rc == MPR_OK) rc = mpri_graph_task_run(task, 1, &edge, &grad);
    mpri_graph_task_destroy(task);
    mpr_tensor_release(ones);
    return rc;
}
