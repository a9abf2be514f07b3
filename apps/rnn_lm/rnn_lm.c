/* rnn_lm.c — the RPC tutorial's distributed RNN language model as an MPI
 * program: the embedding table and the decoder on the parameter server
 * (rank 0, "ps"), the LSTM on the trainer (rank 1, "trainer"), trained with
 * distributed autograd and a DistributedOptimizer on real text (Debian's
 * fortunes), with truncated BPTT (the hidden state is detached between
 * batches).
 *
 *   mpirun -np 2 build/apps/rnn_lm/rnn_lm --epochs 3 --optimizer adam --metrics lm.csv
 *   mpirun -np 2 build/apps/rnn_lm/rnn_lm --parity tests/data/rnn_lm_parity.safetensors
 *
 * Each epoch prints the training loss and the held-out perplexity next to
 * the unigram baseline; --parity runs one step of the tutorial's tiny model
 * on a reference file's weights and inputs and compares every parameter's
 * gradient with PyTorch's (tests/ref/gen_rnn_lm_parity.py).
 *
 * Loss: cross entropy over the flattened [T * B, ntoken] scores (as
 * PyTorch's word_language_model; the tutorial's random-target snippet
 * passes mismatched shapes). Exit status: 0 done (parity: within 1e-5), 1 a
 * failure (printed), 2 bad options or not 2 ranks. The last line on stdout
 * is a JSON summary. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpirpc/mpirpc.h>

#include "app.h"
#include "corpus.h"
#include "model.h"

typedef struct run_config {
    const char *level, *optimizer, *embedding_device, *parity_path;
    int64_t vocab, emsize, nhid, nlayers, bptt, batch, eval_batch, epochs, max_tokens;
    int64_t vocab_used; /* the corpus's vocabulary size (<= vocab) */
    int64_t generate;   /* tokens of text to sample after training */
    double dropout, lr, valid_fraction, parity_tol;
    app_common_t common;
} run_config_t;

static int fail(const char *what) {
    fprintf(stderr, "rnn_lm: %s: %s: %s\n", what, mpr_error_name(mpr_last_error_code()), mpr_last_error());
    return 1;
}

/* A caller-owned zero LSTM state [nlayers, batch, nhid]. */
static mpr_tensor_t *zeros_state(const run_config_t *rc, int64_t batch) {
    mpr_scope_begin();
    mpr_tensor_t *z = mpr_scope_keep(mpr_zeros(MPR_F32, MPR_SHAPE(rc->nlayers, batch, rc->nhid)));
    mpr_scope_end();
    return z;
}

/* Replace *keep by a caller-owned detached copy of t (truncated BPTT). */
static void keep_detached(mpr_tensor_t **keep, mpr_tensor_t *t) {
    mpr_tensor_t *d = mpr_scope_keep(mpr_detach(t));
    mpr_tensor_release(*keep);
    *keep = d;
}

typedef struct eval_result {
    double loss, ppl, acc;
} eval_result_t;

/* Mean cross entropy, perplexity and next-token accuracy on the held-out
 * split, in eval mode (no dropout), without recording. */
static mpr_err_t evaluate(const run_config_t *rc, model_t *model, mpr_tensor_t *data, eval_result_t *out) {
    mpr_err_t e = model_train(model, false);
    bool prev = mpr_set_grad_enabled(false);
    int64_t rows = mpr_tensor_shape(data)[0], B = mpr_tensor_shape(data)[1], n = 0, correct = 0;
    double total = 0;
    mpr_tensor_t *h = zeros_state(rc, B), *c = zeros_state(rc, B);
    for (int64_t i = 0; !e && i + 1 < rows; i += rc->bptt) {
        int64_t T = rc->bptt < rows - 1 - i ? rc->bptt : rows - 1 - i;
        mpr_scope_begin();
        mpr_tensor_t *x = mpr_contiguous(mpr_narrow(data, 0, i, T));
        mpr_tensor_t *y = mpr_reshape(mpr_contiguous(mpr_narrow(data, 0, i + 1, T)), MPR_SHAPE(-1));
        mpr_tensor_t *dec, *hn, *cn;
        e = model_forward(model, x, h, c, &dec, &hn, &cn);
        mpr_tensor_t *scores = e ? NULL : mpr_reshape(dec, MPR_SHAPE(-1, rc->vocab_used));
        double l;
        if (!e) e = mpr_item(mpr_cross_entropy(scores, y), &l);
        if (!e) {
            total += l * (double)(T * B), n += T * B;
            correct += app_count_correct(scores, y);
            keep_detached(&h, hn), keep_detached(&c, cn);
        }
        mpr_scope_end();
    }
    mpr_tensor_release(h), mpr_tensor_release(c);
    mpr_set_grad_enabled(prev);
    mpr_err_t e2 = model_train(model, true);
    if (!e) e = e2;
    out->loss = total / (double)n, out->ppl = exp(out->loss), out->acc = (double)correct / (double)n;
    return e;
}

