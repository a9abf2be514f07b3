/* test_app_common.c — the apps' shared helper library (apps/common/app.h):
 * option parsing and its messages, the Fashion-MNIST error, shards and the
 * resumable data order, accuracy counting, progress lines, the metrics CSV
 * (and its resume), the gnuplot PNG (and a missing gnuplot), and atomic
 * checkpoints (keep, newest good one, damaged ones skipped). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "app.h"
#include "fmnist_models.h"
#include "mpirpc/tensor_ops.h"

/* A scratch folder per test. */
static char tmpdir[256];
static int make_tmpdir(void **state) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_app_common.XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    return 0;
}
static int remove_tmpdir(void **state) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- options ---- */

typedef struct {
    int64_t epochs;
    double lr;
    const char *optim;
    bool verbose;
    const char *name;
} app_opts_t;

static app_parse_result_t parse(app_opts_t *v, app_common_t *c, char *errbuf, size_t cap, ...) {
    char *argv[32] = {"prog"};
    int argc = 1;
    va_list ap;
    va_start(ap, cap);
    for (char *a; (a = va_arg(ap, char *));) argv[argc++] = a;
    va_end(ap);
    app_option_t opts[] = {
        {"epochs", APP_OPT_INT, &v->epochs, 1, 100, NULL, "passes over the data"},
        {"lr", APP_OPT_DOUBLE, &v->lr, 0, 10, NULL, "learning rate"},
        {"optimizer", APP_OPT_CHOICE, &v->optim, 0, 0, "sgd|adam|adamw", "optimizer"},
        {"verbose", APP_OPT_FLAG, &v->verbose, 0, 0, NULL, "say more"},
        {"name", APP_OPT_STRING, &v->name, 0, 0, NULL, "a name"},
        {0}};
    FILE *err = fmemopen(errbuf, cap, "w");
    char outbuf[8192] = "";
    FILE *out = fmemopen(outbuf, sizeof outbuf, "w");
    app_parse_result_t r = app_parse_options(argc, argv, "prog: test program", opts, c, out, err);
    fclose(err);
    fclose(out);
    if (r == APP_PARSE_HELP) snprintf(errbuf, cap, "%s", outbuf);
    return r;
}

static void test_options_values_and_defaults(void **state) {
    app_opts_t v = {.epochs = 2, .lr = 0.05, .optim = "sgd"};
    app_common_t c;
    char err[1024] = "";
    assert_int_equal(parse(&v, &c, err, sizeof err, NULL), APP_PARSE_OK);
    assert_int_equal(v.epochs, 2);
    assert_string_equal(v.optim, "sgd");
    assert_null(c.data_dir);
    assert_int_equal(c.seed, 0);
    assert_false(c.resume);
    assert_true(c.log_interval == 10.0);

    assert_int_equal(parse(&v, &c, err, sizeof err, "--epochs", "5", "--lr=0.125", "--optimizer", "adam",
                           "--verbose", "--name", "x", "--seed", "7", "--data", "/d", "--metrics", "m.csv",
                           "--checkpoint-dir", "ck", "--checkpoint-every", "100", "--resume", "--log-interval",
                           "0.5", NULL),
                     APP_PARSE_OK);
    assert_int_equal(v.epochs, 5);
    assert_true(v.lr == 0.125);
    assert_string_equal(v.optim, "adam");
    assert_true(v.verbose);
    assert_string_equal(v.name, "x");
    assert_int_equal(c.seed, 7);
    assert_string_equal(c.data_dir, "/d");
    assert_string_equal(c.metrics_path, "m.csv");
    assert_string_equal(c.checkpoint_dir, "ck");
    assert_int_equal(c.checkpoint_every, 100);
    assert_true(c.resume);
    assert_true(c.log_interval == 0.5);
    char *png = app_plot_path(&c);
    assert_string_equal(png, "m.png");
    free(png);
}

