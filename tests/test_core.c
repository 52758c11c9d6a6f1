/* test_core.c - fast unit tests of mixprec's numeric core: the boundary
   values of binary16 and bfloat16 (IEEE 754-2019 3.6, 4.3.1), NaN patterns,
   float64 single rounding, arithmetic (every pair of boundary values
   against the oracle) and comparisons, bulk casts and their stats (as
   counts of the cast's results), independence from the FPU
   rounding mode and FTZ/DAZ, dtypes, policies and errors. Runs in well under a
   second, so it also runs under ASan/UBSan, as C++, without SIMD and on a
   big-endian target under qemu. The exhaustive sweeps are in test_numerics.c. */
#ifndef TEST_LINKS_MIXPREC /* defined: the implementation is another object's (tests/header_only.c) */
#define MIXPREC_IMPLEMENTATION
#endif
#include "../mixprec.h"
#include "check.h"
#include "oracle.h"

#include <fenv.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE__) || defined(_M_X64)
#include <xmmintrin.h>
#define HAVE_MXCSR 1
#endif

static float f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
static uint32_t bits32(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
/* Bitwise equality of two floats. Passing them as float parameters drops any
   excess precision: with FLT_EVAL_METHOD 1 (s390x) a constant like 1e-8f is
   otherwise compared at double precision. */
static int same_float(float a, float b) { return bits32(a) == bits32(b); }
static uint16_t to_f16(uint32_t u) { return mp_f16_from_f32(f32(u)).bits; }
static uint16_t to_bf16(uint32_t u) { return mp_bf16_from_f32(f32(u)).bits; }
static uint32_t from_f16(uint16_t h) { return bits32(mp_f16_to_f32(mp_f16_from_bits(h))); }
static uint32_t from_bf16(uint16_t h) { return bits32(mp_bf16_to_f32(mp_bf16_from_bits(h))); }

static uint32_t rng_state = 0x12345678u;
static uint32_t rng(void) { /* xorshift32 */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

static void test_f16_boundaries(void) {
    /* IEEE 754 binary16, round to nearest even: the ties at each boundary */
    CHECK_EQ(to_f16(0x477FEFFFu), 0x7BFFu);   /* just under 65520 -> 65504 */
    CHECK_EQ(to_f16(0x477FF000u), 0x7C00u);   /* 65520 -> Inf */
    CHECK_EQ(to_f16(0xC77FF000u), 0xFC00u);
    CHECK_EQ(to_f16(0x477FE000u), 0x7BFFu);   /* 65504 exact */
    CHECK_EQ(to_f16(0x33000000u), 0x0000u);   /* 2^-25, a tie -> +0 */
    CHECK_EQ(to_f16(0xB3000000u), 0x8000u);   /* -2^-25 -> -0 */
    CHECK_EQ(to_f16(0x33000001u), 0x0001u);
    CHECK_EQ(to_f16(0x33800000u), 0x0001u);   /* 2^-24 */
    CHECK_EQ(to_f16(0x33C00000u), 0x0002u);   /* 1.5 * 2^-24, tie -> even */
    CHECK_EQ(to_f16(0x3F801000u), 0x3C00u);   /* 1 + 2^-11, a tie -> 1.0 */
    CHECK_EQ(to_f16(0x3F803000u), 0x3C02u);   /* 1 + 3 * 2^-11, tie -> even up */
    CHECK_EQ(to_f16(0x3F801001u), 0x3C01u);
    CHECK_EQ(to_f16(0x38800000u), 0x0400u);   /* 2^-14, min normal */
    CHECK_EQ(to_f16(0x387FC000u), 0x03FFu);   /* largest subnormal */
    CHECK_EQ(to_f16(0x387FE000u), 0x0400u);   /* tie between them -> even (normal) */
    CHECK_EQ(to_f16(0x387FDFFFu), 0x03FFu);
    CHECK_EQ(to_f16(0x00000001u), 0x0000u);   /* float32 subnormals -> zero */
    CHECK_EQ(to_f16(0x807FFFFFu), 0x8000u);
    CHECK_EQ(to_f16(0x7F800000u), 0x7C00u);
    CHECK_EQ(to_f16(0xFF800000u), 0xFC00u);
    CHECK_EQ(to_f16(0x7F7FFFFFu), 0x7C00u);
    /* NaN: sign | 0x7E00 | (fraction >> 13), never Inf */
    CHECK_EQ(to_f16(0x7FC00000u), 0x7E00u);
    CHECK_EQ(to_f16(0x7F800001u), 0x7E00u);   /* payload only in low bits */
    CHECK_EQ(to_f16(0x7FA00000u), 0x7F00u);   /* signalling, payload kept */
    CHECK_EQ(to_f16(0xFFFFFFFFu), 0xFFFFu);
    CHECK_EQ(to_f16(0xFF812345u), 0xFE09u);
    /* back to float32 */
    CHECK_EQ(from_f16(0x7C01u), 0x7FC02000u); /* quieted, as F16C */
    CHECK_EQ(from_f16(0xFE00u), 0xFFC00000u);
    CHECK_EQ(from_f16(0x7C00u), 0x7F800000u);
    CHECK_EQ(from_f16(0x0001u), 0x33800000u);
    CHECK_EQ(from_f16(0x03FFu), 0x387FC000u);
    CHECK_EQ(from_f16(0x0400u), 0x38800000u);
    CHECK_EQ(from_f16(0x7BFFu), 0x477FE000u);
    CHECK_EQ(from_f16(0x8000u), 0x80000000u);
    CHECK_EQ(from_f16(0x3C00u), 0x3F800000u);
}

static void test_bf16_boundaries(void) {
    CHECK_EQ(to_bf16(0x7F7F8000u), 0x7F80u);  /* first value to Inf */
    CHECK_EQ(to_bf16(0x7F7F7FFFu), 0x7F7Fu);
    CHECK_EQ(to_bf16(0xFF7F8000u), 0xFF80u);
    CHECK_EQ(to_bf16(0x3F808000u), 0x3F80u);  /* 1 + 2^-8, tie -> 1.0 */
    CHECK_EQ(to_bf16(0x3F818000u), 0x3F82u);  /* tie -> even up */
    CHECK_EQ(to_bf16(0x00008000u), 0x0000u);  /* subnormal tie -> 0 */
    CHECK_EQ(to_bf16(0x00018000u), 0x0002u);
    CHECK_EQ(to_bf16(0x00008001u), 0x0001u);  /* not flushed (vcvtneps2bf16 would) */
    CHECK_EQ(to_bf16(0x007FFFFFu), 0x0080u);  /* rounds up into the normals */
    CHECK_EQ(to_bf16(0x80000000u), 0x8000u);
    CHECK_EQ(to_bf16(0x7F800000u), 0x7F80u);
    CHECK_EQ(to_bf16(0x7F800001u), 0x7FC0u);  /* NaN, never Inf */
    CHECK_EQ(to_bf16(0xFF812345u), 0xFFC1u);
    CHECK_EQ(to_bf16(0x7FFFFFFFu), 0x7FFFu);
    CHECK_EQ(from_bf16(0x7F81u), 0x7F810000u); /* exact, even a signalling NaN */
    CHECK_EQ(from_bf16(0x0001u), 0x00010000u);
    CHECK_EQ(from_bf16(0xFF80u), 0xFF800000u);
}

static void test_from_f64(void) {
    int i;
    /* through float32 these would double-round to the even neighbour */
    CHECK_EQ(mp_f16_from_f64(1.0 + ldexp(1, -11) + ldexp(1, -40)).bits, 0x3C01u);
    CHECK_EQ(mp_f16_from_f64(1.0 + ldexp(1, -11)).bits, 0x3C00u);
    CHECK_EQ(mp_f16_from_f64(ldexp(1, -25) + ldexp(1, -70)).bits, 0x0001u);
    CHECK_EQ(mp_f16_from_f64(ldexp(1, -25)).bits, 0x0000u);
    CHECK_EQ(mp_f16_from_f64(65520.0 - ldexp(1, -30)).bits, 0x7BFFu);
    CHECK_EQ(mp_f16_from_f64(65520.0).bits, 0x7C00u);
    CHECK_EQ(mp_f16_from_f64(-1e300).bits, 0xFC00u);
    CHECK_EQ(mp_f16_from_f64(-1e-300).bits, 0x8000u);
    CHECK_EQ(mp_f16_from_f64(ldexp(1, -1074)).bits, 0x0000u);
    CHECK_EQ(mp_bf16_from_f64(1.0 + ldexp(1, -8) + ldexp(1, -40)).bits, 0x3F81u);
    CHECK_EQ(mp_bf16_from_f64((double)f32(0x7F7F8000u)).bits, 0x7F80u);
    CHECK_EQ(mp_bf16_from_f64(nextafter((double)f32(0x7F7F8000u), 0.0)).bits, 0x7F7Fu);
    CHECK_EQ(mp_bf16_from_f64(1.7976931348623157e308).bits, 0x7F80u);
    CHECK_EQ(mp_bf16_from_f64(ldexp(1, -134) + ldexp(1, -180)).bits, 0x0001u); /* above the tie */
    CHECK_EQ(mp_bf16_from_f64(ldexp(1, -134)).bits, 0x0000u);
    CHECK_EQ(mp_bf16_from_f64(ldexp(3, -134)).bits, 0x0002u);
    CHECK_EQ(mp_f16_from_f64(-NAN).bits & 0xFE00u, 0xFE00u);
    CHECK(mp_bf16_isnan(mp_bf16_from_f64(NAN)));
    /* random doubles of every magnitude against the oracle */
    for (i = 0; i < 200000; i++) {
        uint64_t u = (uint64_t)rng() << 32 | rng();
        double x;
        memcpy(&x, &u, 8);
        if (isnan(x)) continue;
        if (i & 1) x = ldexp(x, -ilogb(x) + (int)(rng() % 300) - 150); /* near both formats */
        if (mp_f16_from_f64(x).bits != oracle_round(x, ORACLE_F16) ||
            mp_bf16_from_f64(x).bits != oracle_round(x, ORACLE_BF16)) {
            fprintf(stderr, "    f64 conversion differs from the oracle at x = %a\n", x);
            CHECK(0);
            return;
        }
    }
    CHECK(1);
}

static mp_f16 h16(float x) { return mp_f16_from_f32(x); }
static mp_bf16 hb(float x) { return mp_bf16_from_f32(x); }

static void test_arithmetic(void) {
    mp_f16 nan = MP_F16_NAN, inf = MP_F16_INF, pz = h16(0.0f), nz = h16(-0.0f);
    /* the guide's float16 overflow and underflow */
    CHECK_EQ(mp_f16_mul(h16(256.0f), h16(256.0f)).bits, 0x7C00u);
    CHECK_EQ(mp_f16_mul(h16(1e-5f), h16(1e-5f)).bits, 0x0000u);
    CHECK_EQ(mp_f16_add(MP_F16_MAX, h16(16.0f)).bits, 0x7C00u);   /* 65520: tie -> Inf */
    CHECK_EQ(mp_f16_add(MP_F16_MAX, h16(15.0f)).bits, 0x7BFFu);
    CHECK_EQ(mp_f16_add(h16(1.0f), MP_F16_EPSILON).bits, 0x3C01u);
    CHECK_EQ(mp_f16_sub(h16(1.0f), h16(1.0f)).bits, 0x0000u);     /* +0 */
    CHECK_EQ(mp_f16_add(nz, nz).bits, 0x8000u);
    CHECK_EQ(mp_f16_add(pz, nz).bits, 0x0000u);
    CHECK_EQ(mp_f16_mul(MP_F16_MIN_SUBNORMAL, h16(0.5f)).bits, 0x0000u); /* tie -> 0 */
    CHECK_EQ(mp_f16_mul(MP_F16_MIN_SUBNORMAL, h16(1.5f)).bits, 0x0002u);
    CHECK_EQ(mp_f16_div(h16(1.0f), pz).bits, 0x7C00u);
    CHECK_EQ(mp_f16_div(h16(1.0f), nz).bits, 0xFC00u);
    CHECK(mp_f16_isnan(mp_f16_div(pz, pz)));
    CHECK(mp_f16_isnan(mp_f16_sub(inf, inf)));
    CHECK(mp_f16_isnan(mp_f16_add(nan, h16(1.0f))));
    CHECK_EQ(mp_f16_sqrt(h16(4.0f)).bits, 0x4000u);
    CHECK_EQ(mp_f16_sqrt(nz).bits, 0x8000u);
    CHECK(mp_f16_isnan(mp_f16_sqrt(h16(-1.0f))));
    CHECK_EQ(mp_f16_sqrt(inf).bits, 0x7C00u);
    CHECK_EQ(mp_f16_neg(pz).bits, 0x8000u);
    CHECK_EQ(mp_f16_abs(h16(-2.0f)).bits, 0x4000u);
    CHECK_EQ(mp_f16_neg(nan).bits, 0xFE00u);
    CHECK_EQ(mp_bf16_mul(hb(1e20f), hb(1e20f)).bits, 0x7F80u);
    CHECK_EQ(mp_bf16_mul(hb(1e-20f), hb(1e-20f)).bits, /* ~1e-40: a bfloat16 subnormal */
             oracle_round(oracle_value(hb(1e-20f).bits, ORACLE_BF16) * oracle_value(hb(1e-20f).bits, ORACLE_BF16),
                          ORACLE_BF16));
    CHECK(mp_bf16_mul(hb(1e-20f), hb(1e-20f)).bits != 0);
    CHECK_EQ(mp_bf16_add(hb(1.0f), MP_BF16_EPSILON).bits, 0x3F81u);
    CHECK_EQ(mp_bf16_sub(MP_BF16_MIN_NORMAL, MP_BF16_MIN_SUBNORMAL).bits, 0x007Fu);
    CHECK_EQ(mp_bf16_div(hb(1.0f), hb(3.0f)).bits, 0x3EABu);
    CHECK_EQ(mp_bf16_sqrt(hb(2.0f)).bits, 0x3FB5u);
    CHECK_EQ(mp_bf16_neg(hb(1.0f)).bits, 0xBF80u);
    CHECK_EQ(mp_bf16_abs(hb(-0.0f)).bits, 0x0000u);
}

/* Each of the four operations on every ordered pair of some values of
   each boundary class (zeros, subnormals, the smallest normal, one and its
   neighbours, the largest finite, Inf, NaN; both signs) and a few plain
   ones, against the oracle: an operand swapped (b - a for a - b, b / a)
   or a wrong rounding shows on pairs that are not symmetric. Then the
   identities a - b = a + (-b) = -(b - a) on the same pairs. */
static int op_matches(uint16_t got, double exact, oracle_format f) {
    uint16_t inf = (uint16_t)(((1u << f.ebits) - 1u) << (f.p - 1));
    if (exact != exact) return (got & 0x7FFFu) > inf;
    return got == oracle_round(exact, f);
}
static void test_arithmetic_pairs(void) {
    static const uint16_t f16_values[] = {0x0000, 0x0001, 0x0003, 0x03FF, 0x0400, 0x3555, 0x3800, 0x3BFF, 0x3C00,
                                          0x3C01, 0x4000, 0x4248, 0x57D0, 0x7BFF, 0x7C00, 0x7E00};
    static const uint16_t bf16_values[] = {0x0000, 0x0001, 0x0003, 0x007F, 0x0080, 0x3EAB, 0x3F00, 0x3F7F, 0x3F80,
                                           0x3F81, 0x4000, 0x4049, 0x447A, 0x7F7F, 0x7F80, 0x7FC0};
    enum { NV = sizeof f16_values / sizeof f16_values[0] };
    int f16, i, j, s, op;
    for (f16 = 1; f16 >= 0; f16--) {
        oracle_format f = f16 ? ORACLE_F16 : ORACLE_BF16;
        const uint16_t *v = f16 ? f16_values : bf16_values;
        unsigned bad[4] = {0, 0, 0, 0}, bad_identity = 0;
        for (i = 0; i < 2 * NV; i++)
            for (j = 0; j < 2 * NV; j++) {
                uint16_t a = (uint16_t)(v[i % NV] | (i >= NV ? 0x8000u : 0u));
                uint16_t b = (uint16_t)(v[j % NV] | (j >= NV ? 0x8000u : 0u));
                double x = oracle_value(a, f), y = oracle_value(b, f), exact[4];
                uint16_t got[4], plus_neg, neg_swapped;
                exact[0] = x + y, exact[1] = x - y, exact[2] = x * y, exact[3] = x / y; /* all exact or innocuous */
                if (f16) {
                    mp_f16 p = mp_f16_from_bits(a), q = mp_f16_from_bits(b);
                    got[0] = mp_f16_add(p, q).bits, got[1] = mp_f16_sub(p, q).bits;
                    got[2] = mp_f16_mul(p, q).bits, got[3] = mp_f16_div(p, q).bits;
                    plus_neg = mp_f16_add(p, mp_f16_neg(q)).bits, neg_swapped = mp_f16_neg(mp_f16_sub(q, p)).bits;
                } else {
                    mp_bf16 p = mp_bf16_from_bits(a), q = mp_bf16_from_bits(b);
                    got[0] = mp_bf16_add(p, q).bits, got[1] = mp_bf16_sub(p, q).bits;
                    got[2] = mp_bf16_mul(p, q).bits, got[3] = mp_bf16_div(p, q).bits;
                    plus_neg = mp_bf16_add(p, mp_bf16_neg(q)).bits, neg_swapped = mp_bf16_neg(mp_bf16_sub(q, p)).bits;
                }
                for (op = 0; op < 4; op++)
                    if (!op_matches(got[op], exact[op], f) && bad[op]++ == 0)
                        fprintf(stderr, "    %s op %d on 0x%04x, 0x%04x: 0x%04x\n", f16 ? "float16" : "bfloat16", op,
                                a, b, got[op]);
                /* -(b - a) is a - b but for the sign of an exact zero (IEEE 754 6.3); NaNs' signs differ */
                s = exact[1] == exact[1] && exact[1] != 0.0;
                bad_identity += exact[1] == exact[1] && (plus_neg != got[1] || (s && neg_swapped != got[1]));
            }
        CHECK(bad[0] == 0); /* add */
        CHECK(bad[1] == 0); /* sub */
        CHECK(bad[2] == 0); /* mul */
        CHECK(bad[3] == 0); /* div */
        CHECK(bad_identity == 0);
    }
    /* the simplest asymmetric cases, by name */
    CHECK_EQ(mp_f16_sub(h16(1.0f), h16(0.5f)).bits, 0x3800u);
    CHECK_EQ(mp_f16_sub(h16(0.5f), h16(1.0f)).bits, 0xB800u);
    CHECK_EQ(mp_f16_sub(h16(1.0f), MP_F16_EPSILON).bits, 0x3BFEu); /* 1 - 2^-10 */
    CHECK_EQ(mp_f16_div(h16(1.0f), h16(4.0f)).bits, 0x3400u);
    CHECK_EQ(mp_bf16_sub(hb(1.0f), hb(0.5f)).bits, 0x3F00u);
    CHECK_EQ(mp_bf16_sub(hb(0.5f), hb(1.0f)).bits, 0xBF00u);
    CHECK_EQ(mp_bf16_div(hb(1.0f), hb(4.0f)).bits, 0x3E80u);
}

static void test_comparisons_and_constants(void) {
    mp_f16 nan = MP_F16_NAN, one = h16(1.0f), two = h16(2.0f);
    mp_bf16 bnan = MP_BF16_NAN, bone = hb(1.0f), bm = hb(-1.0f);
    CHECK(mp_f16_eq(h16(0.0f), h16(-0.0f)));
    CHECK(!mp_f16_lt(h16(-0.0f), h16(0.0f)));
    CHECK(mp_f16_le(h16(-0.0f), h16(0.0f)));
    CHECK(!mp_f16_eq(nan, nan));
    CHECK(!mp_f16_lt(nan, one) && !mp_f16_gt(nan, one) && !mp_f16_le(nan, one) && !mp_f16_ge(one, nan));
    CHECK(mp_f16_lt(one, two) && mp_f16_gt(two, one) && mp_f16_le(one, one) && mp_f16_ge(one, one));
    CHECK(mp_f16_lt(h16(-2.0f), h16(-1.0f)));
    CHECK(mp_f16_lt(mp_f16_neg(MP_F16_INF), MP_F16_MAX) && mp_f16_lt(MP_F16_MAX, MP_F16_INF));
    CHECK(mp_f16_isnan(nan) && !mp_f16_isinf(nan) && !mp_f16_isfinite(nan));
    CHECK(mp_f16_isinf(mp_f16_neg(MP_F16_INF)) && mp_f16_isfinite(MP_F16_MAX));
    CHECK(mp_bf16_eq(hb(0.0f), hb(-0.0f)) && !mp_bf16_eq(bnan, bnan));
    CHECK(mp_bf16_lt(bm, bone) && mp_bf16_ge(bone, bm) && !mp_bf16_lt(bnan, bone));
    CHECK(mp_bf16_isnan(bnan) && mp_bf16_isinf(MP_BF16_INF) && mp_bf16_isfinite(MP_BF16_MAX));
    CHECK(mp_f16_to_f32(MP_F16_MAX) == 65504.0f);
    CHECK(mp_f16_to_f32(MP_F16_MIN_NORMAL) == ldexpf(1, -14));
    CHECK(mp_f16_to_f32(MP_F16_MIN_SUBNORMAL) == ldexpf(1, -24));
    CHECK(mp_f16_to_f32(MP_F16_EPSILON) == ldexpf(1, -10));
    CHECK(mp_bf16_to_f32(MP_BF16_MIN_NORMAL) == ldexpf(1, -126));
    CHECK(mp_bf16_to_f32(MP_BF16_MIN_SUBNORMAL) == ldexpf(1, -133));
    CHECK(mp_bf16_to_f32(MP_BF16_EPSILON) == ldexpf(1, -7));
    CHECK(mp_bf16_to_f32(MP_BF16_MAX) == f32(0x7F7F0000u));
    CHECK(isnan(mp_bf16_to_f32(MP_BF16_NAN)) && isinf(mp_f16_to_f32(MP_F16_INF)));
}

/* mp_convert and mp_convert_portable against the scalar functions, on every
   16-bit input and on float32 boundaries plus random bits, at odd lengths and
   offsets so the SIMD tails and unaligned loads are exercised. */
enum { NBUF = 65536 + 64 };
static uint32_t src32[NBUF], ref32[NBUF], out32[NBUF];
static uint16_t src16[NBUF], ref16[NBUF], out16[NBUF];

/* a cast to the same dtype is a copy (signalling NaNs stay as they are) */
static void scalar_convert(void *dst, mp_dtype dt, const void *src, mp_dtype st, size_t n) {
    size_t i;
    if (dt == st) {
        memcpy(dst, src, n * mp_dtype_size(dt));
        return;
    }
    for (i = 0; i < n; i++) {
        uint32_t w = st == MP_FLOAT32 ? ((const uint32_t *)src)[i]
                   : st == MP_FLOAT16 ? from_f16(((const uint16_t *)src)[i])
                                      : from_bf16(((const uint16_t *)src)[i]);
        if (dt == MP_FLOAT32) ((uint32_t *)dst)[i] = w;
        else ((uint16_t *)dst)[i] = dt == MP_FLOAT16 ? to_f16(w) : to_bf16(w);
    }
}

static void fill_sources(void) {
    static const uint32_t edges[] = {0x477FEFFFu, 0x477FF000u, 0x33000000u, 0x33000001u, 0x3F801000u,
                                     0x387FE000u, 0x7F7F8000u, 0x7F7F7FFFu, 0x00008000u, 0x00008001u,
                                     0x7F800001u, 0xFF812345u, 0x7FA00000u, 0x80000000u, 0x7F800000u};
    size_t i;
    for (i = 0; i < NBUF; i++) {
        src16[i] = (uint16_t)i;
        src32[i] = i < sizeof edges / sizeof edges[0] ? edges[i] : rng();
    }
}

static int same(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

static void test_bulk_matches_scalar(void) {
    static const size_t lens[] = {65536, 1, 7, 8, 15, 16, 17, 33, 2049, 4099};
    int dt, st, path;
    size_t l, off;
    fill_sources();
    for (dt = 0; dt < MP_DTYPE_COUNT; dt++)
        for (st = 0; st < MP_DTYPE_COUNT; st++)
            for (path = 0; path < 2; path++)
                for (l = 0; l < sizeof lens / sizeof lens[0]; l++)
                    for (off = 0; off < 3; off += 2) {
                        const void *src = st == MP_FLOAT32 ? (const void *)(src32 + off) : (const void *)(src16 + off);
                        void *ref = dt == MP_FLOAT32 ? (void *)ref32 : (void *)ref16;
                        void *out = dt == MP_FLOAT32 ? (void *)(out32 + 1) : (void *)(out16 + 1);
                        size_t n = lens[l], bytes = n * mp_dtype_size((mp_dtype)dt);
                        mp_status s;
                        scalar_convert(ref, (mp_dtype)dt, src, (mp_dtype)st, n);
                        s = (path ? mp_convert_portable : mp_convert)(out, (mp_dtype)dt, src, (mp_dtype)st, n, NULL);
                        if (!CHECK(s == MP_OK && same(out, ref, bytes)))
                            fprintf(stderr, "    %s <- %s path=%d n=%zu off=%zu\n", mp_dtype_name((mp_dtype)dt),
                                    mp_dtype_name((mp_dtype)st), path, n, off);
                    }
}

/* Conversions are integer-only: a different rounding mode, or FTZ and DAZ
   (set by -ffast-math startup code), must not change one bit. */
static void test_fpu_mode_independence(void) {
    size_t n = 65536, i;
    int dt, st;
    fill_sources();
    for (i = 0; i < 4096; i++) src32[i] = (uint32_t)i << 12 | (i & 1); /* many subnormals and ties */
    for (dt = 0; dt < MP_DTYPE_COUNT; dt++)
        for (st = 0; st < MP_DTYPE_COUNT; st++) {
            const void *src = st == MP_FLOAT32 ? (const void *)src32 : (const void *)src16;
            void *ref = dt == MP_FLOAT32 ? (void *)ref32 : (void *)ref16;
            void *out = dt == MP_FLOAT32 ? (void *)out32 : (void *)out16;
            size_t bytes = n * mp_dtype_size((mp_dtype)dt);
            int mode;
            mp_convert(ref, (mp_dtype)dt, src, (mp_dtype)st, n, NULL);
            for (mode = 0; mode < 3; mode++) {
                static const int rounding[] = {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO};
#ifdef HAVE_MXCSR
                unsigned csr = _mm_getcsr();
                _mm_setcsr(csr | 0x8040u); /* FTZ | DAZ */
#endif
                fesetround(rounding[mode]);
                mp_convert(out, (mp_dtype)dt, src, (mp_dtype)st, n, NULL);
                CHECK(same(out, ref, bytes));
                scalar_convert(out, (mp_dtype)dt, src, (mp_dtype)st, n);
                CHECK(same(out, ref, bytes));
                fesetround(FE_TONEAREST);
#ifdef HAVE_MXCSR
                _mm_setcsr(csr);
#endif
            }
        }
}

static void test_stats(void) {
    float in[] = {0.0f, -0.0f, 1.0f, 65520.0f, 1e-8f, 1e-6f, INFINITY, -INFINITY, NAN, -70000.0f,
                  ldexpf(1, -25), 3.0f};
    uint16_t out[12];
    mp_cast_stats st;
    memset(&st, 0, sizeof st);
    CHECK(mp_convert(out, MP_FLOAT16, in, MP_FLOAT32, 12, &st) == MP_OK);
    CHECK_EQ(st.count, 12);
    CHECK_EQ(st.nan_in, 1);
    CHECK_EQ(st.inf_in, 2);
    CHECK_EQ(st.overflow, 2);   /* 65520 and -70000 */
    CHECK_EQ(st.underflow, 2);  /* 1e-8 and 2^-25 */
    CHECK_EQ(st.subnormal, 1);  /* 1e-6 */
    CHECK(same_float(st.max_abs, 70000.0f));
    CHECK(same_float(st.min_abs, 1e-8f));
    /* stats add up across calls; the portable path counts the same */
    CHECK(mp_convert_portable(out, MP_FLOAT16, in, MP_FLOAT32, 12, &st) == MP_OK);
    CHECK_EQ(st.count, 24);
    CHECK_EQ(st.overflow, 4);
    CHECK_EQ(st.underflow, 4);
    CHECK(same_float(st.min_abs, 1e-8f) && same_float(st.max_abs, 70000.0f));
    {   /* bfloat16 keeps float32's range: only float32 subnormals hurt */
        float b[] = {1e-40f, 1e-45f, 3e38f, 1e-30f};
        uint16_t o[4];
        memset(&st, 0, sizeof st);
        mp_convert(o, MP_BFLOAT16, b, MP_FLOAT32, 4, &st);
        CHECK_EQ(st.overflow, 0);
        CHECK_EQ(st.underflow, 1);  /* 1e-45: below half of 2^-133 */
        CHECK_EQ(st.subnormal, 1);  /* 1e-40 */
        CHECK(same_float(st.min_abs, 1e-45f) && same_float(st.max_abs, 3e38f));
    }
    {   /* widening never overflows; float16 subnormals are normal floats */
        uint16_t h[] = {0x0001u, 0x7BFFu, 0x7C00u, 0x7E00u, 0x0000u};
        float o[5];
        memset(&st, 0, sizeof st);
        mp_convert(o, MP_FLOAT32, h, MP_FLOAT16, 5, &st);
        CHECK(st.overflow == 0 && st.underflow == 0 && st.subnormal == 0);
        CHECK(st.nan_in == 1 && st.inf_in == 1);
        CHECK(same_float(st.min_abs, ldexpf(1, -24)) && same_float(st.max_abs, 65504.0f));
    }
    {   /* bfloat16 -> float16 narrows: 1e5 overflows, 1e-9 underflows */
        uint16_t b[3], o[3];
        float v[] = {1e5f, 1e-9f, 0.5f};
        mp_convert(b, MP_BFLOAT16, v, MP_FLOAT32, 3, NULL);
        memset(&st, 0, sizeof st);
        mp_convert(o, MP_FLOAT16, b, MP_BFLOAT16, 3, &st);
        CHECK(st.overflow == 1 && st.underflow == 1 && st.count == 3);
    }
    {   /* a long run crosses blocks; counts must not be lost between them */
        static float big[10000];
        static uint16_t o[10000];
        size_t i;
        for (i = 0; i < 10000; i++) big[i] = i % 3 == 0 ? 1e6f : i % 3 == 1 ? 1e-9f : 1.0f;
        memset(&st, 0, sizeof st);
        mp_convert(o, MP_FLOAT16, big, MP_FLOAT32, 10000, &st);
        CHECK(st.overflow == 3334 && st.underflow == 3333 && st.count == 10000);
    }
}

/* The stats are counts of what the cast did: overflow = finite inputs
   whose result is Inf, underflow = nonzero inputs whose result is zero,
   subnormal = subnormal results, and the extremes of the finite nonzero
   inputs. Inputs at each threshold of each target and one float32 ulp on
   either side (the ties that round to zero, to the smallest normal and to
   Inf), both signs, tiled over calls of many blocks and a short one, from
   float32 and from bfloat16 (to float16), on both paths: the stats
   against those counts of the results, and a call's stats as the sum of
   its halves'. */
static void stats_of_results(mp_cast_stats *want, const float *in, const void *out, mp_dtype dt, size_t n) {
    size_t i;
    memset(want, 0, sizeof *want);
    want->count = n;
    for (i = 0; i < n; i++) {
        float x = in[i], y = dt == MP_FLOAT16 ? mp_f16_to_f32(((const mp_f16 *)out)[i])
                                              : mp_bf16_to_f32(((const mp_bf16 *)out)[i]);
        float ax = fabsf(x), ay = fabsf(y), least_normal = dt == MP_FLOAT16 ? ldexpf(1, -14) : ldexpf(1, -126);
        int finite = ax < INFINITY;
        want->nan_in += x != x;
        want->inf_in += ax == INFINITY;
        want->overflow += finite && ay == INFINITY;
        want->underflow += x != 0.0f && finite && y == 0.0f;
        want->subnormal += y != 0.0f && ay < least_normal;
        if (finite && x != 0.0f) {
            if (ax > want->max_abs) want->max_abs = ax;
            if (want->min_abs == 0.0f || ax < want->min_abs) want->min_abs = ax;
        }
    }
}
static void test_stats_are_counts(void) {
    static const uint32_t thresholds[] = {0x33000000u, 0x387FE000u, 0x477FF000u,  /* float16 */
                                          0x00008000u, 0x007F8000u, 0x7F7F8000u}; /* bfloat16 */
    enum { N = 3 * 4096 * 8 + 77 };
    static float in[N], wide[N];
    static uint16_t out[N], mid[N];
    size_t i, k, n_base = 0, lengths[2] = {N, 45};
    float base[64];
    int dt, path, src, l;
    for (i = 0; i < sizeof thresholds / sizeof thresholds[0]; i++)
        for (k = 0; k < 3; k++) base[n_base++] = f32(thresholds[i] + (uint32_t)k - 1u);
    base[n_base++] = 0.0f, base[n_base++] = 1.0f, base[n_base++] = INFINITY, base[n_base++] = NAN;
    base[n_base++] = f32(1u); /* the least float32 subnormal */
    for (i = 0; i < N; i++) { /* the values in a varying order, every sign, between plain ones */
        float v = i % 3 == 2 ? 1.5f : base[(i * 7 + i / 23) % n_base];
        in[i] = (i / 2) % 2 ? -v : v;
    }
    for (dt = MP_FLOAT16; dt <= MP_BFLOAT16; dt++)
        for (src = 0; src < 2; src++) /* float32, or the bfloat16 source (to float16 only) */
            for (path = 0; path < 2; path++)
                for (l = 0; l < 2; l++) {
                    mp_cast_stats got, want, half;
                    const void *from = in;
                    mp_dtype st = MP_FLOAT32;
                    size_t n = lengths[l];
                    if (src && dt != MP_FLOAT16) continue;
                    if (src) { /* the bfloat16 values widened are what the cast sees */
                        mp_convert_portable(mid, MP_BFLOAT16, in, MP_FLOAT32, n, NULL);
                        mp_convert_portable(wide, MP_FLOAT32, mid, MP_BFLOAT16, n, NULL);
                        from = mid, st = MP_BFLOAT16;
                    } else {
                        memcpy(wide, in, n * sizeof(float));
                    }
                    memset(&got, 0, sizeof got), memset(&half, 0, sizeof half);
                    if (path) mp_convert(out, (mp_dtype)dt, from, st, n, &got);
                    else mp_convert_portable(out, (mp_dtype)dt, from, st, n, &got);
                    stats_of_results(&want, wide, out, (mp_dtype)dt, n);
                    if (!CHECK(same(&got, &want, sizeof got)))
                        fprintf(stderr, "    %s <- %s, %s path, %zu: overflow %llu/%llu underflow %llu/%llu "
                                "subnormal %llu/%llu min %g/%g max %g/%g\n", mp_dtype_name((mp_dtype)dt),
                                mp_dtype_name(st), path ? "SIMD" : "portable", n,
                                (unsigned long long)got.overflow, (unsigned long long)want.overflow,
                                (unsigned long long)got.underflow, (unsigned long long)want.underflow,
                                (unsigned long long)got.subnormal, (unsigned long long)want.subnormal,
                                (double)got.min_abs, (double)want.min_abs, (double)got.max_abs, (double)want.max_abs);
                    /* the same elements in two calls: the stats add up to the same */
                    if (path) {
                        size_t h = n / 2 + 3 > n ? n : n / 2 + 3, es = mp_dtype_size(st);
                        mp_convert(out, (mp_dtype)dt, from, st, h, &half);
                        mp_convert(out, (mp_dtype)dt, (const char *)from + h * es, st, n - h, &half);
                        CHECK(same(&half, &want, sizeof half));
                    }
                }
}

/* Stats over long runs where clean stretches (every value normal in the
   target) and special ones (underflow, subnormal, overflow, Inf, NaN)
   alternate: the SIMD rows count only where a stretch has something to
   count, and count a stretch again when its bounds say so; the stretches
   are AVX2's 4080 elements and AVX-512's 4096 after a first one of 256
   (MP__STATS_PROBE), both laid out on every machine. Against the portable
   path, every direction, with a copy in place for the 16-bit pairs:
   results and stats, bit for bit. */
static void test_stats_stretches(void) {
    enum { N = 9 * 4096 + 37 };
    static const float specials[] = {1e-30f, 1e-6f, 7e4f, INFINITY, NAN, 1e-40f, 1e-45f, -3e38f};
    /* the first values past the bounds that a clean stretch's test reads:
       float16's 65520 and the largest below its least normal (as float32
       and as bfloat16), bfloat16's overflow and largest subnormal; each
       alone in a run (patterns 6 on), so its stretch is one cast with its
       bounds alone */
    static const uint32_t edges[] = {0x477FF000u, 0x387FDFFFu, 0x387F0000u, 0x7F7F8000u, 0x007F7FFFu};
    static const size_t stretches[] = {4080, 4096};
    static float f[N];
    static uint16_t a16[N], b16[N], p16[N];
    static float a32[N], p32[N];
    int pattern, dt, st;
    for (pattern = 0; pattern < 6 + (int)(sizeof edges / sizeof edges[0]); pattern++) {
        size_t i, w, c = stretches[pattern / 3 % 2], o = 256; /* the first stretch's length */
        size_t where[] = {5, o + c + 5, o + 5 * c - 1, o + 5 * c, N - 3}; /* + all of stretch 7 */
        for (i = 0; i < N; i++) { /* normal in float16 and bfloat16: 2^-10 ... 2^10, or zero */
            uint32_t r = rng();
            f[i] = r % 7 == 0 ? 0.0f : ldexpf((float)(r >> 8 & 0xFF) / 256.0f + 1.0f, (int)(r >> 16) % 21 - 10);
            if (r & 1) f[i] = -f[i];
        }
        if (pattern >= 6) f[N / 2] = f32(edges[pattern - 6]);
        else
            for (w = 0; w < sizeof where / sizeof where[0]; w++)
                if (pattern % 3 > 0 || w < 2) f[where[w]] = specials[(w + (size_t)pattern) % 8];
        if (pattern % 3 == 2 && pattern < 6)
            for (i = o + 6 * c; i < o + 7 * c; i += 3) f[i] = specials[i % 8];
        for (dt = 0; dt < MP_DTYPE_COUNT; dt++)
            for (st = 0; st < MP_DTYPE_COUNT; st++) {
                const void *src = f;
                void *out = dt == MP_FLOAT32 ? (void *)a32 : (void *)a16;
                void *ref = dt == MP_FLOAT32 ? (void *)p32 : (void *)p16;
                size_t bytes = (size_t)N * mp_dtype_size((mp_dtype)dt);
                mp_cast_stats s1, s2;
                int ok;
                if (st == dt) continue;
                if (st != MP_FLOAT32) {
                    mp_convert_portable(b16, (mp_dtype)st, f, MP_FLOAT32, N, NULL);
                    src = b16;
                }
                memset(&s1, 0, sizeof s1), memset(&s2, 0, sizeof s2);
                mp_convert(out, (mp_dtype)dt, src, (mp_dtype)st, N, &s1);
                mp_convert_portable(ref, (mp_dtype)dt, src, (mp_dtype)st, N, &s2);
                ok = same(out, ref, bytes) && same(&s1, &s2, sizeof s1);
                if (st != MP_FLOAT32 && dt != MP_FLOAT32) { /* in place: stats of the source */
                    memset(&s1, 0, sizeof s1);
                    mp_convert(b16, (mp_dtype)dt, b16, (mp_dtype)st, N, &s1);
                    ok = ok && same(b16, ref, bytes) && same(&s1, &s2, sizeof s1);
                }
                if (!CHECK(ok))
                    fprintf(stderr, "    %s <- %s pattern %d: overflow %llu/%llu underflow %llu/%llu subnormal %llu/%llu\n",
                            mp_dtype_name((mp_dtype)dt), mp_dtype_name((mp_dtype)st), pattern,
                            (unsigned long long)s1.overflow, (unsigned long long)s2.overflow,
                            (unsigned long long)s1.underflow, (unsigned long long)s2.underflow,
                            (unsigned long long)s1.subnormal, (unsigned long long)s2.subnormal);
            }
    }
}

static void test_convert_errors(void) {
    float in[4] = {1, 2, 3, 4};
    uint16_t out[4] = {0xAAAA, 0xAAAA, 0xAAAA, 0xAAAA};
    mp_cast_stats st;
    memset(&st, 0, sizeof st);
    CHECK(mp_convert(NULL, MP_FLOAT16, in, MP_FLOAT32, 4, &st) == MP_ERR_NULL);
    CHECK(mp_convert(out, MP_FLOAT16, NULL, MP_FLOAT32, 4, &st) == MP_ERR_NULL);
    CHECK(mp_convert(out, (mp_dtype)7, in, MP_FLOAT32, 4, &st) == MP_ERR_DTYPE);
    CHECK(mp_convert(out, MP_FLOAT16, in, (mp_dtype)-1, 4, &st) == MP_ERR_DTYPE);
    CHECK(mp_convert(out, MP_FLOAT16, in, MP_FLOAT32, SIZE_MAX / 2, &st) == MP_ERR_SIZE);
    CHECK(mp_convert(in, MP_FLOAT16, in, MP_FLOAT32, 4, &st) == MP_ERR_OVERLAP);
    CHECK(mp_convert(out, MP_FLOAT16, (const char *)in + 2, MP_FLOAT32, 1, &st) == MP_ERR_ALIGN);
    CHECK(mp_convert((char *)out + 1, MP_FLOAT16, in, MP_FLOAT32, 1, &st) == MP_ERR_ALIGN);
    CHECK(mp_convert(in + 1, MP_FLOAT32, in, MP_FLOAT16, 4, &st) == MP_ERR_OVERLAP);
    CHECK(out[0] == 0xAAAA && out[1] == 0xAAAA && out[3] == 0xAAAA && in[0] == 1.0f && in[1] == 2.0f);  /* nothing written */
    CHECK(st.count == 0);
    CHECK(mp_convert(out, MP_FLOAT16, in, MP_FLOAT32, 0, &st) == MP_OK);
    /* in place is fine when the element sizes match */
    CHECK(mp_convert(in, MP_FLOAT32, in, MP_FLOAT32, 4, NULL) == MP_OK && in[3] == 4.0f);
    mp_convert(out, MP_FLOAT16, in, MP_FLOAT32, 4, NULL);
    CHECK(mp_convert(out, MP_BFLOAT16, out, MP_FLOAT16, 4, NULL) == MP_OK);
    CHECK_EQ(out[2], 0x4040u); /* 3.0 in bfloat16 */
}

static void test_dtypes_policies_status(void) {
    static const struct { const char *name; mp_dtype compute, variable; } want[] = {
        {"float32", MP_FLOAT32, MP_FLOAT32}, {"float16", MP_FLOAT16, MP_FLOAT16},
        {"bfloat16", MP_BFLOAT16, MP_BFLOAT16}, {"mixed_float16", MP_FLOAT16, MP_FLOAT32},
        {"mixed_bfloat16", MP_BFLOAT16, MP_FLOAT32}};
    static const char *bad[] = {"", "Float32", "mixed_float32", "float64", "mixed_float16 ", "int32"};
    mp_policy p, keep = {MP_BFLOAT16, MP_BFLOAT16};
    mp_dtype d;
    char buf[64];
    size_t i;
    int s;
    CHECK(strcmp(mp_dtype_name(MP_BFLOAT16), "bfloat16") == 0 && mp_dtype_name((mp_dtype)9) == NULL);
    CHECK(mp_dtype_size(MP_FLOAT32) == 4 && mp_dtype_size(MP_FLOAT16) == 2 && mp_dtype_size((mp_dtype)3) == 0);
    CHECK(mp_dtype_from_name("float16", &d) == MP_OK && d == MP_FLOAT16);
    CHECK(mp_dtype_from_name("half", &d) == MP_ERR_UNKNOWN_DTYPE && d == MP_FLOAT16);
    CHECK(mp_dtype_from_name(NULL, &d) == MP_ERR_NULL);
    for (i = 0; i < sizeof want / sizeof want[0]; i++) {
        CHECK(mp_policy_from_name(want[i].name, &p) == MP_OK);
        CHECK(mp_policy_compute_dtype(p) == want[i].compute && mp_policy_variable_dtype(p) == want[i].variable);
        CHECK(strcmp(mp_policy_name(p), want[i].name) == 0);
    }
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = keep;
        CHECK(mp_policy_from_name(bad[i], &p) == MP_ERR_UNKNOWN_POLICY);
        CHECK(p.compute_dtype == keep.compute_dtype && p.variable_dtype == keep.variable_dtype);
    }
    CHECK(strstr(mp_status_message(MP_ERR_UNKNOWN_POLICY), "'mixed_float16', 'mixed_bfloat16'") != NULL);
    CHECK(strstr(mp_status_message(MP_ERR_UNKNOWN_POLICY), "'float32'") != NULL);
    CHECK(mp_policy_from_name(NULL, &p) == MP_ERR_NULL && mp_policy_from_name("float32", NULL) == MP_ERR_NULL);
    mp_policy_from_name("mixed_float16", &p);
    CHECK(mp_policy_repr(p, buf, sizeof buf) == MP_OK && strcmp(buf, "<Policy \"mixed_float16\">") == 0);
    memset(buf, 'x', sizeof buf);
    CHECK(mp_policy_repr(p, buf, 24) == MP_ERR_SIZE && buf[0] == 'x');   /* needs 25 */
    CHECK(mp_policy_repr(p, buf, 25) == MP_OK && buf[24] == '\0');
    CHECK(mp_policy_repr(p, NULL, 25) == MP_ERR_NULL);
    /* the global policy: float32 by default, as in Keras */
    p = mp_global_policy();
    CHECK(p.compute_dtype == MP_FLOAT32 && p.variable_dtype == MP_FLOAT32);
    CHECK(mp_set_global_policy_name("mixed_bfloat16") == MP_OK);
    CHECK(mp_global_policy().compute_dtype == MP_BFLOAT16 && mp_global_policy().variable_dtype == MP_FLOAT32);
    CHECK(mp_set_global_policy_name("fp16") == MP_ERR_UNKNOWN_POLICY);
    p.compute_dtype = MP_FLOAT32;
    p.variable_dtype = MP_FLOAT16;  /* not a named policy */
    CHECK(mp_set_global_policy(p) == MP_ERR_INVALID_POLICY && mp_policy_name(p) == NULL);
    CHECK(mp_policy_repr(p, buf, sizeof buf) == MP_ERR_INVALID_POLICY);
    CHECK(strcmp(mp_policy_name(mp_global_policy()), "mixed_bfloat16") == 0);  /* unchanged */
    CHECK(mp_set_global_policy_name("float32") == MP_OK);
    for (s = 0; s < MP_STATUS_COUNT; s++)
        CHECK(mp_status_message((mp_status)s)[0] != '\0' && strncmp(mp_status_name((mp_status)s), "MP_", 3) == 0);
    CHECK(strcmp(mp_status_name(MP_ERR_NULL), "MP_ERR_NULL") == 0);
    CHECK(strcmp(mp_status_message((mp_status)999), "unknown status code") == 0);
}

int main(int argc, char **argv) {
    check_args(argc, argv);
    RUN(test_f16_boundaries());
    RUN(test_bf16_boundaries());
    RUN(test_from_f64());
    RUN(test_arithmetic());
    RUN(test_arithmetic_pairs());
    RUN(test_comparisons_and_constants());
    RUN(test_bulk_matches_scalar());
    RUN(test_fpu_mode_independence());
    RUN(test_stats());
    RUN(test_stats_are_counts());
    RUN(test_stats_stretches());
    RUN(test_convert_errors());
    RUN(test_dtypes_policies_status());
    return check_done("test_core");
}
