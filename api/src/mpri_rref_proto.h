/* mpri_rref_proto.h — the RRef protocol (rref_proto.c; not installed): the
 * control messages it sends, the thread-local recording of RRefs decoded
 * while handling a request, and the encode journal. It sits above the RRef
 * context (mpri_rref.h, rref_context.c), whose state it reads and changes;
 * the context never calls into it except through the delete sender this
 * layer registers at install (mpri_rref_set_delete_sender). */
#ifndef MPRI_RREF_PROTO_H
#define MPRI_RREF_PROTO_H

#include <stdbool.h>

#include "mpri_rref.h"

/* A new PENDING `user` (borrowed) asks its owner to record its fork; `parent`
 * (a rank) gets CHILD_ACCEPT once the owner acknowledged it, or at once if
 * the request cannot be sent (the user then fails). */
void mpri_rref_send_fork_request(mpr_rref_t *user, int parent);
void mpri_rref_send_child_accept(int parent, mpri_gid_t fork);

/* Thread-local recording of the RRefs decoded while handling a request
 * (PyTorch's recordThreadLocalPendingRRefs): end returns NULL if all are
 * ready, else a future (new reference) completing once they are. */
void mpri_rref_record_begin(void);
mpr_future_t *mpri_rref_record_end(void);
void mpri_rref_record_ready_future(mpr_future_t *f);
/* Bracket the encode of a message's values and, for a call, its send:
 * begin returns a mark; end(mark, false) undoes the forks the RRefs encoded
 * since the mark registered, since the message never left; end(mark, true)
 * keeps them (for an enclosing bracket to decide, or for good at the
 * outermost). Brackets nest per thread. */
size_t mpri_rref_encode_begin(void);
void mpri_rref_encode_end(size_t mark, bool ok);

/* RRef value ops, control handlers, and the context's delete sender; in the
 * api layer's ordered init (init.c), after mpri_rref_context_install. */
mpr_err_t mpri_rref_proto_install(void);

#endif
