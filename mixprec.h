/* mixprec.h - Keras-style mixed precision for C: exact float16/bfloat16, fast
   bulk casts with overflow/underflow counts, dtype policies.
   Single-file (stb-style) library; MIT or public domain, see the end of file.

QUICK START
    In exactly one C or C++ file:

        #define MIXPREC_IMPLEMENTATION
        #include "mixprec.h"

    and plain `#include "mixprec.h"` everywhere else. Then:

        mp_f16 h = mp_f16_from_f32(256.0f);
        float  y = mp_f16_to_f32(mp_f16_mul(h, h));      // inf: 65536 > 65504

        mp_cast_stats st = {0};
        mp_convert(dst16, MP_FLOAT16, src32, MP_FLOAT32, n, &st);
        if (st.overflow || st.underflow) { ... }          // the data does not fit

        mp_policy p;
        mp_policy_from_name("mixed_float16", &p);          // compute f16, variables f32
        mp_set_global_policy(p);

    Link with -lm (mp_f16_sqrt/mp_bf16_sqrt use sqrtf).

CONFIGURATION (define before the #include that has MIXPREC_IMPLEMENTATION)
    MIXPREC_STATIC          make every function static to the including file
    MIXPREC_API             decoration of public functions (default extern)
    MIXPREC_MALLOC(sz)      allocator; define both MIXPREC_MALLOC and
    MIXPREC_FREE(p)         MIXPREC_FREE or neither (default malloc/free)
    MIXPREC_ASSERT(x)       internal invariants only, never user input (default assert)
    MIXPREC_NO_STDIO        no <stdio.h>: for bare-metal targets
    MIXPREC_NO_SIMD         portable C only, even where the compiler enables
                            F16C/AVX2; results are bit-identical either way

NUMERIC RULES (IEEE 754-2008; mixprec follows the x86 hardware where IEEE
leaves a choice, so that the scalar and SIMD paths agree bit for bit)
    - Narrowing (float32 -> float16/bfloat16, float64 -> either) rounds to
      nearest, ties to even, exactly once. Subnormals are produced and read,
      never flushed. Signed zeros and infinities are kept. float16 overflows to
      Inf from 65520 (the midpoint past 65504) up; bfloat16 from 0x7F7F8000.
    - NaN: float32 -> float16 gives sign | 0x7E00 | (fraction >> 13);
      float16 -> float32 quiets signalling NaNs (0x7C01 -> 0x7FC02000), as F16C
      vcvtph2ps does; float32 -> bfloat16 gives sign | 0x7FC0 | (fraction >> 16);
      bfloat16 -> float32 is exact (a shift). float16 <-> bfloat16 goes through
      float32, which is exact, so it too rounds once.
    - Conversions are integer-only: they do not depend on the FPU rounding
      mode, FTZ/DAZ or x87 excess precision.
    - Arithmetic (+ - * / sqrt) computes in float32 and rounds once; this is
      correctly rounded (see >>arithmetic for why). It uses the FPU, so it needs
      the IEEE default round-to-nearest mode; bfloat16 results below 2^-126 also
      need FTZ/DAZ off (float16 never reaches float32's subnormal range).
    - Comparisons are integer-only: NaN is unordered, -0 == +0.

GLOBAL STATE
    The global dtype policy (mp_set_global_policy), as in Keras. Nothing else.
    It is not synchronised: set it before starting threads.
*/
#ifndef MIXPREC_H
#define MIXPREC_H

#include <stddef.h>
#include <stdint.h>

#ifndef MIXPREC_API
#if defined(MIXPREC_STATIC) && (defined(__GNUC__) || defined(__clang__))
#define MIXPREC_API static __attribute__((unused))
#elif defined(MIXPREC_STATIC)
#define MIXPREC_API static
#else
#define MIXPREC_API extern
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* >>errors: one list makes the codes and their messages */
#define MP_STATUS_LIST(X)                                                          \
    X(MP_OK, "ok")                                                                 \
    X(MP_ERR_NULL, "a required pointer argument is NULL")                          \
    X(MP_ERR_DTYPE, "unsupported dtype: valid dtypes are float32, float16, bfloat16") \
    X(MP_ERR_UNKNOWN_DTYPE,                                                        \
      "unknown dtype name: valid names are 'float32', 'float16' and 'bfloat16'")   \
    X(MP_ERR_UNKNOWN_POLICY,                                                       \
      "cannot convert the name to a mixed precision policy: valid policies are "   \
      "'mixed_float16', 'mixed_bfloat16', and the name of any float dtype "        \
      "('float32', 'float16', 'bfloat16')")                                        \
    X(MP_ERR_INVALID_POLICY,                                                       \
      "invalid policy: the compute/variable dtype pair is not one of the named "   \
      "policies")                                                                  \
    X(MP_ERR_OVERLAP, "source and destination buffers overlap")                    \
    X(MP_ERR_ALIGN, "buffer is not aligned to its element size")                  \
    X(MP_ERR_SIZE, "size overflows size_t or does not fit the buffer")

typedef enum mp_status {
#define MP__STATUS_ENUM(code, msg) code,
    MP_STATUS_LIST(MP__STATUS_ENUM)
#undef MP__STATUS_ENUM
    MP_STATUS_COUNT
} mp_status;

/* A sentence that explains the status; never NULL. */
MIXPREC_API const char *mp_status_message(mp_status status);
/* The code's own name, e.g. "MP_ERR_NULL"; never NULL. */
MIXPREC_API const char *mp_status_name(mp_status status);

/* >>numbers: types, scalar conversions, arithmetic */
typedef struct mp_f16 { uint16_t bits; } mp_f16;   /* IEEE binary16 */
typedef struct mp_bf16 { uint16_t bits; } mp_bf16; /* bfloat16: float32's top half */

/* Wrap raw bits (what the named constants below expand to). */
static inline mp_f16 mp_f16_from_bits(uint16_t bits) { mp_f16 h; h.bits = bits; return h; }
static inline mp_bf16 mp_bf16_from_bits(uint16_t bits) { mp_bf16 h; h.bits = bits; return h; }

