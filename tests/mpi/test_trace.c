/* test_trace.c — tracing and statistics of a scripted 3-rank run (issue #19).
 *
 * Run with MPIRPC_TRACE=<prefix> (ctest sets it; the file is <prefix>.json).
 * With argument bad-env (MPIRPC_TRACE unwritable, MPIRPC_STATS=1): init says
 * why there is no trace and the run goes on. The script: worker0 calls tr_add on worker1 5 times (rpc_sync),
 * creates one RRef there (remote tr_add, to_here) and calls tr_fail on
 * worker2 once (an error reply); worker1 calls tr_echo on worker2 4 times
 * (pipelined rpc_async); worker2 calls tr_add on worker0 3 times; every rank
 * wraps its part in a user range "script". Checked:
 * - misuse: starting while MPIRPC_TRACE is on, stopping twice, an unwritable
 *   path: clear errors, and the run goes on;
 * - statistics (mpr_get_function_stats, mpr_get_peer_stats): the counts equal
 *   the calls made, on caller and callee;
 * - the trace file, parsed with cJSON on rank 0 after shutdown: exactly the
 *   expected send / recv / handle / complete events per rank for the
 *   script's functions, every flow start with exactly one end, each inside a
 *   slice of the right kind, in causal order (end after start, after the
 *   clock alignment), the user ranges, RRef protocol events, and the
 *   measured clock offsets within their own error bound (one host: true
 *   offset 0). */
#include <cjson/cJSON.h>
#include <math.h>
#include <unistd.h>

#include "mpitest.h"

static const char *prefix;

static mpr_err_t fn_add(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t a, b;
    mpr_err_t e;
    if ((e = mpr_args_int(args, 0, &a)) || (e = mpr_args_int(args, 1, &b))) return e;
    *result = mpr_value_new_int(a + b);
    return MPR_OK;
}

static mpr_err_t fn_echo(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    *result = mpr_value_retain((mpr_value_t *)args);
    return MPR_OK;
}

/* [x] -> x * 3 (a tensor: the backward of a call within a dist autograd context). */
static mpr_err_t fn_triple(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    mpr_tensor_t *x;
    mpr_err_t e = mpr_args_tensor(args, 0, &x);
    if (e) return e;
    mpr_tensor_t *y = mpr_mul_scalar(x, 3.0);
    if (!y) return mpr_last_error_code();
    *result = mpr_value_new_tensor(y);
    mpr_tensor_release(y);
    return MPR_OK;
}

/* A future callback: passes the parent's value on. */
static mpr_err_t then_pass(mpr_future_t *parent, void *user_data, mpr_value_t **result) {
    (void)user_data;
    return mpr_future_get(parent, 0, result); /* complete: at once */
}

static mpr_err_t fn_fail(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    return mpr_error_set(MPR_ERR_INVALID_ARG, "tr_fail always fails");
}

static void test_misuse(void) {
    CHECK(mpr_trace_enabled()); /* MPIRPC_TRACE */
    CHECK_ERR(mpr_trace_start(prefix), MPR_ERR_STATE);
    CHECK_CONTAINS(mpr_last_error(), "tracing is already on (MPIRPC_TRACE=");
    CHECK_OK(mpr_trace_stop());
    CHECK_ERR(mpr_trace_stop(), MPR_ERR_STATE);
    CHECK(!mpr_trace_enabled());
    CHECK_ERR(mpr_trace_start("/nonexistent-mpirpc-dir/trace"), MPR_ERR_INVALID_ARG);
    CHECK_CONTAINS(mpr_last_error(), "cannot write the trace file '/nonexistent-mpirpc-dir/trace.json'");
    CHECK(!mpr_trace_enabled());
    CHECK_ERR(mpr_trace_start(""), MPR_ERR_INVALID_ARG);
    CHECK_OK(mpr_trace_start(prefix));
    CHECK(mpr_trace_enabled());
    CHECK_ERR(mpr_trace_start(prefix), MPR_ERR_STATE);
    CHECK_CONTAINS(mpr_last_error(), "tracing is already on (mpr_trace_start");
    mpr_trace_end(); /* an end without a begin is ignored */
}

