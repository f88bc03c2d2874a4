/* transformer_cuda.cu: transformer.c's training step on a GPU
 *
 * The same program as ./transformer (the same commands, flags, data, vocabulary
 * and checkpoints: it is transformer.c, linked in), except that the training
 * steps of `train` and `bench` run here, on the GPU: the forward pass, the
 * backward pass and Adam. transformer.c calls them through its
 * transformer_training hook (transformer.h). The GPU keeps its own copy of
 * the parameters, gradients and Adam's moments; they are copied to the host
 * model before every evaluation and checkpoint, and evaluation, decoding and
 * everything else run on the host, through transformer.c.
 *
 *     make cuda                                   ./transformer_cuda (nvcc, cuBLAS)
 *     ./transformer_cuda train --task copy        as ./transformer, steps on the GPU
 *     ./transformer_cuda bench --config base      training steps timed on the GPU
 *     ./transformer_cuda ... --tf32               cuBLAS may use TF32 tensor cores
 *     make test-cuda                              the proofs on a GPU (Makefile)
 *
 * Each kernel is a direct translation of the Part I loop it names, one thread
 * per element or per row: no shared memory, no warp shuffles, no atomics, so
 * a run is deterministic. cuBLAS does the matrix products, in fp32 (TF32 only
 * with --tf32). The file is written in the C that CUDA C++ shares, so that
 * with -DCUDA_ON_CPU the host C compiler builds it against cuda_on_cpu.h,
 * which runs every launch as loops and every cuBLAS call as a plain
 * column-major loop; test_transformer.c then compares it with transformer.c.
 *
 * Row-major data, column-major cuBLAS. transformer.c stores a matrix X of
 * r rows and c columns row by row: X[i*c + j]. cuBLAS reads matrices column
 * by column: element (i, j) of a matrix with leading dimension ld is at
 * [i + j*ld]. So the same memory read by cuBLAS is X^T (c x r, ld c). A
 * product Y = A B in row-major terms is therefore asked of cuBLAS as
 * Y^T = B^T A^T: swap the operands, keep the transposes as the row-major
 * formula has them, and pass the row lengths as leading dimensions. Each call
 * below says which product it computes and how it maps.
 */
#ifdef TRANSFORMER_DOUBLE
#error "transformer_cuda.cu works in fp32: build it without -DTRANSFORMER_DOUBLE"
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef CUDA_ON_CPU
#include "cuda_on_cpu.h"
#else
#include <cuda_runtime.h>
#include <cublas_v2.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif
#include "transformer.h"
#ifdef __cplusplus
}
#endif

// ----------------------------------------------------------------------------
// Checked calls: a failure stops the program with one line naming the call.

static void cuda_check(cudaError_t status, const char *call, int line) {
    if (status == cudaSuccess) return;
    fprintf(stderr, "error: CUDA: %s failed: %s (transformer_cuda.cu:%d)\n", call, cudaGetErrorString(status), line);
    exit(1);
}
static void cublas_check(cublasStatus_t status, const char *call, int line) {
    if (status == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "error: cuBLAS: %s failed: %s (transformer_cuda.cu:%d)\n", call, cublasGetStatusString(status), line);
    exit(1);
}
#define CUDA_CHECK(call) cuda_check((call), #call, __LINE__)
#define CUBLAS_CHECK(call) cublas_check((call), #call, __LINE__)

// LAUNCH(kernel, blocks, threads, arguments...) is kernel<<<blocks, threads>>>(arguments...)
// followed by a check that it launched; on the CPU, the loops of cuda_on_cpu.h.
#ifdef CUDA_ON_CPU
#define LAUNCH(kernel, blocks, threads, ...) CPU_LAUNCH(kernel, blocks, threads, __VA_ARGS__)
#else
#define LAUNCH(kernel, blocks, threads, ...) do {                                        \
        kernel<<<(blocks), (threads)>>>(__VA_ARGS__);                                    \
        cuda_check(cudaGetLastError(), "the launch of " #kernel, __LINE__);              \
    } while (0)
#endif
// One thread for each of n items (elements or rows), in blocks of 256.
#define THREADS 256
#define LAUNCH_FOR(n, kernel, ...) LAUNCH(kernel, (unsigned)(((size_t)(n) + THREADS - 1) / THREADS), THREADS, __VA_ARGS__)
#define THREAD_INDEX ((size_t)blockIdx.x * blockDim.x + threadIdx.x)

// ============================================================================
// The kernels, in Part I's order
// ============================================================================

// linear_forward's bias: out[n,o] = bias[o], before cuBLAS adds the sum (beta = 1)
static __global__ void bias_rows_kernel(float *out, const float *bias, size_t N, int OC) {
    size_t e = THREAD_INDEX;
    if (e >= N * OC) return;
    out[e] = bias[e % OC];
}

// linear_backward's  dbias[o] += sum_n dout[n,o]: one thread per o, rows in order
static __global__ void bias_backward_kernel(float *dbias, const float *dout, int N, int OC) {
    size_t o = THREAD_INDEX;
    if (o >= (size_t)OC) return;
    for (int n = 0; n < N; n++) dbias[o] += dout[(size_t)n * OC + o];
}

// transformer.c's hash64 and unit_interval, the same bits on the GPU
static __device__ uint64_t dropout_hash64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// dropout_mask, one thread per element: kept (1/(1-p)) or dropped (0) by hash64(key + i).
// drop < 0 means no dropout: every element 1.
static __global__ void dropout_mask_kernel(float *mask, uint64_t key, double drop, float keep_scale, size_t n) {
    size_t i = THREAD_INDEX;
    if (i >= n) return;
    if (drop < 0) { mask[i] = 1; return; }
    double u = (double)(dropout_hash64(key + i) >> 11) * (1.0 / 9007199254740992.0);
    mask[i] = u < drop ? 0 : keep_scale;
}

// dropout_forward: out = inp * mask
static __global__ void dropout_forward_kernel(float *out, const float *inp, const float *mask, size_t n) {
    size_t i = THREAD_INDEX;
    if (i < n) out[i] = inp[i] * mask[i];
}

// dropout_backward: dinp += dout * mask
static __global__ void dropout_backward_kernel(float *dinp, const float *dout, const float *mask, size_t n) {
    size_t i = THREAD_INDEX;
    if (i < n) dinp[i] += dout[i] * mask[i];
}

// residual_layernorm_forward and layernorm_row_forward, one thread per row n:
//     res = residual + sublayer * mask;   out = LayerNorm(res)
static __global__ void residual_layernorm_forward_kernel(float *out, float *mean, float *rstd, float *res,
                                                         const float *residual, const float *sublayer,
                                                         const float *mask, const float *gain, const float *bias,
                                                         int N, int C, float eps) {
    size_t n = THREAD_INDEX;
    if (n >= (size_t)N) return;
    size_t row = n * C;
    float m = 0, v = 0;
    for (int i = 0; i < C; i++) {
        res[row + i] = residual[row + i] + sublayer[row + i] * mask[row + i];
        m += res[row + i];
    }
    m /= C;
    for (int i = 0; i < C; i++) v += (res[row + i] - m) * (res[row + i] - m);
    v /= C;
    float s = 1 / sqrtf(v + eps);
    for (int i = 0; i < C; i++) out[row + i] = (res[row + i] - m) * s * gain[i] + bias[i];
    mean[n] = m;
    rstd[n] = s;
}

