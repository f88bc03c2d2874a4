// dev/product_speed.c: the fast path's matrix products alone, one thread,
// at the shapes of a toy and a base training step, in each of the three
// forms a linear layer gives them (lab/fast_path.c's MatrixView):
//     forward   y  = x W^T    A = x in place,  B = W^T, a transposing pack
//     dx        dx = dy W     A = dy in place, B = W,   a pack along rows
//     dW        dW = dy^T x   A = dy^T packed, B = x,   a pack along rows
// Each product runs REPS times on the same buffers (warm caches) and its
// least time is kept: on a shared machine the least of many is the run
// nobody interrupted. Compare with dev/fma_peak.c on one thread; the gap
// between the two is what packing, edges and the caches cost a product.
// Before/after: build it against each tree (-I) and run the two in turn;
// with FORM ROWS COLS DEPTH after REPS it times that one product (for perf).
//   cc -O3 -march=native -ffp-contract=fast -fno-math-errno -std=c11 -fopenmp -I .
//      -o /tmp/product_speed dev/product_speed.c -lm && OMP_NUM_THREADS=1 /tmp/product_speed 100
// Nothing here is used by the build or the tests.
#define TRANSFORMER_NO_MAIN
#include "lab/lab.c"

enum { FORWARD, DX, DW };
static const char *form_names[] = { "forward x W^T", "dx = dy W", "dW = dy^T x" };

// out (rows, cols) += A (rows, depth) B (depth, cols) in the given form, least time of reps
static void time_product(int form, int rows, int cols, int depth, int reps) {
    real *a = checked_aligned_malloc((size_t)rows * depth, sizeof(real), "A");
    real *b = checked_aligned_malloc((size_t)depth * cols, sizeof(real), "B");
    real *out = checked_aligned_malloc((size_t)rows * cols, sizeof(real), "out");
    real *packed_b = packed_b_alloc();
    for (size_t i = 0; i < (size_t)rows * depth; i++) a[i] = (real)(i % 13) / 13;
    for (size_t i = 0; i < (size_t)depth * cols; i++) b[i] = (real)(i % 11) / 11;
    for (size_t i = 0; i < (size_t)rows * cols; i++) out[i] = 0;
    MatrixView a_view = { a, (size_t)depth, 1 },
               b_view = { b, (size_t)cols, 1 };   // dx: both as they lie
    if (form == FORWARD)
        b_view = (MatrixView){ b, 1, (size_t)depth };   // W is (cols, depth): its transpose
    if (form == DW)
        a_view = (MatrixView){ a, 1, (size_t)rows };   // dy is (depth, rows): its transpose
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double start = wall_seconds();
        matmul_by_this_thread(out, (size_t)cols, a_view, b_view, rows, cols, depth, 1, packed_b);
        double t = wall_seconds() - start;
        if (t < best)
            best = t;
    }
    printf("%-14s %5d x %5d x %5d  %6.3f ms  %6.1f GFLOP/s\n", form_names[form], rows, cols, depth,
           best * 1e3, 2.0 * rows * cols * depth / best * 1e-9);
    free(a);
    free(b);
    free(out);
    free(packed_b);
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 50;
    if (reps < 1 || (argc > 2 && argc != 6)) {
        fprintf(stderr,
                "usage: %s [REPS >= 1 [FORM ROWS COLS DEPTH]]  (FORM 0 forward, 1 dx, 2 dW)\n",
                argv[0]);
        return 1;
    }
    if (argc == 6) {   // one product, for perf record
        int form = atoi(argv[2]), rows = atoi(argv[3]), cols = atoi(argv[4]), depth = atoi(argv[5]);
        if (form < FORWARD || form > DW || rows < 1 || cols < 1 || depth < 1) {
            fprintf(stderr, "%s: FORM is 0, 1 or 2, and ROWS, COLS, DEPTH at least 1\n", argv[0]);
            return 1;
        }
        time_product(form, rows, cols, depth, reps);
        return 0;
    }
    // toy: 1,024 tokens, d_model 128, d_ff 512, vocabulary 1,000 (the logits)
    int toy[][3] = {
        { 1024, 128, 128 }, { 1024, 512, 128 }, { 1024, 128, 512 }, { 1024, 1000, 128 }
    };
    for (int k = 0; k < 4; k++) {
        int n = toy[k][0], out_features = toy[k][1], in_features = toy[k][2];
        time_product(FORWARD, n, out_features, in_features, reps);
        time_product(DX, n, in_features, out_features, reps);
        time_product(DW, out_features, in_features, n, reps);
    }
    // base: 512 tokens, d_model 512, d_ff 2048 (one of its FFN's products, fewer reps: 10-20 ms
    // each)
    time_product(FORWARD, 512, 2048, 512, reps / 5 + 1);
    time_product(DW, 2048, 512, 512, reps / 5 + 1);
    return 0;
}
