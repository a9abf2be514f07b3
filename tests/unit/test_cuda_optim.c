/* test_cuda_optim.c — local optimizers over parameters on a CUDA device
 * (optim/cuda/optim_update.cu), when a GPU is visible:
 *  - every optimizer kind and option set of tests/data/ref_optim.safetensors
 *    (PyTorch 1.13's trajectories), in float32 and float64: 10 steps of a
 *    cuda:0 optimizer equal the same steps of a CPU optimizer bit for bit
 *    (and so PyTorch's within test_optim_ref's tolerances), through both the
 *    .grad path and explicit gradients;
 *  - optimizer state: exported from a cuda:0 optimizer after 4 steps (CPU
 *    tensors), imported into fresh cuda:0 and CPU optimizers, both continue
 *    bit-identically to the uninterrupted run;
 *  - errors: a CPU gradient for a cuda:0 parameter fails naming both devices
 *    and changes nothing.
 * Without a GPU (or without -DMPIRPC_CUDA=ON) each test is skipped with a
 * message; the CPU half of a run never needs one. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mpirpc/cuda.h"
#include "mpirpc/optim.h"
#include "mpirpc/tensor_io.h"
#include "optim_test_util.h"

static mpr_tensor_dict_t *ref;

static bool have_gpu(void) {
    if (mpr_cuda_device_count() > 0) return true;
    print_message("skipping: %s\n", mpr_cuda_is_built() ? "no CUDA device visible"
                                                         : "mpirpc built without CUDA (-DMPIRPC_CUDA=ON)");
    return false;
}

/* A caller-owned copy of t on `device` (a new tensor even when t is there). */
static mpr_tensor_t *copy_on(mpr_tensor_t *t, int device) {
    mpr_tensor_t *c = mpr_tensor_empty_on(device, mpr_tensor_dtype(t), mpr_tensor_ndim(t), mpr_tensor_shape(t));
    assert_non_null(c);
    bool prev = mpr_set_grad_enabled(false);
    mpr_scope_begin();
    mpr_err_t e = mpr_copy_(c, mpr_to_device(t, device));
    mpr_scope_end();
    mpr_set_grad_enabled(prev);
    if (e != MPR_OK) fail_msg("copy to device %d: %s", device, mpr_last_error());
    return c;
}

/* Whether gpu (any device) holds exactly cpu's bytes; prints the first difference. */
static bool same_bits(const char *what, mpr_tensor_t *gpu, mpr_tensor_t *cpu) {
    mpr_tensor_t *h = copy_on(gpu, -1);
    size_t es = mpr_dtype_size(mpr_tensor_dtype(cpu));
    int64_t n = mpr_tensor_numel(cpu);
    bool same = mpr_tensor_numel(h) == n;
    for (int64_t i = 0; same && i < n; i++)
        if (memcmp((char *)mpr_tensor_data(h) + i * es, (char *)mpr_tensor_data(cpu) + i * es, es) != 0) {
            print_error("%s[%lld]: cuda %.17g, cpu %.17g\n", what, (long long)i, ot_at(h, i), ot_at(cpu, i));
            same = false;
        }
    mpr_tensor_release(h);
    return same;
}

