/* cuda_on_cpu.h: enough of CUDA and cuBLAS to run transformer_cuda.cu on the CPU,
 * the way a GPU would
 *
 * transformer_cuda.cu is written in the part of C that CUDA C++ shares, so the
 * host C compiler builds it too: with -DCUDA_ON_CPU it includes this header
 * instead of the CUDA ones. The tests then run its kernels, and what a GPU
 * would do differently from a loop is made to show:
 *
 *   - Threads. Each thread of a block is a context of its own (a fiber: its
 *     own stack), and a block's threads run in a different random order at
 *     each launch (the blocks too). A thread runs until it waits: at
 *     __syncthreads, which releases the block's threads once all that have not
 *     returned have arrived (all at the same __syncthreads: two call sites are
 *     two barriers on a GPU, and a fault here), and at a warp exchange (a
 *     shuffle such as __shfl_xor_sync, or __syncwarp), which releases the
 *     lanes its mask names once all have arrived with the same mask, each
 *     with the value of the lane it read (a lane outside the mask reads NaN:
 *     undefined on a GPU); then the next thread is drawn at random among
 *     those that can run. So shared memory, barriers and shuffles work as on a
 *     GPU, and a kernel that reads what another thread has not yet written (a
 *     missing barrier) reads NaN or another run's value. Lanes that disagree on
 *     a mask, a mask naming a lane that has returned or does not exist, and
 *     threads that all wait for each other, are faults.
 *     Built with -DCUDA_ON_CPU_THREADS, a block's threads are POSIX threads
 *     instead, all running at once (make test-threads runs the companion's
 *     tests so under ThreadSanitizer, which then sees any data race).
 *   - Memory. Device memory and shared memory start as NaN, so a value that
 *     should have been written and was not poisons every result that reads it.
 *     Device memory is mapped unreadable except during a copy, a kernel or a
 *     cuBLAS call: host code that reads it (loss = *device_pointer) stops with
 *     a message naming the allocation. Each allocation ends at an unreadable
 *     page; a program that carves tensors out of one allocation names them
 *     (cpu_guard_tensor), and each then ends at an unreadable page of its own,
 *     so that a kernel, copy or cuBLAS call reaching past one tensor into its
 *     neighbour stops there, named. A block's shared memory ends at an
 *     unreadable page (an index past it stops the launch as an illegal
 *     address) and starts after a band of marked bytes that ends at one
 *     below: a write below the start is caught when the block ends, a read
 *     there reads NaN. A cuBLAS call whose operands reach outside their
 *     allocation or tensor, or a copy that does, is refused.
 *   - Launches are checked as a GPU checks them: a grid of at least one block
 *     (at most 2^31 - 1 by 65535 by 65535), at most 1024 threads per block, at
 *     most 48 KB of dynamic shared memory unless the kernel opted in with
 *     cudaFuncSetAttribute (then up to 227 KB, an H100's limit). A refused
 *     launch, or a fault, is returned by cudaGetLastError as on a GPU; a fault
 *     is sticky: every later call returns it.
 *   - Streams, events and CUDA graphs. Work given to a stream (a kernel, a
 *     cuBLAS call, an asynchronous copy or memset; its arguments copied, as a
 *     graph's) waits for the stream's earlier work and for the events the
 *     stream waited for (cudaEventRecord, cudaStreamWaitEvent), and runs only
 *     when something needs it: a wait for the stream, an event or the device,
 *     a blocking copy, cudaFree. Then it runs in an order drawn anew each time
 *     among those its waits allow (cpu_run_pending): at random, or one stream
 *     as far ahead of the others as it may go; so a missing wait between two
 *     streams (one reading what the other has not written yet, or has
 *     overwritten already) gives wrong numbers in some orders. The legacy
 *     stream runs its work at once, after all the other streams' (as a GPU's
 *     legacy stream waits for them). While a stream captures a graph
 *     (cudaStreamBeginCapture) its work is recorded instead, with the
 *     arguments as they are at that moment (cuBLAS's alpha and beta too); a
 *     stream that waits for an event recorded in a capturing stream joins the
 *     capture (a fork), and the capturing stream waiting for an event recorded
 *     in it joins it back. cudaGraphLaunch gives the graph's nodes to the
 *     stream, each after the nodes it depends on, so that independent
 *     branches run in another order at each replay. Whatever a captured step
 *     reads from host variables is frozen, as on a GPU. What a capture in
 *     cudaStreamCaptureModeGlobal forbids is refused and spoils the capture
 *     (cudaStreamEndCapture then fails): a blocking copy or memset,
 *     cudaMalloc, cudaFree, a synchronisation, work on the legacy default
 *     stream (a launch or cuBLAS call without the stream), an asynchronous
 *     copy from host memory that cudaMallocHost did not give, and (stricter
 *     than a GPU, which would run it once, at once) work on a stream that is
 *     not part of the capture. A capture whose forked stream has work the
 *     capturing stream never waited for ends with cudaErrorStreamCaptureUnjoined,
 *     as on a GPU.
 *   - cublasSgemm and cublasSgemmStridedBatched are plain column-major loops
 *     that honour the transposes, leading dimensions, alpha, beta and batch
 *     strides as the cuBLAS documentation defines them:
 *         C = alpha op(A) op(B) + beta C,   op(X) = X or X^T,
 *         op(A) is m x k, op(B) is k x n, C is m x n, all column-major:
 *         element (i, j) of a matrix X with leading dimension ldx is X[i + j*ldx];
 *     each element's sum runs p = 0..k-1, a fused multiply-add a step (one
 *     rounding, as cuBLAS's kernels add), so that it does not depend on how
 *     the operands are laid out (the compiler's own contraction did: a
 *     transposed copy of an operand gave other bits; transposed_weights.h);
 *     when beta is 0, C is not read (it may hold NaN); a call cuBLAS would
 *     refuse (a negative size, a leading dimension too small) returns
 *     CUBLAS_STATUS_INVALID_VALUE here too. They run on the handle's stream
 *     (cublasSetStream); cublasSetWorkspace must give device memory, and two
 *     handles on two streams may not share it (their calls may run at once:
 *     refused).
 *     cublasGemmEx and cublasGemmStridedBatchedEx do the same with A and B in
 *     bf16 (CUDA_R_16BF) or fp32, C in fp32, computing in fp32
 *     (CUBLAS_COMPUTE_32F): a product of two bf16 numbers is exact in fp32 (8
 *     + 8 significant bits), so only the fp32 sum rounds; other types are
 *     CUBLAS_STATUS_NOT_SUPPORTED. The operands' extents are checked in their
 *     own element size.
 *   - cublasLtMatmul, for transformer_cuda.cu's epilogues.h: the same product
 *     (one matrix, fp32 or bf16 operands, TF32's compute type computed as
 *     fp32) on the stream given with the call, with RELU_AUX_BIAS (bias, ReLU,
 *     a bit mask) or DRELU_BGRAD (the mask applied, the rows' sums as the bias
 *     gradient) as cuBLASLt's documentation defines them; its heuristic offers
 *     one algorithm for those and none for anything else.
 *   - NCCL's ncclAllReduce (ncclFloat, ncclSum), for a data-parallel run's
 *     ranks (lab/ranks.c): work on its stream like a copy, captured into a
 *     graph like one, and run on the host over MPI when the program is built
 *     with it (-DTRANSFORMER_MPI): every rank's numbers gathered
 *     (MPI_Allgather), then summed in rank order into each; one rank's are
 *     its own. ncclGetUniqueId, ncclCommInitRank (the ranks must be MPI's),
 *     ncclCommDestroy, ncclGroupStart and ncclGroupEnd; cudaSetDevice and
 *     cudaGetDeviceCount see one device.
 *   - bf16 (cuda_bf16.h's __nv_bfloat16, 16 bits: fp32's sign and exponent,
 *     7 stored significand bits): __float2bfloat16 rounds to nearest, ties to
 *     even (past the largest finite: infinity), any NaN to the NaN 0x7FFF as
 *     CUDA's does; __bfloat162float is exact.
 *
 * A kernel is an ordinary C function. Each one is followed in transformer_cuda.cu
 * by CPU_KERNEL(name, its parameter types...), which makes the function that
 * starts one thread of it from a packed copy of the launch's arguments
 * (C has no closures); a static assertion checks the types against the
 * kernel's own. nvcc never sees any of this. __launch_bounds__ is nvcc's alone
 * (make cuda checks each kernel's registers against it).
 *
 * For the tests: faults to inject (cpu_test_faults: a kernel's launches
 * skipped or replaced, its barriers skipped, its shared memory 16 bytes
 * short), cpu_catches_fault() that runs a function and reports a fault
 * instead of stopping, cpu_seed() for the thread order, and
 * cuda_on_cpu.execute = 0, which checks and counts every call but computes
 * nothing (the benchmark's counts of a model too large to run here).
 * What this cannot show is what only a GPU does: its speed, its own rounding
 * (TF32, fused multiply-adds, the order cuBLAS sums in), races between
 * threads of different blocks, and races between threads of one block in the
 * fibers (make test-threads shows those). `make test-cuda` runs the real thing.
 */
#ifndef CUDA_ON_CPU_H
#define CUDA_ON_CPU_H

#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#ifdef TRANSFORMER_MPI
#include <mpi.h>   // ncclAllReduce's sums between the ranks
#endif
#ifdef CUDA_ON_CPU_THREADS
#include <pthread.h>
#else
#include <ucontext.h>
#endif

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)   // nvcc's: make cuda checks each kernel's registers against it

// ---- AddressSanitizer and fibers ----------------------------------------------
// A switch from one stack to another is announced to AddressSanitizer, which
// otherwise takes the other stack for an overflow of this one.
#if defined(__SANITIZE_ADDRESS__)
#define CPU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CPU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) && !defined(CUDA_ON_CPU_THREADS)
#error "ThreadSanitizer needs the threads of cuda_on_cpu.h: build with -DCUDA_ON_CPU_THREADS"
#endif
#ifdef CPU_ASAN
void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size);
void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old,
                                     size_t *size_old);
#endif

// ---- dim3, the thread's indices, the kernels' argument packs ------------------

typedef struct {
    unsigned x, y, z;
} dim3;
// Each thread's own: in the fiber build the scheduler sets them before a thread runs or resumes.
static _Thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

static inline dim3 cpu_dim3_same(dim3 d) { return d; }
static inline dim3 cpu_dim3_x(unsigned x) {
    dim3 d = { x, 1, 1 };
    return d;
}
// A launch's grid or block: a dim3, or a number of blocks or threads along x.
#define CPU_DIM3(v) _Generic((v), dim3: cpu_dim3_same, default: cpu_dim3_x)(v)
// Four floats loaded or stored at once (a 16-byte access: its address must be
// 16-byte aligned, which cpu_check_aligned16 checks where a kernel makes one)
typedef struct {
    float x, y, z, w;
} float4;

// CPU_KERNEL(kernel, T1, T2, ...): the struct kernel_cpu_args { T1 a2; T2 a1; } holding
// one launch's arguments (members numbered down), and kernel_cpu_thread(args), which
// calls kernel(args->a2, args->a1) as one thread. Up to 20 parameters.
#define CPU_COUNT(...)                                                  \
    CPU_COUNT_(__VA_ARGS__, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, \
               9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define CPU_COUNT_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, \
                   _18, _19, _20, n, ...) n
#define CPU_CAT(a, b) CPU_CAT_(a, b)
#define CPU_CAT_(a, b) a##b
#define CPU_MEMBERS_1(t) t a1;
#define CPU_MEMBERS_2(t, ...) t a2; CPU_MEMBERS_1(__VA_ARGS__)
#define CPU_MEMBERS_3(t, ...) t a3; CPU_MEMBERS_2(__VA_ARGS__)
#define CPU_MEMBERS_4(t, ...) t a4; CPU_MEMBERS_3(__VA_ARGS__)
#define CPU_MEMBERS_5(t, ...) t a5; CPU_MEMBERS_4(__VA_ARGS__)
#define CPU_MEMBERS_6(t, ...) t a6; CPU_MEMBERS_5(__VA_ARGS__)
#define CPU_MEMBERS_7(t, ...) t a7; CPU_MEMBERS_6(__VA_ARGS__)
#define CPU_MEMBERS_8(t, ...) t a8; CPU_MEMBERS_7(__VA_ARGS__)
#define CPU_MEMBERS_9(t, ...) t a9; CPU_MEMBERS_8(__VA_ARGS__)
#define CPU_MEMBERS_10(t, ...) t a10; CPU_MEMBERS_9(__VA_ARGS__)
#define CPU_MEMBERS_11(t, ...) t a11; CPU_MEMBERS_10(__VA_ARGS__)
#define CPU_MEMBERS_12(t, ...) t a12; CPU_MEMBERS_11(__VA_ARGS__)
#define CPU_MEMBERS_13(t, ...) t a13; CPU_MEMBERS_12(__VA_ARGS__)
#define CPU_MEMBERS_14(t, ...) t a14; CPU_MEMBERS_13(__VA_ARGS__)
#define CPU_MEMBERS_15(t, ...) t a15; CPU_MEMBERS_14(__VA_ARGS__)
#define CPU_MEMBERS_16(t, ...) t a16; CPU_MEMBERS_15(__VA_ARGS__)
#define CPU_MEMBERS_17(t, ...) t a17; CPU_MEMBERS_16(__VA_ARGS__)
#define CPU_MEMBERS_18(t, ...) t a18; CPU_MEMBERS_17(__VA_ARGS__)
#define CPU_MEMBERS_19(t, ...) t a19; CPU_MEMBERS_18(__VA_ARGS__)
#define CPU_MEMBERS_20(t, ...) t a20; CPU_MEMBERS_19(__VA_ARGS__)
#define CPU_VALUES_1(t) a->a1
#define CPU_VALUES_2(t, ...) a->a2, CPU_VALUES_1(__VA_ARGS__)
#define CPU_VALUES_3(t, ...) a->a3, CPU_VALUES_2(__VA_ARGS__)
#define CPU_VALUES_4(t, ...) a->a4, CPU_VALUES_3(__VA_ARGS__)
#define CPU_VALUES_5(t, ...) a->a5, CPU_VALUES_4(__VA_ARGS__)
#define CPU_VALUES_6(t, ...) a->a6, CPU_VALUES_5(__VA_ARGS__)
#define CPU_VALUES_7(t, ...) a->a7, CPU_VALUES_6(__VA_ARGS__)
#define CPU_VALUES_8(t, ...) a->a8, CPU_VALUES_7(__VA_ARGS__)
#define CPU_VALUES_9(t, ...) a->a9, CPU_VALUES_8(__VA_ARGS__)
#define CPU_VALUES_10(t, ...) a->a10, CPU_VALUES_9(__VA_ARGS__)
#define CPU_VALUES_11(t, ...) a->a11, CPU_VALUES_10(__VA_ARGS__)
#define CPU_VALUES_12(t, ...) a->a12, CPU_VALUES_11(__VA_ARGS__)
#define CPU_VALUES_13(t, ...) a->a13, CPU_VALUES_12(__VA_ARGS__)
#define CPU_VALUES_14(t, ...) a->a14, CPU_VALUES_13(__VA_ARGS__)
#define CPU_VALUES_15(t, ...) a->a15, CPU_VALUES_14(__VA_ARGS__)
#define CPU_VALUES_16(t, ...) a->a16, CPU_VALUES_15(__VA_ARGS__)
#define CPU_VALUES_17(t, ...) a->a17, CPU_VALUES_16(__VA_ARGS__)
#define CPU_VALUES_18(t, ...) a->a18, CPU_VALUES_17(__VA_ARGS__)
#define CPU_VALUES_19(t, ...) a->a19, CPU_VALUES_18(__VA_ARGS__)
#define CPU_VALUES_20(t, ...) a->a20, CPU_VALUES_19(__VA_ARGS__)

