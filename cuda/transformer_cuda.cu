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
 *     ./transformer_cuda bench ... --count        and what one step launches, copies and holds
 *     make test-cuda                              the proofs on a GPU, and PyTorch beside it (Makefile)
 *
 * Each kernel computes a Part I loop of transformer.c and names it. What makes
 * a step fast on a GPU, and the same in every run:
 *   - a step is about 500 launches and cuBLAS calls however many sentences the
 *     batch holds (cuda/NOTES.md counts them): the linear
 *     layers are one cuBLAS call each; attention's four products one strided
 *     batched call each over
 *     every sentence and head, which heads_from_rows_kernel lays out one after
 *     another; the keys and values of the memory for all decoder layers one call;
 *   - rows (layer norm, softmax, the loss over the vocabulary) are a warp or a
 *     block each: neighbouring threads read neighbouring numbers, and a row's
 *     sum is a fixed tree of warp shuffles;
 *   - sums over rows (the gradients of biases, gains, embedding rows) are a
 *     thread per column adding its rows in registers, then a fixed tree in
 *     shared memory; no atomics, so a run is the same bit for bit every time;
 *   - biases and dropout live in the kernels around the products: the bias of
 *     a projection that feeds a layer norm is added by the norm's kernel, and
 *     a dropout mask is recomputed from its key (dropout_mask's hash) wherever
 *     it is needed, never stored;
 *   - the activations are sized by the batch's tokens, in one allocation that
 *     grows only when a batch needs more than any before.
 * cuBLAS multiplies in fp32 (TF32 only with --tf32).
 *
 * The file is written in the C that CUDA C++ shares: with -DCUDA_ON_CPU the
 * host C compiler builds it against cuda_on_cpu.h, which runs every thread
 * of a block as a fiber of its own in random order (shared memory, barriers
 * and shuffles as on a GPU) and every cuBLAS call as a column-major loop;
 * cuda/test_cuda.c then compares it with transformer.c. A kernel is
 * followed by CPU_KERNEL(name, its parameter types), which only that build reads.
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
#if defined(CUDA_ON_CPU) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L   // cuda_on_cpu.h's memory maps, signals and fibers
#endif
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
#include "../transformer.h"
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

// What one training step asks of the GPU (./transformer_cuda bench --count).
typedef struct {
    long launches, gemms, memsets, copies, allocations;
    double bytes_set, bytes_copied;
} GpuCounts;
static GpuCounts gpu_counts;

// LAUNCH(kernel, grid, block, shared_bytes, arguments...) is
// kernel<<<grid, block, shared_bytes>>>(arguments...), then a check that it
// launched; grid and block are numbers (along x) or dim3. SHARED_FLOATS(name)
// declares the block's dynamic shared memory.
#ifdef CUDA_ON_CPU
#define LAUNCH_KERNEL(kernel, grid, block, shared_bytes, ...)                                         \
    cpu_launch(#kernel, kernel##_cpu_thread, &(kernel##_cpu_args){ __VA_ARGS__ }, CPU_DIM3(grid),   \
               CPU_DIM3(block), (shared_bytes))
#define SHARED_FLOATS(name) float *name = cpu_dynamic_shared()
#else
#define CPU_KERNEL(kernel, ...)
#define LAUNCH_KERNEL(kernel, grid, block, shared_bytes, ...) kernel<<<(grid), (block), (shared_bytes)>>>(__VA_ARGS__)
#define SHARED_FLOATS(name) extern __shared__ float name[]
#endif
#define LAUNCH(kernel, grid, block, shared_bytes, ...) do {                                  \
        LAUNCH_KERNEL(kernel, grid, block, shared_bytes, __VA_ARGS__);                       \
        gpu_counts.launches++;                                                                \
        cuda_check(cudaGetLastError(), "the launch of " #kernel, __LINE__);                   \
    } while (0)

#define WARP 32
#define FULL_WARP 0xffffffffu
#define THREADS 256                       // an elementwise kernel's block
#define ROWS_PER_BLOCK (THREADS / WARP)   // a row kernel's block: a warp per row
#define ROW_GROUPS 16                     // a column kernel's block: 32 columns by 16 groups of rows
// One thread per element of n
#define LAUNCH_ELEMENTS(n, kernel, ...) LAUNCH(kernel, blocks_for((size_t)(n), THREADS), THREADS, 0, __VA_ARGS__)
// One warp per row of `rows`
#define LAUNCH_ROWS(rows, kernel, ...) LAUNCH(kernel, blocks_for((size_t)(rows), ROWS_PER_BLOCK), THREADS, 0, __VA_ARGS__)
// One thread per column of `columns`, their rows in ROW_GROUPS groups
#define LAUNCH_COLUMNS(columns, kernel, ...)                                                             \
    LAUNCH(kernel, blocks_for((size_t)(columns), WARP), xyz(WARP, ROW_GROUPS, 1), WARP * ROW_GROUPS * sizeof(float), \
           __VA_ARGS__)
#define ELEMENT_INDEX ((size_t)blockIdx.x * blockDim.x + threadIdx.x)

static unsigned blocks_for(size_t n, size_t per_block) { return (unsigned)((n + per_block - 1) / per_block); }
static dim3 xyz(unsigned x, unsigned y, unsigned z) { dim3 d = { x, y, z }; return d; }

// ============================================================================
// Warp and block sums: fixed trees, so every run adds in the same order
// ============================================================================

// The sum (or the largest) of the 32 lanes' v, in every lane: a butterfly of
// shuffles. Each pair of lanes adds the same two numbers, so all lanes end
// with the same bits.
static __device__ float warp_sum(float v) {
    for (int offset = WARP / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(FULL_WARP, v, offset);
    return v;
}
static __device__ float warp_max(float v) {
    for (int offset = WARP / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(FULL_WARP, v, offset));
    return v;
}

// The sum (or the largest) over a one-dimensional block, in every thread;
// shared holds a float for each warp.
static __device__ float block_sum(float v, float *shared) {
    unsigned lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP;
    v = warp_sum(v);
    __syncthreads();   // a block_sum before this one may still be reading shared
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    return warp_sum(lane < warps ? shared[lane] : 0.0f);
}
static __device__ float block_max(float v, float *shared) {
    unsigned lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    return warp_max(lane < warps ? shared[lane] : -INFINITY);
}

// A column kernel's block is WARP columns by ROW_GROUPS groups of rows; each
// thread has summed its group's rows of its column. The sum of the groups, in
// the order 0, 1, ..., in the threads of group 0. shared: WARP * ROW_GROUPS floats.
static __device__ float sum_of_row_groups(float partial, float *shared) {
    shared[threadIdx.y * WARP + threadIdx.x] = partial;
    __syncthreads();
    float total = 0;
    if (threadIdx.y == 0)
        for (unsigned g = 0; g < blockDim.y; g++) total += shared[g * WARP + threadIdx.x];
    __syncthreads();   // shared is free for the next sum
    return total;
}

// ============================================================================
// Dropout (§5.4): dropout_mask's elements, recomputed wherever they are needed
// ============================================================================

// One mask: element i is kept (times scale) unless hash64(key + i) falls below
// the threshold. dropout_mask keeps i when unit_interval(hash64(key + i)) >= p,
// that is when (hash64(key + i) >> 11) >= p * 2^53, an integer comparison with
// threshold = ceil(p * 2^53). No dropout: threshold 0 and scale 1.
typedef struct { uint64_t key, threshold; float scale; } Dropout;

// transformer.c's hash64, the same bits on the GPU
static __device__ uint64_t dropout_hash64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
static __device__ float dropout_keep(Dropout d, size_t i) {
    return (dropout_hash64(d.key + i) >> 11) < d.threshold ? 0.0f : d.scale;
}

// ============================================================================
// The kernels, in Part I's order
// ============================================================================

// encoder_forward's and decoder_forward's first lines, both stacks in one launch:
// embedding_forward, then dropout_forward with its mask,
//     x0[b,t,i] = (E[token, i] * sqrt(C) + pe[t, i]) * mask
// (pe: the sinusoids, or the learned table of Table 3, row E). One thread per
// element; the source's B*S*C come first, then the target's B*T*C.
static __global__ void embedding_forward_kernel(float *enc_x0, float *dec_x0, const int *src, const int *tgt_in,
                                                const float *embedding, const float *pe, Dropout enc_drop,
                                                Dropout dec_drop, int B, int S, int T, int C) {
    size_t e = ELEMENT_INDEX, n_src = (size_t)B * S * C;
    if (e >= n_src + (size_t)B * T * C) return;
    int source = e < n_src, length = source ? S : T;
    size_t i = source ? e : e - n_src, bt = i / C;
    int t = (int)(bt % length), c = (int)(i % C), token = source ? src[bt] : tgt_in[bt];
    float embedded = embedding[(size_t)token * C + c] * sqrtf((float)C) + pe[(size_t)t * C + c];
    if (source) enc_x0[i] = embedded * dropout_keep(enc_drop, i);
    else dec_x0[i] = embedded * dropout_keep(dec_drop, i);
}
CPU_KERNEL(embedding_forward_kernel, float *, float *, const int *, const int *, const float *, const float *, Dropout,
           Dropout, int, int, int, int)

// add_norm_forward (residual_layernorm_forward and layernorm_row_forward, its
// mask drawn by dropout_keep), with the sub-layer's bias from linear_forward:
//     res = residual + (sublayer + sublayer_bias) * mask;   out = LayerNorm(res)
// A warp per row n, its lanes striding over the C features.
static __global__ void residual_layernorm_forward_kernel(float *out, float *mean, float *rstd, float *res,
                                                         const float *residual, const float *sublayer,
                                                         const float *sublayer_bias, Dropout drop, const float *gain,
                                                         const float *bias, int N, int C, float eps) {
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N) return;   // the whole warp
    size_t at = (size_t)row * C;
    float sum = 0;
    for (int i = lane; i < C; i += WARP) {
        float r = residual[at + i] + (sublayer[at + i] + sublayer_bias[i]) * dropout_keep(drop, at + i);
        res[at + i] = r;
        sum += r;
    }
    float m = warp_sum(sum) / C, squares = 0;
    for (int i = lane; i < C; i += WARP) squares += (res[at + i] - m) * (res[at + i] - m);
    float s = 1 / sqrtf(warp_sum(squares) / C + eps);
    for (int i = lane; i < C; i += WARP) out[at + i] = (res[at + i] - m) * s * gain[i] + bias[i];
    if (lane == 0) { mean[row] = m; rstd[row] = s; }
}
CPU_KERNEL(residual_layernorm_forward_kernel, float *, float *, float *, float *, const float *, const float *,
           const float *, Dropout, const float *, const float *, int, int, float)

// residual_layernorm_backward's rows, a warp per row n:
//   dres_i = rstd * (dxhat_i - mean_j(dxhat_j) - xhat_i * mean_j(dxhat_j xhat_j)),  dxhat = dout * gain
//   dresidual_i = dres_i,   dsublayer_i = dres_i * mask_i
// (written, not added: the products that add to dresidual come after)
static __global__ void residual_layernorm_backward_kernel(float *dresidual, float *dsublayer, const float *dout,
                                                          const float *res, Dropout drop, const float *gain,
                                                          const float *mean, const float *rstd, int N, int C) {
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N) return;
    size_t at = (size_t)row * C;
    float m = mean[row], s = rstd[row], sum_dxhat = 0, sum_dxhat_xhat = 0;
    for (int i = lane; i < C; i += WARP) {
        float dxhat = dout[at + i] * gain[i];
        sum_dxhat += dxhat;
        sum_dxhat_xhat += dxhat * (res[at + i] - m) * s;
    }
    float mean_dxhat = warp_sum(sum_dxhat) / C, mean_dxhat_xhat = warp_sum(sum_dxhat_xhat) / C;
    for (int i = lane; i < C; i += WARP) {
        float xhat = (res[at + i] - m) * s;
        float dres = s * (dout[at + i] * gain[i] - mean_dxhat - xhat * mean_dxhat_xhat);
        dresidual[at + i] = dres;
        dsublayer[at + i] = dres * dropout_keep(drop, at + i);
    }
}
CPU_KERNEL(residual_layernorm_backward_kernel, float *, float *, const float *, const float *, Dropout, const float *,
           const float *, const float *, int, int)