static void test_script(void) {
    int rank = mpitest_rank();
    mpr_trace_begin("script");
    if (rank == 0) {
        for (int64_t i = 0; i < 5; i++) {
            mpr_value_t *r = NULL;
            CHECK_OK(mpr_rpc_sync_take(mpr_to_rank(1), "tr_add", ints2(i, 10), 30, &r));
            int64_t v;
            CHECK_OK(mpr_value_get_int(r, &v));
            CHECK(v == i + 10);
            mpr_value_release(r);
        }
        mpr_value_t *args = ints2(2, 3);
        mpr_rref_t *rr = mpr_remote(mpr_to_rank(1), "tr_add", args, 30);
        mpr_value_release(args);
        CHECK(rr);
        mpr_value_t *v = NULL;
        CHECK_OK(mpr_rref_to_here(rr, 30, &v));
        int64_t x;
        CHECK_OK(mpr_value_get_int(v, &x));
        CHECK(x == 5);
        mpr_value_release(v);
        mpr_rref_release(rr);
        mpr_value_t *r = NULL;
        CHECK_ERR(mpr_rpc_sync_take(mpr_to_rank(2), "tr_fail", mpr_value_list_of(0), 30, &r), MPR_ERR_REMOTE);
        /* A future completed locally, with a callback: one "then" slice on this thread. */
        mpr_future_t *lf = mpr_future_create(), *child = mpr_future_then(lf, then_pass, NULL);
        CHECK(lf && child);
        CHECK_OK(mpr_future_set_result(lf, mpr_value_new_int(7)));
        CHECK_OK(mpr_future_get(child, 5, &r));
        CHECK_OK(mpr_value_get_int(r, &x));
        CHECK(x == 7);
        mpr_value_release(r);
        mpr_future_release(child);
        mpr_future_release(lf);
        /* A distributed backward through worker1: its piece runs on worker1's pool (nobody waits there). */
        int64_t ctx;
        mpr_tensor_t *t = mpr_tensor_empty(MPR_F64, 1, (int64_t[]){4});
        double *d = mpr_tensor_data(t);
        for (int i = 0; i < 4; i++) d[i] = i;
        CHECK_OK(mpr_set_requires_grad(t, true));
        CHECK_OK(mpr_dist_context_begin(&ctx));
        mpr_scope_begin();
        mpr_value_t *y = NULL;
        CHECK_OK(mpr_rpc_sync_take(mpr_to_rank(1), "tr_triple", mpr_value_list_of(1, mpr_value_new_tensor(t)), 30, &y));
        mpr_tensor_t *yt = NULL;
        CHECK_OK(mpr_value_get_tensor(y, &yt));
        mpr_tensor_t *loss = mpr_sum(yt);
        CHECK_OK(mpr_dist_backward(ctx, &loss, 1, false));
        mpr_value_release(y);
        mpr_tensor_t *g = NULL;
        CHECK_OK(mpr_dist_get_gradient(ctx, t, &g));
        CHECK(g && mpr_tensor_numel(g) == 4 && ((double *)mpr_tensor_data(g))[3] == 3.0);
        mpr_tensor_release(g);
        mpr_scope_end();
        mpr_tensor_release(t);
        CHECK_OK(mpr_dist_context_end(ctx));
    } else if (rank == 1) {
        mpr_future_t *f[4], *c[4];
        for (int64_t i = 0; i < 4; i++) {
            f[i] = mpr_rpc_async_take(mpr_to_rank(2), "tr_echo", ints2(i, i), 30);
            c[i] = mpr_future_then(f[i], then_pass, NULL); /* runs where the reply completes f[i] */
            CHECK(c[i]);
        }
        for (int i = 0; i < 4; i++) {
            mpr_value_t *r = NULL;
            CHECK_OK(mpr_future_get(c[i], MPR_WAIT_FOREVER, &r));
            mpr_value_release(r);
            mpr_future_release(c[i]);
            mpr_future_release(f[i]);
        }
    } else {
        for (int64_t i = 0; i < 3; i++) {
            mpr_value_t *r = NULL;
            CHECK_OK(mpr_rpc_sync_take(mpr_to_rank(0), "tr_add", ints2(i, 1), 30, &r));
            mpr_value_release(r);
        }
    }
    mpr_trace_end();
}

static const mpr_function_stats_t *find(const mpr_function_stats_t *s, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(s[i].name, name) == 0) return &s[i];
    return NULL;
}

