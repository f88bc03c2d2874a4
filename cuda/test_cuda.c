/* cuda/test_cuda.c: the CUDA companion's proofs, without a GPU
 *
 * transformer_cuda.cu built for the CPU with cuda_on_cpu.h (its kernels run
 * as loops, a block's threads as fibers in random order, its cuBLAS calls as
 * column-major loops, its memory starts as NaN), against plain products,
 * against transformer.c and against the PyTorch reference files; the
 * companion's steps replayed from CUDA graphs against the same steps launched
 * one by one, bit for bit; the emulator's own checks (launches, barriers and
 * their call sites, warp exchanges with masks, shared memory at both ends,
 * per-tensor bounds inside an allocation, host reads of device memory, what a
 * graph capture forbids); make cuda's register check; faults put in on
 * purpose, each of which must be caught.
 * Built by make test (OpenMP on and off); make test-cuda builds the same
 * tests with the companion compiled by nvcc (-DCOMPANION_ON_GPU) and runs them
 * on a GPU; cuda/test_cuda_threads.c runs them with real threads under
 * ThreadSanitizer. Ends with "N passed, M failed".
 */
#define TRANSFORMER_NO_MAIN
#include "../lab/lab.c"               // transformer.c, the fast path and the lab
#define TEST_TRANSFORMER_LIBRARY
#include "../test_transformer.c"      // check(), the reference files, transformer.c's tests
#ifndef COMPANION_ON_GPU
// The CUDA companion, compiled here for the CPU (cuda_on_cpu.h)
#define CUDA_ON_CPU
#define TRANSFORMER_CUDA_NO_MAIN
#include "transformer_cuda.cu"
#else
// make test-cuda: the same tests with the companion built by nvcc, on a GPU
const TrainingCompute *transformer_cuda_training(void);
void transformer_cuda_logits(float *out, size_t n);
void transformer_cuda_release(void);
void transformer_cuda_fuse_attention(int on);
void transformer_cuda_one_stream(int on);
void transformer_cuda_bf16(int on);
void transformer_cuda_tf32(int on);
void transformer_cuda_weights_as_stored(int on);
void transformer_cuda_epilogues(int on);
int transformer_cuda_sgemm(int argc, char **argv);
#endif
#ifdef TRANSFORMER_DOUBLE
#error "the companion computes in float: build without -DTRANSFORMER_DOUBLE"
#endif

// ============================================================================
// The CUDA companion on the CPU: transformer_cuda.cu built with cuda_on_cpu.h
// (its kernels run as loops, its cuBLAS calls as column-major loops, its
// memory starts as NaN), against plain products and against transformer.c
// ============================================================================

// Tolerances. The companion sums in other orders than transformer.c (cuBLAS'
// column-major loops, one thread's row sums), so the two agree to fp32
// rounding: differences are measured relative to each tensor's largest
// element. The training runs compare the Adam updates, relative to the
// largest update, the key biases left out: fixed runs, measured (free-running
// steps have no bound in general; dev/FORMATS.md, "Reference files").
#define COMPANION_TOL_LOSS 1e-5      // relative, each step's loss
#define COMPANION_TOL_GRADS 1e-5     // each gradient tensor, after one step
#define COMPANION_TOL_UPDATES 1e-3   // the parameters' change after the run
#define CUBLAS_MODEL_TOL 1e-5        // the cuBLAS model against plain row-major products
#define COMPANION_STEPS 6            // the training runs' steps

// The largest |a_i - b_i| relative to the largest |b_i|, skipped elements left
// out; NaN anywhere gives infinity.
static double scaled_difference(const real *a, const real *b, size_t n, const unsigned char *skip) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        if (skip && skip[i])
            continue;
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= worst))
            worst = isnan(d) ? INFINITY : d;
        scale = fmax(scale, fabs((double)b[i]));
    }
    return worst / (scale > 0 ? scale : 1);
}

#ifndef COMPANION_ON_GPU
// Stores the m x k operand `plain` (row-major) the way cuBLAS reads it:
// column-major with leading dimension ld, or its transpose when op is OP_T.
// The rest of the buffer (the padding of each column) is NaN: read, it shows.
static void store_operand(float *stored, size_t stored_size, const float *plain, int rows, int cols,
                          cublasOperation_t op, int ld) {
    for (size_t i = 0; i < stored_size; i++) stored[i] = NAN;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++)
            if (op == CUBLAS_OP_N)
                stored[i + (size_t)j * ld] = plain[i * cols + j];
            else
                stored[j + (size_t)i * ld] = plain[i * cols + j];
}
#endif

// --bf16's products: one bf16 number has 8 significant bits, so rounding to it
// changes x by |x| u at most, u = 2^-8 (round to nearest). A product of two
// rounded operands is then a b (1 + d1)(1 + d2), off by at most (2u + u^2) |a b|;
// the product itself is exact in fp32 (16 significant bits), and the fp32 sum
// of K of them adds at most K 2^-24 sum |a b| (K 2^-24 < 1e-5 here, against
// 2u = 0.0078). One element of a bf16 product therefore differs from the exact
// product of the unrounded operands by at most
//     (2u + u^2 + K 2^-24) sum_k |a_ik| |b_kj|,
// which test_cublas_model checks element by element (cublas_model_bound_ratio).
#define BF16_UNIT_ROUNDOFF (1.0 / 256)

// When set, cublas_model_case rounds the operands to bf16, stores them so and
// multiplies with cublasGemmEx / cublasGemmStridedBatchedEx (fp32 sums into fp32
// C); the expected product is then that of the rounded numbers, and
// cublas_model_bound_ratio gets the largest error against the unrounded
// operands' product over the bound above (at most 1).
#ifndef COMPANION_ON_GPU
static int cublas_model_bf16;
static double cublas_model_bound_ratio;
#endif

// One case of C = alpha op(A) op(B) + beta C for `count` batch entries through
// the cuBLAS model (cublasSgemm when count is 1), against the same product
// computed plainly in row-major double. The leading dimensions are `pad` more
// than the least, the batch strides 7 more than a matrix; C's padding holds a
// sentinel that must survive, and with beta 0, C starts as NaN. lda_error is
// added to lda when calling (a mutation the comparison must catch). Returns
// the worst scaled error, or infinity on a refused call or a touched padding.
#ifndef COMPANION_ON_GPU
static double cublas_model_case(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                int pad, float beta, int count, int lda_error, Rng *rng) {
    int lda = (ta == CUBLAS_OP_N ? m : k) + pad, ldb = (tb == CUBLAS_OP_N ? k : n) + pad,
        ldc = m + pad;
    long long stride_a = (long long)lda * (ta == CUBLAS_OP_N ? k : m) + 7;
    long long stride_b = (long long)ldb * (tb == CUBLAS_OP_N ? n : k) + 7,
              stride_c = (long long)ldc * n + 7;
    float *A = malloc(sizeof(float) * stride_a * count),
          *B = malloc(sizeof(float) * stride_b * count);
    float *C = malloc(sizeof(float) * stride_c * count), *plain_a = malloc(sizeof(float) * m * k);
    float *plain_b = malloc(sizeof(float) * k * n), *c0 = malloc(sizeof(float) * m * n * count);
    double *expected = malloc(sizeof(double) * m * n * count),
           *unrounded = malloc(sizeof(double) * m * n * count);
    double *bound = malloc(sizeof(double) * m * n * count);
    float alpha = 0.75f, *raw_a = malloc(sizeof(float) * m * k),
          *raw_b = malloc(sizeof(float) * k * n);
    double u = BF16_UNIT_ROUNDOFF, per_term = 2 * u + u * u + k * 0x1p-24;
    for (int e = 0; e < count; e++) {
        for (int i = 0; i < m * k; i++) raw_a[i] = plain_a[i] = (float)(2 * rng_uniform(rng) - 1);
        for (int i = 0; i < k * n; i++) raw_b[i] = plain_b[i] = (float)(2 * rng_uniform(rng) - 1);
        if (cublas_model_bf16) {   // the numbers the product sees
            for (int i = 0; i < m * k; i++)
                plain_a[i] = __bfloat162float(__float2bfloat16(raw_a[i]));
            for (int i = 0; i < k * n; i++)
                plain_b[i] = __bfloat162float(__float2bfloat16(raw_b[i]));
        }
        store_operand(A + e * stride_a, (size_t)stride_a, plain_a, m, k, ta, lda);
        store_operand(B + e * stride_b, (size_t)stride_b, plain_b, k, n, tb, ldb);
        for (long long i = 0; i < stride_c; i++) C[e * stride_c + i] = -7.0f;   // the sentinel
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                float c = beta == 0 ? NAN : (float)(2 * rng_uniform(rng) - 1);
                C[e * stride_c + i + (size_t)j * ldc] = c;
                double sum = 0, raw_sum = 0, magnitude = 0;
                for (int p = 0; p < k; p++) {
                    sum += (double)plain_a[i * k + p] * plain_b[p * n + j];
                    raw_sum += (double)raw_a[i * k + p] * raw_b[p * n + j];
                    magnitude += fabs((double)raw_a[i * k + p] * raw_b[p * n + j]);
                }
                size_t at = (size_t)e * m * n + i * n + j;
                double added = beta == 0 ? 0 : (double)beta * c;
                expected[at] = alpha * sum + added;
                unrounded[at] = alpha * raw_sum + added;
                // the bound, and fp32's rounding of alpha times the sum and of adding beta C
                bound[at] = alpha * per_term * magnitude +
                            0x1p-23 * (fabs(alpha * raw_sum) + 2 * fabs(added));
            }
    }
    // bf16: the operands as the GPU stores them, 2 bytes a number (their NaN padding kept)
    __nv_bfloat16 *A16 = malloc(sizeof(__nv_bfloat16) * stride_a * count);
    __nv_bfloat16 *B16 = malloc(sizeof(__nv_bfloat16) * stride_b * count);
    for (long long i = 0; i < stride_a * count; i++) A16[i] = __float2bfloat16(A[i]);
    for (long long i = 0; i < stride_b * count; i++) B16[i] = __float2bfloat16(B[i]);
    // on the "GPU": the emulator refuses operands outside device memory
    float *dA, *dB, *dC;
    size_t number = cublas_model_bf16 ? sizeof(__nv_bfloat16) : sizeof(float);
    size_t a_bytes = number * stride_a * count, b_bytes = number * stride_b * count;
    size_t c_bytes = sizeof(float) * stride_c * count;
    cudaMalloc((void **)&dA, a_bytes);
    cudaMalloc((void **)&dB, b_bytes);
    cudaMalloc((void **)&dC, c_bytes);
    cudaMemcpy(dA, cublas_model_bf16 ? (void *)A16 : (void *)A, a_bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, cublas_model_bf16 ? (void *)B16 : (void *)B, b_bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(dC, C, c_bytes, cudaMemcpyHostToDevice);
    cublasHandle_t handle;
    cublasCreate(&handle);
    cublasStatus_t status;
    if (cublas_model_bf16 && count == 1)
        status = cublasGemmEx(handle, ta, tb, m, n, k, &alpha, dA, CUDA_R_16BF, lda + lda_error,
                              dB, CUDA_R_16BF, ldb, &beta, dC, CUDA_R_32F, ldc,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    else if (cublas_model_bf16)
        status = cublasGemmStridedBatchedEx(handle, ta, tb, m, n, k, &alpha, dA, CUDA_R_16BF,
                                            lda + lda_error, stride_a, dB, CUDA_R_16BF, ldb,
                                            stride_b, &beta, dC, CUDA_R_32F, ldc, stride_c, count,
                                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    else if (count == 1)
        status = cublasSgemm(handle, ta, tb, m, n, k, &alpha, dA, lda + lda_error, dB, ldb, &beta,
                             dC, ldc);
    else
        status = cublasSgemmStridedBatched(handle, ta, tb, m, n, k, &alpha, dA, lda + lda_error,
                                           stride_a, dB, ldb, stride_b, &beta, dC, ldc,
                                           stride_c, count);
    cublasDestroy(handle);
    cudaMemcpy(C, dC, c_bytes, cudaMemcpyDeviceToHost);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
    double worst = status == CUBLAS_STATUS_SUCCESS ? 0 : INFINITY;
    for (int e = 0; e < count; e++)
        for (long long i = 0; i < stride_c; i++) {
            long long row = i % ldc, col = i / ldc;
            double got = C[e * stride_c + i];
            if (row < m && col < n) {
                size_t at = (size_t)e * m * n + row * n + col;
                double d = fabs(got - expected[at]), ratio = fabs(got - unrounded[at]) / bound[at];
                worst = fmax(worst, d <= d ? d : INFINITY);
                cublas_model_bound_ratio = fmax(cublas_model_bound_ratio,
                                                ratio <= ratio ? ratio : INFINITY);
            } else if (got != -7.0) {
                worst = INFINITY;   // written outside the m x n matrix
            }
        }
    free(A);
    free(B);
    free(C);
    free(plain_a);
    free(plain_b);
    free(c0);
    free(expected);
    free(unrounded);
    free(bound);
    free(raw_a);
    free(raw_b);
    free(A16);
    free(B16);
    return worst;
}
#endif

#ifndef COMPANION_ON_GPU
// cublasGemmEx and cublasGemmStridedBatchedEx with bf16 A and B: the same
// cases as cublasSgemm's, 2 bytes a number (an operand is checked in its own
// size), the product of the rounded numbers to fp32's sums, and within the
// bound above of the product of the numbers before rounding
static void test_cublas_model_bf16(Rng *rng) {
    cublasOperation_t ops[2] = { CUBLAS_OP_N, CUBLAS_OP_T };
    double worst = 0;
    cublas_model_bf16 = 1;
    cublas_model_bound_ratio = 0;
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            for (int batched = 0; batched < 2; batched++)
                worst = fmax(worst, fmax(cublas_model_case(ops[a], ops[b], 3, 4, 5, 2, 0.5f,
                                                           batched ? 3 : 1, 0, rng),
                                         cublas_model_case(ops[a], ops[b], 4, 3, 6, 1, 0.0f,
                                                           batched ? 3 : 1, 0, rng)));
    double wide = cublas_model_case(CUBLAS_OP_T, CUBLAS_OP_N, 7, 5, 300, 3, 0.0f, 2, 0,
                                    rng);   // a long sum
    double bound_ratio = cublas_model_bound_ratio;
    double wrong_ld = cublas_model_case(CUBLAS_OP_T, CUBLAS_OP_N, 3, 4, 5, 2, 0.5f, 1, -1, rng);
    cublas_model_bf16 = 0;
    check(worst < CUBLAS_MODEL_TOL && wide < CUBLAS_MODEL_TOL && bound_ratio <= 1 &&
          bound_ratio > 0.01 && !(wrong_ld < CUBLAS_MODEL_TOL),
          "companion: cublasGemmEx and cublasGemmStridedBatchedEx on bf16 A and B (cuda_on_cpu.h) "
          "compute the rounded numbers' product with fp32 sums (worst error %.1e, %.1e with 300 "
          "terms; tolerance %.0e) for N/T x N/T, padded leading dimensions, batch strides, beta 0 "
          "with C NaN; every element within %.2f of the bound (2u + u^2 + K 2^-24) sum |a||b| of "
          "the unrounded product; a leading dimension one too small is caught",
          worst, wide, CUBLAS_MODEL_TOL, bound_ratio);
    // 6 bf16 numbers fit a 12-byte allocation (an operand checked in 2 bytes a number); the 7th
    // does not; fp32 operands, fp32 C with fp32 A, and any other type or compute type are not what
    // the emulator computes
    cublasHandle_t handle;
    cublasCreate(&handle);
    __nv_bfloat16 *x;
    float *y, one = 1, zero = 0;
    cudaMalloc((void **)&x, 6 * sizeof(__nv_bfloat16));
    cudaMalloc((void **)&y, 4 * sizeof(float));
    cudaMemset(x, 0, 6 * sizeof(__nv_bfloat16));
    cublasStatus_t fits = cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, x,
                                       CUDA_R_16BF, 2, x, CUDA_R_16BF, 3, &zero, y, CUDA_R_32F, 2,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cublasStatus_t past = cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, x,
                                       CUDA_R_16BF, 2, x + 1, CUDA_R_16BF, 3, &zero, y, CUDA_R_32F,
                                       2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cublasStatus_t mixed = cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, x,
                                        CUDA_R_16BF, 2, y, CUDA_R_32F, 3, &zero, y, CUDA_R_32F, 2,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cublasStatus_t bf16_out = cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, x,
                                           CUDA_R_16BF, 2, x, CUDA_R_16BF, 3, &zero, y, CUDA_R_16BF,
                                           2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cudaFree(x);
    cudaFree(y);
    cublasDestroy(handle);
    cuda_on_cpu.sticky_error = cuda_on_cpu.last_error = cudaSuccess;   // (the refused
                                                                       // operand's fault)
    check(fits == CUBLAS_STATUS_SUCCESS && past == CUBLAS_STATUS_EXECUTION_FAILED &&
          mixed == CUBLAS_STATUS_NOT_SUPPORTED && bf16_out == CUBLAS_STATUS_NOT_SUPPORTED,
          "companion: cublasGemmEx checks a bf16 operand in 2 bytes a number (3 x 2 fits 12 bytes: "
          "%s; one number further does not: %s) and refuses types it does not compute (bf16 A with "
          "fp32 B: %s; bf16 C: %s)",
          cublasGetStatusString(fits), cublasGetStatusString(past), cublasGetStatusString(mixed),
          cublasGetStatusString(bf16_out));
}

// __float2bfloat16 as CUDA's: round to nearest, ties to even, past the
// largest finite number to infinity, any NaN to NaN; __bfloat162float exact
static float float_of_bits(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
static unsigned bf16_bits(float f) { return __float2bfloat16(f).x; }
static void test_emulator_bf16(void) {
    struct {
        float in;
        unsigned want;
        const char *what;
    } cases[] = {
        { 1.0f, 0x3f80, "1" },
        { 1.0f + 0x1p-8f, 0x3f80, "1 + 2^-8, a tie: to 1 (even)" },
        { 1.0f + 3 * 0x1p-8f, 0x3f82, "1 + 3 2^-8, a tie: to 1 + 2^-6 (even)" },
        { 1.0f + 0x1p-8f + 0x1p-20f, 0x3f81, "just past the tie: up" },
        { 1.0f + 0x1p-8f - 0x1p-20f, 0x3f80, "just short of it: down" },
        { -(1.0f + 3 * 0x1p-8f), 0xbf82, "negative ties to even too" },
        { 3.0e38f, 0x7f62, "3e38" },
        { float_of_bits(0x7f7f7fffu), 0x7f7f, "just short of the largest bf16's tie: the largest" },
        { float_of_bits(0x7f7f8000u), 0x7f80,
          "the largest bf16's tie with 2^128: infinity (even)" },
        { FLT_MAX, 0x7f80, "fp32's largest: infinity" },
        { -FLT_MAX, 0xff80, "its negative: -infinity" },
        { INFINITY, 0x7f80, "infinity" },
        { -0.0f, 0x8000, "-0" },
        { float_of_bits(0x00018000u), 0x0002, "a subnormal's tie: to even" },
    };
    int n = (int)(sizeof cases / sizeof *cases), right = 0;
    for (int i = 0; i < n; i++) {
        unsigned got = bf16_bits(cases[i].in);
        right += got == cases[i].want;
        if (got != cases[i].want)
            printf("     bf16: %s: %.9g gave 0x%04x, expected 0x%04x\n", cases[i].what,
                   (double)cases[i].in, got, cases[i].want);
    }
    // NaNs: quiet, signalling (a payload only in the bits rounding drops, which truncation would
    // make infinity), negative
    uint32_t nans[4] = { 0x7fc00000u, 0x7f800001u, 0xff800001u, 0xffc00000u };
    int nan_kept = 1;
    for (int i = 0; i < 4; i++)
        nan_kept &= isnan(__bfloat162float(__float2bfloat16(float_of_bits(nans[i]))));
    // every bf16 number but the NaNs comes back from fp32 as itself: the conversion to fp32 is
    // exact
    int exact = 1, numbers = 0;
    for (uint32_t b = 0; b < 0x10000u; b++) {
        __nv_bfloat16 h = { (unsigned short)b };
        float f = __bfloat162float(h);
        uint32_t f_bits;
        memcpy(&f_bits, &f, sizeof f_bits);
        if (isnan(f))
            continue;
        numbers++;
        exact &= f_bits == b << 16 && __float2bfloat16(f).x == b;
    }
    check(right == n && nan_kept && exact && numbers == 65536 - 254,
          "emulator: __float2bfloat16 rounds to nearest with ties to even (%d of %d cases: ties, "
          "just past and short of them, negatives, a subnormal), past the largest finite number to "
          "infinity, keeps 4 kinds of NaN a NaN; __bfloat162float gives each of the %d bf16 "
          "numbers that are not NaN as fp32's upper half, and it converts back to itself",
          right, n, numbers);
}

static void test_cublas_model(void) {
    Rng rng;
    rng_seed(&rng, 41);
    const char *names[2] = { "N", "T" };
    cublasOperation_t ops[2] = { CUBLAS_OP_N, CUBLAS_OP_T };
    double worst = 0;
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
            for (int batched = 0; batched < 2; batched++) {
                double e = fmax(cublas_model_case(ops[a], ops[b], 3, 4, 5, 2, 0.5f,
                                                  batched ? 3 : 1, 0, &rng),
                                cublas_model_case(ops[a], ops[b], 4, 3, 6, 1, 0.0f,
                                                  batched ? 3 : 1, 0, &rng));
                if (e > worst)
                    worst = e;
                if (!(e < CUBLAS_MODEL_TOL))
                    printf("     cuBLAS model: transa %s transb %s %s: error %.2e\n", names[a],
                           names[b], batched ? "strided batched" : "single", e);
            }
    check(worst < CUBLAS_MODEL_TOL,
          "companion: the cuBLAS model (cuda_on_cpu.h) computes alpha op(A) op(B) + beta C as "
          "plain row-major products do, for N/T x N/T, padded leading dimensions, batch strides, "
          "beta 0 with C NaN, never writing C's padding (worst error %.1e, tolerance %.0e)",
          worst, CUBLAS_MODEL_TOL);
    double wrong_ld = cublas_model_case(CUBLAS_OP_T, CUBLAS_OP_N, 3, 4, 5, 2, 0.5f, 1, -1, &rng);
    check(!(wrong_ld < CUBLAS_MODEL_TOL),
          "companion: a leading dimension one too small is caught (error %.2g)", wrong_ld);
    float x[4] = { 1, 2, 3, 4 }, y[4] = { 0 }, one = 1, zero = 0;
    cublasHandle_t handle;
    cublasCreate(&handle);
    cublasStatus_t refused = cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, x, 1, x,
                                         2, &zero, y, 2);
    cublasDestroy(handle);
    check(refused == CUBLAS_STATUS_INVALID_VALUE,
          "companion: lda 1 for a 2-row A is refused as cuBLAS does (%s)",
          cublasGetStatusString(refused));
    test_cublas_model_bf16(&rng);
}

// cublasLtMatmul in the emulator (epilogues.h's two epilogues): one m x n
// product D = A B (A m x k, B k x n, column-major) with `epilogue`, the
// descriptor's bias and mask pointers, and mask_ld; the heuristic's count of
// algorithms in *found. Returns the status of the heuristic or of the call.
static cublasStatus_t lt_case(uint32_t epilogue, const float *A, const float *B, float *D,
                              float *bias, unsigned char *mask, int64_t mask_ld, int m, int n,
                              int k, int *found) {
    cublasLtHandle_t lt;
    cublasLtCreate(&lt);
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &mask,
                                   sizeof mask);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &mask_ld,
                                   sizeof mask_ld);
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, (uint64_t)m, (uint64_t)k, m);
    cublasLtMatrixLayoutCreate(&b, CUDA_R_32F, (uint64_t)k, (uint64_t)n, k);
    cublasLtMatrixLayoutCreate(&d, CUDA_R_32F, (uint64_t)m, (uint64_t)n, m);
    cublasLtMatmulPreference_t preference;
    cublasLtMatmulPreferenceCreate(&preference);
    cublasLtMatmulHeuristicResult_t result;
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, d, d, preference, 1,
                                                           &result, found);
    float one = 1, zero = 0;
    if (status == CUBLAS_STATUS_SUCCESS && *found > 0)
        status = cublasLtMatmul(lt, desc, &one, A, a, B, b, &zero, D, d, D, d, &result.algo, NULL,
                                0, NULL);
    cublasLtMatmulPreferenceDestroy(preference);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(d);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(lt);
    return status;
}

