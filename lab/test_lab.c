/* lab/test_lab.c: the proofs of the lab (lab/lab.c, lab/subwords.c, lab/runs.c, lab/catalogs.c)
 * and of the fast path (lab/fast_path.c)
 *
 * Built by make test in double (test_lab_f64), in float (test_lab) and in
 * float without OpenMP (test_lab_serial), with the lab plugged in as make's
 * ./transformer runs (lab_plug_in); each ends with "N passed, M failed":
 *   - the fast path against transformer.c's loops: the matrix product against
 *     plain loops for every shape and form, any thread count giving the same
 *     bits, the linear layers and attention element by element (to rounding),
 *     the dispatch reaching it, and whole training steps;
 *   - transformer.c's Part I tests again (test_transformer.c's
 *     run_model_tests: gradient checks in double, the PyTorch reference files,
 *     masks, learning, decoding...), now with every product and attention
 *     through the fast path, and the tests worked by hand through both;
 *   - the lab: its SVG pictures; §5.1 byte-pair encoding (merges learned and
 *     applied, in checkpoints); the busy-machine thread count (--threads 0);
 *     and the command line, run as a user runs it: the binary TRANSFORMER_BIN
 *     names (make test: ./transformer), with transformer.c's commands
 *     (test_transformer.c's run_command_line_tests), then train's further flags
 *     (--resume, --keep-last, --save-every, --log, --loss-log, --positions,
 *     --bpe, --train-size...), the lab's commands (average, bleu, attention,
 *     pe, plot, bpe, params, table3), and checkpoints written by transformer.c
 *     alone (TRANSFORMER_MINIMAL_BIN, make test: ./transformer_minimal).
 *
 * INDEX: each piece of the lab -> the tests that prove it
 *   fast_path.c  linear_forward_fast, _backward_fast     test_fast_linear, test_fast_dispatch,
 *                                                        test_fast_training_step; the model tests
 *                                                        (reference files, gradient checks in
 *                                                        double)
 *                attention_forward_fast, _backward_fast  test_fast_attention, test_fast_dispatch,
 *                                                        test_fast_training_step,
 *                                                        test_attention_by_hand
 *                attention_one_query_fast                test_fast_attention (one query),
 *                                                        test_attention_by_hand,
 *                                                        test_decoder_logits
 *                matmul and its tiles                    test_matmul_against_plain_loops,
 *                                                        test_matmul_thread_count
 *                linear_forward_packed, packed_weight,   test_decoding_weights, test_decoding_hook
 *                fast_path_decoding
 *                cached_decoder_begin, _step, _reorder,  test_key_value_cache (transformer.c's
 *                _end                                    decoder's bits), test_decoder_logits,
 *                                                        test_decoding_hook
 *                checked_aligned_malloc                  test_fast_aligned_memory
 *   lab.c        svg_write_heatmap, _grid,               test_svg_*
 *                _positional_encoding, _attention,
 *                _loss_curve
 *                checkpoint_average, average             test_average; test_table3 (learned
 *                                                        positions)
 *                bleu                                    test_bleu_command
 *                attention, pe, plot                     test_log_keep_last_and_pictures,
 *                                                        test_command_names_and_labels
 *                params, parameter_group_count           test_parameter_groups,
 *                                                        test_lab_command_line
 *                table3 (table3_name_variant,            test_table3
 *                stored_option)
 *                commands, labels, errors naming them    test_command_names_and_labels,
 *                                                        test_lab_reads_minimal_checkpoints
 *                (bench has no test: make bench runs it)
 *   text.c       Unicode's white space, tokenize,        test_tsv_reading (\r\n, blank lines,
 *                dataset_read_tsv,                       Unicode spaces, <unk>, each error with its
 *                dataset_check_lengths                   file and line), test_tsv_command_line,
 *                                                        test_bleu_white_space
 *                the text rule (UTF-8, the byte-order    test_text_rule
 *                mark, reserved tokens)
 *   bleu.c       bleu_reset, bleu_add_sentence,          test_bleu (by hand: clipping, brevity,
 *                bleu_score                              corpus against sentence BLEU, Unicode
 *                                                        white space, a 40,000-token line)
 *                eval, evaluate                          test_tsv_command_line, test_eval_bleu
 *                                                        (eval --bleu = the BLEU of greedy outputs
 *                                                        one by one)
 *   subwords.c   bpe_learn, bpe_encode_word,             test_bpe_learn_and_apply,
 *                bpe_join_tokens                         test_bpe_numbers_data
 *                the merges in checkpoints, special      test_bpe_checkpoint,
 *                tokens                                  test_bpe_never_makes_special_tokens
 *                train --bpe, bpe                        test_bpe_command_line
 *   runs.c       lab_check_output (--force, a            test_existing_checkpoint
 *                directory)
 *                --resume                                test_lab_command_line,
 *                                                        test_existing_checkpoints_and_keep_last,
 *                                                        test_moved_data, test_bpe_command_line
 *                --keep-last, --save-every               test_log_keep_last_and_pictures,
 *                                                        test_existing_checkpoints_and_keep_last
 *                --log, --loss-log, --positions          test_log_keep_last_and_pictures,
 *                                                        test_lab_command_line
 *                --threads 0: cpu_times,                 test_free_cores
 *                others_busy_cores, free_cores_wanted,
 *                _decide
 *                --batch-log                             test_batch_log
 *   catalogs.c   mo_check, catalog_read_bytes (both      test_catalog_format
 *                byte orders, revisions, contexts,
 *                plurals)
 *                the filters (catalog_filter), their     test_catalog_filters
 *                counts
 *                catalog_drop_duplicates                 test_catalog_duplicates
 *                each kind of damage                     test_catalog_damage
 *                catalogs (languages, the split,         test_catalogs_command
 *                --force, --min-pairs)
 *   transformer.c's decoding: no empty translation (min_len 1)
 *                                                        test_no_empty_translation
 */
#define TRANSFORMER_NO_MAIN
#include "lab.c"                      // transformer.c, the fast path and the lab
#define TEST_TRANSFORMER_LIBRARY
#include "../test_transformer.c"      // check(), test batches and configurations,
                                      // transformer.c's tests
#include <signal.h>                   // kill, for the busy neighbours of test_free_cores

// The number printed after label in text (NAN when there is none).
static double printed_number_after(const char *text, const char *label) {
    const char *p = strstr(text, label);
    return p ? strtod(p + strlen(label), NULL) : NAN;
}

// Random A (rows, depth) and B (depth, cols) for a product of the given
// form, as the layers store them: form 0, A (rows, depth) and B stored as
// (cols, depth), i.e. x W^T; form 1, both row-major, dy W; form 2, A stored
// as (depth, rows), i.e. dy^T x. The caller frees av->data and bv->data.
static void random_operands(MatrixView *av, MatrixView *bv, int form, int M, int N, int depth,
                            Rng *rng) {
    real *a = checked_calloc((size_t)M * depth, sizeof(real), "test"),
         *b = checked_calloc((size_t)depth * N, sizeof(real), "test");
    for (size_t i = 0; i < (size_t)M * depth; i++) a[i] = (real)rng_normal(rng);
    for (size_t i = 0; i < (size_t)depth * N; i++) b[i] = (real)rng_normal(rng);
    *av = (MatrixView){ a, (size_t)depth, 1 };
    *bv = (MatrixView){ b, (size_t)N, 1 };
    if (form == 0) {
        bv->row_stride = 1;
        bv->col_stride = (size_t)depth;
    }
    if (form == 2) {
        av->row_stride = 1;
        av->col_stride = (size_t)M;
    }
}

// Part II's matrix product works in TILE_ROWS x TILE_COLS tiles, blocks of
// DEPTH_BLOCK along the depth and WIDTH_BLOCK along the columns, and shares
// strips of rows among threads.
// The model tests above use tiny sizes, which never reach a second block, so
// here it is checked against a plain loop in double precision on sizes that
// cross every boundary, for the three ways the layers read their matrices
// (x W^T, dy W, dy^T x), every other product adding to out and the others
// writing out = bias + A B.
static void test_matmul_against_plain_loops(void) {
    enum { NM = 4, NN = 5, ND = 3 };
    int Ms[NM] = { 1, 7, 40, 97 }, Ns[NN] = { 1, 16, 17, 33, 530 }, depths[ND] = { 1, 129, 300 };
    int extra[][3] = { { 40, 7, 4101 }, { 7, 40, 4101 } };   // and deep ones: 33 depth blocks,
                                                             // the last of 5
    int grid = NM * NN * ND, shapes = grid + (int)(sizeof extra / sizeof *extra);
    Rng rng;
    rng_seed(&rng, 11);
    double worst = 0;
    int cases = 0;
    for (int shape = 0; shape < shapes; shape++)
    for (int form = 0; form < 3; form++) {
        int M = shape < grid ? Ms[shape / (NN * ND)] : extra[shape - grid][0];
        int N = shape < grid ? Ns[shape / ND % NN] : extra[shape - grid][1];
        int depth = shape < grid ? depths[shape % ND] : extra[shape - grid][2];
        MatrixView av, bv;
        random_operands(&av, &bv, form, M, N, depth, &rng);
        int accumulate = cases % 2 == 0;
        real *c = checked_calloc((size_t)M * N, sizeof(real), "test");
        real *bias = checked_calloc((size_t)N, sizeof(real), "test");
        for (size_t i = 0; i < (size_t)M * N; i++) c[i] = (real)rng_normal(&rng);
        for (int n = 0; n < N; n++) bias[n] = (real)rng_normal(&rng);
        double *expected = checked_calloc((size_t)M * N, sizeof(double), "test");
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                // the product adds to what C holds, or to the bias
                double sum = accumulate ? c[(size_t)m * N + n] : bias[n];
                for (int d = 0; d < depth; d++)
                    sum += (double)av.data[m * av.row_stride + d * av.col_stride] *
                           bv.data[d * bv.row_stride + n * bv.col_stride];
                expected[(size_t)m * N + n] = sum;
            }
        if (accumulate)
            matmul((MatrixProduct){ c, (size_t)N, 1, av, bv, { NULL, 0, 0 }, M, N, depth, 1 });
        else
            matmul_assign(c, (size_t)N, av, bv, bias, M, N, depth);
        // relative to the size of a sum of depth products of N(0,1) numbers
        for (size_t i = 0; i < (size_t)M * N; i++) {
            double error = fabs(c[i] - expected[i]) / (sqrt((double)depth) + fabs(expected[i]));
            if (error > worst)
                worst = error;
        }
        cases++;
        free((real *)av.data);
        free((real *)bv.data);
        free(c);
        free(bias);
        free(expected);
    }
    double tolerance = sizeof(real) == sizeof(float) ? 1e-5 : 1e-13;
    check(worst < tolerance,
          "matmul: %d products up to 97 x 530 x 300 and 40 x 7 x 4101 (every tile edge, depth and "
          "width block; out += A B and out = bias + A B) match a plain loop in double: worst error "
          "%.2g", cases, worst);
}

// The matrix product gives each element of out to one thread, which sums it in
// the same order whatever the number of threads: 1, 2 and 3 threads must give
// the same bits, for the three ways the layers read their matrices.
static void test_matmul_thread_count(void) {
#ifdef _OPENMP
    // rows, cols, depth: many strips; fewer rows than a strip; a short last strip of columns;
    // few columns
    int shapes[][3] = { { 97, 530, 300 }, { 7, 530, 129 }, { 40, 33, 300 }, { 97, 16, 300 } };
    Rng rng;
    rng_seed(&rng, 12);
    int identical = 1, cases = 0, threads_before = omp_get_max_threads();
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
    for (int form = 0; form < 3; form++) {
        int M = shapes[i][0], N = shapes[i][1], depth = shapes[i][2];
        MatrixView av, bv;
        random_operands(&av, &bv, form, M, N, depth, &rng);
        real *c[3];
        for (int t = 0; t < 3; t++) {
            c[t] = checked_calloc((size_t)M * N, sizeof(real), "test");
            omp_set_num_threads(t + 1);
            matmul_assign(c[t], (size_t)N, av, bv, NULL, M, N, depth);
        }
        identical &= memcmp(c[0], c[1], (size_t)M * N * sizeof(real)) == 0 &&
                     memcmp(c[0], c[2], (size_t)M * N * sizeof(real)) == 0;
        cases++;
        free((real *)av.data);
        free((real *)bv.data);
        free(c[0]);
        free(c[1]);
        free(c[2]);
    }
    omp_set_num_threads(threads_before);
    check(identical,
          "matmul: 1, 2 and 3 threads give bit-identical products (%d products, all three forms)",
          cases);
#else
    printf("     (built without OpenMP: one thread only, nothing to compare)\n");
#endif
}

// The fast path's scratch memory starts on a cache line, as transformer.c's arenas do.
static void test_fast_aligned_memory(void) {
    int aligned = 1;
    size_t sizes[] = { 1, 5, CACHE_LINE / sizeof(real), 2 * CACHE_LINE / sizeof(real), 17, 53,
                       161, 485 };
    for (size_t i_size = 0; i_size < sizeof sizes / sizeof *sizes; i_size++) {
        size_t n = sizes[i_size];
        real *a = checked_aligned_malloc(n, sizeof(real), "test");
        aligned &= on_line(a);
        for (size_t i = 0; i < n; i++)
            a[i] = 1;   // all n are there to write (the sanitizer builds would see otherwise)
        free(a);
    }
    check(aligned,
          "memory: the fast path's checked_aligned_malloc gives addresses on %d-byte lines",
          CACHE_LINE);
}

// ============================================================================
// Part II against Part I
// The default build computes the linear layers and attention with Part II's
// tiles; Part I's loops are the reference. Each comparison below calls Part
// II's function itself (linear_forward_fast, ...) and Part I's with
// fast_path_use(0), on the same numbers; test_fast_dispatch checks that the
// default build's calls do reach Part II. The two sum in different orders,
// so they agree to rounding: an element that sums n products differs by at
// most a few n u sum_i |term_i| (u: the unit roundoff, 6e-8 in float), and
// in practice by about sqrt(n) u sum_i |term_i|. So each element of a
// linear layer is measured against sum_k |term_k|, which the test computes
// with Part I on the absolute values of the operands, and held to
// FAST_TOLERANCE; attention and a whole training step are measured against
// each tensor's largest element and held to FAST_STEP_TOLERANCE. Both are
// 10 to 25 times the largest difference measured (linear layers: 3.8e-7 in
// float, 6.9e-16 in double; attention 1.0e-6 and 1.2e-15; a training step's
// gradients 5.0e-7 and 1.1e-15).
// ============================================================================

#define FAST_TOLERANCE (sizeof(real) == sizeof(float) ? 1e-5 : 1e-14)
#define FAST_STEP_TOLERANCE (sizeof(real) == sizeof(float) ? 1e-5 : 3e-14)

static real *copy_of(const real *x, size_t n) {
    real *y = checked_calloc(n, sizeof(real), "test");
    memcpy(y, x, n * sizeof(real));
    return y;
}

static real *absolute_of(const real *x, size_t n) {
    real *y = checked_calloc(n, sizeof(real), "test");
    for (size_t i = 0; i < n; i++) y[i] = (real)fabs((double)x[i]);
    return y;
}

static real *random_reals(size_t n, Rng *rng) {
    real *x = checked_calloc(n, sizeof(real), "test");
    for (size_t i = 0; i < n; i++) x[i] = (real)rng_normal(rng);
    return x;
}

// The largest |fast_i - plain_i| / (scale_i + tiny) over n elements: the
// difference against the sum of absolute terms (scale) of each element.
static double worst_scaled_difference(const real *fast, const real *plain, const real *scale,
                                      size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)fast[i] - (double)plain[i]) / ((double)scale[i] + 1e-30);
        if (!(d <= worst))
            worst = d;   // NaN counts as the worst
    }
    return worst;
}

// The largest |a_i - b_i| over the largest |b_i|.
static double relative_difference(const real *a, const real *b, size_t n) {
    double d = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (!(e <= d))
            d = e;
        scale = fmax(scale, fabs((double)b[i]));
    }
    return d / (scale > 0 ? scale : 1);
}

// One linear layer, forward and backward: Part II's functions, then Part
// I's loops, with a bias or without, asking for dinp or not (NULL). Returns
// the worst scaled difference over out, dinp (when asked for), dweight and dbias.
static double linear_fast_against_plain(int N, int IC, int OC, int with_bias, int with_dinp,
                                        Rng *rng) {
    size_t n_in = (size_t)N * IC, n_w = (size_t)OC * IC, n_out = (size_t)N * OC;
    real *x = random_reals(n_in, rng), *w = random_reals(n_w, rng), *b = random_reals(OC, rng);
    real *dout = random_reals(n_out, rng);
    real *bias = with_bias ? b : NULL;
    // the results: [0] Part II, [1] Part I; backward accumulates onto the same starting values
    real *out[2], *dinp[2], *dw[2], *db[2];
    real *dinp0 = random_reals(n_in, rng), *dw0 = random_reals(n_w, rng),
         *db0 = random_reals(OC, rng);
    for (int plain = 0; plain < 2; plain++) {
        out[plain] = checked_calloc(n_out, sizeof(real), "test");
        dinp[plain] = copy_of(dinp0, n_in);
        dw[plain] = copy_of(dw0, n_w);
        db[plain] = copy_of(db0, OC);
        real *dbias = with_bias ? db[plain] : NULL, *dx = with_dinp ? dinp[plain] : NULL;
        if (plain) {
            fast_path_use(0);
            linear_forward(out[1], x, w, bias, N, IC, OC);
            linear_backward(dx, dw[1], dbias, dout, x, w, N, IC, OC);
        } else {
            linear_forward_fast(out[0], x, w, bias, N, IC, OC);
            linear_backward_fast(dx, dw[0], dbias, dout, x, w, N, IC, OC);
        }
    }
    // the scale of each element: Part I on |operands|, starting from |what it added to|
    real *ax = absolute_of(x, n_in), *aw = absolute_of(w, n_w), *ab = absolute_of(b, OC);
    real *adout = absolute_of(dout, n_out), *s_out = checked_calloc(n_out, sizeof(real), "test");
    real *s_dinp = absolute_of(dinp0, n_in), *s_dw = absolute_of(dw0, n_w),
         *s_db = absolute_of(db0, OC);
    linear_forward(s_out, ax, aw, with_bias ? ab : NULL, N, IC, OC);
    linear_backward(s_dinp, s_dw, s_db, adout, ax, aw, N, IC, OC);
    fast_path_use(1);
    double worst = fmax(fmax(worst_scaled_difference(out[0], out[1], s_out, n_out),
                             worst_scaled_difference(dinp[0], dinp[1], s_dinp, n_in)),
                        fmax(worst_scaled_difference(dw[0], dw[1], s_dw, n_w),
                             worst_scaled_difference(db[0], db[1], s_db, OC)));
    real *all[] = { x, w, b, dout, dinp0, dw0, db0, out[0], out[1], dinp[0], dinp[1], dw[0], dw[1],
                    db[0], db[1], ax, aw, ab, adout, s_out, s_dinp, s_dw, s_db };
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
    return worst;
}

// Every shape of linear layer the model makes in the bench configs tiny
// (d_model 64, d_ff 256, 14 words, 96 x 12 tokens) and toy (128, 512, 1000
// words, 32 x 32), in training (rows B*S) and in decoding (a row per
// sentence or beam; here outside a decoding, in matmul: test_decoding_weights
// has the packed weights'), the shapes of base (512, 2048, 8000 words, 8 x 64) with
// the most depth and width, and shapes on either side of every boundary of
// Part II's products: a tile's rows and columns, a depth block and a width block.
static void test_fast_linear(void) {
    int shapes[][3] = {   // N (rows), IC (in), OC (out)
        { 1152, 64, 192 }, { 1152, 64, 64 }, { 1152, 64, 128 }, { 1152, 64, 256 },
        { 1152, 256, 64 }, { 1152, 64, 14 },
        { 1024, 128, 384 }, { 1024, 128, 512 }, { 1024, 512, 128 }, { 1024, 128, 1000 },
        { 1, 128, 384 }, { 4, 128, 1000 }, { 8, 64, 256 }, { 96, 64, 14 },
        { 512, 512, 2048 }, { 512, 2048, 512 }, { 64, 512, 8000 }, { 8, 512, 1536 },
        { TILE_ROWS + 1, DEPTH_BLOCK + 1, WIDTH_BLOCK + TILE_COLS + 1 }, { TILE_COLS, 129, 16 },
        { TILE_COLS + 1, 7, 17 }, { 3, 300, 530 }, { 97, 1, 33 }, { 2 * TILE_ROWS + 1, 40, 1 },
        { TILE_COLS, 128, 384 }, { 20, 64, 100 },
    };
    Rng rng;
    rng_seed(&rng, 31);
    double worst = 0;
    int count = (int)(sizeof shapes / sizeof *shapes);
    for (int s = 0; s < count; s++)
        worst = fmax(worst, linear_fast_against_plain(shapes[s][0], shapes[s][1], shapes[s][2],
                                                      s % 4 != 3, s % 5 != 4, &rng));
    check(worst < FAST_TOLERANCE,
          "Part II: linear_forward_fast and linear_backward_fast (out, dinp, dW, dbias; without a "
          "bias, or dinp, in some) of %d shapes (tiny, toy, base, decoding, every tile and block "
          "edge) agree with Part I's loops: worst %.2g of the sum of |terms| (tolerance %.0e)",
          count, worst, FAST_TOLERANCE);
}

// One attention call, forward and backward: Part II's functions (called
// directly: with one query, the default build's dispatch runs Part I), then
// Part I's loops.
// q is (B,Tq,q_stride), k and v lie in (B,Tk,kv_stride): the fused (B,T,3C)
// layout of self-attention, or the encoder-decoder attention's q (B,T,C) and
// kv (B,S,2C). Returns the worst relative difference (relative_difference)
// over out, att, dq, dk and dv.
static double attention_fast_against_plain(int B, int Tq, int Tk, int C, int NH, int self,
                                           int causal, const int *key_len, Rng *rng) {
    int q_stride = self ? 3 * C : C, kv_stride = self ? 3 * C : 2 * C;
    size_t n_q = (size_t)B * Tq * q_stride, n_kv = (size_t)B * Tk * kv_stride,
           n_out = (size_t)B * Tq * C;
    size_t n_att = (size_t)B * NH * Tq * Tk;
    real *q = random_reals(n_q, rng), *kv = self ? q : random_reals(n_kv, rng),
         *dout = random_reals(n_out, rng);
    const real *k = self ? q + C : kv, *v = self ? q + 2 * C : kv + C;
    real *out[2], *att[2], *dq[2], *dkv[2];
    for (int plain = 0; plain < 2; plain++) {
        out[plain] = checked_calloc(n_out, sizeof(real), "test");
        att[plain] = checked_calloc(n_att, sizeof(real), "test");
        dq[plain] = checked_calloc(n_q, sizeof(real), "test");
        dkv[plain] = self ? dq[plain] : checked_calloc(n_kv, sizeof(real), "test");
        real *dk = self ? dq[plain] + C : dkv[plain],
             *dv = self ? dq[plain] + 2 * C : dkv[plain] + C;
        fast_path_use(0);
        AttentionShape shape = { B, Tq, Tk, C, NH, q_stride, kv_stride };
        if (plain) {
            attention_forward(out[1], att[1], q, k, v, key_len, causal, shape);
            attention_backward(dq[1], dk, dv, dout, att[1], q, k, v, shape);
        } else {
            attention_forward_fast(out[0], att[0], q, k, v, key_len, causal, shape);
            attention_backward_fast(dq[0], dk, dv, dout, att[0], q, k, v, shape);
        }
    }
    fast_path_use(1);
    double worst = fmax(relative_difference(out[0], out[1], n_out),
                        relative_difference(att[0], att[1], n_att));
    worst = fmax(worst, relative_difference(dq[0], dq[1], n_q));   // dq, and dk and dv when fused
    if (!self)
        worst = fmax(worst, relative_difference(dkv[0], dkv[1], n_kv));
    free(q);
    free(dout);
    free(out[0]);
    free(out[1]);
    free(att[0]);
    free(att[1]);
    free(dq[0]);
    free(dq[1]);
    if (!self) {
        free(kv);
        free(dkv[0]);
        free(dkv[1]);
    }
    return worst;
}

// The attention calls the model makes (the encoder's self-attention with
// padded keys, the decoder's with the causal mask too, reading q, k, v from
// the fused (B, T, 3C) projection; the encoder-decoder attention with q
// (B, T, C) and k, v in (B, S, 2C)), with ragged lengths down to one key,
// one head and several, head sizes of 8 to 64 (toy's 32 and base's 64 among
// them) and key counts on either side of a tile's width.
static void test_fast_attention(void) {
    Rng rng;
    rng_seed(&rng, 32);
    int lengths[4] = { 13, 5, 1, 9 }, wide[3] = { TILE_COLS + 3, 2, TILE_COLS }, one[2] = { 9, 4 };
    int toy[3] = { 32, 17, 1 }, base[2] = { 64, 41 };
    double worst = 0;
    worst = fmax(worst,
                 attention_fast_against_plain(4, 13, 13, 32, 2, 1, 0, lengths, &rng));   // encoder
    worst = fmax(worst,
                 attention_fast_against_plain(4, 13, 13, 32, 2, 1, 1, lengths, &rng));   // decoder
    worst = fmax(worst, attention_fast_against_plain(3, 9, TILE_COLS + 3, 24, 3, 0, 0, wide,
                                                     &rng));   // cross
    worst = fmax(worst, attention_fast_against_plain(3, TILE_COLS + 3, TILE_COLS + 3, 16, 1, 1, 1,
                                                     wide, &rng));
    worst = fmax(worst,
                 attention_fast_against_plain(2, 1, 9, 32, 4, 0, 0, one, &rng));   // one query
    // one query with the head groups of attention_one_query_fast: toy's, base's, tiny's head sizes,
    // a head wider than a group, a group of 3 vectors, and a causal self-attention (one key)
    int one_toy[3] = { 32, 7, 1 };
    worst = fmax(worst, attention_fast_against_plain(3, 1, 32, 128, 4, 0, 0, one_toy, &rng));
    worst = fmax(worst, attention_fast_against_plain(3, 1, 32, 512, 8, 0, 0, one_toy, &rng));
    worst = fmax(worst, attention_fast_against_plain(3, 1, 32, 64, 4, 0, 0, one_toy, &rng));
    worst = fmax(worst, attention_fast_against_plain(2, 1, 32, 512, 2, 0, 0, one_toy, &rng));
    worst = fmax(worst, attention_fast_against_plain(3, 1, 32, 48, 1, 0, 0, one_toy, &rng));
    worst = fmax(worst, attention_fast_against_plain(3, 1, 32, 96, 3, 0, 0, one_toy, &rng));
    int one_key[3] = { 1, 1, 1 };
    worst = fmax(worst, attention_fast_against_plain(3, 1, 1, 128, 4, 1, 1, one_key, &rng));
    worst = fmax(worst,
                 attention_fast_against_plain(3, 32, 32, 128, 4, 1, 1, toy, &rng));   // toy's sizes
    worst = fmax(worst, attention_fast_against_plain(3, 20, 32, 128, 4, 0, 0, toy, &rng));
    worst = fmax(worst,
                 attention_fast_against_plain(2, 64, 64, 512, 8, 1, 1, base, &rng));   // base's
    worst = fmax(worst, attention_fast_against_plain(2, 64, 64, 512, 8, 0, 0, base, &rng));
    check(worst < FAST_STEP_TOLERANCE,
          "Part II: attention_forward_fast and attention_backward_fast (out, probabilities, dq, "
          "dk, dv) with padding and causal masks, fused and separate q, k, v, head sizes 8 to 64, "
          "agree with Part I's loops: worst %.2g of each tensor's largest (tolerance %.0e)",
          worst, FAST_STEP_TOLERANCE);
}

// The default build's calls reach Part II: with fast_path_use(1),
// linear_forward and attention_forward give the bits of linear_forward_fast
// and attention_forward_fast. The product's bits differ from Part I's in at
// least one element (Part II sums a depth of 300 in blocks of 128, Part I in
// one run), so the comparisons above and the training step below compare two
// different computations. Attention's bits differ where the compiler
// vectorises or fuses Part II's sums; a build without either (the sanitizer's
// -O1) can give Part I's bits exactly, and then only the product can tell.
static void test_fast_dispatch(void) {
    Rng rng;
    rng_seed(&rng, 35);
    int N = 97, IC = 300, OC = 530, B = 2, T = 40, C = 64, NH = 2, len[2] = { 40, 23 };
    real *x = random_reals((size_t)N * IC, &rng), *w = random_reals((size_t)OC * IC, &rng);
    real *out[3], *att[3], *heads[3], *qkv = random_reals((size_t)B * T * 3 * C, &rng);
    for (int way = 0; way < 3; way++) {   // 0: Part II itself, 1: the dispatch, 2: Part I
        out[way] = checked_calloc((size_t)N * OC, sizeof(real), "test");
        att[way] = checked_calloc((size_t)B * NH * T * T, sizeof(real), "test");
        heads[way] = checked_calloc((size_t)B * T * C, sizeof(real), "test");
        fast_path_use(way < 2);
        AttentionShape shape = { B, T, T, C, NH, 3 * C, 3 * C };
        if (way == 0) {
            linear_forward_fast(out[0], x, w, NULL, N, IC, OC);
            attention_forward_fast(heads[0], att[0], qkv, qkv + C, qkv + 2 * C, len, 1, shape);
        } else {
            linear_forward(out[way], x, w, NULL, N, IC, OC);
            attention_forward(heads[way], att[way], qkv, qkv + C, qkv + 2 * C, len, 1, shape);
        }
    }
    fast_path_use(1);
    size_t n_out = (size_t)N * OC * sizeof(real), n_heads = (size_t)B * T * C * sizeof(real);
    check(memcmp(out[0], out[1], n_out) == 0 && memcmp(heads[0], heads[1], n_heads) == 0 &&
          memcmp(out[1], out[2], n_out) != 0,
          "Part II: a default build's linear_forward and attention_forward run Part II (its bits; "
          "the product's not Part I's)");
    if (memcmp(heads[1], heads[2], n_heads) == 0)
        printf("     (this build's Part II attention gives Part I's exact bits)\n");
    for (int way = 0; way < 3; way++) {
        free(out[way]);
        free(att[way]);
        free(heads[way]);
    }
    free(x);
    free(w);
    free(qkv);
}

// The weights decoding has packed (entries of decoding_weights that stand for one).
static int decoding_weights_packed(void) {
    int packed = 0;
    for (int i = 0; i < decoding_weights.count; i++)
        packed += decoding_weights.packed[i].weight != NULL;
    return packed;
}

// While the cache decodes (fast_path_decoding(1) .. (0)), linear_forward_fast
// packs a weight on its first product of few rows and reads the packed strips
// after: the bits of matmul's product, on the call that packs (with 3
// threads) and on later ones (2 and 1), for few rows (1-8, DECODING_ROWS:
// short and whole strips of rows), short last strips of columns (and a
// weight of fewer rows than a strip), depths that end in a short block, and
// in less than a cache line. Decoding's end forgets the packs, so
// a weight changed in the same memory between two decodings is packed anew,
// into the same memory.
static void test_decoding_weights(void) {
    int shapes[][3] = { { 1, 64, 100 }, { 4, 200, 70 }, { 7, 300, 33 }, { 8, 512, 96 },
                        { DECODING_ROWS, 128, 1000 }, { 3, 5, 7 }, { 2, 9, 20 } };   // N, IC, OC
    Rng rng;
    rng_seed(&rng, 14);
    int identical = 1, packed_once = 1, forgotten = 1, memory_kept = 1, cases = 0;
#ifdef _OPENMP
    int threads_before = omp_get_max_threads();
#endif
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        int N = shapes[i][0], IC = shapes[i][1], OC = shapes[i][2];
        size_t n_out = (size_t)N * OC;
        real *x = random_reals((size_t)N * IC, &rng), *w = random_reals((size_t)OC * IC, &rng);
        real *b = random_reals(OC, &rng), *bias = with_bias ? b : NULL;
        real *plain = checked_calloc(n_out, sizeof(real), "test"),
             *packed = checked_calloc(n_out, sizeof(real), "test");
        for (int changed = 0; changed < 2; changed++) {
            if (changed)   // the same memory, another weight
                for (size_t k = 0; k < (size_t)OC * IC; k++) w[k] = -w[k] / 2;
            matmul_assign(plain, (size_t)OC, (MatrixView){ x, (size_t)IC, 1 },
                          (MatrixView){ w, 1, (size_t)IC }, bias, N, OC, IC);
            int entries_before = decoding_weights.count;
            fast_path_decoding(1);
            for (int call = 0; call < 3; call++) {   // packed, then read twice
#ifdef _OPENMP
                omp_set_num_threads(3 - call);
#endif
                memset(packed, 0, n_out * sizeof(real));
                linear_forward_fast(packed, x, w, bias, N, IC, OC);
                identical &= memcmp(plain, packed, n_out * sizeof(real)) == 0;
                packed_once &= decoding_weights_packed() == 1;
            }
            fast_path_decoding(0);
            forgotten &= decoding_weights_packed() == 0 && decoding_weights.decodings == 0;
            if (changed)
                memory_kept &= decoding_weights.count == entries_before;
        }
        cases++;
        free(x);
        free(w);
        free(b);
        free(plain);
        free(packed);
    }
#ifdef _OPENMP
    omp_set_num_threads(threads_before);
#endif
    check(identical && packed_once && forgotten && memory_kept,
          "decoding: products of few rows from a weight packed once give matmul's bits (%d shapes "
          "and biases, 1-3 threads; a weight changed between decodings too), the pack forgotten "
          "when decoding ends and its memory used again", cases);
}

// cached_decoder_begin and _end tell the products that decoding begins and
// ends: a sentence of 5 tokens, so that the encoder's products have few rows
// too, packs at the first position every weight (the encoder's 4 a layer, the
// decoder's 7: the memory's keys and values, and 6 a step; and the output
// projection), none at the second, and after, none stands for a weight; nor
// after fast_path_use(0) in a decoding, which goes on with its cache.
static void test_decoding_hook(void) {
    TransformerConfig config = decode_config();
    Transformer model;
    transformer_build(&model, &config, 15);
    model.training = 0;
    int S = 5, src[5] = { 3, 4, 5, 6, 7 }, tokens[2] = { TOKEN_BOS, 5 };
    Decoder decoder;
    decoder_begin(&decoder, &model, src, &S, 1, S, 1, 4);
    int began = decoding_weights.decodings == 1 && decoder.cache != NULL;
    decoder_step(&decoder, &model, &tokens[0], 0, 1);
    int at_first = decoding_weights_packed();
    decoder_step(&decoder, &model, &tokens[1], 1, 1);
    int at_second = decoding_weights_packed(), expected = 11 * config.n_layers + 1;
    decoder_end(&decoder);
    int ended = decoding_weights.decodings == 0 && decoding_weights_packed() == 0;
    // fast_path_use mid-decoding forgets the packs at once; the decoding goes on with its cache
    // (with transformer.c's products), and its end leaves no decoding under way
    decoder_begin(&decoder, &model, src, &S, 1, S, 1, 4);
    decoder_step(&decoder, &model, &tokens[0], 0, 1);
    fast_path_use(0);
    int switched = decoding_weights.decodings == 0 && decoding_weights_packed() == 0;
    decoder_step(&decoder, &model, &tokens[1], 1, 1);
    switched &= decoder.cache != NULL && decoding_weights_packed() == 0;
    decoder_end(&decoder);
    switched &= decoding_weights.decodings == 0;
    fast_path_use(1);
    check(began && at_first == expected && at_second == expected && ended && switched,
          "decoding: cached_decoder_begin and _end tell the products (decoding %s; weights packed: "
          "%d at the first position, %d at the second, %d expected; %s after; %s by fast_path_use)",
          began ? "began" : "did not begin", at_first, at_second, expected, ended ? "none" : "some",
          switched ? "all forgotten" : "not forgotten");
    transformer_free(&model);
}