#define CPU_KERNEL(kernel, ...)                                                              \
    typedef struct {                                                                         \
        CPU_CAT(CPU_MEMBERS_, CPU_COUNT(__VA_ARGS__))(__VA_ARGS__)                           \
    } kernel##_cpu_args;                                                                     \
    static void kernel##_cpu_thread(const void *args) {                                      \
        const kernel##_cpu_args *a = (const kernel##_cpu_args *)args;                        \
        kernel(CPU_CAT(CPU_VALUES_, CPU_COUNT(__VA_ARGS__))(__VA_ARGS__));                   \
    }                                                                                        \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&kernel), void (*)(__VA_ARGS__)), \
                   "CPU_KERNEL(" #kernel ", ...): the types differ from the kernel's parameters");

// ---- bf16 (cuda_bf16.h) ----------------------------------------------------------

// fp32's upper 16 bits: sign, 8 exponent bits, 7 stored significand bits.
typedef struct {
    unsigned short x;
} __nv_bfloat16;

// Round to nearest, ties to even: add half an ulp of the kept bits less one,
// plus the lowest kept bit (so that an exact tie rounds to the even one), and
// drop the 16 low bits; a carry out of the significand raises the exponent,
// and past the largest finite number gives infinity. Any NaN gives 0x7FFF
// (CUDA's canonical NaN: a NaN whose payload sat in the low bits alone would
// otherwise truncate to infinity).
static inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    __nv_bfloat16 h;
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        h.x = 0x7fff;
        return h;
    }
    bits += 0x7fffu + ((bits >> 16) & 1u);
    h.x = (unsigned short)(bits >> 16);
    return h;
}
static inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t bits = (uint32_t)h.x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

// ---- errors -------------------------------------------------------------------

typedef enum {
    cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9, cudaErrorIllegalState = 401,
    cudaErrorIllegalAddress = 700, cudaErrorMisalignedAddress = 716,
    cudaErrorStreamCaptureUnsupported = 900, cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureUnmatched = 903, cudaErrorStreamCaptureUnjoined = 904,
    cudaErrorStreamCaptureIsolation = 905, cudaErrorStreamCaptureImplicit = 906
} cudaError_t;

static inline const char *cudaGetErrorString(cudaError_t error) {
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is "
                                                   "capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error "
                                                   "during capture";
    case cudaErrorStreamCaptureUnmatched: return "the capture was not initiated in this stream";
    case cudaErrorStreamCaptureUnjoined: return "the capture sequence contains a fork that was "
                                                "not joined to the primary stream";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in "
                                                 "another stream";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend "
                                                "on a capturing blocking stream";
    }
    return "unknown error";
}

// ---- the emulator's state -----------------------------------------------------

// A tensor a program carved out of an allocation and named (cpu_guard_tensor):
// [start, start + bytes), then a page that no kernel, copy or cuBLAS call may touch.
typedef struct {
    const char *name;
    char *start;
    size_t bytes;
} CpuTensor;

typedef struct {
    char *start;          // its pages: [start, start + span), then a page never made readable
    size_t span;
    char *pointer;        // what cudaMalloc returned: its last byte ends the span (to 256 bytes)
    size_t bytes;         // asked for
    CpuTensor *tensors;   // carved inside it, in address order; none: the allocation is one region
    int tensor_count, tensor_capacity;
} CpuAllocation;

// Faults the tests inject, to show that a check catches them (NULL: none).
static struct {
    const char *launch_skipped;            // every launch of the kernel named here does nothing
    const char *barriers_skipped;          // __syncthreads and __syncwarp do nothing in this kernel
    const char *shared_memory_short;       // this kernel gets 16 bytes less shared memory
                                           // than it asks
                                           // (a multiple of 16 keeps the alignment a GPU gives)
    const char *launch_replaced;           // this kernel's threads run another kernel's of the same
    void (*replacement)(const void *args); //   parameters instead (its kernel_cpu_thread)
    const void *wait_skipped;              // cudaStreamWaitEvent for this event (a cudaEvent_t)
                                           // does nothing, outside a capture (a missing wait)
    int readers_joins_skipped;             // transformer_cuda.cu's
                                           // gpu_join_side_readers does nothing
    int epilogues_skipped;                 // cublasLtMatmul computes the
                                           // product without its epilogue
    unsigned epilogue_refused;             // cublasLt's heuristic offers no
                                           // algorithm for this epilogue
    int lt_matmul_refused;                 // cublasLtMatmul answers CUBLAS_STATUS_NOT_SUPPORTED
} cpu_test_faults;

// One piece of work a stream runs, as a graph records it: a kernel launch
// (its arguments copied), a cuBLAS call (its scalars read, as cuBLAS reads
// host scalars at the call), a copy of `height` rows of `width` bytes, rows
// `to_pitch` and `from_pitch` apart (one row: a plain copy), or a memset of
// `width` bytes to `value`.
typedef struct {
    const char *call;
    void *handle;   // a cublasHandle_t
    int transa, transb, m, n, k, lda, ldb, ldc, count;
    float alpha, beta;
    const void *A, *B;   // fp32, or bf16 when ab_bf16 (cublasGemmEx)
    float *C;
    long long stride_a, stride_b, stride_c;
    int ab_bf16;
    // cublasLtMatmul's epilogue (0: none; cuBLASLt's values otherwise), its
    // bias (or bias gradient) and its ReLU bit mask, aux_ld bits a column
    int epilogue;
    float *bias;
    unsigned char *aux;
    long long aux_ld;
} CpuGemm;
typedef enum {
    CPU_WORK_KERNEL, CPU_WORK_GEMM, CPU_WORK_COPY, CPU_WORK_MEMSET, CPU_WORK_ALL_REDUCE
} CpuWorkKind;
struct CpuNcclComm;
// What a piece of work waits for: in a graph, the nodes (their indices) before
// it; in the work given to streams and not yet run, the pieces (their numbers,
// cuda_on_cpu.pending_base on) before it. A stream's frontier is what its next
// piece waits for; an event holds a copy of one.
#define CPU_MOST_DEPENDENCIES 16
typedef struct {
    int count;
    long long on[CPU_MOST_DEPENDENCIES];
} CpuFrontier;
typedef struct {
    CpuWorkKind kind;
    int lane;               // the number of the stream it was given to (0: the legacy stream)
    CpuFrontier after;      // what it waits for
    int done, needed;       // (cpu_run_pending's)
    const char *call;   // a copy's or memset's name, for messages
    const char *kernel;
    void (*thread)(const void *);
    void *args;
    size_t args_size;
    dim3 grid, block;
    size_t shared_bytes;
    CpuGemm gemm;
    void *to;
    const void *from;
    size_t to_pitch, from_pitch, width, height;
    int copy_kind, value;
    struct CpuNcclComm *comm;   // an all-reduce's (`width` floats from `from` summed into `to`)
} CpuWork;
typedef struct CpuGraph {
    CpuWork *work;
    int count, capacity;
} CpuGraph;
typedef struct CpuGraph *cudaGraph_t;
typedef CpuWork *cudaGraphNode_t;
typedef struct {
    unsigned char from_port, to_port, type, reserved[5];
} cudaGraphEdgeData;
// An executable graph: its nodes, and those no other node waits for (what the
// launching stream's later work waits for)
typedef struct CpuGraphExec {
    CpuGraph graph;
    CpuFrontier sinks;
} *cudaGraphExec_t;
// A stream: `number` names it in the work it is given (its lane); `after` is
// its frontier among the work not yet run. Between cudaStreamBeginCapture and
// cudaStreamEndCapture (the origin), or from its wait for an event recorded in
// a capturing stream (a fork) to the capture's end, it captures into `graph`,
// its frontier there `capture_after`; the origin's `spoilt`: a call the
// capture refused.
typedef struct CpuStream {
    int number, capturing, spoilt;
    CpuGraph *graph;
    CpuFrontier after, capture_after;
} *cudaStream_t;   // NULL: the legacy stream
// An event: the frontier of the stream it was last recorded in, at the record
// (inside a capture: nodes of the graph of capture number `capture`; 0: none)
typedef struct CpuEvent {
    int recorded;
    long capture;
    CpuFrontier at;
} *cudaEvent_t;
enum { cudaEventDefault = 0, cudaEventBlockingSync = 1, cudaEventDisableTiming = 2 };

static struct {
    int ready;
    int execute;                  // 1: compute; 0: check and count only (the benchmark's --count)
    uint64_t random;              // the thread order's generator
    size_t page;
    int zero_file;                // /dev/zero, mapped for memory
    char *reserved;               // device memory's address range, unreadable unless open
    size_t reserved_size, reserved_used;
    CpuAllocation *allocations;   // the live ones
    int allocation_count, allocation_capacity;
    const char *open_for;         // the copy, kernel or cuBLAS call that
                                  // device memory is open for; NULL: closed
    int held_open;                // without a key: cpu_run_pending keeps
                                  // memory open between its pieces
    void *running_args;           // the legacy stream's piece running now:
                                  // its arguments (a caught fault frees them)
    struct {
        char *start;
        size_t bytes;
    } *pinned;   // cudaMallocHost's blocks
    int pinned_count, pinned_capacity;
    cudaStream_t capturing;       // the stream that began the capture under
                                  // way (one at a time here); NULL: none
    long captures;                // the captures begun: the number of the one under way
    cudaStream_t *streams;        // the live ones
    int stream_count, stream_capacity, streams_made;
    // the work given to streams and not run yet, its pieces numbered pending_base on
    CpuWork *pending;
    int pending_count, pending_capacity, running_pending;
    long long pending_base;
    void **handles;               // the live cuBLAS handles (cublasHandle_t)
    int handle_count, handle_capacity;
    cudaError_t last_error, sticky_error;
    char message[512];            // the last fault or refusal, said in full
    sigjmp_buf recovery;          // cpu_catches_fault's
    volatile sig_atomic_t catching;
    struct sigaction earlier_segv;
    int pkey;                     // the protection key of device memory's
                                  // pages; -1: none (mprotect instead)
    char *shared_region;          // shared memory: a guard page, a marked
                                  // band, a block's bytes, a guard page
    size_t shared_region_size;
    struct {
        size_t pages;
        char *region;
    } shared_regions[8];   // one such region per size, in pages
    int shared_region_count;
    struct {
        const char *kernel;
        int bytes;
    } shared_opt_in[32];
    int shared_opt_in_count;
} cuda_on_cpu = { .execute = 1, .zero_file = -1, .pkey = -1 };

static inline void cpu_seed(uint64_t seed) {
    cuda_on_cpu.random = seed * 0x9E3779B97F4A7C15ULL + 1;
}

// splitmix64: the next random number below n
static inline unsigned cpu_random_below(unsigned n) {
    uint64_t z = (cuda_on_cpu.random += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return (unsigned)((z ^ (z >> 31)) % n);
}

static inline _Noreturn void cpu_die(const char *what) {
    fprintf(stderr, "error: cuda_on_cpu.h: %s\n", what);
    abort();
}

// Anonymous memory (POSIX has /dev/zero; MAP_ANONYMOUS is not in _POSIX_C_SOURCE).
static inline char *cpu_map(char *at, size_t bytes, int protection) {
    void *p = mmap(at, bytes, protection, MAP_PRIVATE | (at ? MAP_FIXED : 0), cuda_on_cpu.zero_file,
                   0);
    return p == MAP_FAILED ? NULL : (char *)p;
}

static inline void cpu_protect(char *start, size_t bytes, int protection) {
    if (mprotect(start, bytes, protection) != 0)
        cpu_die("mprotect failed");
}

// Grows a list of `size`-byte items to hold one more (C has no templates).
static inline void *cpu_grow(void *list, int count, int *capacity, size_t size, const char *what) {
    if (count < *capacity)
        return list;
    *capacity = *capacity ? 2 * *capacity : 16;
    list = realloc(list, (size_t)*capacity * size);
    if (!list)
        cpu_die(what);
    return list;
}

// Memory protection keys (x86's PKU, Linux 4.9 on, glibc 2.27 on): weak, so
// that the emulator builds and runs where they are missing (then NULL).
int pkey_alloc(unsigned int flags, unsigned int access_rights) __attribute__((weak));
int pkey_set(int pkey, unsigned int access_rights) __attribute__((weak));
int pkey_mprotect(void *address, size_t bytes, int protection, int pkey) __attribute__((weak));
#define CPU_PKEY_DISABLE_ACCESS 1u

static inline _Noreturn void cpu_fault(cudaError_t error, const char *format, ...);
static inline void cpu_fault_finish(int in_launch);
static inline void cpu_fault_after_block(cudaError_t error, const char *format, ...);
static inline void cpu_segv(int signal_number, siginfo_t *info, void *context);
static inline void cpu_run_pending(const CpuFrontier *until);
static inline void cpu_drop_pending(void);

static inline void cpu_start(void) {
    if (cuda_on_cpu.ready)
        return;
    cuda_on_cpu.ready = 1;
    cuda_on_cpu.page = (size_t)sysconf(_SC_PAGESIZE);
    cuda_on_cpu.zero_file = open("/dev/zero", O_RDWR);
    if (cuda_on_cpu.zero_file < 0)
        cpu_die("cannot open /dev/zero");
    // Address space only (nothing is committed until an allocation is opened):
    // 256 GB, or as much as the system allows.
    size_t *size = &cuda_on_cpu.reserved_size;
    for (*size = (size_t)1 << 38; *size >= ((size_t)1 << 30); *size /= 2)
        if ((cuda_on_cpu.reserved = cpu_map(NULL, *size, PROT_NONE)) != NULL)
            break;
    if (!cuda_on_cpu.reserved)
        cpu_die("cannot reserve address space for device memory");
    // Closing and opening device memory happens at every kernel, copy and
    // cuBLAS call: with a protection key it is one write of this thread's key
    // register, no system call (CUDA_ON_CPU_NO_PKEYS=1: mprotect, as where there are none).
    if (pkey_alloc && pkey_set && pkey_mprotect && !getenv("CUDA_ON_CPU_NO_PKEYS"))
        cuda_on_cpu.pkey = pkey_alloc(0, CPU_PKEY_DISABLE_ACCESS);
    const char *seed = getenv("CUDA_ON_CPU_SEED");
    if (!cuda_on_cpu.random)
        cpu_seed(seed ? strtoull(seed, NULL, 10) : 1);
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = cpu_segv;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;   // NODEFER: the handler may jump out of itself
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &cuda_on_cpu.earlier_segv);
}

// The page size, in bytes: a program that carves tensors for cpu_guard_tensor lays them out by it.
static inline size_t cpu_page_bytes(void) {
    cpu_start();
    return cuda_on_cpu.page;
}

// ---- device memory --------------------------------------------------------------

static inline size_t cpu_round_up(size_t n, size_t unit) { return (n + unit - 1) / unit * unit; }

// Device memory is closed (unreadable) except while a copy, a kernel or a
// cuBLAS call runs. With a protection key every device page carries the key,
// each guard page is PROT_NONE for good, and opening or closing is one write
// of the thread's key register. Without one, each allocation's pages are
// mprotect-ed: closed at once, opened piece by piece around its guard pages.
static inline void cpu_key_access(int open) {
    if (pkey_set(cuda_on_cpu.pkey, open ? 0 : CPU_PKEY_DISABLE_ACCESS) != 0)
        cpu_die("pkey_set failed");
}
static inline void cpu_key_protect(char *start, size_t bytes, int protection) {
    if (pkey_mprotect(start, bytes, protection, cuda_on_cpu.pkey) != 0)
        cpu_die("pkey_mprotect failed");
}