// The two epilogues as cuBLASLt's documentation defines them, on a 5 x 3
// product of depth 4: RELU_AUX_BIAS adds the bias to each row and clips, and
// its mask lets DRELU_BGRAD through exactly where the forward was positive,
// with the bias gradient the sums of the masked rows; a mask's leading
// dimension that is not a multiple of 128 is refused, and an epilogue the
// emulator does not compute (GELU's) gets no algorithm (the caller's fallback).
static void test_emulator_epilogues(void) {
    enum { M = 5, N = 3, K = 4 };
    Rng rng;
    rng_seed(&rng, 17);
    float a[M * K], b[K * N], g[K * N], bias[M];
    for (int i = 0; i < M * K; i++) a[i] = (float)rng_normal(&rng);
    for (int i = 0; i < K * N; i++) b[i] = (float)rng_normal(&rng);
    for (int i = 0; i < K * N; i++) g[i] = (float)rng_normal(&rng);
    for (int i = 0; i < M; i++) bias[i] = (float)rng_normal(&rng);
    float *dA, *dB, *dG, *dD, *dbias, *dgrad;
    unsigned char *dmask;
    cudaMalloc((void **)&dA, sizeof a);
    cudaMalloc((void **)&dB, sizeof b);
    cudaMalloc((void **)&dG, sizeof g);
    cudaMalloc((void **)&dD, M * N * sizeof(float));
    cudaMalloc((void **)&dbias, sizeof bias);
    cudaMalloc((void **)&dgrad, M * sizeof(float));
    cudaMalloc((void **)&dmask, 128 / 8 * N);
    cudaMemcpy(dA, a, sizeof a, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, b, sizeof b, cudaMemcpyHostToDevice);
    cudaMemcpy(dG, g, sizeof g, cudaMemcpyHostToDevice);
    cudaMemcpy(dbias, bias, sizeof bias, cudaMemcpyHostToDevice);

    // forward: D = max(0, A B + bias), and the mask
    int found = 0;
    cublasStatus_t forward = lt_case(CUBLASLT_EPILOGUE_RELU_AUX_BIAS, dA, dB, dD, dbias, dmask, 128,
                                     M, N, K, &found);
    float d[M * N];
    cudaMemcpy(d, dD, sizeof d, cudaMemcpyDeviceToHost);
    int positive[M * N];
    double worst = 0;
    int clipped = 0;
    for (int j = 0; j < N; j++) {
        for (int i = 0; i < M; i++) {
            double v = bias[i];
            for (int p = 0; p < K; p++) v += (double)a[i + p * M] * b[p + j * K];
            positive[i + j * M] = v > 0;
            clipped += v <= 0;
            double expected = v > 0 ? v : 0;
            worst = fmax(worst, fabs(d[i + j * M] - expected));
            if (v <= 0 && d[i + j * M] != 0.0f)
                worst = INFINITY;
        }
    }

    // backward: D = A G where the mask is set, else 0; the bias gradient the rows' sums
    int found_back = 0;
    cublasStatus_t backward = lt_case(CUBLASLT_EPILOGUE_DRELU_BGRAD, dA, dG, dD, dgrad, dmask, 128,
                                      M, N, K, &found_back);
    float grad[M];
    cudaMemcpy(d, dD, sizeof d, cudaMemcpyDeviceToHost);
    cudaMemcpy(grad, dgrad, sizeof grad, cudaMemcpyDeviceToHost);
    double worst_back = 0;
    for (int i = 0; i < M; i++) {
        double row_sum = 0;
        for (int j = 0; j < N; j++) {
            double v = 0;
            for (int p = 0; p < K; p++) v += (double)a[i + p * M] * g[p + j * K];
            double expected = positive[i + j * M] ? v : 0;
            row_sum += expected;
            worst_back = fmax(worst_back, fabs(d[i + j * M] - expected));
            if (!positive[i + j * M] && d[i + j * M] != 0.0f)
                worst_back = INFINITY;
        }
        worst_back = fmax(worst_back, fabs(grad[i] - row_sum));
    }
    check(forward == CUBLAS_STATUS_SUCCESS && backward == CUBLAS_STATUS_SUCCESS && found == 1 &&
          found_back == 1 && clipped > 0 && clipped < M * N && worst < 1e-5 && worst_back < 1e-5,
          "emulator: cublasLtMatmul's RELU_AUX_BIAS gives max(0, A B + bias) (%d of %d clipped to "
          "exactly 0; worst %.1e) and its mask; DRELU_BGRAD then lets A G through where the "
          "forward was positive, 0 elsewhere, and writes the rows' sums as the bias gradient "
          "(worst %.1e)",
          clipped, M * N, worst, worst_back);

    int none = 1;
    cublasStatus_t odd_ld = lt_case(CUBLASLT_EPILOGUE_DRELU_BGRAD, dA, dG, dD, dgrad, dmask, 100, M,
                                    N, K, &found);
    cublasStatus_t gelu = lt_case(32, dA, dG, dD, dgrad, dmask, 128, M, N, K, &none);
    float *short_bias;
    cudaMalloc((void **)&short_bias, (M - 1) * sizeof(float));
    cublasStatus_t short_one = lt_case(CUBLASLT_EPILOGUE_RELU_AUX_BIAS, dA, dB, dD, short_bias,
                                       dmask, 128, M, N, K, &found);
    cudaFree(short_bias);
    check(odd_ld == CUBLAS_STATUS_INVALID_VALUE && gelu == CUBLAS_STATUS_NOT_SUPPORTED &&
          none == 0 && short_one == CUBLAS_STATUS_EXECUTION_FAILED,
          "emulator: a ReLU mask of leading dimension 100 (not a multiple of 128) is refused (%s); "
          "GELU's epilogue gets no algorithm (%s, %d found); a bias one float shorter than D's "
          "rows is caught (%s)",
          cublasGetStatusString(odd_ld), cublasGetStatusString(gelu), none,
          cublasGetStatusString(short_one));
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dG);
    cudaFree(dD);
    cudaFree(dbias);
    cudaFree(dgrad);
    cudaFree(dmask);
}
#endif

// The committed PyTorch reference files through the companion's steps: the
// same tolerances as transformer.c's (reference_tolerances), learned positions included.
static void test_companion_reference_file(const char *path) {
    Reference r;
    if (!reference_read(&r, path)) {
        check(0, "companion reference %s: unreadable", path);
        reference_free(&r);
        return;
    }
    printf("-- %s through transformer_cuda.cu\n", path);
    RefMutation none = { 0 };
    RefMismatches m = reference_compare(&r, path, 1, &none, transformer_cuda_training());
    check(m.before_adam == 0 && m.adam == 0,
          "companion: reference %s: logits, loss, %d gradients, %d Adam steps match PyTorch", path,
          nonempty_tensors(&r.config), r.adam_steps);
    reference_free(&r);
    transformer_cuda_release();
}

static void test_companion_reference_files(void) {
    for (size_t i = 0; i < sizeof committed_references / sizeof *committed_references; i++)
        test_companion_reference_file(committed_references[i]);
}

// transformer.c and the companion side by side for several steps, from the
// same seed, dropout on (the same masks: the companion draws its keys from
// the host model's generator), over ragged batches of three shapes (the
// companion's buffers grow, and a smaller batch reuses them), with sinusoids
// or learned positions: the worst differences found
typedef struct {
    double loss, grad, update;         // relative: losses, gradients and updates to their largest
    const char *grad_name;             // the tensor of the worst gradient
    double positions_grad;             // learned positions' gradient alone (0 with sinusoids)
    int tensors;                       // gradient tensors compared (not empty)
    int same_state;                    // the same dropout generator state and Adam step
} CompanionRun;

// The training runs' model and their ragged batches of three shapes.
static int companion_head_size;   // when set, 2 heads of this size instead of small_config's 4 of 4
static TransformerConfig companion_config(int positional) {
    TransformerConfig config = small_config();
    config.d_ff = 24;
    config.vocab_size = 19;
    config.max_len = 20;
    config.positional = positional;
    if (companion_head_size) {
        config.n_heads = 2;
        config.d_model = 2 * companion_head_size;
    }
    return config;
}
static TestBatch *companion_batches(void) {
    static TestBatch batches[3];
    int shapes[3][3] = { { 3, 7, 9 }, { 4, 11, 6 }, { 2, 5, 5 } };
    int src_len[3][4] = { { 7, 3, 5 }, { 11, 2, 9, 6 }, { 5, 1 } },
        tgt_len[3][4] = { { 4, 9, 1 }, { 6, 6, 3, 2 }, { 2, 5 } };
    Rng rng;
    rng_seed(&rng, 6);
    for (int i = 0; i < 3; i++)
        make_test_batch(&batches[i], shapes[i][0], shapes[i][1], shapes[i][2], src_len[i],
                        tgt_len[i], 19, &rng);
    return batches;
}

static CompanionRun companion_training_run(int positional) {
    TransformerConfig config = companion_config(positional);
    CompanionRun r = { 0, 0, 0, "", 0, 0, 0 };
    Transformer cpu, dev;
    transformer_build(&cpu, &config, 5);
    transformer_build(&dev, &config, 5);
    real *initial = checked_calloc(cpu.num_parameters, sizeof(real), "initial parameters");
    memcpy(initial, cpu.params_memory, cpu.num_parameters * sizeof(real));
    TestBatch *batches = companion_batches();
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) r.tensors += cpu.param_sizes[t] > 0;
    transformer_cuda_training()->begin(&dev);
    for (int step = 1; step <= COMPANION_STEPS; step++) {
        Batch *batch = &batches[(step - 1) % 3].batch;
        cpu.training = dev.training = 1;
        real loss_cpu = transformer_train_step(&cpu, batch, 4, 0.5);
        real loss_dev = transformer_cuda_training()->train_step(&dev, batch, 4, 0.5);
        double d = fabs((double)loss_dev - loss_cpu) / fabs((double)loss_cpu);
        r.loss = d <= r.loss ? r.loss : (isnan(d) ? INFINITY : d);
        if (step <= 3) {   // each batch shape's gradients, tensor by tensor
            transformer_cuda_training()->to_host(&dev);
            real **grads[2][NUM_PARAMETER_TENSORS];
            parameter_pointers(grads[0], &cpu.grads);
            parameter_pointers(grads[1], &dev.grads);
            for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
                double e = scaled_difference(*grads[1][t], *grads[0][t], cpu.param_sizes[t], NULL);
                if (!(e <= r.grad)) {
                    r.grad = e;
                    r.grad_name = parameter_names[t];
                }
                if (grads[0][t] == &cpu.grads.position_embedding && !(e <= r.positions_grad))
                    r.positions_grad = e;
            }
        }
    }
    transformer_cuda_training()->to_host(&dev);
    size_t P = cpu.num_parameters;
    real *updates[2] = { checked_calloc(P, sizeof(real), "updates"),
                         checked_calloc(P, sizeof(real), "updates") };
    for (size_t i = 0; i < P; i++) {
        updates[0][i] = cpu.params_memory[i] - initial[i];
        updates[1][i] = dev.params_memory[i] - initial[i];
    }
    unsigned char *skip = key_bias_skip_mask(&cpu);
    r.update = scaled_difference(updates[1], updates[0], P, skip);
    r.same_state = cpu.dropout_rng.state == dev.dropout_rng.state && cpu.adam_step == dev.adam_step;
    free(initial);
    free(updates[0]);
    free(updates[1]);
    free(skip);
    transformer_free(&cpu);
    transformer_free(&dev);
    transformer_cuda_release();
    return r;
}

static void test_companion_training_run(void) {
    for (int positional = POSITIONAL_SINUSOID; positional <= POSITIONAL_LEARNED; positional++) {
        const char *kind = positional == POSITIONAL_LEARNED ? "learned positions (Table 3, row E)"
                                                            : "sinusoids";
        CompanionRun r = companion_training_run(positional);
        char positions[64] = "";
        if (positional == POSITIONAL_LEARNED)
            snprintf(positions, sizeof positions, "; position_embedding %.1e", r.positions_grad);
        check(r.loss < COMPANION_TOL_LOSS && r.grad < COMPANION_TOL_GRADS,
              "companion: %d training steps with %s (2 layers, d_model 16, 4 heads, ragged batches "
              "of 3 shapes, dropout on): transformer.c's losses (worst %.1e, tolerance %.0e) and, "
              "for each shape, all %d gradients (worst %.1e, %s%s; tolerance %.0e)",
              COMPANION_STEPS, kind, r.loss, COMPANION_TOL_LOSS, r.tensors, r.grad, r.grad_name,
              positions, COMPANION_TOL_GRADS);
        check(r.update < COMPANION_TOL_UPDATES && r.same_state,
              "companion: with %s, after %d Adam steps the parameters moved as transformer.c's "
              "(worst %.1e of the largest update; tolerance %.0e), the same dropout generator "
              "state and step",
              kind, COMPANION_STEPS, r.update, COMPANION_TOL_UPDATES);
    }
#ifndef COMPANION_ON_GPU
    // A fault the comparison must catch: learned positions' backward kernel never launched
    // (cuda_on_cpu.h skips it), so the table gets no gradient and Adam never moves it.
    cpu_test_faults.launch_skipped = "position_embedding_backward_kernel";
    CompanionRun r = companion_training_run(POSITIONAL_LEARNED);
    cpu_test_faults.launch_skipped = NULL;
    check(!(r.grad < COMPANION_TOL_GRADS) && strcmp(r.grad_name, "position_embedding") == 0 &&
          !(r.update < COMPANION_TOL_UPDATES),
          "companion: position_embedding_backward_kernel not launched is caught (gradient of %s "
          "off by %.2g of its largest, updates by %.2g)",
          r.grad_name, r.grad, r.update);
#endif
}

// --fused-attention: attention in one kernel each way (fused_attention_forward_kernel,
// fused_attention_backward_kernel) gives transformer.c's losses, gradients and
// updates as cuBLAS's batched products do, with 8 fewer launches and cuBLAS
// calls for each attention sub-layer (3 forward, 5 backward)
#ifndef COMPANION_ON_GPU
static GpuCounts companion_step_counts(int layers, int B, int graph_after);   // (below)
#endif
static void test_companion_fused_attention(void) {
    transformer_cuda_fuse_attention(1);
    CompanionRun r = companion_training_run(POSITIONAL_SINUSOID);
    transformer_cuda_fuse_attention(0);
    check(r.loss < COMPANION_TOL_LOSS && r.grad < COMPANION_TOL_GRADS &&
          r.update < COMPANION_TOL_UPDATES && r.same_state,
          "companion --fused-attention: %d training steps (2 layers, d_model 16, 4 heads of 4, "
          "ragged batches of 3 shapes): transformer.c's losses (worst %.1e), all %d gradients "
          "(worst %.1e, %s) and updates (worst %.1e of the largest)",
          COMPANION_STEPS, r.loss, r.tensors, r.grad, r.grad_name, r.update);
    // Heads of 48, more than a warp's lanes: d_model 96 sums more, in float, so
    // both paths are further from transformer.c (the batched products' gradients
    // 1.4e-5 on the emulator): the fused kernels must be as close as they are
    companion_head_size = 48;
    CompanionRun batched = companion_training_run(POSITIONAL_SINUSOID);
    transformer_cuda_fuse_attention(1);
    r = companion_training_run(POSITIONAL_SINUSOID);
    transformer_cuda_fuse_attention(0);
    companion_head_size = 0;
    check(r.loss <= 2 * batched.loss + 1e-7 && r.grad <= 2 * batched.grad + 1e-7 &&
          r.update <= 2 * batched.update + 1e-6 && r.grad < 10 * COMPANION_TOL_GRADS &&
          r.same_state,
          "companion --fused-attention: with 2 heads of 48 (d_model 96), as close to transformer.c "
          "as the batched products (losses %.1e against %.1e, gradients %.1e against %.1e, updates "
          "%.1e against %.1e: within 2 times)",
          r.loss, batched.loss, r.grad, batched.grad, r.update, batched.update);
#ifndef COMPANION_ON_GPU
    GpuCounts plain = companion_step_counts(2, 4, 0);
    transformer_cuda_fuse_attention(1);
    GpuCounts fused = companion_step_counts(2, 4, 0);
    transformer_cuda_fuse_attention(0);
    long fewer = plain.launches + plain.gemms - fused.launches - fused.gemms;
    // a self-attention sub-layer: 4 forward (the copy into heads, two products, the softmax, the
    // copy back: one kernel) and 6 backward (the copy into heads, four products, the softmax, the
    // copy back: one kernel); a cross-attention 4 and 7 (its keys' and values' copy back too); the
    // memory's keys and values: 1
    check(fewer == 10 * 2 * 2 + 11 * 2 + 1,
          "companion --fused-attention: a 2-layer step is %ld launches and cuBLAS calls, %ld fewer "
          "than without (10 for each of its 4 self-attention sub-layers, 11 for each of its 2 "
          "cross-attentions, 1 for the memory's keys and values)",
          fused.launches + fused.gemms, fewer);
#endif
}

// The two streams give the bits of one: 9 training steps over the 3 ragged
// shapes (graphs captured and replayed from the fourth step), on two streams
// and with --one-stream, end with the same parameters and moments. On a GPU
// this is cuBLAS's promise for a handle and a workspace a stream; on the
// emulator the two streams' work runs in another order at each replay.
static void test_companion_one_stream(void) {
    real *state[2];
    size_t P = 0;
    for (int one = 0; one <= 1; one++) {
        TransformerConfig config = companion_config(POSITIONAL_SINUSOID);
        Transformer dev;
        transformer_build(&dev, &config, 5);
        TestBatch *batches = companion_batches();
        transformer_cuda_one_stream(one);
        transformer_cuda_training()->begin(&dev);
        for (int step = 0; step < 9; step++) {
            dev.training = 1;
            transformer_cuda_training()->train_step(&dev, &batches[step % 3].batch, 4, 0.5);
        }
        transformer_cuda_training()->to_host(&dev);
        P = dev.num_parameters;
        state[one] = checked_calloc(2 * P, sizeof(real), "companion state");
        memcpy(state[one], dev.params_memory, P * sizeof(real));
        memcpy(state[one] + P, dev.adam_v, P * sizeof(real));
        transformer_free(&dev);
        transformer_cuda_release();
    }
    transformer_cuda_one_stream(0);
    check(memcmp(state[0], state[1], 2 * P * sizeof(real)) == 0,
          "companion: 9 training steps (graphs replayed) on two streams and on one (--one-stream) "
          "end with the same parameters and moments, bit for bit");
    free(state[0]);
    free(state[1]);
}