/* ---- checkpoints: every parameter ("model.<name>"), the hidden state
 * ("state.h", "state.c"), the DistributedOptimizer's state gathered from
 * the parameters' owners ("optim.") and the run state; the ps rebuilds its
 * modules from the same file on --resume, then the optimizer state is
 * imported, so Adam continues exactly. ---- */
static mpr_err_t save_checkpoint(const run_config_t *rc, model_t *model, mpr_dist_optimizer_t *opt, mpr_tensor_t *h,
                                 mpr_tensor_t *c, const app_ckpt_state_t *st) {
    mpr_tensor_t **values = NULL;
    int n = 0, nn;
    const char *const *names = model_parameter_names(model, &nn);
    mpr_tensor_dict_t *d = mpr_tensor_dict_create();
    mpr_err_t e = d ? model_fetch_parameters(model, &values, &n) : mpr_last_error_code();
    if (!e) e = app_dict_add_tensors(d, "model.", n, names, values);
    if (!e) e = mpr_tensor_dict_set(d, "state.h", h);
    if (!e) e = mpr_tensor_dict_set(d, "state.c", c);
    if (!e) e = mpr_dist_optimizer_state_export(opt, d, "optim.");
    if (!e) e = app_ckpt_save(rc->common.checkpoint_dir, d, st, 2);
    for (int i = 0; i < n; i++) mpr_tensor_release(values[i]);
    free(values);
    mpr_tensor_dict_destroy(d);
    return e;
}

typedef struct train_state {
    app_ckpt_state_t st;
    mpr_tensor_t *h, *c; /* caller-owned */
    char *ckpt_path;     /* the checkpoint resumed from (the ps loads it too) */
} train_state_t;

/* --resume: the newest checkpoint's state and hidden state. No checkpoint:
 * a fresh start. */
static mpr_err_t load_checkpoint(const run_config_t *rc, train_state_t *ts) {
    mpr_tensor_dict_t *d = NULL;
    mpr_err_t e = app_ckpt_load_latest(rc->common.checkpoint_dir, &d, &ts->st, &ts->ckpt_path);
    if (e == MPR_ERR_NOT_FOUND) {
        fprintf(stderr, "rnn_lm: --resume: no checkpoint in '%s' yet: starting from the beginning\n",
                rc->common.checkpoint_dir);
        memset(&ts->st, 0, sizeof ts->st);
        return MPR_OK;
    }
    if (!e && ts->st.seed != (uint64_t)rc->common.seed)
        e = mpr_error_set(MPR_ERR_INVALID_ARG, "--resume: '%s' was written with --seed %llu", ts->ckpt_path,
                          (unsigned long long)ts->st.seed);
    mpr_tensor_t *h = e ? NULL : mpr_tensor_dict_get(d, "state.h"), *c = e ? NULL : mpr_tensor_dict_get(d, "state.c");
    if (!e && (!h || !c || mpr_tensor_shape(h)[1] != rc->batch || mpr_tensor_shape(h)[2] != rc->nhid))
        e = mpr_error_set(MPR_ERR_INVALID_ARG, "--resume: '%s' holds no hidden state for --batch %lld --nhid %lld",
                          ts->ckpt_path, (long long)rc->batch, (long long)rc->nhid);
    if (!e) {
        mpr_tensor_release(ts->h), mpr_tensor_release(ts->c);
        ts->h = mpr_tensor_retain(h), ts->c = mpr_tensor_retain(c);
        printf("Resumed from %s: step %lld (epoch %lld, batch %lld)\n", ts->ckpt_path, (long long)ts->st.step,
               (long long)ts->st.epoch + 1, (long long)ts->st.step_in_epoch);
    }
    mpr_tensor_dict_destroy(d);
    return e;
}