// The key/value cache against transformer.c's decoder, which re-runs the
// decoder stack over every position so far: with transformer.c's products
// (only the four decoder hooks set) the same logits bit for bit at every
// step, so the same greedy outputs of sentences side by side, padded, and
// the same beam 4 outputs and scores, on a trained and an untrained model.
static void test_key_value_cache(void) {
    TransformerConfig config = decode_config();
    Transformer untrained;
    transformer_build(&untrained, &config, 16);
    Transformer *models[2] = { trained_copy_model(), &untrained };
    Rng rng;
    rng_seed(&rng, 36);
    int B = 5, S = 7, same_greedy = 1, same_beam = 1, same_logits = 1, ended = 0;
    for (int k = 0; k < 2; k++) {
        Transformer *m = models[k];
        int V = m->config.vocab_size, src[5 * 7] = { 0 }, src_len[5];
        for (int b = 0; b < B; b++) {
            src_len[b] = 2 + b;
            random_source(src + b * S, src_len[b], V, &rng);
        }
        int fed[6][5];   // the decoder's inputs at 6 positions: <s>, then random words
        for (int t = 0; t < 6; t++)
            for (int b = 0; b < B; b++)
                fed[t][b] = t == 0 ? TOKEN_BOS
                                   : NUM_SPECIAL_TOKENS + rng_below(&rng, V - NUM_SPECIAL_TOKENS);
        int out[2][5 * 20], out_len[2][5], beam[2][5][20], beam_len[2][5];
        double score[2][5];
        real *logits[2];
        for (int cached = 0; cached < 2; cached++) {
            fast_path_use(0);
            if (cached) {
                fast_path.decoder_begin = cached_decoder_begin;
                fast_path.decoder_step = cached_decoder_step;
                fast_path.decoder_reorder = cached_decoder_reorder;
                fast_path.decoder_end = cached_decoder_end;
            }
            m->training = 0;
            lab_greedy_decode(m, out[cached], out_len[cached], 20, src, src_len, B, S);
            for (int b = 0; b < B; b++)
                beam_len[cached][b] = transformer_beam_search(m, beam[cached][b], &score[cached][b],
                                                              src + b * S, src_len[b], 4, 0.6);
            // one decoder's logits at each of 6 positions, for B rows fed random words
            Decoder decoder;
            decoder_begin(&decoder, m, src, src_len, B, S, B, 6);
            logits[cached] = checked_calloc((size_t)6 * B * V, sizeof(real), "test");
            for (int t = 0; t < 6; t++) {
                decoder_step(&decoder, m, fed[t], t, B);
                memcpy(logits[cached] + (size_t)t * B * V, decoder.logits,
                       (size_t)B * V * sizeof(real));
            }
            decoder_end(&decoder);
        }
        fast_path_use(1);
        same_logits &= memcmp(logits[0], logits[1], (size_t)6 * B * V * sizeof(real)) == 0;
        for (int b = 0; b < B; b++) {
            same_greedy &= out_len[0][b] == out_len[1][b] &&
                           memcmp(out[0] + b * 20, out[1] + b * 20,
                                  out_len[0][b] * sizeof(int)) == 0;
            same_beam &= beam_len[0][b] == beam_len[1][b] && score[0][b] == score[1][b] &&
                         memcmp(beam[0][b], beam[1][b], beam_len[0][b] * sizeof(int)) == 0;
            ended += k == 0 && out_len[0][b] < transformer_decode_limit(m, src_len[b]);
        }
        free(logits[0]);
        free(logits[1]);
    }
    check(same_logits,
          "decoding: the key/value cache gives transformer.c's decoder's logits bit for bit "
          "(%d rows, 6 positions, 2 models)", B);
    check(same_greedy && same_beam && ended == B,
          "decoding: with the key/value cache, greedy (%d sentences side by side, %d of the "
          "trained model's ended by </s>) and beam 4 give transformer.c's outputs and scores",
          B, ended);
    transformer_free(&untrained);
}

// A whole training step of a model, Part II against Part I: the loss, the
// logits and every parameter's gradient, each tensor held to
// FAST_STEP_TOLERANCE of its largest element. (Adam, after it, is Part I's
// code in both builds.)
static void test_fast_training_step(void) {
    TransformerConfig config = small_config();
    config.d_model = 40;
    config.n_heads = 5;
    config.d_ff = 72;
    config.vocab_size = 23;
    config.max_len = 24;
    config.n_layers = 2;
    int src_len[3] = { 17, 9, 4 }, tgt_len[3] = { 5, 19, 12 };
    Rng rng;
    rng_seed(&rng, 33);
    static TestBatch tb;
    make_test_batch(&tb, 3, 17, 19, src_len, tgt_len, config.vocab_size, &rng);
    Transformer m[2];
    real loss[2];
    for (int plain = 0; plain < 2; plain++) {
        fast_path_use(!plain);
        transformer_build(&m[plain], &config, 34);
        m[plain].training = 1;   // dropout on: the same masks both ways (the same seed)
        loss[plain] = transformer_forward(&m[plain], &tb.batch);
        transformer_zero_grad(&m[plain]);
        transformer_backward(&m[plain], &tb.batch);
    }
    fast_path_use(1);
    double logits = relative_difference(m[0].acts.logits, m[1].acts.logits,
                                        (size_t)3 * 19 * config.vocab_size);
    double worst_grad = 0;
    const char *worst_name = "";
    real **grads[2][NUM_PARAMETER_TENSORS];
    parameter_pointers(grads[0], &m[0].grads);
    parameter_pointers(grads[1], &m[1].grads);
    int compared = 0;
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        if (m[0].param_sizes[t] == 0)
            continue;   // position_embedding, with sinusoids
        double d = relative_difference(*grads[0][t], *grads[1][t], m[0].param_sizes[t]);
        if (d > worst_grad) {
            worst_grad = d;
            worst_name = parameter_names[t];
        }
        compared++;
    }
    check(fabs((double)loss[0] - loss[1]) <= FAST_STEP_TOLERANCE * fabs((double)loss[1]) &&
          logits < FAST_STEP_TOLERANCE && worst_grad < FAST_STEP_TOLERANCE,
          "Part II: a training step (2 layers, d_model 40, 5 heads, ragged batch, dropout on) "
          "gives Part I's loss (%.9g, %.9g), logits (%.1e) and all %d gradients (worst %.1e, %s; "
          "tolerance %.0e)",
          (double)loss[0], (double)loss[1], logits, compared, worst_grad, worst_name,
          FAST_STEP_TOLERANCE);
    transformer_free(&m[0]);
    transformer_free(&m[1]);
}

// ============================================================================
// Pictures: the SVG writers
// The files are checked as text: the number of <rect> elements (one per
// heatmap cell, plus the background, one frame per panel and the colour bar),
// labels escaped for XML, the colour scale present, errors as one line.
// ============================================================================

static int count_occurrences(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)) != NULL; p += strlen(what)) n++;
    return n;
}

static int file_exists(const char *path) { return access(path, F_OK) == 0; }

static void svg_test_path(char *out, size_t size, const char *name) {
    snprintf(out, size, "/tmp/test_transformer_%ld_%s", (long)getpid(), name);
}

// Sends stderr to a file between capture_begin and capture_end, which returns
// what was printed, so that a test can check an error message.
static int captured_fd = -1, saved_stderr = -1;
static char captured_path[256];

