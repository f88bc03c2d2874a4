/* lab/bleu.c: `./transformer bleu`, BLEU of files as the field computes it
 *
 * eval --bleu scores the model's own tokens: BLEU-4 (§6.1)
 * with no tokenizer of its own and no smoothing. A user who checks a score
 * runs sacreBLEU (Post, WMT 2018), `sacrebleu REF < HYP`, whose defaults are
 * the 13a tokenizer of mteval-v13a.pl and exponential smoothing. This file
 * gives `bleu` both: --tokenize none|13a and --smooth none|exp|floor|add-k,
 * with sacreBLEU's defaults (13a, exp), and prints the score the way
 * `sacrebleu -f text` prints it, its signature first:
 *
 *   BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp = 34.33 60.00/40.00/28.75/16.67
 *       (BP = 1.000 ...)
 *
 * (the precisions to two decimals, where sacreBLEU rounds them to one; no
 * `version:` field: this is not sacreBLEU, it computes what sacreBLEU 2.6.0
 * computes). lab/test_lab.c holds the proof: 60 generated corpora, each
 * scored with the 8 combinations, against sacreBLEU's own scores and
 * signatures, written once by dev/sacrebleu_cases.py into
 * lab/sacrebleu_cases.txt.
 *
 * Which compares with the paper's 27.3 and 28.4: those were computed on
 * tokenized text (the WMT sets after the Moses tokenizer, as
 * tensor2tensor's and multi-bleu.perl's scripts score), with no smoothing:
 * `--tokenize none --smooth none` on tokenized files, which is what
 * eval --bleu computes on the model's tokens. sacreBLEU's default on
 * detokenized text is the field's number since 2018, and is usually lower.
 *
 * The corpus BLEU of the model's own tokens is here too (BleuStats, bleu_*),
 * and `eval`, which prints it (--bleu).
 *
 * BUILD  included by lab/lab.c after lab/decode.c
 */

// ---- §6.1 BLEU of the model's tokens ---------------------------------------------
// The paper reports BLEU (Papineni et al., ACL 2002) on newstest2014: 27.3 (base) and 28.4 (big)
// for English-German. Corpus-level BLEU-4, one reference per sentence, no smoothing:
//   p_n  = (clipped n-gram matches) / (the output's n-grams), both summed over
//          the sentences, n = 1..4; an n-gram counts at most as often as the
//          reference has it ("the the the" against "the cat" matches one "the");
//   BP   = 1 if c > r, else exp(1 - r/c)   (c, r: output and reference lengths
//          summed over the corpus);   BLEU = 100 BP exp((1/4) sum_n log p_n).
// Add sentence pairs one at a time, then score:
//     BleuStats stats; bleu_reset(&stats);
//     for each pair: bleu_add_sentence(&stats, hyp, hyp_len, ref, ref_len);
//     double bleu = bleu_score(&stats, NULL, NULL);   // 0..100
// Pass the words only: no <s>, </s> or padding.

#define BLEU_MAX_ORDER 4
typedef struct {
    long long matches[BLEU_MAX_ORDER];  // clipped n-gram matches, n = 1..4, summed over sentences
    long long totals[BLEU_MAX_ORDER];   // n-grams in the candidates, summed over sentences
    long long candidate_length;         // c: candidate tokens in the corpus
    long long reference_length;         // r: reference tokens in the corpus
    long long sentences;
} BleuStats;

// One distinct n-gram of a sentence pair: where it first occurs, its counts on each side.
typedef struct {
    const int *gram;
    int in_candidate, in_reference;
} NgramCount;

// Clipped matches of order n: over the candidate's distinct n-grams, the sum of min(count in
// candidate, count in reference), counted in a hash table (mask + 1 slots): linear time.
static long long clipped_ngram_matches(NgramCount *table, size_t mask, const int *candidate,
                                       int candidate_len, const int *reference,
                                       int reference_len, int n) {
    memset(table, 0, (mask + 1) * sizeof *table);
    for (int side = 0; side < 2; side++) {
        const int *tokens = side == 0 ? candidate : reference;
        int length = side == 0 ? candidate_len : reference_len;
        for (int i = 0; i + n <= length; i++) {
            uint64_t hash = 0;
            for (int k = 0; k < n; k++) hash = hash64(hash ^ (uint32_t)tokens[i + k]);
            size_t slot = (size_t)hash & mask;
            while (table[slot].gram && memcmp(table[slot].gram, tokens + i, n * sizeof(int)) != 0) {
                slot = (slot + 1) & mask;
            }
            if (!table[slot].gram)
                table[slot].gram = tokens + i;
            if (side == 0)
                table[slot].in_candidate++;
            else
                table[slot].in_reference++;
        }
    }
    long long matches = 0;
    for (size_t k = 0; k <= mask; k++) {
        int in_both = table[k].in_candidate;
        if (table[k].in_reference < in_both)
            in_both = table[k].in_reference;
        matches += in_both;
    }
    return matches;
}

