/* fused_attention.cu: attention in one kernel each way, for short sentences (--fused-attention)
 *
 * Included by transformer_cuda.cu (after its warp sums and LAUNCH macros); only
 * there for speed. Without it, attention_forward is a copy of the projection's
 * rows into heads (heads_from_rows_kernel, adding the bias), two batched
 * products, a softmax kernel and a copy back into rows; attention_backward a
 * copy into heads, four batched products, a softmax kernel and a copy back
 * into rows that also sums the bias's gradient (rows_from_heads_bias_backward_kernel).
 * Here each direction is one launch, a block per (head, sentence), for heads
 * whose keys and values fit the 48 KB of shared memory a block may have
 * without asking (gpu_fused_fits; with d_k = 64, up to 85 keys):
 *   - the queries, keys and values are read straight from the projection's
 *     rows, as transformer.c's attention_forward reads them (its q_stride and
 *     kv_stride), the bias added on load: the rows are kept without it;
 *   - forward: K and V in shared memory, a warp per query row: its scores, the
 *     softmax of the visible ones (kept in att for the backward pass), then its
 *     head's part of the output row;
 *   - backward: K and V in shared memory, a warp per query row: dp, ds (into
 *     the ds scratch) and dq; then Q and dout in shared memory, a warp per key:
 *     dv and dk; dq, dk, dv written in the projection's rows; then each block
 *     sums its rows of them for the bias's gradient, and the last block of a
 *     head to finish adds the sentences' sums in sentence order.
 * Each sum is one thread's loop in index order (the only atomic counts the
 * finished blocks), so a run gives the same bits every time; a dot product
 * adds with fmaf, one rounding a step, which is what nvcc makes of a * b + c
 * on a GPU, and what the host build then computes too, whatever its own
 * flags (cuda_on_cpu.h's products add so). Rows of the
 * matrices in shared memory are padded by one float, so that the lanes of a
 * warp reading one column hit 32 different banks.
 */

#define FUSED_SHARED_LIMIT 49152

// Where attention reads its queries, keys and values: the rows of the
// projections that made them, before their biases. Query i of sentence b,
// head h, element d is q[(b*Tq + i)*ld_q + h*hs + d] + q_bias[h*hs + d]; key
// and value j likewise with ld_kv and their biases.
typedef struct {
    const float *q, *k, *v, *q_bias, *k_bias, *v_bias;
    int ld_q, ld_kv;
} AttentionInRows;

// Where attention_backward writes: dq, dk, dv at the places of q, k, v (the
// same leading dimensions), dbias the 3C gradients of the biases of q (0..C-1),
// k (C..2C-1) and v (2C..3C-1). partials (B, 3C) holds each sentence's sums
// before the sum over sentences; heads_done (NH) counts each head's finished
// blocks (zero between launches: the last block sets it back).
typedef struct {
    float *dq, *dk, *dv, *dbias, *partials;
    unsigned *heads_done;
} AttentionGradsInRows;

// The sizes: key_len (B) the keys each sentence has; causal, the decoder's mask;
// Tq queries and Tk keys a sentence, hs = d_k. The grid is (NH heads, B sentences).
typedef struct {
    const int *key_len;
    int causal, Tq, Tk, hs;
} FusedShape;

// rows (rows, hs) of a matrix whose rows start `stride` floats apart, plus
// bias (hs; NULL: none), into shared memory with rows of hs + 1; a warp a row
static __device__ void rows_to_shared(float *to, const float *from, size_t stride,
                                      const float *bias, int rows, int hs) {
    int warp = (int)threadIdx.x / WARP, lane = (int)threadIdx.x % WARP,
        warps = (int)blockDim.x / WARP;
    for (int r = warp; r < rows; r += warps)
        for (int d = lane; d < hs; d += WARP)
            to[r * (hs + 1) + d] = from[(size_t)r * stride + d] + (bias ? bias[d] : 0.0f);
}