// An allocation's pages readable and writable, except each named tensor's guard page (no key).
static inline void cpu_open_allocation(const CpuAllocation *a) {
    char *from = a->start;
    for (int t = 0; t < a->tensor_count; t++) {
        char *guard = a->tensors[t].start + a->tensors[t].bytes;
        if (guard > from)
            cpu_protect(from, (size_t)(guard - from), PROT_READ | PROT_WRITE);
        from = guard + cuda_on_cpu.page;
    }
    if (a->start + a->span > from)
        cpu_protect(from, (size_t)(a->start + a->span - from), PROT_READ | PROT_WRITE);
}

// Device memory readable and writable for `what` (a copy, a kernel, a cuBLAS
// call), or unreadable again (what NULL).
static inline void cpu_device_open(const char *what) {
    int was_open = cuda_on_cpu.open_for != NULL;
    if (!what && cuda_on_cpu.held_open) {   // between two pieces of the streams' work: stays open
        cuda_on_cpu.open_for = "the streams' work";
        return;
    }
    cuda_on_cpu.open_for = what;
    if (!cuda_on_cpu.execute || was_open == (what != NULL))
        return;
    if (cuda_on_cpu.pkey >= 0) {
        cpu_key_access(what != NULL);
        return;
    }
    for (int i = 0; i < cuda_on_cpu.allocation_count; i++) {
        const CpuAllocation *a = &cuda_on_cpu.allocations[i];
        if (what)
            cpu_open_allocation(a);
        else
            cpu_protect(a->start, a->span, PROT_NONE);
    }
}

// Without a protection key, opening and closing is mprotect over every page of
// device memory, a system call whose time grows with the pages (at a training
// step's hundreds of pieces, most of the tests' time). The streams' pending
// work runs no host code between its pieces, so cpu_run_pending holds memory
// open from its first piece to its last (hold 1) and closes it once (hold 0).
// With a key each piece still opens and closes it, as that costs nothing.
static inline void cpu_device_hold(int hold) {
    if (cuda_on_cpu.pkey >= 0)
        return;
    if (hold) {
        cpu_device_open("the streams' work");
        cuda_on_cpu.held_open = 1;
        return;
    }
    cuda_on_cpu.held_open = 0;
    cpu_device_open(NULL);
}

// The live allocation whose pages hold p (its guard pages included), or NULL.
static inline CpuAllocation *cpu_allocation_at(const void *p) {
    const char *c = (const char *)p;
    for (int i = 0; i < cuda_on_cpu.allocation_count; i++) {
        CpuAllocation *a = &cuda_on_cpu.allocations[i];
        if (c >= a->start && c < a->start + a->span)
            return a;
    }
    return NULL;
}

// The region [p, p + bytes) must stay in: the named tensor of an allocation
// that holds p, or the allocation when it has none; NULL when p is in neither
// (outside every allocation, or in a guard page). *end is where it ends.
static inline const char *cpu_region_of(const void *p, const char **end, const char **tensor_name) {
    const char *c = (const char *)p;
    const CpuAllocation *a = cpu_allocation_at(p);
    *tensor_name = NULL;
    if (!a || c < a->pointer)
        return NULL;
    if (a->tensor_count == 0) {
        *end = a->pointer + a->bytes;
        return a->pointer;
    }
    for (int t = 0; t < a->tensor_count; t++) {
        const CpuTensor *x = &a->tensors[t];
        if (c >= x->start && c <= x->start + x->bytes) {
            *end = x->start + x->bytes;
            *tensor_name = x->name;
            return x->start;
        }
    }
    return NULL;
}

// Whether [p, p + bytes) lies inside one region (cpu_region_of); if not, `why`
// gets the tensor or allocation it reaches out of.
static inline int cpu_inside_region(const void *p, size_t bytes, char *why, size_t why_size) {
    const char *end, *name;
    const char *start = cpu_region_of(p, &end, &name);
    if (start && bytes <= (size_t)(end - (const char *)p))
        return 1;
    if (!start)
        snprintf(why, why_size, "outside every device allocation and tensor");
    else if (name)
        snprintf(why, why_size, "outside tensor %s (%zu bytes) of its device allocation", name,
                 (size_t)(end - start));
    else
        snprintf(why, why_size, "outside its device allocation (%zu bytes)", (size_t)(end - start));
    return 0;
}

static inline int cpu_in_reserved(const void *p) {
    const char *c = (const char *)p, *start = cuda_on_cpu.reserved;
    return start && c >= start && c < start + cuda_on_cpu.reserved_size;
}

// For a program that carves tensors out of one allocation (transformer_cuda.cu's
// carve): the `bytes` at start are a tensor called `name`, and the page after
// them a guard no kernel, copy or cuBLAS call may touch. The tensor must end
// where a page starts, that page must be in the allocation, and tensors must
// be named in address order. cpu_forget_tensors(allocation) drops them all
// (before the allocation is carved again another way).
static inline void cpu_guard_tensor(const void *start, size_t bytes, const char *name) {
    cpu_run_pending(NULL);   // the work given before runs with the guards it was given under
    char *c = (char *)start;
    CpuAllocation *a = cpu_allocation_at(start);
    if (!a || c + bytes < a->pointer || c + bytes + cuda_on_cpu.page > a->start + a->span)
        cpu_die("cpu_guard_tensor: the tensor and its guard page are not inside one allocation");
    if ((uintptr_t)(c + bytes) % cuda_on_cpu.page != 0)
        cpu_die("cpu_guard_tensor: the tensor does not end at a page");
    if (a->tensor_count > 0) {
        const CpuTensor *last = &a->tensors[a->tensor_count - 1];
        if (c < last->start + last->bytes + cuda_on_cpu.page)
            cpu_die("cpu_guard_tensor: tensors out of address order");
    }
    a->tensors = (CpuTensor *)cpu_grow(a->tensors, a->tensor_count, &a->tensor_capacity,
                                       sizeof(CpuTensor), "out of memory for the list of tensors");
    CpuTensor t = { name, c, bytes };
    a->tensors[a->tensor_count++] = t;
    if (!cuda_on_cpu.execute)
        return;
    if (cuda_on_cpu.pkey >= 0)
        cpu_key_protect(c + bytes, cuda_on_cpu.page, PROT_NONE);
    else if (cuda_on_cpu.open_for)
        cpu_protect(c + bytes, cuda_on_cpu.page, PROT_NONE);
}
static inline void cpu_forget_tensors(const void *allocation) {
    cpu_run_pending(NULL);
    CpuAllocation *a = cpu_allocation_at(allocation);
    if (!a)
        return;
    for (int t = 0; t < a->tensor_count && cuda_on_cpu.execute && cuda_on_cpu.pkey >= 0; t++)
        cpu_key_protect(a->tensors[t].start + a->tensors[t].bytes, cuda_on_cpu.page,
                        PROT_READ | PROT_WRITE);
    a->tensor_count = 0;
}

// The capture under way refuses `call` (it would not be recorded, or it waits
// for the GPU: cudaStreamCaptureModeGlobal) and is spoilt; cudaSuccess when
// no capture is under way.
static inline cudaError_t cpu_capture_forbids(const char *call) {
    if (!cuda_on_cpu.capturing)
        return cudaSuccess;
    cuda_on_cpu.capturing->spoilt = 1;
    snprintf(cuda_on_cpu.message, sizeof cuda_on_cpu.message, "%s while a stream captures a graph: "
             "a GPU refuses it (cudaStreamCaptureModeGlobal), and the capture fails", call);
    return cudaErrorStreamCaptureUnsupported;
}

// Every allocation is its own pages, its end at their end, then a page never
// mapped readable; it is filled with the float NaN bit pattern (int buffers
// too, which the companion always writes before reading): never written means
// never valid. Freed pages are mapped anew, unreadable, and never reused.
static inline cudaError_t cudaMalloc(void **pointer, size_t bytes) {
    cpu_start();
    *pointer = NULL;
    cudaError_t refused = cpu_capture_forbids("cudaMalloc");
    if (refused)
        return refused;
    if (cuda_on_cpu.sticky_error)
        return cuda_on_cpu.sticky_error;
    size_t rounded = cpu_round_up(bytes ? bytes : 1, 256),
           span = cpu_round_up(rounded, cuda_on_cpu.page);
    if (span + cuda_on_cpu.page > cuda_on_cpu.reserved_size - cuda_on_cpu.reserved_used)
        return cudaErrorMemoryAllocation;
    cuda_on_cpu.allocations =
        (CpuAllocation *)cpu_grow(cuda_on_cpu.allocations, cuda_on_cpu.allocation_count,
                                  &cuda_on_cpu.allocation_capacity, sizeof(CpuAllocation),
                                  "out of memory for the list of allocations");
    CpuAllocation a = { cuda_on_cpu.reserved + cuda_on_cpu.reserved_used, span, NULL, bytes, NULL,
                        0, 0 };
    a.pointer = a.start + span - rounded;
    cuda_on_cpu.reserved_used += span + cuda_on_cpu.page;
    if (cuda_on_cpu.execute) {
        int key = cuda_on_cpu.pkey >= 0;
        int opened = key
                     ? pkey_mprotect(a.start, span, PROT_READ | PROT_WRITE, cuda_on_cpu.pkey) == 0
                     : mprotect(a.start, span, PROT_READ | PROT_WRITE) == 0;
        if (!opened) {   // more than the host's memory (ENOMEM):
                         // the answer cudaMalloc gives on a GPU
            cuda_on_cpu.reserved_used -= span + cuda_on_cpu.page;
            return cudaErrorMemoryAllocation;
        }
        if (key)
            cpu_key_access(1);
        float *f = (float *)a.pointer;
        for (size_t i = 0; i < rounded / sizeof(float); i++) f[i] = NAN;
        if (key)
            cpu_key_access(cuda_on_cpu.open_for != NULL);
        else
            cpu_protect(a.start, span, cuda_on_cpu.open_for ? PROT_READ | PROT_WRITE : PROT_NONE);
    }
    cuda_on_cpu.allocations[cuda_on_cpu.allocation_count++] = a;
    *pointer = a.pointer;
    return cudaSuccess;
}

static inline cudaError_t cudaFree(void *pointer) {
    if (!pointer)
        return cudaSuccess;
    cudaError_t refused = cpu_capture_forbids("cudaFree");
    if (refused)
        return refused;
    cpu_run_pending(NULL);   // cudaFree waits for the GPU
    for (int i = 0; i < cuda_on_cpu.allocation_count; i++) {
        CpuAllocation *a = &cuda_on_cpu.allocations[i];
        if (a->pointer != (char *)pointer)
            continue;
        if (!cpu_map(a->start, a->span, PROT_NONE))
            cpu_die("cannot unmap freed device memory");
        free(a->tensors);
        *a = cuda_on_cpu.allocations[--cuda_on_cpu.allocation_count];
        return cudaSuccess;
    }
    return cudaErrorInvalidValue;   // not from cudaMalloc, or freed already
}

// Page-locked host memory (cudaMallocHost): plain memory here, listed, because
// a graph may copy only from or to such memory.
static inline cudaError_t cudaMallocHost(void **pointer, size_t bytes) {
    cpu_start();
    *pointer = NULL;
    cudaError_t refused = cpu_capture_forbids("cudaMallocHost");
    if (refused)
        return refused;
    char *block = (char *)malloc(bytes ? bytes : 1);
    if (!block)
        return cudaErrorMemoryAllocation;
    cuda_on_cpu.pinned = cpu_grow(cuda_on_cpu.pinned, cuda_on_cpu.pinned_count,
                                  &cuda_on_cpu.pinned_capacity, sizeof *cuda_on_cpu.pinned,
                                  "out of memory for the list of host blocks");
    cuda_on_cpu.pinned[cuda_on_cpu.pinned_count].start = block;
    cuda_on_cpu.pinned[cuda_on_cpu.pinned_count++].bytes = bytes;
    *pointer = block;
    return cudaSuccess;
}
static inline cudaError_t cudaFreeHost(void *pointer) {
    if (!pointer)
        return cudaSuccess;
    cudaError_t refused = cpu_capture_forbids("cudaFreeHost");
    if (refused)
        return refused;
    cpu_run_pending(NULL);
    for (int i = 0; i < cuda_on_cpu.pinned_count; i++)
        if (cuda_on_cpu.pinned[i].start == (char *)pointer) {
            free(pointer);
            cuda_on_cpu.pinned[i] = cuda_on_cpu.pinned[--cuda_on_cpu.pinned_count];
            return cudaSuccess;
        }
    return cudaErrorInvalidValue;
}
static inline int cpu_pinned(const void *p, size_t bytes) {
    const char *c = (const char *)p;
    for (int i = 0; i < cuda_on_cpu.pinned_count; i++)
        if (c >= cuda_on_cpu.pinned[i].start && bytes <= cuda_on_cpu.pinned[i].bytes &&
            c - cuda_on_cpu.pinned[i].start <= (ptrdiff_t)(cuda_on_cpu.pinned[i].bytes - bytes))
            return 1;
    return 0;
}

// A copy's or a memset's device side: all of it inside one region
// (an allocation, or a tensor of one).
static inline cudaError_t cpu_check_device(const void *p, size_t bytes, const char *call,
                                           const char *side) {
    if (cuda_on_cpu.sticky_error)
        return cuda_on_cpu.sticky_error;
    char why[160];
    if (bytes == 0 || cpu_inside_region(p, bytes, why, sizeof why))
        return cudaSuccess;
    snprintf(cuda_on_cpu.message, sizeof cuda_on_cpu.message,
             "%s: its %s (%p, %zu bytes) reaches %s", call, side, p, bytes, why);
    return cudaErrorInvalidValue;
}

// A copy's host side: host memory, not device memory.
static inline cudaError_t cpu_check_host(const void *p, size_t bytes, const char *call,
                                         const char *side) {
    if (bytes == 0 || !cpu_in_reserved(p))
        return cudaSuccess;
    snprintf(cuda_on_cpu.message, sizeof cuda_on_cpu.message,
             "%s: its %s (%p) is device memory, where host memory is expected", call, side, p);
    return cudaErrorInvalidValue;
}

typedef enum {
    cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2, cudaMemcpyDeviceToDevice = 3
} cudaMemcpyKind;

// The two sides of a copy of `bytes` bytes (its last row, for cudaMemcpy2D: first..last).
static inline cudaError_t cpu_check_copy(void *to, size_t to_bytes, const void *from,
                                         size_t from_bytes, cudaMemcpyKind kind, const char *call) {
    cudaError_t e = kind == cudaMemcpyDeviceToHost
                    ? cpu_check_host(to, to_bytes, call, "destination")
                    : cpu_check_device(to, to_bytes, call, "destination");
    if (e == cudaSuccess)
        e = kind == cudaMemcpyHostToDevice ? cpu_check_host(from, from_bytes, call, "source")
                                           : cpu_check_device(from, from_bytes, call, "source");
    return e;
}

// ---- streams, events and graph capture ------------------------------------------

// The capture under way is spoilt: cudaStreamEndCapture will fail.
static inline void cpu_spoil_capture(void) {
    if (cuda_on_cpu.capturing)
        cuda_on_cpu.capturing->spoilt = 1;
}

