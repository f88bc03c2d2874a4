/* transformer.c: the Transformer of "Attention Is All You Need" in plain C
 *
 * Vaswani, Shazeer, Parmar, Uszkoreit, Jones, Gomez, Kaiser, Polosukhin,
 * NeurIPS 2017, arXiv 1706.03762. The whole encoder-decoder model, its
 * hand-derived backward pass and the paper's Adam schedule, one loop at a time.
 *
 * BUILD    make                      (or: cc -O2 transformer.c -lm -o transformer)
 *          make OPENMP=0             without OpenMP: same code, one thread
 *          make debug                -O0 -g, for stepping through in gdb
 * TEST     make test
 * RUN      ./transformer --help
 *
 * READ     Top to bottom, beside the paper. Sections follow the paper:
 *            §3    linear projections, the building block of every sub-layer
 *            §3.1  residual connection, dropout and layer normalisation
 *            §3.2.1 scaled dot-product attention
 *            §3.2.2 multi-head attention
 *            §3.3  position-wise feed-forward networks
 *            §3.4  embeddings, the shared pre-softmax projection
 *            §3.5  positional encoding
 *            §3.1  the encoder and decoder stacks, assembled from the above
 *            §5.4  label-smoothed cross-entropy
 *            §5.3  Adam and the warm-up learning-rate schedule
 *            §6.1  decoding: greedy with a key/value cache, beam search
 *          and then what turns the model into a program: data (vocabulary,
 *          TSV files, the copy and reverse tasks, batches by length),
 *          checkpoints, the command line, and main.
 *          Every layer is a `*_forward` function followed by its `*_backward`.
 *          Arguments come outputs first, then inputs, then sizes. Backward
 *          functions quote the forward line they differentiate and always
 *          ACCUMULATE (+=) into their gradient outputs; the caller zeroes.
 *          Shapes use B batch, S source length, T target length, C = d_model,
 *          F = d_ff, NH = h heads, hs = C/NH = d_k = d_v, V vocabulary, L layers.
 *
 * CONVENTIONS
 *          A linear layer stores W as (out_features, in_features), as PyTorch
 *          does, and computes y = x W^T + b; the paper writes x W with W of
 *          shape (in, out): the same numbers, transposed.
 *          Masking: the paper sets illegal attention scores to -inf before the
 *          softmax; we skip masked keys and give them probability exactly 0,
 *          which is the same thing without infinities in the arithmetic.
 *          Parallel loops give every output element to one thread and sum in a
 *          fixed order, so results are bit-identical for any number of threads.
 */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "transformer.h"

// OpenMP is optional. OMP(parallel for) becomes `#pragma omp parallel for`
// when compiled with -fopenmp and nothing otherwise, so the file builds
// without warnings either way.
#ifdef _OPENMP
#define OMP_PRAGMA(text) _Pragma(#text)
#define OMP(directive) OMP_PRAGMA(omp directive)
#else
#define OMP(directive)
#endif

#ifdef TRANSFORMER_DOUBLE
#define real_exp exp
#define real_log log
#define real_sqrt sqrt
#else
#define real_exp expf
#define real_log logf
#define real_sqrt sqrtf
#endif

// ----------------------------------------------------------------------------
// Utilities: allocation that cannot fail silently, and our own small random
// number generator, so that a seed gives the same model on every machine.

static void *checked_calloc(size_t count, size_t size, const char *what) {
    if (count == 0) count = 1;
    if (size != 0 && count > SIZE_MAX / size) {
        fprintf(stderr, "error: %s: %zu x %zu bytes overflows\n", what, count, size);
        exit(1);
    }
    void *p = calloc(count, size);
    if (!p) {
        fprintf(stderr, "error: out of memory allocating %s (%zu bytes)\n", what, count * size);
        exit(1);
    }
    return p;
}

static void rng_seed(Rng *rng, uint64_t seed) {
    // splitmix64 of the seed, so that nearby seeds give unrelated streams and
    // the xorshift state is never 0
    uint64_t z = seed + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    rng->state = z ? z : 0x2545F4914F6CDD1DULL;
}

static uint64_t rng_next(Rng *rng) { // xorshift64*
    rng->state ^= rng->state >> 12;
    rng->state ^= rng->state << 25;
    rng->state ^= rng->state >> 27;
    return rng->state * 0x2545F4914F6CDD1DULL;
}

static double rng_uniform(Rng *rng) { // [0, 1) with 53 random bits
    return (double)(rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
}

static double rng_normal(Rng *rng) { // Box-Muller
    double u1 = 1.0 - rng_uniform(rng); // (0, 1]: log(u1) is finite
    double u2 = rng_uniform(rng);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static int rng_below(Rng *rng, int n) { // uniform integer in [0, n)
    return (int)(rng_uniform(rng) * n);
}

// ----------------------------------------------------------------------------
// The configuration, with the limits that keep every size product in range.

TransformerConfig transformer_default_config(void) {
    TransformerConfig c;
    c.n_layers = 2;
    c.d_model = 64;
    c.d_ff = 256;
    c.n_heads = 4;
    c.vocab_size = 32;
    c.max_len = 64;
    c.dropout = 0.1f;          // §5.4 P_drop for the base model
    c.label_smoothing = 0.1f;  // §5.4 eps_ls
    c.layer_norm_eps = 1e-5f;  // PyTorch's default; the paper gives none
    return c;
}

// Returns NULL when the config is usable, else a message naming the bad field.
const char *transformer_config_check(const TransformerConfig *c) {
    static char message[200];
    #define CONFIG_REQUIRE(cond, ...) do { if (!(cond)) { \
        snprintf(message, sizeof message, __VA_ARGS__); return message; } } while (0)
    CONFIG_REQUIRE(c->n_layers >= 1 && c->n_layers <= TRANSFORMER_MAX_LAYERS,
                   "n_layers is %d, expected 1..%d", c->n_layers, TRANSFORMER_MAX_LAYERS);
    CONFIG_REQUIRE(c->d_model >= 1 && c->d_model <= TRANSFORMER_MAX_WIDTH,
                   "d_model is %d, expected 1..%d", c->d_model, TRANSFORMER_MAX_WIDTH);
    CONFIG_REQUIRE(c->d_ff >= 1 && c->d_ff <= TRANSFORMER_MAX_WIDTH,
                   "d_ff is %d, expected 1..%d", c->d_ff, TRANSFORMER_MAX_WIDTH);
    CONFIG_REQUIRE(c->n_heads >= 1 && c->n_heads <= c->d_model,
                   "n_heads is %d, expected 1..d_model (%d)", c->n_heads, c->d_model);
    CONFIG_REQUIRE(c->d_model % c->n_heads == 0,
                   "d_model (%d) is not divisible by n_heads (%d)", c->d_model, c->n_heads);
    CONFIG_REQUIRE(c->vocab_size > NUM_SPECIAL_TOKENS && c->vocab_size <= TRANSFORMER_MAX_VOCAB,
                   "vocab_size is %d, expected %d..%d (4 special tokens + words)",
                   c->vocab_size, NUM_SPECIAL_TOKENS + 1, TRANSFORMER_MAX_VOCAB);
    CONFIG_REQUIRE(c->max_len >= 2 && c->max_len <= TRANSFORMER_MAX_LEN,
                   "max_len is %d, expected 2..%d", c->max_len, TRANSFORMER_MAX_LEN);
    CONFIG_REQUIRE(c->dropout >= 0.0f && c->dropout < 1.0f,
                   "dropout is %g, expected 0 <= dropout < 1", (double)c->dropout);
    CONFIG_REQUIRE(c->label_smoothing >= 0.0f && c->label_smoothing < 1.0f,
                   "label_smoothing is %g, expected 0 <= eps_ls < 1", (double)c->label_smoothing);
    CONFIG_REQUIRE(c->layer_norm_eps > 0.0f && c->layer_norm_eps < 1.0f,
                   "layer_norm_eps is %g, expected 0 < eps < 1", (double)c->layer_norm_eps);
    #undef CONFIG_REQUIRE
    return NULL;
}

// ----------------------------------------------------------------------------
// Parameters: sizes, names, one allocation with named pointers into it.

static const char *parameter_names[NUM_PARAMETER_TENSORS] = {
    "embedding",
    "enc_qkv_w", "enc_qkv_b", "enc_out_w", "enc_out_b", "enc_ln1_g", "enc_ln1_b",
    "enc_ff1_w", "enc_ff1_b", "enc_ff2_w", "enc_ff2_b", "enc_ln2_g", "enc_ln2_b",
    "dec_self_qkv_w", "dec_self_qkv_b", "dec_self_out_w", "dec_self_out_b", "dec_ln1_g", "dec_ln1_b",
    "dec_cross_qkv_w", "dec_cross_qkv_b", "dec_cross_out_w", "dec_cross_out_b", "dec_ln2_g", "dec_ln2_b",
    "dec_ff1_w", "dec_ff1_b", "dec_ff2_w", "dec_ff2_b", "dec_ln3_g", "dec_ln3_b",
};

const char *parameter_tensor_name(int index) {
    return (index >= 0 && index < NUM_PARAMETER_TENSORS) ? parameter_names[index] : "?";
}

static void parameter_sizes(size_t sizes[NUM_PARAMETER_TENSORS], const TransformerConfig *c) {
    size_t L = c->n_layers, C = c->d_model, F = c->d_ff, V = c->vocab_size;
    size_t attention[4] = { L * 3 * C * C, L * 3 * C, L * C * C, L * C }; // qkv_w qkv_b out_w out_b
    size_t norm = L * C;
    size_t ffn[4] = { L * F * C, L * F, L * C * F, L * C };                // ff1_w ff1_b ff2_w ff2_b
    size_t i = 0;
    sizes[i++] = V * C;
    for (int k = 0; k < 4; k++) sizes[i++] = attention[k];  // encoder self-attention
    sizes[i++] = norm; sizes[i++] = norm;
    for (int k = 0; k < 4; k++) sizes[i++] = ffn[k];
    sizes[i++] = norm; sizes[i++] = norm;
    for (int k = 0; k < 4; k++) sizes[i++] = attention[k];  // decoder self-attention
    sizes[i++] = norm; sizes[i++] = norm;
    for (int k = 0; k < 4; k++) sizes[i++] = attention[k];  // encoder-decoder attention
    sizes[i++] = norm; sizes[i++] = norm;
    for (int k = 0; k < 4; k++) sizes[i++] = ffn[k];
    sizes[i++] = norm; sizes[i++] = norm;
}

// The named pointers of a ParameterTensors, in storage order.
static void parameter_pointers(real **ptrs[NUM_PARAMETER_TENSORS], ParameterTensors *p) {
    real **list[NUM_PARAMETER_TENSORS] = {
        &p->embedding,
        &p->enc_qkv_w, &p->enc_qkv_b, &p->enc_out_w, &p->enc_out_b, &p->enc_ln1_g, &p->enc_ln1_b,
        &p->enc_ff1_w, &p->enc_ff1_b, &p->enc_ff2_w, &p->enc_ff2_b, &p->enc_ln2_g, &p->enc_ln2_b,
        &p->dec_self_qkv_w, &p->dec_self_qkv_b, &p->dec_self_out_w, &p->dec_self_out_b,
        &p->dec_ln1_g, &p->dec_ln1_b,
        &p->dec_cross_qkv_w, &p->dec_cross_qkv_b, &p->dec_cross_out_w, &p->dec_cross_out_b,
        &p->dec_ln2_g, &p->dec_ln2_b,
        &p->dec_ff1_w, &p->dec_ff1_b, &p->dec_ff2_w, &p->dec_ff2_b, &p->dec_ln3_g, &p->dec_ln3_b,
    };
    memcpy(ptrs, list, sizeof list);
}

// Points the named tensors into memory laid out in the order above.
static void point_parameters(ParameterTensors *p, real *memory, const size_t sizes[NUM_PARAMETER_TENSORS]) {
    real **ptrs[NUM_PARAMETER_TENSORS];
    parameter_pointers(ptrs, p);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        *ptrs[i] = memory;
        memory += sizes[i];
    }
}

// Xavier-uniform (Glorot & Bengio 2010): U(-a, a) with a = sqrt(6 / (fan_in + fan_out)),
// for a (rows, cols) matrix inside w.
static void xavier_uniform(real *w, size_t rows, size_t cols, Rng *rng) {
    double a = sqrt(6.0 / (double)(rows + cols));
    for (size_t i = 0; i < rows * cols; i++) w[i] = (real)((2.0 * rng_uniform(rng) - 1.0) * a);
}

// Initialisation: Xavier-uniform for every projection matrix (W^Q, W^K, W^V,
// W^O each on its own, W_1, W_2), N(0, d_model^-0.5) for the shared embedding,
// zero biases, layer-norm gain 1 and bias 0.
static void initialize_parameters(Transformer *m, uint64_t seed) {
    const TransformerConfig *c = &m->config;
    size_t L = c->n_layers, C = c->d_model, F = c->d_ff, V = c->vocab_size;
    ParameterTensors *p = &m->params;
    Rng rng;
    rng_seed(&rng, seed);
    memset(m->params_memory, 0, m->num_parameters * sizeof(real));
    double std = 1.0 / sqrt((double)C);
    for (size_t i = 0; i < V * C; i++) p->embedding[i] = (real)(std * rng_normal(&rng));
    real *qkv[3] = { p->enc_qkv_w, p->dec_self_qkv_w, p->dec_cross_qkv_w };
    real *out[3] = { p->enc_out_w, p->dec_self_out_w, p->dec_cross_out_w };
    for (size_t l = 0; l < L; l++) {
        for (int a = 0; a < 3; a++) {
            for (int k = 0; k < 3; k++) xavier_uniform(qkv[a] + (l * 3 + k) * C * C, C, C, &rng);
            xavier_uniform(out[a] + l * C * C, C, C, &rng);
        }
        xavier_uniform(p->enc_ff1_w + l * F * C, F, C, &rng);
        xavier_uniform(p->enc_ff2_w + l * C * F, C, F, &rng);
        xavier_uniform(p->dec_ff1_w + l * F * C, F, C, &rng);
        xavier_uniform(p->dec_ff2_w + l * C * F, C, F, &rng);
    }
    real *gains[5] = { p->enc_ln1_g, p->enc_ln2_g, p->dec_ln1_g, p->dec_ln2_g, p->dec_ln3_g };
    for (int g = 0; g < 5; g++)
        for (size_t i = 0; i < L * C; i++) gains[g][i] = 1;
}

// ============================================================================
// §3  Linear projections: y = x W^T + b
// Every sub-layer is built from these: the four projections of multi-head
// attention (§3.2.2), the two of the FFN (§3.3) and the pre-softmax
// projection through the shared embedding (§3.4).
// ============================================================================

// out is (N, OC), inp is (N, IC), weight is (OC, IC), bias is (OC) or NULL
static void linear_forward(real *out, const real *inp, const real *weight, const real *bias,
                           int N, int IC, int OC) {
    OMP(parallel for)
    for (int n = 0; n < N; n++) {
        const real *x = inp + (size_t)n * IC;
        real *y = out + (size_t)n * OC;
        for (int o = 0; o < OC; o++) {
            const real *w = weight + (size_t)o * IC;
            real sum = bias ? bias[o] : 0;
            for (int i = 0; i < IC; i++) sum += x[i] * w[i];
            y[o] = sum;
        }
    }
}

// Differentiates  out[n,o] = bias[o] + sum_i inp[n,i] * weight[o,i]:
//   dinp[n,i]    += sum_o dout[n,o] * weight[o,i]
//   dweight[o,i] += sum_n dout[n,o] * inp[n,i]
//   dbias[o]     += sum_n dout[n,o]
// dinp or dbias may be NULL when not wanted.
static void linear_backward(real *dinp, real *dweight, real *dbias,
                            const real *dout, const real *inp, const real *weight,
                            int N, int IC, int OC) {
    if (dinp) {
        OMP(parallel for)
        for (int n = 0; n < N; n++) {
            const real *g = dout + (size_t)n * OC;
            real *dx = dinp + (size_t)n * IC;
            for (int o = 0; o < OC; o++) {
                const real *w = weight + (size_t)o * IC;
                real go = g[o];
                for (int i = 0; i < IC; i++) dx[i] += go * w[i];
            }
        }
    }
    // each thread owns whole rows of dweight: no races, a fixed summation order
    OMP(parallel for)
    for (int o = 0; o < OC; o++) {
        real *dw = dweight + (size_t)o * IC;
        real db = 0;
        for (int n = 0; n < N; n++) {
            real go = dout[(size_t)n * OC + o];
            const real *x = inp + (size_t)n * IC;
            for (int i = 0; i < IC; i++) dw[i] += go * x[i];
            db += go;
        }
        if (dbias) dbias[o] += db;
    }
}

// ============================================================================
// §3.1  Residual connection, dropout and layer normalisation
// "The output of each sub-layer is LayerNorm(x + Sublayer(x))" (§3.1), and
// "we apply dropout to the output of each sub-layer, before it is added to
// the sub-layer input and normalized" (§5.4). So every sub-layer ends with
//     res = x + Dropout(sublayer_out);   out = LayerNorm(res)
// ============================================================================

// Draws a dropout mask: each element is kept with probability 1 - p and then
// scaled by 1/(1-p) ("inverted dropout", so evaluation needs no rescaling).
// With training off or p = 0 the mask is all ones. Drawn serially from one
// stream, so a seed gives the same masks whatever the thread count.
static void dropout_mask(real *mask, float p, int training, Rng *rng, size_t n) {
    if (!training || p <= 0.0f) {
        for (size_t i = 0; i < n; i++) mask[i] = 1;
        return;
    }
    real keep_scale = (real)(1.0 / (1.0 - p));
    for (size_t i = 0; i < n; i++) mask[i] = rng_uniform(rng) < p ? 0 : keep_scale;
}

// out = inp * mask  (the dropout on embeddings + positional encodings, §5.4)
static void dropout_forward(real *out, const real *inp, const real *mask, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = inp[i] * mask[i];
}

// Differentiates  out[i] = inp[i] * mask[i]
static void dropout_backward(real *dinp, const real *dout, const real *mask, size_t n) {
    for (size_t i = 0; i < n; i++) dinp[i] += dout[i] * mask[i];
}

// out = residual + sublayer * mask  (x + Dropout(Sublayer(x)))
static void residual_dropout_forward(real *out, const real *residual, const real *sublayer,
                                     const real *mask, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = residual[i] + sublayer[i] * mask[i];
}

// Differentiates  out[i] = residual[i] + sublayer[i] * mask[i]
static void residual_dropout_backward(real *dresidual, real *dsublayer, const real *dout,
                                      const real *mask, size_t n) {
    for (size_t i = 0; i < n; i++) {
        dresidual[i] += dout[i];
        dsublayer[i] += dout[i] * mask[i];
    }
}

// Layer normalisation (Ba, Kiros & Hinton 2016) over the C features of each row:
//     mean = sum_i x_i / C,   var = sum_i (x_i - mean)^2 / C   (biased, as PyTorch)
//     rstd = 1 / sqrt(var + eps),   xhat_i = (x_i - mean) * rstd
//     out_i = gain_i * xhat_i + bias_i
// out is (N, C), mean and rstd are (N), inp is (N, C), gain and bias are (C)
static void layernorm_forward(real *out, real *mean, real *rstd, const real *inp,
                              const real *gain, const real *bias, int N, int C, float eps) {
    OMP(parallel for)
    for (int n = 0; n < N; n++) {
        const real *x = inp + (size_t)n * C;
        real m = 0;
        for (int i = 0; i < C; i++) m += x[i];
        m /= C;
        real v = 0;
        for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
        v /= C;
        real s = 1 / real_sqrt(v + (real)eps);
        real *y = out + (size_t)n * C;
        for (int i = 0; i < C; i++) y[i] = (x[i] - m) * s * gain[i] + bias[i];
        mean[n] = m;
        rstd[n] = s;
    }
}

// Differentiates  out_i = gain_i * xhat_i + bias_i,  xhat_i = (x_i - mean) * rstd.
//   dgain_i += dout_i * xhat_i,   dbias_i += dout_i,   dxhat_i = dout_i * gain_i
// mean and rstd depend on every x_j; with d(mean)/dx_j = 1/C and
// d(rstd)/dx_j = -rstd^3 (x_j - mean) / C, collecting terms gives
//   dx_i = rstd * ( dxhat_i - mean_j(dxhat_j) - xhat_i * mean_j(dxhat_j * xhat_j) )
static void layernorm_backward(real *dinp, real *dgain, real *dbias, const real *dout,
                               const real *inp, const real *gain, const real *mean,
                               const real *rstd, int N, int C) {
    OMP(parallel for)
    for (int n = 0; n < N; n++) {
        const real *x = inp + (size_t)n * C, *g = dout + (size_t)n * C;
        real m = mean[n], s = rstd[n];
        real mean_dxhat = 0, mean_dxhat_xhat = 0;
        for (int i = 0; i < C; i++) {
            real dxhat = g[i] * gain[i];
            mean_dxhat += dxhat;
            mean_dxhat_xhat += dxhat * (x[i] - m) * s;
        }
        mean_dxhat /= C;
        mean_dxhat_xhat /= C;
        real *dx = dinp + (size_t)n * C;
        for (int i = 0; i < C; i++) {
            real xhat = (x[i] - m) * s;
            dx[i] += s * (g[i] * gain[i] - mean_dxhat - xhat * mean_dxhat_xhat);
        }
    }
    // gain and bias are shared by all rows: one thread per feature, rows in order
    OMP(parallel for)
    for (int i = 0; i < C; i++) {
        real dg = 0, db = 0;
        for (int n = 0; n < N; n++) {
            real gi = dout[(size_t)n * C + i];
            dg += gi * (inp[(size_t)n * C + i] - mean[n]) * rstd[n];
            db += gi;
        }
        dgain[i] += dg;
        dbias[i] += db;
    }
}

// ============================================================================
// §3.2.1  Scaled dot-product attention
//     Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V                 (eq. 1)
// One head at a time. For query i the scores over keys j are
//     s_ij = q_i . k_j / sqrt(d_k),   p_ij = exp(s_ij) / sum_j' exp(s_ij'),
//     out_i = sum_j p_ij v_j
// Masking (§3.2.3): keys j >= key_len[b] are padding and, in the decoder's
// self-attention, keys j > i are "illegal connections" to the future. Both
// get p_ij = 0, exactly what setting s_ij = -inf before the softmax gives.
//
//   causal mask (decoder self-attention, T = 4, sentence length 3):
//              key  0  1  2  3(pad)
//     query 0       x  .  .  .         x: attended
//     query 1       x  x  .  .         .: probability 0
//     query 2       x  x  x  .
//     query 3(pad)  x  x  x  .         (a padded query's output is never used)
//
// The queries of row (b, t) start at q + (b*Tq + t)*q_stride, head h at
// column h*hs; keys and values likewise with kv_stride. This reads Q, K, V
// straight out of the fused (B, T, 3C) projection without copying.
// ============================================================================

