/* lab/test_lab.c: the proofs of the lab (lab/lab.c) and of the fast path (lab/fast_path.c)
 *
 * The fast path against transformer.c's loops: the matrix product against
 * plain loops for every shape and form, any thread count giving the same
 * bits, the linear layers and attention element by element (to rounding),
 * the dispatch reaching it, and whole training steps. Built by make test
 * in double, in float, and in float without OpenMP. Ends with
 * "N passed, M failed".
 */
#define TRANSFORMER_NO_MAIN
#include "lab.c"                      // transformer.c, the fast path and the lab
#define TEST_TRANSFORMER_LIBRARY
#include "../test_transformer.c"      // check(), test batches and configurations, transformer.c's tests
#ifdef TRANSFORMER_PLAIN
#error "the lab's tests test the fast path: build without -DTRANSFORMER_PLAIN"
#endif

// Random A (rows, depth) and B (depth, cols) for a product of the given
// form, as the layers store them: form 0, A (rows, depth) and B stored as
// (cols, depth), i.e. x W^T; form 1, both row-major, dy W; form 2, A stored
// as (depth, rows), i.e. dy^T x. The caller frees av->data and bv->data.
static void random_operands(MatrixView *av, MatrixView *bv, int form, int M, int N, int depth, Rng *rng) {
    real *a = checked_calloc((size_t)M * depth, sizeof(real), "test"), *b = checked_calloc((size_t)depth * N, sizeof(real), "test");
    for (size_t i = 0; i < (size_t)M * depth; i++) a[i] = (real)rng_normal(rng);
    for (size_t i = 0; i < (size_t)depth * N; i++) b[i] = (real)rng_normal(rng);
    *av = (MatrixView){ a, (size_t)depth, 1 };
    *bv = (MatrixView){ b, (size_t)N, 1 };
    if (form == 0) { bv->row_stride = 1; bv->col_stride = (size_t)depth; }
    if (form == 2) { av->row_stride = 1; av->col_stride = (size_t)M; }
}

// Part II's matrix product works in TILE_ROWS x TILE_COLS tiles, or narrow
// tiles NARROW_ROWS x NARROW_COLS for at most NARROW_COLS columns, blocks of
// DEPTH_BLOCK along the depth and WIDTH_BLOCK along the columns, shares rows
// among threads and turns a product of at most TILE_COLS rows around.
// The model tests above use tiny sizes, which never reach a second block, so
// here it is checked against a plain loop in double precision on sizes that
// cross every boundary, for the three ways the layers read their matrices
// (x W^T, dy W, dy^T x), every other product adding to out and the others
// writing out = bias + A B.
static void test_matmul_against_plain_loops(void) {
    enum { NM = 4, NN = 5, ND = 3 };
    int Ms[NM] = { 1, 7, 40, 97 }, Ns[NN] = { 1, NARROW_COLS, NARROW_COLS + 1, 33, 530 }, depths[ND] = { 1, 129, 300 };
    // and products with few columns (directly, and turned around) as deep as
    // the narrow tile's packing of the whole B holds, and deeper: those take
    // the wide path
    int extra[][3] = { { 40, 7, NARROW_MAX_DEPTH }, { 40, 7, NARROW_MAX_DEPTH + 5 }, { 7, 40, NARROW_MAX_DEPTH + 5 } };
    int grid = NM * NN * ND, shapes = grid + (int)(sizeof extra / sizeof *extra);
    Rng rng; rng_seed(&rng, 11);
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
        if (accumulate) matmul((MatrixProduct){ c, (size_t)N, 1, av, bv, { NULL, 0, 0 }, M, N, depth, 1 });
        else matmul_assign(c, (size_t)N, av, bv, bias, M, N, depth);
        // relative to the size of a sum of depth products of N(0,1) numbers
        for (size_t i = 0; i < (size_t)M * N; i++) {
            double error = fabs(c[i] - expected[i]) / (sqrt((double)depth) + fabs(expected[i]));
            if (error > worst) worst = error;
        }
        cases++;
        free((real *)av.data); free((real *)bv.data); free(c); free(bias); free(expected);
    }
    double tolerance = sizeof(real) == sizeof(float) ? 1e-5 : 1e-13;
    check(worst < tolerance, "matmul: %d products up to 97 x 530 x 300 and 40 x 7 x %d (every tile edge, depth "
          "and width block, the narrow tile and its depth limit, the transposed small-row path; out += A B and "
          "out = bias + A B) match a plain loop in double: worst error %.2g", cases, NARROW_MAX_DEPTH + 5, worst);
}

