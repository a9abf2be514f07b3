/* cpu_softmax_impl.h — typed body of the softmax/log_softmax kernels, included
 * by cpu_softmax.c once per dtype (cpu_dtypes.h) with KT (element type), KN(name) (suffixing)
 * and KEXP/KLOG (exp/log of that type) defined. Not a public header. */

void KN(mpri_softmax_fwd)(const KT *x, KT *y, int64_t outer, int64_t n, int64_t inner,
                          int is_log) {
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            const KT *xr = x + o * n * inner + i;
            KT *yr = y + o * n * inner + i;
            KT m = -INFINITY;
            for (int64_t j = 0; j < n; j++)
                if (xr[j * inner] > m) m = xr[j * inner];
            if (m == -INFINITY) m = 0; /* all -inf row: exp gives 0/0 = nan like PyTorch */
            KT s = 0;
            if (is_log) {
                for (int64_t j = 0; j < n; j++) s += KEXP(xr[j * inner] - m);
                KT ls = KLOG(s); /* (x - m) - log(s): no cancellation against a large m */
                for (int64_t j = 0; j < n; j++) yr[j * inner] = (xr[j * inner] - m) - ls;
            } else {
                for (int64_t j = 0; j < n; j++) {
                    KT e = KEXP(xr[j * inner] - m);
                    yr[j * inner] = e;
                    s += e;
                }
                KT inv = (KT)1 / s;
                for (int64_t j = 0; j < n; j++) yr[j * inner] *= inv;
            }
        }
    }
}

void KN(mpri_softmax_bwd)(const KT *y, const KT *gy, KT *gx, int64_t outer, int64_t n,
                          int64_t inner, int is_log) {
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            int64_t base = o * n * inner + i;
            const KT *yr = y + base, *gyr = gy + base;
            KT *gxr = gx + base;
            KT s = 0;
            if (is_log) {
                /* y = x - lse: dx = gy - softmax * sum(gy) */
                for (int64_t j = 0; j < n; j++) s += gyr[j * inner];
                for (int64_t j = 0; j < n; j++)
                    gxr[j * inner] = gyr[j * inner] - KEXP(yr[j * inner]) * s;
            } else {
                /* dx = y * (gy - <gy, y>) */
                for (int64_t j = 0; j < n; j++) s += gyr[j * inner] * yr[j * inner];
                for (int64_t j = 0; j < n; j++)
                    gxr[j * inner] = yr[j * inner] * (gyr[j * inner] - s);
            }
        }
    }
}