// Number of keys query i may attend to.
static int visible_keys(int i, int key_len, int causal) {
    return (causal && i + 1 < key_len) ? i + 1 : key_len;
}

// out is (B, Tq, C), att is (B, NH, Tq, Tk), key_len is (B)
static void attention_forward(real *out, real *att,
                              const real *q, const real *k, const real *v,
                              int q_stride, int kv_stride, const int *key_len, int causal,
                              int B, int Tq, int Tk, int C, int NH) {
    int hs = C / NH;
    real scale = 1 / real_sqrt((real)hs);
    OMP(parallel for collapse(2))
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int i = 0; i < Tq; i++) {
                const real *qi = q + ((size_t)b * Tq + i) * q_stride + h * hs;
                real *p = att + (((size_t)b * NH + h) * Tq + i) * Tk;
                int visible = visible_keys(i, key_len[b], causal);
                // s_ij = q_i . k_j / sqrt(d_k), and the largest for a stable softmax
                real max_score = -INFINITY;
                for (int j = 0; j < visible; j++) {
                    const real *kj = k + ((size_t)b * Tk + j) * kv_stride + h * hs;
                    real s = 0;
                    for (int d = 0; d < hs; d++) s += qi[d] * kj[d];
                    p[j] = s * scale;
                    if (p[j] > max_score) max_score = p[j];
                }
                // p_ij = exp(s_ij - max) / sum_j exp(s_ij - max); masked keys get 0
                real sum = 0;
                for (int j = 0; j < visible; j++) {
                    p[j] = real_exp(p[j] - max_score);
                    sum += p[j];
                }
                for (int j = 0; j < visible; j++) p[j] /= sum;
                for (int j = visible; j < Tk; j++) p[j] = 0;
                // out_i = sum_j p_ij v_j
                real *o = out + ((size_t)b * Tq + i) * C + h * hs;
                for (int d = 0; d < hs; d++) o[d] = 0;
                for (int j = 0; j < visible; j++) {
                    const real *vj = v + ((size_t)b * Tk + j) * kv_stride + h * hs;
                    for (int d = 0; d < hs; d++) o[d] += p[j] * vj[d];
                }
            }
        }
    }
}

// Differentiates, for each head:
//   out_i = sum_j p_ij v_j         =>  dp_ij = dout_i . v_j,   dv_j += p_ij dout_i
//   p_ij  = softmax_j(s_ij)        =>  ds_ij = p_ij (dp_ij - sum_j' p_ij' dp_ij')
//          (the softmax Jacobian is dp_ij/ds_ik = p_ij ([j==k] - p_ik))
//   s_ij  = q_i . k_j / sqrt(d_k)  =>  dq_i += ds_ij k_j / sqrt(d_k),
//                                      dk_j += ds_ij q_i / sqrt(d_k)
// dq, dk, dv have the same layout (strides) as q, k, v. row_scratch is
// (B, NH, Tk): room for one row of dp per head.
static void attention_backward(real *dq, real *dk, real *dv, real *row_scratch,
                               const real *dout, const real *att,
                               const real *q, const real *k, const real *v,
                               int q_stride, int kv_stride, const int *key_len, int causal,
                               int B, int Tq, int Tk, int C, int NH) {
    int hs = C / NH;
    real scale = 1 / real_sqrt((real)hs);
    // one thread per (b, h): it alone writes that head's columns of dq, dk, dv
    OMP(parallel for collapse(2))
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            real *dp = row_scratch + ((size_t)b * NH + h) * Tk;
            for (int i = 0; i < Tq; i++) {
                const real *p = att + (((size_t)b * NH + h) * Tq + i) * Tk;
                const real *g = dout + ((size_t)b * Tq + i) * C + h * hs;
                int visible = visible_keys(i, key_len[b], causal);
                real sum_p_dp = 0;
                for (int j = 0; j < visible; j++) {
                    const real *vj = v + ((size_t)b * Tk + j) * kv_stride + h * hs;
                    real *dvj = dv + ((size_t)b * Tk + j) * kv_stride + h * hs;
                    real d = 0;
                    for (int e = 0; e < hs; e++) {
                        d += g[e] * vj[e];
                        dvj[e] += p[j] * g[e];
                    }
                    dp[j] = d;
                    sum_p_dp += p[j] * d;
                }
                const real *qi = q + ((size_t)b * Tq + i) * q_stride + h * hs;
                real *dqi = dq + ((size_t)b * Tq + i) * q_stride + h * hs;
                for (int j = 0; j < visible; j++) {
                    real ds = p[j] * (dp[j] - sum_p_dp) * scale;
                    const real *kj = k + ((size_t)b * Tk + j) * kv_stride + h * hs;
                    real *dkj = dk + ((size_t)b * Tk + j) * kv_stride + h * hs;
                    for (int e = 0; e < hs; e++) {
                        dqi[e] += ds * kj[e];
                        dkj[e] += ds * qi[e];
                    }
                }
            }
        }
    }
}

// ============================================================================
// §3.2.2  Multi-head attention
//     MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O
//     head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
// W_i^Q for all heads together is one (C, C) matrix whose output columns
// h*hs .. (h+1)*hs-1 belong to head h; likewise W^K and W^V. We stack the
// three as the rows of one (3C, C) weight, as PyTorch's in_proj_weight, and
// project with one matrix product. So qkv[b,t] = [q | k | v], each C wide,
// and head h reads columns h*hs .. (h+1)*hs-1 of each: the "split into heads"
// is only a way of indexing, and Concat is the same indexing read back.
//
//   self-attention (encoder; decoder with the causal mask):
//     x (N,C) --W_qkv--> qkv (N,3C) --attention per head--> heads (N,C) --W^O--> (N,C)
//   encoder-decoder attention (§3.2.3, "queries come from the previous decoder
//   layer, and the memory keys and values come from the output of the encoder"):
//     x (B*T,C)      --rows 0..C-1 of W_qkv-->   q  (B*T,C)
//     memory (B*S,C) --rows C..3C-1 of W_qkv--> kv (B*S,2C)
// ============================================================================

// One layer's attention parameters (or their gradients: the same layout).
typedef struct { real *qkv_w, *qkv_b, *out_w, *out_b; } AttentionParams;

// out is (B,T,C); qkv (B,T,3C), att (B,NH,T,T), heads (B,T,C) are kept for backward
static void self_attention_forward(real *out, real *qkv, real *att, real *heads,
                                   const real *x, AttentionParams w, const int *len, int causal,
                                   int B, int T, int C, int NH) {
    linear_forward(qkv, x, w.qkv_w, w.qkv_b, B * T, C, 3 * C);
    attention_forward(heads, att, qkv, qkv + C, qkv + 2 * C, 3 * C, 3 * C, len, causal, B, T, T, C, NH);
    linear_forward(out, heads, w.out_w, w.out_b, B * T, C, C);
}

// d_qkv is (B,T,3C) and d_heads (B,T,C): zeroed scratch; dx accumulates
static void self_attention_backward(real *dx, AttentionParams g, real *d_qkv, real *d_heads,
                                    real *row_scratch, const real *dout,
                                    const real *qkv, const real *att, const real *heads,
                                    const real *x, AttentionParams w, const int *len, int causal,
                                    int B, int T, int C, int NH) {
    // out = heads W^O^T + b^O
    linear_backward(d_heads, g.out_w, g.out_b, dout, heads, w.out_w, B * T, C, C);
    // heads = Attention(q, k, v)
    attention_backward(d_qkv, d_qkv + C, d_qkv + 2 * C, row_scratch, d_heads, att,
                       qkv, qkv + C, qkv + 2 * C, 3 * C, 3 * C, len, causal, B, T, T, C, NH);
    // qkv = x W_qkv^T + b_qkv
    linear_backward(dx, g.qkv_w, g.qkv_b, d_qkv, x, w.qkv_w, B * T, C, 3 * C);
}

// out is (B,T,C); q (B,T,C), kv (B,S,2C), att (B,NH,T,S), heads (B,T,C) kept for backward
static void cross_attention_forward(real *out, real *q, real *kv, real *att, real *heads,
                                    const real *x, const real *memory, AttentionParams w,
                                    const int *src_len, int B, int T, int S, int C, int NH) {
    linear_forward(q, x, w.qkv_w, w.qkv_b, B * T, C, C);
    linear_forward(kv, memory, w.qkv_w + (size_t)C * C, w.qkv_b + C, B * S, C, 2 * C);
    attention_forward(heads, att, q, kv, kv + C, C, 2 * C, src_len, 0, B, T, S, C, NH);
    linear_forward(out, heads, w.out_w, w.out_b, B * T, C, C);
}

// d_q (B,T,C), d_kv (B,S,2C), d_heads (B,T,C): zeroed scratch; dx and dmemory accumulate
static void cross_attention_backward(real *dx, real *dmemory, AttentionParams g,
                                     real *d_q, real *d_kv, real *d_heads, real *row_scratch,
                                     const real *dout, const real *q, const real *kv,
                                     const real *att, const real *heads, const real *x,
                                     const real *memory, AttentionParams w, const int *src_len,
                                     int B, int T, int S, int C, int NH) {
    // out = heads W^O^T + b^O
    linear_backward(d_heads, g.out_w, g.out_b, dout, heads, w.out_w, B * T, C, C);
    // heads = Attention(q, k, v), keys and values from the encoder
    attention_backward(d_q, d_kv, d_kv + C, row_scratch, d_heads, att, q, kv, kv + C,
                       C, 2 * C, src_len, 0, B, T, S, C, NH);
    // q = x W_q^T + b_q
    linear_backward(dx, g.qkv_w, g.qkv_b, d_q, x, w.qkv_w, B * T, C, C);
    // kv = memory W_kv^T + b_kv
    linear_backward(dmemory, g.qkv_w + (size_t)C * C, g.qkv_b + C, d_kv, memory,
                    w.qkv_w + (size_t)C * C, B * S, C, 2 * C);
}

// ============================================================================
// §3.3  Position-wise feed-forward networks
//     FFN(x) = max(0, x W_1 + b_1) W_2 + b_2                            (eq. 2)
// "applied to each position separately and identically": a matrix product
// over all B*T rows at once.
// ============================================================================

// h = max(0, h) in place
static void relu_forward(real *h, size_t n) {
    for (size_t i = 0; i < n; i++) h[i] = h[i] > 0 ? h[i] : 0;
}

// Differentiates  h = max(0, a): da = dh where h > 0 (the same as a > 0), else 0.
// In place: dh becomes da.
static void relu_backward(real *dh, const real *h, size_t n) {
    for (size_t i = 0; i < n; i++) if (!(h[i] > 0)) dh[i] = 0;
}

// One layer's FFN parameters (or their gradients).
typedef struct { real *w1, *b1, *w2, *b2; } FeedForwardParams;

// out is (N,C), h (N,F) = max(0, x W_1^T + b_1) is kept for backward
static void feed_forward_forward(real *out, real *h, const real *x, FeedForwardParams w,
                                 int N, int C, int F) {
    linear_forward(h, x, w.w1, w.b1, N, C, F);
    relu_forward(h, (size_t)N * F);
    linear_forward(out, h, w.w2, w.b2, N, F, C);
}

// d_h (N,F) is zeroed scratch; dx accumulates
static void feed_forward_backward(real *dx, FeedForwardParams g, real *d_h, const real *dout,
                                  const real *h, const real *x, FeedForwardParams w,
                                  int N, int C, int F) {
    // out = h W_2^T + b_2
    linear_backward(d_h, g.w2, g.b2, dout, h, w.w2, N, F, C);
    // h = max(0, a)
    relu_backward(d_h, h, (size_t)N * F);
    // a = x W_1^T + b_1
    linear_backward(dx, g.w1, g.b1, d_h, x, w.w1, N, C, F);
}

// ============================================================================
// §3.4  Embeddings and softmax
// "we share the same weight matrix between the two embedding layers and the
// pre-softmax linear transformation ... In the embedding layers, we multiply
// those weights by sqrt(d_model)." One (V, C) matrix E serves three times:
//     source:  x = E[token] * sqrt(C) + PE[pos]
//     target:  y = E[token] * sqrt(C) + PE[pos]
//     output:  logits = decoder_output E^T
// ============================================================================

// out is (B,T,C), tokens (B,T), embedding (V,C), pe (max_len, C)
static void embedding_forward(real *out, const int *tokens, const real *embedding,
                              const real *pe, int B, int T, int C) {
    real scale = real_sqrt((real)C);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const real *e = embedding + (size_t)tokens[b * T + t] * C;
            const real *pos = pe + (size_t)t * C;
            real *o = out + ((size_t)b * T + t) * C;
            for (int i = 0; i < C; i++) o[i] = e[i] * scale + pos[i];
        }
    }
}

// Differentiates  out[b,t,i] = embedding[tokens[b,t], i] * sqrt(C) + pe[t,i].
// Serial: two positions holding the same token add into the same row.
static void embedding_backward(real *dembedding, const real *dout, const int *tokens,
                               int B, int T, int C) {
    real scale = real_sqrt((real)C);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            real *de = dembedding + (size_t)tokens[b * T + t] * C;
            const real *g = dout + ((size_t)b * T + t) * C;
            for (int i = 0; i < C; i++) de[i] += g[i] * scale;
        }
    }
}

// ============================================================================
// §3.5  Positional encoding
//     PE(pos, 2i)   = sin(pos / 10000^(2i/d_model))
//     PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))
// Interleaved as in the paper (tensor2tensor's code concatenates the sines and
// then the cosines instead). Computed once, in double, and added to the
// embeddings; it has no parameters and so no backward.
// ============================================================================

// pe is (max_len, C)
static void positional_encoding_init(real *pe, int max_len, int C) {
    for (int pos = 0; pos < max_len; pos++) {
        for (int i = 0; 2 * i < C; i++) {
            double angle = pos / pow(10000.0, (2.0 * i) / C);
            pe[(size_t)pos * C + 2 * i] = (real)sin(angle);
            if (2 * i + 1 < C) pe[(size_t)pos * C + 2 * i + 1] = (real)cos(angle);
        }
    }
}

// ============================================================================
// §3.1  Encoder and decoder stacks
// "The encoder is composed of a stack of N identical layers. Each layer has
// two sub-layers ... multi-head self-attention ... and a simple, position-wise
// fully connected feed-forward network." The decoder "inserts a third
// sub-layer, which performs multi-head attention over the output of the
// encoder stack", and masks its self-attention. Post-norm, as published:
//
//   encoder layer                       decoder layer
//   x ─┬─ self-attention ─ drop ─(+)─ LN    y ─┬─ masked self-attn ─ drop ─(+)─ LN ─┐
//      └──────────────────────────┘            └──────────────────────────┘        │
//   ─┬─ FFN ─ drop ─(+)─ LN ─> out       ┌─────────────────────────────────────────┘
//    └────────────────────┘              ├─ attention over memory ─ drop ─(+)─ LN ─┐
//                                        └────────────────────────────────┘        │
//                                        ┌─────────────────────────────────────────┘
//                                        ├─ FFN ─ drop ─(+)─ LN ─> out
//                                        └────────────────────┘
// No layer norm follows the last layer of either stack in the published model.
// ============================================================================

typedef struct {
    AttentionParams self_attn;
    real *ln1_g, *ln1_b;
    FeedForwardParams ffn;
    real *ln2_g, *ln2_b;
} EncoderLayerParams;

typedef struct {
    AttentionParams self_attn;
    real *ln1_g, *ln1_b;
    AttentionParams cross_attn;
    real *ln2_g, *ln2_b;
    FeedForwardParams ffn;
    real *ln3_g, *ln3_b;
} DecoderLayerParams;

static AttentionParams attention_params_at(real *qkv_w, real *qkv_b, real *out_w, real *out_b,
                                           size_t l, size_t C) {
    AttentionParams a = { qkv_w + l * 3 * C * C, qkv_b + l * 3 * C, out_w + l * C * C, out_b + l * C };
    return a;
}

static FeedForwardParams feed_forward_params_at(real *w1, real *b1, real *w2, real *b2,
                                                size_t l, size_t C, size_t F) {
    FeedForwardParams f = { w1 + l * F * C, b1 + l * F, w2 + l * C * F, b2 + l * C };
    return f;
}

// Layer l's view into a ParameterTensors (the parameters or the gradients).
static EncoderLayerParams encoder_layer_params(ParameterTensors *p, const TransformerConfig *c, int layer) {
    size_t l = layer, C = c->d_model, F = c->d_ff;
    EncoderLayerParams e;
    e.self_attn = attention_params_at(p->enc_qkv_w, p->enc_qkv_b, p->enc_out_w, p->enc_out_b, l, C);
    e.ln1_g = p->enc_ln1_g + l * C;
    e.ln1_b = p->enc_ln1_b + l * C;
    e.ffn = feed_forward_params_at(p->enc_ff1_w, p->enc_ff1_b, p->enc_ff2_w, p->enc_ff2_b, l, C, F);
    e.ln2_g = p->enc_ln2_g + l * C;
    e.ln2_b = p->enc_ln2_b + l * C;
    return e;
}

static DecoderLayerParams decoder_layer_params(ParameterTensors *p, const TransformerConfig *c, int layer) {
    size_t l = layer, C = c->d_model, F = c->d_ff;
    DecoderLayerParams d;
    d.self_attn = attention_params_at(p->dec_self_qkv_w, p->dec_self_qkv_b,
                                      p->dec_self_out_w, p->dec_self_out_b, l, C);
    d.ln1_g = p->dec_ln1_g + l * C;
    d.ln1_b = p->dec_ln1_b + l * C;
    d.cross_attn = attention_params_at(p->dec_cross_qkv_w, p->dec_cross_qkv_b,
                                       p->dec_cross_out_w, p->dec_cross_out_b, l, C);
    d.ln2_g = p->dec_ln2_g + l * C;
    d.ln2_b = p->dec_ln2_b + l * C;
    d.ffn = feed_forward_params_at(p->dec_ff1_w, p->dec_ff1_b, p->dec_ff2_w, p->dec_ff2_b, l, C, F);
    d.ln3_g = p->dec_ln3_g + l * C;
    d.ln3_b = p->dec_ln3_b + l * C;
    return d;
}

// Layer l's slice of the activations.
typedef struct {
    real *qkv, *att, *heads, *att_proj, *drop1, *res1, *ln1, *ln1_mean, *ln1_rstd;
    real *ff_h, *ff_out, *drop2, *res2, *ln2, *ln2_mean, *ln2_rstd;
} EncoderLayerActs;

typedef struct {
    real *self_qkv, *self_att, *self_heads, *self_proj, *drop1, *res1, *ln1, *ln1_mean, *ln1_rstd;
    real *cross_q, *cross_kv, *cross_att, *cross_heads, *cross_proj, *drop2, *res2,
         *ln2, *ln2_mean, *ln2_rstd;
    real *ff_h, *ff_out, *drop3, *res3, *ln3, *ln3_mean, *ln3_rstd;
} DecoderLayerActs;

static EncoderLayerActs encoder_layer_acts(const Transformer *m, int layer) {
    const ActivationTensors *a = &m->acts;
    size_t l = layer, B = m->B, S = m->S, C = m->config.d_model, F = m->config.d_ff;
    size_t NH = m->config.n_heads, BSC = B * S * C, BS = B * S;
    EncoderLayerActs e = {
        a->enc_qkv + l * 3 * BSC, a->enc_att + l * B * NH * S * S, a->enc_heads + l * BSC,
        a->enc_att_proj + l * BSC, a->enc_drop1 + l * BSC, a->enc_res1 + l * BSC,
        a->enc_ln1 + l * BSC, a->enc_ln1_mean + l * BS, a->enc_ln1_rstd + l * BS,
        a->enc_ff_h + l * BS * F, a->enc_ff_out + l * BSC, a->enc_drop2 + l * BSC,
        a->enc_res2 + l * BSC, a->enc_ln2 + l * BSC, a->enc_ln2_mean + l * BS,
        a->enc_ln2_rstd + l * BS,
    };
    return e;
}

static DecoderLayerActs decoder_layer_acts(const Transformer *m, int layer) {
    const ActivationTensors *a = &m->acts;
    size_t l = layer, B = m->B, S = m->S, T = m->T, C = m->config.d_model, F = m->config.d_ff;
    size_t NH = m->config.n_heads, BTC = B * T * C, BT = B * T;
    DecoderLayerActs d = {
        a->dec_self_qkv + l * 3 * BTC, a->dec_self_att + l * B * NH * T * T,
        a->dec_self_heads + l * BTC, a->dec_self_proj + l * BTC, a->dec_drop1 + l * BTC,
        a->dec_res1 + l * BTC, a->dec_ln1 + l * BTC, a->dec_ln1_mean + l * BT,
        a->dec_ln1_rstd + l * BT,
        a->dec_cross_q + l * BTC, a->dec_cross_kv + l * 2 * B * S * C,
        a->dec_cross_att + l * B * NH * T * S, a->dec_cross_heads + l * BTC,
        a->dec_cross_proj + l * BTC, a->dec_drop2 + l * BTC, a->dec_res2 + l * BTC,
        a->dec_ln2 + l * BTC, a->dec_ln2_mean + l * BT, a->dec_ln2_rstd + l * BT,
        a->dec_ff_h + l * BT * F, a->dec_ff_out + l * BTC, a->dec_drop3 + l * BTC,
        a->dec_res3 + l * BTC, a->dec_ln3 + l * BTC, a->dec_ln3_mean + l * BT,
        a->dec_ln3_rstd + l * BT,
    };
    return d;
}

