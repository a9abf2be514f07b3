/* context.c — distributed autograd contexts: ids, the per-worker table, the
 * calling thread's current context, the gradients accumulated in a context,
 * and the cleanup protocol that ends a context on every worker that took
 * part.
 *
 * STATE MACHINE of a context on one worker (mpri_dist_ctx_t.ended):
 *
 *   (absent) --mpr_dist_context_begin (root)-------------------> ALIVE
 *   (absent) --a message carrying the id arrives (record.c)-----> ALIVE
 *   ALIVE --mpr_dist_context_end (here)--> ENDED at once; CLEANUP to every
 *           worker in `workers`, and the release of what it held, at this
 *           worker's next idle moment (mpri_deferred.h: the caller's next
 *           wait on a future, after the next step's request has gone; the
 *           progress thread within about 1 ms; a live count; mpr_shutdown
 *           first)
 *   ALIVE --CLEANUP_AUTOGRAD_CONTEXT arrives--> ENDED, CLEANUP passed on to
 *           every worker in `workers` except its sender
 *   ALIVE --graceful shutdown, after the job is quiescent--> ENDED, reported
 *           as a leak ("dist autograd leak: context ... never ended")
 *   (absent) --CLEANUP arrives-->(absent): ignored (idempotent; the cleanup
 *           of a context reaches a worker once per neighbour that knew it)
 *   ENDED ids are remembered (the last 1024 ended or cleaned up here): a
 *   request sent inside the context that is handled after its cleanup
 *   (they run on different pool threads) does not bring it back — the
 *   call runs as a plain call, recording nothing (record.c).
 *
 *   ALIVE: in the table; send functions, workers and gradients are added.
 *   ENDED: out of the table (a lookup by id fails: late replies and backward
 *   messages for it are dropped or answered with an error, never applied);
 *   its send functions and gradients left it when it ended (released then,
 *   or at the idle moment above, from `ended_t`), and the struct lives on
 *   only while a running pass or call, or that pending release, still holds
 *   a reference.
 *
 * Messages: CLEANUP_AUTOGRAD_CONTEXT (header: the context id; no body; no
 * reply). The cleanup terminates: a worker passes it on only when it moves
 * its own copy ALIVE -> ENDED, which happens once.
 *
 * Invariants (checked with MPRI_ASSERT / check_ctx in Debug builds): a
 * context is in the table iff it is ALIVE; an ENDED context holds no send
 * function and no gradient; `workers` has no repeat and never this rank;
 * `sends` is sorted by message id; every id is nonzero and its top 16 bits
 * are the rank that began it. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_args.h"
#include "mpri_assert.h"
#include "mpri_deferred.h"
#include "mpri_dist.h"
#include "mpri_small_alloc.h"
#include "mpri_tensor.h"

#define TABLE_BUCKETS 256
#define COUNTER_BITS 48

static struct {
    pthread_mutex_t lock;
    mpri_dist_ctx_t *buckets[TABLE_BUCKETS];
    long alive;
    atomic_ullong next_counter; /* contexts begun here */
    atomic_ullong next_msg;     /* autograd message ids made here */
} table = {.lock = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local int64_t current_ctx;

/* Recently ended ids (a ring, guarded by table.lock): a message sent inside
 * a context can reach a worker after that context's cleanup did (they run
 * on different pool threads), and must not bring the context back. The ring
 * keeps the last ENDED_RING ids in end order; an open-addressing set with
 * tombstones mirrors it, so the check on every new context and every end is
 * a few probes, not a scan of the whole ring (it was 1024 compares on each
 * worker's first message of a context and on each end). Invariant (Debug:
 * check_ended_locked): an id is in the set iff it is in the ring. */
#define ENDED_RING 1024
#define ENDED_SLOTS 4096 /* power of two, 4x the ring: short probe runs */
#define ENDED_TOMB ((int64_t)-1)
static int64_t ended_ring[ENDED_RING];
static unsigned ended_next;
static int64_t ended_set[ENDED_SLOTS]; /* 0: empty, ENDED_TOMB: removed, else an id */

static unsigned ended_slot(int64_t id) { return (unsigned)(((uint64_t)id * 0x9e3779b97f4a7c15ull) >> 52); }

static bool recently_ended_locked(int64_t id) {
    for (unsigned h = ended_slot(id), i = 0; i < ENDED_SLOTS; h = (h + 1) & (ENDED_SLOTS - 1), i++) {
        if (ended_set[h] == id) return true;
        if (ended_set[h] == 0) return false;
    }
    return false;
}

static void ended_set_remove_locked(int64_t id) {
    for (unsigned h = ended_slot(id), i = 0; i < ENDED_SLOTS; h = (h + 1) & (ENDED_SLOTS - 1), i++) {
        if (ended_set[h] == id) {
            ended_set[h] = ENDED_TOMB;
            return;
        }
        if (ended_set[h] == 0) break;
    }
    MPRI_ASSERT(false, "an id leaving the ended ring is in the ended set");
}

static void check_ended_locked(void) {
    if (!MPRI_DEBUG_CHECKS) return;
    int in_set = 0, in_ring = 0;
    for (unsigned h = 0; h < ENDED_SLOTS; h++) in_set += ended_set[h] != 0 && ended_set[h] != ENDED_TOMB;
    for (unsigned i = 0; i < ENDED_RING; i++)
        if (ended_ring[i]) {
            in_ring++;
            MPRI_DEBUG_ASSERT(recently_ended_locked(ended_ring[i]), "every id of the ended ring is in the set");
        }
    MPRI_DEBUG_ASSERT(in_set == in_ring, "the ended set holds the ring's ids and nothing else");
    (void)in_set, (void)in_ring; /* read only by the assertions, which release builds drop */
}

/* Remember `id` (nonzero, not remembered yet) as ended; the oldest leaves. */
static void remember_ended_locked(int64_t id) {
    unsigned at = ended_next++ % ENDED_RING;
    if (ended_ring[at]) ended_set_remove_locked(ended_ring[at]);
    ended_ring[at] = id;
    unsigned h = ended_slot(id);
    while (ended_set[h] != 0 && ended_set[h] != ENDED_TOMB) h = (h + 1) & (ENDED_SLOTS - 1);
    ended_set[h] = id;
    if ((ended_next & (ENDED_RING - 1)) == 0) { /* once per ring turn: rebuild without tombstones */
        memset(ended_set, 0, sizeof ended_set);
        for (unsigned i = 0; i < ENDED_RING; i++) {
            if (!ended_ring[i]) continue;
            unsigned k = ended_slot(ended_ring[i]);
            while (ended_set[k]) k = (k + 1) & (ENDED_SLOTS - 1);
            ended_set[k] = ended_ring[i];
        }
    }
    check_ended_locked();
}

static const char *self_name(void) { return mpri_rt.workers ? mpri_rt.workers[mpri_rt.rank].name : "?"; }

static unsigned bucket_of(int64_t id) { return (unsigned)(((uint64_t)id * 0x9e3779b97f4a7c15ull) >> 56); }

static void check_ctx(const mpri_dist_ctx_t *c) {
    if (!MPRI_DEBUG_CHECKS) return;
    MPRI_DEBUG_ASSERT(c->id != 0, "a context id is never 0");
    MPRI_DEBUG_ASSERT(!c->ended || (c->nsends == 0 && c->ngrads == 0),
                      "an ENDED context holds no send function and no gradient");
    for (int i = 1; i < c->nsends; i++)
        MPRI_DEBUG_ASSERT(c->sends[i - 1].msg_id < c->sends[i].msg_id, "send functions are sorted by message id");
    for (int i = 0; i < c->nworkers; i++) {
        MPRI_DEBUG_ASSERT(c->workers[i] != mpri_rt.rank, "a context's workers never include this rank");
        for (int j = 0; j < i; j++) MPRI_DEBUG_ASSERT(c->workers[i] != c->workers[j], "workers has no repeat");
    }
}

/* ---- references and the table ---- */

void mpri_dist_ctx_retain(mpri_dist_ctx_t *c) {
    long before = atomic_fetch_add_explicit(&c->refcount, 1, memory_order_relaxed);
    MPRI_ASSERT(before > 0, "retain of a freed dist autograd context");
}

/* Drop what an ended context holds (lock held; released after unlocking by
 * the caller through the returned arrays). */
static void take_contents_locked(mpri_dist_ctx_t *c, mpri_dist_send_t **sends, int *nsends, mpri_dist_grad_t **grads,
                                 int *ngrads) {
    *sends = c->sends;
    *nsends = c->nsends;
    *grads = c->grads;
    *ngrads = c->ngrads;
    c->sends = NULL;
    c->nsends = c->capsends = 0;
    c->grads = NULL;
    c->ngrads = c->capgrads = 0;
}

/* An array of `c` with room inline (`room`, `room_n` entries): NULL
 * (empty) starts there without an allocation; beyond it, the heap. */
static void *grow_array(void *arr, void *room, int room_n, int used, int *cap, size_t elem) {
    if (!arr) {
        *cap = room_n;
        return room;
    }
    int n = *cap * 2;
    void *grown = arr == room ? malloc((size_t)n * elem) : realloc(arr, (size_t)n * elem);
    if (!grown) return NULL;
    if (arr == room) memcpy(grown, room, (size_t)used * elem);
    *cap = n;
    return grown;
}

static void free_array(void *arr, const void *room) {
    if (arr != room) free(arr);
}

/* Release taken contents (take_contents_locked) of `c`, which is still
 * referenced (its inline arrays may hold them). */
static void free_contents(mpri_dist_ctx_t *c, mpri_dist_send_t *sends, int nsends, mpri_dist_grad_t *grads,
                          int ngrads) {
    for (int i = 0; i < nsends; i++) mpri_node_release(sends[i].node);
    free_array(sends, c->inline_sends);
    for (int i = 0; i < ngrads; i++) {
        mpr_tensor_release(grads[i].leaf);
        mpr_tensor_release(grads[i].grad);
    }
    free_array(grads, c->inline_grads);
}

void mpri_dist_ctx_release(mpri_dist_ctx_t *c) {
    if (!c) return;
    long before = atomic_fetch_sub_explicit(&c->refcount, 1, memory_order_acq_rel);
    MPRI_ASSERT(before > 0, "dist autograd context released more often than retained");
    if (before != 1) return;
    MPRI_ASSERT(c->ended, "the last reference to an ALIVE context is the table's");
    MPRI_ASSERT(!c->bw_inbox && c->bw_waiters == 0, "backward requests are handed only to live waiters");
    free_contents(c, c->sends, c->nsends, c->grads, c->ngrads);
    free_array(c->workers, c->inline_workers);
    pthread_mutex_destroy(&c->lock);
    mpri_small_free(c, sizeof *c);
}

mpri_dist_ctx_t *mpri_dist_ctx_find(int64_t id) {
    if (!id) return NULL;
    pthread_mutex_lock(&table.lock);
    mpri_dist_ctx_t *c = table.buckets[bucket_of(id)];
    while (c && c->id != id) c = c->next;
    if (c) mpri_dist_ctx_retain(c);
    pthread_mutex_unlock(&table.lock);
    return c;
}

mpr_err_t mpri_dist_ctx_add_worker_locked(mpri_dist_ctx_t *c, int rank) {
    if (rank == mpri_rt.rank) return MPR_OK;
    for (int i = 0; i < c->nworkers; i++)
        if (c->workers[i] == rank) return MPR_OK;
    if (c->nworkers == c->capworkers) {
        int *w = grow_array(c->workers, c->inline_workers, MPRI_DIST_INLINE_WORKERS, c->nworkers, &c->capworkers, sizeof *w);
        if (!w) return mpr_error_set(MPR_ERR_NOMEM, "dist autograd: out of memory");
        c->workers = w;
    }
    c->workers[c->nworkers++] = rank;
    check_ctx(c);
    return MPR_OK;
}

static mpri_dist_ctx_t *ctx_new(int64_t id) {
    mpri_dist_ctx_t *c = mpri_small_calloc(sizeof *c); /* one a step on a peer: the thread's cache, not malloc */
    if (!c) {
        mpr_error_set(MPR_ERR_NOMEM, "dist autograd: out of memory for a context");
        return NULL;
    }
    atomic_init(&c->refcount, 1); /* the table's */
    atomic_init(&c->bw_inbox_len, 0);
    c->id = id;
    pthread_mutex_init(&c->lock, NULL);
    return c;
}

/* Insert `c` (not present; table lock held). */
static void insert_locked(mpri_dist_ctx_t *c) {
    unsigned b = bucket_of(c->id);
    c->next = table.buckets[b];
    table.buckets[b] = c;
    table.alive++;
}

mpri_dist_ctx_t *mpri_dist_ctx_get_or_create(int64_t id, int from_rank) {
    pthread_mutex_lock(&table.lock);
    mpri_dist_ctx_t *c = table.buckets[bucket_of(id)];
    while (c && c->id != id) c = c->next;
    if (!c && recently_ended_locked(id)) {
        pthread_mutex_unlock(&table.lock);
        mpr_error_set(MPR_ERR_NOT_FOUND, "dist autograd context %" PRId64 " was ended", id);
        return NULL;
    }
    if (!c && (c = ctx_new(id))) insert_locked(c);
    if (c) mpri_dist_ctx_retain(c);
    pthread_mutex_unlock(&table.lock);
    if (!c) return NULL;
    pthread_mutex_lock(&c->lock);
    mpr_err_t e = c->ended ? MPR_OK : mpri_dist_ctx_add_worker_locked(c, from_rank);
    pthread_mutex_unlock(&c->lock);
    if (e) {
        mpri_dist_ctx_release(c);
        return NULL;
    }
    return c;
}

/* Take context `id` out of the table (ALIVE -> ENDED): the table's reference
 * in *out, or NULL if it is not alive here. */
static mpri_dist_ctx_t *unlink_ctx(int64_t id) {
    pthread_mutex_lock(&table.lock);
    mpri_dist_ctx_t **p = &table.buckets[bucket_of(id)];
    while (*p && (*p)->id != id) p = &(*p)->next;
    mpri_dist_ctx_t *c = *p;
    if (c) {
        *p = c->next;
        c->next = NULL;
        table.alive--;
    }
    if (id && !recently_ended_locked(id)) remember_ended_locked(id); /* known or not: it is over */
    pthread_mutex_unlock(&table.lock);
    return c;
}

/* An ENDED context's leftovers on their way out: what it held, the workers
 * to tell (all but skip_rank), and the table's reference. */
typedef struct {
    mpri_dist_ctx_t *ctx;
    mpri_dist_send_t *sends;
    mpri_dist_grad_t *grads;
    int *workers;
    int nsends, ngrads, nworkers, skip_rank;
} ended_t;

/* Send the CLEANUPs, then release what the context held. A release put off
 * until the runtime stopped (shutdown runs what is left) sends nothing: the
 * others are stopped too. */
static void finish_ended(ended_t *e) {
    mpri_dist_ctx_t *c = e->ctx;
    int nworkers = mpri_state() == MPRI_STOPPED ? 0 : e->nworkers;
    for (int i = 0; i < nworkers; i++) {
        if (e->workers[i] == e->skip_rank) continue;
        mpri_outmsg_t m;
        mpri_outmsg_init(&m, MPRI_MSG_CLEANUP_AUTOGRAD_CONTEXT);
        m.hdr.autograd_context_id = (uint64_t)c->id;
        /* Best effort, as PyTorch: a worker that left keeps nothing to clean. */
        (void)mpri_send(e->workers[i], &m);
    }
    free_array(e->workers, c->inline_workers);
    free_contents(c, e->sends, e->nsends, e->grads, e->ngrads);
    mpri_dist_ctx_release(c);
}

static void finish_ended_later(void *arg) {
    finish_ended(arg);
    free(arg);
}

/* ALIVE -> ENDED (it was unlinked from the table by the caller): nothing is
 * added to it from here on. Then CLEANUP goes to every worker that took part
 * except `skip_rank`, and what it held (gradients, send functions and the
 * graphs behind them) is released; with `defer`, both happen at this
 * worker's next idle moment (mpri_deferred.h), off the caller's path.
 * Consumes the table's reference. */
static void end_ctx(mpri_dist_ctx_t *c, int skip_rank, bool defer) {
    ended_t e = {.ctx = c, .skip_rank = skip_rank};
    pthread_mutex_lock(&c->lock);
    MPRI_ASSERT(!c->ended, "a context ends once (it was unlinked from the table by this call)");
    c->ended = true;
    take_contents_locked(c, &e.sends, &e.nsends, &e.grads, &e.ngrads);
    e.nworkers = c->nworkers;
    e.workers = c->workers;
    c->workers = NULL;
    c->nworkers = c->capworkers = 0;
    check_ctx(c);
    pthread_mutex_unlock(&c->lock);
    ended_t *later = defer ? malloc(sizeof *later) : NULL;
    if (later) {
        *later = e;
        mpri_defer(finish_ended_later, later);
        return;
    }
    finish_ended(&e);
}

static void handle_cleanup(mpri_msg_t *msg) {
    mpri_dist_ctx_t *c = unlink_ctx((int64_t)msg->hdr.autograd_context_id);
    if (c) end_ctx(c, msg->src, false); /* a pool thread: nobody waits on it here */
    mpri_msg_done(msg);
}

/* ---- send functions ---- */

mpr_err_t mpri_dist_ctx_add_send_locked(mpri_dist_ctx_t *c, uint64_t msg_id, mpri_node_t *node) {
    MPRI_ASSERT(!c->ended, "nothing is added to an ENDED context");
    MPRI_ASSERT(c->nsends == 0 || c->sends[c->nsends - 1].msg_id < msg_id,
                "message ids made here grow, so send functions are appended in order");
    if (c->nsends == c->capsends) {
        mpri_dist_send_t *s = grow_array(c->sends, c->inline_sends, MPRI_DIST_INLINE, c->nsends, &c->capsends, sizeof *s);
        if (!s) return mpr_error_set(MPR_ERR_NOMEM, "dist autograd: out of memory");
        c->sends = s;
    }
    c->sends[c->nsends++] = (mpri_dist_send_t){msg_id, mpri_node_retain(node)};
    check_ctx(c);
    return MPR_OK;
}

mpri_node_t *mpri_dist_ctx_find_send_locked(mpri_dist_ctx_t *c, uint64_t msg_id) {
    int lo = 0, hi = c->nsends - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (c->sends[mid].msg_id == msg_id) return mpri_node_retain(c->sends[mid].node);
        if (c->sends[mid].msg_id < msg_id)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

uint64_t mpri_dist_next_msg_id(void) {
    uint64_t n = atomic_fetch_add(&table.next_msg, 1) + 1;
    return ((uint64_t)mpri_rt.rank << COUNTER_BITS) | (n & ((1ull << COUNTER_BITS) - 1));
}

/* ---- gradients ---- */

mpr_err_t mpri_dist_ctx_accumulate(mpri_dist_ctx_t *c, mpr_tensor_t *leaf, mpr_tensor_t *grad, bool private_grad) {
    /* The sum is computed outside the lock; a concurrent pass adding to the
     * same leaf retries against the newer value. */
    for (;;) {
        pthread_mutex_lock(&c->lock);
        if (c->ended) {
            pthread_mutex_unlock(&c->lock);
            return mpr_error_set(MPR_ERR_STATE, "dist backward: context %" PRId64 " was ended during the pass",
                                 c->id);
        }
        int i = 0;
        while (i < c->ngrads && c->grads[i].leaf != leaf) i++;
        if (i == c->ngrads) {
            if (c->ngrads == c->capgrads) {
                mpri_dist_grad_t *g = grow_array(c->grads, c->inline_grads, MPRI_DIST_INLINE, c->ngrads, &c->capgrads, sizeof *g);
                if (!g) {
                    pthread_mutex_unlock(&c->lock);
                    return mpr_error_set(MPR_ERR_NOMEM, "dist autograd: out of memory");
                }
                c->grads = g;
            }
            /* The engine's buffer itself when nobody else can see it (its only
             * reference, or the pass's private wire tensor; its storage's only
             * view, contiguous: nothing can write it later); else a copy (it
             * may be shared with other slots, or be a view). */
            bool keep = (private_grad || atomic_load(&grad->refcount) == 1) &&
                        atomic_load(&grad->storage->refcount) == 1 && mpr_tensor_is_contiguous(grad);
            mpr_tensor_t *own = keep ? mpr_tensor_retain(grad)
                                    : mpr_scope_keep(mpr_clone(grad)); /* grad mode is off: no history */
            if (!own) {
                pthread_mutex_unlock(&c->lock);
                return mpr_last_error_code();
            }
            c->grads[c->ngrads++] = (mpri_dist_grad_t){mpr_tensor_retain(leaf), own};
            pthread_mutex_unlock(&c->lock);
            return MPR_OK;
        }
        mpr_tensor_t *old = mpr_tensor_retain(c->grads[i].grad);
        pthread_mutex_unlock(&c->lock);
        mpr_tensor_t *sum = mpr_scope_keep(mpr_add(old, grad)); /* grad mode is off in a sink */
        if (!sum) {
            mpr_tensor_release(old);
            return mpr_last_error_code();
        }
        pthread_mutex_lock(&c->lock);
        bool replaced = false;
        for (int j = 0; j < c->ngrads; j++)
            if (c->grads[j].leaf == leaf && c->grads[j].grad == old) {
                mpr_tensor_release(c->grads[j].grad);
                c->grads[j].grad = sum;
                replaced = true;
                break;
            }
        pthread_mutex_unlock(&c->lock);
        mpr_tensor_release(old);
        if (replaced) return MPR_OK;
        mpr_tensor_release(sum); /* another pass accumulated meanwhile: again */
    }
}

/* ---- the public functions ---- */

int64_t mpri_dist_current(void) { return current_ctx; }

int64_t mpri_dist_swap_current(int64_t id) {
    int64_t prev = current_ctx;
    current_ctx = id;
    return prev;
}

int64_t mpr_dist_context_current(void) { return current_ctx; }

bool mpr_dist_context_exists(int64_t ctx_id) {
    mpri_dist_ctx_t *c = mpri_dist_ctx_find(ctx_id);
    mpri_dist_ctx_release(c);
    return c != NULL;
}

static mpr_err_t not_found(const char *fn, int64_t id) {
    return mpr_error_set(MPR_ERR_NOT_FOUND,
                         "%s: dist autograd context %" PRId64 " is not alive on %s (never known here, or ended)",
                         fn, id, self_name());
}

mpr_err_t mpr_dist_context_begin(int64_t *ctx_id) {
    MPRI_ARG_NONNULL(ctx_id);
    *ctx_id = 0;
    mpr_err_t e = mpri_check_running("mpr_dist_context_begin");
    if (e) return e;
    if (current_ctx)
        return mpr_error_set(MPR_ERR_STATE,
                             "mpr_dist_context_begin: this thread already has dist autograd context %" PRId64
                             " (end it first; contexts do not nest)",
                             current_ctx);
    if (mpri_rt.rank >= (1 << 16))
        return mpr_error_set(MPR_ERR_UNSUPPORTED,
                             "mpr_dist_context_begin: rank %d does not fit the 16-bit worker id of a context id",
                             mpri_rt.rank);
    uint64_t n = atomic_fetch_add(&table.next_counter, 1) + 1;
    if (n >> COUNTER_BITS) return mpr_error_set(MPR_ERR_STATE, "mpr_dist_context_begin: 2^48 contexts begun here");
    int64_t id = (int64_t)(((uint64_t)mpri_rt.rank << COUNTER_BITS) | n);
    mpri_dist_ctx_t *c = ctx_new(id);
    if (!c) return mpr_last_error_code();
    pthread_mutex_lock(&table.lock);
    insert_locked(c);
    pthread_mutex_unlock(&table.lock);
    current_ctx = id;
    *ctx_id = id;
    return MPR_OK;
}

mpr_err_t mpr_dist_context_end(int64_t ctx_id) {
    mpri_dist_ctx_t *c = unlink_ctx(ctx_id);
    if (current_ctx == ctx_id) current_ctx = 0;
    if (!c) return not_found("mpr_dist_context_end", ctx_id);
    end_ctx(c, -1, true); /* the caller's next step need not wait for the frees */
    return MPR_OK;
}

mpr_err_t mpr_dist_context_set_current(int64_t ctx_id, int64_t *prev) {
    if (prev) *prev = current_ctx;
    if (ctx_id && !mpr_dist_context_exists(ctx_id)) return not_found("mpr_dist_context_set_current", ctx_id);
    current_ctx = ctx_id;
    return MPR_OK;
}

mpr_err_t mpr_dist_get_gradient(int64_t ctx_id, const mpr_tensor_t *t, mpr_tensor_t **grad) {
    if (grad) *grad = NULL;
    MPRI_ARG_NONNULL(t);
    MPRI_ARG_NONNULL(grad);
    mpri_dist_ctx_t *c = mpri_dist_ctx_find(ctx_id);
    if (!c) return not_found("mpr_dist_get_gradient", ctx_id);
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < c->ngrads; i++)
        if (c->grads[i].leaf == t) *grad = mpr_tensor_retain(c->grads[i].grad);
    pthread_mutex_unlock(&c->lock);
    mpri_dist_ctx_release(c);
    return MPR_OK;
}

mpr_err_t mpr_dist_accumulate_gradient(int64_t ctx_id, mpr_tensor_t *t, mpr_tensor_t *grad) {
    MPRI_ARG_NONNULL(t);
    MPRI_ARG_NONNULL(grad);
    if (!mpr_is_leaf(t) || !mpr_requires_grad(t))
        return mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_dist_accumulate_gradient: the tensor is not a leaf that requires grad");
    if (mpr_tensor_dtype(grad) != mpr_tensor_dtype(t))
        return mpr_error_set(MPR_ERR_DTYPE, "mpr_dist_accumulate_gradient: a %s gradient for a %s tensor",
                             mpr_dtype_name(mpr_tensor_dtype(grad)), mpr_dtype_name(mpr_tensor_dtype(t)));
    int nd = mpr_tensor_ndim(t);
    bool same = mpr_tensor_ndim(grad) == nd;
    for (int i = 0; same && i < nd; i++) same = mpr_tensor_shape(grad)[i] == mpr_tensor_shape(t)[i];
    if (!same) {
        char a[96], b[96];
        return mpr_error_set(MPR_ERR_SHAPE, "mpr_dist_accumulate_gradient: a gradient of shape %s for a tensor of shape %s",
                             mpr_shape_str(mpr_tensor_ndim(grad), mpr_tensor_shape(grad), a, sizeof a),
                             mpr_shape_str(nd, mpr_tensor_shape(t), b, sizeof b));
    }
    mpri_dist_ctx_t *c = mpri_dist_ctx_find(ctx_id);
    if (!c) return not_found("mpr_dist_accumulate_gradient", ctx_id);
    bool prev = mpr_set_grad_enabled(false); /* the sink's sums record nothing */
    mpr_scope_begin();
    mpr_tensor_t *own = mpr_clone(grad); /* the sink may keep its argument: give it a private copy */
    mpr_err_t e = own ? mpri_dist_ctx_accumulate(c, t, own, false) : mpr_last_error_code();
    mpr_scope_end();
    mpr_set_grad_enabled(prev);
    mpri_dist_ctx_release(c);
    return e;
}

mpr_err_t mpr_dist_get_gradients(int64_t ctx_id, mpr_tensor_t ***leaves, mpr_tensor_t ***grads, int *n) {
    if (leaves) *leaves = NULL;
    if (grads) *grads = NULL;
    if (n) *n = 0;
    MPRI_ARG_NONNULL(leaves);
    MPRI_ARG_NONNULL(grads);
    MPRI_ARG_NONNULL(n);
    mpri_dist_ctx_t *c = mpri_dist_ctx_find(ctx_id);
    if (!c) return not_found("mpr_dist_get_gradients", ctx_id);
    mpr_err_t e = MPR_OK;
    pthread_mutex_lock(&c->lock);
    int k = c->ngrads;
    mpr_tensor_t **l = malloc(sizeof *l * (size_t)(k ? k : 1));
    mpr_tensor_t **g = malloc(sizeof *g * (size_t)(k ? k : 1));
    if (l && g) {
        for (int i = 0; i < k; i++) {
            l[i] = mpr_tensor_retain(c->grads[i].leaf);
            g[i] = mpr_tensor_retain(c->grads[i].grad);
        }
        *leaves = l;
        *grads = g;
        *n = k;
    } else {
        free(l);
        free(g);
        e = mpr_error_set(MPR_ERR_NOMEM, "mpr_dist_get_gradients: out of memory");
    }
    pthread_mutex_unlock(&c->lock);
    mpri_dist_ctx_release(c);
    return e;
}

/* ---- shutdown and debug info ---- */

/* After the job is quiescent and stopped: every context still alive here is
 * a leak (its root never ended it); report it by id and free it. */
static void report_leaks(void) {
    for (;;) {
        mpri_dist_ctx_t *c = NULL;
        pthread_mutex_lock(&table.lock);
        for (int b = 0; b < TABLE_BUCKETS && !c; b++) c = table.buckets[b];
        pthread_mutex_unlock(&table.lock);
        if (!c) break;
        c = unlink_ctx(c->id);
        if (!c) continue;
        pthread_mutex_lock(&c->lock);
        fprintf(stderr,
                "mpirpc: %s: dist autograd leak: context %" PRId64 " (begun on rank %" PRId64
                ") was never ended (%d send function(s), %d gradient(s), %d other worker(s))\n",
                self_name(), c->id, c->id >> COUNTER_BITS, c->nsends, c->ngrads, c->nworkers);
        c->nworkers = 0; /* the others are stopped: send no cleanup */
        pthread_mutex_unlock(&c->lock);
        end_ctx(c, -1, false);
    }
    current_ctx = 0;
}

static void debug_info(mpr_debug_info_t *info) {
    pthread_mutex_lock(&table.lock);
    info->dist_contexts = table.alive;
    pthread_mutex_unlock(&table.lock);
    info->autograd_nodes = (long)mpri_node_live_count();
    info->tensors = (long)mpr_tensor_live_count();
}

mpr_err_t mpri_dist_context_install(void) {
    mpr_err_t e = mpri_set_handler(MPRI_MSG_CLEANUP_AUTOGRAD_CONTEXT, handle_cleanup, false);
    if (!e) e = mpri_add_shutdown_hooks(NULL, report_leaks);
    if (!e) e = mpri_add_debug_info_hook(debug_info);
    return e;
}