// residual_layernorm_backward's rows, one thread per row n:
//   dres_i = rstd * (dxhat_i - mean_j(dxhat_j) - xhat_i * mean_j(dxhat_j xhat_j))
//   dresidual_i += dres_i,   dsublayer_i += dres_i * mask_i
static __global__ void residual_layernorm_backward_kernel(float *dresidual, float *dsublayer, const float *dout,
                                                          const float *res, const float *mask, const float *gain,
                                                          const float *mean, const float *rstd, int N, int C) {
    size_t n = THREAD_INDEX;
    if (n >= (size_t)N) return;
    size_t row = n * C;
    float m = mean[n], s = rstd[n], mean_dxhat = 0, mean_dxhat_xhat = 0;
    for (int i = 0; i < C; i++) {
        float dxhat = dout[row + i] * gain[i];
        mean_dxhat += dxhat;
        mean_dxhat_xhat += dxhat * (res[row + i] - m) * s;
    }
    mean_dxhat /= C;
    mean_dxhat_xhat /= C;
    for (int i = 0; i < C; i++) {
        float xhat = (res[row + i] - m) * s;
        float dres = s * (dout[row + i] * gain[i] - mean_dxhat - xhat * mean_dxhat_xhat);
        dresidual[row + i] += dres;
        dsublayer[row + i] += dres * mask[row + i];
    }
}

// residual_layernorm_backward's gain and bias, one thread per feature i, rows in order:
//   dgain_i += sum_n dout_i xhat_i,   dbias_i += sum_n dout_i
static __global__ void layernorm_params_backward_kernel(float *dgain, float *dbias, const float *dout,
                                                        const float *res, const float *mean, const float *rstd,
                                                        int N, int C) {
    size_t i = THREAD_INDEX;
    if (i >= (size_t)C) return;
    for (int n = 0; n < N; n++) {
        float g = dout[(size_t)n * C + i];
        dgain[i] += g * (res[(size_t)n * C + i] - mean[n]) * rstd[n];
        dbias[i] += g;
    }
}

// attention_forward's softmax_visible, one thread per query row (b, h, i):
// the scores of the visible keys (visible_keys: padding and causal masks)
// become their softmax, the masked keys get exactly 0.
static __global__ void softmax_visible_kernel(float *att, const int *key_len, int causal, int B, int NH, int Tq, int Tk) {
    size_t r = THREAD_INDEX;
    if (r >= (size_t)B * NH * Tq) return;
    int b = (int)(r / ((size_t)NH * Tq)), i = (int)(r % Tq);
    int visible = (causal && i + 1 < key_len[b]) ? i + 1 : key_len[b];
    float *p = att + r * Tk, largest = -INFINITY, sum = 0;
    for (int j = 0; j < visible; j++) largest = p[j] > largest ? p[j] : largest;
    for (int j = 0; j < visible; j++) {
        p[j] = expf(p[j] - largest);
        sum += p[j];
    }
    for (int j = 0; j < visible; j++) p[j] /= sum;
    for (int j = visible; j < Tk; j++) p[j] = 0;
}

// attention_backward's softmax_backward, one thread per query row: grad holds
// dp and becomes ds_j = p_j (dp_j - sum_k p_k dp_k)
static __global__ void softmax_backward_kernel(float *grad, const float *att, size_t rows, int Tk) {
    size_t r = THREAD_INDEX;
    if (r >= rows) return;
    float *g = grad + r * Tk;
    const float *p = att + r * Tk;
    float sum_p_dp = 0;
    for (int j = 0; j < Tk; j++) sum_p_dp += p[j] * g[j];
    for (int j = 0; j < Tk; j++) g[j] = p[j] * (g[j] - sum_p_dp);
}

// relu_forward: h = max(0, h)
static __global__ void relu_forward_kernel(float *h, size_t n) {
    size_t i = THREAD_INDEX;
    if (i < n) h[i] = h[i] > 0 ? h[i] : 0;
}

// relu_backward: dh = 0 where h <= 0
static __global__ void relu_backward_kernel(float *dh, const float *h, size_t n) {
    size_t i = THREAD_INDEX;
    if (i < n && !(h[i] > 0)) dh[i] = 0;
}

// embedding_forward, one thread per element: out[b,t,i] = E[token, i] * sqrt(C) + pe[t, i]
// (pe: the sinusoids, or the learned table of Table 3, row E)
static __global__ void embedding_forward_kernel(float *out, const int *tokens, const float *embedding,
                                                const float *pe, int B, int T, int C) {
    size_t e = THREAD_INDEX;
    if (e >= (size_t)B * T * C) return;
    size_t bt = e / C;
    int t = (int)(bt % T), i = (int)(e % C);
    out[e] = embedding[(size_t)tokens[bt] * C + i] * sqrtf((float)C) + pe[(size_t)t * C + i];
}

// embedding_backward, one thread per feature i, positions in order (two
// positions with the same token add into the same row: one thread owns each
// column, so no two threads ever write one element):
//   dE[token, i] += dout[b,t,i] * sqrt(C)
static __global__ void embedding_backward_kernel(float *dembedding, const float *dout, const int *tokens,
                                                 int B, int T, int C) {
    size_t i = THREAD_INDEX;
    if (i >= (size_t)C) return;
    float scale = sqrtf((float)C);
    for (size_t bt = 0; bt < (size_t)B * T; bt++)
        dembedding[(size_t)tokens[bt] * C + i] += dout[bt * C + i] * scale;
}

// position_embedding_backward (Table 3, row E), one thread per element (t, i)
// of the learned table, sentences in order as the host loop adds them:
//   dpe[t, i] += dout[b,t,i]  for b = 0 .. B-1
static __global__ void position_embedding_backward_kernel(float *dpe, const float *dout, int B, int T, int C) {
    size_t e = THREAD_INDEX;
    if (e >= (size_t)T * C) return;
    size_t t = e / C, i = e % C;
    for (int b = 0; b < B; b++) dpe[e] += dout[((size_t)b * T + t) * C + i];
}

// cross_entropy_forward, one thread per target position (b, t): probabilities
// and the label-smoothed loss -(1-eps) log p_y - (eps/V) sum_v log p_v; padding gets 0.
static __global__ void cross_entropy_forward_kernel(float *token_loss, float *probs, const float *logits,
                                                    const int *targets, const int *tgt_len, float eps,
                                                    int B, int T, int V) {
    size_t bt = THREAD_INDEX;
    if (bt >= (size_t)B * T) return;
    const float *z = logits + bt * V;
    float *p = probs + bt * V;
    if ((int)(bt % T) >= tgt_len[bt / T]) {
        token_loss[bt] = 0;
        for (int v = 0; v < V; v++) p[v] = 0;
        return;
    }
    float max_z = -INFINITY, sum = 0, sum_z = 0;
    for (int v = 0; v < V; v++) max_z = z[v] > max_z ? z[v] : max_z;
    for (int v = 0; v < V; v++) {
        p[v] = expf(z[v] - max_z);
        sum += p[v];
        sum_z += z[v];
    }
    float log_sum = max_z + logf(sum), inv_sum = 1 / sum;
    for (int v = 0; v < V; v++) p[v] *= inv_sum;
    float log_p_target = z[targets[bt]] - log_sum, sum_log_p = sum_z - V * log_sum;
    token_loss[bt] = -(1 - eps) * log_p_target - eps / V * sum_log_p;
}

// cross_entropy_forward's mean over the non-padding positions: one thread, in
// order, in double, as the host loop
static __global__ void mean_loss_kernel(float *loss, const float *token_loss, const int *tgt_len, int B, int T) {
    if (THREAD_INDEX != 0) return;
    double total = 0;
    int count = 0;
    for (int bt = 0; bt < B * T; bt++)
        if (bt % T < tgt_len[bt / T]) { total += token_loss[bt]; count++; }
    *loss = (float)(count ? total / count : 0.0);
}

// cross_entropy_backward, one thread per logit: dz_v += (p_v - q_v) / n
static __global__ void cross_entropy_backward_kernel(float *dlogits, const float *probs, const int *targets,
                                                     const int *tgt_len, float eps, float inv_n,
                                                     int B, int T, int V) {
    size_t e = THREAD_INDEX;
    if (e >= (size_t)B * T * V) return;
    size_t bt = e / V;
    int v = (int)(e % V);
    if ((int)(bt % T) >= tgt_len[bt / T]) return;
    float q = eps / V + (v == targets[bt] ? 1 - eps : 0);
    dlogits[e] += (probs[e] - q) * inv_n;
}

