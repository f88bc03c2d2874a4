/* lab/decode.c: decoding for make's ./transformer: many sentences side by side, eval's and
 * train's evaluation, and the decode command
 *
 * transformer.c decodes one sentence at a time, greedy decoding being its beam search with one
 * beam. The lab decodes the sentences of a batch side by side, greedy or by beam search (§6.1:
 * beam 4, α 0.6), each sentence with its own beams (lab_decode_batch; lab_greedy_decode for
 * greedy alone): the same tokens (lab/test_lab.c compares them), with products of a batch's
 * rows rather than one sentence's, which the fast path's tiles and its key/value cache turn
 * into speed. decode sorts its lines by length into batches and prints in input order. Its
 * evaluation (lab_evaluate) adds the teacher-forced losses, progress lines and, with §5.1
 * subwords, the words; its decode reads Unicode text and §5.1 subwords, with --alpha and
 * --threads.
 *
 * BUILD  included by lab/lab.c after lab/checkpoints.c
 */
#include <poll.h>   // decode: whether standard input has more lines ready
#ifdef __GLIBC__
#include <malloc.h>   // mallopt: decode's memory kept from batch to batch
#endif

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

// ---- many sentences side by side, greedy or by beam search ---------------------------
// transformer_beam_search decodes one sentence; lab_decode_batch decodes B at once with the
// fast path's batched decoder (lab/fast_path.c, BatchedDecoder): each sentence keeps the state
// transformer_beam_search keeps in its locals (SentenceSearch), takes its decisions with the
// same functions on the same numbers (beam_propose, beam_finish; greedy_token for one beam,
// which chooses as a beam of one does), and so its tokens and its score. The step's products
// have a row per alive beam of every sentence; a sentence whose search ends leaves them, and
// the rows close up (batched_decoder_reorder).

// What to search for: beam 1 is greedy decoding; alpha is the length penalty's (§6.1).
typedef struct {
    int beam;
    double alpha;
} Search;

// Where a batch's outputs go: sentence b's tokens at tokens + b * stride (without </s>, at
// most stride of them), its length length[b], its score score[b] (beam search; score NULL: not
// wanted; greedy decoding leaves it).
typedef struct {
    int *tokens;
    int *length;
    double *score;
    int stride;
} Outputs;

// One sentence's search within a batch: transformer_beam_search's locals.
typedef struct {
    int limit;             // its positions: transformer_decode_limit, at most the output's stride
    int words;             // its source holds words, not </s> alone: </s> may not come first
    int first_row;         // its alive beams are the decoder's rows first_row .. + alive - 1
    int alive;             // 0: its search has ended
    int finished;          // hypotheses finished (beam search)
    int best_length;       // the best finished one's length (-1 before the first), and score
    double best_score;
    int *out;              // its output's tokens (Outputs)
    int *tokens;           // (beam, limit)  the alive beams' tokens so far, and the next ones'
    int *next_tokens;
    double *alive_score;   // (beam)         their summed log-probabilities, and the next ones'
    double *next_score;
    void *memory[2];       // the blocks of tokens and of scores (the halves swap places)
} SentenceSearch;

// The rows of the next position, as the sentences add theirs in order: row i reads token
// input[i] and continues this position's row parent[i].
typedef struct {
    int *input;
    int *parent;
    int count;
} NextRows;

static void next_row(NextRows *next, int token, int parent) {
    next->input[next->count] = token;
    next->parent[next->count] = parent;
    next->count++;
}

// Greedy decoding's position t for one sentence (its one row's logits): the most likely
// token ends it (</s>), or is its next output token and the next position's input, until its
// length limit.
static void greedy_advance(SentenceSearch *s, const real *logits, int t, int V,
                           NextRows *next) {
    int token = greedy_token(logits, V, t > 0 || !s->words);
    if (token == TOKEN_EOS) {
        s->alive = 0;
        return;
    }
    s->out[s->best_length++] = token;
    if (t + 1 >= s->limit) {
        s->alive = 0;
        return;
    }
    int row = s->first_row;
    s->first_row = next->count;
    next_row(next, token, row);
}

