/* lab/explain.c: ./transformer explain, one sentence through the user's own model, on one page
 *
 * The paper draws its model once (Figure 1) and the attention of a few sentences (Figures 3 to
 * 5). `explain` draws the user's sentence going through the user's checkpoint, every number
 * read from the model as it runs, in Figure 1's order: the words, their §5.1 subwords and ids;
 * the input of §3.4 and §3.5; each encoder layer's heads; each step of §6.1's decoding (its
 * attention, the next token's probabilities, the hypotheses of beam search with their length
 * penalty); the output and its alignment. The page is one HTML file with its CSS, JavaScript
 * and numbers (JSON) inline: nothing is fetched, and it opens from a disk anywhere.
 *
 * Where the numbers come from:
 *   - The decoding is decode's (explain_search): the same Decoder (decoder_begin: the fast
 *     path's key/value cache in ./transformer) and the same choice of the next token
 *     (greedy_token as lab_greedy_decode chooses; beam_propose and beam_finish as
 *     transformer_beam_search), so decode's tokens and scores bit for bit (lab/test_lab.c
 *     compares them). At each step it keeps what decode throws away: every live hypothesis,
 *     its most likely next tokens, what the step kept.
 *   - The attention of each step (explain_path): the cache keeps one layer's activations at a
 *     time, so the winner's tokens go once more through transformer.c's own decoder
 *     (decoder_step without the cache runs the decoder stack over positions 0..t, and
 *     model->acts holds every layer): its position t is step t's hypothesis on the winner's
 *     path, the numbers the cache computed to rounding (about 1e-6), and for greedy decoding
 *     those of the teacher-forced pass that `attention` draws (lab/test_lab.c). Its encoder
 *     pass, decode's own, gives the input and the encoder's numbers.
 *
 * BUILD  included by lab/lab.c after the pictures
 */

#define EXPLAIN_TOP 10                    // the next tokens shown for each live hypothesis
#define EXPLAIN_UNITS 10000               // attention in the page: integers in 1/10,000
#define EXPLAIN_DEFAULT_OUT "explain.html"
// The line near the top of every page explain writes: a file at --out without it is not one
// of ours, and is replaced only with --force.
#define EXPLAIN_PAGE_MARK "<meta name=\"generator\" content=\"transformer.c explain\">"

// ---- what the page shows ------------------------------------------------------------

// ALIVE: goes on to the next step; ENDED: chose </s>; CUT: ended at the length limit (§6.1).
typedef enum { HYPOTHESIS_ALIVE, HYPOTHESIS_ENDED, HYPOTHESIS_CUT } HypothesisStatus;

// A hypothesis as a step of the search left it: one of beam search's candidates kept, or
// greedy decoding's one.
typedef struct {
    int *tokens;              // its tokens, without <s> and </s>
    int length;
    int parent;               // the live hypothesis it extends (the decoder's row)
    int token;                // the token the step chose for it (</s> for ENDED)
    double log_p;             // summed log-probability
    double score;             // log_p / length_penalty(|Y|), </s> counted in |Y| (§6.1)
    HypothesisStatus status;
    int on_path;              // the winner, or a hypothesis the winner grew from
} ExplainHypothesis;

// Step t of the search: position t of every live hypothesis.
typedef struct {
    int live;                 // hypotheses alive at its start: the decoder's rows
    int *live_tokens;         // (live, t) their tokens; position t reads the last (<s> at t = 0)
    double *live_log_p;       // (live)
    int *top_ids;             // (live, EXPLAIN_TOP) each one's most likely next tokens
    double *top_p;            // (live, EXPLAIN_TOP) and their probabilities
    ExplainHypothesis *kept;  // (num_kept) what the step kept, best first
    int num_kept;
    int path_row;             // the live hypothesis on the winner's path, or -1
    real *self_att;           // (L, NH, t + 1) that hypothesis's masked self-attention at t
    real *cross_att;          // (L, NH, S) and its attention over the source
} ExplainStep;

// A word of the sentence and its tokens (§5.1 subwords, or the word itself).
typedef struct {
    char *text;
    int first;                // its tokens are the source's first .. first + count - 1
    int count;
    int *merge_rank;          // (num_merges) the merges that cut it, in the order applied
    int *merge_subword;       // (num_merges) the subword each made part of (0 .. count - 1)
    int num_merges;
} ExplainWord;

typedef struct {
    // the sentence (§5.1)
    int *src;                 // (S) the ids decode reads, </s> last
    int S;
    char **token_text;        // (S) each token's text (a piece read as <unk>: the piece)
    ExplainWord *words;
    int num_words;
    // the input (§3.4, §3.5) and the encoder (§3.1), from decode's encoder pass
    real *scaled;             // (S, C) E[token] * sqrt(d_model)
    real *position;           // (S, C) PE(pos)
    real *input;              // (S, C) their sum: acts.enc_embedded
    real *enc_att;            // (L, NH, S, S) each layer's self-attention
    real *enc_norm;           // (L, S) the length of each layer's output at each token
    // the decoding (§6.1)
    int beam;
    double alpha;
    ExplainStep *steps;
    int num_steps;
    int *out;                 // the output, without </s>
    int out_len;
    double score;
    int winner_step;          // the step that finished the output
    int winner_ended;         // with </s>, else cut at the length limit
} Explanation;

static void explain_free(Explanation *x) {
    for (int i = 0; x->token_text && i < x->S; i++) free(x->token_text[i]);
    for (int w = 0; w < x->num_words; w++) {
        free(x->words[w].text);
        free(x->words[w].merge_rank);
        free(x->words[w].merge_subword);
    }
    for (int t = 0; t < x->num_steps; t++) {
        ExplainStep *step = &x->steps[t];
        for (int k = 0; k < step->num_kept; k++) free(step->kept[k].tokens);
        free(step->kept);
        free(step->live_tokens);
        free(step->live_log_p);
        free(step->top_ids);
        free(step->top_p);
        free(step->self_att);
        free(step->cross_att);
    }
    free(x->src);
    free(x->token_text);
    free(x->words);
    free(x->scaled);
    free(x->position);
    free(x->input);
    free(x->enc_att);
    free(x->enc_norm);
    free(x->steps);
    free(x->out);
    memset(x, 0, sizeof *x);
}

// ---- the sentence: words, subwords, ids ------------------------------------------------

// A word's tokens into pieces (room for n + 1): §5.1 subwords as bpe_encode_word_traced cuts
// them, noting which merges cut it and the subword each made part of; or the word itself.
// text_tokenize made the ids the same way (bpe_split_word). Returns the number of pieces.
static int explain_word(ExplainWord *w, char **pieces, const Bpe *merges, const char *word,
                        int n) {
    w->text = checked_calloc((size_t)n + 1, 1, "words");
    memcpy(w->text, word, (size_t)n);
    if (!merges) {
        pieces[0] = checked_calloc((size_t)n + 1, 1, "words");
        memcpy(pieces[0], word, (size_t)n);
        return 1;
    }
    int *start = checked_calloc((size_t)n + 2, sizeof(int), "subwords");
    int *scratch = checked_calloc((size_t)n + 2, sizeof(int), "subwords");
    char *text = checked_calloc((size_t)n + 5, 1, "subwords");
    int *at = checked_calloc((size_t)n + 1, sizeof(int), "merges");
    w->merge_rank = checked_calloc((size_t)n + 1, sizeof(int), "merges");
    w->merge_subword = checked_calloc((size_t)n + 1, sizeof(int), "merges");
    BpeTrace trace = { w->merge_rank, at, 0 };
    int count = bpe_encode_word_traced(merges, start, word, n, scratch, text, &trace);
    w->num_merges = trace.count;
    for (int k = 0; k < trace.count; k++) {
        int subword = 0;   // the last subword that begins at or before the merge's byte
        while (subword + 1 < count && start[subword + 1] <= at[k])
            subword++;
        w->merge_subword[k] = subword;
    }
    for (int i = 0; i < count; i++) {
        int length = bpe_symbol_text(text, word, start, count, i);
        pieces[i] = checked_calloc((size_t)length + 1, 1, "subwords");
        memcpy(pieces[i], text, (size_t)length);
    }
    free(start);
    free(scratch);
    free(text);
    free(at);
    return count;
}

static char *explain_copy(const char *text) {
    size_t n = strlen(text);
    char *copy = checked_calloc(n + 1, 1, "text");
    memcpy(copy, text, n);
    return copy;
}

// The words of the sentence, each with its tokens, which must be the n tokens before </s>: a
// known piece's text is then the vocabulary's, an unknown one (<unk>) keeps its own.
static const char *explain_words(Explanation *x, const LabCheckpoint *c, const char *sentence) {
    int n = x->S - 1;
    size_t length;
    int words = 0;
    for (const char *t = text_next_token(sentence, &length); t;
         t = text_next_token(t + length, &length))
        words++;
    x->words = checked_calloc((size_t)words, sizeof(ExplainWord), "words");
    x->token_text = checked_calloc((size_t)x->S, sizeof(char *), "tokens");
    int first = 0;
    for (const char *t = text_next_token(sentence, &length); t;
         t = text_next_token(t + length, &length)) {
        ExplainWord *w = &x->words[x->num_words++];
        char **pieces = checked_calloc(length + 1, sizeof(char *), "tokens");
        w->first = first;
        w->count = explain_word(w, pieces, c->merges, t, (int)length);
        for (int i = 0; i < w->count; i++) {
            int id = first + i < n ? x->src[first + i] : -1;
            if (id >= 0)
                x->token_text[first + i] =
                    id == TOKEN_UNK ? explain_copy(pieces[i]) : explain_copy(c->vocab.words[id]);
            free(pieces[i]);
        }
        free(pieces);
        first += w->count;
    }
    x->token_text[n] = explain_copy("</s>");
    if (first != n)
        return "the words' subwords are not the sentence's tokens (a bug: please report it)";
    return NULL;
}