static void test_options_help(void **state) {
    app_opts_t v = {.epochs = 2, .lr = 0.05, .optim = "sgd"};
    app_common_t c;
    char out[8192] = "";
    assert_int_equal(parse(&v, &c, out, sizeof out, "--help", NULL), APP_PARSE_HELP);
    assert_non_null(strstr(out, "prog: test program"));
    assert_non_null(strstr(out, "--epochs N"));
    assert_non_null(strstr(out, "(default 2)"));
    assert_non_null(strstr(out, "sgd|adam|adamw"));
    assert_non_null(strstr(out, "--checkpoint-dir"));
    assert_non_null(strstr(out, "--resume"));
}

static void expect_error(const char *needle, ...) {
    char *argv[16] = {"prog"};
    int argc = 1;
    va_list ap;
    va_start(ap, needle);
    for (char *a; (a = va_arg(ap, char *));) argv[argc++] = a;
    va_end(ap);
    app_opts_t v = {.epochs = 2, .lr = 0.05, .optim = "sgd"};
    app_option_t opts[] = {{"epochs", APP_OPT_INT, &v.epochs, 1, 100, NULL, "e"},
                           {"lr", APP_OPT_DOUBLE, &v.lr, 0, 10, NULL, "l"},
                           {"optimizer", APP_OPT_CHOICE, &v.optim, 0, 0, "sgd|adam", "o"},
                           {0}};
    char buf[1024] = "";
    FILE *err = fmemopen(buf, sizeof buf, "w");
    app_common_t c;
    app_parse_result_t r = app_parse_options(argc, argv, NULL, opts, &c, NULL, err);
    fclose(err);
    print_message("message: %s", buf);
    assert_int_equal(r, APP_PARSE_ERROR);
    assert_non_null(strstr(buf, needle));
    assert_non_null(strstr(buf, "--help"));
    assert_int_equal(v.epochs, 2); /* a bad value is never stored */
}

static void test_options_errors(void **state) {
    expect_error("'--bogus'", "--bogus", NULL);
    expect_error("--epochs: expected an integer, got 'abc'", "--epochs", "abc", NULL);
    expect_error("--epochs: expected an integer, got '3x'", "--epochs", "3x", NULL);
    expect_error("--epochs: 0 is out of range [1, 100]", "--epochs", "0", NULL);
    expect_error("--lr: expected a number, got 'nan'", "--lr", "nan", NULL);
    expect_error("--lr: 11 is out of range", "--lr", "11", NULL);
    expect_error("--optimizer: 'lbfgs' is not one of sgd|adam", "--optimizer", "lbfgs", NULL);
    expect_error("--epochs needs a value", "--epochs", NULL);
    expect_error("unexpected argument 'stray'", "stray", NULL);
    expect_error("--resume needs --checkpoint-dir", "--resume", NULL);
    expect_error("--seed: -1 is out of range", "--seed", "-1", NULL);
}

/* ---- data ---- */

static void test_fmnist_missing_names_path_and_package(void **state) {
    app_dataset_t d;
    assert_int_equal(app_fmnist_load("/nonexistent/fmnist", true, &d), MPR_ERR_IO);
    assert_null(d.train_x);
    assert_null(d.test_y);
    assert_non_null(strstr(mpr_last_error(), "/nonexistent/fmnist/train-images-idx3-ubyte.gz"));
    assert_non_null(strstr(mpr_last_error(), "dataset-fashion-mnist"));
}

static void test_shard_rows(void **state) {
    mpr_tensor_t *t = mpr_arange(MPR_F32, 0, 10, 1);
    mpr_tensor_t *s = app_shard_rows(t, 1, 3); /* rows 1, 4, 7 */
    assert_non_null(s);
    assert_int_equal(mpr_tensor_shape(s)[0], 3);
    float v[3];
    assert_int_equal(mpr_copy_to_buffer(s, MPR_F32, v, sizeof v), MPR_OK);
    assert_true(v[0] == 1 && v[1] == 4 && v[2] == 7);
    assert_null(app_shard_rows(t, 3, 3));
    mpr_tensor_release(s);
    mpr_tensor_release(t);
}