// What beam_propose needs of each row, computed for all the rows of a position at once, on the
// threads, before the sentences choose one after another: the row's log-sum-exp (in double as
// beam_propose's, in vector lanes: within a few units in the last place of its, so that the
// scores agree to about 1e-15 and the candidates' order with them), and its `beam` best tokens
// that may be proposed, best first. Within a row, beam_propose's candidates rank by logit (the
// row's score is alive_score + (logit - log_sum), which rounding keeps in the logits' order,
// and equal scores go to the higher logit), then by token (the first proposed stays first); so
// a token outside its row's best `width` has `width` candidates before it and is never among
// the `width` taken. Proposing these few, in beam_propose's order, takes the same candidates
// without scoring every token of the vocabulary. A row with a NaN logit (or an infinite
// largest) ranks as beam_propose ranks NaNs only when it proposes every token: it does.
typedef struct {
    int beam;
    double *log_sum;   // (rows)
    int *top;          // (rows, beam)  its best tokens, best first
    int *top_count;    // (rows)
    int *has_nan;      // (rows)        a NaN logit or log-sum-exp: beam_propose proposes its row
} RowCandidates;

// e^x for x <= 0 (x finite or -inf), in vector lanes: x = n ln 2 + r, |r| <= ln 2 / 2, e^r by
// its Taylor series to r^13 (the next term is below 1e-17 of it), times 2^n. Within a few units
// in the last place of libm's exp, which beam_propose calls token by token: libm's exp in
// row_candidates took a fifth of beam search's time (perf, dev/PERFORMANCE.md). Below -708 the
// result is e^-708 (3e-308), nothing beside the sum's largest term, 1.
#pragma omp declare simd
static inline double exp_nonpositive(double x) {
    const double shift = 0x1.8p52;   // adding it rounds a number of magnitude < 2^51 to an integer
    x = x > -708.0 ? (x < 0.0 ? x : 0.0) : -708.0;   // (a NaN: -708; its row is not used)
    double n = (x * 1.4426950408889634 + shift) - shift;   // round(x / ln 2)
    double r = (x - n * 0x1.62e42fee00000p-1) - n * 0x1.a39ef35793c76p-33;   // ln 2, two parts
    double p = 1.0 / 6227020800.0;   // 1/13!, then Horner's rule down to 1
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    int64_t exponent = (int64_t)n + 1023;   // n >= -1022: a normal number
    double scale;
    exponent <<= 52;
    memcpy(&scale, &exponent, sizeof scale);
    return p * scale;
}

static void row_candidates(RowCandidates *rc, int row, const real *z, int V, int may_end) {
    int beam = rc->beam;
    int *top = rc->top + (size_t)row * beam;
    int count = 0;
    int nan = 0;
    // the largest logit: beam_propose's max_z (the largest of numbers is the same in any order,
    // so in vector lanes; a row with a NaN, or an infinite largest, is beam_propose's to rank)
    real largest = z[0];
    #pragma omp simd reduction(max : largest) reduction(| : nan)
    for (int token = 0; token < V; token++) {
        largest = z[token] > largest ? z[token] : largest;
        nan |= z[token] != z[token];
    }
    nan |= isinf(largest);
    double max_z = nan ? 0 : largest;
    double sum = 0;
    #pragma omp simd reduction(+ : sum)
    for (int token = 0; token < V; token++) sum += exp_nonpositive(z[token] - max_z);
    double log_sum = max_z + log(sum);
    _Static_assert(TOKEN_PAD < TOKEN_EOS && TOKEN_BOS < TOKEN_EOS, "proposals from </s> on");
    real least = -INFINITY;   // the last of the `beam` best so far, once there are `beam`
    for (int token = may_end ? TOKEN_EOS : TOKEN_EOS + 1; token < V; token++) {
        if (count == beam && !(z[token] > least))
            continue;
        int i = count < beam ? count++ : beam - 1;   // after its equals: the first stays first
        while (i > 0 && z[token] > z[top[i - 1]]) {
            top[i] = top[i - 1];
            i--;
        }
        top[i] = token;
        least = z[top[count - 1]];
    }
    rc->log_sum[row] = log_sum;
    rc->top_count[row] = count;
    rc->has_nan[row] = nan;
}

