/* stats.c — RPC statistics: per function (caller and callee side: calls,
 * errors, timeouts, bytes, latency histograms) and per peer (messages and
 * bytes each way); snapshots (mpr_get_function_stats, mpr_get_peer_stats)
 * and the table printed at shutdown (MPIRPC_STATS=1).
 *
 * Invariants:
 * - Counting takes no lock and allocates only the first time a function id
 *   is seen: the function table is open addressing on the id (claimed by a
 *   compare-and-swap of the key, the entry published with a release store;
 *   a thread that finds the key claimed but the entry not yet published
 *   waits until it is, yielding: every claim publishes an entry, or
 *   `no_memory` when its allocation failed). A full table (MAX_FUNCTIONS)
 *   counts the call in `overflow` instead.
 * - Latency histograms are logarithmic: 8 buckets per power of two (values
 *   below 16 ns exact), so a percentile read from a bucket's middle is
 *   within 1/16 (6.25%) of a value in that bucket.
 * - Per-function counts accumulate for the life of the process; per-peer
 *   arrays are (re)made at each mpr_init for its world size and kept after
 *   shutdown for reading. */
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_args.h"
#include "mpri_runtime.h"
#include "mpri_trace.h"

#define NBUCKETS (16 + 60 * 8)
#define MAX_FUNCTIONS 512 /* power of two */

typedef struct {
    atomic_uint_fast64_t buckets[NBUCKETS]; /* the count is their sum (one atomic add per value) */
    atomic_uint_fast64_t max_ns;
} histogram_t;

typedef struct {
    char label[64]; /* the caller's label for the call when first seen */
    atomic_uint_fast64_t calls, errors, timeouts, bytes_out, bytes_in;
    histogram_t latency;
    atomic_uint_fast64_t served, serve_errors, serve_in, serve_out;
    histogram_t serve_latency;
} fn_stats_t;

typedef struct {
    atomic_uint_fast64_t msgs_sent, bytes_sent, msgs_received, bytes_received;
} peer_stats_t;

static struct {
    atomic_uint_fast64_t keys[MAX_FUNCTIONS];
    _Atomic(fn_stats_t *) entries[MAX_FUNCTIONS];
    atomic_uint_fast64_t overflow;
    pthread_mutex_t peers_lock; /* (re)allocating `peers` */
    _Atomic(peer_stats_t *) peers;
    atomic_int npeers;
    const char *(*namer)(uint64_t id);
} S = {.peers_lock = PTHREAD_MUTEX_INITIALIZER};

void mpri_observe_set_function_namer(const char *(*namer)(uint64_t)) { S.namer = namer; }

const char *mpri_observe_function_name(uint64_t id) {
    const char *n = S.namer ? S.namer(id) : NULL;
    return n ? n : "?";
}

void mpr_stats_enable(bool on) {
    if (on)
        atomic_fetch_or(&mpri_observe, MPRI_OBSERVE_STATS);
    else
        atomic_fetch_and(&mpri_observe, ~MPRI_OBSERVE_STATS);
}

/* ---- histograms ---- */

static int bucket_of(uint64_t v) {
    if (v < 16) return (int)v;
    int e = 63 - __builtin_clzll(v); /* >= 4 */
    int sub = (int)((v >> (e - 3)) & 7);
    int b = 16 + (e - 4) * 8 + sub;
    return b < NBUCKETS ? b : NBUCKETS - 1;
}

/* The middle of bucket b, in ns. */
static double bucket_mid(int b) {
    if (b < 16) return b;
    int e = (b - 16) / 8 + 4, sub = (b - 16) % 8;
    double lo = (double)(1ull << e) + (double)sub * (double)(1ull << (e - 3));
    return lo + (double)(1ull << (e - 3)) / 2;
}

static void hist_add(histogram_t *h, int64_t ns) {
    uint64_t v = ns > 0 ? (uint64_t)ns : 0;
    atomic_fetch_add_explicit(&h->buckets[bucket_of(v)], 1, memory_order_relaxed);
    uint64_t m = atomic_load_explicit(&h->max_ns, memory_order_relaxed);
    while (v > m && !atomic_compare_exchange_weak_explicit(&h->max_ns, &m, v, memory_order_relaxed,
                                                           memory_order_relaxed)) {
    }
}