/* The first value of the next batch. */
static float first_of_next(mpr_batch_iter_t *it) {
    mpr_tensor_t *x, *y;
    mpr_scope_begin();
    assert_true(mpr_batch_iter_next(it, &x, &y));
    float v[4];
    assert_int_equal(mpr_copy_to_buffer(x, MPR_F32, v, sizeof v), MPR_OK);
    mpr_scope_end();
    return v[0];
}

static void test_epoch_order_resumable(void **state) {
    mpr_tensor_t *x = mpr_arange(MPR_F32, 0, 64, 1);
    mpr_tensor_t *y = mpr_arange(MPR_I64, 0, 64, 1);
    mpr_batch_iter_t *full = app_epoch_batches(x, y, 4, 42, 3, 0, 0);
    assert_non_null(full);
    float seq[16];
    for (int i = 0; i < 16; i++) seq[i] = first_of_next(full);
    mpr_batch_iter_t *resumed = app_epoch_batches(x, y, 4, 42, 3, 0, 5);
    for (int i = 5; i < 16; i++) assert_true(first_of_next(resumed) == seq[i]);
    mpr_batch_iter_t *other = app_epoch_batches(x, y, 4, 42, 4, 0, 0); /* another epoch: another order */
    int same = 0;
    for (int i = 0; i < 16; i++) same += first_of_next(other) == seq[i];
    assert_true(same < 16);
    assert_true(app_epoch_seed(42, 3, 0) != app_epoch_seed(42, 3, 1));
    assert_null(app_epoch_batches(x, y, 4, 42, 3, 0, 17)); /* past the end */
    mpr_batch_iter_destroy(full);
    mpr_batch_iter_destroy(resumed);
    mpr_batch_iter_destroy(other);
    mpr_tensor_release(x);
    mpr_tensor_release(y);
}

static void test_count_correct(void **state) {
    float s[] = {0.1f, 0.9f, 0.8f, 0.2f, 0.3f, 0.7f};
    int64_t l[] = {1, 1, 1};
    mpr_tensor_t *scores = mpr_from_buffer(MPR_F32, 2, (int64_t[]){3, 2}, s);
    mpr_tensor_t *labels = mpr_from_buffer(MPR_I64, 1, (int64_t[]){3}, l);
    assert_int_equal(app_count_correct(scores, labels), 2);
    assert_int_equal(app_count_correct(scores, scores), -1);
    mpr_tensor_release(scores);
    mpr_tensor_release(labels);
}

/* ---- progress ---- */

static void test_progress_plain_and_bar(void **state) {
    char buf[4096] = "";
    FILE *f = fmemopen(buf, sizeof buf, "w");
    /* a long interval: only the run's last step is drawn (always), whatever the machine's load */
    app_progress_t *p = app_progress_create(&(app_progress_config_t){
        .out = f, .total_steps = 4, .epochs = 2, .interval_s = 1000, .mode = APP_PROGRESS_PLAIN});
    app_progress_update(p, 1, 1, 64, 2.0);
    app_progress_update(p, 2, 1, 64, 1.0);
    app_progress_print(p, "epoch %d: test accuracy %.4f", 1, 0.5);
    app_progress_update(p, 3, 2, 64, 0.5);
    app_progress_update(p, 4, 2, 64, 0.5); /* shown loss: the mean since the last line, 1.0 */
    app_progress_finish(p);
    assert_true(app_progress_rate(p) > 0);
    app_progress_destroy(p);
    fclose(f);
    print_message("%s", buf);
    assert_non_null(strstr(buf, "epoch 1: test accuracy 0.5000\n"));
    assert_non_null(strstr(buf, "epoch 2/2 step 4/4 (100.0%)"));
    assert_non_null(strstr(buf, "samples/s  loss 1.0000  ETA 0:00\n"));
    assert_null(strchr(buf, '\r'));

    memset(buf, 0, sizeof buf);
    f = fmemopen(buf, sizeof buf, "w");
    p = app_progress_create(&(app_progress_config_t){.out = f, .total_steps = 2, .mode = APP_PROGRESS_BAR});
    app_progress_update(p, 1, 1, 10, 1.0);
    app_progress_update(p, 2, 1, 10, 1.0);
    app_progress_print(p, "done");
    app_progress_finish(p);
    app_progress_destroy(p);
    fclose(f);
    assert_non_null(strstr(buf, "\r[########################] 2/2"));
    assert_non_null(strstr(buf, "\r\033[Kdone\n"));
}

