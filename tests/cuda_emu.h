/* cuda_emu.h - a host emulation of the CUDA runtime and cuBLASLt calls the
   CUDA backend makes, so that tests/test_cuda.c runs its GPU tests where
   there is no GPU and no CUDA toolkit. It is force-included into
   cuda/mixprec_cuda.cu compiled as C++ by the host compiler, with the
   stand-in headers of tests/cuda_emu/ (cuda_runtime.h, cuda_fp16.h,
   cuda_bf16.h, cublasLt.h: the declarations the backend uses, with CUDA's
   values) in place of CUDA's:

       g++ -std=c++14 -x c++ -include tests/cuda_emu.h -Itests/cuda_emu \
           -c cuda/mixprec_cuda.cu -o mixprec_cuda_emu.o

   and the test links that object instead of the library (no libcudart, no
   cuBLASLt). The real headers check the code in `make cuda` (nvcc).

   The device is lazy, as strict as a GPU may be: every launch, copy,
   memset and product is queued on its stream and runs only when the host
   waits for it (cudaStreamSynchronize, cudaEventSynchronize, a copy to
   pageable memory) or when a stream runs into a cudaStreamWaitEvent; so a
   missing wait reads stale data, and a host buffer changed before its copy
   ran is sent changed. Each rule below cites the CUDA or cuBLASLt
   documentation it models ("RT" is the CUDA Runtime API reference, "PG"
   the CUDA C++ Programming Guide, "LT" the cuBLAS guide's cuBLASLt part).

   What else it checks: every kernel's indexing and logic (kernels run
   block by block; a block's threads are fibers, so __syncthreads is a
   real barrier and warp shuffles exchange values among a warp's lanes,
   see >>threads; a kernel missing a barrier reads wrong data; atomics are
   plain updates); that a kernel's pointer arguments are device (or pinned)
   memory; the row-major to column-major mapping of every product, which a
   reference cublasLtMatmul computes from the descriptors as cuBLASLt
   documents them (D = alpha op(A) op(B) + beta C + bias per row of D,
   float32 accumulation, TF32 rounding of the inputs under
   CUBLAS_COMPUTE_32F_FAST_TF32, one rounding into D's type); cuBLASLt's
   table of type combinations; that every pointer a copy, memset or product
   uses lies in device memory (host memory in registered blocks, filled
   with 0xA5 when allocated, so nothing relies on fresh memory being zero)
   and is as aligned as the heuristic was promised; a bias the BIAS
   epilogue reads 16-byte aligned. A fault (an illegal or misaligned
   address) is sticky, as on a GPU: every later call returns it. It counts
   launches, host waits, drains and copies (cuda_emu_counters, for the
   tests). What it cannot check: CUDA's own rounding of expf/erff/... (the
   host's libm runs), launch limits beyond an empty grid, cuBLASLt's real
   algorithms, timing, real concurrency between streams.
   In the environment, MIXPREC_CUDA_EMU_NO_BF16=1 makes the heuristic find
   no bfloat16 algorithm (as before Ampere), MIXPREC_CUDA_EMU_NO_PEDANTIC=1
   none for CUBLAS_COMPUTE_32F_PEDANTIC, and MIXPREC_CUDA_EMU_RUN_REFUSES=1
   makes cublasLtMatmul itself answer CUBLAS_STATUS_NOT_SUPPORTED for
   16-bit operands (a plan the heuristic gave that cannot run after all):
   each tests a fallback. MIXPREC_CUDA_EMU_EAGER=1 runs the streams in the
   other legal order: at a host wait, the other streams first (>>streams). */
#ifndef MIXPREC_CUDA_EMU_H
#define MIXPREC_CUDA_EMU_H

#include <cuda_runtime.h>
#ifndef MIXPREC_CUDA_EMU_RUNTIME_H
#error "cuda_emu.h needs its stand-in headers first on the include path: -Itests/cuda_emu"
#endif
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <deque>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

/* >>counters: what the tests read through cuda_emu_counters() */
extern "C" {
typedef struct cuda_emu_counts {
    unsigned long long launches;   /* kernels and cuBLASLt products queued */
    unsigned long long waits;      /* host waits that found queued work to wait for */
    unsigned long long drains;     /* of those, the ones that left every stream idle */
    unsigned long long pageable;   /* copies from or to pageable host memory */
    unsigned long long pinned;     /* copies from or to pinned (cudaHostAlloc) memory */
    unsigned long long bytes_in;   /* bytes copied host to device */
    unsigned long long heuristics; /* cublasLtMatmulAlgoGetHeuristic calls */
} cuda_emu_counts;
void cuda_emu_counters(cuda_emu_counts *out);
void cuda_emu_fault_after(long launches); /* the launch after `launches` more faults (illegal address) */
void cuda_emu_clear_fault(void);          /* test_cuda_emu only: a fresh process, as far as faults go */
}
static cuda_emu_counts emu_count;
void cuda_emu_counters(cuda_emu_counts *out) { *out = emu_count; }

/* >>errors. RT "Error Handling": a call's error is returned and remembered
   for cudaGetLastError, which resets it; a fault in a kernel (an illegal or
   misaligned address) is reported asynchronously by a later call and is
   sticky (PG "Error Checking"): the context is unusable, every call returns
   it, cudaGetLastError does not clear it. */
static cudaError_t emu_error = cudaSuccess; /* what cudaGetLastError returns next */
static cudaError_t emu_sticky = cudaSuccess;
static long emu_fault_countdown = -1;        /* cuda_emu_fault_after: launches until an injected fault */
void cuda_emu_fault_after(long launches) { emu_fault_countdown = launches; }
void cuda_emu_clear_fault(void) { emu_sticky = emu_error = cudaSuccess; }

static cudaError_t emu_fail(cudaError_t e) {
    emu_error = e;
    return e;
}
static void emu_fault(cudaError_t e, const char *why) {
    if (emu_sticky == cudaSuccess) fprintf(stderr, "cuda_emu: device fault (sticky): %s\n", why);
    if (emu_sticky == cudaSuccess) emu_sticky = e;
}
/* Every runtime call starts here: a sticky fault answers it. */
#define EMU_STICKY()                                   \
    do {                                               \
        if (emu_sticky != cudaSuccess) return emu_sticky; \
    } while (0)

