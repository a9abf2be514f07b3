/* test_optim_state.c — optimizer state checkpoints and misuse:
 *  - for every reference case (every kind, f32 and f64): a run saved after
 *    step k (k = 1 and 4), restored into a NEW optimizer created with the
 *    kind's default options, continues bit-identically to a run that never
 *    stopped (options, lr, step counts and buffers all come back);
 *  - export/import with a prefix beside a model's tensors in one dict;
 *  - a failed load (other kind, wrong shape, missing buffer, bad option)
 *    changes nothing: the run still continues bit-identically;
 *  - a cosine schedule resumed across a checkpoint gives the same rates;
 *  - a parameter with no gradient is skipped and keeps no state;
 *  - unknown kinds and every PyTorch-rejected hyperparameter give
 *    MPR_ERR_INVALID_ARG with PyTorch's wording; defaults are PyTorch's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "mpirpc/optim.h"
#include "mpirpc/tensor_io.h"
#include "nn_test_util.h"
#include "optim_test_util.h"

static mpr_tensor_dict_t *ref;
static char tmpdir[256];

static void step_at(mpr_optimizer_t *opt, const char *dt, int s) {
    mpr_tensor_t *gs[OT_NP];
    ot_grads_at(ref, dt, s, gs);
    assert_int_equal(mpr_optimizer_step_grads(opt, gs, OT_NP), MPR_OK);
    for (int j = 0; j < OT_NP; j++) mpr_tensor_release(gs[j]);
}

static bool same_bits(mpr_tensor_t *const *a, mpr_tensor_t *const *b) {
    for (int j = 0; j < OT_NP; j++)
        if (memcmp(mpr_tensor_data(a[j]), mpr_tensor_data(b[j]), mpr_tensor_nbytes(a[j])) != 0) return false;
    return true;
}

static mpr_optimizer_t *make(const char *cs, mpr_tensor_t *const *ps, char *kind) {
    mpr_optim_options_t o;
    ot_case_options(ref, cs, kind, 32, &o);
    mpr_optimizer_t *opt = mpr_optimizer_create(kind, ps, OT_NP, &o);
    assert_non_null(opt);
    return opt;
}

/* Two identical runs of one reference case: a (never stopped) and b (saved,
 * restored, fed bad state...), stepped in lockstep. */
typedef struct {
    const char *dt;
    mpr_tensor_t *a[OT_NP], *b[OT_NP];
    mpr_optimizer_t *oa, *ob;
    char kind[32];
} twin_t;

static void twin_init(twin_t *t, const char *cs, const char *dt) {
    t->dt = dt;
    ot_init_params(ref, dt, t->a);
    ot_init_params(ref, dt, t->b);
    t->oa = make(cs, t->a, t->kind);
    t->ob = make(cs, t->b, t->kind);
}

/* Steps [from, to) on both; true when the parameters stayed bit-identical. */
static bool twin_steps(twin_t *t, int from, int to) {
    bool same = true;
    for (int s = from; s < to; s++) {
        step_at(t->oa, t->dt, s);
        step_at(t->ob, t->dt, s);
        same = same && same_bits(t->a, t->b);
    }
    return same;
}

static void twin_fini(twin_t *t) {
    mpr_optimizer_destroy(t->oa);
    mpr_optimizer_destroy(t->ob);
    for (int j = 0; j < OT_NP; j++) {
        mpr_tensor_release(t->a[j]);
        mpr_tensor_release(t->b[j]);
    }
}

/* Straight run vs. a run saved after `k` steps and restored into a fresh
 * optimizer (default options) over the same parameter tensors. */