// Where work given to stream s goes: 1, into the graph s is capturing; 0, to
// the stream (the legacy stream runs it now); -1, refused, with *refusal
// the error: while a capture is under way, the legacy stream (it would wait
// for the capture's work, which never runs: cudaErrorStreamCaptureImplicit),
// or a stream that is not part of the capture. A GPU runs the latter's work
// at once and not at the graph's replays; the emulator refuses it, since it
// is a fork that was forgotten (the stream never waited for an event recorded
// in a capturing stream). Either spoils the capture.
static inline int cpu_stream_route(cudaStream_t s, const char *call, cudaError_t *refusal) {
    if (s && s->capturing)
        return 1;
    if (!cuda_on_cpu.capturing)
        return 0;
    cpu_spoil_capture();
    if (s) {
        *refusal = cudaErrorStreamCaptureIsolation;
        snprintf(cuda_on_cpu.message, sizeof cuda_on_cpu.message, "%s on stream %d, which is not "
                 "part of the capture under way (it waited for no event recorded in a capturing "
                 "stream): its work would run once, now, and not when the graph does; the capture "
                 "fails", call, s->number);
    } else {
        *refusal = cudaErrorStreamCaptureImplicit;
        snprintf(cuda_on_cpu.message, sizeof cuda_on_cpu.message, "%s on the legacy default stream "
                 "while a stream captures a graph (give it the capturing stream): a GPU refuses "
                 "it, and the capture fails", call);
    }
    return -1;
}

// Frontiers: `on` added to f (once); those of f that have run left out.
static inline void cpu_frontier_add(CpuFrontier *f, long long on) {
    for (int i = 0; i < f->count; i++)
        if (f->on[i] == on)
            return;
    if (f->count == CPU_MOST_DEPENDENCIES)
        cpu_die("more than 16 dependencies of one piece of work");
    f->on[f->count++] = on;
}
static inline int cpu_pending_done(long long on) {
    long long i = on - cuda_on_cpu.pending_base;
    return i < 0 || i >= cuda_on_cpu.pending_count || cuda_on_cpu.pending[i].done;
}
static inline void cpu_frontier_prune(CpuFrontier *f) {
    int kept = 0;
    for (int i = 0; i < f->count; i++)
        if (!cpu_pending_done(f->on[i]))
            f->on[kept++] = f->on[i];
    f->count = kept;
}
static inline void cpu_frontier_merge(CpuFrontier *f, const CpuFrontier *more) {
    for (int i = 0; i < more->count; i++) cpu_frontier_add(f, more->on[i]);
}

// A new node at the end of the graph s is capturing, after s's frontier there;
// s's frontier is then the node.
static inline CpuWork *cpu_record(cudaStream_t s, CpuWorkKind kind) {
    CpuGraph *g = s->graph;
    g->work = (CpuWork *)cpu_grow(g->work, g->count, &g->capacity, sizeof(CpuWork),
                                  "out of memory for a graph");
    CpuWork *w = &g->work[g->count++];
    memset(w, 0, sizeof *w);
    w->kind = kind;
    w->lane = s->number;
    w->after = s->capture_after;
    s->capture_after.count = 0;
    cpu_frontier_add(&s->capture_after, g->count - 1);
    return w;
}

// A piece of work given to stream s outside a capture, which owns w->args:
// on the legacy stream it runs now, after everything given before (a GPU's
// legacy stream waits for the other streams, and they for it); on another
// stream it waits, after s's frontier, until something needs it
// (cpu_run_pending). Returns what the legacy stream's run gave.
static inline cudaError_t cpu_work_run(const CpuWork *w);
static inline cudaError_t cpu_give(cudaStream_t s, const CpuWork *w) {
    if (!s) {
        cpu_run_pending(NULL);
        cuda_on_cpu.running_args = w->args;
        cudaError_t e = cpu_work_run(w);
        cuda_on_cpu.running_args = NULL;
        free(w->args);
        return e;
    }
    cuda_on_cpu.pending = (CpuWork *)cpu_grow(cuda_on_cpu.pending, cuda_on_cpu.pending_count,
                                              &cuda_on_cpu.pending_capacity, sizeof(CpuWork),
                                              "out of memory for the streams' work");
    CpuWork *p = &cuda_on_cpu.pending[cuda_on_cpu.pending_count++];
    *p = *w;
    p->lane = s->number;
    cpu_frontier_prune(&s->after);
    p->after = s->after;
    p->done = 0;
    s->after.count = 0;
    cpu_frontier_add(&s->after, cuda_on_cpu.pending_base + cuda_on_cpu.pending_count - 1);
    return cudaSuccess;
}

static inline cudaError_t cudaStreamCreate(cudaStream_t *s) {
    cpu_start();
    *s = (cudaStream_t)calloc(1, sizeof **s);
    if (!*s)
        return cudaErrorMemoryAllocation;
    (*s)->number = ++cuda_on_cpu.streams_made;
    cuda_on_cpu.streams = (cudaStream_t *)cpu_grow(cuda_on_cpu.streams, cuda_on_cpu.stream_count,
                                                   &cuda_on_cpu.stream_capacity,
                                                   sizeof(cudaStream_t),
                                                   "out of memory for the list of streams");
    cuda_on_cpu.streams[cuda_on_cpu.stream_count++] = *s;
    return cudaSuccess;
}

static inline void cpu_graph_free(CpuGraph *g) {
    for (int i = 0; g && i < g->count; i++) free(g->work[i].args);
    if (g)
        free(g->work);
}

static inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s)
        return cudaErrorInvalidValue;
    if (s->capturing)
        return cudaErrorIllegalState;
    cpu_run_pending(&s->after);   // its work still runs (a GPU's cudaStreamDestroy returns at once)
    for (int i = 0; i < cuda_on_cpu.stream_count; i++)
        if (cuda_on_cpu.streams[i] == s)
            cuda_on_cpu.streams[i] = cuda_on_cpu.streams[--cuda_on_cpu.stream_count];
    free(s);
    return cudaSuccess;
}

// Waiting for a stream runs the work it was given and what that waits for
// (the rest of the streams' work may run later); for the device, all of it.
// A capture forbids both. Each returns the sticky error.
static inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    cudaError_t refused = cpu_capture_forbids("cudaStreamSynchronize");
    if (refused)
        return refused;
    cpu_run_pending(s ? &s->after : NULL);
    return cuda_on_cpu.sticky_error;
}
static inline cudaError_t cudaDeviceSynchronize(void) {
    cudaError_t refused = cpu_capture_forbids("cudaDeviceSynchronize");
    if (refused)
        return refused;
    cpu_run_pending(NULL);
    return cuda_on_cpu.sticky_error;
}

// Events (their timing is not modelled: cudaEventDisableTiming or not, they only order work).
static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags) {
    *event = NULL;
    if (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming))
        return cudaErrorInvalidValue;
    *event = (cudaEvent_t)calloc(1, sizeof **event);
    return *event ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaEventCreate(cudaEvent_t *event) {
    return cudaEventCreateWithFlags(event, 0);
}
static inline cudaError_t cudaEventDestroy(cudaEvent_t event) {
    if (!event)
        return cudaErrorInvalidValue;
    free(event);
    return cudaSuccess;
}

// The event holds the stream's frontier as it is now: what a wait for it
// waits for (in a capture, nodes of the graph; on the legacy stream, which
// runs its work at once, nothing).
static inline cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t s) {
    if (!event)
        return cudaErrorInvalidValue;
    cudaError_t refusal = cudaSuccess;
    int route = cpu_stream_route(s, "cudaEventRecord", &refusal);
    if (route < 0)
        return refusal;
    event->recorded = 1;
    event->capture = route > 0 ? cuda_on_cpu.captures : 0;
    event->at.count = 0;
    if (route > 0)
        event->at = s->capture_after;
    else if (s) {
        cpu_frontier_prune(&s->after);
        event->at = s->after;
    } else
        cpu_run_pending(NULL);
    return cudaSuccess;
}

// Stream s's later work waits for what the event held at its last record.
// An event recorded in a capturing stream: s joins the capture (a fork), or,
// if it is part of it already, its frontier there grows (a join, when s is
// the origin). A capturing stream may not wait for work outside the capture
// (cudaErrorStreamCaptureIsolation), nor a stream for a capture that has ended.
static inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t event, unsigned flags) {
    if (!event || flags != 0)
        return cudaErrorInvalidValue;
    if (!event->recorded)
        return cudaSuccess;   // an event never recorded has nothing to wait for
    long capture = cuda_on_cpu.capturing ? cuda_on_cpu.captures : 0;
    if (event->capture) {
        if (event->capture != capture || !s) {
            cpu_spoil_capture();
            snprintf(cuda_on_cpu.message, sizeof cuda_on_cpu.message,
                     "cudaStreamWaitEvent: %s waits for an event recorded in a capture %s",
                     s ? "a stream" : "the legacy stream",
                     event->capture != capture ? "that has ended"
                                               : "(only a stream other than the legacy one may "
                                                 "join it)");
            return cudaErrorStreamCaptureIsolation;
        }
        if (!s->capturing) {   // the fork: s joins the capture
            s->capturing = 1;
            s->graph = cuda_on_cpu.capturing->graph;
            s->capture_after.count = 0;
        }
        cpu_frontier_merge(&s->capture_after, &event->at);
        return cudaSuccess;
    }
    if (s && s->capturing) {
        cpu_spoil_capture();
        snprintf(cuda_on_cpu.message, sizeof cuda_on_cpu.message, "cudaStreamWaitEvent: a "
                 "capturing stream waits for an event recorded outside the capture: a GPU refuses "
                 "it, and the capture fails");
        return cudaErrorStreamCaptureIsolation;
    }
    if (cpu_test_faults.wait_skipped == (const void *)event)
        return cudaSuccess;
    CpuFrontier at = event->at;
    if (!s) {   // the legacy stream's work runs at once
        cpu_run_pending(&at);
        return cudaSuccess;
    }
    cpu_frontier_prune(&s->after);
    cpu_frontier_merge(&s->after, &at);
    return cudaSuccess;
}

static inline cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    if (!event)
        return cudaErrorInvalidValue;
    cudaError_t refused = cpu_capture_forbids("cudaEventSynchronize");
    if (refused)
        return refused;
    if (event->capture)
        return cudaErrorStreamCaptureIsolation;
    CpuFrontier at = event->at;
    cpu_run_pending(&at);
    return cuda_on_cpu.sticky_error;
}

typedef enum {
    cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
} cudaStreamCaptureMode;

static inline cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
    if (!s)
        return cudaErrorStreamCaptureUnsupported;   // the legacy stream cannot capture
    if (mode != cudaStreamCaptureModeGlobal) {
        snprintf(cuda_on_cpu.message, sizeof cuda_on_cpu.message,
                 "cudaStreamBeginCapture: the emulator models cudaStreamCaptureModeGlobal only");
        return cudaErrorInvalidValue;
    }
    if (cuda_on_cpu.capturing)
        return cudaErrorIllegalState;   // one capture at a time here
    s->graph = (CpuGraph *)calloc(1, sizeof(CpuGraph));
    if (!s->graph)
        return cudaErrorMemoryAllocation;
    s->capturing = 1;
    s->spoilt = 0;
    s->capture_after.count = 0;
    cuda_on_cpu.capturing = s;
    cuda_on_cpu.captures++;
    return cudaSuccess;
}

// Whether every node of the graph is one that `origin` (a frontier of node
// indices) waits for, or comes before one that it does: a fork joined back.
static inline int cpu_graph_joined(const CpuGraph *g, const CpuFrontier *origin) {
    char *reached = (char *)calloc((size_t)g->count + 1, 1);
    int *stack = (int *)malloc(((size_t)g->count + 1) * sizeof(int)), top = 0, all = 1;
    if (!reached || !stack)
        cpu_die("out of memory for a graph's check");
    for (int i = 0; i < origin->count; i++) stack[top++] = (int)origin->on[i];
    while (top > 0) {
        int n = stack[--top];
        if (reached[n])
            continue;
        reached[n] = 1;
        for (int d = 0; d < g->work[n].after.count; d++)
            if (!reached[g->work[n].after.on[d]])
                stack[top++] = (int)g->work[n].after.on[d];
    }
    for (int i = 0; i < g->count; i++) all &= reached[i];
    free(reached);
    free(stack);
    return all;
}

// The graph recorded since cudaStreamBeginCapture on s, on s and the streams
// that joined it; each stream leaves the capture. It fails (NULL) when a
// refused call spoilt the capture (cudaErrorStreamCaptureInvalidated), or when
// a stream that joined it has work that s never waited for
// (cudaErrorStreamCaptureUnjoined, as on a GPU: a fork not joined back).
static inline cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
    *graph = NULL;
    if (!s || !s->capturing)
        return cudaErrorIllegalState;
    if (s != cuda_on_cpu.capturing) {
        cpu_spoil_capture();
        return cudaErrorStreamCaptureUnmatched;   // s joined the capture; its origin must end it
    }
    CpuGraph *g = s->graph;
    int joined = 1;
    for (int i = 0; i < cuda_on_cpu.stream_count; i++) {
        cudaStream_t member = cuda_on_cpu.streams[i];
        if (member->capturing && member->graph == g) {
            member->capturing = 0;
            member->graph = NULL;
        }
    }
    if (!s->spoilt)
        joined = cpu_graph_joined(g, &s->capture_after);
    cuda_on_cpu.capturing = NULL;
    if (s->spoilt || !joined) {
        cpu_graph_free(g);
        free(g);
        if (!joined)
            snprintf(cuda_on_cpu.message, sizeof cuda_on_cpu.message, "cudaStreamEndCapture: a "
                     "stream that joined the capture has work the capturing stream never waited "
                     "for (record an event after it and wait for that in the capturing stream)");
        return s->spoilt ? cudaErrorStreamCaptureInvalidated : cudaErrorStreamCaptureUnjoined;
    }
    *graph = g;
    return cudaSuccess;
}

static inline cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    cpu_graph_free(graph);
    free(graph);
    return cudaSuccess;
}

// The graph's nodes (nodes NULL: their count only), and its edges: a node's
// dependencies (from, to and edge_data NULL: their count only).
static inline cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes,
                                            size_t *count) {
    if (!graph || !count)
        return cudaErrorInvalidValue;
    for (size_t i = 0; nodes && i < *count && i < (size_t)graph->count; i++)
        nodes[i] = &graph->work[i];
    *count = (size_t)graph->count;
    return cudaSuccess;
}
static inline cudaError_t cudaGraphGetEdges(cudaGraph_t graph, cudaGraphNode_t *from,
                                            cudaGraphNode_t *to, cudaGraphEdgeData *edge_data,
                                            size_t *count) {
    if (!graph || !count || from || to || edge_data)
        return cudaErrorInvalidValue;   // (the count only, here)
    *count = 0;
    for (int i = 0; i < graph->count; i++) *count += (size_t)graph->work[i].after.count;
    return cudaSuccess;
}

