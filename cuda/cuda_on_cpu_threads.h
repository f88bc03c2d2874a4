/* cuda_on_cpu_threads.h: a block's threads for cuda_on_cpu.h, run as a GPU runs them
 *
 * Included by cuda_on_cpu.h (its header comment says what this shows). Each
 * thread is a context of its own, so that it can wait in the middle of a
 * kernel: at __syncthreads until every thread of the block that has not
 * returned arrives (at the same call site: __syncthreads is a macro here that
 * passes its file and line), at a warp exchange (a shuffle or __syncwarp)
 * until the lanes its mask names have arrived with that mask (then each
 * shuffling lane reads the value of the lane it named).
 *
 * Fibers (the default): the threads take turns on one CPU thread. Whenever a
 * thread returns or waits, the next is drawn at random among those that can
 * run (not started yet, or released from a wait), so each launch runs in
 * another order. A thread that never waits runs to its end on the fiber of
 * the thread before it: a kernel without barriers costs no context switch.
 * Switches save and restore registers with sigsetjmp/siglongjmp (no system
 * call); a new fiber starts through makecontext, and where glibc's fortified
 * longjmp refuses to change stacks (_FORTIFY_SOURCE), every switch goes
 * through swapcontext.
 *
 * POSIX threads (-DCUDA_ON_CPU_THREADS): one thread per thread of the block,
 * all running at once, each woken by a condition variable of its own; one
 * lock guards the emulator's own state; the
 * kernels' memory accesses are unsynchronised, as on a GPU, so that
 * ThreadSanitizer sees every race between threads of a block. Blocks still
 * run one after another.
 *
 * Shared memory: one region, a guard page, then the block's bytes ending at
 * another guard page; the bytes between the first guard and the block's
 * start (less than a page) are a band marked with CPU_BAND_WORD, checked when
 * the block ends.
 */

enum { CPU_UNSTARTED, CPU_RUNNABLE, CPU_RUNNING, CPU_AT_BARRIER, CPU_AT_SHUFFLE, CPU_RETURNED };
#define CPU_MAX_THREADS 1024
#define CPU_WARP 32

#define CPU_BAND_WORD 0x7FC0DEADu   // a NaN, in the band below a block's shared memory

enum { CPU_SHUFFLE, CPU_SYNCWARP };   // the kinds of warp exchange

static struct {
    const char *kernel;
    void (*thread)(const void *);   // kernel_cpu_thread (CPU_KERNEL)
    const void *args;
    dim3 grid, block, index;
    unsigned threads;
    float *shared;                  // shared_bytes of NaN, ending at an unreadable page
    size_t shared_bytes;
    int skip_barriers;              // a test's fault
    volatile int running;           // a block is running: a fault stops its launch
    unsigned live;                  // threads that have not returned
    unsigned at_barrier, blocked;   // waiting at __syncthreads; at it or at a warp exchange
    const char *barrier_file;       // the __syncthreads the threads at_barrier wait at
    int barrier_line;
    unsigned char state[CPU_MAX_THREADS];
    // a thread waiting at a warp exchange (state CPU_AT_SHUFFLE): what it
    // gives, the lane it reads (CPU_WARP or more: its own value), and, once
    // released, what it read
    unsigned exchange_source[CPU_MAX_THREADS];
    float exchange_value[CPU_MAX_THREADS], exchange_result[CPU_MAX_THREADS];
    // each warp's exchanges gathering now (lanes of one never in another),
    // and its lanes that returned
    struct {
        struct {
            unsigned mask, arrived;
            int kind;
        } pending[CPU_WARP];
        int pending_count;
        unsigned returned;
    } warp[CPU_MAX_THREADS / CPU_WARP];
} cpu_block;

