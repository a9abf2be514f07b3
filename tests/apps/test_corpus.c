/* test_corpus.c — apps/rnn_lm's corpus (corpus.h) on a small folder of
 * fortune files written here: "%" lines separate fortunes, *.dat files are
 * skipped, word tokens are lower-cased with punctuation and <eos> as tokens,
 * the vocabulary is the most frequent training tokens after <unk> (ties by
 * bytes), held-out fortunes are not in training, the split depends on the
 * seed only, the unigram baseline is add-one smoothed, batchify lays out
 * columns as word_language_model; a missing folder names the package. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "corpus.h"

static char dir[64];

static void write_file(const char *name, const char *text) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/mpirpc_corpus_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    /* 20 one-line fortunes "Aa bb, NN!" in two files; an index file that must be ignored */
    char a[512] = "", b[512] = "";
    for (int i = 0; i < 10; i++) snprintf(a + strlen(a), sizeof a - strlen(a), "Aa bb, %02d!\n%%\n", i);
    for (int i = 10; i < 20; i++) snprintf(b + strlen(b), sizeof b - strlen(b), "aa BB cc %02d.\n%%\n", i);
    write_file("one", a);
    write_file("two", b);
    write_file("one.dat", "zzz zzz zzz zzz\n");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static int64_t id_of(const corpus_t *c, const char *tok) {
    for (int64_t i = 0; i < c->vocab_size; i++)
        if (strcmp(c->tokens[i], tok) == 0) return i;
    return -1;
}

static void test_words(void **state) {
    (void)state;
    corpus_t *c = corpus_load(dir, true, 6, 0.2, 0, 7);
    assert_non_null(c);
    assert_int_equal(c->n_fortunes_train + c->n_fortunes_valid, 20);
    assert_int_equal(c->n_fortunes_valid, 4);
    assert_int_equal(c->vocab_size, 6);
    /* every fortune has aa, bb, <eos> once: they and the punctuation lead the
     * vocabulary; "zzz" (only in the .dat file) never appears */
    assert_string_equal(c->tokens[0], "<unk>");
    assert_true(id_of(c, "aa") > 0 && id_of(c, "bb") > 0 && id_of(c, "<eos>") > 0);
    assert_int_equal(id_of(c, "zzz"), -1);
    assert_int_equal(id_of(c, "Aa"), -1); /* lower-cased */
    for (int64_t i = 0; i < c->n_train; i++) assert_true(c->train[i] >= 0 && c->train[i] < c->vocab_size);
    /* numbers are rare: <unk> in the held-out split */
    assert_true(c->unk_rate_valid > 0);
    /* the same seed gives the same split, another seed another */
    corpus_t *same = corpus_load(dir, true, 6, 0.2, 0, 7), *other = corpus_load(dir, true, 6, 0.2, 0, 8);
    assert_int_equal(same->n_valid, c->n_valid);
    assert_memory_equal(same->valid, c->valid, (size_t)c->n_valid * sizeof *c->valid);
    bool differs = other->n_valid != c->n_valid ||
                   memcmp(other->valid, c->valid, (size_t)c->n_valid * sizeof *c->valid) != 0;
    corpus_t *wide = corpus_load(dir, true, 1000, 0.2, 0, 8); /* no <unk>: the held-out numbers show the split */
    corpus_t *wide7 = corpus_load(dir, true, 1000, 0.2, 0, 7);
    differs |= wide->n_valid != wide7->n_valid ||
               memcmp(wide->valid, wide7->valid, (size_t)wide->n_valid * sizeof *wide->valid) != 0;
    assert_true(differs);
    double ppl = corpus_unigram_perplexity(c);
    assert_true(ppl > 1 && ppl < c->vocab_size + 1);
    corpus_free(wide), corpus_free(wide7), corpus_free(same), corpus_free(other), corpus_free(c);
}

static void test_chars_and_limits(void **state) {
    (void)state;
    corpus_t *c = corpus_load(dir, false, 1000, 0.1, 100, 1);
    assert_non_null(c);
    assert_int_equal(c->n_train, 90); /* max_tokens split 90 / 10 */
    assert_int_equal(c->n_valid, 10);
    assert_true(id_of(c, "\n") > 0 && id_of(c, "a") > 0 && id_of(c, "A") > 0); /* bytes, case kept */
    corpus_free(c);
    assert_null(corpus_load("/nonexistent/fortunes", true, 10, 0.1, 0, 1));
    assert_non_null(strstr(mpr_last_error(), "fortunes"));
    assert_null(corpus_load(dir, true, 1, 0.1, 0, 1)); /* a vocabulary needs <unk> and one token */
}

static void test_batchify(void **state) {
    (void)state;
    int64_t ids[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    mpr_tensor_t *t = corpus_batchify(ids, 10, 3); /* 3 columns of 3, the 10th dropped */
    assert_non_null(t);
    assert_int_equal(mpr_tensor_shape(t)[0], 3);
    assert_int_equal(mpr_tensor_shape(t)[1], 3);
    const int64_t *d = mpr_tensor_data(t);
    int64_t want[9] = {0, 3, 6, 1, 4, 7, 2, 5, 8};
    assert_memory_equal(d, want, sizeof want);
    mpr_tensor_release(t);
    assert_null(corpus_batchify(ids, 2, 3));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_words),
        cmocka_unit_test(test_chars_and_limits),
        cmocka_unit_test(test_batchify),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
