/* corpus.c — reading, tokenizing, splitting and batching the fortunes
 * corpus (corpus.h).
 *
 * Invariants: token ids are in [0, vocab_size); id 0 is <unk>; the
 * vocabulary is built from the training split only; the split is a
 * function of (files, seed) alone. */
#include "corpus.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- a growable array of strings ---- */
typedef struct {
    char **v;
    int64_t n, cap;
} strvec_t;

static bool strvec_push(strvec_t *s, char *str) {
    if (s->n == s->cap) {
        int64_t cap = s->cap ? s->cap * 2 : 1024;
        char **v = realloc(s->v, (size_t)cap * sizeof *v);
        if (!v) return false;
        s->v = v, s->cap = cap;
    }
    s->v[s->n++] = str;
    return true;
}

static void strvec_free(strvec_t *s) {
    for (int64_t i = 0; i < s->n; i++) free(s->v[i]);
    free(s->v);
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) free(buf), buf = NULL;
    if (buf) buf[len] = 0;
    fclose(f);
    return buf;
}

/* Split a fortune file's text at "%" lines; appends copies to out. */
static bool split_fortunes(const char *text, strvec_t *out) {
    const char *start = text, *p = text;
    while (*p) {
        const char *eol = strchr(p, '\n');
        const char *next = eol ? eol + 1 : p + strlen(p);
        size_t linelen = (size_t)((eol ? eol : next) - p);
        if (linelen == 1 && p[0] == '%') {
            if (p > start && !strvec_push(out, strndup(start, (size_t)(p - start)))) return false;
            start = next;
        }
        p = next;
    }
    if (p > start && !strvec_push(out, strndup(start, (size_t)(p - start)))) return false;
    return true;
}

static int name_order(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

static bool read_fortunes(const char *dir, strvec_t *out) {
    struct dirent **names;
    int n = scandir(dir, &names, NULL, name_order);
    if (n < 0) {
        mpr_error_set(MPR_ERR_IO, "corpus: cannot read '%s': %s (install the Debian package %s)", dir,
                      strerror(errno), CORPUS_PACKAGE);
        return false;
    }
    bool ok = true;
    for (int i = 0; i < n; i++) {
        const char *nm = names[i]->d_name;
        size_t len = strlen(nm);
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, nm);
        bool skip = nm[0] == '.' || (len > 4 && strcmp(nm + len - 4, ".dat") == 0) || lstat(path, &st) != 0 ||
                    !S_ISREG(st.st_mode);
        if (ok && !skip) {
            char *text = read_file(path);
            if (!text) ok = false, mpr_error_set(MPR_ERR_IO, "corpus: cannot read '%s'", path);
            else ok = split_fortunes(text, out) || (mpr_error_set(MPR_ERR_NOMEM, "corpus: out of memory"), false);
            free(text);
        }
        free(names[i]);
    }
    free(names);
    if (ok && out->n == 0) {
        mpr_error_set(MPR_ERR_IO, "corpus: no fortunes in '%s' (install the Debian package %s)", dir, CORPUS_PACKAGE);
        ok = false;
    }
    return ok;
}

/* ---- tokenizing ---- */

static bool is_word_byte(unsigned char ch) { return isalnum(ch) || ch == '\'' || ch >= 0x80; }

/* Calls emit(token, len, ctx) for every token of `text`. */
static bool tokenize(const char *text, bool word_level, bool (*emit)(const char *, size_t, void *), void *ctx) {
    const unsigned char *p = (const unsigned char *)text;
    if (!word_level) {
        for (; *p; p++)
            if (!emit((const char *)p, 1, ctx)) return false;
        return true;
    }
    char word[256];
    while (*p) {
        if (*p == '\n') {
            if (!emit("<eos>", 5, ctx)) return false;
            p++;
        } else if (is_word_byte(*p)) {
            size_t n = 0;
            for (; is_word_byte(*p); p++)
                if (n < sizeof word) word[n++] = (char)tolower(*p);
            if (!emit(word, n, ctx)) return false;
        } else if (isgraph(*p)) {
            if (!emit((const char *)p, 1, ctx)) return false;
            p++;
        } else {
            p++;
        }
    }
    return true;
}

/* ---- a string -> count/id hash table (open addressing) ---- */
typedef struct {
    char *key;
    int64_t count, id;
} entry_t;

