/* bench/convert.c - throughput of mixprec's bulk casts.

   For every direction between float32, float16 and bfloat16 it times, side by
   side (interleaved in each round, best of R rounds after one warm-up round):
       portable        mp_convert_portable(..., NULL)
       bulk            mp_convert(..., NULL)       (SIMD where compiled in)
       bulk_stats      mp_convert(..., &stats)
       portable_stats  mp_convert_portable(..., &stats)
       f16c            a plain F16C intrinsic loop (f32<->f16 only)
       memcpy          of the same number of destination bytes
   and prints one key=value line per measurement, then ratio lines:
       bulk_over_portable, bulk_over_f16c, bulk_over_memcpy: throughput of
           bulk divided by that of the other path (> 1: bulk is faster);
       stats_cost_bulk, stats_cost_portable: t(with stats)/t(without) - 1.

   Every line names its data set: `typical` (ReLU-like activations, all in
   float16's normal range) and `wide` (magnitudes 2^-30..2^20, the stats'
   worst case); see fill_typical and fill_wide. And its size n: by default
   4096 elements (source and destination in L1), 65536 (in L2) and 16M (32
   to 64 MiB: from memory); --n measures one size. A timed sample repeats
   the call until it has cast at least 4M elements, so that the clock's
   resolution does not matter at small sizes.

   Build and run: `make bench` (gcc and clang, -O2 -march=native), or
       cc -std=c99 -O2 -march=native bench/convert.c -o convert -lm
       ./convert [--n ELEMENTS] [--reps R]                  (single-threaded) */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>

#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#define BENCH_NAME "convert"
#include "bench.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

#if defined(MP__SIMD_AVX512)
#define SIMD_NAME "avx512"
#elif defined(MP__SIMD_X86)
#define SIMD_NAME "avx2_f16c"
#else
#define SIMD_NAME "none"
#endif

typedef void (*row_fn)(void *dst, const void *src, size_t n);
typedef mp_status (*convert_fn)(void *dst, mp_dtype dt, const void *src, mp_dtype st, size_t n,
                                mp_cast_stats *stats);

/* ---- what a user would write with F16C intrinsics ---------------------- */
#if defined(__F16C__)
static void f16c_f32_to_f16(void *dst, const void *src, size_t n) {
    const float *s = (const float *)src;
    unsigned short *d = (unsigned short *)dst;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_loadu_ps(s + i), b = _mm256_loadu_ps(s + i + 8);
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
        _mm_storeu_si128((__m128i *)(d + i + 8), _mm256_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; i++) d[i] = _cvtss_sh(s[i], _MM_FROUND_TO_NEAREST_INT);
}

static void f16c_f16_to_f32(void *dst, const void *src, size_t n) {
    const unsigned short *s = (const unsigned short *)src;
    float *d = (float *)dst;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i)));
        __m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i + 8)));
        _mm256_storeu_ps(d + i, a);
        _mm256_storeu_ps(d + i + 8, b);
    }
    for (; i < n; i++) d[i] = _cvtsh_ss(s[i]);
}
#define F16C_ROW(f) f
#else
#define F16C_ROW(f) NULL
#endif

/* ---- directions and variants ------------------------------------------- */
typedef struct direction {
    const char *name;
    mp_dtype dst, src;
    int has_f16c; /* an F16C baseline makes sense for this direction */
    row_fn f16c;  /* NULL where F16C was not compiled in */
} direction;

static const direction directions[] = {
    {"f32_to_f16", MP_FLOAT16, MP_FLOAT32, 1, F16C_ROW(f16c_f32_to_f16)},
    {"f16_to_f32", MP_FLOAT32, MP_FLOAT16, 1, F16C_ROW(f16c_f16_to_f32)},
    {"f32_to_bf16", MP_BFLOAT16, MP_FLOAT32, 0, NULL},
    {"bf16_to_f32", MP_FLOAT32, MP_BFLOAT16, 0, NULL},
    {"f16_to_bf16", MP_BFLOAT16, MP_FLOAT16, 0, NULL},
    {"bf16_to_f16", MP_FLOAT16, MP_BFLOAT16, 0, NULL},
};
#define N_DIRECTIONS (sizeof directions / sizeof directions[0])

/* One direction's buffers and the stats its last *_stats runs produced. */
typedef struct job {
    const direction *dir;
    void *dst;
    const void *src;      /* n elements of dir->src */
    const void *copy_src; /* at least 4 * n bytes, apart from dst */
    size_t n;
    size_t calls;         /* per timed sample */
    mp_cast_stats stats_bulk, stats_portable;
} job;

static void run_convert(const job *j, convert_fn f, mp_cast_stats *stats) {
    mp_status s;
    if (stats) memset(stats, 0, sizeof *stats);
    s = f(j->dst, j->dir->dst, j->src, j->dir->src, j->n, stats);
    if (s != MP_OK) {
        fprintf(stderr, "convert: %s: %s\n", j->dir->name, mp_status_message(s));
        exit(1);
    }
}

