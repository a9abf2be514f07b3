/* init.c — mpr_init: the optim layer's init (the DistributedOptimizer's
 * functions and object type), then the autograd layer's
 * (mpri_autograd_init), the api layer's (mpri_api_init) and the runtime's
 * (mpri_world_init).
 *
 * Each layer installs into the tables of the layers below it, never the
 * other way round, so the public mpr_init lives here, in the highest layer
 * that installs anything. A worker must be able to serve the
 * DistributedOptimizer's calls whether or not it ever makes one itself.
 *
 * Invariants: the optim step runs at most once per process (a failure, a
 * name registered twice, is a bug in the library and is reported by every
 * later mpr_init, which then starts nothing). */
#include <pthread.h>
#include <stdio.h>

#include "mpri_autograd_init.h"
#include "mpri_init.h"
#include "mpri_optim.h"
#include "mpri_runtime.h"

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static bool done;
static mpr_err_t result;
static char failure[MPR_ERROR_TEXT_MAX];

static mpr_err_t optim_init(void) {
    pthread_mutex_lock(&init_lock);
    if (!done) {
        mpr_error_clear();
        result = mpri_dist_optim_install();
        if (result)
            snprintf(failure, sizeof failure, "mpirpc optim init: installing the DistributedOptimizer failed: %s",
                     mpr_last_error()[0] ? mpr_last_error() : mpr_strerror(result));
        done = true;
    }
    mpr_err_t e = result;
    pthread_mutex_unlock(&init_lock);
    return e ? mpr_error_set(e, "%s", failure) : MPR_OK;
}

mpr_err_t mpr_init(const mpr_init_options_t *opts) {
    mpr_err_t e = optim_init();
    if (!e) e = mpri_autograd_init();
    if (!e) e = mpri_api_init();
    return e ? e : mpri_world_init(opts);
}
