/* pipeline_1f1b.c — the pipeline app's 1F1B schedule (pipeline_gpipe.h):
 * one dist autograd context per micro-batch, its backward started as soon
 * as its forward is done, at most S micro-batches in flight, and each
 * micro-batch's gradients accumulated into the mini-batch's context, where
 * the one DistributedOptimizer step finds their sum.
 *
 * Why a context per micro-batch: the dist engine keeps a context's saved
 * tensors until the context ends (dist_autograd.h), so under GPipe's one
 * context every stage holds all M micro-batches' activations until the
 * optimizer step. Here micro-batch i's context ends right after its
 * backward, once every stage has added its gradients into the mini-batch's
 * context (PIPELINE_ACCUMULATE_FN, mpr_dist_accumulate_gradient): its
 * activations go then, and a stage holds those of the micro-batches in
 * flight (at most S, plus one whose cleanup message is still on its way).
 *
 * PROTOCOL: S lanes (threads of the driver), each taking the next
 * micro-batch index (in order, under `lock`) until M are taken; a lane's
 * micro-batch i:
 *   BEGIN     mpr_dist_context_begin -> ctx_i (the lane's current context)
 *   FORWARD   x_i through stage 1 .. S, stage to stage (the chain call of
 *             GPipe's micro-batches, pipeline_chain_async; the lane waits
 *             for its future: no core), out_i on the driver
 *   BACKWARD  loss_i = cross_entropy(out_i, y_i) * m / B;
 *             mpr_dist_backward(ctx_i, loss_i) (every stage's part done
 *             when it returns)
 *   ACCUMULATE with the mini-batch's context current: PIPELINE_ACCUMULATE_FN
 *             [ctx_i] on every stage at once, all waited for
 *   END       mpr_dist_context_end(ctx_i) (also after a failure above)
 * Stage 1 so sees F F .. (S of them) then one forward per finished
 * backward: one forward, one backward. A lane's failure is kept (the first
 * one) and stops every lane from taking another micro-batch.
 * Invariants: a lane runs one micro-batch at a time, so at most S contexts
 * of micro-batches are alive; every context a lane begins it ends; `next`,
 * `err`, `msg` and `loss` are touched only under `lock`. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline_gpipe.h"
#include "pipeline_stage.h"

typedef struct lanes {
    pipeline_t *p;
    int64_t ctx; /* the mini-batch's */
    mpr_tensor_t *x, *y;
    int M;
    int64_t m, B;
    pthread_mutex_t lock;
    int next;       /* the next micro-batch to take */
    mpr_err_t err;  /* the first failure */
    char msg[MPR_ERROR_TEXT_MAX];
    double loss;    /* the sum of the micro-batches' losses */
} lanes_t;

/* PIPELINE_ACCUMULATE_FN [from] on every stage, inside context `into`. */
static mpr_err_t accumulate(pipeline_t *p, int64_t from, int64_t into) {
    mpr_future_t *fs[64];
    if (p->nstages > 64) return mpr_error_set(MPR_ERR_INVALID_ARG, "pipeline: %d stages (64 at most)", p->nstages);
    int64_t prev = 0;
    mpr_err_t e = mpr_dist_context_set_current(into, &prev);
    if (e) return e;
    int n = 0;
    for (int k = 0; !e && k < p->nstages; k++) {
        char name[32];
        snprintf(name, sizeof name, "stage%d", k + 1);
        if ((fs[n] = mpr_call_async(mpr_to_name(name), PIPELINE_ACCUMULATE_FN, MPR_TIMEOUT_DEFAULT, "l", from)))
            n++;
        else
            e = mpr_last_error_code();
    }
    mpr_err_t ew = n ? mpr_future_wait_all((size_t)n, fs, MPR_WAIT_FOREVER) : MPR_OK;
    if (!e) e = ew;
    for (int i = 0; !e && i < n; i++)
        if ((e = mpr_future_error(fs[i]))) mpr_error_set(e, "%s", mpr_future_error_message(fs[i]));
    for (int i = 0; i < n; i++) mpr_future_release(fs[i]);
    mpr_dist_context_set_current(prev, NULL);
    return e;
}

