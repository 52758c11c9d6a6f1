/* initcheck_probe.cu - does compute-sanitizer's initcheck see cuBLASLt's
   stores? Each case: D from cudaMalloc, written only by cublasLtMatmul
   (column-major, D = A B), then read by a kernel; run under
   `compute-sanitizer --tool initcheck` (tests/gpu.sh). Prints each sum
   against the exact one (A all 1, B all 0.5: every element k / 2). */
#include <cstdio>
#include <vector>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cublasLt.h>
#define CK(x) do { int e_ = (int)(x); if (e_) { printf("probe: %s failed: %d\n", #x, e_); return 1; } } while (0)

static __global__ void sum_of(const float *d, size_t n, double *out) {
    double s = 0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) s += d[i];
    atomicAdd(out, s);
}

/* m x n x k with operands of type t (CUDA_R_32F or CUDA_R_16F), D float32 */
static int probe(cublasLtHandle_t h, int m, int n, int k, cudaDataType t) {
    size_t es = t == CUDA_R_32F ? 4 : 2, ws_bytes = 32u << 20;
    std::vector<unsigned char> ha((size_t)m * k * es), hb((size_t)k * n * es);
    for (size_t i = 0; i < (size_t)m * k; i++) {
        if (t == CUDA_R_32F) ((float *)ha.data())[i] = 1.0f; else ((__half *)ha.data())[i] = __float2half(1.0f);
    }
    for (size_t i = 0; i < (size_t)k * n; i++) {
        if (t == CUDA_R_32F) ((float *)hb.data())[i] = 0.5f; else ((__half *)hb.data())[i] = __float2half(0.5f);
    }
    void *A, *B, *ws;
    float *D;
    double *out, sum;
    CK(cudaMalloc(&A, ha.size())); CK(cudaMalloc(&B, hb.size())); CK(cudaMalloc(&D, (size_t)m * n * 4));
    CK(cudaMalloc(&out, sizeof *out)); CK(cudaMalloc(&ws, ws_bytes));
    CK(cudaMemset(out, 0, sizeof *out)); CK(cudaMemset(ws, 0, ws_bytes));
    CK(cudaMemcpy(A, ha.data(), ha.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(B, hb.data(), hb.size(), cudaMemcpyHostToDevice));
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    float one = 1, zero = 0;
    CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CK(cublasLtMatrixLayoutCreate(&la, t, m, k, m));
    CK(cublasLtMatrixLayoutCreate(&lb, t, k, n, k));
    CK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m));
    CK(cublasLtMatmulPreferenceCreate(&pref));
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
    CK(cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, ld, ld, pref, 1, &r, &found));
    CK(!found);
    CK(cublasLtMatmul(h, op, &one, A, la, B, lb, &zero, D, ld, D, ld, &r.algo, ws, ws_bytes, 0));
    sum_of<<<1, 256>>>(D, (size_t)m * n, out);
    CK(cudaMemcpy(&sum, out, sizeof sum, cudaMemcpyDeviceToHost));
    printf("probe %s m=%d n=%d k=%d sum=%.1f exact=%.1f\n", t == CUDA_R_32F ? "float32" : "float16", m, n, k, sum,
           0.5 * k * m * n);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb); cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
    cudaFree(A); cudaFree(B); cudaFree(D); cudaFree(out); cudaFree(ws);
    return 0;
}

int main(void) {
    cublasLtHandle_t h;
    CK(cublasLtCreate(&h));
    probe(h, 24, 50, 40, CUDA_R_32F);
    probe(h, 512, 512, 512, CUDA_R_32F);
    probe(h, 10, 128, 64, CUDA_R_16F);   /* Dense(10)'s forward: C^T is 10 x batch, ld 10 */
    probe(h, 128, 128, 64, CUDA_R_16F);
    cublasLtDestroy(h);
    return 0;
}