/* Caller side of `name` on this rank: calls, errors, latencies; callee side: served, errors. */
static void expect_fn(const mpr_function_stats_t *s, size_t n, const char *name, uint64_t calls, uint64_t errors,
                      uint64_t served, uint64_t serve_errors) {
    const mpr_function_stats_t *f = find(s, n, name);
    if (!calls && !served) {
        CHECK(!f || (f->caller.calls == 0 && f->callee.calls == 0));
        return;
    }
    CHECK(f);
    if (f->caller.calls != calls || f->caller.errors != errors || f->caller.timeouts != 0 ||
        f->caller.latency.count != calls || f->callee.calls != served || f->callee.errors != serve_errors ||
        f->callee.latency.count != served) {
        fprintf(stderr,
                "[rank %d] %s: caller %llu calls %llu errors %llu timeouts %llu latencies, callee %llu served %llu "
                "errors %llu latencies; expected %llu/%llu and %llu/%llu\n",
                mpitest_rank(), name, (unsigned long long)f->caller.calls, (unsigned long long)f->caller.errors,
                (unsigned long long)f->caller.timeouts, (unsigned long long)f->caller.latency.count,
                (unsigned long long)f->callee.calls, (unsigned long long)f->callee.errors,
                (unsigned long long)f->callee.latency.count, (unsigned long long)calls, (unsigned long long)errors,
                (unsigned long long)served, (unsigned long long)serve_errors);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (calls) {
        CHECK(f->caller.bytes_out > 0 && f->caller.bytes_in > 0);
        CHECK(f->caller.latency.p50_s > 0 && f->caller.latency.p50_s <= f->caller.latency.p90_s &&
              f->caller.latency.p90_s <= f->caller.latency.p99_s && f->caller.latency.p99_s <= f->caller.latency.max_s);
    }
    if (served) CHECK(f->callee.bytes_in > 0 && f->callee.bytes_out > 0 && f->callee.latency.p50_s > 0);
}

static void test_stats(void) {
    int rank = mpitest_rank();
    mpr_function_stats_t *s;
    size_t n;
    CHECK_OK(mpr_get_function_stats(&s, &n));
    /* tr_add: 5 rpc + 1 remote from worker0 to worker1; 3 rpc from worker2 to worker0. */
    if (rank == 0) {
        expect_fn(s, n, "tr_add", 6, 0, 3, 0);
        expect_fn(s, n, "tr_fail", 1, 1, 0, 0);
        expect_fn(s, n, "tr_echo", 0, 0, 0, 0);
    } else if (rank == 1) {
        expect_fn(s, n, "tr_add", 0, 0, 6, 0);
        expect_fn(s, n, "tr_echo", 4, 0, 0, 0);
    } else {
        expect_fn(s, n, "tr_add", 3, 0, 0, 0);
        expect_fn(s, n, "tr_echo", 0, 0, 4, 0);
        expect_fn(s, n, "tr_fail", 0, 0, 1, 1);
    }
    free(s);
    mpr_peer_stats_t *p;
    CHECK_OK(mpr_get_peer_stats(&p, &n));
    CHECK(n == 3);
    /* At least the script's requests and replies each way: worker0 <-> worker1: 5 calls, a remote call
     * and the RRef's fetch; worker0 <-> worker2: 1 + 3 calls; worker1 <-> worker2: 4 calls (RRef control
     * messages come on top). Requests one way are replies the other way: the matrix is symmetric. */
    const uint64_t least[3][3] = {{0, 7, 4}, {7, 0, 4}, {4, 4, 0}};
    for (int r = 0; r < 3; r++) {
        CHECK(p[r].rank == r);
        CHECK(p[r].msgs_sent >= least[rank][r] && p[r].msgs_received >= least[rank][r]);
        CHECK((p[r].msgs_sent == 0) == (p[r].bytes_sent == 0));
        CHECK((p[r].msgs_received == 0) == (p[r].bytes_received == 0));
    }
    free(p);
    CHECK_OK(mpr_print_stats(stdout));
}

/* Write on request: the collective flush (rank 0 writes <prefix>.flush.json)
 * and each rank's own file (<prefix>.mid.rank<r>.json), then more work that
 * only the shutdown's file may hold. */
static void test_flush(void) {
    int rank = mpitest_rank();
    char path[4200];
    CHECK_ERR(mpr_trace_flush(""), MPR_ERR_INVALID_ARG);
    CHECK_ERR(mpr_trace_write_rank(""), MPR_ERR_INVALID_ARG);
    CHECK_ERR(mpr_trace_write_rank("/nonexistent-mpirpc-dir/x.json"), MPR_ERR_IO);
    CHECK_CONTAINS(mpr_last_error(), "cannot write the trace file '/nonexistent-mpirpc-dir/x.json'");
    mpr_trace_begin("before flush");
    mpr_trace_end();
    mpitest_barrier();
    snprintf(path, sizeof path, "%s.flush.json", prefix);
    CHECK_OK(mpr_trace_flush(path));
    snprintf(path, sizeof path, "%s.mid.rank%d.json", prefix, rank);
    CHECK_OK(mpr_trace_write_rank(path));
    mpr_trace_begin("after flush");
    for (int64_t i = 0; rank == 0 && i < 2; i++) {
        mpr_value_t *r = NULL;
        CHECK_OK(mpr_rpc_sync_take(mpr_to_rank(2), "tr_late", ints2(i, 1), 30, &r));
        mpr_value_release(r);
    }
    mpr_trace_end();
}

/* ---- checking the file (rank 0, after shutdown: no MPI) ---- */

static int failures;
#define EXPECT(cond, ...)                                                                         \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "trace check failed: %s: ", #cond);                                   \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fprintf(stderr, "\n");                                                                \
            failures++;                                                                           \
        }                                                                                         \
    } while (0)

