/* metrics.c — the metrics CSV (app.h): a fixed header
 * "step,epoch,wall_s,loss,samples_per_s,test_acc" plus the app's columns,
 * one flushed row per call, NaN as an empty field; a resumed run keeps the
 * rows up to its checkpoint's step and appends after them.
 *
 * Invariants: the file always starts with the header of this writer's
 * columns; a kept file is rewritten through a temporary file and rename,
 * so a crash while resuming leaves the old file whole. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"

struct app_metrics {
    FILE *f;
    char *path;
    int n_extra;
};

static const char base_header[] = "step,epoch,wall_s,loss,samples_per_s,test_acc";

static char *make_header(const char *const *extra, int n_extra) {
    size_t len = sizeof base_header + 1;
    for (int i = 0; i < n_extra; i++) len += strlen(extra[i]) + 1;
    char *h = malloc(len);
    if (!h) return NULL;
    strcpy(h, base_header);
    for (int i = 0; i < n_extra; i++) strcat(strcat(h, ","), extra[i]);
    return h;
}

/* Rewrite `path` keeping the header and the rows with step <= keep_step.
 * Returns true if the file was kept (then the writer appends), false if a
 * new one must be started (missing file, other header). */
static bool keep_rows(const char *path, const char *header, int64_t keep_step) {
    FILE *in = fopen(path, "r");
    if (!in) return false;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, in);
    bool same = n > 0 && strncmp(line, header, strlen(header)) == 0 &&
                (line[strlen(header)] == '\n' || line[strlen(header)] == 0);
    size_t tlen = strlen(path) + 8;
    char *tmp = malloc(tlen);
    FILE *out = NULL;
    if (same && tmp) {
        snprintf(tmp, tlen, "%s.tmp", path);
        out = fopen(tmp, "w");
    }
    if (out) {
        fprintf(out, "%s\n", header);
        while ((n = getline(&line, &cap, in)) > 0) {
            char *end;
            long long step = strtoll(line, &end, 10);
            if (end != line && *end == ',' && step <= keep_step) fputs(line, out);
        }
    }
    fclose(in);
    free(line);
    bool kept = false;
    if (out) kept = fclose(out) == 0 && rename(tmp, path) == 0;
    free(tmp);
    return kept;
}

app_metrics_t *app_metrics_open(const char *path, const char *const *extra, int n_extra, int64_t resume_step) {
    if (!path) return NULL;
    app_metrics_t *m = calloc(1, sizeof *m);
    char *header = make_header(extra, n_extra);
    if (!m || !header || !(m->path = strdup(path))) {
        free(header);
        app_metrics_close(m);
        mpr_error_set(MPR_ERR_NOMEM, "app_metrics_open: out of memory");
        return NULL;
    }
    m->n_extra = n_extra;
    bool append = resume_step >= 0 && keep_rows(path, header, resume_step);
    m->f = fopen(path, append ? "a" : "w");
    if (!m->f) {
        mpr_error_set(MPR_ERR_IO, "metrics: cannot open '%s' for writing: %s", path, strerror(errno));
        free(header);
        app_metrics_close(m);
        return NULL;
    }
    if (!append) fprintf(m->f, "%s\n", header);
    free(header);
    fflush(m->f);
    return m;
}

static void field(FILE *f, double v, const char *fmt) {
    fputc(',', f);
    if (!isnan(v)) fprintf(f, fmt, v);
}

mpr_err_t app_metrics_write(app_metrics_t *m, int64_t step, int64_t epoch, double wall_s, double loss,
                            double samples_per_s, double test_acc, const double *extra) {
    if (!m) return MPR_OK;
    fprintf(m->f, "%lld,%lld", (long long)step, (long long)epoch);
    field(m->f, wall_s, "%.3f");
    field(m->f, loss, "%.6g");
    field(m->f, samples_per_s, "%.1f");
    field(m->f, test_acc, "%.4f");
    for (int i = 0; i < m->n_extra; i++) field(m->f, extra ? extra[i] : NAN, "%.6g");
    fputc('\n', m->f);
    if (fflush(m->f) != 0 || ferror(m->f))
        return mpr_error_set(MPR_ERR_IO, "metrics: cannot write '%s': %s", m->path, strerror(errno));
    return MPR_OK;
}

void app_metrics_close(app_metrics_t *m) {
    if (!m) return;
    if (m->f) fclose(m->f);
    free(m->path);
    free(m);
}
