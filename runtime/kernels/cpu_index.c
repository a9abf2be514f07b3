/* cpu_index.c — CPU kernels for indexing along one axis: index_select (also
 * embedding: outer = 1) and gather, forward and scatter-add backward, f32 and
 * f64, plus a dtype-agnostic strided row copy used by cat and its backward.
 *
 * Invariants: indices are trusted to be in range (the op layer validates them
 * once, before any write); backward kernels accumulate so repeated indices sum
 * their gradients, as in PyTorch. */
#include <stdint.h>
#include <string.h>

#include "kernels/mpri_nn_kernels.h"

#define KT float
#define KN(name) name##_f32
#include "cpu_index_impl.h"
#undef KT
#undef KN

#define KT double
#define KN(name) name##_f64
#include "cpu_index_impl.h"

void mpri_copy_rows(void *dst, int64_t dst_pitch, const void *src, int64_t src_pitch,
                    int64_t rows, int64_t width, size_t esz) {
    char *d = dst;
    const char *s = src;
    size_t w = (size_t)width * esz;
    if (dst_pitch == width && src_pitch == width) {
        memcpy(d, s, w * (size_t)rows);
        return;
    }
    for (int64_t r = 0; r < rows; r++)
        memcpy(d + (size_t)(r * dst_pitch) * esz, s + (size_t)(r * src_pitch) * esz, w);
}
