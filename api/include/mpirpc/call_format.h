/* mpirpc/call_format.h — building and reading values with a format string,
 * so a handler unpacks its arguments and packs its result in one line each
 * with one error path:
 *
 *     static mpr_err_t add(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
 *         int64_t a, b;
 *         mpr_err_t e = mpr_args_unpack(args, "ll", &a, &b);
 *         return e ? e : mpr_return(result, "l", a + b);
 *     }
 *
 * The format language: one character per item; spaces are ignored; any
 * other character is an error (MPR_ERR_INVALID_ARG naming it and its
 * position), found before any value is built or any output written.
 *
 *   char  value kind  pack reads (varargs)       unpack writes (pointers)
 *   n     none        nothing                     nothing (item must be none)
 *   b     bool        int (a bool promotes)       bool *
 *   i     int         int                         int * (MPR_ERR_INVALID_ARG if
 *                                                 the int64 does not fit)
 *   l     int         int64_t                     int64_t *
 *   d     double      double (a float promotes)   double * (an int item is converted)
 *   s     string      const char * (copied)       const char ** (borrowed)
 *   y     bytes       const void *, size_t        const void **, size_t * (borrowed;
 *                     (copied)                    a string item is accepted too)
 *   w     worker      const mpr_worker_info_t *   mpr_worker_info_t * (copied)
 *   t     tensor      mpr_tensor_t * (retained:   mpr_tensor_t ** (borrowed)
 *                     the caller keeps its ref)
 *   T     tensor      mpr_tensor_t * (stolen)     mpr_tensor_t ** (new reference)
 *   r     RRef        mpr_rref_t * (retained)     mpr_rref_t ** (borrowed)
 *   R     RRef        mpr_rref_t * (stolen)       mpr_rref_t ** (new reference)
 *   v     any         mpr_value_t * (retained)    mpr_value_t ** (borrowed)
 *   V     any         mpr_value_t * (stolen)      mpr_value_t ** (new reference)
 *   [ ]   list        the items between           the items of a nested list
 *   |     -           (error)                     the items after it are optional:
 *                                                 absent ones leave their outputs untouched
 *
 * The rule for case: lowercase borrows (pack takes its own reference and the
 * caller keeps theirs; unpack hands out a pointer valid while `args` lives),
 * uppercase moves a reference across the call (pack steals the caller's, so
 * `mpr_value_pack("T", mpr_add(a, b))` leaks nothing; unpack gives a
 * new reference the caller releases). Stolen references are released on
 * every failure too, including a NULL stolen item; the one exception is a
 * format with an unknown character, after which the varargs cannot be read
 * (stolen items after that character leak: a bad format is a programming
 * error, reported as MPR_ERR_INVALID_ARG, never undefined behaviour as long
 * as the varargs before it match). Mind the widths: 'i' reads an `int`, 'l'
 * an `int64_t` (pass `(int64_t)x` for other types), 'd' a double (not an
 * int literal); a wrong width is undefined behaviour, as with printf.
 *
 * Limits: brackets nest up to MPR_FORMAT_MAX_DEPTH levels and a format has
 * at most MPR_FORMAT_MAX_ITEMS items in all (MPR_ERR_INVALID_ARG beyond). */
#ifndef MPIRPC_CALL_FORMAT_H
#define MPIRPC_CALL_FORMAT_H

#include <stdarg.h>

#include "mpirpc/error.h"
#include "mpirpc/rpc.h"
#include "mpirpc/rref.h"
#include "mpirpc/value.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MPR_FORMAT_MAX_DEPTH 16
#define MPR_FORMAT_MAX_ITEMS 256

/* Read an argument list: item k of `args` (a list value, as handlers get
 * it) goes to the k-th output. All or nothing: every item is checked first,
 * and outputs are written only when all match. Errors (outputs untouched):
 *   MPR_ERR_INVALID_ARG  bad format, NULL args/fmt, too few or too many
 *                        items ("expected 2 arguments, got 3"), an 'i' out of range;
 *   MPR_ERR_TYPE         an item of the wrong kind: "argument 1: expected
 *                        int ('l'), got string" (nested items as "argument 2[0]"). */
mpr_err_t mpr_args_unpack(const mpr_value_t *args, const char *fmt, ...);
mpr_err_t mpr_args_vunpack(const mpr_value_t *args, const char *fmt, va_list ap);

/* Read one value with a one-item format ("l", "[ld]", ...); errors as
 * mpr_args_unpack, the item named "value". */
mpr_err_t mpr_value_unpack(const mpr_value_t *v, const char *fmt, ...);

/* Build a value: a format of exactly one item gives that item (pack("l", 7)
 * is the int 7); a format of zero or several items gives a list of them
 * (pack("ld", 1, 2.0) is [1, 2.0]; pack("") is []); brackets build nested
 * lists (pack("[l]", 1) is [1]). Returns a new reference, or NULL with
 * mpr_last_error() set: MPR_ERR_INVALID_ARG for a bad format or a NULL
 * string/tensor/RRef/value/worker item (the message names the item and, for
 * a NULL stolen item, the error that produced it), MPR_ERR_NOMEM. */
mpr_value_t *mpr_value_pack(const char *fmt, ...);
mpr_value_t *mpr_value_vpack(const char *fmt, va_list ap);

/* Build an argument list: always a list of the format's items, even for
 * one item (args_pack("l", 3) is [3]). Errors as mpr_value_pack. */
mpr_value_t *mpr_args_pack(const char *fmt, ...);
mpr_value_t *mpr_args_vpack(const char *fmt, va_list ap);

/* For a handler's last line: *result = mpr_value_pack(fmt, ...); returns
 * MPR_OK, or the packing error with *result = NULL (so a handler can write
 * `return mpr_return(result, "l", a + b);`). */
mpr_err_t mpr_return(mpr_value_t **result, const char *fmt, ...);

#ifdef __cplusplus
}
#endif
#endif