static void hist_summary(histogram_t *h, mpr_latency_stats_t *out) {
    uint64_t counts[NBUCKETS], total = 0;
    for (int b = 0; b < NBUCKETS; b++) total += counts[b] = atomic_load_explicit(&h->buckets[b], memory_order_relaxed);
    memset(out, 0, sizeof *out);
    out->count = total;
    out->max_s = (double)atomic_load(&h->max_ns) / 1e9;
    if (!total) return;
    const double q[3] = {0.50, 0.90, 0.99};
    double *dst[3] = {&out->p50_s, &out->p90_s, &out->p99_s};
    for (int i = 0; i < 3; i++) {
        uint64_t rank = (uint64_t)(q[i] * (double)total + 0.999999), seen = 0; /* ceil: the rank-th latency */
        if (rank == 0) rank = 1;
        for (int b = 0; b < NBUCKETS; b++) {
            seen += counts[b];
            if (seen >= rank) {
                double v = bucket_mid(b);
                *dst[i] = (v < (double)atomic_load(&h->max_ns) ? v : (double)atomic_load(&h->max_ns)) / 1e9;
                break;
            }
        }
    }
}

/* ---- the function table ---- */

static fn_stats_t no_memory; /* published for a claimed key whose entry could not be allocated */

static fn_stats_t *entry_for(uint64_t id, const char *label) {
    if (id == 0) return NULL;
    uint64_t mix = id * 0x9E3779B97F4A7C15ull;
    for (unsigned probe = 0; probe < MAX_FUNCTIONS; probe++) {
        unsigned i = (unsigned)((mix >> 32) + probe) & (MAX_FUNCTIONS - 1);
        uint64_t k = atomic_load_explicit(&S.keys[i], memory_order_acquire);
        if (k == 0) {
            uint64_t expected = 0;
            if (atomic_compare_exchange_strong(&S.keys[i], &expected, id)) {
                fn_stats_t *e = calloc(1, sizeof *e);
                if (!e) { /* the key stays claimed with no entry: its calls count as overflow */
                    atomic_store_explicit(&S.entries[i], &no_memory, memory_order_release);
                    return NULL;
                }
                if (label) snprintf(e->label, sizeof e->label, "%s", label);
                atomic_store_explicit(&S.entries[i], e, memory_order_release);
                return e;
            }
            k = expected;
        }
        if (k != id) continue;
        fn_stats_t *e;
        for (int spins = 0; !(e = atomic_load_explicit(&S.entries[i], memory_order_acquire)); spins++)
            if (spins > 64) sched_yield(); /* the claiming thread is between its claim and its publication */
        return e == &no_memory ? NULL : e;
    }
    return NULL;
}

void mpri_stats_call_sent(uint64_t id, const char *label, uint64_t bytes_out) {
    fn_stats_t *e = entry_for(id, label);
    if (!e) {
        atomic_fetch_add(&S.overflow, 1);
        return;
    }
    atomic_fetch_add_explicit(&e->calls, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&e->bytes_out, bytes_out, memory_order_relaxed);
}

void mpri_stats_call_done(uint64_t id, int64_t latency_ns, uint64_t bytes_in, bool error, bool timeout) {
    fn_stats_t *e = entry_for(id, NULL);
    if (!e) return;
    if (timeout)
        atomic_fetch_add_explicit(&e->timeouts, 1, memory_order_relaxed);
    else if (error)
        atomic_fetch_add_explicit(&e->errors, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&e->bytes_in, bytes_in, memory_order_relaxed);
    if (latency_ns >= 0 && !timeout) hist_add(&e->latency, latency_ns);
}

void mpri_stats_serve_done(uint64_t id, int64_t latency_ns, uint64_t bytes_in, uint64_t bytes_out, bool error) {
    fn_stats_t *e = entry_for(id, NULL);
    if (!e) {
        atomic_fetch_add(&S.overflow, 1);
        return;
    }
    atomic_fetch_add_explicit(&e->served, 1, memory_order_relaxed);
    if (error) atomic_fetch_add_explicit(&e->serve_errors, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&e->serve_in, bytes_in, memory_order_relaxed);
    atomic_fetch_add_explicit(&e->serve_out, bytes_out, memory_order_relaxed);
    if (latency_ns >= 0) hist_add(&e->serve_latency, latency_ns);
}

/* ---- peers ---- */

