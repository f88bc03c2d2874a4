/* lab/subwords.c: §5.1 byte-pair encoding, for make's ./transformer
 *
 * train --bpe N learns N merges from the training file and trains on
 * subwords; the merges travel in the checkpoint, so that decode and eval cut
 * text the same way; `./transformer bpe` prints the merges or cuts text.
 * transformer.c reads whole words; the lab's text (lab/text.c) cuts words
 * into subwords with the merges here (bpe_split_word) and joins them back
 * (bpe_join_tokens), and its checkpoints keep the merges in a section
 * (bpe_merges_section, bpe_read_merges_section); exact match and BLEU on
 * words are in lab/bleu.c, train's --bpe in lab/runs.c.
 *
 * BUILD  included by lab/lab.c after transformer.c
 */

// ---- §5.1 byte-pair encoding (Sennrich, Haddow & Birch, ACL 2016) ----------
// "Sentences were encoded using byte-pair encoding, which has a shared
// source-target vocabulary of about 37000 tokens." Whole words give every
// word form its own token, and a word never seen in training becomes <unk>.
// Byte-pair encoding (Sennrich et al., "Neural Machine Translation of Rare
// Words with Subword Units") cuts words into subwords instead:
//
//   learn: write every word of the training text as its characters followed
//          by an end-of-word marker, "l o w </w>"; count each adjacent pair of
//          symbols over the word frequencies; merge the most frequent pair
//          into one new symbol everywhere ("e s" -> "es"); repeat N times.
//   apply: cut a word into characters and the marker, then merge in the
//          order learned: the adjacent pair whose merge came first, all its
//          occurrences left to right, until no pair of the word was merged.
//
// Frequent words end up as one symbol, rare ones as a few subwords, and any
// word made of characters seen in training can be written: the model never
// needs <unk> for it. Learning reads the source AND target sides together, so
// the subwords form one vocabulary, which §3.4's shared embedding needs.
//
// Choices the paper leaves open (lab/NOTES.md, "§5.1 subwords"):
//   * The convention: the end-of-word marker </w> of Sennrich et al. The last
//     subword of every word ends in </w> ("zwei und vier zig</w>"), so the
//     tokens join back into words without a second look: append each token;
//     after one that ends in </w>, drop the marker and start a new word.
//     Training words must not contain the text "</w>" themselves.
//   * Symbols start as characters: UTF-8 sequences (u-umlaut is one symbol,
//     not two bytes). Text that is not UTF-8 is refused before it gets here
//     (lab/text.c, text_error); a byte that does not begin a valid
//     sequence (in merges read from a checkpoint, say) is a symbol of its own.
//   * Ties: the most frequent pair is merged; between pairs of the same
//     frequency the one whose left symbol comes first in byte order (strcmp),
//     then whose right symbol comes first. The result depends on the words and
//     their counts only, not on the order of the lines.
//   * Learning stops early when no pair occurs twice: merging a pair seen
//     once only memorises that one word.
//   * No merge makes the text of a special token, <pad> <s> </s> <unk>: the
//     vocabulary gives a text one id, so a subword "<s>", cut from a word of
//     the data such as "<s>0" or "x<s>", would be the start-of-sentence
//     marker inside a sentence. Whole words with that text are refused
//     (text_tokenize); inside a word, learning passes over such a pair (the next
//     most frequent one is merged), and a checkpoint whose merges make one
//     is refused.
// Learning counts pairs once, then each merge visits only the words that
// hold the merged pair (below, "learning the merges").

#ifdef __GLIBC__
#include <malloc.h>   // malloc_trim
#endif

#define BPE_END_OF_WORD "</w>"
#define BPE_END_OF_WORD_BYTES 4

// A hash table from a pair of symbol ids to an int (open addressing; key 0
// marks an empty slot).
typedef struct {
    uint64_t *keys;
    int *values;
    size_t mask, count;
} PairTable;

static uint64_t pair_key(int left, int right) {
    return ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1;
}

static size_t pair_slot(const PairTable *t, uint64_t key) {
    size_t i = (size_t)hash64(key) & t->mask;   // (both symbols' bits mixed into the low bits)
    while (t->keys[i] != 0 && t->keys[i] != key)
        i = (i + 1) & t->mask;
    return i;
}

// The value stored for (left, right), or -1.
static int pair_find(const PairTable *t, int left, int right) {
    if (!t->keys)
        return -1;
    size_t i = pair_slot(t, pair_key(left, right));
    return t->keys[i] ? t->values[i] : -1;
}

static void pair_insert(PairTable *t, int left, int right, int value) {
    if (2 * (t->count + 1) > t->mask + 1 || !t->keys) { // keep the table at most half full
        PairTable bigger = { NULL, NULL, t->keys ? 2 * t->mask + 1 : 255, 0 };
        bigger.keys = checked_calloc(bigger.mask + 1, sizeof(uint64_t), "pair table");
        bigger.values = checked_calloc(bigger.mask + 1, sizeof(int), "pair table");
        for (size_t i = 0; t->keys && i <= t->mask; i++)
            if (t->keys[i]) {
                size_t j = pair_slot(&bigger, t->keys[i]);
                bigger.keys[j] = t->keys[i];
                bigger.values[j] = t->values[i];
                bigger.count++;
            }
        free(t->keys);
        free(t->values);
        *t = bigger;
    }
    size_t i = pair_slot(t, pair_key(left, right));
    if (!t->keys[i]) {
        t->keys[i] = pair_key(left, right);
        t->count++;
    }
    t->values[i] = value;
}

static void pair_table_free(PairTable *t) {
    free(t->keys);
    free(t->values);
    memset(t, 0, sizeof *t);
}

// ---- a table of distinct words -------------------------------------------------
// Learning needs each distinct word once with its count, not the sentences: the
// file is read a line at a time into a table of distinct words, their texts one
// after another in one block of bytes (no allocation per word or sentence).
// Cutting text keeps the subwords of each word it has cut in one too (Bpe.cache).

// A slot of the table: a word's index (-1: empty) and its hash, so that a probe that meets
// another word seldom reads that word's text (a read from far away in memory).
typedef struct {
    int index;
    uint32_t hash;
} WordSlot;

typedef struct {
    char *bytes;        // the words' texts, each ending in a zero byte, one after another
    size_t num_bytes, bytes_capacity;
    size_t *start;      // (num_words) where word k's text begins in bytes
    uint32_t *hash;     // (num_words) its hash
    long *count;        // (num_words) its occurrences (in the pairs not held out)
    int num_words, words_capacity;
    WordSlot *slots;    // (num_slots) open addressing, at most half full
    size_t num_slots;
} WordCounts;

static uint32_t word_hash(const char *word, size_t n) {
    uint32_t hash = 2166136261u;   // FNV-1a
    for (size_t i = 0; i < n; i++) {
        hash ^= (unsigned char)word[i];
        hash *= 16777619u;
    }
    return hash;
}

static void word_counts_free(WordCounts *w) {
    free(w->bytes);
    free(w->start);
    free(w->hash);
    free(w->count);
    free(w->slots);
    memset(w, 0, sizeof *w);
}

// The slot of the n bytes at word (hash: word_hash's): where its index is, or the empty slot.
static size_t word_slot(const WordCounts *w, const char *word, size_t n, uint32_t hash) {
    size_t mask = w->num_slots - 1;
    size_t i = hash64(hash) & mask;
    for (;;) {
        int k = w->slots[i].index;
        if (k < 0)
            return i;
        if (w->slots[i].hash == hash && memcmp(w->bytes + w->start[k], word, n) == 0 &&
            w->bytes[w->start[k] + n] == '\0')
            return i;
        i = (i + 1) & mask;
    }
}

// The index of the n bytes at word (hash: word_hash's) in w, or -1.
static int word_counts_find(const WordCounts *w, const char *word, size_t n, uint32_t hash) {
    if (w->num_slots == 0)
        return -1;
    return w->slots[word_slot(w, word, n, hash)].index;
}

// Counts the n bytes at word `add` times (0: a word of a held-out pair, listed but not counted);
// hash: word_hash(word, n). Returns its index.
static int word_counts_add_hashed(WordCounts *w, const char *word, size_t n, uint32_t hash,
                                  long add) {
    if (2 * ((size_t)w->num_words + 1) > w->num_slots) {   // a bigger table, at most half full
        free(w->slots);
        w->num_slots = w->num_slots ? 2 * w->num_slots : 1024;
        w->slots = checked_calloc(w->num_slots, sizeof(WordSlot), "word table");
        for (size_t i = 0; i < w->num_slots; i++) w->slots[i].index = -1;
        for (int k = 0; k < w->num_words; k++) {
            size_t length = strlen(w->bytes + w->start[k]);
            size_t slot = word_slot(w, w->bytes + w->start[k], length, w->hash[k]);
            w->slots[slot].index = k;
            w->slots[slot].hash = w->hash[k];
        }
    }
    size_t slot = word_slot(w, word, n, hash);
    int k = w->slots[slot].index;
    if (k >= 0) {
        w->count[k] += add;
        return k;
    }
    if (w->num_words == w->words_capacity) {
        w->words_capacity = w->words_capacity ? 2 * w->words_capacity : 1024;
        w->start = checked_realloc(w->start, w->words_capacity, sizeof(size_t), "word table");
        w->hash = checked_realloc(w->hash, w->words_capacity, sizeof(uint32_t), "word table");
        w->count = checked_realloc(w->count, w->words_capacity, sizeof(long), "word table");
    }
    if (w->num_bytes + n + 1 > w->bytes_capacity) {
        w->bytes_capacity = 2 * (w->num_bytes + n + 1) + 65536;
        w->bytes = checked_realloc(w->bytes, w->bytes_capacity, 1, "word table");
    }
    k = w->num_words++;
    w->start[k] = w->num_bytes;
    memcpy(w->bytes + w->num_bytes, word, n);
    w->bytes[w->num_bytes + n] = '\0';
    w->num_bytes += n + 1;
    w->hash[k] = hash;
    w->count[k] = add;
    w->slots[slot].index = k;
    w->slots[slot].hash = hash;
    return k;
}

