/* mpri_error.h — remote failures with their origin (not installed).
 *
 * A function that fails on worker C, called by B's function, called by A,
 * reaches A as MPR_ERR_REMOTE. What is kept along the way (error.c, the
 * futures, the error reply on the wire) is one mpri_remote_error_t:
 *   code         the function's own code on C (e.g. MPR_ERR_NOT_FOUND)
 *   origin_rank  C
 *   origin       C's text, written once at C:
 *                "On workerC (rank c): function 'g' failed: CODE: detail"
 *   chain        the functions it came back through, outermost first:
 *                "workerB 'f' -> workerC 'g'" (hops entries)
 * The text a caller reads (mpr_last_error, mpr_future_error_message) is
 * `origin` for a direct failure (hops == 1) and
 * "<origin> (call chain: <chain>)" for a nested one: the chain once,
 * however many hops.
 *
 * Invariants: code is never MPR_OK nor MPR_ERR_REMOTE; hops >= 1; a remote
 * error passed on by a function (it returned MPR_ERR_REMOTE with the remote
 * failure still the thread's last error) keeps code, origin_rank and origin
 * and gains one hop at the front of the chain. */
#ifndef MPRI_ERROR_H
#define MPRI_ERROR_H

#include <stdbool.h>
#include <stdint.h>

#include "mpirpc/error.h"
#include "mpri_buf.h"

typedef struct mpri_remote_error {
    mpr_err_t code;
    int32_t origin_rank;
    int32_t hops;
    char origin[MPR_ERROR_TEXT_MAX];
    char chain[MPR_ERROR_TEXT_MAX];
} mpri_remote_error_t;

/* Start a remote error at its origin: the function `fn` of worker `worker`
 * (rank `rank`) failed with `code` and `detail`. */
void mpri_remote_error_init(mpri_remote_error_t *re, const char *worker, int rank, const char *fn,
                            mpr_err_t code, const char *detail);
/* Pass `re` on through the function `fn` of worker `worker`: one hop more. */
void mpri_remote_error_pass(mpri_remote_error_t *re, const char *worker, const char *fn);
/* The text a caller reads (see above). */
void mpri_remote_error_text(const mpri_remote_error_t *re, char *buf, size_t len);

/* Make `re` the calling thread's error: code MPR_ERR_REMOTE, detail its
 * text. Returns MPR_ERR_REMOTE. */
mpr_err_t mpri_error_set_remote(const mpri_remote_error_t *re);
/* The thread's last error as a remote error, or NULL when its last error is
 * not one (mpr_error_set and mpr_error_clear forget it). */
const mpri_remote_error_t *mpri_last_remote_error(void);
/* The remote error a failure reported as (`code`, `message`) stands for:
 * the thread's last remote error when `code` is MPR_ERR_REMOTE and `message`
 * is that error's very text (a failure passed on as it was read), else NULL. */
const mpri_remote_error_t *mpri_remote_error_matching(mpr_err_t code, const char *message);

/* The calling thread's whole error (code, text, remote origin), kept aside
 * while cleanup that may set errors of its own runs, then put back: the
 * caller reports its own failure, not the cleanup's. */
typedef struct mpri_error_saved {
    mpr_err_t code;
    bool remote_on;
    char detail[MPR_ERROR_TEXT_MAX];
    mpri_remote_error_t remote;
} mpri_error_saved_t;
void mpri_error_save(mpri_error_saved_t *s);
void mpri_error_restore(const mpri_error_saved_t *s);

/* Wire: an error reply's body is u32 code, blob text; a remote one then
 * carries u32 origin code, i32 origin rank, i32 hops, blob origin, blob
 * chain (readers that stop after the text still get a complete reply). */
void mpri_remote_error_write(mpri_buf_t *b, const mpri_remote_error_t *re);
/* Read the extension after the text; MPR_ERR_DECODE if malformed or its
 * fields break the invariants. */
mpr_err_t mpri_remote_error_read(mpri_reader_t *r, mpri_remote_error_t *re);

#endif
