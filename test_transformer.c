/* test_transformer.c: the proofs that transformer.c computes what the paper says
 *
 * transformer.c alone, as `cc transformer.c` builds it: Part I's loops and
 * Part II's program. Built three ways by `make test`, and all run:
 *   test_transformer_f64     (-DTRANSFORMER_DOUBLE) first the finite-difference
 *                            gradient checks of every layer and of every
 *                            parameter tensor of the whole model, in double;
 *   test_transformer         (float, as users run it)
 *   test_transformer_serial  (float, without OpenMP)
 * and in each, Part I (run_model_tests): the PyTorch reference files, masks,
 * Adam, the schedule, dropout, thread determinism, learning, §3.5's
 * positional encoding and a 2x2 attention worked by hand, BLEU, decoding;
 * then Part II (run_program_tests): TSV data, the tasks and their batches,
 * checkpoints, and the command line, run as a user runs it: the binary
 * TRANSFORMER_BIN names (make test: ./transformer_minimal, transformer.c
 * alone), and make debug's binary walked in gdb where TRANSFORMER_DEBUG_BIN
 * names it and gdb is on the PATH (make test: in test_transformer_serial).
 * Each ends with the line "N passed, M failed" and exits non-zero on a failure.
 *
 * Beside it, lab/test_lab.c includes this file (-DTEST_TRANSFORMER_LIBRARY:
 * no main, transformer.c already there with the lab) and runs
 * run_model_tests again through the fast path, and run_command_line_tests
 * through ./transformer, before the lab's own tests; cuda/test_cuda.c uses
 * check() and the reference comparison for the CUDA companion.
 *
 *   ./test_transformer --reference tiny_data/ref_2layer_5head.ref
 * checks one PyTorch reference file and prints, per tensor, the largest
 * absolute and relative difference.
 */

/* INDEX: each function of transformer.c -> the tests that prove it, by the
 * name of their function below. FD: finite differences (run_gradient_checks,
 * the double builds). MODEL: the whole model, which runs every layer:
 * test_model_gradients (FD of every parameter tensor, sinusoids and learned
 * positions) and test_reference_file (PyTorch's logits, loss, every gradient
 * and the Adam steps; every build), with test_reference_catches_wrong_weights
 * (a 1e-3 move of one weight in any tensor or q, k, v block fails them).
 * (lab/test_lab.c runs the same tests with the fast path plugged in, and
 * proves the fast path against these loops: its own index.)
 *
 * PART I, the model (run_model_tests)
 *   §3     linear_forward, _backward        test_linear_gradients (FD); MODEL
 *   §3.1   dropout_mask                     test_dropout_training_and_evaluation (off in
 *                                           evaluation, redrawn each pass, P_drop 0.5 drops about
 *                                           half); test_thread_determinism (1 and 3 threads, bit
 *                                           for bit); test_add_norm_gradients (as the residual's
 *                                           mask)
 *          dropout_forward, _backward       test_model_gradients with P_drop 0.3 (FD of the whole
 *                                           model, the same masks in every evaluation);
 *                                           test_thread_determinism (dropout on)
 *          layernorm_row_forward,           test_add_norm_gradients (FD, with a dropout mask);
 *                                           MODEL
 *          residual_layernorm_forward, _backward
 *   §3.2.1 visible_keys                     test_attention_by_hand (padding and causal masks give
 *                                           exact 1 and 0); test_attention_gradients; test_masks (a
 *                                           padded or later token moves no logit it must not)
 *          softmax_visible                  test_softmax_visible; test_attention_by_hand
 *          softmax_backward                 test_attention_by_hand, test_attention_gradients (in
 *                                           attention_backward)
 *          attention_forward, _backward     test_attention_by_hand (2 queries x 2 keys by hand,
 *                                           both masks, one query per sentence);
 *                                           test_attention_gradients (FD: causal, fused q|k|v,
 *                                           padded keys get exactly 0); MODEL
 *   §3.2.2 self_attention_*, cross_attention_*, memory_keys_values_*     MODEL; test_masks;
 *                                           test_attention_by_hand (the fused layout, then W^O,
 *                                           b^O)
 *   §3.3   relu_*, feed_forward_*           test_feed_forward_gradients (FD, ReLU inputs off the
 *                                           kink); MODEL
 *   §3.4   embedding_forward, _backward     test_embedding_gradients (FD, a token 3 times: rows
 *                                           add); MODEL
 *   §3.5   positional_encoding_init         test_positional_encoding_formula (sin, cos; d_model 8
 *                                           by hand, odd 7, 512), test_positional_encoding_rotation
 *                                           (PE(pos+k) = M_k PE(pos))
 *          position_embedding_backward      test_model_gradients(POSITIONAL_LEARNED, 0) (FD; unused
 *                                           rows get 0); test_reference_file
 *                                           (ref_learned_positions.ref)
 *   §5.4   cross_entropy_forward, _backward test_loss_gradients (FD, smoothing, padding; uniform
 *                                           logits: log V); MODEL
 *   §3.1   add_norm_forward, encoder_layer_*, decoder_layer_*, embed_*      MODEL; test_masks
 *          transformer_forward, _zero_grad, _backward    MODEL; test_learning (300 steps fit a
 *                                           batch); test_thread_determinism; test_masks
 *   §5.3   transformer_learning_rate        test_schedule (eq. 3 by hand); test_reference_file (the
 *                                           Adam steps)
 *          adam_update                      test_adam_by_hand (two steps by hand);
 *                                           test_reference_file, test_reference_catches_wrong_adam
 *                                           (lr 1%, beta1, beta2 caught)
 *   §5     transformer_train_step           test_reference_file, test_reference_catches_wrong_*
 *                                           (the step PyTorch's files are compared through;
 *                                           cuda/test_cuda.c: the CUDA companion's)
 *   §6.1   decoder_begin, _step, _reorder, _end    test_decoder_logits (the full pass's logits, bit
 *                                           for bit; lab/test_lab.c: the fast path's key/value
 *                                           cache gives the same)
 *          greedy decoding (a beam of one), transformer_decode_limit    test_decoding
 *                                           (= the whole model re-run, the trained model copies;
 *                                           the lab's batched greedy decoder: lab/test_lab.c)
 *          transformer_beam_search, beam_propose, candidate_*, beam_finish,
 *          length_penalty                   test_decoding (beam 1 = greedy, beam 4 copies);
 *                                           test_beam_search_is_exhaustive_when_wide (the
 *                                           enumerated best); test_length_penalty_by_hand (GNMT's
 *                                           formula, </s> counted)
 *          machinery                        test_config_checks (transformer_config_check,
 *                                           transformer_build); test_parameter_counts
 *                                           (parameter_sizes, by hand); test_aligned_memory
 *                                           (arenas: every activation and gradient tensor on a
 *                                           line); test_tasks_and_batches (batch_check)
 *
 * PART II, the program for the toy tasks (run_program_tests; real text, BLEU and eval are the
 * lab's: lab/test_lab.c)
 *   tokenize, the vocabulary                test_command_line (decode with a checkpoint; its tokens
 *                                           read back); test_decode_streams (reserved tokens, a
 *                                           sentence too long)
 *   task_generate, epoch_plan_make, batch_fill    test_tasks_and_batches (held-out pairs unseen,
 *                                           every pair once an epoch, the token budget, the batch's
 *                                           layout)
 *   evaluate                                test_command_line (the held-out exact match of a run)
 *   checkpoint_save, checkpoint_load        test_checkpoint_round_trip (bit for bit; truncated,
 *                                           foreign and damaged files, header counts, a NaN weight;
 *                                           a failed save keeps the old file);
 *                                           test_checkpoint_counts;
 *                                           test_learned_positions_checkpoint; test_command_line
 *   nonfinite_parameter, train_save         test_nonfinite_parameter; test_command_line (a NaN loss
 *                                           keeps the last good checkpoint)
 *   train                                   test_command_line (flags and their errors, --seed
 *                                           repeats a run byte for byte);
 *                                           test_minimal_overwrite_rule (only a checkpoint of ours
 *                                           is replaced); test_out_of_memory; test_minimal_program
 *   decode (decode_sentence)                test_command_line, test_decode_streams (decoding goes
 *                                           on past a sentence it cannot take)
 *   transformer_main, commands              test_command_line (an unknown command),
 *                                           test_minimal_program, test_evaluation_commands (eval
 *                                           and --train are the lab's), test_output_write_error
 *                                           (output onto a full disk)
 *   make debug: transformer_debug in gdb    test_debugger_walk
 */
// (lab/test_lab.c and cuda/test_cuda.c include these tests after the lab)
#ifndef TEST_TRANSFORMER_LIBRARY
#define TRANSFORMER_NO_MAIN
#include "transformer.c"   // transformer.c alone, as `cc transformer.c` builds it
#endif
#include <fcntl.h>      // open (lab/test_lab.c and cuda/test_cuda.c capture output with it)
#include <unistd.h>     // access, dup, dup2, getpid

static int tests_passed = 0, tests_failed = 0;

// Records one check; a failure prints FAIL and what was measured.
static void check(int ok, const char *format, ...) {
    va_list args;
    va_start(args, format);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(format, args);
    printf("\n");
    va_end(args);
    if (ok)
        tests_passed++;
    else
        tests_failed++;
    fflush(stdout);
}

// Tiny models that run thousands of passes (the finite differences) or
// hundreds of steps (learning, the trained copy models) run them on one
// thread: their results do not depend on the thread count
// (test_thread_determinism proves it), and a second thread would only make
// each of a pass's loops wait for it, for milliseconds each on a machine busy
// with other programs. Returns the thread count to give back to set_threads.
#ifndef TEST_TRANSFORMER_LIBRARY   // (the lab has its own: lab/lab.c)
static int thread_count(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static void set_threads(int threads) {
#ifdef _OPENMP
    omp_set_num_threads(threads);
#else
    (void)threads;
#endif
}
#endif

static int one_thread(void) {
    int threads = thread_count();
    set_threads(1);
    return threads;
}

// A batch with padding on both sides: B sentences with the given lengths,
// random word tokens, tgt_in = <s> y.., tgt_out = ..y </s>.
typedef struct {
    Batch batch;
    int src[64 * 64], src_len[64], tgt_in[64 * 64], tgt_out[64 * 64], tgt_len[64];
} TestBatch;

static void make_test_batch(TestBatch *tb, int B, int S, int T, const int *src_len,
                            const int *tgt_len, int vocab, Rng *rng) {
    memset(tb, 0, sizeof *tb);
    tb->batch = (Batch){ B, S, T, tb->src, tb->src_len, tb->tgt_in, tb->tgt_out, tb->tgt_len };
    for (int b = 0; b < B; b++) {
        tb->src_len[b] = src_len[b];
        tb->tgt_len[b] = tgt_len[b];
        for (int s = 0; s < src_len[b]; s++)
            tb->src[b * S + s] = NUM_SPECIAL_TOKENS + rng_below(rng, vocab - NUM_SPECIAL_TOKENS);
        int previous = TOKEN_BOS;
        for (int t = 0; t < tgt_len[b]; t++) {
            int word = t == tgt_len[b] - 1 ? TOKEN_EOS
                     : NUM_SPECIAL_TOKENS + rng_below(rng, vocab - NUM_SPECIAL_TOKENS);
            tb->tgt_in[b * T + t] = previous;
            tb->tgt_out[b * T + t] = word;
            previous = word;
        }
    }
}

#ifdef TRANSFORMER_DOUBLE
// ============================================================================
// Finite-difference gradient checks (double precision)
//
// For a scalar objective f and the analytic gradient g, each element x_i is
// checked against the five-point central difference
//     (-f(x+2h) + 8 f(x+h) - 8 f(x-h) + f(x-2h)) / 12h,   h = 1e-4,
// whose truncation error is about h^4 f^(5) / 30 ~ 1e-17 and whose rounding
// error is about 1.5e-16 |f| / h ~ 1e-11. The error measure is
//     |g_i - numeric_i| / max(|g_i|, |numeric_i|, GRAD_FLOOR)
// so elements near zero are held to an absolute 1e-10 rather than to a
// relative error that rounding alone would blow up. Tolerance: 1e-6.
// ============================================================================

static void fill_uniform(real *x, size_t n, double lo, double hi, Rng *rng) {
    for (size_t i = 0; i < n; i++) x[i] = (real)(lo + (hi - lo) * rng_uniform(rng));
}

static double dot_product(const real *a, const real *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

#define FD_STEP 1e-4
#define GRAD_FLOOR 1e-4
#define GRAD_TOLERANCE 1e-6

typedef double (*Objective)(void *context);

static double gradient_error(Objective f, void *context, real *x, const real *grad, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        real saved = x[i];
        double value[4], offsets[4] = { 2, 1, -1, -2 };
        for (int k = 0; k < 4; k++) {
            x[i] = (real)(saved + offsets[k] * FD_STEP);
            value[k] = f(context);
        }
        x[i] = saved;
        double numeric = (-value[0] + 8 * value[1] - 8 * value[2] + value[3]) / (12 * FD_STEP);
        double analytic = grad[i];
        double scale = fmax(fmax(fabs(numeric), fabs(analytic)), GRAD_FLOOR);
        double err = fabs(numeric - analytic) / scale;
        if (err > worst)
            worst = err;
    }
    return worst;
}

static void check_gradient(const char *name, Objective f, void *context, real *x, const real *grad,
                           size_t n) {
    double err = gradient_error(f, context, x, grad, n);
    check(err < GRAD_TOLERANCE, "gradient %-28s %6zu elements, max rel error %.2e", name, n, err);
}

// ---- linear ----------------------------------------------------------------
typedef struct {
    int N, IC, OC;
    real *out, *inp, *w, *b, *r;
} LinearCase;
static double linear_objective(void *p) {
    LinearCase *c = p;
    linear_forward(c->out, c->inp, c->w, c->b, c->N, c->IC, c->OC);
    return dot_product(c->out, c->r, (size_t)c->N * c->OC);
}
static void test_linear_gradients(Rng *rng) {
    LinearCase c = { 5, 7, 6, 0, 0, 0, 0, 0 };
    size_t ni = 35, nw = 42, no = 30;
    real buf[35 + 42 + 6 + 30 + 30], grads[35 + 42 + 6];
    c.inp = buf;
    c.w = buf + ni;
    c.b = c.w + nw;
    c.r = c.b + 6;
    c.out = c.r + no;
    fill_uniform(buf, ni + nw + 6 + no, -1, 1, rng);
    memset(grads, 0, sizeof grads);
    linear_forward(c.out, c.inp, c.w, c.b, c.N, c.IC, c.OC);
    linear_backward(grads, grads + ni, grads + ni + nw, c.r, c.inp, c.w, c.N, c.IC, c.OC);
    check_gradient("linear: input", linear_objective, &c, c.inp, grads, ni);
    check_gradient("linear: weight", linear_objective, &c, c.w, grads + ni, nw);
    check_gradient("linear: bias", linear_objective, &c, c.b, grads + ni + nw, 6);
}

// ---- residual, dropout and layer norm ("Add & Norm") with a fixed mask --------
typedef struct {
    int N, C;
    real *out, *mean, *rstd, *res, *residual, *sub, *mask, *g, *b, *r;
} AddNormCase;
static double add_norm_objective(void *p) {
    AddNormCase *c = p;
    AddNormActs norm = { c->mask, c->res, c->out, c->mean, c->rstd };
    LayerNormParams ln = { c->g, c->b };
    residual_layernorm_forward(norm, c->residual, c->sub, ln, c->N, c->C, 1e-5f);
    return dot_product(c->out, c->r, (size_t)c->N * c->C);
}
static void test_add_norm_gradients(Rng *rng) {
    enum { N = 4, C = 37 };   // C: two vectors and a remainder
    real residual[N * C], sub[N * C], mask[N * C], g[C], b[C], r[N * C], out[N * C], res[N * C];
    real mean[N], rstd[N];
    real dresidual[N * C] = {0}, dsub[N * C] = {0}, dg[C] = {0}, db[C] = {0};
    fill_uniform(residual, N * C, -2, 2, rng);
    fill_uniform(sub, N * C, -2, 2, rng);
    fill_uniform(g, C, 0.5, 1.5, rng);
    fill_uniform(b, C, -0.5, 0.5, rng);
    fill_uniform(r, N * C, -1, 1, rng);
    Rng mask_rng;
    rng_seed(&mask_rng, 7);
    dropout_mask(mask, 0.3f, 1, &mask_rng, N * C);   // some zeros, the rest 1/0.7
    AddNormCase c = { N, C, out, mean, rstd, res, residual, sub, mask, g, b, r };
    add_norm_objective(&c);
    AddNormActs norm = { mask, res, out, mean, rstd };
    LayerNormParams ln = { g, b }, dln = { dg, db };
    residual_layernorm_backward(dresidual, dsub, dln, r, norm, ln, N, C);
    check_gradient("add & norm: residual", add_norm_objective, &c, residual, dresidual, N * C);
    check_gradient("add & norm: sublayer", add_norm_objective, &c, sub, dsub, N * C);
    check_gradient("add & norm: gain", add_norm_objective, &c, g, dg, C);
    check_gradient("add & norm: bias", add_norm_objective, &c, b, db, C);
}

// ---- scaled dot-product attention, with padding and the causal mask ---------
typedef struct {
    int B, Tq, Tk, C, NH, q_stride, kv_stride, causal;
    const int *key_len;
    real *out, *att, *q, *k, *v, *r;
} AttentionCase;
static double attention_objective(void *p) {
    AttentionCase *c = p;
    AttentionShape shape = { c->B, c->Tq, c->Tk, c->C, c->NH, c->q_stride, c->kv_stride };
    attention_forward(c->out, c->att, c->q, c->k, c->v, c->key_len, c->causal, shape);
    return dot_product(c->out, c->r, (size_t)c->B * c->Tq * c->C);
}
static void test_attention_gradients(Rng *rng) {
    enum { B = 2, T = 5, S = 4, C = 6, NH = 2 };
    int tgt_len[B] = { 5, 3 }, src_len[B] = { 2, 4 };
    static real qkv[B * T * 3 * C], q[B * T * C], kv[B * S * 2 * C], out[B * T * C],
        att[B * NH * T * T], r[B * T * C], dqkv[B * T * 3 * C],
        dq[B * T * C], dkv[B * S * 2 * C];
    fill_uniform(qkv, sizeof qkv / sizeof(real), -1.5, 1.5, rng);
    fill_uniform(r, sizeof r / sizeof(real), -1, 1, rng);
    // self-attention, causal, reading q, k, v out of one fused (B,T,3C) buffer
    AttentionCase self = { B, T, T, C, NH, 3 * C, 3 * C, 1, tgt_len, out, att, qkv, qkv + C,
                           qkv + 2 * C, r };
    attention_objective(&self);
    memset(dqkv, 0, sizeof dqkv);
    AttentionShape self_shape = { B, T, T, C, NH, 3 * C, 3 * C };
    attention_backward(dqkv, dqkv + C, dqkv + 2 * C, r, att, qkv, qkv + C, qkv + 2 * C, self_shape);
    check_gradient("attention (causal): q,k,v", attention_objective, &self, qkv, dqkv,
                   B * T * 3 * C);
    // cross-attention with padded keys: queries (B,T,C), keys/values (B,S,2C)
    fill_uniform(q, sizeof q / sizeof(real), -1.5, 1.5, rng);
    fill_uniform(kv, sizeof kv / sizeof(real), -1.5, 1.5, rng);
    AttentionCase cross = { B, T, S, C, NH, C, 2 * C, 0, src_len, out, att, q, kv, kv + C, r };
    attention_objective(&cross);
    memset(dq, 0, sizeof dq);
    memset(dkv, 0, sizeof dkv);
    AttentionShape cross_shape = { B, T, S, C, NH, C, 2 * C };
    attention_backward(dq, dkv, dkv + C, r, att, q, kv, kv + C, cross_shape);
    check_gradient("attention (padded keys): q", attention_objective, &cross, q, dq, B * T * C);
    check_gradient("attention (padded keys): k,v", attention_objective, &cross, kv, dkv,
                   B * S * 2 * C);
    // a padded key's gradient is exactly zero: nothing reads it
    double padded = 0;
    for (int s = src_len[0]; s < S; s++)
        for (int i = 0; i < 2 * C; i++) padded += fabs(dkv[(size_t)s * 2 * C + i]);
    check(padded == 0, "attention: padded keys and values get exactly zero gradient");
}

// ---- FFN: linear, ReLU, linear ----------------------------------------------
typedef struct {
    int N, C, F;
    real *out, *h, *x, *r;
    FeedForwardParams w;
} FeedForwardCase;
static double feed_forward_objective(void *p) {
    FeedForwardCase *c = p;
    TransformerConfig config = transformer_default_config();
    config.d_model = c->C;
    config.d_ff = c->F;
    FeedForwardActs acts = { c->h, c->out };
    feed_forward_forward(acts, c->x, c->w, c->N, &config);
    return dot_product(c->out, c->r, (size_t)c->N * c->C);
}
static void test_feed_forward_gradients(Rng *rng) {
    enum { N = 4, C = 5, F = 7 };
    real x[N * C], w1[F * C], b1[F], w2[C * F], b2[C], r[N * C], out[N * C], h[N * F], dh[N * F];
    real dx[N * C] = {0}, dw1[F * C] = {0}, db1[F] = {0}, dw2[C * F] = {0}, db2[C] = {0};
    fill_uniform(x, N * C, -1, 1, rng);
    fill_uniform(w1, F * C, -1, 1, rng);
    fill_uniform(b1, F, -0.5, 0.5, rng);
    fill_uniform(w2, C * F, -1, 1, rng);
    fill_uniform(b2, C, -0.5, 0.5, rng);
    fill_uniform(r, N * C, -1, 1, rng);
    FeedForwardCase c = { N, C, F, out, h, x, r, { w1, b1, w2, b2 } };
    // keep every ReLU input at least 1e-2 away from the kink, where the
    // finite difference would straddle it: shift b1 off any near-zero input
    real pre[N * F];
    linear_forward(pre, x, w1, b1, N, C, F);
    for (int i = 0; i < N * F; i++) if (fabs(pre[i]) < 1e-2) b1[i % F] += 0.05;
    linear_forward(pre, x, w1, b1, N, C, F);
    double closest = INFINITY;
    for (int i = 0; i < N * F; i++) closest = fmin(closest, fabs(pre[i]));
    feed_forward_objective(&c);
    memset(dh, 0, sizeof dh);
    FeedForwardParams g = { dw1, db1, dw2, db2 };
    TransformerConfig config = transformer_default_config();
    config.d_model = C;
    config.d_ff = F;
    FeedForwardActs acts = { h, out }, d = { dh, r };
    feed_forward_backward(dx, d, g, acts, x, c.w, N, &config);
    check(closest > 1e-3, "ffn: every ReLU input is %.1e or more from the kink", closest);
    check_gradient("ffn: input", feed_forward_objective, &c, x, dx, N * C);
    check_gradient("ffn: W1", feed_forward_objective, &c, w1, dw1, F * C);
    check_gradient("ffn: b1", feed_forward_objective, &c, b1, db1, F);
    check_gradient("ffn: W2", feed_forward_objective, &c, w2, dw2, C * F);
    check_gradient("ffn: b2", feed_forward_objective, &c, b2, db2, C);
}

// ---- the embedding -------------------------------------------------------------
typedef struct {
    int B, T, C;
    const int *tokens;
    real *out, *emb, *pe, *r;
} EmbeddingCase;
static double embedding_objective(void *p) {
    EmbeddingCase *c = p;
    embedding_forward(c->out, c->tokens, c->emb, c->pe, c->B, c->T, c->C);
    return dot_product(c->out, c->r, (size_t)c->B * c->T * c->C);
}
static void test_embedding_gradients(Rng *rng) {
    enum { V = 6, B = 2, T = 4, C = 5 };
    int tokens[B * T] = { 4, 5, 4, 0, 1, 2, 3, 4 };  // token 4 three times: gradients add
    real emb[V * C], pe[T * C], eout[B * T * C], er[B * T * C], demb[V * C] = {0};
    fill_uniform(emb, V * C, -1, 1, rng);
    fill_uniform(er, B * T * C, -1, 1, rng);
    positional_encoding_init(pe, T, C);
    EmbeddingCase ec = { B, T, C, tokens, eout, emb, pe, er };
    embedding_objective(&ec);
    embedding_backward(demb, er, tokens, B, T, C);
    check_gradient("embedding (sqrt(C) scale)", embedding_objective, &ec, emb, demb, V * C);
}

// ---- label-smoothed cross-entropy --------------------------------------------
typedef struct {
    int B, T, V;
    float eps;
    const int *targets, *len;
    real *loss, *probs, *logits;
} LossCase;
static double loss_objective(void *p) {
    LossCase *c = p;
    int n;
    Batch batch = { c->B, 1, c->T, NULL, NULL, NULL, (int *)c->targets, (int *)c->len };
    return cross_entropy_forward(c->loss, c->probs, c->logits, &batch, c->eps, c->V, &n);
}
static void test_loss_gradients(Rng *rng) {
    enum { B = 2, T = 3, V = 7 };
    int targets[B * T] = { 1, 5, 0, 6, 2, 0 }, len[B] = { 2, 3 };
    real logits[B * T * V], probs[B * T * V], loss[B * T], dlogits[B * T * V] = {0};
    fill_uniform(logits, B * T * V, -3, 3, rng);
    LossCase c = { B, T, V, 0.1f, targets, len, loss, probs, logits };
    int n;
    Batch batch = { B, 1, T, NULL, NULL, NULL, targets, len };
    cross_entropy_forward(loss, probs, logits, &batch, 0.1f, V, &n);
    cross_entropy_backward(dlogits, probs, &batch, 0.1f, n, V);
    check(n == 5, "loss: counts the 5 non-padding targets (got %d)", n);
    check_gradient("label-smoothed loss: logits", loss_objective, &c, logits, dlogits, B * T * V);
    // by hand: with eps = 0 and all logits equal, the loss is log V
    real flat[V] = {0}, p1[V], l1[1];
    int t1[1] = { 3 }, len1[1] = { 1 };
    Batch one = { 1, 1, 1, NULL, NULL, NULL, t1, len1 };
    double flat_loss = cross_entropy_forward(l1, p1, flat, &one, 0.0f, V, &n);
    check(fabs(flat_loss - log((double)V)) < 1e-12, "loss: uniform logits give log V (%.15f)",
          flat_loss);
    // and with smoothing eps the true class's target is 1 - eps + eps/V: the loss of a
    // uniform prediction is still log V, since q sums to 1
    flat_loss = cross_entropy_forward(l1, p1, flat, &one, 0.3f, V, &n);
    check(fabs(flat_loss - log((double)V)) < 1e-12,
          "loss: smoothing keeps log V for uniform logits");
}

// ---- the whole model -----------------------------------------------------------
// dropout_state: with dropout on, the dropout generator's state before each
// forward pass, so that every evaluation of the objective draws the same masks
// (0: dropout off)
typedef struct {
    Transformer *model;
    const Batch *batch;
    uint64_t dropout_state;
} ModelCase;
static double model_objective(void *p) {
    ModelCase *c = p;
    if (c->dropout_state)
        c->model->dropout_rng.state = c->dropout_state;
    return transformer_forward(c->model, c->batch);
}

// The smallest distance of any ReLU input in the model from the kink at 0.
static double closest_relu_input(Transformer *m) {
    const TransformerConfig *c = &m->config;
    int C = c->d_model, F = c->d_ff;
    double closest = INFINITY;
    for (int l = 0; l < c->n_layers; l++) {
        const real *inputs[2] = { m->acts.enc[l].norm1.out, m->acts.dec[l].norm2.out };
        FeedForwardParams ffn[2] = { encoder_layer_params(&m->params, c, l).ffn,
                                     decoder_layer_params(&m->params, c, l).ffn };
        int rows[2] = { m->B * m->S, m->B * m->T };
        for (int k = 0; k < 2; k++) {
            real *pre = checked_calloc((size_t)rows[k] * F, sizeof(real), "test");
            linear_forward(pre, inputs[k], ffn[k].w1, ffn[k].b1, rows[k], C, F);
            for (size_t i = 0; i < (size_t)rows[k] * F; i++) closest = fmin(closest, fabs(pre[i]));
            free(pre);
        }
    }
    return closest;
}

// Every parameter tensor of a whole model, with sinusoids or with learned
// positions (Table 3, row E: max_len 8 > S, T, so two rows of the table are
// used by no position and must get no gradient), with dropout off or on
// (P_drop 0.3 on the embeddings and every sub-layer, the same masks in every
// evaluation: dropout_forward and _backward, and the residual's masks, inside
// the whole model).
static void test_model_gradients(int positional, float dropout) {
    TransformerConfig config = transformer_default_config();
    config.n_layers = 2;
    config.d_model = 8;
    config.d_ff = 12;
    config.n_heads = 2;
    config.vocab_size = 11;
    config.max_len = 8;
    config.dropout = dropout;
    config.label_smoothing = 0.1f;
    config.positional = positional;
    int src_len[3] = { 5, 2, 4 }, tgt_len[3] = { 3, 6, 1 };
    Rng rng;
    rng_seed(&rng, 11);
    static TestBatch tb;
    make_test_batch(&tb, 3, 5, 6, src_len, tgt_len, config.vocab_size, &rng);
    // a seed whose ReLU inputs all stay clear of the kink (see the FFN check)
    Transformer model;
    double closest = 0;
    uint64_t seed;
    for (seed = 1; seed < 50; seed++) {
        transformer_build(&model, &config, seed);
        // non-zero biases and non-unit gains, so their gradients are tested in general position
        real **ptrs[NUM_PARAMETER_TENSORS];
        parameter_pointers(ptrs, &model.params);
        for (int i = 1; i < NUM_PARAMETER_TENSORS; i++) {
            const char *name = parameter_names[i];
            size_t len = strlen(name);
            if (name[len - 1] == 'b')
                fill_uniform(*ptrs[i], model.param_sizes[i], -0.2, 0.2, &rng);
            if (name[len - 1] == 'g')
                fill_uniform(*ptrs[i], model.param_sizes[i], 0.7, 1.3, &rng);
        }
        model.training = dropout > 0;
        if (dropout > 0)
            model.dropout_rng.state = 0x5EED;
        transformer_forward(&model, &tb.batch);
        closest = closest_relu_input(&model);
        if (closest > 1e-3)
            break;
        transformer_free(&model);
    }
    check(closest > 1e-3, "model: seed %d keeps every ReLU input %.1e or more from the kink",
          (int)seed, closest);
    ModelCase mc = { &model, &tb.batch, dropout > 0 ? 0x5EED : 0 };
    model_objective(&mc);
    transformer_zero_grad(&model);
    transformer_backward(&model, &tb.batch);
    real **params[NUM_PARAMETER_TENSORS], **grads[NUM_PARAMETER_TENSORS];
    parameter_pointers(params, &model.params);
    parameter_pointers(grads, &model.grads);
    int empty = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        char name[64];
        snprintf(name, sizeof name, "model%s%s: %s",
                 positional == POSITIONAL_LEARNED ? " (learned positions)" : "",
                 dropout > 0 ? " (dropout)" : "", parameter_names[i]);
        if (model.param_sizes[i] == 0)
            empty++;
        else
            check_gradient(name, model_objective, &mc, *params[i], *grads[i], model.param_sizes[i]);
    }
    // position_embedding, with sinusoids
    int expected_empty = positional == POSITIONAL_LEARNED ? 0 : 1;
    check(empty == expected_empty, "model: %d empty parameter tensors, expected %d", empty,
          expected_empty);
    transformer_free(&model);
}

