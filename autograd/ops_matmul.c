/* ops_matmul.c — matmul (2-D, batched with broadcast batch dims, 1-D
 * operands as torch.matmul) and linear (x W^T + b), forward and backward on
 * the backend's gemm.
 *
 * Invariants: every product goes through the backend's gemm or gemm_small
 * (on the CPU cblas, or kernels/cpu_small_gemm.c for tiny products; never a
 * loop here); an operand whose last two dims have unit stride in either
 * direction is handed to BLAS as is (NoTrans or Trans), so transposed views
 * cost no copy; other layouts are copied to contiguous first, except the
 * broadcast gradient of a tiny 2-D product's backward, which gemm_small
 * reads in place. linear's backward computes
 * only the gradients whose inputs need them (1 gemm for the first layer of
 * an MLP, 2 for the others). */
#include <string.h>

#include "mpri_args.h"
#include "mpri_autograd.h"
#include "kernels/mpri_kernels.h"

/* A [rows, cols] matrix at `data` with strides (s0, s1) as a BLAS operand. */
typedef struct gemm_operand {
    bool trans;
    int64_t ld;
} gemm_operand_t;

static bool as_operand(int64_t rows, int64_t cols, int64_t s0, int64_t s1, gemm_operand_t *op) {
    if ((s1 == 1 || cols <= 1) && s0 >= (cols > 1 ? cols : 1)) {
        op->trans = false;
        op->ld = s0;
        return true;
    }
    if ((s0 == 1 || rows <= 1) && s1 >= (rows > 1 ? rows : 1)) {
        op->trans = true;
        op->ld = s1;
        return true;
    }
    return false;
}

static bool tensor_operand(const mpr_tensor_t *t, gemm_operand_t *op) {
    int n = t->ndim;
    return as_operand(t->shape[n - 2], t->shape[n - 1], t->strides[n - 2], t->strides[n - 1], op);
}

/* ----------------------------------------------------------------- matmul */

/* The backward of a 2-D product a [n, k] @ b [k, m] with g [n, m] (a BLAS
 * operand): ga = g b^T and gb = a^T g, each one gemm into a new tensor with
 * the transpositions as BLAS flags (no transposed views, no batch logic: a
 * small product's backward was mostly that bookkeeping). Results are
 * registered in the engine's scope. False: not this case (the general path
 * runs); errors are returned through *e. */
static bool matmul_backward_2d(mpri_node_t *n, mpr_tensor_t *a, mpr_tensor_t *b, mpr_tensor_t *g,
                               const gemm_operand_t *og, mpr_tensor_t **gin, mpr_err_t *e) {
    gemm_operand_t oa, ob;
    if (a->ndim != 2 || b->ndim != 2 || g->ndim != 2 || !tensor_operand(a, &oa) || !tensor_operand(b, &ob))
        return false;
    int64_t rows = a->shape[0], inner = a->shape[1], cols = b->shape[1];
    if (rows <= 0 || inner <= 0 || cols <= 0 || b->shape[0] != inner || g->shape[0] != rows || g->shape[1] != cols)
        return false;
    const mpri_backend_t *B = mpri_backend_of("matmul backward", 3, (mpr_tensor_t *[]){a, b, g});
    if (!B) {
        *e = mpr_last_error_code();
        return true;
    }
    int dev = a->storage->device;
    *e = MPR_OK;
    if (mpri_node_needs_grad(n, 0)) { /* ga [rows, inner] = g [rows, cols] @ b^T */
        mpr_tensor_t *ga = mpri_result(mpri_empty_on(dev, a->dtype, 2, a->shape));
        if (!ga) *e = mpr_last_error_code();
        else
            *e = MPRI_BK(B, gemm, dev, a->dtype, og->trans, !ob.trans, rows, inner, cols, 1.0, mpr_tensor_data(g),
                         og->ld, mpr_tensor_data(b), ob.ld, 0.0, mpr_tensor_data(ga), inner);
        gin[0] = *e ? NULL : ga;
    }
    if (!*e && mpri_node_needs_grad(n, 1)) { /* gb [inner, cols] = a^T @ g */
        mpr_tensor_t *gb = mpri_result(mpri_empty_on(dev, b->dtype, 2, b->shape));
        if (!gb) *e = mpr_last_error_code();
        else
            *e = MPRI_BK(B, gemm, dev, a->dtype, !oa.trans, og->trans, inner, cols, rows, 1.0, mpr_tensor_data(a),
                         oa.ld, mpr_tensor_data(g), og->ld, 0.0, mpr_tensor_data(gb), cols);
        gin[1] = *e ? NULL : gb;
    }
    return true;
}

