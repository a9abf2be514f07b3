/* plot_series.c — a second kind of metrics PNG (app.h: app_plot_series):
 * chosen columns of the metrics CSV against a chosen x column in one panel,
 * e.g. an RL agent's rewards per episode, drawn by the same gnuplot runner
 * as app_plot_metrics (plot_run.h, in plot.c).
 *
 * Invariants: the script file is removed whatever happens; a missing gnuplot
 * is a warning and MPR_ERR_UNSUPPORTED, never a crash; paths, title and
 * column names are written into the script as gnuplot strings with quotes
 * escaped; empty fields (NaN) are missing points; the last column is drawn
 * last (on top) and thicker. */
#include "app.h"
#include "plot_run.h"

static const char *const colors[] = {"#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};

static void write_script(FILE *f, const char *csv, const char *png, const char *title, const char *x_col,
                         const char *x_label, const char *const *y_cols, int n_y, const char *y_label) {
    fprintf(f, "set terminal pngcairo noenhanced size 1000,600 font 'sans,11'\nset output ");
    app_gnuplot_quoted(f, png);
    fprintf(f, "\nset datafile separator ','\nset datafile columnheaders\nset datafile missing ''\n"
               "set grid\nset key top left\nset title ");
    app_gnuplot_quoted(f, title ? title : "training");
    fprintf(f, "\nset xlabel ");
    app_gnuplot_quoted(f, x_label ? x_label : x_col);
    fprintf(f, "\nset ylabel ");
    app_gnuplot_quoted(f, y_label ? y_label : "");
    fprintf(f, "\nplot ");
    for (int i = 0; i < n_y; i++) {
        if (i) fprintf(f, ", \\\n     ");
        app_gnuplot_quoted(f, csv);
        fprintf(f, " using ");
        app_gnuplot_quoted(f, x_col);
        fprintf(f, ":");
        app_gnuplot_quoted(f, y_cols[i]);
        fprintf(f, " with lines lw %s lc rgb '%s' title ", i == n_y - 1 ? "2.5" : "1", colors[i % 6]);
        app_gnuplot_quoted(f, y_cols[i]);
    }
    fprintf(f, "\n");
}

typedef struct series_script {
    const char *csv, *png, *title, *x_col, *x_label, *y_label;
    const char *const *y_cols;
    int n_y;
} series_script_t;

static void write_series_script(FILE *f, void *ctx) {
    const series_script_t *s = ctx;
    write_script(f, s->csv, s->png, s->title, s->x_col, s->x_label, s->y_cols, s->n_y, s->y_label);
}

mpr_err_t app_plot_series(const char *csv_path, const char *png_path, const char *title, const char *x_col,
                          const char *x_label, const char *const *y_cols, int n_y, const char *y_label) {
    if (!csv_path || !png_path || !x_col || !y_cols || n_y < 1)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "app_plot_series: a path or the columns are missing");
    for (int i = 0; i < n_y; i++)
        if (!y_cols[i]) return mpr_error_set(MPR_ERR_INVALID_ARG, "app_plot_series: column %d is NULL", i);
    series_script_t sc = {csv_path, png_path, title, x_col, x_label, y_label, y_cols, n_y};
    return app_gnuplot_run(csv_path, png_path, write_series_script, &sc, "app_plot_series");
}