// The sentence as decode reads it: the ids of text_tokenize (§5.1 subwords with the
// checkpoint's merges; a piece the vocabulary lacks is <unk>, warned of), then </s>; and the
// words they came from. NULL, or the reason the model cannot take it.
static const char *explain_sentence(Explanation *x, LabCheckpoint *c, const char *sentence,
                                    TextSource *from) {
    int max_len = c->model.config.max_len;
    int *ids = NULL;
    size_t capacity = 0;
    int n = text_tokenize(sentence, &c->vocab, c->merges, 0, &ids, &capacity, from);
    const char *error = NULL;
    if (n < 0)
        error = reserved_token_error(from);
    else if (n == 0)
        error = "the sentence is empty; expected tokens separated by white space";
    else if (n > max_len - 1)
        error = errorf("the sentence has %d tokens; the model's maximum length %d allows %d "
                       "(one position is </s>)", n, max_len, max_len - 1);
    if (error) {
        free(ids);
        return error;
    }
    push_id(&ids, &capacity, n, TOKEN_EOS);   // the source ends with </s>, as in batch_fill
    x->src = ids;
    x->S = n + 1;
    return explain_words(x, c, sentence);
}

// ---- the decoding, as decode runs it, recorded ------------------------------------------

// log of the sum of exp(logits) over a row of V, as beam_propose computes it (in double, the
// largest logit subtracted first)
static double explain_log_sum(const real *logits, int V) {
    double max_z = logits[0];
    double sum = 0;
    for (int token = 1; token < V; token++)
        max_z = logits[token] > max_z ? logits[token] : max_z;
    for (int token = 0; token < V; token++) sum += exp(logits[token] - max_z);
    return max_z + log(sum);
}

// The EXPLAIN_TOP most likely next tokens of one row of logits (V), the higher logit first,
// the lower id among equals (a NaN never), with their softmax probabilities; -1 after the last.
static void explain_top(int *ids, double *p, const real *logits, int V) {
    double log_sum = explain_log_sum(logits, V);
    int count = 0;
    for (int token = 0; token < V; token++) {
        int is_number = logits[token] == logits[token];
        if (!is_number || (count == EXPLAIN_TOP && !(logits[token] > logits[ids[count - 1]])))
            continue;
        if (count < EXPLAIN_TOP)
            count++;
        int i = count - 1;   // the last place, where the token goes in and moves up
        while (i > 0 && logits[token] > logits[ids[i - 1]]) {
            ids[i] = ids[i - 1];
            i--;
        }
        ids[i] = token;
    }
    for (int i = 0; i < EXPLAIN_TOP; i++) {
        if (i >= count)
            ids[i] = -1;
        p[i] = i < count ? exp(logits[ids[i]] - log_sum) : 0;
    }
}

// The hypotheses alive at step t (rows of the decoder, their tokens `stride` apart) and each
// one's most likely next tokens.
static void explain_record_live(ExplainStep *step, const real *logits, const int *tokens,
                                size_t stride, const double *log_p, int live, int t, int V) {
    step->live = live;
    step->live_tokens = checked_calloc((size_t)live * t, sizeof(int), "explained steps");
    step->live_log_p = checked_calloc((size_t)live, sizeof(double), "explained steps");
    step->top_ids = checked_calloc((size_t)live * EXPLAIN_TOP, sizeof(int), "explained steps");
    step->top_p = checked_calloc((size_t)live * EXPLAIN_TOP, sizeof(double), "explained steps");
    step->path_row = -1;
    for (int r = 0; r < live; r++) {
        memcpy(step->live_tokens + (size_t)r * t, tokens + r * stride, (size_t)t * sizeof(int));
        step->live_log_p[r] = log_p[r];
        explain_top(step->top_ids + r * EXPLAIN_TOP, step->top_p + r * EXPLAIN_TOP,
                    logits + (size_t)r * V, V);
    }
}

// A candidate the step kept: the hypothesis prefix (t tokens) extended by its token (or
// ended, status ENDED), scored as beam_finish scores: log P / length_penalty(t + 1), </s>
// counted when there is one (and the tokens of an alive one all counted, as at the limit).
static void explain_keep(ExplainStep *step, const int *prefix, int t, BeamCandidate candidate,
                         HypothesisStatus status, double alpha) {
    ExplainHypothesis *h = &step->kept[step->num_kept++];
    h->length = status == HYPOTHESIS_ENDED ? t : t + 1;
    h->tokens = checked_calloc((size_t)t + 1, sizeof(int), "explained hypotheses");
    memcpy(h->tokens, prefix, (size_t)t * sizeof(int));
    h->tokens[t] = candidate.token;
    h->parent = candidate.row;
    h->token = candidate.token;
    h->log_p = candidate.score;
    h->score = candidate.score / length_penalty(t + 1, alpha);
    h->status = status;
}

// Greedy decoding's one candidate: lab_greedy_decode's token (greedy_token), with its
// log-probability added as beam_propose would add it.
static int explain_greedy_candidate(BeamCandidate *best, const real *logits, double log_p,
                                    int V, int may_end) {
    int token = greedy_token(logits, V, may_end);
    double log_softmax = logits[token] - explain_log_sum(logits, V);
    BeamCandidate candidate = { log_p + log_softmax, logits[token], 0, token };
    best[0] = candidate;
    return 1;
}

// At the length limit the step's alive hypotheses end as they are: the b-th is CUT.
static void explain_cut(ExplainStep *step, int b) {
    for (int k = 0; k < step->num_kept; k++) {
        if (step->kept[k].status != HYPOTHESIS_ALIVE)
            continue;
        if (b-- == 0) {
            step->kept[k].status = HYPOTHESIS_CUT;
            return;
        }
    }
}

// Decodes x->src as decode does, step by step, recording each step: greedy decoding (beam 1)
// chooses as lab_greedy_decode does, beam search is transformer_beam_search line for line
// (the same calls in the same order, so the same bits), with the records added.
static void explain_search(Explanation *x, Transformer *model) {
    int beam_size = x->beam;
    int V = model->config.vocab_size;
    int src_len = x->S;
    int training = model->training;
    model->training = 0;
    int limit = transformer_decode_limit(model, src_len);
    size_t stride = limit;
    int *tokens = checked_calloc((size_t)beam_size * stride, sizeof(int), "beams");
    int *next_tokens = checked_calloc((size_t)beam_size * stride, sizeof(int), "beams");
    double *alive_score = checked_calloc(beam_size, sizeof(double), "beams");
    double *next_score = checked_calloc(beam_size, sizeof(double), "beams");
    int *parent = checked_calloc(beam_size, sizeof(int), "beams");
    int *input = checked_calloc(beam_size, sizeof(int), "beams");
    BeamCandidate *best = checked_calloc(beam_size, sizeof(BeamCandidate), "beam candidates");
    int num_alive = 1;
    int finished = 0;
    int best_length = -1;
    double best_score = -INFINITY;
    x->out = checked_calloc(limit, sizeof(int), "explained output");
    x->steps = checked_calloc(limit, sizeof(ExplainStep), "explained steps");
    Decoder decoder;
    decoder_begin(&decoder, model, x->src, &src_len, 1, src_len, beam_size, limit);
    input[0] = TOKEN_BOS;

    for (int t = 0; t < limit; t++) {
        decoder_step(&decoder, model, input, t, num_alive);
        ExplainStep *step = &x->steps[x->num_steps++];
        explain_record_live(step, decoder.logits, tokens, stride, alive_score, num_alive, t, V);
        step->kept = checked_calloc(beam_size, sizeof(ExplainHypothesis), "explained steps");
        int width = beam_size - finished;
        int may_end = t > 0 || src_len <= 1;
        int num_best = beam_size == 1
                           ? explain_greedy_candidate(best, decoder.logits, alive_score[0], V,
                                                      may_end)
                           : beam_propose(best, width, decoder.logits, alive_score, num_alive, V,
                                          may_end);
        int num_next = 0;
        for (int i = 0; i < num_best; i++) {
            const int *prefix = tokens + best[i].row * stride;
            if (best[i].token == TOKEN_EOS) {
                beam_finish(x->out, &best_length, &best_score, prefix, t, best[i].score, t + 1,
                            x->alpha);
                explain_keep(step, prefix, t, best[i], HYPOTHESIS_ENDED, x->alpha);
                finished++;
                continue;
            }
            int *next = next_tokens + num_next * stride;
            memcpy(next, prefix, t * sizeof(int));
            next[t] = best[i].token;
            next_score[num_next] = best[i].score;
            parent[num_next] = best[i].row;
            input[num_next] = best[i].token;
            explain_keep(step, prefix, t, best[i], HYPOTHESIS_ALIVE, x->alpha);
            num_next++;
        }
        if (finished == beam_size || num_next == 0)
            break;

        if (t + 1 == limit) {   // out of positions: the alive beams end here, without </s>
            for (int b = 0; b < num_next && finished < beam_size; b++) {
                beam_finish(x->out, &best_length, &best_score, next_tokens + b * stride, t + 1,
                            next_score[b], t + 1, x->alpha);
                explain_cut(step, b);
                finished++;
            }
            break;
        }
        decoder_reorder(&decoder, parent, num_next, t + 1);
        int *swap_tokens = tokens;
        double *swap_score = alive_score;
        tokens = next_tokens;
        alive_score = next_score;
        next_tokens = swap_tokens;
        next_score = swap_score;
        num_alive = num_next;
    }

    x->out_len = best_length;
    x->score = best_score;
    decoder_end(&decoder);
    free(tokens);
    free(next_tokens);
    free(alive_score);
    free(next_score);
    free(parent);
    free(input);
    free(best);
    model->training = training;
}

