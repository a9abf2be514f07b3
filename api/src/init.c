/* init.c — the api layer's ordered init (mpri_api_init), which the public
 * mpr_init (optim/init.c, the highest layer that installs anything) runs
 * after the layers above have installed theirs, before the runtime's.
 *
 * The runtime (runtime/) never names the layers above it: they plug in
 * through tables it offers (message handlers, opaque value kinds, debug-info
 * and shutdown hooks). Instead of each file installing its part from an
 * __attribute__((constructor)) in link order, with errors ignored, the api
 * layer installs them here, in one ordered list, as nng's init.c orders its
 * subsystems, and mpr_init runs that list before the runtime's world init
 * (mpri_world_init, runtime/world.c) starts the threads that dispatch
 * messages. The public mpr_init therefore lives in the highest layer that
 * installs anything (optim/init.c): calling down is allowed, calling up
 * is not.
 *
 * Order: value kinds before handlers (a handler decodes values of those
 * kinds); the RRef context's hooks before the RRef handlers; the call path
 * last. The layer above (distributed autograd) installs its call hooks
 * (mpri_call_set_hooks) and handlers from its own init, which mpr_init
 * runs first.
 *
 * Invariants: the list runs at most once per process (a failed step is a
 * bug in the library — a full table or a bad kind — and is reported by every
 * later mpr_init, which then starts nothing); it has finished before any
 * message can be dispatched. Creating an object value runs the list too
 * (objects may be made before mpr_init and need their kind's release). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "mpri_call.h"
#include "mpri_init.h"
#include "mpri_registry.h"
#include "mpri_rref.h"
#include "mpri_rref_proto.h"
#include "mpri_runtime.h"

static mpr_err_t install_object_kind(void) {
    mpri_rref_object_install();
    return MPR_OK;
}

static const struct {
    const char *name;
    mpr_err_t (*install)(void);
} api_steps[] = {
    {"object values", install_object_kind},
    {"RRef context hooks", mpri_rref_context_install},
    {"RRef values and control handlers", mpri_rref_proto_install},
    {"function names for traces and statistics", mpri_registry_install_namer},
    {"CALL handler", mpri_call_install},
    {"REMOTE_CALL handler", mpri_remote_call_install},
};

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static bool api_done;
static atomic_bool api_ready; /* done and succeeded: the lock-free fast path */
static mpr_err_t api_result;
static char api_failure[MPR_ERROR_TEXT_MAX];

mpr_err_t mpri_api_init(void) {
    if (atomic_load_explicit(&api_ready, memory_order_acquire)) return MPR_OK;
    pthread_mutex_lock(&init_lock);
    if (!api_done) {
        for (size_t i = 0; i < sizeof api_steps / sizeof api_steps[0] && !api_result; i++) {
            mpr_error_clear();
            mpr_err_t e = api_steps[i].install();
            if (e)
                snprintf(api_failure, sizeof api_failure, "mpirpc api init: installing the %s failed: %s",
                         api_steps[i].name, mpr_last_error()[0] ? mpr_last_error() : mpr_strerror(e));
            api_result = e;
        }
        api_done = true;
        if (!api_result) atomic_store_explicit(&api_ready, true, memory_order_release);
    }
    mpr_err_t e = api_result;
    pthread_mutex_unlock(&init_lock);
    return e ? mpr_error_set(e, "%s", api_failure) : MPR_OK;
}


#ifdef MPIRPC_CORE_ONLY
/* Core-only builds (runtime and api, a developer option) have no autograd
 * or optim layer; optim/init.c holds the public mpr_init otherwise. */
mpr_err_t mpr_init(const mpr_init_options_t *opts) {
    mpr_err_t e = mpri_api_init();
    return e ? e : mpri_world_init(opts);
}
#endif
