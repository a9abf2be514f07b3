/* corpus.h — the language model's text: Debian's `fortunes` data files
 * (/usr/share/games/fortunes), tokenized at word or character level with a
 * capped vocabulary, split into training and held-out fortunes, and laid out
 * in batch columns as PyTorch's word_language_model does.
 *
 * Files: every regular file in the folder except the strfile indexes
 * (*.dat), read in name order; fortunes are separated by lines holding only
 * "%". The fortunes are shuffled with the seed and the last valid_fraction
 * of them are held out, so no fortune is in both splits.
 * Tokens. Word level: lower-cased runs of letters, digits, apostrophes and
 * non-ASCII bytes are words; every other printable character is a token of
 * its own; each line ends with "<eos>". Character level: every byte
 * (newline included). Vocabulary: "<unk>" (id 0), then the vocab_cap - 1
 * tokens most frequent in the training split (ties by byte order); other
 * tokens become <unk> in both splits.
 *
 * Ownership: corpus_load returns a corpus the caller frees with
 * corpus_free; tensors returned by corpus_batchify are new references owned
 * by the caller (not by a scope). */
#ifndef RNN_LM_CORPUS_H
#define RNN_LM_CORPUS_H

#include <stdbool.h>
#include <stdint.h>

#include <mpirpc/mpirpc.h>

#define CORPUS_DEFAULT_DIR "/usr/share/games/fortunes"
#define CORPUS_PACKAGE "fortunes"

typedef struct corpus {
    bool word_level;
    int64_t vocab_size;
    char **tokens;   /* id -> text, vocab_size entries */
    int64_t *train, n_train;
    int64_t *valid, n_valid;
    int64_t n_fortunes_train, n_fortunes_valid;
    double unk_rate_valid; /* share of held-out tokens that are <unk> */
} corpus_t;

/* max_tokens > 0 truncates each split to that many tokens times its share
 * (training (1 - valid_fraction), held-out valid_fraction) for short runs.
 * NULL with the error set: MPR_ERR_IO naming the folder (and the Debian
 * package) when it is missing or holds no fortunes, MPR_ERR_INVALID_ARG for
 * bad sizes. */
corpus_t *corpus_load(const char *dir, bool word_level, int64_t vocab_cap, double valid_fraction,
                      int64_t max_tokens, uint64_t seed);
void corpus_free(corpus_t *c);

/* Perplexity of the held-out split under the training split's unigram
 * distribution (add-one smoothed): the baseline an LM must beat. */
double corpus_unigram_perplexity(const corpus_t *c);

/* ids[n] as an int64 tensor [n / batch, batch] whose column j is the j-th
 * contiguous run of n / batch tokens (the remainder is dropped), as
 * word_language_model's batchify. NULL if n < batch. */
mpr_tensor_t *corpus_batchify(const int64_t *ids, int64_t n, int64_t batch);

#endif
