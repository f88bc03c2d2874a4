/* lab/subwords.c: §5.1 byte-pair encoding, for make's ./transformer
 *
 * train --bpe N learns N merges from the training file and trains on
 * subwords; the merges travel in the checkpoint, so that decode and eval cut
 * text the same way; `./transformer bpe` prints the merges or cuts text.
 * transformer.c reads whole words; this file plugs into its hooks (lab.c
 * sets them): split_word and join_tokens (a word into subwords and back),
 * free_merges, and the checkpoint's merges section (merges_section,
 * read_merges_section); exact match and BLEU on words (score_words) are in
 * lab/bleu.c.
 * train's --bpe flag and the learning before the data is read are in
 * lab/runs.c's train hooks.
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
//     (transformer.c's text_error); a byte that does not begin a valid
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
//     (tokenize); inside a word, learning passes over such a pair (the next
//     most frequent one is merged), and a checkpoint whose merges make one
//     is refused.
// Learning counts pairs once, then after each merge updates the counts of
// the words that held the merged pair only: O(merges x symbols of the
// distinct words) in all, about 0.1 s for 1000 merges on the numbers task.

#define BPE_END_OF_WORD "</w>"
#define BPE_END_OF_WORD_BYTES 4

// A hash table from a pair of symbol ids to an int (open addressing; key 0
// marks an empty slot).
typedef struct { uint64_t *keys; int *values; size_t mask, count; } PairTable;

static uint64_t pair_key(int left, int right) { return ((uint64_t)(uint32_t)left << 32 | (uint32_t)right) + 1; }

static size_t pair_slot(const PairTable *t, uint64_t key) {
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 20) & t->mask;
    while (t->keys[i] != 0 && t->keys[i] != key) i = (i + 1) & t->mask;
    return i;
}

// The value stored for (left, right), or -1.
static int pair_find(const PairTable *t, int left, int right) {
    if (!t->keys) return -1;
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
                bigger.keys[j] = t->keys[i]; bigger.values[j] = t->values[i]; bigger.count++;
            }
        free(t->keys); free(t->values);
        *t = bigger;
    }
    size_t i = pair_slot(t, pair_key(left, right));
    if (!t->keys[i]) { t->keys[i] = pair_key(left, right); t->count++; }
    t->values[i] = value;
}

static void pair_table_free(PairTable *t) { free(t->keys); free(t->values); memset(t, 0, sizeof *t); }

typedef struct Bpe {
    char **left, **right;  // (num_merges) in the order learned: merge r joins left[r] and right[r]
    long *frequency;       // (num_merges) the pair's count when it was merged (0 when read from a checkpoint)
    int *merged;           // (num_merges) the symbol id of left[r] right[r] joined
    int num_merges, capacity;
    Vocabulary symbols;    // text <-> id of every symbol a merge reads or makes
    PairTable ranks;       // (id of left[r], id of right[r]) -> r
} Bpe;

static void bpe_init(Bpe *b) {
    memset(b, 0, sizeof *b);
    vocab_init(&b->symbols);
}

static void bpe_free(Bpe *b) {
    for (int r = 0; r < b->num_merges; r++) { free(b->left[r]); free(b->right[r]); }
    free(b->left); free(b->right); free(b->frequency); free(b->merged);
    vocab_free(&b->symbols);
    pair_table_free(&b->ranks);
    memset(b, 0, sizeof *b);
}

// Appends the merge (left, right), seen `frequency` times.
static void bpe_add_merge(Bpe *b, const char *left, const char *right, long frequency) {
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
    b->left[r] = checked_calloc(nl + 1, 1, "merges"); memcpy(b->left[r], left, nl);
    b->right[r] = checked_calloc(nr + 1, 1, "merges"); memcpy(b->right[r], right, nr);
    b->frequency[r] = frequency;
    b->merged[r] = vocab_add(&b->symbols, joined, nl + nr);
    int l = vocab_add(&b->symbols, left, nl), rt = vocab_add(&b->symbols, right, nr);
    if (pair_find(&b->ranks, l, rt) < 0) pair_insert(&b->ranks, l, rt, r); // a repeat never applies
    free(joined);
}

// Cuts the n bytes at word into its first symbols: start[i] is where symbol
// i begins (start[count] = n); the last symbol, start[count-1] = n, is the
// end-of-word marker. start has room for n + 2. Returns count.
static int bpe_characters(int *start, const char *word, int n) {
    int count = 0;
    for (int i = 0; i < n; ) {
        int length = utf8_sequence_length((const unsigned char *)word + i);
        if (length == 0 || length > n - i) length = 1; // not UTF-8: the byte alone
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
    if (i == count - 1) { memcpy(out + length, BPE_END_OF_WORD, BPE_END_OF_WORD_BYTES); length += BPE_END_OF_WORD_BYTES; }
    out[length] = '\0';
    return length;
}

// apply: cuts the n bytes at word into subwords with b's merges. On return
// start[0..count] (room for n + 2) says where each subword begins, as in
// bpe_characters; the last subword also carries </w>. scratch: room for
// n + 2 ints (each symbol's id); text: n + 5 chars. Returns count.
static int bpe_encode_word(const Bpe *b, int *start, const char *word, int n, int *scratch, char *text) {
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
            if (r >= 0 && (best < 0 || r < best)) best = r;
        }
        if (best < 0) return count;
        int l = vocab_find(&b->symbols, b->left[best], strlen(b->left[best]));
        int rt = vocab_find(&b->symbols, b->right[best], strlen(b->right[best]));
        int kept = 0;
        for (int i = 0; i < count; i++, kept++) { // every occurrence, left to right
            start[kept] = start[i];
            id[kept] = id[i];
            if (i + 1 < count && id[i] == l && id[i + 1] == rt) { id[kept] = b->merged[best]; i++; }
        }
        start[kept] = n;
        count = kept;
    }
}

// One distinct word of the training text while merges are learned.
typedef struct {
    int *symbols;   // (length) ids in Bpe.symbols
    int length;
    long count;     // occurrences in the text
} BpeWord;

// The pair counts of learning: pair_index maps (left, right) to an index into
// left, right and count.
typedef struct {
    PairTable pair_index;
    int *left, *right;
    long *count;
    int size, capacity;
} PairCounts;

static void pair_counts_add(PairCounts *pc, int left, int right, long delta) {
    int i = pair_find(&pc->pair_index, left, right);
    if (i < 0) {
        if (pc->size == pc->capacity) {
            pc->capacity = pc->capacity ? 2 * pc->capacity : 1024;
            pc->left = checked_realloc(pc->left, pc->capacity, sizeof(int), "pair counts");
            pc->right = checked_realloc(pc->right, pc->capacity, sizeof(int), "pair counts");
            pc->count = checked_realloc(pc->count, pc->capacity, sizeof(long), "pair counts");
        }
        i = pc->size++;
        pc->left[i] = left; pc->right[i] = right; pc->count[i] = 0;
        pair_insert(&pc->pair_index, left, right, i);
    }
    pc->count[i] += delta;
}

static void pair_counts_of_word(PairCounts *pc, const BpeWord *w, long sign) {
    for (int i = 0; i + 1 < w->length; i++) pair_counts_add(pc, w->symbols[i], w->symbols[i + 1], sign * w->count);
}

// Is left and right joined the text of a special token (<pad> <s> </s> <unk>)?
static int joins_to_special_token(const char *left, const char *right) {
    size_t n = strlen(left);
    for (int i = 0; i < NUM_SPECIAL_TOKENS; i++)
        if (strncmp(special_tokens[i], left, n) == 0 && strcmp(special_tokens[i] + n, right) == 0) return 1;
    return 0;
}

// The most frequent pair (ties: left, then right symbol first in byte order)
// that does not make a special token's text, or -1 when no pair occurs twice.
static int best_pair(const PairCounts *pc, const Vocabulary *symbols) {
    int best = -1;
    for (int i = 0; i < pc->size; i++) {
        if (pc->count[i] < 2) continue;
        if (best >= 0 && pc->count[i] < pc->count[best]) continue;
        if (best >= 0 && pc->count[i] == pc->count[best]) {
            int order = strcmp(symbols->words[pc->left[i]], symbols->words[pc->left[best]]);
            if (order == 0) order = strcmp(symbols->words[pc->right[i]], symbols->words[pc->right[best]]);
            if (order >= 0) continue;
        }
        if (joins_to_special_token(symbols->words[pc->left[i]], symbols->words[pc->right[i]])) continue;
        best = i;
    }
    return best;
}

// learn: up to num_merges merges from n distinct words and their counts,
// appended to b (empty before). Returns how many were learned: fewer when no
// pair occurs twice any more.
static int bpe_learn(Bpe *b, const char *const *words, const long *counts, int n, int num_merges) {
    BpeWord *w = checked_calloc(n > 0 ? n : 1, sizeof(BpeWord), "bpe words");
    PairCounts pc;
    memset(&pc, 0, sizeof pc);
    for (int k = 0; k < n; k++) {
        int length = (int)strlen(words[k]);
        int *start = checked_calloc((size_t)length + 2, sizeof(int), "bpe words");
        char *text = checked_calloc((size_t)length + 5, 1, "bpe words");
        w[k].length = bpe_characters(start, words[k], length);
        w[k].symbols = checked_calloc(w[k].length, sizeof(int), "bpe words");
        w[k].count = counts[k];
        for (int i = 0; i < w[k].length; i++) {
            int text_length = bpe_symbol_text(text, words[k], start, w[k].length, i);
            w[k].symbols[i] = vocab_add(&b->symbols, text, (size_t)text_length);
        }
        pair_counts_of_word(&pc, &w[k], 1);
        free(start); free(text);
    }
    int learned = 0;
    for (; learned < num_merges; learned++) {
        int best = best_pair(&pc, &b->symbols);
        if (best < 0) break;
        int l = pc.left[best], rt = pc.right[best];
        bpe_add_merge(b, b->symbols.words[l], b->symbols.words[rt], pc.count[best]);
        int joined = b->merged[b->num_merges - 1];
        for (int k = 0; k < n; k++) {
            int holds = 0;
            for (int i = 0; i + 1 < w[k].length && !holds; i++) holds = w[k].symbols[i] == l && w[k].symbols[i + 1] == rt;
            if (!holds) continue;
            pair_counts_of_word(&pc, &w[k], -1);
            int kept = 0;
            for (int i = 0; i < w[k].length; i++, kept++) { // every occurrence, left to right
                w[k].symbols[kept] = w[k].symbols[i];
                if (i + 1 < w[k].length && w[k].symbols[i] == l && w[k].symbols[i + 1] == rt) {
                    w[k].symbols[kept] = joined;
                    i++;
                }
            }
            w[k].length = kept;
            pair_counts_of_word(&pc, &w[k], 1);
        }
    }
    for (int k = 0; k < n; k++) free(w[k].symbols);
    free(w);
    pair_table_free(&pc.pair_index);
    free(pc.left); free(pc.right); free(pc.count);
    return learned;
}

// Joins tokens back into words: each token's text in turn; after a token
// that ends in </w>, the marker is dropped and a space starts the next word.
// Tokens without a marker at all (the special tokens, whole words of a
// vocabulary without merges) are words of their own. Returns a new string.
static char *bpe_join_tokens(const Vocabulary *vocab, const int *ids, int n) {
    size_t bytes = 1;
    for (int i = 0; i < n; i++) bytes += strlen(vocab->words[ids[i]]) + 1;
    char *text = checked_calloc(bytes, 1, "text"), *out = text;
    int word_open = 0; // the last token did not end its word
    for (int i = 0; i < n; i++) {
        const char *token = vocab->words[ids[i]];
        size_t length = strlen(token);
        int ends = length >= BPE_END_OF_WORD_BYTES && strcmp(token + length - BPE_END_OF_WORD_BYTES, BPE_END_OF_WORD) == 0;
        int subword = vocab->bpe && (ends || ids[i] >= NUM_SPECIAL_TOKENS);
        if (out > text && !word_open) *out++ = ' ';
        if (subword && ends) length -= BPE_END_OF_WORD_BYTES;
        memcpy(out, token, length);
        out += length;
        word_open = subword && !ends;
    }
    *out = '\0';
    return text;
}

// §5.1: learns up to num_merges merges from the words of both sides of the
// TSV file at path into vocab->bpe (vocab holds no tokens of the data yet). The words
// are read as dataset_read_tsv reads them, with its checks; held_out_every > 0
// leaves out the pairs dataset_split would hold out, so that held-out words
// teach no merges. *learned: how many merges there are (fewer when no pair
// occurs twice any more).
static const char *bpe_learn_from_tsv(Vocabulary *vocab, const char *path, int held_out_every, int num_merges,
                                      int *learned) {
    Vocabulary words;
    Dataset dataset, held_out;
    vocab_init(&words);
    memset(&dataset, 0, sizeof dataset);
    memset(&held_out, 0, sizeof held_out);
    const char *error = dataset_read_tsv(&dataset, &words, path, 1);
    if (!error && held_out_every > 0 && dataset.count >= held_out_every) dataset_split(&dataset, &held_out, held_out_every);
    long *counts = checked_calloc((size_t)words.size, sizeof(long), "word counts");
    for (size_t i = 0; !error && i < dataset.num_tokens; i++) counts[dataset.tokens[i]]++;
    for (int id = NUM_SPECIAL_TOKENS; !error && id < words.size; id++)
        if (strstr(words.words[id], BPE_END_OF_WORD))
            error = errorf("%s: the word '%.80s' holds the end-of-word marker %s; expected words without it "
                           "(with --bpe, a subword ending in %s ends a word)", path, words.words[id],
                           BPE_END_OF_WORD, BPE_END_OF_WORD);
    if (!error) {
        Bpe *b = checked_calloc(1, sizeof(Bpe), "merges");
        bpe_init(b);
        int n = words.size - NUM_SPECIAL_TOKENS;
        *learned = bpe_learn(b, (const char *const *)words.words + NUM_SPECIAL_TOKENS, counts + NUM_SPECIAL_TOKENS,
                             n, num_merges);
        if (vocab->bpe) { bpe_free(vocab->bpe); free(vocab->bpe); }
        vocab->bpe = b;
    }
    free(counts);
    dataset_free(&dataset); dataset_free(&held_out);
    vocab_free(&words);
    return error;
}

// The model's vocabulary with merges: every symbol the merges know, the
// characters of the training words and each merge's result, so that any
// word made of these characters is written without <unk>, even when it
// needs a subword that no training word kept (a later merge took it).
static void vocab_add_subwords(Vocabulary *vocab) {
    const Vocabulary *symbols = &vocab->bpe->symbols;
    for (int id = NUM_SPECIAL_TOKENS; id < symbols->size; id++)
        vocab_add(vocab, symbols->words[id], strlen(symbols->words[id]));
}

// ---- transformer.c's hooks --------------------------------------------------

// split_word: the subwords of one word (vocab->bpe's merges), pushed as ids at
// ids[n..]. Returns the new n.
static int bpe_split_word(Vocabulary *vocab, int grow, const char *word, int length, int **ids, size_t *capacity,
                          int n, TextSource *from) {
    int *start = checked_calloc((size_t)length + 2, sizeof(int), "subwords");
    int *scratch = checked_calloc((size_t)length + 2, sizeof(int), "subwords");
    char *text = checked_calloc((size_t)length + 5, 1, "subwords");
    int count = bpe_encode_word(vocab->bpe, start, word, length, scratch, text);
    for (int i = 0; i < count; i++) {
        int text_length = bpe_symbol_text(text, word, start, count, i);
        push_id(ids, capacity, n++, token_id(vocab, grow, text, (size_t)text_length, from));
    }
    free(start); free(scratch); free(text);
    return n;
}


static void bpe_free_merges(struct Bpe *bpe) {
    bpe_free(bpe);
    free(bpe);
}

// The merges section of a checkpoint: a u32 count, then per merge the left
// and the right symbol, each a u32 length and its bytes (dev/FORMATS.md).
// NULL (no section) without merges.
static void put_u32(unsigned char *b, uint32_t x) { for (int i = 0; i < 4; i++) b[i] = (unsigned char)(x >> (8 * i)); }

static unsigned char *bpe_merges_section(const Vocabulary *vocab, size_t *bytes) {
    const Bpe *b = vocab->bpe;
    *bytes = 0;
    if (!b || b->num_merges == 0) return NULL;
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

// Reads the section back into vocab->bpe: the count, then each merge's two
// symbols, of 1 byte or more without spaces, lengths adding up to the
// section's size; no merge may make a special token's text.
static const char *bpe_read_merges_section(Vocabulary *vocab, const unsigned char *section, size_t bytes,
                                           const char *path) {
    uint32_t count = (uint32_t)get_number(section, 4);
    uint64_t used = 4;
    if (count == 0 || count > bytes / 10)
        return errorf("%s: the merges section says %u merges; its %llu bytes hold from 1 to %llu", path, count,
                      (unsigned long long)bytes, (unsigned long long)(bytes / 10));
    Bpe *bpe = checked_calloc(1, sizeof(Bpe), "merges");
    bpe_init(bpe);
    vocab->bpe = bpe;   // vocab_free frees it on an error
    for (uint32_t i = 0; i < count; i++) {
        char *sides[2] = { NULL, NULL };
        const char *error = NULL;
        for (int k = 0; k < 2 && !error; k++) {
            uint32_t n = used + 4 <= bytes ? (uint32_t)get_number(section + used, 4) : 0;
            used += 4 + (uint64_t)n;
            if (n == 0 || used > bytes) {
                error = errorf("%s: merge %u has a symbol of length %u; the merges section disagrees with its size "
                               "in the header (%llu bytes)", path, i + 1, n, (unsigned long long)bytes);
                break;
            }
            sides[k] = checked_calloc(n + 1, 1, "checkpoint merges");
            memcpy(sides[k], section + used - n, n);
            int ok = strlen(sides[k]) == n;
            for (uint32_t j = 0; j < n && ok; j++) ok = !isspace((unsigned char)sides[k][j]);
            if (!ok) error = errorf("%s: merge %u has a symbol with a space or a zero byte; expected neither", path, i + 1);
        }
        if (!error && joins_to_special_token(sides[0], sides[1]))
            error = errorf("%s: merge %u makes '%s%s', a special token's text; expected merges that make none (§5.1)",
                           path, i + 1, sides[0], sides[1]);
        if (!error) bpe_add_merge(bpe, sides[0], sides[1], 0);
        free(sides[0]); free(sides[1]);
        if (error) return error;
    }
    if (used != bytes)
        return errorf("%s: the merges take %llu bytes, but its header says %llu", path, (unsigned long long)used,
                      (unsigned long long)bytes);
    return NULL;
}

// Plugs the functions above into transformer.c (lab.c calls it).
static void subwords_plug_in(void) {
    lab.split_word = bpe_split_word;
    lab.join_tokens = bpe_join_tokens;
    lab.free_merges = bpe_free_merges;
    lab.merges_section = bpe_merges_section;
    lab.read_merges_section = bpe_read_merges_section;
}
