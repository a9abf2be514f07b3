/* cpu_clones.h — MPRI_CPU_CLONES: compile a CPU kernel twice, for AVX2 and
 * for baseline x86-64, the one to run picked once at load (GCC's
 * target_clones, an ifunc). The library is built for baseline x86-64 (no
 * -march), so without it the loops GCC vectorizes use 128-bit registers on
 * every machine.
 *
 * Invariant: a clone never changes a result's bits, but for the sign of a
 * NaN an add makes or carries (IEEE 754 leaves it to the operand order, and
 * GCC's vector code may order a sum's adds' operands otherwise: the sum
 * reduction's clones differ there; NaN stays NaN). The AVX2 target enables
 * no fused multiply-add (that is "fma", not "avx2"), GCC reorders no
 * floating-point reduction without -ffast-math or -fassociative-math, and
 * math-library calls (expf, tanhf, ...) stay the same scalar calls; so
 * both clones round alike. Define MPRI_KERNELS_BASELINE_ONLY to build the
 * baseline alone (the tests that compare the two). */
#ifndef MPRI_CPU_CLONES_H
#define MPRI_CPU_CLONES_H

#if defined(__GNUC__) && defined(__x86_64__) && defined(__GLIBC__) && !defined(MPRI_KERNELS_BASELINE_ONLY)
#define MPRI_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define MPRI_CPU_CLONES
#endif

#endif
