/* mpri_value.h — internal layout of values and the hooks the api layer
 * installs for RRef and object values (not installed).
 *
 * The runtime knows how to build, share, compare, encode and decode every
 * plain kind. RRef and object values are defined above it (api/): the runtime
 * only holds an opaque pointer and calls the registered hooks to retain,
 * release, encode and decode them. */
#ifndef MPRI_VALUE_H
#define MPRI_VALUE_H

#include <stdatomic.h>

#include "mpirpc/value.h"

struct mpri_buf;
struct mpri_reader;
struct mpri_value_slab;

#define MPRI_VALUE_MAGIC 0x56414c55u      /* "VALU": a live value */
#define MPRI_VALUE_DEAD 0x64656164u       /* "dead": released (see mpri_quarantine.h) */

struct mpr_value {
    atomic_long refcount;
    union {
        bool b;
        int64_t i;
        double d;
        struct {
            char *data; /* NUL-terminated for strings */
            size_t len;
        } bytes;
        mpr_tensor_t *tensor;
        mpr_worker_info_t *worker; /* owned: its own allocation keeps every value small */
        struct {
            mpr_value_t **items;
            size_t len, cap;
        } list;
        void *opaque; /* RREF / OBJECT: owned through the kind's hooks */
    } u;
    /* After the union: free() may overwrite the first 16 bytes of a released
     * value with its own links, and these must stay readable there. */
    mpr_value_kind_t kind;
    bool immortal;  /* the shared none value */
    uint32_t magic; /* MPRI_VALUE_MAGIC while alive; checked by every public entry */
    /* Non-NULL: this struct lives in a slab shared with other values (a
     * decoded list's tensor items), freed with the slab's last value. */
    struct mpri_value_slab *slab;
};

/* Slabs: the tensor values of a decoded list in one allocation, instead of
 * one per value (a list of thousands of parameter tensors). Each value is an
 * ordinary value (own refcount, released on its own, poisoned when dead);
 * its struct goes back with the slab, when the last value taken from it
 * dies, so one surviving value keeps the slab's `cap` structs alive. A slab
 * belongs to the decoding thread until mpri_value_slab_done: values taken
 * from it must not be released before (nor handed to another thread). */
typedef struct mpri_value_slab mpri_value_slab_t;
/* Room for `cap` values; NULL (error set) when out of memory. */
mpri_value_slab_t *mpri_value_slab_create(uint32_t cap);
/* A tensor value holding a new reference to live tensor `t`, from the slab
 * while it has room, else (or with `s` NULL) from the heap. NULL (error set)
 * when out of memory. With `take_ref` the value takes over the caller's
 * reference instead (no atomic on the tensor), and the caller's reference
 * is gone whatever happens (released on failure). */
mpr_value_t *mpri_value_slab_new_tensor(mpri_value_slab_t *s, mpr_tensor_t *t, bool take_ref);
/* The decoder is done taking values: the slab now lives as long as they do
 * (freed at once if none was taken). NULL is a no-op. */
void mpri_value_slab_done(mpri_value_slab_t *s);

/* Hooks for one opaque kind (MPR_VALUE_RREF or MPR_VALUE_OBJECT). */
typedef struct mpri_opaque_value_ops {
    void (*retain)(void *p);
    void (*release)(void *p);
    /* Append the wire form of `p` to `out`; `dst_rank` is where it goes. */
    mpr_err_t (*encode)(void *p, struct mpri_buf *out, int dst_rank);
    /* Read the wire form; returns a new reference in *out. `src_rank` sent it. */
    mpr_err_t (*decode)(struct mpri_reader *in, int src_rank, void **out);
    /* Optional: bracket every mpri_value_encode (nesting allowed: begin
     * returns a mark, end takes it back), so side effects of `encode` (an
     * RRef fork) are undone when the encode fails (ok == false); an outer
     * bracket (a call that then sends the message) decides for what the
     * inner ones kept. */
    size_t (*encode_begin)(void);
    void (*encode_end)(size_t mark, bool ok);
    /* Optional (needed by kinds that go on the wire): read past the wire
     * form of a value that will not be decoded (its message's decode ran
     * out of memory before it, or the message is dropped) and, with
     * `undo`, undo what its encode started on the sender (an RRef fork);
     * best effort, never blocking. */
    mpr_err_t (*settle)(struct mpri_reader *in, int src_rank, bool undo);
} mpri_opaque_value_ops_t;

void mpri_value_set_opaque_ops(mpr_value_kind_t kind, const mpri_opaque_value_ops_t *ops);
const mpri_opaque_value_ops_t *mpri_value_opaque_ops(mpr_value_kind_t kind);

/* Abort with a message naming `v` unless it is a live value (use after
 * release, double release, not a value). `what` names the caller. */
void mpri_value_check_live(const mpr_value_t *v, const char *what);

/* A value wrapping opaque `p` of `kind` (takes ownership of one reference). */
mpr_value_t *mpri_value_new_opaque(mpr_value_kind_t kind, void *p);

#endif
