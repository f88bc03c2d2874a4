/* transposed_weights.h: --tf32's transposed copies of the weights (included by transformer_cuda.cu)
 *
 * Hopper's tensor cores read TF32 operands K-major: along the sum of the
 * product, consecutive in memory. A linear layer's forward product,
 * out^T = W^T-as-stored times inp^T (the "TN" call), has both operands so. Its
 * input's gradient, dinp^T (IC x N) = W (IC x OC) dout^T (OC x N) (the "NN"
 * call), does not: W as stored runs along IC, not along the sum's OC, and
 * cuBLAS must transpose it on the way in. With --tf32 each weight matrix also
 * has a transposed copy, which the NN products read as the TN call they then
 * are: dinp^T = (W^T)^T dout^T with W^T (OC x IC as stored, leading dimension
 * the matrix's rows). transpose_weights_kernel writes every copy after Adam
 * (and gpu_begin once, from the host's parameters), in one launch.
 *
 * The weights' gradients, dW^T (IC x OC) = inp^T dout (the "NT" call, a sum
 * over the batch's tokens), have activations for both operands; making them
 * K-major would take transposed copies of the activations, written every step:
 * not done (cuda/NOTES.md).
 *
 * The copies change no number: a product reads the same elements in the same
 * order either way, and cuda_on_cpu.h's products, which compute TF32 as fp32,
 * give the same bits with and without them (test_cuda.c checks it). Only
 * there for speed, so they live here; --weights-as-stored turns them off.
 *
 * Where each copy is:
 *   - a weight tensor of gpu.params: gpu.params_t at the same offset, each
 *     layer's matrix transposed whole (its rows become the copy's leading
 *     dimension; rows r0.. of a matrix are columns r0.. of its copy), except
 *     the cross-attention's W^Q, W^K, W^V, of which only the W^Q rows are
 *     copied (C x C, at the tensor's offset): its keys and values come from
 *     the memory's copy below. gpu.params_t has room for all P numbers; the
 *     places of the biases, the norms' gains and the cross W^K, W^V stay unused;
 *   - the memory's W^K, W^V of every decoder layer (gpu.memory_kv_w, L*2C x C):
 *     gpu.memory_kv_w_t (C x L*2C), written from gpu.params, since Adam has
 *     moved them after the forward pass gathered them.
 */

#define TRANSPOSE_TILE 32       // a block transposes a 32 x 32 tile
#define TRANSPOSE_TILE_ROWS 8   // with 32 x 8 threads, four rows of the tile each

// One matrix to transpose: `rows` x `cols` at from (row-major), written to
// to[c * to_ld + r]; its tiles are the launch's blocks first_tile on.
// in_params: `to` is the copy of a tensor of gpu.params at its own offset.
struct TransposedWeight {
    const float *from;
    float *to;
    int rows;
    int cols;
    int to_ld;
    int in_params;
    unsigned first_tile;
};

static unsigned transpose_tiles(int rows, int cols) {
    return blocks_for((size_t)rows, TRANSPOSE_TILE) * blocks_for((size_t)cols, TRANSPOSE_TILE);
}

