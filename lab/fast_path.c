/* lab/fast_path.c: transformer.c's products, many times faster, and decoding with a cache
 *
 * Nothing here changes what the model computes, only how fast: the products
 * of the linear layers (§3) and of attention (§3.2.1) as register tiles over
 * packed blocks, each number of a product the same sum in the same order
 * whatever the number of threads, and decoding (§6.1) with a key/value cache.
 * transformer.c's linear_forward, linear_backward, attention_forward,
 * attention_backward and decoder_begin, _step, _reorder and _end hand their
 * calls to these on their first line once fast_path_use(1) has set
 * transformer.c's `fast_path` hooks (lab.c does, for make's ./transformer);
 * transformer.c alone runs its own loops. The tests check each against those
 * loops. A piece stays here only if it makes a toy or base training step, or
 * decoding, at least 5% faster (dev/PERFORMANCE.md has what each gave and
 * what was tried and dropped).
 *
 * BUILD  included by lab/lab.c after transformer.c (it uses transformer.c's
 *        visible_keys, softmax_visible, softmax_backward, allocation, the
 *        layers' forward functions and the arenas' layouts)
 */

// ----------------------------------------------------------------------------
// The matrix product. Nearly all the arithmetic of a training step is
//     out += A B        out is (rows, cols), A is (rows, depth), B is (depth, cols)
// in one of three forms: y = x W^T (forward), dx = dy W and dW = dy^T x
// (backward). A MatrixView says where element (row, col) of A or B lives, so
// one function serves all three: a transposed matrix is the same memory with
// its two strides swapped.
//
// Why not the three-line loop  for m, n, d: out[m][n] += A[m][d] B[d][n]?  A
// core can do 16 or more multiply-adds per cycle on vectors but load only two
// or three numbers, and that loop loads two numbers per multiply-add and
// reads B from memory once for every row of out. Three ideas, in C with one
// extension of gcc and clang, vectors of numbers (Vector, below):
//
// 1. Register tiles. out is computed in tiles of TILE_ROWS x TILE_COLS (8 x 32
//    floats with AVX-512's 32 vector registers, 6 x 16 with AVX2's 16). The
//    tile's sums are vector registers from the first step of the depth loop
//    to the store; each step d reads a column of TILE_ROWS numbers of A and
//    a row of TILE_COLS numbers of B, and does every product of the two:
//
//             dc                         TILE_COLS = 32
//          +---------+                 +----------------------+
//        8 | #       |   x          dc | #################### | -> sum[8][32] += a[.][d] * b[d][.]
//          +---------+                 |                      |
//          A strip, step d: column #    +----------------------+  B strip, step d: row #
//
//    A row of B is two vectors; each number of A is multiplied by both.
// 2. Packing. The tile reads B a row of TILE_COLS numbers at a time. A block
//    of B is first copied ("packed") into strips of TILE_COLS columns, each
//    dc deep and contiguous, in exactly the order the tile reads them: every
//    read is then sequential whatever the strides of B (W^T in the forward
//    pass is read down the columns of W). A is read where it lies, TILE_ROWS
//    numbers per step, when its rows are contiguous (x in x W^T, dy in dy W);
//    a transposed A (dy^T in dy^T x) is copied into a strip of its own. A
//    last strip of fewer rows is summed in a tile of its own height.
// 3. Cache blocks. The depth is cut into blocks of DEPTH_BLOCK (128) and the
//    columns into width blocks of WIDTH_BLOCK (512). A packed block of B, 128 x 512
//    floats = 256 KB, stays in the level-2 cache while the strips of A pass
//    by; a strip of A, 8 x 128 floats = 4 KB, stays in the level-1 cache
//    while it meets the block's 16 strips of B:
//
//        for each width block of B (512 columns):
//          for each depth block (128 values of d):
//            pack the 128 x 512 block of B into 16 strips of 128 x 32
//            for each 8-row strip of A (among this thread's rows):
//              for each 32-column strip of the packed block:
//                tile: out[8 rows][32 columns] += A[8][128] B[128][32]
//
//    out[m][n] receives its depth blocks' sums in order d = 0, 128, 256, ...
//
// Decoding multiplies each weight by one row per sentence or beam at every
// position: the weight is packed once for the whole decoding, and its
// products share out its strips among the threads (linear_forward_packed).
//
// Threads: each takes an equal share of the strips of rows of out and packs
// the blocks of B it needs itself (a little copying done twice, but no
// thread ever waits for another; in training, B packed whole, once, by the
// threads together made one thread's product 15% slower, dev/PERFORMANCE.md). Each
// element of out belongs to one thread and is summed in the same order
// whatever the number of threads.
// ----------------------------------------------------------------------------

// Element (row, col) of a matrix view is data[row * row_stride + col * col_stride].
typedef struct {
    const real *data;
    size_t row_stride, col_stride;
} MatrixView;

// One product, in the form every caller gives it:
//     out = bias + A B    (accumulate 0; with bias.data NULL, out = A B)
//     out += A B          (accumulate 1)
// out is (out_rows, out_cols), its element (m, n) at out[m * out_row + n *
// out_col]; A is (out_rows, depth), B is (depth, out_cols); depth >= 1. The
// bias is a view whose rows are all the same (row stride 0): bias(m, n) = bias[n].
typedef struct {
    real *out;
    size_t out_row, out_col;
    MatrixView a, b, bias;
    int out_rows, out_cols, depth, accumulate;
} MatrixProduct;

// The tile is two of the machine's vector registers wide and 8 rows tall
// where there are 32 vector registers (AVX-512, NEON), 6 where there are 16
// (AVX2, SSE2): its 2 x TILE_ROWS registers of sums then stay in registers,
// with room for a row of B and a number of A.
#if defined(__AVX512F__)
#define VECTOR_BYTES 64
#define VECTOR_REGISTERS 32
#elif defined(__AVX__)
#define VECTOR_BYTES 32
#define VECTOR_REGISTERS 16
#elif defined(__aarch64__)
#define VECTOR_BYTES 16
#define VECTOR_REGISTERS 32
#else
#define VECTOR_BYTES 16
#define VECTOR_REGISTERS 16
#endif
#define TILE_ROWS (VECTOR_REGISTERS == 32 ? 8 : 6)
#define TILE_COLS (2 * VECTOR_BYTES / (int)sizeof(real))  // AVX-512: 32 floats, 16 doubles
#define LINE_NUMBERS (CACHE_LINE / (int)sizeof(real))   // the numbers of one cache line
#define DEPTH_BLOCK 128
#define WIDTH_BLOCK 512
_Static_assert(WIDTH_BLOCK % TILE_COLS == 0, "a block of B must hold whole strips");

