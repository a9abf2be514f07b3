/* apps/common/app.h — what every mpirpc application program shares (the
 * static library mpirpc_app): command-line options, Fashion-MNIST data, a
 * progress line, a metrics CSV, a gnuplot PNG of the metrics, and atomic
 * checkpoints with the state a resumed run needs to continue exactly.
 *
 * A typical program (apps/param_server/param_server.c is a complete one):
 *
 *   int64_t epochs = 1; double lr = 0.05; const char *optim = "sgd";
 *   app_option_t opts[] = {
 *       {"epochs", APP_OPT_INT, &epochs, 1, 1000, NULL, "passes over the training set"},
 *       {"lr", APP_OPT_DOUBLE, &lr, 0, 10, NULL, "learning rate"},
 *       {"optimizer", APP_OPT_CHOICE, &optim, 0, 0, "sgd|adam", "optimizer kind"},
 *       {0}};
 *   app_common_t common;
 *   app_parse_options_or_exit(argc, argv, "my_app: what it does", opts, &common);
 *   ... mpr_init ...
 *   app_dataset_t data;
 *   if (app_fmnist_load(common.data_dir, true, &data)) { fprintf(stderr, "%s\n", mpr_last_error()); ... }
 *   app_progress_t *bar = app_progress_create(&(app_progress_config_t){.total_steps = n, ...});
 *   app_metrics_t *csv = app_metrics_open(common.metrics_path, NULL, 0, -1);
 *   for (...) { ...; app_progress_update(bar, step, epoch, batch, loss); }
 *   app_metrics_close(csv); app_plot_metrics(common.metrics_path, common.plot_path, "title");
 *
 * Conventions: functions returning mpr_err_t return MPR_OK or a code with
 * mpr_last_error() set to a message naming the file / option at fault (the
 * library's error mechanism, mpirpc/error.h); functions returning a pointer
 * return NULL the same way. Every object created here is owned by the
 * caller and destroyed by its _close/_destroy/_free function, which accepts
 * NULL. Tensors passed in are borrowed unless stated. Nothing here is
 * thread-safe: use each object from one thread. */
#ifndef MPIRPC_APP_H
#define MPIRPC_APP_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h> /* abort, for APP_ASSERT */

#include "mpirpc/data.h"
#include "mpirpc/error.h"
#include "mpirpc/init.h"
#include "mpirpc/nn.h"
#include "mpirpc/tensor.h"
#include "mpirpc/tensor_io.h"

/* ================================================================ options
 * An app describes its own options in a table; the common ones (below) are
 * added by the parser. Parsing uses getopt_long: "--name value",
 * "--name=value", and unambiguous prefixes are accepted. */

typedef enum {
    APP_OPT_FLAG,   /* bool *: set to true when given (takes no value) */
    APP_OPT_INT,    /* int64_t *: decimal integer in [min, max] */
    APP_OPT_DOUBLE, /* double *: finite number in [min, max] */
    APP_OPT_STRING, /* const char **: points into argv afterwards */
    APP_OPT_CHOICE, /* const char **: one of `choices` ("a|b|c"); points into argv */
} app_opt_kind_t;

typedef struct app_option {
    const char *name;    /* long name without "--"; NULL ends the table */
    app_opt_kind_t kind;
    void *value;         /* see the kind; holds the default before parsing */
    double min, max;     /* INT / DOUBLE: inclusive range */
    const char *choices; /* CHOICE: alternatives separated by '|' */
    const char *help;    /* one line; --help prints the default after it */
} app_option_t;

/* The options every app has. app_parse_options fills the defaults first. */
typedef struct app_common {
    const char *data_dir;       /* --data DIR: dataset folder (NULL: the dataset's default) */
    int64_t seed;               /* --seed N: model init and data order (default 0) */
    const char *metrics_path;   /* --metrics FILE: CSV of the metrics (NULL: none) */
    const char *plot_path;      /* --plot FILE: PNG (NULL: metrics path with .png, if any) */
    const char *checkpoint_dir; /* --checkpoint-dir DIR (NULL: no checkpoints) */
    int64_t checkpoint_every;   /* --checkpoint-every N steps (0: only at the end; default 0) */
    bool resume;                /* --resume: continue from the newest good checkpoint */
    double log_interval;        /* --log-interval S: seconds between plain progress lines (default 10) */
    bool verbose;               /* --verbose: print where every rank runs at start (app_print_placement) */
} app_common_t;