static int explain_same_tokens(const int *a, const int *b, int n) {
    return memcmp(a, b, (size_t)n * sizeof(int)) == 0;
}

// The winner's path: the hypotheses it grew from (a prefix of the output, alive) and the
// winner itself (the output's tokens, finished: one step finishes it), and in each step the
// live hypothesis that path extends.
static void explain_mark_path(Explanation *x) {
    int W = x->out_len;
    x->winner_step = x->num_steps - 1;
    for (int t = 0; t < x->num_steps; t++) {
        ExplainStep *step = &x->steps[t];
        for (int k = 0; k < step->num_kept; k++) {
            ExplainHypothesis *h = &step->kept[k];
            int prefix = h->length <= W && explain_same_tokens(h->tokens, x->out, h->length);
            if (h->status == HYPOTHESIS_ALIVE) {
                h->on_path = prefix;
            } else if (prefix && h->length == W) {
                h->on_path = 1;
                x->winner_step = t;
                x->winner_ended = h->status == HYPOTHESIS_ENDED;
            }
        }
    }
    for (int t = 0; t <= x->winner_step; t++) {
        ExplainStep *step = &x->steps[t];
        for (int r = 0; r < step->live && t <= W; r++) {
            if (explain_same_tokens(step->live_tokens + (size_t)r * t, x->out, t))
                step->path_row = r;
        }
    }
}

// ---- the numbers of the winner's path, from transformer.c's decoder ----------------------

// The input (§3.4, §3.5) and every encoder layer, from the activations of the encoder pass
// decoder_begin ran (decoder_encode: one sentence, dropout off).
static void explain_encoder(Explanation *x, const Transformer *model) {
    const ActivationTensors *acts = &model->acts;
    size_t C = model->config.d_model;
    size_t L = model->config.n_layers;
    size_t NH = model->config.n_heads;
    size_t S = x->S;
    real sqrt_d_model = real_sqrt((real)C);   // as embedding_forward scales
    x->scaled = checked_calloc(S * C, sizeof(real), "explained input");
    x->position = checked_calloc(S * C, sizeof(real), "explained input");
    x->input = checked_calloc(S * C, sizeof(real), "explained input");
    x->enc_att = checked_calloc(L * NH * S * S, sizeof(real), "explained encoder");
    x->enc_norm = checked_calloc(L * S, sizeof(real), "explained encoder");
    for (size_t i = 0; i < S; i++) {
        const real *row = model->params.embedding + (size_t)x->src[i] * C;
        for (size_t c = 0; c < C; c++) x->scaled[i * C + c] = row[c] * sqrt_d_model;
    }
    memcpy(x->position, model->positional_encoding, S * C * sizeof(real));
    memcpy(x->input, acts->enc_embedded, S * C * sizeof(real));
    for (size_t l = 0; l < L; l++) {
        memcpy(x->enc_att + l * NH * S * S, acts->enc[l].self_attn.att,
               NH * S * S * sizeof(real));
        for (size_t i = 0; i < S; i++) {
            const real *out = acts->enc[l].norm2.out + i * C;
            double sum = 0;
            for (size_t c = 0; c < C; c++) sum += (double)out[c] * out[c];
            x->enc_norm[l * S + i] = (real)sqrt(sum);
        }
    }
}

// The attention of each step on the winner's path: transformer.c's own decoder (decoder_begin
// with the fast path's cache unplugged), fed <s> and the output's tokens, runs the decoder
// stack over positions 0..t at step t, so that model->acts holds every layer's; row t of
// dec[l].self_attn.att (1, NH, t+1, t+1) and of dec[l].cross_attn.att (1, NH, t+1, S) is the
// step's. Its decoder_begin runs decode's encoder pass: the input and the encoder from there.
static void explain_path(Explanation *x, Transformer *model) {
    size_t L = model->config.n_layers;
    size_t NH = model->config.n_heads;
    size_t S = x->S;
    int src_len = x->S;
    int steps = x->winner_step + 1;
    int training = model->training;
    FastPath plugged = fast_path;
    model->training = 0;
    fast_path.decoder_begin = NULL;   // (the products stay the fast path's)
    Decoder decoder;
    decoder_begin(&decoder, model, x->src, &src_len, 1, src_len, 1, steps);
    explain_encoder(x, model);
    for (int t = 0; t < steps; t++) {
        ExplainStep *step = &x->steps[t];
        size_t T = t + 1;
        int input = t == 0 ? TOKEN_BOS : x->out[t - 1];
        decoder_step(&decoder, model, &input, t, 1);
        step->self_att = checked_calloc(L * NH * T, sizeof(real), "explained steps");
        step->cross_att = checked_calloc(L * NH * S, sizeof(real), "explained steps");
        for (size_t l = 0; l < L; l++) {
            for (size_t h = 0; h < NH; h++) {
                const real *self = model->acts.dec[l].self_attn.att + (h * T + t) * T;
                const real *cross = model->acts.dec[l].cross_attn.att + (h * T + t) * S;
                memcpy(step->self_att + (l * NH + h) * T, self, T * sizeof(real));
                memcpy(step->cross_att + (l * NH + h) * S, cross, S * sizeof(real));
            }
        }
    }
    decoder_end(&decoder);
    fast_path = plugged;
    model->training = training;
}

// The whole decoding of src (S ids, </s> last), recorded: decode's search, the winner's path,
// its attention and the encoder's numbers. x->src and x->S are set; beam 1 is greedy.
static void explain_decode(Explanation *x, Transformer *model, int beam, double alpha) {
    x->beam = beam;
    x->alpha = alpha;
    explain_search(x, model);
    explain_mark_path(x);
    explain_path(x, model);
}

// ---- the page's template ---------------------------------------------------------------
// The page, as lines of text, around its numbers: explain_page_top (the head, the styles, the
// error marker and the sections' frames), then the numbers as JSON in a <script> of type
// application/json, then explain_page_script, which draws them (canvas heatmaps with the
// values on hover, the step slider). Plain HTML, CSS and JavaScript, no library and no font
// fetched. A script error writes its message into the page (#explain-error), where a headless
// browser's --dump-dom shows it (lab/test_lab.c); #explain-rendered marks a page drawn whole.