// A vector register of VECTOR_LANES numbers, as gcc's and clang's vector
// extension writes it. The tiles hold their sums in arrays of these: a
// fixed count of vectors, which the compiler keeps in registers from the
// first step to the store. (With the sums as an array of numbers, gcc
// zeroed the array in memory with a call to memset, and stored the sums
// there before adding them to out: 16% of the tile's time in a toy step.)
// Loads and stores go through memcpy, which assumes no alignment.
typedef real Vector __attribute__((vector_size(VECTOR_BYTES)));
#define VECTOR_LANES (VECTOR_BYTES / (int)sizeof(real))
static inline Vector vector_load(const real *p) {
    Vector v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void vector_store(real *p, Vector v) {
    memcpy(p, &v, sizeof v);
}

static int min_int(int a, int b) {
    return a < b ? a : b;
}

// Uninitialised memory at a multiple of CACHE_LINE bytes (see arena_calloc); free() it.
static void *checked_aligned_malloc(size_t count, size_t size, const char *what) {
    int overflows = size != 0 && count > (SIZE_MAX - CACHE_LINE) / size;
    size_t bytes = overflows ? 0 : count * size;
    size_t lines = bytes / CACHE_LINE + (bytes % CACHE_LINE != 0) + (bytes == 0);
    void *p = overflows ? NULL : aligned_alloc(CACHE_LINE, lines * CACHE_LINE);   // whole lines
    if (!p) {
        fprintf(stderr, "error: %sout of memory allocating %s (%zu x %zu bytes)\n", error_context,
                what, count, size);
        exit(1);
    }
    return p;
}

// A copy of the rows m0 .. m0+height-1 of A before row m_end, depths d0 ..
// d0+dc-1: strip[d * height + r] = A[m0 + r][d0 + d]. A last strip of fewer
// rows leaves the rest of each step's `height` numbers unwritten: its tile,
// as tall as its rows, never reads them.
static void pack_a_strip(real *strip, MatrixView a, int m0, int m_end, int d0, int dc, int height) {
    int rows = min_int(m_end - m0, height);
    const real *a0 = a.data + (size_t)m0 * a.row_stride + (size_t)d0 * a.col_stride;
    if (a.row_stride == 1 && rows == height) {
        // A transposed (dy^T in dW = dy^T x): the strip's numbers for one d
        // lie side by side, so each step is a copy of `height` numbers (a
        // memcpy of a fixed size: vector moves, where gcc 12 made the loop scalar)
        for (int d = 0; d < dc; d++)
            memcpy(strip + d * height, a0 + (size_t)d * a.col_stride,
                   (size_t)height * sizeof(real));
        return;
    }
    for (int r = 0; r < rows; r++)
        for (int d = 0; d < dc; d++)
            strip[d * height + r] = a0[(size_t)r * a.row_stride + (size_t)d * a.col_stride];
}

// `count` strips of B side by side, each `width` columns (the tile's) and dc
// deep, the first from column n0: strip s is
// packed[(s * dc + d) * width + j] = B[d0 + d][n0 + s * width + j], zeros
// from column b_cols on. It reads B along whichever direction B is contiguous in.
// Rows contiguous: one pass along each row of B for all the strips, which
// the hardware prefetcher follows (strip by strip, every row of a strip
// would start a new cache line), a strip's row one memcpy of a fixed size
// (vector moves, where gcc 12 made the loop scalar). Columns contiguous (B a
// transposed matrix, W^T in x W^T): along each column, strip by strip.
static void pack_b_strips(real *packed, MatrixView b, int n0, int b_cols, int d0, int dc, int width,
                          int count) {
    if (b.col_stride == 1) {
        // strips that lie wholly left of column b_cols
        int full = min_int(count, (b_cols - n0) / width);
        for (int d = 0; d < dc; d++) {
            const real *row = b.data + (size_t)(d0 + d) * b.row_stride;
            for (int s = 0; s < full; s++)
                memcpy(packed + ((size_t)s * dc + d) * width, row + n0 + s * width,
                       (size_t)width * sizeof(real));
            for (int s = full; s < count; s++)   // a last strip that reaches past column b_cols
                for (int j = 0; j < width; j++)
                    packed[((size_t)s * dc + d) * width + j] =
                        n0 + s * width + j < b_cols ? row[n0 + s * width + j] : 0;
        }
        return;
    }
    for (int s = 0; s < count; s++) {
        int j0 = n0 + s * width, cols = min_int(b_cols - j0, width);
        const real *b0 = b.data + (size_t)d0 * b.row_stride + (size_t)j0 * b.col_stride;
        real *strip = packed + (size_t)s * dc * width;
        for (int j = 0; j < cols; j++)
            for (int d = 0; d < dc; d++)
                strip[d * width + j] = b0[(size_t)j * b.col_stride + (size_t)d * b.row_stride];
        for (int d = 0; d < dc; d++)
            for (int j = cols; j < width; j++) strip[d * width + j] = 0;
    }
}

// The sums of a tile of `rows` x `vectors` vectors over one depth block:
// sum[r * vectors + v] lane i = sum_d A[r][d] * b[(d * vectors + v) * VECTOR_LANES + i],
// d = 0 .. dc-1 in order, with A's (r, d) at a[r * a_row + d * a_col] and b a
// packed strip of B. The tiles call it with fixed sizes, and its loops over
// them unrolled, so that once inlined its sums are vector registers.
static inline void tile_sums(Vector *sum, int rows, int vectors, const real *a, size_t a_row,
                             size_t a_col, const real *b, int dc) {
    #pragma GCC unroll 16
    for (int i = 0; i < rows * vectors; i++) sum[i] = (Vector){ 0 };
    for (int d = 0; d < dc; d++) {
        #pragma GCC unroll 16
        for (int r = 0; r < rows; r++) {
            real ard = a[r * a_row + d * a_col];
            #pragma GCC unroll 2
            for (int v = 0; v < vectors; v++)
                sum[r * vectors + v] +=
                    ard * vector_load(b + ((size_t)d * vectors + v) * VECTOR_LANES);
        }
    }
}

// out[r][j] += sum[r][j] (accumulate) or out[r][j] = bias[r][j] + sum[r][j]
// (bias NULL: 0) for the first rows x cols of a tile of sums, any strides:
// out's element (r, j) is out[r * out_row + j * out_col], the bias's
// bias[r * bias_row + j * bias_col], the sum's sum[r * sum_cols + j].
static void store_tile(real *out, size_t out_row, size_t out_col, const real *sum, int sum_cols,
                       int rows, int cols, int accumulate, const real *bias, size_t bias_row,
                       size_t bias_col) {
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++) {
            real *o = out + (size_t)r * out_row + (size_t)j * out_col;
            real start = accumulate ? *o
                         : bias ? bias[(size_t)r * bias_row + (size_t)j * bias_col] : 0;
            *o = start + sum[r * sum_cols + j];
        }
}

// The register tile where it is whole and the rows of out (and of the bias)
// are contiguous, nearly every tile: the sums of a strip of A (TILE_ROWS
// rows, from a_strip) and a packed strip of B (TILE_COLS columns) over one
// depth block, added to out (accumulate) or stored as bias + sum (bias NULL:
// the sum), straight from the registers.
__attribute__((noinline)) static void matmul_tile_whole(real *out, size_t out_row, const real *a,
                                                        size_t a_row, size_t a_col, const real *b,
                                                        int dc, int accumulate, const real *bias,
                                                        size_t bias_row) {
    enum { VECTORS = TILE_COLS / VECTOR_LANES };
    Vector sum[TILE_ROWS * VECTORS];
    tile_sums(sum, TILE_ROWS, VECTORS, a, a_row, a_col, b, dc);
    #pragma GCC unroll 16
    for (int r = 0; r < TILE_ROWS; r++)
        #pragma GCC unroll 2
        for (int v = 0; v < VECTORS; v++) {
            real *o = out + (size_t)r * out_row + v * VECTOR_LANES;
            Vector s = sum[r * VECTORS + v];
            if (accumulate)
                vector_store(o, vector_load(o) + s);
            else if (bias)
                vector_store(o, vector_load(bias + (size_t)r * bias_row + v * VECTOR_LANES) + s);
            else
                vector_store(o, s);
        }
}

// The register tile at the edge of out, or with out or the bias
// transposed: the same sums, stored into the first rows x cols of the tile
// of out at `out` (store_tile's arguments). A last strip of fewer rows is
// summed in a tile of its own height: base decoding's 8 sentences are, in
// AVX2's tiles of 6 rows, a strip of 6 and one of 2, and that 2 summed as 6
// took 14% of base decoding on a Zen 3, 9.6% as 2 (perf, dev/PERFORMANCE.md).
__attribute__((noinline)) static void matmul_tile_edge(real *out, size_t out_row, size_t out_col,
                                                       const real *a, size_t a_row, size_t a_col,
                                                       const real *b, int dc, int rows, int cols,
                                                       int accumulate, const real *bias,
                                                       size_t bias_row, size_t bias_col) {
    enum { VECTORS = TILE_COLS / VECTOR_LANES };
    Vector sum[TILE_ROWS * VECTORS];
    // a tile of exactly `rows` rows: each case's sizes constants, so that its sums are registers
    switch (rows) {
#define SHORT_TILE(height)                                       \
    case height:                                                 \
        tile_sums(sum, height, VECTORS, a, a_row, a_col, b, dc); \
        break;
    SHORT_TILE(1) SHORT_TILE(2) SHORT_TILE(3) SHORT_TILE(4) SHORT_TILE(5)
#if TILE_ROWS == 8
    SHORT_TILE(6) SHORT_TILE(7)
#endif
#undef SHORT_TILE
    default:
        tile_sums(sum, TILE_ROWS, VECTORS, a, a_row, a_col, b, dc);
    }
    real stored[TILE_ROWS * TILE_COLS];
    memcpy(stored, sum, (size_t)rows * TILE_COLS * sizeof(real));
    store_tile(out, out_row, out_col, stored, TILE_COLS, rows, cols, accumulate, bias, bias_row,
               bias_col);
}

