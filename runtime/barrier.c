/* barrier.c — mpr_barrier: wait until every worker reached the barrier,
 * without burning a core.
 *
 * An MPI_Ibarrier on the runtime's private barrier communicator (dup'd at
 * mpr_init, freed at shutdown) is tested with exponentially growing sleeps
 * (2 us doubling up to 1 ms), so a rank waiting for slow peers costs almost
 * no CPU while the progress thread and the pool keep serving calls.
 *
 * State (per process, under `lock`): IDLE (no request) or PENDING (an
 * Ibarrier that timed out). A call in PENDING resumes waiting for that same
 * barrier instead of starting a new one, so ranks stay matched: a timed-out
 * barrier is retried, never skipped. Calls from several threads of one rank
 * are serialized (each is one barrier). */
#include <pthread.h>
#include <time.h>

#include "mpri_assert.h"
#include "mpri_event.h"
#include "mpri_runtime.h"

#define BARRIER_SLEEP_MIN_NS 2000
#define BARRIER_SLEEP_MAX_NS 1000000

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static MPI_Request pending = MPI_REQUEST_NULL; /* PENDING when not MPI_REQUEST_NULL */
static MPI_Comm pending_comm = MPI_COMM_NULL;  /* the communicator `pending` runs on */

mpr_err_t mpr_barrier(double timeout_s) {
    mpr_err_t e = mpri_check_running("mpr_barrier");
    if (e) return e;
    if (timeout_s < 0) timeout_s = mpri_rt.default_timeout_s;
    pthread_mutex_lock(&lock);
    if (pending != MPI_REQUEST_NULL && pending_comm != mpri_rt.barrier_comm) {
        /* left over from an earlier run of the runtime: that communicator is gone */
        pending = MPI_REQUEST_NULL;
    }
    if (pending == MPI_REQUEST_NULL) {
        if (MPI_Ibarrier(mpri_rt.barrier_comm, &pending) != MPI_SUCCESS) {
            pending = MPI_REQUEST_NULL;
            pthread_mutex_unlock(&lock);
            return mpr_error_set(MPR_ERR_MPI, "mpr_barrier: MPI_Ibarrier failed");
        }
        pending_comm = mpri_rt.barrier_comm;
    }
    int64_t deadline = timeout_s > 0 ? mpri_now_ns() + (int64_t)(timeout_s * 1e9) : 0;
    long sleep_ns = BARRIER_SLEEP_MIN_NS;
    for (;;) {
        int done = 0;
        if (MPI_Test(&pending, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
            pending = MPI_REQUEST_NULL;
            pthread_mutex_unlock(&lock);
            return mpr_error_set(MPR_ERR_MPI, "mpr_barrier: MPI_Test failed");
        }
        if (done) break;
        if (deadline && mpri_now_ns() >= deadline) {
            pthread_mutex_unlock(&lock);
            return mpr_error_set(MPR_ERR_TIMEOUT,
                                 "mpr_barrier: not every worker reached the barrier within %.3f s (the "
                                 "barrier stays pending: call mpr_barrier again to keep waiting for it)",
                                 timeout_s);
        }
        int s = mpri_state();
        if (s != MPRI_RUNNING && s != MPRI_STOPPING) {
            pthread_mutex_unlock(&lock);
            return mpr_error_set(MPR_ERR_SHUTDOWN, "mpr_barrier: the runtime shut down while waiting");
        }
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < BARRIER_SLEEP_MAX_NS) sleep_ns *= 2;
    }
    MPRI_ASSERT(pending == MPI_REQUEST_NULL, "MPI_Test completed the barrier request");
    pthread_mutex_unlock(&lock);
    return MPR_OK;
}
