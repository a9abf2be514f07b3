/* test_autograd_graph_task.c — the engine interface distributed autograd
 * builds on (autograd/mpri_engine.h): dependency counting over a subgraph
 * with several roots, running from an arbitrary node with a supplied
 * gradient, resuming a paused pass when a second gradient arrives (as a
 * remote gradient would), a custom sink owned by a context instead of .grad,
 * and a custom node (like a dist "recv" function) spliced into a graph. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>
#include <math.h>

#include "mpri_engine.h"
#include "mpirpc/nn_functional.h"

#define assert_near(a, b, eps) assert_true(fabs((double)(a) - (double)(b)) <= (eps))

/* A context-owned gradient map: leaf -> accumulated gradient. */
typedef struct sink_map {
    mpr_tensor_t *keys[4];
    mpr_tensor_t *grads[4];
    int n, calls;
} sink_map_t;

static mpr_err_t sink(void *ctx, mpr_tensor_t *leaf, mpr_tensor_t *grad) {
    sink_map_t *m = ctx;
    m->calls++;
    for (int i = 0; i < m->n; i++)
        if (m->keys[i] == leaf) return mpr_add_(m->grads[i], grad);
    m->keys[m->n] = leaf;
    m->grads[m->n] = mpr_scope_keep(mpr_clone(grad)); /* sinks run in an engine scope */
    m->n++;
    return MPR_OK;
}

static double at(mpr_tensor_t *t, int64_t i) {
    double v[16];
    assert_int_equal(mpr_copy_to_buffer(t, MPR_F64, v, sizeof v), MPR_OK);
    return v[i];
}

static void test_two_roots_resume_and_sink(void **state) {
    mpr_tensor_t *x = mpr_from_buffer(MPR_F64, MPR_SHAPE(2), (double[]){1, 2});
    mpr_set_requires_grad(x, true);
    mpr_scope_begin();
    /* a = 3x (shared), r1 = a*a, r2 = a + 1: two "roots" of one pass */
    mpr_tensor_t *a = mpr_mul_scalar(x, 3.0);
    mpr_tensor_t *r1 = mpr_mul(a, a);
    mpr_tensor_t *r2 = mpr_add_scalar(a, 1.0);
    sink_map_t map = {0};
    mpri_engine_opts_t opts = {.retain_graph = false, .sink = sink, .sink_ctx = &map};
    mpri_graph_task_t *task = mpri_graph_task_create(&opts);
    mpri_edge_t e[2] = {mpri_tensor_edge(r1), mpri_tensor_edge(r2)};
    assert_int_equal(mpri_graph_task_add_roots(task, 2, e), MPR_OK);
    /* nodes: mul, add_scalar, mul_scalar, AccumulateGrad */
    assert_int_equal(mpri_graph_task_num_nodes(task), 4);
    mpri_edge_t ea = mpri_tensor_edge(a);
    assert_int_equal(mpri_graph_task_dependencies(task, ea.node), 3); /* mul uses a twice + add */
    /* gradient for r1 only: a's node must wait for r2's */
    mpr_tensor_t *g1 = mpr_ones(MPR_F64, MPR_SHAPE(2));
    assert_int_equal(mpri_graph_task_run(task, 1, &e[0], &g1), MPR_OK);
    assert_int_equal(map.calls, 0);
    assert_int_equal(mpri_graph_task_pending(task), 1); /* a's node holds 2a from r1 */
    assert_int_equal(mpri_graph_task_dependencies(task, ea.node), 1);
    /* later (like a remote gradient arriving): r2's gradient */
    mpr_tensor_t *g2 = mpr_full(MPR_F64, MPR_SHAPE(2), 10.0);
    assert_int_equal(mpri_graph_task_run(task, 1, &e[1], &g2), MPR_OK);
    assert_int_equal(mpri_graph_task_pending(task), 0);
    assert_int_equal(map.calls, 1);
    assert_int_equal(map.n, 1);
    assert_ptr_equal(map.keys[0], x);
    /* d/dx [sum(9x^2) + 10*sum(3x+1)] = 18x + 30 */
    assert_near(at(map.grads[0], 0), 48.0, 1e-12);
    assert_near(at(map.grads[0], 1), 66.0, 1e-12);
    assert_null(mpr_tensor_grad(x)); /* .grad untouched */
    /* feeding an edge that is not a root of the task is refused */
    assert_int_equal(mpri_graph_task_run(task, 1, &e[1], &g2), MPR_ERR_STATE);
    mpri_graph_task_destroy(task);

    /* A root that gets no gradient (NULL) releases its dependency: the
     * shared node runs with what r1 delivered. */
    mpr_tensor_t *a2 = mpr_mul_scalar(x, 3.0);
    mpr_tensor_t *q1 = mpr_mul(a2, a2), *q2 = mpr_add_scalar(a2, 1.0);
    sink_map_t map2 = {0};
    mpri_engine_opts_t opts2 = {.sink = sink, .sink_ctx = &map2};
    mpri_graph_task_t *task2 = mpri_graph_task_create(&opts2);
    mpri_edge_t f[2] = {mpri_tensor_edge(q1), mpri_tensor_edge(q2)};
    assert_int_equal(mpri_graph_task_add_roots(task2, 2, f), MPR_OK);
    mpr_tensor_t *feed[2] = {g1, NULL};
    assert_int_equal(mpri_graph_task_run(task2, 2, f, feed), MPR_OK);
    assert_int_equal(map2.n, 1);
    assert_near(at(map2.grads[0], 1), 18.0 * 2, 1e-12); /* d/dx sum(9x^2) = 18x */
    assert_int_equal(mpri_graph_task_pending(task2), 0);
    mpri_graph_task_destroy(task2);
    mpr_scope_end();
    mpr_tensor_release(map.grads[0]);
    mpr_tensor_release(map2.grads[0]);
    mpr_tensor_release(x);
}