// One tile, any tile: matmul_tile_whole where it is whole, else matmul_tile_edge.
// The choice is made here, inline, so that a whole tile does not first enter
// matmul_tile_edge, whose frame (the sums and their copy, 32-byte aligned)
// took 9.3% of toy decoding's samples at its first instructions when it
// was the way to every tile (perf, dev/PERFORMANCE.md).
static inline void matmul_tile(real *out, size_t out_row, size_t out_col, const real *a,
                               size_t a_row, size_t a_col, const real *b, int dc, int rows,
                               int cols, int accumulate, const real *bias, size_t bias_row,
                               size_t bias_col) {
    if (rows == TILE_ROWS && cols == TILE_COLS && out_col == 1 && (!bias || bias_col == 1))
        matmul_tile_whole(out, out_row, a, a_row, a_col, b, dc, accumulate, bias, bias_row);
    else
        matmul_tile_edge(out, out_row, out_col, a, a_row, a_col, b, dc, rows, cols, accumulate,
                         bias, bias_row, bias_col);
}

// Room for one packed block of B: DEPTH_BLOCK x WIDTH_BLOCK numbers (256 KB of floats).
static real *packed_b_alloc(void) {
    return checked_aligned_malloc((size_t)DEPTH_BLOCK * WIDTH_BLOCK, sizeof(real),
                                  "matrix product scratch");
}

// The strip of rows m0 .. m0+height-1 of A (before row m_end), depths d0 ..
// d0+dc-1, as a tile reads it: where it lies when A's rows are contiguous,
// else copied into packed_a (pack_a_strip). *a_row and *a_col get the
// strides of what it returns.
static const real *a_strip(size_t *a_row, size_t *a_col, real *packed_a, MatrixView a,
                           int m0, int m_end, int d0, int dc, int height) {
    if (a.col_stride != 1) {
        pack_a_strip(packed_a, a, m0, m_end, d0, dc, height);
        *a_row = 1;
        *a_col = (size_t)height;
        return packed_a;
    }
    *a_row = a.row_stride;
    *a_col = 1;
    return a.data + (size_t)m0 * a.row_stride + (size_t)d0;
}

// Rows [m_first, m_end) of the product p, by the calling thread alone;
// packed_b comes from packed_b_alloc.
static void matmul_rows(const MatrixProduct *p, int m_first, int m_end, real *packed_b) {
    _Alignas(CACHE_LINE) real packed_a[TILE_ROWS * DEPTH_BLOCK];
    for (int n0 = 0; n0 < p->out_cols; n0 += WIDTH_BLOCK) {
        int strips = (min_int(p->out_cols - n0, WIDTH_BLOCK) + TILE_COLS - 1) / TILE_COLS;
        for (int d0 = 0; d0 < p->depth; d0 += DEPTH_BLOCK) {
            int dc = min_int(p->depth - d0, DEPTH_BLOCK);
            int accumulate = p->accumulate || d0 > 0;   // later depth blocks add to the first
            pack_b_strips(packed_b, p->b, n0, p->out_cols, d0, dc, TILE_COLS, strips);
            for (int m0 = m_first; m0 < m_end; m0 += TILE_ROWS) {
                size_t a_row, a_col;
                const real *a = a_strip(&a_row, &a_col, packed_a, p->a, m0, m_end, d0, dc,
                                        TILE_ROWS);
                for (int s = 0; s < strips; s++) {
                    int j0 = n0 + s * TILE_COLS;
                    const real *bias = p->bias.data
                        ? p->bias.data + (size_t)m0 * p->bias.row_stride
                              + (size_t)j0 * p->bias.col_stride
                        : NULL;
                    matmul_tile(p->out + (size_t)m0 * p->out_row + (size_t)j0 * p->out_col,
                                p->out_row, p->out_col, a, a_row, a_col,
                                packed_b + (size_t)s * TILE_COLS * dc, dc,
                                min_int(m_end - m0, TILE_ROWS),
                                min_int(p->out_cols - j0, TILE_COLS), accumulate, bias,
                                p->bias.row_stride, p->bias.col_stride);
                }
            }
        }
    }
}

// The part [*first, *end) of `count` items that this thread takes in a
// parallel region: equal contiguous shares, the first share to thread 0.
static void thread_share(int count, int *first, int *end) {
#ifdef _OPENMP
    int thread = omp_get_thread_num(), threads = omp_get_num_threads();
#else
    int thread = 0, threads = 1;
#endif
    *first = (int)((long long)count * thread / threads);
    *end = (int)((long long)count * (thread + 1) / threads);
}

// This thread's share of `count` products that write different outputs,
// called by every thread of one parallel region: an equal share of the
// strips of TILE_ROWS rows of out of each product. No thread waits for another.
static void products_by_this_thread(const MatrixProduct *p, int count) {
    real *packed_b = NULL;
    for (int i = 0; i < count; i++) {
        if (p[i].out_rows <= 0 || p[i].out_cols <= 0)
            continue;
        int first, end;
        thread_share((p[i].out_rows + TILE_ROWS - 1) / TILE_ROWS, &first, &end);
        if (first == end)
            continue;
        if (!packed_b)
            packed_b = packed_b_alloc();
        matmul_rows(&p[i], first * TILE_ROWS, min_int(end * TILE_ROWS, p[i].out_rows), packed_b);
    }
    free(packed_b);
}

// The whole product p, shared among the threads.
static void matmul(MatrixProduct p) {
    #pragma omp parallel
    products_by_this_thread(&p, 1);
}

// out = bias + A B: out is (rows, cols) with row stride out_row, a is
// (rows, depth), b is (depth, cols); bias is (cols) or NULL.
static void matmul_assign(real *out, size_t out_row, MatrixView a, MatrixView b, const real *bias,
                          int rows, int cols, int depth) {
    MatrixProduct p = { out, out_row, 1, a, b, { bias, 0, 1 }, rows, cols, depth, 0 };
    matmul(p);
}

// The same, by the calling thread alone (attention: one head's small
// products per thread); packed_b comes from packed_b_alloc.
static void matmul_by_this_thread(real *out, size_t out_row, MatrixView a, MatrixView b,
                                  int rows, int cols, int depth, int accumulate, real *packed_b) {
    MatrixProduct p = { out, out_row, 1, a, b, { NULL, 0, 0 }, rows, cols, depth, accumulate };
    matmul_rows(&p, 0, rows, packed_b);
}

// ----------------------------------------------------------------------------
// The linear layer of §3 in tiles: linear_forward's and linear_backward's sums.

// Decoding multiplies each weight by a few rows (one per sentence or beam) at
// every position, and the weights stay as they are from the first position
// to the last. matmul would pack W^T again at every position, for a few
// multiply-adds per number packed, by one thread where the rows make one
// strip (base's 8 sentences). So while the cache decodes (from
// cached_decoder_begin to cached_decoder_end, which call fast_path_decoding),
// the first product of each weight packs all of its W^T, the threads
// together, into strips of TILE_COLS columns the whole depth deep, and every
// product of the decoding reads them: the threads share out the strips, and
// each strip meets every strip of TILE_ROWS rows of x in the wide tile.
// out[n][o] receives the same depth blocks' sums, each in the same order, as
// from matmul: the same bits.
//
// When decoding ends the packs are forgotten (the weights may change before
// the next decoding) but their memory is kept for the next decoding's packs
// of the same sizes (the same model): the operating system's first touch of
// new memory took longer than the packing itself.
#define DECODING_ROWS 512  // the products of at most so many rows (sentences or beams) that read
                           // packed weights
typedef struct {
    const real *weight;
    int IC, OC;
    size_t numbers;
    real *strips;
} PackedWeight;   // weight NULL: free
static struct {
    int decodings, count;
    PackedWeight *packed;
    real *kept_arena;     // the batched decoder's arena of `kept_numbers` numbers (below), kept
    size_t kept_numbers;  // from one batch of sentences to the next while a decoding goes on
} decoding_weights;   // decodings begun, not ended

// No decoding under way: every pack forgotten, its memory kept; the kept arena freed.
static void forget_packed_weights(void) {
    decoding_weights.decodings = 0;
    for (int i = 0; i < decoding_weights.count; i++) decoding_weights.packed[i].weight = NULL;
    arena_free(decoding_weights.kept_arena);
    decoding_weights.kept_arena = NULL;
    decoding_weights.kept_numbers = 0;
}

// transformer.c's hook: a decoding begins (1) or ends (0); the packs last until the last one ends.
static void fast_path_decoding(int begins) {
    decoding_weights.decodings += begins ? 1 : -1;
    if (decoding_weights.decodings <= 0)
        forget_packed_weights();
}