static void bleu_reset(BleuStats *stats) { memset(stats, 0, sizeof *stats); }

// Adds one candidate (the model's output) and its reference, as token ids.
static void bleu_add_sentence(BleuStats *stats, const int *candidate, int candidate_len,
                              const int *reference, int reference_len) {
    if (candidate_len < 0)
        candidate_len = 0;
    if (reference_len < 0)
        reference_len = 0;
    size_t slots = 4;
    while (slots < 2 * ((size_t)candidate_len + (size_t)reference_len))
        slots *= 2;
    NgramCount *table = checked_calloc(slots, sizeof *table, "BLEU n-gram counts");
    for (int n = 1; n <= BLEU_MAX_ORDER; n++) {
        stats->matches[n - 1] += clipped_ngram_matches(table, slots - 1, candidate, candidate_len,
                                                       reference, reference_len, n);
        stats->totals[n - 1] += candidate_len >= n ? candidate_len - n + 1 : 0;
    }
    free(table);
    stats->candidate_length += candidate_len;
    stats->reference_length += reference_len;
    stats->sentences++;
}

// Corpus BLEU of everything added so far, 0..100. precisions (may be NULL) gets p_1..p_4,
// brevity_penalty (may be NULL) BP; no output at all (c = 0) gives BP = 0 and BLEU = 0.
static double bleu_score(const BleuStats *stats, double precisions[BLEU_MAX_ORDER],
                         double *brevity_penalty) {
    double log_sum = 0;
    int any_zero = 0;
    for (int n = 0; n < BLEU_MAX_ORDER; n++) {
        double p = 0.0;
        if (stats->totals[n] > 0)
            p = (double)stats->matches[n] / (double)stats->totals[n];
        if (precisions)
            precisions[n] = p;
        if (p == 0)
            any_zero = 1;
        else
            log_sum += log(p);
    }
    double candidate = (double)stats->candidate_length;
    double reference = (double)stats->reference_length;
    double bp = 1.0;
    if (candidate <= reference)
        bp = candidate > 0 ? exp(1.0 - reference / candidate) : 0.0;
    if (brevity_penalty)
        *brevity_penalty = bp;
    return any_zero ? 0.0 : 100.0 * bp * exp(log_sum / BLEU_MAX_ORDER);
}

// With sacreBLEU's signature (`bleu`, below, has its tokenizer and smoothing) and precisions
// divided as it divides, 100 matches / n-grams (23/80: 28.75, where 100 * (23/80) is 28.7499...).
// unit: " (words)", or "".
static void print_bleu(const BleuStats *stats, const char *unit) {
    double p[BLEU_MAX_ORDER];
    double bp;
    double score = bleu_score(stats, NULL, &bp);
    for (int n = 0; n < BLEU_MAX_ORDER; n++) {
        p[n] = 0.0;
        if (stats->totals[n] > 0)
            p[n] = 100.0 * (double)stats->matches[n] / (double)stats->totals[n];
    }
    printf("BLEU            %.2f%s (nrefs:1|case:mixed|eff:no|tok:none|smooth:none; precisions "
           "%.2f/%.2f/%.2f/%.2f, BP %.3f, output/reference length %lld/%lld)\n", score, unit, p[0],
           p[1], p[2], p[3], bp, stats->candidate_length, stats->reference_length);
}

// The corpus BLEU of an evaluation's outputs against the dataset's references, on the tokens.
static void evaluation_bleu(BleuStats *stats, const Evaluation *e, const Dataset *dataset) {
    bleu_reset(stats);
    for (int i = 0; i < e->sentences; i++) {
        const SentencePair *p = &dataset->pairs[i];
        bleu_add_sentence(stats, e->output + (size_t)i * e->stride, e->output_len[i],
                          dataset->tokens + p->tgt, p->tgt_len);
    }
}