/* --resume: the optimizer state of checkpoint `path` into `opt`. */
static mpr_err_t load_optimizer_state(mpr_dist_optimizer_t *opt, const char *path) {
    mpr_tensor_dict_t *d = mpr_safetensors_load(path);
    mpr_err_t e = d ? mpr_dist_optimizer_state_import(opt, d, "optim.") : mpr_last_error_code();
    mpr_tensor_dict_destroy(d);
    if (e) mpr_error_set(e, "--resume: the optimizer state in '%s': %s", path, mpr_last_error());
    return e;
}

static mpr_dist_optimizer_t *make_optimizer(const run_config_t *rc, model_t *model) {
    mpr_rref_t **params;
    int n;
    if (model_parameter_rrefs(model, &params, &n)) return NULL;
    mpr_optim_options_t o;
    mpr_optim_options_default(rc->optimizer, &o);
    o.lr = rc->lr;
    mpr_dist_optimizer_t *opt = mpr_dist_optimizer_create(rc->optimizer, &o, params, n);
    for (int i = 0; i < n; i++) mpr_rref_release(params[i]);
    free(params);
    return opt;
}

/* One truncated-BPTT step in its own dist autograd context; the hidden
 * state moves on (detached). *loss: the batch's mean cross entropy. */
static mpr_err_t train_step(const run_config_t *rc, model_t *model, mpr_dist_optimizer_t *opt, mpr_tensor_t *data,
                            int64_t i, train_state_t *ts, double *loss, int64_t *tokens) {
    int64_t rows = mpr_tensor_shape(data)[0];
    int64_t T = rc->bptt < rows - 1 - i ? rc->bptt : rows - 1 - i;
    int64_t ctx;
    mpr_err_t e = mpr_dist_context_begin(&ctx);
    if (e) return e;
    mpr_scope_begin();
    mpr_tensor_t *x = mpr_contiguous(mpr_narrow(data, 0, i, T));
    mpr_tensor_t *y = mpr_reshape(mpr_contiguous(mpr_narrow(data, 0, i + 1, T)), MPR_SHAPE(-1));
    mpr_tensor_t *dec, *hn, *cn;
    e = model_forward(model, x, ts->h, ts->c, &dec, &hn, &cn);
    mpr_tensor_t *l = e ? NULL : mpr_cross_entropy(mpr_reshape(dec, MPR_SHAPE(-1, rc->vocab_used)), y);
    if (!e && !l) e = mpr_last_error_code();
    if (!e) e = mpr_item(l, loss);
    if (!e) e = mpr_dist_backward(ctx, &l, 1, false);
    if (!e) e = mpr_dist_optimizer_step(opt, ctx);
    if (!e) keep_detached(&ts->h, hn), keep_detached(&ts->c, cn);
    mpr_scope_end();
    mpr_err_t e2 = mpr_dist_context_end(ctx);
    *tokens = T * rc->batch;
    return e ? e : e2;
}

/* Sample `n` tokens from the trained model (eval mode, temperature 1), one
 * at a time through the ps, starting after a line end; print them. */
