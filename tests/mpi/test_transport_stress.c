/* test_transport_stress.c — the transport under stress, in three shapes
 * (argv[1], default storm; optional argv[2] = seconds, default 3 for CI):
 *
 *   storm    (np >= 2) every rank runs 4 threads of mixed calls to random
 *            peers: small rpc_sync, rpc_async carrying 4 x 256 KiB or
 *            64 x 4 KiB tensors, nested calls. A watchdog thread fails the
 *            job if no call completed on its rank for 5 s while calls were
 *            outstanding (a job-wide stall), and every result is checked;
 *            after 2 s and 4 s of a stall every rank writes its runtime's
 *            state (mpr_debug_dump) to stderr, for the log of a failure.
 *            A stall seen to be the kernel's (a rank's mmap waiting on its
 *            anon_vma lock while a reverse-map walk holds it: see
 *            kernel_mm_stall_seen) is reported and counted
 *            ("kernel_mm_stalls"), and fails only past 60 s.
 *   timeouts (np 2) rank 0's threads call a function that sleeps 0-6 ms
 *            with random timeouts of 0.1-5 ms, some carrying 1 MiB; every
 *            call must return with the right result or MPR_ERR_TIMEOUT, within
 *            its timeout + LATE_LIMIT_MS (plus the scheduler noise measured
 *            meanwhile); how many exceeded DEADLINE_SLACK_MS is reported.
 *   stop     (np 2) rank 0 streams rpc_async calls with 4 x 1 MiB and
 *            200 x 60 KiB tensors to rank 1, which stops non-gracefully
 *            mid-stream (after serving two); every call of rank 0 must be
 *            issued without blocking and finish (result or error) by its 2 s
 *            timeout + LATE_LIMIT_MS (a send to the stopped peer blocked the
 *            caller for good before).
 *
 * Each prints one JSON line (calls, calls/s, longest call, longest time
 * without a completed call). Run longer by hand, e.g.
 *   mpiexec -n 4 ./test_transport_stress storm 60 */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <unistd.h>

#include "mpitest.h"

#define THREADS 4

/* Under AddressSanitizer, a 16 MiB quarantine (default 256 MiB) lets the
 * storm's freed tensors be reused once it is full, so the ranks stop mapping
 * new memory a second into the run: measured (perf, syscalls:sys_enter_mmap,
 * 4 ranks) ~2,600 mmap/s through the storm with the default, falling to
 * under 40/s with 16 MiB. Each such mmap may wait on the kernel's anon_vma
 * lock, which the machine's kdamond can hold for seconds (above
 * list_mm_lock_holders); fewer mmaps, fewer frozen ranks. Use-after-free
 * is still caught within the last 16 MiB freed. ASAN_OPTIONS overrides it. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "quarantine_size_mb=16"; }
#define STALL_LIMIT_S 5.0
#define KERNEL_STALL_MAX_S 60.0 /* a stall the kernel causes fails the test past this */
#define STALL_DUMP_S 2.0 /* every rank dumps its state after this long a stall, and twice that
                          * (STRESS_DUMP_AFTER_S overrides it, to look at shorter stalls by hand) */
static double dump_after_s = STALL_DUMP_S;
#define DEADLINE_SLACK_MS 50.0
/* A loaded machine (2 shared cores, other jobs) can deschedule any thread
 * for a while: a scheduler-noise thread measures the longest oversleep of a
 * 1 ms nanosleep during the run, and the timeouts shape's bound is checked
 * as DEADLINE_SLACK_MS beyond twice that noise. (The bug this guards
 * against was seconds: a 3 ms timeout reported after 2.46 s.) */
#define LATE_LIMIT_MS 500.0 /* the stop shape's calls: a stall or hang shows as seconds */

