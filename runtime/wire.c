/* wire.c — header validation, message kind names (from the one kind list,
 * MPRI_MSG_KIND_LIST in mpri_wire.h) and the name hash (64-bit FNV-1a of a
 * function's name: every rank computes the same id with no exchange).
 *
 * Invariant: a header that passes mpri_wire_header_read() has our magic and
 * version, a known kind, a body that fits inside the received bytes, at most
 * MPRI_MAX_TENSORS_PER_MESSAGE tensors, and a batch count between 1 and the
 * tensor count when there are tensors (0 otherwise); the tensor descriptors
 * are whatever follows the body (checked by their decoder). */
#include "mpri_wire.h"

#include <string.h>

static const char *const kind_names[] = {
#define MPRI_X_NAME(kind, name) name,
    MPRI_MSG_KIND_LIST(MPRI_X_NAME)
#undef MPRI_X_NAME
};

const char *mpri_msg_kind_name(int kind) {
    if (kind < 0 || kind >= MPRI_MSG_KIND_COUNT) return "unknown";
    return kind_names[kind];
}

mpr_err_t mpri_wire_header_read(const void *data, size_t len, mpri_wire_header_t *out) {
    if (len < sizeof *out)
        return mpr_error_set(MPR_ERR_DECODE, "message of %zu bytes is shorter than the %zu-byte header",
                             len, sizeof *out);
    memcpy(out, data, sizeof *out);
    if (out->magic != MPRI_WIRE_MAGIC)
        return mpr_error_set(MPR_ERR_DECODE, "bad magic 0x%04x", out->magic);
    if (out->version != MPRI_WIRE_VERSION)
        return mpr_error_set(MPR_ERR_DECODE, "wire version %u, expected %u", out->version,
                             MPRI_WIRE_VERSION);
    if (out->kind >= MPRI_MSG_KIND_COUNT)
        return mpr_error_set(MPR_ERR_DECODE, "unknown message kind %u", out->kind);
    if (out->body_len > len - sizeof *out)
        return mpr_error_set(MPR_ERR_DECODE, "body of %u bytes exceeds the %zu received", out->body_len,
                             len - sizeof *out);
    if (out->tensor_count > MPRI_MAX_TENSORS_PER_MESSAGE)
        return mpr_error_set(MPR_ERR_DECODE, "%u tensors in one message", out->tensor_count);
    if (out->flags & MPRI_FLAG_TENSORS_INLINE) {
        if (out->tensor_count == 0 || out->batch_count != 0)
            return mpr_error_set(MPR_ERR_DECODE, "inline tensor data with %u tensors and %u batches",
                                 out->tensor_count, out->batch_count);
    } else if (out->batch_count > out->tensor_count || (out->tensor_count > 0 && out->batch_count == 0)) {
        return mpr_error_set(MPR_ERR_DECODE, "%u tensor batches for %u tensors", out->batch_count,
                             out->tensor_count);
    }
    return MPR_OK;
}

uint64_t mpri_hash_name(const char *name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    return h;
}
