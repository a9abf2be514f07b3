/* test_shutdown_pending_sweep.c — graceful shutdown sweeps a user RRef that
 * is still PENDING (its owner has not confirmed it yet); the delete must go
 * to the owner once the owner confirms it (delete_due, rref_context.c), so
 * the owner frees the value and nothing leaks.
 *
 * Why hooks: in a real job the state cannot arise while the owner is alive
 * (the termination rounds count the FORK_REQUEST and its ack, so the job is
 * not quiescent while a fork is unconfirmed); it is the case the sweep must
 * still get right, and only the Debug state checker covered it. The test
 * reaches it deterministically with the runtime's own shutdown hooks, using
 * only the real protocol paths:
 *
 *   np 3: rank 0 = owner O, rank 1 = user U, rank 2 = a bystander user.
 *   1. O shares a tracked object with U (make_local: U's user is confirmed);
 *      U forks it to rank 2 (keep), a user-to-user fork kept through shutdown.
 *   2. U encodes its RRef for itself (mpri_value_encode: a real fork; U keeps
 *      its user as the parent of a pending child, G2) and holds the bytes.
 *   3. Every rank calls mpr_shutdown(true). At quiescence the on_quiescent
 *      hooks run, in registration order:
 *      - U, before the RRef sweep: decodes the bytes (the child is a new
 *        PENDING user; its FORK_REQUEST goes to O).
 *      - O, before its sweep: holds the RRef layer's lock until U reports
 *        that its sweep ran, so O's progress thread cannot answer U's fork
 *        request before U's sweep (no timing involved).
 *      - The RRef sweep: on U the new user is deleted while PENDING.
 *      - U, after the sweep: checks the user is deleted, PENDING, delete due,
 *        and tells O (MPI, on a test communicator).
 *   4. O then acks the fork; U confirms its user and must now send its
 *      USER_DELETE (the DRAINING rounds wait for it). O's value is freed.
 * Checks: O's object destroyed and no owner record left before the runtime's
 * after-stop hooks run (the delete reached O; the leak report would
 * otherwise drop the record), the user confirmed in the end, an empty leak
 * report on every rank (stderr captured), RRef debug counters zero, message
 * counts balanced, every tracked object destroyed. Without the delete_due
 * handling the owner keeps U's fork: "RRef leak: OwnerRRef ... still has 1
 * fork(s)" and the object is freed only by the after-stop drop. */
#include <fcntl.h>
#include <stdatomic.h>
#include <unistd.h>

#include "mpri_codec.h"
#include "mpri_rref.h"
#include "mpri_runtime.h"
#include "rref_test_util.h"

enum { OWNER = 0, USER = 1, BYSTANDER = 2, TAG_SWEPT = 7 };

static MPI_Comm test_comm;          /* the test's own messages (hook to hook) */
static mpri_buf_t held;             /* U: the encoded fork, decoded at quiescence */
static mpr_value_t *child;          /* U: the decoded value (its RRef is the pending user) */
static atomic_int swept_pending;    /* U: the sweep found the child PENDING with its delete due */
static atomic_int owner_freed_early; /* O: object freed, no owner record, before after_stop */

/* ---- stderr capture (the leak report) ---- */

static int saved_fd = -1, capture_fd = -1;
static char capture_path[96];

