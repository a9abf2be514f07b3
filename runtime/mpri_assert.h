/* mpri_assert.h — checked invariants (not installed).
 *
 * MPRI_ASSERT(cond, hint): on in every build. For cheap checks of invariants
 * the library itself keeps (a state machine's legal transitions, a counter
 * that must not go negative, a handler slot written once). When `cond` is
 * false it prints "mpirpc: internal invariant broken at FILE:LINE: `cond` —
 * hint" to stderr and aborts, so a bug stops at its cause instead of
 * corrupting state further.
 *
 * MPRI_DEBUG_ASSERT(cond, hint): the same, compiled only when NDEBUG is not
 * defined (Debug and sanitizer builds; CI's ASan/UBSan build is Debug). For
 * costlier checks: whole-structure state checkers such as
 * mpri_rref_check_state(), run at every protocol transition.
 *
 * What is NOT an assertion: bad input from a user, MPI failures, timeouts,
 * messages from a peer (a peer may be buggy or corrupt) — those stay returned
 * error codes (mpr_error_set). Only states this library's own code cannot
 * reach unless it has a bug belong here. */
#ifndef MPRI_ASSERT_H
#define MPRI_ASSERT_H

#include <stdbool.h>

/* Prints the failure and aborts; never returns. */
_Noreturn void mpri_assert_fail(const char *file, int line, const char *cond, const char *hint);

#define MPRI_ASSERT(cond, hint) \
    ((cond) ? (void)0 : mpri_assert_fail(__FILE__, __LINE__, #cond, (hint)))

#ifdef NDEBUG
#define MPRI_DEBUG_CHECKS 0
#define MPRI_DEBUG_ASSERT(cond, hint) ((void)0)
#else
#define MPRI_DEBUG_CHECKS 1
#define MPRI_DEBUG_ASSERT(cond, hint) MPRI_ASSERT(cond, hint)
#endif

#endif