// Every matrix of the table, a block per tile: a block finds its matrix (the
// last whose first tile is not after its own), reads the tile in rows and
// writes it in columns, through shared memory (TILE x (TILE + 1) floats: the
// extra column puts a column's numbers in different banks).
static __global__ void __launch_bounds__(TRANSPOSE_TILE * TRANSPOSE_TILE_ROWS)
transpose_weights_kernel(const TransposedWeight *table, int count) {
    SHARED_FLOATS(tile);
    unsigned block = blockIdx.x;
    int low = 0;
    int high = count - 1;
    while (low < high) {
        int middle = (low + high + 1) / 2;
        if (table[middle].first_tile <= block)
            low = middle;
        else
            high = middle - 1;
    }
    TransposedWeight w = table[low];
    unsigned t = block - w.first_tile;
    unsigned tiles_across = (unsigned)(w.cols + TRANSPOSE_TILE - 1) / TRANSPOSE_TILE;
    int row0 = (int)(t / tiles_across) * TRANSPOSE_TILE;
    int col0 = (int)(t % tiles_across) * TRANSPOSE_TILE;
    for (int i = threadIdx.y; i < TRANSPOSE_TILE; i += TRANSPOSE_TILE_ROWS) {
        int r = row0 + i;
        int c = col0 + (int)threadIdx.x;
        if (r < w.rows && c < w.cols)
            tile[i * (TRANSPOSE_TILE + 1) + threadIdx.x] = w.from[(size_t)r * w.cols + c];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < TRANSPOSE_TILE; i += TRANSPOSE_TILE_ROWS) {
        int c = col0 + i;
        int r = row0 + (int)threadIdx.x;
        if (r < w.rows && c < w.cols)
            w.to[(size_t)c * w.to_ld + r] = tile[threadIdx.x * (TRANSPOSE_TILE + 1) + i];
    }
}
CPU_KERNEL(transpose_weights_kernel, const TransposedWeight *, int)

// --weights-as-stored: with --tf32, no transposed copies
static int gpu_weights_as_stored;

// Whether the model's memory has the copies: TF32 products of fp32 numbers
// (bf16's products read their own copies, and bf16 tensor cores read either layout)
static int gpu_wants_transposed(void) { return gpu.tf32 && !gpu.bf16 && !gpu_weights_as_stored; }

// Appends w to the list (NULL: only counts), its tiles after the last one's; returns the new count
static int transposed_add(TransposedWeight *list, int count, TransposedWeight w) {
    if (list) {
        w.first_tile = 0;
        if (count > 0) {
            const TransposedWeight *last = &list[count - 1];
            w.first_tile = last->first_tile + transpose_tiles(last->rows, last->cols);
        }
        list[count] = w;
    }
    return count + 1;
}

// The copy of a tensor of gpu.params at its own offset in gpu.params_t: layer l's, rows x cols
static int transposed_add_tensor(TransposedWeight *list, int count, const Transformer *m,
                                 const real *host_tensor, size_t l, int rows, int cols) {
    size_t per_layer = (size_t)rows * cols;
    if (host_tensor == m->params.dec_cross_qkv_w)
        per_layer = (size_t)3 * cols * cols;   // (its W^Q rows alone)
    TransposedWeight w;
    memset(&w, 0, sizeof w);
    w.from = on_gpu(gpu.params, m, host_tensor, l, per_layer);
    w.to = list ? on_gpu(gpu.params_t, m, host_tensor, l, per_layer) : NULL;
    w.rows = rows;
    w.cols = cols;
    w.to_ld = rows;
    w.in_params = 1;
    return transposed_add(list, count, w);
}

