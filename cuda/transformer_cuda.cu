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
 * Data-parallel over NCCL: `mpirun -np N ./transformer_cuda train ...` runs N
 * ranks (lab/ranks.c), one GPU each (the rank's place on its machine), each
 * training on its share of every batch; the host sums the shares' target
 * tokens (MPI) before the step, and ncclAllReduce sums the gradients (and the
 * loss) on the GPUs before Adam, inside the step's graph. NCCL's id goes to
 * every rank over MPI. Built without NCCL (make cuda where nccl.h or MPI is
 * missing), it trains as one rank only.
 *
 * How to build and run it, and what each flag of its own does (--tf32, --bf16,
 * --no-graph, --count, --profile, the sgemm command, ...): cuda/NOTES.md,
 * "Commands and flags".
 *
 * Each kernel computes a Part I loop of transformer.c and names it. What makes
 * a step fast on a GPU, and the same in every run:
 *   - a step is one CUDA graph launch (cuda/NOTES.md): the kernels and cuBLAS
 *     calls of a step are captured once per batch shape, at the second step of
 *     that shape, and replayed at every later one, so a small model is not
 *     bound by the host's launches. Whatever changes from step to step lives
 *     in device memory, copied there before the launch in the one copy of the
 *     step: the batch's tokens, the dropout keys, Adam's step size and bias
 *     correction, 1/n for the loss. The loss comes back in the one copy after
 *     it; nothing in between waits for the GPU;
 *   - a step is about 200 (2 layers) to 500 (6 layers) kernels and cuBLAS calls
 *     however many sentences the batch holds (dev/PERFORMANCE.md counts them):
 *     the linear layers are one cuBLAS call each; attention's four products
 *     one strided batched call each over every sentence and head, which
 *     heads_from_rows_kernel lays out one after another; the keys and values
 *     of the memory for all decoder layers one call;
 *   - rows (layer norm, softmax, the loss over the vocabulary) are a warp or a
 *     block each: neighbouring threads read neighbouring numbers, and a row's
 *     sum is a fixed tree of warp shuffles;
 *   - sums over rows (the gradients of biases, gains, embedding rows) are a
 *     thread per column adding its rows in registers, then a fixed tree in
 *     shared memory; the rows are cut into chunks, a block each, so that a
 *     batch of 25,000 tokens keeps every multiprocessor busy, and the block
 *     that finishes last adds the chunks' sums in chunk order. No atomics in
 *     any sum (one counts the finished blocks), so a run is the same bit for
 *     bit every time;
 *   - biases and dropout live in the kernels around the products: the bias of
 *     a projection that feeds a layer norm is added by the norm's kernel, and
 *     a dropout mask is recomputed from its key (dropout_mask's hash) wherever
 *     it is needed, never stored;
 *   - the activations are sized by the batch's tokens, in one allocation that
 *     grows only when a batch needs more than any before;
 *   - the backward pass runs on two streams (cuda/NOTES.md, "Two streams"):
 *     the weights' gradients (their products, and where a layer norm's
 *     chunks are many the kernel that adds its parameters' sums) on a second
 *     stream with a cuBLAS handle and a workspace of its own, while the main
 *     stream goes on with the inputs' gradients; the main stream waits for
 *     the second before it overwrites a buffer the second reads, and before Adam.
 * cuBLAS multiplies in fp32 (TF32 only with --tf32; bf16 numbers, summed in
 * fp32, with --bf16: cuda/bf16_casts.h).
 *
 * The file is written in the C that CUDA C++ shares: with -DCUDA_ON_CPU the
 * host C compiler builds it against cuda_on_cpu.h, which runs every thread
 * of a block as a fiber of its own in random order (shared memory, barriers
 * and shuffles as on a GPU), every cuBLAS call as a column-major loop, and a
 * captured graph by replaying what it recorded; cuda/test_cuda.c then
 * compares it with transformer.c. A kernel is followed by CPU_KERNEL(name,
 * its parameter types), which only that build reads. In that build every
 * tensor cut from the batch's allocation ends at a guard page of its own
 * (carve), so a kernel that reaches past one into the next stops, named.
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

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef CUDA_ON_CPU
#include "cuda_on_cpu.h"   // (with its NCCL: ncclAllReduce over MPI)
#define TRANSFORMER_NCCL
#else
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <cublasLt.h>
#ifdef TRANSFORMER_NCCL
#include <nccl.h>
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif
#include "../transformer.h"
// ./transformer's command line (lab/lab.c), which this program runs with its training steps
int transformer_lab_main(int argc, char **argv);
#include "../lab/ranks.h"   // the ranks of a data-parallel train (lab/ranks.c)
#ifdef __cplusplus
}
#endif

// ----------------------------------------------------------------------------
// Checked calls: a failure stops the program with one line naming the call.

static void cuda_check(cudaError_t status, const char *call, int line) {
    if (status == cudaSuccess)
        return;
    fprintf(stderr, "error: CUDA: %s failed: %s (transformer_cuda.cu:%d)\n", call,
            cudaGetErrorString(status), line);
    exit(1);
}
static void cublas_check(cublasStatus_t status, const char *call, int line) {
    if (status == CUBLAS_STATUS_SUCCESS)
        return;
    fprintf(stderr, "error: cuBLAS: %s failed: %s (transformer_cuda.cu:%d)\n", call,
            cublasGetStatusString(status), line);
    exit(1);
}
#define CUDA_CHECK(call) cuda_check((call), #call, __LINE__)
#define CUBLAS_CHECK(call) cublas_check((call), #call, __LINE__)
#ifdef TRANSFORMER_NCCL
static void nccl_check(ncclResult_t status, const char *call, int line) {
    if (status == ncclSuccess)
        return;
    fprintf(stderr, "error: NCCL: %s failed: %s (transformer_cuda.cu:%d)\n", call,
            ncclGetErrorString(status), line);
    exit(1);
}
#define NCCL_CHECK(call) nccl_check((call), #call, __LINE__)
#endif

// What one training step asks of the GPU (./transformer_cuda bench --count).
// The work, wherever the host gave it: kernels, cuBLAS calls, memsets and
// copies, one by one or inside the CUDA graphs launched; and the host's own
// calls to the GPU (a graph launch is one, whatever it holds; the waits too).
// Of the work, side_launches and side_gemms went to the second stream, after
// `forks` waits of that stream for the main one, and `joins` the other way;
// graph_nodes and graph_edges: the nodes and dependencies of the graphs launched.
// Of the products, epilogue_products ran with cuBLASLt's epilogues (epilogues.h),
// transposed_products read --tf32's transposed weights (transposed_weights.h).
typedef struct {
    long launches, gemms, memsets, copies, allocations;
    long graph_launches, host_calls;
    double bytes_set, bytes_copied;
    long side_launches, side_gemms, forks, joins;
    long graph_nodes, graph_edges;
    long epilogue_products, transposed_products;
    long all_reduces;   // NCCL's, of a data-parallel run (the gradients, the loss)
} GpuCounts;
static GpuCounts gpu_counts;
// Where the calls are counted: gpu_counts, or while a graph is captured, the
// graph's own counts (added to gpu_counts at each of its launches).
static GpuCounts *gpu_counting = &gpu_counts;

// The stream the companion gives its work to now (NULL, the legacy stream,
// until gpu_begin makes its two): the main stream, or between gpu_side_begin
// and gpu_side_end the second stream (gpu_use_stream).
static cudaStream_t gpu_stream;

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// --profile: where a training step's time goes on the GPU. In every step but
// the first (which allocates and sets cuBLAS up), each kernel, cuBLAS call and
// copy is timed alone: the host waits for the stream before and after it, so
// a step runs without a CUDA graph (--profile implies --no-graph), and each
// figure includes a wait's few microseconds. Summed by name: a kernel's, or a
// product's shape.
#define PROFILE_NAMES 128
typedef struct {
    char name[96];
    double seconds;
    long calls;
} ProfileEntry;
static struct {
    int requested, on;         // --profile was given; the step under way is timed
    long steps_seen, steps;    // training steps run, and timed
    int count;                 // entries used
    ProfileEntry entries[PROFILE_NAMES];
} gpu_profile;

static double profile_start(void) {
    if (!gpu_profile.on)
        return 0;
    CUDA_CHECK(cudaStreamSynchronize(gpu_stream));
    return seconds_now();
}

// The call that began at start has been given to the stream: wait for it and
// add its time to its name's entry (printf's format and arguments).
static void profile_stop(double start, const char *format, ...) {
    if (!gpu_profile.on)
        return;
    CUDA_CHECK(cudaStreamSynchronize(gpu_stream));
    double seconds = seconds_now() - start;
    char name[sizeof gpu_profile.entries[0].name];
    va_list args;
    va_start(args, format);
    vsnprintf(name, sizeof name, format, args);
    va_end(args);
    int i = 0;
    while (i < gpu_profile.count && strcmp(gpu_profile.entries[i].name, name) != 0)
        i++;
    if (i >= PROFILE_NAMES - 1) {   // the last entry gathers every name past the others
        i = PROFILE_NAMES - 1;
        snprintf(gpu_profile.entries[i].name, sizeof name, "(other names)");
        gpu_profile.count = PROFILE_NAMES;
    } else if (i == gpu_profile.count) {
        snprintf(gpu_profile.entries[i].name, sizeof name, "%s", name);
        gpu_profile.count++;
    }
    gpu_profile.entries[i].seconds += seconds;
    gpu_profile.entries[i].calls++;
}

// LAUNCH(kernel, grid, block, shared_bytes, arguments...) is
// kernel<<<grid, block, shared_bytes, gpu_stream>>>(arguments...), then a
// check that it launched; grid and block are numbers (along x) or dim3.
// SHARED_FLOATS(name) declares the block's dynamic shared memory.
#ifdef CUDA_ON_CPU
#define LAUNCH_KERNEL(kernel, grid, block, shared_bytes, ...)                                \
    cpu_launch(#kernel, kernel##_cpu_thread, &(kernel##_cpu_args){ __VA_ARGS__ },            \
               sizeof(kernel##_cpu_args), CPU_DIM3(grid), CPU_DIM3(block), (shared_bytes), \
               gpu_stream)
#define SHARED_FLOATS(name) float *name = cpu_dynamic_shared()
// __threadfence and atomicAdd: the blocks run one after another here
#define __threadfence()
static inline unsigned atomicAdd(unsigned *address, unsigned value) {
    return __atomic_fetch_add(address, value, __ATOMIC_SEQ_CST);
}
#define LOAD_FROM_OTHER_BLOCKS(pointer) (*(pointer))
#else
#define CPU_KERNEL(kernel, ...)
#define LAUNCH_KERNEL(kernel, grid, block, shared_bytes, ...) \
    kernel<<<(grid), (block), (shared_bytes), gpu_stream>>>(__VA_ARGS__)
#define SHARED_FLOATS(name) extern __shared__ float name[]
// a load that bypasses the multiprocessor's L1 (not coherent between blocks):
// what other blocks wrote
#define LOAD_FROM_OTHER_BLOCKS(pointer) __ldcg(pointer)
#endif
#define LAUNCH(kernel, grid, block, shared_bytes, ...) do {                                  \
        double profile_began = profile_start();                                               \
        LAUNCH_KERNEL(kernel, grid, block, shared_bytes, __VA_ARGS__);                       \
        gpu_counting->launches++;                                                             \
        gpu_counting->host_calls++;                                                           \
        cuda_check(cudaGetLastError(), "the launch of " #kernel, __LINE__);                   \
        profile_stop(profile_began, "%s", #kernel);                                           \
    } while (0)

#define WARP 32
#define FULL_WARP 0xffffffffu
#define THREADS 256                       // an elementwise kernel's block
#define ROWS_PER_BLOCK (THREADS / WARP)   // a row kernel's block: a warp per row
#define ROW_GROUPS 16                     // a column kernel's block: 32 columns by 16 groups
                                          // of rows
#define COLUMN_BLOCK (WARP * ROW_GROUPS)
#define EMBEDDING_THREADS (4 * WARP)      // embedding_backward_kernel's block
#define MIN_CHUNK_ROWS (8 * ROW_GROUPS)   // a column kernel's chunk of rows: at least 8 a thread
// One thread per element of n
#define LAUNCH_ELEMENTS(n, kernel, ...) \
    LAUNCH(kernel, blocks_for((size_t)(n), THREADS), THREADS, 0, __VA_ARGS__)
// One warp per row of `rows`
#define LAUNCH_ROWS(rows, kernel, ...) \
    LAUNCH(kernel, blocks_for((size_t)(rows), ROWS_PER_BLOCK), THREADS, 0, __VA_ARGS__)
// One thread per column of `columns` and chunk of `rows` rows,
// its chunk's rows in ROW_GROUPS groups
#define LAUNCH_COLUMNS(columns, rows, kernel, ...)                           \
    LAUNCH(kernel, xyz(blocks_for((size_t)(columns), WARP),                  \
                       column_chunks((size_t)(columns), (size_t)(rows)), 1), \
           xyz(WARP, ROW_GROUPS, 1), COLUMN_BLOCK * sizeof(float), __VA_ARGS__)
#define ELEMENT_INDEX ((size_t)blockIdx.x * blockDim.x + threadIdx.x)

static unsigned blocks_for(size_t n, size_t per_block) {
    return (unsigned)((n + per_block - 1) / per_block);
}
static dim3 xyz(unsigned x, unsigned y, unsigned z) {
    dim3 d = { x, y, z };
    return d;
}

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
    for (int offset = WARP / 2; offset > 0; offset /= 2)
        v = fmaxf(v, __shfl_xor_sync(FULL_WARP, v, offset));
    return v;
}

// The sum (or the largest) over a one-dimensional block, in every thread;
// shared holds a float for each warp.
static __device__ float block_sum(float v, float *shared) {
    unsigned lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP;
    v = warp_sum(v);
    __syncthreads();   // a block_sum before this one may still be reading shared
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    return warp_sum(lane < warps ? shared[lane] : 0.0f);
}
static __device__ float block_max(float v, float *shared) {
    unsigned lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0)
        shared[warp] = v;
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

// The column kernels' chunks of rows (blockIdx.y): as many as fill
// COLUMN_TARGET_BLOCKS blocks, each of at least MIN_CHUNK_ROWS rows. The count
// depends on the shapes alone, so every GPU sums in the same order.
#define COLUMN_TARGET_BLOCKS 1024
static unsigned column_chunks(size_t columns, size_t rows) {
    size_t by_rows = blocks_for(rows, MIN_CHUNK_ROWS),
           by_target = COLUMN_TARGET_BLOCKS / blocks_for(columns, WARP);
    size_t chunks = by_rows < by_target ? by_rows : by_target;
    return chunks > 0 ? (unsigned)chunks : 1;
}

// Where the column kernels keep each chunk's sums (partials: `sums` x chunks x
// columns), and a count per column block of its chunks that are done (zero
// between launches: the block that finishes last sets it back).
typedef struct {
    float *partials;
    unsigned *chunks_done;
} ColumnScratch;

// A column kernel's end: `sums` totals of this block's rows (group 0's threads
// hold them) become its chunk's partials; the block whose chunk is the last to
// finish adds all chunks' partials, in chunk order, into out[s][column]. Which
// block does it is decided by an atomic count, but not the order of the sum:
// the same bits every run. shared: COLUMN_BLOCK floats, free on entry.
static __device__ void finish_column_sums(const float *totals, int sums, float *out0, float *out1,
                                          float *out2, ColumnScratch scratch, int column,
                                          int columns, float *shared) {
    unsigned chunks = gridDim.y, chunk = blockIdx.y;
    float *out[3] = { out0, out1, out2 };
    if (threadIdx.y == 0 && column < columns)
        for (int s = 0; s < sums; s++)
            scratch.partials[((size_t)s * chunks + chunk) * columns + column] = totals[s];
    __threadfence();   // the partials reach every block before the count says they are there
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0)
        shared[0] = atomicAdd(&scratch.chunks_done[blockIdx.x], 1u) == chunks - 1 ? 1.0f : 0.0f;
    __syncthreads();
    if (shared[0] == 0.0f)
        return;   // the whole block
    if (threadIdx.y == 0 && column < columns)
        for (int s = 0; s < sums; s++) {
            float total = 0;
            for (unsigned c = 0; c < chunks; c++)
                total += LOAD_FROM_OTHER_BLOCKS(
                    &scratch.partials[((size_t)s * chunks + c) * columns + column]);
            out[s][column] = total;
        }
    if (threadIdx.x == 0 && threadIdx.y == 0)
        scratch.chunks_done[blockIdx.x] = 0;
}

// A column kernel's rows: those of its chunk (blockIdx.y), `first` to `end`.
static __device__ void chunk_rows(int N, int *first, int *end) {
    int per_chunk = (int)((N + gridDim.y - 1) / gridDim.y);
    *first = (int)blockIdx.y * per_chunk;
    *end = *first + per_chunk < N ? *first + per_chunk : N;
}

// ============================================================================
// Dropout (§5.4): dropout_mask's elements, recomputed wherever they are needed
// ============================================================================

// One mask: element i is kept (times scale) unless hash64(key + i) falls below
// the threshold. dropout_mask keeps i when unit_interval(hash64(key + i)) >= p,
// that is when (hash64(key + i) >> 11) >= p * 2^53, an integer comparison with
// threshold = ceil(p * 2^53). No dropout: threshold 0 and scale 1. The key is
// in device memory (each step's, copied there before the step): a captured
// step reads the new one at every replay.
typedef struct {
    const uint64_t *key;
    uint64_t threshold;
    float scale;
} Dropout;

// transformer.c's hash64, the same bits on the GPU
static __device__ uint64_t dropout_hash64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
static __device__ float dropout_keep(Dropout d, size_t i) {
    if (d.threshold == 0)
        return d.scale;
    return (dropout_hash64(*d.key + i) >> 11) < d.threshold ? 0.0f : d.scale;
}

// What the step's kernels read from device memory, besides its tensors: the
// values that change from step to step (StepValues), copied with the batch.
typedef struct {
    float adam_step_size;     // eq. 3's rate / (1 - beta1^t), t the step
    float adam_rsqrt_c2;      // 1 / sqrt(1 - beta2^t)
    float inv_n;              // 1 / n, n the batch's target tokens (0 when none)
    int distinct_tokens;      // embedding_backward_kernel's blocks that have a token
} StepValues;

// ============================================================================
// The kernels, in Part I's order
// ============================================================================

// encoder_forward's and decoder_forward's first lines, both stacks in one launch:
// embedding_forward, then dropout_forward with its mask,
//     x0[b,t,i] = (E[token, i] * sqrt(C) + pe[t, i]) * mask
// (pe: the sinusoids, or the learned table of Table 3, row E). One thread per
// element; the source's B*S*C come first, then the target's B*T*C.
static __global__ void __launch_bounds__(THREADS)
embedding_forward_kernel(float *enc_x0, float *dec_x0, const int *src, const int *tgt_in,
                         const float *embedding, const float *pe, Dropout enc_drop,
                         Dropout dec_drop, int B, int S, int T, int C) {
    size_t e = ELEMENT_INDEX, n_src = (size_t)B * S * C;
    if (e >= n_src + (size_t)B * T * C)
        return;
    int source = e < n_src, length = source ? S : T;
    size_t i = source ? e : e - n_src, bt = i / C;
    int t = (int)(bt % length), c = (int)(i % C), token = source ? src[bt] : tgt_in[bt];
    float embedded = embedding[(size_t)token * C + c] * sqrtf((float)C) + pe[(size_t)t * C + c];
    if (source)
        enc_x0[i] = embedded * dropout_keep(enc_drop, i);
    else
        dec_x0[i] = embedded * dropout_keep(dec_drop, i);
}
CPU_KERNEL(embedding_forward_kernel, float *, float *, const int *, const int *, const float *,
           const float *, Dropout, Dropout, int, int, int, int)

// add_norm_forward (residual_layernorm_forward and layernorm_row_forward, its
// mask drawn by dropout_keep), with the sub-layer's bias from linear_forward:
//     res = residual + (sublayer + sublayer_bias) * mask;   out = LayerNorm(res)
// A warp per row n, its lanes striding over the C features.
static __global__ void __launch_bounds__(THREADS)
residual_layernorm_forward_kernel(float *out, float *mean, float *rstd, float *res,
                                  const float *residual, const float *sublayer,
                                  const float *sublayer_bias, Dropout drop, const float *gain,
                                  const float *bias, int N, int C, float eps) {
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= N)
        return;   // the whole warp
    size_t at = (size_t)row * C;
    float sum = 0;
    for (int i = lane; i < C; i += WARP) {
        float r =
            residual[at + i] + (sublayer[at + i] + sublayer_bias[i]) * dropout_keep(drop, at + i);
        res[at + i] = r;
        sum += r;
    }
    float m = warp_sum(sum) / C, squares = 0;
    for (int i = lane; i < C; i += WARP) squares += (res[at + i] - m) * (res[at + i] - m);
    float s = 1 / sqrtf(warp_sum(squares) / C + eps);
    for (int i = lane; i < C; i += WARP) out[at + i] = (res[at + i] - m) * s * gain[i] + bias[i];
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}
CPU_KERNEL(residual_layernorm_forward_kernel, float *, float *, float *, float *, const float *,
           const float *, const float *, Dropout, const float *, const float *, int, int, float)

