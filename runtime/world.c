/* world.c — mpri_world_init (the runtime's part of mpr_init, which lives in
 * api/src/init.c): MPI (own or adopted), the private communicators, the
 * worker names; lookups of workers and destinations; debug info.
 *
 * Invariants: every rank gathers every rank's name and validity before
 * deciding, so a bad or duplicate name fails init on all ranks alike (no
 * rank is left hanging in a collective); on failure nothing stays allocated
 * but a self-initialized MPI stays initialized, so mpr_init can be retried
 * (mpirpc finalizes it at process exit if no later init succeeds).
 * mpri_rt.workers is immutable while the runtime runs. The hook tables are
 * filled by the library's own layers at their init, a fixed number of times:
 * overflowing one is a library bug (MPRI_ASSERT). mpr_init also tunes glibc's
 * trim and mmap thresholds once per process (keep_freed_memory says why and
 * how to opt out), a process whose MPI it starts ignores SIGPIPE unless
 * something set it already (ignore_sigpipe_if_default says why), and an
 * Open MPI it starts sends eager messages on one host by copy
 * (mpi_tuning.c). */
#include <ctype.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpri_args.h"
#include "mpri_assert.h"
#include "mpri_doorbell.h"
#include "mpri_event.h"
#include "mpri_pool.h"
#include "mpri_runtime.h"
#include "mpri_trace.h"

mpri_runtime_t mpri_rt;
static struct {
    void (*debug_info[MPRI_MAX_HOOKS])(mpr_debug_info_t *info);
    void (*on_quiescent[MPRI_MAX_HOOKS])(void);
    void (*after_stop[MPRI_MAX_HOOKS])(void);
    int n_debug_info, n_shutdown;
} hooks;

mpr_err_t mpri_add_debug_info_hook(void (*hook)(mpr_debug_info_t *info)) {
    MPRI_ASSERT(hooks.n_debug_info < MPRI_MAX_HOOKS, "more debug-info hooks than MPRI_MAX_HOOKS: raise it");
    hooks.debug_info[hooks.n_debug_info++] = hook;
    return MPR_OK;
}

mpr_err_t mpri_add_shutdown_hooks(void (*on_quiescent)(void), void (*after_stop)(void)) {
    MPRI_ASSERT(hooks.n_shutdown < MPRI_MAX_HOOKS, "more shutdown hooks than MPRI_MAX_HOOKS: raise it");
    hooks.on_quiescent[hooks.n_shutdown] = on_quiescent;
    hooks.after_stop[hooks.n_shutdown] = after_stop;
    hooks.n_shutdown++;
    return MPR_OK;
}

void mpri_run_quiescent_hooks(void) {
    for (int i = 0; i < hooks.n_shutdown; i++)
        if (hooks.on_quiescent[i]) hooks.on_quiescent[i]();
}

void mpri_run_after_stop_hooks(void) {
    for (int i = hooks.n_shutdown - 1; i >= 0; i--)
        if (hooks.after_stop[i]) hooks.after_stop[i]();
}

void mpr_init_options_default(mpr_init_options_t *opts) {
    MPRI_ARG_NONNULL_OR(opts, );
    memset(opts, 0, sizeof *opts);
    opts->num_worker_threads = 4;
    opts->rpc_timeout_s = 60.0;
    opts->shutdown_timeout_s = 0.0; /* no limit: a rank that shuts down first serves as long as the others work */
    opts->comm = MPI_COMM_NULL;
    opts->progress_thread_pu = -1;
}

mpr_err_t mpr_validate_worker_name(const char *name) {
    MPRI_ARG_NONNULL(name);
    size_t len = strlen(name);
    if (len == 0) return mpr_error_set(MPR_ERR_INVALID_ARG, "worker name is empty");
    if (len >= MPR_MAX_NAME_LEN)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "worker name '%.32s...' is %zu characters (limit %d)",
                             name, len, MPR_MAX_NAME_LEN - 1);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (!isalnum(c) && c != '_' && c != ':' && c != '-')
            return mpr_error_set(MPR_ERR_INVALID_ARG,
                                 "worker name '%s' has invalid character '%c' at %zu (allowed: "
                                 "letters, digits, '_', ':', '-')",
                                 name, isprint(c) ? c : '?', i);
    }
    return MPR_OK;
}

