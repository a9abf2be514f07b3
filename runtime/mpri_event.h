/* mpri_event.h — one process-wide wake-up event (not installed).
 *
 * Threads that have nothing to do sleep on it; anything that may unblock them
 * (a future completing, a task queued, a waiter giving up the progress role,
 * shutdown) signals it. Signalling is an atomic increment and costs a
 * wake-up system call only when someone sleeps; it never blocks (it is
 * called in the progress context). Sleepers always pass a timeout, so a
 * missed signal costs latency, never a hang. */
#ifndef MPRI_EVENT_H
#define MPRI_EVENT_H

#include <stdint.h>

uint64_t mpri_event_generation(void);
void mpri_event_signal(void);
/* Sleep until the generation differs from `seen` or `timeout_ns` passed. */
void mpri_event_wait(uint64_t seen, int64_t timeout_ns);

/* Monotonic clock in nanoseconds. */
int64_t mpri_now_ns(void);
/* A pause for spin loops. */
static inline void mpri_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

#endif
