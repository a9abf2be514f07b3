/* init.c — the autograd layer's init (distributed autograd's handlers and
 * hooks, RemoteModule's functions), which the public mpr_init (optim/init.c, the highest layer that
 * installs anything) runs after the optim layer's and before the api
 * layer's (mpri_api_init) and the runtime's (mpri_world_init).
 *
 * Distributed autograd must be in place on every worker before the first
 * message can arrive, whether or not this worker ever begins a context (it
 * may be the callee of a call made inside one), so it is installed here and
 * not on first use. Layers install into the tables of the layers below
 * them, never the other way round.
 *
 * Invariants: the steps run at most once per process; a failed step is a
 * bug in the library (a full table, a second set of call hooks) and is
 * reported by every later mpr_init, which then starts nothing. */
#include <pthread.h>
#include <stdio.h>

#include "dist/mpri_dist.h"
#include "mpri_autograd.h"
#include "mpri_autograd_init.h"
#include "nn/mpri_nn.h"

static const struct {
    const char *name;
    mpr_err_t (*install)(void);
} autograd_steps[] = {
    {"device copies of sent tensors", mpri_device_wire_install},
    {"dist autograd contexts", mpri_dist_context_install},
    {"dist autograd recording hooks", mpri_dist_record_install},
    {"dist autograd backward handler", mpri_dist_backward_install},
    {"RemoteModule functions", mpri_remote_module_install},
};

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static bool done;
static mpr_err_t result;
static char failure[MPR_ERROR_TEXT_MAX];

mpr_err_t mpri_autograd_init(void) {
    pthread_mutex_lock(&init_lock);
    if (!done) {
        for (size_t i = 0; i < sizeof autograd_steps / sizeof autograd_steps[0] && !result; i++) {
            mpr_error_clear();
            mpr_err_t e = autograd_steps[i].install();
            if (e)
                snprintf(failure, sizeof failure, "mpirpc autograd init: installing the %s failed: %s",
                         autograd_steps[i].name, mpr_last_error()[0] ? mpr_last_error() : mpr_strerror(e));
            result = e;
        }
        done = true;
    }
    mpr_err_t e = result;
    pthread_mutex_unlock(&init_lock);
    return e ? mpr_error_set(e, "%s", failure) : MPR_OK;
}