// residual_layernorm_backward, and its parameters' gradients (sums over the
// N rows), with linear_backward's bias of the sub-layer before the norm:
//   dres_i = rstd * (dxhat_i - mean_j(dxhat_j) - xhat_i * mean_j(dxhat_j xhat_j)),
//       dxhat = dout * gain
//   dresidual_i = dres_i,   dsublayer_i = dres_i * mask_i
//   dgain_i = sum_n dout_ni xhat_ni,  dbias_i = sum_n dout_ni,
//       dsublayer_bias_i = sum_n dsublayer_ni
// (dresidual and dsublayer written, not added: the products that add to
// dresidual come after). A block per chunk of NORM_CHUNK_ROWS rows: first a
// warp per row, its two means (into shared memory), then a thread per column
// over the chunk's rows in order, which writes dres and adds the column's
// three sums; they go to partials (3, chunks, C). The chunks' sums
// (sum_of_norm_chunks) are added by the block that finishes last when
// sums.finish, else by layernorm_params_backward_kernel: the same order, the
// same bits. shared: 2 floats a row of a chunk, and one more when sums.finish.
#define NORM_CHUNK_ROWS 32
typedef struct {
    float *dgain, *dbias, *dsublayer_bias, *partials;
    unsigned *chunks_done;   // the blocks finished (zero between launches: the last sets it back)
    int finish;              // 1: the last block adds the chunks; 0:
                             // layernorm_params_backward_kernel does
} NormSums;

// The chunks' sums of one column i of partials (chunks, C), in the order of a
// column kernel's: ROW_GROUPS groups (chunks g, g + ROW_GROUPS, ...), then the groups in order
static __device__ float sum_of_norm_chunks(const float *partials, int chunks, int C, int i) {
    float total = 0;
    for (int g = 0; g < ROW_GROUPS; g++) {
        float group = 0;
        for (int c = g; c < chunks; c += ROW_GROUPS)
            group += LOAD_FROM_OTHER_BLOCKS(&partials[(size_t)c * C + i]);
        total += group;
    }
    return total;
}

static __global__ void __launch_bounds__(THREADS)
residual_layernorm_backward_kernel(float *dresidual, float *dsublayer, const float *dout,
                                   const float *res, Dropout drop, const float *gain,
                                   const float *mean, const float *rstd, int N, int C,
                                   NormSums sums) {
    SHARED_FLOATS(row_means);   // (NORM_CHUNK_ROWS, 2): mean_j(dxhat_j), mean_j(dxhat_j xhat_j)
    int warp = (int)threadIdx.x / WARP, lane = (int)threadIdx.x % WARP,
        warps = (int)blockDim.x / WARP;
    int chunk = (int)blockIdx.x, chunks = (int)gridDim.x, first = chunk * NORM_CHUNK_ROWS;
    int rows = N - first < NORM_CHUNK_ROWS ? N - first : NORM_CHUNK_ROWS;
    for (int r = warp; r < rows; r += warps) {
        size_t at = (size_t)(first + r) * C;
        float m = mean[first + r], s = rstd[first + r], sum_dxhat = 0, sum_dxhat_xhat = 0;
        for (int i = lane; i < C; i += WARP) {
            float dxhat = dout[at + i] * gain[i];
            sum_dxhat += dxhat;
            sum_dxhat_xhat += dxhat * (res[at + i] - m) * s;
        }
        float mean_dxhat = warp_sum(sum_dxhat) / C, mean_dxhat_xhat = warp_sum(sum_dxhat_xhat) / C;
        if (lane == 0) {
            row_means[2 * r] = mean_dxhat;
            row_means[2 * r + 1] = mean_dxhat_xhat;
        }
    }
    __syncthreads();
    for (int i = (int)threadIdx.x; i < C; i += (int)blockDim.x) {
        float g = gain[i], sum_gain = 0, sum_bias = 0, sum_sublayer = 0;
        for (int r = 0; r < rows; r++) {
            size_t at = (size_t)(first + r) * C + i;
            float m = mean[first + r], s = rstd[first + r], d = dout[at], xhat = (res[at] - m) * s;
            float dres = s * (d * g - row_means[2 * r] - xhat * row_means[2 * r + 1]);
            float dsub = dres * dropout_keep(drop, at);
            dresidual[at] = dres;
            dsublayer[at] = dsub;
            sum_gain += d * (res[at] - m) * s;
            sum_bias += d;
            sum_sublayer += dsub;
        }
        sums.partials[(size_t)chunk * C + i] = sum_gain;
        sums.partials[((size_t)chunks + chunk) * C + i] = sum_bias;
        sums.partials[((size_t)2 * chunks + chunk) * C + i] = sum_sublayer;
    }
    if (!sums.finish)
        return;   // the whole block
    float *last = row_means + 2 * (N < NORM_CHUNK_ROWS ? N : NORM_CHUNK_ROWS);
    __threadfence();   // the partials reach every block before the count says they are there
    __syncthreads();
    if (threadIdx.x == 0)
        *last = atomicAdd(sums.chunks_done, 1u) == (unsigned)chunks - 1 ? 1.0f : 0.0f;
    __syncthreads();
    if (*last == 0.0f)
        return;   // the whole block
    for (int e = (int)threadIdx.x; e < 3 * C; e += (int)blockDim.x) {
        int which = e / C, i = e - which * C;
        float *out = which == 0 ? sums.dgain : (which == 1 ? sums.dbias : sums.dsublayer_bias);
        out[i] = sum_of_norm_chunks(sums.partials + (size_t)which * chunks * C, chunks, C, i);
    }
    if (threadIdx.x == 0)
        *sums.chunks_done = 0;
}
CPU_KERNEL(residual_layernorm_backward_kernel, float *, float *, const float *, const float *,
           Dropout, const float *, const float *, const float *, int, int, NormSums)

// residual_layernorm_backward_kernel's sums of the chunks when its blocks do
// not add them (many chunks): a thread per column (blockIdx.y: which of the
// three sums) and group of chunks, then the groups in order (sum_of_row_groups),
// as sum_of_norm_chunks adds them
static __global__ void __launch_bounds__(COLUMN_BLOCK)
layernorm_params_backward_kernel(float *dgain, float *dbias, float *dsublayer_bias,
                                 const float *partials, int chunks, int C) {
    SHARED_FLOATS(shared);
    int i = (int)(blockIdx.x * WARP + threadIdx.x), which = (int)blockIdx.y;
    const float *from = partials + (size_t)which * chunks * C;
    float sum = 0;
    if (i < C)
        for (int c = (int)threadIdx.y; c < chunks; c += (int)blockDim.y)
            sum += from[(size_t)c * C + i];
    sum = sum_of_row_groups(sum, shared);
    float *out = which == 0 ? dgain : (which == 1 ? dbias : dsublayer_bias);
    if (threadIdx.y == 0 && i < C)
        out[i] = sum;
}
CPU_KERNEL(layernorm_params_backward_kernel, float *, float *, float *, const float *, int, int)

// The layout kernels' 16-byte loads and stores (float4): the host launches
// them only where every address is a multiple of 16 (layout_width), which
// the emulator checks at each one.
#ifdef CUDA_ON_CPU
#define CHECK_ALIGNED16(pointer) cpu_check_aligned16(pointer)
#else
#define CHECK_ALIGNED16(pointer)
#endif
static __device__ float4 load_float4(const float *p) {
    CHECK_ALIGNED16(p);
    return *(const float4 *)p;
}
static __device__ void store_float4(float *p, float4 v) {
    CHECK_ALIGNED16(p);
    *(float4 *)p = v;
}
static __device__ float4 add_float4(float4 a, float4 b) {
    float4 sum = { a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w };
    return sum;
}

// The layout kernels' blocks: threadIdx.x is `width` columns of a head (1, or
// 4 with float4), threadIdx.y a head (striding over the heads), threadIdx.z
// a position t of blockIdx.x's rows; blockIdx.y is the sentence b (and
// heads_from_rows_kernel's blockIdx.z the layer). Every index is a product
// and a sum: no division per element (the old kernels did seven).
#define LAYOUT_BLOCK(t, b) int t = (int)(blockIdx.x * blockDim.z + threadIdx.z), b = (int)blockIdx.y

// attention_forward reads head `head` of query (b, t) at column head*hs of the
// projection's row; cuBLAS's batched products need each (sentence, head) as
// one (T, hs) matrix, all of them one after another (head-major):
//     out[part][b][head][t][d] = in[(b*T + t)*ld + part*C + head*hs + d]
//                                + bias[part*C + head*hs + d]
// for `parts` of C columns each (q, k, v: 3; k, v: 2; q: 1). blockIdx.z is a
// layer (the memory's keys and values for every decoder layer at once): its
// columns start layer_columns further in each row, its bias layer_bias further,
// its output layer_out further. bias NULL: none (a gradient laid out the same way).
static __global__ void __launch_bounds__(THREADS)
heads_from_rows_kernel(float *out, const float *in, const float *bias, int ld, int parts,
                       int layer_columns, int layer_bias, size_t layer_out, int B, int T,
                       int hs, int NH, int width) {
    LAYOUT_BLOCK(t, b);
    if (t >= T)
        return;
    int C = NH * hs, layer = (int)blockIdx.z;
    const float *row = in + ((size_t)b * T + t) * ld + (size_t)layer * layer_columns;
    const float *layer_b = bias ? bias + (size_t)layer * layer_bias : NULL;
    float *to = out + (size_t)layer * layer_out + ((size_t)b * NH * T + t) * hs;   // part 0, head 0
    size_t part_stride = (size_t)B * T * C, head_stride = (size_t)T * hs;
    for (int part = 0; part < parts; part++)
        for (int head = (int)threadIdx.y; head < NH; head += (int)blockDim.y) {
            int column = part * C + head * hs;
            float *o = to + part * part_stride + head * head_stride;
            for (int d = (int)threadIdx.x * width; d < hs; d += (int)blockDim.x * width) {
                if (width == 4) {
                    float4 v = load_float4(row + column + d);
                    store_float4(o + d,
                                 layer_b ? add_float4(v, load_float4(layer_b + column + d)) : v);
                } else {
                    float v = row[column + d];
                    o[d] = layer_b ? v + layer_b[column + d] : v;
                }
            }
        }
}
CPU_KERNEL(heads_from_rows_kernel, float *, const float *, const float *, int, int, int, int,
           size_t, int, int, int, int, int)

// attention_forward's output back in rows, Concat(head_1, ..., head_h):
//     out[(b*T + t)*C + head*hs + d] = heads[b][head][t][d]
static __global__ void __launch_bounds__(THREADS)
rows_from_heads_kernel(float *out, const float *heads, int T, int hs, int NH, int width) {
    LAYOUT_BLOCK(t, b);
    if (t >= T)
        return;
    int C = NH * hs;
    float *row = out + ((size_t)b * T + t) * C;
    const float *from = heads + ((size_t)b * NH * T + t) * hs;   // head 0
    for (int head = (int)threadIdx.y; head < NH; head += (int)blockDim.y) {
        const float *h = from + (size_t)head * T * hs;
        for (int d = (int)threadIdx.x * width; d < hs; d += (int)blockDim.x * width) {
            if (width == 4)
                store_float4(row + head * hs + d, load_float4(h + d));
            else
                row[head * hs + d] = h[d];
        }
    }
}
CPU_KERNEL(rows_from_heads_kernel, float *, const float *, int, int, int, int)

// attention_backward's dq, dk, dv, back in the projection's rows (the inverse
// of heads_from_rows_kernel), and linear_backward's bias: their column sums
//     drows[(b*T + t)*ld + column] = dheads[part][b][head][t][d],  dbias[column] = sum over (b, t),
//     column = part*C + head*hs + d
// A thread per column (of parts*C) and chunk of rows.
static __global__ void __launch_bounds__(COLUMN_BLOCK)
rows_from_heads_bias_backward_kernel(float *drows, float *dbias, ColumnScratch scratch,
                                     const float *dheads, int ld, int parts, int B, int T,
                                     int C, int NH) {
    SHARED_FLOATS(shared);
    int column = blockIdx.x * WARP + threadIdx.x, hs = C / NH, first, end;
    chunk_rows(B * T, &first, &end);
    float sum = 0;
    if (column < parts * C) {
        int part = column / C, head = column % C / hs, d = column % hs;
        const float *from = dheads + (size_t)part * B * T * C;
        for (int n = first + (int)threadIdx.y; n < end; n += blockDim.y) {
            int b = n / T, t = n % T;
            float g = from[(((size_t)b * NH + head) * T + t) * hs + d];
            drows[(size_t)n * ld + column] = g;
            sum += g;
        }
    }
    sum = sum_of_row_groups(sum, shared);
    finish_column_sums(&sum, 1, dbias, NULL, NULL, scratch, column, parts * C, shared);
}
CPU_KERNEL(rows_from_heads_bias_backward_kernel, float *, float *, ColumnScratch, const float *,
           int, int, int, int, int, int)

// attention_forward's softmax_visible, a warp per query row (b, head, i): the
// scores of the keys it may see (visible_keys: padding and causal masks)
// become their softmax, the masked keys get exactly 0.
static __global__ void __launch_bounds__(THREADS)
softmax_forward_kernel(float *att, const int *key_len, int causal, int B, int NH, int Tq, int Tk) {
    size_t r = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (r >= (size_t)B * NH * Tq)
        return;
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
static __global__ void __launch_bounds__(THREADS)
softmax_backward_kernel(float *grad, const float *att, size_t rows, int Tk) {
    size_t r = (size_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (r >= rows)
        return;
    float *g = grad + r * Tk, sum_p_dp = 0;
    const float *p = att + r * Tk;
    for (int j = lane; j < Tk; j += WARP) sum_p_dp += p[j] * g[j];
    sum_p_dp = warp_sum(sum_p_dp);
    for (int j = lane; j < Tk; j += WARP) g[j] = p[j] * (g[j] - sum_p_dp);
}
CPU_KERNEL(softmax_backward_kernel, float *, const float *, size_t, int)

// --fused-attention: attention in one kernel each way, reading the projections' rows
#include "fused_attention.cu"

// feed_forward_forward's relu_forward, with linear_forward's bias: hidden = max(0, hidden + bias)
static __global__ void __launch_bounds__(THREADS)
bias_relu_forward_kernel(float *hidden, const float *bias, size_t N, int F) {
    size_t e = ELEMENT_INDEX;
    if (e >= N * F)
        return;
    float v = hidden[e] + bias[e % F];
    hidden[e] = v > 0 ? v : 0;
}
CPU_KERNEL(bias_relu_forward_kernel, float *, const float *, size_t, int)

// feed_forward_backward's relu_backward (dhidden = 0 where hidden <= 0) and
// linear_backward's bias of W_1: dbias_f = sum_n dh_nf. A thread per column f and chunk of rows.
static __global__ void __launch_bounds__(COLUMN_BLOCK)
relu_bias_backward_kernel(float *dhidden, float *dbias, ColumnScratch scratch,
                          const float *hidden, int N, int F) {
    SHARED_FLOATS(shared);
    int f = blockIdx.x * WARP + threadIdx.x, first, end;
    chunk_rows(N, &first, &end);
    float sum = 0;
    if (f < F)
        for (int n = first + (int)threadIdx.y; n < end; n += blockDim.y) {
            size_t at = (size_t)n * F + f;
            float g = hidden[at] > 0 ? dhidden[at] : 0.0f;
            dhidden[at] = g;
            sum += g;
        }
    sum = sum_of_row_groups(sum, shared);
    finish_column_sums(&sum, 1, dbias, NULL, NULL, scratch, f, F, shared);
}
CPU_KERNEL(relu_bias_backward_kernel, float *, float *, ColumnScratch, const float *, int, int)

// cross_entropy_forward and cross_entropy_backward together, a block per
// target position bt over its V logits z (probabilities are never stored):
//   token_loss = -(1-eps) log p_y - (eps/V) sum_v log p_v,  log p_v = z_v - log sum_w exp(z_w)
//   dlogits_v = (p_v - q_v) / n,   q_v = (1-eps) [v == y] + eps/V
// padding positions get 0 for both. shared: a float per warp, then, when
// row_in_shared, the row's V logits: read from device memory once (the largest
// first), then read again from there by the thread that wrote each (no
// barrier needed), instead of three times from device memory.
static __global__ void __launch_bounds__(1024)
cross_entropy_kernel(float *token_loss, float *dlogits, const float *logits, const int *targets,
                     const int *tgt_len, const StepValues *step, float eps, int T, int V,
                     int row_in_shared) {
    SHARED_FLOATS(shared);
    size_t bt = blockIdx.x;
    const float *z = logits + bt * V;
    float *dz = dlogits + bt * V;
    if ((int)(bt % T) >= tgt_len[bt / T]) {   // the whole block
        for (int v = threadIdx.x; v < V; v += blockDim.x) dz[v] = 0;
        if (threadIdx.x == 0)
            token_loss[bt] = 0;
        return;
    }
    float *cached = shared + blockDim.x / WARP;
    float largest = -INFINITY, sum = 0, sum_z = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float zv = z[v];
        if (row_in_shared)
            cached[v] = zv;
        largest = fmaxf(largest, zv);
    }
    const float *row = row_in_shared ? cached : z;
    largest = block_max(largest, shared);
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        sum += expf(row[v] - largest);
        sum_z += row[v];
    }
    sum = block_sum(sum, shared);
    sum_z = block_sum(sum_z, shared);
    int y = targets[bt];
    float inv_sum = 1 / sum, smooth = eps / V, inv_n = step->inv_n;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        dz[v] = (expf(row[v] - largest) * inv_sum - (smooth + (v == y ? 1 - eps : 0.0f))) * inv_n;
    if (threadIdx.x == 0) {
        float log_sum = largest + logf(sum), log_p_target = z[y] - log_sum,
              sum_log_p = sum_z - V * log_sum;
        token_loss[bt] = -(1 - eps) * log_p_target - smooth * sum_log_p;
    }
}
CPU_KERNEL(cross_entropy_kernel, float *, float *, const float *, const int *, const int *,
           const StepValues *, float, int, int, int)

// cross_entropy_forward's mean over the n non-padding positions (padding's
// token_loss is 0), in double as the host: one block, each thread a strided
// share, then thread 0 adds the shares in order. shared: a double per thread.
static __global__ void __launch_bounds__(THREADS)
mean_loss_kernel(float *loss, const float *token_loss, size_t count, const StepValues *step) {
    SHARED_FLOATS(shared);
    double *shares = (double *)shared, sum = 0;
    for (size_t i = threadIdx.x; i < count; i += blockDim.x) sum += token_loss[i];
    shares[threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.x != 0)
        return;
    double total = 0;
    for (unsigned t = 0; t < blockDim.x; t++) total += shares[t];
    *loss = (float)(total * step->inv_n);
}
CPU_KERNEL(mean_loss_kernel, float *, const float *, size_t, const StepValues *)

// embedding_backward for both stacks, with dropout_backward's masks:
//     dE[token, i] += sum over the positions holding token of d_x0[position, i] * mask * sqrt(C)
// A block per distinct token of the batch (the grid holds as many blocks as a
// batch of this shape could have distinct tokens; the rest return), a thread
// per feature. The host lists each token's positions (rows: the target's
// 0..B*T-1 first, then the source's, B*T + b*S + s), so each sum runs in one
// thread in a fixed order: no two threads ever add to one element.
static __global__ void __launch_bounds__(EMBEDDING_THREADS)
embedding_backward_kernel(float *dembedding, const float *d_dec_x0, const float *d_enc_x0,
                          const int *token_ids, const int *token_first, const int *rows,
                          const StepValues *step, Dropout dec_drop, Dropout enc_drop, int BT,
                          int C) {
    int k = blockIdx.x;
    if (k >= step->distinct_tokens)
        return;
    int token = token_ids[k];
    float scale = sqrtf((float)C);
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < C; i += gridDim.y * blockDim.x) {
        float sum = 0;
        for (int r = token_first[k]; r < token_first[k + 1]; r++) {
            int row = rows[r];
            size_t at = row < BT ? (size_t)row * C + i : (size_t)(row - BT) * C + i;
            float g = row < BT ? d_dec_x0[at] * dropout_keep(dec_drop, at)
                               : d_enc_x0[at] * dropout_keep(enc_drop, at);
            sum += g * scale;
        }
        dembedding[(size_t)token * C + i] += sum;
    }
}
CPU_KERNEL(embedding_backward_kernel, float *, const float *, const float *, const int *,
           const int *, const int *, const StepValues *, Dropout, Dropout, int, int)

