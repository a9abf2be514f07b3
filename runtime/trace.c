/* trace.c — recording trace events: the switch (mpri_observe), per-thread
 * event buffers, named ranges, mpr_trace_start/stop.
 *
 * Invariants:
 * - Only the owning thread appends to its buffer: it writes the event, then
 *   publishes it with a release store of `len`; a reader takes `len` with
 *   acquire and reads only events below it.
 * - A buffer is allocated once per thread and generation and registered
 *   under `reg_lock` at the thread's first event: taken from the stock
 *   (written through when tracing started, one per runtime thread) or mapped
 *   with its pages populated then (new_ring); recording itself takes no
 *   lock, allocates nothing and never faults a page in. A full buffer drops the newest events and
 *   counts them (`dropped`); events are complete (a slice carries its start
 *   and duration), so dropping never leaves half of a slice.
 * - Buffers live until mpri_trace_rings_free (after the runtime stopped,
 *   recording off); `generation` then moves on so that a thread's cached
 *   pointer to a freed buffer is never used again.
 * - Named ranges nest per thread (a stack of 32; deeper ones are counted so
 *   ends still pair); a range is recorded at its end, only if recording is
 *   on then. */
#define _GNU_SOURCE /* pthread_setname_np */
#include <errno.h>
#include <pthread.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_args.h"
#include "mpri_event.h"
#include "mpri_runtime.h"
#include "mpri_trace.h"

atomic_uint mpri_observe;

#define DEFAULT_EVENTS 32768u
#define MAX_DEPTH 32

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static mpri_trace_ring_t *rings;
static int next_thread_index;
static atomic_uint generation = 1;
static char prefix[4096];
static bool prefix_from_env;

static _Thread_local mpri_trace_ring_t *my_ring;
static _Thread_local unsigned my_generation;
static _Thread_local char my_thread_name[32];
static _Thread_local struct {
    int64_t start_ns;
    uint8_t category;
    char name[MPRI_TRACE_NAME_MAX];
} stack[MAX_DEPTH];
static _Thread_local int depth;

static uint32_t buffer_events(void) {
    const char *s = getenv("MPIRPC_TRACE_EVENTS");
    long n = s ? strtol(s, NULL, 10) : 0;
    return n >= 16 && n <= (1L << 24) ? (uint32_t)n : DEFAULT_EVENTS;
}

/* Fresh memory is expensive on the VMs this runs on (measured with 4 KiB
 * pages, under load): the first write to a page costs 20-45 us when it
 * faults it in, 1-2 us per page to populate it (MAP_POPULATE) and still
 * ~10 us at the first write after that; a page written once costs nothing
 * more. With 64-byte events a traced pipelined call wrote into a fresh page
 * every ~20 calls on the callee, inside the handler or the poll: traced
 * throughput fell to 0.34-0.6x of untraced (issue #19). So the buffers of
 * the runtime's own threads are written through once when tracing starts
 * (the stock, below), and any other thread's buffer is populated at its
 * first event: recording itself never faults a page in. */
static mpri_trace_ring_t *new_ring(bool write_through) {
    mpri_trace_ring_t *r = aligned_alloc(_Alignof(mpri_trace_ring_t), sizeof *r);
    if (!r) return NULL;
    memset(r, 0, sizeof *r);
    r->cap = buffer_events();
    size_t bytes = (size_t)r->cap * sizeof(mpri_trace_event_t);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
        free(r);
        return NULL;
    }
    if (write_through) memset(p, 0, bytes);
    r->events = p;
    return r;
}

static void free_ring(mpri_trace_ring_t *r) {
    if (r->events) munmap(r->events, (size_t)r->cap * sizeof(mpri_trace_event_t));
    free(r);
}

/* Buffers written through in advance (new_ring(true)), not yet any
 * thread's: a thread's first event takes one. Guarded by reg_lock. */
static mpri_trace_ring_t *stock;

/* Make sure `threads` buffers exist or wait in the stock (those of threads
 * already recording count): called when tracing starts, for the runtime's
 * threads (main, progress, pool). Best effort: without memory the threads
 * allocate their own at their first event. */
