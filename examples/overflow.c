/* overflow.c - why mixed precision needs care, in numbers: the TensorFlow
   guide's float16 overflow (256 squared is Inf) and underflow (1e-5 squared
   is 0), what bfloat16 does instead, and how mp_convert's stats catch both
   in a whole tensor, before and after scaling it the way loss scaling does.

   Build and run: make demo */
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#include "summary.h"

#include <stdio.h>

static void square(const char *what, float x) {
    mp_f16 h = mp_f16_from_f32(x);
    mp_bf16 b = mp_bf16_from_f32(x);
    printf("  %-6s squared: float32 %-12g float16 %-12g bfloat16 %g\n", what, (double)(x * x),
           (double)mp_f16_to_f32(mp_f16_mul(h, h)), (double)mp_bf16_to_f32(mp_bf16_mul(b, b)));
}

static void show_stats(const char *what, const mp_cast_stats *s) {
    printf("  %-30s overflow=%llu underflow=%llu subnormal=%llu nan_in=%llu inf_in=%llu "
           "max_abs=%g min_abs=%g\n",
           what, (unsigned long long)s->overflow, (unsigned long long)s->underflow,
           (unsigned long long)s->subnormal, (unsigned long long)s->nan_in, (unsigned long long)s->inf_in,
           (double)s->max_abs, (double)s->min_abs);
}

/* Cast n float32 values to float16 and return what the cast saw. */
static mp_cast_stats cast_to_f16(const float *x, mp_f16 *out, size_t n) {
    mp_cast_stats s = {0, 0, 0, 0, 0, 0, 0.0f, 0.0f};
    mp_status st = mp_convert(out, MP_FLOAT16, x, MP_FLOAT32, n, &s);
    if (st != MP_OK) printf("  mp_convert: %s\n", mp_status_message(st));
    return s;
}

int main(void) {
    enum { N = 1000 };
    static float grads[N], scaled[N];
    static mp_f16 half[N];
    const float scale = 32768.0f; /* Keras's initial loss scale, 2^15 */
    mp_cast_stats s;
    uint64_t lost_unscaled;
    char repr[64];
    mp_policy policy;
    size_t i;

    printf("float16 holds 65504 at most and nothing nonzero below %g:\n",
           (double)mp_f16_to_f32(MP_F16_MIN_SUBNORMAL));
    square("256", 256.0f);   /* 65536 > 65504: Inf */
    square("1e-5", 1e-5f);   /* 1e-10 < 2^-24 / 2: 0 */
    printf("bfloat16 keeps float32's range, with 8 bits of precision instead of 11.\n\n");

    /* Gradients of a typical size late in training: 1e-9 .. 1e-6 */
    for (i = 0; i < N; i++) grads[i] = 1e-9f * (float)(1 + i);
    printf("A float32 tensor of %d small gradients cast to float16:\n", N);
    s = cast_to_f16(grads, half, N);
    show_stats("as they are:", &s);
    lost_unscaled = s.underflow;
    for (i = 0; i < N; i++) scaled[i] = grads[i] * scale;
    s = cast_to_f16(scaled, half, N);
    show_stats("scaled by 2^15 first:", &s);
    printf("Loss scaling multiplies the loss (so every gradient) by S before float16 sees it,\n"
           "and divides by S again in float32: no gradient underflows to zero.\n\n");

    if (mp_policy_from_name("mixed_float16", &policy) == MP_OK &&
        mp_policy_repr(policy, repr, sizeof repr) == MP_OK)
        printf("%s: compute %s, variables %s\n", repr, mp_dtype_name(policy.compute_dtype),
               mp_dtype_name(policy.variable_dtype));
    if (mp_policy_from_name("mixed_float32", &policy) != MP_OK)
        printf("'mixed_float32': %s\n", mp_status_message(MP_ERR_UNKNOWN_POLICY));
    ex_summary("overflow", "float16 stops at 65504 (256 squared is Inf) and 1e-5 squared is 0; of %d small "
               "gradients %llu underflowed as they were, %llu once scaled by 2^15",
               N, (unsigned long long)lost_unscaled, (unsigned long long)s.underflow);
    return 0;
}