static const char *const explain_page_top[] = {
    "<!DOCTYPE html>",
    "<html lang=\"en\">",
    "<head>",
    "<meta charset=\"utf-8\">",
    "<meta name=\"generator\" content=\"transformer.c explain\">",
    "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
    "<title>transformer.c explain</title>",
    "<style>",
    "body { margin: 0; background: #fafafa; color: #1b1f24;",
    "       font: 14px/1.45 system-ui, -apple-system, 'Segoe UI', 'DejaVu Sans', sans-serif; }",
    "main { max-width: 1280px; margin: 0 auto; padding: 0 20px 60px; }",
    "h1 { font-size: 22px; margin: 18px 0 4px; }",
    "h2 { font-size: 18px; margin: 30px 0 6px; padding-bottom: 4px;",
    "     border-bottom: 1px solid #ddd; }",
    "h3 { font-size: 15px; margin: 18px 0 6px; }",
    "h4 { font-size: 13px; margin: 10px 0 4px; color: #333; }",
    ".note { color: #555; max-width: 920px; margin: 4px 0 8px; }",
    "nav a { margin-right: 14px; }",
    ".cards { display: flex; flex-wrap: wrap; gap: 10px; }",
    ".card { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 6px 10px; }",
    ".word { font-weight: 600; margin-bottom: 2px; }",
    ".token { display: inline-block; margin: 2px; padding: 0 5px; white-space: pre;",
    "         font-family: ui-monospace, 'DejaVu Sans Mono', monospace; font-size: 13px;",
    "         background: #eef3fb; border: 1px solid #c9d7ee; border-radius: 4px; }",
    ".token.unk { background: #fde8e8; border-color: #e9a5a5; }",
    ".token.now { background: #ffe9b8; border-color: #e0a21b; }",
    ".id { color: #777; font-size: 11px; margin-left: 3px; font-family: ui-monospace, monospace; }",
    ".merges { margin: 4px 0 0; padding-left: 18px; font-size: 12px; color: #333; }",
    ".panels { display: flex; flex-wrap: wrap; gap: 10px; align-items: flex-start; }",
    "figure { margin: 0; padding: 4px; background: #fff; border: 1px solid #e2e2e2;",
    "         border-radius: 4px; }",
    "figcaption { font-size: 12px; color: #333; margin-bottom: 2px; }",
    "canvas { display: block; }",
    "#tip { position: fixed; display: none; z-index: 9; pointer-events: none; white-space: pre;",
    "       background: #222; color: #fff; font-size: 12px; padding: 3px 6px;",
    "       border-radius: 3px; }",
    ".controls { position: sticky; top: 0; z-index: 5; padding: 6px 0; background: #fafafa;",
    "            border-bottom: 1px solid #e6e6e6; }",
    ".controls input { width: 360px; vertical-align: middle; }",
    ".controls button { font-size: 13px; padding: 2px 10px; }",
    "table { border-collapse: collapse; font-size: 13px; background: #fff; }",
    "td, th { padding: 2px 8px; text-align: left; vertical-align: top;",
    "         border-bottom: 1px solid #eee; }",
    ".num { text-align: right; font-variant-numeric: tabular-nums; }",
    "tr.path td { background: #fff4d6; }",
    "tr.winner td { background: #ffe2a0; font-weight: 600; }",
    ".bar { display: inline-block; height: 9px; background: #4a78c2; vertical-align: middle; }",
    ".chosen { font-weight: 600; }",
    ".columns { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }",
    "#explain-error { background: #fdd; color: #900; padding: 8px; margin: 0; }",
    "</style>",
    "</head>",
    "<body>",
    "<script>",
    "window.onerror = function (message, source, line) {",
    "  var box = document.createElement('pre');",
    "  box.id = 'explain-error';",
    "  box.textContent = 'script error: ' + message + ' (line ' + line + ')';",
    "  document.body.insertBefore(box, document.body.firstChild);",
    "};",
    "</script>",
    "<div id=\"tip\"></div>",
    "<main>",
    "<h1 id=\"title\">One sentence through the model</h1>",
    "<p id=\"summary\" class=\"note\"></p>",
    "<nav><a href=\"#words\">1. words</a><a href=\"#input\">2. input</a>",
    "<a href=\"#encoder\">3. encoder</a><a href=\"#decoding\">4. decoding</a>",
    "<a href=\"#output\">5. output</a></nav>",
    "<section id=\"words\">",
    "<h2>1. The words, their subwords (§5.1) and the ids</h2>",
    "<p class=\"note\" id=\"words-note\"></p>",
    "<div id=\"words-cards\" class=\"cards\"></div>",
    "</section>",
    "<section id=\"input\">",
    "<h2>2. The input: E[token] × √d<sub>model</sub> + PE(pos) (§3.4, §3.5)</h2>",
    "<p class=\"note\">A row per source token, a column per dimension of d<sub>model</sub>: the",
    "token's embedding times √d<sub>model</sub>, the positional encoding of its position,",
    "and their sum, the encoder's input (no dropout at inference). Hover a cell for its",
    "values.</p>",
    "<div id=\"input-panels\" class=\"panels\"></div>",
    "</section>",
    "<section id=\"encoder\">",
    "<h2>3. The encoder (§3.1, §3.2)</h2>",
    "<p class=\"note\">Each layer's self-attention, one picture per head: row i is the probability",
    "distribution query i puts over the keys (softmax(QK<sup>T</sup>/√d<sub>k</sub>), eq. 1),",
    "each row summing to 1. Beside the heads, the length |x| of the layer's output at each token",
    "(after its second Add &amp; Norm).</p>",
    "<div id=\"encoder-layers\"></div>",
    "</section>",
    "<section id=\"decoding\">",
    "<h2>4. Decoding, step by step (§6.1)</h2>",
    "<p class=\"note\" id=\"decoding-note\"></p>",
    "<div class=\"controls\"><button id=\"step-back\" type=\"button\">&#9664;</button>",
    "<input id=\"step\" type=\"range\" min=\"0\" max=\"0\" value=\"0\">",
    "<button id=\"step-on\" type=\"button\">&#9654;</button> <span id=\"step-label\"></span></div>",
    "<div id=\"step-view\"></div>",
    "</section>",
    "<section id=\"output\">",
    "<h2>5. The output, and where it looked</h2>",
    "<div id=\"output-text\"></div>",
    "<p class=\"note\" id=\"alignment-note\"></p>",
    "<div id=\"output-panels\" class=\"panels\"></div>",
    "</section>",
    "</main>",
    NULL,
};


