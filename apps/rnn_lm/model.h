/* model.h — the RPC tutorial's RNNModel split across workers: the
 * EmbeddingTable and the Decoder live on the parameter server as
 * RemoteModules, the LSTM stays on the trainer. forward: input ids ->
 * embedding (remote) -> LSTM (local) -> decoder (remote), recorded by
 * distributed autograd when the calling thread has a context.
 *
 * Submodules (PyTorch's names, used in checkpoints and reference files):
 *   "emb." EmbeddingTable: encoder.weight [ntoken, ninp] ~ U(-0.1, 0.1),
 *          then Dropout(dropout)
 *   "rnn." LSTM(ninp, nhid, nlayers, dropout between layers): weight_ih_l0, ...
 *   "dec." Decoder: Dropout(dropout), then decoder.weight [ntoken, nhid] ~
 *          U(-0.1, 0.1), decoder.bias = 0
 * The remote constructors can instead load their weights from a
 * .safetensors file (by those names): the resume checkpoint or a reference.
 * Module kinds are registered on every rank by model_register_kinds (before
 * mpr_init).
 *
 * Ownership: model_create returns a model the trainer destroys with
 * model_destroy (the remote modules are freed on their owner when their
 * last RRef goes). Tensors returned are owned like op results (the scope). */
#ifndef RNN_LM_MODEL_H
#define RNN_LM_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include <mpirpc/mpirpc.h>

typedef struct model_config {
    int64_t ntoken, ninp, nhid;
    int nlayers;
    double dropout;
    uint64_t seed;
    const char *ps;               /* the parameter server's worker name */
    const char *embedding_device; /* "cpu" or "cuda:N" on the ps */
    const char *init_path;        /* NULL: random; else a .safetensors holding the weights as */
    const char *init_prefix;      /* "<init_prefix>emb.encoder.weight", ... (NULL: "") */
} model_config_t;

typedef struct model model_t;

mpr_err_t model_register_kinds(void);

model_t *model_create(const model_config_t *cfg);
void model_destroy(model_t *m);

/* input: int64 [T, B]; h0, c0: [nlayers, B, nhid]. *decoded [T, B, ntoken],
 * *hn, *cn [nlayers, B, nhid]. */
mpr_err_t model_forward(model_t *m, mpr_tensor_t *input, mpr_tensor_t *h0, mpr_tensor_t *c0,
                        mpr_tensor_t **decoded, mpr_tensor_t **hn, mpr_tensor_t **cn);

/* RRefs to every parameter (embedding, LSTM, decoder, in that order), for a
 * DistributedOptimizer: *rrefs a malloc'ed array of *n new references. */
mpr_err_t model_parameter_rrefs(model_t *m, mpr_rref_t ***rrefs, int *n);
/* Names of those parameters ("emb.encoder.weight", ...), same order; owned by m. */
const char *const *model_parameter_names(model_t *m, int *n);

/* Train (dropout on) / eval mode, here and on the ps. */
mpr_err_t model_train(model_t *m, bool training);

/* The local LSTM (BORROWED) and the remote modules' parameter values
 * fetched to the trainer (copies: *values malloc'ed, *n new references). */
mpr_module_t *model_lstm(model_t *m);
mpr_err_t model_fetch_parameters(model_t *m, mpr_tensor_t ***values, int *n);

/* The gradient of every parameter (same order) held by dist autograd
 * context ctx_id: the trainer's own, and the ps's fetched with one call
 * (*grads malloc'ed, *n new references; NULL entries for parameters
 * without one). */
mpr_err_t model_context_gradients(model_t *m, int64_t ctx_id, mpr_tensor_t ***grads, int *n);

#endif
