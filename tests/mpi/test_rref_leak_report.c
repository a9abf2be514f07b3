/* test_rref_leak_report.c — a leak is reported with its id. Run with 2 ranks.
 *
 * Rank 1 holds a UserRRef of an object rank 0 owns and leaves the job with
 * mpr_shutdown(false): its user is never deleted. Rank 0's graceful
 * shutdown completes without rank 1 and must report the OwnerRRef that still
 * has a fork, naming the RRef id; a non-graceful rank reports nothing. The
 * debug counters are zero on both afterwards. (With every rank shutting down
 * gracefully nothing leaks: test_shutdown_rrefs.) */
#include <fcntl.h>

#include "rref_test_util.h"

static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

int main(int argc, char **argv) {
    register_common();
    init_runtime(&argc, &argv, 2);
    CHECK(size == 2);
    mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_int(1));
    mpr_rref_t *r = mpr_rref_create_local(args);
    mpr_value_release(args);
    /* capture this rank's stderr */
    char path[64];
    snprintf(path, sizeof path, "/tmp/mpirpc_leak_report_%d_%d.txt", (int)getpid(), rank);
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    CHECK(saved >= 0 && fd >= 0);
    mpitest_barrier();
    if (rank == 0) {
        mpr_value_t *a = mpr_value_list_of(1, mpr_value_new_rref(r)), *res = NULL;
        CHECK_OK(mpr_rpc_sync(mpr_to_rank(1), "keep", a, 10, &res)); /* rank 1 now holds a user */
        mpr_value_release(res);
        mpr_value_release(a);
        mpr_rref_release(r);
        mpitest_barrier(); /* the reply is here: rank 1 may leave */
        dup2(fd, 2);
        CHECK_OK(mpr_shutdown(true)); /* completes without rank 1 */
    } else {
        mpr_rref_release(r);
        mpitest_barrier(); /* rank 0's keep() ran here */
        CHECK(nkept == 1);
        dup2(fd, 2);
        CHECK_OK(mpr_shutdown(false));
    }
    fflush(stderr);
    dup2(saved, 2);
    close(fd);
    close(saved);
    char *text = slurp(path);
    CHECK(text != NULL);
    fprintf(stderr, "[rank %d] captured: %s", rank, text ? text : "(nothing)");
    if (rank == 0) {
        CHECK_CONTAINS(text, "worker0: RRef leak: OwnerRRef(0:");
        CHECK_CONTAINS(text, "still has 1 fork(s): user(");
    } else {
        CHECK(strstr(text, "RRef leak") == NULL);
    }
    unlink(path);
    mpr_debug_info_t d;
    CHECK_OK(mpr_get_debug_info(&d));
    CHECK(d.rref_owners == 0 && d.rref_users == 0 && d.rref_pending_users == 0 && d.rref_pending_children == 0);
    drop_kept_local(); /* the leaked user: released locally, nothing sent */
    printf("[rank %d] leak report checked\n", rank);
    mpr_registry_clear();
    return 0;
}