/* A custom node standing for a remote "recv": its backward hands the
 * gradient to a callback instead of computing input gradients. */
static mpr_tensor_t *sent_grad;
static mpr_err_t recv_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    sent_grad = mpr_tensor_retain(gout[0]);
    return MPR_OK;
}
static const mpri_op_def_t recv_def = {.name = "recv", .backward = recv_backward};

static void test_custom_node(void **state) {
    mpr_tensor_t *t = mpr_from_buffer(MPR_F64, MPR_SHAPE(2), (double[]){1, 2});
    mpri_node_t *recv = mpri_node_create(&recv_def, 0, 1);
    assert_int_equal(mpri_tensor_set_grad_fn(t, recv, 0), MPR_OK);
    mpri_node_release(recv);
    assert_true(mpr_requires_grad(t));
    assert_string_equal(mpr_grad_fn_name(t), "recv");
    mpr_scope_begin();
    assert_int_equal(mpr_backward(mpr_sum(mpr_mul(t, t)), NULL, false), MPR_OK);
    mpr_scope_end();
    assert_non_null(sent_grad);
    assert_near(at(sent_grad, 1), 4.0, 0);
    mpr_tensor_release(sent_grad);
    mpr_tensor_release(t);
}

/* A "send" function as in the recipe of mpri_engine.h: the gradient that
 * arrives from the peer flows through it into the sender's graph. */
static mpr_err_t send_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    for (int i = 0; i < n->n_next; i++) gin[i] = gout[i];
    return MPR_OK;
}
static const mpri_op_def_t send_def = {.name = "send", .backward = send_backward};