#define MP_F16_MAX           mp_f16_from_bits(0x7BFFu) /* 65504 */
#define MP_F16_MIN_NORMAL    mp_f16_from_bits(0x0400u) /* 2^-14 */
#define MP_F16_MIN_SUBNORMAL mp_f16_from_bits(0x0001u) /* 2^-24 */
#define MP_F16_EPSILON       mp_f16_from_bits(0x1400u) /* 2^-10, 1 ulp at 1.0 */
#define MP_F16_INF           mp_f16_from_bits(0x7C00u)
#define MP_F16_NAN           mp_f16_from_bits(0x7E00u) /* the default quiet NaN */
#define MP_BF16_MAX           mp_bf16_from_bits(0x7F7Fu) /* ~3.39e38 */
#define MP_BF16_MIN_NORMAL    mp_bf16_from_bits(0x0080u) /* 2^-126 */
#define MP_BF16_MIN_SUBNORMAL mp_bf16_from_bits(0x0001u) /* 2^-133 */
#define MP_BF16_EPSILON       mp_bf16_from_bits(0x3C00u) /* 2^-7 */
#define MP_BF16_INF           mp_bf16_from_bits(0x7F80u)
#define MP_BF16_NAN           mp_bf16_from_bits(0x7FC0u)

MIXPREC_API mp_f16 mp_f16_from_f32(float x);
MIXPREC_API float mp_f16_to_f32(mp_f16 h);
MIXPREC_API mp_bf16 mp_bf16_from_f32(float x);
MIXPREC_API float mp_bf16_to_f32(mp_bf16 h);
/* From double, rounding once (no double rounding through float32). */
MIXPREC_API mp_f16 mp_f16_from_f64(double x);
MIXPREC_API mp_bf16 mp_bf16_from_f64(double x);

MIXPREC_API mp_f16 mp_f16_add(mp_f16 a, mp_f16 b);
MIXPREC_API mp_f16 mp_f16_sub(mp_f16 a, mp_f16 b);
MIXPREC_API mp_f16 mp_f16_mul(mp_f16 a, mp_f16 b);
MIXPREC_API mp_f16 mp_f16_div(mp_f16 a, mp_f16 b);
MIXPREC_API mp_f16 mp_f16_sqrt(mp_f16 a);
MIXPREC_API mp_f16 mp_f16_neg(mp_f16 a);
MIXPREC_API mp_f16 mp_f16_abs(mp_f16 a);
MIXPREC_API int mp_f16_eq(mp_f16 a, mp_f16 b);
MIXPREC_API int mp_f16_lt(mp_f16 a, mp_f16 b);
MIXPREC_API int mp_f16_le(mp_f16 a, mp_f16 b);
MIXPREC_API int mp_f16_gt(mp_f16 a, mp_f16 b);
MIXPREC_API int mp_f16_ge(mp_f16 a, mp_f16 b);
MIXPREC_API int mp_f16_isnan(mp_f16 a);
MIXPREC_API int mp_f16_isinf(mp_f16 a);
MIXPREC_API int mp_f16_isfinite(mp_f16 a);

MIXPREC_API mp_bf16 mp_bf16_add(mp_bf16 a, mp_bf16 b);
MIXPREC_API mp_bf16 mp_bf16_sub(mp_bf16 a, mp_bf16 b);
MIXPREC_API mp_bf16 mp_bf16_mul(mp_bf16 a, mp_bf16 b);
MIXPREC_API mp_bf16 mp_bf16_div(mp_bf16 a, mp_bf16 b);
MIXPREC_API mp_bf16 mp_bf16_sqrt(mp_bf16 a);
MIXPREC_API mp_bf16 mp_bf16_neg(mp_bf16 a);
MIXPREC_API mp_bf16 mp_bf16_abs(mp_bf16 a);
MIXPREC_API int mp_bf16_eq(mp_bf16 a, mp_bf16 b);
MIXPREC_API int mp_bf16_lt(mp_bf16 a, mp_bf16 b);
MIXPREC_API int mp_bf16_le(mp_bf16 a, mp_bf16 b);
MIXPREC_API int mp_bf16_gt(mp_bf16 a, mp_bf16 b);
MIXPREC_API int mp_bf16_ge(mp_bf16 a, mp_bf16 b);
MIXPREC_API int mp_bf16_isnan(mp_bf16 a);
MIXPREC_API int mp_bf16_isinf(mp_bf16 a);
MIXPREC_API int mp_bf16_isfinite(mp_bf16 a);

/* >>dtypes */
typedef enum mp_dtype {
    MP_FLOAT32 = 0,
    MP_FLOAT16,
    MP_BFLOAT16,
    MP_DTYPE_COUNT
} mp_dtype;

MIXPREC_API const char *mp_dtype_name(mp_dtype dtype);  /* "float16"; NULL if invalid */
MIXPREC_API size_t mp_dtype_size(mp_dtype dtype);       /* bytes; 0 if invalid */
MIXPREC_API mp_status mp_dtype_from_name(const char *name, mp_dtype *out);

/* >>bulk casts
   mp_convert casts n elements between any two of float32, float16 and
   bfloat16 (same-type is a copy). dst and src must not overlap, except that
   dst == src is allowed when both dtypes have the same size. stats may be
   NULL; otherwise the cast ADDS to it (zero it first), so one mp_cast_stats
   can watch many tensors. On error nothing is written. */
typedef struct mp_cast_stats {
    uint64_t count;     /* elements converted */
    uint64_t nan_in;    /* NaN inputs (they stay NaN) */
    uint64_t inf_in;    /* infinite inputs (they stay infinite) */
    uint64_t overflow;  /* finite inputs that became Inf */
    uint64_t underflow; /* nonzero inputs that became zero */
    uint64_t subnormal; /* nonzero results in the subnormal range */
    float max_abs;      /* largest finite nonzero |input|; 0 if none */
    float min_abs;      /* smallest finite nonzero |input|; 0 if none */
} mp_cast_stats;

MIXPREC_API mp_status mp_convert(void *dst, mp_dtype dst_type, const void *src,
                                 mp_dtype src_type, size_t n, mp_cast_stats *stats);
/* The same with the portable C path only, never SIMD: for tests and benchmarks
   that compare the two in one binary. Results are identical. */
MIXPREC_API mp_status mp_convert_portable(void *dst, mp_dtype dst_type, const void *src,
                                          mp_dtype src_type, size_t n, mp_cast_stats *stats);

/* >>policies (Keras mixed_precision.Policy)
   "float32", "float16", "bfloat16": that dtype for compute and variables.
   "mixed_float16" / "mixed_bfloat16": compute in 16 bits, variables float32. */
typedef struct mp_policy {
    mp_dtype compute_dtype;  /* what layers compute and output in */
    mp_dtype variable_dtype; /* what layers store their weights in */
} mp_policy;

