/* doorbell.c — wake-ups between the ranks of one host (mpri_doorbell.h).
 *
 * Why: an idle rank's progress thread has to notice the next message. It
 * polls (spin, then yield for 2 ms) and then sleeps up to 1 ms at a time;
 * with plain sleeps a message to an idle rank on a busy host waited
 * 0.1-2 ms to be probed (median 120-380 us between the two stages of the
 * pipeline app on 2 cores, p90 2 ms). Shared memory has no interrupt, so
 * the sender tells the sleeper: every rank has a bell, a cache line in a
 * segment the host's ranks share, and sleeps on it in a futex; a sender on
 * the same host rings it after posting.
 *
 * The segment: the host's first rank creates it (shm_open, a name made of
 * its pid and the clock, O_EXCL), sends the name to the others over a host
 * communicator (MPI_Comm_split_type SHARED), each maps it, and after a
 * barrier the creator unlinks the name, so nothing is left behind even if
 * the job is killed later. If any rank of the host could not map it, no
 * rank of the host uses it (all or none, agreed by an allreduce). Bells of
 * ranks on other hosts are absent: their
 * messages are found when the sleeper's bounded sleep ends, as before.
 *
 * STATE MACHINE of a bell (its owner's progress thread, `sleeping`):
 *
 *   AWAKE  --owner: s = seq; sleeping = 1; poll once-------------> ARMED
 *   ARMED  --the poll found work: sleeping = 0-------------------> AWAKE
 *   ARMED  --futex_wait(seq, s, timeout) returns (rung: seq != s,
 *            timeout, signal): sleeping = 0-----------------------> AWAKE
 *   any    --a ringer, after posting: if sleeping, seq++, wake---> same
 *
 * No lost wake-up (Dekker, all seq_cst): the owner stores sleeping = 1 and
 * then probes MPI (twice, see mpri_doorbell_sleep); a ringer makes its message visible (MPI_Isend into the
 * peer's shared-memory FIFO) and then loads `sleeping`. Either the owner's
 * probe finds the message, or the ringer sees 1 and increments seq, which
 * makes a futex_wait that compares against the old s return at once. A
 * message Open MPI could not place in the FIFO at once (full) is found when
 * the sleep's timeout ends: the bound of the old policy, never worse.
 *
 * Invariants (asserted): only the owner's thread arms its bell and it never
 * arms it twice (sleeping is 0 when it arms); a retired table is never read
 * by a ringer of a later init (the pointer is swapped, the mapping kept). */
#include "mpri_doorbell.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "mpri_assert.h"

#define BELL_BYTES 64 /* one cache line per rank: a ring touches only its line */

typedef struct bell {
    _Atomic uint32_t seq;      /* the futex word: bumped by every ring of a sleeper */
    _Atomic uint32_t sleeping; /* 1 while the owner is ARMED */
    char pad[BELL_BYTES - 2 * sizeof(uint32_t)];
} bell_t;

_Static_assert(sizeof(bell_t) == BELL_BYTES, "one bell per cache line");

typedef struct table {
    int size;       /* ranks of the communicator */
    int rank;       /* this rank in it */
    bool all_local; /* every rank has a bell */
    bell_t **bells; /* [size]: a rank's bell, NULL when it is on another host */
    void *map;      /* the segment's mapping */
    size_t map_bytes;
} table_t;

static _Atomic(table_t *) current;
static table_t *retired; /* the previous init's table: unmapped at the next init */
static atomic_uint_fast64_t rings_sent;

static long futex(_Atomic uint32_t *word, int op, uint32_t val, const struct timespec *timeout) {
    return syscall(SYS_futex, (uint32_t *)word, op, val, timeout, NULL, 0);
}

static void table_free(table_t *t) {
    if (!t) return;
    if (t->map) munmap(t->map, t->map_bytes);
    free(t->bells);
    free(t);
}

/* The host's first rank: a fresh segment of `bytes`, its name in `name`
 * ("" on failure). */
static void create_segment(char *name, size_t cap, size_t bytes) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(name, cap, "/mpirpc-bells-%ld-%ld", (long)getpid(), (long)ts.tv_nsec);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        name[0] = '\0';
        return;
    }
    if (ftruncate(fd, (off_t)bytes) != 0) { /* zero-filled: every bell AWAKE, seq 0 */
        shm_unlink(name);
        name[0] = '\0';
    }
    close(fd);
}