// An executable copy of the graph (its launches' arguments copied too): the
// graph may be destroyed and the copy still runs.
static inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                               unsigned long long flags) {
    *exec = NULL;
    if (!graph || flags != 0)
        return cudaErrorInvalidValue;
    cudaGraphExec_t e = (cudaGraphExec_t)calloc(1, sizeof *e);
    if (!e)
        return cudaErrorMemoryAllocation;
    e->graph.count = e->graph.capacity = graph->count;
    e->graph.work = (CpuWork *)calloc((size_t)(graph->count ? graph->count : 1), sizeof(CpuWork));
    char *waited_for = (char *)calloc((size_t)graph->count + 1, 1);
    if (!e->graph.work || !waited_for)
        cpu_die("out of memory for a graph");
    for (int i = 0; i < graph->count; i++) {
        CpuWork *w = &e->graph.work[i];
        *w = graph->work[i];
        for (int d = 0; d < w->after.count; d++) waited_for[w->after.on[d]] = 1;
        if (!w->args)
            continue;
        w->args = malloc(w->args_size);
        if (!w->args)
            cpu_die("out of memory for a graph");
        memcpy(w->args, graph->work[i].args, w->args_size);
    }
    for (int i = 0; i < graph->count; i++)
        if (!waited_for[i])
            cpu_frontier_add(&e->sinks, i);
    free(waited_for);
    *exec = e;
    return cudaSuccess;
}

// ---- copies and memsets ---------------------------------------------------------

// A copy's bytes, once checked: `height` rows of `width` bytes, `pitch` apart on each side.
static inline void cpu_copy_run(void *to, size_t to_pitch, const void *from, size_t from_pitch,
                                size_t width, size_t height, const char *call) {
    if (!cuda_on_cpu.execute || width == 0)
        return;
    cpu_device_open(call);
    for (size_t row = 0; row < height; row++)
        memcpy((char *)to + row * to_pitch, (const char *)from + row * from_pitch, width);
    cpu_device_open(NULL);
}

// Every copy: checked, then run now or recorded into the capturing stream's
// graph. `blocking`: cudaMemcpy and cudaMemcpy2D, which a capture forbids; an
// asynchronous copy captured into a graph must have its host side in
// cudaMallocHost's memory (the graph reads or writes it when it runs).
static inline cudaError_t cpu_copy(void *to, size_t to_pitch, const void *from, size_t from_pitch,
                                   size_t width, size_t height, cudaMemcpyKind kind,
                                   cudaStream_t stream, int blocking, const char *call) {
    if (width > to_pitch || width > from_pitch)
        return cudaErrorInvalidValue;
    cudaError_t e = blocking ? cpu_capture_forbids(call) : cudaSuccess;
    if (e != cudaSuccess)
        return e;
    size_t to_span = height ? (height - 1) * to_pitch + width : 0;
    size_t from_span = height ? (height - 1) * from_pitch + width : 0;
    e = cpu_check_copy(to, to_span, from, from_span, kind, call);
    if (e != cudaSuccess)
        return e;
    cudaError_t refusal = cudaSuccess;
    int route = blocking ? 0 : cpu_stream_route(stream, call, &refusal);
    if (route < 0)
        return refusal;
    const void *host = kind == cudaMemcpyHostToDevice ? from
                     : kind == cudaMemcpyDeviceToHost ? to : NULL;
    int pinned = !host || cpu_pinned(host, kind == cudaMemcpyHostToDevice ? from_span : to_span);
    if (route > 0 && !pinned) {
        cpu_spoil_capture();
        snprintf(cuda_on_cpu.message, sizeof cuda_on_cpu.message, "%s of host memory that "
                 "cudaMallocHost did not give, into a graph: a GPU refuses it, and the capture "
                 "fails", call);
        return cudaErrorStreamCaptureUnsupported;
    }
    CpuWork work, *w = route > 0 ? cpu_record(stream, CPU_WORK_COPY) : &work;
    if (route == 0) {
        memset(&work, 0, sizeof work);
        work.kind = CPU_WORK_COPY;
    }
    w->call = call;
    w->to = to;
    w->from = from;
    w->to_pitch = to_pitch;
    w->from_pitch = from_pitch;
    w->width = width;
    w->height = height;
    w->copy_kind = (int)kind;
    if (route > 0)
        return cudaSuccess;
    // a blocking copy, or one of pageable host memory (a GPU stages that before the call
    // returns), runs now, after all the work given before (the legacy stream's order) or the
    // stream's
    if (blocking || !pinned) {
        cpu_run_pending(blocking || !stream ? NULL : &stream->after);
        cpu_copy_run(to, to_pitch, from, from_pitch, width, height, call);
        return cudaSuccess;
    }
    return cpu_give(stream, w);
}

static inline cudaError_t cudaMemcpy(void *to, const void *from, size_t bytes,
                                     cudaMemcpyKind kind) {
    return cpu_copy(to, bytes, from, bytes, bytes, 1, kind, NULL, 1, "cudaMemcpy");
}
static inline cudaError_t cudaMemcpyAsync(void *to, const void *from, size_t bytes,
                                          cudaMemcpyKind kind, cudaStream_t stream) {
    return cpu_copy(to, bytes, from, bytes, bytes, 1, kind, stream, 0, "cudaMemcpyAsync");
}
// `height` rows of `width` bytes, `pitch` bytes apart on each side
static inline cudaError_t cudaMemcpy2D(void *to, size_t to_pitch, const void *from,
                                       size_t from_pitch, size_t width, size_t height,
                                       cudaMemcpyKind kind) {
    return cpu_copy(to, to_pitch, from, from_pitch, width, height, kind, NULL, 1, "cudaMemcpy2D");
}
static inline cudaError_t cudaMemcpy2DAsync(void *to, size_t to_pitch, const void *from,
                                            size_t from_pitch, size_t width, size_t height,
                                            cudaMemcpyKind kind, cudaStream_t stream) {
    return cpu_copy(to, to_pitch, from, from_pitch, width, height, kind, stream, 0,
                    "cudaMemcpy2DAsync");
}

static inline void cpu_memset_run(void *to, int value, size_t bytes, const char *call) {
    if (!cuda_on_cpu.execute || bytes == 0)
        return;
    cpu_device_open(call);
    memset(to, value, bytes);
    cpu_device_open(NULL);
}
static inline cudaError_t cpu_memset(void *to, int value, size_t bytes, cudaStream_t stream,
                                     int blocking, const char *call) {
    cudaError_t e = blocking ? cpu_capture_forbids(call) : cudaSuccess;
    if (e == cudaSuccess)
        e = cpu_check_device(to, bytes, call, "destination");
    if (e != cudaSuccess)
        return e;
    cudaError_t refusal = cudaSuccess;
    int route = blocking ? 0 : cpu_stream_route(stream, call, &refusal);
    if (route < 0)
        return refusal;
    CpuWork work, *w = route > 0 ? cpu_record(stream, CPU_WORK_MEMSET) : &work;
    if (route == 0) {
        memset(&work, 0, sizeof work);
        work.kind = CPU_WORK_MEMSET;
    }
    w->call = call;
    w->to = to;
    w->value = value;
    w->width = bytes;
    if (route > 0)
        return cudaSuccess;
    return cpu_give(blocking ? NULL : stream, w);
}
static inline cudaError_t cudaMemset(void *to, int value, size_t bytes) {
    return cpu_memset(to, value, bytes, NULL, 1, "cudaMemset");
}
static inline cudaError_t cudaMemsetAsync(void *to, int value, size_t bytes, cudaStream_t stream) {
    return cpu_memset(to, value, bytes, stream, 0, "cudaMemsetAsync");
}

// ---- NCCL: ncclAllReduce over MPI -----------------------------------------------------

typedef enum {
    ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
    ncclInvalidArgument = 4, ncclInvalidUsage = 5
} ncclResult_t;
typedef enum { ncclFloat = 7 } ncclDataType_t;   // (nccl.h's value for float32)
typedef enum { ncclSum = 0 } ncclRedOp_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
typedef struct CpuNcclComm {
    int rank, ranks;
} *ncclComm_t;

static inline const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    }
    return "unknown result";
}

// The id that rank 0 makes and every rank is given: here a mark that ncclCommInitRank checks
static inline ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    memset(id, 0, sizeof *id);
    strcpy(id->internal, "cuda_on_cpu.h NCCL id");
    return ncclSuccess;
}

// The ranks are MPI's (MPI_COMM_WORLD's, started by the program): anything else is refused
static inline ncclResult_t ncclCommInitRank(ncclComm_t *comm, int ranks, ncclUniqueId id,
                                            int rank) {
    *comm = NULL;
    int mpi_rank = 0, mpi_ranks = 1;
#ifdef TRANSFORMER_MPI
    int started = 0;
    MPI_Initialized(&started);
    if (started) {
        MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
        MPI_Comm_size(MPI_COMM_WORLD, &mpi_ranks);
    }
#endif
    if (strcmp(id.internal, "cuda_on_cpu.h NCCL id") != 0 || rank != mpi_rank ||
        ranks != mpi_ranks)
        return ncclInvalidArgument;
    *comm = (ncclComm_t)calloc(1, sizeof **comm);
    if (!*comm)
        return ncclSystemError;
    (*comm)->rank = rank;
    (*comm)->ranks = ranks;
    return ncclSuccess;
}

static inline ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    free(comm);
    return ncclSuccess;
}

// (the calls between them are run one by one here, each a collective of its own)
static inline ncclResult_t ncclGroupStart(void) {
    return ncclSuccess;
}
static inline ncclResult_t ncclGroupEnd(void) {
    return ncclSuccess;
}

// An all-reduce as it runs: the floats copied out of device memory, every rank's gathered,
// summed in rank order, copied into device memory
static inline cudaError_t cpu_all_reduce_run(const CpuWork *w) {
    size_t count = w->width, bytes = count * sizeof(float);
    cudaError_t e = cpu_check_device(w->from, bytes, "ncclAllReduce", "send buffer");
    if (e == cudaSuccess)
        e = cpu_check_device(w->to, bytes, "ncclAllReduce", "receive buffer");
    if (e != cudaSuccess || !cuda_on_cpu.execute || count == 0)
        return e;
    int ranks = w->comm->ranks;
    float *all = (float *)malloc(bytes * (size_t)ranks);   // (ranks, count): rank r's at r
    if (!all)
        cpu_die("out of memory for ncclAllReduce");
    cpu_device_open("ncclAllReduce");
    memcpy(all + (size_t)w->comm->rank * count, w->from, bytes);
    cpu_device_open(NULL);
#ifdef TRANSFORMER_MPI
    if (ranks > 1)
        MPI_Allgather(MPI_IN_PLACE, 0, MPI_FLOAT, all, (int)count, MPI_FLOAT, MPI_COMM_WORLD);
#endif
    for (size_t i = 0; i < count; i++)
        for (int r = 1; r < ranks; r++) all[i] += all[(size_t)r * count + i];
    cpu_device_open("ncclAllReduce");
    memcpy(w->to, all, bytes);
    cpu_device_open(NULL);
    free(all);
    return cudaSuccess;
}

// Floats only, summed; on the stream's work, or into the graph it captures
static inline ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count,
                                         ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                         cudaStream_t stream) {
    if (type != ncclFloat || op != ncclSum || !comm || count > (size_t)INT32_MAX)
        return ncclInvalidArgument;
    cudaError_t refusal = cudaSuccess;
    int route = cpu_stream_route(stream, "ncclAllReduce", &refusal);
    if (route < 0)
        return ncclInvalidUsage;
    CpuWork work, *w = route > 0 ? cpu_record(stream, CPU_WORK_ALL_REDUCE) : &work;
    if (route == 0) {
        memset(&work, 0, sizeof work);
        work.kind = CPU_WORK_ALL_REDUCE;
    }
    w->call = "ncclAllReduce";
    w->to = recv;
    w->from = send;
    w->width = count;
    w->comm = comm;
    if (route > 0)
        return ncclSuccess;
    return cpu_give(stream, w) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
}

// The "device" is the host; its name says so. The limits are an H100's.
typedef struct {
    char name[256];
    int multiProcessorCount;
    size_t sharedMemPerBlock, sharedMemPerBlockOptin;
} cudaDeviceProp;
#define CPU_SHARED_DEFAULT 49152
#define CPU_SHARED_OPT_IN_MAX 232448
static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device) {
    (void)device;
    memset(prop, 0, sizeof *prop);
    strcpy(prop->name, "the CPU (cuda_on_cpu.h)");
    prop->multiProcessorCount = 132;
    prop->sharedMemPerBlock = CPU_SHARED_DEFAULT;
    prop->sharedMemPerBlockOptin = CPU_SHARED_OPT_IN_MAX;
    return cudaSuccess;
}

// One device: a rank of a data-parallel run on this machine takes device 0, as its own GPU
static inline cudaError_t cudaGetDeviceCount(int *count) {
    *count = 1;
    return cudaSuccess;
}
static inline cudaError_t cudaSetDevice(int device) {
    return device == 0 ? cudaSuccess : cudaErrorInvalidValue;
}

// A GPU reports an error of an asynchronous kernel at a later call; here too:
// a launch's own refusal at once, a fault when the work has run (on the legacy
// stream, at once; on another, after something waited for it).
static inline cudaError_t cudaGetLastError(void) {
    cudaError_t e = cuda_on_cpu.last_error ? cuda_on_cpu.last_error : cuda_on_cpu.sticky_error;
    cuda_on_cpu.last_error = cudaSuccess;
    return e;
}

typedef enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 } cudaFuncAttribute;
// The kernel by name: C cannot take a kernel's address as CUDA's template does.
#define cudaFuncSetAttribute(kernel, attribute, value) \
    cpu_func_set_attribute(#kernel, attribute, value)
static inline cudaError_t cpu_func_set_attribute(const char *kernel, cudaFuncAttribute attribute,
                                                 int value) {
    if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        value > CPU_SHARED_OPT_IN_MAX)
        return cudaErrorInvalidValue;
    for (int i = 0; i < cuda_on_cpu.shared_opt_in_count; i++)
        if (strcmp(cuda_on_cpu.shared_opt_in[i].kernel, kernel) == 0) {
            cuda_on_cpu.shared_opt_in[i].bytes = value;
            return cudaSuccess;
        }
    if (cuda_on_cpu.shared_opt_in_count == 32)
        return cudaErrorInvalidValue;
    cuda_on_cpu.shared_opt_in[cuda_on_cpu.shared_opt_in_count].kernel = kernel;
    cuda_on_cpu.shared_opt_in[cuda_on_cpu.shared_opt_in_count++].bytes = value;
    return cudaSuccess;
}

#include "cuda_on_cpu_threads.h"

// ---- faults ---------------------------------------------------------------------

// What a GPU calls an illegal address, a deadlock or a bad shuffle, said in full.
// Within a block, the block stops and its launch fails (cpu_fault_finish); in
// host code (which read device memory) the program stops. A test that is
// catching faults gets control back instead, in cpu_catches_fault.
static inline void cpu_fault_finish(int in_launch) {
    cuda_on_cpu.held_open = 0;   // a fault closes device memory, held or not
    cpu_device_open(NULL);
    if (cuda_on_cpu.catching)
        siglongjmp(cuda_on_cpu.recovery, 1);
    fprintf(stderr, "error: cuda_on_cpu.h: %s\n", cuda_on_cpu.message);
    if (!in_launch)
        abort();
}

static inline _Noreturn void cpu_fault(cudaError_t error, const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(cuda_on_cpu.message, sizeof cuda_on_cpu.message, format, args);
    va_end(args);
    cuda_on_cpu.sticky_error = error;
    if (cpu_block_running())
        cpu_block_abandon();   // to the launch, never back
    cpu_fault_finish(0);
    abort();
}

// A fault found when a block has ended (a write below its shared memory): the
// launch fails with it, as with a fault inside the block.
static inline void cpu_fault_after_block(cudaError_t error, const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(cuda_on_cpu.message, sizeof cuda_on_cpu.message, format, args);
    va_end(args);
    cuda_on_cpu.sticky_error = error;
    cpu_fault_finish(1);
}