static const char *str_of(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}
static double num_of(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static int count_named(const cJSON *events, const char *ph, const char *name, int pid) {
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, events) {
        if (strcmp(str_of(e, "ph"), ph) == 0 && strcmp(str_of(e, "name"), name) == 0 &&
            (pid < 0 || (int)num_of(e, "pid") == pid))
            n++;
    }
    return n;
}

/* The "X" slice on (pid, tid) that encloses ts with the latest start, or NULL. */
static const cJSON *enclosing(const cJSON *events, int pid, int tid, double ts) {
    const cJSON *best = NULL, *e;
    cJSON_ArrayForEach(e, events) {
        if (strcmp(str_of(e, "ph"), "X") || (int)num_of(e, "pid") != pid || (int)num_of(e, "tid") != tid) continue;
        double s = num_of(e, "ts"), d = num_of(e, "dur");
        if (s <= ts && ts <= s + d && (!best || s >= num_of(best, "ts")) && strcmp(str_of(e, "cat"), "user"))
            best = e;
    }
    return best;
}

static void check_counts(const cJSON *ev) {
    static const struct {
        const char *ph, *name;
        int per_rank[3];
    } expected[] = {
        {"X", "send call tr_add", {5, 0, 3}},
        {"X", "send remote_call tr_add", {1, 0, 0}},
        {"i", "recv call tr_add", {3, 5, 0}},
        {"X", "handle call tr_add", {3, 5, 0}},
        {"X", "handle remote_call tr_add", {0, 1, 0}},
        {"X", "complete return tr_add", {5, 0, 3}},
        {"X", "complete remote_ret tr_add", {1, 0, 0}},
        {"X", "send call tr_echo", {0, 4, 0}},
        {"X", "handle call tr_echo", {0, 0, 4}},
        {"X", "complete return tr_echo", {0, 4, 0}},
        {"X", "send call tr_fail", {1, 0, 0}},
        {"X", "handle call tr_fail", {0, 0, 1}},
        {"X", "complete exception tr_fail", {1, 0, 0}},
        {"X", "script", {1, 1, 1}},
        /* future callbacks: worker0's local future, worker1's 4 replies */
        {"X", "then", {1, 4, 0}},
        /* worker0's dist backward through worker1: routed by the progress thread, run on the pool */
        {"X", "send call tr_triple", {1, 0, 0}},
        {"X", "handle call tr_triple", {0, 1, 0}},
        {"X", "dist backward (root)", {1, 0, 0}},
        {"X", "send backward_autograd_req", {1, 0, 0}},
        {"X", "hand off backward_autograd_req", {0, 1, 0}},
        {"X", "handle backward_autograd_req", {0, 1, 0}},
        {"X", "dist backward (piece)", {0, 1, 0}},
        {"X", "send backward_autograd_resp", {0, 1, 0}},
        {"X", "complete backward_autograd_resp", {1, 0, 0}},
        /* after mpr_trace_flush */
        {"X", "before flush", {1, 1, 1}},
        {"X", "after flush", {1, 1, 1}},
        {"X", "send call tr_late", {2, 0, 0}},
        {"X", "handle call tr_late", {0, 0, 2}},
        {"X", "complete return tr_late", {2, 0, 0}},
    };
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++)
        for (int r = 0; r < 3; r++) {
            int got = count_named(ev, expected[i].ph, expected[i].name, r);
            EXPECT(got == expected[i].per_rank[r], "'%s' on rank %d: %d events, expected %d", expected[i].name, r,
                   got, expected[i].per_rank[r]);
        }
    int rref = 0, procs = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, ev) {
        rref += strcmp(str_of(e, "cat"), "rref") == 0;
        procs += strcmp(str_of(e, "name"), "process_name") == 0;
    }
    EXPECT(rref >= 2, "%d RRef protocol events (the RRef's user delete and its ack at least)", rref);
    EXPECT(procs == 3, "%d process_name entries", procs);
}