MIXPREC_API mp_status mp_policy_from_name(const char *name, mp_policy *out);
MIXPREC_API const char *mp_policy_name(mp_policy policy); /* NULL if invalid */
MIXPREC_API mp_dtype mp_policy_compute_dtype(mp_policy policy);
MIXPREC_API mp_dtype mp_policy_variable_dtype(mp_policy policy);
/* Writes Keras's repr, `<Policy "mixed_float16">`, NUL-terminated. */
MIXPREC_API mp_status mp_policy_repr(mp_policy policy, char *buf, size_t size);
/* The global policy (default float32) that new layers take. */
MIXPREC_API mp_status mp_set_global_policy(mp_policy policy);
MIXPREC_API mp_status mp_set_global_policy_name(const char *name);
MIXPREC_API mp_policy mp_global_policy(void);

#ifdef __cplusplus
}
#endif
#endif /* MIXPREC_H */

/* ======================================================================== */
#ifdef MIXPREC_IMPLEMENTATION
#ifndef MIXPREC_IMPLEMENTATION_DONE
#define MIXPREC_IMPLEMENTATION_DONE

#if defined(MIXPREC_MALLOC) != defined(MIXPREC_FREE)
#error "mixprec: define both MIXPREC_MALLOC and MIXPREC_FREE, or neither"
#endif
#ifndef MIXPREC_MALLOC
#include <stdlib.h>
#define MIXPREC_MALLOC(sz) malloc(sz)
#define MIXPREC_FREE(p) free(p)
#endif
#ifndef MIXPREC_ASSERT
#include <assert.h>
#define MIXPREC_ASSERT(x) assert(x)
#endif
#include <string.h>
#include <math.h>

#if !defined(MIXPREC_NO_SIMD) && defined(__F16C__) && defined(__AVX2__)
#define MP__SIMD_X86 1
#include <immintrin.h>
#endif
#if defined(__GNUC__) || defined(__clang__)
#define MP__HOT static inline __attribute__((always_inline)) /* inner-loop helpers */
#else
#define MP__HOT static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* >>errors */
MIXPREC_API const char *mp_status_message(mp_status status) {
    static const char *const messages[] = {
#define MP__STATUS_MESSAGE(code, msg) msg,
        MP_STATUS_LIST(MP__STATUS_MESSAGE)
#undef MP__STATUS_MESSAGE
    };
    if ((unsigned)status >= (unsigned)MP_STATUS_COUNT) return "unknown status code";
    return messages[status];
}

MIXPREC_API const char *mp_status_name(mp_status status) {
    static const char *const names[] = {
#define MP__STATUS_NAME(code, msg) #code,
        MP_STATUS_LIST(MP__STATUS_NAME)
#undef MP__STATUS_NAME
    };
    if ((unsigned)status >= (unsigned)MP_STATUS_COUNT) return "MP_STATUS_UNKNOWN";
    return names[status];
}

/* >>conversion
   Every conversion is "widen exactly to float32 bits, then round once". All of
   it is integer code written branch-free (selects, not jumps) so that compilers
   vectorise the portable bulk loops. */

static uint32_t mp__f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float mp__f32_from_bits(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

/* float32 -> float16, round to nearest even (IEEE 754 4.3.1). */
static uint16_t mp__f16_from_f32_bits(uint32_t x) {
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7FFFFFFFu;
    /* NaN: quiet bit forced, top 9 payload bits kept (as vcvtps2ph does). */
    uint32_t nan = 0x7E00u | ((a >> 13) & 0x3FFu);
    /* Normal result (|x| >= 2^-14): rebias 127 -> 15 (subtract 112 << 23), then
       add half an ulp minus one plus the kept lsb: ties go to even. A carry
       out of the fraction correctly bumps the exponent. */
    uint32_t normal = (a - 0x38000000u + 0xFFFu + ((a >> 13) & 1u)) >> 13;
    /* Subnormal result: |x| / 2^-24 = m >> (126 - e), rounded the same way.
       Clamp the shift to [14, 31] so it stays defined for lanes not selected
       (shifts past 24 give 0: inputs below 2^-25 round to zero). */
    uint32_t e = a >> 23;
    uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = e > 112u ? 14u : e < 95u ? 31u : 126u - e;
    uint32_t sub = (m + (1u << (shift - 1u)) - 1u + ((m >> shift) & 1u)) >> shift;
    /* Select with masks rather than ?: so that compilers if-convert the loop. */
    uint32_t is_nan = 0u - (uint32_t)(a > 0x7F800000u);
    uint32_t is_inf = 0u - (uint32_t)(a >= 0x477FF000u);  /* 65520 and up, Inf, NaN */
    uint32_t is_normal = 0u - (uint32_t)(a >= 0x38800000u);
    uint32_t r = (sub & ~is_normal) | (normal & is_normal & ~is_inf) | (0x7C00u & is_inf & ~is_nan) | (nan & is_nan);
    return (uint16_t)(sign | r);
}

/* float16 -> float32, exact; signalling NaNs are quieted (as vcvtph2ps). */
static uint32_t mp__f32_bits_from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t a = h & 0x7FFFu;
    uint32_t special = 0x7F800000u | (a & 0x3FFu) << 13 | (a > 0x7C00u ? 0x400000u : 0u);
    uint32_t normal = (a << 13) + 0x38000000u; /* rebias 15 -> 127 */
    /* Subnormal a * 2^-24: shift the top set bit up to bit 10 (k steps, a
       binary search with selects), which makes it the implicit bit. */
    uint32_t m = a, k = 0, s;
    s = m < 0x8u ? 8u : 0u;   m <<= s; k += s;
    s = m < 0x80u ? 4u : 0u;  m <<= s; k += s;
    s = m < 0x200u ? 2u : 0u; m <<= s; k += s;
    s = m < 0x400u ? 1u : 0u; m <<= s; k += s;
    uint32_t sub = (113u - k) << 23 | (m & 0x3FFu) << 13; /* 2^(10-k-24), biased */
    return sign | (a >= 0x7C00u ? special : a >= 0x400u ? normal : a ? sub : 0u);
}