// §3.2.1, eq. 1: out = softmax(q k^T / sqrt(d_k), over the visible keys) v,
// a warp per query row i: its scores in p_row, then its probabilities (kept in
// att (B, NH, Tq, Tk) for the backward pass; masked keys exactly 0), then its
// head's part of out's row (B, Tq, C).
static __global__ void __launch_bounds__(THREADS)
fused_attention_forward_kernel(float *out, float *att, AttentionInRows in, FusedShape s) {
    SHARED_FLOATS(shared);
    int head = (int)blockIdx.x, b = (int)blockIdx.y, NH = (int)gridDim.x, hs = s.hs, Tq = s.Tq,
        Tk = s.Tk;
    int warp = (int)threadIdx.x / WARP, lane = (int)threadIdx.x % WARP, ld = hs + 1,
        column = head * hs;
    float *ks = shared, *vs = ks + (size_t)Tk * ld;            // (Tk, hs + 1) each
    float *q_row = vs + (size_t)Tk * ld + (size_t)warp * hs;   // (ROWS_PER_BLOCK, hs)
    float *p_row = vs + (size_t)Tk * ld + ROWS_PER_BLOCK * hs +
                   (size_t)warp * Tk;                          // (ROWS_PER_BLOCK, Tk)
    const float *qb = in.q + (size_t)b * Tq * in.ld_q + column;
    rows_to_shared(ks, in.k + (size_t)b * Tk * in.ld_kv + column, in.ld_kv, in.k_bias + column, Tk,
                   hs);
    rows_to_shared(vs, in.v + (size_t)b * Tk * in.ld_kv + column, in.ld_kv, in.v_bias + column, Tk,
                   hs);
    __syncthreads();
    float scale = 1 / sqrtf((float)hs);
    int key_len = s.key_len[b];
    for (int i = warp; i < Tq; i += ROWS_PER_BLOCK) {
        for (int d = lane; d < hs; d += WARP)
            q_row[d] = qb[(size_t)i * in.ld_q + d] + in.q_bias[column + d];
        __syncwarp(FULL_WARP);
        int visible = (s.causal && i + 1 < key_len) ? i + 1 : key_len;
        float largest = -INFINITY, sum = 0;
        for (int j = lane; j < visible; j += WARP) {
            float dot = 0;
            for (int d = 0; d < hs; d++) dot = fmaf(q_row[d], ks[j * ld + d], dot);
            p_row[j] = dot * scale;
            largest = fmaxf(largest, p_row[j]);
        }
        largest = warp_max(largest);
        for (int j = lane; j < visible; j += WARP) {
            p_row[j] = expf(p_row[j] - largest);
            sum += p_row[j];
        }
        sum = warp_sum(sum);
        float *p = att + (((size_t)b * NH + head) * Tq + i) * Tk;
        for (int j = lane; j < Tk; j += WARP) p[j] = p_row[j] = j < visible ? p_row[j] / sum : 0.0f;
        __syncwarp(FULL_WARP);
        for (int d = lane; d < hs; d += WARP) {
            float o = 0;
            for (int j = 0; j < visible; j++) o = fmaf(p_row[j], vs[j * ld + d], o);
            out[((size_t)b * Tq + i) * NH * hs + column + d] = o;
        }
        __syncwarp(FULL_WARP);   // q_row and p_row are free for the warp's next row
    }
}
CPU_KERNEL(fused_attention_forward_kernel, float *, float *, AttentionInRows, FusedShape)

