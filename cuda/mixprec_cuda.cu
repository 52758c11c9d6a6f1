/* mixprec_cuda.cu - the CUDA backend (see mixprec_cuda.h). Built by nvcc
   with --fmad=false, so that a*b+c rounds twice as in the CPU backend's C.

   Each op of mp_backend is one function below; the kernels it launches
   repeat, line for line, what the CPU backend's function of the same name
   (mp__cpu_*) does to one element, row or column, widening every dtype to
   float32 and rounding once on the way out with mixprec.h's own integer
   rounding (>>rules), so casts give the CPU's bits, NaN included.
   The activations, the losses of a row and the accuracy are mixprec.h's
   own (>>rules, compiled here for the device through MIXPREC_RULES).
   Sums go in a fixed order, never by float atomics, so results never
   depend on scheduling (bit-identical run to run): softmax's and the
   loss's sums over a row a warp a row (each lane's columns in order, then
   a xor butterfly; the loss's formulas are the CPU's own, >>rules); the
   loss sum and the column sums in parts of 256 rows in order (up to 256
   rows the CPU's sum, bit for bit), the parts then by a block's tree.

   Everything is queued on one non-blocking stream. A failing call records
   the first error (sync and last_error report it) and every op after it
   does nothing. Scratch (the float32 result of a product that needs an
   epilogue of ours, widened operands, the per-row losses, the batch on its
   way in) grows when first needed and is kept: after the first step no step
   allocates. */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The loss rows run a warp a row (>>loss kernels): mixprec.h's row
   functions take the lane's columns (lane, lane + 32, ...) and combine the
   lanes' sums and argmax by xor butterflies (MP__ROW_*, >>rules); nvcc's
   host pass, which never runs them, keeps the one-lane defaults. */
#if defined(__CUDA_ARCH__) || defined(MIXPREC_CUDA_EMU_H)
static __device__ __forceinline__ float mp__cu_warp_sum(float v);
static __device__ __forceinline__ void mp__cu_warp_best(float *value, size_t *at, size_t n);
#define MP__ROW_LANE (threadIdx.x % 32u)
#define MP__ROW_LANES 32u
#define MP__ROW_SUM(v) mp__cu_warp_sum(v)
#define MP__ROW_BEST(value, at, n) mp__cu_warp_best(&(value), &(at), (n))
#endif
#define MIXPREC_RULES /* mixprec.h's >>rules: activations, loss rows, accuracy */
#include "mixprec_cuda.h"

#define MP__CU_THREADS 256      /* threads per block */
#define MP__CU_MAX_BLOCKS 65536 /* grid-stride loops cover the rest */
#define MP__CU_BLOCKS 64        /* allocations one context tracks */
#define MP__CU_PINNED 8         /* pinned host blocks (staging) one context tracks */
#define MP__CU_PLANS 64         /* cached cuBLASLt plans */
#define MP__CU_PART_ROWS 256    /* rows per partial column sum */
#define MP__CU_WORKSPACE (32u << 20)

/* >>context */
typedef struct mp__cu_buf {
    void *p;
    size_t bytes;
} mp__cu_buf;

/* What selects a cuBLASLt algorithm: the shape, types, epilogue and the
   alignment of every pointer (the heuristic assumes 256 bytes otherwise). */
typedef struct mp__cu_key {
    int op_a, op_b; /* cuBLASLt's A is our B (see mp__cu_gemm) */
    uint64_t m, n, k;
    int ab_type, d_type, compute, epilogue;
    uint32_t align[4]; /* A, B, C = D, bias */
} mp__cu_key;

typedef struct mp__cu_plan {
    int used, refused; /* refused: the heuristic or cublasLtMatmul said no; remembered */
    unsigned long long last; /* when last asked for: the least recent is evicted */
    mp__cu_key key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
} mp__cu_plan;

typedef struct mp__cu_stats { /* mp__scan's counts, on the device */
    unsigned long long nan, inf, underflow, subnormal, overflow;
    unsigned int max_abs, min_abs; /* float32 bits of finite nonzero magnitudes */
} mp__cu_stats;

/* A pinned host block (host_alloc) and, for each stream, an event after
   the last copy that reads it: the host may write it once both are done. */
typedef struct mp__cu_pinned {
    void *p;
    size_t bytes;
    cudaEvent_t read[2]; /* on the compute stream, on the copy stream */
} mp__cu_pinned;

typedef struct mp__cu {
    int device, tf32;
    cudaStream_t stream;         /* every kernel, product and copy but the batch's */
    cudaStream_t copy;           /* cast_in's upload, ahead of the compute */
    cublasLtHandle_t lt;
    mp__cu_buf ws;               /* cuBLASLt workspace */
    mp__cu_buf d32, a32, b32;    /* a product's float32 result; widened operands */
    mp__cu_buf stage[2];         /* cast_in: two batches as float32, alternating */
    cudaEvent_t uploaded[2], consumed[2]; /* stage[j] written (copy stream), read (compute stream) */
    int turn;                    /* the stage the next batch goes to */
    mp__cu_pinned pinned[MP__CU_PINNED];
    mp__cu_buf rows;             /* per-row losses and counts, partial column sums */
    mp__cu_buf stats;            /* one mp__cu_stats */
    mp__cu_buf blocks[MP__CU_BLOCKS]; /* what alloc handed out */
    size_t current, peak;        /* bytes held: blocks and scratch; the most */
    mp__cu_plan plans[MP__CU_PLANS];
    unsigned long long plan_clock; /* plan lookups so far */
    cublasStatus_t refused;      /* the heuristic's last refusal, for the error message */
    size_t fallbacks;            /* products on a slower path than their dtypes ask (memory().fallbacks) */
    int warned;                  /* the first fallback was named on stderr */
    char error[256];             /* the first failure; "" while none */
} mp__cu;

static char mp__cu_reason[256]; /* mp_cuda_last_error() */
static mp_cuda_stats mp__cu_stats_now; /* mp_cuda_get_stats(): every context's, process-wide */
static int mp__cu_poisoned;     /* a device fault: the process's CUDA context is lost */

static void mp__cu_set_reason(const char *what, const char *why) {
    snprintf(mp__cu_reason, sizeof mp__cu_reason, "%s%s%s", what, why[0] ? ": " : "", why);
}

static int mp__cu_fail(mp__cu *c, const char *what, const char *why) {
    if (!c->error[0]) snprintf(c->error, sizeof c->error, "%s: %s", what, why);
    return 0;
}

/* Counts a host wait (the call's result passes through). */
static cudaError_t mp__cu_waited(cudaError_t e) {
    mp__cu_stats_now.host_waits++;
    return e;
}

/* A sticky error (CUDA Runtime API, cudaError: "the process must be
   terminated and relaunched"): a kernel's illegal or misaligned address, a
   trap, a launch failure. Allocation failures and bad arguments are not. */
static int mp__cu_fault(cudaError_t e) {
    return e == cudaErrorIllegalAddress || e == cudaErrorMisalignedAddress || e == cudaErrorLaunchFailure ||
           e == cudaErrorAssert || e == cudaErrorIllegalInstruction;
}

/* 1 on success; else records the first error and returns 0. The runtime's
   own last error is cleared, so that the next launch's check (of this or
   another context) does not see it again. */
static int mp__cu_ok(mp__cu *c, cudaError_t e, const char *what) {
    char why[200];
    if (e == cudaSuccess) return 1;
    (void)cudaGetLastError();
    if (!mp__cu_fault(e)) return mp__cu_fail(c, what, cudaGetErrorString(e));
    mp__cu_poisoned = 1;
    snprintf(why, sizeof why, "%s: a device fault, which poisons the CUDA context of the whole process (every model "
             "on this GPU fails from now on): restart the process", cudaGetErrorString(e));
    return mp__cu_fail(c, what, why);
}

static int mp__lt_ok(mp__cu *c, cublasStatus_t s, const char *what) {
    return s == CUBLAS_STATUS_SUCCESS ? 1 : mp__cu_fail(c, what, cublasLtGetStatusString(s));
}

/* Whether an op may run: no earlier failure, and the context's device current. */
static int mp__cu_live(mp__cu *c) {
    return !c->error[0] && mp__cu_ok(c, cudaSetDevice(c->device), "cudaSetDevice");
}

static void mp__cu_count(mp__cu *c, size_t add, size_t sub) {
    c->current = c->current + add - sub;
    if (c->current > c->peak) c->peak = c->current;
}

static void mp__cu_release(mp__cu *c, mp__cu_buf *b) {
    if (b->p) (void)mp__cu_ok(c, cudaFree(b->p), "cudaFree");
    c->current -= b->bytes;
    b->p = NULL;
    b->bytes = 0;
}

/* A scratch buffer of at least `bytes`, grown (never shrunk) when needed.
   Zeroed, as every allocation. One wait covers two needs: the old buffer
   may still be read by queued work, so it is freed only after the wait;
   and a stage is written next on the copy stream, which nothing orders
   after this stream's memset. */
static void *mp__cu_grow(mp__cu *c, mp__cu_buf *b, size_t bytes) {
    void *p = NULL;
    if (b->bytes >= bytes) return b->p;
    if (!mp__cu_ok(c, cudaMalloc(&p, bytes), "cudaMalloc (scratch)")) return NULL;
    if (!mp__cu_ok(c, cudaMemsetAsync(p, 0, bytes, c->stream), "cudaMemsetAsync (scratch)") ||
        !mp__cu_ok(c, mp__cu_waited(cudaStreamSynchronize(c->stream)), "waiting to grow a scratch buffer")) {
        (void)cudaFree(p);
        return NULL;
    }
    mp__cu_count(c, bytes, 0); /* both, for a moment */
    mp__cu_release(c, b);
    b->p = p;
    b->bytes = bytes;
    return p;
}

/* >>device helpers: one element of a dtype as float32, and back, rounding once */
static size_t mp__cu_size(mp_dtype t) { return t == MP_FLOAT32 ? 4u : 2u; }

/* mixprec.h's own rounding (>>rules), not __float2half_rn and friends:
   the same bits as the CPU, NaN sign and payload included (CUDA's give a
   canonical NaN). */
static __device__ __forceinline__ float mp__ld(const void *p, mp_dtype t, size_t i) {
    if (t == MP_FLOAT32) return ((const float *)p)[i];
    if (t == MP_FLOAT16) return __uint_as_float(mp__f32_bits_from_f16(((const uint16_t *)p)[i]));
    return __uint_as_float(mp__f32_bits_from_bf16(((const uint16_t *)p)[i]));
}

static __device__ __forceinline__ void mp__st(void *p, mp_dtype t, size_t i, float v) {
    if (t == MP_FLOAT32) ((float *)p)[i] = v;
    else if (t == MP_FLOAT16) ((uint16_t *)p)[i] = mp__f16_from_f32_bits(__float_as_uint(v));
    else ((uint16_t *)p)[i] = mp__bf16_from_f32_bits(__float_as_uint(v));
}

#define MP__CU_LOOP(i, n) \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

/* A warp per item (launched over n * MP__CU_WARP threads): every lane of a
   warp has the same r, so the warp's shuffles always match. */
#define MP__CU_WARP 32
#define MP__CU_WARPS (MP__CU_THREADS / MP__CU_WARP) /* a block's */
#define MP__CU_WARP_LOOP(r, lane, n)                                                                    \
    for (size_t r = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / MP__CU_WARP,                    \
                lane = threadIdx.x % MP__CU_WARP;                                                       \
         r < (n); r += (size_t)gridDim.x * blockDim.x / MP__CU_WARP)

/* A warp's sum and maximum, every lane getting the same bits: a xor
   butterfly over lane distances 16, 8, 4, 2, 1 (PG "Warp Shuffle
   Functions"); each level adds pairs, and a + b == b + a (IEEE 754), so
   both lanes of a pair hold the same value. The maximum skips NaN as the
   CPU's (t > mx ? t : mx from -INFINITY). */
static __device__ __forceinline__ float mp__cu_warp_sum(float v) {
    for (int m = MP__CU_WARP / 2; m > 0; m /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, m);
    return v;
}
/* The lanes' argmax candidates (value, index; n: none) combined in
   argmax's order (mp__better, >>rules): a total order, so every lane ends
   with the row's first maximum. */
static __device__ __forceinline__ void mp__cu_warp_best(float *value, size_t *at, size_t n) {
    for (int m = MP__CU_WARP / 2; m > 0; m /= 2) {
        float v = __shfl_xor_sync(0xFFFFFFFFu, *value, m);
        size_t i = __shfl_xor_sync(0xFFFFFFFFu, *at, m);
        if (i != n && mp__better(v, i, *value, *at, n)) *value = v, *at = i;
    }
}
static __device__ __forceinline__ float mp__cu_warp_max(float v) {
    for (int m = MP__CU_WARP / 2; m > 0; m /= 2) {
        float o = __shfl_xor_sync(0xFFFFFFFFu, v, m);
        v = o > v ? o : v;
    }
    return v;
}

static unsigned mp__cu_grid(size_t n) {
    size_t blocks = (n + MP__CU_THREADS - 1) / MP__CU_THREADS;
    return (unsigned)(blocks < MP__CU_MAX_BLOCKS ? blocks : MP__CU_MAX_BLOCKS);
}

/* Every launch goes through MP__CU_RUN, which tests/cuda_emu.h replaces by
   a loop over the blocks and threads on the host. */