static void run_gradient_checks(void) {
    printf("-- finite-difference gradient checks, double precision (tolerance %g)\n",
           GRAD_TOLERANCE);
    int threads = one_thread();
    Rng rng;
    rng_seed(&rng, 2017);
    test_linear_gradients(&rng);
    test_add_norm_gradients(&rng);
    test_attention_gradients(&rng);
    test_feed_forward_gradients(&rng);
    test_embedding_gradients(&rng);
    test_loss_gradients(&rng);
    test_model_gradients(POSITIONAL_SINUSOID, 0.0f);
    test_model_gradients(POSITIONAL_LEARNED, 0.0f);
    test_model_gradients(POSITIONAL_SINUSOID, 0.3f);
    set_threads(threads);
}
#endif // TRANSFORMER_DOUBLE

// ============================================================================
// PyTorch reference files (the format is in dev/FORMATS.md, "Reference files")
// ============================================================================

// Tolerances, relative to the largest magnitude in each tensor: 10 times the
// largest difference measured over the committed files and the 42 files of
// dev/reference_seeds.py, rounded up (dev/RESULTS.md, "How it is proven", gives the
// measurements; version 1: the committed file). Version 2 files hold PyTorch's float64
// results, so what is left is this build's own rounding; version 1 files hold
// PyTorch's float32 results, whose rounding dominates in either build. The
// Adam steps have no tolerance of their own: each element's update is held to
// a bound derived from the gradient tolerance (reference_adam_bounded).
typedef struct {
    double logits, loss, grads, step_losses;
} RefTolerances;
static RefTolerances reference_tolerances(int version) {
#ifdef TRANSFORMER_DOUBLE
    RefTolerances v2 = { 7e-15, 5e-15, 2e-14, 5e-15 };
#else
    RefTolerances v2 = { 4e-6, 1e-6, 8e-6, 1e-6 };
#endif
    RefTolerances v1 = { 3e-6, 2e-6, 6e-6, 4e-6 };
    return version == 1 ? v1 : v2;
}

typedef struct {
    int version;
    TransformerConfig config;
    int B, S, T, adam_steps, warmup;
    double lr_factor;
    int32_t *src, *src_len, *tgt_in, *tgt_out, *tgt_len;  // point into data
    double *params;        // (P) the initial weights: float32 numbers in both versions
    double *logits, *grads, *step_losses, loss;
    double *params_after;  // version 2: (adam_steps, P), after each step;
                           // version 1: (P), after the last
    size_t num_parameters;
    unsigned char *data;   // the file
    double *values;        // every stored real number, as double
} Reference;

static void reference_free(Reference *r) {
    free(r->data);
    free(r->values);
}

static int32_t read_i32(const unsigned char *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16
                     | (uint32_t)p[3] << 24);
}
static float read_f32(const unsigned char *p) {
    uint32_t u = (uint32_t)read_i32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static double read_f64(const unsigned char *p) {
    uint64_t u = (uint64_t)(uint32_t)read_i32(p) | (uint64_t)(uint32_t)read_i32(p + 4) << 32;
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

// Reads n reals of the given width (4: f32, 8: f64) at *p into out; advances *p.
static double *reference_reals(double *out, const unsigned char **p, size_t n, int width) {
    for (size_t i = 0; i < n; i++, *p += width)
        out[i] = width == 4 ? (double)read_f32(*p) : read_f64(*p);
    return out;
}

// The parameter tensors that hold numbers: 32, or 31 with sinusoids (whose
// position_embedding is empty).
static int nonempty_tensors(const TransformerConfig *c) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    parameter_sizes(sizes, c);
    int n = 0;
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) n += sizes[t] > 0;
    return n;
}

// Reads a reference file (format version 1 or 2); on any problem prints
// "path: reason" and returns 0.
static int reference_read(Reference *r, const char *path) {
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: cannot open: %s\n", path, strerror(errno));
        return 0;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (size < 72) {
        fprintf(stderr, "%s: %ld bytes, shorter than the 72-byte header\n", path, size);
        fclose(f);
        return 0;
    }
    r->data = checked_calloc((size_t)size, 1, path);
    size_t got = fread(r->data, 1, (size_t)size, f);
    fclose(f);
    if (got != (size_t)size) {
        fprintf(stderr, "%s: read %zu of %ld bytes\n", path, got, size);
        return 0;
    }
    const unsigned char *p = r->data;
    if (memcmp(p, "TREF", 4) != 0) {
        fprintf(stderr, "%s: bad magic, expected \"TREF\"\n", path);
        return 0;
    }
    r->version = read_i32(p + 4);
    if (r->version != 1 && r->version != 2) {
        fprintf(stderr, "%s: version %d, expected 1 or 2\n", path, r->version);
        return 0;
    }
    int h[12];
    for (int i = 0; i < 12; i++) h[i] = read_i32(p + 8 + 4 * i);
    TransformerConfig *c = &r->config;
    c->n_layers = h[0];
    c->d_model = h[1];
    c->d_ff = h[2];
    c->n_heads = h[3];
    c->vocab_size = h[4];
    c->max_len = h[5];
    r->B = h[6];
    r->S = h[7];
    r->T = h[8];
    r->adam_steps = h[9];
    r->warmup = h[10];
    if (h[11] != POSITIONAL_SINUSOID && h[11] != POSITIONAL_LEARNED) {
        fprintf(stderr, "%s: header: positional kind %d (offset 52), expected %d (sinusoid) "
                "or %d (learned)\n", path, h[11], POSITIONAL_SINUSOID, POSITIONAL_LEARNED);
        return 0;
    }
    c->positional = h[11];   // learned: the table is tensor 1, after the embedding
    c->label_smoothing = read_f32(p + 56);
    c->layer_norm_eps = read_f32(p + 60);
    r->lr_factor = read_f32(p + 64);
    c->dropout = 0.0f;
    const char *error = transformer_config_check(c);
    if (error) {
        fprintf(stderr, "%s: header: %s\n", path, error);
        return 0;
    }
    if (r->B < 1 || r->B > 64 || r->S < 1 || r->S > c->max_len || r->T < 1 || r->T > c->max_len ||
        r->adam_steps < 0 || r->adam_steps > 1000 || r->warmup < 1) {
        fprintf(stderr, "%s: header: batch %d x %d x %d, %d Adam steps, warmup %d out of range\n",
                path, r->B, r->S, r->T, r->adam_steps, r->warmup);
        return 0;
    }
    size_t sizes[NUM_PARAMETER_TENSORS];
    size_t P = parameter_sizes(sizes, c), B = r->B, S = r->S, T = r->T,
           V = c->vocab_size;
    size_t K = (size_t)r->adam_steps, ints = B * S + B + 2 * B * T + B;
    int width = r->version == 1 ? 4 : 8;           // the results: f32 in version 1, f64 in 2
    size_t after = r->version == 1 ? P : K * P;    // parameters after the last step / each step
    size_t results = B * T * V + 1 + P + K + after;
    size_t expected = 72 + 4 * ints + 4 * P + (size_t)width * results;
    if ((size_t)size != expected) {
        fprintf(stderr, "%s: %ld bytes, but its header (version %d) implies %zu\n", path, size,
                r->version, expected);
        return 0;
    }
    r->num_parameters = P;
    // the integers are little-endian int32; convert in place (a no-op on
    // little-endian machines) so the arrays can be used directly
    unsigned char *q = r->data + 72;
    for (size_t i = 0; i < ints; i++) {
        int32_t v = read_i32(q + 4 * i);
        memcpy(q + 4 * i, &v, 4);
    }
    int32_t *ip = (int32_t *)(void *)q;
    r->src = ip;
    ip += B * S;
    r->src_len = ip;
    ip += B;
    r->tgt_in = ip;
    ip += B * T;
    r->tgt_out = ip;
    ip += B * T;
    r->tgt_len = ip;
    ip += B;
    r->values = checked_calloc(P + results, sizeof(double), "reference values");
    const unsigned char *fp = (const unsigned char *)ip;
    r->params = reference_reals(r->values, &fp, P, 4);
    r->logits = reference_reals(r->params + P, &fp, B * T * V, width);
    reference_reals(&r->loss, &fp, 1, width);
    r->grads = reference_reals(r->logits + B * T * V, &fp, P, width);
    r->step_losses = reference_reals(r->grads + P, &fp, K, width);
    r->params_after = reference_reals(r->step_losses + K, &fp, after, width);
    return 1;
}

// Compares a tensor with the reference; prints the largest absolute and
// relative (to the reference's largest magnitude) difference. Returns 1 if
// within tolerance; else names the first differing element. skip may mark
// elements to leave out (NULL: none).
static int compare_tensor(const char *what, const real *ours, const double *ref, size_t n,
                          double tolerance, const unsigned char *skip, int verbose) {
    double scale = 0, max_abs = 0;
    for (size_t i = 0; i < n; i++) if (!skip || !skip[i]) scale = fmax(scale, fabs(ref[i]));
    if (scale == 0)
        scale = 1;
    long first_bad = -1;
    for (size_t i = 0; i < n; i++) {
        if (skip && skip[i])
            continue;
        double d = fabs((double)ours[i] - ref[i]);
        if (!(d <= max_abs))
            max_abs = d;   // NaN propagates as a failure
        if (first_bad < 0 && !(d <= tolerance * scale))
            first_bad = (long)i;
    }
    int ok = first_bad < 0;
    if (verbose || !ok)
        printf("     %-24s max abs diff %.3e  max rel diff %.3e  (tolerance %.0e)%s\n", what,
               max_abs, max_abs / scale, tolerance, ok ? "" : "  MISMATCH");
    if (!ok)
        printf("     %s: first differing element %ld: ours %.12g, PyTorch %.12g\n", what, first_bad,
               (double)ours[first_bad], ref[first_bad]);
    return ok;
}

// Where a companion that computes elsewhere (cuda/test_cuda.c: the CUDA
// companion's "GPU") copies the logits of its last forward pass from.
static void (*companion_logits)(real *out, size_t n);

// Where a program that includes these tests has a fast path (lab/test_lab.c:
// lab/fast_path.c's fast_path_use), the switch between it (1) and Part I's
// loops (0): test_attention_by_hand then runs through both. NULL: Part I alone.
static void (*fast_path_switch)(int on);

// The logits of the last forward pass: the host model's, or the companion's
// copied back (buffer holds B*T*V).
static const real *last_logits(const TrainingCompute *compute, Transformer *m, real *buffer) {
    if (compute != &transformer_cpu_training && companion_logits) {
        companion_logits(buffer, (size_t)m->B * m->T * m->config.vocab_size);
        return buffer;
    }
    return m->acts.logits;
}

// What reference_compare changes on purpose, to show that the comparison
// catches it (all zero: nothing).
typedef struct {
    int tensor;           // move element `element` of this parameter tensor ...
    size_t element;
    double move;          // ... by this much (0: none)
    double beta1, beta2;  // Adam's betas instead of 0.9, 0.98 (0: unchanged)
    double lr_scale;      // the learning rate times this (0: unchanged)
    int skip_adam;        // compare only the forward and backward pass
} RefMutation;

typedef struct {
    int before_adam, adam;
} RefMismatches;

