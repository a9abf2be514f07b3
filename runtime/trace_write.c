/* trace_write.c — the collective part of tracing and statistics: reading
 * MPIRPC_TRACE / MPIRPC_STATS at mpr_init, measuring the ranks' clock
 * offsets over MPI, and at graceful shutdown gathering every rank's events
 * to rank 0, which writes one Chrome trace-event JSON file (the format
 * Perfetto and chrome://tracing read); printing the statistics tables.
 *
 * Clock alignment: rank 0 exchanges SYNC_ROUNDS ping-pongs with each rank
 * and keeps, per rank, the round with the shortest round trip: offset =
 * t_rank - (t0_send + t0_recv) / 2 (Cristian's method; error at most half
 * that round trip). Measured at mpr_init (when MPIRPC_TRACE is set on any
 * rank: the decision is an allreduce, so all ranks take part) and at
 * shutdown; an event's time is moved into rank 0's clock by the offset
 * interpolated linearly between the two (the end offset alone when tracing
 * began through mpr_trace_start). Ranks on rank 0's host (same processor
 * name) share its CLOCK_MONOTONIC, so their offset is applied as exactly 0
 * and the measured one is only reported (otherData.clock: offsets, round
 * trips, what was applied). Timestamps are microseconds since rank 0's
 * mpr_init; otherData.clock_zero_ns is that instant in rank 0's
 * CLOCK_MONOTONIC, to line the trace up with other tools' records (perf
 * record -k CLOCK_MONOTONIC).
 *
 * The file: {"traceEvents":[...], "displayTimeUnit":"ns", "otherData":{...}}.
 * pid = rank (named "<worker> (rank r)"), tid = the thread's track (named
 * "progress", "pool 0", "main", ...). Slices ("ph":"X"): "send <kind> [fn]",
 * "handle <kind> [fn]", "complete <kind> [fn]" (a reply completing its
 * future), named ranges; instants ("ph":"i"): "recv <kind> [fn]", "timeout
 * [fn]". Flows: "s" at a request's send and "f" (binding to the enclosing
 * slice) at its handler, id = 2 * (request_id * size + caller) ; "s" at the
 * reply's send and "f" at its completion, id + 1.
 *
 * Besides the merged file: mpr_trace_flush writes it on request (the same
 * collective path, while the job runs), and each rank can write its own
 * file alone (<prefix>.rank<r>.json: mpr_trace_write_rank; at release when
 * no merged file was written — mpr_shutdown(false), a timed-out or departed
 * graceful shutdown; from an atexit handler when the process exits with the
 * runtime running), its times moved into rank 0's clock by the offset every
 * rank learns at mpr_init (0 on rank 0's host).
 *
 * Invariants: everything here that talks to other ranks is collective on
 * the private communicator `obs.comm` and runs on every rank or on none
 * (mpr_init; mpr_trace_flush, which every rank calls; the graceful
 * shutdown's DONE phase, which all live ranks reach; skipped on all when a
 * rank left the job, a set every rank agrees on). Writers on one rank take
 * turns (`write_lock`), so a rank's collectives pair in call order. A rank's
 * own file never talks to other ranks. Failing to write (path, memory)
 * prints a message naming the cause and never fails the shutdown. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpri_event.h"
#include "mpri_pool.h"
#include "mpri_runtime.h"
#include "mpri_trace.h"

#define SYNC_ROUNDS 8
#define SYNC_TAG 7

static struct {
    MPI_Comm comm;
    bool print_stats;
    bool synced_at_init;
    int64_t base_ns;  /* rank 0: its clock at init (the trace's zero) */
    int64_t *init_off, *init_rtt; /* rank 0: [size] offsets at init, and the round trips they came from */
    int64_t init_at;   /* rank 0's clock when they were measured */
    /* Every rank, from mpr_init: what a per-rank file needs to stand alone. */
    int64_t base0_ns;  /* rank 0's clock at init (the trace's zero) */
    int64_t my_off;    /* this rank's clock minus rank 0's, as applied (0 on rank 0's host) */
    const char *my_sync; /* how my_off was found */
    bool merged;       /* the graceful shutdown wrote (or tried) the merged file: no per-rank file */
    bool departed;     /* the graceful shutdown skipped the merged file: a rank left the job */
} obs = {.comm = MPI_COMM_NULL};

