/* test_rt_outmsg_buffers.c — the encode buffers of outgoing messages
 * (runtime/transport.c): a fresh one has room for a small tensor carried
 * inline (no growth while sending); a thread keeps one spare; a buffer of
 * the fresh size given back on a thread whose spare is taken is kept for any
 * thread (the stash: a send that completes on another thread than its
 * sender's), handed to the next thread that has none, and freed by
 * mpri_transport_cache_trim. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "mpri_runtime.h"

static void *init_on_new_thread(void *arg) {
    mpri_outmsg_init(arg, MPRI_MSG_CALL); /* a new thread: no spare */
    return NULL;
}

/* `m` initialized on a new thread (an outmsg is never copied by value: its
 * tensor list points into itself). */
static void init_on_new_thread_into(mpri_outmsg_t *m) {
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, init_on_new_thread, m), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
}

static void test_fresh_buffer_has_room(void **state) {
    (void)state;
    mpri_transport_cache_trim();
    mpri_outmsg_t m;
    init_on_new_thread_into(&m);
    assert_false(m.wire.failed);
    assert_int_equal(m.wire.len, sizeof(mpri_wire_header_t)); /* room for the header, zeroed */
    assert_true(m.wire.cap >= 1024);                        /* a 256-byte tensor inline, and more */
    mpri_outmsg_fini(&m);
    mpri_transport_cache_trim();
}

static void test_buffer_reused_on_another_thread(void **state) {
    (void)state;
    mpri_transport_cache_trim();
    mpri_outmsg_t a, b;
    mpri_outmsg_init(&a, MPRI_MSG_CALL); /* this thread's spare, if it has one */
    mpri_outmsg_init(&b, MPRI_MSG_CALL); /* then a fresh one */
    uint8_t *b_bytes = b.wire.data;
    size_t b_cap = b.wire.cap;
    mpri_outmsg_fini(&a); /* the spare again */
    mpri_outmsg_fini(&b); /* the spare is taken: kept for any thread */
    mpri_outmsg_t c;
    init_on_new_thread_into(&c);
    assert_ptr_equal(c.wire.data, b_bytes);
    assert_int_equal(c.wire.cap, b_cap);
    assert_int_equal(c.wire.len, sizeof(mpri_wire_header_t));
    mpri_outmsg_fini(&c); /* this thread's spare is taken: kept again */
    mpri_transport_cache_trim(); /* ... until trimmed */
    mpri_outmsg_t d;
    init_on_new_thread_into(&d); /* a fresh buffer, usable */
    assert_false(d.wire.failed);
    mpri_buf_put(&d.wire, "x", 1);
    assert_int_equal(d.wire.len, sizeof(mpri_wire_header_t) + 1);
    mpri_outmsg_fini(&d);
    mpri_transport_cache_trim();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fresh_buffer_has_room),
        cmocka_unit_test(test_buffer_reused_on_another_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
