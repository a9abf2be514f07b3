/* mpirpc/remote_module.h — RemoteModule: the C form of
 * torch.distributed.nn.RemoteModule.
 *
 *   // on every worker, before mpr_init: module kinds by name (C has no pickled classes)
 *   mpr_register_module_kind("linear", make_linear, NULL);
 *   // anywhere:
 *   mpr_remote_module_t *l1 = mpr_remote_module_create("worker1/cpu", "linear", args);
 *   mpr_tensor_t *h = NULL;
 *   mpr_remote_module_forward(l1, x, &h);        // runs on worker1, in this thread's dist context
 *   mpr_rref_t **ps; int n;
 *   mpr_remote_module_remote_parameters(l1, &ps, &n);   // for mpr_dist_optimizer_create
 *
 * The module is built on its owner by the kind's registered constructor, on
 * the device the string names ("worker1/cpu", "worker1/cuda:0"), and lives
 * there in an OwnerRRef. Creation does not wait (mpr_remote): an error in
 * construction (an unknown kind, a failing constructor) shows at the first
 * use, naming the owner. forward runs the module on its owner inside the
 * caller's dist autograd context: the input is moved to the module's
 * device there and the output back to the CPU (both differentiable), so
 * gradients flow back through the RPC. A RemoteModule travels to another
 * worker as a value (mpr_value_new_remote_module /
 * mpr_remote_module_from_value) and is used there the same way.
 *
 * Ownership: handles are the caller's (destroy accepts NULL); tensors and
 * values returned are new references; the RRef arrays of
 * remote_parameters are malloc'ed and owned by the caller (release each
 * RRef, free the array). */
#ifndef MPIRPC_REMOTE_MODULE_H
#define MPIRPC_REMOTE_MODULE_H

#include <stdbool.h>

#include "mpirpc/future.h"
#include "mpirpc/nn.h"
#include "mpirpc/rref.h"

/* Builds a module from `args` (borrowed list; may be NULL) on `device`
 * (-1 CPU, N cuda:N); NULL with the error set on failure. */
typedef mpr_module_t *(*mpr_module_ctor_t)(const mpr_value_t *args, int device, void *user_data);

/* Register module kind `kind` (1 to 127 bytes) on this worker.
 * MPR_ERR_EXISTS for a name already registered. */
mpr_err_t mpr_register_module_kind(const char *kind, mpr_module_ctor_t ctor, void *user_data);

typedef struct mpr_remote_module mpr_remote_module_t;

/* `remote_device`: "<worker name>/cpu" or "<worker name>/cuda:<N>". NULL
 * with MPR_ERR_INVALID_ARG for a malformed string or an unknown worker. */
mpr_remote_module_t *mpr_remote_module_create(const char *remote_device, const char *kind, const mpr_value_t *args);
/* y = module(x) on the owner (x borrowed; new reference in *y). */
mpr_err_t mpr_remote_module_forward(mpr_remote_module_t *rm, mpr_tensor_t *x, mpr_tensor_t **y);
/* The same, not waiting: the future's value is the output tensor. Never
 * NULL except out of memory (errors complete the future). */
mpr_future_t *mpr_remote_module_forward_async(mpr_remote_module_t *rm, mpr_tensor_t *x);
/* RRefs to the module's parameters (owned by its owner), in the module's
 * order: *params a malloc'ed array of *n new references. */
mpr_err_t mpr_remote_module_remote_parameters(mpr_remote_module_t *rm, mpr_rref_t ***params, int *n);
/* The module's RRef (borrowed: valid while rm lives). */
mpr_rref_t *mpr_remote_module_get_module_rref(const mpr_remote_module_t *rm);
/* train(true) / eval (false) on the owner. */
mpr_err_t mpr_remote_module_train(mpr_remote_module_t *rm, bool training);
/* A value carrying the module (its RRef and device) to send to a worker. */
mpr_value_t *mpr_value_new_remote_module(const mpr_remote_module_t *rm);
/* A handle from such a value (received as an argument or a result). */
mpr_remote_module_t *mpr_remote_module_from_value(const mpr_value_t *v);
void mpr_remote_module_destroy(mpr_remote_module_t *rm);

#endif