mpr_err_t mpri_stats_prepare(int size) {
    peer_stats_t *p = calloc((size_t)(size > 0 ? size : 1), sizeof *p);
    if (!p) return mpr_error_set(MPR_ERR_NOMEM, "mpr_init: out of memory (statistics)");
    pthread_mutex_lock(&S.peers_lock);
    peer_stats_t *old = atomic_exchange(&S.peers, p);
    atomic_store(&S.npeers, size);
    pthread_mutex_unlock(&S.peers_lock);
    free(old); /* no thread counts between runtimes */
    return MPR_OK;
}

void mpri_stats_peer_sent(int peer, uint64_t bytes) {
    peer_stats_t *p = atomic_load_explicit(&S.peers, memory_order_acquire);
    if (!p || peer < 0 || peer >= atomic_load_explicit(&S.npeers, memory_order_relaxed)) return;
    atomic_fetch_add_explicit(&p[peer].msgs_sent, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p[peer].bytes_sent, bytes, memory_order_relaxed);
}

void mpri_stats_peer_received(int peer, uint64_t bytes) {
    peer_stats_t *p = atomic_load_explicit(&S.peers, memory_order_acquire);
    if (!p || peer < 0 || peer >= atomic_load_explicit(&S.npeers, memory_order_relaxed)) return;
    atomic_fetch_add_explicit(&p[peer].msgs_received, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p[peer].bytes_received, bytes, memory_order_relaxed);
}

/* ---- snapshots ---- */

mpr_err_t mpr_get_function_stats(mpr_function_stats_t **out, size_t *count) {
    if (out) *out = NULL;
    if (count) *count = 0;
    MPRI_ARG_NONNULL(out);
    MPRI_ARG_NONNULL(count);
    size_t n = 0;
    for (int i = 0; i < MAX_FUNCTIONS; i++) {
        fn_stats_t *e = atomic_load(&S.entries[i]);
        n += e && e != &no_memory;
    }
    mpr_function_stats_t *a = calloc(n ? n : 1, sizeof *a);
    if (!a) return mpr_error_set(MPR_ERR_NOMEM, "mpr_get_function_stats: out of memory");
    size_t k = 0;
    for (int i = 0; i < MAX_FUNCTIONS && k < n; i++) {
        fn_stats_t *e = atomic_load(&S.entries[i]);
        if (!e || e == &no_memory) continue;
        mpr_function_stats_t *s = &a[k++];
        s->function_id = atomic_load(&S.keys[i]);
        const char *name = S.namer ? S.namer(s->function_id) : NULL;
        snprintf(s->name, sizeof s->name, "%s", name ? name : e->label[0] ? e->label : "?");
        s->caller.calls = atomic_load(&e->calls);
        s->caller.errors = atomic_load(&e->errors);
        s->caller.timeouts = atomic_load(&e->timeouts);
        s->caller.bytes_out = atomic_load(&e->bytes_out);
        s->caller.bytes_in = atomic_load(&e->bytes_in);
        hist_summary(&e->latency, &s->caller.latency);
        s->callee.calls = atomic_load(&e->served);
        s->callee.errors = atomic_load(&e->serve_errors);
        s->callee.bytes_in = atomic_load(&e->serve_in);
        s->callee.bytes_out = atomic_load(&e->serve_out);
        hist_summary(&e->serve_latency, &s->callee.latency);
    }
    *out = a;
    *count = k;
    return MPR_OK;
}

mpr_err_t mpr_get_peer_stats(mpr_peer_stats_t **out, size_t *count) {
    if (out) *out = NULL;
    if (count) *count = 0;
    MPRI_ARG_NONNULL(out);
    MPRI_ARG_NONNULL(count);
    pthread_mutex_lock(&S.peers_lock);
    peer_stats_t *p = atomic_load(&S.peers);
    int n = atomic_load(&S.npeers);
    mpr_peer_stats_t *a = calloc(n > 0 ? (size_t)n : 1, sizeof *a);
    if (!a) {
        pthread_mutex_unlock(&S.peers_lock);
        return mpr_error_set(MPR_ERR_NOMEM, "mpr_get_peer_stats: out of memory");
    }
    for (int r = 0; p && r < n; r++) {
        a[r].rank = r;
        a[r].msgs_sent = atomic_load(&p[r].msgs_sent);
        a[r].bytes_sent = atomic_load(&p[r].bytes_sent);
        a[r].msgs_received = atomic_load(&p[r].msgs_received);
        a[r].bytes_received = atomic_load(&p[r].bytes_received);
    }
    pthread_mutex_unlock(&S.peers_lock);
    *out = a;
    *count = p ? (size_t)n : 0;
    return MPR_OK;
}

