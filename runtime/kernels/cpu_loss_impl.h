/* cpu_loss_impl.h — typed body of the loss kernels (nll, cross entropy, mse),
 * included by cpu_loss.c once per dtype (cpu_dtypes.h) with KT, KN(name), KEXP, KLOG defined. */

double KN(mpri_nll_loss_fwd)(const KT *logp, const int64_t *target, int64_t N, int64_t C,
                             int64_t ignore_index, int64_t *count) {
    double s = 0;
    int64_t cnt = 0;
    for (int64_t r = 0; r < N; r++) {
        if (target[r] == ignore_index) continue;
        s -= (double)logp[r * C + target[r]];
        cnt++;
    }
    *count = cnt;
    return cnt ? s / (double)cnt : 0.0;
}

void KN(mpri_nll_loss_bwd)(const int64_t *target, int64_t N, int64_t C, int64_t ignore_index,
                           int64_t count, double g, KT *glogp) {
    memset(glogp, 0, (size_t)(N * C) * sizeof(KT));
    if (count == 0) return;
    KT v = (KT)(-g / (double)count);
    for (int64_t r = 0; r < N; r++)
        if (target[r] != ignore_index) glogp[r * C + target[r]] = v;
}

double KN(mpri_cross_entropy_fwd)(const KT *x, const int64_t *target, int64_t N, int64_t C,
                                  int64_t ignore_index, KT *lse, int64_t *count) {
    double s = 0;
    int64_t cnt = 0;
    for (int64_t r = 0; r < N; r++) {
        const KT *xr = x + r * C;
        KT m = -INFINITY;
        for (int64_t j = 0; j < C; j++)
            if (xr[j] > m) m = xr[j];
        if (m == -INFINITY) m = 0;
        KT e = 0;
        for (int64_t j = 0; j < C; j++) e += KEXP(xr[j] - m);
        lse[r] = KLOG(e); /* log-sum-exp minus the row max (kept apart for precision) */
        if (target[r] == ignore_index) continue;
        s += (double)lse[r] - (double)(xr[target[r]] - m);
        cnt++;
    }
    *count = cnt;
    return cnt ? s / (double)cnt : 0.0;
}

void KN(mpri_cross_entropy_bwd)(const KT *x, const int64_t *target, const KT *lse, int64_t N,
                                int64_t C, int64_t ignore_index, int64_t count, double g,
                                KT *gx) {
    KT scale = count ? (KT)(g / (double)count) : 0;
    for (int64_t r = 0; r < N; r++) {
        const KT *xr = x + r * C;
        KT *gr = gx + r * C;
        if (target[r] == ignore_index || count == 0) {
            memset(gr, 0, (size_t)C * sizeof(KT));
            continue;
        }
        KT m = -INFINITY;
        for (int64_t j = 0; j < C; j++)
            if (xr[j] > m) m = xr[j];
        if (m == -INFINITY) m = 0;
        KT l = lse[r];
        for (int64_t j = 0; j < C; j++) gr[j] = KEXP((xr[j] - m) - l) * scale;
        gr[target[r]] -= scale;
    }
}

double KN(mpri_mse_loss_fwd)(const KT *a, const KT *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        s += d * d;
    }
    return n ? s / (double)n : NAN; /* PyTorch: mean over nothing is nan */
}

void KN(mpri_mse_loss_bwd)(const KT *a, const KT *b, int64_t n, double g, KT *ga, KT *gb) {
    KT scale = n ? (KT)(2.0 * g / (double)n) : 0;
    for (int64_t i = 0; i < n; i++) {
        KT d = (a[i] - b[i]) * scale;
        if (ga) ga[i] = d;
        if (gb) gb[i] = -d;
    }
}
