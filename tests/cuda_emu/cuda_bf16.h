/* cuda_bf16.h - the emulation's stand-in (see cuda_runtime.h here):
   __nv_bfloat16 and its conversions, bit for bit as the host path of CUDA's
   cuda_bf16.hpp (__internal_float2bfloat16): round to nearest even, every
   NaN the canonical 0x7FFF; widening is exact (a shift). */
#ifndef MIXPREC_CUDA_EMU_BF16_H
#define MIXPREC_CUDA_EMU_BF16_H
#include <string.h>
#include "cuda_runtime.h"

struct __nv_bfloat16 {
    unsigned short x;
};

static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    unsigned x, rem, r;
    __nv_bfloat16 b;
    memcpy(&x, &f, 4);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
        b.x = 0x7FFFu;
        return b;
    }
    r = x >> 16, rem = x << 16;
    if (rem > 0x80000000u || (rem == 0x80000000u && (r & 1u))) r++;
    b.x = (unsigned short)r;
    return b;
}

static inline float __bfloat162float(__nv_bfloat16 b) {
    unsigned u = (unsigned)b.x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
#endif
