/* lab/decode.c: decoding for make's ./transformer: many sentences side by side, eval's and
 * train's evaluation, and the decode command
 *
 * transformer.c decodes one sentence at a time, greedy decoding being its beam search with one
 * beam. The lab decodes the sentences of a batch side by side (lab_greedy_decode): the same
 * tokens (lab/test_lab.c compares them), with products of a batch's rows rather than one
 * sentence's, which the fast path's tiles and its key/value cache turn into speed. Its
 * evaluation (lab_evaluate) adds the teacher-forced losses, progress lines and, with §5.1
 * subwords, the words; its decode reads Unicode text and §5.1 subwords, with --alpha and
 * --threads.
 *
 * BUILD  included by lab/lab.c after lab/checkpoints.c
 */

// ---- greedy decoding, many sentences side by side -------------------------------

// The most likely next token, never <pad> or <s>, nor </s> unless may_end; the lowest id wins
// a tie, a NaN never (all NaN: the first candidate). Beam search with one beam chooses the same.
_Static_assert(TOKEN_PAD < TOKEN_EOS && TOKEN_BOS < TOKEN_EOS && TOKEN_EOS == 2,
               "the possible outputs are the ids from </s> on");
static int greedy_token(const real *logits, int V, int may_end) {
    int first = may_end ? TOKEN_EOS : TOKEN_EOS + 1;
    int best = first;
    for (int token = first; token < V; token++) {
        int higher = logits[token] > logits[best];
        int best_is_nan = logits[best] != logits[best];
        int is_number = logits[token] == logits[token];
        if (higher || (best_is_nan && is_number))
            best = token;
    }
    return best;
}

// Greedy decoding of B sentences side by side: at each position every sentence takes its
// most likely token, until </s> or the length limit; as fairseq's min_len 1, a source of words
// (more than its </s>) never ends at the first position (NOTES §9). src is (B,S) padded,
// src_len (B); out (B, max_out) gets each output without </s>, out_len (B) its length.
static void lab_greedy_decode(Transformer *model, int *out, int *out_len, int max_out,
                              const int *src, const int *src_len, int B, int S) {
    int training = model->training;
    int V = model->config.vocab_size;
    int steps = 0;
    model->training = 0;
    int *limit = checked_calloc(B, sizeof(int), "decode limits");
    int *tokens = checked_calloc(B, sizeof(int), "decode tokens");
    int *done = checked_calloc(B, sizeof(int), "decode flags");
    for (int b = 0; b < B; b++) {
        limit[b] = transformer_decode_limit(model, src_len[b]);
        if (limit[b] > max_out)
            limit[b] = max_out;
        if (limit[b] > steps)
            steps = limit[b];
        out_len[b] = 0;
        tokens[b] = TOKEN_BOS;
    }

    Decoder decoder;
    decoder_begin(&decoder, model, src, src_len, B, S, B, steps);
    for (int t = 0; t < steps; t++) {
        decoder_step(&decoder, model, tokens, t, B);
        int active = 0;
        for (int b = 0; b < B; b++) {
            if (done[b])
                continue;
            int may_end = t > 0 || src_len[b] <= 1;
            int token = greedy_token(decoder.logits + (size_t)b * V, V, may_end);
            if (token == TOKEN_EOS) {
                done[b] = 1;
                continue;
            }
            out[(size_t)b * max_out + out_len[b]] = token;
            out_len[b]++;
            tokens[b] = token;
            if (t + 1 >= limit[b])
                done[b] = 1;
            active += !done[b];
        }
        if (!active)
            break;
    }

    decoder_end(&decoder);
    free(limit);
    free(tokens);
    free(done);
    model->training = training;
}

// ---- evaluation ---------------------------------------------------------------------

// The teacher-forced losses of an evaluation, beside transformer.c's Evaluation.
typedef struct {
    double loss;       // the label-smoothed loss, mean per target token
    double log_loss;   // mean -log p(reference token), no smoothing: perplexity = exp(log_loss)
} HeldOutLoss;

// -log p(reference token), summed over the batch, from the last forward pass's probabilities.
static double reference_log_loss(const Transformer *model, const Batch *batch) {
    int V = model->config.vocab_size;
    double sum = 0;
    for (int b = 0; b < batch->B; b++) {
        for (int t = 0; t < batch->tgt_len[b]; t++) {
            size_t row = (size_t)b * batch->T + t;
            sum -= log((double)model->acts.probs[row * V + batch->tgt_out[row]]);
        }
    }
    return sum;
}