static int word_counts_add(WordCounts *w, const char *word, size_t n, long add) {
    return word_counts_add_hashed(w, word, n, word_hash(word, n), add);
}

typedef struct Bpe {
    char **left, **right;  // (num_merges) in the order learned: merge r joins left[r] and right[r]
    long *frequency;       // (num_merges) the pair's count when it was merged (0 when read from
                           // a checkpoint)
    int *merged;           // (num_merges) the symbol id of left[r] right[r] joined
    int num_merges, capacity;
    Vocabulary symbols;    // text <-> id of every symbol a merge reads or makes
    PairTable ranks;       // (id of left[r], id of right[r]) -> r
    // The words cut so far (bpe_split_word), each once, so that a word met again is not cut
    // again: cached word k's subwords begin at the bytes cached_starts[cached_first[k] ..] of the
    // word (cached_subwords[k] of them), and had the ids cached_ids[cached_first[k] ..] in the
    // vocabulary that cut it (one that holds these merges; a vocabulary whose id is not that
    // subword's text, as where a test shares the merges, looks the text up instead).
    WordCounts cached;
    size_t *cached_first;
    int *cached_subwords, *cached_ids, *cached_starts;
    size_t num_cached_ids, cached_ids_capacity;
    int cached_capacity;
    int cache_complete;    // every word of the training file is cached (bpe_learn_for_training)
} Bpe;

// While threads cut a file's lines (bpe_read_tsv_on_threads), the cache only answers: no word is
// added to it, and each thread counts the words it cuts on its own (the progress line's count).
static int cutting_on_threads;
static long words_cut_on_this_thread;
#pragma omp threadprivate(words_cut_on_this_thread)

// Words the cache holds at most (each about 40 bytes and its subwords' ids): WMT 2014
// English-German has some 1.5 million distinct words over both sides; rarer words beyond this
// many are cut each time they occur.
#define BPE_CACHE_WORDS (1 << 23)

static void bpe_init(Bpe *b) {
    memset(b, 0, sizeof *b);
    vocab_init(&b->symbols);
}

// Empties the cache of words cut (new merges cut words differently).
static void bpe_cache_free(Bpe *b) {
    b->cache_complete = 0;
    word_counts_free(&b->cached);
    free(b->cached_first);
    free(b->cached_subwords);
    free(b->cached_ids);
    free(b->cached_starts);
    b->cached_starts = NULL;
    b->cached_first = NULL;
    b->cached_subwords = NULL;
    b->cached_ids = NULL;
    b->num_cached_ids = 0;
    b->cached_ids_capacity = 0;
    b->cached_capacity = 0;
}

// Keeps the count subwords of the n bytes at word (not in the cache yet): their ids and where
// each begins in the word.
static void bpe_cache_add(Bpe *b, const char *word, size_t n, const int *ids, const int *starts,
                          int count) {
    if (cutting_on_threads || b->cached.num_words >= BPE_CACHE_WORDS)
        return;
    int k = word_counts_add(&b->cached, word, n, 0);
    if (k >= b->cached_capacity) {
        b->cached_capacity = b->cached_capacity ? 2 * b->cached_capacity : 1024;
        b->cached_first = checked_realloc(b->cached_first, b->cached_capacity, sizeof(size_t),
                                          "subword cache");
        b->cached_subwords = checked_realloc(b->cached_subwords, b->cached_capacity, sizeof(int),
                                             "subword cache");
    }
    if (b->num_cached_ids + (size_t)count > b->cached_ids_capacity) {
        b->cached_ids_capacity = 2 * (b->num_cached_ids + (size_t)count) + 4096;
        b->cached_ids = checked_realloc(b->cached_ids, b->cached_ids_capacity, sizeof(int),
                                        "subword cache");
        b->cached_starts = checked_realloc(b->cached_starts, b->cached_ids_capacity, sizeof(int),
                                           "subword cache");
    }
    b->cached_first[k] = b->num_cached_ids;
    b->cached_subwords[k] = count;
    memcpy(b->cached_ids + b->num_cached_ids, ids, (size_t)count * sizeof(int));
    memcpy(b->cached_starts + b->num_cached_ids, starts, (size_t)count * sizeof(int));
    b->num_cached_ids += (size_t)count;
}

