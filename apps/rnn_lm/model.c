/* model.c — RNNModel of model.h: the ps's module kinds (EmbeddingTable,
 * Decoder), the trainer's LSTM, forward across the two, parameter RRefs.
 *
 * Invariants: the parameter order is always embedding, LSTM (PyTorch's
 * order), decoder, for RRefs, names, fetched values and gradients alike; a
 * module's dropout generator lives as long as the module (it is the
 * module's ctx). */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"

#define KIND_EMBEDDING "rnn_lm.EmbeddingTable"
#define KIND_DECODER "rnn_lm.Decoder"
#define FN_GRADIENTS "rnn_lm.context_gradients"

struct model {
    model_config_t cfg;
    mpr_remote_module_t *emb, *dec;
    mpr_module_t *lstm;
    mpr_generator_t *gen; /* the LSTM's init and dropout */
    mpr_rref_t **emb_params, **dec_params;
    int n_emb, n_dec, n_lstm;
    char **names;
};

static void free_generator(void *g) { mpr_generator_destroy(g); }

/* ---- on the ps: the module kinds ---- */

static mpr_tensor_t *embedding_table_forward(mpr_module_t *self, mpr_tensor_t *x, void *ctx) {
    (void)ctx;
    return mpr_module_forward(mpr_module_child(self, "drop"), mpr_module_forward(mpr_module_child(self, "encoder"), x));
}

static mpr_tensor_t *encoder_forward(mpr_module_t *self, mpr_tensor_t *x, void *ctx) {
    (void)ctx;
    return mpr_embedding(mpr_module_get_parameter(self, "weight"), x);
}

static mpr_tensor_t *decoder_forward(mpr_module_t *self, mpr_tensor_t *x, void *ctx) {
    (void)ctx;
    return mpr_module_forward(mpr_module_child(self, "decoder"), mpr_module_forward(mpr_module_child(self, "drop"), x));
}

typedef struct ctor_args {
    int64_t ntoken, width, seed;
    double dropout;
    const char *init_path, *init_prefix;
} ctor_args_t;

/* [ntoken, width, dropout, seed, init_path ("": none), init_prefix] */
static mpr_err_t parse_ctor_args(const mpr_value_t *args, ctor_args_t *a) {
    mpr_err_t e = mpr_args_int(args, 0, &a->ntoken);
    if (!e) e = mpr_args_int(args, 1, &a->width);
    if (!e) e = mpr_args_double(args, 2, &a->dropout);
    if (!e) e = mpr_args_int(args, 3, &a->seed);
    if (!e) e = mpr_args_string(args, 4, &a->init_path);
    if (!e) e = mpr_args_string(args, 5, &a->init_prefix);
    return e;
}

/* Overwrite m's parameters from the file's "<prefix><sub><name>" entries. */
static mpr_err_t load_weights(mpr_module_t *m, const ctor_args_t *a, const char *sub) {
    if (!*a->init_path) return MPR_OK;
    mpr_tensor_dict_t *d = mpr_safetensors_load(a->init_path);
    if (!d) return mpr_last_error_code();
    char prefix[256];
    snprintf(prefix, sizeof prefix, "%s%s", a->init_prefix, sub);
    mpr_err_t e = app_dict_copy_into_module(d, prefix, m);
    mpr_tensor_dict_destroy(d);
    return e;
}

/* The table's weight: U(-0.1, 0.1) or the file's, on the CPU, then moved to
 * `device` (the tutorial's .cuda()). A new reference, caller's. */
