// §5.1's merges applied to any text (decode's input, the bpe command): the
// merges of 300 learned from tiny_data/numbers_train.tsv (run from the
// project's top folder), the text cut into words at white space and each
// word into subwords (tokenize; a new subword joins the vocabulary, as in
// the bpe command). No subword may take a special token's id, and the
// subwords must join back into the words, one space between them.
#include "fuzz.h"

static Bpe *merges;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!merges) {
        Vocabulary learned;
        vocab_init(&learned);
        int n = 0;
        fuzz_require(!bpe_learn_from_tsv(&learned, "tiny_data/numbers_train.tsv", 0, 300, &n) &&
                     n == 300,
                     "cannot learn the merges (run from the project's top folder)");
        merges = learned.bpe;
        learned.bpe = NULL;
        vocab_free(&learned);
    }
    char *text = fuzz_text(data, size);
    Vocabulary vocab;
    vocab_init(&vocab);
    vocab.bpe = merges;
    vocab_add_subwords(&vocab);
    int *ids = NULL;
    size_t capacity = 0;
    TextSource from = { "fuzz", MAX_UNKNOWN_WARNINGS, 0, NULL };
    int n = tokenize(text, &vocab, 1, &ids, &capacity, &from);
    if (n >= 0) {
        for (int i = 0; i < n; i++)
            fuzz_require(ids[i] >= NUM_SPECIAL_TOKENS, "a subword with a special token's id");
        char *joined = tokens_to_text(&vocab, ids, n),
             *words = checked_calloc(strlen(text) + 1, 1, "fuzz"), *w = words;
        size_t length;
        for (const char *p = text; (p = next_token(p, &length)) != NULL; p += length) {
            if (w > words)
                *w++ = ' ';
            memcpy(w, p, length);
            w += length;
        }
        fuzz_require(strcmp(joined, words) == 0, "subwords do not join back into the words");
        free(joined);
        free(words);
    }
    free(ids);
    vocab.bpe = NULL; // shared between inputs
    vocab_free(&vocab);
    free(text);
    return 0;
}