// The packed strips of W^T for weight (OC, IC) in this decoding, packed on
// the first call by the threads together: strip s, depth d, column j is
// strips[(s * IC + d) * TILE_COLS + j] = weight[s * TILE_COLS + j][d] (0 from row OC on),
// copied a cache line of each of the strip's rows of the weight at a time.
static const real *packed_weight(const real *weight, int IC, int OC) {
    int count = (OC + TILE_COLS - 1) / TILE_COLS;
    size_t numbers = (size_t)count * TILE_COLS * IC;
    PackedWeight *free_one = NULL;
    for (int i = 0; i < decoding_weights.count; i++) {
        PackedWeight *p = &decoding_weights.packed[i];
        if (p->weight == weight && p->IC == IC && p->OC == OC)
            return p->strips;
        if (!p->weight && p->numbers == numbers)
            free_one = p;
    }
    if (!free_one) {
        decoding_weights.packed = checked_realloc(decoding_weights.packed,
                                                  decoding_weights.count + 1,
                                                  sizeof(PackedWeight), "packed weights");
        free_one = &decoding_weights.packed[decoding_weights.count++];
        *free_one = (PackedWeight){ NULL, 0, 0, numbers,
                                    checked_aligned_malloc(numbers, sizeof(real),
                                                           "packed weights") };
    }
    *free_one = (PackedWeight){ weight, IC, OC, numbers, free_one->strips };
    real *strips = free_one->strips;
    #pragma omp parallel for
    for (int s = 0; s < count; s++) {
        real *strip = strips + (size_t)s * TILE_COLS * IC;
        const real *rows = weight + (size_t)s * TILE_COLS * IC;
        int height = min_int(OC - s * TILE_COLS, TILE_COLS);
        for (int d0 = 0; d0 < IC; d0 += LINE_NUMBERS)
            for (int j = 0; j < TILE_COLS; j++)
                for (int d = d0; d < min_int(d0 + LINE_NUMBERS, IC); d++)
                    strip[(size_t)d * TILE_COLS + j] = j < height ? rows[(size_t)j * IC + d] : 0;
    }
    return strips;
}

// out = bias + inp W^T from W^T's packed strips, each thread an equal share
// of the strips; the rows of inp are read where they lie, a last strip of
// fewer than TILE_ROWS rows (base's 8 sentences in tiles of 6) in a tile of
// its own height.
// out is (N, OC), inp is (N, IC), strips from packed_weight (W is (OC, IC)), bias is (OC) or NULL
static void linear_forward_packed(real *out, const real *inp, const real *strips, const real *bias,
                                  int N, int IC, int OC) {
    int count = (OC + TILE_COLS - 1) / TILE_COLS;
    #pragma omp parallel
    {
        int first, end;
        thread_share(count, &first, &end);
        for (int s = first; s < end; s++) {
            int j0 = s * TILE_COLS;
            for (int m0 = 0; m0 < N; m0 += TILE_ROWS)
                for (int d0 = 0; d0 < IC; d0 += DEPTH_BLOCK)
                    matmul_tile(out + (size_t)m0 * OC + j0, (size_t)OC, 1,
                                inp + (size_t)m0 * IC + d0, (size_t)IC, 1,
                                strips + ((size_t)s * IC + d0) * TILE_COLS,
                                min_int(IC - d0, DEPTH_BLOCK), min_int(N - m0, TILE_ROWS),
                                min_int(OC - j0, TILE_COLS), d0 > 0,
                                bias ? bias + j0 : NULL, 0, 1);
        }
    }
}

// out is (N, OC), inp is (N, IC), weight is (OC, IC), bias is (OC) or NULL
static void linear_forward_fast(real *out, const real *inp, const real *weight, const real *bias,
                                int N, int IC, int OC) {
    if (decoding_weights.decodings > 0 && N <= DECODING_ROWS) {
        linear_forward_packed(out, inp, packed_weight(weight, IC, OC), bias, N, IC, OC);
        return;
    }
    // out[n,o] = bias[o] + sum_i inp[n,i] * weight[o,i]: A = inp, B = weight^T
    MatrixView x = { inp, (size_t)IC, 1 }, w_transposed = { weight, 1, (size_t)IC };
    matmul_assign(out, (size_t)OC, x, w_transposed, bias, N, OC, IC);
}

static void linear_backward_fast(real *dinp, real *dweight, real *dbias,
                                 const real *dout, const real *inp, const real *weight,
                                 int N, int IC, int OC) {
    MatrixView g = { dout, (size_t)OC, 1 }, g_transposed = { dout, 1, (size_t)OC };
    MatrixView w = { weight, (size_t)IC, 1 }, x = { inp, (size_t)IC, 1 };
    // dW += dout^T inp,  dinp += dout W (when asked for), in one parallel region
    MatrixProduct products[2] = {
        { dweight, (size_t)IC, 1, g_transposed, x, { NULL, 0, 0 }, OC, IC, N, 1 },
        { dinp, (size_t)IC, 1, g, w, { NULL, 0, 0 }, N, IC, OC, 1 },
    };
    int count = dinp ? 2 : 1;
    #pragma omp parallel
    {
        products_by_this_thread(products, count);
        // dbias[o] += sum_n dout[n,o], n in order: each thread its share of the columns
        if (dbias) {
            int first, end;
            thread_share(OC, &first, &end);
            for (int n = 0; n < N; n++)
                for (int o = first; o < end; o++) dbias[o] += dout[(size_t)n * OC + o];
        }
    }
}

// ----------------------------------------------------------------------------
// Scaled dot-product attention (§3.2.1) in tiles. For each (sentence, head)
// the attention is two matrix products, with Part I's softmax between them:
//     scores = Q K^T        (Tq, d_k) x (d_k, Tk), then x 1/sqrt(d_k), softmax per row
//     out    = P V          (Tq, Tk) x (Tk, d_k)
// Scores are computed for every key; softmax_visible gives the masked ones
// probability exactly 0, so P V adds exact zeros for them.
//
// One query per sentence (decoding, §6.1) makes each product a row times a
// matrix, too thin for tiles (they made toy decoding 14% slower than these
// loops): attention_one_query_fast is Part I's loops with the dot products
// summed in vector registers (omp simd), which toy decoding needs to run 20%
// faster than Part I's scalar sums.
//
// It takes the heads of a sentence in groups of ONE_QUERY_GROUP numbers of a
// row (whole heads; toy's 4 of 32, base's 2 of 64): the scores of key j for
// every head of the group, then the next key, so that each row of the cache
// is read along ONE_QUERY_GROUP numbers side by side, which the hardware
// prefetches, instead of d_k numbers one row of the cache (2 d_model numbers)
// apart; and the group's outputs sum_j p_j v_j are summed in registers, j in
// order. Each number is the same sum, in the same order, as per head.
//
// The group's numbers of one key lie kv_stride numbers (2 d_model) after the
// last key's: in base, 4 KB, a new page of memory each key, and the hardware
// prefetcher does not follow a stream from one page into the next. So the
// loop over the keys' scores fetches the group's key ONE_QUERY_AHEAD keys on
// into the cache, and the value too, for the P V loop after it (base
// decoding 1.08 times as long without).
#define ONE_QUERY_GROUP 128
#define ONE_QUERY_AHEAD 8

// Where one query finds its keys and values: key j's numbers start at
// keys + r * stride, its value's at values + r * stride, r = row_of[j] (row_of
// NULL: r = j). A query of the cached decoder reads the rows of its own cache in
// order; one of the batched decoder (below) follows its beam's path through
// the rows of the cache, and reads its sentence's memory in order.
typedef struct {
    const real *keys;
    const real *values;
    const int *row_of;
    size_t stride;
} KeyRows;

static inline size_t key_row(KeyRows rows, int j) {
    return (size_t)(rows.row_of ? rows.row_of[j] : j) * rows.stride;
}

// out[i] = sum_j p_i[j] v_j[i], j = 0 .. visible-1 in order, for `vectors`
// vectors of out (a constant where it is called, at most 8, so that the
// sums are registers), where p_i is the probabilities of the head that
// number `first + i` of the group belongs to (d_k a multiple of
// VECTOR_LANES: each vector within one head), v_j the values of `rows` from
// their number `first` on.
__attribute__((always_inline)) static inline void one_query_pv(real *out, KeyRows rows,
                                                               const real *p, int Tk, int d_k,
                                                               int first, int visible,
                                                               int vectors) {
    Vector sum[8];
    const real *p_of[8];
    #pragma GCC unroll 8
    for (int i = 0; i < vectors; i++) {
        sum[i] = (Vector){ 0 };
        p_of[i] = p + (size_t)((first + i * VECTOR_LANES) / d_k) * Tk;
    }
    for (int j = 0; j < visible; j++) {
        const real *v_j = rows.values + key_row(rows, j) + first;
        #pragma GCC unroll 8
        for (int i = 0; i < vectors; i++)
            sum[i] += p_of[i][j] * vector_load(v_j + i * VECTOR_LANES);
    }
    #pragma GCC unroll 8
    for (int i = 0; i < vectors; i++) vector_store(out + i * VECTOR_LANES, sum[i]);
}

