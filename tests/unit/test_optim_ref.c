/* test_optim_ref.c — every optimizer kind and option set against PyTorch
 * 1.13's 10-step trajectories in tests/data/ref_optim.safetensors (written
 * by tests/ref/gen_optim_refs.py): parameters after every step within 1e-6
 * relative (float32) / 1e-12 (float64); StepLR and CosineAnnealingLR rates
 * against PyTorch's within 1e-12 relative. Steps alternate between .grad
 * (mpr_optimizer_step) and explicit gradients (mpr_optimizer_step_grads), so
 * both paths are held to the reference. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "mpirpc/optim.h"
#include "mpirpc/tensor_io.h"
#include "nn_test_util.h"
#include "optim_test_util.h"

static mpr_tensor_dict_t *ref;


/* Relative error of a against b (b never near zero in the reference). */
static double rel_err(double a, double b) { return fabs(a - b) / fabs(b); }

/* One case in one dtype: 10 steps, compared after each. Returns max rel error. */
static double run_case(const char *cs, const char *dt, double tol) {
    char key[160], kind[32];
    mpr_optim_options_t o;
    ot_case_options(ref, cs, kind, sizeof kind, &o);
    mpr_tensor_t *ps[OT_NP], *gs[OT_NP];
    ot_init_params(ref, dt, ps);
    mpr_optimizer_t *opt = mpr_optimizer_create(kind, ps, OT_NP, &o);
    if (!opt) fail_msg("%s: %s", cs, mpr_last_error());
    double worst = 0;
    for (int s = 0; s < OT_STEPS; s++) {
        ot_grads_at(ref, dt, s, gs);
        if (s % 2 == 0) {
            assert_int_equal(mpr_optimizer_step_grads(opt, gs, OT_NP), MPR_OK);
        } else {
            for (int j = 0; j < OT_NP; j++) assert_int_equal(mpr_set_grad(ps[j], gs[j]), MPR_OK);
            assert_int_equal(mpr_optimizer_step(opt), MPR_OK);
        }
        for (int j = 0; j < OT_NP; j++) {
            mpr_tensor_release(gs[j]);
            snprintf(key, sizeof key, "%s.%s.p%d", cs, dt, j);
            mpr_tensor_t *want = mpr_tensor_dict_get(ref, key);
            assert_non_null(want);
            int64_t n = mpr_tensor_numel(ps[j]);
            for (int64_t i = 0; i < n; i++) {
                double a = ot_at(ps[j], i), b = ot_at(want, s * n + i);
                double e = rel_err(a, b);
                if (!(e <= tol))
                    fail_msg("%s %s step %d p%d[%lld]: %.17g, PyTorch %.17g (rel %.3g > %g)", cs, dt, s + 1, j,
                             (long long)i, a, b, e, tol);
                if (e > worst) worst = e;
            }
        }
    }
    mpr_optimizer_destroy(opt);
    for (int j = 0; j < OT_NP; j++) mpr_tensor_release(ps[j]);
    return worst;
}

static void test_trajectories(void **state) {
    (void)state;
    const char *cases[64];
    int nc = ot_case_names(ref, cases, 64);
    assert_true(nc >= 15);
    bool seen[5] = {0};
    const char *kinds[5] = {"sgd", "adagrad", "adam", "adamw", "rmsprop"};
    for (int c = 0; c < nc; c++) {
        double e32 = run_case(cases[c], "f32", 1e-6), e64 = run_case(cases[c], "f64", 1e-12);
        printf("  %-24s max rel err f32 %.2e  f64 %.2e\n", cases[c], e32, e64);
        for (int k = 0; k < 5; k++)
            if (strncmp(cases[c], kinds[k], strlen(kinds[k])) == 0 && cases[c][strlen(kinds[k])] == '_')
                seen[k] = true;
    }
    for (int k = 0; k < 5; k++)
        if (!seen[k]) fail_msg("no reference case for %s", kinds[k]);
}

static void test_schedulers(void **state) {
    (void)state;
    const char *names[] = {"step", "cosine", "cosine_long"};
    for (int i = 0; i < 3; i++) {
        char key[64];
        snprintf(key, sizeof key, "sched.%s", names[i]);
        const char *spec = mpr_tensor_dict_get_meta(ref, key);
        mpr_tensor_t *want = mpr_tensor_dict_get(ref, key);
        assert_non_null(spec);
        assert_non_null(want);
        double lr = ot_spec_num(spec, "lr"), steps = ot_spec_num(spec, "steps");
        mpr_tensor_t *p = mpr_zeros(MPR_F64, MPR_SHAPE(1));
        mpr_optim_options_t o;
        mpr_optim_options_default("sgd", &o);
        o.lr = lr;
        mpr_optimizer_t *opt = mpr_optimizer_create("sgd", &p, 1, &o);
        assert_non_null(opt);
        mpr_lr_scheduler_t *s =
            strstr(spec, "kind=step")
                ? mpr_lr_step_create(opt, (int64_t)ot_spec_num(spec, "step_size"), ot_spec_num(spec, "gamma"))
                : mpr_lr_cosine_create(opt, (int64_t)ot_spec_num(spec, "t_max"), ot_spec_num(spec, "eta_min"));
        assert_non_null(s);
        assert_int_equal(mpr_lr_scheduler_last_epoch(s), 0);
        double worst = 0;
        for (int k = 0; k < (int)steps; k++) {
            assert_int_equal(mpr_lr_scheduler_step(s), MPR_OK);
            double got = mpr_optimizer_get_lr(opt), w = ot_at(want, k);
            double e = w == 0 ? fabs(got) : rel_err(got, w);
            if (!(e <= 1e-12)) fail_msg("%s epoch %d: lr %.17g, PyTorch %.17g", names[i], k + 1, got, w);
            if (e > worst) worst = e;
        }
        assert_int_equal(mpr_lr_scheduler_last_epoch(s), (int64_t)steps);
        printf("  sched %-12s max rel err %.2e\n", names[i], worst);
        mpr_lr_scheduler_destroy(s);
        mpr_optimizer_destroy(opt);
        mpr_tensor_release(p);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trajectories),
        cmocka_unit_test(test_schedulers),
    };
    ref = ot_load_ref();
    int rc = tu_run_group_no_leaks(tests);
    mpr_tensor_dict_destroy(ref);
    return rc;
}
