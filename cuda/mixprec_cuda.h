/* mixprec_cuda.h - the CUDA backend of mixprec: a model's tensors live on one
   NVIDIA GPU, its products run through cuBLASLt (float16/bfloat16 on Tensor
   Cores with float32 accumulation) and every other op is a CUDA kernel, so a
   training step copies in only the batch and copies out only the step state
   (loss sum, accuracy count, loss scale: a few dozen bytes).

       #include "cuda/mixprec_cuda.h"
       mp_cuda_config cfg = {0};                  // device 0, true float32, 32 MiB
       mp_model_desc md = {{784}};
       md.backend = mp_cuda_backend();
       md.backend_config = &cfg;
       mp_model_create(&m, &md);                  // MP_ERR_BACKEND without a GPU

   Build: `make cuda` (nvcc, CUDA 12 or 13) gives build/libmixprec_cuda.a; link
   it after the file that defines MIXPREC_IMPLEMENTATION with
       -Lbuild -lmixprec_cuda -L$CUDA/lib64 -lcublasLt -lcudart -lstdc++ -lm
   The library holds no mixprec implementation of its own: it uses only the
   declarations and the shared inline rules of mixprec.h (so it links with
   MIXPREC_STATIC too; its own functions are plain extern ones).

   Numerics (see docs/backends.md, "The CUDA backend"): elementwise kernels widen to float32,
   compute in float32 without contraction (--fmad=false) and round once to
   nearest even, as the CPU backend; the optimizers, casts, loss scaling,
   im2col/col2im, pooling and dropout give the CPU's bits; products,
   transcendental functions (expf, erff, tanhf, logf: CUDA's, within 2 ulp)
   and sums over more than 256 rows differ by rounding only. Every kernel is
   deterministic: a re-run gives the same bits. */
#ifndef MIXPREC_CUDA_H
#define MIXPREC_CUDA_H

#include <stddef.h>
#include "../mixprec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* mp_model_desc.backend_config for mp_cuda_backend(); zero means the default. */
typedef struct mp_cuda_config {
    int device;             /* CUDA device ordinal (0 = the first) */
    int tf32;               /* nonzero: float32 products on TF32 Tensor Cores, as TensorFlow's
                               enable_tensor_float_32_execution; 0: true float32 (pedantic) */
    size_t workspace_bytes; /* cuBLASLt workspace; 0 = 32 MiB (NVIDIA's figure for Hopper) */
} mp_cuda_config;

/* The backend table (name "cuda", device memory, Tensor Cores). Creating a
   context fails with MP_ERR_BACKEND when there is no driver or device (the
   reason: mp_cuda_last_error()) and MP_ERR_ARG for a device ordinal out of
   range. Every device allocation is 256-byte aligned and zeroed. */
const mp_backend *mp_cuda_backend(void);
/* Devices the driver sees; 0 when there is no driver or device (never fails). */
int mp_cuda_device_count(void);
/* The device's name ("NVIDIA H100 80GB HBM3"), NUL-terminated and cut to
   size; MP_ERR_BACKEND when the device cannot be queried. */
mp_status mp_cuda_device_name(int device, char *buf, size_t size);
/* Why the last mp_cuda_device_count() found no device or the last context
   creation failed; "" after a success. Process-wide and not synchronised:
   create contexts from one thread at a time. Never NULL. */
const char *mp_cuda_last_error(void);
/* The cudaStream_t a model's work is queued on, from its backend context
   (mp_model_backend_context), for work beside the backend's in order with
   it (cuda/mixprec_nccl.h's all-reduce); NULL for NULL. */
void *mp_cuda_stream(void *backend_ctx);

/* What the backend has asked of the CUDA runtime so far, all contexts
   together (not synchronised, unlike mixprec.h's memory counters):
   take two readings around some steps for figures per step. */
typedef struct mp_cuda_stats {
    unsigned long long launches;   /* kernels and cuBLASLt products queued */
    unsigned long long host_waits; /* stream or event synchronizations the host made */
    unsigned long long bytes_in;   /* host to device */
    unsigned long long fallbacks;  /* products on a slower path (see mp_model_memory.fallbacks) */
    unsigned long long compute_32f; /* true float32 products on CUBLAS_COMPUTE_32F: the heuristic
                                       had no CUBLAS_COMPUTE_32F_PEDANTIC plan (not slower) */
} mp_cuda_stats;
void mp_cuda_get_stats(mp_cuda_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* MIXPREC_CUDA_H */