// position_embedding_backward (Table 3, row E) for both stacks, one thread per
// element (t, i) of the learned table, sentences in order:
//     dpe[t, i] = sum_b d_dec_x0[b,t,i] * mask + sum_b d_enc_x0[b,t,i] * mask
// (rows past both lengths get 0: the whole table is written)
static __global__ void __launch_bounds__(THREADS)
position_embedding_backward_kernel(float *dpe, const float *d_dec_x0, const float *d_enc_x0,
                                   Dropout dec_drop, Dropout enc_drop, int max_len, int B,
                                   int S, int T, int C) {
    size_t e = ELEMENT_INDEX;
    if (e >= (size_t)max_len * C)
        return;
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
CPU_KERNEL(position_embedding_backward_kernel, float *, const float *, const float *, Dropout,
           Dropout, int, int, int, int, int)

// adam_update, one thread per parameter; the step size and bias correction
// of this step from device memory (StepValues). With --bf16 (theta_bf16 not
// NULL) it writes the bf16 copy of the updated parameter, which the products read.
typedef struct {
    float beta1, beta2, eps;
} AdamConstants;
static __global__ void __launch_bounds__(THREADS)
adam_kernel(float *theta, __nv_bfloat16 *theta_bf16, float *first, float *second,
            const float *grad, size_t n, AdamConstants adam, const StepValues *step) {
    size_t i = ELEMENT_INDEX;
    if (i >= n)
        return;
    float g = grad[i];
    float mi = adam.beta1 * first[i] + (1 - adam.beta1) * g;
    float vi = adam.beta2 * second[i] + (1 - adam.beta2) * g * g;
    first[i] = mi;
    second[i] = vi;
    float updated =
        theta[i] - step->adam_step_size * mi / (sqrtf(vi) * step->adam_rsqrt_c2 + adam.eps);
    theta[i] = updated;
    if (theta_bf16)
        theta_bf16[i] = __float2bfloat16(updated);
}
CPU_KERNEL(adam_kernel, float *, __nv_bfloat16 *, float *, float *, const float *, size_t,
           AdamConstants, const StepValues *)

// ============================================================================
// The GPU's model: its memory, and the matrix products through cuBLAS
// ============================================================================

// Layer l's parameters (or gradients) on the GPU: the same offsets as on the host.
typedef struct {
    float *qkv_w, *qkv_b, *out_w, *out_b;
} GpuAttentionParams;
typedef struct {
    GpuAttentionParams self_attn, cross_attn;           // cross_attn: decoder only
    float *ln1_g, *ln1_b, *ln2_g, *ln2_b, *ln3_g, *ln3_b;  // ln3: decoder only
    float *ff1_w, *ff1_b, *ff2_w, *ff2_b;
} GpuLayerParams;

// What a layer's backward pass reads, named as transformer.c's activations once were
// (ln1 for norm1.out, res1 for norm1.res, ff_h for ffn.hidden: transformer.h's
// EncoderLayerActs) except: q, k, v are head-major (heads_from_rows_kernel), or with
// the fused attention (gpu_fused_fits) in the projection's rows without their bias; the
// dropout masks are keys (Dropout); the sub-layers' outputs before their norms are not kept.
typedef struct {
    float *qkv, *att, *heads, *res1, *ln1, *ln1_mean, *ln1_rstd;
    float *ff_h, *res2, *ln2, *ln2_mean, *ln2_rstd;
    Dropout drop1, drop2;
    unsigned char *ff_mask;   // the ReLU's bits (epilogues.h; NULL without cuBLASLt's epilogues)
    int ff_mask_written;      // by this forward pass (else its backward runs the kernels too)
} GpuEncoderActs;
typedef struct {
    float *self_qkv, *self_att, *self_heads, *res1, *ln1, *ln1_mean, *ln1_rstd;
    float *cross_q, *cross_att, *cross_heads, *res2, *ln2, *ln2_mean, *ln2_rstd;
    float *ff_h, *res3, *ln3, *ln3_mean, *ln3_rstd;
    Dropout drop1, drop2, drop3;
    unsigned char *ff_mask;
    int ff_mask_written;
} GpuDecoderActs;

// Scratch, reused layer after layer; "rows" are B*S or B*T, whichever is more.
// The forward pass borrows some (the comment names its use).
typedef struct {
    float *d_dec;        // (B*T, C)  of a decoder layer's output, then input (in the end:
                         // of dec_x0)
    float *d_enc;        // (B*S, C)  the same in the encoder (first: of the memory)
    float *d_mid1;       // (rows, C) of a layer's first Add & Norm
                         // output (the second sub-layer's input)
    float *d_mid2;       // (B*T, C)  of a decoder layer's second Add & Norm output
    float *d_sublayer;   // (rows, C) of a sub-layer's output; forward:
                         // the output itself, before its norm
    float *d_heads;      // (rows, C) of Concat(heads) before W^O;
                         // forward: the cross-attention's queries
    float *d_heads_hm;   // (rows, C) the same head-major; forward: attention's output head-major
    float *d_qkv_hm;     // (3, rows, C) of q, k, v head-major;
                         // cross-attention: of q, then of k and v
    float *d_qkv;        // (rows, 3C) the same in rows; forward: the self-attention's projection
    float *d_ff_h;       // (rows, F)
    float *d_att;        // (B, NH, Tq, Tk) of the scores: dp, then ds
    float *d_memory_kv;  // (B*S, L*2C) of every decoder layer's
                         // keys and values; forward: the projection
    float *d_logits;     // (B*T, V)
    float *d_attention_bias;   // (B, 3C) the fused attention's sums
                               // of each sentence's dq, dk, dv rows
    float *d_norm_partials;    // (3, rows / NORM_CHUNK_ROWS, C)
                               // residual_layernorm_backward_kernel's chunks' sums
} GpuScratch;

// A captured step: the shape it was captured for (and whether dropout was on),
// the graph to launch, what it holds, and when it was last launched.
typedef struct {
    int B, S, T, dropout;
    cudaGraphExec_t exec;
    GpuCounts counts;
    long last_used;
} GpuGraph;
#define GPU_GRAPHS 16          // the graphs kept, the least recently launched replaced first
#define GPU_SHAPES_SEEN 64     // the shapes remembered until their graph is captured
#define CUBLAS_WORKSPACE_BYTES ((size_t)32 << 20)   // cuBLAS's recommendation for
                                                    // Hopper (4 MB before it)

// What each of the step's two streams has of its own: work on the two may run
// at once, so each has its own cuBLAS handle, with its own workspace (cuBLAS
// keeps partial sums there: shared, the two would overwrite each other's, and
// the bits would change from run to run). The column kernels' scratch for
// their chunk sums (and their counts) is the main stream's alone: the side
// stream runs no column kernel (the layer norms' sums are in their row
// kernel, on the main stream, or in layernorm_params_backward_kernel, which
// reads the row kernel's partials and counts nothing), so its `columns` stay
// NULL, and a column kernel given to it would fault at once.
typedef struct {
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *cublas_workspace;
    ColumnScratch columns;   // the main stream's; NULL for the side stream
} GpuStream;
enum { MAIN_STREAM, SIDE_STREAM };

typedef struct TransposedWeight TransposedWeight;   // (transposed_weights.h)
typedef struct {
    int ready, tf32, bf16, count;   // bf16: --bf16 (bf16_casts.h)
    size_t shared_opt_in;    // the dynamic shared memory cross_entropy_kernel
                             // may have (the device's opt-in limit)
    GpuStream streams[2];    // MAIN_STREAM and SIDE_STREAM
    int on_side;             // work goes to the side stream now (gpu_side_begin)
    int side_unjoined;       // the side stream has work the main stream has not waited for yet
    int side_reads_scratch;  // and some of it reads scratch that the main stream overwrites later
    cudaEvent_t forked, joined;   // recorded in the main stream for the
                                  // side to wait for, and the other way
    GpuCounts side_from;     // the counts when the side stream took over (gpu_side_begin)
    // cublas, cublas_workspace, columns: those of the stream work goes to now (gpu_use_stream)
    cublasHandle_t cublas;
    void *cublas_workspace;  // set explicitly: cuBLAS then allocates nothing inside a capture
    cublasLtHandle_t lt;     // cuBLASLt, for the feed-forward networks'
                             // epilogues (NULL: --no-epilogues)
    TransformerConfig config;
    size_t num_parameters;
    float *params, *grads, *adam_m, *adam_v;   // the host's layout
    float *pe;            // (max_len, C): the sinusoids, or learned positions' table inside params
    float *memory_kv_w;   // (L, 2C, C): each decoder layer's W^K, W^V, gathered for one product
    __nv_bfloat16 *params_bf16, *memory_kv_w_bf16;   // --bf16: the weights' copies the
                                                     // products read
    float *params_t, *memory_kv_w_t;   // --tf32: the weights' transposed
                                       // copies (transposed_weights.h)
    TransposedWeight *transposed, *transposed_table;   // their list, on the host and on the GPU
    int transposed_count;
    unsigned transposed_tiles;
    ColumnScratch columns;   // the column kernels' chunk sums (finish_column_sums)
    unsigned *attention_heads_done;   // (NH) fused_attention_backward_kernel's
                                      // finished blocks, per head
    unsigned *norm_chunks_done;       // residual_layernorm_backward_kernel's finished blocks
    void *model_memory;   // the above, one allocation
    // the batch, its activations and the scratch, carved for (B, S, T) from one allocation
    int B, S, T;
    float *batch_memory;
    size_t batch_capacity;   // floats
    __nv_bfloat16 *batch_bf16;   // --bf16: batch_capacity numbers, the
                                 // products' copies of the activations
    // the step's one copy to the GPU: StepValues, the dropout keys, then the
    // batch's tokens and the embedding gradient's lists; its host side is page-locked
    unsigned char *upload, *upload_host;
    size_t upload_capacity, upload_bytes;
    StepValues *step;        // in upload: the step's values, and their host copy
    StepValues *step_host;
    uint64_t *dropout_keys, *dropout_keys_host;   // in upload: the step's keys,
                                                  // in transformer.c's order
    int *token_count;        // (V) gpu_prepare_step's counting sort
    int *src, *src_len, *tgt_in, *tgt_out, *tgt_len, *token_ids, *token_first,
        *token_rows;   // in upload
    float *enc_x0, *dec_x0, *logits, *token_loss, *loss;
    float *loss_host;        // page-locked: the loss, copied back at the end of the step
    float *memory_kv;        // (L, 2, B, NH, S, hs): each decoder
                             // layer's keys and values of the memory
                             // (with the fused attention, the projection's rows: (B*S, L*2C))
    Dropout enc_drop, dec_drop;
    GpuEncoderActs *enc;   // (L) on the host, pointing to the GPU
    GpuDecoderActs *dec;
    GpuScratch scratch;
    size_t activation_floats, scratch_floats;   // of batch_memory, for --count
    GpuGraph graphs[GPU_GRAPHS];
    int graph_count;
    struct {
        int B, S, T, dropout, steps;
    } seen[GPU_SHAPES_SEEN];   // steps of shapes not captured yet
    int seen_next;
    long steps;              // training steps so far, for the graphs' last use
    GpuCounts step_counts;   // the last training step's
    int device;              // this rank's GPU (a data-parallel run's: its place on its machine)
#ifdef TRANSFORMER_NCCL
    ncclComm_t nccl;         // a data-parallel run's communicator (NULL: one rank alone)
#endif
} GpuModel;

static GpuModel gpu;
// A shape's graph is captured at its gpu_graph_after-th step (0: never, --no-graph):
// the second, so that a shape seen once costs no capture.
static int gpu_graph_after = 2;
// --one-stream: the whole step on the main stream, the side stream never used
// (the benchmark's paired comparison; the same bits either way)
static int gpu_one_stream;

// ---- the two streams ----------------------------------------------------------
// The backward pass gives the weights' gradients (their products, and where
// a layer norm's chunks are many the kernel that adds its parameters' sums)
// to the side stream, which waits for what the main stream was given before;
// the main stream goes on with the inputs' gradients, the path to the next
// layer down. The main stream waits for the side stream (a join) before it
// overwrites a buffer the side stream's work reads
// (gpu_residual_layernorm_backward: the row kernel writes d_sublayer, the
// gradient it passes down and d_norm_partials, which the side stream's
// products and sums read), and before the embedding's gradient (which adds to
// what the side stream's product wrote) and Adam. Inside a capture the two
// waits are a fork and a join of the graph's branches. (--bf16: the bf16 copy
// both streams read is cast before the fork, gpu_bf16_shared_begin.)

// Work goes to `which` stream from now on: LAUNCH, gemm, the column kernels' scratch.
static void gpu_use_stream(int which) {
    GpuStream *s = &gpu.streams[which];
    gpu_stream = s->stream;
    gpu.cublas = s->cublas;
    gpu.cublas_workspace = s->cublas_workspace;
    gpu.columns = s->columns;
    gpu.on_side = which == SIDE_STREAM;
}

// The work given from here to gpu_side_end goes to the side stream, after all
// the main stream was given so far (with --one-stream, to the main stream).
static void gpu_side_begin(void) {
    if (gpu_one_stream)
        return;
    CUDA_CHECK(cudaEventRecord(gpu.forked, gpu.streams[MAIN_STREAM].stream));
    CUDA_CHECK(cudaStreamWaitEvent(gpu.streams[SIDE_STREAM].stream, gpu.forked, 0));
    gpu_counting->forks++;
    gpu_counting->host_calls += 2;
    gpu.side_from = *gpu_counting;
    gpu_use_stream(SIDE_STREAM);
}
static void gpu_side_end(void) {
    if (!gpu.on_side)
        return;
    gpu_counting->side_launches += gpu_counting->launches - gpu.side_from.launches;
    gpu_counting->side_gemms += gpu_counting->gemms - gpu.side_from.gemms;
    gpu_use_stream(MAIN_STREAM);
    gpu.side_unjoined = 1;
    gpu.side_reads_scratch = 1;
}
// All the side stream's work so far reads nothing that the main stream
// overwrites before Adam (the output layer's weight gradient, first in the
// backward pass: the logits' gradient and the decoder's output): the main
// stream's next wait before it overwrites scratch (gpu_join_side_readers)
// need not wait for it.
static void gpu_side_reads_nothing_overwritten(void) { gpu.side_reads_scratch = 0; }
// The main stream's later work waits for all the side stream was given.
static void gpu_join_side(void) {
    if (!gpu.side_unjoined)
        return;
    CUDA_CHECK(cudaEventRecord(gpu.joined, gpu.streams[SIDE_STREAM].stream));
    CUDA_CHECK(cudaStreamWaitEvent(gpu.streams[MAIN_STREAM].stream, gpu.joined, 0));
    gpu_counting->joins++;
    gpu_counting->host_calls += 2;
    gpu.side_unjoined = 0;
    gpu.side_reads_scratch = 0;
}
// The same before the main stream overwrites scratch, when the side stream's work may
// still read some
static void gpu_join_side_readers(void) {
#ifdef CUDA_ON_CPU
    if (cpu_test_faults.readers_joins_skipped)
        return;   // (test_cuda.c: a missing wait must be caught)
#endif
    if (gpu.side_reads_scratch)
        gpu_join_side();
}

// --fused-attention: attention through fused_attention_forward_kernel and
// fused_attention_backward_kernel (fused_attention.cu) where a head fits their
// shared memory, q, k and v kept in the projections' rows; off, head-major
// copies, cuBLAS's batched products and the row kernels around them. Off by
// default until a GPU has timed both (cuda/NOTES.md).
static int gpu_fused_attention;
static size_t fused_forward_bytes(int Tk, int hs) {
    return ((size_t)2 * Tk * (hs + 1) + (size_t)ROWS_PER_BLOCK * (hs + Tk)) * sizeof(float);
}
static size_t fused_backward_bytes(int Tq, int Tk, int hs) {
    return ((size_t)2 * (Tq > Tk ? Tq : Tk) * (hs + 1) + (size_t)ROWS_PER_BLOCK * hs) *
        sizeof(float);
}
static int gpu_fused_fits(int Tq, int Tk, int hs) {
    return gpu_fused_attention && fused_forward_bytes(Tk, hs) <= FUSED_SHARED_LIMIT &&
           fused_backward_bytes(Tq, Tk, hs) <= FUSED_SHARED_LIMIT;
}

static void *gpu_alloc(size_t bytes) {
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    gpu_counts.allocations++;
    gpu_counts.host_calls++;
    return p;
}

// A copy that waits for the GPU (the model's memory to and from the host)
static void gpu_copy(void *to, const void *from, size_t bytes, cudaMemcpyKind kind) {
    CUDA_CHECK(cudaMemcpy(to, from, bytes, kind));
    gpu_counts.copies++;
    gpu_counts.host_calls++;
    gpu_counts.bytes_copied += (double)bytes;
}

// A copy in the stream's order, from or to page-locked host memory: the host
// goes on at once (a step's upload and its loss)
static void gpu_copy_async(void *to, const void *from, size_t bytes, cudaMemcpyKind kind) {
    double profile_began = profile_start();
    CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, kind, gpu_stream));
    profile_stop(profile_began, "copy %s, %zu bytes",
                 kind == cudaMemcpyHostToDevice ? "to the GPU" : "from the GPU", bytes);
    gpu_counting->copies++;
    gpu_counting->host_calls++;
    gpu_counting->bytes_copied += (double)bytes;
}

#include "bf16_casts.h"   // --bf16: the bf16 copies of the products' operands
static float *on_gpu(float *arena, const Transformer *m, const real *host_tensor, size_t l,
                     size_t per_layer);
#include "transposed_weights.h"   // --tf32: the weights' transposed
                                  // copies, for the inputs' gradients
#include "epilogues.h"            // the feed-forward networks' bias and
                                  // ReLU inside cuBLASLt's products

