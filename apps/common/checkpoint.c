/* checkpoint.c — atomic training checkpoints (app.h): one .safetensors file
 * per checkpoint with the app's tensors and the run state in its metadata;
 * the newest file that reads back whole is the one a resume uses.
 *
 * Write protocol: encode in memory -> write "<dir>/.ckpt-<step>.tmp.<pid>"
 * -> fsync(file) -> rename to "<dir>/ckpt-<step>.safetensors" -> fsync(dir)
 * -> delete older checkpoints beyond `keep`. A crash before the rename
 * leaves only a temporary file (never read: resume looks at "ckpt-*" names
 * only); after it, the new checkpoint is whole.
 *
 * Invariants: a file named ckpt-<N>.safetensors has "app.step" == N; the
 * old checkpoints are deleted only after the new one is durable. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "app.h"
#include "mpirpc/mpirpc.h"

#define CKPT_PREFIX "ckpt-"
#define CKPT_SUFFIX ".safetensors"

static mpr_err_t write_all(int fd, const void *buf, size_t len, const char *path) {
    const char *p = buf;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return mpr_error_set(MPR_ERR_IO, "checkpoint: cannot write '%s': %s", path, strerror(errno));
        p += n, len -= (size_t)n;
    }
    return MPR_OK;
}

static mpr_err_t sync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return mpr_error_set(MPR_ERR_IO, "checkpoint: cannot open folder '%s': %s", dir, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    return rc == 0 ? MPR_OK : mpr_error_set(MPR_ERR_IO, "checkpoint: cannot sync '%s': %s", dir, strerror(errno));
}

/* Step of a checkpoint file name, or -1 if it is not one. */
static int64_t name_step(const char *name) {
    size_t pl = strlen(CKPT_PREFIX), sl = strlen(CKPT_SUFFIX), n = strlen(name);
    if (n <= pl + sl || strncmp(name, CKPT_PREFIX, pl) != 0 || strcmp(name + n - sl, CKPT_SUFFIX) != 0) return -1;
    int64_t step = 0;
    for (size_t i = pl; i < n - sl; i++) {
        if (name[i] < '0' || name[i] > '9') return -1;
        step = step * 10 + (name[i] - '0');
    }
    return step;
}

/* The steps of dir's checkpoints, newest first (malloc'ed; *n entries). */
static int64_t *list_steps(const char *dir, int *n) {
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    int cap = 16;
    int64_t *steps = malloc((size_t)cap * sizeof *steps);
    struct dirent *ent;
    while (steps && (ent = readdir(d))) {
        int64_t s = name_step(ent->d_name);
        if (s < 0) continue;
        if (*n == cap) {
            int64_t *grown = realloc(steps, (size_t)(cap *= 2) * sizeof *steps);
            if (!grown) {
                free(steps);
                steps = NULL;
                break;
            }
            steps = grown;
        }
        steps[(*n)++] = s;
    }
    closedir(d);
    for (int i = 1; steps && i < *n; i++) /* insertion sort, descending */
        for (int j = i; j > 0 && steps[j] > steps[j - 1]; j--) {
            int64_t t = steps[j];
            steps[j] = steps[j - 1], steps[j - 1] = t;
        }
    if (!steps) *n = 0;
    return steps;
}

static char *ckpt_path(const char *dir, int64_t step) {
    size_t len = strlen(dir) + 64;
    char *p = malloc(len);
    if (p) snprintf(p, len, "%s/" CKPT_PREFIX "%010" PRId64 CKPT_SUFFIX, dir, step);
    return p;
}

static mpr_err_t set_meta_i64(mpr_tensor_dict_t *d, const char *key, int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return mpr_tensor_dict_set_meta(d, key, buf);
}