// Loads reference parameters into the model (rounded to real), with the mutation's move.
static void reference_load(Transformer *model, const double *params, const RefMutation *mutation) {
    for (size_t i = 0; i < model->num_parameters; i++) model->params_memory[i] = (real)params[i];
    if (mutation->move != 0) {
        size_t offset = 0;
        for (int t = 0; t < mutation->tensor; t++) offset += model->param_sizes[t];
        model->params_memory[offset + mutation->element] += (real)mutation->move;
    }
}

// Marks the key biases (rows C..2C-1 of each qkv bias) to be left out of a
// comparison after free-running Adam steps: softmax ignores a constant added
// to every score, so their true gradient is exactly 0 and what either program
// computes is rounding noise, which Adam turns into full-size steps of random sign.
static unsigned char *key_bias_skip_mask(Transformer *model) {
    unsigned char *skip = checked_calloc(model->num_parameters, 1, "skip mask");
    size_t C = model->config.d_model, L = model->config.n_layers;
    real *qkv_biases[3] = { model->params.enc_qkv_b, model->params.dec_self_qkv_b,
                            model->params.dec_cross_qkv_b };
    for (int a = 0; a < 3; a++)
        for (size_t l = 0; l < L; l++)
            for (size_t i = C; i < 2 * C; i++)
                skip[(size_t)(qkv_biases[a] - model->params_memory) + l * 3 * C + i] = 1;
    return skip;
}

// rho_k = the largest |m_hat| / sqrt(v_hat) that any gradients can give after
// k steps: by Cauchy-Schwarz, sqrt(sum_j a_j^2 / b_j), where a_j and b_j are
// the bias-corrected weights of g_j in m_hat and of g_j^2 in v_hat.
static double adam_ratio_limit(int k, double beta1, double beta2) {
    double c1 = 1 - pow(beta1, k), c2 = 1 - pow(beta2, k), sum = 0;
    for (int j = 1; j <= k; j++) {
        double a = (1 - beta1) * pow(beta1, k - j) / c1, b = (1 - beta2) * pow(beta2, k - j) / c2;
        sum += a * a / b;
    }
    return sqrt(sum);
}

// Version 2, and version 1 with one step (whose parameters after step 1 are
// stored as version 2 stores them): step k starts from the reference's
// parameters before it (so a difference at one step cannot grow through the
// later ones), computes our loss and gradient there and our Adam update with
// our own moments; each element's update must be within the bound derived in
// dev/FORMATS.md, "Reference files":
//     lr_k min(|r| + rho_k, (1 + rho_k) delta_t / (s + eps)) + rounding
// with s = sqrt(v_hat) and r = m_hat / (s + eps) ours, delta_t the gradient
// tolerance times tensor t's largest |gradient| (an absolute bound on each
// element's gradient error; the largest over the steps so far). Step 1 was
// taken by reference_compare (first_loss); the gradients of a step are still
// there after its update.
static int reference_adam_bounded(Transformer *model, const Reference *r, Batch *batch,
                                  RefTolerances tol, real first_loss, double lr_factor,
                                  const RefMutation *mutation, const TrainingCompute *compute,
                                  int verbose) {
    size_t P = r->num_parameters;
    int C = r->config.d_model, mismatches = 0;
    // unit roundoff: this build's, or PyTorch's float32 one in a version 1 file
    double unit = sizeof(real) == 4 || r->version == 1 ? FLT_EPSILON / 2 : DBL_EPSILON / 2;
    double delta[NUM_PARAMETER_TENSORS] = {0}, b1 = model->adam.beta1, b2 = model->adam.beta2;
    real *losses = checked_calloc((size_t)r->adam_steps, sizeof(real), "losses");
    for (int k = 1; k <= r->adam_steps; k++) {
        const double *before = k == 1 ? r->params : r->params_after + (size_t)(k - 2) * P;
        const double *after = r->params_after + (size_t)(k - 1) * P;
        if (k == 1) {
            losses[0] = first_loss;
        } else {
            reference_load(model, before, mutation);
            // the companion: the parameters (and our moments) to its memory
            compute->begin(model);
            losses[k - 1] = compute->train_step(model, batch, r->warmup, lr_factor);
            compute->to_host(model);   // the parameters, moments and gradients, read below
        }
        size_t offset = 0;
        for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
            double largest = 0;
            for (size_t i = offset; i < offset + model->param_sizes[t]; i++)
                largest = fmax(largest, fabs((double)model->grads_memory[i]));
            delta[t] = fmax(delta[t], tol.grads * largest);
            offset += model->param_sizes[t];
        }
        double lr = transformer_learning_rate(k, C, r->warmup, lr_factor);
        double c1 = 1 - pow(b1, k), c2 = 1 - pow(b2, k), rho = adam_ratio_limit(k, b1, b2),
               eps = model->adam.eps;
        // the last: where the bound is not the cap
        double worst_ratio = 0, worst_diff = 0, worst_resolved = 0;
        size_t loose = 0, first_bad = P;
        offset = 0;
        for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
            for (size_t i = offset; i < offset + model->param_sizes[t]; i++) {
                double ours = (double)model->params_memory[i] - (double)(real)before[i];
                double theirs = after[i] - before[i], diff = fabs(ours - theirs);
                double s = sqrt((double)model->adam_v[i] / c2);
                double ratio = fabs((double)model->adam_m[i] / c1) / (s + eps);
                double cap = ratio + rho, resolved = (1 + rho) * delta[t] / (s + eps);
                double bound = lr * fmin(cap, resolved)
                             + 2 * unit * fabs((double)model->params_memory[i])
                             + 64 * unit * lr * (ratio + 1);
                if (!(diff <= bound) && first_bad == P)
                    first_bad = i;
                if (!(diff / bound <= worst_ratio))
                    worst_ratio = diff / bound;
                if (resolved < cap)
                    worst_resolved = fmax(worst_resolved, diff / bound);
                worst_diff = fmax(worst_diff, diff);
                loose += bound > 1e-2 * lr;
            }
            offset += model->param_sizes[t];
        }
        int ok = first_bad == P;
        mismatches += !ok;
        if (verbose || !ok)
            printf("     Adam step %d (lr %.3e): max |update diff| %.3e = %.1e lr, "
                   "max diff/bound %.2e (%.2e where not capped); %zu of %zu bounds above "
                   "lr/100%s\n", k, lr, worst_diff, worst_diff / lr, worst_ratio, worst_resolved,
                   loose, P, ok ? "" : "  MISMATCH");
        if (!ok)
            printf("     Adam step %d: first element over its bound %zu: update ours %.12g, "
                   "PyTorch %.12g\n", k, first_bad,
                   (double)model->params_memory[first_bad] - (double)(real)before[first_bad],
                   after[first_bad] - before[first_bad]);
    }
    mismatches += !compare_tensor("Adam: losses", losses, r->step_losses, (size_t)r->adam_steps,
                                  tol.step_losses, NULL, verbose);
    free(losses);
    return mismatches;
}

// Version 1 with more than one step: PyTorch's float32 Adam run free over K
// steps, the parameters after the last stored. From step 2 on each program
// takes its gradients at its own parameters, and no bound in the gradient
// tolerance holds: at step 1 an element whose gradient is within rounding of
// zero gets a step of about lr of either sign (m / (sqrt(v) + eps) is about
// +-1 whatever |g|), and every later step feeds on it. PyTorch's own float32
// run misses its float64 run by as much, so the updates and the losses of
// steps 2..K are reported, not failed. What any correct pair of runs meets is
// failed on: Adam moves an element by at most lr_k rho_k at step k, so the two
// total updates differ by at most
//     2 sum_k lr_k rho_k + rounding
// (a NaN or a gross error of the rate breaks it), and the losses are finite.
// The logits, loss and gradients of step 1 are compared by reference_compare;
// the first step, taken there, gave first_loss. Measured with
// `dev/reference_seeds.py --version 1` (seeds 201-210 of six configurations,
// the last with one step: 60 files): all pass both builds (the former check,
// updates to 4e-4 of the largest and step losses to 4e-6, failed 9 in float
// and 6 in double); over the 50 of more steps, PyTorch's float32 run misses
// its float64 run by up to 0.21 of the largest update and 3.6e-5 of the step
// losses, this float build by 0.22 and 3.8e-5, and no update difference
// exceeds 0.59 of 2 sum lr_k rho_k; the one-step files reach 0.85 of their
// bound (float; 0.82 double).
static int reference_adam_free_running(Transformer *model, const Reference *r, Batch *batch,
                                       real first_loss, double lr_factor,
                                       const TrainingCompute *compute, int verbose) {
    size_t P = r->num_parameters;
    int K = r->adam_steps, finite = 1;
    real *losses = checked_calloc((size_t)K, sizeof(real), "losses");
    losses[0] = first_loss;
    for (int step = 2; step <= K; step++)
        losses[step - 1] = compute->train_step(model, batch, r->warmup, lr_factor);
    compute->to_host(model);
    double loss_diff = 0, loss_scale = 0;
    for (int k = 2; k <= K; k++) {
        finite &= isfinite((double)losses[k - 1]);
        loss_diff = fmax(loss_diff, fabs((double)losses[k - 1] - r->step_losses[k - 1]));
        loss_scale = fmax(loss_scale, fabs(r->step_losses[k - 1]));
    }
    // the file's rates (lr_factor may be a mutation's), PyTorch's float32
    // rounding (ours is no coarser)
    double unit = FLT_EPSILON / 2, cap = 0;
    for (int k = 1; k <= K; k++)
        cap += transformer_learning_rate(k, r->config.d_model, r->warmup, r->lr_factor)
             * adam_ratio_limit(k, model->adam.beta1, model->adam.beta2);
    unsigned char *skip = key_bias_skip_mask(model);
    double worst = 0, largest = 0, worst_over_bound = 0;   // the first two without the key biases
    size_t first_bad = P;
    for (size_t i = 0; i < P; i++) {
        double ours = (double)model->params_memory[i] - r->params[i],
               theirs = r->params_after[i] - r->params[i];
        double diff = fabs(ours - theirs);
        double bound = 2 * (cap * (1 + 16 * unit) + K * unit * (fabs(r->params[i]) + cap));
        if (!(diff <= bound) && first_bad == P)
            first_bad = i;
        if (!(diff / bound <= worst_over_bound))
            worst_over_bound = diff / bound;
        if (!skip[i]) {
            worst = fmax(worst, diff);
            largest = fmax(largest, fabs(theirs));
        }
    }
    int ok = first_bad == P && finite;
    if (verbose || !ok) {
        printf("     Adam: losses, steps 2..%d  max abs diff %.3e  max rel diff %.3e  "
               "(reported)%s\n", K, loss_diff, loss_diff / (loss_scale > 0 ? loss_scale : 1),
               finite ? "" : "  NOT FINITE");
        printf("     Adam: updates, %d steps   max abs diff %.3e  max rel diff %.3e  "
               "(reported; key biases left out); max diff / (2 sum lr_k rho_k = %.3e) %.2e%s\n",
               K, worst, worst / (largest > 0 ? largest : 1), 2 * cap, worst_over_bound,
               first_bad == P ? "" : "  MISMATCH");
    }
    if (first_bad < P)
        printf("     Adam: element %zu moved beyond any correct step: update ours %.12g, "
               "PyTorch %.12g\n", first_bad,
               (double)model->params_memory[first_bad] - r->params[first_bad],
               r->params_after[first_bad] - r->params[first_bad]);
    if (verbose)
        printf("     Adam: %d free-running float32 steps: the differences are reported, not "
               "failed: a gradient within rounding of zero flips a step of about lr, later steps "
               "follow, and PyTorch's float32 and float64 runs differ as much (dev/FORMATS.md, "
               "\"Reference files\")\n", K);
    free(losses);
    free(skip);
    return !ok;
}

// Runs our model on a reference file's weights and batch and compares
// everything; counts the mismatching comparisons before Adam (logits, loss,
// the gradients of the non-empty tensors) and in the Adam steps.
static RefMismatches reference_compare(const Reference *r, const char *path, int verbose,
                                       const RefMutation *mutation,
                                       const TrainingCompute *compute) {
    RefMismatches result = { 0, 0 };
    RefTolerances tol = reference_tolerances(r->version);
    Transformer model;
    const char *error = transformer_build(&model, &r->config, 0);
    if (error) {
        printf("     %s: %s\n", path, error);
        result.before_adam = 1;
        return result;
    }
    model.training = 0;
    if (mutation->beta1)
        model.adam.beta1 = mutation->beta1;
    if (mutation->beta2)
        model.adam.beta2 = mutation->beta2;
    reference_load(&model, r->params, mutation);
    Batch batch = { r->B, r->S, r->T, r->src, r->src_len, r->tgt_in, r->tgt_out, r->tgt_len };
    const char *bad = batch_check(&batch, &r->config);
    if (bad) {
        printf("     %s: batch: %s\n", path, bad);
        transformer_free(&model);
        result.before_adam = 1;
        return result;
    }
    size_t BTV = (size_t)r->B * r->T * r->config.vocab_size;
    real *logits = checked_calloc(BTV, sizeof(real), "logits");
    // One training step at the reference's weights: its forward and backward
    // passes are compared here, its update (the first Adam step) below
    double lr_factor = r->lr_factor * (mutation->lr_scale ? mutation->lr_scale : 1);
    compute->begin(&model);
    real loss = compute->train_step(&model, &batch, r->warmup, lr_factor);
    compute->to_host(&model);
    result.before_adam += !compare_tensor("logits", last_logits(compute, &model, logits), r->logits,
                                          BTV, tol.logits, NULL, verbose);
    result.before_adam += !compare_tensor("loss", &loss, &r->loss, 1, tol.loss, NULL, verbose);
    free(logits);
    size_t offset = 0;
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        char name[64];
        if (model.param_sizes[t] == 0)
            continue;   // position_embedding, with sinusoids
        snprintf(name, sizeof name, "grad %s", parameter_names[t]);
        result.before_adam += !compare_tensor(name, model.grads_memory + offset, r->grads + offset,
                                              model.param_sizes[t], tol.grads, NULL, verbose);
        offset += model.param_sizes[t];
    }
    if (!mutation->skip_adam && r->adam_steps > 0) {
        result.adam = r->version == 2 || r->adam_steps == 1
            ? reference_adam_bounded(&model, r, &batch, tol, loss, lr_factor, mutation, compute,
                                     verbose)
            : reference_adam_free_running(&model, r, &batch, loss, lr_factor, compute, verbose);
    }
    transformer_free(&model);
    return result;
}

static void test_reference_file(const char *path) {
    Reference r;
    if (!reference_read(&r, path)) {
        check(0, "reference %s: unreadable", path);
        reference_free(&r);
        return;
    }
    printf("-- %s (format version %d): %d layers, d_model %d, d_ff %d, %d heads, vocab %d, "
           "batch %d x %d x %d, eps_ls %g%s\n",
           path, r.version, r.config.n_layers, r.config.d_model, r.config.d_ff, r.config.n_heads,
           r.config.vocab_size, r.B, r.S, r.T, (double)r.config.label_smoothing,
           r.config.positional == POSITIONAL_LEARNED ? ", learned positions" : "");
    RefMutation none = { 0 };
    RefMismatches m = reference_compare(&r, path, 1, &none, &transformer_cpu_training);
    int free_running = r.version == 1 && r.adam_steps > 1;
    check(m.before_adam == 0 && m.adam == 0,
          "reference %s: logits, loss, %d gradients, %d Adam steps match PyTorch%s",
          path, nonempty_tensors(&r.config), r.adam_steps,
          free_running
              ? " (steps run free in float32: within 2 sum lr_k rho_k, differences reported)"
              : "");
    reference_free(&r);
}

// Version 2 files (PyTorch in float64), the last of them with learned
// positions (max_len 16 > S, T: the table's rows 7..15 get no gradient), and
// three of version 1 (PyTorch in float32), which show that the old format
// still reads and agrees: 4 steps run free; the same weights and batch
// (ref_1layer_4head's configuration, seed 42) with one step, held to version
// 2's bound, and with 2 steps, on which the former check (free-running
// updates to 4e-4 of the largest) failed in both builds (3.8e-2 in float,
// 2.3e-2 in double; PyTorch's float32 run misses its float64 run by 2.3e-2).
static const char *committed_references[] = {
    "tiny_data/ref_2layer_5head.ref", "tiny_data/ref_1layer_4head.ref",
    "tiny_data/ref_3layer_2head.ref", "tiny_data/ref_learned_positions.ref",
    "tiny_data/ref_1layer_3head.ref", "tiny_data/ref_v1_one_step.ref",
    "tiny_data/ref_v1_diverging.ref",
};

// One weight moved by 1e-3 in every non-empty parameter tensor (of a file
// with sinusoids, of the one with learned positions and of a version 1 file,
// with its looser tolerances), in the query, key and value blocks of each
// fused projection, must make the comparison before Adam (logits, loss,
// gradients) fail. The weight: the block's middle one, or the next whose
// reference gradient is at least 1% of the tensor's largest (a weight the
// batch does not use, e.g. into a ReLU unit that is off for every position or
// a row of the position table past S and T, changes nothing that any
// comparison could see). The key bias is left out: softmax ignores a constant
// added to all of a query's scores, so moving it changes nothing at all.
static size_t used_weight(const Reference *r, size_t offset, size_t size, size_t begin,
                          size_t end) {
    double largest = 0;
    for (size_t i = 0; i < size; i++) largest = fmax(largest, fabs(r->grads[offset + i]));
    for (size_t i = begin + (end - begin) / 2; i < end; i++)
        if (fabs(r->grads[offset + i]) >= 0.01 * largest)
            return i;
    for (size_t i = begin; i < end; i++)
        if (fabs(r->grads[offset + i]) >= 0.01 * largest)
            return i;
    return begin;
}

static void test_reference_catches_wrong_weights(const char *path) {
    Reference r;
    if (!reference_read(&r, path)) {
        check(0, "reference %s unreadable", path);
        reference_free(&r);
        return;
    }
    printf("-- %s with one weight moved by 1e-3 (must mismatch before Adam):\n", path);
    size_t sizes[NUM_PARAMETER_TENSORS], C = r.config.d_model, offset = 0;
    parameter_sizes(sizes, &r.config);
    for (int t = 0; t < NUM_PARAMETER_TENSORS; offset += sizes[t], t++) {
        if (sizes[t] == 0)
            continue;   // position_embedding, with sinusoids
        int fused_w = strstr(parameter_names[t], "qkv_w") != NULL,
            fused_b = strstr(parameter_names[t], "qkv_b") != NULL;
        // the weight(s) to move: in layer 0's query, key and value blocks of a
        // fused projection (not the key bias); else anywhere in the tensor
        size_t elements[3] = { used_weight(&r, offset, sizes[t], 0, sizes[t]) }, n = 1;
        const char *what[3] = { "" };
        if (fused_w) {
            for (size_t block = 0; block < 3; block++)
                elements[block] = used_weight(&r, offset, sizes[t], block * C * C,
                                              (block + 1) * C * C);
            what[0] = " query";
            what[1] = " key";
            what[2] = " value";
            n = 3;
        } else if (fused_b) {
            elements[0] = used_weight(&r, offset, sizes[t], 0, C);
            elements[1] = used_weight(&r, offset, sizes[t], 2 * C, 3 * C);
            what[0] = " query";
            what[1] = " value";
            n = 2;
        }
        char report[200] = "";
        int caught = 1;
        for (size_t e = 0; e < n; e++) {
            RefMutation move = { .tensor = t, .element = elements[e], .move = 1e-3,
                                 .skip_adam = 1 };
            RefMismatches m = reference_compare(&r, path, 0, &move, &transformer_cpu_training);
            caught &= m.before_adam > 0;
            snprintf(report + strlen(report), sizeof report - strlen(report), "%s%s[%zu]: %d",
                     e ? ", " : "", what[e], elements[e], m.before_adam);
        }
        check(caught,
              "reference: a 1e-3 move caught before Adam in %s of %s (%s mismatching comparisons)",
              parameter_names[t], path, report);
    }
    reference_free(&r);
}