static void capture_begin(void) {
    svg_test_path(captured_path, sizeof captured_path, "stderr.txt");
    fflush(stderr);
    saved_stderr = dup(2);
    captured_fd = open(captured_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(captured_fd, 2);
}

static void capture_end(char *printed, size_t size) {
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(captured_fd);
    close(saved_stderr);
    char *text = read_text_file(captured_path);
    snprintf(printed, size, "%s", text ? text : "");
    free(text);
    remove(captured_path);
}

// One line, starting with `start`.
static int one_error_line(const char *printed, const char *start) {
    return strncmp(printed, start, strlen(start)) == 0 && count_occurrences(printed, "\n") == 1;
}

static int loss_curve_capturing_stderr(const char *svg_path, const char *csv_path, char *printed,
                                       size_t size) {
    capture_begin();
    int status = svg_write_loss_curve(svg_path, csv_path, "test");
    capture_end(printed, size);
    return status;
}

static void test_svg_heatmap(void) {
    char path[256];
    svg_test_path(path, sizeof path, "heatmap.svg");
    const real values[6] = { 0, 0.5, 1, 0.25, 0.75, 0.1 };
    const char *rows[2] = { "<s>", "a&b" }, *cols[3] = { "x", "\"q\"", "it's" };
    int status = svg_write_heatmap(path, values, 2, 3, rows, cols, "tokens <s> & </s>", 0, 1);
    char *svg = read_text_file(path);
    check(status == 0 && svg != NULL, "SVG heatmap: written");
    if (svg) {
        check(count_occurrences(svg, "<rect") == 6 + 3,
              "SVG heatmap: %d <rect> (6 cells, background, frame, colour bar)",
              count_occurrences(svg, "<rect"));
        check(strstr(svg, ">&lt;s&gt;<") && strstr(svg, ">a&amp;b<") &&
              strstr(svg, ">&quot;q&quot;<") && strstr(svg, ">it&apos;s<") &&
              strstr(svg, "tokens &lt;s&gt; &amp; &lt;/s&gt;") && !strstr(svg, "<s>"),
              "SVG heatmap: labels and title escaped for XML (&lt;s&gt;, a&amp;b, &quot;q&quot;)");
        check(strstr(svg, "linearGradient") && strstr(svg, "url(#colour-scale-sequential)") &&
              strstr(svg, ">0</text>") && strstr(svg, ">1</text>") &&
              strstr(svg, ">0.5</text>"),
              "SVG heatmap: colour scale with its min 0, middle 0.5 and max 1");
        // value 1 is the darkest blue, 0 white; each cell's tooltip names its row and column
        check(strstr(svg, "fill=\"#08306b\"><title>&lt;s&gt; | it&apos;s: 1</title>") &&
              strstr(svg, "fill=\"#ffffff\"><title>&lt;s&gt; | x: 0</title>"),
              "SVG heatmap: cell colours from the scale (1 darkest blue, 0 white) with row | "
              "column tooltips");
        check(strncmp(svg, "<?xml", 5) == 0 && strstr(svg, "</svg>\n") &&
              count_occurrences(svg, "<text") == count_occurrences(svg, "</text>"),
              "SVG heatmap: XML declaration, closed <svg>, every <text> closed");
    }
    free(svg);
    remove(path);
    // UTF-8 passes through; bytes that are not UTF-8 (a lone 0xFF, the overlong
    // 0xC0 0xAF, a surrogate 0xED 0xA0 0x80) and control characters become '?'
    const char *utf8_rows[2] = { "zw\xc3\xb6lf \xe2\x86\x92", "a\xff" "b\xc0\xaf" "c\xed\xa0\x80" },
               *utf8_cols[3] = { "x\x01", "y", "z" };
    status = svg_write_heatmap(path, values, 2, 3, utf8_rows, utf8_cols, NULL, 0, 1);
    svg = read_text_file(path);
    check(status == 0 && svg && strstr(svg, ">zw\xc3\xb6lf \xe2\x86\x92</text>") &&
          strstr(svg, ">a?b?" "?c?" "?" "?</text>") && strstr(svg, ">x?</text>"),
          "SVG heatmap: UTF-8 labels kept, invalid bytes and control characters written as '?'");
    free(svg);
    remove(path);
    // bad input: one line naming the file, status 1
    char printed[512], start[300];
    snprintf(start, sizeof start, "error: %s: ", path);
    capture_begin();
    status = svg_write_heatmap(path, values, 0, 3, NULL, NULL, "x", 0, 1);
    capture_end(printed, sizeof printed);
    check(status == 1 && one_error_line(printed, start),
          "SVG heatmap: a 0 x 3 matrix is refused: %.*s", (int)strcspn(printed, "\n"), printed);
    capture_begin();
    status = svg_write_heatmap(path, values, 2, 3, NULL, NULL, "x", 1, 1);
    capture_end(printed, sizeof printed);
    check(status == 1 && one_error_line(printed, start),
          "SVG heatmap: an empty scale 1..1 is refused: %.*s",
          (int)strcspn(printed, "\n"), printed);
    capture_begin();
    status = svg_write_heatmap("/nonexistent-directory/x.svg", values, 2, 3, NULL, NULL, "x", 0, 1);
    capture_end(printed, sizeof printed);
    check(status == 1 &&
          one_error_line(printed, "error: cannot write /nonexistent-directory/x.svg: "),
          "SVG heatmap: an unwritable path is reported: %.*s",
          (int)strcspn(printed, "\n"), printed);
}

static void test_svg_positional_encoding(void) {
    char path[256];
    svg_test_path(path, sizeof path, "pe.svg");
    int status = svg_write_positional_encoding(path, 20, 16);
    char *svg = read_text_file(path);
    check(status == 0 && svg != NULL, "SVG positional encoding: written");
    if (svg) {
        check(count_occurrences(svg, "<rect") == 20 * 16 + 3,
              "SVG positional encoding: %d <rect> (20 x 16 cells + 3)",
              count_occurrences(svg, "<rect"));
        // PE(0, 0) = sin 0 = 0: the white middle of the scale; PE(0, 1) = cos 0 = 1: darkest red
        check(strstr(svg, "fill=\"#f7f7f7\"><title>0 | 0: 0</title>") &&
              strstr(svg, "fill=\"#67001f\"><title>0 | 1: 1</title>"),
              "SVG positional encoding: PE(0,0) = 0 white, PE(0,1) = 1 darkest red");
        check(strstr(svg, ">-1</text>") && strstr(svg, ">1</text>") && strstr(svg, "PE(pos, i)"),
              "SVG positional encoding: colour scale -1..1 shown");
    }
    free(svg);
    remove(path);
    char printed[512], start[300];
    snprintf(start, sizeof start, "error: %s: ", path);
    capture_begin();
    status = svg_write_positional_encoding(path, 0, 16);
    capture_end(printed, sizeof printed);
    check(status == 1 && one_error_line(printed, start),
          "SVG positional encoding: max_len 0 is refused: %.*s",
          (int)strcspn(printed, "\n"), printed);
}

static void test_svg_attention(void) {
    TransformerConfig config = small_config(); // 2 layers, 2 heads
    Transformer m;
    transformer_build(&m, &config, 4);
    int src_len[2] = { 5, 4 }, tgt_len[2] = { 4, 6 };
    Rng rng;
    rng_seed(&rng, 8);
    static TestBatch tb;
    make_test_batch(&tb, 2, 5, 6, src_len, tgt_len, config.vocab_size, &rng);
    m.training = 0;
    transformer_forward(&m, &tb.batch);
    // sentence 1: 4 source tokens, target y1..y5 (the decoder read <s> y1..y5: 6 positions)
    const char *source[4] = { "three", "<unk>", "forty", "two" };
    const char *target[5] = { "drei", "hundert", "zwei", "und", "vierzig" };
    const char *kinds[3] = { "encoder", "decoder", "cross" };
    int cells[3] = { 4 * 4, 6 * 6, 6 * 4 }, L = config.n_layers, NH = config.n_heads;
    for (int kind = 0; kind < 3; kind++) {
        char path[256], name[32];
        snprintf(name, sizeof name, "attention_%s.svg", kinds[kind]);
        svg_test_path(path, sizeof path, name);
        int status = svg_write_attention(path, &m, (AttentionKind)kind, 1, source, 4, target, 5);
        char *svg = read_text_file(path);
        check(status == 0 && svg &&
              count_occurrences(svg, "<rect") == L * NH * (cells[kind] + 1) + 2,
              "SVG attention %s: %d heads x %d cells", kinds[kind], L * NH, cells[kind]);
        if (svg && kind == ATTENTION_CROSS) {
            // layer 2, head 2 of sentence 1, query 2 (it predicts "zwei"), key 3 ("two"):
            // dec[l].cross_attn.att is (B, NH, T, S)
            int S = 5, T = 6;
            double p = m.acts.dec[1].cross_attn.att[((((size_t)1) * NH + 1) * T + 2) * S + 3];
            char expected[96];
            snprintf(expected, sizeof expected, "<title>zwei | two: %.4g</title>", p);
            check(strstr(svg, expected) != NULL && strstr(svg, "layer 2, head 2") &&
                  strstr(svg, "&lt;unk&gt;"),
                  "SVG attention cross: cell (layer 2, head 2, 'zwei', 'two') shows its "
                  "probability %.4g", p);
        }
        if (svg && kind == ATTENTION_DECODER) {
            check(strstr(svg, ">&lt;s&gt;</text>") && strstr(svg, ">&lt;/s&gt;</text>") &&
                  strstr(svg, "<title>drei | &lt;s&gt;: 1</title>"),
                  "SVG attention decoder: rows predict y1..</s>, columns read <s>..y5; 'drei' sees "
                  "only <s>");
        }
        free(svg);
        remove(path);
    }
    char path[256];
    svg_test_path(path, sizeof path, "attention_bad.svg");
    char printed[1024], start[300];
    snprintf(start, sizeof start, "error: %s: ", path);
    capture_begin();
    int status = svg_write_attention(path, &m, ATTENTION_CROSS, 2, source, 4, target, 5);
    capture_end(printed, sizeof printed);
    check(status == 1 && one_error_line(printed, start),
          "SVG attention: sentence 2 of a batch of 2 is refused");
    capture_begin();
    status = svg_write_attention(path, &m, ATTENTION_CROSS, 1, source, 4, target, 6);
    capture_end(printed, sizeof printed);
    check(status == 1 && one_error_line(printed, start),
          "SVG attention: 6+1 target positions of 6 are refused");
    transformer_free(&m);
}

static void write_text_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

// Are all numbers in the SVG's attributes (coordinates, sizes, points) finite
// and inside the picture, give or take? A NaN or infinite axis once gave
// "nan" coordinates.
static int svg_numbers_in_picture(const char *svg) {
    for (const char *p = svg; (p = strstr(p, "=\"")) != NULL; ) {
        p += 2;
        while (*p && *p != '"') {
            char *end;
            double v = strtod(p, &end);
            if (end == p)
                break;   // not a number: a colour, an anchor
            if (!isfinite(v) || fabs(v) > 1e5)
                return 0;
            p = end;
            while (*p == ',' || *p == ' ')
                p++;
        }
    }
    return 1;
}

// Logs with extreme values: each axis spans a finite, representable range
// (tick steps and counts stay in range: a NaN or infinite tick reached a
// conversion to long, undefined behaviour, and the SVG held "nan"), and a
// value beyond what a chart draws is refused with its line.
static void test_svg_loss_curve_extremes(const char *csv, const char *svg_path) {
    static const char *drawn[] = {
        "1,5,0,1,0x1p-1070\n",   // a subnormal held-out score (make fuzz)
        "1,1e299,0.1,1,\n2,1.0000000000000002e299,0.1,1,\n",   // a span of one rounding step
        "1,1e-300,0.1,1,\n2,1e300,0.1,1,\n",   // 600 decades on the log scale
        "1,4.9e-324,0.1,1,\n2,-1e-310,0.1,1,5e-324\n",   // values below a double's normal range
        "0,-1e300,-1e300,-1e300,-1e300\n1e300,1e300,1e300,1e300,1e300\n",   // the widest
                                                                            // drawable span
        "1,inf,0.1,1,\n2,3,nan,1,\n3,2,0.1,1,\n",   // gaps
    };
    char printed[512];
    int good = 0, n = (int)(sizeof drawn / sizeof *drawn);
    for (int k = 0; k < n; k++) {
        write_text_file(csv, drawn[k]);
        int status = loss_curve_capturing_stderr(svg_path, csv, printed, sizeof printed);
        char *svg = read_text_file(svg_path);
        int ok = status == 0 && svg && printed[0] == '\0' && svg_numbers_in_picture(svg) &&
                 count_occurrences(svg, "<polyline") >= 2;
        if (!ok)
            printf("     log %d: exit %d, %s\n", k + 1, status,
                   printed[0] ? printed : "a picture with numbers outside it");
        good += ok;
        free(svg);
        remove(svg_path);
    }
    check(good == n,
          "SVG loss curve: %d of %d logs with extreme values (a subnormal, a one-ulp span, 600 "
          "decades, +-1e300, gaps) drawn with finite coordinates inside the picture", good, n);
    struct { const char *text, *message; } refused[] = {
        { "1,-1e308,0.1,1,\n2,1e308,0.1,1,\n",
          ":1: loss '-1e308' is beyond what a chart draws; expected a number from -1e+300 "
          "to 1e+300" },
        { "1,2,0.1,1,\n2,2,1e999,1,\n", ":2: lr '1e999' is beyond what a chart draws" },
    };
    for (size_t k = 0; k < sizeof refused / sizeof *refused; k++) {
        write_text_file(csv, refused[k].text);
        int status = loss_curve_capturing_stderr(svg_path, csv, printed, sizeof printed);
        char expected[512];
        snprintf(expected, sizeof expected, "error: %s%s", csv, refused[k].message);
        check(status == 1 && one_error_line(printed, expected) && access(svg_path, F_OK) != 0,
              "SVG loss curve: a value beyond +-1e300 is refused with its line: %.*s",
              (int)strcspn(printed, "\n"), printed);
        remove(svg_path);
    }
}

static void test_svg_loss_curve(void) {
    char csv[256], svg_path[256], printed[512], expected[512];
    svg_test_path(csv, sizeof csv, "log.csv");
    svg_test_path(svg_path, sizeof svg_path, "loss.svg");
    // a header, a comment, held-out scores on some lines only
    write_text_file(csv, "step,loss,lr,tokens_per_s,dev_exact\n# a comment\n"
                         "1,3.5,0.0001,1000,\n10,2.0,0.001,1100,0.1\n"
                         "20,0.5,0.002,1050,\n30,0.05,0.0015,1000,0.9\n");
    int status = loss_curve_capturing_stderr(svg_path, csv, printed, sizeof printed);
    char *svg = read_text_file(svg_path);
    check(status == 0 && svg && printed[0] == '\0', "SVG loss curve: written, nothing printed");
    if (svg) {
        check(count_occurrences(svg, "<polyline") == 3 &&
              strstr(svg, "training loss (log scale)") && strstr(svg, "held-out score") &&
              strstr(svg, ">dev exact</text>") && count_occurrences(svg, "<circle") == 2,
              "SVG loss curve: loss (log scale: it falls 70x), 2 held-out points joined, learning "
              "rate");
    }
    free(svg);
    remove(svg_path);
    // without held-out scores: two panels
    write_text_file(csv, "1,3.5,0.0001,1000,\n2,3.4,0.0002,1000,\n");
    status = loss_curve_capturing_stderr(svg_path, csv, printed, sizeof printed);
    svg = read_text_file(svg_path);
    check(status == 0 && svg && count_occurrences(svg, "<polyline") == 2 &&
          !strstr(svg, "held-out") && !strstr(svg, "log scale"),
          "SVG loss curve: no held-out scores, two panels, linear loss axis");
    free(svg);
    remove(svg_path);
    // malformed logs: one line naming file and line, status 1, no picture
    struct { const char *text, *message; } bad[] = {
        { "step,loss,lr,tokens_per_s,heldout\n1,2.5,0.001,1000\n",
          ":2: 4 comma-separated fields, expected 5 (step,loss,lr,tokens_per_s,heldout)" },
        { "1,2.5,0.001,1000,\n\n2,abc,0.001,1000,\n", ":3: loss 'abc' is not a number" },
        { "1,2.5,0.001,1000,\n-5,2.5,0.001,1000,\n", ":2: step '-5' is not a step number (>= 0)" },
        { "1,2.5,0.001,1000,0.5x\n", ":1: held-out score '0.5x' is not a number" },
        { "1,2.5,0.001,1000,,\n", ":1: 6 comma-separated fields, expected 5" },
        { "# only a comment\n",
          ": no data lines, expected lines of step,loss,lr,tokens_per_s,heldout" },
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        write_text_file(csv, bad[k].text);
        status = loss_curve_capturing_stderr(svg_path, csv, printed, sizeof printed);
        snprintf(expected, sizeof expected, "error: %s%s", csv, bad[k].message);
        FILE *f = fopen(svg_path, "r");
        check(status == 1 && one_error_line(printed, expected) && !f,
              "SVG loss curve: malformed log %zu gives one line: %.*s", k + 1,
              (int)strcspn(printed, "\n"), printed);
        if (f)
            fclose(f);
        remove(svg_path);
    }
    test_svg_loss_curve_extremes(csv, svg_path);
    remove(csv);
    status = loss_curve_capturing_stderr(svg_path, csv, printed, sizeof printed);
    snprintf(expected, sizeof expected, "error: %s: cannot open: ", csv);
    check(status == 1 && one_error_line(printed, expected),
          "SVG loss curve: a missing log is reported: %.*s", (int)strcspn(printed, "\n"), printed);
}

// ============================================================================
// The lab's command line, run as a user runs ./transformer (cli_binary):
// train's further flags, the lab's commands. Files in test_dir; the tests of
// transformer.c's commands (run_command_line_tests) run first and leave theirs
// there (cli.tsv, tsv.ckpt: a TSV file and a word-level checkpoint).
// ============================================================================

// A tiny model on a copy task made small with the lab's flags
#define TINY_RUN "--layers 1 --d-model 16 --d-ff 32 --heads 2 --train-size 40 --valid-size 8 " \
                 "--max-length 6 --batch-tokens 80 --warmup 5 --log-every 0 --eval-every 0 " \
                 "--show 0"

// A checkpoint as ./transformer train writes one: the model, its vocabulary and §5.1 merges (or
// NULL), and a run (its first epoch begun unless no step was trained) with these options.
static const char *save_lab_checkpoint(const char *path, const Transformer *m,
                                       const Vocabulary *v, const Bpe *merges,
                                       const char *options) {
    RunState run = { 1, 1, m->adam_step > 0, 0, 0, (char *)options };
    return lab_checkpoint_save(path, m, v, merges, &run);
}

// The copy task's vocabulary for m, in a checkpoint with a run
static const char *save_lab_copy_checkpoint(const char *path, const Transformer *m) {
    Vocabulary v;
    task_vocabulary(&v, m->config.vocab_size - NUM_SPECIAL_TOKENS);
    const char *e = save_lab_checkpoint(path, m, &v, NULL, "--task\ncopy\n");
    vocab_free(&v);
    return e;
}

// The model and vocabulary of a checkpoint as the lab reads it (its merges and run let go).
static const char *load_lab_model(const char *path, Transformer *m, Vocabulary *v) {
    LabCheckpoint c;
    const char *e = lab_checkpoint_load(path, &c);
    if (e)
        return e;
    *m = c.model;
    *v = c.vocab;
    memset(&c.model, 0, sizeof c.model);
    memset(&c.vocab, 0, sizeof c.vocab);
    lab_checkpoint_free(&c);
    return NULL;
}

// Adam's step of a checkpoint the lab reads, or -1 where it does not load.
static long lab_file_step(const char *path) {
    Transformer m;
    Vocabulary v;
    if (load_lab_model(path, &m, &v))
        return -1;
    long step = m.adam_step;
    transformer_free(&m);
    vocab_free(&v);
    return step;
}

// The run's counts, out of their range, in files whose run checksum matches (RunHeader: Adam's
// step at offset 16, epoch_rng 32, epoch 40, epoch_batches 48, after the model's bytes): Adam's
// step at 2^63 (INT64_MIN as a signed number: it resumed at "step -9223372036854775806" into a NaN
// loss) and at 2^63 - 1, refused as the file loads (at_load); an epoch and a batch count beyond
// the steps trained, a data-order generator state of 0, which only --resume reads and refuses
// (training_state_error).
static const struct {
    size_t offset;
    uint64_t value;
    int at_load;
    const char *what, *expected;
} run_count_cases[] = {
    { 16, 0x8000000000000000ULL, 1, "Adam step INT64_MIN",
      "header: Adam step 9223372036854775808; expected 0 to 1000000000" },
    { 16, 0x7FFFFFFFFFFFFFFFULL, 1, "Adam step INT64_MAX",
      "header: Adam step 9223372036854775807; expected 0 to 1000000000" },
    { 16, 1000000001, 1, "Adam step 10^9 + 1",
      "header: Adam step 1000000001; expected 0 to 1000000000" },
    // (make fuzz, before the fix, found a file with epoch 9 after 1 step:
    // dev/fuzz/fuzz_checkpoint.c)
    { 40, 4, 0, "epoch 4 after 3 steps",
      "header: epoch 4 after 3 steps; expected at most one epoch begun per step" },
    { 48, UINT64_MAX, 0, "2^64 - 1 batches done",
      "header: 18446744073709551615 batches of the current epoch done after 3 steps" },
    { 32, 0, 0, "data-order generator state 0",
      "header: data-order generator state 0; expected non-zero" },
    { 40, 0, 0, "epoch 0 with a batch of it done",
      "header: epoch 0 with batches of it done (1); expected none before "
      "the first epoch" },
};

// The checkpoint good (size bytes, a model and its run) to path, the run's 8 bytes at offset set
// to value and the run's checksum made to match.
static void write_run_with_field(const char *path, const unsigned char *good, size_t size,
                                 size_t offset, uint64_t value) {
    uint64_t run_start;
    memcpy(&run_start, good + 64, 8);   // the model's bytes (CheckpointHeader)
    unsigned char *copy = checked_calloc(size, 1, "test");
    memcpy(copy, good, size);
    memcpy(copy + run_start + offset, &value, 8);
    uint64_t hash = fnv1a(FNV_OFFSET, copy + run_start, size - 8 - run_start);
    memcpy(copy + size - 8, &hash, 8);
    write_file(path, copy, size);
    free(copy);
}

// A checkpoint after 3 steps in epoch 2, its first batch done, with each of the counts above:
// each refused with its file and what was expected; Adam's step as the file loads, the rest as
// --resume reads them.
static void test_resume_counts(void) {
    TransformerConfig config = decode_config();
    Transformer model;
    transformer_build(&model, &config, 3);
    static TestBatch tb;
    three_adam_steps(&model, &tb);
    Vocabulary vocab;
    task_vocabulary(&vocab, config.vocab_size - NUM_SPECIAL_TOKENS);
    RunState state = { 1, 123, 2, 1, 678, "" };
    const char *good_path = test_path("counts.ckpt"), *bad = test_path("bad_counts.ckpt");
    const char *saved = lab_checkpoint_save(good_path, &model, &vocab, NULL, &state), *e;
    size_t size;
    unsigned char *good = saved ? NULL : read_file(good_path, &size);
    int n = (int)(sizeof run_count_cases / sizeof *run_count_cases);
    for (int i = 0; good && i < n; i++) {
        write_run_with_field(bad, good, size, run_count_cases[i].offset, run_count_cases[i].value);
        LabCheckpoint c;
        e = lab_checkpoint_load(bad, &c);
        int loaded = e == NULL;
        if (loaded) {
            e = training_state_error(bad, &c.model, &c.run);
            lab_checkpoint_free(&c);
        }
        check(e && strstr(e, "bad_counts.ckpt: ") && strstr(e, run_count_cases[i].expected) &&
              loaded != run_count_cases[i].at_load,
              "--resume: %s is refused, %s (%s)", run_count_cases[i].what,
              run_count_cases[i].at_load ? "as the file loads" : "as --resume reads it",
              e ? e : "accepted");
    }
    check(good != NULL, "--resume: a checkpoint to forge the counts of was written (%s)",
          saved ? saved : "yes");
    free(good);
    transformer_free(&model);
    vocab_free(&vocab);
}

// train's flags that the lab adds: --positions, --resume and its checks,
// --loss-log (the same seed's losses with any thread count), --save-every; params.
static void test_lab_command_line(void) {
    const char *tsv = test_path("cli.tsv");
    check_cli_error("a training line longer than --positions allows",
                    "cli.tsv:2: the source has 3 tokens; the model's maximum length 3 allows 2",
                    "train --train %s --positions 3 --steps 1 --checkpoint %s", tsv,
                    test_path("positions.ckpt"));
    size_t size;
    unsigned char *good = read_file(test_path("tsv.ckpt"), &size);
    if (!good) {
        check(0, "cli: no checkpoint tsv.ckpt from transformer.c's tests; the --resume tests need "
                 "one");
        return;
    }
    const char *bad = test_path("cli_bad.ckpt");
    good[16] = 2;   // N: a header whose sizes disagree with the parameters
    write_file(bad, good, size);
    check_cli_error("--resume from a damaged checkpoint", "cli_bad.ckpt: header",
                    "train --resume %s", bad);
    free(good);

    // resume: 3 steps, stop, 3 more == 6 unbroken steps (losses and final weights)
    const char *a_ckpt = test_path("a.ckpt"), *b_ckpt = test_path("b.ckpt");
    const char *a_log = test_path("a.log"), *b_log = test_path("b.log");
    remove(a_log);
    remove(b_log);
    int s1 = run_cli("train --task copy --steps 6 --checkpoint %s --loss-log %s " TINY_RUN,
                     a_ckpt, a_log);
    int s2 = run_cli("train --task copy --steps 3 --checkpoint %s --loss-log %s " TINY_RUN,
                     b_ckpt, b_log);
    int s3 = run_cli("train --resume %s --steps 6 --loss-log %s", b_ckpt, b_log);
    size_t log_size;
    unsigned char *log = read_file(a_log, &log_size);
    int lines = count_lines_starting((char *)log, "");
    free(log);
    Transformer ma, mb;
    Vocabulary va, vb;
    const char *ea = load_lab_model(a_ckpt, &ma, &va),
               *eb = ea ? ea : load_lab_model(b_ckpt, &mb, &vb);
    int same_weights = !ea && !eb && ma.adam_step == 6 && mb.adam_step == 6 &&
                       memcmp(ma.params_memory, mb.params_memory,
                              ma.num_parameters * sizeof(real)) == 0 &&
                       memcmp(ma.adam_v, mb.adam_v, ma.num_parameters * sizeof(real)) == 0;
    check(s1 == 0 && s2 == 0 && s3 == 0 && lines == 6 && files_equal(a_log, b_log),
          "cli: 3 steps + --resume 3 steps give the losses of 6 unbroken steps, to the last digit");
    check(same_weights, "cli: ... and bit-identical weights and Adam state at step 6 (%s)",
          ea ? ea : eb ? eb : "both loaded");
    if (!ea) {
        transformer_free(&ma);
        vocab_free(&va);
    }
    if (!ea && !eb) {
        transformer_free(&mb);
        vocab_free(&vb);
    }
    check_cli_error("a task's --min-length above its --max-length",
                    "--min-length 5 is above --max-length 3; expected min <= max",
                    "train --task copy --min-length 5 --max-length 3 --steps 1");
    check_cli_error("--resume with a changed run option", "--lr cannot change on --resume",
                    "train --resume %s --lr 0.1", b_ckpt);
    // the header's step count against its range (it resumed at step -9223372036854775806 into a
    // NaN loss)
    good = read_file(b_ckpt, &size);
    if (good) {
        const char *far = test_path("far.ckpt");
        write_run_with_field(far, good, size, 16, 0x8000000000000000ULL);
        check_cli_error("--resume at Adam step INT64_MIN",
                        "far.ckpt: header: Adam step 9223372036854775808; expected 0 to 1000000000",
                        "train --resume %s --steps 8", far);
        write_run_with_field(far, good, size, 16, 0x7FFFFFFFFFFFFFFFULL);
        check_cli_error("--resume at Adam step INT64_MAX",
                        "far.ckpt: header: Adam step 9223372036854775807",
                        "train --resume %s --steps 8", far);
        free(good);
    }
    // the same seed repeats the run, with one thread or two
    const char *c_log = test_path("c.log");
    remove(c_log);
    int status = run_cli("train --task copy --steps 6 --threads 1 --checkpoint %s "
                         "--loss-log %s " TINY_RUN,
                         test_path("c.ckpt"), c_log);
    check(status == 0 && files_equal(a_log, c_log),
          "cli: --seed repeats a run exactly (losses with 1 thread and with all)");
    // a NaN loss stops training and leaves the last good checkpoint, written by --save-every
    const char *nan_ckpt = test_path("nan_save_every.ckpt");
    check_cli_error("a loss that becomes NaN or infinite, with --save-every 1",
                    "(step 1), is left as it was",
                    "train --task copy --steps 50 --lr 1e30 --save-every 1 "
                    "--checkpoint %s " TINY_RUN, nan_ckpt);
    status = run_cli("decode --checkpoint %s '1 2'", nan_ckpt);
    check(status == 0, "cli: ... and that checkpoint still loads (exit %d)", status);
    status = run_cli("params --preset big");
    check(status == 0 && strstr(cli_output, "214,245,376") &&
          strstr(cli_output, "paper, Table 3: 213M"),
          "cli: params --preset big prints 214,245,376 next to the paper's 213M");
}

// ---- what a new user meets: runs kept and resumed, moved data --------------------

static void kept_step_path(char *out, size_t n, const char *ckpt, int step, const char *suffix) {
    snprintf(out, n, "%s.step%07d%s", ckpt, step, suffix);
}

// A step file left where a new run would keep its own (its checkpoint deleted, say) is not
// replaced without --force; a log that cannot be written (a full disk) is an error, not exit 0.
static void test_stale_step_file_and_lost_logs(void) {
    const char *ckpt = test_path("stale.ckpt");
    char path[600];
    kept_step_path(path, sizeof path, ckpt, 2, "");
    write_text(path, "another run's step file");
    check_cli_error("a step file already where --keep-last would write",
                    "stale.ckpt.step0000002 is already there (another run's?); expected --force",
                    "train --task copy --steps 2 --save-every 1 --keep-last 2 "
                    "--checkpoint %s " TINY_RUN, ckpt);
    char *text = read_text_file(path);
    check(text && strcmp(text, "another run's step file") == 0 && !file_exists(ckpt),
          "cli: ... and the step file is untouched, no checkpoint written");
    free(text);
    int status = run_cli("train --task copy --steps 2 --save-every 1 --keep-last 2 --force "
                         "--checkpoint %s " TINY_RUN, ckpt);
    check(status == 0 && lab_file_step(path) == 2,
          "cli: --force replaces it (its step %ld; exit %d)", lab_file_step(path), status);
    if (access("/dev/full", W_OK) != 0) {
        printf("(no /dev/full here: the lost-log checks are skipped)\n");
        return;
    }
    check_cli_error("--loss-log on a full disk", "/dev/full: writing the log failed",
                    "train --task copy --steps 2 "
                    "--loss-log /dev/full --force --checkpoint %s " TINY_RUN, ckpt);
    check_cli_error("--log on a full disk", "/dev/full: writing the log failed",
                    "train --task copy --steps 2 "
                    "--log /dev/full --log-every 1 --force --checkpoint %s " TINY_RUN, ckpt);
    // a run that failed first says why: the lost log does not take the place of its error
    check_cli_error("a diverging run with its log on a full disk", "the loss is NaN",
                    "train --task copy --steps 3 --lr 1e9 --warmup 1 --loss-log /dev/full --force "
                    "--checkpoint %s " TINY_RUN, ckpt);
}

static void test_existing_checkpoints_and_keep_last(void) {
    const char *ckpt = test_path("mine.ckpt"), *other = test_path("other.ckpt");
    char path[600];
    // a run with --keep-last 2 ...
    int status = run_cli("train --task copy --steps 4 --save-every 1 --keep-last 2 "
                         "--checkpoint %s " TINY_RUN, ckpt);
    size_t size;
    unsigned char *before = read_file(ckpt, &size);
    check(status == 0 && before, "cli: a 4-step run with --keep-last 2 (exit %d)", status);
    if (!before)
        return;
    // (that a new run does not replace it: test_existing_checkpoint)
    run_cli("train --task copy --steps 2 --checkpoint %s " TINY_RUN, other);
    check_cli_error("a resumed run onto another run's checkpoint", "other.ckpt is already there",
                    "train --resume %s --steps 6 --checkpoint %s", ckpt, other);
    // --keep-last across a resume: the earlier session's files count, a killed save's .tmp goes
    kept_step_path(path, sizeof path, ckpt, 4, ".tmp");
    write_text(path, "half a checkpoint");
    status = run_cli("train --resume %s --steps 7 --save-every 1 --keep-last 2", ckpt);
    int there[8], tmp_left;
    for (int step = 1; step <= 7; step++) {
        kept_step_path(path, sizeof path, ckpt, step, "");
        there[step] = file_exists(path);
    }
    kept_step_path(path, sizeof path, ckpt, 4, ".tmp");
    tmp_left = file_exists(path);
    check(status == 0 && !there[3] && !there[4] && !there[5] && there[6] && there[7] && !tmp_left,
          "cli: --keep-last 2 on --resume leaves steps 6 and 7, not the earlier session's 3 and 4, "
          "nor a killed save's .tmp (exit %d)", status);
    // --force replaces the checkpoint and its step files, once the new run has saved: a run
    // that fails before its first save leaves them all (they went at its start, before)
    status = run_cli("train --task copy --steps 20 --lr 1e300 --force --checkpoint %s " TINY_RUN,
                     ckpt);
    kept_step_path(path, sizeof path, ckpt, 6, "");
    int sixth = file_exists(path);
    kept_step_path(path, sizeof path, ckpt, 7, "");
    check(status == 1 && strstr(cli_output, "no checkpoint was written") &&
          lab_file_step(ckpt) == 7 && sixth && file_exists(path),
          "cli: a --force run that diverges before its first save leaves the checkpoint (step %ld) "
          "and its step files 6 and 7 (exit %d)", lab_file_step(ckpt), status);
    // a rollback: --resume one of its step files with --force keeps that file, the others go
    char sixth_path[600];
    kept_step_path(sixth_path, sizeof sixth_path, ckpt, 6, "");
    status = run_cli("train --resume %s --checkpoint %s --force --steps 8", sixth_path, ckpt);
    check(status == 0 && lab_file_step(ckpt) == 8 && file_exists(sixth_path) &&
          !file_exists(path),
          "cli: --resume CHECKPOINT.step0000006 --force onto CHECKPOINT keeps step 6's file, not "
          "step 7's (exit %d)", status);
    status = run_cli("train --task copy --steps 2 --force --checkpoint %s " TINY_RUN, ckpt);
    kept_step_path(path, sizeof path, ckpt, 6, "");
    sixth = file_exists(path);
    kept_step_path(path, sizeof path, ckpt, 7, "");
    check(status == 0 && lab_file_step(ckpt) == 2 && !sixth && !file_exists(path),
          "cli: --force replaces the checkpoint (now at step %ld) and its step files (exit %d)",
          lab_file_step(ckpt), status);
    // and again, now that it has no step files (nothing to remove: under the
    // sanitizers this once stopped on a memmove from a NULL list)
    status = run_cli("train --task copy --steps 2 --force --checkpoint %s " TINY_RUN, ckpt);
    check(status == 0 && lab_file_step(ckpt) == 2,
          "cli: --force over a checkpoint without step files (exit %d)", status);
    kept_step_path(path, sizeof path, ckpt, 2, ".tmp"); // killed while writing step 2's file
    write_text(path, "half a checkpoint");
    status = run_cli("train --resume %s --steps 3", ckpt);
    check(status == 0 && !file_exists(path),
          "cli: --resume without --keep-last also removes a killed save's "
          "CHECKPOINT.step0000002.tmp (exit %d)", status);
    status = run_cli("bleu --help");
    check(status == 0 && strstr(cli_output, "usage: ./transformer bleu") &&
          strstr(cli_output, "(default 13a)") && strstr(cli_output, "(default exp)") &&
          !strstr(cli_output, "(default -"),
          "cli: bleu --help names sacreBLEU's defaults, --tokenize 13a and --smooth exp");
    free(before);
}

static void test_moved_data(void) {
    char from[600], to[600], command[1400];
    snprintf(from, sizeof from, "%s/moved_data.tsv", test_dir);
    snprintf(to, sizeof to, "%s/elsewhere.tsv", test_dir);
    write_text(from, "a b\tb a\nc d e\te d c\na a\ta a\nb c\tc b\n");
    const char *ckpt = test_path("moved.ckpt");
    int status = run_cli("train --train %s --steps 2 --checkpoint %s " TINY_RUN, from, ckpt);
    snprintf(command, sizeof command, "mv %s %s", from, to);
    check(status == 0 && system(command) == 0,
          "cli: a run on a TSV file, whose file then moves (exit %d)", status);
    check_cli_error("--resume when the data moved",
                    "moved_data.tsv: cannot open: No such file or directory; it is "
                    "the run's --train",
                    "train --resume %s --steps 4", ckpt);
    status = run_cli("train --resume %s --steps 4 --train %s", ckpt, to);
    check(status == 0 && lab_file_step(ckpt) == 4,
          "cli: --resume --train NEW_PATH takes the same data at its new path (exit %d)", status);
    status = run_cli("train --resume %s --steps 5", ckpt);
    check(status == 0 && lab_file_step(ckpt) == 5,
          "cli: ... and the next --resume finds it there (exit %d)", status);
    write_text(test_path("other_data.tsv"), "a b\tb a\nc d e\te d c\na a\ta a\nb c\tb c\n");
    check_cli_error("--resume --train with other data",
                    "other_data.tsv: not the training data of the checkpoint",
                    "train --resume %s --steps 6 --train %s", ckpt, test_path("other_data.tsv"));
}

static void test_average(const Transformer *trained) {
    TransformerConfig config = trained->config;
    Transformer other;
    transformer_build(&other, &config, 12);
    other.adam_step = 7;
    for (size_t k = 0; k < other.num_parameters; k++)
        other.adam_m[k] = (real)(0.001 * (double)(k % 13));
    const char *a = test_path("avg_a.ckpt"), *b = test_path("avg_b.ckpt"),
               *out = test_path("avg_out.ckpt");
    const char *e = save_lab_copy_checkpoint(a, trained);
    if (!e)
        e = save_lab_copy_checkpoint(b, &other);
    const char *paths[2] = { a, b };
    if (!e)
        e = checkpoint_average(out, paths, 2);
    Transformer avg;
    Vocabulary v;
    if (!e)
        e = load_lab_model(out, &avg, &v);
    if (e) {
        check(0, "average: %s", e);
        transformer_free(&other);
        return;
    }
    size_t wrong = 0, P = avg.num_parameters;
    for (size_t k = 0; k < P; k++) {
        real mean = (real)(((double)trained->params_memory[k] +
                            (double)other.params_memory[k]) / 2);
        wrong += avg.params_memory[k] != mean;
    }
    int moved = 0; // the test can fail: the mean differs from both inputs almost everywhere
    for (size_t k = 0; k < P; k++) moved += avg.params_memory[k] != trained->params_memory[k];
    check(wrong == 0 && moved > (int)(P / 2),
          "average: every parameter of 2 checkpoints is their mean (%zu of %zu "
          "differ; %d differ from the first input)", wrong, P, moved);
    check(avg.adam_step == 7 && memcmp(avg.adam_m, other.adam_m, P * sizeof(real)) == 0,
          "average: Adam's step and moments are the last checkpoint's");
    transformer_free(&avg);
    vocab_free(&v);
    const char *cli_out = test_path("avg_cli.ckpt");
    int status = run_cli("average --out %s %s %s", cli_out, a, b);
    // the binary is a float build: in the double test build its file holds floats, so compare
    // loosely there
    Transformer m1, m2;
    Vocabulary v1, v2;
    double largest = INFINITY;
    if (status == 0 && !load_lab_model(out, &m1, &v1)) {
        if (!load_lab_model(cli_out, &m2, &v2)) {
            largest = 0;
            for (size_t k = 0; k < P; k++)
                largest = fmax(largest,
                               fabs((double)m1.params_memory[k] - (double)m2.params_memory[k]));
            transformer_free(&m2);
            vocab_free(&v2);
        }
        transformer_free(&m1);
        vocab_free(&v1);
    }
    check(largest <= (sizeof(real) == 4 ? 0 : 1e-6),
          "cli: average --out writes the same average (largest difference %g, exit %d)",
          largest, status);
    // mismatched config and vocabulary
    TransformerConfig wide = config;
    wide.d_ff = 48;
    Transformer w;
    transformer_build(&w, &wide, 13);
    const char *c = test_path("avg_wide.ckpt"), *d = test_path("avg_vocab.ckpt"),
               *none = test_path("avg_none.ckpt");
    save_lab_copy_checkpoint(c, &w);
    transformer_free(&w);
    Vocabulary letters;
    vocab_init(&letters);
    for (int i = 0; i < config.vocab_size - NUM_SPECIAL_TOKENS; i++) {
        char t[2] = { (char)('a' + i), 0 };
        vocab_add(&letters, t, 1);
    }
    save_lab_checkpoint(d, &other, &letters, NULL, "--task\ncopy\n");
    vocab_free(&letters);
    check_cli_error("average of different configs", "expected the same config",
                    "average --out %s %s %s", none, a, c);
    check(!file_exists(none), "cli: ... and writes no file");
    check_cli_error("average of different vocabularies", "vocabulary token 4 is 'a' but '0'",
                    "average --out %s %s %s", none, a, d);
    check_cli_error("average without --out", "average: --out FILE is required",
                    "average %s %s", a, b);
    check_cli_error("average without files", "average: no checkpoints given",
                    "average --out %s", none);
    check_cli_error("average of a missing file", "avg_missing.ckpt: cannot open",
                    "average --out %s %s %s", none, a, test_path("avg_missing.ckpt"));
    check(!file_exists(none), "cli: no file from a failed average");
    // a file at --out: replaced only with --force; a directory never
    check_cli_error("average onto an existing checkpoint",
                    "avg_cli.ckpt is already there; expected --force",
                    "average --out %s %s %s", cli_out, a, b);
    status = run_cli("average --out %s --force %s %s", cli_out, a, b);
    check(status == 0, "cli: average --force replaces it (exit %d)", status);
    check_cli_error("average onto a directory", "not a regular file; expected a checkpoint's path",
                    "average --out %s --force %s %s", test_dir, a, b);
    transformer_free(&other);
}

static void test_log_keep_last_and_pictures(const char *ckpt) {
    // train --log and --keep-last
    const char *run = test_path("log.ckpt"), *log = test_path("log.csv");
    remove(log);
    int status = run_cli("train --task copy --steps 6 --save-every 2 --keep-last 2 --checkpoint %s "
                         "--log %s --layers 1 --d-model 16 --d-ff 32 --heads 2 --train-size 40 "
                         "--valid-size 8 --max-length 6 --batch-tokens 80 --warmup 5 --log-every 2 "
                         "--eval-every 3 --show 0", run, log);
    char kept[3][400];
    for (int i = 0; i < 3; i++) snprintf(kept[i], sizeof kept[i], "%s.step%07d", run, 2 * (i + 1));
    check(status == 0 && !file_exists(kept[0]) && file_exists(kept[1]) && file_exists(kept[2]),
          "cli: train --keep-last 2 leaves the checkpoints of steps 4 and 6, not 2 (exit %d)",
          status);
    char *csv = read_text_file(log);
    // lines at steps 2, 3 (evaluation), 4, 6 (both)
    int lines = count_lines_starting(csv, ""),
        header = csv && strncmp(csv, "step,loss,lr,tokens_per_s,heldout", 33) == 0;
    int eval_line = csv && strstr(csv, "\n3,") && strstr(strstr(csv, "\n3,"), ",0.00\n") != NULL;
    int plain_line = csv && strstr(csv, "\n2,") && strchr(strstr(csv, "\n2,") + 1, '\n')[-1] == ',';
    check(header && lines == 5 && eval_line && plain_line,
          "cli: train --log writes a header and a CSV line at each progress line and evaluation, "
          "the held-out score only where measured (%d lines)", lines);
    free(csv);
    const char *svg = test_path("curve.svg");
    status = run_cli("plot --log %s --out %s", log, svg);
    char *text = read_text_file(svg);
    check(status == 0 && text && strstr(text, "<polyline"),
          "cli: plot draws the log (exit %d)", status);
    free(text);
    write_text(test_path("bad.csv"), "step,loss,lr,tokens_per_s,heldout\n1,abc,0.1,5,\n");
    check_cli_error("plot of a malformed log", "bad.csv:2: loss 'abc' is not a number",
                    "plot --log %s --out %s", test_path("bad.csv"), svg);
    check_cli_error("plot without --log", "plot: --log FILE.csv is required", "plot --out %s", svg);
    // pe
    const char *pe = test_path("pe_cli.svg");
    status = run_cli("pe --out %s --max-len 10 --d-model 8", pe);
    text = read_text_file(pe);
    check(status == 0 && text && count_occurrences(text, "<rect") == 10 * 8 + 3,
          "cli: pe draws a 10 x 8 matrix");
    free(text);
    check_cli_error("pe without --out", "pe: --out FILE.svg is required", "pe --max-len 5");
    check_cli_error("pe --d-model 0", "pe: --d-model '0' is not valid",
                    "pe --out %s --d-model 0", pe);
    // attention
    const char *dir = test_path("att");
    status = run_cli("attention --checkpoint %s --out-dir %s '1 2 3'", ckpt, dir);
    int written = 0;
    const char *names[3] = { "encoder_self_attention.svg", "decoder_self_attention.svg",
                             "cross_attention.svg" };
    for (int i = 0; i < 3; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        text = read_text_file(path);
        written += text && strstr(text, "layer 2, head 4") && strstr(text, ">&lt;/s&gt;</text>");
        free(text);
    }
    check(status == 0 && written == 3,
          "cli: attention writes the 3 pictures, every head of every layer (%d, exit %d)",
          written, status);
    check_cli_error("attention without --out-dir", "attention: --out-dir DIR is required",
                    "attention --checkpoint %s '1 2'", ckpt);
    check_cli_error("attention with two sentences", "expected exactly one source sentence",
                    "attention --checkpoint %s --out-dir %s '1 2' '3'", ckpt, dir);
    check_cli_error("attention of an empty sentence", "the sentence is empty",
                    "attention --checkpoint %s --out-dir %s ' '", ckpt, dir);
    check_cli_error("attention of a too long sentence",
                    "the sentence has 25 tokens; the model's maximum length 20",
                    "attention --checkpoint %s --out-dir %s '1 2 3 4 5 1 2 3 4 5 1 2 3 4 5 1 2 3 4 "
                    "5 1 2 3 4 5'", ckpt, dir);
    check_cli_error("attention into a directory that cannot be made",
                    "/nonexistent/x: cannot create",
                    "attention --checkpoint %s --out-dir /nonexistent/x '1 2'", ckpt);
    check_cli_error("attention into a file", "not a directory; expected a directory's path",
                    "attention --checkpoint %s --out-dir %s '1 2'", ckpt, pe);
    check_cli_error("attention into ''", "--out-dir '': expected a directory's path",
                    "attention --checkpoint %s --out-dir '' '1 2'", ckpt);
}

static void test_command_names_and_labels(void) {
    // attention: no folder before the checkpoint has loaded
    const char *dir = test_path("att_not_made");
    check_cli_error("attention with a missing checkpoint",
                    "attention: ", "attention --checkpoint %s --out-dir %s '1 2'",
                    test_path("missing.ckpt"), dir);
    check(!file_exists(dir), "cli: ... and no output folder is made");
    // every error names its command, also those printed deep down
    check_cli_error("pe into a folder that is not there",
                    "error: pe: cannot write /nonexistent/pe.svg",
                    "pe --out /nonexistent/pe.svg --max-len 4 --d-model 4");
    char expected[700];
    snprintf(expected, sizeof expected, "error: plot: %s:2", test_path("plot_bad.csv"));
    write_text(test_path("plot_bad.csv"), "step,loss,lr,tokens_per_s,heldout\n1,2\n");
    check_cli_error("plot of a malformed log", expected, "plot --log %s --out %s",
                    test_path("plot_bad.csv"), test_path("plot_bad.svg"));
    // (out of memory names the command too: test_out_of_memory)
    // the plot's axes read as words, not as the log's column names
    const char *log = test_path("labels.csv"), *svg = test_path("labels.svg");
    write_text(log, "step,loss,lr,tokens_per_s,heldout_exact_match\n1,2.5,0.001,900,\n"
                    "2,2.0,0.002,950,12.5\n");
    int status = run_cli("plot --log %s --out %s", log, svg);
    char *text = read_text_file(svg);
    check(status == 0 && text && strstr(text, ">held-out exact match (%)</text>") &&
          strstr(text, ">learning rate</text>") && !strstr(text, ">heldout_exact_match</text>"),
          "cli: plot labels the held-out axis 'held-out exact match (%%)', not heldout_exact_match "
          "(exit %d)", status);
    free(text);
    // the fuzzing finds: a subnormal held-out score is drawn; losses of -1e308 and 1e308 are
    // refused
    write_text(log, "1,5,0,1,0x1p-1070\n");
    status = run_cli("plot --log %s --out %s", log, svg);
    text = read_text_file(svg);
    check(status == 0 && text && svg_numbers_in_picture(text) &&
          !strstr(cli_output, "runtime error"),
          "cli: plot of a log holding 0x1p-1070 draws finite axes (exit %d) %s",
          status, cli_output);
    free(text);
    write_text(log, "1,-1e308,0.1,1,\n2,1e308,0.1,1,\n");
    snprintf(expected, sizeof expected,
             "error: plot: %s:1: loss '-1e308' is beyond what a chart draws", log);
    check_cli_error("plot of a log holding -1e308", expected, "plot --log %s --out %s", log, svg);
}

static void test_bleu_command(void) {
    const char *hyp = test_path("hyp.txt"), *ref = test_path("ref.txt");
    // a byte-order mark, \r\n, runs of spaces and tabs, an empty line, sentences shorter than 4
    write_text(hyp,
               "\xEF\xBB\xBFthe cat sat on the mat\r\na b  c d e\n\nx y\nthe the the the\tthe\n");
    write_text(ref, "the cat sat on the mat\r\na b c d f\nempty\nx y z\nthe cat is on the mat\n");
    const char *pairs[5][2] = { { "the cat sat on the mat", "the cat sat on the mat" },
                                { "a b c d e", "a b c d f" }, { "", "empty" }, { "x y", "x y z" },
                                { "the the the the the", "the cat is on the mat" } };
    BleuStats expected;
    bleu_reset(&expected);
    for (int i = 0; i < 5; i++) bleu_add_sentence_text(&expected, pairs[i][0], pairs[i][1]);
    double want = bleu_score(&expected, NULL, NULL);
    int status = run_cli("bleu %s %s --tokenize none --smooth none", hyp, ref);
    double got = printed_number_after(cli_output, "smooth:none = ");
    check(status == 0 && want > 10 && want < 90 && fabs(got - want) <= 0.005 + 1e-9 &&
          strstr(cli_output, "5 sentences"),
          "cli: bleu HYP REF prints %.2f for 5 lines, the corpus BLEU of the same sentences (%.4f)",
          got, want);
    write_text(test_path("short.txt"), "the cat\n");
    check_cli_error("bleu of files of different lengths", "short.txt ends after 1 line but",
                    "bleu %s %s", test_path("short.txt"), ref);
    check_cli_error("bleu of one file", "bleu: expected two files", "bleu %s", hyp);
    // U+00A0 and U+3000 separate words as sacreBLEU's tokenize='none' (Python's str.split())
    // separates them: the corpus of test_bleu_white_space, whose BLEU by hand is
    // 100 (10/11 8/9 6/7 4/5)^(1/4) = 86.28
    write_text(hyp, "the\xc2\xa0" "cat sat on\xe3\x80\x80the mat\n\xe3\x80\x80" "a\xe3\x80\x80"
                    "b\xe3\x80\x80" "c\xe3\x80\x80" "d\xe3\x80\x80" "e\xe3\x80\x80\n");
    write_text(ref, "the cat\xc2\xa0sat on the mat\na b c d f\n");
    want = 100 * pow(10.0 / 11 * 8.0 / 9 * 6.0 / 7 * 4.0 / 5, 0.25);
    status = run_cli("bleu --tokenize none --smooth none %s %s", hyp, ref);
    got = printed_number_after(cli_output, "smooth:none = ");
    check(status == 0 && fabs(got - want) <= 0.005 + 1e-9 &&
          strstr(cli_output, "hyp_len = 11 ref_len = 11"),
          "cli: bleu of text with U+00A0 and U+3000 prints %.2f, as by hand (%.4f) and as "
          "sacreBLEU", got, want);
    check_cli_error("bleu of a missing file", "bleu: /nonexistent/h.txt: cannot open",
                    "bleu /nonexistent/h.txt %s", ref);
    // a directory is named as one (it read as a file of 0 lines); a read that fails is not the end
    // of a file
    check_cli_error("bleu of a directory", "bleu: /tmp: is a directory; expected a text file",
                    "bleu /tmp %s", ref);
    check_cli_error("bleu against a directory", "bleu: /tmp: is a directory", "bleu %s /tmp", hyp);
    if (access("/proc/self/mem", R_OK) == 0)
        check_cli_error("bleu of a file whose reading fails",
                        "bleu: /proc/self/mem: read error after 0 lines",
                        "bleu /proc/self/mem %s", ref);
    // text that is not UTF-8 is refused with its file and line, as sacreBLEU refuses it: Latin-1,
    // a binary file
    write_text(test_path("latin1.txt"), "the cat\ncaf\xe9 au lait\n");
    write_text(test_path("two.txt"), "the cat\ncafe au lait\n");
    check_cli_error("bleu of Latin-1 text",
                    "latin1.txt:2: byte 4 of the line, 0xe9, is not UTF-8; expected UTF-8 text",
                    "bleu %s %s", test_path("two.txt"), test_path("latin1.txt"));
    write_file(test_path("binary.txt"), "\x7f" "ELF\x02\x01\x01\n\x03\x00>\x00", 12);
    check_cli_error("bleu of a binary file", "binary.txt:2: a zero byte; expected text",
                    "bleu %s %s", test_path("binary.txt"), test_path("two.txt"));
    write_file(test_path("binary.txt"), "\x7f" "ELF\x02\x01\x01\n\x03\xc0>\x80", 12);
    check_cli_error("bleu of a binary file without zero bytes",
                    "binary.txt:2: byte 2 of the line, 0xc0, is not UTF-8", "bleu %s %s",
                    test_path("binary.txt"), test_path("two.txt"));
}

// lab/bleu.c against sacreBLEU itself: every corpus of lab/sacrebleu_cases.txt
// (written once by dev/sacrebleu_cases.py with sacreBLEU 2.6.0) read from
// files by bleu_files and scored with each tokenizer and smoothing there;
// the score, the four precisions and BP must be sacreBLEU's to rounding
// (1e-9 relative: the same operations in the same order give the same bits),
// and the signature its signature. Then the command's line, as
// `sacrebleu -f text` prints it, and its refusals.
typedef struct {
    char tokenize[8], smooth[8], value[16], signature[128];
    double score, p[BLEU_MAX_ORDER], bp;
} SacrebleuCase;

static void copy_file_for_cli(const char *from, const char *to) {
    size_t n;
    unsigned char *data = read_file(from, &n);
    write_file(to, data ? (const char *)data : "", data ? n : 0);
    free(data);
}

static int close_to(double got, double want) {
    return fabs(got - want) <= 1e-9 * fmax(1.0, fabs(want));
}

// Scores one case from the files hyp and ref; 1 if it agrees with sacreBLEU (else *why says what
// differs).
static int bleu_case_agrees(const SacrebleuCase *c, const char *hyp, const char *ref, char *why,
                            size_t why_size) {
    BleuStats stats;
    int lines, tok13a = strcmp(c->tokenize, "13a") == 0, method = 0;
    while (method < 4 && strcmp(c->smooth, smoothing_names[method]) != 0)
        method++;
    double value = strcmp(c->value, "-") == 0 ? smoothing_defaults[method] : atof(c->value);
    const char *error = method < 4 ? bleu_files(&stats, hyp, ref, tok13a, &lines)
                                   : "unknown smoothing";
    if (error) {
        snprintf(why, why_size, "%s", error);
        return 0;
    }
    double p[BLEU_MAX_ORDER], bp, score = bleu_smoothed(&stats, (Smoothing)method, value, p, &bp);
    char signature[160];
    bleu_signature(signature, sizeof signature, tok13a, (Smoothing)method, value);
    int agrees = close_to(score, c->score) && close_to(bp, c->bp) &&
                 strcmp(signature, c->signature) == 0;
    for (int n = 0; n < BLEU_MAX_ORDER; n++) agrees &= close_to(p[n], c->p[n]);
    snprintf(why, why_size,
             "%s: BLEU %.10g, sacreBLEU %.10g; p %.4f/%.4f/%.4f/%.4f, sacreBLEU "
             "%.4f/%.4f/%.4f/%.4f; BP %.6f, %.6f",
             signature, score, c->score, p[0], p[1], p[2], p[3], c->p[0], c->p[1], c->p[2], c->p[3],
             bp, c->bp);
    return agrees;
}

static void test_bleu_against_sacrebleu(void) {
    FILE *f = fopen("lab/sacrebleu_cases.txt", "r");
    if (!f) {
        check(0, "bleu: lab/sacrebleu_cases.txt: cannot open (run the tests from the repository's "
                 "top)");
        return;
    }
    const char *hyp = test_path("sb_hyp.txt"), *ref = test_path("sb_ref.txt");
    char *line = NULL, why[600] = "", first_disagreement[700] = "";
    size_t capacity = 0;
    FILE *hyp_file = NULL, *ref_file = NULL;
    int cases = 0, disagree = 0, corpora = 0, smoothing_matters = 0, nonzero = 0;
    double none_score = 0;
    SacrebleuCase last = { "", "", "", "", 0, { 0 }, 0 };
    while (getline(&line, &capacity, f) > 0) {
        line[strcspn(line, "\n")] = 0;
        if (strncmp(line, "corpus ", 7) == 0) {
            hyp_file = fopen(hyp, "w");
            ref_file = fopen(ref, "w");
            corpora++;
        } else if ((line[0] == 'h' || line[0] == 'r') && line[1] == ' ' && hyp_file && ref_file) {
            fprintf(line[0] == 'h' ? hyp_file : ref_file, "%s\n", line + 2);
        } else if (strncmp(line, "score ", 6) == 0) {
            if (hyp_file) {
                fclose(hyp_file);
                fclose(ref_file);
                hyp_file = ref_file = NULL;
            }
            SacrebleuCase c;
            int fields = sscanf(line, "score %7s %7s %15s %lf %lf %lf %lf %lf %lf %127s",
                                c.tokenize, c.smooth, c.value, &c.score, &c.p[0], &c.p[1], &c.p[2],
                                &c.p[3], &c.bp, c.signature);
            cases++;
            if (fields != 10 || !bleu_case_agrees(&c, hyp, ref, why, sizeof why)) {
                if (!disagree++)
                    snprintf(first_disagreement, sizeof first_disagreement, "corpus %d: %s",
                             corpora, fields != 10 ? line : why);
            }
            if (strcmp(c.smooth, "none") == 0 && strcmp(c.tokenize, "none") == 0)
                none_score = c.score;
            if (strcmp(c.smooth, "exp") == 0 && strcmp(c.tokenize, "none") == 0 &&
                none_score == 0 && c.score > 0)
                smoothing_matters++;
            nonzero += c.score > 0;
            if (strcmp(c.tokenize, "13a") == 0 && strcmp(c.smooth, "exp") == 0 && c.score > 0) {
                last = c;   // the last corpus scored above 0 with sacreBLEU's defaults, for the
                            // command line below
                copy_file_for_cli(hyp, test_path("sb_last_hyp.txt"));
                copy_file_for_cli(ref, test_path("sb_last_ref.txt"));
            }
        }
    }
    free(line);
    fclose(f);
    check(cases == 600 && corpora == 60 && disagree == 0 && smoothing_matters >= 5 &&
          nonzero >= 400,
          "bleu: %d scores of %d corpora (--tokenize none and 13a, --smooth none, exp, floor, "
          "add-k) equal sacreBLEU 2.6.0's, precisions, BP and signature included (%d differ%s%s; "
          "%d corpora score 0 unsmoothed and above 0 with exp)",
          cases, corpora, disagree, disagree ? ": " : "", first_disagreement, smoothing_matters);
    // the command's line, as `sacrebleu -f text` prints it, the precisions to two decimals
    char expected[400];
    snprintf(expected, sizeof expected, "BLEU|%s = %.2f %.2f/%.2f/%.2f/%.2f (BP = %.3f",
             last.signature, last.score, last.p[0], last.p[1], last.p[2], last.p[3], last.bp);
    int status = run_cli("bleu %s %s", test_path("sb_last_hyp.txt"), test_path("sb_last_ref.txt"));
    check(status == 0 && last.score > 0 && strstr(cli_output, expected),
          "cli: bleu with sacreBLEU's defaults prints \"%s ...\" as sacreBLEU scores it", expected);
    check_cli_error("bleu --tokenize intl",
                    "bleu: --tokenize 'intl' is not a tokenizer; expected 13a or none",
                    "bleu --tokenize intl %s %s", hyp, ref);
    check_cli_error("bleu --smooth laplace", "bleu: --smooth 'laplace' is not a smoothing method",
                    "bleu --smooth laplace %s %s", hyp, ref);
    check_cli_error("bleu --smooth exp --smooth-value 2",
                    "bleu: --smooth-value goes with --smooth floor or add-k",
                    "bleu --smooth exp --smooth-value 2 %s %s", hyp, ref);
    check_cli_error("bleu --smooth-value -1", "--smooth-value",
                    "bleu --smooth floor --smooth-value -1 %s %s", hyp, ref);
}

// The lab's commands on the small trained copy model (trained_copy_model)
// and its checkpoint, which transformer.c's tests wrote (run_command_line_tests):
// average, train --log and --keep-last with plot, pe and attention; then what
// a new user meets: runs kept and resumed, moved data, commands named in their
// errors, BLEU of files.
// A held-out set of 501 pairs (every 20th of 10,020 lines): train's evaluation decodes the first
// 500 by default and says so; --eval-size 0 decodes all 501 (issue 49: WMT's held-out 1/20 is
// 225,000 pairs, hours of greedy decoding at each evaluation).
static void test_default_eval_size(void) {
    const char *tsv = test_path("eval_size.tsv"), *ckpt = test_path("eval_size.ckpt");
    FILE *f = fopen(tsv, "w");
    if (!f) {
        check(0, "cli: cannot write %s", tsv);
        return;
    }
    for (int i = 0; i < 10020; i++) fprintf(f, "w%d x\tx w%d\n", i % 7, i % 5);
    fclose(f);
    const char *run = "--layers 1 --d-model 8 --d-ff 16 --heads 2 --steps 1 --positions 8 "
                      "--batch-tokens 4000 --log-every 0 --eval-every 0 --show 0 --threads 1 "
                      "--force";
    int status = run_cli("train --train %s --checkpoint %s %s", tsv, ckpt, run);
    check(status == 0 &&
          strstr(cli_output, "/500) | the first 500 of 501 held-out pairs (--eval-size 0: all)"),
          "cli: train on 10,020 lines evaluates the first 500 of its 501 held-out pairs by default "
          "and says so (exit %d)", status);
    status = run_cli("train --train %s --checkpoint %s %s --eval-size 0", tsv, ckpt, run);
    check(status == 0 && strstr(cli_output, "/501)\n"),
          "cli: --eval-size 0 evaluates all 501 held-out pairs (exit %d)", status);
}

static void test_lab_evaluation_commands(void) {
    const char *ckpt = test_path("copy_small.ckpt");
    if (!file_exists(ckpt)) {
        check(0, "cli: no checkpoint %s from transformer.c's tests", ckpt);
        return;
    }
    test_average(trained_copy_model());
    test_log_keep_last_and_pictures(ckpt);
    printf("-- what a new user meets: runs kept and resumed, moved data, commands named, BLEU of "
           "files\n");
    test_existing_checkpoints_and_keep_last();
    test_stale_step_file_and_lost_logs();
    test_moved_data();
    test_default_eval_size();
    test_command_names_and_labels();
    test_bleu_command();
    test_bleu_against_sacrebleu();
}

// ---- §5.1 byte-pair encoding ------------------------------------------------------

// The subwords bpe_encode_word makes of word, as text separated by spaces.
static void encode_to_text(char *out, size_t size, const Bpe *b, const char *word) {
    int n = (int)strlen(word);
    int *start = checked_calloc((size_t)n + 2, sizeof(int), "test"),
        *scratch = checked_calloc(2 * ((size_t)n + 2), sizeof(int), "test");
    char *text = checked_calloc((size_t)n + 5, 1, "test");
    int count = bpe_encode_word(b, start, word, n, scratch, text);
    out[0] = '\0';
    for (int i = 0; i < count; i++) {
        bpe_symbol_text(text, word, start, count, i);
        snprintf(out + strlen(out), size - strlen(out), "%s%s", i ? " " : "", text);
    }
    free(start);
    free(scratch);
    free(text);
}

// Sennrich, Haddow & Birch (2016), worked by hand with the tie rule (the
// left symbol first in byte order, then the right): low 5, lower 2, newest 6,
// widest 3. Pair counts at the start: e s, s t, t </w> 9 each -> (e s); then
// es t and t </w> 9 -> (es t); est </w> 9; l o and o w 7 -> (l o); lo w 7;
// then e w, n e, w est</w> 6 -> (e w); ew est</w>; n ewest</w>; low </w> 5;
// d est</w>, i d, w i 3 -> (d est</w>), (i dest</w>), (w idest</w>); then
// e r, low e, r </w> 2 -> (e r), (er </w>), (low er</w>): 15 merges, and then
// every word is one symbol.
static void test_bpe_learn_and_apply(void) {
    const char *words[4] = { "low", "lower", "newest", "widest" },
               *reversed[4] = { "widest", "newest", "lower", "low" };
    long counts[4] = { 5, 2, 6, 3 }, reversed_counts[4] = { 3, 6, 2, 5 };
    static const char *expected[15][2] = {
        { "e", "s" }, { "es", "t" }, { "est", "</w>" }, { "l", "o" }, { "lo", "w" }, { "e", "w" },
        { "ew", "est</w>" }, { "n", "ewest</w>" }, { "low", "</w>" }, { "d", "est</w>" },
        { "i", "dest</w>" }, { "w", "idest</w>" }, { "e", "r" }, { "er", "</w>" },
        { "low", "er</w>" },
    };
    Bpe b, b2;
    bpe_init(&b);
    bpe_init(&b2);
    int learned = bpe_learn(&b, words, counts, 4, 100);
    int same = learned == 15;
    for (int r = 0; r < learned && same; r++)
        same = strcmp(b.left[r], expected[r][0]) == 0 && strcmp(b.right[r], expected[r][1]) == 0;
    check(same,
          "bpe: low 5, lower 2, newest 6, widest 3 (Sennrich et al.): the 15 merges worked by "
          "hand, in order (learned %d; first %s %s)",
          learned, learned ? b.left[0] : "-", learned ? b.right[0] : "-");
    check(learned == 15 && b.frequency[0] == 9 && b.frequency[8] == 5 && b.frequency[14] == 2,
          "bpe: asked for 100 merges it stops after 15, when every word is one symbol; counts 9, "
          "5, 2 as by hand");
    int learned2 = bpe_learn(&b2, reversed, reversed_counts, 4, 100);
    check(learned2 == learned && same_merges(&b, &b2),
          "bpe: the words in another order give the same merges (the tie rule)");
    bpe_free(&b2);
    bpe_init(&b2);
    check(bpe_learn(&b2, words, counts, 4, 3) == 3 && b2.num_merges == 3,
          "bpe: asked for 3 merges, it learns 3");
    bpe_free(&b2);
    // apply: the merges in the order learned
    struct { const char *word, *subwords; } cases[] = {
        { "lowest", "low est</w>" },          // never seen: two subwords
        { "newer", "n ew er</w>" },
        { "low", "low</w>" }, { "widest", "widest</w>" },
        { "l\xc3\xb6w", "l \xc3\xb6 w </w>" }, // o-umlaut: one character, never merged
        { "\xff\xfelow", "\xff \xfe low</w>" }, // bytes that are not UTF-8: one symbol each
        { "a\xc3", "a \xc3 </w>" },            // a UTF-8 sequence cut short
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char got[200];
        encode_to_text(got, sizeof got, &b, cases[i].word);
        check(strcmp(got, cases[i].subwords) == 0, "bpe: case %zu is cut into '%s' (expected '%s')",
              i + 1, got, cases[i].subwords);
    }
    // joining: tokens ending in </w> end a word
    Vocabulary v;
    vocab_init(&v);
    Bpe *merges = checked_calloc(1, sizeof(Bpe), "test");
    *merges = b;
    vocab_add_subwords(&v, merges);
    size_t capacity = 0;
    int *heap = NULL;
    TextSource from = { "test", 0, 0, NULL };
    char sentence[] = "lowest newer low";
    int n = text_tokenize(sentence, &v, merges, 0, &heap, &capacity, &from);
    char *joined = tokens_to_text(&v, merges, heap, n);
    check(n == 6 && strcmp(joined, "lowest newer low") == 0 && from.unknown == 0,
          "bpe: 'lowest newer low' is 6 subwords, without <unk>, and joins back to the words "
          "('%s')", joined);
    free(joined);
    free(heap);
    vocab_free(&v);
    bpe_free_merges(merges);
}

// The learner as it was before issue 49, kept here as the reference: after
// every merge it looks at every word and scans every pair for the best one.
// Slow (merges x words), plainly right; bpe_learn must give exactly its merges.
typedef struct {
    PairTable index;
    int *left, *right;
    long *count;
    int size, capacity;
} ReferencePairs;

static void reference_pairs_add(ReferencePairs *pc, int left, int right, long delta) {
    int i = pair_find(&pc->index, left, right);
    if (i < 0) {
        if (pc->size == pc->capacity) {
            pc->capacity = pc->capacity ? 2 * pc->capacity : 1024;
            pc->left = checked_realloc(pc->left, pc->capacity, sizeof(int), "test");
            pc->right = checked_realloc(pc->right, pc->capacity, sizeof(int), "test");
            pc->count = checked_realloc(pc->count, pc->capacity, sizeof(long), "test");
        }
        i = pc->size++;
        pc->left[i] = left;
        pc->right[i] = right;
        pc->count[i] = 0;
        pair_insert(&pc->index, left, right, i);
    }
    pc->count[i] += delta;
}

static void reference_pairs_of_word(ReferencePairs *pc, const int *symbols, int length,
                                    long delta) {
    for (int i = 0; i + 1 < length; i++) reference_pairs_add(pc, symbols[i], symbols[i + 1], delta);
}

static int reference_best_pair(const ReferencePairs *pc, const Vocabulary *symbols) {
    int best = -1;
    for (int i = 0; i < pc->size; i++) {
        if (pc->count[i] < 2)
            continue;
        if (best >= 0 && pc->count[i] < pc->count[best])
            continue;
        if (best >= 0 && pc->count[i] == pc->count[best]) {
            int order = strcmp(symbols->words[pc->left[i]], symbols->words[pc->left[best]]);
            if (order == 0)
                order = strcmp(symbols->words[pc->right[i]], symbols->words[pc->right[best]]);
            if (order >= 0)
                continue;
        }
        if (joins_to_special_token(symbols->words[pc->left[i]], symbols->words[pc->right[i]]))
            continue;
        best = i;
    }
    return best;
}

static int reference_bpe_learn(Bpe *b, const char *const *words, const long *counts, int n,
                               int num_merges) {
    int **symbols = checked_calloc(n > 0 ? n : 1, sizeof(int *), "test");
    int *length = checked_calloc(n > 0 ? n : 1, sizeof(int), "test");
    ReferencePairs pc;
    memset(&pc, 0, sizeof pc);
    for (int k = 0; k < n; k++) {
        int bytes = (int)strlen(words[k]);
        int *start = checked_calloc((size_t)bytes + 2, sizeof(int), "test");
        char *text = checked_calloc((size_t)bytes + 5, 1, "test");
        length[k] = bpe_characters(start, words[k], bytes);
        symbols[k] = checked_calloc(length[k], sizeof(int), "test");
        for (int i = 0; i < length[k]; i++) {
            int text_length = bpe_symbol_text(text, words[k], start, length[k], i);
            symbols[k][i] = vocab_add(&b->symbols, text, (size_t)text_length);
        }
        reference_pairs_of_word(&pc, symbols[k], length[k], counts[k]);
        free(start);
        free(text);
    }
    int learned = 0;
    for (; learned < num_merges; learned++) {
        int best = reference_best_pair(&pc, &b->symbols);
        if (best < 0)
            break;
        int l = pc.left[best], r = pc.right[best];
        bpe_add_merge(b, b->symbols.words[l], b->symbols.words[r], pc.count[best]);
        int joined = b->merged[b->num_merges - 1];
        for (int k = 0; k < n; k++) {
            int holds = 0;
            for (int i = 0; i + 1 < length[k]; i++)
                holds |= symbols[k][i] == l && symbols[k][i + 1] == r;
            if (!holds)
                continue;
            reference_pairs_of_word(&pc, symbols[k], length[k], -counts[k]);
            int kept = 0;
            for (int i = 0; i < length[k]; i++) {
                symbols[k][kept] = symbols[k][i];
                if (i + 1 < length[k] && symbols[k][i] == l && symbols[k][i + 1] == r) {
                    symbols[k][kept] = joined;
                    i++;
                }
                kept++;
            }
            length[k] = kept;
            reference_pairs_of_word(&pc, symbols[k], length[k], counts[k]);
        }
    }
    for (int k = 0; k < n; k++) free(symbols[k]);
    free(symbols);
    free(length);
    pair_table_free(&pc.index);
    free(pc.left);
    free(pc.right);
    free(pc.count);
    return learned;
}

// Do a and b hold the same merges (pair and count, in order) and the same symbols, in order?
static int same_learning(const Bpe *a, const Bpe *b) {
    if (a->num_merges != b->num_merges || a->symbols.size != b->symbols.size)
        return 0;
    for (int r = 0; r < a->num_merges; r++)
        if (strcmp(a->left[r], b->left[r]) != 0 || strcmp(a->right[r], b->right[r]) != 0 ||
            a->frequency[r] != b->frequency[r])
            return 0;
    for (int id = 0; id < a->symbols.size; id++)
        if (strcmp(a->symbols.words[id], b->symbols.words[id]) != 0)
            return 0;
    return 1;
}

// bpe_learn against the reference on generated words: tiny alphabets and small counts, where
// most pairs tie and words such as "aaaa" hold a pair twice over (overlapping); UTF-8 letters;
// the letters of <s> </s> <pad> <unk>, which no merge may join; words counted 0 times (only in
// held-out pairs); merges that make the same text twice ("ab c" and "a bc"); and a Zipfian
// vocabulary of syllables as in real text. Every merge, its count, and the symbols' order agree.
static void test_bpe_learn_against_reference(void) {
    static const char *alphabets[5][12] = {
        { "a", "b" },
        { "a", "b", "c" },
        { "a", "b", "\xc3\xa4", "\xc3\x9f", "e" },
        { "<", "s", ">", "/", "p", "a", "d", "u", "n", "k", "x" },
        { "st", "ra", "in", "e", "ung", "ch", "ei", "t", "er", "o", "l", "m" },
    };
    static const int letters[5] = { 2, 3, 5, 11, 12 };
    Rng rng;
    rng_seed(&rng, 49);
    int agreed = 0, cases = 0, merges = 0;
    char first_difference[200] = "";
    for (int corpus = 0; corpus < 40; corpus++) {
        int kind = corpus % 5, n = 20 + rng_below(&rng, corpus < 35 ? 200 : 3000);
        Vocabulary distinct;
        vocab_init(&distinct);
        long *counts = checked_calloc((size_t)n, sizeof(long), "test");
        int num_words = 0;
        for (int k = 0; k < n; k++) {
            char word[128] = "";
            int pieces = 1 + rng_below(&rng, kind == 4 ? 5 : 9);
            for (int i = 0; i < pieces; i++)
                strcat(word, alphabets[kind][rng_below(&rng, letters[kind])]);
            int before = distinct.size;
            vocab_add(&distinct, word, strlen(word));
            if (distinct.size == before)
                continue;   // a word already drawn (or a special token's text)
            long count = kind == 4 ? 1 + 1000 / (num_words + 1)
                                   : rng_below(&rng, 5);   // 0: held out only
            counts[num_words++] = count;
        }
        const char *const *words = (const char *const *)distinct.words + NUM_SPECIAL_TOKENS;
        num_words = distinct.size - NUM_SPECIAL_TOKENS;
        int asked = corpus % 3 == 0 ? 5 + rng_below(&rng, 20) : 100000;
        Bpe fast, reference;
        bpe_init(&fast);
        bpe_init(&reference);
        int got = bpe_learn(&fast, words, counts, num_words, asked);
        int expected = reference_bpe_learn(&reference, words, counts, num_words, asked);
        int same = got == expected && same_learning(&fast, &reference);
        if (!same && !first_difference[0]) {
            int r = 0;
            while (r < fast.num_merges && r < reference.num_merges &&
                   strcmp(fast.left[r], reference.left[r]) == 0 &&
                   strcmp(fast.right[r], reference.right[r]) == 0 &&
                   fast.frequency[r] == reference.frequency[r])
                r++;
            snprintf(first_difference, sizeof first_difference,
                     "corpus %d: %d and %d merges, the first to differ is number %d",
                     corpus + 1, got, expected, r + 1);
        }
        agreed += same;
        cases++;
        merges += got;
        bpe_free(&fast);
        bpe_free(&reference);
        free(counts);
        vocab_free(&distinct);
    }
    check(agreed == cases && merges > 1000,
          "bpe: on %d generated corpora (ties, overlapping pairs, UTF-8, special tokens' letters, "
          "words counted 0 times, Zipfian syllables) the learner gives the reference's merges, "
          "counts and symbols, in order: %d agreed, %d merges in all%s%s",
          cases, agreed, merges, first_difference[0] ? "; " : "", first_difference);
}

// How train held pairs out before issue 49's last change (the file read whole, then split): moves
// every `every`-th pair (the every-th, 2·every-th, ...) of dataset into held_out, in place.
static void reference_dataset_split(Dataset *dataset, Dataset *held_out, int every) {
    int kept = 0;
    size_t next = 0;   // where the next kept pair's tokens go
    dataset->longest_src = 0;
    dataset->longest_tgt = 0;
    for (int i = 0; i < dataset->count; i++) {
        SentencePair pair = dataset->pairs[i];
        const int *src = dataset->tokens + pair.src;
        const int *tgt = dataset->tokens + pair.tgt;
        if ((i + 1) % every == 0) {
            dataset_add(held_out, src, pair.src_len, tgt, pair.tgt_len, pair.line);
            continue;
        }
        size_t n = (size_t)pair.src_len + (size_t)pair.tgt_len;
        memmove(dataset->tokens + next, src, n * sizeof(int));
        pair.src = next;
        pair.tgt = next + (size_t)pair.src_len;
        dataset->pairs[kept] = pair;
        kept++;
        next += n;
        if (pair.src_len > dataset->longest_src)
            dataset->longest_src = pair.src_len;
        if (pair.tgt_len > dataset->longest_tgt)
            dataset->longest_tgt = pair.tgt_len;
    }
    dataset->count = kept;
    dataset->num_tokens = next;
    dataset->tokens = checked_realloc(dataset->tokens, next, sizeof(int), "sentence tokens");
    dataset->tokens_capacity = next > 0 ? next : 1;
}


// Are the two datasets the same pairs (lengths, lines), the same tokens, the same longest sides?
static int same_dataset(const Dataset *a, const Dataset *b) {
    if (a->count != b->count || a->num_tokens != b->num_tokens)
        return 0;
    if (a->longest_src != b->longest_src || a->longest_tgt != b->longest_tgt)
        return 0;
    for (int i = 0; i < a->count; i++) {
        const SentencePair *p = &a->pairs[i], *q = &b->pairs[i];
        if (p->src_len != q->src_len || p->tgt_len != q->tgt_len || p->line != q->line)
            return 0;
        if (memcmp(a->tokens + p->src, b->tokens + q->src, (size_t)p->src_len * sizeof(int)) != 0)
            return 0;
        if (memcmp(a->tokens + p->tgt, b->tokens + q->tgt, (size_t)p->tgt_len * sizeof(int)) != 0)
            return 0;
    }
    return 1;
}

// train's held-out pairs read into their own dataset as the file is read (dataset_read_tsv_split)
// are those of the file read whole and then split: the same pairs in both, in order, the same
// tokens and ids.
static void test_tsv_held_out_while_reading(void) {
    const char *path = test_path("held_out.tsv");
    char text[1 << 14];
    size_t size = 0;
    for (int line = 0; line < 150; line++)
        size += (size_t)snprintf(text + size, sizeof text - size,
                                 line % 11 == 3 ? " \n" : "a%d b%d c\tx%d %s\n", line % 17,
                                 line % 5, line % 23, line % 4 ? "y" : "y z w");
    write_text(path, text);
    int agreed = 0;
    static const int every[3] = { 20, 7, 200 };   // (200: more than the pairs, none held out)
    for (int e = 0; e < 3; e++) {
        Vocabulary v1, v2;
        vocab_init(&v1);
        vocab_init(&v2);
        Dataset whole, whole_held, train, held;
        memset(&whole, 0, sizeof whole);
        memset(&whole_held, 0, sizeof whole_held);
        memset(&train, 0, sizeof train);
        memset(&held, 0, sizeof held);
        const char *e1 = dataset_read_tsv(&whole, &v1, NULL, path, 1);
        if (!e1 && whole.count >= every[e])
            reference_dataset_split(&whole, &whole_held, every[e]);
        char first[300];
        snprintf(first, sizeof first, "%s", e1 ? e1 : "");
        const char *e2 = dataset_read_tsv_split(&train, &held, every[e], &v2, NULL, path, 1);
        int same = !e1 && !e2 && same_dataset(&whole, &train) && same_dataset(&whole_held, &held);
        same = same && v1.size == v2.size && held.count == (train.count + held.count) / every[e];
        for (int id = 0; same && id < v1.size; id++) same = strcmp(v1.words[id], v2.words[id]) == 0;
        agreed += same;
        dataset_free(&whole);
        dataset_free(&whole_held);
        dataset_free(&train);
        dataset_free(&held);
        vocab_free(&v1);
        vocab_free(&v2);
    }
    check(agreed == 3,
          "tsv: every 20th, 7th or 200th pair held out as a 150-line file (blank lines) is read "
          "gives the pairs, tokens and vocabulary of the file read whole and then split: %d of 3 "
          "agree", agreed);
}

// The words of a TSV file as learning counts them (word_counts_read_tsv) against dataset_read_tsv
// and reference_dataset_split, which the learner read before issue 49: the same words in the same
// order (a byte-order mark, \r\n, blank lines, held-out pairs listed with count 0), the same
// counts, and the same message for each kind of bad line.
static void test_bpe_word_counts(void) {
    const char *path = test_path("bpe_counts.tsv");
    Rng rng;
    rng_seed(&rng, 7);
    size_t size = 0, capacity = 1 << 16;
    char *text = checked_calloc(capacity, 1, "test");
    size += (size_t)snprintf(text, capacity, "\xEF\xBB\xBF");
    static const char *pieces[6] = { "ab", "c", "\xc3\xa4", "de", "f", "g" };
    for (int line = 0; line < 300; line++) {
        if (line % 37 == 5)
            size += (size_t)snprintf(text + size, capacity - size, " \v \n");   // blank
        if (line % 41 == 3)
            size += (size_t)snprintf(text + size, capacity - size, "\r\n");
        for (int side = 0; side < 2; side++) {
            int words = 1 + rng_below(&rng, 5);
            for (int w = 0; w < words; w++) {
                int letters = 1 + rng_below(&rng, 3);
                for (int i = 0; i < letters; i++)
                    size += (size_t)snprintf(text + size, capacity - size,
                                             "%s", pieces[rng_below(&rng, 6)]);
                size += (size_t)snprintf(text + size, capacity - size, w + 1 < words ? " " : "");
            }
            size += (size_t)snprintf(text + size, capacity - size,
                                     side == 0 ? "\t" : line % 5 ? "\n" : "\r\n");
        }
    }
    write_text(path, text);
    free(text);
    // one part (one thread), and the file cut into 2, 3 and 7 parts counted apart and merged
    static const int parts[4] = { 1, 2, 3, 7 };
    int every[3] = { 0, 20, 7 }, agreed = 0;
    for (int c = 0; c < 12; c++) {
        int e = c % 3;
        counting_parts_asked = parts[c / 3];
        WordCounts w;
        memset(&w, 0, sizeof w);
        Vocabulary words;
        vocab_init(&words);
        Dataset dataset, held_out;
        memset(&dataset, 0, sizeof dataset);
        memset(&held_out, 0, sizeof held_out);
        const char *error = word_counts_read_tsv(&w, path, every[e]);
        const char *old_error = dataset_read_tsv(&dataset, &words, NULL, path, 1);
        if (!old_error && every[e] > 0)
            reference_dataset_split(&dataset, &held_out, every[e]);
        long *counts = checked_calloc((size_t)words.size, sizeof(long), "test");
        for (size_t i = 0; !old_error && i < dataset.num_tokens; i++) counts[dataset.tokens[i]]++;
        int same = !error && !old_error && w.num_words == words.size - NUM_SPECIAL_TOKENS;
        same = same && (held_out.count > 0) == (every[e] > 0);
        for (int k = 0; same && k < w.num_words; k++)
            same = strcmp(w.bytes + w.start[k], words.words[k + NUM_SPECIAL_TOKENS]) == 0 &&
                   w.count[k] == counts[k + NUM_SPECIAL_TOKENS];
        agreed += same;
        free(counts);
        dataset_free(&dataset);
        dataset_free(&held_out);
        vocab_free(&words);
        word_counts_free(&w);
    }
    counting_parts_asked = 0;
    check(agreed == 12,
          "bpe: the words of a 300-line file with a byte-order mark, blank lines and \\r\\n are "
          "counted as dataset_read_tsv reads them, all pairs and every 20th or 7th held out, in 1, "
          "2, 3 and 7 parts (threads) merged: %d of 12 agree", agreed);
    // bad lines: alone, and after good and blank lines (a later part's line: its number, the pairs
    // before it)
    static const char *bad[] = {
        "", "\n \n", "a b\n", "a\tb\tc\n", "a\t<s> b\n", "<unk>\tb\n", " \tb\n", "a\t \n",
        "ok\tfine\nx\xff\tb\n", "a\x00z\tb\n", "a\tb\tc",
    };
    static const size_t bad_bytes[] = { 0, 3, 4, 6, 8, 8, 4, 4,
                                        13, 6, 5 };   // (the zero byte's line: 6)
    int same_messages = 0, kinds = (int)(sizeof bad / sizeof *bad), cases = 0;
    char first[600] = "";
    for (int c = 0; c < 4 * kinds; c++) {
        int i = c % kinds, after_lines = c / kinds >= 2;
        counting_parts_asked = c / kinds % 2 ? 3 : 1;
        char bytes[4096];
        size_t size = 0;
        for (int line = 0; after_lines && line < 60; line++)
            size += (size_t)snprintf(bytes + size, sizeof bytes - size,
                                     line % 9 == 4 ? "\n" : "w%d x\ty z%d\n", line % 13, line % 7);
        memcpy(bytes + size, bad[i], bad_bytes[i]);
        size += bad_bytes[i];
        size += (size_t)snprintf(bytes + size, sizeof bytes - size,
                                 after_lines ? "more\tlines\nand\tmore\n" : "");
        write_file(path, bytes, size);
        WordCounts w;
        memset(&w, 0, sizeof w);
        Vocabulary words;
        vocab_init(&words);
        Dataset dataset;
        memset(&dataset, 0, sizeof dataset);
        const char *error = word_counts_read_tsv(&w, path, 20);
        char message[300];
        snprintf(message, sizeof message, "%s", error ? error : "(none)");
        const char *old_error = dataset_read_tsv(&dataset, &words, NULL, path, 1);
        int expected_error = !after_lines || i >= 2;   // (an empty or blank ending after good
                                                       // lines is fine)
        int same = expected_error ? error && old_error && strcmp(message, old_error) == 0
                                  : !error && !old_error;
        same_messages += same;
        cases++;
        if (!same && !first[0])
            snprintf(first, sizeof first, "; case %d: '%s' and '%s'", c + 1, message,
                     old_error ? old_error : "(none)");
        dataset_free(&dataset);
        vocab_free(&words);
        word_counts_free(&w);
    }
    counting_parts_asked = 0;
    check(same_messages == cases,
          "bpe: %d kinds of bad file (empty, blank, no tab, two tabs, a special token, an empty "
          "side, not UTF-8, a zero byte, no newline at the end), alone and after 60 lines, counted "
          "in 1 and 3 parts, give dataset_read_tsv's message: %d of %d agree%s",
          kinds, same_messages, cases, first);
}

// Writes a Zipfian corpus of syllables (lines pairs, a blank line now and then) to path, and after
// line bad_at (0: none) the line bad.
static void write_syllable_corpus(const char *path, int lines, int bad_at, const char *bad) {
    static const char *syllables[8] = { "ka", "st", "ei", "\xc3\xbcn", "or", "b", "lo", "t" };
    Rng rng;
    rng_seed(&rng, 4949);
    size_t capacity = 1 << 20, size = 0;
    char *text = checked_calloc(capacity, 1, "test");
    for (int line = 0; line < lines; line++) {
        if (line % 97 == 50)
            size += (size_t)snprintf(text + size, capacity - size, "\n");
        if (line == bad_at && bad_at > 0)
            size += (size_t)snprintf(text + size, capacity - size, "%s\n", bad);
        for (int side = 0; side < 2; side++) {
            int words = 1 + rng_below(&rng, 12);
            for (int k = 0; k < words; k++) {
                int rank = 1 + rng_below(&rng, 1 + rng_below(&rng, 400));   // about Zipfian
                for (int r = rank; r > 0; r /= 8)
                    size += (size_t)snprintf(text + size, capacity - size, "%s", syllables[r % 8]);
                size += (size_t)snprintf(text + size, capacity - size, "%s",
                                         k + 1 < words ? " " : "");
            }
            size += (size_t)snprintf(text + size, capacity - size, side == 0 ? "\t" : "\n");
        }
    }
    write_text(path, text);
    free(text);
}

// The merges learned from a file whose words are counted in parts (threads) are those of one part:
// the same symbols, merges and counts (a Zipfian corpus of syllables, every 20th pair held out or
// none).
static void test_bpe_counting_parts(void) {
    const char *path = test_path("bpe_parts.tsv");
    write_syllable_corpus(path, 3000, 0, "");
    int agreed = 0, cases = 0, merges = 0;
    for (int held_out = 0; held_out <= 20; held_out += 20) {
        Bpe *one = NULL;
        counting_parts_asked = 1;
        int learned_one = 0;
        const char *error = bpe_learn_from_tsv(&one, path, held_out, 500, &learned_one);
        for (int parts = 2; !error && parts <= 5; parts += 3) {
            Bpe *many = NULL;
            counting_parts_asked = parts;
            int learned = 0;
            const char *error_many = bpe_learn_from_tsv(&many, path, held_out, 500, &learned);
            agreed += !error_many && learned == learned_one && same_learning(one, many);
            cases++;
            merges += learned;
            bpe_free_merges(many);
        }
        bpe_free_merges(one);
    }
    counting_parts_asked = 0;
    check(agreed == cases && cases == 4 && merges > 1000,
          "bpe: 500 merges from a 3,000-line file counted in 2 and 5 parts (threads), with and "
          "without held-out pairs, are those of one part: %d of %d agree (%d merges)",
          agreed, cases, merges);
}


// train --bpe's data cut on threads, in blocks of lines (bpe_read_tsv_on_threads), against the
// plain reading line by line: the same training and held-out pairs, ids and vocabulary; where a
// block holds a bad line, the same message; where a word brings a character the merges never saw
// (the vocabulary grows), the same ids for it.
static void test_bpe_cutting_on_threads(void) {
    const char *learn_path = test_path("bpe_cut_learn.tsv"), *path = test_path("bpe_cut.tsv");
    write_syllable_corpus(learn_path, 2000, 0, "");
    static const char *cases[4] = { "", "stka\tei\tor", "Qst ka\tei \xc3\xa9or", "ka\t<s>" };
    static const int block_lines[4] = { 7, 64, 1000, 5 };
    int agreed = 0, pairs = 0;
    char first[400] = "";
    for (int c = 0; c < 4; c++) {
        write_syllable_corpus(path, 2000, c == 0 ? 0 : 1234, cases[c]);
        Vocabulary v[2];
        Bpe *merges[2] = { NULL, NULL };
        Dataset train[2], held[2];
        const char *error[2];
        char message[2][300];
        for (int way = 0; way < 2; way++) {   // 0: on threads, 1: plainly
            vocab_init(&v[way]);
            memset(&train[way], 0, sizeof train[way]);
            memset(&held[way], 0, sizeof held[way]);
            int learned = 0;
            error[way] = bpe_learn_for_training(&v[way], &merges[way], learn_path, 20, 300,
                                                &learned);
            if (!error[way] && way == 1)
                merges[way]->cache_complete = 0;   // (read plainly)
            cutting_block_lines_asked = block_lines[c];
            int threads = !error[way] && way == 0 && bpe_cut_on_threads(merges[way], stdin);
            if (!error[way]) {
                error[way] = dataset_read_tsv_split(&train[way], &held[way], 20, &v[way],
                                                    merges[way], path, 1);
            }
            cutting_block_lines_asked = 0;
            snprintf(message[way], sizeof message[way], "%s", error[way] ? error[way] : "");
            if (way == 0 && !threads)
                snprintf(message[way], sizeof message[way], "not cut on threads");
        }
        int same = strcmp(message[0], message[1]) == 0 &&
                   (c == 1 || c == 3) == (message[0][0] != 0);
        same = same && same_dataset(&train[0], &train[1]) && same_dataset(&held[0], &held[1]);
        same = same && v[0].size == v[1].size;
        for (int id = 0; same && id < v[0].size; id++)
            same = strcmp(v[0].words[id], v[1].words[id]) == 0;
        if (!same && !first[0])
            snprintf(first, sizeof first,
                     "; case %d: '%.150s' and '%.150s', vocabularies %d and %d", c + 1, message[0],
                     message[1], v[0].size, v[1].size);
        agreed += same;
        pairs += train[0].count + held[0].count;
        for (int way = 0; way < 2; way++) {
            dataset_free(&train[way]);
            dataset_free(&held[way]);
            vocab_free(&v[way]);
            bpe_free_merges(merges[way]);
        }
    }
    check(agreed == 4 && pairs > 5000,
          "bpe: a 2,000-pair file cut on threads in blocks of 7 to 1,000 lines, plain, with a bad "
          "line, with characters no merge saw, with a special token, gives the pairs, ids, "
          "vocabulary and message of the plain reading: %d of 4 agree (%d pairs)%s",
          agreed, pairs, first);
}

// Reads the lines of a TSV file (at most max) into lines[], without their newline.
static int read_lines(const char *path, char **lines, int max) {
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char *line = NULL;
    size_t capacity = 0;
    ssize_t length;
    int n = 0;
    while (n < max && (length = getline(&line, &capacity, f)) != -1) {
        if (length > 0 && line[length - 1] == '\n')
            line[length - 1] = '\0';
        lines[n++] = strdup(line);
    }
    free(line);
    fclose(f);
    return n;
}

// Joining the subwords of every line of the numbers data gives the line back;
// the test split's German words, none of them a training word, encode
// without <unk>.
static void test_bpe_numbers_data(void) {
    const char *files[3] = { "tiny_data/numbers_train.tsv", "tiny_data/numbers_dev.tsv",
                             "tiny_data/numbers_test.tsv" };
    Vocabulary v, words;
    Bpe *merges = NULL;
    vocab_init(&v);
    vocab_init(&words);
    int learned = 0;
    const char *e = bpe_learn_from_tsv(&merges, files[0], 0, 100, &learned);
    check(!e && learned == 100, "bpe: 100 merges from %s (%s)", files[0], e ? e : "learned");
    if (e) {
        vocab_free(&v);
        vocab_free(&words);
        bpe_free_merges(merges);
        return;
    }
    vocab_add_subwords(&v, merges);
    int size = v.size;
    Dataset train_words;
    memset(&train_words, 0, sizeof train_words);
    dataset_read_tsv(&train_words, &words, NULL, files[0], 1);
    static char *lines[6000];
    for (int f = 0; f < 3; f++) {
        Dataset d;
        memset(&d, 0, sizeof d);
        e = dataset_read_tsv(&d, &v, merges, files[f], 0);
        int n = read_lines(files[f], lines, 6000), same = !e && n == d.count, unknown = 0,
            german_seen = 0;
        for (int i = 0; i < n; i++) {
            const SentencePair *p = &d.pairs[i];
            char *tab = strchr(lines[i], '\t');
            if (same && tab) {
                *tab = '\0';
                char *src = tokens_to_text(&v, merges, d.tokens + p->src, p->src_len),
                     *tgt = tokens_to_text(&v, merges, d.tokens + p->tgt, p->tgt_len);
                same = strcmp(src, lines[i]) == 0 && strcmp(tgt, tab + 1) == 0;
                german_seen += vocab_find(&words, tab + 1, strlen(tab + 1)) >= 0;
                free(src);
                free(tgt);
            }
            for (int t = 0; same && t < p->src_len + p->tgt_len; t++)
                unknown += d.tokens[p->src + t] == TOKEN_UNK;
            free(lines[i]);
        }
        check(same && unknown == 0 && v.size == size,
              "bpe: %s: all %d lines join back from their subwords exactly, no <unk>", files[f], n);
        if (f == 2)
            check(german_seen == 0 && unknown == 0,
                  "bpe: none of the %d German words of the test split is a training "
                  "word (%d are), yet all encode without <unk>", n, german_seen);
        dataset_free(&d);
    }
    dataset_free(&train_words);
    vocab_free(&words);
    vocab_free(&v);
    bpe_free_merges(merges);
}

// How many of the space-separated tokens of text are a special token's text.
static int special_tokens_in(const char *text) {
    int n = 0;
    char *copy = strdup(text), *saved = NULL;
    for (char *t = strtok_r(copy, " \n", &saved); t; t = strtok_r(NULL, " \n", &saved))
        for (int i = 0; i < NUM_SPECIAL_TOKENS; i++) n += strcmp(t, special_tokens[i]) == 0;
    free(copy);
    return n;
}

// Does tokenize (with the cache of words cut, Bpe.cached) give line's words as bpe_encode_word
// cuts them, looked up in vocab one by one?
static int cuts_as_each_word(Vocabulary *vocab, Bpe *merges, const char *line) {
    int *ids = NULL, *expected = NULL;
    size_t capacity = 0, expected_capacity = 0, length;
    TextSource from = { "test", 0, 0, NULL };
    char *copy = strdup(line);
    int count = text_tokenize(copy, vocab, merges, 0, &ids, &capacity, &from);
    int expected_count = 0;
    for (const char *w = text_next_token(line, &length); w;
         w = text_next_token(w + length, &length)) {
        int *start = checked_calloc(length + 2, sizeof(int), "test");
        int *scratch = checked_calloc(length + 2, sizeof(int), "test");
        char *text = checked_calloc(length + 5, 1, "test");
        int subwords = bpe_encode_word(merges, start, w, (int)length, scratch, text);
        for (int s = 0; s < subwords; s++) {
            int text_length = bpe_symbol_text(text, w, start, subwords, s);
            push_id(&expected, &expected_capacity, expected_count++,
                    vocab_find(vocab, text, text_length));
        }
        free(start);
        free(scratch);
        free(text);
    }
    int same = count == expected_count && memcmp(ids, expected, (size_t)count * sizeof(int)) == 0;
    free(ids);
    free(expected);
    free(copy);
    return same;
}

// Cutting with the cache of words already cut (Bpe.cached) gives what cutting each word afresh
// gives: every line of the numbers test split read twice, once with the cache filling and once
// from it, against bpe_encode_word word by word; the same merges in a second vocabulary whose
// ids differ (as dev/fuzz/fuzz_bpe_apply.c shares them: make fuzz found the cache's ids taken
// there); a word with a character the vocabulary lacks is read as <unk> and warned of each time
// it occurs.
static void test_bpe_cache(void) {
    Vocabulary v, other;
    Bpe *merges = NULL;
    vocab_init(&v);
    int learned = 0;
    const char *e = bpe_learn_from_tsv(&merges, "tiny_data/numbers_train.tsv", 0, 300, &learned);
    if (!e)
        vocab_add_subwords(&v, merges);
    char *lines[1000];
    int n = e ? 0 : read_lines("tiny_data/numbers_test.tsv", lines, 1000);
    int same = n == 1000, cached_words = 0;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < n && same; i++) same = cuts_as_each_word(&v, merges, lines[i]);
        if (round == 0)
            cached_words = merges ? merges->cached.num_words : 0;
    }
    vocab_init(&other);
    vocab_add(&other, "x", 1);
    vocab_add(&other, "y", 1);
    if (!e)
        vocab_add_subwords(&other, merges);
    int same_other = n == 1000;
    for (int i = 0; i < n && same_other; i++)
        same_other = cuts_as_each_word(&other, merges, lines[i]);
    vocab_free(&other);
    check(!e && same && cached_words > 100 && same_other,
          "bpe: the 1000 lines of the numbers test split, cut twice (the cache filling, then from "
          "it: %d words), and with the same merges in another vocabulary, give bpe_encode_word's "
          "subwords word by word", cached_words);
    // a character no training word has: <unk>, warned of at each occurrence
    char sentence[] = "zwei\xc3\xa7 zwei\xc3\xa7 zwei";
    int *ids = NULL;
    size_t capacity = 0;
    TextSource from = { "test", 0, 0, NULL };
    fflush(stdout);
    int saved = dup(2), devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 2);
    int count = text_tokenize(sentence, &v, merges, 0, &ids, &capacity, &from);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(devnull);
    check(count > 3 && from.unknown == 2,
          "bpe: a word with a character the vocabulary lacks, twice in a sentence, "
          "is <unk> each time (%ld unknown)", from.unknown);
    free(ids);
    for (int i = 0; i < n; i++) free(lines[i]);
    vocab_free(&v);
    bpe_free_merges(merges);
}