static int rank, size;
static double run_s;
static atomic_long calls_done, calls_outstanding;
static atomic_int stop_watchdog;
static _Atomic double longest_call_s, longest_stall_s;
static atomic_int kernel_stalls; /* stalls seen to be the kernel's (kernel_mm_stall_seen) */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void note_call(double seconds) {
    atomic_fetch_add(&calls_done, 1);
    double prev = atomic_load(&longest_call_s);
    while (seconds > prev && !atomic_compare_exchange_weak(&longest_call_s, &prev, seconds)) {
    }
}

static mpr_err_t fn_add(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t a, b;
    mpr_err_t e;
    if ((e = mpr_args_int(args, 0, &a)) || (e = mpr_args_int(args, 1, &b))) return e;
    *result = mpr_value_new_int(a + b);
    return MPR_OK;
}

/* Sum of the first byte of every tensor in the list argument 0. */
static atomic_long first_bytes_served;

static mpr_err_t fn_first_bytes(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    atomic_fetch_add(&first_bytes_served, 1);
    const mpr_value_t *list = mpr_value_list_get(args, 0);
    int64_t sum = 0;
    for (size_t i = 0; i < mpr_value_list_len(list); i++) {
        mpr_tensor_t *t;
        mpr_err_t e = mpr_value_get_tensor(mpr_value_list_get(list, i), &t);
        if (e) return e;
        sum += ((const uint8_t *)mpr_tensor_data(t))[0];
    }
    *result = mpr_value_new_int(sum);
    return MPR_OK;
}

/* add(a, b) on the next rank, called from here (a nested call). */
static mpr_err_t fn_nested_add(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int me = mpitest_rank(), n = mpr_world_size();
    return mpr_rpc_sync(mpr_to_rank((me + 1) % n), "add", args, 60, result);
}

/* Sleep args[0] microseconds, return args[1]. */
static mpr_err_t fn_sleep_echo(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t us, v;
    mpr_err_t e;
    if ((e = mpr_args_int(args, 0, &us)) || (e = mpr_args_int(args, 1, &v))) return e;
    usleep((useconds_t)us);
    *result = mpr_value_new_int(v);
    return MPR_OK;
}

/* A list of n U8 tensors of `bytes` each, tensor i filled with (seed + i) & 0xff. */
static mpr_value_t *tensor_list(int n, int64_t bytes, int seed, int64_t *first_sum) {
    mpr_value_t *list = mpr_value_new_list();
    *first_sum = 0;
    for (int i = 0; i < n; i++) {
        mpr_tensor_t *t = mpr_tensor_empty(MPR_U8, 1, &bytes);
        CHECK(t != NULL);
        memset(mpr_tensor_data(t), (seed + i) & 0xff, (size_t)bytes);
        *first_sum += (seed + i) & 0xff;
        CHECK_OK(mpr_value_list_append(list, mpr_value_new_tensor(t)));
        mpr_tensor_release(t);
    }
    return list;
}

/* ---- storm ---- */

/* A stalled rank has every rank write mpr_debug_dump to stderr (at 2 s and
 * at 4 s), so that a failure in CI shows what each rank waited for: it
 * signals the others (their pids gathered at the start), whose watchdogs
 * dump. */
static pid_t *rank_pids;
static volatile sig_atomic_t dump_requested;

static void on_dump_signal(int sig) {
    (void)sig;
    dump_requested = 1;
}

/* The first line of a /proc file, into buf (empty if unreadable). */
static void read_line(const char *path, char *buf, size_t len) {
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (!fgets(buf, (int)len, f)) buf[0] = 0;
    fclose(f);
    buf[strcspn(buf, "\n")] = 0;
}

/* The file mapped at `addr` in this process (from /proc/self/maps), e.g.
 * the library whose lock a thread waits on; "" if none or anonymous. */