/* >>memory: device blocks and pinned host blocks, registered */
#define EMU_BLOCKS 4096
typedef struct emu_block {
    char *p;
    size_t bytes;
} emu_block;
static emu_block emu_blocks[EMU_BLOCKS], emu_pinned[EMU_BLOCKS];

static int emu_in(const emu_block *set, const void *p, size_t bytes) {
    const char *c = (const char *)p;
    int i;
    for (i = 0; i < EMU_BLOCKS; i++)
        if (set[i].p && c >= set[i].p && c + bytes <= set[i].p + set[i].bytes) return 1;
    return 0;
}
static int emu_on_device(const void *p, size_t bytes) { return emu_in(emu_blocks, p, bytes); }
static int emu_is_pinned(const void *p, size_t bytes) { return emu_in(emu_pinned, p, bytes); }

static cudaError_t emu_register(emu_block *set, void **p, size_t bytes) {
    int i;
    for (i = 0; i < EMU_BLOCKS && set[i].p; i++) {}
    /* exactly `bytes` (ASan sees a kernel's overrun), 256-byte aligned as cudaMalloc's (RT cudaMalloc) */
    if (i == EMU_BLOCKS || posix_memalign(p, 256, bytes ? bytes : 1) != 0) return emu_fail(cudaErrorMemoryAllocation);
    memset(*p, 0xA5, bytes);
    set[i].p = (char *)*p;
    set[i].bytes = bytes;
    return cudaSuccess;
}
static cudaError_t emu_unregister(emu_block *set, void *p) {
    int i;
    if (!p) return cudaSuccess;
    for (i = 0; i < EMU_BLOCKS && set[i].p != p; i++) {}
    if (i == EMU_BLOCKS) return emu_fail(cudaErrorInvalidValue);
    free(p);
    set[i].p = NULL;
    return cudaSuccess;
}

/* >>streams: a queue each; work runs only when the host waits for it */
struct CUstream_st {
    std::deque<std::function<void()>> queue;
    unsigned long long queued, done; /* operations ever queued; ever run */
};
struct CUevent_st {
    cudaStream_t stream; /* where it was last recorded; NULL: never */
    unsigned long long at;  /* that stream's operations before it */
};
static std::vector<cudaStream_t> emu_streams;
static CUstream_st emu_null_stream; /* the legacy default stream (0) */

static cudaStream_t emu_stream_of(cudaStream_t s) { return s ? s : &emu_null_stream; }

static int emu_stream_ok(cudaStream_t s) {
    size_t i;
    if (!s) return 1;
    for (i = 0; i < emu_streams.size(); i++)
        if (emu_streams[i] == s) return 1;
    return 0;
}

static void emu_enqueue(cudaStream_t s, std::function<void()> op) {
    s = emu_stream_of(s);
    s->queue.push_back(op);
    s->queued++;
}

/* Runs s's queue up to operation `upto`. After a fault nothing more runs
   (its work is dropped, as a faulted context's). */
static void emu_run(cudaStream_t s, unsigned long long upto) {
    s = emu_stream_of(s);
    while (s->done < upto && !s->queue.empty()) {
        std::function<void()> op = s->queue.front();
        s->queue.pop_front();
        s->done++;
        if (emu_sticky == cudaSuccess) op();
    }
}

static int emu_all_idle(void) {
    size_t i;
    for (i = 0; i < emu_streams.size(); i++)
        if (!emu_streams[i]->queue.empty()) return 0;
    return emu_null_stream.queue.empty();
}

/* MIXPREC_CUDA_EMU_EAGER=1: a host wait first lets every other stream,
   the newest first, run all it has queued (as far as its event waits
   allow, which run the stream they wait on up to the event, as always),
   then the stream waited for. Streams may run their work out of order
   with respect to one another (PG "Streams"), so this order is as legal
   as the lazy one, and its other extreme: work on the copy stream runs
   before earlier work of the compute stream that no event orders it
   after. On an H200 a scratch memset queued on the compute stream ran
   after the copy stream's upload into that scratch and zeroed the batch
   (tests/gpu.sh); the lazy order hid it, this one shows it. The counts
   (waits, drains) are the lazy order's: test_cuda checks them only
   without this. */
static int emu_eager(void) { return getenv("MIXPREC_CUDA_EMU_EAGER") != NULL; }

static void emu_run_others(cudaStream_t s) {
    size_t i;
    for (i = emu_streams.size(); i-- > 0;)
        if (emu_streams[i] != s) emu_run(emu_streams[i], emu_streams[i]->queued);
    if (s != &emu_null_stream) emu_run(&emu_null_stream, emu_null_stream.queued);
}

/* A host wait for s up to `upto`: counted when there was work to wait for,
   and as a drain when it leaves the device with nothing queued (a GPU
   would idle until the host queues more). */
static void emu_wait(cudaStream_t s, unsigned long long upto) {
    s = emu_stream_of(s);
    if (s->done >= upto) return;
    emu_count.waits++;
    if (emu_eager()) emu_run_others(s);
    emu_run(s, upto);
    if (emu_all_idle()) emu_count.drains++;
}