// The matrix product gives each element of out to one thread, which sums it in
// the same order whatever the number of threads: 1, 2 and 3 threads must give
// the same bits, for the three ways the layers read their matrices and for
// both orientations (a product of at most TILE_COLS rows is done transposed).
static void test_matmul_thread_count(void) {
#ifdef _OPENMP
    // rows, cols, depth: wide tiles; turned around (7 rows) into narrow tiles; wide
    // tiles with a short last strip; narrow tiles
    int shapes[][3] = { { 97, 530, 300 }, { 7, 530, 129 }, { 40, 33, 300 }, { 97, NARROW_COLS, 300 } };
    Rng rng; rng_seed(&rng, 12);
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
        free((real *)av.data); free((real *)bv.data); free(c[0]); free(c[1]); free(c[2]);
    }
    omp_set_num_threads(threads_before);
    check(identical, "matmul: 1, 2 and 3 threads give bit-identical products (%d products, all three forms)", cases);
#else
    printf("     (built without OpenMP: one thread only, nothing to compare)\n");
#endif
}

// The fast path's scratch memory starts on a cache line, as transformer.c's arenas do.
static void test_fast_aligned_memory(void) {
    int aligned = 1;
    size_t sizes[] = { 1, 5, CACHE_LINE / sizeof(real), 2 * CACHE_LINE / sizeof(real), 17, 53, 161, 485 };
    for (size_t i_size = 0; i_size < sizeof sizes / sizeof *sizes; i_size++) {
        size_t n = sizes[i_size];
        real *a = checked_aligned_malloc(n, sizeof(real), "test");
        aligned &= on_line(a);
        for (size_t i = 0; i < n; i++) a[i] = 1;   // all n are there to write (the sanitizer builds would see otherwise)
        free(a);
    }
    check(aligned, "memory: the fast path's checked_aligned_malloc gives addresses on %d-byte lines", CACHE_LINE);
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
static double worst_scaled_difference(const real *fast, const real *plain, const real *scale, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)fast[i] - (double)plain[i]) / ((double)scale[i] + 1e-30);
        if (!(d <= worst)) worst = d;   // NaN counts as the worst
    }
    return worst;
}

// The largest |a_i - b_i| over the largest |b_i|.
static double relative_difference(const real *a, const real *b, size_t n) {
    double d = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (!(e <= d)) d = e;
        scale = fmax(scale, fabs((double)b[i]));
    }
    return d / (scale > 0 ? scale : 1);
}