/* One case in one dtype on both devices: returns the steps that matched. */
static int run_case(const char *cs, const char *dt) {
    char key[160], kind[32];
    mpr_optim_options_t o;
    ot_case_options(ref, cs, kind, sizeof kind, &o);
    mpr_tensor_t *cp[OT_NP], *gp[OT_NP], *gs[OT_NP], *gg[OT_NP];
    ot_init_params(ref, dt, cp);
    for (int j = 0; j < OT_NP; j++) {
        gp[j] = copy_on(cp[j], 0);
        assert_int_equal(mpr_tensor_device(gp[j]), 0);
        assert_int_equal(mpr_set_requires_grad(gp[j], true), MPR_OK);
    }
    mpr_optimizer_t *co = mpr_optimizer_create(kind, cp, OT_NP, &o);
    mpr_optimizer_t *go = mpr_optimizer_create(kind, gp, OT_NP, &o);
    if (!co || !go) fail_msg("%s: %s", cs, mpr_last_error());
    int matched = 0;
    for (int s = 0; s < OT_STEPS; s++) {
        ot_grads_at(ref, dt, s, gs);
        for (int j = 0; j < OT_NP; j++) gg[j] = copy_on(gs[j], 0);
        assert_int_equal(mpr_optimizer_step_grads(co, gs, OT_NP), MPR_OK);
        if (s % 2 == 0) {
            if (mpr_optimizer_step_grads(go, gg, OT_NP) != MPR_OK) fail_msg("%s: %s", cs, mpr_last_error());
        } else {
            for (int j = 0; j < OT_NP; j++) assert_int_equal(mpr_set_grad(gp[j], gg[j]), MPR_OK);
            if (mpr_optimizer_step(go) != MPR_OK) fail_msg("%s: %s", cs, mpr_last_error());
        }
        bool all = true;
        for (int j = 0; j < OT_NP; j++) {
            snprintf(key, sizeof key, "%s %s step %d p%d", cs, dt, s + 1, j);
            all = same_bits(key, gp[j], cp[j]) && all;
            mpr_tensor_release(gs[j]);
            mpr_tensor_release(gg[j]);
        }
        matched += all;
    }
    mpr_optimizer_destroy(co);
    mpr_optimizer_destroy(go);
    for (int j = 0; j < OT_NP; j++) {
        mpr_tensor_release(cp[j]);
        mpr_tensor_release(gp[j]);
    }
    return matched;
}

static void test_trajectories_on_gpu(void **state) {
    (void)state;
    if (!have_gpu()) skip();
    const char *cases[64];
    int nc = ot_case_names(ref, cases, 64);
    assert_true(nc >= 15);
    int bad = 0;
    for (int c = 0; c < nc; c++) {
        int m32 = run_case(cases[c], "f32"), m64 = run_case(cases[c], "f64");
        printf("  %-24s cuda:0 = cpu bit for bit: f32 %d/%d steps, f64 %d/%d\n", cases[c], m32, OT_STEPS, m64,
               OT_STEPS);
        bad += (m32 != OT_STEPS) + (m64 != OT_STEPS);
    }
    assert_int_equal(bad, 0);
}

/* Steps [from, to) of the reference gradients (f32), moved to `device`, on opt. */
static void steps(mpr_optimizer_t *opt, int device, int from, int to) {
    mpr_tensor_t *gs[OT_NP], *gd[OT_NP];
    for (int s = from; s < to; s++) {
        ot_grads_at(ref, "f32", s, gs);
        for (int j = 0; j < OT_NP; j++) gd[j] = copy_on(gs[j], device);
        if (mpr_optimizer_step_grads(opt, gd, OT_NP) != MPR_OK) fail_msg("step %d: %s", s, mpr_last_error());
        for (int j = 0; j < OT_NP; j++) {
            mpr_tensor_release(gs[j]);
            mpr_tensor_release(gd[j]);
        }
    }
}

