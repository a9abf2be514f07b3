/* pipeline_gpipe.c — the pipeline app's driver side (pipeline_gpipe.h):
 * the split, the stages as RemoteModules, the GPipe forward and the dist
 * backward over the mini-batch loss.
 *
 * The GPipe forward: the driver starts every micro-batch at once, each as
 * one async PIPELINE_CHAIN_FN call to the last stage (pipeline_stage.h),
 * inside the mini-batch's dist autograd context. Stage k asks stage k - 1
 * for its input the same way and runs its forward on that reply; stage 0
 * runs on the micro-batch itself. So stage k runs micro-batch i + 1 while
 * stage k + 1 runs micro-batch i, and activations (and, in backward, their
 * gradients) go from stage to stage directly instead of through the
 * driver: the driver only sends the inputs (passed down the stages) and
 * gets the last stage's outputs. It waits for all M replies and
 * concatenates the outputs in micro-batch order; a stage's failure comes
 * back as it is (MPR_ERR_REMOTE, its origin the failing stage's rank, the
 * call chain in its text). In backward each stage's
 * piece computes first and then waits for the stage before it, so a stage
 * never holds up its own compute waiting for another.
 * Invariant: every started call's future is waited for before any is
 * released (an RPC future released while pending could drop its reply),
 * on errors too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmnist_models.h"
#include "pipeline_gpipe.h"
#include "pipeline_stage.h"

/* ------------------------------------------------------------- the split */

mpr_err_t pipeline_split(const char *kind, int S, int *first) {
    int n = app_fmnist_model_stages(kind);
    if (!n) return mpr_error_set(MPR_ERR_INVALID_ARG, "unknown model '%s'", kind ? kind : "(null)");
    if (S < 1 || S > n)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "model %s has %d layer groups to split, so 1 to %d stages, not %d",
                             kind, n, n, S);
    int64_t prefix[16 + 1] = {0};
    for (int i = 0; i < n; i++) prefix[i + 1] = prefix[i] + app_fmnist_stage_macs(kind, i);
    /* best[s][i]: the smallest largest cost of s stages over groups [0, i); cut[s][i]: the last stage's start */
    int64_t best[16 + 1][16 + 1];
    int cut[16 + 1][16 + 1];
    for (int i = 0; i <= n; i++) best[0][i] = i ? INT64_MAX : 0;
    for (int s = 1; s <= S; s++)
        for (int i = 0; i <= n; i++) {
            best[s][i] = INT64_MAX;
            cut[s][i] = 0;
            for (int j = s - 1; j < i; j++) { /* the last stage: [j, i) */
                if (best[s - 1][j] == INT64_MAX) continue;
                int64_t c = prefix[i] - prefix[j], worst = c > best[s - 1][j] ? c : best[s - 1][j];
                if (worst < best[s][i]) best[s][i] = worst, cut[s][i] = j;
            }
        }
    first[S] = n;
    for (int s = S, i = n; s >= 1; s--) i = first[s - 1] = cut[s][i];
    for (int s = 0; s < S; s++)
        if (first[s] >= first[s + 1]) { /* a broken invariant: the search gives every stage a group */
            fprintf(stderr, "pipeline_split: stage %d of %d is empty\n", s, S);
            abort();
        }
    return MPR_OK;
}

/* -------------------------------------------------------------- stages */