mpr_err_t app_ckpt_save(const char *dir, mpr_tensor_dict_t *d, const app_ckpt_state_t *st, int keep) {
    if (!dir || !d || !st || keep < 1 || st->step < 0)
        return mpr_error_set(MPR_ERR_INVALID_ARG, "app_ckpt_save: need a folder, a dict, a state and keep >= 1");
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return mpr_error_set(MPR_ERR_IO, "checkpoint: cannot create folder '%s': %s", dir, strerror(errno));
    char wall[64], seed[32];
    snprintf(wall, sizeof wall, "%.17g", st->wall_s);
    snprintf(seed, sizeof seed, "%" PRIu64, st->seed);
    mpr_err_t e;
    if ((e = set_meta_i64(d, "app.step", st->step)) || (e = set_meta_i64(d, "app.epoch", st->epoch)) ||
        (e = set_meta_i64(d, "app.step_in_epoch", st->step_in_epoch)) ||
        (e = mpr_tensor_dict_set_meta(d, "app.wall_s", wall)) || (e = mpr_tensor_dict_set_meta(d, "app.seed", seed)))
        return e;

    void *buf = NULL;
    size_t len = 0;
    if ((e = mpr_safetensors_encode(d, &buf, &len))) return e;
    char *final = ckpt_path(dir, st->step);
    size_t tlen = strlen(dir) + 96;
    char *tmp = malloc(tlen);
    if (!final || !tmp) {
        free(buf), free(final), free(tmp);
        return mpr_error_set(MPR_ERR_NOMEM, "checkpoint: out of memory");
    }
    snprintf(tmp, tlen, "%s/.ckpt-%010" PRId64 ".tmp.%ld", dir, st->step, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        e = mpr_error_set(MPR_ERR_IO, "checkpoint: cannot create '%s': %s", tmp, strerror(errno));
    else {
        e = write_all(fd, buf, len, tmp);
        if (!e && fsync(fd) != 0)
            e = mpr_error_set(MPR_ERR_IO, "checkpoint: cannot sync '%s': %s", tmp, strerror(errno));
        if (close(fd) != 0 && !e)
            e = mpr_error_set(MPR_ERR_IO, "checkpoint: cannot close '%s': %s", tmp, strerror(errno));
        if (!e && rename(tmp, final) != 0)
            e = mpr_error_set(MPR_ERR_IO, "checkpoint: cannot rename '%s' to '%s': %s", tmp, final, strerror(errno));
        if (e) unlink(tmp);
    }
    free(buf);
    if (!e) e = sync_dir(dir);
    if (!e) { /* the new one is durable: drop the oldest beyond `keep` */
        int n;
        int64_t *steps = list_steps(dir, &n);
        for (int i = keep; i < n; i++) {
            char *old = ckpt_path(dir, steps[i]);
            if (old) unlink(old);
            free(old);
        }
        free(steps);
    }
    free(final);
    free(tmp);
    return e;
}

static bool meta_i64(const mpr_tensor_dict_t *d, const char *key, int64_t *out) {
    const char *v = mpr_tensor_dict_get_meta(d, key);
    char *end;
    if (!v || !*v) return false;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (*end || errno) return false;
    *out = x;
    return true;
}

static bool meta_u64(const mpr_tensor_dict_t *d, const char *key, uint64_t *out) {
    const char *v = mpr_tensor_dict_get_meta(d, key);
    char *end;
    if (!v || *v < '0' || *v > '9') return false;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end || errno) return false;
    *out = x;
    return true;
}

static bool meta_double(const mpr_tensor_dict_t *d, const char *key, double *out) {
    const char *v = mpr_tensor_dict_get_meta(d, key);
    char *end;
    if (!v || !*v) return false;
    *out = strtod(v, &end);
    return !*end;
}

mpr_err_t app_ckpt_load_latest(const char *dir, mpr_tensor_dict_t **d, app_ckpt_state_t *st, char **path_out) {
    *d = NULL;
    if (path_out) *path_out = NULL;
    if (!dir) return mpr_error_set(MPR_ERR_INVALID_ARG, "app_ckpt_load_latest: folder is NULL");
    int n;
    int64_t *steps = list_steps(dir, &n);
    for (int i = 0; i < n; i++) {
        char *path = ckpt_path(dir, steps[i]);
        if (!path) break;
        mpr_tensor_dict_t *cand = mpr_safetensors_load(path);
        app_ckpt_state_t s = {0};
        bool ok = cand && meta_i64(cand, "app.step", &s.step) && meta_i64(cand, "app.epoch", &s.epoch) &&
                  meta_i64(cand, "app.step_in_epoch", &s.step_in_epoch) &&
                  meta_double(cand, "app.wall_s", &s.wall_s) && meta_u64(cand, "app.seed", &s.seed) &&
                  s.step == steps[i];
        if (ok) {
            *st = s;
            *d = cand;
            if (path_out)
                *path_out = path;
            else
                free(path);
            free(steps);
            return MPR_OK;
        }
        fprintf(stderr, "warning: skipping damaged checkpoint %s: %s\n", path,
                cand ? "no run state in its metadata" : mpr_last_error());
        mpr_tensor_dict_destroy(cand);
        free(path);
    }
    free(steps);
    return mpr_error_set(MPR_ERR_NOT_FOUND, "no checkpoint to resume from in '%s'", dir);
}