// beam_propose's result (its best `keep` candidates of the sentence's alive beams, whose logits
// are rows first_row .. first_row + alive - 1 of logits) from the rows' candidates: each row's
// best `keep` tokens, in the order beam_propose proposes them (by token), scored as it scores
// them.
static int propose_from_rows(BeamCandidate *best, int keep, const real *logits,
                             const double *alive_score, int alive, int V, int first_row,
                             const RowCandidates *rc) {
    for (int r = 0; r < alive; r++)
        if (rc->has_nan[first_row + r] || alive_score[r] != alive_score[r])
            return -1;
    int num_best = 0;
    for (int r = 0; r < alive; r++) {
        int row = first_row + r;
        int count = min_int(keep, rc->top_count[row]);
        int tokens[count > 0 ? count : 1];
        memcpy(tokens, rc->top + (size_t)row * rc->beam, count * sizeof(int));
        for (int i = 1; i < count; i++)   // by token, as proposed
            for (int j = i; j > 0 && tokens[j] < tokens[j - 1]; j--) {
                int swap = tokens[j];
                tokens[j] = tokens[j - 1];
                tokens[j - 1] = swap;
            }
        const real *z = logits + (size_t)r * V;
        for (int i = 0; i < count; i++) {
            int token = tokens[i];
            BeamCandidate candidate = { alive_score[r] + (z[token] - rc->log_sum[row]), z[token],
                                        r, token };
            candidate_insert(best, &num_best, keep, candidate);
        }
    }
    return num_best;
}

// Beam search's position t for one sentence, as transformer_beam_search's loop body takes it:
// of the candidates of its alive beams (logits: their rows) the best beam - finished are taken
// in order; one ending in </s> is finished, the others are the next position's beams; at the
// length limit the alive beams finish as they are.
static void beam_advance(SentenceSearch *s, const real *logits, int t, int V,
                         const Search *search, NextRows *next, BeamCandidate *best,
                         const RowCandidates *rc) {
    int beam = search->beam;
    int width = beam - s->finished;
    int first_row = s->first_row;
    int may_end = t > 0 || !s->words;
    int num_best = propose_from_rows(best, width, logits, s->alive_score, s->alive, V, first_row,
                                     rc);
    if (num_best < 0)   // a NaN: every token proposed
        num_best = beam_propose(best, width, logits, s->alive_score, s->alive, V, may_end);
    int num_next = 0;
    s->first_row = next->count;
    for (int i = 0; i < num_best; i++) {
        const int *prefix = s->tokens + (size_t)best[i].row * s->limit;
        if (best[i].token == TOKEN_EOS) {   // finished: t tokens and </s>
            beam_finish(s->out, &s->best_length, &s->best_score, prefix, t, best[i].score,
                        t + 1, search->alpha);
            s->finished++;
            continue;
        }
        int *tokens = s->next_tokens + (size_t)num_next * s->limit;
        memcpy(tokens, prefix, t * sizeof(int));
        tokens[t] = best[i].token;
        s->next_score[num_next] = best[i].score;
        next_row(next, best[i].token, first_row + best[i].row);
        num_next++;
    }
    if (s->finished == beam || num_next == 0) {
        s->alive = 0;
        next->count -= num_next;
        return;
    }
    if (t + 1 == s->limit) {   // out of positions: the alive beams end here, without </s>
        for (int b = 0; b < num_next && s->finished < beam; b++) {
            beam_finish(s->out, &s->best_length, &s->best_score,
                        s->next_tokens + (size_t)b * s->limit, t + 1, s->next_score[b], t + 1,
                        search->alpha);
            s->finished++;
        }
        s->alive = 0;
        next->count -= num_next;
        return;
    }
    int *swap_tokens = s->tokens;
    double *swap_score = s->alive_score;
    s->tokens = s->next_tokens;
    s->alive_score = s->next_score;
    s->next_tokens = swap_tokens;
    s->next_score = swap_score;
    s->alive = num_next;
}