// Gives the memory freed so far back to the system. glibc keeps freed blocks in its heap, and
// after a big block is freed it serves blocks of up to 32 MB from the heap too (its mmap threshold
// grows): after learning merges from a 4.5-million-pair file the process held 206 MB that nothing
// used any more, 16 MB with this call (dev/PERFORMANCE.md, issue 49).
static void give_back_freed_memory(void) {
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

// After the training data is cut: the cache of cut words goes (decoding fills it again), and the
// memory cutting took with it.
static void bpe_release_cut_words(Bpe *merges) {
    if (merges)
        bpe_cache_free(merges);
    give_back_freed_memory();
}

static void bpe_free(Bpe *b);

// Frees merges made by the functions below (and NULL: nothing).
static void bpe_free_merges(Bpe *merges) {
    if (!merges)
        return;
    bpe_free(merges);
    free(merges);
}

static void bpe_free(Bpe *b) {
    for (int r = 0; r < b->num_merges; r++) {
        free(b->left[r]);
        free(b->right[r]);
    }
    free(b->left);
    free(b->right);
    free(b->frequency);
    free(b->merged);
    vocab_free(&b->symbols);
    pair_table_free(&b->ranks);
    bpe_cache_free(b);
    memset(b, 0, sizeof *b);
}

// Appends the merge (left, right), seen `frequency` times.
static void bpe_add_merge(Bpe *b, const char *left, const char *right, long frequency) {
    bpe_cache_free(b);   // (words are cut before any merge is added only in tests)
    if (b->num_merges == b->capacity) {
        b->capacity = b->capacity ? 2 * b->capacity : 64;
        b->left = checked_realloc(b->left, b->capacity, sizeof(char *), "merges");
        b->right = checked_realloc(b->right, b->capacity, sizeof(char *), "merges");
        b->frequency = checked_realloc(b->frequency, b->capacity, sizeof(long), "merges");
        b->merged = checked_realloc(b->merged, b->capacity, sizeof(int), "merges");
    }
    size_t nl = strlen(left), nr = strlen(right);
    char *joined = checked_calloc(nl + nr + 1, 1, "merges");
    memcpy(joined, left, nl);
    memcpy(joined + nl, right, nr);
    int r = b->num_merges++;
    b->left[r] = checked_calloc(nl + 1, 1, "merges");
    memcpy(b->left[r], left, nl);
    b->right[r] = checked_calloc(nr + 1, 1, "merges");
    memcpy(b->right[r], right, nr);
    b->frequency[r] = frequency;
    b->merged[r] = vocab_add(&b->symbols, joined, nl + nr);
    int l = vocab_add(&b->symbols, left, nl), rt = vocab_add(&b->symbols, right, nr);
    if (pair_find(&b->ranks, l, rt) < 0)
        pair_insert(&b->ranks, l, rt, r); // a repeat never applies
    free(joined);
}

// Cuts the n bytes at word into its first symbols: start[i] is where symbol
// i begins (start[count] = n); the last symbol, start[count-1] = n, is the
// end-of-word marker. start has room for n + 2. Returns count.
static int bpe_characters(int *start, const char *word, int n) {
    int count = 0;
    for (int i = 0; i < n; ) {
        int length = utf8_sequence_length((const unsigned char *)word + i);
        if (length == 0 || length > n - i)
            length = 1; // not UTF-8: the byte alone
        start[count++] = i;
        i += length;
    }
    start[count++] = n; // the marker
    start[count] = n;
    return count;
}

// The text of symbol i of a word cut at start[] (count symbols) into out
// (n + 5 bytes): the bytes, and </w> for the last symbol.
static int bpe_symbol_text(char *out, const char *word, const int *start, int count, int i) {
    int length = start[i + 1] - start[i];
    memcpy(out, word + start[i], (size_t)length);
    if (i == count - 1) {
        memcpy(out + length, BPE_END_OF_WORD, BPE_END_OF_WORD_BYTES);
        length += BPE_END_OF_WORD_BYTES;
    }
    out[length] = '\0';
    return length;
}

// The merges that cut one word, in the order applied (explain's page, lab/explain.c): merge
// rank[k] joined the symbol that begins at byte at[k] of the word to the one after it. rank and
// at have room for n + 1 (a word of n bytes has at most n + 1 symbols, the marker among them).
typedef struct {
    int *rank;
    int *at;
    int count;
} BpeTrace;

// apply: cuts the n bytes at word into subwords with b's merges. On return
// start[0..count] (room for n + 2) says where each subword begins, as in
// bpe_characters; the last subword also carries </w>. scratch: room for
// n + 2 ints (each symbol's id); text: n + 5 chars; trace: the merges applied, or NULL.
// Returns count.
static int bpe_encode_word_traced(const Bpe *b, int *start, const char *word, int n,
                                  int *scratch, char *text, BpeTrace *trace) {
    int count = bpe_characters(start, word, n);
    int *id = scratch; // id[i]: symbol i's id in b->symbols, or -1 for a character no merge uses
    for (int i = 0; i < count; i++) {
        int length = bpe_symbol_text(text, word, start, count, i);
        id[i] = vocab_find(&b->symbols, text, (size_t)length);
    }
    for (;;) {
        int best = -1; // the lowest rank of an adjacent pair
        for (int i = 0; i + 1 < count; i++) {
            int r = id[i] < 0 || id[i + 1] < 0 ? -1 : pair_find(&b->ranks, id[i], id[i + 1]);
            if (r >= 0 && (best < 0 || r < best))
                best = r;
        }
        if (best < 0)
            return count;
        int l = vocab_find(&b->symbols, b->left[best], strlen(b->left[best]));
        int rt = vocab_find(&b->symbols, b->right[best], strlen(b->right[best]));
        int kept = 0;
        for (int i = 0; i < count; i++, kept++) { // every occurrence, left to right
            start[kept] = start[i];
            id[kept] = id[i];
            if (i + 1 < count && id[i] == l && id[i + 1] == rt) {
                id[kept] = b->merged[best];
                if (trace) {
                    trace->rank[trace->count] = best;
                    trace->at[trace->count++] = start[i];
                }
                i++;
            }
        }
        start[kept] = n;
        count = kept;
    }
}

static int bpe_encode_word(const Bpe *b, int *start, const char *word, int n, int *scratch,
                           char *text) {
    return bpe_encode_word_traced(b, start, word, n, scratch, text, NULL);
}

// Is left and right joined the text of a special token (<pad> <s> </s> <unk>)?
static int joins_to_special_token(const char *left, const char *right) {
    size_t n = strlen(left);
    for (int i = 0; i < NUM_SPECIAL_TOKENS; i++)
        if (strncmp(special_tokens[i], left, n) == 0 && strcmp(special_tokens[i] + n, right) == 0)
            return 1;
    return 0;
}

// ---- progress lines ----------------------------------------------------------
// Long work (counting the words of a big file, learning merges, cutting the data) prints a line on
// standard error every PROGRESS_SECONDS, in the style of train's step lines: what is done, the
// rate, the time so far and the time left. Only where standard error is a terminal, unless asked:
// --progress (bpe, train) prints them always, so that a log file of a long run shows them too.

#define PROGRESS_SECONDS 3.0

// (--progress sets lab/text.c's progress_always: the lines also when standard error is not a
// terminal)
typedef struct {
    const char *what;   // "bpe    learning merges", "bpe    reading FILE (MB)": the line's start
    const char *unit;   // "merges", "MB": the rate's unit
    double total;       // how much there is to do (0: not known; no time left then)
    double start, last; // wall seconds at the start and at the last line
    int on;             // lines are printed
    int lines;          // lines printed so far
} Progress;

static void progress_begin(Progress *p, const char *what, const char *unit, double total) {
    p->what = what;
    p->unit = unit;
    p->total = total;
    p->start = wall_seconds();
    p->last = p->start;
    p->on = progress_always || isatty(fileno(stderr));
    p->lines = 0;
}

// A count in few digits: 27.4k, 1.98M (as train prints "15.6k tok/s").
static char *count_text(char *text, double x) {   // text holds 32
    if (x >= 1e6)
        snprintf(text, 32, "%.2fM", x / 1e6);
    else if (x >= 1e4)
        snprintf(text, 32, "%.1fk", x / 1e3);
    else if (x >= 100)
        snprintf(text, 32, "%.0f", x);
    else
        snprintf(text, 32, "%.1f", x);
    return text;
}

// done of p->total: a line when the last is PROGRESS_SECONDS old (final: now, if any was printed).
//   bpe    learning merges: 27.4k/37.0k (74.1%) | 4.57k merges/s | elapsed 0:06 | left 0:02
static void progress_show(Progress *p, double done, int final) {
    if (!p->on)
        return;
    double now = wall_seconds();
    if (final && p->lines == 0)
        return;
    if (!final && now - p->last < PROGRESS_SECONDS)
        return;
    double elapsed = now - p->start;
    double rate = elapsed > 0 ? done / elapsed : 0;
    char done_text[32], total_text[32], rate_text[32], spent[32], left[32];
    count_text(done_text, done);
    count_text(rate_text, rate);
    duration(spent, elapsed);
    if (p->total > 0) {
        count_text(total_text, p->total);
        if (rate > 0)
            duration(left, (p->total - done) / rate);
        else
            snprintf(left, sizeof left, "?");
        fprintf(stderr, "%s: %s/%s (%.1f%%) | %s %s/s | elapsed %s | left %s\n", p->what, done_text,
                total_text, 100.0 * done / p->total, rate_text, p->unit, spent, left);
    } else {
        fprintf(stderr, "%s: %s | %s %s/s | elapsed %s\n", p->what, done_text, rate_text, p->unit,
                spent);
    }
    fflush(stderr);
    p->last = now;
    p->lines++;
}

// train --bpe: after the merges are learned, the training file is read again and each of its words
// cut (transformer.c's dataset_read_tsv, through split_word): a progress line of the words cut of
// those the learning counted in it (bpe_words_read).
static long bpe_words_read;   // the words (occurrences) in the last file bpe_learn_from_tsv read
static struct {
    Progress progress;
    long done, total;   // words cut so far, of total
    int on;
} cutting;

static void bpe_cutting_begin(long total) {
    progress_begin(&cutting.progress, "bpe    cutting the training words", "words", (double)total);
    cutting.done = 0;
    cutting.total = total;
    cutting.on = total > 0 && cutting.progress.on;
}

// words more words cut (on threads, a block at a time).
static void bpe_cutting_steps(long words) {
    if (!cutting.on)
        return;
    cutting.done += words;
    int final = cutting.done >= cutting.total;
    progress_show(&cutting.progress, (double)cutting.done, final);
    if (final)
        cutting.on = 0;
}

static void bpe_cutting_step(void) {
    if (cutting_on_threads) {
        words_cut_on_this_thread++;
        return;
    }
    if (!cutting.on)
        return;
    cutting.done++;
    if (cutting.done % 65536 == 0)
        progress_show(&cutting.progress, (double)cutting.done, 0);
    if (cutting.done < cutting.total)
        return;
    progress_show(&cutting.progress, (double)cutting.done, 1);
    cutting.on = 0;
}

// ---- learning the merges ------------------------------------------------------
// Learning keeps, for every pair of adjacent symbols, its count over the
// words (each word's pairs times the word's count) and a list of the words
// that have held it; a merge of (left, right) visits only the words on that
// pair's list, and in each such word takes its pairs' counts away, merges,
// and adds the pairs back. The counts are thus always exactly those that
// counting every word afresh would give (the same counts, the same merges as
// a learner that scans every word at every merge: lab/test_lab.c compares
// them). The most frequent pair comes from a binary heap ordered by the tie
// rule (count, then the left and the right symbol's text), with lazy
// deletion: a pair whose count changed is pushed again with its new count,
// and an entry whose count is no longer its pair's is dropped when it comes
// to the top. The cost grows with the symbols of the words each merge
// touches, not with the whole corpus at every merge (Sennrich's subword-nmt
// and HF tokenizers' trainer work the same way; dev/PERFORMANCE.md).

// The learner's state: the distinct words as symbol ids, and the pairs.
typedef struct {
    // words: word k's symbols are symbols[offset[k] .. offset[k] + length[k]) (shrinking as merges
    // join them), and it occurs count[k] times; visited[k]: the last merge that visited it
    int *symbols, *length, *visited;
    size_t *offset;
    const long *count;
    int num_words;
    // pairs: pair_index maps (left, right) to p; count[p] is the pair's count, its words are on a
    // list of nodes from first_node[p] (node_word, next_node; -1 ends it), which may name a word
    // twice, or one that no longer holds the pair (checked when visited)
    PairTable pair_index;
    int *pair_left, *pair_right, *first_node, *pair_touched;
    long *pair_count, *count_before;
    int num_pairs, pair_capacity;
    int *node_word, *next_node;
    size_t num_nodes, node_capacity;
    // the pairs whose count this merge changed (count_before: the count before it)
    int *changed;
    int num_changed;
    // the heap: (count, pair) entries, the best at 0
    long *heap_count;
    int *heap_pair;
    size_t heap_size, heap_capacity;
    const Vocabulary *texts;   // the symbols' texts, for the tie rule
} BpeLearner;

static int learner_pair(BpeLearner *L, int left, int right) {
    int p = pair_find(&L->pair_index, left, right);
    if (p >= 0)
        return p;
    if (L->num_pairs == L->pair_capacity) {
        int capacity = L->pair_capacity ? 2 * L->pair_capacity : 4096;
        L->pair_left = checked_realloc(L->pair_left, capacity, sizeof(int), "pair counts");
        L->pair_right = checked_realloc(L->pair_right, capacity, sizeof(int), "pair counts");
        L->first_node = checked_realloc(L->first_node, capacity, sizeof(int), "pair counts");
        L->pair_touched = checked_realloc(L->pair_touched, capacity, sizeof(int), "pair counts");
        L->pair_count = checked_realloc(L->pair_count, capacity, sizeof(long), "pair counts");
        L->count_before = checked_realloc(L->count_before, capacity, sizeof(long), "pair counts");
        L->changed = checked_realloc(L->changed, capacity, sizeof(int), "pair counts");
        L->pair_capacity = capacity;
    }
    p = L->num_pairs++;
    L->pair_left[p] = left;
    L->pair_right[p] = right;
    L->first_node[p] = -1;
    L->pair_touched[p] = -1;
    L->pair_count[p] = 0;
    pair_insert(&L->pair_index, left, right, p);
    return p;
}

// Puts word on pair p's list.
static void learner_list_word(BpeLearner *L, int p, int word) {
    if (L->num_nodes == L->node_capacity) {
        size_t capacity = L->node_capacity ? 2 * L->node_capacity : 65536;
        L->node_word = checked_realloc(L->node_word, capacity, sizeof(int), "pair lists");
        L->next_node = checked_realloc(L->next_node, capacity, sizeof(int), "pair lists");
        L->node_capacity = capacity;
    }
    if (L->num_nodes >= INT_MAX) {
        fprintf(stderr, "error: bpe: more than %d entries in the lists of the pairs' words\n",
                INT_MAX);
        exit(1);
    }
    int node = (int)L->num_nodes++;
    L->node_word[node] = word;
    L->next_node[node] = L->first_node[p];
    L->first_node[p] = node;
}

// Adds delta to pair p's count, noting the count it had before this merge (merge: its number).
static void learner_count(BpeLearner *L, int p, long delta, int merge) {
    if (L->pair_touched[p] != merge) {
        L->pair_touched[p] = merge;
        L->count_before[p] = L->pair_count[p];
        L->changed[L->num_changed++] = p;
    }
    L->pair_count[p] += delta;
}

// Does heap entry a come before b: the higher count, then (the tie rule of §5.1's notes above) the
// left symbol first in byte order, then the right one?
static int heap_before(const BpeLearner *L, size_t a, size_t b) {
    if (L->heap_count[a] != L->heap_count[b])
        return L->heap_count[a] > L->heap_count[b];
    const char *const *text = (const char *const *)L->texts->words;
    int pa = L->heap_pair[a], pb = L->heap_pair[b];
    int order = strcmp(text[L->pair_left[pa]], text[L->pair_left[pb]]);
    if (order == 0)
        order = strcmp(text[L->pair_right[pa]], text[L->pair_right[pb]]);
    return order < 0;
}

static void heap_swap(BpeLearner *L, size_t a, size_t b) {
    long count = L->heap_count[a];
    int pair = L->heap_pair[a];
    L->heap_count[a] = L->heap_count[b];
    L->heap_pair[a] = L->heap_pair[b];
    L->heap_count[b] = count;
    L->heap_pair[b] = pair;
}

static void heap_sift_down(BpeLearner *L, size_t i) {
    for (;;) {
        size_t best = i, left = 2 * i + 1, right = 2 * i + 2;
        if (left < L->heap_size && heap_before(L, left, best))
            best = left;
        if (right < L->heap_size && heap_before(L, right, best))
            best = right;
        if (best == i)
            return;
        heap_swap(L, i, best);
        i = best;
    }
}

static void heap_push(BpeLearner *L, int p) {
    if (L->heap_size == L->heap_capacity) {
        size_t capacity = L->heap_capacity ? 2 * L->heap_capacity : 4096;
        L->heap_count = checked_realloc(L->heap_count, capacity, sizeof(long), "pair heap");
        L->heap_pair = checked_realloc(L->heap_pair, capacity, sizeof(int), "pair heap");
        L->heap_capacity = capacity;
    }
    size_t i = L->heap_size++;
    L->heap_count[i] = L->pair_count[p];
    L->heap_pair[i] = p;
    while (i > 0 && heap_before(L, i, (i - 1) / 2)) {
        heap_swap(L, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void heap_pop(BpeLearner *L) {
    L->heap_size--;
    if (L->heap_size == 0)
        return;
    L->heap_count[0] = L->heap_count[L->heap_size];
    L->heap_pair[0] = L->heap_pair[L->heap_size];
    heap_sift_down(L, 0);
}

// Does word k hold the pair (left, right)?
static int learner_word_holds(const BpeLearner *L, int k, int left, int right) {
    const int *s = L->symbols + L->offset[k];
    for (int i = 0; i + 1 < L->length[k]; i++)
        if (s[i] == left && s[i + 1] == right)
            return 1;
    return 0;
}

// Merges (left, right) into joined in word k, every occurrence left to right, and changes the
// pairs' counts by what changed (merge: its number): the pairs that touched a merged symbol go,
// those that touch a new joined symbol come, and word k goes on their lists; the other pairs of
// the word stay as they were. (Subtracting all the word's pairs and adding the new ones back
// gives the same counts, with more look-ups.) mark: room for the word's length.
static void learner_merge_word(BpeLearner *L, int k, int left, int right, int joined, int merge,
                               char *mark) {
    int *s = L->symbols + L->offset[k];
    int n = L->length[k];
    long count = L->count[k];

    // The occurrences, left to right, as the merge below takes them: their two symbols marked.
    for (int i = 0; i < n; i++) mark[i] = 0;
    for (int i = 0; i + 1 < n; i++)
        if (s[i] == left && s[i + 1] == right) {
            mark[i] = 1;
            mark[i + 1] = 1;
            i++;
        }
    for (int i = 0; i + 1 < n; i++)
        if (mark[i] || mark[i + 1]) {
            int p = learner_pair(L, s[i], s[i + 1]);
            learner_count(L, p, -count, merge);
        }

    // The merge; mark now says which symbols are new.
    int kept = 0;
    for (int i = 0; i < n; i++) {
        s[kept] = s[i];
        mark[kept] = 0;
        if (i + 1 < n && s[i] == left && s[i + 1] == right) {
            s[kept] = joined;
            mark[kept] = 1;
            i++;
        }
        kept++;
    }
    L->length[k] = kept;
    for (int i = 0; i + 1 < kept; i++)
        if (mark[i] || mark[i + 1]) {
            int p = learner_pair(L, s[i], s[i + 1]);
            learner_count(L, p, count, merge);
            learner_list_word(L, p, k);
        }
}

// The best pair that may be merged: the top of the heap that is still true, the most frequent
// (the tie rule), not making a special token's text; -1 when no pair occurs twice.
static int learner_best_pair(BpeLearner *L) {
    while (L->heap_size > 0) {
        int p = L->heap_pair[0];
        long count = L->heap_count[0];
        if (count < 2)
            return -1;
        heap_pop(L);
        if (count != L->pair_count[p])
            continue;   // an old entry: the pair's count has changed
        const char *left = L->texts->words[L->pair_left[p]];
        const char *right = L->texts->words[L->pair_right[p]];
        if (joins_to_special_token(left, right))
            continue;   // never merged (§5.1's notes above)
        return p;
    }
    return -1;
}

static void learner_free(BpeLearner *L) {
    free(L->symbols);
    free(L->length);
    free(L->visited);
    free(L->offset);
    pair_table_free(&L->pair_index);
    free(L->pair_left);
    free(L->pair_right);
    free(L->first_node);
    free(L->pair_touched);
    free(L->pair_count);
    free(L->count_before);
    free(L->changed);
    free(L->node_word);
    free(L->next_node);
    free(L->heap_count);
    free(L->heap_pair);
    memset(L, 0, sizeof *L);
}

// learn: up to num_merges merges from n distinct words and their counts,
// appended to b (empty before). Returns how many were learned: fewer when no
// pair occurs twice any more. Every word's characters become symbols of b,
// in the order of the words, even a word counted 0 times (a word only of the
// held-out pairs: its characters are in the model's vocabulary).
static int bpe_learn(Bpe *b, const char *const *words, const long *counts, int n, int num_merges) {
    BpeLearner L;
    memset(&L, 0, sizeof L);
    L.texts = &b->symbols;
    L.count = counts;
    L.num_words = n;
    size_t total = 0;
    for (int k = 0; k < n; k++) total += strlen(words[k]) + 1;
    L.symbols = checked_calloc(total > 0 ? total : 1, sizeof(int), "bpe words");
    L.offset = checked_calloc(n > 0 ? n : 1, sizeof(size_t), "bpe words");
    L.length = checked_calloc(n > 0 ? n : 1, sizeof(int), "bpe words");
    L.visited = checked_calloc(n > 0 ? n : 1, sizeof(int), "bpe words");
    int longest = 0;
    for (int k = 0; k < n; k++) {
        int length = (int)strlen(words[k]);
        if (length > longest)
            longest = length;
    }
    int *start = checked_calloc((size_t)longest + 2, sizeof(int), "bpe words");
    char *mark = checked_calloc((size_t)longest + 2, 1, "bpe words");   // learner_merge_word's
    char *text = checked_calloc((size_t)longest + 5, 1, "bpe words");

    // The words as characters and the marker; the pairs' first counts and lists.
    size_t used = 0;
    for (int k = 0; k < n; k++) {
        int length = (int)strlen(words[k]);
        L.offset[k] = used;
        L.length[k] = bpe_characters(start, words[k], length);
        L.visited[k] = -1;
        for (int i = 0; i < L.length[k]; i++) {
            int text_length = bpe_symbol_text(text, words[k], start, L.length[k], i);
            L.symbols[used + (size_t)i] = vocab_add(&b->symbols, text, (size_t)text_length);
        }
        used += (size_t)L.length[k];
        if (counts[k] == 0)
            continue;   // counts nothing: never on a list, never merged
        const int *s = L.symbols + L.offset[k];
        for (int i = 0; i + 1 < L.length[k]; i++) {
            int p = learner_pair(&L, s[i], s[i + 1]);
            L.pair_count[p] += counts[k];
            int listed = L.first_node[p] >= 0 && L.node_word[L.first_node[p]] == k;
            if (!listed)
                learner_list_word(&L, p, k);
        }
    }
    free(start);
    free(text);
    for (int p = 0; p < L.num_pairs; p++)
        if (L.pair_count[p] >= 2)
            heap_push(&L, p);

    // The merges, one at a time.
    Progress progress;
    progress_begin(&progress, "bpe    learning merges", "merges", num_merges);
    int learned = 0;
    for (; learned < num_merges; learned++) {
        int best = learner_best_pair(&L);
        if (best < 0)
            break;
        int left = L.pair_left[best], right = L.pair_right[best];
        bpe_add_merge(b, b->symbols.words[left], b->symbols.words[right], L.pair_count[best]);
        int joined = b->merged[b->num_merges - 1];
        int node = L.first_node[best];
        L.first_node[best] = -1;   // every word on it is visited now; none will hold the pair after
        L.num_changed = 0;
        while (node >= 0) {
            int k = L.node_word[node];
            node = L.next_node[node];
            if (L.visited[k] == learned)
                continue;   // named twice on the list
            L.visited[k] = learned;
            if (!learner_word_holds(&L, k, left, right))
                continue;
            learner_merge_word(&L, k, left, right, joined, learned, mark);
        }
        for (int i = 0; i < L.num_changed; i++) {
            int p = L.changed[i];
            if (L.pair_count[p] != L.count_before[p] && L.pair_count[p] >= 2)
                heap_push(&L, p);
        }
        progress_show(&progress, learned + 1, 0);
    }
    progress_show(&progress, learned, 1);
    free(mark);
    learner_free(&L);
    return learned;
}

// Joins tokens back into words: each token's text in turn; after a token
// that ends in </w>, the marker is dropped and a space starts the next word.
// Tokens without a marker at all (the special tokens, whole words of a
// vocabulary without merges) are words of their own. Returns a new string.
static char *bpe_join_tokens(const Vocabulary *vocab, const Bpe *merges, const int *ids, int n) {
    size_t bytes = 1;
    for (int i = 0; i < n; i++) bytes += strlen(vocab->words[ids[i]]) + 1;
    char *text = checked_calloc(bytes, 1, "text"), *out = text;
    int word_open = 0; // the last token did not end its word
    for (int i = 0; i < n; i++) {
        const char *token = vocab->words[ids[i]];
        size_t length = strlen(token);
        int ends = length >= BPE_END_OF_WORD_BYTES
                   && strcmp(token + length - BPE_END_OF_WORD_BYTES, BPE_END_OF_WORD) == 0;
        int subword = merges && (ends || ids[i] >= NUM_SPECIAL_TOKENS);
        if (out > text && !word_open)
            *out++ = ' ';
        if (subword && ends)
            length -= BPE_END_OF_WORD_BYTES;
        memcpy(out, token, length);
        out += length;
        word_open = subword && !ends;
    }
    *out = '\0';
    return text;
}

// ---- the words of a TSV file and their counts ------------------------------------
// A big file is counted on threads (issue 49: WMT's 4.5 million pairs): cut at line starts into
// one part a thread, each part's words counted into a table of its own, the tables then merged in
// the parts' order. The first part's words come first in its order, then each later part's words
// not seen before, in its order: the order in which the words first appear in the file, the
// order one thread gives, and so the same symbols and the same merges (lab/test_lab.c compares
// them). Which pairs are held out (every held_out_every-th) depends on the pairs before a part:
// a first pass counts each part's lines and tabs (a good line has one tab), a read of the bytes
// at memory speed.

// ASCII white space for word_counts_add_side, as unicode_white_space says (filled in before any
// thread reads it).
static unsigned char ascii_space[128];

static void ascii_space_fill(void) {
    for (int c = 0; c < 128; c++) {
        char one[3] = { (char)c, 0, 0 };
        ascii_space[c] = (unsigned char)(unicode_white_space(one) > 0);
    }
}

// Counts the words of one side of a pair (text, up to its zero byte); *tokens: how many.
// Returns the special token the side holds (<pad> <s> </s> <unk>, refused), or NULL.
static const char *word_counts_add_side(WordCounts *w, const char *text, long add, int *tokens) {
    // One pass: ASCII white space from a table, the rest as unicode_white_space says
    // (text_next_token's set), each word's hash as its bytes go by (word_hash's FNV-1a).
    *tokens = 0;
    const unsigned char *p = (const unsigned char *)text;
    while (*p) {
        if (*p < 0x80 && ascii_space[*p]) {
            p++;
            continue;
        }
        int space = *p < 0x80 ? 0 : unicode_white_space((const char *)p);
        if (space > 0) {
            p += space;
            continue;
        }
        const unsigned char *start = p;
        uint32_t hash = 2166136261u;
        for (;;) {
            if (*p == 0 || (*p < 0x80 && ascii_space[*p]))
                break;
            if (*p >= 0x80 && unicode_white_space((const char *)p) > 0)
                break;
            hash ^= *p;
            hash *= 16777619u;
            p++;
        }
        size_t length = (size_t)(p - start);
        for (int special = 0; start[0] == '<' && special < NUM_SPECIAL_TOKENS; special++) {
            const char *name = special_tokens[special];
            if (strlen(name) == length && memcmp(start, name, length) == 0)
                return name;
        }
        word_counts_add_hashed(w, (const char *)start, length, hash, add);
        (*tokens)++;
    }
    return NULL;
}

// What a thread says of a bad line: errorf's one buffer is not shared among threads, so the
// line's message is made once they are done, from the line read again (word_counts_read_tsv).
static const char bad_tsv_line[] = "(a bad line)";

// The words of one line (read_text_line's got) into w, add times each; *tokens: how many. NULL,
// or what is wrong with the line (dataset_read_tsv's messages, at from->where): with quiet (on a
// thread) bad_tsv_line only. A blank line counts nothing (*tokens 0, *blank 1).
static const char *word_counts_add_line(WordCounts *w, char *line, int got, long add, int quiet,
                                        TextSource *from, int *tokens, int *blank) {
    *tokens = 0;
    *blank = 0;
    if (quiet && got < 0)
        return bad_tsv_line;
    if (quiet) {
        for (const unsigned char *s = (const unsigned char *)line; *s; ) {
            int n = utf8_sequence_length(s);
            if (n == 0)
                return bad_tsv_line;
            s += n;
        }
    } else {
        const char *error = text_error(line, got, from->where);
        if (error)
            return error;
    }
    char *tab = strchr(line, '\t');
    size_t unused;
    if (!tab && !text_next_token(line, &unused)) {
        *blank = 1;
        return NULL;
    }
    if (!tab || strchr(tab + 1, '\t')) {
        if (quiet)
            return bad_tsv_line;
        if (!tab)
            return errorf("%s: no tab; expected source<TAB>target", from->where);
        return errorf("%s: more than one tab; expected source<TAB>target", from->where);
    }
    *tab = '\0';
    int n_src = 0, n_tgt = 0;
    from->reserved = word_counts_add_side(w, line, add, &n_src);
    if (!from->reserved)
        from->reserved = word_counts_add_side(w, tab + 1, add, &n_tgt);
    *tokens = n_src + n_tgt;
    int too_long = n_src > TRANSFORMER_MAX_LEN || n_tgt > TRANSFORMER_MAX_LEN;
    if (!from->reserved && n_src > 0 && n_tgt > 0 && !too_long)
        return NULL;
    if (quiet)
        return bad_tsv_line;
    if (from->reserved)
        return reserved_token_error(from);
    if (n_src == 0)
        return errorf("%s: empty source; expected tokens before the tab", from->where);
    if (n_tgt == 0)
        return errorf("%s: empty target; expected tokens after the tab", from->where);
    return errorf("%s: %d tokens; expected at most %d", from->where, n_src > n_tgt ? n_src : n_tgt,
                  TRANSFORMER_MAX_LEN);
}

// One part of a file for word_counts_read_tsv: whole lines, counted by one thread.
typedef struct {
    const char *path;      // the file
    int quiet;             // on a thread, among others: word_counts_add_line's quiet
    off_t begin, end;      // its bytes [begin, end) (end -1: to the end of the file)
    int last;              // it ends the file (the parts after it are empty): read to the end
    int lines_before;      // the file's lines before begin
    long pairs_before;     // the file's pairs before begin (which of its pairs are held out)
    int newlines, tabs;    // the first pass's count of '\n' and '\t' bytes in the part
    WordCounts words;      // its words, in the order they first appear in the part
    long words_read;       // the words (occurrences) in it
    long pairs;            // its pairs
    int lines;             // its lines read
    int bad_line;          // the line number of its first bad line (0: none)
    const char *error;     // that line's message (quiet: bad_tsv_line)
    int read_errno;        // a read that failed: its errno (0: none)
    long bytes_done;       // read so far (the progress line; written and read atomically)
    int failed;            // a bad line or a read error: the later parts stop (atomically too)
} CountingPart;

// Parts of at least this many bytes: a smaller file is counted on one thread.
static const off_t counting_part_bytes = 64L << 20;
// The parts asked for (0: one a thread, the threads OpenMP would use, each of counting_part_bytes
// or more); the tests ask for 1 to 7 parts of a small file.
static int counting_parts_asked = 0;

// The first line start at or after offset pos of f (its size if none).
static off_t line_start_from(FILE *f, off_t pos, off_t size) {
    if (pos <= 0)
        return 0;
    if (pos >= size || fseeko(f, pos - 1, SEEK_SET) != 0)
        return size;
    int c;
    while ((c = getc(f)) != EOF && c != '\n') {
    }
    off_t at = ftello(f);
    return c == EOF || at < 0 ? size : at;
}

// The first pass: counts the '\n' and '\t' bytes of part (file: its own handle).
static void counting_part_first_pass(CountingPart *part, FILE *file) {
    static const size_t block = 1 << 20;
    unsigned char *bytes = checked_calloc(block, 1, "file block");
    int newlines = 0, tabs = 0;
    off_t left = part->end - part->begin;
    if (fseeko(file, part->begin, SEEK_SET) != 0)
        left = 0;
    while (left > 0) {
        size_t want = left < (off_t)block ? (size_t)left : block;
        size_t got = fread(bytes, 1, want, file);
        for (size_t i = 0; i < got; i++) {
            newlines += bytes[i] == '\n';
            tabs += bytes[i] == '\t';
        }
        if (got < want)
            break;
        left -= (off_t)got;
    }
    part->newlines = newlines;
    part->tabs = tabs;
    free(bytes);
}

// Counts the words of part index's lines into its table (one thread; file: its own handle; path:
// for messages). Stops at the first bad line, or when an earlier part has had one. progress: the
// line to show (part 0's thread), the bytes of all num_parts parts summed.
static void counting_part_count(CountingPart *parts, int num_parts, int index, FILE *file,
                                int held_out_every, Progress *progress) {
    CountingPart *part = &parts[index];
    TextSource from = { "", 0, 0, NULL };
    char *line = NULL;
    size_t line_capacity = 0;
    if (part->end >= 0 && fseeko(file, part->begin, SEEK_SET) != 0)   // (one of parts)
        part->read_errno = errno ? errno : EIO;
    for (;;) {
        if (part->read_errno)
            break;
        if (!part->last && part->lines == part->newlines)
            break;   // (no ftello a line: a system call)
        int line_no = part->lines_before + part->lines + 1;
        int got = read_text_line(file, &line, &line_capacity, line_no);
        if (got == 0)
            break;
        part->lines++;
        if (part->lines % 4096 == 0) {
            #pragma omp atomic write
            part->bytes_done = (long)(ftello(file) - part->begin);
            int earlier_failed = 0;
            for (int i = 0; i < index; i++) {
                int failed;
                #pragma omp atomic read
                failed = parts[i].failed;
                earlier_failed |= failed;
            }
            if (earlier_failed)
                break;   // that part's bad line is the file's first
            if (progress) {
                long all = 0;
                for (int i = 0; i < num_parts; i++) {
                    long b;
                    #pragma omp atomic read
                    b = parts[i].bytes_done;
                    all += b;
                }
                progress_show(progress, (double)all / 1e6, 0);
            }
        }
        long pair_number = part->pairs_before + part->pairs + 1;   // (in the file, from 1)
        long add = held_out_every > 0 && pair_number % held_out_every == 0 ? 0 : 1;
        int tokens = 0, blank = 0;
        if (!part->quiet)
            snprintf(from.where, sizeof from.where, "%s:%d", part->path, line_no);
        const char *error = word_counts_add_line(&part->words, line, got, add, part->quiet, &from,
                                                 &tokens, &blank);
        if (error) {
            part->error = error;
            part->bad_line = line_no;
            break;
        }
        part->words_read += tokens;
        part->pairs += !blank;
    }
    if (!part->bad_line && !part->read_errno && ferror(file))
        part->read_errno = errno ? errno : EIO;
    #pragma omp atomic write
    part->failed = part->bad_line > 0 || part->read_errno != 0;
    #pragma omp atomic write
    part->bytes_done = (long)(ftello(file) - part->begin);
    free(line);
}

// The message of part's bad line, made again from the line read again (f: a handle of the file),
// or of its failed read.
static const char *counting_part_error(const CountingPart *part, FILE *f) {
    if (part->read_errno)
        return errorf("%s: read error: %s", part->path, strerror(part->read_errno));
    if (!part->quiet)
        return part->error;
    TextSource from = { "", 0, 0, NULL };
    snprintf(from.where, sizeof from.where, "%s:%d", part->path, part->bad_line);
    char *line = NULL;
    size_t capacity = 0;
    const char *error = NULL;
    int got = fseeko(f, part->begin, SEEK_SET) == 0;
    for (int line_no = part->lines_before + 1; got != 0 && line_no <= part->bad_line; line_no++)
        got = read_text_line(f, &line, &capacity, line_no);
    WordCounts scratch;
    memset(&scratch, 0, sizeof scratch);
    int tokens, blank;
    if (got != 0)
        error = word_counts_add_line(&scratch, line, got, 1, 0, &from, &tokens, &blank);
    if (!error)
        error = errorf("%s: the file changed while it was read", from.where);
    word_counts_free(&scratch);
    free(line);
    return error;
}

// Appends the words of from (its order, its counts) to w, those not there yet; w's own stay.
static void word_counts_merge(WordCounts *w, const WordCounts *from) {
    for (int k = 0; k < from->num_words; k++) {
        size_t start = from->start[k];
        size_t end = k + 1 < from->num_words ? from->start[k + 1] : from->num_bytes;
        word_counts_add_hashed(w, from->bytes + start, end - start - 1, from->hash[k],
                               from->count[k]);
    }
}

// Reads the words of both sides of the TSV file at path into w, in the order they first appear,
// with dataset_read_tsv's checks and its messages (a line's errors, an empty file); held_out_every
// > 0: the pairs train holds out (every held_out_every-th) are listed, not counted.
// Unlike dataset_read_tsv, no limit on the distinct words (TRANSFORMER_MAX_VOCAB): they are cut.
// A file of parts of counting_part_bytes or more is counted on threads (above).
static const char *word_counts_read_tsv(WordCounts *w, const char *path, int held_out_every) {
    const char *error = NULL;
    FILE *f = open_text_file(path, &error);
    if (!f)
        return error;
    struct stat st;
    int regular = fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode);
    off_t size = regular ? st.st_size : 0;
    int num_parts = counting_parts_asked > 0 ? counting_parts_asked : thread_count();
    if (counting_parts_asked == 0 && num_parts > size / counting_part_bytes)
        num_parts = (int)(size / counting_part_bytes);
    if (num_parts > 64)
        num_parts = 64;
    if (num_parts < 1 || !regular)
        num_parts = 1;
    ascii_space_fill();
    CountingPart *parts = checked_calloc((size_t)num_parts, sizeof(CountingPart), "file parts");
    FILE **files = checked_calloc((size_t)num_parts, sizeof(FILE *), "file parts");
    files[0] = f;
    for (int i = 1; i < num_parts && !error; i++) files[i] = open_text_file(path, &error);
    for (int i = 0; i < num_parts; i++) {
        parts[i].path = path;
        parts[i].quiet = num_parts > 1;
        parts[i].begin = i == 0 ? 0 : line_start_from(f, size / num_parts * i, size);
        if (i > 0 && parts[i].begin < parts[i - 1].begin)
            parts[i].begin = parts[i - 1].begin;
        if (i > 0)
            parts[i - 1].end = parts[i].begin;
        parts[i].end = num_parts > 1 ? size : -1;
    }
    for (int i = 0; i < num_parts; i++)   // (a part that ends the file may end without a newline)
        parts[i].last = i == num_parts - 1 || parts[i].end == size;
    if (!error && num_parts > 1) {   // the lines and the pairs before each part
        #pragma omp parallel for num_threads(num_parts) schedule(static, 1)
        for (int i = 0; i < num_parts - 1; i++) counting_part_first_pass(&parts[i], files[i]);
        for (int i = 1; i < num_parts; i++) {
            parts[i].lines_before = parts[i - 1].lines_before + parts[i - 1].newlines;
            parts[i].pairs_before = parts[i - 1].pairs_before + parts[i - 1].tabs;
        }
    }
    char what[200];
    snprintf(what, sizeof what, "bpe    reading %.120s (MB)", path);
    Progress progress;
    progress_begin(&progress, what, "MB", (double)size / 1e6);
    if (!error && num_parts == 1)
        counting_part_count(parts, 1, 0, f, held_out_every, &progress);
    if (!error && num_parts > 1) {
        #pragma omp parallel for num_threads(num_parts) schedule(static, 1)
        for (int i = 0; i < num_parts; i++)
            counting_part_count(parts, num_parts, i, files[i], held_out_every,
                                i == 0 ? &progress : NULL);
    }
    long pairs = 0, words_read = 0, bytes = 0;
    int lines = 0;
    for (int i = 0; i < num_parts && !error; i++) {
        if (parts[i].failed)
            error = counting_part_error(&parts[i], f);
        pairs += parts[i].pairs;
        words_read += parts[i].words_read;
        lines += parts[i].lines;
        bytes += parts[i].bytes_done;
    }
    if (!error && pairs == 0)
        error = errorf("%s: no sentence pairs (%s); expected lines source<TAB>target",
                       path, lines == 0 ? "the file is empty" : "only blank lines");
    if (!error) {
        progress_show(&progress, (double)bytes / 1e6, 1);
        bpe_words_read += words_read;
        *w = parts[0].words;
        memset(&parts[0].words, 0, sizeof parts[0].words);
        for (int i = 1; i < num_parts; i++) word_counts_merge(w, &parts[i].words);
    }
    for (int i = 0; i < num_parts; i++) {
        word_counts_free(&parts[i].words);
        if (files[i])
            fclose(files[i]);
    }
    free(parts);
    free(files);
    return error;
}

// bpe_learn_from_tsv's work, the distinct words of the file left in *w (the caller frees them).
static const char *bpe_learn_words(Bpe **merges, const char *path, int held_out_every,
                                   int num_merges, int *learned, WordCounts *w) {
    bpe_words_read = 0;
    const char *error = word_counts_read_tsv(w, path, held_out_every);
    for (int k = 0; !error && k < w->num_words; k++)
        if (strstr(w->bytes + w->start[k], BPE_END_OF_WORD))
            error = errorf("%s: the word '%.80s' holds the end-of-word marker %s; expected words "
                           "without it (with --bpe, a subword ending in %s ends a word)", path,
                           w->bytes + w->start[k], BPE_END_OF_WORD, BPE_END_OF_WORD);
    if (!error) {
        size_t num_words = w->num_words > 0 ? (size_t)w->num_words : 1;
        const char **words = checked_calloc(num_words, sizeof(char *), "words");
        for (int k = 0; k < w->num_words; k++) words[k] = w->bytes + w->start[k];
        Bpe *b = checked_calloc(1, sizeof(Bpe), "merges");
        bpe_init(b);
        *learned = bpe_learn(b, words, w->count, w->num_words, num_merges);
        bpe_free_merges(*merges);
        *merges = b;
        free(words);
    }
    return error;
}

// §5.1: learns up to num_merges merges from the words of both sides of the
// TSV file at path into *merges (which it replaces). The words
// are read with dataset_read_tsv's checks (word_counts_read_tsv); held_out_every > 0
// leaves out the pairs train holds out (dataset_read_tsv_split), so that held-out words
// teach no merges. *learned: how many merges there are (fewer when no pair
// occurs twice any more).
static const char *bpe_learn_from_tsv(Bpe **merges, const char *path, int held_out_every,
                                      int num_merges, int *learned) {
    WordCounts w;
    memset(&w, 0, sizeof w);
    const char *error = bpe_learn_words(merges, path, held_out_every, num_merges, learned, &w);
    word_counts_free(&w);
    give_back_freed_memory();   // (the learner's pairs and lists, the word counts)
    return error;
}

// The model's vocabulary with merges: every symbol the merges know, the
// characters of the training words and each merge's result, so that any
// word made of these characters is written without <unk>, even when it
// needs a subword that no training word kept (a later merge took it).
static void vocab_add_subwords(Vocabulary *vocab, const Bpe *merges) {
    const Vocabulary *symbols = &merges->symbols;
    for (int id = NUM_SPECIAL_TOKENS; id < symbols->size; id++)
        vocab_add(vocab, symbols->words[id], strlen(symbols->words[id]));
}

// ---- cutting words into subwords, and joining them back ----------------------

// Is id's text in vocab the n bytes at piece, followed by </w> when it is a word's last subword?
static int vocabulary_holds(const Vocabulary *vocab, int id, const char *piece, int n, int last) {
    if (id < 0 || id >= vocab->size)
        return 0;
    const char *text = vocab->words[id];
    if (strncmp(text, piece, (size_t)n) != 0)
        return 0;   // (stops at text's end: no read past it)
    return last ? strcmp(text + n, BPE_END_OF_WORD) == 0 : text[n] == '\0';
}

// The subwords of one word (with b's merges), pushed as ids at ids[n..].
// Returns the new n. A word cut before is not cut again: the cache
// (Bpe.cached) says where its subwords begin, and each cached id is taken
// where vocab holds that subword's text there; otherwise (a subword read as
// <unk>, warned of each time; another vocabulary) the text is looked up.
static int bpe_split_word(Vocabulary *vocab, Bpe *b, int grow, const char *word, int length,
                          int **ids, size_t *capacity, int n, TextSource *from) {
    bpe_cutting_step();
    int k = word_counts_find(&b->cached, word, (size_t)length, word_hash(word, (size_t)length));
    if (k >= 0) {
        const int *cached = b->cached_ids + b->cached_first[k];
        const int *starts = b->cached_starts + b->cached_first[k];
        int count = b->cached_subwords[k];
        char *text = NULL;
        for (int i = 0; i < count; i++) {
            int last = i == count - 1;
            int end = last ? length : starts[i + 1];
            int id = cached[i];
            if (!vocabulary_holds(vocab, id, word + starts[i], end - starts[i], last)) {
                if (!text)
                    text = checked_calloc((size_t)length + 5, 1, "subwords");
                int text_length = end - starts[i];
                memcpy(text, word + starts[i], (size_t)text_length);
                if (last) {
                    memcpy(text + text_length, BPE_END_OF_WORD, BPE_END_OF_WORD_BYTES);
                    text_length += BPE_END_OF_WORD_BYTES;
                }
                text[text_length] = '\0';
                id = token_id(vocab, grow, text, (size_t)text_length, from);
            }
            push_id(ids, capacity, n++, id);
        }
        free(text);
        return n;
    }
    int *start = checked_calloc((size_t)length + 2, sizeof(int), "subwords");
    int *scratch = checked_calloc((size_t)length + 2, sizeof(int), "subwords");
    char *text = checked_calloc((size_t)length + 5, 1, "subwords");
    int count = bpe_encode_word(b, start, word, length, scratch, text);
    int first = n;
    for (int i = 0; i < count; i++) {
        int text_length = bpe_symbol_text(text, word, start, count, i);
        push_id(ids, capacity, n++, token_id(vocab, grow, text, (size_t)text_length, from));
    }
    bpe_cache_add(b, word, (size_t)length, *ids + first, start, count);
    free(start);
    free(scratch);
    free(text);
    return n;
}


// ---- cutting the training data on threads ---------------------------------------
// train --bpe reads the training file twice: once to count its words (above, on threads) and
// learn the merges, once to cut each pair's words into subwords (lab/text.c's
// dataset_read_tsv_split). The cutting is mostly looking words up in the cache, 200 million
// times in WMT's 4.5 million pairs, which threads can do together once every word of the file is
// in the cache: bpe_learn_for_training cuts each distinct word once, in the order the words first
// appear in the file (the order reading it meets them, so that the vocabulary would grow the
// same way), and then the file is read in blocks of lines: one thread reads a block, the threads
// cut its lines, and one thread adds the pairs in order. A block with anything the threads do not
// take (a bad line, a word whose subword the vocabulary lacks: it would grow, or warn) is read
// again the plain way, line by line, with its messages: the same pairs, ids and messages either
// way (lab/test_lab.c compares them).

// The lines of a block, cut at most this many at a time.
#define CUT_BLOCK_LINES 16384
// The tests: blocks of this many lines (0: CUT_BLOCK_LINES), and threads for a small file.
static int cutting_block_lines_asked = 0;

// train --bpe N: learns the merges from the file (bpe_learn_from_tsv), gives vocab every subword
// they know (vocab_add_subwords), and cuts each distinct word of the file once into the cache.
static const char *bpe_learn_for_training(Vocabulary *vocab, Bpe **merges, const char *path,
                                          int held_out_every, int num_merges, int *learned) {
    WordCounts w;
    memset(&w, 0, sizeof w);
    const char *error = bpe_learn_words(merges, path, held_out_every, num_merges, learned, &w);
    if (!error) {
        vocab_add_subwords(vocab, *merges);
        cutting.on = 0;   // (these words are not the data's progress line)
        TextSource from = { "", 0, 0, NULL };
        snprintf(from.where, sizeof from.where, "%s", path);
        int *ids = NULL;
        size_t capacity = 0;
        for (int k = 0; k < w.num_words; k++) {
            const char *word = w.bytes + w.start[k];
            bpe_split_word(vocab, *merges, 1, word, (int)strlen(word), &ids, &capacity, 0, &from);
        }
        free(ids);
        (*merges)->cache_complete = (*merges)->cached.num_words == w.num_words;
    }
    word_counts_free(&w);
    give_back_freed_memory();
    return error;
}

// Are the words cut on threads when f is read: merges whose cache holds every word of the
// training file, more than one thread, and a file big enough for them to pay?
static int bpe_cut_on_threads(const Bpe *merges, FILE *f) {
    struct stat st;
    if (!merges || !merges->cache_complete)
        return 0;
    if (cutting_block_lines_asked > 0)
        return 1;   // (the tests: also on one thread)
    if (thread_count() < 2)
        return 0;
    return fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= counting_part_bytes;
}

// A block of lines and what the threads made of them.
typedef struct {
    char *text;             // the lines, one after another, each ending in a zero byte
    size_t used, capacity;
    size_t *start;          // (count) where line i begins in text
    int *got;               // read_text_line's answer for line i
    int *tab;               // where line i's tab was, put back for a plain reading (-1: none)
    int *status;            // CUT_PAIR (ids below), CUT_BLANK, or CUT_PLAINLY (read it plainly)
    int *owner;             // the thread whose ids line i's are
    size_t *first_id;       // where they begin among its ids
    int *src_len, *tgt_len;
    int count, capacity_lines;
    int **thread_ids;       // (threads) each thread's ids of this block
    size_t *thread_ids_used, *thread_ids_capacity;
    int threads;
} CutBlock;

enum { CUT_PAIR, CUT_BLANK, CUT_PLAINLY };

// Reads up to CUT_BLOCK_LINES lines of f into block (*line_no: the lines read before). Returns
// how many; 0 at the end.
static int cut_block_read(CutBlock *block, FILE *f, int line_no, int max_lines, char **line,
                          size_t *line_capacity) {
    block->count = 0;
    block->used = 0;
    while (block->count < max_lines) {
        int got = read_text_line(f, line, line_capacity, line_no + block->count + 1);
        if (got == 0)
            break;
        size_t length = got < 0 ? 0 : strlen(*line);   // (a zero byte: the plain reading's error)
        if (block->used + length + 1 > block->capacity) {
            block->capacity = 2 * (block->used + length + 1);
            block->text = checked_realloc(block->text, block->capacity, 1, "lines");
        }
        memcpy(block->text + block->used, *line, length);
        block->text[block->used + length] = '\0';
        int i = block->count++;
        block->start[i] = block->used;
        block->got[i] = got;
        block->tab[i] = -1;
        block->used += length + 1;
    }
    return block->count;
}

// Cuts line i of block on this thread (number thread): its ids, or CUT_PLAINLY for anything
// dataset_read_tsv_split's plain reading must see (an error, an <unk>, a growing vocabulary).
static void cut_block_line(CutBlock *block, int i, int thread, const TsvReading *r,
                           TsvBuffers *ids, TextSource *from) {
    char *line = block->text + block->start[i];
    block->status[i] = CUT_PLAINLY;
    if (block->got[i] < 0)
        return;
    for (const unsigned char *s = (const unsigned char *)line; *s; ) {
        int n = utf8_sequence_length(s);
        if (n == 0)
            return;
        s += n;
    }
    char *tab = strchr(line, '\t');
    size_t unused;
    if (!tab && !text_next_token(line, &unused)) {
        block->status[i] = CUT_BLANK;
        return;
    }
    if (!tab || strchr(tab + 1, '\t'))
        return;
    *tab = '\0';
    block->tab[i] = (int)(tab - line);
    long unknown = from->unknown;
    int n_src = text_tokenize(line, r->vocab, r->merges, 0, &ids->src, &ids->src_capacity, from);
    int n_tgt = -1;
    if (n_src > 0) {
        n_tgt = text_tokenize(tab + 1, r->vocab, r->merges, 0, &ids->tgt, &ids->tgt_capacity,
                              from);
    }
    if (n_src <= 0 || n_tgt <= 0 || from->unknown != unknown)
        return;
    if (n_src > TRANSFORMER_MAX_LEN || n_tgt > TRANSFORMER_MAX_LEN)
        return;
    size_t needed = block->thread_ids_used[thread] + (size_t)n_src + (size_t)n_tgt;
    if (needed > block->thread_ids_capacity[thread]) {
        block->thread_ids_capacity[thread] = 2 * needed;
        block->thread_ids[thread] = checked_realloc(block->thread_ids[thread], 2 * needed,
                                                    sizeof(int), "subword ids");
    }
    int *out = block->thread_ids[thread] + block->thread_ids_used[thread];
    memcpy(out, ids->src, (size_t)n_src * sizeof(int));
    memcpy(out + n_src, ids->tgt, (size_t)n_tgt * sizeof(int));
    block->owner[i] = thread;
    block->first_id[i] = block->thread_ids_used[thread];
    block->src_len[i] = n_src;
    block->tgt_len[i] = n_tgt;
    block->thread_ids_used[thread] = needed;
    block->status[i] = CUT_PAIR;
}

// The block's lines cut on the threads, each an equal share of the lines in order. Returns the
// words cut.
static long cut_block_on_threads(CutBlock *block, const TsvReading *r) {
    long words = 0;
    cutting_on_threads = 1;
    #pragma omp parallel num_threads(block->threads) reduction(+ : words)
    {
        int first, end, thread = 0;
#ifdef _OPENMP
        thread = omp_get_thread_num();
#endif
        thread_share(block->count, &first, &end);
        TsvBuffers ids = { 0 };
        TextSource from = { "", MAX_UNKNOWN_WARNINGS, 0, NULL };   // (warns of nothing)
        block->thread_ids_used[thread] = 0;
        words_cut_on_this_thread = 0;
        for (int i = first; i < end; i++) cut_block_line(block, i, thread, r, &ids, &from);
        words = words_cut_on_this_thread;
        free(ids.src);
        free(ids.tgt);
    }
    cutting_on_threads = 0;
    return words;
}

// The block's pairs into r's datasets in order; or, where a line needs it, the whole block read
// plainly (tsv_read_line), its tabs put back (*plainly 1). NULL, or the error of a line (line_no:
// the lines before the block).
static const char *cut_block_add(CutBlock *block, TsvReading *r, int line_no, int *plainly_read) {
    int plainly = r->vocab->size > TRANSFORMER_MAX_VOCAB;
    for (int i = 0; i < block->count && !plainly; i++) plainly = block->status[i] == CUT_PLAINLY;
    *plainly_read = plainly;
    for (int i = 0; i < block->count && plainly; i++) {
        char *line = block->text + block->start[i];
        if (block->tab[i] >= 0)
            line[block->tab[i]] = '\t';
        const char *error = tsv_read_line(r, line, block->got[i], line_no + i + 1);
        if (error)
            return error;
    }
    for (int i = 0; i < block->count && !plainly; i++) {
        if (block->status[i] == CUT_BLANK)
            continue;
        const int *ids = block->thread_ids[block->owner[i]] + block->first_id[i];
        dataset_add(tsv_next_pair_dataset(r), ids, block->src_len[i], ids + block->src_len[i],
                    block->tgt_len[i], line_no + i + 1);
        r->pairs++;
    }
    return NULL;
}

static void cut_block_free(CutBlock *block) {
    for (int t = 0; t < block->threads; t++) free(block->thread_ids[t]);
    free(block->thread_ids);
    free(block->thread_ids_used);
    free(block->thread_ids_capacity);
    free(block->text);
    free(block->start);
    free(block->got);
    free(block->tab);
    free(block->status);
    free(block->owner);
    free(block->first_id);
    free(block->src_len);
    free(block->tgt_len);
    memset(block, 0, sizeof *block);
}

// dataset_read_tsv_split's reading where bpe_cut_on_threads says so: the lines of f in blocks,
// each cut on the threads and added in order. *line_no: the lines read. NULL, or the error.
static const char *bpe_read_tsv_on_threads(TsvReading *r, FILE *f, int *line_no) {
    int max_lines = cutting_block_lines_asked > 0 ? cutting_block_lines_asked : CUT_BLOCK_LINES;
    CutBlock block;
    memset(&block, 0, sizeof block);
    block.threads = thread_count();
    size_t n = (size_t)max_lines;
    block.start = checked_calloc(n, sizeof(size_t), "lines");
    block.got = checked_calloc(n, sizeof(int), "lines");
    block.tab = checked_calloc(n, sizeof(int), "lines");
    block.status = checked_calloc(n, sizeof(int), "lines");
    block.owner = checked_calloc(n, sizeof(int), "lines");
    block.first_id = checked_calloc(n, sizeof(size_t), "lines");
    block.src_len = checked_calloc(n, sizeof(int), "lines");
    block.tgt_len = checked_calloc(n, sizeof(int), "lines");
    block.thread_ids = checked_calloc((size_t)block.threads, sizeof(int *), "subword ids");
    block.thread_ids_used = checked_calloc((size_t)block.threads, sizeof(size_t), "subword ids");
    block.thread_ids_capacity = checked_calloc((size_t)block.threads, sizeof(size_t), "ids");
    char *line = NULL;
    size_t line_capacity = 0;
    const char *error = NULL;
    while (!error && cut_block_read(&block, f, *line_no, max_lines, &line, &line_capacity) > 0) {
        long words = cut_block_on_threads(&block, r);
        int plainly = 0;
        error = cut_block_add(&block, r, *line_no, &plainly);
        *line_no += block.count;
        if (!plainly)
            bpe_cutting_steps(words);   // (a block read plainly has counted its words)
    }
    free(line);
    cut_block_free(&block);
    return error;
}


// The merges section of a checkpoint: a u32 count, then per merge the left
// and the right symbol, each a u32 length and its bytes (dev/FORMATS.md).
// NULL (no section) without merges.
static void put_u32(unsigned char *b, uint32_t x) {
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(x >> (8 * i));
}

static uint32_t get_u32(const unsigned char *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static unsigned char *bpe_merges_section(const Bpe *b, size_t *bytes) {
    *bytes = 0;
    if (!b || b->num_merges == 0)
        return NULL;
    size_t size = 4;
    for (int r = 0; r < b->num_merges; r++) size += 8 + strlen(b->left[r]) + strlen(b->right[r]);
    unsigned char *section = checked_calloc(size, 1, "merges section"), *p = section;
    put_u32(p, (uint32_t)b->num_merges);
    p += 4;
    for (int r = 0; r < b->num_merges; r++) {
        const char *sides[2] = { b->left[r], b->right[r] };
        for (int k = 0; k < 2; k++) {
            size_t n = strlen(sides[k]);
            put_u32(p, (uint32_t)n);
            memcpy(p + 4, sides[k], n);
            p += 4 + n;
        }
    }
    *bytes = size;
    return section;
}

// Reads the section back into new merges, *merges: the count, then each merge's two
// symbols, of 1 byte or more without spaces, lengths adding up to the
// section's size; no merge may make a special token's text. On an error *merges holds those
// read so far (the caller frees them with bpe_free_merges).
static const char *bpe_read_merges_section(Bpe **merges, const unsigned char *section,
                                           size_t bytes, const char *path) {
    uint32_t count = bytes >= 4 ? get_u32(section) : 0;
    uint64_t used = 4;
    if (count == 0 || count > bytes / 10)
        return errorf("%s: the merges section says %u merges; its %llu bytes hold from 1 to %llu",
                      path, count, (unsigned long long)bytes, (unsigned long long)(bytes / 10));
    Bpe *bpe = checked_calloc(1, sizeof(Bpe), "merges");
    bpe_init(bpe);
    *merges = bpe;
    for (uint32_t i = 0; i < count; i++) {
        char *sides[2] = { NULL, NULL };
        const char *error = NULL;
        for (int k = 0; k < 2 && !error; k++) {
            uint32_t n = used + 4 <= bytes ? get_u32(section + used) : 0;
            used += 4 + (uint64_t)n;
            if (n == 0 || used > bytes) {
                error = errorf("%s: merge %u has a symbol of length %u; the merges section "
                               "disagrees with its size in the header (%llu bytes)",
                               path, i + 1, n, (unsigned long long)bytes);
                break;
            }
            sides[k] = checked_calloc(n + 1, 1, "checkpoint merges");
            memcpy(sides[k], section + used - n, n);
            int ok = strlen(sides[k]) == n;
            for (uint32_t j = 0; j < n && ok; j++) ok = !isspace((unsigned char)sides[k][j]);
            if (!ok)
                error = errorf("%s: merge %u has a symbol with a space or a zero byte; "
                               "expected neither", path, i + 1);
        }
        if (!error && joins_to_special_token(sides[0], sides[1]))
            error = errorf("%s: merge %u makes '%s%s', a special token's text; expected merges "
                           "that make none (§5.1)", path, i + 1, sides[0], sides[1]);
        if (!error)
            bpe_add_merge(bpe, sides[0], sides[1], 0);
        free(sides[0]);
        free(sides[1]);
        if (error)
            return error;
    }
    if (used != bytes)
        return errorf("%s: the merges take %llu bytes, but its header says %llu", path,
                      (unsigned long long)used, (unsigned long long)bytes);
    return NULL;
}
