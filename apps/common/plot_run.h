/* plot_run.h — the one gnuplot runner of apps/common (plot.c), shared by the
 * metrics plot and plot_series.c (internal; not part of app.h).
 *
 * app_gnuplot_run writes a script through `write(f, ctx)` into a temporary
 * file beside png_path, runs gnuplot (MPIRPC_GNUPLOT, else "gnuplot") on it
 * with its stderr kept aside and shown only on failure, and removes the
 * script whatever happens. A missing gnuplot is a warning naming the Debian
 * package and MPR_ERR_UNSUPPORTED; other failures MPR_ERR_IO naming csv_path. */
#ifndef APP_PLOT_RUN_H
#define APP_PLOT_RUN_H

#include <stdio.h>

#include "mpirpc/error.h"

mpr_err_t app_gnuplot_run(const char *csv_path, const char *png_path, void (*write)(FILE *f, void *ctx), void *ctx,
                          const char *who);
/* A gnuplot single-quoted string: ' is doubled. */
void app_gnuplot_quoted(FILE *f, const char *s);

#endif
