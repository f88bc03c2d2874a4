// Training data: a TSV file read as train reads it (dataset_read_tsv, whole
// words), and §5.1's merges learned from it (bpe_learn_from_tsv) and applied
// to it as train --bpe does. What training relies on: no sentence holds the id of a
// special token (<pad> <s> </s> <unk>), every subword of a training word is
// in the vocabulary, and the subwords join back into tokens that cut into
// the same subwords. And the ways a big file is read give the same: its words
// counted in parts (one a thread) the same merges, its lines cut in blocks
// (on threads) the same pairs and ids.
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(0, data, size, ".tsv");
    Vocabulary words, vocab;
    Dataset dataset;
    vocab_init(&words);
    memset(&dataset, 0, sizeof dataset);
    const char *words_error = dataset_read_tsv(&dataset, &words, NULL, path, 1);
    for (size_t i = 0; !words_error && i < dataset.num_tokens; i++)
        fuzz_require(dataset.tokens[i] >= NUM_SPECIAL_TOKENS && dataset.tokens[i] < words.size,
                     "a word's id out of range");
    dataset_free(&dataset);
    vocab_free(&words);
    vocab_init(&vocab);
    int learned = 0;
    Bpe *merges = NULL;
    const char *error = bpe_learn_from_tsv(&merges, path, 20, 40, &learned);
    if (!error) {
        fuzz_require(!words_error, "merges learned from a file that does not read");
        vocab_add_subwords(&vocab, merges);
        int size_before = vocab.size;
        error = dataset_read_tsv(&dataset, &vocab, merges, path, 1);
        for (size_t i = 0; !error && i < dataset.num_tokens; i++)
            fuzz_require(dataset.tokens[i] >= NUM_SPECIAL_TOKENS,
                         "a subword with a special token's id");
        fuzz_require(error || vocab.size == size_before,
                     "a training word's subword not in the vocabulary");
        int *ids = NULL;
        size_t capacity = 0;
        for (int p = 0; !error && p < dataset.count; p++) {
            const SentencePair *pair = &dataset.pairs[p];
            char *text = tokens_to_text(&vocab, merges, dataset.tokens + pair->src,
                                        pair->src_len);
            TextSource from = { "fuzz", MAX_UNKNOWN_WARNINGS, 0, NULL };
            int n = text_tokenize(text, &vocab, merges, 0, &ids, &capacity, &from);
            fuzz_require(n == pair->src_len &&
                         memcmp(ids, dataset.tokens + pair->src, (size_t)n * sizeof(int)) == 0,
                         "subwords joined and cut again differ");
            free(text);
        }
        free(ids);
        Vocabulary parts;
        vocab_init(&parts);
        Bpe *parts_merges = NULL;
        counting_parts_asked = 3;
        cutting_block_lines_asked = 3;
        int learned_in_parts = 0;
        const char *parts_error = bpe_learn_for_training(&parts, &parts_merges, path, 20, 40,
                                                         &learned_in_parts);
        fuzz_require(!parts_error && learned_in_parts == learned &&
                     parts_merges->num_merges == merges->num_merges,
                     "the words counted in 3 parts learn other merges");
        for (int r = 0; r < learned; r++)
            fuzz_require(strcmp(parts_merges->left[r], merges->left[r]) == 0 &&
                         strcmp(parts_merges->right[r], merges->right[r]) == 0 &&
                         parts_merges->frequency[r] == merges->frequency[r],
                         "a merge differs, counted in 3 parts");
        Dataset blocks;
        memset(&blocks, 0, sizeof blocks);
        const char *blocks_error = dataset_read_tsv(&blocks, &parts, parts_merges, path, 1);
        fuzz_require(!blocks_error == !error, "cut in blocks, the file reads otherwise");
        fuzz_require(error || (blocks.count == dataset.count &&
                               blocks.num_tokens == dataset.num_tokens &&
                               memcmp(blocks.tokens, dataset.tokens,
                                      dataset.num_tokens * sizeof(int)) == 0),
                     "cut in blocks, other pairs or ids");
        counting_parts_asked = 0;
        cutting_block_lines_asked = 0;
        dataset_free(&blocks);
        vocab_free(&parts);
        bpe_free_merges(parts_merges);
        dataset_free(&dataset);
    }
    bpe_free_merges(merges);
    vocab_free(&vocab);
    return 0;
}