// The matrices whose copies the inputs' gradients read: each layer's
// projections, the feed-forward networks' W_1, W_2, the shared embedding
// (the logits' product), and the memory's W^K, W^V gathered transposed.
// Returns their number (list NULL: only counts).
static int transposed_weights_list(TransposedWeight *list, const Transformer *m) {
    const ParameterTensors *p = &m->params;
    int C = m->config.d_model;
    int F = m->config.d_ff;
    int L = m->config.n_layers;
    int n = 0;
    for (int l = 0; l < L; l++) {
        n = transposed_add_tensor(list, n, m, p->enc_qkv_w, l, 3 * C, C);
        n = transposed_add_tensor(list, n, m, p->enc_out_w, l, C, C);
        n = transposed_add_tensor(list, n, m, p->enc_ff1_w, l, F, C);
        n = transposed_add_tensor(list, n, m, p->enc_ff2_w, l, C, F);
        n = transposed_add_tensor(list, n, m, p->dec_self_qkv_w, l, 3 * C, C);
        n = transposed_add_tensor(list, n, m, p->dec_self_out_w, l, C, C);
        n = transposed_add_tensor(list, n, m, p->dec_cross_qkv_w, l, C, C);
        n = transposed_add_tensor(list, n, m, p->dec_cross_out_w, l, C, C);
        n = transposed_add_tensor(list, n, m, p->dec_ff1_w, l, F, C);
        n = transposed_add_tensor(list, n, m, p->dec_ff2_w, l, C, F);
    }
    n = transposed_add_tensor(list, n, m, p->embedding, 0, m->config.vocab_size, C);
    for (int l = 0; l < L; l++) {   // layer l's W^K, W^V (2C x C) to
                                    // columns l*2C.. of the (C x L*2C) copy
        TransposedWeight w;
        memset(&w, 0, sizeof w);
        w.from = on_gpu(gpu.params, m, p->dec_cross_qkv_w, l, (size_t)3 * C * C) + (size_t)C * C;
        w.to = list ? gpu.memory_kv_w_t + (size_t)l * 2 * C : NULL;
        w.rows = 2 * C;
        w.cols = C;
        w.to_ld = L * 2 * C;
        n = transposed_add(list, n, w);
    }
    return n;
}

// The table of the copies, on the host (for gpu_transposed_weight) and on
// the GPU (for the kernel), once the model's memory is carved
static void gpu_transposed_prepare(const Transformer *m, TransposedWeight *table_on_gpu) {
    int count = transposed_weights_list(NULL, m);
    gpu.transposed = (TransposedWeight *)calloc((size_t)count, sizeof(TransposedWeight));
    if (!gpu.transposed) {
        fprintf(stderr, "error: out of memory (the transposed weights' table)\n");
        exit(1);
    }
    transposed_weights_list(gpu.transposed, m);
    gpu.transposed_count = count;
    const TransposedWeight *last = &gpu.transposed[count - 1];
    gpu.transposed_tiles = last->first_tile + transpose_tiles(last->rows, last->cols);
    gpu.transposed_table = table_on_gpu;
    gpu_copy(table_on_gpu, gpu.transposed, (size_t)count * sizeof(TransposedWeight),
             cudaMemcpyHostToDevice);
}

// The floats the table takes in the model's memory (carve counts floats)
static size_t transposed_table_floats(const Transformer *m) {
    size_t bytes = (size_t)transposed_weights_list(NULL, m) * sizeof(TransposedWeight);
    return (bytes + sizeof(float) - 1) / sizeof(float);
}

// Every copy written from gpu.params: after each Adam update, and at begin
static void gpu_transpose_weights(void) {
    if (!gpu.transposed)
        return;
    size_t shared = (size_t)TRANSPOSE_TILE * (TRANSPOSE_TILE + 1) * sizeof(float);
    LAUNCH(transpose_weights_kernel, gpu.transposed_tiles,
           xyz(TRANSPOSE_TILE, TRANSPOSE_TILE_ROWS, 1), shared, gpu.transposed_table,
           gpu.transposed_count);
}

// The transposed copy of rows r0.. of a weight matrix, `rows` x `cols` at
// weight (inside gpu.params), and its leading dimension in *ld; NULL when it has none
static const float *gpu_transposed_weight(const float *weight, int rows, int cols, int *ld) {
    for (int i = 0; i < gpu.transposed_count; i++) {
        const TransposedWeight *w = &gpu.transposed[i];
        if (!w->in_params || weight < w->from || weight >= w->from + (size_t)w->rows * w->cols)
            continue;
        size_t offset = (size_t)(weight - w->from);
        size_t r0 = offset / (size_t)w->cols;
        if (w->cols != cols || offset % (size_t)w->cols != 0 || r0 + (size_t)rows > (size_t)w->rows)
            return NULL;
        *ld = w->to_ld;
        return w->to + r0;
    }
    return NULL;
}