static void v_portable(job *j) { run_convert(j, mp_convert_portable, NULL); }
static void v_bulk(job *j) { run_convert(j, mp_convert, NULL); }
static void v_bulk_stats(job *j) { run_convert(j, mp_convert, &j->stats_bulk); }
static void v_portable_stats(job *j) { run_convert(j, mp_convert_portable, &j->stats_portable); }
static void v_f16c(job *j) { j->dir->f16c(j->dst, j->src, j->n); }
static void v_memcpy(job *j) { memcpy(j->dst, j->copy_src, j->n * mp_dtype_size(j->dir->dst)); }

enum { PORTABLE, BULK, BULK_STATS, PORTABLE_STATS, F16C, MEMCPY, N_VARIANTS };
static const struct { const char *name; void (*run)(job *); } variants[N_VARIANTS] = {
    {"portable", v_portable},     {"bulk", v_bulk}, {"bulk_stats", v_bulk_stats},
    {"portable_stats", v_portable_stats}, {"f16c", v_f16c}, {"memcpy", v_memcpy}};

static int variant_applies(const job *j, int v) { return v != F16C || j->dir->f16c != NULL; }

/* ---- timing ------------------------------------------------------------ */
static volatile unsigned sink; /* keeps every result observable */

static void consume(const job *j) {
    const unsigned char *b = (const unsigned char *)j->dst;
    size_t bytes = j->n * mp_dtype_size(j->dir->dst);
    sink += b[0] + b[bytes / 2] + b[bytes - 1] + (unsigned)j->stats_bulk.count;
}

/* best[v]: the minimum over reps rounds, after one warm-up round (rep -1),
   of the time of one call. Every round runs each variant (j->calls times
   in a row), starting at a rotating variant. */
static void measure(job *j, int reps, double best[N_VARIANTS]) {
    int rep, k;
    for (k = 0; k < N_VARIANTS; k++) best[k] = INFINITY;
    for (rep = -1; rep < reps; rep++) {
        for (k = 0; k < N_VARIANTS; k++) {
            int v = (k + rep + 1) % N_VARIANTS;
            double t0, t;
            size_t c;
            if (!variant_applies(j, v)) continue;
            t0 = now_s();
            for (c = 0; c < j->calls; c++) variants[v].run(j);
            t = (now_s() - t0) / (double)j->calls;
            consume(j);
            if (rep >= 0 && t < best[v]) best[v] = t;
        }
    }
}

/* ---- output ------------------------------------------------------------ */
#if defined(__clang__)
#define CC_NAME "clang-" MP_STR(__clang_major__)
#elif defined(__GNUC__)
#define CC_NAME "gcc-" MP_STR(__GNUC__)
#else
#define CC_NAME "unknown"
#endif
#define MP_STR_(x) #x
#define MP_STR(x) MP_STR_(x)

static const char *data_name = ""; /* the data set being measured, for the output lines */

static void print_ratio(const char *dir, const char *ratio, double value) {
    printf("bench=convert data=%s dir=%s ratio=%s value=%.3f\n", data_name, dir, ratio, value);
}

static int stats_equal(const mp_cast_stats *a, const mp_cast_stats *b) {
    return a->count == b->count && a->nan_in == b->nan_in && a->inf_in == b->inf_in &&
           a->overflow == b->overflow && a->underflow == b->underflow &&
           a->subnormal == b->subnormal && a->max_abs == b->max_abs && a->min_abs == b->min_abs;
}

static void report(const job *j, const double best[N_VARIANTS]) {
    const char *dir = j->dir->name;
    const mp_cast_stats *s = &j->stats_bulk;
    int v;
    for (v = 0; v < N_VARIANTS; v++) {
        if (!variant_applies(j, v)) continue;
        printf("bench=convert data=%s dir=%s path=%s n=%zu gelem_per_s=%.3f ns_per_elem=%.3f\n", data_name,
               dir, variants[v].name, j->n, (double)j->n / best[v] * 1e-9, best[v] / (double)j->n * 1e9);
    }
    if (j->dir->has_f16c && !j->dir->f16c)
        printf("bench=convert data=%s dir=%s path=f16c available=0 note=compile_with_-mf16c\n", data_name, dir);
    print_ratio(dir, "bulk_over_portable", best[PORTABLE] / best[BULK]);
    if (j->dir->f16c) print_ratio(dir, "bulk_over_f16c", best[F16C] / best[BULK]);
    print_ratio(dir, "stats_cost_bulk", best[BULK_STATS] / best[BULK] - 1.0);
    print_ratio(dir, "stats_cost_portable", best[PORTABLE_STATS] / best[PORTABLE] - 1.0);
    print_ratio(dir, "bulk_over_memcpy", best[MEMCPY] / best[BULK]);
    printf("bench=convert data=%s dir=%s info=stats overflow=%llu underflow=%llu subnormal=%llu "
           "inf_in=%llu stats_match=%d\n",
           data_name, dir, (unsigned long long)s->overflow, (unsigned long long)s->underflow,
           (unsigned long long)s->subnormal, (unsigned long long)s->inf_in,
           stats_equal(s, &j->stats_portable));
}