// residual_layernorm_backward's gain and bias, and linear_backward's bias of
// the sub-layer before the norm: sums over the N rows, a thread per column
//   dgain_i = sum_n dout_ni xhat_ni,  dbias_i = sum_n dout_ni,  dsublayer_bias_i = sum_n dsublayer_ni
static __global__ void layernorm_params_backward_kernel(float *dgain, float *dbias, float *dsublayer_bias,
                                                        const float *dout, const float *res, const float *mean,
                                                        const float *rstd, const float *dsublayer, int N, int C) {
    SHARED_FLOATS(shared);
    int i = blockIdx.x * WARP + threadIdx.x;
    float gain_sum = 0, bias_sum = 0, sublayer_sum = 0;
    if (i < C)
        for (int n = threadIdx.y; n < N; n += blockDim.y) {
            size_t at = (size_t)n * C + i;
            gain_sum += dout[at] * (res[at] - mean[n]) * rstd[n];
            bias_sum += dout[at];
            sublayer_sum += dsublayer[at];
        }
    gain_sum = sum_of_row_groups(gain_sum, shared);
    bias_sum = sum_of_row_groups(bias_sum, shared);
    sublayer_sum = sum_of_row_groups(sublayer_sum, shared);
    if (threadIdx.y == 0 && i < C) { dgain[i] = gain_sum; dbias[i] = bias_sum; dsublayer_bias[i] = sublayer_sum; }
}
CPU_KERNEL(layernorm_params_backward_kernel, float *, float *, float *, const float *, const float *, const float *,
           const float *, const float *, int, int)

// attention_forward reads head h of query (b, t) at column h*hs of the
// projection's row; cuBLAS's batched products need each (sentence, head) as
// one (T, hs) matrix, all of them one after another (head-major):
//     out[part][b][h][t][d] = in[(b*T + t)*ld + part*C + h*hs + d] + bias[part*C + h*hs + d]
// for `parts` of C columns each (q, k, v: 3; k, v: 2; q: 1). blockIdx.y is a
// layer (the memory's keys and values for every decoder layer at once): its
// columns start layer_columns further in each row, its bias layer_bias further,
// its output layer_out further. bias NULL: none (a gradient laid out the same way).
static __global__ void heads_from_rows_kernel(float *out, const float *in, const float *bias, int ld, int parts,
                                              int layer_columns, int layer_bias, size_t layer_out,
                                              int B, int T, int C, int NH) {
    size_t e = ELEMENT_INDEX;
    int hs = C / NH, layer = blockIdx.y;
    if (e >= (size_t)parts * B * T * C) return;
    int d = (int)(e % hs), t = (int)(e / hs % T), h = (int)(e / ((size_t)hs * T) % NH);
    int b = (int)(e / ((size_t)C * T) % B), part = (int)(e / ((size_t)B * T * C));
    int column = part * C + h * hs + d;
    float v = in[((size_t)b * T + t) * ld + (size_t)layer * layer_columns + column];
    out[(size_t)layer * layer_out + e] = bias ? v + bias[(size_t)layer * layer_bias + column] : v;
}
CPU_KERNEL(heads_from_rows_kernel, float *, const float *, const float *, int, int, int, int, size_t, int, int, int, int)

// attention_forward's output back in rows, Concat(head_1, ..., head_h):
//     out[(b*T + t)*C + h*hs + d] = heads[b][h][t][d]
static __global__ void rows_from_heads_kernel(float *out, const float *heads, int B, int T, int C, int NH) {
    size_t e = ELEMENT_INDEX;
    if (e >= (size_t)B * T * C) return;
    int hs = C / NH, c = (int)(e % C), h = c / hs, d = c % hs;
    size_t bt = e / C, b = bt / T, t = bt % T;
    out[e] = heads[((b * NH + h) * T + t) * hs + d];
}
CPU_KERNEL(rows_from_heads_kernel, float *, const float *, int, int, int, int)

// attention_backward's dq, dk, dv, back in the projection's rows (the inverse
// of heads_from_rows_kernel), and linear_backward's bias: their column sums
//     drows[(b*T + t)*ld + column] = dheads[part][b][h][t][d],  dbias[column] = sum over (b, t),
//     column = part*C + h*hs + d
// A thread per column (of parts*C), rows in ROW_GROUPS groups.
static __global__ void rows_from_heads_bias_backward_kernel(float *drows, float *dbias, const float *dheads, int ld,
                                                            int parts, int B, int T, int C, int NH) {
    SHARED_FLOATS(shared);
    int column = blockIdx.x * WARP + threadIdx.x, hs = C / NH, N = B * T;
    float sum = 0;
    if (column < parts * C) {
        int part = column / C, h = column % C / hs, d = column % hs;
        const float *from = dheads + (size_t)part * N * C;
        for (int n = threadIdx.y; n < N; n += blockDim.y) {
            int b = n / T, t = n % T;
            float g = from[(((size_t)b * NH + h) * T + t) * hs + d];
            drows[(size_t)n * ld + column] = g;
            sum += g;
        }
    }
    sum = sum_of_row_groups(sum, shared);
    if (threadIdx.y == 0 && column < parts * C) dbias[column] = sum;
}
CPU_KERNEL(rows_from_heads_bias_backward_kernel, float *, float *, const float *, int, int, int, int, int, int)

// attention_forward's softmax_visible, a warp per query row (b, h, i): the
// scores of the keys it may see (visible_keys: padding and causal masks)
// become their softmax, the masked keys get exactly 0.
static __global__ void softmax_forward_kernel(float *att, const int *key_len, int causal, int B, int NH, int Tq,
                                              int Tk) {
    size_t r = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (r >= (size_t)B * NH * Tq) return;
    int b = (int)(r / ((size_t)NH * Tq)), i = (int)(r % Tq);
    int visible = (causal && i + 1 < key_len[b]) ? i + 1 : key_len[b];
    float *p = att + r * Tk, largest = -INFINITY, sum = 0;
    for (int j = lane; j < visible; j += WARP) largest = fmaxf(largest, p[j]);
    largest = warp_max(largest);
    for (int j = lane; j < visible; j += WARP) {
        p[j] = expf(p[j] - largest);
        sum += p[j];
    }
    sum = warp_sum(sum);
    for (int j = lane; j < Tk; j += WARP) p[j] = j < visible ? p[j] / sum : 0.0f;
}
CPU_KERNEL(softmax_forward_kernel, float *, const int *, int, int, int, int, int)

// attention_backward's softmax_backward, a warp per query row: grad holds dp
// and becomes ds_j = p_j (dp_j - sum_k p_k dp_k)
static __global__ void softmax_backward_kernel(float *grad, const float *att, size_t rows, int Tk) {
    size_t r = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (r >= rows) return;
    float *g = grad + r * Tk, sum_p_dp = 0;
    const float *p = att + r * Tk;
    for (int j = lane; j < Tk; j += WARP) sum_p_dp += p[j] * g[j];
    sum_p_dp = warp_sum(sum_p_dp);
    for (int j = lane; j < Tk; j += WARP) g[j] = p[j] * (g[j] - sum_p_dp);
}
CPU_KERNEL(softmax_backward_kernel, float *, const float *, size_t, int)

