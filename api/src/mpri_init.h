/* mpri_init.h — the api layer's ordered init (init.c; not installed). */
#ifndef MPRI_INIT_H
#define MPRI_INIT_H

#include "mpirpc/error.h"

/* Install everything the api layer plugs into the runtime (value kinds,
 * message handlers, hooks), in order, once per process. Later calls return
 * the first call's result: MPR_OK, or the error of the step that failed
 * (the detail names it). Thread-safe. */
mpr_err_t mpri_api_init(void);

#endif