/* A new [M, N] tensor (in the engine's scope) = X [M, K] @ Y [K, N], X and Y
 * given by their data and (row, column) element strides, on the backend's
 * small kernel; the caller checked mpri_k_gemm_small_fits. NULL: no memory. */
static mpr_tensor_t *small_product(const mpri_backend_t *B, int dev, mpr_dtype_t dt, const int64_t shape[2],
                                   int64_t K, const void *x, int64_t x_rs, int64_t x_cs, const void *y, int64_t y_rs,
                                   int64_t y_cs) {
    mpr_tensor_t *out = mpri_result(mpri_empty_on(dev, dt, 2, shape));
    if (!out) return NULL;
    bool taken = B->gemm_small(dev, dt, shape[0], shape[1], K, 1.0, x, x_rs, x_cs, y, y_rs, y_cs, 0.0,
                               mpr_tensor_data(out), shape[1]);
    MPRI_ASSERT(taken, "the backend's gemm_small takes every product mpri_k_gemm_small_fits accepts");
    return out;
}

/* The same when g is no BLAS operand (a broadcast gradient, from sum or
 * mean) and both products are tiny: the backend's small kernel reads a, b
 * and g in place with their strides, so g is not copied. False: not this
 * case (nothing was computed); errors are returned through *e. */
static bool matmul_backward_small(mpri_node_t *n, mpr_tensor_t *a, mpr_tensor_t *b, mpr_tensor_t *g,
                                  mpr_tensor_t **gin, mpr_err_t *e) {
    if (a->ndim != 2 || b->ndim != 2 || g->ndim != 2 || b->dtype != a->dtype || g->dtype != a->dtype) return false;
    int64_t rows = a->shape[0], inner = a->shape[1], cols = b->shape[1];
    if (b->shape[0] != inner || g->shape[0] != rows || g->shape[1] != cols) return false;
    bool need_a = mpri_node_needs_grad(n, 0), need_b = mpri_node_needs_grad(n, 1);
    mpr_dtype_t dt = a->dtype;
    if ((need_a && !mpri_k_gemm_small_fits(dt, rows, inner, cols)) ||
        (need_b && !mpri_k_gemm_small_fits(dt, inner, cols, rows)))
        return false;
    const mpri_backend_t *B = mpri_backend_of("matmul backward", 3, (mpr_tensor_t *[]){a, b, g});
    if (!B) {
        *e = mpr_last_error_code();
        return true;
    }
    if (!B->gemm_small) return false;
    int dev = a->storage->device;
    const int64_t *gs = g->strides;
    *e = MPR_OK;
    if (need_a && !(gin[0] = small_product(B, dev, dt, a->shape, cols, mpr_tensor_data(g), gs[0], gs[1],
                                           mpr_tensor_data(b), b->strides[1], b->strides[0]))) /* g @ b^T */
        *e = mpr_last_error_code();
    if (!*e && need_b && !(gin[1] = small_product(B, dev, dt, b->shape, rows, mpr_tensor_data(a), a->strides[1],
                                                  a->strides[0], mpr_tensor_data(g), gs[0], gs[1]))) /* a^T @ g */
        *e = mpr_last_error_code();
    return true;
}

static mpr_err_t matmul_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    mpr_tensor_t *a = mpri_node_saved(n, 0), *b = mpri_node_saved(n, 1);
    if (!a || !b) return mpr_last_error_code();
    /* A gradient BLAS cannot take as it is (a broadcast one, from sum or
     * mean) is read in place by a tiny product's kernel, or else made
     * contiguous once here, not by each of the two products. */
    gemm_operand_t og;
    mpr_err_t e0 = MPR_OK;
    if (!tensor_operand(gout[0], &og) && matmul_backward_small(n, a, b, gout[0], gin, &e0)) return e0;
    mpr_tensor_t *g = tensor_operand(gout[0], &og) ? mpr_tensor_retain(gout[0]) : mpri_contiguous_raw(gout[0]);
    if (!g) return mpr_last_error_code();
    mpr_err_t e = MPR_OK;
    tensor_operand(g, &og);
    if (matmul_backward_2d(n, a, b, g, &og, gin, &e)) {
        mpr_tensor_release(g);
        return e;
    }
    if (mpri_node_needs_grad(n, 0) && !(gin[0] = mpri_sum_to(mpr_matmul(g, mpr_transpose(b, -1, -2)), a)))
        e = mpr_last_error_code();
    if (!e && mpri_node_needs_grad(n, 1) && !(gin[1] = mpri_sum_to(mpr_matmul(mpr_transpose(a, -1, -2), g), b)))
        e = mpr_last_error_code();
    mpr_tensor_release(g);
    return e;
}
static const mpri_op_def_t matmul_def = {.name = "matmul", .backward = matmul_backward};

