/* options.c — command-line parsing for the apps (app.h): the app's option
 * table plus the common options, through getopt_long, with typed, range-
 * checked values, --help, and exit codes 0 (help) / 2 (usage error).
 *
 * Invariants: a value pointer is written only with a value that passed its
 * check; every error message names the option (as the user typed it) and
 * ends with a pointer to --help; getopt's own messages are off (opterr = 0). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "app.h"

enum { HELP_ID = 'h', FIRST_ID = 256 };

int app_launch_rank(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

double app_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The common options, pointing into *c. */
static int common_table(app_common_t *c, app_option_t *t) {
    app_option_t rows[] = {
        {"data", APP_OPT_STRING, &c->data_dir, 0, 0, NULL, "dataset folder (default: the Debian package's)"},
        {"seed", APP_OPT_INT, &c->seed, 0, 9007199254740991.0, NULL, "seed of the model's initialization and the data order"},
        {"metrics", APP_OPT_STRING, &c->metrics_path, 0, 0, NULL, "write the metrics CSV here (and a PNG plot beside it)"},
        {"plot", APP_OPT_STRING, &c->plot_path, 0, 0, NULL, "PNG plot path (default: the metrics path with .png)"},
        {"checkpoint-dir", APP_OPT_STRING, &c->checkpoint_dir, 0, 0, NULL, "write checkpoints (model + optimizer) here"},
        {"checkpoint-every", APP_OPT_INT, &c->checkpoint_every, 0, 1e12, NULL, "steps between checkpoints (0: only at the end)"},
        {"resume", APP_OPT_FLAG, &c->resume, 0, 0, NULL, "continue from the newest checkpoint in --checkpoint-dir"},
        {"log-interval", APP_OPT_DOUBLE, &c->log_interval, 0.01, 86400, NULL, "seconds between progress lines when not on a terminal"},
        {"verbose", APP_OPT_FLAG, &c->verbose, 0, 0, NULL, "print each rank's worker name, host and cores at start"},
    };
    memcpy(t, rows, sizeof rows);
    return (int)(sizeof rows / sizeof rows[0]);
}

static void print_default(FILE *out, const app_option_t *o) {
    switch (o->kind) {
    case APP_OPT_FLAG: break;
    case APP_OPT_INT: fprintf(out, " (default %lld)", (long long)*(int64_t *)o->value); break;
    case APP_OPT_DOUBLE: fprintf(out, " (default %g)", *(double *)o->value); break;
    case APP_OPT_STRING:
    case APP_OPT_CHOICE: {
        const char *s = *(const char **)o->value;
        if (s) fprintf(out, " (default %s)", s);
        break;
    }
    }
}

static void print_option(FILE *out, const app_option_t *o) {
    char left[96];
    const char *arg = o->kind == APP_OPT_FLAG     ? ""
                      : o->kind == APP_OPT_INT    ? " N"
                      : o->kind == APP_OPT_DOUBLE ? " X"
                      : o->kind == APP_OPT_CHOICE ? " CHOICE"
                                                  : " VALUE";
    snprintf(left, sizeof left, "--%s%s", o->name, arg);
    fprintf(out, "  %-26s %s", left, o->help ? o->help : "");
    if (o->kind == APP_OPT_CHOICE) fprintf(out, ": %s", o->choices);
    if (o->kind == APP_OPT_INT || o->kind == APP_OPT_DOUBLE) fprintf(out, " [%g, %g]", o->min, o->max);
    print_default(out, o);
    fputc('\n', out);
}

static void usage(FILE *out, const char *summary, const app_option_t *opts, int n_app, const app_option_t *common,
                  int n_common) {
    if (summary) fprintf(out, "%s\n\n", summary);
    if (n_app) fprintf(out, "Options:\n");
    for (int i = 0; i < n_app; i++) print_option(out, &opts[i]);
    fprintf(out, "Common options:\n");
    for (int i = 0; i < n_common; i++) print_option(out, &common[i]);
    fprintf(out, "  %-26s %s\n", "--help", "print this help and exit");
}

static void complain(FILE *err, const char *prog, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void complain(FILE *err, const char *prog, const char *fmt, ...) {
    if (!err) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(err, "%s: ", prog);
    vfprintf(err, fmt, ap);
    fprintf(err, " (try --help)\n");
    va_end(ap);
}

static bool choice_ok(const char *choices, const char *v) {
    size_t len = strlen(v);
    for (const char *p = choices; p && *p;) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == len && strncmp(p, v, n) == 0) return true;
        p = bar ? bar + 1 : NULL;
    }
    return false;
}

