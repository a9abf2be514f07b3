/* mpri_autograd_init.h — the autograd layer's init (init.c; not installed). */
#ifndef MPRI_AUTOGRAD_INIT_H
#define MPRI_AUTOGRAD_INIT_H

#include "mpirpc/error.h"

/* Install distributed autograd's handlers and hooks, once per process;
 * later calls return the first call's result. Run by mpr_init before the
 * api layer's init. Thread-safe. */
mpr_err_t mpri_autograd_init(void);

#endif
