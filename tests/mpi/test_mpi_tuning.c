/* test_mpi_tuning.c — the Open MPI setting mpr_init picks for an MPI it
 * starts (runtime/mpi_tuning.c): vader sends eager messages by copy (its
 * "inplace" flag off), only when nobody chose otherwise, and the variable
 * that carries it does not outlive MPI_Init_thread.
 *
 * Modes (argv[1]), each its own ctest entry, run with 2 ranks:
 *   default    mpirpc starts MPI: the flag is off, mpri_mpi_tuned() is true;
 *   keep       MPIRPC_KEEP_MPI_DEFAULTS=1 (set by ctest): Open MPI's default;
 *   user       OMPI_MCA_btl_vader_flags set by ctest to the default flags
 *              (inplace on): kept, and still in the environment afterwards;
 *   paramfile  HOME points at a directory whose .openmpi/mca-params.conf sets
 *              btl_vader_flags: mpirpc sets nothing, the file's value holds;
 *   host       the program initialises MPI itself: nothing is changed.
 * What Open MPI ended up with is read back through MPI_T (the control
 * variable btl_vader_flags, whose bit 8 is "inplace"). Every mode then
 * echoes tensors of 64 B to 1 MiB between the ranks (eager copies, and the
 * rendezvous that keeps vader's put/get) and compares them. On an MPI that is
 * not Open MPI 3.x/4.x on x86-64/AArch64 the tuning never applies: the test
 * checks only that (and the echo). */
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mpitest.h"
#include "mpri_runtime.h"

#define INPLACE_BIT 8u /* MCA_BTL_FLAGS_SEND_INPLACE */

static bool tuning_possible(void) {
#if defined(__x86_64__) || defined(__aarch64__)
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(v, &len);
    return strncmp(v, "Open MPI v4.", 12) == 0 || strncmp(v, "Open MPI v3.", 12) == 0;
#else
    return false;
#endif
}

/* The vader flags Open MPI uses now (MPI_T); false when it has none. */
static bool read_vader_flags(unsigned *flags) {
    int provided = 0, n = 0;
    bool found = false;
    CHECK(MPI_T_init_thread(MPI_THREAD_MULTIPLE, &provided) == MPI_SUCCESS);
    MPI_T_cvar_get_num(&n);
    for (int i = 0; i < n && !found; i++) {
        char name[256], desc[256];
        int name_len = sizeof name, desc_len = sizeof desc, verbosity, bind, scope;
        MPI_Datatype type;
        MPI_T_enum enumtype;
        if (MPI_T_cvar_get_info(i, name, &name_len, &verbosity, &type, &enumtype, desc, &desc_len, &bind,
                                &scope) != MPI_SUCCESS ||
            strcmp(name, "btl_vader_flags") != 0)
            continue;
        MPI_T_cvar_handle h;
        int count = 0;
        CHECK(MPI_T_cvar_handle_alloc(i, NULL, &h, &count) == MPI_SUCCESS);
        CHECK(count == 1 && (type == MPI_UNSIGNED || type == MPI_INT));
        CHECK(MPI_T_cvar_read(h, flags) == MPI_SUCCESS);
        MPI_T_cvar_handle_free(&h);
        found = true;
    }
    MPI_T_finalize();
    return found;
}

static mpr_err_t fn_echo(mpr_call_ctx_t *ctx, const mpr_value_t *args, mpr_value_t **result) {
    (void)ctx;
    mpr_tensor_t *t;
    mpr_err_t e = mpr_args_tensor(args, 0, &t);
    if (e) return e;
    *result = mpr_value_new_tensor(t);
    return *result ? MPR_OK : MPR_ERR_NOMEM;
}

/* Tensors of 16 to 256 Ki floats go to the other rank and come back equal. */
static void echo_sizes(int rank) {
    for (int64_t n = 16; n <= 256 * 1024; n *= 4) {
        mpr_tensor_t *t = mpr_tensor_empty(MPR_F32, 1, &n);
        CHECK(t);
        float *d = mpr_tensor_data(t);
        for (int64_t i = 0; i < n; i++) d[i] = (float)(i % 977) * 0.5f + (float)rank;
        mpr_value_t *args = mpr_value_list_of(1, mpr_value_new_tensor(t)), *r = NULL;
        CHECK_OK(mpr_rpc_sync(mpr_to_rank(1 - rank), "echo", args, 60, &r));
        mpr_tensor_t *back;
        CHECK_OK(mpr_value_get_tensor(r, &back));
        CHECK(mpr_tensor_numel(back) == n);
        const float *b = mpr_tensor_data(back);
        for (int64_t i = 0; i < n; i++) CHECK(b[i] == d[i]);
        mpr_value_release(r);
        mpr_value_release(args);
        mpr_tensor_release(t);
    }
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "default";
    char home[64] = "", conf[128] = "", conf_dir[96] = "";
    const char *before = getenv("OMPI_MCA_btl_vader_flags");
    char *user_value = before ? strdup(before) : NULL;
    if (strcmp(mode, "paramfile") == 0) { /* a HOME of its own, one per process */
        snprintf(home, sizeof home, "/tmp/mpirpc-tuning-XXXXXX");
        CHECK(mkdtemp(home));
        snprintf(conf_dir, sizeof conf_dir, "%s/.openmpi", home);
        CHECK(mkdir(conf_dir, 0700) == 0);
        snprintf(conf, sizeof conf, "%s/mca-params.conf", conf_dir);
        FILE *f = fopen(conf, "w");
        CHECK(f);
        fprintf(f, "# set by test_mpi_tuning\nbtl_vader_flags = send,put,get,inplace,atomics,fetching-atomics\n");
        fclose(f);
        setenv("HOME", home, 1);
    }
    int provided = 0;
    if (strcmp(mode, "host") == 0) CHECK(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) == MPI_SUCCESS);
    bool possible = tuning_possible();
    CHECK_OK(mpr_register_function("echo", fn_echo, NULL));
    mpr_init_options_t opts;
    mpr_init_options_default(&opts);
    opts.argc = &argc;
    opts.argv = &argv;
    CHECK_OK(mpr_init(&opts));
    int rank = mpitest_rank();

    /* The environment is as it was. */
    const char *after = getenv("OMPI_MCA_btl_vader_flags");
    CHECK((after == NULL) == (user_value == NULL));
    if (user_value) CHECK(strcmp(after, user_value) == 0);

    bool expect_tuned = possible && strcmp(mode, "default") == 0;
    CHECK(mpri_mpi_tuned() == expect_tuned);
    unsigned flags = 0;
    bool have_flags = read_vader_flags(&flags);
    if (possible) {
        CHECK(have_flags);
        CHECK(((flags & INPLACE_BIT) == 0) == expect_tuned);
        CHECK((flags & 1u) != 0); /* send stays */
    }
    echo_sizes(rank);
    CHECK_OK(mpr_barrier(60));
    if (rank == 0)
        printf("[ok] mode %s: %s (vader flags %u%s)\n1 passed, 0 failed\n", mode,
               expect_tuned ? "eager sends by copy" : "Open MPI's own settings", flags,
               have_flags ? "" : ", not reported");
    CHECK_OK(mpr_shutdown(true));
    if (strcmp(mode, "host") == 0) MPI_Finalize();
    if (*home) { /* what paramfile made */
        unlink(conf);
        rmdir(conf_dir);
        rmdir(home);
    }
    free(user_value);
    return 0;
}