bool mpri_doorbell_init(MPI_Comm comm) {
    table_free(retired);
    retired = NULL;
    MPRI_ASSERT(atomic_load(&current) == NULL, "mpri_doorbell_init twice without mpri_doorbell_fini");
    table_t *t = calloc(1, sizeof *t);
    MPI_Comm host = MPI_COMM_NULL;
    MPI_Group g_all = MPI_GROUP_NULL, g_host = MPI_GROUP_NULL;
    int *host_ranks = NULL, *all_ranks = NULL;
    int ok = t != NULL;
    int size = 0, rank = 0, hsize = 0, hrank = 0;
    MPI_Comm_size(comm, &size);
    MPI_Comm_rank(comm, &rank);
    /* Collective from here to the allreduce on every rank, whatever fails. */
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host) != MPI_SUCCESS) {
        free(t);
        return false; /* every rank's split failed alike or the job is broken anyway */
    }
    MPI_Comm_size(host, &hsize);
    MPI_Comm_rank(host, &hrank);
    size_t bytes = (size_t)hsize * BELL_BYTES;
    char name[64] = "";
    if (hrank == 0) create_segment(name, sizeof name, bytes);
    MPI_Bcast(name, (int)sizeof name, MPI_CHAR, 0, host);
    void *map = MAP_FAILED;
    if (name[0]) {
        int fd = shm_open(name, O_RDWR, 0600);
        if (fd >= 0) {
            map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            close(fd);
        }
    }
    MPI_Barrier(host); /* everyone mapped (or failed to): the name can go */
    if (hrank == 0 && name[0]) shm_unlink(name);
    /* Which rank of `comm` each host rank is. */
    host_ranks = malloc(sizeof *host_ranks * (size_t)hsize);
    all_ranks = malloc(sizeof *all_ranks * (size_t)hsize);
    if (t) t->bells = calloc((size_t)size, sizeof *t->bells);
    ok = ok && map != MAP_FAILED && host_ranks && all_ranks && t->bells &&
         MPI_Comm_group(host, &g_host) == MPI_SUCCESS && MPI_Comm_group(comm, &g_all) == MPI_SUCCESS;
    if (ok) {
        for (int i = 0; i < hsize; i++) host_ranks[i] = i;
        ok = MPI_Group_translate_ranks(g_host, hsize, host_ranks, g_all, all_ranks) == MPI_SUCCESS;
    }
    /* Bells on this host for all its ranks or for none: a rank that could
     * not map the segment would neither ring nor watch its bell while the
     * others counted on it (shorter polling before they sleep). */
    int mine = ok, everyone = 0;
    if (MPI_Allreduce(&mine, &everyone, 1, MPI_INT, MPI_LAND, host) != MPI_SUCCESS) everyone = 0;
    ok = everyone;
    if (ok) {
        for (int i = 0; i < hsize; i++) {
            MPRI_ASSERT(all_ranks[i] >= 0 && all_ranks[i] < size, "a host rank outside the communicator");
            t->bells[all_ranks[i]] = (bell_t *)((char *)map + (size_t)i * BELL_BYTES);
        }
        t->size = size;
        t->rank = rank;
        t->all_local = hsize == size;
        t->map = map;
        t->map_bytes = bytes;
        atomic_store(&current, t);
    } else {
        if (map != MAP_FAILED) munmap(map, bytes);
        if (t) free(t->bells);
        free(t);
    }
    if (g_host != MPI_GROUP_NULL) MPI_Group_free(&g_host);
    if (g_all != MPI_GROUP_NULL) MPI_Group_free(&g_all);
    free(host_ranks);
    free(all_ranks);
    MPI_Comm_free(&host);
    return ok;
}

void mpri_doorbell_fini(void) {
    table_t *t = atomic_exchange(&current, NULL);
    if (!t) return;
    table_free(retired);
    retired = t;
}

bool mpri_doorbell_covers_all(void) {
    table_t *t = atomic_load(&current);
    return t && t->all_local;
}

int mpri_doorbell_sleep(int64_t timeout_ns, int (*poll)(void)) {
    table_t *t = atomic_load(&current);
    bell_t *b = t ? t->bells[t->rank] : NULL;
    if (!b) {
        struct timespec ts = {timeout_ns / 1000000000LL, timeout_ns % 1000000000LL};
        nanosleep(&ts, NULL);
        return 0;
    }
    uint32_t s = atomic_load(&b->seq);
    MPRI_ASSERT(atomic_load(&b->sleeping) == 0, "a bell is armed by its owner only, once at a time");
    atomic_store(&b->sleeping, 1);
    /* Twice: an MPI probe matches first and makes progress after, so a
     * message its progress pulled in from shared memory is reported only
     * by the next probe (test_doorbell lost one wake-up in a few hundred
     * with a single probe). Messages posted after the arming ring. */
    int events = poll ? poll() : 0;
    if (events == 0 && poll) events = poll();
    if (events == 0) {
        struct timespec ts = {timeout_ns / 1000000000LL, timeout_ns % 1000000000LL};
        /* Not FUTEX_PRIVATE: the word is shared with other processes. */
        futex(&b->seq, FUTEX_WAIT, s, &ts);
    }
    atomic_store(&b->sleeping, 0);
    return events;
}

static void wake(bell_t *b) {
    atomic_fetch_add(&b->seq, 1);
    futex(&b->seq, FUTEX_WAKE, 1, NULL);
}

void mpri_doorbell_ring(int rank) {
    table_t *t = atomic_load_explicit(&current, memory_order_acquire);
    if (!t || rank < 0 || rank >= t->size) return;
    bell_t *b = t->bells[rank];
    if (!b) return;
    atomic_thread_fence(memory_order_seq_cst); /* the message posted before, `sleeping` read after */
    if (atomic_load(&b->sleeping)) {
        wake(b);
        atomic_fetch_add_explicit(&rings_sent, 1, memory_order_relaxed);
    }
}

void mpri_doorbell_wake_self(void) {
    table_t *t = atomic_load(&current);
    if (t && t->bells[t->rank]) wake(t->bells[t->rank]);
}

uint64_t mpri_doorbell_rings_sent(void) { return atomic_load(&rings_sent); }

bool mpri_doorbell_is_sleeping(int rank) {
    table_t *t = atomic_load(&current);
    return t && rank >= 0 && rank < t->size && t->bells[rank] && atomic_load(&t->bells[rank]->sleeping);
}