static void fmt_us(char *buf, size_t len, double s, uint64_t n) {
    if (n == 0)
        snprintf(buf, len, "%9s", "-");
    else
        snprintf(buf, len, "%9.1f", s * 1e6);
}

mpr_err_t mpr_print_stats(FILE *out) {
    MPRI_ARG_NONNULL(out);
    mpr_function_stats_t *fs;
    size_t nf;
    mpr_peer_stats_t *ps;
    size_t np;
    mpr_err_t e = mpr_get_function_stats(&fs, &nf);
    if (e) return e;
    if ((e = mpr_get_peer_stats(&ps, &np))) {
        free(fs);
        return e;
    }
    char *text = NULL;
    size_t text_len = 0;
    FILE *m = open_memstream(&text, &text_len); /* one write to `out`: ranks' tables do not interleave */
    if (!m) {
        free(fs);
        free(ps);
        return mpr_error_set(MPR_ERR_NOMEM, "mpr_print_stats: out of memory");
    }
    const char *who = mpri_rt.workers ? mpri_rt.workers[mpri_rt.rank].name : "";
    fprintf(m, "mpirpc statistics, %s (rank %d); latencies in us (p50/p90/p99)\n", who, mpri_rt.rank);
    fprintf(m, "  %-32s %8s %6s %6s %10s %10s %9s %9s %9s | %8s %6s %10s %10s %9s %9s %9s\n", "function",
            "calls", "errors", "t/outs", "bytes_out", "bytes_in", "p50", "p90", "p99", "served", "errors",
            "bytes_in", "bytes_out", "p50", "p90", "p99");
    for (size_t i = 0; i < nf; i++) {
        mpr_function_stats_t *s = &fs[i];
        char c[3][16], d[3][16];
        fmt_us(c[0], 16, s->caller.latency.p50_s, s->caller.latency.count);
        fmt_us(c[1], 16, s->caller.latency.p90_s, s->caller.latency.count);
        fmt_us(c[2], 16, s->caller.latency.p99_s, s->caller.latency.count);
        fmt_us(d[0], 16, s->callee.latency.p50_s, s->callee.latency.count);
        fmt_us(d[1], 16, s->callee.latency.p90_s, s->callee.latency.count);
        fmt_us(d[2], 16, s->callee.latency.p99_s, s->callee.latency.count);
        fprintf(m,
                "  %-32.32s %8" PRIu64 " %6" PRIu64 " %6" PRIu64 " %10" PRIu64 " %10" PRIu64
                " %s %s %s | %8" PRIu64 " %6" PRIu64 " %10" PRIu64 " %10" PRIu64 " %s %s %s\n",
                s->name, s->caller.calls, s->caller.errors, s->caller.timeouts, s->caller.bytes_out,
                s->caller.bytes_in, c[0], c[1], c[2], s->callee.calls, s->callee.errors, s->callee.bytes_in,
                s->callee.bytes_out, d[0], d[1], d[2]);
    }
    if (atomic_load(&S.overflow))
        fprintf(m, "  (%" PRIu64 " calls of functions beyond the first %d not counted)\n",
                (uint64_t)atomic_load(&S.overflow), MAX_FUNCTIONS);
    fprintf(m, "  %-32s %10s %12s %10s %12s\n", "peer", "msgs_sent", "bytes_sent", "msgs_recv", "bytes_recv");
    for (size_t r = 0; r < np; r++) {
        char peer[MPR_MAX_NAME_LEN + 32];
        snprintf(peer, sizeof peer, "%s (rank %d)", mpri_rt.workers ? mpri_rt.workers[r].name : "?", (int)r);
        fprintf(m, "  %-32.32s %10" PRIu64 " %12" PRIu64 " %10" PRIu64 " %12" PRIu64 "\n", peer, ps[r].msgs_sent,
                ps[r].bytes_sent, ps[r].msgs_received, ps[r].bytes_received);
    }
    fclose(m);
    fwrite(text, 1, text_len, out);
    fflush(out);
    free(text);
    free(fs);
    free(ps);
    return MPR_OK;
}
