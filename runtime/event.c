/* event.c — the process-wide wake-up event and the monotonic clock.
 *
 * The event is a futex word (a 32-bit generation counter) with no mutex and
 * no condition variable: signalling is an atomic increment plus, only when
 * someone sleeps, one FUTEX_WAKE system call, so it never blocks. It is
 * signalled from the progress context (a future completing inside a poll
 * that holds the poll lock), where waiting is forbidden; the previous
 * mutex + pthread_cond_broadcast could wait there behind a descheduled
 * sleeper (the lock, or glibc's condvar quiescing its waiters): under ASan
 * on 2 loaded cores a progress thread sat in a futex wait holding the poll
 * lock for over 0.6 s, and its rank stopped (issue #10).
 *
 * Invariant (no lost wake-up, Dekker, all seq_cst): a sleeper increments
 * `sleepers` before it reads the generation, and a signaller increments the
 * generation before it reads `sleepers`; so either the sleeper sees the new
 * generation and does not sleep, or the signaller sees it and wakes it (and
 * FUTEX_WAIT itself returns at once if the word moved after the read).
 * Generations are compared for equality only: the wrap at 2^32 is harmless.
 * The keyed shards below follow the same protocol, each on its own word. */
#include "mpri_event.h"

#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static _Atomic uint32_t generation;
static atomic_int sleepers;
static _Thread_local bool woke; /* a FUTEX_WAKE of this thread woke someone (mpri_event_take_woke) */

static void wake_all(_Atomic uint32_t *word) {
    if (syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0) > 0) woke = true;
}

bool mpri_event_take_woke(void) {
    bool w = woke;
    woke = false;
    return w;
}

int64_t mpri_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

uint64_t mpri_event_generation(void) { return atomic_load(&generation); }

void mpri_event_signal(void) {
    atomic_fetch_add(&generation, 1);
    if (atomic_load(&sleepers) > 0) wake_all(&generation);
}

void mpri_event_wait(uint64_t seen, int64_t timeout_ns) {
    if (timeout_ns <= 0) return;
    struct timespec rel = {.tv_sec = timeout_ns / 1000000000LL, .tv_nsec = timeout_ns % 1000000000LL};
    atomic_fetch_add(&sleepers, 1);
    if (atomic_load(&generation) == (uint32_t)seen) /* a relative timeout; EINTR/EAGAIN: the caller re-checks */
        syscall(SYS_futex, (uint32_t *)&generation, FUTEX_WAIT_PRIVATE, (uint32_t)seen, &rel, NULL, 0);
    atomic_fetch_sub(&sleepers, 1);
}

/* The keyed shards: a word and a sleeper count each, as the global pair. */
#define KEY_SHARDS 64
static struct {
    _Atomic uint32_t word;
    atomic_int sleepers;
} shards[KEY_SHARDS];

static unsigned shard_of(const void *key) {
    uint64_t k = (uint64_t)(uintptr_t)key;
    k = (k ^ (k >> 29)) * 0x9E3779B97F4A7C15ull; /* spread allocator-aligned addresses */
    return (unsigned)(k >> 58);                   /* top 6 bits: 0..63 */
}

uint64_t mpri_event_generation_key(const void *key) { return atomic_load(&shards[shard_of(key)].word); }

static void signal_shard(unsigned i) {
    atomic_fetch_add(&shards[i].word, 1);
    if (atomic_load(&shards[i].sleepers) > 0) wake_all(&shards[i].word);
}

void mpri_event_signal_key(const void *key) { signal_shard(shard_of(key)); }

void mpri_event_signal_all_keys(void) {
    for (unsigned i = 0; i < KEY_SHARDS; i++) signal_shard(i);
}

void mpri_event_wait_key(const void *key, uint64_t seen, int64_t timeout_ns) {
    if (timeout_ns <= 0) return;
    unsigned i = shard_of(key);
    struct timespec rel = {.tv_sec = timeout_ns / 1000000000LL, .tv_nsec = timeout_ns % 1000000000LL};
    atomic_fetch_add(&shards[i].sleepers, 1);
    if (atomic_load(&shards[i].word) == (uint32_t)seen)
        syscall(SYS_futex, (uint32_t *)&shards[i].word, FUTEX_WAIT_PRIVATE, (uint32_t)seen, &rel, NULL, 0);
    atomic_fetch_sub(&shards[i].sleepers, 1);
}