// out = la.ln2, the layer's output; x is (B,S,C), src_len is (B)
static void encoder_layer_forward(EncoderLayerActs la, const real *x, EncoderLayerParams w,
                                  const int *src_len, Transformer *m, int B, int S) {
    const TransformerConfig *c = &m->config;
    int C = c->d_model, N = B * S;
    size_t n = (size_t)N * C;
    // sub-layer 1: LayerNorm(x + Dropout(SelfAttention(x)))
    self_attention_forward(la.att_proj, la.qkv, la.att, la.heads, x, w.self_attn, src_len, 0,
                           B, S, C, c->n_heads);
    dropout_mask(la.drop1, c->dropout, m->training, &m->dropout_rng, n);
    residual_dropout_forward(la.res1, x, la.att_proj, la.drop1, n);
    layernorm_forward(la.ln1, la.ln1_mean, la.ln1_rstd, la.res1, w.ln1_g, w.ln1_b, N, C, c->layer_norm_eps);
    // sub-layer 2: LayerNorm(x + Dropout(FFN(x)))
    feed_forward_forward(la.ff_out, la.ff_h, la.ln1, w.ffn, N, C, c->d_ff);
    dropout_mask(la.drop2, c->dropout, m->training, &m->dropout_rng, n);
    residual_dropout_forward(la.res2, la.ln1, la.ff_out, la.drop2, n);
    layernorm_forward(la.ln2, la.ln2_mean, la.ln2_rstd, la.res2, w.ln2_g, w.ln2_b, N, C, c->layer_norm_eps);
}

static void zero(real *x, size_t n) { memset(x, 0, n * sizeof(real)); }

// dx accumulates dL/dx given dout = dL/d(la.ln2); g accumulates the parameter gradients
static void encoder_layer_backward(real *dx, EncoderLayerParams g, const real *dout,
                                   EncoderLayerActs la, const real *x, EncoderLayerParams w,
                                   const int *src_len, Transformer *m, int B, int S) {
    const TransformerConfig *c = &m->config;
    BackwardScratch *s = &m->scratch;
    int C = c->d_model, F = c->d_ff, N = B * S;
    size_t n = (size_t)N * C;
    // ln2 = LayerNorm(res2)
    zero(s->d_a, n);
    layernorm_backward(s->d_a, g.ln2_g, g.ln2_b, dout, la.res2, w.ln2_g, la.ln2_mean, la.ln2_rstd, N, C);
    // res2 = ln1 + Dropout(ff_out),  ff_out = FFN(ln1)
    zero(s->d_b, n); zero(s->d_c, n);
    residual_dropout_backward(s->d_b, s->d_c, s->d_a, la.drop2, n);
    zero(s->d_wide, (size_t)N * F);
    feed_forward_backward(s->d_b, g.ffn, s->d_wide, s->d_c, la.ff_h, la.ln1, w.ffn, N, C, F);
    // ln1 = LayerNorm(res1)
    zero(s->d_a, n);
    layernorm_backward(s->d_a, g.ln1_g, g.ln1_b, s->d_b, la.res1, w.ln1_g, la.ln1_mean, la.ln1_rstd, N, C);
    // res1 = x + Dropout(att_proj),  att_proj = SelfAttention(x)
    zero(s->d_c, n);
    residual_dropout_backward(dx, s->d_c, s->d_a, la.drop1, n);
    zero(s->d_b, n); zero(s->d_wide, 3 * n);
    self_attention_backward(dx, g.self_attn, s->d_wide, s->d_b, s->d_att_row, s->d_c,
                            la.qkv, la.att, la.heads, x, w.self_attn, src_len, 0, B, S, C, c->n_heads);
}

// out = la.ln3; y is (B,T,C), memory (the encoder output) is (B,S,C)
static void decoder_layer_forward(DecoderLayerActs la, const real *y, const real *memory,
                                  DecoderLayerParams w, const Batch *batch, Transformer *m) {
    const TransformerConfig *c = &m->config;
    int B = batch->B, S = batch->S, T = batch->T, C = c->d_model, N = B * T;
    size_t n = (size_t)N * C;
    // sub-layer 1: LayerNorm(y + Dropout(MaskedSelfAttention(y)))
    self_attention_forward(la.self_proj, la.self_qkv, la.self_att, la.self_heads, y, w.self_attn,
                           batch->tgt_len, 1, B, T, C, c->n_heads);
    dropout_mask(la.drop1, c->dropout, m->training, &m->dropout_rng, n);
    residual_dropout_forward(la.res1, y, la.self_proj, la.drop1, n);
    layernorm_forward(la.ln1, la.ln1_mean, la.ln1_rstd, la.res1, w.ln1_g, w.ln1_b, N, C, c->layer_norm_eps);
    // sub-layer 2: LayerNorm(ln1 + Dropout(Attention(ln1, memory)))
    cross_attention_forward(la.cross_proj, la.cross_q, la.cross_kv, la.cross_att, la.cross_heads,
                            la.ln1, memory, w.cross_attn, batch->src_len, B, T, S, C, c->n_heads);
    dropout_mask(la.drop2, c->dropout, m->training, &m->dropout_rng, n);
    residual_dropout_forward(la.res2, la.ln1, la.cross_proj, la.drop2, n);
    layernorm_forward(la.ln2, la.ln2_mean, la.ln2_rstd, la.res2, w.ln2_g, w.ln2_b, N, C, c->layer_norm_eps);
    // sub-layer 3: LayerNorm(ln2 + Dropout(FFN(ln2)))
    feed_forward_forward(la.ff_out, la.ff_h, la.ln2, w.ffn, N, C, c->d_ff);
    dropout_mask(la.drop3, c->dropout, m->training, &m->dropout_rng, n);
    residual_dropout_forward(la.res3, la.ln2, la.ff_out, la.drop3, n);
    layernorm_forward(la.ln3, la.ln3_mean, la.ln3_rstd, la.res3, w.ln3_g, w.ln3_b, N, C, c->layer_norm_eps);
}

// dy accumulates dL/dy, dmemory accumulates dL/d(memory), given dout = dL/d(la.ln3)
static void decoder_layer_backward(real *dy, real *dmemory, DecoderLayerParams g, const real *dout,
                                   DecoderLayerActs la, const real *y, const real *memory,
                                   DecoderLayerParams w, const Batch *batch, Transformer *m) {
    const TransformerConfig *c = &m->config;
    BackwardScratch *s = &m->scratch;
    int B = batch->B, S = batch->S, T = batch->T, C = c->d_model, F = c->d_ff, N = B * T;
    size_t n = (size_t)N * C;
    // ln3 = LayerNorm(res3)
    zero(s->d_a, n);
    layernorm_backward(s->d_a, g.ln3_g, g.ln3_b, dout, la.res3, w.ln3_g, la.ln3_mean, la.ln3_rstd, N, C);
    // res3 = ln2 + Dropout(ff_out),  ff_out = FFN(ln2)
    zero(s->d_b, n); zero(s->d_c, n);
    residual_dropout_backward(s->d_b, s->d_c, s->d_a, la.drop3, n);
    zero(s->d_wide, (size_t)N * F);
    feed_forward_backward(s->d_b, g.ffn, s->d_wide, s->d_c, la.ff_h, la.ln2, w.ffn, N, C, F);
    // ln2 = LayerNorm(res2)
    zero(s->d_a, n);
    layernorm_backward(s->d_a, g.ln2_g, g.ln2_b, s->d_b, la.res2, w.ln2_g, la.ln2_mean, la.ln2_rstd, N, C);
    // res2 = ln1 + Dropout(cross_proj),  cross_proj = Attention(ln1, memory)
    zero(s->d_b, n); zero(s->d_c, n);
    residual_dropout_backward(s->d_b, s->d_c, s->d_a, la.drop2, n);
    zero(s->d_a, n); zero(s->d_wide, n); zero(s->d_kv, (size_t)B * S * 2 * C);
    cross_attention_backward(s->d_b, dmemory, g.cross_attn, s->d_wide, s->d_kv, s->d_a,
                             s->d_att_row, s->d_c, la.cross_q, la.cross_kv, la.cross_att,
                             la.cross_heads, la.ln1, memory, w.cross_attn, batch->src_len,
                             B, T, S, C, c->n_heads);
    // ln1 = LayerNorm(res1)
    zero(s->d_a, n);
    layernorm_backward(s->d_a, g.ln1_g, g.ln1_b, s->d_b, la.res1, w.ln1_g, la.ln1_mean, la.ln1_rstd, N, C);
    // res1 = y + Dropout(self_proj),  self_proj = MaskedSelfAttention(y)
    zero(s->d_c, n);
    residual_dropout_backward(dy, s->d_c, s->d_a, la.drop1, n);
    zero(s->d_b, n); zero(s->d_wide, 3 * n);
    self_attention_backward(dy, g.self_attn, s->d_wide, s->d_b, s->d_att_row, s->d_c,
                            la.self_qkv, la.self_att, la.self_heads, y, w.self_attn,
                            batch->tgt_len, 1, B, T, C, c->n_heads);
}

// ============================================================================
// §5.4  Label smoothing, and the loss
// "During training, we employed label smoothing of value eps_ls = 0.1." The
// target distribution at each position is, as in PyTorch's cross_entropy,
//     q_k = (1 - eps_ls) [k == y] + eps_ls / V
// and the loss is the cross-entropy -sum_k q_k log p_k with p = softmax(logits),
// averaged over the non-padding target positions.
// ============================================================================

// token_loss is (B,T), probs (B,T,V), logits (B,T,V), targets (B,T), tgt_len (B).
// Returns the mean loss; *num_tokens gets the number of non-padding positions.
static double cross_entropy_forward(real *token_loss, real *probs, const real *logits,
                                    const int *targets, const int *tgt_len, float label_smoothing,
                                    int B, int T, int V, int *num_tokens) {
    real eps = (real)label_smoothing;
    OMP(parallel for)
    for (int bt = 0; bt < B * T; bt++) {
        const real *z = logits + (size_t)bt * V;
        real *p = probs + (size_t)bt * V;
        if (bt % T >= tgt_len[bt / T]) { // padding: no loss, no probabilities
            token_loss[bt] = 0;
            for (int k = 0; k < V; k++) p[k] = 0;
            continue;
        }
        // log p_k = z_k - logsumexp(z), computed around the maximum
        real max_z = z[0];
        for (int k = 1; k < V; k++) if (z[k] > max_z) max_z = z[k];
        real sum = 0, sum_z = 0;
        for (int k = 0; k < V; k++) {
            sum += real_exp(z[k] - max_z);
            sum_z += z[k];
        }
        real log_sum = max_z + real_log(sum);
        for (int k = 0; k < V; k++) p[k] = real_exp(z[k] - log_sum);
        // -sum_k q_k log p_k = -(1-eps) log p_y - (eps/V) sum_k log p_k
        real log_p_target = z[targets[bt]] - log_sum;
        real sum_log_p = sum_z - V * log_sum;
        token_loss[bt] = -(1 - eps) * log_p_target - eps / V * sum_log_p;
    }
    double total = 0;
    int count = 0;
    for (int bt = 0; bt < B * T; bt++) {
        if (bt % T < tgt_len[bt / T]) { total += token_loss[bt]; count++; }
    }
    *num_tokens = count;
    return count ? total / count : 0.0;
}

// Differentiates  loss = (1/n) sum_positions -sum_k q_k log softmax(z)_k:
// for a softmax followed by cross-entropy against a distribution q that sums
// to one, dloss/dz_k = p_k - q_k, here divided by the n non-padding positions.
static void cross_entropy_backward(real *dlogits, const real *probs, const int *targets,
                                   const int *tgt_len, float label_smoothing, int num_tokens,
                                   int B, int T, int V) {
    real eps = (real)label_smoothing, inv_n = (real)(1.0 / num_tokens);
    OMP(parallel for)
    for (int bt = 0; bt < B * T; bt++) {
        if (bt % T >= tgt_len[bt / T]) continue;
        const real *p = probs + (size_t)bt * V;
        real *dz = dlogits + (size_t)bt * V;
        for (int k = 0; k < V; k++) {
            real q = eps / V + (k == targets[bt] ? 1 - eps : 0);
            dz[k] += (p[k] - q) * inv_n;
        }
    }
}

// ============================================================================
// The model: allocation, the whole forward pass, the whole backward pass
// ============================================================================

static void activation_sizes(size_t sizes[NUM_ACTIVATION_TENSORS], const TransformerConfig *c,
                             size_t B, size_t S, size_t T) {
    size_t L = c->n_layers, C = c->d_model, F = c->d_ff, NH = c->n_heads, V = c->vocab_size;
    size_t BSC = B * S * C, BTC = B * T * C, BS = B * S, BT = B * T;
    size_t list[NUM_ACTIVATION_TENSORS] = {
        BSC, BSC, BSC,                                                  // enc embedded, mask, x0
        L * 3 * BSC, L * B * NH * S * S, L * BSC, L * BSC, L * BSC, L * BSC,  // qkv .. res1
        L * BSC, L * BS, L * BS,                                        // ln1
        L * BS * F, L * BSC, L * BSC, L * BSC,                          // ff_h .. res2
        L * BSC, L * BS, L * BS,                                        // ln2
        BTC, BTC, BTC,                                                  // dec embedded, mask, x0
        L * 3 * BTC, L * B * NH * T * T, L * BTC, L * BTC, L * BTC, L * BTC,  // self qkv .. res1
        L * BTC, L * BT, L * BT,                                        // ln1
        L * BTC, L * 2 * BSC, L * B * NH * T * S, L * BTC, L * BTC, L * BTC, L * BTC, // cross
        L * BTC, L * BT, L * BT,                                        // ln2
        L * BT * F, L * BTC, L * BTC, L * BTC,                          // ff_h .. res3
        L * BTC, L * BT, L * BT,                                        // ln3
        BT * V, BT * V, BT,                                             // logits, probs, token loss
    };
    memcpy(sizes, list, sizeof list);
}

static void point_activations(ActivationTensors *a, real *memory, const size_t sizes[NUM_ACTIVATION_TENSORS]) {
    real **list[NUM_ACTIVATION_TENSORS] = {
        &a->enc_embedded, &a->enc_emb_mask, &a->enc_x0,
        &a->enc_qkv, &a->enc_att, &a->enc_heads, &a->enc_att_proj, &a->enc_drop1, &a->enc_res1,
        &a->enc_ln1, &a->enc_ln1_mean, &a->enc_ln1_rstd,
        &a->enc_ff_h, &a->enc_ff_out, &a->enc_drop2, &a->enc_res2,
        &a->enc_ln2, &a->enc_ln2_mean, &a->enc_ln2_rstd,
        &a->dec_embedded, &a->dec_emb_mask, &a->dec_x0,
        &a->dec_self_qkv, &a->dec_self_att, &a->dec_self_heads, &a->dec_self_proj, &a->dec_drop1,
        &a->dec_res1, &a->dec_ln1, &a->dec_ln1_mean, &a->dec_ln1_rstd,
        &a->dec_cross_q, &a->dec_cross_kv, &a->dec_cross_att, &a->dec_cross_heads,
        &a->dec_cross_proj, &a->dec_drop2, &a->dec_res2,
        &a->dec_ln2, &a->dec_ln2_mean, &a->dec_ln2_rstd,
        &a->dec_ff_h, &a->dec_ff_out, &a->dec_drop3, &a->dec_res3,
        &a->dec_ln3, &a->dec_ln3_mean, &a->dec_ln3_rstd,
        &a->logits, &a->probs, &a->token_loss,
    };
    for (int i = 0; i < NUM_ACTIVATION_TENSORS; i++) {
        *list[i] = memory;
        memory += sizes[i];
    }
}

#define NUM_SCRATCH_TENSORS 10
static void scratch_sizes(size_t sizes[NUM_SCRATCH_TENSORS], const TransformerConfig *c,
                          size_t B, size_t S, size_t T) {
    size_t C = c->d_model, F = c->d_ff, NH = c->n_heads, V = c->vocab_size;
    size_t rows = B * (S > T ? S : T), wide = 3 * C > F ? 3 * C : F;
    size_t list[NUM_SCRATCH_TENSORS] = {
        rows * C, rows * C, rows * C, rows * C, rows * C,  // d_x d_y d_a d_b d_c
        rows * wide, B * S * 2 * C, B * S * C,             // d_wide d_kv d_memory
        NH * rows, B * T * V,                              // d_att_row d_logits
    };
    memcpy(sizes, list, sizeof list);
}

static void point_scratch(BackwardScratch *s, real *memory, const size_t sizes[NUM_SCRATCH_TENSORS]) {
    real **list[NUM_SCRATCH_TENSORS] = {
        &s->d_x, &s->d_y, &s->d_a, &s->d_b, &s->d_c, &s->d_wide, &s->d_kv, &s->d_memory,
        &s->d_att_row, &s->d_logits,
    };
    for (int i = 0; i < NUM_SCRATCH_TENSORS; i++) {
        *list[i] = memory;
        memory += sizes[i];
    }
}

static size_t sum_sizes(const size_t *sizes, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += sizes[i];
    return total;
}

// Makes the activation and scratch buffers big enough for a (B, S, T) batch.
// A smaller batch reuses them: per-layer offsets are computed from the actual
// B, S, T, which fit inside every tensor's capacity.
static void ensure_buffers(Transformer *m, int B, int S, int T) {
    if (m->acts_memory && B <= m->cap_B && S <= m->cap_S && T <= m->cap_T) return;
    if (B < m->cap_B) B = m->cap_B;
    if (S < m->cap_S) S = m->cap_S;
    if (T < m->cap_T) T = m->cap_T;
    free(m->acts_memory);
    free(m->scratch_memory);
    size_t sizes[NUM_ACTIVATION_TENSORS], scratch[NUM_SCRATCH_TENSORS];
    activation_sizes(sizes, &m->config, B, S, T);
    scratch_sizes(scratch, &m->config, B, S, T);
    m->acts_memory = checked_calloc(sum_sizes(sizes, NUM_ACTIVATION_TENSORS), sizeof(real), "activations");
    m->scratch_memory = checked_calloc(sum_sizes(scratch, NUM_SCRATCH_TENSORS), sizeof(real), "backward scratch");
    point_activations(&m->acts, m->acts_memory, sizes);
    point_scratch(&m->scratch, m->scratch_memory, scratch);
    m->cap_B = B; m->cap_S = S; m->cap_T = T;
}

const char *transformer_build(Transformer *m, const TransformerConfig *config, uint64_t seed) {
    memset(m, 0, sizeof *m);
    const char *error = transformer_config_check(config);
    if (error) return error;
    m->config = *config;
    parameter_sizes(m->param_sizes, config);
    m->num_parameters = sum_sizes(m->param_sizes, NUM_PARAMETER_TENSORS);
    m->params_memory = checked_calloc(m->num_parameters, sizeof(real), "parameters");
    m->grads_memory = checked_calloc(m->num_parameters, sizeof(real), "gradients");
    m->adam_m = checked_calloc(m->num_parameters, sizeof(real), "Adam first moments");
    m->adam_v = checked_calloc(m->num_parameters, sizeof(real), "Adam second moments");
    point_parameters(&m->params, m->params_memory, m->param_sizes);
    point_parameters(&m->grads, m->grads_memory, m->param_sizes);
    m->adam.beta1 = 0.9f;   // §5.3
    m->adam.beta2 = 0.98f;
    m->adam.eps = 1e-9f;
    m->positional_encoding = checked_calloc((size_t)config->max_len * config->d_model, sizeof(real),
                                            "positional encoding");
    positional_encoding_init(m->positional_encoding, config->max_len, config->d_model);
    initialize_parameters(m, seed);
    rng_seed(&m->dropout_rng, seed ^ 0xD0D0D0D0ULL);
    m->training = 1;
    return NULL;
}

void transformer_free(Transformer *m) {
    free(m->params_memory); free(m->grads_memory); free(m->adam_m); free(m->adam_v);
    free(m->positional_encoding); free(m->acts_memory); free(m->scratch_memory);
    memset(m, 0, sizeof *m);
}

// Returns NULL when the batch fits the model, else what is wrong with it.
const char *batch_check(const Batch *batch, const TransformerConfig *c) {
    static char message[200];
    #define BATCH_REQUIRE(cond, ...) do { if (!(cond)) { \
        snprintf(message, sizeof message, __VA_ARGS__); return message; } } while (0)
    BATCH_REQUIRE(batch->B >= 1 && batch->S >= 1 && batch->T >= 1,
                  "batch shape %d x %d x %d, expected positive sizes", batch->B, batch->S, batch->T);
    BATCH_REQUIRE(batch->S <= c->max_len && batch->T <= c->max_len,
                  "batch lengths %d (source) and %d (target) exceed max_len %d",
                  batch->S, batch->T, c->max_len);
    for (int b = 0; b < batch->B; b++) {
        BATCH_REQUIRE(batch->src_len[b] >= 1 && batch->src_len[b] <= batch->S,
                      "sentence %d: source length %d, expected 1..%d", b, batch->src_len[b], batch->S);
        BATCH_REQUIRE(batch->tgt_len[b] >= 1 && batch->tgt_len[b] <= batch->T,
                      "sentence %d: target length %d, expected 1..%d", b, batch->tgt_len[b], batch->T);
        for (int s = 0; s < batch->S; s++) {
            int tok = batch->src[b * batch->S + s];
            BATCH_REQUIRE(tok >= 0 && tok < c->vocab_size,
                          "sentence %d: source token %d at %d outside the vocabulary 0..%d",
                          b, tok, s, c->vocab_size - 1);
        }
        for (int t = 0; t < batch->T; t++) {
            int in = batch->tgt_in[b * batch->T + t], out = batch->tgt_out[b * batch->T + t];
            BATCH_REQUIRE(in >= 0 && in < c->vocab_size && out >= 0 && out < c->vocab_size,
                          "sentence %d: target token %d/%d at %d outside the vocabulary 0..%d",
                          b, in, out, t, c->vocab_size - 1);
        }
    }
    #undef BATCH_REQUIRE
    return NULL;
}

// The encoder stack: memory = Encoder(source). Returns the memory (B,S,C).
static const real *encoder_forward(Transformer *m, const Batch *batch) {
    const TransformerConfig *c = &m->config;
    ActivationTensors *a = &m->acts;
    int B = batch->B, S = batch->S, C = c->d_model;
    size_t n = (size_t)B * S * C;
    // §3.4, §3.5: embed, scale, add positions; §5.4: dropout on the sum
    embedding_forward(a->enc_embedded, batch->src, m->params.embedding, m->positional_encoding, B, S, C);
    dropout_mask(a->enc_emb_mask, c->dropout, m->training, &m->dropout_rng, n);
    dropout_forward(a->enc_x0, a->enc_embedded, a->enc_emb_mask, n);
    const real *x = a->enc_x0;
    for (int l = 0; l < c->n_layers; l++) {
        EncoderLayerActs la = encoder_layer_acts(m, l);
        encoder_layer_forward(la, x, encoder_layer_params(&m->params, c, l), batch->src_len, m, B, S);
        x = la.ln2;
    }
    return x;
}

