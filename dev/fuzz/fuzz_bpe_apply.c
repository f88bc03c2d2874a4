// §5.1's merges applied to any text (decode's input, the bpe command): the
// merges of 300 learned from tiny_data/numbers_train.tsv (run from the
// project's top folder), the text cut into words at Unicode's white space and
// each word into subwords (text_tokenize; a new subword joins the vocabulary,
// as in the bpe command). No subword may take a special token's id, and the
// subwords must join back into the words, one space between them. Each
// input gets its own copy of the merges, read from their checkpoint section,
// so that the words cached by one input's cutting do not change the next's:
// an input that fails fails again alone.
#include "fuzz.h"

static Bpe *learned;
static unsigned char *section;
static size_t section_bytes;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!learned) {
        int n = 0;
        fuzz_require(!bpe_learn_from_tsv(&learned, "tiny_data/numbers_train.tsv", 0, 300, &n) &&
                     n == 300,
                     "cannot learn the merges (run from the project's top folder)");
        section = bpe_merges_section(learned, &section_bytes);
    }
    Bpe *merges = NULL;
    fuzz_require(!bpe_read_merges_section(&merges, section, section_bytes, "fuzz"),
                 "the learned merges do not read back from their section");
    char *text = fuzz_text(data, size);
    Vocabulary vocab;
    vocab_init(&vocab);
    vocab_add_subwords(&vocab, learned);
    int *ids = NULL;
    size_t capacity = 0;
    TextSource from = { "fuzz", MAX_UNKNOWN_WARNINGS, 0, NULL };
    int n = text_tokenize(text, &vocab, merges, 1, &ids, &capacity, &from);
    if (n >= 0) {
        for (int i = 0; i < n; i++)
            fuzz_require(ids[i] >= NUM_SPECIAL_TOKENS, "a subword with a special token's id");
        char *joined = tokens_to_text(&vocab, merges, ids, n);
        char *words = checked_calloc(strlen(text) + 1, 1, "fuzz");
        char *w = words;
        size_t length;
        for (const char *p = text; (p = text_next_token(p, &length)) != NULL; p += length) {
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
    vocab_free(&vocab);
    bpe_free_merges(merges);
    free(text);
    return 0;
}
