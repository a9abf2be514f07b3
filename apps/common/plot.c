/* plot.c — the metrics PNG (app.h): a gnuplot script generated beside the
 * PNG and run by a child gnuplot process (posix_spawnp): loss against wall
 * time above, test accuracy against wall time below.
 *
 * Invariants: the script file is removed whatever happens; a missing gnuplot
 * is a warning and MPR_ERR_UNSUPPORTED, never a crash; the CSV path and the
 * title are written into the script as gnuplot strings with quotes escaped. */
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "app.h"
#include "plot_run.h"

extern char **environ;

void app_gnuplot_quoted(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}

static void write_script(FILE *f, const char *csv, const char *png, const char *title) {
    fprintf(f, "set terminal pngcairo noenhanced size 1000,800 font 'sans,11'\nset output ");
    app_gnuplot_quoted(f, png);
    fprintf(f, "\nset datafile separator ','\n"
               "set datafile columnheaders\n"
               "set grid\nset key top right\n"
               "stats ");
    app_gnuplot_quoted(f, csv);
    fprintf(f, " using 'wall_s' nooutput\n" /* both panels share the time axis */
               "set xrange [0:STATS_max > 0 ? STATS_max : 1]\n"
               "set multiplot layout 2,1 title ");
    app_gnuplot_quoted(f, title ? title : "training");
    fprintf(f, "\nset xlabel 'wall time (s)'\nset ylabel 'training loss'\n"
               "plot ");
    app_gnuplot_quoted(f, csv);
    fprintf(f, " using 'wall_s':'loss' with lines lw 1.5 lc rgb '#1f77b4' title 'loss'\n"
               "set ylabel 'test accuracy'\nset key bottom right\n"
               "set datafile missing ''\n"
               "plot ");
    app_gnuplot_quoted(f, csv);
    fprintf(f, " using 'wall_s':'test_acc' with linespoints pt 7 ps 1 lw 2 lc rgb '#d62728' title 'test accuracy'\n"
               "unset multiplot\n");
}

char *app_plot_path(const app_common_t *common) {
    if (common->plot_path) return strdup(common->plot_path);
    if (!common->metrics_path) return NULL;
    const char *m = common->metrics_path;
    const char *slash = strrchr(m, '/'), *dot = strrchr(m, '.');
    size_t stem = dot && (!slash || dot > slash) ? (size_t)(dot - m) : strlen(m);
    char *p = malloc(stem + 5);
    if (!p) return NULL;
    memcpy(p, m, stem);
    strcpy(p + stem, ".png");
    return p;
}

typedef struct metrics_script {
    const char *csv, *png, *title;
} metrics_script_t;

static void write_metrics_script(FILE *f, void *ctx) {
    const metrics_script_t *m = ctx;
    write_script(f, m->csv, m->png, m->title);
}

mpr_err_t app_plot_metrics(const char *csv_path, const char *png_path, const char *title) {
    if (!csv_path || !png_path) return mpr_error_set(MPR_ERR_INVALID_ARG, "app_plot_metrics: a path is NULL");
    metrics_script_t m = {csv_path, png_path, title};
    return app_gnuplot_run(csv_path, png_path, write_metrics_script, &m, "app_plot_metrics");
}

mpr_err_t app_gnuplot_run(const char *csv_path, const char *png_path, void (*write)(FILE *f, void *ctx), void *ctx,
                          const char *who) {
    const char *gnuplot = getenv("MPIRPC_GNUPLOT");
    if (!gnuplot || !*gnuplot) gnuplot = "gnuplot";

    size_t len = strlen(png_path) + 16;
    char *script = malloc(len);
    if (!script) return mpr_error_set(MPR_ERR_NOMEM, "%s: out of memory", who);
    snprintf(script, len, "%s.gp.XXXXXX", png_path);
    int fd = mkstemp(script);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        mpr_err_t e = mpr_error_set(MPR_ERR_IO, "plot: cannot create a script beside '%s': %s", png_path,
                                    strerror(errno));
        if (fd >= 0) close(fd), unlink(script);
        free(script);
        return e;
    }
    write(f, ctx);
    if (fclose(f) != 0) {
        unlink(script);
        free(script);
        return mpr_error_set(MPR_ERR_IO, "plot: cannot write the gnuplot script");
    }

    /* gnuplot's stderr goes to a file shown only if it fails (it warns about harmless
     * things, e.g. a one-point accuracy range) */
    size_t llen = strlen(script) + 8;
    char *log = malloc(llen);
    posix_spawn_file_actions_t fa;
    bool have_fa = log && posix_spawn_file_actions_init(&fa) == 0;
    if (log) snprintf(log, llen, "%s.log", script);
    if (have_fa) posix_spawn_file_actions_addopen(&fa, 2, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    char *argv[] = {(char *)gnuplot, script, NULL};
    pid_t pid;
    int rc = posix_spawnp(&pid, gnuplot, have_fa ? &fa : NULL, NULL, argv, environ);
    if (have_fa) posix_spawn_file_actions_destroy(&fa);
    mpr_err_t e = MPR_OK;
    if (rc == ENOENT) {
        fprintf(stderr, "warning: no plot: '%s' not found (install the Debian package gnuplot-nox)\n", gnuplot);
        e = mpr_error_set(MPR_ERR_UNSUPPORTED, "plot: '%s' not found (Debian package gnuplot-nox)", gnuplot);
    } else if (rc != 0) {
        e = mpr_error_set(MPR_ERR_IO, "plot: cannot start '%s': %s", gnuplot, strerror(rc));
    } else {
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            if (WIFEXITED(status) && WEXITSTATUS(status) == 127) /* exec failed after the fork */
                fprintf(stderr, "warning: no plot: cannot run '%s' (install the Debian package gnuplot-nox)\n",
                        gnuplot);
            e = mpr_error_set(MPR_ERR_IO, "plot: '%s' failed on '%s' (exit status %d)", gnuplot, csv_path,
                              WIFEXITED(status) ? WEXITSTATUS(status) : -1);
            FILE *lf = log ? fopen(log, "r") : NULL;
            char line[512];
            while (lf && fgets(line, sizeof line, lf)) fprintf(stderr, "gnuplot: %s", line);
            if (lf) fclose(lf);
        }
    }
    if (log) unlink(log);
    free(log);
    unlink(script);
    free(script);
    return e;
}