// C = alpha op(A) op(B) + beta C, column-major (cuda_on_cpu.h says it exactly).
// --bf16: A and B are read from their bf16 copies (gpu_bf16_operand, cast
// before the product starts), their products summed in fp32 into C.
static void gemm(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                 float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                 float *C, int ldc) {
    const __nv_bfloat16 *a = NULL, *b = NULL;
    if (gpu.bf16) {
        a = gpu_bf16_operand(A, operand_extent(transa, m, k, lda, 0, 1));
        b = gpu_bf16_operand(B, operand_extent(transb, k, n, ldb, 0, 1));
    }
    double profile_began = profile_start();
    if (gpu.bf16)
        CUBLAS_CHECK(cublasGemmEx(gpu.cublas, transa, transb, m, n, k, &alpha, a, CUDA_R_16BF, lda,
                                  b, CUDA_R_16BF, ldb, &beta, C, CUDA_R_32F, ldc,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else
        CUBLAS_CHECK(cublasSgemm(gpu.cublas, transa, transb, m, n, k, &alpha, A, lda, B, ldb, &beta,
                                 C, ldc));
    profile_stop(profile_began, "cuBLAS %s m=%d n=%d k=%d (%c%c)", gpu.bf16 ? "bf16 gemm" : "sgemm",
                 m, n, k, transa == CUBLAS_OP_T ? 'T' : 'N', transb == CUBLAS_OP_T ? 'T' : 'N');
    gpu_counting->gemms++;
    gpu_counting->host_calls++;
}

// The same for `count` products, the i-th at A + i*stride_a, B + i*stride_b, C + i*stride_c
static void gemm_batched(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                         float alpha, const float *A, int lda, long long stride_a, const float *B,
                         int ldb, long long stride_b, float beta, float *C, int ldc,
                         long long stride_c, int count) {
    const __nv_bfloat16 *a = NULL, *b = NULL;
    if (gpu.bf16) {
        a = gpu_bf16_operand(A, operand_extent(transa, m, k, lda, stride_a, count));
        b = gpu_bf16_operand(B, operand_extent(transb, k, n, ldb, stride_b, count));
    }
    double profile_began = profile_start();
    if (gpu.bf16)
        CUBLAS_CHECK(cublasGemmStridedBatchedEx(gpu.cublas, transa, transb, m, n, k, &alpha, a,
                                                CUDA_R_16BF, lda, stride_a, b, CUDA_R_16BF, ldb,
                                                stride_b, &beta, C, CUDA_R_32F, ldc, stride_c,
                                                count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else
        CUBLAS_CHECK(cublasSgemmStridedBatched(gpu.cublas, transa, transb, m, n, k, &alpha, A, lda,
                                               stride_a, B, ldb, stride_b, &beta, C, ldc, stride_c,
                                               count));
    profile_stop(profile_began, "cuBLAS %s %d batched, m=%d n=%d k=%d (%c%c)",
                 gpu.bf16 ? "bf16 gemm" : "sgemm", count, m, n, k,
                 transa == CUBLAS_OP_T ? 'T' : 'N', transb == CUBLAS_OP_T ? 'T' : 'N');
    gpu_counting->gemms++;
    gpu_counting->host_calls++;
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
static void gpu_linear_forward(float *out, const float *inp, const float *weight, int N, int IC,
                               int OC) {
    gemm(OP_T, OP_N, OC, N, IC, 1.0f, weight, IC, inp, IC, 0.0f, out, OC);
}

// linear_backward without its bias (a kernel sums it):
//   dinp (N,IC) = or += dout (N,OC) W (OC,IC):
//       dinp^T (IC x N) = W^T (IC x OC, N) dout^T (OC x N, N)
//   dW (OC,IC) = dout^T inp:
//       dW^T (IC x OC) = inp^T (IC x N, N) dout (N x OC, T)
// add_to_dinp: 1 when dinp already holds the gradient of another path (the residual's).
// dW on the side stream, dinp on the main one (the two streams).
// The input's gradient: with --tf32 from W's transposed copy, K-major
// (transposed_weights.h); with relu (the FFN's first layer's ReLU, which dinp
// is the output of; NULL: none) through cuBLASLt's DRELU_BGRAD epilogue where it
// has one (epilogues.h). Returns whether the epilogue ran.
static int gpu_linear_inputs_backward(float *dinp, int add_to_dinp, const float *dout,
                                      const float *weight, int N, int IC, int OC,
                                      const ReluBackward *relu) {
    int ld = IC;
    cublasOperation_t op = OP_N;
    const float *weight_t = gpu_transposed_weight(weight, OC, IC, &ld);
    if (weight_t) {
        op = OP_T;
        gpu_counting->transposed_products++;
    }
    const float *a = weight_t ? weight_t : weight;
    if (relu && !add_to_dinp && gpu_drelu_bias_grad_product(dinp, relu, dout, op, a, ld, N, OC, IC))
        return 1;
    gemm(op, OP_N, IC, N, OC, 1.0f, a, ld, dout, OC, add_to_dinp ? 1.0f : 0.0f, dinp, IC);
    return 0;
}

// linear_backward; with relu, dinp also through the ReLU (as above). Returns whether its
// epilogue did that.
static int gpu_linear_relu_backward(float *dinp, int add_to_dinp, float *dweight, const float *dout,
                                    const float *inp, const float *weight, int N, int IC, int OC,
                                    const ReluBackward *relu) {
    gpu_bf16_shared_begin(dout, (size_t)N * OC);   // (--bf16: dout's copy, which both
                                                   // products read)
    gpu_side_begin();
    gemm(OP_N, OP_T, IC, OC, N, 1.0f, inp, IC, dout, OC, 0.0f, dweight, IC);
    gpu_side_end();
    int fused = gpu_linear_inputs_backward(dinp, add_to_dinp, dout, weight, N, IC, OC, relu);
    gpu_bf16_shared_end();
    return fused;
}
static void gpu_linear_backward(float *dinp, int add_to_dinp, float *dweight, const float *dout,
                                const float *inp, const float *weight, int N, int IC, int OC) {
    gpu_linear_relu_backward(dinp, add_to_dinp, dweight, dout, inp, weight, N, IC, OC, NULL);
}

// A dropout mask whose key is number `index` of the step's (gpu_prepare_step
// writes them in transformer.c's order); no dropout when the model is not
// training or P_drop is 0 (transformer.c draws no key then).
static Dropout gpu_dropout(const Transformer *m, int index) {
    Dropout d = { gpu.dropout_keys + index, 0, 1.0f };
    float p = m->config.dropout;
    if (!m->training || p <= 0.0f)
        return d;
    d.threshold = (uint64_t)ceil((double)p * 9007199254740992.0);
    d.scale = (float)(1.0 / (1.0 - p));
    return d;
}

// add_norm_forward: res = x + Dropout(sublayer + sublayer_bias);  out = LayerNorm(res)
static void gpu_add_norm_forward(float *out, float *mean, float *rstd, float *res, const float *x,
                                 const float *sublayer, const float *sublayer_bias, Dropout drop,
                                 const float *gain, const float *bias, const TransformerConfig *c,
                                 int N) {
    LAUNCH_ROWS(N, residual_layernorm_forward_kernel, out, mean, rstd, res, x, sublayer,
                sublayer_bias, drop, gain, bias, N, c->d_model, c->layer_norm_eps);
}

// residual_layernorm_backward, and the gradient of the bias of the sub-layer
// before the norm; dresidual and dsublayer are written. One launch when the
// chunks' sums are few enough for the last block to add them
// (gpu_norm_sums_in_kernel floats), else a second adds them. The row kernel
// runs on the main stream (the gradient it passes down is the path to the
// next layer), after the main stream waits for the side stream, whose work
// may still read what it overwrites (d_sublayer, the gradient a layer passes
// down, and d_norm_partials, which the side stream's second launch reads);
// the second launch, when there is one, on the side stream.
static size_t gpu_norm_sums_in_kernel = 65536;
static void gpu_residual_layernorm_backward(float *dresidual, float *dsublayer, float *dgain,
                                            float *dbias, float *dsublayer_bias, const float *dout,
                                            const float *res, Dropout drop, const float *gain,
                                            const float *mean, const float *rstd, int N, int C) {
    unsigned chunks = blocks_for((size_t)N, NORM_CHUNK_ROWS);
    int finish = (size_t)3 * chunks * C <= gpu_norm_sums_in_kernel;
    NormSums sums = { dgain, dbias, dsublayer_bias, gpu.scratch.d_norm_partials,
                      gpu.norm_chunks_done, finish };
    size_t chunk_rows = N < NORM_CHUNK_ROWS ? (size_t)N : NORM_CHUNK_ROWS;
    gpu_join_side_readers();
    LAUNCH(residual_layernorm_backward_kernel, chunks, THREADS,
           (2 * chunk_rows + (size_t)finish) * sizeof(float), dresidual, dsublayer, dout, res, drop,
           gain, mean, rstd, N, C, sums);
    if (finish)
        return;
    gpu_side_begin();
    LAUNCH(layernorm_params_backward_kernel, xyz(blocks_for((size_t)C, WARP), 3, 1),
           xyz(WARP, ROW_GROUPS, 1), COLUMN_BLOCK * sizeof(float), dgain, dbias, dsublayer_bias,
           gpu.scratch.d_norm_partials, (int)chunks, C);
    gpu_side_end();
}

// The layout kernels' width: 4 (float4) when the pointers are 16-byte aligned
// and every other offset (`offsets`, in floats) a multiple of 4; else 1
static int layout_width(const void *const *pointers, int count, const size_t *offsets,
                        int offset_count) {
    for (int i = 0; i < count; i++)
        if (pointers[i] && (uintptr_t)pointers[i] % 16 != 0)
            return 1;
    for (int i = 0; i < offset_count; i++)
        if (offsets[i] % 4 != 0)
            return 1;
    return 4;
}

// A layout kernel's block (LAYOUT_BLOCK) for heads of hs columns moved `width`
// at a time: up to 32 threads along a head, the heads, and positions to fill
// THREADS; and its grid over T positions (x), B sentences (y) and `layers` (z)
static void layout_launch_shape(int T, int B, int layers, int hs, int NH, int width, dim3 *grid,
                                dim3 *block) {
    unsigned x = (unsigned)((hs + width - 1) / width);
    if (x > WARP)
        x = WARP;
    unsigned y = (unsigned)NH < THREADS / x ? (unsigned)NH : THREADS / x;
    unsigned z = THREADS / (x * y);
    if (z > 64)
        z = 64;   // a block's most along z
    if (z > (unsigned)T)
        z = (unsigned)T;
    *block = xyz(x, y, z);
    *grid = xyz(blocks_for((size_t)T, z), (unsigned)B, (unsigned)layers);
}

// heads_from_rows_kernel for `layers` layers (layer_columns, layer_bias and layer_out apart)
static void gpu_heads_from_rows_layers(float *out, const float *in, const float *bias, int ld,
                                       int parts, int layers, const size_t layer_offsets[3], int B,
                                       int T, int C, int NH) {
    int hs = C / NH;
    const void *pointers[3] = { out, in, bias };
    size_t offsets[6] = { (size_t)ld, (size_t)C, (size_t)hs, layer_offsets[0], layer_offsets[1],
                          layer_offsets[2] };
    int width = layout_width(pointers, 3, offsets, 6);
    dim3 grid, block;
    layout_launch_shape(T, B, layers, hs, NH, width, &grid, &block);
    LAUNCH(heads_from_rows_kernel, grid, block, 0, out, in, bias, ld, parts, (int)layer_offsets[0],
           (int)layer_offsets[1], layer_offsets[2], B, T, hs, NH, width);
}

// A projection's rows (N, ld) to `parts` head-major tensors, with its bias (NULL: none)
static void gpu_heads_from_rows(float *out, const float *in, const float *bias, int ld, int parts,
                                int B, int T, int C, int NH) {
    size_t one_layer[3] = { 0, 0, 0 };
    gpu_heads_from_rows_layers(out, in, bias, ld, parts, 1, one_layer, B, T, C, NH);
}

// attention_forward's heads (B, NH, T, hs) back in rows (B*T, C)
static void gpu_rows_from_heads(float *out, const float *heads, int B, int T, int C, int NH) {
    int hs = C / NH;
    const void *pointers[2] = { out, heads };
    size_t offsets[2] = { (size_t)C, (size_t)hs };
    int width = layout_width(pointers, 2, offsets, 2);
    dim3 grid, block;
    layout_launch_shape(T, B, 1, hs, NH, width, &grid, &block);
    LAUNCH(rows_from_heads_kernel, grid, block, 0, out, heads, T, hs, NH, width);
}

// attention_forward for every sentence and head at once. q is (B, NH, Tq, hs),
// k and v (B, NH, Tk, hs), head-major; att gets the probabilities (B, NH, Tq, Tk),
// out (B, Tq, C) the heads in rows; heads_hm is scratch (B, NH, Tq, hs).
static void gpu_attention_forward(float *out, float *att, float *heads_hm, const float *q,
                                  const float *k, const float *v, const int *key_len, int causal,
                                  int B, int Tq, int Tk, int C, int NH) {
    int hs = C / NH, count = B * NH;
    long long q_stride = (long long)Tq * hs, kv_stride = (long long)Tk * hs,
              att_stride = (long long)Tq * Tk;
    // s = Q K^T / sqrt(d_k), (Tq x Tk) each:
    //     s^T (Tk x Tq) = K (Tk x hs, stored K^T: T) Q^T (hs x Tq, N)
    gemm_batched(OP_T, OP_N, Tk, Tq, hs, 1 / sqrtf((float)hs), k, hs, kv_stride, q, hs, q_stride,
                 0.0f, att, Tk, att_stride, count);
    LAUNCH_ROWS((size_t)count * Tq, softmax_forward_kernel, att, key_len, causal, B, NH, Tq, Tk);
    // out_i = sum_j p_ij v_j:  out^T (hs x Tq) = V^T (hs x Tk, N) P^T (Tk x Tq, N)
    gemm_batched(OP_N, OP_N, hs, Tq, Tk, 1.0f, v, hs, kv_stride, att, Tk, att_stride, 0.0f,
                 heads_hm, hs, q_stride, count);
    gpu_rows_from_heads(out, heads_hm, B, Tq, C, NH);
}

// attention_backward for every sentence and head at once: dout (B, Tq, C) in
// rows, dq (B, NH, Tq, hs), dk and dv (B, NH, Tk, hs) written head-major;
// d_att (B, NH, Tq, Tk) holds dp, then ds; dout_hm is scratch (B, NH, Tq, hs).
static void gpu_attention_backward(float *dq, float *dk, float *dv, float *d_att, float *dout_hm,
                                   const float *dout, const float *att, const float *q,
                                   const float *k, const float *v, int B, int Tq, int Tk, int C,
                                   int NH) {
    int hs = C / NH, count = B * NH;
    gpu_heads_from_rows(dout_hm, dout, NULL, C, 1, B, Tq, C, NH);
    long long q_stride = (long long)Tq * hs, kv_stride = (long long)Tk * hs,
              att_stride = (long long)Tq * Tk;
    float scale = 1 / sqrtf((float)hs);
    // dp_ij = dout_i . v_j:  dp^T (Tk x Tq) = V (Tk x hs, stored V^T: T) dout^T (hs x Tq, N)
    gemm_batched(OP_T, OP_N, Tk, Tq, hs, 1.0f, v, hs, kv_stride, dout_hm, hs, q_stride, 0.0f, d_att,
                 Tk, att_stride, count);
    // dv_j = sum_i p_ij dout_i:  dv^T (hs x Tk) = dout^T (hs x Tq, N) P (Tq x Tk, stored P^T: T)
    gemm_batched(OP_N, OP_T, hs, Tk, Tq, 1.0f, dout_hm, hs, q_stride, att, Tk, att_stride, 0.0f, dv,
                 hs, kv_stride, count);
    LAUNCH_ROWS((size_t)count * Tq, softmax_backward_kernel, d_att, att, (size_t)count * Tq, Tk);
    // dq_i = sum_j ds_ij k_j / sqrt(d_k):  dq^T (hs x Tq) = K^T (hs x Tk, N) ds^T (Tk x Tq, N)
    gemm_batched(OP_N, OP_N, hs, Tq, Tk, scale, k, hs, kv_stride, d_att, Tk, att_stride, 0.0f, dq,
                 hs, q_stride, count);
    // dk_j = sum_i ds_ij q_i / sqrt(d_k):
    //     dk^T (hs x Tk) = Q^T (hs x Tq, N) ds (Tq x Tk, stored ds^T: T)
    gemm_batched(OP_N, OP_T, hs, Tk, Tq, scale, q, hs, q_stride, d_att, Tk, att_stride, 0.0f, dk,
                 hs, kv_stride, count);
}

// attention_forward in one launch (fused_attention.cu): q, k, v read from their
// projections' rows with their biases (in), out (B, Tq, C) in rows, att the probabilities
static void gpu_fused_attention_forward(float *out, float *att, AttentionInRows in,
                                        FusedShape shape, int B, int NH) {
    LAUNCH(fused_attention_forward_kernel, xyz((unsigned)NH, (unsigned)B, 1), THREADS,
           fused_forward_bytes(shape.Tk, shape.hs), out, att, in, shape);
}

// attention_backward in one launch: dq, dk, dv into the places g names, in the
// projections' rows, and their biases' gradients into g.dbias (3C)
static void gpu_fused_attention_backward(AttentionGradsInRows g, const float *dout,
                                         const float *att, AttentionInRows in, FusedShape shape,
                                         int B, int NH) {
    g.partials = gpu.scratch.d_attention_bias;
    g.heads_done = gpu.attention_heads_done;
    LAUNCH(fused_attention_backward_kernel, xyz((unsigned)NH, (unsigned)B, 1), THREADS,
           fused_backward_bytes(shape.Tq, shape.Tk, shape.hs), g, gpu.scratch.d_att, dout, att, in,
           shape);
}

// dq, dk, dv (`parts` of them, head-major) back in rows (N, ld) at column
// `column0`, and their bias's gradient
static void gpu_rows_from_heads_backward(float *drows, int ld, int column0, float *dbias,
                                         const float *dheads, int parts, int B, int T, int C,
                                         int NH) {
    LAUNCH_COLUMNS((size_t)parts * C, (size_t)B * T, rows_from_heads_bias_backward_kernel,
                   drows + column0, dbias, gpu.columns, dheads, ld, parts, B, T, C, NH);
}

// Where the fused attention reads a self-attention's q, k, v: the rows (B*T, 3C) of qkv,
// before its bias
static AttentionInRows self_attention_rows(const float *qkv, const float *qkv_b, int C) {
    AttentionInRows in = { qkv, qkv + C, qkv + 2 * C, qkv_b, qkv_b + C, qkv_b + 2 * C, 3 * C,
                           3 * C };
    return in;
}

// self_attention_forward: qkv = x W_qkv^T + b;  heads = Attention(q, k, v);
//     out = heads W^O^T (+ b^O by the norm)
// qkv_hm gets q, k, v head-major, or with the fused attention the rows of qkv without b
static void gpu_self_attention_forward(float *out, float *qkv_hm, float *att, float *heads,
                                       const float *x, GpuAttentionParams w, const int *len,
                                       int causal, int B, int T, int C, int NH) {
    GpuScratch *s = &gpu.scratch;
    size_t n = (size_t)B * T * C;
    if (gpu_fused_fits(T, T, C / NH)) {
        gpu_linear_forward(qkv_hm, x, w.qkv_w, B * T, C, 3 * C);
        AttentionInRows in = self_attention_rows(qkv_hm, w.qkv_b, C);
        FusedShape shape = { len, causal, T, T, C / NH };
        gpu_fused_attention_forward(heads, att, in, shape, B, NH);
        gpu_linear_forward(out, heads, w.out_w, B * T, C, C);
        return;
    }
    gpu_linear_forward(s->d_qkv, x, w.qkv_w, B * T, C, 3 * C);
    gpu_heads_from_rows(qkv_hm, s->d_qkv, w.qkv_b, 3 * C, 3, B, T, C, NH);
    gpu_attention_forward(heads, att, s->d_heads_hm, qkv_hm, qkv_hm + n, qkv_hm + 2 * n, len,
                          causal, B, T, T, C, NH);
    gpu_linear_forward(out, heads, w.out_w, B * T, C, C);
}

// self_attention_backward, given dout (of out, before the norm's bias): dx += ...
static void gpu_self_attention_backward(float *dx, GpuAttentionParams g, const float *dout,
                                        const float *qkv_hm, const float *att, const float *heads,
                                        const float *x, GpuAttentionParams w, int B, int T, int C,
                                        int NH) {
    GpuScratch *s = &gpu.scratch;
    size_t n = (size_t)B * T * C;
    gpu_linear_backward(s->d_heads, 0, g.out_w, dout, heads, w.out_w, B * T, C, C);
    if (gpu_fused_fits(T, T, C / NH)) {   // qkv_hm holds qkv's rows; d_qkv gets theirs, and g.qkv_b
        AttentionInRows in = self_attention_rows(qkv_hm, w.qkv_b, C);
        AttentionGradsInRows d = { s->d_qkv, s->d_qkv + C, s->d_qkv + 2 * C, g.qkv_b, NULL, NULL };
        FusedShape shape = { NULL, 0, T, T, C / NH };
        gpu_fused_attention_backward(d, s->d_heads, att, in, shape, B, NH);
        gpu_linear_backward(dx, 1, g.qkv_w, s->d_qkv, x, w.qkv_w, B * T, C, 3 * C);
        return;
    }
    gpu_attention_backward(s->d_qkv_hm, s->d_qkv_hm + n, s->d_qkv_hm + 2 * n, s->d_att,
                           s->d_heads_hm, s->d_heads, att, qkv_hm, qkv_hm + n, qkv_hm + 2 * n, B, T,
                           T, C, NH);
    gpu_rows_from_heads_backward(s->d_qkv, 3 * C, 0, g.qkv_b, s->d_qkv_hm, 3, B, T, C, NH);
    gpu_linear_backward(dx, 1, g.qkv_w, s->d_qkv, x, w.qkv_w, B * T, C, 3 * C);
}

// cross_attention_forward: q from the decoder (its keys and values, from the
// memory, were computed for every layer at once: kv_hm is this layer's,
// head-major, or with the fused attention its columns of the projection's rows)
static void gpu_cross_attention_forward(float *out, float *q_hm, float *att, float *heads,
                                        const float *x, const float *kv_hm, GpuAttentionParams w,
                                        const int *src_len, int B, int T, int S, int C, int NH) {
    GpuScratch *s = &gpu.scratch;
    if (gpu_fused_fits(T, S, C / NH)) {   // q_hm gets q's rows without b^Q
        gpu_linear_forward(q_hm, x, w.qkv_w, B * T, C, C);
        int ld_kv = 2 * C * gpu.config.n_layers;
        AttentionInRows in = { q_hm, kv_hm, kv_hm + C, w.qkv_b, w.qkv_b + C, w.qkv_b + 2 * C, C,
                               ld_kv };
        FusedShape shape = { src_len, 0, T, S, C / NH };
        gpu_fused_attention_forward(heads, att, in, shape, B, NH);
        gpu_linear_forward(out, heads, w.out_w, B * T, C, C);
        return;
    }
    gpu_linear_forward(s->d_heads, x, w.qkv_w, B * T, C, C);
    gpu_heads_from_rows(q_hm, s->d_heads, w.qkv_b, C, 1, B, T, C, NH);
    gpu_attention_forward(heads, att, s->d_heads_hm, q_hm, kv_hm, kv_hm + (size_t)B * S * C,
                          src_len, 0, B, T, S, C, NH);
    gpu_linear_forward(out, heads, w.out_w, B * T, C, C);
}

// Where layer l's keys and values of the memory start in gpu.memory_kv: l times
// this. Head-major, a layer is (2, B, NH, S, hs); with the fused attention, the
// rows of the product (B*S, L*2C), 2C columns a layer.
static size_t gpu_memory_kv_layer(const TransformerConfig *c, int B, int S, int T) {
    if (gpu_fused_fits(T, S, c->d_model / c->n_heads))
        return (size_t)2 * c->d_model;
    return (size_t)2 * B * S * c->d_model;
}

// cross_attention_backward: dx += ...; the keys' and values' gradient goes to
// this layer's columns of d_memory_kv, their bias's gradient to g (the product
// with the memory waits for every layer: gpu_memory_backward)
static void gpu_cross_attention_backward(float *dx, GpuAttentionParams g, int layer,
                                         const float *dout, const float *q_hm, const float *kv_hm,
                                         const float *att, const float *heads, const float *x,
                                         GpuAttentionParams w, int B, int T, int S, int C, int NH,
                                         int L) {
    GpuScratch *s = &gpu.scratch;
    size_t n_q = (size_t)B * T * C, n_kv = (size_t)B * S * C;
    float *dq_hm = s->d_qkv_hm, *dk_hm = dq_hm + n_q, *dv_hm = dk_hm + n_kv;
    gpu_linear_backward(s->d_heads, 0, g.out_w, dout, heads, w.out_w, B * T, C, C);
    if (gpu_fused_fits(T, S, C / NH)) {   // dq's rows into d_qkv, dk's and
                                          // dv's into this layer's columns
        float *d_kv = s->d_memory_kv + (size_t)2 * C * layer;
        AttentionInRows in = { q_hm, kv_hm, kv_hm + C, w.qkv_b, w.qkv_b + C, w.qkv_b + 2 * C, C,
                               2 * C * L };
        AttentionGradsInRows d = { s->d_qkv, d_kv, d_kv + C, g.qkv_b, NULL, NULL };
        FusedShape shape = { NULL, 0, T, S, C / NH };
        gpu_fused_attention_backward(d, s->d_heads, att, in, shape, B, NH);
        gpu_linear_backward(dx, 1, g.qkv_w, s->d_qkv, x, w.qkv_w, B * T, C, C);
        return;
    }
    gpu_attention_backward(dq_hm, dk_hm, dv_hm, s->d_att, s->d_heads_hm, s->d_heads, att, q_hm,
                           kv_hm, kv_hm + n_kv, B, T, S, C, NH);
    gpu_rows_from_heads_backward(s->d_heads, C, 0, g.qkv_b, dq_hm, 1, B, T, C, NH);
    gpu_rows_from_heads_backward(s->d_memory_kv, 2 * C * L, 2 * C * layer, g.qkv_b + C, dk_hm, 2, B,
                                 S, C, NH);
    gpu_linear_backward(dx, 1, g.qkv_w, s->d_heads, x, w.qkv_w, B * T, C, C);
}

// feed_forward_forward: hidden = max(0, x W_1^T + b_1);  out = hidden W_2^T (+ b_2 by the norm).
// The bias and the ReLU in the product's epilogue where cuBLASLt has one, writing
// the mask (*mask_written: whether it did; mask NULL: never), else in a kernel.
static void gpu_feed_forward_forward(float *out, float *hidden, unsigned char *mask,
                                     int *mask_written, const float *x, GpuLayerParams w, int N,
                                     int C, int F) {
    *mask_written = mask && gpu_relu_bias_product(hidden, mask, x, w.ff1_w, w.ff1_b, N, C, F);
    if (!*mask_written) {
        gpu_linear_forward(hidden, x, w.ff1_w, N, C, F);
        LAUNCH_ELEMENTS((size_t)N * F, bias_relu_forward_kernel, hidden, w.ff1_b, (size_t)N, F);
    }
    gpu_linear_forward(out, hidden, w.ff2_w, N, F, C);
}

// feed_forward_backward: dx += ... With the forward's mask (NULL: none), W_2's
// input gradient, the ReLU's and b_1's in one cuBLASLt product, else a kernel after it.
static void gpu_feed_forward_backward(float *dx, GpuLayerParams g, const float *dout,
                                      const float *hidden, unsigned char *mask, const float *x,
                                      GpuLayerParams w, int N, int C, int F) {
    float *d_hidden = gpu.scratch.d_ff_h;   // (N, F)
    ReluBackward relu = { mask, g.ff1_b };
    int fused = gpu_linear_relu_backward(d_hidden, 0, g.ff2_w, dout, hidden, w.ff2_w, N, F, C,
                                         mask ? &relu : NULL);
    if (!fused)
        LAUNCH_COLUMNS(F, N, relu_bias_backward_kernel, d_hidden, g.ff1_b, gpu.columns, hidden, N,
                       F);
    gpu_linear_backward(dx, 1, g.ff1_w, d_hidden, x, w.ff1_w, N, C, F);
}

// ---- the layers' parameters ----------------------------------------------------

// Layer l of the tensor whose host copy starts at host_tensor (a pointer into
// the host's params_memory), in the GPU arena `arena` of the same layout.
static float *on_gpu(float *arena, const Transformer *m, const real *host_tensor, size_t l,
                     size_t per_layer) {
    return arena + (host_tensor - m->params_memory) + l * per_layer;
}

static GpuAttentionParams gpu_attention_params(float *arena, const Transformer *m,
                                               const real *qkv_w, const real *qkv_b,
                                               const real *out_w, const real *out_b, size_t l) {
    size_t C = m->config.d_model;
    GpuAttentionParams a = { on_gpu(arena, m, qkv_w, l, 3 * C * C),
                             on_gpu(arena, m, qkv_b, l, 3 * C), on_gpu(arena, m, out_w, l, C * C),
                             on_gpu(arena, m, out_b, l, C) };
    return a;
}

// encoder_layer_params: arena is gpu.params or gpu.grads
static GpuLayerParams gpu_encoder_params(float *arena, const Transformer *m, size_t l) {
    const ParameterTensors *p = &m->params;
    size_t C = m->config.d_model, F = m->config.d_ff;
    GpuLayerParams e;
    memset(&e, 0, sizeof e);
    e.self_attn = gpu_attention_params(arena, m, p->enc_qkv_w, p->enc_qkv_b, p->enc_out_w,
                                       p->enc_out_b, l);
    e.ln1_g = on_gpu(arena, m, p->enc_ln1_g, l, C);
    e.ln1_b = on_gpu(arena, m, p->enc_ln1_b, l, C);
    e.ff1_w = on_gpu(arena, m, p->enc_ff1_w, l, F * C);
    e.ff1_b = on_gpu(arena, m, p->enc_ff1_b, l, F);
    e.ff2_w = on_gpu(arena, m, p->enc_ff2_w, l, C * F);
    e.ff2_b = on_gpu(arena, m, p->enc_ff2_b, l, C);
    e.ln2_g = on_gpu(arena, m, p->enc_ln2_g, l, C);
    e.ln2_b = on_gpu(arena, m, p->enc_ln2_b, l, C);
    return e;
}

// decoder_layer_params
static GpuLayerParams gpu_decoder_params(float *arena, const Transformer *m, size_t l) {
    const ParameterTensors *p = &m->params;
    size_t C = m->config.d_model, F = m->config.d_ff;
    GpuLayerParams d;
    d.self_attn = gpu_attention_params(arena, m, p->dec_self_qkv_w, p->dec_self_qkv_b,
                                       p->dec_self_out_w, p->dec_self_out_b, l);
    d.cross_attn = gpu_attention_params(arena, m, p->dec_cross_qkv_w, p->dec_cross_qkv_b,
                                        p->dec_cross_out_w, p->dec_cross_out_b, l);
    d.ln1_g = on_gpu(arena, m, p->dec_ln1_g, l, C);
    d.ln1_b = on_gpu(arena, m, p->dec_ln1_b, l, C);
    d.ln2_g = on_gpu(arena, m, p->dec_ln2_g, l, C);
    d.ln2_b = on_gpu(arena, m, p->dec_ln2_b, l, C);
    d.ln3_g = on_gpu(arena, m, p->dec_ln3_g, l, C);
    d.ln3_b = on_gpu(arena, m, p->dec_ln3_b, l, C);
    d.ff1_w = on_gpu(arena, m, p->dec_ff1_w, l, F * C);
    d.ff1_b = on_gpu(arena, m, p->dec_ff1_b, l, F);
    d.ff2_w = on_gpu(arena, m, p->dec_ff2_w, l, C * F);
    d.ff2_b = on_gpu(arena, m, p->dec_ff2_b, l, C);
    return d;
}

// ---- the batch's memory -----------------------------------------------------------


// ---- the batch's memory -----------------------------------------------------------

// Tensors cut one after another from an allocation (base NULL: only counts).
// On a GPU each starts on a 256-byte boundary, as cudaMalloc's do. On the CPU
// (cuda_on_cpu.h) each ends where a page starts and is followed by a guard
// page of its own (cpu_guard_tensor, `name` in its messages), so that a kernel
// reaching past one tensor into the next stops there; the allocation then
// starts on a page (its size is a multiple of the page: arena_floats).
typedef struct {
    float *base;
    size_t used;
} Carver;
static float *carve(Carver *c, size_t floats, const char *name) {
#ifdef CUDA_ON_CPU
    size_t page = cpu_page_bytes() / sizeof(float),
           start = (c->used + floats + page - 1) / page * page - floats;
    c->used = start + floats + page;
    if (c->base)
        cpu_guard_tensor(c->base + start, floats * sizeof(float), name);
#else
    size_t start = c->used;
    c->used += (floats + 63) / 64 * 64;
    (void)name;
#endif
    return c->base ? c->base + start : NULL;
}
static size_t arena_floats(size_t floats) {
#ifdef CUDA_ON_CPU
    size_t page = cpu_page_bytes() / sizeof(float);
    return (floats + page - 1) / page * page;
#else
    return floats;
#endif
}

// The activations of a (B, S, T) batch, then the scratch; returns the floats used.
static size_t gpu_carve_batch(Carver *a, const TransformerConfig *c, int B, int S, int T) {
    size_t L = c->n_layers, C = c->d_model, F = c->d_ff, NH = c->n_heads, V = c->vocab_size;
    size_t BS = (size_t)B * S, BT = (size_t)B * T, rows = BS > BT ? BS : BT,
           longest = S > T ? S : T;
    gpu.enc_x0 = carve(a, BS * C, "enc_x0");
    gpu.dec_x0 = carve(a, BT * C, "dec_x0");
    for (size_t l = 0; l < L; l++) {
        GpuEncoderActs *e = &gpu.enc[l];
        e->qkv = carve(a, 3 * BS * C, "enc.qkv");
        e->att = carve(a, B * NH * S * S, "enc.att");
        e->heads = carve(a, BS * C, "enc.heads");
        e->res1 = carve(a, BS * C, "enc.res1");
        e->ln1 = carve(a, BS * C, "enc.ln1");
        e->ln1_mean = carve(a, BS, "enc.ln1_mean");
        e->ln1_rstd = carve(a, BS, "enc.ln1_rstd");
        e->ff_h = carve(a, BS * F, "enc.ff_h");
        e->res2 = carve(a, BS * C, "enc.res2");
        e->ln2 = carve(a, BS * C, "enc.ln2");
        e->ln2_mean = carve(a, BS, "enc.ln2_mean");
        e->ln2_rstd = carve(a, BS, "enc.ln2_rstd");
        e->ff_mask =
            gpu.lt ? (unsigned char *)carve(a, relu_mask_floats(BS, (int)F), "enc.ff_mask") : NULL;
        GpuDecoderActs *d = &gpu.dec[l];
        d->self_qkv = carve(a, 3 * BT * C, "dec.self_qkv");
        d->self_att = carve(a, B * NH * T * T, "dec.self_att");
        d->self_heads = carve(a, BT * C, "dec.self_heads");
        d->res1 = carve(a, BT * C, "dec.res1");
        d->ln1 = carve(a, BT * C, "dec.ln1");
        d->ln1_mean = carve(a, BT, "dec.ln1_mean");
        d->ln1_rstd = carve(a, BT, "dec.ln1_rstd");
        d->cross_q = carve(a, BT * C, "dec.cross_q");
        d->cross_att = carve(a, B * NH * T * S, "dec.cross_att");
        d->cross_heads = carve(a, BT * C, "dec.cross_heads");
        d->res2 = carve(a, BT * C, "dec.res2");
        d->ln2 = carve(a, BT * C, "dec.ln2");
        d->ln2_mean = carve(a, BT, "dec.ln2_mean");
        d->ln2_rstd = carve(a, BT, "dec.ln2_rstd");
        d->ff_h = carve(a, BT * F, "dec.ff_h");
        d->res3 = carve(a, BT * C, "dec.res3");
        d->ln3 = carve(a, BT * C, "dec.ln3");
        d->ln3_mean = carve(a, BT, "dec.ln3_mean");
        d->ln3_rstd = carve(a, BT, "dec.ln3_rstd");
        d->ff_mask =
            gpu.lt ? (unsigned char *)carve(a, relu_mask_floats(BT, (int)F), "dec.ff_mask") : NULL;
    }
    gpu.memory_kv = carve(a, L * 2 * BS * C, "memory_kv");
    gpu.logits = carve(a, BT * V, "logits");
    gpu.token_loss = carve(a, BT, "token_loss");
    gpu.loss = carve(a, 1, "loss");
    gpu.activation_floats = a->used;
    GpuScratch *s = &gpu.scratch;
    s->d_dec = carve(a, BT * C, "d_dec");
    s->d_enc = carve(a, BS * C, "d_enc");
    s->d_mid1 = carve(a, rows * C, "d_mid1");
    s->d_mid2 = carve(a, BT * C, "d_mid2");
    s->d_sublayer = carve(a, rows * C, "d_sublayer");
    s->d_heads = carve(a, rows * C, "d_heads");
    s->d_heads_hm = carve(a, rows * C, "d_heads_hm");
    s->d_qkv_hm = carve(a, 3 * rows * C, "d_qkv_hm");
    s->d_qkv = carve(a, 3 * rows * C, "d_qkv");
    s->d_ff_h = carve(a, rows * F, "d_ff_h");
    s->d_att = carve(a, B * NH * longest * longest, "d_att");
    s->d_memory_kv = carve(a, BS * L * 2 * C, "d_memory_kv");
    s->d_logits = carve(a, BT * V, "d_logits");
    s->d_attention_bias = carve(a, (size_t)B * 3 * C, "d_attention_bias");
    s->d_norm_partials = carve(a, 3 * blocks_for(rows, NORM_CHUNK_ROWS) * C, "d_norm_partials");
    gpu.scratch_floats = a->used - gpu.activation_floats;
    return a->used;
}

static void gpu_forget_graphs(void);

// The step's upload, laid out for (B, S, T): StepValues, the dropout keys (8-byte
// aligned), then the ints: the tokens and lengths, and for embedding_backward_kernel
// the token ids, where each token's rows start (and the end), the rows. Its bytes
// (base NULL: only counts); sets gpu's device pointers into it when base is given.
static size_t gpu_lay_out_upload(unsigned char *base, int B, int S, int T, int L) {
    size_t keys = 2 + 5 * (size_t)L, tokens = (size_t)B * (S + T);
    size_t key_at = (sizeof(StepValues) + 7) / 8 * 8, ints_at = key_at + keys * sizeof(uint64_t);
    size_t ints = tokens + (size_t)B * T + 2 * (size_t)B + 3 * tokens + 1;
    if (base) {
        gpu.step = (StepValues *)base;
        gpu.dropout_keys = (uint64_t *)(base + key_at);
        int *at = (int *)(base + ints_at);
        gpu.src = at;
        at += (size_t)B * S;
        gpu.tgt_in = at;
        at += (size_t)B * T;
        gpu.tgt_out = at;
        at += (size_t)B * T;
        gpu.src_len = at;
        at += B;
        gpu.tgt_len = at;
        at += B;
        gpu.token_ids = at;
        at += tokens;
        gpu.token_first = at;
        at += tokens + 1;
        gpu.token_rows = at;
    }
    return ints_at + ints * sizeof(int);
}

// The batch's memory on the GPU: the activations and scratch for this (B, S,
// T), cut from one allocation that is replaced only when a batch needs more
// than it holds (then a quarter more, for the batches to come), and the
// step's upload (gpu_lay_out_upload), grown the same way. The tensors are cut
// again only when the shape changes. When either allocation moves, the
// captured steps, which point into it, are dropped.
static void gpu_ensure_batch(const TransformerConfig *c, int B, int S, int T) {
    if (gpu.batch_memory && B == gpu.B && S == gpu.S && T == gpu.T)
        return;
    Carver count = { NULL, 0 };
    size_t need = gpu_carve_batch(&count, c, B, S, T);
    if (need > gpu.batch_capacity) {
        gpu_forget_graphs();
        CUDA_CHECK(cudaFree(gpu.batch_memory));
        CUDA_CHECK(cudaFree(gpu.batch_bf16));
        gpu.batch_capacity = arena_floats(gpu.batch_memory ? need + need / 4 : need);
        gpu.batch_memory = (float *)gpu_alloc(gpu.batch_capacity * sizeof(float));
        gpu.batch_bf16 = gpu.bf16
            ? (__nv_bfloat16 *)gpu_alloc(gpu.batch_capacity * sizeof(__nv_bfloat16))
            : NULL;
    }
#ifdef CUDA_ON_CPU
    cpu_forget_tensors(gpu.batch_memory);   // the guards of the last shape's tensors
#endif
    Carver cut = { gpu.batch_memory, 0 };
    gpu_carve_batch(&cut, c, B, S, T);
    size_t upload = gpu_lay_out_upload(NULL, B, S, T, c->n_layers);
    if (upload > gpu.upload_capacity) {
        gpu_forget_graphs();
        CUDA_CHECK(cudaFree(gpu.upload));
        CUDA_CHECK(cudaFreeHost(gpu.upload_host));
        gpu.upload_capacity = gpu.upload ? upload + upload / 4 : upload;
        gpu.upload = (unsigned char *)gpu_alloc(gpu.upload_capacity);
        CUDA_CHECK(cudaMallocHost((void **)&gpu.upload_host, gpu.upload_capacity));
        gpu_counts.allocations++;
    }
    gpu.upload_bytes = gpu_lay_out_upload(gpu.upload, B, S, T, c->n_layers);
    gpu.B = B;
    gpu.S = S;
    gpu.T = T;
}

// Everything of a step that the host decides, into the upload's host side:
// the batch, each distinct token's positions for embedding_backward_kernel
// (rows: the target's first, then the source's, in order, by counting sort),
// the dropout keys (drawn from the host model's generator as transformer.c
// draws them, so the masks are its masks), Adam's step size and bias
// correction for step adam_step + 1 at `learning_rate` (in double, as
// transformer.c), and 1/n. Counts the step (adam_step) and its target tokens.
static void gpu_prepare_step(Transformer *m, const Batch *batch, double learning_rate) {
    int B = batch->B, S = batch->S, T = batch->T, BT = B * T, rows = B * (S + T),
        L = m->config.n_layers;
    unsigned char *host = gpu.upload_host;
    size_t ints_at = (size_t)((unsigned char *)gpu.src - gpu.upload);
    int *next = (int *)(host + ints_at), *count = gpu.token_count, distinct = 0;
    const int *fields[5] = { batch->src, batch->tgt_in, batch->tgt_out, batch->src_len,
                             batch->tgt_len };
    size_t sizes[5] = { (size_t)B * S, (size_t)BT, (size_t)BT, (size_t)B, (size_t)B };
    for (int f = 0; f < 5; f++) {
        memcpy(next, fields[f], sizes[f] * sizeof(int));
        next += sizes[f];
    }
    int *ids = next, *first = ids + rows, *list = first + rows + 1;
    for (int r = 0; r < rows; r++) {
        int token = r < BT ? batch->tgt_in[r] : batch->src[r - BT];
        if (count[token]++ == 0)
            ids[distinct++] = token;
    }
    first[0] = 0;
    for (int k = 0; k < distinct; k++) {
        first[k + 1] = first[k] + count[ids[k]];
        count[ids[k]] = first[k];
    }
    for (int r = 0; r < rows; r++) {   // count[token] is now where its next row goes
        int token = r < BT ? batch->tgt_in[r] : batch->src[r - BT];
        list[count[token]++] = r;
    }
    for (int k = 0; k < distinct; k++) count[ids[k]] = 0;
    // the dropout keys: the source's embeddings, each encoder layer's two sub-layers,
    // the target's embeddings, each decoder layer's three
    // (a rank of a data-parallel run draws them from its own generator, then the run's moves
    // on as rank 0's did: lab/ranks.c, as its CPU step)
    uint64_t *keys = (uint64_t *)(host + ((unsigned char *)gpu.dropout_keys - gpu.upload));
    int dropout = m->training && m->config.dropout > 0.0f;
    Rng run_generator = m->dropout_rng;
    m->dropout_rng.state = lab_rank_dropout_state(run_generator.state);
    for (int k = 0; k < 2 + 5 * L; k++) keys[k] = dropout ? transformer_dropout_key(m) : 0;
    m->dropout_rng = run_generator;
    for (int k = 0; dropout && k < 2 + 5 * L; k++) transformer_dropout_key(m);
    m->B = B;
    m->S = S;
    m->T = T;
    m->num_target_tokens = 0;
    for (int b = 0; b < B; b++) m->num_target_tokens += batch->tgt_len[b];
    // the loss is the mean over the whole batch's targets, every rank's share (§5.4): each
    // rank's part of it, and of the gradients, divides by their count
    long batch_targets = lab_ranks_sum(m->num_target_tokens);
    m->adam_step++;
    double b1 = m->adam.beta1, b2 = m->adam.beta2;
    double correction1 = 1.0 - pow(b1, (double)m->adam_step),
           correction2 = 1.0 - pow(b2, (double)m->adam_step);
    StepValues *step = (StepValues *)host;
    step->adam_step_size = (float)(learning_rate / correction1);
    step->adam_rsqrt_c2 = (float)(1.0 / sqrt(correction2));
    step->inv_n = batch_targets ? (float)(1.0 / (double)batch_targets) : 0.0f;
    step->distinct_tokens = distinct;
}

// The Dropout of each sub-layer (its key's place among the step's, its rate):
// the same for every step of a model that trains, or does not.
static void gpu_set_dropouts(const Transformer *m) {
    int L = m->config.n_layers;
    gpu.enc_drop = gpu_dropout(m, 0);
    for (int l = 0; l < L; l++) {
        gpu.enc[l].drop1 = gpu_dropout(m, 1 + 2 * l);
        gpu.enc[l].drop2 = gpu_dropout(m, 2 + 2 * l);
    }
    gpu.dec_drop = gpu_dropout(m, 1 + 2 * L);
    for (int l = 0; l < L; l++) {
        gpu.dec[l].drop1 = gpu_dropout(m, 2 + 2 * L + 3 * l);
        gpu.dec[l].drop2 = gpu_dropout(m, 3 + 2 * L + 3 * l);
        gpu.dec[l].drop3 = gpu_dropout(m, 4 + 2 * L + 3 * l);
    }
}
// ============================================================================
// The layers, the whole forward pass, the whole backward pass, Adam
// ============================================================================

// encoder_layer_forward
static void gpu_encoder_layer_forward(GpuEncoderActs *la, const float *x, GpuLayerParams w,
                                      Transformer *m, int B, int S) {
    const TransformerConfig *c = &m->config;
    int C = c->d_model, N = B * S;
    float *sublayer = gpu.scratch.d_sublayer;
    gpu_self_attention_forward(sublayer, la->qkv, la->att, la->heads, x, w.self_attn, gpu.src_len,
                               0, B, S, C, c->n_heads);
    gpu_add_norm_forward(la->ln1, la->ln1_mean, la->ln1_rstd, la->res1, x, sublayer,
                         w.self_attn.out_b, la->drop1, w.ln1_g, w.ln1_b, c, N);
    gpu_feed_forward_forward(sublayer, la->ff_h, la->ff_mask, &la->ff_mask_written, la->ln1, w, N,
                             C, c->d_ff);
    gpu_add_norm_forward(la->ln2, la->ln2_mean, la->ln2_rstd, la->res2, la->ln1, sublayer, w.ff2_b,
                         la->drop2, w.ln2_g, w.ln2_b, c, N);
}

// encoder_layer_backward: dx (written) given dout
static void gpu_encoder_layer_backward(float *dx, GpuLayerParams g, const float *dout,
                                       const GpuEncoderActs *la, const float *x, GpuLayerParams w,
                                       const TransformerConfig *c, int B, int S) {
    GpuScratch *s = &gpu.scratch;
    int C = c->d_model, N = B * S;
    gpu_residual_layernorm_backward(s->d_mid1, s->d_sublayer, g.ln2_g, g.ln2_b, g.ff2_b, dout,
                                    la->res2, la->drop2, w.ln2_g, la->ln2_mean, la->ln2_rstd, N, C);
    gpu_feed_forward_backward(s->d_mid1, g, s->d_sublayer, la->ff_h,
                              la->ff_mask_written ? la->ff_mask : NULL, la->ln1, w, N, C, c->d_ff);
    gpu_residual_layernorm_backward(dx, s->d_sublayer, g.ln1_g, g.ln1_b, g.self_attn.out_b,
                                    s->d_mid1, la->res1, la->drop1, w.ln1_g, la->ln1_mean,
                                    la->ln1_rstd, N, C);
    gpu_self_attention_backward(dx, g.self_attn, s->d_sublayer, la->qkv, la->att, la->heads, x,
                                w.self_attn, B, S, C, c->n_heads);
}

// decoder_layer_forward (the keys and values of the memory: gpu_memory_forward)
static void gpu_decoder_layer_forward(GpuDecoderActs *la, const float *y, const float *kv_hm,
                                      GpuLayerParams w, Transformer *m, int B, int S, int T) {
    const TransformerConfig *c = &m->config;
    int C = c->d_model, N = B * T, NH = c->n_heads;
    float *sublayer = gpu.scratch.d_sublayer;
    gpu_self_attention_forward(sublayer, la->self_qkv, la->self_att, la->self_heads, y, w.self_attn,
                               gpu.tgt_len, 1, B, T, C, NH);
    gpu_add_norm_forward(la->ln1, la->ln1_mean, la->ln1_rstd, la->res1, y, sublayer,
                         w.self_attn.out_b, la->drop1, w.ln1_g, w.ln1_b, c, N);
    gpu_cross_attention_forward(sublayer, la->cross_q, la->cross_att, la->cross_heads, la->ln1,
                                kv_hm, w.cross_attn, gpu.src_len, B, T, S, C, NH);
    gpu_add_norm_forward(la->ln2, la->ln2_mean, la->ln2_rstd, la->res2, la->ln1, sublayer,
                         w.cross_attn.out_b, la->drop2, w.ln2_g, w.ln2_b, c, N);
    gpu_feed_forward_forward(sublayer, la->ff_h, la->ff_mask, &la->ff_mask_written, la->ln2, w, N,
                             C, c->d_ff);
    gpu_add_norm_forward(la->ln3, la->ln3_mean, la->ln3_rstd, la->res3, la->ln2, sublayer, w.ff2_b,
                         la->drop3, w.ln3_g, w.ln3_b, c, N);
}

// decoder_layer_backward: dy (written) given dout, which it may be
static void gpu_decoder_layer_backward(float *dy, GpuLayerParams g, int layer, const float *dout,
                                       const GpuDecoderActs *la, const float *y, const float *kv_hm,
                                       GpuLayerParams w, const TransformerConfig *c, int B, int S,
                                       int T) {
    GpuScratch *s = &gpu.scratch;
    int C = c->d_model, N = B * T, NH = c->n_heads;
    gpu_residual_layernorm_backward(s->d_mid2, s->d_sublayer, g.ln3_g, g.ln3_b, g.ff2_b, dout,
                                    la->res3, la->drop3, w.ln3_g, la->ln3_mean, la->ln3_rstd, N, C);
    gpu_feed_forward_backward(s->d_mid2, g, s->d_sublayer, la->ff_h,
                              la->ff_mask_written ? la->ff_mask : NULL, la->ln2, w, N, C, c->d_ff);
    gpu_residual_layernorm_backward(s->d_mid1, s->d_sublayer, g.ln2_g, g.ln2_b, g.cross_attn.out_b,
                                    s->d_mid2, la->res2, la->drop2, w.ln2_g, la->ln2_mean,
                                    la->ln2_rstd, N, C);
    gpu_cross_attention_backward(s->d_mid1, g.cross_attn, layer, s->d_sublayer, la->cross_q, kv_hm,
                                 la->cross_att, la->cross_heads, la->ln1, w.cross_attn, B, T, S, C,
                                 NH, c->n_layers);
    gpu_residual_layernorm_backward(dy, s->d_sublayer, g.ln1_g, g.ln1_b, g.self_attn.out_b,
                                    s->d_mid1, la->res1, la->drop1, w.ln1_g, la->ln1_mean,
                                    la->ln1_rstd, N, C);
    gpu_self_attention_backward(dy, g.self_attn, s->d_sublayer, la->self_qkv, la->self_att,
                                la->self_heads, y, w.self_attn, B, T, C, NH);
}

// cross_attention_forward's keys and values for every decoder layer at once
// (they all read the same memory): W^K, W^V of each layer gathered into
// memory_kv_w (L*2C, C), one product (B*S, L*2C), then head-major with the
// biases; with the fused attention, the product's rows are gpu.memory_kv.
static void gpu_memory_forward(const float *memory, Transformer *m, int B, int S) {
    const TransformerConfig *c = &m->config;
    int C = c->d_model, L = c->n_layers, NS = B * S;
    float *cross_w = on_gpu(gpu.params, m, m->params.dec_cross_qkv_w, 0, 0);
    float *cross_b = on_gpu(gpu.params, m, m->params.dec_cross_qkv_b, 0, 0);
    size_t layer_weights = (size_t)3 * C * C, kv_weights = (size_t)2 * C * C;
    // (--bf16: their bf16 copies, which the products read, into memory_kv_w_bf16)
    size_t number = gpu.bf16 ? sizeof(__nv_bfloat16) : sizeof(float);
    void *gathered = gpu.bf16 ? (void *)gpu.memory_kv_w_bf16 : (void *)gpu.memory_kv_w;
    const void *from = gpu.bf16 ? (const void *)gpu_bf16_operand(cross_w + (size_t)C * C, 0)
                                : (const void *)(cross_w + (size_t)C * C);
    double profile_began = profile_start();
    CUDA_CHECK(cudaMemcpy2DAsync(gathered, kv_weights * number, from, layer_weights * number,
                                 kv_weights * number, L, cudaMemcpyDeviceToDevice, gpu_stream));
    profile_stop(profile_began, "copy on the GPU: the decoder's W^K, W^V gathered");
    gpu_counting->copies++;
    gpu_counting->host_calls++;
    gpu_counting->bytes_copied += (double)L * kv_weights * number;
    float *projected = gpu.scratch.d_memory_kv;
    if (gpu_fused_fits(gpu.T, S, C / c->n_heads)) {   // the rows are the fused
                                                      // attention's: no copy, no bias
        gpu_linear_forward(gpu.memory_kv, memory, gpu.memory_kv_w, NS, C, L * 2 * C);
        return;
    }
    gpu_linear_forward(projected, memory, gpu.memory_kv_w, NS, C, L * 2 * C);
    size_t layer_offsets[3] = { (size_t)2 * C, (size_t)3 * C,
                                (size_t)2 * NS * C };   // columns, bias, output
    gpu_heads_from_rows_layers(gpu.memory_kv, projected, cross_b + C, L * 2 * C, 2, L,
                               layer_offsets, B, S, C, c->n_heads);
}

// The memory's gradient from every decoder layer's keys and values, one
// product: d_memory (B*S, C) = d_memory_kv (B*S, L*2C) memory_kv_w (L*2C, C);
// and their weights' gradients, one batched product over the layers:
// dW_kv_l (2C, C) = d_kv_l^T memory, d_kv_l being columns l*2C.. of d_memory_kv.
static void gpu_memory_backward(float *d_memory, const float *memory, Transformer *m, int B,
                                int S) {
    const TransformerConfig *c = &m->config;
    int C = c->d_model, L = c->n_layers, NS = B * S;
    const float *d_kv = gpu.scratch.d_memory_kv;
    // dW_l^T (C x 2C) = memory^T (C x NS, N) d_kv_l (NS x 2C, stored d_kv_l^T: T),
    // layer l at 3C*C + C*C
    float *d_weights = on_gpu(gpu.grads, m, m->params.dec_cross_qkv_w, 0, 0) + (size_t)C * C;
    gpu_bf16_shared_begin(d_kv, (size_t)NS * L * 2 * C);   // (--bf16: d_kv's copy,
                                                           // which both products read)
    gpu_side_begin();
    gemm_batched(OP_N, OP_T, C, 2 * C, NS, 1.0f, memory, C, 0, d_kv, L * 2 * C, 2LL * C, 0.0f,
                 d_weights, C, 3LL * C * C, L);
    gpu_side_end();
    if (gpu.memory_kv_w_t) {   // (--tf32: their transposed copy, C x L*2C, which Adam's step wrote)
        gemm(OP_T, OP_N, C, NS, L * 2 * C, 1.0f, gpu.memory_kv_w_t, L * 2 * C, d_kv, L * 2 * C,
             0.0f, d_memory, C);
        gpu_counting->transposed_products++;
    } else
        gemm(OP_N, OP_N, C, NS, L * 2 * C, 1.0f, gpu.memory_kv_w, C, d_kv, L * 2 * C, 0.0f,
             d_memory, C);
    gpu_bf16_shared_end();
}


// ============================================================================
// A training step: its work on the GPU (the forward pass, the backward pass,
// Adam), launched one by one or captured as a graph
// ============================================================================

// transformer_forward's work for the batch of this step (gpu_prepare_step):
// the encoder, the decoder, the loss into gpu.loss (and cross_entropy_backward's
// dlogits already)
static void gpu_forward_work(Transformer *m) {
    const TransformerConfig *c = &m->config;
    int B = gpu.B, S = gpu.S, T = gpu.T, C = c->d_model, V = c->vocab_size, L = c->n_layers;
    float *embedding = on_gpu(gpu.params, m, m->params.embedding, 0, 0);
    LAUNCH_ELEMENTS((size_t)B * (S + T) * C, embedding_forward_kernel, gpu.enc_x0, gpu.dec_x0,
                    gpu.src, gpu.tgt_in, embedding, gpu.pe, gpu.enc_drop, gpu.dec_drop, B, S, T, C);
    const float *x = gpu.enc_x0;
    for (int l = 0; l < L; l++) {
        gpu_encoder_layer_forward(&gpu.enc[l], x, gpu_encoder_params(gpu.params, m, l), m, B, S);
        x = gpu.enc[l].ln2;
    }
    gpu_memory_forward(x, m, B, S);
    const float *y = gpu.dec_x0;
    size_t layer_kv = gpu_memory_kv_layer(c, B, S, T);
    for (int l = 0; l < L; l++) {
        gpu_decoder_layer_forward(&gpu.dec[l], y, gpu.memory_kv + l * layer_kv,
                                  gpu_decoder_params(gpu.params, m, l), m, B, S, T);
        y = gpu.dec[l].ln3;
    }
    // §3.4: logits = y E^T; then cross_entropy_forward, and its backward's dlogits already
    gpu_linear_forward(gpu.logits, y, embedding, B * T, C, V);
    // a thread per 4 logits, up to 1024; at least two warps, so that block_sum's barrier
    // always matters; each row kept in shared memory when it fits (gpu_begin opted the
    // kernel in to gpu.shared_opt_in bytes)
    unsigned threads = V >= 4 * 1024 ? 1024 : blocks_for((size_t)V, 4 * WARP) * WARP;
    if (threads < 2 * WARP)
        threads = 2 * WARP;
    size_t warps_bytes = threads / WARP * sizeof(float),
           with_row = warps_bytes + (size_t)V * sizeof(float);
    int row_in_shared = with_row <= gpu.shared_opt_in;
    LAUNCH(cross_entropy_kernel, (unsigned)(B * T), threads, row_in_shared ? with_row : warps_bytes,
           gpu.token_loss, gpu.scratch.d_logits, gpu.logits, gpu.tgt_out, gpu.tgt_len, gpu.step,
           c->label_smoothing, T, V, row_in_shared);
    LAUNCH(mean_loss_kernel, 1, THREADS, THREADS * sizeof(double), gpu.loss, gpu.token_loss,
           (size_t)B * T, gpu.step);
}

// transformer_backward's work, after gpu_forward_work. Every gradient is
// written once (products with beta 0, kernels with =), the embedding's then
// added to, so nothing needs zeroing (transformer_zero_grad).
static void gpu_backward_work(Transformer *m) {
    const TransformerConfig *c = &m->config;
    GpuScratch *s = &gpu.scratch;
    int B = gpu.B, S = gpu.S, T = gpu.T, C = c->d_model, V = c->vocab_size, L = c->n_layers;
    float *embedding = on_gpu(gpu.params, m, m->params.embedding, 0, 0);
    float *d_embedding = on_gpu(gpu.grads, m, m->params.embedding, 0, 0);
    // logits = decoder_output E^T (d_logits: cross_entropy_kernel's)
    gpu_linear_backward(s->d_dec, 0, d_embedding, s->d_logits, gpu.dec[L - 1].ln3, embedding, B * T,
                        C, V);
    gpu_side_reads_nothing_overwritten();   // (its product reads d_logits and the decoder's output)
    const float *memory = gpu.enc[L - 1].ln2;
    size_t layer_kv = gpu_memory_kv_layer(c, B, S, T);
    for (int l = L - 1; l >= 0; l--) {
        const float *y = l == 0 ? gpu.dec_x0 : gpu.dec[l - 1].ln3;
        gpu_decoder_layer_backward(s->d_dec, gpu_decoder_params(gpu.grads, m, l), l, s->d_dec,
                                   &gpu.dec[l], y, gpu.memory_kv + l * layer_kv,
                                   gpu_decoder_params(gpu.params, m, l), c, B, S, T);
    }
    gpu_memory_backward(s->d_enc, memory, m, B, S);
    for (int l = L - 1; l >= 0; l--) {
        const float *x = l == 0 ? gpu.enc_x0 : gpu.enc[l - 1].ln2;
        gpu_encoder_layer_backward(s->d_enc, gpu_encoder_params(gpu.grads, m, l), s->d_enc,
                                   &gpu.enc[l], x, gpu_encoder_params(gpu.params, m, l), c, B, S);
    }
    // dec_x0 = Dropout(E[tgt_in] sqrt(C) + PE), enc_x0 likewise: s->d_dec and s->d_enc hold
    // their gradients. A block for each distinct token the batch can hold: the step's count
    // is in device memory. (It adds to the gradient of the output layer's product, which the
    // side stream wrote: the join.)
    gpu_join_side();
    int rows = B * (S + T), most_tokens = rows < V ? rows : V;
    LAUNCH(embedding_backward_kernel,
           xyz((unsigned)most_tokens, blocks_for((size_t)C, EMBEDDING_THREADS), 1),
           EMBEDDING_THREADS, 0, d_embedding, s->d_dec, s->d_enc, gpu.token_ids, gpu.token_first,
           gpu.token_rows, gpu.step, gpu.dec_drop, gpu.enc_drop, B * T, C);
    if (c->positional == POSITIONAL_LEARNED)
        LAUNCH_ELEMENTS((size_t)c->max_len * C, position_embedding_backward_kernel,
                        on_gpu(gpu.grads, m, m->params.position_embedding, 0, 0), s->d_dec,
                        s->d_enc, gpu.dec_drop, gpu.enc_drop, c->max_len, B, S, T, C);
}

// A data-parallel run's sums over its ranks (NCCL): the gradients, one allocation, and the
// loss, each rank's the sum of its share's over the whole batch's count; NCCL's ring adds in
// its own order, the same for the same ranks on the same GPUs. One rank: nothing.
static void gpu_sum_over_ranks(void) {
#ifdef TRANSFORMER_NCCL
    if (!gpu.nccl)
        return;
    NCCL_CHECK(ncclGroupStart());
    NCCL_CHECK(ncclAllReduce(gpu.grads, gpu.grads, gpu.num_parameters, ncclFloat, ncclSum, gpu.nccl,
                             gpu_stream));
    NCCL_CHECK(ncclAllReduce(gpu.loss, gpu.loss, 1, ncclFloat, ncclSum, gpu.nccl, gpu_stream));
    NCCL_CHECK(ncclGroupEnd());
    gpu_counting->all_reduces += 2;
#endif
}

// adam_update's work: its step size and bias correction are the step's (StepValues), after
// the ranks' sums
static void gpu_update_work(const Transformer *m) {
    gpu_join_side();   // (every gradient is written)
    gpu_sum_over_ranks();
    AdamConstants adam = { (float)m->adam.beta1, (float)m->adam.beta2, (float)m->adam.eps };
    LAUNCH_ELEMENTS(gpu.num_parameters, adam_kernel, gpu.params, gpu.params_bf16, gpu.adam_m,
                    gpu.adam_v, gpu.grads, gpu.num_parameters, adam, gpu.step);
    gpu_transpose_weights();   // (--tf32: the copies the next step's inputs' gradients read)
}

// A whole step's work: what a graph captures
static void gpu_step_work(Transformer *m) {
    gpu_forward_work(m);
    gpu_backward_work(m);
    gpu_update_work(m);
}

// ---- the captured steps ---------------------------------------------------------

// The captured steps dropped (the memory they point into moves, or goes); the
// shapes' step counts stay, so that a shape seen before is captured again at once.
static void gpu_forget_graphs(void) {
    for (int i = 0; i < gpu.graph_count; i++) CUDA_CHECK(cudaGraphExecDestroy(gpu.graphs[i].exec));
    gpu.graph_count = 0;
}

// How many steps of this shape have run without a graph (this one counted)
static int gpu_shape_steps(int dropout) {
    for (int i = 0; i < GPU_SHAPES_SEEN; i++)
        if (gpu.seen[i].steps && gpu.seen[i].B == gpu.B && gpu.seen[i].S == gpu.S &&
            gpu.seen[i].T == gpu.T && gpu.seen[i].dropout == dropout)
            return ++gpu.seen[i].steps;
    int i = gpu.seen_next++ % GPU_SHAPES_SEEN;   // the oldest goes
    gpu.seen[i].B = gpu.B;
    gpu.seen[i].S = gpu.S;
    gpu.seen[i].T = gpu.T;
    gpu.seen[i].dropout = dropout;
    return gpu.seen[i].steps = 1;
}

// The step's work captured into a graph (nothing runs): what it holds is counted as the graph's
static GpuGraph gpu_capture(Transformer *m, int dropout) {
    GpuGraph g;
    memset(&g, 0, sizeof g);
    g.B = gpu.B;
    g.S = gpu.S;
    g.T = gpu.T;
    g.dropout = dropout;
    cudaGraph_t graph;
    CUDA_CHECK(cudaStreamBeginCapture(gpu_stream, cudaStreamCaptureModeGlobal));
    gpu_counting = &g.counts;
    gpu_step_work(m);
    gpu_counting = &gpu_counts;
    CUDA_CHECK(cudaStreamEndCapture(gpu_stream, &graph));
    // its nodes as the GPU holds them (on a GPU a cuBLAS call may be more than one), and
    // their dependencies
    size_t nodes = 0, edges = 0;
    CUDA_CHECK(cudaGraphGetNodes(graph, NULL, &nodes));
    CUDA_CHECK(cudaGraphGetEdges(graph, NULL, NULL, NULL, &edges));
    g.counts.graph_nodes = (long)nodes;
    g.counts.graph_edges = (long)edges;
    CUDA_CHECK(cudaGraphInstantiate(&g.exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    gpu_counts.host_calls += 6;   // the capture's begin and end, the counts,
                                  // the instantiation, the graph's destruction
    return g;
}

// The graph of this step's shape: the one captured, or captured now when this
// is the shape's graph_after-th step; NULL: this step runs without one.
static const GpuGraph *gpu_graph_for(Transformer *m) {
    int dropout = m->training && m->config.dropout > 0.0f;
    gpu.steps++;
    for (int i = 0; i < gpu.graph_count; i++) {
        GpuGraph *g = &gpu.graphs[i];
        if (g->B == gpu.B && g->S == gpu.S && g->T == gpu.T && g->dropout == dropout) {
            g->last_used = gpu.steps;
            return g;
        }
    }
    // (--profile waits for each call, which a capture forbids: it runs without graphs)
    if (gpu_graph_after == 0 || gpu_profile.requested || gpu_shape_steps(dropout) < gpu_graph_after)
        return NULL;
    int slot = gpu.graph_count;
    if (slot == GPU_GRAPHS) {   // the least recently launched makes room
        slot = 0;
        for (int i = 1; i < GPU_GRAPHS; i++)
            if (gpu.graphs[i].last_used < gpu.graphs[slot].last_used)
                slot = i;
        CUDA_CHECK(cudaGraphExecDestroy(gpu.graphs[slot].exec));
    } else {
        gpu.graph_count++;
    }
    gpu.graphs[slot] = gpu_capture(m, dropout);
    gpu.graphs[slot].last_used = gpu.steps;
    return &gpu.graphs[slot];
}

static void gpu_launch_graph(const GpuGraph *g) {
    CUDA_CHECK(cudaGraphLaunch(g->exec, gpu_stream));
    const GpuCounts *k = &g->counts;
    gpu_counts.launches += k->launches;
    gpu_counts.gemms += k->gemms;
    gpu_counts.memsets += k->memsets;
    gpu_counts.copies += k->copies;
    gpu_counts.bytes_set += k->bytes_set;
    gpu_counts.bytes_copied += k->bytes_copied;
    gpu_counts.side_launches += k->side_launches;
    gpu_counts.side_gemms += k->side_gemms;
    gpu_counts.forks += k->forks;
    gpu_counts.joins += k->joins;
    gpu_counts.graph_nodes += k->graph_nodes;
    gpu_counts.graph_edges += k->graph_edges;
    gpu_counts.epilogue_products += k->epilogue_products;
    gpu_counts.transposed_products += k->transposed_products;
    gpu_counts.all_reduces += k->all_reduces;
    gpu_counts.graph_launches++;
    gpu_counts.host_calls++;
}

// ============================================================================
// The hook transformer.c calls (transformer.h, TrainingCompute)
// ============================================================================

static void gpu_release(void) {
    if (gpu.ready) {
        gpu_forget_graphs();
        CUDA_CHECK(cudaFree(gpu.batch_memory));
        CUDA_CHECK(cudaFree(gpu.batch_bf16));
        CUDA_CHECK(cudaFree(gpu.upload));
        CUDA_CHECK(cudaFreeHost(gpu.upload_host));
        CUDA_CHECK(cudaFreeHost(gpu.loss_host));
        CUDA_CHECK(cudaFree(gpu.model_memory));
        for (int i = MAIN_STREAM; i <= SIDE_STREAM; i++) {
            CUDA_CHECK(cudaFree(gpu.streams[i].cublas_workspace));
            CUBLAS_CHECK(cublasDestroy(gpu.streams[i].cublas));
            CUDA_CHECK(cudaStreamDestroy(gpu.streams[i].stream));
        }
        CUDA_CHECK(cudaEventDestroy(gpu.forked));
        CUDA_CHECK(cudaEventDestroy(gpu.joined));
        if (gpu.lt)
            CUBLAS_CHECK(cublasLtDestroy(gpu.lt));
#ifdef TRANSFORMER_NCCL
        if (gpu.nccl)
            NCCL_CHECK(ncclCommDestroy(gpu.nccl));
#endif
        gpu_stream = NULL;
    }
    free(gpu.enc);
    free(gpu.dec);
    free(gpu.token_count);
    free(gpu.transposed);
    int tf32 = gpu.tf32, bf16 = gpu.bf16, count = gpu.count;
    memset(&gpu, 0, sizeof gpu);
    gpu.tf32 = tf32;
    gpu.bf16 = bf16;
    gpu.count = count;
}

// The model's memory on the GPU, one allocation: its parameters, gradients,
// Adam's moments, the sinusoids, the gathered W^K, W^V of gpu_memory_forward,
// and the column kernels' scratch (its counts zeroed once, here)
static void gpu_allocate_model(const Transformer *m) {
    const TransformerConfig *c = &m->config;
    size_t P = m->num_parameters, C = c->d_model, pe = (size_t)c->max_len * C;
    size_t kv_w = (size_t)c->n_layers * 2 * C * C;
    size_t widest = 3 * C > (size_t)c->d_ff ? 3 * C : (size_t)c->d_ff;   // the most columns a
                                                                         // column kernel sums
    size_t column_blocks = blocks_for(widest, WARP), partials = (size_t)COLUMN_TARGET_BLOCKS * WARP;
    if (partials < column_blocks * WARP)
        partials = column_blocks * WARP;
    Carver count = { NULL, 0 };
    const char *names[4] = { "params", "grads", "adam_m", "adam_v" };
    for (int i = 0; i < 4; i++) carve(&count, P, names[i]);
    carve(&count, pe, "pe");
    carve(&count, kv_w, "memory_kv_w");
    carve(&count, 3 * partials, "column_partials");
    carve(&count, column_blocks, "column_chunks_done");
    carve(&count, (size_t)c->n_heads, "attention_heads_done");
    carve(&count, 1, "norm_chunks_done");
    if (gpu.bf16) {   // (carve counts floats: two bf16 numbers a float)
        carve(&count, (P + 1) / 2, "params_bf16");
        carve(&count, (kv_w + 1) / 2, "memory_kv_w_bf16");
    }
    if (gpu_wants_transposed()) {
        carve(&count, P, "params_t");
        carve(&count, kv_w, "memory_kv_w_t");
        carve(&count, transposed_table_floats(m), "transposed_table");
    }
    gpu.model_memory = gpu_alloc(count.used * sizeof(float));
    Carver cut = { (float *)gpu.model_memory, 0 };
    float **arenas[] = { &gpu.params, &gpu.grads, &gpu.adam_m, &gpu.adam_v };
    for (int i = 0; i < 4; i++) *arenas[i] = carve(&cut, P, names[i]);
    // learned positions are a parameter that Adam moves on the GPU: the forward
    // reads them where Adam writes them, as m->positional_encoding on the host
    gpu.pe = carve(&cut, pe, "pe");
    if (c->positional == POSITIONAL_LEARNED)
        gpu.pe = on_gpu(gpu.params, m, m->params.position_embedding, 0, 0);
    gpu.memory_kv_w = carve(&cut, kv_w, "memory_kv_w");
    ColumnScratch *columns = &gpu.streams[MAIN_STREAM].columns;   // (the side stream's
                                                                  // stay NULL: GpuStream)
    columns->partials = carve(&cut, 3 * partials, "column_partials");
    columns->chunks_done = (unsigned *)carve(&cut, column_blocks, "column_chunks_done");
    CUDA_CHECK(cudaMemset(columns->chunks_done, 0, column_blocks * sizeof(unsigned)));
    gpu.attention_heads_done = (unsigned *)carve(&cut, (size_t)c->n_heads, "attention_heads_done");
    CUDA_CHECK(cudaMemset(gpu.attention_heads_done, 0, (size_t)c->n_heads * sizeof(unsigned)));
    gpu.norm_chunks_done = (unsigned *)carve(&cut, 1, "norm_chunks_done");
    CUDA_CHECK(cudaMemset(gpu.norm_chunks_done, 0, sizeof(unsigned)));
    if (gpu.bf16) {
        gpu.params_bf16 = (__nv_bfloat16 *)carve(&cut, (P + 1) / 2, "params_bf16");
        gpu.memory_kv_w_bf16 = (__nv_bfloat16 *)carve(&cut, (kv_w + 1) / 2, "memory_kv_w_bf16");
    }
    if (gpu_wants_transposed()) {
        gpu.params_t = carve(&cut, P, "params_t");
        gpu.memory_kv_w_t = carve(&cut, kv_w, "memory_kv_w_t");
        gpu_transposed_prepare(m, (TransposedWeight *)carve(&cut, transposed_table_floats(m),
                                                            "transposed_table"));
    }
    for (int i = MAIN_STREAM; i <= SIDE_STREAM; i++)
        gpu.streams[i].cublas_workspace = gpu_alloc(CUBLAS_WORKSPACE_BYTES);
    CUDA_CHECK(cudaMallocHost((void **)&gpu.loss_host, sizeof(float)));
    gpu.enc = (GpuEncoderActs *)calloc((size_t)c->n_layers, sizeof(GpuEncoderActs));
    gpu.dec = (GpuDecoderActs *)calloc((size_t)c->n_layers, sizeof(GpuDecoderActs));
    gpu.token_count = (int *)calloc((size_t)c->vocab_size, sizeof(int));
    if (!gpu.enc || !gpu.dec || !gpu.token_count) {
        fprintf(stderr, "error: out of memory (the GPU's host lists)\n");
        exit(1);
    }
}

// cuBLAS on one of the companion's streams (`which`), a handle with the
// stream's own workspace (so that nothing is allocated inside a capture;
// cublasSetStream resets it, so it comes after); then work goes to the main stream
static void gpu_start_cublas(int which) {
    GpuStream *s = &gpu.streams[which];
    CUBLAS_CHECK(cublasCreate(&s->cublas));
    CUBLAS_CHECK(cublasSetStream(s->cublas, s->stream));
    CUBLAS_CHECK(cublasSetWorkspace(s->cublas, s->cublas_workspace, CUBLAS_WORKSPACE_BYTES));
    // fp32 products as transformer.c's; TF32 tensor cores only when asked (--tf32)
    CUBLAS_CHECK(cublasSetMathMode(s->cublas, gpu.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                       : CUBLAS_DEFAULT_MATH));
    gpu_use_stream(MAIN_STREAM);
}

// A rank of a data-parallel run (lab/ranks.h): the GPU of its place on its machine, and NCCL's
// communicator, whose id rank 0 makes and MPI gives every rank. Alone: nothing.
static void gpu_join_ranks(void) {
    if (!lab_ranks_launched())
        return;
#ifdef TRANSFORMER_NCCL
    int devices = 0;
    CUDA_CHECK(cudaGetDeviceCount(&devices));
    gpu.device = devices > 0 ? lab_local_rank() % devices : 0;
    CUDA_CHECK(cudaSetDevice(gpu.device));
    ncclUniqueId id;
    if (lab_rank() == 0)
        NCCL_CHECK(ncclGetUniqueId(&id));
    lab_ranks_broadcast(&id, sizeof id);
    NCCL_CHECK(ncclCommInitRank(&gpu.nccl, lab_rank_count(), id, lab_rank()));
#else
    if (lab_rank_count() > 1) {
        if (lab_rank() == 0)
            fprintf(stderr, "error: transformer_cuda: started as %d ranks, but built without "
                            "NCCL (make cuda found no nccl.h, or no MPI): each would train "
                            "alone; expected one process, or make cuda where NCCL and MPI are "
                            "installed\n", lab_rank_count());
        exit(1);
    }
#endif
}

// begin: the model's memory on the GPU (again when the model's shape changed),
// and its parameters, moments and sinusoids copied there
static void gpu_begin(Transformer *m) {
    int other_model = gpu.ready && memcmp(&gpu.config, &m->config, sizeof gpu.config) != 0;
    int copies_changed = gpu.bf16 != (gpu.params_bf16 != NULL) ||
                         gpu_wants_transposed() != (gpu.params_t != NULL) ||
                         !gpu_no_epilogues != (gpu.lt != NULL);
    if (other_model || (gpu.ready && copies_changed))
        gpu_release();   // (or --bf16, --tf32's copies changed)
    if (!gpu.ready) {
        gpu_join_ranks();
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDeviceProperties(&prop, gpu.device));
        for (int i = MAIN_STREAM; i <= SIDE_STREAM; i++)
            CUDA_CHECK(cudaStreamCreate(&gpu.streams[i].stream));
        CUDA_CHECK(cudaEventCreateWithFlags(&gpu.forked, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&gpu.joined, cudaEventDisableTiming));
        gpu.ready = 1;
        gpu.config = m->config;
        gpu.num_parameters = m->num_parameters;
        gpu_allocate_model(m);
        for (int i = MAIN_STREAM; i <= SIDE_STREAM; i++) gpu_start_cublas(i);
        if (!gpu_no_epilogues)
            CUBLAS_CHECK(cublasLtCreate(&gpu.lt));
        gpu.shared_opt_in = prop.sharedMemPerBlockOptin;
        CUDA_CHECK(cudaFuncSetAttribute(cross_entropy_kernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)gpu.shared_opt_in));
        if (lab_rank() == 0)
            fprintf(stderr, "transformer_cuda: training steps on %s, cuBLAS in %s, %s, %s%s\n",
                    prop.name,
                    gpu.bf16 ? "bf16 with fp32 sums (--bf16)"
                    : gpu.params_t
                        ? "TF32 (--tf32), the inputs' gradients from the weights' transposed copies"
                    : gpu.tf32 ? "TF32 (--tf32), the weights as stored" : "fp32",
                    gpu_graph_after ? "a CUDA graph a step" : "no CUDA graphs (--no-graph)",
                    gpu_one_stream ? "one stream (--one-stream)" : "two streams",
                    lab_ranks_launched() ? "; a GPU a rank, their sums by NCCL" : "");
    }
    size_t bytes = m->num_parameters * sizeof(float);
    CUDA_CHECK(cudaStreamSynchronize(gpu_stream));   // the last step's work is done
                                                     // before the host's copies
    gpu_copy(gpu.params, m->params_memory, bytes, cudaMemcpyHostToDevice);
    gpu_copy(gpu.adam_m, m->adam_m, bytes, cudaMemcpyHostToDevice);
    gpu_copy(gpu.adam_v, m->adam_v, bytes, cudaMemcpyHostToDevice);
    if (gpu.bf16)   // the weights' bf16 copies, which adam_kernel keeps from here on
        LAUNCH_ELEMENTS(gpu.num_parameters, bf16_cast_kernel, gpu.params_bf16, gpu.params,
                        gpu.num_parameters);
    gpu_transpose_weights();   // (--tf32: the transposed copies, which
                               // gpu_update_work keeps from here on)
    if (m->config.positional == POSITIONAL_SINUSOID)
        gpu_copy(gpu.pe, m->positional_encoding,
                 (size_t)m->config.max_len * m->config.d_model * sizeof(float),
                 cudaMemcpyHostToDevice);
}

// to_host: the parameters, gradients and moments back into the host model
static void gpu_to_host(Transformer *m) {
    size_t bytes = m->num_parameters * sizeof(float);
    CUDA_CHECK(cudaStreamSynchronize(gpu_stream));
    gpu_copy(m->params_memory, gpu.params, bytes, cudaMemcpyDeviceToHost);
    gpu_copy(m->grads_memory, gpu.grads, bytes, cudaMemcpyDeviceToHost);
    gpu_copy(m->adam_m, gpu.adam_m, bytes, cudaMemcpyDeviceToHost);
    gpu_copy(m->adam_v, gpu.adam_v, bytes, cudaMemcpyDeviceToHost);
}

// transformer_train_step on the GPU: the forward pass, the backward pass (the
// gradients zeroed first), Adam at eq. 3's rate for step adam_step + 1. The
// host prepares the step, copies it to the GPU, launches the step's graph (or
// its work one by one), copies the loss back and waits: the one wait of the
// step. A batch without target tokens (all padding) runs without a graph: its
// gradients are zero (a memset) and Adam still moves the parameters, as
// transformer.c's. gpu.step_counts gets what the step asked of the GPU.
static real gpu_train_step(Transformer *m, const Batch *batch, int warmup_steps, double lr_factor) {
    GpuCounts before = gpu_counts;
    gpu_profile.on = gpu_profile.requested && gpu_profile.steps_seen++ > 0;
    gpu_profile.steps += gpu_profile.on;
    int empty_share = batch->B == 0 && lab_rank_count() > 1;   // (fewer sentences than ranks)
    const char *error = empty_share ? NULL : batch_check(batch, &m->config);
    if (error) {
        fprintf(stderr, "error: transformer_cuda train step: %s\n", error);
        exit(1);
    }
    // (an empty share runs no pass: the memory of a batch of one token holds its loss)
    gpu_ensure_batch(&m->config, empty_share ? 1 : batch->B, empty_share ? 1 : batch->S,
                     empty_share ? 1 : batch->T);
    double learning_rate =
        transformer_learning_rate(m->adam_step + 1, m->config.d_model, warmup_steps, lr_factor);
    gpu_prepare_step(m, batch, learning_rate);
    gpu_set_dropouts(m);
    gpu_copy_async(gpu.upload, gpu.upload_host, gpu.upload_bytes, cudaMemcpyHostToDevice);
    if (m->num_target_tokens == 0) {   // all padding, or a rank's empty share: no gradient
        if (empty_share)
            CUDA_CHECK(cudaMemsetAsync(gpu.loss, 0, sizeof(float), gpu_stream));
        else
            gpu_forward_work(m);
        double profile_began = profile_start();
        CUDA_CHECK(cudaMemsetAsync(gpu.grads, 0, gpu.num_parameters * sizeof(float), gpu_stream));
        profile_stop(profile_began,
                     "copy: memset of the gradients (a batch without target tokens)");
        gpu_counts.memsets++;
        gpu_counts.host_calls++;
        gpu_counts.bytes_set += (double)gpu.num_parameters * sizeof(float);
        gpu_update_work(m);
    } else {
        const GpuGraph *graph = gpu_graph_for(m);
        if (graph)
            gpu_launch_graph(graph);
        else
            gpu_step_work(m);
    }
    gpu_copy_async(gpu.loss_host, gpu.loss, sizeof(float), cudaMemcpyDeviceToHost);
    CUDA_CHECK(cudaStreamSynchronize(gpu_stream));
    gpu_counts.host_calls++;
    m->loss = *gpu.loss_host;
    GpuCounts *after = &gpu.step_counts;
    *after = gpu_counts;
    after->launches -= before.launches;
    after->gemms -= before.gemms;
    after->memsets -= before.memsets;
    after->copies -= before.copies;
    after->allocations -= before.allocations;
    after->graph_launches -= before.graph_launches;
    after->host_calls -= before.host_calls;
    after->bytes_set -= before.bytes_set;
    after->bytes_copied -= before.bytes_copied;
    after->side_launches -= before.side_launches;
    after->side_gemms -= before.side_gemms;
    after->forks -= before.forks;
    after->joins -= before.joins;
    after->graph_nodes -= before.graph_nodes;
    after->graph_edges -= before.graph_edges;
    after->epilogue_products -= before.epilogue_products;
    after->transposed_products -= before.transposed_products;
    after->all_reduces -= before.all_reduces;
    gpu_profile.on = 0;
    return m->loss;
}

static const TrainingCompute gpu_training = {
    "transformer_cuda", gpu_begin, gpu_train_step, gpu_to_host,
};

// Numbers in [-1, 1) from a hash of their index: the operands of `sgemm`
static __global__ void __launch_bounds__(THREADS)
fill_uniform_kernel(float *x, size_t n, uint64_t seed) {
    size_t i = ELEMENT_INDEX;
    if (i < n)
        x[i] = (float)(dropout_hash64(seed + i) >> 40) / (float)(1 << 23) - 1.0f;
}
CPU_KERNEL(fill_uniform_kernel, float *, size_t, uint64_t)

static int compare_seconds(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// ./transformer_cuda sgemm [--size N] [--repeats R] [--json] (with --tf32: TF32 tensor
// cores; with --bf16: cublasGemmEx on bf16 copies of A and B, fp32 sums into C), argv[0]
// "sgemm": cuBLAS's own C = A B on n x n matrices, the practical limit of the step's
// products (dev/bench_gpu.py prints our TFLOP/s beside it); the median of R
// timed products after 3 untimed ones, each waited for.
// One of sgemm's numbers: the whole of text an integer from low to high; else 0, after an
// error line
static int sgemm_number(const char *flag, const char *text, long low, long high, int *value) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end != text && *end == '\0' && errno == 0 && v >= low && v <= high) {
        *value = (int)v;
        return 1;
    }
    fprintf(stderr, "error: sgemm: %s '%s' is not valid; expected an integer from %ld to %ld\n",
            flag, text, low, high);
    return 0;
}

// sgemm's options: 1 to run; 0 after an error line naming the argument; 2 after the help
static int sgemm_options(int argc, char **argv, int *n, int *repeats, int *json) {
    for (int i = 1; i < argc; i++) {
        int size = strcmp(argv[i], "--size") == 0, reps = strcmp(argv[i], "--repeats") == 0;
        if (strcmp(argv[i], "--json") == 0)
            *json = 1;
        else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: ./transformer_cuda sgemm [--size N] [--repeats R] [--json] "
                   "[--tf32] [--bf16]\n"
                   "cuBLAS's SGEMM C = A B on N x N matrices (N 1 to 65536, default 8192), "
                   "the median of R\n"
                   "timed products (1 to 1000, default 10), in TFLOP/s; "
                   "--tf32: on TF32 tensor cores;\n"
                   "--bf16: A and B in bf16, their products summed in fp32 (cublasGemmEx)\n");
            return 2;
        } else if ((size || reps) && i + 1 >= argc) {
            fprintf(stderr, "error: sgemm: flag %s needs a value\n", argv[i]);
            return 0;
        } else if (size || reps) {
            if (!sgemm_number(argv[i], argv[i + 1], 1, size ? 65536 : 1000, size ? n : repeats))
                return 0;
            i++;
        } else {
            fprintf(stderr, "error: sgemm: unknown argument '%s'; expected --size N, "
                            "--repeats R, --json, --tf32 or --bf16\n", argv[i]);
            return 0;
        }
    }
    return 1;
}

#ifdef __cplusplus
extern "C"   // test_cuda.c, a C program, calls it (make test-cuda)
#endif
int transformer_cuda_sgemm(int argc, char **argv) {
    int n = 8192, repeats = 10, json = 0, parsed = sgemm_options(argc, argv, &n, &repeats, &json);
    if (parsed != 1)
        return parsed == 2 ? 0 : 1;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    GpuStream *main_stream = &gpu.streams[MAIN_STREAM];
    CUDA_CHECK(cudaStreamCreate(&main_stream->stream));
    main_stream->cublas_workspace = gpu_alloc(CUBLAS_WORKSPACE_BYTES);
    gpu_start_cublas(MAIN_STREAM);
    size_t elements = (size_t)n * n;
    float *a = (float *)gpu_alloc(3 * elements * sizeof(float)), *b = a + elements,
          *c = b + elements;
    LAUNCH_ELEMENTS(2 * elements, fill_uniform_kernel, a, 2 * elements, (uint64_t)12345);
    __nv_bfloat16 *ab_bf16 = NULL;   // --bf16: A's and B's copies, cast before the timing
    if (gpu.bf16) {
        ab_bf16 = (__nv_bfloat16 *)gpu_alloc(2 * elements * sizeof(__nv_bfloat16));
        LAUNCH_ELEMENTS(2 * elements, bf16_cast_kernel, ab_bf16, a, 2 * elements);
    }
    double *times = (double *)calloc((size_t)repeats, sizeof(double));
    if (!times) {
        fprintf(stderr, "error: out of memory\n");
        return 1;
    }
    for (int r = -3; r < repeats; r++) {
        CUDA_CHECK(cudaStreamSynchronize(gpu_stream));
        double start = seconds_now();
        float one = 1.0f, zero = 0.0f;
        if (gpu.bf16)
            CUBLAS_CHECK(cublasGemmEx(gpu.cublas, OP_N, OP_N, n, n, n, &one, ab_bf16, CUDA_R_16BF,
                                      n, ab_bf16 + elements, CUDA_R_16BF, n, &zero, c, CUDA_R_32F,
                                      n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        else
            gemm(OP_N, OP_N, n, n, n, one, a, n, b, n, zero, c, n);
        CUDA_CHECK(cudaStreamSynchronize(gpu_stream));
        if (r >= 0)
            times[r] = seconds_now() - start;
    }
    qsort(times, (size_t)repeats, sizeof(double), compare_seconds);
    double median =
        repeats % 2 ? times[repeats / 2] : 0.5 * (times[repeats / 2 - 1] + times[repeats / 2]);
    double tflops = 2.0 * n * (double)n * n / median * 1e-12;
    if (json)
        printf("{\"impl\": \"cublas_sgemm\", \"n\": %d, \"tf32\": %d, \"bf16\": %d, "
               "\"repeats\": %d, \"median_ms\": %.3f, \"min_ms\": %.3f, \"tflops\": %.2f, "
               "\"gpu\": \"%s\"}\n", n, gpu.tf32, gpu.bf16, repeats, median * 1e3, times[0] * 1e3,
               tflops, prop.name);
    else
        printf("cuBLAS %s %d x %d x %d (%s) on %s: median %.3f ms of %d (min %.3f), %.2f TFLOP/s\n",
               gpu.bf16 ? "GEMM" : "SGEMM", n, n, n,
               gpu.bf16 ? "bf16, fp32 sums" : gpu.tf32 ? "TF32" : "fp32", prop.name, median * 1e3,
               repeats, times[0] * 1e3, tflops);
    free(times);
    if (ab_bf16)
        CUDA_CHECK(cudaFree(ab_bf16));
    CUBLAS_CHECK(cublasDestroy(main_stream->cublas));
    CUDA_CHECK(cudaFree(main_stream->cublas_workspace));
    CUDA_CHECK(cudaFree(a));
    CUDA_CHECK(cudaStreamDestroy(main_stream->stream));
    memset(main_stream, 0, sizeof *main_stream);
    gpu_use_stream(MAIN_STREAM);   // (all NULL)
    return 0;
}

// For test_transformer.c, which includes this file in its CPU build and is
// linked with it built by nvcc for make test-cuda: the hook, the logits of the
// last forward pass (n of them), the GPU's memory given back, and the switches
// of --fused-attention and --bf16.
#ifdef __cplusplus
extern "C" {
#endif
const TrainingCompute *transformer_cuda_training(void) { return &gpu_training; }
void transformer_cuda_logits(float *out, size_t n) {
    gpu_copy(out, gpu.logits, n * sizeof(float), cudaMemcpyDeviceToHost);
}
void transformer_cuda_release(void) { gpu_release(); }
void transformer_cuda_fuse_attention(int on) { gpu_fused_attention = on; }   // --fused-attention
void transformer_cuda_one_stream(int on) { gpu_one_stream = on; }             // --one-stream
void transformer_cuda_bf16(int on) { gpu.bf16 = on; }   // --bf16 (from the next begin)
void transformer_cuda_tf32(int on) { gpu.tf32 = on; }   // --tf32 (from the next begin)
void transformer_cuda_weights_as_stored(int on) {   // --weights-as-stored (next begin)
    gpu_weights_as_stored = on;
}
void transformer_cuda_epilogues(int on) {   // --no-epilogues (from the next begin)
    gpu_no_epilogues = !on;
}
#ifdef __cplusplus
}
#endif

#ifndef TRANSFORMER_CUDA_NO_MAIN
// --count: what the last training step asked of the GPU, and the memory it holds
static void gpu_print_counts(void) {
    const GpuCounts *k = &gpu.step_counts;
    double mb = 1.0 / (1024 * 1024), f = sizeof(float);
    double kv_w = (double)gpu.config.n_layers * 2 * gpu.config.d_model * gpu.config.d_model;
    double model = ((double)gpu.num_parameters * 4 +
                    (double)gpu.config.max_len * gpu.config.d_model + kv_w) * f;
    double bf16 = gpu.bf16 ? 2.0 : 0.0;   // bytes a number of the bf16 copies (--bf16)
    model += bf16 * ((double)gpu.num_parameters + kv_w);
    if (gpu.params_t)
        model += ((double)gpu.num_parameters + kv_w) * f;   // --tf32's transposed copies
    double held = model + (double)gpu.batch_capacity * (f + bf16) + (double)gpu.upload_capacity +
                  2 * CUBLAS_WORKSPACE_BYTES;
    char graphs[96];
    if (k->graph_launches)
        snprintf(graphs, sizeof graphs, "in %ld CUDA graph launch%s", k->graph_launches,
                 k->graph_launches == 1 ? "" : "es");
    else
        snprintf(graphs, sizeof graphs, "no CUDA graph");
    printf("per step: %ld kernel launches, %ld cuBLAS calls, %ld memsets, %ld copies (%s); "
           "%ld calls from the host; %.1f MB set, %.1f MB copied, %.1f MB device memory held\n",
           k->launches, k->gemms, k->memsets, k->copies, graphs, k->host_calls, k->bytes_set * mb,
           k->bytes_copied * mb, held * mb);
    long work = k->launches + k->gemms;
    if (gpu_one_stream)
        printf("streams: one (--one-stream)\n");
    else
        printf("streams: two; on the second %ld kernel launches and %ld cuBLAS calls (%.0f%% of "
               "the step's %ld), the weights' gradients, after %ld waits for the main stream; "
               "the main stream waited for it %ld times\n", k->side_launches, k->side_gemms,
               work ? 100.0 * (k->side_launches + k->side_gemms) / work : 0.0, work, k->forks,
               k->joins);
    if (k->all_reduces)
        printf("ranks: %ld NCCL all-reduces a step, inside its graph (the gradients, %.1f MB, "
               "and the loss)\n", k->all_reduces, (double)gpu.num_parameters * f * mb);
    if (gpu.lt || gpu.params_t)
        printf("products: %ld with cuBLASLt's epilogues (the feed-forward networks' bias and "
               "ReLU; --no-epilogues: none), %ld reading --tf32's transposed weights\n",
               k->epilogue_products, k->transposed_products);
    if (k->graph_launches)
        printf("graph: %ld nodes (kernels, cuBLAS's, copies, memsets; no event nodes) and %ld "
               "dependencies (each node on the one before it in its stream, and the streams' "
               "waits for each other), launched after the step's upload and before its loss "
               "comes back\n", k->graph_nodes, k->graph_edges);
    printf("device memory: %.1f MB the model (parameters, gradients, Adam's moments%s); for this "
           "%d x %d x %d batch %.1f MB activations kept for the backward pass and %.1f MB "
           "scratch (%.2f x the activations), in an allocation of %.1f MB; %ld allocations in "
           "the last step\n", model * mb,
           gpu.params_t ? ", the weights' transposed copies"
                        : gpu.bf16 ? ", the weights' bf16 copies" : "",
           gpu.B, gpu.S, gpu.T,
           (double)gpu.activation_floats * f * mb, (double)gpu.scratch_floats * f * mb,
           (double)(gpu.activation_floats + gpu.scratch_floats) / (double)gpu.activation_floats,
           (double)gpu.batch_capacity * f * mb, k->allocations);
}

static int compare_profile_entries(const void *a, const void *b) {
    double x = ((const ProfileEntry *)a)->seconds, y = ((const ProfileEntry *)b)->seconds;
    return (x < y) - (x > y);   // the longest first
}

// --profile: the timed steps' calls by name, the longest first, per step; then
// the kernels', cuBLAS's and the copies' totals
static void gpu_print_profile(void) {
    long steps = gpu_profile.steps;
    if (steps == 0) {
        printf("profile: no training step after the first; nothing was timed\n");
        return;
    }
    ProfileEntry sorted[PROFILE_NAMES];
    memcpy(sorted, gpu_profile.entries, sizeof sorted);
    qsort(sorted, (size_t)gpu_profile.count, sizeof *sorted, compare_profile_entries);
    double total = 0, group_ms[3] = { 0 };
    long group_calls[3] = { 0 };
    for (int i = 0; i < gpu_profile.count; i++) total += sorted[i].seconds;
    printf("profile: %ld step%s after the first, each call timed alone (a wait before and after "
           "it, no CUDA graph); per step:\n"
           "      ms   share  calls  what\n", steps, steps == 1 ? "" : "s");
    for (int i = 0; i < gpu_profile.count; i++) {
        const ProfileEntry *e = &sorted[i];
        int group = strncmp(e->name, "cuBLAS", 6) == 0 ? 1
                  : strncmp(e->name, "copy", 4) == 0 ? 2 : 0;
        group_ms[group] += 1e3 * e->seconds / steps;
        group_calls[group] += e->calls;
        printf("%8.3f %6.1f%% %6.1f  %s\n", 1e3 * e->seconds / steps, 100 * e->seconds / total,
               (double)e->calls / steps, e->name);
    }
    printf("%8.3f  100.0%% %6.1f  in all: kernels %.3f ms (%.0f calls), cuBLAS %.3f ms (%.0f), "
           "copies %.3f ms (%.0f)\n",
           1e3 * total / steps, (double)(group_calls[0] + group_calls[1] + group_calls[2]) / steps,
           group_ms[0], (double)group_calls[0] / steps, group_ms[1], (double)group_calls[1] / steps,
           group_ms[2], (double)group_calls[2] / steps);
}

// ./transformer_cuda COMMAND [options] [--tf32] [--bf16] [--no-graph] [--count] [--profile]:
// transformer.c's command line, with the training steps on the GPU; or `sgemm`.
// --count prints what the last training step asked of the GPU (cuda_on_cpu.h's
// build then computes nothing: the counts of a model too large to run on the
// CPU); --profile, where the steps' time went (gpu_profile).
int main(int argc, char **argv) {
    int kept = 0;
    for (int i = 0; i < argc; i++) {
        if (i > 0 && strcmp(argv[i], "--tf32") == 0)
            gpu.tf32 = 1;
        else if (i > 0 && strcmp(argv[i], "--bf16") == 0)
            gpu.bf16 = 1;
        else if (i > 0 && strcmp(argv[i], "--count") == 0)
            gpu.count = 1;
        else if (i > 0 && strcmp(argv[i], "--no-graph") == 0)
            gpu_graph_after = 0;
        else if (i > 0 && strcmp(argv[i], "--profile") == 0)
            gpu_profile.requested = 1, gpu_graph_after = 0;
        else if (i > 0 && strcmp(argv[i], "--fused-attention") == 0)
            gpu_fused_attention = 1;
        else if (i > 0 && strcmp(argv[i], "--one-stream") == 0)
            gpu_one_stream = 1;
        else if (i > 0 && strcmp(argv[i], "--weights-as-stored") == 0)
            gpu_weights_as_stored = 1;
        else if (i > 0 && strcmp(argv[i], "--no-epilogues") == 0)
            gpu_no_epilogues = 1;
        else
            argv[kept++] = argv[i];
    }
    argv[kept] = NULL;
    const char *command = kept >= 2 ? argv[1] : "";
    int status, help = 0;   // help: the command's --help, which runs nothing to count
    for (int i = 1; i < kept; i++)
        help |= strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0;
    // --count and --profile report training steps: of train or bench, which run them
    if ((gpu.count || gpu_profile.requested) && strcmp(command, "train") != 0 &&
        strcmp(command, "bench") != 0) {
        fprintf(stderr, "error: --count and --profile go with train or bench; '%s' runs no "
                        "training step\n", command);
        return 1;
    }
    if (strcmp(command, "sgemm") == 0) {
        status = transformer_cuda_sgemm(kept - 1, argv + 1);
    } else {
#ifdef CUDA_ON_CPU
        if (gpu.count && strcmp(command, "train") == 0 && !help) {   // (on a GPU the steps run,
                                                                     // and are counted)
            fprintf(stderr, "error: train --count: this CPU build computes nothing with --count, "
                            "and would save an untrained model as trained; "
                            "expected bench --count\n");
            return 1;
        }
        if (gpu.count)
            cuda_on_cpu.execute = 0;
#endif
        transformer_training = &gpu_training;
        status = transformer_lab_main(kept, argv);
        if (status == 0 && !help && (gpu.count || gpu_profile.requested) &&
            gpu.step_counts.launches == 0) {
            fprintf(stderr, "error: %s: --count and --profile: no training step ran "
                            "(bench --decode decodes)\n", command);
            status = 1;
        }
        if (gpu.count && status == 0 && !help)
            gpu_print_counts();
        if (gpu_profile.requested && status == 0 && !help)
            gpu_print_profile();
        gpu_release();
    }
    errno = 0;   // (a reason given below is this flush's own, never an older error's)
    if (status == 0 && (fflush(stdout) != 0 || ferror(stdout))) {   // a full disk, say: the
                                                                    // output is lost
        fprintf(stderr, "error: %s: writing the output failed: %s\n",
                command[0] ? command : "transformer_cuda",
                errno ? strerror(errno) : "an earlier write to standard output failed");
        status = 1;
    }
    return status;
}
#endif