/* ---- metrics ---- */

static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static void test_metrics_csv_and_resume(void **state) {
    char path[300];
    snprintf(path, sizeof path, "%s/m.csv", tmpdir);
    const char *extra[] = {"lr"};
    app_metrics_t *m = app_metrics_open(path, extra, 1, -1);
    assert_non_null(m);
    for (int s = 1; s <= 4; s++)
        assert_int_equal(app_metrics_write(m, s * 10, 1, s * 1.5, 1.0 / s, 1000, s == 4 ? 0.75 : NAN, (double[]){0.1}),
                         MPR_OK);
    app_metrics_close(m);
    assert_string_equal(slurp(path), "step,epoch,wall_s,loss,samples_per_s,test_acc,lr\n"
                                     "10,1,1.500,1,1000.0,,0.1\n"
                                     "20,1,3.000,0.5,1000.0,,0.1\n"
                                     "30,1,4.500,0.333333,1000.0,,0.1\n"
                                     "40,1,6.000,0.25,1000.0,0.7500,0.1\n");
    m = app_metrics_open(path, extra, 1, 20); /* resumed at step 20: later rows go */
    assert_int_equal(app_metrics_write(m, 30, 1, 4.0, 0.3, 900, NAN, NULL), MPR_OK);
    app_metrics_close(m);
    assert_string_equal(slurp(path), "step,epoch,wall_s,loss,samples_per_s,test_acc,lr\n"
                                     "10,1,1.500,1,1000.0,,0.1\n"
                                     "20,1,3.000,0.5,1000.0,,0.1\n"
                                     "30,1,4.000,0.3,900.0,,\n");
    m = app_metrics_open(path, NULL, 0, 20); /* other columns: a new file */
    app_metrics_close(m);
    assert_string_equal(slurp(path), "step,epoch,wall_s,loss,samples_per_s,test_acc\n");
    assert_null(app_metrics_open(NULL, NULL, 0, -1));
    assert_null(app_metrics_open("/nonexistent/dir/m.csv", NULL, 0, -1));
    assert_non_null(strstr(mpr_last_error(), "/nonexistent/dir/m.csv"));
}

/* ---- plot ---- */

static void test_plot_png(void **state) {
    char csv[300], png[300];
    snprintf(csv, sizeof csv, "%s/run.csv", tmpdir);
    snprintf(png, sizeof png, "%s/run.png", tmpdir);
    app_metrics_t *m = app_metrics_open(csv, NULL, 0, -1);
    for (int s = 1; s <= 20; s++)
        app_metrics_write(m, s, 1 + s / 10, s * 0.5, 2.0 / s, 1000, s % 10 == 0 ? 0.6 + 0.01 * s : NAN, NULL);
    app_metrics_close(m);
    if (access("/usr/bin/gnuplot", X_OK) == 0) {
        assert_int_equal(app_plot_metrics(csv, png, "test's plot"), MPR_OK);
        FILE *f = fopen(png, "rb");
        assert_non_null(f);
        unsigned char magic[8];
        assert_int_equal(fread(magic, 1, 8, f), 8);
        fclose(f);
        assert_memory_equal(magic, "\x89PNG\r\n\x1a\n", 8);
        struct stat st;
        assert_int_equal(stat(png, &st), 0);
        assert_true(st.st_size > 5000);
    } else {
        print_message("gnuplot not installed: only the missing-gnuplot case runs\n");
    }
    setenv("MPIRPC_GNUPLOT", "/nonexistent/gnuplot", 1);
    assert_int_equal(app_plot_metrics(csv, png, "x"), MPR_ERR_UNSUPPORTED);
    assert_non_null(strstr(mpr_last_error(), "gnuplot-nox"));
    unsetenv("MPIRPC_GNUPLOT");
}