// One query against the `visible` keys and values of `rows`, for a group of
// `heads` heads of d_k numbers (q, out and the rows' numbers from the group's
// first head on): the scaled scores of each head in p (a row of Tk numbers
// per head), their softmax, and out = sum_j p_j v_j, j in order.
static void one_query_group(real *out, real *p, const real *q, KeyRows rows, int visible,
                            int heads, int d_k, int Tk) {
    real scale = 1 / real_sqrt((real)d_k);
    int width = heads * d_k;
    for (int j = 0; j < visible; j++) {
        const real *k_j = rows.keys + key_row(rows, j);
        // the group's numbers of key and value j + ONE_QUERY_AHEAD
        if (j + ONE_QUERY_AHEAD < visible) {
            size_t ahead = key_row(rows, j + ONE_QUERY_AHEAD);
            for (int i = 0; i < width; i += LINE_NUMBERS) {
                __builtin_prefetch(rows.keys + ahead + i);
                __builtin_prefetch(rows.values + ahead + i);
            }
        }
        for (int head = 0; head < heads; head++) {
            const real *q_h = q + head * d_k, *k_h = k_j + head * d_k;
            real dot = 0;
            #pragma omp simd reduction(+ : dot)
            for (int d = 0; d < d_k; d++) dot += q_h[d] * k_h[d];
            p[(size_t)head * Tk + j] = dot * scale;
        }
    }
    for (int head = 0; head < heads; head++) softmax_visible(p + (size_t)head * Tk, visible, Tk);
    if (d_k % VECTOR_LANES == 0) {
        int i = 0;
        for (; i + 8 * VECTOR_LANES <= width; i += 8 * VECTOR_LANES)
            one_query_pv(out + i, rows, p, Tk, d_k, i, visible, 8);
        for (; i + 2 * VECTOR_LANES <= width; i += 2 * VECTOR_LANES)
            one_query_pv(out + i, rows, p, Tk, d_k, i, visible, 2);
        for (; i < width; i += VECTOR_LANES)
            one_query_pv(out + i, rows, p, Tk, d_k, i, visible, 1);
        return;
    }
    for (int i = 0; i < width; i++) out[i] = 0;
    for (int j = 0; j < visible; j++) {
        const real *v_j = rows.values + key_row(rows, j);
        for (int head = 0; head < heads; head++)
            for (int d = 0; d < d_k; d++)
                out[head * d_k + d] += p[(size_t)head * Tk + j] * v_j[head * d_k + d];
    }
}

// The heads of a row taken in groups of ONE_QUERY_GROUP numbers: how many heads a group holds.
static int one_query_group_heads(int d_k) {
    return d_k >= ONE_QUERY_GROUP ? 1 : ONE_QUERY_GROUP / d_k;
}

static void attention_one_query_fast(real *out, real *att, const real *q, const real *k,
                                     const real *v, int q_stride, int kv_stride,
                                     const int *key_len, int causal, int B, int Tk, int C,
                                     int NH) {
    int d_k = C / NH;
    int group_heads = one_query_group_heads(d_k), groups = (NH + group_heads - 1) / group_heads;
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int group = 0; group < groups; group++) {
            int head0 = group * group_heads, heads = min_int(group_heads, NH - head0);
            size_t first_key = (size_t)b * Tk * kv_stride + head0 * d_k;
            KeyRows rows = { k + first_key, v + first_key, NULL, (size_t)kv_stride };
            one_query_group(out + (size_t)b * C + head0 * d_k,
                            att + ((size_t)b * NH + head0) * Tk,
                            q + (size_t)b * q_stride + head0 * d_k, rows,
                            visible_keys(0, key_len[b], causal), heads, d_k, Tk);
        }
    }
}

// out is (B, Tq, C), att is (B, NH, Tq, Tk), key_len is (B)
static void attention_forward_fast(real *out, real *att,
                                   const real *q, const real *k, const real *v,
                                   const int *key_len, int causal, AttentionShape shape) {
    int B = shape.B, Tq = shape.Tq, Tk = shape.Tk, C = shape.C, NH = shape.NH;
    int q_stride = shape.q_stride, kv_stride = shape.kv_stride;
    if (Tq == 1) {
        attention_one_query_fast(out, att, q, k, v, q_stride, kv_stride, key_len, causal, B, Tk,
                                 C, NH);
        return;
    }
    int d_k = C / NH;
    real scale = 1 / real_sqrt((real)d_k);
    // one thread per (b, head): it alone writes that head's scores and outputs
    #pragma omp parallel
    {
        real *packed_b = packed_b_alloc();
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int head = 0; head < NH; head++) {
                real *p = att + ((size_t)b * NH + head) * Tq * Tk;        // (Tq, Tk)
                real *o = out + (size_t)b * Tq * C + head * d_k;          // (Tq, d_k), row stride C
                MatrixView qh = { q + (size_t)b * Tq * q_stride + head * d_k, (size_t)q_stride, 1 };
                MatrixView kh_transposed = { k + (size_t)b * Tk * kv_stride + head * d_k, 1,
                                             (size_t)kv_stride };
                MatrixView vh = { v + (size_t)b * Tk * kv_stride + head * d_k, (size_t)kv_stride,
                                  1 };
                MatrixView ph = { p, (size_t)Tk, 1 };
                // q_i . k_j
                matmul_by_this_thread(p, (size_t)Tk, qh, kh_transposed, Tq, Tk, d_k, 0, packed_b);
                // p_ij = softmax_j(q_i . k_j / sqrt(d_k)) over the visible keys
                for (int i = 0; i < Tq; i++) {
                    real *row = p + (size_t)i * Tk;
                    int visible = visible_keys(i, key_len[b], causal);
                    for (int j = 0; j < visible; j++) row[j] *= scale;
                    softmax_visible(row, visible, Tk);
                }
                // out_i = sum_j p_ij v_j
                matmul_by_this_thread(o, (size_t)C, ph, vh, Tq, d_k, Tk, 0, packed_b);
            }
        }
        free(packed_b);
    }
}

// attention_backward's sums, per head as matrix products: dP = dOut V^T,
// dV += P^T dOut, then (softmax_backward, and the 1/sqrt(d_k) folded into
// dS) dQ += dS K and dK += dS^T Q.
static void attention_backward_fast(real *dq, real *dk, real *dv,
                                    const real *dout, const real *att,
                                    const real *q, const real *k, const real *v,
                                    AttentionShape shape) {
    int B = shape.B, Tq = shape.Tq, Tk = shape.Tk, C = shape.C, NH = shape.NH;
    int q_stride = shape.q_stride, kv_stride = shape.kv_stride;
    int d_k = C / NH;
    real scale = 1 / real_sqrt((real)d_k);
    // one thread per (b, head): it alone writes that head's columns of dq, dk, dv
    #pragma omp parallel
    {
        real *packed_b = packed_b_alloc();
        real *ds = checked_aligned_malloc((size_t)Tq * Tk, sizeof(real),
                                          "attention scratch");   // (Tq, Tk)
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int head = 0; head < NH; head++) {
                const real *p = att + ((size_t)b * NH + head) * Tq * Tk;
                size_t q_head = (size_t)b * Tq * q_stride + head * d_k,
                       kv_head = (size_t)b * Tk * kv_stride + head * d_k;
                MatrixView g = { dout + (size_t)b * Tq * C + head * d_k, (size_t)C, 1 };
                MatrixView vh_transposed = { v + kv_head, 1, (size_t)kv_stride };
                MatrixView p_transposed = { p, 1, (size_t)Tk };
                MatrixView qh = { q + q_head, (size_t)q_stride, 1 };
                MatrixView kh = { k + kv_head, (size_t)kv_stride, 1 };
                MatrixView dsh = { ds, (size_t)Tk, 1 }, ds_transposed = { ds, 1, (size_t)Tk };
                // dp_ij = dout_i . v_j  (into ds, which it becomes below)
                matmul_by_this_thread(ds, (size_t)Tk, g, vh_transposed, Tq, Tk, d_k, 0, packed_b);
                // dv_j += sum_i p_ij dout_i
                matmul_by_this_thread(dv + kv_head, (size_t)kv_stride, p_transposed, g, Tk, d_k, Tq,
                                      1, packed_b);
                // ds_ij = p_ij (dp_ij - sum_j' p_ij' dp_ij') / sqrt(d_k)
                for (int i = 0; i < Tq; i++) {
                    real *row = ds + (size_t)i * Tk;
                    softmax_backward(row, p + (size_t)i * Tk, Tk);
                    for (int j = 0; j < Tk; j++) row[j] *= scale;
                }
                // dq_i += sum_j ds_ij k_j,  dk_j += sum_i ds_ij q_i
                matmul_by_this_thread(dq + q_head, (size_t)q_stride, dsh, kh, Tq, d_k, Tk, 1,
                                      packed_b);
                matmul_by_this_thread(dk + kv_head, (size_t)kv_stride, ds_transposed, qh, Tk, d_k,
                                      Tq, 1, packed_b);
            }
        }
        free(ds);
        free(packed_b);
    }
}