// The tensor whose guard page holds `address`, or NULL.
static inline const CpuTensor *cpu_guarded_tensor(const char *address) {
    const CpuAllocation *a = cpu_allocation_at(address);
    for (int t = 0; a && t < a->tensor_count; t++) {
        const char *guard = a->tensors[t].start + a->tensors[t].bytes;
        if (address >= guard && address < guard + cuda_on_cpu.page)
            return &a->tensors[t];
    }
    return NULL;
}

static inline void cpu_segv(int signal_number, siginfo_t *info, void *context) {
    const char *address = (const char *)info->si_addr;
    if (cpu_in_reserved(address)) {
        const CpuAllocation *a = cpu_allocation_at(address);
        const CpuTensor *past = cuda_on_cpu.open_for ? cpu_guarded_tensor(address) : NULL;
        if (past && cpu_block_running())
            cpu_fault(cudaErrorIllegalAddress, "%s, block (%u, %u), thread (%u, %u): byte %zu past "
                      "the end of tensor %s (%zu bytes), in the guard page before its neighbour",
                      cuda_on_cpu.open_for, blockIdx.x, blockIdx.y, threadIdx.x, threadIdx.y,
                      (size_t)(address - past->start - past->bytes), past->name, past->bytes);
        if (past)
            cpu_fault(cudaErrorIllegalAddress, "%s: byte %zu past the end of tensor %s (%zu "
                      "bytes), in the guard page before its neighbour", cuda_on_cpu.open_for,
                      (size_t)(address - past->start - past->bytes), past->name, past->bytes);
        if (!cuda_on_cpu.open_for && a && address >= a->pointer)
            cpu_fault(cudaErrorIllegalAddress, "host code read or wrote device memory at %p (byte "
                      "%zu of an allocation of %zu bytes): only copies, kernels and cuBLAS calls "
                      "may", (const void *)address, (size_t)(address - a->pointer), a->bytes);
        cpu_fault(cudaErrorIllegalAddress, "%s touched %p, outside every device allocation",
                  cuda_on_cpu.open_for ? cuda_on_cpu.open_for : "host code", (const void *)address);
    }
    const char *region = cuda_on_cpu.shared_region;
    if (cpu_block_running() && address >= region &&
        address < region + cuda_on_cpu.shared_region_size)
        cpu_fault(cudaErrorIllegalAddress, "%s, block (%u, %u), thread (%u, %u): shared memory "
                  "index out of bounds, %s (%zu bytes given at launch)", cuda_on_cpu.open_for,
                  blockIdx.x, blockIdx.y, threadIdx.x, threadIdx.y,
                  address < (const char *)cpu_block.shared ? "below its start" : "past its end",
                  cpu_block.shared_bytes);
    // Not the emulator's: the fault runs again under the handler there was before (or none).
    (void)signal_number;
    (void)context;
    sigaction(SIGSEGV, &cuda_on_cpu.earlier_segv, NULL);
}

// For the tests: runs run(context) and returns 1 if the emulator caught a fault in
// it (cuda_on_cpu.message says which), 0 if none; after a fault the "GPU" works again.
static inline int cpu_catches_fault(void (*run)(void *), void *context) {
    cpu_start();
    cuda_on_cpu.catching = 1;
    if (sigsetjmp(cuda_on_cpu.recovery, 1) == 0) {
        run(context);
        cuda_on_cpu.catching = 0;
        return 0;
    }
    cuda_on_cpu.catching = 0;
    cuda_on_cpu.sticky_error = cuda_on_cpu.last_error = cudaSuccess;
    free(cuda_on_cpu.running_args);   // the legacy stream's piece the fault stopped
    cuda_on_cpu.running_args = NULL;
    cpu_drop_pending();
    return 1;
}

// A kernel's 16-byte access (a float4) at p: on a GPU an address that is not a
// multiple of 16 faults (misaligned address), so it does here.
static inline void cpu_check_aligned16(const void *p) {
    if ((uintptr_t)p % 16 == 0)
        return;
    cpu_fault(cudaErrorMisalignedAddress, "%s, block (%u, %u), thread (%u, %u): a 16-byte access "
              "at %p, not 16-byte aligned (misaligned address)", cuda_on_cpu.open_for, blockIdx.x,
              blockIdx.y, threadIdx.x, threadIdx.y, p);
}

// ---- launches -------------------------------------------------------------------

// Why a GPU would refuse this launch; NULL if it would not.
static inline const char *cpu_launch_refusal(const char *kernel, dim3 grid, dim3 block,
                                             size_t shared_bytes) {
    static char why[256];
    if (grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.x > 2147483647u || grid.y > 65535 ||
        grid.z > 65535)
        snprintf(why, sizeof why, "a grid of %u x %u x %u blocks", grid.x, grid.y, grid.z);
    else if (block.x < 1 || block.y < 1 || block.z < 1 || block.x > 1024 || block.y > 1024 ||
             block.z > 64 || (size_t)block.x * block.y * block.z > 1024)
        snprintf(why, sizeof why, "blocks of %u x %u x %u threads (at most 1024)", block.x, block.y,
                 block.z);
    else {
        size_t limit = CPU_SHARED_DEFAULT;
        for (int i = 0; i < cuda_on_cpu.shared_opt_in_count; i++) {
            size_t opted = (size_t)cuda_on_cpu.shared_opt_in[i].bytes;
            if (strcmp(cuda_on_cpu.shared_opt_in[i].kernel, kernel) == 0 && opted > limit)
                limit = opted;
        }
        if (shared_bytes <= limit)
            return NULL;
        snprintf(why, sizeof why, "%zu bytes of shared memory (at most %zu%s)", shared_bytes, limit,
                 limit == CPU_SHARED_DEFAULT ? " without cudaFuncSetAttribute" : "");
    }
    return why;
}

// A launch, checked: every block in random order.
static inline void cpu_launch_run(const char *kernel, void (*thread)(const void *),
                                  const void *args, dim3 grid, dim3 block, size_t shared_bytes) {
    if (!cuda_on_cpu.execute)
        return;
    if (cpu_test_faults.launch_skipped && strcmp(cpu_test_faults.launch_skipped, kernel) == 0)
        return;
    if (cpu_test_faults.launch_replaced && strcmp(cpu_test_faults.launch_replaced, kernel) == 0)
        thread = cpu_test_faults.replacement;
    int short_one = cpu_test_faults.shared_memory_short &&
                    strcmp(cpu_test_faults.shared_memory_short, kernel) == 0;
    size_t given = !short_one ? shared_bytes : shared_bytes >= 16 ? shared_bytes - 16 : 0;
    size_t blocks = (size_t)grid.x * grid.y * grid.z;
    static unsigned *order;   // a random order of the blocks
    static size_t order_size;
    if (blocks > order_size) {
        free(order);
        order_size = blocks;
        order = (unsigned *)malloc(blocks * sizeof(unsigned));
        if (!order)
            cpu_die("out of memory for a launch's block order");
    }
    for (size_t i = 0; i < blocks; i++) {
        size_t j = cpu_random_below((unsigned)(i + 1));
        order[i] = order[j];
        order[j] = (unsigned)i;
    }
    cpu_block_prepare(kernel, thread, args, grid, block, given);
    cpu_device_open(kernel);
    for (size_t i = 0; i < blocks; i++) {
        dim3 b = { order[i] % grid.x, order[i] / grid.x % grid.y,
                   (unsigned)(order[i] / ((size_t)grid.x * grid.y)) };
        cpu_block_run(b);
        if (cuda_on_cpu.sticky_error)
            break;   // a fault stopped the launch
    }
    cpu_device_open(NULL);
}

// kernel<<<grid, block, shared_bytes, stream>>>(arguments): checked as a GPU
// checks it, then run, or recorded (its arguments copied) when the stream
// captures a graph; its error, if any, for cudaGetLastError.
static inline void cpu_launch(const char *kernel, void (*thread)(const void *), const void *args,
                              size_t args_size, dim3 grid, dim3 block, size_t shared_bytes,
                              cudaStream_t stream) {
    cpu_start();
    if (cuda_on_cpu.sticky_error) {
        cuda_on_cpu.last_error = cuda_on_cpu.sticky_error;
        return;
    }
    const char *refusal = cpu_launch_refusal(kernel, grid, block, shared_bytes);
    if (refusal) {
        snprintf(cuda_on_cpu.message, sizeof cuda_on_cpu.message,
                 "the launch of %s was refused: %s", kernel, refusal);
        cuda_on_cpu.last_error = shared_bytes > CPU_SHARED_DEFAULT && strstr(refusal, "shared")
                                 ? cudaErrorInvalidValue : cudaErrorInvalidConfiguration;
        if (stream && stream->capturing)
            cpu_spoil_capture();
        return;
    }
    cudaError_t capture_refusal = cudaSuccess;
    int route = cpu_stream_route(stream, kernel, &capture_refusal);
    if (route < 0) {
        cuda_on_cpu.last_error = capture_refusal;
        return;
    }
    CpuWork work, *w = route > 0 ? cpu_record(stream, CPU_WORK_KERNEL) : &work;
    if (route == 0) {
        memset(&work, 0, sizeof work);
        work.kind = CPU_WORK_KERNEL;
    }
    w->kernel = kernel;
    w->thread = thread;
    w->grid = grid;
    w->block = block;
    w->shared_bytes = shared_bytes;
    w->args_size = args_size;
    w->args = malloc(args_size);
    if (!w->args)
        cpu_die("out of memory for a launch's arguments");
    memcpy(w->args, args, args_size);
    if (route == 0)
        cpu_give(stream, w);
}

// ---- cuBLAS -------------------------------------------------------------------

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_INITIALIZED = 1, CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_EXECUTION_FAILED = 13, CUBLAS_STATUS_NOT_SUPPORTED = 15
} cublasStatus_t;
// library_types.h's and cublas_api.h's values, for cublasGemmEx
typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 } cublasMath_t;
// stream: where its calls run (cublasSetStream; NULL: the legacy stream); workspace: device
// memory given by cublasSetWorkspace, NULL for cuBLAS's own
typedef struct {
    int created;
    cublasMath_t math;
    cudaStream_t stream;
    void *workspace;
    size_t workspace_bytes;
} *cublasHandle_t;

static inline const char *cublasGetStatusString(cublasStatus_t status) {
    return status == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS"
         : status == CUBLAS_STATUS_NOT_INITIALIZED ? "CUBLAS_STATUS_NOT_INITIALIZED"
         : status == CUBLAS_STATUS_INVALID_VALUE ? "CUBLAS_STATUS_INVALID_VALUE"
         : status == CUBLAS_STATUS_NOT_SUPPORTED ? "CUBLAS_STATUS_NOT_SUPPORTED"
         : "CUBLAS_STATUS_EXECUTION_FAILED";
}

static inline cublasStatus_t cublasCreate(cublasHandle_t *handle) {
    *handle = (cublasHandle_t)calloc(1, sizeof **handle);
    if (!*handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    (*handle)->created = 1;
    cuda_on_cpu.handles = (void **)cpu_grow(cuda_on_cpu.handles, cuda_on_cpu.handle_count,
                                            &cuda_on_cpu.handle_capacity, sizeof(void *),
                                            "out of memory for the list of cuBLAS handles");
    cuda_on_cpu.handles[cuda_on_cpu.handle_count++] = *handle;
    return CUBLAS_STATUS_SUCCESS;
}

static inline cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    for (int i = 0; i < cuda_on_cpu.handle_count; i++)
        if (cuda_on_cpu.handles[i] == handle)
            cuda_on_cpu.handles[i] = cuda_on_cpu.handles[--cuda_on_cpu.handle_count];
    free(handle);
    return CUBLAS_STATUS_SUCCESS;
}

// TF32 would round the inputs to 10-bit mantissas on a GPU; the CPU model
// always multiplies in fp32, so it only records the choice.
static inline cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (!handle || !handle->created)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

// As cuBLAS's: the stream for the calls that follow, and (cuBLAS's documentation
// says so) back to cuBLAS's own workspace: cublasSetWorkspace comes after.
static inline cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
    if (!handle || !handle->created)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    handle->workspace = NULL;
    handle->workspace_bytes = 0;
    return CUBLAS_STATUS_SUCCESS;
}

// The workspace must be device memory of that size, 256-byte aligned.
static inline cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace,
                                                size_t bytes) {
    if (!handle || !handle->created)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    char why[160];
    if (bytes > 0 && ((uintptr_t)workspace % 256 != 0 ||
                      !cpu_inside_region(workspace, bytes, why, sizeof why))) {
        snprintf(cuda_on_cpu.message, sizeof cuda_on_cpu.message,
                 "cublasSetWorkspace: %zu bytes at %p are not 256-byte aligned device memory",
                 bytes, workspace);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    handle->workspace = workspace;
    handle->workspace_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

static inline int cublas_max1(int a) { return a > 1 ? a : 1; }

// Element i of an operand: fp32, or bf16 (exact in fp32)
static inline float cpu_gemm_element(const void *X, int bf16, size_t i) {
    return bf16 ? __bfloat162float(((const __nv_bfloat16 *)X)[i]) : ((const float *)X)[i];
}

// The product of one batch entry; the arguments as cublasSgemm's (A and B
// bf16 when bf16). Two bf16 numbers multiply exactly in fp32; the sum rounds,
// once a step (fmaf: the same bits whichever way the operands are stored).
static inline void cpu_sgemm(cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                             int k, float alpha, const void *A, int lda, const void *B, int ldb,
                             float beta, float *C, int ldc, int bf16) {
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < m; i++) {
            float sum = 0;
            for (int p = 0; p < k; p++) {
                size_t at_a = transa == CUBLAS_OP_N ? i + (size_t)p * lda
                                                    : p + (size_t)i * lda;   // op(A)[i,p]
                size_t at_b = transb == CUBLAS_OP_N ? p + (size_t)j * ldb
                                                    : j + (size_t)p * ldb;   // op(B)[p,j]
                sum = fmaf(cpu_gemm_element(A, bf16, at_a), cpu_gemm_element(B, bf16, at_b), sum);
            }
            float *c = &C[i + (size_t)j * ldc];
            *c = beta == 0.0f ? alpha * sum : alpha * sum + beta * *c;   // beta 0: C is not read
        }
    }
}