// The first `count` pairs of the dataset (all of them when count <= 0), in batches sorted by
// length: the teacher-forced losses, and the sources decoded (beam_size 1: greedily, the batch
// side by side; else by beam search, one by one) and compared with their references, with
// progress lines for a long evaluation.
static void lab_evaluate(Evaluation *e, HeldOutLoss *losses, Transformer *model,
                         const Dataset *dataset, int count, int batch_tokens, int beam_size,
                         double alpha) {
    memset(e, 0, sizeof *e);
    if (count <= 0 || count > dataset->count)
        count = dataset->count;
    e->sentences = count;
    e->stride = model->config.max_len;
    e->output = checked_calloc((size_t)count * e->stride, sizeof(int), "decoded outputs");
    e->output_len = checked_calloc(count, sizeof(int), "decoded outputs");
    int training = model->training;
    model->training = 0;
    int *order = checked_calloc(count, sizeof(int), "evaluation order");
    BatchSpan *spans = checked_calloc(count, sizeof(BatchSpan), "evaluation batches");
    int num_spans = sort_and_cut(order, spans, dataset, count, batch_tokens, NULL);
    BatchBuffer bb = { 0 };
    int *out = NULL;
    int *out_len = NULL;
    double total_loss = 0;
    double total_log_loss = 0;
    long total_tokens = 0;
    int done = 0;
    evaluation_progress_line(done, count);
    for (int s = 0; s < num_spans; s++) {
        const int *indices = order + spans[s].start;
        int B = spans[s].count;
        batch_fill(&bb, dataset, indices, B);
        const Batch *batch = &bb.batch;
        real loss = transformer_forward(model, batch);
        total_loss += (double)loss * model->num_target_tokens;
        total_tokens += model->num_target_tokens;
        total_log_loss += reference_log_loss(model, batch);

        int S = batch->S;
        int max_out = transformer_decode_limit(model, S);
        out = checked_realloc(out, (size_t)B * max_out, sizeof(int), "decoded outputs");
        out_len = checked_realloc(out_len, B, sizeof(int), "decoded outputs");
        if (beam_size <= 1) {
            lab_greedy_decode(model, out, out_len, max_out, batch->src, batch->src_len, B, S);
        } else {
            for (int b = 0; b < B; b++) {
                out_len[b] = transformer_beam_search(model, out + (size_t)b * max_out, NULL,
                                                     batch->src + (size_t)b * S,
                                                     batch->src_len[b], beam_size, alpha);
            }
        }
        for (int b = 0; b < B; b++) {
            const SentencePair *p = &dataset->pairs[indices[b]];
            evaluation_add(e, p, dataset->tokens + p->tgt, indices[b], out + (size_t)b * max_out,
                           out_len[b]);
        }
        done += B;
        evaluation_progress_line(done, count);
    }
    losses->loss = total_tokens ? total_loss / total_tokens : 0;
    losses->log_loss = total_tokens ? total_log_loss / total_tokens : 0;
    free(order);
    free(spans);
    free(out);
    free(out_len);
    batch_buffer_free(&bb);
    model->training = training;
}

// The first `show` pairs: source, reference, output, and whether the output is the reference
// (with §5.1 subwords: in words).
static void print_examples(const Evaluation *e, const Dataset *dataset, const Vocabulary *vocab,
                           const Bpe *merges, int show) {
    for (int i = 0; i < show && i < e->sentences; i++) {
        const SentencePair *p = &dataset->pairs[i];
        char *output = tokens_to_text(vocab, merges, e->output + (size_t)i * e->stride,
                                      e->output_len[i]);
        char *reference = tokens_to_text(vocab, merges, dataset->tokens + p->tgt, p->tgt_len);
        printf("  source     ");
        print_text(stdout, vocab, merges, dataset->tokens + p->src, p->src_len);
        printf("\n  reference  %s\n", reference);
        const char *verdict = strcmp(output, reference) == 0 ? "exact" : "WRONG";
        printf("  output     %s   (%s)\n", output, verdict);
        free(output);
        free(reference);
    }
}

// ---- decode ------------------------------------------------------------------------

// decode's flags
typedef struct {
    const char *checkpoint;
    int beam;
    double alpha;   // beam search's length penalty (§6.1)
    int threads;
} DecodeOptions;