// feed_forward_forward's relu_forward, with linear_forward's bias: h = max(0, h + bias)
static __global__ void bias_relu_forward_kernel(float *h, const float *bias, size_t N, int F) {
    size_t e = ELEMENT_INDEX;
    if (e >= N * F) return;
    float v = h[e] + bias[e % F];
    h[e] = v > 0 ? v : 0;
}
CPU_KERNEL(bias_relu_forward_kernel, float *, const float *, size_t, int)

// feed_forward_backward's relu_backward (dh = 0 where h <= 0) and
// linear_backward's bias of W_1: dbias_f = sum_n dh_nf. A thread per column f.
static __global__ void relu_bias_backward_kernel(float *dh, float *dbias, const float *h, int N, int F) {
    SHARED_FLOATS(shared);
    int f = blockIdx.x * WARP + threadIdx.x;
    float sum = 0;
    if (f < F)
        for (int n = threadIdx.y; n < N; n += blockDim.y) {
            size_t at = (size_t)n * F + f;
            float g = h[at] > 0 ? dh[at] : 0.0f;
            dh[at] = g;
            sum += g;
        }
    sum = sum_of_row_groups(sum, shared);
    if (threadIdx.y == 0 && f < F) dbias[f] = sum;
}
CPU_KERNEL(relu_bias_backward_kernel, float *, float *, const float *, int, int)

// cross_entropy_forward and cross_entropy_backward together, a block per
// target position bt over its V logits z (probabilities are never stored):
//   token_loss = -(1-eps) log p_y - (eps/V) sum_v log p_v,  log p_v = z_v - log sum_w exp(z_w)
//   dlogits_v = (p_v - q_v) / n,   q_v = (1-eps) [v == y] + eps/V
// padding positions get 0 for both. shared: a float per warp.
static __global__ void cross_entropy_kernel(float *token_loss, float *dlogits, const float *logits,
                                            const int *targets, const int *tgt_len, float eps, float inv_n,
                                            int T, int V) {
    SHARED_FLOATS(shared);
    size_t bt = blockIdx.x;
    const float *z = logits + bt * V;
    float *dz = dlogits + bt * V;
    if ((int)(bt % T) >= tgt_len[bt / T]) {   // the whole block
        for (int v = threadIdx.x; v < V; v += blockDim.x) dz[v] = 0;
        if (threadIdx.x == 0) token_loss[bt] = 0;
        return;
    }
    float largest = -INFINITY, sum = 0, sum_z = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) largest = fmaxf(largest, z[v]);
    largest = block_max(largest, shared);
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        sum += expf(z[v] - largest);
        sum_z += z[v];
    }
    sum = block_sum(sum, shared);
    sum_z = block_sum(sum_z, shared);
    int y = targets[bt];
    float inv_sum = 1 / sum, smooth = eps / V;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        dz[v] = (expf(z[v] - largest) * inv_sum - (smooth + (v == y ? 1 - eps : 0.0f))) * inv_n;
    if (threadIdx.x == 0) {
        float log_sum = largest + logf(sum), log_p_target = z[y] - log_sum, sum_log_p = sum_z - V * log_sum;
        token_loss[bt] = -(1 - eps) * log_p_target - smooth * sum_log_p;
    }
}
CPU_KERNEL(cross_entropy_kernel, float *, float *, const float *, const int *, const int *, float, float, int, int)

// cross_entropy_forward's mean over the n non-padding positions (padding's
// token_loss is 0), in double as the host: one block, each thread a strided
// share, then thread 0 adds the shares in order. shared: a double per thread.
static __global__ void mean_loss_kernel(float *loss, const float *token_loss, size_t count, float inv_n) {
    SHARED_FLOATS(shared);
    double *shares = (double *)shared, sum = 0;
    for (size_t i = threadIdx.x; i < count; i += blockDim.x) sum += token_loss[i];
    shares[threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.x != 0) return;
    double total = 0;
    for (unsigned t = 0; t < blockDim.x; t++) total += shares[t];
    *loss = (float)(total * inv_n);
}
CPU_KERNEL(mean_loss_kernel, float *, const float *, size_t, float)

// embedding_backward for both stacks, with dropout_backward's masks:
//     dE[token, i] += sum over the positions holding token of d_x0[position, i] * mask * sqrt(C)
// A block per distinct token of the batch, a thread per feature. The host
// lists each token's positions (rows: the target's 0..B*T-1 first, then the
// source's, B*T + b*S + s), so each sum runs in one thread in a fixed order:
// no two threads ever add to one element.
static __global__ void embedding_backward_kernel(float *dembedding, const float *d_dec_x0, const float *d_enc_x0,
                                                 const int *token_ids, const int *token_first, const int *rows,
                                                 Dropout dec_drop, Dropout enc_drop, int BT, int C) {
    int k = blockIdx.x, token = token_ids[k];
    float scale = sqrtf((float)C);
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < C; i += gridDim.y * blockDim.x) {
        float sum = 0;
        for (int r = token_first[k]; r < token_first[k + 1]; r++) {
            int row = rows[r];
            size_t at = row < BT ? (size_t)row * C + i : (size_t)(row - BT) * C + i;
            float g = row < BT ? d_dec_x0[at] * dropout_keep(dec_drop, at) : d_enc_x0[at] * dropout_keep(enc_drop, at);
            sum += g * scale;
        }
        dembedding[(size_t)token * C + i] += sum;
    }
}
CPU_KERNEL(embedding_backward_kernel, float *, const float *, const float *, const int *, const int *, const int *,
           Dropout, Dropout, int, int)

// position_embedding_backward (Table 3, row E) for both stacks, one thread per
// element (t, i) of the learned table, sentences in order:
//     dpe[t, i] = sum_b d_dec_x0[b,t,i] * mask + sum_b d_enc_x0[b,t,i] * mask
// (rows past both lengths get 0: the whole table is written)
static __global__ void position_embedding_backward_kernel(float *dpe, const float *d_dec_x0, const float *d_enc_x0,
                                                          Dropout dec_drop, Dropout enc_drop, int max_len, int B,
                                                          int S, int T, int C) {
    size_t e = ELEMENT_INDEX;
    if (e >= (size_t)max_len * C) return;
    int t = (int)(e / C), i = (int)(e % C);
    float sum = 0;
    if (t < T)
        for (int b = 0; b < B; b++) {
            size_t at = ((size_t)b * T + t) * C + i;
            sum += d_dec_x0[at] * dropout_keep(dec_drop, at);
        }
    if (t < S)
        for (int b = 0; b < B; b++) {
            size_t at = ((size_t)b * S + t) * C + i;
            sum += d_enc_x0[at] * dropout_keep(enc_drop, at);
        }
    dpe[e] = sum;
}
CPU_KERNEL(position_embedding_backward_kernel, float *, const float *, const float *, Dropout, Dropout, int, int, int,
           int, int)

// adam_update, one thread per parameter
static __global__ void adam_kernel(float *theta, float *first, float *second, const float *grad, size_t n,
                                   float beta1, float beta2, float step_size, float rsqrt_c2, float eps) {
    size_t i = ELEMENT_INDEX;
    if (i >= n) return;
    float g = grad[i];
    float mi = beta1 * first[i] + (1 - beta1) * g;
    float vi = beta2 * second[i] + (1 - beta2) * g * g;
    first[i] = mi;
    second[i] = vi;
    theta[i] -= step_size * mi / (sqrtf(vi) * rsqrt_c2 + eps);
}
CPU_KERNEL(adam_kernel, float *, float *, float *, const float *, size_t, float, float, float, float, float)

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

// What a layer's backward pass reads, named as transformer.h's ActivationTensors
// except: q, k, v are head-major (heads_from_rows_kernel) and the dropout masks
// are keys (Dropout); the sub-layers' outputs before their norms are not kept.
typedef struct {
    float *qkv, *att, *heads, *res1, *ln1, *ln1_mean, *ln1_rstd;
    float *ff_h, *res2, *ln2, *ln2_mean, *ln2_rstd;
    Dropout drop1, drop2;
} GpuEncoderActs;
typedef struct {
    float *self_qkv, *self_att, *self_heads, *res1, *ln1, *ln1_mean, *ln1_rstd;
    float *cross_q, *cross_att, *cross_heads, *res2, *ln2, *ln2_mean, *ln2_rstd;
    float *ff_h, *res3, *ln3, *ln3_mean, *ln3_rstd;
    Dropout drop1, drop2, drop3;
} GpuDecoderActs;

// Scratch, reused layer after layer; "rows" are B*S or B*T, whichever is more.
// The forward pass borrows some (the comment names its use).
typedef struct {
    float *d_dec;        // (B*T, C)  of a decoder layer's output, then input (in the end: of dec_x0)
    float *d_enc;        // (B*S, C)  the same in the encoder (first: of the memory)
    float *d_mid1;       // (rows, C) of a layer's first Add & Norm output (the second sub-layer's input)
    float *d_mid2;       // (B*T, C)  of a decoder layer's second Add & Norm output
    float *d_sublayer;   // (rows, C) of a sub-layer's output; forward: the output itself, before its norm
    float *d_heads;      // (rows, C) of Concat(heads) before W^O; forward: the cross-attention's queries
    float *d_heads_hm;   // (rows, C) the same head-major; forward: attention's output head-major
    float *d_qkv_hm;     // (3, rows, C) of q, k, v head-major; cross-attention: of q, then of k and v
    float *d_qkv;        // (rows, 3C) the same in rows; forward: the self-attention's projection
    float *d_ff_h;       // (rows, F)
    float *d_att;        // (B, NH, Tq, Tk) of the scores: dp, then ds
    float *d_memory_kv;  // (B*S, L*2C) of every decoder layer's keys and values; forward: the projection
    float *d_logits;     // (B*T, V)
} GpuScratch;