/* Check and store the value of option o; false (after complaining) if bad. */
static bool store_value(const app_option_t *o, const char *v, FILE *err, const char *prog) {
    switch (o->kind) {
    case APP_OPT_FLAG: *(bool *)o->value = true; return true;
    case APP_OPT_STRING:
        if (!*v) {
            complain(err, prog, "option --%s: empty value", o->name);
            return false;
        }
        *(const char **)o->value = v;
        return true;
    case APP_OPT_CHOICE:
        if (!choice_ok(o->choices, v)) {
            complain(err, prog, "option --%s: '%s' is not one of %s", o->name, v, o->choices);
            return false;
        }
        *(const char **)o->value = v;
        return true;
    case APP_OPT_INT: {
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (!*v || *end || errno) {
            complain(err, prog, "option --%s: expected an integer, got '%s'", o->name, v);
            return false;
        }
        if ((double)x < o->min || (double)x > o->max) {
            complain(err, prog, "option --%s: %lld is out of range [%g, %g]", o->name, x, o->min, o->max);
            return false;
        }
        *(int64_t *)o->value = x;
        return true;
    }
    case APP_OPT_DOUBLE: {
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        if (!*v || *end || errno || !isfinite(x)) {
            complain(err, prog, "option --%s: expected a number, got '%s'", o->name, v);
            return false;
        }
        if (x < o->min || x > o->max) {
            complain(err, prog, "option --%s: %g is out of range [%g, %g]", o->name, x, o->min, o->max);
            return false;
        }
        *(double *)o->value = x;
        return true;
    }
    }
    return false;
}

app_parse_result_t app_parse_options(int argc, char **argv, const char *summary, app_option_t *opts,
                                     app_common_t *common, FILE *out, FILE *err) {
    *common = (app_common_t){.checkpoint_every = 0, .log_interval = 10.0};
    int n_app = 0;
    while (opts && opts[n_app].name) n_app++;
    app_option_t ctab[16];
    int n_common = common_table(common, ctab);
    const char *prog = argc > 0 && argv[0] ? argv[0] : "app";
    const char *slash = strrchr(prog, '/');
    if (slash) prog = slash + 1;

    int n = n_app + n_common;
    struct option *longs = calloc((size_t)n + 2, sizeof *longs);
    if (!longs) {
        complain(err, prog, "out of memory");
        return APP_PARSE_ERROR;
    }
    for (int i = 0; i < n; i++) {
        const app_option_t *o = i < n_app ? &opts[i] : &ctab[i - n_app];
        longs[i] = (struct option){o->name, o->kind == APP_OPT_FLAG ? no_argument : required_argument, NULL,
                                   FIRST_ID + i};
    }
    longs[n] = (struct option){"help", no_argument, NULL, HELP_ID};

    app_parse_result_t res = APP_PARSE_OK;
    opterr = 0;
    optind = 0; /* glibc: full reinitialization, so the parser can run again */
    for (;;) {
        int prev = optind ? optind : 1;
        int c = getopt_long(argc, argv, "+:h", longs, NULL);
        if (c == -1) break;
        if (c == HELP_ID) {
            if (out) usage(out, summary, opts, n_app, ctab, n_common);
            res = APP_PARSE_HELP;
            break;
        }
        if (c == '?' || c == ':') {
            const char *typed = prev < argc ? argv[prev] : "?";
            if (c == ':')
                complain(err, prog, "option %s needs a value", typed);
            else if (optopt && optopt < FIRST_ID)
                complain(err, prog, "unknown option '-%c'", optopt);
            else
                complain(err, prog, "unknown or ambiguous option '%s'", typed);
            res = APP_PARSE_ERROR;
            break;
        }
        int i = c - FIRST_ID;
        const app_option_t *o = i < n_app ? &opts[i] : &ctab[i - n_app];
        if (!store_value(o, optarg, err, prog)) {
            res = APP_PARSE_ERROR;
            break;
        }
    }
    if (res == APP_PARSE_OK && optind < argc) {
        complain(err, prog, "unexpected argument '%s'", argv[optind]);
        res = APP_PARSE_ERROR;
    }
    if (res == APP_PARSE_OK && common->resume && !common->checkpoint_dir) {
        complain(err, prog, "option --resume needs --checkpoint-dir");
        res = APP_PARSE_ERROR;
    }
    free(longs);
    return res;
}

void app_parse_options_or_exit(int argc, char **argv, const char *summary, app_option_t *opts,
                               app_common_t *common) {
    app_blas_choose_kernels(argv); /* may execute the program again, before getopt permutes argv */
    bool talk = app_launch_rank() == 0;
    app_parse_result_t r = app_parse_options(argc, argv, summary, opts, common, talk ? stdout : NULL,
                                             talk ? stderr : NULL);
    if (r == APP_PARSE_HELP) exit(0);
    if (r == APP_PARSE_ERROR) exit(2);
}