static pthread_mutex_t write_lock = PTHREAD_MUTEX_INITIALIZER; /* one writer per rank at a time */
static bool at_exit_registered;

static int rank_(void) { return mpri_rt.rank; }
static int size_(void) { return mpri_rt.size; }

/* Collective: on rank 0, off[r] = clock of r minus clock of rank 0 (error
 * at most rtt[r] / 2), and *at = rank 0's clock at the end. off/rtt may be
 * NULL (no memory on rank 0: it still takes part). */
static void measure_offsets(int64_t *off, int64_t *rtt, int64_t *at) {
    if (rank_() == 0) {
        if (off && rtt) off[0] = rtt[0] = 0;
        for (int r = 1; r < size_(); r++) {
            int64_t best = INT64_MAX, best_off = 0;
            for (int i = 0; i < SYNC_ROUNDS; i++) {
                int64_t t0 = mpri_now_ns(), tr = 0;
                MPI_Send(&t0, 1, MPI_INT64_T, r, SYNC_TAG, obs.comm);
                MPI_Recv(&tr, 1, MPI_INT64_T, r, SYNC_TAG, obs.comm, MPI_STATUS_IGNORE);
                int64_t t1 = mpri_now_ns();
                if (t1 - t0 < best) {
                    best = t1 - t0;
                    best_off = tr - (t0 + (t1 - t0) / 2);
                }
            }
            if (off && rtt) off[r] = best_off, rtt[r] = best;
        }
        *at = mpri_now_ns();
    } else {
        for (int i = 0; i < SYNC_ROUNDS; i++) {
            int64_t x;
            MPI_Recv(&x, 1, MPI_INT64_T, 0, SYNC_TAG, obs.comm, MPI_STATUS_IGNORE);
            int64_t tr = mpri_now_ns();
            MPI_Send(&tr, 1, MPI_INT64_T, 0, SYNC_TAG, obs.comm);
        }
    }
}

static bool env_on(const char *name) {
    const char *s = getenv(name);
    return s && s[0] && strcmp(s, "0") != 0;
}

static void write_at_exit(void);

void mpri_observe_init(MPI_Comm base) {
    obs.print_stats = env_on("MPIRPC_STATS");
    if (obs.print_stats) mpr_stats_enable(true);
    if (mpri_stats_prepare(mpri_rt.size)) fprintf(stderr, "mpirpc: %s\n", mpr_last_error());
    obs.base_ns = obs.base0_ns = mpri_now_ns(); /* base0_ns: rank 0's, once the communicator exists */
    obs.my_off = 0;
    obs.my_sync = "none (no tracing communicator: 0 applied)";
    if (MPI_Comm_dup(base, &obs.comm) != MPI_SUCCESS) {
        obs.comm = MPI_COMM_NULL;
        fprintf(stderr, "mpirpc: rank %d: MPI_Comm_dup for tracing failed: no trace, no statistics table\n", rank_());
        return;
    }
    const char *env = getenv("MPIRPC_TRACE");
    int mine = env && env[0], any = 0;
    MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, obs.comm);
    obs.synced_at_init = any;
    /* Every rank learns rank 0's zero and host, so that it can write its own file alone. */
    struct {
        int64_t base;
        char host[MPI_MAX_PROCESSOR_NAME];
    } zero = {.base = obs.base_ns}, *zp = &zero;
    char host[MPI_MAX_PROCESSOR_NAME] = {0};
    int host_len = 0;
    MPI_Get_processor_name(host, &host_len);
    memcpy(zero.host, host, sizeof host);
    MPI_Bcast(zp, (int)sizeof zero, MPI_BYTE, 0, obs.comm);
    obs.base0_ns = zero.base;
    bool same_host = strncmp(zero.host, host, sizeof host) == 0;
    obs.my_off = 0;
    obs.my_sync = same_host ? "0 (same host as rank 0)" : "none (not measured: 0 applied)";
    if (any) {
        free(obs.init_off);
        free(obs.init_rtt);
        obs.init_off = rank_() == 0 ? calloc((size_t)size_(), sizeof *obs.init_off) : NULL;
        obs.init_rtt = rank_() == 0 ? calloc((size_t)size_(), sizeof *obs.init_rtt) : NULL;
        int have = rank_() != 0 || (obs.init_off && obs.init_rtt);
        measure_offsets(have ? obs.init_off : NULL, have ? obs.init_rtt : NULL, &obs.init_at);
        MPI_Bcast(&have, 1, MPI_INT, 0, obs.comm);
        if (!have) {
            obs.synced_at_init = false; /* no memory on rank 0: nothing kept */
        } else {
            int64_t off = 0;
            MPI_Scatter(obs.init_off, 1, MPI_INT64_T, &off, 1, MPI_INT64_T, 0, obs.comm);
            if (!same_host) obs.my_off = off, obs.my_sync = "measured at init";
        }
    }
    if (mine && mpri_trace_start_from_env(env))
        fprintf(stderr, "mpirpc: rank %d: %s (the run goes on)\n", rank_(), mpr_last_error());
    obs.merged = obs.departed = false;
    if (!at_exit_registered) {
        at_exit_registered = true;
        atexit(write_at_exit);
    }
}