static mpr_tensor_t *embedding_weight(const ctor_args_t *a, int device, mpr_generator_t *gen) {
    mpr_tensor_t *w = mpr_tensor_empty(MPR_F32, 2, (const int64_t[]){a->ntoken, a->width});
    mpr_err_t e = w ? mpr_uniform_(w, -0.1, 0.1, gen) : mpr_last_error_code();
    if (!e && *a->init_path) {
        mpr_tensor_dict_t *d = mpr_safetensors_load(a->init_path);
        char name[256];
        snprintf(name, sizeof name, "%semb.encoder.weight", a->init_prefix);
        const char *names[1] = {name};
        e = d ? mpr_tensor_dict_copy_into(d, 1, names, &w, false) : mpr_last_error_code();
        mpr_tensor_dict_destroy(d);
    }
    if (!e && device >= 0) {
        mpr_scope_begin();
        mpr_tensor_t *on_device = mpr_scope_keep(mpr_to_device(w, device));
        mpr_scope_end();
        mpr_tensor_release(w);
        w = on_device;
    }
    if (e) mpr_tensor_release(w), w = NULL;
    return w;
}

static mpr_module_t *make_embedding_table(const mpr_value_t *args, int device, void *user_data) {
    (void)user_data;
    ctor_args_t a;
    if (parse_ctor_args(args, &a)) return NULL;
    mpr_generator_t *gen = mpr_generator_create((uint64_t)a.seed);
    mpr_module_t *m = gen ? mpr_module_create("EmbeddingTable", embedding_table_forward, gen, free_generator) : NULL;
    if (!m) {
        mpr_generator_destroy(gen);
        return NULL;
    }
    mpr_module_t *enc = mpr_module_create("Embedding", encoder_forward, NULL, NULL);
    mpr_tensor_t *w = enc ? embedding_weight(&a, device, gen) : NULL;
    mpr_err_t e = w ? mpr_module_add_parameter(enc, "weight", w) : mpr_last_error_code();
    mpr_tensor_release(w);
    if (!e) e = mpr_module_add_child(m, "encoder", enc);
    else mpr_module_destroy(enc);
    if (!e) e = mpr_module_add_child(m, "drop", mpr_dropout_create(a.dropout, gen));
    if (e) {
        mpr_module_destroy(m);
        return NULL;
    }
    return m;
}

static mpr_module_t *make_decoder(const mpr_value_t *args, int device, void *user_data) {
    (void)user_data;
    ctor_args_t a;
    if (parse_ctor_args(args, &a)) return NULL;
    if (device >= 0) {
        mpr_error_set(MPR_ERR_UNSUPPORTED, "Decoder: CPU only (the tutorial puts only the embedding on a GPU)");
        return NULL;
    }
    mpr_generator_t *gen = mpr_generator_create((uint64_t)a.seed);
    mpr_module_t *m = gen ? mpr_module_create("Decoder", decoder_forward, gen, free_generator) : NULL;
    if (!m) {
        mpr_generator_destroy(gen);
        return NULL;
    }
    mpr_err_t e = mpr_module_add_child(m, "drop", mpr_dropout_create(a.dropout, gen));
    if (!e) e = mpr_module_add_child(m, "decoder", mpr_linear_create(a.width, a.ntoken, true, MPR_F32, gen));
    if (!e) {
        bool prev = mpr_set_grad_enabled(false);
        e = mpr_uniform_(mpr_module_get_parameter(m, "decoder.weight"), -0.1, 0.1, gen);
        if (!e) e = mpr_zero_(mpr_module_get_parameter(m, "decoder.bias"));
        mpr_set_grad_enabled(prev);
    }
    if (!e) e = load_weights(m, &a, "dec.");
    if (e) {
        mpr_module_destroy(m);
        return NULL;
    }
    return m;
}