// A reference file cut short, with bytes added, of another version or with a
// positional kind other than 0 and 1 is refused (reference_read checks the
// exact size its header implies).
static void test_reference_refuses_bad_files(void) {
    const char *path = committed_references[0];   // a version 2 file
    FILE *f = fopen(path, "rb");
    if (!f) {
        check(0, "reference %s: cannot open", path);
        return;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    unsigned char *bytes = checked_calloc((size_t)size + 4, 1, "reference bytes");
    size_t got = fread(bytes, 1, (size_t)size, f);
    fclose(f);
    char bad[64];
    snprintf(bad, sizeof bad, "/tmp/test_transformer_%d.ref", (int)getpid());
    struct {
        long length;
        int offset, value;
        const char *what;
    } cases[4] = {
        { size - 8, 0, 0, "cut short by 8 bytes" }, { size + 4, 0, 0, "with 4 bytes added" },
        { size, 4, 3, "of version 3" },             // the version follows "TREF"
        { size, 52, 2, "with positional kind 2" } };
    int refused = 0;
    for (int i = 0; i < 4; i++) {
        int at = cases[i].offset;
        unsigned char kept = bytes[at];
        if (at)
            bytes[at] = (unsigned char)cases[i].value;
        FILE *out = fopen(bad, "wb");
        if (out) {
            fwrite(bytes, 1, (size_t)cases[i].length, out);
            fclose(out);
        }
        bytes[at] = kept;
        Reference r;
        printf("     %s: ", cases[i].what);
        fflush(stdout);
        int read = reference_read(&r, bad);
        refused += !read;
        reference_free(&r);
    }
    remove(bad);
    free(bytes);
    check(got == (size_t)size && refused == 4,
          "reference: a version 2 file cut short, lengthened, of another version or positional "
          "kind is refused (%d of 4)",
          refused);
}

// A wrong Adam step must pass the comparison before Adam and fail the Adam
// steps: on a version 2 file the learning rate 1% off, another beta1 or beta2;
// on the one-step version 1 file the rate 1% off (the betas cannot show at
// step 1, where m_hat = g and v_hat = g^2 whatever they are); on a version 1
// file run free over 2 steps the rate 5 times too large, an error its bound
// (2 sum_k lr_k rho_k, reference_adam_free_running) can catch.
static void test_reference_catches_wrong_adam(void) {
    struct {
        const char *path;
        RefMutation wrong;
        const char *what;
    } cases[] = {
        { committed_references[0], { .lr_scale = 1.01 }, "learning rate x 1.01" },
        { committed_references[0], { .beta1 = 0.89 }, "beta1 0.89" },
        { committed_references[0], { .beta2 = 0.99 }, "beta2 0.99" },
        { "tiny_data/ref_v1_one_step.ref", { .lr_scale = 1.01 }, "learning rate x 1.01" },
        { "tiny_data/ref_v1_diverging.ref", { .lr_scale = 5 }, "learning rate x 5" },
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        Reference r;
        if (!reference_read(&r, cases[c].path)) {
            check(0, "reference %s unreadable", cases[c].path);
            reference_free(&r);
            continue;
        }
        RefMismatches m = reference_compare(&r, cases[c].path, 0, &cases[c].wrong,
                                            &transformer_cpu_training);
        check(m.before_adam == 0 && m.adam > 0,
              "reference: Adam with %s is caught in %s (%d Adam mismatches, %d before)",
              cases[c].what, cases[c].path, m.adam, m.before_adam);
        reference_free(&r);
    }
}

// ============================================================================
// Masks, Adam, the schedule, learning, determinism (float, as users run it)
// ============================================================================

static TransformerConfig small_config(void) {
    TransformerConfig c = transformer_default_config();
    c.n_layers = 2;
    c.d_model = 16;
    c.d_ff = 32;
    c.n_heads = 4;
    c.vocab_size = 14;
    c.max_len = 10;
    c.dropout = 0.1f;
    c.label_smoothing = 0.1f;
    return c;
}

static void test_config_checks(void) {
    TransformerConfig c = small_config();
    check(transformer_config_check(&c) == NULL, "config: a good config passes");
    c.n_heads = 5;
    const char *e = transformer_config_check(&c);
    check(e && strstr(e, "divisible"), "config: d_model 16 with 5 heads is refused (%s)",
          e ? e : "accepted");
    c = small_config();
    c.d_model = -4;
    check(transformer_config_check(&c) != NULL, "config: negative d_model is refused");
    c = small_config();
    c.vocab_size = TRANSFORMER_MAX_VOCAB + 1;
    check(transformer_config_check(&c) != NULL, "config: a vocabulary over the limit is refused");
    c = small_config();
    c.dropout = 1.0f;
    check(transformer_config_check(&c) != NULL, "config: dropout 1 is refused");
    Transformer m;
    c = small_config();
    c.n_layers = 0;
    check(transformer_build(&m, &c, 1) != NULL, "config: transformer_build refuses 0 layers");
}

// Table 3 parameter counts, worked out by hand: per layer an attention block
// has 4 C^2 + 4 C, an FFN 2 C F + F + C, a layer norm 2 C; plus V C; learned
// positions (Table 3, row E) add max_len x d_model. (The lab's params command
// adds them up by component: lab/test_lab.c, test_parameter_groups.)
enum { COUNTED_MODELS = 3 };

// Model i of the counted ones: base and big (Table 3, 37000 subwords), and a tiny one.
static TransformerConfig counted_model(int i) {
    struct {
        int L, C, F, H, V;
    } models[COUNTED_MODELS] = { { 6, 512, 2048, 8, 37000 }, { 6, 1024, 4096, 16, 37000 },
                                 { 2, 64, 256, 4, 14 } };
    TransformerConfig c = transformer_default_config();
    c.n_layers = models[i].L;
    c.d_model = models[i].C;
    c.d_ff = models[i].F;
    c.n_heads = models[i].H;
    c.vocab_size = models[i].V;
    return c;
}

// The parameters of a model with sinusoidal positions, by hand.
static size_t parameters_by_hand(const TransformerConfig *c) {
    size_t L = c->n_layers, C = c->d_model, F = c->d_ff, V = c->vocab_size;
    size_t attention = 4 * C * C + 4 * C, ffn = 2 * C * F + F + C, norm = 2 * C;
    return V * C + L * (attention + ffn + 2 * norm) + L * (2 * attention + ffn + 3 * norm);
}

static void test_parameter_counts(void) {
    for (int i = 0; i < COUNTED_MODELS; i++) {
        TransformerConfig c = counted_model(i);
        size_t by_hand = parameters_by_hand(&c), sizes[NUM_PARAMETER_TENSORS];
        check(parameter_sizes(sizes, &c) == by_hand,
              "params: N=%d d_model=%d d_ff=%d vocab %d: the tensors add up to %zu, as by hand",
              c.n_layers, c.d_model, c.d_ff, c.vocab_size, by_hand);
        c.positional = POSITIONAL_LEARNED;
        c.max_len = 100;
        check(parameter_sizes(sizes, &c) == by_hand + 100 * (size_t)c.d_model,
              "params: the same with learned positions, max_len 100: %zu more",
              100 * (size_t)c.d_model);
    }
}

static void test_masks(void) {
    TransformerConfig config = small_config();
    Transformer m;
    transformer_build(&m, &config, 5);
    m.training = 0;
    int src_len[3] = { 6, 3, 5 }, tgt_len[3] = { 4, 7, 2 };
    Rng rng;
    rng_seed(&rng, 99);
    static TestBatch tb;
    make_test_batch(&tb, 3, 6, 7, src_len, tgt_len, config.vocab_size, &rng);
    Batch *b = &tb.batch;
    size_t V = config.vocab_size, n = 3 * 7 * V;
    real *before = checked_calloc(n, sizeof(real), "logits");
    transformer_forward(&m, b);
    memcpy(before, m.acts.logits, n * sizeof(real));
    // 1. a padded source token (sentence 1, position 4 >= its length 3)
    b->src[1 * 6 + 4] = 7;
    transformer_forward(&m, b);
    check(memcmp(before, m.acts.logits, n * sizeof(real)) == 0,
          "mask: changing a padded source token leaves every logit bit-identical");
    b->src[1 * 6 + 4] = TOKEN_PAD;
    // 2. a later target token: sentence 1, position 4; positions 0..3 must not move
    int saved = b->tgt_in[1 * 7 + 4];
    b->tgt_in[1 * 7 + 4] = saved == 5 ? 6 : 5;
    transformer_forward(&m, b);
    int earlier_same = memcmp(before + (1 * 7) * V, m.acts.logits + (1 * 7) * V,
                              4 * V * sizeof(real)) == 0;
    int others_same = memcmp(before, m.acts.logits, 7 * V * sizeof(real)) == 0 &&
                      memcmp(before + 14 * V, m.acts.logits + 14 * V, 7 * V * sizeof(real)) == 0;
    int own_moved = memcmp(before + (1 * 7 + 4) * V, m.acts.logits + (1 * 7 + 4) * V,
                           V * sizeof(real)) != 0;
    check(earlier_same && others_same,
          "mask: changing target token 4 leaves positions 0..3 and other sentences bit-identical");
    check(own_moved, "mask: ... while position 4 itself does change (the check can fail)");
    b->tgt_in[1 * 7 + 4] = saved;
    // 3. a padded target token (sentence 2, position 5 >= its length 2)
    b->tgt_in[2 * 7 + 5] = 9;
    transformer_forward(&m, b);
    check(memcmp(before, m.acts.logits, (2 * 7 + 2) * V * sizeof(real)) == 0,
          "mask: changing a padded target token leaves every real position's logits bit-identical");
    b->tgt_in[2 * 7 + 5] = TOKEN_PAD;
    // 4. a real source token must change the output (so the checks above can fail)
    b->src[0] = b->src[0] == 5 ? 6 : 5;
    transformer_forward(&m, b);
    check(memcmp(before, m.acts.logits, n * sizeof(real)) != 0,
          "mask: changing a real source token does change the logits");
    free(before);
    transformer_free(&m);
}

// Adam worked out by hand (beta1 0.9, beta2 0.98, eps 1e-9) on three numbers:
// step 1, lr 0.01, g = (0.1, -0.2, 0):
//   m = 0.1 g = (0.01, -0.02, 0),  v = 0.02 g^2 = (2e-4, 8e-4, 0)
//   m/(1-0.9) = (0.1, -0.2, 0),   sqrt(v/(1-0.98)) = (0.1, 0.2, 0)
//   theta -= 0.01 * (0.1/(0.1+1e-9), -0.2/(0.2+1e-9), 0/(0+1e-9))
//   (0.5, -1, 2) -> (0.4900000001, -0.99000000005, 2)
// step 2, lr 0.02, g = (0.3, 0.1, -0.4):
//   m = (0.039, -0.008, -0.04),  v = (0.001996, 0.000984, 0.0032)
//   m/0.19 = (0.205263158, -0.042105263, -0.210526316)
//   sqrt(v/0.0396) = (0.224508442, 0.157634117, 0.284267622)
//   theta -> (0.471714437615, -0.984657845813, 2.014811839189)
static void test_adam_by_hand(void) {
    TransformerConfig config = small_config();
    Transformer m;
    transformer_build(&m, &config, 1);
    real *p = m.params_memory, *g = m.grads_memory;
    p[0] = 0.5f;
    p[1] = -1.0f;
    p[2] = 2.0f;
    transformer_zero_grad(&m);
    g[0] = 0.1f;
    g[1] = -0.2f;
    g[2] = 0.0f;
    adam_update(&m, 0.01);
    double after1[3] = { 0.4900000001, -0.99000000005, 2.0 };
    double err1 = fmax(fmax(fabs(p[0] - after1[0]), fabs(p[1] - after1[1])),
                       fabs(p[2] - after1[2]));
    g[0] = 0.3f;
    g[1] = 0.1f;
    g[2] = -0.4f;
    adam_update(&m, 0.02);
    double after2[3] = { 0.471714437615, -0.984657845813, 2.014811839189 };
    double err2 = fmax(fmax(fabs(p[0] - after2[0]), fabs(p[1] - after2[1])),
                       fabs(p[2] - after2[2]));
    check(err1 < 1e-6 && err2 < 1e-6,
          "adam: two steps match the hand-worked values (errors %.1e, %.1e)", err1, err2);
    check(m.adam_step == 2, "adam: counts its steps");
    transformer_free(&m);
}

static void test_schedule(void) {
    // lrate = d_model^-0.5 min(step^-0.5, step warmup^-1.5), d_model 512, warmup 4000:
    // step 1: 512^-0.5 * 4000^-1.5 = 1.7469281074e-07; step 100: 100x that;
    // step 4000 (the peak): (512*4000)^-0.5 = 6.9877124297e-04; step 16000: half the peak
    long steps[4] = { 1, 100, 4000, 16000 };
    double expected[4] = { 1.7469281074e-07, 1.7469281074e-05, 6.9877124297e-04, 3.4938562148e-04 };
    double worst = 0;
    for (int i = 0; i < 4; i++)
        worst = fmax(worst,
                     fabs(transformer_learning_rate(steps[i], 512, 4000, 1.0) / expected[i] - 1));
    check(worst < 1e-9, "schedule: the §5.3 formula at steps 1, 100, 4000, 16000 (rel error %.1e)",
          worst);
    double peak = transformer_learning_rate(4000, 512, 4000, 1.0);
    check(transformer_learning_rate(3999, 512, 4000, 1.0) < peak &&
          transformer_learning_rate(4001, 512, 4000, 1.0) < peak,
          "schedule: peaks at the warm-up step");
    check(fabs(transformer_learning_rate(10, 64, 5, 2.0)
               / transformer_learning_rate(10, 64, 5, 1.0) - 2) < 1e-12,
          "schedule: the factor scales the curve");
}

// A few hundred Adam steps on one tiny batch must fit it: the model can learn.
static void test_learning(void) {
    TransformerConfig config = small_config();
    config.n_layers = 1;
    config.d_model = 32;
    config.d_ff = 64;
    config.dropout = 0.0f;
    config.label_smoothing = 0.0f;
    Transformer m;
    transformer_build(&m, &config, 3);
    int src_len[4] = { 5, 7, 3, 6 }, tgt_len[4] = { 6, 8, 4, 7 };
    Rng rng;
    rng_seed(&rng, 4);
    static TestBatch tb;
    make_test_batch(&tb, 4, 7, 8, src_len, tgt_len, config.vocab_size, &rng);
    // the copy task: the target is the source
    for (int b = 0; b < 4; b++) {
        for (int t = 0; t < tgt_len[b]; t++) {
            int word = t < src_len[b] ? tb.src[b * 7 + t] : TOKEN_EOS;
            tb.tgt_out[b * 8 + t] = word;
            tb.tgt_in[b * 8 + t] = t == 0 ? TOKEN_BOS : tb.tgt_out[b * 8 + t - 1];
        }
    }
    real first = 0, last = 0;
    int threads = one_thread();
    for (int step = 1; step <= 300; step++) {
        real loss = transformer_forward(&m, &tb.batch);
        if (step == 1)
            first = loss;
        last = loss;
        transformer_zero_grad(&m);
        transformer_backward(&m, &tb.batch);
        // factor 0.5: at 1.0 the loss spikes after step 100 (to 0.14..0.43 in some
        // builds), so whether step 300 is below 0.02 would hang on rounding
        adam_update(&m, transformer_learning_rate(step, config.d_model, 30, 0.5));
    }
    set_threads(threads);
    check(last < 0.02,
          "learning: 300 steps on a 4-sentence copy batch take the loss from %.3f to %.5f",
          first, last);
    transformer_free(&m);
}


// The memory of the vector loops starts on cache lines (CACHE_LINE): what the
// allocation helpers give, and every activation and gradient tensor of a model
// whose sizes are not whole lines (d_model 12, a batch of 3 x 5 x 7).
static int on_line(const void *p) {
    return (uintptr_t)p % CACHE_LINE == 0;
}

static void test_aligned_memory(void) {
    int aligned = 1, zeroed = 1;
    // numbers: a few, exactly one line and two lines, and more, in whole lines or not
    size_t sizes[] = { 1, 5, CACHE_LINE / sizeof(real), 2 * CACHE_LINE / sizeof(real), 17, 53,
                       161, 485 };
    for (size_t i_size = 0; i_size < sizeof sizes / sizeof *sizes; i_size++) {
        size_t n = sizes[i_size];
        real *z = arena_calloc(n, "test");
        aligned &= on_line(z);
        for (size_t i = 0; i < n; i++) {
            zeroed &= z[i] == 0;
            z[i] = 1;   // all n are there to write (the sanitizer builds would see otherwise)
        }
        arena_free(z);
    }
    check(aligned && zeroed,
          "memory: arena_calloc gives addresses on %d-byte lines, and its numbers are 0",
          CACHE_LINE);

    TransformerConfig c = small_config();
    c.d_model = 12;
    c.n_heads = 3;
    c.d_ff = 20;
    c.vocab_size = 13;
    Transformer m;
    transformer_build(&m, &c, 5);
    Rng rng;
    rng_seed(&rng, 5);
    TestBatch tb;
    make_test_batch(&tb, 3, 5, 7, (int[]){ 5, 3, 4 }, (int[]){ 7, 2, 6 }, c.vocab_size, &rng);
    transformer_forward(&m, &tb.batch);
    // every tensor of the activations and of their gradients (those that have one): the
    // structs hold only pointers, the layers' structs too
    int tensors = 0, lined = 0;
    const ActivationTensors *sets[2] = { &m.acts, &m.grads_acts };
    for (int set = 0; set < 2; set++) {
        const ActivationTensors *a = sets[set];
        real *top[9] = { a->enc_embedded, a->enc_emb_mask, a->enc_x0, a->dec_embedded,
                         a->dec_emb_mask, a->dec_x0, a->logits, a->probs, a->token_loss };
        for (int i = 0; i < 9; i++) {
            if (!top[i])
                continue;
            tensors++;
            lined += on_line(top[i]);
        }
        for (int l = 0; l < c.n_layers; l++) {
            const void *layers[2] = { &a->enc[l], &a->dec[l] };
            size_t counts[2] = { sizeof(EncoderLayerActs) / sizeof(real *),
                                 sizeof(DecoderLayerActs) / sizeof(real *) };
            for (int k = 0; k < 2; k++)
                for (size_t i = 0; i < counts[k]; i++) {
                    real *p;
                    memcpy(&p, (const char *)layers[k] + i * sizeof p, sizeof p);
                    if (!p)
                        continue;
                    tensors++;
                    lined += on_line(p);
                }
        }
    }
    _Static_assert(sizeof(EncoderLayerActs) % sizeof(real *) == 0, "pointers only");
    _Static_assert(sizeof(DecoderLayerActs) % sizeof(real *) == 0, "pointers only");
    real *arenas[] = { m.params_memory, m.grads_memory, m.adam_m, m.adam_v, m.positional_encoding };
    for (size_t i = 0; i < sizeof arenas / sizeof *arenas; i++) {
        tensors++;
        lined += on_line(arenas[i]);
    }
    check(lined == tensors && tensors > 100,
          "memory: %d of %d activation and gradient tensors and parameter-sized arrays "
          "start on a line (d_model 12, batch 3 x 5 x 7)", lined, tensors);
    transformer_free(&m);
}


// The attention softmax: the visible keys' probabilities sum to 1, the
// masked ones are exactly 0 whatever their scores, and a row with no visible
// key is all 0 (not NaN).
static void test_softmax_visible(void) {
    real p[37];
    int ok = 1;
    for (int visible = 1; visible <= 37; visible += 4) {
        for (int j = 0; j < 37; j++) p[j] = (real)(j % 7) - 3 + (j >= visible ? 1000 : 0);
        softmax_visible(p, visible, 37);
        double sum = 0;
        for (int j = 0; j < visible; j++) {
            sum += p[j];
            ok &= p[j] > 0;
        }
        for (int j = visible; j < 37; j++) ok &= p[j] == 0;
        ok &= fabs(sum - 1) < 1e-6;
    }
    for (int j = 0; j < 37; j++) p[j] = 1;
    softmax_visible(p, 0, 37);
    for (int j = 0; j < 37; j++) ok &= p[j] == 0;
    check(ok, "attention softmax: visible keys sum to 1, masked keys (scored 1000 higher) get "
          "exactly 0, no visible key gives a row of 0");
}

// Every parallel loop gives each output to one thread and sums in a fixed
// order, so one thread and several must agree to the bit, dropout included.
static void test_thread_determinism(void) {
#ifdef _OPENMP
    TransformerConfig config = small_config();
    int src_len[3] = { 6, 3, 5 }, tgt_len[3] = { 4, 7, 2 };
    Rng rng;
    rng_seed(&rng, 8);
    static TestBatch tb;
    make_test_batch(&tb, 3, 6, 7, src_len, tgt_len, config.vocab_size, &rng);
    real *grads[2];
    real losses[2];
    int threads[2] = { 1, 3 };
    for (int k = 0; k < 2; k++) {
        omp_set_num_threads(threads[k]);
        Transformer m;
        transformer_build(&m, &config, 21);
        for (int step = 1; step <= 3; step++) {
            losses[k] = transformer_forward(&m, &tb.batch);
            transformer_zero_grad(&m);
            transformer_backward(&m, &tb.batch);
            adam_update(&m, 1e-3);
        }
        grads[k] = checked_calloc(m.num_parameters, sizeof(real), "grads");
        memcpy(grads[k], m.grads_memory, m.num_parameters * sizeof(real));
        if (k == 1) {
            check(losses[0] == losses[1]
                  && memcmp(grads[0], grads[1], m.num_parameters * sizeof(real)) == 0,
                  "threads: 1 and 3 OpenMP threads give bit-identical losses and gradients "
                  "(dropout on)");
        }
        transformer_free(&m);
    }
    free(grads[0]);
    free(grads[1]);
    omp_set_num_threads(omp_get_num_procs());
#else
    printf("     (built without OpenMP: one thread only, nothing to compare)\n");
#endif
}

static void test_dropout_training_and_evaluation(void) {
    TransformerConfig config = small_config();
    config.dropout = 0.5f;
    Transformer m;
    transformer_build(&m, &config, 2);
    int src_len[2] = { 4, 3 }, tgt_len[2] = { 3, 5 };
    Rng rng;
    rng_seed(&rng, 6);
    static TestBatch tb;
    make_test_batch(&tb, 2, 4, 5, src_len, tgt_len, config.vocab_size, &rng);
    m.training = 0;
    real eval1 = transformer_forward(&m, &tb.batch), eval2 = transformer_forward(&m, &tb.batch);
    m.training = 1;
    real train1 = transformer_forward(&m, &tb.batch), train2 = transformer_forward(&m, &tb.batch);
    size_t n = (size_t)2 * 4 * config.d_model, zeros = 0;
    for (size_t i = 0; i < n; i++) zeros += m.acts.enc_emb_mask[i] == 0;
    check(eval1 == eval2, "dropout: evaluation is deterministic (no dropout)");
    check(train1 != train2, "dropout: training draws new masks each pass");
    check(zeros > n / 4 && zeros < 3 * n / 4,
          "dropout: P_drop 0.5 drops %zu of %zu embedding elements", zeros, n);
    transformer_free(&m);
}

// ============================================================================
// §3.5 and §3.2.1 worked by hand: the sinusoids' formula and their rotation
// property on positional_encoding_init's table; a 2x2 attention, forward and
// backward, with both masks
// ============================================================================

// The most an entry of row pos of positional_encoding_init's table may differ
// from the exact sin or cos, for the tests below. The table computes the angle
// pos / 10000^(2i/d_model) in double: 2i/d_model rounds (relative error u =
// 2^-53, times ln 10000 * 2i/d_model < 9.3 through pow's exponent), pow adds
// under 2u and the division u, so the angle is within 12.3u of its exact value
// relative, i.e. 12.3u pos absolute, and its sine or cosine (derivative <= 1,
// one more ulp for the function itself) within 12.3u pos + u. The bound takes
// 16u (1 + pos) = 8 DBL_EPSILON (1 + pos). In float the double is then rounded
// to float, at most half an ulp of a number of magnitude <= 1, 2^-25; the
// bound allows one ulp, 2^-24 (so a correctly rounded table measures about 0.5).
static double pe_tolerance(int pos) {
    return (sizeof(real) == sizeof(float) ? FLT_EPSILON / 2 : 0) + 8 * DBL_EPSILON * (1 + pos);
}

// The worst |PE(pos, d) - exact| / pe_tolerance(pos) over a (max_len, C) table,
// with exact PE(pos, 2i) = sin(pos / divisor[i]), PE(pos, 2i+1) = cos(pos /
// divisor[i]) in long double.
static double pe_worst_error(const real *pe, int max_len, int C, const long double *divisor) {
    double worst = 0;
    for (int pos = 0; pos < max_len; pos++) {
        for (int d = 0; d < C; d++) {
            long double angle = pos / divisor[d / 2];
            long double exact = d % 2 == 0 ? sinl(angle) : cosl(angle);
            double error = (double)fabsl((long double)pe[(size_t)pos * C + d] - exact)
                           / pe_tolerance(pos);
            if (!(error <= worst))
                worst = error;   // NaN counts as the worst
        }
    }
    return worst;
}

// §3.5:  PE(pos, 2i) = sin(pos / 10000^(2i/d_model)),
//        PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).
// d_model 8 by hand: 10000^(2i/8) = 10^i, so the four pairs turn at 1, 1/10,
// 1/100 and 1/1000 radians per position: PE(pos) = (sin pos, cos pos,
// sin(pos/10), cos(pos/10), sin(pos/100), cos(pos/100), sin(pos/1000),
// cos(pos/1000)), e.g. PE(0) = (0, 1, 0, 1, 0, 1, 0, 1) exactly. An odd
// d_model (7) ends with a sine that has no cosine: PE(pos, 6) = sin(pos /
// 10000^(6/7)), and the table's rows are 7 numbers (a guard after the table
// stays untouched). d_model 512 (the base model's), every entry of 256
// positions. Exact values in long double; the tolerance is pe_tolerance's.
static void test_positional_encoding_formula(void) {
    enum { LEN8 = 120, LEN7 = 60, LEN512 = 256 };
    long double tens[4] = { 1, 10, 100, 1000 }, divisor[256];
    real pe8[LEN8 * 8];
    positional_encoding_init(pe8, LEN8, 8);
    double worst8 = pe_worst_error(pe8, LEN8, 8, tens);
    int zero_row = 1;
    for (int d = 0; d < 8; d++) zero_row &= pe8[d] == (d % 2 ? 1 : 0);
    check(worst8 < 1 && zero_row,
          "positional encoding (§3.5), d_model 8: PE(pos) = (sin pos, cos pos, sin pos/10, "
          "cos pos/10, ..., cos pos/1000) at positions 0..%d, PE(0) = (0, 1, 0, 1, ...) "
          "exactly (worst error %.2f of the tolerance)", LEN8 - 1, worst8);
    real pe7[LEN7 * 7 + 1];
    pe7[LEN7 * 7] = 12345;   // the guard
    for (int i = 0; i < 4; i++) divisor[i] = powl(10000.0L, 2.0L * i / 7);
    positional_encoding_init(pe7, LEN7, 7);
    double worst7 = pe_worst_error(pe7, LEN7, 7, divisor);
    check(worst7 < 1 && pe7[LEN7 * 7] == 12345,
          "positional encoding (§3.5), odd d_model 7: sin and cos pairs, then "
          "PE(pos, 6) = sin(pos / 10000^(6/7)) alone, rows of 7, nothing written past the table "
          "(worst error %.2f of the tolerance)", worst7);
    real *pe512 = checked_calloc((size_t)LEN512 * 512, sizeof(real), "test");
    for (int i = 0; i < 256; i++) divisor[i] = powl(10000.0L, 2.0L * i / 512);
    positional_encoding_init(pe512, LEN512, 512);
    double worst512 = pe_worst_error(pe512, LEN512, 512, divisor);
    check(worst512 < 1, "positional encoding (§3.5), d_model 512: all %d x 512 entries against "
          "sin and cos in long double (worst error %.2f of the tolerance, %.1e at position %d)",
          LEN512, worst512, pe_tolerance(LEN512 - 1), LEN512 - 1);
    free(pe512);
}

// The worst |PE(pos+k) - M PE(pos)| / (3 pe_tolerance(pos+k)) over the given
// positions, where M is block-diagonal with the 2x2 rotations
//     [ c_i  s_i ]      c_i = cos(w_i k'),  s_i = sin(w_i k'),  w_i = 10000^(-2i/C),
//     [-s_i  c_i ]
// on each pair (2i, 2i+1), one matrix for every pos; k' = k gives M_k.
static double pe_rotation_error(const real *pe, int C, int k, int k_prime, const int *positions,
                                int count) {
    long double c[256], s[256];
    for (int i = 0; 2 * i < C; i++) {
        long double w = powl(10000.0L, -2.0L * i / C);
        c[i] = cosl(w * k_prime);
        s[i] = sinl(w * k_prime);
    }
    double worst = 0;
    for (int n = 0; n < count; n++) {
        int pos = positions[n];
        const real *from = pe + (size_t)pos * C, *to = pe + (size_t)(pos + k) * C;
        for (int i = 0; 2 * i + 1 < C; i++) {
            long double x = from[2 * i], y = from[2 * i + 1];
            long double rx = c[i] * x + s[i] * y, ry = -s[i] * x + c[i] * y;
            double error = (double)fmaxl(fabsl(rx - to[2 * i]), fabsl(ry - to[2 * i + 1]))
                           / (3 * pe_tolerance(pos + k));
            if (!(error <= worst))
                worst = error;
        }
    }
    return worst;
}

// §3.5's reason for sinusoids, on the table: "for any fixed offset k,
// PE(pos+k) can be represented as a linear function of PE(pos)", namely M_k
// (the rotations above, transformer.c's §3.5 derives them), the same M_k at
// every position. d_model 64, offsets k = 1, 2, 7, 50 and positions 0, 3, 31,
// 100, 149. Tolerance: each table entry is within pe_tolerance of exact and a
// rotation's row has |c| + |s| <= sqrt 2, so M_k PE(pos) from the table is
// within sqrt 2 pe_tolerance(pos) of the exact PE(pos+k), and the table's
// PE(pos+k) within pe_tolerance(pos+k): under 3 pe_tolerance(pos+k) apart
// (at pos + k = 199: 1.8e-7 in float, 1.1e-12 in double). To show
// that the check can fail, M_{k+1} must miss PE(pos+k) by far more.
static void test_positional_encoding_rotation(void) {
    enum { C = 64, LEN = 200 };
    real *pe = checked_calloc((size_t)LEN * C, sizeof(real), "test");
    positional_encoding_init(pe, LEN, C);
    int offsets[4] = { 1, 2, 7, 50 }, positions[5] = { 0, 3, 31, 100, 149 };
    double worst = 0, wrong = INFINITY;
    for (int n = 0; n < 4; n++) {
        worst = fmax(worst, pe_rotation_error(pe, C, offsets[n], offsets[n], positions, 5));
        wrong = fmin(wrong, pe_rotation_error(pe, C, offsets[n], offsets[n] + 1, positions, 5));
    }
    check(worst < 1 && wrong > 1000,
          "positional encoding (§3.5): PE(pos+k) = M_k PE(pos), M_k block-diagonal 2x2 "
          "rotations by w_i k, the same for pos 0, 3, 31, 100, 149, at k = 1, 2, 7, 50, "
          "d_model %d (worst error %.2f of the tolerance; M_{k+1} misses by %.1e times it)",
          C, worst, wrong);
    free(pe);
}

// The worst |got - expected| / max(1, |expected|) of n numbers; *exact is
// cleared if one expected to be exactly 0 (or, with ones, exactly 1) is not.
static double by_hand_error(const real *got, const double *expected, int n, int ones, int *exact) {
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double error = fabs((double)got[i] - expected[i]) / fmax(1, fabs(expected[i]));
        if (!(error <= worst))
            worst = error;
        if ((expected[i] == 0 || (ones && expected[i] == 1)) && (double)got[i] != expected[i])
            *exact = 0;
    }
    return worst;
}