/* float32 -> bfloat16, round to nearest even; NaN: sign|0x7FC0|(fraction>>16). */
static uint16_t mp__bf16_from_f32_bits(uint32_t x) {
    uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
    uint32_t nan = (x >> 16) | 0x0040u;
    return (uint16_t)((x & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

static uint32_t mp__f32_bits_from_bf16(uint16_t h) { return (uint32_t)h << 16; }

/* float64 -> float32 rounded to odd: truncate, then set the lsb if anything
   nonzero was dropped. Rounding to odd with at least two spare bits and then
   to nearest even gives the once-rounded result (Boldo & Melquiond, 2008);
   float32 keeps 13 spare bits over float16 and 16 over bfloat16, in the
   subnormal range too. Values past float32's range overflow both targets. */
static uint32_t mp__f32_bits_from_f64_round_to_odd(uint64_t x) {
    uint32_t sign = (uint32_t)(x >> 32) & 0x80000000u;
    uint64_t a = x & 0x7FFFFFFFFFFFFFFFull;
    uint64_t frac = a & 0xFFFFFFFFFFFFFull;
    uint32_t e = (uint32_t)(a >> 52);
    if (e == 0x7FFu) return sign | 0x7F800000u | (frac ? 0x400000u | (uint32_t)(frac >> 29) : 0u);
    if (e >= 1023u + 128u) return sign | 0x7F800000u;
    if (e > 1023u - 127u) { /* float32 normal: rebias 1023 -> 127 */
        uint32_t kept = (e - 896u) << 23 | (uint32_t)(frac >> 29);
        return sign | kept | ((frac & 0x1FFFFFFFu) != 0);
    }
    {   /* float32 subnormal: a / 2^-149 = m >> (926 - e) */
        uint64_t m = frac | (e ? 1ull << 52 : 0u);
        uint32_t shift = 926u - (e ? e : 1u);
        if (shift > 63u) return sign | (a != 0);
        return sign | (uint32_t)(m >> shift) | ((m & ((1ull << shift) - 1u)) != 0);
    }
}

static uint64_t mp__f64_bits(double x) { uint64_t u; memcpy(&u, &x, 8); return u; }

MIXPREC_API mp_f16 mp_f16_from_f32(float x) { return mp_f16_from_bits(mp__f16_from_f32_bits(mp__f32_bits(x))); }
MIXPREC_API float mp_f16_to_f32(mp_f16 h) { return mp__f32_from_bits(mp__f32_bits_from_f16(h.bits)); }
MIXPREC_API mp_bf16 mp_bf16_from_f32(float x) { return mp_bf16_from_bits(mp__bf16_from_f32_bits(mp__f32_bits(x))); }
MIXPREC_API float mp_bf16_to_f32(mp_bf16 h) { return mp__f32_from_bits(mp__f32_bits_from_bf16(h.bits)); }
MIXPREC_API mp_f16 mp_f16_from_f64(double x) {
    return mp_f16_from_bits(mp__f16_from_f32_bits(mp__f32_bits_from_f64_round_to_odd(mp__f64_bits(x))));
}
MIXPREC_API mp_bf16 mp_bf16_from_f64(double x) {
    return mp_bf16_from_bits(mp__bf16_from_f32_bits(mp__f32_bits_from_f64_round_to_odd(mp__f64_bits(x))));
}

/* >>arithmetic
   Why float32-then-round-once is exact: for +, -, *, / and sqrt, if the
   intermediate format has p' >= 2p + 2 significand bits, rounding the exact
   result to p' bits and then to p bits equals rounding it to p bits directly
   (Figueroa, "When is double rounding innocuous?", 1995). float32 has p' = 24;
   float16 has p = 11 (2p+2 = 24) and bfloat16 p = 8 (18). Exponent ranges: no
   float16 operation reaches float32's subnormal range, and below 2^-126 a
   bfloat16 result sits on a grid 2^16 times coarser than float32's, which
   sums round exactly onto and products and quotients cannot approach a
   bfloat16 midpoint within float32's rounding error. tests/test_numerics.c checks
   add and mul on all 2^32 float16 pairs. Fused multiply-add is NOT covered
   by the theorem, which is why there is none here. */
#define MP__ARITH(T, OP, EXPR)                                                    \
    MIXPREC_API T T##_##OP(T a, T b) {                                            \
        float x = T##_to_f32(a), y = T##_to_f32(b);                               \
        return T##_from_f32(EXPR);                                                \
    }
MP__ARITH(mp_f16, add, x + y)
MP__ARITH(mp_f16, sub, x - y)
MP__ARITH(mp_f16, mul, x * y)
MP__ARITH(mp_f16, div, x / y)
MP__ARITH(mp_bf16, add, x + y)
MP__ARITH(mp_bf16, sub, x - y)
MP__ARITH(mp_bf16, mul, x * y)
MP__ARITH(mp_bf16, div, x / y)
#undef MP__ARITH
MIXPREC_API mp_f16 mp_f16_sqrt(mp_f16 a) { return mp_f16_from_f32(sqrtf(mp_f16_to_f32(a))); }
MIXPREC_API mp_bf16 mp_bf16_sqrt(mp_bf16 a) { return mp_bf16_from_f32(sqrtf(mp_bf16_to_f32(a))); }

/* Sign, magnitude and ordering are bit operations (IEEE 754 5.5.1, 5.11), the
   same for both formats but for where Inf sits. */
static int mp__h_isnan(uint16_t h, uint16_t inf) { return (h & 0x7FFFu) > inf; }
static int mp__h_key(uint16_t h) { return (h & 0x8000u) ? -(int)(h & 0x7FFFu) : (int)(h & 0x7FFFu); }
static int mp__h_unordered(uint16_t a, uint16_t b, uint16_t inf) { return mp__h_isnan(a, inf) || mp__h_isnan(b, inf); }
static int mp__h_eq(uint16_t a, uint16_t b, uint16_t inf) { return !mp__h_unordered(a, b, inf) && mp__h_key(a) == mp__h_key(b); }
static int mp__h_lt(uint16_t a, uint16_t b, uint16_t inf) { return !mp__h_unordered(a, b, inf) && mp__h_key(a) < mp__h_key(b); }
static int mp__h_le(uint16_t a, uint16_t b, uint16_t inf) { return !mp__h_unordered(a, b, inf) && mp__h_key(a) <= mp__h_key(b); }

#define MP__BITOPS(T, INF)                                                                    \
    MIXPREC_API T T##_neg(T a) { return T##_from_bits((uint16_t)(a.bits ^ 0x8000u)); }         \
    MIXPREC_API T T##_abs(T a) { return T##_from_bits((uint16_t)(a.bits & 0x7FFFu)); }         \
    MIXPREC_API int T##_eq(T a, T b) { return mp__h_eq(a.bits, b.bits, INF); }                 \
    MIXPREC_API int T##_lt(T a, T b) { return mp__h_lt(a.bits, b.bits, INF); }                 \
    MIXPREC_API int T##_le(T a, T b) { return mp__h_le(a.bits, b.bits, INF); }                 \
    MIXPREC_API int T##_gt(T a, T b) { return mp__h_lt(b.bits, a.bits, INF); }                 \
    MIXPREC_API int T##_ge(T a, T b) { return mp__h_le(b.bits, a.bits, INF); }                 \
    MIXPREC_API int T##_isnan(T a) { return mp__h_isnan(a.bits, INF); }                        \
    MIXPREC_API int T##_isinf(T a) { return (a.bits & 0x7FFFu) == INF; }                       \
    MIXPREC_API int T##_isfinite(T a) { return (a.bits & 0x7FFFu) < INF; }
MP__BITOPS(mp_f16, 0x7C00u)
MP__BITOPS(mp_bf16, 0x7F80u)
#undef MP__BITOPS

/* >>dtypes */
static const struct { const char *name; size_t size; } mp__dtypes[MP_DTYPE_COUNT] = {
    {"float32", 4}, {"float16", 2}, {"bfloat16", 2}};

static int mp__dtype_valid(mp_dtype t) { return (unsigned)t < (unsigned)MP_DTYPE_COUNT; }

MIXPREC_API const char *mp_dtype_name(mp_dtype t) { return mp__dtype_valid(t) ? mp__dtypes[t].name : NULL; }
MIXPREC_API size_t mp_dtype_size(mp_dtype t) { return mp__dtype_valid(t) ? mp__dtypes[t].size : 0; }

MIXPREC_API mp_status mp_dtype_from_name(const char *name, mp_dtype *out) {
    int t;
    if (!name || !out) return MP_ERR_NULL;
    for (t = 0; t < MP_DTYPE_COUNT; t++)
        if (strcmp(name, mp__dtypes[t].name) == 0) { *out = (mp_dtype)t; return MP_OK; }
    return MP_ERR_UNKNOWN_DTYPE;
}

/* >>bulk casts
   Every row goes through float32 lanes: widen the source exactly, narrow
   once. mp_convert works in blocks that stay in L1, so the optional stats
   and the cast read the source from memory once. */
#define MP__BLOCK 2048
#define MP__F32_INF 0x7F800000u

/* >>cast stats
   Round to nearest is monotone, so what narrowing does to x depends only on
   where |x| falls among three thresholds of the target format. As float32
   bit patterns (which order like magnitudes), with lo inclusive:
       [1, sub_lo)               underflow: nonzero rounds to zero
       [sub_lo, normal_lo)       a subnormal result
       [inf_lo, Inf)             overflow: finite rounds to Inf
   So the stats need only the source, widened exactly to float32; the
   results are never re-read. tests/test_numerics.c checks the counts against
   the actual results of all 2^32 float32 inputs. */
typedef struct mp__ranges { uint32_t sub_lo, normal_lo, inf_lo; } mp__ranges;
static const mp__ranges mp__ranges_of[MP_DTYPE_COUNT] = {
    /* sub_lo: just above half the smallest subnormal (the tie goes to 0);
       normal_lo: the smallest normal less half an ulp (the tie goes up);
       inf_lo: the largest finite plus half an ulp (the tie goes to Inf) */
    {0x00000001u, 0x00800000u, 0x7F800000u},  /* float32: nothing narrows */
    {0x33000001u, 0x387FE000u, 0x477FF000u},  /* float16: 2^-25, 2^-14 - 2^-25, 65520 */
    {0x00008001u, 0x007F8000u, 0x7F7F8000u}}; /* bfloat16: 2^-134, 2^-126 - 2^-134, ~3.39e38 */

typedef struct mp__scan {
    uint32_t nan, inf, underflow, subnormal, overflow, max_abs, min_abs; /* magnitudes: float32 bits */
} mp__scan;

/* A row casts n elements and, if scan is not NULL, classifies the source. */
typedef void (*mp__row_fn)(void *dst, const void *src, size_t n, mp__scan *scan, mp__ranges r);

static uint32_t mp__load_f32(const void *p, size_t i) { return mp__f32_bits(((const float *)p)[i]); }
static uint32_t mp__load_f16(const void *p, size_t i) { return mp__f32_bits_from_f16(((const mp_f16 *)p)[i].bits); }
static uint32_t mp__load_bf16(const void *p, size_t i) { return mp__f32_bits_from_bf16(((const mp_bf16 *)p)[i].bits); }
static void mp__store_f32(void *p, size_t i, uint32_t u) { ((float *)p)[i] = mp__f32_from_bits(u); }
static void mp__store_f16(void *p, size_t i, uint32_t u) { ((mp_f16 *)p)[i].bits = mp__f16_from_f32_bits(u); }
static void mp__store_bf16(void *p, size_t i, uint32_t u) { ((mp_bf16 *)p)[i].bits = mp__bf16_from_f32_bits(u); }
typedef float mp__elem_f32;
typedef mp_f16 mp__elem_f16;
typedef mp_bf16 mp__elem_bf16;

static uint32_t mp__in(uint32_t a, uint32_t lo, uint32_t hi) { return a - lo < hi - lo; } /* lo <= a < hi */

/* The portable scan: local accumulators and mask selects, which compilers
   vectorise. */
#define MP__PORTABLE_SCAN(SRC)                                                               \
    static mp__scan mp__scan_##SRC(const void *src, size_t n, mp__ranges r) {               \
        uint32_t nan = 0, inf = 0, under = 0, sub = 0, over = 0, hi = 0, lo = 0xFFFFFFFFu;   \
        size_t i;                                                                            \
        mp__scan s;                                                                          \
        for (i = 0; i < n; i++) {                                                            \
            uint32_t a = mp__load_##SRC(src, i) & 0x7FFFFFFFu;                               \
            uint32_t finite_nonzero = 0u - mp__in(a, 1u, MP__F32_INF); /* all ones */        \
            nan += a > MP__F32_INF;                                                          \
            inf += a == MP__F32_INF;                                                         \
            under += mp__in(a, 1u, r.sub_lo);                                                \
            sub += mp__in(a, r.sub_lo, r.normal_lo);                                         \
            over += mp__in(a, r.inf_lo, MP__F32_INF);                                        \
            hi = (a & finite_nonzero) > hi ? a & finite_nonzero : hi;                        \
            lo = (a | ~finite_nonzero) < lo ? a | ~finite_nonzero : lo;                      \
        }                                                                                    \
        s.nan = nan, s.inf = inf, s.underflow = under, s.subnormal = sub, s.overflow = over;  \
        s.max_abs = hi, s.min_abs = lo;                                                      \
        return s;                                                                            \
    }
MP__PORTABLE_SCAN(f32)
MP__PORTABLE_SCAN(f16)
MP__PORTABLE_SCAN(bf16)
#undef MP__PORTABLE_SCAN

/* Portable rows: classify first (dst may be src), then cast. A cast to the
   same dtype is a copy, as in Keras: signalling NaNs pass unchanged. */
#define MP__PORTABLE_ROW(SRC, DST)                                                           \
    static void mp__row_##SRC##_to_##DST(void *dst, const void *src, size_t n, mp__scan *scan, \
                                         mp__ranges r) {                                     \
        size_t i;                                                                            \
        if (scan) *scan = mp__scan_##SRC(src, n, r);                                         \
        for (i = 0; i < n; i++) mp__store_##DST(dst, i, mp__load_##SRC(src, i));             \
    }
