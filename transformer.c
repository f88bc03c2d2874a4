/* transformer.c: the Transformer of "Attention Is All You Need" in plain C
 *
 * Vaswani, Shazeer, Parmar, Uszkoreit, Jones, Gomez, Kaiser, Polosukhin,
 * NeurIPS 2017, arXiv 1706.03762. The whole encoder-decoder model, its
 * hand-derived backward pass and the paper's Adam schedule, one loop at a
 * time, and the smallest program that trains it and translates with it.
 *
 * BUILD  cc -O2 transformer.c -lm   this file alone: train, decode, eval, in the plain loops below
 *        make                       ./transformer: this file with its companions in lab/ (the fast path,
 *                                   a training step about 12 times faster; §5.1 subwords, --resume, logs,
 *                                   pictures, Table 3, the benchmark); OpenMP on
 *        make debug                 -O0 -g, this file alone without OpenMP: gdb's `next` walks every loop
 * TEST   make test
 * RUN    ./transformer train --task copy && ./transformer decode --checkpoint runs/copy.ckpt "3 1 4"
 * USE    as a library: transformer.h (compile with -DTRANSFORMER_NO_MAIN)
 * READ   from the top, beside the paper (NOTES.md has a reading path):
 *   PART I   THE MODEL, in plain loops: the building blocks first, each under
 *            its section of the paper (§3 linear layers to §5.4 the loss), then
 *            the §3.1 stacks built from them, the whole model forward and
 *            backward, §5.3 Adam, §5 the training step, §6.1 decoding (greedy
 *            with a key/value cache, beam search); last the machinery
 *            (memory, random numbers, parameter tables).
 *   PART II  THE PROGRAM: data (copy and reverse tasks, TSV files, batches by
 *            length), evaluation and BLEU, checkpoints, the commands train,
 *            decode and eval, main; and the hooks where lab/ plugs in.
 * CONVENTIONS
 *   Every layer is a `*_forward` function followed by its `*_backward`, arguments outputs
 *   first, then inputs, then sizes. A backward function quotes the forward line it
 *   differentiates and ACCUMULATES (+=) into its gradient outputs; the caller zeroes them.
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

// The fast path (lab/fast_path.c, in make's ./transformer) plugs in here: linear_forward, linear_backward,
// attention_forward and attention_backward hand it their call on their first line; decoder_cache_init and
// _free tell it when decoding begins and ends. Left NULL (transformer.c alone), the loops you read run.
static FastPath fast_path;

// ==== §3  Linear layers: y = x W^T + b =======================================
// The four projections of multi-head attention (§3.2.2), the two of the FFN
// (§3.3) and the pre-softmax projection (§3.4): nearly all of a training step's
// arithmetic (the fast path does the same sums many times faster).

// out is (N, OC), inp is (N, IC), weight is (OC, IC), bias is (OC) or NULL
static void linear_forward(real *out, const real *inp, const real *weight, const real *bias, int N, int IC, int OC) {
    if (fast_path.linear_forward) { fast_path.linear_forward(out, inp, weight, bias, N, IC, OC); return; }
    #pragma omp parallel for
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            // out[n,o] = bias[o] + sum_i inp[n,i] * weight[o,i]
            real sum = 0;
            for (int i = 0; i < IC; i++) sum += inp[(size_t)n * IC + i] * weight[(size_t)o * IC + i];
            out[(size_t)n * OC + o] = (bias ? bias[o] : 0) + sum;
        }
}

// Differentiates  out[n,o] = bias[o] + sum_i inp[n,i] * weight[o,i]:
//   dinp[n,i]    += sum_o dout[n,o] * weight[o,i]      (dinp = dout W)
//   dweight[o,i] += sum_n dout[n,o] * inp[n,i]         (dW = dout^T inp)
//   dbias[o]     += sum_n dout[n,o]
// dinp or dbias may be NULL when not wanted.
static void linear_backward(real *dinp, real *dweight, real *dbias, const real *dout, const real *inp,
                            const real *weight, int N, int IC, int OC) {
    if (fast_path.linear_backward) { fast_path.linear_backward(dinp, dweight, dbias, dout, inp, weight, N, IC, OC); return; }
    if (dinp) {
        // row n of dinp: the rows of the weight, each times dout[n,o]
        #pragma omp parallel for
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) {
                real dout_no = dout[(size_t)n * OC + o];
                for (int i = 0; i < IC; i++) dinp[(size_t)n * IC + i] += dout_no * weight[(size_t)o * IC + i];
            }
    }
    // row o of dweight: the rows of inp, each times dout[n,o]; dbias[o] their weights' sum
    #pragma omp parallel for
    for (int o = 0; o < OC; o++)
        for (int n = 0; n < N; n++) {
            real dout_no = dout[(size_t)n * OC + o];
            for (int i = 0; i < IC; i++) dweight[(size_t)o * IC + i] += dout_no * inp[(size_t)n * IC + i];
            if (dbias) dbias[o] += dout_no;
        }
}

// ==== §3.1  Residual connection, dropout and layer normalisation =============
// "The output of each sub-layer is LayerNorm(x + Sublayer(x))" (§3.1), and
// "we apply dropout to the output of each sub-layer, before it is added to
// the sub-layer input and normalized" (§5.4). So every sub-layer ends with
//     res = x + Dropout(sublayer_out);   out = LayerNorm(res)

// From the machinery at the end of Part I: our own random numbers
static uint64_t rng_next(Rng *rng);            // xorshift64*
static uint64_t hash64(uint64_t z);            // splitmix64's mixer
static double unit_interval(uint64_t bits);    // [0, 1) from 53 random bits

// A dropout mask: each element kept with probability 1 - p_drop and scaled by 1/(1 - p_drop)
// ("inverted dropout": evaluation needs no rescaling); all ones with training off or p_drop = 0.
// Element i is decided by hash64(key + i), the key one number from the model's generator: drawn in
// parallel, a seed gives the same masks whatever the thread count.
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
static void layernorm_row_forward(real *y, real *mean, real *rstd, const real *x, const real *gain, const real *bias,
                                  int C, float eps) {
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
//     res = residual + sublayer * mask;   out = LayerNorm(res)
// out, res, residual, sublayer, mask are (N,C), mean and rstd (N), gain and bias (C).
static void residual_layernorm_forward(real *out, real *mean, real *rstd, real *res, const real *residual,
                                       const real *sublayer, const real *mask, const real *gain, const real *bias,
                                       int N, int C, float eps) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        size_t row = (size_t)n * C;
        for (int i = 0; i < C; i++) res[row + i] = residual[row + i] + sublayer[row + i] * mask[row + i];
        layernorm_row_forward(out + row, &mean[n], &rstd[n], res + row, gain, bias, C, eps);
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
// dresidual and dsublayer (N,C) accumulate, and must not alias dout.
static void residual_layernorm_backward(real *dresidual, real *dsublayer, real *dgain, real *dbias, const real *dout,
                                        const real *res, const real *mask, const real *gain, const real *mean,
                                        const real *rstd, int N, int C) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        size_t row = (size_t)n * C;
        real mean_dxhat = 0, mean_dxhat_xhat = 0;
        for (int i = 0; i < C; i++) {
            real dxhat = dout[row + i] * gain[i];
            mean_dxhat += dxhat;
            mean_dxhat_xhat += dxhat * (res[row + i] - mean[n]) * rstd[n];
        }
        mean_dxhat /= C;
        mean_dxhat_xhat /= C;
        for (int i = 0; i < C; i++) {
            real xhat = (res[row + i] - mean[n]) * rstd[n];
            real dres = rstd[n] * (dout[row + i] * gain[i] - mean_dxhat - xhat * mean_dxhat_xhat);
            dresidual[row + i] += dres;
            dsublayer[row + i] += dres * mask[row + i];
        }
    }
    // gain and bias are shared by all rows: their gradients sum over the rows
    for (int n = 0; n < N; n++) {
        size_t row = (size_t)n * C;
        for (int i = 0; i < C; i++) {
            dgain[i] += dout[row + i] * (res[row + i] - mean[n]) * rstd[n];
            dbias[i] += dout[row + i];
        }
    }
}

// ==== §3.2.1  Scaled dot-product attention ===================================
//     Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V                 (eq. 1)
// One head at a time. For query i the scores over keys j are
//     s_ij = q_i . k_j / sqrt(d_k),   p_ij = exp(s_ij) / sum_j' exp(s_ij'),
//     out_i = sum_j p_ij v_j
// Why divide by sqrt(d_k)? "We suspect that for large values of d_k, the dot products grow large in
// magnitude, pushing the softmax function into regions where it has extremely small gradients."
// Footnote 4: if the components of q and k are independent with mean 0 and variance 1, q . k (a sum
// of d_k products of variance 1) has variance d_k: scores sqrt(d_k) apart (8 for the base model's
// d_k = 64) put nearly all the probability on one key, where the gradient p_j ([j == k] - p_k) is
// nearly 0. Dividing by sqrt(d_k) brings the variance back to 1, whatever the head size.
//
// Masking (§3.2.3): keys j >= key_len[b] are padding and, in the decoder's
// self-attention, keys j > i are "illegal connections" to the future. Both
// get p_ij = 0, exactly what s_ij = -inf before the softmax gives.
//
//   causal mask (decoder self-attention, T = 4, sentence length 3):
//              key  0  1  2  3(pad)
//     query 0       x  .  .  .         x: attended
//     query 1       x  x  .  .         .: probability 0
//     query 2       x  x  x  .
//     query 3(pad)  x  x  x  .         (a padded query's output is never used)
//
// The query of row (b, i) starts at q + (b*Tq + i)*q_stride, its head `head`
// at column head*d_k; keys and values likewise with kv_stride: Q, K, V are read
// straight out of the fused (B, T, 3C) projection without copying.

// How many keys (the first ones) query i may attend to: key_len, its own
// sentence's, and with the causal mask only positions 0..i.
static int visible_keys(int i, int key_len, int causal) {
    return (causal && i + 1 < key_len) ? i + 1 : key_len;
}

// The scores p[0..visible-1] become their softmax, the masked p[visible..Tk-1]
// exactly 0. With the largest score subtracted first every exp(s_j - largest) is
// in (0, 1] and the sum cannot overflow. A row with no visible key stays 0, not NaN.
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

// Differentiates  p_j = softmax_j(s_j)  over a row of n keys. Its Jacobian
// is dp_j/ds_k = p_j ([j == k] - p_k), so
//     ds_j = sum_k dp_k p_k ([k == j] - p_j) = p_j (dp_j - sum_k p_k dp_k)
// In place: the row grad (n) holds dp and becomes ds. A masked key has
// p_j = 0 and so gets ds_j = 0: the masks need no code here.
static void softmax_backward(real *grad, const real *p, int n) {
    real sum_p_dp = 0;
    for (int j = 0; j < n; j++) sum_p_dp += p[j] * grad[j];
    for (int j = 0; j < n; j++) grad[j] = p[j] * (grad[j] - sum_p_dp);
}

// out is (B, Tq, C), att is (B, NH, Tq, Tk) (the probabilities, kept for
// the backward pass), key_len is (B); causal: the decoder's mask.
static void attention_forward(real *out, real *att, const real *q, const real *k, const real *v, int q_stride,
                              int kv_stride, const int *key_len, int causal, int B, int Tq, int Tk, int C, int NH) {
    if (fast_path.attention_forward) {
        fast_path.attention_forward(out, att, q, k, v, q_stride, kv_stride, key_len, causal, B, Tq, Tk, C, NH);
        return;
    }
    int d_k = C / NH;
    real scale = 1 / real_sqrt((real)d_k);
    // one thread per (b, head, i): it alone writes query i's probabilities and the head's columns of out_i
    #pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++) {
        for (int head = 0; head < NH; head++) {
            for (int i = 0; i < Tq; i++) {
                int visible = visible_keys(i, key_len[b], causal);   // both masks
                const real *q_i = q + ((size_t)b * Tq + i) * q_stride + head * d_k;
                real *p = att + (((size_t)b * NH + head) * Tq + i) * Tk;
                // s_ij = q_i . k_j / sqrt(d_k)
                for (int j = 0; j < visible; j++) {
                    const real *k_j = k + ((size_t)b * Tk + j) * kv_stride + head * d_k;
                    real dot = 0;
                    for (int d = 0; d < d_k; d++) dot += q_i[d] * k_j[d];
                    p[j] = dot * scale;
                }
                // p_ij = softmax_j(s_ij), and 0 for the masked keys
                softmax_visible(p, visible, Tk);
                // out_i = sum_j p_ij v_j
                real *out_i = out + ((size_t)b * Tq + i) * C + head * d_k;
                for (int d = 0; d < d_k; d++) out_i[d] = 0;
                for (int j = 0; j < visible; j++) {
                    const real *v_j = v + ((size_t)b * Tk + j) * kv_stride + head * d_k;
                    for (int d = 0; d < d_k; d++) out_i[d] += p[j] * v_j[d];
                }
            }
        }
    }
}

// Differentiates, for each head and query i:
//   out_i = sum_j p_ij v_j         =>  dp_ij = dout_i . v_j,   dv_j += p_ij dout_i
//   p_ij  = softmax_j(s_ij)        =>  ds_ij = p_ij (dp_ij - sum_j' p_ij' dp_ij')  (softmax_backward)
//   s_ij  = q_i . k_j / sqrt(d_k)  =>  dq_i += ds_ij k_j / sqrt(d_k),
//                                      dk_j += ds_ij q_i / sqrt(d_k)
// dq, dk, dv have the strides of q, k, v. A masked key has p_ij = 0, so ds_ij = 0
// and it gets exactly zero gradient: the masks are in the saved probabilities.
static void attention_backward(real *dq, real *dk, real *dv, const real *dout, const real *att, const real *q,
                               const real *k, const real *v, int q_stride, int kv_stride, int B, int Tq, int Tk,
                               int C, int NH) {
    if (fast_path.attention_backward) {
        fast_path.attention_backward(dq, dk, dv, dout, att, q, k, v, q_stride, kv_stride, B, Tq, Tk, C, NH);
        return;
    }
    int d_k = C / NH;
    real scale = 1 / real_sqrt((real)d_k);
    // one thread per (b, head): it alone writes that head's columns of dq, dk, dv
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int head = 0; head < NH; head++) {
            for (int i = 0; i < Tq; i++) {
                const real *p = att + (((size_t)b * NH + head) * Tq + i) * Tk;
                const real *q_i = q + ((size_t)b * Tq + i) * q_stride + head * d_k;
                const real *dout_i = dout + ((size_t)b * Tq + i) * C + head * d_k;
                real *dq_i = dq + ((size_t)b * Tq + i) * q_stride + head * d_k;
                real ds[Tk];   // dp_ij for this query, then ds_ij
                // dp_ij = dout_i . v_j,  dv_j += p_ij dout_i
                for (int j = 0; j < Tk; j++) {
                    const real *v_j = v + ((size_t)b * Tk + j) * kv_stride + head * d_k;
                    real *dv_j = dv + ((size_t)b * Tk + j) * kv_stride + head * d_k;
                    real dot = 0;
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
                    const real *k_j = k + ((size_t)b * Tk + j) * kv_stride + head * d_k;
                    real *dk_j = dk + ((size_t)b * Tk + j) * kv_stride + head * d_k;
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
// Why several heads of d_k = d_model / h each, rather than one of d_model? "Multi-head attention
// allows the model to jointly attend to information from different representation subspaces at
// different positions. With a single attention head, averaging inhibits this." One head's output is
// one weighted average of the values; h heads, each in its own d_k-wide subspace, can each weigh
// another position, at the cost of one full-width head (Figures 3-5: heads following a
// long-distance dependency, resolving an anaphora). Table 3 (A): one head is 0.9 BLEU worse than
// the best.
//
// W_i^Q for all heads is one (C, C) matrix whose output columns i*d_k .. (i+1)*d_k-1 belong to
// head_i; likewise W^K, W^V. The three are stacked as the rows of one (3C, C) weight (PyTorch's
// in_proj_weight): qkv[b,t] = [q | k | v], and head_i reads columns i*d_k .. (i+1)*d_k-1 of each.
// The "split into heads" is only indexing, and Concat the same indexing read back.
//
//   self-attention (encoder; decoder with the causal mask):
//     x (N,C) --W_qkv--> qkv (N,3C) --attention per head--> heads (N,C) --W^O--> (N,C)
//   encoder-decoder attention (§3.2.3, "queries come from the previous decoder
//   layer, and the memory keys and values come from the output of the encoder"):
//     x (B*T,C)      --rows 0..C-1 of W_qkv-->   q  (B*T,C)
//     memory (B*S,C) --rows C..3C-1 of W_qkv--> kv (B*S,2C)
// Both end in attend_and_project: eq. 1 per head, then W^O. Decoding (§6.1)
// calls it too, with keys and values from its cache.

// out = Concat(heads) W^O + b^O with heads = Attention(q, k, v) per head: out and
// heads are (B,Tq,C), att (B,NH,Tq,Tk); q, k, v as attention_forward reads them.
static void attend_and_project(real *out, real *att, real *heads, const real *q, const real *k, const real *v,
                               int q_stride, int kv_stride, const int *key_len, int causal,
                               AttentionParams weights, int B, int Tq, int Tk, int C, int NH) {
    attention_forward(heads, att, q, k, v, q_stride, kv_stride, key_len, causal, B, Tq, Tk, C, NH);
    linear_forward(out, heads, weights.out_w, weights.out_b, B * Tq, C, C);
}

// out is (B,T,C); qkv (B,T,3C), att (B,NH,T,T), heads (B,T,C) are kept for backward
static void self_attention_forward(real *out, real *qkv, real *att, real *heads, const real *x,
                                   AttentionParams weights, const int *len, int causal, int B, int T, int C, int NH) {
    linear_forward(qkv, x, weights.qkv_w, weights.qkv_b, B * T, C, 3 * C);
    attend_and_project(out, att, heads, qkv, qkv + C, qkv + 2 * C, 3 * C, 3 * C, len, causal, weights, B, T, T, C, NH);
}

// d_qkv is (B,T,3C) and d_heads (B,T,C): zeroed scratch; dx accumulates
static void self_attention_backward(real *dx, AttentionParams grads, real *d_qkv, real *d_heads, const real *dout,
                                    const real *qkv, const real *att, const real *heads, const real *x,
                                    AttentionParams weights, int B, int T, int C, int NH) {
    // out = heads W^O^T + b^O
    linear_backward(d_heads, grads.out_w, grads.out_b, dout, heads, weights.out_w, B * T, C, C);
    // heads = Attention(q, k, v)
    attention_backward(d_qkv, d_qkv + C, d_qkv + 2 * C, d_heads, att, qkv, qkv + C, qkv + 2 * C, 3 * C, 3 * C,
                       B, T, T, C, NH);
    // qkv = x W_qkv^T + b_qkv
    linear_backward(dx, grads.qkv_w, grads.qkv_b, d_qkv, x, weights.qkv_w, B * T, C, 3 * C);
}

// The encoder-decoder attention's keys and values: kv (B,S,2C) = memory W_kv^T + b_kv
static void memory_keys_values(real *kv, const real *memory, AttentionParams weights, int B, int S, int C) {
    linear_forward(kv, memory, weights.qkv_w + (size_t)C * C, weights.qkv_b + C, B * S, C, 2 * C);
}

// out is (B,T,C); q (B,T,C), kv (B,S,2C), att (B,NH,T,S), heads (B,T,C) kept for backward
static void cross_attention_forward(real *out, real *q, real *kv, real *att, real *heads, const real *x,
                                    const real *memory, AttentionParams weights, const int *src_len,
                                    int B, int T, int S, int C, int NH) {
    linear_forward(q, x, weights.qkv_w, weights.qkv_b, B * T, C, C);
    memory_keys_values(kv, memory, weights, B, S, C);
    attend_and_project(out, att, heads, q, kv, kv + C, C, 2 * C, src_len, 0, weights, B, T, S, C, NH);
}

// d_q (B,T,C), d_kv (B,S,2C), d_heads (B,T,C): zeroed scratch; dx and dmemory accumulate
static void cross_attention_backward(real *dx, real *dmemory, AttentionParams grads, real *d_q, real *d_kv,
                                     real *d_heads, const real *dout, const real *q, const real *kv, const real *att,
                                     const real *heads, const real *x, const real *memory, AttentionParams weights,
                                     int B, int T, int S, int C, int NH) {
    // out = heads W^O^T + b^O
    linear_backward(d_heads, grads.out_w, grads.out_b, dout, heads, weights.out_w, B * T, C, C);
    // heads = Attention(q, k, v), keys and values from the encoder
    attention_backward(d_q, d_kv, d_kv + C, d_heads, att, q, kv, kv + C, C, 2 * C, B, T, S, C, NH);
    // q = x W_q^T + b_q
    linear_backward(dx, grads.qkv_w, grads.qkv_b, d_q, x, weights.qkv_w, B * T, C, C);
    // kv = memory W_kv^T + b_kv
    linear_backward(dmemory, grads.qkv_w + (size_t)C * C, grads.qkv_b + C, d_kv, memory,
                    weights.qkv_w + (size_t)C * C, B * S, C, 2 * C);
}

// ==== §3.3  Position-wise feed-forward networks ==============================
//     FFN(x) = max(0, x W_1 + b_1) W_2 + b_2                            (eq. 2)
// "applied to each position separately and identically": one linear layer
// over all B*T rows at once.

// hidden = max(0, hidden) in place
static void relu_forward(real *hidden, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) hidden[i] = hidden[i] > 0 ? hidden[i] : 0;
}

// Differentiates  hidden = max(0, a): da = dhidden where hidden > 0 (the same
// as a > 0), else 0. In place: dhidden becomes da.
static void relu_backward(real *dhidden, const real *hidden, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) if (!(hidden[i] > 0)) dhidden[i] = 0;
}

// out is (N,C), hidden (N,F) = max(0, x W_1^T + b_1) is kept for backward
static void feed_forward_forward(real *out, real *hidden, const real *x, FeedForwardParams weights, int N, int C, int F) {
    linear_forward(hidden, x, weights.w1, weights.b1, N, C, F);
    relu_forward(hidden, (size_t)N * F);
    linear_forward(out, hidden, weights.w2, weights.b2, N, F, C);
}

// d_hidden (N,F) is zeroed scratch; dx accumulates
static void feed_forward_backward(real *dx, FeedForwardParams grads, real *d_hidden, const real *dout,
                                  const real *hidden, const real *x, FeedForwardParams weights, int N, int C, int F) {
    // out = hidden W_2^T + b_2
    linear_backward(d_hidden, grads.w2, grads.b2, dout, hidden, weights.w2, N, F, C);
    // hidden = max(0, a)
    relu_backward(d_hidden, hidden, (size_t)N * F);
    // a = x W_1^T + b_1
    linear_backward(dx, grads.w1, grads.b1, d_hidden, x, weights.w1, N, C, F);
}

// ==== §3.4  Embeddings and softmax ===========================================
// "we share the same weight matrix between the two embedding layers and the
// pre-softmax linear transformation ... In the embedding layers, we multiply
// those weights by sqrt(d_model)." One (V, C) matrix E serves three times:
//     source:  x = E[token] * sqrt(C) + PE[pos]
//     target:  y = E[token] * sqrt(C) + PE[pos]
//     output:  logits = decoder_output E^T,  then softmax (§5.4's loss, below)

// out is (B,T,C), tokens (B,T), embedding (V,C), pe (max_len, C)
static void embedding_forward(real *out, const int *tokens, const real *embedding, const real *pe, int B, int T, int C) {
    real sqrt_d_model = real_sqrt((real)C);
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const real *row = embedding + (size_t)tokens[b * T + t] * C;
            for (int i = 0; i < C; i++)
                out[((size_t)b * T + t) * C + i] = row[i] * sqrt_d_model + pe[(size_t)t * C + i];
        }
}

// Differentiates  out[b,t,i] = embedding[tokens[b,t], i] * sqrt(C) + pe[t,i]. Two positions
// of the same token add into the same row: one thread, positions in order.
static void embedding_backward(real *dembedding, const real *dout, const int *tokens, int B, int T, int C) {
    real sqrt_d_model = real_sqrt((real)C);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            real *drow = dembedding + (size_t)tokens[b * T + t] * C;
            for (int i = 0; i < C; i++) drow[i] += dout[((size_t)b * T + t) * C + i] * sqrt_d_model;
        }
}

// ==== §3.5  Positional encoding ==============================================
//     PE(pos, 2i)   = sin(pos / 10000^(2i/d_model))
//     PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))
// Interleaved as in the paper (tensor2tensor concatenates sines, then cosines).
// Computed once, in double; no parameters, so no backward.
//
// Why sinusoids? "We chose this function because we hypothesized it would allow the model to easily
// learn to attend by relative positions, since for any fixed offset k, PE(pos+k) can be represented
// as a linear function of PE(pos)." Each pair of dimensions (2i, 2i+1) turns at one frequency
// w_i = 1 / 10000^(2i/d_model), and k positions on is a rotation by w_i k:
//     sin(w (pos+k)) =  cos(wk) sin(w pos) + sin(wk) cos(w pos)
//     cos(w (pos+k)) = -sin(wk) sin(w pos) + cos(wk) cos(w pos)
// So PE(pos+k) = M_k PE(pos), M_k made of these 2x2 rotations: one matrix for
// "k words later" at every position, which W^Q or W^K can learn. Wavelengths
// from 2 pi to 10000 * 2 pi: some pairs tell near positions apart, others far ones.
//
// "We also experimented with using learned positional embeddings instead, and found that the two
// versions produced nearly identical results" (Table 3, row E). With config.positional =
// POSITIONAL_LEARNED the table is a parameter, params.position_embedding (max_len, C), one for
// source and target as the sinusoids, added unscaled in PE's place (its gradient: below).

// pe is (max_len, C)
static void positional_encoding_init(real *pe, int max_len, int C) {
    for (int pos = 0; pos < max_len; pos++)
        for (int i = 0; 2 * i < C; i++) {
            double angle = pos / pow(10000.0, (2.0 * i) / C);
            pe[(size_t)pos * C + 2 * i] = (real)sin(angle);
            if (2 * i + 1 < C) pe[(size_t)pos * C + 2 * i + 1] = (real)cos(angle);
        }
}

// Differentiates  out[b,t,i] = embedding[tokens[b,t], i] * sqrt(C) + pe[t,i]  for the
// learned table pe (max_len, C): row t gets every sentence's position t of dout (B,T,C).
static void position_embedding_backward(real *dpe, const real *dout, int B, int T, int C) {
    for (int t = 0; t < T; t++)
        for (int b = 0; b < B; b++)
            for (int i = 0; i < C; i++) dpe[(size_t)t * C + i] += dout[((size_t)b * T + t) * C + i];
}

// ==== §5.4  Label smoothing, and the loss ====================================
// "During training, we employed label smoothing of value eps_ls = 0.1." The
// target distribution at each position is, as in PyTorch's cross_entropy,
//     q_v = (1 - eps_ls) [v == y] + eps_ls / V
// and the loss is the cross-entropy -sum_v q_v log p_v with p = softmax(logits),
// averaged over the non-padding target positions. "This hurts perplexity, as
// the model learns to be more unsure, but improves accuracy and BLEU score."

// token_loss is (B,T), probs (B,T,V), logits (B,T,V), targets (B,T), tgt_len (B).
// Returns the mean loss; *num_tokens gets the number of non-padding positions.
static double cross_entropy_forward(real *token_loss, real *probs, const real *logits, const int *targets,
                                    const int *tgt_len, float label_smoothing, int B, int T, int V, int *num_tokens) {
    real eps_ls = (real)label_smoothing;
    #pragma omp parallel for
    for (int bt = 0; bt < B * T; bt++) {
        const real *z = logits + (size_t)bt * V;
        real *p = probs + (size_t)bt * V;
        if (bt % T >= tgt_len[bt / T]) { // padding: no loss, no probabilities
            token_loss[bt] = 0;
            for (int token = 0; token < V; token++) p[token] = 0;
            continue;
        }
        // log p_v = z_v - logsumexp(z), computed around the largest logit
        real max_z = -INFINITY;
        for (int token = 0; token < V; token++) max_z = z[token] > max_z ? z[token] : max_z;
        real sum = 0, sum_z = 0;
        for (int token = 0; token < V; token++) {
            p[token] = real_exp(z[token] - max_z);
            sum += p[token];
            sum_z += z[token];
        }
        real log_sum = max_z + real_log(sum), inv_sum = 1 / sum;
        for (int token = 0; token < V; token++) p[token] *= inv_sum;
        // -sum_v q_v log p_v = -(1-eps_ls) log p_y - (eps_ls/V) sum_v log p_v
        real log_p_target = z[targets[bt]] - log_sum;
        real sum_log_p = sum_z - V * log_sum;
        token_loss[bt] = -(1 - eps_ls) * log_p_target - eps_ls / V * sum_log_p;
    }
    double total = 0;
    int count = 0;
    for (int bt = 0; bt < B * T; bt++)
        if (bt % T < tgt_len[bt / T]) { total += token_loss[bt]; count++; }
    *num_tokens = count;
    return count ? total / count : 0.0;
}

// Differentiates  loss = (1/n) sum_positions -sum_v q_v log softmax(z)_v:
// for a softmax followed by cross-entropy against a distribution q that sums
// to one, dloss/dz_v = p_v - q_v, here divided by the n non-padding positions.
static void cross_entropy_backward(real *dlogits, const real *probs, const int *targets, const int *tgt_len,
                                   float label_smoothing, int num_tokens, int B, int T, int V) {
    real eps_ls = (real)label_smoothing, inv_n = (real)(1.0 / num_tokens);
    #pragma omp parallel for
    for (int bt = 0; bt < B * T; bt++) {
        if (bt % T >= tgt_len[bt / T]) continue;
        const real *p = probs + (size_t)bt * V;
        real *dz = dlogits + (size_t)bt * V;
        for (int token = 0; token < V; token++) {
            real q_v = eps_ls / V + (token == targets[bt] ? 1 - eps_ls : 0);
            dz[token] += (p[token] - q_v) * inv_n;
        }
    }
}

// ==== §3.1  Encoder and decoder stacks =======================================
// "The encoder is composed of a stack of N identical layers. Each layer has two sub-layers ...
// multi-head self-attention ... and a simple, position-wise fully connected feed-forward network."
// The decoder "inserts a third sub-layer, which performs multi-head attention over the output of
// the encoder stack", and masks its self-attention. Post-norm, as published:
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
// No layer norm follows the last layer of either stack in the published model. A layer takes its
// parameters and activations as views of the model's tensors (transformer.h: EncoderLayerParams,
// DecoderLayerActs, ...), each tensor holding all N layers.

static AttentionParams attention_params_at(real *qkv_w, real *qkv_b, real *out_w, real *out_b, size_t l, size_t C) {
    return (AttentionParams){ qkv_w + l * 3 * C * C, qkv_b + l * 3 * C, out_w + l * C * C, out_b + l * C };
}

static FeedForwardParams feed_forward_params_at(real *w1, real *b1, real *w2, real *b2, size_t l, size_t C, size_t F) {
    return (FeedForwardParams){ w1 + l * F * C, b1 + l * F, w2 + l * C * F, b2 + l * C };
}

// Layer l's view into a ParameterTensors (the parameters or the gradients).
static EncoderLayerParams encoder_layer_params(ParameterTensors *of, const TransformerConfig *config, int l) {
    size_t C = config->d_model, F = config->d_ff;
    return (EncoderLayerParams){
        .self_attn = attention_params_at(of->enc_qkv_w, of->enc_qkv_b, of->enc_out_w, of->enc_out_b, l, C),
        .ln1_g = of->enc_ln1_g + l * C, .ln1_b = of->enc_ln1_b + l * C,
        .ffn = feed_forward_params_at(of->enc_ff1_w, of->enc_ff1_b, of->enc_ff2_w, of->enc_ff2_b, l, C, F),
        .ln2_g = of->enc_ln2_g + l * C, .ln2_b = of->enc_ln2_b + l * C,
    };
}

static DecoderLayerParams decoder_layer_params(ParameterTensors *of, const TransformerConfig *config, int l) {
    size_t C = config->d_model, F = config->d_ff;
    return (DecoderLayerParams){
        .self_attn = attention_params_at(of->dec_self_qkv_w, of->dec_self_qkv_b, of->dec_self_out_w, of->dec_self_out_b,
                                         l, C),
        .ln1_g = of->dec_ln1_g + l * C, .ln1_b = of->dec_ln1_b + l * C,
        .cross_attn = attention_params_at(of->dec_cross_qkv_w, of->dec_cross_qkv_b, of->dec_cross_out_w,
                                          of->dec_cross_out_b, l, C),
        .ln2_g = of->dec_ln2_g + l * C, .ln2_b = of->dec_ln2_b + l * C,
        .ffn = feed_forward_params_at(of->dec_ff1_w, of->dec_ff1_b, of->dec_ff2_w, of->dec_ff2_b, l, C, F),
        .ln3_g = of->dec_ln3_g + l * C, .ln3_b = of->dec_ln3_b + l * C,
    };
}

// Layer l's slice of the activations.
static EncoderLayerActs encoder_layer_acts(const Transformer *model, int layer) {
    const ActivationTensors *all = &model->acts;
    size_t l = layer, B = model->B, S = model->S, C = model->config.d_model, F = model->config.d_ff;
    size_t NH = model->config.n_heads, x = B * S * C, row = B * S;   // x: one (B,S,C) tensor; row: one number a position
    return (EncoderLayerActs){
        .qkv = all->enc_qkv + l * 3 * x,       .att = all->enc_att + l * B * NH * S * S,
        .heads = all->enc_heads + l * x,       .att_proj = all->enc_att_proj + l * x,
        .drop1 = all->enc_drop1 + l * x,       .res1 = all->enc_res1 + l * x,
        .ln1 = all->enc_ln1 + l * x,           .ln1_mean = all->enc_ln1_mean + l * row,
        .ln1_rstd = all->enc_ln1_rstd + l * row,
        .ff_h = all->enc_ff_h + l * row * F,   .ff_out = all->enc_ff_out + l * x,
        .drop2 = all->enc_drop2 + l * x,       .res2 = all->enc_res2 + l * x,
        .ln2 = all->enc_ln2 + l * x,           .ln2_mean = all->enc_ln2_mean + l * row,
        .ln2_rstd = all->enc_ln2_rstd + l * row,
    };
}

static DecoderLayerActs decoder_layer_acts(const Transformer *model, int layer) {
    const ActivationTensors *all = &model->acts;
    size_t l = layer, B = model->B, S = model->S, T = model->T, C = model->config.d_model;
    size_t F = model->config.d_ff, NH = model->config.n_heads, y = B * T * C, row = B * T;   // y: one (B,T,C) tensor
    return (DecoderLayerActs){
        .self_qkv = all->dec_self_qkv + l * 3 * y,    .self_att = all->dec_self_att + l * B * NH * T * T,
        .self_heads = all->dec_self_heads + l * y,    .self_proj = all->dec_self_proj + l * y,
        .drop1 = all->dec_drop1 + l * y,              .res1 = all->dec_res1 + l * y,
        .ln1 = all->dec_ln1 + l * y,                  .ln1_mean = all->dec_ln1_mean + l * row,
        .ln1_rstd = all->dec_ln1_rstd + l * row,
        .cross_q = all->dec_cross_q + l * y,          .cross_kv = all->dec_cross_kv + l * 2 * B * S * C,
        .cross_att = all->dec_cross_att + l * B * NH * T * S,
        .cross_heads = all->dec_cross_heads + l * y,  .cross_proj = all->dec_cross_proj + l * y,
        .drop2 = all->dec_drop2 + l * y,              .res2 = all->dec_res2 + l * y,
        .ln2 = all->dec_ln2 + l * y,                  .ln2_mean = all->dec_ln2_mean + l * row,
        .ln2_rstd = all->dec_ln2_rstd + l * row,
        .ff_h = all->dec_ff_h + l * row * F,          .ff_out = all->dec_ff_out + l * y,
        .drop3 = all->dec_drop3 + l * y,              .res3 = all->dec_res3 + l * y,
        .ln3 = all->dec_ln3 + l * y,                  .ln3_mean = all->dec_ln3_mean + l * row,
        .ln3_rstd = all->dec_ln3_rstd + l * row,
    };
}

static void zero(real *x, size_t n) {
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) x[i] = 0;
}

// "Add & Norm" (Figure 1), the end of every sub-layer: res = x + Dropout(sublayer),
// out = LayerNorm(res); all (N,C) but mean and rstd (N). The mask drawn here is kept
// for residual_layernorm_backward.
static void add_norm_forward(real *out, real *mean, real *rstd, real *res, real *mask, const real *x,
                             const real *sublayer, const real *gain, const real *bias, Transformer *model, int N) {
    const TransformerConfig *config = &model->config;
    dropout_mask(mask, config->dropout, model->training, &model->dropout_rng, (size_t)N * config->d_model);
    residual_layernorm_forward(out, mean, rstd, res, x, sublayer, mask, gain, bias, N, config->d_model,
                               config->layer_norm_eps);
}

// out = acts.ln2, the layer's output; x is (B,S,C), src_len is (B)
static void encoder_layer_forward(EncoderLayerActs acts, const real *x, EncoderLayerParams weights, const int *src_len,
                                  Transformer *model, int B, int S) {
    const TransformerConfig *config = &model->config;
    int C = config->d_model, N = B * S;
    // sub-layer 1: ln1 = LayerNorm(x + Dropout(SelfAttention(x)))
    self_attention_forward(acts.att_proj, acts.qkv, acts.att, acts.heads, x, weights.self_attn, src_len, 0,
                           B, S, C, config->n_heads);
    add_norm_forward(acts.ln1, acts.ln1_mean, acts.ln1_rstd, acts.res1, acts.drop1, x, acts.att_proj,
                     weights.ln1_g, weights.ln1_b, model, N);
    // sub-layer 2: ln2 = LayerNorm(ln1 + Dropout(FFN(ln1)))
    feed_forward_forward(acts.ff_out, acts.ff_h, acts.ln1, weights.ffn, N, C, config->d_ff);
    add_norm_forward(acts.ln2, acts.ln2_mean, acts.ln2_rstd, acts.res2, acts.drop2, acts.ln1, acts.ff_out,
                     weights.ln2_g, weights.ln2_b, model, N);
}

// dx accumulates dL/dx given dout = dL/d(acts.ln2), grads the parameters'; the
// gradients in between go through model->scratch (transformer.h).
static void encoder_layer_backward(real *dx, EncoderLayerParams grads, const real *dout, EncoderLayerActs acts,
                                   const real *x, EncoderLayerParams weights, Transformer *model, int B, int S) {
    const TransformerConfig *config = &model->config;
    BackwardScratch *scratch = &model->scratch;
    int C = config->d_model, F = config->d_ff, N = B * S;
    size_t n = (size_t)N * C;
    // sub-layer 2: ln2 = LayerNorm(ln1 + Dropout(ff_out)),  ff_out = FFN(ln1)
    zero(scratch->d_ln1, n); zero(scratch->d_sublayer, n);
    residual_layernorm_backward(scratch->d_ln1, scratch->d_sublayer, grads.ln2_g, grads.ln2_b, dout,
                                acts.res2, acts.drop2, weights.ln2_g, acts.ln2_mean, acts.ln2_rstd, N, C);
    zero(scratch->d_ff_h, (size_t)N * F);
    feed_forward_backward(scratch->d_ln1, grads.ffn, scratch->d_ff_h, scratch->d_sublayer, acts.ff_h, acts.ln1,
                          weights.ffn, N, C, F);
    // sub-layer 1: ln1 = LayerNorm(x + Dropout(att_proj)),  att_proj = SelfAttention(x)
    zero(scratch->d_sublayer, n);
    residual_layernorm_backward(dx, scratch->d_sublayer, grads.ln1_g, grads.ln1_b, scratch->d_ln1,
                                acts.res1, acts.drop1, weights.ln1_g, acts.ln1_mean, acts.ln1_rstd, N, C);
    zero(scratch->d_heads, n); zero(scratch->d_qkv, 3 * n);
    self_attention_backward(dx, grads.self_attn, scratch->d_qkv, scratch->d_heads, scratch->d_sublayer,
                            acts.qkv, acts.att, acts.heads, x, weights.self_attn, B, S, C, config->n_heads);
}

// out = acts.ln3; y is (B,T,C), memory (the encoder output) is (B,S,C)
static void decoder_layer_forward(DecoderLayerActs acts, const real *y, const real *memory, DecoderLayerParams weights,
                                  const Batch *batch, Transformer *model) {
    const TransformerConfig *config = &model->config;
    int B = batch->B, S = batch->S, T = batch->T, C = config->d_model, N = B * T;
    // sub-layer 1: ln1 = LayerNorm(y + Dropout(MaskedSelfAttention(y)))
    self_attention_forward(acts.self_proj, acts.self_qkv, acts.self_att, acts.self_heads, y, weights.self_attn,
                           batch->tgt_len, 1, B, T, C, config->n_heads);
    add_norm_forward(acts.ln1, acts.ln1_mean, acts.ln1_rstd, acts.res1, acts.drop1, y, acts.self_proj,
                     weights.ln1_g, weights.ln1_b, model, N);
    // sub-layer 2: ln2 = LayerNorm(ln1 + Dropout(Attention(ln1, memory)))
    cross_attention_forward(acts.cross_proj, acts.cross_q, acts.cross_kv, acts.cross_att, acts.cross_heads,
                            acts.ln1, memory, weights.cross_attn, batch->src_len, B, T, S, C, config->n_heads);
    add_norm_forward(acts.ln2, acts.ln2_mean, acts.ln2_rstd, acts.res2, acts.drop2, acts.ln1, acts.cross_proj,
                     weights.ln2_g, weights.ln2_b, model, N);
    // sub-layer 3: ln3 = LayerNorm(ln2 + Dropout(FFN(ln2)))
    feed_forward_forward(acts.ff_out, acts.ff_h, acts.ln2, weights.ffn, N, C, config->d_ff);
    add_norm_forward(acts.ln3, acts.ln3_mean, acts.ln3_rstd, acts.res3, acts.drop3, acts.ln2, acts.ff_out,
                     weights.ln3_g, weights.ln3_b, model, N);
}

// dy accumulates dL/dy, dmemory accumulates dL/d(memory), given dout = dL/d(acts.ln3).
static void decoder_layer_backward(real *dy, real *dmemory, DecoderLayerParams grads, const real *dout,
                                   DecoderLayerActs acts, const real *y, const real *memory,
                                   DecoderLayerParams weights, const Batch *batch, Transformer *model) {
    const TransformerConfig *config = &model->config;
    BackwardScratch *scratch = &model->scratch;
    int B = batch->B, S = batch->S, T = batch->T, C = config->d_model, F = config->d_ff, N = B * T;
    size_t n = (size_t)N * C;
    // sub-layer 3: ln3 = LayerNorm(ln2 + Dropout(ff_out)),  ff_out = FFN(ln2)
    zero(scratch->d_ln2, n); zero(scratch->d_sublayer, n);
    residual_layernorm_backward(scratch->d_ln2, scratch->d_sublayer, grads.ln3_g, grads.ln3_b, dout,
                                acts.res3, acts.drop3, weights.ln3_g, acts.ln3_mean, acts.ln3_rstd, N, C);
    zero(scratch->d_ff_h, (size_t)N * F);
    feed_forward_backward(scratch->d_ln2, grads.ffn, scratch->d_ff_h, scratch->d_sublayer, acts.ff_h, acts.ln2,
                          weights.ffn, N, C, F);
    // sub-layer 2: ln2 = LayerNorm(ln1 + Dropout(cross_proj)),  cross_proj = Attention(ln1, memory)
    zero(scratch->d_sublayer, n); zero(scratch->d_ln1, n);
    residual_layernorm_backward(scratch->d_ln1, scratch->d_sublayer, grads.ln2_g, grads.ln2_b, scratch->d_ln2,
                                acts.res2, acts.drop2, weights.ln2_g, acts.ln2_mean, acts.ln2_rstd, N, C);
    zero(scratch->d_heads, n); zero(scratch->d_q, n); zero(scratch->d_kv, (size_t)B * S * 2 * C);
    cross_attention_backward(scratch->d_ln1, dmemory, grads.cross_attn, scratch->d_q, scratch->d_kv,
                             scratch->d_heads, scratch->d_sublayer, acts.cross_q, acts.cross_kv, acts.cross_att,
                             acts.cross_heads, acts.ln1, memory, weights.cross_attn, B, T, S, C, config->n_heads);
    // sub-layer 1: ln1 = LayerNorm(y + Dropout(self_proj)),  self_proj = MaskedSelfAttention(y)
    zero(scratch->d_sublayer, n);
    residual_layernorm_backward(dy, scratch->d_sublayer, grads.ln1_g, grads.ln1_b, scratch->d_ln1,
                                acts.res1, acts.drop1, weights.ln1_g, acts.ln1_mean, acts.ln1_rstd, N, C);
    zero(scratch->d_heads, n); zero(scratch->d_qkv, 3 * n);
    self_attention_backward(dy, grads.self_attn, scratch->d_qkv, scratch->d_heads, scratch->d_sublayer,
                            acts.self_qkv, acts.self_att, acts.self_heads, y, weights.self_attn,
                            B, T, C, config->n_heads);
}

// ==== The whole model (Figure 1) =============================================
// The encoder stack, the decoder stack and the output projection, then the
// loss; and the backward pass, the same path in reverse.

// The encoder stack: memory = Encoder(source). Returns the memory (B,S,C).
static const real *encoder_forward(Transformer *model, const Batch *batch) {
    const TransformerConfig *config = &model->config;
    ActivationTensors *acts = &model->acts;
    int B = batch->B, S = batch->S, C = config->d_model;
    size_t n = (size_t)B * S * C;
    // §3.4, §3.5: embed, scale, add positions; §5.4: dropout on the sum
    embedding_forward(acts->enc_embedded, batch->src, model->params.embedding, model->positional_encoding, B, S, C);
    dropout_mask(acts->enc_emb_mask, config->dropout, model->training, &model->dropout_rng, n);
    dropout_forward(acts->enc_x0, acts->enc_embedded, acts->enc_emb_mask, n);
    const real *x = acts->enc_x0;
    for (int l = 0; l < config->n_layers; l++) {
        EncoderLayerActs layer_acts = encoder_layer_acts(model, l);
        encoder_layer_forward(layer_acts, x, encoder_layer_params(&model->params, config, l), batch->src_len,
                              model, B, S);
        x = layer_acts.ln2;
    }
    return x;
}

// The decoder stack and the output projection: logits = Decoder(target, memory) E^T
static void decoder_forward(Transformer *model, const Batch *batch, const real *memory) {
    const TransformerConfig *config = &model->config;
    ActivationTensors *acts = &model->acts;
    int B = batch->B, T = batch->T, C = config->d_model;
    size_t n = (size_t)B * T * C;
    embedding_forward(acts->dec_embedded, batch->tgt_in, model->params.embedding, model->positional_encoding, B, T, C);
    dropout_mask(acts->dec_emb_mask, config->dropout, model->training, &model->dropout_rng, n);
    dropout_forward(acts->dec_x0, acts->dec_embedded, acts->dec_emb_mask, n);
    const real *y = acts->dec_x0;
    for (int l = 0; l < config->n_layers; l++) {
        DecoderLayerActs layer_acts = decoder_layer_acts(model, l);
        decoder_layer_forward(layer_acts, y, memory, decoder_layer_params(&model->params, config, l), batch, model);
        y = layer_acts.ln3;
    }
    // §3.4 the pre-softmax linear transformation shares the embedding matrix
    linear_forward(acts->logits, y, model->params.embedding, NULL, B * T, C, config->vocab_size);
}

static char error_context[40] = "";   // "train: ": errors name the command (a library: "")
static void ensure_buffers(Transformer *model, int B, int S, int T);   // activations for a (B,S,T) batch (machinery)

// The whole forward pass; returns the label-smoothed loss (§5.4). A batch that fails
// batch_check stops the program with a message rather than read outside the embedding.
real transformer_forward(Transformer *model, const Batch *batch) {
    const char *error = batch_check(batch, &model->config);
    if (error) { fprintf(stderr, "error: %stransformer_forward: %s\n", error_context, error); exit(1); }
    ensure_buffers(model, batch->B, batch->S, batch->T);
    model->B = batch->B; model->S = batch->S; model->T = batch->T;
    const real *memory = encoder_forward(model, batch);
    decoder_forward(model, batch, memory);
    model->loss = (real)cross_entropy_forward(model->acts.token_loss, model->acts.probs, model->acts.logits,
                                              batch->tgt_out, batch->tgt_len, model->config.label_smoothing,
                                              batch->B, batch->T, model->config.vocab_size, &model->num_target_tokens);
    return model->loss;
}

void transformer_zero_grad(Transformer *model) { zero(model->grads_memory, model->num_parameters); }

// The whole backward pass, for the batch of the last transformer_forward:
// accumulates dloss/dparameter into model->grads.
void transformer_backward(Transformer *model, const Batch *batch) {
    const TransformerConfig *config = &model->config;
    ActivationTensors *acts = &model->acts;
    BackwardScratch *scratch = &model->scratch;
    int B = batch->B, S = batch->S, T = batch->T, C = config->d_model, V = config->vocab_size;
    int L = config->n_layers;
    size_t n_dec = (size_t)B * T * C, n_enc = (size_t)B * S * C;
    if (model->num_target_tokens == 0) return;
    // loss = CrossEntropy(softmax(logits), q)
    zero(scratch->d_logits, (size_t)B * T * V);
    cross_entropy_backward(scratch->d_logits, acts->probs, batch->tgt_out, batch->tgt_len,
                           config->label_smoothing, model->num_target_tokens, B, T, V);
    // logits = decoder_output E^T
    const real *decoder_output = decoder_layer_acts(model, L - 1).ln3;
    real *d_out = scratch->d_output, *d_in = scratch->d_input;   // swapped after each layer
    zero(d_out, n_dec);
    linear_backward(d_out, model->grads.embedding, NULL, scratch->d_logits, decoder_output,
                    model->params.embedding, B * T, C, V);
    // the decoder stack, last layer first
    const real *memory = encoder_layer_acts(model, L - 1).ln2;
    zero(scratch->d_memory, n_enc);
    for (int l = L - 1; l >= 0; l--) {
        const real *y = l == 0 ? acts->dec_x0 : decoder_layer_acts(model, l - 1).ln3;
        zero(d_in, n_dec);
        decoder_layer_backward(d_in, scratch->d_memory, decoder_layer_params(&model->grads, config, l), d_out,
                               decoder_layer_acts(model, l), y, memory,
                               decoder_layer_params(&model->params, config, l), batch, model);
        real *swap = d_out; d_out = d_in; d_in = swap;
    }
    // dec_x0 = Dropout(E[tgt_in] sqrt(C) + PE)
    zero(scratch->d_embedded, n_dec);
    dropout_backward(scratch->d_embedded, d_out, acts->dec_emb_mask, n_dec);
    embedding_backward(model->grads.embedding, scratch->d_embedded, batch->tgt_in, B, T, C);
    if (config->positional == POSITIONAL_LEARNED)
        position_embedding_backward(model->grads.position_embedding, scratch->d_embedded, B, T, C);
    // the encoder stack, starting from the gradient its output got from every decoder layer
    memcpy(d_out, scratch->d_memory, n_enc * sizeof(real));
    for (int l = L - 1; l >= 0; l--) {
        const real *x = l == 0 ? acts->enc_x0 : encoder_layer_acts(model, l - 1).ln2;
        zero(d_in, n_enc);
        encoder_layer_backward(d_in, encoder_layer_params(&model->grads, config, l), d_out,
                               encoder_layer_acts(model, l), x, encoder_layer_params(&model->params, config, l),
                               model, B, S);
        real *swap = d_out; d_out = d_in; d_in = swap;
    }
    // enc_x0 = Dropout(E[src] sqrt(C) + PE)
    zero(scratch->d_embedded, n_enc);
    dropout_backward(scratch->d_embedded, d_out, acts->enc_emb_mask, n_enc);
    embedding_backward(model->grads.embedding, scratch->d_embedded, batch->src, B, S, C);
    if (config->positional == POSITIONAL_LEARNED)
        position_embedding_backward(model->grads.position_embedding, scratch->d_embedded, B, S, C);
}

// ==== §5.3  Optimizer ========================================================
// "We used the Adam optimizer with beta1 = 0.9, beta2 = 0.98 and eps = 1e-9.
// We varied the learning rate over the course of training, according to
//     lrate = d_model^-0.5 * min(step_num^-0.5, step_num * warmup_steps^-1.5)"
// (eq. 3): a linear rise for warmup_steps (4000 in the paper), then a decay
// with the inverse square root of the step. `factor` scales the whole curve
// (1 in the paper; larger for tiny models, as many reimplementations do).

double transformer_learning_rate(long step, int d_model, int warmup_steps, double factor) {
    double step_num = step < 1 ? 1.0 : (double)step;
    double rise = step_num * pow((double)warmup_steps, -1.5), decay = 1.0 / sqrt(step_num);
    return factor / sqrt((double)d_model) * (rise < decay ? rise : decay);
}

// One Adam step (Kingma & Ba 2015, Algorithm 1) on every parameter theta with gradient g:
//     m = beta1 m + (1 - beta1) g            (first moment: adam_m, moment1 below)
//     v = beta2 v + (1 - beta2) g^2          (second moment: adam_v, moment2 below)
//     theta -= lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
// with t the step count; the divisions undo the moments' bias towards 0. The
// corrections are computed once, in double, and applied in `real`.
void adam_update(Transformer *model, double learning_rate) {
    model->adam_step++;
    const AdamConfig *adam = &model->adam;
    double t = (double)model->adam_step;
    real step_size = (real)(learning_rate / (1.0 - pow(adam->beta1, t)));   // lr / (1 - beta1^t)
    real rsqrt_correction2 = (real)(1.0 / sqrt(1.0 - pow(adam->beta2, t)));  // 1 / sqrt(1 - beta2^t)
    real beta1 = (real)adam->beta1, beta2 = (real)adam->beta2, eps = (real)adam->eps;
    real *theta = model->params_memory, *moment1 = model->adam_m, *moment2 = model->adam_v;
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
// §5 describes training piece by piece: batches by length (§5.1), Adam at eq. 3's
// rate (§5.3), dropout and label smoothing (§5.4). One step: a forward pass to the
// loss, the backward pass to every gradient, one Adam update (eq. 3's t: adam_step + 1).

real transformer_train_step(Transformer *model, const Batch *batch, int warmup_steps, double lr_factor) {
    real loss = transformer_forward(model, batch);      // Figure 1, bottom to top, and §5.4's loss
    transformer_zero_grad(model);                        // the backward passes accumulate (+=)
    transformer_backward(model, batch);                  // top to bottom: dloss/d(every parameter)
    double lr = transformer_learning_rate(model->adam_step + 1, model->config.d_model, warmup_steps, lr_factor);
    adam_update(model, lr);                              // §5.3, at eq. 3's rate
    return loss;
}

// ==== §6.1  Decoding: greedy with a key/value cache, beam search =============
// "We used beam search with a beam size of 4 and length penalty alpha = 0.6 ... We set the maximum
// output length during inference to input length + 50, but terminate early when possible." (§6.1)
//
// The decoder writes one token at a time: position t reads the token chosen at t-1 (<s> at t = 0).
// Run naively, step t recomputes every earlier position of every layer, O(t^2) work per sentence.
// But under the causal mask (§3.2.3) nothing at positions < t depends on later tokens, so their
// keys and values never change: a key/value cache keeps them, per layer, and step t computes only
// row t:
//
//   token_t ─ E[token]·√C + PE[t] ─ layer 0 ─ … ─ layer N-1 ─ ·E^T ─ logits_t
//     in each layer: self-attention   q_t against cached k_0..k_t, v_0..v_t
//                    cross-attention  q_t against the memory's K, V (made once)
//
// decoder_step is decoder_layer_forward for one position, with the same
// sub-layer functions (dropout off); only the keys and values come from the cache.

// From the machinery: allocation that cannot fail silently
static void *checked_calloc(size_t count, size_t size, const char *what);   // calloc, or exit with a message
typedef struct { real **tensor; size_t size; } Tensor;                     // a tensor of an arena, its numbers
static real *arena_of(Tensor *tensors, int n, const char *what);           // one arena of zeros for them all
static void arena_free(real *p);

// R rows decoded side by side (R sentences, greedy, or the R beams of one
// sentence): each row's key/value cache per layer, the memory's keys and
// values, and one position's activations, in one arena (transformer.h).
static void decoder_cache_init(DecoderCache *cache, const Transformer *model, int R, int S, int max_T) {
    const TransformerConfig *config = &model->config;
    size_t L = config->n_layers, C = config->d_model, F = config->d_ff, NH = config->n_heads;
    size_t rows = R, widest = S > max_T ? S : max_T;
    memset(cache, 0, sizeof *cache);
    if (fast_path.decoding) fast_path.decoding(1);   // the weights stay as they are until decoder_cache_free
    cache->rows = R; cache->S = S; cache->max_T = max_T;
    cache->src_len = checked_calloc(rows, sizeof(int), "decoder source lengths");
    cache->self_len = checked_calloc(rows, sizeof(int), "decoder cache lengths");
    Tensor tensors[] = {
        { &cache->cross_kv, L * rows * S * 2 * C }, { &cache->self_kv, L * rows * max_T * 2 * C },
        { &cache->spare_kv, L * rows * max_T * 2 * C }, { &cache->x, rows * C }, { &cache->qkv, rows * 3 * C },
        { &cache->heads, rows * C }, { &cache->proj, rows * C }, { &cache->res, rows * C }, { &cache->ln1, rows * C },
        { &cache->ln2, rows * C }, { &cache->q, rows * C }, { &cache->ff_h, rows * F }, { &cache->ff_out, rows * C },
        { &cache->mean, rows }, { &cache->rstd, rows }, { &cache->att, rows * NH * widest }, { &cache->mask, rows * C },
        { &cache->logits, rows * config->vocab_size },
    };
    cache->memory = arena_of(tensors, (int)(sizeof tensors / sizeof *tensors), "decoder cache");
}

static void decoder_cache_free(DecoderCache *cache) {
    free(cache->src_len); free(cache->self_len); arena_free(cache->memory); memset(cache, 0, sizeof *cache);
    if (fast_path.decoding) fast_path.decoding(0);
}

// memory = Encoder(source) (§3.1), once per sentence, and every decoder layer's keys and
// values of it. src is (B,S), padded; B == rows (row r decodes sentence r) or B == 1
// (every row decodes sentence 0: the beams of beam search).
static void decoder_cache_encode(DecoderCache *cache, Transformer *model, const int *src, const int *src_len, int B) {
    const TransformerConfig *config = &model->config;
    int S = cache->S, C = config->d_model;
    size_t R = cache->rows, row_kv = (size_t)S * 2 * C;
    Batch batch = { B, S, 1, (int *)src, (int *)src_len, NULL, NULL, NULL };
    ensure_buffers(model, B, S, 1);
    model->B = B; model->S = S; model->T = 1;
    const real *memory = encoder_forward(model, &batch);
    for (int l = 0; l < config->n_layers; l++) {
        real *kv = cache->cross_kv + l * R * row_kv;
        memory_keys_values(kv, memory, decoder_layer_params(&model->params, config, l).cross_attn, B, S, C);
        for (size_t r = B; r < R; r++) memcpy(kv + r * row_kv, kv, row_kv * sizeof(real));
    }
    for (size_t r = 0; r < R; r++) cache->src_len[r] = src_len[B == 1 ? 0 : r];
}

// One decoder position t for rows 0..rows-1, tokens (rows) their inputs: appends each
// row's keys and values at t to the cache, leaves the next token's logits in cache->logits.
static void decoder_step(DecoderCache *cache, Transformer *model, const int *tokens, int t, int rows) {
    const TransformerConfig *config = &model->config;
    int C = config->d_model, NH = config->n_heads;
    size_t R = cache->rows;
    real *y = cache->x;   // the layer's input y, then its output
    // §3.4, §3.5: E[token] * sqrt(d_model) + PE[t]
    embedding_forward(y, tokens, model->params.embedding, model->positional_encoding + (size_t)t * C, rows, 1, C);
    for (int r = 0; r < rows; r++) cache->self_len[r] = t + 1;
    for (int l = 0; l < config->n_layers; l++) {
        DecoderLayerParams weights = decoder_layer_params(&model->params, config, l);
        real *self_kv = cache->self_kv + l * R * cache->max_T * 2 * C;
        real *cross_kv = cache->cross_kv + l * R * cache->S * 2 * C;
        // sub-layer 1: LayerNorm(y + MaskedSelfAttention(y)); q_t sees k_0..k_t, v_0..v_t
        linear_forward(cache->qkv, y, weights.self_attn.qkv_w, weights.self_attn.qkv_b, rows, C, 3 * C);
        for (int r = 0; r < rows; r++)   // k_t, v_t into the cache
            memcpy(self_kv + ((size_t)r * cache->max_T + t) * 2 * C, cache->qkv + (size_t)r * 3 * C + C,
                   2 * (size_t)C * sizeof(real));
        attend_and_project(cache->proj, cache->att, cache->heads, cache->qkv, self_kv, self_kv + C, 3 * C, 2 * C,
                           cache->self_len, 0, weights.self_attn, rows, 1, cache->max_T, C, NH);
        add_norm_forward(cache->ln1, cache->mean, cache->rstd, cache->res, cache->mask, y, cache->proj,
                         weights.ln1_g, weights.ln1_b, model, rows);
        // sub-layer 2: LayerNorm(ln1 + Attention(ln1, memory)); q = ln1 W_q^T + b_q as in
        // cross_attention_forward, keys and values from the cache
        linear_forward(cache->q, cache->ln1, weights.cross_attn.qkv_w, weights.cross_attn.qkv_b, rows, C, C);
        attend_and_project(cache->proj, cache->att, cache->heads, cache->q, cross_kv, cross_kv + C, C, 2 * C,
                           cache->src_len, 0, weights.cross_attn, rows, 1, cache->S, C, NH);
        add_norm_forward(cache->ln2, cache->mean, cache->rstd, cache->res, cache->mask, cache->ln1, cache->proj,
                         weights.ln2_g, weights.ln2_b, model, rows);
        // sub-layer 3: LayerNorm(ln2 + FFN(ln2)); the output is the next layer's input
        feed_forward_forward(cache->ff_out, cache->ff_h, cache->ln2, weights.ffn, rows, C, config->d_ff);
        add_norm_forward(y, cache->mean, cache->rstd, cache->res, cache->mask, cache->ln2, cache->ff_out,
                         weights.ln3_g, weights.ln3_b, model, rows);
    }
    // §3.4: the pre-softmax projection through the shared embedding
    linear_forward(cache->logits, y, model->params.embedding, NULL, rows, C, config->vocab_size);
}

// Row i continues beam parent[i] (beam search): it takes over that beam's cached keys and
// values of positions 0..positions-1.
static void decoder_cache_reorder(DecoderCache *cache, const Transformer *model, const int *parent, int rows, int positions) {
    size_t C = model->config.d_model, L = model->config.n_layers, R = cache->rows, T = cache->max_T;
    for (size_t l = 0; l < L; l++)
        for (int i = 0; i < rows; i++)
            memcpy(cache->spare_kv + (l * R + i) * T * 2 * C, cache->self_kv + (l * R + parent[i]) * T * 2 * C,
                   (size_t)positions * 2 * C * sizeof(real));
    real *swap = cache->self_kv; cache->self_kv = cache->spare_kv; cache->spare_kv = swap;
}

// §6.1: "maximum output length ... input length + 50", and never more
// positions than the positional encoding has. Counts output tokens, </s> included.
int transformer_decode_limit(const Transformer *model, int src_len) {
    int limit = src_len + 50;
    return limit < model->config.max_len ? limit : model->config.max_len;
}

// The most likely next token, never <pad> or <s>; the lowest id wins a tie, a NaN never (all NaN: </s>).
_Static_assert(TOKEN_PAD < TOKEN_EOS && TOKEN_BOS < TOKEN_EOS && TOKEN_EOS == 2,
               "the possible outputs are the ids from </s> on");
static int greedy_token(const real *logits, int V) {
    int best = TOKEN_EOS;
    for (int token = TOKEN_EOS; token < V; token++)
        if (logits[token] > logits[best] || (logits[best] != logits[best] && logits[token] == logits[token]))
            best = token;
    return best;
}

// Greedy decoding of B sentences side by side: at each position every sentence takes its
// most likely token, until </s> or the length limit. src is (B,S) padded, src_len (B);
// out (B, max_out) gets each output without </s>, out_len (B) its length.
void transformer_greedy_decode(Transformer *model, int *out, int *out_len, int max_out, const int *src,
                               const int *src_len, int B, int S) {
    int training = model->training, V = model->config.vocab_size, steps = 0;
    model->training = 0;
    int *limit = checked_calloc(B, sizeof(int), "decode limits");
    int *tokens = checked_calloc(B, sizeof(int), "decode tokens"), *done = checked_calloc(B, sizeof(int), "decode flags");
    for (int b = 0; b < B; b++) {
        limit[b] = transformer_decode_limit(model, src_len[b]);
        if (limit[b] > max_out) limit[b] = max_out;
        if (limit[b] > steps) steps = limit[b];
        out_len[b] = 0;
        tokens[b] = TOKEN_BOS;
    }
    DecoderCache cache;
    decoder_cache_init(&cache, model, B, S, steps);
    decoder_cache_encode(&cache, model, src, src_len, B);
    for (int t = 0; t < steps; t++) {
        decoder_step(&cache, model, tokens, t, B);
        int active = 0;
        for (int b = 0; b < B; b++) {
            if (done[b]) continue;
            int token = greedy_token(cache.logits + (size_t)b * V, V);
            if (token == TOKEN_EOS) { done[b] = 1; continue; }
            out[(size_t)b * max_out + out_len[b]++] = token;
            tokens[b] = token;
            if (t + 1 >= limit[b]) done[b] = 1;
            active += !done[b];
        }
        if (!active) break;
    }
    decoder_cache_free(&cache);
    free(limit); free(tokens); free(done);
    model->training = training;
}

// §6.1 length penalty, as tensor2tensor's (Wu et al. 2016): a hypothesis of `length`
// tokens (</s> included) scores log P / ((5 + length) / 6)^alpha.
static double length_penalty(int length, double alpha) { return pow((5.0 + length) / 6.0, alpha); }

// A possible extension: token after beam `row`, summed log-probability `score`. The logit
// breaks ties, then the lower row and token, so that one beam ranks as greedy_token chooses.
typedef struct { double score; real logit; int row, token; } BeamCandidate;

static int candidate_before(const BeamCandidate *a, const BeamCandidate *b) {
    if (a->score != b->score) return a->score > b->score;
    if (a->logit != b->logit) return a->logit > b->logit;
    if (a->row != b->row) return a->row < b->row;
    return a->token < b->token;
}

// Inserts candidate into best[0..*count-1], sorted, keeping at most `keep`.
static void candidate_insert(BeamCandidate *best, int *count, int keep, BeamCandidate candidate) {
    int i;
    if (*count < keep) i = (*count)++;
    else if (candidate_before(&candidate, &best[keep - 1])) i = keep - 1;
    else return;
    while (i > 0 && candidate_before(&candidate, &best[i - 1])) { best[i] = best[i - 1]; i--; }
    best[i] = candidate;
}

// Every alive beam r proposes every token but <pad> and <s>, scored alive_score[r] +
// log softmax(logits[r])_token (in double); the best `keep` go to best[], sorted. Returns how many.
static int beam_propose(BeamCandidate *best, int keep, const real *logits, const double *alive_score, int num_alive,
                        int V) {
    int num_best = 0;
    for (int r = 0; r < num_alive; r++) {
        const real *z = logits + (size_t)r * V;
        double max_z = z[0], sum = 0;
        for (int token = 1; token < V; token++) if (z[token] > max_z) max_z = z[token];
        for (int token = 0; token < V; token++) sum += exp(z[token] - max_z);
        double log_sum = max_z + log(sum);
        for (int token = 0; token < V; token++) {
            if (token == TOKEN_PAD || token == TOKEN_BOS) continue;
            BeamCandidate candidate = { alive_score[r] + (z[token] - log_sum), z[token], r, token };
            candidate_insert(best, &num_best, keep, candidate);
        }
    }
    return num_best;
}

// The ended hypotheses: tokens (without </s>) at tokens + i * stride, length, score
// log P / length_penalty; best is the index of the highest score (the first of equals).
typedef struct { int *tokens, *length; double *score; int count, best; size_t stride; } FinishedHypotheses;

// Ends a hypothesis of `length` tokens and summed log-probability log_p; its penalty counts
// `penalized` tokens (</s> included when there is one).
static void finish_hypothesis(FinishedHypotheses *finished, const int *tokens, int length, double log_p, int penalized,
                              double alpha) {
    int i = finished->count++;
    memcpy(finished->tokens + i * finished->stride, tokens, (size_t)length * sizeof(int));
    finished->length[i] = length;
    finished->score[i] = log_p / length_penalty(penalized, alpha);
    if (finished->score[i] > finished->score[finished->best]) finished->best = i;
}

// Beam search for one sentence (§6.1). At each position every alive beam proposes every token; the
// best beam_size - (hypotheses finished so far), by summed log-probability, are taken in order: one
// ending in </s> is finished, scored log P / length_penalty, the others are the next alive beams.
// Search stops when beam_size hypotheses have finished, or at the length limit, where the alive
// beams finish as they are. Returns the length of the best, written to out (capacity
// transformer_decode_limit) without </s>; *score gets its score. Beam size 1 is greedy decoding.
int transformer_beam_search(Transformer *model, int *out, double *score, const int *src, int src_len,
                            int beam_size, double alpha) {
    int training = model->training, V = model->config.vocab_size;
    model->training = 0;
    int limit = transformer_decode_limit(model, src_len);
    size_t stride = limit, beams = beam_size;
    int *alive = checked_calloc(beams * stride, sizeof(int), "beams");      // (beams, stride) tokens
    int *next = checked_calloc(beams * stride, sizeof(int), "beams");
    double *alive_score = checked_calloc(beams, sizeof(double), "beams");
    double *next_score = checked_calloc(beams, sizeof(double), "beams");
    int *parent = checked_calloc(beams, sizeof(int), "beams"), *tokens = checked_calloc(beams, sizeof(int), "beams");
    BeamCandidate *best = checked_calloc(beams, sizeof(BeamCandidate), "beam candidates");
    FinishedHypotheses finished = { checked_calloc(beams * stride, sizeof(int), "beams"),
                                    checked_calloc(beams, sizeof(int), "beams"),
                                    checked_calloc(beams, sizeof(double), "beams"), 0, 0, stride };
    finished.score[0] = -INFINITY;
    DecoderCache cache;
    decoder_cache_init(&cache, model, beam_size, src_len, limit);
    decoder_cache_encode(&cache, model, src, &src_len, 1);
    int num_alive = 1;
    tokens[0] = TOKEN_BOS;
    for (int t = 0; t < limit; t++) {
        decoder_step(&cache, model, tokens, t, num_alive);
        // Each beam ends once: the best `width` (beams not ended yet) candidates end (</s>) or go
        // on. An ended beam is not replaced, so poor hypotheses that end early cannot stop the
        // search while a better one is still going.
        int width = beam_size - finished.count, num_next = 0;
        int num_best = beam_propose(best, width, cache.logits, alive_score, num_alive, V);
        for (int i = 0; i < num_best; i++) {
            BeamCandidate candidate = best[i];
            if (candidate.token == TOKEN_EOS) {
                finish_hypothesis(&finished, alive + candidate.row * stride, t, candidate.score, t + 1, alpha);
            } else {
                memcpy(next + num_next * stride, alive + candidate.row * stride, t * sizeof(int));
                next[num_next * stride + t] = candidate.token;
                next_score[num_next] = candidate.score;
                parent[num_next] = candidate.row;
                tokens[num_next++] = candidate.token;
            }
        }
        if (finished.count == beam_size || num_next == 0) break;
        if (t + 1 == limit) { // out of positions: the alive beams end here, without </s>
            for (int i = 0; i < num_next && finished.count < beam_size; i++)
                finish_hypothesis(&finished, next + i * stride, t + 1, next_score[i], t + 1, alpha);
            break;
        }
        decoder_cache_reorder(&cache, model, parent, num_next, t + 1);
        int *swap = alive; alive = next; next = swap;
        double *swap_score = alive_score; alive_score = next_score; next_score = swap_score;
        num_alive = num_next;
    }
    int length = finished.count ? finished.length[finished.best] : 0;
    memcpy(out, finished.tokens + finished.best * stride, length * sizeof(int));
    if (score) *score = finished.count ? finished.score[finished.best] : -INFINITY;
    decoder_cache_free(&cache);
    free(alive); free(next); free(alive_score); free(next_score); free(parent); free(tokens); free(best);
    free(finished.tokens); free(finished.length); free(finished.score);
    model->training = training;
    return length;
}

// ==== The machinery ==========================================================
// What the model above takes for granted: allocation that cannot fail silently, our own random
// numbers (a seed gives the same model on every machine), the parameters' names, sizes and initial
// values, the memory of the activations, and the checks of a configuration and of a batch.

// count x size bytes, at least 1, or a clear exit if that overflows a size_t.
static size_t checked_bytes(size_t count, size_t size, const char *what) {
    if (count == 0) count = 1;
    if (size != 0 && count > SIZE_MAX / size) { fprintf(stderr, "error: %s%s: %zu x %zu bytes overflows\n", error_context, what, count, size); exit(1); }
    return count * size;
}

// p, the answer of an allocation of `bytes` bytes, or a clear exit if it failed.
static void *allocated(void *p, size_t bytes, const char *what) {
    if (!p) { fprintf(stderr, "error: %sout of memory allocating %s (%zu bytes)\n", error_context, what, bytes); exit(1); }
    return p;
}

static void *checked_calloc(size_t count, size_t size, const char *what) {
    size_t bytes = checked_bytes(count, size, what);
    return allocated(calloc(bytes, 1), bytes, what);
}

// splitmix64's output function: outputs that look independent for consecutive inputs
static uint64_t hash64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// [0, 1) from the top 53 bits of 64 random ones
static double unit_interval(uint64_t bits) { return (double)(bits >> 11) * (1.0 / 9007199254740992.0); }

static void rng_seed(Rng *rng, uint64_t seed) {   // nearby seeds give unrelated streams; the state is never 0
    uint64_t z = hash64(seed + 0x9E3779B97F4A7C15ULL);
    rng->state = z ? z : 0x2545F4914F6CDD1DULL;
}

static uint64_t rng_next(Rng *rng) { // xorshift64*
    rng->state ^= rng->state >> 12;
    rng->state ^= rng->state << 25;
    rng->state ^= rng->state >> 27;
    return rng->state * 0x2545F4914F6CDD1DULL;
}

static double rng_uniform(Rng *rng) { return unit_interval(rng_next(rng)); }   // [0, 1)
static int rng_below(Rng *rng, int n) { return (int)(rng_uniform(rng) * n); }   // uniform integer in [0, n)

static double rng_normal(Rng *rng) { // Box-Muller
    double u1 = 1.0 - rng_uniform(rng); // (0, 1]: log(u1) is finite
    double u2 = rng_uniform(rng);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

// ---- the configuration (transformer_config_check, below, says what it may hold) ----

TransformerConfig transformer_default_config(void) {
    return (TransformerConfig){
        .n_layers = 2, .d_model = 64, .d_ff = 256, .n_heads = 4, .vocab_size = 32, .max_len = 64,
        .positional = POSITIONAL_SINUSOID,   // §3.5; POSITIONAL_LEARNED is Table 3's row E
        .dropout = 0.1f, .label_smoothing = 0.1f,   // §5.4 P_drop and eps_ls of the base model
        .layer_norm_eps = 1e-5f,   // PyTorch's default; the paper gives none
    };
}

// ---- parameters: sizes, names, one allocation with named pointers (the list: transformer.h) ----

#define PARAMETER_NAME(name, numbers) #name,
static const char *parameter_names[NUM_PARAMETER_TENSORS] = { PARAMETER_TENSORS(PARAMETER_NAME) };

static void parameter_sizes(size_t sizes[NUM_PARAMETER_TENSORS], const TransformerConfig *config) {
    size_t L = config->n_layers, C = config->d_model, F = config->d_ff, V = config->vocab_size, i = 0;
    size_t learned_rows = config->positional == POSITIONAL_LEARNED ? (size_t)config->max_len : 0;
    #define PARAMETER_SIZE(name, numbers) sizes[i++] = numbers;
    PARAMETER_TENSORS(PARAMETER_SIZE)
}

// The named pointers of a ParameterTensors, in storage order.
static void parameter_pointers(real **ptrs[NUM_PARAMETER_TENSORS], ParameterTensors *of) {
    int i = 0;
    #define PARAMETER_POINTER(name, numbers) ptrs[i++] = &of->name;
    PARAMETER_TENSORS(PARAMETER_POINTER)
}

// Points the named tensors into memory laid out in the order above.
static void point_parameters(ParameterTensors *tensors, real *block, const size_t sizes[NUM_PARAMETER_TENSORS]) {
    real **ptrs[NUM_PARAMETER_TENSORS];
    parameter_pointers(ptrs, tensors);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) { *ptrs[i] = block; block += sizes[i]; }
}

// Xavier-uniform (Glorot & Bengio 2010) of a (rows, cols) matrix: U(-a, a), a = sqrt(6 / (fan_in + fan_out))
static void xavier_uniform(real *w, size_t rows, size_t cols, Rng *rng) {
    double bound = sqrt(6.0 / (double)(rows + cols));
    for (size_t i = 0; i < rows * cols; i++) w[i] = (real)((2.0 * rng_uniform(rng) - 1.0) * bound);
}

// Initialisation (the paper gives none; PyTorch's and the common reimplementations'): Xavier-uniform
// for every projection matrix (W^Q, W^K, W^V, W^O each on its own, W_1, W_2); the embedding and
// learned positions normal, standard deviation d_model^-0.5 (tensor2tensor, fairseq); zero biases,
// layer-norm gain 1. The positions come last: a seed gives the same other weights with either kind.
static void initialize_parameters(Transformer *model, uint64_t seed) {
    const TransformerConfig *config = &model->config;
    size_t L = config->n_layers, C = config->d_model, F = config->d_ff, V = config->vocab_size;
    ParameterTensors *params = &model->params;
    Rng rng;
    rng_seed(&rng, seed);
    memset(model->params_memory, 0, model->num_parameters * sizeof(real));
    double std = 1.0 / sqrt((double)C);
    for (size_t i = 0; i < V * C; i++) params->embedding[i] = (real)(std * rng_normal(&rng));
    real *qkv[3] = { params->enc_qkv_w, params->dec_self_qkv_w, params->dec_cross_qkv_w };
    real *out[3] = { params->enc_out_w, params->dec_self_out_w, params->dec_cross_out_w };
    for (size_t l = 0; l < L; l++) {
        for (int kind = 0; kind < 3; kind++) {   // encoder, decoder self-, encoder-decoder attention
            for (int part = 0; part < 3; part++)   // W^Q, W^K, W^V
                xavier_uniform(qkv[kind] + (l * 3 + part) * C * C, C, C, &rng);
            xavier_uniform(out[kind] + l * C * C, C, C, &rng);
        }
        xavier_uniform(params->enc_ff1_w + l * F * C, F, C, &rng);
        xavier_uniform(params->enc_ff2_w + l * C * F, C, F, &rng);
        xavier_uniform(params->dec_ff1_w + l * F * C, F, C, &rng);
        xavier_uniform(params->dec_ff2_w + l * C * F, C, F, &rng);
    }
    real *gains[5] = { params->enc_ln1_g, params->enc_ln2_g, params->dec_ln1_g, params->dec_ln2_g, params->dec_ln3_g };
    for (int gain = 0; gain < 5; gain++)
        for (size_t i = 0; i < L * C; i++) gains[gain][i] = 1;
    if (config->positional == POSITIONAL_LEARNED)
        for (size_t i = 0; i < (size_t)config->max_len * C; i++)
            params->position_embedding[i] = (real)(std * rng_normal(&rng));
}

// ---- the model's memory: arenas, building and freeing a model, the checks ------

// The model's tensors live in arenas of zeros, each tensor on a 64-byte cache line: the fast path's
// vector loads straddling two lines cost two (5% of a toy step; dev/PERFORMANCE.md). calloc leaves
// pages never written unbacked (decoding never touches the gradients), so this asks it for one line
// more, returns the first line boundary in it, and keeps calloc's address below it for arena_free.
#define CACHE_LINE 64
_Static_assert(_Alignof(max_align_t) >= sizeof(void *), "room below the aligned address for a pointer");

static size_t lines_of(size_t bytes) { return bytes / CACHE_LINE + (bytes % CACHE_LINE != 0); }   // the lines bytes fill

static real *arena_calloc(size_t count, const char *what) {
    size_t bytes = checked_bytes(count, sizeof(real), what);
    unsigned char *block = checked_calloc(lines_of(bytes) + 1, CACHE_LINE, what);
    unsigned char *aligned = block + CACHE_LINE - (uintptr_t)block % CACHE_LINE;
    memcpy(aligned - sizeof block, &block, sizeof block);
    return (real *)aligned;
}

static void arena_free(real *p) {
    if (!p) return;
    unsigned char *block;
    memcpy(&block, (unsigned char *)p - sizeof block, sizeof block);
    free(block);
}

// `count` numbers rounded up to whole cache lines: the next tensor of an arena starts on a line too
static size_t whole_lines(size_t count) {
    size_t per_line = CACHE_LINE / sizeof(real);
    return (count + per_line - 1) / per_line * per_line;
}

// One new arena for the n tensors, in the order given, each at a cache line
static real *arena_of(Tensor *tensors, int n, const char *what) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += whole_lines(tensors[i].size);
    real *arena = arena_calloc(total, what), *next = arena;
    for (int i = 0; i < n; i++) { *tensors[i].tensor = next; next += whole_lines(tensors[i].size); }
    return arena;
}

// Makes the activations and scratch big enough for a (B, S, T) batch. A smaller batch
// reuses them: the per-layer offsets come from its own B, S, T.
static void ensure_buffers(Transformer *model, int batch_B, int batch_S, int batch_T) {
    if (model->acts_memory && batch_B <= model->cap_B && batch_S <= model->cap_S && batch_T <= model->cap_T) return;
    const TransformerConfig *config = &model->config;
    size_t B = batch_B > model->cap_B ? batch_B : model->cap_B, S = batch_S > model->cap_S ? batch_S : model->cap_S;
    size_t T = batch_T > model->cap_T ? batch_T : model->cap_T, L = config->n_layers, C = config->d_model;
    size_t F = config->d_ff, NH = config->n_heads, V = config->vocab_size, rows = B * (S > T ? S : T);
    ActivationTensors *a = &model->acts;
    BackwardScratch *d = &model->scratch;
    #define ACTIVATION_SIZE(name, numbers) { &a->name, numbers },
    #define SCRATCH_SIZE(name, numbers) { &d->name, numbers },
    Tensor acts[] = { ACTIVATION_TENSORS(ACTIVATION_SIZE) }, scratch[] = { SCRATCH_TENSORS(SCRATCH_SIZE) };
    arena_free(model->acts_memory); arena_free(model->scratch_memory);
    model->acts_memory = arena_of(acts, NUM_ACTIVATION_TENSORS, "activations");
    model->scratch_memory = arena_of(scratch, NUM_SCRATCH_TENSORS, "backward scratch");
    model->cap_B = (int)B; model->cap_S = (int)S; model->cap_T = (int)T;
}

static size_t sum_sizes(const size_t *sizes, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += sizes[i];
    return total;
}

const char *transformer_build(Transformer *model, const TransformerConfig *config, uint64_t seed) {
    memset(model, 0, sizeof *model);
    const char *error = transformer_config_check(config);
    if (error) return error;
    model->config = *config;
    parameter_sizes(model->param_sizes, config);
    model->num_parameters = sum_sizes(model->param_sizes, NUM_PARAMETER_TENSORS);
    model->params_memory = arena_calloc(model->num_parameters, "parameters");
    model->grads_memory = arena_calloc(model->num_parameters, "gradients");
    model->adam_m = arena_calloc(model->num_parameters, "Adam first moments");
    model->adam_v = arena_calloc(model->num_parameters, "Adam second moments");
    point_parameters(&model->params, model->params_memory, model->param_sizes);
    point_parameters(&model->grads, model->grads_memory, model->param_sizes);
    model->adam = (AdamConfig){ .beta1 = 0.9, .beta2 = 0.98, .eps = 1e-9 };   // §5.3
    if (config->positional == POSITIONAL_LEARNED) {
        model->positional_encoding = model->params.position_embedding;   // a parameter (Table 3, row E)
    } else {
        model->positional_encoding = arena_calloc((size_t)config->max_len * config->d_model, "positional encoding");
        positional_encoding_init(model->positional_encoding, config->max_len, config->d_model);
    }
    initialize_parameters(model, seed);
    rng_seed(&model->dropout_rng, seed ^ 0xD0D0D0D0ULL);
    model->training = 1;
    return NULL;
}

void transformer_free(Transformer *model) {
    real *sinusoids = model->config.positional == POSITIONAL_SINUSOID ? model->positional_encoding : NULL;
    real *arenas[] = { model->params_memory, model->grads_memory, model->adam_m, model->adam_v, sinusoids,
                       model->acts_memory, model->scratch_memory };
    for (size_t i = 0; i < sizeof arenas / sizeof *arenas; i++) arena_free(arenas[i]);
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
#define REQUIRE(cond, ...) do { if (!(cond)) return errorf(__VA_ARGS__); } while (0)   // the error unless cond

// Returns NULL when the config is usable, else a message naming the bad field.
const char *transformer_config_check(const TransformerConfig *config) {
    REQUIRE(config->n_layers >= 1 && config->n_layers <= TRANSFORMER_MAX_LAYERS, "n_layers is %d, expected 1..%d",
            config->n_layers, TRANSFORMER_MAX_LAYERS);
    REQUIRE(config->d_model >= 1 && config->d_model <= TRANSFORMER_MAX_WIDTH, "d_model is %d, expected 1..%d",
            config->d_model, TRANSFORMER_MAX_WIDTH);
    REQUIRE(config->d_ff >= 1 && config->d_ff <= TRANSFORMER_MAX_WIDTH, "d_ff is %d, expected 1..%d", config->d_ff,
            TRANSFORMER_MAX_WIDTH);
    REQUIRE(config->n_heads >= 1 && config->n_heads <= config->d_model, "n_heads is %d, expected 1..d_model (%d)",
            config->n_heads, config->d_model);
    REQUIRE(config->d_model % config->n_heads == 0, "d_model (%d) is not divisible by n_heads (%d)", config->d_model,
            config->n_heads);
    REQUIRE(config->vocab_size > NUM_SPECIAL_TOKENS && config->vocab_size <= TRANSFORMER_MAX_VOCAB, "vocab_size is %d, "
            "expected %d..%d (4 special tokens + words)", config->vocab_size, NUM_SPECIAL_TOKENS + 1, TRANSFORMER_MAX_VOCAB);
    REQUIRE(config->max_len >= 2 && config->max_len <= TRANSFORMER_MAX_LEN, "max_len is %d, expected 2..%d",
            config->max_len, TRANSFORMER_MAX_LEN);
    REQUIRE(config->positional == POSITIONAL_SINUSOID || config->positional == POSITIONAL_LEARNED, "positional is %d, "
            "expected %d (sinusoid) or %d (learned)", config->positional, POSITIONAL_SINUSOID, POSITIONAL_LEARNED);
    REQUIRE(config->dropout >= 0.0f && config->dropout < 1.0f, "dropout is %g, expected 0 <= dropout < 1",
            (double)config->dropout);
    REQUIRE(config->label_smoothing >= 0.0f && config->label_smoothing < 1.0f, "label_smoothing is %g, expected "
            "0 <= eps_ls < 1", (double)config->label_smoothing);
    REQUIRE(config->layer_norm_eps > 0.0f && config->layer_norm_eps < 1.0f, "layer_norm_eps is %g, expected 0 < eps < 1",
            (double)config->layer_norm_eps);
    return NULL;
}

// Returns NULL when the batch fits the model, else what is wrong with it.
const char *batch_check(const Batch *batch, const TransformerConfig *config) {
    int B = batch->B, S = batch->S, T = batch->T, V = config->vocab_size;
    REQUIRE(B >= 1 && S >= 1 && T >= 1, "batch shape %d x %d x %d, expected positive sizes", B, S, T);
    REQUIRE(S <= config->max_len && T <= config->max_len, "batch lengths %d (source) and %d (target) exceed max_len %d",
            S, T, config->max_len);
    for (int b = 0; b < B; b++) {
        REQUIRE(batch->src_len[b] >= 1 && batch->src_len[b] <= S, "sentence %d: source length %d, expected 1..%d", b,
                batch->src_len[b], S);
        REQUIRE(batch->tgt_len[b] >= 1 && batch->tgt_len[b] <= T, "sentence %d: target length %d, expected 1..%d", b,
                batch->tgt_len[b], T);
        for (int s = 0; s < S; s++) {
            int token = batch->src[b * S + s];
            REQUIRE(token >= 0 && token < V, "sentence %d: source token %d at %d outside the vocabulary 0..%d", b,
                    token, s, V - 1);
        }
        for (int t = 0; t < T; t++) {
            int in = batch->tgt_in[b * T + t], out = batch->tgt_out[b * T + t];
            REQUIRE(in >= 0 && in < V && out >= 0 && out < V, "sentence %d: target token %d/%d at %d outside the "
                    "vocabulary 0..%d", b, in, out, t, V - 1);
        }
    }
    return NULL;
}

// ######## PART II   THE PROGRAM #############################################
// The smallest program that trains the model of Part I and translates with it. What can fail
// returns NULL, or one line saying what is wrong: the file (and line) or the value, and what was
// expected. The companions in lab/ add to it through the hooks of "where the lab plugs in".

static void *checked_realloc(void *p, size_t count, size_t size, const char *what) {
    size_t bytes = checked_bytes(count, size, what);
    return allocated(realloc(p, bytes), bytes, what);
}

static double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#ifdef _OPENMP
static void set_threads(int threads) { if (threads > 0) omp_set_num_threads(threads); }   // 0: all cores
static int thread_count(void) { return omp_get_max_threads(); }
#else
static void set_threads(int threads) { (void)threads; }
static int thread_count(void) { return 1; }
#endif

// ---- vocabulary -------------------------------------------------------------
// §3.4: one vocabulary for source and target (the embedding is shared): ids 0..3 are <pad> <s>
// </s> <unk>, then the data's tokens in order of first appearance; text -> id by open addressing.

static const char *special_tokens[NUM_SPECIAL_TOKENS] = { "<pad>", "<s>", "</s>", "<unk>" };

// The slot of the n bytes at word: where its id is, or the empty slot where it would go.
static size_t vocab_slot(const Vocabulary *vocab, const char *word, size_t n) {
    uint32_t hash = 2166136261u;   // FNV-1a
    for (size_t i = 0; i < n; i++) { hash ^= (unsigned char)word[i]; hash *= 16777619u; }
    size_t mask = vocab->num_slots - 1, i = hash & mask;
    for (int id; (id = vocab->slots[i]) >= 0; i = (i + 1) & mask)
        if (strncmp(vocab->words[id], word, n) == 0 && vocab->words[id][n] == '\0') break;
    return i;
}

// The id of the n bytes at word, or -1.
static int vocab_find(const Vocabulary *vocab, const char *word, size_t n) { return vocab->slots[vocab_slot(vocab, word, n)]; }

// The id of the n bytes at word, added to the vocabulary if new.
static int vocab_add(Vocabulary *vocab, const char *word, size_t n) {
    int id = vocab_find(vocab, word, n);
    if (id >= 0) return id;
    if (vocab->size == vocab->capacity) {
        vocab->capacity = vocab->capacity ? 2 * vocab->capacity : 64;
        vocab->words = checked_realloc(vocab->words, vocab->capacity, sizeof(char *), "vocabulary");
    }
    if (2 * (size_t)(vocab->size + 1) > vocab->num_slots) {   // keep the table at most half full
        free(vocab->slots);
        vocab->num_slots *= 2;
        vocab->slots = checked_calloc(vocab->num_slots, sizeof(int), "vocabulary table");
        for (size_t i = 0; i < vocab->num_slots; i++) vocab->slots[i] = -1;
        for (int i = 0; i < vocab->size; i++)
            vocab->slots[vocab_slot(vocab, vocab->words[i], strlen(vocab->words[i]))] = i;
    }
    vocab->words[vocab->size] = checked_calloc(n + 1, 1, "vocabulary word");
    memcpy(vocab->words[vocab->size], word, n);
    vocab->slots[vocab_slot(vocab, word, n)] = vocab->size;
    return vocab->size++;
}

static void vocab_init(Vocabulary *vocab) {
    memset(vocab, 0, sizeof *vocab);
    vocab->num_slots = 64;
    vocab->slots = checked_calloc(vocab->num_slots, sizeof(int), "vocabulary table");
    for (size_t i = 0; i < vocab->num_slots; i++) vocab->slots[i] = -1;
    for (int i = 0; i < NUM_SPECIAL_TOKENS; i++) vocab_add(vocab, special_tokens[i], strlen(special_tokens[i]));
}

// ---- the command line -------------------------------------------------------
// Each command reads its flags from a table: a bad flag gets one line naming it and saying what
// was expected, and --help prints the table with the defaults.

// Reads text into the option's value; returns 0 (and writes, in expected, what would do) if it is not one.
static int parse_option_value(const Option *o, const char *text, char *expected, size_t size) {
    const char *above = o->above_min ? ">" : ">=";
    if (o->kind == OPTION_INT && o->max >= INT_MAX) snprintf(expected, size, "an integer >= %.0f", o->min);
    else if (o->kind == OPTION_INT) snprintf(expected, size, "an integer from %.0f to %.0f", o->min, o->max);
    else if (o->max >= DBL_MAX) snprintf(expected, size, "a number %s %g", above, o->min);
    else snprintf(expected, size, "a number %s %g and <= %g", above, o->min, o->max);
    if (!text) return 0;
    if (o->kind == OPTION_TEXT) { *(const char **)o->value = text; return 1; }
    char *end;
    errno = 0;
    double x = o->kind == OPTION_INT ? (double)strtol(text, &end, 10) : strtod(text, &end);
    if (end == text || *end || errno || !isfinite(x) || x < o->min || x > o->max || (o->above_min && !(x > o->min)))
        return 0;
    if (o->kind == OPTION_INT) *(int *)o->value = (int)x; else *(double *)o->value = x;
    return 1;
}

static Option *find_option(Option *options, int n, const char *name) {
    for (int i = 0; i < n; i++) if (strcmp(options[i].name, name) == 0) return &options[i];
    return NULL;
}

static void print_option_help(const Option *options, int n) {
    for (const Option *o = options; o < options + n; o++) {
        char left[64], value[64] = "";
        const char *kinds[] = { "N", "X", "TEXT", "" };
        snprintf(left, sizeof left, "%s %s", o->name, kinds[o->kind]);
        if (o->kind == OPTION_INT) snprintf(value, sizeof value, "%d", *(int *)o->value);
        else if (o->kind == OPTION_NUMBER) snprintf(value, sizeof value, "%g", *(double *)o->value);
        else if (o->kind == OPTION_TEXT && *(const char **)o->value) snprintf(value, sizeof value, "%s", *(const char **)o->value);
        if (value[0]) printf("  %-22s %s (default %s)\n", left, o->help, value);
        else printf("  %-22s %s\n", left, o->help);
    }
}

// Reads argv[1..argc-1] into the options; arguments that are not flags go to positional (when it is
// not NULL). Returns 0, or 1 after printing a one-line error, or 2 after printing the help.
static int parse_options(const char *command, const char *usage, Option *options, int n,
                         int argc, char **argv, char **positional, int *num_positional) {
    if (num_positional) *num_positional = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            printf(n > 0 ? "%s\noptions:\n" : "%s\n", usage);
            print_option_help(options, n);
            return 2;
        }
        if (arg[0] != '-' || arg[1] == '\0' || (positional && isdigit((unsigned char)arg[1]))) {
            if (positional) { positional[(*num_positional)++] = argv[i]; continue; }
            fprintf(stderr, "error: %s: unexpected argument '%s'; see ./transformer %s --help\n", command, arg, command);
            return 1;
        }
        Option *o = find_option(options, n, arg);
        if (!o) {
            fprintf(stderr, "error: %s: unknown flag '%s'; see ./transformer %s --help\n", command, arg, command);
            return 1;
        }
        o->seen = 1;
        if (o->kind == OPTION_FLAG) { *(int *)o->value = 1; continue; }
        char expected[96];
        const char *text = i + 1 < argc && !(o->kind == OPTION_TEXT && strncmp(argv[i + 1], "--", 2) == 0) ? argv[++i] : NULL;
        if (parse_option_value(o, text, expected, sizeof expected)) continue;
        if (!text && o->kind == OPTION_TEXT) fprintf(stderr, "error: %s: flag %s needs a value\n", command, arg);
        else if (!text) fprintf(stderr, "error: %s: flag %s needs a value (%s)\n", command, arg, expected);
        else fprintf(stderr, "error: %s: %s '%s' is not valid; expected %s\n", command, arg, text, expected);
        return 1;
    }
    return 0;
}

// ---- where the lab plugs in -------------------------------------------------
// lab/lab.c (make's ./transformer) fills in these hooks (transformer.h, LabHooks: commands, train
// flags, the stages of training, §5.1 subwords); alone they are empty. Each is on a line marked "lab:".
static LabHooks lab;

static void vocab_free(Vocabulary *vocab) {
    if (vocab->bpe && lab.free_merges) lab.free_merges(vocab->bpe);   // lab: §5.1 merges
    for (int i = 0; i < vocab->size; i++) free(vocab->words[i]);
    free(vocab->words); free(vocab->slots);
    memset(vocab, 0, sizeof *vocab);
}

// ---- white space ------------------------------------------------------------
// One set of white-space characters separates tokens everywhere (data, decode's input, BLEU): the
// set Python's str.split() splits at, so that BLEU counts what sacreBLEU's tokenize='none' counts.
// ASCII's \t \n \v \f \r and space, U+001C..U+001F, U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028,
// U+2029, U+202F, U+205F and U+3000; not the zero-width space U+200B, nor a lone Latin-1 0xA0.

// The length of the white-space character that begins the text, or 0 (never reads past the end)
static int white_space_bytes(const char *text) {
    const unsigned char *s = (const unsigned char *)text;
    if (s[0] == ' ' || (s[0] >= 0x09 && s[0] <= 0x0D) || (s[0] >= 0x1C && s[0] <= 0x1F)) return 1;
    if (s[0] == 0xC2) return s[1] == 0x85 || s[1] == 0xA0 ? 2 : 0;                // U+0085 U+00A0
    if (s[0] == 0xE1) return s[1] == 0x9A && s[2] == 0x80 ? 3 : 0;                // U+1680
    if (s[0] == 0xE2 && s[1] == 0x80)                                             // U+2000..U+202F
        return (s[2] >= 0x80 && s[2] <= 0x8A) || s[2] == 0xA8 || s[2] == 0xA9 || s[2] == 0xAF ? 3 : 0;
    if (s[0] == 0xE2 && s[1] == 0x81) return s[2] == 0x9F ? 3 : 0;                // U+205F
    if (s[0] == 0xE3) return s[1] == 0x80 && s[2] == 0x80 ? 3 : 0;                // U+3000
    return 0;
}

static const char *skip_white_space(const char *text) {
    for (int n; (n = white_space_bytes(text)) > 0; ) text += n;
    return text;
}

// The first token of the text and its length in bytes (*length), or NULL. (A byte at a time is
// safe: white space never begins with a UTF-8 continuation byte.)
static const char *next_token(const char *text, size_t *length) {
    const char *start = skip_white_space(text), *end = start;
    if (!*start) return NULL;
    while (*end && !white_space_bytes(end)) end++;
    *length = (size_t)(end - start);
    return start;
}

// Every text input is UTF-8: a byte that is not (Latin-1, a binary file) is refused with its file
// and line, as a program that splits at Unicode's spaces must (NOTES §7). The length of the valid
// UTF-8 sequence at s, or 0 (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF).
static int utf8_sequence_length(const unsigned char *s) {
    if (s[0] < 0x80) return 1;
    int n = s[0] >= 0xC2 && s[0] <= 0xDF ? 2 : s[0] >= 0xE0 && s[0] <= 0xEF ? 3 : s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] >= 0xA0) ||
        (s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] >= 0x90)) return 0;
    return n;
}

// NULL for a line of UTF-8 text, else the first byte that is not, at `where` ("data.tsv:12").
// got: read_text_line's answer (-1: a zero byte).
static const char *text_error(const char *line, int got, const char *where) {
    if (got < 0) return errorf("%s: a zero byte; expected text", where);
    for (const unsigned char *s = (const unsigned char *)line; *s; ) {
        int n = utf8_sequence_length(s);
        if (n == 0) return errorf("%s: byte %zu of the line, 0x%02x, is not UTF-8; expected UTF-8 text", where,
                                  (size_t)(s - (const unsigned char *)line) + 1, *s);
        s += n;
    }
    return NULL;
}

// ---- sentence pairs, and reading them ---------------------------------------

static void dataset_free(Dataset *dataset) { free(dataset->pairs); free(dataset->tokens); memset(dataset, 0, sizeof *dataset); }

static void dataset_add(Dataset *dataset, const int *src, int src_len, const int *tgt, int tgt_len, int line) {
    if (dataset->count == dataset->capacity) {
        dataset->capacity = dataset->capacity ? 2 * dataset->capacity : 256;
        dataset->pairs = checked_realloc(dataset->pairs, dataset->capacity, sizeof(SentencePair), "sentence pairs");
    }
    if (dataset->num_tokens + src_len + tgt_len > dataset->tokens_capacity) {
        dataset->tokens_capacity = 2 * (dataset->num_tokens + src_len + tgt_len) + 1024;
        dataset->tokens = checked_realloc(dataset->tokens, dataset->tokens_capacity, sizeof(int), "sentence tokens");
    }
    SentencePair pair = { dataset->num_tokens, dataset->num_tokens + src_len, src_len, tgt_len, line };
    dataset->pairs[dataset->count++] = pair;
    memcpy(dataset->tokens + pair.src, src, src_len * sizeof(int));
    memcpy(dataset->tokens + pair.tgt, tgt, tgt_len * sizeof(int));
    dataset->num_tokens += src_len + tgt_len;
    if (src_len > dataset->longest_src) dataset->longest_src = src_len;
    if (tgt_len > dataset->longest_tgt) dataset->longest_tgt = tgt_len;
}

// Moves every `every`-th pair (the every-th, 2·every-th, ...) of dataset into held_out.
static void dataset_split(Dataset *dataset, Dataset *held_out, int every) {
    Dataset kept = { 0 };
    for (int i = 0; i < dataset->count; i++) {
        const SentencePair *p = &dataset->pairs[i];
        dataset_add((i + 1) % every == 0 ? held_out : &kept, dataset->tokens + p->src, p->src_len,
                    dataset->tokens + p->tgt, p->tgt_len, p->line);
    }
    dataset_free(dataset); *dataset = kept;
}

#define MAX_UNKNOWN_WARNINGS 5

// The id of the n bytes at token. grow: a new token joins the vocabulary; else it is <unk>, warned of.
static int token_id(Vocabulary *vocab, int grow, const char *token, size_t n, TextSource *from) {
    int id = grow ? vocab_add(vocab, token, n) : vocab_find(vocab, token, n);
    if (id >= 0) return id;
    if (from->warnings++ < MAX_UNKNOWN_WARNINGS)
        fprintf(stderr, "warning: %s: token '%.*s' is not in the vocabulary; read as <unk>\n",
                from->where, (int)(n < 80 ? n : 80), token);
    from->unknown++;
    return TOKEN_UNK;
}

static void push_id(int **ids, size_t *capacity, int n, int id) {
    if ((size_t)n == *capacity) *ids = checked_realloc(*ids, *capacity = *capacity ? 2 * *capacity : 64, sizeof(int), "token ids");
    (*ids)[n] = id;
}

// The text <pad>, <s>, </s> or <unk> in data is refused: the model would learn, or be fed, its own markers.
static const char *reserved_token_error(const TextSource *from) {
    return errorf("%s: the token '%s' is reserved (<pad> <s> </s> <unk> are the model's own markers); "
                  "expected text without them", from->where, from->reserved);
}

// Splits text at white space into token ids (*ids grows as needed): whole words, or with the lab's
// §5.1 merges subwords. Returns the number of tokens, or -1 at a special token (from->reserved).
static int tokenize(const char *text, Vocabulary *vocab, int grow, int **ids, size_t *capacity, TextSource *from) {
    int n = 0;
    size_t len;
    for (const char *start = text; (start = next_token(start, &len)) != NULL; start += len) {
        for (int special = 0; special < NUM_SPECIAL_TOKENS; special++)
            if (strlen(special_tokens[special]) == len && memcmp(start, special_tokens[special], len) == 0) {
                from->reserved = special_tokens[special];
                return -1;
            }
        if (vocab->bpe && lab.split_word) n = lab.split_word(vocab, grow, start, (int)len, ids, capacity, n, from);   // lab: §5.1
        else push_id(ids, capacity, n++, token_id(vocab, grow, start, len, from));
    }
    return n;
}

// The tokens as a new string, separated by spaces (with §5.1 merges, joined into words by the lab)
static char *tokens_to_text(const Vocabulary *vocab, const int *ids, int n) {
    if (vocab->bpe && lab.join_tokens) return lab.join_tokens(vocab, ids, n);   // lab: §5.1
    size_t bytes = 1;
    for (int i = 0; i < n; i++) bytes += strlen(vocab->words[ids[i]]) + 1;
    char *text = checked_calloc(bytes, 1, "text"), *out = text;
    for (int i = 0; i < n; i++) out += sprintf(out, i ? " %s" : "%s", vocab->words[ids[i]]);
    return text;
}

static void print_tokens(FILE *f, const Vocabulary *vocab, const int *ids, int n) {
    char *text = tokens_to_text(vocab, ids, n);
    fputs(text, f);
    free(text);
}

// Line line_no (from 1) of f into *line, without its end and (line 1) a UTF-8 byte-order mark.
// Returns 1, 0 at the end, -1 for a line with a zero byte.
static int read_text_line(FILE *f, char **line, size_t *capacity, int line_no) {
    ssize_t length = getline(line, capacity, f);
    if (length < 0) return 0;
    if (line_no == 1 && length >= 3 && memcmp(*line, "\xEF\xBB\xBF", 3) == 0) {
        memmove(*line, *line + 3, (size_t)length - 2);
        length -= 3;
    }
    while (length > 0 && ((*line)[length - 1] == '\n' || (*line)[length - 1] == '\r')) (*line)[--length] = '\0';
    return strlen(*line) == (size_t)length ? 1 : -1;
}

// Opens a text file to read, or sets *error (fopen opens a directory too, read as empty).
static FILE *open_text_file(const char *path, const char **error) {
    FILE *f = fopen(path, "r");
    struct stat st;
    if (!f) *error = errorf("%s: cannot open: %s", path, strerror(errno));
    else if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        f = NULL;
        *error = errorf("%s: is a directory; expected a text file", path);
    }
    return f;
}

// Reads `source<TAB>target` lines into dataset (blank lines skipped; \r\n ends a line); grow as token_id.
static const char *dataset_read_tsv(Dataset *dataset, Vocabulary *vocab, const char *path, int grow) {
    const char *error = NULL;
    FILE *f = open_text_file(path, &error);
    if (!f) return error;
    char *line = NULL;
    size_t line_capacity = 0, src_capacity = 0, tgt_capacity = 0, unused;
    int *src = NULL, *tgt = NULL, line_no = 0, got;
    TextSource from = { "", 0, 0, NULL };
    while (!error && (got = read_text_line(f, &line, &line_capacity, line_no + 1)) != 0) {
        snprintf(from.where, sizeof from.where, "%s:%d", path, ++line_no);
        char *tab = strchr(line, '\t');
        if ((error = text_error(line, got, from.where))) break;
        if (!tab && !next_token(line, &unused)) continue;   // a blank line
        if (!tab) error = errorf("%s: no tab; expected source<TAB>target", from.where);
        else if (strchr(tab + 1, '\t')) error = errorf("%s: more than one tab; expected source<TAB>target", from.where);
        if (error) break;
        *tab = '\0';
        int n_src = tokenize(line, vocab, grow, &src, &src_capacity, &from);
        int n_tgt = n_src < 0 ? -1 : tokenize(tab + 1, vocab, grow, &tgt, &tgt_capacity, &from);
        if (n_tgt < 0) error = reserved_token_error(&from);
        else if (n_src == 0) error = errorf("%s: empty source; expected tokens before the tab", from.where);
        else if (n_tgt == 0) error = errorf("%s: empty target; expected tokens after the tab", from.where);
        else if (n_src > TRANSFORMER_MAX_LEN || n_tgt > TRANSFORMER_MAX_LEN)
            error = errorf("%s: %d tokens; expected at most %d", from.where, n_src > n_tgt ? n_src : n_tgt,
                           TRANSFORMER_MAX_LEN);
        else if (vocab->size > TRANSFORMER_MAX_VOCAB)
            error = errorf("%s: more than %d distinct tokens; expected fewer", from.where, TRANSFORMER_MAX_VOCAB);
        else dataset_add(dataset, src, n_src, tgt, n_tgt, line_no);
    }
    if (!error && ferror(f)) error = errorf("%s: read error: %s", path, strerror(errno));
    if (!error && dataset->count == 0)
        error = errorf("%s: no sentence pairs (%s); expected lines source<TAB>target",
                       path, line_no == 0 ? "the file is empty" : "only blank lines");
    if (!error && from.warnings > MAX_UNKNOWN_WARNINGS)
        fprintf(stderr, "warning: %s: %ld tokens in all are not in the vocabulary and were read as <unk>\n",
                path, from.unknown);
    free(line); free(src); free(tgt);
    fclose(f);
    return error;
}

// max_len positions take up to max_len - 1 tokens: the encoder reads x_1..x_n </s>, the decoder <s> y_1..y_n.
static const char *dataset_check_lengths(const Dataset *dataset, const char *name, int max_len) {
    for (int i = 0; i < dataset->count; i++) {
        const SentencePair *p = &dataset->pairs[i];
        int longer = p->src_len > p->tgt_len ? p->src_len : p->tgt_len;
        if (longer <= max_len - 1) continue;
        char where[300];
        if (p->line) snprintf(where, sizeof where, "%s:%d", name, p->line);
        else snprintf(where, sizeof where, "%s, pair %d", name, i + 1);
        int source = p->src_len > max_len - 1;
        return errorf("%s: the %s has %d tokens; the model's maximum length %d allows %d (one position is %s)", where,
                      source ? "source" : "target", longer, max_len, max_len - 1, source ? "</s>" : "<s>");
    }
    return NULL;
}

// ---- the copy and reverse tasks ---------------------------------------------
// copy: the target is the source; reverse: the source backwards. Words are the numbers
// 0..words-1. No held-out source is a training source: the model is tested on unseen sequences.

enum { TASK_COPY, TASK_REVERSE };

static void task_vocabulary(Vocabulary *vocab, int words) {
    vocab_init(vocab);
    for (int w = 0; w < words; w++) {
        char text[16];
        vocab_add(vocab, text, (size_t)snprintf(text, sizeof text, "%d", w));
    }
}

static const char *task_generate(Dataset *train, Dataset *valid, int task, int words, int min_len, int max_len,
                                 int train_size, int valid_size, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed ^ 0x7A5C0DA7A5EEDULL);
    size_t slots = 16;   // a set of the sources' hashes, open addressing (0: an empty slot)
    while (slots < 4 * ((size_t)train_size + valid_size)) slots *= 2;
    uint64_t *seen = checked_calloc(slots, sizeof(uint64_t), "task hash set");
    int *src = checked_calloc(max_len, sizeof(int), "task sentence"), *tgt = checked_calloc(max_len, sizeof(int), "task sentence");
    const char *error = NULL;
    long attempts = 0, max_attempts = 1000L * valid_size + 1000;
    for (int i = 0; i < train_size + valid_size; ) {
        int n = min_len + rng_below(&rng, max_len - min_len + 1);
        for (int t = 0; t < n; t++) src[t] = NUM_SPECIAL_TOKENS + rng_below(&rng, words);
        for (int t = 0; t < n; t++) tgt[t] = task == TASK_COPY ? src[t] : src[n - 1 - t];
        uint64_t hash = 0xCBF29CE484222325ULL ^ (uint64_t)n;
        for (int t = 0; t < n; t++) { hash ^= (uint32_t)src[t]; hash *= 0x100000001B3ULL; hash ^= hash >> 29; }
        size_t k = (hash = hash ? hash : 1) & (slots - 1);
        while (seen[k] != 0 && seen[k] != hash) k = (k + 1) & (slots - 1);
        int is_new = seen[k] == 0;
        seen[k] = hash;
        if (i < train_size || is_new) {   // the training pairs, then held-out ones with a new source (no repeat)
            dataset_add(i < train_size ? train : valid, src, n, tgt, n, 0);
            i++;
        } else if (++attempts > max_attempts) {
            error = errorf("cannot find %d held-out sequences outside the %d training sequences (found %d); expected "
                           "more --words or a larger --max-length", valid_size, train_size, valid->count);
            break;
        }
    }
    free(seen); free(src); free(tgt);
    return error;
}

// ---- batches ----------------------------------------------------------------
// §5.1: "Sentence pairs were batched together by approximate sequence length. Each training batch
// contained a set of sentence pairs containing approximately 25000 source tokens and 25000 target
// tokens." An epoch sorts the pairs by length (source, then target, random among equals), cuts them
// into batches of at most batch_tokens counting padding, and visits those in random order.

typedef struct { int src_len, tgt_len; uint64_t key; int index; } LengthKey;

static int compare_length_keys(const void *pa, const void *pb) {
    const LengthKey *a = pa, *b = pb;
    if (a->src_len != b->src_len) return a->src_len < b->src_len ? -1 : 1;
    if (a->tgt_len != b->tgt_len) return a->tgt_len < b->tgt_len ? -1 : 1;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

// The first `count` pairs sorted by length (among equals by a key from rng, or by index) into
// order, cut into batches of B x (S + T) <= batch_tokens (S, T: the longest + 1), or one pair.
static int sort_and_cut(int *order, BatchSpan *spans, const Dataset *dataset, int count, int batch_tokens, Rng *rng) {
    LengthKey *keys = checked_calloc(count, sizeof(LengthKey), "batch order");
    for (int i = 0; i < count; i++)
        keys[i] = (LengthKey){ dataset->pairs[i].src_len, dataset->pairs[i].tgt_len, rng ? rng_next(rng) : 0, i };
    qsort(keys, count, sizeof(LengthKey), compare_length_keys);
    for (int i = 0; i < count; i++) order[i] = keys[i].index;
    free(keys);
    int num_spans = 0;
    for (int i = 0; i < count; ) {
        int S = 0, T = 0, n = 0;
        while (i + n < count) {
            const SentencePair *p = &dataset->pairs[order[i + n]];
            int S2 = p->src_len + 1 > S ? p->src_len + 1 : S, T2 = p->tgt_len + 1 > T ? p->tgt_len + 1 : T;
            if (n > 0 && (long)(n + 1) * (S2 + T2) > batch_tokens) break;
            S = S2; T = T2; n++;
        }
        spans[num_spans++] = (BatchSpan){ i, n };
        i += n;
    }
    return num_spans;
}

// Draws the next epoch's batches from rng (serially: the same on any thread count).
static void epoch_plan_make(EpochPlan *plan, const Dataset *dataset, int batch_tokens, Rng *rng) {
    plan->order = checked_realloc(plan->order, dataset->count, sizeof(int), "epoch order");
    plan->spans = checked_realloc(plan->spans, dataset->count, sizeof(BatchSpan), "epoch batches");
    plan->num_spans = sort_and_cut(plan->order, plan->spans, dataset, dataset->count, batch_tokens, rng);
    for (int i = plan->num_spans - 1; i > 0; i--) {   // Fisher-Yates shuffle of the batches
        int j = rng_below(rng, i + 1);
        BatchSpan swap = plan->spans[i]; plan->spans[i] = plan->spans[j]; plan->spans[j] = swap;
    }
}

static void batch_buffer_free(BatchBuffer *bb) {
    free(bb->src); free(bb->src_len); free(bb->tgt_in); free(bb->tgt_out); free(bb->tgt_len); memset(bb, 0, sizeof *bb);
}

// Teacher forcing (§3.1: "the output embeddings are offset by one position"): the decoder reads
// tgt_in = <s> y_1 .. y_n and must predict tgt_out = y_1 .. y_n </s>. The source ends with </s>
// too, as in tensor2tensor and fairseq (the paper does not say): the copy task learns faster.
static void batch_fill(BatchBuffer *bb, const Dataset *dataset, const int *indices, int count) {
    size_t B = count, S = 1, T = 1;
    for (size_t b = 0; b < B; b++) {
        const SentencePair *p = &dataset->pairs[indices[b]];
        if ((size_t)p->src_len + 1 > S) S = p->src_len + 1;
        if ((size_t)p->tgt_len + 1 > T) T = p->tgt_len + 1;
    }
    batch_buffer_free(bb);   // a new batch's arrays, of zeros: <pad> where no token goes
    bb->src = checked_calloc(B * S, sizeof(int), "batch"), bb->src_len = checked_calloc(B, sizeof(int), "batch");
    bb->tgt_in = checked_calloc(B * T, sizeof(int), "batch"), bb->tgt_out = checked_calloc(B * T, sizeof(int), "batch");
    bb->tgt_len = checked_calloc(B, sizeof(int), "batch");
    bb->tokens = 0;
    for (size_t b = 0; b < B; b++) {
        const SentencePair *p = &dataset->pairs[indices[b]];
        const int *x = dataset->tokens + p->src, *y = dataset->tokens + p->tgt;
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
    Batch batch = { count, (int)S, (int)T, bb->src, bb->src_len, bb->tgt_in, bb->tgt_out, bb->tgt_len };
    bb->batch = batch;
}

// ---- §6.1 BLEU --------------------------------------------------------------
// The paper reports BLEU (Papineni et al., ACL 2002) on newstest2014: 27.3 (base) and 28.4 (big)
// for English-German. Corpus-level BLEU-4, one reference per sentence, no smoothing:
//   p_n  = (clipped n-gram matches) / (the output's n-grams), both summed over
//          the sentences, n = 1..4; an n-gram counts at most as often as the
//          reference has it ("the the the" against "the cat" matches one "the");
//   BP   = 1 if c > r, else exp(1 - r/c)   (c, r: output and reference lengths
//          summed over the corpus);   BLEU = 100 BP exp((1/4) sum_n log p_n).

// One distinct n-gram of a sentence pair: where it first occurs, its counts on each side.
typedef struct { const int *gram; int in_candidate, in_reference; } NgramCount;

// Clipped matches of order n: over the candidate's distinct n-grams, the sum of min(count in
// candidate, count in reference), counted in a hash table (mask + 1 slots): linear time.
static long long clipped_ngram_matches(NgramCount *table, size_t mask, const int *candidate, int candidate_len,
                                       const int *reference, int reference_len, int n) {
    memset(table, 0, (mask + 1) * sizeof *table);
    for (int side = 0; side < 2; side++) {
        const int *tokens = side == 0 ? candidate : reference;
        for (int i = 0; i + n <= (side == 0 ? candidate_len : reference_len); i++) {
            uint64_t hash = 0;
            for (int k = 0; k < n; k++) hash = hash64(hash ^ (uint32_t)tokens[i + k]);
            size_t slot = (size_t)hash & mask;
            while (table[slot].gram && memcmp(table[slot].gram, tokens + i, n * sizeof(int)) != 0) slot = (slot + 1) & mask;
            if (!table[slot].gram) table[slot].gram = tokens + i;
            if (side == 0) table[slot].in_candidate++; else table[slot].in_reference++;
        }
    }
    long long matches = 0;
    for (size_t k = 0; k <= mask; k++)
        matches += table[k].in_candidate < table[k].in_reference ? table[k].in_candidate : table[k].in_reference;
    return matches;
}

void bleu_reset(BleuStats *stats) { memset(stats, 0, sizeof *stats); }

// Adds one candidate (the model's output) and its reference, as token ids.
void bleu_add_sentence(BleuStats *stats, const int *candidate, int candidate_len,
                       const int *reference, int reference_len) {
    if (candidate_len < 0) candidate_len = 0;
    if (reference_len < 0) reference_len = 0;
    size_t slots = 4;
    while (slots < 2 * ((size_t)candidate_len + (size_t)reference_len)) slots *= 2;
    NgramCount *table = checked_calloc(slots, sizeof *table, "BLEU n-gram counts");
    for (int n = 1; n <= BLEU_MAX_ORDER; n++) {
        stats->matches[n - 1] += clipped_ngram_matches(table, slots - 1, candidate, candidate_len, reference,
                                                       reference_len, n);
        stats->totals[n - 1] += candidate_len >= n ? candidate_len - n + 1 : 0;
    }
    free(table);
    stats->candidate_length += candidate_len;
    stats->reference_length += reference_len;
    stats->sentences++;
}

// Corpus BLEU of everything added so far, 0..100. precisions (may be NULL) gets p_1..p_4,
// brevity_penalty (may be NULL) BP; no output at all (c = 0) gives BP = 0 and BLEU = 0.
double bleu_score(const BleuStats *stats, double precisions[BLEU_MAX_ORDER], double *brevity_penalty) {
    double log_sum = 0;
    int any_zero = 0;
    for (int n = 0; n < BLEU_MAX_ORDER; n++) {
        double p = stats->totals[n] > 0 ? (double)stats->matches[n] / (double)stats->totals[n] : 0.0;
        if (precisions) precisions[n] = p;
        if (p == 0) any_zero = 1; else log_sum += log(p);
    }
    double candidate = (double)stats->candidate_length, reference = (double)stats->reference_length;
    double bp = candidate > reference ? 1.0 : (candidate > 0 ? exp(1.0 - reference / candidate) : 0.0);
    if (brevity_penalty) *brevity_penalty = bp;
    return any_zero ? 0.0 : 100.0 * bp * exp(log_sum / BLEU_MAX_ORDER);
}

// With sacreBLEU's signature (the lab's `bleu` has its tokenizer and smoothing) and precisions
// divided as it divides, 100 matches / n-grams (23/80: 28.75, where 100 * (23/80) is 28.7499...).
static void print_bleu(const BleuStats *stats, const char *unit) {   // unit: " (words)", or ""
    double p[BLEU_MAX_ORDER], bp, score = bleu_score(stats, NULL, &bp);
    for (int n = 0; n < BLEU_MAX_ORDER; n++)
        p[n] = stats->totals[n] > 0 ? 100.0 * (double)stats->matches[n] / (double)stats->totals[n] : 0.0;
    printf("BLEU            %.2f%s (nrefs:1|case:mixed|eff:no|tok:none|smooth:none; precisions %.2f/%.2f/%.2f/%.2f, "
           "BP %.3f, output/reference length %lld/%lld)\n", score, unit, p[0], p[1], p[2], p[3], bp,
           stats->candidate_length, stats->reference_length);
}

// ---- evaluation -------------------------------------------------------------
// Decodes held-out sources and compares with the references: exact match, token accuracy (positions
// that agree over the longer of the two; a reference <unk> is never right), BLEU; and the teacher-
// forced loss and -log p(reference token) without smoothing (its exponential: Table 3's perplexity).

static void evaluation_free(Evaluation *e) { free(e->output); free(e->output_len); memset(e, 0, sizeof *e); }

static char *duration(char *text, double seconds);   // "1:23:45" or "2:05" (train, below)
static int progress_always = 0;   // the lab's --progress: progress lines also when stderr is not a terminal

// The first `count` pairs of dataset (all when count <= 0), decoded greedily (beam_size 1,
// sentences side by side, sorted by length: little padding) or with beam search; a long one
// prints its progress on a terminal's stderr every 3 s.
static void evaluate(Evaluation *e, Transformer *model, const Dataset *dataset, int count, int batch_tokens,
                     int beam_size, double alpha) {
    memset(e, 0, sizeof *e);
    if (count <= 0 || count > dataset->count) count = dataset->count;
    e->sentences = count;
    e->stride = model->config.max_len;
    e->output = checked_calloc((size_t)count * e->stride, sizeof(int), "decoded outputs");
    e->output_len = checked_calloc(count, sizeof(int), "decoded outputs");
    int training = model->training, V = model->config.vocab_size, *out = NULL, *out_len = NULL;
    model->training = 0;
    int *order = checked_calloc(count, sizeof(int), "evaluation order");
    BatchSpan *spans = checked_calloc(count, sizeof(BatchSpan), "evaluation batches");
    int num_spans = sort_and_cut(order, spans, dataset, count, batch_tokens, NULL);
    BatchBuffer bb = { 0 };
    double total_loss = 0, total_log_loss = 0, started = wall_seconds(), shown = started;
    long total_tokens = 0;
    int done = 0, progress = progress_always || isatty(fileno(stderr));
    for (int s = 0; s < num_spans; s++) {
        const int *indices = order + spans[s].start;
        int B = spans[s].count;
        batch_fill(&bb, dataset, indices, B);
        const Batch *batch = &bb.batch;
        total_loss += (double)transformer_forward(model, batch) * model->num_target_tokens;
        total_tokens += model->num_target_tokens;
        for (int b = 0; b < B; b++)   // -log p(reference token) from the forward pass's probabilities
            for (int t = 0; t < batch->tgt_len[b]; t++)
                total_log_loss -= log((double)model->acts.probs[((size_t)b * batch->T + t) * V + batch->tgt_out[b * batch->T + t]]);
        int S = batch->S, max_out = transformer_decode_limit(model, S);
        out = checked_realloc(out, (size_t)B * max_out, sizeof(int), "decoded outputs");
        out_len = checked_realloc(out_len, B, sizeof(int), "decoded outputs");
        if (beam_size <= 1) transformer_greedy_decode(model, out, out_len, max_out, bb.src, bb.src_len, B, S);
        else for (int b = 0; b < B; b++)
            out_len[b] = transformer_beam_search(model, out + (size_t)b * max_out, NULL, bb.src + (size_t)b * S,
                                                 bb.src_len[b], beam_size, alpha);
        for (int b = 0; b < B; b++) {
            const SentencePair *p = &dataset->pairs[indices[b]];
            const int *output = out + (size_t)b * max_out, *ref = dataset->tokens + p->tgt;
            int n = out_len[b] < e->stride ? out_len[b] : e->stride, same = 0;
            memcpy(e->output + (size_t)indices[b] * e->stride, output, n * sizeof(int));
            e->output_len[indices[b]] = n;
            for (int i = 0; i < out_len[b] && i < p->tgt_len; i++) same += output[i] == ref[i] && ref[i] != TOKEN_UNK;
            e->correct += same;
            e->compared += out_len[b] > p->tgt_len ? out_len[b] : p->tgt_len;
            e->exact += same == p->tgt_len && out_len[b] == p->tgt_len;
            bleu_add_sentence(&e->bleu, output, out_len[b], ref, p->tgt_len);
        }
        done += B;
        double now = wall_seconds();
        if (progress && now - shown >= 3.0 && done < count) {   // eval   1200/10000 pairs | 41.2 pairs/s | ...
            char spent[32], left[32];
            fprintf(stderr, "eval   %d/%d pairs | %.1f pairs/s | elapsed %s | left %s\n", done, count,
                    done / (now - started), duration(spent, now - started),
                    duration(left, (now - started) / done * (count - done)));
            shown = now;
        }
    }
    e->loss = total_tokens ? total_loss / total_tokens : 0;
    e->log_loss = total_tokens ? total_log_loss / total_tokens : 0;
    free(order); free(spans); free(out); free(out_len);
    batch_buffer_free(&bb);
    model->training = training;
}

static void print_examples(const Evaluation *e, const Dataset *dataset, const Vocabulary *vocab, int show) {
    for (int i = 0; i < show && i < e->sentences; i++) {
        const SentencePair *p = &dataset->pairs[i];
        char *output = tokens_to_text(vocab, e->output + (size_t)i * e->stride, e->output_len[i]);
        char *reference = tokens_to_text(vocab, dataset->tokens + p->tgt, p->tgt_len);
        printf("  source     "); print_tokens(stdout, vocab, dataset->tokens + p->src, p->src_len);
        printf("\n  reference  %s\n  output     %s   (%s)\n", reference, output,
               strcmp(output, reference) == 0 ? "exact" : "WRONG");   // the same words
        free(output); free(reference);
    }
}

// ---- checkpoints ------------------------------------------------------------
// A run's config, vocabulary, parameters, Adam's moments and step, generator states,
// place in its epoch and options, in one file (dev/FORMATS.md): little-endian, the
// last 8 bytes an FNV-1a checksum of all before. A save writes PATH.tmp, flushes it
// and renames it over PATH in one step: PATH is always the old checkpoint or the new.

#define CHECKPOINT_MAGIC "TCKP"
#define CHECKPOINT_VERSION 3   // versions 1 and 2 (before the §5.1 merges and the kind of positions) are refused
#define CHECKPOINT_HEADER_BYTES 136
#define MAX_TRAINING_STEPS 1000000000   // train --steps at most; a checkpoint's Adam step too
#define FNV_OFFSET 0xCBF29CE484222325ULL   // FNV-1a, 64 bits
#define FNV_PRIME 0x100000001B3ULL

typedef struct { FILE *f; uint64_t hash; int failed; } CheckpointFile;   // a file being written or read, its FNV-1a so far

static void write_bytes(CheckpointFile *w, const void *data, size_t n) {
    for (size_t i = 0; i < n; i++) w->hash = (w->hash ^ ((const unsigned char *)data)[i]) * FNV_PRIME;
    if (!w->failed && n && fwrite(data, 1, n, w->f) != n) w->failed = 1;
}

static void write_number(CheckpointFile *w, uint64_t x, int bytes) {   // the low `bytes` bytes, little-endian
    unsigned char b[8];
    for (int i = 0; i < bytes; i++) b[i] = (unsigned char)(x >> (8 * i));
    write_bytes(w, b, (size_t)bytes);
}

static void read_bytes(CheckpointFile *r, void *data, size_t n) {
    if (r->failed || fread(data, 1, n, r->f) != n) { r->failed = 1; memset(data, 0, n); }
    for (size_t i = 0; i < n; i++) r->hash = (r->hash ^ ((unsigned char *)data)[i]) * FNV_PRIME;
}

static uint64_t get_number(const unsigned char *b, int bytes) {   // `bytes` bytes, little-endian
    uint64_t x = 0;
    for (int i = bytes - 1; i >= 0; i--) x = x << 8 | b[i];
    return x;
}

static uint32_t float_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static uint64_t double_bits(double x) { uint64_t u; memcpy(&u, &x, 8); return u; }
static float bits_float(uint64_t u) { uint32_t u32 = (uint32_t)u; float x; memcpy(&x, &u32, 4); return x; }
static double bits_double(uint64_t u) { double x; memcpy(&x, &u, 8); return x; }

static const char *checkpoint_save(const char *path, const Transformer *model, const Vocabulary *vocab,
                                   const TrainingState *state, const char *run_options) {
    char tmp[4096];
    struct stat there;   // the rename below replaces whatever is at path: never a directory or a device
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return errorf("%s: path too long", path);
    if (stat(path, &there) == 0 && !S_ISREG(there.st_mode)) return errorf("%s: not a regular file; expected a checkpoint's path", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return errorf("%s: cannot write: %s; %s was left as it was", tmp, strerror(errno), path);
    size_t merges_bytes = 0;
    unsigned char *merges = vocab->bpe && lab.merges_section ? lab.merges_section(vocab, &merges_bytes) : NULL;   // lab: §5.1
    CheckpointFile w = { f, FNV_OFFSET, 0 };
    const TransformerConfig *config = &model->config;
    uint64_t vocab_bytes = 0, options_bytes = strlen(run_options);
    for (int i = 0; i < vocab->size; i++) vocab_bytes += 4 + strlen(vocab->words[i]);
    uint32_t head[11] = { CHECKPOINT_VERSION, sizeof(real), config->n_layers, config->d_model, config->d_ff,
                          config->n_heads, config->vocab_size, config->max_len, float_bits(config->dropout),
                          float_bits(config->label_smoothing), float_bits(config->layer_norm_eps) };
    uint64_t counts[11] = { model->num_parameters, (uint64_t)model->adam_step, model->dropout_rng.state,
                            state->epoch_rng, state->epoch, state->epoch_batches, state->data_hash,
                            vocab_bytes, options_bytes, merges_bytes, (uint64_t)config->positional };
    write_bytes(&w, CHECKPOINT_MAGIC, 4);
    for (int i = 0; i < 11; i++) write_number(&w, head[i], 4);
    for (int i = 0; i < 11; i++) write_number(&w, counts[i], 8);
    write_bytes(&w, run_options, options_bytes);
    for (int i = 0; i < vocab->size; i++) {   // each token: its length, its bytes
        write_number(&w, strlen(vocab->words[i]), 4); write_bytes(&w, vocab->words[i], strlen(vocab->words[i]));
    }
    if (merges) write_bytes(&w, merges, merges_bytes);
    const real *arrays[3] = { model->params_memory, model->adam_m, model->adam_v };
    for (int k = 0; k < 3; k++)   // IEEE-754 binary32 (float builds) or binary64 (double builds)
        for (size_t i = 0; i < model->num_parameters; i++)
            write_number(&w, sizeof(real) == 4 ? float_bits((float)arrays[k][i]) : double_bits((double)arrays[k][i]),
                         (int)sizeof(real));
    write_number(&w, w.hash, 8);
    free(merges);
    int error = w.failed ? (errno ? errno : EIO) : 0;
    if (!error && (fflush(f) != 0 || fsync(fileno(f)) != 0)) error = errno;
    if (fclose(f) != 0 && !error) error = errno;
    if (!error && rename(tmp, path) != 0) error = errno;
    if (!error) return NULL;
    remove(tmp);
    return errorf("%s: writing the checkpoint failed: %s; %s was left as it was", tmp, strerror(error), path);
}

// The fixed-size header at the start of every checkpoint (the layout is checkpoint_save's).
typedef struct {
    uint32_t real_bytes;        // 4 (float) or 8 (double)
    TransformerConfig config;
    uint64_t num_parameters, adam_step, dropout_rng, vocab_bytes, options_bytes, merges_bytes;
    TrainingState state;
} CheckpointHeader;

// Reads and checks the header from its bytes b (got of them, of a file of `size` bytes): magic,
// version, config, the parameter count, and the file's length against what the header describes.
static const char *checkpoint_parse_header(CheckpointHeader *h, const unsigned char *b, size_t got, uint64_t size,
                                           const char *path) {
    typedef unsigned long long u64;
    REQUIRE(got >= 4, "%s: truncated: %zu bytes; expected a checkpoint (magic 'TCKP')", path, got);
    REQUIRE(memcmp(b, CHECKPOINT_MAGIC, 4) == 0, "%s: not a transformer.c checkpoint: it starts with bytes "
            "%02x %02x %02x %02x, expected 'TCKP'", path, b[0], b[1], b[2], b[3]);
    REQUIRE(got >= 8, "%s: truncated: %zu bytes, inside the header", path, got);
    REQUIRE(get_number(b + 4, 4) == CHECKPOINT_VERSION, "%s: checkpoint format version %u; expected version %d "
            "(versions 1 and 2 are no longer read)", path, (unsigned)get_number(b + 4, 4), CHECKPOINT_VERSION);
    REQUIRE(got >= CHECKPOINT_HEADER_BYTES && size >= CHECKPOINT_HEADER_BYTES + 8, "%s: truncated: %llu bytes; "
            "the header and checksum alone take %d", path, (u64)size, CHECKPOINT_HEADER_BYTES + 8);
    h->real_bytes = (uint32_t)get_number(b + 8, 4);
    REQUIRE(h->real_bytes == 4 || h->real_bytes == 8, "%s: header: %u-byte numbers; expected 4 (float) or 8 (double)",
            path, h->real_bytes);
    TransformerConfig *config = &h->config;
    int *sizes[6] = { &config->n_layers, &config->d_model, &config->d_ff, &config->n_heads, &config->vocab_size,
                      &config->max_len };
    for (int i = 0; i < 6; i++) *sizes[i] = (int32_t)get_number(b + 12 + 4 * i, 4);
    float *numbers[3] = { &config->dropout, &config->label_smoothing, &config->layer_norm_eps };
    for (int i = 0; i < 3; i++) *numbers[i] = bits_float(get_number(b + 36 + 4 * i, 4));
    uint64_t *counts[10] = { &h->num_parameters, &h->adam_step, &h->dropout_rng, &h->state.epoch_rng, &h->state.epoch,
                             &h->state.epoch_batches, &h->state.data_hash, &h->vocab_bytes, &h->options_bytes,
                             &h->merges_bytes };
    for (int i = 0; i < 10; i++) *counts[i] = get_number(b + 48 + 8 * i, 8);
    uint64_t positional = get_number(b + 128, 8);
    REQUIRE(positional == POSITIONAL_SINUSOID || positional == POSITIONAL_LEARNED, "%s: header: positional kind %llu; "
            "expected %d (sinusoid) or %d (learned)", path, (u64)positional, POSITIONAL_SINUSOID, POSITIONAL_LEARNED);
    config->positional = (int)positional;
    const char *error = transformer_config_check(config);
    REQUIRE(!error, "%s: header: %s", path, error);
    size_t param_sizes[NUM_PARAMETER_TENSORS];
    parameter_sizes(param_sizes, config);
    size_t P = sum_sizes(param_sizes, NUM_PARAMETER_TENSORS);
    REQUIRE(h->num_parameters == P, "%s: header: %llu parameters, but its sizes (N=%d, d_model=%d, d_ff=%d, vocab %d, "
            "max_len %d, %s positions) give %zu", path, (u64)h->num_parameters, config->n_layers, config->d_model,
            config->d_ff, config->vocab_size, config->max_len, positional == POSITIONAL_LEARNED ? "learned" : "sinusoid", P);
    // each section at most the file (so that their sum cannot overflow), and big enough for what it holds
    uint64_t sections[3] = { h->vocab_bytes, h->options_bytes, h->merges_bytes };
    uint64_t least[3] = { 5 * (uint64_t)config->vocab_size, 0, h->merges_bytes ? 4 + 10 : 0 };
    const char *names[3] = { "vocabulary", "options", "merges" };
    for (int i = 0; i < 3; i++)
        REQUIRE(sections[i] <= size && sections[i] >= least[i], "%s: header: a %s section of %llu bytes; expected "
                "from %llu bytes up to the file's %llu", path, names[i], (u64)sections[i], (u64)least[i], (u64)size);
    REQUIRE(h->adam_step <= MAX_TRAINING_STEPS, "%s: header: Adam step %llu; expected 0 to %d (the most --steps "
            "allows)", path, (u64)h->adam_step, MAX_TRAINING_STEPS);   // (the epoch counts: the lab's --resume)
    uint64_t expected = CHECKPOINT_HEADER_BYTES + h->options_bytes + h->vocab_bytes + h->merges_bytes
                      + 3 * P * h->real_bytes + 8;
    REQUIRE(size >= expected, "%s: truncated: %llu bytes, but its header describes %llu", path, (u64)size,
            (u64)expected);
    REQUIRE(size <= expected, "%s: %llu bytes, but its header describes %llu: the sizes disagree", path, (u64)size,
            (u64)expected);
    return NULL;
}

// The vocabulary section: for each id a u32 length and the token's bytes; the special
// tokens first, no repeats, no (ASCII) spaces, adding up to the header's size.
static const char *checkpoint_read_vocabulary(CheckpointFile *r, Vocabulary *vocab, const CheckpointHeader *h,
                                              const char *path) {
    uint64_t used = 0;
    for (int i = 0; i < h->config.vocab_size; i++) {
        unsigned char b[4];
        read_bytes(r, b, 4);
        uint32_t n = (uint32_t)get_number(b, 4);
        used += 4 + (uint64_t)n;
        REQUIRE(n > 0 && used <= h->vocab_bytes, "%s: vocabulary token %d has length %u; the vocabulary section "
                "disagrees with its size in the header (%llu bytes)", path, i, n, (unsigned long long)h->vocab_bytes);
        char *word = checked_calloc(n + 1, 1, "checkpoint vocabulary");
        read_bytes(r, word, n);
        int known = vocab_find(vocab, word, n), ok = strlen(word) == n;
        for (uint32_t j = 0; j < n && ok; j++) ok = !isspace((unsigned char)word[j]);
        ok = ok && (i < NUM_SPECIAL_TOKENS ? known == i : known < 0);
        if (ok && i >= NUM_SPECIAL_TOKENS) vocab_add(vocab, word, n);
        free(word);
        REQUIRE(ok, "%s: vocabulary token %d is %s; expected %s", path, i, known >= 0 && i >= NUM_SPECIAL_TOKENS ?
                "a repeat" : "not valid", i < NUM_SPECIAL_TOKENS ? special_tokens[i] : "a new token without spaces");
    }
    REQUIRE(used == h->vocab_bytes, "%s: the vocabulary takes %llu bytes, but its header says %llu", path,
            (unsigned long long)used, (unsigned long long)h->vocab_bytes);
    return NULL;
}

// The name of the first parameter tensor that holds a NaN or an infinity, or NULL.
static const char *nonfinite_parameter(Transformer *model) {
    real **tensors[NUM_PARAMETER_TENSORS];
    parameter_pointers(tensors, &model->params);
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++)
        for (size_t i = 0; i < model->param_sizes[t]; i++)
            if (!isfinite((*tensors[t])[i])) return parameter_names[t];
    return NULL;
}

// Reads a checkpoint into a new model and vocabulary (and, when not NULL, the training state and the
// options text, which the caller frees); nothing is allocated before the header has been checked.
static const char *checkpoint_load(const char *path, Transformer *model, Vocabulary *vocab, TrainingState *state,
                                   char **run_options) {
    memset(model, 0, sizeof *model);
    vocab_init(vocab);
    if (run_options) *run_options = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) { vocab_free(vocab); return errorf("%s: cannot open: %s", path, strerror(errno)); }
    struct stat st;
    unsigned char b[CHECKPOINT_HEADER_BYTES], *merges = NULL;
    CheckpointHeader h;
    char *options = NULL;
    const char *error = NULL;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) error = errorf("%s: not a regular file", path);
    if (!error) error = checkpoint_parse_header(&h, b, fread(b, 1, sizeof b, f), (uint64_t)st.st_size, path);
    if (!error && h.merges_bytes > 0 && !lab.read_merges_section)
        error = errorf("%s: holds §5.1 subword merges, which transformer.c alone does not read; "
                       "expected make's ./transformer", path);
    CheckpointFile r = { f, FNV_OFFSET, 0 };
    if (!error) {   // the body, read from the start again so that the checksum covers every byte
        rewind(f);
        read_bytes(&r, b, CHECKPOINT_HEADER_BYTES);
        options = checked_calloc(h.options_bytes + 1, 1, "checkpoint options");
        read_bytes(&r, options, h.options_bytes);
        if (strlen(options) != h.options_bytes) error = errorf("%s: the options section holds a zero byte; expected text", path);
    }
    if (!error) error = checkpoint_read_vocabulary(&r, vocab, &h, path);
    if (!error && h.merges_bytes > 0) {
        merges = checked_calloc(h.merges_bytes, 1, "checkpoint merges");
        read_bytes(&r, merges, h.merges_bytes);
        error = lab.read_merges_section(vocab, merges, h.merges_bytes, path);   // lab: §5.1
    }
    if (!error && (error = transformer_build(model, &h.config, 1))) error = errorf("%s: %s", path, error);
    real *arrays[3] = { model->params_memory, model->adam_m, model->adam_v };
    for (int k = 0; k < 3 && !error; k++)
        for (size_t i = 0; i < model->num_parameters; i++) {   // binary32 or binary64, as the file says
            unsigned char x[8] = { 0 };
            read_bytes(&r, x, h.real_bytes);
            arrays[k][i] = h.real_bytes == 4 ? (real)bits_float(get_number(x, 4)) : (real)bits_double(get_number(x, 8));
        }
    uint64_t computed = r.hash;
    unsigned char checksum[8];
    if (!error) read_bytes(&r, checksum, 8);
    if (!error && r.failed) error = errorf("%s: read error: %s", path, strerror(errno ? errno : EIO));
    else if (!error && get_number(checksum, 8) != computed) error = errorf("%s: checksum mismatch: the file is damaged", path);
    else if (!error && (error = nonfinite_parameter(model))) error = errorf("%s: %s holds a number that is not finite", path, error);
    fclose(f); free(merges);
    if (error) { free(options); transformer_free(model); vocab_free(vocab); return error; }
    model->adam_step = (long)h.adam_step;
    model->dropout_rng.state = h.dropout_rng;
    if (state) *state = h.state;
    if (run_options) *run_options = options; else free(options);
    return NULL;
}

// ---- train ------------------------------------------------------------------

static const TrainOptions train_defaults = {
    .task = "copy", .words = 10, .min_length = 1, .max_length = 10, .train_size = 10000, .valid_size = 200,
    .layers = 2, .d_model = 64, .d_ff = 256, .heads = 4, .positional = POSITIONAL_SINUSOID,
    .dropout = 0.1, .label_smoothing = 0.1, .steps = 1500, .warmup = 50, .batch_tokens = 600, .seed = 1,
    .lr = 3e-3, .eval_every = 250, .log_every = 50, .eval_size = 500, .show = 5,
};

// transformer.c's train flags; the lab adds the rest (lab.train_options)
static int train_option_table(Option *table, TrainOptions *o) {
    Option list[] = {
        TEXT_OPTION("--task", &o->task, "built-in task, copy or reverse (used when there is no --train)"),
        TEXT_OPTION("--train", &o->train_path, "training data: a file of source<TAB>target lines"),
        TEXT_OPTION("--valid", &o->valid_path, "held-out data, same format (default: every 20th line of --train)"),
        INT_OPTION("--layers", &o->layers, 1, TRANSFORMER_MAX_LAYERS, "N, layers in the encoder and in the decoder"),
        INT_OPTION("--d-model", &o->d_model, 1, TRANSFORMER_MAX_WIDTH, "d_model"),
        INT_OPTION("--d-ff", &o->d_ff, 1, TRANSFORMER_MAX_WIDTH, "d_ff, the feed-forward inner width"),
        INT_OPTION("--heads", &o->heads, 1, TRANSFORMER_MAX_WIDTH, "h, attention heads"),
        NUMBER_OPTION("--dropout", &o->dropout, 0, 0.99, 0, "P_drop (§5.4)"),
        NUMBER_OPTION("--label-smoothing", &o->label_smoothing, 0, 0.99, 0, "eps_ls (§5.4)"),
        INT_OPTION("--steps", &o->steps, 1, MAX_TRAINING_STEPS, "training steps"),
        NUMBER_OPTION("--lr", &o->lr, 0, DBL_MAX, 1, "peak learning rate: eq. 3 of §5.3 scaled to reach it at step --warmup"),
        INT_OPTION("--warmup", &o->warmup, 1, 1000000000, "warmup_steps of eq. 3"),
        INT_OPTION("--batch-tokens", &o->batch_tokens, 1, 100000000, "tokens per batch, source + target, padding included"),
        INT_OPTION("--seed", &o->seed, 0, INT_MAX, "seed of the data, the initial weights and dropout"),
        TEXT_OPTION("--checkpoint", &o->checkpoint, "checkpoint file (default runs/TASK.ckpt or runs/FILE.ckpt)"),
        INT_OPTION("--eval-every", &o->eval_every, 0, INT_MAX, "held-out evaluation every N steps (0: only at the end)"),
        INT_OPTION("--show", &o->show, 0, INT_MAX, "held-out examples to print at the end"),
        INT_OPTION("--threads", &o->threads, 0, 1024, "OpenMP threads (0: all cores)"),
        FLAG_OPTION("--force", &o->force, "replace a file already at the checkpoint's path (without it, train stops there)"),
    };
    memcpy(table, list, sizeof list);
    return (int)(sizeof list / sizeof *list);
}

static const char *train_usage =
    "usage: ./transformer train [--task copy|reverse | --train FILE.tsv] [options]\n"
    "Trains a Transformer with Adam and the warm-up schedule of §5.3, label smoothing and\n"
    "dropout (§5.4), on a built-in task or on source<TAB>target lines; evaluates on held-out\n"
    "pairs as it goes and writes checkpoints.";

// Where the training steps run (transformer.h): here, where the parameters are, with nothing to copy.
static void cpu_training_nothing_to_copy(Transformer *model) { (void)model; }
const TrainingCompute transformer_cpu_training = { "transformer.c", cpu_training_nothing_to_copy, transformer_train_step,
                                                   cpu_training_nothing_to_copy };
const TrainingCompute *transformer_training = &transformer_cpu_training;

uint64_t transformer_dropout_key(Transformer *model) { return rng_next(&model->dropout_rng); }

static const char *train_event(TrainRun *run, TrainEvent event) { return lab.train_event ? lab.train_event(run, event) : NULL; }

// The training and held-out pairs, of a task or TSV files; the vocabulary grows with them (grow).
static const char *train_load_data(TrainRun *run, int grow) {
    TrainOptions *o = &run->opt;
    const char *error;
    if (!o->train_path) {
        int task = strcmp(o->task, "copy") == 0 ? TASK_COPY : strcmp(o->task, "reverse") == 0 ? TASK_REVERSE : -1;
        if (task < 0) return errorf("--task '%s' is not a task; expected copy or reverse", o->task);
        if (o->min_length > o->max_length)
            return errorf("--min-length %d is above --max-length %d; expected min <= max", o->min_length, o->max_length);
        if (o->valid_path) return errorf("--valid goes with --train FILE; a task makes its own held-out pairs");
        if (grow) task_vocabulary(&run->vocab, o->words);   // (a resumed run has its checkpoint's)
        snprintf(run->data_name, sizeof run->data_name, "%s task", o->task);
        return task_generate(&run->train, &run->valid, task, o->words, o->min_length, o->max_length,
                             o->train_size, o->valid_size, (uint64_t)o->seed);
    }
    snprintf(run->data_name, sizeof run->data_name, "%s", o->train_path);
    if (!run->vocab.words) vocab_init(&run->vocab);   // (the lab's §5.1 subwords may be there already)
    if ((error = dataset_read_tsv(&run->train, &run->vocab, o->train_path, grow))) return error;
    if (o->valid_path) return dataset_read_tsv(&run->valid, &run->vocab, o->valid_path, 0);
    if (run->train.count >= 20) dataset_split(&run->train, &run->valid, 20);
    return NULL;
}

// A new run: its data, a model of the size asked for, the batches' generator.
static const char *train_start(TrainRun *run) {
    TrainOptions *o = &run->opt;
    const char *error;
    if (o->train_path && find_option(run->options, run->num_options, "--task")->seen)
        return errorf("--task and --train both given; expected one of them");
    if ((error = train_load_data(run, 1))) return error;
    TransformerConfig config = transformer_default_config();
    config.n_layers = o->layers; config.d_model = o->d_model; config.d_ff = o->d_ff; config.n_heads = o->heads;
    config.positional = o->positional;
    config.vocab_size = run->vocab.size;
    config.dropout = (float)o->dropout; config.label_smoothing = (float)o->label_smoothing;
    int longest = run->train.longest_src > run->train.longest_tgt ? run->train.longest_src : run->train.longest_tgt;
    config.max_len = o->positions ? o->positions : longest + 1 + 50;   // §6.1's input length + 50
    if (config.max_len > TRANSFORMER_MAX_LEN) config.max_len = TRANSFORMER_MAX_LEN;
    if ((error = transformer_config_check(&config))) return errorf("model: %s", error);
    if ((error = dataset_check_lengths(&run->train, run->data_name, config.max_len)) ||
        (error = dataset_check_lengths(&run->valid, o->valid_path ? o->valid_path : run->data_name, config.max_len)))
        return error;
    if ((error = transformer_build(&run->model, &config, (uint64_t)o->seed))) return errorf("model: %s", error);
    rng_seed(&run->data_rng, (uint64_t)o->seed ^ 0xDA7A0DE5ULL);
    return NULL;
}

// The checkpoint path (default runs/TASK.ckpt or runs/FILE.ckpt), checked to be writable before any training.
static const char *train_prepare_output(TrainRun *run) {
    TrainOptions *o = &run->opt;
    if (o->checkpoint) {
        size_t length = strlen(o->checkpoint);
        if (length == 0 || length + 5 >= sizeof run->checkpoint_path)   // (the message shows a long path's start)
            return errorf("--checkpoint '%.40s%s': expected a file's path of 1 to %zu bytes", o->checkpoint,
                          length > 40 ? "..." : "", sizeof run->checkpoint_path - 6);
        snprintf(run->checkpoint_path, sizeof run->checkpoint_path, "%s", o->checkpoint);
    } else {
        const char *name = o->train_path ? o->train_path : o->task, *slash = strrchr(name, '/');
        if (slash) name = slash + 1;
        const char *dot = strrchr(name, '.');
        int length = dot && dot != name ? (int)(dot - name) : (int)strlen(name);
        if (mkdir("runs", 0777) != 0 && errno != EEXIST) return errorf("runs/: cannot create: %s", strerror(errno));
        snprintf(run->checkpoint_path, sizeof run->checkpoint_path, "runs/%.*s.ckpt", length > 200 ? 200 : length, name);
    }
    // Never lose a trained model unasked: only the checkpoint being resumed, or --force, replaces one.
    struct stat there, resumed;
    int exists = stat(run->checkpoint_path, &there) == 0;
    int same = exists && run->resumed_from && stat(run->resumed_from, &resumed) == 0 &&
               there.st_dev == resumed.st_dev && there.st_ino == resumed.st_ino;
    if (exists && !S_ISREG(there.st_mode))   // (checkpoint_save refuses it too, but only after the training)
        return errorf("%s: not a regular file; expected a checkpoint's path", run->checkpoint_path);
    if (exists && !same && !o->force)
        return errorf("%s is already there (another run's checkpoint?); expected --resume %s to go on with it, "
                      "--force to replace it, or another --checkpoint", run->checkpoint_path, run->checkpoint_path);
    char tmp[sizeof run->checkpoint_path + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", run->checkpoint_path);   // also what a killed save left
    FILE *f = fopen(tmp, "wb");
    if (!f) return errorf("%s: cannot write the checkpoint there: %s", tmp, strerror(errno));
    fclose(f); remove(tmp);
    if (!same) run->last_saved_step = -1;
    return NULL;
}

// The checkpoint, unless training diverged: a good one is never overwritten by a bad one.
static const char *train_save(TrainRun *run) {
    const char *nonfinite = nonfinite_parameter(&run->model);
    if (nonfinite)
        return errorf("step %ld: %s holds a value that is not finite (training diverged); %s was not overwritten",
                      run->model.adam_step, nonfinite, run->checkpoint_path);
    const char *error = checkpoint_save(run->checkpoint_path, &run->model, &run->vocab, &run->state, run->run_options ? run->run_options : "");
    if (!error) run->last_saved_step = run->model.adam_step;
    return error;
}

// Held-out loss, token accuracy and exact match of greedy decoding (at the end, examples too).
// Returns the exact match in %, or NAN when there are no held-out pairs.
static double train_evaluate(TrainRun *run, int final) {
    if (run->valid.count == 0) {
        printf("eval   step %ld | no held-out pairs (fewer than 20 lines and no --valid)\n", run->model.adam_step);
        return NAN;
    }
    Evaluation e;
    evaluate(&e, &run->model, &run->valid, run->opt.eval_size, run->opt.batch_tokens, 1, 0.6);
    if (run->vocab.bpe && lab.score_words) lab.score_words(&e, &run->valid, &run->vocab);   // lab: §5.1, on words
    double exact = 100.0 * e.exact / e.sentences;
    printf("eval   step %ld | held-out loss %.4f | token accuracy %.1f%% | exact match %.1f%% (%d/%d)",
           run->model.adam_step, e.loss, 100.0 * e.correct / (e.compared ? e.compared : 1), exact, e.exact, e.sentences);
    if (e.sentences < run->valid.count)   // the default --eval-size 500: a few minutes, not hours, on WMT
        printf(" | the first %d of %d held-out pairs (--eval-size 0: all)", e.sentences, run->valid.count);
    printf("\n");
    if (final && run->opt.show > 0) {
        printf("held-out examples, greedy decoding:\n");
        print_examples(&e, &run->valid, &run->vocab, run->opt.show);
        printf("exact match on %d held-out %s: %.1f%% (%d/%d)\n", e.sentences,
               run->opt.train_path ? "pairs" : "sequences never seen in training", exact, e.exact, e.sentences);
    }
    fflush(stdout);
    evaluation_free(&e);
    return exact;
}

static void train_print_header(const TrainRun *run) {
    const TrainOptions *o = &run->opt;
    const TransformerConfig *config = &run->model.config;
    printf("data   %s: %d training pairs, %d held-out, vocabulary %d\n", run->data_name, run->train.count,
           run->valid.count, run->vocab.size);
    printf("model  N=%d d_model=%d d_ff=%d h=%d max_len=%d, %s positions: %zu parameters\n", config->n_layers,
           config->d_model, config->d_ff, config->n_heads, config->max_len,
           config->positional == POSITIONAL_LEARNED ? "learned" : "sinusoid", run->model.num_parameters);
    printf("train  %d steps, peak lr %g at step %d (§5.3), batches <= %d tokens, P_drop %g, eps_ls %g, "
           "seed %d, %d thread%s%s\n", o->steps, o->lr, o->warmup, o->batch_tokens, (double)config->dropout,
           (double)config->label_smoothing, o->seed, thread_count(), thread_count() == 1 ? "" : "s",
           run->threads_note ? run->threads_note : "");
    if (transformer_training != &transformer_cpu_training)
        printf("steps  by %s; evaluation and decoding on the host\n", transformer_training->name);
    if (run->resumed_from) printf("resume %s at step %ld\n", run->resumed_from, run->model.adam_step);
    printf("checkpoints to %s\n", run->checkpoint_path);
    fflush(stdout);
}

static char *duration(char *text, double seconds) {   // "1:23:45" or "2:05"; text holds 32
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(text, 32, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
    else snprintf(text, 32, "%ld:%02ld", s / 60, s % 60);
    return text;
}

// The next batch of the epoch's plan (a new epoch's plan when the last is used up)
static void train_next_batch(TrainRun *run) {
    if (run->state.epoch == 0 || run->state.epoch_batches == (uint64_t)run->plan.num_spans) {
        run->state.epoch_rng = run->data_rng.state;
        epoch_plan_make(&run->plan, &run->train, run->opt.batch_tokens, &run->data_rng);
        run->state.epoch++;
        run->state.epoch_batches = 0;
    }
    BatchSpan span = run->plan.spans[run->state.epoch_batches++];
    batch_fill(&run->batch, &run->train, run->plan.order + span.start, span.count);
}

// The training loop (§5): batches by length, teacher forcing, Adam with eq. 3's schedule peaking at --lr.
static const char *train_loop(TrainRun *run) {
    TrainOptions *o = &run->opt;
    Transformer *model = &run->model;
    // eq. 3 peaks at step = warmup with d_model^-0.5 warmup^-0.5, so this factor makes the peak --lr
    double factor = o->lr * sqrt((double)model->config.d_model * o->warmup);
    int save_every = o->save_every ? o->save_every : o->eval_every;
    const char *error = train_event(run, TRAIN_BEGIN);   // lab: the logs, kept checkpoints, the thread count
    if (error) return error;
    train_print_header(run);
    if (model->adam_step >= o->steps) {
        printf("the checkpoint is at step %ld and --steps is %d: nothing to train\n", model->adam_step, o->steps);
        train_evaluate(run, 1);
    }
    const TrainingCompute *compute = transformer_training;   // transformer_train_step, or the CUDA companion's
    compute->begin(model);
    double start = wall_seconds(), last_time = start;
    long first_step = model->adam_step, tokens = 0;
    while (model->adam_step < o->steps) {
        if ((error = train_event(run, TRAIN_STEP))) break;   // lab: the thread count
        train_next_batch(run);
        long step = model->adam_step + 1;
        double step_start = wall_seconds();
        model->training = 1;
        run->loss = compute->train_step(model, &run->batch.batch, o->warmup, factor);
        run->lr = transformer_learning_rate(step, model->config.d_model, o->warmup, factor);
        run->seconds = wall_seconds() - step_start;
        run->tokens = run->batch.tokens;
        if (!isfinite(run->loss)) {   // stop; the last checkpoint is left as it was
            char saved[4300] = "no checkpoint was written";
            if (run->last_saved_step >= 0) snprintf(saved, sizeof saved, "the last good checkpoint, %s (step %ld), "
                                                    "is left as it was", run->checkpoint_path, run->last_saved_step);
            error = errorf("step %ld: the loss is %s; training stopped (try a lower --lr); %s", step,
                           isnan(run->loss) ? "NaN" : "infinite", saved);
            break;
        }
        tokens += run->batch.tokens;
        int last = step == o->steps;
        if (o->log_every && (step % o->log_every == 0 || last)) {
            // step 400/1500 | loss 0.8978 | lr 1.06e-03 | 15.6k tok/s | elapsed 0:14 | left 0:38
            double now = wall_seconds();
            char elapsed[32], left[32];
            printf("step %5ld/%d | loss %.4f | lr %.2e | %6.1fk tok/s | elapsed %s | left %s\n", step, o->steps,
                   (double)run->loss, run->lr, tokens / (now - last_time + 1e-9) / 1000, duration(elapsed, now - start),
                   duration(left, (now - start) / (step - first_step) * (o->steps - step)));
            fflush(stdout);
            last_time = now;
            tokens = 0;
        }
        run->evaluated = (o->eval_every && step % o->eval_every == 0) || last;
        int saving = (save_every && step % save_every == 0) || last;
        if (run->evaluated || saving) compute->to_host(model);   // what the evaluation and the checkpoint read
        double eval_start = wall_seconds();
        run->heldout = run->evaluated ? train_evaluate(run, last) : NAN;
        last_time += wall_seconds() - eval_start;   // tokens/s in progress lines: the training steps' time only
        if ((error = train_event(run, TRAIN_STEPPED))) break;   // lab: --log, --loss-log
        if (saving && ((error = train_save(run)) || (error = train_event(run, TRAIN_SAVED)))) break;   // lab: --keep-last
    }
    char elapsed[32];
    if (!error && model->adam_step > first_step)
        printf("trained steps %ld..%ld in %s (%.1f s); checkpoint %s\n", first_step + 1, model->adam_step,
               duration(elapsed, wall_seconds() - start), wall_seconds() - start, run->checkpoint_path);
    return error;
}

static int command_train(int argc, char **argv) {
    TrainRun *run = checked_calloc(1, sizeof(TrainRun), "training run");
    run->opt = train_defaults;
    run->num_options = train_option_table(run->options, &run->opt);
    if (lab.train_options) run->num_options = lab.train_options(run->options, run->num_options, &run->opt);   // lab
    int status = parse_options("train", train_usage, run->options, run->num_options, argc, argv, NULL, NULL);
    const char *error = NULL;
    if (status == 0) {
        set_threads(run->opt.threads);
        run->last_saved_step = -1;
        error = train_event(run, TRAIN_START);   // lab: §5.1 merges (--bpe), or the run read back (--resume)
        if (!error && !run->resumed_from) error = train_start(run);
        if (!error) error = train_prepare_output(run);
        if (!error) error = train_loop(run);
        const char *end_error = train_event(run, TRAIN_END);   // lab: closes its logs, frees what it held
        if (!error) error = end_error;
        if (error) fprintf(stderr, "error: train: %s\n", error);
    }
    vocab_free(&run->vocab); dataset_free(&run->train); dataset_free(&run->valid); transformer_free(&run->model);
    free(run->plan.order); free(run->plan.spans); batch_buffer_free(&run->batch); free(run->run_options); free(run);
    return status == 2 ? 0 : status || error ? 1 : 0;
}

// ---- decode -----------------------------------------------------------------

// Decodes one sentence of text, printing the output on one line. A sentence it cannot take does not
// stop a stream: an error line, an empty output line (line i still answers line i), 1 returned.
static int decode_sentence(Transformer *model, Vocabulary *vocab, char *text, TextSource *from, int beam,
                           double alpha, const char *error) {
    int *ids = NULL, n = 0, max_len = model->config.max_len;
    size_t capacity = 0, length;
    for (const char *p = text; !error && (p = next_token(p, &length)) != NULL; p += length) n++;
    if (!error && n <= max_len - 1 && (n = tokenize(text, vocab, 0, &ids, &capacity, from)) < 0)
        error = reserved_token_error(from);
    else if (!error && n > max_len - 1)
        error = errorf("%s: the sentence has %d tokens; the model's maximum length %d allows %d (one position is </s>)",
                       from->where, n, max_len, max_len - 1);
    if (!error && n > 0) {
        push_id(&ids, &capacity, n++, TOKEN_EOS);   // the source ends with </s>, as in training (batch_fill)
        int limit = transformer_decode_limit(model, n), out_len;
        int *out = checked_calloc(limit, sizeof(int), "decoded sentence");
        if (beam <= 1) transformer_greedy_decode(model, out, &out_len, limit, ids, &n, 1, n);
        else out_len = transformer_beam_search(model, out, NULL, ids, n, beam, alpha);
        print_tokens(stdout, vocab, out, out_len);
        free(out);
    }
    free(ids);
    fflush(stdout);
    if (error) fprintf(stderr, "error: decode: %s\n", error);
    printf("\n");
    fflush(stdout);
    return error != NULL;
}

static int command_decode(int argc, char **argv) {
    const char *checkpoint = NULL;
    int beam = 1, threads = 0;
    double alpha = 0.6;
    Option options[] = {
        TEXT_OPTION("--checkpoint", &checkpoint, "the trained model (required)"),
        INT_OPTION("--beam", &beam, 1, 1000, "beam size; 1 is greedy decoding (the paper used 4)"),
        NUMBER_OPTION("--alpha", &alpha, 0, 100, 0, "length penalty ((5+len)/6)^alpha of beam search (§6.1)"),
        INT_OPTION("--threads", &threads, 0, 1024, "OpenMP threads (0: all cores)"),
    };
    const char *usage =
        "usage: ./transformer decode --checkpoint FILE [--beam 4] ['SENTENCE' ...]\n"
        "Translates each SENTENCE (tokens separated by white space, Unicode's spaces included), or else\n"
        "each line of standard input, and prints the output, one line each. Greedy decoding with a\n"
        "key/value cache, or beam search with --beam; at most source length + 50 tokens (§6.1). A\n"
        "sentence it cannot take (too long, a reserved token) gets an error line and an empty output\n"
        "line; then exit status 1.";
    char **sentences = checked_calloc(argc, sizeof(char *), "arguments");
    int num_sentences = 0, refused = 0;   // refused: sentences that got an error line and an empty output line
    int status = parse_options("decode", usage, options, (int)(sizeof options / sizeof *options), argc, argv, sentences, &num_sentences);
    if (status) { free(sentences); return status == 2 ? 0 : 1; }
    set_threads(threads);
    Transformer model = { 0 };
    Vocabulary vocab = { 0 };
    const char *error = checkpoint ? checkpoint_load(checkpoint, &model, &vocab, NULL, NULL)
                                   : "--checkpoint FILE is required (a model written by ./transformer train)";
    TextSource from = { "", 0, 0, NULL };
    if (!error) {
        for (int i = 0; i < num_sentences; i++) {
            snprintf(from.where, sizeof from.where, "argument %d", i + 1);
            refused += decode_sentence(&model, &vocab, sentences[i], &from, beam, alpha, text_error(sentences[i], 1, from.where));
        }
        char *line = NULL;
        size_t capacity = 0;
        int got, line_no = 1;
        for (; num_sentences == 0 && (got = read_text_line(stdin, &line, &capacity, line_no)) != 0; line_no++) {
            snprintf(from.where, sizeof from.where, "stdin:%d", line_no);
            refused += decode_sentence(&model, &vocab, line, &from, beam, alpha, text_error(line, got, from.where));
        }
        if (num_sentences == 0 && ferror(stdin))   // a read that failed (stdin a directory, say) is not the end
            error = errorf("stdin: read error after %d lines: %s", line_no - 1, strerror(errno));
        free(line);
    }
    if (error) fprintf(stderr, "error: decode: %s\n", error);
    transformer_free(&model); vocab_free(&vocab); free(sentences);
    return error || refused ? 1 : 0;
}

// ---- eval -------------------------------------------------------------------

static int command_eval(int argc, char **argv) {
    const char *checkpoint = NULL, *data = NULL, *error = NULL;
    int beam = 1, threads = 0, show = 0, batch_tokens = 2000, bleu = 0;
    double alpha = 0.6;
    Option options[] = {
        TEXT_OPTION("--checkpoint", &checkpoint, "the trained model (required)"),
        TEXT_OPTION("--data", &data, "source<TAB>target lines to evaluate on (required)"),
        FLAG_OPTION("--bleu", &bleu, "also print corpus BLEU-4 of the outputs against the targets (§6.1)"),
        INT_OPTION("--beam", &beam, 1, 1000, "beam size; 1 is greedy decoding"),
        NUMBER_OPTION("--alpha", &alpha, 0, 100, 0, "length penalty exponent of beam search"),
        INT_OPTION("--show", &show, 0, INT_MAX, "print the first N decoded pairs"),
        INT_OPTION("--batch-tokens", &batch_tokens, 1, 100000000, "tokens decoded side by side"),
        INT_OPTION("--threads", &threads, 0, 1024, "OpenMP threads (0: all cores)"),
        FLAG_OPTION("--progress", &progress_always, "progress lines also when standard error is not a terminal"),
    };
    const char *usage =
        "usage: ./transformer eval --checkpoint FILE --data FILE.tsv [--beam 4] [--bleu]\n"
        "Decodes every source of FILE.tsv and compares the output with the target: token accuracy\n"
        "(positions that agree, over the longer of output and target), exact match and, with\n"
        "--bleu, corpus-level BLEU-4 over the model's tokens (one reference each, no smoothing).\n"
        "With §5.1 merges (train --bpe), exact match and BLEU are on words, BLEU also on subwords.";
    int status = parse_options("eval", usage, options, (int)(sizeof options / sizeof *options), argc, argv, NULL, NULL);
    if (status) return status == 2 ? 0 : 1;
    set_threads(threads);
    Transformer model = { 0 };
    Vocabulary vocab = { 0 };
    Dataset dataset = { 0 };
    if (!checkpoint || !data) error = !checkpoint ? "--checkpoint FILE is required" : "--data FILE.tsv is required";
    else if (!(error = checkpoint_load(checkpoint, &model, &vocab, NULL, NULL)) &&
             !(error = dataset_read_tsv(&dataset, &vocab, data, 0)))
        error = dataset_check_lengths(&dataset, data, model.config.max_len);
    if (!error) {
        Evaluation e;
        evaluate(&e, &model, &dataset, 0, batch_tokens, beam, alpha);
        const char *subwords = vocab.bpe ? " (subwords)" : "", *words = vocab.bpe ? " (words)" : "";
        if (vocab.bpe && lab.score_words) lab.score_words(&e, &dataset, &vocab);   // lab: §5.1, on words
        if (show) print_examples(&e, &dataset, &vocab, show);
        printf("%s: %d pairs, %s\n", data, e.sentences, beam > 1 ? "beam search" : "greedy decoding");
        printf("token accuracy  %.2f%% (%ld/%ld)%s\n", 100.0 * e.correct / (e.compared ? e.compared : 1),
               e.correct, e.compared, subwords);
        printf("exact match     %.2f%% (%d/%d)%s\n", 100.0 * e.exact / e.sentences, e.exact, e.sentences, words);
        printf("loss            %.4f per target token%s (teacher forcing, label smoothing %g)\n", e.loss,
               vocab.bpe ? ", a subword" : "", (double)model.config.label_smoothing);
        printf("perplexity      %.4f per target token%s (exp of -log p(reference), no smoothing)\n",
               exp(e.log_loss), vocab.bpe ? ", a subword" : "");
        if (bleu) print_bleu(vocab.bpe ? &e.bleu_words : &e.bleu, words);
        if (bleu && vocab.bpe) print_bleu(&e.bleu, subwords);
        evaluation_free(&e);
    }
    if (error) fprintf(stderr, "error: eval: %s\n", error);
    dataset_free(&dataset);
    transformer_free(&model);
    vocab_free(&vocab);
    return error ? 1 : 0;
}

// ==== main: the table of contents ============================================
//   ./transformer train    learn a task (§5): copy, reverse or a TSV file
//   ./transformer decode   translate with a checkpoint (§6.1)
//   ./transformer eval     token accuracy, exact match and BLEU on a TSV file
// lab/lab.c adds its commands after these (lab.commands).

static const Command commands[] = {
    { "train",  command_train,  "train on a built-in task (--task copy|reverse) or a TSV file (--train)" },
    { "decode", command_decode, "decode sentences with a checkpoint: greedy, or beam search (--beam 4)" },
    { "eval",   command_eval,   "token accuracy, exact match and (--bleu) BLEU of decoded outputs on a TSV file" },
};

static const Command *command_at(int i) { return i < 3 ? &commands[i] : &lab.commands[i - 3]; }   // then the lab's

// Runs the command argv[1] with its arguments. Returns 0, or 1 after a one-line error.
int transformer_main(int argc, char **argv) {
    int count = 3 + lab.num_commands;
    int help = argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0);
    if (argc < 2 || help) {
        FILE *f = help ? stdout : stderr;
        fprintf(f, "usage: ./transformer COMMAND [options]   (./transformer COMMAND --help for its options)\n");
        for (int i = 0; i < count; i++) fprintf(f, "  %-9s %s\n", command_at(i)->name, command_at(i)->summary);
        fprintf(f, "example: ./transformer train --task copy && ./transformer decode --checkpoint runs/copy.ckpt \"3 1 4 1 5\"\n");
        return !help;
    }
    for (int i = 0; i < count; i++) {
        if (strcmp(argv[1], command_at(i)->name) != 0) continue;
        snprintf(error_context, sizeof error_context, "%s: ", command_at(i)->name);
        int status = command_at(i)->run(argc - 1, argv + 1);
        error_context[0] = '\0';
        errno = 0;   // (so that a reason given below is this flush's own, never an older error's)
        if (status || (fflush(stdout) == 0 && !ferror(stdout))) return status;   // else a full disk, say, lost the output
        fprintf(stderr, "error: %s: writing the output failed: %s\n", argv[1], errno ? strerror(errno) : "an earlier write to standard output failed");
        return 1;
    }
    fprintf(stderr, "error: unknown command '%s'; expected", argv[1]);
    for (int i = 0; i < count; i++) fprintf(stderr, "%s %s", i == 0 ? "" : i + 1 == count ? " or" : ",", command_at(i)->name);
    fprintf(stderr, " (see ./transformer --help)\n");
    return 1;
}

#ifndef TRANSFORMER_NO_MAIN
int main(int argc, char **argv) { return transformer_main(argc, argv); }
#endif