// The decoder stack and the output projection: logits = Decoder(target, memory) E^T
static void decoder_forward(Transformer *m, const Batch *batch, const real *memory) {
    const TransformerConfig *c = &m->config;
    ActivationTensors *a = &m->acts;
    int B = batch->B, T = batch->T, C = c->d_model;
    size_t n = (size_t)B * T * C;
    embedding_forward(a->dec_embedded, batch->tgt_in, m->params.embedding, m->positional_encoding, B, T, C);
    dropout_mask(a->dec_emb_mask, c->dropout, m->training, &m->dropout_rng, n);
    dropout_forward(a->dec_x0, a->dec_embedded, a->dec_emb_mask, n);
    const real *y = a->dec_x0;
    for (int l = 0; l < c->n_layers; l++) {
        DecoderLayerActs la = decoder_layer_acts(m, l);
        decoder_layer_forward(la, y, memory, decoder_layer_params(&m->params, c, l), batch, m);
        y = la.ln3;
    }
    // §3.4 the pre-softmax linear transformation shares the embedding matrix
    linear_forward(a->logits, y, m->params.embedding, NULL, B * T, C, c->vocab_size);
}

// The whole forward pass; returns the label-smoothed loss (§5.4). The batch
// must pass batch_check; one that does not stops the program with a message
// rather than read outside the embedding.
real transformer_forward(Transformer *m, const Batch *batch) {
    const char *error = batch_check(batch, &m->config);
    if (error) {
        fprintf(stderr, "error: transformer_forward: %s\n", error);
        exit(1);
    }
    ensure_buffers(m, batch->B, batch->S, batch->T);
    m->B = batch->B; m->S = batch->S; m->T = batch->T;
    const real *memory = encoder_forward(m, batch);
    decoder_forward(m, batch, memory);
    m->loss = (real)cross_entropy_forward(m->acts.token_loss, m->acts.probs, m->acts.logits,
                                          batch->tgt_out, batch->tgt_len, m->config.label_smoothing,
                                          batch->B, batch->T, m->config.vocab_size,
                                          &m->num_target_tokens);
    return m->loss;
}

void transformer_zero_grad(Transformer *m) {
    zero(m->grads_memory, m->num_parameters);
}

// The whole backward pass, for the batch of the last transformer_forward:
// accumulates dloss/dparameter into m->grads.
void transformer_backward(Transformer *m, const Batch *batch) {
    const TransformerConfig *c = &m->config;
    ActivationTensors *a = &m->acts;
    BackwardScratch *s = &m->scratch;
    int B = batch->B, S = batch->S, T = batch->T, C = c->d_model, V = c->vocab_size, L = c->n_layers;
    size_t n_dec = (size_t)B * T * C, n_enc = (size_t)B * S * C;
    if (m->num_target_tokens == 0) return;
    // loss = CrossEntropy(softmax(logits), q)
    zero(s->d_logits, (size_t)B * T * V);
    cross_entropy_backward(s->d_logits, a->probs, batch->tgt_out, batch->tgt_len,
                           c->label_smoothing, m->num_target_tokens, B, T, V);
    // logits = decoder_output E^T
    const real *decoder_output = decoder_layer_acts(m, L - 1).ln3;
    real *d_out = s->d_x, *d_in = s->d_y;
    zero(d_out, n_dec);
    linear_backward(d_out, m->grads.embedding, NULL, s->d_logits, decoder_output,
                    m->params.embedding, B * T, C, V);
    // the decoder stack, last layer first
    const real *memory = encoder_layer_acts(m, L - 1).ln2;
    zero(s->d_memory, n_enc);
    for (int l = L - 1; l >= 0; l--) {
        const real *y = l == 0 ? a->dec_x0 : decoder_layer_acts(m, l - 1).ln3;
        zero(d_in, n_dec);
        decoder_layer_backward(d_in, s->d_memory, decoder_layer_params(&m->grads, c, l), d_out,
                               decoder_layer_acts(m, l), y, memory,
                               decoder_layer_params(&m->params, c, l), batch, m);
        real *swap = d_out; d_out = d_in; d_in = swap;
    }
    // dec_x0 = Dropout(E[tgt_in] sqrt(C) + PE)
    zero(s->d_a, n_dec);
    dropout_backward(s->d_a, d_out, a->dec_emb_mask, n_dec);
    embedding_backward(m->grads.embedding, s->d_a, batch->tgt_in, B, T, C);
    // the encoder stack, starting from the gradient its output got from every decoder layer
    memcpy(d_out, s->d_memory, n_enc * sizeof(real));
    for (int l = L - 1; l >= 0; l--) {
        const real *x = l == 0 ? a->enc_x0 : encoder_layer_acts(m, l - 1).ln2;
        zero(d_in, n_enc);
        encoder_layer_backward(d_in, encoder_layer_params(&m->grads, c, l), d_out,
                               encoder_layer_acts(m, l), x, encoder_layer_params(&m->params, c, l),
                               batch->src_len, m, B, S);
        real *swap = d_out; d_out = d_in; d_in = swap;
    }
    zero(s->d_a, n_enc);
    dropout_backward(s->d_a, d_out, a->enc_emb_mask, n_enc);
    embedding_backward(m->grads.embedding, s->d_a, batch->src, B, S, C);
}

// ============================================================================
// §5.3  Optimizer
// "We used the Adam optimizer with beta1 = 0.9, beta2 = 0.98 and eps = 1e-9.
// We varied the learning rate over the course of training, according to
//     lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5)"
// (eq. 3): a linear rise for warmup_steps (4000 in the paper), then a decay
// with the inverse square root of the step. `factor` scales the whole curve
// (1 in the paper; larger for tiny models, as many reimplementations do).
// ============================================================================

double transformer_learning_rate(long step, int d_model, int warmup_steps, double factor) {
    double s = step < 1 ? 1.0 : (double)step;
    double rise = s * pow((double)warmup_steps, -1.5), decay = 1.0 / sqrt(s);
    return factor / sqrt((double)d_model) * (rise < decay ? rise : decay);
}

// One Adam step (Kingma & Ba 2015, Algorithm 1) on every parameter:
//     m = beta1 m + (1 - beta1) g            (first moment)
//     v = beta2 v + (1 - beta2) g^2          (second moment)
//     theta -= lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
// with t the step count; the divisions undo the moments' bias towards 0.
void adam_update(Transformer *m, double learning_rate) {
    m->adam_step++;
    double b1 = m->adam.beta1, b2 = m->adam.beta2;
    double correction1 = 1.0 - pow(b1, (double)m->adam_step);
    double correction2 = 1.0 - pow(b2, (double)m->adam_step);
    real step_size = (real)(learning_rate / correction1);
    real rsqrt_c2 = (real)(1.0 / sqrt(correction2)), eps = (real)m->adam.eps;
    real beta1 = (real)b1, beta2 = (real)b2;
    size_t n = m->num_parameters;
    OMP(parallel for)
    for (size_t i = 0; i < n; i++) {
        real g = m->grads_memory[i];
        real mi = beta1 * m->adam_m[i] + (1 - beta1) * g;
        real vi = beta2 * m->adam_v[i] + (1 - beta2) * g * g;
        m->adam_m[i] = mi;
        m->adam_v[i] = vi;
        m->params_memory[i] -= step_size * mi / (real_sqrt(vi) * rsqrt_c2 + eps);
    }
}

// ============================================================================
// §6.1  Decoding: greedy with a key/value cache, beam search
// "We used beam search with a beam size of 4 and length penalty alpha = 0.6
// ... We set the maximum output length during inference to input length + 50,
// but terminate early when possible." (§6.1)
//
// The decoder writes one token at a time: position t reads the token chosen
// at t-1 (<s> at t = 0). Run naively, step t recomputes every earlier
// position of every layer, O(t^2) work per sentence. But under the causal mask
// (§3.2.3) nothing at positions < t depends on later tokens, so their keys and
// values never change once computed. A key/value cache keeps them, per
// decoder layer, and step t computes only row t:
//
//   token_t ─ E[token]·√C + PE[t] ─ layer 0 ─ … ─ layer N-1 ─ ·E^T ─ logits_t
//     in each layer: self-attention   q_t against cached k_0..k_t, v_0..v_t
//                    cross-attention  q_t against the memory's K, V (made once)
//
// The memory's keys and values (rows C..3C-1 of the encoder-decoder W_qkv
// applied to the encoder output) are the same at every step, so they are
// computed once per sentence. The step reuses the training functions
// (linear_forward, attention_forward, layernorm_forward, feed_forward_forward)
// with one query row per sentence, so it computes the numbers the full pass
// computes; test_transformer.c checks the tokens against uncached decoding.
// ============================================================================

// The decoding state of R rows decoded side by side: R sentences (greedy) or
// the R beams of one sentence (beam search).
typedef struct {
    int rows;           // R
    int S;              // padded source length
    int max_T;          // positions the self-attention cache holds
    int *src_len;       // (R)                real source tokens of each row
    int *self_len;      // (R)                positions each row's query sees: t + 1
    real *cross_kv;     // (L, R, S, 2C)      keys | values of the memory, per decoder layer
    real *self_kv;      // (L, R, max_T, 2C)  keys | values of positions 0..t, per decoder layer
    real *spare_kv;     // (L, R, max_T, 2C)  where beam search reorders the cache into
    real *x;            // (R, C)             a layer's input, then its output
    real *qkv;          // (R, 3C)
    real *heads;        // (R, C)
    real *proj;         // (R, C)
    real *res;          // (R, C)
    real *ln1, *ln2;    // (R, C)
    real *q;            // (R, C)
    real *ff_h;         // (R, F)
    real *ff_out;       // (R, C)
    real *mean, *rstd;  // (R)
    real *att;          // (R, NH, max(S, max_T))
    real *ones;         // (R, C)             the dropout mask when not training: all ones
    real *logits;       // (R, V)
} DecoderCache;

static void decoder_cache_init(DecoderCache *k, const Transformer *m, int R, int S, int max_T) {
    const TransformerConfig *c = &m->config;
    size_t L = c->n_layers, C = c->d_model, F = c->d_ff, NH = c->n_heads, V = c->vocab_size;
    size_t rows = R, widest = S > max_T ? S : max_T;
    memset(k, 0, sizeof *k);
    k->rows = R; k->S = S; k->max_T = max_T;
    k->src_len = checked_calloc(rows, sizeof(int), "decoder source lengths");
    k->self_len = checked_calloc(rows, sizeof(int), "decoder cache lengths");
    k->cross_kv = checked_calloc(L * rows * S * 2 * C, sizeof(real), "cross-attention key/value cache");
    k->self_kv = checked_calloc(L * rows * max_T * 2 * C, sizeof(real), "self-attention key/value cache");
    k->spare_kv = checked_calloc(L * rows * max_T * 2 * C, sizeof(real), "self-attention key/value cache");
    real **row_buffers[] = { &k->x, &k->heads, &k->proj, &k->res, &k->ln1, &k->ln2, &k->q, &k->ff_out, &k->ones };
    for (size_t i = 0; i < sizeof row_buffers / sizeof *row_buffers; i++)
        *row_buffers[i] = checked_calloc(rows * C, sizeof(real), "decoder activations");
    k->qkv = checked_calloc(rows * 3 * C, sizeof(real), "decoder activations");
    k->ff_h = checked_calloc(rows * F, sizeof(real), "decoder activations");
    k->mean = checked_calloc(rows, sizeof(real), "decoder activations");
    k->rstd = checked_calloc(rows, sizeof(real), "decoder activations");
    k->att = checked_calloc(rows * NH * widest, sizeof(real), "decoder attention");
    k->logits = checked_calloc(rows * V, sizeof(real), "decoder logits");
    for (size_t i = 0; i < rows * C; i++) k->ones[i] = 1;
}

static void decoder_cache_free(DecoderCache *k) {
    void *all[] = { k->src_len, k->self_len, k->cross_kv, k->self_kv, k->spare_kv, k->x, k->qkv,
                    k->heads, k->proj, k->res, k->ln1, k->ln2, k->q, k->ff_h, k->ff_out, k->mean,
                    k->rstd, k->att, k->ones, k->logits };
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
    memset(k, 0, sizeof *k);
}

// The encoder runs once per sentence: memory = Encoder(source) (§3.1). Then
// every decoder layer's keys and values of the memory are computed and kept.
// src is (B,S), padded, with B == rows (row r decodes sentence r) or B == 1
// (every row decodes sentence 0: the beams of beam search).
static void decoder_cache_encode(DecoderCache *k, Transformer *m, const int *src, const int *src_len, int B) {
    const TransformerConfig *c = &m->config;
    int S = k->S, C = c->d_model;
    size_t R = k->rows, row_kv = (size_t)S * 2 * C;
    Batch batch = { B, S, 1, (int *)src, (int *)src_len, NULL, NULL, NULL };
    ensure_buffers(m, B, S, 1);
    m->B = B; m->S = S; m->T = 1;
    const real *memory = encoder_forward(m, &batch);
    for (int l = 0; l < c->n_layers; l++) {
        AttentionParams w = decoder_layer_params(&m->params, c, l).cross_attn;
        real *kv = k->cross_kv + l * R * row_kv;
        // kv = memory W_kv^T + b_kv, as cross_attention_forward computes it
        linear_forward(kv, memory, w.qkv_w + (size_t)C * C, w.qkv_b + C, B * S, C, 2 * C);
        for (size_t r = B; r < R; r++) memcpy(kv + r * row_kv, kv, row_kv * sizeof(real));
    }
    for (size_t r = 0; r < R; r++) k->src_len[r] = src_len[B == 1 ? 0 : r];
}

// One decoder position t for rows 0..rows-1: tokens (rows) are their inputs
// at position t. Appends each row's keys and values at t to the cache and
// leaves the logits of the next token in k->logits (rows, V). The same
// sub-layers as decoder_layer_forward, for one position, without dropout.
static void decoder_step(DecoderCache *k, Transformer *m, const int *tokens, int t, int rows) {
    const TransformerConfig *c = &m->config;
    int C = c->d_model, F = c->d_ff, NH = c->n_heads, V = c->vocab_size;
    size_t n = (size_t)rows * C, R = k->rows;
    float eps = c->layer_norm_eps;
    // §3.4, §3.5: E[token] * sqrt(d_model) + PE[t]
    embedding_forward(k->x, tokens, m->params.embedding, m->positional_encoding + (size_t)t * C, rows, 1, C);
    for (int r = 0; r < rows; r++) k->self_len[r] = t + 1;
    for (int l = 0; l < c->n_layers; l++) {
        DecoderLayerParams w = decoder_layer_params(&m->params, c, l);
        real *self_kv = k->self_kv + l * R * k->max_T * 2 * C;
        real *cross_kv = k->cross_kv + l * R * k->S * 2 * C;
        // sub-layer 1: LayerNorm(y + MaskedSelfAttention(y)); q_t sees k_0..k_t, v_0..v_t
        linear_forward(k->qkv, k->x, w.self_attn.qkv_w, w.self_attn.qkv_b, rows, C, 3 * C);
        for (int r = 0; r < rows; r++)
            memcpy(self_kv + ((size_t)r * k->max_T + t) * 2 * C, k->qkv + (size_t)r * 3 * C + C,
                   2 * (size_t)C * sizeof(real));
        attention_forward(k->heads, k->att, k->qkv, self_kv, self_kv + C, 3 * C, 2 * C, k->self_len, 0,
                          rows, 1, k->max_T, C, NH);
        linear_forward(k->proj, k->heads, w.self_attn.out_w, w.self_attn.out_b, rows, C, C);
        residual_dropout_forward(k->res, k->x, k->proj, k->ones, n);
        layernorm_forward(k->ln1, k->mean, k->rstd, k->res, w.ln1_g, w.ln1_b, rows, C, eps);
        // sub-layer 2: LayerNorm(ln1 + Attention(ln1, memory)); keys and values from the cache
        linear_forward(k->q, k->ln1, w.cross_attn.qkv_w, w.cross_attn.qkv_b, rows, C, C);
        attention_forward(k->heads, k->att, k->q, cross_kv, cross_kv + C, C, 2 * C, k->src_len, 0,
                          rows, 1, k->S, C, NH);
        linear_forward(k->proj, k->heads, w.cross_attn.out_w, w.cross_attn.out_b, rows, C, C);
        residual_dropout_forward(k->res, k->ln1, k->proj, k->ones, n);
        layernorm_forward(k->ln2, k->mean, k->rstd, k->res, w.ln2_g, w.ln2_b, rows, C, eps);
        // sub-layer 3: LayerNorm(ln2 + FFN(ln2)); the output is the next layer's input
        feed_forward_forward(k->ff_out, k->ff_h, k->ln2, w.ffn, rows, C, F);
        residual_dropout_forward(k->res, k->ln2, k->ff_out, k->ones, n);
        layernorm_forward(k->x, k->mean, k->rstd, k->res, w.ln3_g, w.ln3_b, rows, C, eps);
    }
    // §3.4: the pre-softmax projection through the shared embedding
    linear_forward(k->logits, k->x, m->params.embedding, NULL, rows, C, V);
}

// Beam search keeps the best hypotheses, which may extend any of the previous
// beams: row i continues beam parent[i], so it takes over that beam's cached
// keys and values of positions 0..positions-1.
static void decoder_cache_reorder(DecoderCache *k, const Transformer *m, const int *parent, int rows,
                                  int positions) {
    size_t C = m->config.d_model, L = m->config.n_layers, R = k->rows, T = k->max_T;
    for (size_t l = 0; l < L; l++)
        for (int i = 0; i < rows; i++)
            memcpy(k->spare_kv + (l * R + i) * T * 2 * C, k->self_kv + (l * R + parent[i]) * T * 2 * C,
                   (size_t)positions * 2 * C * sizeof(real));
    real *swap = k->self_kv; k->self_kv = k->spare_kv; k->spare_kv = swap;
}

// §6.1: "maximum output length ... input length + 50", and never more
// positions than the positional encoding has. Counts output tokens, </s> included.
int transformer_decode_limit(const Transformer *m, int src_len) {
    int limit = src_len + 50;
    return limit < m->config.max_len ? limit : m->config.max_len;
}

// The most likely next token. <pad> and <s> are never outputs; the lowest id wins a tie.
static int greedy_token(const real *logits, int V) {
    int best = TOKEN_EOS;
    for (int v = 0; v < V; v++) {
        if (v == TOKEN_PAD || v == TOKEN_BOS) continue;
        if (logits[v] > logits[best]) best = v;
    }
    return best;
}

// Greedy decoding of B sentences side by side: at each position every
// sentence takes its most likely token, until </s> or the length limit.
// src is (B,S) padded, src_len (B). out (B, max_out) gets each output
// without </s>, out_len (B) its length.
void transformer_greedy_decode(Transformer *m, int *out, int *out_len, int max_out,
                               const int *src, const int *src_len, int B, int S) {
    int training = m->training, V = m->config.vocab_size, steps = 0;
    m->training = 0;
    int *limit = checked_calloc(B, sizeof(int), "decode limits");
    int *tokens = checked_calloc(B, sizeof(int), "decode tokens");
    int *done = checked_calloc(B, sizeof(int), "decode flags");
    for (int b = 0; b < B; b++) {
        limit[b] = transformer_decode_limit(m, src_len[b]);
        if (limit[b] > max_out) limit[b] = max_out;
        if (limit[b] > steps) steps = limit[b];
        out_len[b] = 0;
        tokens[b] = TOKEN_BOS;
    }
    DecoderCache k;
    decoder_cache_init(&k, m, B, S, steps);
    decoder_cache_encode(&k, m, src, src_len, B);
    for (int t = 0; t < steps; t++) {
        decoder_step(&k, m, tokens, t, B);
        int active = 0;
        for (int b = 0; b < B; b++) {
            if (done[b]) continue;
            int y = greedy_token(k.logits + (size_t)b * V, V);
            if (y == TOKEN_EOS) { done[b] = 1; continue; }
            out[(size_t)b * max_out + out_len[b]++] = y;
            tokens[b] = y;
            if (t + 1 >= limit[b]) done[b] = 1;
            active += !done[b];
        }
        if (!active) break;
    }
    decoder_cache_free(&k);
    free(limit); free(tokens); free(done);
    m->training = training;
}

// §6.1 length penalty, in the form of tensor2tensor (Wu et al. 2016):
// a hypothesis of `length` tokens (</s> included) scores log P / ((5 + length) / 6)^alpha.
static double length_penalty(int length, double alpha) {
    return pow((5.0 + length) / 6.0, alpha);
}

// A possible extension of a beam: token after beam `row`, with the summed
// log-probability `score`. The logit breaks ties, then the lower row and
// token, so that one beam ranks exactly as greedy_token chooses.
typedef struct { double score; real logit; int row, token; } BeamCandidate;

static int candidate_before(const BeamCandidate *a, const BeamCandidate *b) {
    if (a->score != b->score) return a->score > b->score;
    if (a->logit != b->logit) return a->logit > b->logit;
    if (a->row != b->row) return a->row < b->row;
    return a->token < b->token;
}

// Inserts c into best[0..*count-1], sorted, keeping at most `keep`.
static void candidate_insert(BeamCandidate *best, int *count, int keep, BeamCandidate c) {
    int i;
    if (*count < keep) i = (*count)++;
    else if (candidate_before(&c, &best[keep - 1])) i = keep - 1;
    else return;
    while (i > 0 && candidate_before(&c, &best[i - 1])) { best[i] = best[i - 1]; i--; }
    best[i] = c;
}

// Every alive beam r proposes every token v with the score
// alive_score[r] + log softmax(logits[r])_v (in double); keeps the best `keep`
// in best[], sorted. <pad> and <s> are never proposed. Returns how many.
static int beam_propose(BeamCandidate *best, int keep, const real *logits, const double *alive_score,
                        int num_alive, int V) {
    int num_best = 0;
    for (int r = 0; r < num_alive; r++) {
        const real *z = logits + (size_t)r * V;
        double max_z = z[0], sum = 0;
        for (int v = 1; v < V; v++) if (z[v] > max_z) max_z = z[v];
        for (int v = 0; v < V; v++) sum += exp(z[v] - max_z);
        double log_sum = max_z + log(sum);
        for (int v = 0; v < V; v++) {
            if (v == TOKEN_PAD || v == TOKEN_BOS) continue;
            BeamCandidate c = { alive_score[r] + (z[v] - log_sum), z[v], r, v };
            candidate_insert(best, &num_best, keep, c);
        }
    }
    return num_best;
}