// Decodes one sentence of text and prints the output on one line. A sentence it cannot take
// does not stop a stream: it gets an error line and an empty output line (line i still answers
// line i), and 1 is returned. error: the text's own (not UTF-8, a zero byte), or NULL.
static int lab_decode_sentence(LabCheckpoint *c, char *text, TextSource *from,
                               const DecodeOptions *d, const char *error) {
    Transformer *model = &c->model;
    int max_len = model->config.max_len;
    int n = 0;
    int *ids = NULL;
    size_t capacity = 0;
    if (!error)
        n = text_tokenize(text, &c->vocab, c->merges, 0, &ids, &capacity, from);
    if (!error && n < 0)
        error = reserved_token_error(from);
    // the tokens the model reads (§5.1 subwords: a word may be several), against its positions
    if (!error && n > max_len - 1) {
        error = errorf("%s: the sentence has %d tokens; the model's maximum length %d allows %d "
                       "(one position is </s>)", from->where, n, max_len, max_len - 1);
    }
    if (!error && n > 0) {
        push_id(&ids, &capacity, n, TOKEN_EOS);   // the source ends with </s>, as in batch_fill
        n++;
        int limit = transformer_decode_limit(model, n);
        int *out = checked_calloc(limit, sizeof(int), "decoded sentence");
        int out_len;
        if (d->beam <= 1)
            lab_greedy_decode(model, out, &out_len, limit, ids, &n, 1, n);
        else
            out_len = transformer_beam_search(model, out, NULL, ids, n, d->beam, d->alpha);
        print_text(stdout, &c->vocab, c->merges, out, out_len);
        free(out);
    }
    free(ids);
    fflush(stdout);
    if (error)
        fprintf(stderr, "error: decode: %s\n", error);
    printf("\n");
    fflush(stdout);
    return error != NULL;
}

// The lines of standard input, each decoded as a sentence. Returns the number refused, or -1
// after a read error.
static int lab_decode_stdin(LabCheckpoint *c, const DecodeOptions *d, TextSource *from) {
    char *line = NULL;
    size_t capacity = 0;
    int refused = 0;
    int line_no = 0;
    ssize_t length = getline(&line, &capacity, stdin);
    while (length >= 0) {
        line_no++;
        snprintf(from->where, sizeof from->where, "stdin:%d", line_no);
        while (length > 0 && (line[length - 1] == '\n' || line[length - 1] == '\r')) {
            length--;
            line[length] = '\0';
        }
        const char *error = NULL;
        if (strlen(line) != (size_t)length)
            error = errorf("%s: a zero byte; expected text", from->where);
        if (!error)
            error = lab_check_text(line, from->where, line_no);
        refused += lab_decode_sentence(c, line, from, d, error);
        length = getline(&line, &capacity, stdin);
    }
    free(line);
    if (!ferror(stdin))
        return refused;
    // A read that fails (stdin a directory, say) is not the end of the input.
    fprintf(stderr, "error: decode: stdin: read error after %d lines: %s\n", line_no,
            strerror(errno));
    return -1;
}

static const char *lab_decode_usage =
    "usage: ./transformer decode --checkpoint FILE [--beam 4] ['SENTENCE' ...]\n"
    "Translates each SENTENCE (tokens separated by white space, Unicode's spaces included), or "
    "else\n"
    "each line of standard input, and prints the output, one line each. Greedy decoding with a\n"
    "key/value cache, or beam search with --beam; at most source length + 50 tokens (§6.1). A\n"
    "sentence it cannot take (too long, a reserved token) gets an error line and an empty output\n"
    "line; then exit status 1.";

static int lab_decode(int argc, char **argv) {
    DecodeOptions d = { NULL, 1, 0.6, 0 };
    Option options[] = {
        TEXT_OPTION("--checkpoint", &d.checkpoint, "the trained model (required)"),
        INT_OPTION("--beam", &d.beam, 1, 1000,
                   "beam size; 1 is greedy decoding (the paper used 4)"),
        NUMBER_OPTION("--alpha", &d.alpha, 0, 100, 0,
                      "length penalty ((5+len)/6)^alpha of beam search (§6.1)"),
        INT_OPTION("--threads", &d.threads, 0, 1024, "OpenMP threads (0: all cores)"),
    };
    char **sentences = checked_calloc(argc, sizeof(char *), "arguments");
    int num_sentences = 0;
    int status = parse_options("decode", lab_decode_usage, options,
                               (int)(sizeof options / sizeof *options), argc, argv, sentences,
                               &num_sentences);
    if (status != 0) {
        free(sentences);
        return status == 2 ? 0 : 1;
    }
    set_threads(d.threads);
    LabCheckpoint c;
    memset(&c, 0, sizeof c);
    const char *error = "--checkpoint FILE is required (a model written by ./transformer train)";
    if (d.checkpoint)
        error = lab_checkpoint_load(d.checkpoint, &c);
    if (error) {
        fprintf(stderr, "error: decode: %s\n", error);
        free(sentences);
        return 1;
    }

    // The sentences given as arguments, or else the lines of standard input.
    TextSource from = { "", 0, 0, NULL };
    int refused = 0;
    for (int i = 0; i < num_sentences; i++) {
        snprintf(from.where, sizeof from.where, "argument %d", i + 1);
        const char *error_of_text = lab_check_text(sentences[i], from.where, 0);
        refused += lab_decode_sentence(&c, sentences[i], &from, &d, error_of_text);
    }
    if (num_sentences == 0)
        refused = lab_decode_stdin(&c, &d, &from);
    lab_checkpoint_free(&c);
    free(sentences);
    return refused != 0;
}