/* ---- formatting one rank's events ---- */

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

static const char *kind_category(int kind) {
    switch (kind) {
    case MPRI_MSG_CALL:
    case MPRI_MSG_RETURN:
    case MPRI_MSG_REMOTE_CALL:
    case MPRI_MSG_REMOTE_RET:
    case MPRI_MSG_EXCEPTION: return "rpc";
    case MPRI_MSG_RREF_FETCH:
    case MPRI_MSG_RREF_FETCH_RET:
    case MPRI_MSG_RREF_USER_DELETE:
    case MPRI_MSG_RREF_FORK_REQUEST:
    case MPRI_MSG_RREF_CHILD_ACCEPT:
    case MPRI_MSG_RREF_ACK: return "rref";
    case MPRI_MSG_FORWARD_AUTOGRAD_REQ:
    case MPRI_MSG_FORWARD_AUTOGRAD_RESP:
    case MPRI_MSG_BACKWARD_AUTOGRAD_REQ:
    case MPRI_MSG_BACKWARD_AUTOGRAD_RESP:
    case MPRI_MSG_CLEANUP_AUTOGRAD_CONTEXT: return "dist_autograd";
    default: return "control";
    }
}

static const char *const range_category[MPRI_TCAT_COUNT] = {"user", "autograd", "optim", "runtime"};

/* Maps a rank's clock to microseconds since rank 0's init. */
typedef struct {
    int64_t init_off, init_at_r, end_off, end_at_r, base;
    bool two_points;
} clock_map_t;

static double to_us(const clock_map_t *c, int64_t t) {
    double off = (double)c->end_off;
    if (c->two_points && c->end_at_r != c->init_at_r)
        off = (double)c->init_off + (double)(c->end_off - c->init_off) * (double)(t - c->init_at_r) /
                                        (double)(c->end_at_r - c->init_at_r);
    return ((double)t - off - (double)c->base) / 1000.0;
}

static void event_name(FILE *f, const char *verb, const mpri_trace_event_t *e) {
    char name[160];
    if (e->function_id)
        snprintf(name, sizeof name, "%s %s %s", verb, mpri_msg_kind_name(e->kind),
                 mpri_observe_function_name(e->function_id));
    else
        snprintf(name, sizeof name, "%s %s", verb, mpri_msg_kind_name(e->kind));
    json_str(f, name);
}

static void flow(FILE *f, char ph, uint64_t id, int pid, int tid, double ts) {
    fprintf(f, ",\n{\"ph\":\"%c\",%s\"id\":%" PRIu64 ",\"name\":\"rpc\",\"cat\":\"flow\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f}",
            ph, ph == 'f' ? "\"bp\":\"e\"," : "", id, pid, tid, ts);
}

static uint64_t flow_id(uint64_t request_id, int caller, bool reply) {
    return 2 * (request_id * (uint64_t)size_() + (uint64_t)caller) + (reply ? 1 : 0);
}