/* a [..., n, k] @ b [..., k, m], both ndim >= 2. */
static mpr_tensor_t *matmul_core(mpr_tensor_t *a, mpr_tensor_t *b) {
    int64_t n = a->shape[a->ndim - 2], k = a->shape[a->ndim - 1];
    int64_t kb = b->shape[b->ndim - 2], m = b->shape[b->ndim - 1];
    if (k != kb) {
        mpri_err_shape2("matmul", "inner dimensions differ:", a, b);
        return NULL;
    }
    int nbatch;
    int64_t bshape[MPR_MAX_DIMS];
    if (mpri_broadcast_shape("matmul (batch dims)", a->ndim - 2, a->shape, b->ndim - 2, b->shape, &nbatch,
                             bshape) != MPR_OK) {
        /* name both full shapes, not only their batch parts */
        mpri_err_shape2("matmul", "batch dims cannot be broadcast:", a, b);
        return NULL;
    }
    if (nbatch + 2 > MPR_MAX_DIMS) {
        mpr_error_set(MPR_ERR_SHAPE, "matmul: result would have more than %d dims", MPR_MAX_DIMS);
        return NULL;
    }
    int64_t oshape[MPR_MAX_DIMS];
    memcpy(oshape, bshape, sizeof(int64_t) * (size_t)nbatch);
    oshape[nbatch] = n;
    oshape[nbatch + 1] = m;
    mpr_tensor_t *ac = NULL, *bc = NULL, *out = NULL;
    gemm_operand_t oa = {0}, ob = {0};
    /* Operands BLAS cannot take as they are become contiguous copies. */
    const mpri_backend_t *B = mpri_backend_of("matmul", 2, (mpr_tensor_t *[]){a, b});
    if (!B) return NULL;
    ac = tensor_operand(a, &oa) ? mpr_tensor_retain(a) : mpri_contiguous_raw(a);
    bc = tensor_operand(b, &ob) ? mpr_tensor_retain(b) : mpri_contiguous_raw(b);
    if (!ac || !bc) goto fail;
    tensor_operand(ac, &oa);
    tensor_operand(bc, &ob);
    out = mpri_empty_on(a->storage->device, a->dtype, nbatch + 2, oshape);
    if (!out) goto fail;
    size_t esz = mpr_dtype_size(a->dtype);
    int dev = a->storage->device;
    int64_t nb = 1;
    for (int i = 0; i < nbatch; i++) nb *= bshape[i];
    /* One gemm when b is a single matrix and a's batch collapses into rows. */
    if (b->ndim == 2 && !oa.trans && nbatch > 0) {
        bool rows_ok = true;
        int64_t expect = ac->strides[ac->ndim - 2] * n;
        for (int i = ac->ndim - 3; i >= 0 && rows_ok; i--) {
            if (ac->shape[i] != 1 && ac->strides[i] != expect) rows_ok = false;
            expect *= ac->shape[i];
        }
        if (rows_ok && ac->ndim - 2 == nbatch) {
            if (MPRI_BK(B, gemm, dev, a->dtype, false, ob.trans, nb * n, m, k, 1.0, mpr_tensor_data(ac), oa.ld,
                        mpr_tensor_data(bc), ob.ld, 0.0, mpr_tensor_data(out), m) != MPR_OK)
                goto fail;
            goto done;
        }
    }
    {
        int64_t sa[MPR_MAX_DIMS], sb[MPR_MAX_DIMS], idx[MPR_MAX_DIMS] = {0};
        for (int i = 0; i < nbatch; i++) {
            int ia = i - (nbatch - (ac->ndim - 2)), ib = i - (nbatch - (bc->ndim - 2));
            sa[i] = (ia < 0 || ac->shape[ia] == 1) ? 0 : ac->strides[ia];
            sb[i] = (ib < 0 || bc->shape[ib] == 1) ? 0 : bc->strides[ib];
        }
        const char *pa = mpr_tensor_data(ac), *pb = mpr_tensor_data(bc);
        char *pc = mpr_tensor_data(out);
        for (int64_t t = 0; t < nb; t++) {
            int64_t offa = 0, offb = 0;
            for (int i = 0; i < nbatch; i++) {
                offa += idx[i] * sa[i];
                offb += idx[i] * sb[i];
            }
            if (MPRI_BK(B, gemm, dev, a->dtype, oa.trans, ob.trans, n, m, k, 1.0, pa + offa * (int64_t)esz, oa.ld,
                        pb + offb * (int64_t)esz, ob.ld, 0.0, pc + t * n * m * (int64_t)esz, m) != MPR_OK)
                goto fail;
            for (int i = nbatch - 1; i >= 0; i--) {
                if (++idx[i] < bshape[i]) break;
                idx[i] = 0;
            }
        }
    }
done:
    mpr_tensor_release(ac);
    mpr_tensor_release(bc);
    {
        mpri_node_t *node = mpri_record(&matmul_def, 2, (mpr_tensor_t *[]){a, b}, out);
        if (node) {
            mpri_node_save(node, a);
            mpri_node_save(node, b);
        }
    }
    return mpri_result(out);
fail:
    mpr_tensor_release(ac);
    mpr_tensor_release(bc);
    mpr_tensor_release(out);
    return NULL;
}

