/* mpirpc/mpirpc.h — umbrella header: everything a program needs. */
#ifndef MPIRPC_MPIRPC_H
#define MPIRPC_MPIRPC_H

#include "mpirpc/error.h"
#include "mpirpc/future.h"
#include "mpirpc/init.h"
#include "mpirpc/rpc.h"
#include "mpirpc/rref.h"
#include "mpirpc/tensor.h"
#include "mpirpc/value.h"

#endif
