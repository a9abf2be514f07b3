/* event.c — the process-wide wake-up event and the monotonic clock.
 *
 * Invariant: a sleeper increments `sleepers` and re-checks the generation
 * under the mutex before waiting, and a signaller bumps the generation before
 * it looks at `sleepers`, so a signal is never lost between a sleeper's check
 * and its wait. */
#include "mpri_event.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

static atomic_uint_fast64_t generation;
static atomic_int sleepers;
static pthread_mutex_t event_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t event_cond;
static pthread_once_t event_once = PTHREAD_ONCE_INIT;

static void event_init(void) {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&event_cond, &attr);
    pthread_condattr_destroy(&attr);
}

int64_t mpri_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

uint64_t mpri_event_generation(void) { return atomic_load(&generation); }

void mpri_event_signal(void) {
    atomic_fetch_add(&generation, 1);
    if (atomic_load(&sleepers) > 0) {
        pthread_mutex_lock(&event_lock);
        pthread_cond_broadcast(&event_cond);
        pthread_mutex_unlock(&event_lock);
    }
}

void mpri_event_wait(uint64_t seen, int64_t timeout_ns) {
    pthread_once(&event_once, event_init);
    int64_t deadline = mpri_now_ns() + timeout_ns;
    struct timespec ts = {.tv_sec = deadline / 1000000000LL, .tv_nsec = deadline % 1000000000LL};
    pthread_mutex_lock(&event_lock);
    atomic_fetch_add(&sleepers, 1);
    if (atomic_load(&generation) == seen) pthread_cond_timedwait(&event_cond, &event_lock, &ts);
    atomic_fetch_sub(&sleepers, 1);
    pthread_mutex_unlock(&event_lock);
}