// ----------------------------------------------------------------------------
// Decoding with a key/value cache (§6.1), in place of transformer.c's decoder,
// which runs the decoder stack over every position so far at every step.
// Under the causal mask (§3.2.3) nothing at positions < t depends on later
// tokens, so their keys and values never change: the cache keeps them, per
// layer, and step t computes only row t:
//
//   token_t ─ E[token]·√C + PE[t] ─ layer 0 ─ … ─ layer N-1 ─ ·E^T ─ logits_t
//     in each layer: self-attention   q_t against cached k_0..k_t, v_0..v_t
//                    cross-attention  q_t against the memory's K, V (made once)
//
// cached_decoder_step is transformer.c's decoder_layer_forward for one
// position, with the same building blocks (dropout off): each number of row t
// is the same sum in the same order as transformer.c's decoder gives it, and
// so are the tokens (lab/test_lab.c compares them). The weights stay as they
// are from cached_decoder_begin to cached_decoder_end, which tell the
// products above (fast_path_decoding) so that they pack each weight once.

// The cache of R rows decoded side by side (Decoder, transformer.h), in one arena.
struct KeyValueCache {
    int layers;             // L
    int C;                  // d_model
    int *self_len;          // (R)                positions each row's query sees: t + 1
    real *cross_kv;         // (L, R, S, 2C)      keys | values of the memory, per decoder layer
    real *self_kv;          // (L, R, max_T, 2C)  keys | values of positions 0..t, per layer
    real *spare_kv;         // (L, R, max_T, 2C)  where beam search reorders the cache into
    real *x;                // (R, C)             the embedded tokens of position t
    DecoderLayerActs step;  // one layer's activations at position t, rows R (T = 1), reused
                            // layer after layer; its dropout masks all ones (no training)
    real *logits;           // (R, V)
    real *memory;           // the arena of all the above
};

// The cache's tensors, in the order of its arena. The encoder-decoder attention's keys and
// values are the cache's own (cross_kv), not step's.
static void key_value_cache_layout(KeyValueCache *cache, Layout *layout, const Decoder *decoder,
                                   const TransformerConfig *config) {
    size_t L = config->n_layers;
    size_t C = config->d_model;
    size_t NH = config->n_heads;
    size_t R = decoder->rows;
    size_t S = decoder->S;
    size_t max_T = decoder->max_T;
    DecoderLayerActs *step = &cache->step;
    cache->cross_kv = tensor(layout, L * R * S * 2 * C);
    cache->self_kv = tensor(layout, L * R * max_T * 2 * C);
    cache->spare_kv = tensor(layout, L * R * max_T * 2 * C);
    cache->x = tensor(layout, R * C);
    layout_attention(&step->self_attn, layout, R, 0, R * NH * max_T, C, 0);
    layout_add_norm(&step->norm1, layout, R, C);
    layout_attention(&step->cross_attn, layout, R, 0, R * NH * S, C, 1);
    step->cross_attn.kv = NULL;   // each layer's are in cross_kv (the step points at them)
    layout_add_norm(&step->norm2, layout, R, C);
    layout_feed_forward(&step->ffn, layout, R, C, config->d_ff);
    layout_add_norm(&step->norm3, layout, R, C);
    cache->logits = tensor(layout, R * config->vocab_size);
}

// transformer.c's decoder_begin, with a cache: memory = Encoder(source) (§3.1), once
// (decoder_encode), and every decoder layer's keys and values of it. src is (B,S), padded;
// B == rows (row r decodes sentence r) or B == 1 (every row decodes sentence 0: the beams of
// beam search).
static void cached_decoder_begin(Decoder *decoder, Transformer *model, const int *src,
                                 const int *src_len, int B, int S, int rows, int max_T) {
    const TransformerConfig *config = &model->config;
    int C = config->d_model;
    size_t R = rows;
    fast_path_decoding(1);   // the weights stay as they are until cached_decoder_end
    memset(decoder, 0, sizeof *decoder);
    decoder->rows = rows;
    decoder->S = S;
    decoder->max_T = max_T;
    decoder->src_len = checked_calloc(R, sizeof(int), "decoder source lengths");
    KeyValueCache *cache = checked_calloc(1, sizeof(KeyValueCache), "decoder cache");
    decoder->cache = cache;
    cache->layers = config->n_layers;
    cache->C = C;
    cache->self_len = checked_calloc(R, sizeof(int), "decoder cache lengths");
    Layout counting = { NULL, 0, 0 };
    key_value_cache_layout(cache, &counting, decoder, config);
    Layout layout = { arena_calloc(counting.used, "decoder cache"), 0, 0 };
    key_value_cache_layout(cache, &layout, decoder, config);
    cache->memory = layout.arena;
    decoder->logits = cache->logits;

    // the memory of every row (the steps need one position of activations: max_T 1), and
    // each decoder layer's keys and values of it
    const real *memory = decoder_encode(decoder, model, src, src_len, B, 1);
    for (int l = 0; l < config->n_layers; l++) {
        real *kv = cache->cross_kv + l * R * S * 2 * C;
        AttentionParams weights = decoder_layer_params(&model->params, config, l).cross_attn;
        memory_keys_values(kv, memory, weights, rows, S, C);
    }
}

// One decoder position t for rows 0..rows-1, tokens (rows) their inputs: appends each row's
// keys and values at t to the cache, leaves the next token's logits in decoder->logits.
static void cached_decoder_step(Decoder *decoder, Transformer *model, const int *tokens, int t,
                                int rows) {
    const TransformerConfig *config = &model->config;
    KeyValueCache *cache = decoder->cache;
    int C = config->d_model;
    size_t R = decoder->rows;
    size_t max_T = decoder->max_T;
    DecoderLayerActs step = cache->step;
    AttentionShape self_shape = { rows, 1, (int)max_T, C, config->n_heads, 3 * C, 2 * C };

    // §3.4, §3.5: E[token] * sqrt(d_model) + PE[t]
    const real *pe_t = model->positional_encoding + (size_t)t * C;
    embedding_forward(cache->x, tokens, model->params.embedding, pe_t, rows, 1, C);
    for (int r = 0; r < rows; r++) cache->self_len[r] = t + 1;

    for (int l = 0; l < config->n_layers; l++) {
        DecoderLayerParams weights = decoder_layer_params(&model->params, config, l);
        AttentionParams self = weights.self_attn;
        const real *y = l == 0 ? cache->x : step.norm3.out;   // the layer's input
        real *self_kv = cache->self_kv + l * R * max_T * 2 * C;
        step.cross_attn.kv = cache->cross_kv + l * R * decoder->S * 2 * C;

        // sub-layer 1: LayerNorm(y + MaskedSelfAttention(y)); q_t sees k_0..k_t, v_0..v_t
        linear_forward(step.self_attn.qkv, y, self.qkv_w, self.qkv_b, rows, C, 3 * C);
        for (int r = 0; r < rows; r++) {   // k_t, v_t into the cache
            real *cached = self_kv + ((size_t)r * max_T + t) * 2 * C;
            const real *k_t = step.self_attn.qkv + (size_t)r * 3 * C + C;
            memcpy(cached, k_t, 2 * (size_t)C * sizeof(real));
        }
        attention_forward(step.self_attn.heads, step.self_attn.att, step.self_attn.qkv, self_kv,
                          self_kv + C, cache->self_len, 0, self_shape);
        linear_forward(step.self_attn.out, step.self_attn.heads, self.out_w, self.out_b, rows, C,
                       C);
        add_norm_forward(step.norm1, y, step.self_attn.out, weights.ln1, model, rows);

        // sub-layer 2: LayerNorm(ln1 + Attention(ln1, memory)), the keys and values from the cache
        cross_attention_forward(step.cross_attn, step.norm1.out, weights.cross_attn,
                                decoder->src_len, rows, 1, decoder->S, config);
        add_norm_forward(step.norm2, step.norm1.out, step.cross_attn.out, weights.ln2, model,
                         rows);

        // sub-layer 3: LayerNorm(ln2 + FFN(ln2)); the output is the next layer's input
        feed_forward_forward(step.ffn, step.norm2.out, weights.ffn, rows, config);
        add_norm_forward(step.norm3, step.norm2.out, step.ffn.out, weights.ln3, model, rows);
    }

    // §3.4: the pre-softmax projection through the shared embedding
    linear_forward(decoder->logits, step.norm3.out, model->params.embedding, NULL, rows, C,
                   config->vocab_size);
}