static void stock_up(int threads) {
    pthread_mutex_lock(&reg_lock);
    int have = 0;
    for (mpri_trace_ring_t *r = rings; r; r = r->next) have++;
    for (mpri_trace_ring_t *r = stock; r; r = r->next) have++;
    pthread_mutex_unlock(&reg_lock);
    for (; have < threads; have++) {
        mpri_trace_ring_t *r = new_ring(true);
        if (!r) break;
        pthread_mutex_lock(&reg_lock);
        r->next = stock;
        stock = r;
        pthread_mutex_unlock(&reg_lock);
    }
}

/* The calling thread's buffer, registered at its first event (from the
 * stock if one waits there); NULL without memory. */
static mpri_trace_ring_t *ring_of_thread(void) {
    unsigned gen = atomic_load_explicit(&generation, memory_order_acquire);
    if (my_ring && my_generation == gen) return my_ring;
    pthread_mutex_lock(&reg_lock);
    mpri_trace_ring_t *r = stock;
    if (r) stock = r->next;
    pthread_mutex_unlock(&reg_lock);
    if (!r && !(r = new_ring(false))) return NULL;
    pthread_mutex_lock(&reg_lock);
    r->thread_index = next_thread_index++;
    if (my_thread_name[0])
        snprintf(r->thread_name, sizeof r->thread_name, "%s", my_thread_name);
    else
        snprintf(r->thread_name, sizeof r->thread_name, "thread %d", r->thread_index);
    r->next = rings;
    rings = r;
    pthread_mutex_unlock(&reg_lock);
    my_ring = r;
    my_generation = gen;
    return r;
}

void mpri_trace_record(const mpri_trace_event_t *ev) {
    mpri_trace_ring_t *r = ring_of_thread();
    if (!r) return;
    unsigned n = atomic_load_explicit(&r->len, memory_order_relaxed);
    if (n >= r->cap) {
        atomic_fetch_add_explicit(&r->dropped, 1, memory_order_relaxed);
        return;
    }
    r->events[n] = *ev;
    atomic_store_explicit(&r->len, n + 1, memory_order_release);
}

void mpri_trace_msg(int type, int64_t ts_ns, int64_t dur_ns, int kind, unsigned flags, uint64_t request_id,
                    uint64_t function_id, int peer, uint64_t bytes) {
    mpri_trace_event_t ev = {.ts_ns = ts_ns, .dur_ns = dur_ns, .request_id = request_id,
                             .function_id = function_id, .bytes = bytes, .peer = peer,
                             .type = (uint8_t)type, .kind = (uint8_t)kind, .flags = (uint8_t)flags};
    mpri_trace_record(&ev);
}

void mpri_trace_range_begin(int category, const char *name) {
    if (depth < MAX_DEPTH) {
        stack[depth].start_ns = mpri_now_ns();
        stack[depth].category = (uint8_t)category;
        snprintf(stack[depth].name, sizeof stack[depth].name, "%s", name ? name : "(null)");
    }
    depth++; /* past MAX_DEPTH: counted so that the ends still match */
}

void mpri_trace_range_end(void) {
    if (depth == 0) return;
    depth--;
    if (depth >= MAX_DEPTH || !mpri_observing(MPRI_OBSERVE_TRACE)) return;
    int64_t now = mpri_now_ns();
    mpri_trace_event_t ev = {.ts_ns = stack[depth].start_ns, .dur_ns = now - stack[depth].start_ns,
                             .type = MPRI_TEV_RANGE, .category = stack[depth].category, .peer = -1};
    memcpy(ev.name, stack[depth].name, sizeof ev.name);
    mpri_trace_record(&ev);
}

static _Thread_local bool handed_off;

void mpri_trace_handoff(void) { handed_off = true; }

bool mpri_trace_take_handoff(void) {
    bool was = handed_off;
    handed_off = false;
    return was;
}

void mpri_trace_name_thread(const char *name) {
    snprintf(my_thread_name, sizeof my_thread_name, "%s", name);
    if (my_ring && my_generation == atomic_load(&generation)) {
        pthread_mutex_lock(&reg_lock);
        snprintf(my_ring->thread_name, sizeof my_ring->thread_name, "%s", name);
        pthread_mutex_unlock(&reg_lock);
    }
}