static void check_resume(const char *cs, const char *dt, int k) {
    char path[400];
    twin_t t;
    twin_init(&t, cs, dt);
    /* a scheduler-like lr change before the save must survive it */
    mpr_optimizer_set_lr(t.oa, mpr_optimizer_get_lr(t.oa) * 0.5);
    mpr_optimizer_set_lr(t.ob, mpr_optimizer_get_lr(t.ob) * 0.5);
    twin_steps(&t, 0, k);
    snprintf(path, sizeof path, "%s/%s_%s.safetensors", tmpdir, cs, dt);
    assert_int_equal(mpr_optimizer_state_save(t.ob, path), MPR_OK);
    mpr_optimizer_destroy(t.ob);
    mpr_optim_options_t def;
    mpr_optim_options_default(t.kind, &def);
    if (strcmp(t.kind, "sgd") == 0) def.lr = 1;
    t.ob = mpr_optimizer_create(t.kind, t.b, OT_NP, &def);
    assert_non_null(t.ob);
    assert_int_equal(mpr_optimizer_state_load(t.ob, path), MPR_OK);
    assert_true(mpr_optimizer_get_lr(t.ob) == mpr_optimizer_get_lr(t.oa));
    if (!twin_steps(&t, k, OT_STEPS)) fail_msg("%s %s resumed after step %d differs", cs, dt, k);
    unlink(path);
    twin_fini(&t);
}

static void test_resume_bit_identical(void **state) {
    (void)state;
    const char *cases[64];
    int nc = ot_case_names(ref, cases, 64);
    assert_true(nc >= 15);
    for (int c = 0; c < nc; c++)
        for (int k = 1; k <= 4; k += 3) {
            check_resume(cases[c], "f32", k);
            check_resume(cases[c], "f64", k);
        }
}

/* Optimizer state next to model tensors in one dict / file, with a prefix. */
static void test_prefix_beside_model(void **state) {
    (void)state;
    char path[400];
    twin_t t;
    twin_init(&t, "adam_all", "f64");
    twin_steps(&t, 0, 3);
    mpr_tensor_dict_t *d = mpr_tensor_dict_create();
    assert_int_equal(mpr_tensor_dict_set(d, "0.weight", t.b[0]), MPR_OK);
    assert_int_equal(mpr_tensor_dict_set(d, "0.bias", t.b[1]), MPR_OK);
    assert_int_equal(mpr_optimizer_state_export(t.ob, d, "optim."), MPR_OK);
    assert_non_null(mpr_tensor_dict_get(d, "optim.state.0.exp_avg"));
    assert_non_null(mpr_tensor_dict_get(d, "optim.state.1.max_exp_avg_sq"));
    assert_string_equal(mpr_tensor_dict_get_meta(d, "optim.kind"), "adam");
    snprintf(path, sizeof path, "%s/model_and_optim.safetensors", tmpdir);
    assert_int_equal(mpr_safetensors_save(d, path), MPR_OK);
    mpr_tensor_dict_destroy(d);
    mpr_optimizer_destroy(t.ob);
    t.ob = mpr_optimizer_create("adam", t.b, OT_NP, &(mpr_optim_options_t){.lr = 1, .beta1 = 0.5, .beta2 = 0.5});
    assert_non_null(t.ob);
    d = mpr_safetensors_load(path);
    assert_non_null(d);
    assert_int_equal(mpr_optimizer_state_import(t.ob, d, NULL), MPR_ERR_NOT_FOUND); /* no unprefixed state */
    assert_int_equal(mpr_optimizer_state_import(t.ob, d, "optim."), MPR_OK);
    mpr_optim_options_t got;
    assert_int_equal(mpr_optimizer_get_options(t.ob, &got), MPR_OK);
    assert_true(got.amsgrad && got.maximize && got.beta1 == 0.8 && got.eps == 1e-6);
    mpr_tensor_dict_destroy(d);
    assert_true(twin_steps(&t, 3, OT_STEPS));
    unlink(path);
    twin_fini(&t);
}

/* A cosine schedule across a checkpoint: resumed as the header says, the
 * rates and parameters equal those of a run that never stopped. */