typedef struct {
    entry_t *slots;
    int64_t cap, n;
} table_t;

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

static entry_t *table_find(table_t *t, const char *s, size_t n, bool insert) {
    if (insert && (t->n + 1) * 2 > t->cap) {
        int64_t cap = t->cap ? t->cap * 2 : 4096;
        entry_t *slots = calloc((size_t)cap, sizeof *slots);
        if (!slots) return NULL;
        for (int64_t i = 0; i < t->cap; i++)
            if (t->slots[i].key) {
                uint64_t h = hash_bytes(t->slots[i].key, strlen(t->slots[i].key)) & (uint64_t)(cap - 1);
                while (slots[h].key) h = (h + 1) & (uint64_t)(cap - 1);
                slots[h] = t->slots[i];
            }
        free(t->slots);
        t->slots = slots, t->cap = cap;
    }
    if (!t->cap) return NULL;
    uint64_t h = hash_bytes(s, n) & (uint64_t)(t->cap - 1);
    while (t->slots[h].key) {
        if (strlen(t->slots[h].key) == n && memcmp(t->slots[h].key, s, n) == 0) return &t->slots[h];
        h = (h + 1) & (uint64_t)(t->cap - 1);
    }
    if (!insert) return NULL;
    if (!(t->slots[h].key = strndup(s, n))) return NULL;
    t->slots[h].id = 0;
    t->n++;
    return &t->slots[h];
}

static void table_free(table_t *t) {
    for (int64_t i = 0; i < t->cap; i++) free(t->slots[i].key);
    free(t->slots);
}

/* ---- building the splits ---- */
typedef struct {
    table_t *table;
    int64_t *ids, n, cap, limit; /* ids: NULL while counting */
    bool failed;
} emit_ctx_t;

static bool emit_count(const char *s, size_t n, void *vctx) {
    emit_ctx_t *c = vctx;
    if (c->limit > 0 && c->n >= c->limit) return true;
    entry_t *e = table_find(c->table, s, n, true);
    if (!e) return c->failed = true, false;
    e->count++;
    c->n++;
    return true;
}

static bool emit_id(const char *s, size_t n, void *vctx) {
    emit_ctx_t *c = vctx;
    if (c->limit > 0 && c->n >= c->limit) return true;
    if (c->n == c->cap) {
        int64_t cap = c->cap ? c->cap * 2 : 65536;
        int64_t *ids = realloc(c->ids, (size_t)cap * sizeof *ids);
        if (!ids) return c->failed = true, false;
        c->ids = ids, c->cap = cap;
    }
    entry_t *e = table_find(c->table, s, n, false);
    c->ids[c->n++] = e ? e->id : 0;
    return true;
}

static int by_count_then_bytes(const void *a, const void *b) {
    const entry_t *x = *(entry_t *const *)a, *y = *(entry_t *const *)b;
    if (x->count != y->count) return x->count > y->count ? -1 : 1;
    return strcmp(x->key, y->key);
}