/* ---- data -------------------------------------------------------------- */
static unsigned long long rng_state = 0x9E3779B97F4A7C15ull;

static double uniform(void) { /* xorshift64, [0, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}

static double roughly_normal(void) { return uniform() + uniform() + uniform() + uniform() - 2.0; }

/* typical: what a ReLU network's activations look like: half zeros, the rest
   roughly normal with scale 1, one in a thousand an outlier up to 2^12; all
   within float16's normal range, so the stats' fast path takes most lanes.
   wide: roughly normal times 2^k, k uniform in [-30, 20]: float16 overflows
   at the top and underflows at the bottom, and nearly every 8-lane vector
   holds an unusual value, the stats' worst case. */
static void fill_typical(float *x, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        double g = roughly_normal();
        x[i] = uniform() < 0.5 ? 0.0f : (float)(uniform() < 0.001 ? ldexp(g, 12) : g);
        if (x[i] != 0.0f && fabsf(x[i]) < 1e-4f) x[i] = 1e-4f; /* keep it normal in float16 */
    }
}

static void fill_wide(float *x, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) x[i] = (float)ldexp(roughly_normal(), -30 + (int)(uniform() * 51.0));
}

static const struct { const char *name; void (*fill)(float *, size_t); } datasets[] = {
    {"typical", fill_typical}, {"wide", fill_wide}};
static void usage(const char *why, const char *flag) {
    fprintf(stderr, "convert: %s: %s\nusage: convert [--n ELEMENTS] [--reps R]\n", flag, why);
    exit(2);
}

static size_t parse_count(const char *flag, const char *arg, unsigned long long max) {
    char *end;
    unsigned long long v;
    if (!arg) usage("missing value", flag);
    v = strtoull(arg, &end, 10);
    if (*end || arg[0] == '-' || v == 0 || v > max) usage("needs a positive integer in range", flag);
    return (size_t)v;
}

/* Every direction and data set at size n. */
static void measure_size(size_t n, int reps) {
    size_t d, set, min_elements = (size_t)4 << 20;
    int i;
    void *data[MP_DTYPE_COUNT], *dst;
    for (i = 0; i < MP_DTYPE_COUNT; i++) data[i] = xmalloc(n * mp_dtype_size((mp_dtype)i));
    dst = xmalloc(n * 4);
    for (set = 0; set < sizeof datasets / sizeof datasets[0]; set++) {
        data_name = datasets[set].name;
        datasets[set].fill((float *)data[MP_FLOAT32], n);
        for (i = 1; i < MP_DTYPE_COUNT; i++)
            if (mp_convert(data[i], (mp_dtype)i, data[MP_FLOAT32], MP_FLOAT32, n, NULL) != MP_OK) {
                fprintf(stderr, "convert: cannot make the %s source data\n", mp_dtype_name((mp_dtype)i));
                exit(1);
            }
        for (d = 0; d < N_DIRECTIONS; d++) {
            job j;
            double best[N_VARIANTS];
            memset(&j, 0, sizeof j);
            j.dir = &directions[d];
            j.dst = dst;
            j.src = data[j.dir->src];
            j.copy_src = data[MP_FLOAT32];
            j.n = n;
            j.calls = n < min_elements ? (min_elements + n - 1) / n : 1;
            measure(&j, reps, best);
            report(&j, best);
            fflush(stdout);
        }
    }
    for (i = 0; i < MP_DTYPE_COUNT; i++) free(data[i]);
    free(dst);
}

int main(int argc, char **argv) {
    static const size_t sizes[] = {4096, 65536, (size_t)16 * 1024 * 1024}; /* L1, L2, memory */
    size_t n = 0, k;
    int reps = 5, i;
    for (i = 1; i < argc; i += 2) { /* every flag takes a value */
        const char *arg = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--n") == 0) n = parse_count(argv[i], arg, SIZE_MAX / 8);
        else if (strcmp(argv[i], "--reps") == 0) reps = (int)parse_count(argv[i], arg, 1000000);
        else usage("unknown flag", argv[i]);
    }
    printf("bench=convert simd=%s cc=%s threads=1\n", SIMD_NAME, CC_NAME);
    print_machine("convert");
    if (n) measure_size(n, reps);
    else
        for (k = 0; k < sizeof sizes / sizeof sizes[0]; k++) measure_size(sizes[k], reps);
    return 0;
}
