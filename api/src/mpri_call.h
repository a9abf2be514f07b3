/* mpri_call.h — the callee side of a call: the one path every incoming CALL
 * and REMOTE_CALL takes (call.c), and the hooks distributed autograd will
 * plug into it (not installed).
 *
 * The path (call.c), for a message whose body starts with
 *   u16 name length, function name, <kind's own fields>, argument value:
 *   1. parse the name, then the kind's fields (read_fields); a message that
 *      cannot be parsed is answered MPR_ERR_DECODE and goes no further;
 *   2. look the function up; an unknown one is answered
 *      MPR_ERR_UNKNOWN_FUNCTION after decoding the arguments anyway (RRefs
 *      among them must complete their fork protocol);
 *   3. decode the arguments while recording the RRefs they carry; a call
 *      whose RRefs are not yet confirmed continues once they are, holding no
 *      thread;
 *   4. hooks.on_request (context id in, recv function recorded), then the
 *      function runs with hooks.enter/leave around it (the context is
 *      active on the running thread), giving a future of its outcome;
 *   5. when that completes: the kind's settle (e.g. the OwnerRRef takes the
 *      value), the reply (the kind's reply_kind with settle's value, or the
 *      error; hooks.on_reply sees a value reply encoded, before it is sent:
 *      autograd ids stamped, send function recorded for its tensors),
 *      hooks.release, and the message is finished.
 * Invariants: every parsed message gets exactly one reply and is passed to
 * mpri_msg_done exactly once, after that reply; settle runs exactly once for
 * every message whose fields were read (steps 2-5), before the reply; a
 * function's failure is answered MPR_ERR_REMOTE, its own code and origin
 * kept (runtime/mpri_error.h), with the text
 * "On <worker> (rank r): function 'f' failed: CODE: detail". */
#ifndef MPRI_CALL_H
#define MPRI_CALL_H

#include <stddef.h>

#include "mpri_buf.h"
#include "mpri_registry.h"
#include "mpri_runtime.h"

/* What differs between CALL and REMOTE_CALL. */
typedef struct mpri_call_kind {
    const char *what; /* "call", "remote call": names the message in error texts */
    int reply_kind;   /* the kind of a successful reply (RETURN, REMOTE_RET) */
    /* Read the kind's fields that follow the name; *state is handed to
     * settle. An error (thread error set) answers the message with it. */
    mpr_err_t (*read_fields)(mpri_reader_t *r, const mpri_msg_t *msg, void **state);
    /* The call's outcome is known (`outcome` completed: a value or an
     * error; NULL: out of memory): do the kind's side effects, free `state`
     * and return the value to reply with (borrowed from `outcome`; NULL
     * replies none). */
    const mpr_value_t *(*settle)(void *state, mpr_future_t *outcome);
} mpri_call_kind_t;

/* Handle incoming `msg` of `kind` along the one path above. Consumes `msg`. */
void mpri_call_handle(mpri_msg_t *msg, const mpri_call_kind_t *kind);

/* `msg` of `kind` will not run (the pool could not queue it, the runtime
 * stopped first, or its per-call state could not be allocated): settle its
 * kind's fields (settle with no outcome) and the RRefs among its arguments
 * without decoding them, reply `code`/`text` when `reply`, finish it.
 * Consumes `msg`; keeps the thread's last error. */
void mpri_call_reject(mpri_msg_t *msg, const mpri_call_kind_t *kind, mpr_err_t code, const char *text,
                      bool reply);

/* ---- hooks: where distributed autograd plugs in ----
 * At most one set is installed (by the autograd layer's init, before
 * mpr_init starts the runtime). Every member may be NULL. `state` is the
 * hook's per-call state: set by on_request, given to every later hook of the
 * same call, dropped by release (called exactly once per on_request that
 * returned MPR_OK). */
typedef struct mpri_call_hooks {
    /* Caller side, once per outgoing CALL / REMOTE_CALL after its arguments
     * were encoded: set the header's autograd context/message ids and record
     * a send function for the argument tensors. An error fails the call
     * (RRef forks the encode made stay: fail only when out of memory). */
    mpr_err_t (*on_send_request)(mpri_outmsg_t *m, const mpr_value_t *args, int dst_rank);
    /* Callee side, after the arguments were decoded (the header carries the
     * caller's autograd_context_id / autograd_message_id): look the context
     * up or create it and record a recv function for `args`. An error fails
     * the call (answered with it; the function does not run). */
    mpr_err_t (*on_request)(const mpri_msg_t *msg, const mpr_value_t *args, void **state);
    /* Around the function (sync: its whole run; async: until it returned
     * its future), on the running thread: make the context current. */
    void (*enter)(void *state);
    void (*leave)(void *state);
    /* A value reply, encoded, before it is sent (not called for an error
     * reply, or when the caller expects none): set its header's autograd
     * ids and record a send function for its tensors (reply->tensors). An
     * error it returns (its text in the thread's error) is sent instead. */
    mpr_err_t (*on_reply)(void *state, mpri_outmsg_t *reply);
    void (*release)(void *state);
} mpri_call_hooks_t;

/* Install the hooks (copied). MPR_ERR_EXISTS if a set is installed already,
 * MPR_ERR_STATE once the runtime runs. */
mpr_err_t mpri_call_set_hooks(const mpri_call_hooks_t *hooks);
/* The installed hooks (all NULL members if none). */
const mpri_call_hooks_t *mpri_call_hooks(void);

/* api init (init.c): install the CALL handler. */
mpr_err_t mpri_call_install(void);
/* api init (init.c): install the REMOTE_CALL handler (remote_call.c). */
mpr_err_t mpri_remote_call_install(void);

#endif