pipeline_t *pipeline_create(const char *kind, int S, uint64_t seed) {
    pipeline_t *p = calloc(1, sizeof *p);
    if (!p) {
        mpr_error_set(MPR_ERR_NOMEM, "pipeline: out of memory");
        return NULL;
    }
    p->model = kind;
    p->nstages = S;
    p->first = calloc((size_t)S + 1, sizeof *p->first);
    p->stages = calloc((size_t)S, sizeof *p->stages);
    mpr_err_t e = !p->first || !p->stages ? mpr_error_set(MPR_ERR_NOMEM, "pipeline: out of memory") : MPR_OK;
    if (!e) e = pipeline_split(kind, S, p->first);
    for (int k = 0; !e && k < S; k++) {
        char dev[64];
        snprintf(dev, sizeof dev, "stage%d/cpu", k + 1); /* the worker of stage_dest(k) */
        mpr_value_t *args = mpr_args_pack("slll", kind, (int64_t)p->first[k], (int64_t)(p->first[k + 1] - p->first[k]),
                                          (int64_t)seed);
        if (!args || !(p->stages[k] = mpr_remote_module_create(dev, PIPELINE_STAGE_KIND, args)))
            e = mpr_last_error_code();
        mpr_value_release(args);
    }
    for (int k = 0; !e && k < S; k++) { /* waits for the construction; shows its error */
        mpr_rref_t **ps = NULL;
        int n = 0;
        if ((e = mpr_remote_module_remote_parameters(p->stages[k], &ps, &n))) break;
        mpr_rref_t **all = realloc(p->params, (size_t)(p->nparams + n) * sizeof *all);
        if (!all) {
            for (int i = 0; i < n; i++) mpr_rref_release(ps[i]);
            e = mpr_error_set(MPR_ERR_NOMEM, "pipeline: out of memory");
        } else {
            p->params = all;
            memcpy(all + p->nparams, ps, (size_t)n * sizeof *ps);
            p->nparams += n;
        }
        free(ps);
    }
    if (e) {
        char msg[MPR_ERROR_TEXT_MAX];
        snprintf(msg, sizeof msg, "%s", mpr_last_error());
        pipeline_destroy(p);
        mpr_error_set(e, "%s", msg);
        return NULL;
    }
    return p;
}

void pipeline_destroy(pipeline_t *p) {
    if (!p) return;
    for (int i = 0; i < p->nparams; i++) mpr_rref_release(p->params[i]);
    free(p->params);
    for (int k = 0; p->stages && k < p->nstages; k++) mpr_remote_module_destroy(p->stages[k]);
    free(p->stages);
    free(p->first);
    free(p);
}

/* ------------------------------------------------------- GPipe forward */

mpr_future_t *pipeline_chain_async(pipeline_t *p, mpr_tensor_t *xi) {
    char last[32];
    pipeline_stage_worker(p->nstages - 1, last, sizeof last);
    return mpr_call_async(mpr_to_name(last), PIPELINE_CHAIN_FN, MPR_TIMEOUT_DEFAULT, "tll", xi,
                          (int64_t)p->nstages - 1, (int64_t)p->nstages);
}

mpr_err_t pipeline_forward(pipeline_t *p, mpr_tensor_t *x, int M, mpr_tensor_t **out) {
    *out = NULL;
    int64_t rows = mpr_tensor_shape(x)[0];
    if (M < 1 || rows % M)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "pipeline: %lld rows do not split into %d micro-batches",
                             (long long)rows, M);
    int64_t m = rows / M;
    mpr_future_t **fwd = calloc((size_t)M, sizeof *fwd);
    mpr_tensor_t **outs = calloc((size_t)M, sizeof *outs);
    mpr_err_t e = !fwd || !outs ? mpr_error_set(MPR_ERR_NOMEM, "pipeline: out of memory") : MPR_OK;
    int started = 0;
    for (int i = 0; !e && i < M; i++) {
        mpr_scope_begin();
        mpr_tensor_t *xi = mpr_narrow(x, 0, (int64_t)i * m, m);
        fwd[i] = xi ? pipeline_chain_async(p, xi) : NULL;
        mpr_scope_end();
        if (fwd[i])
            started++;
        else
            e = mpr_last_error_code();
    }
    /* every started call is waited for, even after an error here */
    mpr_err_t ew = started ? mpr_future_wait_all((size_t)started, fwd, MPR_WAIT_FOREVER) : MPR_OK;
    if (!e) e = ew;
    for (int i = 0; !e && i < M; i++) {
        mpr_value_t *v = NULL;
        mpr_tensor_t *y = NULL;
        if (!(e = mpr_future_get(fwd[i], MPR_WAIT_FOREVER, &v)) && !(e = mpr_value_get_tensor(v, &y)))
            outs[i] = mpr_tensor_retain(y);
        mpr_value_release(v); /* keeps the failure: its origin stage and code stay readable */
    }
    if (!e) {
        mpr_scope_begin();
        if (!(*out = mpr_scope_keep(mpr_cat(outs, M, 0)))) e = mpr_last_error_code();
        mpr_scope_end();
    }
    for (int i = 0; outs && i < M; i++) mpr_tensor_release(outs[i]);
    for (int i = 0; fwd && i < started; i++) mpr_future_release(fwd[i]);
    free(fwd);
    free(outs);
    return e;
}

