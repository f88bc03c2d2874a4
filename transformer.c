/* transformer.c: the Transformer of "Attention Is All You Need" in plain C
 *
 * Vaswani, Shazeer, Parmar, Uszkoreit, Jones, Gomez, Kaiser, Polosukhin, NeurIPS 2017,
 * arXiv 1706.03762. The whole encoder-decoder model, its hand-derived backward pass and the
 * paper's Adam schedule, one loop at a time, and the smallest program that trains it on a
 * toy task and translates with it.
 *
 * BUILD  cc -O3 -march=native -fopenmp transformer.c -lm    this file alone: train and decode,
 *          the loops below on every core, their dot products in vector lanes ("omp simd": the
 *          compiler may not reorder a sum unless told); cc -O2 transformer.c -lm builds it
 *          anywhere, one core, 10 times slower
 *        make                       ./transformer: this file with its companions in lab/
 *        make debug                 -O0 -g, this file alone: gdb's `next` walks every loop
 * TEST   make test
 * RUN    ./transformer train --task copy
 *        ./transformer decode --checkpoint runs/copy.ckpt "3 1 4"
 * READ   from the top, beside the paper (NOTES.md has a reading path):
 *   PART I   THE MODEL: the building blocks first, each under its section of the paper (§3
 *            linear layers to §5.4 the loss), then the §3.1 stacks built from them, the
 *            whole model forward and backward, §5.3 Adam, the training step, §6.1 decoding;
 *            last the machinery (memory, random numbers, the parameters' list).
 *   PART II  THE PROGRAM: the copy and reverse tasks, batches by length, held-out
 *            evaluation, checkpoints, the commands train and decode, and main.
 * CONVENTIONS
 *   Every layer is a `*_forward` function followed by its `*_backward`, arguments outputs
 *   first, then inputs, then sizes. A backward function quotes the forward line it
 *   differentiates and ACCUMULATES (+=) into its gradient outputs; they start at zero.
 *   Shapes: B sentences, S source length, T target length, C = d_model, F = d_ff, NH = h
 *   heads, d_k = d_v = C/NH, V vocabulary, L layers. A linear layer stores W as (out, in),
 *   as PyTorch does, and computes y = x W^T + b (the paper's x W). Masked keys get
 *   probability exactly 0 (the paper's -inf before the softmax). A parallel loop gives each
 *   output element to one thread, summing in a fixed order: the same bits on any thread count.
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
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "transformer.h"
#ifndef _OPENMP   // OpenMP is optional: without -fopenmp the `#pragma omp` lines are ignored
#pragma GCC diagnostic ignored "-Wunknown-pragmas"
#endif

// ######## PART I   THE MODEL ################################################

// The fast path (lab/fast_path.c) plugs in here: the four products (linear_ and attention_
// forward and backward) and §6.1's decoder (decoder_begin, with its key/value cache, then _step,
// _reorder, _end) hand it their call on their first line. Left NULL, the loops you read run.
static FastPath fast_path;

// ==== §3  Linear layers: y = x W^T + b =======================================
// The four projections of multi-head attention (§3.2.2), the two of the FFN (§3.3) and the
// pre-softmax projection (§3.4): nearly all of a training step's arithmetic.

// out is (N, OC), inp is (N, IC), weight is (OC, IC), bias is (OC) or NULL
static void linear_forward(real *out, const real *inp, const real *weight, const real *bias,
                           int N, int IC, int OC) {
    if (fast_path.linear_forward) {
        fast_path.linear_forward(out, inp, weight, bias, N, IC, OC);
        return;
    }
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            // out[n,o] = bias[o] + sum_i inp[n,i] * weight[o,i]
            const real *inp_n = inp + (size_t)n * IC;
            const real *weight_o = weight + (size_t)o * IC;
            real sum = 0;
            #pragma omp simd reduction(+ : sum)   // lanes of partial sums (BUILD, at the top)
            for (int i = 0; i < IC; i++) sum += inp_n[i] * weight_o[i];
            out[(size_t)n * OC + o] = (bias ? bias[o] : 0) + sum;
        }
    }
}

// Differentiates  out[n,o] = bias[o] + sum_i inp[n,i] * weight[o,i]:
//   dinp[n,i]    += sum_o dout[n,o] * weight[o,i]      (dinp = dout W)
//   dweight[o,i] += sum_n dout[n,o] * inp[n,i]         (dW = dout^T inp)
//   dbias[o]     += sum_n dout[n,o]
// dinp or dbias may be NULL when not wanted.
static void linear_backward(real *dinp, real *dweight, real *dbias, const real *dout,
                            const real *inp, const real *weight, int N, int IC, int OC) {
    if (fast_path.linear_backward) {
        fast_path.linear_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC);
        return;
    }
    if (dinp) {
        // row n of dinp: the rows of the weight, each times dout[n,o]
        #pragma omp parallel for
        for (int n = 0; n < N; n++) {
            real *dinp_n = dinp + (size_t)n * IC;
            for (int o = 0; o < OC; o++) {
                real dout_no = dout[(size_t)n * OC + o];
                const real *weight_o = weight + (size_t)o * IC;
                #pragma omp simd   // (dinp_n and weight_o never overlap)
                for (int i = 0; i < IC; i++) dinp_n[i] += dout_no * weight_o[i];
            }
        }
    }

    // row o of dweight: the rows of inp, each times dout[n,o]; dbias[o] their weights' sum
    #pragma omp parallel for
    for (int o = 0; o < OC; o++) {
        real *dweight_o = dweight + (size_t)o * IC;
        for (int n = 0; n < N; n++) {
            real dout_no = dout[(size_t)n * OC + o];
            const real *inp_n = inp + (size_t)n * IC;
            #pragma omp simd
            for (int i = 0; i < IC; i++) dweight_o[i] += dout_no * inp_n[i];
            if (dbias)
                dbias[o] += dout_no;
        }
    }
}

// ==== §3.1  Residual connection, dropout and layer normalisation =============
// "The output of each sub-layer is LayerNorm(x + Sublayer(x))" (§3.1), and "we apply dropout
// to the output of each sub-layer, before it is added to the sub-layer input and normalized"
// (§5.4). So every sub-layer ends with
//     res = x + Dropout(sublayer_out);   out = LayerNorm(res)

// From the machinery at the end of Part I: our own random numbers, and memory
static uint64_t rng_next(Rng *rng);            // xorshift64*
static uint64_t hash64(uint64_t z);            // splitmix64's mixer
static double unit_interval(uint64_t bits);    // [0, 1) from 53 random bits
static void *checked_calloc(size_t count, size_t size, const char *what);   // or exit(1)
static void ensure_buffers(Transformer *model, int B, int S, int T);   // activations for (B,S,T)

// A dropout mask: each element kept with probability 1 - p_drop and scaled by 1/(1 - p_drop)
// ("inverted dropout": evaluation needs no rescaling); all ones with training off or p_drop
// = 0. Element i is decided by hash64(key + i), the key one number from the model's
// generator: drawn in parallel, a seed gives the same masks whatever the thread count.
static void dropout_mask(real *mask, float p_drop, int training, Rng *rng, size_t n) {
    if (!training || p_drop <= 0.0f) {
        for (size_t i = 0; i < n; i++) mask[i] = 1;
        return;
    }
    uint64_t key = rng_next(rng);
    real keep_scale = (real)(1.0 / (1.0 - p_drop));
    double drop = p_drop;
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) mask[i] = unit_interval(hash64(key + i)) < drop ? 0 : keep_scale;
}

// out = inp * mask  (the dropout on embeddings + positional encodings, §5.4)
static void dropout_forward(real *out, const real *inp, const real *mask, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = inp[i] * mask[i];
}

// Differentiates  out[i] = inp[i] * mask[i]
static void dropout_backward(real *dinp, const real *dout, const real *mask, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) dinp[i] += dout[i] * mask[i];
}

// Layer normalisation (Ba, Kiros & Hinton 2016) of one row x of C features:
//     mean = sum_i x_i / C,   var = sum_i (x_i - mean)^2 / C   (biased, as PyTorch)
//     rstd = 1 / sqrt(var + eps),   xhat_i = (x_i - mean) * rstd
//     y_i = gain_i * xhat_i + bias_i
// y, x, gain and bias are (C); *mean and *rstd get the row's two numbers.
static void layernorm_row_forward(real *y, real *mean, real *rstd, const real *x,
                                  const real *gain, const real *bias, int C, float eps) {
    real sum = 0;
    for (int i = 0; i < C; i++) sum += x[i];
    real row_mean = sum / C;

    real squares = 0;
    for (int i = 0; i < C; i++) squares += (x[i] - row_mean) * (x[i] - row_mean);
    real row_rstd = 1 / real_sqrt(squares / C + (real)eps);

    for (int i = 0; i < C; i++) y[i] = (x[i] - row_mean) * row_rstd * gain[i] + bias[i];
    *mean = row_mean;
    *rstd = row_rstd;
}

// "Add & Norm" (Figure 1) with a drawn mask, row by row:
//     norm.res = residual + sublayer * norm.mask;   norm.out = LayerNorm(norm.res)
// residual and sublayer are (N, C), like norm's tensors (its mean and rstd: (N)).
static void residual_layernorm_forward(AddNormActs norm, const real *residual,
                                       const real *sublayer, LayerNormParams ln, int N, int C,
                                       float eps) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        size_t row = (size_t)n * C;
        for (int i = 0; i < C; i++)
            norm.res[row + i] = residual[row + i] + sublayer[row + i] * norm.mask[row + i];
        layernorm_row_forward(norm.out + row, &norm.mean[n], &norm.rstd[n], norm.res + row,
                              ln.gain, ln.bias, C, eps);
    }
}

// Differentiates the two lines above. For the layer norm,
//   out_i = gain_i * xhat_i + bias_i,  xhat_i = (res_i - mean) * rstd:
//   dgain_i += dout_i * xhat_i,   dbias_i += dout_i,   dxhat_i = dout_i * gain_i,
// and mean and rstd depend on every res_j; with d(mean)/d(res_j) = 1/C and
// d(rstd)/d(res_j) = -rstd^3 (res_j - mean) / C, collecting terms gives
//   dres_i = rstd * ( dxhat_i - mean_j(dxhat_j) - xhat_i * mean_j(dxhat_j * xhat_j) )
// Then res = residual + sublayer * mask:
//   dresidual_i += dres_i,   dsublayer_i += dres_i * mask_i
// dout = dL/d(norm.out); dresidual and dsublayer (N, C) accumulate and must not alias dout.
static void residual_layernorm_backward(real *dresidual, real *dsublayer, LayerNormParams dln,
                                        const real *dout, AddNormActs norm, LayerNormParams ln,
                                        int N, int C) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        size_t row = (size_t)n * C;
        real mean_dxhat = 0;
        real mean_dxhat_xhat = 0;
        for (int i = 0; i < C; i++) {
            real dxhat = dout[row + i] * ln.gain[i];
            mean_dxhat += dxhat;
            mean_dxhat_xhat += dxhat * (norm.res[row + i] - norm.mean[n]) * norm.rstd[n];
        }
        mean_dxhat /= C;
        mean_dxhat_xhat /= C;

        for (int i = 0; i < C; i++) {
            real xhat = (norm.res[row + i] - norm.mean[n]) * norm.rstd[n];
            real dxhat = dout[row + i] * ln.gain[i];
            real dres = norm.rstd[n] * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
            dresidual[row + i] += dres;
            dsublayer[row + i] += dres * norm.mask[row + i];
        }
    }

    // gain and bias are shared by all rows: their gradients sum over the rows
    for (int n = 0; n < N; n++) {
        size_t row = (size_t)n * C;
        for (int i = 0; i < C; i++) {
            dln.gain[i] += dout[row + i] * (norm.res[row + i] - norm.mean[n]) * norm.rstd[n];
            dln.bias[i] += dout[row + i];
        }
    }
}

// ==== §3.2.1  Scaled dot-product attention ===================================
//     Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V                 (eq. 1)
// One head at a time. For query i the scores over keys j are
//     s_ij = q_i . k_j / sqrt(d_k),   p_ij = exp(s_ij) / sum_j' exp(s_ij'),
//     out_i = sum_j p_ij v_j
// Why divide by sqrt(d_k)? "We suspect that for large values of d_k, the dot products grow
// large in magnitude, pushing the softmax function into regions where it has extremely small
// gradients." Footnote 4: if the components of q and k are independent with mean 0 and
// variance 1, q . k (a sum of d_k products of variance 1) has variance d_k: scores sqrt(d_k)
// apart (8 for the base model's d_k = 64) put nearly all the probability on one key, where
// the gradient p_j ([j == k] - p_k) is nearly 0. Dividing by sqrt(d_k) brings the variance
// back to 1, whatever the head size.
//
// Masking (§3.2.3): keys j >= key_len[b] are padding and, in the decoder's self-attention,
// keys j > i are "illegal connections" to the future. Both get p_ij = 0, exactly what
// s_ij = -inf before the softmax gives.
//
//   causal mask (decoder self-attention, T = 4, sentence length 3):
//              key  0  1  2  3(pad)
//     query 0       x  .  .  .         x: attended
//     query 1       x  x  .  .         .: probability 0
//     query 2       x  x  x  .
//     query 3(pad)  x  x  x  .         (a padded query's output is never used)
//
// The query of row (b, i) starts at q + (b*Tq + i)*q_stride, its head `head` at column
// head*d_k; keys and values likewise with kv_stride (transformer.h, AttentionShape): Q, K, V
// are read straight out of the fused (B, T, 3C) projection without copying.

// How many keys (the first ones) query i may attend to: key_len, its own sentence's, and
// with the causal mask only positions 0..i.
static int visible_keys(int i, int key_len, int causal) {
    if (causal && i + 1 < key_len)
        return i + 1;
    return key_len;
}

// The scores p[0..visible-1] become their softmax, the masked p[visible..Tk-1] exactly 0.
// With the largest score subtracted first every exp(s_j - largest) is in (0, 1] and the sum
// cannot overflow. A row with no visible key stays 0, not NaN.
static void softmax_visible(real *p, int visible, int Tk) {
    real largest = -INFINITY;
    for (int j = 0; j < visible; j++) largest = p[j] > largest ? p[j] : largest;
    real sum = 0;
    for (int j = 0; j < visible; j++) {
        p[j] = real_exp(p[j] - largest);
        sum += p[j];
    }
    for (int j = 0; j < visible; j++) p[j] /= sum;
    for (int j = visible; j < Tk; j++) p[j] = 0;
}

// Differentiates  p_j = softmax_j(s_j)  over a row of n keys. Its Jacobian is
// dp_j/ds_k = p_j ([j == k] - p_k), so
//     ds_j = sum_k dp_k p_k ([k == j] - p_j) = p_j (dp_j - sum_k p_k dp_k)
// In place: the row grad (n) holds dp and becomes ds. A masked key has p_j = 0 and so gets
// ds_j = 0: the masks need no code here.
static void softmax_backward(real *grad, const real *p, int n) {
    real sum_p_dp = 0;
    for (int j = 0; j < n; j++) sum_p_dp += p[j] * grad[j];
    for (int j = 0; j < n; j++) grad[j] = p[j] * (grad[j] - sum_p_dp);
}

// out is (B, Tq, C), att is (B, NH, Tq, Tk) (the probabilities, kept for the backward
// pass), key_len is (B); causal: the decoder's mask. q, k, v: as `shape` says.
static void attention_forward(real *out, real *att, const real *q, const real *k,
                              const real *v, const int *key_len, int causal,
                              AttentionShape shape) {
    if (fast_path.attention_forward) {
        fast_path.attention_forward(out, att, q, k, v, key_len, causal, shape);
        return;
    }
    int Tq = shape.Tq;
    int Tk = shape.Tk;
    int NH = shape.NH;
    int d_k = shape.C / NH;
    real scale = 1 / real_sqrt((real)d_k);
    // one thread per (b, head, i): it alone writes query i's probabilities and out_i's columns
    #pragma omp parallel for collapse(3)
    for (int b = 0; b < shape.B; b++) {
        for (int head = 0; head < NH; head++) {
            for (int i = 0; i < Tq; i++) {
                int visible = visible_keys(i, key_len[b], causal);   // both masks
                const real *q_i = q + ((size_t)b * Tq + i) * shape.q_stride + head * d_k;
                real *p = att + (((size_t)b * NH + head) * Tq + i) * Tk;

                // s_ij = q_i . k_j / sqrt(d_k)
                for (int j = 0; j < visible; j++) {
                    const real *k_j = k + ((size_t)b * Tk + j) * shape.kv_stride + head * d_k;
                    real dot = 0;
                    #pragma omp simd reduction(+ : dot)
                    for (int d = 0; d < d_k; d++) dot += q_i[d] * k_j[d];
                    p[j] = dot * scale;
                }

                // p_ij = softmax_j(s_ij), and 0 for the masked keys
                softmax_visible(p, visible, Tk);

                // out_i = sum_j p_ij v_j
                real *out_i = out + ((size_t)b * Tq + i) * shape.C + head * d_k;
                for (int d = 0; d < d_k; d++) out_i[d] = 0;
                for (int j = 0; j < visible; j++) {
                    const real *v_j = v + ((size_t)b * Tk + j) * shape.kv_stride + head * d_k;
                    for (int d = 0; d < d_k; d++) out_i[d] += p[j] * v_j[d];
                }
            }
        }
    }
}

// Differentiates, for each head and query i:
//   out_i = sum_j p_ij v_j         =>  dp_ij = dout_i . v_j,   dv_j += p_ij dout_i
//   p_ij  = softmax_j(s_ij)        =>  ds_ij = p_ij (dp_ij - sum_j' p_ij' dp_ij')
//   s_ij  = q_i . k_j / sqrt(d_k)  =>  dq_i += ds_ij k_j / sqrt(d_k),
//                                      dk_j += ds_ij q_i / sqrt(d_k)
// dq, dk, dv have the strides of q, k, v. A masked key has p_ij = 0, so ds_ij = 0 and it gets
// exactly zero gradient: the masks are in the saved probabilities.
static void attention_backward(real *dq, real *dk, real *dv, const real *dout,
                               const real *att, const real *q, const real *k, const real *v,
                               AttentionShape shape) {
    if (fast_path.attention_backward) {
        fast_path.attention_backward(dq, dk, dv, dout, att, q, k, v, shape);
        return;
    }
    int Tq = shape.Tq;
    int Tk = shape.Tk;
    int NH = shape.NH;
    int d_k = shape.C / NH;
    real scale = 1 / real_sqrt((real)d_k);
    // one thread per (b, head): it alone writes that head's columns of dq, dk, dv
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < shape.B; b++) {
        for (int head = 0; head < NH; head++) {
            for (int i = 0; i < Tq; i++) {
                const real *p = att + (((size_t)b * NH + head) * Tq + i) * Tk;
                const real *q_i = q + ((size_t)b * Tq + i) * shape.q_stride + head * d_k;
                const real *dout_i = dout + ((size_t)b * Tq + i) * shape.C + head * d_k;
                real *dq_i = dq + ((size_t)b * Tq + i) * shape.q_stride + head * d_k;
                real ds[Tk];   // dp_ij for this query, then ds_ij

                // dp_ij = dout_i . v_j,  dv_j += p_ij dout_i
                for (int j = 0; j < Tk; j++) {
                    size_t key_row = ((size_t)b * Tk + j) * shape.kv_stride + head * d_k;
                    const real *v_j = v + key_row;
                    real *dv_j = dv + key_row;
                    real dot = 0;
                    #pragma omp simd reduction(+ : dot)
                    for (int d = 0; d < d_k; d++) {
                        dot += dout_i[d] * v_j[d];
                        dv_j[d] += p[j] * dout_i[d];
                    }
                    ds[j] = dot;
                }

                // ds_ij = p_ij (dp_ij - sum_j' p_ij' dp_ij')
                softmax_backward(ds, p, Tk);

                // dq_i += ds_ij k_j / sqrt(d_k),  dk_j += ds_ij q_i / sqrt(d_k)
                for (int j = 0; j < Tk; j++) {
                    size_t key_row = ((size_t)b * Tk + j) * shape.kv_stride + head * d_k;
                    const real *k_j = k + key_row;
                    real *dk_j = dk + key_row;
                    for (int d = 0; d < d_k; d++) {
                        dq_i[d] += ds[j] * scale * k_j[d];
                        dk_j[d] += ds[j] * scale * q_i[d];
                    }
                }
            }
        }
    }
}

// ==== §3.2.2  Multi-head attention ===========================================
//     MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O
//     head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
// Why several heads of d_k = d_model / h each, rather than one of d_model? "Multi-head
// attention allows the model to jointly attend to information from different representation
// subspaces at different positions. With a single attention head, averaging inhibits this."
// One head's output is one weighted average of the values; h heads, each in its own
// d_k-wide subspace, can each weigh another position, at the cost of one full-width head
// (Figures 3-5: heads following a long-distance dependency, resolving an anaphora). Table 3
// (A): one head is 0.9 BLEU worse than the best.
//
// W_i^Q for all heads is one (C, C) matrix whose output columns i*d_k .. (i+1)*d_k-1 belong
// to head_i; likewise W^K, W^V. The three are stacked as the rows of one (3C, C) weight
// (PyTorch's in_proj_weight): qkv[b,t] = [q | k | v], and head_i reads columns i*d_k ..
// (i+1)*d_k-1 of each. The "split into heads" is only indexing, and Concat the same
// indexing read back.
//
//   self-attention (encoder; decoder with the causal mask):
//     x (N,C) --W_qkv--> qkv (N,3C) --attention per head--> heads (N,C) --W^O--> out (N,C)
//   encoder-decoder attention (§3.2.3, "queries come from the previous decoder layer, and
//   the memory keys and values come from the output of the encoder"):
//     x (B*T,C)      --rows 0..C-1 of W_qkv-->   q  (B*T,C)
//     memory (B*S,C) --rows C..3C-1 of W_qkv--> kv (B*S,2C)
// A sub-layer takes its activations and weights as the views of transformer.h
// (AttentionActs, AttentionParams) and the model's sizes from its config.

// acts.qkv (B,T,3C), acts.att (B,NH,T,T), acts.heads and acts.out (B,T,C) from x (B,T,C)
static void self_attention_forward(AttentionActs acts, const real *x, AttentionParams weights,
                                   const int *key_len, int causal, int B, int T,
                                   const TransformerConfig *config) {
    int C = config->d_model;
    AttentionShape shape = { B, T, T, C, config->n_heads, 3 * C, 3 * C };
    // [q | k | v] = x [W^Q | W^K | W^V] + b
    linear_forward(acts.qkv, x, weights.qkv_w, weights.qkv_b, B * T, C, 3 * C);
    // head_i = Attention(q, k, v) on head i's columns, side by side: Concat(head_1..head_h)
    attention_forward(acts.heads, acts.att, acts.qkv, acts.qkv + C, acts.qkv + 2 * C, key_len,
                      causal, shape);
    // out = Concat(...) W^O + b^O
    linear_forward(acts.out, acts.heads, weights.out_w, weights.out_b, B * T, C, C);
}

// Given d.out = dL/d(acts.out): d.heads and d.qkv get theirs, dx (B,T,C) and grads accumulate.
static void self_attention_backward(real *dx, AttentionActs d, AttentionParams grads,
                                    AttentionActs acts, const real *x, AttentionParams weights,
                                    int B, int T, const TransformerConfig *config) {
    int C = config->d_model;
    AttentionShape shape = { B, T, T, C, config->n_heads, 3 * C, 3 * C };
    // out = heads W^O^T + b^O
    linear_backward(d.heads, grads.out_w, grads.out_b, d.out, acts.heads, weights.out_w, B * T,
                    C, C);
    // heads = Attention(q, k, v)
    attention_backward(d.qkv, d.qkv + C, d.qkv + 2 * C, d.heads, acts.att, acts.qkv,
                       acts.qkv + C, acts.qkv + 2 * C, shape);
    // qkv = x W_qkv^T + b_qkv
    linear_backward(dx, grads.qkv_w, grads.qkv_b, d.qkv, x, weights.qkv_w, B * T, C, 3 * C);
}

// The encoder-decoder attention's keys and values: kv (B,S,2C) = memory W_kv^T + b_kv, with
// W_kv rows C..3C-1 of the stacked weight
static void memory_keys_values(real *kv, const real *memory, AttentionParams weights, int B,
                               int S, int C) {
    linear_forward(kv, memory, weights.qkv_w + (size_t)C * C, weights.qkv_b + C, B * S, C,
                   2 * C);
}

// Differentiates  kv = memory W_kv^T + b_kv: dmemory (B,S,C) and grads accumulate.
static void memory_keys_values_backward(real *dmemory, AttentionParams grads, const real *dkv,
                                        const real *memory, AttentionParams weights, int B,
                                        int S, int C) {
    linear_backward(dmemory, grads.qkv_w + (size_t)C * C, grads.qkv_b + C, dkv, memory,
                    weights.qkv_w + (size_t)C * C, B * S, C, 2 * C);
}

// acts.q (B,T,C), acts.att (B,NH,T,S), acts.heads and acts.out (B,T,C) from x (B,T,C),
// against the keys and values acts.kv (B,S,2C) that memory_keys_values made
static void cross_attention_forward(AttentionActs acts, const real *x, AttentionParams weights,
                                    const int *src_len, int B, int T, int S,
                                    const TransformerConfig *config) {
    int C = config->d_model;
    AttentionShape shape = { B, T, S, C, config->n_heads, C, 2 * C };
    // q = x W^Q + b^Q, with W^Q rows 0..C-1 of the stacked weight
    linear_forward(acts.q, x, weights.qkv_w, weights.qkv_b, B * T, C, C);
    // heads = Attention(q, k, v), the keys and values from the encoder's output
    attention_forward(acts.heads, acts.att, acts.q, acts.kv, acts.kv + C, src_len, 0, shape);
    // out = Concat(...) W^O + b^O
    linear_forward(acts.out, acts.heads, weights.out_w, weights.out_b, B * T, C, C);
}

// Given d.out = dL/d(acts.out): d.heads, d.q and d.kv get theirs, dx (B,T,C) and grads
// accumulate (memory_keys_values_backward takes d.kv on to the memory).
static void cross_attention_backward(real *dx, AttentionActs d, AttentionParams grads,
                                     AttentionActs acts, const real *x, AttentionParams weights,
                                     const Batch *batch, const TransformerConfig *config) {
    int B = batch->B;
    int T = batch->T;
    int C = config->d_model;
    AttentionShape shape = { B, T, batch->S, C, config->n_heads, C, 2 * C };
    // out = heads W^O^T + b^O
    linear_backward(d.heads, grads.out_w, grads.out_b, d.out, acts.heads, weights.out_w, B * T,
                    C, C);
    // heads = Attention(q, k, v)
    attention_backward(d.q, d.kv, d.kv + C, d.heads, acts.att, acts.q, acts.kv, acts.kv + C,
                       shape);
    // q = x W_q^T + b_q
    linear_backward(dx, grads.qkv_w, grads.qkv_b, d.q, x, weights.qkv_w, B * T, C, C);
}

// ==== §3.3  Position-wise feed-forward networks ==============================
//     FFN(x) = max(0, x W_1 + b_1) W_2 + b_2                            (eq. 2)
// "applied to each position separately and identically": one linear layer over all B*T
// rows at once.

// hidden = max(0, hidden) in place
static void relu_forward(real *hidden, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) hidden[i] = hidden[i] > 0 ? hidden[i] : 0;
}

// Differentiates  hidden = max(0, a): da = dhidden where hidden > 0 (the same as a > 0),
// else 0. In place: dhidden becomes da.
static void relu_backward(real *dhidden, const real *hidden, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) dhidden[i] = hidden[i] > 0 ? dhidden[i] : 0;
}

// acts.hidden (N,F) = max(0, x W_1^T + b_1) and acts.out (N,C) = hidden W_2^T + b_2
static void feed_forward_forward(FeedForwardActs acts, const real *x, FeedForwardParams weights,
                                 int N, const TransformerConfig *config) {
    int C = config->d_model;
    int F = config->d_ff;
    linear_forward(acts.hidden, x, weights.w1, weights.b1, N, C, F);
    relu_forward(acts.hidden, (size_t)N * F);
    linear_forward(acts.out, acts.hidden, weights.w2, weights.b2, N, F, C);
}

// Given d.out = dL/d(acts.out): d.hidden gets dL/d(hidden), which relu_backward turns in
// place into dL/d(x W_1^T + b_1); dx (N,C) and grads accumulate.
static void feed_forward_backward(real *dx, FeedForwardActs d, FeedForwardParams grads,
                                  FeedForwardActs acts, const real *x, FeedForwardParams weights,
                                  int N, const TransformerConfig *config) {
    int C = config->d_model;
    int F = config->d_ff;
    // out = hidden W_2^T + b_2
    linear_backward(d.hidden, grads.w2, grads.b2, d.out, acts.hidden, weights.w2, N, F, C);
    // hidden = max(0, a)
    relu_backward(d.hidden, acts.hidden, (size_t)N * F);
    // a = x W_1^T + b_1
    linear_backward(dx, grads.w1, grads.b1, d.hidden, x, weights.w1, N, C, F);
}

// ==== §3.4  Embeddings and softmax ===========================================
// "we share the same weight matrix between the two embedding layers and the pre-softmax
// linear transformation ... In the embedding layers, we multiply those weights by
// sqrt(d_model)." One (V, C) matrix E serves three times:
//     source:  x = E[token] * sqrt(C) + PE[pos]
//     target:  y = E[token] * sqrt(C) + PE[pos]
//     output:  logits = decoder_output E^T,  then softmax (§5.4's loss, below)

// out is (B,T,C), tokens (B,T), embedding (V,C), pe (max_len, C)
static void embedding_forward(real *out, const int *tokens, const real *embedding,
                              const real *pe, int B, int T, int C) {
    real sqrt_d_model = real_sqrt((real)C);
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const real *row = embedding + (size_t)tokens[b * T + t] * C;
            real *out_bt = out + ((size_t)b * T + t) * C;
            for (int i = 0; i < C; i++) out_bt[i] = row[i] * sqrt_d_model + pe[(size_t)t * C + i];
        }
    }
}

// Differentiates  out[b,t,i] = embedding[tokens[b,t], i] * sqrt(C) + pe[t,i]. Two positions
// of the same token add into the same row: one thread, positions in order.
static void embedding_backward(real *dembedding, const real *dout, const int *tokens, int B,
                               int T, int C) {
    real sqrt_d_model = real_sqrt((real)C);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            real *drow = dembedding + (size_t)tokens[b * T + t] * C;
            const real *dout_bt = dout + ((size_t)b * T + t) * C;
            for (int i = 0; i < C; i++) drow[i] += dout_bt[i] * sqrt_d_model;
        }
    }
}

// ==== §3.5  Positional encoding ==============================================
//     PE(pos, 2i)   = sin(pos / 10000^(2i/d_model))
//     PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))
// Interleaved as in the paper (tensor2tensor concatenates sines, then cosines). Computed once,
// in double; no parameters, so no backward.
//
// Why sinusoids? "We chose this function because we hypothesized it would allow the model to
// easily learn to attend by relative positions, since for any fixed offset k, PE(pos+k) can
// be represented as a linear function of PE(pos)." Each pair of dimensions (2i, 2i+1) turns
// at one frequency w_i = 1 / 10000^(2i/d_model), and k positions on is a rotation by w_i k:
//     sin(w (pos+k)) =  cos(wk) sin(w pos) + sin(wk) cos(w pos)
//     cos(w (pos+k)) = -sin(wk) sin(w pos) + cos(wk) cos(w pos)
// So PE(pos+k) = M_k PE(pos), M_k made of these 2x2 rotations: one matrix for "k words later"
// at every position, which W^Q or W^K can learn. Wavelengths from 2 pi to 10000 * 2 pi: some
// pairs tell near positions apart, others far ones.
//
// "We also experimented with using learned positional embeddings instead, and found that the
// two versions produced nearly identical results" (Table 3, row E). With config.positional =
// POSITIONAL_LEARNED the table is a parameter, params.position_embedding (max_len, C), one
// for source and target as the sinusoids, added unscaled in PE's place (its gradient: below).

// pe is (max_len, C)
static void positional_encoding_init(real *pe, int max_len, int C) {
    for (int pos = 0; pos < max_len; pos++) {
        for (int i = 0; 2 * i < C; i++) {
            double angle = pos / pow(10000.0, (2.0 * i) / C);
            pe[(size_t)pos * C + 2 * i] = (real)sin(angle);
            if (2 * i + 1 < C)
                pe[(size_t)pos * C + 2 * i + 1] = (real)cos(angle);
        }
    }
}

// Differentiates  out[b,t,i] = embedding[tokens[b,t], i] * sqrt(C) + pe[t,i]  for the learned
// table pe (max_len, C): row t gets every sentence's position t of dout (B,T,C).
static void position_embedding_backward(real *dpe, const real *dout, int B, int T, int C) {
    for (int t = 0; t < T; t++) {
        for (int b = 0; b < B; b++) {
            const real *dout_bt = dout + ((size_t)b * T + t) * C;
            for (int i = 0; i < C; i++) dpe[(size_t)t * C + i] += dout_bt[i];
        }
    }
}

// ==== §5.4  Label smoothing, and the loss ====================================
// "During training, we employed label smoothing of value eps_ls = 0.1." The target
// distribution at each position is, as in PyTorch's cross_entropy,
//     q_v = (1 - eps_ls) [v == y] + eps_ls / V
// and the loss is the cross-entropy -sum_v q_v log p_v with p = softmax(logits), averaged
// over the non-padding target positions. "This hurts perplexity, as the model learns to be
// more unsure, but improves accuracy and BLEU score."

// token_loss is (B,T), probs and logits (B,T,V); the targets are the batch's tgt_out (B,T),
// its lengths tgt_len (B). Returns the mean loss; *num_tokens gets the number of non-padding
// positions.
static double cross_entropy_forward(real *token_loss, real *probs, const real *logits,
                                    const Batch *batch, float label_smoothing, int V,
                                    int *num_tokens) {
    int T = batch->T;
    int positions = batch->B * T;
    real eps_ls = (real)label_smoothing;
    #pragma omp parallel for
    for (int bt = 0; bt < positions; bt++) {
        const real *z = logits + (size_t)bt * V;
        real *p = probs + (size_t)bt * V;
        if (bt % T >= batch->tgt_len[bt / T]) {   // padding: no loss, no probabilities
            token_loss[bt] = 0;
            for (int token = 0; token < V; token++) p[token] = 0;
            continue;
        }

        // log p_v = z_v - logsumexp(z), computed around the largest logit
        real max_z = -INFINITY;
        for (int token = 0; token < V; token++) max_z = z[token] > max_z ? z[token] : max_z;
        real sum = 0;
        real sum_z = 0;
        for (int token = 0; token < V; token++) {
            p[token] = real_exp(z[token] - max_z);
            sum += p[token];
            sum_z += z[token];
        }
        real log_sum = max_z + real_log(sum);
        real inv_sum = 1 / sum;
        for (int token = 0; token < V; token++) p[token] *= inv_sum;

        // -sum_v q_v log p_v = -(1-eps_ls) log p_y - (eps_ls/V) sum_v log p_v
        real log_p_target = z[batch->tgt_out[bt]] - log_sum;
        real sum_log_p = sum_z - V * log_sum;
        token_loss[bt] = -(1 - eps_ls) * log_p_target - eps_ls / V * sum_log_p;
    }

    double total = 0;
    int count = 0;
    for (int bt = 0; bt < positions; bt++) {
        if (bt % T < batch->tgt_len[bt / T]) {
            total += token_loss[bt];
            count++;
        }
    }
    *num_tokens = count;
    return count ? total / count : 0.0;
}

// Differentiates  loss = (1/n) sum_positions -sum_v q_v log softmax(z)_v: for a softmax
// followed by cross-entropy against a distribution q that sums to one, dloss/dz_v = p_v -
// q_v, here divided by the n non-padding positions.
static void cross_entropy_backward(real *dlogits, const real *probs, const Batch *batch,
                                   float label_smoothing, int num_tokens, int V) {
    int T = batch->T;
    int positions = batch->B * T;
    real eps_ls = (real)label_smoothing;
    real inv_n = (real)(1.0 / num_tokens);
    #pragma omp parallel for
    for (int bt = 0; bt < positions; bt++) {
        if (bt % T >= batch->tgt_len[bt / T])
            continue;
        const real *p = probs + (size_t)bt * V;
        real *dz = dlogits + (size_t)bt * V;
        for (int token = 0; token < V; token++) {
            real q_v = eps_ls / V + (token == batch->tgt_out[bt] ? 1 - eps_ls : 0);
            dz[token] += (p[token] - q_v) * inv_n;
        }
    }
}

// ==== §3.1  Encoder and decoder stacks =======================================
// "The encoder is composed of a stack of N identical layers. Each layer has two sub-layers
// ... multi-head self-attention ... and a simple, position-wise fully connected feed-forward
// network." The decoder "inserts a third sub-layer, which performs multi-head attention over
// the output of the encoder stack", and masks its self-attention. Post-norm, as published:
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
// No layer norm follows the last layer of either stack in the published model. A layer
// takes its parameters as views of the model's tensors (transformer.h: EncoderLayerParams,
// ...), each tensor holding all N layers; its activations, and their gradients, are the
// model's acts.enc[l] and grads_acts.enc[l] (or dec[l]).

static AttentionParams attention_params(real *qkv_w, real *qkv_b, real *out_w, real *out_b,
                                        size_t l, size_t C) {
    AttentionParams view = {
        .qkv_w = qkv_w + l * 3 * C * C,
        .qkv_b = qkv_b + l * 3 * C,
        .out_w = out_w + l * C * C,
        .out_b = out_b + l * C,
    };
    return view;
}

static FeedForwardParams feed_forward_params(real *w1, real *b1, real *w2, real *b2, size_t l,
                                             size_t C, size_t F) {
    FeedForwardParams view = { w1 + l * F * C, b1 + l * F, w2 + l * C * F, b2 + l * C };
    return view;
}

static LayerNormParams layer_norm_params(real *gain, real *bias, size_t l, size_t C) {
    LayerNormParams view = { gain + l * C, bias + l * C };
    return view;
}

// Layer l's view into a ParameterTensors (the parameters, or their gradients).
static EncoderLayerParams encoder_layer_params(ParameterTensors *of,
                                               const TransformerConfig *config, int l) {
    size_t C = config->d_model;
    size_t F = config->d_ff;
    EncoderLayerParams view = {
        .self_attn = attention_params(of->enc_qkv_w, of->enc_qkv_b, of->enc_out_w,
                                      of->enc_out_b, l, C),
        .ln1 = layer_norm_params(of->enc_ln1_g, of->enc_ln1_b, l, C),
        .ffn = feed_forward_params(of->enc_ff1_w, of->enc_ff1_b, of->enc_ff2_w, of->enc_ff2_b,
                                   l, C, F),
        .ln2 = layer_norm_params(of->enc_ln2_g, of->enc_ln2_b, l, C),
    };
    return view;
}

static DecoderLayerParams decoder_layer_params(ParameterTensors *of,
                                               const TransformerConfig *config, int l) {
    size_t C = config->d_model;
    size_t F = config->d_ff;
    DecoderLayerParams view = {
        .self_attn = attention_params(of->dec_self_qkv_w, of->dec_self_qkv_b,
                                      of->dec_self_out_w, of->dec_self_out_b, l, C),
        .ln1 = layer_norm_params(of->dec_ln1_g, of->dec_ln1_b, l, C),
        .cross_attn = attention_params(of->dec_cross_qkv_w, of->dec_cross_qkv_b,
                                       of->dec_cross_out_w, of->dec_cross_out_b, l, C),
        .ln2 = layer_norm_params(of->dec_ln2_g, of->dec_ln2_b, l, C),
        .ffn = feed_forward_params(of->dec_ff1_w, of->dec_ff1_b, of->dec_ff2_w, of->dec_ff2_b,
                                   l, C, F),
        .ln3 = layer_norm_params(of->dec_ln3_g, of->dec_ln3_b, l, C),
    };
    return view;
}

// A layer's input: the embedded sentence for layer 0, else the output of the layer below.
// The same in the activations and in their gradients (`of` is either).
static real *encoder_layer_input(const ActivationTensors *of, int l) {
    return l == 0 ? of->enc_x0 : of->enc[l - 1].norm2.out;
}

static real *decoder_layer_input(const ActivationTensors *of, int l) {
    return l == 0 ? of->dec_x0 : of->dec[l - 1].norm3.out;
}

// The encoder's output, the memory every decoder layer attends to; and the decoder's output.
static real *encoder_output(const Transformer *model, const ActivationTensors *of) {
    return of->enc[model->config.n_layers - 1].norm2.out;
}

static real *decoder_output(const Transformer *model, const ActivationTensors *of) {
    return of->dec[model->config.n_layers - 1].norm3.out;
}

// x[0..n) = 0: in IEEE 754 every bit of 0.0 is zero
static void zero(real *x, size_t n) {
    memset(x, 0, n * sizeof(real));
}

// "Add & Norm" (Figure 1), the end of every sub-layer: norm.res = x + Dropout(sublayer),
// norm.out = LayerNorm(norm.res), for N rows. The mask drawn here is kept in norm.mask for
// residual_layernorm_backward.
static void add_norm_forward(AddNormActs norm, const real *x, const real *sublayer,
                             LayerNormParams ln, Transformer *model, int N) {
    const TransformerConfig *config = &model->config;
    size_t n = (size_t)N * config->d_model;
    dropout_mask(norm.mask, config->dropout, model->training, &model->dropout_rng, n);
    residual_layernorm_forward(norm, x, sublayer, ln, N, config->d_model,
                               config->layer_norm_eps);
}

// Encoder layer l for the batch's sources: from its input to acts.enc[l].norm2.out.
static void encoder_layer_forward(Transformer *model, int l, const Batch *batch) {
    const TransformerConfig *config = &model->config;
    EncoderLayerActs acts = model->acts.enc[l];
    EncoderLayerParams weights = encoder_layer_params(&model->params, config, l);
    const real *x = encoder_layer_input(&model->acts, l);
    int N = batch->B * batch->S;

    // sub-layer 1: norm1.out = LayerNorm(x + Dropout(SelfAttention(x)))
    self_attention_forward(acts.self_attn, x, weights.self_attn, batch->src_len, 0, batch->B,
                           batch->S, config);
    add_norm_forward(acts.norm1, x, acts.self_attn.out, weights.ln1, model, N);

    // sub-layer 2: norm2.out = LayerNorm(norm1.out + Dropout(FFN(norm1.out)))
    feed_forward_forward(acts.ffn, acts.norm1.out, weights.ffn, N, config);
    add_norm_forward(acts.norm2, acts.norm1.out, acts.ffn.out, weights.ln2, model, N);
}

// Encoder layer l backwards: from grads_acts.enc[l].norm2.out, dL/d(its output), to the
// gradient of its input and of its parameters (all accumulate).
static void encoder_layer_backward(Transformer *model, int l, const Batch *batch) {
    const TransformerConfig *config = &model->config;
    EncoderLayerActs acts = model->acts.enc[l];
    EncoderLayerActs d = model->grads_acts.enc[l];
    EncoderLayerParams weights = encoder_layer_params(&model->params, config, l);
    EncoderLayerParams grads = encoder_layer_params(&model->grads, config, l);
    const real *x = encoder_layer_input(&model->acts, l);
    real *dx = encoder_layer_input(&model->grads_acts, l);
    int C = config->d_model;
    int N = batch->B * batch->S;

    // the gradients this layer adds into start at zero: its sub-layers' and its input's (its
    // output's, d.norm2.out, is complete: the layer above, or every decoder layer, made it)
    size_t n = (size_t)N * C;
    zero(dx, n);
    zero(d.self_attn.qkv, 3 * n);
    zero(d.self_attn.heads, n);
    zero(d.self_attn.out, n);
    zero(d.norm1.out, n);
    zero(d.ffn.hidden, (size_t)N * config->d_ff);
    zero(d.ffn.out, n);

    // sub-layer 2: norm2.out = LayerNorm(norm1.out + Dropout(ffn.out)), ffn.out = FFN(norm1.out)
    residual_layernorm_backward(d.norm1.out, d.ffn.out, grads.ln2, d.norm2.out, acts.norm2,
                                weights.ln2, N, C);
    feed_forward_backward(d.norm1.out, d.ffn, grads.ffn, acts.ffn, acts.norm1.out, weights.ffn,
                          N, config);

    // sub-layer 1: norm1.out = LayerNorm(x + Dropout(self_attn.out)), self_attn = SelfAttention(x)
    residual_layernorm_backward(dx, d.self_attn.out, grads.ln1, d.norm1.out, acts.norm1,
                                weights.ln1, N, C);
    self_attention_backward(dx, d.self_attn, grads.self_attn, acts.self_attn, x,
                            weights.self_attn, batch->B, batch->S, config);
}

// Decoder layer l for the batch's targets: from its input and the memory (the encoder's
// output) to acts.dec[l].norm3.out.
static void decoder_layer_forward(Transformer *model, int l, const Batch *batch) {
    const TransformerConfig *config = &model->config;
    DecoderLayerActs acts = model->acts.dec[l];
    DecoderLayerParams weights = decoder_layer_params(&model->params, config, l);
    const real *y = decoder_layer_input(&model->acts, l);
    const real *memory = encoder_output(model, &model->acts);
    int B = batch->B;
    int S = batch->S;
    int T = batch->T;
    int N = B * T;

    // sub-layer 1: norm1.out = LayerNorm(y + Dropout(MaskedSelfAttention(y)))
    self_attention_forward(acts.self_attn, y, weights.self_attn, batch->tgt_len, 1, B, T, config);
    add_norm_forward(acts.norm1, y, acts.self_attn.out, weights.ln1, model, N);

    // sub-layer 2: norm2.out = LayerNorm(norm1.out + Dropout(Attention(norm1.out, memory)))
    memory_keys_values(acts.cross_attn.kv, memory, weights.cross_attn, B, S, config->d_model);
    cross_attention_forward(acts.cross_attn, acts.norm1.out, weights.cross_attn, batch->src_len,
                            B, T, S, config);
    add_norm_forward(acts.norm2, acts.norm1.out, acts.cross_attn.out, weights.ln2, model, N);

    // sub-layer 3: norm3.out = LayerNorm(norm2.out + Dropout(FFN(norm2.out)))
    feed_forward_forward(acts.ffn, acts.norm2.out, weights.ffn, N, config);
    add_norm_forward(acts.norm3, acts.norm2.out, acts.ffn.out, weights.ln3, model, N);
}

// Decoder layer l backwards: from grads_acts.dec[l].norm3.out to the gradients of its input,
// of the memory and of its parameters (all accumulate).
static void decoder_layer_backward(Transformer *model, int l, const Batch *batch) {
    const TransformerConfig *config = &model->config;
    DecoderLayerActs acts = model->acts.dec[l];
    DecoderLayerActs d = model->grads_acts.dec[l];
    DecoderLayerParams weights = decoder_layer_params(&model->params, config, l);
    DecoderLayerParams grads = decoder_layer_params(&model->grads, config, l);
    const real *y = decoder_layer_input(&model->acts, l);
    real *dy = decoder_layer_input(&model->grads_acts, l);
    const real *memory = encoder_output(model, &model->acts);
    real *dmemory = encoder_output(model, &model->grads_acts);
    int C = config->d_model;
    int N = batch->B * batch->T;

    // the gradients this layer adds into start at zero: its sub-layers' and its input's (its
    // output's, d.norm3.out, is complete; the memory's, transformer_backward zeroed)
    size_t n = (size_t)N * C;
    zero(dy, n);
    zero(d.self_attn.qkv, 3 * n);
    zero(d.self_attn.heads, n);
    zero(d.self_attn.out, n);
    zero(d.norm1.out, n);
    zero(d.cross_attn.q, n);
    zero(d.cross_attn.kv, (size_t)batch->B * batch->S * 2 * C);
    zero(d.cross_attn.heads, n);
    zero(d.cross_attn.out, n);
    zero(d.norm2.out, n);
    zero(d.ffn.hidden, (size_t)N * config->d_ff);
    zero(d.ffn.out, n);

    // sub-layer 3: norm3.out = LayerNorm(norm2.out + Dropout(ffn.out)), ffn.out = FFN(norm2.out)
    residual_layernorm_backward(d.norm2.out, d.ffn.out, grads.ln3, d.norm3.out, acts.norm3,
                                weights.ln3, N, C);
    feed_forward_backward(d.norm2.out, d.ffn, grads.ffn, acts.ffn, acts.norm2.out, weights.ffn,
                          N, config);

    // sub-layer 2: norm2.out = LayerNorm(norm1.out + Dropout(cross_attn.out)),
    // cross_attn.out = Attention(norm1.out, memory)
    residual_layernorm_backward(d.norm1.out, d.cross_attn.out, grads.ln2, d.norm2.out,
                                acts.norm2, weights.ln2, N, C);
    cross_attention_backward(d.norm1.out, d.cross_attn, grads.cross_attn, acts.cross_attn,
                             acts.norm1.out, weights.cross_attn, batch, config);
    memory_keys_values_backward(dmemory, grads.cross_attn, d.cross_attn.kv, memory,
                                weights.cross_attn, batch->B, batch->S, C);

    // sub-layer 1: norm1.out = LayerNorm(y + Dropout(self_attn.out)),
    // self_attn.out = MaskedSelfAttention(y)
    residual_layernorm_backward(dy, d.self_attn.out, grads.ln1, d.norm1.out, acts.norm1,
                                weights.ln1, N, C);
    self_attention_backward(dy, d.self_attn, grads.self_attn, acts.self_attn, y,
                            weights.self_attn, batch->B, batch->T, config);
}

// ==== The whole model (Figure 1) =============================================
// The encoder stack, the decoder stack and the output projection, then the loss; and the
// backward pass, the same path in reverse.

// §3.4, §3.5, then §5.4's dropout on the sum: x0 = Dropout(E[tokens] sqrt(C) + PE), with
// embedded (B,T,C) and its mask kept. tokens are (B,T): the sources, or the targets' inputs.
static void embed_forward(real *x0, real *embedded, real *mask, const int *tokens,
                          Transformer *model, int B, int T) {
    const TransformerConfig *config = &model->config;
    size_t n = (size_t)B * T * config->d_model;
    embedding_forward(embedded, tokens, model->params.embedding, model->positional_encoding, B,
                      T, config->d_model);
    dropout_mask(mask, config->dropout, model->training, &model->dropout_rng, n);
    dropout_forward(x0, embedded, mask, n);
}

// Differentiates embed_forward: dx0 = dL/d(x0) (B,T,C) to the embedding's gradient (and the
// learned positions'), through dembedded = dL/d(embedded) (B,T,C); tokens are (B,T).
static void embed_backward(Transformer *model, real *dembedded, const real *dx0,
                           const real *mask, const int *tokens, int B, int T) {
    int C = model->config.d_model;
    // x0 = embedded * mask
    dropout_backward(dembedded, dx0, mask, (size_t)B * T * C);
    // embedded = E[tokens] sqrt(C) + PE
    embedding_backward(model->grads.embedding, dembedded, tokens, B, T, C);
    if (model->config.positional == POSITIONAL_LEARNED)
        position_embedding_backward(model->grads.position_embedding, dembedded, B, T, C);
}

static char error_context[40] = "";   // "train: ": errors name the command (a library: "")

// The whole forward pass; returns the label-smoothed loss (§5.4). A batch that fails
// batch_check stops the program with a message rather than read outside the embedding.
real transformer_forward(Transformer *model, const Batch *batch) {
    const TransformerConfig *config = &model->config;
    ActivationTensors *acts = &model->acts;
    const char *error = batch_check(batch, config);
    if (error) {
        fprintf(stderr, "error: %stransformer_forward: %s\n", error_context, error);
        exit(1);
    }
    ensure_buffers(model, batch->B, batch->S, batch->T);
    model->B = batch->B;
    model->S = batch->S;
    model->T = batch->T;

    // the encoder stack: memory = Encoder(source)
    embed_forward(acts->enc_x0, acts->enc_embedded, acts->enc_emb_mask, batch->src, model,
                  batch->B, batch->S);
    for (int l = 0; l < config->n_layers; l++) encoder_layer_forward(model, l, batch);

    // the decoder stack, reading the memory in every layer
    embed_forward(acts->dec_x0, acts->dec_embedded, acts->dec_emb_mask, batch->tgt_in, model,
                  batch->B, batch->T);
    for (int l = 0; l < config->n_layers; l++) decoder_layer_forward(model, l, batch);

    // §3.4: the pre-softmax linear transformation shares the embedding matrix
    linear_forward(acts->logits, decoder_output(model, acts), model->params.embedding, NULL,
                   batch->B * batch->T, config->d_model, config->vocab_size);

    // §5.4: the label-smoothed cross-entropy
    double loss = cross_entropy_forward(acts->token_loss, acts->probs, acts->logits, batch,
                                        config->label_smoothing, config->vocab_size,
                                        &model->num_target_tokens);
    model->loss = (real)loss;
    return model->loss;
}

void transformer_zero_grad(Transformer *model) {
    zero(model->grads_memory, model->num_parameters);
}

// The whole backward pass, for the batch of the last transformer_forward: accumulates
// dloss/dparameter into model->grads. The activations' gradients start at zero each time:
// each is zeroed once, before the first call that adds into it (the layers zero their own).
void transformer_backward(Transformer *model, const Batch *batch) {
    const TransformerConfig *config = &model->config;
    ActivationTensors *acts = &model->acts;
    ActivationTensors *d = &model->grads_acts;
    int B = batch->B;
    int T = batch->T;
    size_t target_numbers = (size_t)B * T * config->d_model;
    size_t source_numbers = (size_t)B * batch->S * config->d_model;
    if (model->num_target_tokens == 0)
        return;
    zero(d->logits, (size_t)B * T * config->vocab_size);
    zero(decoder_output(model, d), target_numbers);
    zero(encoder_output(model, d), source_numbers);

    // loss = CrossEntropy(softmax(logits), q)
    cross_entropy_backward(d->logits, acts->probs, batch, config->label_smoothing,
                           model->num_target_tokens, config->vocab_size);

    // logits = decoder_output E^T
    linear_backward(decoder_output(model, d), model->grads.embedding, NULL, d->logits,
                    decoder_output(model, acts), model->params.embedding, B * T,
                    config->d_model, config->vocab_size);

    // the decoder stack, last layer first; each adds to the memory's gradient
    for (int l = config->n_layers - 1; l >= 0; l--) decoder_layer_backward(model, l, batch);
    zero(d->dec_embedded, target_numbers);
    embed_backward(model, d->dec_embedded, d->dec_x0, acts->dec_emb_mask, batch->tgt_in, B, T);

    // the encoder stack, from the gradient its output got from every decoder layer
    for (int l = config->n_layers - 1; l >= 0; l--) encoder_layer_backward(model, l, batch);
    zero(d->enc_embedded, source_numbers);
    embed_backward(model, d->enc_embedded, d->enc_x0, acts->enc_emb_mask, batch->src, B,
                   batch->S);
}

// ==== §5.3  Optimizer ========================================================
// "We used the Adam optimizer with beta1 = 0.9, beta2 = 0.98 and eps = 1e-9. We varied the
// learning rate over the course of training, according to
//     lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5)"
// (eq. 3): a linear rise for warmup_steps (4000 in the paper), then a decay with the inverse
// square root of the step. `factor` scales the whole curve (1 in the paper; larger for tiny
// models, as many reimplementations do).

double transformer_learning_rate(long step, int d_model, int warmup_steps, double factor) {
    double step_num = step < 1 ? 1.0 : (double)step;
    double rise = step_num * pow((double)warmup_steps, -1.5);
    double decay = 1.0 / sqrt(step_num);
    return factor / sqrt((double)d_model) * (rise < decay ? rise : decay);
}

// One Adam step (Kingma & Ba 2015, Algorithm 1) on every parameter theta with gradient g:
//     m = beta1 m + (1 - beta1) g            (first moment: adam_m, moment1 below)
//     v = beta2 v + (1 - beta2) g^2          (second moment: adam_v, moment2 below)
//     theta -= lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
// with t the step count; the divisions undo the moments' bias towards 0. The corrections are
// computed once, in double, and applied in `real`.
void adam_update(Transformer *model, double learning_rate) {
    model->adam_step++;
    const AdamConfig *adam = &model->adam;
    double t = (double)model->adam_step;
    real step_size = (real)(learning_rate / (1.0 - pow(adam->beta1, t)));   // lr / (1 - beta1^t)
    real rsqrt_correction2 = (real)(1.0 / sqrt(1.0 - pow(adam->beta2, t)));  // 1/sqrt(1-beta2^t)
    real beta1 = (real)adam->beta1;
    real beta2 = (real)adam->beta2;
    real eps = (real)adam->eps;
    real *theta = model->params_memory;
    real *moment1 = model->adam_m;
    real *moment2 = model->adam_v;
    const real *grad = model->grads_memory;
    #pragma omp parallel for
    for (size_t i = 0; i < model->num_parameters; i++) {
        real g = grad[i];
        moment1[i] = beta1 * moment1[i] + (1 - beta1) * g;
        moment2[i] = beta2 * moment2[i] + (1 - beta2) * g * g;
        theta[i] -= step_size * moment1[i] / (real_sqrt(moment2[i]) * rsqrt_correction2 + eps);
    }
}

// ==== §5  The training step ==================================================
// §5 describes training piece by piece: batches by length (§5.1), Adam at eq. 3's rate
// (§5.3), dropout and label smoothing (§5.4). One step: a forward pass to the loss, the
// backward pass to every gradient, one Adam update (eq. 3's t: adam_step + 1).

real transformer_train_step(Transformer *model, const Batch *batch, int warmup_steps,
                            double lr_factor) {
    real loss = transformer_forward(model, batch);   // Figure 1, bottom to top, and §5.4's loss
    transformer_zero_grad(model);                   // the backward passes accumulate (+=)
    transformer_backward(model, batch);             // top to bottom: dloss/d(every parameter)
    long step = model->adam_step + 1;
    double lr = transformer_learning_rate(step, model->config.d_model, warmup_steps, lr_factor);
    adam_update(model, lr);                         // §5.3, at eq. 3's rate
    return loss;
}

// ==== §6.1  Decoding: beam search, and greedy as a beam of one ================
// "We used beam search with a beam size of 4 and length penalty alpha = 0.6 ... We set the
// maximum output length during inference to input length + 50, but terminate early when
// possible." (§6.1) Greedy decoding, the most likely token at each position, is beam search
// with one beam.
//
// The decoder writes one token at a time: position t reads the token chosen at t-1 (<s> at
// t = 0). The encoder runs once per sentence; then every step runs the decoder stack of
// training (decoder_layer_forward, dropout off) over the positions 0..t so far and reads
// the logits of position t:
//
//   memory = Encoder(source)                                             once
//   step t:  <s> y_1 .. y_t ─ Decoder(·, memory) ─ ·E^T ─ logits at t ─ y_{t+1}
//
// Under the causal mask (§3.2.3) nothing at positions < t depends on later tokens, so step
// t gives the earlier positions exactly the numbers of step t-1: only row t is new. The
// rest is done again, the memory's keys and values too, so a sentence's work grows with the
// square of its length (attention's with the cube). The fast path keeps each layer's keys
// and values of the earlier positions instead (a key/value cache) and computes row t alone.

// memory = Encoder(source) (§3.1), as transformer_forward runs it, for B sentences src (B,S)
// of src_len (B) tokens, with room for the decoder's rows and max_T positions. B == rows (row
// r decodes sentence r), or B == 1 and rows 1.. get a copy of sentence 0's memory and source
// length (beam search's beams). Returns the memory (rows, S, C).
static const real *decoder_encode(Decoder *decoder, Transformer *model, const int *src,
                                  const int *src_len, int B, int max_T) {
    const TransformerConfig *config = &model->config;
    ActivationTensors *acts = &model->acts;
    int rows = decoder->rows;
    int S = decoder->S;
    Batch batch = { B, S, 1, (int *)src, (int *)src_len, NULL, NULL, NULL };
    ensure_buffers(model, rows, S, max_T);
    model->B = B;
    model->S = S;
    model->T = 1;
    embed_forward(acts->enc_x0, acts->enc_embedded, acts->enc_emb_mask, src, model, B, S);
    for (int l = 0; l < config->n_layers; l++) encoder_layer_forward(model, l, &batch);

    real *memory = encoder_output(model, acts);
    size_t sentence = (size_t)S * config->d_model;
    for (int r = B; r < rows; r++) memcpy(memory + r * sentence, memory, sentence * sizeof(real));
    for (int r = 0; r < rows; r++) decoder->src_len[r] = src_len[B == 1 ? 0 : r];
    return memory;
}

// `rows` rows decoded side by side for at most max_T positions: decoder_step's state, and the
// memory (decoder_encode), once.
static void decoder_begin(Decoder *decoder, Transformer *model, const int *src,
                          const int *src_len, int B, int S, int rows, int max_T) {
    if (fast_path.decoder_begin) {
        fast_path.decoder_begin(decoder, model, src, src_len, B, S, rows, max_T);
        return;
    }
    size_t history_size = (size_t)rows * max_T;
    memset(decoder, 0, sizeof *decoder);
    decoder->rows = rows;
    decoder->S = S;
    decoder->max_T = max_T;
    decoder->src_len = checked_calloc(rows, sizeof(int), "decoder source lengths");
    decoder->tgt_len = checked_calloc(rows, sizeof(int), "decoder target lengths");
    decoder->history = checked_calloc(history_size, sizeof(int), "decoder history");
    decoder->inputs = checked_calloc(history_size, sizeof(int), "decoder inputs");
    decoder->logits = checked_calloc((size_t)rows * model->config.vocab_size, sizeof(real),
                                     "decoder logits");
    decoder_encode(decoder, model, src, src_len, B, max_T);
}

// One decoder position t for rows 0..rows-1, tokens (rows) their inputs at t: the decoder
// stack over each row's positions 0..t, and position t's logits in decoder->logits (rows, V).
static void decoder_step(Decoder *decoder, Transformer *model, const int *tokens, int t,
                         int rows) {
    if (decoder->cache) {
        fast_path.decoder_step(decoder, model, tokens, t, rows);
        return;
    }
    const TransformerConfig *config = &model->config;
    ActivationTensors *acts = &model->acts;
    int C = config->d_model;
    int V = config->vocab_size;
    int T = t + 1;
    size_t max_T = decoder->max_T;

    // each row's inputs <s> y_1 .. y_t, as a (rows, T) batch of targets
    for (int r = 0; r < rows; r++) {
        decoder->history[r * max_T + t] = tokens[r];
        memcpy(decoder->inputs + (size_t)r * T, decoder->history + r * max_T, T * sizeof(int));
        decoder->tgt_len[r] = T;
    }
    Batch batch = { rows, decoder->S, T, NULL, decoder->src_len, decoder->inputs, NULL,
                    decoder->tgt_len };
    model->B = rows;
    model->T = T;

    // the decoder stack, as transformer_forward runs it, against decoder_begin's memory
    embed_forward(acts->dec_x0, acts->dec_embedded, acts->dec_emb_mask, decoder->inputs, model,
                  rows, T);
    for (int l = 0; l < config->n_layers; l++) decoder_layer_forward(model, l, &batch);

    // §3.4: the pre-softmax projection of position t, through the shared embedding
    const real *output = decoder_output(model, acts);
    for (int r = 0; r < rows; r++) {
        const real *output_t = output + ((size_t)r * T + t) * C;
        linear_forward(decoder->logits + (size_t)r * V, output_t, model->params.embedding, NULL,
                       1, C, V);
    }
}

// Row i continues beam parent[i]: it takes over that beam's inputs at positions 0..positions-1.
static void decoder_reorder(Decoder *decoder, const int *parent, int rows, int positions) {
    if (decoder->cache) {
        fast_path.decoder_reorder(decoder, parent, rows, positions);
        return;
    }
    size_t max_T = decoder->max_T;
    int *reordered = decoder->inputs;   // free until the next step packs it
    for (int i = 0; i < rows; i++) {
        const int *from = decoder->history + parent[i] * max_T;
        memcpy(reordered + i * max_T, from, (size_t)positions * sizeof(int));
    }
    decoder->inputs = decoder->history;
    decoder->history = reordered;
}

static void decoder_end(Decoder *decoder) {
    if (decoder->cache) {
        fast_path.decoder_end(decoder);
        return;
    }
    free(decoder->src_len);
    free(decoder->tgt_len);
    free(decoder->history);
    free(decoder->inputs);
    free(decoder->logits);
    memset(decoder, 0, sizeof *decoder);
}

// §6.1: "maximum output length ... input length + 50", and never more positions than the
// positional encoding has. Counts output tokens, </s> included.
int transformer_decode_limit(const Transformer *model, int src_len) {
    int limit = src_len + 50;
    return limit < model->config.max_len ? limit : model->config.max_len;
}

// §6.1 length penalty, as tensor2tensor's (Wu et al. 2016): a hypothesis of `length` tokens
// (</s> included) scores log P / ((5 + length) / 6)^alpha.
static double length_penalty(int length, double alpha) {
    return pow((5.0 + length) / 6.0, alpha);
}

// A possible extension: token after beam `row`, summed log-probability `score`. The logit
// breaks ties; among equals the first proposed (the lower row, then token) stays first: with
// one beam, the most likely token wins, the lowest id among equals, as greedy decoding chooses.
typedef struct {
    double score;
    real logit;
    int row;
    int token;
} BeamCandidate;

static int candidate_before(const BeamCandidate *a, const BeamCandidate *b) {
    if (a->score != b->score)
        return a->score > b->score;
    return a->logit > b->logit;
}

// Inserts candidate into best[0..*count-1], sorted, after its equals, keeping at most `keep`.
static void candidate_insert(BeamCandidate *best, int *count, int keep,
                             BeamCandidate candidate) {
    int i = *count;
    if (*count < keep)
        (*count)++;
    else if (candidate_before(&candidate, &best[keep - 1]))
        i = keep - 1;
    else
        return;
    while (i > 0 && candidate_before(&candidate, &best[i - 1])) {
        best[i] = best[i - 1];
        i--;
    }
    best[i] = candidate;
}

// Every alive beam r proposes every token but <pad> and <s> (and </s> unless may_end), scored
// alive_score[r] + log softmax(logits[r])_token (in double); the best `keep` go to best[],
// sorted. Returns how many.
static int beam_propose(BeamCandidate *best, int keep, const real *logits,
                        const double *alive_score, int num_alive, int V, int may_end) {
    int num_best = 0;
    for (int r = 0; r < num_alive; r++) {
        const real *z = logits + (size_t)r * V;
        double max_z = z[0];
        double sum = 0;
        for (int token = 1; token < V; token++) max_z = z[token] > max_z ? z[token] : max_z;
        for (int token = 0; token < V; token++) sum += exp(z[token] - max_z);
        double log_sum = max_z + log(sum);
        for (int token = 0; token < V; token++) {
            int never = token == TOKEN_PAD || token == TOKEN_BOS;
            if (never || (token == TOKEN_EOS && !may_end))
                continue;
            BeamCandidate candidate = { alive_score[r] + (z[token] - log_sum), z[token], r, token };
            candidate_insert(best, &num_best, keep, candidate);
        }
    }
    return num_best;
}

// A hypothesis ends: `length` tokens, summed log-probability log_p, its penalty counting
// `penalized` tokens (</s> included when there is one). The best so far (the first of equal
// scores) is kept in out, its length in *best_length (-1 before the first), its score in
// *best_score.
static void beam_finish(int *out, int *best_length, double *best_score, const int *tokens,
                        int length, double log_p, int penalized, double alpha) {
    double score = log_p / length_penalty(penalized, alpha);
    if (*best_length >= 0 && !(score > *best_score))
        return;
    memcpy(out, tokens, (size_t)length * sizeof(int));
    *best_length = length;
    *best_score = score;
}

// Beam search for one sentence (§6.1). At each position every alive beam proposes every
// token; the best beam_size - (hypotheses finished so far), by summed log-probability, are
// taken in order: one ending in </s> is finished, scored log P / length_penalty, the others
// are the next alive beams. Search stops when beam_size hypotheses have finished, or at the
// length limit, where the alive beams finish as they are. Returns the length of the best,
// written to out (capacity transformer_decode_limit) without </s>; *score gets its score.
// Greedy decoding is beam_size 1: the one beam takes the most likely token at each position,
// as fairseq's min_len 1, a source of words (more than its </s>) never ends at the first.
int transformer_beam_search(Transformer *model, int *out, double *score, const int *src,
                            int src_len, int beam_size, double alpha) {
    int training = model->training;
    int V = model->config.vocab_size;
    model->training = 0;
    int limit = transformer_decode_limit(model, src_len);
    size_t stride = limit;
    // the alive beams: beam b's tokens so far at tokens + b * stride, its summed log-probability
    // alive_score[b]; and the next step's, swapped with them at its end
    int *tokens = checked_calloc((size_t)beam_size * stride, sizeof(int), "beams");
    int *next_tokens = checked_calloc((size_t)beam_size * stride, sizeof(int), "beams");
    double *alive_score = checked_calloc(beam_size, sizeof(double), "beams");
    double *next_score = checked_calloc(beam_size, sizeof(double), "beams");
    int *parent = checked_calloc(beam_size, sizeof(int), "beams");   // the beam each continues
    int *input = checked_calloc(beam_size, sizeof(int), "beams");    // its last token
    BeamCandidate *best = checked_calloc(beam_size, sizeof(BeamCandidate), "beam candidates");
    int num_alive = 1;
    int finished = 0;
    int best_length = -1;   // (a hypothesis always finishes: at the latest, at the limit)
    double best_score = -INFINITY;
    Decoder decoder;
    decoder_begin(&decoder, model, src, &src_len, 1, src_len, beam_size, limit);
    input[0] = TOKEN_BOS;

    for (int t = 0; t < limit; t++) {
        decoder_step(&decoder, model, input, t, num_alive);
        // Each beam ends once: the best `width` (beams not ended yet) candidates end (</s>)
        // or go on. An ended beam is not replaced, so poor hypotheses that end early cannot
        // stop the search while a better one is still going.
        int width = beam_size - finished;
        int may_end = t > 0 || src_len <= 1;   // min_len 1: a source of words never ends at once
        int num_best = beam_propose(best, width, decoder.logits, alive_score, num_alive, V,
                                    may_end);
        int num_next = 0;
        for (int i = 0; i < num_best; i++) {
            const int *prefix = tokens + best[i].row * stride;
            if (best[i].token == TOKEN_EOS) {   // finished: t tokens and </s>
                beam_finish(out, &best_length, &best_score, prefix, t, best[i].score, t + 1,
                            alpha);
                finished++;
                continue;
            }
            int *next = next_tokens + num_next * stride;
            memcpy(next, prefix, t * sizeof(int));
            next[t] = best[i].token;
            next_score[num_next] = best[i].score;
            parent[num_next] = best[i].row;
            input[num_next] = best[i].token;
            num_next++;
        }
        if (finished == beam_size || num_next == 0)
            break;

        if (t + 1 == limit) {   // out of positions: the alive beams end here, without </s>
            for (int b = 0; b < num_next && finished < beam_size; b++) {
                beam_finish(out, &best_length, &best_score, next_tokens + b * stride, t + 1,
                            next_score[b], t + 1, alpha);
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

    if (score)
        *score = best_score;
    decoder_end(&decoder);
    free(tokens);
    free(next_tokens);
    free(alive_score);
    free(next_score);
    free(parent);
    free(input);
    free(best);
    model->training = training;
    return best_length;
}

// ==== The machinery ==========================================================
// What the model above takes for granted: memory, our own random numbers (a seed gives the
// same model on every machine), the parameters and the activations' layout, and the checks.

// Memory for count x size bytes (at least 1) for `what`: a new block of zeros (checked_calloc)
// or p resized (checked_realloc). A size that overflows, or no memory, is one line and exit 1.
static void *checked_alloc(void *p, int zeroed, size_t count, size_t size, const char *what) {
    if (count == 0)
        count = 1;
    int overflows = size != 0 && count > SIZE_MAX / size;
    void *block = NULL;
    if (!overflows)
        block = zeroed ? calloc(count, size) : realloc(p, count * size);
    if (!block) {
        fprintf(stderr, "error: %sout of memory allocating %s (%zu x %zu bytes)\n", error_context,
                what, count, size);
        exit(1);
    }
    return block;
}

static void *checked_calloc(size_t count, size_t size, const char *what) {
    return checked_alloc(NULL, 1, count, size, what);
}

// splitmix64's output function: outputs that look independent for consecutive inputs
static uint64_t hash64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// [0, 1) from the top 53 bits of 64 random ones
static double unit_interval(uint64_t bits) {
    return (double)(bits >> 11) * (1.0 / 9007199254740992.0);
}

// Nearby seeds give unrelated streams; the state is never 0.
static void rng_seed(Rng *rng, uint64_t seed) {
    uint64_t z = hash64(seed + 0x9E3779B97F4A7C15ULL);
    rng->state = z ? z : 0x2545F4914F6CDD1DULL;
}

// xorshift64*
static uint64_t rng_next(Rng *rng) {
    rng->state ^= rng->state >> 12;
    rng->state ^= rng->state << 25;
    rng->state ^= rng->state >> 27;
    return rng->state * 0x2545F4914F6CDD1DULL;
}

// uniform in [0, 1)
static double rng_uniform(Rng *rng) {
    return unit_interval(rng_next(rng));
}

// Box-Muller: a standard normal number
static double rng_normal(Rng *rng) {
    double u1 = 1.0 - rng_uniform(rng);   // (0, 1]: log(u1) is finite
    double u2 = rng_uniform(rng);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

// ---- the configuration (transformer_config_check, below, says what it may hold) ----

TransformerConfig transformer_default_config(void) {
    TransformerConfig config = {
        .n_layers = 2,
        .d_model = 64,
        .d_ff = 256,
        .n_heads = 4,
        .vocab_size = 32,
        .max_len = 64,
        .positional = POSITIONAL_SINUSOID,   // §3.5; POSITIONAL_LEARNED is Table 3's row E
        .dropout = 0.1f,                     // §5.4: P_drop of the base model
        .label_smoothing = 0.1f,             // §5.4: eps_ls
        .layer_norm_eps = 1e-5f,             // PyTorch's default; the paper gives none
    };
    return config;
}

// ---- the parameters: names, sizes, one allocation with named pointers -------

// The tensors of ParameterTensors (transformer.h), in its order, which is the storage order.
static const char *parameter_names[NUM_PARAMETER_TENSORS] = {
    "embedding", "position_embedding",
    "enc_qkv_w", "enc_qkv_b", "enc_out_w", "enc_out_b", "enc_ln1_g", "enc_ln1_b",
    "enc_ff1_w", "enc_ff1_b", "enc_ff2_w", "enc_ff2_b", "enc_ln2_g", "enc_ln2_b",
    "dec_self_qkv_w", "dec_self_qkv_b", "dec_self_out_w", "dec_self_out_b",
    "dec_ln1_g", "dec_ln1_b",
    "dec_cross_qkv_w", "dec_cross_qkv_b", "dec_cross_out_w", "dec_cross_out_b",
    "dec_ln2_g", "dec_ln2_b",
    "dec_ff1_w", "dec_ff1_b", "dec_ff2_w", "dec_ff2_b", "dec_ln3_g", "dec_ln3_b",
};

_Static_assert(sizeof(ParameterTensors) == NUM_PARAMETER_TENSORS * sizeof(real *),
               "NUM_PARAMETER_TENSORS counts the fields of ParameterTensors");

// The number of values of each tensor, in the same order (their shapes: transformer.h);
// returns their sum, the model's number of parameters.
static size_t parameter_sizes(size_t sizes[NUM_PARAMETER_TENSORS],
                              const TransformerConfig *config) {
    size_t L = config->n_layers;
    size_t C = config->d_model;
    size_t F = config->d_ff;
    size_t V = config->vocab_size;
    int learned = config->positional == POSITIONAL_LEARNED;
    sizes[0] = V * C;                                 // embedding
    sizes[1] = learned ? (size_t)config->max_len * C : 0;   // position_embedding
    sizes[2] = L * 3 * C * C;                         // enc_qkv_w
    sizes[3] = L * 3 * C;                             // enc_qkv_b
    sizes[4] = L * C * C;                             // enc_out_w
    sizes[5] = L * C;                                 // enc_out_b
    sizes[6] = L * C;                                 // enc_ln1_g
    sizes[7] = L * C;                                 // enc_ln1_b
    sizes[8] = L * F * C;                             // enc_ff1_w
    sizes[9] = L * F;                                 // enc_ff1_b
    sizes[10] = L * C * F;                            // enc_ff2_w
    sizes[11] = L * C;                                // enc_ff2_b
    sizes[12] = L * C;                                // enc_ln2_g
    sizes[13] = L * C;                                // enc_ln2_b
    sizes[14] = L * 3 * C * C;                        // dec_self_qkv_w
    sizes[15] = L * 3 * C;                            // dec_self_qkv_b
    sizes[16] = L * C * C;                            // dec_self_out_w
    sizes[17] = L * C;                                // dec_self_out_b
    sizes[18] = L * C;                                // dec_ln1_g
    sizes[19] = L * C;                                // dec_ln1_b
    sizes[20] = L * 3 * C * C;                        // dec_cross_qkv_w
    sizes[21] = L * 3 * C;                            // dec_cross_qkv_b
    sizes[22] = L * C * C;                            // dec_cross_out_w
    sizes[23] = L * C;                                // dec_cross_out_b
    sizes[24] = L * C;                                // dec_ln2_g
    sizes[25] = L * C;                                // dec_ln2_b
    sizes[26] = L * F * C;                            // dec_ff1_w
    sizes[27] = L * F;                                // dec_ff1_b
    sizes[28] = L * C * F;                            // dec_ff2_w
    sizes[29] = L * C;                                // dec_ff2_b
    sizes[30] = L * C;                                // dec_ln3_g
    sizes[31] = L * C;                                // dec_ln3_b
    size_t total = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) total += sizes[i];
    return total;
}

// The named pointers of a ParameterTensors, in the same order.
static void parameter_pointers(real **ptrs[NUM_PARAMETER_TENSORS], ParameterTensors *of) {
    real **list[NUM_PARAMETER_TENSORS] = {
        &of->embedding, &of->position_embedding,
        &of->enc_qkv_w, &of->enc_qkv_b, &of->enc_out_w, &of->enc_out_b,
        &of->enc_ln1_g, &of->enc_ln1_b,
        &of->enc_ff1_w, &of->enc_ff1_b, &of->enc_ff2_w, &of->enc_ff2_b,
        &of->enc_ln2_g, &of->enc_ln2_b,
        &of->dec_self_qkv_w, &of->dec_self_qkv_b, &of->dec_self_out_w, &of->dec_self_out_b,
        &of->dec_ln1_g, &of->dec_ln1_b,
        &of->dec_cross_qkv_w, &of->dec_cross_qkv_b, &of->dec_cross_out_w, &of->dec_cross_out_b,
        &of->dec_ln2_g, &of->dec_ln2_b,
        &of->dec_ff1_w, &of->dec_ff1_b, &of->dec_ff2_w, &of->dec_ff2_b,
        &of->dec_ln3_g, &of->dec_ln3_b,
    };
    memcpy(ptrs, list, sizeof list);
}

// Points the named tensors into memory laid out in the order above.
static void point_parameters(ParameterTensors *tensors, real *block,
                             const size_t sizes[NUM_PARAMETER_TENSORS]) {
    real **ptrs[NUM_PARAMETER_TENSORS];
    parameter_pointers(ptrs, tensors);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        *ptrs[i] = block;
        block += sizes[i];
    }
}

// Xavier-uniform (Glorot & Bengio 2010) of a (rows, cols) matrix: U(-a, a) with
// a = sqrt(6 / (fan_in + fan_out))
static void xavier_uniform(real *w, size_t rows, size_t cols, Rng *rng) {
    double bound = sqrt(6.0 / (double)(rows + cols));
    for (size_t i = 0; i < rows * cols; i++) w[i] = (real)((2.0 * rng_uniform(rng) - 1.0) * bound);
}

// Initialisation (the paper gives none; PyTorch's and the common reimplementations'):
// Xavier-uniform for every projection matrix (W^Q, W^K, W^V, W^O each on its own, W_1, W_2);
// the embedding and learned positions normal, standard deviation d_model^-0.5
// (tensor2tensor, fairseq); zero biases, layer-norm gain 1. The positions come last: a seed
// gives the same other weights with either kind.
static void initialize_parameters(Transformer *model, uint64_t seed) {
    const TransformerConfig *config = &model->config;
    size_t L = config->n_layers;
    size_t C = config->d_model;
    size_t F = config->d_ff;
    size_t V = config->vocab_size;
    ParameterTensors *params = &model->params;
    Rng rng;
    rng_seed(&rng, seed);
    memset(model->params_memory, 0, model->num_parameters * sizeof(real));

    double std = 1.0 / sqrt((double)C);
    for (size_t i = 0; i < V * C; i++) params->embedding[i] = (real)(std * rng_normal(&rng));

    // the encoder's self-attention, the decoder's self-attention, its encoder-decoder attention
    real *qkv[3] = { params->enc_qkv_w, params->dec_self_qkv_w, params->dec_cross_qkv_w };
    real *out[3] = { params->enc_out_w, params->dec_self_out_w, params->dec_cross_out_w };
    for (size_t l = 0; l < L; l++) {
        for (int kind = 0; kind < 3; kind++) {
            for (int part = 0; part < 3; part++) {   // W^Q, W^K, W^V
                xavier_uniform(qkv[kind] + (l * 3 + part) * C * C, C, C, &rng);
            }
            xavier_uniform(out[kind] + l * C * C, C, C, &rng);
        }
        xavier_uniform(params->enc_ff1_w + l * F * C, F, C, &rng);
        xavier_uniform(params->enc_ff2_w + l * C * F, C, F, &rng);
        xavier_uniform(params->dec_ff1_w + l * F * C, F, C, &rng);
        xavier_uniform(params->dec_ff2_w + l * C * F, C, F, &rng);
    }

    real *gains[5] = { params->enc_ln1_g, params->enc_ln2_g, params->dec_ln1_g, params->dec_ln2_g,
                       params->dec_ln3_g };
    for (int gain = 0; gain < 5; gain++)
        for (size_t i = 0; i < L * C; i++) gains[gain][i] = 1;

    if (config->positional == POSITIONAL_LEARNED) {
        real *table = params->position_embedding;
        size_t n = (size_t)config->max_len * C;
        for (size_t i = 0; i < n; i++) table[i] = (real)(std * rng_normal(&rng));
    }
}

// ---- the model's memory: arenas, the activations' layout, building and freeing ----

// The model's tensors live in arenas of zeros, each tensor on a 64-byte cache line (where
// vector code wants its rows to start). calloc leaves pages never written unbacked (decoding
// never touches the gradients), so arena_calloc asks it for one line more, returns the first
// line boundary in it, and keeps calloc's address below that for arena_free.
#define CACHE_LINE 64
_Static_assert(_Alignof(max_align_t) >= sizeof(void *), "room below the aligned address");

static real *arena_calloc(size_t count, const char *what) {
    size_t per_line = CACHE_LINE / sizeof(real);
    size_t lines = count / per_line + (count % per_line != 0);
    unsigned char *block = checked_calloc(lines + 1, CACHE_LINE, what);
    unsigned char *aligned = block + CACHE_LINE - (uintptr_t)block % CACHE_LINE;
    memcpy(aligned - sizeof block, &block, sizeof block);
    return (real *)aligned;
}

static void arena_free(real *p) {
    if (!p)
        return;
    unsigned char *block;
    memcpy(&block, (unsigned char *)p - sizeof block, sizeof block);
    free(block);
}

// Tensors cut one after another out of an arena: a first pass with arena NULL only counts
// (`used`), a second hands out the places. With `gradients` set, the tensors that have no
// gradient (forward_only) get NULL and no room.
typedef struct {
    real *arena;
    size_t used;      // numbers handed out so far, each tensor rounded up to whole lines
    int gradients;
} Layout;

static real *tensor(Layout *layout, size_t count) {
    size_t per_line = CACHE_LINE / sizeof(real);
    real *place = layout->arena ? layout->arena + layout->used : NULL;
    layout->used += (count + per_line - 1) / per_line * per_line;
    return place;
}

static real *forward_only(Layout *layout, size_t count) {
    return layout->gradients ? NULL : tensor(layout, count);
}

static void layout_attention(AttentionActs *a, Layout *layout, size_t rows, size_t key_rows,
                             size_t att, size_t C, int cross) {
    a->qkv = cross ? NULL : tensor(layout, rows * 3 * C);
    a->q = cross ? tensor(layout, rows * C) : NULL;
    a->kv = cross ? tensor(layout, key_rows * 2 * C) : NULL;
    a->att = forward_only(layout, att);
    a->heads = tensor(layout, rows * C);
    a->out = tensor(layout, rows * C);
}

static void layout_add_norm(AddNormActs *a, Layout *layout, size_t rows, size_t C) {
    a->mask = forward_only(layout, rows * C);
    a->res = forward_only(layout, rows * C);
    a->out = tensor(layout, rows * C);
    a->mean = forward_only(layout, rows);
    a->rstd = forward_only(layout, rows);
}

static void layout_feed_forward(FeedForwardActs *a, Layout *layout, size_t rows, size_t C,
                                size_t F) {
    a->hidden = tensor(layout, rows * F);
    a->out = tensor(layout, rows * C);
}

// The activations (or their gradients) of a B x S x T batch, in the order of their arena.
// Their shapes: transformer.h, ActivationTensors.
static void layout_activations(ActivationTensors *a, Layout *layout,
                               const TransformerConfig *config, size_t B, size_t S, size_t T) {
    size_t L = config->n_layers;
    size_t C = config->d_model;
    size_t F = config->d_ff;
    size_t NH = config->n_heads;
    size_t V = config->vocab_size;
    size_t src = B * S;   // the encoder's rows
    size_t tgt = B * T;   // the decoder's rows
    a->enc_embedded = tensor(layout, src * C);
    a->enc_emb_mask = forward_only(layout, src * C);
    a->enc_x0 = tensor(layout, src * C);
    for (size_t l = 0; l < L; l++) {
        EncoderLayerActs *e = &a->enc[l];
        layout_attention(&e->self_attn, layout, src, src, B * NH * S * S, C, 0);
        layout_add_norm(&e->norm1, layout, src, C);
        layout_feed_forward(&e->ffn, layout, src, C, F);
        layout_add_norm(&e->norm2, layout, src, C);
    }
    a->dec_embedded = tensor(layout, tgt * C);
    a->dec_emb_mask = forward_only(layout, tgt * C);
    a->dec_x0 = tensor(layout, tgt * C);
    for (size_t l = 0; l < L; l++) {
        DecoderLayerActs *d = &a->dec[l];
        layout_attention(&d->self_attn, layout, tgt, tgt, B * NH * T * T, C, 0);
        layout_add_norm(&d->norm1, layout, tgt, C);
        layout_attention(&d->cross_attn, layout, tgt, src, B * NH * T * S, C, 1);
        layout_add_norm(&d->norm2, layout, tgt, C);
        layout_feed_forward(&d->ffn, layout, tgt, C, F);
        layout_add_norm(&d->norm3, layout, tgt, C);
    }
    a->logits = tensor(layout, tgt * V);
    a->probs = forward_only(layout, tgt * V);
    a->token_loss = forward_only(layout, tgt);
}

// One arena for the activations (gradients = 0) or their gradients (1) of a B x S x T
// batch; returns it.
static real *activations_alloc(ActivationTensors *a, const TransformerConfig *config,
                               int gradients, size_t B, size_t S, size_t T) {
    Layout counting = { NULL, 0, gradients };
    layout_activations(a, &counting, config, B, S, T);
    const char *what = gradients ? "the activations' gradients" : "activations";
    Layout layout = { arena_calloc(counting.used, what), 0, gradients };
    layout_activations(a, &layout, config, B, S, T);
    return layout.arena;
}

// Makes the activations and their gradients big enough for a (B, S, T) batch. A smaller
// batch uses the start of each tensor.
static void ensure_buffers(Transformer *model, int batch_B, int batch_S, int batch_T) {
    int fits = batch_B <= model->cap_B && batch_S <= model->cap_S && batch_T <= model->cap_T;
    if (model->acts_memory && fits)
        return;
    size_t B = batch_B > model->cap_B ? batch_B : model->cap_B;
    size_t S = batch_S > model->cap_S ? batch_S : model->cap_S;
    size_t T = batch_T > model->cap_T ? batch_T : model->cap_T;
    arena_free(model->acts_memory);
    arena_free(model->grads_acts_memory);
    model->acts_memory = activations_alloc(&model->acts, &model->config, 0, B, S, T);
    model->grads_acts_memory = activations_alloc(&model->grads_acts, &model->config, 1, B, S, T);
    model->cap_B = (int)B;
    model->cap_S = (int)S;
    model->cap_T = (int)T;
}

const char *transformer_build(Transformer *model, const TransformerConfig *config,
                              uint64_t seed) {
    memset(model, 0, sizeof *model);
    const char *error = transformer_config_check(config);
    if (error)
        return error;
    model->config = *config;
    model->num_parameters = parameter_sizes(model->param_sizes, config);
    model->params_memory = arena_calloc(model->num_parameters, "parameters");
    model->grads_memory = arena_calloc(model->num_parameters, "gradients");
    model->adam_m = arena_calloc(model->num_parameters, "Adam first moments");
    model->adam_v = arena_calloc(model->num_parameters, "Adam second moments");
    point_parameters(&model->params, model->params_memory, model->param_sizes);
    point_parameters(&model->grads, model->grads_memory, model->param_sizes);
    AdamConfig adam = { .beta1 = 0.9, .beta2 = 0.98, .eps = 1e-9 };   // §5.3
    model->adam = adam;

    size_t L = config->n_layers;
    model->acts.enc = checked_calloc(L, sizeof(EncoderLayerActs), "encoder layers");
    model->acts.dec = checked_calloc(L, sizeof(DecoderLayerActs), "decoder layers");
    model->grads_acts.enc = checked_calloc(L, sizeof(EncoderLayerActs), "encoder layers");
    model->grads_acts.dec = checked_calloc(L, sizeof(DecoderLayerActs), "decoder layers");

    if (config->positional == POSITIONAL_LEARNED) {
        model->positional_encoding = model->params.position_embedding;   // Table 3, row E
    } else {
        size_t n = (size_t)config->max_len * config->d_model;
        model->positional_encoding = arena_calloc(n, "positional encoding");
        positional_encoding_init(model->positional_encoding, config->max_len, config->d_model);
    }
    initialize_parameters(model, seed);
    rng_seed(&model->dropout_rng, seed ^ 0xD0D0D0D0ULL);
    model->training = 1;
    return NULL;
}

void transformer_free(Transformer *model) {
    int sinusoids = model->config.positional == POSITIONAL_SINUSOID;
    real *arenas[] = { model->params_memory, model->grads_memory, model->adam_m, model->adam_v,
                       model->acts_memory, model->grads_acts_memory,
                       sinusoids ? model->positional_encoding : NULL };
    void *layers[] = { model->acts.enc, model->acts.dec, model->grads_acts.enc,
                       model->grads_acts.dec };
    for (size_t i = 0; i < sizeof arenas / sizeof *arenas; i++) arena_free(arenas[i]);
    for (size_t i = 0; i < sizeof layers / sizeof *layers; i++) free(layers[i]);
    memset(model, 0, sizeof *model);
}

// An error's one line, from a format and its values: kept until the next error
static char error_buffer[1024];
static const char *errorf(const char *format, ...) {
    char text[sizeof error_buffer];   // (an argument may be the last error itself)
    va_list args;
    va_start(args, format);
    vsnprintf(text, sizeof text, format, args);
    va_end(args);
    memcpy(error_buffer, text, sizeof text);
    return error_buffer;
}

// Returns NULL when the config is usable, else a message naming the bad field.
const char *transformer_config_check(const TransformerConfig *config) {
    if (config->n_layers < 1 || config->n_layers > TRANSFORMER_MAX_LAYERS)
        return errorf("n_layers is %d, expected 1..%d", config->n_layers,
                      TRANSFORMER_MAX_LAYERS);
    if (config->d_model < 1 || config->d_model > TRANSFORMER_MAX_WIDTH)
        return errorf("d_model is %d, expected 1..%d", config->d_model, TRANSFORMER_MAX_WIDTH);
    if (config->d_ff < 1 || config->d_ff > TRANSFORMER_MAX_WIDTH)
        return errorf("d_ff is %d, expected 1..%d", config->d_ff, TRANSFORMER_MAX_WIDTH);
    if (config->n_heads < 1 || config->n_heads > config->d_model)
        return errorf("n_heads is %d, expected 1..d_model (%d)", config->n_heads,
                      config->d_model);
    if (config->d_model % config->n_heads != 0)
        return errorf("d_model (%d) is not divisible by n_heads (%d)", config->d_model,
                      config->n_heads);
    if (config->vocab_size <= NUM_SPECIAL_TOKENS || config->vocab_size > TRANSFORMER_MAX_VOCAB)
        return errorf("vocab_size is %d, expected %d..%d (4 special tokens + words)",
                      config->vocab_size, NUM_SPECIAL_TOKENS + 1, TRANSFORMER_MAX_VOCAB);
    if (config->max_len < 2 || config->max_len > TRANSFORMER_MAX_LEN)
        return errorf("max_len is %d, expected 2..%d", config->max_len, TRANSFORMER_MAX_LEN);
    if (config->positional != POSITIONAL_SINUSOID && config->positional != POSITIONAL_LEARNED)
        return errorf("positional is %d, expected %d (sinusoid) or %d (learned)",
                      config->positional, POSITIONAL_SINUSOID, POSITIONAL_LEARNED);
    if (!(config->dropout >= 0.0f && config->dropout < 1.0f))
        return errorf("dropout is %g, expected 0 <= dropout < 1", (double)config->dropout);
    if (!(config->label_smoothing >= 0.0f && config->label_smoothing < 1.0f))
        return errorf("label_smoothing is %g, expected 0 <= eps_ls < 1",
                      (double)config->label_smoothing);
    if (!(config->layer_norm_eps > 0.0f && config->layer_norm_eps < 1.0f))
        return errorf("layer_norm_eps is %g, expected 0 < eps < 1",
                      (double)config->layer_norm_eps);
    return NULL;
}

// Returns NULL when the batch fits the model, else what is wrong with it.
const char *batch_check(const Batch *batch, const TransformerConfig *config) {
    int B = batch->B;
    int S = batch->S;
    int T = batch->T;
    int V = config->vocab_size;
    if (B < 1 || S < 1 || T < 1)
        return errorf("batch shape %d x %d x %d, expected positive sizes", B, S, T);
    if (S > config->max_len || T > config->max_len)
        return errorf("batch lengths %d (source) and %d (target) exceed max_len %d", S, T,
                      config->max_len);
    for (int b = 0; b < B; b++) {
        if (batch->src_len[b] < 1 || batch->src_len[b] > S)
            return errorf("sentence %d: source length %d, expected 1..%d", b, batch->src_len[b],
                          S);
        if (batch->tgt_len[b] < 1 || batch->tgt_len[b] > T)
            return errorf("sentence %d: target length %d, expected 1..%d", b, batch->tgt_len[b],
                          T);
        for (int s = 0; s < S; s++) {
            int token = batch->src[b * S + s];
            if (token < 0 || token >= V)
                return errorf("sentence %d: source token %d at %d outside the vocabulary 0..%d",
                              b, token, s, V - 1);
        }
        for (int t = 0; t < T; t++) {
            int in = batch->tgt_in[b * T + t];
            int out = batch->tgt_out[b * T + t];
            if (in < 0 || in >= V || out < 0 || out >= V)
                return errorf("sentence %d: target token %d/%d at %d outside the vocabulary "
                              "0..%d", b, in, out, t, V - 1);
        }
    }
    return NULL;
}

// ######## PART II   THE PROGRAM #############################################
// The smallest program that trains Part I's model on a toy task and translates with it. What
// can fail returns NULL or one line naming the value, file or line at fault and what was
// expected. A program that includes this file (-DTRANSFORMER_NO_MAIN) may use any function
// here, and plug faster code into two seams: FastPath (Part I's top) and TrainingCompute (train).

static void *checked_realloc(void *p, size_t count, size_t size, const char *what) {
    return checked_alloc(p, 0, count, size, what);
}

// a uniform integer in [0, n)
static int rng_below(Rng *rng, int n) {
    return (int)(rng_uniform(rng) * n);
}

static double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---- the vocabulary ---------------------------------------------------------
// §3.4: source and target share one vocabulary (and one embedding). Ids 0..3 are <pad> <s> </s>
// <unk>, then the tokens in the order first seen. A hash table (open addressing, at most half
// full) finds an id in a few probes, among 14 tokens or the paper's 37,000.

static const char *special_tokens[NUM_SPECIAL_TOKENS] = { "<pad>", "<s>", "</s>", "<unk>" };

#define FNV_OFFSET 0xCBF29CE484222325ULL

// FNV-1a (64 bits) of n more bytes, from the hash of those before them (or FNV_OFFSET): the
// vocabulary's hash, and the checkpoint's checksum
static uint64_t fnv1a(uint64_t hash, const void *data, size_t n) {
    const unsigned char *bytes = data;
    for (size_t i = 0; i < n; i++) hash = (hash ^ bytes[i]) * 0x100000001B3ULL;
    return hash;
}

// The slot of the n bytes at word: the one that holds its id, or the empty one where it goes.
static int vocab_slot(const Vocabulary *vocab, const char *word, size_t n) {
    int slot = (int)(fnv1a(FNV_OFFSET, word, n) % (uint64_t)vocab->num_slots);
    while (vocab->slots[slot] >= 0) {
        const char *there = vocab->words[vocab->slots[slot]];
        if (strncmp(there, word, n) == 0 && there[n] == '\0')
            return slot;
        slot = (slot + 1) % vocab->num_slots;
    }
    return slot;
}

// The id of the n bytes at word, or -1 when the vocabulary does not hold them.
static int vocab_find(const Vocabulary *vocab, const char *word, size_t n) {
    return vocab->size > 0 ? vocab->slots[vocab_slot(vocab, word, n)] : -1;
}

// The id of the n bytes at word, which join the vocabulary if they are new.
static int vocab_add(Vocabulary *vocab, const char *word, size_t n) {
    int id = vocab_find(vocab, word, n);
    if (id >= 0)
        return id;
    if (vocab->size == vocab->capacity) {   // twice the room, and the table built anew
        vocab->capacity = vocab->capacity ? 2 * vocab->capacity : 64;
        vocab->num_slots = 2 * vocab->capacity;
        vocab->words = checked_realloc(vocab->words, vocab->capacity, sizeof(char *), "vocabulary");
        vocab->slots = checked_realloc(vocab->slots, vocab->num_slots, sizeof(int), "vocabulary");
        for (int slot = 0; slot < vocab->num_slots; slot++) vocab->slots[slot] = -1;
        for (int i = 0; i < vocab->size; i++)
            vocab->slots[vocab_slot(vocab, vocab->words[i], strlen(vocab->words[i]))] = i;
    }
    id = vocab->size;
    vocab->words[id] = checked_calloc(n + 1, 1, "vocabulary word");
    memcpy(vocab->words[id], word, n);
    vocab->slots[vocab_slot(vocab, word, n)] = id;
    vocab->size++;
    return id;
}

// A vocabulary of the four special tokens.
static void vocab_init(Vocabulary *vocab) {
    memset(vocab, 0, sizeof *vocab);
    for (int i = 0; i < NUM_SPECIAL_TOKENS; i++)
        vocab_add(vocab, special_tokens[i], strlen(special_tokens[i]));
}

static void vocab_free(Vocabulary *vocab) {
    for (int i = 0; i < vocab->size; i++) free(vocab->words[i]);
    free(vocab->words);
    free(vocab->slots);
    memset(vocab, 0, sizeof *vocab);
}

// ---- the command line -------------------------------------------------------
// A command reads its flags from a table of Options (transformer.h). A bad flag gets one line
// that names it and says what was expected; --help prints the table with the defaults.

static Option *find_option(Option *options, int n, const char *name) {
    for (int i = 0; i < n; i++) {
        if (strcmp(options[i].name, name) == 0)
            return &options[i];
    }
    return NULL;
}

// Reads text into the option's value. Returns 0, the value left as it was, when there is no
// text or it is not a value the option takes; expected (96 bytes) then says what it takes.
static int option_read(const Option *o, const char *text, char *expected) {
    const char *above = o->above_min ? ">" : ">=";
    if (o->kind == OPTION_INT && o->max >= INT_MAX)
        snprintf(expected, 96, "an integer >= %.0f", o->min);
    else if (o->kind == OPTION_INT)
        snprintf(expected, 96, "an integer from %.0f to %.0f", o->min, o->max);
    else if (o->max >= DBL_MAX)
        snprintf(expected, 96, "a number %s %g", above, o->min);
    else
        snprintf(expected, 96, "a number %s %g and <= %g", above, o->min, o->max);
    if (text && o->kind == OPTION_TEXT)
        *(const char **)o->value = text;
    if (!text || o->kind == OPTION_TEXT)
        return text != NULL;
    char *end;
    errno = 0;
    double x = o->kind == OPTION_INT ? (double)strtol(text, &end, 10) : strtod(text, &end);
    int in_range = x >= o->min && x <= o->max && (!o->above_min || x > o->min);
    int valid = end != text && *end == '\0' && errno == 0 && isfinite(x) && in_range;
    if (valid && o->kind == OPTION_INT)
        *(int *)o->value = (int)x;
    if (valid && o->kind == OPTION_NUMBER)
        *(double *)o->value = x;
    return valid;
}

static void print_option_help(const Option *options, int n) {
    const char *kinds[] = { "N", "X", "TEXT", "" };
    for (const Option *o = options; o < options + n; o++) {
        char left[64];
        char value[64] = "";
        snprintf(left, sizeof left, "%s %s", o->name, kinds[o->kind]);
        if (o->kind == OPTION_INT)
            snprintf(value, sizeof value, " (default %d)", *(int *)o->value);
        if (o->kind == OPTION_NUMBER)
            snprintf(value, sizeof value, " (default %g)", *(double *)o->value);
        if (o->kind == OPTION_TEXT && *(const char **)o->value)
            snprintf(value, sizeof value, " (default %s)", *(const char **)o->value);
        printf("  %-22s %s%s\n", left, o->help, value);
    }
}

// Reads argv[1..argc-1] into the options; other arguments go to positional when it is not NULL
// (decode's sentences, "-3" too). Returns 0; 1 after a one-line error; 2 after the help.
static int parse_options(const char *command, const char *usage, Option *options, int n,
                         int argc, char **argv, char **positional, int *num_positional) {
    if (num_positional)
        *num_positional = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            printf(n > 0 ? "%s\noptions:\n" : "%s\n", usage);
            print_option_help(options, n);
            return 2;
        }
        int is_number = isdigit((unsigned char)arg[1]);
        int is_flag = arg[0] == '-' && arg[1] != '\0' && !(positional && is_number);
        if (!is_flag && positional) {
            positional[*num_positional] = argv[i];
            *num_positional += 1;
            continue;
        }
        Option *o = is_flag ? find_option(options, n, arg) : NULL;
        if (!o) {
            fprintf(stderr, "error: %s: %s '%s'; see ./transformer %s --help\n", command,
                    is_flag ? "unknown flag" : "unexpected argument", arg, command);
            return 1;
        }
        o->seen = 1;
        if (o->kind == OPTION_FLAG) {
            *(int *)o->value = 1;
            continue;
        }

        // The value is the next argument; a text flag takes no flag ("--checkpoint --beam").
        const char *text = i + 1 < argc ? argv[i + 1] : NULL;
        if (text && o->kind == OPTION_TEXT && strncmp(text, "--", 2) == 0)
            text = NULL;
        i += text != NULL;
        char expected[96];
        if (option_read(o, text, expected))
            continue;
        if (text)
            fprintf(stderr, "error: %s: %s '%s' is not valid; expected %s\n", command, arg, text,
                    expected);
        else if (o->kind == OPTION_TEXT)
            fprintf(stderr, "error: %s: flag %s needs a value\n", command, arg);
        else
            fprintf(stderr, "error: %s: flag %s needs a value (%s)\n", command, arg, expected);
        return 1;
    }
    return 0;
}

// ---- tokens -----------------------------------------------------------------
// Text is whole-word tokens separated by white space (isspace, in C's locale: space, \t to \r).

// The first token of the text, and its length in bytes in *length; NULL when there is none.
static const char *next_token(const char *text, size_t *length) {
    while (isspace((unsigned char)*text))
        text++;
    const char *end = text;
    while (*end != '\0' && !isspace((unsigned char)*end))
        end++;
    *length = (size_t)(end - text);
    return end > text ? text : NULL;
}

// The id of the n bytes at token. With grow, a new token joins the vocabulary; without, it is
// read as <unk>, and the first few are warned of.
static int token_id(Vocabulary *vocab, int grow, const char *token, size_t n, TextSource *from) {
    int id = grow ? vocab_add(vocab, token, n) : vocab_find(vocab, token, n);
    if (id < 0 && from->warnings < MAX_UNKNOWN_WARNINGS) {
        fprintf(stderr, "warning: %s: token '%.*s' is not in the vocabulary; read as <unk>\n",
                from->where, n < 80 ? (int)n : 80, token);
    }
    from->warnings += id < 0;
    from->unknown += id < 0;
    return id < 0 ? TOKEN_UNK : id;
}

// Puts id at (*ids)[n], growing the array (of *capacity ids) when it is full.
static void push_id(int **ids, size_t *capacity, int n, int id) {
    if ((size_t)n == *capacity) {
        *capacity = *capacity ? 2 * *capacity : 64;
        *ids = checked_realloc(*ids, *capacity, sizeof(int), "token ids");
    }
    (*ids)[n] = id;
}

// Splits the text into token ids (*ids grows as needed). Returns their number, or -1 at a special
// token's text (named in from->reserved): the model would learn, or be fed, its own markers.
static int tokenize(const char *text, Vocabulary *vocab, int grow, int **ids, size_t *capacity,
                    TextSource *from) {
    int n = 0;
    size_t length;
    for (const char *token = next_token(text, &length); token;
         token = next_token(token + length, &length)) {
        for (int special = 0; special < NUM_SPECIAL_TOKENS; special++) {
            from->reserved = special_tokens[special];
            if (strlen(from->reserved) == length && memcmp(token, from->reserved, length) == 0)
                return -1;
        }
        push_id(ids, capacity, n, token_id(vocab, grow, token, length, from));
        n++;
    }
    return n;
}

static const char *reserved_token_error(const TextSource *from) {
    return errorf("%s: the token '%s' is reserved (<pad> <s> </s> <unk> are the model's own "
                  "markers); expected text without them", from->where, from->reserved);
}

// The tokens' texts, separated by spaces.
static void print_tokens(FILE *f, const Vocabulary *vocab, const int *ids, int n) {
    for (int i = 0; i < n; i++) fprintf(f, i > 0 ? " %s" : "%s", vocab->words[ids[i]]);
}

// ---- sentence pairs ---------------------------------------------------------

static void dataset_free(Dataset *dataset) {
    free(dataset->pairs);
    free(dataset->tokens);
    memset(dataset, 0, sizeof *dataset);
}

static void dataset_add(Dataset *dataset, const int *src, int src_len, const int *tgt, int tgt_len,
                        int line) {
    if (dataset->count == dataset->capacity) {
        dataset->capacity = dataset->capacity ? 2 * dataset->capacity : 256;
        dataset->pairs = checked_realloc(dataset->pairs, dataset->capacity, sizeof(SentencePair),
                                         "sentence pairs");
    }
    size_t needed = dataset->num_tokens + src_len + tgt_len;
    if (needed > dataset->tokens_capacity) {
        dataset->tokens_capacity = 2 * needed + 1024;
        dataset->tokens = checked_realloc(dataset->tokens, dataset->tokens_capacity, sizeof(int),
                                          "sentence tokens");
    }
    SentencePair pair = { dataset->num_tokens, dataset->num_tokens + src_len, src_len, tgt_len,
                          line };
    dataset->pairs[dataset->count] = pair;
    dataset->count++;
    memcpy(dataset->tokens + pair.src, src, src_len * sizeof(int));
    memcpy(dataset->tokens + pair.tgt, tgt, tgt_len * sizeof(int));
    dataset->num_tokens = needed;
    if (src_len > dataset->longest_src)
        dataset->longest_src = src_len;
    if (tgt_len > dataset->longest_tgt)
        dataset->longest_tgt = tgt_len;
}

// ---- the copy and reverse tasks ---------------------------------------------
// copy: the target is the source; reverse: the source backwards; the words are the numbers
// 0..words-1. No held-out source is a training source: the test is on unseen sequences.

enum { TASK_COPY, TASK_REVERSE };

static void task_vocabulary(Vocabulary *vocab, int words) {
    vocab_init(vocab);
    for (int w = 0; w < words; w++) {
        char text[16];
        int length = snprintf(text, sizeof text, "%d", w);
        vocab_add(vocab, text, (size_t)length);
    }
}

static const char *task_generate(Dataset *train, Dataset *valid, int task, int words, int min_len,
                                 int max_len, int train_size, int valid_size, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed ^ 0x7A5C0DA7A5EEDULL);
    Vocabulary seen;   // the sources drawn so far, as texts: a set
    memset(&seen, 0, sizeof seen);
    int *src = checked_calloc(max_len, sizeof(int), "task sentence");
    int *tgt = checked_calloc(max_len, sizeof(int), "task sentence");
    char *text = checked_calloc((size_t)max_len * 12 + 1, 1, "task sentence");
    const char *error = NULL;
    long attempts = 0;
    long max_attempts = 1000L * valid_size + 1000;
    int made = 0;
    while (made < train_size + valid_size) {
        int n = min_len + rng_below(&rng, max_len - min_len + 1);
        for (int t = 0; t < n; t++) src[t] = NUM_SPECIAL_TOKENS + rng_below(&rng, words);
        for (int t = 0; t < n; t++) tgt[t] = task == TASK_COPY ? src[t] : src[n - 1 - t];
        int length = 0;
        for (int t = 0; t < n; t++) length += sprintf(text + length, "%d ", src[t]);
        int drawn_before = seen.size;
        vocab_add(&seen, text, (size_t)length);
        int is_new = seen.size > drawn_before;

        // The training pairs first, then held-out pairs, each with a source not drawn before.
        if (made < train_size || is_new) {
            dataset_add(made < train_size ? train : valid, src, n, tgt, n, 0);
            made++;
            continue;
        }
        attempts++;
        if (attempts > max_attempts) {
            error = errorf("cannot find %d held-out sequences outside the %d training sequences "
                           "(found %d); expected more --words or a larger --max-length",
                           valid_size, train_size, valid->count);
            break;
        }
    }
    vocab_free(&seen);
    free(src);
    free(tgt);
    free(text);
    return error;
}

// ---- batches ----------------------------------------------------------------
// §5.1: "Sentence pairs were batched together by approximate sequence length. Each training batch
// contained a set of sentence pairs containing approximately 25000 source tokens and 25000 target
// tokens." An epoch sorts the pairs by length (source, then target, at random among equals),
// cuts them into batches of at most batch_tokens with padding, and visits them in random order.

typedef struct {
    int src_len, tgt_len;
    uint64_t key;   // random, so that pairs of equal lengths come in random order
    int index;
} LengthKey;

static int compare_length_keys(const void *pa, const void *pb) {
    const LengthKey *a = pa;
    const LengthKey *b = pb;
    if (a->src_len != b->src_len)
        return a->src_len < b->src_len ? -1 : 1;
    if (a->tgt_len != b->tgt_len)
        return a->tgt_len < b->tgt_len ? -1 : 1;
    if (a->key != b->key)
        return a->key < b->key ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

// The first `count` pairs, sorted by length into order (among equals by a key drawn from rng,
// or by index), cut into batches of B x (S + T) <= batch_tokens, S and T the longest source and
// target + 1 (a longer pair is a batch of its own). Returns the number of batches (spans).
static int sort_and_cut(int *order, BatchSpan *spans, const Dataset *dataset, int count,
                        int batch_tokens, Rng *rng) {
    LengthKey *keys = checked_calloc(count, sizeof(LengthKey), "batch order");
    for (int i = 0; i < count; i++) {
        const SentencePair *p = &dataset->pairs[i];
        LengthKey key = { p->src_len, p->tgt_len, rng ? rng_next(rng) : 0, i };
        keys[i] = key;
    }
    qsort(keys, count, sizeof(LengthKey), compare_length_keys);
    for (int i = 0; i < count; i++) order[i] = keys[i].index;
    free(keys);

    int num_spans = 0;
    for (int start = 0, n = 0; start < count; start += n) {
        int S = 0;
        int T = 0;
        for (n = 0; start + n < count; n++) {
            const SentencePair *p = &dataset->pairs[order[start + n]];
            int new_S = p->src_len + 1 > S ? p->src_len + 1 : S;
            int new_T = p->tgt_len + 1 > T ? p->tgt_len + 1 : T;
            if (n > 0 && (long)(n + 1) * (new_S + new_T) > batch_tokens)
                break;
            S = new_S;
            T = new_T;
        }
        BatchSpan span = { start, n };
        spans[num_spans] = span;
        num_spans++;
    }
    return num_spans;
}

// Draws the next epoch's batches from rng (on one thread: the same for any thread count).
static void epoch_plan_make(EpochPlan *plan, const Dataset *dataset, int batch_tokens, Rng *rng) {
    plan->order = checked_realloc(plan->order, dataset->count, sizeof(int), "epoch order");
    plan->spans = checked_realloc(plan->spans, dataset->count, sizeof(BatchSpan), "epoch batches");
    plan->num_spans = sort_and_cut(plan->order, plan->spans, dataset, dataset->count, batch_tokens,
                                   rng);
    for (int i = plan->num_spans - 1; i > 0; i--) {   // the Fisher-Yates shuffle of the batches
        int j = rng_below(rng, i + 1);
        BatchSpan swap = plan->spans[i];
        plan->spans[i] = plan->spans[j];
        plan->spans[j] = swap;
    }
}

static void batch_buffer_free(BatchBuffer *bb) {
    free(bb->batch.src);   // the block that holds all five arrays (batch_fill)
    memset(bb, 0, sizeof *bb);
}

// The pairs indices[0..count-1] as a batch. Teacher forcing (§3.1: "the output embeddings are
// offset by one position"): the decoder reads tgt_in = <s> y_1 .. y_n and must predict tgt_out =
// y_1 .. y_n </s>. The source ends with </s> too, as in tensor2tensor and fairseq (the paper does
// not say): the copy task learns faster.
static void batch_fill(BatchBuffer *bb, const Dataset *dataset, const int *indices, int count) {
    size_t B = count;
    size_t S = 1;
    size_t T = 1;
    for (size_t b = 0; b < B; b++) {
        const SentencePair *p = &dataset->pairs[indices[b]];
        S = (size_t)p->src_len + 1 > S ? (size_t)p->src_len + 1 : S;
        T = (size_t)p->tgt_len + 1 > T ? (size_t)p->tgt_len + 1 : T;
    }
    batch_buffer_free(bb);   // then one block of zeros: <pad> wherever no token goes
    int *block = checked_calloc(B * S + B + 2 * B * T + B, sizeof(int), "batch");
    Batch batch = { count, (int)S, (int)T, block, block + B * S, block + B * S + B,
                    block + B * S + B + B * T, block + B * S + B + 2 * B * T };
    bb->batch = batch;
    for (size_t b = 0; b < B; b++) {
        const SentencePair *p = &dataset->pairs[indices[b]];
        const int *x = dataset->tokens + p->src;
        const int *y = dataset->tokens + p->tgt;
        memcpy(batch.src + b * S, x, p->src_len * sizeof(int));
        batch.src[b * S + p->src_len] = TOKEN_EOS;
        batch.src_len[b] = p->src_len + 1;
        batch.tgt_in[b * T] = TOKEN_BOS;
        memcpy(batch.tgt_in + b * T + 1, y, p->tgt_len * sizeof(int));
        memcpy(batch.tgt_out + b * T, y, p->tgt_len * sizeof(int));
        batch.tgt_out[b * T + p->tgt_len] = TOKEN_EOS;
        batch.tgt_len[b] = p->tgt_len + 1;
        bb->tokens += p->src_len + 1 + p->tgt_len + 1;
    }
}

// ---- evaluation -------------------------------------------------------------
// Held-out sources decoded and compared with their references: exact match, and token accuracy
// (positions that agree over the longer of the two; a reference <unk> is never right).

static void evaluation_free(Evaluation *e) {
    free(e->output);
    free(e->output_len);
    memset(e, 0, sizeof *e);
}

// Compares one decoded output with its reference, adding to the counts, and keeps it.
static void evaluation_add(Evaluation *e, const SentencePair *p, const int *reference, int index,
                           const int *output, int output_len) {
    int n = output_len < e->stride ? output_len : e->stride;
    memcpy(e->output + (size_t)index * e->stride, output, n * sizeof(int));
    e->output_len[index] = n;
    int same = 0;
    for (int i = 0; i < output_len && i < p->tgt_len; i++)
        same += output[i] == reference[i] && reference[i] != TOKEN_UNK;
    e->correct += same;
    e->compared += output_len > p->tgt_len ? output_len : p->tgt_len;
    e->exact += same == p->tgt_len && output_len == p->tgt_len;
}

// The first `count` pairs of the dataset (all of them when count <= 0), each source decoded by
// beam search (beam_size 1: greedy decoding) and compared with its reference.
static void evaluate(Evaluation *e, Transformer *model, const Dataset *dataset, int count,
                     int beam_size, double alpha) {
    memset(e, 0, sizeof *e);
    e->sentences = count <= 0 || count > dataset->count ? dataset->count : count;
    e->stride = model->config.max_len;
    e->output = checked_calloc((size_t)e->sentences * e->stride, sizeof(int), "outputs");
    e->output_len = checked_calloc(e->sentences, sizeof(int), "outputs");
    int *src = checked_calloc(e->stride + 1, sizeof(int), "source");
    int *out = checked_calloc(e->stride, sizeof(int), "output");
    for (int i = 0; i < e->sentences; i++) {
        const SentencePair *p = &dataset->pairs[i];
        memcpy(src, dataset->tokens + p->src, p->src_len * sizeof(int));
        src[p->src_len] = TOKEN_EOS;   // the source ends with </s>, as in batch_fill
        int n = transformer_beam_search(model, out, NULL, src, p->src_len + 1, beam_size, alpha);
        evaluation_add(e, p, dataset->tokens + p->tgt, i, out, n);
    }
    free(src);
    free(out);
}

// ---- checkpoints ------------------------------------------------------------
// A checkpoint holds the model (dev/FORMATS.md): a CheckpointHeader (transformer.h) as it lies
// in memory; the vocabulary, each token followed by a line end, id 0 first; the parameters in
// ParameterTensors' order, 4 or 8 bytes each; an FNV-1a checksum (64 bits) of every byte before
// it. Numbers are little-endian, as x86 and ARM keep them (a machine that does not reads a wrong
// version and refuses the file). Another program may write more after the model's bytes; this
// one leaves it be. A save writes PATH.tmp, flushes it to the disk and renames it over PATH.

// The model to f (subwords: 1 for §5.1 subwords); returns 0 when every write succeeded.
static int checkpoint_write_model(FILE *f, const Transformer *model, const Vocabulary *vocab,
                                  int subwords) {
    CheckpointHeader h = { "TCKP", 4, sizeof(real), (uint32_t)subwords, model->config, 0, 0 };
    for (int id = 0; id < vocab->size; id++) h.vocab_bytes += strlen(vocab->words[id]) + 1;
    h.model_bytes = sizeof h + h.vocab_bytes + model->num_parameters * sizeof(real) + 8;
    uint64_t checksum = fnv1a(FNV_OFFSET, &h, sizeof h);
    int failed = fwrite(&h, sizeof h, 1, f) != 1;
    for (int id = 0; id < vocab->size; id++) {   // each token, then a line end
        size_t n = strlen(vocab->words[id]);
        checksum = fnv1a(fnv1a(checksum, vocab->words[id], n), "\n", 1);
        failed = failed || fwrite(vocab->words[id], n, 1, f) != 1 || fputc('\n', f) == EOF;
    }
    size_t params = model->num_parameters * sizeof(real);
    checksum = fnv1a(checksum, model->params_memory, params);
    failed = failed || fwrite(model->params_memory, params, 1, f) != 1;
    return failed || fwrite(&checksum, 8, 1, f) != 1;
}

// The model written to path.tmp, flushed to the disk and renamed over path (never a directory
// or a device): path is always the old checkpoint or the new one.
static const char *checkpoint_save(const char *path, const Transformer *model,
                                   const Vocabulary *vocab) {
    char tmp[4200];
    struct stat there;
    if (stat(path, &there) == 0 && !S_ISREG(there.st_mode))
        return errorf("%s: not a regular file; expected a checkpoint's path", path);
    snprintf(tmp, sizeof tmp, "%.4100s.tmp", path);
    errno = 0;
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return errorf("%s: cannot write: %s; %s was left as it was", tmp, strerror(errno), path);
    int failed = checkpoint_write_model(f, model, vocab, 0) || fflush(f) || fsync(fileno(f));
    failed = fclose(f) || failed || rename(tmp, path);
    if (!failed)
        return NULL;
    remove(tmp);
    return errorf("%s: writing the checkpoint failed: %s; %s was left as it was", tmp,
                  strerror(errno ? errno : EIO), path);
}

// A header read from a file of `size` bytes: "TCKP", the version, the config, the numbers' size
// and the model's bytes against what the config and the vocabulary's bytes give.
static const char *checkpoint_check_header(const CheckpointHeader *h, uint64_t size,
                                           const char *path) {
    const unsigned char *magic = (const unsigned char *)h->magic;
    if (size >= 4 && memcmp(magic, "TCKP", 4) != 0) {
        return errorf("%s: not a transformer.c checkpoint: it starts with bytes %02x %02x %02x "
                      "%02x, expected 'TCKP'", path, magic[0], magic[1], magic[2], magic[3]);
    }
    if (size >= 8 && h->version != 4) {
        return errorf("%s: checkpoint format version %u; transformer.c reads version 4 (make's "
                      "./transformer reads version 3 too)", path, h->version);
    }
    if (size < sizeof *h)
        return errorf("%s: truncated: %llu bytes, inside the header", path, (u64)size);
    const char *error = transformer_config_check(&h->config);
    if (error)
        return errorf("%s: header: %s", path, error);
    if ((h->real_bytes != 4 && h->real_bytes != 8) || h->subwords > 1) {
        return errorf("%s: header: %u-byte numbers, subwords %u; expected 4 or 8, and 0 or 1",
                      path, h->real_bytes, h->subwords);
    }
    size_t sizes[NUM_PARAMETER_TENSORS];
    uint64_t parameters = parameter_sizes(sizes, &h->config);
    uint64_t expected = sizeof *h + h->vocab_bytes + parameters * h->real_bytes + 8;   // checksum
    if (h->vocab_bytes > size || h->model_bytes != expected) {
        return errorf("%s: header: a model of %llu bytes, but its sizes give %llu", path,
                      (u64)h->model_bytes, (u64)expected);
    }
    if (size < expected) {
        return errorf("%s: truncated: %llu bytes, but its header describes %llu", path, (u64)size,
                      (u64)expected);
    }
    return NULL;
}

// The vocabulary's text: V tokens, each ended by a line end; the special tokens first, then
// tokens without white space, each once.
static const char *checkpoint_read_vocabulary(Vocabulary *vocab, const char *text, int V,
                                              size_t bytes, const char *path) {
    const char *token = text;
    for (int id = 0; id < V; id++) {
        const char *end = strchr(token, '\n');   // (text ends in a zero byte: strchr stops there)
        size_t n = end ? (size_t)(end - token) : 0;
        int known = vocab_find(vocab, token, n);
        int ok = n > 0 && (id < NUM_SPECIAL_TOKENS ? known == id : known < 0);
        for (size_t i = 0; i < n && ok; i++) ok = !isspace((unsigned char)token[i]);
        if (!ok) {
            return errorf("%s: vocabulary token %d is %s; expected %s", path, id,
                          known >= 0 && id >= NUM_SPECIAL_TOKENS ? "a repeat" : "not valid",
                          id < NUM_SPECIAL_TOKENS ? special_tokens[id] : "a new token");
        }
        vocab_add(vocab, token, n);
        token = end + 1;
    }
    if (token == text + bytes)
        return NULL;
    return errorf("%s: the vocabulary's %d tokens take %zu bytes; its header says %zu", path, V,
                  (size_t)(token - text), bytes);
}

// The name of the first parameter tensor that holds a NaN or an infinity, or NULL.
static const char *nonfinite_parameter(Transformer *model) {
    real **tensors[NUM_PARAMETER_TENSORS];
    parameter_pointers(tensors, &model->params);
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        for (size_t i = 0; i < model->param_sizes[t]; i++) {
            if (!isfinite((*tensors[t])[i]))
                return parameter_names[t];
        }
    }
    return NULL;
}

// Reads the model at f (a file of `size` bytes) into a new model and vocabulary, each part checked
// as it comes; *subwords gets its flag; f is left after the model. On an error the caller frees.
static const char *checkpoint_read_model(FILE *f, uint64_t size, Transformer *model,
                                         Vocabulary *vocab, int *subwords, const char *path) {
    CheckpointHeader h;
    memset(&h, 0, sizeof h);
    memset(model, 0, sizeof *model);
    vocab_init(vocab);
    int failed = fread(&h, sizeof h, 1, f) != 1;
    const char *error = checkpoint_check_header(&h, size, path);
    if (error)
        return error;
    char *text = checked_calloc(h.vocab_bytes + 1, 1, "checkpoint vocabulary");
    failed = failed || fread(text, h.vocab_bytes, 1, f) != 1;
    error = checkpoint_read_vocabulary(vocab, text, h.config.vocab_size, h.vocab_bytes, path);
    uint64_t hash = fnv1a(fnv1a(FNV_OFFSET, &h, sizeof h), text, h.vocab_bytes);
    free(text);
    if (!error)
        error = transformer_build(model, &h.config, 1);
    if (error)
        return error;
    *subwords = (int)h.subwords;
    // the parameters, as written (float or double), then as this build's numbers
    size_t params = model->num_parameters * h.real_bytes;
    unsigned char *raw = checked_calloc(params, 1, "parameters");
    uint64_t checksum = 0;
    failed = failed || fread(raw, params, 1, f) != 1 || fread(&checksum, 8, 1, f) != 1;
    hash = fnv1a(hash, raw, params);
    for (size_t i = 0; i < model->num_parameters; i++) {
        float single;
        double x;
        memcpy(h.real_bytes == 4 ? (void *)&single : (void *)&x, raw + i * h.real_bytes,
               h.real_bytes);
        model->params_memory[i] = h.real_bytes == 4 ? (real)single : (real)x;
    }
    free(raw);
    if (failed)
        return errorf("%s: read error: %s", path, strerror(errno ? errno : EIO));
    if (checksum != hash)
        return errorf("%s: checksum mismatch: the file is damaged", path);
    const char *nonfinite = nonfinite_parameter(model);
    return nonfinite ? errorf("%s: %s holds a number that is not finite", path, nonfinite) : NULL;
}

// A checkpoint of whole words into a new model and vocabulary (on an error, nothing allocated).
static const char *checkpoint_load(const char *path, Transformer *model, Vocabulary *vocab) {
    struct stat st;
    int subwords = 0;
    const char *error = NULL;
    memset(model, 0, sizeof *model);
    memset(vocab, 0, sizeof *vocab);
    FILE *f = fopen(path, "rb");
    if (!f)
        return errorf("%s: cannot open: %s", path, strerror(errno));
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode))
        error = errorf("%s: not a regular file", path);
    if (!error)
        error = checkpoint_read_model(f, (uint64_t)st.st_size, model, vocab, &subwords, path);
    if (!error && subwords) {
        error = errorf("%s: its tokens are §5.1 subwords, which transformer.c alone does not cut "
                       "text into; expected make's ./transformer", path);
    }
    fclose(f);
    if (error) {
        transformer_free(model);
        vocab_free(vocab);
    }
    return error;
}

// ---- train ------------------------------------------------------------------
// train makes a task's pairs and a model of the sizes its flags ask for, then takes --steps
// steps (§5), and every eval_every steps (and at the end) evaluates and saves the checkpoint.

// The copy task on 0..9, 1 to 10 of them (10,000 pairs, 200 held out); 0.2 million parameters;
// §5.4's dropout and label smoothing; a peak lr above the paper's 7e-4, as small models allow.
static const TrainOptions train_defaults = {
    .task = "copy", .words = 10, .min_length = 1, .max_length = 10, .train_size = 10000,
    .valid_size = 200, .layers = 2, .d_model = 64, .d_ff = 256, .heads = 4,
    .positional = POSITIONAL_SINUSOID, .dropout = 0.1, .label_smoothing = 0.1, .steps = 1500,
    .warmup = 50, .batch_tokens = 600, .seed = 1, .lr = 2e-3, .eval_every = 250, .log_every = 50,
    .eval_size = 500, .show = 5,
};

// train's flags: the task, Table 3's sizes, §5.3's schedule, §5.1's batches.
static int train_option_table(Option *table, TrainOptions *o) {
    Option list[] = {
        TEXT_OPTION("--task", &o->task, "built-in task, copy or reverse"),
        INT_OPTION("--layers", &o->layers, 1, TRANSFORMER_MAX_LAYERS,
                   "N, layers in the encoder and in the decoder"),
        INT_OPTION("--d-model", &o->d_model, 1, TRANSFORMER_MAX_WIDTH, "d_model"),
        INT_OPTION("--d-ff", &o->d_ff, 1, TRANSFORMER_MAX_WIDTH,
                   "d_ff, the feed-forward inner width"),
        INT_OPTION("--heads", &o->heads, 1, TRANSFORMER_MAX_WIDTH, "h, attention heads"),
        INT_OPTION("--steps", &o->steps, 1, MAX_TRAINING_STEPS, "training steps"),
        NUMBER_OPTION("--lr", &o->lr, 0, DBL_MAX, 1,
                      "peak learning rate: eq. 3 of §5.3 scaled to reach it at step --warmup"),
        INT_OPTION("--warmup", &o->warmup, 1, 1000000000, "warmup_steps of eq. 3"),
        INT_OPTION("--batch-tokens", &o->batch_tokens, 1, 100000000,
                   "tokens per batch, source + target, padding included"),
        INT_OPTION("--seed", &o->seed, 0, INT_MAX,
                   "seed of the data, the initial weights and dropout"),
        TEXT_OPTION("--checkpoint", &o->checkpoint, "checkpoint file (default runs/TASK.ckpt)"),
    };
    memcpy(table, list, sizeof list);
    return (int)(sizeof list / sizeof *list);
}

static const char *train_usage =
    "usage: ./transformer train [--task copy|reverse] [options]\n"
    "Trains a Transformer on the copy or the reverse task (§5.3's Adam and warm-up, §5.4's\n"
    "dropout and label smoothing), evaluating on held-out sequences and saving checkpoints.";

// The seam where a program may take the training steps elsewhere (transformer.h); here they
// are transformer_train_step's, where the parameters are, with nothing to copy.
static void cpu_training_nothing_to_copy(Transformer *model) {
    (void)model;
}

const TrainingCompute transformer_cpu_training = {
    "transformer.c", cpu_training_nothing_to_copy, transformer_train_step,
    cpu_training_nothing_to_copy,
};
const TrainingCompute *transformer_training = &transformer_cpu_training;

uint64_t transformer_dropout_key(Transformer *model) {
    return rng_next(&model->dropout_rng);
}

// The task's vocabulary, and its training and held-out pairs.
static const char *train_load_task(TrainRun *run) {
    const TrainOptions *o = &run->opt;
    int task = strcmp(o->task, "copy") == 0 ? TASK_COPY : TASK_REVERSE;
    if (task == TASK_REVERSE && strcmp(o->task, "reverse") != 0)
        return errorf("--task '%s' is not a task; expected copy or reverse", o->task);
    task_vocabulary(&run->vocab, o->words);
    snprintf(run->data_name, sizeof run->data_name, "%s task", o->task);
    return task_generate(&run->train, &run->valid, task, o->words, o->min_length, o->max_length,
                         o->train_size, o->valid_size, (uint64_t)o->seed);
}

// A model of the sizes the options ask for, with positions for the longest pair + 50 (§6.1),
// and the generator of the batches' order.
static const char *train_build_model(TrainRun *run) {
    const TrainOptions *o = &run->opt;
    const Dataset *train = &run->train;
    int longest = train->longest_src > train->longest_tgt ? train->longest_src : train->longest_tgt;
    TransformerConfig config = transformer_default_config();
    config.n_layers = o->layers;
    config.d_model = o->d_model;
    config.d_ff = o->d_ff;
    config.n_heads = o->heads;
    config.vocab_size = run->vocab.size;
    config.max_len = o->positions ? o->positions : longest + 1 + 50;
    config.max_len = config.max_len < TRANSFORMER_MAX_LEN ? config.max_len : TRANSFORMER_MAX_LEN;
    config.positional = o->positional;
    config.dropout = (float)o->dropout;
    config.label_smoothing = (float)o->label_smoothing;
    const char *error = transformer_build(&run->model, &config, (uint64_t)o->seed);
    rng_seed(&run->data_rng, (uint64_t)o->seed ^ 0xDA7A0DE5ULL);
    return error ? errorf("model: %s", error) : NULL;
}

// The checkpoint's path, runs/TASK.ckpt unless --checkpoint says; a save replaces nothing there
// but a checkpoint (a file that starts with "TCKP"). Checked before any training.
static const char *train_prepare_output(TrainRun *run) {
    const char *path = run->opt.checkpoint;
    size_t most = sizeof run->checkpoint_path - 6;   // room for ".tmp"
    if (path && (strlen(path) == 0 || strlen(path) > most))
        return errorf("--checkpoint '%.40s': expected a file's path of 1 to %zu bytes", path, most);
    if (!path && mkdir("runs", 0777) != 0 && errno != EEXIST)
        return errorf("runs/: cannot create: %s", strerror(errno));
    snprintf(run->checkpoint_path, sizeof run->checkpoint_path, path ? "%s" : "runs/%s.ckpt",
             path ? path : run->opt.task);
    char magic[4] = "";
    FILE *f = fopen(run->checkpoint_path, "rb");
    if (!f)
        return NULL;   // nothing there
    size_t got = fread(magic, 1, 4, f);
    fclose(f);
    if (got == 4 && memcmp(magic, "TCKP", 4) == 0)
        return NULL;
    return errorf("%s is already there and is not a checkpoint; expected another --checkpoint",
                  run->checkpoint_path);
}

// Greedy decoding of held-out pairs: token accuracy and exact match; at the end, a few examples.
static void train_evaluate(TrainRun *run, int final) {
    Evaluation e;
    evaluate(&e, &run->model, &run->valid, run->opt.eval_size, 1, 0.6);
    double exact = 100.0 * e.exact / e.sentences;
    double accuracy = 100.0 * e.correct / (e.compared ? e.compared : 1);
    printf("eval   step %ld | token accuracy %.1f%% | exact match %.1f%% (%d/%d)\n",
           run->model.adam_step, accuracy, exact, e.exact, e.sentences);
    for (int i = 0; final && i < run->opt.show && i < e.sentences; i++) {
        const SentencePair *p = &run->valid.pairs[i];
        const int *reference = run->valid.tokens + p->tgt;
        const int *output = e.output + (size_t)i * e.stride;
        int same = e.output_len[i] == p->tgt_len &&
                   memcmp(output, reference, (size_t)p->tgt_len * sizeof(int)) == 0;
        printf(i == 0 ? "held-out examples, greedy decoding:\n  source     " : "  source     ");
        print_tokens(stdout, &run->vocab, run->valid.tokens + p->src, p->src_len);
        printf("\n  reference  ");
        print_tokens(stdout, &run->vocab, reference, p->tgt_len);
        printf("\n  output     ");
        print_tokens(stdout, &run->vocab, output, e.output_len[i]);
        printf("   (%s)\n", same ? "exact" : "WRONG");
    }
    if (final) {
        printf("exact match on %d held-out sequences never seen in training: %.1f%% (%d/%d)\n",
               e.sentences, exact, e.exact, e.sentences);
    }
    fflush(stdout);
    evaluation_free(&e);
}

// A line of progress, with the time left at the rate so far:
//   step   400/1500 | loss 0.8978 | lr 1.06e-03 |   15.6k tok/s | elapsed 14 s | left 38 s
static void print_progress(const TrainRun *run, double start, double tokens_per_s) {
    long step = run->model.adam_step;
    double elapsed = wall_seconds() - start;
    double left = elapsed / step * (run->opt.steps - step);
    printf("step %5ld/%d | loss %.4f | lr %.2e | %6.1fk tok/s | elapsed %.0f s | left %.0f s\n",
           step, run->opt.steps, (double)run->loss, run->lr, tokens_per_s / 1000, elapsed, left);
    fflush(stdout);
}

// The next batch of the epoch's plan, drawing a new epoch's plan when the last is used up.
static void train_next_batch(TrainRun *run) {
    if (run->epoch == 0 || run->epoch_batches == run->plan.num_spans) {
        epoch_plan_make(&run->plan, &run->train, run->opt.batch_tokens, &run->data_rng);
        run->epoch++;
        run->epoch_batches = 0;
    }
    BatchSpan span = run->plan.spans[run->epoch_batches];
    run->epoch_batches++;
    batch_fill(&run->batch, &run->train, run->plan.order + span.start, span.count);
}

// A loss or a parameter that is NaN or infinite stops training, before a save could replace a
// good checkpoint with it. Returns that error, or NULL.
static const char *diverged_error(TrainRun *run) {
    const char *nonfinite = isfinite(run->loss) ? nonfinite_parameter(&run->model) : "the loss";
    if (!nonfinite)
        return NULL;
    return errorf("step %ld: %s is not finite: training stopped (try a lower --lr); %s was not "
                  "overwritten", run->model.adam_step, nonfinite, run->checkpoint_path);
}

// The training loop (§5). Each step goes through the TrainingCompute seam: transformer_train_step
// here, or a GPU's, which copies the model back to the host for each evaluation and save.
static const char *train_loop(TrainRun *run) {
    TrainOptions *o = &run->opt;
    Transformer *model = &run->model;
    // eq. 3 peaks at step = warmup with d_model^-0.5 warmup^-0.5: this factor makes the peak --lr.
    double factor = o->lr * sqrt((double)model->config.d_model * o->warmup);
    const TrainingCompute *compute = transformer_training;
    compute->begin(model);
    double start = wall_seconds();
    double last_time = start;
    long tokens = 0;
    const char *error = NULL;
    while (!error && model->adam_step < o->steps) {
        train_next_batch(run);
        long step = model->adam_step + 1;
        model->training = 1;
        run->loss = compute->train_step(model, &run->batch.batch, o->warmup, factor);
        run->lr = transformer_learning_rate(step, model->config.d_model, o->warmup, factor);
        tokens += run->batch.tokens;
        if (step % o->log_every == 0 || step == o->steps) {
            double now = wall_seconds();
            print_progress(run, start, tokens / (now - last_time + 1e-9));
            last_time = now;
            tokens = 0;
        }
        error = isfinite(run->loss) ? NULL : diverged_error(run);

        // an evaluation and a save, of the model on the host (tokens/s counts the steps' time)
        if (!error && (step % o->eval_every == 0 || step == o->steps)) {
            compute->to_host(model);
            double eval_start = wall_seconds();
            train_evaluate(run, step == o->steps);
            error = diverged_error(run);
            if (!error)
                error = checkpoint_save(run->checkpoint_path, model, &run->vocab);
            last_time += wall_seconds() - eval_start;
        }
    }
    if (!error) {
        printf("trained steps 1..%ld in %.1f s; checkpoint %s\n", model->adam_step,
               wall_seconds() - start, run->checkpoint_path);
    }
    return error;
}

static int command_train(int argc, char **argv) {
    TrainRun *run = checked_calloc(1, sizeof(TrainRun), "training run");
    Option options[16];
    run->opt = train_defaults;
    int num_options = train_option_table(options, &run->opt);
    int status = parse_options("train", train_usage, options, num_options, argc, argv, NULL,
                               NULL);
    const char *error = status == 0 ? train_load_task(run) : NULL;
    if (status == 0 && !error)
        error = train_build_model(run);
    if (status == 0 && !error)
        error = train_prepare_output(run);
    if (status == 0 && !error) {
        const TransformerConfig *config = &run->model.config;
        printf("data   %s: %d training pairs, %d held-out, vocabulary %d\n", run->data_name,
               run->train.count, run->valid.count, run->vocab.size);
        printf("model  N=%d d_model=%d d_ff=%d h=%d max_len=%d: %zu parameters\n",
               config->n_layers, config->d_model, config->d_ff, config->n_heads, config->max_len,
               run->model.num_parameters);
        printf("train  %d steps, peak lr %g at step %d (§5.3), batches <= %d tokens; "
               "checkpoints to %s\n", run->opt.steps, run->opt.lr, run->opt.warmup,
               run->opt.batch_tokens, run->checkpoint_path);
        error = train_loop(run);
    }
    if (error)
        fprintf(stderr, "error: train: %s\n", error);
    vocab_free(&run->vocab);
    dataset_free(&run->train);
    dataset_free(&run->valid);
    transformer_free(&run->model);
    free(run->plan.order);
    free(run->plan.spans);
    batch_buffer_free(&run->batch);
    free(run);
    return status == 2 ? 0 : status != 0 || error != NULL;
}

// ---- decode -----------------------------------------------------------------
// decode translates the sentences on its command line with a checkpoint (§6.1), a line each.

// Decodes one sentence and prints the output. Returns 0, or 1 after a one-line error (too
// long, or a special token in the text); the other sentences are still decoded.
static int decode_sentence(Transformer *model, Vocabulary *vocab, const char *text,
                           TextSource *from, int beam) {
    int *ids = NULL;
    size_t capacity = 0;
    int n = tokenize(text, vocab, 0, &ids, &capacity, from);
    int most = model->config.max_len - 1;   // one position is </s>
    const char *error = n < 0 ? reserved_token_error(from) : NULL;
    if (n > most) {
        error = errorf("%s: the sentence has %d tokens; the model's maximum length %d allows %d "
                       "(one position is </s>)", from->where, n, most + 1, most);
    }
    if (!error) {
        push_id(&ids, &capacity, n, TOKEN_EOS);   // the source ends with </s>, as in batch_fill
        int *out = checked_calloc(transformer_decode_limit(model, n + 1), sizeof(int), "output");
        int out_len = transformer_beam_search(model, out, NULL, ids, n + 1, beam, 0.6);   // §6.1
        print_tokens(stdout, vocab, out, out_len);
        printf("\n");
        free(out);
    }
    free(ids);
    fflush(stdout);
    if (error)
        fprintf(stderr, "error: decode: %s\n", error);
    return error != NULL;
}

static const char *decode_usage =
    "usage: ./transformer decode --checkpoint FILE [--beam 4] 'SENTENCE' ...\n"
    "Translates each SENTENCE (tokens separated by white space), a line each: greedy decoding,\n"
    "or beam search with --beam, at most source length + 50 tokens (§6.1). A sentence it cannot\n"
    "take (too long, a reserved token) gets an error line; then exit status 1.";

static int command_decode(int argc, char **argv) {
    const char *checkpoint = NULL;
    int beam = 1;
    Option options[] = {
        TEXT_OPTION("--checkpoint", &checkpoint, "the trained model (required)"),
        INT_OPTION("--beam", &beam, 1, 1000, "beam size; 1 is greedy decoding (the paper used 4)"),
    };
    char **sentences = checked_calloc(argc, sizeof(char *), "arguments");
    int num_sentences = 0;
    int status = parse_options("decode", decode_usage, options, 2, argc, argv, sentences,
                               &num_sentences);
    Transformer model = { 0 };
    Vocabulary vocab = { 0 };
    const char *error = "--checkpoint FILE is required (a model written by ./transformer train)";
    if (checkpoint && num_sentences == 0)
        error = "no sentence to decode; expected one or more, such as '3 1 4'";
    else if (checkpoint)
        error = checkpoint_load(checkpoint, &model, &vocab);
    if (status == 0 && error)
        fprintf(stderr, "error: decode: %s\n", error);

    TextSource from = { "", 0, 0, NULL };
    int refused = 0;
    for (int i = 0; status == 0 && !error && i < num_sentences; i++) {
        snprintf(from.where, sizeof from.where, "argument %d", i + 1);
        refused += decode_sentence(&model, &vocab, sentences[i], &from, beam);
    }
    free(sentences);
    transformer_free(&model);
    vocab_free(&vocab);
    return status == 2 ? 0 : status != 0 || error != NULL || refused != 0;
}

// ==== main: the table of contents ============================================
//   ./transformer train    learn the copy or the reverse task (§5)
//   ./transformer decode   translate with a checkpoint (§6.1)

static const Command commands[] = {
    { "train", command_train, "train on a built-in task (--task copy|reverse)" },
    { "decode", command_decode,
      "decode sentences with a checkpoint: greedy, or beam search (--beam 4)" },
};

static int print_usage(FILE *f, const Command *table, int count) {
    fprintf(f, "usage: ./transformer COMMAND [options]   "
               "(./transformer COMMAND --help for its options)\n");
    for (int i = 0; i < count; i++) fprintf(f, "  %-9s %s\n", table[i].name, table[i].summary);
    fprintf(f, "example: ./transformer train --task copy && "
               "./transformer decode --checkpoint runs/copy.ckpt \"3 1 4 1 5\"\n");
    return f == stderr;
}

// Runs the command argv[1] of the table; returns 0, or 1 after a one-line error.
static int run_command(const Command *table, int count, int argc, char **argv) {
    if (argc < 2)
        return print_usage(stderr, table, count);
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0)
        return print_usage(stdout, table, count);
    for (int i = 0; i < count; i++) {
        if (strcmp(name, table[i].name) != 0)
            continue;
        snprintf(error_context, sizeof error_context, "%s: ", name);
        int status = table[i].run(argc - 1, argv + 1);
        error_context[0] = '\0';
        // The output may be lost at the end (a full disk): that is an error too. errno is cleared
        // first, so that a reason given is this flush's own.
        errno = 0;
        if (status != 0 || (fflush(stdout) == 0 && !ferror(stdout)))
            return status;
        const char *reason = errno ? strerror(errno) : "an earlier write to standard output failed";
        fprintf(stderr, "error: %s: writing the output failed: %s\n", name, reason);
        return 1;
    }
    fprintf(stderr, "error: unknown command '%s'; expected", name);
    for (int i = 0; i < count; i++) {
        const char *separator = i == 0 ? "" : i + 1 == count ? " or" : ",";
        fprintf(stderr, "%s %s", separator, table[i].name);
    }
    fprintf(stderr, " (see ./transformer --help)\n");
    return 1;
}

int transformer_main(int argc, char **argv) {
    return run_command(commands, (int)(sizeof commands / sizeof *commands), argc, argv);
}

#ifndef TRANSFORMER_NO_MAIN
int main(int argc, char **argv) {
    return transformer_main(argc, argv);
}
#endif