static const char *const explain_page_script[] = {
    "<script>",
    "(function () {",
    "'use strict';",
    "var data = JSON.parse(document.getElementById('explain-data').textContent);",
    "var UNITS = 10000;   // attention probabilities are integers in 1/10,000",
    "var L = data.config.layers;",
    "var NH = data.config.heads;",
    "var S = data.source.length;",
    "var sourceLabels = data.source_text;",
    "",
    "function byId(id) {",
    "  return document.getElementById(id);",
    "}",
    "",
    "function make(tag, className, text) {",
    "  var node = document.createElement(tag);",
    "  if (className) {",
    "    node.className = className;",
    "  }",
    "  if (text !== undefined) {",
    "    node.textContent = text;",
    "  }",
    "  return node;",
    "}",
    "",
    "function add(parent, tag, className, text) {",
    "  return parent.appendChild(make(tag, className, text));",
    "}",
    "",
    "function word(id) {",
    "  var text = data.vocab[id];",
    "  return text === undefined ? '#' + id : text;",
    "}",
    "",
    "function number(v, digits) {",
    "  return v === null ? 'NaN' : Number(v).toPrecision(digits || 4);",
    "}",
    "",
    "function probability(units) {",
    "  return units === null ? 'NaN' : (units / UNITS).toFixed(4);",
    "}",
    "",
    "function chip(parent, id, text, className) {",
    "  var node = add(parent, 'span', 'token' + (className ? ' ' + className : ''), text);",
    "  node.setAttribute('data-id', id);",
    "  add(parent, 'span', 'id', String(id));",
    "  return node;",
    "}",
    "",
    "// ---- colours: white to blue for probabilities, blue-white-red around 0 for the rest",
    "var SEQUENTIAL = [[255, 255, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181],",
    "                  [8, 48, 107]];",
    "var DIVERGING = [[33, 102, 172], [146, 197, 222], [247, 247, 247], [244, 165, 130],",
    "                 [178, 24, 43]];",
    "",
    "function ramp(stops, t) {",
    "  t = Math.max(0, Math.min(1, t));",
    "  var x = t * (stops.length - 1);",
    "  var i = Math.min(Math.floor(x), stops.length - 2);",
    "  var f = x - i;",
    "  var rgb = [0, 1, 2].map(function (c) {",
    "    return Math.round(stops[i][c] + (stops[i + 1][c] - stops[i][c]) * f);",
    "  });",
    "  return 'rgb(' + rgb.join(',') + ')';",
    "}",
    "",
    "var tip = byId('tip');",
    "",
    "function showTip(event, text) {",
    "  tip.textContent = text;",
    "  tip.style.display = 'block';",
    "  tip.style.left = Math.min(event.clientX + 14, window.innerWidth - 260) + 'px';",
    "  tip.style.top = (event.clientY + 14) + 'px';",
    "}",
    "",
    "function hideTip() {",
    "  tip.style.display = 'none';",
    "}",
    "",
    "function shorten(label) {",
    "  return label.length > 16 ? label.slice(0, 15) + '…' : label;",
    "}",
    "",
    "// A heatmap on a canvas: o.rows x o.cols cells of o.cell pixels (o.cellWidth, o.cellHeight),",
    "// o.value(i, j) a number or null (masked: grey), o.range [lo, hi] (diverging when lo < 0),",
    "// labels when the cells are tall or wide enough, o.mark a row to outline, and",
    "// o.describe(i, j) the text shown on hover.",
    "function heatmap(o) {",
    "  var figure = make('figure');",
    "  if (o.title) {",
    "    add(figure, 'figcaption', null, o.title);",
    "  }",
    "  var canvas = add(figure, 'canvas');",
    "  var context = canvas.getContext('2d');",
    "  var font = '11px system-ui, sans-serif';",
    "  var width = o.cellWidth || o.cell;",
    "  var height = o.cellHeight || o.cell;",
    "  var rowLabels = o.rowLabels && height >= 9 ? o.rowLabels : null;",
    "  var colLabels = o.colLabels && width >= 9 ? o.colLabels : null;",
    "  context.font = font;",
    "  var longest = function (labels) {",
    "    return labels ? Math.max.apply(null, labels.map(function (label) {",
    "      return context.measureText(shorten(label)).width;",
    "    })) + 6 : 0;",
    "  };",
    "  var left = longest(rowLabels);",
    "  var top = longest(colLabels);",
    "  canvas.width = Math.ceil(left + o.cols * width + 2);",
    "  canvas.height = Math.ceil(top + o.rows * height + 2);",
    "  context.font = font;",
    "  context.fillStyle = '#333';",
    "  context.textBaseline = 'middle';",
    "  if (rowLabels) {",
    "    context.textAlign = 'right';",
    "    rowLabels.forEach(function (label, i) {",
    "      context.fillText(shorten(label), left - 4, top + (i + 0.5) * height);",
    "    });",
    "  }",
    "  if (colLabels) {",
    "    context.textAlign = 'left';",
    "    colLabels.forEach(function (label, j) {",
    "      context.save();",
    "      context.translate(left + (j + 0.5) * width, top - 4);",
    "      context.rotate(-Math.PI / 2);",
    "      context.fillText(shorten(label), 0, 0);",
    "      context.restore();",
    "    });",
    "  }",
    "  var lo = o.range[0];",
    "  var hi = o.range[1];",
    "  for (var i = 0; i < o.rows; i++) {",
    "    for (var j = 0; j < o.cols; j++) {",
    "      var v = o.value(i, j);",
    "      if (v === null) {",
    "        context.fillStyle = '#e4e4e4';",
    "      } else if (lo < 0) {",
    "        context.fillStyle = ramp(DIVERGING, (v - lo) / (hi - lo));",
    "      } else {",
    "        context.fillStyle = ramp(SEQUENTIAL, (v - lo) / (hi - lo));",
    "      }",
    "      context.fillRect(left + j * width, top + i * height, width, height);",
    "    }",
    "  }",
    "  if (o.mark !== undefined) {",
    "    context.strokeStyle = '#e0a21b';",
    "    context.lineWidth = 2;",
    "    context.strokeRect(left + 1, top + o.mark * height + 1, o.cols * width - 1, height - 1);",
    "  }",
    "  canvas.addEventListener('mousemove', function (event) {",
    "    var box = canvas.getBoundingClientRect();",
    "    var j = Math.floor((event.clientX - box.left - left) / width);",
    "    var i = Math.floor((event.clientY - box.top - top) / height);",
    "    if (i >= 0 && i < o.rows && j >= 0 && j < o.cols) {",
    "      showTip(event, o.describe(i, j));",
    "    } else {",
    "      hideTip();",
    "    }",
    "  });",
    "  canvas.addEventListener('mouseleave', hideTip);",
    "  return figure;",
    "}",
    "",
    "// A cell size that keeps a picture of n cells across within about `pixels`.",
    "function cellFor(n, pixels) {",
    "  return Math.max(3, Math.min(18, Math.floor(pixels / n)));",
    "}",
    "",
    "function largest(rows) {",
    "  var m = 1e-30;",
    "  rows.forEach(function (row) {",
    "    row.forEach(function (v) {",
    "      if (v !== null) {",
    "        m = Math.max(m, Math.abs(v));",
    "      }",
    "    });",
    "  });",
    "  return m;",
    "}",
    "",
    "// An attention picture: rows x cols probabilities in 1/10,000 from get(i, j) (null: masked).",
    "function attention(title, rows, cols, get, rowLabels, colLabels, mark) {",
    "  var cell = cellFor(Math.max(rows, cols), 260);",
    "  return heatmap({",
    "    title: title, rows: rows, cols: cols, cell: cell, range: [0, 1], mark: mark,",
    "    rowLabels: rowLabels, colLabels: colLabels,",
    "    value: function (i, j) {",
    "      var units = get(i, j);",
    "      return units === null ? null : units / UNITS;",
    "    },",
    "    describe: function (i, j) {",
    "      var units = get(i, j);",
    "      var p = units === null ? 'masked (0)' : probability(units);",
    "      return rowLabels[i] + ' → ' + colLabels[j] + ': ' + p;",
    "    }",
    "  });",
    "}",
    "",
    "// ---- the header",
    "function renderSummary() {",
    "  var c = data.config;",
    "  byId('title').textContent = 'One sentence through ' + data.checkpoint;",
    "  document.title = data.sentence + ' — transformer.c explain';",
    "  var search = data.beam > 1",
    "      ? 'beam search, beam ' + data.beam + ', length penalty α ' + data.alpha",
    "      : 'greedy decoding';",
    "  byId('summary').textContent = '“' + data.sentence + '” → “' +",
    "      data.output.text + '”. The model: N = ' + c.layers + ' layers, d_model ' +",
    "      c.d_model + ', h = ' + c.heads + ' heads, d_ff ' + c.d_ff + ', a vocabulary of ' +",
    "      c.vocab + (c.merges ? ' (' + c.merges + ' §5.1 merges)' : ' (whole words)') +",
    "      ', ' + c.positional + ' positions up to ' + c.max_len + '. ' + search +",
    "      ', as ./transformer decode does. Attention probabilities are rounded to 4 decimals, ' +",
    "      'the other numbers to 4 significant digits.';",
    "}",
    "",
    "// ---- 1. the words",
    "function renderWords() {",
    "  var cards = byId('words-cards');",
    "  byId('words-note').textContent = data.config.merges",
    "      ? 'Each word cut into subwords by the checkpoint’s merges, applied in the order ' +",
    "        'they were learned (the merge’s rank first); </w> ends a word. A piece the ' +",
    "        'vocabulary lacks is read as <unk> (red), as decode reads it.'",
    "      : 'Whole words: each is one token of the vocabulary, or <unk> (red) when it is ' +",
    "        'not in it.';",
    "  data.words.forEach(function (w) {",
    "    var card = add(cards, 'div', 'card');",
    "    add(card, 'div', 'word', w.text);",
    "    var tokens = add(card, 'div');",
    "    for (var k = 0; k < w.count; k++) {",
    "      var id = data.source[w.first + k];",
    "      chip(tokens, id, data.source_text[w.first + k], id === 3 ? 'unk' : '');",
    "    }",
    "    if (w.merges.length) {",
    "      var list = add(card, 'ol', 'merges');",
    "      w.merges.forEach(function (m) {",
    "        add(list, 'li', null, 'merge ' + m[0] + ': ' + m[1] + ' + ' + m[2] + ' → ' +",
    "            m[1] + m[2]);",
    "      });",
    "    }",
    "  });",
    "  var end = add(cards, 'div', 'card');",
    "  add(end, 'div', 'word', 'end of sentence');",
    "  chip(add(end, 'div'), 2, '</s>');",
    "}",
    "",
    "// ---- 2. the input",
    "function renderInput() {",
    "  var panels = byId('input-panels');",
    "  var C = data.config.d_model;",
    "  var parts = [['E[token] × √d_model', data.input.scaled],",
    "               ['PE(pos)', data.input.position], ['their sum', data.input.sum]];",
    "  var width = Math.max(1, Math.min(16, Math.floor(420 / C)));",
    "  parts.forEach(function (part) {",
    "    var m = largest(part[1]);",
    "    panels.appendChild(heatmap({",
    "      title: part[0], rows: S, cols: C, cellWidth: width, cellHeight: 14,",
    "      range: [-m, m], rowLabels: sourceLabels,",
    "      value: function (i, j) {",
    "        return part[1][i][j];",
    "      },",
    "      describe: function (i, j) {",
    "        return sourceLabels[i] + ' (position ' + i + '), dimension ' + j + ':\\n' +",
    "            'E × √d ' + number(data.input.scaled[i][j]) + ' + PE ' +",
    "            number(data.input.position[i][j]) + ' = ' + number(data.input.sum[i][j]);",
    "      }",
    "    }));",
    "  });",
    "}",
    "",
    "// ---- 3. the encoder",
    "function normChart(norms) {",
    "  var figure = make('figure');",
    "  add(figure, 'figcaption', null, '|output| per token');",
    "  var table = add(figure, 'table');",
    "  var m = largest([norms]);",
    "  norms.forEach(function (v, i) {",
    "    var row = add(table, 'tr');",
    "    add(row, 'td', null, sourceLabels[i]);",
    "    var bar = add(add(row, 'td'), 'span', 'bar');",
    "    bar.style.width = Math.round(80 * (v === null ? 0 : v) / m) + 'px';",
    "    add(row, 'td', 'num', number(v));",
    "  });",
    "  return figure;",
    "}",
    "",
    "function renderEncoder() {",
    "  var box = byId('encoder-layers');",
    "  data.encoder.forEach(function (layer, l) {",
    "    add(box, 'h3', null, 'Encoder layer ' + (l + 1) + ' of ' + L);",
    "    var panels = add(box, 'div', 'panels');",
    "    layer.attention.forEach(function (head, h) {",
    "      panels.appendChild(attention('head ' + (h + 1), S, S, function (i, j) {",
    "        return head[i][j];",
    "      }, sourceLabels, sourceLabels));",
    "    });",
    "    panels.appendChild(normChart(layer.norm));",
    "  });",
    "}",
    "",
    "// ---- 4. decoding",
    "function hypothesisText(tokens) {",
    "  return tokens.map(word).join(' ');",
    "}",
    "",
    "function statusText(status) {",
    "  if (status === 'ended') {",
    "    return 'finished (</s>)';",
    "  }",
    "  return status === 'cut' ? 'finished (length limit)' : 'alive';",
    "}",
    "",
    "function renderTop(view, step) {",
    "  add(view, 'h3', null, 'The next token: the ' + step.live[0].top.length +",
    "      ' most likely, by the softmax of the logits');",
    "  var columns = add(view, 'div', 'columns');",
    "  step.live.forEach(function (live, r) {",
    "    var table = add(columns, 'table');",
    "    var head = add(add(table, 'tr'), 'th');",
    "    head.colSpan = 3;",
    "    head.textContent = (step.live.length > 1 ? 'hypothesis ' + (r + 1) + ': ' : '') +",
    "        'after “' + hypothesisText([1].concat(live.tokens)) + '”' +",
    "        (r === step.path && step.live.length > 1 ? ' (the winner’s path)' : '');",
    "    live.top.forEach(function (entry) {",
    "      var chosen = step.kept.some(function (k) {",
    "        return k.parent === r && k.token === entry[0];",
    "      });",
    "      var row = add(table, 'tr', chosen ? 'chosen' : '');",
    "      add(row, 'td', null, word(entry[0]) + (chosen ? '  ✓' : ''));",
    "      add(add(row, 'td'), 'span', 'bar').style.width = Math.round(100 * entry[1]) + 'px';",
    "      add(row, 'td', 'num', number(entry[1], 3));",
    "    });",
    "  });",
    "}",
    "",
    "function renderHypotheses(view, step, t) {",
    "  add(view, 'h3', null, data.beam > 1",
    "      ? 'The hypotheses this step kept, best first, then those finished before'",
    "      : 'What the step chose');",
    "  var table = add(view, 'table');",
    "  var head = add(table, 'tr');",
    "  ['hypothesis', 'log P', 'score = log P / ((5 + |Y|) / 6)^α', 'state'].forEach(",
    "      function (text) {",
    "        add(head, 'th', null, text);",
    "      });",
    "  var rows = step.kept.map(function (k) {",
    "    return [k, ''];",
    "  });",
    "  for (var s = 0; s < t; s++) {",
    "    data.steps[s].kept.forEach(function (k) {",
    "      if (k.status !== 'alive') {",
    "        rows.push([k, ' at step ' + (s + 1)]);",
    "      }",
    "    });",
    "  }",
    "  rows.forEach(function (pair) {",
    "    var k = pair[0];",
    "    var winner = k.path && k.status !== 'alive';",
    "    var row = add(table, 'tr', winner ? 'winner' : k.path ? 'path' : '');",
    "    var tokens = k.tokens.map(word);",
    "    if (k.status === 'ended') {",
    "      tokens.push('</s>');",
    "    }",
    "    add(row, 'td', null, tokens.join(' '));",
    "    add(row, 'td', 'num', number(k.logp));",
    "    add(row, 'td', 'num', number(k.score));",
    "    add(row, 'td', null, statusText(k.status) + pair[1] + (winner ? ': the output' : '') +",
    "        (k.path && !winner ? ' (the winner’s path)' : ''));",
    "  });",
    "}",
    "",
    "function renderStepAttention(view, t) {",
    "  var step = data.steps[t];",
    "  if (!step.self) {",
    "    add(view, 'p', 'note', 'The output was finished at step ' + (data.output.step + 1) +",
    "        '; no hypothesis of this step is on its path, so no attention is drawn.');",
    "    return;",
    "  }",
    "  var read = ['<s>'].concat(data.output.tokens.slice(0, t).map(word));",
    "  var predicts = data.output.tokens.map(word).concat(['</s>']).slice(0, t + 1);",
    "  for (var l = 0; l < L; l++) {",
    "    add(view, 'h4', null, 'Decoder layer ' + (l + 1) + ': masked self-attention (rows: ' +",
    "        'the positions so far, this step’s outlined) and attention over the source');",
    "    var panels = add(view, 'div', 'panels');",
    "    for (var h = 0; h < NH; h++) {",
    "      panels.appendChild(attention('self, head ' + (h + 1), t + 1, t + 1,",
    "          selfGetter(l, h), read, read, t));",
    "    }",
    "    panels = add(view, 'div', 'panels');",
    "    for (var g = 0; g < NH; g++) {",
    "      panels.appendChild(attention('source, head ' + (g + 1), t + 1, S,",
    "          crossGetter(l, g), predicts, sourceLabels, t));",
    "    }",
    "  }",
    "}",
    "",
    "function selfGetter(l, h) {",
    "  return function (i, j) {",
    "    return j <= i ? data.steps[i].self[l][h][j] : null;",
    "  };",
    "}",
    "",
    "function crossGetter(l, h) {",
    "  return function (i, j) {",
    "    return data.steps[i].cross[l][h][j];",
    "  };",
    "}",
    "",
    "function renderStep(t) {",
    "  var step = data.steps[t];",
    "  var view = byId('step-view');",
    "  view.textContent = '';",
    "  byId('step').value = t;",
    "  byId('step-label').textContent = 'step ' + (t + 1) + ' of ' + data.steps.length +",
    "      ': position ' + t + ' predicts the token after it';",
    "  var shown = step.path >= 0 ? step.path : 0;",
    "  var read = add(view, 'p');",
    "  read.appendChild(document.createTextNode('The decoder reads '));",
    "  chip(read, 1, '<s>', t === 0 ? 'now' : '');",
    "  step.live[shown].tokens.forEach(function (id, i) {",
    "    chip(read, id, word(id), i + 1 === t ? 'now' : '');",
    "  });",
    "  read.appendChild(document.createTextNode(step.path >= 0 ? ' (on the winner’s path)' :",
    "      ' (hypothesis 1; the output had finished)'));",
    "  renderStepAttention(view, t);",
    "  renderTop(view, step);",
    "  renderHypotheses(view, step, t);",
    "}",
    "",
    "function renderDecoding() {",
    "  byId('decoding-note').textContent = (data.beam > 1",
    "      ? 'Beam search with ' + data.beam + ' beams: at each step every live hypothesis ' +",
    "        'proposes every token, and the best by summed log-probability are kept; one that ' +",
    "        'chooses </s> is finished and scored with GNMT’s length penalty. Each step’s ' +",
    "        'attention pictures are those of the hypothesis the step extends on the ' +",
    "        'winner’s path. '",
    "      : 'Greedy decoding: at each step the most likely token. ') +",
    "      'At most ' + data.limit + ' positions (source length + 50, §6.1). The attention ' +",
    "      'rows of a step were computed by transformer.c’s decoder fed the winner’s ' +",
    "      'tokens: position t of that pass is the step’s hypothesis on the winner’s path.';",
    "  var slider = byId('step');",
    "  slider.max = data.steps.length - 1;",
    "  slider.addEventListener('input', function () {",
    "    renderStep(Number(slider.value));",
    "  });",
    "  byId('step-back').addEventListener('click', function () {",
    "    renderStep(Math.max(0, Number(slider.value) - 1));",
    "  });",
    "  byId('step-on').addEventListener('click', function () {",
    "    renderStep(Math.min(data.steps.length - 1, Number(slider.value) + 1));",
    "  });",
    "  renderStep(0);",
    "}",
    "",
    "// ---- 5. the output and the alignment",
    "function renderOutput() {",
    "  var box = byId('output-text');",
    "  add(box, 'p', 'output-words', data.output.text);",
    "  var tokens = add(box, 'p');",
    "  data.output.tokens.forEach(function (id) {",
    "    chip(tokens, id, word(id), 'out-token');",
    "  });",
    "  if (data.output.ended) {",
    "    chip(tokens, 2, '</s>');",
    "  }",
    "  add(box, 'p', 'note', 'score ' + number(data.output.score) + (data.output.ended",
    "      ? '' : ' (cut at the length limit, without </s>)'));",
    "  var rows = data.output.step + 1;",
    "  var predicts = data.output.tokens.map(word).concat(['</s>']).slice(0, rows);",
    "  byId('alignment-note').textContent = 'The alignment: the last decoder layer’s ' +",
    "      'attention over the source, every head and their mean; row t is the step that ' +",
    "      'wrote that output token (compare the paper’s Figures 3 to 5).';",
    "  var panels = byId('output-panels');",
    "  var last = L - 1;",
    "  for (var h = 0; h < NH; h++) {",
    "    panels.appendChild(attention('head ' + (h + 1), rows, S, crossGetter(last, h), predicts,",
    "        sourceLabels));",
    "  }",
    "  panels.appendChild(attention('mean of the ' + NH + ' heads', rows, S, function (i, j) {",
    "    var sum = 0;",
    "    for (var g = 0; g < NH; g++) {",
    "      sum += data.steps[i].cross[last][g][j];",
    "    }",
    "    return sum / NH;",
    "  }, predicts, sourceLabels));",
    "}",
    "",
    "renderSummary();",
    "renderWords();",
    "renderInput();",
    "renderEncoder();",
    "renderDecoding();",
    "renderOutput();",
    "var done = make('p', 'note', 'rendered');",
    "done.id = 'explain-rendered';",
    "document.querySelector('main').appendChild(done);",
    "// explain.html#decoding: the browser looked for the section before it was drawn;",
    "// explain.html#step-3: the decoding at step 3",
    "var asked = /^#step-([0-9]+)$/.exec(location.hash);",
    "if (asked) {",
    "  renderStep(Math.max(0, Math.min(data.steps.length, Number(asked[1])) - 1));",
    "}",
    "var target = asked ? byId('decoding') : location.hash ? byId(location.hash.slice(1)) : null;",
    "if (target) {",
    "  target.scrollIntoView();",
    "}",
    "})();",
    "</script>",
    "</body>",
    "</html>",
    NULL,
};