static void emu_run_all(void) {
    size_t i;
    for (i = 0; i < emu_streams.size(); i++) emu_run(emu_streams[i], emu_streams[i]->queued);
    emu_run(&emu_null_stream, emu_null_stream.queued);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    (void)flags;
    EMU_STICKY();
    *s = new CUstream_st();
    emu_streams.push_back(*s);
    return cudaSuccess;
}
/* RT cudaStreamDestroy: work still queued completes before the stream's
   resources go; the host does not wait. */
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    size_t i;
    if (!s || !emu_stream_ok(s)) return emu_fail(cudaErrorInvalidResourceHandle);
    emu_run(s, s->queued);
    for (i = 0; i < emu_streams.size(); i++)
        if (emu_streams[i] == s) emu_streams.erase(emu_streams.begin() + (long)i);
    delete s;
    return emu_sticky;
}
/* RT cudaStreamSynchronize: blocks until the stream has completed all
   operations; "may also return error codes from previous, asynchronous
   launches" (the sticky fault). */
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (!emu_stream_ok(s)) return emu_fail(cudaErrorInvalidResourceHandle);
    emu_wait(s, emu_stream_of(s)->queued);
    return emu_sticky;
}
/* RT cudaStreamQuery: cudaErrorNotReady while work is queued (never runs it). */
cudaError_t cudaStreamQuery(cudaStream_t s) {
    EMU_STICKY();
    if (!emu_stream_ok(s)) return emu_fail(cudaErrorInvalidResourceHandle);
    return emu_stream_of(s)->queue.empty() ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    (void)flags;
    EMU_STICKY();
    *e = new CUevent_st();
    (*e)->stream = NULL;
    (*e)->at = 0;
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e) return emu_fail(cudaErrorInvalidResourceHandle);
    delete e;
    return emu_sticky;
}
/* RT cudaEventRecord: captures the stream's work queued so far; a later
   record replaces it. */
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    EMU_STICKY();
    if (!e || !emu_stream_ok(s)) return emu_fail(cudaErrorInvalidResourceHandle);
    e->stream = emu_stream_of(s);
    e->at = e->stream->queued;
    return cudaSuccess;
}
static int emu_event_done(cudaEvent_t e) { return !e->stream || e->stream->done >= e->at; }
cudaError_t cudaEventQuery(cudaEvent_t e) {
    EMU_STICKY();
    if (!e) return emu_fail(cudaErrorInvalidResourceHandle);
    return emu_event_done(e) ? cudaSuccess : cudaErrorNotReady;
}
/* RT cudaEventSynchronize: waits for the work the event captured (an
   event never recorded: returns at once). */
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!e) return emu_fail(cudaErrorInvalidResourceHandle);
    if (e->stream) emu_wait(e->stream, e->at);
    return emu_sticky;
}
/* RT cudaStreamWaitEvent: the stream's later work waits for the event's
   work as of this call (the host does not). */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    (void)flags;
    EMU_STICKY();
    if (!e || !emu_stream_ok(s)) return emu_fail(cudaErrorInvalidResourceHandle);
    if (e->stream && emu_stream_of(s) != e->stream) {
        cudaStream_t from = e->stream;
        unsigned long long at = e->at;
        emu_enqueue(s, [from, at]() { emu_run(from, at); });
    }
    return cudaSuccess;
}

/* >>launches: a kernel's arguments are taken at the launch (by value, as
   PG "Execution Configuration"), its grid runs when its stream does */
static uint3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;

/* A kernel may dereference only device memory, or pinned host memory
   (PG "Mapped Memory": with unified addressing, cudaHostAlloc's memory is
   mapped at the same address); anything else is an illegal address. */
template <typename T>
static void emu_check_arg(const T &, const char *) {}
template <typename T>
static void emu_check_arg(T *const &p, const char *kernel) {
    if (p && !emu_on_device(p, 1) && !emu_is_pinned(p, 1)) {
        char why[160];
        snprintf(why, sizeof why, "%s was given a pointer to host memory that is not pinned", kernel);
        emu_fault(cudaErrorIllegalAddress, why);
    }
}

/* >>threads: a block's threads as fibers (POSIX makecontext/swapcontext),
   so that barriers and warp shuffles are real. The rules modelled:
   PG "Synchronization Functions": __syncthreads() waits until every
   thread of the block has reached it, and makes the shared and global
   memory writes made before it visible to the block; in conditional code
   it is allowed only if the condition is the same for the whole block
   (otherwise a GPU may hang): here a barrier some thread of the block
   never reaches (it exited) is a fault.
   PG "Warp Shuffle Functions": __shfl_xor_sync/__shfl_down_sync exchange
   a variable among the lanes of a warp named in mask; every non-exited
   thread named must execute the same intrinsic with the same mask, and a
   lane reads its source lane's value (its own where the source is past its
   segment of width lanes): here a shuffle some named lane does not reach
   (it exited, or waits at another barrier) is a fault.
   How: the block's threads start in threadIdx order, each running until
   it reaches a barrier, a shuffle or its end; when no thread can go on the
   waits are resolved (a warp whose lanes all wait at a shuffle first, else
   the block's barrier) and the waiting threads go on, again in order. So a
   thread that reads what a higher-numbered thread writes before the
   barrier that should separate them reads what was there before: a
   kernel missing a __syncthreads reads wrong data here (test_cuda_emu
   shows it). Threads that never wait run one after another on one fiber:
   a grid-stride kernel costs two context switches a block. On x86-64 a
   switch is emu_switch below: glibc's swapcontext also saves and restores
   the signal mask, a system call per switch (a third of test_cuda's time). */
#define EMU_WARP 32
#define EMU_MAX_THREADS 1024
#define EMU_STACK ((size_t)256 << 10)
enum { EMU_RUNS, EMU_AT_BARRIER, EMU_AT_SHUFFLE, EMU_EXITED };
typedef struct emu_thread {
    int at, fiber;
    unsigned mask, src; /* at a shuffle: its mask and source lane (threadIdx) */
    uint64_t value;     /* the value it offers; then the one it receives */
} emu_thread;
/* emu_switch(&save, load): saves the running stack's registers on it and
   its pointer in save, then goes on from the stack at load (one emu_switch
   saved, or a new one emu_start_fiber laid out as if it had). What it keeps
   is what a call must preserve in the System V x86-64 ABI (3.2.1, 3.2.3):
   rbx, rbp, r12-r15, rsp, MXCSR's control bits and the x87 control word. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define EMU_SWITCH 1
extern "C" void emu_switch(void **save, void *load);
__asm__(".pushsection .text\n"
        ".p2align 4\n"
        "emu_switch:\n"
        "    pushq %rbp\n    pushq %rbx\n    pushq %r12\n    pushq %r13\n    pushq %r14\n    pushq %r15\n"
        "    subq $8, %rsp\n    stmxcsr (%rsp)\n    fnstcw 4(%rsp)\n"
        "    movq %rsp, (%rdi)\n    movq %rsi, %rsp\n"
        "    ldmxcsr (%rsp)\n    fldcw 4(%rsp)\n    addq $8, %rsp\n"
        "    popq %r15\n    popq %r14\n    popq %r13\n    popq %r12\n    popq %rbx\n    popq %rbp\n"
        "    ret\n"
        ".popsection\n");
#endif

typedef struct emu_fiber {
#ifdef EMU_SWITCH
    void *sp; /* where emu_switch left it */
