/* bf16_casts.h: the bf16 copies that --bf16's products read (included by transformer_cuda.cu)
 *
 * With --bf16 every matrix product multiplies bf16 numbers and adds their
 * products in fp32 into an fp32 output (cublasGemmEx, CUBLAS_COMPUTE_32F);
 * everything else stays fp32: the master weights, Adam's moments, the residual
 * stream, the layer norms' statistics, the softmax, the loss. Only there for
 * speed (bf16 tensor cores run about 2x TF32's rate on Hopper), so it lives
 * here, beside the step that transformer.c's order lays out. Each product's
 * operand is found a bf16 copy of the same layout (gpu_bf16_operand):
 *   - a weight (a tensor of gpu.params): gpu.params_bf16 at the same offset,
 *     which adam_kernel writes with each update (and gpu_begin once, from the
 *     host's parameters); the memory's gathered W^K, W^V (gpu.memory_kv_w) are
 *     gathered from that copy into gpu.memory_kv_w_bf16;
 *   - an activation (a tensor of the batch's allocation): cast by
 *     bf16_cast_kernel just before the product into gpu.batch_bf16 at the same
 *     offset, exactly the elements the product reads (operand_extent).
 * The casts are launches of their own: a later change may write the copies
 * where the activations are made, in the kernels between the products.
 *
 * On two streams (transformer_cuda.cu, "the two streams") each product casts
 * its activations on its own stream, except the one both of a linear layer's
 * backward products read, its output's gradient: the main stream casts that
 * once before the fork (gpu_bf16_shared_begin), so that neither stream writes
 * the copy while the other may still read it; the side stream's own casts
 * (the layer's input) go to copies the main stream neither reads nor writes
 * before its next join.
 */

// out_i = in_i rounded to the nearest bf16 (ties to even), one thread per element
static __global__ void __launch_bounds__(THREADS)
bf16_cast_kernel(__nv_bfloat16 *out, const float *in, size_t n) {
    size_t i = ELEMENT_INDEX;
    if (i < n)
        out[i] = __float2bfloat16(in[i]);
}
CPU_KERNEL(bf16_cast_kernel, __nv_bfloat16 *, const float *, size_t)

// The elements a product's operand spans as stored (column-major): op(X) is
// op_rows x op_cols, `count` of them `stride` apart (what cuda_on_cpu.h checks)
static size_t operand_extent(cublasOperation_t op, int op_rows, int op_cols, int ld,
                             long long stride, int count) {
    int rows = op == CUBLAS_OP_N ? op_rows : op_cols, cols = op == CUBLAS_OP_N ? op_cols : op_rows;
    if (rows <= 0 || cols <= 0 || count <= 0)
        return 0;
    return (size_t)(count - 1) * (size_t)stride + (size_t)(cols - 1) * (size_t)ld + (size_t)rows;
}

// Whether x lies in the n floats from start
static int inside(const float *x, const float *start, size_t n) {
    uintptr_t at = (uintptr_t)x, first = (uintptr_t)start;
    return start && at >= first && at < first + n * sizeof(float);
}

// The activation cast once for both streams' products (gpu_bf16_shared_begin
// to gpu_bf16_shared_end; NULL: none), and its elements
static const float *gpu_bf16_shared;
static size_t gpu_bf16_shared_elements;

// Where x's bf16 copy is (nothing cast), or NULL when x has none
static __nv_bfloat16 *gpu_bf16_copy_of(const float *x) {
    size_t kv_w = (size_t)gpu.config.n_layers * 2 * gpu.config.d_model * gpu.config.d_model;
    if (inside(x, gpu.params, gpu.num_parameters))
        return gpu.params_bf16 + (x - gpu.params);
    if (inside(x, gpu.memory_kv_w, kv_w))
        return gpu.memory_kv_w_bf16 + (x - gpu.memory_kv_w);
    if (inside(x, gpu.batch_memory, gpu.batch_capacity))
        return gpu.batch_bf16 + (x - gpu.batch_memory);
    return NULL;
}

// The bf16 copy of a product's operand x, `elements` of it (operand_extent):
// a weight's is kept by Adam; an activation's is cast now, in the stream's
// order, unless it is the one already cast for both streams.
static const __nv_bfloat16 *gpu_bf16_operand(const float *x, size_t elements) {
    __nv_bfloat16 *copy = gpu_bf16_copy_of(x);
    if (copy && inside(x, gpu.batch_memory, gpu.batch_capacity)) {
        int cast = !(x == gpu_bf16_shared && elements <= gpu_bf16_shared_elements);
        if (cast && elements > 0)
            LAUNCH_ELEMENTS(elements, bf16_cast_kernel, copy, x, elements);
        return copy;
    }
    if (copy)
        return copy;   // a weight's, which Adam keeps
    fprintf(stderr, "error: --bf16: a product's operand (%zu floats at %p) is neither a weight "
                    "nor an activation, and has no bf16 copy\n", elements, (const void *)x);
    exit(1);
}

// --bf16: x (`elements` of it), an activation both streams' products read,
// cast now on the main stream (before gpu_side_begin's fork), and not again
// by those products (until gpu_bf16_shared_end). Without --bf16: nothing.
static void gpu_bf16_shared_begin(const float *x, size_t elements) {
    if (!gpu.bf16)
        return;
    gpu_bf16_shared = NULL;
    gpu_bf16_operand(x, elements);
    gpu_bf16_shared = x;
    gpu_bf16_shared_elements = elements;
}
static void gpu_bf16_shared_end(void) { gpu_bf16_shared = NULL; }