// Row i continues beam parent[i] (beam search): it takes over that beam's cached keys and
// values of positions 0..positions-1.
static void cached_decoder_reorder(Decoder *decoder, const int *parent, int rows,
                                   int positions) {
    KeyValueCache *cache = decoder->cache;
    size_t C = cache->C;
    size_t L = cache->layers;
    size_t R = decoder->rows;
    size_t T = decoder->max_T;
    size_t bytes = (size_t)positions * 2 * C * sizeof(real);
    for (size_t l = 0; l < L; l++) {
        for (int i = 0; i < rows; i++) {
            real *to = cache->spare_kv + (l * R + i) * T * 2 * C;
            const real *from = cache->self_kv + (l * R + parent[i]) * T * 2 * C;
            memcpy(to, from, bytes);
        }
    }
    real *swap = cache->self_kv;
    cache->self_kv = cache->spare_kv;
    cache->spare_kv = swap;
}

static void cached_decoder_end(Decoder *decoder) {
    KeyValueCache *cache = decoder->cache;
    free(decoder->src_len);
    free(cache->self_len);
    arena_free(cache->memory);
    free(cache);
    memset(decoder, 0, sizeof *decoder);
    fast_path_decoding(0);
}

// ----------------------------------------------------------------------------
// Many sentences decoded side by side, each with its own beams (lab/decode.c's
// batched search). The cached decoder above keeps each row's keys and values
// in a row of its own, so beam search copies a beam's whole history to every
// row that continues it, at every position, and its rows are the beams of one
// sentence. Here each of B sentences keeps one copy of its memory's keys and
// values, and a row (a beam of a sentence, or a sentence in greedy decoding)
// keeps no history of its own: step t writes the keys and values of every row
// at position t, and each row keeps its path, the row at each earlier
// position that its beam came through:
//
//   self_kv[l][t][i]   keys | values of row i at position t, layer l
//   path[i][j]         where row i's beam was at position j <= t, as the index
//                      j * max_rows + (its row then) into self_kv[l]
//
// A beam that goes on in another row (beam search's reordering), and the rows
// of a batch closing up as sentences end, move only these indices; the keys
// and values stay where step t wrote them. A query reads its keys along its
// path (KeyRows), its memory's where its sentence's lie: each number the same
// sum in the same order as the cached decoder's (lab/test_lab.c compares the
// tokens), since the products and the attention of a row are the same
// functions of the same numbers whatever the other rows are.
typedef struct {
    int sentences;       // B
    int S;               // padded source length
    int max_rows;        // the most rows at a position: B x beams
    int max_T;           // the most positions
    int rows;            // rows at the current position
    int *src_len;        // (B)                real source tokens of each sentence
    int *sentence_of;    // (max_rows)         the sentence row i decodes
    int *path;           // (max_rows, max_T)  row i's path at positions 0..t (above)
    int *spare;          // (max_rows, max_T)  where batched_decoder_reorder writes the next ones
    int *spare_sentence; // (max_rows)
    int *key_len;        // (max_rows)         the keys each row's query sees at this position
    real *cross_kv;      // (L, B, S, 2C)      the memory's keys | values, per decoder layer
    real *self_kv;       // (L, max_T, max_rows, 2C)
    real *x;             // (max_rows, C)      the embedded tokens of position t
    DecoderLayerActs step;   // one layer's activations at position t, reused layer after layer
    real *logits;        // (max_rows, V)      the next token's, from batched_decoder_step
    real *memory;        // the arena of the numbers above,
    size_t numbers;      // its size
} BatchedDecoder;

static void batched_decoder_layout(BatchedDecoder *d, Layout *layout,
                                   const TransformerConfig *config) {
    size_t L = config->n_layers;
    size_t C = config->d_model;
    size_t NH = config->n_heads;
    size_t R = d->max_rows;
    size_t keys = (size_t)(d->max_T > d->S ? d->max_T : d->S);
    d->cross_kv = tensor(layout, L * d->sentences * d->S * 2 * C);
    d->self_kv = tensor(layout, L * d->max_T * R * 2 * C);
    d->x = tensor(layout, R * C);
    layout_attention(&d->step.self_attn, layout, R, 0, R * NH * keys, C, 0);
    layout_add_norm(&d->step.norm1, layout, R, C);
    layout_attention(&d->step.cross_attn, layout, R, 0, R * NH * keys, C, 1);
    layout_add_norm(&d->step.norm2, layout, R, C);
    layout_feed_forward(&d->step.ffn, layout, R, C, config->d_ff);
    layout_add_norm(&d->step.norm3, layout, R, C);
    d->logits = tensor(layout, R * config->vocab_size);
}

// B sentences src (B, S), padded, of src_len (B) tokens, each to be decoded with up to `beams`
// rows for at most max_T positions: memory = Encoder(source) (§3.1), once, and each decoder
// layer's keys and values of it. The first position has one row per sentence, row b sentence b.
static void batched_decoder_begin(BatchedDecoder *d, Transformer *model, const int *src,
                                  const int *src_len, int B, int S, int beams, int max_T) {
    const TransformerConfig *config = &model->config;
    int C = config->d_model;
    memset(d, 0, sizeof *d);
    d->sentences = B;
    d->S = S;
    d->max_rows = B * beams;
    d->max_T = max_T;
    d->rows = B;
    size_t R = d->max_rows;
    d->src_len = checked_calloc(B, sizeof(int), "decoder source lengths");
    d->sentence_of = checked_calloc(R, sizeof(int), "decoder rows");
    d->spare_sentence = checked_calloc(R, sizeof(int), "decoder rows");
    d->path = checked_calloc(R * max_T, sizeof(int), "decoder paths");
    d->spare = checked_calloc(R * max_T, sizeof(int), "decoder paths");
    d->key_len = checked_calloc(R, sizeof(int), "decoder key counts");
    for (int b = 0; b < B; b++) d->sentence_of[b] = b;
    // its numbers: where a decoding goes on batch after batch (lab/decode.c), the arena of the
    // last batch if it is large enough (allocating and touching a new one for each batch took
    // a tenth of decoding's time); every number is written before it is read
    Layout counting = { NULL, 0, 0 };
    batched_decoder_layout(d, &counting, config);
    real *arena = decoding_weights.kept_arena;
    d->numbers = decoding_weights.kept_numbers;
    if (!arena || d->numbers < counting.used) {
        arena_free(arena);
        arena = arena_calloc(counting.used, "decoder cache");
        d->numbers = counting.used;
    }
    decoding_weights.kept_arena = NULL;
    decoding_weights.kept_numbers = 0;
    Layout layout = { arena, 0, 0 };
    batched_decoder_layout(d, &layout, config);
    d->memory = layout.arena;

    // the memory of each sentence (transformer.c's decoder_encode, B rows), then the products
    // of the decoding, which read the weights packed once (fast_path_decoding)
    Decoder encoded = { .rows = B, .S = S, .src_len = d->src_len };
    const real *memory = decoder_encode(&encoded, model, src, src_len, B, 1);
    fast_path_decoding(1);
    for (int l = 0; l < config->n_layers; l++) {
        real *kv = d->cross_kv + (size_t)l * B * S * 2 * C;
        AttentionParams weights = decoder_layer_params(&model->params, config, l).cross_attn;
        memory_keys_values(kv, memory, weights, B, S, C);
    }
}

