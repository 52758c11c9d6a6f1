/* test_cuda_emu.cpp - the rules of tests/cuda_emu.h, each shown on the
   CUDA runtime and cuBLASLt calls themselves (test_cuda shows them on the
   backend): work runs only when the host waits for it, so a missing wait
   reads stale data; pinned and pageable copies; events and cross-stream
   waits; the eager order; the sticky fault; cuBLASLt's type table and its
   bias alignment; the counters.

       g++ -std=c++14 -Itests/cuda_emu tests/test_cuda_emu.cpp -o test_cuda_emu */
#include "cuda_emu.h"
#include "check.h"

static __global__ void k_fill(float *p, float v, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}

static cuda_emu_counts counts(void) {
    cuda_emu_counts c;
    cuda_emu_counters(&c);
    return c;
}

/* A kernel, a memset and a pinned copy run at the wait, not at the call. */
static void test_lazy(cudaStream_t s) {
    float *d = NULL, *pin = NULL;
    cuda_emu_counts before = counts();
    CHECK(cudaMalloc((void **)&d, 64 * sizeof(float)) == cudaSuccess);
    CHECK(cudaHostAlloc((void **)&pin, 64 * sizeof(float), cudaHostAllocDefault) == cudaSuccess);
    pin[0] = 7.0f;
    MP__CU_RUN(1, 32, s, k_fill, d, 3.0f, (size_t)64);
    CHECK(cudaMemcpyAsync(pin, d, 64 * sizeof(float), cudaMemcpyDeviceToHost, s) == cudaSuccess);
    CHECK(pin[0] == 7.0f);                         /* not yet: no wait */
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(pin[0] == 3.0f && pin[63] == 3.0f);
    CHECK(counts().launches == before.launches + 1 && counts().waits == before.waits + 1);
    CHECK(counts().drains == before.drains + 1 && counts().pinned == before.pinned + 1);
    /* pinned to device: the host's bytes as they are when the copy runs */
    pin[0] = 1.0f;
    CHECK(cudaMemcpyAsync(d, pin, sizeof(float), cudaMemcpyHostToDevice, s) == cudaSuccess);
    pin[0] = 2.0f; /* changed before the copy ran: a GPU may send either */
    CHECK(cudaMemcpyAsync(pin + 1, d, sizeof(float), cudaMemcpyDeviceToHost, s) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess && pin[1] == 2.0f);
    CHECK(cudaFree(d) == cudaSuccess && cudaFreeHost(pin) == cudaSuccess);
}

/* Pageable memory: staged at the call going in; synchronous coming out. */
static void test_pageable(cudaStream_t s) {
    float *d = NULL, h[4] = {1, 2, 3, 4}, back[4] = {0, 0, 0, 0};
    cuda_emu_counts before;
    CHECK(cudaMalloc((void **)&d, sizeof h) == cudaSuccess);
    before = counts();
    CHECK(cudaMemcpyAsync(d, h, sizeof h, cudaMemcpyHostToDevice, s) == cudaSuccess);
    h[0] = 99.0f; /* after the call: the driver has its own copy */
    CHECK(counts().waits == before.waits && counts().pageable == before.pageable + 1);
    CHECK(cudaMemcpyAsync(back, d, sizeof back, cudaMemcpyDeviceToHost, s) == cudaSuccess);
    CHECK(back[0] == 1.0f && back[3] == 4.0f); /* returned complete: a host wait */
    CHECK(counts().waits == before.waits + 1 && counts().drains == before.drains + 1);
    CHECK(counts().bytes_in == before.bytes_in + sizeof h);
    CHECK(cudaFree(d) == cudaSuccess);
}

/* Streams are ordered only by events: a wait on s2 runs s1's work only
   through cudaStreamWaitEvent. A wait that leaves work queued behind it
   is a wait but not a drain. */