static void format_event(FILE *f, const clock_map_t *c, int tid, const mpri_trace_event_t *e) {
    int me = rank_();
    double ts = to_us(c, e->ts_ns);
    double dur = (double)e->dur_ns / 1000.0;
    if (dur < 0.001) dur = 0.001;
    const char *peer = e->peer >= 0 && e->peer < size_() && mpri_rt.workers ? mpri_rt.workers[e->peer].name : "";
    bool expects = e->flags & MPRI_FLAG_EXPECTS_REPLY, response = e->flags & MPRI_FLAG_RESPONSE;
    const char *verb = NULL;
    char ph = 'X';
    switch (e->type) {
    case MPRI_TEV_SEND: verb = "send"; break;
    case MPRI_TEV_RECV: verb = "recv", ph = 'i'; break;
    case MPRI_TEV_HANDLER: verb = "handle"; break;
    case MPRI_TEV_HANDOFF: verb = "hand off"; break;
    case MPRI_TEV_REPLY_IN: verb = "complete"; break;
    case MPRI_TEV_TIMEOUT: verb = "timeout", ph = 'i'; break;
    case MPRI_TEV_RANGE:
        fprintf(f, ",\n{\"ph\":\"X\",\"name\":");
        json_str(f, e->name);
        fprintf(f, ",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}",
                range_category[e->category < MPRI_TCAT_COUNT ? e->category : 0], me, tid, ts, dur);
        return;
    default: return;
    }
    fprintf(f, ",\n{\"ph\":\"%c\",\"name\":", ph);
    event_name(f, verb, e);
    fprintf(f, ",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f", kind_category(e->kind), me, tid, ts);
    if (ph == 'X')
        fprintf(f, ",\"dur\":%.3f", dur);
    else
        fprintf(f, ",\"s\":\"t\"");
    fprintf(f, ",\"args\":{\"peer\":");
    json_str(f, peer);
    fprintf(f, ",\"peer_rank\":%d,\"request_id\":%" PRIu64 ",\"bytes\":%" PRIu64 "}}", e->peer, e->request_id,
            e->bytes);
    if (!e->request_id) return;
    if (e->type == MPRI_TEV_SEND && !response && expects) flow(f, 's', flow_id(e->request_id, me, false), me, tid, ts);
    if (e->type == MPRI_TEV_HANDLER && expects) flow(f, 'f', flow_id(e->request_id, e->peer, false), me, tid, ts);
    if (e->type == MPRI_TEV_SEND && response) flow(f, 's', flow_id(e->request_id, e->peer, true), me, tid, ts);
    if (e->type == MPRI_TEV_REPLY_IN) flow(f, 'f', flow_id(e->request_id, me, true), me, tid, ts);
}

/* This rank's part of the file (each piece starts with ",\n"); *dropped: events lost. */
static char *format_rank(const clock_map_t *c, size_t *len, uint64_t *dropped, uint64_t *count) {
    char *text = NULL;
    FILE *f = open_memstream(&text, len);
    if (!f) return NULL;
    int me = rank_();
    fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":", me);
    char pname[MPR_MAX_NAME_LEN + 32];
    snprintf(pname, sizeof pname, "%s (rank %d)", mpri_rt.workers ? mpri_rt.workers[me].name : "?", me);
    json_str(f, pname);
    fprintf(f, "}},\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"args\":{\"sort_index\":%d}}", me, me);
    *dropped = *count = 0;
    for (mpri_trace_ring_t *r = mpri_trace_rings(); r; r = r->next) {
        unsigned n = atomic_load_explicit(&r->len, memory_order_acquire);
        uint64_t d = atomic_load(&r->dropped);
        *dropped += d;
        *count += n;
        fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":", me,
                r->thread_index);
        json_str(f, r->thread_name);
        fprintf(f, "}},\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,\"tid\":%d,\"args\":{\"sort_index\":%d}}",
                me, r->thread_index, r->thread_index);
        if (d)
            fprintf(f, ",\n{\"ph\":\"i\",\"s\":\"t\",\"name\":\"%" PRIu64 " events dropped (buffer full)\",\"cat\":\"trace\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f}",
                    d, me, r->thread_index, n ? to_us(c, r->events[n - 1].ts_ns) : 0.0);
        for (unsigned i = 0; i < n; i++) format_event(f, c, r->thread_index, &r->events[i]);
    }
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

/* ---- gathering and writing (collective) ---- */