// Before a decoding of many batches (lab/decode.c), the arena the largest of them needs (at most
// B sentences of at most S source tokens, `beams` rows each, max_T positions), so that batch
// after batch finds it large enough: sorted by length, each batch was larger than the one
// before, and each new arena's first touch cost a page fault per page.
static void batched_decoder_reserve(const TransformerConfig *config, int B, int S, int beams,
                                    int max_T) {
    BatchedDecoder sizes = { .sentences = B, .S = S, .max_rows = B * beams, .max_T = max_T };
    Layout counting = { NULL, 0, 0 };
    batched_decoder_layout(&sizes, &counting, config);
    if (decoding_weights.kept_arena && decoding_weights.kept_numbers >= counting.used)
        return;
    arena_free(decoding_weights.kept_arena);
    decoding_weights.kept_arena = arena_calloc(counting.used, "decoder cache");
    decoding_weights.kept_numbers = counting.used;
}

// One query per row against keys and values (transformer.c's attention_forward for one
// position, Tq 1): row i's heads from its query (q, rows of q_stride) and the keys its KeyRows
// give (keys_of: the rows of every row, layer l's), key_len[i] of them, att (rows, NH, Tk).
typedef KeyRows (*KeysOfRow)(const BatchedDecoder *d, int l, int row, int C);

static KeyRows self_keys_of_row(const BatchedDecoder *d, int l, int row, int C) {
    const real *kv = d->self_kv + (size_t)l * d->max_T * d->max_rows * 2 * C;
    return (KeyRows){ kv, kv + C, d->path + (size_t)row * d->max_T, 2 * (size_t)C };
}

static KeyRows memory_keys_of_row(const BatchedDecoder *d, int l, int row, int C) {
    size_t sentence = d->sentence_of[row];
    const real *kv = d->cross_kv + ((size_t)l * d->sentences + sentence) * d->S * 2 * C;
    return (KeyRows){ kv, kv + C, NULL, 2 * (size_t)C };
}

static void batched_attention(real *heads, real *att, const real *q, int q_stride,
                              const BatchedDecoder *d, KeysOfRow keys_of, int l,
                              const TransformerConfig *config) {
    int C = config->d_model;
    int NH = config->n_heads;
    int d_k = C / NH;
    int Tk = d->max_T > d->S ? d->max_T : d->S;
    int group_heads = one_query_group_heads(d_k), groups = (NH + group_heads - 1) / group_heads;
    #pragma omp parallel for collapse(2)
    for (int i = 0; i < d->rows; i++) {
        for (int group = 0; group < groups; group++) {
            int head0 = group * group_heads, heads_here = min_int(group_heads, NH - head0);
            KeyRows rows = keys_of(d, l, i, C);
            rows.keys += head0 * d_k;
            rows.values += head0 * d_k;
            one_query_group(heads + (size_t)i * C + head0 * d_k,
                            att + ((size_t)i * NH + head0) * Tk,
                            q + (size_t)i * q_stride + head0 * d_k, rows, d->key_len[i],
                            heads_here, d_k, Tk);
        }
    }
}

// Position t for the d->rows rows, tokens (rows) their inputs: each row's keys and values at
// t into the cache, the next token's logits in d->logits (rows, V). The sub-layers of
// transformer.c's decoder_layer_forward for one position, as cached_decoder_step runs them.
static void batched_decoder_step(BatchedDecoder *d, Transformer *model, const int *tokens,
                                 int t) {
    const TransformerConfig *config = &model->config;
    int C = config->d_model;
    int rows = d->rows;
    size_t R = d->max_rows;
    DecoderLayerActs step = d->step;

    // §3.4, §3.5: E[token] * sqrt(d_model) + PE[t]; each row's path reaches position t
    const real *pe_t = model->positional_encoding + (size_t)t * C;
    embedding_forward(d->x, tokens, model->params.embedding, pe_t, rows, 1, C);
    for (int i = 0; i < rows; i++) d->path[(size_t)i * d->max_T + t] = (int)(t * R + i);

    for (int l = 0; l < config->n_layers; l++) {
        DecoderLayerParams weights = decoder_layer_params(&model->params, config, l);
        AttentionParams self = weights.self_attn;
        const real *y = l == 0 ? d->x : step.norm3.out;   // the layer's input
        real *kv_t = d->self_kv + ((size_t)l * d->max_T + t) * R * 2 * C;

        // sub-layer 1: LayerNorm(y + MaskedSelfAttention(y)); q_t sees its path's keys 0..t
        linear_forward(step.self_attn.qkv, y, self.qkv_w, self.qkv_b, rows, C, 3 * C);
        for (int i = 0; i < rows; i++) {
            memcpy(kv_t + (size_t)i * 2 * C, step.self_attn.qkv + (size_t)i * 3 * C + C,
                   2 * (size_t)C * sizeof(real));
            d->key_len[i] = t + 1;
        }
        batched_attention(step.self_attn.heads, step.self_attn.att, step.self_attn.qkv, 3 * C,
                          d, self_keys_of_row, l, config);
        linear_forward(step.self_attn.out, step.self_attn.heads, self.out_w, self.out_b, rows, C,
                       C);
        add_norm_forward(step.norm1, y, step.self_attn.out, weights.ln1, model, rows);

        // sub-layer 2: LayerNorm(ln1 + Attention(ln1, memory)), its sentence's keys and values
        // (transformer.c's cross_attention_forward, one position)
        AttentionParams cross = weights.cross_attn;
        linear_forward(step.cross_attn.q, step.norm1.out, cross.qkv_w, cross.qkv_b, rows, C, C);
        for (int i = 0; i < rows; i++) d->key_len[i] = d->src_len[d->sentence_of[i]];
        batched_attention(step.cross_attn.heads, step.cross_attn.att, step.cross_attn.q, C, d,
                          memory_keys_of_row, l, config);
        linear_forward(step.cross_attn.out, step.cross_attn.heads, cross.out_w, cross.out_b,
                       rows, C, C);
        add_norm_forward(step.norm2, step.norm1.out, step.cross_attn.out, weights.ln2, model,
                         rows);

        // sub-layer 3: LayerNorm(ln2 + FFN(ln2)); the output is the next layer's input
        feed_forward_forward(step.ffn, step.norm2.out, weights.ffn, rows, config);
        add_norm_forward(step.norm3, step.norm2.out, step.ffn.out, weights.ln3, model, rows);
    }

    // §3.4: the pre-softmax projection through the shared embedding
    linear_forward(d->logits, step.norm3.out, model->params.embedding, NULL, rows, C,
                   config->vocab_size);
}

// The next position's rows after position t: row i continues row parent[i] of this one (its
// beam, in beam search; its sentence, as the rows close up over ended ones). Only the paths
// move.
static void batched_decoder_reorder(BatchedDecoder *d, const int *parent, int rows, int t) {
    size_t max_T = d->max_T;
    for (int i = 0; i < rows; i++) {
        memcpy(d->spare + i * max_T, d->path + parent[i] * max_T, (t + 1) * sizeof(int));
        d->spare_sentence[i] = d->sentence_of[parent[i]];
    }
    int *swap = d->path;
    d->path = d->spare;
    d->spare = swap;
    swap = d->sentence_of;
    d->sentence_of = d->spare_sentence;
    d->spare_sentence = swap;
    d->rows = rows;
}

static void batched_decoder_end(BatchedDecoder *d) {
    free(d->src_len);
    free(d->sentence_of);
    free(d->spare_sentence);
    free(d->path);
    free(d->spare);
    free(d->key_len);
    arena_free(decoding_weights.kept_arena);
    decoding_weights.kept_arena = d->memory;   // for the next batch (freed when decoding ends)
    decoding_weights.kept_numbers = d->numbers;
    memset(d, 0, sizeof *d);
    fast_path_decoding(0);
}

// Hands transformer.c's four products and its decoder to the functions above
// (on = 1), or back to transformer.c's own loops (on = 0, as the tests compare
// them). Either way the products forget the weights they packed: a decoding
// under way goes on without the packs, and its end finds none to forget.
static void fast_path_use(int on) {
    forget_packed_weights();
    fast_path.linear_forward = on ? linear_forward_fast : NULL;
    fast_path.linear_backward = on ? linear_backward_fast : NULL;
    fast_path.attention_forward = on ? attention_forward_fast : NULL;
    fast_path.attention_backward = on ? attention_backward_fast : NULL;
    fast_path.decoder_begin = on ? cached_decoder_begin : NULL;
    // (a decoding begun with the cache goes on with it, whatever `on`: transformer.c calls
    // these only for a Decoder whose cache cached_decoder_begin made)
    fast_path.decoder_step = cached_decoder_step;
    fast_path.decoder_reorder = cached_decoder_reorder;
    fast_path.decoder_end = cached_decoder_end;
}