static void mapping_of(unsigned long addr, char *name, size_t len) {
    name[0] = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi, pgoff;
        int off = 0;
        if (sscanf(line, "%lx-%lx %*s %lx %*s %*s %n", &lo, &hi, &pgoff, &off) < 3 || addr < lo || addr >= hi)
            continue;
        line[strcspn(line, "\n")] = 0;
        /* A file's offset: its symbol is found offline (nm, or gdb's info symbol). */
        snprintf(name, len, "%s +0x%lx", off > 0 && line[off] ? line + off : "(anonymous)", addr - lo + pgoff);
        break;
    }
    fclose(f);
}

/* Where each thread of process `proc` ("self" or a pid) is, as the kernel
 * sees it: a thread blocked in a system call shows its wait channel and
 * syscall number, and its kernel stack (readable as root) when it waits
 * elsewhere than a futex, sleep or poll — or, with `running_stacks`, when it
 * is runnable (preempted inside the kernel, it shows where). A thread of
 * this process reading a peer's memory (process_vm_readv, Open MPI's
 * single copy) has the peer's threads listed too, with running_stacks: the
 * peer's thread holding up the read (its mmap_lock) is among them. Nothing
 * here stops the threads. Returns the pid a thread of `proc` reads, or 0. */
static long list_threads(const char *proc, bool running_stacks) {
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%s/task", proc);
    DIR *d = opendir(dir);
    if (!d) return 0;
    long read_pid = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[400], comm[64], wchan[128], sys[256], stat[512];
        snprintf(path, sizeof path, "%s/%s/comm", dir, e->d_name);
        read_line(path, comm, sizeof comm);
        snprintf(path, sizeof path, "%s/%s/wchan", dir, e->d_name);
        read_line(path, wchan, sizeof wchan);
        snprintf(path, sizeof path, "%s/%s/syscall", dir, e->d_name);
        read_line(path, sys, sizeof sys);
        snprintf(path, sizeof path, "%s/%s/stat", dir, e->d_name);
        read_line(path, stat, sizeof stat);
        const char *st = strrchr(stat, ')');
        char state = st && st[1] ? st[2] : '?';
        char where[256] = "";
        unsigned long nr = 0, arg0 = 0;
        if (sscanf(sys, "%lu %lx", &nr, &arg0) == 2 && nr == 202 && !strcmp(proc, "self")) { /* whose futex? */
            char lib[200];
            mapping_of(arg0, lib, sizeof lib);
            snprintf(where, sizeof where, " on a futex at 0x%lx in %s", arg0, lib[0] ? lib : "?");
        }
        if (nr == 310 && arg0 > 0) { /* process_vm_readv(pid, ...) */
            read_pid = (long)arg0;
            snprintf(where, sizeof where, " reading the memory of pid %lu", arg0);
        }
        fprintf(stderr, "  [rank %d%s%s] thread %s (%s): state %c, wchan %s, syscall %.12s%s\n", rank,
                strcmp(proc, "self") ? ", peer pid " : "", strcmp(proc, "self") ? proc : "", e->d_name, comm, state,
                wchan[0] ? wchan : "-", sys, where);
        bool ordinary = strstr(wchan, "futex") || strstr(wchan, "hrtimer") || strstr(wchan, "poll") || !wchan[0] ||
                        !strcmp(wchan, "0");
        if (ordinary && !(running_stacks && state == 'R')) continue;
        snprintf(path, sizeof path, "%s/%s/stack", dir, e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        char line[256];
        for (int i = 0; i < 12 && fgets(line, sizeof line, f); i++) fprintf(stderr, "      %s", line);
        fclose(f);
    }
    closedir(d);
    return read_pid;
}

/* Whether the kernel stack in `path` contains `needle`; copies the stack
 * into `stack` (size len) when given. False if unreadable (not root). */
static bool stack_has(const char *path, const char *needle, char *stack, size_t len) {
    char buf[2048];
    if (!stack) stack = buf, len = sizeof buf;
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(stack, 1, len - 1, f);
    stack[n] = 0;
    fclose(f);
    return strstr(stack, needle) != NULL;
}

/* The tasks of process `proc` ("*" for every process of the machine, kernel
 * threads included) whose kernel stack contains `needle`: counted, and
 * printed when `print`. */