// adam_update, one thread per parameter
static __global__ void adam_kernel(float *theta, float *first, float *second, const float *grad, size_t n,
                                   float beta1, float beta2, float step_size, float rsqrt_c2, float eps) {
    size_t i = THREAD_INDEX;
    if (i >= n) return;
    float g = grad[i];
    float mi = beta1 * first[i] + (1 - beta1) * g;
    float vi = beta2 * second[i] + (1 - beta2) * g * g;
    first[i] = mi;
    second[i] = vi;
    theta[i] -= step_size * mi / (sqrtf(vi) * rsqrt_c2 + eps);
}

// ============================================================================
// The GPU's model: its memory, and the matrix products through cuBLAS
// ============================================================================

// Layer l's parameters (or gradients) on the GPU: the same offsets as on the host.
typedef struct { float *qkv_w, *qkv_b, *out_w, *out_b; } GpuAttentionParams;
typedef struct {
    GpuAttentionParams self_attn, cross_attn;           // cross_attn: decoder only
    float *ln1_g, *ln1_b, *ln2_g, *ln2_b, *ln3_g, *ln3_b;  // ln3: decoder only
    float *ff1_w, *ff1_b, *ff2_w, *ff2_b;
} GpuLayerParams;

// One layer's activations, named as transformer.h's ActivationTensors.
typedef struct {
    float *qkv, *att, *heads, *att_proj, *drop1, *res1, *ln1, *ln1_mean, *ln1_rstd;
    float *ff_h, *ff_out, *drop2, *res2, *ln2, *ln2_mean, *ln2_rstd;
} GpuEncoderActs;
typedef struct {
    float *self_qkv, *self_att, *self_heads, *self_proj, *drop1, *res1, *ln1, *ln1_mean, *ln1_rstd;
    float *cross_q, *cross_kv, *cross_att, *cross_heads, *cross_proj, *drop2, *res2, *ln2, *ln2_mean, *ln2_rstd;
    float *ff_h, *ff_out, *drop3, *res3, *ln3, *ln3_mean, *ln3_rstd;
} GpuDecoderActs;

typedef struct { void **list; int count, capacity; } Allocations;

typedef struct {
    int ready, tf32;
    cublasHandle_t cublas;
    TransformerConfig config;
    size_t num_parameters;
    float *params, *grads, *adam_m, *adam_v;   // the host's layout
    float *pe;   // (max_len, C): the sinusoids, or learned positions' table inside params
    Allocations model_memory, batch_memory;
    // the batch and the activations, sized for cap_B x cap_S x cap_T
    int cap_B, cap_S, cap_T;
    int *src, *src_len, *tgt_in, *tgt_out, *tgt_len;
    float *enc_embedded, *enc_emb_mask, *enc_x0, *dec_embedded, *dec_emb_mask, *dec_x0;
    GpuEncoderActs *enc;   // (L) on the host, pointing to the GPU
    GpuDecoderActs *dec;
    float *logits, *probs, *token_loss, *loss;
    BackwardScratch scratch;   // transformer.h's, on the GPU
    float *d_att;              // (B, NH, Tq, Tk): dp, then ds (the host keeps one row per thread)
} GpuModel;

static GpuModel gpu;

static void *gpu_alloc(Allocations *a, size_t count, size_t size) {
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, count * size));
    if (a->count == a->capacity) {
        a->capacity = a->capacity ? 2 * a->capacity : 64;
        a->list = (void **)realloc(a->list, (size_t)a->capacity * sizeof(void *));
        if (!a->list) { fprintf(stderr, "error: out of memory (the list of GPU allocations)\n"); exit(1); }
    }
    a->list[a->count++] = p;
    return p;
}
static float *gpu_floats(Allocations *a, size_t count) { return (float *)gpu_alloc(a, count, sizeof(float)); }

static void gpu_free_all(Allocations *a) {
    for (int i = 0; i < a->count; i++) CUDA_CHECK(cudaFree(a->list[i]));
    free(a->list);
    memset(a, 0, sizeof *a);
}

static void gpu_zero(float *x, size_t n) { CUDA_CHECK(cudaMemset(x, 0, n * sizeof(float))); }

static void gpu_copy(void *to, const void *from, size_t bytes, cudaMemcpyKind kind) {
    CUDA_CHECK(cudaMemcpy(to, from, bytes, kind));
}

// C = alpha op(A) op(B) + beta C, column-major (cuda_on_cpu.h says it exactly)
static void gemm(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    CUBLAS_CHECK(cublasSgemm(gpu.cublas, transa, transb, m, n, k, &alpha, A, lda, B, ldb, &beta, C, ldc));
}

// The same for `count` products, the i-th at A + i*stride_a, B + i*stride_b, C + i*stride_c
static void gemm_batched(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k, float alpha,
                         const float *A, int lda, long long stride_a, const float *B, int ldb, long long stride_b,
                         float beta, float *C, int ldc, long long stride_c, int count) {
    CUBLAS_CHECK(cublasSgemmStridedBatched(gpu.cublas, transa, transb, m, n, k, &alpha, A, lda, stride_a,
                                           B, ldb, stride_b, &beta, C, ldc, stride_c, count));
}

// the two operations, short: OP_N uses a matrix as stored, OP_T its transpose
#define OP_N CUBLAS_OP_N
#define OP_T CUBLAS_OP_T

// ============================================================================
// Part I's functions on the GPU, each named after the one it mirrors
// ============================================================================

// linear_forward: out (N,OC) = inp (N,IC) W^T + bias, W (OC,IC).
// Column-major, out is out^T (OC x N) = W (OC x IC, stored as W^T: T) times inp^T (IC x N, N).
static void gpu_linear_forward(float *out, const float *inp, const float *weight, const float *bias,
                               int N, int IC, int OC) {
    if (bias) LAUNCH_FOR((size_t)N * OC, bias_rows_kernel, out, bias, (size_t)N, OC);
    gemm(OP_T, OP_N, OC, N, IC, 1.0f, weight, IC, inp, IC, bias ? 1.0f : 0.0f, out, OC);
}

// linear_backward:
//   dinp (N,IC) += dout (N,OC) W (OC,IC):  dinp^T (IC x N) += W^T (IC x OC, N) dout^T (OC x N, N)
//   dW (OC,IC) += dout^T inp:              dW^T (IC x OC) += inp^T (IC x N, N) dout (N x OC, T)
//   dbias += the column sums of dout
static void gpu_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                const float *weight, int N, int IC, int OC) {
    if (dinp) gemm(OP_N, OP_N, IC, N, OC, 1.0f, weight, IC, dout, OC, 1.0f, dinp, IC);
    gemm(OP_N, OP_T, IC, OC, N, 1.0f, inp, IC, dout, OC, 1.0f, dweight, IC);
    if (dbias) LAUNCH_FOR(OC, bias_backward_kernel, dbias, dout, N, OC);
}

// dropout_mask: draws the key from the host model's generator, as transformer.c does
static void gpu_dropout_mask(float *mask, Transformer *m, size_t n) {
    float p = m->config.dropout;
    if (!m->training || p <= 0.0f) {
        LAUNCH_FOR(n, dropout_mask_kernel, mask, (uint64_t)0, -1.0, 1.0f, n);
        return;
    }
    uint64_t key = transformer_dropout_key(m);
    LAUNCH_FOR(n, dropout_mask_kernel, mask, key, (double)p, (float)(1.0 / (1.0 - p)), n);
}