#ifndef MP__CU_RUN
#define MP__CU_RUN(blocks, threads, stream, kernel, ...) kernel<<<blocks, threads, 0, stream>>>(__VA_ARGS__)
#endif

/* Launches blocks x threads of kernel, counted, and checks the launch. */
#define MP__CU_LAUNCH_GRID(c, blocks, threads, kernel, ...)                               \
    do {                                                                                  \
        MP__CU_RUN(blocks, threads, (c)->stream, kernel, __VA_ARGS__);                    \
        mp__cu_stats_now.launches++;                                                      \
        (void)mp__cu_ok((c), cudaGetLastError(), #kernel);                                \
    } while (0)

/* Launches kernel over n items (nothing when n is 0). */
#define MP__CU_LAUNCH(c, n, kernel, ...)                                                  \
    do {                                                                                  \
        if ((n) > 0) MP__CU_LAUNCH_GRID(c, mp__cu_grid(n), MP__CU_THREADS, kernel, __VA_ARGS__); \
    } while (0)

/* Launches a one-thread kernel (a state machine step). */
#define MP__CU_LAUNCH1(c, kernel, ...) MP__CU_LAUNCH_GRID(c, 1, 1, kernel, __VA_ARGS__)

/* >>elementwise kernels */
static __global__ void mp__k_cast(void *dst, mp_dtype dt, const void *src, mp_dtype st, size_t n) {
    MP__CU_LOOP(i, n) mp__st(dst, dt, i, mp__ld(src, st, i));
}

/* The batch's cast, and *nonfinite = 1 if any value is Inf or NaN. */
static __global__ void mp__k_cast_in(void *dst, mp_dtype dt, const float *src, size_t n, int *nonfinite) {
    unsigned bad = 0;
    MP__CU_LOOP(i, n) {
        bad |= (__float_as_uint(src[i]) & 0x7F800000u) == 0x7F800000u;
        mp__st(dst, dt, i, src[i]);
    }
    if (bad && nonfinite) atomicOr(nonfinite, 1);
}

/* Rows of 32-bit words gathered: dst row r = src row idx[r]. */
static __global__ void mp__k_gather(uint32_t *dst, const uint32_t *src, const uint32_t *idx, size_t rows, size_t words) {
    MP__CU_LOOP(e, rows * words) dst[e] = src[(size_t)idx[e / words] * words + e % words];
}

/* bias_act without softmax: y = act(x + bias[col]) */
static __global__ void mp__k_bias_act(void *y, const void *x, const void *bias, size_t n, size_t cols, mp_activation act,
                               mp_dtype dt) {
    MP__CU_LOOP(i, n) {
        float t = mp__ld(x, dt, i);
        if (bias) t += mp__ld(bias, dt, i % cols);
        mp__st(y, dt, i, mp__act(act, t));
    }
}

/* x[row, j] (+ bias[j]) in float32, as mp__load_biased */
static __device__ __forceinline__ float mp__cu_biased(const void *x, const void *bias, mp_dtype dt, size_t base, size_t j) {
    float t = mp__ld(x, dt, base + j);
    if (bias) t += mp__ld(bias, dt, j);
    return t;
}

/* Softmax, a warp per row: max, sum of exp, then write (mp__softmax_row).
   Lane l takes columns l, l + 32, ... (its sum in that order from 0.0f),
   then the warp's butterfly: the CPU sums left to right, so the float32
   sum may differ from it in the last bits for rows of more than one column. */
static __global__ void mp__k_softmax(void *y, const void *x, const void *bias, size_t rows, size_t cols, mp_dtype dt) {
    MP__CU_WARP_LOOP(r, lane, rows) {
        size_t base = r * cols, j;
        float mx = -INFINITY, sum = 0.0f;
        for (j = lane; j < cols; j += MP__CU_WARP) {
            float t = mp__cu_biased(x, bias, dt, base, j);
            mx = t > mx ? t : mx;
        }
        mx = mp__cu_warp_max(mx);
        for (j = lane; j < cols; j += MP__CU_WARP) sum += expf(mp__cu_biased(x, bias, dt, base, j) - mx);
        sum = mp__cu_warp_sum(sum);
        for (j = lane; j < cols; j += MP__CU_WARP)
            mp__st(y, dt, base + j, expf(mp__cu_biased(x, bias, dt, base, j) - mx) / sum);
    }
}

/* dx = dy * act'(y, x). ReLU selects (dy where y > 0, else 0), as the CPU's
   vectorised blocks do. */
static __global__ void mp__k_act_backward(void *dx, mp_dtype dxt, const void *dy, const void *y, const void *x, size_t n,
                                   mp_activation act, mp_dtype dt) {
    MP__CU_LOOP(i, n) {
        float g = mp__ld(dy, dt, i);
        if (act == MP_RELU) g = mp__ld(y, dt, i) > 0.0f ? g : 0.0f;
        else if (act != MP_LINEAR) g *= mp__act_grad(act, mp__ld(y, dt, i), mp__act_reads_input(act) ? mp__ld(x, dt, i) : 0.0f);
        mp__st(dx, dxt, i, g);
    }
}

/* Softmax backward, a warp per row: dx = y (dy - sum(dy y)), the sum as
   mp__k_softmax's. */
static __global__ void mp__k_softmax_backward(void *dx, mp_dtype dxt, const void *dy, const void *y, size_t rows, size_t cols,
                                       mp_dtype dt) {
    MP__CU_WARP_LOOP(r, lane, rows) {
        size_t base = r * cols, j;
        float dot = 0.0f;
        for (j = lane; j < cols; j += MP__CU_WARP) dot += mp__ld(dy, dt, base + j) * mp__ld(y, dt, base + j);
        dot = mp__cu_warp_sum(dot);
        for (j = lane; j < cols; j += MP__CU_WARP)
            mp__st(dx, dxt, base + j, mp__ld(y, dt, base + j) * (mp__ld(dy, dt, base + j) - dot));
    }
}

/* Column sums in a fixed order: each thread sums MP__CU_PART_ROWS rows of
   one column from 0.0f, then mp__k_colsum_final adds the parts. With at
   most MP__CU_PART_ROWS rows this is the CPU's sum, bit for bit. */
static __global__ void mp__k_colsum_parts(float *part, const void *dy, mp_dtype dt, size_t rows, size_t cols, size_t parts) {
    MP__CU_LOOP(i, parts * cols) {
        size_t j = i % cols, p = i / cols, r = p * MP__CU_PART_ROWS, end = r + MP__CU_PART_ROWS;
        float acc = 0.0f;
        if (end > rows) end = rows;
        for (; r < end; r++) acc += mp__ld(dy, dt, r * cols + j);
        part[i] = acc;
    }
}

/* The parts added, a block per 32 columns (launched over groups *
   MP__CU_THREADS threads): lane l of warp w adds parts w, w + 8, w + 16,
   ... of column 32 g + l in order from 0.0f; after the barrier, warp 0
   adds the 8 warps' sums in order (PG "Synchronization Functions": the
   barrier makes the shared writes visible). Up to 8 parts (2048 rows) this
   is the parts added in order. */
static __global__ void mp__k_colsum_final(void *db, mp_dtype dt, const float *part, size_t parts, size_t cols) {
    __shared__ float warp_sum[MP__CU_WARPS][MP__CU_WARP];
    size_t lane = threadIdx.x % MP__CU_WARP, w = threadIdx.x / MP__CU_WARP, groups = (cols + MP__CU_WARP - 1) / MP__CU_WARP;
    for (size_t g = blockIdx.x; g < groups; g += gridDim.x) { /* the same g for the whole block */
        size_t j = g * MP__CU_WARP + lane, p;
        float acc = 0.0f;
        for (p = w; j < cols && p < parts; p += MP__CU_WARPS) acc += part[p * cols + j];
        warp_sum[w][lane] = acc;
        __syncthreads();
        if (w == 0 && j < cols) {
            acc = 0.0f;
            for (p = 0; p < MP__CU_WARPS; p++) acc += warp_sum[p][lane];
            mp__st(db, dt, j, acc);
        }
        __syncthreads(); /* warp_sum is the next group's */
    }
}

/* >>normalization kernels: BatchNormalization and LayerNormalization in
   mixprec.h's order of sums (>>rules, mp__norm_*), so that they give the
   CPU backend's bits. Column sums: mp__k_norm_parts sums each part of
   MP__NORM_ROWS rows of a column in row order from 0, mp__k_norm_final
   adds a column's parts in order from 0 (a thread a column: the CPU's
   order, which a tree would change). A row's sums: a warp a row, each
   lane's columns in order, then the xor butterfly (mp__cu_warp_sum). */
static_assert(MP__NORM_LANES == MP__CU_WARP, "a row's sums take a warp's lanes");
static __device__ __forceinline__ size_t mp__cu_parts(size_t rows) { return (rows + MP__NORM_ROWS - 1) / MP__NORM_ROWS; }

/* what: MP__NORM_SUM_X (x), _DEV2 ((x - mean)^2) or _GRAD (dy xhat, then
   dy into part + parts * cols). stats: the columns' mean then var
   (BatchNormalization), or per_row: (mean, rstd) per row (LayerNormalization). */
static __global__ void mp__k_norm_parts(float *part, int what, const void *x, const void *dy, mp_dtype dt, size_t rows,
                                        size_t cols, const float *stats, int per_row, float epsilon) {
    size_t parts = mp__cu_parts(rows);
    MP__CU_LOOP(i, parts * cols) {
        size_t j = i % cols, r = i / cols * MP__NORM_ROWS, end = r + MP__NORM_ROWS;
        float s1 = 0.0f, s2 = 0.0f, mean = 0.0f, rstd = 0.0f;
        if (end > rows) end = rows;
        if (what != MP__NORM_SUM_X && !per_row) mean = stats[j];
        if (what == MP__NORM_SUM_GRAD && !per_row) rstd = mp__norm_rstd(stats[cols + j], epsilon);
        for (; r < end; r++) {
            float v = mp__ld(x, dt, r * cols + j);
            if (what == MP__NORM_SUM_X) {
                s1 += v;
            } else if (what == MP__NORM_SUM_DEV2) {
                s1 += (v - mean) * (v - mean);
            } else {
                float g = mp__ld(dy, dt, r * cols + j);
                if (per_row) mean = stats[2 * r], rstd = stats[2 * r + 1];
                s1 += g * mp__norm_xhat(v, mean, rstd);
                s2 += g;
            }
        }
        part[i] = s1;
        if (what == MP__NORM_SUM_GRAD) part[parts * cols + i] = s2;
    }
}

/* A column's parts added in order: SUM_X gives stats' mean, DEV2 its
   variance and the moving update of both; GRAD sums[cols] and
   sums[cols + j] (dgamma, dbeta). */
static __global__ void mp__k_norm_final(const float *part, int what, size_t rows, size_t cols, float *stats, float *moving,
                                        float momentum, float *sums) {
    size_t parts = mp__cu_parts(rows);
    MP__CU_LOOP(j, cols) {
        float s1 = 0.0f, s2 = 0.0f;
        for (size_t p = 0; p < parts; p++) {
            s1 += part[p * cols + j];
            if (what == MP__NORM_SUM_GRAD) s2 += part[(parts + p) * cols + j];
        }
        if (what == MP__NORM_SUM_X) {
            stats[j] = mp__norm_mean(s1, rows);
        } else if (what == MP__NORM_SUM_DEV2) {
            float var = mp__norm_mean(s1, rows);
            stats[cols + j] = var;
            moving[j] = mp__norm_moving(moving[j], stats[j], momentum);
            moving[cols + j] = mp__norm_moving(moving[cols + j], var, momentum);
        } else {
            sums[j] = s1;
            sums[cols + j] = s2;
        }
    }
}

/* BatchNormalization's y from the columns' mean then var in mv. */
static __global__ void mp__k_bn_y(void *y, mp_dtype yt, const void *x, mp_dtype dt, size_t n, size_t cols,
                                  const float *gamma_beta, const float *mv, float epsilon) {
    MP__CU_LOOP(i, n) {
        size_t j = i % cols;
        float rstd = mp__norm_rstd(mv[cols + j], epsilon);
        mp__st(y, yt, i, mp__norm_y(mp__norm_xhat(mp__ld(x, dt, i), mv[j], rstd), gamma_beta[j], gamma_beta[cols + j]));
    }
}

/* BatchNormalization's dx from the column sums (dgamma then dbeta). */
static __global__ void mp__k_bn_dx(void *dx, mp_dtype dxt, const void *dy, const void *x, mp_dtype dt, size_t rows,
                                   size_t cols, const float *gamma_beta, const float *stats, float epsilon,
                                   const float *sums) {
    MP__CU_LOOP(i, rows * cols) {
        size_t j = i % cols;
        float rstd = mp__norm_rstd(stats[cols + j], epsilon), k = gamma_beta[j] * rstd;
        float xhat = mp__norm_xhat(mp__ld(x, dt, i), stats[j], rstd);
        mp__st(dx, dxt, i, mp__norm_dx(k, mp__ld(dy, dt, i), xhat, mp__norm_mean(sums[cols + j], rows),
                                       mp__norm_mean(sums[j], rows)));
    }
}

/* LayerNormalization, a warp a row: mean, variance, rstd, then y. */
static __global__ void mp__k_ln(void *y, mp_dtype yt, const void *x, mp_dtype dt, size_t rows, size_t cols,
                                const float *gamma_beta, float epsilon, float *stats) {
    MP__CU_WARP_LOOP(r, lane, rows) {
        size_t base = r * cols, j;
        float s = 0.0f, mean, rstd;
        for (j = lane; j < cols; j += MP__CU_WARP) s += mp__ld(x, dt, base + j);
        mean = mp__norm_mean(mp__cu_warp_sum(s), cols);
        s = 0.0f;
        for (j = lane; j < cols; j += MP__CU_WARP) {
            float v = mp__ld(x, dt, base + j);
            s += (v - mean) * (v - mean);
        }
        rstd = mp__norm_rstd(mp__norm_mean(mp__cu_warp_sum(s), cols), epsilon);
        if (lane == 0) stats[2 * r] = mean, stats[2 * r + 1] = rstd;
        for (j = lane; j < cols; j += MP__CU_WARP)
            mp__st(y, yt, base + j,
                   mp__norm_y(mp__norm_xhat(mp__ld(x, dt, base + j), mean, rstd), gamma_beta[j], gamma_beta[cols + j]));
    }
}

/* LayerNormalization's dx, a warp a row: the means of g = dy gamma and of
   g xhat, then dx. */
static __global__ void mp__k_ln_dx(void *dx, mp_dtype dxt, const void *dy, const void *x, mp_dtype dt, size_t rows,
                                   size_t cols, const float *gamma_beta, const float *stats) {
    MP__CU_WARP_LOOP(r, lane, rows) {
        size_t base = r * cols, j;
        float mean = stats[2 * r], rstd = stats[2 * r + 1], sg = 0.0f, sgx = 0.0f, mg, mgx;
        for (j = lane; j < cols; j += MP__CU_WARP) {
            float g = mp__ld(dy, dt, base + j) * gamma_beta[j];
            sg += g;
            sgx += g * mp__norm_xhat(mp__ld(x, dt, base + j), mean, rstd);
        }
        mg = mp__norm_mean(mp__cu_warp_sum(sg), cols);
        mgx = mp__norm_mean(mp__cu_warp_sum(sgx), cols);
        for (j = lane; j < cols; j += MP__CU_WARP) {
            float g = mp__ld(dy, dt, base + j) * gamma_beta[j];
            mp__st(dx, dxt, base + j, mp__norm_dx(rstd, g, mp__norm_xhat(mp__ld(x, dt, base + j), mean, rstd), mg, mgx));
        }
    }
}

/* A product's float32 result d (NULL: k was 0) into C: + C, + bias (in
   biast), the pre-activation, the activation, one rounding (mp__epilogue). */
static __global__ void mp__k_epilogue(void *c, mp_dtype ct, const float *d, int accumulate, const void *bias,
                               mp_dtype biast, void *z, mp_activation act, size_t n_total, size_t n) {
    MP__CU_LOOP(i, n_total) {
        float acc = d ? d[i] : 0.0f;
        if (accumulate) acc += mp__ld(c, ct, i);
        if (bias) acc += mp__ld(bias, biast, i % n);
        if (z) mp__st(z, ct, i, acc);
        mp__st(c, ct, i, mp__act(act, acc));
    }
}

static __global__ void mp__k_scale_cast(void *dst, mp_dtype dt, const float *src, size_t n, const float *scale) {
    float s = scale ? *scale : 1.0f;
    MP__CU_LOOP(i, n) mp__st(dst, dt, i, src[i] * s);
}

/* The fused unscale: dst = src * (1 / scale), and *found_inf = 1 if any
   src is Inf or NaN (exponent bits all ones), tested on the scaled values. */
static __global__ void mp__k_unscale(float *dst, const void *src, mp_dtype st, size_t n, const float *scale, int *found_inf) {
    float inv = mp__unscale_factor(scale);
    unsigned bad = 0;
    MP__CU_LOOP(i, n) {
        float v = mp__ld(src, st, i);
        bad |= (__float_as_uint(v) & 0x7F800000u) == 0x7F800000u;
        if (dst) dst[i] = v * inv;
    }
    if (bad) atomicOr(found_inf, 1);
}

static __global__ void mp__k_loss_scale(mp_loss_scale *ls, const int *found_inf) { (void)mp_loss_scale_step(ls, !*found_inf); }

/* mp__opt_block's formulas for one weight, in its order of operations,
   on the gradient as mp__k_unscale gives it: clipped (by norm, a factor
   from the sum of squares; by value, the same clamp), the weight decayed,
   then the update. */
static __global__ void mp__k_optimizer(mp_optimizer_desc o, float alpha, float decay, const float *sum_squares,
                                       float *w, const void *g, mp_dtype gt, const float *scale, float *s1, float *s2,
                                       size_t n, void *wc, mp_dtype wt, const int *found_inf) {
    float inv = mp__unscale_factor(scale), clip;
    if (found_inf && *found_inf) return; /* the skipped step */
    clip = sum_squares ? mp__clip_factor(&o, *sum_squares) : 1.0f;
    MP__CU_LOOP(i, n) {
        float gv = mp__ld(g, gt, i) * inv, lr_g, wv = w[i];
        if (sum_squares) gv = gv * clip;
        if (o.clipvalue > 0.0f) { /* minps/maxps's operand order: a NaN gradient stays NaN */
            gv = -o.clipvalue > gv ? -o.clipvalue : gv;
            gv = o.clipvalue < gv ? o.clipvalue : gv;
        }
        if (decay != 0.0f) wv = wv - wv * decay * o.learning_rate;
        lr_g = o.learning_rate * gv;
        if (o.kind == MP_SGD && o.momentum == 0.0f) {
            wv = wv - lr_g;
        } else if (o.kind == MP_SGD) {
            float m = o.momentum * s1[i] - lr_g;
            s1[i] = m;
            wv = wv + (o.nesterov ? o.momentum * m - lr_g : m);
        } else if (o.kind == MP_RMSPROP) {
            float v = o.rho * s1[i] + (1.0f - o.rho) * (gv * gv);
            s1[i] = v;
            wv = wv - lr_g / sqrtf(v + o.epsilon);
        } else {
            float m = s1[i], v = s2[i];
            m = m + (gv - m) * (1.0f - o.beta_1);
            v = v + (gv * gv - v) * (1.0f - o.beta_2);
            s1[i] = m;
            s2[i] = v;
            wv = wv - alpha * m / (sqrtf(v) + o.epsilon);
        }
        w[i] = wv;
        if (wc) mp__st(wc, wt, i, wv);
    }
}

/* mp_backend.sum_squares in >>rules' order: a thread per lane of a block
   of MP__SUM_SQUARES_BLOCK values sums its lane in order into lanes[8 b +
   l]; then one thread adds the blocks' sums in order (the order is the
   CPU's, so are the bits). */
static __global__ void mp__k_square_lanes(float *lanes, const void *g, mp_dtype gt, size_t n, const float *scale) {
    float inv = mp__unscale_factor(scale);
    size_t blocks = (n + MP__SUM_SQUARES_BLOCK - 1) / MP__SUM_SQUARES_BLOCK;
    MP__CU_LOOP(t, blocks * 8) {
        size_t at = t / 8 * MP__SUM_SQUARES_BLOCK, stop = at + MP__SUM_SQUARES_BLOCK < n ? at + MP__SUM_SQUARES_BLOCK : n;
        float sum = 0.0f;
        for (size_t i = at + t % 8; i < stop; i += 8) {
            float u = mp__ld(g, gt, i) * inv;
            sum += u * u;
        }
        lanes[t] = sum;
    }
}
static __global__ void mp__k_square_total(float *sum, const float *lanes, size_t blocks) {
    float total = 0.0f;
    for (size_t b = 0; b < blocks; b++) total += mp__sum_squares_lanes(lanes + 8 * b);
    *sum += total;
}

static __global__ void mp__k_dropout_mask(unsigned char *mask, size_t n, float rate, uint64_t seed) {
    MP__CU_LOOP(i, n) mask[i] = (unsigned char)(mp_dropout_draw(seed, i) >= rate);
}

static __global__ void mp__k_dropout(void *y, mp_dtype yt, const void *x, mp_dtype xt, const unsigned char *mask, size_t n,
                              float scale) {
    MP__CU_LOOP(i, n) mp__st(y, yt, i, mask[i] ? mp__ld(x, xt, i) * scale : 0.0f);
}

/* y = a op b in float32, rounded once (mp_backend.elementwise); each thread
   reads its element before writing it, so y may be a or b. */
static __global__ void mp__k_elementwise(mp_elementwise op, void *y, mp_dtype yt, const void *a, mp_dtype at, const void *b,
                                         mp_dtype bt, float s, size_t n) {
    MP__CU_LOOP(i, n) {
        float v = mp__ld(a, at, i), w = op == MP_EW_SCALE ? s : mp__ld(b, bt, i);
        mp__st(y, yt, i, op == MP_EW_ADD ? v + w : op == MP_EW_SUBTRACT ? v - w : v * w);
    }
}

/* Concatenate's blocks: one thread per element, a raw copy where the
   dtypes agree (NaN payloads untouched, as the CPU's memcpy), else a cast. */
template <typename T>
static __global__ void mp__k_copy_cols(T *dst, size_t dst_stride, const T *src, size_t src_stride, size_t rows, size_t cols) {
    MP__CU_LOOP(e, rows * cols) dst[e / cols * dst_stride + e % cols] = src[e / cols * src_stride + e % cols];
}

static __global__ void mp__k_cast_cols(void *dst, mp_dtype dt, size_t dst_stride, const void *src, mp_dtype st,
                                       size_t src_stride, size_t rows, size_t cols) {
    MP__CU_LOOP(e, rows * cols) mp__st(dst, dt, e / cols * dst_stride + e % cols, mp__ld(src, st, e / cols * src_stride + e % cols));
}

/* >>cast stats: mp__scan on the device. Integer atomics only; the order in
   which threads add integers does not change the sum. */
typedef struct mp__cu_ranges { uint32_t sub_lo, normal_lo, inf_lo; } mp__cu_ranges;
/* mixprec.h's mp__ranges_of: where narrowing underflows, goes subnormal, overflows */
static const mp__cu_ranges mp__cu_ranges_of[MP_DTYPE_COUNT] = {
    {0x00000001u, 0x00800000u, 0x7F800000u},
    {0x33000001u, 0x387FE000u, 0x477FF000u},
    {0x00008001u, 0x007F8000u, 0x7F7F8000u}};

static __device__ __forceinline__ unsigned mp__in(uint32_t a, uint32_t lo, uint32_t hi) { return a - lo < hi - lo; }

static __global__ void mp__k_stats_init(mp__cu_stats *s) {
    s->nan = s->inf = s->underflow = s->subnormal = s->overflow = 0;
    s->max_abs = 0;
    s->min_abs = 0xFFFFFFFFu;
}

static __global__ void mp__k_stats(mp__cu_stats *s, const void *src, mp_dtype st, size_t n, mp__cu_ranges r) {
    unsigned long long nan = 0, inf = 0, under = 0, sub = 0, over = 0;
    uint32_t hi = 0, lo = 0xFFFFFFFFu;
    MP__CU_LOOP(i, n) {
        uint32_t a = __float_as_uint(mp__ld(src, st, i)) & 0x7FFFFFFFu;
        nan += a > 0x7F800000u;
        inf += a == 0x7F800000u;
        under += mp__in(a, 1u, r.sub_lo);
        sub += mp__in(a, r.sub_lo, r.normal_lo);
        over += mp__in(a, r.inf_lo, 0x7F800000u);
        if (mp__in(a, 1u, 0x7F800000u)) {
            hi = a > hi ? a : hi;
            lo = a < lo ? a : lo;
        }
    }
    if (nan) atomicAdd(&s->nan, nan);
    if (inf) atomicAdd(&s->inf, inf);
    if (under) atomicAdd(&s->underflow, under);
    if (sub) atomicAdd(&s->subnormal, sub);
    if (over) atomicAdd(&s->overflow, over);
    if (hi) {
        atomicMax(&s->max_abs, hi);
        atomicMin(&s->min_abs, lo);
    }
}

/* >>loss kernels: mixprec.h's loss rows (Keras 3's formulas), a warp a row */
/* Row r's loss into row_loss[r] and its accuracy into right[r]; its
   gradient of the batch mean into dpred's row (which is its workspace).
   Each lane reads and writes only its own columns of the row; the row's
   sums are the lanes' in order, then the butterfly, so the float32 loss
   and gradient may differ from the CPU's left-to-right sums in the last
   bits (the argmax, and so the accuracy, never). */
static __global__ void mp__k_loss_rows(mp_loss kind, int from_logits, const void *pred, mp_dtype pt, const void *out,
                                mp_dtype ot, const int32_t *labels, const float *y, size_t rows, size_t cols,
                                float *dpred, float inv_rows, float *row_loss, unsigned *right) {
    MP__CU_WARP_LOOP(r, lane, rows) { /* the row's output, then its predictions, in dpred's row */
        float *p = dpred + r * cols, l;
        const float *t = y ? y + r * cols : NULL;
        int32_t label = labels ? labels[r] : 0;
        unsigned correct;
        size_t j;
        for (j = lane; j < cols; j += MP__CU_WARP) p[j] = mp__ld(out, ot, r * cols + j);
        correct = (unsigned)mp__row_correct(kind, p, t, label, cols);
        if (pred != out)
            for (j = lane; j < cols; j += MP__CU_WARP) p[j] = mp__ld(pred, pt, r * cols + j);
        if (kind == MP_BINARY_CROSSENTROPY) l = mp__binary_crossentropy_row(p, t, cols, from_logits);
        else if (kind == MP_MEAN_SQUARED_ERROR) l = mp__mean_squared_error_row(p, t, cols);
        else l = mp__crossentropy_row(p, t, label, cols, from_logits);
        for (j = lane; j < cols; j += MP__CU_WARP) p[j] *= inv_rows;
        if (lane == 0) row_loss[r] = l, right[r] = correct;
    }
}

/* The batch's loss sum and correct count, one block of MP__CU_THREADS
   in a fixed two-level order (deterministic run to run): thread t adds
   the rows of parts t, t + 256, ... (MP__CU_PART_ROWS rows each) in order
   from 0.0f; then a tree over the threads' sums in shared memory, s[t] +=
   s[t + h] for h = 128, 64, ..., 1, a barrier between levels. Up to
   MP__CU_PART_ROWS rows this is the CPU's sum (thread 0's, plus zeros). */
static __global__ void mp__k_loss_sum(float *metrics, const float *row_loss, const unsigned *right, size_t rows) {
    __shared__ float loss[MP__CU_THREADS];
    __shared__ unsigned correct[MP__CU_THREADS];
    size_t t = threadIdx.x, p, r, h;
    float sum = 0.0f;
    unsigned count = 0;
    for (p = t; p * MP__CU_PART_ROWS < rows; p += MP__CU_THREADS)
        for (r = p * MP__CU_PART_ROWS; r < rows && r < (p + 1) * MP__CU_PART_ROWS; r++) {
            sum += row_loss[r];
            count += right[r];
        }
    loss[t] = sum;
    correct[t] = count;
    __syncthreads();
    for (h = MP__CU_THREADS / 2; h > 0; h /= 2) {
        if (t < h) {
            loss[t] += loss[t + h];
            correct[t] += correct[t + h];
        }
        __syncthreads();
    }
    if (t == 0) {
        metrics[0] = loss[0];
        metrics[1] = (float)correct[0];
    }
}

/* >>conv kernels (NHWC; mp_conv_geom by value) */
static __device__ __forceinline__ size_t mp__cu_nhwc(size_t img, size_t y, size_t x, int h, int w, int c) {
    return ((img * (size_t)h + y) * (size_t)w + x) * (size_t)c;
}

/* col [n*OH*OW, KH*KW*C] of n images: one thread per element, a raw copy or zero. */
template <typename T>
static __global__ void mp__k_im2col(T *col, const T *img, size_t images, mp_conv_geom g) {
    size_t per = (size_t)g.oh * g.ow * g.kh * g.kw * g.c;
    MP__CU_LOOP(e, images * per) {
        size_t q = e % per / (size_t)g.c, ch = e % (size_t)g.c, at = e / per * (size_t)g.h * g.w * g.c;
        int kx = (int)(q % (size_t)g.kw), ky, ox, oy, iy, ix;
        q /= (size_t)g.kw;
        ky = (int)(q % (size_t)g.kh);
        q /= (size_t)g.kh;
        ox = (int)(q % (size_t)g.ow);
        oy = (int)(q / (size_t)g.ow);
        iy = oy * g.sh - g.pt + ky;
        ix = ox * g.sw - g.pl + kx;
        col[e] = iy < 0 || iy >= g.h || ix < 0 || ix >= g.w ? (T)0 : img[at + ((size_t)iy * g.w + (size_t)ix) * g.c + ch];
    }
}

/* img = the sum of the columns that read each pixel, one thread per pixel
   and channel, adding in the CPU's order: windows by (oy, ox) ascending,
   which is (ky, kx) descending. Overwrites img. */
static __global__ void mp__k_col2im(float *img, const float *col_all, size_t images, mp_conv_geom g) {
    size_t per = (size_t)g.h * g.w * g.c;
    MP__CU_LOOP(e, images * per) {
        const float *col = col_all + e / per * ((size_t)g.oh * g.ow * g.kh * g.kw * g.c);
        size_t ch = e % (size_t)g.c, q = e % per / (size_t)g.c;
        int ix = (int)(q % (size_t)g.w), iy = (int)(q / (size_t)g.w), ky, kx;
        float sum = 0.0f;
        for (ky = g.kh - 1; ky >= 0; ky--) {
            int ty = iy + g.pt - ky, oy = ty / g.sh;
            if (ty < 0 || ty % g.sh || oy >= g.oh) continue;
            for (kx = g.kw - 1; kx >= 0; kx--) {
                int tx = ix + g.pl - kx, ox = tx / g.sw;
                if (tx < 0 || tx % g.sw || ox >= g.ow) continue;
                sum += col[((((size_t)oy * g.ow + ox) * g.kh + ky) * g.kw + kx) * g.c + ch];
            }
        }
        img[e] = sum;
    }
}

/* The window (oy, ox) of image img at channel ch: its first maximum (NaN
   wins), as mp__pool_window. */
static __device__ void mp__cu_window(const void *x, mp_dtype dt, size_t img, const mp_conv_geom &g, int oy, int ox, size_t ch,
                              float *best, int *arg) {
    int ky, kx, pos = 0;
    for (ky = 0; ky < g.kh; ky++)
        for (kx = 0; kx < g.kw; kx++, pos++) {
            size_t iy = (size_t)(oy * g.sh + ky), ix = (size_t)(ox * g.sw + kx);
            float t = mp__ld(x, dt, mp__cu_nhwc(img, iy, ix, g.h, g.w, g.c) + ch);
            if (pos == 0 || t > *best || (t != t && *best == *best)) {
                *best = t;
                *arg = pos;
            }
        }
}

static __global__ void mp__k_max_pool(void *y, const void *x, size_t n, mp_conv_geom g, mp_dtype dt) {
    MP__CU_LOOP(e, n * g.oh * g.ow * g.c) {
        size_t ch = e % (size_t)g.c, q = e / (size_t)g.c;
        int ox = (int)(q % (size_t)g.ow), oy, arg = 0;
        float best = 0.0f;
        q /= (size_t)g.ow;
        oy = (int)(q % (size_t)g.oh);
        mp__cu_window(x, dt, q / (size_t)g.oh, g, oy, ox, ch, &best, &arg);
        mp__st(y, dt, e, best);
    }
}

/* Input cell e of n NHWC images (padding valid): its image, channel,
   position, and the windows that hold it, rows [oy_lo, oy_hi] by columns
   [ox_lo, ox_hi] (empty at a border no window reaches). */
typedef struct mp__cu_cell {
    size_t img, ch;
    int iy, ix, oy_lo, oy_hi, ox_lo, ox_hi;
} mp__cu_cell;

static __device__ mp__cu_cell mp__cu_cell_of(size_t e, const mp_conv_geom &g) {
    mp__cu_cell p;
    size_t q = e / (size_t)g.c;
    p.ch = e % (size_t)g.c;
    p.ix = (int)(q % (size_t)g.w);
    q /= (size_t)g.w;
    p.iy = (int)(q % (size_t)g.h);
    p.img = q / (size_t)g.h;
    p.oy_lo = p.iy < g.kh ? 0 : (p.iy - g.kh) / g.sh + 1;
    p.ox_lo = p.ix < g.kw ? 0 : (p.ix - g.kw) / g.sw + 1;
    p.oy_hi = p.iy / g.sh < g.oh - 1 ? p.iy / g.sh : g.oh - 1;
    p.ox_hi = p.ix / g.sw < g.ow - 1 ? p.ix / g.sw : g.ow - 1;
    return p;
}

/* One thread per input cell: the gradient of the window whose maximum it
   is, 0 if none. Where windows overlap, the last in (oy, ox) order decides,
   as the CPU's writes do. */
static __global__ void mp__k_max_pool_backward(void *dx, mp_dtype dxt, const void *dy, const void *x, size_t n, mp_conv_geom g,
                                        mp_dtype dt) {
    MP__CU_LOOP(e, n * g.h * g.w * g.c) {
        mp__cu_cell p = mp__cu_cell_of(e, g);
        float out = 0.0f;
        int oy, ox;
        for (oy = p.oy_lo; oy <= p.oy_hi; oy++)
            for (ox = p.ox_lo; ox <= p.ox_hi; ox++) {
                float best = 0.0f;
                int arg = 0;
                mp__cu_window(x, dt, p.img, g, oy, ox, p.ch, &best, &arg);
                out = arg == (p.iy - oy * g.sh) * g.kw + (p.ix - ox * g.sw)
                          ? mp__ld(dy, dt, mp__cu_nhwc(p.img, (size_t)oy, (size_t)ox, g.oh, g.ow, g.c) + p.ch)
                          : 0.0f;
            }
        mp__st(dx, dxt, e, out);
    }
}

/* Average pooling (valid padding), one thread per element, in the CPU's
   order: the window's float32 sum in (ky, kx) order from 0, divided once
   by its size; the gradient at a cell the sum of dy / size over the windows
   holding it, (oy, ox) ascending, from 0. */
static __global__ void mp__k_avg_pool(void *y, const void *x, size_t n, mp_conv_geom g, mp_dtype dt) {
    float size = (float)(g.kh * g.kw);
    MP__CU_LOOP(e, n * g.oh * g.ow * g.c) {
        size_t ch = e % (size_t)g.c, q = e / (size_t)g.c, img;
        int ox = (int)(q % (size_t)g.ow), oy, ky, kx;
        float sum = 0.0f;
        q /= (size_t)g.ow;
        oy = (int)(q % (size_t)g.oh);
        img = q / (size_t)g.oh;
        for (ky = 0; ky < g.kh; ky++)
            for (kx = 0; kx < g.kw; kx++)
                sum += mp__ld(x, dt, mp__cu_nhwc(img, (size_t)(oy * g.sh + ky), (size_t)(ox * g.sw + kx), g.h, g.w, g.c) + ch);
        mp__st(y, dt, e, sum / size);
    }
}

static __global__ void mp__k_avg_pool_backward(void *dx, mp_dtype dxt, const void *dy, size_t n, mp_conv_geom g, mp_dtype dt) {
    float size = (float)(g.kh * g.kw);
    MP__CU_LOOP(e, n * g.h * g.w * g.c) {
        mp__cu_cell p = mp__cu_cell_of(e, g);
        float sum = 0.0f;
        int oy, ox;
        for (oy = p.oy_lo; oy <= p.oy_hi; oy++)
            for (ox = p.ox_lo; ox <= p.ox_hi; ox++)
                sum += mp__ld(dy, dt, mp__cu_nhwc(p.img, (size_t)oy, (size_t)ox, g.oh, g.ow, g.c) + p.ch) / size;
        mp__st(dx, dxt, e, sum);
    }
}

/* >>backend ops */
static mp__cu *mp__cu_of(void *ctx) { return (mp__cu *)ctx; }

static int mp__cu_events(mp__cu *c, cudaEvent_t *e, int n) {
    int i;
    for (i = 0; i < n; i++)
        if (!mp__cu_ok(c, cudaEventCreateWithFlags(&e[i], cudaEventDisableTiming), "cudaEventCreateWithFlags")) return 0;
    return 1;
}

static void mp__cu_drop_events(cudaEvent_t *e, int n) {
    int i;
    for (i = 0; i < n; i++)
        if (e[i]) (void)cudaEventDestroy(e[i]);
}

static mp_status mp__cu_create(void **ctx, int threads, const void *config) {
    const mp_cuda_config *cfg = (const mp_cuda_config *)config;
    int count = mp_cuda_device_count(), device = cfg ? cfg->device : 0;
    mp__cu *c;
    (void)threads; /* the host thread only queues work */
    *ctx = NULL;
    if (count == 0) return MP_ERR_BACKEND; /* the reason is set */
    if (mp__cu_poisoned) {
        mp__cu_set_reason("an earlier device fault poisoned this process's CUDA context", "restart the process");
        return MP_ERR_BACKEND;
    }
    if (device < 0 || device >= count) {
        snprintf(mp__cu_reason, sizeof mp__cu_reason, "device %d requested, the driver sees %d", device, count);
        return MP_ERR_ARG;
    }
    if (!(c = (mp__cu *)calloc(1, sizeof *c))) {
        mp__cu_set_reason("the context", "out of host memory");
        return MP_ERR_ALLOC;
    }
    c->device = device;
    c->tf32 = cfg && cfg->tf32;
    c->ws.bytes = cfg && cfg->workspace_bytes ? cfg->workspace_bytes : MP__CU_WORKSPACE;
    if (mp__cu_ok(c, cudaSetDevice(device), "cudaSetDevice") &&
        mp__cu_ok(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags") &&
        mp__cu_ok(c, cudaStreamCreateWithFlags(&c->copy, cudaStreamNonBlocking), "cudaStreamCreateWithFlags (copy)") &&
        mp__cu_events(c, c->uploaded, 2) && mp__cu_events(c, c->consumed, 2) &&
        mp__lt_ok(c, cublasLtCreate(&c->lt), "cublasLtCreate") &&
        mp__cu_ok(c, cudaMalloc(&c->ws.p, c->ws.bytes), "cudaMalloc (cuBLASLt workspace)")) {
        mp__cu_count(c, c->ws.bytes, 0);
        mp__cu_reason[0] = '\0';
        *ctx = c;
        return MP_OK;
    }
    mp__cu_set_reason(c->error, "");
    if (c->lt) cublasLtDestroy(c->lt);
    mp__cu_drop_events(c->uploaded, 2);
    mp__cu_drop_events(c->consumed, 2);
    if (c->copy) cudaStreamDestroy(c->copy);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
    return MP_ERR_BACKEND;
}

static void mp__cu_plan_free(mp__cu_plan *p) {
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->d) cublasLtMatrixLayoutDestroy(p->d);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

static void mp__cu_host_free(void *ctx, void *p);

static void mp__cu_destroy(void *ctx) {
    mp__cu *c = mp__cu_of(ctx);
    int i;
    if (!c) return;
    (void)cudaSetDevice(c->device);
    (void)cudaStreamSynchronize(c->copy);
    (void)cudaStreamSynchronize(c->stream);
    for (i = 0; i < MP__CU_PLANS; i++) mp__cu_plan_free(&c->plans[i]);
    for (i = 0; i < MP__CU_PINNED; i++) mp__cu_host_free(c, c->pinned[i].p);
    for (i = 0; i < MP__CU_BLOCKS; i++) mp__cu_release(c, &c->blocks[i]); /* what the caller did not free */
    mp__cu_release(c, &c->ws);
    mp__cu_release(c, &c->d32);
    mp__cu_release(c, &c->a32);
    mp__cu_release(c, &c->b32);
    mp__cu_release(c, &c->stage[0]);
    mp__cu_release(c, &c->stage[1]);
    mp__cu_release(c, &c->rows);
    mp__cu_release(c, &c->stats);
    cublasLtDestroy(c->lt);
    mp__cu_drop_events(c->uploaded, 2);
    mp__cu_drop_events(c->consumed, 2);
    cudaStreamDestroy(c->copy);
    cudaStreamDestroy(c->stream);
    free(c);
}

static int mp__cu_threads(void *ctx) {
    (void)ctx;
    return 1;
}

/* cudaMalloc aligns to 256 bytes at least; the block is zeroed on the
   stream, as the CPU's allocations are. NULL when full or out of memory
   (not an error of the context: the model reports MP_ERR_ALLOC). */
static void *mp__cu_alloc(void *ctx, size_t bytes) {
    mp__cu *c = mp__cu_of(ctx);
    void *p = NULL;
    int i;
    if (!mp__cu_live(c)) return NULL;
    for (i = 0; i < MP__CU_BLOCKS && c->blocks[i].p; i++) {}
    if (i == MP__CU_BLOCKS) return NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError(); /* out of memory is not sticky: clear it */
        return NULL;
    }
    if (!mp__cu_ok(c, cudaMemsetAsync(p, 0, bytes, c->stream), "cudaMemsetAsync (a new block)")) {
        (void)cudaFree(p);
        return NULL;
    }
    c->blocks[i].p = p;
    c->blocks[i].bytes = bytes;
    mp__cu_count(c, bytes, 0);
    return p;
}

static void mp__cu_free(void *ctx, void *p) {
    mp__cu *c = mp__cu_of(ctx);
    int i;
    if (!p) return;
    for (i = 0; i < MP__CU_BLOCKS && c->blocks[i].p != p; i++) {}
    if (i == MP__CU_BLOCKS) return; /* not ours */
    (void)cudaSetDevice(c->device);
    (void)mp__cu_ok(c, mp__cu_waited(cudaStreamSynchronize(c->stream)), "waiting to free a block");
    mp__cu_release(c, &c->blocks[i]);
}

static void mp__cu_memory(void *ctx, mp_backend_memory *out) {
    const mp__cu *c = mp__cu_of(ctx);
    out->fallbacks = c->fallbacks;
    out->current = c->current;
    out->peak = c->peak;
    out->workspace = c->ws.bytes + c->d32.bytes + c->a32.bytes + c->b32.bytes + c->stage[0].bytes + c->stage[1].bytes + c->rows.bytes +
                     c->stats.bytes;
}

/* >>pinned staging: host_alloc's blocks, and when the host may write them */
static mp__cu_pinned *mp__cu_pinned_of(mp__cu *c, const void *p) {
    int i;
    for (i = 0; i < MP__CU_PINNED; i++) {
        const char *b = (const char *)c->pinned[i].p;
        if (b && (const char *)p >= b && (const char *)p < b + c->pinned[i].bytes) return &c->pinned[i];
    }
    return NULL;
}

/* After a copy from host memory on stream `on` (0 compute, 1 copy): if the
   memory is pinned, the copy reads it when it runs, so mark when that is. */
static void mp__cu_mark_read(mp__cu *c, const void *src, int on) {
    mp__cu_pinned *b = mp__cu_pinned_of(c, src);
    if (b) (void)mp__cu_ok(c, cudaEventRecord(b->read[on], on ? c->copy : c->stream), "cudaEventRecord (pinned)");
}

/* NULL when out of pinned memory or slots: mixprec then stages in its own. */
static void *mp__cu_host_alloc(void *ctx, size_t bytes) {
    mp__cu *c = mp__cu_of(ctx);
    mp__cu_pinned *b;
    int i;
    if (!mp__cu_live(c)) return NULL;
    for (i = 0; i < MP__CU_PINNED && c->pinned[i].p; i++) {}
    if (i == MP__CU_PINNED) return NULL;
    b = &c->pinned[i];
    if (cudaHostAlloc(&b->p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError(); /* out of pinned memory is not sticky */
        b->p = NULL;
        return NULL;
    }
    b->bytes = bytes;
    if (!mp__cu_events(c, b->read, 2)) return NULL;
    return b->p;
}

static void mp__cu_host_free(void *ctx, void *p) {
    mp__cu *c = mp__cu_of(ctx);
    mp__cu_pinned *b = p ? mp__cu_pinned_of(c, p) : NULL;
    if (!b) return;
    (void)cudaFreeHost(b->p); /* waits for the device */
    mp__cu_drop_events(b->read, 2);
    memset(b, 0, sizeof *b);
}

/* Waits (on the host) for the copies that read p's block: the ones queued
   before this batch's, so the device keeps computing meanwhile. */
static void mp__cu_host_wait(void *ctx, const void *p) {
    mp__cu *c = mp__cu_of(ctx);
    mp__cu_pinned *b = mp__cu_pinned_of(c, p);
    if (b && mp__cu_live(c))
        (void)(mp__cu_ok(c, mp__cu_waited(cudaEventSynchronize(b->read[0])), "waiting for a staging buffer") &&
               mp__cu_ok(c, cudaEventSynchronize(b->read[1]), "waiting for a staging buffer"));
}

/* Copies to the host wait for them. Copies from it do not: from pageable
   memory the driver takes the bytes before it returns (the caller may
   reuse its buffer), from pinned memory the copy reads it when it runs
   (host_wait says when the host may write it again). */
static void mp__cu_copy(void *ctx, void *dst, const void *src, size_t bytes, mp_copy_kind kind) {
    mp__cu *c = mp__cu_of(ctx);
    cudaMemcpyKind k = kind == MP_COPY_TO_BACKEND ? cudaMemcpyHostToDevice
                       : kind == MP_COPY_TO_HOST  ? cudaMemcpyDeviceToHost
                                                  : cudaMemcpyDeviceToDevice;
    if (!bytes || !mp__cu_live(c)) return;
    if (!mp__cu_ok(c, cudaMemcpyAsync(dst, src, bytes, k, c->stream), "cudaMemcpyAsync")) return;
    if (kind == MP_COPY_TO_BACKEND) mp__cu_stats_now.bytes_in += bytes;
    if (kind == MP_COPY_TO_BACKEND) mp__cu_mark_read(c, src, 0);
    if (kind == MP_COPY_TO_HOST) (void)mp__cu_ok(c, mp__cu_waited(cudaStreamSynchronize(c->stream)), "a copy to the host");
}

static void mp__cu_zero(void *ctx, void *p, size_t bytes) {
    mp__cu *c = mp__cu_of(ctx);
    if (bytes && mp__cu_live(c)) (void)mp__cu_ok(c, cudaMemsetAsync(p, 0, bytes, c->stream), "cudaMemsetAsync");
}

static mp_status mp__cu_sync(void *ctx) {
    mp__cu *c = mp__cu_of(ctx);
    if (mp__cu_live(c)) (void)mp__cu_ok(c, mp__cu_waited(cudaStreamSynchronize(c->stream)), "the queued work");
    return c->error[0] ? MP_ERR_BACKEND : MP_OK;
}

static const char *mp__cu_last_error(void *ctx) {
    const mp__cu *c = mp__cu_of(ctx);
    return c->error[0] ? c->error : "no error";
}

/* Whether a x b floats are addressable. */
static int mp__cu_fits(size_t a, size_t b) { return b == 0 || a <= (size_t)-1 / sizeof(float) / b; }

/* Nothing to reserve up front: a product needs scratch (its float32 result,
   widened operands) only for an epilogue of ours or for mixed operand
   dtypes, grown at its first use and kept. This checks that those sizes
   are addressable. */
static mp_status mp__cu_gemm_reserve(void *ctx, size_t m, size_t n, size_t k) {
    (void)ctx;
    return mp__cu_fits(m, n) && mp__cu_fits(m, k) && mp__cu_fits(k, n) ? MP_OK : MP_ERR_SIZE;
}

static void mp__cu_cast(void *ctx, void *dst, mp_dtype dt, const void *src, mp_dtype st, size_t n,
                        mp_cast_stats *stats);

/* The batch in: uploaded on the copy stream into one of two float32
   stages (the other may still be read by the previous batch's cast), then
   cast on the compute stream, which waits for the upload only: so batch
   k+1's upload overlaps step k's compute. The cast checks every value for
   Inf and NaN, so the host need not scan the batch. */
static void mp__cu_cast_in(void *ctx, void *dst, mp_dtype dt, const float *host_src, size_t n, int *nonfinite) {
    mp__cu *c = mp__cu_of(ctx);
    int j;
    float *stage;
    if (!n || !mp__cu_live(c)) return;
    j = c->turn ^= 1;
    if (!(stage = (float *)mp__cu_grow(c, &c->stage[j], n * sizeof(float)))) return;
    if (mp__cu_ok(c, cudaStreamWaitEvent(c->copy, c->consumed[j], 0), "cudaStreamWaitEvent (stage free)") &&
        mp__cu_ok(c, cudaMemcpyAsync(stage, host_src, n * sizeof(float), cudaMemcpyHostToDevice, c->copy),
                  "cudaMemcpyAsync (the batch)")) {
        mp__cu_mark_read(c, host_src, 1);
        mp__cu_stats_now.bytes_in += n * sizeof(float);
        if (mp__cu_ok(c, cudaEventRecord(c->uploaded[j], c->copy), "cudaEventRecord (uploaded)") &&
            mp__cu_ok(c, cudaStreamWaitEvent(c->stream, c->uploaded[j], 0), "cudaStreamWaitEvent (uploaded)")) {
            MP__CU_LAUNCH(c, n, mp__k_cast_in, dst, dt, stage, n, nonfinite);
            (void)mp__cu_ok(c, cudaEventRecord(c->consumed[j], c->stream), "cudaEventRecord (consumed)");
        }
    }
}

/* With stats: the counts of mp_convert, made on the device and added to
   *stats as mp__stats_add does (one wait for the counters). */
static void mp__cu_add_stats(mp__cu *c, const void *src, mp_dtype st, mp_dtype dt, size_t n, mp_cast_stats *stats) {
    mp__cu_stats *d = (mp__cu_stats *)mp__cu_grow(c, &c->stats, sizeof(mp__cu_stats)), h;
    float hi, lo;
    if (!d) return;
    MP__CU_LAUNCH1(c, mp__k_stats_init, d);
    MP__CU_LAUNCH(c, n, mp__k_stats, d, src, st, n, mp__cu_ranges_of[dt]);
    if (c->error[0] || !mp__cu_ok(c, cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, c->stream), "cudaMemcpyAsync (stats)") ||
        !mp__cu_ok(c, mp__cu_waited(cudaStreamSynchronize(c->stream)), "the cast stats"))
        return;
    stats->count += n;
    stats->nan_in += h.nan;
    stats->inf_in += h.inf;
    stats->underflow += h.underflow;
    stats->subnormal += h.subnormal;
    stats->overflow += h.overflow;
    if (!h.max_abs) return; /* no finite nonzero input */
    memcpy(&hi, &h.max_abs, 4);
    memcpy(&lo, &h.min_abs, 4);
    if (hi > stats->max_abs) stats->max_abs = hi;
    if (stats->min_abs == 0.0f || lo < stats->min_abs) stats->min_abs = lo;
}

static void mp__cu_cast(void *ctx, void *dst, mp_dtype dt, const void *src, mp_dtype st, size_t n,
                        mp_cast_stats *stats) {
    mp__cu *c = mp__cu_of(ctx);
    if (!n || !mp__cu_live(c)) return;
    if (stats) mp__cu_add_stats(c, src, st, dt, n, stats);
    if (dst == src && dt == st) return;
    if (dt == st)
        (void)mp__cu_ok(c, cudaMemcpyAsync(dst, src, n * mp__cu_size(dt), cudaMemcpyDeviceToDevice, c->stream),
                        "cudaMemcpyAsync (cast)");
    else
        MP__CU_LAUNCH(c, n, mp__k_cast, dst, dt, src, st, n);
}

/* >>gemm: row-major C [m x n] = op(A) op(B) is column-major C^T = op(B)^T
   op(A)^T: cuBLASLt's A is our B and its B our A, no copy. cuBLASLt wants
   A and B in one dtype: mixed operands are widened to float32 (exactly, as
   the CPU widens both), and so are 16-bit ones where no algorithm exists
   (bfloat16 before Ampere). Float16/bfloat16 products use
   CUBLAS_COMPUTE_32F (float32 accumulation on Tensor Cores); float32 ones
   CUBLAS_COMPUTE_32F_PEDANTIC, or _FAST_TF32 when the config asks. Split-K
   may only reduce in float32 (never in C's dtype, which would round twice).
   cuBLASLt writes C itself, with beta = 1 to accumulate and its bias
   epilogue, when C's dtype is the operands' or float32 and the activation
   is linear or ReLU (its RELU epilogue: before the rounding, as the CPU). Otherwise it writes a float32
   scratch and mp__k_epilogue does the CPU's epilogue: sigmoid, tanh and
   gelu see the unrounded sum, and gelu's pre-activation is kept. */
static cudaDataType_t mp__cu_type(mp_dtype t) {
    return t == MP_FLOAT32 ? CUDA_R_32F : t == MP_FLOAT16 ? CUDA_R_16F : CUDA_R_16BF;
}

static uint32_t mp__cu_align(const void *p) {
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a) a /= 2;
    return a;
}