// The evaluation's progress lines (lab_evaluate's): none in the first 3 s, a line with
// the pairs done, the rate and the time left when one is due, none at the end.
static void test_evaluation_progress_lines(void) {
    char printed[1000];
    int asked = progress_always;
    progress_always = 1;
    capture_begin();
    evaluation_progress_line(0, 500);
    evaluation_progress_line(50, 500);   // too soon
    evaluation_started -= 10;
    evaluation_shown -= 10;
    evaluation_progress_line(100, 500);   // 10 s: 10 pairs a second, 40 s left
    evaluation_progress_line(200, 500);   // too soon after that line
    evaluation_shown -= 10;
    evaluation_progress_line(500, 500);   // the end: no line
    capture_end(printed, sizeof printed);
    progress_always = asked;
    const char *expected = "eval   100/500 pairs | 10.0 pairs/s | elapsed 0:10 | left 0:40\n";
    check(strcmp(printed, expected) == 0,
          "progress: an evaluation prints a line when one is due and none at its end: '%s'",
          printed);
}

// Progress lines (long work: counting, learning merges, cutting): none before PROGRESS_SECONDS
// have passed, none when not asked and standard error is not a terminal; a line with what is
// done, the rate and the time left when one is due, and a last one at the end only after others.
static void test_progress_lines(void) {
    char printed[1000];
    int asked = progress_always;
    progress_always = 0;
    Progress p;
    capture_begin();
    progress_begin(&p, "bpe    learning merges", "merges", 20000);
    int quiet = !p.on;   // stderr is a file here: no lines unless --progress
    progress_always = 1;
    progress_begin(&p, "bpe    learning merges", "merges", 20000);
    progress_show(&p, 100, 0);   // too soon
    progress_show(&p, 100, 1);   // the end, with no line before: none
    p.start -= 10;
    p.last -= 10;
    progress_show(&p, 5000, 0);   // 10 s: 500 a second, 30 s left
    progress_show(&p, 20000, 1);
    capture_end(printed, sizeof printed);
    progress_always = asked;
    const char *expected = "bpe    learning merges: 5000/20.0k (25.0%) | 500 merges/s | "
                           "elapsed 0:10 | left 0:30\n";
    check(quiet && count_occurrences(printed, "\n") == 2 &&
          strncmp(printed, expected, strlen(expected)) == 0 &&
          strstr(printed, "bpe    learning merges: 20.0k/20.0k (100.0%)"),
          "progress: quiet unless asked when stderr is not a terminal; with --progress a line when "
          "one is due and one at the end ('%.200s')", printed);
}