static void test_scheduler_resume(void **state) {
    (void)state;
    char path[400];
    twin_t t;
    twin_init(&t, "adamw_plain", "f64");
    mpr_lr_scheduler_t *sa = mpr_lr_cosine_create(t.oa, 4, 1e-4), *sb = mpr_lr_cosine_create(t.ob, 4, 1e-4);
    for (int s = 0; s < 3; s++) {
        twin_steps(&t, s, s + 1);
        mpr_lr_scheduler_step(sa);
        mpr_lr_scheduler_step(sb);
    }
    snprintf(path, sizeof path, "%s/sched.safetensors", tmpdir);
    assert_int_equal(mpr_optimizer_state_save(t.ob, path), MPR_OK);
    int64_t epoch = mpr_lr_scheduler_last_epoch(sb);
    mpr_lr_scheduler_destroy(sb);
    mpr_optimizer_destroy(t.ob);
    t.ob = make("adamw_plain", t.b, t.kind);
    sb = mpr_lr_cosine_create(t.ob, 4, 1e-4);
    assert_int_equal(mpr_optimizer_state_load(t.ob, path), MPR_OK);
    assert_int_equal(mpr_lr_scheduler_set_last_epoch(sb, epoch), MPR_OK);
    for (int s = 3; s < OT_STEPS; s++) {
        assert_true(twin_steps(&t, s, s + 1));
        mpr_lr_scheduler_step(sa);
        mpr_lr_scheduler_step(sb);
        assert_true(mpr_optimizer_get_lr(t.oa) == mpr_optimizer_get_lr(t.ob));
    }
    unlink(path);
    mpr_lr_scheduler_destroy(sa);
    mpr_lr_scheduler_destroy(sb);
    twin_fini(&t);
}

/* Import of dict `d` must fail with `code` mentioning `needle`. */
static void expect_import_fails(mpr_optimizer_t *opt, mpr_tensor_dict_t *d, mpr_err_t code, const char *needle) {
    assert_int_equal(mpr_optimizer_state_import(opt, d, NULL), code);
    if (!strstr(mpr_last_error(), needle)) fail_msg("'%s' does not mention '%s'", mpr_last_error(), needle);
}