typedef struct {
    int ready, tf32, count;
    cublasHandle_t cublas;
    TransformerConfig config;
    size_t num_parameters;
    float *params, *grads, *adam_m, *adam_v;   // the host's layout
    float *pe;            // (max_len, C): the sinusoids, or learned positions' table inside params
    float *memory_kv_w;   // (L, 2C, C): each decoder layer's W^K, W^V, gathered for one product
    void *model_memory;   // the above, one allocation
    // the batch, its activations and the scratch, carved for (B, S, T) from one allocation
    int B, S, T;
    float *batch_memory;
    size_t batch_capacity;   // floats
    int *batch_ints;         // the batch's tokens and the embedding gradient's lists, one copy per step
    size_t ints_capacity;
    int *host_ints;          // its host side
    int *token_count;        // (V) gpu_upload_batch's counting sort
    int distinct_tokens;
    int *src, *src_len, *tgt_in, *tgt_out, *tgt_len, *token_ids, *token_first, *token_rows;   // in batch_ints
    float *enc_x0, *dec_x0, *logits, *token_loss, *loss;
    float *memory_kv;        // (L, 2, B, NH, S, hs): each decoder layer's keys and values of the memory
    Dropout enc_drop, dec_drop;
    GpuEncoderActs *enc;   // (L) on the host, pointing to the GPU
    GpuDecoderActs *dec;
    GpuScratch scratch;
    size_t activation_floats, scratch_floats;   // of batch_memory, for --count
    GpuCounts step_counts;   // the last training step's
} GpuModel;

static GpuModel gpu;

static void *gpu_alloc(size_t bytes) {
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    gpu_counts.allocations++;
    return p;
}

static void gpu_copy(void *to, const void *from, size_t bytes, cudaMemcpyKind kind) {
    CUDA_CHECK(cudaMemcpy(to, from, bytes, kind));
    gpu_counts.copies++;
    gpu_counts.bytes_copied += (double)bytes;
}

// C = alpha op(A) op(B) + beta C, column-major (cuda_on_cpu.h says it exactly)
static void gemm(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    CUBLAS_CHECK(cublasSgemm(gpu.cublas, transa, transb, m, n, k, &alpha, A, lda, B, ldb, &beta, C, ldc));
    gpu_counts.gemms++;
}

// The same for `count` products, the i-th at A + i*stride_a, B + i*stride_b, C + i*stride_c
static void gemm_batched(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k, float alpha,
                         const float *A, int lda, long long stride_a, const float *B, int ldb, long long stride_b,
                         float beta, float *C, int ldc, long long stride_c, int count) {
    CUBLAS_CHECK(cublasSgemmStridedBatched(gpu.cublas, transa, transb, m, n, k, &alpha, A, lda, stride_a,
                                           B, ldb, stride_b, &beta, C, ldc, stride_c, count));
    gpu_counts.gemms++;
}

// the two operations, short: OP_N uses a matrix as stored, OP_T its transpose
#define OP_N CUBLAS_OP_N
#define OP_T CUBLAS_OP_T

// ============================================================================
// Part I's functions on the GPU, each named after the one it mirrors
// ============================================================================

// linear_forward without its bias (the kernel after the product adds it):
// out (N,OC) = inp (N,IC) W^T, W (OC,IC). Column-major, out is out^T (OC x N) =
// W (OC x IC, stored as W^T: T) times inp^T (IC x N, N).
static void gpu_linear_forward(float *out, const float *inp, const float *weight, int N, int IC, int OC) {
    gemm(OP_T, OP_N, OC, N, IC, 1.0f, weight, IC, inp, IC, 0.0f, out, OC);
}

// linear_backward without its bias (a kernel sums it):
//   dinp (N,IC) = or += dout (N,OC) W (OC,IC):  dinp^T (IC x N) = W^T (IC x OC, N) dout^T (OC x N, N)
//   dW (OC,IC) = dout^T inp:                    dW^T (IC x OC) = inp^T (IC x N, N) dout (N x OC, T)
// add_to_dinp: 1 when dinp already holds the gradient of another path (the residual's)
static void gpu_linear_backward(float *dinp, int add_to_dinp, float *dweight, const float *dout, const float *inp,
                                const float *weight, int N, int IC, int OC) {
    gemm(OP_N, OP_N, IC, N, OC, 1.0f, weight, IC, dout, OC, add_to_dinp ? 1.0f : 0.0f, dinp, IC);
    gemm(OP_N, OP_T, IC, OC, N, 1.0f, inp, IC, dout, OC, 0.0f, dweight, IC);
}

// dropout_mask's key: drawn from the host model's generator when the model
// trains with dropout, as transformer.c draws it, so the masks are its masks
static Dropout gpu_dropout(Transformer *m) {
    Dropout d = { 0, 0, 1.0f };
    float p = m->config.dropout;
    if (!m->training || p <= 0.0f) return d;
    d.key = transformer_dropout_key(m);
    d.threshold = (uint64_t)ceil((double)p * 9007199254740992.0);
    d.scale = (float)(1.0 / (1.0 - p));
    return d;
}

// add_norm_forward: res = x + Dropout(sublayer + sublayer_bias);  out = LayerNorm(res)
static void gpu_add_norm_forward(float *out, float *mean, float *rstd, float *res, const float *x,
                                 const float *sublayer, const float *sublayer_bias, Dropout drop, const float *gain,
                                 const float *bias, const TransformerConfig *c, int N) {
    LAUNCH_ROWS(N, residual_layernorm_forward_kernel, out, mean, rstd, res, x, sublayer, sublayer_bias, drop, gain,
                bias, N, c->d_model, c->layer_norm_eps);
}

// residual_layernorm_backward, and the gradient of the bias of the sub-layer
// before the norm; dresidual and dsublayer are written
static void gpu_residual_layernorm_backward(float *dresidual, float *dsublayer, float *dgain, float *dbias,
                                            float *dsublayer_bias, const float *dout, const float *res, Dropout drop,
                                            const float *gain, const float *mean, const float *rstd, int N, int C) {
    LAUNCH_ROWS(N, residual_layernorm_backward_kernel, dresidual, dsublayer, dout, res, drop, gain, mean, rstd, N, C);
    LAUNCH_COLUMNS(C, layernorm_params_backward_kernel, dgain, dbias, dsublayer_bias, dout, res, mean, rstd,
                   dsublayer, N, C);
}

// A projection's rows (N, ld) to `parts` head-major tensors, with its bias (NULL: none)
static void gpu_heads_from_rows(float *out, const float *in, const float *bias, int ld, int parts, int B, int T,
                                int C, int NH) {
    LAUNCH(heads_from_rows_kernel, xyz(blocks_for((size_t)parts * B * T * C, THREADS), 1, 1), THREADS, 0, out, in,
           bias, ld, parts, 0, 0, (size_t)0, B, T, C, NH);
}

// attention_forward for every sentence and head at once. q is (B, NH, Tq, hs),
// k and v (B, NH, Tk, hs), head-major; att gets the probabilities (B, NH, Tq, Tk),
// out (B, Tq, C) the heads in rows; heads_hm is scratch (B, NH, Tq, hs).
static void gpu_attention_forward(float *out, float *att, float *heads_hm, const float *q, const float *k,
                                  const float *v, const int *key_len, int causal, int B, int Tq, int Tk, int C,
                                  int NH) {
    int hs = C / NH, count = B * NH;
    long long q_stride = (long long)Tq * hs, kv_stride = (long long)Tk * hs, att_stride = (long long)Tq * Tk;
    // s = Q K^T / sqrt(d_k), (Tq x Tk) each: s^T (Tk x Tq) = K (Tk x hs, stored K^T: T) Q^T (hs x Tq, N)
    gemm_batched(OP_T, OP_N, Tk, Tq, hs, 1 / sqrtf((float)hs), k, hs, kv_stride, q, hs, q_stride, 0.0f, att, Tk,
                 att_stride, count);
    LAUNCH_ROWS((size_t)count * Tq, softmax_forward_kernel, att, key_len, causal, B, NH, Tq, Tk);
    // out_i = sum_j p_ij v_j:  out^T (hs x Tq) = V^T (hs x Tk, N) P^T (Tk x Tq, N)
    gemm_batched(OP_N, OP_N, hs, Tq, Tk, 1.0f, v, hs, kv_stride, att, Tk, att_stride, 0.0f, heads_hm, hs, q_stride,
                 count);
    LAUNCH_ELEMENTS((size_t)B * Tq * C, rows_from_heads_kernel, out, heads_hm, B, Tq, C, NH);
}