// add_norm_forward: res = x + Dropout(sublayer);  out = LayerNorm(res)
static void gpu_add_norm_forward(float *out, float *mean, float *rstd, float *res, float *mask, const float *x,
                                 const float *sublayer, const float *gain, const float *bias, Transformer *m, int N) {
    int C = m->config.d_model;
    gpu_dropout_mask(mask, m, (size_t)N * C);
    LAUNCH_FOR(N, residual_layernorm_forward_kernel, out, mean, rstd, res, x, sublayer, mask, gain, bias, N, C,
               m->config.layer_norm_eps);
}

// residual_layernorm_backward
static void gpu_residual_layernorm_backward(float *dresidual, float *dsublayer, float *dgain, float *dbias,
                                            const float *dout, const float *res, const float *mask,
                                            const float *gain, const float *mean, const float *rstd, int N, int C) {
    LAUNCH_FOR(N, residual_layernorm_backward_kernel, dresidual, dsublayer, dout, res, mask, gain, mean, rstd, N, C);
    LAUNCH_FOR(C, layernorm_params_backward_kernel, dgain, dbias, dout, res, mean, rstd, N, C);
}

// attention_forward, one sentence b at a time, its NH heads as one batched product.
// Head h of query row i is at q + (b*Tq + i)*q_stride + h*hs: column-major, the
// queries of head h are Q^T (hs x Tq) with leading dimension q_stride, and
// head h+1 starts hs further on. Likewise the keys and values with kv_stride.
static void gpu_attention_forward(float *out, float *att, const float *q, const float *k, const float *v,
                                  int q_stride, int kv_stride, const int *key_len, int causal,
                                  int B, int Tq, int Tk, int C, int NH) {
    int hs = C / NH;
    float scale = 1 / sqrtf((float)hs);
    long long att_head = (long long)Tq * Tk;
    for (int b = 0; b < B; b++) {
        // s = Q K^T / sqrt(d_k), (Tq x Tk) per head: s^T (Tk x Tq) = K (Tk x hs, stored K^T: T) Q^T (hs x Tq, N)
        gemm_batched(OP_T, OP_N, Tk, Tq, hs, scale, k + (size_t)b * Tk * kv_stride, kv_stride, hs,
                     q + (size_t)b * Tq * q_stride, q_stride, hs, 0.0f, att + (size_t)b * NH * att_head, Tk, att_head, NH);
    }
    LAUNCH_FOR((size_t)B * NH * Tq, softmax_visible_kernel, att, key_len, causal, B, NH, Tq, Tk);
    for (int b = 0; b < B; b++) {
        // out_i = sum_j p_ij v_j:  out^T (hs x Tq, ld C) = V^T (hs x Tk, N) P^T (Tk x Tq, N)
        gemm_batched(OP_N, OP_N, hs, Tq, Tk, 1.0f, v + (size_t)b * Tk * kv_stride, kv_stride, hs,
                     att + (size_t)b * NH * att_head, Tk, att_head, 0.0f, out + (size_t)b * Tq * C, C, hs, NH);
    }
}

// attention_backward, with d_att (B,NH,Tq,Tk) for dp and then ds
static void gpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *att,
                                   const float *q, const float *k, const float *v,
                                   int q_stride, int kv_stride, int B, int Tq, int Tk, int C, int NH) {
    int hs = C / NH;
    float scale = 1 / sqrtf((float)hs);
    long long att_head = (long long)Tq * Tk;
    for (int b = 0; b < B; b++) {
        const float *v_b = v + (size_t)b * Tk * kv_stride, *dout_b = dout + (size_t)b * Tq * C;
        const float *att_b = att + (size_t)b * NH * att_head;
        float *d_att_b = gpu.d_att + (size_t)b * NH * att_head;
        // dp_ij = dout_i . v_j:  dp^T (Tk x Tq) = V (Tk x hs, stored V^T: T) dout^T (hs x Tq, N)
        gemm_batched(OP_T, OP_N, Tk, Tq, hs, 1.0f, v_b, kv_stride, hs, dout_b, C, hs, 0.0f, d_att_b, Tk, att_head, NH);
        // dv_j += sum_i p_ij dout_i:  dv^T (hs x Tk) += dout^T (hs x Tq, N) P (Tq x Tk, stored P^T: T)
        gemm_batched(OP_N, OP_T, hs, Tk, Tq, 1.0f, dout_b, C, hs, att_b, Tk, att_head, 1.0f,
                     dv + (size_t)b * Tk * kv_stride, kv_stride, hs, NH);
    }
    LAUNCH_FOR((size_t)B * NH * Tq, softmax_backward_kernel, gpu.d_att, att, (size_t)B * NH * Tq, Tk);
    for (int b = 0; b < B; b++) {
        const float *d_att_b = gpu.d_att + (size_t)b * NH * att_head;
        // dq_i += sum_j ds_ij k_j / sqrt(d_k):  dq^T (hs x Tq) += K^T (hs x Tk, N) ds^T (Tk x Tq, N)
        gemm_batched(OP_N, OP_N, hs, Tq, Tk, scale, k + (size_t)b * Tk * kv_stride, kv_stride, hs, d_att_b, Tk, att_head,
                     1.0f, dq + (size_t)b * Tq * q_stride, q_stride, hs, NH);
        // dk_j += sum_i ds_ij q_i / sqrt(d_k):  dk^T (hs x Tk) += Q^T (hs x Tq, N) ds (Tq x Tk, stored ds^T: T)
        gemm_batched(OP_N, OP_T, hs, Tk, Tq, scale, q + (size_t)b * Tq * q_stride, q_stride, hs, d_att_b, Tk, att_head,
                     1.0f, dk + (size_t)b * Tk * kv_stride, kv_stride, hs, NH);
    }
}

// self_attention_forward: qkv = x W_qkv^T + b;  heads = Attention(q, k, v);  out = heads W^O^T + b^O
static void gpu_self_attention_forward(float *out, float *qkv, float *att, float *heads, const float *x,
                                       GpuAttentionParams w, const int *len, int causal, int B, int T, int C, int NH) {
    gpu_linear_forward(qkv, x, w.qkv_w, w.qkv_b, B * T, C, 3 * C);
    gpu_attention_forward(heads, att, qkv, qkv + C, qkv + 2 * C, 3 * C, 3 * C, len, causal, B, T, T, C, NH);
    gpu_linear_forward(out, heads, w.out_w, w.out_b, B * T, C, C);
}

// self_attention_backward
static void gpu_self_attention_backward(float *dx, GpuAttentionParams g, float *d_qkv, float *d_heads,
                                        const float *dout, const float *qkv, const float *att, const float *heads,
                                        const float *x, GpuAttentionParams w, int B, int T, int C, int NH) {
    gpu_linear_backward(d_heads, g.out_w, g.out_b, dout, heads, w.out_w, B * T, C, C);
    gpu_attention_backward(d_qkv, d_qkv + C, d_qkv + 2 * C, d_heads, att, qkv, qkv + C, qkv + 2 * C,
                           3 * C, 3 * C, B, T, T, C, NH);
    gpu_linear_backward(dx, g.qkv_w, g.qkv_b, d_qkv, x, w.qkv_w, B * T, C, 3 * C);
}

// cross_attention_forward: q from the decoder, keys and values from the memory
static void gpu_cross_attention_forward(float *out, float *q, float *kv, float *att, float *heads, const float *x,
                                        const float *memory, GpuAttentionParams w, const int *src_len,
                                        int B, int T, int S, int C, int NH) {
    gpu_linear_forward(q, x, w.qkv_w, w.qkv_b, B * T, C, C);
    gpu_linear_forward(kv, memory, w.qkv_w + (size_t)C * C, w.qkv_b + C, B * S, C, 2 * C);
    gpu_attention_forward(heads, att, q, kv, kv + C, C, 2 * C, src_len, 0, B, T, S, C, NH);
    gpu_linear_forward(out, heads, w.out_w, w.out_b, B * T, C, C);
}