// ---- the page: the template around the numbers as JSON ----------------------------------

// Text as a JSON string that cannot end the <script> element it sits in: the HTML parser ends
// a script at the first "</script" and reads "<!--" specially, whatever JSON thinks of them,
// so every '<' is written \u003c (and '>' and '&' too); U+2028 and U+2029 are escaped (line
// ends to JavaScript before ES2019), control characters too. A byte that is not UTF-8 (a
// checkpoint's vocabulary is not checked for it) becomes U+FFFD.
static void json_string(FILE *f, const char *text) {
    const unsigned char *s = (const unsigned char *)text;
    fputc('"', f);
    while (*s) {
        int n = utf8_sequence_length(s);
        int separator = n == 3 && s[0] == 0xE2 && s[1] == 0x80 && (s[2] == 0xA8 || s[2] == 0xA9);
        if (n == 0)
            fputs("\\ufffd", f);
        else if (separator)
            fprintf(f, "\\u%04x", s[2] == 0xA8 ? 0x2028 : 0x2029);
        else if (n > 1)
            fwrite(s, 1, (size_t)n, f);
        else if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if (*s < 0x20 || *s == 0x7F || *s == '<' || *s == '>' || *s == '&')
            fprintf(f, "\\u%04x", *s);
        else
            fputc(*s, f);
        s += n ? n : 1;
    }
    fputc('"', f);
}