// Scaled dot-product attention (eq. 1) and attention_backward worked by hand:
// one sentence, one head, d_k = d_model = 2, so 1/sqrt(d_k) = 1/sqrt 2; with
// L = ln 3 and a = sqrt(2) L,
//     keys     k_0 = (0, 0),  k_1 = (1, 0)
//     queries  q_0 = (a, 0),  q_1 = (-a, a)
//     values   v_0 = (4, 0),  v_1 = (0, 4)
// Scores s_ij = q_i . k_j / sqrt 2:  s_0 = (0, a / sqrt 2) = (0, ln 3),  s_1 = (0, -ln 3).
// Softmax:  p_0 = (e^0, e^ln 3) / (1 + 3) = (1/4, 3/4),  p_1 = (1, 1/3) / (4/3) = (3/4, 1/4).
// out_i = sum_j p_ij v_j:  out_0 = (1, 3),  out_1 = (3, 1).
// Backward, from dout_0 = (1, 0), dout_1 = (0, 1), by attention_backward's formulas:
//     dp_ij = dout_i . v_j:        dp_0 = (4, 0),  dp_1 = (0, 4)
//     dv_j = sum_i p_ij dout_i:    dv_0 = 1/4 (1, 0) + 3/4 (0, 1) = (1/4, 3/4),  dv_1 = (3/4, 1/4)
//     ds_ij = p_ij (dp_ij - sum_j' p_ij' dp_ij'), and both sums are 1:
//                                  ds_0 = (1/4 (4 - 1), 3/4 (0 - 1)) = (3/4, -3/4)
//                                  ds_1 = (3/4 (0 - 1), 1/4 (4 - 1)) = (-3/4, 3/4)
//     dq_i = sum_j ds_ij k_j / sqrt 2 = ds_i1 (1, 0) / sqrt 2:
//                                  dq_0 = (-3/(4 sqrt 2), 0),  dq_1 = (3/(4 sqrt 2), 0)
//     dk_j = sum_i ds_ij q_i / sqrt 2, with a / sqrt 2 = L:
//                                  dk_0 = 3/4 ((a, 0) - (-a, a)) / sqrt 2 = (3L/2, -3L/4)
//                                  dk_1 = 3/4 (-(a, 0) + (-a, a)) / sqrt 2 = (-3L/2, 3L/4)
// The padding mask, key_len 1: both queries see key 0 alone, p_i = (1, 0)
// exactly and out_i = v_0 = (4, 0); ds_i0 = 1 (dp_i0 - dp_i0) = 0 and
// ds_i1 = 0, so dq = dk = 0 exactly, dv_0 = dout_0 + dout_1 = (1, 1) and the
// masked key's dv_1 = 0 exactly.
// The causal mask: query 0 sees key 0 alone, p_0 = (1, 0) exactly, out_0 =
// (4, 0) and ds_0 = (0, 0); query 1 sees both, as before. So dq_0 = 0 exactly,
// dq_1 = (3/(4 sqrt 2), 0); dk_j = ds_1j q_1 / sqrt 2: dk_0 = (3L/4, -3L/4),
// dk_1 = (-3L/4, 3L/4); dv_0 = (1, 0) + 3/4 (0, 1) = (1, 3/4), dv_1 =
// 1/4 (0, 1) = (0, 1/4).
// Decoding's shape, one query per sentence (the fast path's attention_one_query_fast):
// sentence 0 is query 0 over both keys, p = (1/4, 3/4), out = (1, 3); sentence
// 1 the same with key_len 1, p = (1, 0), out = (4, 0).
// attention and W^O in the fused (T, 3C) layout of self-attention, row t =
// [q_t | k_t | v_t], causal, with W^O = [[0, 1], [1, 0]] (swaps the two
// columns) and b^O = (1/2, -1/2): out_i = (1/2 + heads_i1, -1/2 + heads_i0),
// heads = the causal case's out (4, 0) and (3, 1): (1/2, 7/2) and (3/2, 5/2).
// Every number expected to be exactly 0 (and every probability expected to be
// exactly 1) must come out exact; the others within 16 ulp of `real` (of
// max(1, |x|)): a and 1/sqrt 2 are rounded, the score is their product, and
// exp, the sum and the division each round again, a few ulp in all.
// Through Part I's loops and, where a program plugs in a fast path
// (fast_path_switch, set by lab/test_lab.c), through the fast path too.
typedef struct {
    const char *name;
    int key_len, causal;
    double att[4], out[4], dq[4], dk[4], dv[4];   // (2 queries or keys) x 2
} AttentionByHand;

// attention_forward, called through a pointer: gcc, inlining it into the test below, warns
// that the 4-number arrays may be read past their end (it cannot bound the cases' key_len).
static void (*volatile by_hand_attention_forward)(real *, real *, const real *, const real *,
                                                  const real *, const int *, int,
                                                  AttentionShape) = attention_forward;

static void test_attention_by_hand(void) {
    const double L = log(3.0), r = 1 / sqrt(2.0),
                 tolerance = 16 * (sizeof(real) == sizeof(float) ? FLT_EPSILON : DBL_EPSILON);
    real a = (real)(sqrt(2.0) * L);
    real q[4] = { a, 0, -a, a }, k[4] = { 0, 0, 1, 0 }, v[4] = { 4, 0, 0, 4 },
         dout[4] = { 1, 0, 0, 1 };
    AttentionByHand cases[3] = {
        { "no mask", 2, 0, { 0.25, 0.75, 0.75, 0.25 }, { 1, 3, 3, 1 },
          { -0.75 * r, 0, 0.75 * r, 0 }, { 1.5 * L, -0.75 * L, -1.5 * L, 0.75 * L },
          { 0.25, 0.75, 0.75, 0.25 } },
        { "padding mask, key_len 1", 1, 0, { 1, 0, 1, 0 }, { 4, 0, 4, 0 },
          { 0, 0, 0, 0 }, { 0, 0, 0, 0 }, { 1, 1, 0, 0 } },
        { "causal mask", 2, 1, { 1, 0, 0.75, 0.25 }, { 4, 0, 3, 1 },
          { 0, 0, 0.75 * r, 0 }, { 0.75 * L, -0.75 * L, -0.75 * L, 0.75 * L },
          { 1, 0.75, 0, 0.25 } },
    };
    const int paths = fast_path_switch ? 2 : 1;
    const char *path_names[2] = { "Part I", "the fast path" };
    for (int path = 0; path < paths; path++) {
        if (fast_path_switch)
            fast_path_switch(path);
        for (int n = 0; n < 3; n++) {
            const AttentionByHand *c = &cases[n];
            real out[4], att[4], dq[4] = { 0 }, dk[4] = { 0 }, dv[4] = { 0 };
            int key_len = c->key_len, exact = 1;
            AttentionShape shape = { 1, 2, 2, 2, 1, 2, 2 };
            by_hand_attention_forward(out, att, q, k, v, &key_len, c->causal, shape);
            attention_backward(dq, dk, dv, dout, att, q, k, v, shape);
            double worst = fmax(by_hand_error(att, c->att, 4, 1, &exact),
                                by_hand_error(out, c->out, 4, 0, &exact));
            worst = fmax(worst, by_hand_error(dq, c->dq, 4, 0, &exact));
            worst = fmax(worst, fmax(by_hand_error(dk, c->dk, 4, 0, &exact),
                                     by_hand_error(dv, c->dv, 4, 0, &exact)));
            check(worst <= tolerance && exact,
                  "attention by hand, 2 queries x 2 keys (%s, %s): p = (%.7g, %.7g; %.7g, %.7g), "
                  "out, dq, dk, dv as worked out (worst %.1e, tolerance %.0e), its 0s and 1s exact",
                  path_names[path], c->name, (double)att[0], (double)att[1], (double)att[2],
                  (double)att[3], worst, tolerance);
        }
        // decoding's shape: one query per sentence
        real q1[4] = { a, 0, a, 0 }, k1[8] = { 0, 0, 1, 0, 0, 0, 1, 0 },
             v1[8] = { 4, 0, 0, 4, 4, 0, 0, 4 };
        real out1[4], att1[4];
        int key_len1[2] = { 2, 1 }, exact1 = 1;
        double expected_att1[4] = { 0.25, 0.75, 1, 0 }, expected_out1[4] = { 1, 3, 4, 0 };
        AttentionShape one_query = { 2, 1, 2, 2, 1, 2, 2 };
        by_hand_attention_forward(out1, att1, q1, k1, v1, key_len1, 0, one_query);
        double worst1 = fmax(by_hand_error(att1, expected_att1, 4, 1, &exact1),
                             by_hand_error(out1, expected_out1, 4, 0, &exact1));
        check(worst1 <= tolerance && exact1,
              "attention by hand, one query per sentence (%s): p = (1/4, 3/4) and, key_len 1, "
              "(1, 0) exactly; out (1, 3) and (4, 0) (worst %.1e)", path_names[path], worst1);
        // self-attention's fused layout, causal: attention_forward, then W^O and b^O
        real qkv[12] = { a, 0, 0, 0, 4, 0,   -a, a, 1, 0, 0, 4 }, out_w[4] = { 0, 1, 1, 0 },
             out_b[2] = { 0.5, -0.5 };
        real out2[4], att2[4], heads[4];
        int key_len2 = 2, exact2 = 1;
        double expected_out2[4] = { 0.5, 3.5, 1.5, 2.5 };
        AttentionParams weights = { NULL, NULL, out_w, out_b };
        AttentionShape fused = { 1, 2, 2, 2, 1, 6, 6 };
        attention_forward(heads, att2, qkv, qkv + 2, qkv + 4, &key_len2, 1, fused);
        linear_forward(out2, heads, weights.out_w, weights.out_b, 2, 2, 2);
        double worst2 = fmax(by_hand_error(att2, cases[2].att, 4, 1, &exact2),
                             by_hand_error(out2, expected_out2, 4, 0, &exact2));
        check(worst2 <= tolerance && exact2,
              "attention and W^O by hand (%s): the causal case read from a fused (T, 3C) q|k|v, "
              "then W^O and b^O: out (1/2, 7/2; 3/2, 5/2) (worst %.1e)", path_names[path], worst2);
    }
    if (fast_path_switch)
        fast_path_switch(1);
}

// ============================================================================
// Decoding (§6.1): the decoder's steps, batched greedy, beam search
// ============================================================================

// A small model trained for a few hundred steps on the copy task, so that
// its outputs end with </s> (an untrained one mostly runs to the length limit).
static void train_small_copy_model(Transformer *m, TransformerConfig config, int steps,
                                   int max_length) {
    transformer_build(m, &config, 11);
    Dataset train, valid;
    memset(&train, 0, sizeof train);
    memset(&valid, 0, sizeof valid);
    task_generate(&train, &valid, TASK_COPY, config.vocab_size - NUM_SPECIAL_TOKENS, 1, max_length,
                  400, 0, 5);
    Rng rng;
    rng_seed(&rng, 7);
    EpochPlan plan;
    memset(&plan, 0, sizeof plan);
    BatchBuffer bb;
    memset(&bb, 0, sizeof bb);
    int next = 0, threads = one_thread();
    for (int step = 1; step <= steps; step++) {
        if (next == plan.num_spans) {
            epoch_plan_make(&plan, &train, 120, &rng);
            next = 0;
        }
        BatchSpan span = plan.spans[next++];
        batch_fill(&bb, &train, plan.order + span.start, span.count);
        transformer_forward(m, &bb.batch);
        transformer_zero_grad(m);
        transformer_backward(m, &bb.batch);
        adam_update(m, transformer_learning_rate(step, config.d_model, 30,
                                                 3e-3 * sqrt(config.d_model * 30.0)));
    }
    set_threads(threads);
    free(plan.order);
    free(plan.spans);
    batch_buffer_free(&bb);
    dataset_free(&train);
    dataset_free(&valid);
}

// The most likely output token among the logits: never <pad> or <s>, nor </s> unless may_end; the
// lowest id of a tie.
static int most_likely_output(const real *logits, int V, int may_end) {
    int best = may_end ? TOKEN_EOS : TOKEN_EOS + 1;
    for (int token = best + 1; token < V; token++) {
        if (logits[token] > logits[best])
            best = token;
    }
    return best;
}