/* Every flow start has exactly one end with its id and vice versa; each lies
 * in a slice of the right kind; the end is not before the start. */
/* Every flow start has exactly one end (and the reverse), the end not before the start. */
static void check_flows_only(const cJSON *ev) {
    int starts = 0, ends = 0;
    const cJSON *s, *e;
    cJSON_ArrayForEach(s, ev) {
        bool start = strcmp(str_of(s, "ph"), "s") == 0;
        if (!start && strcmp(str_of(s, "ph"), "f")) continue;
        int other = 0;
        cJSON_ArrayForEach(e, ev) {
            if (strcmp(str_of(e, "ph"), start ? "f" : "s") == 0 && num_of(e, "id") == num_of(s, "id")) {
                other++;
                EXPECT(start ? num_of(e, "ts") >= num_of(s, "ts") : num_of(e, "ts") <= num_of(s, "ts"),
                       "flow %.0f ends before it starts", num_of(s, "id"));
            }
        }
        EXPECT(other == 1, "flow %s %.0f: %d matching %s", start ? "start" : "end", num_of(s, "id"), other,
               start ? "ends" : "starts");
        starts += start;
        ends += !start;
    }
    EXPECT(starts == ends && starts >= 2 * 6, "%d flow starts, %d ends", starts, ends);
}

static void check_flows(const cJSON *ev) {
    int starts = 0, matched = 0, backward_flows = 0;
    const cJSON *s;
    cJSON_ArrayForEach(s, ev) {
        if (strcmp(str_of(s, "ph"), "s")) continue;
        starts++;
        double id = num_of(s, "id");
        const cJSON *f = NULL, *e;
        int ends = 0;
        cJSON_ArrayForEach(e, ev) {
            if (strcmp(str_of(e, "ph"), "f") == 0 && num_of(e, "id") == id) f = e, ends++;
        }
        EXPECT(ends == 1, "flow %.0f: %d ends", id, ends);
        if (ends != 1) continue;
        matched++;
        bool reply = (long long)id % 2 == 1;
        const cJSON *from = enclosing(ev, (int)num_of(s, "pid"), (int)num_of(s, "tid"), num_of(s, "ts"));
        const cJSON *to = enclosing(ev, (int)num_of(f, "pid"), (int)num_of(f, "tid"), num_of(f, "ts"));
        EXPECT(from && strncmp(str_of(from, "name"), "send ", 5) == 0, "flow %.0f starts outside a send slice", id);
        EXPECT(to && strncmp(str_of(to, "name"), reply ? "complete " : "handle ", reply ? 9 : 7) == 0,
               "flow %.0f ends in '%s'", id, to ? str_of(to, "name") : "(no slice)");
        if (to && strcmp(str_of(to, "name"), "handle backward_autograd_req") == 0) {
            /* the arrow reaches the slice where the piece runs: it holds the piece's range */
            int pid = (int)num_of(to, "pid"), tid = (int)num_of(to, "tid"), pieces = 0;
            double t0 = num_of(to, "ts"), t1 = t0 + num_of(to, "dur");
            cJSON_ArrayForEach(e, ev) {
                if (strcmp(str_of(e, "name"), "dist backward (piece)") == 0 && (int)num_of(e, "pid") == pid &&
                    (int)num_of(e, "tid") == tid && num_of(e, "ts") >= t0 && num_of(e, "ts") <= t1)
                    pieces++;
            }
            EXPECT(pieces == 1, "backward flow %.0f ends in a slice holding %d pieces", id, pieces);
            backward_flows++;
        }
        EXPECT(num_of(f, "ts") >= num_of(s, "ts"), "flow %.0f ends at %.3f before it starts at %.3f", id,
               num_of(f, "ts"), num_of(s, "ts"));
        /* A call's flow has its reply's flow (id + 1), and the reply goes back to the caller. */
        if (!reply) {
            int back = 0;
            cJSON_ArrayForEach(e, ev) {
                if (strcmp(str_of(e, "ph"), "f") == 0 && num_of(e, "id") == id + 1 &&
                    num_of(e, "pid") == num_of(s, "pid"))
                    back++;
            }
            EXPECT(back == 1, "call flow %.0f: %d reply flows back to its caller", id, back);
        }
    }
    int ends = count_named(ev, "f", "rpc", -1);
    EXPECT(ends == matched, "%d flow ends, %d matched starts", ends, matched);
    /* The script's requests each expect a reply: 2 flows each at least (RRef control messages add more). */
    EXPECT(starts >= 2 * (5 + 1 + 1 + 4 + 3), "%d flow starts", starts);
    EXPECT(backward_flows == 1, "%d backward request flows", backward_flows);
}