// What cuBLAS checks before it computes anything.
static inline cublasStatus_t cpu_sgemm_shape_check(cublasOperation_t transa,
                                                   cublasOperation_t transb, int m, int n, int k,
                                                   int lda, int ldb, int ldc, int batch_count) {
    if ((transa != CUBLAS_OP_N && transa != CUBLAS_OP_T) ||
        (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m < 0 || n < 0 || k < 0 || batch_count < 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (lda < cublas_max1(transa == CUBLAS_OP_N ? m : k))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (ldb < cublas_max1(transb == CUBLAS_OP_N ? k : n))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (ldc < cublas_max1(m))
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cpu_sgemm_check(cublasHandle_t handle, cublasOperation_t transa,
                                             cublasOperation_t transb, int m, int n, int k, int lda,
                                             int ldb, int ldc, int batch_count) {
    if (!handle || !handle->created)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    return cpu_sgemm_shape_check(transa, transb, m, n, k, lda, ldb, ldc, batch_count);
}

// A stored operand of `rows` x `cols` (as stored: column-major, leading dimension
// ld), `count` of them `stride` apart, elements of `element_bytes`, all inside
// one region (an allocation, or a tensor of one).
static int cpu_operand_fits(const void *X, size_t element_bytes, int rows, int cols, int ld,
                            long long stride, int count, const char *call, const char *name) {
    if (rows == 0 || cols == 0 || count == 0)
        return 1;
    long long last = (long long)(count - 1) * stride + (long long)(cols - 1) * ld + rows - 1;
    char why[160] = "at a negative stride";
    if (stride >= 0 && cpu_inside_region(X, ((size_t)last + 1) * element_bytes, why, sizeof why))
        return 1;
    snprintf(cuda_on_cpu.message, sizeof cuda_on_cpu.message,
             "%s: %s (%d x %d, leading dimension %d, %d of them %lld apart) reaches %s", call, name,
             rows, cols, ld, count, stride, why);
    return 0;
}

// A checked call's operands all inside their regions (an allocation, or a tensor of one)
static inline cublasStatus_t cpu_gemm_extents(const CpuGemm *g) {
    cublasOperation_t transa = (cublasOperation_t)g->transa, transb = (cublasOperation_t)g->transb;
    int a_rows = transa == CUBLAS_OP_N ? g->m : g->k, b_rows = transb == CUBLAS_OP_N ? g->k : g->n;
    size_t ab_bytes = g->ab_bf16 ? sizeof(__nv_bfloat16) : sizeof(float);
    if (!cpu_operand_fits(g->A, ab_bytes, g->k ? a_rows : 0, transa == CUBLAS_OP_N ? g->k : g->m,
                          g->lda, g->stride_a, g->count, g->call, "A") ||
        !cpu_operand_fits(g->B, ab_bytes, g->k ? b_rows : 0, transb == CUBLAS_OP_N ? g->n : g->k,
                          g->ldb, g->stride_b, g->count, g->call, "B") ||
        !cpu_operand_fits(g->C, sizeof(float), g->m, g->n, g->ldc, g->stride_c, g->count, g->call,
                          "C"))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    return CUBLAS_STATUS_SUCCESS;
}

// Two handles whose calls run on different streams, so possibly at once,
// must not share a workspace: cuBLAS's kernels keep partial sums there, and
// the two would overwrite each other's (wrong numbers, and different ones
// from run to run). The call is refused when they do.
// (cublasLtMatmul's workspace, given with each call on its stream, likewise:
// cpu_workspace_overlaps with no handle of its own.)
static inline int cpu_workspace_overlaps(const void *workspace, size_t bytes, cudaStream_t stream,
                                         cublasHandle_t own, const char *call) {
    if (!workspace)
        return 0;
    const char *start = (const char *)workspace, *end = start + bytes;
    for (int i = 0; i < cuda_on_cpu.handle_count; i++) {
        cublasHandle_t other = (cublasHandle_t)cuda_on_cpu.handles[i];
        const char *other_start = (const char *)other->workspace;
        if (other == own || !other_start || other->stream == stream)
            continue;
        if (other_start < end && start < other_start + other->workspace_bytes) {
            snprintf(cuda_on_cpu.message, sizeof cuda_on_cpu.message, "%s: its workspace is also "
                     "the workspace of a handle on another stream (streams %d and %d): calls on "
                     "the two may run at once and overwrite each other's partial sums; give each "
                     "stream a workspace of its own", call, stream ? stream->number : 0,
                     other->stream ? other->stream->number : 0);
            return 1;
        }
    }
    return 0;
}
static inline int cpu_workspace_shared(cublasHandle_t handle, const char *call) {
    return cpu_workspace_overlaps(handle->workspace, handle->workspace_bytes, handle->stream,
                                  handle, call);
}

static inline void cpu_epilogue_run(const CpuGemm *g);
static inline int cpu_epilogue_extents(const CpuGemm *g);

// A checked call's operands' extents, then its products (and cublasLtMatmul's epilogue).
static inline cublasStatus_t cpu_gemm_run(const CpuGemm *g) {
    if (cuda_on_cpu.sticky_error)
        return CUBLAS_STATUS_EXECUTION_FAILED;
    if (cpu_gemm_extents(g) != CUBLAS_STATUS_SUCCESS)
        return CUBLAS_STATUS_EXECUTION_FAILED;
    if (g->epilogue && !cpu_epilogue_extents(g))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    if (!cuda_on_cpu.execute)
        return CUBLAS_STATUS_SUCCESS;
    cublasOperation_t transa = (cublasOperation_t)g->transa, transb = (cublasOperation_t)g->transb;
    size_t ab_bytes = g->ab_bf16 ? sizeof(__nv_bfloat16) : sizeof(float);
    cpu_device_open(g->call);
    const char *A = (const char *)g->A, *B = (const char *)g->B;
    for (int i = 0; i < g->count; i++)
        cpu_sgemm(transa, transb, g->m, g->n, g->k, g->alpha, A + i * g->stride_a * ab_bytes,
                  g->lda, B + i * g->stride_b * ab_bytes, g->ldb, g->beta, g->C + i * g->stride_c,
                  g->ldc, g->ab_bf16);
    if (g->epilogue)
        cpu_epilogue_run(g);
    cpu_device_open(NULL);
    return CUBLAS_STATUS_SUCCESS;
}

// A checked call given to its stream: run now on the legacy stream, recorded
// (alpha and beta as they are now) when the stream captures a graph, or else
// given to the stream.
static inline cublasStatus_t cpu_gemm_give(const CpuGemm *g, cudaStream_t stream) {
    cudaError_t refusal = cudaSuccess;
    int route = cpu_stream_route(stream, g->call, &refusal);
    if (route < 0)
        return CUBLAS_STATUS_EXECUTION_FAILED;
    if (route > 0) {
        cpu_record(stream, CPU_WORK_GEMM)->gemm = *g;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (!stream) {   // the legacy stream: now, after all the work given before
        cpu_run_pending(NULL);
        return cpu_gemm_run(g);
    }
    // another stream: its operands' extents checked now, and again when it runs
    if (cpu_gemm_extents(g) != CUBLAS_STATUS_SUCCESS)
        return CUBLAS_STATUS_EXECUTION_FAILED;
    if (g->epilogue && !cpu_epilogue_extents(g))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    CpuWork work;
    memset(&work, 0, sizeof work);
    work.kind = CPU_WORK_GEMM;
    work.gemm = *g;
    cpu_give(stream, &work);
    return CUBLAS_STATUS_SUCCESS;
}

// One call: cuBLAS's checks, then the products now, or recorded with alpha and
// beta as they are now when the handle's stream captures a graph.
static inline cublasStatus_t cpu_gemm_call(const char *call, cublasHandle_t handle,
                                           cublasOperation_t transa, cublasOperation_t transb,
                                           int m, int n, int k, const float *alpha, const void *A,
                                           int lda, long long stride_a, const void *B, int ldb,
                                           long long stride_b, const float *beta, float *C, int ldc,
                                           long long stride_c, int count, int ab_bf16) {
    cublasStatus_t status = cpu_sgemm_check(handle, transa, transb, m, n, k, lda, ldb, ldc, count);
    if (status != CUBLAS_STATUS_SUCCESS)
        return status;
    if (cuda_on_cpu.sticky_error)
        return CUBLAS_STATUS_EXECUTION_FAILED;
    CpuGemm g = { call, handle, (int)transa, (int)transb, m, n, k, lda, ldb, ldc, count, *alpha,
                  *beta, A, B, C, stride_a, stride_b, stride_c, ab_bf16, 0, NULL, NULL, 0 };
    if (cpu_workspace_shared(handle, call))
        return CUBLAS_STATUS_INVALID_VALUE;
    return cpu_gemm_give(&g, handle->stream);
}

static inline cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const float *alpha, const float *A, int lda,
                                         const float *B, int ldb, const float *beta, float *C,
                                         int ldc) {
    return cpu_gemm_call("cublasSgemm", handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb,
                         0, beta, C, ldc, 0, 1, 0);
}

// Entry i multiplies A + i*strideA and B + i*strideB into C + i*strideC.
static inline cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle,
                                                       cublasOperation_t transa,
                                                       cublasOperation_t transb, int m, int n,
                                                       int k, const float *alpha, const float *A,
                                                       int lda, long long strideA, const float *B,
                                                       int ldb, long long strideB,
                                                       const float *beta, float *C, int ldc,
                                                       long long strideC, int batch_count) {
    return cpu_gemm_call("cublasSgemmStridedBatched", handle, transa, transb, m, n, k, alpha, A,
                         lda, strideA, B, ldb, strideB, beta, C, ldc, strideC, batch_count, 0);
}

// cublasGemmEx's types that the emulator computes: A and B both fp32 or both
// bf16, C fp32, the sum in fp32 (the scalars then float); 1 when A and B are bf16,
// 0 for fp32, -1 (CUBLAS_STATUS_NOT_SUPPORTED) for any other choice.
static inline int cpu_gemm_ex_types(cudaDataType a_type, cudaDataType b_type, cudaDataType c_type,
                                    cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    if (a_type != b_type || c_type != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F ||
        algo != CUBLAS_GEMM_DEFAULT)
        return -1;
    return a_type == CUDA_R_16BF ? 1 : a_type == CUDA_R_32F ? 0 : -1;
}

// C = alpha op(A) op(B) + beta C with the operands' types given (cpu_gemm_ex_types)
static inline cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, const void *B, cudaDataType Btype, int ldb,
                                          const void *beta, void *C, cudaDataType Ctype, int ldc,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    int bf16 = cpu_gemm_ex_types(Atype, Btype, Ctype, computeType, algo);
    if (bf16 < 0)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return cpu_gemm_call("cublasGemmEx", handle, transa, transb, m, n, k, (const float *)alpha, A,
                         lda, 0, B, ldb, 0, (const float *)beta, (float *)C, ldc, 0, 1, bf16);
}

// The same for batch_count products, entry i at A + i*strideA, ... (in elements of each type)
static inline cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle,
                                                        cublasOperation_t transa,
                                                        cublasOperation_t transb, int m, int n,
                                                        int k, const void *alpha, const void *A,
                                                        cudaDataType Atype, int lda,
                                                        long long strideA, const void *B,
                                                        cudaDataType Btype, int ldb,
                                                        long long strideB, const void *beta,
                                                        void *C, cudaDataType Ctype, int ldc,
                                                        long long strideC, int batch_count,
                                                        cublasComputeType_t computeType,
                                                        cublasGemmAlgo_t algo) {
    int bf16 = cpu_gemm_ex_types(Atype, Btype, Ctype, computeType, algo);
    if (bf16 < 0)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return cpu_gemm_call("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k,
                         (const float *)alpha, A, lda, strideA, B, ldb, strideB,
                         (const float *)beta, (float *)C, ldc, strideC, batch_count, bf16);
}

// ---- cuBLASLt: cublasLtMatmul with the epilogues the companion asks for ------
// cublasLt.h's names and values, for what transformer_cuda.cu's epilogues.h
// uses: a product as cublasGemmEx's (D = alpha op(A) op(B) + beta C, C and D
// the same matrix here, fp32; A and B fp32 or bf16; the sum in fp32, TF32's
// compute type computed as fp32), on the stream given with each call, with one
// of these epilogues, element (i, j) of D being v = alpha sum + beta c:
//   CUBLASLT_EPILOGUE_DEFAULT        D = v
//   CUBLASLT_EPILOGUE_RELU_AUX_BIAS  v += bias[i]; D = max(v, 0); bit i + j*aux_ld of the
//                                    mask: v > 0
//   CUBLASLT_EPILOGUE_DRELU_BGRAD    D = v where the mask's bit is set, else 0; then
//                                    bias[i] = sum over j of D(i, j), j = 0, 1, ... in fp32
// ("Bias vector length must match matrix D rows count"; the mask's leading
// dimension "must be divisible by 128 and be no less than the number of rows
// in the output matrix"; the mask's bits are cuBLASLt's to lay out: only its
// own epilogues read it). Anything else (another epilogue, a batch, a layout
// of another type or shape, C not D) is CUBLAS_STATUS_NOT_SUPPORTED from the
// heuristic, which then returns no algorithm: the caller's fallback runs.
typedef enum {
    CUBLASLT_EPILOGUE_DEFAULT = 1, CUBLASLT_EPILOGUE_RELU_AUX_BIAS = 134,
    CUBLASLT_EPILOGUE_DRELU_BGRAD = 152
} cublasLtEpilogue_t;
typedef enum {
    CUBLASLT_MATMUL_DESC_TRANSA = 3, CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7, CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12
} cublasLtMatmulDescAttributes_t;
typedef enum {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8
} cublasLtMatmulPreferenceAttributes_t;
#define CUBLAS_COMPUTE_32F_FAST_TF32 ((cublasComputeType_t)77)
typedef struct {
    int created;
} *cublasLtHandle_t;
typedef struct {
    cublasComputeType_t compute;
    int transa, transb;
    uint32_t epilogue;
    void *bias, *aux;
    int64_t aux_ld;
} *cublasLtMatmulDesc_t;
typedef struct {
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
} *cublasLtMatrixLayout_t;
typedef struct {
    uint64_t max_workspace;
} *cublasLtMatmulPreference_t;
typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

static inline cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle) {
    *handle = (cublasLtHandle_t)calloc(1, sizeof **handle);
    if (!*handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    (*handle)->created = 1;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    if (!handle || !handle->created)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    free(handle);
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc,
                                                      cublasComputeType_t compute,
                                                      cudaDataType scale_type) {
    if (scale_type != CUDA_R_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    *desc = (cublasLtMatmulDesc_t)calloc(1, sizeof **desc);
    if (!*desc)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    (*desc)->compute = compute;
    (*desc)->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    free(desc);
    return CUBLAS_STATUS_SUCCESS;
}
// Each attribute in the size cublasLt.h gives it (a wrong size is refused, as there)
static inline cublasStatus_t
cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute,
                               const void *value, size_t bytes) {
    size_t expected = attribute == CUBLASLT_MATMUL_DESC_BIAS_POINTER ? sizeof(void *)
                    : attribute == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER ? sizeof(void *)
                    : attribute == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD ? sizeof(int64_t)
                    : sizeof(int32_t);
    if (!desc || !value || bytes != expected)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (attribute == CUBLASLT_MATMUL_DESC_TRANSA)
        memcpy(&desc->transa, value, bytes);
    else if (attribute == CUBLASLT_MATMUL_DESC_TRANSB)
        memcpy(&desc->transb, value, bytes);
    else if (attribute == CUBLASLT_MATMUL_DESC_EPILOGUE)
        memcpy(&desc->epilogue, value, bytes);
    else if (attribute == CUBLASLT_MATMUL_DESC_BIAS_POINTER)
        memcpy(&desc->bias, value, bytes);
    else if (attribute == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER)
        memcpy(&desc->aux, value, bytes);
    else if (attribute == CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD)
        memcpy(&desc->aux_ld, value, bytes);
    else
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout,
                                                        cudaDataType type, uint64_t rows,
                                                        uint64_t cols, int64_t ld) {
    *layout = (cublasLtMatrixLayout_t)calloc(1, sizeof **layout);
    if (!*layout)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    (*layout)->type = type;
    (*layout)->rows = rows;
    (*layout)->cols = cols;
    (*layout)->ld = ld;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    free(layout);
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t
cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *preference) {
    *preference = (cublasLtMatmulPreference_t)calloc(1, sizeof **preference);
    return *preference ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}
static inline cublasStatus_t
cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference) {
    free(preference);
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t
cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t preference,
                                     cublasLtMatmulPreferenceAttributes_t attribute,
                                     const void *value, size_t bytes) {
    int alignment = attribute >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES &&
                    attribute <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES;
    if (!preference || !value)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (alignment)
        return bytes == sizeof(uint32_t) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    if (attribute != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES || bytes != sizeof(uint64_t))
        return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(&preference->max_workspace, value, bytes);
    return CUBLAS_STATUS_SUCCESS;
}