// ---- BLEU of words ------------------------------------------------------------------
// BLEU of two strings of tokens separated by white space (the lab's one
// rule, text_next_token: sacreBLEU's tokenize='none'): each distinct word gets an id
// from a vocabulary of the pair's own, and the ids are scored as the model's
// tokens are (bleu_add_sentence).
static void bleu_add_sentence_text(BleuStats *stats, const char *candidate, const char *reference) {
    Vocabulary words;
    vocab_init(&words);
    size_t capacity = 1, length;
    int *ids = checked_calloc(capacity, sizeof *ids, "BLEU words"), n = 0, candidate_len = 0;
    for (int side = 0; side < 2; side++) {
        for (const char *p = side == 0 ? candidate : reference;
             (p = text_next_token(p, &length)) != NULL; p += length)
            push_id(&ids, &capacity, n++, vocab_add(&words, p, length));
        if (side == 0)
            candidate_len = n;
    }
    bleu_add_sentence(stats, ids, candidate_len, ids + candidate_len, n - candidate_len);
    free(ids);
    vocab_free(&words);
}

// With subwords the tokens are not the words: joined back into words, an
// output may spell the reference with other subwords and still be it. Exact
// match on words (e->exact, replacing the count on subwords), and, when
// bleu_words is not NULL, BLEU on words.
static void evaluation_words(Evaluation *e, BleuStats *bleu_words, const Dataset *dataset,
                             const Vocabulary *vocab, const Bpe *merges) {
    e->exact = 0;
    if (bleu_words)
        bleu_reset(bleu_words);
    for (int i = 0; i < e->sentences; i++) {
        const SentencePair *p = &dataset->pairs[i];
        char *output = tokens_to_text(vocab, merges, e->output + (size_t)i * e->stride,
                                      e->output_len[i]);
        char *reference = tokens_to_text(vocab, merges, dataset->tokens + p->tgt, p->tgt_len);
        e->exact += strcmp(output, reference) == 0;
        if (bleu_words)
            bleu_add_sentence_text(bleu_words, output, reference);
        free(output);
        free(reference);
    }
}

// ---- sacreBLEU's 13a tokenizer ----------------------------------------------------
// sacreBLEU's tokenizer_13a.py and tokenizer_re.py, rule for rule:
//   remove "<skipped>"; replace &quot; &amp; &lt; &gt; (in that order) by " & < >;
//   pad the line with a space at each end; then four regular expressions, each
//   applied left to right to the whole line (Python's re.sub):
//   1. ([{-~[-` -&(-+:-@/])   -> " \1 "    ASCII punctuation but ' - . , alone
//   2. ([^0-9])([.,])         -> "\1 \2 "  a period or comma after a non-digit
//   3. ([.,])([^0-9])         -> " \1 \2"  ... or before one
//   4. ([0-9])(-)             -> "\1 \2 "  a dash after a digit
// and the words are what white space separates (text_next_token, str.split()).
// The classes name ASCII bytes only, so the rules can run on UTF-8 bytes: a
// byte of a multi-byte character is never a digit, a period or a comma, and
// matches [^0-9] exactly where its character would. (The first two rules of
// 13a, "-\n" and "\n", concern text with line breaks inside; a line has none.)

static int is_digit_byte(int c) { return c >= '0' && c <= '9'; }
static int is_not_digit_byte(int c) { return !is_digit_byte(c); }
static int is_period_or_comma(int c) { return c == '.' || c == ','; }
static int is_dash(int c) { return c == '-'; }
static int is_13a_punctuation(int c) {
    return (c >= '{' && c <= '~') || (c >= '[' && c <= '`') || (c >= ' ' && c <= '&') ||
           (c >= '(' && c <= '+') || (c >= ':' && c <= '@') || c == '/';
}

// Every `from` in text replaced by `to`, left to right (Python's str.replace);
// to is not longer than from, so it is done in place.
static void replace_all(char *text, const char *from, const char *to) {
    size_t from_length = strlen(from), to_length = strlen(to);
    char *read = text, *write = text;
    while (*read) {
        if (strncmp(read, from, from_length) == 0) {
            memcpy(write, to, to_length);
            write += to_length;
            read += from_length;
        } else
            *write++ = *read++;
    }
    *write = 0;
}