/* Micro-batch i on the calling lane: BEGIN .. END; its loss in *li. */
static mpr_err_t micro_batch(lanes_t *L, int i, double *li) {
    int64_t ctx = 0;
    mpr_err_t e = mpr_dist_context_begin(&ctx);
    if (e) return e;
    mpr_scope_begin();
    mpr_tensor_t *h = mpr_narrow(L->x, 0, (int64_t)i * L->m, L->m), *yi = mpr_narrow(L->y, 0, (int64_t)i * L->m, L->m);
    if (!h || !yi) e = mpr_last_error_code();
    if (!e) { /* stage to stage, as GPipe's micro-batches go; the lane waits (no core) */
        mpr_future_t *f = pipeline_chain_async(L->p, h);
        mpr_value_t *v = NULL;
        mpr_tensor_t *out = NULL;
        if (!f || (e = mpr_future_get(f, MPR_WAIT_FOREVER, &v)) || (e = mpr_value_get_tensor(v, &out))) {
            if (!e) e = mpr_last_error_code();
            char msg[MPR_ERROR_TEXT_MAX];
            snprintf(msg, sizeof msg, "%s", mpr_last_error());
            mpr_error_set(e, "pipeline: micro-batch %d: %s", i, msg);
        }
        h = out ? mpr_scope_adopt(mpr_tensor_retain(out)) : NULL; /* the scope frees it (and x_i) */
        mpr_value_release(v);
        mpr_future_release(f);
    }
    mpr_tensor_t *l = e ? NULL : mpr_mul_scalar(mpr_cross_entropy(h, yi), (double)L->m / (double)L->B);
    if (!e && !l) e = mpr_last_error_code();
    if (!e) e = mpr_item(l, li);
    if (!e) e = mpr_dist_backward(ctx, &l, 1, false);
    mpr_scope_end();
    if (!e) e = accumulate(L->p, ctx, L->ctx);
    mpr_err_t e2 = mpr_dist_context_end(ctx); /* its activations go (on the stages: when the cleanup arrives) */
    return e ? e : e2;
}

static void *lane(void *arg) {
    lanes_t *L = arg;
    for (;;) {
        pthread_mutex_lock(&L->lock);
        int i = L->err ? L->M : L->next++;
        pthread_mutex_unlock(&L->lock);
        if (i >= L->M) break;
        double li = 0;
        mpr_err_t e = micro_batch(L, i, &li);
        pthread_mutex_lock(&L->lock);
        if (e && !L->err) {
            L->err = e;
            snprintf(L->msg, sizeof L->msg, "%s", mpr_last_error());
        }
        L->loss += li;
        pthread_mutex_unlock(&L->lock);
    }
    return NULL;
}

mpr_err_t pipeline_forward_backward_1f1b(pipeline_t *p, int64_t ctx, mpr_tensor_t *x, mpr_tensor_t *y, int M,
                                         double *loss) {
    int64_t rows = mpr_tensor_shape(x)[0];
    if (M < 1 || rows % M)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "pipeline: %lld rows do not split into %d micro-batches",
                             (long long)rows, M);
    if (!mpr_dist_context_exists(ctx)) return mpr_error_set(MPR_ERR_NOT_FOUND, "pipeline: context %lld", (long long)ctx);
    lanes_t L = {.p = p, .ctx = ctx, .x = x, .y = y, .M = M, .m = rows / M, .B = rows};
    pthread_mutex_init(&L.lock, NULL);
    int S = p->nstages < M ? p->nstages : M, started = 0;
    pthread_t t[64];
    for (; started < S && started < 64; started++)
        if (pthread_create(&t[started], NULL, lane, &L)) break;
    if (!started) {
        pthread_mutex_destroy(&L.lock);
        return mpr_error_set(MPR_ERR_NOMEM, "pipeline: no thread for a 1F1B lane");
    }
    for (int i = 0; i < started; i++) pthread_join(t[i], NULL); /* fewer lanes than S: fewer in flight, still right */
    pthread_mutex_destroy(&L.lock);
    if (L.err) return mpr_error_set(L.err, "%s", L.msg);
    *loss = L.loss;
    return MPR_OK;
}

const char *pipeline_schedule_name(pipeline_schedule_t s) { return s == PIPELINE_1F1B ? "1f1b" : "gpipe"; }

mpr_err_t pipeline_step(pipeline_t *p, pipeline_schedule_t s, int64_t ctx, mpr_tensor_t *x, mpr_tensor_t *y, int M,
                        double *loss) {
    return s == PIPELINE_1F1B ? pipeline_forward_backward_1f1b(p, ctx, x, y, M, loss)
                              : pipeline_forward_backward(p, ctx, x, y, M, loss);
}

mpr_err_t pipeline_memory(pipeline_t *p, int64_t *peak, int64_t *now) {
    mpr_err_t e = MPR_OK;
    for (int k = 0; !e && k < p->nstages; k++) {
        char name[32];
        snprintf(name, sizeof name, "stage%d", k + 1);
        mpr_value_t *r = NULL;
        e = mpr_rpc_sync(mpr_to_name(name), PIPELINE_MEMORY_FN, NULL, MPR_TIMEOUT_DEFAULT, &r);
        int64_t n = 0;
        if (!e) e = mpr_value_unpack(r, "[ll]", &peak[k], &n);
        if (!e && now) now[k] = n;
        mpr_value_release(r);
    }
    return e;
}
