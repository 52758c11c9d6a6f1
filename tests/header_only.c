/* header_only.c - the whole header, implementation included, and nothing
   else: the build matrix compiles it with the strictest warnings, as C++,
   with MIXPREC_STATIC and with every SIMD setting. */
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
