/* cpu_lstm_impl.h — typed body of the fused LSTM cell kernels, included by
 * cpu_lstm.c once per dtype (cpu_dtypes.h) with KT, KN(name), KEXP, KTANH defined. */

void KN(mpri_lstm_cell_fwd)(const KT *gates, const KT *c_prev, int64_t B, int64_t H, KT *act,
                            KT *h, KT *c) {
    for (int64_t b = 0; b < B; b++) {
        const KT *G = gates + b * 4 * H;
        KT *A = act + b * 4 * H;
        const KT *cp = c_prev + b * H;
        KT *hb = h + b * H, *cb = c + b * H;
        for (int64_t j = 0; j < H; j++) {
            KT i = (KT)1 / ((KT)1 + KEXP(-G[j]));
            KT f = (KT)1 / ((KT)1 + KEXP(-G[H + j]));
            KT g = KTANH(G[2 * H + j]);
            KT o = (KT)1 / ((KT)1 + KEXP(-G[3 * H + j]));
            KT cn = f * cp[j] + i * g;
            A[j] = i;
            A[H + j] = f;
            A[2 * H + j] = g;
            A[3 * H + j] = o;
            cb[j] = cn;
            hb[j] = o * KTANH(cn);
        }
    }
}

void KN(mpri_lstm_cell_bwd)(const KT *act, const KT *c_prev, const KT *c, const KT *gh,
                            const KT *gc, int64_t B, int64_t H, KT *ggates, KT *gc_prev) {
    for (int64_t b = 0; b < B; b++) {
        const KT *A = act + b * 4 * H;
        const KT *cp = c_prev + b * H, *cb = c + b * H, *ghb = gh + b * H, *gcb = gc + b * H;
        KT *dG = ggates + b * 4 * H;
        KT *dcp = gc_prev ? gc_prev + b * H : NULL;
        for (int64_t j = 0; j < H; j++) {
            KT i = A[j], f = A[H + j], g = A[2 * H + j], o = A[3 * H + j];
            KT tc = KTANH(cb[j]);
            KT dc = gcb[j] + ghb[j] * o * ((KT)1 - tc * tc);
            dG[j] = dc * g * i * ((KT)1 - i);
            dG[H + j] = dc * cp[j] * f * ((KT)1 - f);
            dG[2 * H + j] = dc * i * ((KT)1 - g * g);
            dG[3 * H + j] = ghb[j] * tc * o * ((KT)1 - o);
            if (dcp) dcp[j] = dc * f;
        }
    }
}