// §5.1 never makes a special token's text. Words such as "<s>a", "</s>b",
// "<pad>e", "x<pad>", "<unk>f" (every pair inside them occurring twice) learn
// no merge that makes "<s>", "</s>", "<pad>" or "<unk>", and read as
// training data their subwords hold no special token's id: "<s>a" was cut
// into "<s>" (the id of <s>, a start-of-sentence marker inside a sentence)
// and "a</w>". A checkpoint whose merges make "<s>" is refused.
static void test_bpe_never_makes_special_tokens(void) {
    const char *path = test_path("bpe_special.tsv");
    const char *text = "<s>a x\t</s>b y\n<s>c x\t</s>d y\n<pad>e x\t<unk>f y\nx<pad> x\t<unk>h y\n";
    write_text(path, text);
    Vocabulary v;
    Bpe *merges = NULL;
    vocab_init(&v);
    int learned = 0, makes_special = 0, special_ids = 0, joins_back = 1;
    const char *e = bpe_learn_from_tsv(&merges, path, 0, 100, &learned);
    char joined[64];
    for (int r = 0; !e && r < merges->num_merges; r++) {
        snprintf(joined, sizeof joined, "%s%s", merges->left[r], merges->right[r]);
        makes_special += special_tokens_in(joined);
    }
    Dataset d;
    memset(&d, 0, sizeof d);
    if (!e) {
        vocab_add_subwords(&v, merges);
        e = dataset_read_tsv(&d, &v, merges, path, 0);
    }
    for (size_t i = 0; !e && i < d.num_tokens; i++) special_ids += d.tokens[i] < NUM_SPECIAL_TOKENS;
    for (int i = 0; !e && i < d.count; i++) {
        char *src = tokens_to_text(&v, merges, d.tokens + d.pairs[i].src, d.pairs[i].src_len);
        char *tgt = tokens_to_text(&v, merges, d.tokens + d.pairs[i].tgt, d.pairs[i].tgt_len);
        char line[128];
        snprintf(line, sizeof line, "%s\t%s\n", src, tgt);
        joins_back &= strstr(text, line) != NULL;
        free(src);
        free(tgt);
    }
    check(!e && learned > 0 && makes_special == 0 && special_ids == 0 && joins_back && d.count == 4,
          "bpe: words holding <s> </s> <pad> <unk> learn %d merges, none making a special token's "
          "text (%d did), and their subwords hold no special id (%d did) and join back to the "
          "words (%s)",
          learned, makes_special, special_ids, e ? e : "read");
    dataset_free(&d);
    vocab_free(&v);
    bpe_free_merges(merges);
    merges = NULL;
    // the input make fuzz minimized (dev/fuzz/fuzz_tsv_bpe.c, before the fix): one line, 9 bytes
    write_text(path, "<s>x\t<s>c");
    vocab_init(&v);
    special_ids = 0;
    e = bpe_learn_from_tsv(&merges, path, 0, 100, &learned);
    if (!e) {
        vocab_add_subwords(&v, merges);
        e = dataset_read_tsv(&d, &v, merges, path, 1);
    }
    for (size_t i = 0; !e && i < d.num_tokens; i++) special_ids += d.tokens[i] < NUM_SPECIAL_TOKENS;
    check(!e && special_ids == 0 && d.num_tokens >= 4,
          "bpe: '<s>x<TAB><s>c' (found by make fuzz) is cut into %zu "
          "subwords, %d of them a special token's id (%s)",
          d.num_tokens, special_ids, e ? e : "read");
    dataset_free(&d);
    vocab_free(&v);
    bpe_free_merges(merges);
    // a checkpoint whose merges make "<s>"
    vocab_init(&v);
    merges = checked_calloc(1, sizeof(Bpe), "test");
    bpe_init(merges);
    bpe_add_merge(merges, "<", "s", 2);
    bpe_add_merge(merges, "<s", ">", 2);
    vocab_add_subwords(&v, merges);
    TransformerConfig config = decode_config();
    config.vocab_size = v.size + 1;
    vocab_add(&v, "a", 1);
    Transformer m, loaded;
    Vocabulary v2;
    transformer_build(&m, &config, 5);
    const char *ckpt = test_path("bpe_special.ckpt");
    e = save_lab_checkpoint(ckpt, &m, &v, merges, "");
    const char *refused = e ? e : load_lab_model(ckpt, &loaded, &v2);
    check(!e && refused &&
          strstr(refused, "bpe_special.ckpt: merge 2 makes '<s>', a special token's text"),
          "checkpoint: merges that make '<s>' are refused (%s)", refused ? refused : "loaded");
    if (!refused) {
        transformer_free(&loaded);
        vocab_free(&v2);
    }
    transformer_free(&m);
    vocab_free(&v);
    bpe_free_merges(merges);
}

// Merges survive a checkpoint round trip; a damaged merges section is refused.
static void test_bpe_checkpoint(void) {
    TransformerConfig config = decode_config();
    Vocabulary v;
    Bpe *merges = NULL;
    vocab_init(&v);
    write_text(test_path("bpe.tsv"), "low\tlower\nnewest\twidest\nlow low\tnewest newest\n");
    int learned = 0;
    const char *e = bpe_learn_from_tsv(&merges, test_path("bpe.tsv"), 0, 1000, &learned);
    if (!e)
        vocab_add_subwords(&v, merges);
    config.vocab_size = v.size;
    Transformer m;
    transformer_build(&m, &config, 5);
    const char *path = test_path("bpe.ckpt");
    if (!e)
        e = save_lab_checkpoint(path, &m, &v, merges, "");
    LabCheckpoint c;
    if (!e)
        e = lab_checkpoint_load(path, &c);
    int same = !e && c.merges && same_merges(merges, c.merges) && c.vocab.size == v.size;
    char a[100], b[100];
    if (same) {
        encode_to_text(a, sizeof a, merges, "lowest");
        encode_to_text(b, sizeof b, c.merges, "lowest");
    }
    check(same && strcmp(a, b) == 0,
          "bpe: %d merges survive a checkpoint round trip and cut 'lowest' the same (%s)",
          learned, e ? e : a);
    if (!e)
        lab_checkpoint_free(&c);
    // a damaged merges section is refused: the run's merges_bytes one more (RunHeader's offset
    // 72, after the model's bytes, CheckpointHeader's offset 64)
    size_t size;
    unsigned char *good = read_file(path, &size);
    if (good) {
        uint64_t model_end;
        memcpy(&model_end, good + 64, 8);
        good[model_end + 72] += 1;
        write_file(test_path("bad_merges.ckpt"), good, size);
        e = lab_checkpoint_load(test_path("bad_merges.ckpt"), &c);
        check(e && strstr(e, "bad_merges.ckpt"),
              "checkpoint: a merges section of the wrong size is refused (%s)", e ? e : "accepted");
        if (!e)
            lab_checkpoint_free(&c);
        free(good);
    }
    transformer_free(&m);
    vocab_free(&v);
    bpe_free_merges(merges);
    test_bpe_never_makes_special_tokens();
}

// train --bpe, decode, eval, attention and the bpe command, as a user runs them.
static void test_bpe_command_line(void) {
    const char *tsv = test_path("cli_bpe.tsv"), *ckpt = test_path("cli_bpe.ckpt");
    write_text(tsv, "zwei drei\tdreiundzwei\nvier zwei\tzweiundvier\ndrei vier\tvierunddrei\n"
                    "zwei zwei\tzweiundzwei\n");
    check_cli_error("--bpe 0", "train: --bpe '0' is not valid; expected an integer from 1",
                    "train --train %s --bpe 0", tsv);
    check_cli_error("--bpe -2", "train: --bpe '-2' is not valid", "train --train %s --bpe -2", tsv);
    check_cli_error("--bpe with a built-in task", "--bpe goes with --train FILE",
                    "train --task copy --bpe 10");
    int status = run_cli("train --train %s --valid %s --bpe 1000 --steps 3 "
                         "--checkpoint %s " TINY_RUN, tsv, tsv, ckpt);
    check(status == 0 && strstr(cli_output, "bpe    stopped after") &&
          strstr(cli_output, "of the 1000 merges asked for"),
          "cli: train --bpe 1000 on 4 lines stops early and says so (exit %d)", status);
    status = run_cli("train --resume %s --steps 5 --log-every 0 --eval-every 0 --show 0", ckpt);
    check(status == 0 && strstr(cli_output, "resume"),
          "cli: a run on subwords resumes (its merges from the checkpoint) (exit %d)", status);
    status = run_cli("decode --checkpoint %s 'vier drei'", ckpt);
    check(status == 0 && !strstr(cli_output, "warning"),
          "cli: decode with merges: words of seen characters, no <unk> (exit %d)", status);
    status = run_cli("eval --checkpoint %s --data %s --bleu --show 1", ckpt, tsv);
    check(status == 0 && strstr(cli_output, "exact match") && strstr(cli_output, "(words)") &&
          strstr(cli_output, "(subwords)") && strstr(cli_output, "reference  dreiundzwei"),
          "cli: eval on subwords: exact match and BLEU on words, the examples as words (exit %d)",
          status);
    status = run_cli("attention --checkpoint %s --out-dir %s 'zwei vier'", ckpt,
                     test_path("bpe_pictures"));
    check(status == 0 && strstr(cli_output, "source subwords: zwei</w> vier</w>"),
          "cli: attention on subwords draws the pictures and names the subwords (exit %d)", status);
    status = run_cli("bpe --data %s --merges 3", tsv);
    check(status == 0 && strstr(cli_output, "# 3 merges learned from") &&
          strstr(cli_output, "\n     3  "),
          "cli: bpe --data --merges 3 prints 3 merges (exit %d)", status);
    status = run_cli("bpe --data %s --merges 1000", tsv);
    check(status == 0 && strstr(cli_output, "of 1000 asked for: no pair of symbols occurs twice"),
          "cli: bpe asked for more merges than there are stops early and says so (exit %d)",
          status);
    status = run_cli("bpe --checkpoint %s 'zweiundvier'", ckpt);
    check(status == 0 && strstr(cli_output, "</w>\n"),
          "cli: bpe --checkpoint cuts a sentence into subwords (exit %d)", status);
    char *as_argument = strdup(cli_output);
    write_text(test_path("bpe_bom.txt"), "\xEF\xBB\xBFzweiundvier\r\n");
    status = run_cli("bpe --checkpoint %s < %s", ckpt, test_path("bpe_bom.txt"));
    check(status == 0 && strcmp(cli_output, as_argument) == 0,
          "cli: bpe cuts a line of stdin as the same sentence given as an argument (byte-order "
          "mark, \\r\\n dropped)");
    free(as_argument);
    // white space beyond ASCII separates words at decode time too
    status = run_cli("bpe --checkpoint %s 'zwei vier'", ckpt);
    as_argument = strdup(cli_output);
    write_text(test_path("bpe_ideographic.txt"), "zwei\xe3\x80\x80vier\xc2\xa0\n");
    int ideographic = run_cli("bpe --checkpoint %s < %s", ckpt, test_path("bpe_ideographic.txt"));
    check(status == 0 && ideographic == 0 && strcmp(cli_output, as_argument) == 0,
          "cli: bpe cuts 'zwei<U+3000>vier<U+00A0>' as 'zwei vier': %s", cli_output);
    free(as_argument);
    check_cli_error("bpe of a directory on stdin",
                    "bpe: stdin: read error after 0 lines: Is a directory",
                    "bpe --checkpoint %s < /tmp", ckpt);
    check_cli_error("bpe without --merges", "--merges N is required with --data",
                    "bpe --data %s", tsv);
    check_cli_error("bpe with a word-level checkpoint", "the model has no merges",
                    "bpe --checkpoint %s 'a b'", test_path("tsv.ckpt"));
    // bytes that are not UTF-8, in training data and at decode time, are refused with their line
    // (one rule for every text input, issue 34; they were symbols of their own, as bpe_encode_word
    // still makes them)
    write_text(test_path("cli_bytes.tsv"), "a\xff b\tb \xfe" "a\na b\tb a\n\xc3 a\ta \xc3\n");
    check_cli_error("--bpe on training data holding a byte that is not UTF-8",
                    "cli_bytes.tsv:1: byte 2 of the line, 0xff, is not UTF-8; expected UTF-8 text",
                    "train --train %s --valid %s --bpe 20 --steps 2 --checkpoint %s " TINY_RUN,
                    test_path("cli_bytes.tsv"), test_path("cli_bytes.tsv"),
                    test_path("cli_bytes.ckpt"));
    check_cli_error("decode with subwords of a sentence holding bytes that are not UTF-8",
                    "decode: argument 1: byte 1 of the line, 0xfe, is not UTF-8",
                    "decode --checkpoint %s \"$(printf '\\376\\377 a')\"", ckpt);
    check_cli_error("bpe --data of a file holding a byte that is not UTF-8",
                    "bpe: " /* the file's path */, "bpe --data %s --merges 3",
                    test_path("cli_bytes.tsv"));
    check(strstr(cli_output, "cli_bytes.tsv:1: byte 2 of the line, 0xff, is not UTF-8") != NULL,
          "cli: ... naming the file, the line and the byte");
    check_cli_error("bpe of a sentence argument that is not UTF-8",
                    "bpe: argument 2: byte 3 of the line, 0xe9, is not UTF-8",
                    "bpe --checkpoint %s 'a b' \"$(printf 'ca\\351')\"", ckpt);
    write_text(test_path("cli_bytes_stdin.txt"), "a b\n\xc3\n");
    check_cli_error("bpe of a line of stdin that is not UTF-8",
                    "bpe: stdin:2: byte 1 of the line, 0xc3, is not UTF-8",
                    "bpe --checkpoint %s < %s", ckpt, test_path("cli_bytes_stdin.txt"));
    // words holding a special token's text train, and no subword is one: "<s>a" is not cut into <s>
    // and "a</w>"
    write_text(test_path("cli_special.tsv"),
               "<s>a x\t</s>b y\n<s>c x\t</s>d y\n<pad>e x\t<unk>f y\nx<pad> x\t<unk>h y\n");
    status = run_cli("train --train %s --valid %s --bpe 100 --steps 1 --checkpoint %s " TINY_RUN,
                     test_path("cli_special.tsv"), test_path("cli_special.tsv"),
                     test_path("cli_special.ckpt"));
    int special_trained = status == 0;
    status = run_cli("bpe --checkpoint %s '<s>a </s>b <pad>e x<pad> <unk>f'",
                     test_path("cli_special.ckpt"));
    check(special_trained && status == 0 && special_tokens_in(cli_output) == 0,
          "cli: train --bpe on words holding <s> </s> <pad> <unk>: no subword is a special token: "
          "%s", cli_output);
    write_text(test_path("cli_marker.tsv"), "a</w>\tb\n");
    check_cli_error("a training word holding </w>", "holds the end-of-word marker </w>",
                    "train --train %s --bpe 5", test_path("cli_marker.tsv"));
}

// A 3-step run of a tiny model on the numbers task, to `path`; `changes` are
// flags after the common ones (a later flag wins). Returns train's exit status.
static int train_tiny_numbers_run(const char *path, const char *dev, const char *changes) {
    return run_cli("train --train tiny_data/numbers_train.tsv --valid %s --bpe 20 --layers 1 "
                   "--d-model 8 --d-ff 16 --heads 2 --steps 3 --batch-tokens 200 --warmup 2 "
                   "--eval-every 0 --eval-size 1 --log-every 0 --show 0 --force --checkpoint %s %s",
                   dev, path, changes);
}

// make table3's pieces on a tiny budget, so that they cannot rot: variants
// named by what differs from the base, the table laid out as the paper's, the
// chart with a bar per run; the perplexity is exp of the unsmoothed loss.
static void test_table3(void) {
    // the perplexity's loss: with eps_ls = 0 the training loss is -log p(reference) itself
    TransformerConfig config = decode_config();
    config.label_smoothing = 0.0f;
    Transformer m;
    transformer_build(&m, &config, 8);
    Dataset pairs, held_out;
    memset(&pairs, 0, sizeof pairs);
    memset(&held_out, 0, sizeof held_out);
    task_generate(&pairs, &held_out, TASK_COPY, config.vocab_size - NUM_SPECIAL_TOKENS,
                  2, 6, 8, 1, 9);
    Evaluation e;
    HeldOutLoss losses;
    lab_evaluate(&e, &losses, &m, &pairs, 0, 100, 1, 0.6);
    check(fabs(losses.loss - losses.log_loss) <= 1e-5 * fabs(losses.loss),
          "table3: eval's -log p(reference) per token (%.9g) "
          "is the loss without label smoothing (%.9g), 8 pairs", losses.log_loss, losses.loss);
    evaluation_free(&e);
    dataset_free(&pairs);
    dataset_free(&held_out);
    transformer_free(&m);
    // naming: one change, several changes, another seed
    Table3Run base = { 0 }, run = { 0 };
    base.config = decode_config();
    base.seed = 1;
    run.config = base.config;
    run.seed = 1;
    run.config.n_heads = 2;
    run.config.d_ff = 99;
    table3_name_variant(&run, &base);
    int named = strcmp(run.row, "(A,C)") == 0 && strcmp(run.label, "h=2 d_ff=99") == 0;
    run.config = base.config;
    run.seed = 7;
    table3_name_variant(&run, &base);
    named &= strcmp(run.row, "base") == 0 && strcmp(run.label, "seed 7") == 0;
    run.config.positional = POSITIONAL_LEARNED;
    table3_name_variant(&run, &base);
    named &= strcmp(run.row, "(E)") == 0 && strcmp(run.label, "learned positions seed 7") == 0;
    char value[32];
    named &= stored_option("--train\na.tsv\n--seed\n42\n", "--seed", value, sizeof value) &&
             strcmp(value, "42") == 0 &&
             !stored_option("--train\na.tsv\n", "--seed", value, sizeof value);
    check(named, "table3: runs are named by what differs from the base: (A,C) h=2 d_ff=99, base "
                 "seed 7, (E)");
    // five runs of 3 steps on the numbers task, scored on 12 dev and 12 test pairs
    const char *dev = test_path("t3_dev.tsv"), *test = test_path("t3_test.tsv"),
               *svg = test_path("t3.svg");
    char text[4096] = "";
    for (int k = 0; k < 2; k++) {
        FILE *f = fopen(k ? "tiny_data/numbers_test.tsv" : "tiny_data/numbers_dev.tsv", "r");
        char line[256];
        text[0] = '\0';
        for (int i = 0; f && i < 12 && fgets(line, sizeof line, f); i++) strcat(text, line);
        if (f)
            fclose(f);
        write_text(k ? test : dev, text);
    }
    // (their own names: --force over another test's checkpoint is tested elsewhere)
    const char *runs[5][2] = { { "t3_base", "" }, { "t3_seed2", "--seed 2" },
                               { "t3_h1", "--heads 1" }, { "t3_drop0", "--dropout 0" },
                               { "t3_learned", "--positional learned" } };
    char paths[5][600], list[3200] = "";
    int trained = 0;
    for (int r = 0; r < 5; r++) {
        snprintf(paths[r], sizeof paths[r], "%s", test_path(runs[r][0]));
        strcat(paths[r], ".ckpt");
        trained += train_tiny_numbers_run(paths[r], dev, runs[r][1]) == 0;
        snprintf(list + strlen(list), sizeof list - strlen(list), " %s", paths[r]);
    }
    int status = run_cli("table3 --dev %s --test %s --svg %s%s", dev, test, svg, list);
    size_t n = 0;
    unsigned char *picture = read_file(svg, &n);
    int bars = 0;
    for (const char *p = picture ? (const char *)picture : ""; (p = strstr(p, "class=\"bar\""));
         p++)
        bars++;
    int ok = trained == 5 && status == 0 && strstr(cli_output, "5 runs of 3 steps each") &&
             strstr(cli_output, "PPL(dev) BLEU(dev) exact(test)") &&
             strstr(cli_output, "base   seed 1") && strstr(cli_output, "       seed 2") &&
             strstr(cli_output, "(A)    h=1") && strstr(cli_output, "(D)    P_drop=0") &&
             strstr(cli_output, "(E)    learned positions") &&
             strstr(cli_output, "base over 2 seeds") && picture &&
             strstr((char *)picture, "Table 3 on a laptop") && bars == 5 &&
             strstr((char *)picture, "</svg>");
    check(ok,
          "table3: 5 runs of 3 steps trained (%d), scored in a table with rows base, (A), (D), "
          "(E), and a chart of %d bars (exit %d)%s%s",
          trained, bars, status, ok ? "" : "\n", ok ? "" : cli_output);
    free(picture);
    // another budget, no checkpoints, no --dev
    char other[600];
    snprintf(other, sizeof other, "%s", test_path("longer.ckpt"));
    train_tiny_numbers_run(other, dev, "--steps 4");
    check_cli_error("table3 of runs with different budgets",
                    "longer.ckpt: trained 4 steps, the base",
                    "table3 --dev %s --test %s %s %s", dev, test, paths[0], other);
    snprintf(other, sizeof other, "%s", test_path("other_merges.ckpt"));
    train_tiny_numbers_run(other, dev, "--bpe 30");
    check_cli_error("table3 of runs with other merges", "other_merges.ckpt: its vocabulary cuts",
                    "table3 --dev %s --test %s %s %s", dev, test, paths[0], other);
    snprintf(other, sizeof other, "%s", test_path("other_lr.ckpt"));
    train_tiny_numbers_run(other, dev, "--lr 0.001");
    check_cli_error("table3 of runs with another schedule",
                    "other_lr.ckpt: its --lr differs from the base",
                    "table3 --dev %s --test %s %s %s", dev, test, paths[0], other);
    // average: a sinusoid and a learned-position checkpoint are not one run
    check_cli_error("average of sinusoid and learned positions",
                    "positions learned, not sinusoid as in", "average --out %s %s %s",
                    test_path("mixed_avg.ckpt"), paths[0], paths[4]);
    status = run_cli("average --out %s %s %s", test_path("learned_avg.ckpt"), paths[4], paths[4]);
    if (status == 0)
        status = run_cli("eval --checkpoint %s --data %s", test_path("learned_avg.ckpt"), dev);
    check(status == 0 && strstr(cli_output, "perplexity"),
          "cli: average of learned-position checkpoints, then eval (exit %d)", status);
    check_cli_error("table3 without checkpoints", "table3: no checkpoints given",
                    "table3 --dev %s --test %s", dev, test);
    check_cli_error("table3 without --dev", "table3: --dev FILE.tsv is required",
                    "table3 --test %s %s", test, paths[0]);
}


// ./transformer reads what transformer.c alone (TRANSFORMER_MINIMAL_BIN)
// writes: it decodes and evaluates with its checkpoint, and lists its own
// commands after transformer.c's.
static void test_lab_reads_minimal_checkpoints(void) {
    const char *minimal = getenv("TRANSFORMER_MINIMAL_BIN"), *lab_binary = cli_binary;
    if (!minimal || !*minimal)
        minimal = "./transformer_minimal";
    if (access(minimal, X_OK) != 0) {
        check(0, "minimal: %s is not there (make minimal)", minimal);
        return;
    }
    const char *tsv = test_path("minimal.tsv"), *ckpt = test_path("minimal.ckpt");
    write_text(tsv, "1 2\t1 2\n3 4 5\t3 4 5\n0 0\t0 0\n");
    cli_binary = minimal;
    int trained = run_cli("train --task copy --steps 3 --checkpoint %s " TINY_MINIMAL_RUN, ckpt);
    cli_binary = lab_binary;
    int decoded = run_cli("decode --checkpoint %s --beam 2 '1 2'", ckpt);
    int one_line = count_lines_starting(cli_output, "") == 1 && !strstr(cli_output, "error");
    int evaluated = run_cli("eval --checkpoint %s --data %s --bleu", ckpt, tsv);
    int scored = strstr(cli_output, "BLEU") != NULL;
    int help = run_cli("--help");
    const char *lab_commands[] = { "bleu", "average", "attention", "pe", "plot", "bpe", "params",
                                   "table3", "bench" };
    int listed = strstr(cli_output, "train") && strstr(cli_output, "decode") &&
                 strstr(cli_output, "eval");
    for (size_t i = 0; i < sizeof lab_commands / sizeof *lab_commands; i++) {
        char line[32];
        snprintf(line, sizeof line, "\n  %s ", lab_commands[i]);
        listed &= strstr(cli_output, line) != NULL;
    }
    check(trained == 0 && decoded == 0 && one_line && evaluated == 0 && scored && help == 0 &&
          listed,
          "lab: %s decodes (beam 2) and evaluates (--bleu) with a checkpoint of transformer.c "
          "alone (exit %d, %d, %d) and lists train, decode, eval and the lab's 9 commands",
          cli_binary, trained, decoded, evaluated);
}

// ---- checkpoints: transformer.c's model, then the run; version 3 --------------------

// Two checkpoints the lab read hold the same model and run, bit for bit: config, parameters,
// Adam's moments and step, the dropout generator, the run's numbers and options, vocabulary and
// merges.
static int same_checkpoint(const LabCheckpoint *a, const LabCheckpoint *b) {
    const Transformer *ma = &a->model;
    const Transformer *mb = &b->model;
    size_t bytes = ma->num_parameters * sizeof(real);
    int same = memcmp(&ma->config, &mb->config, sizeof ma->config) == 0 &&
               ma->num_parameters == mb->num_parameters &&
               memcmp(ma->params_memory, mb->params_memory, bytes) == 0 &&
               memcmp(ma->adam_m, mb->adam_m, bytes) == 0 &&
               memcmp(ma->adam_v, mb->adam_v, bytes) == 0 && ma->adam_step == mb->adam_step &&
               ma->dropout_rng.state == mb->dropout_rng.state &&
               a->run.saved == b->run.saved && a->run.epoch_rng == b->run.epoch_rng &&
               a->run.epoch == b->run.epoch && a->run.epoch_batches == b->run.epoch_batches &&
               a->run.data_hash == b->run.data_hash &&
               strcmp(a->run.options, b->run.options) == 0 &&
               a->vocab.size == b->vocab.size && same_merges(a->merges, b->merges);
    for (int id = 0; same && id < a->vocab.size; id++)
        same = strcmp(a->vocab.words[id], b->vocab.words[id]) == 0;
    return same;
}

// The checkpoints of format version 3 that ./transformer wrote until 2026-12-06 (tiny_data/v3/,
// written by 3aec3f6's ./transformer: the copy task and the numbers task on §5.1 subwords, at
// steps 20 and 40 of one run each): each reads whole and writes as version 4 without a bit
// changed; decode, eval and average read it; train --resume from step 20 goes on to step 40 where
// the old program's run went (the same data, epoch and generators; the same weights but for the
// rounding of another machine's products); transformer.c alone refuses it by name.
static void test_version_3_checkpoints(void) {
    const char *files[4] = { "tiny_data/v3/copy_step20.ckpt", "tiny_data/v3/copy_step40.ckpt",
                             "tiny_data/v3/numbers_bpe_step20.ckpt",
                             "tiny_data/v3/numbers_bpe_step40.ckpt" };
    const char *v4 = test_path("v3_as_v4.ckpt");
    for (int i = 0; i < 4; i++) {
        LabCheckpoint old, now;
        const char *e = lab_checkpoint_load(files[i], &old);
        int as_written = !e && old.run.saved && old.run.options[0] && old.model.adam_step ==
                         (i % 2 ? 40 : 20) && (old.merges != NULL) == (i >= 2);
        if (!e)
            e = lab_checkpoint_save(v4, &old.model, &old.vocab, old.merges, &old.run);
        if (!e)
            e = lab_checkpoint_load(v4, &now);
        size_t size = 0;
        unsigned char *bytes = read_file(v4, &size);
        int version_4 = bytes && size > 8 && bytes[4] == 4;
        free(bytes);
        check(!e && as_written && version_4 && same_checkpoint(&old, &now),
              "version 3: %s reads (step %ld%s) and writes as version 4 with the same model, "
              "moments and run, bit for bit (%s)", files[i], e ? 0 : old.model.adam_step,
              i >= 2 ? ", §5.1 merges" : "", e ? e : "the same");
        if (!e) {
            lab_checkpoint_free(&old);
            lab_checkpoint_free(&now);
        }
    }

    // decode, eval and average, as a user runs them: the version-3 file and its version-4 copy
    // (average of one) give the same lines
    const char *copy = test_path("v3_average.ckpt");
    int averaged = run_cli("average --out %s %s", copy, files[3]);
    static char first[1 << 16];
    const char *commands[2] = { "decode --checkpoint %s --beam 4 'eighty two' 'six thousand one'",
                                "eval --checkpoint %s --data tiny_data/numbers_test.tsv --bleu" };
    int same_lines = 1;
    for (int c = 0; c < 2; c++) {
        int a = run_cli(commands[c], files[3]);
        snprintf(first, sizeof first, "%s", cli_output);
        int b = run_cli(commands[c], copy);
        same_lines &= a == 0 && b == 0 && strcmp(first, cli_output) == 0;
    }
    check(averaged == 0 && same_lines,
          "version 3: decode (beam 4) and eval --bleu read %s, and print what they print with its "
          "version-4 copy that average wrote (exit %d)", files[3], averaged);

    // resume from step 20 to step 40, on the task and on the TSV file with subwords
    for (int k = 0; k < 2; k++) {
        const char *resumed = test_path("v3_resumed.ckpt");
        remove(resumed);
        int status = run_cli("train --resume %s --steps 40 --checkpoint %s --threads 1",
                             files[2 * k], resumed);
        LabCheckpoint went, old;
        const char *e = status == 0 ? lab_checkpoint_load(resumed, &went) : "train failed";
        const char *e_old = e ? e : lab_checkpoint_load(files[2 * k + 1], &old);
        double largest = INFINITY;
        int same_run = 0;
        if (!e && !e_old) {
            largest = 0;
            for (size_t j = 0; j < went.model.num_parameters; j++) {
                double d = fabs((double)went.model.params_memory[j] -
                                (double)old.model.params_memory[j]);
                largest = d > largest ? d : largest;
            }
            same_run = went.model.adam_step == 40 && went.run.epoch == old.run.epoch &&
                       went.run.epoch_batches == old.run.epoch_batches &&
                       went.run.epoch_rng == old.run.epoch_rng &&
                       went.run.data_hash == old.run.data_hash &&
                       went.model.dropout_rng.state == old.model.dropout_rng.state &&
                       strcmp(went.run.options, old.run.options) == 0 &&
                       same_merges(went.merges, old.merges) && went.vocab.size == old.vocab.size;
            lab_checkpoint_free(&old);
        }
        if (!e)
            lab_checkpoint_free(&went);
        check(status == 0 && same_run && largest < 1e-2,
              "version 3: train --resume %s --steps 40 goes on where the version-3 run went: step "
              "40, the same epoch, batch, generators, data and options, weights within %.1e of "
              "its step-40 file (exit %d; %s)", files[2 * k], largest, status,
              e ? e : e_old ? e_old : "read");
    }

    // transformer.c alone reads version 4 only, and says where version 3 is read
    const char *lab_binary = cli_binary;
    const char *minimal = getenv("TRANSFORMER_MINIMAL_BIN");
    cli_binary = minimal && *minimal ? minimal : "./transformer_minimal";
    check_cli_error("transformer.c alone on a version-3 checkpoint",
                    "copy_step40.ckpt: checkpoint format version 3; transformer.c reads version 4 "
                    "(make's ./transformer reads version 3 too)",
                    "decode --checkpoint %s '1 2'", files[1]);
    cli_binary = lab_binary;
}

// The run after the model: damage refused with one line (truncated, bytes too many, a changed
// byte); transformer.c alone decodes the model of a ./transformer checkpoint of whole words as
// ./transformer does, and refuses one of §5.1 subwords; a checkpoint that transformer.c alone
// wrote (no run) decodes here, and is refused by --resume.
static void test_checkpoint_run_part(void) {
    const char *ckpt = test_path("run_part.ckpt");
    const char *bad = test_path("run_bad.ckpt");
    int trained = run_cli("train --task copy --steps 4 --checkpoint %s " TINY_RUN, ckpt);
    size_t size = 0;
    unsigned char *good = read_file(ckpt, &size);
    if (trained != 0 || !good) {
        check(0, "run part: a checkpoint to damage (exit %d)", trained);
        free(good);
        return;
    }
    write_file(bad, good, size - 10);
    check_cli_error("a run cut short", "run_bad.ckpt: truncated", "decode --checkpoint %s '1 2'",
                    bad);
    unsigned char *longer = checked_calloc(size + 16, 1, "test");
    memcpy(longer, good, size);
    write_file(bad, longer, size + 16);
    free(longer);
    check_cli_error("16 bytes after the run", "run_bad.ckpt: the run after the model takes",
                    "decode --checkpoint %s '1 2'", bad);
    good[size - 20] ^= 1;   // in Adam's second moments
    write_file(bad, good, size);
    good[size - 20] ^= 1;
    check_cli_error("a byte of the run changed",
                    "run_bad.ckpt: checksum mismatch in the run after the model",
                    "decode --checkpoint %s '1 2'", bad);
    free(good);

    // transformer.c alone and ./transformer decode the same model the same way
    const char *lab_binary = cli_binary;
    const char *minimal = getenv("TRANSFORMER_MINIMAL_BIN");
    int lab_status = run_cli("decode --checkpoint %s --beam 3 '1 2 3' '4 4'", ckpt);
    static char lab_lines[1 << 16];
    snprintf(lab_lines, sizeof lab_lines, "%s", cli_output);
    cli_binary = minimal && *minimal ? minimal : "./transformer_minimal";
    int minimal_status = run_cli("decode --checkpoint %s --beam 3 '1 2 3' '4 4'", ckpt);
    check(lab_status == 0 && minimal_status == 0 && strcmp(lab_lines, cli_output) == 0,
          "run part: transformer.c alone reads the model of a ./transformer checkpoint, its run "
          "left be, and decodes as ./transformer does ('%.40s'; exit %d, %d)", cli_output,
          lab_status, minimal_status);
    const char *subwords = test_path("run_bpe.ckpt");
    cli_binary = lab_binary;
    int bpe = run_cli("train --train tiny_data/numbers_dev.tsv --bpe 30 --steps 2 --checkpoint "
                      "%s " TINY_RUN, subwords);
    cli_binary = minimal && *minimal ? minimal : "./transformer_minimal";
    check_cli_error("transformer.c alone on a model of §5.1 subwords",
                    "run_bpe.ckpt: its tokens are §5.1 subwords, which transformer.c alone does "
                    "not cut text into", "decode --checkpoint %s 'one'", subwords);
    const char *no_run = test_path("no_run.ckpt");
    int toy = run_cli("train --task copy --steps 2 --checkpoint %s " TINY_MINIMAL_RUN, no_run);
    cli_binary = lab_binary;
    int decoded = run_cli("decode --checkpoint %s '1 2'", no_run);
    check(bpe == 0 && toy == 0 && decoded == 0,
          "run part: ./transformer decodes a checkpoint of transformer.c alone, with no run (exit "
          "%d, %d, %d)", bpe, toy, decoded);
    check_cli_error("--resume from a checkpoint with no run",
                    "no_run.ckpt: the checkpoint holds no run options (transformer.c alone wrote "
                    "it)", "train --resume %s --steps 4", no_run);
}