// attention_backward for every sentence and head at once, head-major: dout_hm
// (B, NH, Tq, hs) in, dq (B, NH, Tq, hs), dk and dv (B, NH, Tk, hs) written;
// d_att (B, NH, Tq, Tk) holds dp, then ds.
static void gpu_attention_backward(float *dq, float *dk, float *dv, float *d_att, const float *dout_hm,
                                   const float *att, const float *q, const float *k, const float *v, int B, int Tq,
                                   int Tk, int C, int NH) {
    int hs = C / NH, count = B * NH;
    long long q_stride = (long long)Tq * hs, kv_stride = (long long)Tk * hs, att_stride = (long long)Tq * Tk;
    float scale = 1 / sqrtf((float)hs);
    // dp_ij = dout_i . v_j:  dp^T (Tk x Tq) = V (Tk x hs, stored V^T: T) dout^T (hs x Tq, N)
    gemm_batched(OP_T, OP_N, Tk, Tq, hs, 1.0f, v, hs, kv_stride, dout_hm, hs, q_stride, 0.0f, d_att, Tk, att_stride,
                 count);
    // dv_j = sum_i p_ij dout_i:  dv^T (hs x Tk) = dout^T (hs x Tq, N) P (Tq x Tk, stored P^T: T)
    gemm_batched(OP_N, OP_T, hs, Tk, Tq, 1.0f, dout_hm, hs, q_stride, att, Tk, att_stride, 0.0f, dv, hs, kv_stride,
                 count);
    LAUNCH_ROWS((size_t)count * Tq, softmax_backward_kernel, d_att, att, (size_t)count * Tq, Tk);
    // dq_i = sum_j ds_ij k_j / sqrt(d_k):  dq^T (hs x Tq) = K^T (hs x Tk, N) ds^T (Tk x Tq, N)
    gemm_batched(OP_N, OP_N, hs, Tq, Tk, scale, k, hs, kv_stride, d_att, Tk, att_stride, 0.0f, dq, hs, q_stride, count);
    // dk_j = sum_i ds_ij q_i / sqrt(d_k):  dk^T (hs x Tk) = Q^T (hs x Tq, N) ds (Tq x Tk, stored ds^T: T)
    gemm_batched(OP_N, OP_T, hs, Tk, Tq, scale, q, hs, q_stride, d_att, Tk, att_stride, 0.0f, dk, hs, kv_stride, count);
}

// dq, dk, dv (`parts` of them, head-major) back in rows (N, ld) at column
// `column0`, and their bias's gradient
static void gpu_rows_from_heads_backward(float *drows, int ld, int column0, float *dbias, const float *dheads,
                                         int parts, int B, int T, int C, int NH) {
    LAUNCH_COLUMNS((size_t)parts * C, rows_from_heads_bias_backward_kernel, drows + column0, dbias, dheads, ld, parts,
                   B, T, C, NH);
}

// self_attention_forward: qkv = x W_qkv^T + b;  heads = Attention(q, k, v);  out = heads W^O^T (+ b^O by the norm)
static void gpu_self_attention_forward(float *out, float *qkv_hm, float *att, float *heads, const float *x,
                                       GpuAttentionParams w, const int *len, int causal, int B, int T, int C, int NH) {
    GpuScratch *s = &gpu.scratch;
    size_t n = (size_t)B * T * C;
    gpu_linear_forward(s->d_qkv, x, w.qkv_w, B * T, C, 3 * C);
    gpu_heads_from_rows(qkv_hm, s->d_qkv, w.qkv_b, 3 * C, 3, B, T, C, NH);
    gpu_attention_forward(heads, att, s->d_heads_hm, qkv_hm, qkv_hm + n, qkv_hm + 2 * n, len, causal, B, T, T, C, NH);
    gpu_linear_forward(out, heads, w.out_w, B * T, C, C);
}

// self_attention_backward, given dout (of out, before the norm's bias): dx += ...
static void gpu_self_attention_backward(float *dx, GpuAttentionParams g, const float *dout, const float *qkv_hm,
                                        const float *att, const float *heads, const float *x, GpuAttentionParams w,
                                        int B, int T, int C, int NH) {
    GpuScratch *s = &gpu.scratch;
    size_t n = (size_t)B * T * C;
    gpu_linear_backward(s->d_heads, 0, g.out_w, dout, heads, w.out_w, B * T, C, C);
    gpu_heads_from_rows(s->d_heads_hm, s->d_heads, NULL, C, 1, B, T, C, NH);
    gpu_attention_backward(s->d_qkv_hm, s->d_qkv_hm + n, s->d_qkv_hm + 2 * n, s->d_att, s->d_heads_hm, att, qkv_hm,
                           qkv_hm + n, qkv_hm + 2 * n, B, T, T, C, NH);
    gpu_rows_from_heads_backward(s->d_qkv, 3 * C, 0, g.qkv_b, s->d_qkv_hm, 3, B, T, C, NH);
    gpu_linear_backward(dx, 1, g.qkv_w, s->d_qkv, x, w.qkv_w, B * T, C, 3 * C);
}

// cross_attention_forward: q from the decoder (its keys and values, from the
// memory, were computed for every layer at once: kv_hm is this layer's)
static void gpu_cross_attention_forward(float *out, float *q_hm, float *att, float *heads, const float *x,
                                        const float *kv_hm, GpuAttentionParams w, const int *src_len, int B, int T,
                                        int S, int C, int NH) {
    GpuScratch *s = &gpu.scratch;
    gpu_linear_forward(s->d_heads, x, w.qkv_w, B * T, C, C);
    gpu_heads_from_rows(q_hm, s->d_heads, w.qkv_b, C, 1, B, T, C, NH);
    gpu_attention_forward(heads, att, s->d_heads_hm, q_hm, kv_hm, kv_hm + (size_t)B * S * C, src_len, 0, B, T, S, C,
                          NH);
    gpu_linear_forward(out, heads, w.out_w, B * T, C, C);
}

// cross_attention_backward: dx += ...; the keys' and values' gradient goes to
// this layer's columns of d_memory_kv, their bias's gradient to g (the product
// with the memory waits for every layer: gpu_memory_backward)
static void gpu_cross_attention_backward(float *dx, GpuAttentionParams g, int layer, const float *dout,
                                         const float *q_hm, const float *kv_hm, const float *att, const float *heads,
                                         const float *x, GpuAttentionParams w, int B, int T, int S, int C, int NH,
                                         int L) {
    GpuScratch *s = &gpu.scratch;
    size_t n_q = (size_t)B * T * C, n_kv = (size_t)B * S * C;
    float *dq_hm = s->d_qkv_hm, *dk_hm = dq_hm + n_q, *dv_hm = dk_hm + n_kv;
    gpu_linear_backward(s->d_heads, 0, g.out_w, dout, heads, w.out_w, B * T, C, C);
    gpu_heads_from_rows(s->d_heads_hm, s->d_heads, NULL, C, 1, B, T, C, NH);
    gpu_attention_backward(dq_hm, dk_hm, dv_hm, s->d_att, s->d_heads_hm, att, q_hm, kv_hm, kv_hm + n_kv, B, T, S, C,
                           NH);
    gpu_rows_from_heads_backward(s->d_heads, C, 0, g.qkv_b, dq_hm, 1, B, T, C, NH);
    gpu_rows_from_heads_backward(s->d_memory_kv, 2 * C * L, 2 * C * layer, g.qkv_b + C, dk_hm, 2, B, S, C, NH);
    gpu_linear_backward(dx, 1, g.qkv_w, s->d_heads, x, w.qkv_w, B * T, C, C);
}

// feed_forward_forward: h = max(0, x W_1^T + b_1);  out = h W_2^T (+ b_2 by the norm)
static void gpu_feed_forward_forward(float *out, float *h, const float *x, GpuLayerParams w, int N, int C, int F) {
    gpu_linear_forward(h, x, w.ff1_w, N, C, F);
    LAUNCH_ELEMENTS((size_t)N * F, bias_relu_forward_kernel, h, w.ff1_b, (size_t)N, F);
    gpu_linear_forward(out, h, w.ff2_w, N, F, C);
}

// feed_forward_backward: dx += ...
static void gpu_feed_forward_backward(float *dx, GpuLayerParams g, const float *dout, const float *h, const float *x,
                                      GpuLayerParams w, int N, int C, int F) {
    float *d_h = gpu.scratch.d_ff_h;
    gpu_linear_backward(d_h, 0, g.ff2_w, dout, h, w.ff2_w, N, F, C);
    LAUNCH_COLUMNS(F, relu_bias_backward_kernel, d_h, g.ff1_b, h, N, F);
    gpu_linear_backward(dx, 1, g.ff1_w, d_h, x, w.ff1_w, N, C, F);
}

// ---- the layers' parameters ----------------------------------------------------

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

// ---- the batch's memory -----------------------------------------------------------

// Tensors cut one after another from an allocation (base NULL: only counts),
// each starting on a 256-byte boundary as cudaMalloc's do.
typedef struct { float *base; size_t used; } Carver;
static float *carve(Carver *c, size_t floats) {
    size_t start = c->used;
    c->used += (floats + 63) / 64 * 64;
    return c->base ? c->base + start : NULL;
}

