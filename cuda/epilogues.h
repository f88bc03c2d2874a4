/* epilogues.h: the feed-forward network's bias and ReLU inside its products
 * (included by transformer_cuda.cu)
 *
 * §3.3's FFN(x) = max(0, x W_1 + b_1) W_2 + b_2. Without this file its first
 * product writes x W_1^T, and a kernel of its own (bias_relu_forward_kernel)
 * reads that back, adds b_1 and clips: one more pass over the (N, d_ff)
 * hidden layer, the widest activation of the step. Backward likewise: the
 * product dhidden = dout W_2 is written, then relu_bias_backward_kernel reads
 * it and the hidden layer again, zeroes dhidden where the ReLU was off and
 * sums b_1's gradient. cuBLASLt does both inside the products' epilogues, on
 * the accumulators before they reach memory:
 *   - forward, CUBLASLT_EPILOGUE_RELU_AUX_BIAS: hidden = max(0, x W_1^T + b_1),
 *     and a bit mask of where it is positive (one bit a number, each of the
 *     N columns of hidden^T rounded up to 128 bits: gpu.enc[l].ff_mask);
 *   - backward, CUBLASLT_EPILOGUE_DRELU_BGRAD: dhidden = dout W_2 where the
 *     mask's bit is set, else 0, and db_1 = the sum of dhidden's rows.
 * The numbers are those of the kernels (the bias is added to the fp32 sum,
 * then the ReLU; the mask is hidden > 0 as relu_bias_backward_kernel's test),
 * except db_1, whose sum cuBLASLt adds in an order of its own: fixed for a
 * given GPU, library and shape, as cuBLAS's products are, so that two runs
 * still give the same bits.
 *
 * The algorithm is cuBLASLt's heuristic's first answer for the product's
 * shape, types and alignments: no timing at run time, the same answer every
 * run. Where it has none (an epilogue this GPU or library does not offer in
 * fp32, TF32 or bf16, or an alignment it does not take), or cublasLtMatmul
 * refuses the call as not supported, the kernels run instead (a layer whose
 * forward fell back also runs its backward so). --no-epilogues always runs them.
 * cuda_on_cpu.h computes these two epilogues as the cuBLASLt documentation
 * defines them (and refuses others), so make test runs this file too.
 */

// --no-epilogues: the bias and ReLU in kernels of their own
static int gpu_no_epilogues;

// The mask's leading dimension in bits: d_ff rounded up to 128 (cuBLASLt's rule)
static size_t relu_mask_bits(int F) { return ((size_t)F + 127) / 128 * 128; }

// A layer's mask in floats, for carve: N columns of relu_mask_bits(F) bits
static size_t relu_mask_floats(size_t N, int F) {
    return N * relu_mask_bits(F) / (8 * sizeof(float));
}

// One product D (m x n, column-major, leading dimension ldd) = op(A) op(B) + beta D
// with an epilogue: bias: RELU_AUX_BIAS's bias, or DRELU_BGRAD's bias gradient (written);
// mask: the ReLU's bits.
typedef struct {
    cublasOperation_t transa, transb;
    int m, n, k;
    const float *A;
    int lda;
    const float *B;
    int ldb;
    float beta;
    float *D;
    int ldd;
    cublasLtEpilogue_t epilogue;
    float *bias;
    unsigned char *mask;
} EpilogueProduct;

// The largest power of two up to 256 that divides the address: what the
// heuristic is told each pointer is aligned to
static uint32_t alignment_of(const void *p) {
    uint32_t a = 256;
    while (a > 4 && (uintptr_t)p % a != 0)
        a /= 2;
    return a;
}

static void lt_layout(cublasLtMatrixLayout_t *layout, cudaDataType type, cublasOperation_t op,
                      int rows, int cols, int ld) {
    int stored_rows = op == CUBLAS_OP_N ? rows : cols;
    int stored_cols = op == CUBLAS_OP_N ? cols : rows;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(layout, type, (uint64_t)stored_rows,
                                            (uint64_t)stored_cols, ld));
}