static inline dim3 cpu_thread_index(unsigned t) {
    dim3 i = { t % cpu_block.block.x, t / cpu_block.block.x % cpu_block.block.y,
               t / (cpu_block.block.x * cpu_block.block.y) };
    return i;
}
static inline unsigned cpu_linear_thread(void) {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
static inline int cpu_block_running(void) { return cpu_block.running; }

// The block's dynamic shared memory (extern __shared__ on a GPU).
static inline float *cpu_dynamic_shared(void) { return cpu_block.shared; }

static inline void cpu_release(unsigned t);
static inline void cpu_wait(unsigned t);
static inline void cpu_lock_block(void);
static inline void cpu_unlock_block(void);

// The shared memory region of `pages` pages between its two guard pages,
// mapped at its first use and kept (a few sizes serve every kernel): its band
// below the block's bytes is then less than a page.
static inline void cpu_use_shared_region(size_t pages) {
    size_t page = cuda_on_cpu.page, size = (pages + 2) * page;
    int n = cuda_on_cpu.shared_region_count, found = -1;
    for (int i = 0; i < n; i++)
        if (cuda_on_cpu.shared_regions[i].pages == pages)
            found = i;
    if (found < 0) {
        int max = (int)(sizeof cuda_on_cpu.shared_regions / sizeof *cuda_on_cpu.shared_regions);
        found = n < max ? cuda_on_cpu.shared_region_count++ : 0;
        if (n == max)
            munmap(cuda_on_cpu.shared_regions[0].region,
                   (cuda_on_cpu.shared_regions[0].pages + 2) * page);
        char *region = cpu_map(NULL, size, PROT_READ | PROT_WRITE);
        if (!region)
            cpu_die("cannot map shared memory");
        cpu_protect(region, page, PROT_NONE);
        cpu_protect(region + size - page, page, PROT_NONE);
        cuda_on_cpu.shared_regions[found].pages = pages;
        cuda_on_cpu.shared_regions[found].region = region;
    }
    cuda_on_cpu.shared_region = cuda_on_cpu.shared_regions[found].region;
    cuda_on_cpu.shared_region_size = size;
}

// A launch's blocks share its kernel, arguments, shape and shared memory size.
static inline void cpu_block_prepare(const char *kernel, void (*thread)(const void *),
                                     const void *args, dim3 grid, dim3 block, size_t shared_bytes) {
    cpu_lock_block();   // threads waiting for a block read its size
    cpu_use_shared_region(cpu_round_up(shared_bytes, cuda_on_cpu.page) / cuda_on_cpu.page);
    char *guard = cuda_on_cpu.shared_region + cuda_on_cpu.shared_region_size - cuda_on_cpu.page;
    cpu_block.shared = (float *)(guard - shared_bytes);
    cpu_block.shared_bytes = shared_bytes;
    cpu_block.kernel = kernel;
    cpu_block.thread = thread;
    cpu_block.args = args;
    cpu_block.grid = grid;
    cpu_block.block = block;
    cpu_block.threads = block.x * block.y * block.z;
    cpu_block.skip_barriers = cpu_test_faults.barriers_skipped &&
                              strcmp(cpu_test_faults.barriers_skipped, kernel) == 0;
    blockDim = block;
    gridDim = grid;
    cpu_unlock_block();
}

// The band below the block's shared memory: from the page after the first
// guard to the block's first byte. Byte at address a holds byte a % 4 of
// CPU_BAND_WORD (little-endian), so a float read from it is that NaN.
static inline unsigned char cpu_band_byte(const unsigned char *a) {
    return (unsigned char)(CPU_BAND_WORD >> (8 * ((uintptr_t)a % 4)));
}
static inline unsigned char *cpu_band_start(void) {
    return (unsigned char *)cuda_on_cpu.shared_region + cuda_on_cpu.page;
}

static inline void cpu_block_reset(dim3 index) {
    cpu_block.index = index;
    cpu_block.live = cpu_block.threads;
    cpu_block.at_barrier = cpu_block.blocked = 0;
    memset(cpu_block.state, CPU_UNSTARTED, cpu_block.threads);
    for (unsigned w = 0; w < (cpu_block.threads + CPU_WARP - 1) / CPU_WARP; w++) {
        cpu_block.warp[w].pending_count = 0;
        cpu_block.warp[w].returned = 0;
    }
    unsigned char *b = cpu_band_start(), *end = (unsigned char *)cpu_block.shared;
    for (; b + 4 <= end; b += 4)
        memcpy(b, &(uint32_t){ CPU_BAND_WORD }, 4);   // from a page: aligned words
    for (; b < end; b++) *b = cpu_band_byte(b);
    for (size_t i = 0; i < cpu_block.shared_bytes / sizeof(float); i++) cpu_block.shared[i] = NAN;
}

// After a block: the lowest byte below its shared memory that a thread wrote; NULL if none.
static inline const unsigned char *cpu_band_written(void) {
    const unsigned char *b = cpu_band_start(), *end = (const unsigned char *)cpu_block.shared;
    for (; b + 4 <= end; b += 4)
        if (*(const uint32_t *)(const void *)b != CPU_BAND_WORD)
            break;
    for (; b < end; b++)
        if (*b != cpu_band_byte(b))
            return b;
    return NULL;
}
static inline void cpu_block_check_band(void) {
    const unsigned char *written = cpu_band_written();
    if (written)
        cpu_fault_after_block(cudaErrorIllegalAddress, "%s, block (%u, %u): a thread wrote below "
                              "the block's shared memory, %zu bytes before its start (%zu bytes "
                              "given at launch)", cpu_block.kernel, cpu_block.index.x,
                              cpu_block.index.y,
                              (size_t)((const unsigned char *)cpu_block.shared - written),
                              cpu_block.shared_bytes);
}

// The barrier opens when every thread that has not returned waits at it.
static inline void cpu_barrier_check(void) {
    if (cpu_block.at_barrier == 0 || cpu_block.at_barrier < cpu_block.live)
        return;
    for (unsigned t = 0; t < cpu_block.threads; t++)
        if (cpu_block.state[t] == CPU_AT_BARRIER)
            cpu_release(t);
    cpu_block.at_barrier = 0;
}

// Every thread that can still run waits for another: none ever will.
static inline void cpu_deadlock_check(void) {
    if (cpu_block.live == 0 || cpu_block.blocked < cpu_block.live)
        return;
    cpu_fault(cudaErrorIllegalAddress, "%s: deadlock: of %u threads still running, %u wait at "
              "__syncthreads and %u at a warp shuffle", cpu_block.kernel, cpu_block.live,
              cpu_block.at_barrier, cpu_block.blocked - cpu_block.at_barrier);
}

static inline void cpu_thread_returned(unsigned t) {
    cpu_block.state[t] = CPU_RETURNED;
    cpu_block.live--;
    unsigned lane = t % CPU_WARP, w = t / CPU_WARP;
    cpu_block.warp[w].returned |= 1u << lane;
    for (int i = 0; i < cpu_block.warp[w].pending_count; i++)
        if (cpu_block.warp[w].pending[i].mask >> lane & 1)
            cpu_fault(cudaErrorIllegalAddress, "%s: thread %u returned while threads of its warp "
                      "wait at a shuffle (mask %#x) that names it", cpu_block.kernel, t,
                      cpu_block.warp[w].pending[i].mask);
    cpu_barrier_check();
    cpu_deadlock_check();
}

#ifndef CUDA_ON_CPU_THREADS
// ============================================================================
// Fibers
// ============================================================================

#if defined(_FORTIFY_SOURCE) && _FORTIFY_SOURCE > 0
#define CPU_SWITCH_BY_UCONTEXT 1
#endif
#ifdef CPU_ASAN
#define CPU_FIBER_STACK ((size_t)1 << 20)
#else
#define CPU_FIBER_STACK ((size_t)1 << 16)
#endif

typedef struct {
    sigjmp_buf jump;       // where it stopped (registers, stack pointer)
    ucontext_t context;    // how it starts
    int started;
    char *stack;
    size_t stack_size;
    int thread;            // the block's thread it runs; -1: none
    void *fake_stack;      // AddressSanitizer's
} CpuFiber;

static CpuFiber cpu_host = { .started = 1, .thread = -1 };   // the code that launched the kernel
static CpuFiber *cpu_current = &cpu_host;
static CpuFiber *cpu_free_fibers[CPU_MAX_THREADS + 1];
static int cpu_free_count;
static CpuFiber *cpu_fiber_of[CPU_MAX_THREADS];   // of each started thread that has not returned
static unsigned cpu_ready[CPU_MAX_THREADS], cpu_ready_count;   // unstarted or released threads
#ifdef CPU_ASAN
static const void *cpu_host_stack;                // the launching code's stack
static size_t cpu_host_stack_size;
#endif

static inline void cpu_switch(CpuFiber *to) {
    CpuFiber *from = cpu_current;
    if (to == from)
        return;
    cpu_current = to;
#ifdef CPU_ASAN
    __sanitizer_start_switch_fiber(&from->fake_stack, to == &cpu_host ? cpu_host_stack : to->stack,
                                   to == &cpu_host ? cpu_host_stack_size : to->stack_size);
#endif
#ifdef CPU_SWITCH_BY_UCONTEXT
    swapcontext(&from->context, &to->context);
#else
    if (sigsetjmp(from->jump, 0) == 0) {
        if (to->started)
            siglongjmp(to->jump, 1);
        to->started = 1;
        setcontext(&to->context);
    }
#endif
#ifdef CPU_ASAN
    __sanitizer_finish_switch_fiber(from->fake_stack, NULL, NULL);
#endif
}

static inline void cpu_fiber_main(void);

static inline void cpu_fiber_reset(CpuFiber *f) {
    getcontext(&f->context);
    f->context.uc_stack.ss_sp = f->stack;
    f->context.uc_stack.ss_size = f->stack_size;
    f->context.uc_link = NULL;
    makecontext(&f->context, cpu_fiber_main, 0);
    f->started = 0;
    f->thread = -1;
}

static inline CpuFiber *cpu_fiber_get(void) {
    if (cpu_free_count)
        return cpu_free_fibers[--cpu_free_count];
    CpuFiber *f = (CpuFiber *)calloc(1, sizeof *f);
    char *stack = cpu_map(NULL, CPU_FIBER_STACK + cuda_on_cpu.page, PROT_READ | PROT_WRITE);
    if (!f || !stack)
        cpu_die("out of memory for a fiber");
    cpu_protect(stack, cuda_on_cpu.page, PROT_NONE);   // an overflow stops at once
    f->stack = stack + cuda_on_cpu.page;
    f->stack_size = CPU_FIBER_STACK;
    cpu_fiber_reset(f);
    return f;
}

static inline void cpu_release(unsigned t) {
    cpu_block.state[t] = CPU_RUNNABLE;
    cpu_block.blocked--;
    cpu_ready[cpu_ready_count++] = t;
}

// A thread drawn at random among those that can run (and no longer ready); -1: none.
static inline int cpu_pick(void) {
    if (cpu_ready_count == 0)
        return -1;
    unsigned i = cpu_random_below(cpu_ready_count), t = cpu_ready[i];
    cpu_ready[i] = cpu_ready[--cpu_ready_count];
    return (int)t;
}

// The fiber that runs thread `next` (a free one for a thread not started yet);
// the launching code's when no thread is left.
static inline CpuFiber *cpu_fiber_for(int next) {
    if (next < 0)
        return &cpu_host;
    if (cpu_block.state[next] == CPU_UNSTARTED) {
        CpuFiber *f = cpu_fiber_get();
        f->thread = next;
        return f;
    }
    cpu_block.state[next] = CPU_RUNNING;
    threadIdx = cpu_thread_index((unsigned)next);
    return cpu_fiber_of[next];
}

static inline void cpu_run_thread(unsigned t) {
    cpu_block.state[t] = CPU_RUNNING;
    cpu_fiber_of[t] = cpu_current;
    threadIdx = cpu_thread_index(t);
    cpu_block.thread(cpu_block.args);
    cpu_fiber_of[t] = NULL;
    cpu_thread_returned(t);
}

// A fiber runs threads until one waits; when its thread returns it takes the
// next one drawn if that has not started, or else hands over and waits to be
// given another.
static inline void cpu_fiber_main(void) {
#ifdef CPU_ASAN
    const void *bottom;
    size_t size;
    __sanitizer_finish_switch_fiber(NULL, &bottom, &size);
    if (!cpu_host_stack) {   // the first comes from the host
        cpu_host_stack = bottom;
        cpu_host_stack_size = size;
    }
#endif
    for (;;) {
        CpuFiber *self = cpu_current;
        cpu_run_thread((unsigned)self->thread);
        int next = cpu_pick();
        if (next >= 0 && cpu_block.state[next] == CPU_UNSTARTED) {
            self->thread = next;
            continue;
        }
        self->thread = -1;
        cpu_free_fibers[cpu_free_count++] = self;
        cpu_switch(cpu_fiber_for(next));
    }
}

// Thread t has arrived at a barrier or a shuffle (released already if it was
// the last): the next thread drawn runs, perhaps t itself.
static inline void cpu_wait(unsigned t) {
    cpu_deadlock_check();
    int next = cpu_pick();
    if (next == (int)t) {
        cpu_block.state[t] = CPU_RUNNING;
        return;
    }
    cpu_switch(cpu_fiber_for(next));   // back when t is drawn
}

static inline void cpu_lock_block(void) {}
static inline void cpu_unlock_block(void) {}

// A fault inside the block: its threads are dropped, their fibers made new,
// and the launching code goes on with the fault (cpu_block_run).
static CpuFiber *cpu_faulted_fiber;
static inline _Noreturn void cpu_block_abandon(void) {
    cpu_faulted_fiber = cpu_current;
    cpu_switch(&cpu_host);
    cpu_die("a fiber resumed after its block was abandoned");
}


static inline void cpu_block_run(dim3 index) {
    blockIdx = index;
    cpu_block_reset(index);
    cpu_ready_count = 0;
    for (unsigned t = 0; t < cpu_block.threads; t++) cpu_ready[cpu_ready_count++] = t;
    cpu_block.running = 1;
    cpu_current = &cpu_host;
    cpu_switch(cpu_fiber_for(cpu_pick()));   // back when the block is done, or has faulted
    cpu_block.running = 0;
    if (!cpu_faulted_fiber) {
        cpu_block_check_band();
        return;
    }
    for (unsigned t = 0; t < cpu_block.threads; t++)
        if (cpu_fiber_of[t] && cpu_fiber_of[t] != cpu_faulted_fiber) {
            cpu_fiber_reset(cpu_fiber_of[t]);
            cpu_free_fibers[cpu_free_count++] = cpu_fiber_of[t];
        }
    memset(cpu_fiber_of, 0, sizeof cpu_fiber_of);
    cpu_fiber_reset(cpu_faulted_fiber);
    cpu_free_fibers[cpu_free_count++] = cpu_faulted_fiber;
    cpu_faulted_fiber = NULL;
    cpu_ready_count = 0;
    cpu_fault_finish(1);
}

#else
// ============================================================================
// POSIX threads
// ============================================================================

static pthread_mutex_t cpu_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cpu_wake[CPU_MAX_THREADS];   // worker t's: its block
                                                   // started, or it was released
static pthread_cond_t cpu_block_done = PTHREAD_COND_INITIALIZER;
static pthread_t cpu_workers[CPU_MAX_THREADS];
static unsigned cpu_worker_count;
static unsigned long cpu_blocks_started;

static inline void cpu_lock_block(void) { pthread_mutex_lock(&cpu_lock); }
static inline void cpu_unlock_block(void) { pthread_mutex_unlock(&cpu_lock); }

static inline void cpu_release(unsigned t) {
    cpu_block.state[t] = CPU_RUNNABLE;
    cpu_block.blocked--;
    pthread_cond_signal(&cpu_wake[t]);
}

// With the lock held: until t is released.
static inline void cpu_wait(unsigned t) {
    cpu_deadlock_check();
    while (cpu_block.state[t] != CPU_RUNNABLE)
        pthread_cond_wait(&cpu_wake[t], &cpu_lock);
    cpu_block.state[t] = CPU_RUNNING;
}

// Worker t runs thread t of every block that has one.
static inline void *cpu_worker(void *index) {
    unsigned t = (unsigned)(uintptr_t)index;
    unsigned long seen = 0;
    pthread_mutex_lock(&cpu_lock);
    for (;;) {
        while (cpu_blocks_started == seen || t >= cpu_block.threads) {
            if (t >= cpu_block.threads)
                seen = cpu_blocks_started;   // a block without thread t
            pthread_cond_wait(&cpu_wake[t], &cpu_lock);
        }
        seen = cpu_blocks_started;
        threadIdx = cpu_thread_index(t);
        blockIdx = cpu_block.index;
        blockDim = cpu_block.block;
        gridDim = cpu_block.grid;
        cpu_block.state[t] = CPU_RUNNING;
        pthread_mutex_unlock(&cpu_lock);
        cpu_block.thread(cpu_block.args);
        pthread_mutex_lock(&cpu_lock);
        cpu_thread_returned(t);
        if (cpu_block.live == 0)
            pthread_cond_signal(&cpu_block_done);
    }
    return NULL;
}

static inline _Noreturn void cpu_block_abandon(void) {
    fprintf(stderr, "error: cuda_on_cpu.h: %s\n", cuda_on_cpu.message);
    abort();
}

static inline void cpu_block_run(dim3 index) {
    pthread_mutex_lock(&cpu_lock);
    while (cpu_worker_count < cpu_block.threads) {
        pthread_attr_t attributes;
        pthread_attr_init(&attributes);
        pthread_attr_setstacksize(&attributes, (size_t)1 << 18);
        pthread_cond_init(&cpu_wake[cpu_worker_count], NULL);
        if (pthread_create(&cpu_workers[cpu_worker_count], &attributes, cpu_worker,
                           (void *)(uintptr_t)cpu_worker_count))
            cpu_die("cannot start a thread");
        pthread_attr_destroy(&attributes);
        cpu_worker_count++;
    }
    cpu_block_reset(index);
    cpu_block.running = 1;
    cpu_blocks_started++;
    for (unsigned t = 0; t < cpu_block.threads; t++) pthread_cond_signal(&cpu_wake[t]);
    while (cpu_block.live > 0)
        pthread_cond_wait(&cpu_block_done, &cpu_lock);
    cpu_block.running = 0;
    pthread_mutex_unlock(&cpu_lock);
    cpu_block_check_band();
}
#endif

// ---- barriers and warp exchanges --------------------------------------------

// __syncthreads: the threads of a block meet here, all at the same call site
// (two are two barriers on a GPU: a hang, or threads let through early).
#define __syncthreads() cpu_syncthreads(__FILE__, __LINE__)
static inline void cpu_syncthreads(const char *file, int line) {
    if (cpu_block.skip_barriers)
        return;
    cpu_lock_block();
    unsigned t = cpu_linear_thread();
    if (cpu_block.at_barrier == 0) {
        cpu_block.barrier_file = file;
        cpu_block.barrier_line = line;
    } else if (line != cpu_block.barrier_line || strcmp(file, cpu_block.barrier_file) != 0) {
        cpu_fault(cudaErrorIllegalAddress, "%s: thread %u waits at the __syncthreads of %s:%d "
                  "while other threads of its block wait at the one of %s:%d: on a GPU these are "
                  "two barriers (a hang, or threads let through early)", cpu_block.kernel, t, file,
                  line, cpu_block.barrier_file, cpu_block.barrier_line);
    }
    cpu_block.state[t] = CPU_AT_BARRIER;
    cpu_block.at_barrier++;
    cpu_block.blocked++;
    cpu_barrier_check();
    cpu_wait(t);
    cpu_unlock_block();
}

// The exchange gathering in thread t's warp that t joins with `mask`: the one
// with that mask, or a new one. Faults: a mask that leaves t out or names lanes
// the block does not have or that have returned; an exchange gathering with
// another mask that shares lanes with this one, or of another kind.
static inline int cpu_exchange_join(unsigned t, unsigned mask, int kind) {
    unsigned lane = t % CPU_WARP, first = t - lane, lanes = cpu_block.threads - first,
             w = t / CPU_WARP;
    unsigned existing = lanes >= CPU_WARP ? 0xffffffffu : (1u << lanes) - 1;
    const char *what = kind == CPU_SHUFFLE ? "a shuffle" : "__syncwarp";
    if (!(mask >> lane & 1))
        cpu_fault(cudaErrorIllegalAddress,
                  "%s: thread %u is at %s with mask %#x, which leaves it out", cpu_block.kernel, t,
                  what, mask);
    if (mask & ~existing)
        cpu_fault(cudaErrorIllegalAddress, "%s: thread %u is at %s with mask %#x in a block of %u "
                  "threads: it names lanes past the block's last thread", cpu_block.kernel, t, what,
                  mask, cpu_block.threads);
    unsigned gone = mask & cpu_block.warp[w].returned;
    if (gone)
        cpu_fault(cudaErrorIllegalAddress,
                  "%s: thread %u waits at a shuffle that names thread %u, which has returned",
                  cpu_block.kernel, t, first + (unsigned)__builtin_ctz(gone));
    int n = cpu_block.warp[w].pending_count;
    for (int i = 0; i < n; i++) {
        unsigned other = cpu_block.warp[w].pending[i].mask;
        if (!(other & mask))
            continue;
        if (other != mask || cpu_block.warp[w].pending[i].kind != kind)
            cpu_fault(cudaErrorIllegalAddress, "%s: thread %u is at %s with mask %#x while lanes "
                      "of its warp wait at %s with mask %#x: a GPU's lanes must all reach the same "
                      "one", cpu_block.kernel, t, what, mask,
                      cpu_block.warp[w].pending[i].kind == CPU_SHUFFLE ? "a shuffle" : "__syncwarp",
                      other);
        return i;
    }
    cpu_block.warp[w].pending[n].mask = mask;
    cpu_block.warp[w].pending[n].arrived = 0;
    cpu_block.warp[w].pending[n].kind = kind;
    cpu_block.warp[w].pending_count = n + 1;
    return n;
}

// Thread t meets the lanes `mask` names: it gives `value` and, once all have
// arrived, gets the value of lane `source` (CPU_WARP or more: its own; a lane
// outside the mask: NaN, undefined on a GPU).
static inline float cpu_warp_exchange(int kind, unsigned mask, float value, unsigned source) {
    unsigned t = cpu_linear_thread(), lane = t % CPU_WARP, first = t - lane, w = t / CPU_WARP;
    cpu_lock_block();
    int i = cpu_exchange_join(t, mask, kind);
    cpu_block.exchange_source[t] = source;
    cpu_block.exchange_value[t] = value;
    cpu_block.state[t] = CPU_AT_SHUFFLE;
    cpu_block.blocked++;
    if ((cpu_block.warp[w].pending[i].arrived |= 1u << lane) == mask) {
        for (unsigned l = 0; l < CPU_WARP; l++) {
            if (!(mask >> l & 1))
                continue;
            unsigned u = first + l, from = cpu_block.exchange_source[u];
            cpu_block.exchange_result[u] = from >= CPU_WARP ? cpu_block.exchange_value[u]
                                         : mask >> from & 1 ? cpu_block.exchange_value[first + from]
                                         : NAN;
            cpu_release(u);
        }
        cpu_block.warp[w].pending[i] = cpu_block.warp[w].pending[--cpu_block.warp[w].pending_count];
    }
    cpu_wait(t);
    float result = cpu_block.exchange_result[t];
    cpu_unlock_block();
    return result;
}

static inline float __shfl_xor_sync(unsigned mask, float value, int lane_mask) {
    return cpu_warp_exchange(CPU_SHUFFLE, mask, value,
                             ((cpu_linear_thread() % CPU_WARP) ^ (unsigned)lane_mask) % CPU_WARP);
}
// A lane whose lane + delta is past the warp keeps its own value.
static inline float __shfl_down_sync(unsigned mask, float value, unsigned delta) {
    return cpu_warp_exchange(CPU_SHUFFLE, mask, value, cpu_linear_thread() % CPU_WARP + delta);
}
static inline float __shfl_sync(unsigned mask, float value, int source_lane) {
    return cpu_warp_exchange(CPU_SHUFFLE, mask, value, (unsigned)source_lane % CPU_WARP);
}
static inline void __syncwarp(unsigned mask) {
    if (!cpu_block.skip_barriers)
        cpu_warp_exchange(CPU_SYNCWARP, mask, 0.0f, CPU_WARP);
}