// Rules 2 to 4: wherever a byte of class `first` is followed by one of
// class `second` (scanning on after each match, as re.sub does), the two
// with a space between them, and one more before (space_before) or after.
// Frees text; returns the new line.
static char *separate_pairs(char *text, int (*first)(int), int (*second)(int), int space_before) {
    size_t length = strlen(text);
    char *out = checked_calloc(2 * length + 1, 1, "13a tokens"), *o = out;
    for (size_t i = 0; i < length;) {
        unsigned char a = (unsigned char)text[i], b = (unsigned char)text[i + 1];
        if (i + 1 < length && first(a) && second(b)) {
            if (space_before)
                *o++ = ' ';
            *o++ = (char)a;
            *o++ = ' ';
            *o++ = (char)b;
            if (!space_before)
                *o++ = ' ';
            i += 2;
        } else
            *o++ = text[i++];
    }
    *o = 0;
    free(text);
    return out;
}

// The line as 13a tokenizes it (its words separated by white space), a new string.
static char *tokenize_13a(const char *line) {
    size_t length = strlen(line);
    char *text = checked_calloc(length + 1, 1, "13a tokens");
    memcpy(text, line, length + 1);
    replace_all(text, "<skipped>", "");
    replace_all(text, "&quot;", "\"");
    replace_all(text, "&amp;", "&");
    replace_all(text, "&lt;", "<");
    replace_all(text, "&gt;", ">");
    length = strlen(text);
    // " line ", then rule 1 on every byte of it
    char *padded = checked_calloc(length + 3, 1, "13a tokens");
    snprintf(padded, length + 3, " %s ", text);
    free(text);
    char *spaced = checked_calloc(3 * (length + 2) + 1, 1, "13a tokens"), *o = spaced;
    for (const char *c = padded; *c; c++) {
        if (is_13a_punctuation((unsigned char)*c)) {
            *o++ = ' ';
            *o++ = *c;
            *o++ = ' ';
        } else
            *o++ = *c;
    }
    *o = 0;
    free(padded);
    spaced = separate_pairs(spaced, is_not_digit_byte, is_period_or_comma, 0);
    spaced = separate_pairs(spaced, is_period_or_comma, is_not_digit_byte, 1);
    return separate_pairs(spaced, is_digit_byte, is_dash, 0);
}

// ---- sacreBLEU's smoothing -----------------------------------------------------------
// BLEU.compute_bleu of sacreBLEU, step for step and in its order of
// operations, so that the scores agree to the last bits, not only to two
// decimals. Boxing Chen and Colin Cherry (WMT 2014) name the methods:
//   none   a p_n of 0 gives BLEU 0 (bleu_score)
//   exp    mteval-v13a's: the k-th order with no match counts 1/2^k of a match
//   floor  an order with no match counts `value` matches (default 0.1)
//   add-k  orders 2 to 4 get `value` matches and n-grams more (default 1)
// A corpus with no match at all scores 0 whatever the method.
typedef enum { SMOOTH_NONE, SMOOTH_EXP, SMOOTH_FLOOR, SMOOTH_ADD_K } Smoothing;
static const char *smoothing_names[] = { "none", "exp", "floor", "add-k" };
static const double smoothing_defaults[] = { -1, -1, 0.1, 1 };   // -1: the method takes no value

// precisions[] gets p_1..p_4 in percent, *brevity_penalty BP; returns BLEU, 0..100.
static double bleu_smoothed(const BleuStats *stats, Smoothing method, double value,
                            double precisions[BLEU_MAX_ORDER], double *brevity_penalty) {
    long long sys_length = stats->candidate_length, ref_length = stats->reference_length;
    double bp = 1.0;
    if (sys_length < ref_length)
        bp = sys_length > 0 ? exp(1 - (double)ref_length / (double)sys_length) : 0.0;
    *brevity_penalty = bp;
    int any_match = 0;
    for (int n = 0; n < BLEU_MAX_ORDER; n++) {
        precisions[n] = 0;
        any_match |= stats->matches[n] > 0;
    }
    if (!any_match)
        return 0.0;
    double mteval = 1, log_sum = 0;
    for (int n = 0; n < BLEU_MAX_ORDER; n++) {
        double correct = (double)stats->matches[n], total = (double)stats->totals[n];
        if (method == SMOOTH_ADD_K && n > 0) {
            correct += value;
            total += value;
        }
        if (total == 0)
            break;   // no n-grams of this order or higher: their precisions stay 0
        if (correct > 0)
            precisions[n] = 100.0 * correct / total;
        else if (method == SMOOTH_EXP) {
            mteval *= 2;
            precisions[n] = 100.0 / (mteval * total);
        } else if (method == SMOOTH_FLOOR)
            precisions[n] = 100.0 * value / total;
    }
    for (int n = 0; n < BLEU_MAX_ORDER; n++)
        log_sum += precisions[n] == 0 ? -9999999999.0 : log(precisions[n]);
    return bp * exp(log_sum / BLEU_MAX_ORDER);   // sacreBLEU's my_log: log 0 is -9999999999
}

