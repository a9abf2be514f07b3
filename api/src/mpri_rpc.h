/* mpri_rpc.h — the caller side's one path for a call (rpc.c), with what the
 * public mpr_rpc_async does not say: whether the request left.
 *
 * Invariant: *left is true exactly when the request message is on its way
 * (the callee will see it and answer); the returned future may already be
 * complete either way: a local failure fails it before anything is sent,
 * and a fast reply can complete it before the call returns (the caller
 * drains what has arrived after sending). */
#ifndef MPRI_RPC_H
#define MPRI_RPC_H

#include <stdbool.h>

#include "mpirpc/rpc.h"

/* mpr_rpc_async, also telling whether the request left (`left` not NULL). */
mpr_future_t *mpri_rpc_async_sent(mpr_dest_t to, const char *fn, const mpr_value_t *args, double timeout_s,
                                  bool *left);

#endif
