/* lab/text.c: real text for make's ./transformer: the text rule, tokens, TSV files
 *
 * transformer.c alone reads the copy and reverse tasks, whose tokens are
 * numbers separated by ASCII spaces. Real sentences need more, and this file
 * gives it to every command of the lab:
 *   - one rule for text: white space is Unicode's (the set Python's
 *     str.split() splits at, so that BLEU counts what sacreBLEU's
 *     tokenize='none' counts); every input is UTF-8, and a byte that is not
 *     is refused with its file and line; a UTF-8 byte-order mark at the start
 *     of a file is dropped;
 *   - tokens: whole words, or with §5.1 merges (lab/subwords.c) subwords, and
 *     back into words;
 *   - files of `source<TAB>target` lines (train --train, --valid; eval --data),
 *     every 20th line held out when there is no --valid.
 *
 * BUILD  included by lab/lab.c after transformer.c
 */

// ---- white space ------------------------------------------------------------
// One set of white-space characters separates tokens everywhere (data, decode's input, BLEU): the
// set Python's str.split() splits at. ASCII's \t \n \v \f \r and space, U+001C..U+001F, U+0085,
// U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F and U+3000; not the zero-width
// space U+200B, nor a lone Latin-1 0xA0.

// The length of the white-space character that begins the text, or 0 (never reads past the end).
static int unicode_white_space(const char *text) {
    const unsigned char *s = (const unsigned char *)text;
    if (s[0] == ' ' || (s[0] >= 0x09 && s[0] <= 0x0D) || (s[0] >= 0x1C && s[0] <= 0x1F))
        return 1;
    if (s[0] == 0xC2)
        return s[1] == 0x85 || s[1] == 0xA0 ? 2 : 0;                   // U+0085 U+00A0
    if (s[0] == 0xE1)
        return s[1] == 0x9A && s[2] == 0x80 ? 3 : 0;                   // U+1680
    if (s[0] == 0xE2 && s[1] == 0x80) {                                // U+2000..U+202F
        int space = (s[2] >= 0x80 && s[2] <= 0x8A) || s[2] == 0xA8 || s[2] == 0xA9 || s[2] == 0xAF;
        return space ? 3 : 0;
    }
    if (s[0] == 0xE2 && s[1] == 0x81)
        return s[2] == 0x9F ? 3 : 0;                                   // U+205F
    if (s[0] == 0xE3)
        return s[1] == 0x80 && s[2] == 0x80 ? 3 : 0;                   // U+3000
    return 0;
}

// ---- UTF-8 --------------------------------------------------------------------
// Every text input is UTF-8: a byte that is not (Latin-1, a binary file) is refused with its file
// and line, as a program that splits at Unicode's spaces must (NOTES §7).

// The length of the valid UTF-8 sequence at s, or 0 (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF).
static int utf8_sequence_length(const unsigned char *s) {
    int n = 0;
    if (s[0] < 0x80)
        return 1;
    if (s[0] >= 0xC2 && s[0] <= 0xDF)
        n = 2;
    if (s[0] >= 0xE0 && s[0] <= 0xEF)
        n = 3;
    if (s[0] >= 0xF0 && s[0] <= 0xF4)
        n = 4;
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    }
    if ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] >= 0xA0))
        return 0;
    if ((s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] >= 0x90))
        return 0;
    return n;
}

// NULL for a line of UTF-8 text, else the first byte that is not, at `where` ("data.tsv:12").
// got: read_text_line's answer (-1: a zero byte).
static const char *text_error(const char *line, int got, const char *where) {
    if (got < 0)
        return errorf("%s: a zero byte; expected text", where);
    const unsigned char *s = (const unsigned char *)line;
    while (*s) {
        int n = utf8_sequence_length(s);
        if (n == 0) {
            size_t byte = (size_t)(s - (const unsigned char *)line) + 1;
            return errorf("%s: byte %zu of the line, 0x%02x, is not UTF-8; expected UTF-8 text",
                          where, byte, *s);
        }
        s += n;
    }
    return NULL;
}

// decode's lines and arguments: UTF-8, without the byte-order mark of line 1 (a zero byte is
// refused before).
static const char *lab_check_text(char *line, const char *where, int line_no) {
    if (line_no == 1 && strncmp(line, "\xEF\xBB\xBF", 3) == 0) {
        memmove(line, line + 3, strlen(line) - 2);
    }
    return text_error(line, 1, where);
}