// attention_backward whole (eq. 1 differentiated as transformer.c's
// attention_backward does), given dout (B, Tq, C) in rows and the forward's
// probabilities p in att; ds (B, NH, Tq, Tk) is scratch.
// First k and v in shared memory, a warp per query row i:
//     dp_ij = dout_i . v_j,   ds_ij = p_ij (dp_ij - sum_k p_ik dp_ik),
//     dq_i = sum_j ds_ij k_j / sqrt(d_k)
// then q and dout in shared memory, a warp per key j:
//     dv_j = sum_i p_ij dout_i,   dk_j = sum_i ds_ij q_i / sqrt(d_k)
// then linear_backward's bias of the projections: db = the sum of dq's (dk's,
// dv's) rows, each sentence's rows summed by its block in row order, and the
// sentences' sums by the head's last block in sentence order.
static __global__ void __launch_bounds__(THREADS)
fused_attention_backward_kernel(AttentionGradsInRows g, float *ds, const float *dout,
                                const float *att, AttentionInRows in, FusedShape s) {
    SHARED_FLOATS(shared);
    int head = (int)blockIdx.x, b = (int)blockIdx.y, NH = (int)gridDim.x, B = (int)gridDim.y;
    int hs = s.hs, Tq = s.Tq, Tk = s.Tk, C = NH * hs, column = head * hs;
    int warp = (int)threadIdx.x / WARP, lane = (int)threadIdx.x % WARP, ld = hs + 1,
        most = Tq > Tk ? Tq : Tk;
    // xs, ys (most, hs + 1): k and v, then q and dout; dout_row (ROWS_PER_BLOCK, hs)
    float *xs = shared, *ys = xs + (size_t)most * ld,
          *dout_row = ys + (size_t)most * ld + (size_t)warp * hs;
    const float *pb = att + ((size_t)b * NH + head) * Tq * Tk,
                *dout_b = dout + (size_t)b * Tq * C + column;
    float *dsb = ds + ((size_t)b * NH + head) * Tq * Tk, scale = 1 / sqrtf((float)hs);
    float *dq = g.dq + (size_t)b * Tq * in.ld_q + column;
    float *dk = g.dk + (size_t)b * Tk * in.ld_kv + column,
          *dv = g.dv + (size_t)b * Tk * in.ld_kv + column;
    rows_to_shared(xs, in.k + (size_t)b * Tk * in.ld_kv + column, in.ld_kv, in.k_bias + column, Tk,
                   hs);
    rows_to_shared(ys, in.v + (size_t)b * Tk * in.ld_kv + column, in.ld_kv, in.v_bias + column, Tk,
                   hs);
    __syncthreads();
    for (int i = warp; i < Tq; i += ROWS_PER_BLOCK) {
        for (int d = lane; d < hs; d += WARP) dout_row[d] = dout_b[(size_t)i * C + d];
        __syncwarp(FULL_WARP);
        const float *p = pb + (size_t)i * Tk;
        float *ds_row = dsb + (size_t)i * Tk, sum_p_dp = 0;
        for (int j = lane; j < Tk; j += WARP) {
            float dp = 0;
            for (int d = 0; d < hs; d++) dp = fmaf(dout_row[d], ys[j * ld + d], dp);
            ds_row[j] = dp;
            sum_p_dp = fmaf(p[j], dp, sum_p_dp);
        }
        sum_p_dp = warp_sum(sum_p_dp);
        for (int j = lane; j < Tk; j += WARP) ds_row[j] = p[j] * (ds_row[j] - sum_p_dp);
        __syncwarp(FULL_WARP);
        for (int d = lane; d < hs; d += WARP) {
            float gq = 0;
            for (int j = 0; j < Tk; j++) gq = fmaf(ds_row[j], xs[j * ld + d], gq);
            dq[(size_t)i * in.ld_q + d] = gq * scale;
        }
        __syncwarp(FULL_WARP);   // dout_row is free for the warp's next row
    }
    __syncthreads();   // every ds written; k and v no longer read
    rows_to_shared(xs, in.q + (size_t)b * Tq * in.ld_q + column, in.ld_q, in.q_bias + column, Tq,
                   hs);
    rows_to_shared(ys, dout_b, C, NULL, Tq, hs);
    __syncthreads();
    for (int j = warp; j < Tk; j += ROWS_PER_BLOCK)
        for (int d = lane; d < hs; d += WARP) {
            float gv = 0, gk = 0;
            for (int i = 0; i < Tq; i++) {
                gv = fmaf(pb[(size_t)i * Tk + j], ys[i * ld + d], gv);
                gk = fmaf(dsb[(size_t)i * Tk + j], xs[i * ld + d], gk);
            }
            dv[(size_t)j * in.ld_kv + d] = gv;
            dk[(size_t)j * in.ld_kv + d] = gk * scale;
        }
    __syncthreads();   // every dq, dk, dv of the block written (and seen by all its threads)
    // this sentence's sums: a thread per column of this head's dq, dk, dv, its rows in order
    float *partial = g.partials + (size_t)b * 3 * C + column;
    for (int e = (int)threadIdx.x; e < 3 * hs; e += (int)blockDim.x) {
        int part = e / hs, d = e - part * hs;
        float sum = 0;
        if (part == 0)
            for (int i = 0; i < Tq; i++) sum += dq[(size_t)i * in.ld_q + d];
        else
            for (int j = 0; j < Tk; j++) sum += (part == 1 ? dk : dv)[(size_t)j * in.ld_kv + d];
        partial[(size_t)part * C + d] = sum;
    }
    __threadfence();   // the partials reach every block before the count says they are there
    __syncthreads();
    if (threadIdx.x == 0)
        shared[0] = atomicAdd(&g.heads_done[head], 1u) == (unsigned)B - 1 ? 1.0f : 0.0f;
    __syncthreads();
    if (shared[0] == 0.0f)
        return;   // the whole block: another sentence's block finishes this head
    for (int e = (int)threadIdx.x; e < 3 * hs; e += (int)blockDim.x) {
        int part = e / hs, at = part * C + column + (e - part * hs);
        float total = 0;
        for (int sentence = 0; sentence < B; sentence++)
            total += LOAD_FROM_OTHER_BLOCKS(&g.partials[(size_t)sentence * 3 * C + at]);
        g.dbias[at] = total;
    }
    if (threadIdx.x == 0)
        g.heads_done[head] = 0;
}
CPU_KERNEL(fused_attention_backward_kernel, AttentionGradsInRows, float *, const float *,
           const float *, AttentionInRows, FusedShape)