// A number to 4 significant digits; JSON has no NaN or infinity: null.
static void json_number(FILE *f, double v) {
    if (isfinite(v))
        fprintf(f, "%.4g", v);
    else
        fputs("null", f);
}

static void json_numbers(FILE *f, const real *v, size_t n) {
    fputc('[', f);
    for (size_t i = 0; i < n; i++) {
        if (i)
            fputc(',', f);
        json_number(f, v[i]);
    }
    fputc(']', f);
}

// Probabilities as integers in 1/EXPLAIN_UNITS (4 decimals, in about half the bytes of 0.1234).
static void json_probabilities(FILE *f, const real *p, size_t n) {
    fputc('[', f);
    for (size_t i = 0; i < n; i++) {
        if (i)
            fputc(',', f);
        if (isfinite(p[i]))
            fprintf(f, "%ld", lround((double)p[i] * EXPLAIN_UNITS));
        else
            fputs("null", f);
    }
    fputc(']', f);
}

static void json_ids(FILE *f, const int *ids, int n) {
    fputc('[', f);
    for (int i = 0; i < n; i++) fprintf(f, i ? ",%d" : "%d", ids[i]);
    fputc(']', f);
}

// rows matrices of n probabilities each, as a JSON array of arrays.
static void json_probability_rows(FILE *f, const real *p, size_t rows, size_t n) {
    fputc('[', f);
    for (size_t r = 0; r < rows; r++) {
        if (r)
            fputc(',', f);
        json_probabilities(f, p + r * n, n);
    }
    fputc(']', f);
}

static void json_number_rows(FILE *f, const real *v, size_t rows, size_t n) {
    fputc('[', f);
    for (size_t r = 0; r < rows; r++) {
        if (r)
            fputs(",\n", f);
        json_numbers(f, v + r * n, n);
    }
    fputc(']', f);
}

// What the page is made of: the explanation, and the model and text it came from.
typedef struct {
    const Explanation *x;
    const Transformer *model;
    const Vocabulary *vocab;
    const Bpe *merges;
    const char *checkpoint;   // its path, as given
    const char *sentence;
} ExplainPage;

// "vocab": the text of every id the page names (source, hypotheses, next tokens, output).
static void json_vocabulary(FILE *f, const ExplainPage *page) {
    const Explanation *x = page->x;
    int V = page->model->config.vocab_size;
    char *used = checked_calloc((size_t)V, 1, "page vocabulary");
    used[TOKEN_BOS] = used[TOKEN_EOS] = used[TOKEN_UNK] = 1;
    for (int i = 0; i < x->S; i++) used[x->src[i]] = 1;
    for (int i = 0; i < x->out_len; i++) used[x->out[i]] = 1;
    for (int t = 0; t < x->num_steps; t++) {
        const ExplainStep *step = &x->steps[t];
        for (int i = 0; i < step->live * EXPLAIN_TOP; i++) {
            if (step->top_ids[i] >= 0)
                used[step->top_ids[i]] = 1;
        }
        for (int k = 0; k < step->num_kept; k++) {
            for (int i = 0; i < step->kept[k].length; i++) used[step->kept[k].tokens[i]] = 1;
        }
    }
    fputs("\"vocab\":{", f);
    int first = 1;
    for (int id = 0; id < V; id++) {
        if (!used[id])
            continue;
        fprintf(f, first ? "\"%d\":" : ",\"%d\":", id);
        json_string(f, page->vocab->words[id]);
        first = 0;
    }
    fputs("},\n", f);
    free(used);
}

static void json_words(FILE *f, const ExplainPage *page) {
    const Explanation *x = page->x;
    fputs("\"source\":", f);
    json_ids(f, x->src, x->S);
    fputs(",\n\"source_text\":[", f);
    for (int i = 0; i < x->S; i++) {
        if (i)
            fputc(',', f);
        json_string(f, x->token_text[i]);
    }
    fputs("],\n\"words\":[", f);
    for (int w = 0; w < x->num_words; w++) {
        const ExplainWord *word = &x->words[w];
        fputs(w ? ",\n{\"text\":" : "{\"text\":", f);
        json_string(f, word->text);
        fprintf(f, ",\"first\":%d,\"count\":%d,\"merges\":[", word->first, word->count);
        for (int k = 0; k < word->num_merges; k++) {
            int rank = word->merge_rank[k];
            fprintf(f, k ? ",[%d," : "[%d,", rank);
            json_string(f, page->merges->left[rank]);
            fputc(',', f);
            json_string(f, page->merges->right[rank]);
            fprintf(f, ",%d]", word->merge_subword[k]);
        }
        fputs("]}", f);
    }
    fputs("],\n", f);
}

static void json_encoder(FILE *f, const ExplainPage *page) {
    const Explanation *x = page->x;
    size_t C = page->model->config.d_model;
    size_t L = page->model->config.n_layers;
    size_t NH = page->model->config.n_heads;
    size_t S = x->S;
    fputs("\"input\":{\"scaled\":", f);
    json_number_rows(f, x->scaled, S, C);
    fputs(",\n\"position\":", f);
    json_number_rows(f, x->position, S, C);
    fputs(",\n\"sum\":", f);
    json_number_rows(f, x->input, S, C);
    fputs("},\n\"encoder\":[", f);
    for (size_t l = 0; l < L; l++) {
        fputs(l ? ",\n{\"attention\":[" : "{\"attention\":[", f);
        for (size_t h = 0; h < NH; h++) {
            if (h)
                fputs(",\n", f);
            json_probability_rows(f, x->enc_att + (l * NH + h) * S * S, S, S);
        }
        fputs("],\"norm\":", f);
        json_numbers(f, x->enc_norm + l * S, S);
        fputc('}', f);
    }
    fputs("],\n", f);
}

static const char *explain_status_name(HypothesisStatus status) {
    return status == HYPOTHESIS_ENDED ? "ended" : status == HYPOTHESIS_CUT ? "cut" : "alive";
}

static void json_step(FILE *f, const ExplainPage *page, int t) {
    const ExplainStep *step = &page->x->steps[t];
    size_t L = page->model->config.n_layers;
    size_t NH = page->model->config.n_heads;
    fputs("{\"live\":[", f);
    for (int r = 0; r < step->live; r++) {
        fputs(r ? ",{\"tokens\":" : "{\"tokens\":", f);
        json_ids(f, step->live_tokens + (size_t)r * t, t);
        fputs(",\"logp\":", f);
        json_number(f, step->live_log_p[r]);
        fputs(",\"top\":[", f);
        for (int i = 0; i < EXPLAIN_TOP && step->top_ids[r * EXPLAIN_TOP + i] >= 0; i++) {
            fprintf(f, i ? ",[%d," : "[%d,", step->top_ids[r * EXPLAIN_TOP + i]);
            json_number(f, step->top_p[r * EXPLAIN_TOP + i]);
            fputc(']', f);
        }
        fputs("]}", f);
    }
    fprintf(f, "],\"path\":%d,\"kept\":[", step->path_row);
    for (int k = 0; k < step->num_kept; k++) {
        const ExplainHypothesis *h = &step->kept[k];
        fputs(k ? ",{\"tokens\":" : "{\"tokens\":", f);
        json_ids(f, h->tokens, h->length);
        fprintf(f, ",\"parent\":%d,\"token\":%d,\"logp\":", h->parent, h->token);
        json_number(f, h->log_p);
        fputs(",\"score\":", f);
        json_number(f, h->score);
        fprintf(f, ",\"status\":\"%s\",\"path\":%d}", explain_status_name(h->status), h->on_path);
    }
    fputc(']', f);
    if (step->self_att) {
        fputs(",\n\"self\":[", f);
        for (size_t l = 0; l < L; l++) {
            fputs(l ? "," : "", f);
            json_probability_rows(f, step->self_att + l * NH * (t + 1), NH, (size_t)t + 1);
        }
        fputs("],\n\"cross\":[", f);
        for (size_t l = 0; l < L; l++) {
            fputs(l ? "," : "", f);
            json_probability_rows(f, step->cross_att + l * NH * page->x->S, NH,
                                  (size_t)page->x->S);
        }
        fputc(']', f);
    }
    fputc('}', f);
}