static int tasks_in(const char *proc, const char *needle, bool print) {
    DIR *procs = opendir("/proc");
    if (!procs) return 0;
    int found = 0;
    struct dirent *p;
    while ((p = readdir(procs))) {
        if (p->d_name[0] < '0' || p->d_name[0] > '9' || (strcmp(proc, "*") && strcmp(proc, p->d_name))) continue;
        char dir[300];
        snprintf(dir, sizeof dir, "/proc/%s/task", p->d_name);
        DIR *tasks = opendir(dir);
        if (!tasks) continue;
        struct dirent *t;
        while ((t = readdir(tasks))) {
            if (t->d_name[0] == '.') continue;
            char path[600], stack[2048], comm[64], stat[512];
            snprintf(path, sizeof path, "%s/%s/stack", dir, t->d_name);
            if (!stack_has(path, needle, stack, sizeof stack)) continue;
            found++;
            if (!print) continue;
            snprintf(path, sizeof path, "%s/%s/comm", dir, t->d_name);
            read_line(path, comm, sizeof comm);
            snprintf(path, sizeof path, "%s/%s/stat", dir, t->d_name);
            read_line(path, stat, sizeof stat);
            const char *st = strrchr(stat, ')');
            fprintf(stderr, "  [rank %d, machine] task %s/%s (%s): state %c, in %s:\n%s", rank, p->d_name, t->d_name,
                    comm, st && st[1] ? st[2] : '?', needle, stack);
        }
        closedir(tasks);
    }
    closedir(procs);
    return found;
}

/* A rank frozen by the kernel, not by the transport. The stalls left on
 * this project's 2-core VMs (issue #10's notes) were one rank's mmap
 * waiting in vma_prepare for its anon_vma lock, held by the VM's kdamond
 * (DAMON) preempted inside rmap_walk_anon and left without a CPU for
 * seconds, while every other thread of that rank waited on its mmap_lock
 * (and peers' single-copy reads of its memory with them). True when a
 * thread of one of the job's ranks waits in vma_prepare while a task of
 * the machine is inside a reverse-map walk; needs root (kernel stacks),
 * false otherwise. The pids are the job's as gathered at the start: run
 * across hosts, a peer's pid may name an unrelated local process, which
 * would then have to wait in vma_prepare during the stall to excuse it. */
static bool kernel_mm_stall_seen(void) {
    bool rank_waits = false;
    for (int r = 0; r < size && !rank_waits && rank_pids; r++) {
        char pid[32];
        snprintf(pid, sizeof pid, "%ld", (long)rank_pids[r]);
        rank_waits = rank_pids[r] > 0 && tasks_in(pid, "vma_prepare", false) > 0;
    }
    return rank_waits && tasks_in("*", "rmap_walk", false) > 0;
}

static void dump_threads(void) {
    long peer = list_threads("self", false);
    if (peer > 0) {
        char pid[32];
        snprintf(pid, sizeof pid, "%ld", peer);
        list_threads(pid, true);
    }
    tasks_in("*", "rmap_walk", true); /* the holders of an anon_vma lock, if any */
    tasks_in("*", "vma_prepare", true);
}

static void dump_state(const char *why) {
    fprintf(stderr, "[rank %d] %s; its threads, then the runtime's state:\n", rank, why);
    /* The threads first: the runtime's dump may wait up to 200 ms for each
     * lock a stuck thread holds, and by then the thread may have moved on. */
    dump_threads();
    mpr_debug_dump(stderr);
}