static void test_streams(cudaStream_t s1, cudaStream_t s2) {
    float *d = NULL, *pin = NULL;
    cudaEvent_t e;
    cuda_emu_counts before;
    CHECK(cudaMalloc((void **)&d, 4 * sizeof(float)) == cudaSuccess);
    CHECK(cudaHostAlloc((void **)&pin, 4 * sizeof(float), 0) == cudaSuccess);
    CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
    CHECK(cudaMemsetAsync(d, 0, 4 * sizeof(float), s1) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s1) == cudaSuccess);
    MP__CU_RUN(1, 4, s1, k_fill, d, 5.0f, (size_t)4);
    CHECK(cudaMemcpyAsync(pin, d, sizeof(float), cudaMemcpyDeviceToHost, s2) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s2) == cudaSuccess && pin[0] == 0.0f); /* s1's kernel has not run */
    CHECK(cudaEventRecord(e, s1) == cudaSuccess && cudaEventQuery(e) == cudaErrorNotReady);
    CHECK(cudaStreamWaitEvent(s2, e, 0) == cudaSuccess);
    CHECK(cudaMemcpyAsync(pin, d, sizeof(float), cudaMemcpyDeviceToHost, s2) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s2) == cudaSuccess && pin[0] == 5.0f && cudaEventQuery(e) == cudaSuccess);
    /* an event wait with work queued after it: no drain */
    CHECK(cudaMemsetAsync(d, 0, sizeof(float), s1) == cudaSuccess);
    CHECK(cudaEventRecord(e, s1) == cudaSuccess);
    MP__CU_RUN(1, 4, s1, k_fill, d, 6.0f, (size_t)4);
    before = counts();
    CHECK(cudaEventSynchronize(e) == cudaSuccess);
    CHECK(counts().waits == before.waits + 1 && counts().drains == before.drains);
    CHECK(cudaStreamSynchronize(s1) == cudaSuccess && counts().drains == before.drains + 1);
    CHECK(cudaEventDestroy(e) == cudaSuccess);
    CHECK(cudaFree(d) == cudaSuccess && cudaFreeHost(pin) == cudaSuccess);
}

/* Two orders, both legal: a memset on s1 and an upload on s2 into the same
   memory, nothing ordering them. Lazily (by default) s1's memset runs at
   the wait for s1, before s2's copy; with MIXPREC_CUDA_EMU_EAGER the wait
   for s1 runs s2 first, so the memset comes last and wins. */
static void test_eager(cudaStream_t s1, cudaStream_t s2) {
    float *d = NULL, *pin = NULL;
    int eager;
    CHECK(cudaMalloc((void **)&d, sizeof(float)) == cudaSuccess);
    CHECK(cudaHostAlloc((void **)&pin, 2 * sizeof(float), 0) == cudaSuccess);
    for (eager = 0; eager < 2; eager++) {
        if (eager) setenv("MIXPREC_CUDA_EMU_EAGER", "1", 1);
        pin[0] = 4.0f;
        CHECK(cudaMemsetAsync(d, 0, sizeof(float), s1) == cudaSuccess);
        CHECK(cudaMemcpyAsync(d, pin, sizeof(float), cudaMemcpyHostToDevice, s2) == cudaSuccess);
        CHECK(cudaStreamSynchronize(s1) == cudaSuccess && cudaStreamSynchronize(s2) == cudaSuccess);
        CHECK(cudaMemcpyAsync(pin + 1, d, sizeof(float), cudaMemcpyDeviceToHost, s1) == cudaSuccess);
        CHECK(cudaStreamSynchronize(s1) == cudaSuccess && pin[1] == (eager ? 0.0f : 4.0f));
        unsetenv("MIXPREC_CUDA_EMU_EAGER");
    }
    CHECK(cudaFree(d) == cudaSuccess && cudaFreeHost(pin) == cudaSuccess);
}

/* A fault is sticky: every call returns it, cudaGetLastError too, again. */
static void check_sticky(cudaError_t want) {
    void *p = NULL;
    CHECK(cudaGetLastError() == want && cudaGetLastError() == want);
    CHECK(cudaMalloc(&p, 16) == want && p == NULL);
    CHECK(cudaSetDevice(0) == want);
    cuda_emu_clear_fault();
}