// Greedy decoding by transformer_forward: the whole model, encoder too, re-run on the prefix at
// every step.
static int forward_greedy(Transformer *m, int *out, const int *src, int src_len) {
    int limit = transformer_decode_limit(m, src_len), V = m->config.vocab_size, n = 0;
    int *tgt_in = checked_calloc(limit, sizeof(int), "test"),
        *tgt_out = checked_calloc(limit, sizeof(int), "test");
    tgt_in[0] = TOKEN_BOS;
    m->training = 0;
    for (int t = 0; t < limit; t++) {
        int T = t + 1, S = src_len;
        Batch b = { 1, S, T, (int *)src, &S, tgt_in, tgt_out, &T };
        transformer_forward(m, &b);
        int y = most_likely_output(m->acts.logits + (size_t)t * V, V, t > 0 || src_len <= 1);
        if (y == TOKEN_EOS)
            break;
        out[n++] = y;
        if (t + 1 < limit)
            tgt_in[t + 1] = y;
    }
    free(tgt_in);
    free(tgt_out);
    return n;
}

static void random_source(int *src, int n, int vocab, Rng *rng) {
    for (int i = 0; i < n - 1; i++)
        src[i] = NUM_SPECIAL_TOKENS + rng_below(rng, vocab - NUM_SPECIAL_TOKENS);
    src[n - 1] = TOKEN_EOS;
}

static TransformerConfig decode_config(void) {
    TransformerConfig c = small_config();
    c.n_layers = 2;
    c.d_model = 32;
    c.d_ff = 64;
    c.n_heads = 4;
    c.vocab_size = 10;
    c.max_len = 20;
    return c;
}

// The copy model of decode_config trained 300 steps on sentences of up to 6
// words: test_decoding decodes with it, the command-line tests save it as a
// checkpoint. The same steps give the same model, so it is trained once, on
// first use (with OpenMP on a busy machine the steps take seconds), and kept
// to the end of the run.
static Transformer *trained_copy_model(void) {
    static Transformer model;
    static int trained = 0;
    if (!trained)
        train_small_copy_model(&model, decode_config(), 300, 6);
    trained = 1;
    return &model;
}

// The decoder's step logits against the full forward pass, position by position, bit for bit
// (the same sums in the same order); and after beam search's reorder, a row continues its
// parent's inputs.
static void test_decoder_logits(Transformer *m, Rng *rng) {
    int S = 5, T = 9, V = m->config.vocab_size;
    int src[5], tgt_in[9], tgt_out[9] = { 0 };
    random_source(src, S, V, rng);
    tgt_in[0] = TOKEN_BOS;
    for (int t = 1; t < T; t++)
        tgt_in[t] = NUM_SPECIAL_TOKENS + rng_below(rng, V - NUM_SPECIAL_TOKENS);
    Batch b = { 1, S, T, src, &S, tgt_in, tgt_out, &T };
    m->training = 0;
    transformer_forward(m, &b);
    real *full = checked_calloc((size_t)T * V, sizeof(real), "test");
    memcpy(full, m->acts.logits, (size_t)T * V * sizeof(real));
    Decoder decoder;
    decoder_begin(&decoder, m, src, &S, 1, S, 2, T);   // two rows of the same source
    // transformer.c's products: the same bits, with either decoder; the fast path's
    // (lab/test_lab.c): within 1e-5
    double tolerance = fast_path.linear_forward ? 1e-5 : 0, worst[2] = { 0, 0 }, scale = 0;
    for (int t = 0; t < T; t++) {
        if (t == 4) {
            int parent[2] = { 1, 0 };   // the rows swap: from here row 1 continues tgt_in
            decoder_reorder(&decoder, parent, 2, 4);
        }
        // the other: 4 4 4 ...
        int row = t < 4 ? 0 : 1, tokens[2] = { NUM_SPECIAL_TOKENS, NUM_SPECIAL_TOKENS };
        tokens[row] = tgt_in[t];
        decoder_step(&decoder, m, tokens, t, 2);
        for (int v = 0; v < V; v++) {
            double difference = fabs((double)decoder.logits[(size_t)row * V + v] - full[t * V + v]);
            if (!(difference <= worst[row]))
                worst[row] = difference;   // a NaN stays, and fails the check
            scale = fmax(scale, fabs((double)full[t * V + v]));
        }
    }
    check(worst[0] <= tolerance * scale,
          "decode: the decoder's steps give the logits of the full pass at positions 0-3 "
          "(max difference %.1e, largest logit %.2f, tolerance %g of it)", worst[0], scale,
          tolerance);
    check(worst[1] <= tolerance * scale,
          "decode: after decoder_reorder a row continues its parent's inputs: the full pass's "
          "logits at positions 4-%d (max difference %.1e)", T - 1, worst[1]);
    decoder_end(&decoder);
    free(full);
}

static void test_decoding(void) {
    TransformerConfig config = decode_config();
    Transformer *trained = trained_copy_model(), untrained;
    transformer_build(&untrained, &config, 12);
    Rng rng;
    rng_seed(&rng, 31);
    test_decoder_logits(&untrained, &rng);
    Transformer *models[2] = { trained, &untrained };
    const char *names[2] = { "trained", "untrained" };
    for (int k = 0; k < 2; k++) {
        Transformer *m = models[k];
        int V = m->config.vocab_size, B = 6, S = 7, same = 1, ended = 0;
        int src[6 * 7] = { 0 }, src_len[6];
        for (int b = 0; b < B; b++) {
            src_len[b] = 2 + b % 6;
            random_source(src + b * S, src_len[b], V, &rng);
        }
        for (int b = 0; b < B; b++) {
            int by_forward[20], greedy[20];
            int forward_len = forward_greedy(m, by_forward, src + b * S, src_len[b]);
            int greedy_len = transformer_beam_search(m, greedy, NULL, src + b * S, src_len[b], 1,
                                                     0.6);
            same &= greedy_len == forward_len
                    && memcmp(greedy, by_forward, greedy_len * sizeof(int)) == 0;
            ended += greedy_len < transformer_decode_limit(m, src_len[b]);
        }
        check(same, "decode (%s model): greedy decoding, beam search with one beam, gives exactly "
              "the most likely tokens of the whole model re-run on the prefix (%d sentences, %d "
              "ended by </s>)", names[k], B, ended);
        if (k == 0)
            check(ended == B, "decode: the trained copy model ends every output with </s> "
                  "(%d of %d)", ended, B);
    }
    // the trained model copies: greedy and beam 4 both reproduce a source
    int src[5] = { 4, 7, 5, 9, TOKEN_EOS }, S = 5, beam[20], greedy[20];
    int beam_len = transformer_beam_search(trained, beam, NULL, src, S, 4, 0.6);
    int greedy_len = transformer_beam_search(trained, greedy, NULL, src, S, 1, 0.6);
    int beam_copies = beam_len == 4 && memcmp(beam, src, 4 * sizeof(int)) == 0;
    int greedy_copies = greedy_len == 4 && memcmp(greedy, src, 4 * sizeof(int)) == 0;
    check(beam_copies && greedy_copies,
          "decode: the trained copy model, greedy and with beam 4, copies 4 7 5 9 "
          "(greedy %d tokens: %d %d ..., beam %d tokens: %d %d ...)", greedy_len, greedy[0],
          greedy[1], beam_len, beam[0], beam[1]);
    transformer_free(&untrained);
}

// With more beams than hypotheses, beam search is exhaustive: it must find the
// best-scoring output of all, found here by scoring every sequence with the
// full forward pass. Vocabulary: 4 specials + 2 words, max_len 5, so the
// candidates at each step are </s>, <unk>, 4, 5 (not </s> at the first, as
// fairseq's min_len 1): 120 outputs end with </s> and 243 run to the limit,
// 363 in all.
// GNMT's length penalty (Wu et al. 2016, eq. 14), the one §6.1's alpha belongs to, written
// out again here so that the exhaustive test does not check length_penalty against itself:
// lp(Y) = (5 + |Y|)^alpha / (5 + 1)^alpha, |Y| counting </s> as tensor2tensor's beam search
// does (its step i scores the (i + 1)-th token, </s> or not).
static double gnmt_penalty(int length, double alpha) {
    return pow(5.0 + length, alpha) / pow(6.0, alpha);
}

// length_penalty against values worked by hand: (5+7)/6 = 2 and 2^0.6 = 1.5157165665...;
// (5+13)/6 = 3; (5+25)/6 = 5 and 5^0.5 = 2.2360679775; (5+1)/6 = 1 whatever alpha; alpha 0 turns
// it off.
static void test_length_penalty_by_hand(void) {
    struct {
        int length;
        double alpha, by_hand;
    } cases[] = {
        { 7, 0.6, 1.5157165665103982 }, { 13, 1.0, 3.0 }, { 25, 0.5, 2.2360679774997898 },
        { 1, 0.6, 1.0 }, { 40, 0.0, 1.0 },
    };
    int wrong = 0;
    double worst = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double got = length_penalty(cases[i].length, cases[i].alpha),
               error = fabs(got - cases[i].by_hand);
        wrong += error > 1e-12;
        worst = fmax(worst, error);
    }
    check(wrong == 0, "beam: length_penalty is ((5 + |Y|) / 6)^alpha (Wu et al. 2016): "
          "|Y| = 7, alpha 0.6 gives 2^0.6 = 1.5157 and 4 more worked by hand (%d differ, "
          "largest error %.1e)", wrong, worst);
}

static void check_beam_search_exhaustive(Transformer *m, const char *name) {
    m->training = 0;
    int src[4] = { 4, 5, 4, TOKEN_EOS }, S = 4, V = 6, T = 5, B = 243;
    double alpha = 0.6;
    int *srcs = checked_calloc((size_t)B * S, sizeof(int), "test"),
        *src_len = checked_calloc(B, sizeof(int), "test");
    int *tgt_in = checked_calloc((size_t)B * T, sizeof(int), "test"),
        *tgt_out = checked_calloc((size_t)B * T, sizeof(int), "test");
    int *tgt_len = checked_calloc(B, sizeof(int), "test");
    int words[3] = { TOKEN_UNK, 4, 5 };
    for (int b = 0; b < B; b++) { // sequence b: its digits in base 3 pick the words
        memcpy(srcs + b * S, src, sizeof src);
        src_len[b] = S;
        tgt_len[b] = T;
        tgt_in[b * T] = TOKEN_BOS;
        for (int t = 0, code = b; t < T; t++, code /= 3) {
            tgt_out[b * T + t] = words[code % 3];
            if (t + 1 < T)
                tgt_in[b * T + t + 1] = words[code % 3];
        }
    }
    Batch batch = { B, S, T, srcs, src_len, tgt_in, tgt_out, tgt_len };
    transformer_forward(m, &batch);
    double best = -INFINITY, second = -INFINITY;
    int best_b = -1, best_len = -1;
    for (int b = 0; b < B; b++) {
        double log_p = 0;
        for (int t = 0; t <= T; t++) {
            double score;
            int first_with_these_words = b < (int)lround(pow(3, t)); // each output once
            if (t == T) {
                score = log_p / gnmt_penalty(T, alpha); // all positions used, no </s>
            } else {
                const real *z = m->acts.logits + ((size_t)b * T + t) * V;
                double max_z = z[0], sum = 0;
                for (int v = 1; v < V; v++) max_z = fmax(max_z, z[v]);
                for (int v = 0; v < V; v++) sum += exp(z[v] - max_z);
                double log_sum = max_z + log(sum);
                // t words, then </s>
                score = (log_p + z[TOKEN_EOS] - log_sum) / gnmt_penalty(t + 1, alpha);
                if (t == 0)
                    score = -INFINITY;   // min_len 1: a source of words never gets the empty output
                log_p += z[tgt_out[b * T + t]] - log_sum;
            }
            if (!first_with_these_words && t < T)
                continue;
            if (score > best) {
                second = best;
                best = score;
                best_b = b;
                best_len = t;
            } else if (score > second)
                second = score;
        }
    }
    int out[8];
    double score;
    int n = transformer_beam_search(m, out, &score, src, S, 512, alpha);
    int same_tokens = n == best_len && memcmp(out, tgt_out + best_b * T, n * sizeof(int)) == 0;
    check(fabs(score - best) < 1e-4 && (same_tokens || best - second < 1e-4),
          "beam (%s model): 512 beams over all 363 outputs find the best (%d tokens, score %.6f; "
          "by enumeration %d tokens, %.6f)", name, n, score, best_len, best);
    double greedy_score;
    transformer_beam_search(m, out, &greedy_score, src, S, 1, alpha);
    check(score >= greedy_score - 1e-9, "beam (%s model): the wide search scores at least the "
          "greedy output (%.6f >= %.6f)", name, score, greedy_score);
    free(srcs);
    free(src_len);
    free(tgt_in);
    free(tgt_out);
    free(tgt_len);
}

static void test_beam_search_is_exhaustive_when_wide(void) {
    TransformerConfig config = small_config();
    config.vocab_size = 6;
    config.max_len = 5;
    config.d_model = 16;
    config.n_heads = 2;
    Transformer m;
    // untrained: one whose best runs to the limit, one whose best is empty
    uint64_t seeds[2] = { 2, 5 };
    for (int i = 0; i < 2; i++) {
        transformer_build(&m, &config, seeds[i]);
        check_beam_search_exhaustive(&m, i == 0 ? "untrained, seed 2" : "untrained, seed 5");
        transformer_free(&m);
    }
    train_small_copy_model(&m, config, 300, 3); // its best output is in between: the copy
    check_beam_search_exhaustive(&m, "trained to copy");
    transformer_free(&m);
}

// ============================================================================
// Part I's tests, in order: in double, first the finite-difference gradient
// checks. lab/test_lab.c runs them too, with the fast path plugged in.
// ============================================================================

void run_model_tests(void) {
#ifdef TRANSFORMER_DOUBLE
    run_gradient_checks();
#endif
    RefTolerances v2 = reference_tolerances(2), v1 = reference_tolerances(1);
    printf("-- PyTorch reference files (tolerances, relative to each tensor's largest: version 2: "
           "logits %g, loss %g, gradients %g, step losses %g, Adam updates per element "
           "(dev/FORMATS.md, \"Reference files\"); version 1: %g, %g, %g, %g, one Adam step as "
           "version 2's, more reported)\n", v2.logits, v2.loss, v2.grads, v2.step_losses, v1.logits,
           v1.loss, v1.grads, v1.step_losses);
    for (size_t i = 0; i < sizeof committed_references / sizeof *committed_references; i++)
        test_reference_file(committed_references[i]);
    test_reference_catches_wrong_weights(committed_references[0]);
    test_reference_catches_wrong_weights("tiny_data/ref_learned_positions.ref");
    // version 1's tolerances
    test_reference_catches_wrong_weights("tiny_data/ref_1layer_3head.ref");
    test_reference_catches_wrong_adam();
    test_reference_refuses_bad_files();
    printf("-- configuration, parameter counts, masks, optimizer, learning\n");
    test_config_checks();
    test_parameter_counts();
    test_masks();
    test_adam_by_hand();
    test_schedule();
    test_dropout_training_and_evaluation();
    test_aligned_memory();
    test_softmax_visible();
    test_thread_determinism();
    test_learning();
    printf("-- worked by hand: §3.5's positional encoding, a 2x2 attention (§3.2.1)\n");
    test_positional_encoding_formula();
    test_positional_encoding_rotation();
    test_attention_by_hand();
    printf("-- decoding (§6.1)\n");
    test_decoding();
    test_length_penalty_by_hand();
    test_beam_search_is_exhaustive_when_wide();
}

// ############################################################################
// Part II, the program: data, checkpoints, the command line
// ############################################################################

static char test_dir[256];   // a fresh temporary directory for the files below

// A path in test_dir; each call has its own buffer (up to 512 of them).
static const char *test_path(const char *name) {
    static char paths[512][512];
    static int next = 0;
    if (next == 512) {
        fprintf(stderr, "test_path: out of buffers\n");
        exit(1);
    }
    char *p = paths[next++];
    snprintf(p, 512, "%s/%s", test_dir, name);
    return p;
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fwrite(data, 1, n, f);
    fclose(f);
}

static void write_text(const char *path, const char *text) {
    write_file(path, text, strlen(text));
}

static unsigned char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        *n = 0;
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    unsigned char *data = checked_calloc(size + 1, 1, "test file");
    *n = fread(data, 1, size, f);
    fclose(f);
    return data;
}

static void test_tasks_and_batches(void) {
    Dataset train, valid;
    memset(&train, 0, sizeof train);
    memset(&valid, 0, sizeof valid);
    const char *e = task_generate(&train, &valid, TASK_REVERSE, 10, 1, 10, 3000, 200, 1);
    int unseen = 1, reversed = 1;
    for (int i = 0; i < valid.count; i++) {
        const SentencePair *h = &valid.pairs[i];
        for (int t = 0; t < h->src_len; t++)
            reversed &= valid.tokens[h->tgt + t] == valid.tokens[h->src + h->src_len - 1 - t];
        for (int j = 0; j < train.count && unseen; j++) {
            const SentencePair *p = &train.pairs[j];
            unseen = !(p->src_len == h->src_len &&
                       memcmp(train.tokens + p->src, valid.tokens + h->src,
                              h->src_len * sizeof(int)) == 0);
        }
    }
    check(!e && train.count == 3000 && valid.count == 200 && unseen && reversed,
          "tasks: 200 held-out reverse pairs, none of their sources among the 3000 training "
          "sources");
    Dataset a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    e = task_generate(&a, &b, TASK_COPY, 2, 1, 2, 100, 10, 1);
    check(e && strstr(e, "held-out"), "tasks: too few possible sequences for the held-out set is "
          "refused (%s)", e ? e : "accepted");
    dataset_free(&a);
    dataset_free(&b);
    // an epoch: every pair once, batches within the token budget, grouped by length
    EpochPlan plan;
    memset(&plan, 0, sizeof plan);
    Rng rng;
    rng_seed(&rng, 3);
    int budget = 300;
    epoch_plan_make(&plan, &train, budget, &rng);
    int *seen = checked_calloc(train.count, sizeof(int), "test");
    int in_budget = 1, grouped = 1, covered = 1, total = 0;
    BatchBuffer bb;
    memset(&bb, 0, sizeof bb);
    for (int s = 0; s < plan.num_spans; s++) {
        batch_fill(&bb, &train, plan.order + plan.spans[s].start, plan.spans[s].count);
        Batch *x = &bb.batch;
        in_budget &= x->B == 1 || x->B * (x->S + x->T) <= budget;
        int min_len = INT_MAX, max_len = 0;
        for (int i = 0; i < x->B; i++) {
            min_len = x->src_len[i] < min_len ? x->src_len[i] : min_len;
            max_len = x->src_len[i] > max_len ? x->src_len[i] : max_len;
            seen[plan.order[plan.spans[s].start + i]]++;
        }
        grouped &= max_len - min_len <= 1;
        total += x->B;
    }
    for (int i = 0; i < train.count; i++) covered &= seen[i] == 1;
    check(total == train.count && covered, "batches: an epoch of %d batches visits each of the %d "
          "pairs once", plan.num_spans, train.count);
    check(in_budget && grouped,
          "batches: each holds at most %d tokens with padding, sources of (nearly) one length",
          budget);
    // the layout of one batch: x </s> | <s> y | y </s>
    int first = 0;
    TransformerConfig config = small_config();
    batch_fill(&bb, &train, &first, 1);
    const SentencePair *p = &train.pairs[0];
    int n = p->src_len, ok = bb.batch.src_len[0] == n + 1 && bb.batch.src[n] == TOKEN_EOS &&
                             bb.batch.tgt_len[0] == n + 1 && bb.batch.tgt_in[0] == TOKEN_BOS &&
                             bb.batch.tgt_out[n] == TOKEN_EOS &&
                             batch_check(&bb.batch, &config) == NULL;
    for (int t = 0; t < n; t++)
        ok &= bb.batch.tgt_out[t] == train.tokens[p->tgt + t] &&
              bb.batch.tgt_in[t + 1] == train.tokens[p->tgt + t];
    check(ok, "batches: source x </s>, decoder input <s> y, decoder target y </s>");
    free(seen);
    free(plan.order);
    free(plan.spans);
    batch_buffer_free(&bb);
    dataset_free(&train);
    dataset_free(&valid);
}

// Three Adam steps on one ragged batch of two sentences (S 6, T 5), which
// stays in tb for the caller: a model with moments and a step to save.
static void three_adam_steps(Transformer *m, TestBatch *tb) {
    int src_len[2] = { 4, 6 }, tgt_len[2] = { 5, 3 };
    Rng rng;
    rng_seed(&rng, 4);
    make_test_batch(tb, 2, 6, 5, src_len, tgt_len, m->config.vocab_size, &rng);
    for (int step = 1; step <= 3; step++) {
        transformer_forward(m, &tb->batch);
        transformer_zero_grad(m);
        transformer_backward(m, &tb->batch);
        adam_update(m, 1e-3);
    }
}

// Whether two models give bit-identical logits for the batch, without dropout.
static int same_logits(Transformer *a, Transformer *b, const Batch *batch) {
    a->training = b->training = 0;
    size_t n = (size_t)batch->B * batch->T * a->config.vocab_size;
    real *logits = checked_calloc(n, sizeof(real), "test");
    transformer_forward(a, batch);
    memcpy(logits, a->acts.logits, n * sizeof(real));
    transformer_forward(b, batch);
    int same = memcmp(logits, b->acts.logits, n * sizeof(real)) == 0;
    free(logits);
    return same;
}