static void test_send_function(void **state) {
    mpr_tensor_t *w = mpr_from_buffer(MPR_F64, MPR_SHAPE(2), (double[]){1, 2});
    mpr_set_requires_grad(w, true);
    mpr_scope_begin();
    mpr_tensor_t *sent[2] = {mpr_mul_scalar(w, 2.0), mpr_exp(w)};
    mpri_node_t *send = mpri_node_create(&send_def, 2, 2);
    for (int i = 0; i < 2; i++) {
        mpri_node_set_next(send, i, mpri_tensor_edge(sent[i]));
        mpri_node_set_input_meta(send, i, sent[i]);
        mpri_node_set_output_meta(send, i, sent[i]);
    }
    mpri_graph_task_t *task = mpri_graph_task_create(NULL); /* default: into .grad */
    mpri_edge_t e = {send, 0}, e1 = {send, 1};
    assert_int_equal(mpri_graph_task_add_roots(task, 1, &e), MPR_OK);
    assert_int_equal(mpri_graph_task_add_roots(task, 1, &e1), MPR_OK); /* 2nd root edge of the same node */
    /* the peer's gradient for output 0 only; output 1 gets zeros */
    mpr_tensor_t *g = mpr_full(MPR_F64, MPR_SHAPE(2), 3.0);
    assert_int_equal(mpri_graph_task_run(task, 1, &e, &g), MPR_OK);
    assert_null(mpr_tensor_grad(w)); /* still waiting for the second root edge */
    mpr_tensor_t *none = NULL;
    assert_int_equal(mpri_graph_task_run(task, 1, &e1, &none), MPR_OK);
    assert_near(at(mpr_tensor_grad(w), 1), 6.0, 0);
    /* a wrongly shaped gradient is refused, naming the node */
    mpr_tensor_t *bad = mpr_ones(MPR_F64, MPR_SHAPE(3));
    mpri_graph_task_t *t2 = mpri_graph_task_create(NULL);
    assert_int_equal(mpri_graph_task_add_roots(t2, 1, &e), MPR_OK);
    assert_int_equal(mpri_graph_task_run(t2, 1, &e, &bad), MPR_ERR_SHAPE);
    assert_non_null(strstr(mpr_last_error(), "send"));
    mpri_graph_task_destroy(t2);
    mpri_graph_task_destroy(task);
    mpri_node_release(send);
    mpr_scope_end();
    mpr_tensor_release(w);
}

/* A send function whose edges all end at leaves: the gradients go straight
 * to the sink, no task (mpri_engine_sink_passthrough), as a task's run would
 * put them there; a wrong shape is refused naming the node; an edge to a
 * non-leaf, or no sink, is "not this shape" (false, nothing done). */