// cross_attention_backward
static void gpu_cross_attention_backward(float *dx, float *dmemory, GpuAttentionParams g, float *d_q, float *d_kv,
                                         float *d_heads, const float *dout, const float *q, const float *kv,
                                         const float *att, const float *heads, const float *x, const float *memory,
                                         GpuAttentionParams w, int B, int T, int S, int C, int NH) {
    gpu_linear_backward(d_heads, g.out_w, g.out_b, dout, heads, w.out_w, B * T, C, C);
    gpu_attention_backward(d_q, d_kv, d_kv + C, d_heads, att, q, kv, kv + C, C, 2 * C, B, T, S, C, NH);
    gpu_linear_backward(dx, g.qkv_w, g.qkv_b, d_q, x, w.qkv_w, B * T, C, C);
    gpu_linear_backward(dmemory, g.qkv_w + (size_t)C * C, g.qkv_b + C, d_kv, memory, w.qkv_w + (size_t)C * C,
                        B * S, C, 2 * C);
}

// feed_forward_forward: h = max(0, x W_1^T + b_1);  out = h W_2^T + b_2
static void gpu_feed_forward_forward(float *out, float *h, const float *x, GpuLayerParams w, int N, int C, int F) {
    gpu_linear_forward(h, x, w.ff1_w, w.ff1_b, N, C, F);
    LAUNCH_FOR((size_t)N * F, relu_forward_kernel, h, (size_t)N * F);
    gpu_linear_forward(out, h, w.ff2_w, w.ff2_b, N, F, C);
}

// feed_forward_backward
static void gpu_feed_forward_backward(float *dx, GpuLayerParams g, float *d_h, const float *dout, const float *h,
                                      const float *x, GpuLayerParams w, int N, int C, int F) {
    gpu_linear_backward(d_h, g.ff2_w, g.ff2_b, dout, h, w.ff2_w, N, F, C);
    LAUNCH_FOR((size_t)N * F, relu_backward_kernel, d_h, h, (size_t)N * F);
    gpu_linear_backward(dx, g.ff1_w, g.ff1_b, d_h, x, w.ff1_w, N, C, F);
}

// ---- the layers' parameters and activations ----------------------------------

// Layer l of the tensor whose host copy starts at host_tensor (a pointer into
// the host's params_memory), in the GPU arena `arena` of the same layout.
static float *on_gpu(float *arena, const Transformer *m, const real *host_tensor, size_t l, size_t per_layer) {
    return arena + (host_tensor - m->params_memory) + l * per_layer;
}

static GpuAttentionParams gpu_attention_params(float *arena, const Transformer *m, const real *qkv_w,
                                               const real *qkv_b, const real *out_w, const real *out_b, size_t l) {
    size_t C = m->config.d_model;
    GpuAttentionParams a = { on_gpu(arena, m, qkv_w, l, 3 * C * C), on_gpu(arena, m, qkv_b, l, 3 * C),
                             on_gpu(arena, m, out_w, l, C * C), on_gpu(arena, m, out_b, l, C) };
    return a;
}

// encoder_layer_params: arena is gpu.params or gpu.grads
static GpuLayerParams gpu_encoder_params(float *arena, const Transformer *m, size_t l) {
    const ParameterTensors *p = &m->params;
    size_t C = m->config.d_model, F = m->config.d_ff;
    GpuLayerParams e;
    memset(&e, 0, sizeof e);
    e.self_attn = gpu_attention_params(arena, m, p->enc_qkv_w, p->enc_qkv_b, p->enc_out_w, p->enc_out_b, l);
    e.ln1_g = on_gpu(arena, m, p->enc_ln1_g, l, C); e.ln1_b = on_gpu(arena, m, p->enc_ln1_b, l, C);
    e.ff1_w = on_gpu(arena, m, p->enc_ff1_w, l, F * C); e.ff1_b = on_gpu(arena, m, p->enc_ff1_b, l, F);
    e.ff2_w = on_gpu(arena, m, p->enc_ff2_w, l, C * F); e.ff2_b = on_gpu(arena, m, p->enc_ff2_b, l, C);
    e.ln2_g = on_gpu(arena, m, p->enc_ln2_g, l, C); e.ln2_b = on_gpu(arena, m, p->enc_ln2_b, l, C);
    return e;
}

// decoder_layer_params
static GpuLayerParams gpu_decoder_params(float *arena, const Transformer *m, size_t l) {
    const ParameterTensors *p = &m->params;
    size_t C = m->config.d_model, F = m->config.d_ff;
    GpuLayerParams d;
    d.self_attn = gpu_attention_params(arena, m, p->dec_self_qkv_w, p->dec_self_qkv_b, p->dec_self_out_w,
                                       p->dec_self_out_b, l);
    d.cross_attn = gpu_attention_params(arena, m, p->dec_cross_qkv_w, p->dec_cross_qkv_b, p->dec_cross_out_w,
                                        p->dec_cross_out_b, l);
    d.ln1_g = on_gpu(arena, m, p->dec_ln1_g, l, C); d.ln1_b = on_gpu(arena, m, p->dec_ln1_b, l, C);
    d.ln2_g = on_gpu(arena, m, p->dec_ln2_g, l, C); d.ln2_b = on_gpu(arena, m, p->dec_ln2_b, l, C);
    d.ln3_g = on_gpu(arena, m, p->dec_ln3_g, l, C); d.ln3_b = on_gpu(arena, m, p->dec_ln3_b, l, C);
    d.ff1_w = on_gpu(arena, m, p->dec_ff1_w, l, F * C); d.ff1_b = on_gpu(arena, m, p->dec_ff1_b, l, F);
    d.ff2_w = on_gpu(arena, m, p->dec_ff2_w, l, C * F); d.ff2_b = on_gpu(arena, m, p->dec_ff2_b, l, C);
    return d;
}