// sacreBLEU's signature of a score: "nrefs:1|case:mixed|eff:no|tok:13a|smooth:floor[0.10]".
static void bleu_signature(char *out, size_t size, int tokenize_13a_rules, Smoothing method,
                           double value) {
    char smooth[64];
    if (smoothing_defaults[method] < 0)
        snprintf(smooth, sizeof smooth, "%s", smoothing_names[method]);
    else
        snprintf(smooth, sizeof smooth, "%s[%.2f]", smoothing_names[method], value);
    snprintf(out, size, "nrefs:1|case:mixed|eff:no|tok:%s|smooth:%s",
             tokenize_13a_rules ? "13a" : "none", smooth);
}

// ---- bleu -----------------------------------------------------------------------------
// Corpus BLEU of a hypothesis file against a reference file, line by line.
// The files are read as sacreBLEU reads them, UTF-8 text split into lines at
// \n only, and a line that is not UTF-8 (Latin-1 text, a binary file) is
// refused, as every text input is (text_error) and as sacreBLEU refuses it,
// naming the file and line: scoring its bytes would split words where
// sacreBLEU does not, or not at all. (Two differences, both about what is
// not text: a \r before the \n and a byte-order mark at the start of a file
// are dropped, where sacreBLEU keeps the \r until it strips the line's end,
// and keeps the mark as part of the first word.)
static const char *bleu_files(BleuStats *stats, const char *hyp_path, const char *ref_path,
                              int tokenize_13a_rules, int *lines) {
    const char *error = NULL;
    FILE *hyp = open_text_file(hyp_path, &error),
         *ref = hyp ? open_text_file(ref_path, &error) : NULL;
    char *hyp_line = NULL, *ref_line = NULL;
    size_t hyp_capacity = 0, ref_capacity = 0;
    bleu_reset(stats);
    *lines = 0;
    while (!error) {
        int got_hypothesis = read_text_line(hyp, &hyp_line, &hyp_capacity, *lines + 1);
        int got_reference = read_text_line(ref, &ref_line, &ref_capacity, *lines + 1);
        // not the end: a read that failed
        if ((!got_hypothesis && ferror(hyp)) || (!got_reference && ferror(ref))) {
            error = errorf("%s: read error after %d lines: %s",
                           !got_hypothesis && ferror(hyp) ? hyp_path : ref_path, *lines,
                           strerror(errno));
            break;
        }
        if (!got_hypothesis && !got_reference)
            break;
        ++*lines;
        if (!got_hypothesis || !got_reference) {
            error = errorf("%s ends after %d line%s but %s goes on; expected one hypothesis line "
                           "for each reference line", got_hypothesis ? ref_path : hyp_path,
                           *lines - 1, *lines == 2 ? "" : "s",
                           got_hypothesis ? hyp_path : ref_path);
            break;
        }
        char where[2][300];
        snprintf(where[0], sizeof where[0], "%s:%d", hyp_path, *lines);
        snprintf(where[1], sizeof where[1], "%s:%d", ref_path, *lines);
        if ((error = text_error(hyp_line, got_hypothesis, where[0])) ||
            (error = text_error(ref_line, got_reference, where[1])))
            break;
        if (tokenize_13a_rules) {
            char *hyp_tokens = tokenize_13a(hyp_line), *ref_tokens = tokenize_13a(ref_line);
            bleu_add_sentence_text(stats, hyp_tokens, ref_tokens);
            free(hyp_tokens);
            free(ref_tokens);
        } else
            bleu_add_sentence_text(stats, hyp_line, ref_line);
    }
    if (!error && *lines == 0)
        error = errorf("%s: no lines; expected one sentence a line", hyp_path);
    free(hyp_line);
    free(ref_line);
    if (hyp)
        fclose(hyp);
    if (ref)
        fclose(ref);
    return error;
}