static void test_state_across_devices(void **state) {
    (void)state;
    if (!have_gpu()) skip();
    mpr_optim_options_t o;
    mpr_optim_options_default("adam", &o);
    o.lr = 0.01;
    o.amsgrad = true;
    o.weight_decay = 0.1;
    mpr_tensor_t *init[OT_NP], *full[OT_NP], *half[OT_NP], *resumed[OT_NP], *on_cpu[OT_NP];
    ot_init_params(ref, "f32", init);
    for (int j = 0; j < OT_NP; j++) full[j] = copy_on(init[j], 0);
    mpr_optimizer_t *uninterrupted = mpr_optimizer_create("adam", full, OT_NP, &o);
    assert_non_null(uninterrupted);
    steps(uninterrupted, 0, 0, OT_STEPS);
    /* 4 steps, export (CPU tensors), then continue in a fresh cuda:0 and a fresh CPU optimizer */
    for (int j = 0; j < OT_NP; j++) half[j] = copy_on(init[j], 0);
    mpr_optimizer_t *first = mpr_optimizer_create("adam", half, OT_NP, &o);
    assert_non_null(first);
    steps(first, 0, 0, 4);
    mpr_tensor_dict_t *d = mpr_tensor_dict_create();
    assert_int_equal(mpr_optimizer_state_export(first, d, "opt."), MPR_OK);
    assert_int_equal(mpr_tensor_device(mpr_tensor_dict_get(d, "opt.state.0.exp_avg")), -1);
    for (int j = 0; j < OT_NP; j++) {
        resumed[j] = copy_on(half[j], 0);
        on_cpu[j] = copy_on(half[j], -1);
    }
    mpr_optimizer_t *gpu2 = mpr_optimizer_create("adam", resumed, OT_NP, &o);
    mpr_optimizer_t *cpu2 = mpr_optimizer_create("adam", on_cpu, OT_NP, &o);
    assert_non_null(gpu2);
    assert_non_null(cpu2);
    if (mpr_optimizer_state_import(gpu2, d, "opt.") != MPR_OK) fail_msg("import: %s", mpr_last_error());
    assert_int_equal(mpr_optimizer_state_import(cpu2, d, "opt."), MPR_OK);
    steps(gpu2, 0, 4, OT_STEPS);
    steps(cpu2, -1, 4, OT_STEPS);
    for (int j = 0; j < OT_NP; j++) {
        mpr_tensor_t *want = copy_on(full[j], -1);
        assert_true(same_bits("resumed on cuda:0", resumed[j], want));
        assert_true(same_bits("resumed on the CPU", on_cpu[j], want));
        mpr_tensor_release(want);
    }
    mpr_tensor_dict_destroy(d);
    mpr_optimizer_destroy(uninterrupted);
    mpr_optimizer_destroy(first);
    mpr_optimizer_destroy(gpu2);
    mpr_optimizer_destroy(cpu2);
    for (int j = 0; j < OT_NP; j++) {
        mpr_tensor_release(init[j]);
        mpr_tensor_release(full[j]);
        mpr_tensor_release(half[j]);
        mpr_tensor_release(resumed[j]);
        mpr_tensor_release(on_cpu[j]);
    }
}

static void test_gradient_on_another_device(void **state) {
    (void)state;
    if (!have_gpu()) skip();
    mpr_tensor_t *cpu = mpr_ones(MPR_F32, MPR_SHAPE(3, 2)), *g = mpr_ones(MPR_F32, MPR_SHAPE(3, 2));
    mpr_tensor_t *p = copy_on(cpu, 0);
    mpr_optim_options_t o;
    mpr_optim_options_default("sgd", &o);
    o.lr = 0.5;
    o.momentum = 0.9;
    mpr_optimizer_t *opt = mpr_optimizer_create("sgd", &p, 1, &o);
    assert_non_null(opt);
    assert_int_equal(mpr_optimizer_step_grads(opt, &g, 1), MPR_ERR_INVALID_ARG);
    assert_non_null(strstr(mpr_last_error(), "on cpu"));
    assert_non_null(strstr(mpr_last_error(), "on cuda:0"));
    assert_true(same_bits("parameter after a refused step", p, cpu));
    /* the refused step left no state: the first real step is step 1 (buf = d) */
    mpr_tensor_t *gd = copy_on(g, 0);
    assert_int_equal(mpr_optimizer_step_grads(opt, &gd, 1), MPR_OK);
    mpr_tensor_t *h = copy_on(p, -1);
    for (int i = 0; i < 6; i++) assert_float_equal(((float *)mpr_tensor_data(h))[i], 0.5f, 0);
    mpr_optimizer_destroy(opt);
    mpr_tensor_release(h);
    mpr_tensor_release(gd);
    mpr_tensor_release(p);
    mpr_tensor_release(g);
    mpr_tensor_release(cpu);
}

static int setup(void **state) {
    (void)state;
    ref = ot_load_ref();
    return ref ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    mpr_tensor_dict_destroy(ref);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trajectories_on_gpu),
        cmocka_unit_test(test_state_across_devices),
        cmocka_unit_test(test_gradient_on_another_device),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