#else
    ucontext_t ctx;
#endif
    char *stack; /* EMU_STACK bytes above a guard page */
    void *fake;  /* ASan's fake stack while switched away */
} emu_fiber;
static emu_thread emu_threads[EMU_MAX_THREADS];
static emu_fiber emu_fibers[EMU_MAX_THREADS];
#ifdef EMU_SWITCH
static void *emu_host_sp;
#else
static ucontext_t emu_host_ctx;
#endif
static int emu_fiber_now = -1; /* the fiber running; -1: the host */
static unsigned emu_started, emu_block_threads;
static const std::function<void()> *emu_thread_body;

/* ASan must be told when the stack changes (its fiber annotations) */
#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/common_interface_defs.h>
static void *emu_host_fake;
static const void *emu_host_bottom;
static size_t emu_host_size;
#endif

/* Switches from the host to fiber f, or from the running fiber back to
   the host (`last`: that fiber is done and never resumed). */
static void emu_to_fiber(int f) {
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(&emu_host_fake, emu_fibers[f].stack, EMU_STACK);
#endif
    emu_fiber_now = f;
#ifdef EMU_SWITCH
    emu_switch(&emu_host_sp, emu_fibers[f].sp);
#else
    swapcontext(&emu_host_ctx, &emu_fibers[f].ctx);
#endif
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(emu_host_fake, NULL, NULL);
#endif
    emu_fiber_now = -1;
}
static void emu_fiber_entered(int f) {
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(emu_fibers[f].fake, &emu_host_bottom, &emu_host_size);
#else
    (void)f;
#endif
}
static void emu_to_host(int last) {
    int f = emu_fiber_now;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(last ? NULL : &emu_fibers[f].fake, emu_host_bottom, emu_host_size);
#else
    (void)last;
#endif
#ifdef EMU_SWITCH
    emu_switch(&emu_fibers[f].sp, emu_host_sp);
#else
    swapcontext(&emu_fibers[f].ctx, &emu_host_ctx);
#endif
    emu_fiber_entered(f);
}

/* A fiber runs the block's next threads until one waits (it stays with
   that thread) or none is left. */
static void emu_fiber_main(void) {
    int f = emu_fiber_now;
    emu_fiber_entered(f);
    while (emu_started < emu_block_threads) {
        unsigned t = emu_started++;
        emu_threads[t].at = EMU_RUNS;
        emu_threads[t].fiber = f;
        threadIdx.x = t;
        (*emu_thread_body)();
        emu_threads[t].at = EMU_EXITED;
    }
    emu_to_host(1);
}

static void emu_start_fiber(int f) {
    emu_fiber *fb = &emu_fibers[f];
    if (!fb->stack) { /* kept for the process: the next block reuses it */
        char *p = (char *)mmap(NULL, EMU_STACK + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == (char *)MAP_FAILED || mprotect(p, 4096, PROT_NONE) != 0) {
            fprintf(stderr, "cuda_emu: no memory for a thread's stack\n");
            abort();
        }
        fb->stack = p + 4096;
    }
#ifdef EMU_SWITCH
    { /* what emu_switch pops, top down: a return address into
         emu_fiber_main (entered with rsp + 8 16-byte aligned; it never
         returns, so above it a null one), six registers, MXCSR and the x87
         control word (the host's) */
        void **sp = (void **)(fb->stack + EMU_STACK); /* 16-byte aligned: a page's end */
        uint32_t control[2] = {0, 0};
        __asm__ volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(control[0]), "=m"(control[1]));
        *--sp = NULL;
        *--sp = (void *)emu_fiber_main;
        for (int r = 0; r < 6; r++) *--sp = NULL;
        memcpy(--sp, control, sizeof control);
        fb->sp = sp;
    }
#else
    getcontext(&fb->ctx);
    fb->ctx.uc_stack.ss_sp = fb->stack;
    fb->ctx.uc_stack.ss_size = EMU_STACK;
    fb->ctx.uc_link = NULL;
    makecontext(&fb->ctx, emu_fiber_main, 0);
#endif
    emu_to_fiber(f);
}

/* The running thread waits (at is EMU_AT_BARRIER or EMU_AT_SHUFFLE). */
static void emu_wait_here(int at, const char *what) {
    unsigned t = threadIdx.x;
    if (emu_fiber_now < 0) {
        fprintf(stderr, "cuda_emu: %s called outside a kernel\n", what);
        abort();
    }
    emu_threads[t].at = at;
    emu_to_host(0);
    threadIdx.x = t;
}

static inline void __syncthreads(void) { emu_wait_here(EMU_AT_BARRIER, "__syncthreads"); }

template <typename T>
static T emu_shuffle(unsigned mask, T v, unsigned src_lane, const char *what) {
    emu_thread *me = &emu_threads[threadIdx.x];
    static_assert(sizeof(T) <= sizeof(uint64_t), "a shuffled value is at most 8 bytes");
    me->mask = mask;
    me->src = threadIdx.x - threadIdx.x % EMU_WARP + src_lane;
    me->value = 0;
    memcpy(&me->value, &v, sizeof v);
    emu_wait_here(EMU_AT_SHUFFLE, what);
    memcpy(&v, &me->value, sizeof v);
    return v;
}
/* PG "Warp Shuffle Functions": the source lane is laneId ^ laneMask, or
   laneId + delta; past the lane's segment of width lanes, its own value. */