// Runs the product with its epilogue through cuBLASLt on the stream work goes
// to now; returns 0, having launched nothing, when cuBLASLt has no algorithm for it.
static int gpu_epilogue_product(const EpilogueProduct *p) {
    if (!gpu.lt)
        return 0;
    cudaDataType ab_type = gpu.bf16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasComputeType_t compute =
        gpu.tf32 && !gpu.bf16 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    cublasLtMatmulDesc_t desc;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
    int32_t transa = p->transa;
    int32_t transb = p->transb;
    uint32_t epilogue = p->epilogue;
    int64_t mask_ld = (int64_t)relu_mask_bits(p->m);
    void *bias = p->bias;
    void *mask = p->mask;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa,
                                                sizeof transa));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb,
                                                sizeof transb));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                sizeof epilogue));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof bias));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                &mask, sizeof mask));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                &mask_ld, sizeof mask_ld));
    cublasLtMatrixLayout_t a, b, d;
    lt_layout(&a, ab_type, p->transa, p->m, p->k, p->lda);
    lt_layout(&b, ab_type, p->transb, p->k, p->n, p->ldb);
    lt_layout(&d, CUDA_R_32F, CUBLAS_OP_N, p->m, p->n, p->ldd);

    // the heuristic's first algorithm, for the workspace and alignments at hand
    cublasLtMatmulPreference_t preference;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    uint64_t workspace = CUBLAS_WORKSPACE_BYTES;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference,
                                                      CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &workspace, sizeof workspace));
    const void *pointers[4] = { p->A, p->B, p->D, p->D };
    cublasLtMatmulPreferenceAttributes_t alignments[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
    };
    if (gpu.bf16) {   // (A and B are read from their bf16 copies:
                      // their own addresses, half the bytes in)
        pointers[0] = gpu_bf16_copy_of(p->A);
        pointers[1] = gpu_bf16_copy_of(p->B);
    }
    for (int i = 0; i < 4; i++) {
        uint32_t alignment = alignment_of(pointers[i]);
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, alignments[i], &alignment,
                                                          sizeof alignment));
    }
    // no algorithm: NOT_SUPPORTED, or none found; any other refusal is an error of ours
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(gpu.lt, desc, a, b, d, d, preference, 1,
                                                           &result, &found);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED)
        found = 0;
    else
        CUBLAS_CHECK(status);
    if (found > 0 && result.state != CUBLAS_STATUS_SUCCESS)
        found = 0;

    double profile_began = 0;
    if (found > 0) {
        const void *A = p->A;
        const void *B = p->B;
        if (gpu.bf16) {
            A = gpu_bf16_operand(p->A, operand_extent(p->transa, p->m, p->k, p->lda, 0, 1));
            B = gpu_bf16_operand(p->B, operand_extent(p->transb, p->k, p->n, p->ldb, 0, 1));
        }
        float one = 1.0f;
        float beta = p->beta;
        profile_began = profile_start();
        status = cublasLtMatmul(gpu.lt, desc, &one, A, a, B, b, &beta, p->D, d, p->D, d,
                                &result.algo, gpu.cublas_workspace, CUBLAS_WORKSPACE_BYTES,
                                gpu_stream);
        if (status == CUBLAS_STATUS_NOT_SUPPORTED)
            found = 0;
        else
            CUBLAS_CHECK(status);
    }
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(a));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(b));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(d));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(desc));
    if (found <= 0)
        return 0;
    profile_stop(profile_began, "cuBLASLt %s m=%d n=%d k=%d (%c%c), epilogue %s",
                 gpu.bf16 ? "bf16 gemm" : "sgemm", p->m, p->n, p->k,
                 p->transa == CUBLAS_OP_T ? 'T' : 'N', p->transb == CUBLAS_OP_T ? 'T' : 'N',
                 p->epilogue == CUBLASLT_EPILOGUE_RELU_AUX_BIAS ? "bias + ReLU"
                                                                : "ReLU' + bias gradient");
    gpu_counting->gemms++;
    gpu_counting->host_calls++;
    gpu_counting->epilogue_products++;
    return 1;
}

// feed_forward_forward's first product with its bias and ReLU:
// hidden (N, F) = max(0, x (N, C) W_1^T + b_1), and the mask where hidden > 0.
// Column-major, as gpu_linear_forward: hidden^T (F x N) = W_1 (stored as W_1^T: T) x^T.
static int gpu_relu_bias_product(float *hidden, unsigned char *mask, const float *x,
                                 const float *w1, float *b1, int N, int C, int F) {
    EpilogueProduct p = { CUBLAS_OP_T, CUBLAS_OP_N, F, N, C, w1, C, x, C, 0.0f, hidden, F,
                          CUBLASLT_EPILOGUE_RELU_AUX_BIAS, b1, mask };
    return gpu_epilogue_product(&p);
}

// The ReLU a linear layer's input gradient passes back through (feed_forward_backward's):
// the forward's mask, and where b_1's gradient goes (F).
typedef struct {
    unsigned char *mask;
    float *d_bias;
} ReluBackward;

// feed_forward_backward's input gradient of W_2 with the ReLU's: dhidden (N, F)
// = (dout (N, C) W_2 (C, F)) where the mask is set, else 0; db_1 (F) = the sum
// of dhidden's rows (written). Column-major, as gpu_linear_inputs_backward's:
// dhidden^T (F x N) = op(W) dout^T, with the operand it chose: W_2 as stored
// (F x C, N, leading dimension F) or --tf32's copy (T, its leading dimension).
static int gpu_drelu_bias_grad_product(float *d_hidden, const ReluBackward *relu, const float *dout,
                                       cublasOperation_t op, const float *w2, int ld, int N, int C,
                                       int F) {
    EpilogueProduct p = { op, CUBLAS_OP_N, F, N, C, w2, ld, dout, C, 0.0f, d_hidden, F,
                          CUBLASLT_EPILOGUE_DRELU_BGRAD, relu->d_bias, relu->mask };
    return gpu_epilogue_product(&p);
}