// The product a descriptor and four layouts describe, as a CpuGemm (C and D one
// matrix); CUBLAS_STATUS_NOT_SUPPORTED for what the emulator does not compute
static inline cublasStatus_t cpu_lt_product(CpuGemm *g, cublasLtMatmulDesc_t desc,
                                            cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                            cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d) {
    if (!desc || !a || !b || !c || !d)
        return CUBLAS_STATUS_INVALID_VALUE;
    int known = desc->epilogue == CUBLASLT_EPILOGUE_DEFAULT ||
                desc->epilogue == CUBLASLT_EPILOGUE_RELU_AUX_BIAS ||
                desc->epilogue == CUBLASLT_EPILOGUE_DRELU_BGRAD;
    int computes = desc->compute == CUBLAS_COMPUTE_32F ||
                   desc->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    int types = a->type == b->type && (a->type == CUDA_R_32F || a->type == CUDA_R_16BF) &&
                c->type == CUDA_R_32F && d->type == CUDA_R_32F;
    if (a->type == CUDA_R_16BF && desc->compute == CUBLAS_COMPUTE_32F_FAST_TF32)
        types = 0;   // (TF32 is for fp32)
    int same_cd = c->rows == d->rows && c->cols == d->cols && c->ld == d->ld;
    if (!known || !computes || !types || !same_cd)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(g, 0, sizeof *g);
    g->transa = desc->transa;
    g->transb = desc->transb;
    g->m = (int)d->rows;
    g->n = (int)d->cols;
    g->k = (int)(desc->transa == CUBLAS_OP_N ? a->cols : a->rows);
    int a_rows = (int)(desc->transa == CUBLAS_OP_N ? a->rows : a->cols);
    int b_rows = (int)(desc->transb == CUBLAS_OP_N ? b->rows : b->cols);
    int b_cols = (int)(desc->transb == CUBLAS_OP_N ? b->cols : b->rows);
    if (a_rows != g->m || b_rows != g->k || b_cols != g->n)
        return CUBLAS_STATUS_INVALID_VALUE;
    g->lda = (int)a->ld;
    g->ldb = (int)b->ld;
    g->ldc = (int)d->ld;
    g->count = 1;
    g->ab_bf16 = a->type == CUDA_R_16BF;
    g->epilogue = desc->epilogue == CUBLASLT_EPILOGUE_DEFAULT ? 0 : (int)desc->epilogue;
    g->bias = (float *)desc->bias;
    g->aux = (unsigned char *)desc->aux;
    g->aux_ld = desc->aux_ld;
    if (g->epilogue && (!g->bias || !g->aux || g->aux_ld < g->m || g->aux_ld % 128 != 0))
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

// One algorithm for any product the emulator computes (it has one), none for the rest
static inline cublasStatus_t
cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                               cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                               cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                               cublasLtMatmulPreference_t preference, int requested,
                               cublasLtMatmulHeuristicResult_t *results, int *returned) {
    if (!handle || !handle->created)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!preference || requested < 1 || !results || !returned)
        return CUBLAS_STATUS_INVALID_VALUE;
    *returned = 0;
    CpuGemm g;
    cublasStatus_t status = cpu_lt_product(&g, desc, a, b, c, d);
    if (status != CUBLAS_STATUS_SUCCESS)
        return status;
    if (cpu_test_faults.epilogue_refused && desc->epilogue == cpu_test_faults.epilogue_refused)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(&results[0], 0, sizeof results[0]);
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

// D = alpha op(A) op(B) + beta C and the descriptor's epilogue, on `stream`
// (recorded when it captures); the workspace must be device memory that no
// cuBLAS handle on another stream has (cpu_workspace_overlaps).
static inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                            const void *alpha, const void *A,
                                            cublasLtMatrixLayout_t a, const void *B,
                                            cublasLtMatrixLayout_t b, const void *beta,
                                            const void *C, cublasLtMatrixLayout_t c, void *D,
                                            cublasLtMatrixLayout_t d,
                                            const cublasLtMatmulAlgo_t *algo, void *workspace,
                                            size_t workspace_bytes, cudaStream_t stream) {
    const char *call = "cublasLtMatmul";
    if (!handle || !handle->created)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!algo || !alpha || !beta || C != D)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (cuda_on_cpu.sticky_error)
        return CUBLAS_STATUS_EXECUTION_FAILED;
    if (cpu_test_faults.lt_matmul_refused)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    CpuGemm g;
    cublasStatus_t status = cpu_lt_product(&g, desc, a, b, c, d);
    if (status != CUBLAS_STATUS_SUCCESS)
        return status;
    status = cpu_sgemm_shape_check((cublasOperation_t)g.transa, (cublasOperation_t)g.transb, g.m,
                                   g.n, g.k, g.lda, g.ldb, g.ldc, 1);
    if (status != CUBLAS_STATUS_SUCCESS)
        return status;
    char why[160];
    if (workspace_bytes > 0 && !cpu_inside_region(workspace, workspace_bytes, why, sizeof why)) {
        snprintf(cuda_on_cpu.message, sizeof cuda_on_cpu.message,
                 "%s: a workspace of %zu bytes at %p: %s", call, workspace_bytes, workspace, why);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (cpu_workspace_overlaps(workspace, workspace_bytes, stream, NULL, call))
        return CUBLAS_STATUS_INVALID_VALUE;
    g.call = call;
    g.alpha = *(const float *)alpha;
    g.beta = *(const float *)beta;
    g.A = A;
    g.B = B;
    g.C = (float *)D;
    return cpu_gemm_give(&g, stream);
}

// The epilogue's bias (m floats) and mask (aux_ld bits a column, n columns)
// inside their regions
static inline int cpu_epilogue_extents(const CpuGemm *g) {
    char why[160];
    size_t mask_bytes = (size_t)(g->aux_ld / 8) * (size_t)g->n;   // (whole columns, as
                                                                  // cuBLASLt may write them)
    if (!cpu_inside_region(g->bias, (size_t)g->m * sizeof(float), why, sizeof why)) {
        snprintf(cuda_on_cpu.message, sizeof cuda_on_cpu.message,
                 "%s: the epilogue's bias (%d floats) reaches %s", g->call, g->m, why);
        return 0;
    }
    if (mask_bytes > 0 && !cpu_inside_region(g->aux, mask_bytes, why, sizeof why)) {
        snprintf(cuda_on_cpu.message, sizeof cuda_on_cpu.message,
                 "%s: the epilogue's ReLU mask (%d x %d bits, %lld a column) reaches %s", g->call,
                 g->m, g->n, g->aux_ld, why);
        return 0;
    }
    return 1;
}

// The epilogue on D = alpha op(A) op(B) + beta C, which cpu_sgemm has written
static inline void cpu_epilogue_run(const CpuGemm *g) {
    if (cpu_test_faults.epilogues_skipped)
        return;
    for (int j = 0; j < g->n; j++) {
        for (int i = 0; i < g->m; i++) {
            float *d = &g->C[i + (size_t)j * g->ldc];
            size_t bit = (size_t)i + (size_t)j * (size_t)g->aux_ld;
            unsigned char mask = (unsigned char)(1u << (bit % 8));
            if (g->epilogue == CUBLASLT_EPILOGUE_RELU_AUX_BIAS) {
                float v = *d + g->bias[i];
                int positive = v > 0;
                *d = positive ? v : 0.0f;
                if (positive)
                    g->aux[bit / 8] |= mask;
                else
                    g->aux[bit / 8] &= (unsigned char)~mask;
            } else if (!(g->aux[bit / 8] & mask)) {   // CUBLASLT_EPILOGUE_DRELU_BGRAD
                *d = 0.0f;
            }
        }
    }
    if (g->epilogue != CUBLASLT_EPILOGUE_DRELU_BGRAD)
        return;
    for (int i = 0; i < g->m; i++) {
        float sum = 0;
        for (int j = 0; j < g->n; j++) sum += g->C[i + (size_t)j * g->ldc];
        g->bias[i] = sum;
    }
}

// ---- the streams' work run, graphs launched --------------------------------------

// One piece of work, checked again (the memory it names may have been freed
// since): nothing runs after a fault, as on a GPU.
static inline cudaError_t cpu_work_run(const CpuWork *w) {
    if (cuda_on_cpu.sticky_error)
        return cuda_on_cpu.sticky_error;
    cudaError_t e = cudaSuccess;
    if (w->kind == CPU_WORK_KERNEL) {
        cpu_launch_run(w->kernel, w->thread, w->args, w->grid, w->block, w->shared_bytes);
    } else if (w->kind == CPU_WORK_GEMM) {
        if (cpu_gemm_run(&w->gemm) != CUBLAS_STATUS_SUCCESS)
            e = cudaErrorIllegalAddress;
    } else if (w->kind == CPU_WORK_ALL_REDUCE) {
        e = cpu_all_reduce_run(w);
    } else if (w->kind == CPU_WORK_COPY) {
        size_t to_span = w->height ? (w->height - 1) * w->to_pitch + w->width : 0;
        size_t from_span = w->height ? (w->height - 1) * w->from_pitch + w->width : 0;
        e = cpu_check_copy(w->to, to_span, w->from, from_span, (cudaMemcpyKind)w->copy_kind,
                           w->call);
        if (e == cudaSuccess)
            cpu_copy_run(w->to, w->to_pitch, w->from, w->from_pitch, w->width, w->height, w->call);
    } else {
        e = cpu_check_device(w->to, w->width, w->call, "destination");
        if (e == cudaSuccess)
            cpu_memset_run(w->to, w->value, w->width, w->call);
    }
    if (e != cudaSuccess)
        cuda_on_cpu.sticky_error = e;   // its message is in cuda_on_cpu.message
    return cuda_on_cpu.sticky_error;
}

// The work given to streams that `until` waits for (NULL: all of it) runs
// now, each piece once all it waits for has run, in an order drawn at each
// call, as a GPU may run work that does not wait for each other in any
// order, or at once: each time, either a piece drawn at random among those
// that may run, or the streams ranked at random and the first stream's
// pieces run whenever they may (one stream running as far ahead of the
// others as it can). So work that a missing wait leaves unordered runs in
// another order from call to call, or step to step: one stream reading what
// the other has not written yet, or what it has overwritten already.
#define CPU_LANES 64
static inline void cpu_run_pending(const CpuFrontier *until) {
    int n = cuda_on_cpu.pending_count;
    if (n == 0 || cuda_on_cpu.running_pending)
        return;
    cuda_on_cpu.running_pending = 1;
    CpuWork *p = cuda_on_cpu.pending;
    long long base = cuda_on_cpu.pending_base;
    int *stack = (int *)malloc(((size_t)n + 1) * CPU_MOST_DEPENDENCIES * sizeof(int)), top = 0;
    if (!stack)
        cpu_die("out of memory for the streams' work");
    for (int i = 0; i < n; i++) p[i].needed = !until && !p[i].done;
    for (int i = 0; until && i < until->count; i++)
        if (!cpu_pending_done(until->on[i]))
            stack[top++] = (int)(until->on[i] - base);
    while (top > 0) {   // what `until` waits for, and what that waits for
        int i = stack[--top];
        if (p[i].needed)
            continue;
        p[i].needed = 1;
        for (int d = 0; d < p[i].after.count; d++)
            if (!cpu_pending_done(p[i].after.on[d]))
                stack[top++] = (int)(p[i].after.on[d] - base);
    }
    free(stack);
    cpu_device_hold(1);
    unsigned by_lane = cpu_random_below(3) > 0, rank[CPU_LANES];
    for (int l = 0; l < CPU_LANES; l++) rank[l] = cpu_random_below(1u << 30);
    for (;;) {
        int ready = 0, pick = -1;
        for (int i = 0; i < n; i++) {
            if (!p[i].needed || p[i].done)
                continue;
            int waits = 0;
            for (int d = 0; d < p[i].after.count && !waits; d++)
                waits = !cpu_pending_done(p[i].after.on[d]);
            if (waits)
                continue;
            ready++;
            if (by_lane) {
                if (pick < 0 || rank[p[i].lane % CPU_LANES] > rank[p[pick].lane % CPU_LANES])
                    pick = i;
            } else if (cpu_random_below((unsigned)ready) == 0) {
                pick = i;   // each of the ready ones with chance 1/ready
            }
        }
        if (pick < 0)
            break;
        p[pick].done = 1;
        p[pick].needed = 0;
        cpu_work_run(&p[pick]);
        free(p[pick].args);
        p[pick].args = NULL;
    }
    cpu_device_hold(0);
    int all_done = 1;
    for (int i = 0; i < n; i++) all_done &= p[i].done;
    if (all_done) {   // numbers below the new base have run
        cuda_on_cpu.pending_base += n;
        cuda_on_cpu.pending_count = 0;
    }
    cuda_on_cpu.running_pending = 0;
}

// After a fault a test caught: the work not run yet is dropped (a GPU's context is lost).
static inline void cpu_drop_pending(void) {
    for (int i = 0; i < cuda_on_cpu.pending_count; i++) free(cuda_on_cpu.pending[i].args);
    cuda_on_cpu.pending_base += cuda_on_cpu.pending_count;
    cuda_on_cpu.pending_count = 0;
    cuda_on_cpu.running_pending = 0;
}

// The graph's nodes given to the stream: those that wait for no other node
// wait for the stream's frontier, and the stream's later work waits for those
// that no node waits for. On the legacy stream they run now; on another, when
// something needs them (cpu_run_pending), in a new order each time.
static inline cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
    cudaError_t refused =
        cpu_capture_forbids("cudaGraphLaunch (a graph inside a graph is not modelled)");
    if (refused)
        return refused;
    if (!exec)
        return cudaErrorInvalidValue;
    if (cuda_on_cpu.sticky_error)
        return cuda_on_cpu.sticky_error;
    if (!stream)
        cpu_run_pending(NULL);
    CpuFrontier before = { 0, { 0 } };
    if (stream) {
        cpu_frontier_prune(&stream->after);
        before = stream->after;
    }
    long long first = cuda_on_cpu.pending_base + cuda_on_cpu.pending_count;
    for (int i = 0; i < exec->graph.count; i++) {
        cuda_on_cpu.pending = (CpuWork *)cpu_grow(cuda_on_cpu.pending, cuda_on_cpu.pending_count,
                                                  &cuda_on_cpu.pending_capacity, sizeof(CpuWork),
                                                  "out of memory for the streams' work");
        CpuWork *p = &cuda_on_cpu.pending[cuda_on_cpu.pending_count++];
        *p = exec->graph.work[i];
        p->done = 0;
        if (p->after.count == 0)
            p->after = before;
        else
            for (int d = 0; d < p->after.count; d++) p->after.on[d] += first;
        if (p->args) {
            p->args = malloc(p->args_size);
            if (!p->args)
                cpu_die("out of memory for a graph's launch");
            memcpy(p->args, exec->graph.work[i].args, p->args_size);
        }
    }
    if (stream) {
        stream->after.count = 0;
        for (int s = 0; s < exec->sinks.count; s++)
            cpu_frontier_add(&stream->after, first + exec->sinks.on[s]);
    } else {
        cpu_run_pending(NULL);
    }
    return cuda_on_cpu.sticky_error;
}

static inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    if (exec)
        cpu_graph_free(&exec->graph);
    free(exec);
    return cudaSuccess;
}

#endif // CUDA_ON_CPU_H