#define MP__COPY_ROW(T)                                                                      \
    static void mp__row_##T##_to_##T(void *dst, const void *src, size_t n, mp__scan *scan,   \
                                     mp__ranges r) {                                         \
        if (scan) *scan = mp__scan_##T(src, n, r);                                           \
        memmove(dst, src, n * sizeof(mp__elem_##T));                                         \
    }
MP__COPY_ROW(f32)
MP__COPY_ROW(f16)
MP__COPY_ROW(bf16)
MP__PORTABLE_ROW(f32, f16)
MP__PORTABLE_ROW(f32, bf16)
MP__PORTABLE_ROW(f16, f32)
MP__PORTABLE_ROW(f16, bf16)
MP__PORTABLE_ROW(bf16, f32)
MP__PORTABLE_ROW(bf16, f16)
#undef MP__PORTABLE_ROW
#undef MP__COPY_ROW

/* [dst][src], in mp_dtype order: float32, float16, bfloat16 */
static const mp__row_fn mp__portable_rows[MP_DTYPE_COUNT][MP_DTYPE_COUNT] = {
    {mp__row_f32_to_f32, mp__row_f16_to_f32, mp__row_bf16_to_f32},
    {mp__row_f32_to_f16, mp__row_f16_to_f16, mp__row_bf16_to_f16},
    {mp__row_f32_to_bf16, mp__row_f16_to_bf16, mp__row_bf16_to_bf16}};

#ifdef MP__SIMD_X86
/* Eight float32 lanes at a time. vcvtps2ph with an explicit rounding
   immediate ignores MXCSR; its NaN and subnormal results are exactly the
   scalar ones (tests/test_numerics.c checks all 2^32 inputs). bfloat16
   narrowing is the scalar integer formula in AVX2: vcvtneps2bf16 is never
   used, because it flushes subnormal inputs to zero. */
MP__HOT __m256 mp__x86_load_f32(const void *p, size_t i) { return _mm256_loadu_ps((const float *)p + i); }
MP__HOT __m256 mp__x86_load_f16(const void *p, size_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const mp_f16 *)p + i)));
}
MP__HOT __m256 mp__x86_load_bf16(const void *p, size_t i) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const mp_bf16 *)p + i)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
MP__HOT void mp__x86_store_f32(void *p, size_t i, __m256 v) { _mm256_storeu_ps((float *)p + i, v); }
MP__HOT void mp__x86_store_f16(void *p, size_t i, __m256 v) {
    _mm_storeu_si128((__m128i *)((mp_f16 *)p + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
MP__HOT void mp__x86_store_bf16(void *p, size_t i, __m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                                        _mm256_set1_epi32((int)MP__F32_INF));
    __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan); /* every lane <= 0xFFFF */
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128((__m128i *)((mp_bf16 *)p + i), packed);
}

/* Stats on eight lanes. The cast loop itself tracks only the extremes of
   |x| (four operations per vector, hidden under the memory traffic). If
   they show nothing below normal_lo and nothing at or above inf_lo, no lane
   can have underflowed, gone subnormal, overflowed or been Inf or NaN, and
   the counts are all zero: the common case for real tensors. Otherwise the
   block, still in L1, gets a full classification pass. */
MP__HOT __m256i mp__x86_abs_bits(__m256 x) {
    return _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7FFFFFFF));
}

