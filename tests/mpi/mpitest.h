/* mpitest.h — tiny harness for multi-rank tests run by ctest through mpiexec.
 *
 * CHECK* failures print the rank, file, line, condition and mpirpc's last
 * error, then MPI_Abort the whole job (so no rank hangs in a collective and
 * ctest sees a failure). RUN_TEST runs one collective test body on every rank
 * between barriers and rank 0 reports it; the job's exit code is the verdict. */
#ifndef MPITEST_H
#define MPITEST_H

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpirpc/mpirpc.h"

static int mpitest_rank(void) {
    int init = 0, fin = 0, r = -1;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

#define CHECK(cond)                                                                               \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "[rank %d] %s:%d: CHECK failed: %s (last error: %s: %s)\n",           \
                    mpitest_rank(), __FILE__, __LINE__, #cond, mpr_error_name(mpr_last_error_code()), \
                    mpr_last_error());                                                            \
            fflush(stderr);                                                                       \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                         \
        }                                                                                         \
    } while (0)

#define CHECK_OK(expr)                                                                            \
    do {                                                                                          \
        mpr_err_t check_ok_e_ = (expr);                                                           \
        if (check_ok_e_ != MPR_OK) {                                                              \
            fprintf(stderr, "[rank %d] %s:%d: %s returned %s: %s\n", mpitest_rank(), __FILE__,    \
                    __LINE__, #expr, mpr_error_name(check_ok_e_), mpr_last_error());              \
            fflush(stderr);                                                                       \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                         \
        }                                                                                         \
    } while (0)

#define CHECK_ERR(expr, code)                                                                     \
    do {                                                                                          \
        mpr_err_t check_err_e_ = (expr);                                                          \
        if (check_err_e_ != (code)) {                                                             \
            fprintf(stderr, "[rank %d] %s:%d: %s returned %s, expected %s (%s)\n", mpitest_rank(), \
                    __FILE__, __LINE__, #expr, mpr_error_name(check_err_e_), mpr_error_name(code), \
                    mpr_last_error());                                                            \
            fflush(stderr);                                                                       \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                         \
        }                                                                                         \
    } while (0)

#define CHECK_CONTAINS(haystack, needle)                                                          \
    do {                                                                                          \
        const char *h_ = (haystack);                                                              \
        if (!h_ || !strstr(h_, (needle))) {                                                       \
            fprintf(stderr, "[rank %d] %s:%d: '%s' does not contain '%s'\n", mpitest_rank(),      \
                    __FILE__, __LINE__, h_ ? h_ : "(null)", (needle));                            \
            fflush(stderr);                                                                       \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                         \
        }                                                                                         \
    } while (0)

static int mpitest_passed __attribute__((unused));

/* A barrier that sleeps while it waits: Open MPI's MPI_Barrier busy-polls, and
 * on a 2-core machine a rank spinning there starves the ranks doing the work.
 * Tests call it before mpr_init, after mpr_shutdown and while some ranks have
 * stopped their runtime, where the library's mpr_barrier (runtime running on
 * every rank) cannot serve; it therefore stays on MPI_COMM_WORLD. */
static inline void mpitest_barrier(void) {
    MPI_Request req;
    MPI_Ibarrier(MPI_COMM_WORLD, &req);
    for (int done = 0;;) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (done) return;
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

#define RUN_TEST(fn)                                                                              \
    do {                                                                                          \
        mpitest_barrier();                                                                        \
        fn();                                                                                     \
        mpitest_barrier();                                                                        \
        mpitest_passed++;                                                                         \
        if (mpitest_rank() == 0) printf("[ok] %s\n", #fn), fflush(stdout);                        \
    } while (0)

/* Rank 0 prints the closing line ctest-readers understand. */
#define MPITEST_REPORT()                                                                          \
    do {                                                                                          \
        if (mpitest_rank() == 0) printf("%d passed, 0 failed\n", mpitest_passed), fflush(stdout); \
    } while (0)

/* mpr_value_t helpers for tests */
static inline mpr_value_t *ints2(int64_t a, int64_t b) {
    return mpr_value_list_of(2, mpr_value_new_int(a), mpr_value_new_int(b));
}

#endif