/* ---- checkpoints ---- */

static void save_one(const char *dir, int64_t step, float value) {
    mpr_tensor_dict_t *d = mpr_tensor_dict_create();
    mpr_tensor_t *t = mpr_full(MPR_F32, 1, (int64_t[]){3}, value);
    const char *name = "w";
    assert_int_equal(app_dict_add_tensors(d, "model.", 1, &name, &t), MPR_OK);
    app_ckpt_state_t st = {.step = step, .epoch = step / 10, .step_in_epoch = step % 10, .wall_s = step * 0.25,
                           .seed = 18446744073709551615ULL};
    assert_int_equal(app_ckpt_save(dir, d, &st, 2), MPR_OK);
    mpr_tensor_release(t);
    mpr_tensor_dict_destroy(d);
}

static int count_ckpts(const char *dir) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -c '^ckpt-.*\\.safetensors$'", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    assert_int_equal(fscanf(p, "%d", &n), 1);
    pclose(p);
    return n;
}

static void test_checkpoints(void **state) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/ck", tmpdir);
    mpr_tensor_dict_t *d = NULL;
    app_ckpt_state_t st;
    assert_int_equal(app_ckpt_load_latest(dir, &d, &st, NULL), MPR_ERR_NOT_FOUND);
    save_one(dir, 5, 1.0f);
    save_one(dir, 12, 2.0f);
    save_one(dir, 23, 3.0f);
    assert_int_equal(count_ckpts(dir), 2); /* keep = 2 */
    char *path = NULL;
    assert_int_equal(app_ckpt_load_latest(dir, &d, &st, &path), MPR_OK);
    assert_non_null(strstr(path, "/ckpt-0000000023.safetensors"));
    assert_int_equal(st.step, 23);
    assert_int_equal(st.epoch, 2);
    assert_int_equal(st.step_in_epoch, 3);
    assert_true(st.wall_s == 23 * 0.25);
    assert_true(st.seed == 18446744073709551615ULL);
    mpr_tensor_t *into = mpr_zeros(MPR_F32, 1, (int64_t[]){3});
    const char *name = "w";
    assert_int_equal(app_dict_copy_into_tensors(d, "model.", 1, &name, &into), MPR_OK);
    float v[3];
    mpr_copy_to_buffer(into, MPR_F32, v, sizeof v);
    assert_true(v[0] == 3.0f && v[2] == 3.0f);
    assert_int_not_equal(app_dict_copy_into_tensors(d, "optim.", 1, &name, &into), MPR_OK);
    mpr_tensor_dict_destroy(d);

    /* The newest damaged (truncated mid-write by something else): the previous one is used. */
    assert_int_equal(truncate(path, 20), 0);
    free(path);
    /* A leftover temporary file is never read. */
    char tmp[400];
    snprintf(tmp, sizeof tmp, "%s/.ckpt-0000000099.tmp.1", dir);
    FILE *f = fopen(tmp, "w");
    fputs("junk", f);
    fclose(f);
    assert_int_equal(app_ckpt_load_latest(dir, &d, &st, NULL), MPR_OK);
    assert_int_equal(st.step, 12);
    assert_int_equal(app_dict_copy_into_tensors(d, "model.", 1, &name, &into), MPR_OK);
    mpr_copy_to_buffer(into, MPR_F32, v, sizeof v);
    assert_true(v[0] == 2.0f);
    mpr_tensor_dict_destroy(d);
    mpr_tensor_release(into);

    /* A module's parameters round trip by name. */
    mpr_module_t *lin = mpr_linear_create(3, 2, true, MPR_F32, NULL);
    mpr_module_t *lin2 = mpr_linear_create(3, 2, true, MPR_F32, NULL);
    d = mpr_tensor_dict_create();
    assert_int_equal(app_dict_add_module(d, "model.", lin), MPR_OK);
    assert_non_null(mpr_tensor_dict_get(d, "model.weight"));
    assert_int_equal(app_dict_copy_into_module(d, "model.", lin2), MPR_OK);
    assert_true(mpr_allclose(mpr_module_get_parameter(lin, "weight"), mpr_module_get_parameter(lin2, "weight"), 0, 0));
    mpr_tensor_dict_destroy(d);
    mpr_module_destroy(lin);
    mpr_module_destroy(lin2);
}

