/* lstm.c — multi-layer LSTM module (PyTorch's nn.LSTM equations, gate order
 * i, f, g, o; parameter names weight_ih_l{k}, weight_hh_l{k}, bias_ih_l{k},
 * bias_hh_l{k}).
 *
 * Forward is composed from differentiable ops, so backward (through time and
 * layers) is the autograd engine's: per layer, one GEMM projects the whole
 * input sequence ([T*B, in] @ W_ih^T + b_ih + b_hh), unbound into T step
 * views by one node (mpr_unbind), then each step adds h @ W_hh^T and applies
 * the fused cell op (mpr_lstm_cell: gates -> h, c in
 * one node). Everything runs inside a private scope; only the requested
 * results (output, h_n, c_n) escape it.
 *
 * Invariants: the settings are in m->cfg.lstm (sizes, dropout between
 * layers, bias, batch_first); parameters are registered layer
 * by layer in PyTorch's order, 4 (or 2 without bias) per layer. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "mpri_args.h"
#include "nn/mpri_nn.h"

static mpr_tensor_t *lstm_forward_module(mpr_module_t *m, mpr_tensor_t *x) {
    mpr_tensor_t *out = NULL;
    if (mpr_lstm_forward(m, x, NULL, NULL, &out, NULL, NULL) != MPR_OK) return NULL;
    return out;
}

static const mpri_module_vtable_t lstm_vt = {"LSTM", lstm_forward_module, NULL};

mpr_module_t *mpr_lstm_create(int64_t input_size, int64_t hidden_size, int num_layers,
                              bool bias, bool batch_first, double dropout, mpr_dtype_t dtype,
                              mpr_generator_t *gen) {
    if (mpri_module_check_dtype("LSTM", dtype) != MPR_OK) return NULL;
    if (input_size < 1 || hidden_size < 1 || num_layers < 1 || !(dropout >= 0 && dropout < 1)) {
        mpr_error_set(MPR_ERR_INVALID_ARG,
                      "LSTM: need input_size, hidden_size, num_layers >= 1 and dropout in [0, 1), "
                      "got %lld, %lld, %d, %g",
                      (long long)input_size, (long long)hidden_size, num_layers, dropout);
        return NULL;
    }
    mpr_module_t *m = mpri_module_new(&lstm_vt);
    if (!m) return NULL;
    m->cfg.lstm.input_size = input_size;
    m->cfg.lstm.hidden_size = hidden_size;
    m->cfg.lstm.num_layers = num_layers;
    m->cfg.lstm.dropout = dropout;
    m->cfg.lstm.bias = bias;
    m->cfg.lstm.batch_first = batch_first;
    m->gen = gen;
    double bound = 1.0 / sqrt((double)hidden_size);
    int64_t H4 = 4 * hidden_size;
    for (int l = 0; l < num_layers; l++) {
        char n1[32], n2[32], n3[32], n4[32];
        snprintf(n1, sizeof n1, "weight_ih_l%d", l);
        snprintf(n2, sizeof n2, "weight_hh_l%d", l);
        snprintf(n3, sizeof n3, "bias_ih_l%d", l);
        snprintf(n4, sizeof n4, "bias_hh_l%d", l);
        int64_t in = l == 0 ? input_size : hidden_size;
        if (!mpri_module_add_param(m, n1, dtype, 2, (int64_t[]){H4, in}, bound, false, gen) ||
            !mpri_module_add_param(m, n2, dtype, 2, (int64_t[]){H4, hidden_size}, bound, false,
                                   gen) ||
            (bias && (!mpri_module_add_param(m, n3, dtype, 1, (int64_t[]){H4}, bound, false, gen) ||
                      !mpri_module_add_param(m, n4, dtype, 1, (int64_t[]){H4}, bound, false,
                                             gen)))) {
            mpr_module_destroy(m);
            return NULL;
        }
    }
    return m;
}

static mpr_err_t check_state(const char *what, const mpr_tensor_t *s, const mpr_tensor_t *x,
                             int64_t L, int64_t B, int64_t H) {
    if (s->dtype != x->dtype)
        return mpr_error_set(MPR_ERR_DTYPE, "LSTM: %s has dtype %s, input has %s", what,
                             mpr_dtype_name(s->dtype), mpr_dtype_name(x->dtype));
    if (s->ndim != 3 || s->shape[0] != L || s->shape[1] != B || s->shape[2] != H) {
        char b[96];
        return mpr_error_set(MPR_ERR_SHAPE, "LSTM: %s must be [%lld, %lld, %lld], got %s", what,
                             (long long)L, (long long)B, (long long)H,
                             mpr_shape_str(s->ndim, s->shape, b, sizeof b));
    }
    return MPR_OK;
}

/* One layer over the whole sequence xs [T, B, in]; returns [T, B, H] and the
 * final state in *h, *c (all scope-owned). */