typedef enum { APP_PARSE_OK = 0, APP_PARSE_HELP = 1, APP_PARSE_ERROR = 2 } app_parse_result_t;

/* Parse argv against opts (+ the common options) into the `value` pointers
 * and *common. `summary`: the first lines of --help (what the program does,
 * how to start it). --help prints the usage to `out` and returns
 * APP_PARSE_HELP; an unknown option, a missing or bad value, a value out of
 * range or a stray argument prints one line naming the option (and
 * "try --help") to `err` and returns APP_PARSE_ERROR. out/err may be NULL
 * (nothing printed). Can be called several times (it resets getopt). */
app_parse_result_t app_parse_options(int argc, char **argv, const char *summary, app_option_t *opts,
                                     app_common_t *common, FILE *out, FILE *err);
/* The same, for main(): first app_blas_choose_kernels(argv), then parses;
 * prints only on launch rank 0 (app_launch_rank) and exits 0 after --help,
 * 2 after an error. Call it before MPI is initialized. */
void app_parse_options_or_exit(int argc, char **argv, const char *summary, app_option_t *opts,
                               app_common_t *common);
/* When OpenBLAS runs its generic kernels on a CPU it did not recognise
 * (mpr_blas_better_kernels(), mpirpc/tensor_ops.h), execute this program
 * again with OPENBLAS_CORETYPE set to the CPU's set (same argv, environment
 * and pid); returns at once otherwise, after MPI_Init, or if the exec fails.
 * In the new process, launch rank 0 prints one line saying so. `argv` is
 * main's, unpermuted (before getopt). Used by app_parse_options_or_exit.
 * MPIRPC_APP_BLAS_REEXEC_OFF=1 in the environment turns it off (e.g. under
 * valgrind, which does not follow an exec by default). */
void app_blas_choose_kernels(char **argv);
/* This process's rank as the launcher tells it (Open MPI, PMIx, PMI, Slurm
 * environment variables), 0 when not started by one: usable before MPI is
 * initialized, e.g. to print only once. */
int app_launch_rank(void);
/* --verbose: after mpr_init, every rank calls this (collective over
 * MPI_COMM_WORLD); rank 0 prints one line per rank to `out` (NULL: stderr):
 * "rank R: worker NAME, host H, pid P, cores 0-3 (4)", plus the Slurm job,
 * task, local id and node when Slurm launched it. Without --verbose it does
 * nothing. */
mpr_err_t app_print_placement(const app_common_t *common, FILE *out);
/* After mpr_init, every rank calls this (collective over MPI_COMM_WORLD). A
 * rank with `compute` true that its launcher left free to run on more cores
 * than its share is bound, with all its threads, to its share: an equal part
 * of the cores it may use for each of its host's compute ranks, at least one
 * (round robin past the core count); a host's only compute rank keeps them
 * all. *core gets the first bound core's hwloc logical index and *ncores
 * how many, else -1 and 0 (not a compute rank, no more cores than its share
 * already, or an hwloc failure: the placement is kept). `what` gets a short
 * description of what was done. Errors: MPI failures, and
 * MPR_ERR_UNSUPPORTED when hwloc could not read or set the binding (the
 * placement is kept and the call is still complete on every rank). Why and
 * measurements: binding.c. */
mpr_err_t app_bind_compute_rank(bool compute, int *core, int *ncores, char *what, size_t cap);
/* Seconds on a monotonic clock. */
double app_now(void);

/* A broken invariant of an app stops it, in every build type (unlike
 * assert): file, line, the condition and a hint on stderr, then abort(). */