static int mp__cu_key_eq(const mp__cu_key *x, const mp__cu_key *y) { return memcmp(x, y, sizeof *x) == 0; }

/* A new plan for key: descriptors and the heuristic's first algorithm.
   1: made; 0: no algorithm for it (not an error: the caller falls back,
   whatever the heuristic's reason); -1: a recorded error. */
static int mp__cu_plan_make(mp__cu *c, mp__cu_plan *p, const mp__cu_key *key, const void *bias) {
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t result;
    cublasOperation_t op_a = (cublasOperation_t)key->op_a, op_b = (cublasOperation_t)key->op_b;
    cublasLtEpilogue_t epilogue = (cublasLtEpilogue_t)key->epilogue;
    cudaDataType_t ab = (cudaDataType_t)key->ab_type, d = (cudaDataType_t)key->d_type;
    uint64_t ws = c->ws.bytes;
    uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE; /* or none */
    int found = 0, ok;
    cublasStatus_t s;
    memset(p, 0, sizeof *p);
    ok = mp__lt_ok(c, cublasLtMatmulDescCreate(&p->op, (cublasComputeType_t)key->compute, CUDA_R_32F),
                   "cublasLtMatmulDescCreate") &&
         mp__lt_ok(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a), "TRANSA") &&
         mp__lt_ok(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b), "TRANSB") &&
         mp__lt_ok(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
                   "EPILOGUE") &&
         (!bias || mp__lt_ok(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
                             "BIAS_POINTER")) &&
         /* stored shapes, column-major: A = our B (n x k, or k x n when
            transposed), B = our A (k x m, or m x k), D = C^T (n x m) */
         mp__lt_ok(c, cublasLtMatrixLayoutCreate(&p->a, ab, op_a == CUBLAS_OP_N ? key->n : key->k,
                                                 op_a == CUBLAS_OP_N ? key->k : key->n,
                                                 (int64_t)(op_a == CUBLAS_OP_N ? key->n : key->k)),
                   "cublasLtMatrixLayoutCreate (A)") &&
         mp__lt_ok(c, cublasLtMatrixLayoutCreate(&p->b, ab, op_b == CUBLAS_OP_N ? key->k : key->m,
                                                 op_b == CUBLAS_OP_N ? key->m : key->k,
                                                 (int64_t)(op_b == CUBLAS_OP_N ? key->k : key->m)),
                   "cublasLtMatrixLayoutCreate (B)") &&
         mp__lt_ok(c, cublasLtMatrixLayoutCreate(&p->d, d, key->n, key->m, (int64_t)key->n),
                   "cublasLtMatrixLayoutCreate (D)") &&
         mp__lt_ok(c, cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate") &&
         mp__lt_ok(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
                   "MAX_WORKSPACE_BYTES") &&
         mp__lt_ok(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction,
                                                           sizeof reduction),
                   "REDUCTION_SCHEME_MASK") &&
         mp__lt_ok(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key->align[0],
                                                           sizeof key->align[0]),
                   "MIN_ALIGNMENT_A_BYTES") &&
         mp__lt_ok(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key->align[1],
                                                           sizeof key->align[1]),
                   "MIN_ALIGNMENT_B_BYTES") &&
         mp__lt_ok(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key->align[2],
                                                           sizeof key->align[2]),
                   "MIN_ALIGNMENT_C_BYTES") &&
         mp__lt_ok(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key->align[2],
                                                           sizeof key->align[2]),
                   "MIN_ALIGNMENT_D_BYTES");
    if (ok) {
        s = cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->a, p->b, p->d, p->d, pref, 1, &result, &found);
        if (s == CUBLAS_STATUS_SUCCESS && found >= 1 && result.state != CUBLAS_STATUS_SUCCESS) s = result.state;
        if (s != CUBLAS_STATUS_SUCCESS || found < 1) {
            c->refused = s;
            found = 0;
        }
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (!ok || !found) { /* a refusal is kept, so the heuristic is asked once */
        mp__cu_plan_free(p);
        p->used = ok;
        p->refused = 1;
        p->key = *key;
        return ok ? 0 : -1;
    }
    p->used = 1;
    p->key = *key;
    p->algo = result.algo;
    return 1;
}