template <typename T>
static T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = EMU_WARP) {
    unsigned lane = threadIdx.x % EMU_WARP, src = lane ^ (unsigned)lane_mask;
    return emu_shuffle(mask, v, src / (unsigned)width > lane / (unsigned)width ? lane : src, "__shfl_xor_sync");
}
template <typename T>
static T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = EMU_WARP) {
    unsigned lane = threadIdx.x % EMU_WARP;
    return emu_shuffle(mask, v, lane % (unsigned)width + delta < (unsigned)width ? lane + delta : lane, "__shfl_down_sync");
}

/* A warp whose every lane waits at a shuffle: each receives its source's
   value. 0: not every lane is there yet; -1: the shuffle is broken. */
static int emu_resolve_warp(unsigned w, int *go) {
    unsigned first = w * EMU_WARP, end = first + EMU_WARP < emu_block_threads ? first + EMU_WARP : emu_block_threads, t;
    uint64_t got[EMU_WARP];
    for (t = first; t < end; t++)
        if (emu_threads[t].at != EMU_AT_SHUFFLE) return 0;
    for (t = first; t < end; t++) {
        const emu_thread *me = &emu_threads[t];
        if (me->mask != emu_threads[first].mask || !(me->mask >> (t - first) & 1u) || me->src >= end ||
            !(me->mask >> (me->src - first) & 1u))
            return -1;
        got[t - first] = emu_threads[me->src].value;
    }
    for (t = first; t < end; t++) emu_threads[t].value = got[t - first], go[t] = 1;
    return 1;
}

/* Runs one block's threads to their end. */
static void emu_run_block(const std::function<void()> &body) {
    int go[EMU_MAX_THREADS], fibers = 0;
    unsigned n = blockDim.x, t, w;
    emu_thread_body = &body;
    emu_block_threads = n;
    emu_started = 0;
    while (emu_started < n) emu_start_fiber(fibers++);
    for (;;) {
        unsigned exited = 0, at_barrier = 0;
        int released = 0, broken = 0;
        memset(go, 0, n * sizeof go[0]);
        for (w = 0; w * EMU_WARP < n; w++) {
            int r = emu_resolve_warp(w, go);
            released |= r > 0, broken |= r < 0;
        }
        for (t = 0; t < n; t++) exited += emu_threads[t].at == EMU_EXITED, at_barrier += emu_threads[t].at == EMU_AT_BARRIER;
        if (exited == n) return;
        if (!released && !broken && at_barrier == n)
            for (t = 0; t < n; t++) go[t] = 1, released = 1;
        if (!released || broken) {
            emu_fault(cudaErrorLaunchFailure, broken ? "a warp shuffle whose lanes do not match its mask"
                                                     : "a __syncthreads or shuffle that some thread it waits for never reaches");
            return; /* the waiting fibers are dropped; their stacks are reused */
        }
        for (t = 0; t < n; t++)
            if (go[t]) {
                emu_threads[t].at = EMU_RUNS;
                threadIdx.x = t;
                emu_to_fiber(emu_threads[t].fiber);
            }
    }
}

template <typename... P, size_t... I>
static void emu_call(void (*kernel)(P...), const std::tuple<typename std::decay<P>::type...> &args,
                     std::index_sequence<I...>) {
    kernel(std::get<I>(args)...);
}

template <typename Tuple, size_t... I>
static void emu_check_args(const Tuple &args, const char *kernel, std::index_sequence<I...>) {
    int unused[] = {0, (emu_check_arg(std::get<I>(args), kernel), 0)...};
    (void)unused;
}

template <typename... P, typename... A>
static void emu_launch(unsigned blocks, unsigned threads, cudaStream_t s, const char *name, void (*kernel)(P...),
                       A &&...a) {
    std::tuple<typename std::decay<P>::type...> args(std::forward<A>(a)...);
    if (emu_sticky != cudaSuccess) return;
    /* RT cudaGetLastError after a launch: a bad configuration is reported
       at once, not sticky (PG "Error Checking") */
    if (blocks == 0 || threads == 0 || threads > 1024) {
        emu_error = cudaErrorInvalidConfiguration;
        return;
    }
    emu_count.launches++;
    emu_enqueue(s, [=]() {
        emu_check_args(args, name, std::index_sequence_for<P...>());
        if (emu_fault_countdown >= 0 && emu_fault_countdown-- == 0) emu_fault(cudaErrorIllegalAddress, "injected");
        if (emu_sticky != cudaSuccess) return;
        gridDim = dim3(blocks);
        blockDim = dim3(threads);
        std::function<void()> body = [&args, kernel]() { emu_call(kernel, args, std::index_sequence_for<P...>()); };
        for (blockIdx.x = 0; blockIdx.x < gridDim.x && emu_sticky == cudaSuccess; blockIdx.x++) emu_run_block(body);
    });
}
#define MP__CU_RUN(blocks, threads, stream, kernel, ...) \
    emu_launch((unsigned)(blocks), (unsigned)(threads), (stream), #kernel, kernel, __VA_ARGS__)

static inline int atomicOr(int *p, int v) {
    int old = *p;
    *p = old | v;
    return old;
}
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    unsigned long long old = *p;
    *p = old + v;
    return old;
}
static inline unsigned atomicMax(unsigned *p, unsigned v) {
    unsigned old = *p;
    *p = v > old ? v : old;
    return old;
}
static inline unsigned atomicMin(unsigned *p, unsigned v) {
    unsigned old = *p;
    *p = v < old ? v : old;
    return old;
}
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* >>memory calls */
#define EMU_MEMORY ((size_t)64 << 30) /* a GPU's worth: larger requests fail */
static size_t emu_device_bytes;
cudaError_t cudaMalloc(void **p, size_t bytes) {
    cudaError_t e;
    EMU_STICKY();
    if (bytes > EMU_MEMORY - emu_device_bytes) return emu_fail(cudaErrorMemoryAllocation);
    if ((e = emu_register(emu_blocks, p, bytes)) == cudaSuccess) emu_device_bytes += bytes;
    return e;
}
/* cudaFree waits for the device: nothing queued may still use the block
   (RT "API synchronization behavior": it synchronizes implicitly). */