// The activations of a (B, S, T) batch, then the scratch; returns the floats used.
static size_t gpu_carve_batch(Carver *a, const TransformerConfig *c, int B, int S, int T) {
    size_t L = c->n_layers, C = c->d_model, F = c->d_ff, NH = c->n_heads, V = c->vocab_size;
    size_t BS = (size_t)B * S, BT = (size_t)B * T, rows = BS > BT ? BS : BT, longest = S > T ? S : T;
    gpu.enc_x0 = carve(a, BS * C); gpu.dec_x0 = carve(a, BT * C);
    for (size_t l = 0; l < L; l++) {
        GpuEncoderActs *e = &gpu.enc[l];
        e->qkv = carve(a, 3 * BS * C); e->att = carve(a, B * NH * S * S); e->heads = carve(a, BS * C);
        e->res1 = carve(a, BS * C); e->ln1 = carve(a, BS * C); e->ln1_mean = carve(a, BS); e->ln1_rstd = carve(a, BS);
        e->ff_h = carve(a, BS * F);
        e->res2 = carve(a, BS * C); e->ln2 = carve(a, BS * C); e->ln2_mean = carve(a, BS); e->ln2_rstd = carve(a, BS);
        GpuDecoderActs *d = &gpu.dec[l];
        d->self_qkv = carve(a, 3 * BT * C); d->self_att = carve(a, B * NH * T * T); d->self_heads = carve(a, BT * C);
        d->res1 = carve(a, BT * C); d->ln1 = carve(a, BT * C); d->ln1_mean = carve(a, BT); d->ln1_rstd = carve(a, BT);
        d->cross_q = carve(a, BT * C); d->cross_att = carve(a, B * NH * T * S); d->cross_heads = carve(a, BT * C);
        d->res2 = carve(a, BT * C); d->ln2 = carve(a, BT * C); d->ln2_mean = carve(a, BT); d->ln2_rstd = carve(a, BT);
        d->ff_h = carve(a, BT * F);
        d->res3 = carve(a, BT * C); d->ln3 = carve(a, BT * C); d->ln3_mean = carve(a, BT); d->ln3_rstd = carve(a, BT);
    }
    gpu.memory_kv = carve(a, L * 2 * BS * C);
    gpu.logits = carve(a, BT * V); gpu.token_loss = carve(a, BT); gpu.loss = carve(a, 1);
    gpu.activation_floats = a->used;
    GpuScratch *s = &gpu.scratch;
    s->d_dec = carve(a, BT * C); s->d_enc = carve(a, BS * C); s->d_mid1 = carve(a, rows * C);
    s->d_mid2 = carve(a, BT * C); s->d_sublayer = carve(a, rows * C); s->d_heads = carve(a, rows * C);
    s->d_heads_hm = carve(a, rows * C); s->d_qkv_hm = carve(a, 3 * rows * C); s->d_qkv = carve(a, 3 * rows * C);
    s->d_ff_h = carve(a, rows * F); s->d_att = carve(a, B * NH * longest * longest);
    s->d_memory_kv = carve(a, BS * L * 2 * C); s->d_logits = carve(a, BT * V);
    gpu.scratch_floats = a->used - gpu.activation_floats;
    return a->used;
}

// The batch's memory on the GPU: the activations and scratch for this (B, S,
// T), cut from one allocation that is replaced only when a batch needs more
// than it holds (then a quarter more, for the batches to come), and the int
// arrays of gpu_upload_batch.
static void gpu_ensure_batch(const TransformerConfig *c, int B, int S, int T) {
    Carver count = { NULL, 0 };
    size_t need = gpu_carve_batch(&count, c, B, S, T);
    if (need > gpu.batch_capacity) {
        CUDA_CHECK(cudaFree(gpu.batch_memory));
        gpu.batch_capacity = gpu.batch_memory ? need + need / 4 : need;
        gpu.batch_memory = (float *)gpu_alloc(gpu.batch_capacity * sizeof(float));
    }
    Carver cut = { gpu.batch_memory, 0 };
    gpu_carve_batch(&cut, c, B, S, T);
    // the tokens and lengths, then the lists: token ids, where each token's rows start (and the end), the rows
    size_t tokens = (size_t)B * (S + T), ints = tokens + (size_t)B * T + 2 * (size_t)B + 3 * tokens + 1;
    if (ints > gpu.ints_capacity) {
        CUDA_CHECK(cudaFree(gpu.batch_ints));
        free(gpu.host_ints);
        gpu.ints_capacity = gpu.batch_ints ? ints + ints / 4 : ints;
        gpu.batch_ints = (int *)gpu_alloc(gpu.ints_capacity * sizeof(int));
        gpu.host_ints = (int *)malloc(gpu.ints_capacity * sizeof(int));
        if (!gpu.host_ints) { fprintf(stderr, "error: out of memory (the batch's host copy)\n"); exit(1); }
    }
    gpu.B = B; gpu.S = S; gpu.T = T;
}

// The batch to the GPU in one copy: its tokens and lengths, and for
// embedding_backward_kernel each distinct token's positions (rows: the
// target's first, then the source's, in order), by counting sort.
static void gpu_upload_batch(const Batch *batch) {
    int B = batch->B, S = batch->S, T = batch->T, BT = B * T, rows = B * (S + T);
    int *h = gpu.host_ints, *count = gpu.token_count, distinct = 0;
    size_t at = 0;
    int *fields[5] = { batch->src, batch->tgt_in, batch->tgt_out, batch->src_len, batch->tgt_len };
    size_t sizes[5] = { (size_t)B * S, (size_t)BT, (size_t)BT, (size_t)B, (size_t)B };
    int **device[5] = { &gpu.src, &gpu.tgt_in, &gpu.tgt_out, &gpu.src_len, &gpu.tgt_len };
    for (int f = 0; f < 5; f++) {
        memcpy(h + at, fields[f], sizes[f] * sizeof(int));
        *device[f] = gpu.batch_ints + at;
        at += sizes[f];
    }
    int *ids = h + at, *first = ids + rows, *list = first + rows + 1;
    gpu.token_ids = gpu.batch_ints + at; gpu.token_first = gpu.token_ids + rows; gpu.token_rows = gpu.token_first + rows + 1;
    for (int r = 0; r < rows; r++) {
        int token = r < BT ? batch->tgt_in[r] : batch->src[r - BT];
        if (count[token]++ == 0) ids[distinct++] = token;
    }
    first[0] = 0;
    for (int k = 0; k < distinct; k++) { first[k + 1] = first[k] + count[ids[k]]; count[ids[k]] = first[k]; }
    for (int r = 0; r < rows; r++) {   // count[token] is now where its next row goes
        int token = r < BT ? batch->tgt_in[r] : batch->src[r - BT];
        list[count[token]++] = r;
    }
    for (int k = 0; k < distinct; k++) count[ids[k]] = 0;
    gpu.distinct_tokens = distinct;
    gpu_copy(gpu.batch_ints, h, (size_t)(list + rows - h) * sizeof(int), cudaMemcpyHostToDevice);
}

// ============================================================================
// The layers, the whole forward pass, the whole backward pass, Adam
// ============================================================================

// encoder_layer_forward
static void gpu_encoder_layer_forward(GpuEncoderActs *la, const float *x, GpuLayerParams w, Transformer *m, int B,
                                      int S) {
    const TransformerConfig *c = &m->config;
    int C = c->d_model, N = B * S;
    float *sublayer = gpu.scratch.d_sublayer;
    gpu_self_attention_forward(sublayer, la->qkv, la->att, la->heads, x, w.self_attn, gpu.src_len, 0, B, S, C,
                               c->n_heads);
    gpu_add_norm_forward(la->ln1, la->ln1_mean, la->ln1_rstd, la->res1, x, sublayer, w.self_attn.out_b, la->drop1,
                         w.ln1_g, w.ln1_b, c, N);
    gpu_feed_forward_forward(sublayer, la->ff_h, la->ln1, w, N, C, c->d_ff);
    gpu_add_norm_forward(la->ln2, la->ln2_mean, la->ln2_rstd, la->res2, la->ln1, sublayer, w.ff2_b, la->drop2,
                         w.ln2_g, w.ln2_b, c, N);
}

// encoder_layer_backward: dx (written) given dout
static void gpu_encoder_layer_backward(float *dx, GpuLayerParams g, const float *dout, const GpuEncoderActs *la,
                                       const float *x, GpuLayerParams w, const TransformerConfig *c, int B, int S) {
    GpuScratch *s = &gpu.scratch;
    int C = c->d_model, N = B * S;
    gpu_residual_layernorm_backward(s->d_mid1, s->d_sublayer, g.ln2_g, g.ln2_b, g.ff2_b, dout, la->res2, la->drop2,
                                    w.ln2_g, la->ln2_mean, la->ln2_rstd, N, C);
    gpu_feed_forward_backward(s->d_mid1, g, s->d_sublayer, la->ff_h, la->ln1, w, N, C, c->d_ff);
    gpu_residual_layernorm_backward(dx, s->d_sublayer, g.ln1_g, g.ln1_b, g.self_attn.out_b, s->d_mid1, la->res1,
                                    la->drop1, w.ln1_g, la->ln1_mean, la->ln1_rstd, N, C);
    gpu_self_attention_backward(dx, g.self_attn, s->d_sublayer, la->qkv, la->att, la->heads, x, w.self_attn, B, S, C,
                                c->n_heads);
}

// decoder_layer_forward (the keys and values of the memory: gpu_memory_forward)
static void gpu_decoder_layer_forward(GpuDecoderActs *la, const float *y, const float *kv_hm, GpuLayerParams w,
                                      Transformer *m, int B, int S, int T) {
    const TransformerConfig *c = &m->config;
    int C = c->d_model, N = B * T, NH = c->n_heads;
    float *sublayer = gpu.scratch.d_sublayer;
    gpu_self_attention_forward(sublayer, la->self_qkv, la->self_att, la->self_heads, y, w.self_attn, gpu.tgt_len, 1,
                               B, T, C, NH);
    gpu_add_norm_forward(la->ln1, la->ln1_mean, la->ln1_rstd, la->res1, y, sublayer, w.self_attn.out_b, la->drop1,
                         w.ln1_g, w.ln1_b, c, N);
    gpu_cross_attention_forward(sublayer, la->cross_q, la->cross_att, la->cross_heads, la->ln1, kv_hm, w.cross_attn,
                                gpu.src_len, B, T, S, C, NH);
    gpu_add_norm_forward(la->ln2, la->ln2_mean, la->ln2_rstd, la->res2, la->ln1, sublayer, w.cross_attn.out_b,
                         la->drop2, w.ln2_g, w.ln2_b, c, N);
    gpu_feed_forward_forward(sublayer, la->ff_h, la->ln2, w, N, C, c->d_ff);
    gpu_add_norm_forward(la->ln3, la->ln3_mean, la->ln3_rstd, la->res3, la->ln2, sublayer, w.ff2_b, la->drop3,
                         w.ln3_g, w.ln3_b, c, N);
}