static void test_bad_state_changes_nothing(void **state) {
    (void)state;
    twin_t t;
    twin_init(&t, "rmsprop_all", "f32");
    twin_steps(&t, 0, 2);
    mpr_optimizer_t *ob = t.ob;
    mpr_tensor_dict_t *good = mpr_tensor_dict_create();
    assert_int_equal(mpr_optimizer_state_export(ob, good, NULL), MPR_OK);
    /* another kind's state */
    mpr_optimizer_t *other = mpr_optimizer_create("adagrad", t.a, OT_NP, &(mpr_optim_options_t){.lr = 0.1});
    mpr_tensor_dict_t *d = mpr_tensor_dict_create();
    assert_int_equal(mpr_optimizer_state_export(other, d, NULL), MPR_OK);
    expect_import_fails(ob, d, MPR_ERR_INVALID_ARG, "saved by a 'adagrad' optimizer");
    mpr_tensor_dict_destroy(d);
    mpr_optimizer_destroy(other);
    /* wrong shape, unknown key, index out of range, missing buffer, bad option */
    mpr_tensor_t *wrong = mpr_zeros(MPR_F32, MPR_SHAPE(4));
    struct {
        const char *name;
        mpr_err_t code;
        const char *needle;
    } bad[] = {{"state.0.square_avg", MPR_ERR_SHAPE, "is float32 [4] but parameter 0"},
               {"state.0.exp_avg", MPR_ERR_INVALID_ARG, "unknown entry 'state.0.exp_avg'"},
               {"state.7.square_avg", MPR_ERR_INVALID_ARG, "names no parameter"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        void *buf;
        size_t len;
        assert_int_equal(mpr_safetensors_encode(good, &buf, &len), MPR_OK);
        d = mpr_safetensors_decode(buf, len, "copy");
        free(buf);
        assert_int_equal(mpr_tensor_dict_set(d, bad[i].name, wrong), MPR_OK);
        expect_import_fails(ob, d, bad[i].code, bad[i].needle);
        mpr_tensor_dict_destroy(d);
    }
    mpr_tensor_release(wrong);
    d = mpr_tensor_dict_create();
    assert_int_equal(mpr_optimizer_state_export(ob, d, NULL), MPR_OK);
    assert_int_equal(mpr_tensor_dict_set_meta(d, "centered", "maybe"), MPR_OK);
    expect_import_fails(ob, d, MPR_ERR_DECODE, "not true/false");
    assert_int_equal(mpr_tensor_dict_set_meta(d, "centered", "true"), MPR_OK);
    assert_int_equal(mpr_tensor_dict_set_meta(d, "alpha", "-1"), MPR_OK);
    expect_import_fails(ob, d, MPR_ERR_INVALID_ARG, "Invalid alpha value: -1");
    mpr_tensor_dict_destroy(d);
    /* a stepped parameter without its buffers: build a dict with steps only */
    d = mpr_tensor_dict_create();
    assert_int_equal(mpr_optimizer_state_export(ob, d, NULL), MPR_OK);
    mpr_tensor_dict_t *steps_only = mpr_tensor_dict_create();
    for (size_t i = 0; i < mpr_tensor_dict_count(d); i++)
        if (strstr(mpr_tensor_dict_name(d, i), ".step"))
            assert_int_equal(mpr_tensor_dict_set(steps_only, mpr_tensor_dict_name(d, i), mpr_tensor_dict_tensor(d, i)),
                             MPR_OK);
    const char *keys[] = {"kind", "format", "lr", "momentum", "dampening", "weight_decay", "beta1", "beta2", "eps",
                          "alpha", "lr_decay", "initial_accumulator_value", "nesterov", "amsgrad", "centered",
                          "maximize"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        assert_int_equal(mpr_tensor_dict_set_meta(steps_only, keys[i], mpr_tensor_dict_get_meta(d, keys[i])), MPR_OK);
    expect_import_fails(ob, steps_only, MPR_ERR_NOT_FOUND, "stepped 2 times but has no 'square_avg'");
    mpr_tensor_dict_destroy(steps_only);
    mpr_tensor_dict_destroy(d);
    assert_int_equal(mpr_optimizer_state_load(ob, "/nonexistent-mpirpc/x.safetensors"), MPR_ERR_IO);
    assert_int_equal(mpr_optimizer_state_save(ob, "/nonexistent-mpirpc/x.safetensors"), MPR_ERR_IO);
    /* after all that, b still follows a */
    assert_true(twin_steps(&t, 2, OT_STEPS));
    mpr_tensor_dict_destroy(good);
    twin_fini(&t);
}

/* A NULL gradient skips its parameter: unchanged, and no state is exported for it. */
static void test_skip_keeps_no_state(void **state) {
    (void)state;
    const char *kinds[] = {"sgd", "adagrad", "adam", "adamw", "rmsprop"};
    for (int k = 0; k < 5; k++) {
        mpr_tensor_t *ps[OT_NP], *gs[OT_NP];
        ot_init_params(ref, "f64", ps);
        mpr_tensor_t *before = ot_copy(ref, "init.f64.p1", -1);
        mpr_optim_options_t o;
        mpr_optim_options_default(kinds[k], &o);
        o.lr = 0.1;
        o.momentum = strcmp(kinds[k], "adam") && strcmp(kinds[k], "adamw") && strcmp(kinds[k], "adagrad") ? 0.9 : 0;
        mpr_optimizer_t *opt = mpr_optimizer_create(kinds[k], ps, OT_NP, &o);
        assert_non_null(opt);
        assert_string_equal(mpr_optimizer_kind(opt), kinds[k]);
        ot_grads_at(ref, "f64", 0, gs);
        assert_int_equal(mpr_optimizer_step_grads(opt, (mpr_tensor_t *[]){gs[0], NULL}, OT_NP), MPR_OK);
        assert_memory_equal(mpr_tensor_data(ps[1]), mpr_tensor_data(before), mpr_tensor_nbytes(before));
        mpr_tensor_dict_t *d = mpr_tensor_dict_create();
        assert_int_equal(mpr_optimizer_state_export(opt, d, NULL), MPR_OK);
        assert_non_null(mpr_tensor_dict_get(d, "state.0.step"));
        assert_null(mpr_tensor_dict_get(d, "state.1.step"));
        assert_int_equal(*(const int64_t *)mpr_tensor_data(mpr_tensor_dict_get(d, "state.0.step")), 1);
        mpr_tensor_dict_destroy(d);
        mpr_optimizer_destroy(opt);
        for (int j = 0; j < OT_NP; j++) {
            mpr_tensor_release(ps[j]);
            mpr_tensor_release(gs[j]);
        }
        mpr_tensor_release(before);
    }
}

static void expect_create_fails(const char *kind, mpr_optim_options_t o, const char *needle) {
    mpr_tensor_t *p = mpr_ones(MPR_F32, MPR_SHAPE(2));
    mpr_optimizer_t *opt = mpr_optimizer_create(kind, &p, 1, &o);
    if (opt) fail_msg("%s accepted options it should reject ('%s')", kind, needle);
    assert_int_equal(mpr_last_error_code(), MPR_ERR_INVALID_ARG);
    if (!strstr(mpr_last_error(), needle)) fail_msg("'%s' does not mention '%s'", mpr_last_error(), needle);
    mpr_tensor_release(p);
}

static mpr_optim_options_t def(const char *kind) {
    mpr_optim_options_t o;
    mpr_optim_options_default(kind, &o);
    return o;
}

static void test_options_and_errors(void **state) {
    (void)state;
    /* PyTorch 1.13's defaults */
    mpr_optim_options_t o = def("adam");
    assert_true(o.lr == 1e-3 && o.beta1 == 0.9 && o.beta2 == 0.999 && o.eps == 1e-8 && o.weight_decay == 0 &&
                !o.amsgrad && !o.maximize);
    o = def("adamw");
    assert_true(o.lr == 1e-3 && o.weight_decay == 1e-2 && o.eps == 1e-8);
    o = def("adagrad");
    assert_true(o.lr == 1e-2 && o.eps == 1e-10 && o.lr_decay == 0 && o.initial_accumulator_value == 0);
    o = def("rmsprop");
    assert_true(o.lr == 1e-2 && o.alpha == 0.99 && o.eps == 1e-8 && o.momentum == 0 && !o.centered);
    o = def("sgd");
    assert_true(isnan(o.lr) && o.momentum == 0 && !o.nesterov);
    expect_create_fails("sgd", o, "lr is required");
    /* unknown kind */
    mpr_optim_options_default("lbfgs", &o);
    assert_int_equal(mpr_last_error_code(), MPR_ERR_INVALID_ARG);
    assert_true(o.lr == 0 && o.eps == 0);
    expect_create_fails("Adam", def("adam"), "unknown optimizer kind 'Adam' (known: sgd, adagrad, adam, adamw, rmsprop)");
    /* what PyTorch rejects */
    struct {
        const char *kind, *field, *needle;
        double v;
    } bad[] = {
        {"sgd", "lr", "Invalid learning rate: -0.1", -0.1},
        {"sgd", "momentum", "Invalid momentum value: -1", -1},
        {"sgd", "weight_decay", "Invalid weight_decay value: -1", -1},
        {"adagrad", "lr", "Invalid learning rate", -1},
        {"adagrad", "lr_decay", "Invalid lr_decay value", -1},
        {"adagrad", "initial_accumulator_value", "Invalid initial_accumulator_value value", -1},
        {"adagrad", "eps", "Invalid epsilon value", -1},
        {"adam", "beta1", "Invalid beta parameter at index 0: 1", 1},
        {"adam", "beta2", "Invalid beta parameter at index 1: -0.5", -0.5},
        {"adam", "eps", "Adam: Invalid epsilon value: -1e-08", -1e-8},
        {"adam", "weight_decay", "Invalid weight_decay value", -0.01},
        {"adamw", "beta2", "AdamW: Invalid beta parameter at index 1", 1.5},
        {"adamw", "lr", "AdamW: Invalid learning rate", NAN},
        {"rmsprop", "alpha", "RMSprop: Invalid alpha value", -0.1},
        {"rmsprop", "momentum", "Invalid momentum value", -0.9},
        {"rmsprop", "eps", "Invalid epsilon value", -1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o = def(bad[i].kind);
        if (strcmp(bad[i].kind, "sgd") == 0) o.lr = 0.1;
#define SET(f) \
    if (strcmp(bad[i].field, #f) == 0) o.f = bad[i].v;
        SET(lr) SET(momentum) SET(weight_decay) SET(lr_decay) SET(initial_accumulator_value) SET(eps) SET(beta1)
        SET(beta2) SET(alpha)
#undef SET
        expect_create_fails(bad[i].kind, o, bad[i].needle);
    }
    o = def("sgd");
    o.lr = 0.1;
    o.nesterov = true;
    expect_create_fails("sgd", o, "Nesterov momentum requires a momentum and zero dampening");
    o.momentum = 0.9;
    o.dampening = 0.1;
    expect_create_fails("sgd", o, "Nesterov");
    /* lr == 0 is allowed (as in PyTorch) and moves nothing */
    mpr_tensor_t *p = mpr_ones(MPR_F64, MPR_SHAPE(2)), *g = mpr_ones(MPR_F64, MPR_SHAPE(2));
    o = def("adam");
    o.lr = 0;
    mpr_optimizer_t *opt = mpr_optimizer_create("adam", &p, 1, &o);
    assert_non_null(opt);
    assert_string_equal(mpr_optimizer_name(opt), "Adam");
    assert_int_equal(mpr_optimizer_step_grads(opt, &g, 1), MPR_OK);
    assert_true(((const double *)mpr_tensor_data(p))[0] == 1.0);
    mpr_optimizer_destroy(opt);
    /* bad parameters are rejected as for SGD */
    mpr_tensor_t *i64 = mpr_zeros(MPR_I64, MPR_SHAPE(2));
    assert_null(mpr_optimizer_create("rmsprop", &i64, 1, &(mpr_optim_options_t){.lr = 0.1, .alpha = 0.9}));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_DTYPE);
    assert_null(mpr_optimizer_create("rmsprop", &p, 0, &(mpr_optim_options_t){.lr = 0.1, .alpha = 0.9}));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_INVALID_ARG);
    /* schedulers */
    opt = mpr_optimizer_create("adam", &p, 1, &o);
    assert_null(mpr_lr_step_create(opt, 0, 0.1));
    assert_int_equal(mpr_last_error_code(), MPR_ERR_INVALID_ARG);
    assert_null(mpr_lr_cosine_create(opt, -3, 0));
    assert_non_null(strstr(mpr_last_error(), "T_max must be >= 1"));
    mpr_lr_scheduler_t *s = mpr_lr_step_create(opt, 2, 0.5);
    assert_int_equal(mpr_lr_scheduler_set_last_epoch(s, -1), MPR_ERR_INVALID_ARG);
    assert_int_equal(mpr_lr_scheduler_set_last_epoch(s, 5), MPR_OK);
    assert_int_equal(mpr_lr_scheduler_last_epoch(s), 5);
    mpr_lr_scheduler_destroy(s);
    mpr_lr_scheduler_destroy(NULL);
    mpr_optimizer_destroy(opt);
    mpr_tensor_release(p);
    mpr_tensor_release(g);
    mpr_tensor_release(i64);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_bit_identical), cmocka_unit_test(test_prefix_beside_model),
        cmocka_unit_test(test_bad_state_changes_nothing), cmocka_unit_test(test_skip_keeps_no_state),
        cmocka_unit_test(test_options_and_errors), cmocka_unit_test(test_scheduler_resume),
    };
    snprintf(tmpdir, sizeof tmpdir, "/tmp/mpirpc_optim_state_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    ref = ot_load_ref();
    if (!ref) return 1;
    int rc = tu_run_group_no_leaks(tests);
    mpr_tensor_dict_destroy(ref);
    rmdir(tmpdir);
    return rc;
}