// Beam search for one sentence (§6.1). Keeps `beam_size` alive hypotheses.
// At each position every alive beam proposes every token; the best
// 2 x beam_size of these (by summed log-probability) are taken in order:
// one ending in </s> among the first beam_size is finished, with score
// log P / length_penalty; the others fill the next alive beams. Search stops
// when beam_size hypotheses have finished ("all beams have ended"), or at the
// length limit, where the alive beams finish as they are. Returns the length
// of the best finished hypothesis, written to out (capacity
// transformer_decode_limit) without </s>; *score gets its score.
// With beam_size 1 this is exactly greedy decoding.
int transformer_beam_search(Transformer *m, int *out, double *score, const int *src, int src_len,
                            int beam_size, double alpha) {
    int training = m->training, V = m->config.vocab_size, K = beam_size;
    m->training = 0;
    int limit = transformer_decode_limit(m, src_len);
    size_t stride = limit;
    int *alive = checked_calloc(K * stride, sizeof(int), "beams"), *next = checked_calloc(K * stride, sizeof(int), "beams");
    int *finished = checked_calloc(K * stride, sizeof(int), "beams"), *finished_len = checked_calloc(K, sizeof(int), "beams");
    double *alive_score = checked_calloc(K, sizeof(double), "beams"), *next_score = checked_calloc(K, sizeof(double), "beams");
    double *finished_score = checked_calloc(K, sizeof(double), "beams");
    int *parent = checked_calloc(K, sizeof(int), "beams"), *tokens = checked_calloc(K, sizeof(int), "beams");
    BeamCandidate *best = checked_calloc(2 * K, sizeof(BeamCandidate), "beam candidates");
    DecoderCache k;
    decoder_cache_init(&k, m, K, src_len, limit);
    decoder_cache_encode(&k, m, src, &src_len, 1);
    int num_alive = 1, num_finished = 0, winner = 0; // winner: the best finished so far (first on ties)
    finished_score[0] = -INFINITY;
    tokens[0] = TOKEN_BOS;
    for (int t = 0; t < limit; t++) {
        decoder_step(&k, m, tokens, t, num_alive);
        int num_best = beam_propose(best, 2 * K, k.logits, alive_score, num_alive, V);
        // the best candidates, in order: finish the ones that end, keep K that go on
        int num_next = 0;
        for (int i = 0; i < num_best; i++) {
            BeamCandidate c = best[i];
            if (c.token == TOKEN_EOS) {
                if (i < K && num_finished < K) {
                    memcpy(finished + num_finished * stride, alive + c.row * stride, t * sizeof(int));
                    finished_len[num_finished] = t;
                    finished_score[num_finished] = c.score / length_penalty(t + 1, alpha);
                    if (finished_score[num_finished] > finished_score[winner]) winner = num_finished;
                    num_finished++;
                }
            } else if (num_next < K) {
                memcpy(next + num_next * stride, alive + c.row * stride, t * sizeof(int));
                next[num_next * stride + t] = c.token;
                next_score[num_next] = c.score;
                parent[num_next] = c.row;
                tokens[num_next++] = c.token;
            }
        }
        if (num_finished == K || num_next == 0) break;
        if (t + 1 == limit) { // out of positions: the alive beams end here, without </s>
            for (int i = 0; i < num_next && num_finished < K; i++) {
                memcpy(finished + num_finished * stride, next + i * stride, (t + 1) * sizeof(int));
                finished_len[num_finished] = t + 1;
                finished_score[num_finished] = next_score[i] / length_penalty(t + 1, alpha);
                if (finished_score[num_finished] > finished_score[winner]) winner = num_finished;
                num_finished++;
            }
            break;
        }
        decoder_cache_reorder(&k, m, parent, num_next, t + 1);
        int *swap = alive; alive = next; next = swap;
        double *swap_score = alive_score; alive_score = next_score; next_score = swap_score;
        num_alive = num_next;
    }
    int length = num_finished ? finished_len[winner] : 0;
    memcpy(out, finished + winner * stride, length * sizeof(int));
    if (score) *score = num_finished ? finished_score[winner] : -INFINITY;
    decoder_cache_free(&k);
    free(alive); free(next); free(finished); free(finished_len); free(alive_score); free(next_score);
    free(finished_score); free(parent); free(tokens); free(best);
    m->training = training;
    return length;
}

// ============================================================================
// Data: vocabulary, TSV files, built-in tasks, batches
// §3.4: one vocabulary for source and target (the embedding is shared).
// §5.1: "Sentence pairs were batched together by approximate sequence length.
// Each training batch contained a set of sentence pairs containing
// approximately 25000 source tokens and 25000 target tokens."
// ============================================================================

// The functions from here on that can fail return NULL on success, or one
// line saying what is wrong: the file (and line) or value, and what was
// expected. The text lives in this buffer until the next error.
static char error_buffer[1024];
static const char *errorf(const char *format, ...) {
    char text[sizeof error_buffer];
    va_list args;
    va_start(args, format);
    vsnprintf(text, sizeof text, format, args);
    va_end(args);
    memcpy(error_buffer, text, sizeof text);
    return error_buffer;
}

static void *checked_realloc(void *p, size_t count, size_t size, const char *what) {
    if (count == 0) count = 1;
    if (size != 0 && count > SIZE_MAX / size) {
        fprintf(stderr, "error: %s: %zu x %zu bytes overflows\n", what, count, size);
        exit(1);
    }
    void *q = realloc(p, count * size);
    if (!q) {
        fprintf(stderr, "error: out of memory allocating %s (%zu bytes)\n", what, count * size);
        exit(1);
    }
    return q;
}

static double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---- vocabulary -------------------------------------------------------------
// Token text <-> id. Ids 0..3 are <pad> <s> </s> <unk> (transformer.h); the
// data's tokens follow in order of first appearance. Lookup is a hash table
// with open addressing.

typedef struct {
    char **words;    // (size) id -> text
    int size, capacity;
    int *slots;      // (num_slots) ids, -1 when empty; num_slots is a power of two
    size_t num_slots;
} Vocabulary;

static uint32_t text_hash(const char *s, size_t n) { // FNV-1a
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) { h ^= (unsigned char)s[i]; h *= 16777619u; }
    return h;
}

// The id of the n bytes at word, or -1.
static int vocab_find(const Vocabulary *v, const char *word, size_t n) {
    size_t mask = v->num_slots - 1;
    for (size_t i = text_hash(word, n) & mask;; i = (i + 1) & mask) {
        int id = v->slots[i];
        if (id < 0) return -1;
        if (strncmp(v->words[id], word, n) == 0 && v->words[id][n] == '\0') return id;
    }
}

static void vocab_insert_slot(Vocabulary *v, int id) {
    const char *w = v->words[id];
    size_t mask = v->num_slots - 1, i = text_hash(w, strlen(w)) & mask;
    while (v->slots[i] >= 0) i = (i + 1) & mask;
    v->slots[i] = id;
}

// The id of the n bytes at word, added to the vocabulary if new.
static int vocab_add(Vocabulary *v, const char *word, size_t n) {
    int id = vocab_find(v, word, n);
    if (id >= 0) return id;
    if (v->size == v->capacity) {
        v->capacity = v->capacity ? 2 * v->capacity : 64;
        v->words = checked_realloc(v->words, v->capacity, sizeof(char *), "vocabulary");
    }
    if (2 * (size_t)(v->size + 1) > v->num_slots) { // keep the table at most half full
        free(v->slots);
        v->num_slots *= 2;
        v->slots = checked_calloc(v->num_slots, sizeof(int), "vocabulary table");
        for (size_t i = 0; i < v->num_slots; i++) v->slots[i] = -1;
        for (int i = 0; i < v->size; i++) vocab_insert_slot(v, i);
    }
    char *copy = checked_calloc(n + 1, 1, "vocabulary word");
    memcpy(copy, word, n);
    v->words[v->size] = copy;
    vocab_insert_slot(v, v->size);
    return v->size++;
}

static const char *special_tokens[NUM_SPECIAL_TOKENS] = { "<pad>", "<s>", "</s>", "<unk>" };

static void vocab_init(Vocabulary *v) {
    memset(v, 0, sizeof *v);
    v->num_slots = 64;
    v->slots = checked_calloc(v->num_slots, sizeof(int), "vocabulary table");
    for (size_t i = 0; i < v->num_slots; i++) v->slots[i] = -1;
    for (int i = 0; i < NUM_SPECIAL_TOKENS; i++) vocab_add(v, special_tokens[i], strlen(special_tokens[i]));
}

static void vocab_free(Vocabulary *v) {
    for (int i = 0; i < v->size; i++) free(v->words[i]);
    free(v->words);
    free(v->slots);
    memset(v, 0, sizeof *v);
}

// ---- sentence pairs ---------------------------------------------------------

typedef struct {
    size_t src, tgt;          // offsets of the tokens in Dataset.tokens
    int src_len, tgt_len;     // tokens, without <s> or </s>
    int line;                 // line in its file (1 = first), 0 for generated data
} SentencePair;

typedef struct {
    SentencePair *pairs;
    int count, capacity;
    int *tokens;
    size_t num_tokens, tokens_capacity;
    int longest_src, longest_tgt;
} Dataset;

static void dataset_free(Dataset *d) {
    free(d->pairs);
    free(d->tokens);
    memset(d, 0, sizeof *d);
}

static void dataset_push_tokens(Dataset *d, const int *tokens, int n) {
    if (d->num_tokens + n > d->tokens_capacity) {
        d->tokens_capacity = 2 * (d->num_tokens + n) + 1024;
        d->tokens = checked_realloc(d->tokens, d->tokens_capacity, sizeof(int), "sentence tokens");
    }
    memcpy(d->tokens + d->num_tokens, tokens, n * sizeof(int));
    d->num_tokens += n;
}

static void dataset_add(Dataset *d, const int *src, int src_len, const int *tgt, int tgt_len, int line) {
    if (d->count == d->capacity) {
        d->capacity = d->capacity ? 2 * d->capacity : 256;
        d->pairs = checked_realloc(d->pairs, d->capacity, sizeof(SentencePair), "sentence pairs");
    }
    SentencePair *p = &d->pairs[d->count++];
    p->src = d->num_tokens;
    dataset_push_tokens(d, src, src_len);
    p->tgt = d->num_tokens;
    dataset_push_tokens(d, tgt, tgt_len);
    p->src_len = src_len;
    p->tgt_len = tgt_len;
    p->line = line;
    if (src_len > d->longest_src) d->longest_src = src_len;
    if (tgt_len > d->longest_tgt) d->longest_tgt = tgt_len;
}

// FNV-1a over every pair's tokens: tells whether two datasets are the same
// (a resumed run checks that its training data has not changed).
static uint64_t dataset_hash(const Dataset *d) {
    uint64_t h = 0xCBF29CE484222325ULL;
    for (int i = 0; i < d->count; i++) {
        const SentencePair *p = &d->pairs[i];
        int header[2] = { p->src_len, p->tgt_len };
        for (int k = 0; k < 2 + p->src_len + p->tgt_len; k++) {
            int x = k < 2 ? header[k] : k < 2 + p->src_len ? d->tokens[p->src + k - 2]
                                                           : d->tokens[p->tgt + k - 2 - p->src_len];
            for (int byte = 0; byte < 4; byte++) { h ^= (uint8_t)((uint32_t)x >> (8 * byte)); h *= 0x100000001B3ULL; }
        }
    }
    return h;
}

// Moves every `every`-th pair (the every-th, 2·every-th, ...) of d into held_out.
static void dataset_split(Dataset *d, Dataset *held_out, int every) {
    Dataset kept;
    memset(&kept, 0, sizeof kept);
    for (int i = 0; i < d->count; i++) {
        const SentencePair *p = &d->pairs[i];
        dataset_add((i + 1) % every == 0 ? held_out : &kept, d->tokens + p->src, p->src_len,
                    d->tokens + p->tgt, p->tgt_len, p->line);
    }
    dataset_free(d);
    *d = kept;
}

// ---- reading text -------------------------------------------------------------

// Where a sentence came from, for messages: "data.tsv:12", "stdin:3", "argument 2".
typedef struct {
    char where[300];
    int warnings;             // unknown-token warnings printed so far for this input
    long unknown;             // tokens read as <unk>
} TextSource;

#define MAX_UNKNOWN_WARNINGS 5

// Splits text at spaces into token ids. grow: new tokens join the vocabulary;
// otherwise they become <unk> with a warning (the first few). Returns the
// number of tokens; *ids grows as needed.
static int tokenize(char *text, Vocabulary *v, int grow, int **ids, size_t *capacity, TextSource *from) {
    int n = 0;
    char *p = text;
    for (;;) {
        while (*p && isspace((unsigned char)*p)) p++;
        if (!*p) break;
        char *start = p;
        while (*p && !isspace((unsigned char)*p)) p++;
        size_t len = (size_t)(p - start);
        int id = grow ? vocab_add(v, start, len) : vocab_find(v, start, len);
        if (id < 0) {
            id = TOKEN_UNK;
            from->unknown++;
            if (from->warnings++ < MAX_UNKNOWN_WARNINGS)
                fprintf(stderr, "warning: %s: token '%.*s' is not in the vocabulary; read as <unk>\n",
                        from->where, (int)(len < 80 ? len : 80), start);
        }
        if ((size_t)n == *capacity) {
            *capacity = *capacity ? 2 * *capacity : 64;
            *ids = checked_realloc(*ids, *capacity, sizeof(int), "token ids");
        }
        (*ids)[n++] = id;
    }
    return n;
}

// Reads `source<TAB>target` lines, tokens separated by spaces, into d. Blank
// lines are skipped; a line ending in \r\n is read as ending in \n. grow: the
// vocabulary takes every new token (training data); otherwise unknown tokens
// become <unk> with a warning.
static const char *dataset_read_tsv(Dataset *d, Vocabulary *v, const char *path, int grow) {
    FILE *f = fopen(path, "r");
    if (!f) return errorf("%s: cannot open: %s", path, strerror(errno));
    char *line = NULL;
    size_t line_capacity = 0, src_capacity = 0, tgt_capacity = 0;
    int *src = NULL, *tgt = NULL, line_no = 0;
    ssize_t length;
    const char *error = NULL;
    TextSource from = { "", 0, 0 };
    while (!error && (length = getline(&line, &line_capacity, f)) != -1) {
        line_no++;
        snprintf(from.where, sizeof from.where, "%s:%d", path, line_no);
        while (length > 0 && (line[length - 1] == '\n' || line[length - 1] == '\r')) line[--length] = '\0';
        if (strlen(line) != (size_t)length) { error = errorf("%s: a zero byte; expected text", from.where); break; }
        char *p = line;
        while (*p && isspace((unsigned char)*p) && *p != '\t') p++;
        if (!*p) continue; // blank line
        char *tab = strchr(line, '\t');
        if (!tab) { error = errorf("%s: no tab; expected source<TAB>target", from.where); break; }
        if (strchr(tab + 1, '\t')) { error = errorf("%s: more than one tab; expected source<TAB>target", from.where); break; }
        *tab = '\0';
        int n_src = tokenize(line, v, grow, &src, &src_capacity, &from);
        int n_tgt = tokenize(tab + 1, v, grow, &tgt, &tgt_capacity, &from);
        if (n_src == 0) error = errorf("%s: empty source; expected tokens before the tab", from.where);
        else if (n_tgt == 0) error = errorf("%s: empty target; expected tokens after the tab", from.where);
        else if (n_src > TRANSFORMER_MAX_LEN || n_tgt > TRANSFORMER_MAX_LEN)
            error = errorf("%s: %d tokens; expected at most %d", from.where, n_src > n_tgt ? n_src : n_tgt,
                           TRANSFORMER_MAX_LEN);
        else if (v->size > TRANSFORMER_MAX_VOCAB)
            error = errorf("%s: more than %d distinct tokens; expected fewer", from.where, TRANSFORMER_MAX_VOCAB);
        else dataset_add(d, src, n_src, tgt, n_tgt, line_no);
    }
    if (!error && ferror(f)) error = errorf("%s: read error: %s", path, strerror(errno));
    if (!error && d->count == 0)
        error = errorf("%s: no sentence pairs (%s); expected lines source<TAB>target",
                       path, line_no == 0 ? "the file is empty" : "only blank lines");
    if (!error && from.warnings > MAX_UNKNOWN_WARNINGS)
        fprintf(stderr, "warning: %s: %ld tokens in all are not in the vocabulary and were read as <unk>\n",
                path, from.unknown);
    free(line); free(src); free(tgt);
    fclose(f);
    return error;
}

// A model with max_len positions takes sources and targets of up to
// max_len - 1 tokens: the encoder reads x_1..x_n </s> and the decoder
// <s> y_1..y_n, n + 1 positions each.
static const char *dataset_check_lengths(const Dataset *d, const char *name, int max_len) {
    for (int i = 0; i < d->count; i++) {
        const SentencePair *p = &d->pairs[i];
        char where[300];
        if (p->line) snprintf(where, sizeof where, "%s:%d", name, p->line);
        else snprintf(where, sizeof where, "%s, pair %d", name, i + 1);
        if (p->src_len > max_len - 1)
            return errorf("%s: the source has %d tokens; the model's maximum length %d allows %d (one position is </s>)",
                          where, p->src_len, max_len, max_len - 1);
        if (p->tgt_len > max_len - 1)
            return errorf("%s: the target has %d tokens; the model's maximum length %d allows %d (one position is <s>)",
                          where, p->tgt_len, max_len, max_len - 1);
    }
    return NULL;
}

static void print_tokens(FILE *f, const Vocabulary *v, const int *ids, int n) {
    for (int i = 0; i < n; i++) fprintf(f, "%s%s", i ? " " : "", v->words[ids[i]]);
}

// ---- built-in tasks -------------------------------------------------------------
// copy: the target is the source; reverse: the source backwards. Words are
// the numbers 0..words-1, so `./transformer decode ... "3 1 4 1 5"` reads
// naturally. The held-out pairs are drawn after the training pairs and
// none of their sources appears among the training sources: the model is
// tested on sequences it never saw.

enum { TASK_COPY, TASK_REVERSE, NUM_TASKS };
static const char *task_names[NUM_TASKS] = { "copy", "reverse" };

static void task_vocabulary(Vocabulary *v, int words) {
    vocab_init(v);
    for (int w = 0; w < words; w++) {
        char text[16];
        int n = snprintf(text, sizeof text, "%d", w);
        vocab_add(v, text, (size_t)n);
    }
}

// A set of 64-bit hashes (open addressing; 0 marks an empty slot).
typedef struct { uint64_t *slots; size_t mask; } HashSet;

static uint64_t sequence_hash(const int *tokens, int n) {
    uint64_t h = 0xCBF29CE484222325ULL ^ (uint64_t)n;
    for (int i = 0; i < n; i++) { h ^= (uint64_t)(uint32_t)tokens[i]; h *= 0x100000001B3ULL; h ^= h >> 29; }
    return h ? h : 1;
}

// Adds h; returns 1 if it was new, 0 if it was there already.
static int hash_set_add(HashSet *s, uint64_t h) {
    for (size_t i = h & s->mask;; i = (i + 1) & s->mask) {
        if (s->slots[i] == h) return 0;
        if (s->slots[i] == 0) { s->slots[i] = h; return 1; }
    }
}

static const char *task_generate(Dataset *train, Dataset *valid, int task, int words, int min_len,
                                 int max_len, int train_size, int valid_size, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed ^ 0x7A5C0DA7A5EEDULL);
    HashSet seen;
    size_t slots = 16;
    while (slots < 4 * ((size_t)train_size + valid_size)) slots *= 2;
    seen.slots = checked_calloc(slots, sizeof(uint64_t), "task hash set");
    seen.mask = slots - 1;
    int *src = checked_calloc(max_len, sizeof(int), "task sentence"), *tgt = checked_calloc(max_len, sizeof(int), "task sentence");
    const char *error = NULL;
    long attempts = 0, max_attempts = 1000L * valid_size + 1000;
    for (int i = 0; i < train_size + valid_size; ) {
        int n = min_len + rng_below(&rng, max_len - min_len + 1);
        for (int t = 0; t < n; t++) src[t] = NUM_SPECIAL_TOKENS + rng_below(&rng, words);
        for (int t = 0; t < n; t++) tgt[t] = task == TASK_COPY ? src[t] : src[n - 1 - t];
        int is_new = hash_set_add(&seen, sequence_hash(src, n));
        if (i < train_size) {
            dataset_add(train, src, n, tgt, n, 0);
            i++;
        } else if (is_new) { // held out: a source the training set does not have, and no repeats
            dataset_add(valid, src, n, tgt, n, 0);
            i++;
        } else if (++attempts > max_attempts) {
            error = errorf("cannot find %d held-out sequences outside the %d training sequences "
                           "(found %d); expected more --words or a larger --max-length",
                           valid_size, train_size, valid->count);
            break;
        }
    }
    free(seen.slots); free(src); free(tgt);
    return error;
}

// ---- batches ------------------------------------------------------------------
// An epoch visits every training pair once. The pairs are sorted by length
// (source, then target, random among equals), cut into batches of at most
// batch_tokens tokens counting padding (B x (S + T)), and the batches are
// visited in random order: §5.1's batching by approximate length.

typedef struct { int start, count; } BatchSpan;   // order[start .. start + count - 1]

typedef struct {
    int *order;          // (pairs) pair indices, grouped by length
    BatchSpan *spans;    // the batches, in the order they are visited
    int num_spans;
} EpochPlan;

typedef struct { int src_len, tgt_len; uint64_t key; int index; } LengthKey;