mpr_err_t app_ckpt_load_run(const char *dir, uint64_t seed, const char *const *meta, mpr_tensor_dict_t **d,
                            app_ckpt_state_t *st, char **path_out) {
    char *path = NULL;
    mpr_err_t e = app_ckpt_load_latest(dir, d, st, &path);
    if (e) return e;
    char want[512] = "", got[512] = "";
    size_t wl = 0, gl = 0;
    bool same = st->seed == seed;
    for (int i = 0; meta && meta[i]; i += 2) {
        const char *have = mpr_tensor_dict_get_meta(*d, meta[i]);
        if (have && strcmp(have, meta[i + 1]) == 0) continue;
        same = false;
        if (wl < sizeof want) wl += (size_t)snprintf(want + wl, sizeof want - wl, "%s %s, ", meta[i], meta[i + 1]);
        if (gl < sizeof got) gl += (size_t)snprintf(got + gl, sizeof got - gl, "%s %s, ", meta[i], have ? have : "(none)");
    }
    if (!same)
        e = mpr_error_set(MPR_ERR_INVALID_ARG, "checkpoint %s is of another run: %sseed %llu; this run: %sseed %llu",
                          path, got, (unsigned long long)st->seed, want, (unsigned long long)seed);
    if (e) {
        mpr_tensor_dict_destroy(*d);
        *d = NULL;
        free(path);
        path = NULL;
    }
    if (path_out)
        *path_out = path;
    else
        free(path);
    return e;
}

mpr_err_t app_ckpt_send(const mpr_tensor_dict_t *d, int n, const mpr_dest_t *to, const char *fn) {
    void *buf = NULL;
    size_t len = 0;
    mpr_err_t e = mpr_safetensors_encode(d, &buf, &len);
    for (int i = 0; !e && i < n; i++) {
        mpr_value_t *r = NULL;
        e = mpr_call_sync(to[i], fn, MPR_TIMEOUT_DEFAULT, &r, "y", buf, len);
        mpr_value_release(r);
    }
    free(buf);
    return e;
}

mpr_err_t app_dict_add_tensors(mpr_tensor_dict_t *d, const char *prefix, int n, const char *const *names,
                               mpr_tensor_t *const *tensors) {
    char key[512];
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof key, "%s%s", prefix ? prefix : "", names[i]);
        mpr_err_t e = mpr_tensor_dict_set(d, key, tensors[i]);
        if (e) return e;
    }
    return MPR_OK;
}

mpr_err_t app_dict_copy_into_tensors(const mpr_tensor_dict_t *d, const char *prefix, int n,
                                     const char *const *names, mpr_tensor_t *const *tensors) {
    char **keys = calloc((size_t)(n > 0 ? n : 1), sizeof *keys);
    if (!keys) return mpr_error_set(MPR_ERR_NOMEM, "checkpoint: out of memory");
    mpr_err_t e = MPR_OK;
    for (int i = 0; i < n && !e; i++) {
        size_t len = strlen(prefix ? prefix : "") + strlen(names[i]) + 1;
        if (!(keys[i] = malloc(len)))
            e = mpr_error_set(MPR_ERR_NOMEM, "checkpoint: out of memory");
        else
            snprintf(keys[i], len, "%s%s", prefix ? prefix : "", names[i]);
    }
    if (!e) e = mpr_tensor_dict_copy_into(d, (size_t)n, (const char *const *)keys, tensors, false);
    for (int i = 0; i < n; i++) free(keys[i]);
    free(keys);
    return e;
}

/* The names and (borrowed) tensors of m's parameters, malloc'ed arrays. */
static int module_params(mpr_module_t *m, const char ***names, mpr_tensor_t ***ts) {
    int n = mpr_module_num_parameters(m);
    *names = calloc((size_t)(n > 0 ? n : 1), sizeof **names);
    *ts = calloc((size_t)(n > 0 ? n : 1), sizeof **ts);
    if (!*names || !*ts) {
        free(*names), free(*ts);
        mpr_error_set(MPR_ERR_NOMEM, "checkpoint: out of memory");
        return -1;
    }
    for (int i = 0; i < n; i++) (*ts)[i] = mpr_module_parameter(m, i, &(*names)[i]);
    return n;
}

mpr_err_t app_dict_add_module(mpr_tensor_dict_t *d, const char *prefix, mpr_module_t *m) {
    const char **names;
    mpr_tensor_t **ts;
    int n = module_params(m, &names, &ts);
    if (n < 0) return MPR_ERR_NOMEM;
    mpr_err_t e = app_dict_add_tensors(d, prefix, n, names, ts);
    free(names), free(ts);
    return e;
}

mpr_err_t app_dict_copy_into_module(const mpr_tensor_dict_t *d, const char *prefix, mpr_module_t *m) {
    const char **names;
    mpr_tensor_t **ts;
    int n = module_params(m, &names, &ts);
    if (n < 0) return MPR_ERR_NOMEM;
    mpr_err_t e = app_dict_copy_into_tensors(d, prefix, n, names, ts);
    free(names), free(ts);
    return e;
}

mpr_err_t app_dict_merge_encoded(mpr_tensor_dict_t *d, const void *buf, size_t len, const char *what) {
    mpr_tensor_dict_t *part = mpr_safetensors_decode(buf, len, what);
    if (!part) return mpr_last_error_code();
    mpr_err_t e = mpr_tensor_dict_update(d, part);
    mpr_tensor_dict_destroy(part);
    return e;
}
