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

#include <stdbool.h>
#include <stdint.h>

uint64_t mpri_event_generation(void);
void mpri_event_signal(void);
/* Sleep until the generation differs from `seen` or `timeout_ns` passed. */
void mpri_event_wait(uint64_t seen, int64_t timeout_ns);

/* Keyed events: one of 64 shards chosen by `key` (a future's address), for
 * a waiter that needs only that key's signal. A completion wakes the few
 * threads waiting on its shard, not every sleeper of the process: with the
 * process-wide event each completion woke all of them (the storm test's
 * waiters slept and woke ~7 times per call), and on a 2-core VM such
 * sleep/wake storms starved kernel threads for seconds (issue #10).
 * Same rules as above: never blocks to signal; sleepers pass a timeout. */
uint64_t mpri_event_generation_key(const void *key);
void mpri_event_signal_key(const void *key);
void mpri_event_wait_key(const void *key, uint64_t seen, int64_t timeout_ns);
/* Wake every keyed sleeper (the runtime stops: they must look again). */
void mpri_event_signal_all_keys(void);

/* True if a signal of the calling thread woke a sleeper since the last
 * call (and clears it). A poller that completed the future of a thread
 * asleep in a long wait yields its core once on it: that thread often
 * shares the core (a rank bound to one), and it would otherwise run only
 * when the poller's spin ended (50-80 us a wait in the 256x256 dist
 * autograd step, two such waits a step). */
bool mpri_event_take_woke(void);

/* Monotonic clock in nanoseconds. */
int64_t mpri_now_ns(void);
/* A pause for spin loops. */
static inline void mpri_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

#endif