// The line `sacrebleu -f text` prints, with the precisions to two decimals.
static void print_sacrebleu_line(const BleuStats *stats, int tokenize_13a_rules, Smoothing method,
                                 double value) {
    double p[BLEU_MAX_ORDER], bp, score = bleu_smoothed(stats, method, value, p, &bp);
    char signature[160];
    bleu_signature(signature, sizeof signature, tokenize_13a_rules, method, value);
    long long sys_length = stats->candidate_length, ref_length = stats->reference_length;
    printf("BLEU|%s = %.2f %.2f/%.2f/%.2f/%.2f (BP = %.3f ratio = %.3f hyp_len = %lld "
           "ref_len = %lld)\n", signature, score, p[0], p[1], p[2], p[3], bp,
           ref_length ? (double)sys_length / (double)ref_length : 0.0, sys_length, ref_length);
}

static int command_bleu(int argc, char **argv) {
    const char *usage =
        "usage: ./transformer bleu HYPOTHESES.txt REFERENCES.txt [--tokenize 13a|none] "
        "[--smooth exp|none|floor|add-k]\n"
        "Corpus BLEU-4 of any system's output, as sacreBLEU computes it (lab/bleu.c): "
        "one sentence a line in each\n"
        "file (UTF-8 text), line i of the first scored against line i of the second, "
        "one reference each, no\n"
        "lower-casing; printed as `sacrebleu -f text` prints it, with its signature. "
        "The defaults are\n"
        "sacreBLEU's: `sacrebleu REF < HYP` gives the same score. "
        "--tokenize none --smooth none scores words\n"
        "split at white space as they are: "
        "what eval --bleu prints, and what the paper's BLEU on tokenized\n"
        "text compares with.";
    const char *tokenize = "13a", *smooth = "exp";
    const char *value_text = NULL;
    Option options[] = {
        TEXT_OPTION("--tokenize", &tokenize, "13a (mteval-v13a's rules, sacreBLEU's default) or "
                    "none (split at white space)"),
        TEXT_OPTION("--smooth", &smooth, "exp (sacreBLEU's default), none, floor or add-k"),
        TEXT_OPTION("--smooth-value", &value_text,
                    "X, floor's (default 0.1) or add-k's (default 1)"),
    };
    char **paths = checked_calloc(argc, sizeof(char *), "arguments");
    int n = 0, lines = 0;
    int status = parse_options("bleu", usage, options, sizeof options / sizeof options[0], argc,
                               argv, paths, &n);
    if (status) {
        free(paths);
        return status == 2 ? 0 : 1;
    }
    int method = 0;
    while (method < 4 && strcmp(smooth, smoothing_names[method]) != 0)
        method++;
    BleuStats stats;
    const char *error = NULL;
    char *end = NULL;
    double value = value_text ? strtod(value_text, &end) : -1;
    if (value_text && (end == value_text || *end || !isfinite(value) || value < 0))
        error = errorf("--smooth-value '%s' is not valid; expected a number >= 0", value_text);
    else if (strcmp(tokenize, "13a") != 0 && strcmp(tokenize, "none") != 0)
        error = errorf("--tokenize '%s' is not a tokenizer; expected 13a or none", tokenize);
    else if (method == 4)
        error = errorf("--smooth '%s' is not a smoothing method; expected exp, none, floor or "
                       "add-k", smooth);
    else if (value_text && smoothing_defaults[method] < 0)
        error = errorf("--smooth-value goes with --smooth floor or add-k; %s takes no value",
                       smooth);
    else if (n != 2)
        error = "expected two files, HYPOTHESES.txt REFERENCES.txt";
    else
        error = bleu_files(&stats, paths[0], paths[1], strcmp(tokenize, "13a") == 0, &lines);
    if (error)
        fprintf(stderr, "error: bleu: %s\n", error);
    else {
        printf("%s against %s: %d sentences\n", paths[0], paths[1], lines);
        print_sacrebleu_line(&stats, strcmp(tokenize, "13a") == 0, (Smoothing)method,
                             value >= 0 ? value : smoothing_defaults[method]);
    }
    free(paths);
    return error ? 1 : 0;
}


// ---- eval: a checkpoint on a TSV file -----------------------------------------