static int compare_length_keys(const void *pa, const void *pb) {
    const LengthKey *a = pa, *b = pb;
    if (a->src_len != b->src_len) return a->src_len < b->src_len ? -1 : 1;
    if (a->tgt_len != b->tgt_len) return a->tgt_len < b->tgt_len ? -1 : 1;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

// Cuts order[0..count-1] (already grouped by length) into batches of at most
// batch_tokens padded tokens each (at least one pair per batch): B x (S + T)
// with S = longest source + 1 (</s>), T = longest target + 1 (<s> or </s>).
static int cut_into_batches(BatchSpan *spans, const Dataset *d, const int *order, int count, int batch_tokens) {
    int num_spans = 0;
    for (int i = 0; i < count; ) {
        int S = 0, T = 0, n = 0;
        while (i + n < count) {
            const SentencePair *p = &d->pairs[order[i + n]];
            int S2 = p->src_len + 1 > S ? p->src_len + 1 : S, T2 = p->tgt_len + 1 > T ? p->tgt_len + 1 : T;
            if (n > 0 && (long)(n + 1) * (S2 + T2) > batch_tokens) break;
            S = S2; T = T2; n++;
        }
        spans[num_spans].start = i;
        spans[num_spans++].count = n;
        i += n;
    }
    return num_spans;
}

// Draws the next epoch's batches from rng (serially: the same on any thread count).
static void epoch_plan_make(EpochPlan *plan, const Dataset *d, int batch_tokens, Rng *rng) {
    LengthKey *keys = checked_calloc(d->count, sizeof(LengthKey), "epoch order");
    for (int i = 0; i < d->count; i++) {
        keys[i].src_len = d->pairs[i].src_len;
        keys[i].tgt_len = d->pairs[i].tgt_len;
        keys[i].key = rng_next(rng);
        keys[i].index = i;
    }
    qsort(keys, d->count, sizeof(LengthKey), compare_length_keys);
    plan->order = checked_realloc(plan->order, d->count, sizeof(int), "epoch order");
    plan->spans = checked_realloc(plan->spans, d->count, sizeof(BatchSpan), "epoch batches");
    for (int i = 0; i < d->count; i++) plan->order[i] = keys[i].index;
    free(keys);
    plan->num_spans = cut_into_batches(plan->spans, d, plan->order, d->count, batch_tokens);
    for (int i = plan->num_spans - 1; i > 0; i--) { // Fisher-Yates shuffle of the batches
        int j = rng_below(rng, i + 1);
        BatchSpan swap = plan->spans[i]; plan->spans[i] = plan->spans[j]; plan->spans[j] = swap;
    }
}

static void epoch_plan_free(EpochPlan *plan) {
    free(plan->order);
    free(plan->spans);
    memset(plan, 0, sizeof *plan);
}

// A Batch and the memory behind it, grown as needed.
typedef struct {
    Batch batch;
    int *src, *src_len, *tgt_in, *tgt_out, *tgt_len;
    size_t src_capacity, tgt_capacity, rows_capacity;
    long tokens;   // source and target positions without padding, for tokens/s
} BatchBuffer;

// Teacher forcing (§5): the decoder reads tgt_in = <s> y_1 .. y_n and must
// predict tgt_out = y_1 .. y_n </s>. The source ends with </s> too, as in
// tensor2tensor and fairseq (the paper does not say): it marks where the
// sentence ends, which the encoder otherwise has to infer from the padding
// mask alone. On the copy task it made learning faster (NOTES.md).
static void batch_fill(BatchBuffer *bb, const Dataset *d, const int *indices, int count) {
    int S = 1, T = 1;
    for (int i = 0; i < count; i++) {
        const SentencePair *p = &d->pairs[indices[i]];
        if (p->src_len + 1 > S) S = p->src_len + 1;
        if (p->tgt_len + 1 > T) T = p->tgt_len + 1;
    }
    size_t B = count;
    if (B > bb->rows_capacity) {
        bb->rows_capacity = B;
        bb->src_len = checked_realloc(bb->src_len, B, sizeof(int), "batch");
        bb->tgt_len = checked_realloc(bb->tgt_len, B, sizeof(int), "batch");
    }
    if (B * S > bb->src_capacity) {
        bb->src_capacity = B * S;
        bb->src = checked_realloc(bb->src, B * S, sizeof(int), "batch");
    }
    if (B * T > bb->tgt_capacity) {
        bb->tgt_capacity = B * T;
        bb->tgt_in = checked_realloc(bb->tgt_in, B * T, sizeof(int), "batch");
        bb->tgt_out = checked_realloc(bb->tgt_out, B * T, sizeof(int), "batch");
    }
    memset(bb->src, 0, B * S * sizeof(int));
    memset(bb->tgt_in, 0, B * T * sizeof(int));
    memset(bb->tgt_out, 0, B * T * sizeof(int));
    bb->tokens = 0;
    for (size_t b = 0; b < B; b++) {
        const SentencePair *p = &d->pairs[indices[b]];
        const int *x = d->tokens + p->src, *y = d->tokens + p->tgt;
        memcpy(bb->src + b * S, x, p->src_len * sizeof(int));
        bb->src[b * S + p->src_len] = TOKEN_EOS;
        bb->src_len[b] = p->src_len + 1;
        bb->tgt_in[b * T] = TOKEN_BOS;
        memcpy(bb->tgt_in + b * T + 1, y, p->tgt_len * sizeof(int));
        memcpy(bb->tgt_out + b * T, y, p->tgt_len * sizeof(int));
        bb->tgt_out[b * T + p->tgt_len] = TOKEN_EOS;
        bb->tgt_len[b] = p->tgt_len + 1;
        bb->tokens += p->src_len + 1 + p->tgt_len + 1;
    }
    Batch batch = { count, S, T, bb->src, bb->src_len, bb->tgt_in, bb->tgt_out, bb->tgt_len };
    bb->batch = batch;
}

static void batch_buffer_free(BatchBuffer *bb) {
    free(bb->src); free(bb->src_len); free(bb->tgt_in); free(bb->tgt_out); free(bb->tgt_len);
    memset(bb, 0, sizeof *bb);
}

// ---- evaluation -------------------------------------------------------------------
// Decodes held-out sources and compares with the references:
//   exact match     the output is the reference, token for token
//   token accuracy  positions where output and reference agree, over the
//                   longer of the two, summed over sentences (a missing or
//                   an extra token counts as wrong); a reference token not in
//                   the vocabulary (<unk>) never counts as right.
// Also the teacher-forced loss (label-smoothed, as in training, no dropout).

typedef struct {
    double loss;             // mean per target token
    long correct, compared;  // token accuracy = correct / compared
    int exact, sentences;
    int *output;             // (sentences, stride) the decoded outputs
    int *output_len;         // (sentences)
    int stride;
} Evaluation;

static void evaluation_free(Evaluation *e) {
    free(e->output); free(e->output_len);
    memset(e, 0, sizeof *e);
}

static void score_output(Evaluation *e, const int *output, int output_len, const int *ref, int ref_len) {
    int longer = output_len > ref_len ? output_len : ref_len, same = 0;
    for (int i = 0; i < output_len && i < ref_len; i++) same += output[i] == ref[i] && ref[i] != TOKEN_UNK;
    e->correct += same;
    e->compared += longer;
    e->exact += same == ref_len && output_len == ref_len;
}

// Evaluates the first `count` pairs of d (all when count <= 0), decoding
// greedily (beam_size 1, many sentences side by side) or with beam search.
static void evaluate(Evaluation *e, Transformer *m, const Dataset *d, int count, int batch_tokens,
                     int beam_size, double alpha) {
    memset(e, 0, sizeof *e);
    if (count <= 0 || count > d->count) count = d->count;
    e->sentences = count;
    e->stride = m->config.max_len;
    e->output = checked_calloc((size_t)count * e->stride, sizeof(int), "decoded outputs");
    e->output_len = checked_calloc(count, sizeof(int), "decoded outputs");
    int training = m->training;
    m->training = 0;
    // sorted by length, so that the sentences decoded side by side have little padding
    LengthKey *keys = checked_calloc(count, sizeof(LengthKey), "evaluation order");
    int *order = checked_calloc(count, sizeof(int), "evaluation order");
    BatchSpan *spans = checked_calloc(count, sizeof(BatchSpan), "evaluation batches");
    for (int i = 0; i < count; i++) {
        LengthKey key = { d->pairs[i].src_len, d->pairs[i].tgt_len, 0, i };
        keys[i] = key;
    }
    qsort(keys, count, sizeof(LengthKey), compare_length_keys);
    for (int i = 0; i < count; i++) order[i] = keys[i].index;
    int num_spans = cut_into_batches(spans, d, order, count, batch_tokens);
    BatchBuffer bb;
    memset(&bb, 0, sizeof bb);
    double total_loss = 0;
    long total_tokens = 0;
    int *out = NULL, *out_len = NULL;
    for (int s = 0; s < num_spans; s++) {
        const int *indices = order + spans[s].start;
        int B = spans[s].count;
        batch_fill(&bb, d, indices, B);
        total_loss += (double)transformer_forward(m, &bb.batch) * m->num_target_tokens;
        total_tokens += m->num_target_tokens;
        int S = bb.batch.S, max_out = transformer_decode_limit(m, S);
        out = checked_realloc(out, (size_t)B * max_out, sizeof(int), "decoded outputs");
        out_len = checked_realloc(out_len, B, sizeof(int), "decoded outputs");
        if (beam_size <= 1) {
            transformer_greedy_decode(m, out, out_len, max_out, bb.src, bb.src_len, B, S);
        } else {
            for (int b = 0; b < B; b++)
                out_len[b] = transformer_beam_search(m, out + (size_t)b * max_out, NULL, bb.src + (size_t)b * S,
                                                     bb.src_len[b], beam_size, alpha);
        }
        for (int b = 0; b < B; b++) {
            const SentencePair *p = &d->pairs[indices[b]];
            int n = out_len[b] < e->stride ? out_len[b] : e->stride;
            memcpy(e->output + (size_t)indices[b] * e->stride, out + (size_t)b * max_out, n * sizeof(int));
            e->output_len[indices[b]] = n;
            score_output(e, out + (size_t)b * max_out, out_len[b], d->tokens + p->tgt, p->tgt_len);
        }
    }
    e->loss = total_tokens ? total_loss / total_tokens : 0;
    free(keys); free(order); free(spans); free(out); free(out_len);
    batch_buffer_free(&bb);
    m->training = training;
}

static void print_examples(const Evaluation *e, const Dataset *d, const Vocabulary *v, int show) {
    for (int i = 0; i < show && i < e->sentences; i++) {
        const SentencePair *p = &d->pairs[i];
        const int *out = e->output + (size_t)i * e->stride;
        int n = e->output_len[i];
        int exact = n == p->tgt_len && memcmp(out, d->tokens + p->tgt, n * sizeof(int)) == 0;
        printf("  source     "); print_tokens(stdout, v, d->tokens + p->src, p->src_len);
        printf("\n  reference  "); print_tokens(stdout, v, d->tokens + p->tgt, p->tgt_len);
        printf("\n  output     "); print_tokens(stdout, v, out, n);
        printf("   (%s)\n", exact ? "exact" : "WRONG");
    }
}

// ============================================================================
// Checkpoints
// One file holds everything a run needs to go on exactly where it stopped:
// the config, the vocabulary, the parameters, Adam's moments and step, the
// random generators' states, the position in the current epoch, and the
// run's own options (data, model, schedule) as text. The byte layout is in
// NOTES.md ("Checkpoint format"). All numbers are little-endian; the last 8
// bytes are an FNV-1a checksum of everything before them.
//
// Writing goes to PATH.tmp, which is flushed to the disk and then renamed
// over PATH: rename replaces a file in one step, so PATH is at every moment
// either the old checkpoint or the new one, never half of either.
// ============================================================================

#define CHECKPOINT_MAGIC "TCKP"
#define CHECKPOINT_VERSION 1
#define CHECKPOINT_HEADER_BYTES 120
#define CHECKPOINT_CHECKSUM_BYTES 8

// Where a training run stands, besides the model and Adam.
typedef struct {
    uint64_t epoch_rng;      // the data-order generator's state when the current epoch was drawn
    uint64_t epoch;          // epochs begun (the first is 1)
    uint64_t epoch_batches;  // batches of the current epoch already trained on
    uint64_t data_hash;      // dataset_hash of the training pairs
} TrainingState;

#define FNV_OFFSET 0xCBF29CE484222325ULL
#define FNV_PRIME 0x100000001B3ULL

typedef struct { FILE *f; uint64_t hash; int failed; } Writer;

static void write_bytes(Writer *w, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) w->hash = (w->hash ^ p[i]) * FNV_PRIME;
    if (!w->failed && fwrite(data, 1, n, w->f) != n) w->failed = 1;
}

static void write_u32(Writer *w, uint32_t x) {
    unsigned char b[4];
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(x >> (8 * i));
    write_bytes(w, b, 4);
}

static void write_u64(Writer *w, uint64_t x) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(x >> (8 * i));
    write_bytes(w, b, 8);
}

static void write_f32(Writer *w, float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    write_u32(w, u);
}

// n numbers of type real, as IEEE-754 binary32 (float builds) or binary64 (double builds)
static void write_reals(Writer *w, const real *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
#ifdef TRANSFORMER_DOUBLE
        uint64_t u;
        memcpy(&u, &x[i], 8);
        write_u64(w, u);
#else
        write_f32(w, x[i]);
#endif
    }
}

static uint32_t get_u32(const unsigned char *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static uint64_t get_u64(const unsigned char *b) {
    return (uint64_t)get_u32(b) | (uint64_t)get_u32(b + 4) << 32;
}

static float get_f32(const unsigned char *b) {
    uint32_t u = get_u32(b);
    float x;
    memcpy(&x, &u, 4);
    return x;
}

typedef struct { FILE *f; uint64_t hash; int failed; } Reader;

static void read_bytes(Reader *r, void *data, size_t n) {
    if (!r->failed && fread(data, 1, n, r->f) != n) { r->failed = 1; memset(data, 0, n); }
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) r->hash = (r->hash ^ p[i]) * FNV_PRIME;
}

// n numbers stored with real_bytes (4 or 8) bytes each, converted to real
static void read_reals(Reader *r, real *x, size_t n, int real_bytes) {
    unsigned char b[8];
    for (size_t i = 0; i < n; i++) {
        read_bytes(r, b, real_bytes);
        if (real_bytes == 4) {
            x[i] = (real)get_f32(b);
        } else {
            uint64_t u = get_u64(b);
            double d;
            memcpy(&d, &u, 8);
            x[i] = (real)d;
        }
    }
}

static const char *checkpoint_save(const char *path, const Transformer *m, const Vocabulary *v,
                                   const TrainingState *state, const char *run_options) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return errorf("%s: path too long", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return errorf("%s: cannot write: %s; %s was left as it was", tmp, strerror(errno), path);
    Writer w = { f, FNV_OFFSET, 0 };
    const TransformerConfig *c = &m->config;
    uint64_t vocab_bytes = 0, options_bytes = strlen(run_options);
    for (int i = 0; i < v->size; i++) vocab_bytes += 4 + strlen(v->words[i]);
    write_bytes(&w, CHECKPOINT_MAGIC, 4);
    write_u32(&w, CHECKPOINT_VERSION);
    write_u32(&w, (uint32_t)sizeof(real));
    int sizes[6] = { c->n_layers, c->d_model, c->d_ff, c->n_heads, c->vocab_size, c->max_len };
    for (int i = 0; i < 6; i++) write_u32(&w, (uint32_t)sizes[i]);
    write_f32(&w, c->dropout);
    write_f32(&w, c->label_smoothing);
    write_f32(&w, c->layer_norm_eps);
    uint64_t fields[9] = { m->num_parameters, (uint64_t)m->adam_step, m->dropout_rng.state,
                           state->epoch_rng, state->epoch, state->epoch_batches, state->data_hash,
                           vocab_bytes, options_bytes };
    for (int i = 0; i < 9; i++) write_u64(&w, fields[i]);
    write_bytes(&w, run_options, options_bytes);
    for (int i = 0; i < v->size; i++) {
        write_u32(&w, (uint32_t)strlen(v->words[i]));
        write_bytes(&w, v->words[i], strlen(v->words[i]));
    }
    write_reals(&w, m->params_memory, m->num_parameters);
    write_reals(&w, m->adam_m, m->num_parameters);
    write_reals(&w, m->adam_v, m->num_parameters);
    write_u64(&w, w.hash);
    int error = w.failed ? (errno ? errno : EIO) : 0;
    if (!error && (fflush(f) != 0 || fsync(fileno(f)) != 0)) error = errno;
    if (fclose(f) != 0 && !error) error = errno;
    if (!error && rename(tmp, path) != 0) error = errno;
    if (error) {
        remove(tmp);
        return errorf("%s: writing the checkpoint failed: %s; %s was left as it was", tmp, strerror(error), path);
    }
    return NULL;
}

// The fixed-size header at the start of every checkpoint (offsets in NOTES.md).
typedef struct {
    uint32_t real_bytes;        // 4 (float) or 8 (double)
    TransformerConfig config;
    uint64_t num_parameters, adam_step, dropout_rng;
    TrainingState state;
    uint64_t vocab_bytes, options_bytes;
} CheckpointHeader;

// Reads and checks the header from its bytes b (got of them, from a file of
// `size` bytes): the magic, the version, the config, the parameter count the
// config gives, and the file's length against what the header describes.
static const char *checkpoint_parse_header(CheckpointHeader *h, const unsigned char *b, size_t got,
                                           uint64_t size, const char *path) {
    if (got < 4) return errorf("%s: truncated: %zu bytes; expected a checkpoint (magic 'TCKP')", path, got);
    if (memcmp(b, CHECKPOINT_MAGIC, 4) != 0)
        return errorf("%s: not a transformer.c checkpoint: it starts with bytes %02x %02x %02x %02x, expected 'TCKP'",
                      path, b[0], b[1], b[2], b[3]);
    if (got < 8) return errorf("%s: truncated: %zu bytes, inside the header", path, got);
    if (get_u32(b + 4) != CHECKPOINT_VERSION)
        return errorf("%s: checkpoint format version %u; expected version %d", path, get_u32(b + 4), CHECKPOINT_VERSION);
    if (got < CHECKPOINT_HEADER_BYTES || size < CHECKPOINT_HEADER_BYTES + CHECKPOINT_CHECKSUM_BYTES)
        return errorf("%s: truncated: %llu bytes; the header and checksum alone take %d", path,
                      (unsigned long long)size, CHECKPOINT_HEADER_BYTES + CHECKPOINT_CHECKSUM_BYTES);
    h->real_bytes = get_u32(b + 8);
    if (h->real_bytes != 4 && h->real_bytes != 8)
        return errorf("%s: header: %u-byte numbers; expected 4 (float) or 8 (double)", path, h->real_bytes);
    TransformerConfig *c = &h->config;
    c->n_layers = (int32_t)get_u32(b + 12); c->d_model = (int32_t)get_u32(b + 16);
    c->d_ff = (int32_t)get_u32(b + 20); c->n_heads = (int32_t)get_u32(b + 24);
    c->vocab_size = (int32_t)get_u32(b + 28); c->max_len = (int32_t)get_u32(b + 32);
    c->dropout = get_f32(b + 36); c->label_smoothing = get_f32(b + 40); c->layer_norm_eps = get_f32(b + 44);
    const char *error = transformer_config_check(c);
    if (error) return errorf("%s: header: %s", path, error);
    uint64_t *fields[9] = { &h->num_parameters, &h->adam_step, &h->dropout_rng, &h->state.epoch_rng,
                            &h->state.epoch, &h->state.epoch_batches, &h->state.data_hash,
                            &h->vocab_bytes, &h->options_bytes };
    for (int i = 0; i < 9; i++) *fields[i] = get_u64(b + 48 + 8 * i);
    size_t sizes[NUM_PARAMETER_TENSORS];
    parameter_sizes(sizes, c);
    size_t P = sum_sizes(sizes, NUM_PARAMETER_TENSORS);
    if (h->num_parameters != P)
        return errorf("%s: header: %llu parameters, but its sizes (N=%d, d_model=%d, d_ff=%d, vocab %d) give %zu",
                      path, (unsigned long long)h->num_parameters, c->n_layers, c->d_model, c->d_ff, c->vocab_size, P);
    if (h->vocab_bytes > size || h->vocab_bytes < 5 * (uint64_t)c->vocab_size)
        return errorf("%s: header: a vocabulary section of %llu bytes cannot hold %d tokens", path,
                      (unsigned long long)h->vocab_bytes, c->vocab_size);
    if (h->options_bytes > size)
        return errorf("%s: header: an options section of %llu bytes, but the file has %llu", path,
                      (unsigned long long)h->options_bytes, (unsigned long long)size);
    if (h->dropout_rng == 0) return errorf("%s: header: dropout generator state 0; expected non-zero", path);
    uint64_t expected = CHECKPOINT_HEADER_BYTES + h->options_bytes + h->vocab_bytes + 3 * P * h->real_bytes
                      + CHECKPOINT_CHECKSUM_BYTES;
    if (size < expected)
        return errorf("%s: truncated: %llu bytes, but its header describes %llu", path,
                      (unsigned long long)size, (unsigned long long)expected);
    if (size > expected)
        return errorf("%s: %llu bytes, but its header describes %llu: the sizes disagree", path,
                      (unsigned long long)size, (unsigned long long)expected);
    return NULL;
}

// The vocabulary section: for each id a u32 length and the token's bytes; the
// four special tokens first, no repeats, no spaces, lengths adding up to the
// section's size in the header. v starts as vocab_init leaves it.
static const char *checkpoint_read_vocabulary(Reader *r, Vocabulary *v, const CheckpointHeader *h, const char *path) {
    uint64_t used = 0;
    for (int i = 0; i < h->config.vocab_size; i++) {
        unsigned char b[4];
        read_bytes(r, b, 4);
        uint32_t n = get_u32(b);
        used += 4 + (uint64_t)n;
        if (n == 0 || used > h->vocab_bytes)
            return errorf("%s: vocabulary token %d has length %u; the vocabulary section disagrees with its "
                          "size in the header (%llu bytes)", path, i, n, (unsigned long long)h->vocab_bytes);
        char *word = checked_calloc(n + 1, 1, "checkpoint vocabulary");
        read_bytes(r, word, n);
        int known = vocab_find(v, word, n), ok = strlen(word) == n;
        for (uint32_t j = 0; j < n && ok; j++) ok = !isspace((unsigned char)word[j]);
        ok = ok && (i < NUM_SPECIAL_TOKENS ? known == i : known < 0);
        if (ok && i >= NUM_SPECIAL_TOKENS) vocab_add(v, word, n);
        free(word);
        if (!ok)
            return errorf("%s: vocabulary token %d is %s; expected %s", path, i,
                          known >= 0 && i >= NUM_SPECIAL_TOKENS ? "a repeat" : "not valid",
                          i < NUM_SPECIAL_TOKENS ? special_tokens[i] : "a new token without spaces");
    }
    if (used != h->vocab_bytes)
        return errorf("%s: the vocabulary takes %llu bytes, but its header says %llu", path,
                      (unsigned long long)used, (unsigned long long)h->vocab_bytes);
    return NULL;
}