static mpr_err_t generate_text(const run_config_t *rc, model_t *model, const corpus_t *corpus, int64_t n) {
    mpr_err_t e = model_train(model, false);
    bool prev = mpr_set_grad_enabled(false);
    mpr_generator_t *g = mpr_generator_create((uint64_t)rc->common.seed + 77);
    float *p = malloc((size_t)rc->vocab_used * sizeof *p);
    int64_t tok = 0;
    for (int64_t i = 0; i < corpus->vocab_size; i++) /* start after a line end */
        if (strcmp(corpus->tokens[i], corpus->word_level ? "<eos>" : "\n") == 0) tok = i;
    mpr_tensor_t *h = zeros_state(rc, 1), *c = zeros_state(rc, 1);
    printf("sample (%lld tokens):\n", (long long)n);
    for (int64_t k = 0; !e && g && p && k < n; k++) {
        mpr_scope_begin();
        mpr_tensor_t *x = mpr_full(MPR_I64, MPR_SHAPE(1, 1), (double)tok), *dec, *hn, *cn;
        e = model_forward(model, x, h, c, &dec, &hn, &cn);
        mpr_tensor_t *probs = e ? NULL : mpr_softmax(mpr_reshape(dec, MPR_SHAPE(-1)), 0);
        if (!e) e = probs ? mpr_copy_to_buffer(probs, MPR_F32, p, (size_t)rc->vocab_used * sizeof *p) : mpr_last_error_code();
        if (!e) {
            double u = mpr_generator_next_double(g), acc = 0;
            for (tok = 0; tok < rc->vocab_used - 1 && (acc += p[tok]) <= u; tok++) {
            }
            const char *t = corpus->tokens[tok];
            if (!corpus->word_level) fputs(t, stdout);
            else if (strcmp(t, "<eos>") == 0) putchar('\n');
            else printf("%s ", t);
            keep_detached(&h, hn), keep_detached(&c, cn);
        }
        mpr_scope_end();
    }
    printf("\n");
    mpr_tensor_release(h), mpr_tensor_release(c);
    free(p);
    mpr_generator_destroy(g);
    mpr_set_grad_enabled(prev);
    mpr_err_t e2 = model_train(model, true);
    return e ? e : e2;
}