static void capture_begin(void) {
    snprintf(capture_path, sizeof capture_path, "/tmp/mpirpc_pending_sweep_%d_%d.txt", (int)getpid(), rank);
    fflush(stderr);
    saved_fd = dup(2);
    capture_fd = open(capture_path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    CHECK(saved_fd >= 0 && capture_fd >= 0);
    dup2(capture_fd, 2);
}

static void capture_end_expect_no_leak(void) {
    fflush(stderr);
    dup2(saved_fd, 2);
    close(capture_fd);
    close(saved_fd);
    static char text[1 << 16];
    FILE *f = fopen(capture_path, "r");
    CHECK(f != NULL);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    unlink(capture_path);
    if (n) fprintf(stderr, "[rank %d] stderr during shutdown:\n%s", rank, text);
    CHECK(strstr(text, "RRef leak") == NULL);
}

/* ---- shutdown hooks ---- */

/* Registered before mpr_init: runs before the RRef layer's sweep. */
static void before_sweep(void) {
    if (rank == USER) {
        mpri_reader_t r;
        mpri_reader_init(&r, held.data, held.len);
        CHECK_OK(mpri_value_decode(&r, NULL, 0, USER, &child)); /* parent: U itself, a user */
        CHECK(r.left == 0 && mpr_value_kind(child) == MPR_VALUE_RREF);
    } else if (rank == OWNER) {
        /* O's progress thread needs this lock to record U's fork: hold it
         * until U's sweep ran. */
        pthread_mutex_lock(&mpri_rref_ctx.lock);
        MPI_Request req;
        int flag = 0, dummy = 0;
        MPI_Irecv(&dummy, 1, MPI_INT, USER, TAG_SWEPT, test_comm, &req);
        for (int i = 0; i < 30000 && !flag; i++) {
            MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
            if (!flag) usleep(1000);
        }
        pthread_mutex_unlock(&mpri_rref_ctx.lock);
        if (!flag) fprintf(stderr, "[rank %d] no word from rank %d's sweep in 30 s\n", rank, USER);
        CHECK(flag);
    }
}

/* Registered after mpr_init: runs after the sweep. */
static void after_sweep(void) {
    if (rank != USER) return;
    mpr_rref_t *u = NULL;
    CHECK_OK(mpr_value_get_rref(child, &u));
    pthread_mutex_lock(&mpri_rref_ctx.lock);
    bool state_reached = !u->is_owner && u->deleted && u->state == USER_PENDING && u->delete_due;
    pthread_mutex_unlock(&mpri_rref_ctx.lock);
    CHECK(state_reached);
    atomic_store(&swept_pending, 1);
    int one = 1;
    MPI_Send(&one, 1, MPI_INT, OWNER, TAG_SWEPT, test_comm);
}

/* after_stop hooks run in reverse order: this one (registered after mpr_init)
 * runs before the RRef layer's leak report and drop. */
static void before_leak_report(void) {
    if (rank == OWNER)
        atomic_store(&owner_freed_early,
                     atomic_load(&tracked_destroyed) == 1 && atomic_load(&mpri_rref_ctx.owners_live) == 0);
}

/* ---- the scenario ---- */

static void run(void) {
    mpr_rref_t *mine = NULL; /* U: its user of O's object */
    if (rank == USER) {
        mpr_value_t *a = mpr_value_list_of(1, mpr_value_new_int(11)), *v = NULL;
        CHECK_OK(mpr_rpc_sync(mpr_to_rank(OWNER), "make_local", a, 10, &v));
        mpr_value_release(a);
        CHECK_OK(mpr_value_get_rref(v, &mine));
        mpr_rref_retain(mine);
        mpr_value_release(v);
        CHECK(mpr_rref_confirmed_by_owner(mine));
        /* A user-to-user fork to the bystander, kept there through shutdown. */
        a = mpr_value_list_of(1, mpr_value_new_rref(mine));
        v = NULL;
        CHECK_OK(mpr_rpc_sync(mpr_to_rank(BYSTANDER), "keep", a, 10, &v));
        mpr_value_release(a);
        mpr_value_release(v);
        /* A fork of U's user to U itself, held as bytes until quiescence. */
        mpr_value_t *rv = mpr_value_new_rref(mine);
        mpri_tensor_list_t tensors;
        mpri_tensor_list_init(&tensors);
        mpri_buf_init(&held);
        CHECK_OK(mpri_value_encode(rv, &held, &tensors, USER));
        CHECK(tensors.len == 0);
        mpri_tensor_list_fini(&tensors);
        mpr_value_release(rv);
        mpr_debug_info_t d;
        CHECK_OK(mpr_get_debug_info(&d));
        CHECK(d.rref_users == 1 && d.rref_pending_users == 0 && d.rref_pending_children >= 1); /* the held fork */
    }
    mpitest_barrier(); /* the bystander's user is confirmed (it ran keep) */
    capture_begin();
    mpr_err_t e = mpr_shutdown(true);
    capture_end_expect_no_leak();
    CHECK_OK(e);

    if (rank == USER) {
        CHECK(atomic_load(&swept_pending) == 1);
        mpr_rref_t *u = NULL;
        CHECK_OK(mpr_value_get_rref(child, &u));
        pthread_mutex_lock(&mpri_rref_ctx.lock);
        bool confirmed = u->state == USER_CONFIRMED && u->deleted && !u->delete_due;
        pthread_mutex_unlock(&mpri_rref_ctx.lock);
        CHECK(confirmed); /* the owner confirmed it after the sweep; its delete went */
        mpr_value_release(child);
        mpr_rref_release(mine);
        mpri_buf_fini(&held);
    }
    if (rank == OWNER) CHECK(atomic_load(&owner_freed_early) == 1);
    if (rank == BYSTANDER) drop_kept_local(); /* deleted by the sweep: nothing more is sent */
    mpr_debug_info_t d;
    CHECK_OK(mpr_get_debug_info(&d));
    CHECK(d.rref_owners == 0 && d.rref_users == 0 && d.rref_pending_users == 0 && d.rref_pending_children == 0 &&
          d.rref_unacked_ctrl_msgs == 0);
    CHECK(d.pending_requests == 0 && d.pool_busy == 0 && d.progress_busy == 0);
    long local[2] = {atomic_load(&tracked_created), atomic_load(&tracked_destroyed)}, sum[2];
    MPI_Allreduce(local, sum, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    CHECK(sum[0] == 1 && sum[1] == 1);
    unsigned long long mine_msgs[2] = {d.msgs_sent, d.msgs_processed}, all[2];
    MPI_Allreduce(mine_msgs, all, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    CHECK(all[0] == all[1]);
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    CHECK(provided == MPI_THREAD_MULTIPLE);
    int world = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    CHECK(world == 3);
    MPI_Comm_dup(MPI_COMM_WORLD, &test_comm);
    rank = mpitest_rank();
    (void)init_runtime; /* shared helpers this test does not use: it owns MPI */
    /* Before anything installs the RRef layer (mpr_register_type does). */
    CHECK_OK(mpri_add_shutdown_hooks(before_sweep, NULL));
    register_common();
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.shutdown_timeout_s = 60;
    CHECK_OK(mpr_init(&opts));
    CHECK_OK(mpri_add_shutdown_hooks(after_sweep, before_leak_report));
    size = mpr_world_size();
    run();
    mpitest_barrier();
    if (rank == 0) printf("[ok] pending user swept by graceful shutdown\n1 passed, 0 failed\n");
    mpr_registry_clear();
    MPI_Comm_free(&test_comm);
    MPI_Finalize();
    return 0;
}