static void *watchdog(void *unused) {
    long last = atomic_load(&calls_done);
    double since = now_s(), excused_until = 0; /* a kernel stall was seen until 2 s before this */
    int dumps = 0;                             /* dumps asked for in this stall */
    bool kernel_stall = false;                 /* this stall was seen to be the kernel's */
    while (!atomic_load(&stop_watchdog)) {
        usleep(100000);
        if (dump_requested) {
            dump_requested = 0;
            dump_state("a stalled rank asked for a dump");
        }
        long c = atomic_load(&calls_done);
        double t = now_s();
        if (c != last || atomic_load(&calls_outstanding) == 0) {
            last = c;
            since = t;
            dumps = 0;
            kernel_stall = false;
            excused_until = 0;
            continue;
        }
        double stalled = t - since;
        if (stalled > atomic_load(&longest_stall_s)) atomic_store(&longest_stall_s, stalled);
        if (dumps < 2 && stalled > dump_after_s * (dumps + 1)) {
            char why[128];
            snprintf(why, sizeof why, "no call completed for %.1f s with %ld outstanding", stalled,
                     atomic_load(&calls_outstanding));
            dump_state(why);
            for (int r = 0; r < size; r++)
                if (r != rank && rank_pids[r] > 0) kill(rank_pids[r], SIGUSR2);
            dumps++;
        }
        /* A stall the kernel causes is reported, not failed, for as long as it
         * lasts (up to KERNEL_STALL_MAX_S) plus 2 s for the calls to resume. */
        if (stalled > 1.0 && kernel_mm_stall_seen()) {
            if (!kernel_stall) {
                atomic_fetch_add(&kernel_stalls, 1);
                fprintf(stderr,
                        "[rank %d] stall of %.1f s: the kernel holds a rank's memory map (one of its threads "
                        "waits in vma_prepare while a task of the machine is in a reverse-map walk); "
                        "not the transport's, tolerated while it lasts\n",
                        rank, stalled);
                fflush(stderr);
            }
            kernel_stall = true;
            excused_until = t + 2.0;
        }
        if (stalled > STALL_LIMIT_S && (t > excused_until || stalled > KERNEL_STALL_MAX_S)) {
            fprintf(stderr, "[rank %d] stall: no call completed for %.1f s with %ld outstanding%s\n", rank, stalled,
                    atomic_load(&calls_outstanding),
                    kernel_stall ? " (the kernel's stall seen earlier in it had ended)" : "");
            fflush(stderr);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    return NULL;
}

static void *storm_thread(void *p) {
    unsigned seed = (unsigned)(rank * 7919 + (int)(intptr_t)p * 104729 + 1);
    double end = now_s() + run_s;
    for (int i = 0; now_s() < end; i++) {
        int dst = rand_r(&seed) % size;
        int shape = rand_r(&seed) % 4;
        double t0 = now_s();
        atomic_fetch_add(&calls_outstanding, 1);
        mpr_value_t *r = NULL, *args;
        int64_t want, got = -1;
        if (shape == 0 || shape == 1) { /* small sync, or nested */
            args = ints2(i, rank);
            want = i + rank;
            CHECK_OK(mpr_rpc_sync(mpr_to_rank(dst), shape ? "nested_add" : "add", args, 60, &r));
        } else { /* tensors, async */
            bool big = shape == 2;
            args = mpr_value_list_of(1, tensor_list(big ? 4 : 64, big ? 256 << 10 : 4 << 10, i, &want));
            mpr_future_t *f = mpr_rpc_async(mpr_to_rank(dst), "first_bytes", args, 60);
            CHECK(f != NULL);
            CHECK_OK(mpr_future_get(f, MPR_WAIT_FOREVER, &r));
            mpr_future_release(f);
        }
        CHECK_OK(mpr_value_get_int(r, &got));
        CHECK(got == want);
        mpr_value_release(r);
        mpr_value_release(args);
        atomic_fetch_sub(&calls_outstanding, 1);
        note_call(now_s() - t0);
    }
    return NULL;
}

static void run_storm(void) {
    pthread_t wd, th[THREADS];
    const char *dump_env = getenv("STRESS_DUMP_AFTER_S");
    if (dump_env && atof(dump_env) > 0) dump_after_s = atof(dump_env);
    struct sigaction sa = {.sa_handler = on_dump_signal}; /* before any peer can know our pid */
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    CHECK(sigaction(SIGUSR2, &sa, NULL) == 0);
    rank_pids = calloc((size_t)size, sizeof *rank_pids);
    CHECK(rank_pids != NULL);
    pid_t me = getpid();
    CHECK(MPI_Allgather(&me, sizeof me, MPI_BYTE, rank_pids, sizeof me, MPI_BYTE, MPI_COMM_WORLD) == MPI_SUCCESS);
    CHECK(pthread_create(&wd, NULL, watchdog, NULL) == 0);
    double t0 = now_s();
    for (intptr_t i = 0; i < THREADS; i++) CHECK(pthread_create(&th[i], NULL, storm_thread, (void *)i) == 0);
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    double elapsed = now_s() - t0;
    mpitest_barrier(); /* peers still call us until they are done */
    atomic_store(&stop_watchdog, 1);
    pthread_join(wd, NULL);
    long calls = atomic_load(&calls_done), all = 0;
    int ks = atomic_load(&kernel_stalls), ks_max = 0;
    MPI_Reduce(&ks, &ks_max, 1, MPI_INT, MPI_MAX, 0, MPI_COMM_WORLD);
    double longest = atomic_load(&longest_call_s), stall = atomic_load(&longest_stall_s), lmax = 0, smax = 0;
    MPI_Reduce(&calls, &all, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&longest, &lmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&stall, &smax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    free(rank_pids);
    rank_pids = NULL;
    if (rank == 0)
        printf("{\"shape\":\"storm\",\"ranks\":%d,\"seconds\":%.1f,\"calls\":%ld,\"calls_per_s\":%.0f,"
               "\"longest_call_s\":%.3f,\"longest_stall_s\":%.1f,\"kernel_mm_stalls\":%d}\n",
               size, elapsed, all, (double)all / elapsed, lmax, smax, ks_max);
}

/* ---- timeouts ---- */

static atomic_long timeouts_seen, results_seen, late_calls;
static _Atomic double worst_overrun_ms;

static void *timeout_thread(void *p) {
    unsigned seed = (unsigned)(int)(intptr_t)p * 31 + 7;
    double end = now_s() + run_s;
    for (int i = 0; now_s() < end; i++) {
        double timeout = (0.1 + (rand_r(&seed) % 4901) / 1000.0) * 1e-3; /* 0.1 .. 5 ms */
        int64_t sleep_us = rand_r(&seed) % 6000;
        mpr_value_t *args = ints2(sleep_us, i);
        if (i % 4 == 0) { /* some carry 1 MiB */
            int64_t unused;
            CHECK_OK(mpr_value_list_append(args, tensor_list(1, 1 << 20, i, &unused)));
        }
        mpr_value_t *r = NULL;
        double t0 = now_s();
        mpr_err_t e = mpr_rpc_sync(mpr_to_rank(1), "sleep_echo", args, timeout, &r);
        double overrun_ms = (now_s() - t0 - timeout) * 1e3;
        if (e == MPR_OK) {
            int64_t v = -1;
            CHECK_OK(mpr_value_get_int(r, &v));
            CHECK(v == i);
            atomic_fetch_add(&results_seen, 1);
        } else {
            CHECK_ERR(e, MPR_ERR_TIMEOUT);
            atomic_fetch_add(&timeouts_seen, 1);
        }
        double prev = atomic_load(&worst_overrun_ms);
        while (overrun_ms > prev && !atomic_compare_exchange_weak(&worst_overrun_ms, &prev, overrun_ms)) {
        }
        if (overrun_ms > DEADLINE_SLACK_MS) atomic_fetch_add(&late_calls, 1);
        mpr_value_release(r);
        mpr_value_release(args);
        note_call(now_s() - t0);
    }
    return NULL;
}

static _Atomic double worst_oversleep_ms;

static void *noise_thread(void *unused) {
    while (!atomic_load(&stop_watchdog)) {
        double t0 = now_s();
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        double over = (now_s() - t0) * 1e3 - 1.0;
        if (over > atomic_load(&worst_oversleep_ms)) atomic_store(&worst_oversleep_ms, over);
    }
    return NULL;
}

static void run_timeouts(void) {
    double t0 = now_s();
    if (rank == 0) {
        pthread_t th[THREADS], noise;
        CHECK(pthread_create(&noise, NULL, noise_thread, NULL) == 0);
        for (intptr_t i = 0; i < THREADS; i++) CHECK(pthread_create(&th[i], NULL, timeout_thread, (void *)i) == 0);
        for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
        atomic_store(&stop_watchdog, 1);
        pthread_join(noise, NULL);
        /* Timeouts must happen; results too, unless the machine is so loaded
         * that no 0-6 ms call beats a 5 ms timeout (reported, not failed). */
        CHECK(atomic_load(&timeouts_seen) > 0);
        printf("{\"shape\":\"timeouts\",\"seconds\":%.1f,\"calls\":%ld,\"timeouts\":%ld,\"results\":%ld,"
               "\"worst_overrun_ms\":%.2f,\"calls_over_50ms\":%ld,\"worst_scheduler_oversleep_ms\":%.2f,"
               "\"bound_ms\":%.0f}\n",
               now_s() - t0, atomic_load(&calls_done), atomic_load(&timeouts_seen), atomic_load(&results_seen),
               atomic_load(&worst_overrun_ms), atomic_load(&late_calls), atomic_load(&worst_oversleep_ms),
               DEADLINE_SLACK_MS);
        /* Issue #10's bound: every timeout fires within 50 ms of its deadline
         * beyond what the scheduler itself imposed on this run (twice the
         * longest oversleep the noise thread measured: the timer thread and
         * the caller can each be descheduled once). Measured at load 9-10 on
         * 2 cores: worst 6-22 ms with 9-17 ms of noise, normal and ASan. */
        double limit_ms = DEADLINE_SLACK_MS + 2 * atomic_load(&worst_oversleep_ms);
        if (atomic_load(&worst_overrun_ms) > limit_ms)
            fprintf(stderr, "a timeout fired %.1f ms after its deadline (limit %.1f ms)\n",
                    atomic_load(&worst_overrun_ms), limit_ms);
        CHECK(atomic_load(&worst_overrun_ms) <= limit_ms);
    }
    mpitest_barrier();
}

/* ---- stop ---- */

typedef struct {
    mpr_future_t *f, *stamped; /* the call, and its continuation stamping `finished` */
    double started;
    _Atomic double finished;
} call_t;

static mpr_err_t stamp_finish(mpr_future_t *f, void *arg, mpr_value_t **result) {
    call_t *c = arg;
    atomic_store(&c->finished, now_s());
    *result = NULL;
    return MPR_OK;
}

static void run_stop(void) {
    if (rank == 1) {
        while (atomic_load(&first_bytes_served) < 2) usleep(1000); /* let the stream get going */
        usleep(100000);
        CHECK_OK(mpr_shutdown(false));
        mpitest_barrier();
        return;
    }
    enum { INFLIGHT = 8 };
    static call_t calls[INFLIGHT];
    long ok = 0, failed = 0;
    double worst_ms = 0, worst_issue_ms = 0, end = now_s() + run_s;
    double hard_end = end + 60;
    for (int i = 0;; i++) {
        /* Until run_s passed and both outcomes were seen (slow sanitizer
         * builds need longer), at most a minute more. */
        double t = now_s();
        bool issuing = t < hard_end && (t < end || ok == 0 || failed == 0);
        call_t *c = &calls[i % INFLIGHT];
        if (c->f) { /* wait for the call issued INFLIGHT calls ago */
            CHECK_OK(mpr_future_wait(c->stamped, MPR_WAIT_FOREVER));
            double overrun_ms = (atomic_load(&c->finished) - c->started - 2.0) * 1e3;
            if (overrun_ms > worst_ms) worst_ms = overrun_ms;
            if (overrun_ms > LATE_LIMIT_MS) fprintf(stderr, "call finished %.1f ms after its deadline\n", overrun_ms);
            CHECK(overrun_ms <= LATE_LIMIT_MS);
            if (mpr_future_error(c->f) == MPR_OK)
                ok++;
            else
                failed++;
            mpr_future_release(c->f);
            mpr_future_release(c->stamped);
            c->f = c->stamped = NULL;
        } else if (!issuing) {
            bool any = false;
            for (int k = 0; k < INFLIGHT; k++) any = any || calls[k].f;
            if (!any) break;
        }
        if (!issuing) continue;
        int64_t unused;
        mpr_value_t *args = mpr_value_list_of(1, i % 2 ? tensor_list(4, 1 << 20, i, &unused)
                                                       : tensor_list(200, 60 << 10, i, &unused));
        c->started = now_s();
        c->f = mpr_rpc_async(mpr_to_rank(1), "first_bytes", args, 2.0);
        mpr_value_release(args);
        CHECK(c->f != NULL); /* fails later if the peer is gone, never blocks here */
        c->stamped = mpr_future_then(c->f, stamp_finish, c);
        CHECK(c->stamped != NULL);
        double issue_ms = (now_s() - c->started) * 1e3;
        if (issue_ms > worst_issue_ms) worst_issue_ms = issue_ms;
        CHECK(issue_ms <= LATE_LIMIT_MS);
    }
    if (!(ok > 0 && failed > 0)) fprintf(stderr, "ok %ld failed %ld\n", ok, failed);
    CHECK(ok > 0 && failed > 0); /* calls went through, then the peer stopped */
    printf("{\"shape\":\"stop\",\"calls_ok\":%ld,\"calls_failed\":%ld,\"worst_overrun_ms\":%.1f,"
           "\"worst_issue_ms\":%.1f,\"bound_ms\":%.0f}\n",
           ok, failed, worst_ms < 0 ? 0 : worst_ms, worst_issue_ms, LATE_LIMIT_MS);
    CHECK_OK(mpr_shutdown(false));
    mpitest_barrier();
}

int main(int argc, char **argv) {
    int provided;
    /* This program starts MPI itself, as a host code does, so mpirpc leaves
     * its signals alone; like mpr_init when it starts MPI (runtime/world.c),
     * it ignores SIGPIPE: when test_two_hosts kills rank 1 over TCP, rank 0's
     * next write fails instead of killing rank 0 first, which made mpirun
     * name rank 0 ("exited on signal 13") instead of the rank that died. */
    signal(SIGPIPE, SIG_IGN);
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    CHECK(provided == MPI_THREAD_MULTIPLE);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *shape = argc > 1 ? argv[1] : "storm";
    run_s = argc > 2 ? atof(argv[2]) : 3.0;
    CHECK_OK(mpr_register_function("add", fn_add, NULL));
    CHECK_OK(mpr_register_function("nested_add", fn_nested_add, NULL));
    CHECK_OK(mpr_register_function("first_bytes", fn_first_bytes, NULL));
    CHECK_OK(mpr_register_function("sleep_echo", fn_sleep_echo, NULL));
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    CHECK_OK(mpr_init(&opts));
    if (strcmp(shape, "storm") == 0) {
        run_storm();
        CHECK_OK(mpr_shutdown(true));
    } else if (strcmp(shape, "timeouts") == 0) {
        CHECK(size == 2);
        run_timeouts();
        CHECK_OK(mpr_shutdown(true));
    } else {
        CHECK(strcmp(shape, "stop") == 0 && size == 2);
        run_stop();
    }
    mpr_registry_clear();
    if (rank == 0) printf("%s: 1 passed, 0 failed\n", shape);
    MPI_Finalize();
    return 0;
}