mpr_err_t mpri_check_running(const char *what) {
    switch (mpri_state()) {
    case MPRI_RUNNING: return MPR_OK;
    case MPRI_UNINIT:
        return mpr_error_set(MPR_ERR_NOT_INITIALIZED, "%s: call mpr_init first", what);
    case MPRI_STOPPING:
        if (mpri_on_pool_thread()) return MPR_OK; /* serving work during graceful shutdown */
        return mpr_error_set(MPR_ERR_SHUTDOWN, "%s: the runtime is shutting down", what);
    default: return mpr_error_set(MPR_ERR_SHUTDOWN, "%s: the runtime is shut down", what);
    }
}

static const char *thread_level_name(int level) {
    switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "unknown";
    }
}

typedef struct {
    char name[MPR_MAX_NAME_LEN];
    int32_t valid;
} name_record_t;

/* Gather names; every rank checks all of them the same way. */
static mpr_err_t gather_names(const char *my_name) {
    name_record_t mine = {{0}, 0};
    mpr_err_t local = mpr_validate_worker_name(my_name);
    char local_detail[MPR_ERROR_TEXT_MAX];
    snprintf(local_detail, sizeof local_detail, "%s", mpr_last_error());
    if (my_name) snprintf(mine.name, sizeof mine.name, "%s", my_name);
    mine.valid = local == MPR_OK;
    name_record_t *all = calloc((size_t)mpri_rt.size, sizeof *all);
    if (!all) return mpr_error_set(MPR_ERR_NOMEM, "mpr_init: out of memory");
    int rc = MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE,
                           mpri_rt.ctrl_comm);
    if (rc != MPI_SUCCESS) {
        free(all);
        return mpr_error_set(MPR_ERR_MPI, "mpr_init: gathering worker names failed");
    }
    mpr_err_t e = MPR_OK;
    for (int r = 0; r < mpri_rt.size && !e; r++) {
        if (!all[r].valid)
            e = r == mpri_rt.rank ? mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_init: rank %d: %s", r, local_detail)
                                  : mpr_error_set(MPR_ERR_INVALID_ARG,
                                                  "mpr_init: rank %d has an invalid worker name '%s'", r,
                                                  all[r].name);
    }
    for (int a = 0; a < mpri_rt.size && !e; a++)
        for (int b = a + 1; b < mpri_rt.size && !e; b++)
            if (strcmp(all[a].name, all[b].name) == 0)
                e = mpr_error_set(MPR_ERR_INVALID_ARG,
                                  "mpr_init: duplicate worker name '%s' on ranks %d and %d", all[a].name, a, b);
    if (e) {
        free(all);
        return e;
    }
    mpri_rt.workers = mpri_rt.size > 0 ? calloc((size_t)mpri_rt.size, sizeof *mpri_rt.workers) : NULL;
    if (!mpri_rt.workers) {
        free(all);
        return mpr_error_set(MPR_ERR_NOMEM, "mpr_init: out of memory");
    }
    for (int r = 0; r < mpri_rt.size; r++) {
        memcpy(mpri_rt.workers[r].name, all[r].name, MPR_MAX_NAME_LEN);
        mpri_rt.workers[r].rank = r;
    }
    free(all);
    return MPR_OK;
}

static void release_comms(void) {
    if (mpri_rt.comm != MPI_COMM_NULL) MPI_Comm_free(&mpri_rt.comm);
    if (mpri_rt.ctrl_comm != MPI_COMM_NULL) MPI_Comm_free(&mpri_rt.ctrl_comm);
    if (mpri_rt.barrier_comm != MPI_COMM_NULL) MPI_Comm_free(&mpri_rt.barrier_comm);
}

/* mpirpc called MPI_Init_thread in this process (whether or not an mpr_init
 * succeeded since). A failed mpr_init leaves that MPI initialized so a retry
 * works; at exit it is finalized unless the runtime still runs. */
static bool mpi_started_here;

static void finalize_mpi_at_exit(void) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized && mpri_state() != MPRI_RUNNING && mpri_state() != MPRI_STOPPING)
        MPI_Finalize();
}