/* Ranks on rank 0's host share its CLOCK_MONOTONIC (Linux: one clock per
 * machine): their offset is exactly 0, and the measured one (whose error is
 * up to half its round trip, tens of us on a loaded machine) is only
 * reported. Ranks elsewhere get the measured offsets. Collective; on rank 0
 * fills maps[r * 6 ...] (clock_map_t fields) and the "clock" report. */
static void align_clocks(int64_t *maps, FILE *report) {
    int me = rank_(), n = size_();
    int64_t *end_off = me == 0 ? calloc((size_t)n, sizeof *end_off) : NULL;
    int64_t *end_rtt = me == 0 ? calloc((size_t)n, sizeof *end_rtt) : NULL;
    int64_t end_at = 0;
    bool have = me != 0 || (end_off && end_rtt);
    measure_offsets(have ? end_off : NULL, have ? end_rtt : NULL, &end_at);
    char host[MPI_MAX_PROCESSOR_NAME] = {0};
    int host_len = 0;
    MPI_Get_processor_name(host, &host_len);
    char *hosts = me == 0 ? calloc((size_t)n, sizeof host) : NULL;
    MPI_Gather(host, (int)sizeof host, MPI_CHAR, hosts, hosts || me != 0 ? (int)sizeof host : 0, MPI_CHAR, 0,
               obs.comm);
    if (me == 0 && maps && have && hosts) {
        bool two = obs.synced_at_init && obs.init_off && obs.init_rtt;
        for (int r = 0; r < n; r++) {
            bool same_host = strcmp(&hosts[(size_t)r * sizeof host], host) == 0;
            int64_t *m = &maps[r * 6];
            m[0] = same_host ? 0 : two ? obs.init_off[r] : end_off[r];
            m[1] = two ? obs.init_at + obs.init_off[r] : 0;
            m[2] = same_host ? 0 : end_off[r];
            m[3] = end_at + end_off[r];
            m[4] = obs.base_ns;
            m[5] = two && !same_host;
            if (report) {
                fprintf(report, "%s{\"rank\":%d,\"host\":", r ? "," : "", r);
                json_str(report, &hosts[(size_t)r * sizeof host]);
                fprintf(report, ",\"applied\":\"%s\",\"end_offset_ns\":%" PRId64 ",\"end_rtt_ns\":%" PRId64,
                        same_host ? "0 (same host as rank 0)" : two ? "measured, init to end" : "measured at end",
                        end_off[r], end_rtt[r]);
                if (two)
                    fprintf(report, ",\"init_offset_ns\":%" PRId64 ",\"init_rtt_ns\":%" PRId64, obs.init_off[r],
                            obs.init_rtt[r]);
                fprintf(report, "}");
            }
        }
    } else if (me == 0 && maps) { /* no memory: zero offsets (exact on one host) */
        for (int r = 0; r < n; r++) maps[r * 6 + 4] = obs.base_ns;
    }
    free(end_off);
    free(end_rtt);
    free(hosts);
}

/* Collective: gather every rank's events so far to rank 0, which writes
 * them to `path` (rank 0's argument; NULL: <prefix>.json, the prefix of
 * rank 0, else of the lowest rank that has one). True on every rank when
 * rank 0 wrote the file. */
