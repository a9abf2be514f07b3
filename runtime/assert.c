/* assert.c — the one place a broken internal invariant ends the process
 * (see mpri_assert.h for what is and is not an assertion).
 *
 * Invariant: writes with a single fprintf to stderr (unbuffered) before
 * abort(), so the message is not lost when several threads fail at once. */
#include "mpri_assert.h"

#include <stdio.h>
#include <stdlib.h>

_Noreturn void mpri_assert_fail(const char *file, int line, const char *cond, const char *hint) {
    fprintf(stderr, "mpirpc: internal invariant broken at %s:%d: `%s` -- %s\n", file, line, cond,
            hint ? hint : "(no hint)");
    fflush(stderr);
    abort();
}