static int run_trainer(run_config_t *rc) {
    corpus_t *corpus = corpus_load(rc->common.data_dir, strcmp(rc->level, "word") == 0, rc->vocab, rc->valid_fraction,
                                   rc->max_tokens, (uint64_t)rc->common.seed);
    if (!corpus) return fail("loading the corpus");
    rc->vocab_used = corpus->vocab_size;
    double unigram = corpus_unigram_perplexity(corpus);
    mpr_tensor_t *train = corpus_batchify(corpus->train, corpus->n_train, rc->batch);
    mpr_tensor_t *valid = corpus_batchify(corpus->valid, corpus->n_valid, rc->eval_batch);
    printf("corpus: %s level, vocabulary %lld, %lld training tokens (%lld fortunes), %lld held-out tokens (%lld "
           "fortunes, %.1f%% <unk>); unigram perplexity %.2f\n",
           rc->level, (long long)corpus->vocab_size, (long long)corpus->n_train, (long long)corpus->n_fortunes_train,
           (long long)corpus->n_valid, (long long)corpus->n_fortunes_valid, 100 * corpus->unk_rate_valid, unigram);
    if (!train || !valid) {
        corpus_free(corpus);
        mpr_tensor_release(train), mpr_tensor_release(valid);
        return fail("batching (fewer tokens than a batch: raise --max-tokens)");
    }
    train_state_t ts = {0};
    int status = 0;
    if (rc->common.resume && load_checkpoint(rc, &ts)) status = fail("resuming");
    model_config_t mc = {.ntoken = rc->vocab_used, .ninp = rc->emsize, .nhid = rc->nhid, .nlayers = (int)rc->nlayers,
                         .dropout = rc->dropout, .seed = (uint64_t)rc->common.seed, .ps = "ps",
                         .embedding_device = rc->embedding_device, .init_path = ts.ckpt_path, .init_prefix = "model."};
    model_t *model = status ? NULL : model_create(&mc);
    mpr_dist_optimizer_t *opt = model ? make_optimizer(rc, model) : NULL;
    if (!status && !opt) status = fail("building the model");
    if (!status && ts.ckpt_path && load_optimizer_state(opt, ts.ckpt_path)) status = fail("resuming");
    int64_t rows = mpr_tensor_shape(train)[0], per_epoch = (rows - 1 + rc->bptt - 1) / rc->bptt;
    if (!ts.h) ts.h = zeros_state(rc, rc->batch), ts.c = zeros_state(rc, rc->batch);
    static const char *extra[] = {"valid_loss", "valid_ppl", "unigram_ppl"};
    app_metrics_t *csv = NULL;
    if (!status && rc->common.metrics_path &&
        !(csv = app_metrics_open(rc->common.metrics_path, extra, 3, rc->common.resume ? ts.st.step : -1)))
        status = fail("metrics");
    app_progress_t *bar = app_progress_create(&(app_progress_config_t){
        .out = stdout, .total_steps = per_epoch * rc->epochs, .first_step = ts.st.step, .epochs = rc->epochs,
        .interval_s = rc->common.log_interval, .unit = "tokens"});
    double t0 = app_now(), wall_before = ts.st.wall_s, first_loss = NAN, last_train = NAN;
    eval_result_t ev = {NAN, NAN, NAN};
    for (int64_t epoch = ts.st.epoch; !status && epoch < rc->epochs; epoch++) {
        double sum = 0;
        int64_t nb = 0;
        for (int64_t b = ts.st.step_in_epoch; !status && b < per_epoch; b++) {
            double loss;
            int64_t tokens;
            if (train_step(rc, model, opt, train, b * rc->bptt, &ts, &loss, &tokens)) {
                status = fail("training step");
                break;
            }
            if (isnan(first_loss)) first_loss = loss;
            sum += loss, nb++;
            ts.st.step++, ts.st.step_in_epoch = b + 1;
            double wall = wall_before + (app_now() - t0);
            app_progress_update(bar, ts.st.step, epoch + 1, tokens, loss);
            if (csv && app_metrics_write(csv, ts.st.step, epoch + 1, wall, loss, app_progress_rate(bar), NAN, NULL))
                status = fail("metrics");
            ts.st.wall_s = wall, ts.st.epoch = epoch, ts.st.seed = (uint64_t)rc->common.seed;
            if (rc->common.checkpoint_dir && rc->common.checkpoint_every > 0 &&
                ts.st.step % rc->common.checkpoint_every == 0 && b + 1 < per_epoch &&
                save_checkpoint(rc, model, opt, ts.h, ts.c, &ts.st))
                status = fail("checkpoint");
        }
        if (status) break;
        last_train = nb ? sum / (double)nb : NAN;
        if (evaluate(rc, model, valid, &ev)) {
            status = fail("evaluation");
            break;
        }
        double wall = wall_before + (app_now() - t0);
        app_progress_print(bar,
                           "epoch %lld | train loss %.3f (ppl %.2f) | valid loss %.3f | valid ppl %.2f | unigram ppl "
                           "%.2f | valid accuracy %.1f%% | %.1f s",
                           (long long)epoch + 1, last_train, exp(last_train), ev.loss, ev.ppl, unigram, 100 * ev.acc,
                           wall);
        double row[3] = {ev.loss, ev.ppl, unigram};
        if (csv && app_metrics_write(csv, ts.st.step, epoch + 1, wall, NAN, NAN, ev.acc, row)) status = fail("metrics");
        ts.st.epoch = epoch + 1, ts.st.step_in_epoch = 0, ts.st.wall_s = wall;
        /* a new epoch starts from a zero state, as word_language_model's */
        mpr_tensor_release(ts.h), mpr_tensor_release(ts.c);
        ts.h = zeros_state(rc, rc->batch), ts.c = zeros_state(rc, rc->batch);
        if (!status && rc->common.checkpoint_dir && save_checkpoint(rc, model, opt, ts.h, ts.c, &ts.st))
            status = fail("checkpoint");
    }
    app_progress_finish(bar);
    app_progress_destroy(bar);
    app_metrics_close(csv);
    if (!status && rc->generate > 0 && generate_text(rc, model, corpus, rc->generate)) status = fail("generating text");
    corpus_free(corpus);
    char *png = app_plot_path(&rc->common);
    if (!status && png && rc->common.metrics_path &&
        app_plot_metrics(rc->common.metrics_path, png, "rnn_lm: training loss and held-out next-token accuracy") == MPR_OK)
        printf("plot: %s\n", png);
    free(png);
    printf("{\"app\":\"rnn_lm\",\"level\":\"%s\",\"vocab\":%lld,\"optimizer\":\"%s\",\"lr\":%g,\"epochs\":%lld,"
           "\"steps\":%lld,\"first_loss\":%.4f,\"train_loss\":%.4f,\"valid_loss\":%.4f,\"valid_ppl\":%.3f,"
           "\"unigram_ppl\":%.3f,\"valid_acc\":%.4f,\"wall_s\":%.2f,\"ok\":%s}\n",
           rc->level, (long long)rc->vocab_used, rc->optimizer, rc->lr, (long long)rc->epochs, (long long)ts.st.step,
           first_loss, last_train, ev.loss, ev.ppl, unigram, ev.acc, wall_before + (app_now() - t0),
           status ? "false" : "true");
    mpr_dist_optimizer_destroy(opt);
    model_destroy(model);
    mpr_tensor_release(ts.h), mpr_tensor_release(ts.c);
    free(ts.ckpt_path);
    mpr_tensor_release(train), mpr_tensor_release(valid);
    return status;
}

