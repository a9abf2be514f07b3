/* bench_rpc.c — RPC runtime benchmark, printing one JSON object per line.
 *
 * Run: mpirun -np 2 ./bench_rpc [--quick] [--lists | --rpc]
 * In one run, on the same pair of ranks: raw MPI ping-pong (8 B) and echo
 * (1 KiB .. 64 MiB) measured before mpirpc starts, then rpc_sync no-op round
 * trips (median, p99), pipelined rpc_async throughput, tensor echo round trips
 * for the same sizes, echo of lists of many small tensors (a model's biases
 * and norms) and of a real model's parameter list (ResNet-18: 62 float32
 * tensors, 11,689,512 parameters, from 64 to 2,359,296 elements; the shapes
 * of torchvision's resnet18(), listed below) next to a raw MPI echo of their
 * total bytes, the idle CPU of each rank over 2 s, and the ratios of mpirpc
 * to raw MPI. Rank 0 prints. --lists runs only the list and model lines
 * (tests/bench/param_echo_vs_torch.sh alternates them with PyTorch's RPC);
 * --rpc only the MPI ping-pong, rpc_sync no-op and pipelined lines
 * (tests/bench/trace_cost.sh alternates them with tracing off and on).
 * --list COUNTxBYTES [--reps N]: only that list echo (N timed echoes; for
 * perf record).
 * --pack: raw MPI only, the crossover that MPRI_BATCH_PACK_MAX_AVG sets: a
 * batch of 256 KiB or 1 MiB of tensors of 16 B .. 60 KiB, each in its own allocation,
 * echoed with the sender packing it (memcpy into a fresh buffer, as
 * transport.c does) or describing it with an hindexed datatype (built,
 * committed and freed per send, as tensor_batches.c does); the receiver
 * takes it into one contiguous buffer (a tensor block) either way; the
 * methods take turns round trip by round trip.
 * --mem: the receiver's peak memory for a list: rank 1's peak RSS growth
 * (VmHWM after the call minus VmRSS before it, peak reset through
 * /proc/self/clear_refs) while it receives lists of 16384 x 4 KiB, 65536 x
 * 256 B and 65536 x 16 B through a function that returns only their length,
 * next to the payload; first in a fresh process so freed memory of earlier
 * lines does not hide the growth. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "mpirpc/mpirpc.h"

static int rank;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double percentile(double *v, int n, double p) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

static void die(const char *what, mpr_err_t e) {
    fprintf(stderr, "bench_rpc: %s: %s: %s\n", what, mpr_error_name(e), mpr_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* ResNet-18's parameters in torchvision's order (named_parameters(); no
 * buffers): conv1, bn1, layer1..4 (BasicBlocks; layers 2-4 start with a
 * strided block and a 1x1 downsample), fc. tests/bench/torch_param_echo.py
 * builds the same list. */
typedef struct {
    int ndim;
    int64_t shape[4];
} param_shape_t;

static int resnet18_shapes(param_shape_t *out) {
    int n = 0;
#define CONV(o, i, k) (out[n++] = (param_shape_t){4, {o, i, k, k}})
#define BN(c) (out[n++] = (param_shape_t){1, {c}}, out[n++] = (param_shape_t){1, {c}})
    CONV(64, 3, 7);
    BN(64);
    static const int widths[4] = {64, 128, 256, 512};
    for (int l = 0; l < 4; l++) {
        int w = widths[l], in = l ? widths[l - 1] : 64;
        for (int b = 0; b < 2; b++) {
            CONV(w, b ? w : in, 3);
            BN(w);
            CONV(w, w, 3);
            BN(w);
            if (l > 0 && b == 0) {
                CONV(w, in, 1);
                BN(w);
            }
        }
    }
    out[n++] = (param_shape_t){2, {1000, 512}};
    out[n++] = (param_shape_t){1, {1000}};
#undef CONV
#undef BN
    return n;
}
#define RESNET18_TENSORS 62

static int64_t shape_numel(const param_shape_t *p) {
    int64_t n = 1;
    for (int i = 0; i < p->ndim; i++) n *= p->shape[i];
    return n;
}

