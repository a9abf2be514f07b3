/* bench_codec.c — what a list of many small tensors costs the codec, per
 * tensor, in one process (no MPI traffic), printing one JSON object per line.
 *
 * Run: ./bench_codec [COUNTxBYTES ...] [--reps N]   (default 4096x256 256x1024)
 * Each repetition takes a list of COUNT float32 tensors of BYTES bytes through
 * the stages a message goes through, timed apart:
 *   encode        value -> wire bytes + tensor list (mpri_value_encode)
 *   descs_encode  the tensor descriptors (mpri_tensor_descs_encode)
 *   pack          the tensors' bytes copied into one buffer (as a send of
 *                 small tensors apart in memory does)
 *   descs_decode  descriptors -> tensors carved from blocks (receiver)
 *   value_decode  wire bytes -> the value (receiver)
 *   release       the decoded list released (its tensors, blocks, slab)
 * and prints the median over repetitions in ns a tensor. These are the
 * per-tensor costs behind bench_rpc's tensor_list_echo lines; the network
 * and thread hand-offs are bench_rpc's. The decoded list is checked against
 * the original once, so a broken codec cannot time well. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpri_codec.h"
#include "mpri_tensor.h"

#define NSTAGES 6
static const char *const stage_names[NSTAGES] = {"encode",       "descs_encode", "pack",
                                                 "descs_decode", "value_decode", "release"};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void die(const char *what) {
    fprintf(stderr, "bench_codec: %s: %s\n", what, mpr_last_error());
    exit(1);
}

/* One repetition; stage times (seconds) into t[]. check: compare the decoded
 * list with `args`' list. */
static void one_round(const mpr_value_t *args, int count, int bytes, double *t, bool check) {
    mpri_buf_t buf, descs;
    mpri_tensor_list_t tl;
    mpri_buf_init(&buf);
    mpri_buf_init(&descs);
    mpri_tensor_list_init(&tl);
    double t0 = now_s();
    if (mpri_value_encode(args, &buf, &tl, 0) != MPR_OK) die("encode");
    double t1 = now_s();
    mpri_tensor_descs_encode(&tl, &descs);
    double t2 = now_s();
    uint8_t *packed = malloc((size_t)count * (size_t)bytes);
    if (!packed) die("out of memory");
    size_t at = 0;
    for (uint32_t i = 0; i < tl.len; i++) {
        memcpy(packed + at, mpr_tensor_data(tl.items[i]), (size_t)bytes);
        at += (size_t)bytes;
    }
    double t3 = now_s();
    mpr_tensor_t **recv = calloc((size_t)count, sizeof *recv);
    if (!recv) die("out of memory");
    mpri_tensor_placement_t *placement = NULL;
    mpri_reader_t dr;
    mpri_reader_init(&dr, descs.data, descs.len);
    if (mpri_tensor_descs_decode(&dr, tl.len, recv, &placement) != MPR_OK) die("descriptor decode");
    double t4 = now_s();
    mpri_reader_t r;
    mpri_reader_init(&r, buf.data, buf.len);
    mpr_value_t *out = NULL;
    if (mpri_value_decode(&r, recv, tl.len, 0, &out) != MPR_OK) die("value decode");
    for (uint32_t i = 0; i < tl.len; i++) mpr_tensor_release(recv[i]); /* the value holds them */
    double t5 = now_s();
    if (check) {
        at = 0;
        for (uint32_t i = 0; i < tl.len; i++, at += (size_t)bytes) /* as the receive would */
            memcpy(mpr_tensor_data(recv[i]), packed + at, (size_t)bytes);
        if (!mpr_value_equal(out, args)) die("the decoded list differs from the one sent");
    }
    mpr_value_release(out);
    double t6 = now_s();
    free(recv);
    free(packed);
    mpri_tensor_list_fini(&tl);
    mpri_buf_fini(&buf);
    mpri_buf_fini(&descs);
    double stamps[NSTAGES + 1] = {t0, t1, t2, t3, t4, t5, t6};
    for (int s = 0; s < NSTAGES; s++) t[s] = stamps[s + 1] - stamps[s];
}

static void run(int count, int bytes, int reps) {
    mpr_value_t *list = mpr_value_new_list();
    for (int i = 0; i < count; i++) {
        int64_t shape[1] = {bytes / 4};
        mpr_tensor_t *x = mpr_tensor_empty(MPR_F32, 1, shape);
        if (!x) die("tensor");
        float *p = mpr_tensor_data(x);
        for (int j = 0; j < bytes / 4; j++) p[j] = (float)(i + j);
        if (mpr_value_list_append(list, mpr_value_new_tensor(x)) != MPR_OK) die("list");
        mpr_tensor_release(x);
    }
    mpr_value_t *args = mpr_value_list_of(1, list);
    double t[NSTAGES], *times = malloc(sizeof *times * NSTAGES * (size_t)reps);
    if (!args || !times) die("out of memory");
    one_round(args, count, bytes, t, true); /* warm-up, checked */
    for (int i = 0; i < reps; i++) {
        one_round(args, count, bytes, t, false);
        for (int s = 0; s < NSTAGES; s++) times[s * reps + i] = t[s];
    }
    printf("{\"name\":\"codec_per_tensor\",\"tensors\":%d,\"bytes_each\":%d,\"reps\":%d", count, bytes, reps);
    double total = 0;
    for (int s = 0; s < NSTAGES; s++) {
        qsort(times + s * reps, (size_t)reps, sizeof *times, cmp_double);
        double ns = times[s * reps + reps / 2] * 1e9 / count;
        total += ns;
        printf(",\"%s_ns\":%.1f", stage_names[s], ns);
    }
    printf(",\"total_ns\":%.1f}\n", total);
    fflush(stdout);
    free(times);
    mpr_value_release(args);
}

int main(int argc, char **argv) {
    int reps = 200, nspecs = 0, counts[16], bytes[16];
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc && (reps = atoi(argv[++i])) > 0) continue;
        int c = 0, b = 0, end = 0; /* end: the whole argument was read ("12x8junk" is refused) */
        if (nspecs < 16 && sscanf(argv[i], "%dx%d%n", &c, &b, &end) == 2 && argv[i][end] == '\0' && c > 0 &&
            c <= 65536 && b >= 4 && b % 4 == 0 && b <= (1 << 20)) {
            counts[nspecs] = c;
            bytes[nspecs++] = b;
            continue;
        }
        fprintf(stderr, "usage: bench_codec [COUNTxBYTES ...] [--reps N]  (COUNT 1..65536, BYTES a "
                        "multiple of 4 up to 1 MiB; default 4096x256 256x1024)\n");
        return 2;
    }
    if (!nspecs) {
        counts[0] = 4096, bytes[0] = 256;
        counts[1] = 256, bytes[1] = 1024;
        nspecs = 2;
    }
    for (int i = 0; i < nspecs; i++) run(counts[i], bytes[i], reps);
    return 0;
}