// B sentences, src (B, S) padded, of src_len (B) tokens (their </s> included), decoded side by
// side: greedily (search.beam 1) or by beam search, each as transformer_beam_search decodes it
// alone (as fairseq's min_len 1, a source of words never ends at the first position).
static void lab_decode_batch(Transformer *model, Outputs out, const int *src, const int *src_len,
                             int B, int S, Search search) {
    int training = model->training;
    int V = model->config.vocab_size;
    int beam = search.beam;
    int steps = 0;
    model->training = 0;
    SentenceSearch *sentence = checked_calloc(B, sizeof(SentenceSearch), "decode searches");
    for (int b = 0; b < B; b++) {
        SentenceSearch *s = &sentence[b];
        int limit = transformer_decode_limit(model, src_len[b]);
        s->limit = limit < out.stride ? limit : out.stride;
        s->words = src_len[b] > 1;
        s->first_row = b;
        s->alive = 1;
        s->best_length = beam == 1 ? 0 : -1;   // greedy: the output's length so far
        s->best_score = -INFINITY;
        s->out = out.tokens + (size_t)b * out.stride;
        if (beam > 1) {
            s->tokens = checked_calloc((size_t)2 * beam * s->limit, sizeof(int), "beams");
            s->next_tokens = s->tokens + (size_t)beam * s->limit;
            s->alive_score = checked_calloc(2 * (size_t)beam, sizeof(double), "beams");
            s->next_score = s->alive_score + beam;
            s->memory[0] = s->tokens;
            s->memory[1] = s->alive_score;
        }
        steps = s->limit > steps ? s->limit : steps;
    }
    NextRows next = { checked_calloc((size_t)B * beam, sizeof(int), "decode inputs"),
                      checked_calloc((size_t)B * beam, sizeof(int), "decode rows"), 0 };
    int *input = checked_calloc((size_t)B * beam, sizeof(int), "decode inputs");
    BeamCandidate *best = checked_calloc(beam, sizeof(BeamCandidate), "beam candidates");
    size_t R = (size_t)B * beam;
    RowCandidates rc = { beam, checked_calloc(R, sizeof(double), "row candidates"),
                         checked_calloc(R * beam, sizeof(int), "row candidates"),
                         checked_calloc(R, sizeof(int), "row candidates"),
                         checked_calloc(R, sizeof(int), "row candidates") };
    for (int b = 0; b < B; b++) input[b] = TOKEN_BOS;

    BatchedDecoder decoder;
    batched_decoder_begin(&decoder, model, src, src_len, B, S, beam, steps);
    for (int t = 0; t < steps; t++) {
        batched_decoder_step(&decoder, model, input, t);
        if (beam > 1) {
            #pragma omp parallel for
            for (int row = 0; row < decoder.rows; row++)   // at t = 0 row b is sentence b
                row_candidates(&rc, row, decoder.logits + (size_t)row * V, V,
                               t > 0 || sentence[row].words);
        }
        next.count = 0;
        for (int b = 0; b < B; b++) {
            SentenceSearch *s = &sentence[b];
            if (!s->alive)
                continue;
            const real *logits = decoder.logits + (size_t)s->first_row * V;
            if (beam == 1)
                greedy_advance(s, logits, t, V, &next);
            else
                beam_advance(s, logits, t, V, &search, &next, best, &rc);
        }
        if (next.count == 0)
            break;
        batched_decoder_reorder(&decoder, next.parent, next.count, t);
        int *swap = input;
        input = next.input;
        next.input = swap;
    }
    batched_decoder_end(&decoder);

    for (int b = 0; b < B; b++) {
        out.length[b] = sentence[b].best_length;
        if (out.score && beam > 1)
            out.score[b] = sentence[b].best_score;
        free(sentence[b].memory[0]);
        free(sentence[b].memory[1]);
    }
    free(sentence);
    free(next.input);
    free(next.parent);
    free(input);
    free(best);
    free(rc.log_sum);
    free(rc.top);
    free(rc.top_count);
    free(rc.has_nan);
    model->training = training;
}

