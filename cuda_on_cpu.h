/* cuda_on_cpu.h: just enough of CUDA and cuBLAS to run transformer_cuda.cu on the CPU
 *
 * transformer_cuda.cu is written in the part of C that CUDA C++ shares, so the
 * host C compiler can build it too: with -DCUDA_ON_CPU it includes this header
 * instead of the CUDA ones, and then
 *   - a kernel is an ordinary function, and LAUNCH (in transformer_cuda.cu) runs
 *     it once for every thread of the grid, with blockIdx, threadIdx, blockDim and
 *     gridDim set. Blocks and threads run one after another, last first: a kernel
 *     that only works when its threads run in order shows it. A test may name a
 *     kernel whose launches are skipped (cpu_launch_skipped), a fault to catch;
 *   - device memory is host memory. cudaMalloc fills what it returns with NaN, so
 *     an element that a kernel should have written and did not poisons every
 *     result that reads it, and the tests see NaN;
 *   - cublasSgemm and cublasSgemmStridedBatched are plain column-major loops that
 *     honour the transposes, the leading dimensions, alpha, beta and the batch
 *     strides as the cuBLAS documentation defines them:
 *         C = alpha op(A) op(B) + beta C,   op(X) = X or X^T,
 *         op(A) is m x k, op(B) is k x n, C is m x n, all column-major:
 *         element (i, j) of a matrix X with leading dimension ldx is X[i + j*ldx];
 *     when beta is 0, C is not read (it may hold NaN); and a call cuBLAS would
 *     refuse (a negative size, a leading dimension too small for its matrix)
 *     returns CUBLAS_STATUS_INVALID_VALUE here too.
 * What this cannot show is what only a GPU does: threads running at once, the
 * GPU's own rounding and speed. `make test-cuda` runs the real thing.
 */
#ifndef CUDA_ON_CPU_H
#define CUDA_ON_CPU_H

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define __global__
#define __device__

// ---- threads ----------------------------------------------------------------

typedef struct { unsigned x, y, z; } dim3;
static dim3 blockIdx, threadIdx, blockDim, gridDim;

// A fault for the tests to inject: every launch of the kernel named here is
// skipped (NULL, the default: none), so that a test can show that its
// comparison catches a kernel not launched.
static const char *cpu_launch_skipped;

// Runs kernel(arguments...) for every thread of a one-dimensional grid of
// `blocks` blocks of `threads` threads, the last thread first.
#define CPU_LAUNCH(kernel, blocks, threads, ...) do {                                     \
        if (cpu_launch_skipped && strcmp(cpu_launch_skipped, #kernel) == 0) break;        \
        gridDim.x = (unsigned)(blocks); blockDim.x = (unsigned)(threads);                \
        gridDim.y = gridDim.z = blockDim.y = blockDim.z = 1;                              \
        blockIdx.y = blockIdx.z = threadIdx.y = threadIdx.z = 0;                          \
        for (unsigned block_ = gridDim.x; block_-- > 0; )                                 \
            for (unsigned thread_ = blockDim.x; thread_-- > 0; ) {                        \
                blockIdx.x = block_; threadIdx.x = thread_;                               \
                kernel(__VA_ARGS__);                                                      \
            }                                                                             \
    } while (0)

// ---- memory -------------------------------------------------------------------

typedef enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2 } cudaError_t;
typedef enum { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3 } cudaMemcpyKind;

static inline const char *cudaGetErrorString(cudaError_t error) {
    return error == cudaSuccess ? "no error" : "out of memory";
}

// Every allocation is filled with the float NaN bit pattern (its int buffers
// too, which the companion always writes before reading): never written
// means never valid.
static inline cudaError_t cudaMalloc(void **pointer, size_t bytes) {
    float *p = (float *)malloc(bytes ? bytes : 1);
    *pointer = p;
    if (!p) return cudaErrorMemoryAllocation;
    for (size_t i = 0; i < bytes / sizeof(float); i++) p[i] = NAN;
    return cudaSuccess;
}

static inline cudaError_t cudaFree(void *pointer) { free(pointer); return cudaSuccess; }

static inline cudaError_t cudaMemcpy(void *to, const void *from, size_t bytes, cudaMemcpyKind kind) {
    (void)kind;
    if (bytes) memcpy(to, from, bytes);
    return cudaSuccess;
}

static inline cudaError_t cudaMemset(void *to, int value, size_t bytes) {
    memset(to, value, bytes);
    return cudaSuccess;
}