static void check_clock(const cJSON *root) {
    const cJSON *other = cJSON_GetObjectItemCaseSensitive(root, "otherData");
    EXPECT(strcmp(str_of(other, "clock_sync"), "init+end") == 0, "clock_sync '%s'", str_of(other, "clock_sync"));
    EXPECT(num_of(other, "dropped_events") == 0, "%.0f events dropped", num_of(other, "dropped_events"));
    const cJSON *clock = cJSON_GetObjectItemCaseSensitive(other, "clock"), *c;
    EXPECT(cJSON_GetArraySize(clock) == 3, "clock entries: %d", cJSON_GetArraySize(clock));
    cJSON_ArrayForEach(c, clock) {
        /* One host: the true offset is 0, and a measured one is off by at most half its round trip. */
        for (int k = 0; k < 2; k++) {
            double off = num_of(c, k ? "init_offset_ns" : "end_offset_ns"), rtt = num_of(c, k ? "init_rtt_ns" : "end_rtt_ns");
            EXPECT(rtt >= 0 && off <= rtt / 2 + 1000 && -off <= rtt / 2 + 1000,
                   "rank %.0f: measured offset %.0f ns with round trip %.0f ns", num_of(c, "rank"), off, rtt);
        }
        EXPECT(strstr(str_of(c, "applied"), "same host"), "applied '%s'", str_of(c, "applied"));
    }
}

/* The parsed file at `path`, or NULL (said why). */
static cJSON *load(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "no trace file %s\n", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)len + 1);
    size_t got = fread(text, 1, (size_t)len, f);
    fclose(f);
    text[got] = '\0';
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) fprintf(stderr, "%s is not valid JSON near: %.60s\n", path, cJSON_GetErrorPtr());
    return root;
}

/* The start time of the only slice `name` of rank `pid` in `ev` (-1 if not exactly one). */
static double only_ts(const cJSON *ev, const char *name, int pid) {
    const cJSON *e, *found = NULL;
    int n = 0;
    cJSON_ArrayForEach(e, ev) {
        if (strcmp(str_of(e, "ph"), "X") == 0 && strcmp(str_of(e, "name"), name) == 0 && (int)num_of(e, "pid") == pid)
            found = e, n++;
    }
    return n == 1 ? num_of(found, "ts") : -1;
}

/* The flushed file: what the ranks' application threads recorded before
 * they entered mpr_trace_flush is there exactly; what other threads record
 * (handlers, completions) at most as often as in the end; nothing of what
 * came after; no flow twice. Each rank's own file: its events alone, in
 * rank 0's clock (the same times as in the merged file: one host). */
static void check_mid_files(const cJSON *final_ev) {
    char path[4200];
    snprintf(path, sizeof path, "%s.flush.json", prefix);
    cJSON *root = load(path);
    EXPECT(root, "no flushed file");
    if (!root) return;
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
    static const struct {
        const char *name;
        int per_rank[3];
        bool exact; /* recorded by the application thread before the flush */
    } flushed[] = {
        {"script", {1, 1, 1}, true},
        {"before flush", {1, 1, 1}, true},
        {"after flush", {0, 0, 0}, true},
        {"send call tr_add", {5, 0, 3}, true},
        {"send call tr_echo", {0, 4, 0}, true},
        {"send call tr_late", {0, 0, 0}, true},
        {"dist backward (root)", {1, 0, 0}, true},
        {"handle call tr_add", {3, 5, 0}, false},
        {"complete return tr_echo", {0, 4, 0}, false},
        {"then", {1, 4, 0}, false},
        {"handle backward_autograd_req", {0, 1, 0}, false},
        {"handle call tr_late", {0, 0, 0}, true},
    };
    for (size_t i = 0; i < sizeof flushed / sizeof flushed[0]; i++)
        for (int r = 0; r < 3; r++) {
            int got = count_named(ev, "X", flushed[i].name, r), want = flushed[i].per_rank[r];
            EXPECT(flushed[i].exact ? got == want : got <= want, "flushed '%s' on rank %d: %d events, expected %s%d",
                   flushed[i].name, r, got, flushed[i].exact ? "" : "at most ", want);
        }
    int flows = 0;
    const cJSON *s, *e;
    cJSON_ArrayForEach(s, ev) {
        if (strcmp(str_of(s, "ph"), "s") && strcmp(str_of(s, "ph"), "f")) continue;
        int same = 0;
        cJSON_ArrayForEach(e, ev) {
            same += strcmp(str_of(e, "ph"), str_of(s, "ph")) == 0 && num_of(e, "id") == num_of(s, "id");
        }
        EXPECT(same == 1, "flushed flow %.0f: %d '%s' events", num_of(s, "id"), same, str_of(s, "ph"));
        flows++;
    }
    EXPECT(flows >= 2 * 14, "%d flow events in the flushed file", flows);
    cJSON_Delete(root);
    for (int r = 0; r < 3; r++) {
        snprintf(path, sizeof path, "%s.mid.rank%d.json", prefix, r);
        root = load(path);
        EXPECT(root, "no file of rank %d", r);
        if (!root) continue;
        ev = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
        const cJSON *other = cJSON_GetObjectItemCaseSensitive(root, "otherData");
        EXPECT(strcmp(str_of(other, "reason"), "mpr_trace_write_rank") == 0, "rank %d's file: reason '%s'", r,
               str_of(other, "reason"));
        cJSON_ArrayForEach(e, ev) { EXPECT((int)num_of(e, "pid") == r, "rank %d's file holds pid %.0f", r, num_of(e, "pid")); }
        EXPECT(count_named(ev, "X", "script", r) == 1 && count_named(ev, "X", "after flush", r) == 0,
               "rank %d's file: %d 'script', %d 'after flush'", r, count_named(ev, "X", "script", r),
               count_named(ev, "X", "after flush", r));
        double mine = only_ts(ev, "before flush", r), merged = only_ts(final_ev, "before flush", r);
        EXPECT(mine >= 0 && fabs(mine - merged) < 1.0, "rank %d: 'before flush' at %.3f us in its file, %.3f merged",
               r, mine, merged);
        cJSON_Delete(root);
    }
}