void mpri_name_runtime_thread(pthread_t thread, const char *name) {
    char os_name[16]; /* the kernel keeps 15 characters */
    snprintf(os_name, sizeof os_name, "mpirpc %s", name);
    (void)pthread_setname_np(thread, os_name); /* best effort: only a label */
}

mpri_trace_ring_t *mpri_trace_rings(void) {
    pthread_mutex_lock(&reg_lock);
    mpri_trace_ring_t *r = rings;
    pthread_mutex_unlock(&reg_lock);
    return r;
}

void mpri_trace_rings_free(void) {
    pthread_mutex_lock(&reg_lock);
    mpri_trace_ring_t *r = rings;
    rings = NULL;
    while (stock) { /* the spare buffers go too: one list to free */
        mpri_trace_ring_t *spare = stock;
        stock = spare->next;
        spare->next = r;
        r = spare;
    }
    next_thread_index = 0;
    atomic_fetch_add(&generation, 1);
    pthread_mutex_unlock(&reg_lock);
    while (r) {
        mpri_trace_ring_t *next = r->next;
        free_ring(r);
        r = next;
    }
    prefix[0] = '\0';
    prefix_from_env = false;
}

const char *mpri_trace_prefix(void) { return prefix; }

/* Can <p>.json be created? Creates and removes it; false with the reason set. */
static bool path_writable(const char *p, const char *who) {
    char path[sizeof prefix + 8];
    snprintf(path, sizeof path, "%s.json", p);
    FILE *f = fopen(path, "a");
    if (!f) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "%s: cannot write the trace file '%s': %s; tracing stays off", who, path,
                      strerror(errno));
        return false;
    }
    long size = ftell(f);
    fclose(f);
    if (size == 0) remove(path); /* created by this test: leave no empty file behind */
    return true;
}

/* Turn recording on with output prefix `p`; `from_env`: MPIRPC_TRACE. */
static mpr_err_t start(const char *p, bool from_env, const char *who) {
    if (atomic_load(&mpri_observe) & MPRI_OBSERVE_TRACE)
        return mpr_error_set(MPR_ERR_STATE, "%s: tracing is already on (%s '%s'); stop it first", who,
                             prefix_from_env ? "MPIRPC_TRACE=" : "mpr_trace_start", prefix);
    if (!p || !p[0]) return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: empty trace path prefix", who);
    if (strlen(p) >= sizeof prefix - 8)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: trace path prefix longer than %zu bytes", who,
                             sizeof prefix - 8);
    if (!path_writable(p, who)) return mpr_last_error_code();
    snprintf(prefix, sizeof prefix, "%s", p);
    prefix_from_env = from_env;
    stock_up(mpri_rt.num_worker_threads + 2); /* the pool, the progress thread, the caller's thread */
    atomic_fetch_or(&mpri_observe, MPRI_OBSERVE_TRACE);
    return MPR_OK;
}

mpr_err_t mpri_trace_start_from_env(const char *p) { return start(p, true, "MPIRPC_TRACE"); }

mpr_err_t mpr_trace_start(const char *path_prefix) {
    MPRI_ARG_NONNULL(path_prefix);
    mpr_err_t e = mpri_check_running("mpr_trace_start");
    if (e) return e;
    return start(path_prefix, false, "mpr_trace_start");
}

mpr_err_t mpr_trace_stop(void) {
    if (!(atomic_fetch_and(&mpri_observe, ~MPRI_OBSERVE_TRACE) & MPRI_OBSERVE_TRACE))
        return mpr_error_set(MPR_ERR_STATE, "mpr_trace_stop: tracing is not on");
    return MPR_OK;
}

bool mpr_trace_enabled(void) { return mpri_observing(MPRI_OBSERVE_TRACE); }

void mpr_trace_begin(const char *name) {
    MPRI_ARG_NONNULL_OR(name, );
    if (mpri_observing(MPRI_OBSERVE_TRACE)) mpri_trace_range_begin(MPRI_TCAT_USER, name);
}

void mpr_trace_end(void) { mpri_trace_range_end(); /* pops even when off: begin/end stay paired */ }
