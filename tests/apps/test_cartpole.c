/* test_cartpole.c — apps/rl_cartpole's CartPole-v1 against a trace from an
 * independent NumPy reimplementation of gym's equations
 * (tests/ref/gen_cartpole_trace.py -> tests/data/cartpole_trace.npy): every
 * episode starts from the trace's initial state and replays its actions; each
 * state must match to 1e-12 and the terminated/truncated flags exactly (the
 * episodes end by angle, by position, and at the 500-step limit). Also: resets
 * draw from [-0.05, 0.05) and repeat for a seed, differ between seeds; a step
 * after the end and a bad action are refused. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "cartpole.h"
#include "mpirpc/tensor_io.h"

enum { COL_EP, COL_ACTION, COL_X, COL_XDOT, COL_THETA, COL_THETADOT, COL_TERM, COL_TRUNC, NCOL };

static void test_replay_trace(void **state) {
    (void)state;
    const char *dir = getenv("MPIRPC_TEST_DATA");
    assert_non_null(dir);
    char path[512];
    snprintf(path, sizeof path, "%s/cartpole_trace.npy", dir);
    mpr_tensor_t *t = mpr_tensor_load_npy(path);
    assert_non_null(t);
    assert_int_equal(mpr_tensor_dtype(t), MPR_F64);
    assert_int_equal(mpr_tensor_ndim(t), 2);
    assert_int_equal(mpr_tensor_shape(t)[1], NCOL);
    int64_t rows = mpr_tensor_shape(t)[0];
    const double *d = mpr_tensor_data(t);
    cartpole_t *env = cartpole_create(1);
    assert_non_null(env);
    int episodes = 0, ended_by[3] = {0, 0, 0}; /* angle, position, time limit */
    for (int64_t r = 0; r < rows; r++) {
        const double *row = d + r * NCOL;
        if (row[COL_ACTION] < 0) {
            cartpole_set_state(env, row + COL_X);
            episodes++;
            continue;
        }
        double s[4], reward = 0;
        bool term, trunc;
        assert_int_equal(cartpole_step(env, (int)row[COL_ACTION], s, &reward, &term, &trunc), CARTPOLE_OK);
        for (int i = 0; i < 4; i++)
            if (fabs(s[i] - row[COL_X + i]) > 1e-12) {
                fprintf(stderr, "row %lld component %d: C %.17g, reference %.17g\n", (long long)r, i, s[i],
                        row[COL_X + i]);
                fail();
            }
        assert_true(reward == 1.0);
        assert_int_equal(term, row[COL_TERM] != 0);
        assert_int_equal(trunc, row[COL_TRUNC] != 0);
        if (term || trunc) { /* the trace's episode ends here: a further step is refused */
            assert_int_equal(cartpole_step(env, 1, s, NULL, NULL, NULL), CARTPOLE_ERR_DONE);
            if (trunc) ended_by[2]++;
            else if (fabs(s[0]) > CARTPOLE_X_THRESHOLD) ended_by[1]++;
            else ended_by[0]++;
        }
    }
    assert_int_equal(episodes, 4);
    assert_true(ended_by[0] >= 1 && ended_by[1] >= 1 && ended_by[2] == 1);
    cartpole_destroy(env);
    mpr_tensor_release(t);
}

static void test_reset_seeded(void **state) {
    (void)state;
    cartpole_t *a = cartpole_create(7), *b = cartpole_create(7), *c = cartpole_create(8);
    double sa[4], sb[4], sc[4];
    bool differs = false;
    for (int ep = 0; ep < 200; ep++) {
        cartpole_reset(a, sa);
        cartpole_reset(b, sb);
        cartpole_reset(c, sc);
        for (int i = 0; i < 4; i++) {
            assert_true(sa[i] >= -0.05 && sa[i] < 0.05);
            assert_true(sa[i] == sb[i]);
            differs |= sa[i] != sc[i];
        }
        assert_int_equal(cartpole_steps(a), 0);
    }
    assert_true(differs);
    /* reseeding repeats the draws */
    cartpole_seed(a, 99);
    cartpole_reset(a, sa);
    cartpole_seed(a, 99);
    cartpole_reset(a, sb);
    for (int i = 0; i < 4; i++) assert_true(sa[i] == sb[i]);
    assert_int_equal(cartpole_step(a, 2, NULL, NULL, NULL, NULL), CARTPOLE_ERR_ACTION);
    assert_int_equal(cartpole_step(a, -1, NULL, NULL, NULL, NULL), CARTPOLE_ERR_ACTION);
    assert_int_equal(cartpole_step(a, 0, NULL, NULL, NULL, NULL), CARTPOLE_OK);
    assert_int_equal(cartpole_steps(a), 1);
    /* a fresh env must be reset before its first step */
    cartpole_t *fresh = cartpole_create(1);
    assert_int_equal(cartpole_step(fresh, 0, NULL, NULL, NULL, NULL), CARTPOLE_ERR_DONE);
    cartpole_destroy(fresh);
    cartpole_destroy(a);
    cartpole_destroy(b);
    cartpole_destroy(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_trace),
        cmocka_unit_test(test_reset_seeded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