mpr_tensor_t *mpr_matmul(mpr_tensor_t *a, mpr_tensor_t *b) {
    MPRI_OP_INPUT(a);
    MPRI_OP_INPUT(b);
    if (!a || !b) return NULL;
    if (mpri_check_float("matmul", a) || mpri_check_float("matmul", b) || mpri_check_same_dtype("matmul", a, b))
        return NULL;
    if (a->ndim == 0 || b->ndim == 0) {
        mpri_err_shape2("matmul", "0-d operands are not allowed:", a, b);
        return NULL;
    }
    if (a->ndim >= 2 && b->ndim >= 2) return matmul_core(a, b);
    /* 1-D operands: promote, multiply, drop the added dim (all recorded ops). */
    if ((a->ndim == 1 ? a->shape[0] : a->shape[a->ndim - 1]) != (b->ndim == 1 ? b->shape[0] : b->shape[b->ndim - 2])) {
        mpri_err_shape2("matmul", "inner dimensions differ:", a, b);
        return NULL;
    }
    mpr_scope_begin();
    mpr_tensor_t *aa = a->ndim == 1 ? mpr_unsqueeze(a, 0) : a;
    mpr_tensor_t *bb = b->ndim == 1 ? mpr_unsqueeze(b, -1) : b;
    mpr_tensor_t *r = matmul_core(aa, bb);
    if (r && b->ndim == 1) r = mpr_squeeze(r, -1);
    if (r && a->ndim == 1) r = mpr_squeeze(r, r->ndim > 1 ? -2 : -1);
    r = mpr_scope_keep(r);
    mpr_scope_end();
    return mpri_result(r);
}

/* ----------------------------------------------------------------- linear */
/* saved: 0 = x as contiguous [N, in], 1 = w [out, in]. */

static mpr_err_t linear_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    mpr_tensor_t *x = mpri_node_saved(n, 0), *w = mpri_node_saved(n, 1);
    if (!x || !w) return mpr_last_error_code();
    const mpri_backend_t *B = mpri_backend_of("linear", 1, gout);
    mpr_tensor_t *g = B ? mpri_result(mpri_contiguous_raw(gout[0])) : NULL;
    if (!g) return mpr_last_error_code();
    mpr_dtype_t dt = x->dtype;
    int dev = x->storage->device;
    int64_t N = x->shape[0], in = x->shape[1], out = w->shape[0];
    gemm_operand_t ow = {0};
    tensor_operand(w, &ow); /* checked at forward */
    if (mpri_node_needs_grad(n, 0)) {
        /* gx [N, in] = g [N, out] @ w [out, in] */
        mpr_tensor_t *gx = mpri_result(mpri_empty_on(dev, dt, n->in_meta[0].ndim, n->in_meta[0].shape));
        if (!gx) return mpr_last_error_code();
        mpr_err_t rc = MPRI_BK(B, gemm, dev, dt, false, ow.trans, N, in, out, 1.0, mpr_tensor_data(g), out,
                               mpr_tensor_data(w), ow.ld, 0.0, mpr_tensor_data(gx), in);
        if (rc != MPR_OK) return rc;
        gin[0] = gx;
    }
    if (mpri_node_needs_grad(n, 1)) {
        /* gw [out, in] = g^T [out, N] @ x [N, in] */
        mpr_tensor_t *gw = mpri_result(mpri_empty_on(dev, dt, 2, w->shape));
        if (!gw) return mpr_last_error_code();
        mpr_err_t rc = MPRI_BK(B, gemm, dev, dt, true, false, out, in, N, 1.0, mpr_tensor_data(g), out,
                               mpr_tensor_data(x), in, 0.0, mpr_tensor_data(gw), in);
        if (rc != MPR_OK) return rc;
        gin[1] = gw;
    }
    if (mpri_node_needs_grad(n, 2)) {
        /* gb [out] = sum over rows of g */
        mpr_tensor_t *gb = mpri_full_on(dev, dt, 1, &out, 0.0);
        if (!gb) return mpr_last_error_code();
        int64_t so[2] = {0, 1}, sh[2] = {N, out}, si[2] = {out, 1};
        mpr_err_t rc = MPRI_BK(B, sum_into, dev, dt, 2, sh, mpr_tensor_data(gb), so, mpr_tensor_data(g), si);
        if (rc != MPR_OK) return rc;
        gin[2] = gb;
    }
    return MPR_OK;
}
static const mpri_op_def_t linear_def = {.name = "linear", .backward = linear_backward};