// A saved and loaded model: bit-identical parameters and logits. Writes the checkpoint good (size
// bytes, the model alone) to path with the 4 bytes at offset set to value and the checksum made
// to match: a file that only the header's own checks can refuse.
static void write_checkpoint_with_field(const char *path, const unsigned char *good, size_t size,
                                        size_t offset, uint32_t value) {
    unsigned char *copy = checked_calloc(size, 1, "test");
    memcpy(copy, good, size);
    memcpy(copy + offset, &value, 4);
    uint64_t hash = fnv1a(FNV_OFFSET, copy, size - 8);
    memcpy(copy + size - 8, &hash, 8);
    write_file(path, copy, size);
    free(copy);
}

// The header's fields (CheckpointHeader: magic 0, version 4, real_bytes 8, subwords 12, the
// config from 16: n_layers 16, d_model 20, d_ff 24, n_heads 28, vocab_size 32, max_len 36,
// positional 40, the floats 44-55; vocab_bytes 56, model_bytes 64) out of their range, each
// refused with its own line, the checksum made to match.
static const struct {
    size_t offset;
    uint32_t value;
    const char *what, *expected;
} checkpoint_field_cases[] = {
    { 4, 3, "a version-3 file", "checkpoint format version 3; transformer.c reads version 4 "
      "(make's ./transformer reads version 3 too)" },
    { 4, 5, "another version", "checkpoint format version 5" },
    { 8, 5, "an element size of 5", "header: 5-byte numbers, subwords 0" },
    { 12, 2, "subwords 2", "subwords 2; expected 4 or 8, and 0 or 1" },
    { 20, 0, "d_model 0", "header: d_model is 0" },
    { 24, 65, "a d_ff that disagrees with the model's bytes", "but its sizes give" },
    { 40, 2, "positions of a third kind", "header: positional is 2" },
    { 56, 1000, "a vocabulary 1000 bytes long", "but its sizes give" },
};

static void test_checkpoint_fields(const unsigned char *good, size_t size) {
    const char *bad = test_path("bad_field.ckpt");
    Transformer loaded;
    Vocabulary v;
    write_checkpoint_with_field(bad, good, size, 8, sizeof(real));   // its own value: loads
    const char *e = checkpoint_load(bad, &loaded, &v);
    check(!e, "checkpoint: a header field rewritten with its own value, the checksum made to "
          "match, loads (%s)", e ? e : "loaded");
    if (!e) {
        transformer_free(&loaded);
        vocab_free(&v);
    }
    int n = (int)(sizeof checkpoint_field_cases / sizeof *checkpoint_field_cases);
    for (int i = 0; i < n; i++) {
        write_checkpoint_with_field(bad, good, size, checkpoint_field_cases[i].offset,
                                    checkpoint_field_cases[i].value);
        e = checkpoint_load(bad, &loaded, &v);
        check(e && strstr(e, "bad_field.ckpt: ") && strstr(e, checkpoint_field_cases[i].expected),
              "checkpoint: %s is refused (%s)", checkpoint_field_cases[i].what, e ? e : "loaded");
        if (!e) {
            transformer_free(&loaded);
            vocab_free(&v);
        }
    }
}

// The vocabulary's rules: the special tokens first, no token twice, none with white space.
static void test_checkpoint_vocabulary(const unsigned char *good, size_t size) {
    // the vocabulary's text: "<pad>\n<s>\n</s>\n<unk>\n0\n1\n"
    const unsigned char *text = good + sizeof(CheckpointHeader);
    size_t first_word = strlen("<pad>\n<s>\n</s>\n<unk>\n");
    const char *bad = test_path("bad_vocabulary.ckpt");
    struct {
        size_t at;
        char byte;
        const char *what, *expected;
    } edits[] = {
        { 1, 'q', "a special token misspelled", "vocabulary token 0 is not valid; expected <pad>" },
        { first_word + 2, '0', "a token twice", "vocabulary token 5 is a repeat" },
        { first_word, ' ', "a token with a space", "vocabulary token 4 is not valid" },
        { first_word + 1, 'x', "a line end missing", "vocabulary token 9 is not valid" },
    };
    for (size_t i = 0; i < sizeof edits / sizeof *edits; i++) {
        unsigned char *copy = checked_calloc(size, 1, "test");
        memcpy(copy, good, size);
        copy[text - good + edits[i].at] = (unsigned char)edits[i].byte;
        write_file(bad, copy, size);
        free(copy);
        Transformer loaded;
        Vocabulary v;
        const char *e = checkpoint_load(bad, &loaded, &v);
        check(e && strstr(e, "bad_vocabulary.ckpt: ") && strstr(e, edits[i].expected),
              "checkpoint: %s is refused (%s)", edits[i].what, e ? e : "loaded");
        if (!e) {
            transformer_free(&loaded);
            vocab_free(&v);
        }
    }
}

static void test_checkpoint_round_trip(void) {
    TransformerConfig config = decode_config();
    Transformer m, loaded;
    transformer_build(&m, &config, 3);
    static TestBatch tb;
    three_adam_steps(&m, &tb);
    Vocabulary v, v2;
    task_vocabulary(&v, config.vocab_size - NUM_SPECIAL_TOKENS);
    const char *path = test_path("model.ckpt");
    const char *e = checkpoint_save(path, &m, &v);
    if (!e)
        e = checkpoint_load(path, &loaded, &v2);
    size_t P = m.num_parameters, bytes = P * sizeof(real);
    int same = !e && loaded.num_parameters == P &&
               memcmp(loaded.params_memory, m.params_memory, bytes) == 0 &&
               memcmp(&loaded.config, &m.config, sizeof m.config) == 0 &&
               v2.size == v.size && strcmp(v2.words[v.size - 1], v.words[v.size - 1]) == 0 &&
               vocab_find(&v2, "3", 1) == 7;
    check(same, "checkpoint: the config, the parameters and the vocabulary come back (%s)",
          e ? e : "loaded");
    if (e) {
        transformer_free(&m);
        vocab_free(&v);
        return;
    }
    check(same_logits(&m, &loaded, &tb.batch),
          "checkpoint: a loaded model gives bit-identical logits");
    transformer_free(&loaded);
    vocab_free(&v2);

    // damaged and foreign files: one message each, naming the file
    size_t size;
    unsigned char *good = read_file(path, &size);
    unsigned char *copy = checked_calloc(size + 16, 1, "test");
    const char *bad = test_path("bad.ckpt");
    size_t cuts[6] = { 0, 3, 60, 71, size / 2, size - 1 };
    int all_truncated = 1;
    for (int i = 0; i < 6; i++) {
        write_file(bad, good, cuts[i]);
        e = checkpoint_load(bad, &loaded, &v2);
        all_truncated &= e && strstr(e, "bad.ckpt: truncated") != NULL;
        if (!e)
            transformer_free(&loaded), vocab_free(&v2);
    }
    check(all_truncated, "checkpoint: cut at 0, 3, 60, 71, half and all but 1 of %zu bytes: "
          "'truncated' each time", size);
    test_checkpoint_fields(good, size);
    test_checkpoint_vocabulary(good, size);
    struct {
        size_t offset;
        unsigned char value;
        const char *expected, *what;
    } edits[] = {
        { 0, 'X', "not a transformer.c checkpoint", "a wrong magic" },
        { 0, 0, "checksum mismatch", "one changed parameter byte" },
    };
    for (size_t i = 0; i < sizeof edits / sizeof *edits; i++) {
        memcpy(copy, good, size);
        size_t offset = edits[i].offset;
        if (strcmp(edits[i].expected, "checksum mismatch") == 0) {
            offset = size - 100;
            copy[offset] ^= 1;
        } else
            copy[offset] = edits[i].value;
        write_file(bad, copy, size);
        e = checkpoint_load(bad, &loaded, &v2);
        check(e && strstr(e, "bad.ckpt") && strstr(e, edits[i].expected),
              "checkpoint: %s is refused (%s)", edits[i].what, e ? e : "accepted");
        if (!e)
            transformer_free(&loaded), vocab_free(&v2);
    }
    // bytes after the model are another program's (make's ./transformer keeps its run there):
    // transformer.c reads the model and leaves them be
    memcpy(copy, good, size);
    write_file(bad, copy, size + 16);
    e = checkpoint_load(bad, &loaded, &v2);
    check(!e && loaded.num_parameters == P &&
          memcmp(loaded.params_memory, m.params_memory, bytes) == 0,
          "checkpoint: 16 bytes after the model are left be: the model loads (%s)",
          e ? e : "loaded");
    if (!e)
        transformer_free(&loaded), vocab_free(&v2);
    // a model of §5.1 subwords: transformer.c alone, which reads whole words, says so
    write_checkpoint_with_field(bad, good, size, 12, 1);
    e = checkpoint_load(bad, &loaded, &v2);
    check(e && strstr(e, "bad.ckpt: its tokens are §5.1 subwords, which transformer.c alone"),
          "checkpoint: a model of §5.1 subwords is refused by transformer.c alone (%s)",
          e ? e : "loaded");
    if (!e)
        transformer_free(&loaded), vocab_free(&v2);
    // a NaN among the weights, the checksum right (train never saves one; a file made
    // elsewhere might)
    real kept = m.params_memory[7];
    m.params_memory[7] = NAN;
    e = checkpoint_save(bad, &m, &v);
    m.params_memory[7] = kept;
    if (!e)
        e = checkpoint_load(bad, &loaded, &v2);
    else
        e = "not saved";
    check(e && strstr(e, "bad.ckpt: embedding holds a number that is not finite"),
          "checkpoint: a NaN weight is refused as it loads (%s)", e ? e : "loaded");
    if (!e)
        transformer_free(&loaded), vocab_free(&v2);
    // a failed save leaves the old checkpoint as it was
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    mkdir(tmp, 0700); // the temporary file cannot be written: a directory is in its place
    m.params_memory[0] += 1;
    e = checkpoint_save(path, &m, &v);
    size_t after_size;
    unsigned char *after = read_file(path, &after_size);
    check(e && strstr(e, "left as it was") && after_size == size && memcmp(after, good, size) == 0,
          "checkpoint: a save that fails leaves the previous file byte for byte (%s)",
          e ? e : "saved");
    rmdir(tmp);
    e = checkpoint_save(test_path("no/such/dir/x.ckpt"), &m, &v);
    check(e && strstr(e, "cannot write"), "checkpoint: an unwritable path is refused (%s)",
          e ? e : "saved");
    free(after);
    free(good);
    free(copy);
    transformer_free(&m);
    vocab_free(&v);
}

// The vocabulary's hash table: over 40,000 tokens and the table's growths, every token found at
// its id, as a reading of the list from the start finds it; a token it does not hold (a prefix,
// a longer word, the empty text) found by neither; and the n bytes of a longer text found as a
// token.
static int listed_id(const Vocabulary *vocab, const char *word, size_t n) {
    for (int id = 0; id < vocab->size; id++) {
        if (strncmp(vocab->words[id], word, n) == 0 && vocab->words[id][n] == '\0')
            return id;
    }
    return -1;
}

static void test_vocabulary_hash_table(void) {
    Vocabulary vocab;
    vocab_init(&vocab);
    char word[32];
    for (int i = 0; i < 40000; i++) {
        snprintf(word, sizeof word, "w%d", (int)((long)i * 7919 % 100003));   // all distinct
        vocab_add(&vocab, word, strlen(word));
    }
    int added_again = vocab_add(&vocab, "<s>", 3) == TOKEN_BOS && vocab.size == 40004;
    int hashed = 1;
    int absent = 1;
    for (int id = 0; id < vocab.size; id++) {
        const char *text = vocab.words[id];
        hashed &= vocab_find(&vocab, text, strlen(text)) == id;
        if (id % 97 == 0)
            hashed &= listed_id(&vocab, text, strlen(text)) == id;
    }
    const char *missing[] = { "w", "w0x", "x1", "w100003", "" };
    for (int i = 0; i < 5; i++) {
        absent &= vocab_find(&vocab, missing[i], strlen(missing[i])) == -1;
        absent &= listed_id(&vocab, missing[i], strlen(missing[i])) == -1;
    }
    int within_text = vocab_find(&vocab, "w7919 more", 5) == NUM_SPECIAL_TOKENS + 1;
    check(added_again && hashed && absent && within_text && vocab.num_slots >= 80008,
          "vocabulary: the hash table finds each of 40,004 tokens at its id, as the list does; a "
          "prefix, a longer word and the empty text are not found; %d slots", vocab.num_slots);
    vocab_free(&vocab);
}

// A diverged run must not overwrite its checkpoint: train_save asks
// nonfinite_parameter, which names the first tensor holding a NaN or an
// infinity. Each tensor in turn gets one, at its last element (learned
// positions, so that no tensor is empty).
static void test_nonfinite_parameter(void) {
    TransformerConfig config = decode_config();
    config.positional = POSITIONAL_LEARNED;
    Transformer m;
    transformer_build(&m, &config, 5);
    check(nonfinite_parameter(&m) == NULL,
          "diverged: a freshly built model has only finite parameters");
    real **tensors[NUM_PARAMETER_TENSORS];
    parameter_pointers(tensors, &m.params);
    int named = 0;
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        real *last = *tensors[t] + m.param_sizes[t] - 1, kept = *last;
        *last = t % 2 ? (real)NAN : (real)INFINITY;
        const char *name = nonfinite_parameter(&m);
        named += name != NULL && strcmp(name, parameter_names[t]) == 0;
        *last = kept;
    }
    check(named == NUM_PARAMETER_TENSORS && nonfinite_parameter(&m) == NULL,
          "diverged: a NaN or infinity in each of the %d tensors is found and named (%d/%d)",
          NUM_PARAMETER_TENSORS, named, NUM_PARAMETER_TENSORS);
    transformer_free(&m);
}

// Learned positions (Table 3, row E): the table trains, survives a checkpoint
// bit for bit; a seed gives the same
// other weights as with sinusoids (the table is drawn last).
static void test_learned_positions_checkpoint(void) {
    TransformerConfig config = decode_config(), sinusoid_config = decode_config();
    config.positional = POSITIONAL_LEARNED;
    Transformer m, loaded, sinusoid;
    transformer_build(&m, &config, 3);
    transformer_build(&sinusoid, &sinusoid_config, 3);
    size_t table = (size_t)config.max_len * config.d_model, P = m.num_parameters;
    int same_others = m.param_sizes[1] == table && sinusoid.param_sizes[1] == 0 &&
        P == sinusoid.num_parameters + table &&
        memcmp(m.params.embedding, sinusoid.params.embedding,
               m.param_sizes[0] * sizeof(real)) == 0 &&
        memcmp(m.params.enc_qkv_w, sinusoid.params.enc_qkv_w,
               (P - m.param_sizes[0] - table) * sizeof(real)) == 0;
    check(same_others && m.positional_encoding == m.params.position_embedding,
          "learned positions: a (max_len, d_model) = %zu-number table, the model reads it from "
          "the parameters; the seed's other weights are the sinusoid model's", table);
    transformer_free(&sinusoid);
    real *initial = checked_calloc(table, sizeof(real), "test");
    memcpy(initial, m.params.position_embedding, table * sizeof(real));
    static TestBatch tb;
    three_adam_steps(&m, &tb);
    // rows 0..5 are some sentence's position and move; rows 6.. are no one's and stay
    int moved = 1;
    for (size_t i = 0; i < table; i++) {
        int used = i < (size_t)6 * config.d_model;
        moved &= used ? m.params.position_embedding[i] != initial[i]
                      : m.params.position_embedding[i] == initial[i];
    }
    check(moved, "learned positions: Adam moves the rows of the positions used (0..5), no others");
    free(initial);
    Vocabulary v, v2;
    task_vocabulary(&v, config.vocab_size - NUM_SPECIAL_TOKENS);
    const char *path = test_path("learned.ckpt");
    const char *e = checkpoint_save(path, &m, &v);
    if (!e)
        e = checkpoint_load(path, &loaded, &v2);
    int same = !e && loaded.config.positional == POSITIONAL_LEARNED && loaded.num_parameters == P &&
               loaded.positional_encoding == loaded.params.position_embedding &&
               memcmp(loaded.params_memory, m.params_memory, P * sizeof(real)) == 0;
    if (same)
        same = same_logits(&m, &loaded, &tb.batch);
    check(same, "learned positions: a checkpoint gives back the table and bit-identical logits "
          "(%s)", e ? e : "loaded");
    if (!e) {
        transformer_free(&loaded);
        vocab_free(&v2);
    }
    size_t size;
    unsigned char *bytes = read_file(path, &size);
    if (bytes) {
        bytes[40] = 2;   // the header's positional kind
        write_file(test_path("bad_positional.ckpt"), bytes, size);
        e = checkpoint_load(test_path("bad_positional.ckpt"), &loaded, &v2);
        check(e && strstr(e, "bad_positional.ckpt: header: positional is 2, expected 0 "
                             "(sinusoid) or 1 (learned)"),
              "learned positions: a checkpoint of another kind of positions is refused (%s)",
              e ? e : "accepted");
        if (!e) {
            transformer_free(&loaded);
            vocab_free(&v2);
        }
    }
    free(bytes);
    vocab_free(&v);
    transformer_free(&m);
}

// ---- the command line, run as a user runs it --------------------------------------

static const char *cli_binary = "./transformer_minimal";   // (cli_binary_found sets it)
static char cli_output[1 << 16];