static void test_faults(cudaStream_t s) {
    float host[4], *d = NULL;
    CHECK(cudaMalloc((void **)&d, sizeof host) == cudaSuccess);
    /* a kernel given pageable host memory: an illegal address, at the wait */
    MP__CU_RUN(1, 4, s, k_fill, host, 1.0f, (size_t)4);
    CHECK(cudaGetLastError() == cudaSuccess); /* the launch itself was fine */
    CHECK(cudaStreamSynchronize(s) == cudaErrorIllegalAddress);
    check_sticky(cudaErrorIllegalAddress);
    /* an injected fault, and the work queued after it never runs */
    cuda_emu_fault_after(0);
    MP__CU_RUN(1, 4, s, k_fill, d, 1.0f, (size_t)4);
    CHECK(cudaStreamSynchronize(s) == cudaErrorIllegalAddress);
    check_sticky(cudaErrorIllegalAddress);
    /* a bad launch configuration is not sticky */
    MP__CU_RUN(0, 4, s, k_fill, d, 1.0f, (size_t)4);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration && cudaGetLastError() == cudaSuccess);
    CHECK(cudaFree(d) == cudaSuccess);
}

/* Block b's sum of 1000 b + t over its threads t by a shared-memory tree
   (s[t] += s[t + half]), with or without the __syncthreads between the
   steps (shared memory holds what the previous block left). */
