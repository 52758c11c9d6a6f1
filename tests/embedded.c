/* embedded.c - mixprec on a bare-metal Cortex-M4: no stdio, no OS, a
   single-precision FPU. The build matrix compiles it for that target and
   checks that the object calls no double-precision soft-float routine (no
   float64 in the core: only mp_*_from_f64 take a double, and they read its
   bits). */
#define MIXPREC_NO_STDIO
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"

/* Store float32 weights in 16 bits, counting what narrowing did. */
mp_status weights_to_f16(mp_f16 *dst, const float *w, size_t n, mp_cast_stats *stats) {
    return mp_convert(dst, MP_FLOAT16, w, MP_FLOAT32, n, stats);
}

/* A dot product with float16 weights, accumulated in float32. */
float dot_f16(const mp_f16 *w, const float *x, size_t n) {
    float sum = 0.0f;
    size_t i;
    for (i = 0; i < n; i++) sum += mp_f16_to_f32(w[i]) * x[i];
    return sum;
}

mp_bf16 bf16_axpy(mp_bf16 a, mp_bf16 x, mp_bf16 y) { return mp_bf16_add(mp_bf16_mul(a, x), y); }
mp_f16 f16_from_double(double x) { return mp_f16_from_f64(x); }