// The feed-forward networks' bias and ReLU in cuBLASLt's epilogues
// (epilogues.h, the default: every other test runs them) and in the kernels
// (--no-epilogues): both give transformer.c's losses, gradients and updates.
// On the emulator, products computed without their epilogues are caught, and
// the epilogues take 2 launches from each feed-forward network's step.
static void test_companion_epilogues(void) {
    transformer_cuda_epilogues(0);
    CompanionRun kernels = companion_training_run(POSITIONAL_SINUSOID);
    transformer_cuda_epilogues(1);
    check(kernels.loss < COMPANION_TOL_LOSS && kernels.grad < COMPANION_TOL_GRADS &&
          kernels.update < COMPANION_TOL_UPDATES && kernels.same_state,
          "companion --no-epilogues: %d training steps with the feed-forward networks' bias and "
          "ReLU in kernels of their own: transformer.c's losses (worst %.1e), gradients (worst "
          "%.1e, %s) and updates (worst %.1e)",
          COMPANION_STEPS, kernels.loss, kernels.grad, kernels.grad_name, kernels.update);
#ifndef COMPANION_ON_GPU
    cpu_test_faults.epilogues_skipped = 1;
    CompanionRun skipped = companion_training_run(POSITIONAL_SINUSOID);
    cpu_test_faults.epilogues_skipped = 0;
    check(!(skipped.grad < COMPANION_TOL_GRADS) && !(skipped.update < COMPANION_TOL_UPDATES),
          "companion: cuBLASLt's products without their epilogues (no bias, no ReLU, no mask, no "
          "bias gradient) are caught (gradients off by %.2g of their largest, at %s)",
          skipped.grad, skipped.grad_name);
    GpuCounts with = companion_step_counts(2, 4, 2);
    transformer_cuda_epilogues(0);
    GpuCounts without = companion_step_counts(2, 4, 2);
    transformer_cuda_epilogues(1);
    check(with.launches == without.launches - 2 * 4 && with.gemms == without.gemms &&
          with.epilogue_products == 2 * 4 && without.epilogue_products == 0,
          "companion: with cuBLASLt's epilogues a 2-layer step is %ld launches and %ld cuBLAS and "
          "cuBLASLt calls (%ld of them with an epilogue), 8 launches fewer than with the kernels "
          "(2 for each of its 4 feed-forward networks: bias + ReLU, and their backward)",
          with.launches, with.gemms, with.epilogue_products);

    // Where cuBLASLt has an algorithm for the forward epilogue but not for the
    // backward one, the backward runs its kernel from the mask-free hidden
    // layer; where cublasLtMatmul refuses a call as not supported, the kernels run.
    cpu_test_faults.epilogue_refused = CUBLASLT_EPILOGUE_DRELU_BGRAD;
    CompanionRun half = companion_training_run(POSITIONAL_SINUSOID);
    GpuCounts half_counts = companion_step_counts(2, 4, 2);
    cpu_test_faults.epilogue_refused = 0;
    cpu_test_faults.lt_matmul_refused = 1;
    CompanionRun refused = companion_training_run(POSITIONAL_SINUSOID);
    GpuCounts refused_counts = companion_step_counts(2, 4, 2);
    cpu_test_faults.lt_matmul_refused = 0;
    int half_close = half.loss < COMPANION_TOL_LOSS && half.grad < COMPANION_TOL_GRADS &&
                     half.update < COMPANION_TOL_UPDATES;
    int refused_close = refused.loss < COMPANION_TOL_LOSS && refused.grad < COMPANION_TOL_GRADS &&
                        refused.update < COMPANION_TOL_UPDATES;
    check(half_close && half_counts.epilogue_products == 4 &&
          half_counts.launches == without.launches - 4 && refused_close &&
          refused_counts.epilogue_products == 0 && refused_counts.launches == without.launches,
          "companion: with no algorithm for DRELU_BGRAD, the forward epilogues and the backward "
          "kernels (%ld epilogue products, %ld launches) give transformer.c's gradients (worst "
          "%.1e); with cublasLtMatmul refusing, the kernels alone (%ld launches; worst %.1e)",
          half_counts.epilogue_products, half_counts.launches, half.grad, refused_counts.launches,
          refused.grad);
#endif
}

// The parameters and Adam's second moments of a model the companion trained
// (P numbers each, one array), after which the model and the companion are freed.
static real *companion_state_released(Transformer *dev) {
    size_t P = dev->num_parameters;
    real *state = checked_calloc(2 * P, sizeof(real), "companion state");
    memcpy(state, dev->params_memory, P * sizeof(real));
    memcpy(state + P, dev->adam_v, P * sizeof(real));
    transformer_free(dev);
    transformer_cuda_release();
    return state;
}

// --tf32's transposed copies of the weights (transposed_weights.h): the
// parameters and second moments after 9 training steps over the 3 ragged
// shapes (graphs replayed from the fourth), with the copies or without
// (--weights-as-stored); on the emulator, with a kernel's launches (skipped)
// or its barriers (barrier_skipped) left out after begin (NULL: none).
static real *companion_state_tf32(int as_stored, const char *skipped, const char *barrier_skipped) {
    TransformerConfig config = companion_config(POSITIONAL_SINUSOID);
    Transformer dev;
    transformer_build(&dev, &config, 5);
    TestBatch *batches = companion_batches();
    transformer_cuda_tf32(1);
    transformer_cuda_weights_as_stored(as_stored);
    transformer_cuda_training()->begin(&dev);
#ifndef COMPANION_ON_GPU
    cpu_test_faults.launch_skipped = skipped;
    cpu_test_faults.barriers_skipped = barrier_skipped;
#else
    (void)skipped;
    (void)barrier_skipped;
#endif
    for (int step = 0; step < 9; step++) {
        dev.training = 1;
        transformer_cuda_training()->train_step(&dev, &batches[step % 3].batch, 4, 0.5);
    }
    transformer_cuda_training()->to_host(&dev);
#ifndef COMPANION_ON_GPU
    cpu_test_faults.launch_skipped = NULL;
    cpu_test_faults.barriers_skipped = NULL;
#endif
    transformer_cuda_tf32(0);
    transformer_cuda_weights_as_stored(0);
    return companion_state_released(&dev);
}

// The inputs' gradients read the copies as the TN products they then are;
// a product reads the same numbers in the same order either way, so on the
// emulator (TF32 computed as fp32) the run gives the bits of the run without
// them, which the other tests compare with transformer.c. A copy left as it was
// after Adam (transpose_weights_kernel not launched after begin's), and the
// kernel without its barrier (a tile read before it is written), are caught.
// On a GPU the two layouts are different TF32 kernels: each run is the same bit
// for bit when repeated, and the two agree to TF32's rounding.
static void test_companion_transposed_weights(void) {
    TransformerConfig config = companion_config(POSITIONAL_SINUSOID);
    Transformer probe;
    transformer_build(&probe, &config, 5);
    size_t P = probe.num_parameters;
    transformer_free(&probe);
    real *copies = companion_state_tf32(0, NULL, NULL);
    real *stored = companion_state_tf32(1, NULL, NULL);
#ifdef COMPANION_ON_GPU
    real *again = companion_state_tf32(0, NULL, NULL);
    double apart = scaled_difference(copies, stored, P, NULL);
    check(memcmp(copies, again, 2 * P * sizeof(real)) == 0 && apart < 1e-2,
          "companion --tf32: 9 training steps with the weights' transposed copies are the same bit "
          "for bit when repeated, and within 1e-2 of the largest parameter of the run that reads "
          "the weights as stored (%.1e)",
          apart);
    free(again);
#else
    real *stale = companion_state_tf32(0, "transpose_weights_kernel", NULL);
    real *unsynced = companion_state_tf32(0, NULL, "transpose_weights_kernel");
    int same = memcmp(copies, stored, 2 * P * sizeof(real)) == 0;
    int stale_caught = memcmp(stale, stored, 2 * P * sizeof(real)) != 0;
    int unsynced_caught = memcmp(unsynced, stored, 2 * P * sizeof(real)) != 0;
    check(same && stale_caught && unsynced_caught,
          "companion --tf32: 9 training steps (graphs replayed) reading the weights' transposed "
          "copies in the inputs' gradients end with the parameters and moments of the run that "
          "reads the weights as stored, bit for bit; copies not rewritten after Adam are caught "
          "(%s), and so is the transpose without its barrier (%s)",
          stale_caught ? "yes" : "NO", unsynced_caught ? "yes" : "NO");
    free(stale);
    free(unsynced);
    transformer_cuda_tf32(1);
    GpuCounts with_copies = companion_step_counts(2, 4, 2);
    transformer_cuda_weights_as_stored(1);
    GpuCounts without = companion_step_counts(2, 4, 2);
    transformer_cuda_weights_as_stored(0);
    transformer_cuda_tf32(0);
    // every input gradient of a weight reads a copy: each layer's 4 (encoder) and 6 (decoder),
    // the logits' and the memory's
    check(with_copies.launches == without.launches + 1 && with_copies.gemms == without.gemms &&
          with_copies.transposed_products == 10 * 2 + 2 && without.transposed_products == 0,
          "companion --tf32: the transposed copies cost a 2-layer step one launch (%ld against "
          "%ld), the same %ld cuBLAS calls, and %ld products read them (10 a layer, the logits' "
          "and the memory's)",
          with_copies.launches, without.launches, with_copies.gemms,
          with_copies.transposed_products);
#endif
    free(copies);
    free(stored);
}

#ifndef COMPANION_ON_GPU
// The fused kernels alone (fused_attention.cu) against the loops they replace:
// transformer.c's attention_forward and attention_backward (Part I's, the fast
// path set aside) on q, k, v in rows with their biases added, and
// linear_backward's bias gradient, the sums of dq's, dk's and dv's rows.
// q's rows are ld_q apart, k's and v's ld_kv (k at column k_column, v C further),
// as in the companion: a self-attention's (B*T, 3C) rows, a cross-attention's
// q (B*T, C) and one layer's columns of the memory's (B*S, L*2C).
typedef struct {
    int B, Tq, Tk, NH, hs, causal, ld_q, ld_kv, k_column;
} FusedCase;
// host: the run's host arrays, freed by fused_run_free after the run (a caught
// fault leaves the run at a kernel launch, before its own frees)
enum { FUSED_HOST_ARRAYS = 12 };
typedef struct {
    FusedCase shape;
    double worst;
    const char *worst_name;
    void *host[FUSED_HOST_ARRAYS];
} FusedRun;

static void fused_run_free(FusedRun *run) {
    for (int i = 0; i < FUSED_HOST_ARRAYS; i++) {
        free(run->host[i]);
        run->host[i] = NULL;
    }
}

// The largest difference of `width` columns from `column` of `rows` rows ld apart,
// relative to the host's largest there; NaN anywhere gives infinity
static double columns_difference(const float *device, const real *host, size_t rows, int ld,
                                 int column, int width) {
    double worst = 0, scale = 0;
    for (size_t r = 0; r < rows; r++)
        for (int c = column; c < column + width; c++) {
            double d = fabs((double)device[r * ld + c] - host[r * ld + c]);
            worst = d <= worst ? worst : (isnan(d) ? INFINITY : d);
            scale = fmax(scale, fabs((double)host[r * ld + c]));
        }
    return scale > 0 ? worst / scale : worst;
}

