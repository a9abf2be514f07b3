/* mpirpc/mpirpc.h — umbrella header: everything a program needs. */
#ifndef MPIRPC_MPIRPC_H
#define MPIRPC_MPIRPC_H

#include "mpirpc/call_format.h"
#include "mpirpc/error.h"
#include "mpirpc/future.h"
#include "mpirpc/init.h"
#include "mpirpc/rpc.h"
#include "mpirpc/rpc_helpers.h"
#include "mpirpc/rref.h"
#include "mpirpc/trace.h"
#include "mpirpc/value.h"

#include "mpirpc/autograd.h"
#include "mpirpc/dist_autograd.h"
#include "mpirpc/dist_optim.h"
#include "mpirpc/cuda.h"
#include "mpirpc/data.h"
#include "mpirpc/nn.h"
#include "mpirpc/nn_functional.h"
#include "mpirpc/optim.h"
#include "mpirpc/remote_module.h"
#include "mpirpc/tensor.h"
#include "mpirpc/tensor_io.h"
#include "mpirpc/tensor_ops.h"

#endif