static bool write_trace(const char *path_arg) {
    int me = rank_(), n = size_();
    /* Each rank's clock map: init_off, init_at (rank's clock), end_off, end_at (rank's clock), base, two_points. */
    int64_t *maps = me == 0 ? calloc((size_t)n * 6, sizeof *maps) : NULL;
    char *clock_report = NULL;
    size_t clock_report_len = 0;
    FILE *report = me == 0 ? open_memstream(&clock_report, &clock_report_len) : NULL;
    align_clocks(maps, report);
    if (report) fclose(report);
    int64_t mine[6] = {0, 0, 0, 0, obs.base_ns, 0};
    int ok0 = me != 0 || maps;
    MPI_Bcast(&ok0, 1, MPI_INT, 0, obs.comm);
    if (ok0)
        MPI_Scatter(maps, 6, MPI_INT64_T, mine, 6, MPI_INT64_T, 0, obs.comm);
    else
        MPI_Bcast(&mine[4], 1, MPI_INT64_T, 0, obs.comm);
    clock_map_t c = {mine[0], mine[1], mine[2], mine[3], mine[4], mine[5] != 0};
    free(maps);

    size_t len = 0;
    uint64_t counts[2] = {0, 0}, totals[2] = {0, 0}; /* events, dropped */
    char *text = format_rank(&c, &len, &counts[1], &counts[0]);
    if (!text || len > INT_MAX / (size_t)n) {
        fprintf(stderr, "mpirpc: rank %d: cannot format its trace events (%s); they are left out\n", me,
                text ? "too large" : "out of memory");
        free(text);
        text = NULL;
        len = 0;
    }
    MPI_Reduce(counts, totals, 2, MPI_UINT64_T, MPI_SUM, 0, obs.comm);
    int my_len = (int)len;
    int *lens = me == 0 ? calloc((size_t)n, sizeof *lens) : NULL;
    int *displs = me == 0 ? calloc((size_t)n, sizeof *displs) : NULL;
    char prefix[4096];
    snprintf(prefix, sizeof prefix, "%s", mpri_trace_prefix());
    char *prefixes = me == 0 ? calloc((size_t)n, sizeof prefix) : NULL;
    int ok = me != 0 || (lens && displs && prefixes);
    MPI_Bcast(&ok, 1, MPI_INT, 0, obs.comm);
    char *all = NULL;
    int written = 0;
    if (ok) {
        MPI_Gather(prefix, (int)sizeof prefix, MPI_CHAR, prefixes, (int)sizeof prefix, MPI_CHAR, 0, obs.comm);
        MPI_Gather(&my_len, 1, MPI_INT, lens, 1, MPI_INT, 0, obs.comm);
        size_t total = 0;
        if (me == 0)
            for (int r = 0; r < n; r++) {
                displs[r] = (int)total;
                total += (size_t)lens[r];
            }
        all = me == 0 ? malloc(total + 1) : NULL;
        int gather_ok = me != 0 || all;
        MPI_Bcast(&gather_ok, 1, MPI_INT, 0, obs.comm);
        if (gather_ok) {
            MPI_Gatherv(text ? text : "", my_len, MPI_CHAR, all, lens, displs, MPI_CHAR, 0, obs.comm);
            if (me == 0) {
                const char *chosen = NULL;
                for (int r = 0; r < n && !chosen; r++)
                    if (prefixes[r * sizeof prefix]) chosen = &prefixes[r * sizeof prefix];
                char path[sizeof prefix + 16], tmp[sizeof prefix + 32];
                if (path_arg)
                    snprintf(path, sizeof path, "%s", path_arg);
                else
                    snprintf(path, sizeof path, "%s.json", chosen ? chosen : "mpirpc_trace");
                snprintf(tmp, sizeof tmp, "%s.tmp", path);
                FILE *f = fopen(tmp, "w");
                if (f) {
                    fprintf(f, "{\"traceEvents\":[\n{\"ph\":\"M\",\"name\":\"mpirpc_trace\",\"pid\":0,\"args\":"
                               "{\"ranks\":%d,\"events\":%" PRIu64 ",\"dropped\":%" PRIu64 "}}",
                            n, totals[0], totals[1]);
                    fwrite(all, 1, total, f);
                    fprintf(f, "\n],\n\"displayTimeUnit\":\"ns\",\n\"otherData\":{\"ranks\":%d,\"events\":%" PRIu64
                               ",\"dropped_events\":%" PRIu64 ",\"clock_zero_ns\":%" PRId64
                               ",\"clock_sync\":\"%s\",\"clock\":[%s]}}\n",
                            n, totals[0], totals[1], obs.base_ns, obs.synced_at_init ? "init+end" : "end",
                            clock_report ? clock_report : "");
                    written = fclose(f) == 0 && rename(tmp, path) == 0;
                    if (!written) remove(tmp);
                }
                if (written)
                    fprintf(stderr, "mpirpc: trace of %d ranks written to %s (%" PRIu64 " events, %" PRIu64
                                    " dropped)\n", n, path, totals[0], totals[1]);
                else
                    fprintf(stderr, "mpirpc: cannot write the trace file '%s': %s (the run goes on)\n", path,
                            strerror(errno));
            }
        } else {
            fprintf(stderr, "mpirpc: out of memory gathering the trace on rank 0; no trace written\n");
        }
    } else if (me == 0) {
        fprintf(stderr, "mpirpc: out of memory gathering the trace on rank 0; no trace written\n");
    }
    free(all);
    free(lens);
    free(displs);
    free(prefixes);
    free(text);
    free(clock_report);
    MPI_Bcast(&written, 1, MPI_INT, 0, obs.comm);
    return written;
}