/* Extremes of |x| in two registers: hi = max |x|, lo = min |x| - 1, where
   zeros wrap to the top and drop out. Plain locals, not a struct or a
   pointer: either one sends them to memory on every iteration. */
#define MP__X86_EXTREMES(hi, lo, a)                                                             \
    (hi = _mm256_max_epu32(hi, a), lo = _mm256_min_epu32(lo, _mm256_add_epi32(a, _mm256_set1_epi32(-1))))

/* Horizontal sum, max and min of eight lanes: fold 256 -> 128 -> 64 -> 32 bits. */
#define MP__X86_HORIZONTAL(NAME, OP)                                                          \
    static uint32_t NAME(__m256i v) {                                                         \
        __m128i x = OP(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));            \
        x = OP(x, _mm_shuffle_epi32(x, 0x4E));                                                \
        return (uint32_t)_mm_cvtsi128_si32(OP(x, _mm_shuffle_epi32(x, 0xB1)));                \
    }
MP__X86_HORIZONTAL(mp__x86_hsum, _mm_add_epi32)
MP__X86_HORIZONTAL(mp__x86_hmax, _mm_max_epu32)
MP__X86_HORIZONTAL(mp__x86_hmin, _mm_min_epu32)
#undef MP__X86_HORIZONTAL

/* The full pass: one compare per threshold t counts the lanes with |x| >= t
   (masks are -1, so subtracting counts); differences of adjacent counts give
   the ranges. Magnitudes are below 2^31, so AVX2's signed compares order
   them. The six counts are written out: a loop over them keeps the counters
   in memory at -O2. */