/* Median seconds of `reps` rpc_sync echoes of `list` (after 2 warm-ups). */
static double echo_list(mpr_value_t *list, size_t expect_len, int reps) {
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_retain(list));
    double *et = malloc(sizeof *et * (size_t)reps);
    for (int i = -2; i < reps; i++) {
        mpr_value_t *r;
        double t1 = MPI_Wtime();
        mpr_err_t e = mpr_rpc_sync(mpr_to_rank(1), "echo", args, 0, &r);
        if (e) die("list echo", e);
        if (i >= 0) et[i] = MPI_Wtime() - t1;
        if (mpr_value_list_len(r) != expect_len) die("list echo length", MPR_ERR_DECODE);
        mpr_value_release(r);
    }
    double med = percentile(et, reps, 0.5);
    free(et);
    mpr_value_release(args);
    return med;
}

static mpr_err_t fn_noop(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    *result = NULL;
    return MPR_OK;
}

static mpr_err_t fn_echo(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    *result = mpr_value_retain(mpr_value_list_get(args, 0));
    return *result ? MPR_OK : mpr_last_error_code();
}

/* A status line of /proc/self/status in KiB (VmRSS, VmHWM); -1 if absent. */
static long proc_status_kib(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kib = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0 && line[n] == ':') {
            kib = strtol(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return kib;
}

/* --mem: reset the peak RSS to the current RSS, return the current RSS. */
static mpr_err_t fn_mem_reset(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f); /* 5: reset the peak RSS (Linux >= 4.0) */
        fclose(f);
    }
    *result = mpr_value_new_int(proc_status_kib("VmRSS"));
    return MPR_OK;
}

static mpr_err_t fn_mem_peak(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    *result = mpr_value_new_int(proc_status_kib("VmHWM"));
    return MPR_OK;
}

static mpr_err_t fn_list_len(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    *result = mpr_value_new_int((int64_t)mpr_value_list_len(mpr_value_list_get(args, 0)));
    return MPR_OK;
}

static int64_t call_int(const char *fn, mpr_value_t *args) {
    mpr_value_t *r;
    mpr_err_t e = mpr_rpc_sync(mpr_to_rank(1), fn, args, 0, &r);
    if (e) die(fn, e);
    int64_t v = 0;
    if ((e = mpr_value_get_int(r, &v))) die(fn, e);
    mpr_value_release(r);
    return v;
}

/* --mem: rank 1's peak RSS growth while it receives a list of `count`
 * tensors of `bytes` each (rank 0 prints). */
static void list_memory(int count, int bytes) {
    mpr_value_t *list = mpr_value_new_list();
    int64_t shape[1] = {bytes};
    for (int i = 0; i < count; i++) {
        mpr_tensor_t *x = mpr_tensor_empty(MPR_U8, 1, shape);
        memset(mpr_tensor_data(x), i, (size_t)bytes);
        mpr_value_list_append(list, mpr_value_new_tensor(x));
        mpr_tensor_release(x);
    }
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_retain(list));
    int64_t rss_kib = call_int("mem_reset", NULL);
    if (call_int("list_len", args) != count) die("list_len", MPR_ERR_DECODE);
    int64_t peak_kib = call_int("mem_peak", NULL);
    double payload = (double)count * bytes, grew = (double)(peak_kib - rss_kib) * 1024;
    printf("{\"name\":\"list_recv_memory\",\"tensors\":%d,\"bytes_each\":%d,\"payload_bytes\":%.0f,"
           "\"peak_rss_growth_bytes\":%.0f,\"ratio_vs_payload\":%.2f,\"bytes_per_tensor_over_payload\":%.0f}\n",
           count, bytes, payload, grew, grew / payload, (grew - payload) / count);
    fflush(stdout);
    mpr_value_release(args);
    mpr_value_release(list);
}

/* --pack: one batch of `k` tensors of `bytes` each, sent to `peer` packed
 * (memcpy into `pack`, a buffer kept warm as mpri_host_alloc's cache keeps
 * it: method 0; into a fresh malloc: method 3), through an hindexed datatype
 * (1), or from one contiguous buffer (2); received into one contiguous
 * buffer. */
