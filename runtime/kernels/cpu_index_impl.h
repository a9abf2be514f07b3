/* cpu_index_impl.h — typed body of the index_select / gather kernels, included
 * by cpu_index.c once per dtype (cpu_dtypes.h) with KT and KN(name) defined. */

void KN(mpri_index_select_fwd)(const KT *x, const int64_t *idx, KT *y, int64_t outer, int64_t n,
                               int64_t k, int64_t inner) {
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < k; j++)
            memcpy(y + (o * k + j) * inner, x + (o * n + idx[j]) * inner,
                   (size_t)inner * sizeof(KT));
}

void KN(mpri_index_select_bwd)(const KT *gy, const int64_t *idx, KT *gx, int64_t outer,
                               int64_t n, int64_t k, int64_t inner) {
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < k; j++) {
            const KT *src = gy + (o * k + j) * inner;
            KT *dst = gx + (o * n + idx[j]) * inner;
            for (int64_t i = 0; i < inner; i++) dst[i] += src[i];
        }
}

void KN(mpri_gather_fwd)(const KT *x, const int64_t *idx, KT *y, int64_t outer, int64_t n,
                         int64_t k, int64_t inner) {
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < k; j++) {
            const int64_t *ir = idx + (o * k + j) * inner;
            KT *yr = y + (o * k + j) * inner;
            const KT *xb = x + o * n * inner;
            for (int64_t i = 0; i < inner; i++) yr[i] = xb[ir[i] * inner + i];
        }
}

void KN(mpri_gather_bwd)(const KT *gy, const int64_t *idx, KT *gx, int64_t outer, int64_t n,
                         int64_t k, int64_t inner) {
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < k; j++) {
            const int64_t *ir = idx + (o * k + j) * inner;
            const KT *gr = gy + (o * k + j) * inner;
            KT *gb = gx + o * n * inner;
            for (int64_t i = 0; i < inner; i++) gb[ir[i] * inner + i] += gr[i];
        }
}