/* The cached plan for key (a remembered refusal: NULL, status 0), or a new
   one in place of the least recently used (a model's few dozen products
   stay cached whatever else runs). */
static mp__cu_plan *mp__cu_plan_for(mp__cu *c, const mp__cu_key *key, const void *bias, int *status) {
    mp__cu_plan *p = &c->plans[0];
    int i;
    c->plan_clock++;
    for (i = 0; i < MP__CU_PLANS; i++) {
        mp__cu_plan *q = &c->plans[i];
        if (q->used && mp__cu_key_eq(&q->key, key)) {
            q->last = c->plan_clock;
            *status = q->refused ? 0 : 1;
            return q->refused ? NULL : q;
        }
        if (!q->used || (p->used && q->last < p->last)) p = q;
    }
    mp__cu_plan_free(p);
    *status = mp__cu_plan_make(c, p, key, bias);
    p->last = c->plan_clock;
    return *status == 1 ? p : NULL;
}

/* One cuBLASLt call: D (dt) = relu?(op(A) op(B) [+ C if accumulate] [+ bias]).
   a, b: our operands in ab. 1: ran; 0: no algorithm; -1: error. */
static int mp__cu_matmul(mp__cu *c, const mp_gemm_args *g, const void *a, const void *b, mp_dtype ab, void *d,
                         mp_dtype dt, int accumulate, const void *bias, int relu) {
    mp__cu_key key;
    mp__cu_plan *p;
    float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    int status;
    cublasStatus_t s;
    memset(&key, 0, sizeof key); /* compared with memcmp: padding too */
    key.op_a = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    key.op_b = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    key.m = g->m, key.n = g->n, key.k = g->k;
    key.ab_type = mp__cu_type(ab);
    key.d_type = mp__cu_type(dt);
    key.compute = ab != MP_FLOAT32 ? CUBLAS_COMPUTE_32F : c->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_PEDANTIC;
    /* PEDANTIC refused (it need not have a kernel for every shape): plain
       CUBLAS_COMPUTE_32F, also float32 without TF32 unless asked (FAST_TF32) */
    /* ReLU in cuBLASLt's epilogue, before the one rounding, as the CPU's */
    key.epilogue = bias ? (relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                        : (relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
    key.align[0] = mp__cu_align(b);
    key.align[1] = mp__cu_align(a);
    key.align[2] = mp__cu_align(d);
    key.align[3] = bias ? mp__cu_align(bias) : 0;
    p = mp__cu_plan_for(c, &key, bias, &status);
    if (!p && status == 0 && key.compute == CUBLAS_COMPUTE_32F_PEDANTIC) {
        key.compute = CUBLAS_COMPUTE_32F;
        p = mp__cu_plan_for(c, &key, bias, &status);
    }
    if (!p) return status;
    if (bias && !mp__lt_ok(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
                           "BIAS_POINTER"))
        return -1;
    s = cublasLtMatmul(c->lt, p->op, &alpha, b, p->a, a, p->b, &beta, d, p->d, d, p->d, &p->algo, c->ws.p, c->ws.bytes,
                       c->stream);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED) { /* the plan cannot run after all: a refusal, remembered */
        mp__cu_plan_free(p);
        p->used = p->refused = 1;
        p->key = key;
        return 0;
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        mp__cu_stats_now.launches++;
        if (ab == MP_FLOAT32 && key.compute == CUBLAS_COMPUTE_32F) mp__cu_stats_now.compute_32f++; /* PEDANTIC refused */
    }
    return mp__lt_ok(c, s, "cublasLtMatmul") ? 1 : -1;
}

/* n elements of src (t) as float32 in scratch buf. */
static const void *mp__cu_widen(mp__cu *c, mp__cu_buf *buf, const void *src, mp_dtype t, size_t n) {
    void *p;
    if (t == MP_FLOAT32) return src;
    if (!(p = mp__cu_grow(c, buf, n * sizeof(float)))) return NULL;
    MP__CU_LAUNCH(c, n, mp__k_cast, p, MP_FLOAT32, src, t, n);
    return p;
}

/* Whether cuBLASLt can write C: its dtype, a bias in C's dtype (AMP may
   hand a float32 bias to a 16-bit C) and 16-byte aligned (cuBLASLt states
   no alignment for the BIAS epilogue's pointer, but its kernels may assume
   16 bytes and fault with a sticky misaligned address: cuBLAS documentation,
   cublasLtMatmulDescAttributes_t; CUDA Runtime API, cudaErrorMisalignedAddress),
   and an epilogue it does exactly. */
static int mp__cu_direct_if_aligned(const mp_gemm_args *g, mp_dtype ab) {
    return (g->ct == ab || g->ct == MP_FLOAT32) && !g->z && (g->act == MP_LINEAR || g->act == MP_RELU) &&
           (!g->bias || g->biast == g->ct);
}

static int mp__cu_direct(const mp_gemm_args *g, mp_dtype ab) {
    return mp__cu_direct_if_aligned(g, ab) && (!g->bias || (uintptr_t)g->bias % 16 == 0);
}

static const char *mp__cu_name(mp_dtype t) { return t == MP_FLOAT32 ? "float32" : t == MP_FLOAT16 ? "float16" : "bfloat16"; }

/* A product on a slower path than its dtypes ask: counted (memory's
   fallbacks), and the first one of a context named on stderr, so that a
   refused 16-bit plan (10-15x slower widened to float32 on an H100) or an
   under-aligned bias never passes unseen. */
static void mp__cu_fallback(mp__cu *c, const mp_gemm_args *g, const char *how) {
    c->fallbacks++;
    mp__cu_stats_now.fallbacks++;
    if (c->warned) return;
    c->warned = 1;
    fprintf(stderr,
            "WARNING: mixprec: the cuda backend: a %zux%zux%zu product (%s x %s -> %s) %s; counted in "
            "mp_model_memory_info's fallbacks\n",
            g->m, g->n, g->k, mp__cu_name(g->at), mp__cu_name(g->bt), mp__cu_name(g->ct), how);
}

static void mp__cu_product(mp__cu *c, const mp_gemm_args *g) {
    const void *a = g->a, *b = g->b;
    mp_dtype ab = g->at;
    size_t mn = g->m * g->n;
    float *d32 = NULL;
    const char *slow = NULL; /* why the product is slower than its dtypes ask, if it is */
    int r, direct;
    if (!g->m || !g->n || !mp__cu_live(c)) return;
    if (g->k == 0) { /* no product: the epilogue over zeros */
        MP__CU_LAUNCH(c, mn, mp__k_epilogue, g->c, g->ct, (const float *)NULL, g->accumulate, g->bias, g->biast, g->z,
                      g->act, mn, g->n);
        return;
    }
    if (g->at != g->bt) {
        a = mp__cu_widen(c, &c->a32, g->a, g->at, g->m * g->k);
        b = mp__cu_widen(c, &c->b32, g->b, g->bt, g->k * g->n);
        ab = MP_FLOAT32;
    }
    if (g->bias && mp__cu_direct(g, ab) != mp__cu_direct_if_aligned(g, ab))
        slow = "has a bias not 16-byte aligned for cuBLASLt's BIAS epilogue: added by a kernel of ours";
    for (;;) { /* cuBLASLt writes C; else the float32 scratch; else widen and retry */
        if (!a || !b) return; /* widening failed: recorded */
        direct = mp__cu_direct(g, ab);
        r = direct ? mp__cu_matmul(c, g, a, b, ab, g->c, g->ct, g->accumulate, g->bias, g->act == MP_RELU) : 0;
        if (r == 0 && direct) slow = "has no cuBLASLt plan writing C: a float32 result and an epilogue of ours";
        if (r == 0) {
            direct = 0;
            if (!(d32 = (float *)mp__cu_grow(c, &c->d32, mn * sizeof(float)))) return;
            r = mp__cu_matmul(c, g, a, b, ab, d32, MP_FLOAT32, 0, NULL, 0);
        }
        if (r != 0) break;
        if (ab == MP_FLOAT32) { /* nothing left to fall back to */
            (void)mp__cu_fail(c, "cublasLtMatmulAlgoGetHeuristic: no algorithm for a float32 product",
                              c->refused == CUBLAS_STATUS_SUCCESS ? "none found" : cublasLtGetStatusString(c->refused));
            return;
        }
        slow = "has no 16-bit cuBLASLt plan: widened to float32";
        a = mp__cu_widen(c, &c->a32, a, ab, g->m * g->k); /* 16-bit without an algorithm */
        b = mp__cu_widen(c, &c->b32, b, ab, g->k * g->n);
        ab = MP_FLOAT32;
    }
    if (r < 0) return;
    if (slow) mp__cu_fallback(c, g, slow);
    if (!direct)
        MP__CU_LAUNCH(c, mn, mp__k_epilogue, g->c, g->ct, d32, g->accumulate, g->bias, g->biast, g->z, g->act, mn, g->n);
}

/* The product, then ReLU's gradient where relu_y asks for it: the
   activation-gradient kernel in place over C (cuBLASLt's DRELU epilogue
   reads a bitmask its RELU_AUX forward would have written, which the
   model's forward does not keep). */
static void mp__cu_gemm(void *ctx, const mp_gemm_args *g) {
    mp__cu *c = mp__cu_of(ctx);
    size_t mn = g->m * g->n;
    mp__cu_product(c, g);
    if (g->relu_y && mp__cu_live(c))
        MP__CU_LAUNCH(c, mn, mp__k_act_backward, g->c, g->ct, (const void *)g->c, g->relu_y, (const void *)NULL, mn,
                      MP_RELU, g->ct);
}

static void mp__cu_bias_act(void *ctx, void *y, const void *x, const void *bias, size_t rows, size_t cols,
                            mp_activation act, mp_dtype dt) {
    mp__cu *c = mp__cu_of(ctx);
    if (!cols || !mp__cu_live(c)) return;
    if (act == MP_SOFTMAX) MP__CU_LAUNCH(c, rows * MP__CU_WARP, mp__k_softmax, y, x, bias, rows, cols, dt);
    else MP__CU_LAUNCH(c, rows * cols, mp__k_bias_act, y, x, bias, rows * cols, cols, act, dt);
}

static void mp__cu_act_backward(void *ctx, void *dx, mp_dtype dxt, const void *dy, const void *y, const void *x,
                                size_t rows, size_t cols, mp_activation act, mp_dtype dt) {
    mp__cu *c = mp__cu_of(ctx);
    if (!cols || !mp__cu_live(c)) return;
    if (act == MP_SOFTMAX) MP__CU_LAUNCH(c, rows * MP__CU_WARP, mp__k_softmax_backward, dx, dxt, dy, y, rows, cols, dt);
    else MP__CU_LAUNCH(c, rows * cols, mp__k_act_backward, dx, dxt, dy, y, x, rows * cols, act, dt);
}

static void mp__cu_bias_grad(void *ctx, void *db, const void *dy, size_t rows, size_t cols, mp_dtype dt) {
    mp__cu *c = mp__cu_of(ctx);
    size_t parts = (rows + MP__CU_PART_ROWS - 1) / MP__CU_PART_ROWS;
    float *part = NULL;
    if (!cols || !mp__cu_live(c)) return;
    /* parts * cols <= rows * cols floats: no larger than dy in float32 */
    if (parts && !(part = (float *)mp__cu_grow(c, &c->rows, parts * cols * sizeof(float)))) return;
    MP__CU_LAUNCH(c, parts * cols, mp__k_colsum_parts, part, dy, dt, rows, cols, parts);
    MP__CU_LAUNCH(c, (cols + MP__CU_WARP - 1) / MP__CU_WARP * MP__CU_THREADS, mp__k_colsum_final, db, dt, part, parts, cols);
}

static void mp__cu_loss(void *ctx, mp_loss kind, int from_logits, const void *pred, mp_dtype pt, const void *out,
                        mp_dtype ot, const int32_t *labels, const float *y, size_t rows, size_t cols, float *dpred,
                        float *metrics) {
    mp__cu *c = mp__cu_of(ctx);
    float *row_loss;
    if (!mp__cu_live(c)) return;
    /* a loss and a count per row (rows <= the floats of dpred) */
    if (!(row_loss = (float *)mp__cu_grow(c, &c->rows, (rows ? rows : 1) * 2 * sizeof(float)))) return;
    MP__CU_LAUNCH(c, rows * MP__CU_WARP, mp__k_loss_rows, kind, from_logits, pred, pt, out, ot, labels, y, rows, cols, dpred,
                  1.0f / (float)rows, row_loss, (unsigned *)(row_loss + rows));
    MP__CU_LAUNCH_GRID(c, 1, MP__CU_THREADS, mp__k_loss_sum, metrics, row_loss, (const unsigned *)(row_loss + rows), rows);
}

static void mp__cu_scale_cast(void *ctx, void *dst, mp_dtype dt, const float *src, size_t n, const float *scale) {
    mp__cu *c = mp__cu_of(ctx);
    if (mp__cu_live(c)) MP__CU_LAUNCH(c, n, mp__k_scale_cast, dst, dt, src, n, scale);
}

static void mp__cu_unscale_check(void *ctx, float *dst, const void *src, mp_dtype st, size_t n, const float *scale,
                                 int *found_inf) {
    mp__cu *c = mp__cu_of(ctx);
    if (mp__cu_live(c)) MP__CU_LAUNCH(c, n, mp__k_unscale, dst, src, st, n, scale, found_inf);
}

static void mp__cu_loss_scale_update(void *ctx, mp_loss_scale *ls, const int *found_inf) {
    mp__cu *c = mp__cu_of(ctx);
    if (mp__cu_live(c)) MP__CU_LAUNCH1(c, mp__k_loss_scale, ls, found_inf);
}

/* Adam's step size with both bias corrections, on the host exactly as
   mp__cpu_optimizer_update computes it (the iteration is the host's). */
static void mp__cu_optimizer_update(void *ctx, const mp_opt_step *step, float *w, const void *g, mp_dtype gt,
                                    const float *scale, float *s1, float *s2, size_t n, void *wc, mp_dtype wt,
                                    const int *found_inf) {
    mp__cu *c = mp__cu_of(ctx);
    if (!mp__cu_live(c)) return;
    MP__CU_LAUNCH(c, n, mp__k_optimizer, step->cfg, mp__adam_alpha(step), step->weight_decay, step->sum_squares, w, g,
                  gt, scale, s1, s2, n, wc, wt, found_inf);
}

static void mp__cu_sum_squares(void *ctx, float *sum, const void *g, mp_dtype gt, size_t n, const float *scale) {
    mp__cu *c = mp__cu_of(ctx);
    size_t blocks = (n + MP__SUM_SQUARES_BLOCK - 1) / MP__SUM_SQUARES_BLOCK;
    float *lanes;
    if (!n || !mp__cu_live(c)) return;
    if (!(lanes = (float *)mp__cu_grow(c, &c->rows, blocks * 8 * sizeof(float)))) return;
    MP__CU_LAUNCH(c, blocks * 8, mp__k_square_lanes, lanes, g, gt, n, scale);
    MP__CU_LAUNCH1(c, mp__k_square_total, sum, (const float *)lanes, blocks);
}

static void mp__cu_im2col(void *ctx, void *col, const void *img, size_t images, const mp_conv_geom *g, mp_dtype dt) {
    mp__cu *c = mp__cu_of(ctx);
    size_t n = images * (size_t)g->oh * (size_t)g->ow * (size_t)g->kh * (size_t)g->kw * (size_t)g->c;
    if (!mp__cu_live(c)) return;
    if (dt == MP_FLOAT32) MP__CU_LAUNCH(c, n, mp__k_im2col<uint32_t>, (uint32_t *)col, (const uint32_t *)img, images, *g);
    else MP__CU_LAUNCH(c, n, mp__k_im2col<uint16_t>, (uint16_t *)col, (const uint16_t *)img, images, *g);
}

static void mp__cu_col2im(void *ctx, float *img, const float *col, size_t images, const mp_conv_geom *g) {
    mp__cu *c = mp__cu_of(ctx);
    if (mp__cu_live(c))
        MP__CU_LAUNCH(c, images * (size_t)g->h * (size_t)g->w * (size_t)g->c, mp__k_col2im, img, col, images, *g);
}

/* dst[((t F + f) C + c] = src[((taps - 1 - t) C + c) F + f], a thread a value */
static __global__ void mp__k_conv_flip(void *dst, const void *src, size_t taps, size_t filters, size_t channels,
                                       size_t es) {
    MP__CU_LOOP(i, taps * filters * channels) {
        size_t c = i % channels, f = i / channels % filters, t = i / channels / filters;
        size_t from = ((taps - 1 - t) * channels + c) * filters + f;
        if (es == 4) ((uint32_t *)dst)[i] = ((const uint32_t *)src)[from];
        else ((uint16_t *)dst)[i] = ((const uint16_t *)src)[from];
    }
}

static void mp__cu_conv_flip(void *ctx, void *dst, const void *src, const mp_conv_geom *g, size_t filters, mp_dtype dt) {
    mp__cu *c = mp__cu_of(ctx);
    size_t taps = (size_t)g->kh * (size_t)g->kw;
    if (mp__cu_live(c))
        MP__CU_LAUNCH(c, taps * filters * (size_t)g->c, mp__k_conv_flip, dst, src, taps, filters, (size_t)g->c,
                      (size_t)(dt == MP_FLOAT32 ? 4 : 2));
}

static void mp__cu_max_pool(void *ctx, void *y, const void *x, size_t n, const mp_conv_geom *g, mp_dtype dt) {
    mp__cu *c = mp__cu_of(ctx);
    if (mp__cu_live(c)) MP__CU_LAUNCH(c, n * (size_t)g->oh * (size_t)g->ow * (size_t)g->c, mp__k_max_pool, y, x, n, *g, dt);
}

static void mp__cu_max_pool_backward(void *ctx, void *dx, mp_dtype dxt, const void *dy, const void *x, size_t n,
                                     const mp_conv_geom *g, mp_dtype dt) {
    mp__cu *c = mp__cu_of(ctx);
    if (mp__cu_live(c))
        MP__CU_LAUNCH(c, n * (size_t)g->h * (size_t)g->w * (size_t)g->c, mp__k_max_pool_backward, dx, dxt, dy, x, n, *g, dt);
}

static void mp__cu_dropout_mask(void *ctx, unsigned char *mask, size_t n, float rate, uint64_t seed) {
    mp__cu *c = mp__cu_of(ctx);
    if (mp__cu_live(c)) MP__CU_LAUNCH(c, n, mp__k_dropout_mask, mask, n, rate, seed);
}

static void mp__cu_dropout(void *ctx, void *y, mp_dtype yt, const void *x, mp_dtype xt, const unsigned char *mask,
                           size_t n, float scale) {
    mp__cu *c = mp__cu_of(ctx);
    if (mp__cu_live(c)) MP__CU_LAUNCH(c, n, mp__k_dropout, y, yt, x, xt, mask, n, scale);
}

static void mp__cu_elementwise(void *ctx, mp_elementwise op, void *y, mp_dtype yt, const void *a, mp_dtype at,
                               const void *b, mp_dtype bt, float s, size_t n) {
    mp__cu *c = mp__cu_of(ctx);
    if (mp__cu_live(c)) MP__CU_LAUNCH(c, n, mp__k_elementwise, op, y, yt, a, at, b, bt, s, n);
}

static void mp__cu_copy_cols(void *ctx, void *dst, mp_dtype dt, size_t dst_stride, const void *src, mp_dtype st,
                             size_t src_stride, size_t rows, size_t cols) {
    mp__cu *c = mp__cu_of(ctx);
    size_t n = rows * cols;
    if (!mp__cu_live(c)) return;
    if (dt != st) MP__CU_LAUNCH(c, n, mp__k_cast_cols, dst, dt, dst_stride, src, st, src_stride, rows, cols);
    else if (dt == MP_FLOAT32)
        MP__CU_LAUNCH(c, n, mp__k_copy_cols<uint32_t>, (uint32_t *)dst, dst_stride, (const uint32_t *)src, src_stride, rows, cols);
    else MP__CU_LAUNCH(c, n, mp__k_copy_cols<uint16_t>, (uint16_t *)dst, dst_stride, (const uint16_t *)src, src_stride, rows, cols);
}

static void mp__cu_avg_pool(void *ctx, void *y, const void *x, size_t n, const mp_conv_geom *g, mp_dtype dt) {
    mp__cu *c = mp__cu_of(ctx);
    if (mp__cu_live(c)) MP__CU_LAUNCH(c, n * (size_t)g->oh * (size_t)g->ow * (size_t)g->c, mp__k_avg_pool, y, x, n, *g, dt);
}

static void mp__cu_avg_pool_backward(void *ctx, void *dx, mp_dtype dxt, const void *dy, size_t n, const mp_conv_geom *g,
                                     mp_dtype dt) {
    mp__cu *c = mp__cu_of(ctx);
    if (mp__cu_live(c))
        MP__CU_LAUNCH(c, n * (size_t)g->h * (size_t)g->w * (size_t)g->c, mp__k_avg_pool_backward, dx, dxt, dy, n, *g, dt);
}

/* The column sums of what (MP__NORM_SUM_*) in two launches, reading the
   statistics in `in`, writing what mp__k_norm_final writes; the parts in
   the scratch (parts * cols <= rows * cols floats, two sets for GRAD). */
static void mp__cu_norm_sums(mp__cu *c, int what, const void *x, const void *dy, mp_dtype dt, size_t rows, size_t cols,
                             const float *in, int per_row, float epsilon, float *stats, float *moving, float momentum,
                             float *sums) {
    size_t parts = (rows + MP__NORM_ROWS - 1) / MP__NORM_ROWS, sets = what == MP__NORM_SUM_GRAD ? 2 : 1;
    float *part = (float *)mp__cu_grow(c, &c->rows, sets * parts * cols * sizeof(float));
    if (!part) return;
    MP__CU_LAUNCH(c, parts * cols, mp__k_norm_parts, part, what, x, dy, dt, rows, cols, in, per_row, epsilon);
    MP__CU_LAUNCH(c, cols, mp__k_norm_final, (const float *)part, what, rows, cols, stats, moving, momentum, sums);
}

static void mp__cu_batch_norm(void *ctx, void *y, mp_dtype yt, const void *x, mp_dtype dt, size_t rows, size_t cols,
                              const float *gamma_beta, float *stats, float *moving, float momentum, float epsilon,
                              int training) {
    mp__cu *c = mp__cu_of(ctx);
    if (!rows || !cols || !mp__cu_live(c)) return;
    if (training) {
        mp__cu_norm_sums(c, MP__NORM_SUM_X, x, NULL, dt, rows, cols, stats, 0, epsilon, stats, moving, momentum, NULL);
        mp__cu_norm_sums(c, MP__NORM_SUM_DEV2, x, NULL, dt, rows, cols, stats, 0, epsilon, stats, moving, momentum, NULL);
    }
    MP__CU_LAUNCH(c, rows * cols, mp__k_bn_y, y, yt, x, dt, rows * cols, cols, gamma_beta,
                  (const float *)(training ? stats : moving), epsilon);
}

static void mp__cu_batch_norm_backward(void *ctx, void *dx, mp_dtype dxt, const void *dy, const void *x, mp_dtype dt,
                                       size_t rows, size_t cols, const float *gamma_beta, const float *stats,
                                       float epsilon, float *dgamma_beta) {
    mp__cu *c = mp__cu_of(ctx);
    if (!rows || !cols || !mp__cu_live(c)) return;
    mp__cu_norm_sums(c, MP__NORM_SUM_GRAD, x, dy, dt, rows, cols, stats, 0, epsilon, NULL, NULL, 0.0f, dgamma_beta);
    if (dx)
        MP__CU_LAUNCH(c, rows * cols, mp__k_bn_dx, dx, dxt, dy, x, dt, rows, cols, gamma_beta, stats, epsilon,
                      (const float *)dgamma_beta);
}

static void mp__cu_layer_norm(void *ctx, void *y, mp_dtype yt, const void *x, mp_dtype dt, size_t rows, size_t cols,
                              const float *gamma_beta, float epsilon, float *stats) {
    mp__cu *c = mp__cu_of(ctx);
    if (rows && cols && mp__cu_live(c))
        MP__CU_LAUNCH(c, rows * MP__CU_WARP, mp__k_ln, y, yt, x, dt, rows, cols, gamma_beta, epsilon, stats);
}

static void mp__cu_layer_norm_backward(void *ctx, void *dx, mp_dtype dxt, const void *dy, const void *x, mp_dtype dt,
                                       size_t rows, size_t cols, const float *gamma_beta, const float *stats,
                                       float *dgamma_beta) {
    mp__cu *c = mp__cu_of(ctx);
    if (!rows || !cols || !mp__cu_live(c)) return;
    mp__cu_norm_sums(c, MP__NORM_SUM_GRAD, x, dy, dt, rows, cols, stats, 1, 0.0f, NULL, NULL, 0.0f, dgamma_beta);
    if (dx) MP__CU_LAUNCH(c, rows * MP__CU_WARP, mp__k_ln_dx, dx, dxt, dy, x, dt, rows, cols, gamma_beta, stats);
}

/* Embedding: a thread an element; its gradient a thread a column, adding
   the rows in order (the CPU's sums, bit for bit). */
static __global__ void mp__k_embedding(void *y, mp_dtype yt, const float *table, size_t vocab, const float *ids,
                                       size_t period, size_t rows, size_t cols) {
    MP__CU_LOOP(e, rows * cols) {
        size_t id = mp__embedding_index(ids, period, e / cols, vocab);
        mp__st(y, yt, e, id < vocab ? table[id * cols + e % cols] : 0.0f);
    }
}

static __global__ void mp__k_embedding_grad(float *dtable, size_t vocab, const void *dy, mp_dtype dt, const float *ids,
                                            size_t period, size_t rows, size_t cols) {
    MP__CU_LOOP(c, cols) {
        for (size_t r = 0; r < vocab; r++) dtable[r * cols + c] = 0.0f;
        for (size_t r = 0; r < rows; r++) {
            size_t id = mp__embedding_index(ids, period, r, vocab);
            if (id < vocab) dtable[id * cols + c] += mp__ld(dy, dt, r * cols + c);
        }
    }
}

static void mp__cu_embedding(void *ctx, void *y, mp_dtype yt, const float *table, size_t vocab, const float *ids,
                             size_t period, size_t rows, size_t cols) {
    mp__cu *c = mp__cu_of(ctx);
    if (mp__cu_live(c)) MP__CU_LAUNCH(c, rows * cols, mp__k_embedding, y, yt, table, vocab, ids, period, rows, cols);
}

static void mp__cu_embedding_backward(void *ctx, float *dtable, size_t vocab, const void *dy, mp_dtype dt, const float *ids,
                                      size_t period, size_t rows, size_t cols) {
    mp__cu *c = mp__cu_of(ctx);
    if (mp__cu_live(c)) MP__CU_LAUNCH(c, cols, mp__k_embedding_grad, dtable, vocab, dy, dt, ids, period, rows, cols);
}

/* Attention: a thread a row of a sequence, >>rules' rows (the CPU's). */
static __global__ void mp__k_attention(mp__attention_geom g, void *att, void *p, float *s, const void *q, const void *k,
                                       const void *v, size_t n) {
    MP__CU_LOOP(r, n * g.t) mp__attention_row(&g, att, p, s, q, k, v, r / g.t, r % g.t);
}

static __global__ void mp__k_attention_dq(mp__attention_geom g, void *dq, float *s, const void *datt, const void *k,
                                          const void *v, const void *p, size_t n) {
    MP__CU_LOOP(r, n * g.t) mp__attention_dq_row(&g, dq, s, datt, k, v, p, r / g.t, r % g.t);
}

static __global__ void mp__k_attention_dkv(mp__attention_geom g, void *dk, void *dv, const float *s, const void *datt,
                                           const void *q, const void *p, size_t n) {
    MP__CU_LOOP(r, n * g.t) mp__attention_dkv_row(&g, dk, dv, s, datt, q, p, r / g.t, r % g.t);
}

static void mp__cu_attention(void *ctx, void *att, void *p, float *s, const void *q, const void *k, const void *v,
                             mp_dtype dt, size_t batch, size_t t, size_t heads, size_t d, float scale, int causal) {
    mp__cu *c = mp__cu_of(ctx);
    mp__attention_geom g = mp__attention_geom_of(dt, t, heads, d, scale, causal);
    if (mp__cu_live(c)) MP__CU_LAUNCH(c, batch * heads * t, mp__k_attention, g, att, p, s, q, k, v, batch * heads);
}

static void mp__cu_attention_backward(void *ctx, void *dq, void *dk, void *dv, float *s, const void *datt, const void *q,
                                      const void *k, const void *v, const void *p, mp_dtype dt, size_t batch, size_t t,
                                      size_t heads, size_t d, float scale, int causal) {
    mp__cu *c = mp__cu_of(ctx);
    mp__attention_geom g = mp__attention_geom_of(dt, t, heads, d, scale, causal);
    if (!mp__cu_live(c)) return;
    MP__CU_LAUNCH(c, batch * heads * t, mp__k_attention_dq, g, dq, s, datt, k, v, p, batch * heads);
    MP__CU_LAUNCH(c, batch * heads * t, mp__k_attention_dkv, g, dk, dv, s, datt, q, p, batch * heads);
}

/* Free device memory (0 if it cannot be queried: fit then sends batches). */
static size_t mp__cu_free_memory(void *ctx) {
    mp__cu *c = mp__cu_of(ctx);
    size_t free_bytes = 0, total = 0;
    if (!mp__cu_live(c) || cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return free_bytes;
}

static void mp__cu_gather(void *ctx, void *dst, const void *src, const uint32_t *idx, size_t rows, size_t row_bytes) {
    mp__cu *c = mp__cu_of(ctx);
    size_t words = row_bytes / 4;
    if (mp__cu_live(c))
        MP__CU_LAUNCH(c, rows * words, mp__k_gather, (uint32_t *)dst, (const uint32_t *)src, idx, rows, words);
}

static const mp_backend mp__cu_backend = {
    MP_OP(name) "cuda", MP_OP(device_memory) 1, MP_OP(tensor_cores) 1, MP_OP(relu_grad) 1,
    MP_OP(create) mp__cu_create,
    MP_OP(destroy) mp__cu_destroy,
    MP_OP(threads) mp__cu_threads,
    MP_OP(alloc) mp__cu_alloc,
    MP_OP(free) mp__cu_free,
    MP_OP(memory) mp__cu_memory,
    MP_OP(copy) mp__cu_copy,
    MP_OP(zero) mp__cu_zero,
    MP_OP(sync) mp__cu_sync,
    MP_OP(last_error) mp__cu_last_error,
    MP_OP(gemm_reserve) mp__cu_gemm_reserve,
    MP_OP(cast_in) mp__cu_cast_in,
    MP_OP(cast) mp__cu_cast,
    MP_OP(gemm) mp__cu_gemm,
    MP_OP(bias_act) mp__cu_bias_act,
    MP_OP(act_backward) mp__cu_act_backward,
    MP_OP(bias_grad) mp__cu_bias_grad,
    MP_OP(loss) mp__cu_loss,
    MP_OP(scale_cast) mp__cu_scale_cast,
    MP_OP(unscale_check) mp__cu_unscale_check,
    MP_OP(loss_scale_update) mp__cu_loss_scale_update,
    MP_OP(optimizer_update) mp__cu_optimizer_update,
    MP_OP(im2col) mp__cu_im2col,
    MP_OP(col2im) mp__cu_col2im,
    MP_OP(conv_flip) mp__cu_conv_flip,
    MP_OP(conv_gemm) NULL,
    MP_OP(max_pool) mp__cu_max_pool,
    MP_OP(max_pool_backward) mp__cu_max_pool_backward,
    MP_OP(dropout_mask) mp__cu_dropout_mask,
    MP_OP(dropout) mp__cu_dropout,
    MP_OP(elementwise) mp__cu_elementwise,
    MP_OP(copy_cols) mp__cu_copy_cols,
    MP_OP(avg_pool) mp__cu_avg_pool,
    MP_OP(avg_pool_backward) mp__cu_avg_pool_backward,
    MP_OP(batch_norm) mp__cu_batch_norm,
    MP_OP(batch_norm_backward) mp__cu_batch_norm_backward,
    MP_OP(layer_norm) mp__cu_layer_norm,
    MP_OP(layer_norm_backward) mp__cu_layer_norm_backward,
    MP_OP(embedding) mp__cu_embedding,
    MP_OP(embedding_backward) mp__cu_embedding_backward,
    MP_OP(attention) mp__cu_attention,
    MP_OP(attention_backward) mp__cu_attention_backward,
    MP_OP(host_alloc) mp__cu_host_alloc,
    MP_OP(host_free) mp__cu_host_free,
    MP_OP(host_wait) mp__cu_host_wait,
    MP_OP(free_memory) mp__cu_free_memory,
    MP_OP(gather) mp__cu_gather,
    MP_OP(sum_squares) mp__cu_sum_squares,
};

/* >>public */
extern "C" const mp_backend *mp_cuda_backend(void) { return &mp__cu_backend; }

extern "C" void *mp_cuda_stream(void *ctx) { return ctx ? (void *)mp__cu_of(ctx)->stream : NULL; }

extern "C" int mp_cuda_device_count(void) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        mp__cu_set_reason("cudaGetDeviceCount", cudaGetErrorString(e));
        return 0;
    }
    if (count == 0) mp__cu_set_reason("no CUDA device", "");
    else mp__cu_reason[0] = '\0';
    return count;
}

extern "C" mp_status mp_cuda_device_name(int device, char *buf, size_t size) {
    cudaDeviceProp prop;
    cudaError_t e;
    if (!buf || !size) return MP_ERR_NULL;
    buf[0] = '\0';
    if ((e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess) {
        (void)cudaGetLastError();
        mp__cu_set_reason("cudaGetDeviceProperties", cudaGetErrorString(e));
        return MP_ERR_BACKEND;
    }
    snprintf(buf, size, "%s", prop.name);
    return MP_OK;
}

extern "C" const char *mp_cuda_last_error(void) { return mp__cu_reason; }

extern "C" void mp_cuda_get_stats(mp_cuda_stats *out) {
    if (out) *out = mp__cu_stats_now;
}