// Greedy decoding as a beam of one (transformer.c) chooses the tokens of the lab's greedy
// decoding of a batch side by side (transformer.c's until 2026-12-06): a trained and an untrained
// model, 24 sources of 1 to 8 words, with transformer.c's loops and with the fast path's products
// and key/value cache.
static void test_greedy_as_beam_of_one(void) {
    TransformerConfig config = decode_config();
    Transformer untrained;
    transformer_build(&untrained, &config, 21);
    Transformer *models[2] = { trained_copy_model(), &untrained };
    Rng rng;
    rng_seed(&rng, 44);
    int B = 24, S = 9, agree = 0, cases = 0, ended = 0;
    int src[24 * 9] = { 0 }, src_len[24], out[24 * 20], out_len[24];
    for (int b = 0; b < B; b++) {
        src_len[b] = 2 + b % 8;
        random_source(src + b * S, src_len[b], config.vocab_size, &rng);
    }
    for (int fast = 0; fast < 2; fast++) {
        fast_path_use(fast);
        for (int k = 0; k < 2; k++) {
            lab_greedy_decode(models[k], out, out_len, 20, src, src_len, B, S);
            for (int b = 0; b < B; b++) {
                int beam[20];
                int n = transformer_beam_search(models[k], beam, NULL, src + b * S, src_len[b], 1,
                                                0.6);
                agree += n == out_len[b] && memcmp(beam, out + b * 20, n * sizeof(int)) == 0;
                ended += k == 0 && n < transformer_decode_limit(models[k], src_len[b]);
                cases++;
            }
        }
    }
    fast_path_use(1);
    check(agree == cases && ended == 2 * B,
          "decode: greedy decoding as beam search with one beam gives the tokens of the batched "
          "greedy decoder, sentence for sentence: %d of %d (a trained and an untrained model, "
          "Part I's loops and the fast path; the trained model's %d outputs end with </s>)",
          agree, cases, ended / 2);
    transformer_free(&untrained);
}

// ---- the busy machine: --threads 0 ---------------------------------------------------

#ifdef _OPENMP
// The CPU seconds that processes pid[0..count-1] have run (Linux's
// /proc/PID/stat, utime and stime); -1 if one cannot be read.
static double processes_cpu_seconds(const pid_t *pid, int count) {
    double ticks = 0;
    for (int i = 0; i < count; i++) {
        char path[64], line[1024];
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid[i]);
        FILE *f = fopen(path, "r");
        if (!f)
            return -1;
        const char *fields = fgets(line, sizeof line, f) ? strrchr(line, ')')
                                                         : NULL;   // after "pid (name)"
        unsigned long user, system;
        int read = fields &&
                   sscanf(fields + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
                          &user, &system) == 2;
        fclose(f);
        if (!read)
            return -1;
        ticks += (double)user + (double)system;
    }
    return ticks / (double)sysconf(_SC_CLK_TCK);
}
#endif

// Training follows the cores that other programs leave free (--threads 0).
// By hand: /proc/stat's lines give the busy ticks ("cpu": user + nice +
// system + irq + softirq) and the cores ("cpuN"); the others' cores are the
// machine's busy time less ours over the wall time; a core counts as busy
// above a quarter; the count changes when two looks agree, drops at once and
// grows one thread a change; --threads N is not followed. Then, on Linux,
// beside as many busy processes as the machine has cores, one thread, and
// the others' cores read as at least what those processes ran (their own
// CPU time: a virtual machine's host may give them less than they ask for).
static void test_free_cores(void) {
    double busy_ticks = -1;
    int cpus = 0;
    const char *stat_lines[] = { "cpu  100 20 30 900 7 4 6 0 0 0\n",
                                 "cpu0 50 10 15 450 3 2 3 0 0 0\n",
                                 "cpu1 50 10 15 450 4 2 3 0 0 0\n", "ctxt 1234\n",
                                 "procs_running 3\n" };
    for (size_t i = 0; i < sizeof stat_lines / sizeof *stat_lines; i++)
        proc_stat_line(stat_lines[i], &busy_ticks, &cpus);
    CpuTimes then = { .machine = 10, .own = 1, .wall = 100 },
             now = { .machine = 12.5, .own = 2, .wall = 101 };
    double others = others_busy_cores(&then, &now);
    FreeCores two = { .following = 1, .cores = 2, .limit = 2 },
              eight = { .following = 1, .cores = 8, .limit = 4 };
    check(busy_ticks == 160 && cpus == 2 && fabs(others - 1.5) < 1e-12 &&
          free_cores_wanted(&two, 0.2) == 2 && free_cores_wanted(&two, 0.3) == 1 &&
          free_cores_wanted(&two, 3.0) == 1 && free_cores_wanted(&eight, 1) == 4 &&
          free_cores_wanted(&eight, 6) == 2,
          "free cores: /proc/stat gives 160 busy ticks of 2 cores; others kept %.2f cores busy "
          "(1.5); the thread counts for 0.2, 0.3, 3 of 2 cores and 1, 6 of 8 (limit 4)", others);
    FreeCores follow = { .following = 1, .cores = 8, .limit = 8, .threads = 8, .proposed = 8 };
    int first = free_cores_decide(&follow, 1), second = free_cores_decide(&follow, 1),
        dropped_to = follow.threads;
    int grew = free_cores_decide(&follow, 4) == 0;             // the first look that wants 4
    for (int expected = 2; expected <= 4; expected++)
        grew &= free_cores_decide(&follow, 4) && follow.threads == expected;
    grew &= free_cores_decide(&follow, 4) == 0;                // there: nothing to change
    check(!first && second && dropped_to == 1 && grew,
          "free cores: the count drops to 1 at the second look that wants it, then grows 2, 3, 4, "
          "one a look");
#ifdef _OPENMP
    int cores = omp_get_num_procs(), threads_before = omp_get_max_threads();
    FreeCores fixed;
    free_cores_start(&fixed, 2);
    check(!fixed.following && !free_cores_follow(&fixed),
          "free cores: --threads 2 is not followed");
    CpuTimes reading;
    if (!cpu_times(&reading) || reading.cpus > cores || cores > 16 || cores < 2) {
        printf("skip free cores beside busy processes: /proc/stat cannot tell this program's share "
               "of %d cores (or more than 16)\n", cores);
        omp_set_num_threads(threads_before);
        return;
    }
    signal(SIGCHLD, SIG_IGN);   // the neighbours end without being waited for
    pid_t busy[16] = { 0 };
    int started = 0;
    for (; started < cores; started++) {
        if ((busy[started] = fork()) == 0) {   // a busy neighbour, ended by the kill below
                                               // (or in 10 s)
            alarm(10);
            for (volatile unsigned spin = 0;; spin++) {}
        }
        if (busy[started] < 0)
            break;
    }
    nanosleep(&(struct timespec){ 0, 50000000 }, NULL);    // 50 ms: the neighbours are running
    cpu_times(&then);
    double ran_before = processes_cpu_seconds(busy, started);
    nanosleep(&(struct timespec){ 0, 300000000 }, NULL);   // 300 ms of them
    double ran_after = processes_cpu_seconds(busy, started);
    cpu_times(&now);
    for (int i = 0; i < started; i++)
        kill(busy[i], SIGKILL);
    nanosleep(&(struct timespec){ 0, 20000000 }, NULL);
    signal(SIGCHLD, SIG_DFL);
    FreeCores live = { .following = 1, .cores = cores, .limit = cores };
    others = others_busy_cores(&then, &now);
    if (ran_before < 0 || ran_after < 0) {
        printf("skip free cores beside busy processes: their /proc/PID/stat cannot be read\n");
        omp_set_num_threads(threads_before);
        return;
    }
    double ran = (ran_after - ran_before) /
                 (now.wall - then.wall);   // the cores the neighbours got
    // The reading counts at least what the neighbours ran (and any other
    // program's load). It reads the machine as busy, and wants 1 thread,
    // unless a virtual machine's host held the cores back from them.
    int busy_read = others > cores - 0.5;
    check(started == cores && others > ran - 0.3 &&
          (busy_read ? free_cores_wanted(&live, others) == 1 : ran < cores - 0.5),
          "free cores: beside %d busy processes on %d cores, which ran %.2f cores, others kept "
          "%.2f cores busy%s", started, cores, ran, others,
          busy_read ? ": 1 thread"
                    : " (the host held the cores back from them: the thread count is not tested)");
    omp_set_num_threads(threads_before);
#endif
}


// ---- params: the parameter count by component --------------------------------------

// The components params prints (parameter_group_count) add up to the
// paper's count by hand (test_transformer.c's parameters_by_hand), as
// transformer.c's parameter_sizes does (test_parameter_counts).
static void test_parameter_groups(void) {
    for (int i = 0; i < COUNTED_MODELS; i++) {
        TransformerConfig c = counted_model(i);
        size_t by_hand = parameters_by_hand(&c), sizes[NUM_PARAMETER_TENSORS], groups = 0,
               learned_groups = 0;
        parameter_sizes(sizes, &c);
        for (int g = 0; g < NUM_PARAMETER_GROUPS; g++) groups += parameter_group_count(sizes, g);
        c.positional = POSITIONAL_LEARNED;
        c.max_len = 100;
        parameter_sizes(sizes, &c);
        for (int g = 0; g < NUM_PARAMETER_GROUPS; g++)
            learned_groups += parameter_group_count(sizes, g);
        check(groups == by_hand && learned_groups == by_hand + 100 * (size_t)c.d_model,
              "params: N=%d d_model=%d d_ff=%d vocab %d: the components add up to %zu, as by hand, "
              "and with learned positions (max_len 100) to %zu more",
              c.n_layers, c.d_model, c.d_ff, c.vocab_size, by_hand, 100 * (size_t)c.d_model);
    }
}

// --batch-log (dev/pytorch_translate.py trains on it): every step's batch as
// int32 numbers, step, B, S, T, then src, src_len, tgt_in, tgt_out, tgt_len.
// Each batch must hold its step's number, fit --batch-tokens, and read as
// train builds batches: a source ending in </s>, a target shifted by one
// (tgt_in = <s> y, tgt_out = y </s>), padding past the lengths.
static void test_batch_log(void) {
    const char *ckpt = test_path("batch_log.ckpt");
    const char *log = test_path("batches.bin");
    int status = run_cli("train --task copy --steps 4 --checkpoint %s --batch-log %s "
                         "--force " TINY_RUN, ckpt, log);
    size_t size = 0;
    unsigned char *bytes = read_file(log, &size);
    size_t count = size / sizeof(int32_t);
    int32_t *numbers = checked_calloc(count + 1, sizeof(int32_t), "batch log");
    if (bytes)
        memcpy(numbers, bytes, count * sizeof(int32_t));
    int steps = 0;
    int well_formed = status == 0 && bytes && size % sizeof(int32_t) == 0;
    size_t at = 0;
    while (well_formed && at + 4 <= count) {
        int step = numbers[at];
        int B = numbers[at + 1];
        int S = numbers[at + 2];
        int T = numbers[at + 3];
        at += 4;
        size_t need = (size_t)B * S + B + 2 * (size_t)B * T + B;
        if (step != steps + 1 || B < 1 || S < 1 || T < 1 || B * (S + T) > 80 || at + need > count) {
            well_formed = 0;
            break;
        }
        const int32_t *src = numbers + at;
        const int32_t *src_len = src + (size_t)B * S;
        const int32_t *tgt_in = src_len + B;
        const int32_t *tgt_out = tgt_in + (size_t)B * T;
        const int32_t *tgt_len = tgt_out + (size_t)B * T;
        for (int b = 0; b < B && well_formed; b++) {
            int n = src_len[b];
            int m = tgt_len[b];
            well_formed = n >= 1 && n <= S && m >= 1 && m <= T && src[b * S + n - 1] == TOKEN_EOS &&
                          tgt_in[b * T] == TOKEN_BOS && tgt_out[b * T + m - 1] == TOKEN_EOS;
            for (int t = 1; t < m && well_formed; t++)
                well_formed = tgt_in[b * T + t] == tgt_out[b * T + t - 1];
            for (int s = n; s < S && well_formed; s++) well_formed = src[b * S + s] == TOKEN_PAD;
        }
        at += need;
        steps++;
    }
    check(well_formed && steps == 4 && at == count,
          "cli: train --batch-log writes each of the 4 steps' batches (step, B, S, T, then the "
          "ids), as train builds them (%d read, %zu of %zu numbers)", steps, at, count);
    free(bytes);
    free(numbers);
}

// ============================================================================
// No empty translation (transformer.c, §6.1 decoding: fairseq's min_len 1)
// ============================================================================

// A model made to end at once: the last decoder layer's norm gives every
// position the output 1 (its gain 0, its bias 1), and the </s> row of the
// shared embedding is 1 too, so </s> has the largest logit, C, at every step.
// Both decoders must still give a source of words one token (the most likely
// other one), then end; a source of </s> alone may still end at once.
static void test_no_empty_translation(void) {
    TransformerConfig config = decode_config();
    Transformer m;
    transformer_build(&m, &config, 5);
    int C = config.d_model;
    int V = config.vocab_size;
    real *gain = m.params.dec_ln3_g + (size_t)(config.n_layers - 1) * C;
    real *bias = m.params.dec_ln3_b + (size_t)(config.n_layers - 1) * C;
    for (int c = 0; c < C; c++) {
        gain[c] = 0;
        bias[c] = 1;
        m.params.embedding[(size_t)TOKEN_EOS * C + c] = 1;
    }
    int src[4] = { 4, 7, 5, TOKEN_EOS };
    int S = 4;
    int T = 1;
    int tgt_in[1] = { TOKEN_BOS };
    int tgt_out[1] = { TOKEN_EOS };
    Batch batch = { 1, S, T, src, &S, tgt_in, tgt_out, &T };
    m.training = 0;
    transformer_forward(&m, &batch);
    int most_likely = greedy_token(m.acts.logits, V, 1);
    int most_likely_word = greedy_token(m.acts.logits, V, 0);
    check(most_likely == TOKEN_EOS,
          "no empty translation: the model's most likely first token is </s> (%d)", most_likely);
    int greedy[20];
    int greedy_len = 0;
    lab_greedy_decode(&m, greedy, &greedy_len, 20, src, &S, 1, S);
    int beam[20];
    int beam_len = transformer_beam_search(&m, beam, NULL, src, S, 4, 0.6);
    check(greedy_len == 1 && greedy[0] == most_likely_word && beam_len == 1 &&
          beam[0] == most_likely_word,
          "no empty translation: greedy and beam 4 (alpha 0.6) both give a source of words one "
          "token, the most likely after </s> (%d), then end (greedy %d tokens, beam %d)",
          most_likely_word, greedy_len, beam_len);
    int empty_source[1] = { TOKEN_EOS };
    int one = 1;
    lab_greedy_decode(&m, greedy, &greedy_len, 20, empty_source, &one, 1, 1);
    beam_len = transformer_beam_search(&m, beam, NULL, empty_source, 1, 4, 0.6);
    check(greedy_len == 0 && beam_len == 0,
          "no empty translation: an empty source (</s> alone) may still end at "
          "once (greedy %d tokens, beam %d)", greedy_len, beam_len);
    transformer_free(&m);
}

// ============================================================================
// Message catalogs (lab/catalogs.c): .mo files built here, never the machine's
// ============================================================================

// One message of a catalog to build: the original and its translation, of
// the given lengths (0: strlen; a plural's or a context's bytes need theirs).
typedef struct {
    const char *original;
    size_t original_length;
    const char *translation;
    size_t translation_length;
} MoEntry;

static void mo_put_word(unsigned char *p, uint32_t value, int big_endian) {
    for (int i = 0; i < 4; i++) {
        int shift = big_endian ? 24 - 8 * i : 8 * i;
        p[i] = (unsigned char)(value >> shift);
    }
}

// A .mo catalog of the entries as GNU msgfmt lays it out (the header, the
// table of originals, the table of translations, then the strings, each with
// its zero byte), in either byte order. A new buffer; *size: its bytes.
static unsigned char *mo_build(const MoEntry *entries, int n, int big_endian, uint32_t revision,
                               size_t *size) {
    size_t strings = 0;
    for (int i = 0; i < n; i++) {
        size_t lo = entries[i].original_length ? entries[i].original_length
                                               : strlen(entries[i].original);
        size_t lt = entries[i].translation_length ? entries[i].translation_length
                                                  : strlen(entries[i].translation);
        strings += lo + lt + 2;
    }
    size_t originals = MO_HEADER_BYTES;
    size_t translations = originals + 8 * (size_t)n;
    size_t at = translations + 8 * (size_t)n;
    *size = at + strings;
    unsigned char *data = checked_calloc(*size, 1, "test catalog");
    mo_put_word(data, MO_MAGIC, big_endian);
    mo_put_word(data + 4, revision, big_endian);
    mo_put_word(data + 8, (uint32_t)n, big_endian);
    mo_put_word(data + 12, (uint32_t)originals, big_endian);
    mo_put_word(data + 16, (uint32_t)translations, big_endian);
    for (int i = 0; i < n; i++) {
        for (int side = 0; side < 2; side++) {
            const char *text = side ? entries[i].translation : entries[i].original;
            size_t length = side ? entries[i].translation_length : entries[i].original_length;
            if (length == 0)
                length = strlen(text);
            unsigned char *entry = data + (side ? translations : originals) + 8 * (size_t)i;
            mo_put_word(entry, (uint32_t)length, big_endian);
            mo_put_word(entry + 4, (uint32_t)at, big_endian);
            memcpy(data + at, text, length);
            at += length + 1;
        }
    }
    return data;
}

static void mo_write(const char *path, const MoEntry *entries, int n, int big_endian) {
    size_t size = 0;
    unsigned char *data = mo_build(entries, n, big_endian, 0, &size);
    write_file(path, data, size);
    free(data);
}

// The pair the reader kept with this English sentence, or NULL.
static const CatalogPair *kept_pair(const CatalogReader *reader, const char *source) {
    for (int i = 0; i < reader->count; i++)
        if (strcmp(reader->pairs[i].source, source) == 0)
            return &reader->pairs[i];
    return NULL;
}

// The header entry, a plain message, one with a context, one that is only a
// context, a plural: the same pairs from both byte orders and both revisions.
static void test_catalog_format(void) {
    const char plural[] = "one file was removed\0many files were removed";
    const char plural_de[] = "eine Datei wurde entfernt\0viele Dateien wurden entfernt";
    MoEntry entries[] = {
        { "", 0, "Content-Type: text/plain; charset=UTF-8\nLanguage: de\n", 0 },
        { "the file is open", 0, "die Datei ist offen", 0 },
        { "menu\x04" "open the file now", 0, "die Datei jetzt \xc3\xb6" "ffnen", 0 },
        { "menu\x04", 0, "Men\xc3\xbc", 0 },
        { plural, sizeof plural - 1, plural_de, sizeof plural_de - 1 },
    };
    int n = (int)(sizeof entries / sizeof *entries);
    for (int variant = 0; variant < 4; variant++) {
        int big_endian = variant & 1;
        uint32_t revision = variant & 2 ? 1 : 0;
        size_t size = 0;
        unsigned char *data = mo_build(entries, n, big_endian, revision, &size);
        CatalogReader reader;
        catalog_reader_init(&reader, 3, 25);
        const char *error = catalog_read_bytes(&reader, data, size, "test");
        const CatalogPair *plain = kept_pair(&reader, "the file is open");
        const CatalogPair *context = kept_pair(&reader, "open the file now");
        int ok = !error && reader.count == 2 && reader.messages == 4 && plain && context &&
                 strcmp(plain->target, "die Datei ist offen") == 0 &&
                 strcmp(context->target, "die Datei jetzt \xc3\xb6" "ffnen") == 0 &&
                 reader.dropped[CATALOG_DROP_PLURAL_OR_CONTEXT] == 2 && reader.catalogs_read == 1;
        check(ok,
              "catalogs: a %s-endian catalog of revision %u: the header skipped, 2 pairs (a "
              "context stripped from the English), a plural and a context alone dropped (%s)",
              big_endian ? "big" : "little", revision, error ? error : "read");
        catalog_reader_free(&reader);
        free(data);
    }
}

// One message for each filter, in the order they are tried, and the
// messages each must keep; the counts of the summary, one each.
static void test_catalog_filters(void) {
    const char plural[] = "a file was removed today\0files were removed today";
    const char plural_de[] = "eine Datei\0Dateien";
    const char twenty_six[] = "a b c d e f g h i j k l m n o p q r s t u v w x y z";
    MoEntry entries[] = {
        { plural, sizeof plural - 1, plural_de, sizeof plural_de - 1 },            // plural
        { "caf\xe9 is not open", 0, "das Caf\xc3\xa9 ist zu", 0 },          // not UTF-8 (Latin-1)
        { "the first line\nand the second", 0,
          "die erste Zeile\nund die zweite", 0 },                           // more than one line
        { "cannot open %s now", 0, "kann %s nicht \xc3\xb6" "ffnen", 0 },   // format: printf
        { "found {0} files here", 0, "{0} Dateien gefunden", 0 },           // format: Python
        { "set $HOME first please", 0, "zuerst $HOME setzen", 0 },          // format: shell
        { "this is <b>bold</b> text", 0,
          "das ist <b>fetter</b> Text", 0 },                                // markup: a tag
        { "Tom &amp; Jerry show", 0, "Tom &amp; Jerry Show", 0 },           // markup: an entity
        { "a backslash \\ is here", 0, "ein Backslash \\ ist hier", 0 },    // escapes
        { "a tab\there between", 0, "ein Tab\thier dazwischen", 0 },        // a control character
        { "_Open the file", 0, "Datei _\xc3\xb6" "ffnen", 0 },              // accelerator: GTK
        { "&Save the file", 0, "Datei &speichern", 0 },                     // accelerator: Qt
        { "two words", 0, "zwei W\xc3\xb6rter hier", 0 },                   // words: too few
        { twenty_six, 0, "das Alphabet", 0 },                               // words: too many
        { "an empty translation here", 0, "   ", 0 },                       // words: no translation
        { "the same sentence here", 0, "the  same sentence here", 0 },      // source = target
        { "keep   this\xc2\xa0sentence please\n", 0, "  diesen Satz bitte behalten\n", 0 },
        { "max_connections is too small", 0, "max_connections ist zu klein", 0 },
        { "Tom & Jerry are here", 0, "Tom & Jerry sind hier", 0 },
        { "the file x.mo is not open", 0, "die Datei x.mo ist zu", 0 },
    };
    int n = (int)(sizeof entries / sizeof *entries);
    size_t size = 0;
    unsigned char *data = mo_build(entries, n, 0, 0, &size);
    CatalogReader reader;
    catalog_reader_init(&reader, 3, 25);
    const char *error = catalog_read_bytes(&reader, data, size, "filters");
    long long want[NUM_CATALOG_DROPS] = { 1, 1, 1, 3, 4, 2, 3, 1, 0 };
    int counts_ok = !error;
    for (int d = 0; d < NUM_CATALOG_DROPS; d++) {
        check(!error && reader.dropped[d] == want[d],
              "catalogs: filter \"%s\" drops %lld message%s of the test catalog (%lld)",
              catalog_drop_names[d], want[d], want[d] == 1 ? "" : "s", reader.dropped[d]);
        counts_ok = counts_ok && reader.dropped[d] == want[d];
    }
    const CatalogPair *spaces = kept_pair(&reader, "keep this sentence please");
    int kept_ok = counts_ok && reader.count == 4 && reader.messages == n && spaces &&
                  strcmp(spaces->target, "diesen Satz bitte behalten") == 0 &&
                  kept_pair(&reader, "max_connections is too small") &&
                  kept_pair(&reader, "Tom & Jerry are here") &&
                  kept_pair(&reader, "the file x.mo is not open");
    check(kept_ok,
          "catalogs: 4 of %d messages kept: white space (U+00A0, final newlines) made single "
          "spaces, an identifier's _ and a lone & are not accelerators (%d kept)", n, reader.count);
    catalog_reader_free(&reader);
    // --min-words and --max-words move the bounds: "two words" is kept with 2
    catalog_reader_init(&reader, 2, 25);
    error = catalog_read_bytes(&reader, data, size, "filters");
    check(!error && kept_pair(&reader, "two words") && reader.dropped[CATALOG_DROP_WORDS] == 2,
          "catalogs: with --min-words 2 a message of two words is kept");
    catalog_reader_free(&reader);
    free(data);
}

// The same English sentence in two catalogs with different translations:
// the one first in byte order is kept, whichever catalog is read first.
static void test_catalog_duplicates(void) {
    MoEntry first[] = { { "the file is open", 0, "die Datei ist offen", 0 },
                        { "the disk is full", 0, "die Platte ist voll", 0 } };
    MoEntry second[] = { { "the file is open", 0, "Datei ist ge\xc3\xb6" "ffnet", 0 },
                         { "the disk is full", 0, "die Platte ist voll", 0 } };
    size_t size_first = 0;
    size_t size_second = 0;
    unsigned char *a = mo_build(first, 2, 0, 0, &size_first);
    unsigned char *b = mo_build(second, 2, 1, 0, &size_second);
    for (int order = 0; order < 2; order++) {
        CatalogReader reader;
        catalog_reader_init(&reader, 3, 25);
        const char *error = catalog_read_bytes(&reader, order ? b : a,
                                               order ? size_second : size_first, order ? "b" : "a");
        if (!error)
            error = catalog_read_bytes(&reader, order ? a : b, order ? size_first : size_second,
                                       order ? "a" : "b");
        catalog_drop_duplicates(&reader);
        const CatalogPair *open = kept_pair(&reader, "the file is open");
        check(!error && reader.count == 2 && open &&
              strcmp(open->target, "Datei ist ge\xc3\xb6" "ffnet") == 0 &&
              reader.dropped[CATALOG_DROP_DUPLICATE] == 2,
              "catalogs: a sentence in two catalogs, read %s: the translation first in byte order "
              "kept, 2 duplicates counted", order ? "b first" : "a first");
        catalog_reader_free(&reader);
    }
    free(a);
    free(b);
}

// Each kind of damage: one error naming it, nothing taken from the catalog,
// and the reader goes on with the next.
static void test_catalog_damage(void) {
    MoEntry entries[] = { { "", 0, "Language: de\n", 0 },
                          { "the file is open", 0, "die Datei ist offen", 0 },
                          { "the disk is full", 0, "die Platte ist voll", 0 } };
    size_t size = 0;
    unsigned char *good = mo_build(entries, 3, 0, 0, &size);
    // where the words are: 8 N, 12 O, 16 T; originals' entry 1 at O + 8 (length, offset)
    const size_t originals = MO_HEADER_BYTES;
    const size_t translations = originals + 24;
    struct {
        const char *what;
        size_t at;
        uint32_t value;
        size_t cut;
        const char *expected;
    } damage[] = {
        { "truncated to 20 bytes", 0, 0, 20, "truncated: 20 bytes, a .mo header takes 28" },
        { "a wrong magic number", 0, 0x12345678, 0,
          "magic number 0x12345678; expected 0x950412de" },
        { "revision 2", 4, 2u << 16, 0,
          "file format revision 2.0; expected major revision 0 or 1" },
        { "a table past the end", 8, 1000000, 0,
          "the table of originals (1000000 strings at offset 28) runs past" },
        { "a count that overflows 32 bits as bytes", 8, 0x20000001, 0,
          "runs past the end of the file" },
        { "a table over the header", 12, 8, 0,
          "the table of originals at offset 8 overlaps the 28-byte header" },
        { "the two tables overlapping", 16, (uint32_t)originals + 8, 0,
          "the tables of originals (offset 28) and translations (offset 36) overlap" },
        { "a string past the end", originals + 12, 1u << 20, 0,
          "original 1: 16 bytes at offset 1048576 run past" },
        { "a string in the header", translations + 12, 4, 0,
          "translation 1: offset 4 is inside the 28-byte header" },
        { "a length that overflows", originals + 8, 0xffffffffu, 0,
          "original 1: 4294967295 bytes at offset" },
        { "a string without its zero byte", originals + 8, 17, 0,
          "original 1: no zero byte after its 17 bytes" },
        { "a file cut in the strings", 0, 0, 0, "run past the end of the file" },
    };
    int n = (int)(sizeof damage / sizeof *damage);
    for (int i = 0; i < n; i++) {
        unsigned char *data = checked_calloc(size, 1, "damaged catalog");
        memcpy(data, good, size);
        size_t damaged_size = damage[i].cut ? damage[i].cut : size;
        if (i == n - 1)
            damaged_size = size - 12;
        else if (!damage[i].cut) mo_put_word(data + damage[i].at, damage[i].value, 0);
        CatalogReader reader;
        catalog_reader_init(&reader, 3, 25);
        const char *error = catalog_read_bytes(&reader, data, damaged_size, "damaged");
        int refused = error && strstr(error, damage[i].expected) && reader.count == 0 &&
                      reader.messages == 0 && reader.catalogs_read == 0;
        error = refused ? catalog_read_bytes(&reader, good, size, "good") : error;
        check(refused && !error && reader.count == 2,
              "catalogs: %s is refused, nothing taken, and the next catalog read (%s)",
              damage[i].what, error ? error : "refused");
        catalog_reader_free(&reader);
        free(data);
    }
    // the big-endian catalog is checked in its own order: a wrong word there is damage too
    size_t big_size = 0;
    unsigned char *big = mo_build(entries, 3, 1, 0, &big_size);
    mo_put_word(big + 12, 8, 1);
    CatalogReader reader;
    catalog_reader_init(&reader, 3, 25);
    const char *error = catalog_read_bytes(&reader, big, big_size, "big");
    check(error && strstr(error, "overlaps the 28-byte header") && reader.count == 0,
          "catalogs: a big-endian catalog with its table over the header is refused (%s)",
          error ? error : "read");
    catalog_reader_free(&reader);
    free(big);
    free(good);
}

// The split by the hash of the English sentence, the files it writes, and
// the command: languages by folder, a damaged file skipped and counted, runs
// that give the same bytes, --force, --min-pairs and the refusals.
static void test_catalogs_command(void) {
    enum { SENTENCES = 240 };
    MoEntry *entries = checked_calloc(SENTENCES, sizeof(MoEntry), "test catalog");
    char (*english)[64] = checked_calloc(SENTENCES, sizeof *english, "test catalog");
    char (*german)[64] = checked_calloc(SENTENCES, sizeof *german, "test catalog");
    for (int i = 0; i < SENTENCES; i++) {
        snprintf(english[i], sizeof english[i], "sentence number %d is here", i);
        snprintf(german[i], sizeof german[i], "Satz Nummer %d ist hier", i);
        entries[i].original = english[i];
        entries[i].translation = german[i];
    }
    char dir[600];
    snprintf(dir, sizeof dir, "%s/locale/de/LC_MESSAGES", test_dir);
    make_directories(dir);
    mo_write(test_path("locale/de/LC_MESSAGES/first.mo"), entries, SENTENCES / 2, 0);
    mo_write(test_path("locale/de/LC_MESSAGES/second.mo"), entries + SENTENCES / 2,
             SENTENCES / 2, 1);
    write_text(test_path("locale/de/LC_MESSAGES/broken.mo"), "not a catalog at all, 34 bytes...");
    write_text(test_path("locale/de/LC_MESSAGES/notes.txt"), "not read: not a .mo file\n");
    snprintf(dir, sizeof dir, "%s/locale/fr/LC_MESSAGES", test_dir);
    make_directories(dir);
    MoEntry french[] = { { "the file is open", 0, "le fichier est ouvert", 0 } };
    mo_write(test_path("locale/fr/LC_MESSAGES/first.mo"), french, 1, 0);

    const char *out = test_path("pairs");
    int status = run_cli("catalogs --to de --out %s %s/locale", out, test_dir);
    int ok = status == 0 && strstr(cli_output, "catalogs 2 read for de") &&
             strstr(cli_output, "1 damaged") && strstr(cli_output, "skipped: ") &&
             strstr(cli_output, "broken.mo: magic number") &&
             strstr(cli_output, "largest  first 120, second 120") &&
             strstr(cli_output, "kept     240 pairs");
    check(ok,
          "cli: catalogs --to de DIR reads DIR/*/de/LC_MESSAGES/*.mo, skips and counts the damaged "
          "one, and names the largest catalogs%s%s", ok ? "" : ": ", ok ? "" : cli_output);
    int placed = 0;
    int in_split[NUM_CATALOG_SPLITS] = { 0, 0, 0 };
    for (int s = 0; s < NUM_CATALOG_SPLITS; s++) {
        char name[64];
        snprintf(name, sizeof name, "pairs/%s.tsv", catalog_split_names[s]);
        char *text = read_text_file(test_path(name));
        for (int i = 0; text && i < SENTENCES; i++) {
            char line[160];
            snprintf(line, sizeof line, "%s\t%s\n", english[i], german[i]);
            int here = strstr(text, line) != NULL;
            placed += here && catalog_split(english[i]) == s;
            in_split[s] += here;
        }
        free(text);
    }
    check(placed == SENTENCES && in_split[CATALOG_DEV] > 0 && in_split[CATALOG_TEST] > 0,
          "cli: catalogs puts each of %d pairs in the file its English sentence's hash names "
          "(train %d, dev %d, test %d)", SENTENCES, in_split[0], in_split[1], in_split[2]);
    check(catalog_split("sentence number 0 is here") ==
              (int)(fnv1a_64("sentence number 0 is here") % 40 == 0 ? 2 :
                    fnv1a_64("sentence number 0 is here") % 40 == 1 ? 1 : 0) &&
          fnv1a_64("") == 0xcbf29ce484222325ULL && fnv1a_64("a") == 0xaf63dc4c8601ec8cULL,
          "catalogs: the split's hash is FNV-1a 64 (its published values)");

    char *before = read_text_file(test_path("pairs/train.tsv"));
    check_cli_error("catalogs over its own files without --force",
                    "pairs/train.tsv is already there; --force replaces it",
                    "catalogs --to de --out %s %s/locale", out, test_dir);
    status = run_cli("catalogs --to de --out %s --force %s/locale/de/LC_MESSAGES/second.mo "
                     "%s/locale", out, test_dir, test_dir);
    char *after = read_text_file(test_path("pairs/train.tsv"));
    check(status == 0 && before && after && strcmp(before, after) == 0 &&
          strstr(cli_output, "source seen before 120"),
          "cli: catalogs --force again, a catalog given twice: the same train.tsv byte for byte, "
          "120 duplicates");
    free(before);
    free(after);
    status = run_cli("catalogs --to fr --out %s --force %s/locale", test_path("french"), test_dir);
    check(status == 0 && strstr(cli_output, "catalogs 1 read for fr") &&
          strstr(cli_output, "kept     1 pairs"),
          "cli: catalogs --to fr reads only the fr folder");
    check_cli_error("catalogs with too few pairs", "found 240 English->de pairs in 2 catalogs (",
                    "catalogs --to de --out %s --min-pairs 2000 %s/locale",
                    test_path("few"), test_dir);
    check(access(test_path("few"), F_OK) != 0,
          "cli: catalogs --min-pairs writes nothing when too few are found");
    check_cli_error("catalogs of a missing path",
                    "catalogs: /nonexistent/x.mo: No such file or directory; expected "
                    "a .mo file or a folder",
                    "catalogs --out %s /nonexistent/x.mo", test_path("none"));
    check_cli_error("catalogs --to with a slash", "--to '../de' is not a language",
                    "catalogs --to ../de");
    check_cli_error("catalogs --min-words above --max-words",
                    "--min-words 9 is more than --max-words 4",
                    "catalogs --min-words 9 --max-words 4");
    check_cli_error("catalogs of no catalog", "found 0 English->xx pairs in 0 catalogs",
                    "catalogs --to xx --out %s %s/locale", test_path("none"), test_dir);
    write_text(test_path("plain_file"), "x");
    check_cli_error("catalogs --out over a file", "plain_file: not a directory",
                    "catalogs --to de --out %s %s/locale", test_path("plain_file"), test_dir);

    // An --out that can be made, but is too long for its files' paths (4,096 bytes with
    // "/train.tsv"): one line, not a path cut short (called directly: a command line that long is
    // the shell's problem)
    char deep[4096];
    int used = snprintf(deep, sizeof deep, "%s", test_path("deep"));
    while (used < 4087) {
        int part = 4087 - used - 1 < 200 ? 4087 - used - 1 : 200;
        deep[used] = '/';
        memset(deep + used + 1, 'd', (size_t)part);
        used += 1 + part;
        deep[used] = '\0';
    }
    CatalogReader none;
    catalog_reader_init(&none, 3, 25);
    int deep_counts[NUM_CATALOG_SPLITS];
    const char *too_long = catalog_write_splits(&none, deep, 0, deep_counts);
    catalog_reader_free(&none);
    const char *said = too_long ? strstr(too_long, "the directory's path is too long") : NULL;
    check(said != NULL,
          "catalogs: an --out of %zu bytes, too long for its files' paths, is refused (\"...: "
          "%s\")", strlen(deep), said ? said : "not refused");
    free(entries);
    free(english);
    free(german);
}