#define APP_ASSERT(cond, hint)                                                                          \
    do {                                                                                                \
        if (!(cond)) {                                                                                  \
            fprintf(stderr, "%s:%d: invariant failed: %s (%s)\n", __FILE__, __LINE__, #cond, hint); \
            abort();                                                                                    \
        }                                                                                               \
    } while (0)

/* ================================================================= data */

typedef struct app_dataset {
    mpr_tensor_t *train_x, *train_y; /* f32 [60000, 784] (or [N, 1, 28, 28]), i64 [60000] */
    mpr_tensor_t *test_x, *test_y;   /* f32 [10000, ...], i64 [10000] */
} app_dataset_t;

/* Debian's dataset-fashion-mnist installs here (same as MPR_FASHION_MNIST_DIR). */
#define APP_FMNIST_PACKAGE "dataset-fashion-mnist"

/* Load both splits of Fashion-MNIST from `dir` (NULL: MPR_FASHION_MNIST_DIR)
 * as new references in *out (flat: [N, 784], else [N, 1, 28, 28]). A missing
 * file gives MPR_ERR_IO with a message naming the path and the Debian
 * package APP_FMNIST_PACKAGE; *out is all NULL on failure. */
mpr_err_t app_fmnist_load(const char *dir, bool flat, app_dataset_t *out);
/* Only check that the four files are readable (the same error as
 * app_fmnist_load): cheap, e.g. before starting MPI. */
mpr_err_t app_fmnist_check(const char *dir);
/* Release the four tensors (NULL-safe), leaving *d zeroed. */
void app_dataset_free(app_dataset_t *d);

/* Rows part, part + nparts, part + 2 nparts, ... of t (the anchor's
 * arange(part, N, nparts) split), as a new contiguous tensor owned by the
 * caller (not by a scope). NULL with the error set on bad arguments. */
mpr_tensor_t *app_shard_rows(mpr_tensor_t *t, int part, int nparts);

/* The data order, made resumable: epoch e of shard `part` visits the
 * permutation drawn from app_epoch_seed(seed, e, part), independent of
 * earlier epochs, so a run resumed at (epoch, step in epoch) sees the same
 * batches as one that never stopped. */
uint64_t app_epoch_seed(uint64_t seed, int64_t epoch, int part);
/* A shuffling, drop-last batch iterator over (x, y) for that epoch, with the
 * first `skip` batches already consumed. Caller destroys it
 * (mpr_batch_iter_destroy). NULL with the error set on failure. */
mpr_batch_iter_t *app_epoch_batches(mpr_tensor_t *x, mpr_tensor_t *y, int64_t batch, uint64_t seed,
                                    int64_t epoch, int part, int64_t skip);

/* Number of rows i where argmax(scores[i, :]) == labels[i] (scores [N, C]
 * float, labels i64 [N]); -1 with the error set on bad shapes. */
int64_t app_count_correct(mpr_tensor_t *scores, mpr_tensor_t *labels);

/* ============================================================= progress
 * A bar redrawn in place ("\r") with samples/s, loss and ETA when the stream
 * is a terminal; otherwise one plain line every interval_s (a Slurm log). */

typedef enum { APP_PROGRESS_AUTO, APP_PROGRESS_BAR, APP_PROGRESS_PLAIN } app_progress_mode_t;

typedef struct app_progress_config {
    FILE *out;                /* NULL: stderr */
    int64_t total_steps;      /* steps of the whole run, for the bar and the ETA (0: unknown) */
    int64_t first_step;       /* steps already done (a resumed run) */
    int64_t epochs;           /* for "epoch e/E" (0: not shown) */
    double interval_s;        /* plain mode: seconds between lines (<= 0: 10) */
    app_progress_mode_t mode; /* AUTO: BAR if isatty(out), else PLAIN */
    const char *unit;         /* "samples" if NULL */
} app_progress_config_t;

typedef struct app_progress app_progress_t;

/* NULL only when out of memory. The config is copied. */
app_progress_t *app_progress_create(const app_progress_config_t *cfg);
/* Step `step` (1-based, counting the whole run) of epoch `epoch` (1-based)
 * is done; it processed `samples` samples with loss `loss` (NaN: none).
 * Shown loss = mean over the steps since the last line. */
void app_progress_update(app_progress_t *p, int64_t step, int64_t epoch, int64_t samples, double loss);
/* Print one line of text (e.g. an epoch's test accuracy) without breaking
 * the bar (it is cleared first and redrawn at the next update). */
void app_progress_print(app_progress_t *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Samples per second since creation (or since the resumed first step). */
double app_progress_rate(const app_progress_t *p);
/* Ends the bar's line (a final redraw and a newline). */
void app_progress_finish(app_progress_t *p);
void app_progress_destroy(app_progress_t *p);

/* ========================================================== metrics CSV
 * Columns: step,epoch,wall_s,loss,samples_per_s,test_acc then the app's own.
 * A NaN value is written as an empty field. Every row is flushed. */

typedef struct app_metrics app_metrics_t;

/* Open `path` (NULL: returns NULL with no error: no metrics wanted; check
 * mpr_last_error_code() when path is set). extra[n_extra]: names of the
 * app's additional columns (copied). resume_step < 0: start a new file;
 * >= 0: keep the existing file's rows with step <= resume_step (a resumed
 * run continues it; rows written after its checkpoint are dropped) and
 * append; a missing file or a different header starts a new one. */
app_metrics_t *app_metrics_open(const char *path, const char *const *extra, int n_extra, int64_t resume_step);
/* One row; extra: n_extra values (NULL: all empty). */
mpr_err_t app_metrics_write(app_metrics_t *m, int64_t step, int64_t epoch, double wall_s, double loss,
                            double samples_per_s, double test_acc, const double *extra);
void app_metrics_close(app_metrics_t *m);

/* =================================================================== plot */

/* Draw `csv_path` (app_metrics_open's format) into `png_path`: training loss
 * against wall time above, test accuracy against wall time below, with
 * gnuplot (Debian gnuplot-nox; the environment variable MPIRPC_GNUPLOT may
 * name another binary) run as a child process on a generated script.
 * Without gnuplot: MPR_ERR_UNSUPPORTED and a one-line warning on stderr
 * naming the package (not a crash); gnuplot failing: MPR_ERR_IO. */
mpr_err_t app_plot_metrics(const char *csv_path, const char *png_path, const char *title);
/* Columns y_cols[n_y] of `csv_path` (app_metrics_open's format, or any CSV
 * with a header) against column x_col, in one panel, into `png_path` (e.g.
 * an RL agent's rewards per episode; the last column is drawn on top,
 * thicker). Labels NULL: the column name / none. Errors as app_plot_metrics. */
mpr_err_t app_plot_series(const char *csv_path, const char *png_path, const char *title, const char *x_col,
                          const char *x_label, const char *const *y_cols, int n_y, const char *y_label);
/* The PNG path for `common`: plot_path, or metrics_path with its extension
 * replaced by ".png" (malloc'ed; caller frees), NULL when neither is set. */
char *app_plot_path(const app_common_t *common);

/* ============================================================ checkpoints
 * One .safetensors file per checkpoint, "<dir>/ckpt-<step, 10 digits>.safetensors",
 * holding whatever tensors the app puts in a dict (by convention "model.<name>"
 * and "optim.<key>", see app_dict_add_tensors and mpr_optimizer_state_export)
 * plus the run state below in its metadata ("app.step", ...). Written
 * atomically: a temporary file in the same folder, fsync, rename, fsync of
 * the folder, so a crash at any point leaves the previous checkpoint whole. */

typedef struct app_ckpt_state {
    int64_t step;          /* steps done in the whole run */
    int64_t epoch;         /* 0-based epoch the next step belongs to */
    int64_t step_in_epoch; /* steps of that epoch already done (the batches to skip) */
    double wall_s;         /* training wall time so far (the metrics' clock continues from it) */
    uint64_t seed;         /* the run's seed (data order: app_epoch_seed) */
} app_ckpt_state_t;

/* Write d (borrowed; its metadata gets the state keys added) and *st to
 * dir's checkpoint for st->step; creates dir (one level) if missing; then
 * deletes all but the newest `keep` (>= 1) checkpoints. */
mpr_err_t app_ckpt_save(const char *dir, mpr_tensor_dict_t *d, const app_ckpt_state_t *st, int keep);
/* The newest checkpoint in dir that reads back whole and has the state
 * keys: *d a new dict (caller destroys), *st its state, *path_out (may be
 * NULL) its malloc'ed path. Damaged files are skipped with a warning on
 * stderr. MPR_ERR_NOT_FOUND when there is none (or no dir). */
mpr_err_t app_ckpt_load_latest(const char *dir, mpr_tensor_dict_t **d, app_ckpt_state_t *st, char **path_out);

/* --resume, the part every app shares: the newest checkpoint of `dir`
 * (app_ckpt_load_latest) that belongs to this run: written with `seed`, and
 * for each pair of the NULL-terminated list `meta` ({key, value, key,
 * value, ..., NULL}) with that metadata value. *d (caller destroys), *st,
 * *path_out (malloc'ed, may be NULL) as app_ckpt_load_latest; a checkpoint
 * of another run is MPR_ERR_INVALID_ARG naming what differs, and nothing is
 * returned. */
mpr_err_t app_ckpt_load_run(const char *dir, uint64_t seed, const char *const *meta, mpr_tensor_dict_t **d,
                            app_ckpt_state_t *st, char **path_out);
/* Send checkpoint `d` (borrowed) as .safetensors bytes to each of the `n`
 * workers in `to` through the registered function `fn`, whose one argument
 * is those bytes ("y"); encoded once. Stops at the first failure. */
mpr_err_t app_ckpt_send(const mpr_tensor_dict_t *d, int n, const mpr_dest_t *to, const char *fn);

/* Put tensors[i] into d as "<prefix><names[i]>" (references taken by d). */
mpr_err_t app_dict_add_tensors(mpr_tensor_dict_t *d, const char *prefix, int n, const char *const *names,
                               mpr_tensor_t *const *tensors);
/* Copy d's "<prefix><names[i]>" into tensors[i] in place (same shapes and
 * dtypes; nothing written unless all match; see mpr_tensor_dict_copy_into). */
mpr_err_t app_dict_copy_into_tensors(const mpr_tensor_dict_t *d, const char *prefix, int n,
                                     const char *const *names, mpr_tensor_t *const *tensors);
/* The same for every named parameter of module m. */
mpr_err_t app_dict_add_module(mpr_tensor_dict_t *d, const char *prefix, mpr_module_t *m);
mpr_err_t app_dict_copy_into_module(const mpr_tensor_dict_t *d, const char *prefix, mpr_module_t *m);

/* Add every tensor and metadata entry of the .safetensors bytes buf[0, len)
 * to d (same names; existing entries replaced): e.g. the parts of a
 * checkpoint that several workers encoded. `what` names the source in
 * errors. */
mpr_err_t app_dict_merge_encoded(mpr_tensor_dict_t *d, const void *buf, size_t len, const char *what);

/* ============================================================ trainer sync
 * A barrier among the ranks that train, in which the leader does some work
 * (evaluate, write a checkpoint) while the others wait; the workers that do
 * not take part (e.g. parameter servers) keep serving. Over RPC: the
 * followers call an async function on the leader, which holds no pool
 * thread while they wait. */

/* Register the sync function: on every rank, before mpr_init. */
mpr_err_t app_sync_register(void);
/* One round: followers (my_rank != leader_rank) return when the leader's
 * work is done (MPR_ERR_REMOTE if it failed); the leader waits for
 * `followers` arrivals, runs work(arg) (NULL: none) and returns its result.
 * Every participant calls it the same number of times. */
mpr_err_t app_sync(int leader_rank, int my_rank, int followers, mpr_err_t (*work)(void *arg), void *arg);
/* Free the leader's bookkeeping (after mpr_shutdown). */
void app_sync_cleanup(void);

#endif
