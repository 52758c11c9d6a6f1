/* oracle.h - an independent rounding oracle for the tests, written a
   different way from mixprec.h: double arithmetic and floor() instead of bit
   manipulation. It rounds any double to a binary format with p significand
   bits (implicit bit included), minimum normal exponent emin and ebits
   exponent bits, to nearest with ties to even (IEEE 754 4.3.1), with
   gradual underflow and overflow to Inf. The exact value must be a double:
   true for every float32, and for sums and products of two float16. */
#ifndef MIXPREC_ORACLE_H
#define MIXPREC_ORACLE_H
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct oracle_format { int p, emin, ebits; } oracle_format;
static const oracle_format ORACLE_F16 = {11, -14, 5};
static const oracle_format ORACLE_BF16 = {8, -126, 8};

/* 2^k, exactly, for -1022 <= k <= 1023 (the oracle needs |k| < 140). */
static double oracle_pow2(int k) {
    uint64_t u = (uint64_t)(1023 + k) << 52;
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* Bits of the correctly rounded value of x (NaN gives the canonical quiet
   NaN; the tests check NaN payloads apart). */
static uint16_t oracle_round(double x, oracle_format f) {
    uint32_t sign = signbit(x) ? 1u << (f.p + f.ebits - 1) : 0u;
    uint32_t inf = ((1u << f.ebits) - 1u) << (f.p - 1);
    double ax = fabs(x), q, fl, rest;
    int e, lead;
    uint64_t k, bits;
    if (isnan(x)) return (uint16_t)(inf | 1u << (f.p - 2));
    if (ax == 0.0) return (uint16_t)sign;
    if (isinf(x) || ax >= ldexp(1.0, 1 << (f.ebits - 1))) /* >= 2^(emax+1) */
        return (uint16_t)(sign | inf);
    frexp(ax, &e);                 /* ax = m * 2^e, m in [0.5, 1) */
    lead = e - 1 < f.emin ? f.emin : e - 1;  /* exponent of the ulp's binade */
    q = ax * oracle_pow2(f.p - 1 - lead);   /* ax in ulps: exact, power-of-two scaling */
    fl = floor(q);
    rest = q - fl;
    k = (uint64_t)fl;
    if (rest > 0.5 || (rest == 0.5 && (k & 1u))) k++;
    /* the encoding is monotone: exponent field counts binades above emin */
    bits = ((uint64_t)(lead - f.emin) << (f.p - 1)) + k;
    return (uint16_t)(sign | (bits >= inf ? inf : (uint32_t)bits));
}

/* The exact value of a format's bits, decoded with ldexp. */
static double oracle_value(uint16_t h, oracle_format f) {
    int sign = h >> (f.p + f.ebits - 1) & 1;
    int ef = (int)(h >> (f.p - 1)) & ((1 << f.ebits) - 1);
    int frac = h & ((1 << (f.p - 1)) - 1);
    double v;
    if (ef == (1 << f.ebits) - 1) v = frac ? NAN : INFINITY;
    else if (ef == 0) v = ldexp((double)frac, f.emin - (f.p - 1));
    else v = ldexp((double)(frac + (1 << (f.p - 1))), ef - 1 + f.emin - (f.p - 1));
    return sign ? -v : v;
}
#endif