// ensure_buffers: the batch, activations and scratch for a (B, S, T) batch, one
// allocation per tensor and layer; a smaller batch uses the start of each
static void gpu_ensure_buffers(const TransformerConfig *c, int B, int S, int T) {
    if (gpu.enc && B <= gpu.cap_B && S <= gpu.cap_S && T <= gpu.cap_T) return;
    if (B < gpu.cap_B) B = gpu.cap_B;
    if (S < gpu.cap_S) S = gpu.cap_S;
    if (T < gpu.cap_T) T = gpu.cap_T;
    gpu_free_all(&gpu.batch_memory);
    free(gpu.enc);
    free(gpu.dec);
    Allocations *a = &gpu.batch_memory;
    size_t L = c->n_layers, C = c->d_model, F = c->d_ff, NH = c->n_heads, V = c->vocab_size;
    size_t BS = (size_t)B * S, BT = (size_t)B * T, rows = BS > BT ? BS : BT, longest = S > T ? S : T;
    gpu.src = (int *)gpu_alloc(a, BS, sizeof(int));
    gpu.tgt_in = (int *)gpu_alloc(a, BT, sizeof(int));
    gpu.tgt_out = (int *)gpu_alloc(a, BT, sizeof(int));
    gpu.src_len = (int *)gpu_alloc(a, B, sizeof(int));
    gpu.tgt_len = (int *)gpu_alloc(a, B, sizeof(int));
    gpu.enc_embedded = gpu_floats(a, BS * C); gpu.enc_emb_mask = gpu_floats(a, BS * C); gpu.enc_x0 = gpu_floats(a, BS * C);
    gpu.dec_embedded = gpu_floats(a, BT * C); gpu.dec_emb_mask = gpu_floats(a, BT * C); gpu.dec_x0 = gpu_floats(a, BT * C);
    gpu.enc = (GpuEncoderActs *)calloc(L, sizeof(GpuEncoderActs));
    gpu.dec = (GpuDecoderActs *)calloc(L, sizeof(GpuDecoderActs));
    if (!gpu.enc || !gpu.dec) { fprintf(stderr, "error: out of memory (the GPU's layer list)\n"); exit(1); }
    for (size_t l = 0; l < L; l++) {
        GpuEncoderActs *e = &gpu.enc[l];
        float **enc_rows_c[] = { &e->heads, &e->att_proj, &e->drop1, &e->res1, &e->ln1, &e->ff_out, &e->drop2,
                                 &e->res2, &e->ln2 };
        for (size_t i = 0; i < sizeof enc_rows_c / sizeof *enc_rows_c; i++) *enc_rows_c[i] = gpu_floats(a, BS * C);
        float **enc_rows[] = { &e->ln1_mean, &e->ln1_rstd, &e->ln2_mean, &e->ln2_rstd };
        for (size_t i = 0; i < sizeof enc_rows / sizeof *enc_rows; i++) *enc_rows[i] = gpu_floats(a, BS);
        e->qkv = gpu_floats(a, BS * 3 * C);
        e->att = gpu_floats(a, B * NH * S * S);
        e->ff_h = gpu_floats(a, BS * F);
        GpuDecoderActs *d = &gpu.dec[l];
        float **dec_rows_c[] = { &d->self_heads, &d->self_proj, &d->drop1, &d->res1, &d->ln1, &d->cross_q,
                                 &d->cross_heads, &d->cross_proj, &d->drop2, &d->res2, &d->ln2, &d->ff_out,
                                 &d->drop3, &d->res3, &d->ln3 };
        for (size_t i = 0; i < sizeof dec_rows_c / sizeof *dec_rows_c; i++) *dec_rows_c[i] = gpu_floats(a, BT * C);
        float **dec_rows[] = { &d->ln1_mean, &d->ln1_rstd, &d->ln2_mean, &d->ln2_rstd, &d->ln3_mean, &d->ln3_rstd };
        for (size_t i = 0; i < sizeof dec_rows / sizeof *dec_rows; i++) *dec_rows[i] = gpu_floats(a, BT);
        d->self_qkv = gpu_floats(a, BT * 3 * C);
        d->self_att = gpu_floats(a, B * NH * T * T);
        d->cross_kv = gpu_floats(a, BS * 2 * C);
        d->cross_att = gpu_floats(a, B * NH * T * S);
        d->ff_h = gpu_floats(a, BT * F);
    }
    gpu.logits = gpu_floats(a, BT * V); gpu.probs = gpu_floats(a, BT * V);
    gpu.token_loss = gpu_floats(a, BT); gpu.loss = gpu_floats(a, 1);
    BackwardScratch *s = &gpu.scratch;
    float **by_rows_c[] = { &s->d_output, &s->d_input, &s->d_ln1, &s->d_ln2, &s->d_sublayer, &s->d_heads,
                            &s->d_embedded };
    for (size_t i = 0; i < sizeof by_rows_c / sizeof *by_rows_c; i++) *by_rows_c[i] = gpu_floats(a, rows * C);
    s->d_qkv = gpu_floats(a, rows * 3 * C); s->d_q = gpu_floats(a, BT * C); s->d_kv = gpu_floats(a, BS * 2 * C);
    s->d_ff_h = gpu_floats(a, rows * F); s->d_memory = gpu_floats(a, BS * C); s->d_logits = gpu_floats(a, BT * V);
    gpu.d_att = gpu_floats(a, B * NH * longest * longest);
    gpu.cap_B = B; gpu.cap_S = S; gpu.cap_T = T;
}

// ============================================================================
// The layers, the whole forward pass, the whole backward pass, Adam
// ============================================================================

// encoder_layer_forward
static void gpu_encoder_layer_forward(GpuEncoderActs la, const float *x, GpuLayerParams w, Transformer *m, int B, int S) {
    const TransformerConfig *c = &m->config;
    int C = c->d_model, N = B * S;
    gpu_self_attention_forward(la.att_proj, la.qkv, la.att, la.heads, x, w.self_attn, gpu.src_len, 0, B, S, C, c->n_heads);
    gpu_add_norm_forward(la.ln1, la.ln1_mean, la.ln1_rstd, la.res1, la.drop1, x, la.att_proj, w.ln1_g, w.ln1_b, m, N);
    gpu_feed_forward_forward(la.ff_out, la.ff_h, la.ln1, w, N, C, c->d_ff);
    gpu_add_norm_forward(la.ln2, la.ln2_mean, la.ln2_rstd, la.res2, la.drop2, la.ln1, la.ff_out, w.ln2_g, w.ln2_b, m, N);
}

// encoder_layer_backward
static void gpu_encoder_layer_backward(float *dx, GpuLayerParams g, const float *dout, GpuEncoderActs la,
                                       const float *x, GpuLayerParams w, const TransformerConfig *c, int B, int S) {
    BackwardScratch *s = &gpu.scratch;
    int C = c->d_model, F = c->d_ff, N = B * S;
    size_t n = (size_t)N * C;
    gpu_zero(s->d_ln1, n); gpu_zero(s->d_sublayer, n);
    gpu_residual_layernorm_backward(s->d_ln1, s->d_sublayer, g.ln2_g, g.ln2_b, dout, la.res2, la.drop2, w.ln2_g,
                                    la.ln2_mean, la.ln2_rstd, N, C);
    gpu_zero(s->d_ff_h, (size_t)N * F);
    gpu_feed_forward_backward(s->d_ln1, g, s->d_ff_h, s->d_sublayer, la.ff_h, la.ln1, w, N, C, F);
    gpu_zero(s->d_sublayer, n);
    gpu_residual_layernorm_backward(dx, s->d_sublayer, g.ln1_g, g.ln1_b, s->d_ln1, la.res1, la.drop1, w.ln1_g,
                                    la.ln1_mean, la.ln1_rstd, N, C);
    gpu_zero(s->d_heads, n); gpu_zero(s->d_qkv, 3 * n);
    gpu_self_attention_backward(dx, g.self_attn, s->d_qkv, s->d_heads, s->d_sublayer, la.qkv, la.att, la.heads,
                                x, w.self_attn, B, S, C, c->n_heads);
}

// decoder_layer_forward
static void gpu_decoder_layer_forward(GpuDecoderActs la, const float *y, const float *memory, GpuLayerParams w,
                                      Transformer *m, int B, int S, int T) {
    const TransformerConfig *c = &m->config;
    int C = c->d_model, N = B * T;
    gpu_self_attention_forward(la.self_proj, la.self_qkv, la.self_att, la.self_heads, y, w.self_attn, gpu.tgt_len, 1,
                               B, T, C, c->n_heads);
    gpu_add_norm_forward(la.ln1, la.ln1_mean, la.ln1_rstd, la.res1, la.drop1, y, la.self_proj, w.ln1_g, w.ln1_b, m, N);
    gpu_cross_attention_forward(la.cross_proj, la.cross_q, la.cross_kv, la.cross_att, la.cross_heads, la.ln1, memory,
                                w.cross_attn, gpu.src_len, B, T, S, C, c->n_heads);
    gpu_add_norm_forward(la.ln2, la.ln2_mean, la.ln2_rstd, la.res2, la.drop2, la.ln1, la.cross_proj, w.ln2_g, w.ln2_b, m, N);
    gpu_feed_forward_forward(la.ff_out, la.ff_h, la.ln2, w, N, C, c->d_ff);
    gpu_add_norm_forward(la.ln3, la.ln3_mean, la.ln3_rstd, la.res3, la.drop3, la.ln2, la.ff_out, w.ln3_g, w.ln3_b, m, N);
}

