/* cuda_emu.h - a host emulation of the CUDA runtime and cuBLASLt calls the
   CUDA backend makes, so that tests/test_cuda.c runs its GPU tests where
   there is no GPU (only the CUDA headers are needed). It is force-included
   into cuda/mixprec_cuda.cu compiled as C++ by the host compiler:

       g++ -std=c++14 -x c++ -include tests/cuda_emu.h -I$CUDA/include \
           -c cuda/mixprec_cuda.cu -o mixprec_cuda_emu.o

   and the test links that object instead of the library (no libcudart, no
   cuBLASLt). What it checks: every kernel's indexing and logic (kernels run
   block by block, thread by thread: they are grid-stride loops without
   shared memory or barriers, so the order does not matter, and atomics are
   plain updates); the row-major to column-major mapping of every product,
   which a reference cublasLtMatmul computes from the descriptors as
   cuBLASLt documents them (D = alpha op(A) op(B) + beta C + bias per row
   of D, float32 accumulation, TF32 rounding of the inputs under
   CUBLAS_COMPUTE_32F_FAST_TF32, one rounding into D's type); the types
   cuBLASLt supports; that every pointer a copy, memset or product uses
   lies in device memory (host memory in registered blocks, filled with
   0xA5 when allocated, so nothing relies on fresh memory being zero) and
   is as aligned as the heuristic was promised. What it cannot check:
   CUDA's own rounding of expf/erff/... (the host's libm runs), launch
   limits beyond an empty grid, cuBLASLt's real algorithms, timing.
   MIXPREC_CUDA_EMU_NO_BF16=1 in the environment makes the heuristic find
   no bfloat16 algorithm (as before Ampere), to test the float32 fallback. */
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

/* >>launches: the built-in indices, and a launch as two loops */
static uint3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
static cudaError_t emu_error = cudaSuccess; /* what cudaGetLastError returns next */

#define MP__CU_RUN(blocks, threads, stream, kernel, ...)                                           \
    do {                                                                                            \
        (void)(stream);                                                                             \
        gridDim = dim3((unsigned)(blocks));                                                         \
        blockDim = dim3((unsigned)(threads));                                                       \
        if (gridDim.x == 0 || blockDim.x == 0 || blockDim.x > 1024) emu_error = cudaErrorInvalidConfiguration; \
        for (blockIdx.x = 0; blockIdx.x < gridDim.x; blockIdx.x++)                                  \
            for (threadIdx.x = 0; threadIdx.x < blockDim.x; threadIdx.x++) kernel(__VA_ARGS__);     \
    } while (0)

static int atomicOr(int *p, int v) {
    int old = *p;
    *p = old | v;
    return old;
}
static unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    unsigned long long old = *p;
    *p = old + v;
    return old;
}
static unsigned atomicMax(unsigned *p, unsigned v) {
    unsigned old = *p;
    *p = v > old ? v : old;
    return old;
}
static unsigned atomicMin(unsigned *p, unsigned v) {
    unsigned old = *p;
    *p = v < old ? v : old;
    return old;
}
static unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}

/* >>device memory: host blocks, registered */
#define EMU_BLOCKS 4096
static struct emu_block {
    char *p;
    size_t bytes;
} emu_blocks[EMU_BLOCKS];

static int emu_on_device(const void *p, size_t bytes) {
    const char *c = (const char *)p;
    int i;
    for (i = 0; i < EMU_BLOCKS; i++)
        if (emu_blocks[i].p && c >= emu_blocks[i].p && c + bytes <= emu_blocks[i].p + emu_blocks[i].bytes) return 1;
    return 0;
}

static cudaError_t emu_fail(cudaError_t e) {
    emu_error = e;
    return e;
}

