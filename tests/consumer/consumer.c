/* consumer.c — a program outside the tree using the installed mpirpc: rank 0
 * asks rank 1 to add two numbers and checks the answer. */
#include <mpirpc/mpirpc.h>
#include <stdio.h>

static mpr_err_t add(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    int64_t a, b;
    mpr_err_t e;
    if ((e = mpr_args_int(args, 0, &a)) || (e = mpr_args_int(args, 1, &b))) return e;
    *result = mpr_value_new_int(a + b);
    return MPR_OK;
}

int main(int argc, char **argv) {
    mpr_register_function("add", add, NULL);
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = &argc;
    opts.argv = &argv;
    if (mpr_init(&opts) != MPR_OK) {
        fprintf(stderr, "init: %s\n", mpr_last_error());
        return 1;
    }
    int status = 0;
    mpr_worker_info_t self;
    mpr_get_self_worker_info(&self);
    if (self.rank == 0) {
        mpr_value_t *args = mpr_value_list_of(2, mpr_value_new_int(2), mpr_value_new_int(40)), *r = NULL;
        int64_t sum = 0;
        if (mpr_rpc_sync(mpr_to_name("worker1"), "add", args, 10, &r) != MPR_OK || mpr_value_get_int(r, &sum) ||
            sum != 42) {
            fprintf(stderr, "consumer: wrong answer (%s)\n", mpr_last_error());
            status = 1;
        } else {
            printf("consumer: worker1 says 2 + 40 = %lld\n", (long long)sum);
        }
        mpr_value_release(r);
        mpr_value_release(args);
    }
    if (mpr_shutdown(true) != MPR_OK) status = 1;
    return status;
}