// One linear layer, forward and backward: Part II's functions, then Part
// I's loops, with a bias or without, asking for dinp or not (NULL). Returns
// the worst scaled difference over out, dinp (when asked for), dweight and dbias.
static double linear_fast_against_plain(int N, int IC, int OC, int with_bias, int with_dinp, Rng *rng) {
    size_t n_in = (size_t)N * IC, n_w = (size_t)OC * IC, n_out = (size_t)N * OC;
    real *x = random_reals(n_in, rng), *w = random_reals(n_w, rng), *b = random_reals(OC, rng);
    real *dout = random_reals(n_out, rng);
    real *bias = with_bias ? b : NULL;
    // the results: [0] Part II, [1] Part I; backward accumulates onto the same starting values
    real *out[2], *dinp[2], *dw[2], *db[2];
    real *dinp0 = random_reals(n_in, rng), *dw0 = random_reals(n_w, rng), *db0 = random_reals(OC, rng);
    for (int plain = 0; plain < 2; plain++) {
        out[plain] = checked_calloc(n_out, sizeof(real), "test");
        dinp[plain] = copy_of(dinp0, n_in); dw[plain] = copy_of(dw0, n_w); db[plain] = copy_of(db0, OC);
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
    real *s_dinp = absolute_of(dinp0, n_in), *s_dw = absolute_of(dw0, n_w), *s_db = absolute_of(db0, OC);
    linear_forward(s_out, ax, aw, with_bias ? ab : NULL, N, IC, OC);
    linear_backward(s_dinp, s_dw, s_db, adout, ax, aw, N, IC, OC);
    fast_path_use(1);
    double worst = fmax(fmax(worst_scaled_difference(out[0], out[1], s_out, n_out),
                             worst_scaled_difference(dinp[0], dinp[1], s_dinp, n_in)),
                        fmax(worst_scaled_difference(dw[0], dw[1], s_dw, n_w),
                             worst_scaled_difference(db[0], db[1], s_db, OC)));
    real *all[] = { x, w, b, dout, dinp0, dw0, db0, out[0], out[1], dinp[0], dinp[1], dw[0], dw[1], db[0], db[1],
                    ax, aw, ab, adout, s_out, s_dinp, s_dw, s_db };
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
    return worst;
}

// Every shape of linear layer the model makes in the bench configs tiny
// (d_model 64, d_ff 256, 14 words, 96 x 12 tokens) and toy (128, 512, 1000
// words, 32 x 32), in training (rows B*S) and in decoding (a row per
// sentence or beam), the shapes of base (512, 2048, 8000 words, 8 x 64) with
// the most depth and width, and shapes on either side of every boundary of
// Part II's products: a tile's rows and columns, the narrow tile, the
// turned-around product of few rows, a depth block and a width block.
static void test_fast_linear(void) {
    int shapes[][3] = {   // N (rows), IC (in), OC (out)
        { 1152, 64, 192 }, { 1152, 64, 64 }, { 1152, 64, 128 }, { 1152, 64, 256 }, { 1152, 256, 64 },
        { 1152, 64, 14 }, { 1024, 128, 384 }, { 1024, 128, 512 }, { 1024, 512, 128 }, { 1024, 128, 1000 },
        { 1, 128, 384 }, { 4, 128, 1000 }, { 8, 64, 256 }, { 96, 64, 14 },
        { 512, 512, 2048 }, { 512, 2048, 512 }, { 64, 512, 8000 }, { 8, 512, 1536 },
        { TILE_ROWS + 1, DEPTH_BLOCK + 1, WIDTH_BLOCK + TILE_COLS + 1 }, { TILE_COLS, 129, NARROW_COLS },
        { TILE_COLS + 1, 7, NARROW_COLS + 1 }, { 3, 300, 530 }, { 97, 1, 33 }, { NARROW_ROWS + 1, 40, 1 },
    };
    Rng rng; rng_seed(&rng, 31);
    double worst = 0;
    int count = (int)(sizeof shapes / sizeof *shapes);
    for (int s = 0; s < count; s++)
        worst = fmax(worst, linear_fast_against_plain(shapes[s][0], shapes[s][1], shapes[s][2], s % 4 != 3, s % 5 != 4,
                                                      &rng));
    check(worst < FAST_TOLERANCE, "Part II: linear_forward_fast and linear_backward_fast (out, dinp, dW, dbias; "
          "without a bias, or dinp, in some) of %d shapes (tiny, toy, base, decoding, every tile and block edge) "
          "agree with Part I's loops: worst %.2g of "
          "the sum of |terms| (tolerance %.0e)", count, worst, FAST_TOLERANCE);
}

// One attention call, forward and backward: Part II's functions (called
// directly: with one query, the default build's dispatch runs Part I), then
// Part I's loops.
// q is (B,Tq,q_stride), k and v lie in (B,Tk,kv_stride): the fused (B,T,3C)
// layout of self-attention, or the encoder-decoder attention's q (B,T,C) and
// kv (B,S,2C). Returns the worst relative difference (relative_difference)
// over out, att, dq, dk and dv.
static double attention_fast_against_plain(int B, int Tq, int Tk, int C, int NH, int self, int causal,
                                           const int *key_len, Rng *rng) {
    int q_stride = self ? 3 * C : C, kv_stride = self ? 3 * C : 2 * C;
    size_t n_q = (size_t)B * Tq * q_stride, n_kv = (size_t)B * Tk * kv_stride, n_out = (size_t)B * Tq * C;
    size_t n_att = (size_t)B * NH * Tq * Tk;
    real *q = random_reals(n_q, rng), *kv = self ? q : random_reals(n_kv, rng), *dout = random_reals(n_out, rng);
    const real *k = self ? q + C : kv, *v = self ? q + 2 * C : kv + C;
    real *out[2], *att[2], *dq[2], *dkv[2];
    for (int plain = 0; plain < 2; plain++) {
        out[plain] = checked_calloc(n_out, sizeof(real), "test");
        att[plain] = checked_calloc(n_att, sizeof(real), "test");
        dq[plain] = checked_calloc(n_q, sizeof(real), "test");
        dkv[plain] = self ? dq[plain] : checked_calloc(n_kv, sizeof(real), "test");
        real *dk = self ? dq[plain] + C : dkv[plain], *dv = self ? dq[plain] + 2 * C : dkv[plain] + C;
        fast_path_use(0);
        if (plain) {
            attention_forward(out[1], att[1], q, k, v, q_stride, kv_stride, key_len, causal, B, Tq, Tk, C, NH);
            attention_backward(dq[1], dk, dv, dout, att[1], q, k, v, q_stride, kv_stride, B, Tq, Tk, C, NH);
        } else {
            attention_forward_fast(out[0], att[0], q, k, v, q_stride, kv_stride, key_len, causal, B, Tq, Tk, C, NH);
            attention_backward_fast(dq[0], dk, dv, dout, att[0], q, k, v, q_stride, kv_stride, B, Tq, Tk, C, NH);
        }
    }
    fast_path_use(1);
    double worst = fmax(relative_difference(out[0], out[1], n_out), relative_difference(att[0], att[1], n_att));
    worst = fmax(worst, relative_difference(dq[0], dq[1], n_q));   // dq, and dk and dv when fused
    if (!self) worst = fmax(worst, relative_difference(dkv[0], dkv[1], n_kv));
    free(q); free(dout); free(out[0]); free(out[1]); free(att[0]); free(att[1]); free(dq[0]); free(dq[1]);
    if (!self) { free(kv); free(dkv[0]); free(dkv[1]); }
    return worst;
}

// The attention calls the model makes (the encoder's self-attention with
// padded keys, the decoder's with the causal mask too, reading q, k, v from
// the fused (B, T, 3C) projection; the encoder-decoder attention with q
// (B, T, C) and k, v in (B, S, 2C)), with ragged lengths down to one key,
// one head and several, head sizes of 8 to 64 (toy's 32 and base's 64 among
// them) and key counts on either side of a tile's width.
static void test_fast_attention(void) {
    Rng rng; rng_seed(&rng, 32);
    int lengths[4] = { 13, 5, 1, 9 }, wide[3] = { TILE_COLS + 3, 2, TILE_COLS }, one[2] = { 9, 4 };
    int toy[3] = { 32, 17, 1 }, base[2] = { 64, 41 };
    double worst = 0;
    worst = fmax(worst, attention_fast_against_plain(4, 13, 13, 32, 2, 1, 0, lengths, &rng));   // encoder
    worst = fmax(worst, attention_fast_against_plain(4, 13, 13, 32, 2, 1, 1, lengths, &rng));   // decoder
    worst = fmax(worst, attention_fast_against_plain(3, 9, TILE_COLS + 3, 24, 3, 0, 0, wide, &rng)); // cross
    worst = fmax(worst, attention_fast_against_plain(3, TILE_COLS + 3, TILE_COLS + 3, 16, 1, 1, 1, wide, &rng));
    worst = fmax(worst, attention_fast_against_plain(2, 1, 9, 32, 4, 0, 0, one, &rng));        // one query
    worst = fmax(worst, attention_fast_against_plain(3, 32, 32, 128, 4, 1, 1, toy, &rng));     // toy's sizes
    worst = fmax(worst, attention_fast_against_plain(3, 20, 32, 128, 4, 0, 0, toy, &rng));
    worst = fmax(worst, attention_fast_against_plain(2, 64, 64, 512, 8, 1, 1, base, &rng));    // base's
    worst = fmax(worst, attention_fast_against_plain(2, 64, 64, 512, 8, 0, 0, base, &rng));
    check(worst < FAST_STEP_TOLERANCE, "Part II: attention_forward_fast and attention_backward_fast (out, "
          "probabilities, dq, dk, dv) with padding and causal masks, fused and separate q, k, v, head sizes 8 to 64, "
          "agree with Part I's loops: worst %.2g of each tensor's largest (tolerance %.0e)", worst,
          FAST_STEP_TOLERANCE);
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
    Rng rng; rng_seed(&rng, 35);
    int N = 97, IC = 300, OC = 530, B = 2, T = 40, C = 64, NH = 2, len[2] = { 40, 23 };
    real *x = random_reals((size_t)N * IC, &rng), *w = random_reals((size_t)OC * IC, &rng);
    real *out[3], *att[3], *heads[3], *qkv = random_reals((size_t)B * T * 3 * C, &rng);
    for (int way = 0; way < 3; way++) {   // 0: Part II itself, 1: the dispatch, 2: Part I
        out[way] = checked_calloc((size_t)N * OC, sizeof(real), "test");
        att[way] = checked_calloc((size_t)B * NH * T * T, sizeof(real), "test");
        heads[way] = checked_calloc((size_t)B * T * C, sizeof(real), "test");
        fast_path_use(way < 2);
        if (way == 0) {
            linear_forward_fast(out[0], x, w, NULL, N, IC, OC);
            attention_forward_fast(heads[0], att[0], qkv, qkv + C, qkv + 2 * C, 3 * C, 3 * C, len, 1, B, T, T, C, NH);
        } else {
            linear_forward(out[way], x, w, NULL, N, IC, OC);
            attention_forward(heads[way], att[way], qkv, qkv + C, qkv + 2 * C, 3 * C, 3 * C, len, 1, B, T, T, C, NH);
        }
    }
    fast_path_use(1);
    size_t n_out = (size_t)N * OC * sizeof(real), n_heads = (size_t)B * T * C * sizeof(real);
    check(memcmp(out[0], out[1], n_out) == 0 && memcmp(heads[0], heads[1], n_heads) == 0 &&
          memcmp(out[1], out[2], n_out) != 0,
          "Part II: a default build's linear_forward and attention_forward run Part II (its bits; the product's not Part I's)");
    if (memcmp(heads[1], heads[2], n_heads) == 0)
        printf("     (this build's Part II attention gives Part I's exact bits)\n");
    for (int way = 0; way < 3; way++) { free(out[way]); free(att[way]); free(heads[way]); }
    free(x); free(w); free(qkv);
}

// A whole training step of a model, Part II against Part I: the loss, the
// logits and every parameter's gradient, each tensor held to
// FAST_STEP_TOLERANCE of its largest element. (Adam, after it, is Part I's
// code in both builds.)
static void test_fast_training_step(void) {
    TransformerConfig config = small_config();
    config.d_model = 40; config.n_heads = 5; config.d_ff = 72; config.vocab_size = 23;
    config.max_len = 24; config.n_layers = 2;
    int src_len[3] = { 17, 9, 4 }, tgt_len[3] = { 5, 19, 12 };
    Rng rng; rng_seed(&rng, 33);
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
    double logits = relative_difference(m[0].acts.logits, m[1].acts.logits, (size_t)3 * 19 * config.vocab_size);
    double worst_grad = 0;
    const char *worst_name = "";
    real **grads[2][NUM_PARAMETER_TENSORS];
    parameter_pointers(grads[0], &m[0].grads);
    parameter_pointers(grads[1], &m[1].grads);
    int compared = 0;
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        if (m[0].param_sizes[t] == 0) continue;   // position_embedding, with sinusoids
        double d = relative_difference(*grads[0][t], *grads[1][t], m[0].param_sizes[t]);
        if (d > worst_grad) { worst_grad = d; worst_name = parameter_names[t]; }
        compared++;
    }
    check(fabs((double)loss[0] - loss[1]) <= FAST_STEP_TOLERANCE * fabs((double)loss[1]) &&
          logits < FAST_STEP_TOLERANCE && worst_grad < FAST_STEP_TOLERANCE,
          "Part II: a training step (2 layers, d_model 40, 5 heads, ragged batch, dropout on) gives Part I's "
          "loss (%.9g, %.9g), logits (%.1e) and all %d gradients (worst %.1e, %s; tolerance %.0e)",
          (double)loss[0], (double)loss[1], logits, compared, worst_grad, worst_name, FAST_STEP_TOLERANCE);
    transformer_free(&m[0]);
    transformer_free(&m[1]);
}

int main(void) {
    fast_path_use(1);   // as make's ./transformer runs
    printf("-- the fast path (lab/fast_path.c) against transformer.c's loops\n");
    test_fast_aligned_memory();
    test_matmul_against_plain_loops();
    test_matmul_thread_count();
    test_fast_linear();
    test_fast_attention();
    test_fast_dispatch();
    test_fast_training_step();
    printf("%d passed, %d failed\n", tests_passed, tests_failed);
    return tests_failed ? 1 : 0;
}