/* [ctx_id, param rrefs (owned here)...] -> [gradient or none, ...] */
static mpr_err_t fn_context_gradients(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    int64_t ctx_id;
    mpr_err_t e = mpr_args_int(args, 0, &ctx_id);
    mpr_value_t *list = e ? NULL : mpr_value_new_list();
    if (!e && !list) e = mpr_last_error_code();
    for (size_t i = 1; !e && i < mpr_value_list_len(args); i++) {
        mpr_rref_t *r;
        mpr_value_t *v = NULL;
        mpr_tensor_t *p, *g = NULL;
        e = mpr_args_rref(args, i, &r);
        if (!e) e = mpr_rref_local_value(r, &v);
        if (!e) e = mpr_value_get_tensor(v, &p);
        if (!e) e = mpr_dist_get_gradient(ctx_id, p, &g);
        if (!e) e = mpr_value_list_append(list, g ? mpr_value_new_tensor(g) : mpr_value_new_none());
        mpr_tensor_release(g);
        mpr_value_release(v);
    }
    if (e) {
        mpr_value_release(list);
        return e;
    }
    *result = list;
    return MPR_OK;
}

mpr_err_t model_register_kinds(void) {
    mpr_err_t e = mpr_register_module_kind(KIND_EMBEDDING, make_embedding_table, NULL);
    if (!e) e = mpr_register_module_kind(KIND_DECODER, make_decoder, NULL);
    if (!e) e = mpr_register_function(FN_GRADIENTS, fn_context_gradients, NULL);
    return e;
}

/* ---- on the trainer ---- */

static mpr_value_t *ctor_value(const model_config_t *c, int64_t width, uint64_t seed) {
    return mpr_value_list_of(6, mpr_value_new_int(c->ntoken), mpr_value_new_int(width), mpr_value_new_double(c->dropout),
                             mpr_value_new_int((int64_t)seed), mpr_value_new_string(c->init_path ? c->init_path : ""),
                             mpr_value_new_string(c->init_prefix ? c->init_prefix : ""));
}

model_t *model_create(const model_config_t *cfg) {
    model_t *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->cfg = *cfg;
    char dev[160];
    mpr_value_t *ea = ctor_value(cfg, cfg->ninp, cfg->seed * 3 + 1), *da = ctor_value(cfg, cfg->nhid, cfg->seed * 3 + 2);
    snprintf(dev, sizeof dev, "%s/%s", cfg->ps, cfg->embedding_device ? cfg->embedding_device : "cpu");
    if (ea) m->emb = mpr_remote_module_create(dev, KIND_EMBEDDING, ea);
    snprintf(dev, sizeof dev, "%s/cpu", cfg->ps);
    if (da && m->emb) m->dec = mpr_remote_module_create(dev, KIND_DECODER, da);
    mpr_value_release(ea);
    mpr_value_release(da);
    m->gen = mpr_generator_create(cfg->seed * 3 + 3);
    if (!m->dec || !m->gen) goto fail;
    if (!(m->lstm = mpr_lstm_create(cfg->ninp, cfg->nhid, cfg->nlayers, true, false, cfg->dropout, MPR_F32, m->gen)))
        goto fail;
    if (cfg->init_path) {
        mpr_tensor_dict_t *d = mpr_safetensors_load(cfg->init_path);
        char prefix[256];
        snprintf(prefix, sizeof prefix, "%srnn.", cfg->init_prefix ? cfg->init_prefix : "");
        mpr_err_t e = d ? app_dict_copy_into_module(d, prefix, m->lstm) : mpr_last_error_code();
        mpr_tensor_dict_destroy(d);
        if (e) goto fail;
    }
    if (mpr_remote_module_remote_parameters(m->emb, &m->emb_params, &m->n_emb) ||
        mpr_remote_module_remote_parameters(m->dec, &m->dec_params, &m->n_dec))
        goto fail;
    m->n_lstm = mpr_module_num_parameters(m->lstm);
    int n = m->n_emb + m->n_lstm + m->n_dec;
    if (m->n_emb != 1 || m->n_dec != 2 || !(m->names = calloc((size_t)n, sizeof *m->names))) goto fail;
    m->names[0] = strdup("emb.encoder.weight");
    for (int i = 0; i < m->n_lstm; i++) {
        const char *nm;
        mpr_module_parameter(m->lstm, i, &nm);
        char buf[128];
        snprintf(buf, sizeof buf, "rnn.%s", nm);
        m->names[1 + i] = strdup(buf);
    }
    m->names[1 + m->n_lstm] = strdup("dec.decoder.weight");
    m->names[2 + m->n_lstm] = strdup("dec.decoder.bias");
    for (int i = 0; i < n; i++)
        if (!m->names[i]) goto fail;
    return m;
fail:
    if (!mpr_last_error_code()) mpr_error_set(MPR_ERR_NOMEM, "model: out of memory");
    model_destroy(m);
    return NULL;
}