/* ---- one rank alone: its own file (any time, no MPI) ---- */

/* Write this rank's events so far to `path` (NULL: <prefix>.rank<r>.json),
 * timestamps in rank 0's clock by the offset known since mpr_init; `why`
 * says what made it write (otherData.reason). Never talks to other ranks.
 * Returns MPR_OK, or an error with its message set. */
static mpr_err_t write_rank_file(const char *path_arg, const char *why) {
    int me = rank_();
    char path[4096 + 32], tmp[sizeof path + 8];
    if (path_arg)
        snprintf(path, sizeof path, "%s", path_arg);
    else if (mpri_trace_prefix()[0])
        snprintf(path, sizeof path, "%s.rank%d.json", mpri_trace_prefix(), me);
    else
        return mpr_error_set(MPR_ERR_STATE, "mpr_trace_write_rank: no path given and no trace prefix on rank %d "
                                            "(tracing never started here)", me);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    pthread_mutex_lock(&write_lock);
    clock_map_t c = {obs.my_off, 0, obs.my_off, 0, obs.base0_ns, false};
    size_t len = 0;
    uint64_t events = 0, dropped = 0;
    char *text = format_rank(&c, &len, &dropped, &events);
    mpr_err_t e = MPR_OK;
    FILE *f = text ? fopen(tmp, "w") : NULL;
    if (!text) {
        e = mpr_error_set(MPR_ERR_NOMEM, "rank %d: out of memory formatting its trace events", me);
    } else if (!f) {
        e = mpr_error_set(MPR_ERR_IO, "rank %d: cannot write the trace file '%s': %s", me, path, strerror(errno));
    } else {
        fprintf(f, "{\"traceEvents\":[\n{\"ph\":\"M\",\"name\":\"mpirpc_trace\",\"pid\":%d,\"args\":"
                   "{\"ranks\":1,\"rank\":%d,\"events\":%" PRIu64 ",\"dropped\":%" PRIu64 "}}",
                me, me, events, dropped);
        fwrite(text, 1, len, f);
        fprintf(f, "\n],\n\"displayTimeUnit\":\"ns\",\n\"otherData\":{\"ranks\":1,\"rank\":%d,\"world_size\":%d,"
                   "\"events\":%" PRIu64 ",\"dropped_events\":%" PRIu64 ",\"reason\":",
                me, size_(), events, dropped);
        json_str(f, why);
        fprintf(f, ",\"clock_sync\":\"%s\",\"clock\":[{\"rank\":%d,\"applied\":\"%s\",\"applied_offset_ns\":%" PRId64
                   "}]}}\n",
                obs.synced_at_init ? "init" : "none", me, obs.my_sync, obs.my_off);
        if (fclose(f) != 0 || rename(tmp, path) != 0) {
            e = mpr_error_set(MPR_ERR_IO, "rank %d: cannot write the trace file '%s': %s", me, path, strerror(errno));
            remove(tmp);
        }
    }
    pthread_mutex_unlock(&write_lock);
    free(text);
    if (e == MPR_OK)
        fprintf(stderr, "mpirpc: rank %d: trace of this rank written to %s (%" PRIu64 " events, %" PRIu64
                        " dropped; %s)\n", me, path, events, dropped, why);
    return e;
}

/* Anything recorded on this rank that no file holds yet? */
static bool have_events(void) {
    for (mpri_trace_ring_t *r = mpri_trace_rings(); r; r = r->next)
        if (atomic_load_explicit(&r->len, memory_order_acquire) || atomic_load(&r->dropped)) return true;
    return false;
}

/* The process exits while the runtime still runs (exit() on an error path,
 * return from main without mpr_shutdown): each rank writes its own file.
 * Other threads may still record; the file holds what was published. */