/* Received tensors are allocated by the polling thread and freed by
 * whichever thread drops the last reference (often the progress thread, once
 * a reply's send completed). glibc then trims an arena's top after nearly
 * every message of many small tensors and grows it again for the next one
 * (sysmalloc, madvise and page faults were the top of the profile: echo of
 * 256 x 1 KiB 1.2 ms, 0.58 ms without the trimming, 0.48-0.50 ms on d7c3197).
 * So mpr_init raises glibc's trim threshold to 64 MiB, and pins the mmap
 * threshold at 32 MiB (setting the trim threshold freezes glibc's adaptive
 * one at 128 KiB), process-wide, unless the environment sets either
 * (MALLOC_TRIM_THRESHOLD_, MALLOC_MMAP_THRESHOLD_) or MPIRPC_KEEP_MALLOC=1. */
static void keep_freed_memory(void) {
    static bool done;
    if (done) return;
    done = true;
    if (getenv("MALLOC_TRIM_THRESHOLD_") || getenv("MALLOC_MMAP_THRESHOLD_") || getenv("MPIRPC_KEEP_MALLOC")) return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

/* A process whose MPI mpirpc starts ignores SIGPIPE when nothing else set it
 * (its disposition is the default). Over TCP, a rank that writes to a peer
 * that died gets EPIPE instead of being killed by the signal: otherwise that
 * rank could die first and mpirun would name it, not the rank that failed
 * (seen in test_two_hosts: "rank 0 ... exited on signal 13 (Broken pipe)"
 * after rank 1 was killed). A handler or SIG_IGN the host installed, and
 * the process of a host that started MPI itself, are left alone. */
static void ignore_sigpipe_if_default(void) {
    struct sigaction old;
    if (sigaction(SIGPIPE, NULL, &old) != 0 || (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) return;
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, NULL);
}

mpr_err_t mpri_world_init(const mpr_init_options_t *user_opts) {
    mpr_init_options_t opts;
    if (user_opts)
        opts = *user_opts;
    else
        mpr_init_options_default(&opts);
    int state = mpri_state();
    if (state == MPRI_RUNNING || state == MPRI_STOPPING || state == MPRI_LEAVING)
        return mpr_error_set(MPR_ERR_ALREADY_INITIALIZED, "mpr_init: already initialized");
    if (opts.num_worker_threads < 0 || opts.num_worker_threads > 1024 || opts.rpc_timeout_s < 0 ||
        opts.shutdown_timeout_s < 0)
        return mpr_error_set(MPR_ERR_INVALID_ARG,
                             "mpr_init: num_worker_threads must be in [0, 1024] and timeouts >= 0");
    keep_freed_memory();
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) return mpr_error_set(MPR_ERR_SHUTDOWN, "mpr_init: MPI is already finalized");
    if (mpri_finalize_pending_at_exit())
        return mpr_error_set(MPR_ERR_SHUTDOWN, "mpr_init: mpr_shutdown(false) left MPI to be finalized at exit");

    memset(&mpri_rt, 0, sizeof mpri_rt);
    mpri_rt.comm = mpri_rt.ctrl_comm = mpri_rt.barrier_comm = MPI_COMM_NULL;
    int provided = 0;
    if (!initialized) {
        ignore_sigpipe_if_default();
        mpri_mpi_tune_before_init();
        int rc = MPI_Init_thread(opts.argc, opts.argv, MPI_THREAD_MULTIPLE, &provided);
        mpri_mpi_tune_after_init();
        if (rc != MPI_SUCCESS) return mpr_error_set(MPR_ERR_MPI, "mpr_init: MPI_Init_thread failed");
        if (!mpi_started_here) atexit(finalize_mpi_at_exit);
        mpi_started_here = true;
        mpri_rt.own_mpi = true;
    } else {
        mpri_rt.own_mpi = mpi_started_here; /* a retry after a failed init */
        MPI_Query_thread(&provided);
    }
    mpr_err_t e = MPR_OK;
    if (provided < MPI_THREAD_MULTIPLE) {
        e = mpr_error_set(MPR_ERR_MPI,
                          "mpr_init: MPI provides %s but mpirpc needs MPI_THREAD_MULTIPLE (its progress "
                          "thread and your threads call MPI concurrently); initialize MPI with "
                          "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)",
                          thread_level_name(provided));
        goto fail;
    }
    MPI_Comm base = opts.comm == MPI_COMM_NULL ? MPI_COMM_WORLD : opts.comm;
    if (MPI_Comm_dup(base, &mpri_rt.comm) != MPI_SUCCESS ||
        MPI_Comm_dup(base, &mpri_rt.ctrl_comm) != MPI_SUCCESS ||
        MPI_Comm_dup(base, &mpri_rt.barrier_comm) != MPI_SUCCESS) {
        e = mpr_error_set(MPR_ERR_MPI, "mpr_init: MPI_Comm_dup failed");
        goto fail;
    }
    MPI_Comm_set_errhandler(mpri_rt.comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(mpri_rt.ctrl_comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(mpri_rt.barrier_comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(mpri_rt.comm, &mpri_rt.rank);
    MPI_Comm_size(mpri_rt.comm, &mpri_rt.size);
    int *tag_ub = NULL, flag = 0;
    MPI_Comm_get_attr(mpri_rt.comm, MPI_TAG_UB, &tag_ub, &flag);
    mpri_rt.tag_ub = flag && tag_ub ? *tag_ub : 32767;

    char default_name[32];
    snprintf(default_name, sizeof default_name, "worker%d", mpri_rt.rank);
    if ((e = gather_names(opts.name ? opts.name : default_name))) goto fail;

    mpri_rt.num_worker_threads = opts.num_worker_threads ? opts.num_worker_threads : 4;
    mpri_rt.default_timeout_s = opts.rpc_timeout_s;
    mpri_rt.progress_pu = opts.progress_thread_pu;
    atomic_store(&mpri_rt.next_request_id, 1);
    mpri_shutdown_timeout_s = opts.shutdown_timeout_s;
    if ((e = mpri_shutdown_prepare())) goto fail;
    mpri_trace_name_thread("main"); /* the thread that called mpr_init */
    mpri_observe_init(mpri_rt.comm); /* collective, before the threads start; never fails the init */
    mpri_doorbell_init(mpri_rt.comm); /* collective too; without bells idle ranks poll as before */
    atomic_store(&mpri_rt.state, MPRI_RUNNING);
    if ((e = mpri_pool_start(mpri_rt.num_worker_threads))) goto fail_running;
    if ((e = mpri_progress_start())) {
        mpri_pool_stop();
        goto fail_running;
    }
    return MPR_OK;

fail_running:
    atomic_store(&mpri_rt.state, MPRI_UNINIT);
    mpri_doorbell_fini();
    mpri_observe_release(true);
fail:
    free(mpri_rt.workers);
    mpri_rt.workers = NULL;
    release_comms();
    mpri_rt.own_mpi = false; /* MPI stays initialized for a retry (see mpi_started_here) */
    return e;
}

bool mpr_is_running(void) { return mpri_state() == MPRI_RUNNING; }

int mpr_world_size(void) {
    int s = mpri_state();
    return s == MPRI_RUNNING || s == MPRI_STOPPING ? mpri_rt.size : 0;
}

mpr_err_t mpr_get_worker_info_by_rank(int rank, mpr_worker_info_t *out) {
    MPRI_ARG_NONNULL(out);
    memset(out, 0, sizeof *out);
    out->rank = -1;
    mpr_err_t e = mpri_check_running("mpr_get_worker_info_by_rank");
    if (e) return e;
    if (rank < 0 || rank >= mpri_rt.size)
        return mpr_error_set(MPR_ERR_NOT_FOUND, "no worker with rank %d (world size %d)", rank,
                             mpri_rt.size);
    *out = mpri_rt.workers[rank];
    return MPR_OK;
}

mpr_err_t mpr_get_worker_info(const char *name, mpr_worker_info_t *out) {
    if (out) memset(out, 0, sizeof *out), out->rank = -1;
    MPRI_ARG_NONNULL(name);
    MPRI_ARG_NONNULL(out);
    mpr_err_t e = mpri_check_running("mpr_get_worker_info");
    if (e) return e;
    for (int r = 0; r < mpri_rt.size; r++)
        if (strcmp(mpri_rt.workers[r].name, name) == 0) {
            *out = mpri_rt.workers[r];
            return MPR_OK;
        }
    return mpr_error_set(MPR_ERR_NOT_FOUND, "no worker named '%s'", name);
}

mpr_err_t mpr_get_self_worker_info(mpr_worker_info_t *out) {
    MPRI_ARG_NONNULL(out);
    memset(out, 0, sizeof *out);
    out->rank = -1;
    mpr_err_t e = mpri_check_running("mpr_get_self_worker_info");
    if (e) return e;
    *out = mpri_rt.workers[mpri_rt.rank];
    return MPR_OK;
}

mpr_err_t mpr_dest_rank(mpr_dest_t to, int *rank) {
    MPRI_ARG_NONNULL(rank);
    *rank = -1;
    if (to.kind == MPR_DEST_NAME) {
        if (!to.name) return mpr_error_set(MPR_ERR_INVALID_ARG, "mpr_dest_rank: destination name is NULL");
        mpr_worker_info_t w;
        mpr_err_t e = mpr_get_worker_info(to.name, &w);
        if (e) return e;
        *rank = w.rank;
        return MPR_OK;
    }
    if (to.rank < 0 || to.rank >= mpri_rt.size)
        return mpr_error_set(MPR_ERR_NOT_FOUND, "no worker with rank %d (world size %d)", to.rank,
                             mpri_rt.size);
    *rank = to.rank;
    return MPR_OK;
}

mpr_err_t mpr_get_debug_info(mpr_debug_info_t *out) {
    MPRI_ARG_NONNULL(out);
    memset(out, 0, sizeof *out);
    out->rank = mpri_rt.rank;
    out->world_size = mpri_rt.size;
    out->num_worker_threads = mpri_rt.num_worker_threads;
    snprintf(out->progress_binding, sizeof out->progress_binding, "%s", mpri_rt.progress_binding);
    out->pending_requests = mpri_pending_count();
    out->pool_busy = mpri_pool_busy();
    out->progress_busy = mpri_progress_busy();
    out->msgs_sent = atomic_load(&mpri_rt.msgs_sent);
    out->msgs_processed = atomic_load(&mpri_rt.msgs_processed);
    for (int i = 0; i < hooks.n_debug_info; i++) hooks.debug_info[i](out);
    return MPR_OK;
}

mpr_err_t mpr_debug_dump(FILE *out) {
    MPRI_ARG_NONNULL(out);
    static const char *const states[] = {"not started", "running", "shutting down (graceful)",
                                         "shutting down (leaving)", "stopped"};
    int state = mpri_state();
    mpr_debug_info_t info;
    mpr_get_debug_info(&info);
    int64_t now = mpri_now_ns();
    const char *name = state != MPRI_UNINIT && mpri_rt.workers ? mpri_rt.workers[mpri_rt.rank].name : "?";
    fprintf(out, "mpirpc state of rank %d (%s, pid %ld): runtime %s\n", info.rank, name, (long)getpid(),
            state >= 0 && state <= MPRI_STOPPED ? states[state] : "?");
    fprintf(out, "  messages sent %llu, processed %llu; pending requests %ld, pool busy %ld, progress busy %ld\n",
            info.msgs_sent, info.msgs_processed, info.pending_requests, info.pool_busy, info.progress_busy);
    fprintf(out, "  RRefs: owners %ld, users %ld (pending %ld), pending children %ld, unacked control messages %ld\n",
            info.rref_owners, info.rref_users, info.rref_pending_users, info.rref_pending_children,
            info.rref_unacked_ctrl_msgs);
    fprintf(out, "  distributed autograd contexts %ld, graph nodes %ld, tensors alive %ld\n", info.dist_contexts,
            info.autograd_nodes, info.tensors);
    if (state != MPRI_UNINIT) {
        mpri_progress_describe(out, now);
        mpri_pool_describe(out);
        mpri_transport_describe(out, now);
        mpri_pending_describe(out, now);
    }
    fflush(out);
    return MPR_OK;
}