// Line line_no (from 1) of f into *line, without its end and (line 1) a UTF-8 byte-order mark.
// Returns 1, 0 at the end, -1 for a line with a zero byte.
static int read_text_line(FILE *f, char **line, size_t *capacity, int line_no) {
    ssize_t length = getline(line, capacity, f);
    if (length < 0)
        return 0;
    if (line_no == 1 && length >= 3 && memcmp(*line, "\xEF\xBB\xBF", 3) == 0) {
        memmove(*line, *line + 3, (size_t)length - 2);
        length -= 3;
    }
    while (length > 0 && ((*line)[length - 1] == '\n' || (*line)[length - 1] == '\r')) {
        length--;
        (*line)[length] = '\0';
    }
    return strlen(*line) == (size_t)length ? 1 : -1;
}

// Opens a text file to read, or sets *error (fopen opens a directory too, read as empty).
static FILE *open_text_file(const char *path, const char **error) {
    FILE *f = fopen(path, "r");
    struct stat st;
    if (!f) {
        *error = errorf("%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        *error = errorf("%s: is a directory; expected a text file", path);
        return NULL;
    }
    return f;
}

// ---- tokens: words, or §5.1 subwords -----------------------------------------
// The lab splits text as transformer.c does (next_token, tokenize), but at Unicode's white space,
// and, for a model trained on §5.1 subwords, cuts each word into subwords with its merges
// (lab/subwords.c); its outputs join back into words.

typedef struct Bpe Bpe;   // lab/subwords.c: the merges, in the order learned
static int bpe_split_word(Vocabulary *vocab, Bpe *merges, int grow, const char *word, int length,
                          int **ids, size_t *capacity, int n, TextSource *from);
static char *bpe_join_tokens(const Vocabulary *vocab, const Bpe *merges, const int *ids, int n);

// The first token of the text (white space is Unicode's), and its length in bytes in *length;
// NULL when there is none.
static const char *skip_white_space(const char *text) {
    for (int n = unicode_white_space(text); n > 0; n = unicode_white_space(text))
        text += n;
    return text;
}

static const char *text_next_token(const char *text, size_t *length) {
    text = skip_white_space(text);
    const char *end = text;
    while (*end != '\0' && unicode_white_space(end) == 0)
        end++;
    *length = (size_t)(end - text);
    return end > text ? text : NULL;
}

// Splits the text into token ids (*ids grows as needed): whole words, or with merges subwords.
// Returns the number of tokens, or -1 at the text of a special token (named in from->reserved),
// as tokenize.
static int text_tokenize(const char *text, Vocabulary *vocab, Bpe *merges, int grow, int **ids,
                         size_t *capacity, TextSource *from) {
    int n = 0;
    size_t length;
    for (const char *token = text_next_token(text, &length); token;
         token = text_next_token(token + length, &length)) {
        for (int special = 0; special < NUM_SPECIAL_TOKENS; special++) {
            from->reserved = special_tokens[special];
            if (strlen(from->reserved) == length && memcmp(token, from->reserved, length) == 0)
                return -1;
        }
        if (merges) {
            n = bpe_split_word(vocab, merges, grow, token, (int)length, ids, capacity, n, from);
        } else {
            push_id(ids, capacity, n, token_id(vocab, grow, token, length, from));
            n++;
        }
    }
    return n;
}

// The tokens as a new string: whole words separated by spaces, or subwords joined into words.
static char *tokens_to_text(const Vocabulary *vocab, const Bpe *merges, const int *ids, int n) {
    return bpe_join_tokens(vocab, merges, ids, n);
}

static void print_text(FILE *f, const Vocabulary *vocab, const Bpe *merges, const int *ids,
                       int n) {
    char *text = tokens_to_text(vocab, merges, ids, n);
    fputs(text, f);
    free(text);
}

// ---- TSV files: source<TAB>target lines ---------------------------------------

// The dataset's token array cut down to its tokens (dataset_add grows it to twice what it needs).
static void dataset_fit(Dataset *dataset) {
    if (dataset->num_tokens == 0)
        return;
    dataset->tokens = checked_realloc(dataset->tokens, dataset->num_tokens, sizeof(int),
                                      "sentence tokens");
    dataset->tokens_capacity = dataset->num_tokens;
}

// The token ids of one line's two sides, kept from line to line.
typedef struct {
    int *src, *tgt;
    size_t src_capacity, tgt_capacity;
} TsvBuffers;

// One line, cut at its tab, into the dataset: NULL, or the error naming the line.
static const char *tsv_line(Dataset *dataset, Vocabulary *vocab, Bpe *merges, int grow,
                            char *line, TextSource *from, int line_no, TsvBuffers *ids) {
    char *tab = strchr(line, '\t');
    if (!tab)
        return errorf("%s: no tab; expected source<TAB>target", from->where);
    if (strchr(tab + 1, '\t')) {
        return errorf("%s: more than one tab; expected source<TAB>target", from->where);
    }
    *tab = '\0';
    int n_src = text_tokenize(line, vocab, merges, grow, &ids->src, &ids->src_capacity, from);
    int n_tgt = -1;
    if (n_src >= 0) {
        n_tgt = text_tokenize(tab + 1, vocab, merges, grow, &ids->tgt, &ids->tgt_capacity,
                              from);
    }
    if (n_tgt < 0)
        return reserved_token_error(from);
    if (n_src == 0)
        return errorf("%s: empty source; expected tokens before the tab", from->where);
    if (n_tgt == 0)
        return errorf("%s: empty target; expected tokens after the tab", from->where);
    if (n_src > TRANSFORMER_MAX_LEN || n_tgt > TRANSFORMER_MAX_LEN) {
        return errorf("%s: %d tokens; expected at most %d", from->where,
                      n_src > n_tgt ? n_src : n_tgt, TRANSFORMER_MAX_LEN);
    }
    if (vocab->size > TRANSFORMER_MAX_VOCAB) {
        return errorf("%s: more than %d distinct tokens; expected fewer", from->where,
                      TRANSFORMER_MAX_VOCAB);
    }
    dataset_add(dataset, ids->src, n_src, ids->tgt, n_tgt, line_no);
    return NULL;
}

// Reading a TSV file into a dataset (and its held-out pairs): where the pairs go, and the state
// kept from line to line.
typedef struct {
    Dataset *dataset;
    Dataset *held_out;      // every held_out_every-th pair goes here (NULL: none)
    int held_out_every;
    Vocabulary *vocab;
    Bpe *merges;            // §5.1, or NULL: whole words
    int grow;               // a new token joins the vocabulary (else <unk>, warned of)
    const char *path;
    long pairs;             // the pairs read so far
    TextSource from;
    TsvBuffers ids;
} TsvReading;

// The dataset the next pair goes to: the held-out one for every held_out_every-th pair.
static Dataset *tsv_next_pair_dataset(const TsvReading *r) {
    int held = r->held_out && r->held_out_every > 0 && (r->pairs + 1) % r->held_out_every == 0;
    return held ? r->held_out : r->dataset;
}

// Line line_no (read_text_line's got) into r's datasets: NULL, or the line's error.
static const char *tsv_read_line(TsvReading *r, char *line, int got, int line_no) {
    size_t unused;
    snprintf(r->from.where, sizeof r->from.where, "%s:%d", r->path, line_no);
    const char *error = text_error(line, got, r->from.where);
    int blank = !strchr(line, '\t') && !text_next_token(line, &unused);
    if (error || blank)
        return error;
    error = tsv_line(tsv_next_pair_dataset(r), r->vocab, r->merges, r->grow, line, &r->from,
                     line_no, &r->ids);
    r->pairs++;
    return error;
}

// lab/subwords.c: can the file's words be cut on threads, and the reading that does it.
static int bpe_cut_on_threads(const Bpe *merges, FILE *f);
static const char *bpe_read_tsv_on_threads(TsvReading *r, FILE *f, int *line_no);

// Reads `source<TAB>target` lines into dataset (blank lines skipped; \r\n ends a line), and with
// held_out every held_out_every-th pair (the every-th, 2·every-th, ...) into held_out instead,
// read there at once: no pair's tokens are held twice, as they were when the whole file was read
// and then split (issue 49: a 4.5-million-pair file). held_out NULL: every pair into dataset.
// grow: a new token joins the vocabulary; else it is <unk>, warned of. A big file's words are
// cut into §5.1 subwords on threads (bpe_read_tsv_on_threads), the same pairs and tokens.
static const char *dataset_read_tsv_split(Dataset *dataset, Dataset *held_out, int held_out_every,
                                          Vocabulary *vocab, Bpe *merges, const char *path,
                                          int grow) {
    const char *error = NULL;
    FILE *f = open_text_file(path, &error);
    if (!f)
        return error;
    TsvReading r;
    memset(&r, 0, sizeof r);
    r.dataset = dataset;
    r.held_out = held_out;
    r.held_out_every = held_out_every;
    r.vocab = vocab;
    r.merges = merges;
    r.grow = grow;
    r.path = path;
    int line_no = 0;
    if (bpe_cut_on_threads(merges, f)) {
        error = bpe_read_tsv_on_threads(&r, f, &line_no);
    } else {
        char *line = NULL;
        size_t line_capacity = 0;
        int got = read_text_line(f, &line, &line_capacity, 1);
        while (got != 0 && !error) {
            line_no++;
            error = tsv_read_line(&r, line, got, line_no);
            if (!error)
                got = read_text_line(f, &line, &line_capacity, line_no + 1);
        }
        free(line);
    }
    if (!error && ferror(f))
        error = errorf("%s: read error: %s", path, strerror(errno));
    if (!error && r.pairs == 0) {
        error = errorf("%s: no sentence pairs (%s); expected lines source<TAB>target", path,
                       line_no == 0 ? "the file is empty" : "only blank lines");
    }
    if (!error && r.from.warnings > MAX_UNKNOWN_WARNINGS) {
        fprintf(stderr, "warning: %s: %ld tokens in all are not in the vocabulary and were read "
                "as <unk>\n", path, r.from.unknown);
    }
    dataset_fit(dataset);
    if (held_out)
        dataset_fit(held_out);
    free(r.ids.src);
    free(r.ids.tgt);
    fclose(f);
    return error;
}

// Reads `source<TAB>target` lines into dataset (dataset_read_tsv_split, none held out).
static const char *dataset_read_tsv(Dataset *dataset, Vocabulary *vocab, Bpe *merges,
                                    const char *path, int grow) {
    return dataset_read_tsv_split(dataset, NULL, 0, vocab, merges, path, grow);
}

// max_len positions take at most max_len - 1 tokens: the encoder reads x_1..x_n </s>, the decoder
// <s> y_1..y_n. The error names the pair by its line (or number) in name.
static const char *dataset_check_lengths(const Dataset *dataset, const char *name, int max_len) {
    for (int i = 0; i < dataset->count; i++) {
        const SentencePair *p = &dataset->pairs[i];
        int longer = p->src_len > p->tgt_len ? p->src_len : p->tgt_len;
        if (longer <= max_len - 1)
            continue;
        char where[300];
        if (p->line)
            snprintf(where, sizeof where, "%s:%d", name, p->line);
        else
            snprintf(where, sizeof where, "%s, pair %d", name, i + 1);
        int source = p->src_len > max_len - 1;
        return errorf("%s: the %s has %d tokens; the model's maximum length %d allows %d "
                      "(one position is %s)", where, source ? "source" : "target", longer, max_len,
                      max_len - 1, source ? "</s>" : "<s>");
    }
    return NULL;
}

static void bpe_release_cut_words(Bpe *merges);   // lab/subwords.c

// train --train FILE [--valid FILE]: the pairs of the files, or every 20th pair of --train held
// out. Then the memory that cutting the words into §5.1 subwords took is given back.
static const char *lab_load_tsv(TrainRun *run, Bpe *merges, const char *train_path,
                                const char *valid_path, int grow) {
    snprintf(run->data_name, sizeof run->data_name, "%s", train_path);
    if (!run->vocab.words)
        vocab_init(&run->vocab);   // (the §5.1 subwords may be there already)
    Dataset *held_out = valid_path ? NULL : &run->valid;
    const char *error = dataset_read_tsv_split(&run->train, held_out, 20, &run->vocab, merges,
                                               train_path, grow);
    if (!error && valid_path)
        error = dataset_read_tsv(&run->valid, &run->vocab, merges, valid_path, 0);
    bpe_release_cut_words(merges);
    return error;
}

// ---- progress lines -----------------------------------------------------------
// Long work (counting words, learning merges, cutting a file, evaluating) prints a line on
// standard error every few seconds, on a terminal; --progress sets progress_always, for the
// lines also when standard error is a file.
static int progress_always = 0;

// When the evaluation under way began, and when its last line was printed (wall seconds).
static double evaluation_started;
static double evaluation_shown;

// An evaluation's progress: `done` of `count` pairs decoded (0 as it begins). Every 3 s, the pairs
// decoded, the rate, the time spent and left:
//   eval   120/500 pairs | 3.1 pairs/s | elapsed 0:39 | left 2:03
static void evaluation_progress_line(int done, int count) {
    double now = wall_seconds();
    if (done == 0) {
        evaluation_started = now;
        evaluation_shown = now;
        return;
    }
    int wanted = progress_always || isatty(fileno(stderr));
    if (!wanted || now - evaluation_shown < 3.0 || done >= count)
        return;
    double seconds = now - evaluation_started;
    char spent[32];
    char left[32];
    duration(spent, seconds);
    duration(left, seconds / done * (count - done));
    fprintf(stderr, "eval   %d/%d pairs | %.1f pairs/s | elapsed %s | left %s\n", done, count,
            done / seconds, spent, left);
    evaluation_shown = now;
}
