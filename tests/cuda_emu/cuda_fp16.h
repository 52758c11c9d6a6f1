/* cuda_fp16.h - the emulation's stand-in (see cuda_runtime.h here): __half
   and the two conversions the backend uses, bit for bit as the host path of
   CUDA's cuda_fp16.hpp (__internal_float2half, __internal_half2float):
   round to nearest even, and every NaN becomes the canonical 0x7FFF (to
   float32: 0x7FFFFFFF), sign and payload dropped. */
#ifndef MIXPREC_CUDA_EMU_FP16_H
#define MIXPREC_CUDA_EMU_FP16_H
#include <string.h>
#include "cuda_runtime.h"

struct __half {
    unsigned short x;
};

static inline __half __float2half_rn(float f) {
    unsigned x, u, sign, r, rem;
    __half h;
    memcpy(&x, &f, 4);
    u = x & 0x7FFFFFFFu, sign = (x >> 16) & 0x8000u;
    if (u >= 0x7F800000u) r = u == 0x7F800000u ? sign | 0x7C00u : 0x7FFFu, rem = 0;
    else if (u > 0x477FEFFFu) r = sign | 0x7BFFu, rem = 0x80000000u; /* rounds to Inf below */
    else if (u >= 0x38800000u) rem = u << 19, r = sign | ((u - 0x38000000u) >> 13);
    else if (u < 0x33000001u) rem = u, r = sign;
    else {
        unsigned shift = 0x7Eu - (u >> 23), mant = (u & 0x7FFFFFu) | 0x800000u;
        rem = mant << (32 - shift), r = (sign | (mant >> shift)) & 0xFFFFu;
    }
    if (rem > 0x80000000u || (rem == 0x80000000u && (r & 1u))) r++;
    h.x = (unsigned short)r;
    return h;
}

static inline float __half2float(__half h) {
    unsigned sign = (unsigned)(h.x >> 15) & 1u, exp = (unsigned)(h.x >> 10) & 0x1Fu, mant = ((unsigned)h.x & 0x3FFu) << 13, u;
    float f;
    if (exp == 0x1Fu) sign = mant ? 0 : sign, mant = mant ? 0x7FFFFFu : 0, exp = 0xFFu;
    else if (exp == 0 && mant) {
        exp = 0x71u;
        do mant <<= 1, exp--; while (!(mant & 0x800000u));
        mant &= 0x7FFFFFu;
    } else if (exp) exp += 0x70u;
    u = sign << 31 | exp << 23 | mant;
    memcpy(&f, &u, 4);
    return f;
}
#endif