static void test_passthrough_to_leaves(void **state) {
    mpr_tensor_t *w = mpr_from_buffer(MPR_F64, MPR_SHAPE(2), (double[]){1, 2});
    mpr_tensor_t *v = mpr_from_buffer(MPR_F64, MPR_SHAPE(3), (double[]){1, 2, 3});
    mpr_set_requires_grad(w, true);
    mpr_set_requires_grad(v, true);
    mpr_scope_begin();
    mpri_node_t *send = mpri_node_create(&send_def, 3, 3);
    mpr_tensor_t *sent[3] = {w, v, w}; /* w twice: its gradients add up */
    for (int i = 0; i < 3; i++) {
        mpri_node_set_next(send, i, mpri_tensor_edge(sent[i]));
        mpri_node_set_input_meta(send, i, sent[i]);
        mpri_node_set_output_meta(send, i, sent[i]);
    }
    sink_map_t map = {0};
    mpri_engine_opts_t opts = {.retain_graph = true, .sink = sink, .sink_ctx = &map};
    mpr_tensor_t *g[3] = {mpr_full(MPR_F64, MPR_SHAPE(2), 3.0), mpr_full(MPR_F64, MPR_SHAPE(3), 5.0),
                          mpr_full(MPR_F64, MPR_SHAPE(2), 4.0)};
    mpr_err_t rc = MPR_ERR_STATE;
    assert_true(mpri_engine_sink_passthrough(&opts, send, g, &rc));
    assert_int_equal(rc, MPR_OK);
    assert_int_equal(map.calls, 3);
    assert_int_equal(map.n, 2);
    assert_ptr_equal(map.keys[0], w);
    assert_near(at(map.grads[0], 1), 7.0, 0);
    assert_ptr_equal(map.keys[1], v);
    assert_near(at(map.grads[1], 2), 5.0, 0);
    assert_null(mpr_tensor_grad(w)); /* .grad untouched */
    /* the same through a task puts the same sums in the sink */
    sink_map_t via_task = {0};
    mpri_engine_opts_t topts = {.retain_graph = true, .sink = sink, .sink_ctx = &via_task};
    mpri_graph_task_t *task = mpri_graph_task_create(&topts);
    mpri_edge_t e[3] = {{send, 0}, {send, 1}, {send, 2}};
    assert_int_equal(mpri_graph_task_add_roots(task, 3, e), MPR_OK);
    assert_int_equal(mpri_graph_task_run(task, 3, e, g), MPR_OK);
    assert_int_equal(via_task.n, 2);
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < (i ? 3 : 2); k++) assert_near(at(via_task.grads[i], k), at(map.grads[i], k), 0);
    mpri_graph_task_destroy(task);
    /* a wrong shape: refused, naming the node */
    mpr_tensor_t *bad[3] = {g[1], g[1], g[2]};
    assert_true(mpri_engine_sink_passthrough(&opts, send, bad, &rc));
    assert_int_equal(rc, MPR_ERR_SHAPE);
    assert_non_null(strstr(mpr_last_error(), "send"));
    /* not the shape: no sink, or an edge to a non-leaf */
    assert_false(mpri_engine_sink_passthrough(&(mpri_engine_opts_t){.retain_graph = true}, send, g, &rc));
    mpr_tensor_t *twice = mpr_mul_scalar(w, 2.0);
    mpri_node_t *send2 = mpri_node_create(&send_def, 1, 1);
    mpri_node_set_next(send2, 0, mpri_tensor_edge(twice));
    mpri_node_set_input_meta(send2, 0, twice);
    mpri_node_set_output_meta(send2, 0, twice);
    int calls = map.calls;
    assert_false(mpri_engine_sink_passthrough(&opts, send2, g, &rc));
    assert_int_equal(map.calls, calls);
    mpri_node_release(send2);
    mpri_node_release(send);
    for (int i = 0; i < 2; i++) {
        mpr_tensor_release(map.grads[i]);
        mpr_tensor_release(via_task.grads[i]);
    }
    mpr_scope_end();
    mpr_tensor_release(w);
    mpr_tensor_release(v);
}

/* What a driver of a task can get wrong is a returned error that leaves the
 * task usable: feeding a node that is in the subgraph but is not a root (its
 * dependency count would lose an edge), or feeding a root twice. A node whose
 * backward fails fails the task: it refuses to run or take roots again. */
static mpr_err_t failing_backward(mpri_node_t *n, mpr_tensor_t *const *gout, mpr_tensor_t **gin) {
    return mpr_error_set(MPR_ERR_REMOTE, "peer gone");
}
static const mpri_op_def_t failing_def = {.name = "failing_send", .backward = failing_backward};

