/* scope.c — thread-local scopes that own op results, and the thread-local
 * grad mode.
 *
 * Invariants: scopes[0..depth-1] are open; scope k owns one reference for each
 * entry of its array and releases them (last registered first) in
 * mpr_scope_end. Arrays are kept and reused after a scope closes, so a loop
 * that opens and closes a scope per step allocates nothing in steady state;
 * they are freed at thread exit (pthread key destructor). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "mpri_args.h"
#include "mpri_autograd.h"

typedef struct scope {
    mpr_tensor_t **items;
    int64_t n, cap;
} scope_t;

typedef struct scope_stack {
    scope_t *scopes;
    int depth, cap;
} scope_stack_t;

static _Thread_local scope_stack_t *tls_stack;
static _Thread_local bool tls_grad_disabled;
static pthread_key_t stack_key;
static pthread_once_t stack_once = PTHREAD_ONCE_INIT;

static void stack_free(void *p) {
    scope_stack_t *st = p;
    if (!st) return;
    for (int i = st->depth - 1; i >= 0; i--)
        for (int64_t j = st->scopes[i].n - 1; j >= 0; j--) mpri_tensor_scope_release(st->scopes[i].items[j]);
    for (int i = 0; i < st->cap; i++) free(st->scopes[i].items);
    free(st->scopes);
    free(st);
}

static void make_key(void) { pthread_key_create(&stack_key, stack_free); }

static scope_stack_t *get_stack(void) {
    if (tls_stack) return tls_stack;
    pthread_once(&stack_once, make_key);
    tls_stack = calloc(1, sizeof *tls_stack);
    if (tls_stack) pthread_setspecific(stack_key, tls_stack);
    return tls_stack;
}

void mpr_scope_begin(void) {
    /* mpr_scope_begin cannot report failure (it returns nothing, so loops stay
     * short); running out of memory for a few bytes of bookkeeping is fatal. */
    scope_stack_t *st = get_stack();
    if (!st) {
        fprintf(stderr, "%s:%d: mpr_scope_begin: out of memory for the scope stack\n", __FILE__, __LINE__);
        abort();
    }
    if (st->depth == st->cap) {
        int ncap = st->cap ? st->cap * 2 : 8;
        scope_t *ns = realloc(st->scopes, (size_t)ncap * sizeof *ns);
        if (!ns) {
            fprintf(stderr, "%s:%d: mpr_scope_begin: out of memory for %d scopes\n", __FILE__, __LINE__, ncap);
            abort();
        }
        for (int i = st->cap; i < ncap; i++) ns[i] = (scope_t){0};
        st->scopes = ns;
        st->cap = ncap;
    }
    st->scopes[st->depth++].n = 0;
}

void mpr_scope_end(void) {
    scope_stack_t *st = tls_stack;
    if (!st || st->depth == 0) return;
    scope_t *s = &st->scopes[st->depth - 1];
    /* Release while the scope is still open would let a release hook register
     * into it; hooks never create results, so closing first is fine. */
    st->depth--;
    for (int64_t j = s->n - 1; j >= 0; j--) mpri_tensor_scope_release(s->items[j]);
    s->n = 0;
}

int mpr_scope_depth(void) { return tls_stack ? tls_stack->depth : 0; }

static bool scope_push(scope_t *s, mpr_tensor_t *t) {
    if (s->n == s->cap) {
        int64_t ncap = s->cap ? s->cap * 2 : 64;
        mpr_tensor_t **ni = realloc(s->items, (size_t)ncap * sizeof *ni);
        if (!ni) return false;
        s->items = ni;
        s->cap = ncap;
    }
    s->items[s->n++] = t;
    mpri_tensor_scope_acquire(t);
    return true;
}

mpr_tensor_t *mpri_result(mpr_tensor_t *t) {
    if (!t) return NULL;
    scope_stack_t *st = tls_stack;
    if (!st || st->depth == 0) return t;
    if (!scope_push(&st->scopes[st->depth - 1], t)) {
        mpr_tensor_release(t);
        mpr_error_set(MPR_ERR_NOMEM, "scope: out of memory registering a result");
        return NULL;
    }
    return t;
}

mpr_tensor_t *mpr_scope_keep(mpr_tensor_t *t) {
    MPRI_OP_INPUT(t);
    return mpr_tensor_retain(t);
}

mpr_tensor_t *mpr_scope_escape(mpr_tensor_t *t) {
    MPRI_OP_INPUT(t);
    if (!t) return NULL;
    mpr_tensor_retain(t);
    scope_stack_t *st = tls_stack;
    if (st && st->depth >= 2) {
        if (!scope_push(&st->scopes[st->depth - 2], t)) {
            mpr_tensor_release(t);
            mpr_error_set(MPR_ERR_NOMEM, "scope_escape: out of memory");
            return NULL;
        }
    }
    return t;
}

mpr_tensor_t *mpr_scope_adopt(mpr_tensor_t *t) {
    MPRI_OP_INPUT(t);
    return mpri_result(t);
}

bool mpr_grad_enabled(void) { return !tls_grad_disabled; }

bool mpr_set_grad_enabled(bool enabled) {
    bool prev = !tls_grad_disabled;
    tls_grad_disabled = !enabled;
    return prev;
}