mpr_err_t pipeline_forward_backward(pipeline_t *p, int64_t ctx, mpr_tensor_t *x, mpr_tensor_t *y, int M,
                                    double *loss) {
    int64_t prev = 0;
    mpr_err_t e = mpr_dist_context_set_current(ctx, &prev);
    if (e) return e;
    mpr_tensor_t *out = NULL;
    e = pipeline_forward(p, x, M, &out);
    mpr_scope_begin();
    mpr_tensor_t *l = out ? mpr_cross_entropy(out, y) : NULL;
    if (!e && !l) e = mpr_last_error_code();
    if (!e) e = mpr_item(l, loss);
    if (!e) e = mpr_dist_backward(ctx, &l, 1, false);
    mpr_scope_end();
    mpr_tensor_release(out);
    mpr_dist_context_set_current(prev, NULL);
    return e;
}

/* --------------------------------------------------- profile, gradients */

/* Stage k's worker. */
static mpr_dest_t stage_dest(int k, char *buf, size_t cap) {
    pipeline_stage_worker(k, buf, cap);
    return mpr_to_name(buf);
}

mpr_err_t pipeline_profile(pipeline_t *p, mpr_tensor_t *x, int reps, double *ms) {
    mpr_tensor_t *h = mpr_tensor_retain(x);
    mpr_err_t e = MPR_OK;
    for (int k = 0; !e && k < p->nstages; k++) {
        mpr_value_t *r = NULL;
        mpr_tensor_t *next = NULL;
        char name[32];
        e = mpr_call_sync(stage_dest(k, name, sizeof name), PIPELINE_PROFILE_FN, MPR_TIMEOUT_DEFAULT, &r, "tl", h,
                          (int64_t)reps);
        if (!e) e = mpr_value_unpack(r, "[dT]", &ms[k], &next);
        mpr_value_release(r);
        mpr_tensor_release(h);
        h = next;
    }
    mpr_tensor_release(h);
    return e;
}

mpr_err_t pipeline_gradients(pipeline_t *p, int64_t ctx, mpr_tensor_t ***grads) {
    *grads = calloc((size_t)p->nparams, sizeof **grads);
    if (!*grads) return mpr_error_set(MPR_ERR_NOMEM, "pipeline: out of memory");
    mpr_err_t e = MPR_OK;
    int at = 0;
    for (int k = 0; !e && k < p->nstages; k++) {
        mpr_value_t *r = NULL;
        char name[32];
        e = mpr_call_sync(stage_dest(k, name, sizeof name), PIPELINE_GRADS_FN, MPR_TIMEOUT_DEFAULT, &r, "l", ctx);
        size_t n = e ? 0 : mpr_value_list_len(r);
        if (!e && at + (int)n > p->nparams) e = mpr_error_set(MPR_ERR_STATE, "pipeline: stage %d sent %zu gradients", k + 1, n);
        for (size_t i = 0; !e && i < n; i++) {
            mpr_tensor_t *g;
            if (!(e = mpr_value_get_tensor(mpr_value_list_get(r, i), &g))) (*grads)[at++] = mpr_tensor_retain(g);
        }
        mpr_value_release(r);
    }
    if (!e && at != p->nparams) e = mpr_error_set(MPR_ERR_STATE, "pipeline: %d gradients for %d parameters", at, p->nparams);
    if (e) {
        for (int i = 0; i < at; i++) mpr_tensor_release((*grads)[i]);
        free(*grads);
        *grads = NULL;
    }
    return e;
}