static void write_at_exit(void) {
    int st = atomic_load(&mpri_rt.state);
    if (st == MPRI_UNINIT || st == MPRI_STOPPED || !mpri_trace_prefix()[0] || !have_events()) return;
    if (write_rank_file(NULL, "the process exited without mpr_shutdown"))
        fprintf(stderr, "mpirpc: %s\n", mpr_last_error());
}

mpr_err_t mpr_trace_write_rank(const char *path) {
    mpr_err_t e = mpri_check_running("mpr_trace_write_rank");
    if (e) return e;
    if (path && !path[0]) return mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_trace_write_rank: empty path");
    return write_rank_file(path, "mpr_trace_write_rank");
}

/* ---- all ranks together ---- */

mpr_err_t mpr_trace_flush(const char *path) {
    mpr_err_t e = mpri_check_running("mpr_trace_flush");
    if (e) return e;
    if (mpri_on_pool_thread() || mpri_in_progress_context())
        return mpr_error_set(MPR_ERR_STATE, "mpr_trace_flush: called inside a handler or callback; it is collective "
                                            "(every rank calls it): call it from an application thread");
    if (path && !path[0]) return mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_trace_flush: empty path");
    if (obs.comm == MPI_COMM_NULL)
        return mpr_error_set(MPR_ERR_STATE, "mpr_trace_flush: no tracing communicator (its creation failed at init)");
    for (int r = 0; r < size_(); r++)
        if (mpri_peer_gone(r))
            return mpr_error_set(MPR_ERR_STATE, "mpr_trace_flush: rank %d left the job; use mpr_trace_write_rank", r);
    pthread_mutex_lock(&write_lock); /* serializes this rank's flushes: the collectives pair in call order */
    int mine = mpri_trace_prefix()[0] || have_events(), any = 0;
    MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, obs.comm);
    bool written = any && write_trace(path);
    pthread_mutex_unlock(&write_lock);
    if (!any) return mpr_error_set(MPR_ERR_STATE, "mpr_trace_flush: no rank is tracing (MPIRPC_TRACE, mpr_trace_start)");
    if (!written)
        return mpr_error_set(MPR_ERR_IO, "mpr_trace_flush: rank 0 could not write the trace (its message says why)");
    return MPR_OK;
}

void mpri_observe_finish(void) {
    if (obs.comm == MPI_COMM_NULL) return;
    bool traced = (atomic_fetch_and(&mpri_observe, ~MPRI_OBSERVE_TRACE) & MPRI_OBSERVE_TRACE) ||
                  mpri_trace_prefix()[0] || mpri_trace_rings();
    int departed = 0;
    for (int r = 0; r < size_(); r++) departed += mpri_peer_gone(r);
    if (departed) { /* every live rank sees the same departed set: all skip alike */
        obs.departed = true; /* each rank writes its own file at release */
        return;
    }
    int mine = traced, any = 0;
    MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, obs.comm);
    if (any) {
        pthread_mutex_lock(&write_lock);
        write_trace(NULL);
        pthread_mutex_unlock(&write_lock);
    }
    obs.merged = true;
    if (obs.print_stats)
        for (int r = 0; r < size_(); r++) {
            if (r == rank_()) mpr_print_stats(stderr);
            MPI_Barrier(obs.comm);
        }
}

void mpri_observe_release(bool free_comm) {
    atomic_fetch_and(&mpri_observe, ~MPRI_OBSERVE_TRACE);
    /* Not merged at a graceful shutdown: this rank's own file, so that a
     * crash investigation has every rank's events (the threads have stopped). */
    if (!obs.merged && mpri_trace_prefix()[0] && have_events()) {
        const char *why = obs.departed   ? "graceful shutdown after a rank left the job: no merged trace"
                          : !free_comm ? "graceful shutdown timed out: no merged trace"
                                       : "non-graceful shutdown (mpr_shutdown(false)) or failed init";
        if (write_rank_file(NULL, why)) fprintf(stderr, "mpirpc: %s\n", mpr_last_error());
    }
    obs.merged = obs.departed = false;
    mpri_trace_rings_free();
    free(obs.init_off);
    free(obs.init_rtt);
    obs.init_off = obs.init_rtt = NULL;
    if (free_comm && obs.comm != MPI_COMM_NULL) MPI_Comm_free(&obs.comm);
    obs.comm = MPI_COMM_NULL;
}