// decoder_layer_backward: dy (written) given dout, which it may be
static void gpu_decoder_layer_backward(float *dy, GpuLayerParams g, int layer, const float *dout,
                                       const GpuDecoderActs *la, const float *y, const float *kv_hm, GpuLayerParams w,
                                       const TransformerConfig *c, int B, int S, int T) {
    GpuScratch *s = &gpu.scratch;
    int C = c->d_model, N = B * T, NH = c->n_heads;
    gpu_residual_layernorm_backward(s->d_mid2, s->d_sublayer, g.ln3_g, g.ln3_b, g.ff2_b, dout, la->res3, la->drop3,
                                    w.ln3_g, la->ln3_mean, la->ln3_rstd, N, C);
    gpu_feed_forward_backward(s->d_mid2, g, s->d_sublayer, la->ff_h, la->ln2, w, N, C, c->d_ff);
    gpu_residual_layernorm_backward(s->d_mid1, s->d_sublayer, g.ln2_g, g.ln2_b, g.cross_attn.out_b, s->d_mid2,
                                    la->res2, la->drop2, w.ln2_g, la->ln2_mean, la->ln2_rstd, N, C);
    gpu_cross_attention_backward(s->d_mid1, g.cross_attn, layer, s->d_sublayer, la->cross_q, kv_hm, la->cross_att,
                                 la->cross_heads, la->ln1, w.cross_attn, B, T, S, C, NH, c->n_layers);
    gpu_residual_layernorm_backward(dy, s->d_sublayer, g.ln1_g, g.ln1_b, g.self_attn.out_b, s->d_mid1, la->res1,
                                    la->drop1, w.ln1_g, la->ln1_mean, la->ln1_rstd, N, C);
    gpu_self_attention_backward(dy, g.self_attn, s->d_sublayer, la->self_qkv, la->self_att, la->self_heads, y,
                                w.self_attn, B, T, C, NH);
}

// cross_attention_forward's keys and values for every decoder layer at once
// (they all read the same memory): W^K, W^V of each layer gathered into
// memory_kv_w (L*2C, C), one product (B*S, L*2C), then head-major with the biases.
static void gpu_memory_forward(const float *memory, Transformer *m, int B, int S) {
    const TransformerConfig *c = &m->config;
    int C = c->d_model, L = c->n_layers, NS = B * S;
    float *cross_w = on_gpu(gpu.params, m, m->params.dec_cross_qkv_w, 0, 0);
    float *cross_b = on_gpu(gpu.params, m, m->params.dec_cross_qkv_b, 0, 0);
    size_t layer_weights = (size_t)3 * C * C, kv_weights = (size_t)2 * C * C;
    CUDA_CHECK(cudaMemcpy2D(gpu.memory_kv_w, kv_weights * sizeof(float), cross_w + (size_t)C * C,
                            layer_weights * sizeof(float), kv_weights * sizeof(float), L, cudaMemcpyDeviceToDevice));
    gpu_counts.copies++;
    gpu_counts.bytes_copied += (double)L * kv_weights * sizeof(float);
    float *projected = gpu.scratch.d_memory_kv;
    gpu_linear_forward(projected, memory, gpu.memory_kv_w, NS, C, L * 2 * C);
    LAUNCH(heads_from_rows_kernel, xyz(blocks_for((size_t)2 * NS * C, THREADS), L, 1), THREADS, 0, gpu.memory_kv,
           projected, cross_b + C, L * 2 * C, 2, 2 * C, 3 * C, (size_t)2 * NS * C, B, S, C, c->n_heads);
}

// The memory's gradient from every decoder layer's keys and values, one
// product: d_memory (B*S, C) = d_memory_kv (B*S, L*2C) memory_kv_w (L*2C, C);
// and their weights' gradients, one batched product over the layers:
// dW_kv_l (2C, C) = d_kv_l^T memory, d_kv_l being columns l*2C.. of d_memory_kv.
static void gpu_memory_backward(float *d_memory, const float *memory, Transformer *m, int B, int S) {
    const TransformerConfig *c = &m->config;
    int C = c->d_model, L = c->n_layers, NS = B * S;
    const float *d_kv = gpu.scratch.d_memory_kv;
    gemm(OP_N, OP_N, C, NS, L * 2 * C, 1.0f, gpu.memory_kv_w, C, d_kv, L * 2 * C, 0.0f, d_memory, C);
    // dW_l^T (C x 2C) = memory^T (C x NS, N) d_kv_l (NS x 2C, stored d_kv_l^T: T), layer l at 3C*C + C*C
    float *d_weights = on_gpu(gpu.grads, m, m->params.dec_cross_qkv_w, 0, 0) + (size_t)C * C;
    gemm_batched(OP_N, OP_T, C, 2 * C, NS, 1.0f, memory, C, 0, d_kv, L * 2 * C, 2LL * C, 0.0f, d_weights, C,
                 3LL * C * C, L);
}

// Every dropout key of a forward pass, in the order transformer.c draws them:
// the source's embeddings, each encoder layer's two sub-layers, the target's
// embeddings, each decoder layer's three (the embeddings of both stacks are
// then one launch).
static void gpu_draw_dropout_keys(Transformer *m) {
    int L = m->config.n_layers;
    gpu.enc_drop = gpu_dropout(m);
    for (int l = 0; l < L; l++) { gpu.enc[l].drop1 = gpu_dropout(m); gpu.enc[l].drop2 = gpu_dropout(m); }
    gpu.dec_drop = gpu_dropout(m);
    for (int l = 0; l < L; l++) {
        gpu.dec[l].drop1 = gpu_dropout(m); gpu.dec[l].drop2 = gpu_dropout(m); gpu.dec[l].drop3 = gpu_dropout(m);
    }
}

// transformer_forward: the batch to the GPU, the encoder, the decoder, the loss;
// returns the loss, copied back (the one number that crosses each step)
static real gpu_forward(Transformer *m, const Batch *batch) {
    const char *error = batch_check(batch, &m->config);
    if (error) { fprintf(stderr, "error: transformer_cuda forward: %s\n", error); exit(1); }
    const TransformerConfig *c = &m->config;
    int B = batch->B, S = batch->S, T = batch->T, C = c->d_model, V = c->vocab_size, L = c->n_layers;
    gpu_ensure_batch(c, B, S, T);
    gpu_upload_batch(batch);
    m->B = B; m->S = S; m->T = T;
    m->num_target_tokens = 0;
    for (int b = 0; b < B; b++) m->num_target_tokens += batch->tgt_len[b];
    gpu_draw_dropout_keys(m);
    float *embedding = on_gpu(gpu.params, m, m->params.embedding, 0, 0);
    LAUNCH_ELEMENTS((size_t)B * (S + T) * C, embedding_forward_kernel, gpu.enc_x0, gpu.dec_x0, gpu.src, gpu.tgt_in,
                    embedding, gpu.pe, gpu.enc_drop, gpu.dec_drop, B, S, T, C);
    const float *x = gpu.enc_x0;
    for (int l = 0; l < L; l++) {
        gpu_encoder_layer_forward(&gpu.enc[l], x, gpu_encoder_params(gpu.params, m, l), m, B, S);
        x = gpu.enc[l].ln2;
    }
    gpu_memory_forward(x, m, B, S);
    const float *y = gpu.dec_x0;
    size_t layer_kv = (size_t)2 * B * S * C;
    for (int l = 0; l < L; l++) {
        gpu_decoder_layer_forward(&gpu.dec[l], y, gpu.memory_kv + l * layer_kv, gpu_decoder_params(gpu.params, m, l),
                                  m, B, S, T);
        y = gpu.dec[l].ln3;
    }
    // §3.4: logits = y E^T; then cross_entropy_forward, and its backward's dlogits already
    gpu_linear_forward(gpu.logits, y, embedding, B * T, C, V);
    float inv_n = m->num_target_tokens ? (float)(1.0 / m->num_target_tokens) : 0.0f;
    // a thread per 4 logits, up to 1024; at least two warps, so that block_sum's barrier always matters
    unsigned threads = V >= 4 * 1024 ? 1024 : blocks_for((size_t)V, 4 * WARP) * WARP;
    if (threads < 2 * WARP) threads = 2 * WARP;
    LAUNCH(cross_entropy_kernel, (unsigned)(B * T), threads, threads / WARP * sizeof(float), gpu.token_loss,
           gpu.scratch.d_logits, gpu.logits, gpu.tgt_out, gpu.tgt_len, c->label_smoothing, inv_n, T, V);
    LAUNCH(mean_loss_kernel, 1, THREADS, THREADS * sizeof(double), gpu.loss, gpu.token_loss, (size_t)B * T,
           (float)inv_n);
    float loss = 0;
    gpu_copy(&loss, gpu.loss, sizeof loss, cudaMemcpyDeviceToHost);
    m->loss = loss;
    return loss;
}