corpus_t *corpus_load(const char *dir, bool word_level, int64_t vocab_cap, double valid_fraction,
                      int64_t max_tokens, uint64_t seed) {
    if (vocab_cap < 2 || !(valid_fraction > 0 && valid_fraction < 1)) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "corpus: vocabulary cap >= 2 and a held-out fraction in (0, 1)");
        return NULL;
    }
    strvec_t fortunes = {0};
    if (!read_fortunes(dir ? dir : CORPUS_DEFAULT_DIR, &fortunes)) {
        strvec_free(&fortunes);
        return NULL;
    }
    /* seeded Fisher-Yates over the fortunes; the tail is held out */
    mpr_generator_t *g = mpr_generator_create(seed);
    for (int64_t i = fortunes.n - 1; g && i > 0; i--) {
        int64_t j = (int64_t)(mpr_generator_next_u64(g) % (uint64_t)(i + 1));
        char *t = fortunes.v[i];
        fortunes.v[i] = fortunes.v[j], fortunes.v[j] = t;
    }
    mpr_generator_destroy(g);
    int64_t n_valid_f = (int64_t)ceil(valid_fraction * (double)fortunes.n);
    if (n_valid_f >= fortunes.n) n_valid_f = fortunes.n - 1;
    int64_t n_train_f = fortunes.n - n_valid_f;
    int64_t train_limit = max_tokens > 0 ? (int64_t)((double)max_tokens * (1 - valid_fraction)) : 0;
    int64_t valid_limit = max_tokens > 0 ? (int64_t)((double)max_tokens * valid_fraction) : 0;
    if (max_tokens > 0 && (train_limit < 1 || valid_limit < 1)) train_limit = valid_limit = 1;

    corpus_t *c = calloc(1, sizeof *c);
    table_t table = {0};
    emit_ctx_t count = {.table = &table, .limit = train_limit};
    for (int64_t i = 0; c && i < n_train_f && !count.failed; i++) tokenize(fortunes.v[i], word_level, emit_count, &count);
    entry_t **order = NULL;
    if (!c || count.failed || !(order = malloc((size_t)(table.n ? table.n : 1) * sizeof *order))) goto nomem;
    int64_t k = 0;
    for (int64_t i = 0; i < table.cap; i++)
        if (table.slots[i].key) order[k++] = &table.slots[i];
    qsort(order, (size_t)k, sizeof *order, by_count_then_bytes);
    entry_t *unk = table_find(&table, "<unk>", 5, false); /* a literal "<unk>" in the text stays <unk> */
    c->word_level = word_level;
    c->vocab_size = 1;
    if (!(c->tokens = calloc((size_t)vocab_cap, sizeof *c->tokens)) || !(c->tokens[0] = strdup("<unk>"))) goto nomem;
    for (int64_t i = 0; i < k && c->vocab_size < vocab_cap; i++) {
        if (order[i] == unk) continue;
        order[i]->id = c->vocab_size;
        if (!(c->tokens[c->vocab_size++] = strdup(order[i]->key))) goto nomem;
    }
    free(order), order = NULL;
    emit_ctx_t tr = {.table = &table, .limit = train_limit}, va = {.table = &table, .limit = valid_limit};
    for (int64_t i = 0; i < n_train_f && !tr.failed; i++) tokenize(fortunes.v[i], word_level, emit_id, &tr);
    for (int64_t i = n_train_f; i < fortunes.n && !va.failed; i++) tokenize(fortunes.v[i], word_level, emit_id, &va);
    c->train = tr.ids, c->n_train = tr.n, c->valid = va.ids, c->n_valid = va.n;
    if (tr.failed || va.failed) goto nomem;
    int64_t unks = 0;
    for (int64_t i = 0; i < c->n_valid; i++) unks += c->valid[i] == 0;
    c->unk_rate_valid = c->n_valid ? (double)unks / (double)c->n_valid : 0;
    c->n_fortunes_train = n_train_f, c->n_fortunes_valid = n_valid_f;
    table_free(&table);
    strvec_free(&fortunes);
    return c;
nomem:
    free(order);
    table_free(&table);
    strvec_free(&fortunes);
    corpus_free(c);
    mpr_error_set(MPR_ERR_NOMEM, "corpus: out of memory");
    return NULL;
}

void corpus_free(corpus_t *c) {
    if (!c) return;
    for (int64_t i = 0; c->tokens && i < c->vocab_size; i++) free(c->tokens[i]);
    free(c->tokens);
    free(c->train);
    free(c->valid);
    free(c);
}

double corpus_unigram_perplexity(const corpus_t *c) {
    double *counts = calloc((size_t)c->vocab_size, sizeof *counts);
    if (!counts || c->n_valid == 0) {
        free(counts);
        return NAN;
    }
    for (int64_t i = 0; i < c->n_train; i++) counts[c->train[i]] += 1;
    double total = (double)c->n_train + (double)c->vocab_size, nll = 0;
    for (int64_t i = 0; i < c->n_valid; i++) nll -= log((counts[c->valid[i]] + 1) / total);
    free(counts);
    return exp(nll / (double)c->n_valid);
}

mpr_tensor_t *corpus_batchify(const int64_t *ids, int64_t n, int64_t batch) {
    int64_t rows = batch > 0 ? n / batch : 0;
    if (rows < 1) {
        mpr_error_set(MPR_ERR_INVALID_ARG, "corpus: %lld tokens cannot fill a batch of %lld columns", (long long)n,
                      (long long)batch);
        return NULL;
    }
    mpr_tensor_t *t = mpr_tensor_empty(MPR_I64, 2, (const int64_t[]){rows, batch});
    if (!t) return NULL;
    int64_t *d = mpr_tensor_data(t);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < batch; j++) d[r * batch + j] = ids[j * rows + r];
    return t;
}