// Reads a checkpoint into a new model and vocabulary (and, when not NULL,
// the training state and the run's options text, which the caller frees).
// Nothing is allocated before the header has been checked against the
// file's length; the checksum, last, covers every byte.
static const char *checkpoint_load(const char *path, Transformer *m, Vocabulary *v, TrainingState *state,
                                   char **run_options) {
    memset(m, 0, sizeof *m);
    vocab_init(v);
    if (run_options) *run_options = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) { vocab_free(v); return errorf("%s: cannot open: %s", path, strerror(errno)); }
    struct stat st;
    unsigned char b[CHECKPOINT_HEADER_BYTES];
    CheckpointHeader h;
    char *options = NULL;
    const char *error = NULL;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) error = errorf("%s: not a regular file", path);
    if (!error) {
        size_t got = fread(b, 1, sizeof b, f);
        error = checkpoint_parse_header(&h, b, got, (uint64_t)st.st_size, path);
    }
    Reader r = { f, FNV_OFFSET, 0 };
    if (!error) { // the body, read from the start again so that the checksum covers every byte
        rewind(f);
        read_bytes(&r, b, CHECKPOINT_HEADER_BYTES);
        options = checked_calloc(h.options_bytes + 1, 1, "checkpoint options");
        read_bytes(&r, options, h.options_bytes);
        if (strlen(options) != h.options_bytes)
            error = errorf("%s: the options section holds a zero byte; expected text", path);
    }
    if (!error) error = checkpoint_read_vocabulary(&r, v, &h, path);
    if (!error && (error = transformer_build(m, &h.config, 1))) error = errorf("%s: %s", path, error);
    if (!error) {
        size_t P = m->num_parameters;
        read_reals(&r, m->params_memory, P, h.real_bytes);
        read_reals(&r, m->adam_m, P, h.real_bytes);
        read_reals(&r, m->adam_v, P, h.real_bytes);
        uint64_t computed = r.hash;
        unsigned char checksum[8];
        read_bytes(&r, checksum, 8);
        if (r.failed) error = errorf("%s: read error: %s", path, strerror(errno ? errno : EIO));
        else if (get_u64(checksum) != computed) error = errorf("%s: checksum mismatch: the file is damaged", path);
    }
    fclose(f);
    if (error) {
        free(options);
        transformer_free(m);
        vocab_free(v);
        return error;
    }
    m->adam_step = (long)h.adam_step;
    m->dropout_rng.state = h.dropout_rng;
    if (state) *state = h.state;
    if (run_options) *run_options = options; else free(options);
    return NULL;
}

// ============================================================================
// Command line
// One function per command: command_train, command_decode, command_eval,
// command_params. Each reads its flags from a table (name, kind, where the
// value goes, the accepted range, help) with checked number parsing, so a
// bad flag gets one line naming it and its value and saying what was
// expected, and `--help` prints the table with the defaults.
// ============================================================================

typedef enum { OPTION_INT, OPTION_NUMBER, OPTION_TEXT } OptionKind;

// What a training option belongs to. RUN options define the run (data, model,
// schedule): they are stored in the checkpoint and cannot change on --resume,
// except --steps (RUN_EXTENDABLE). SESSION options only affect this process.
enum { SESSION = 0, RUN = 1, RUN_EXTENDABLE = 2 };

typedef struct {
    const char *name;     // "--steps"
    OptionKind kind;
    void *value;          // int *, double * or const char **
    double min, max;      // the accepted range of a number
    int above_min;        // 1: the value must be > min (not >=)
    int role;             // SESSION, RUN or RUN_EXTENDABLE
    const char *help;
    int seen;             // given on this command line
} Option;

#define INT_OPTION(name, value, lo, hi, role, help) { name, OPTION_INT, value, lo, hi, 0, role, help, 0 }
#define NUMBER_OPTION(name, value, lo, hi, above, role, help) { name, OPTION_NUMBER, value, lo, hi, above, role, help, 0 }
#define TEXT_OPTION(name, value, role, help) { name, OPTION_TEXT, value, 0, 0, 0, role, help, 0 }
#define MAX_OPTIONS 48

static void describe_expected(char *text, size_t n, const Option *o) {
    if (o->kind == OPTION_INT) {
        if (o->max >= INT_MAX) snprintf(text, n, "an integer >= %.0f", o->min);
        else snprintf(text, n, "an integer from %.0f to %.0f", o->min, o->max);
    } else if (o->kind == OPTION_NUMBER) {
        if (o->max >= DBL_MAX) snprintf(text, n, "a number %s %g", o->above_min ? ">" : ">=", o->min);
        else snprintf(text, n, "a number %s %g and <= %g", o->above_min ? ">" : ">=", o->min, o->max);
    } else {
        snprintf(text, n, "a value");
    }
}

// Parses text as an option's value; returns 0 if it is not one.
static int parse_option_value(const Option *o, const char *text) {
    if (o->kind == OPTION_TEXT) { *(const char **)o->value = text; return 1; }
    char *end;
    errno = 0;
    if (o->kind == OPTION_INT) {
        long x = strtol(text, &end, 10);
        if (end == text || *end || errno || x < o->min || x > o->max) return 0;
        *(int *)o->value = (int)x;
    } else {
        double x = strtod(text, &end);
        if (end == text || *end || errno || !isfinite(x) || x < o->min || x > o->max) return 0;
        if (o->above_min && !(x > o->min)) return 0;
        *(double *)o->value = x;
    }
    return 1;
}

static void print_option_help(const Option *options, int n) {
    for (int i = 0; i < n; i++) {
        const Option *o = &options[i];
        char left[64], value[64];
        snprintf(left, sizeof left, "%s %s", o->name, o->kind == OPTION_INT ? "N" : o->kind == OPTION_NUMBER ? "X" : "TEXT");
        if (o->kind == OPTION_INT) snprintf(value, sizeof value, "%d", *(int *)o->value);
        else if (o->kind == OPTION_NUMBER) snprintf(value, sizeof value, "%g", *(double *)o->value);
        else snprintf(value, sizeof value, "%s", *(const char **)o->value ? *(const char **)o->value : "");
        if (value[0]) printf("  %-22s %s (default %s)\n", left, o->help, value);
        else printf("  %-22s %s\n", left, o->help);
    }
}

// Reads argv[1..argc-1] into the options. Arguments that are not flags go
// to positional (when it is not NULL). Returns 0 on success, 1 after printing
// a one-line error, 2 after printing the help.
static int parse_options(const char *command, const char *usage, Option *options, int n,
                         int argc, char **argv, char **positional, int *num_positional) {
    if (num_positional) *num_positional = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            printf("%s\noptions:\n", usage);
            print_option_help(options, n);
            return 2;
        }
        if (arg[0] != '-' || arg[1] == '\0' || (positional && isdigit((unsigned char)arg[1]))) {
            if (!positional) {
                fprintf(stderr, "error: %s: unexpected argument '%s'; see ./transformer %s --help\n", command, arg, command);
                return 1;
            }
            positional[(*num_positional)++] = argv[i];
            continue;
        }
        Option *o = NULL;
        for (int k = 0; k < n && !o; k++) if (strcmp(arg, options[k].name) == 0) o = &options[k];
        if (!o) {
            fprintf(stderr, "error: %s: unknown flag '%s'; see ./transformer %s --help\n", command, arg, command);
            return 1;
        }
        char expected[96];
        describe_expected(expected, sizeof expected, o);
        if (i + 1 >= argc || (o->kind == OPTION_TEXT && strncmp(argv[i + 1], "--", 2) == 0)) {
            if (o->kind == OPTION_TEXT) fprintf(stderr, "error: %s: flag %s needs a value\n", command, arg);
            else fprintf(stderr, "error: %s: flag %s needs a value (%s)\n", command, arg, expected);
            return 1;
        }
        const char *text = argv[++i];
        if (!parse_option_value(o, text)) {
            fprintf(stderr, "error: %s: %s '%s' is not valid; expected %s\n", command, arg, text, expected);
            return 1;
        }
        o->seen = 1;
    }
    return 0;
}

static void set_threads(int threads) {
#ifdef _OPENMP
    if (threads > 0) omp_set_num_threads(threads);
#else
    (void)threads;
#endif
}