#define MP__X86_SCAN(SRC)                                                                     \
    static mp__scan mp__x86_scan_##SRC(const void *src, size_t n, mp__ranges r) {             \
        const __m256i t0 = _mm256_set1_epi32(0), t1 = _mm256_set1_epi32((int)r.sub_lo - 1),   \
                      t2 = _mm256_set1_epi32((int)r.normal_lo - 1),                           \
                      t3 = _mm256_set1_epi32((int)r.inf_lo - 1),                              \
                      t4 = _mm256_set1_epi32((int)MP__F32_INF - 1),                           \
                      t5 = _mm256_set1_epi32((int)MP__F32_INF);                               \
        __m256i c0 = t0, c1 = t0, c2 = t0, c3 = t0, c4 = t0, c5 = t0;                         \
        __m256i hi = t0, lo = _mm256_set1_epi32(-1);                                          \
        mp__scan s, tail;                                                                     \
        size_t i = 0;                                                                         \
        for (; i + 8 <= n; i += 8) {                                                          \
            __m256i a = mp__x86_abs_bits(mp__x86_load_##SRC(src, i));                         \
            __m256i finite = _mm256_cmpgt_epi32(t5, a);                                       \
            c0 = _mm256_sub_epi32(c0, _mm256_cmpgt_epi32(a, t0));                             \
            c1 = _mm256_sub_epi32(c1, _mm256_cmpgt_epi32(a, t1));                             \
            c2 = _mm256_sub_epi32(c2, _mm256_cmpgt_epi32(a, t2));                             \
            c3 = _mm256_sub_epi32(c3, _mm256_cmpgt_epi32(a, t3));                             \
            c4 = _mm256_sub_epi32(c4, _mm256_cmpgt_epi32(a, t4));                             \
            c5 = _mm256_sub_epi32(c5, _mm256_cmpgt_epi32(a, t5));                             \
            MP__X86_EXTREMES(hi, lo, _mm256_and_si256(a, finite)); /* Inf, NaN -> 0 */       \
        }                                                                                     \
        tail = mp__scan_##SRC((const mp__elem_##SRC *)src + i, n - i, r);                     \
        s.underflow = mp__x86_hsum(c0) - mp__x86_hsum(c1) + tail.underflow;                   \
        s.subnormal = mp__x86_hsum(c1) - mp__x86_hsum(c2) + tail.subnormal;                   \
        s.overflow = mp__x86_hsum(c3) - mp__x86_hsum(c4) + tail.overflow;                     \
        s.inf = mp__x86_hsum(c4) - mp__x86_hsum(c5) + tail.inf;                               \
        s.nan = mp__x86_hsum(c5) + tail.nan;                                                  \
        mp__x86_extremes_finish(&s, hi, lo, &tail);                                           \
        return s;                                                                             \
    }

static void mp__x86_extremes_finish(mp__scan *s, __m256i hi_v, __m256i lo_minus_1_v, const mp__scan *tail) {
    uint32_t hi = mp__x86_hmax(hi_v), lo = mp__x86_hmin(lo_minus_1_v) + 1u; /* 0: no nonzero lane */
    s->max_abs = hi > tail->max_abs ? hi : tail->max_abs;
    s->min_abs = lo && lo < tail->min_abs ? lo : tail->min_abs;
}

MP__X86_SCAN(f32)
MP__X86_SCAN(f16)
MP__X86_SCAN(bf16)
#undef MP__X86_SCAN

/* In place (dst == src, same element size) the source is gone after the
   cast, so it is classified first. */
#define MP__X86_ROW(SRC, DST)                                                                 \
    static void mp__x86_row_##SRC##_to_##DST(void *dst, const void *src, size_t n, mp__scan *scan, \
                                             mp__ranges r) {                                  \
        size_t i = 0, rest;                                                                   \
        if (scan && dst == src) *scan = mp__x86_scan_##SRC(src, n, r), scan = NULL;            \
        if (scan) {                                                                           \
            __m256i hi = _mm256_setzero_si256(), lo = _mm256_set1_epi32(-1);                  \
            mp__scan tail;                                                                    \
            for (; i + 16 <= n; i += 16) {                                                    \
                __m256 a = mp__x86_load_##SRC(src, i), b = mp__x86_load_##SRC(src, i + 8);     \
                MP__X86_EXTREMES(hi, lo, mp__x86_abs_bits(a));                                \
                MP__X86_EXTREMES(hi, lo, mp__x86_abs_bits(b));                                \
                mp__x86_store_##DST(dst, i, a);                                               \
                mp__x86_store_##DST(dst, i + 8, b);                                           \
            }                                                                                 \
            tail = mp__scan_##SRC((const mp__elem_##SRC *)src + i, n - i, r);                 \
            *scan = tail; /* the vectors' counts are zero unless their extremes say */        \
            mp__x86_extremes_finish(scan, hi, lo, &tail);                                     \
            if (scan->max_abs >= r.inf_lo || (scan->min_abs && scan->min_abs < r.normal_lo))  \
                *scan = mp__x86_scan_##SRC(src, n, r);                                        \
        } else {                                                                              \
            for (; i + 16 <= n; i += 16) {                                                    \
                __m256 a = mp__x86_load_##SRC(src, i), b = mp__x86_load_##SRC(src, i + 8);     \
                mp__x86_store_##DST(dst, i, a);                                               \
                mp__x86_store_##DST(dst, i + 8, b);                                           \
            }                                                                                 \
        }                                                                                     \
        for (rest = i; rest < n; rest++) mp__store_##DST(dst, rest, mp__load_##SRC(src, rest)); \
    }
MP__X86_ROW(f32, f16)
MP__X86_ROW(f32, bf16)
MP__X86_ROW(f16, f32)
MP__X86_ROW(f16, bf16)
MP__X86_ROW(bf16, f32)
MP__X86_ROW(bf16, f16)
#undef MP__X86_ROW

static const mp__row_fn mp__rows[MP_DTYPE_COUNT][MP_DTYPE_COUNT] = {
    {mp__row_f32_to_f32, mp__x86_row_f16_to_f32, mp__x86_row_bf16_to_f32},
    {mp__x86_row_f32_to_f16, mp__row_f16_to_f16, mp__x86_row_bf16_to_f16},
    {mp__x86_row_f32_to_bf16, mp__x86_row_f16_to_bf16, mp__row_bf16_to_bf16}};
#else
#define mp__rows mp__portable_rows
#endif

static void mp__stats_add(mp_cast_stats *st, const mp__scan *s, size_t n) {
    st->count += n;
    st->nan_in += s->nan;
    st->inf_in += s->inf;
    st->underflow += s->underflow;
    st->subnormal += s->subnormal;
    st->overflow += s->overflow;
    if (s->max_abs) { /* some finite nonzero input in this block */
        float hi = mp__f32_from_bits(s->max_abs), lo = mp__f32_from_bits(s->min_abs);
        if (hi > st->max_abs) st->max_abs = hi;
        if (st->min_abs == 0.0f || lo < st->min_abs) st->min_abs = lo;
    }
}