// transformer_zero_grad and transformer_backward, for the batch of the last
// gpu_forward. Every gradient is written once (products with beta 0, kernels
// with =), the embedding's then added to, so nothing needs zeroing.
static void gpu_backward(Transformer *m, const Batch *batch) {
    const TransformerConfig *c = &m->config;
    GpuScratch *s = &gpu.scratch;
    int B = batch->B, S = batch->S, T = batch->T, C = c->d_model, V = c->vocab_size, L = c->n_layers;
    if (m->num_target_tokens == 0) {   // transformer_backward leaves the zeroed gradients
        CUDA_CHECK(cudaMemset(gpu.grads, 0, gpu.num_parameters * sizeof(float)));
        gpu_counts.memsets++;
        gpu_counts.bytes_set += (double)gpu.num_parameters * sizeof(float);
        return;
    }
    float *embedding = on_gpu(gpu.params, m, m->params.embedding, 0, 0);
    float *d_embedding = on_gpu(gpu.grads, m, m->params.embedding, 0, 0);
    // logits = decoder_output E^T (d_logits: cross_entropy_kernel's)
    gpu_linear_backward(s->d_dec, 0, d_embedding, s->d_logits, gpu.dec[L - 1].ln3, embedding, B * T, C, V);
    const float *memory = gpu.enc[L - 1].ln2;
    size_t layer_kv = (size_t)2 * B * S * C;
    for (int l = L - 1; l >= 0; l--) {
        const float *y = l == 0 ? gpu.dec_x0 : gpu.dec[l - 1].ln3;
        gpu_decoder_layer_backward(s->d_dec, gpu_decoder_params(gpu.grads, m, l), l, s->d_dec, &gpu.dec[l], y,
                                   gpu.memory_kv + l * layer_kv, gpu_decoder_params(gpu.params, m, l), c, B, S, T);
    }
    gpu_memory_backward(s->d_enc, memory, m, B, S);
    for (int l = L - 1; l >= 0; l--) {
        const float *x = l == 0 ? gpu.enc_x0 : gpu.enc[l - 1].ln2;
        gpu_encoder_layer_backward(s->d_enc, gpu_encoder_params(gpu.grads, m, l), s->d_enc, &gpu.enc[l], x,
                                   gpu_encoder_params(gpu.params, m, l), c, B, S);
    }
    // dec_x0 = Dropout(E[tgt_in] sqrt(C) + PE), enc_x0 likewise: s->d_dec and s->d_enc hold their gradients
    LAUNCH(embedding_backward_kernel, xyz((unsigned)gpu.distinct_tokens, blocks_for((size_t)C, 4 * WARP), 1), 4 * WARP,
           0, d_embedding, s->d_dec, s->d_enc, gpu.token_ids, gpu.token_first, gpu.token_rows, gpu.dec_drop,
           gpu.enc_drop, B * T, C);
    if (c->positional == POSITIONAL_LEARNED)
        LAUNCH_ELEMENTS((size_t)c->max_len * C, position_embedding_backward_kernel,
                        on_gpu(gpu.grads, m, m->params.position_embedding, 0, 0), s->d_dec, s->d_enc, gpu.dec_drop,
                        gpu.enc_drop, c->max_len, B, S, T, C);
}

// adam_update: the bias corrections on the host, in double, as transformer.c; then
// the GPU waits for the step to finish, so that a step's time is the step's and
// an error of any kernel is reported at the step where it happened
static void gpu_update(Transformer *m, double learning_rate) {
    m->adam_step++;
    double b1 = m->adam.beta1, b2 = m->adam.beta2;
    double correction1 = 1.0 - pow(b1, (double)m->adam_step), correction2 = 1.0 - pow(b2, (double)m->adam_step);
    LAUNCH_ELEMENTS(gpu.num_parameters, adam_kernel, gpu.params, gpu.adam_m, gpu.adam_v, gpu.grads, gpu.num_parameters,
                    (float)b1, (float)b2, (float)(learning_rate / correction1), (float)(1.0 / sqrt(correction2)),
                    (float)m->adam.eps);
    CUDA_CHECK(cudaDeviceSynchronize());
}

// ============================================================================
// The hook transformer.c calls (transformer.h, TrainingCompute)
// ============================================================================

static void gpu_release(void) {
    if (gpu.ready) {
        CUDA_CHECK(cudaFree(gpu.batch_memory));
        CUDA_CHECK(cudaFree(gpu.batch_ints));
        CUDA_CHECK(cudaFree(gpu.model_memory));
        CUBLAS_CHECK(cublasDestroy(gpu.cublas));
    }
    free(gpu.enc); free(gpu.dec); free(gpu.host_ints); free(gpu.token_count);
    int tf32 = gpu.tf32, count = gpu.count;
    memset(&gpu, 0, sizeof gpu);
    gpu.tf32 = tf32;
    gpu.count = count;
}

// The model's memory on the GPU, one allocation: its parameters, gradients,
// Adam's moments, the sinusoids and the gathered W^K, W^V of gpu_memory_forward.
static void gpu_allocate_model(const Transformer *m) {
    const TransformerConfig *c = &m->config;
    size_t P = m->num_parameters, pe = (size_t)c->max_len * c->d_model;
    size_t kv_w = (size_t)c->n_layers * 2 * c->d_model * c->d_model;
    Carver count = { NULL, 0 };
    for (int i = 0; i < 4; i++) carve(&count, P);
    carve(&count, pe);
    carve(&count, kv_w);
    gpu.model_memory = gpu_alloc(count.used * sizeof(float));
    Carver cut = { (float *)gpu.model_memory, 0 };
    float **arenas[] = { &gpu.params, &gpu.grads, &gpu.adam_m, &gpu.adam_v };
    for (int i = 0; i < 4; i++) *arenas[i] = carve(&cut, P);
    // learned positions are a parameter that Adam moves on the GPU: the forward
    // reads them where Adam writes them, as m->positional_encoding on the host
    gpu.pe = carve(&cut, pe);
    if (c->positional == POSITIONAL_LEARNED) gpu.pe = on_gpu(gpu.params, m, m->params.position_embedding, 0, 0);
    gpu.memory_kv_w = carve(&cut, kv_w);
    gpu.enc = (GpuEncoderActs *)calloc((size_t)c->n_layers, sizeof(GpuEncoderActs));
    gpu.dec = (GpuDecoderActs *)calloc((size_t)c->n_layers, sizeof(GpuDecoderActs));
    gpu.token_count = (int *)calloc((size_t)c->vocab_size, sizeof(int));
    if (!gpu.enc || !gpu.dec || !gpu.token_count) { fprintf(stderr, "error: out of memory (the GPU's host lists)\n"); exit(1); }
}

// begin: the model's memory on the GPU (again when the model's shape changed),
// and its parameters, moments and sinusoids copied there
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
        gpu_allocate_model(m);
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
// gradients zeroed first), Adam at eq. 3's rate for step adam_step + 1.
// gpu.step_counts gets what the step asked of the GPU.
static real gpu_train_step(Transformer *m, const Batch *batch, int warmup_steps, double lr_factor) {
    GpuCounts before = gpu_counts;
    real loss = gpu_forward(m, batch);
    gpu_backward(m, batch);
    gpu_update(m, transformer_learning_rate(m->adam_step + 1, m->config.d_model, warmup_steps, lr_factor));
    GpuCounts *after = &gpu.step_counts;
    *after = gpu_counts;
    after->launches -= before.launches; after->gemms -= before.gemms; after->memsets -= before.memsets;
    after->copies -= before.copies; after->allocations -= before.allocations;
    after->bytes_set -= before.bytes_set; after->bytes_copied -= before.bytes_copied;
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
// --count: what the last training step asked of the GPU, and the memory it holds
static void gpu_print_counts(void) {
    const GpuCounts *k = &gpu.step_counts;
    double mb = 1.0 / (1024 * 1024), f = sizeof(float);
    double model = ((double)gpu.num_parameters * 4 + (double)gpu.config.max_len * gpu.config.d_model +
                    (double)gpu.config.n_layers * 2 * gpu.config.d_model * gpu.config.d_model) * f;
    double held = model + (double)gpu.batch_capacity * f + (double)gpu.ints_capacity * sizeof(int);
    printf("per step: %ld kernel launches, %ld cuBLAS calls, %ld memsets, %.1f MB set, %.1f MB copied, "
           "%.1f MB device memory held\n", k->launches, k->gemms, k->memsets, k->bytes_set * mb, k->bytes_copied * mb,
           held * mb);
    printf("device memory: %.1f MB the model (parameters, gradients, Adam's moments); for this %d x %d x %d batch "
           "%.1f MB activations kept for the backward pass and %.1f MB scratch (%.2f x the activations), in an "
           "allocation of %.1f MB; %ld allocations in the last step\n", model * mb, gpu.B, gpu.S, gpu.T,
           (double)gpu.activation_floats * f * mb, (double)gpu.scratch_floats * f * mb,
           (double)(gpu.activation_floats + gpu.scratch_floats) / (double)gpu.activation_floats,
           (double)gpu.batch_capacity * f * mb, k->allocations);
}

// ./transformer_cuda COMMAND [options] [--tf32] [--count]: transformer.c's command
// line, with the training steps on the GPU. --count prints what the last
// training step asked of the GPU (cuda_on_cpu.h's build then computes nothing:
// the counts of a model too large to run on the CPU).
int main(int argc, char **argv) {
    int kept = 0;
    for (int i = 0; i < argc; i++) {
        if (i > 0 && strcmp(argv[i], "--tf32") == 0) gpu.tf32 = 1;
        else if (i > 0 && strcmp(argv[i], "--count") == 0) gpu.count = 1;
        else argv[kept++] = argv[i];
    }
    argv[kept] = NULL;
#ifdef CUDA_ON_CPU
    if (gpu.count) cuda_on_cpu.execute = 0;
#endif
    transformer_training = &gpu_training;
    int status = transformer_lab_main(kept, argv);
    if (gpu.count && status == 0) gpu_print_counts();
    gpu_release();
    return status;
}
#endif