// The "device" is the host; its name says so.
typedef struct { char name[256]; } cudaDeviceProp;
static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device) {
    (void)device;
    memset(prop, 0, sizeof *prop);
    strcpy(prop->name, "the CPU (cuda_on_cpu.h)");
    return cudaSuccess;
}

static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
static inline cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

// ---- cuBLAS -------------------------------------------------------------------

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_INITIALIZED = 1, CUBLAS_STATUS_INVALID_VALUE = 7
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 } cublasMath_t;
typedef struct { int created; cublasMath_t math; } *cublasHandle_t;

static inline const char *cublasGetStatusString(cublasStatus_t status) {
    return status == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS"
         : status == CUBLAS_STATUS_NOT_INITIALIZED ? "CUBLAS_STATUS_NOT_INITIALIZED"
         : "CUBLAS_STATUS_INVALID_VALUE";
}

static inline cublasStatus_t cublasCreate(cublasHandle_t *handle) {
    *handle = (cublasHandle_t)calloc(1, sizeof **handle);
    if (!*handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    (*handle)->created = 1;
    return CUBLAS_STATUS_SUCCESS;
}

static inline cublasStatus_t cublasDestroy(cublasHandle_t handle) { free(handle); return CUBLAS_STATUS_SUCCESS; }

// TF32 would round the inputs to 10-bit mantissas on a GPU; the CPU model
// always multiplies in fp32, so it only records the choice.
static inline cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (!handle || !handle->created) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

static inline int cublas_max1(int a) { return a > 1 ? a : 1; }

// The product of one batch entry; the arguments as cublasSgemm's.
static inline void cpu_sgemm(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                      float alpha, const float *A, int lda, const float *B, int ldb,
                      float beta, float *C, int ldc) {
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < m; i++) {
            float sum = 0;
            for (int p = 0; p < k; p++) {
                float a = transa == CUBLAS_OP_N ? A[i + (size_t)p * lda] : A[p + (size_t)i * lda]; // op(A)[i,p]
                float b = transb == CUBLAS_OP_N ? B[p + (size_t)j * ldb] : B[j + (size_t)p * ldb]; // op(B)[p,j]
                sum += a * b;
            }
            float *c = &C[i + (size_t)j * ldc];
            *c = beta == 0.0f ? alpha * sum : alpha * sum + beta * *c;   // beta 0: C is not read
        }
    }
}

// What cuBLAS checks before it computes anything.
static inline cublasStatus_t cpu_sgemm_check(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                      int m, int n, int k, int lda, int ldb, int ldc, int batch_count) {
    if (!handle || !handle->created) return CUBLAS_STATUS_NOT_INITIALIZED;
    if ((transa != CUBLAS_OP_N && transa != CUBLAS_OP_T) || (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m < 0 || n < 0 || k < 0 || batch_count < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (lda < cublas_max1(transa == CUBLAS_OP_N ? m : k)) return CUBLAS_STATUS_INVALID_VALUE;
    if (ldb < cublas_max1(transb == CUBLAS_OP_N ? k : n)) return CUBLAS_STATUS_INVALID_VALUE;
    if (ldc < cublas_max1(m)) return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

static inline cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                  int m, int n, int k, const float *alpha, const float *A, int lda,
                                  const float *B, int ldb, const float *beta, float *C, int ldc) {
    cublasStatus_t status = cpu_sgemm_check(handle, transa, transb, m, n, k, lda, ldb, ldc, 1);
    if (status == CUBLAS_STATUS_SUCCESS) cpu_sgemm(transa, transb, m, n, k, *alpha, A, lda, B, ldb, *beta, C, ldc);
    return status;
}

// Entry i multiplies A + i*strideA and B + i*strideB into C + i*strideC.
static inline cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                                cublasOperation_t transb, int m, int n, int k,
                                                const float *alpha, const float *A, int lda, long long strideA,
                                                const float *B, int ldb, long long strideB, const float *beta,
                                                float *C, int ldc, long long strideC, int batch_count) {
    cublasStatus_t status = cpu_sgemm_check(handle, transa, transb, m, n, k, lda, ldb, ldc, batch_count);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    for (int i = 0; i < batch_count; i++)
        cpu_sgemm(transa, transb, m, n, k, *alpha, A + i * strideA, lda, B + i * strideB, ldb, *beta,
                  C + i * strideC, ldc);
    return CUBLAS_STATUS_SUCCESS;
}

#endif // CUDA_ON_CPU_H