static int command_eval(int argc, char **argv) {
    const char *checkpoint = NULL, *data = NULL, *error = NULL;
    int beam = 1, threads = 0, show = 0, batch_tokens = 2000, bleu = 0;
    double alpha = 0.6;
    Option options[] = {
        TEXT_OPTION("--checkpoint", &checkpoint, "the trained model (required)"),
        TEXT_OPTION("--data", &data, "source<TAB>target lines to evaluate on (required)"),
        FLAG_OPTION("--bleu", &bleu,
                    "also print corpus BLEU-4 of the outputs against the targets (§6.1)"),
        INT_OPTION("--beam", &beam, 1, 1000, "beam size; 1 is greedy decoding"),
        NUMBER_OPTION("--alpha", &alpha, 0, 100, 0, "length penalty exponent of beam search"),
        INT_OPTION("--show", &show, 0, INT_MAX, "print the first N decoded pairs"),
        INT_OPTION("--batch-tokens", &batch_tokens, 1, 100000000, "tokens decoded side by side"),
        INT_OPTION("--threads", &threads, 0, 1024, "OpenMP threads (0: all cores)"),
        FLAG_OPTION("--progress", &progress_always,
                    "progress lines also when standard error is not a terminal"),
    };
    const char *usage =
        "usage: ./transformer eval --checkpoint FILE --data FILE.tsv [--beam 4] [--bleu]\n"
        "Decodes every source of FILE.tsv and compares the output with the target: token accuracy\n"
        "(positions that agree, over the longer of output and target), exact match and, with\n"
        "--bleu, corpus-level BLEU-4 over the model's tokens (one reference each, no smoothing).\n"
        "With §5.1 merges (train --bpe), exact match and BLEU are on words,\n"
        "BLEU also on subwords.";
    int status = parse_options("eval", usage, options, (int)(sizeof options / sizeof *options),
                               argc, argv, NULL, NULL);
    if (status)
        return status == 2 ? 0 : 1;
    set_threads(threads);
    LabCheckpoint c;
    memset(&c, 0, sizeof c);
    Dataset dataset = { 0 };
    if (!checkpoint || !data)
        error = !checkpoint ? "--checkpoint FILE is required" : "--data FILE.tsv is required";
    else if (!(error = lab_checkpoint_load(checkpoint, &c)) &&
             !(error = dataset_read_tsv(&dataset, &c.vocab, c.merges, data, 0)))
        error = dataset_check_lengths(&dataset, data, c.model.config.max_len);
    if (!error) {
        Evaluation e;
        HeldOutLoss losses;
        BleuStats bleu_tokens, bleu_words;
        lab_evaluate(&e, &losses, &c.model, &dataset, 0, batch_tokens, beam, alpha);
        evaluation_bleu(&bleu_tokens, &e, &dataset);
        const char *subwords = c.merges ? " (subwords)" : "";
        const char *words = c.merges ? " (words)" : "";
        if (c.merges)
            evaluation_words(&e, &bleu_words, &dataset, &c.vocab, c.merges);   // §5.1: on words
        if (show)
            print_examples(&e, &dataset, &c.vocab, c.merges, show);
        printf("%s: %d pairs, %s\n", data, e.sentences,
               beam > 1 ? "beam search" : "greedy decoding");
        printf("token accuracy  %.2f%% (%ld/%ld)%s\n",
               100.0 * e.correct / (e.compared ? e.compared : 1), e.correct, e.compared, subwords);
        printf("exact match     %.2f%% (%d/%d)%s\n", 100.0 * e.exact / e.sentences, e.exact,
               e.sentences, words);
        printf("loss            %.4f per target token%s (teacher forcing, label smoothing %g)\n",
               losses.loss, c.merges ? ", a subword" : "",
               (double)c.model.config.label_smoothing);
        printf("perplexity      %.4f per target token%s (exp of -log p(reference), no smoothing)\n",
               exp(losses.log_loss), c.merges ? ", a subword" : "");
        if (bleu)
            print_bleu(c.merges ? &bleu_words : &bleu_tokens, words);
        if (bleu && c.merges)
            print_bleu(&bleu_tokens, subwords);
        evaluation_free(&e);
    }
    if (error)
        fprintf(stderr, "error: eval: %s\n", error);
    dataset_free(&dataset);
    lab_checkpoint_free(&c);
    return error ? 1 : 0;
}