// decoder_layer_backward
static void gpu_decoder_layer_backward(float *dy, float *dmemory, GpuLayerParams g, const float *dout,
                                       GpuDecoderActs la, const float *y, const float *memory, GpuLayerParams w,
                                       const TransformerConfig *c, int B, int S, int T) {
    BackwardScratch *s = &gpu.scratch;
    int C = c->d_model, F = c->d_ff, N = B * T, NH = c->n_heads;
    size_t n = (size_t)N * C;
    gpu_zero(s->d_ln2, n); gpu_zero(s->d_sublayer, n);
    gpu_residual_layernorm_backward(s->d_ln2, s->d_sublayer, g.ln3_g, g.ln3_b, dout, la.res3, la.drop3, w.ln3_g,
                                    la.ln3_mean, la.ln3_rstd, N, C);
    gpu_zero(s->d_ff_h, (size_t)N * F);
    gpu_feed_forward_backward(s->d_ln2, g, s->d_ff_h, s->d_sublayer, la.ff_h, la.ln2, w, N, C, F);
    gpu_zero(s->d_sublayer, n); gpu_zero(s->d_ln1, n);
    gpu_residual_layernorm_backward(s->d_ln1, s->d_sublayer, g.ln2_g, g.ln2_b, s->d_ln2, la.res2, la.drop2, w.ln2_g,
                                    la.ln2_mean, la.ln2_rstd, N, C);
    gpu_zero(s->d_heads, n); gpu_zero(s->d_q, n); gpu_zero(s->d_kv, (size_t)B * S * 2 * C);
    gpu_cross_attention_backward(s->d_ln1, dmemory, g.cross_attn, s->d_q, s->d_kv, s->d_heads, s->d_sublayer,
                                 la.cross_q, la.cross_kv, la.cross_att, la.cross_heads, la.ln1, memory, w.cross_attn,
                                 B, T, S, C, NH);
    gpu_zero(s->d_sublayer, n);
    gpu_residual_layernorm_backward(dy, s->d_sublayer, g.ln1_g, g.ln1_b, s->d_ln1, la.res1, la.drop1, w.ln1_g,
                                    la.ln1_mean, la.ln1_rstd, N, C);
    gpu_zero(s->d_heads, n); gpu_zero(s->d_qkv, 3 * n);
    gpu_self_attention_backward(dy, g.self_attn, s->d_qkv, s->d_heads, s->d_sublayer, la.self_qkv, la.self_att,
                                la.self_heads, y, w.self_attn, B, T, C, NH);
}

// transformer_forward: the batch to the GPU, the encoder, the decoder, the loss;
// returns the loss, copied back (the one number that crosses each step)
static real gpu_forward(Transformer *m, const Batch *batch) {
    const char *error = batch_check(batch, &m->config);
    if (error) { fprintf(stderr, "error: transformer_cuda forward: %s\n", error); exit(1); }
    const TransformerConfig *c = &m->config;
    int B = batch->B, S = batch->S, T = batch->T, C = c->d_model;
    gpu_ensure_buffers(c, B, S, T);
    m->B = B; m->S = S; m->T = T;
    gpu_copy(gpu.src, batch->src, (size_t)B * S * sizeof(int), cudaMemcpyHostToDevice);
    gpu_copy(gpu.src_len, batch->src_len, (size_t)B * sizeof(int), cudaMemcpyHostToDevice);
    gpu_copy(gpu.tgt_in, batch->tgt_in, (size_t)B * T * sizeof(int), cudaMemcpyHostToDevice);
    gpu_copy(gpu.tgt_out, batch->tgt_out, (size_t)B * T * sizeof(int), cudaMemcpyHostToDevice);
    gpu_copy(gpu.tgt_len, batch->tgt_len, (size_t)B * sizeof(int), cudaMemcpyHostToDevice);
    float *embedding = on_gpu(gpu.params, m, m->params.embedding, 0, 0);
    // encoder_forward
    size_t n = (size_t)B * S * C;
    LAUNCH_FOR(n, embedding_forward_kernel, gpu.enc_embedded, gpu.src, embedding, gpu.pe, B, S, C);
    gpu_dropout_mask(gpu.enc_emb_mask, m, n);
    LAUNCH_FOR(n, dropout_forward_kernel, gpu.enc_x0, gpu.enc_embedded, gpu.enc_emb_mask, n);
    const float *x = gpu.enc_x0;
    for (int l = 0; l < c->n_layers; l++) {
        gpu_encoder_layer_forward(gpu.enc[l], x, gpu_encoder_params(gpu.params, m, l), m, B, S);
        x = gpu.enc[l].ln2;
    }
    const float *memory = x;
    // decoder_forward
    n = (size_t)B * T * C;
    LAUNCH_FOR(n, embedding_forward_kernel, gpu.dec_embedded, gpu.tgt_in, embedding, gpu.pe, B, T, C);
    gpu_dropout_mask(gpu.dec_emb_mask, m, n);
    LAUNCH_FOR(n, dropout_forward_kernel, gpu.dec_x0, gpu.dec_embedded, gpu.dec_emb_mask, n);
    const float *y = gpu.dec_x0;
    for (int l = 0; l < c->n_layers; l++) {
        gpu_decoder_layer_forward(gpu.dec[l], y, memory, gpu_decoder_params(gpu.params, m, l), m, B, S, T);
        y = gpu.dec[l].ln3;
    }
    gpu_linear_forward(gpu.logits, y, embedding, NULL, B * T, C, c->vocab_size);
    // cross_entropy_forward
    LAUNCH_FOR((size_t)B * T, cross_entropy_forward_kernel, gpu.token_loss, gpu.probs, gpu.logits, gpu.tgt_out,
               gpu.tgt_len, c->label_smoothing, B, T, c->vocab_size);
    LAUNCH(mean_loss_kernel, 1, 1, gpu.loss, gpu.token_loss, gpu.tgt_len, B, T);
    float loss;
    gpu_copy(&loss, gpu.loss, sizeof loss, cudaMemcpyDeviceToHost);
    m->num_target_tokens = 0;
    for (int b = 0; b < B; b++) m->num_target_tokens += batch->tgt_len[b];
    m->loss = loss;
    return loss;
}

// transformer_zero_grad and transformer_backward, for the batch of the last gpu_forward
static void gpu_backward(Transformer *m, const Batch *batch) {
    const TransformerConfig *c = &m->config;
    BackwardScratch *s = &gpu.scratch;
    int B = batch->B, S = batch->S, T = batch->T, C = c->d_model, V = c->vocab_size, L = c->n_layers;
    size_t n_dec = (size_t)B * T * C, n_enc = (size_t)B * S * C;
    gpu_zero(gpu.grads, gpu.num_parameters);
    if (m->num_target_tokens == 0) return;
    float *embedding = on_gpu(gpu.params, m, m->params.embedding, 0, 0);
    float *d_embedding = on_gpu(gpu.grads, m, m->params.embedding, 0, 0);
    float *d_positions = on_gpu(gpu.grads, m, m->params.position_embedding, 0, 0);   // learned positions only
    int learned = c->positional == POSITIONAL_LEARNED;
    gpu_zero(s->d_logits, (size_t)B * T * V);
    LAUNCH_FOR((size_t)B * T * V, cross_entropy_backward_kernel, s->d_logits, gpu.probs, gpu.tgt_out, gpu.tgt_len,
               c->label_smoothing, (float)(1.0 / m->num_target_tokens), B, T, V);
    // logits = decoder_output E^T
    float *d_out = s->d_output, *d_in = s->d_input;
    gpu_zero(d_out, n_dec);
    gpu_linear_backward(d_out, d_embedding, NULL, s->d_logits, gpu.dec[L - 1].ln3, embedding, B * T, C, V);
    const float *memory = gpu.enc[L - 1].ln2;
    gpu_zero(s->d_memory, n_enc);
    for (int l = L - 1; l >= 0; l--) {
        const float *y = l == 0 ? gpu.dec_x0 : gpu.dec[l - 1].ln3;
        gpu_zero(d_in, n_dec);
        gpu_decoder_layer_backward(d_in, s->d_memory, gpu_decoder_params(gpu.grads, m, l), d_out, gpu.dec[l], y,
                                   memory, gpu_decoder_params(gpu.params, m, l), c, B, S, T);
        float *swap = d_out; d_out = d_in; d_in = swap;
    }
    gpu_zero(s->d_embedded, n_dec);
    LAUNCH_FOR(n_dec, dropout_backward_kernel, s->d_embedded, d_out, gpu.dec_emb_mask, n_dec);
    LAUNCH_FOR(C, embedding_backward_kernel, d_embedding, s->d_embedded, gpu.tgt_in, B, T, C);
    if (learned) LAUNCH_FOR((size_t)T * C, position_embedding_backward_kernel, d_positions, s->d_embedded, B, T, C);
    gpu_copy(d_out, s->d_memory, n_enc * sizeof(float), cudaMemcpyDeviceToDevice);
    for (int l = L - 1; l >= 0; l--) {
        const float *x = l == 0 ? gpu.enc_x0 : gpu.enc[l - 1].ln2;
        gpu_zero(d_in, n_enc);
        gpu_encoder_layer_backward(d_in, gpu_encoder_params(gpu.grads, m, l), d_out, gpu.enc[l], x,
                                   gpu_encoder_params(gpu.params, m, l), c, B, S);
        float *swap = d_out; d_out = d_in; d_in = swap;
    }
    gpu_zero(s->d_embedded, n_enc);
    LAUNCH_FOR(n_enc, dropout_backward_kernel, s->d_embedded, d_out, gpu.enc_emb_mask, n_enc);
    LAUNCH_FOR(C, embedding_backward_kernel, d_embedding, s->d_embedded, gpu.src, B, S, C);
    if (learned) LAUNCH_FOR((size_t)S * C, position_embedding_backward_kernel, d_positions, s->d_embedded, B, S, C);
}