#define EMU_MEMORY ((size_t)64 << 30) /* a GPU's worth: larger requests fail */
cudaError_t cudaMalloc(void **p, size_t bytes) {
    int i;
    if (bytes > EMU_MEMORY) return emu_fail(cudaErrorMemoryAllocation);
    for (i = 0; i < EMU_BLOCKS && emu_blocks[i].p; i++) {}
    /* exactly `bytes` (ASan sees a kernel's overrun), 256-byte aligned as cudaMalloc's */
    if (i == EMU_BLOCKS || posix_memalign(p, 256, bytes ? bytes : 1) != 0) return emu_fail(cudaErrorMemoryAllocation);
    memset(*p, 0xA5, bytes);
    emu_blocks[i].p = (char *)*p;
    emu_blocks[i].bytes = bytes;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    int i;
    if (!p) return cudaSuccess;
    for (i = 0; i < EMU_BLOCKS && emu_blocks[i].p != p; i++) {}
    if (i == EMU_BLOCKS) return emu_fail(cudaErrorInvalidValue);
    free(p);
    emu_blocks[i].p = NULL;
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s) {
    int to_dev = emu_on_device(dst, bytes), from_dev = emu_on_device(src, bytes);
    (void)s;
    if ((kind == cudaMemcpyHostToDevice && (!to_dev || from_dev)) ||
        (kind == cudaMemcpyDeviceToHost && (to_dev || !from_dev)) ||
        (kind == cudaMemcpyDeviceToDevice && (!to_dev || !from_dev)) ||
        (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToHost && kind != cudaMemcpyDeviceToDevice)) {
        fprintf(stderr, "cuda_emu: cudaMemcpyAsync kind %d between host/device pointers that do not fit it\n", (int)kind);
        return emu_fail(cudaErrorInvalidValue);
    }
    memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s) {
    (void)s;
    if (!emu_on_device(p, bytes)) return emu_fail(cudaErrorInvalidValue);
    memset(p, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = emu_error;
    emu_error = cudaSuccess;
    return e;
}
const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "an emulated CUDA error"; }
cudaError_t cudaGetDeviceCount(int *count) {
    *count = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : emu_fail(cudaErrorInvalidDevice); }
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (device != 0) return emu_fail(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "mixprec's host emulation of CUDA");
    return cudaSuccess;
}
static int emu_stream;
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    (void)flags;
    *s = (cudaStream_t)&emu_stream;
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) { return s == (cudaStream_t)&emu_stream ? cudaSuccess : emu_fail(cudaErrorInvalidValue); }
cudaError_t cudaStreamSynchronize(cudaStream_t s) { return s == (cudaStream_t)&emu_stream ? cudaSuccess : emu_fail(cudaErrorInvalidValue); }

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
    else if (a == CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK && size == 4) {}
    else if (a >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES && size == 4)
        memcpy(&e->align[a - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, 4);
    else
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

static size_t emu_type_size(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }

/* cuBLASLt's rules for what this backend asks: shapes that fit, one input
   type, its compute type, D in that type or float32, C's layout D's. */
static cublasStatus_t emu_check(const emu_desc *d, const emu_layout *a, const emu_layout *b, const emu_layout *c,
                                const emu_layout *dl) {
    uint64_t m = dl->rows, n = dl->cols, k = d->trans[0] == CUBLAS_OP_N ? a->cols : a->rows;
    if (memcmp(c, dl, sizeof *c) != 0 || a->type != b->type) return CUBLAS_STATUS_INVALID_VALUE;
    if ((d->trans[0] == CUBLAS_OP_N ? a->rows : a->cols) != m || (d->trans[1] == CUBLAS_OP_N ? b->rows : b->cols) != k ||
        (d->trans[1] == CUBLAS_OP_N ? b->cols : b->rows) != n || k == 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    if ((uint64_t)a->ld < a->rows || (uint64_t)b->ld < b->rows || (uint64_t)dl->ld < dl->rows) return CUBLAS_STATUS_INVALID_VALUE;
    if (d->scale != CUDA_R_32F || (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT && d->epilogue != CUBLASLT_EPILOGUE_BIAS) ||
        (d->epilogue == CUBLASLT_EPILOGUE_BIAS && !d->bias))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (a->type == CUDA_R_32F ? d->compute != CUBLAS_COMPUTE_32F_PEDANTIC && d->compute != CUBLAS_COMPUTE_32F_FAST_TF32
                              : d->compute != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (dl->type != a->type && dl->type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (a->type == CUDA_R_16BF && getenv("MIXPREC_CUDA_EMU_NO_BF16")) return CUBLAS_STATUS_NOT_SUPPORTED;
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
    if (h != (cublasLtHandle_t)&emu_handle || requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    memset(&results[0], 0, sizeof results[0]);
    memcpy(results[0].algo.data, p->align, sizeof p->align);
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

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void *alpha, const void *a,
                              cublasLtMatrixLayout_t al, const void *b, cublasLtMatrixLayout_t bl, const void *beta,
                              const void *c, cublasLtMatrixLayout_t cl, void *d, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t stream) {
    const emu_desc *e = (const emu_desc *)desc;
    const emu_layout *A = (const emu_layout *)al, *B = (const emu_layout *)bl, *D = (const emu_layout *)dl;
    uint32_t need[4];
    float al_f = *(const float *)alpha, be_f = *(const float *)beta;
    uint64_t i, j, l, k = e->trans[0] == CUBLAS_OP_N ? A->cols : A->rows;
    int tf32 = e->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    (void)stream;
    if (h != (cublasLtHandle_t)&emu_handle || !algo) return CUBLAS_STATUS_INVALID_VALUE;
    if (emu_check(e, A, B, (const emu_layout *)cl, D) != CUBLAS_STATUS_SUCCESS) return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(need, algo->data, sizeof need);
    if ((uintptr_t)a % need[0] || (uintptr_t)b % need[1] || (uintptr_t)c % need[2] || (uintptr_t)d % need[3]) {
        fprintf(stderr, "cuda_emu: cublasLtMatmul: a pointer is less aligned than the heuristic was told\n");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!emu_fits(a, A) || !emu_fits(b, B) || !emu_fits(d, D) || (be_f != 0.0f && !emu_fits(c, D)) ||
        (ws_bytes && !emu_on_device(ws, ws_bytes)) ||
        (e->epilogue == CUBLASLT_EPILOGUE_BIAS && !emu_on_device(e->bias, D->rows * emu_type_size(D->type)))) {
        fprintf(stderr, "cuda_emu: cublasLtMatmul: an operand is not in device memory or overruns its block\n");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    for (j = 0; j < D->cols; j++)
        for (i = 0; i < D->rows; i++) {
            float acc = 0.0f, v;
            for (l = 0; l < k; l++) {
                float x = emu_op(a, A, e->trans[0], i, l), y = emu_op(b, B, e->trans[1], l, j);
                acc += tf32 ? emu_tf32(x) * emu_tf32(y) : x * y;
            }
            v = al_f * acc;
            if (be_f != 0.0f) v += be_f * emu_load(c, D->type, i + j * (uint64_t)D->ld);
            if (e->epilogue == CUBLASLT_EPILOGUE_BIAS) v += emu_load(e->bias, D->type, i);
            emu_store(d, D->type, i + j * (uint64_t)D->ld, v);
        }
    return CUBLAS_STATUS_SUCCESS;
}

#endif /* MIXPREC_CUDA_EMU_H */
