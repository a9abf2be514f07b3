/* plot_series.c — a second kind of metrics PNG (app.h: app_plot_series):
 * chosen columns of the metrics CSV against a chosen x column in one panel,
 * e.g. an RL agent's rewards per episode, drawn by a child gnuplot process
 * on a generated script like app_plot_metrics (plot.c) draws.
 *
 * Invariants: the script file is removed whatever happens; a missing gnuplot
 * is a warning and MPR_ERR_UNSUPPORTED, never a crash; paths, title and
 * column names are written into the script as gnuplot strings with quotes
 * escaped; empty fields (NaN) are missing points; the last column is drawn
 * last (on top) and thicker. */
#include <errno.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "app.h"

extern char **environ;

static const char *const colors[] = {"#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};

/* A gnuplot single-quoted string: ' is doubled. */
static void quoted(FILE *f, const char *s) {
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}

static void write_script(FILE *f, const char *csv, const char *png, const char *title, const char *x_col,
                         const char *x_label, const char *const *y_cols, int n_y, const char *y_label) {
    fprintf(f, "set terminal pngcairo noenhanced size 1000,600 font 'sans,11'\nset output ");
    quoted(f, png);
    fprintf(f, "\nset datafile separator ','\nset datafile columnheaders\nset datafile missing ''\n"
               "set grid\nset key top left\nset title ");
    quoted(f, title ? title : "training");
    fprintf(f, "\nset xlabel ");
    quoted(f, x_label ? x_label : x_col);
    fprintf(f, "\nset ylabel ");
    quoted(f, y_label ? y_label : "");
    fprintf(f, "\nplot ");
    for (int i = 0; i < n_y; i++) {
        if (i) fprintf(f, ", \\\n     ");
        quoted(f, csv);
        fprintf(f, " using ");
        quoted(f, x_col);
        fprintf(f, ":");
        quoted(f, y_cols[i]);
        fprintf(f, " with lines lw %s lc rgb '%s' title ", i == n_y - 1 ? "2.5" : "1", colors[i % 6]);
        quoted(f, y_cols[i]);
    }
    fprintf(f, "\n");
}

mpr_err_t app_plot_series(const char *csv_path, const char *png_path, const char *title, const char *x_col,
                          const char *x_label, const char *const *y_cols, int n_y, const char *y_label) {
    if (!csv_path || !png_path || !x_col || !y_cols || n_y < 1)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "app_plot_series: a path or the columns are missing");
    for (int i = 0; i < n_y; i++)
        if (!y_cols[i]) return mpr_error_set(MPR_ERR_INVALID_ARG, "app_plot_series: column %d is NULL", i);
    const char *gnuplot = getenv("MPIRPC_GNUPLOT");
    if (!gnuplot || !*gnuplot) gnuplot = "gnuplot";
    size_t len = strlen(png_path) + 16;
    char *script = malloc(len);
    if (!script) return mpr_error_set(MPR_ERR_NOMEM, "app_plot_series: out of memory");
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
    write_script(f, csv_path, png_path, title, x_col, x_label, y_cols, n_y, y_label);
    mpr_err_t e = MPR_OK;
    if (fclose(f) != 0) e = mpr_error_set(MPR_ERR_IO, "plot: cannot write the gnuplot script");
    char *argv[] = {(char *)gnuplot, script, NULL};
    pid_t pid;
    int rc = e ? 0 : posix_spawnp(&pid, gnuplot, NULL, NULL, argv, environ);
    if (e) {
    } else if (rc == ENOENT) {
        fprintf(stderr, "warning: no plot: '%s' not found (install the Debian package gnuplot-nox)\n", gnuplot);
        e = mpr_error_set(MPR_ERR_UNSUPPORTED, "plot: '%s' not found (Debian package gnuplot-nox)", gnuplot);
    } else if (rc != 0) {
        e = mpr_error_set(MPR_ERR_IO, "plot: cannot start '%s': %s", gnuplot, strerror(rc));
    } else {
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            e = mpr_error_set(MPR_ERR_IO, "plot: '%s' failed on '%s' (exit status %d)", gnuplot, csv_path,
                              WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    }
    unlink(script);
    free(script);
    return e;
}