static __global__ void k_block_sum(float *out, int with_barriers) {
    __shared__ float s[64];
    unsigned t = threadIdx.x, half;
    s[t] = (float)(1000 * blockIdx.x + t);
    if (with_barriers) __syncthreads();
    for (half = blockDim.x / 2; half > 0; half /= 2) {
        if (t < half) s[t] += s[t + half];
        if (with_barriers) __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = s[0];
}

/* Each warp's sum of its lanes' threadIdx by a xor butterfly (every lane
   ends with it), and lane 0's shuffle-down tree. */
static __global__ void k_warp_sums(float *xor_sum, unsigned *down_sum) {
    float v = (float)threadIdx.x;
    unsigned u = threadIdx.x;
    int m;
    for (m = 16; m > 0; m /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, m);
    for (m = 16; m > 0; m /= 2) u += __shfl_down_sync(0xFFFFFFFFu, u, (unsigned)m);
    xor_sum[threadIdx.x] = v;
    down_sum[threadIdx.x] = u;
}

/* A barrier in a branch only some threads take (PG: undefined). */
static __global__ void k_divergent(float *out) {
    if (threadIdx.x < 16) __syncthreads();
    out[threadIdx.x] = 1.0f;
}

/* Barriers and shuffles: a missing __syncthreads reads wrong data. */
static void test_block_threads(cudaStream_t s) {
    float *d = NULL, *xs = NULL, got[2][2], sums[64];
    unsigned *ds = NULL, downs[64];
    int with, t, ok = 1;
    CHECK(cudaMalloc((void **)&d, 2 * sizeof(float)) == cudaSuccess);
    CHECK(cudaMalloc((void **)&xs, 64 * sizeof(float)) == cudaSuccess);
    CHECK(cudaMalloc((void **)&ds, 64 * sizeof(unsigned)) == cudaSuccess);
    for (with = 1; with >= 0; with--) {
        MP__CU_RUN(2, 64, s, k_block_sum, d, with);
        CHECK(cudaMemcpyAsync(got[with], d, sizeof got[with], cudaMemcpyDeviceToHost, s) == cudaSuccess);
    }
    CHECK(got[1][0] == 2016.0f && got[1][1] == 66016.0f); /* 0 + 1 + ... + 63, and 64 000 more */
    CHECK(got[0][1] != 66016.0f); /* no barriers: thread 0 read s[32] before thread 32 wrote it */
    MP__CU_RUN(1, 64, s, k_warp_sums, xs, ds);
    CHECK(cudaMemcpyAsync(sums, xs, sizeof sums, cudaMemcpyDeviceToHost, s) == cudaSuccess);
    CHECK(cudaMemcpyAsync(downs, ds, sizeof downs, cudaMemcpyDeviceToHost, s) == cudaSuccess);
    for (t = 0; t < 64; t++) ok &= sums[t] == (t < 32 ? 496.0f : 1520.0f);
    CHECK(ok && downs[0] == 496u && downs[32] == 1520u);
    MP__CU_RUN(1, 32, s, k_divergent, xs);
    CHECK(cudaStreamSynchronize(s) == cudaErrorLaunchFailure);
    check_sticky(cudaErrorLaunchFailure);
    CHECK(cudaFree(d) == cudaSuccess && cudaFree(xs) == cudaSuccess && cudaFree(ds) == cudaSuccess);
}

/* cuBLASLt: the documented type table, and the BIAS epilogue's bias. */
static cublasStatus_t heuristic(cublasLtHandle_t lt, cublasComputeType_t compute, cudaDataType_t ab, cudaDataType_t dt,
                                const void *bias, cublasLtMatmulAlgo_t *algo, cublasLtMatmulDesc_t *desc,
                                cublasLtMatrixLayout_t *lab, cublasLtMatrixLayout_t *ld, uint32_t reduction = 0) {
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    cublasStatus_t st;
    cublasLtMatmulDescCreate(desc, compute, CUDA_R_32F);
    cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (bias) cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    cublasLtMatrixLayoutCreate(lab, ab, 8, 8, 8);
    cublasLtMatrixLayoutCreate(ld, dt, 8, 8, 8);
    cublasLtMatmulPreferenceCreate(&pref);
    if (reduction)
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction, sizeof reduction);
    st = cublasLtMatmulAlgoGetHeuristic(lt, *desc, *lab, *lab, *ld, *ld, pref, 1, &r, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    *algo = r.algo;
    return st;
}

static void test_cublaslt(cudaStream_t s) {
    static const struct {
        cublasComputeType_t compute;
        cudaDataType_t ab, d;
        int ok;
    } table[] = {
        {CUBLAS_COMPUTE_32F, CUDA_R_16F, CUDA_R_16F, 1},          {CUBLAS_COMPUTE_32F, CUDA_R_16F, CUDA_R_32F, 1},
        {CUBLAS_COMPUTE_32F, CUDA_R_16BF, CUDA_R_16BF, 1},        {CUBLAS_COMPUTE_32F, CUDA_R_16BF, CUDA_R_32F, 1},
        {CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, 1},          {CUBLAS_COMPUTE_32F_PEDANTIC, CUDA_R_32F, CUDA_R_32F, 1},
        {CUBLAS_COMPUTE_32F_PEDANTIC, CUDA_R_16F, CUDA_R_16F, 1}, {CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F, CUDA_R_32F, 1},
        {CUBLAS_COMPUTE_32F, CUDA_R_16F, CUDA_R_16BF, 0},         {CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16F, 0},
        {CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_16F, CUDA_R_16F, 0}, {CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F, CUDA_R_16F, 0},
        {CUBLAS_COMPUTE_16F, CUDA_R_16F, CUDA_R_16F, 0}, /* not modelled: refused */
    };
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t lab, ld;
    cublasLtMatmulAlgo_t algo;
    float one = 1.0f, zero = 0.0f;
    char *a = NULL, *dd = NULL, *bias = NULL, *ws = NULL;
    size_t i;
    CHECK(cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS);
    for (i = 0; i < sizeof table / sizeof table[0]; i++) {
        cublasStatus_t st = heuristic(lt, table[i].compute, table[i].ab, table[i].d, NULL, &algo, &desc, &lab, &ld);
        if (!CHECK(table[i].ok ? st == CUBLAS_STATUS_SUCCESS : st == CUBLAS_STATUS_NOT_SUPPORTED))
            fprintf(stderr, "  row %zu: status %d\n", i, (int)st);
        cublasLtMatmulDescDestroy(desc);
        cublasLtMatrixLayoutDestroy(lab);
        cublasLtMatrixLayoutDestroy(ld);
    }
    CHECK(cudaMalloc((void **)&a, 256) == cudaSuccess && cudaMalloc((void **)&dd, 256) == cudaSuccess);
    CHECK(cudaMalloc((void **)&bias, 64) == cudaSuccess && cudaMalloc((void **)&ws, 1024) == cudaSuccess);
    CHECK(cudaMemsetAsync(a, 0, 256, s) == cudaSuccess && cudaMemsetAsync(bias, 0, 64, s) == cudaSuccess);
    for (i = 0; i < 2; i++) { /* a 16-byte aligned bias runs; one 2 bytes in faults, at the wait */
        const void *b = bias + (i ? 2 : 0);
        CHECK(heuristic(lt, CUBLAS_COMPUTE_32F, CUDA_R_16F, CUDA_R_16F, b, &algo, &desc, &lab, &ld) == CUBLAS_STATUS_SUCCESS);
        CHECK(cublasLtMatmul(lt, desc, &one, a, lab, a, lab, &zero, dd, ld, dd, ld, &algo, ws, 1024, s) ==
              CUBLAS_STATUS_SUCCESS);
        CHECK(cudaStreamSynchronize(s) == (i ? cudaErrorMisalignedAddress : cudaSuccess));
        if (i) check_sticky(cudaErrorMisalignedAddress);
        cublasLtMatmulDescDestroy(desc);
        cublasLtMatrixLayoutDestroy(lab);
        cublasLtMatrixLayoutDestroy(ld);
    }
    {   /* split-K: allowed to reduce in the output type (cuBLASLt's default
           preference), a 16-bit D is rounded twice and some results move;
           with only the compute-type scheme, never */
        __half h[64], got[2][64];
        int differ = 0;
        for (i = 0; i < 64; i++) h[i] = __float2half_rn((float)((i * 37) % 64) / 64.0f - 0.3f);
        CHECK(cudaMemcpyAsync(a, h, sizeof h, cudaMemcpyHostToDevice, s) == cudaSuccess);
        for (i = 0; i < 2; i++) {
            CHECK(heuristic(lt, CUBLAS_COMPUTE_32F, CUDA_R_16F, CUDA_R_16F, NULL, &algo, &desc, &lab, &ld,
                            i ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE : 0) == CUBLAS_STATUS_SUCCESS);
            CHECK(cublasLtMatmul(lt, desc, &one, a, lab, a, lab, &zero, dd, ld, dd, ld, &algo, ws, 1024, s) ==
                  CUBLAS_STATUS_SUCCESS);
            CHECK(cudaMemcpyAsync(got[i], dd, sizeof got[i], cudaMemcpyDeviceToHost, s) == cudaSuccess);
            cublasLtMatmulDescDestroy(desc);
            cublasLtMatrixLayoutDestroy(lab);
            cublasLtMatrixLayoutDestroy(ld);
        }
        for (i = 0; i < 64; i++) differ += got[0][i].x != got[1][i].x;
        CHECK(differ > 0);
    }
    CHECK(cublasLtDestroy(lt) == CUBLAS_STATUS_SUCCESS);
    CHECK(cudaFree(a) == cudaSuccess && cudaFree(dd) == cudaSuccess);
    CHECK(cudaFree(bias) == cudaSuccess && cudaFree(ws) == cudaSuccess);
}

int main(int argc, char **argv) {
    cudaStream_t s1, s2;
    check_args(argc, argv);
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking) == cudaSuccess);
    RUN(test_lazy(s1));
    RUN(test_pageable(s1));
    RUN(test_streams(s1, s2));
    RUN(test_eager(s1, s2));
    RUN(test_faults(s1));
    RUN(test_block_threads(s1));
    RUN(test_cublaslt(s1));
    CHECK(cudaStreamDestroy(s1) == cudaSuccess && cudaStreamDestroy(s2) == cudaSuccess);
    return check_done("test_cuda_emu");
}