/* ---- --parity: one step of the tutorial's tiny model against PyTorch ---- */
static int64_t meta_int(const mpr_tensor_dict_t *d, const char *key) {
    const char *v = mpr_tensor_dict_get_meta(d, key);
    return v ? strtoll(v, NULL, 10) : -1;
}

/* max |a - b| and, in *scale, max |b|. */
static double max_abs_diff(const mpr_tensor_t *a, const mpr_tensor_t *b, double *scale) {
    int64_t n = mpr_tensor_numel(a);
    *scale = 0;
    if (n != mpr_tensor_numel(b)) return INFINITY;
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    double m = INFINITY;
    if (x && y && !mpr_copy_to_buffer(a, MPR_F32, x, (size_t)n * sizeof *x) &&
        !mpr_copy_to_buffer(b, MPR_F32, y, (size_t)n * sizeof *y)) {
        m = 0;
        for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)x[i] - (double)y[i])), *scale = fmax(*scale, fabs(y[i]));
    }
    free(x), free(y);
    return m;
}

static int run_parity(run_config_t *rc) {
    mpr_tensor_dict_t *ref = mpr_safetensors_load(rc->parity_path);
    if (!ref) return fail("reading the parity reference");
    model_config_t mc = {.ntoken = meta_int(ref, "ntoken"), .ninp = meta_int(ref, "ninp"), .nhid = meta_int(ref, "nhid"),
                         .nlayers = (int)meta_int(ref, "nlayers"), .dropout = 0, .seed = 0, .ps = "ps",
                         .embedding_device = rc->embedding_device, .init_path = rc->parity_path, .init_prefix = ""};
    mpr_tensor_t *x = mpr_tensor_dict_get(ref, "input"), *y = mpr_tensor_dict_get(ref, "target");
    mpr_tensor_t *h0 = mpr_tensor_dict_get(ref, "h0"), *c0 = mpr_tensor_dict_get(ref, "c0"), *ref_loss = mpr_tensor_dict_get(ref, "loss");
    int status = 0;
    model_t *model = NULL;
    if (mc.ntoken < 1 || mc.ninp < 1 || mc.nhid < 1 || mc.nlayers < 1 || !x || !y || !h0 || !c0 || !ref_loss) {
        mpr_error_set(MPR_ERR_DECODE, "'%s' is not an rnn_lm parity reference (tests/ref/gen_rnn_lm_parity.py)",
                      rc->parity_path);
        status = fail("parity");
    } else if (!(model = model_create(&mc))) {
        status = fail("building the model");
    }
    int64_t ctx = 0;
    mpr_tensor_t **grads = NULL;
    int n = 0;
    double loss = NAN, worst = 0, worst_rel = 0, want_loss = NAN;
    if (!status && mpr_dist_context_begin(&ctx)) status = fail("dist context");
    if (!status) {
        mpr_scope_begin();
        mpr_tensor_t *dec, *hn, *cn, *l = NULL;
        mpr_err_t e = model_forward(model, x, h0, c0, &dec, &hn, &cn);
        if (!e) l = mpr_cross_entropy(mpr_reshape(dec, MPR_SHAPE(-1, mc.ntoken)), mpr_reshape(y, MPR_SHAPE(-1)));
        if (!e && !l) e = mpr_last_error_code();
        if (!e) e = mpr_item(l, &loss);
        if (!e) e = mpr_dist_backward(ctx, &l, 1, false);
        if (!e) e = model_context_gradients(model, ctx, &grads, &n);
        mpr_scope_end();
        if (e) status = fail("parity step");
        mpr_dist_context_end(ctx);
    }
    if (!status) {
        mpr_item(ref_loss, &want_loss);
        worst = fabs(loss - want_loss);
        int nn;
        const char *const *names = model_parameter_names(model, &nn);
        for (int i = 0; i < n; i++) {
            char key[160];
            snprintf(key, sizeof key, "grad.%s", names[i]);
            mpr_tensor_t *want = mpr_tensor_dict_get(ref, key);
            double scale = 0, d = !want ? INFINITY : !grads[i] ? INFINITY : max_abs_diff(grads[i], want, &scale);
            double rel = scale > 0 ? d / scale : d;
            printf("  %-24s max |grad - torch| = %.3g (relative to max |torch grad| %.3g: %.3g)%s\n", names[i], d,
                   scale, rel, !grads[i] ? " (no gradient)" : "");
            worst = fmax(worst, d), worst_rel = fmax(worst_rel, rel);
        }
        printf("loss %.7f (torch %.7f)\n", loss, want_loss);
        /* absolute, as the issue asks, and relative: the first layers' gradients are
         * themselves below 1e-5 here, so the absolute bound alone would prove little */
        if (!(worst <= rc->parity_tol && worst_rel <= rc->parity_tol)) status = 1;
    }
    printf("{\"app\":\"rnn_lm\",\"parity\":\"%s\",\"parameters\":%d,\"max_abs_diff\":%.3g,\"max_rel_diff\":%.3g,"
           "\"tolerance\":%g,\"ok\":%s}\n",
           rc->parity_path, n, worst, worst_rel, rc->parity_tol, status ? "false" : "true");
    for (int i = 0; i < n; i++) mpr_tensor_release(grads[i]);
    free(grads);
    model_destroy(model);
    mpr_tensor_dict_destroy(ref);
    return status;
}

