/* cpu_dtypes.h — compiles a typed CPU kernel body once per float dtype.
 *
 * A cpu_*.c file defines MPRI_KERNEL_BODY as the quoted name of its body
 * header (e.g. "cpu_conv_impl.h", in this folder) and includes this header.
 * The body is then compiled twice, with
 *   KT                  the element type: float, then double;
 *   KN(name)            the flavoured name: name_f32, then name_f64;
 *   KEXP, KLOG, KTANH   the math functions of that type (expf/exp, ...).
 * Afterwards all of them, MPRI_KERNEL_BODY included, are undefined again, so
 * a file may instantiate several bodies. No include guard, on purpose. */
#ifndef MPRI_KERNEL_BODY
#error "cpu_dtypes.h: define MPRI_KERNEL_BODY (the body header) first"
#endif

#define KT float
#define KN(name) name##_f32
#define KEXP expf
#define KLOG logf
#define KTANH tanhf
#include MPRI_KERNEL_BODY
#undef KT
#undef KN
#undef KEXP
#undef KLOG
#undef KTANH

#define KT double
#define KN(name) name##_f64
#define KEXP exp
#define KLOG log
#define KTANH tanh
#include MPRI_KERNEL_BODY
#undef KT
#undef KN
#undef KEXP
#undef KLOG
#undef KTANH

#undef MPRI_KERNEL_BODY