// Runs the binary with the arguments (a shell command line) and returns its
// exit status; its standard output and error together are left in cli_output.
static int run_cli(const char *format, ...) {
    char args[4096], command[8192];
    va_list list;
    va_start(list, format);
    vsnprintf(args, sizeof args, format, list);
    va_end(list);
    char output_path[600];
    snprintf(output_path, sizeof output_path, "%s/cli.out", test_dir);
    snprintf(command, sizeof command, "%s %s > %s 2>&1", cli_binary, args, output_path);
    fflush(stdout);
    int status = system(command);
    size_t n;
    unsigned char *out = read_file(output_path, &n);
    snprintf(cli_output, sizeof cli_output, "%s", out ? (char *)out : "");
    free(out);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int count_lines_starting(const char *text, const char *prefix) {
    int n = 0;
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        n += strncmp(p, prefix, strlen(prefix)) == 0;
    return n;
}

// The bad input must give exit status 1 and exactly one line starting with
// "error:" that contains `expected`, and nothing from a sanitizer.
static void check_cli_error(const char *what, const char *expected, const char *format, ...) {
    char args[4096];
    va_list list;
    va_start(list, format);
    vsnprintf(args, sizeof args, format, list);
    va_end(list);
    int status = run_cli("%s", args);
    const char *line = strstr(cli_output, "error:");
    char shown[300] = "";
    if (line)
        snprintf(shown, sizeof shown, "%.*s", (int)strcspn(line, "\n"), line);
    int ok = status == 1 && count_lines_starting(cli_output, "error:") == 1 && line &&
             strstr(shown, expected) && !strstr(cli_output, "Sanitizer") &&
             !strstr(cli_output, "runtime error");
    check(ok, "cli: %s -> exit %d, \"%s\"", what, status, ok ? shown : cli_output);
}

static int files_equal(const char *a, const char *b) {
    size_t na, nb;
    unsigned char *x = read_file(a, &na), *y = read_file(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

// A tiny model on the copy task of transformer.c's default size, with
// transformer.c's own flags (the lab's TINY_RUN also makes the task smaller)
#define TINY_MINIMAL_RUN "--layers 1 --d-model 16 --d-ff 32 --heads 2 --batch-tokens 80 --warmup 5"

// The binary the command-line tests run: TRANSFORMER_BIN, else `fallback`
// (./transformer_minimal here, lab/test_lab.c's ./transformer). Says so with
// a failed check when it is not there.
static int cli_binary_found(const char *fallback) {
    const char *binary = getenv("TRANSFORMER_BIN");
    cli_binary = binary && *binary ? binary : fallback;
    if (access(cli_binary, X_OK) == 0)
        return 1;
    check(0, "cli: %s is not there: build it first (make), or set TRANSFORMER_BIN", cli_binary);
    return 0;
}

// A file as text.
static char *read_text_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = checked_calloc((size_t)n + 1, 1, "test file");
    size_t got = fread(text, 1, (size_t)n, f);
    text[got] = '\0';
    fclose(f);
    return text;
}

// transformer.c's flags and their errors, a run on the copy task, decode with its checkpoint,
// damaged checkpoints, a run repeated from its seed, and a loss that becomes NaN. (They hold for
// ./transformer too: lab/test_lab.c runs them again through it.)
static void test_command_line(void) {
    // flags
    check_cli_error("--steps -3", "train: --steps '-3' is not valid; expected an integer from 1 to",
                    "train --steps -3");
    check_cli_error("--lr abc", "train: --lr 'abc' is not valid; expected a number > 0",
                    "train --lr abc");
    check_cli_error("--lr nan", "--lr 'nan' is not valid", "train --lr nan");
    check_cli_error("--beam 2x", "decode: --beam '2x' is not valid", "decode --beam 2x");
    check_cli_error("an unknown flag", "train: unknown flag '--stpes'", "train --stpes 3");
    check_cli_error("a flag without its value", "train: flag --steps needs a value",
                    "train --steps");
    check_cli_error("a text flag without its value", "flag --checkpoint needs a value",
                    "decode --checkpoint --beam 2");
    check_cli_error("an unknown command", "unknown command 'trian'", "trian");
    check_cli_error("an unknown task", "--task 'copyy' is not a task", "train --task copyy");
    check_cli_error("decode without a checkpoint", "--checkpoint FILE is required", "decode '1 2'");
    check_cli_error("an empty --checkpoint", "--checkpoint '': expected a file's path",
                    "train --steps 2 --checkpoint '' " TINY_MINIMAL_RUN);

    // a tiny run on the copy task, then decode with its checkpoint: the task's longest source is
    // 10 tokens, so max_len is 10 + 1 + 50 = 61
    const char *ckpt = test_path("cli.ckpt");
    int status = run_cli("train --task copy --steps 4 --checkpoint %s " TINY_MINIMAL_RUN, ckpt);
    check(status == 0 && strstr(cli_output, "eval   step 4") &&
          strstr(cli_output, "exact match on 200"),
          "cli: train the copy task for 4 steps, evaluated at the end (exit %d)", status);
    status = run_cli("decode --checkpoint %s '1 zz 2'", ckpt);
    check(status == 0 && strstr(cli_output, "warning: argument 1: token 'zz' is not in the "
                                            "vocabulary; read as <unk>"),
          "cli: an unknown token at decode time is read as <unk> with a warning (exit %d)",
          status);
    char long_sentence[400] = "'";
    for (int i = 0; i < 70; i++) strcat(long_sentence, "1 ");
    strcat(long_sentence, "'");
    check_cli_error("a sentence longer than the model's maximum",
                    "argument 1: the sentence has 70 tokens; "
                    "the model's maximum length 61 allows 60",
                    "decode --checkpoint %s %s", ckpt, long_sentence);

    // damaged checkpoints
    size_t size;
    unsigned char *good = read_file(ckpt, &size);
    if (!good) {
        check(0, "cli: no checkpoint from the copy run; the damaged-checkpoint tests need one");
        return;
    }
    const char *bad = test_path("cli_bad.ckpt");
    write_file(bad, good, size - 10);
    check_cli_error("a truncated checkpoint", "cli_bad.ckpt: truncated",
                    "decode --checkpoint %s '1 2'", bad);
    good[0] = 'P';
    write_file(bad, good, size);
    good[0] = 'T';
    check_cli_error("a checkpoint with the wrong magic",
                    "cli_bad.ckpt: not a transformer.c checkpoint",
                    "decode --checkpoint %s '1 2'", bad);
    good[4] = 9;
    write_file(bad, good, size);
    good[4] = 4;
    check_cli_error("a checkpoint of another version", "cli_bad.ckpt: checkpoint format version 9",
                    "decode --checkpoint %s '1 2'", bad);
    good[16] = 2;   // N, 1 in TINY_MINIMAL_RUN
    write_file(bad, good, size);
    good[16] = 1;
    check_cli_error("a checkpoint whose sizes disagree with its header",
                    "but its sizes give", "decode --checkpoint %s '1 2'", bad);
    good[size - 20] ^= 1;
    write_file(bad, good, size);
    good[size - 20] ^= 1;
    check_cli_error("a checkpoint with one byte changed", "cli_bad.ckpt: checksum mismatch",
                    "decode --checkpoint %s '1 2'", bad);
    free(good);

    // the same seed repeats the run, with one thread or all (OMP_NUM_THREADS): the same
    // checkpoint, byte for byte (and another seed another one, so that the comparison can fail)
    const char *seed_all = test_path("seed_all.ckpt");
    const char *seed_one = test_path("seed_one.ckpt");
    const char *seed_other = test_path("seed_other.ckpt");
    int s1 = run_cli("train --task copy --steps 6 --seed 3 --checkpoint %s " TINY_MINIMAL_RUN,
                     seed_all);
    setenv("OMP_NUM_THREADS", "1", 1);
    int s2 = run_cli("train --task copy --steps 6 --seed 3 --checkpoint %s " TINY_MINIMAL_RUN,
                     seed_one);
    unsetenv("OMP_NUM_THREADS");
    int s3 = run_cli("train --task copy --steps 6 --seed 4 --checkpoint %s " TINY_MINIMAL_RUN,
                     seed_other);
    check(s1 == 0 && s2 == 0 && s3 == 0 && files_equal(seed_all, seed_one) &&
          !files_equal(seed_all, seed_other),
          "cli: --seed repeats a run exactly: 6 steps with 1 thread and with all write the same "
          "checkpoint, byte for byte (another seed: another) (exit %d, %d, %d)",
          s1, s2, s3);

    // a NaN loss stops training before any checkpoint is written, and says so
    check_cli_error("a loss that becomes NaN or infinite",
                    "training stopped (try a lower --lr)",
                    "train --task copy --steps 50 --lr 1e30 --checkpoint %s " TINY_MINIMAL_RUN,
                    test_path("nan.ckpt"));
    check(access(test_path("nan.ckpt"), F_OK) != 0, "cli: ... and no checkpoint is there");
}

// ---- eval --bleu, an existing checkpoint, odd data, streams, memory --------------

// Saves m with the digit vocabulary of the copy task.
static const char *save_copy_checkpoint(const char *path, const Transformer *m) {
    Vocabulary v;
    task_vocabulary(&v, m->config.vocab_size - NUM_SPECIAL_TOKENS);
    const char *e = checkpoint_save(path, m, &v);
    vocab_free(&v);
    return e;
}

// The checkpoint's first parameter, or NAN where it does not load.
static double checkpoint_file_weight(const char *path) {
    Transformer m;
    Vocabulary v;
    if (checkpoint_load(path, &m, &v))
        return NAN;
    double weight = m.params_memory[0];
    transformer_free(&m);
    vocab_free(&v);
    return weight;
}

// Output that cannot be written (a full disk: /dev/full) is an error, not exit 0 with the output
// lost.
static void test_output_write_error(const char *ckpt) {
    if (access("/dev/full", W_OK) != 0) {
        printf("(no /dev/full here: the write-error check is skipped)\n");
        return;
    }
    char command[2048], err_path[600];
    snprintf(err_path, sizeof err_path, "%s/full.err", test_dir);
    snprintf(command, sizeof command, "%s decode --checkpoint %s '3 1 4' > /dev/full 2> %s",
             cli_binary, ckpt, err_path);
    fflush(stdout);
    int status = system(command);
    size_t n;
    char *err = (char *)read_file(err_path, &n);
    check(WIFEXITED(status) && WEXITSTATUS(status) == 1 && err &&
          count_lines_starting(err, "error:") == 1 &&
          strstr(err, "error: decode: writing the output failed"),
          "cli: decode onto a full disk -> exit %d, \"%.*s\"",
          WIFEXITED(status) ? WEXITSTATUS(status) : -1, err ? (int)strcspn(err, "\n") : 0,
          err ? err : "");
    free(err);
}

// Sentences to decode, some it cannot take: a reserved token, a sentence too long. Each gets
// its error line, the others are decoded, and the exit status is 1. (Standard input, which
// only the lab's ./transformer reads: lab/test_lab.c, test_decode_stdin.)
static void test_decode_streams(const char *ckpt) {
    check_cli_error("</s> in a sentence to decode", "argument 1: the token '</s>' is reserved",
                    "decode --checkpoint %s '1 </s> 2'", ckpt);
    char too_long[200] = "";
    for (int i = 0; i < 25; i++) strcat(too_long, "1 ");
    int status = run_cli("decode --checkpoint %s '1 2 3' '%s' '<pad>' '3 2 1'", ckpt, too_long);
    const char *e1 = strstr(cli_output, "error: decode: argument 2: the sentence has 25 tokens");
    const char *e2 = strstr(cli_output, "error: decode: argument 3: the token '<pad>' is reserved");
    int errors = count_lines_starting(cli_output, "error:");
    int lines = count_lines_starting(cli_output, "");
    check(status == 1 && e1 && e2 && errors == 2 && lines >= 4,
          "cli: decode reports arguments 2 and 3 (too long, <pad>), decodes 1 and 4 and exits 1 "
          "(exit %d, %d lines, %d errors)", status, lines, errors);
}

// Out of memory is one line that names the command, as every error is.
static void test_out_of_memory(void) {
    if (strstr(cli_binary, "asan"))
        return;   // AddressSanitizer needs more address space than this limit
    char command[1400];
    snprintf(command, sizeof command, "ulimit -v 400000; %s train --task copy --d-model 4096 "
             "--d-ff 16384 --heads 8 --layers 6 --steps 1 --checkpoint %s > %s/oom.out 2>&1",
             cli_binary, test_path("oom.ckpt"), test_dir);
    int status = system(command);
    char *out = read_text_file(test_path("oom.out"));
    check(WIFEXITED(status) && WEXITSTATUS(status) == 1 && out &&
          strstr(out, "error: train: out of memory") &&
          count_lines_starting(out, "error:") == 1,
          "cli: out of memory names the command (%s)", out ? out : "no output");
    free(out);
}

// transformer.c's commands as a user meets them, with a checkpoint of a
// small trained copy model (lab/test_lab.c runs these through ./transformer
// too).
static void test_evaluation_commands(void) {
    const char *ckpt = test_path("copy_small.ckpt");
    const char *e = save_copy_checkpoint(ckpt, trained_copy_model());
    check(!e, "cli: a checkpoint of a small copy model (%s)", e ? e : "saved");
    if (!e) {
        printf("-- what a new user meets: streams, memory, a full disk\n");
        test_decode_streams(ckpt);
        test_out_of_memory();
        test_output_write_error(ckpt);
    }
}

// transformer.c alone replaces a checkpoint of its own (a run repeated), never a file that is
// not one (the lab's ./transformer asks for --force: lab/test_lab.c, test_existing_checkpoint).
static void test_minimal_overwrite_rule(void) {
    const char *ckpt = test_path("again.ckpt");
    const char *not_ours = test_path("notes.txt");
    int first = run_cli("train --task copy --steps 2 --checkpoint %s " TINY_MINIMAL_RUN, ckpt);
    double after_2 = checkpoint_file_weight(ckpt);
    int again = run_cli("train --task copy --steps 3 --checkpoint %s " TINY_MINIMAL_RUN, ckpt);
    double after_3 = checkpoint_file_weight(ckpt);
    check(first == 0 && again == 0 && isfinite(after_2) && isfinite(after_3) && after_3 != after_2,
          "minimal: a run replaces a checkpoint of ours (its first weight %g after 2 steps, %g "
          "after 3; exit %d, %d)", after_2, after_3, first, again);
    write_text(not_ours, "a file that is not a checkpoint");
    check_cli_error("a file that is not a checkpoint at --checkpoint",
                    "notes.txt is already there and is not a checkpoint",
                    "train --task copy --steps 2 --checkpoint %s " TINY_MINIMAL_RUN, not_ours);
    char *text = read_text_file(not_ours);
    check(text && strcmp(text, "a file that is not a checkpoint") == 0,
          "minimal: ... and it is left as it was");
    free(text);
    const char *directory = test_path("a_directory");
    mkdir(directory, 0700);
    check_cli_error("a directory at --checkpoint",
                    "a_directory is already there and is not a checkpoint",
                    "train --task copy --steps 2 --checkpoint %s " TINY_MINIMAL_RUN, directory);
}

// transformer.c alone (make minimal: `cc -O2 transformer.c -lm`), the smallest
// complete program: it trains the copy task, writes a checkpoint that loads,
// decodes with it, and lists its two commands, without the lab's (which
// it refuses by name). (lab/test_lab.c: ./transformer reads its checkpoints.)
static void test_minimal_program(void) {
    const char *ckpt = test_path("minimal.ckpt");
    int trained = run_cli("train --task copy " TINY_MINIMAL_RUN " --steps 20 --checkpoint %s",
                          ckpt);
    int has_model = strstr(cli_output, "checkpoint") != NULL;
    int decoded = run_cli("decode --checkpoint %s --beam 2 \"3 1 4\"", ckpt);
    int one_line = strchr(cli_output, '\n') != NULL && !strstr(cli_output, "error");
    int help = run_cli("--help");
    int lists = strstr(cli_output, "train") && strstr(cli_output, "decode") &&
                !strstr(cli_output, "eval") && !strstr(cli_output, "bench") &&
                !strstr(cli_output, "table3");
    Transformer m;
    Vocabulary v;
    const char *error = checkpoint_load(ckpt, &m, &v);
    if (!error) {
        transformer_free(&m);
        vocab_free(&v);
    }
    check(trained == 0 && has_model && decoded == 0 && one_line && help == 0 && lists && !error,
          "minimal: %s trains the copy task (exit %d), writes a checkpoint that loads (%s), "
          "decodes with it (exit %d) and lists train and decode only", cli_binary, trained,
          error ? error : "yes", decoded);
    check_cli_error("the lab's bench in transformer.c alone", "unknown command 'bench'", "bench");
    check_cli_error("decode with no sentence in transformer.c alone",
                    "decode: no sentence to decode; expected one or more",
                    "decode --checkpoint %s < /dev/null", test_path("minimal.ckpt"));
    check_cli_error("the lab's eval in transformer.c alone",
                    "unknown command 'eval'; expected train or decode", "eval");
    check_cli_error("the lab's --train in transformer.c alone", "train: unknown flag '--train'",
                    "train --train data.tsv");
    test_minimal_overwrite_rule();
}

// ---- make debug: transformer.c alone, walked in gdb ------------------------------
// The line number of the first line holding `text` after the first line
// holding `after`, in the file at path; 0 if there is none.
static int source_line(const char *path, const char *after, const char *text) {
    char *source = read_text_file(path);
    if (!source)
        return 0;
    const char *start = strstr(source, after), *at = start ? strstr(start, text) : NULL;
    int line = 0;
    if (at) {
        line = 1;
        for (const char *c = source; c < at; c++) line += *c == '\n';
    }
    free(source);
    return line;
}

// The integer after "\n<name> = " in text (a line of gdb's `info locals`);
// 0 and *found cleared if there is none.
static long gdb_local(const char *text, const char *name, int *found) {
    char key[64];
    snprintf(key, sizeof key, "\n%s = ", name);
    const char *at = text ? strstr(text, key) : NULL;
    if (!at) {
        *found = 0;
        return 0;
    }
    return strtol(at + strlen(key), NULL, 10);
}

// make debug's transformer_debug (transformer.c alone, -O0 -g, no OpenMP) in
// gdb, as NOTES.md, "A walk through the code in gdb", walks it: break in
// attention_forward during a one-step training run, `next` line by line until the line that
// computes s_ij (p[j] = dot * scale), then `info locals`. Built with OpenMP,
// the loop body would be an outlined attention_forward._omp_fn.0 and `next`
// would step over the whole loop (issue 26), never reaching that line.
// Checks that the walk reaches the score line through the loop's lines, that
// `info locals` shows b, head, i (the first sentence, head and query: 0, 0, 0)
// and visible (1 to Tk keys), and that no _omp_fn frame appears. Skipped,
// with a line saying so, where gdb is not on the PATH or may not trace.
static void test_debugger_walk(void) {
    const char *debug = getenv("TRANSFORMER_DEBUG_BIN");
    // (make test sets it for one of the three builds: the walk is the same in each)
    if (!debug || !*debug) {
        printf("     (TRANSFORMER_DEBUG_BIN not set: the gdb walk not run here)\n");
        return;
    }
    if (system("command -v gdb > /dev/null 2>&1") != 0) {
        printf("     (gdb is not on the PATH: the walk through transformer_debug in gdb is "
               "skipped)\n");
        return;
    }
    if (access(debug, X_OK) != 0) {
        check(0, "gdb: %s is not there (make debug)", debug);
        return;
    }
    int score_line = source_line("transformer.c", "static void attention_forward(",
                                 "p[j] = dot * scale;");
    if (!score_line) {
        check(0, "gdb: no line `p[j] = dot * scale;` in attention_forward in transformer.c");
        return;
    }
    const char *script = test_path("walk.gdb"), *output_path = test_path("walk.out");
    char text[2048];
    snprintf(text, sizeof text,
             "set pagination off\nset confirm off\nset width 0\n"
             "break attention_forward\n"
             "run train --task copy --steps 1 " TINY_MINIMAL_RUN " --checkpoint %s\n"
             "info line transformer.c:%d\n"                  // sets $_ to the line's first address
             "set $score_line = $_\nset $steps = 0\n"
             "while $pc != $score_line && $steps < 200\nnext\nset $steps = $steps + 1\nend\n"
             "printf \"==steps %%d\\n\", $steps\n"
             "echo ==frame\\n\nframe\necho ==locals\\n\ninfo locals\n"
             "echo ==bt\\n\nbt\necho ==end\\n\n",
             test_path("gdb.ckpt"), score_line);
    write_text(script, text);
    char command[1600];
    snprintf(command, sizeof command,
             "DEBUGINFOD_URLS= timeout 120 gdb -batch -nx -x %s %s > %s 2>&1",
             script, debug, output_path);
    fflush(stdout);
    int status = system(command);
    int exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    char *output = read_text_file(output_path);
    if (output && strstr(output, "ptrace:")) {
        printf("     (gdb may not trace processes here (ptrace): the walk is skipped)\n");
        free(output);
        return;
    }
    const char *steps_at = output ? strstr(output, "==steps ") : NULL,
               *frame = output ? strstr(output, "==frame") : NULL;
    const char *locals = output ? strstr(output, "==locals") : NULL,
               *bt = output ? strstr(output, "==bt") : NULL;
    int steps = steps_at ? atoi(steps_at + 8) : -1;
    char at_line[64];
    snprintf(at_line, sizeof at_line, "at transformer.c:%d\n", score_line);
    // the frame after the walk: attention_forward, at the score line
    int reached = frame && locals && strstr(frame, "attention_forward (") &&
                  strstr(frame, at_line) && strstr(frame, at_line) < locals &&
                  strstr(frame, "p[j] = dot * scale;");
    // the walk went through the loop body's lines, `next` by `next`
    const char *walked = output ? strstr(output, "visible_keys(i, key_len[b], causal)") : NULL;
    int through_loop = walked && steps_at && walked < steps_at && steps >= 5 && steps < 200;
    int found = 1;
    long b = gdb_local(locals, "b", &found), head = gdb_local(locals, "head", &found),
         i = gdb_local(locals, "i", &found);
    long visible = gdb_local(locals, "visible", &found);
    long Tk = gdb_local(locals, "Tk", &found);
    int locals_ok = locals && bt && found && b == 0 && head == 0 && i == 0 && visible >= 1
                    && visible <= Tk;
    int no_omp = output && !strstr(output, "_omp_fn") && bt && strstr(bt, "self_attention_forward");
    check(exit_code == 0 && reached && through_loop && locals_ok && no_omp,
          "gdb: in %s, `next` walks attention_forward line by line to the s_ij line %d "
          "(%s after %d steps, %s), `info locals` shows b = %ld, head = %ld, i = %ld, "
          "visible = %ld (of Tk = %ld)%s; %s (gdb exit %d%s)", debug,
          score_line, reached ? "reached" : "NOT reached", steps,
          through_loop ? "through visible_keys" : "NOT through the loop body", b, head, i,
          visible, Tk, found ? "" : " (some NOT shown)",
          no_omp ? "no _omp_fn frame" : "an _omp_fn frame or no backtrace",
          exit_code, exit_code == 124 ? ": timed out after 120 s" : "");
    if (!(reached && through_loop && locals_ok && no_omp) && output)
        printf("     gdb printed:\n%s\n", output);
    free(output);
}

// ============================================================================
// Part II's tests, in order
// ============================================================================

// A fresh temporary directory for the files of the tests (test_path), and its removal.
static int make_test_dir(void) {
    snprintf(test_dir, sizeof test_dir, "/tmp/transformer_test_XXXXXX");
    if (mkdtemp(test_dir))
        return 1;
    perror("mkdtemp");
    check(0, "cannot make a temporary directory");
    return 0;
}

static void remove_test_dir(void) {
    char command[600];
    snprintf(command, sizeof command, "rm -rf %s", test_dir);
    if (system(command) != 0)
        printf("     (could not remove %s)\n", test_dir);
}

// transformer.c's commands, run as a user runs them (cli_binary, found):
// lab/test_lab.c runs them through ./transformer too.
void run_command_line_tests(void) {
    printf("-- the command line: %s\n", cli_binary);
    test_command_line();
    test_evaluation_commands();
}

void run_program_tests(void) {
    if (!make_test_dir())
        return;
    printf("-- data, checkpoints (files in %s)\n", test_dir);
    test_tasks_and_batches();
    test_vocabulary_hash_table();
    test_checkpoint_round_trip();
    test_learned_positions_checkpoint();
    test_nonfinite_parameter();
    if (cli_binary_found("./transformer_minimal")) {
        run_command_line_tests();
        test_minimal_program();
    }
    printf("-- the debugger: make debug's transformer_debug in gdb (NOTES.md, \"A walk through the "
           "code in gdb\")\n");
    test_debugger_walk();
    remove_test_dir();
}

#ifndef TEST_TRANSFORMER_LIBRARY
int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--reference") == 0) {
        Reference r;
        if (!reference_read(&r, argv[2])) {
            reference_free(&r);
            return 1;
        }
        reference_free(&r);
        test_reference_file(argv[2]);
        printf("%d passed, %d failed\n", tests_passed, tests_failed);
        return tests_failed ? 1 : 0;
    }
    if (argc != 1) {
        fprintf(stderr, "usage: %s [--reference FILE.ref]\n", argv[0]);
        return 2;
    }
    run_model_tests();
    run_program_tests();
    printf("%d passed, %d failed\n", tests_passed, tests_failed);
    return tests_failed ? 1 : 0;
}
#endif
