/* test_optim_interop.c — the optimizer checkpoint format is PyTorch's: for
 * every reference case (every kind and option set, f32 and f64) the C state
 * saved after 4 of the 10 steps, with the parameters then, is loaded by
 * tests/ref/check_optim_interop.py into torch.optim.<Kind>.load_state_dict,
 * and PyTorch's remaining 6 steps end where PyTorch's uninterrupted run ends
 * (1e-6 relative in float32, 1e-12 in float64). Skipped with a message when
 * /usr/bin/python3 with torch is not available. */
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

static bool have_python_torch(void) {
    if (access("/usr/bin/python3", X_OK) != 0) return false;
    return system("/usr/bin/python3 -c 'import numpy, torch' >/dev/null 2>&1") == 0;
}

/* Run `cs` for 4 steps in dtype dt and write its state and parameters. */
static void write_case(const char *cs, const char *dt) {
    char path[512];
    char kind[32];
    mpr_optim_options_t o;
    ot_case_options(ref, cs, kind, sizeof kind, &o);
    mpr_tensor_t *ps[OT_NP], *gs[OT_NP];
    ot_init_params(ref, dt, ps);
    mpr_optimizer_t *opt = mpr_optimizer_create(kind, ps, OT_NP, &o);
    assert_non_null(opt);
    for (int s = 0; s < 4; s++) {
        ot_grads_at(ref, dt, s, gs);
        assert_int_equal(mpr_optimizer_step_grads(opt, gs, OT_NP), MPR_OK);
        for (int j = 0; j < OT_NP; j++) mpr_tensor_release(gs[j]);
    }
    snprintf(path, sizeof path, "%s/%s.%s.state.safetensors", tmpdir, cs, dt);
    assert_int_equal(mpr_optimizer_state_save(opt, path), MPR_OK);
    snprintf(path, sizeof path, "%s/%s.%s.params.safetensors", tmpdir, cs, dt);
    assert_int_equal(mpr_safetensors_save_list(path, OT_NP, (const char *[]){"p0", "p1"}, ps), MPR_OK);
    mpr_optimizer_destroy(opt);
    for (int j = 0; j < OT_NP; j++) mpr_tensor_release(ps[j]);
}

static void test_torch_resumes_c_state(void **state) {
    (void)state;
    if (!have_python_torch()) {
        print_message("skipped: /usr/bin/python3 with numpy and torch is not available\n");
        skip();
    }
    const char *cases[64];
    int nc = ot_case_names(ref, cases, 64);
    assert_true(nc >= 15);
    for (int c = 0; c < nc; c++) {
        write_case(cases[c], "f32");
        write_case(cases[c], "f64");
    }
    const char *dir = getenv("MPIRPC_TEST_DATA");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/../ref/check_optim_interop.py' '%s' '%s/ref_optim.safetensors' 2>&1",
             dir ? dir : "tests/data", tmpdir, dir ? dir : "tests/data");
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[4096], want[64];
    snprintf(want, sizeof want, "optim interop ok %d\n", 2 * nc);
    bool ok = false;
    while (fgets(line, sizeof line, p)) {
        print_message("python: %s", line);
        if (strcmp(line, want) == 0) ok = true;
    }
    assert_int_equal(pclose(p), 0);
    assert_true(ok);
    char rm[400];
    snprintf(rm, sizeof rm, "rm -rf '%s'", tmpdir);
    assert_int_equal(system(rm), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_torch_resumes_c_state)};
    snprintf(tmpdir, sizeof tmpdir, "/tmp/mpirpc_optim_interop_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    ref = ot_load_ref();
    if (!ref) return 1;
    int rc = tu_run_group_no_leaks(tests);
    mpr_tensor_dict_destroy(ref);
    rmdir(tmpdir);
    return rc;
}