static void fused_kernels_run(void *context) {
    FusedRun *run = (FusedRun *)context;
    FusedCase f = run->shape;
    int C = f.NH * f.hs, k0 = f.k_column;
    size_t Nq = (size_t)f.B * f.Tq, Nk = (size_t)f.B * f.Tk, nq = Nq * f.ld_q, nk = Nk * f.ld_kv;
    size_t natt = (size_t)f.B * f.NH * f.Tq * f.Tk, nout = Nq * C;
    Rng rng;
    rng_seed(&rng, 17);
    // the rows without their biases (what the companion keeps), and with them (transformer.c's)
    real *q = calloc(nq, sizeof(real)), *kv = calloc(nk, sizeof(real)),
         *bias = calloc(3 * C, sizeof(real));
    real *qb = calloc(nq, sizeof(real)), *kvb = calloc(nk, sizeof(real)),
         *dout = calloc(nout, sizeof(real));
    real *out = calloc(nout, sizeof(real)), *att = calloc(natt, sizeof(real)),
         *dbias = calloc(3 * C, sizeof(real));
    real *dq = calloc(nq, sizeof(real)), *dkv = calloc(nk, sizeof(real));
    float *got = calloc(nq + nk + natt + nout + 3 * C, sizeof(float));
    void *host[FUSED_HOST_ARRAYS] = { q, kv, bias, qb, kvb, dout, out, att, dbias, dq, dkv, got };
    memcpy(run->host, host, sizeof host);
    int key_len[64];
    for (int c = 0; c < 3 * C; c++) bias[c] = (real)(rng_uniform(&rng) - 0.5);
    for (size_t i = 0; i < nq; i++) {
        int c = (int)(i % f.ld_q);
        q[i] = (real)(2 * rng_uniform(&rng) - 1);
        qb[i] = q[i] + (c < C ? bias[c] : 0);
    }
    for (size_t i = 0; i < nk; i++) {
        int c = (int)(i % f.ld_kv) - k0;
        kv[i] = (real)(2 * rng_uniform(&rng) - 1);
        kvb[i] = kv[i] + (c >= 0 && c < 2 * C ? bias[C + c] : 0);
    }
    for (size_t i = 0; i < nout; i++) dout[i] = (real)(2 * rng_uniform(&rng) - 1);
    for (int b = 0; b < f.B; b++) key_len[b] = b == 0 ? f.Tk : 1 + rng_below(&rng, f.Tk);
    AttentionShape shape = { f.B, f.Tq, f.Tk, C, f.NH, f.ld_q, f.ld_kv };
    FastPath saved = fast_path;
    fast_path.attention_forward = NULL;
    fast_path.attention_backward = NULL;
    attention_forward(out, att, qb, kvb + k0, kvb + k0 + C, key_len, f.causal, shape);
    attention_backward(dq, dkv + k0, dkv + k0 + C, dout, att, qb, kvb + k0, kvb + k0 + C, shape);
    fast_path = saved;
    for (size_t r = 0; r < Nq; r++)
        for (int c = 0; c < C; c++) dbias[c] += dq[r * f.ld_q + c];
    for (size_t r = 0; r < Nk; r++)
        for (int c = 0; c < 2 * C; c++) dbias[C + c] += dkv[r * f.ld_kv + k0 + c];
    // the same on the "GPU"
    float *d_q, *d_kv, *d_bias, *d_dout, *d_out, *d_att, *d_ds, *d_dq, *d_dkv, *d_dbias,
          *d_partials;
    int *d_len;
    unsigned *d_done;
    cudaMalloc((void **)&d_q, nq * sizeof(float));
    cudaMalloc((void **)&d_kv, nk * sizeof(float));
    cudaMalloc((void **)&d_bias, 3 * C * sizeof(float));
    cudaMalloc((void **)&d_dout, nout * sizeof(float));
    cudaMalloc((void **)&d_out, nout * sizeof(float));
    cudaMalloc((void **)&d_att, natt * sizeof(float));
    cudaMalloc((void **)&d_ds, natt * sizeof(float));
    cudaMalloc((void **)&d_dq, nq * sizeof(float));
    cudaMalloc((void **)&d_dkv, nk * sizeof(float));
    cudaMalloc((void **)&d_dbias, 3 * C * sizeof(float));
    cudaMalloc((void **)&d_partials, (size_t)f.B * 3 * C * sizeof(float));
    cudaMalloc((void **)&d_len, f.B * sizeof(int));
    cudaMalloc((void **)&d_done, f.NH * sizeof(unsigned));
    cudaMemcpy(d_q, q, nq * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(d_kv, kv, nk * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(d_bias, bias, 3 * C * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(d_dout, dout, nout * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(d_len, key_len, f.B * sizeof(int), cudaMemcpyHostToDevice);
    cudaMemset(d_done, 0, f.NH * sizeof(unsigned));
    AttentionInRows in = { d_q, d_kv + k0, d_kv + k0 + C, d_bias, d_bias + C, d_bias + 2 * C,
                           f.ld_q, f.ld_kv };
    AttentionGradsInRows g = { d_dq, d_dkv + k0, d_dkv + k0 + C, d_dbias, d_partials, d_done };
    FusedShape fs = { d_len, f.causal, f.Tq, f.Tk, f.hs };
    dim3 grid = { (unsigned)f.NH, (unsigned)f.B, 1 };
    LAUNCH_KERNEL(fused_attention_forward_kernel, grid, THREADS, fused_forward_bytes(f.Tk, f.hs),
                  d_out, d_att, in, fs);
    LAUNCH_KERNEL(fused_attention_backward_kernel, grid, THREADS,
                  fused_backward_bytes(f.Tq, f.Tk, f.hs), g, d_ds, d_dout, d_att, in, fs);
    run->worst = cudaGetLastError() == cudaSuccess ? 0 : INFINITY;
    float *got_dq = got, *got_dkv = got_dq + nq, *got_att = got_dkv + nk, *got_out = got_att + natt;
    float *got_dbias = got_out + nout;
    cudaMemcpy(got_dq, d_dq, nq * sizeof(float), cudaMemcpyDeviceToHost);
    cudaMemcpy(got_dkv, d_dkv, nk * sizeof(float), cudaMemcpyDeviceToHost);
    cudaMemcpy(got_att, d_att, natt * sizeof(float), cudaMemcpyDeviceToHost);
    cudaMemcpy(got_out, d_out, nout * sizeof(float), cudaMemcpyDeviceToHost);
    cudaMemcpy(got_dbias, d_dbias, 3 * C * sizeof(float), cudaMemcpyDeviceToHost);
    double e[6] = { columns_difference(got_out, out, Nq, C, 0, C),
                    columns_difference(got_att, att, natt, 1, 0, 1),
                    columns_difference(got_dq, dq, Nq, f.ld_q, 0, C),
                    columns_difference(got_dkv, dkv, Nk, f.ld_kv, k0, C),
                    columns_difference(got_dkv, dkv, Nk, f.ld_kv, k0 + C, C),
                    columns_difference(got_dbias, dbias, 1, 3 * C, 0, 3 * C) };
    const char *names[6] = { "out", "att", "dq", "dk", "dv", "the biases' gradient" };
    run->worst_name = "";
    for (int i = 0; i < 6; i++)
        if (!(e[i] <= run->worst)) {
            run->worst = e[i];
            run->worst_name = names[i];
        }
    cudaFree(d_q);
    cudaFree(d_kv);
    cudaFree(d_bias);
    cudaFree(d_dout);
    cudaFree(d_out);
    cudaFree(d_att);
    cudaFree(d_ds);
    cudaFree(d_dq);
    cudaFree(d_dkv);
    cudaFree(d_dbias);
    cudaFree(d_partials);
    cudaFree(d_len);
    cudaFree(d_done);
    fused_run_free(run);
}

// The kernels against the loops for a self-attention (causal, ragged keys) and
// a cross-attention (Tq != Tk, one layer's columns of the memory's rows), heads
// of 4 and of 48 (more than a warp's lanes); then with their barriers left out,
// and with 16 bytes less shared memory than they index: each must be caught.
static void test_companion_fused_attention_kernels(void) {
    FusedCase cases[4] = { { 3, 7, 7, 4, 4, 1, 48, 48, 16 },
                           { 5, 6, 9, 4, 4, 0, 16, 64, 32 },
                           { 2, 11, 11, 2, 48, 1, 288, 288, 96 },
                           { 3, 5, 13, 2, 48, 0, 96, 384, 192 } };
    const char *what[4] = { "self-attention (causal), heads of 4", "cross-attention, heads of 4",
                            "self-attention (causal), heads of 48",
                            "cross-attention, heads of 48" };
    for (int i = 0; i < 4; i++) {
        FusedRun run = { cases[i], 0, "", { 0 } };
        int faulted = cpu_catches_fault(fused_kernels_run, &run);
        fused_run_free(&run);
        check(!faulted && run.worst < COMPANION_TOL_GRADS,
              "companion: fused_attention_forward_kernel and fused_attention_backward_kernel on %d "
              "sentences of %d queries and %d keys (%s, q, k, v read from rows %d and %d apart, "
              "biases added on load) give transformer.c's attention_forward and attention_backward "
              "and the biases' gradient (worst %.1e, %s; tolerance %.0e)",
              cases[i].B, cases[i].Tq, cases[i].Tk, what[i], cases[i].ld_q, cases[i].ld_kv,
              faulted ? INFINITY : run.worst, run.worst_name, COMPANION_TOL_GRADS);
    }
#ifndef CUDA_ON_CPU_THREADS   // the faults: the fibers' (make test-threads has threads)
    const char *kernels[2] = { "fused_attention_forward_kernel",
                               "fused_attention_backward_kernel" };
    for (int k = 0; k < 2; k++) {   // 11 queries: every warp's rows of shared memory are used
        FusedRun run = { cases[2], 0, "", { 0 } };
        cpu_test_faults.barriers_skipped = kernels[k];
        int faulted = cpu_catches_fault(fused_kernels_run, &run);
        fused_run_free(&run);
        cpu_test_faults.barriers_skipped = NULL;
        check(faulted || !(run.worst < COMPANION_TOL_GRADS),
              "companion: %s without its __syncthreads and __syncwarp is caught (%s %.2g)",
              kernels[k], faulted ? "a fault:" : "off by", faulted ? 0.0 : run.worst);
        cpu_test_faults.shared_memory_short = kernels[k];
        faulted = cpu_catches_fault(fused_kernels_run, &run);
        fused_run_free(&run);
        cpu_test_faults.shared_memory_short = NULL;
        check(faulted && strstr(cuda_on_cpu.message, "out of bounds"),
              "companion: %s indexing past its shared memory (given 16 bytes less than it uses) is "
              "caught (%s)",
              kernels[k], faulted ? cuda_on_cpu.message : "not caught");
    }
#endif
}
#endif

#ifndef COMPANION_ON_GPU
// The layout kernels against their formulas, exactly (they only move numbers
// and add a bias): heads_from_rows_kernel for a self-attention's q, k, v (3
// parts), the memory's keys and values of 2 layers, and heads of 3 columns
// (odd: one at a time), with rows starting one float off 16 bytes (the float4
// loads refused, layout_width 1); rows_from_heads_kernel back. `misaligned`:
// the input 1 float off its allocation's start.
typedef struct {
    int B, T, NH, hs, parts, layers, misaligned;
} LayoutCase;
static int layout_case_exact(LayoutCase l, int *width) {
    int C = l.NH * l.hs, ld = l.parts * C * l.layers, N = l.B * l.T;
    size_t n_in = (size_t)N * ld + 1, n_out = (size_t)l.layers * l.parts * N * C,
           n_bias = (size_t)3 * C * l.layers;
    float *in = calloc(n_in, sizeof(float)), *bias = calloc(n_bias, sizeof(float));
    float *want = calloc(n_out, sizeof(float)), *got = calloc(n_out, sizeof(float));
    float *rows = calloc((size_t)N * C, sizeof(float));
    for (size_t i = 0; i < n_in; i++) in[i] = (float)i * 0.25f - 3;
    for (size_t i = 0; i < n_bias; i++) bias[i] = (float)i * 0.5f + 1;
    const float *from = in + l.misaligned;
    size_t layer_columns = (size_t)l.parts * C, layer_bias = (size_t)3 * C,
           layer_out = (size_t)l.parts * N * C;
    for (int layer = 0; layer < l.layers; layer++)
        for (int part = 0; part < l.parts; part++)
            for (int b = 0; b < l.B; b++)
                for (int head = 0; head < l.NH; head++)
                    for (int t = 0; t < l.T; t++)
                        for (int d = 0; d < l.hs; d++) {
                            int column = part * C + head * l.hs + d;
                            size_t head_row = (((size_t)part * l.B + b) * l.NH + head) * l.T + t;
                            size_t at = layer * layer_out + head_row * l.hs + d;
                            want[at] =
                                from[((size_t)b * l.T + t) * ld + layer * layer_columns + column] +
                                bias[layer * layer_bias + column];
                        }
    float *d_in, *d_bias, *d_out, *d_rows;
    cudaMalloc((void **)&d_in, n_in * sizeof(float));
    cudaMalloc((void **)&d_bias, n_bias * sizeof(float));
    cudaMalloc((void **)&d_out, n_out * sizeof(float));
    cudaMalloc((void **)&d_rows, (size_t)N * C * sizeof(float));
    cudaMemcpy(d_in, in, n_in * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(d_bias, bias, n_bias * sizeof(float), cudaMemcpyHostToDevice);
    size_t offsets[3] = { layer_columns, layer_bias, layer_out };
    gpu_heads_from_rows_layers(d_out, d_in + l.misaligned, d_bias, ld, l.parts, l.layers, offsets,
                               l.B, l.T, C, l.NH);
    const void *pointers[3] = { d_out, d_in + l.misaligned, d_bias };
    size_t all[6] = { (size_t)ld, (size_t)C, (size_t)l.hs, layer_columns, layer_bias, layer_out };
    *width = layout_width(pointers, 3, all, 6);
    gpu_rows_from_heads(d_rows, d_out, l.B, l.T, C, l.NH);   // the first part of the first layer
                                                             // back in rows
    int ran = cudaGetLastError() == cudaSuccess;
    cudaMemcpy(got, d_out, n_out * sizeof(float), cudaMemcpyDeviceToHost);
    int same = ran && memcmp(got, want, n_out * sizeof(float)) == 0;
    cudaMemcpy(got, d_rows, (size_t)N * C * sizeof(float), cudaMemcpyDeviceToHost);
    for (int n = 0; n < N && same; n++)
        for (int c = 0; c < C; c++) {
            float expected = from[(size_t)n * ld + c] + bias[c];
            same &= memcmp(&got[(size_t)n * C + c], &expected, sizeof(float)) == 0;
        }
    cudaFree(d_in);
    cudaFree(d_bias);
    cudaFree(d_out);
    cudaFree(d_rows);
    free(in);
    free(bias);
    free(want);
    free(got);
    free(rows);
    return same;
}

#ifndef CUDA_ON_CPU_THREADS
static float *layout_fault_floats;
static void launch_misaligned_layout(void *unused) {
    (void)unused;
    // float4 loads from a row one float past a 16-byte boundary, as if layout_width had said 4
    LAUNCH_KERNEL(heads_from_rows_kernel, xyz(2, 1, 1), xyz(1, 2, 1), 0, layout_fault_floats + 64,
                  layout_fault_floats + 1, (const float *)NULL, 8, 1, 0, 0, (size_t)0,
                  1, 2, 4, 2, 4);
}
#endif

static void test_companion_layout_kernels(void) {
    LayoutCase cases[4] = { { 3, 5, 4, 8, 3, 1, 0 },
                            { 2, 7, 2, 4, 2, 2, 0 },
                            { 3, 4, 2, 3, 3, 1, 0 },
                            { 2, 6, 4, 8, 3, 1, 1 } };
    const char *what[4] = { "q, k, v of 4 heads of 8", "the memory's k, v for 2 layers",
                            "heads of 3 columns", "rows one float off 16 bytes" };
    for (int i = 0; i < 4; i++) {
        int width = 0, exact = layout_case_exact(cases[i], &width);
        int expected_width = i >= 2 ? 1 : 4;
        check(exact && width == expected_width,
              "companion: heads_from_rows_kernel and rows_from_heads_kernel (%s; %d columns a "
              "thread: %s) move every number where their formulas say, bit for bit",
              what[i], width, width == 4 ? "float4 loads and stores" : "one at a time");
    }
#ifndef CUDA_ON_CPU_THREADS
    cudaMalloc((void **)&layout_fault_floats, 128 * sizeof(float));
    int caught = cpu_catches_fault(launch_misaligned_layout, NULL);
    check(caught && strstr(cuda_on_cpu.message, "misaligned"),
          "emulator: a float4 load from an address not a multiple of 16 is caught, as a GPU faults "
          "(%s)",
          caught ? cuda_on_cpu.message : "not caught");
    cudaFree(layout_fault_floats);
#endif
}
#endif

// Runs a command line (words separated by single spaces) through
// ./transformer's command line (transformer_lab_main) with the given training steps, its output
// discarded.
static int run_command_quietly(const TrainingCompute *compute, const char *command_line) {
    char text[2048], *argv[64];
    snprintf(text, sizeof text, "transformer %s", command_line);
    int argc = 0;
    for (char *word = strtok(text, " "); word && argc < 63; word = strtok(NULL, " "))
        argv[argc++] = word;
    argv[argc] = NULL;
    fflush(stdout);
    fflush(stderr);
    int saved_out = dup(1), saved_err = dup(2), null_fd = open("/dev/null", O_WRONLY);
    dup2(null_fd, 1);
    dup2(null_fd, 2);
    transformer_training = compute;
    int status = transformer_lab_main(argc, argv);
    transformer_training = &transformer_cpu_training;
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, 1);
    dup2(saved_err, 2);
    close(null_fd);
    close(saved_out);
    close(saved_err);
    return status;
}

// `train` through the companion, as ./transformer_cuda runs it: the same
// checkpoint as transformer.c's to the tolerance above, with sinusoids and with
// learned positions, and a run stopped at step 6 and resumed from its
// checkpoint ends exactly where the straight run does
static void test_companion_train_command(void) {
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/transformer_cuda_test_XXXXXX");
    if (!mkdtemp(dir)) {
        check(0, "companion: cannot make a temporary directory");
        return;
    }
    const char *run = "train --task copy --words 6 --min-length 2 --max-length 5 --train-size 120 "
                      "--valid-size 20 --layers 1 --d-model 16 --d-ff 32 --heads 2 --batch-tokens "
                      "60 --lr 0.01 --warmup 4 --eval-every 6 --log-every 0 --show 0 --threads 1";
    char command[1024];
    enum { CPU, GPU, RESUMED, CPU_LEARNED, GPU_LEARNED, RUNS };
    const char *names[RUNS] = { "cpu", "gpu", "resumed", "cpu_learned", "gpu_learned" };
    int status[RUNS + 1];
    snprintf(command, sizeof command, "%s --steps 12 --checkpoint %s/cpu.ckpt", run, dir);
    status[0] = run_command_quietly(&transformer_cpu_training, command);
    snprintf(command, sizeof command, "%s --steps 12 --checkpoint %s/gpu.ckpt", run, dir);
    status[1] = run_command_quietly(transformer_cuda_training(), command);
    snprintf(command, sizeof command, "%s --steps 6 --checkpoint %s/resumed.ckpt", run, dir);
    status[2] = run_command_quietly(transformer_cuda_training(), command);
    snprintf(command, sizeof command,
             "train --resume %s/resumed.ckpt --steps 12 --log-every 0 --show 0", dir);
    status[3] = run_command_quietly(transformer_cuda_training(), command);
    snprintf(command, sizeof command,
             "%s --positional learned --steps 12 --checkpoint %s/cpu_learned.ckpt", run, dir);
    status[4] = run_command_quietly(&transformer_cpu_training, command);
    snprintf(command, sizeof command,
             "%s --positional learned --steps 12 --checkpoint %s/gpu_learned.ckpt", run, dir);
    status[5] = run_command_quietly(transformer_cuda_training(), command);
    Transformer m[RUNS];
    Vocabulary v[RUNS];
    const char *error = NULL;
    int loaded = 0, ran = 1;
    for (int i = 0; i < RUNS + 1; i++) ran = ran && status[i] == 0;
    for (int i = 0; i < RUNS && !error; i++, loaded++) {
        char path[128];
        snprintf(path, sizeof path, "%s/%s.ckpt", dir, names[i]);
        LabCheckpoint c;
        error = lab_checkpoint_load(path, &c);
        if (!error) {   // (the model and its vocabulary; the merges and run let go)
            m[i] = c.model;
            v[i] = c.vocab;
            memset(&c.model, 0, sizeof c.model);
            memset(&c.vocab, 0, sizeof c.vocab);
            lab_checkpoint_free(&c);
        }
    }
    if (!error && ran) {
        unsigned char *skip = key_bias_skip_mask(&m[CPU]);
        double difference = scaled_difference(m[GPU].params_memory, m[CPU].params_memory,
                                              m[CPU].num_parameters, skip);
        size_t bytes = m[GPU].num_parameters * sizeof(real);
        int resumed_same = m[RESUMED].adam_step == 12 &&
                           memcmp(m[GPU].params_memory, m[RESUMED].params_memory, bytes) == 0 &&
                           memcmp(m[GPU].adam_v, m[RESUMED].adam_v, bytes) == 0;
        check(difference < COMPANION_TOL_UPDATES && m[GPU].adam_step == 12,
              "companion: train --task copy (12 steps) writes transformer.c's checkpoint "
              "(parameters within %.1e of the largest; tolerance %.0e)",
              difference, COMPANION_TOL_UPDATES);
        check(resumed_same, "companion: train stopped at step 6 and resumed (--resume) ends with "
                            "the straight run's parameters and Adam moments, bit for bit");
        free(skip);
        skip = key_bias_skip_mask(&m[CPU_LEARNED]);
        int learned = m[CPU_LEARNED].config.positional == POSITIONAL_LEARNED &&
                      m[GPU_LEARNED].config.positional == POSITIONAL_LEARNED &&
                      m[GPU_LEARNED].num_parameters == m[CPU_LEARNED].num_parameters &&
                      m[GPU_LEARNED].adam_step == 12;
        difference = learned ? scaled_difference(m[GPU_LEARNED].params_memory,
                                                 m[CPU_LEARNED].params_memory,
                                                 m[CPU_LEARNED].num_parameters, skip)
                             : INFINITY;
        size_t rows = (size_t)m[CPU_LEARNED].config.max_len * m[CPU_LEARNED].config.d_model;
        double positions = learned ? scaled_difference(m[GPU_LEARNED].params.position_embedding,
                                                       m[CPU_LEARNED].params.position_embedding,
                                                       rows, NULL)
                                   : INFINITY;
        check(difference < COMPANION_TOL_UPDATES && positions < COMPANION_TOL_UPDATES,
              "companion: train --positional learned (12 steps) writes transformer.c's checkpoint "
              "(parameters within %.1e of the largest, the position table within %.1e of its "
              "largest; tolerance %.0e)",
              difference, positions, COMPANION_TOL_UPDATES);
        free(skip);
    } else {
        check(0, "companion: train runs exit %d %d %d %d %d %d; checkpoint: %s", status[0],
              status[1], status[2], status[3], status[4], status[5], error ? error : "read");
    }
    for (int i = 0; i < loaded; i++) {
        transformer_free(&m[i]);
        vocab_free(&v[i]);
    }
    transformer_cuda_release();
    snprintf(command, sizeof command, "rm -rf %s", dir);
    if (system(command) != 0)
        printf("     (could not remove %s)\n", dir);
}

#ifndef COMPANION_ON_GPU
// ============================================================================
// The emulator (cuda_on_cpu.h) behaves as a GPU where it matters, and the
// faults a GPU would punish are caught: launches a GPU refuses, threads in
// another order at each launch, a barrier left out, a shuffle missing a lane,
// an index past shared memory, host code reading device memory, a cuBLAS
// operand outside its allocation; then the same faults put into the companion
// itself, and a racy +=
// ============================================================================

// The tests' own kernels
static __global__ void fill_kernel(float *x, float value, size_t n) {
    size_t i = ELEMENT_INDEX;
    if (i < n)
        x[i] = value;
}
CPU_KERNEL(fill_kernel, float *, float, size_t)

static void test_emulator_launch_checks(void) {
    float *x;
    cudaMalloc((void **)&x, 1024 * sizeof(float));
    struct {
        const char *what;
        unsigned grid, block;
        size_t shared;
        cudaError_t expected;
    } cases[] = {
        { "a grid of 0 blocks", 0, 32, 0, cudaErrorInvalidConfiguration },
        { "1025 threads per block", 1, 1025, 0, cudaErrorInvalidConfiguration },
        { "48 KB + 4 bytes of shared memory without opting in", 1, 32, 49156,
          cudaErrorInvalidValue },
        { "1024 threads and 48 KB of shared memory", 4, 1024, 49152, cudaSuccess },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        LAUNCH_KERNEL(fill_kernel, cases[i].grid, cases[i].block, cases[i].shared, x, 1.0f,
                      (size_t)1024);
        cudaError_t e = cudaGetLastError(), after = cudaGetLastError();
        check(e == cases[i].expected && after == cudaSuccess,
              "emulator: a launch with %s: %s (%s), as a GPU; cudaGetLastError clears it (%s)",
              cases[i].what, cudaGetErrorString(e), e ? cuda_on_cpu.message : "launched",
              cudaGetErrorString(after));
    }
    cudaError_t opt_in = cudaFuncSetAttribute(fill_kernel,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, 65536);
    LAUNCH_KERNEL(fill_kernel, 1, 32, 65536, x, 1.0f, (size_t)1024);
    cudaError_t within = cudaGetLastError();
    LAUNCH_KERNEL(fill_kernel, 1, 32, 65540, x, 1.0f, (size_t)1024);
    cudaError_t beyond = cudaGetLastError();
    cudaError_t too_much =
        cudaFuncSetAttribute(fill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 232449);
    check(opt_in == cudaSuccess && within == cudaSuccess && beyond == cudaErrorInvalidValue &&
          too_much == cudaErrorInvalidValue,
          "emulator: cudaFuncSetAttribute opts a kernel in to 64 KB of shared memory (%s), not 4 "
          "bytes more (%s), nor anyone beyond an H100's 227 KB (%s)",
          cudaGetErrorString(within), cudaGetErrorString(beyond), cudaGetErrorString(too_much));
    cudaFree(x);
}

// embedding_backward_kernel as it must not be: the threads of a block share
// out the token's positions and each adds its share straight into dE (+=,
// unsynchronised). On a GPU, adds are lost; here, each launch adds in another
// order and the rounding differs.
static __global__ void racy_embedding_backward_kernel(float *dembedding, const float *d_dec_x0,
                                                      const float *d_enc_x0, const int *token_ids,
                                                      const int *token_first, const int *rows,
                                                      const StepValues *step, Dropout dec_drop,
                                                      Dropout enc_drop, int BT, int C) {
    int k = blockIdx.x;
    if (k >= step->distinct_tokens)
        return;
    int token = token_ids[k], sharers = (int)blockDim.x / C, i = (int)threadIdx.x % C;
    int share = (int)threadIdx.x / C;
    if (share >= sharers)
        return;
    float sum = 0;
    for (int r = token_first[k] + share; r < token_first[k + 1]; r += sharers) {
        int row = rows[r];
        size_t at = row < BT ? (size_t)row * C + i : (size_t)(row - BT) * C + i;
        float g = row < BT ? d_dec_x0[at] * dropout_keep(dec_drop, at)
                           : d_enc_x0[at] * dropout_keep(enc_drop, at);
        sum += g * sqrtf((float)C);
    }
    dembedding[(size_t)token * C + i] += sum;
}
CPU_KERNEL(racy_embedding_backward_kernel, float *, const float *, const float *, const int *,
           const int *, const int *, const StepValues *, Dropout, Dropout, int, int)

// The companion's parameters and second moments after 3 training steps on
// `wide` (NULL: companion_batches, one each), with the thread order drawn from `seed`.
static real *companion_state_after_batch(uint64_t seed, Batch *wide) {
    TransformerConfig config = companion_config(POSITIONAL_SINUSOID);
    Transformer dev;
    transformer_build(&dev, &config, 5);
    TestBatch *batches = companion_batches();
    cpu_seed(seed);
    transformer_cuda_training()->begin(&dev);
    for (int step = 0; step < 3; step++) {
        dev.training = 1;
        transformer_cuda_training()->train_step(&dev, wide ? wide : &batches[step].batch, 4, 0.5);
    }
    transformer_cuda_training()->to_host(&dev);
    return companion_state_released(&dev);
}
static real *companion_state_after(uint64_t seed) {
    return companion_state_after_batch(seed, NULL);
}

// What one training step asks of the "GPU" with L layers and B sentences of
// 8 + 8 tokens, counted without computing (cuda_on_cpu.execute = 0): the
// third step's (the first allocates; the second captures the step's graph,
// unless graph_after is 0: no graphs).
static GpuCounts companion_step_counts(int layers, int B, int graph_after) {
    TransformerConfig config = companion_config(POSITIONAL_SINUSOID);
    config.n_layers = layers;
    Transformer dev;
    transformer_build(&dev, &config, 5);
    TestBatch batch;
    int lengths[64];
    for (int b = 0; b < B; b++) lengths[b] = 8;
    Rng rng;
    rng_seed(&rng, 3);
    make_test_batch(&batch, B, 8, 8, lengths, lengths, config.vocab_size, &rng);
    cuda_on_cpu.execute = 0;
    int saved = gpu_graph_after;
    gpu_graph_after = graph_after;
    transformer_cuda_training()->begin(&dev);
    for (int step = 0; step < 3; step++)
        transformer_cuda_training()->train_step(&dev, &batch.batch, 4, 0.5);
    GpuCounts counts = gpu.step_counts;
    transformer_cuda_release();
    gpu_graph_after = saved;
    cuda_on_cpu.execute = 1;
    transformer_free(&dev);
    return counts;
}

static void test_companion_counts(void) {
    GpuCounts base[2] = { companion_step_counts(6, 4, 0), companion_step_counts(6, 40, 0) };
    GpuCounts tiny = companion_step_counts(2, 40, 0);
    long base_calls = base[0].launches + base[0].gemms, tiny_calls = tiny.launches + tiny.gemms;
    check(base_calls <= 600 && base[1].launches == base[0].launches &&
          base[1].gemms == base[0].gemms && base[0].allocations == 0 &&
          base[1].allocations == 0 && base[0].memsets == 0 &&
          base[0].host_calls ==
              base_calls + base[0].copies + 1 + 2 * (base[0].forks + base[0].joins),
          "companion without graphs: a 6-layer training step is %ld kernel launches and %ld cuBLAS "
          "calls (at most 600 in all), the same for 4 and 40 sentences, no allocation and no "
          "memset after the first step; %ld calls from the host (each launch and call, %ld copies, "
          "one wait, an event recorded and waited for at each of %ld forks and %ld joins of the "
          "two streams)",
          base[0].launches, base[0].gemms, base[0].host_calls, base[0].copies, base[0].forks,
          base[0].joins);
    check(tiny_calls <= 250,
          "companion without graphs: a 2-layer training step is %ld launches and cuBLAS calls (at "
          "most 250)",
          tiny_calls);
    GpuCounts graphed[2] = { companion_step_counts(6, 4, 2), companion_step_counts(6, 40, 2) };
    GpuCounts first_sight = companion_step_counts(2, 40, 1);
    int same_work = 1;
    for (int i = 0; i < 2; i++)
        same_work &= graphed[i].launches == base[i].launches && graphed[i].gemms == base[i].gemms &&
                     graphed[i].copies == base[i].copies && graphed[i].graph_launches == 1 &&
                     graphed[i].host_calls == 4 && graphed[i].allocations == 0;
    check(same_work && first_sight.graph_launches == 1 && first_sight.host_calls == 4,
          "companion with graphs: a 6-layer training step is one CUDA graph launch holding the "
          "same %ld kernels and %ld cuBLAS calls, for 4 and 40 sentences; the host makes %ld calls "
          "(the upload, the launch, the loss, the wait), whether the graph was captured at a "
          "shape's first step or its second",
          graphed[0].launches, graphed[0].gemms, graphed[0].host_calls);
    // the two streams: every weight's gradient product on the second (6 layers: the encoder's 4 a
    // layer, the decoder's 6, the memory's keys and values, the output layer), each after a fork;
    // the layer norms' sums stay in their row kernels on the main stream, but where a norm's chunks
    // are many (here forced: gpu_norm_sums_in_kernel 0) the kernel that adds them (2 and 3 a layer)
    // goes to the second stream, after a fork of its own; the joins: before each layer norm's
    // backward but the first (the second stream has only the output layer's product then, which
    // reads nothing the norm writes), and before the embedding's gradient
    transformer_cuda_one_stream(1);
    GpuCounts one = companion_step_counts(6, 4, 2);
    transformer_cuda_one_stream(0);
    size_t norm_sums = gpu_norm_sums_in_kernel;
    gpu_norm_sums_in_kernel = 0;
    GpuCounts apart = companion_step_counts(6, 4, 2);
    gpu_norm_sums_in_kernel = norm_sums;
    const GpuCounts *two = &graphed[0];
    long in_graph_copies = two->copies - 2;   // (the upload and the loss are outside the graph)
    int norms = 6 * 2 + 6 * 3;
    check(two->side_gemms == 6 * 4 + 6 * 6 + 2 && two->side_launches == 0 && two->forks == 62 &&
          two->joins == norms - 1 + 1 &&
          two->graph_nodes == two->launches + two->gemms + in_graph_copies &&
          two->graph_edges > two->graph_nodes && one.side_gemms == 0 &&
          one.side_launches == 0 && one.forks == 0 && one.graph_nodes == two->graph_nodes &&
          one.graph_edges == one.graph_nodes - 1 && one.launches == two->launches &&
          one.gemms == two->gemms,
          "companion with two streams: of a 6-layer step's %ld graph nodes, the second stream's "
          "are %ld cuBLAS calls (the weights' gradients) and %ld kernels (the layer norms' sums "
          "stay in their row kernels), after %ld forks, with %ld joins back; the graph's "
          "dependencies %ld (with --one-stream: the same nodes in a chain of %ld)",
          two->graph_nodes, two->side_gemms, two->side_launches, two->forks, two->joins,
          two->graph_edges, one.graph_edges);
    check(apart.side_gemms == two->side_gemms && apart.side_launches == norms &&
          apart.forks == 62 + norms && apart.joins == two->joins &&
          apart.launches == two->launches + norms && apart.gemms == two->gemms,
          "companion with two streams, the norms' chunks many: the second stream also gets the %ld "
          "kernels that add the layer norms' sums (layernorm_params_backward_kernel), after %ld "
          "forks in all, with the same %ld joins",
          apart.side_launches, apart.forks, apart.joins);
}
// --profile (./transformer_cuda bench --profile): every call of the steps after
// the first is timed under its name, and the names' calls add up to what the
// step asked of the GPU (--count's launches, cuBLAS calls and copies)
static void test_companion_profile(void) {
    memset(&gpu_profile, 0, sizeof gpu_profile);
    gpu_profile.requested = 1;
    GpuCounts counts = companion_step_counts(2, 4, 0);
    long calls = 0, per_step = counts.launches + counts.gemms + counts.copies;
    int whole_steps = 1, named = 0;
    for (int i = 0; i < gpu_profile.count; i++) {
        const ProfileEntry *e = &gpu_profile.entries[i];
        calls += e->calls;
        whole_steps &= e->calls % 2 == 0 && e->seconds >= 0;
        named += strcmp(e->name, "cross_entropy_kernel") == 0 ||
                 strcmp(e->name, "adam_kernel") == 0 ||
                 strncmp(e->name, "cuBLAS sgemm m=", 15) == 0;
    }
    check(gpu_profile.steps == 2 && !gpu_profile.on && calls == 2 * per_step && whole_steps &&
          named >= 3,
          "companion --profile: of 3 steps, the last %ld timed call by call under %d names "
          "(kernels, product shapes, copies): %ld calls, 2 x the %ld launches, cuBLAS calls and "
          "copies --count gives a step",
          gpu_profile.steps, gpu_profile.count, calls, per_step);
    memset(&gpu_profile, 0, sizeof gpu_profile);
}
#ifndef CUDA_ON_CPU_THREADS   // the fibers of make test only: faults caught, thread orders drawn
// Each thread writes down its place in the block's order; it never waits, so
// it runs whole, and the order is the one the emulator drew.
static __global__ void thread_order_kernel(int *order, int *next) {
    order[(*next)++] = (int)threadIdx.x;
}
CPU_KERNEL(thread_order_kernel, int *, int *)

// block_sum (shuffles, then a barrier and shared memory) of x[0..n), one block
static __global__ void block_total_kernel(float *total, const float *x, int n) {
    SHARED_FLOATS(shared);
    float v = block_sum((int)threadIdx.x < n ? x[threadIdx.x] : 0.0f, shared);
    if (threadIdx.x == 0)
        *total = v;
}
CPU_KERNEL(block_total_kernel, float *, const float *, int)

// Half of each warp returns before a shuffle that names every lane.
static __global__ void half_warp_shuffle_kernel(float *x) {
    if (threadIdx.x % WARP >= WARP / 2)
        return;
    x[threadIdx.x] = __shfl_xor_sync(FULL_WARP, 1.0f, 1);
}
CPU_KERNEL(half_warp_shuffle_kernel, float *)

// What cpu_catches_fault runs
static float *emulator_device_floats;
static void read_device_memory(void *unused) {
    (void)unused;
    volatile float v = *emulator_device_floats;   // host code reading device memory, as
                                                  // `loss = *gpu.loss` would
    (void)v;
}
static void read_after_stream_work(void *unused) {
    (void)unused;
    cudaStream_t stream;   // not the legacy stream: its work waits, pending, until the wait below
    cudaStreamCreate(&stream);
    cudaMemsetAsync(emulator_device_floats, 0, 4 * sizeof(float), stream);
    cudaMemsetAsync(emulator_device_floats + 4, 0, 4 * sizeof(float), stream);
    cudaStreamSynchronize(stream);   // the pending work ran with memory held open, then closed it
    cudaStreamDestroy(stream);
    volatile float v = *emulator_device_floats;
    (void)v;
}
static void launch_block_total_short(void *unused) {
    (void)unused;
    cpu_test_faults.shared_memory_short = "block_total_kernel";
    LAUNCH_KERNEL(block_total_kernel, 1, 128, 4 * sizeof(float), emulator_device_floats,
                  emulator_device_floats, 128);
    cudaStreamSynchronize(gpu_stream);   // (a GPU reports a kernel's fault at the next wait)
}
static void launch_half_warp_shuffle(void *unused) {
    (void)unused;
    LAUNCH_KERNEL(half_warp_shuffle_kernel, 1, 64, 0, emulator_device_floats);
    cudaStreamSynchronize(gpu_stream);   // (a GPU reports a kernel's fault at the next wait)
}

static void test_emulator_threads(void) {
    int *order, *next, zero = 0, seen[2][128];
    cudaMalloc((void **)&order, sizeof seen[0]);
    cudaMalloc((void **)&next, sizeof(int));
    for (int launch = 0; launch < 2; launch++) {
        cudaMemcpy(next, &zero, sizeof(int), cudaMemcpyHostToDevice);
        LAUNCH_KERNEL(thread_order_kernel, 1, 128, 0, order, next);
        cudaMemcpy(seen[launch], order, sizeof seen[launch], cudaMemcpyDeviceToHost);
    }
    int in_order = 1, same = 1, all[128] = { 0 }, permutation = 1;
    for (int i = 0; i < 128; i++) {
        in_order &= seen[0][i] == i;
        same &= seen[0][i] == seen[1][i];
        if (seen[0][i] >= 0 && seen[0][i] < 128)
            all[seen[0][i]]++;
    }
    for (int i = 0; i < 128; i++) permutation &= all[i] == 1;
    check(permutation && !in_order && !same,
          "emulator: a block's 128 threads each ran once, in a random order (first %d %d %d ...) "
          "and in another at the next launch (%d %d %d ...)",
          seen[0][0], seen[0][1], seen[0][2], seen[1][0], seen[1][1], seen[1][2]);
    cudaFree(order);
    cudaFree(next);

    float host[128], total[2], *x;
    double expected = 0;
    for (int i = 0; i < 128; i++) {
        host[i] = (float)(i % 9) - 3.5f;
        expected += host[i];
    }
    cudaMalloc((void **)&x, sizeof host + sizeof(float));
    cudaMemcpy(x, host, sizeof host, cudaMemcpyHostToDevice);
    for (int barriers = 1; barriers >= 0; barriers--) {
        cpu_test_faults.barriers_skipped = barriers ? NULL : "block_total_kernel";
        LAUNCH_KERNEL(block_total_kernel, 1, 128, 4 * sizeof(float), x + 128, x, 128);
        cudaMemcpy(&total[barriers], x + 128, sizeof(float), cudaMemcpyDeviceToHost);
    }
    cpu_test_faults.barriers_skipped = NULL;
    check(total[1] == (float)expected && !(total[0] == (float)expected),
          "emulator: a block's sum through shuffles, shared memory and __syncthreads is right (%g, "
          "expected %g); with its barriers left out the warps read shared memory before it is "
          "written: %g",
          total[1], expected, total[0]);
    cudaFree(x);
}

// What a GPU punishes, caught: host code reading device memory, an index past
// shared memory, a shuffle missing lanes, a cuBLAS operand past its allocation
static void test_emulator_faults(void) {
    float *x;
    cudaMalloc((void **)&x, 129 * sizeof(float));
    emulator_device_floats = x;
    int caught = cpu_catches_fault(read_device_memory, NULL);
    check(caught && strstr(cuda_on_cpu.message, "host code read"),
          "emulator: host code reading device memory is caught (%s)",
          caught ? cuda_on_cpu.message : "not caught");
    caught = cpu_catches_fault(read_after_stream_work, NULL);
    check(caught && strstr(cuda_on_cpu.message, "host code read"),
          "emulator: host code reading device memory after a stream's work has run is caught (%s)",
          caught ? cuda_on_cpu.message : "not caught");
    caught = cpu_catches_fault(launch_block_total_short, NULL);
    cpu_test_faults.shared_memory_short = NULL;
    check(caught && strstr(cuda_on_cpu.message, "shared memory index out of bounds"),
          "emulator: an index past a block's shared memory (given 16 bytes less than the kernel "
          "uses) is caught (%s)",
          caught ? cuda_on_cpu.message : "not caught");
    caught = cpu_catches_fault(launch_half_warp_shuffle, NULL);
    check(caught && strstr(cuda_on_cpu.message, "returned"),
          "emulator: a shuffle whose warp has lost half its lanes is caught (%s)",
          caught ? cuda_on_cpu.message : "not caught");
    cublasHandle_t handle;
    cublasCreate(&handle);
    float one = 1, nothing = 0;
    cublasStatus_t beyond = cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, x, 8,
                                        x + 72, 8, &nothing, x, 8);   // B's 64 floats start 57
                                                                      // before the end of x's 129
    cublasDestroy(handle);
    check(beyond == CUBLAS_STATUS_EXECUTION_FAILED && strstr(cuda_on_cpu.message, "outside"),
          "emulator: a cuBLAS operand that reaches past its allocation is refused (%s)",
          cuda_on_cpu.message);
    cudaFree(x);
}

// ---- what the audit of the emulator found (issue 33): each once ran with "no error" ----

// Thread 0 writes (or reads) element n of x: one past the end of a tensor of n floats
static __global__ void write_past_kernel(float *x, size_t n) {
    if (threadIdx.x == 0)
        x[n] = 1.0f;
}
CPU_KERNEL(write_past_kernel, float *, size_t)
static __global__ void read_past_kernel(float *out, const float *x, size_t n) {
    if (threadIdx.x == 0)
        *out = x[n];
}
CPU_KERNEL(read_past_kernel, float *, const float *, size_t)

// Thread 0 writes below the block's shared memory: s[-3]
static __global__ void shared_underflow_kernel(float *out) {
    SHARED_FLOATS(s);
    s[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    if (threadIdx.x == 0)
        s[-3] = 2.0f;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x];
}
CPU_KERNEL(shared_underflow_kernel, float *)

// The first warp waits at one __syncthreads, the second at another: on a GPU
// the two are different barriers (undefined: a hang or a wrong result)
static __global__ void divergent_barrier_kernel(float *x) {
    SHARED_FLOATS(s);
    s[threadIdx.x] = 1.0f;
    if (threadIdx.x < WARP)
        __syncthreads();
    else
        __syncthreads();
    x[threadIdx.x] = s[(threadIdx.x + WARP) % blockDim.x];
}
CPU_KERNEL(divergent_barrier_kernel, float *)

// A training step's activations on the "GPU", carved from one allocation: a
// kernel writes or reads one float past one of them (the first encoder layer's
// layer-norm means, B*S floats), into its neighbour
static Transformer audit_model;
static float *audit_out;
static void audit_model_step(void) {
    TransformerConfig config = companion_config(POSITIONAL_SINUSOID);
    transformer_build(&audit_model, &config, 5);
    audit_model.training = 1;
    transformer_cuda_training()->begin(&audit_model);
    transformer_cuda_training()->train_step(&audit_model, &companion_batches()[0].batch, 4, 0.5);
}
static void launch_write_past_tensor(void *unused) {
    (void)unused;
    size_t n = (size_t)gpu.B * gpu.S;
    LAUNCH_KERNEL(write_past_kernel, 1, 32, 0, gpu.enc[0].ln1_mean, n);
    cudaStreamSynchronize(gpu_stream);   // (a GPU reports a kernel's fault at the next wait)
}
static void launch_read_past_tensor(void *unused) {
    (void)unused;
    size_t n = (size_t)gpu.B * gpu.S;
    LAUNCH_KERNEL(read_past_kernel, 1, 32, 0, audit_out, gpu.enc[0].ln1_mean, n);
    cudaStreamSynchronize(gpu_stream);   // (a GPU reports a kernel's fault at the next wait)
}
static void launch_shared_underflow(void *unused) {
    (void)unused;
    LAUNCH_KERNEL(shared_underflow_kernel, 1, 64, 64 * sizeof(float), emulator_device_floats);
    cudaStreamSynchronize(gpu_stream);   // (a GPU reports a kernel's fault at the next wait)
}
static void launch_divergent_barrier(void *unused) {
    (void)unused;
    LAUNCH_KERNEL(divergent_barrier_kernel, 1, 64, 64 * sizeof(float), emulator_device_floats);
    cudaStreamSynchronize(gpu_stream);   // (a GPU reports a kernel's fault at the next wait)
}

static void test_emulator_audit(void) {
    float *x;
    cudaMalloc((void **)&x, 129 * sizeof(float));
    emulator_device_floats = x;
    audit_model_step();
    audit_out = x + 128;
    int caught = cpu_catches_fault(launch_write_past_tensor, NULL);
    check(caught && strstr(cuda_on_cpu.message, "enc.ln1_mean"),
          "emulator: a write one float past a tensor of the companion's activations "
          "(enc[0].ln1_mean), inside their one allocation, is caught (%s)",
          caught ? cuda_on_cpu.message : "not caught");
    caught = cpu_catches_fault(launch_read_past_tensor, NULL);
    check(caught && strstr(cuda_on_cpu.message, "enc.ln1_mean"),
          "emulator: a read one float past a tensor of the companion's activations is caught (%s)",
          caught ? cuda_on_cpu.message : "not caught");
    transformer_free(&audit_model);
    transformer_cuda_release();
    caught = cpu_catches_fault(launch_shared_underflow, NULL);
    check(caught && strstr(cuda_on_cpu.message, "below"),
          "emulator: a write below a block's shared memory (s[-3]) is caught (%s)",
          caught ? cuda_on_cpu.message : "not caught");
    caught = cpu_catches_fault(launch_divergent_barrier, NULL);
    check(caught && strstr(cuda_on_cpu.message, "__syncthreads"),
          "emulator: two warps of a block waiting at two different __syncthreads is caught (%s)",
          caught ? cuda_on_cpu.message : "not caught");
    cudaFree(x);
}

// ---- warp exchanges with masks, and __syncwarp -------------------------------------

// Each half of each warp sums its 16 lanes' values with shuffles that name that half only
static __global__ void half_warp_sums_kernel(float *out, const float *x) {
    unsigned lane = threadIdx.x % WARP, half = lane < 16 ? 0x0000ffffu : 0xffff0000u;
    float v = x[threadIdx.x];
    for (int offset = 8; offset > 0; offset /= 2) v += __shfl_xor_sync(half, v, offset);
    out[threadIdx.x] = v;
}
CPU_KERNEL(half_warp_sums_kernel, float *, const float *)

// A block of 48 threads: its second warp has 16 lanes, and its shuffles name those (mask 0xffff),
// or, when `whole` is set, all 32 lanes
static __global__ void short_warp_sum_kernel(float *out, int whole) {
    unsigned lanes = threadIdx.x < WARP ? FULL_WARP : whole ? FULL_WARP : 0x0000ffffu;
    float v = (float)threadIdx.x;
    for (int offset = threadIdx.x < WARP ? 16 : 8; offset > 0; offset /= 2)
        v += __shfl_xor_sync(lanes, v, offset);
    out[threadIdx.x] = v;
}
CPU_KERNEL(short_warp_sum_kernel, float *, int)

// Each lane writes its place in shared memory, waits at __syncwarp, and reads its neighbour's
static __global__ void syncwarp_kernel(float *out) {
    SHARED_FLOATS(s);
    s[threadIdx.x] = (float)threadIdx.x;
    __syncwarp(FULL_WARP);
    out[threadIdx.x] = s[threadIdx.x ^ 1];
}
CPU_KERNEL(syncwarp_kernel, float *)

// Lanes 0 to 15 read lane 20, outside their mask (undefined on a GPU: NaN here)
static __global__ void outside_mask_kernel(float *out) {
    if (threadIdx.x >= 16)
        return;
    out[threadIdx.x] = __shfl_sync(0x0000ffffu, 1.0f, 20);
}
CPU_KERNEL(outside_mask_kernel, float *)

// Lanes 0 and 1 shuffle with mask 0x3, lane 2 with mask 0x7, which names them too
static __global__ void mismatched_masks_kernel(float *out) {
    unsigned lane = threadIdx.x % WARP;
    if (lane < 2)
        out[threadIdx.x] = __shfl_xor_sync(0x3u, 1.0f, 1);
    else if (lane == 2)
        out[threadIdx.x] = __shfl_xor_sync(0x7u, 1.0f, 1);
}
CPU_KERNEL(mismatched_masks_kernel, float *)

static void launch_short_warp_whole_mask(void *unused) {
    (void)unused;
    LAUNCH_KERNEL(short_warp_sum_kernel, 1, 48, 0, emulator_device_floats, 1);
    cudaStreamSynchronize(gpu_stream);   // (a GPU reports a kernel's fault at the next wait)
}
static void launch_mismatched_masks(void *unused) {
    (void)unused;
    LAUNCH_KERNEL(mismatched_masks_kernel, 1, 32, 0, emulator_device_floats);
    cudaStreamSynchronize(gpu_stream);   // (a GPU reports a kernel's fault at the next wait)
}

static void test_emulator_warps(void) {
    float host[64], out[64], *x, *y;
    cudaMalloc((void **)&x, sizeof host);
    cudaMalloc((void **)&y, sizeof host);
    emulator_device_floats = y;
    for (int i = 0; i < 64; i++) host[i] = (float)(i * 7 % 13);
    cudaMemcpy(x, host, sizeof host, cudaMemcpyHostToDevice);
    LAUNCH_KERNEL(half_warp_sums_kernel, 1, 64, 0, y, x);
    cudaError_t e = cudaGetLastError();
    cudaMemcpy(out, y, sizeof out, cudaMemcpyDeviceToHost);
    int right = e == cudaSuccess;
    for (int i = 0; i < 64; i++) {
        float half = 0;
        for (int j = i / 16 * 16; j < i / 16 * 16 + 16; j++) half += host[j];
        right &= out[i] == half;
    }
    check(right,
          "emulator: two groups of 16 lanes in each warp shuffle apart (masks 0xffff and "
          "0xffff0000), each summing its own (%s)",
          e ? cuda_on_cpu.message : "the sums are right");
    LAUNCH_KERNEL(short_warp_sum_kernel, 1, 48, 0, y, 0);
    e = cudaGetLastError();
    cudaMemcpy(out, y, sizeof out, cudaMemcpyDeviceToHost);
    check(e == cudaSuccess && out[0] == 496 && out[47] == 32 * 16 + 120,
          "emulator: a block of 48 threads: its second warp's 16 lanes shuffle with mask 0xffff "
          "(sums %g and %g, expected 496 and 632)",
          out[0], out[47]);
    int caught = cpu_catches_fault(launch_short_warp_whole_mask, NULL);
    check(caught && strstr(cuda_on_cpu.message, "past the block's last thread"),
          "emulator: a shuffle whose mask names lanes a 48-thread block does not have is caught "
          "(%s)",
          caught ? cuda_on_cpu.message : "not caught");
    for (int skipped = 0; skipped < 2; skipped++) {
        cpu_test_faults.barriers_skipped = skipped ? "syncwarp_kernel" : NULL;
        LAUNCH_KERNEL(syncwarp_kernel, 1, 64, 64 * sizeof(float), y);
        e = cudaGetLastError();
        cudaMemcpy(out, y, sizeof out, cudaMemcpyDeviceToHost);
        int neighbours = e == cudaSuccess, nans = 0;
        for (int i = 0; i < 64; i++) {
            neighbours &= out[i] == (float)(i ^ 1);
            nans += isnan(out[i]);
        }
        if (!skipped)
            check(neighbours,
                  "emulator: __syncwarp: each lane reads what its neighbour wrote before it");
        else
            check(nans > 0,
                  "emulator: without its __syncwarp, %d of 64 lanes read their neighbour's shared "
                  "memory before it was written (NaN)",
                  nans);
    }
    cpu_test_faults.barriers_skipped = NULL;
    LAUNCH_KERNEL(outside_mask_kernel, 1, 32, 0, y);
    e = cudaGetLastError();
    cudaMemcpy(out, y, sizeof out, cudaMemcpyDeviceToHost);
    int all_nan = e == cudaSuccess;
    for (int i = 0; i < 16; i++) all_nan &= isnan(out[i]);
    check(all_nan, "emulator: a lane that reads a lane outside its shuffle's mask reads NaN "
                   "(undefined on a GPU)");
    caught = cpu_catches_fault(launch_mismatched_masks, NULL);
    check(caught,
          "emulator: lanes of a warp at shuffles whose masks share lanes but differ (0x3 and 0x7) "
          "are caught (%s)",
          caught ? cuda_on_cpu.message : "not caught");
    cudaFree(x);
    cudaFree(y);
}

// ---- CUDA graphs: capture, then replay ------------------------------------------------

static __global__ void scale_kernel(float *x, float factor, size_t n) {
    size_t i = ELEMENT_INDEX;
    if (i < n)
        x[i] *= factor;
}
CPU_KERNEL(scale_kernel, float *, float, size_t)

// What cpu_catches_fault runs: a graph launched after the memory it works on was freed
static cudaGraphExec_t freed_graph;
static void launch_freed_graph(void *unused) {
    (void)unused;
    if (cudaGraphLaunch(freed_graph, NULL) == cudaSuccess)
        return;
    char why[sizeof cuda_on_cpu.message];
    snprintf(why, sizeof why, "%s", cuda_on_cpu.message);
    cpu_fault(cudaErrorIllegalAddress, "cudaGraphLaunch: %s", why);
}

// A copy from page-locked memory, a launch and a cuBLAS call, captured: nothing
// runs until the graph does, which then uses the launch's arguments and cuBLAS's
// alpha as they were at the capture, and the host memory as it is at the launch
static void test_emulator_graph_replay(cudaStream_t stream, cublasHandle_t handle) {
    float *x, *host_pinned, got[4];
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaMalloc((void **)&x, 8 * sizeof(float));
    cudaMallocHost((void **)&host_pinned, 4 * sizeof(float));
    for (int i = 0; i < 4; i++) host_pinned[i] = (float)(i + 1);
    float alpha = 2.0f, zero = 0.0f, factor = 3.0f;
    cudaError_t begun = cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
    cudaMemcpyAsync(x, host_pinned, 4 * sizeof(float), cudaMemcpyHostToDevice, stream);
    LAUNCH_KERNEL(scale_kernel, 1, 32, 0, x, factor, (size_t)4);
    cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, 4, 1, 1, &alpha, x, 4, x, 1, &zero,
                x + 4, 4);   // x[4..8) = alpha x[0..4) x[0]
    cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    factor = 5.0f;
    alpha = 7.0f;   // the graph keeps what they were
    for (int i = 0; i < 4; i++)
        host_pinned[i] = (float)(10 * (i + 1));   // the graph reads this when it runs
    cudaError_t launched = cudaGraphLaunch(exec, stream);
    cudaMemcpy(got, x + 4, sizeof got, cudaMemcpyDeviceToHost);
    int replayed = 1;
    for (int i = 0; i < 4; i++) replayed &= got[i] == 2.0f * (30.0f * (i + 1)) * 30.0f;
    check(!begun && !ended && !instantiated && !launched && replayed,
          "emulator: a captured graph (a copy from page-locked memory, a launch, a cuBLAS call) "
          "runs only when launched, with the kernel's arguments and cuBLAS's alpha as they were at "
          "the capture and the host memory as it is at the launch (%g %g %g %g)",
          got[0], got[1], got[2], got[3]);
    cudaFree(x);   // the graph's memory: its next launch must fault
    freed_graph = exec;
    int caught = cpu_catches_fault(launch_freed_graph, NULL);
    check(caught && strstr(cuda_on_cpu.message, "outside"),
          "emulator: a graph launched after its memory was freed is caught (%s)",
          caught ? cuda_on_cpu.message : "not caught");
    cudaGraphExecDestroy(exec);
    cudaFreeHost(host_pinned);
}

// What a capture forbids, each refused and spoiling it
static void test_emulator_graph_refusals(cudaStream_t stream) {
    const char *what[4] = { "a blocking cudaMemcpy", "a launch on the legacy stream",
                            "an asynchronous copy of pageable host memory",
                            "cudaStreamSynchronize" };
    float *x, pageable[4] = { 5, 6, 7, 8 }, got[4];
    cudaMalloc((void **)&x, 4 * sizeof(float));
    for (int r = 0; r < 4; r++) {
        cudaGraph_t graph;
        cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
        cudaError_t e = cudaSuccess;
        if (r == 0)
            e = cudaMemcpy(got, x, sizeof got, cudaMemcpyDeviceToHost);
        if (r == 1) {
            gpu_stream = NULL;
            LAUNCH_KERNEL(scale_kernel, 1, 32, 0, x, 1.0f, (size_t)4);
            gpu_stream = stream;
            e = cudaGetLastError();
        }
        if (r == 2)
            e = cudaMemcpyAsync(x, pageable, sizeof pageable, cudaMemcpyHostToDevice, stream);
        if (r == 3)
            e = cudaStreamSynchronize(stream);
        cudaError_t ended = cudaStreamEndCapture(stream, &graph);
        check(e != cudaSuccess && ended == cudaErrorStreamCaptureInvalidated && graph == NULL,
              "emulator: %s during a capture is refused (%s) and the capture fails (%s)", what[r],
              cudaGetErrorString(e), cudaGetErrorString(ended));
    }
    cudaFree(x);
}

static void test_emulator_graphs(void) {
    cudaStream_t stream, saved = gpu_stream;
    cudaStreamCreate(&stream);
    cublasHandle_t handle;
    cublasCreate(&handle);
    cublasSetStream(handle, stream);
    gpu_stream = stream;   // LAUNCH_KERNEL's
    test_emulator_graph_replay(stream, handle);
    test_emulator_graph_refusals(stream);
    gpu_stream = saved;
    cublasDestroy(handle);
    cudaStreamDestroy(stream);
}

// ---- two streams: events, forks and joins, with and without a graph ------------------

// y = factor x, elementwise
static __global__ void scaled_copy_kernel(float *y, const float *x, float factor, size_t n) {
    size_t i = ELEMENT_INDEX;
    if (i < n)
        y[i] = factor * x[i];
}
CPU_KERNEL(scaled_copy_kernel, float *, const float *, float, size_t)
// One thread writes `id` at the log's next place: the order in which kernels ran
static __global__ void log_kernel(int *log, int *next, int id) {
    if (threadIdx.x == 0)
        log[(*next)++] = id;
}
CPU_KERNEL(log_kernel, int *, int *, int)

// What test_emulator_streams runs on two streams (main and side), captured or not:
//   main: x = 1, then the fork (the side waits for main's event);
//   side: y = 2x, log "side";   main: z = 3x, log "main";
//   the join (main waits for the side's event), then main: x = 5 and w = y.
// overwrite_early: main's x = 5 comes before the join, while the side may still read x (a missing
// wait).
typedef struct {
    float *x, *y, *z, *w;
    int *log, *next;
    cudaStream_t main, side;
    cudaEvent_t fork, join;
} TwoStreams;
enum { TWO_STREAMS_N = 64 };
static void two_streams_work(const TwoStreams *t, int overwrite_early) {
    size_t n = TWO_STREAMS_N;
    gpu_stream = t->main;
    LAUNCH_KERNEL(fill_kernel, 1, 64, 0, t->x, 1.0f, n);
    cudaEventRecord(t->fork, t->main);
    cudaStreamWaitEvent(t->side, t->fork, 0);
    gpu_stream = t->side;
    LAUNCH_KERNEL(scaled_copy_kernel, 1, 64, 0, t->y, t->x, 2.0f, n);
    LAUNCH_KERNEL(log_kernel, 1, 32, 0, t->log, t->next, 2);
    gpu_stream = t->main;
    LAUNCH_KERNEL(scaled_copy_kernel, 1, 64, 0, t->z, t->x, 3.0f, n);
    LAUNCH_KERNEL(log_kernel, 1, 32, 0, t->log, t->next, 1);
    if (overwrite_early)
        LAUNCH_KERNEL(fill_kernel, 1, 64, 0, t->x, 5.0f, n);
    cudaEventRecord(t->join, t->side);
    cudaStreamWaitEvent(t->main, t->join, 0);
    if (!overwrite_early)
        LAUNCH_KERNEL(fill_kernel, 1, 64, 0, t->x, 5.0f, n);
    LAUNCH_KERNEL(scaled_copy_kernel, 1, 64, 0, t->w, t->y, 1.0f, n);
}

// After one run: whether y, z, w, x hold 2, 3, 2, 5 everywhere (*right), and
// whether the side's log came first (*side_first); the log's counter reset.
static void two_streams_read(const TwoStreams *t, int *right, int *side_first) {
    float got[4][TWO_STREAMS_N];
    int log[2], zero = 0;
    const float *from[4] = { t->y, t->z, t->w, t->x }, want[4] = { 2, 3, 2, 5 };
    for (int v = 0; v < 4; v++) cudaMemcpy(got[v], from[v], sizeof got[v], cudaMemcpyDeviceToHost);
    cudaMemcpy(log, t->log, sizeof log, cudaMemcpyDeviceToHost);
    cudaMemcpy(t->next, &zero, sizeof zero, cudaMemcpyHostToDevice);
    *right = 1;
    for (int v = 0; v < 4; v++)
        for (int i = 0; i < TWO_STREAMS_N; i++) *right &= got[v][i] == want[v];
    *side_first = log[0] == 2;
}

// The same work `runs` times, each replayed from a graph captured once (graph
// 1) or given to the streams anew (0): in how many runs the numbers were
// right, and the side's kernel ran first; -1: the capture failed.
static int two_streams_runs(TwoStreams *t, int graph, int overwrite_early, int runs,
                            int *side_first) {
    cudaGraphExec_t exec = NULL;
    *side_first = 0;
    if (graph) {
        cudaGraph_t g;
        cudaStreamBeginCapture(t->main, cudaStreamCaptureModeGlobal);
        two_streams_work(t, overwrite_early);
        if (cudaStreamEndCapture(t->main, &g) != cudaSuccess)
            return -1;
        cudaGraphInstantiate(&exec, g, 0);
        cudaGraphDestroy(g);
    }
    int right_runs = 0;
    for (int r = 0; r < runs; r++) {
        if (graph)
            cudaGraphLaunch(exec, t->main);
        else
            two_streams_work(t, overwrite_early);
        cudaStreamSynchronize(t->main);
        int right, first;
        two_streams_read(t, &right, &first);
        right_runs += right;
        *side_first += first;
    }
    if (exec)
        cudaGraphExecDestroy(exec);
    return right_runs;
}

static void test_emulator_streams(void) {
    TwoStreams t;
    cudaStream_t saved = gpu_stream, stray;
    float *memory;
    cudaMalloc((void **)&memory, 4 * TWO_STREAMS_N * sizeof(float));
    cudaMalloc((void **)&t.log, 2 * sizeof(int));
    cudaMalloc((void **)&t.next, sizeof(int));
    t.x = memory;
    t.y = t.x + TWO_STREAMS_N;
    t.z = t.y + TWO_STREAMS_N;
    t.w = t.z + TWO_STREAMS_N;
    cudaMemset(t.next, 0, sizeof(int));
    cudaStreamCreate(&t.main);
    cudaStreamCreate(&t.side);
    cudaStreamCreate(&stray);
    cudaEventCreateWithFlags(&t.fork, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&t.join, cudaEventDisableTiming);
    enum { RUNS = 12 };
    for (int graph = 1; graph >= 0; graph--) {
        const char *how = graph ? "a graph with a fork and a join, replayed"
                                : "two streams with events, run";
        int side_first, right = two_streams_runs(&t, graph, 0, RUNS, &side_first);
        check(right == RUNS && side_first > 0 && side_first < RUNS,
              "emulator: %s %d times: the right numbers every time (%d), the two branches in "
              "another order from run to run (the side's first in %d)",
              how, RUNS, right, side_first);
        right = two_streams_runs(&t, graph, 1, RUNS, &side_first);
        check(right >= 0 && right < RUNS,
              "emulator: %s %d times, the main stream overwriting what the side stream reads "
              "before it waits for it (a missing wait): wrong numbers in %d of the runs",
              how, RUNS, RUNS - right);
    }
    // a fork never joined back: refused at the capture's end, as on a GPU
    cudaGraph_t g;
    cudaStreamBeginCapture(t.main, cudaStreamCaptureModeGlobal);
    gpu_stream = t.main;
    LAUNCH_KERNEL(fill_kernel, 1, 64, 0, t.x, 1.0f, (size_t)TWO_STREAMS_N);
    cudaEventRecord(t.fork, t.main);
    cudaStreamWaitEvent(t.side, t.fork, 0);
    gpu_stream = t.side;
    LAUNCH_KERNEL(scaled_copy_kernel, 1, 64, 0, t.y, t.x, 2.0f, (size_t)TWO_STREAMS_N);
    cudaError_t ended = cudaStreamEndCapture(t.main, &g);
    check(ended == cudaErrorStreamCaptureUnjoined && g == NULL && !t.side->capturing,
          "emulator: a capture whose second stream's work is never joined back is refused at its "
          "end (%s)",
          cudaGetErrorString(ended));
    // work on a stream that never joined the capture: refused, and the capture fails
    cudaStreamBeginCapture(t.main, cudaStreamCaptureModeGlobal);
    gpu_stream = stray;
    LAUNCH_KERNEL(fill_kernel, 1, 64, 0, t.x, 1.0f, (size_t)TWO_STREAMS_N);
    cudaError_t launched = cudaGetLastError();
    ended = cudaStreamEndCapture(t.main, &g);
    check(launched == cudaErrorStreamCaptureIsolation &&
          ended == cudaErrorStreamCaptureInvalidated && g == NULL,
          "emulator: a launch during a capture on a stream that is not part of it (no fork) is "
          "refused (%s) and the capture fails (%s)",
          cudaGetErrorString(launched), cudaGetErrorString(ended));
    // two handles on two streams with one workspace: refused
    cublasHandle_t handles[2];
    void *workspace;
    cudaMalloc(&workspace, 1 << 16);
    cudaStream_t on[2] = { t.main, t.side };
    for (int i = 0; i < 2; i++) {
        cublasCreate(&handles[i]);
        cublasSetStream(handles[i], on[i]);
        cublasSetWorkspace(handles[i], workspace, 1 << 16);
    }
    float one = 1, zero = 0;
    cublasStatus_t shared = cublasSgemm(handles[1], CUBLAS_OP_N, CUBLAS_OP_N, 4, 1, 1, &one, t.x, 4,
                                        t.x, 1, &zero, t.y, 4);
    check(shared == CUBLAS_STATUS_INVALID_VALUE && strstr(cuda_on_cpu.message, "workspace"),
          "emulator: cuBLAS handles on two streams sharing one workspace are refused (%s)",
          cuda_on_cpu.message);
    for (int i = 0; i < 2; i++) cublasDestroy(handles[i]);
    cudaFree(workspace);
    gpu_stream = saved;
    cudaEventDestroy(t.fork);
    cudaEventDestroy(t.join);
    cudaStreamDestroy(t.main);
    cudaStreamDestroy(t.side);
    cudaStreamDestroy(stray);
    cudaFree(memory);
    cudaFree(t.log);
    cudaFree(t.next);
}

// ---- make cuda's register check (cuda/check_registers.awk) -----------------------------

// Runs a shell command that writes the check's output to DIR/said: its exit
// status, and the output's first line in `said`.
static int run_and_read_said(const char *command, const char *dir, char *said, size_t said_size) {
    int status = system(command);
    char path[256];
    snprintf(path, sizeof path, "%s/said", dir);
    said[0] = 0;
    FILE *f = fopen(path, "r");
    if (f) {
        size_t n = fread(said, 1, said_size - 1, f);
        said[n] = 0;
        fclose(f);
    }
    said[strcspn(said, "\n")] = 0;
    return status;
}

// Runs the check on a PTX file and a ptxas -v log written from these strings:
// its exit status (0: it passes them), its output in `said`.
static int register_check(const char *dir, const char *ptx, const char *log, char *said,
                          size_t said_size) {
    char path[256], command[1024];
    snprintf(path, sizeof path, "%s/kernels.ptx", dir);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(ptx, f);
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/ptxas.log", dir);
    f = fopen(path, "w");
    if (f) {
        fputs(log, f);
        fclose(f);
    }
    snprintf(command, sizeof command,
             "awk -f cuda/check_registers.awk %s/kernels.ptx %s/ptxas.log > %s/said 2>&1",
             dir, dir, dir);
    return run_and_read_said(command, dir, said, said_size);
}

#ifdef _OPENMP   // (the probe runs in one build of make test: nvcc takes seconds)
// nvcc compiles cuda/register_probe.cu (a thread of it needs about 120
// registers) with `flags` and the check reads its report: the exit status.
static int register_probe(const char *dir, const char *flags, char *said, size_t said_size) {
    char command[1024];
    snprintf(command, sizeof command,
             "rm -rf %s/keep && mkdir %s/keep && nvcc -arch=sm_80 %s -Xptxas -v -keep -keep-dir "
             "%s/keep -c -o %s/keep/probe.o cuda/register_probe.cu 2> %s/keep/ptxas.log && awk -f "
             "cuda/check_registers.awk %s/keep/*.ptx %s/keep/ptxas.log > %s/said 2>&1",
             dir, dir, flags, dir, dir, dir, dir, dir, dir);
    return run_and_read_said(command, dir, said, said_size);
}
#endif

static void test_register_check(void) {
    char dir[64] = "/tmp/register_check_XXXXXX", said[2048];
    if (!mkdtemp(dir)) {
        check(0, "register check: cannot make a temporary directory");
        return;
    }
    const char *ptx =
        ".visible .entry _Z11wide_kernelPf(\n\t.param .u64 _Z11wide_kernelPf_param_0\n)\n"
        "{\n\tret;\n}\n"
        ".visible .entry _Z14bounded_kernelPf(\n\t.param .u64 _Z14bounded_kernelPf_param_0\n)\n"
        ".maxntid 256, 1, 1\n{\n\tret;\n}\n";
    const char *log_format =
        "ptxas info    : Compiling entry function '_Z11wide_kernelPf' for 'sm_80'\n"
        "ptxas info    : Function properties for _Z11wide_kernelPf\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used %d registers, used 0 barriers, 360 bytes cmem[0]\n"
        "ptxas info    : Compiling entry function '_Z14bounded_kernelPf' for 'sm_80'\n"
        "ptxas info    : Used %d registers, used 0 barriers, 360 bytes cmem[0]\n";
    // a 1024-thread block of 64 registers a thread needs 65536; of 72, 73728. A
    // 256-thread block (its __launch_bounds__) of 255 registers needs 65536.
    struct {
        int wide, bounded, passes;
    } cases[] = { { 64, 255, 1 }, { 72, 40, 0 }, { 40, 256, 1 } };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char log[1024];
        snprintf(log, sizeof log, log_format, cases[i].wide, cases[i].bounded);
        int status = register_check(dir, ptx, log, said, sizeof said);
        int right = cases[i].passes
                        ? status == 0 && strstr(said, "2 kernels")
                        : status != 0 && strstr(said, "wide_kernel (sm_80) uses 72 registers");
        check(right,
              "register check: a kernel of %d registers and no __launch_bounds__ (a block of up to "
              "1024 threads), one of %d with __launch_bounds__(256): %s (%s)",
              cases[i].wide, cases[i].bounded, cases[i].passes ? "passed" : "refused", said);
    }
#ifdef _OPENMP   // once in make test: nvcc takes seconds
    if (system("command -v nvcc > /dev/null 2>&1") == 0) {
        int refused = register_probe(dir, "", said, sizeof said) != 0 &&
                      strstr(said, "many_registers_kernel") && strstr(said, "more than the 65536");
        char refusal[sizeof said];
        snprintf(refusal, sizeof refusal, "%s", said);
        int bounded = register_probe(dir, "-DPROBE_THREADS=256", said, sizeof said) == 0;
        check(refused && bounded,
              "register check: nvcc's build of cuda/register_probe.cu is refused without "
              "__launch_bounds__ (%s) and passed with __launch_bounds__(256)",
              refusal);
    } else {
        printf("     (nvcc is not on the PATH: the register check was tried on written reports "
               "only)\n");
    }
#endif
    char command[128];
    snprintf(command, sizeof command, "rm -rf %s", dir);
    if (system(command) != 0)
        printf("     (could not remove %s)\n", dir);
}

// ---- the companion with a fault put in ------------------------------------------

typedef struct {
    Transformer *model;
    Batch *batch;
    real loss;
} CompanionStep;
static void companion_step(void *step) {
    CompanionStep *s = (CompanionStep *)step;
    s->loss = transformer_cuda_training()->train_step(s->model, s->batch, 4, 0.5);
}

// One training step of transformer.c and of the companion from the same
// weights (companion_config) on `batch`: the worst difference of the
// loss and of every gradient tensor, relative to their largest; infinity when
// the emulator caught a fault (cuda_on_cpu.message says which).
static size_t companion_shared_limit;   // when set, the opt-in limit companion_step_difference
                                        // gives the "GPU"
static int companion_skip_waits;        // 1: the side stream's waits for the main one left out;
                                        // 2: the main's for the side; 3: only those before the
                                        // main stream overwrites scratch (graphs on)
static double companion_step_difference(Batch *batch, int *faulted) {
    TransformerConfig config = companion_config(POSITIONAL_SINUSOID);
    Transformer cpu, dev;
    transformer_build(&cpu, &config, 5);
    transformer_build(&dev, &config, 5);
    cpu.training = dev.training = 1;
    real loss = transformer_train_step(&cpu, batch, 4, 0.5);
    transformer_cuda_training()->begin(&dev);
    if (companion_shared_limit)
        gpu.shared_opt_in = companion_shared_limit;
    cpu_test_faults.wait_skipped = companion_skip_waits == 1 ? (const void *)gpu.forked
                                 : companion_skip_waits == 2 ? (const void *)gpu.joined : NULL;
    cpu_test_faults.readers_joins_skipped = companion_skip_waits == 3;
    int graph_after = gpu_graph_after;
    if (companion_skip_waits == 3)
        gpu_graph_after = 1;   // (captured: the join before Adam is kept)
    CompanionStep step = { &dev, batch, 0 };
    *faulted = cpu_catches_fault(companion_step, &step);
    double worst = INFINITY;
    if (!*faulted) {
        transformer_cuda_training()->to_host(&dev);
        worst = fabs((double)step.loss - loss) / fabs((double)loss);
        if (!(worst <= INFINITY))
            worst = INFINITY;
        real **grads[2][NUM_PARAMETER_TENSORS];
        parameter_pointers(grads[0], &cpu.grads);
        parameter_pointers(grads[1], &dev.grads);
        for (int t = 0; t < NUM_PARAMETER_TENSORS; t++)
            worst = fmax(worst,
                         scaled_difference(*grads[1][t], *grads[0][t], cpu.param_sizes[t], NULL));
    }
    cpu_test_faults.wait_skipped = NULL;
    cpu_test_faults.readers_joins_skipped = 0;
    gpu_graph_after = graph_after;
    transformer_free(&cpu);
    transformer_free(&dev);
    transformer_cuda_release();
    return worst;
}

// The kernels that wait at __syncthreads, and those with shared memory
static const char *const companion_cooperative_kernels[] = {
    "residual_layernorm_backward_kernel",
    "layernorm_params_backward_kernel",
    "rows_from_heads_bias_backward_kernel",
    "relu_bias_backward_kernel",
    "cross_entropy_kernel",
    "mean_loss_kernel",
};

static void test_companion_faults(void) {
    int faulted;
    double clean = companion_step_difference(&companion_batches()[0].batch, &faulted);
    check(!faulted && clean < COMPANION_TOL_GRADS,
          "companion: one training step as transformer.c's (loss and all gradients within %.1e of "
          "their largest; tolerance %.0e)",
          clean, COMPANION_TOL_GRADS);
    size_t n = sizeof companion_cooperative_kernels / sizeof *companion_cooperative_kernels;
    size_t norm_sums = gpu_norm_sums_in_kernel;
    for (size_t k = 0; k < n; k++) {
        // layernorm_params_backward_kernel runs where residual_layernorm_backward_kernel's blocks
        // do not add the sums
        int apart =
            strcmp(companion_cooperative_kernels[k], "layernorm_params_backward_kernel") == 0;
        gpu_norm_sums_in_kernel = apart ? 0 : norm_sums;
        // and relu_bias_backward_kernel where the feed-forward networks' epilogues do not
        // (--no-epilogues)
        transformer_cuda_epilogues(strcmp(companion_cooperative_kernels[k],
                                          "relu_bias_backward_kernel") != 0);
        cpu_test_faults.barriers_skipped = companion_cooperative_kernels[k];
        double missing_barrier = companion_step_difference(&companion_batches()[0].batch, &faulted);
        cpu_test_faults.barriers_skipped = NULL;
        check(!(missing_barrier < COMPANION_TOL_GRADS),
              "companion: %s without its __syncthreads is caught (%s %.2g)",
              companion_cooperative_kernels[k], faulted ? "a fault:" : "the step is off by",
              faulted ? 0.0 : missing_barrier);
        cpu_test_faults.shared_memory_short = companion_cooperative_kernels[k];
        companion_step_difference(&companion_batches()[0].batch, &faulted);
        cpu_test_faults.shared_memory_short = NULL;
        check(faulted && strstr(cuda_on_cpu.message, "out of bounds"),
              "companion: %s indexing past its shared memory (given 16 bytes less than it uses) is "
              "caught (%s)",
              companion_cooperative_kernels[k], faulted ? cuda_on_cpu.message : "not caught");
    }
    gpu_norm_sums_in_kernel = norm_sums;
    transformer_cuda_epilogues(1);
}

// 40 ragged sentences (up to 9 source and 8 target tokens): 320 target rows,
// so that the column kernels cut their rows into chunks (column_chunks)
static Batch *companion_wide_batch(void) {
    static TestBatch wide;
    static int made;
    if (!made) {
        int src_len[40], tgt_len[40];
        Rng rng;
        rng_seed(&rng, 11);
        for (int b = 0; b < 40; b++) {
            src_len[b] = 1 + (int)rng_below(&rng, 9);
            tgt_len[b] = 1 + (int)rng_below(&rng, 8);
        }
        src_len[0] = 9;
        tgt_len[0] = 8;
        make_test_batch(&wide, 40, 9, 8, src_len, tgt_len, 19, &rng);
        made = 1;
    }
    return &wide.batch;
}

// The column kernels' chunks (finish_column_sums): a batch whose rows they cut
// into several chunks gives transformer.c's gradients, and the same bits
// whichever block finishes last (two thread and block orders)
static void test_companion_column_chunks(void) {
    unsigned chunks = column_chunks(16, 40 * 8);
    int faulted;
    double wide = companion_step_difference(companion_wide_batch(), &faulted);
    transformer_cuda_epilogues(0);   // (relu_bias_backward_kernel's column sums too)
    double wide_kernels = companion_step_difference(companion_wide_batch(), &faulted);
    transformer_cuda_epilogues(1);
    check(chunks > 1 && !faulted && wide < COMPANION_TOL_GRADS &&
          wide_kernels < COMPANION_TOL_GRADS,
          "companion: one training step on 40 ragged sentences (the column sums in %u chunks of "
          "rows) as transformer.c's (loss and all gradients within %.1e of their largest, %.1e "
          "with --no-epilogues; tolerance %.0e)",
          chunks, wide, wide_kernels, COMPANION_TOL_GRADS);
    // a device whose blocks cannot hold a row of logits (V = 19 floats and the warps' sums) in
    // shared memory
    companion_shared_limit = 32;
    double uncached = companion_step_difference(companion_wide_batch(), &faulted);
    companion_shared_limit = 0;
    check(!faulted && uncached < COMPANION_TOL_GRADS,
          "companion: cross_entropy_kernel reading its rows from device memory (they do not fit a "
          "block's shared memory) gives transformer.c's loss and gradients (within %.1e)",
          uncached);
}

// The two streams' waits are needed, and a missing one is caught: with the side
// stream's waits for the main one left out (its products read gradients not yet
// written), the main stream's for the side (it overwrites what the side's
// products still read, and Adam reads gradients not yet written), or only
// those before the main stream overwrites scratch (a step captured as a
// graph, joined before Adam), a step's gradients are not transformer.c's, in
// some of 6 orders of the streams' work
static void test_companion_stream_waits(void) {
    const char *what[4] = {
        "the second stream's waits for the main one (forks)",
        "the main stream's waits for the second (joins)",
        "the main stream's waits before it overwrites what the second reads (a captured step)",
        ("the main stream's waits before it overwrites what the second reads (a captured step, "
         "--fused-attention, the norms' sums by a kernel of their own on the second stream)")
    };
    size_t norm_sums = gpu_norm_sums_in_kernel;
    for (int skipped = 1; skipped <= 4; skipped++) {
        int caught = 0, faulted;
        companion_skip_waits = skipped == 4 ? 3 : skipped;
        transformer_cuda_fuse_attention(skipped == 4);
        gpu_norm_sums_in_kernel = skipped == 4 ? 0 : norm_sums;
        for (uint64_t seed = 1; seed <= 6; seed++) {
            cpu_seed(seed);
            double d = companion_step_difference(&companion_batches()[1].batch, &faulted);
            caught += faulted || !(d < COMPANION_TOL_GRADS);
        }
        companion_skip_waits = 0;
        transformer_cuda_fuse_attention(0);
        gpu_norm_sums_in_kernel = norm_sums;
        cpu_seed(1);
        check(caught > 0,
              "companion: a training step with %s left out is caught: its gradients differ from "
              "transformer.c's in %d of 6 orders of the two streams' work",
              what[skipped - 1], caught);
    }
}

// Nine training steps over the three ragged shapes of companion_batches with
// graphs captured at a shape's graph_after-th step (0: none): the losses, the
// graphs launched, then the parameters and second moments. With graph_after 2,
// steps 7 to 9 replay graphs captured at steps 4 to 6; with 1, steps 4 to 9
// replay those of steps 1 to 3: the learning rate (warm-up), the dropout keys
// and the batch all differ from the step of the capture.
// one_stream: --one-stream; seed: the threads' and the streams' orders.
enum { GRAPH_RUN_STEPS = 9 };
static real *companion_graph_run(int graph_after, int one_stream, uint64_t seed,
                                 real losses[GRAPH_RUN_STEPS], long *graph_launches) {
    TransformerConfig config = companion_config(POSITIONAL_SINUSOID);
    Transformer dev;
    transformer_build(&dev, &config, 5);
    TestBatch *batches = companion_batches();
    int saved = gpu_graph_after;
    gpu_graph_after = graph_after;
    gpu_one_stream = one_stream;
    cpu_seed(seed);
    *graph_launches = 0;
    transformer_cuda_training()->begin(&dev);
    for (int step = 0; step < GRAPH_RUN_STEPS; step++) {
        dev.training = 1;
        losses[step] =
            transformer_cuda_training()->train_step(&dev, &batches[step % 3].batch, 4, 0.5);
        *graph_launches += gpu.step_counts.graph_launches;
    }
    transformer_cuda_training()->to_host(&dev);
    gpu_graph_after = saved;
    gpu_one_stream = 0;
    return companion_state_released(&dev);
}

// A step replayed from its graph is the step launched kernel by kernel, bit for
// bit: whatever changes between steps is read from device memory, not frozen
// into the graph at its capture; and the same on one stream as on two, with
// the two streams' work in other orders (the seeds 2 and 3: the graphs'
// branches interleaved otherwise at each replay, and with --no-graph the
// streams' work between their waits)
static void test_companion_graphs(void) {
    enum { RUNS = 7 };
    real losses[RUNS][GRAPH_RUN_STEPS];
    long launches[RUNS];
    int after[RUNS] = { 0, 2, 1, 2, 0, 2, 0 }, one_stream[RUNS] = { 0, 0, 0, 1, 1, 0, 0 };
    uint64_t seeds[RUNS] = { 1, 1, 1, 1, 1, 2, 3 };
    real *state[RUNS];
    for (int i = 0; i < RUNS; i++)
        state[i] = companion_graph_run(after[i], one_stream[i], seeds[i], losses[i], &launches[i]);
    size_t bytes;
    {
        Transformer probe;
        TransformerConfig config = companion_config(POSITIONAL_SINUSOID);
        transformer_build(&probe, &config, 5);
        bytes = 2 * probe.num_parameters * sizeof(real);
        transformer_free(&probe);
    }
    for (int i = 1; i < 3; i++)
        check(memcmp(state[i], state[0], bytes) == 0 &&
              memcmp(losses[i], losses[0], sizeof losses[0]) == 0 && launches[0] == 0 &&
              launches[i] == (i == 1 ? 6 : 9),
              "companion: %d training steps over 3 batch shapes with CUDA graphs captured at a "
              "shape's %s step (%ld graph launches, %d replays of a graph captured steps before) "
              "end with the losses, parameters and moments of the steps launched kernel by kernel, "
              "bit for bit",
              GRAPH_RUN_STEPS, after[i] == 1 ? "first" : "second", launches[i],
              after[i] == 1 ? 6 : 3);
    for (int i = 3; i < RUNS; i++)
        check(memcmp(state[i], state[0], bytes) == 0 &&
              memcmp(losses[i], losses[0], sizeof losses[0]) == 0 &&
              launches[i] == (after[i] == 2 ? 6 : 0),
              "companion: the same %d steps %s, %s%s: the same losses, parameters and moments, bit "
              "for bit",
              GRAPH_RUN_STEPS, one_stream[i] ? "on one stream (--one-stream)" : "on two streams",
              after[i] ? "graphs replayed" : "without graphs",
              seeds[i] == 1 ? ""
                            : seeds[i] == 2
                                  ? " (the threads and the streams' work in another order)"
                                  : " (and in a third order)");
    for (int i = 0; i < RUNS; i++) free(state[i]);
    // --fused-attention: its per-head counts of finished blocks are set back by the last block,
    // replay after replay; on two streams (the streams' work in two orders) and on one
    enum { FUSED_RUNS = 4 };
    int fused_after[FUSED_RUNS] = { 0, 2, 2, 2 }, fused_one[FUSED_RUNS] = { 0, 0, 0, 1 };
    uint64_t fused_seeds[FUSED_RUNS] = { 1, 1, 2, 1 };
    transformer_cuda_fuse_attention(1);
    for (int i = 0; i < FUSED_RUNS; i++)
        state[i] = companion_graph_run(fused_after[i], fused_one[i], fused_seeds[i], losses[i],
                                       &launches[i]);
    transformer_cuda_fuse_attention(0);
    for (int i = 1; i < FUSED_RUNS; i++)
        check(memcmp(state[i], state[0], bytes) == 0 &&
              memcmp(losses[i], losses[0], sizeof losses[0]) == 0 && launches[0] == 0 &&
              launches[i] == 6,
              "companion --fused-attention: %d training steps replayed from CUDA graphs (%ld "
              "launches) %s end with the losses, parameters and moments of the steps launched "
              "kernel by kernel, bit for bit",
              GRAPH_RUN_STEPS, launches[i],
              fused_one[i] ? "on one stream (--one-stream)"
                           : fused_seeds[i] == 1 ? "on two streams"
                                                 : "on two streams, their work in another order");
    for (int i = 0; i < FUSED_RUNS; i++) free(state[i]);
}

static void test_companion_deterministic(void) {
    size_t bytes = 2 * sizeof(real);
    {
        Transformer probe;
        TransformerConfig config = companion_config(POSITIONAL_SINUSOID);
        transformer_build(&probe, &config, 5);
        bytes *= probe.num_parameters;
        transformer_free(&probe);
    }
    real *first = companion_state_after(1), *second = companion_state_after(2);
    check(memcmp(first, second, bytes) == 0,
          "companion: 3 training steps with the threads in two other random orders end with the "
          "same parameters and moments, bit for bit");
    real *wide[2] = { companion_state_after_batch(1, companion_wide_batch()),
                      companion_state_after_batch(2, companion_wide_batch()) };
    check(memcmp(wide[0], wide[1], bytes) == 0,
          "companion: 3 training steps on 40 sentences (the column sums in chunks, the last block "
          "to finish adding them) with the threads and blocks in two other random orders end with "
          "the same parameters and moments, bit for bit");
    // the layer norms' parameter gradients added by layernorm_params_backward_kernel (on the second
    // stream) instead of the last block of residual_layernorm_backward_kernel (12 chunks of rows):
    // the same order, the same bits, in two orders of the threads and of the two streams' work
    size_t norm_sums = gpu_norm_sums_in_kernel;
    gpu_norm_sums_in_kernel = 0;
    real *apart[2] = { companion_state_after_batch(1, companion_wide_batch()),
                       companion_state_after_batch(2, companion_wide_batch()) };
    gpu_norm_sums_in_kernel = norm_sums;
    check(memcmp(apart[0], wide[0], bytes) == 0 && memcmp(apart[1], wide[0], bytes) == 0,
          "companion: the layer norms' parameter gradients added by a kernel of their own on the "
          "second stream (layernorm_params_backward_kernel) or by the last block of the norm's "
          "backward kernel: 3 training steps on 40 sentences end with the same parameters and "
          "moments, bit for bit (two orders of the threads and streams)");
    free(apart[0]);
    free(apart[1]);
    free(wide[0]);
    free(wide[1]);
    // --fused-attention: the biases' gradients summed by the last block of each head (8 of them a
    // head on 40 sentences: each block adds its sentence's rows, the last adds the sentences in
    // order)
    transformer_cuda_fuse_attention(1);
    real *fused[2] = { companion_state_after_batch(1, companion_wide_batch()),
                       companion_state_after_batch(2, companion_wide_batch()) };
    transformer_cuda_fuse_attention(0);
    check(memcmp(fused[0], fused[1], bytes) == 0,
          "companion --fused-attention: 3 training steps on 40 sentences (a block per head and "
          "sentence, the last of a head to finish adding the sentences' bias sums) with the "
          "threads and blocks in two other random orders end with the same parameters and moments, "
          "bit for bit");
    free(fused[0]);
    free(fused[1]);
    cpu_test_faults.launch_replaced = "embedding_backward_kernel";
    cpu_test_faults.replacement = racy_embedding_backward_kernel_cpu_thread;
    real *racy[2] = { companion_state_after(1), companion_state_after(2) };
    cpu_test_faults.launch_replaced = NULL;
    size_t differing = 0;
    for (size_t i = 0; i < bytes / sizeof(real); i++)
        differing += memcmp(&racy[0][i], &racy[1][i], sizeof(real)) != 0;
    check(differing > 0,
          "companion: a racy += in the embedding's gradient is caught: two thread orders end with "
          "%zu of %zu numbers different",
          differing, bytes / sizeof(real));
    cpu_seed(1);
    free(first);
    free(second);
    free(racy[0]);
    free(racy[1]);
}

#endif
#endif

// ---- --bf16 ---------------------------------------------------------------------
// The companion with --bf16 against transformer.c (fp32): its own tolerance
// class, derived from bf16's unit roundoff u = 2^-8.
//   - One product: each element within (2u + u^2 + K 2^-24) sum_k |a_ik||b_kj|
//     of the exact product of the unrounded operands (above, test_cublas_model_bf16:
//     checked element by element). Relative to the sum of magnitudes, 2u = 0.0078.
//   - Through the network, to first order: each product on a path adds its own
//     relative error, and the steps between the products (layer norm, softmax,
//     ReLU, the residual sums, dropout) do not amplify it at the scale of their
//     rows (assumed: they are about 1-Lipschitz there). The roundings are
//     independent and of mean zero (round to nearest), so D of them add in
//     quadrature, not in a line (Hoeffding's inequality: the probabilistic bound
//     of Higham and Mary, SIAM J. Sci. Comput. 2019): outside
//         lambda * 2u * sqrt(D)   relative to the tensor's largest element
//     with probability at most 2 exp(-lambda^2 / 2); lambda = 6 makes that 3e-8
//     an element, so that none of a step's 20,000 gradients is expected outside.
//   - D: the products on the longest path. Forward, an encoder layer has 6 (the
//     projection, QK^T, PV, W^O, W_1, W_2), a decoder layer 10; the longest path
//     runs through all N encoder layers, the memory's keys and values (1), the
//     first decoder layer from its cross-attention's QK^T on (5), the other N - 1
//     decoder layers and the logits (1): D_f = 16N - 3. A weight's gradient adds
//     the backward pass's products back from the loss and its own: D_g = 2 D_f + 1.
// For N = 2: losses within 6 * 2^-7 * sqrt(29) = 0.25, gradients within
// 6 * 2^-7 * sqrt(59) = 0.36 of their largest. A bound, not an estimate: one step
// of the tests measures 6e-5 to 2e-4 (loss) and 0.01 to 0.1 (gradients; the worst
// are W_1's, where a ReLU's input near 0 changes sign). Steps that run free drift
// apart with no bound (Adam's update is about the sign of a gradient near 0), so
// --bf16 is compared over one step from the same weights, and over a training
// run by its losses (test_companion_bf16_converges).
#define BF16_LAMBDA 6.0
static double bf16_tolerance(double products) {
    return BF16_LAMBDA * 2 * BF16_UNIT_ROUNDOFF * sqrt(products);
}
static double bf16_forward_products(int layers) { return 16.0 * layers - 3; }

// One training step of transformer.c and of the companion with --bf16 from the
// same weights on `batch`: the loss's relative difference and the worst
// gradient tensor's, relative to its largest element
typedef struct {
    double loss, grad;
    const char *grad_name;
} Bf16Step;
static Bf16Step companion_bf16_step(Batch *batch, int positional) {
    TransformerConfig config = companion_config(positional);
    Transformer cpu, dev;
    transformer_build(&cpu, &config, 5);
    transformer_build(&dev, &config, 5);
    cpu.training = dev.training = 1;
    transformer_cuda_bf16(1);
    real loss = transformer_train_step(&cpu, batch, 4, 0.5);
    transformer_cuda_training()->begin(&dev);
    real loss_dev = transformer_cuda_training()->train_step(&dev, batch, 4, 0.5);
    transformer_cuda_training()->to_host(&dev);
    Bf16Step r = { fabs((double)loss_dev - loss) / fabs((double)loss), 0, "" };
    if (!(r.loss <= INFINITY))
        r.loss = INFINITY;
    real **grads[2][NUM_PARAMETER_TENSORS];
    parameter_pointers(grads[0], &cpu.grads);
    parameter_pointers(grads[1], &dev.grads);
    for (int t = 0; t < NUM_PARAMETER_TENSORS; t++) {
        double e = cpu.param_sizes[t]
                       ? scaled_difference(*grads[1][t], *grads[0][t], cpu.param_sizes[t], NULL)
                       : 0;
        if (!(e <= r.grad)) {
            r.grad = e;
            r.grad_name = parameter_names[t];
        }
    }
    transformer_free(&cpu);
    transformer_free(&dev);
    transformer_cuda_release();
    transformer_cuda_bf16(0);
    return r;
}

static void test_companion_bf16(void) {
    int layers = companion_config(POSITIONAL_SINUSOID).n_layers;
    double tol_loss = bf16_tolerance(bf16_forward_products(layers));
    double tol_grads = bf16_tolerance(2 * bf16_forward_products(layers) + 1);
    const char *names[3] = { "3 ragged sentences, sinusoids",
                             "4 ragged sentences, learned positions",
                             "40 ragged sentences (column sums in chunks)" };
    Batch *batches[3] = { &companion_batches()[0].batch, &companion_batches()[1].batch, NULL };
    int cases = 2;
#if !defined(COMPANION_ON_GPU) && !defined(CUDA_ON_CPU_THREADS)
    batches[cases++] = companion_wide_batch();
#endif
    for (int i = 0; i < cases; i++) {
        Bf16Step r = companion_bf16_step(batches[i],
                                         i == 1 ? POSITIONAL_LEARNED : POSITIONAL_SINUSOID);
        // (and not fp32's: the products did round to bf16)
        check(r.loss < tol_loss && r.grad < tol_grads && r.grad > 100 * COMPANION_TOL_GRADS,
              "companion --bf16: one training step (%s, dropout on) against transformer.c's fp32: "
              "the loss within %.1e (bound %.2f) and all gradients within %.1e of their largest "
              "(%s; bound %.2f, and above fp32's %.0e: the products are bf16's)",
              names[i], r.loss, tol_loss, r.grad, r.grad_name, tol_grads, COMPANION_TOL_GRADS);
    }
#ifndef COMPANION_ON_GPU
    // a missing cast leaves a product reading its operand's copy as it was
    // (NaN on the emulator): the comparison catches it
    cpu_test_faults.launch_skipped = "bf16_cast_kernel";
    Bf16Step uncast = companion_bf16_step(batches[0], POSITIONAL_SINUSOID);
    cpu_test_faults.launch_skipped = NULL;
    check(!(uncast.grad < tol_grads),
          "companion --bf16: bf16_cast_kernel not launched is caught (gradients off by %.2g of "
          "their largest)",
          uncast.grad);
#endif
}

#if !defined(COMPANION_ON_GPU) && !defined(CUDA_ON_CPU_THREADS)   // (the fibers': thread orders
                                                                  // drawn, gpu read)
// Adam writes each weight's bf16 copy: after 3 steps every copy is its fp32
// master weight rounded (__float2bfloat16), bit for bit
static void test_companion_bf16_copies(void) {
    TransformerConfig config = companion_config(POSITIONAL_LEARNED);
    Transformer dev;
    transformer_build(&dev, &config, 5);
    transformer_cuda_bf16(1);
    transformer_cuda_training()->begin(&dev);
    for (int step = 0; step < 3; step++) {
        dev.training = 1;
        transformer_cuda_training()->train_step(&dev, &companion_batches()[step].batch, 4, 0.5);
    }
    transformer_cuda_training()->to_host(&dev);
    size_t P = dev.num_parameters, same = 0, moved = 0;
    __nv_bfloat16 *copies = checked_calloc(P, sizeof(__nv_bfloat16), "bf16 copies");
    gpu_copy(copies, gpu.params_bf16, P * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost);
    Transformer fresh;
    transformer_build(&fresh, &config, 5);
    for (size_t i = 0; i < P; i++) {
        same += copies[i].x == __float2bfloat16(dev.params_memory[i]).x;
        moved += copies[i].x != __float2bfloat16(fresh.params_memory[i]).x;
    }
    check(same == P && moved > P / 2,
          "companion --bf16: after 3 steps each of the %zu weights' bf16 copies is its fp32 master "
          "weight rounded, bit for bit (%zu of them), %zu moved by Adam since the first",
          P, same, moved);
    free(copies);
    transformer_free(&fresh);
    free(companion_state_released(&dev));
    transformer_cuda_bf16(0);
}

// --bf16 is as deterministic as fp32: two thread and block orders, and the
// steps replayed from CUDA graphs against the steps launched one by one, end
// with the same bits; a step holds the same cuBLAS calls and the casts besides
static void test_companion_bf16_same_bits(void) {
    size_t bytes = 2 * sizeof(real);
    {
        Transformer probe;
        TransformerConfig config = companion_config(POSITIONAL_SINUSOID);
        transformer_build(&probe, &config, 5);
        bytes *= probe.num_parameters;
        transformer_free(&probe);
    }
    transformer_cuda_bf16(1);
    real *orders[2] = { companion_state_after_batch(1, companion_wide_batch()),
                        companion_state_after_batch(2, companion_wide_batch()) };
    // without graphs, with graphs on two streams (their work in two orders), with graphs on one
    // stream
    enum { BF16_RUNS = 4 };
    int after[BF16_RUNS] = { 0, 2, 2, 2 }, one_stream[BF16_RUNS] = { 0, 0, 0, 1 };
    uint64_t seeds[BF16_RUNS] = { 1, 1, 2, 1 };
    real losses[BF16_RUNS][GRAPH_RUN_STEPS];
    long launches[BF16_RUNS];
    real *graphed[BF16_RUNS];
    for (int i = 0; i < BF16_RUNS; i++)
        graphed[i] = companion_graph_run(after[i], one_stream[i], seeds[i], losses[i],
                                         &launches[i]);
    GpuCounts bf16 = companion_step_counts(2, 4, 0);
    transformer_cuda_bf16(0);
    GpuCounts fp32 = companion_step_counts(2, 4, 0);
    check(memcmp(orders[0], orders[1], bytes) == 0,
          "companion --bf16: 3 training steps on 40 sentences with the threads and blocks in two "
          "random orders end with the same parameters and moments, bit for bit");
    for (int i = 1; i < BF16_RUNS; i++)
        check(memcmp(graphed[0], graphed[i], bytes) == 0 &&
              memcmp(losses[0], losses[i], sizeof losses[0]) == 0 && launches[0] == 0 &&
              launches[i] == 6,
              "companion --bf16: %d training steps over 3 batch shapes replayed from CUDA graphs "
              "(%ld launches) %s end with the losses, parameters and moments of the steps launched "
              "one by one, bit for bit",
              GRAPH_RUN_STEPS, launches[i],
              one_stream[i] ? "on one stream (--one-stream)"
                            : seeds[i] == 1 ? "on two streams"
                                            : "on two streams, their work in another order");
    check(bf16.gemms == fp32.gemms && bf16.launches > fp32.launches && bf16.memsets == 0 &&
          bf16.allocations == 0,
          "companion --bf16: a 2-layer step is the same %ld cuBLAS calls (cublasGemmEx) and %ld "
          "kernel launches, %ld of them bf16_cast_kernel's (the activations' copies), no "
          "allocation or memset after the first step",
          bf16.gemms, bf16.launches, bf16.launches - fp32.launches);
    for (int i = 0; i < 2; i++) free(orders[i]);
    for (int i = 0; i < BF16_RUNS; i++) free(graphed[i]);
    cpu_seed(1);
}
#endif

// Convergence: `train --task copy` for 60 steps, transformer.c in fp32 and the
// companion with --bf16, the same data, weights and dropout masks: the training
// loss falls as far (the mean of the last 10 steps within 3% of transformer.c's,
// and below 70% of the first 10 steps')
#ifdef _OPENMP   // (test_companion_bf16_converges's, which runs in one build)
static int read_loss_log(const char *path, double *losses, int most) {
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int n = 0, step;
    double loss, lr;
    while (n < most && fscanf(f, "%d %lf %lf", &step, &loss, &lr) == 3)
        losses[n++] = loss;
    fclose(f);
    return n;
}
static double mean_of(const double *x, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += x[i];
    return n ? sum / n : NAN;
}
#endif
static void test_companion_bf16_converges(void) {
#ifdef _OPENMP   // once in make test: 60 steps on the emulator take seconds
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/transformer_cuda_bf16_XXXXXX");
    if (!mkdtemp(dir)) {
        check(0, "companion --bf16: cannot make a temporary directory");
        return;
    }
    enum { STEPS = 60 };
    const char *run =
        "train --task copy --words 5 --min-length 2 --max-length 4 --train-size 200 --valid-size "
        "20 --layers 1 --d-model 16 --d-ff 32 --heads 2 --batch-tokens 60 --lr 0.01 --warmup 20 "
        "--steps 60 --eval-every 0 --log-every 0 --show 0 --threads 1 --force";
    char command[1024];
    double losses[2][STEPS];
    int steps[2], status[2];
    for (int bf16 = 0; bf16 < 2; bf16++) {
        snprintf(command, sizeof command, "%s --checkpoint %s/run%d.ckpt --loss-log %s/loss%d.txt",
                 run, dir, bf16, dir, bf16);
        transformer_cuda_bf16(bf16);
        status[bf16] = run_command_quietly(bf16 ? transformer_cuda_training()
                                                : &transformer_cpu_training,
                                           command);
        transformer_cuda_bf16(0);
        transformer_cuda_release();
        snprintf(command, sizeof command, "%s/loss%d.txt", dir, bf16);
        steps[bf16] = read_loss_log(command, losses[bf16], STEPS);
    }
    double first = mean_of(losses[0], 10), last = mean_of(losses[0] + STEPS - 10, 10);
    double first_bf16 = mean_of(losses[1], 10), last_bf16 = mean_of(losses[1] + STEPS - 10, 10);
    double apart = fabs(last_bf16 - last) / last;
    check(status[0] == 0 && status[1] == 0 && steps[0] == STEPS && steps[1] == STEPS &&
          apart < 0.03 && last_bf16 < 0.7 * first_bf16,
          "companion --bf16: train --task copy, %d steps: the training loss falls from %.3f to "
          "%.3f (the means of the first and last 10 steps), transformer.c's in fp32 from %.3f to "
          "%.3f (%.1f%% apart; at most 3%%)",
          STEPS, first_bf16, last_bf16, first, last, 100 * apart);
    snprintf(command, sizeof command, "rm -rf %s", dir);
    if (system(command) != 0)
        printf("     (could not remove %s)\n", dir);
#endif
}

// ./transformer_cuda sgemm, the benchmark's yardstick, runs (a small product) and refuses a size of
// 0, and numbers that are not whole integers (atoi once read "12abc" as 12 and "1e3" as 1)
static void test_companion_sgemm(void) {
    char *run[] = { "sgemm", "--size", "48", "--repeats", "1", NULL },
         *bad[] = { "sgemm", "--size", "0", NULL };
    fflush(stdout);
    int ran = transformer_cuda_sgemm(5, run), refused = transformer_cuda_sgemm(3, bad);
    check(ran == 0 && refused != 0,
          "companion: ./transformer_cuda sgemm times cuBLAS's 48 x 48 x 48 product (exit %d) and "
          "refuses --size 0 (exit %d)",
          ran, refused);
    char *odd[][3] = { { "sgemm", "--size", "12abc" }, { "sgemm", "--size", "1e3" },
                       { "sgemm", "--repeats", "2x" }, { "sgemm", "--size", "4294967300" },
                       { "sgemm", "7", "" }, { "sgemm", "--size", NULL } };
    int refusals = 0, cases = (int)(sizeof odd / sizeof *odd);
    for (int i = 0; i < cases; i++)
        refusals += transformer_cuda_sgemm(odd[i][2] ? 3 : 2, odd[i]) == 1;
    char *help[] = { "sgemm", "--help", NULL };
    int helped = transformer_cuda_sgemm(2, help);
    check(refusals == cases && helped == 0,
          "companion: sgemm refuses %d of %d bad arguments (12abc, 1e3, 2x, 4294967300, a stray 7, "
          "a flag without its value) with exit 1, and --help exits %d",
          refusals, cases, helped);
}

// ============================================================================
// The NCCL path, on the emulator: mpirun -np N, the companion's ranks summing their gradients
// with ncclAllReduce (cuda_on_cpu.h's, over MPI), against ./transformer's ranks (lab/ranks.c)
// ============================================================================

#if defined(TRANSFORMER_MPI) && defined(_OPENMP) && !defined(COMPANION_ON_GPU)
// One run's checkpoint and its per-step losses (its --loss-log), or the reason it has none
typedef struct {
    LabCheckpoint c;
    double loss[16];
    int steps, status;
    const char *error;
} RankedRun;

// mpirun -np N of a train command line: this binary's companion (--companion) or the lab's
// ./transformer (binary), into dir/NAME.ckpt and dir/NAME.loss
static void ranked_run(RankedRun *r, int ranks, const char *binary, const char *run,
                       const char *dir, const char *name) {
    char command[4096], path[256];
    snprintf(command, sizeof command, "mpirun -q --oversubscribe --mca pml ob1 --mca btl "
             "self,vader -np %d %s train %s --checkpoint %s/%s.ckpt --loss-log %s/%s.loss "
             "> %s/%s.out 2>&1", ranks, binary, run, dir, name, dir, name, dir, name);
    fflush(stdout);
    r->status = system(command);
    snprintf(path, sizeof path, "%s/%s.loss", dir, name);
    FILE *f = fopen(path, "r");
    long step;
    double lr;
    r->steps = 0;
    while (f && r->steps < 16 && fscanf(f, "%ld %lf %lf", &step, &r->loss[r->steps], &lr) == 3)
        r->steps++;
    if (f)
        fclose(f);
    snprintf(path, sizeof path, "%s/%s.ckpt", dir, name);
    r->error = r->status ? "the run failed" : lab_checkpoint_load(path, &r->c);
}

static void test_companion_nccl(void) {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    char self[600], dir[64];
    ssize_t got = readlink("/proc/self/exe", self, sizeof self - 20);
    self[got > 0 ? got : 0] = '\0';
    strcat(self, " --companion");
    if (system("mpirun --version 2>/dev/null | grep -q 'Open MPI'") != 0 ||
        !cli_binary_found("./transformer")) {
        printf("-- the NCCL path: skipped (no Open MPI mpirun on the PATH)\n");
        return;
    }
    snprintf(dir, sizeof dir, "/tmp/transformer_nccl_test_XXXXXX");
    if (!mkdtemp(dir)) {
        check(0, "companion: cannot make a temporary directory");
        return;
    }
    char transformer[700] = "", here[512] = "";
    if (cli_binary[0] != '/' && !getcwd(here, sizeof here))
        here[0] = '\0';
    snprintf(transformer, sizeof transformer, "%s%s%s", here, here[0] ? "/" : "", cli_binary);
    // -np 2 on the default lengths; -np 3 on batches of two sentences (8 to 10 words, 50
    // tokens), so that a rank's share is empty at every step
    const char *runs[2] = { "--task copy --layers 1 --d-model 16 --d-ff 32 --heads 2 --warmup 5 "
                            "--train-size 120 --valid-size 10 --eval-size 10 --steps 6 "
                            "--batch-tokens 80 --eval-every 0 --log-every 0 --show 0",
                            "--task copy --layers 1 --d-model 16 --d-ff 32 --heads 2 --warmup 5 "
                            "--train-size 120 --valid-size 10 --eval-size 10 --steps 6 "
                            "--min-length 8 --max-length 10 --batch-tokens 50 --eval-every 0 "
                            "--log-every 0 --show 0" };
    for (int i = 0; i < 2; i++) {
        RankedRun gpu, cpu;
        int ranks = 2 + i;
        ranked_run(&gpu, ranks, self, runs[i], dir, i ? "gpu3" : "gpu2");
        ranked_run(&cpu, ranks, transformer, runs[i], dir, i ? "cpu3" : "cpu2");
        double loss = gpu.steps == 6 && cpu.steps == 6 ? 0 : INFINITY, params = INFINITY,
               moments = INFINITY;
        for (int k = 0; k < gpu.steps && k < cpu.steps; k++)
            loss = fmax(loss, fabs(gpu.loss[k] - cpu.loss[k]) / fabs(cpu.loss[k]));
        if (!gpu.error && !cpu.error) {
            unsigned char *skip = key_bias_skip_mask(&cpu.c.model);
            size_t P = cpu.c.model.num_parameters;
            int same = gpu.c.model.num_parameters == P && gpu.c.model.adam_step == 6 &&
                       cpu.c.model.adam_step == 6 &&
                       gpu.c.model.dropout_rng.state == cpu.c.model.dropout_rng.state;
            params = same ? scaled_difference(gpu.c.model.params_memory,
                                              cpu.c.model.params_memory, P, skip) : INFINITY;
            moments = same ? scaled_difference(gpu.c.model.adam_m, cpu.c.model.adam_m, P, NULL)
                           : INFINITY;
            free(skip);
        }
        check(loss < COMPANION_TOL_LOSS && moments < COMPANION_TOL_GRADS &&
              params < COMPANION_TOL_UPDATES,
              "companion: mpirun -np %d, its gradients summed by ncclAllReduce (the emulator's, "
              "over MPI)%s, against ./transformer's ranks, 6 steps with dropout: the losses "
              "(worst %.1e; tolerance %.0e), Adam's first moments (%.1e of the largest; %.0e), "
              "the parameters (%.1e; %.0e), the dropout generator (%s)", ranks,
              i ? ", a share empty at every step" : "", loss, COMPANION_TOL_LOSS, moments,
              COMPANION_TOL_GRADS, params, COMPANION_TOL_UPDATES,
              gpu.error ? gpu.error : cpu.error ? cpu.error : "read");
        if (!gpu.error)
            lab_checkpoint_free(&gpu.c);
        if (!cpu.error)
            lab_checkpoint_free(&cpu.c);
    }
    char command[128];
    snprintf(command, sizeof command, "rm -rf %s", dir);
    if (system(command) != 0)
        printf("     (could not remove %s)\n", dir);
}
#else
static void test_companion_nccl(void) {
#ifdef COMPANION_ON_GPU
    printf("-- the NCCL path on a GPU: make test-cuda-proofs (mpirun -np 1 against one "
           "process)\n");
#else
    printf("-- the NCCL path on the emulator: in ./test_cuda, where MPI is built in "
           "(make MPI=1)\n");
#endif
}
#endif

void run_companion_tests(void) {
#ifdef COMPANION_ON_GPU
    printf("-- the CUDA companion on the GPU (transformer_cuda.cu built by nvcc; tolerances: "
           "losses %g, gradients %g, updates %g of the largest)\n",
           COMPANION_TOL_LOSS, COMPANION_TOL_GRADS, COMPANION_TOL_UPDATES);
#else
    printf("-- the CUDA companion on the CPU (transformer_cuda.cu with cuda_on_cpu.h; tolerances: "
           "losses %g, gradients %g, updates %g of the largest)\n",
           COMPANION_TOL_LOSS, COMPANION_TOL_GRADS, COMPANION_TOL_UPDATES);
    test_cublas_model();
    test_emulator_epilogues();
    test_emulator_bf16();
    test_emulator_launch_checks();
#ifndef CUDA_ON_CPU_THREADS   // faults caught and thread orders drawn: the fibers' (make
                              // test-threads has threads)
    test_emulator_threads();
    test_emulator_faults();
    test_emulator_audit();
    test_emulator_warps();
    test_emulator_graphs();
    test_emulator_streams();
    test_register_check();
#endif
#endif
    set_threads(1);   // transformer.c's side on one thread: these models are tiny, and the machine
                      // may be busy
    test_companion_reference_files();
    test_companion_training_run();
    test_companion_fused_attention();
    test_companion_one_stream();
    test_companion_transposed_weights();
    test_companion_epilogues();
    test_companion_bf16();
#ifndef COMPANION_ON_GPU
    test_companion_fused_attention_kernels();
    test_companion_layout_kernels();
#ifndef CUDA_ON_CPU_THREADS
    test_companion_faults();
    test_companion_column_chunks();
    test_companion_stream_waits();
    test_companion_graphs();
    test_companion_deterministic();
    test_companion_bf16_copies();
    test_companion_bf16_same_bits();
#endif
    test_companion_counts();
    test_companion_profile();
#endif
    test_companion_train_command();
    test_companion_bf16_converges();
    test_companion_sgemm();
    test_companion_nccl();
}

#ifndef TEST_CUDA_LIBRARY   // (test_cuda_threads.c has its own main)
int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--companion") == 0) {   // ./transformer_cuda, in this build
        transformer_training = transformer_cuda_training();   // (test_companion_nccl's ranks)
        int status = transformer_lab_main(argc - 1, argv + 1);
        transformer_cuda_release();
        return status;
    }
    fast_path_use(1);   // transformer.c's side as make's ./transformer runs it
    companion_logits = transformer_cuda_logits;
    run_companion_tests();
    printf("%d passed, %d failed\n", tests_passed, tests_failed);
    return tests_failed ? 1 : 0;
}
#endif
