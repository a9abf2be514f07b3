/* random.c — seeded random numbers: generators (xoshiro256** seeded through
 * splitmix64), the process-wide default generator, rand/randn/uniform/normal
 * and their in-place forms.
 *
 * Invariants: the stream depends only on the seed and the sequence of draws,
 * so every run (and machine) produces the same numbers; uniform doubles use
 * the top 53 bits, floats are rounded from them, and normals come from
 * Box-Muller pairs (both values used, the spare kept in the generator). The
 * default generator is guarded by a mutex; explicit generators are not. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "mpri_args.h"
#include "mpri_autograd.h"
#include "kernels/mpri_kernels.h"

struct mpr_generator {
    uint64_t s[4];
    bool has_spare;
    double spare;
};

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void mpr_generator_seed(mpr_generator_t *g, uint64_t seed) {
    if (!g) return;
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) g->s[i] = splitmix64(&x);
    g->has_spare = false;
}

mpr_generator_t *mpr_generator_create(uint64_t seed) {
    mpr_generator_t *g = calloc(1, sizeof *g);
    if (!g) {
        mpr_error_set(MPR_ERR_NOMEM, "generator_create: out of memory");
        return NULL;
    }
    mpr_generator_seed(g, seed);
    return g;
}

void mpr_generator_destroy(mpr_generator_t *g) { free(g); }

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(mpr_generator_t *g) {
    uint64_t *s = g->s;
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

static double next_double(mpr_generator_t *g) { return (double)(next_u64(g) >> 11) * 0x1.0p-53; }

static double next_normal(mpr_generator_t *g) {
    if (g->has_spare) {
        g->has_spare = false;
        return g->spare;
    }
    double u1, u2;
    do u1 = next_double(g); while (u1 <= 0.0);
    u2 = next_double(g);
    double r = sqrt(-2.0 * log(u1)), th = 2.0 * M_PI * u2;
    g->spare = r * sin(th);
    g->has_spare = true;
    return r * cos(th);
}

static pthread_mutex_t default_lock = PTHREAD_MUTEX_INITIALIZER;
static mpr_generator_t default_gen;
static bool default_init;

static mpr_generator_t *lock_gen(mpr_generator_t *g) {
    if (g) return g;
    pthread_mutex_lock(&default_lock);
    if (!default_init) {
        mpr_generator_seed(&default_gen, 0);
        default_init = true;
    }
    return &default_gen;
}
static void unlock_gen(mpr_generator_t *g) {
    if (g == &default_gen) pthread_mutex_unlock(&default_lock);
}

void mpr_manual_seed(uint64_t seed) {
    mpr_generator_t *g = lock_gen(NULL);
    mpr_generator_seed(g, seed);
    unlock_gen(g);
}

uint64_t mpr_generator_next_u64(mpr_generator_t *gen) {
    mpr_generator_t *g = lock_gen(gen);
    uint64_t r = next_u64(g);
    unlock_gen(g);
    return r;
}

double mpr_generator_next_double(mpr_generator_t *gen) {
    mpr_generator_t *g = lock_gen(gen);
    double r = next_double(g);
    unlock_gen(g);
    return r;
}

/* Fill t (float, any strides, row-major order) with a*u + b (uniform) or
 * mean + std*n (normal). */
static void fill_random(mpr_tensor_t *t, bool normal, double p0, double p1, mpr_generator_t *gen) {
    int64_t numel = mpr_tensor_numel(t), idx[MPR_MAX_DIMS] = {0};
    mpr_generator_t *g = lock_gen(gen);
    for (int64_t k = 0; k < numel; k++) {
        double v = normal ? p0 + p1 * next_normal(g) : p0 + (p1 - p0) * next_double(g);
        int64_t off = 0;
        for (int d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
        if (t->dtype == MPR_F32) {
            float f = (float)v;
            if (!normal && f >= (float)p1 && p1 > p0) f = nextafterf((float)p1, (float)p0);
            ((float *)mpr_tensor_data(t))[off] = f;
        } else {
            ((double *)mpr_tensor_data(t))[off] = v;
        }
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
    }
    unlock_gen(g);
}

static mpr_tensor_t *random_tensor(const char *op, mpr_dtype_t dtype, int ndim, const int64_t *shape,
                                   bool normal, double p0, double p1, mpr_generator_t *gen) {
    int64_t numel;
    if (mpri_tensor_check_shape(op, dtype, ndim, shape, &numel) != MPR_OK) return NULL;
    if (dtype != MPR_F32 && dtype != MPR_F64) {
        mpr_error_set(MPR_ERR_DTYPE, "%s: float32/float64 only, got %s", op, mpr_dtype_name(dtype));
        return NULL;
    }
    if (normal ? !(p1 >= 0) : !(p0 <= p1)) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "%s: bad parameters %g, %g", op, p0, p1);
        return NULL;
    }
    mpr_tensor_t *t = mpr_tensor_empty(dtype, ndim, shape);
    if (!t) return NULL;
    fill_random(t, normal, p0, p1, gen);
    return mpri_result(t);
}

mpr_tensor_t *mpr_rand(mpr_dtype_t dtype, int ndim, const int64_t *shape, mpr_generator_t *gen) {
    if (ndim > 0) MPRI_ARG_NONNULL_OR(shape, NULL);
    return random_tensor("rand", dtype, ndim, shape, false, 0.0, 1.0, gen);
}
mpr_tensor_t *mpr_randn(mpr_dtype_t dtype, int ndim, const int64_t *shape, mpr_generator_t *gen) {
    if (ndim > 0) MPRI_ARG_NONNULL_OR(shape, NULL);
    return random_tensor("randn", dtype, ndim, shape, true, 0.0, 1.0, gen);
}
mpr_tensor_t *mpr_uniform(mpr_dtype_t dtype, int ndim, const int64_t *shape, double lo, double hi,
                          mpr_generator_t *gen) {
    if (ndim > 0) MPRI_ARG_NONNULL_OR(shape, NULL);
    return random_tensor("uniform", dtype, ndim, shape, false, lo, hi, gen);
}
mpr_tensor_t *mpr_normal(mpr_dtype_t dtype, int ndim, const int64_t *shape, double mean, double std,
                         mpr_generator_t *gen) {
    if (ndim > 0) MPRI_ARG_NONNULL_OR(shape, NULL);
    return random_tensor("normal", dtype, ndim, shape, true, mean, std, gen);
}

static mpr_err_t random_(const char *op, mpr_tensor_t *t, bool normal, double p0, double p1,
                         mpr_generator_t *gen) {
    if (!t) return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: tensor is NULL", op);
    mpr_err_t rc = mpri_check_float(op, t);
    if (rc || (rc = mpri_check_cpu(op, t)) || (rc = mpri_check_inplace(op, t))) return rc;
    if (normal ? !(p1 >= 0) : !(p0 <= p1))
        return mpr_error_set(MPR_ERR_INVALID_ARG, "%s: bad parameters %g, %g", op, p0, p1);
    fill_random(t, normal, p0, p1, gen);
    mpri_bump_version(t);
    return MPR_OK;
}

mpr_err_t mpr_uniform_(mpr_tensor_t *t, double lo, double hi, mpr_generator_t *gen) {
    MPRI_ARG_NONNULL(t);
    return random_("uniform_", t, false, lo, hi, gen);
}
mpr_err_t mpr_normal_(mpr_tensor_t *t, double mean, double std, mpr_generator_t *gen) {
    MPRI_ARG_NONNULL(t);
    return random_("normal_", t, true, mean, std, gen);
}