// The numbers of the page, one JSON object (lab/NOTES.md describes its fields).
static void explain_json(FILE *f, const ExplainPage *page) {
    const Explanation *x = page->x;
    const TransformerConfig *config = &page->model->config;
    fputs("{\"checkpoint\":", f);
    json_string(f, page->checkpoint);
    fputs(",\n\"sentence\":", f);
    json_string(f, page->sentence);
    fprintf(f, ",\n\"config\":{\"layers\":%d,\"d_model\":%d,\"heads\":%d,\"d_ff\":%d,"
               "\"vocab\":%d,\"max_len\":%d,\"positional\":\"%s\",\"merges\":%d},\n",
            config->n_layers, config->d_model, config->n_heads, config->d_ff,
            config->vocab_size, config->max_len, positional_name(config->positional),
            page->merges ? page->merges->num_merges : 0);
    fprintf(f, "\"beam\":%d,\"alpha\":", x->beam);
    json_number(f, x->alpha);
    fprintf(f, ",\"limit\":%d,\n", transformer_decode_limit(page->model, x->S));
    json_vocabulary(f, page);
    json_words(f, page);
    json_encoder(f, page);
    fputs("\"steps\":[", f);
    for (int t = 0; t < x->num_steps; t++) {
        fputs(t ? ",\n" : "", f);
        json_step(f, page, t);
    }
    fputs("],\n\"output\":{\"tokens\":", f);
    json_ids(f, x->out, x->out_len);
    fputs(",\"text\":", f);
    char *text = tokens_to_text(page->vocab, page->merges, x->out, x->out_len);
    json_string(f, text);
    free(text);
    fputs(",\"score\":", f);
    json_number(f, x->score);
    fprintf(f, ",\"step\":%d,\"ended\":%s}}\n", x->winner_step,
            x->winner_ended ? "true" : "false");
}

static void explain_template(FILE *f, const char *const *lines) {
    for (int i = 0; lines[i]; i++) {
        fputs(lines[i], f);
        fputc('\n', f);
    }
}

// The page: the template's head and sections, the numbers, the script that draws them.
static void explain_write_page(FILE *f, const ExplainPage *page) {
    explain_template(f, explain_page_top);
    fputs("<script type=\"application/json\" id=\"explain-data\">\n", f);
    explain_json(f, page);
    fputs("</script>\n", f);
    explain_template(f, explain_page_script);
}

// ---- explain ---------------------------------------------------------------------------

typedef struct {
    const char *checkpoint;
    const char *out;
    int beam;
    double alpha;   // beam search's length penalty (§6.1)
    int force;
    int threads;
} ExplainOptions;

// Does the file at path begin as a page explain writes (its mark in the first lines)?
static int explain_page_of_ours(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    char head[512];
    size_t n = fread(head, 1, sizeof head - 1, f);
    fclose(f);
    head[n] = '\0';
    return strstr(head, EXPLAIN_PAGE_MARK) != NULL;
}

// A file at --out is replaced when it is a page of ours, or with --force; never a directory
// or a device.
static const char *explain_check_out(const char *path, int force) {
    struct stat st;
    if (!*path)
        return "--out '': expected a file's path (the page to write)";
    if (stat(path, &st) != 0)
        return NULL;
    if (!S_ISREG(st.st_mode))
        return errorf("--out %s: not a regular file; expected the path of the page to write",
                      path);
    if (force || explain_page_of_ours(path))
        return NULL;
    return errorf("--out %s is already there and is not a page explain wrote; expected --force "
                  "to replace it, or another --out", path);
}

// Writes the page to PATH.tmp, then renames it to PATH: a page is whole or not there. The
// temporary file was opened before the decoding (tmp), so an --out that cannot be written
// stops the command before its work.
static const char *explain_finish_page(FILE *tmp, const char *tmp_path, const char *path,
                                       const ExplainPage *page) {
    errno = 0;
    explain_write_page(tmp, page);
    int failed = fflush(tmp) != 0 || ferror(tmp);
    const char *reason = errno ? strerror(errno) : "a write failed";
    failed |= fclose(tmp) != 0;
    if (!failed && rename(tmp_path, path) == 0)
        return NULL;
    if (!failed)
        reason = strerror(errno);
    remove(tmp_path);
    return errorf("--out %s: the page was not written: %s", path, reason);
}

static const char *explain_usage =
    "usage: ./transformer explain --checkpoint FILE [--beam 4] [--alpha 0.6] [--out PAGE.html]\n"
    "                             [--force] \"SENTENCE\"\n"
    "Decodes the sentence as decode does (the same tokens, beam and length penalty) and writes\n"
    "one self-contained HTML page (its CSS, JavaScript and numbers inline; nothing fetched) that\n"
    "shows it going through the model, in Figure 1's order: the words, their §5.1 subwords and\n"
    "the merges that made them, the ids; each token's embedding x sqrt(d_model), positional\n"
    "encoding and their sum; every encoder layer's attention heads; each decoding step's\n"
    "attention, 10 most likely next tokens and (beam search) hypotheses; the output and its\n"
    "cross-attention. Without SENTENCE, the one line of standard input (a sentence that begins\n"
    "with '-'). --out is explain.html unless given; a file there that is not a page explain\n"
    "wrote is replaced only with --force.";

// With no sentence on the command line, the one line of standard input: a sentence that
// begins with '-' (the command line would take it for a flag) comes this way, as decode reads
// its lines. Not from a terminal, where a user who forgot the sentence would wait. The line is
// checked as decode checks a line (UTF-8, no zero byte, the byte-order mark dropped).
static const char *explain_read_stdin(char **line) {
    if (isatty(STDIN_FILENO))
        return "expected one sentence (in quotes) after the flags, or on standard input";
    size_t capacity = 0;
    ssize_t length = getline(line, &capacity, stdin);
    if (length < 0 && ferror(stdin))
        return errorf("stdin: read error: %s", strerror(errno));
    if (length < 0)
        return "no sentence: expected one (in quotes) after the flags, or a line on standard "
               "input";
    while (length > 0 && ((*line)[length - 1] == '\n' || (*line)[length - 1] == '\r'))
        (*line)[--length] = '\0';
    if (strlen(*line) != (size_t)length)
        return "stdin:1: a zero byte; expected text";
    char *more = NULL;
    size_t more_capacity = 0;
    ssize_t next = getline(&more, &more_capacity, stdin);
    free(more);
    if (next >= 0)
        return "standard input has more than one line; expected one sentence (a page explains "
               "one)";
    return lab_check_text(*line, "stdin:1", 1);
}

// The explanation of one sentence, written to o->out; NULL or the error. from: where the
// sentence came from, for the warnings of words read as <unk>.
static const char *explain_command_run(LabCheckpoint *c, char *sentence, TextSource *from,
                                       const ExplainOptions *o) {
    Explanation x;
    memset(&x, 0, sizeof x);
    const char *error = explain_sentence(&x, c, sentence, from);
    char *tmp_path = checked_calloc(strlen(o->out) + 5, 1, "paths");
    snprintf(tmp_path, strlen(o->out) + 5, "%s.tmp", o->out);
    FILE *tmp = error ? NULL : fopen(tmp_path, "w");
    if (!error && !tmp)
        error = errorf("--out %s: cannot write %s: %s", o->out, tmp_path, strerror(errno));
    if (!error) {
        explain_decode(&x, &c->model, o->beam, o->alpha);
        ExplainPage page = { &x, &c->model, &c->vocab, c->merges, o->checkpoint, sentence };
        error = explain_finish_page(tmp, tmp_path, o->out, &page);
    }
    if (!error) {
        printf("output: ");
        print_text(stdout, &c->vocab, c->merges, x.out, x.out_len);
        printf("\nwrote %s: open it in a browser\n", o->out);
    }
    free(tmp_path);
    explain_free(&x);
    return error;
}

static int command_explain(int argc, char **argv) {
    ExplainOptions o = { NULL, EXPLAIN_DEFAULT_OUT, 1, 0.6, 0, 0 };
    Option options[] = {
        TEXT_OPTION("--checkpoint", &o.checkpoint, "the trained model (required)"),
        INT_OPTION("--beam", &o.beam, 1, 1000,
                   "beam size; 1 is greedy decoding (the paper used 4)"),
        NUMBER_OPTION("--alpha", &o.alpha, 0, 100, 0,
                      "length penalty ((5+len)/6)^alpha of beam search (§6.1)"),
        TEXT_OPTION("--out", &o.out, "the page to write"),
        FLAG_OPTION("--force", &o.force,
                    "replace a file at --out that is not a page explain wrote"),
        INT_OPTION("--threads", &o.threads, 0, 1024, "OpenMP threads (0: all cores)"),
    };
    char **sentences = checked_calloc(argc, sizeof(char *), "arguments");
    int n = 0;
    int status = parse_options("explain", explain_usage, options,
                               (int)(sizeof options / sizeof *options), argc, argv, sentences,
                               &n);
    if (status) {
        free(sentences);
        return status == 2 ? 0 : 1;
    }
    set_threads(o.threads);
    const char *error = NULL;
    char *line = NULL;
    TextSource from = { "the sentence", 0, 0, NULL };
    if (!o.checkpoint)
        error = "--checkpoint FILE is required (a model written by ./transformer train)";
    else if (n > 1)
        error = errorf("expected one sentence (in quotes) after the flags; got %d", n);
    else if (n == 1)
        error = lab_check_text(sentences[0], from.where, 0);
    else
        error = explain_read_stdin(&line);
    if (!error && n == 0)
        snprintf(from.where, sizeof from.where, "stdin:1");
    if (!error)
        error = explain_check_out(o.out, o.force);
    LabCheckpoint c;
    memset(&c, 0, sizeof c);
    if (!error)
        error = lab_checkpoint_load(o.checkpoint, &c);
    if (!error)
        error = explain_command_run(&c, n == 1 ? sentences[0] : line, &from, &o);
    lab_checkpoint_free(&c);
    if (error)
        fprintf(stderr, "error: explain: %s\n", error);
    free(line);
    free(sentences);
    return error ? 1 : 0;
}