// Greedy decoding of B sentences side by side: src (B,S) padded, src_len (B); out (B, max_out)
// gets each output without </s>, out_len (B) its length.
static void lab_greedy_decode(Transformer *model, int *out, int *out_len, int max_out,
                              const int *src, const int *src_len, int B, int S) {
    Outputs outputs = { out, out_len, NULL, max_out };
    Search greedy = { 1, 0 };
    lab_decode_batch(model, outputs, src, src_len, B, S, greedy);
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
// length: the teacher-forced losses, and the sources decoded (beam_size 1: greedily; else by
// beam search; the batch side by side) and compared with their references, with
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
        Outputs outputs = { out, out_len, NULL, max_out };
        Search search = { beam_size > 1 ? beam_size : 1, alpha };
        lab_decode_batch(model, outputs, batch->src, batch->src_len, B, S, search);
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
// decode reads its sentences a group at a time (the arguments; or the lines of standard input
// already there), sorts the group's sentences by length, decodes them in batches of
// --batch-sentences side by side (lab_decode_batch) and prints the outputs in the input's order.
// Sorting keeps a batch's sources of about one length (little padding) and its outputs too
// (few rows left running for one long sentence).

// The sentences of a batch side by side, unless --batch-sentences says otherwise
// (dev/PERFORMANCE.md, "Decoding many sentences at once": the measured choice).
#define DECODE_BATCH_SENTENCES 32
// The most lines of standard input decode takes into one group: a file is decoded this many
// lines at a time (sorted within them); a terminal or a pipe gives what it has.
#define DECODE_GROUP_LINES 4096

// decode's flags
typedef struct {
    const char *checkpoint;
    int beam;
    double alpha;   // beam search's length penalty (§6.1)
    int threads;
    int batch_sentences;
    int subwords;   // print the output's subwords as the model wrote them, not its words
} DecodeOptions;

// One sentence of decode's input: its tokens, or why it gets an empty output instead.
typedef struct {
    int *ids;         // its tokens and </s>
    int length;       // their count; 0: an empty line, whose output is empty
    char *error;      // NULL, or the error line's text (the line is refused)
    int *output;      // the decoded tokens, without </s>
    int output_length;
} DecodeLine;

// The text's tokens, checked against the model's positions, into line. error: the text's own
// (not UTF-8, a zero byte), or NULL.
static void decode_line_prepare(DecodeLine *line, LabCheckpoint *c, char *text, TextSource *from,
                                const char *error) {
    int max_len = c->model.config.max_len;
    size_t capacity = 0;
    int n = 0;
    memset(line, 0, sizeof *line);
    if (!error)
        n = text_tokenize(text, &c->vocab, c->merges, 0, &line->ids, &capacity, from);
    if (!error && n < 0)
        error = reserved_token_error(from);
    // the tokens the model reads (§5.1 subwords: a word may be several), against its positions
    if (!error && n > max_len - 1) {
        error = errorf("%s: the sentence has %d tokens; the model's maximum length %d allows %d "
                       "(one position is </s>)", from->where, n, max_len, max_len - 1);
    }
    if (error) {
        line->error = checked_calloc(strlen(error) + 1, 1, "error line");
        strcpy(line->error, error);
        return;
    }
    if (n > 0) {
        push_id(&line->ids, &capacity, n, TOKEN_EOS);   // the source ends with </s>, as in
        line->length = n + 1;                           // batch_fill
    }
}

// Orders line indices by their sentences' lengths (then by index: the same order every run).
static const DecodeLine *sorted_lines;
static int compare_line_lengths(const void *a, const void *b) {
    int i = *(const int *)a;
    int j = *(const int *)b;
    if (sorted_lines[i].length != sorted_lines[j].length)
        return sorted_lines[i].length < sorted_lines[j].length ? -1 : 1;
    return (i > j) - (i < j);
}

// A line every 3 s on a terminal's standard error while a group of many lines is decoded.
static void decode_progress_line(double started, double *shown, int done, int count) {
    double now = wall_seconds();
    if (!isatty(fileno(stderr)) || now - *shown < 3.0 || done >= count)
        return;
    char spent[32];
    char left[32];
    double seconds = now - started;
    duration(spent, seconds);
    duration(left, seconds / done * (count - done));
    fprintf(stderr, "decode %d/%d sentences | %.1f sentences/s | elapsed %s | left %s\n", done,
            count, done / seconds, spent, left);
    *shown = now;
}

// Decodes the lines' sentences, sorted by length, in batches of at most d->batch_sentences.
static void decode_lines(Transformer *model, DecodeLine *lines, int count,
                         const DecodeOptions *d) {
    int *order = checked_calloc(count, sizeof(int), "decode order");
    int sentences = 0;
    for (int i = 0; i < count; i++)
        if (lines[i].length > 0)
            order[sentences++] = i;
    sorted_lines = lines;
    qsort(order, sentences, sizeof(int), compare_line_lengths);
    Search search = { d->beam, d->alpha };
    double started = wall_seconds(), shown = started;
    if (sentences > 0) {   // the memory of the largest batch, once (the longest sentences last)
        int most = min_int(d->batch_sentences, sentences);
        int longest = lines[order[sentences - 1]].length;
        ensure_buffers(model, most, longest, 1);
        batched_decoder_reserve(&model->config, most, longest, d->beam,
                                transformer_decode_limit(model, longest));
    }
    for (int first = 0; first < sentences; first += d->batch_sentences) {
        int B = min_int(d->batch_sentences, sentences - first);
        const int *batch = order + first;
        int S = lines[batch[B - 1]].length;   // the longest: the last, sorted
        int stride = transformer_decode_limit(model, S);
        int *src = checked_calloc((size_t)B * S, sizeof(int), "decode batch");   // <pad>: 0
        int *src_len = checked_calloc(B, sizeof(int), "decode batch");
        Outputs out = { checked_calloc((size_t)B * stride, sizeof(int), "decoded sentences"),
                        checked_calloc(B, sizeof(int), "decoded sentences"), NULL, stride };
        for (int b = 0; b < B; b++) {
            const DecodeLine *line = &lines[batch[b]];
            memcpy(src + (size_t)b * S, line->ids, line->length * sizeof(int));
            src_len[b] = line->length;
        }
        lab_decode_batch(model, out, src, src_len, B, S, search);
        for (int b = 0; b < B; b++) {
            DecodeLine *line = &lines[batch[b]];
            line->output_length = out.length[b];
            line->output = checked_calloc(out.length[b] + 1, sizeof(int), "decoded sentence");
            memcpy(line->output, out.tokens + (size_t)b * stride, out.length[b] * sizeof(int));
        }
        free(src);
        free(src_len);
        free(out.tokens);
        free(out.length);
        decode_progress_line(started, &shown, first + B, sentences);
    }
    free(order);
}

// Decodes a group of lines and prints one line for each, in order: its output, or (a line it
// cannot take) an error line on standard error and an empty output line, so that line i still
// answers line i. Returns the number refused; frees the lines.
static int decode_group(LabCheckpoint *c, DecodeLine *lines, int count, const DecodeOptions *d) {
    decode_lines(&c->model, lines, count, d);
    int refused = 0;
    for (int i = 0; i < count; i++) {
        DecodeLine *line = &lines[i];
        if (line->error) {
            fflush(stdout);
            fprintf(stderr, "error: decode: %s\n", line->error);
            refused++;
        } else if (d->subwords) {
            for (int k = 0; k < line->output_length; k++)
                printf("%s%s", k ? " " : "", c->vocab.words[line->output[k]]);
        } else {
            print_text(stdout, &c->vocab, c->merges, line->output, line->output_length);
        }
        printf("\n");
        free(line->ids);
        free(line->error);
        free(line->output);
    }
    fflush(stdout);
    return refused;
}

// Standard input as decode reads it: the bytes read and not yet handed out as lines.
typedef struct {
    char *bytes;
    size_t start, used, capacity;   // lines not handed out: bytes[start .. used-1]
    int ended;                      // the end of the input, or a read that failed:
    int error;                      // its errno (0: the end)
} InputBuffer;

// Whether a read of standard input would return at once (bytes, or its end).
static int input_ready(void) {
    struct pollfd fd = { 0, POLLIN, 0 };
    return poll(&fd, 1, 0) > 0;
}

// The next line of standard input into *line, without its line end (*length bytes; a zero
// byte may be among them): 1; 0 when no whole line is there yet and may_wait is 0 (a read
// would wait for more input); -1 at the end of the input. A last line without its line end
// counts, as getline's.
static int input_line(InputBuffer *in, int may_wait, char **line, size_t *length) {
    for (;;) {
        char *start = in->bytes + in->start;
        char *end = in->used > in->start ? memchr(start, '\n', in->used - in->start) : NULL;
        if (end || (in->ended && in->used > in->start)) {
            *line = start;
            *length = end ? (size_t)(end - start) : in->used - in->start;
            in->start += *length + (end != NULL);
            return 1;
        }
        if (in->ended || (!may_wait && !input_ready()))
            return in->ended ? -1 : 0;
        memmove(in->bytes, start, in->used - in->start);   // the partial line to the front
        in->used -= in->start;
        in->start = 0;
        if (in->capacity - in->used < 65536) {
            in->capacity = 2 * in->capacity + 65536;
            in->bytes = checked_realloc(in->bytes, in->capacity, 1, "standard input");
        }
        ssize_t n = read(0, in->bytes + in->used, in->capacity - in->used);
        if (n < 0 && errno == EINTR)
            continue;
        if (n > 0)
            in->used += (size_t)n;
        in->ended = n <= 0;
        in->error = n < 0 ? errno : 0;
    }
}

// The lines of standard input, each decoded as a sentence: the lines already there are taken
// as a group (at most DECODE_GROUP_LINES), waiting for input only when none is, so that a line
// typed at a terminal is answered at once. Returns the number refused, or -1 after a read
// error.
static int lab_decode_stdin(LabCheckpoint *c, const DecodeOptions *d, TextSource *from) {
    InputBuffer in = { checked_calloc(65536, 1, "standard input"), 0, 0, 65536, 0, 0 };
    DecodeLine *lines = checked_calloc(DECODE_GROUP_LINES, sizeof(DecodeLine), "decode lines");
    char *text = NULL;
    size_t text_capacity = 0;
    int refused = 0;
    int line_no = 0;
    int more = 1;
    while (more) {
        int count = 0;
        char *line;
        size_t length;
        int got = 0;
        while (count < DECODE_GROUP_LINES &&
               (got = input_line(&in, count == 0, &line, &length)) > 0) {
            line_no++;
            snprintf(from->where, sizeof from->where, "stdin:%d", line_no);
            while (length > 0 && (line[length - 1] == '\n' || line[length - 1] == '\r'))
                length--;
            if (length + 1 > text_capacity) {
                text_capacity = 2 * (length + 1);
                text = checked_realloc(text, text_capacity, 1, "line");
            }
            memcpy(text, line, length);
            text[length] = '\0';
            const char *error = NULL;
            if (strlen(text) != length)
                error = errorf("%s: a zero byte; expected text", from->where);
            if (!error)
                error = lab_check_text(text, from->where, line_no);
            decode_line_prepare(&lines[count++], c, text, from, error);
        }
        more = got >= 0;
        refused += decode_group(c, lines, count, d);
    }
    free(lines);
    free(text);
    free(in.bytes);
    if (!in.error)
        return refused;
    // A read that fails (stdin a directory, say) is not the end of the input.
    fprintf(stderr, "error: decode: stdin: read error after %d lines: %s\n", line_no,
            strerror(in.error));
    return -1;
}

static const char *lab_decode_usage =
    "usage: ./transformer decode --checkpoint FILE [--beam 4] ['SENTENCE' ...]\n"
    "Translates each SENTENCE (tokens separated by white space, Unicode's spaces included), or "
    "else\n"
    "each line of standard input, and prints the output, one line each. Greedy decoding with a\n"
    "key/value cache, or beam search with --beam; at most source length + 50 tokens (§6.1); the\n"
    "sentences side by side, sorted by length, --batch-sentences at a time (standard input: the\n"
    "lines already there). A sentence it cannot take (too long, a reserved token) gets an error\n"
    "line and an empty output line; then exit status 1.";

static int lab_decode(int argc, char **argv) {
    DecodeOptions d = { NULL, 1, 0.6, 0, DECODE_BATCH_SENTENCES, 0 };
    Option options[] = {
        TEXT_OPTION("--checkpoint", &d.checkpoint, "the trained model (required)"),
        INT_OPTION("--beam", &d.beam, 1, 1000,
                   "beam size; 1 is greedy decoding (the paper used 4)"),
        NUMBER_OPTION("--alpha", &d.alpha, 0, 100, 0,
                      "length penalty ((5+len)/6)^alpha of beam search (§6.1)"),
        INT_OPTION("--threads", &d.threads, 0, 1024, "OpenMP threads (0: all cores)"),
        INT_OPTION("--batch-sentences", &d.batch_sentences, 1, 4096,
                   "sentences decoded side by side (the same outputs whatever the number)"),
        FLAG_OPTION("--subwords", &d.subwords,
                    "print the output as the model's tokens (§5.1 subwords, as bpe prints them)"),
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

    // The sentences given as arguments (one group), or else the lines of standard input. The
    // weights stay as they are to the end: the products pack each one once (fast_path_decoding).
    fast_path_decoding(1);
#ifdef __GLIBC__
    // The memory of one batch's decoding, freed, serves the next: glibc would hand large blocks
    // back to the system and take them again, and the system's first touch of each page took a
    // tenth of beam search's time (125,000 page faults for the 510 catalogs sentences, perf).
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
    TextSource from = { "", 0, 0, NULL };
    int refused = 0;
    if (num_sentences > 0) {
        DecodeLine *lines = checked_calloc(num_sentences, sizeof(DecodeLine), "decode lines");
        for (int i = 0; i < num_sentences; i++) {
            snprintf(from.where, sizeof from.where, "argument %d", i + 1);
            const char *error_of_text = lab_check_text(sentences[i], from.where, 0);
            decode_line_prepare(&lines[i], &c, sentences[i], &from, error_of_text);
        }
        refused = decode_group(&c, lines, num_sentences, &d);
        free(lines);
    } else {
        refused = lab_decode_stdin(&c, &d, &from);
    }
    fast_path_decoding(0);
    lab_checkpoint_free(&c);
    free(sentences);
    return refused != 0;
}
