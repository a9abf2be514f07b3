/* progress.c — the training progress line (app.h): on a terminal a bar
 * redrawn in place with samples/s, loss and ETA (at most 10 redraws a
 * second); elsewhere (a Slurm log, a pipe) a plain line every interval.
 *
 * Invariants: `bar_open` is true exactly when the last thing written is an
 * unterminated bar line (so app_progress_print clears it first); the shown
 * loss is the mean of the losses given since the previous line; rates count
 * only steps of this process (from first_step on), not resumed ones. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app.h"

struct app_progress {
    app_progress_config_t cfg;
    bool bar;                     /* bar mode (else plain lines) */
    bool bar_open;                /* a bar line is on screen without its newline */
    double t0, last_draw;         /* app_now() at creation / last line */
    int64_t samples;              /* samples since creation */
    int64_t window_samples;       /* since the last line */
    double window_t0;
    double loss_sum;              /* losses since the last line */
    int64_t loss_n;
    int64_t step, epoch;          /* latest update */
    double shown_rate, shown_loss; /* what the last line said */
};

app_progress_t *app_progress_create(const app_progress_config_t *cfg) {
    app_progress_t *p = calloc(1, sizeof *p);
    if (!p) {
        mpr_error_set(MPR_ERR_NOMEM, "app_progress_create: out of memory");
        return NULL;
    }
    p->cfg = *cfg;
    if (!p->cfg.out) p->cfg.out = stderr;
    if (p->cfg.interval_s <= 0) p->cfg.interval_s = 10.0;
    if (!p->cfg.unit) p->cfg.unit = "samples";
    p->bar = p->cfg.mode == APP_PROGRESS_BAR ||
             (p->cfg.mode == APP_PROGRESS_AUTO && isatty(fileno(p->cfg.out)));
    p->t0 = p->last_draw = p->window_t0 = app_now();
    p->step = p->cfg.first_step;
    p->shown_loss = NAN;
    return p;
}

static void format_duration(char *buf, size_t cap, double s) {
    if (!isfinite(s) || s < 0) {
        snprintf(buf, cap, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

static void format_rate(char *buf, size_t cap, double r) {
    if (r >= 1e6)
        snprintf(buf, cap, "%.2fM", r / 1e6);
    else if (r >= 1e4)
        snprintf(buf, cap, "%.1fk", r / 1e3);
    else
        snprintf(buf, cap, "%.0f", r);
}

double app_progress_rate(const app_progress_t *p) {
    double dt = app_now() - p->t0;
    return dt > 0 ? (double)p->samples / dt : 0.0;
}

/* Draw one line (bar or plain) from the current state. */
static void draw(app_progress_t *p, double now) {
    double wdt = now - p->window_t0;
    if (wdt > 0 && p->window_samples > 0) p->shown_rate = (double)p->window_samples / wdt;
    if (p->loss_n) p->shown_loss = p->loss_sum / (double)p->loss_n;
    p->window_samples = 0, p->window_t0 = now, p->loss_sum = 0, p->loss_n = 0;
    p->last_draw = now;

    int64_t total = p->cfg.total_steps, done = p->step - p->cfg.first_step;
    double eta = NAN;
    if (total > 0 && done > 0) eta = (now - p->t0) / (double)done * (double)(total - p->step);
    char rate[32], etas[32], epoch[48] = "";
    format_rate(rate, sizeof rate, p->shown_rate);
    format_duration(etas, sizeof etas, eta);
    char loss[32] = ""; /* no loss given (all NaN): not shown */
    if (!isnan(p->shown_loss)) snprintf(loss, sizeof loss, "  loss %.4f", p->shown_loss);
    if (p->cfg.epochs > 0)
        snprintf(epoch, sizeof epoch, "epoch %lld/%lld ", (long long)p->epoch, (long long)p->cfg.epochs);
    FILE *o = p->cfg.out;
    if (p->bar) {
        enum { WIDTH = 24 };
        int fill = total > 0 ? (int)((double)WIDTH * (double)p->step / (double)total) : 0;
        if (fill > WIDTH) fill = WIDTH;
        char bar[WIDTH + 1];
        memset(bar, '#', (size_t)fill);
        memset(bar + fill, '.', (size_t)(WIDTH - fill));
        bar[WIDTH] = 0;
        fprintf(o, "\r%s[%s] %lld/%lld  %s %s/s%s  ETA %s\033[K", epoch, bar, (long long)p->step,
                (long long)total, rate, p->cfg.unit, loss, etas);
        p->bar_open = true;
    } else {
        char elapsed[32];
        format_duration(elapsed, sizeof elapsed, now - p->t0);
        if (total > 0)
            fprintf(o, "[%s] %sstep %lld/%lld (%.1f%%)  %s %s/s%s  ETA %s\n", elapsed, epoch,
                    (long long)p->step, (long long)total, 100.0 * (double)p->step / (double)total, rate,
                    p->cfg.unit, loss, etas);
        else
            fprintf(o, "[%s] %sstep %lld  %s %s/s%s\n", elapsed, epoch, (long long)p->step, rate,
                    p->cfg.unit, loss);
    }
    fflush(o);
}

void app_progress_update(app_progress_t *p, int64_t step, int64_t epoch, int64_t samples, double loss) {
    if (!p) return;
    p->step = step, p->epoch = epoch;
    p->samples += samples, p->window_samples += samples;
    if (!isnan(loss)) p->loss_sum += loss, p->loss_n++;
    double now = app_now();
    double period = p->bar ? 0.1 : p->cfg.interval_s;
    if (now - p->last_draw >= period || (p->cfg.total_steps > 0 && step >= p->cfg.total_steps)) draw(p, now);
}

void app_progress_print(app_progress_t *p, const char *fmt, ...) {
    FILE *o = p ? p->cfg.out : stderr;
    if (p && p->bar_open) {
        fprintf(o, "\r\033[K");
        p->bar_open = false;
    }
    va_list ap;
    va_start(ap, fmt);
    vfprintf(o, fmt, ap);
    va_end(ap);
    fputc('\n', o);
    fflush(o);
}

void app_progress_finish(app_progress_t *p) {
    if (!p) return;
    if (p->window_samples || p->loss_n) draw(p, app_now());
    if (p->bar_open) {
        fputc('\n', p->cfg.out);
        fflush(p->cfg.out);
        p->bar_open = false;
    }
}

void app_progress_destroy(app_progress_t *p) { free(p); }
