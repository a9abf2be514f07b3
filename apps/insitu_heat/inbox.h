/* apps/insitu_heat/inbox.h — the learner side of the coupling's transport:
 * the handlers of INSITU_SAMPLE_FN and INSITU_DONE_FN (insitu.h) and the
 * bounded FIFO of samples they feed, which the learner's training loop pops.
 *
 * Back-pressure: INSITU_SAMPLE_FN is an async function. A sample is always
 * queued, but its reply is sent only while it is among the first `capacity`
 * samples of the queue; a later one's reply waits until the training loop
 * has popped enough samples before it. A simulation rank never has more
 * than its window of samples without a reply (stream.h), so the queue holds
 * at most capacity + (sum of the windows) samples, and no pool thread is
 * held while a reply waits.
 *
 * PROTOCOL per sample: QUEUED_ACKED (reply sent: position < capacity) or
 * QUEUED_WAITING (position >= capacity, reply pending) -> POPPED (owned by
 * the training loop). Invariant: the acknowledged samples are exactly the
 * first min(len, capacity) of the queue; every sample popped was acked.
 * Done: INSITU_DONE_FN from simulation rank s adds its count of samples
 * sent; when all `expected_sims` ranks said done, inbox_pop returns 0 once
 * the queue is empty, and then received == announced (checked).
 *
 * One inbox per process (the handlers are registered once per process).
 * Popped tensors are owned by the caller. */
#ifndef INSITU_HEAT_INBOX_H
#define INSITU_HEAT_INBOX_H

#include <stdint.h>

#include "mpirpc/error.h"
#include "mpirpc/tensor.h"

typedef struct inbox_sample {
    int64_t step;
    int sim_rank;
    mpr_tensor_t *x, *y; /* new references: the caller releases them */
} inbox_sample_t;

typedef struct inbox_counts {
    int64_t received;  /* samples that arrived */
    int64_t bytes;     /* their tensor bytes */
    int64_t announced; /* samples the finished simulation ranks said they sent */
    int sims_done;
    int64_t max_len;   /* the longest the queue was */
} inbox_counts_t;

/* Register both functions: on every rank, before mpr_init. */
mpr_err_t inbox_register(void);
/* On a learner rank, before mpr_init: the acknowledged window and how many
 * simulation ranks send to this learner. */
void inbox_configure(int capacity, int expected_sims);
/* The oldest sample, waiting for one: 1 with *out filled, or 0 when every
 * simulation rank is done and the queue is empty. */
int inbox_pop(inbox_sample_t *out);
/* Like inbox_pop without waiting: 1, or 0 when the queue is empty now. */
int inbox_try_pop(inbox_sample_t *out);
inbox_counts_t inbox_counts(void);
/* Release what is left (after mpr_shutdown; normally nothing). */
void inbox_cleanup(void);

#endif
