/* mpri_quarantine.h — detection of use after release for refcounted objects
 * (values, tensors) (not installed).
 *
 * Each such object carries a magic word: MPRI_MAGIC_LIVE-style constant while
 * it lives, its *_DEAD twin once its last reference is gone. Every public
 * retain, release and accessor checks the word (mpri_misuse_abort when it is
 * wrong), and the freed object is poisoned (magic DEAD, pointers cleared).
 * In Debug/sanitizer builds (MPRI_DEBUG_CHECKS) the freed memory is parked in
 * a quarantine ring of MPRI_QUARANTINE_SLOTS objects before it is really
 * freed, so a use shortly after the last release reads the DEAD magic and is
 * reported with a message naming the object instead of corrupting the heap.
 * Release builds free at once; the check then catches a stale pointer only
 * while the memory is not reused (best effort). */
#ifndef MPRI_QUARANTINE_H
#define MPRI_QUARANTINE_H

#define MPRI_QUARANTINE_SLOTS 4096

/* free(p), delayed through the quarantine ring in debug builds. */
void mpri_quarantine_free(void *p);

/* A caller bug that has corrupted (or is about to corrupt) memory: print
 * "mpirpc: <message>" to stderr and abort. */
_Noreturn void mpri_misuse_abort(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