// ============================================================================
// §6.1 BLEU (lab/bleu.c), worked out by hand (once test_transformer.c's, with
// the BLEU of transformer.c)
// Each case's numbers are derived in its comment, and were checked against an
// independent computation: `/usr/bin/python3 dev/bleu_check.py` (our own
// Counter-based BLEU and NLTK's corpus_bleu) prints the same values.
// ============================================================================

static int near(double a, double b, double tolerance) { return fabs(a - b) <= tolerance; }

// Adds a candidate and its reference, read as the lab reads text (tokenize: split at
// Unicode's white space, lab/text.c; each new word an id of the pair's own vocabulary).
static void bleu_add_texts(BleuStats *stats, const char *candidate, const char *reference) {
    Vocabulary vocab;
    vocab_init(&vocab);
    TextSource from = { "test", 0, 0, NULL };
    int *ids[2] = { NULL, NULL }, n[2];
    size_t capacity[2] = { 0, 0 };
    for (int side = 0; side < 2; side++)
        n[side] = text_tokenize(side ? reference : candidate, &vocab, NULL, 1, &ids[side],
                                &capacity[side], &from);
    bleu_add_sentence(stats, ids[0], n[0], ids[1], n[1]);
    free(ids[0]);
    free(ids[1]);
    vocab_free(&vocab);
}

// Corpus BLEU of n (candidate, reference) string pairs.
static double bleu_of_text(const char *const pairs[][2], int n, double precisions[4], double *bp) {
    BleuStats stats;
    bleu_reset(&stats);
    for (int i = 0; i < n; i++) bleu_add_texts(&stats, pairs[i][0], pairs[i][1]);
    return bleu_score(&stats, precisions, bp);
}

// White space is the set Python's str.split() splits at (sacreBLEU's
// tokenize='none'), as UTF-8: each of its 29 characters between "a" and "b"
// makes two words; look-alikes that are not white space (zero-width space
// U+200B, U+180E, the byte-order mark U+FEFF) and the bytes 0x85 and 0xA0
// alone (Latin-1's next line and no-break space, not UTF-8) make one.
static void test_bleu_white_space(void) {
    static const char *const white[] = {
        "\t", "\n", "\v", "\f", "\r", "\x1c", "\x1d", "\x1e", "\x1f", " ", "\xc2\x85", "\xc2\xa0",
        "\xe1\x9a\x80", "\xe2\x80\x80", "\xe2\x80\x81", "\xe2\x80\x82", "\xe2\x80\x83",
        "\xe2\x80\x84", "\xe2\x80\x85", "\xe2\x80\x86", "\xe2\x80\x87", "\xe2\x80\x88",
        "\xe2\x80\x89", "\xe2\x80\x8a", "\xe2\x80\xa8", "\xe2\x80\xa9", "\xe2\x80\xaf",
        "\xe2\x81\x9f", "\xe3\x80\x80",
    };
    static const char *const not_white[] = { "\xe2\x80\x8b", "\xe1\xa0\x8e", "\xef\xbb\xbf", "\x85",
                                             "\xa0", "\xe3\x80" };
    int n_white = (int)(sizeof white / sizeof *white),
        n_not = (int)(sizeof not_white / sizeof *not_white);
    int splits = 0, joins = 0;
    char text[32];
    for (int i = 0; i < n_white + n_not; i++) {
        snprintf(text, sizeof text, "a%sb", i < n_white ? white[i] : not_white[i - n_white]);
        BleuStats stats;
        bleu_reset(&stats);
        bleu_add_texts(&stats, text, "a b");
        if (i < n_white)
            splits += stats.candidate_length == 2 && stats.matches[1] == 1;
        else
            joins += stats.candidate_length == 1 && stats.matches[0] == 0;
    }
    check(splits == n_white && joins == n_not,
          "BLEU: each of the %d white-space characters of Python's str.split() separates two words "
          "(%d did), and %d look-alikes do not (%d)", n_white, splits, n_not, joins);
    // A sentence written with U+3000 (ideographic space) and U+00A0 (no-break
    // space) scores as its twin with ASCII spaces. By hand: the first pair is
    // 6 equal words (6/6 5/5 4/4 3/3); the second "a b c d e" against
    // "a b c d f" matches 4/5 3/4 2/3 1/2; c = r = 11, BP = 1, so
    // BLEU = 100 (10/11 8/9 6/7 4/5)^(1/4).
    const char *const unicode[][2] = {
        { "the\xc2\xa0" "cat sat on\xe3\x80\x80the mat", "the cat\xc2\xa0sat on the mat" },
        { "\xe3\x80\x80" "a\xe3\x80\x80" "b\xe3\x80\x80" "c\xe3\x80\x80" "d\xe3\x80\x80"
          "e\xe3\x80\x80", "a b c d f" },
    };
    const char *const ascii[][2] = { { "the cat sat on the mat", "the cat sat on the mat" },
                                     { "a b c d e", "a b c d f" } };
    double p[4], bp, by_hand = 100 * pow(10.0 / 11 * 8.0 / 9 * 6.0 / 7 * 4.0 / 5, 0.25);
    double bleu = bleu_of_text(unicode, 2, p, &bp), twin = bleu_of_text(ascii, 2, NULL, NULL);
    check(bleu == twin && near(bleu, by_hand, 1e-9) && near(p[0], 10.0 / 11, 1e-15) &&
          near(p[3], 4.0 / 5, 1e-15) && bp == 1,
          "BLEU: text with U+00A0 and U+3000 scores %.10f, as its ASCII twin (%.10f) and as by "
          "hand (%.10f)", bleu, twin, by_hand);
}

// Counting is linear in a line's length (a hash table, as sacreBLEU's
// Counter): one line of 40,000 tokens, the hypothesis its reference with every
// 7th word changed. By hand, per order n the hypothesis has 40001 - n n-grams;
// an n-gram misses when it covers a changed word (positions 6, 13, ...: every
// 7th), i.e. n of each 7 starting positions, so about (7 - n)/7 match. With
// 1000 distinct words cycling, each n-gram's count is the same on both sides
// or higher in the reference, so clipping never bites. It took 4.8 s when
// every n-gram was compared with every other; the bound is 1 s of processor
// time (not wall time: another program on the machine does not count).
static void test_bleu_long_line(void) {
    enum { TOKENS = 40000 };
    char *hyp = checked_calloc(TOKENS * 8, 1, "test"), *ref = checked_calloc(TOKENS * 8, 1, "test");
    size_t h = 0, r = 0;
    for (int i = 0; i < TOKENS; i++) {
        h += (size_t)sprintf(hyp + h, i % 7 == 6 ? "x%d " : "w%d ", i % 1000);
        r += (size_t)sprintf(ref + r, "w%d ", i % 1000);
    }
    clock_t start = clock();
    BleuStats stats;
    bleu_reset(&stats);
    bleu_add_texts(&stats, hyp, ref);
    double seconds = (double)(clock() - start) / CLOCKS_PER_SEC;
    int counts_right = 1;
    for (int n = 1; n <= 4; n++) {
        long long total = TOKENS - n + 1, missing = 0;
        for (int i = 0; i + n <= TOKENS; i++) {
            int covers_changed = 0;
            for (int k = i; k < i + n; k++) covers_changed |= k % 7 == 6;
            missing += covers_changed;
        }
        counts_right &= stats.totals[n - 1] == total && stats.matches[n - 1] == total - missing;
    }
    check(counts_right && seconds < 1.0,
          "BLEU: one line of %d tokens in %.3f s (bound 1 s), its n-gram counts as by hand",
          TOKENS, seconds);
    free(hyp);
    free(ref);
}

static void test_bleu(void) {
    double p[4], bp, bleu;
    // Identical, 6 tokens: every precision 6/6 5/5 4/4 3/3 = 1, c = r so BP = 1: BLEU 100.
    const char *const identical[][2] = { { "the cat sat on the mat", "the cat sat on the mat" } };
    bleu = bleu_of_text(identical, 1, p, &bp);
    check(bleu == 100.0 && bp == 1.0 && p[0] == 1 && p[3] == 1,
          "BLEU: identical sentences give %.10g", bleu);

    // Shorter than its reference: "the cat sat on" (c = 4) against 6 tokens (r = 6).
    // Precisions 4/4 3/3 2/2 1/1 = 1; BP = exp(1 - 6/4) = exp(-0.5) = 0.6065306597;
    // BLEU = 60.65306597.
    const char *const shorter[][2] = { { "the cat sat on", "the cat sat on the mat" } };
    bleu = bleu_of_text(shorter, 1, p, &bp);
    check(near(bp, exp(-0.5), 1e-15) && near(bleu, 60.6530659713, 1e-9) && p[0] == 1 && p[3] == 1,
          "BLEU: a candidate shorter than its reference: BP %.10f (exp(-0.5)), BLEU %.10f "
          "(60.6530659713)", bp, bleu);

    // No 4-gram matches: "a b c e d" against "a b c d e".
    // 1-grams 5/5; 2-grams ab bc ce ed vs ab bc cd de: 2/4; 3-grams abc bce ced: 1/3;
    // 4-grams abce bced vs abcd bcde: 0/2. One precision is 0, so BLEU = 0 (no smoothing).
    const char *const no_four[][2] = { { "a b c e d", "a b c d e" } };
    bleu = bleu_of_text(no_four, 1, p, &bp);
    check(bleu == 0.0 && p[0] == 1.0 && p[1] == 0.5 && near(p[2], 1.0 / 3, 1e-15) && p[3] == 0.0,
          "BLEU: no 4-gram matches gives 0 (precisions %.4f %.4f %.4f %.4f)",
          p[0], p[1], p[2], p[3]);

    // Clipping (Papineni et al.'s own example): seven "the" against "the cat is on
    // the mat", which holds "the" twice: p1 = min(7, 2) / 7 = 2/7, not 7/7.
    const char *const clip7[][2] = { { "the the the the the the the", "the cat is on the mat" } };
    bleu = bleu_of_text(clip7, 1, p, &bp);
    check(near(p[0], 2.0 / 7, 1e-15) && bleu == 0.0,
          "BLEU: clipping, 7 x 'the' against 2 in the reference: p1 = %.10f (2/7)", p[0]);
    // "the the the the" against "the cat": p1 = min(4, 1) / 4 = 1/4; no bigram "the the" in the
    // reference.
    const char *const clip4[][2] = { { "the the the the", "the cat" } };
    bleu = bleu_of_text(clip4, 1, p, &bp);
    check(p[0] == 0.25 && p[1] == 0.0 && bleu == 0.0,
          "BLEU: clipping, 'the the the the' against 'the cat': p1 = %.4f (1/4)", p[0]);

    // Two sentences. A: "a b c d" = its reference (sentence BLEU 100). B: "e f g x i"
    // against "e f g h i" (sentence BLEU 0: no 4-gram matches). Mean of the two: 50.
    // Corpus: p1 = (4+4)/(4+5) = 8/9, p2 = (3+2)/(3+4) = 5/7, p3 = (2+1)/(2+3) = 3/5,
    // p4 = (1+0)/(1+2) = 1/3; c = r = 9, BP = 1. BLEU = 100 (8/9 5/7 3/5 1/3)^(1/4)
    // = 100 (8/63)^(1/4) = 59.69491792.
    const char *const two[][2] = { { "a b c d", "a b c d" }, { "e f g x i", "e f g h i" } };
    bleu = bleu_of_text(two, 2, p, &bp);
    double sentence_mean = (bleu_of_text(two, 1, NULL, NULL) +
                            bleu_of_text(two + 1, 1, NULL, NULL)) / 2;
    check(near(bleu, 100 * pow(8.0 / 63, 0.25), 1e-9) && near(bleu, 59.6949179202, 1e-9) &&
          sentence_mean == 50.0,
          "BLEU: corpus of two sentences %.10f (59.6949179202), not the mean of sentence BLEUs "
          "%.1f", bleu, sentence_mean);

    // The brevity penalty comes from corpus lengths: A (8 tokens) = its reference,
    // B "p q r" against "p q r s t u". c = 8+3 = 11, r = 8+6 = 14, BP = exp(1 - 14/11).
    // B has no 4-gram, so p4 = (5+0)/(5+0) = 1 and BLEU = 100 BP = 76.13003867.
    // (NLTK gives 72.74: it counts B as having one 4-gram, max(1, 0), so p4 = 5/6.)
    const char *const one_short[][2] = { { "a b c d e f g h", "a b c d e f g h" },
                                         { "p q r", "p q r s t u" } };
    bleu = bleu_of_text(one_short, 2, p, &bp);
    check(near(bp, exp(1 - 14.0 / 11), 1e-15) && near(bleu, 76.1300386697, 1e-9),
          "BLEU: corpus brevity penalty exp(1 - 14/11) = %.10f, BLEU %.10f (76.1300386697)",
          bp, bleu);

    // Streaming, and token ids: the same corpus as ids, scored after each sentence.
    const int a[] = { 10, 11, 12, 13 }, b_hyp[] = { 14, 15, 16, 99, 18 },
              b_ref[] = { 14, 15, 16, 17, 18 };
    BleuStats stats;
    bleu_reset(&stats);
    bleu_add_sentence(&stats, a, 4, a, 4);
    double after_one = bleu_score(&stats, NULL, NULL);
    bleu_add_sentence(&stats, b_hyp, 5, b_ref, 5);
    double after_two = bleu_score(&stats, NULL, NULL);
    check(after_one == 100.0 && near(after_two, 59.6949179202, 1e-9) && stats.sentences == 2 &&
          stats.candidate_length == 9 && stats.reference_length == 9,
          "BLEU: token ids, sentence by sentence: %.4f after one, %.10f after two",
          after_one, after_two);

    // An empty candidate: no n-grams (every p_n taken as 0), c = 0 so BP = 0: BLEU 0.
    const char *const empty[][2] = { { "", "the cat" } };
    bleu = bleu_of_text(empty, 1, p, &bp);
    check(bleu == 0.0 && p[0] == 0 && bp == 0.0, "BLEU: an empty candidate gives 0 (BP 0)");
    // White space of any kind separates words: 3 words each side, p1..p3 = 1,
    // no 4-gram at all (p4 taken as 0), so BLEU 0; c = r = 3, BP = 1.
    const char *const spaces[][2] = { { "  the\tcat \n sat  ", "the cat sat" } };
    bleu = bleu_of_text(spaces, 1, p, &bp);
    check(p[0] == 1 && p[1] == 1 && p[2] == 1 && p[3] == 0 && bp == 1 && bleu == 0.0,
          "BLEU: tabs, newlines and runs of spaces separate words; "
          "a corpus without 4-grams scores 0");
    test_bleu_white_space();
    test_bleu_long_line();
}

// ============================================================================
// Real text and eval (lab/text.c, lab/bleu.c), once transformer.c's: TSV files,
// the text rule, eval and its BLEU, and the overwrite guards of train (--force)
// ============================================================================

