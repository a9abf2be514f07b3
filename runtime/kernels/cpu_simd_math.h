/* cpu_simd_math.h — lets GCC vectorize loops calling tanhf with glibc's
 * vector math library (libmvec, the SIMD variants of libm's functions).
 *
 * glibc declares its libmvec variants only under -ffast-math, which this
 * project does not use. tanhf is the one f32 function where that matters:
 * scalar glibc tanhf costs ~15 ns an element on this project's machine
 * (through expm1f), libmvec's SSE variant ~1.1 ns, and it is the more
 * accurate of the two (max 1.03 ulp against 2.16 ulp for scalar tanhf over
 * every float in [-20, 20]; expf, logf are already fast scalar and stay so).
 * Declaring tanhf with the simd attribute lets the vectorizer call
 * _ZGVbN4v_tanhf (baseline x86-64 SSE, present since glibc 2.35; libm.so's
 * linker script brings libmvec in as needed).
 *
 * Invariant: a build gets the same tanhf results on every x86-64 CPU (the
 * variant is fixed at compile time, not chosen at run time); other
 * compilers, architectures and C libraries keep scalar tanhf. Include after
 * <math.h>, only in kernel files (the declaration affects the whole file). */
#ifndef MPRI_CPU_SIMD_MATH_H
#define MPRI_CPU_SIMD_MATH_H

#include <math.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__) && \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
__attribute__((simd("notinbranch"))) float tanhf(float);
#endif

#endif
