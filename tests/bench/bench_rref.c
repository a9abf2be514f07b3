/* bench_rref.c — RRef benchmark, printing one JSON object per line.
 *
 * Run: mpirun -np 2 ./bench_rref [--quick]
 * In one run, rank 0 against rank 1, interleaved iteration by iteration: the
 * rpc_sync no-op round trip (the reference), remote() + to_here() of a small
 * int (then release), an RRef passed as a call argument: owner -> user (rank
 * 0's OwnerRRef to rank 1: a fork registered at send, a user delete after the
 * call) and user -> owner (rank 0's UserRRef back to its owner: a child
 * accept); then the ratios to the no-op. Medians; rank 0 prints. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpirpc/mpirpc.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

static void die(const char *what, mpr_err_t e) {
    fprintf(stderr, "bench_rref: %s: %s: %s\n", what, mpr_error_name(e), mpr_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static mpr_err_t fn_noop(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    *result = NULL;
    return MPR_OK;
}

static mpr_err_t fn_make_int(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    *result = mpr_value_new_int(42);
    return MPR_OK;
}

/* take_rref(rref) -> none: the argument must be a confirmed RRef */
static mpr_err_t fn_take_rref(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    mpr_rref_t *r;
    mpr_err_t e = mpr_args_rref(args, 0, &r);
    if (e) return e;
    if (!mpr_rref_confirmed_by_owner(r)) return mpr_error_set(MPR_ERR_STATE, "unconfirmed RRef argument");
    *result = NULL;
    return MPR_OK;
}

/* A barrier that sleeps instead of spinning (the idle rank must not take a
 * core from the measured ones on a small machine). */
static void quiet_barrier(void) {
    MPI_Request req;
    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    for (int done = 0;;) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (done) return;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

/* Wait until no RRef work is left anywhere (deletes landed). */
static void drain(void) {
    for (;;) {
        mpr_debug_info_t d;
        mpr_get_debug_info(&d);
        long mine = d.rref_unacked_ctrl_msgs + d.rref_pending_children + d.rref_pending_users, all = 0;
        MPI_Allreduce(&mine, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (!all) return;
        quiet_barrier();
    }
}

int main(int argc, char **argv) {
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    int provided, rank, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size < 2) {
        fprintf(stderr, "bench_rref: run with mpirun -np 2\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    mpr_err_t e;
    if ((e = mpr_register_function("noop", fn_noop, NULL)) || (e = mpr_register_function("make_int", fn_make_int, NULL)) ||
        (e = mpr_register_function("take_rref", fn_take_rref, NULL)))
        die("register", e);
    if ((e = mpr_init(NULL))) die("mpr_init", e);

    int n = quick ? 1000 : 10000;
    enum { NOOP, REMOTE, FORK_OU, FORK_UO, NKIND };
    static const char *names[NKIND] = {"rpc_sync_noop", "remote_to_here", "rref_arg_fork", "rref_arg_user_to_owner"};
    double *t[NKIND], med[NKIND] = {0};
    for (int k = 0; k < NKIND; k++) t[k] = malloc(sizeof *t[k] * (size_t)n);
    mpr_value_t *r = NULL;
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        /* An OwnerRRef of ours to pass to rank 1 (owner -> user fork), and a
         * UserRRef of rank 1's to pass back to its owner (child accept). */
        mpr_value_t *v = mpr_value_new_int(7);
        mpr_rref_t *own = mpr_rref_create_local(v);
        mpr_value_release(v);
        mpr_value_t *own_args = mpr_value_list_of(1, mpr_value_new_rref(own));
        mpr_rref_t *user = mpr_remote(mpr_to_rank(1), "make_int", NULL, 0);
        if (!user || (e = mpr_rref_to_here(user, 0, &r))) die("remote", user ? e : mpr_last_error_code());
        mpr_value_release(r);
        mpr_value_t *user_args = mpr_value_list_of(1, mpr_value_new_rref(user));
        /* The four round trips interleaved, so each sees the same machine state
         * (this 2-core machine is shared; phases run one after the other
         * would compare different load conditions). */
        for (int i = -n / 10; i < n; i++) {
            for (int k = 0; k < NKIND; k++) {
                double t0 = MPI_Wtime();
                if (k == NOOP) {
                    if ((e = mpr_rpc_sync(mpr_to_rank(1), "noop", NULL, 0, &r))) die("rpc_sync", e);
                } else if (k == REMOTE) {
                    mpr_rref_t *rr = mpr_remote(mpr_to_rank(1), "make_int", NULL, 0);
                    if (!rr) die("remote", mpr_last_error_code());
                    if ((e = mpr_rref_to_here(rr, 0, &r))) die("to_here", e);
                    if (i >= 0) t[k][i] = MPI_Wtime() - t0;
                    mpr_rref_release(rr);
                } else {
                    if ((e = mpr_rpc_sync(mpr_to_rank(1), "take_rref", k == FORK_OU ? own_args : user_args, 0, &r)))
                        die("rref arg", e);
                }
                if (i >= 0 && k != REMOTE) t[k][i] = MPI_Wtime() - t0;
                mpr_value_release(r);
                r = NULL;
            }
        }
        mpr_value_release(own_args);
        mpr_value_release(user_args);
        mpr_rref_release(own);
        mpr_rref_release(user);
        for (int k = 0; k < NKIND; k++) {
            med[k] = median(t[k], n);
            printf("{\"name\":\"%s\",\"median_us\":%.3f%s}\n", names[k], med[k] * 1e6,
                   k == FORK_OU ? ",\"direction\":\"owner_to_user\"" : "");
        }
        printf("{\"name\":\"rref_ratios\",\"remote_to_here_vs_rpc_sync_noop\":%.2f,\"rref_arg_fork_vs_rpc_sync_noop\":%.2f,"
               "\"rref_arg_user_to_owner_vs_rpc_sync_noop\":%.2f,\"target\":2.5}\n",
               med[REMOTE] / med[NOOP], med[FORK_OU] / med[NOOP], med[FORK_UO] / med[NOOP]);
        fflush(stdout);
    }
    quiet_barrier();
    drain();
    for (int k = 0; k < NKIND; k++) free(t[k]);
    if ((e = mpr_shutdown(true))) die("shutdown", e);
    mpr_debug_info_t d;
    mpr_get_debug_info(&d);
    if (d.rref_owners || d.rref_users) fprintf(stderr, "bench_rref: rank %d: RRefs left after shutdown\n", rank);
    mpr_registry_clear();
    MPI_Finalize();
    return 0;
}
