// BLEU of two files (bleu_files, the bleu command) and of two strings
// (bleu_add_sentence_text). The input: 2 bytes (little-endian) saying where
// the hypothesis file ends, modulo the length; then the hypothesis file;
// then the reference file. The strings' counts are checked against a plain
// count written here, on the words that Unicode's white space separates
// (text_next_token, as the program cuts them): every n-gram of the candidate
// compared with every other, as the definition reads (the program counts in
// a hash table).
#include "fuzz.h"

// Clipped matches of order n between the words start/length[0..nc) and
// [nc..nc+nr), by comparing texts: for each candidate n-gram at its first
// occurrence, min(occurrences in the candidate, in the reference).
static long long plain_clipped_matches(const char **start, const size_t *length, int nc, int nr,
                                       int n) {
    long long matches = 0;
    for (int i = 0; i + n <= nc; i++) {
        int first = 1;
        for (int j = 0; j < i && first; j++) {
            int same = 1;
            for (int k = 0; k < n && same; k++)
                same = length[j + k] == length[i + k] &&
                       !memcmp(start[j + k], start[i + k], length[i + k]);
            first = !same;
        }
        if (!first)
            continue;
        long long counts[2] = { 0, 0 };
        for (int side = 0; side < 2; side++)
            for (int j = side ? nc : 0; j + n <= (side ? nc + nr : nc); j++) {
                int same = 1;
                for (int k = 0; k < n && same; k++)
                    same = length[j + k] == length[i + k] &&
                           !memcmp(start[j + k], start[i + k], length[i + k]);
                counts[side] += same;
            }
        matches += counts[0] < counts[1] ? counts[0] : counts[1];
    }
    return matches;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2)
        return 0;
    size_t split = (size_t)(data[0] | data[1] << 8) % (size - 1);
    const uint8_t *rest = data + 2;
    size_t rest_size = size - 2;
    if (split > rest_size)
        split = rest_size;
    const char *hyp = fuzz_file(0, rest, split, ".hyp"),
               *ref = fuzz_file(1, rest + split, rest_size - split, ".ref");
    BleuStats stats;
    int lines = 0;
    if (!bleu_files(&stats, hyp, ref, data[0] >> 7, &lines)) {   // the high bit: the 13a tokenizer
        double bleu = bleu_score(&stats, NULL, NULL);
        fuzz_require(bleu >= 0 && bleu <= 100 && stats.sentences == lines, "BLEU out of 0..100");
        for (int n = 0; n < BLEU_MAX_ORDER; n++)
            fuzz_require(stats.matches[n] <= stats.totals[n], "more matches than n-grams");
    }
    char *candidate = fuzz_text(rest, split),
         *reference = fuzz_text(rest + split, rest_size - split);
    BleuStats text;
    bleu_reset(&text);
    bleu_add_sentence_text(&text, candidate, reference);
    const char *start[4096];
    size_t length[4096];
    int nc = 0, nr = 0;
    for (int side = 0; side < 2; side++) {
        size_t n;
        for (const char *p = side ? reference : candidate;
             (p = text_next_token(p, &n)) != NULL && nc + nr < 4096; p += n) {
            start[nc + nr] = p;
            length[nc + nr] = n;
            if (side)
                nr++;
            else
                nc++;
        }
    }
    if (nc + nr == 4096) {   // beyond the plain count's room
        free(candidate);
        free(reference);
        return 0;
    }
    fuzz_require(text.candidate_length == nc && text.reference_length == nr, "word counts differ");
    for (int n = 1; n <= BLEU_MAX_ORDER; n++)
        fuzz_require(text.matches[n - 1] == plain_clipped_matches(start, length, nc, nr, n) &&
                     text.totals[n - 1] == (nc >= n ? nc - n + 1 : 0),
                     "n-gram counts differ from the plain count");
    free(candidate);
    free(reference);
    return 0;
}