static int thread_count(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

// ---- train ----------------------------------------------------------------------

typedef struct {
    // data
    const char *task, *train_path, *valid_path;
    int words, min_length, max_length, train_size, valid_size;
    // model (Table 3's N, d_model, d_ff, h, P_drop, eps_ls)
    int layers, d_model, d_ff, heads, positions;
    double dropout, label_smoothing;
    // schedule (§5.3)
    int steps, warmup, batch_tokens, seed;
    double lr;
    // this session
    const char *checkpoint, *resume, *loss_log;
    int eval_every, save_every, log_every, eval_size, show, threads;
} TrainOptions;

static TrainOptions train_defaults(void) {
    TrainOptions o;
    memset(&o, 0, sizeof o);
    o.task = "copy";
    o.words = 10; o.min_length = 1; o.max_length = 10; o.train_size = 10000; o.valid_size = 200;
    o.layers = 2; o.d_model = 64; o.d_ff = 256; o.heads = 4; o.positions = 0;
    o.dropout = 0.1; o.label_smoothing = 0.1;
    o.steps = 1500; o.warmup = 50; o.batch_tokens = 600; o.seed = 1; o.lr = 3e-3;
    o.eval_every = 250; o.save_every = 0; o.log_every = 50; o.eval_size = 0; o.show = 5; o.threads = 0;
    return o;
}

static int train_option_table(Option *t, TrainOptions *o) {
    Option list[] = {
        TEXT_OPTION("--task", &o->task, RUN, "built-in task, copy or reverse (used when there is no --train)"),
        TEXT_OPTION("--train", &o->train_path, RUN, "training data: a file of source<TAB>target lines"),
        TEXT_OPTION("--valid", &o->valid_path, RUN, "held-out data, same format (default: every 20th line of --train)"),
        INT_OPTION("--words", &o->words, 1, 100000, RUN, "task: the words are the numbers 0..N-1"),
        INT_OPTION("--min-length", &o->min_length, 1, TRANSFORMER_MAX_LEN - 1, RUN, "task: shortest sequence"),
        INT_OPTION("--max-length", &o->max_length, 1, TRANSFORMER_MAX_LEN - 1, RUN, "task: longest sequence"),
        INT_OPTION("--train-size", &o->train_size, 1, 10000000, RUN, "task: training pairs"),
        INT_OPTION("--valid-size", &o->valid_size, 1, 100000, RUN, "task: held-out pairs, none of them seen in training"),
        INT_OPTION("--layers", &o->layers, 1, TRANSFORMER_MAX_LAYERS, RUN, "N, layers in the encoder and in the decoder"),
        INT_OPTION("--d-model", &o->d_model, 1, TRANSFORMER_MAX_WIDTH, RUN, "d_model"),
        INT_OPTION("--d-ff", &o->d_ff, 1, TRANSFORMER_MAX_WIDTH, RUN, "d_ff, the feed-forward inner width"),
        INT_OPTION("--heads", &o->heads, 1, TRANSFORMER_MAX_WIDTH, RUN, "h, attention heads"),
        INT_OPTION("--positions", &o->positions, 0, TRANSFORMER_MAX_LEN, RUN,
                   "maximum sentence length the model takes; 0: the longest in the data + 50"),
        NUMBER_OPTION("--dropout", &o->dropout, 0, 0.99, 0, RUN, "P_drop (§5.4)"),
        NUMBER_OPTION("--label-smoothing", &o->label_smoothing, 0, 0.99, 0, RUN, "eps_ls (§5.4)"),
        INT_OPTION("--steps", &o->steps, 1, 1000000000, RUN_EXTENDABLE, "training steps (may be raised on --resume)"),
        NUMBER_OPTION("--lr", &o->lr, 0, DBL_MAX, 1, RUN, "peak learning rate: eq. 3 of §5.3 scaled to reach it at step --warmup"),
        INT_OPTION("--warmup", &o->warmup, 1, 1000000000, RUN, "warmup_steps of eq. 3"),
        INT_OPTION("--batch-tokens", &o->batch_tokens, 1, 100000000, RUN, "tokens per batch, source + target, padding included"),
        INT_OPTION("--seed", &o->seed, 0, INT_MAX, RUN, "seed of the data, the initial weights and dropout"),
        TEXT_OPTION("--checkpoint", &o->checkpoint, SESSION, "checkpoint file (default runs/TASK.ckpt or runs/FILE.ckpt)"),
        TEXT_OPTION("--resume", &o->resume, SESSION, "go on with the run in this checkpoint"),
        TEXT_OPTION("--loss-log", &o->loss_log, SESSION, "append 'step loss lr' of every step to this file"),
        INT_OPTION("--eval-every", &o->eval_every, 0, INT_MAX, SESSION, "held-out evaluation every N steps (0: only at the end)"),
        INT_OPTION("--save-every", &o->save_every, 0, INT_MAX, SESSION, "checkpoint every N steps (0: at each evaluation)"),
        INT_OPTION("--log-every", &o->log_every, 0, INT_MAX, SESSION, "progress line every N steps (0: none)"),
        INT_OPTION("--eval-size", &o->eval_size, 0, INT_MAX, SESSION, "held-out pairs to decode at each evaluation (0: all)"),
        INT_OPTION("--show", &o->show, 0, INT_MAX, SESSION, "held-out examples to print at the end"),
        INT_OPTION("--threads", &o->threads, 0, 1024, SESSION, "OpenMP threads (0: all cores)"),
    };
    int n = (int)(sizeof list / sizeof *list);
    memcpy(t, list, sizeof list);
    return n;
}

static const char *train_usage =
    "usage: ./transformer train [--task copy|reverse | --train FILE.tsv] [options]\n"
    "Trains a Transformer with Adam and the warm-up schedule of §5.3, label smoothing and\n"
    "dropout (§5.4), on a built-in task or on source<TAB>target lines; evaluates on held-out\n"
    "pairs as it goes and writes checkpoints (resume with --resume FILE).";

// The run options as text, one argument per line, for the checkpoint:
// --resume reads them back with the same table.
static char *format_run_options(const Option *options, int n) {
    size_t capacity = 256, used = 0;
    char *text = checked_calloc(capacity, 1, "run options");
    for (int i = 0; i < n; i++) {
        const Option *o = &options[i];
        char value[4200];
        if (o->role == SESSION) continue;
        if (o->kind == OPTION_INT) snprintf(value, sizeof value, "%d", *(int *)o->value);
        else if (o->kind == OPTION_NUMBER) snprintf(value, sizeof value, "%.17g", *(double *)o->value);
        else if (*(const char **)o->value) snprintf(value, sizeof value, "%s", *(const char **)o->value);
        else continue;
        size_t need = strlen(o->name) + strlen(value) + 3;
        if (used + need >= capacity) {
            capacity = 2 * (used + need);
            text = checked_realloc(text, capacity, 1, "run options");
        }
        used += (size_t)sprintf(text + used, "%s\n%s\n", o->name, value);
    }
    return text;
}

// Everything a training run holds.
typedef struct {
    TrainOptions opt;
    Option table[MAX_OPTIONS];
    int num_options;
    Vocabulary vocab;
    Dataset train, valid;
    Transformer model;
    TrainingState state;
    Rng data_rng;            // draws each epoch's batch order
    EpochPlan plan;
    BatchBuffer batch;
    char *run_options;       // format_run_options, stored in every checkpoint
    char *stored_options;    // the checkpoint's, on --resume (text options point into it)
    char checkpoint_path[4096];
    char data_name[300];     // for messages: "copy task", "data.tsv"
    long last_saved_step;
} TrainRun;

static void train_run_free(TrainRun *r) {
    vocab_free(&r->vocab);
    dataset_free(&r->train);
    dataset_free(&r->valid);
    transformer_free(&r->model);
    epoch_plan_free(&r->plan);
    batch_buffer_free(&r->batch);
    free(r->run_options);
    free(r->stored_options);
}

static int task_index(const char *name) {
    for (int i = 0; i < NUM_TASKS; i++) if (strcmp(name, task_names[i]) == 0) return i;
    return -1;
}

// Builds (or, on resume, rebuilds) the training and held-out pairs. A new run
// takes its vocabulary from the training data; a resumed run reads the data
// with the checkpoint's vocabulary and checks that it is the same data.
static const char *train_load_data(TrainRun *r, int resuming) {
    TrainOptions *o = &r->opt;
    const char *error;
    if (!o->train_path) {
        int task = task_index(o->task);
        if (task < 0) return errorf("--task '%s' is not a task; expected copy or reverse", o->task);
        if (o->min_length > o->max_length)
            return errorf("--min-length %d is above --max-length %d; expected min <= max", o->min_length, o->max_length);
        if (o->valid_path) return errorf("--valid goes with --train FILE; a task makes its own held-out pairs");
        if (!resuming) task_vocabulary(&r->vocab, o->words);
        else if (r->vocab.size != NUM_SPECIAL_TOKENS + o->words)
            return errorf("the checkpoint's vocabulary has %d tokens; the %s task with --words %d has %d",
                          r->vocab.size, o->task, o->words, NUM_SPECIAL_TOKENS + o->words);
        snprintf(r->data_name, sizeof r->data_name, "%s task", o->task);
        error = task_generate(&r->train, &r->valid, task, o->words, o->min_length, o->max_length,
                              o->train_size, o->valid_size, (uint64_t)o->seed);
        if (error) return error;
    } else {
        snprintf(r->data_name, sizeof r->data_name, "%s", o->train_path);
        if (!resuming) vocab_init(&r->vocab);
        if ((error = dataset_read_tsv(&r->train, &r->vocab, o->train_path, !resuming))) return error;
        if (o->valid_path) {
            if ((error = dataset_read_tsv(&r->valid, &r->vocab, o->valid_path, 0))) return error;
        } else if (r->train.count >= 20) {
            dataset_split(&r->train, &r->valid, 20);
        }
    }
    uint64_t hash = dataset_hash(&r->train);
    if (resuming && hash != r->state.data_hash)
        return errorf("%s: not the training data of the checkpoint (its sentence pairs differ); "
                      "expected the same data to resume", r->data_name);
    r->state.data_hash = hash;
    return NULL;
}

static const Option *find_option(const Option *options, int n, const char *name) {
    for (int i = 0; i < n; i++) if (strcmp(options[i].name, name) == 0) return &options[i];
    return NULL;
}

static const char *train_start(TrainRun *r) {
    TrainOptions *o = &r->opt;
    const char *error;
    if (o->train_path && find_option(r->table, r->num_options, "--task")->seen)
        return errorf("--task and --train both given; expected one of them");
    if ((error = train_load_data(r, 0))) return error;
    TransformerConfig c = transformer_default_config();
    c.n_layers = o->layers; c.d_model = o->d_model; c.d_ff = o->d_ff; c.n_heads = o->heads;
    c.vocab_size = r->vocab.size;
    c.dropout = (float)o->dropout; c.label_smoothing = (float)o->label_smoothing;
    int longest = r->train.longest_src > r->train.longest_tgt ? r->train.longest_src : r->train.longest_tgt;
    c.max_len = o->positions ? o->positions : longest + 1 + 50;
    if (c.max_len > TRANSFORMER_MAX_LEN) c.max_len = TRANSFORMER_MAX_LEN;
    if ((error = transformer_config_check(&c))) return errorf("model: %s", error);
    if ((error = dataset_check_lengths(&r->train, r->data_name, c.max_len))) return error;
    if ((error = dataset_check_lengths(&r->valid, o->valid_path ? o->valid_path : r->data_name, c.max_len)))
        return error;
    if ((error = transformer_build(&r->model, &c, (uint64_t)o->seed))) return errorf("model: %s", error);
    rng_seed(&r->data_rng, (uint64_t)o->seed ^ 0xDA7A0DE5ULL);
    r->last_saved_step = -1;
    return NULL;
}

// --resume: the run's options come from the checkpoint; the command line may
// add only --steps and session flags (cli, the parsed command line).
static const char *train_resume(TrainRun *r, const Option *cli, int n) {
    const char *error, *path = *(const char **)find_option(cli, n, "--resume")->value;
    for (int i = 0; i < n; i++)
        if (cli[i].seen && cli[i].role == RUN)
            return errorf("%s cannot change on --resume: the checkpoint fixes the run's data, model and "
                          "schedule; expected only --steps and session flags", cli[i].name);
    if ((error = checkpoint_load(path, &r->model, &r->vocab, &r->state, &r->stored_options))) return error;
    // the stored options, one argument per line, read with the same table
    char *args[2 * MAX_OPTIONS + 1];
    int argc = 1;
    args[0] = "train";
    for (char *p = r->stored_options; *p && argc < 2 * MAX_OPTIONS + 1; ) {
        args[argc++] = p;
        char *end = strchr(p, '\n');
        if (!end) break;
        *end = '\0';
        p = end + 1;
    }
    if (parse_options("train", train_usage, r->table, r->num_options, argc, args, NULL, NULL) != 0)
        return errorf("%s: the run options stored in the checkpoint are not readable", path);
    // then this command line's flags (the same table, so the same positions)
    for (int i = 0; i < n; i++) {
        if (!cli[i].seen) continue;
        if (cli[i].kind == OPTION_INT) *(int *)r->table[i].value = *(int *)cli[i].value;
        else if (cli[i].kind == OPTION_NUMBER) *(double *)r->table[i].value = *(double *)cli[i].value;
        else *(const char **)r->table[i].value = *(const char **)cli[i].value;
    }
    if (!find_option(cli, n, "--checkpoint")->seen) r->opt.checkpoint = path; // keep writing where the run was
    if ((error = train_load_data(r, 1))) return error;
    if ((error = dataset_check_lengths(&r->valid, r->opt.valid_path ? r->opt.valid_path : r->data_name,
                                       r->model.config.max_len))) return error;
    // the data order: redraw the current epoch from the generator state it was drawn with
    r->data_rng.state = r->state.epoch_rng;
    if (r->state.epoch > 0) {
        epoch_plan_make(&r->plan, &r->train, r->opt.batch_tokens, &r->data_rng);
        if (r->state.epoch_batches > (uint64_t)r->plan.num_spans)
            return errorf("%s: %llu batches done in an epoch of %d; the checkpoint does not fit the data", path,
                          (unsigned long long)r->state.epoch_batches, r->plan.num_spans);
    }
    r->last_saved_step = r->model.adam_step;
    return NULL;
}


static void format_duration(char *text, size_t n, double seconds) {
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(text, n, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
    else snprintf(text, n, "%ld:%02ld", s / 60, s % 60);
}

static int parameters_finite(const Transformer *m) {
    for (size_t i = 0; i < m->num_parameters; i++) if (!isfinite(m->params_memory[i])) return 0;
    return 1;
}

// The checkpoint path (default runs/TASK.ckpt or runs/FILE.ckpt), checked to be
// writable before any training, and the run options text to store in it.
static const char *train_prepare_output(TrainRun *r) {
    TrainOptions *o = &r->opt;
    if (o->checkpoint) {
        if (strlen(o->checkpoint) + 5 >= sizeof r->checkpoint_path) return errorf("--checkpoint: path too long");
        snprintf(r->checkpoint_path, sizeof r->checkpoint_path, "%s", o->checkpoint);
    } else {
        const char *name = o->train_path ? o->train_path : o->task, *slash = strrchr(name, '/');
        if (slash) name = slash + 1;
        const char *dot = strrchr(name, '.');
        int length = dot && dot != name ? (int)(dot - name) : (int)strlen(name);
        if (length > 200) length = 200;
        if (mkdir("runs", 0777) != 0 && errno != EEXIST) return errorf("runs/: cannot create: %s", strerror(errno));
        snprintf(r->checkpoint_path, sizeof r->checkpoint_path, "runs/%.*s.ckpt", length, name);
    }
    char tmp[sizeof r->checkpoint_path + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", r->checkpoint_path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return errorf("%s: cannot write the checkpoint there: %s", tmp, strerror(errno));
    fclose(f);
    remove(tmp);
    if (o->resume && strcmp(o->resume, r->checkpoint_path) != 0) r->last_saved_step = -1;
    r->run_options = format_run_options(r->table, r->num_options);
    return NULL;
}

static const char *train_save(TrainRun *r) {
    if (!parameters_finite(&r->model))
        return errorf("step %ld: a parameter is not finite; %s was not overwritten", r->model.adam_step,
                      r->checkpoint_path);
    const char *error = checkpoint_save(r->checkpoint_path, &r->model, &r->vocab, &r->state, r->run_options);
    if (!error) r->last_saved_step = r->model.adam_step;
    return error;
}

// Held-out loss, token accuracy and exact match of greedy decoding; at the
// end of the run also a few decoded examples.
static void train_evaluate(TrainRun *r, int final) {
    if (r->valid.count == 0) {
        printf("eval   step %ld | no held-out pairs (fewer than 20 lines and no --valid)\n", r->model.adam_step);
        return;
    }
    Evaluation e;
    evaluate(&e, &r->model, &r->valid, r->opt.eval_size, r->opt.batch_tokens, 1, 0.6);
    printf("eval   step %ld | held-out loss %.4f | token accuracy %.1f%% | exact match %.1f%% (%d/%d)\n",
           r->model.adam_step, e.loss, 100.0 * e.correct / (e.compared ? e.compared : 1),
           100.0 * e.exact / e.sentences, e.exact, e.sentences);
    if (final && r->opt.show > 0) {
        printf("held-out examples, greedy decoding:\n");
        print_examples(&e, &r->valid, &r->vocab, r->opt.show);
        printf("exact match on %d held-out %s: %.1f%% (%d/%d)\n", e.sentences,
               r->opt.train_path ? "pairs" : "sequences never seen in training",
               100.0 * e.exact / e.sentences, e.exact, e.sentences);
    }
    fflush(stdout);
    evaluation_free(&e);
}

static void train_print_header(const TrainRun *r) {
    const TrainOptions *o = &r->opt;
    const TransformerConfig *c = &r->model.config;
    printf("data   %s: %d training pairs, %d held-out, vocabulary %d\n", r->data_name, r->train.count,
           r->valid.count, r->vocab.size);
    printf("model  N=%d d_model=%d d_ff=%d h=%d max_len=%d: %zu parameters\n", c->n_layers, c->d_model,
           c->d_ff, c->n_heads, c->max_len, r->model.num_parameters);
    printf("train  %d steps, peak lr %g at step %d (§5.3), batches <= %d tokens, P_drop %g, eps_ls %g, "
           "seed %d, %d thread%s\n", o->steps, o->lr, o->warmup, o->batch_tokens, (double)c->dropout,
           (double)c->label_smoothing, o->seed, thread_count(), thread_count() == 1 ? "" : "s");
    if (o->resume) printf("resume %s at step %ld\n", o->resume, r->model.adam_step);
    printf("checkpoints to %s\n", r->checkpoint_path);
    fflush(stdout);
}

// step 400/1500 | loss 0.8978 | lr 1.06e-03 | 15.6k tok/s | elapsed 0:14 | left 0:38
static void print_progress(long step, int steps, real loss, double lr, double tokens_per_second,
                           double elapsed_seconds, double left_seconds) {
    char elapsed[32], left[32];
    format_duration(elapsed, sizeof elapsed, elapsed_seconds);
    format_duration(left, sizeof left, left_seconds);
    printf("step %5ld/%d | loss %.4f | lr %.2e | %6.1fk tok/s | elapsed %s | left %s\n", step, steps,
           (double)loss, lr, tokens_per_second / 1000, elapsed, left);
    fflush(stdout);
}

// The training loop (§5): batches by length, teacher forcing, Adam with the
// warm-up schedule of eq. 3, scaled so that it peaks at --lr.
static const char *train_loop(TrainRun *r) {
    TrainOptions *o = &r->opt;
    Transformer *m = &r->model;
    // eq. 3 peaks at step = warmup with d_model^-0.5 warmup^-0.5, so this factor makes the peak --lr
    double factor = o->lr * sqrt((double)m->config.d_model * o->warmup);
    int save_every = o->save_every ? o->save_every : o->eval_every;
    FILE *loss_log = NULL;
    if (o->loss_log && !(loss_log = fopen(o->loss_log, "a")))
        return errorf("%s: cannot write: %s", o->loss_log, strerror(errno));
    train_print_header(r);
    if (m->adam_step >= o->steps) {
        printf("the checkpoint is at step %ld and --steps is %d: nothing to train\n", m->adam_step, o->steps);
        train_evaluate(r, 1);
    }
    double start = wall_seconds(), last_time = start;
    long first_step = m->adam_step, tokens = 0;
    const char *error = NULL;
    while (!error && m->adam_step < o->steps) {
        if (r->state.epoch == 0 || r->state.epoch_batches == (uint64_t)r->plan.num_spans) {
            r->state.epoch_rng = r->data_rng.state;
            epoch_plan_make(&r->plan, &r->train, o->batch_tokens, &r->data_rng);
            r->state.epoch++;
            r->state.epoch_batches = 0;
        }
        BatchSpan span = r->plan.spans[r->state.epoch_batches++];
        batch_fill(&r->batch, &r->train, r->plan.order + span.start, span.count);
        long step = m->adam_step + 1;
        m->training = 1;
        real loss = transformer_forward(m, &r->batch.batch);
        if (!isfinite(loss)) {
            char saved[4300];
            if (r->last_saved_step >= 0)
                snprintf(saved, sizeof saved, "the last good checkpoint, %s (step %ld), is left as it was",
                         r->checkpoint_path, r->last_saved_step);
            else snprintf(saved, sizeof saved, "no checkpoint was written");
            error = errorf("step %ld: the loss is %s; training stopped (try a lower --lr); %s",
                           step, isnan(loss) ? "NaN" : "infinite", saved);
            break;
        }
        transformer_zero_grad(m);
        transformer_backward(m, &r->batch.batch);
        double lr = transformer_learning_rate(step, m->config.d_model, o->warmup, factor);
        adam_update(m, lr);
        tokens += r->batch.tokens;
        if (loss_log) fprintf(loss_log, "%ld %.9g %.9g\n", step, (double)loss, lr);
        int last = step == o->steps;
        if (o->log_every && (step % o->log_every == 0 || last)) {
            double now = wall_seconds();
            print_progress(step, o->steps, loss, lr, tokens / (now - last_time + 1e-9), now - start,
                           (now - start) / (step - first_step) * (o->steps - step));
            last_time = now;
            tokens = 0;
        }
        if ((o->eval_every && step % o->eval_every == 0) || last) train_evaluate(r, last);
        if ((save_every && step % save_every == 0) || last) error = train_save(r);
    }
    if (!error && m->adam_step > first_step) {
        char elapsed[32];
        format_duration(elapsed, sizeof elapsed, wall_seconds() - start);
        printf("trained steps %ld..%ld in %s (%.1f s); checkpoint %s\n", first_step + 1, m->adam_step, elapsed,
               wall_seconds() - start, r->checkpoint_path);
    }
    if (loss_log) fclose(loss_log);
    return error;
}

static int command_train(int argc, char **argv) {
    TrainOptions cli_values = train_defaults();
    Option cli[MAX_OPTIONS];
    int n = train_option_table(cli, &cli_values);
    int status = parse_options("train", train_usage, cli, n, argc, argv, NULL, NULL);
    if (status) return status == 2 ? 0 : 1;
    set_threads(cli_values.threads);
    TrainRun *r = checked_calloc(1, sizeof(TrainRun), "training run");
    r->opt = train_defaults();
    r->num_options = train_option_table(r->table, &r->opt);
    const char *error;
    if (cli_values.resume) {
        error = train_resume(r, cli, n);
    } else {
        r->opt = cli_values;
        for (int i = 0; i < n; i++) r->table[i].seen = cli[i].seen;
        error = train_start(r);
    }
    if (!error) error = train_prepare_output(r);
    if (!error) error = train_loop(r);
    if (error) fprintf(stderr, "error: train: %s\n", error);
    train_run_free(r);
    free(r);
    return error ? 1 : 0;
}

// ---- decode ---------------------------------------------------------------------

// Decodes one sentence of text and prints the output on one line.
static const char *decode_sentence(Transformer *m, Vocabulary *v, char *text, TextSource *from,
                                   int beam, double alpha) {
    int *ids = NULL, n = 0;
    size_t capacity = 0;
    for (char *p = text; *p; p++) n += !isspace((unsigned char)*p) && (p == text || isspace((unsigned char)p[-1]));
    if (n <= m->config.max_len - 1) n = tokenize(text, v, 0, &ids, &capacity, from);
    if (n > m->config.max_len - 1) {
        free(ids);
        return errorf("%s: the sentence has %d tokens; the model's maximum length %d allows %d (one position is </s>)",
                      from->where, n, m->config.max_len, m->config.max_len - 1);
    }
    if (n > 0) {
        if ((size_t)n == capacity) ids = checked_realloc(ids, n + 1, sizeof(int), "token ids");
        ids[n++] = TOKEN_EOS; // the source ends with </s>, as in training (batch_fill)
        int limit = transformer_decode_limit(m, n), length;
        int *out = checked_calloc(limit, sizeof(int), "decoded sentence");
        if (beam <= 1) transformer_greedy_decode(m, out, &length, limit, ids, &n, 1, n);
        else length = transformer_beam_search(m, out, NULL, ids, n, beam, alpha);
        print_tokens(stdout, v, out, length);
        free(out);
    }
    printf("\n");
    fflush(stdout);
    free(ids);
    return NULL;
}

static int command_decode(int argc, char **argv) {
    const char *checkpoint = NULL;
    int beam = 1, threads = 0;
    double alpha = 0.6;
    Option options[] = {
        TEXT_OPTION("--checkpoint", &checkpoint, SESSION, "the trained model (required)"),
        INT_OPTION("--beam", &beam, 1, 1000, SESSION, "beam size; 1 is greedy decoding (the paper used 4)"),
        NUMBER_OPTION("--alpha", &alpha, 0, 100, 0, SESSION, "length penalty ((5+len)/6)^alpha of beam search (§6.1)"),
        INT_OPTION("--threads", &threads, 0, 1024, SESSION, "OpenMP threads (0: all cores)"),
    };
    const char *usage =
        "usage: ./transformer decode --checkpoint FILE [--beam 4] ['SENTENCE' ...]\n"
        "Translates each SENTENCE (tokens separated by spaces), or else each line of standard input,\n"
        "and prints the output, one line each. Greedy decoding with a key/value cache, or beam\n"
        "search with --beam; at most source length + 50 tokens (§6.1).";
    char **sentences = checked_calloc(argc, sizeof(char *), "arguments");
    int num_sentences = 0, n = (int)(sizeof options / sizeof *options);
    int status = parse_options("decode", usage, options, n, argc, argv, sentences, &num_sentences);
    if (status) { free(sentences); return status == 2 ? 0 : 1; }
    set_threads(threads);
    Transformer m;
    Vocabulary v;
    const char *error = checkpoint ? checkpoint_load(checkpoint, &m, &v, NULL, NULL)
                                   : "--checkpoint FILE is required (a model written by ./transformer train)";
    if (!error) {
        TextSource from = { "", 0, 0 };
        for (int i = 0; i < num_sentences && !error; i++) {
            snprintf(from.where, sizeof from.where, "argument %d", i + 1);
            error = decode_sentence(&m, &v, sentences[i], &from, beam, alpha);
        }
        if (num_sentences == 0) {
            char *line = NULL;
            size_t capacity = 0;
            for (int line_no = 1; !error && getline(&line, &capacity, stdin) != -1; line_no++) {
                snprintf(from.where, sizeof from.where, "stdin:%d", line_no);
                error = decode_sentence(&m, &v, line, &from, beam, alpha);
            }
            free(line);
        }
        transformer_free(&m);
        vocab_free(&v);
    }
    if (error) fprintf(stderr, "error: decode: %s\n", error);
    free(sentences);
    return error ? 1 : 0;
}

// ---- eval -------------------------------------------------------------------------

static int command_eval(int argc, char **argv) {
    const char *checkpoint = NULL, *data = NULL;
    int beam = 1, threads = 0, show = 0, batch_tokens = 2000;
    double alpha = 0.6;
    Option options[] = {
        TEXT_OPTION("--checkpoint", &checkpoint, SESSION, "the trained model (required)"),
        TEXT_OPTION("--data", &data, SESSION, "source<TAB>target lines to evaluate on (required)"),
        INT_OPTION("--beam", &beam, 1, 1000, SESSION, "beam size; 1 is greedy decoding"),
        NUMBER_OPTION("--alpha", &alpha, 0, 100, 0, SESSION, "length penalty exponent of beam search"),
        INT_OPTION("--show", &show, 0, INT_MAX, SESSION, "print the first N decoded pairs"),
        INT_OPTION("--batch-tokens", &batch_tokens, 1, 100000000, SESSION, "tokens decoded side by side"),
        INT_OPTION("--threads", &threads, 0, 1024, SESSION, "OpenMP threads (0: all cores)"),
    };
    const char *usage =
        "usage: ./transformer eval --checkpoint FILE --data FILE.tsv [--beam 4]\n"
        "Decodes every source of FILE.tsv and compares the output with the target: token accuracy\n"
        "(positions that agree, over the longer of output and target) and exact match.";
    int status = parse_options("eval", usage, options, (int)(sizeof options / sizeof *options), argc, argv, NULL, NULL);
    if (status) return status == 2 ? 0 : 1;
    set_threads(threads);
    if (!checkpoint || !data) {
        fprintf(stderr, "error: eval: %s is required\n", !checkpoint ? "--checkpoint FILE" : "--data FILE.tsv");
        return 1;
    }
    Transformer m;
    Vocabulary v;
    Dataset d;
    memset(&d, 0, sizeof d);
    const char *error = checkpoint_load(checkpoint, &m, &v, NULL, NULL);
    if (error) { fprintf(stderr, "error: eval: %s\n", error); return 1; }
    if (!(error = dataset_read_tsv(&d, &v, data, 0))) error = dataset_check_lengths(&d, data, m.config.max_len);
    if (!error) {
        Evaluation e;
        evaluate(&e, &m, &d, 0, batch_tokens, beam, alpha);
        if (show) print_examples(&e, &d, &v, show);
        printf("%s: %d pairs, %s\n", data, e.sentences, beam > 1 ? "beam search" : "greedy decoding");
        printf("token accuracy  %.2f%% (%ld/%ld)\n", 100.0 * e.correct / (e.compared ? e.compared : 1),
               e.correct, e.compared);
        printf("exact match     %.2f%% (%d/%d)\n", 100.0 * e.exact / e.sentences, e.exact, e.sentences);
        printf("loss            %.4f per target token (teacher forcing, label smoothing %g)\n", e.loss,
               (double)m.config.label_smoothing);
        evaluation_free(&e);
    }
    if (error) fprintf(stderr, "error: eval: %s\n", error);
    dataset_free(&d);
    transformer_free(&m);
    vocab_free(&v);
    return error ? 1 : 0;
}

// ---- params -------------------------------------------------------------------------

// Parameters of a config, per component; sums parameter_sizes, so the total
// is the model's num_parameters by construction.
typedef struct { const char *name; int tensors[6]; int count; } ParameterGroup;

static const ParameterGroup parameter_groups[] = {
    { "embedding, shared by source, target and pre-softmax (§3.4)", { 0 }, 1 },
    { "encoder self-attention: W^Q W^K W^V W^O and biases", { 1, 2, 3, 4 }, 4 },
    { "encoder feed-forward: W_1 W_2 and biases", { 7, 8, 9, 10 }, 4 },
    { "encoder layer norms: gain and bias, 2 per layer", { 5, 6, 11, 12 }, 4 },
    { "decoder masked self-attention", { 13, 14, 15, 16 }, 4 },
    { "decoder encoder-decoder attention", { 19, 20, 21, 22 }, 4 },
    { "decoder feed-forward", { 25, 26, 27, 28 }, 4 },
    { "decoder layer norms, 3 per layer", { 17, 18, 23, 24, 29, 30 }, 6 },
};
#define NUM_PARAMETER_GROUPS ((int)(sizeof parameter_groups / sizeof *parameter_groups))

static size_t parameter_group_count(const size_t sizes[NUM_PARAMETER_TENSORS], int group) {
    size_t total = 0;
    for (int i = 0; i < parameter_groups[group].count; i++) total += sizes[parameter_groups[group].tensors[i]];
    return total;
}

static void format_count(char *text, size_t n, size_t count) { // 65012345 -> "65,012,345"
    char digits[32];
    int length = snprintf(digits, sizeof digits, "%zu", count), j = 0;
    for (int i = 0; i < length && (size_t)j + 2 < n; i++) {
        if (i > 0 && (length - i) % 3 == 0) text[j++] = ',';
        text[j++] = digits[i];
    }
    text[j] = '\0';
}

static int command_params(int argc, char **argv) {
    TransformerConfig c = transformer_default_config();
    const char *preset = NULL;
    int layers = c.n_layers, d_model = c.d_model, d_ff = c.d_ff, heads = c.n_heads, vocab = NUM_SPECIAL_TOKENS + 10;
    Option options[] = {
        TEXT_OPTION("--preset", &preset, SESSION, "base or big: Table 3's sizes, vocabulary 37000"),
        INT_OPTION("--layers", &layers, 1, TRANSFORMER_MAX_LAYERS, SESSION, "N"),
        INT_OPTION("--d-model", &d_model, 1, TRANSFORMER_MAX_WIDTH, SESSION, "d_model"),
        INT_OPTION("--d-ff", &d_ff, 1, TRANSFORMER_MAX_WIDTH, SESSION, "d_ff"),
        INT_OPTION("--heads", &heads, 1, TRANSFORMER_MAX_WIDTH, SESSION, "h"),
        INT_OPTION("--vocab", &vocab, NUM_SPECIAL_TOKENS + 1, TRANSFORMER_MAX_VOCAB, SESSION,
                   "shared vocabulary size, special tokens included"),
    };
    const char *usage =
        "usage: ./transformer params [--preset base|big] [--layers N --d-model N --d-ff N --heads N --vocab N]\n"
        "Counts the parameters of a model, per component and in total (flags override the preset).";
    int n = (int)(sizeof options / sizeof *options);
    int status = parse_options("params", usage, options, n, argc, argv, NULL, NULL);
    if (status) return status == 2 ? 0 : 1;
    const char *paper = NULL;
    if (preset) {
        // Table 3: base N=6 d_model=512 d_ff=2048 h=8 (65M); big N=6 d_model=1024 d_ff=4096 h=16 (213M).
        // §5.1: a shared source-target vocabulary of about 37000 tokens (BPE, English-German).
        int big = strcmp(preset, "big") == 0;
        if (!big && strcmp(preset, "base") != 0) {
            fprintf(stderr, "error: params: --preset '%s' is not a preset; expected base or big\n", preset);
            return 1;
        }
        int values[5] = { 6, big ? 1024 : 512, big ? 4096 : 2048, big ? 16 : 8, 37000 };
        int *targets[5] = { &layers, &d_model, &d_ff, &heads, &vocab };
        for (int i = 0; i < 5; i++) if (!options[i + 1].seen) *targets[i] = values[i];
        paper = big ? "213M" : "65M";
    }
    c.n_layers = layers; c.d_model = d_model; c.d_ff = d_ff; c.n_heads = heads; c.vocab_size = vocab;
    const char *error = transformer_config_check(&c);
    if (error) { fprintf(stderr, "error: params: %s\n", error); return 1; }
    size_t sizes[NUM_PARAMETER_TENSORS];
    parameter_sizes(sizes, &c);
    printf("model: N=%d d_model=%d d_ff=%d h=%d (d_k = d_v = %d) vocabulary %d\n", layers, d_model, d_ff, heads,
           d_model / heads, vocab);
    char count[40];
    size_t total = 0;
    for (int g = 0; g < NUM_PARAMETER_GROUPS; g++) {
        size_t k = parameter_group_count(sizes, g);
        total += k;
        format_count(count, sizeof count, k);
        printf("  %-58s %15s\n", parameter_groups[g].name, count);
    }
    printf("  %-58s %15s\n", "positional encoding: sinusoids (§3.5)", "0");
    format_count(count, sizeof count, total);
    printf("  %-58s %15s  (%.1fM)\n", "total", count, total / 1e6);
    if (paper) printf("paper, Table 3: %s\n", paper);
    return 0;
}

// ============================================================================
// main: the table of contents
//   ./transformer train    learn a task (§5): copy, reverse or a TSV file
//   ./transformer decode   translate with a checkpoint (§6.1)
//   ./transformer eval     token accuracy and exact match on a TSV file
//   ./transformer params   parameter counts (Table 3)
// ============================================================================

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);   // argv[0] is the command's name
    const char *summary;
} Command;

static const Command commands[] = {
    { "train",  command_train,  "train on a built-in task (--task copy|reverse) or a TSV file (--train)" },
    { "decode", command_decode, "decode sentences with a checkpoint: greedy, or beam search (--beam 4)" },
    { "eval",   command_eval,   "token accuracy and exact match of decoded outputs on a TSV file" },
    { "params", command_params, "parameter count of a configuration, per component (--preset base|big)" },
};

static void print_usage(FILE *f) {
    fprintf(f, "usage: ./transformer COMMAND [options]   (./transformer COMMAND --help for its options)\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(f, "  %-7s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "example: ./transformer train --task copy && ./transformer decode --checkpoint runs/copy.ckpt \"3 1 4 1 5\"\n");
}

// Runs one command line; main is this. Returns the exit status: 0, or 1
// after a one-line error.
int transformer_main(int argc, char **argv) {
    if (argc < 2) { print_usage(stderr); return 1; }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        print_usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "error: unknown command '%s'; expected train, decode, eval or params (see ./transformer --help)\n",
            argv[1]);
    return 1;
}

#ifndef TRANSFORMER_NO_MAIN
int main(int argc, char **argv) {
    return transformer_main(argc, argv);
}
#endif