static mpr_tensor_t *run_layer(mpr_module_t *m, int l, mpr_tensor_t *xs, mpr_tensor_t **h,
                               mpr_tensor_t **c, mpr_tensor_t **hs, mpr_tensor_t **steps) {
    int per = m->cfg.lstm.bias ? 4 : 2;
    mpr_tensor_t *w_ih = mpri_module_param(m, l * per), *w_hh = mpri_module_param(m, l * per + 1);
    mpr_tensor_t *b_ih = m->cfg.lstm.bias ? mpri_module_param(m, l * per + 2) : NULL;
    mpr_tensor_t *b_hh = m->cfg.lstm.bias ? mpri_module_param(m, l * per + 3) : NULL;
    int64_t T = xs->shape[0], H = m->cfg.lstm.hidden_size;
    /* input projection of every step at once, both biases folded in:
     * [T*B, in] -> [T, B, 4H] */
    mpr_tensor_t *xw = mpr_linear(mpr_reshape(xs, 2, (int64_t[]){-1, xs->shape[2]}), w_ih, b_ih);
    if (b_hh) xw = mpr_add(xw, b_hh);
    xw = mpr_reshape(xw, 3, (int64_t[]){T, -1, 4 * H});
    int nsteps;
    if (!xw || mpr_unbind(xw, 0, steps, (int)T, &nsteps) != MPR_OK) return NULL;
    for (int64_t t = 0; t < T; t++) {
        mpr_tensor_t *gates = mpr_add(steps[t], mpr_linear(*h, w_hh, NULL));
        if (mpr_lstm_cell(gates, *c, h, c) != MPR_OK) return NULL;
        hs[t] = *h;
    }
    return mpr_stack(hs, (int)T, 0);
}

mpr_err_t mpr_lstm_forward(mpr_module_t *lstm, mpr_tensor_t *x, mpr_tensor_t *h0,
                           mpr_tensor_t *c0, mpr_tensor_t **out, mpr_tensor_t **hn,
                           mpr_tensor_t **cn) {
    if (out) *out = NULL;
    if (hn) *hn = NULL;
    if (cn) *cn = NULL;
    MPRI_ARG_NONNULL(lstm);
    MPRI_ARG_NONNULL(x);
    if (!lstm || lstm->vt != &lstm_vt)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "lstm_forward: not an LSTM module (%s)",
                             lstm ? lstm->vt->kind : "NULL");
    if (!x) return mpr_last_error_code() != MPR_OK ? mpr_last_error_code()
                                                   : mpr_error_set(MPR_ERR_INVALID_ARG,
                                                                   "LSTM: input is NULL");
    int64_t L = lstm->cfg.lstm.num_layers, H = lstm->cfg.lstm.hidden_size, IN = lstm->cfg.lstm.input_size;
    mpr_tensor_t *w0 = mpri_module_param(lstm, 0);
    char b[96];
    if (x->dtype != w0->dtype)
        return mpr_error_set(MPR_ERR_DTYPE, "LSTM: input has dtype %s, parameters have %s",
                             mpr_dtype_name(x->dtype), mpr_dtype_name(w0->dtype));
    if (x->ndim != 3 || x->shape[2] != IN)
        return mpr_error_set(MPR_ERR_SHAPE, "LSTM: expected input [%s, %lld], got %s",
                             lstm->cfg.lstm.batch_first ? "B, T" : "T, B", (long long)IN,
                             mpr_shape_str(x->ndim, x->shape, b, sizeof b));
    bool bf = lstm->cfg.lstm.batch_first;
    int64_t T = bf ? x->shape[1] : x->shape[0], B = bf ? x->shape[0] : x->shape[1];
    if ((h0 == NULL) != (c0 == NULL))
        return mpr_error_set(MPR_ERR_INVALID_ARG, "LSTM: give both h0 and c0 or neither");
    mpr_err_t e;
    if (h0 && ((e = check_state("h0", h0, x, L, B, H)) != MPR_OK ||
               (e = check_state("c0", c0, x, L, B, H)) != MPR_OK))
        return e;
    if (T < 1) return mpr_error_set(MPR_ERR_SHAPE, "LSTM: empty sequence (length 0)");
    mpr_tensor_t **hs = malloc(sizeof(mpr_tensor_t *) * (size_t)(2 * T + 2 * L));
    if (!hs) return mpr_error_set(MPR_ERR_NOMEM, "LSTM: out of memory");
    mpr_tensor_t **hN = hs + T, **cN = hs + T + L, **steps = hs + T + 2 * L;
    mpr_scope_begin();
    mpr_tensor_t *layer = bf ? mpr_transpose(x, 0, 1) : x;
    for (int l = 0; l < L && layer; l++) {
        mpr_tensor_t *h = h0 ? mpr_select(h0, 0, l) : mpr_zeros(x->dtype, 2, (int64_t[]){B, H});
        mpr_tensor_t *c = c0 ? mpr_select(c0, 0, l) : mpr_zeros(x->dtype, 2, (int64_t[]){B, H});
        if (!h || !c) {
            layer = NULL;
            break;
        }
        layer = run_layer(lstm, l, layer, &h, &c, hs, steps);
        hN[l] = h;
        cN[l] = c;
        if (layer && l < L - 1 && lstm->cfg.lstm.dropout > 0)
            layer = mpr_dropout(layer, lstm->cfg.lstm.dropout, lstm->training, lstm->gen);
    }
    mpr_tensor_t *o = layer && bf ? mpr_contiguous(mpr_transpose(layer, 0, 1)) : layer;
    mpr_tensor_t *hh = o && hn ? mpr_stack(hN, (int)L, 0) : NULL;
    mpr_tensor_t *cc = o && cn ? mpr_stack(cN, (int)L, 0) : NULL;
    e = (!o || (hn && !hh) || (cn && !cc)) ? mpr_last_error_code() : MPR_OK;
    if (e == MPR_OK) {
        if (out) *out = mpr_scope_escape(o);
        if (hn) *hn = mpr_scope_escape(hh);
        if (cn) *cn = mpr_scope_escape(cc);
    }
    mpr_scope_end();
    free(hs);
    return e;
}