static int mp__overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + b_bytes && y < x + a_bytes;
}

static mp_status mp__convert_with(const mp__row_fn rows[MP_DTYPE_COUNT][MP_DTYPE_COUNT], void *dst,
                                  mp_dtype dst_type, const void *src, mp_dtype src_type, size_t n,
                                  mp_cast_stats *stats) {
    size_t dsz, ssz, i;
    if (!dst || !src) return MP_ERR_NULL;
    if (!mp__dtype_valid(dst_type) || !mp__dtype_valid(src_type)) return MP_ERR_DTYPE;
    dsz = mp__dtypes[dst_type].size;
    ssz = mp__dtypes[src_type].size;
    if (n > SIZE_MAX / 4) return MP_ERR_SIZE;
    if ((uintptr_t)dst % dsz || (uintptr_t)src % ssz) return MP_ERR_ALIGN;
    if (!(dst == src && dsz == ssz) && mp__overlap(dst, n * dsz, src, n * ssz)) return MP_ERR_OVERLAP;
    for (i = 0; i < n; i += MP__BLOCK) {
        size_t len = n - i < MP__BLOCK ? n - i : MP__BLOCK;
        mp__scan scan;
        rows[dst_type][src_type]((char *)dst + i * dsz, (const char *)src + i * ssz, len,
                                 stats ? &scan : NULL, mp__ranges_of[dst_type]);
        if (stats) mp__stats_add(stats, &scan, len);
    }
    return MP_OK;
}

MIXPREC_API mp_status mp_convert(void *dst, mp_dtype dst_type, const void *src, mp_dtype src_type,
                                 size_t n, mp_cast_stats *stats) {
    return mp__convert_with(mp__rows, dst, dst_type, src, src_type, n, stats);
}

MIXPREC_API mp_status mp_convert_portable(void *dst, mp_dtype dst_type, const void *src,
                                          mp_dtype src_type, size_t n, mp_cast_stats *stats) {
    return mp__convert_with(mp__portable_rows, dst, dst_type, src, src_type, n, stats);
}

/* >>policies */
static const struct { const char *name; mp_policy policy; } mp__policies[] = {
    {"float32", {MP_FLOAT32, MP_FLOAT32}},
    {"float16", {MP_FLOAT16, MP_FLOAT16}},
    {"bfloat16", {MP_BFLOAT16, MP_BFLOAT16}},
    {"mixed_float16", {MP_FLOAT16, MP_FLOAT32}},
    {"mixed_bfloat16", {MP_BFLOAT16, MP_FLOAT32}},
};
#define MP__NPOLICIES (sizeof mp__policies / sizeof mp__policies[0])

static mp_policy mp__global_policy = {MP_FLOAT32, MP_FLOAT32}; /* Keras's default */

MIXPREC_API mp_status mp_policy_from_name(const char *name, mp_policy *out) {
    size_t i;
    if (!name || !out) return MP_ERR_NULL;
    for (i = 0; i < MP__NPOLICIES; i++)
        if (strcmp(name, mp__policies[i].name) == 0) { *out = mp__policies[i].policy; return MP_OK; }
    return MP_ERR_UNKNOWN_POLICY;
}

MIXPREC_API const char *mp_policy_name(mp_policy p) {
    size_t i;
    for (i = 0; i < MP__NPOLICIES; i++)
        if (p.compute_dtype == mp__policies[i].policy.compute_dtype &&
            p.variable_dtype == mp__policies[i].policy.variable_dtype)
            return mp__policies[i].name;
    return NULL;
}

MIXPREC_API mp_dtype mp_policy_compute_dtype(mp_policy p) { return p.compute_dtype; }
MIXPREC_API mp_dtype mp_policy_variable_dtype(mp_policy p) { return p.variable_dtype; }

MIXPREC_API mp_status mp_policy_repr(mp_policy p, char *buf, size_t size) {
    static const char head[] = "<Policy \"", tail[] = "\">";
    const char *name = mp_policy_name(p);
    size_t hn = sizeof head - 1, nn, tn = sizeof tail - 1;
    if (!buf) return MP_ERR_NULL;
    if (!name) return MP_ERR_INVALID_POLICY;
    nn = strlen(name);
    if (size < hn + nn + tn + 1) return MP_ERR_SIZE;
    memcpy(buf, head, hn);
    memcpy(buf + hn, name, nn);
    memcpy(buf + hn + nn, tail, tn + 1);
    return MP_OK;
}

MIXPREC_API mp_status mp_set_global_policy(mp_policy p) {
    if (!mp_policy_name(p)) return MP_ERR_INVALID_POLICY;
    mp__global_policy = p;
    return MP_OK;
}

MIXPREC_API mp_status mp_set_global_policy_name(const char *name) {
    mp_policy p;
    mp_status st = mp_policy_from_name(name, &p);
    return st ? st : mp_set_global_policy(p);
}

MIXPREC_API mp_policy mp_global_policy(void) { return mp__global_policy; }

#ifdef __cplusplus
}
#endif
#endif /* MIXPREC_IMPLEMENTATION_DONE */
#endif /* MIXPREC_IMPLEMENTATION */

/*
------------------------------------------------------------------------------
This software is available under 2 licenses -- choose whichever you prefer.
------------------------------------------------------------------------------
ALTERNATIVE A - MIT License
Copyright (c) 2026 the mixprec authors
Permission is hereby granted, free of charge, to any person obtaining a copy of
this software and associated documentation files (the "Software"), to deal in
the Software without restriction, including without limitation the rights to
use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies
of the Software, and to permit persons to whom the Software is furnished to do
so, subject to the following conditions:
The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.
THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
------------------------------------------------------------------------------
ALTERNATIVE B - Public Domain (www.unlicense.org)
This is free and unencumbered software released into the public domain.
Anyone is free to copy, modify, publish, use, compile, sell, or distribute this
software, either in source code form or as a compiled binary, for any purpose,
commercial or non-commercial, and by any means.
In jurisdictions that recognize copyright laws, the author or authors of this
software dedicate any and all copyright interest in the software to the public
domain worldwide. This dedication is in the overt act of relinquishing all
present and future copyright interest in the software to the public domain. We
make this dedication in perpetuation of the public domain, and in furtherance
of the progress of society in accordance with that law.
------------------------------------------------------------------------------
*/