static void batch_send(int method, char **parts, int k, int bytes, int peer, char *pack) {
    if (method == 0 || method == 3) {
        char *to = method == 3 ? calloc((size_t)k, (size_t)bytes) : pack; /* calloc: as fresh, no memset */
        for (int i = 0; i < k; i++) memcpy(to + (size_t)i * bytes, parts[i], (size_t)bytes);
        MPI_Send(to, k * bytes, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
        if (method == 3) free(to);
    } else if (method == 1) {
        int *lens = malloc(sizeof *lens * (size_t)k);
        MPI_Aint *displs = malloc(sizeof *displs * (size_t)k);
        for (int i = 0; i < k; i++) {
            lens[i] = bytes;
            MPI_Get_address(parts[i], &displs[i]);
        }
        MPI_Datatype type;
        MPI_Type_create_hindexed(k, lens, displs, MPI_BYTE, &type);
        MPI_Type_commit(&type);
        MPI_Send(MPI_BOTTOM, 1, type, peer, 1, MPI_COMM_WORLD);
        MPI_Type_free(&type);
        free(lens);
        free(displs);
    } else {
        MPI_Send(parts[k], k * bytes, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
    }
}

static void pack_crossover(int quick) {
    static const int each[] = {16, 64, 256, 1024, 4096, 16384, 61440};
    const int reps = quick ? 30 : 200;
    for (size_t s = 0; s < 2 * sizeof each / sizeof each[0]; s++) {
        int total = s % 2 ? 1 << 20 : 256 << 10, bytes = each[s / 2], k = total / bytes;
        char **parts = malloc(sizeof *parts * (size_t)(k + 1));
        for (int i = 0; i < k; i++) { /* separate allocations, as separate storages */
            parts[i] = aligned_alloc(64, ((size_t)bytes + 63) / 64 * 64);
            memset(parts[i], i, (size_t)bytes);
        }
        parts[k] = malloc((size_t)k * bytes); /* the receive buffer (and method 2's send) */
        char *pack = malloc((size_t)k * bytes);
        memset(pack, 0, (size_t)k * bytes);
        double med[4];
        double *t = malloc(sizeof *t * 4 * (size_t)reps);
        MPI_Barrier(MPI_COMM_WORLD);
        /* The methods take turns round trip by round trip: a loaded
         * machine's slow spells hit them alike. */
        for (int i = -3; i < reps; i++)
            for (int m = 0; m < 4; m++) {
                double t0 = MPI_Wtime();
                if (rank == 0) {
                    batch_send(m, parts, k, bytes, 1, pack);
                    MPI_Recv(parts[k], k * bytes, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else if (rank == 1) {
                    MPI_Recv(parts[k], k * bytes, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    batch_send(m, parts, k, bytes, 0, pack);
                }
                if (i >= 0) t[m * reps + i] = MPI_Wtime() - t0;
            }
        for (int m = 0; m < 4; m++) med[m] = percentile(t + m * reps, reps, 0.5);
        if (rank == 0) {
            printf("{\"name\":\"batch_pack_crossover\",\"bytes_each\":%d,\"tensors\":%d,\"pack_us\":%.3f,"
                   "\"hindexed_us\":%.3f,\"contiguous_us\":%.3f,\"pack_fresh_buffer_us\":%.3f,"
                   "\"hindexed_over_pack\":%.2f}\n",
                   bytes, k, med[0] * 1e6, med[1] * 1e6, med[2] * 1e6, med[3] * 1e6, med[1] / med[0]);
            fflush(stdout);
        }
        free(t);
        free(pack);
        for (int i = 0; i <= k; i++) free(parts[i]);
        free(parts);
    }
}

/* Raw MPI round trip of `bytes` between ranks 0 and 1; median seconds. */
static double mpi_round_trip(char *buf, int bytes, int reps) {
    double *t = malloc(sizeof *t * (size_t)reps);
    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = -reps / 10 - 1; i < reps; i++) {
        double t0 = MPI_Wtime();
        if (rank == 0) {
            MPI_Send(buf, bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
            MPI_Recv(buf, bytes, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == 1) {
            MPI_Recv(buf, bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
        }
        if (i >= 0) t[i] = MPI_Wtime() - t0;
    }
    double med = percentile(t, reps, 0.5);
    free(t);
    return med;
}

/* A barrier that sleeps instead of spinning: Open MPI's MPI_Barrier busy-polls,
 * and a rank parked in it would steal a core from the ranks being measured. */
static void sleepy_barrier(void) {
    MPI_Request req;
    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    for (int done = 0;;) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (done) return;
        usleep(200);
    }
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

int main(int argc, char **argv) {
    int quick = 0, lists_only = 0, rpc_only = 0, pack_only = 0, mem_only = 0, one_count = 0, one_bytes = 0,
        list_reps = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) quick = 1;
        else if (strcmp(argv[i], "--lists") == 0) lists_only = 1;
        else if (strcmp(argv[i], "--rpc") == 0) rpc_only = 1;
        else if (strcmp(argv[i], "--pack") == 0) pack_only = 1;
        else if (strcmp(argv[i], "--mem") == 0) mem_only = 1;
        else if (strcmp(argv[i], "--list") == 0 && i + 1 < argc &&
                 sscanf(argv[++i], "%dx%d", &one_count, &one_bytes) == 2 && one_count > 0 && one_bytes > 0)
            lists_only = 1;
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc && (list_reps = atoi(argv[++i])) > 0)
            ;
        else {
            fprintf(stderr, "usage: mpirun -np 2 bench_rpc [--quick] [--lists | --rpc | --pack | --mem | "
                            "--list COUNTxBYTES [--reps N]]\n");
            return 2;
        }
    }
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    int size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2) {
        fprintf(stderr, "bench_rpc: run with mpirun -np 2\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (pack_only) {
        pack_crossover(quick);
        MPI_Finalize();
        return 0;
    }
    static const int sizes[] = {1 << 10, 1 << 20, 16 << 20, 64 << 20};
    enum { NSIZES = 4 };
    double mpi_echo_s[NSIZES];
    /* lists of many small tensors: count x bytes each */
    int list_counts[] = {256, 4096}, list_bytes[] = {1 << 10, 256};
    int NLISTS = 2;
    if (one_count) {
        list_counts[0] = one_count;
        list_bytes[0] = one_bytes;
        NLISTS = 1;
    }
    if (!list_reps) list_reps = quick ? 20 : 200;
    double mpi_list_s[2], list_s[2];
    param_shape_t model[RESNET18_TENSORS];
    int model_n = resnet18_shapes(model);
    int64_t model_bytes = 0;
    for (int i = 0; i < model_n; i++) model_bytes += shape_numel(&model[i]) * 4;
    int model_reps = quick ? 5 : 20;
    char *buf = malloc(64 << 20);
    memset(buf, 1, 64 << 20);
    if (mem_only) {
        mpr_err_t e;
        if ((e = mpr_register_function("mem_reset", fn_mem_reset, NULL)) ||
            (e = mpr_register_function("mem_peak", fn_mem_peak, NULL)) ||
            (e = mpr_register_function("list_len", fn_list_len, NULL)) || (e = mpr_init(NULL)))
            die("mpr_init", e);
        sleepy_barrier();
        if (rank == 0) {
            list_memory(16384, 4096);
            list_memory(65536, 256);
            list_memory(65536, 16);
        }
        sleepy_barrier();
        free(buf);
        if ((e = mpr_shutdown(true))) die("shutdown", e);
        mpr_registry_clear();
        MPI_Finalize();
        return 0;
    }

    /* ---- raw MPI, before mpirpc starts (nothing else polls) ---- */
    double mpi_pp = 0;
    if (!lists_only) {
        mpi_pp = mpi_round_trip(buf, 8, quick ? 2000 : 20000);
        for (int s = 0; !rpc_only && s < NSIZES; s++)
            mpi_echo_s[s] = mpi_round_trip(buf, sizes[s], sizes[s] <= (1 << 20) ? (quick ? 50 : 500) : (quick ? 3 : 20));
    }
    for (int l = 0; !rpc_only && l < NLISTS; l++)
        mpi_list_s[l] = mpi_round_trip(buf, list_counts[l] * list_bytes[l], quick ? 50 : 500);
    double mpi_model_s = rpc_only || one_count ? 0 : mpi_round_trip(buf, (int)model_bytes, model_reps);
    if (rank == 0 && !lists_only) {
        printf("{\"name\":\"mpi_pingpong\",\"bytes\":8,\"median_us\":%.3f}\n", mpi_pp * 1e6);
        for (int s = 0; !rpc_only && s < NSIZES; s++)
            printf("{\"name\":\"mpi_echo\",\"bytes\":%d,\"median_us\":%.3f,\"gbps\":%.3f}\n", sizes[s],
                   mpi_echo_s[s] * 1e6, 2.0 * sizes[s] / mpi_echo_s[s] / 1e9);
        fflush(stdout);
    }

    /* ---- mpirpc ---- */
    mpr_err_t e;
    if ((e = mpr_register_function("noop", fn_noop, NULL))) die("register", e);
    if ((e = mpr_register_function("echo", fn_echo, NULL))) die("register", e);
    if ((e = mpr_init(NULL))) die("mpr_init", e);

    int n_sync = quick ? 2000 : 20000;
    double *t = malloc(sizeof *t * (size_t)n_sync);
    double rpc_med = 0, rpc_p99 = 0, calls_per_s = 0;
    double echo_s[NSIZES];
    sleepy_barrier();
    if (rank == 0 && !lists_only) {
        mpr_value_t *r;
        for (int i = 0; i < n_sync / 10; i++) { /* warm up */
            if ((e = mpr_rpc_sync(mpr_to_rank(1), "noop", NULL, 0, &r))) die("rpc_sync", e);
            mpr_value_release(r);
        }
        for (int i = 0; i < n_sync; i++) {
            double t0 = MPI_Wtime();
            if ((e = mpr_rpc_sync(mpr_to_rank(1), "noop", NULL, 0, &r))) die("rpc_sync", e);
            t[i] = MPI_Wtime() - t0;
            mpr_value_release(r);
        }
        rpc_med = percentile(t, n_sync, 0.5);
        rpc_p99 = percentile(t, n_sync, 0.99);
        printf("{\"name\":\"rpc_sync_noop\",\"median_us\":%.3f,\"p99_us\":%.3f}\n", rpc_med * 1e6, rpc_p99 * 1e6);
        fflush(stdout);

        /* pipelined: keep a window of calls in flight */
        int n_async = quick ? 20000 : 200000, window = 256;
        mpr_future_t **win = calloc((size_t)window, sizeof *win);
        double t0 = MPI_Wtime();
        for (int i = 0; i < n_async; i++) {
            mpr_future_t **slot = &win[i % window];
            if (*slot) {
                if ((e = mpr_future_wait(*slot, 0)) || (e = mpr_future_error(*slot))) die("rpc_async", e);
                mpr_future_release(*slot);
            }
            *slot = mpr_rpc_async(mpr_to_rank(1), "noop", NULL, 0);
        }
        for (int i = 0; i < window; i++) {
            if (win[i] && ((e = mpr_future_wait(win[i], 0)) || (e = mpr_future_error(win[i])))) die("rpc_async", e);
            mpr_future_release(win[i]);
        }
        calls_per_s = n_async / (MPI_Wtime() - t0);
        free(win);
        printf("{\"name\":\"rpc_async_pipelined\",\"calls_per_s\":%.0f,\"window\":%d}\n", calls_per_s, window);
        fflush(stdout);

        for (int s = 0; !rpc_only && s < NSIZES; s++) {
            int64_t shape[1] = {sizes[s] / 4};
            mpr_tensor_t *x = mpr_tensor_empty(MPR_F32, 1, shape);
            memset(mpr_tensor_data(x), 1, (size_t)sizes[s]);
            mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_tensor(x));
            int reps = sizes[s] <= (1 << 20) ? (quick ? 50 : 500) : (quick ? 3 : 20);
            double *et = malloc(sizeof *et * (size_t)reps);
            for (int i = -2; i < reps; i++) {
                double t1 = MPI_Wtime();
                if ((e = mpr_rpc_sync(mpr_to_rank(1), "echo", args, 0, &r))) die("echo", e);
                if (i >= 0) et[i] = MPI_Wtime() - t1;
                mpr_value_release(r);
            }
            echo_s[s] = percentile(et, reps, 0.5);
            free(et);
            mpr_value_release(args);
            mpr_tensor_release(x);
            printf("{\"name\":\"tensor_echo\",\"bytes\":%d,\"median_us\":%.3f,\"gbps\":%.3f}\n", sizes[s],
                   echo_s[s] * 1e6, 2.0 * sizes[s] / echo_s[s] / 1e9);
            fflush(stdout);
        }
    }
    if (rank == 0 && !rpc_only) {
        for (int l = 0; l < NLISTS; l++) {
            mpr_value_t *list = mpr_value_new_list();
            int64_t shape[1] = {list_bytes[l]};
            for (int i = 0; i < list_counts[l]; i++) {
                mpr_tensor_t *x = mpr_tensor_empty(MPR_U8, 1, shape);
                memset(mpr_tensor_data(x), i, (size_t)list_bytes[l]);
                mpr_value_list_append(list, mpr_value_new_tensor(x));
                mpr_tensor_release(x);
            }
            list_s[l] = echo_list(list, (size_t)list_counts[l], list_reps);
            mpr_value_release(list);
            printf("{\"name\":\"tensor_list_echo\",\"tensors\":%d,\"bytes_each\":%d,\"median_us\":%.3f,"
                   "\"mpi_echo_same_bytes_us\":%.3f,\"ratio_vs_mpi\":%.2f}\n",
                   list_counts[l], list_bytes[l], list_s[l] * 1e6, mpi_list_s[l] * 1e6, list_s[l] / mpi_list_s[l]);
            fflush(stdout);
        }
        /* A real model's parameters, as a parameter server sends them. */
        mpr_value_t *list = one_count ? NULL : mpr_value_new_list();
        for (int i = 0; list && i < model_n; i++) {
            mpr_tensor_t *x = mpr_tensor_empty(MPR_F32, model[i].ndim, model[i].shape);
            memset(mpr_tensor_data(x), 1, mpr_tensor_nbytes(x));
            mpr_value_list_append(list, mpr_value_new_tensor(x));
            mpr_tensor_release(x);
        }
        double model_s = list ? echo_list(list, (size_t)model_n, model_reps) : 0;
        mpr_value_release(list);
        if (!one_count)
            printf("{\"name\":\"param_list_echo\",\"model\":\"resnet18\",\"tensors\":%d,\"bytes\":%lld,"
                   "\"median_us\":%.3f,\"mpi_echo_same_bytes_us\":%.3f,\"ratio_vs_mpi\":%.2f}\n",
                   model_n, (long long)model_bytes, model_s * 1e6, mpi_model_s * 1e6, model_s / mpi_model_s);
        fflush(stdout);
    }
    sleepy_barrier(); /* the other ranks wait here without spinning */

    if (lists_only || rpc_only) {
        if (rpc_only && rank == 0)
            printf("{\"name\":\"ratios\",\"rpc_sync_noop_vs_mpi_pingpong\":%.2f}\n", rpc_med / mpi_pp);
        free(t);
        free(buf);
        if ((e = mpr_shutdown(true))) die("shutdown", e);
        mpr_registry_clear();
        MPI_Finalize();
        return 0;
    }

    /* ---- idle CPU: both ranks initialized, no traffic, 2 s ---- */
    sleep(1); /* let the progress threads reach their idle back-off */
    double c0 = cpu_seconds(), w0 = MPI_Wtime();
    sleep(2);
    double idle_pct = 100.0 * (cpu_seconds() - c0) / (MPI_Wtime() - w0);
    double max_idle = 0;
    MPI_Reduce(&idle_pct, &max_idle, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("{\"name\":\"idle_cpu\",\"cpu_percent\":%.2f,\"seconds\":2}\n", max_idle);
        printf("{\"name\":\"ratios\",\"rpc_sync_noop_vs_mpi_pingpong\":%.2f,\"tensor_echo_64MiB_bw_vs_mpi\":%.3f,"
               "\"tensor_echo_16MiB_bw_vs_mpi\":%.3f,\"tensor_echo_1MiB_bw_vs_mpi\":%.3f}\n",
               rpc_med / mpi_pp, mpi_echo_s[3] / echo_s[3], mpi_echo_s[2] / echo_s[2], mpi_echo_s[1] / echo_s[1]);
        fflush(stdout);
    }
    free(t);
    free(buf);
    if ((e = mpr_shutdown(true))) die("shutdown", e);
    mpr_registry_clear();
    MPI_Finalize();
    return 0;
}