static bool valid_device(const char *s) {
    if (strcmp(s, "cpu") == 0) return true;
    char *end;
    if (strncmp(s, "cuda:", 5) != 0 || !s[5]) return false;
    long n = strtol(s + 5, &end, 10);
    return !*end && n >= 0 && n < 1024;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    run_config_t rc = {.level = "word", .optimizer = "sgd", .embedding_device = "cpu", .vocab = 2000, .emsize = 64,
                       .nhid = 128, .nlayers = 2, .bptt = 35, .batch = 20, .eval_batch = 10, .epochs = 3,
                       .dropout = 0.2, .lr = 0, .valid_fraction = 0.1, .parity_tol = 1e-5};
    app_option_t opts[] = {
        {"level", APP_OPT_CHOICE, &rc.level, 0, 0, "word|char", "tokens: words (and punctuation) or bytes"},
        {"vocab", APP_OPT_INT, &rc.vocab, 2, 1e7, NULL, "vocabulary cap (<unk> included)"},
        {"max-tokens", APP_OPT_INT, &rc.max_tokens, 0, 1e12, NULL, "use at most this many tokens (0: the whole corpus)"},
        {"valid-fraction", APP_OPT_DOUBLE, &rc.valid_fraction, 0.001, 0.5, NULL, "share of fortunes held out"},
        {"emsize", APP_OPT_INT, &rc.emsize, 1, 1e5, NULL, "embedding size (ninp)"},
        {"nhid", APP_OPT_INT, &rc.nhid, 1, 1e5, NULL, "LSTM hidden size"},
        {"nlayers", APP_OPT_INT, &rc.nlayers, 1, 64, NULL, "LSTM layers"},
        {"dropout", APP_OPT_DOUBLE, &rc.dropout, 0, 0.99, NULL, "dropout in the embedding, between LSTM layers, before the decoder"},
        {"bptt", APP_OPT_INT, &rc.bptt, 1, 1e5, NULL, "sequence length of truncated backpropagation through time"},
        {"batch", APP_OPT_INT, &rc.batch, 1, 1e5, NULL, "training batch (columns)"},
        {"eval-batch", APP_OPT_INT, &rc.eval_batch, 1, 1e5, NULL, "held-out batch (columns)"},
        {"epochs", APP_OPT_INT, &rc.epochs, 1, 1e6, NULL, "passes over the training split"},
        {"optimizer", APP_OPT_CHOICE, &rc.optimizer, 0, 0, "sgd|adam", "the DistributedOptimizer's local optimizer"},
        {"lr", APP_OPT_DOUBLE, &rc.lr, 0, 100, NULL, "learning rate (0: 0.05 for sgd as the tutorial, 0.002 for adam)"},
        {"generate", APP_OPT_INT, &rc.generate, 0, 1e6, NULL, "after training, print this many tokens sampled from the model"},
        {"embedding-device", APP_OPT_STRING, &rc.embedding_device, 0, 0, NULL, "the embedding table's device on the ps: cpu or cuda:N"},
        {"parity", APP_OPT_STRING, &rc.parity_path, 0, 0, NULL, "instead of training: one step against a PyTorch reference file"},
        {"parity-tolerance", APP_OPT_DOUBLE, &rc.parity_tol, 0, 1, NULL, "largest accepted gradient difference for --parity, absolute and relative to the largest gradient of the parameter"},
        {0}};
    app_parse_options_or_exit(argc, argv,
                              "rnn_lm: the RPC tutorial's model-parallel RNN language model: embedding table and\n"
                              "decoder on the parameter server (rank 0), LSTM on the trainer (rank 1), trained on\n"
                              "Debian's fortunes (--data DIR: another folder of fortune files).\n"
                              "usage: mpirun -np 2 rnn_lm [options]",
                              opts, &rc.common);
    bool talk = app_launch_rank() == 0;
    if (!valid_device(rc.embedding_device)) {
        if (talk) fprintf(stderr, "rnn_lm: --embedding-device: '%s' is not cpu or cuda:N (try --help)\n", rc.embedding_device);
        return 2;
    }
    if (rc.common.resume && !rc.common.checkpoint_dir) {
        if (talk) fprintf(stderr, "rnn_lm: --resume needs --checkpoint-dir (try --help)\n");
        return 2;
    }
    if (rc.lr == 0) rc.lr = strcmp(rc.optimizer, "adam") == 0 ? 0.002 : 0.05;
    if (model_register_kinds()) return fail("registering module kinds");
    int provided, rank, world;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world != 2) {
        if (rank == 0) fprintf(stderr, "rnn_lm: runs on 2 ranks (ps and trainer): mpirun -np 2 ... (got %d; try --help)\n", world);
        MPI_Finalize();
        return 2;
    }
    mpr_init_options_t io;
    mpr_init_options_default(&io);
    io.name = rank == 0 ? "ps" : "trainer";
    /* the serving ranks enter mpr_shutdown at once and wait there for the whole
     * run: no limit (the default 300 s stopped their runtime mid-training) */
    io.shutdown_timeout_s = 0;
    if (mpr_init(&io)) {
        fail("mpr_init");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (app_print_placement(&rc.common, NULL)) fail("--verbose");
    int status = 0;
    if (rank == 1) status = rc.parity_path ? run_parity(&rc) : run_trainer(&rc); /* the ps serves the trainer's calls */
    mpr_shutdown(true);
    MPI_Bcast(&status, 1, MPI_INT, 1, MPI_COMM_WORLD);
    MPI_Finalize();
    return status;
}