static int check_file(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s.json", prefix);
    cJSON *root = load(path);
    if (!root) return 1;
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
    EXPECT(cJSON_IsArray(ev), "no traceEvents array");
    if (cJSON_IsArray(ev)) {
        check_counts(ev);
        check_flows(ev);
        check_mid_files(ev);
    }
    check_clock(root);
    printf("[%s] trace %s: %d events checked\n", failures ? "FAILED" : "ok", path, cJSON_GetArraySize(ev));
    cJSON_Delete(root);
    return failures != 0;
}

/* MPIRPC_TRACE names an unwritable place (and MPIRPC_STATS=1): init says so and goes on untraced. */
static int run_bad_env(void) {
    CHECK_OK(mpr_init(NULL));
    CHECK(!mpr_trace_enabled());
    int rank = mpitest_rank();
    mpr_value_t *r = NULL;
    CHECK_OK(mpr_rpc_sync_take(mpr_to_rank((rank + 1) % 3), "tr_add", ints2(rank, 1), 30, &r));
    mpr_value_release(r);
    mpr_function_stats_t *s; /* MPIRPC_STATS=1 turned counting on */
    size_t n;
    CHECK_OK(mpr_get_function_stats(&s, &n));
    const mpr_function_stats_t *f = find(s, n, "tr_add");
    CHECK(f && f->caller.calls == 1 && f->caller.latency.count == 1);
    free(s);
    CHECK_OK(mpr_shutdown(true)); /* prints the statistics tables, in rank order */
    if (rank == 2) printf("bad-env run ok\n");
    MPI_Finalize();
    return 0;
}

/* mpr_shutdown(false) on every rank: no merged file, each rank writes
 * <prefix>.rank<r>.json with its own events; laid together they hold every
 * call's send, handling and reply, each flow with one start and one end. */