static void test_tsv_reading(void) {
    Vocabulary v;
    Dataset d;
    vocab_init(&v);
    memset(&d, 0, sizeof d);
    write_text(test_path("good.tsv"), "a b c\tc b a\r\n\n   \nb  d\td\n");
    const char *e = dataset_read_tsv(&d, &v, NULL, test_path("good.tsv"), 1);
    check(!e && d.count == 2 && d.pairs[0].src_len == 3 && d.pairs[1].src_len == 2 &&
          d.pairs[1].line == 4 && v.size == NUM_SPECIAL_TOKENS + 4 &&
          strcmp(v.words[4], "a") == 0 && d.tokens[d.pairs[1].tgt] == 7,
          "data: a TSV file with \\r\\n and blank lines gives 2 pairs, their line numbers and a "
          "vocabulary of 8");
    dataset_free(&d);
    // the errors: each names the file and line and says what was expected
    struct { const char *name, *text, *expected; } bad[] = {
        { "empty.tsv", "", "empty.tsv: no sentence pairs (the file is empty)" },
        { "blank.tsv", "\n\n", "blank.tsv: no sentence pairs (only blank lines)" },
        { "notab.tsv", "a\tb\na b\n", "notab.tsv:2: no tab; expected source<TAB>target" },
        { "twotabs.tsv", "a\tb\tc\n", "twotabs.tsv:1: more than one tab" },
        { "nosource.tsv", "a\tb\n \tb\n", "nosource.tsv:2: empty source" },
        { "notarget.tsv", "a\t \n", "notarget.tsv:1: empty target" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_text(test_path(bad[i].name), bad[i].text);
        e = dataset_read_tsv(&d, &v, NULL, test_path(bad[i].name), 1);
        check(e && strstr(e, bad[i].expected), "data: %s is refused (%s)", bad[i].name,
              e ? e : "accepted");
        dataset_free(&d);
    }
    e = dataset_read_tsv(&d, &v, NULL, test_path("missing.tsv"), 1);
    check(e && strstr(e, "missing.tsv: cannot open"), "data: a missing file is refused (%s)",
          e ? e : "accepted");
    e = dataset_read_tsv(&d, &v, NULL, test_dir, 1);
    check(e && strstr(e, ": is a directory; expected a text file"),
          "data: a directory is refused as one (%s)", e ? e : "accepted");
    // white space is Python's str.split()'s in data too: U+3000, U+00A0 and U+2003 separate tokens,
    // and a line of U+3000 alone is blank
    Vocabulary words;
    vocab_init(&words);
    write_text(test_path("unicode_spaces.tsv"),
               "a\xe3\x80\x80" "b\xc2\xa0" "c\tc\xe2\x80\x83" "b a\n\xe3\x80\x80\n");
    e = dataset_read_tsv(&d, &words, NULL, test_path("unicode_spaces.tsv"), 1);
    check(!e && d.count == 1 && d.pairs[0].src_len == 3 && d.pairs[0].tgt_len == 3 &&
          words.size == NUM_SPECIAL_TOKENS + 3,
          "data: U+3000, U+00A0 and U+2003 separate tokens as spaces do; a line of U+3000 is blank "
          "(%s)", e ? e : "read");
    dataset_free(&d);
    vocab_free(&words);
    // unknown tokens with a fixed vocabulary become <unk>
    write_text(test_path("unknown.tsv"), "a zz\tb\n");
    int size = v.size;
    fflush(stdout);
    e = dataset_read_tsv(&d, &v, NULL, test_path("unknown.tsv"), 0);
    check(!e && v.size == size && d.tokens[1] == TOKEN_UNK,
          "data: a token not in a fixed vocabulary is read as <unk>, with the warning above");
    e = dataset_check_lengths(&d, "unknown.tsv", 2);
    check(e && strstr(e, "unknown.tsv:1: the source has 2 tokens"),
          "data: a source too long for max_len is refused (%s)", e ? e : "accepted");
    dataset_free(&d);
    vocab_free(&v);
}

// The TSV files of train --train and --valid, and eval: errors naming the file and line, a run on
// a TSV file (its checkpoint, tsv.ckpt, serves the lab's tests below), eval and decode with it, a
// damaged checkpoint refused by eval, and a loss that becomes NaN, saved after every step.
static void test_tsv_command_line(void) {
    // data files
    const char *tsv = test_path("cli.tsv");
    write_text(tsv, "a b\tb a\nc d e\te d c\na a\ta a\nb c\tc b\n");
    write_text(test_path("cli_empty.tsv"), "");
    write_text(test_path("cli_notab.tsv"), "a b\tb a\nc d e\n");
    check_cli_error("a missing data file", "train: /nonexistent/x.tsv: cannot open",
                    "train --train /nonexistent/x.tsv");
    check_cli_error("an empty data file", "cli_empty.tsv: no sentence pairs (the file is empty)",
                    "train --train %s", test_path("cli_empty.tsv"));
    check_cli_error("a line without a tab", "cli_notab.tsv:2: no tab; expected source<TAB>target",
                    "train --train %s", test_path("cli_notab.tsv"));
    // a tiny run on the TSV file, then decode and eval with its checkpoint
    const char *tsv_ckpt = test_path("tsv.ckpt");
    int status = run_cli("train --train %s --valid %s --steps 4 --checkpoint %s " TINY_MINIMAL_RUN
                         " --eval-every 0 --show 0", tsv, tsv, tsv_ckpt);
    check(status == 0 && strstr(cli_output, "eval   step 4"),
          "cli: train on a TSV file for 4 steps (exit %d)", status);
    status = run_cli("eval --checkpoint %s --data %s", tsv_ckpt, tsv);
    check(status == 0 && strstr(cli_output, "exact match") && strstr(cli_output, "token accuracy"),
          "cli: eval prints token accuracy and exact match (exit %d)", status);
    status = run_cli("decode --checkpoint %s 'a zz b'", tsv_ckpt);
    check(status == 0 && strstr(cli_output, "warning: argument 1: token 'zz' is not in the "
                                            "vocabulary; read as <unk>"),
          "cli: an unknown token at decode time is read as <unk> with a warning (exit %d)", status);
    char long_sentence[400] = "'";
    for (int i = 0; i < 60; i++) strcat(long_sentence, "a ");
    strcat(long_sentence, "'");
    check_cli_error("a sentence longer than the model's maximum",
                    "argument 1: the sentence has 60 tokens; the model's "
                    "maximum length 54 allows 53",
                    "decode --checkpoint %s %s", tsv_ckpt, long_sentence);
    char long_tsv[600];
    snprintf(long_tsv, sizeof long_tsv, "a\tb\nb\ta\n%s\ta\n", long_sentence + 1);
    long_tsv[strlen(long_tsv) - 4] = ' '; // drop the closing quote
    write_text(test_path("cli_long.tsv"), long_tsv);
    check_cli_error("a held-out line longer than the maximum",
                    "cli_long.tsv:3: the source has 60 tokens", "eval --checkpoint %s --data %s",
                    tsv_ckpt, test_path("cli_long.tsv"));
    // damaged checkpoints, refused by eval as by decode
    size_t size;
    unsigned char *good = read_file(tsv_ckpt, &size);
    if (!good) {
        check(0, "cli: no checkpoint from the TSV run; the damaged-checkpoint tests need one");
        return;
    }
    const char *bad = test_path("cli_bad.ckpt");
    good[0] = 'P';
    write_file(bad, good, size);
    good[0] = 'T';
    check_cli_error("a checkpoint with the wrong magic",
                    "cli_bad.ckpt: not a transformer.c checkpoint",
                    "eval --checkpoint %s --data %s", bad, tsv);
    free(good);
    // a NaN loss stops training and leaves the last good checkpoint; on a TSV
    // file of fewer than 20 lines (no held-out pairs) --eval-every 1 saves after
    // every step without evaluating
    const char *nan_ckpt = test_path("nan.ckpt");
    check_cli_error("a loss that becomes NaN or infinite", "(step 1), is left as it was",
                    "train --train %s --steps 50 --lr 1e30 --checkpoint %s " TINY_MINIMAL_RUN
                    " --eval-every 1 --show 0", tsv, nan_ckpt);
    status = run_cli("decode --checkpoint %s 'a b'", nan_ckpt);
    check(status == 0, "cli: ... and that checkpoint still loads (exit %d)", status);
}

static void test_eval_bleu(const Transformer *trained_model, const char *ckpt) {
    // 8 copy pairs; the references of two are changed, so a perfect copier scores below 100
    Transformer m = *trained_model;
    m.training = 0;
    Rng rng;
    rng_seed(&rng, 77);
    char tsv[2048] = "";
    BleuStats expected;
    bleu_reset(&expected);
    int exact = 0;
    for (int i = 0; i < 8; i++) {
        int n = 3 + i % 4, src[8], ref[8], out[32], out_len;
        random_source(src, n, m.config.vocab_size, &rng);         // n-1 words and </s>
        int ref_len = n - 1;
        memcpy(ref, src, ref_len * sizeof(int));
        if (i == 2)
            ref_len--;   // a word missing
        if (i == 5)
            ref[0] = ref[0] == 4 ? 5 : 4;   // a word changed
        lab_greedy_decode(&m, out, &out_len, transformer_decode_limit(&m, n),
                                  src, &n, 1, n);
        bleu_add_sentence(&expected, out, out_len, ref, ref_len);
        exact += out_len == ref_len && memcmp(out, ref, ref_len * sizeof(int)) == 0;
        for (int k = 0; k < n - 1; k++)
            sprintf(tsv + strlen(tsv), "%s%d", k ? " " : "", src[k] - NUM_SPECIAL_TOKENS);
        strcat(tsv, "\t");
        for (int k = 0; k < ref_len; k++)
            sprintf(tsv + strlen(tsv), "%s%d", k ? " " : "", ref[k] - NUM_SPECIAL_TOKENS);
        strcat(tsv, "\n");
    }
    double want = bleu_score(&expected, NULL, NULL);
    const char *path = test_path("bleu.tsv");
    write_text(path, tsv);
    int status = run_cli("eval --checkpoint %s --data %s --bleu", ckpt, path);
    double got = printed_number_after(cli_output, "BLEU            ");
    check(status == 0 && fabs(got - want) <= 0.005 + 1e-9 && want > 0 && want < 100,
          "cli: eval --bleu prints %.2f, the BLEU of the outputs decoded one by one (%.4f; %d/8 "
          "exact)", got, want, exact);
    // which BLEU it is, in sacreBLEU's signature, and the precisions to two decimals as sacreBLEU
    // gives them
    char precisions[64];
    snprintf(precisions, sizeof precisions, "precisions %.2f/%.2f/%.2f/%.2f,",
             100.0 * expected.matches[0] / expected.totals[0],
             100.0 * expected.matches[1] / expected.totals[1],
             100.0 * expected.matches[2] / expected.totals[2],
             100.0 * expected.matches[3] / expected.totals[3]);
    check(strstr(cli_output, "(nrefs:1|case:mixed|eff:no|tok:none|smooth:none; ") &&
          strstr(cli_output, precisions),
          "cli: eval --bleu names what it computed, sacreBLEU's signature "
          "nrefs:1|case:mixed|eff:no|tok:none|smooth:none, and its %s", precisions);
    status = run_cli("eval --checkpoint %s --data %s --bleu --beam 3", ckpt, path);
    got = printed_number_after(cli_output, "BLEU            ");
    check(status == 0 && strstr(cli_output, "beam search") && got >= 0 && got <= 100,
          "cli: eval --bleu --beam 3 prints a BLEU score (%.2f)", got);
    status = run_cli("eval --checkpoint %s --data %s", ckpt, path);
    check(status == 0 && !strstr(cli_output, "BLEU"),
          "cli: eval without --bleu prints no BLEU line");
    check_cli_error("a value after the --bleu flag", "eval: unexpected argument 'yes'",
                    "eval --checkpoint %s --data %s --bleu yes", ckpt, path);
}

// A new run does not replace another run's checkpoint unless asked (--force).
static void test_existing_checkpoint(void) {
    const char *tsv = test_path("existing.tsv"), *ckpt = test_path("existing.ckpt");
    write_text(tsv, "a b\tb a\nc d e\te d c\na a\ta a\nb c\tc b\n");
    int status = run_cli("train --train %s --steps 3 --checkpoint %s " TINY_MINIMAL_RUN, tsv, ckpt);
    size_t size;
    unsigned char *before = read_file(ckpt, &size);
    check(status == 0 && before, "cli: a 3-step run writes its checkpoint (exit %d)", status);
    if (!before)
        return;
    check_cli_error("a new run onto another run's checkpoint",
                    "existing.ckpt is already there (another run's checkpoint?); expected --resume",
                    "train --train %s --steps 2 --checkpoint %s " TINY_MINIMAL_RUN, tsv, ckpt);
    size_t after_size;
    unsigned char *after = read_file(ckpt, &after_size);
    check(after && after_size == size && memcmp(before, after, size) == 0,
          "cli: ... and the checkpoint is untouched");
    free(after);
    status = run_cli("train --train %s --steps 2 --force --checkpoint %s " TINY_MINIMAL_RUN,
                     tsv, ckpt);
    check(status == 0 && lab_file_step(ckpt) == 2,
          "cli: --force replaces it (now at step %ld; exit %d)",
          lab_file_step(ckpt), status);
    status = run_cli("train --help");
    check(status == 0 && strstr(cli_output, "--force"), "cli: train --help lists --force");
    free(before);
    // a path no checkpoint can take is refused before training, not after it (the audit found
    // both trained to the end and failed at the save)
    check_cli_error("an empty --checkpoint", "--checkpoint '': expected a file's path",
                    "train --train %s --steps 2 --checkpoint '' " TINY_MINIMAL_RUN, tsv);
    const char *directory = test_path("a_directory");
    mkdir(directory, 0700);
    check_cli_error("a directory as --checkpoint, --force",
                    "a_directory: not a regular file; expected a checkpoint's path",
                    "train --train %s --steps 2 --force --checkpoint %s " TINY_MINIMAL_RUN,
                    tsv, directory);
}


// The text rule (lab/text.c) in every command: a byte-order mark, the special tokens' text in
// data, bytes that are not UTF-8 in training data, held-out data, arguments and standard input.
static void test_text_rule(const char *ckpt) {
    // a byte-order mark: not part of the first token
    const char *bom = test_path("bom.tsv"), *bom_ckpt = test_path("bom.ckpt");
    write_text(bom, "\xEF\xBB\xBFq r\tr q\nr s\ts r\n");
    int status = run_cli("train --train %s --steps 1 --checkpoint %s " TINY_MINIMAL_RUN,
                         bom, bom_ckpt);
    int status2 = run_cli("decode --checkpoint %s 'q r'", bom_ckpt);
    check(status == 0 && status2 == 0 && !strstr(cli_output, "not in the vocabulary"),
          "cli: a UTF-8 byte-order mark is stripped: 'q' is in the vocabulary (exit %d, %d)",
          status, status2);
    // the special tokens' text in data is refused
    write_text(test_path("special.tsv"), "a b\tb a\nc <s> d\td c\n");
    check_cli_error("<s> in training data",
                    "special.tsv:2: the token '<s>' is reserved (<pad> <s> </s> <unk>",
                    "train --train %s --steps 1 --checkpoint %s " TINY_MINIMAL_RUN,
                    test_path("special.tsv"), test_path("special.ckpt"));
    write_text(test_path("special_eval.tsv"), "1 2\t1 2\n1\t1 <unk>\n");
    check_cli_error("<unk> in held-out data", "special_eval.tsv:2: the token '<unk>' is reserved",
                    "eval --checkpoint %s --data %s", ckpt, test_path("special_eval.tsv"));
    check_cli_error("</s> in a sentence to decode", "argument 1: the token '</s>' is reserved",
                    "decode --checkpoint %s '1 </s> 2'", ckpt);
    // one rule for text (issue 34): every input is UTF-8, and a byte that is not is refused with
    // its file and line, or argument, in every command: Latin-1's é, a lone continuation byte, a
    // zero byte
    write_text(test_path("latin1.tsv"), "1 2\t1 2\ncaf\xe9 1\t1\n");
    check_cli_error("a training file in Latin-1",
                    "latin1.tsv:2: byte 4 of the line, 0xe9, is not UTF-8; expected UTF-8 text",
                    "train --train %s --steps 1 --checkpoint %s " TINY_MINIMAL_RUN,
                    test_path("latin1.tsv"), test_path("latin1.ckpt"));
    check(access(test_path("latin1.ckpt"), F_OK) != 0, "cli: ... and no checkpoint is written");
    check_cli_error("held-out data in Latin-1",
                    "latin1.tsv:2: byte 4 of the line, 0xe9, is not UTF-8",
                    "eval --checkpoint %s --data %s", ckpt, test_path("latin1.tsv"));
    write_file(test_path("zero.tsv"), "1 2\t1 2\n3\t3\0\n", 13);
    check_cli_error("a zero byte in held-out data", "zero.tsv:2: a zero byte; expected text",
                    "eval --checkpoint %s --data %s", ckpt, test_path("zero.tsv"));
    check_cli_error("a sentence to decode that is not UTF-8",
                    "decode: argument 2: byte 3 of the line, 0x80, is not UTF-8",
                    "decode --checkpoint %s '1 2' \"$(printf '1 \\200')\"", ckpt);
    write_text(test_path("latin1_stdin.txt"), "1 2\n3 \xff\n2 1\n");
    status = run_cli("decode --checkpoint %s < %s", ckpt, test_path("latin1_stdin.txt"));
    check(status == 1 &&
          strstr(cli_output, "error: decode: stdin:2: byte 3 of the line, 0xff, is not UTF-8") &&
          count_lines_starting(cli_output, "error:") == 1,
          "cli: decode from stdin refuses line 2, not UTF-8, "
          "decodes lines 1 and 3 and exits 1 (exit %d)", status);
}

// The lab's decode reads standard input when it is given no sentence (transformer.c's decode
// does not): a stream goes on past a line it cannot take, which gets an error line and an empty
// output line; a zero byte is refused; a read that fails is not the end of the stream.
static void test_decode_stdin(const char *ckpt) {
    write_file(test_path("zero_stdin.txt"), "1 2\n3\0 1\n", 9);
    int status = run_cli("decode --checkpoint %s < %s", ckpt, test_path("zero_stdin.txt"));
    check(status == 1 && strstr(cli_output, "error: decode: stdin:2: a zero byte; expected text") &&
          count_lines_starting(cli_output, "error:") == 1,
          "cli: decode from stdin refuses line 2, with a zero byte, and exits 1 (exit %d)", status);
    char lines[600] = "1 2 3\n";
    for (int i = 0; i < 25; i++) strcat(lines, "1 ");
    strcat(lines, "\n<pad>\n3 2 1\n");
    write_text(test_path("stream.txt"), lines);
    status = run_cli("decode --checkpoint %s < %s", ckpt, test_path("stream.txt"));
    const char *e1 = strstr(cli_output, "error: decode: stdin:2: the sentence has 25 tokens");
    const char *e2 = strstr(cli_output, "error: decode: stdin:3: the token '<pad>' is reserved");
    int lines_out = count_lines_starting(cli_output, "");
    int errors = count_lines_starting(cli_output, "error:");
    int empty = count_lines_starting(cli_output, "\n") + (cli_output[0] == '\n');
    check(status == 1 && e1 && e2 && errors == 2 && lines_out == 6 && empty == 2,
          "cli: decode from stdin reports lines 2 and 3 (too long, <pad>), prints an empty line "
          "for each, decodes lines 1 and 4 and exits 1 (exit %d, %d lines, %d errors)",
          status, lines_out, errors);
    check_cli_error("decode of a directory on stdin", "decode: stdin: read error",
                    "decode --checkpoint %s < /tmp", ckpt);
}

// With §5.1 merges a word may be several subwords: decode counts the tokens the model reads
// against its positions, not the words (a sentence of 3 words and 10 subwords read past a
// 4-position table once; the checkpoint fuzz target found it).
static void test_decode_subwords_too_long(void) {
    const char *tsv = test_path("short.tsv");
    const char *ckpt = test_path("p4.ckpt");
    write_text(tsv, "ab\tcd\nab\tcd\nab\tcd\ncd\tab\n");
    int status = run_cli("train --train %s --bpe 2 --steps 1 --positions 4 --layers 1 "
                         "--d-model 8 --d-ff 8 --heads 2 --eval-every 0 --show 0 --force "
                         "--checkpoint %s", tsv, ckpt);
    check(status == 0, "cli: a 4-position subword model (exit %d)", status);
    check_cli_error("a sentence of 3 words and more subwords than the model's positions",
                    "argument 1: the sentence has 10 tokens; the model's maximum length 4",
                    "decode --checkpoint %s 'abab cdcd ca'", ckpt);
}

// ============================================================================
// Many sentences decoded side by side (lab/decode.c's lab_decode_batch, lab/fast_path.c's
// BatchedDecoder) and decode's batches of standard input
// ============================================================================
#include <sys/wait.h>   // waitpid: decode answering each line of a pipe

// The batched decoder against decoding one sentence at a time: for a trained copy model, an
// untrained one and one whose logits hold NaNs (beam_propose's own ranking of NaNs), 20 sources
// of 0 to 8 words (0: </s> alone), greedy and beam 2 and 4, in batches of 1, 7 and 20, with the
// fast path's products and with Part I's loops: transformer.c's beam search's tokens, and its
// scores within 1e-12 (the log-sum-exp in vector lanes, lab/decode.c's row_candidates).
// Greedy decoding never chooses a NaN logit where a beam of one may (the lab's greedy_token,
// decode's greedy decoding before batches): with NaNs, batches of 7 and 20 give the tokens of
// batches of 1.
static void test_batched_decoding(void) {
    TransformerConfig config = decode_config();
    Transformer untrained;
    Transformer with_nan;
    transformer_build(&untrained, &config, 23);
    transformer_build(&with_nan, &config, 24);
    with_nan.params.embedding[(size_t)5 * config.d_model] = NAN;   // token 5's logit, and
                                                                   // every row that reads it
    Transformer *models[3] = { trained_copy_model(), &untrained, &with_nan };
    enum { B = 20, S = 9, MAX_OUT = 20 };
    int src[B * S] = { 0 }, src_len[B];
    Rng rng;
    rng_seed(&rng, 61);
    for (int b = 0; b < B; b++) {
        src_len[b] = 1 + b % S;
        random_source(src + b * S, src_len[b], config.vocab_size, &rng);
    }
    int beams[3] = { 1, 2, 4 };
    int per_batch[3] = { 1, 7, B };
    int cases = 0, same = 0, copied = 0;
    for (int fast = 1; fast >= 0; fast--) {
        fast_path_use(fast);
        for (int k = 0; k < 3; k++) {
            for (int i = 0; i < 3; i++) {
                int ref[B][MAX_OUT], ref_len[B];
                double ref_score[B];
                int greedy_nan = k == 2 && beams[i] == 1;
                for (int b = 0; b < B && !greedy_nan; b++) {
                    ref_len[b] = transformer_beam_search(models[k], ref[b], &ref_score[b],
                                                         src + b * S, src_len[b], beams[i], 0.6);
                    copied += fast && k == 0 && i == 0 && ref_len[b] == src_len[b] - 1 &&
                              memcmp(ref[b], src + b * S, ref_len[b] * sizeof(int)) == 0;
                }
                for (int p = 0; p < 3; p++) {
                    int out[B * MAX_OUT], out_len[B];
                    double score[B];
                    Search search = { beams[i], 0.6 };
                    for (int first = 0; first < B; first += per_batch[p]) {
                        int n = min_int(per_batch[p], B - first);
                        Outputs o = { out + first * MAX_OUT, out_len + first, score + first,
                                      MAX_OUT };
                        lab_decode_batch(models[k], o, src + first * S, src_len + first, n, S,
                                         search);
                    }
                    for (int b = 0; b < B && greedy_nan && p == 0; b++) {
                        ref_len[b] = out_len[b];
                        memcpy(ref[b], out + b * MAX_OUT, out_len[b] * sizeof(int));
                    }
                    for (int b = 0; b < B && !(greedy_nan && p == 0); b++) {
                        int tokens = out_len[b] == ref_len[b] &&
                                     memcmp(out + b * MAX_OUT, ref[b],
                                            ref_len[b] * sizeof(int)) == 0;
                        double miss = fabs(score[b] - ref_score[b]);
                        int scores = beams[i] == 1 || score[b] == ref_score[b] ||
                                     miss <= 1e-12 * fabs(ref_score[b]) ||
                                     memcmp(&score[b], &ref_score[b], sizeof(double)) == 0;
                        same += tokens && scores;
                        cases++;
                    }
                }
            }
        }
    }
    fast_path_use(1);
    check(same == cases && copied >= B / 4,
          "decode: the batched decoder gives transformer.c's beam search's tokens, and its scores "
          "within 1e-12, "
          "sentence for sentence: %d of %d (a trained model, whose greedy outputs copy %d of %d "
          "sources; an untrained one; one with NaN logits; greedy, beam 2 and 4; batches of 1, 7 "
          "and 20; the fast path and Part I's loops)", same, cases, copied, B);
    transformer_free(&untrained);
    transformer_free(&with_nan);
}

// decode's batches as a user meets them (the small trained copy checkpoint): a file of 40
// lines, among them an empty line, one too long for the model, one not UTF-8 and one with a
// reserved token, decoded greedily and with beam 4, one sentence at a time
// (--batch-sentences 1), 3 at a time and as many as decode takes: the same output, an error
// line naming each bad line and what was expected, an empty output line for it and for the
// empty line, every other line translated in order, and exit status 1.
static void test_decode_batches(const char *ckpt) {
    const char *path = test_path("batches_stdin.txt");
    FILE *f = fopen(path, "w");
    Rng rng;
    rng_seed(&rng, 62);
    for (int line = 1; line <= 40 && f; line++) {
        if (line == 7)
            fputs("", f);
        else if (line == 12)
            for (int i = 0; i < 25; i++) fputs("1 ", f);
        else if (line == 20)
            fputs("1 \xff 2", f);
        else if (line == 33)
            fputs("3 <s> 1", f);
        else
            for (int i = 0, n = 1 + (int)rng_below(&rng, 8); i < n; i++)
                fprintf(f, "%s%d", i ? " " : "", (int)rng_below(&rng, 6));
        fputs("\n", f);
    }
    if (f)
        fclose(f);
    static char first[1 << 16];
    int same = 1, good = 1;
    for (int beam = 1; beam <= 4; beam += 3) {
        int batches[3] = { 1, 3, DECODE_BATCH_SENTENCES };
        for (int i = 0; i < 3; i++) {
            int status = run_cli("decode --checkpoint %s --beam %d --batch-sentences %d < %s",
                                 ckpt, beam, batches[i], path);
            if (i == 0)
                snprintf(first, sizeof first, "%s", cli_output);
            same &= strcmp(first, cli_output) == 0;
            int lines = count_lines_starting(cli_output, "");
            int errors = count_lines_starting(cli_output, "error:");
            int empty = count_lines_starting(cli_output, "\n") + (cli_output[0] == '\n');
            good &= status == 1 && lines == 40 + 3 && errors == 3 && empty == 4 &&
                    strstr(cli_output, "error: decode: stdin:12: the sentence has 25 tokens") &&
                    strstr(cli_output, "error: decode: stdin:20: byte 3 of the line") &&
                    strstr(cli_output, "error: decode: stdin:33: the token '<s>' is reserved");
        }
    }
    check(same && good,
          "cli: decode of 40 lines (an empty one, one too long, one not UTF-8, one with <s>), "
          "greedy and beam 4, 1, 3 and %d sentences side by side: the same lines, an error line "
          "naming each bad line, an empty output line for it, exit status 1",
          DECODE_BATCH_SENTENCES);
}

// A line that has come, read from a pipe whose writer waits: within 30 s, or NULL.
static char *read_answer(int fd, char *buffer, size_t size) {
    size_t used = 0;
    double start = wall_seconds();
    while (used + 1 < size && wall_seconds() - start < 30) {
        struct pollfd p = { fd, POLLIN, 0 };
        if (poll(&p, 1, 1000) <= 0)
            continue;
        ssize_t n = read(fd, buffer + used, 1);
        if (n <= 0)
            break;
        used++;
        if (buffer[used - 1] == '\n') {
            buffer[used] = '\0';
            return buffer;
        }
    }
    return NULL;
}

// Streaming: decode answers a line of standard input before the next one comes (as a line
// typed at a terminal): its writer sends a line and waits for the answer before sending the
// next, and the stream still ends with exit status 0.
static void test_decode_answers_each_line(const char *ckpt) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) {
        check(0, "cli: pipes for decode (%s)", strerror(errno));
        return;
    }
    char command[1200];
    snprintf(command, sizeof command, "%s decode --checkpoint %s 2>/dev/null", cli_binary, ckpt);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(to_child[0], 0);
        dup2(from_child[1], 1);
        close(to_child[1]);
        close(from_child[0]);
        execl("/bin/sh", "sh", "-c", command, (char *)NULL);
        _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    // a decode that died: a failed check below, not the end of the tests by SIGPIPE
    void (*was)(int) = signal(SIGPIPE, SIG_IGN);
    char first[256], second[256];
    int sent = write(to_child[1], "1 2 3\n", 6) == 6;
    char *a = read_answer(from_child[0], first, sizeof first);
    sent &= write(to_child[1], "4 0\n", 4) == 4;
    char *b = read_answer(from_child[0], second, sizeof second);
    close(to_child[1]);
    signal(SIGPIPE, was);
    int status = -1;
    waitpid(pid, &status, 0);
    close(from_child[0]);
    check(sent && a && b && strcmp(first, "1 2 3\n") == 0 && strcmp(second, "4 0\n") == 0 &&
              WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "cli: decode answers each line of a pipe before the next comes ('%s', '%s'; exit %d)",
          a ? "1 2 3" : "no answer", b ? "4 0" : "no answer",
          WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

// The tests of lab/text.c and eval that run ./transformer, after transformer.c's own
// (run_command_line_tests), whose small copy checkpoint they use.
static void test_text_and_eval_commands(void) {
    printf("-- the lab's text and eval: TSV files, the text rule, eval --bleu, --force\n");
    test_tsv_command_line();
    const char *ckpt = test_path("copy_small.ckpt");
    if (!file_exists(ckpt)) {
        check(0, "cli: no checkpoint %s from transformer.c's tests", ckpt);
        return;
    }
    test_decode_stdin(ckpt);
    test_decode_batches(ckpt);
    test_decode_answers_each_line(ckpt);
    test_decode_subwords_too_long();
    test_eval_bleu(trained_copy_model(), ckpt);
    test_existing_checkpoint();
    test_text_rule(ckpt);
}

// ---- explain (lab/explain.c): one sentence through the model, on one page ------------------

// A copy of src (S ids, </s> last) decoded by explain (beam 1: greedy).
static void explain_ids(Explanation *x, Transformer *m, const int *src, int S, int beam) {
    memset(x, 0, sizeof *x);
    x->src = checked_calloc((size_t)S, sizeof(int), "test");
    memcpy(x->src, src, (size_t)S * sizeof(int));
    x->S = S;
    explain_decode(x, m, beam, 0.6);
}

// explain decodes as decode does: greedy as lab_greedy_decode (decode's greedy), beam 4 as
// transformer_beam_search (decode --beam 4), the same tokens and (beam) the same score bit for
// bit, on the trained copy model and an untrained one (whose outputs run to the length limit:
// the hypotheses cut there), 20 sources each; and the winner's path runs through every step
// up to the one that finished the output.
static void test_explain_decodes_as_decode(void) {
    TransformerConfig config = decode_config();
    Transformer untrained;
    transformer_build(&untrained, &config, 17);
    Transformer *models[2] = { trained_copy_model(), &untrained };
    Rng rng;
    rng_seed(&rng, 62);
    int sentences = 0, same_greedy = 0, same_beam = 0, ended = 0, cut = 0, paths = 0;
    for (int k = 0; k < 2; k++) {
        Transformer *m = models[k];
        for (int i = 0; i < 20; i++) {
            int src[8], S = 2 + i % 6;
            random_source(src, S, m->config.vocab_size, &rng);
            int limit = transformer_decode_limit(m, S), greedy[32], greedy_len, beam[32];
            double score;
            lab_greedy_decode(m, greedy, &greedy_len, limit, src, &S, 1, S);
            int beam_len = transformer_beam_search(m, beam, &score, src, S, 4, 0.6);
            Explanation x, y;
            explain_ids(&x, m, src, S, 1);
            explain_ids(&y, m, src, S, 4);
            same_greedy += x.out_len == greedy_len &&
                           !memcmp(x.out, greedy, greedy_len * sizeof(int));
            same_beam += y.out_len == beam_len && y.score == score &&
                         !memcmp(y.out, beam, beam_len * sizeof(int));
            ended += x.winner_ended + y.winner_ended;
            cut += !x.winner_ended + !y.winner_ended;
            for (int e = 0; e < 2; e++) {
                Explanation *z = e ? &y : &x;
                int on_path = 1;
                for (int t = 0; t < z->num_steps; t++)
                    on_path &= (t <= z->winner_step) == (z->steps[t].path_row >= 0);
                paths += on_path && z->steps[z->winner_step].num_kept > 0;
            }
            sentences++;
            explain_free(&x);
            explain_free(&y);
        }
    }
    check(same_greedy == sentences && same_beam == sentences && ended > 0 && cut > 0,
          "explain: decodes as decode does, greedy (lab_greedy_decode: %d of %d the same) and "
          "beam 4 (transformer_beam_search: %d of %d the same tokens and score, bit for bit); "
          "%d outputs ended by </s>, %d cut at the length limit", same_greedy, sentences,
          same_beam, sentences, ended, cut);
    check(paths == 2 * sentences,
          "explain: the winner's path has a hypothesis in every step up to the one that "
          "finished the output, and none after (%d of %d)", paths, 2 * sentences);
    transformer_free(&untrained);
}

// The largest difference between the attention explain recorded along the winner's path and
// that of one teacher-forced pass over (source, output </s>), what `attention` draws, every
// layer and head; and between their encoders and inputs. -1 when the output did not end with
// </s> (the teacher-forced pass would need one position more).
static double explain_against_teacher_forcing(const Explanation *x, Transformer *m) {
    if (!x->winner_ended)
        return -1;
    size_t L = m->config.n_layers, NH = m->config.n_heads, C = m->config.d_model, S = x->S;
    int T = x->out_len + 1, src_len = x->S, tgt_len = T;
    int *tgt_in = checked_calloc((size_t)T, sizeof(int), "test");
    int *tgt_out = checked_calloc((size_t)T, sizeof(int), "test");
    tgt_in[0] = TOKEN_BOS;
    for (int t = 0; t < x->out_len; t++) {
        tgt_in[t + 1] = x->out[t];
        tgt_out[t] = x->out[t];
    }
    tgt_out[T - 1] = TOKEN_EOS;
    Batch batch = { 1, src_len, T, x->src, &src_len, tgt_in, tgt_out, &tgt_len };
    m->training = 0;
    transformer_forward(m, &batch);
    double worst = 0;
    for (size_t i = 0; i < S * C; i++)
        worst = fmax(worst, fabs(x->input[i] - m->acts.enc_embedded[i]));
    for (size_t l = 0; l < L; l++) {
        for (size_t i = 0; i < NH * S * S; i++)
            worst = fmax(worst, fabs(x->enc_att[l * NH * S * S + i] -
                                     m->acts.enc[l].self_attn.att[i]));
        for (int t = 0; t < T; t++) {
            const ExplainStep *step = &x->steps[t];
            for (size_t h = 0; h < NH; h++) {
                const real *self = m->acts.dec[l].self_attn.att + (h * T + t) * T;
                const real *cross = m->acts.dec[l].cross_attn.att + (h * T + t) * S;
                for (int j = 0; j <= t; j++)
                    worst = fmax(worst, fabs(step->self_att[(l * NH + h) * (t + 1) + j] - self[j]));
                for (size_t j = 0; j < S; j++)
                    worst = fmax(worst, fabs(step->cross_att[(l * NH + h) * S + j] - cross[j]));
            }
        }
    }
    free(tgt_in);
    free(tgt_out);
    return worst;
}

// Whether every row of n probabilities sums to 1 within `tolerance`, and its numbers as the page
// writes them (integers in 1/10,000, each rounded) within the rounding: n / 2 units.
static int explain_rows_sum_to_one(const real *p, size_t rows, size_t n, double tolerance) {
    int ok = 1;
    for (size_t r = 0; r < rows; r++) {
        double sum = 0;
        long units = 0;
        for (size_t j = 0; j < n; j++) {
            sum += p[r * n + j];
            units += lround((double)p[r * n + j] * EXPLAIN_UNITS);
        }
        ok &= fabs(sum - 1) <= tolerance && labs(units - EXPLAIN_UNITS) * 2 <= (long)n;
    }
    return ok;
}

// The attention the page shows is the model's: with transformer.c's own loops (fast_path_use(0))
// the winner's path gives the teacher-forced pass's numbers bit for bit, greedy and beam 4 (the
// winner's path is its output's prefix), and so do the encoder and the input; with the fast path
// (./transformer), to rounding. Every row of every attention matrix sums to 1, as the page
// rounds it too.
static void test_explain_attention(void) {
    Transformer *m = trained_copy_model();
    Rng rng;
    rng_seed(&rng, 63);
    double tolerance = sizeof(real) == sizeof(float) ? 1e-5 : 1e-12;
    double worst[2] = { 0, 0 };
    int compared = 0, rows_ok = 1;
    for (int i = 0; i < 12; i++) {
        int src[8], S = 2 + i % 6;
        random_source(src, S, m->config.vocab_size, &rng);
        for (int fast = 0; fast < 2; fast++) {
            fast_path_use(fast);
            for (int beam = 1; beam <= 4; beam += 3) {
                Explanation x;
                explain_ids(&x, m, src, S, beam);
                double d = explain_against_teacher_forcing(&x, m);
                worst[fast] = d < 0 ? worst[fast] : fmax(worst[fast], d);
                compared += d >= 0;
                size_t L = m->config.n_layers, NH = m->config.n_heads;
                rows_ok &= explain_rows_sum_to_one(x.enc_att, L * NH * S, S, tolerance);
                for (int t = 0; t <= x.winner_step; t++) {
                    rows_ok &= explain_rows_sum_to_one(x.steps[t].self_att, L * NH, t + 1,
                                                       tolerance);
                    rows_ok &= explain_rows_sum_to_one(x.steps[t].cross_att, L * NH, S,
                                                       tolerance);
                }
                explain_free(&x);
            }
        }
    }
    fast_path_use(1);
    check(compared >= 24 && worst[0] == 0 && worst[1] <= tolerance,
          "explain: each step's attention (every layer and head, self and over the source), the "
          "encoder's and the input are the teacher-forced pass's (%d decodings, greedy and "
          "beam 4): transformer.c's loops bit for bit (largest difference %g), the fast path to "
          "%g (%g)",
          compared, worst[0], tolerance, worst[1]);
    check(rows_ok, "explain: every row of every attention matrix sums to 1 within %g, and "
                   "within rounding as the page writes it (n/2 in 1/10,000)", tolerance);
}

// The merges explain shows for a word are the ones that cut it: replayed on its characters in
// the order recorded (each joining the symbol at its byte with the next, whose texts must be
// the merge's two sides), they give bpe_encode_word's subwords.
static void test_explain_merges(void) {
    const char *learn[4] = { "low", "lower", "newest", "widest" };
    const char *words[6] = { "lowest", "newer", "widest", "lowlow", "élow", "x" };
    long counts[4] = { 5, 2, 6, 3 };
    Bpe b;
    bpe_init(&b);
    bpe_learn(&b, learn, counts, 4, 100);
    int same = 0, merges = 0;
    for (int w = 0; w < 6; w++) {
        const char *word = words[w];
        int n = (int)strlen(word), start[16], cut[16], scratch[16], rank[16], at[16];
        char text[32], symbols[16][32];
        BpeTrace trace = { rank, at, 0 };
        int count = bpe_encode_word_traced(&b, cut, word, n, scratch, text, &trace);
        int plain = bpe_encode_word(&b, start, word, n, scratch, text);
        int symbols_count = bpe_characters(start, word, n), replayed = 1;
        for (int i = 0; i < symbols_count; i++)
            bpe_symbol_text(symbols[i], word, start, symbols_count, i);
        for (int k = 0; k < trace.count && replayed; k++) {
            int i = 0;
            while (i + 1 < symbols_count && start[i] != at[k])
                i++;
            replayed = i + 1 < symbols_count && strcmp(symbols[i], b.left[rank[k]]) == 0 &&
                       strcmp(symbols[i + 1], b.right[rank[k]]) == 0;
            size_t left = strlen(symbols[i]), right = strlen(symbols[i + 1]);
            if (left + right < sizeof symbols[i])
                memmove(symbols[i] + left, symbols[i + 1], right + 1);   // joined
            else
                replayed = 0;
            for (int j = i + 1; j + 1 < symbols_count; j++) {
                memcpy(symbols[j], symbols[j + 1], sizeof symbols[j]);
                start[j] = start[j + 1];
            }
            symbols_count--;
        }
        replayed &= symbols_count == count && plain == count;
        for (int i = 0; i < count && replayed; i++) {
            char piece[32];
            bpe_symbol_text(piece, word, cut, count, i);
            replayed = strcmp(piece, symbols[i]) == 0;
        }
        same += replayed;
        merges += trace.count;
    }
    check(same == 6 && merges > 6,
          "explain: the merges recorded for 6 words (%d in all), replayed on the characters in "
          "order, give bpe_encode_word's subwords (%d of 6)", merges, same);
    bpe_free(&b);
}

// The page's numbers cannot end the <script> they sit in, whatever a token holds: no '<' (so
// neither "</script>" nor "<!--"), no U+2028 or U+2029, no control character; quotes and
// backslashes escaped; UTF-8 kept, a byte that is not UTF-8 as U+FFFD.
static void test_explain_json_string(void) {
    const char *path = test_path("json_string.txt");
    FILE *f = fopen(path, "wb");
    if (!f) {
        check(0, "explain: cannot write %s", path);
        return;
    }
    json_string(f, "</script><!--a\xe2\x80\xa8" "b\xe2\x80\xa9\"q\"\\ \x01&>é\xff");
    fclose(f);
    char *written = read_text_file(path);
    const char *expected = "\"\\u003c/script\\u003e\\u003c!--a\\u2028b\\u2029\\\"q\\\"\\\\ "
                           "\\u0001\\u0026\\u003eé\\ufffd\"";
    check(written && strcmp(written, expected) == 0,
          "explain: a token holding </script>, <!--, U+2028, U+2029, quotes, a backslash, a "
          "control character, & and > and a byte that is not UTF-8 is a JSON string with no '<' "
          "(%s)", written ? written : "not written");
    free(written);
}

// "output: LINE\nwrote " for decode's output line in cli_output (the line that is not a
// warning), as explain prints it.
static void explain_decoded_line(char *out, size_t size) {
    const char *line = cli_output;
    while (strncmp(line, "warning:", 8) == 0 && strchr(line, '\n'))
        line = strchr(line, '\n') + 1;
    snprintf(out, size, "output: %.*s\nwrote ", (int)strcspn(line, "\n"), line);
}

// The page's output against decode's, greedy and beam 4, through ./transformer as a user runs
// them; a word the vocabulary lacks is <unk>, with decode's warning, and on the page; each
// bad input is one line and exit 1, with no page and no temporary file left; a page of ours is
// replaced, any other file only with --force, never a directory.
static void test_explain_command(const char *ckpt) {
    const char *page = test_path("explain.html"), *tmp = test_path("explain.html.tmp");
    const char *sentences[3] = { "3 1 4 1 5", "2 0", "5 4 3 2 1 0 1" };
    int same = 0;
    for (int i = 0; i < 6; i++) {
        const char *beam = i % 2 ? "--beam 4" : "";
        run_cli("decode --checkpoint %s %s '%s'", ckpt, beam, sentences[i / 2]);
        char decoded[256];
        explain_decoded_line(decoded, sizeof decoded);
        int status = run_cli("explain --checkpoint %s %s --out %s '%s'", ckpt, beam, page,
                             sentences[i / 2]);
        char *html = read_text_file(page);
        same += status == 0 && strstr(cli_output, decoded) && html && strstr(html, "\"tokens\":");
        free(html);
    }
    check(same == 6, "cli: explain's output is decode's, greedy and --beam 4, for 3 sentences "
                     "(%d of 6)", same);
    // a sentence that begins with '-' comes on standard input, as decode's lines do
    const char *dash = test_path("dash.txt");
    write_text(dash, "-x 1 2\n");
    run_cli("decode --checkpoint %s < %s", ckpt, dash);
    char decoded[256];
    explain_decoded_line(decoded, sizeof decoded);
    int status = run_cli("explain --checkpoint %s --out %s < %s", ckpt, page, dash);
    check(status == 0 && strstr(cli_output, decoded) &&
          strstr(cli_output, "warning: stdin:1: token '-x' is not in the vocabulary"),
          "cli: a sentence on standard input (one that begins with '-') is explained as decode "
          "decodes its line (exit %d)", status);
    status = run_cli("explain --checkpoint %s --out %s '1 9 2'", ckpt, page);
    char *html = read_text_file(page);
    check(status == 0 && html &&
          strstr(cli_output, "warning: the sentence: token '9' is not in the vocabulary; read as "
                             "<unk>") &&
          strstr(html, "\"source\":[5,3,6,2]") && strstr(html, "\"source_text\":[\"1\",\"9\","),
          "cli: a word the vocabulary lacks is <unk>, warned of as decode warns, and the page "
          "shows it as such (exit %d)", status);
    free(html);
    remove(page);
    char too_long[128] = "";
    for (int i = 0; i < 25; i++) strcat(too_long, "1 ");
    struct {
        const char *what, *expected, *args;
    } bad[] = {
        { "an empty sentence", "explain: the sentence is empty", "''" },
        { "--beam 0", "explain: --beam '0' is not valid", "--beam 0 '1 2'" },
        { "a sentence too long for the model", "the sentence has 25 tokens; the model's maximum "
          "length 20", too_long },
        { "no sentence (standard input empty)", "no sentence: expected one", "< /dev/null" },
        { "two sentences", "expected one sentence (in quotes) after the flags; got 2",
          "'1 2' '3 4'" },
        { "two lines on standard input", "standard input has more than one line", "< " },
    };
    const char *two_lines = test_path("two_lines.txt");
    write_text(two_lines, "1 2\n3 4\n");
    int left = 0;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char args[512];
        snprintf(args, sizeof args, "explain --checkpoint %s --out %s %s%s%s", ckpt, page,
                 i == 2 ? "'" : "", bad[i].args, i == 2 ? "'" : i == 5 ? two_lines : "");
        check_cli_error(bad[i].what, bad[i].expected, "%s", args);
        left += file_exists(page) || file_exists(tmp);
    }
    check_cli_error("an --out that cannot be written", "cannot write",
                    "explain --checkpoint %s --out %s/no/such/folder/page.html '1 2'", ckpt,
                    test_dir);
    check_cli_error("--out a directory", "not a regular file",
                    "explain --checkpoint %s --out %s '1 2'", ckpt, test_dir);
    const char *notes = test_path("notes.html");
    write_text(notes, "<p>a page of the user's own</p>\n");
    check_cli_error("--out a file that is not a page of ours",
                    "is already there and is not a page explain wrote; expected --force",
                    "explain --checkpoint %s --out %s '1 2'", ckpt, notes);
    char *kept = read_text_file(notes);
    int kept_whole = kept && strcmp(kept, "<p>a page of the user's own</p>\n") == 0;
    free(kept);
    check(left == 0 && kept_whole && !file_exists(test_path("notes.html.tmp")),
          "cli: after each bad input no page and no temporary file, and the user's file whole");
    int forced = run_cli("explain --checkpoint %s --out %s --force '1 2'", ckpt, notes);
    int again = run_cli("explain --checkpoint %s --out %s --beam 2 '2 1'", ckpt, notes);
    check(forced == 0 && again == 0 && explain_page_of_ours(notes),
          "cli: --force replaces a file that is not a page of ours, and a page of ours is "
          "replaced without it (exit %d, %d)", forced, again);
}

// The browser test runs in ./test_lab (float, OpenMP) only: one chromium launch in make test.
#if !defined(TRANSFORMER_DOUBLE) && defined(_OPENMP)

// The HTML-escaped text of a token as --dump-dom serializes a text node (&, <, >).
static void explain_dom_text(char *out, size_t size, const char *text) {
    size_t n = 0;
    for (const char *s = text; *s && n + 8 < size; s++) {
        const char *entity = *s == '&' ? "&amp;" : *s == '<' ? "&lt;" : *s == '>' ? "&gt;" : NULL;
        if (entity) {
            memcpy(out + n, entity, strlen(entity));
            n += strlen(entity);
        } else {
            out[n++] = *s;
        }
    }
    out[n] = '\0';
}

// The page in a real browser: Debian's chromium, headless, opens a page of a small model it
// trains here (the copy task on words that hold "</script>", "<!--", '&' and quotes, §5.1
// subwords, beam 3), in one launch that dumps the DOM after the scripts ran and takes a
// screenshot. The page's window.onerror writes a script error into the DOM (#explain-error);
// the console would say it on stderr (--enable-logging); the sections and the output's tokens
// must be there, and #explain-rendered, which the script adds last. When chromium is on the
// PATH; .ci/run installs it.
static void test_explain_in_browser(void) {
    if (system("command -v chromium > /dev/null 2>&1") != 0) {
        printf("skip explain in a browser: chromium is not on the PATH (apt-get install "
               "chromium; .ci/run installs it)\n");
        return;
    }
    const char *tsv = test_path("markup.tsv"), *ckpt = test_path("markup.ckpt");
    const char *page = test_path("markup.html");
    static const char *words[6] = { "</script>", "<!--", "a&b", "\"q\"", "-->", "x" };
    FILE *f = fopen(tsv, "w");
    Rng rng;
    rng_seed(&rng, 64);
    for (int i = 0; f && i < 300; i++) {
        char line[256] = "";
        int n = 1 + rng_below(&rng, 4);
        for (int w = 0; w < n; w++) {
            strcat(line, words[rng_below(&rng, 6)]);
            strcat(line, w + 1 < n ? " " : "");
        }
        fprintf(f, "%s\t%s\n", line, line);
    }
    if (f)
        fclose(f);
    int trained = run_cli("train --train %s --bpe 12 --steps 150 --layers 1 --d-model 32 "
                          "--d-ff 64 --heads 2 --warmup 20 --batch-tokens 400 --eval-every 0 "
                          "--show 0 --log-every 0 --threads 1 --force --checkpoint %s", tsv, ckpt);
    int explained = run_cli("explain --checkpoint %s --beam 3 --out %s '</script> <!-- a&b'",
                            ckpt, page);
    char *html = read_text_file(page);
    const char *data = html ? strstr(html, "id=\"explain-data\">") : NULL;
    const char *data_end = data ? strstr(data, "</script>") : NULL;
    int no_markup = data_end && !memchr(data + 18, '<', (size_t)(data_end - data - 18));
    check(trained == 0 && explained == 0 && no_markup,
          "browser: a page of a model of words holding </script> and <!-- (its numbers hold "
          "no '<': %s)", no_markup ? "none" : "some, or no page");
    char command[4096];
    snprintf(command, sizeof command,
             "timeout 120 chromium --headless %s --disable-gpu --no-first-run "
             "--user-data-dir=%s/chromium --enable-logging=stderr --v=0 "
             "--window-size=1280,1600 --screenshot=%s/explain.png --dump-dom file://%s "
             "> %s/dom.html 2> %s/chromium.log",
             geteuid() == 0 ? "--no-sandbox" : "", test_dir, test_dir, page, test_dir,
             test_dir);
    double started = wall_seconds();
    int status = system(command);
    double seconds = wall_seconds() - started;
    char *dom = read_text_file(test_path("dom.html"));
    char *log = read_text_file(test_path("chromium.log"));
    int sections = 0;
    static const char *ids[7] = { "words", "input", "encoder", "decoding", "output",
                                  "explain-rendered", "step-view" };
    for (int i = 0; dom && i < 7; i++) {
        char id[64];
        snprintf(id, sizeof id, "id=\"%s\"", ids[i]);
        sections += strstr(dom, id) != NULL;
    }
    LabCheckpoint c;
    memset(&c, 0, sizeof c);
    const char *e = lab_checkpoint_load(ckpt, &c);
    int tokens = 0, outputs = 0;
    if (!e && dom) {
        TextSource from = { "test", 0, 0, NULL };
        Explanation x;
        memset(&x, 0, sizeof x);
        char sentence[] = "</script> <!-- a&b";
        if (!explain_sentence(&x, &c, sentence, &from)) {
            explain_decode(&x, &c.model, 3, 0.6);
            for (int i = 0; i < x.out_len; i++) {
                char text[256], expected[320];
                explain_dom_text(text, sizeof text, c.vocab.words[x.out[i]]);
                snprintf(expected, sizeof expected, "data-id=\"%d\">%s</span>", x.out[i], text);
                tokens += strstr(dom, expected) != NULL;
            }
            outputs = x.out_len;
        }
        explain_free(&x);
    }
    lab_checkpoint_free(&c);
    struct stat shot;
    int screenshot = stat(test_path("explain.png"), &shot) == 0 && shot.st_size > 10000;
    int error_shown = dom && strstr(dom, "id=\"explain-error\"");
    int console = log && strstr(log, "CONSOLE");
    check(status == 0 && !error_shown && !console && sections == 7 && outputs > 0 &&
          tokens == outputs && screenshot,
          "browser: headless chromium renders the page (%.1f s, exit %d): no script error in "
          "the DOM (%s) nor on the console (%s), the 5 sections, the step view and the "
          "rendered mark (%d of 7), the output's %d tokens (%d found), a screenshot (%s)",
          seconds, status, error_shown ? "one" : "none", console ? "some" : "none", sections,
          outputs, tokens, screenshot ? "taken" : "none");
    if (error_shown)
        printf("     %.300s\n", strstr(dom, "id=\"explain-error\""));
    free(html);
    free(dom);
    free(log);
}

#else
static void test_explain_in_browser(void) {
    printf("(explain in a browser: ./test_lab runs it, not this build)\n");
}
#endif

// explain's tests that run ./transformer, on transformer.c's tests' copy checkpoint.
static void test_explain_commands(void) {
    printf("-- explain: one sentence through the model on one page (lab/explain.c)\n");
    test_explain_json_string();
    const char *ckpt = test_path("copy_small.ckpt");
    if (file_exists(ckpt))
        test_explain_command(ckpt);
    else
        check(0, "cli: no checkpoint %s from transformer.c's tests", ckpt);
    test_explain_in_browser();
}

// ============================================================================
// The lab's tests, in order
// ============================================================================

#include "test_ranks.c"   // mpirun -np N ./transformer train (lab/ranks.c)

static void run_lab_tests(void) {
    printf("-- the lab's pictures (SVG)\n");
    test_svg_heatmap();
    test_svg_positional_encoding();
    test_svg_attention();
    test_svg_loss_curve();
    printf("-- evaluation: §6.1 BLEU (lab/bleu.c)\n");
    test_bleu();
    printf("-- §5.1 byte-pair encoding\n");
    test_bpe_learn_and_apply();
    test_bpe_learn_against_reference();
    test_bpe_numbers_data();
    test_bpe_cache();
    test_evaluation_progress_lines();
    test_progress_lines();
    test_parameter_groups();
    printf("-- no empty translation (min_len 1), greedy and beam\n");
    test_no_empty_translation();
    test_greedy_as_beam_of_one();
    test_batched_decoding();
    printf("-- explain: decode's decoding, recorded; the attention the page shows\n");
    test_explain_decodes_as_decode();
    test_explain_attention();
    test_explain_merges();
    printf("-- the busy machine: train --threads 0 follows the free cores\n");
    test_free_cores();
    if (!make_test_dir())
        return;
    printf("-- files in %s\n", test_dir);
    test_tsv_reading();
    test_bpe_checkpoint();
    printf("-- message catalogs (lab/catalogs.c): .mo files built here\n");
    test_catalog_format();
    test_catalog_filters();
    test_catalog_duplicates();
    test_catalog_damage();
    test_tsv_held_out_while_reading();
    test_bpe_word_counts();
    test_bpe_counting_parts();
    test_bpe_cutting_on_threads();
    if (cli_binary_found("./transformer")) {
        test_catalogs_command();
        test_batch_log();
        run_command_line_tests();   // transformer.c's commands, through ./transformer
        test_text_and_eval_commands();
        printf("-- the lab's command line: train's further flags, average, bleu, attention, pe, "
               "plot, params\n");
        test_lab_command_line();
        test_resume_counts();
        test_lab_evaluation_commands();
        test_explain_commands();
        test_bpe_command_line();
        printf("-- Table 3's model variations (make table3) on a tiny budget\n");
        test_table3();
        test_lab_reads_minimal_checkpoints();
        printf("-- checkpoints: the run after the model, version 3\n");
        test_checkpoint_run_part();
        test_version_3_checkpoints();
        run_rank_tests();
    }
    remove_test_dir();
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--lab") == 0)   // this build's ./transformer (test_ranks.c's
        return transformer_lab_main(argc - 1, argv + 1);   // double program)
    fast_path_use(1);   // as make's ./transformer runs: Part I's products through lab/fast_path.c
    fast_path_switch = fast_path_use;   // the tests worked by hand run through Part I's loops and
                                        // the fast path
    printf("-- the fast path (lab/fast_path.c) against transformer.c's loops\n");
    test_fast_aligned_memory();
    test_matmul_against_plain_loops();
    test_matmul_thread_count();
    test_decoding_weights();
    test_decoding_hook();
    test_key_value_cache();
    test_fast_linear();
    test_fast_attention();
    test_fast_dispatch();
    test_fast_training_step();
    printf("-- transformer.c's Part I again, through the fast path (test_transformer.c's "
           "run_model_tests)\n");
    run_model_tests();
    run_lab_tests();
    printf("%d passed, %d failed\n", tests_passed, tests_failed);
    return tests_failed ? 1 : 0;
}