mpr_tensor_t *mpr_linear(mpr_tensor_t *x, mpr_tensor_t *w, mpr_tensor_t *b) {
    MPRI_OP_INPUT(x);
    MPRI_OP_INPUT(w);
    if (!x || !w) return NULL;
    char s1[96], s2[96], s3[96];
    if (mpri_check_float("linear", x) || mpri_check_same_dtype("linear", x, w) ||
        (b && mpri_check_same_dtype("linear", x, b)))
        return NULL;
    if (x->ndim < 1 || w->ndim != 2 || x->shape[x->ndim - 1] != w->shape[1] ||
        (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))) {
        mpr_error_set(MPR_ERR_SHAPE, "linear: x %s, weight %s, bias %s do not fit (want x [*, in], weight [out, in], bias [out])",
                      mpr_shape_str(x->ndim, x->shape, s1, sizeof s1), mpr_shape_str(w->ndim, w->shape, s2, sizeof s2),
                      b ? mpr_shape_str(b->ndim, b->shape, s3, sizeof s3) : "none");
        return NULL;
    }
    mpr_dtype_t dt = x->dtype;
    int64_t in = w->shape[1], out = w->shape[0];
    int64_t N = in ? mpr_tensor_numel(x) / in : 0;
    if (in == 0) {
        N = 1;
        for (int i = 0; i < x->ndim - 1; i++) N *= x->shape[i];
    }
    const mpri_backend_t *B = mpri_backend_of("linear", 3, (mpr_tensor_t *[]){x, w, b});
    if (!B) return NULL;
    mpr_tensor_t *xc = mpri_contiguous_raw(x);
    gemm_operand_t ow = {0};
    mpr_tensor_t *wc = tensor_operand(w, &ow) ? mpr_tensor_retain(w) : mpri_contiguous_raw(w);
    int64_t osh[MPR_MAX_DIMS];
    memcpy(osh, x->shape, sizeof osh);
    osh[x->ndim - 1] = out;
    mpr_tensor_t *y = (xc && wc) ? mpri_empty_on(x->storage->device, dt, x->ndim, osh) : NULL;
    mpr_tensor_t *x2 = y ? mpri_tensor_view(xc->storage, dt, 2, (int64_t[]){N, in}, NULL, xc->offset) : NULL;
    if (!x2) {
        mpr_tensor_release(xc);
        mpr_tensor_release(wc);
        mpr_tensor_release(y);
        return NULL;
    }
    tensor_operand(wc, &ow);
    int dev = x->storage->device;
    double beta = 0.0;
    mpr_err_t rc = MPR_OK;
    if (b) {
        int64_t sh[2] = {N, out}, sd[2] = {out, 1}, sb[2] = {0, b->strides[0]};
        rc = MPRI_BK(B, copy, dev, 2, sh, dt, mpr_tensor_data(y), sd, dt, mpr_tensor_data(b), sb);
        beta = 1.0;
    }
    /* y [N, out] = x [N, in] @ w^T [in, out] (+ y) */
    if (rc == MPR_OK)
        rc = MPRI_BK(B, gemm, dev, dt, false, !ow.trans, N, out, in, 1.0, mpr_tensor_data(x2), in,
                     mpr_tensor_data(wc), ow.ld, beta, mpr_tensor_data(y), out);
    if (rc != MPR_OK) {
        mpr_tensor_release(x2);
        mpr_tensor_release(xc);
        mpr_tensor_release(wc);
        mpr_tensor_release(y);
        return NULL;
    }
    mpri_node_t *n = mpri_record(&linear_def, 3, (mpr_tensor_t *[]){x, w, b}, y);
    if (n) {
        mpri_node_save(n, x2);
        mpri_node_save(n, wc);
    }
    mpr_tensor_release(x2);
    mpr_tensor_release(xc);
    mpr_tensor_release(wc);
    return mpri_result(y);
}