void model_destroy(model_t *m) {
    if (!m) return;
    for (int i = 0; i < m->n_emb; i++) mpr_rref_release(m->emb_params[i]);
    for (int i = 0; i < m->n_dec; i++) mpr_rref_release(m->dec_params[i]);
    free(m->emb_params);
    free(m->dec_params);
    for (int i = 0; m->names && i < m->n_emb + m->n_lstm + m->n_dec; i++) free(m->names[i]);
    free(m->names);
    mpr_remote_module_destroy(m->emb);
    mpr_remote_module_destroy(m->dec);
    mpr_module_destroy(m->lstm);
    mpr_generator_destroy(m->gen);
    free(m);
}

mpr_err_t model_forward(model_t *m, mpr_tensor_t *input, mpr_tensor_t *h0, mpr_tensor_t *c0,
                        mpr_tensor_t **decoded, mpr_tensor_t **hn, mpr_tensor_t **cn) {
    *decoded = NULL;
    mpr_tensor_t *emb = NULL, *out = NULL, *dec = NULL;
    mpr_err_t e = mpr_remote_module_forward(m->emb, input, &emb); /* embedding on the ps */
    mpr_scope_adopt(emb);
    if (!e) e = mpr_lstm_forward(m->lstm, emb, h0, c0, &out, hn, cn); /* LSTM here */
    if (!e) e = mpr_remote_module_forward(m->dec, out, &dec);       /* decoder on the ps */
    mpr_scope_adopt(dec);
    if (!e) *decoded = dec;
    return e;
}

mpr_err_t model_parameter_rrefs(model_t *m, mpr_rref_t ***rrefs, int *n) {
    int total = m->n_emb + m->n_lstm + m->n_dec, k = 0;
    mpr_rref_t **r = calloc((size_t)total, sizeof *r);
    if (!r) return mpr_error_set(MPR_ERR_NOMEM, "model: out of memory");
    for (int i = 0; i < m->n_emb; i++) r[k++] = mpr_rref_retain(m->emb_params[i]);
    for (int i = 0; i < m->n_lstm; i++) {
        mpr_value_t *v = mpr_value_new_tensor(mpr_module_parameter(m->lstm, i, NULL));
        r[k++] = v ? mpr_rref_create_local(v) : NULL; /* the tutorial's RRef(param) */
        mpr_value_release(v);
    }
    for (int i = 0; i < m->n_dec; i++) r[k++] = mpr_rref_retain(m->dec_params[i]);
    for (int i = 0; i < total; i++)
        if (!r[i]) {
            for (int j = 0; j < total; j++) mpr_rref_release(r[j]);
            free(r);
            return mpr_last_error_code() ? mpr_last_error_code() : MPR_ERR_NOMEM;
        }
    *rrefs = r, *n = total;
    return MPR_OK;
}

const char *const *model_parameter_names(model_t *m, int *n) {
    *n = m->n_emb + m->n_lstm + m->n_dec;
    return (const char *const *)m->names;
}

mpr_err_t model_train(model_t *m, bool training) {
    mpr_module_train(m->lstm, training);
    mpr_err_t e = mpr_remote_module_train(m->emb, training);
    return e ? e : mpr_remote_module_train(m->dec, training);
}

mpr_module_t *model_lstm(model_t *m) { return m->lstm; }