/* ---- the parameter-server apps' models ---- */

static void test_fmnist_models_split(void **state) {
    assert_int_equal(app_fmnist_model_stages("mlp"), 2);
    assert_int_equal(app_fmnist_model_stages("cnn"), 3);
    assert_int_equal(app_fmnist_model_stages("rnn"), 0);
    assert_null(app_fmnist_model_create("rnn", 0));
    assert_non_null(strstr(mpr_last_error(), "mlp|cnn"));
    assert_int_equal(app_fmnist_group_first(3, 2, 0), 0);
    assert_int_equal(app_fmnist_group_first(3, 2, 1), 1);
    assert_int_equal(app_fmnist_group_first(3, 2, 2), 3);
    const char *kinds[] = {"mlp", "cnn"};
    for (int k = 0; k < 2; k++) {
        mpr_module_t *whole = app_fmnist_model_create(kinds[k], 5);
        assert_non_null(whole);
        int stages = app_fmnist_model_stages(kinds[k]), i = 0;
        for (int g = 0; g < 2; g++) { /* two groups: the same parameters, in the same order */
            int first = app_fmnist_group_first(stages, 2, g), count = app_fmnist_group_first(stages, 2, g + 1) - first;
            mpr_module_t *group = app_fmnist_group_create(kinds[k], first, count, 5);
            assert_non_null(group);
            for (int j = 0; j < mpr_module_num_parameters(group); j++, i++)
                assert_true(mpr_allclose(mpr_module_parameter(group, j, NULL), mpr_module_parameter(whole, i, NULL), 0, 0));
            mpr_module_destroy(group);
        }
        assert_int_equal(i, mpr_module_num_parameters(whole));
        const char *name;
        mpr_module_parameter(whole, 0, &name);
        assert_string_equal(name, "0.0.weight");
        mpr_module_t *other = app_fmnist_model_create(kinds[k], 6); /* another seed: other numbers */
        assert_false(mpr_allclose(mpr_module_parameter(whole, 0, NULL), mpr_module_parameter(other, 0, NULL), 0, 0));
        mpr_scope_begin();
        int64_t shape_flat[] = {2, 784}, shape_img[] = {2, 1, 28, 28};
        mpr_tensor_t *x = mpr_zeros(MPR_F32, app_fmnist_model_flat(kinds[k]) ? 2 : 4,
                                    app_fmnist_model_flat(kinds[k]) ? shape_flat : shape_img);
        mpr_tensor_t *y = mpr_module_forward(whole, x);
        assert_non_null(y);
        assert_int_equal(mpr_tensor_shape(y)[1], 10);
        mpr_scope_end();
        mpr_module_destroy(other);
        mpr_module_destroy(whole);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options_values_and_defaults),
        cmocka_unit_test(test_options_help),
        cmocka_unit_test(test_options_errors),
        cmocka_unit_test(test_fmnist_missing_names_path_and_package),
        cmocka_unit_test(test_shard_rows),
        cmocka_unit_test(test_epoch_order_resumable),
        cmocka_unit_test(test_count_correct),
        cmocka_unit_test(test_fmnist_models_split),
        cmocka_unit_test(test_progress_plain_and_bar),
        cmocka_unit_test_setup_teardown(test_metrics_csv_and_resume, make_tmpdir, remove_tmpdir),
        cmocka_unit_test_setup_teardown(test_plot_png, make_tmpdir, remove_tmpdir),
        cmocka_unit_test_setup_teardown(test_checkpoints, make_tmpdir, remove_tmpdir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