// adam_update: the bias corrections on the host, in double, as transformer.c; then
// the GPU waits for the step to finish, so that a step's time is the step's and
// an error of any kernel is reported at the step where it happened
static void gpu_update(Transformer *m, double learning_rate) {
    m->adam_step++;
    double b1 = m->adam.beta1, b2 = m->adam.beta2;
    double correction1 = 1.0 - pow(b1, (double)m->adam_step), correction2 = 1.0 - pow(b2, (double)m->adam_step);
    LAUNCH_FOR(gpu.num_parameters, adam_kernel, gpu.params, gpu.adam_m, gpu.adam_v, gpu.grads, gpu.num_parameters,
               (float)b1, (float)b2, (float)(learning_rate / correction1), (float)(1.0 / sqrt(correction2)),
               m->adam.eps);
    CUDA_CHECK(cudaDeviceSynchronize());
}

// ============================================================================
// The hook transformer.c calls (transformer.h, TrainingCompute)
// ============================================================================

static void gpu_release(void) {
    gpu_free_all(&gpu.batch_memory);
    gpu_free_all(&gpu.model_memory);
    free(gpu.enc);
    free(gpu.dec);
    if (gpu.ready) CUBLAS_CHECK(cublasDestroy(gpu.cublas));
    int tf32 = gpu.tf32;
    memset(&gpu, 0, sizeof gpu);
    gpu.tf32 = tf32;
}

// begin: memory for the model's parameters, gradients, moments and sinusoids on
// the GPU (again when the model's shape changed), and their values
static void gpu_begin(Transformer *m) {
    if (gpu.ready && memcmp(&gpu.config, &m->config, sizeof gpu.config) != 0) gpu_release();
    if (!gpu.ready) {
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        CUBLAS_CHECK(cublasCreate(&gpu.cublas));
        // fp32 products as transformer.c's; TF32 tensor cores only when asked (--tf32)
        CUBLAS_CHECK(cublasSetMathMode(gpu.cublas, gpu.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
        fprintf(stderr, "transformer_cuda: training steps on %s, cuBLAS in %s\n", prop.name,
                gpu.tf32 ? "TF32 (--tf32)" : "fp32");
        gpu.ready = 1;
        gpu.config = m->config;
        gpu.num_parameters = m->num_parameters;
        float **arenas[] = { &gpu.params, &gpu.grads, &gpu.adam_m, &gpu.adam_v };
        for (int i = 0; i < 4; i++) *arenas[i] = gpu_floats(&gpu.model_memory, m->num_parameters);
        // learned positions are a parameter that Adam moves on the GPU: the forward
        // reads them where Adam writes them, as m->positional_encoding on the host
        gpu.pe = m->config.positional == POSITIONAL_LEARNED
               ? on_gpu(gpu.params, m, m->params.position_embedding, 0, 0)
               : gpu_floats(&gpu.model_memory, (size_t)m->config.max_len * m->config.d_model);
    }
    size_t bytes = m->num_parameters * sizeof(float);
    gpu_copy(gpu.params, m->params_memory, bytes, cudaMemcpyHostToDevice);
    gpu_copy(gpu.adam_m, m->adam_m, bytes, cudaMemcpyHostToDevice);
    gpu_copy(gpu.adam_v, m->adam_v, bytes, cudaMemcpyHostToDevice);
    if (m->config.positional == POSITIONAL_SINUSOID)
        gpu_copy(gpu.pe, m->positional_encoding, (size_t)m->config.max_len * m->config.d_model * sizeof(float),
                 cudaMemcpyHostToDevice);
}

// to_host: the parameters, gradients and moments back into the host model
static void gpu_to_host(Transformer *m) {
    size_t bytes = m->num_parameters * sizeof(float);
    gpu_copy(m->params_memory, gpu.params, bytes, cudaMemcpyDeviceToHost);
    gpu_copy(m->grads_memory, gpu.grads, bytes, cudaMemcpyDeviceToHost);
    gpu_copy(m->adam_m, gpu.adam_m, bytes, cudaMemcpyDeviceToHost);
    gpu_copy(m->adam_v, gpu.adam_v, bytes, cudaMemcpyDeviceToHost);
}

// transformer_train_step on the GPU: the forward pass, the backward pass (the
// gradients zeroed first), Adam at eq. 3's rate for step adam_step + 1
static real gpu_train_step(Transformer *m, const Batch *batch, int warmup_steps, double lr_factor) {
    real loss = gpu_forward(m, batch);
    gpu_backward(m, batch);
    gpu_update(m, transformer_learning_rate(m->adam_step + 1, m->config.d_model, warmup_steps, lr_factor));
    return loss;
}

static const TrainingCompute gpu_training = {
    "transformer_cuda", gpu_begin, gpu_train_step, gpu_to_host,
};

// For test_transformer.c, which includes this file in its CPU build and is
// linked with it built by nvcc for make test-cuda: the hook, the logits of the
// last forward pass (n of them), and the GPU's memory given back.
#ifdef __cplusplus
extern "C" {
#endif
const TrainingCompute *transformer_cuda_training(void) { return &gpu_training; }
void transformer_cuda_logits(float *out, size_t n) { gpu_copy(out, gpu.logits, n * sizeof(float), cudaMemcpyDeviceToHost); }
void transformer_cuda_release(void) { gpu_release(); }
#ifdef __cplusplus
}
#endif

#ifndef TRANSFORMER_CUDA_NO_MAIN
// ./transformer_cuda COMMAND [options] [--tf32]: transformer.c's command line,
// with the training steps on the GPU.
int main(int argc, char **argv) {
    int kept = 0;
    for (int i = 0; i < argc; i++) {
        if (i > 0 && strcmp(argv[i], "--tf32") == 0) gpu.tf32 = 1;
        else argv[kept++] = argv[i];
    }
    argv[kept] = NULL;
    transformer_training = &gpu_training;
    int status = transformer_lab_main(kept, argv);
    gpu_release();
    return status;
}
#endif