/* RRef i of the remote ones (embedding first, then decoder). */
static mpr_rref_t *remote_param(model_t *m, int i) {
    return i < m->n_emb ? m->emb_params[i] : m->dec_params[i - m->n_emb];
}

/* `t` on the CPU (a new reference: t itself there, else a copy): a
 * parameter or gradient of a table on a GPU arrives on that device. */
static mpr_tensor_t *host_copy(mpr_tensor_t *t) {
    mpr_scope_begin();
    mpr_tensor_t *h = mpr_scope_keep(mpr_to_device(t, -1));
    mpr_scope_end();
    return h;
}

mpr_err_t model_fetch_parameters(model_t *m, mpr_tensor_t ***values, int *n) {
    int total = m->n_emb + m->n_lstm + m->n_dec;
    mpr_tensor_t **t = calloc((size_t)total, sizeof *t);
    if (!t) return mpr_error_set(MPR_ERR_NOMEM, "model: out of memory");
    mpr_err_t e = MPR_OK;
    for (int i = 0; !e && i < total; i++) {
        bool local = i >= m->n_emb && i < m->n_emb + m->n_lstm;
        if (local) {
            t[i] = mpr_tensor_retain(mpr_module_parameter(m->lstm, i - m->n_emb, NULL));
            continue;
        }
        mpr_value_t *v = NULL;
        mpr_tensor_t *p;
        e = mpr_rref_to_here(remote_param(m, i < m->n_emb ? i : i - m->n_lstm), MPR_TIMEOUT_DEFAULT, &v);
        if (!e) e = mpr_value_get_tensor(v, &p);
        if (!e && !(t[i] = host_copy(p))) e = mpr_last_error_code();
        mpr_value_release(v);
    }
    if (e) {
        for (int i = 0; i < total; i++) mpr_tensor_release(t[i]);
        free(t);
        return e;
    }
    *values = t, *n = total;
    return MPR_OK;
}

mpr_err_t model_context_gradients(model_t *m, int64_t ctx_id, mpr_tensor_t ***grads, int *n) {
    int total = m->n_emb + m->n_lstm + m->n_dec, n_remote = m->n_emb + m->n_dec;
    mpr_tensor_t **g = calloc((size_t)total, sizeof *g);
    mpr_value_t *args = mpr_value_new_list(), *r = NULL;
    mpr_err_t e = g && args ? mpr_value_list_append(args, mpr_value_new_int(ctx_id)) : MPR_ERR_NOMEM;
    for (int i = 0; !e && i < n_remote; i++) e = mpr_value_list_append(args, mpr_value_new_rref(remote_param(m, i)));
    if (!e) e = mpr_rpc_sync(mpr_to_name(m->cfg.ps), FN_GRADIENTS, args, MPR_TIMEOUT_DEFAULT, &r);
    for (int i = 0; !e && i < total; i++) {
        bool local = i >= m->n_emb && i < m->n_emb + m->n_lstm;
        if (local) {
            e = mpr_dist_get_gradient(ctx_id, mpr_module_parameter(m->lstm, i - m->n_emb, NULL), &g[i]);
            continue;
        }
        mpr_value_t *v = mpr_value_list_get(r, (size_t)(i < m->n_emb ? i : i - m->n_lstm));
        mpr_tensor_t *t;
        if (v && mpr_value_kind(v) == MPR_VALUE_TENSOR && !mpr_value_get_tensor(v, &t) && !(g[i] = host_copy(t)))
            e = mpr_last_error_code();
    }
    mpr_value_release(args);
    mpr_value_release(r);
    if (e) {
        for (int i = 0; g && i < total; i++) mpr_tensor_release(g[i]);
        free(g);
        return e == MPR_ERR_NOMEM && !mpr_last_error_code() ? mpr_error_set(e, "model: out of memory") : e;
    }
    *grads = g, *n = total;
    return MPR_OK;
}