cudaError_t cudaFree(void *p) {
    int i;
    EMU_STICKY();
    if (!p) return cudaSuccess;
    for (i = 0; i < EMU_BLOCKS && emu_blocks[i].p != p; i++) {}
    if (i == EMU_BLOCKS) return emu_fail(cudaErrorInvalidValue);
    if (!emu_all_idle()) emu_count.waits++, emu_count.drains++;
    emu_run_all();
    emu_device_bytes -= emu_blocks[i].bytes;
    return emu_unregister(emu_blocks, p);
}
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    EMU_STICKY();
    *free_bytes = EMU_MEMORY - emu_device_bytes;
    *total_bytes = EMU_MEMORY;
    return cudaSuccess;
}
/* Pinned host memory (RT cudaHostAlloc): copies to and from it are truly
   asynchronous. cudaFreeHost waits for the device, as cudaFree. */
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags) {
    (void)flags;
    EMU_STICKY();
    return emu_register(emu_pinned, p, bytes);
}
cudaError_t cudaFreeHost(void *p) {
    EMU_STICKY();
    if (!emu_all_idle()) emu_count.waits++, emu_count.drains++;
    emu_run_all();
    return emu_unregister(emu_pinned, p);
}

/* RT "API synchronization behavior", asynchronous memcpy: a copy between
   the device and pinned memory is queued and touches the host buffer only
   when it runs (so the host must not change or read it before an event
   says so); from pageable memory the driver stages the bytes at the call
   (the caller may reuse its buffer) and the copy may be synchronous; to
   pageable memory the call returns only once the copy has completed (a
   host wait for everything queued before it on the stream). */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s) {
    int to_dev = emu_on_device(dst, bytes), from_dev = emu_on_device(src, bytes);
    EMU_STICKY();
    if (!emu_stream_ok(s)) return emu_fail(cudaErrorInvalidResourceHandle);
    if ((kind == cudaMemcpyHostToDevice && (!to_dev || from_dev)) ||
        (kind == cudaMemcpyDeviceToHost && (to_dev || !from_dev)) ||
        (kind == cudaMemcpyDeviceToDevice && (!to_dev || !from_dev)) ||
        (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToHost && kind != cudaMemcpyDeviceToDevice)) {
        fprintf(stderr, "cuda_emu: cudaMemcpyAsync kind %d between host/device pointers that do not fit it\n", (int)kind);
        return emu_fail(cudaErrorInvalidValue);
    }
    if (!bytes) return cudaSuccess;
    if (kind == cudaMemcpyHostToDevice) emu_count.bytes_in += bytes;
    if (kind == cudaMemcpyDeviceToDevice || emu_is_pinned(kind == cudaMemcpyHostToDevice ? src : dst, bytes)) {
        if (kind != cudaMemcpyDeviceToDevice) emu_count.pinned++;
        emu_enqueue(s, [=]() { memmove(dst, src, bytes); });
    } else if (kind == cudaMemcpyHostToDevice) {
        std::shared_ptr<std::vector<char>> staged = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + bytes);
        emu_count.pageable++;
        emu_enqueue(s, [=]() { memcpy(dst, staged->data(), bytes); });
    } else {
        emu_count.pageable++;
        emu_enqueue(s, [=]() { memmove(dst, src, bytes); });
        emu_wait(s, emu_stream_of(s)->queued);
    }
    return emu_sticky;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s) {
    EMU_STICKY();
    if (!emu_stream_ok(s) || !emu_on_device(p, bytes)) return emu_fail(cudaErrorInvalidValue);
    emu_enqueue(s, [=]() { memset(p, value, bytes); });
    return cudaSuccess;
}

/* RT cudaGetLastError: returns and resets the last error, but a sticky
   fault stays. */
cudaError_t cudaGetLastError(void) {
    cudaError_t e = emu_error;
    emu_error = cudaSuccess;
    return emu_sticky != cudaSuccess ? emu_sticky : e;
}
cudaError_t cudaPeekAtLastError(void) { return emu_sticky != cudaSuccess ? emu_sticky : emu_error; }
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorMemoryAllocation: return "out of memory";
    default: return "an emulated CUDA error";
    }
}
cudaError_t cudaGetDeviceCount(int *count) {
    *count = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
    EMU_STICKY();
    return device == 0 ? cudaSuccess : emu_fail(cudaErrorInvalidDevice);
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (device != 0) return emu_fail(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "mixprec's host emulation of CUDA");
    prop->totalGlobalMem = EMU_MEMORY;
    return cudaSuccess;
}

