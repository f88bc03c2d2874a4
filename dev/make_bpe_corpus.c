// dev/make_bpe_corpus.py in C: the same synthetic corpus, byte for byte, about 30 times faster
// (the 4.5-million-pair file in under 2 minutes instead of about an hour on a busy 2-core machine).
//
//   cc -O2 -ffp-contract=off -o /tmp/make_bpe_corpus dev/make_bpe_corpus.c -lm
//   /tmp/make_bpe_corpus --pairs 4500000 --types 1500000 --out /tmp/zipf4m5.tsv
//
// The Python script is the definition (its docstring describes the corpus); this file
// transcribes it step by step: the same splitmix64 draws in the same order, the same double
// arithmetic (-ffp-contract=off: no fused multiply-add, so every product and sum rounds as
// Python's floats do; log10 is the C library's, which Python's math.log10 also calls), the same
// bisect_right over the same cumulative sums. Checked byte-identical against the script on
// 2,000 and 200,000 pairs (dev/PERFORMANCE.md, issue 49's section).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state;

static uint64_t rng_next(void) {
    rng_state += 0x9E3779B97F4A7C15ULL;
    uint64_t z = rng_state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint64_t rng_below(uint64_t n) {
    return rng_next() % n;
}

static double rng_uniform(void) {
    return (double)(rng_next() >> 11) * (1.0 / 9007199254740992.0);
}

// A side's letters, as in the script's SIDES table (the same lists in the same order).
typedef struct {
    const char *const *onsets;
    int onset_count;
    const char *const *vowels;
    int vowel_count;
    const char *const *codas;
    int coda_count;
} Letters;

static const char *const source_onsets[] = {
    "", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
    "th", "st", "pr", "tr", "ch", "sh", "gr", "bl", "pl", "str"};
static const char *const source_vowels[] = {"a", "e", "i", "o", "u", "ea", "ou", "y", "ai"};
static const char *const source_codas[] = {
    "", "", "", "n", "r", "s", "t", "l", "nd", "ng", "st", "rt", "m", "ck"};
static const char *const target_onsets[] = {
    "", "b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "w", "z",
    "sch", "st", "pf", "tr", "ch", "gr", "spr", "kl", "fr", "br"};
static const char *const target_vowels[] = {
    "a", "e", "i", "o", "u", "\xc3\xa4", "\xc3\xb6", "\xc3\xbc", "ei", "au", "ie", "eu"};
static const char *const target_codas[] = {
    "", "", "", "n", "r", "s", "t", "l", "nd", "ng", "\xc3\x9f", "ch", "cht", "rn", "en", "er"};

#define COUNT_OF(array) ((int)(sizeof(array) / sizeof((array)[0])))

// One side's word types: their text in one arena, each word's offset and length.
typedef struct {
    char *text;
    size_t used;
    size_t capacity;
    size_t *offsets;
    int *lengths;
    int count;
} Words;

static void *allocate_or_die(size_t bytes) {
    void *memory = malloc(bytes);
    if (memory == NULL) {
        fprintf(stderr, "make_bpe_corpus: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return memory;
}

static uint64_t hash_bytes(const char *bytes, int length) {
    uint64_t hash = 1469598103934665603ULL;   // FNV-1a
    for (int i = 0; i < length; i++) {
        hash ^= (unsigned char)bytes[i];
        hash *= 1099511628211ULL;
    }
    return hash;
}

// The script's make_types: count distinct words, the most frequent (first) shortest. The
// script's `seen` set is an open-addressing table of word indices here (-1: empty).
static void make_types(const Letters *letters, int count, Words *words) {
    words->capacity = (size_t)count * 16 + 64;
    words->text = allocate_or_die(words->capacity);
    words->used = 0;
    words->offsets = allocate_or_die((size_t)count * sizeof(size_t));
    words->lengths = allocate_or_die((size_t)count * sizeof(int));
    words->count = 0;
    size_t slots = 1;
    while (slots < (size_t)count * 2 + 2) {
        slots *= 2;
    }
    int *table = allocate_or_die(slots * sizeof(int));
    for (size_t i = 0; i < slots; i++) {
        table[i] = -1;
    }
    char word[6 * 12 + 1];   // at most 6 syllables of at most 3 + 2 + 3 bytes
    while (words->count < count) {
        int rank = words->count + 1;
        // about 1 syllable for the top words, up to 6 for the rarest (the script's expression,
        // its two terms computed in its order: log10 first, then the draw)
        double frequent_part = log10((double)(rank + 1)) * 0.9;
        double drawn_part = rng_uniform() * 2.2;
        int extra = (int)(frequent_part + drawn_part);
        int syllables = 1 + (extra < 5 ? extra : 5);
        int length = 0;
        for (int s = 0; s < syllables; s++) {
            const char *onset = letters->onsets[rng_below((uint64_t)letters->onset_count)];
            const char *vowel = letters->vowels[rng_below((uint64_t)letters->vowel_count)];
            const char *coda = letters->codas[rng_below((uint64_t)letters->coda_count)];
            const char *parts[3] = {onset, vowel, coda};
            for (int p = 0; p < 3; p++) {
                size_t part_length = strlen(parts[p]);
                memcpy(word + length, parts[p], part_length);
                length += (int)part_length;
            }
        }
        size_t slot = (size_t)hash_bytes(word, length) & (slots - 1);
        int seen = 0;
        while (table[slot] >= 0) {
            int other = table[slot];
            if (words->lengths[other] == length &&
                memcmp(words->text + words->offsets[other], word, (size_t)length) == 0) {
                seen = 1;
                break;
            }
            slot = (slot + 1) & (slots - 1);
        }
        if (seen) {
            continue;
        }
        if (words->used + (size_t)length > words->capacity) {
            words->capacity = words->capacity * 2 + (size_t)length;
            words->text = realloc(words->text, words->capacity);
            if (words->text == NULL) {
                fprintf(stderr, "make_bpe_corpus: out of memory for the words' text\n");
                exit(1);
            }
        }
        memcpy(words->text + words->used, word, (size_t)length);
        words->offsets[words->count] = words->used;
        words->lengths[words->count] = length;
        words->used += (size_t)length;
        table[slot] = words->count;
        words->count++;
    }
    free(table);
}

// Python's bisect.bisect_right: the first index whose value is above x (count if none).
static int bisect_right(const double *values, int count, double x) {
    int low = 0;
    int high = count;
    while (low < high) {
        int middle = low + (high - low) / 2;
        if (x < values[middle]) {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    return low;
}

static long parse_option(const char *name, const char *value) {
    char *end = NULL;
    long parsed = strtol(value, &end, 10);
    if (end == value || *end != '\0') {
        fprintf(stderr, "make_bpe_corpus: %s '%s': expected an integer\n", name, value);
        exit(2);
    }
    return parsed;
}

int main(int argc, char **argv) {
    long pairs = 200000;
    long types = 150000;
    long min_words = 5;
    long max_words = 40;
    long seed = 1;
    const char *out_path = NULL;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) {
            fprintf(stderr, "make_bpe_corpus: %s needs a value\n", argv[i]);
            return 2;
        }
        const char *value = argv[i + 1];
        if (strcmp(argv[i], "--pairs") == 0) {
            pairs = parse_option(argv[i], value);
        } else if (strcmp(argv[i], "--types") == 0) {
            types = parse_option(argv[i], value);
        } else if (strcmp(argv[i], "--min-words") == 0) {
            min_words = parse_option(argv[i], value);
        } else if (strcmp(argv[i], "--max-words") == 0) {
            max_words = parse_option(argv[i], value);
        } else if (strcmp(argv[i], "--seed") == 0) {
            seed = parse_option(argv[i], value);
        } else if (strcmp(argv[i], "--out") == 0) {
            out_path = value;
        } else {
            fprintf(stderr, "make_bpe_corpus: unknown option %s (--pairs --types --min-words"
                            " --max-words --seed --out)\n", argv[i]);
            return 2;
        }
    }
    if (out_path == NULL) {
        fprintf(stderr, "make_bpe_corpus: --out FILE is required\n");
        return 2;
    }
    if (pairs < 0 || min_words < 0 || max_words < min_words || types > 2000000000L) {
        fprintf(stderr, "make_bpe_corpus: expected --pairs >= 0, 0 <= --min-words <= --max-words,"
                        " --types below 2e9\n");
        return 2;
    }
    rng_state = (uint64_t)seed;   // the script's seed & MASK (two's complement for a negative one)
    int half = types / 2 > 1 ? (int)(types / 2) : 1;
    const Letters sides[2] = {
        {source_onsets, COUNT_OF(source_onsets), source_vowels, COUNT_OF(source_vowels),
         source_codas, COUNT_OF(source_codas)},
        {target_onsets, COUNT_OF(target_onsets), target_vowels, COUNT_OF(target_vowels),
         target_codas, COUNT_OF(target_codas)},
    };
    Words vocabularies[2];
    for (int k = 0; k < 2; k++) {
        make_types(&sides[k], half, &vocabularies[k]);
    }
    double *cumulative = allocate_or_die((size_t)half * sizeof(double));
    double total = 0.0;
    for (int rank = 1; rank <= half; rank++) {
        total += 1.0 / (double)rank;
        cumulative[rank - 1] = total;
    }
    unsigned char *seen[2];
    for (int k = 0; k < 2; k++) {
        seen[k] = calloc((size_t)half, 1);
        if (seen[k] == NULL) {
            fprintf(stderr, "make_bpe_corpus: out of memory\n");
            return 1;
        }
    }
    long seen_count[2] = {0, 0};
    FILE *out = fopen(out_path, "wb");
    if (out == NULL) {
        fprintf(stderr, "make_bpe_corpus: cannot write %s\n", out_path);
        return 1;
    }
    static char buffer[1 << 20];
    setvbuf(out, buffer, _IOFBF, sizeof buffer);
    long long tokens = 0;
    uint64_t span = (uint64_t)(max_words - min_words + 1);
    int *ranks = allocate_or_die((size_t)max_words * sizeof(int) + 1);
    for (long pair = 0; pair < pairs; pair++) {
        for (int k = 0; k < 2; k++) {
            int n = (int)(min_words + (long)rng_below(span));
            for (int i = 0; i < n; i++) {
                int rank = bisect_right(cumulative, half, rng_uniform() * total);
                ranks[i] = rank < half ? rank : half - 1;
            }
            for (int i = 0; i < n; i++) {
                const Words *words = &vocabularies[k];
                if (!seen[k][ranks[i]]) {
                    seen[k][ranks[i]] = 1;
                    seen_count[k]++;
                }
                if (i > 0) {
                    fputc(' ', out);
                }
                fwrite(words->text + words->offsets[ranks[i]], 1,
                       (size_t)words->lengths[ranks[i]], out);
            }
            tokens += n;
            fputc(k == 0 ? '\t' : '\n', out);
        }
    }
    if (fclose(out) != 0) {
        fprintf(stderr, "make_bpe_corpus: writing %s failed (disk full?)\n", out_path);
        return 1;
    }
    fprintf(stderr, "%s: %ld pairs, %lld words, %ld source and %ld target word types used of %d"
                    " each\n", out_path, pairs, tokens, seen_count[0], seen_count[1], half);
    for (int k = 0; k < 2; k++) {
        free(vocabularies[k].text);
        free(vocabularies[k].offsets);
        free(vocabularies[k].lengths);
        free(seen[k]);
    }
    free(cumulative);
    free(ranks);
    return 0;
}
