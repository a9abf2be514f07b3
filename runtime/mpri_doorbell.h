/* mpri_doorbell.h — wake-ups between the ranks of one host, so that an idle
 * rank's progress thread sleeps instead of polling and still sees a message
 * from a rank on its host within one wake-up (doorbell.c has the protocol).
 *
 * Ownership: the runtime owns the shared segment and the table of bells;
 * mpri_doorbell_init maps them (collective over the runtime's communicator),
 * mpri_doorbell_fini retires them (local, no MPI). Only a rank's progress
 * thread sleeps on its own bell; any thread may ring any bell. */
#ifndef MPRI_DOORBELL_H
#define MPRI_DOORBELL_H

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>

/* Collective over `comm`. Never fails the caller: without a segment (no
 * shared memory, an MPI failure) every bell is absent, a sleep is then a
 * plain timed sleep and a ring does nothing, as before doorbells existed.
 * Returns whether this rank has a bell. */
bool mpri_doorbell_init(MPI_Comm comm);

/* Local: bells are rung no more; the mapping stays until the next init (a
 * thread still ringing never touches unmapped memory). */
void mpri_doorbell_fini(void);

/* Whether every other rank of the communicator shares this host's bells
 * (then every message that can arrive comes with a ring). */
bool mpri_doorbell_covers_all(void);

/* Sleep up to timeout_ns, or until this rank's bell rings. `poll` runs
 * after the bell is armed and before sleeping, twice unless the first finds
 * work (an MPI probe reports what its own progress pulled in only at the
 * next probe), so a message posted before the arming is found there: when
 * it returns > 0 there is no sleep.
 * Returns poll's result (0 when it found nothing). */
int mpri_doorbell_sleep(int64_t timeout_ns, int (*poll)(void));

/* Ring `rank`'s bell if its progress thread sleeps on it; call after the
 * message to it is posted. Nothing for a rank without a bell. */
void mpri_doorbell_ring(int rank);

/* Wake this rank's own sleeper whether it sleeps or not (the stop). */
void mpri_doorbell_wake_self(void);

/* Rings that woke a sleeper, sent by this rank (for tests and statistics). */
uint64_t mpri_doorbell_rings_sent(void);

/* Whether `rank`'s progress thread is asleep on its bell now (tests). */
bool mpri_doorbell_is_sleeping(int rank);

#endif