static int run_nongraceful(void) {
    int rank = mpitest_rank();
    char path[4200];
    snprintf(path, sizeof path, "%s.rank%d.json", prefix, rank);
    remove(path);
    snprintf(path, sizeof path, "%s.json", prefix);
    if (rank == 0) remove(path);
    mpitest_barrier();
    CHECK_OK(mpr_init(NULL));
    mpr_trace_begin("ng script");
    for (int64_t i = 0; i < 2; i++) {
        mpr_value_t *r = NULL;
        CHECK_OK(mpr_rpc_sync_take(mpr_to_rank((rank + 1) % 3), "tr_add", ints2(i, rank), 30, &r));
        mpr_value_release(r);
    }
    mpr_trace_end();
    mpitest_barrier();
    CHECK_OK(mpr_shutdown(false)); /* writes this rank's file */
    mpitest_barrier();
    int rc = 0;
    if (rank == 0) {
        FILE *merged = fopen(path, "r");
        EXPECT(!merged, "a merged file %s after a non-graceful stop", path);
        if (merged) fclose(merged);
        cJSON *all = cJSON_CreateArray();
        for (int r = 0; r < 3; r++) {
            snprintf(path, sizeof path, "%s.rank%d.json", prefix, r);
            cJSON *root = load(path);
            EXPECT(root, "no file of rank %d", r);
            if (!root) continue;
            const cJSON *other = cJSON_GetObjectItemCaseSensitive(root, "otherData");
            EXPECT(strstr(str_of(other, "reason"), "non-graceful shutdown (mpr_shutdown(false))"),
                   "rank %d: reason '%s'", r, str_of(other, "reason"));
            EXPECT(strcmp(str_of(other, "clock_sync"), "init") == 0, "rank %d: clock_sync '%s'", r,
                   str_of(other, "clock_sync"));
            cJSON *ev = cJSON_DetachItemFromObjectCaseSensitive(root, "traceEvents"), *e;
            static const char *const names[] = {"ng script", "send call tr_add", "handle call tr_add",
                                                "complete return tr_add"};
            static const int want[] = {1, 2, 2, 2};
            for (int k = 0; k < 4; k++)
                EXPECT(count_named(ev, "X", names[k], r) == want[k], "rank %d's file: %d '%s', expected %d", r,
                       count_named(ev, "X", names[k], r), names[k], want[k]);
            while ((e = cJSON_DetachItemFromArray(ev, 0))) {
                EXPECT((int)num_of(e, "pid") == r, "rank %d's file holds pid %.0f", r, num_of(e, "pid"));
                cJSON_AddItemToArray(all, e);
            }
            cJSON_Delete(ev);
            cJSON_Delete(root);
        }
        check_flows_only(all);
        cJSON_Delete(all);
        printf("[%s] non-graceful per-rank traces checked\n", failures ? "FAILED" : "ok");
        rc = failures != 0;
    }
    MPI_Finalize();
    return rc;
}

/* The process exits (exit(0)) with the runtime running: its atexit writes
 * <prefix>.rank0.json (tests/tools/trace_check.py checks it). One rank: mpirun
 * treats a rank that exits without MPI_Finalize as a failure and stops the
 * others, so a second rank might not reach its exit handler. */
static int run_exit(void) {
    CHECK_OK(mpr_init(NULL));
    mpr_trace_begin("exit script");
    mpr_value_t *r = NULL;
    CHECK_OK(mpr_rpc_sync_take(mpr_to_rank(0), "tr_add", ints2(1, 2), 30, &r));
    mpr_value_release(r);
    mpr_trace_end();
    /* The handler's and the completion's slices are published by the pool and progress threads just
     * after the caller got its value (the exit handler writes what was published): give them time. */
    usleep(300000);
    exit(0);
}

int main(int argc, char **argv) {
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &(int){0});
    CHECK_OK(mpr_register_function("tr_add", fn_add, NULL));
    CHECK_OK(mpr_register_function("tr_echo", fn_echo, NULL));
    CHECK_OK(mpr_register_function("tr_fail", fn_fail, NULL));
    CHECK_OK(mpr_register_function("tr_triple", fn_triple, NULL));
    CHECK_OK(mpr_register_function("tr_late", fn_add, NULL));
    if (argc > 1 && strcmp(argv[1], "bad-env") == 0) return run_bad_env();
    prefix = getenv("MPIRPC_TRACE");
    if (!prefix || !prefix[0]) {
        fprintf(stderr, "usage: MPIRPC_TRACE=<path prefix> test_trace [nongraceful | exit]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (argc > 1 && strcmp(argv[1], "nongraceful") == 0) return run_nongraceful();
    if (argc > 1 && strcmp(argv[1], "exit") == 0) return run_exit();
    int rank = mpitest_rank();
    if (rank == 0) {
        char path[4096];
        snprintf(path, sizeof path, "%s.json", prefix);
        remove(path);
    }
    mpitest_barrier();
    mpr_stats_enable(true);
    CHECK_OK(mpr_init(NULL));
    CHECK(mpr_world_size() == 3);
    RUN_TEST(test_misuse);
    RUN_TEST(test_script);
    RUN_TEST(test_stats);
    RUN_TEST(test_flush);
    int passed = mpitest_passed;
    CHECK_OK(mpr_shutdown(true)); /* writes the trace */
    int rc = 0;
    if (rank == 0) {
        rc = check_file();
        if (!rc) printf("%d passed, 0 failed\n", passed + 1);
    }
    MPI_Finalize();
    return rc;
}