static void test_refused_feeds_and_failed_task(void **state) {
    mpr_tensor_t *x = mpr_from_buffer(MPR_F64, MPR_SHAPE(2), (double[]){1, 2});
    mpr_set_requires_grad(x, true);
    mpr_scope_begin();
    mpr_tensor_t *a = mpr_mul_scalar(x, 3.0), *r = mpr_exp(a);
    mpri_graph_task_t *task = mpri_graph_task_create(NULL);
    mpri_edge_t root = mpri_tensor_edge(r), inner = mpri_tensor_edge(a);
    assert_int_equal(mpri_graph_task_add_roots(task, 1, &root), MPR_OK);
    mpr_tensor_t *g = mpr_ones(MPR_F64, MPR_SHAPE(2));
    /* a's node is in the subgraph (1 dependency: exp's edge) but no root */
    assert_int_equal(mpri_graph_task_dependencies(task, inner.node), 1);
    assert_int_equal(mpri_graph_task_run(task, 1, &inner, &g), MPR_ERR_STATE);
    assert_non_null(strstr(mpr_last_error(), "not an outstanding root"));
    assert_int_equal(mpri_graph_task_dependencies(task, inner.node), 1); /* untouched */
    assert_null(mpr_tensor_grad(x));
    /* the task still works: d/dx sum(exp(3x)) = 3 exp(3x) */
    assert_int_equal(mpri_graph_task_run(task, 1, &root, &g), MPR_OK);
    assert_near(at(mpr_tensor_grad(x), 0), 3.0 * exp(3.0), 1e-9);
    /* the root was fed once already */
    assert_int_equal(mpri_graph_task_run(task, 1, &root, &g), MPR_ERR_STATE);
    mpri_graph_task_destroy(task);

    /* a failing node fails the task */
    mpri_node_t *send = mpri_node_create(&failing_def, 1, 1);
    mpri_node_set_next(send, 0, mpri_tensor_edge(x));
    mpri_node_set_input_meta(send, 0, x);
    mpri_node_set_output_meta(send, 0, x);
    mpri_edge_t e[2] = {{send, 0}, {send, 0}};
    mpri_graph_task_t *t2 = mpri_graph_task_create(NULL);
    assert_int_equal(mpri_graph_task_add_roots(t2, 2, e), MPR_OK); /* two root edges */
    assert_int_equal(mpri_graph_task_dependencies(t2, send), 2);
    mpr_tensor_t *feed[2] = {g, g};
    assert_int_equal(mpri_graph_task_run(t2, 2, e, feed), MPR_ERR_REMOTE);
    assert_int_equal(mpri_graph_task_run(t2, 0, NULL, NULL), MPR_ERR_STATE);
    assert_non_null(strstr(mpr_last_error(), "failed earlier"));
    assert_int_equal(mpri_graph_task_add_roots(t2, 1, e), MPR_ERR_STATE);
    mpri_graph_task_destroy(t2);
    mpri_node_release(send);
    mpr_scope_end();
    mpr_tensor_release(x);
}

/* A node with 150 inputs, each its own product node, next to a chain: the
 * walk that counts dependencies outgrows its first 64 stack slots (it moves
 * to the heap), and every count and gradient still comes out right. */
static void test_wide_graph(void **state) {
    (void)state;
    enum { WIDE = 150 };
    int64_t one = 1;
    mpr_tensor_t *x = mpr_full(MPR_F64, 1, &one, 3.0);
    mpr_set_requires_grad(x, true);
    mpr_scope_begin(); /* what the ops make is released by mpr_scope_end */
    mpr_tensor_t *parts[WIDE];
    for (int i = 0; i < WIDE; i++) parts[i] = mpr_mul_scalar(x, (double)(i + 1));
    mpr_tensor_t *cat = mpr_cat(parts, WIDE, 0);
    assert_non_null(cat);
    mpr_tensor_t *loss = mpr_sum(cat);
    mpri_edge_t root = mpri_tensor_edge(loss);
    mpri_graph_task_t *t = mpri_graph_task_create(NULL);
    assert_int_equal(mpri_graph_task_add_roots(t, 1, &root), MPR_OK);
    /* sum, cat, 150 products, x's accumulator */
    assert_int_equal(mpri_graph_task_num_nodes(t), WIDE + 3);
    assert_int_equal(mpri_graph_task_dependencies(t, mpri_tensor_edge(cat).node), 1);
    assert_int_equal(mpri_graph_task_dependencies(t, mpri_tensor_edge(parts[WIDE - 1]).node), 1);
    mpr_tensor_t *g = mpr_full(MPR_F64, 0, NULL, 1.0);
    assert_int_equal(mpri_graph_task_run(t, 1, &root, &g), MPR_OK);
    mpri_graph_task_destroy(t);
    mpr_tensor_t *grad = mpr_tensor_grad(x);
    assert_non_null(grad);
    assert_near(at(grad, 0), WIDE * (WIDE + 1) / 2.0, 1e-9); /* d/dx of sum_i (i+1) x */
    mpr_scope_end();
    mpr_tensor_release(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_roots_resume_and_sink),
        cmocka_unit_test(test_custom_node),
        cmocka_unit_test(test_send_function),
        cmocka_unit_test(test_passthrough_to_leaves),
        cmocka_unit_test(test_refused_feeds_and_failed_task),
        cmocka_unit_test(test_wide_graph),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