/* >>cuBLASLt: descriptors as plain structs behind the opaque handles */
typedef struct emu_desc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    int32_t trans[2];
    uint32_t epilogue;
    const void *bias;
} emu_desc;
typedef struct emu_layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
} emu_layout;
typedef struct emu_pref {
    uint64_t workspace;
    uint32_t align[4]; /* A, B, C, D */
    uint32_t reduction; /* the split-K schemes allowed */
} emu_pref;
static int emu_handle;

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = (cublasLtHandle_t)&emu_handle;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    return h == (cublasLtHandle_t)&emu_handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}
const char *cublasLtGetStatusString(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS ? "success" : "an emulated cuBLASLt error"; }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale) {
    emu_desc *e = (emu_desc *)calloc(1, sizeof *e);
    e->compute = compute;
    e->scale = scale;
    e->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    *d = (cublasLtMatmulDesc_t)e;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    free(d);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *buf,
                                              size_t size) {
    emu_desc *e = (emu_desc *)d;
    if ((a == CUBLASLT_MATMUL_DESC_TRANSA || a == CUBLASLT_MATMUL_DESC_TRANSB) && size == 4)
        memcpy(&e->trans[a == CUBLASLT_MATMUL_DESC_TRANSB], buf, 4);
    else if (a == CUBLASLT_MATMUL_DESC_EPILOGUE && size == 4)
        memcpy(&e->epilogue, buf, 4);
    else if (a == CUBLASLT_MATMUL_DESC_BIAS_POINTER && size == sizeof(void *))
        memcpy(&e->bias, buf, sizeof(void *));
    else
        return CUBLAS_STATUS_INVALID_VALUE; /* nothing else is used */
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    emu_layout *e = (emu_layout *)calloc(1, sizeof *e);
    e->type = type, e->rows = rows, e->cols = cols, e->ld = ld;
    *l = (cublasLtMatrixLayout_t)e;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    free(l);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    emu_pref *e = (emu_pref *)calloc(1, sizeof *e);
    e->align[0] = e->align[1] = e->align[2] = e->align[3] = 256; /* cuBLASLt's default */
    e->reduction = CUBLASLT_REDUCTION_SCHEME_MASK;                /* LT: every scheme by default */
    *p = (cublasLtMatmulPreference_t)e;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    free(p);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a, const void *buf,
                                                    size_t size) {
    emu_pref *e = (emu_pref *)p;
    if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES && size == 8) memcpy(&e->workspace, buf, 8);
    else if (a == CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK && size == 4) memcpy(&e->reduction, buf, 4);
    else if (a >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES && size == 4)
        memcpy(&e->align[a - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, 4);
    else
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

static size_t emu_type_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

/* LT cublasLtMatmul(), its table of supported data types (scaleType
   CUDA_R_32F, real types): CUBLAS_COMPUTE_32F and _32F_PEDANTIC take A = B
   in float16 with C = D float16 or float32, the same for bfloat16, and all
   float32; _32F_FAST_TF32 (and _FAST_16F/_FAST_16BF) only all float32.
   C's layout must be D's (in-place), shapes must fit. Anything else is
   CUBLAS_STATUS_NOT_SUPPORTED (a type) or _INVALID_VALUE (a shape). */
static int emu_types_ok(cublasComputeType_t compute, cudaDataType_t ab, cudaDataType_t d) {
    if (compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_PEDANTIC)
        return ab == CUDA_R_32F ? d == CUDA_R_32F : (ab == CUDA_R_16F || ab == CUDA_R_16BF) && (d == ab || d == CUDA_R_32F);
    if (compute == CUBLAS_COMPUTE_32F_FAST_TF32 || compute == CUBLAS_COMPUTE_32F_FAST_16F ||
        compute == CUBLAS_COMPUTE_32F_FAST_16BF)
        return ab == CUDA_R_32F && d == CUDA_R_32F;
    return 0;
}

static cublasStatus_t emu_check(const emu_desc *d, const emu_layout *a, const emu_layout *b, const emu_layout *c,
                                const emu_layout *dl) {
    uint64_t m = dl->rows, n = dl->cols, k = d->trans[0] == CUBLAS_OP_N ? a->cols : a->rows;
    if (memcmp(c, dl, sizeof *c) != 0) return CUBLAS_STATUS_INVALID_VALUE;
    if ((d->trans[0] == CUBLAS_OP_N ? a->rows : a->cols) != m || (d->trans[1] == CUBLAS_OP_N ? b->rows : b->cols) != k ||
        (d->trans[1] == CUBLAS_OP_N ? b->cols : b->rows) != n || k == 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    if ((uint64_t)a->ld < a->rows || (uint64_t)b->ld < b->rows || (uint64_t)dl->ld < dl->rows) return CUBLAS_STATUS_INVALID_VALUE;
    /* the epilogues this emulation computes; a BIAS epilogue needs its pointer (LT cublasLtEpilogue_t) */
    if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT && d->epilogue != CUBLASLT_EPILOGUE_BIAS &&
        d->epilogue != CUBLASLT_EPILOGUE_RELU && d->epilogue != CUBLASLT_EPILOGUE_RELU_BIAS)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if ((d->epilogue & CUBLASLT_EPILOGUE_BIAS) && !d->bias) return CUBLAS_STATUS_INVALID_VALUE;
    if (d->scale != CUDA_R_32F || a->type != b->type || !emu_types_ok(d->compute, a->type, dl->type))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (a->type == CUDA_R_16BF && getenv("MIXPREC_CUDA_EMU_NO_BF16")) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (d->compute == CUBLAS_COMPUTE_32F_PEDANTIC && getenv("MIXPREC_CUDA_EMU_NO_PEDANTIC")) return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}

/* The algorithm needs every alignment it was promised (the worst case). */
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int *count) {
    const emu_pref *p = (const emu_pref *)pref;
    cublasStatus_t s = emu_check((const emu_desc *)desc, (const emu_layout *)a, (const emu_layout *)b,
                                 (const emu_layout *)c, (const emu_layout *)d);
    *count = 0;
    emu_count.heuristics++;
    if (h != (cublasLtHandle_t)&emu_handle || requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    memset(&results[0], 0, sizeof results[0]);
    memcpy(results[0].algo.data, p->align, sizeof p->align);
    /* LT cublasLtReductionScheme_t: where the preference allows reducing
       split-K parts in the output type (INPLACE, OUTPUT_TYPE), the emulated
       algorithm does, for a 16-bit D: each part rounded into D's type, then
       their sum rounded again (two roundings, as a GPU may) */
    results[0].algo.data[4] = (p->reduction & (CUBLASLT_REDUCTION_SCHEME_INPLACE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE)) &&
                              ((const emu_layout *)d)->type != CUDA_R_32F;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    *count = 1;
    return CUBLAS_STATUS_SUCCESS;
}

static float emu_load(const void *p, cudaDataType t, size_t i) {
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    if (t == CUDA_R_16F) return __half2float(((const __half *)p)[i]);
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}
static void emu_store(void *p, cudaDataType t, size_t i, float v) {
    if (t == CUDA_R_32F) ((float *)p)[i] = v;
    else if (t == CUDA_R_16F) ((__half *)p)[i] = __float2half_rn(v);
    else ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
}
static float emu_tf32(float v) { /* 10 fraction bits, to nearest even */
    uint32_t u;
    memcpy(&u, &v, 4);
    if ((u & 0x7F800000u) != 0x7F800000u) u = (u + 0xFFFu + ((u >> 13) & 1u)) & ~0x1FFFu;
    memcpy(&v, &u, 4);
    return v;
}
/* Element (i, j) of op(X) for a column-major X. */
static float emu_op(const void *x, const emu_layout *l, int32_t trans, uint64_t i, uint64_t j) {
    return trans == CUBLAS_OP_N ? emu_load(x, l->type, i + j * (uint64_t)l->ld) : emu_load(x, l->type, j + i * (uint64_t)l->ld);
}
static int emu_fits(const void *p, const emu_layout *l) {
    return emu_on_device(p, ((l->cols - 1) * (uint64_t)l->ld + l->rows) * emu_type_size(l->type));
}

/* The product itself, when its stream runs. LT CUBLASLT_MATMUL_DESC_BIAS_POINTER
   states no alignment for the bias, but kernels may assume 16 bytes and
   fault with a misaligned address, which is sticky (cuBLAS documentation,
   cublasLtMatmulDescAttributes_t; CUDA Runtime API, cudaErrorMisalignedAddress):
   the emulation faults on any bias not 16-byte aligned. An operand outside
   device memory is an illegal address. */
/* A value rounded into t and back. */
static float emu_round(cudaDataType t, float v) {
    unsigned char buf[4];
    emu_store(buf, t, 0, v);
    return emu_load(buf, t, 0);
}

static void emu_matmul_run(emu_desc e, emu_layout A, emu_layout B, emu_layout D, float al_f, float be_f, const void *a,
                           const void *b, const void *c, void *d, void *ws, size_t ws_bytes, int split_in_output) {
    uint64_t i, j, l, k = e.trans[0] == CUBLAS_OP_N ? A.cols : A.rows;
    int tf32 = e.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    if ((e.epilogue & CUBLASLT_EPILOGUE_BIAS) && (uintptr_t)e.bias % 16 != 0) {
        emu_fault(cudaErrorMisalignedAddress, "cublasLtMatmul: a BIAS epilogue's bias is not 16-byte aligned");
        return;
    }
    if (!emu_fits(a, &A) || !emu_fits(b, &B) || !emu_fits(d, &D) || (be_f != 0.0f && !emu_fits(c, &D)) ||
        (ws_bytes && !emu_on_device(ws, ws_bytes)) ||
        ((e.epilogue & CUBLASLT_EPILOGUE_BIAS) && !emu_on_device(e.bias, D.rows * emu_type_size(D.type)))) {
        emu_fault(cudaErrorIllegalAddress, "cublasLtMatmul: an operand is not in device memory or overruns its block");
        return;
    }
    for (j = 0; j < D.cols; j++)
        for (i = 0; i < D.rows; i++) {
            float acc = 0.0f, part = 0.0f, v;
            for (l = 0; l < k; l++) {
                float x = emu_op(a, &A, e.trans[0], i, l), y = emu_op(b, &B, e.trans[1], l, j);
                if (split_in_output && l == k / 2) part = emu_round(D.type, al_f * acc), acc = 0.0f;
                acc += tf32 ? emu_tf32(x) * emu_tf32(y) : x * y;
            }
            v = split_in_output ? emu_round(D.type, part + emu_round(D.type, al_f * acc)) : al_f * acc;
            if (be_f != 0.0f) v += be_f * emu_load(c, D.type, i + j * (uint64_t)D.ld);
            if (e.epilogue & CUBLASLT_EPILOGUE_BIAS) v += emu_load(e.bias, D.type, i);
            if ((e.epilogue & CUBLASLT_EPILOGUE_RELU) && v < 0.0f) v = 0.0f;
            emu_store(d, D.type, i + j * (uint64_t)D.ld, v);
        }
}

/* Checked at the call (LT cublasLtMatmul's return values), run when the
   stream runs. alpha and beta are host pointers, read at the call; the
   descriptors are copied, so a later change to them does not reach a
   queued product. */
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void *alpha, const void *a,
                              cublasLtMatrixLayout_t al, const void *b, cublasLtMatrixLayout_t bl, const void *beta,
                              const void *c, cublasLtMatrixLayout_t cl, void *d, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t stream) {
    const emu_desc e = *(const emu_desc *)desc;
    const emu_layout A = *(const emu_layout *)al, B = *(const emu_layout *)bl, D = *(const emu_layout *)dl;
    uint32_t need[4];
    float al_f = *(const float *)alpha, be_f = *(const float *)beta;
    if (emu_sticky != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
    if (h != (cublasLtHandle_t)&emu_handle || !algo || !emu_stream_ok(stream)) return CUBLAS_STATUS_INVALID_VALUE;
    if (emu_check(&e, &A, &B, (const emu_layout *)cl, &D) != CUBLAS_STATUS_SUCCESS) return CUBLAS_STATUS_INVALID_VALUE;
    if (A.type != CUDA_R_32F && getenv("MIXPREC_CUDA_EMU_RUN_REFUSES")) return CUBLAS_STATUS_NOT_SUPPORTED;
    memcpy(need, algo->data, sizeof need);
    if ((uintptr_t)a % need[0] || (uintptr_t)b % need[1] || (uintptr_t)c % need[2] || (uintptr_t)d % need[3]) {
        fprintf(stderr, "cuda_emu: cublasLtMatmul: a pointer is less aligned than the heuristic was told\n");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    emu_count.launches++;
    int split = (int)algo->data[4];
    emu_enqueue(stream, [=]() { emu_matmul_run(e, A, B, D, al_f, be_f, a, b, c, d, ws, ws_bytes, split); });
    return CUBLAS_STATUS_SUCCESS;
}

#endif /* MIXPREC_CUDA_EMU_H */
