/* test_numerics.c - exhaustive checks of mixprec's numeric core, on all cores:
   - every one of the 2^32 float32 inputs to float16 and to bfloat16: the
     scalar function against the oracle (tests/oracle.h, written a different
     way), the SIMD bulk path and the portable bulk path against the scalar
     one, F16C hardware where the CPU has it, and the cast stats against a
     per-element count;
   - every float16 and bfloat16 value to float32, to each other, and back;
   - float16 add, sub and mul over all 2^32 pairs; float16 sqrt on every value;
     float16 div, and bfloat16 add, sub, mul, div on every value against a
     sample of divisors/operands that covers every boundary class; bfloat16
     sqrt on every value.
   The oracle for a result is the exact value (or the double-rounded one,
   which is innocuous at 53 >= 2p+2 bits) rounded by oracle_round.
   Under --quick (`make check`) each sweep takes a sample of its chunks:
   those that hold the format's boundary cases and every QUICK_STRIDE-th
   one; the matrix runs every input. */
#define _POSIX_C_SOURCE 200112L
#ifndef TEST_LINKS_MIXPREC /* defined: the implementation is another object's (tests/header_only.c) */
#define MIXPREC_IMPLEMENTATION
#endif
#include "../mixprec.h"
#include "check.h"
#include "oracle.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

static float f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
static uint32_t bits32(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }

/* ---- a parallel loop over [0, total) in chunks, with per-thread tallies */
enum { CHUNK = 1 << 16, MAX_THREADS = 64 };
typedef struct tally {
    uint64_t bad[8];      /* mismatches, by kind */
    uint64_t first[8];    /* first failing input of each kind */
} tally;
/* ctx: what the sweep checks, read-only while the threads run */
typedef void (*chunk_fn)(uint64_t begin, const void *ctx, tally *t);
typedef struct worker {
    const char *what;     /* the sweep's name, for its progress lines */
    chunk_fn fn;
    const void *ctx;
    const uint64_t *begins; /* each chunk's first input, or NULL: chunk j begins at j CHUNK */
    uint64_t chunks, *next; /* how many chunks; the next one to take */
    pthread_mutex_t *lock;
    tally t;
} worker;

/* A line at each quarter of a long sweep, so that `make test` is not silent
   for minutes (stdout is line-buffered; the caller holds the lock). */
static void progress(const worker *w, uint64_t j) {
    uint64_t quarter = w->chunks / 4;
    if (w->begins || w->chunks < (1ull << 32) / CHUNK || j == 0 || j >= w->chunks || j % quarter) return;
    printf("  %-44s %d%%\n", w->what, (int)(j / quarter) * 25);
}

static void *worker_main(void *arg) {
    worker *w = (worker *)arg;
    for (;;) {
        uint64_t j;
        pthread_mutex_lock(w->lock);
        j = (*w->next)++;
        progress(w, j);
        pthread_mutex_unlock(w->lock);
        if (j >= w->chunks) return NULL;
        w->fn(w->begins ? w->begins[j] : j * CHUNK, w->ctx, &w->t);
    }
}

static void parallel_chunks(const char *what, const uint64_t *begins, uint64_t chunks, chunk_fn fn, const void *ctx,
                            tally *out) {
    pthread_t th[MAX_THREADS];
    worker w[MAX_THREADS];
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    uint64_t next = 0;
    long n = sysconf(_SC_NPROCESSORS_ONLN), i, k;
    if (n < 1) n = 1;
    if (n > MAX_THREADS) n = MAX_THREADS;
    memset(out, 0, sizeof *out);
    for (i = 0; i < n; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].what = what, w[i].fn = fn, w[i].ctx = ctx, w[i].begins = begins, w[i].chunks = chunks;
        w[i].next = &next, w[i].lock = &lock;
        if (pthread_create(&th[i], NULL, worker_main, &w[i]) != 0) { n = i; break; }
    }
    if (n == 0) { /* no threads to be had: run here */
        worker one;
        memset(&one, 0, sizeof one);
        one.what = what, one.fn = fn, one.ctx = ctx, one.begins = begins, one.chunks = chunks;
        one.next = &next, one.lock = &lock;
        worker_main(&one);
        *out = one.t;
        return;
    }
    for (i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        for (k = 0; k < 8; k++) {
            if (w[i].t.bad[k] && (!out->bad[k] || w[i].t.first[k] < out->first[k])) out->first[k] = w[i].t.first[k];
            out->bad[k] += w[i].t.bad[k];
        }
    }
}

static double lap(void) { /* seconds since the last call */
    static struct timespec last;
    struct timespec now;
    double dt;
    clock_gettime(CLOCK_MONOTONIC, &now);
    dt = last.tv_sec ? (double)(now.tv_sec - last.tv_sec) + (double)(now.tv_nsec - last.tv_nsec) * 1e-9 : 0.0;
    last = now;
    return dt;
}

static void miss(tally *t, int kind, uint64_t input) {
    if (!t->bad[kind] || input < t->first[kind]) t->first[kind] = input;
    t->bad[kind]++;
}

static void report(const char *what, const tally *t, const char *const kinds[8]) {
    int k, ok = 1;
    for (k = 0; k < 8 && kinds[k]; k++) {
        ok &= check_report(t->bad[k] == 0, __FILE__, __LINE__, what);
        if (t->bad[k])
            fprintf(stderr, "    %s: %llu mismatches, first at input 0x%llx\n", kinds[k],
                    (unsigned long long)t->bad[k], (unsigned long long)t->first[k]);
    }
    printf("  %-44s %s  (%.1f s)\n", what, ok ? "ok" : "FAILED", lap());
}

/* One sweep over [0, total) and its report: every chunk, or under --quick
   the chunks that hold the inputs edges[0 .. n_edges) and every
   QUICK_STRIDE-th one (prime: the sample's values of each bit field vary). */
enum { QUICK_STRIDE = 251 };
static void sweep(const char *what, uint64_t total, chunk_fn fn, const void *ctx, const char *const kinds[8],
                  const uint64_t *edges, size_t n_edges) {
    uint64_t chunks = (total + CHUNK - 1) / CHUNK, *begins = NULL, n = 0, k;
    char title[96];
    tally t;
    if (check_quick) {
        begins = (uint64_t *)malloc((chunks / QUICK_STRIDE + 1 + n_edges) * sizeof *begins);
        if (!CHECK(begins != NULL)) return;
        for (k = 0; k < n_edges; k++) begins[n++] = edges[k] / CHUNK * CHUNK;
        for (k = 0; k < chunks; k += QUICK_STRIDE) begins[n++] = k * CHUNK;
        chunks = n;
    }
    snprintf(title, sizeof title, "%s%s", what, check_quick ? " (sampled)" : "");
    parallel_chunks(title, begins, chunks, fn, ctx, &t);
    report(title, &t, kinds);
    free(begins);
}

/* ---- float32 -> float16 / bfloat16, all 2^32 inputs */
enum { K_ORACLE, K_SCALAR_BULK, K_PORTABLE, K_HARDWARE, K_STATS };
static const char *const narrow_kinds[8] = {"scalar vs oracle", "SIMD bulk vs scalar", "portable bulk vs scalar",
                                            "F16C hardware vs scalar", "cast stats vs per-element count"};

/* the target of a narrowing sweep */
typedef struct target {
    int f16;               /* float16, else bfloat16 */
    mp_dtype dtype;
    oracle_format format;
    uint16_t inf, min_normal;
} target;

static uint16_t expected_narrow(uint32_t u, const target *g) {
    uint32_t a = u & 0x7FFFFFFFu, sign = u >> 31;
    if (a > 0x7F800000u) /* quieted, the top payload bits kept (the NaN rule of the header's doc block) */
        return (uint16_t)(g->f16 ? sign << 15 | 0x7E00u | (a & 0x7FFFFFu) >> 13 : sign << 15 | 0x7FC0u | (a & 0x7FFFFFu) >> 16);
    return oracle_round((double)f32(u), g->format);
}

/* Every field, the extremes bit for bit. */
static int same_stats(const mp_cast_stats *a, const mp_cast_stats *b) {
    return a->count == b->count && a->nan_in == b->nan_in && a->inf_in == b->inf_in && a->overflow == b->overflow &&
           a->underflow == b->underflow && a->subnormal == b->subnormal && bits32(a->max_abs) == bits32(b->max_abs) &&
           bits32(a->min_abs) == bits32(b->min_abs);
}

static void narrow_chunk(uint64_t begin, const void *ctx, tally *t) {
    const target *g = (const target *)ctx;
    uint32_t src[CHUNK];
    uint16_t bulk[CHUNK], port[CHUNK];
    mp_cast_stats st, stp;
    uint64_t nan = 0, infs = 0, over = 0, under = 0, sub = 0;
    size_t i;
    memset(&st, 0, sizeof st), memset(&stp, 0, sizeof stp);
    for (i = 0; i < CHUNK; i++) src[i] = (uint32_t)(begin + i);
    mp_convert(bulk, g->dtype, src, MP_FLOAT32, CHUNK, &st);
    mp_convert_portable(port, g->dtype, src, MP_FLOAT32, CHUNK, &stp);
    if (!same_stats(&st, &stp)) miss(t, K_STATS, begin);
    for (i = 0; i < CHUNK; i++) {
        uint32_t u = src[i], a = u & 0x7FFFFFFFu;
        uint16_t s = g->f16 ? mp_f16_from_f32(f32(u)).bits : mp_bf16_from_f32(f32(u)).bits;
        uint16_t r = s & 0x7FFFu;
        if (s != expected_narrow(u, g)) miss(t, K_ORACLE, u);
        if (bulk[i] != s) miss(t, K_SCALAR_BULK, u);
        if (port[i] != s) miss(t, K_PORTABLE, u);
#if defined(__F16C__)
        if (g->f16 && _cvtss_sh(f32(u), _MM_FROUND_TO_NEAREST_INT) != s) miss(t, K_HARDWARE, u);
#endif
        nan += a > 0x7F800000u;
        infs += a == 0x7F800000u;
        over += a < 0x7F800000u && r == g->inf;
        under += a != 0 && a <= 0x7F800000u && r == 0;
        sub += r != 0 && r < g->min_normal;
    }
    if (st.count != CHUNK || st.nan_in != nan || st.inf_in != infs || st.overflow != over ||
        st.underflow != under || st.subnormal != sub)
        miss(t, K_STATS, begin);
}

/* The float32 inputs whose chunks (2^16 inputs that share their top 16
   bits) --quick always takes: zero and float32's subnormals, its smallest
   normal, bfloat16's subnormal range and smallest normal, float16's
   underflow threshold (2^-25), smallest subnormal and smallest normal, one,
   float16's largest finite and overflow threshold (65504, 65520), 2^16,
   float32's largest finite, Inf and the NaNs; both signs. */
static size_t narrow_edges(uint64_t *out) {
    static const uint32_t edges[] = {0x00000000u, 0x00010000u, 0x007F0000u, 0x00800000u, 0x33000000u, 0x33800000u,
                                     0x387F0000u, 0x38800000u, 0x3F800000u, 0x477F0000u, 0x47800000u, 0x7F7F0000u,
                                     0x7F800000u, 0x7FC00000u, 0x7FFF0000u};
    size_t i, n = sizeof edges / sizeof edges[0];
    for (i = 0; i < n; i++) out[2 * i] = edges[i], out[2 * i + 1] = edges[i] | 0x80000000u;
    return 2 * n;
}

static void test_narrow_all_f32(void) {
    target f16 = {1, MP_FLOAT16, ORACLE_F16, 0x7C00u, 0x0400u};
    target bf16 = {0, MP_BFLOAT16, ORACLE_BF16, 0x7F80u, 0x0080u};
    uint64_t edges[32];
    size_t n_edges = narrow_edges(edges);
    sweep("all 2^32 float32 -> float16", 1ull << 32, narrow_chunk, &f16, narrow_kinds, edges, n_edges);
    sweep("all 2^32 float32 -> bfloat16", 1ull << 32, narrow_chunk, &bf16, narrow_kinds, edges, n_edges);
#if !defined(__F16C__)
    printf("  (F16C not enabled in this build: hardware comparison skipped)\n");
#endif
}

/* ---- every 16-bit value: widening, cross conversion, round trip */
static uint32_t expected_widen(uint16_t h, int f16) {
    oracle_format f = f16 ? ORACLE_F16 : ORACLE_BF16;
    double v = oracle_value(h, f);
    if (v != v) /* NaN: the payload moves up; float16 signalling NaNs are quieted */
        return (uint32_t)(h & 0x8000u) << 16 | 0x7F800000u |
               (f16 ? 0x400000u | (h & 0x3FFu) << 13 : (uint32_t)(h & 0x7Fu) << 16);
    return bits32((float)v);
}

static void test_all_16bit(void) {
    static uint16_t all[65536], cross[65536], back[65536];
    static float wide[65536], widep[65536];
    int f16;
    uint32_t i;
    for (i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    for (f16 = 1; f16 >= 0; f16--) {
        mp_dtype self = f16 ? MP_FLOAT16 : MP_BFLOAT16, other = f16 ? MP_BFLOAT16 : MP_FLOAT16;
        oracle_format of = f16 ? ORACLE_BF16 : ORACLE_F16;
        uint64_t bad_widen = 0, bad_trip = 0, bad_cross = 0, bad_hw = 0;
        mp_convert(wide, MP_FLOAT32, all, self, 65536, NULL);
        mp_convert_portable(widep, MP_FLOAT32, all, self, 65536, NULL);
        mp_convert(back, self, wide, MP_FLOAT32, 65536, NULL);
        mp_convert(cross, other, all, self, 65536, NULL);
        for (i = 0; i < 65536; i++) {
            uint16_t h = (uint16_t)i;
            uint32_t w = f16 ? bits32(mp_f16_to_f32(mp_f16_from_bits(h))) : bits32(mp_bf16_to_f32(mp_bf16_from_bits(h)));
            int nan = (h & 0x7FFFu) > (f16 ? 0x7C00u : 0x7F80u);
            uint16_t quiet = (uint16_t)(h | (f16 ? 0x200u : 0x40u));
            uint32_t x = expected_widen(h, f16);
            uint16_t c = nan ? (uint16_t)(f16 ? (x >> 16 & 0x8000u) | 0x7FC0u | (x & 0x7FFFFFu) >> 16
                                                : (x >> 16 & 0x8000u) | 0x7E00u | (x & 0x7FFFFFu) >> 13)
                             : oracle_round(oracle_value(h, f16 ? ORACLE_F16 : ORACLE_BF16), of);
            bad_widen += w != x || bits32(wide[i]) != x || bits32(widep[i]) != x;
            bad_trip += back[i] != (nan ? quiet : h);
            bad_cross += cross[i] != c;
#if defined(__F16C__)
            bad_hw += f16 && bits32(_cvtsh_ss(h)) != w;
#endif
        }
        CHECK(bad_widen == 0);
        CHECK(bad_trip == 0);
        CHECK(bad_cross == 0);
        CHECK(bad_hw == 0);
        printf("  all 65536 %-9s -> float32, round trip, -> %-9s %s\n", mp_dtype_name(self), mp_dtype_name(other),
               bad_widen + bad_trip + bad_cross + bad_hw ? "FAILED" : "ok");
    }
}

/* Every length below max_n from each source offset below src_offsets into
   each destination offset below dst_offsets (in elements), every direction,
   with stats and without: the SIMD path's results and stats as the
   portable one's. Returns the mismatches. */
static uint64_t bulk_tails(const float *wide, size_t max_n, size_t src_offsets, size_t dst_offsets,
                           uint64_t *cases) {
    static const mp_dtype types[3] = {MP_FLOAT32, MP_FLOAT16, MP_BFLOAT16};
    static float out_simd[160], out_port[160];
    uint64_t bad = 0;
    int s, d;
    for (s = 0; s < 3; s++)
        for (d = 0; d < 3; d++) {
            unsigned char src[128 * 4];
            size_t n, so, doff, esz = mp_dtype_size(types[s]), dsz = mp_dtype_size(types[d]);
            if (s == d) continue;
            mp_convert(src, types[s], wide, MP_FLOAT32, 128, NULL);
            for (n = 0; n < max_n; n++)
                for (so = 0; so < src_offsets; so++)
                    for (doff = 0; doff < dst_offsets; doff++) {
                        char *out = (char *)out_simd + doff * dsz;
                        const unsigned char *in = src + so * esz;
                        mp_cast_stats a, b;
                        memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
                        memset(out_simd, 0xA5, sizeof out_simd), memset(out_port, 0xA5, sizeof out_port);
                        mp_convert(out, types[d], in, types[s], n, &a);
                        mp_convert_portable((char *)out_port + doff * dsz, types[d], in, types[s], n, &b);
                        bad += memcmp(out_simd, out_port, sizeof out_simd) != 0 || !same_stats(&a, &b);
                        mp_convert(out, types[d], in, types[s], n, NULL);
                        bad += memcmp(out_simd, out_port, sizeof out_simd) != 0;
                        (*cases)++;
                    }
        }
    return bad;
}

/* The bulk paths against each other where the exhaustive sweeps do not
   reach: every 16-bit value's stats into each target, in place as well as
   apart, and every length 0..47 at every element offset 0..3 (the SIMD
   tails) of float32 data spread over 2^-30..2^19 with Inf and NaN in it;
   then every length 0..99 into a destination at each of 32 element offsets
   (the AVX-512 rows' masked head before the first 64-byte boundary). */
static void test_bulk_vs_portable(void) {
    static uint16_t all[65536], inplace[65536];
    static float scratch[65536], wide[128], out_simd[16], out_port[16];
    static const mp_dtype types[3] = {MP_FLOAT32, MP_FLOAT16, MP_BFLOAT16};
    uint64_t bad = 0, cases = 0;
    uint32_t i, r = 0x2545F491u;
    int s, d;
    for (i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    for (s = 1; s < 3; s++)
        for (d = 0; d < 3; d++) {
            mp_cast_stats a, b;
            memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
            mp_convert(out_simd, types[d], all, types[s], 16, &a); /* a short call first: stats add up */
            mp_convert_portable(out_port, types[d], all, types[s], 16, &b);
            mp_convert(scratch, types[d], all, types[s], 65536, &a);
            mp_convert_portable(scratch, types[d], all, types[s], 65536, &b);
            bad += !same_stats(&a, &b);
            if (types[d] != MP_FLOAT32) { /* in place: the stats see the source, the result is the cast's */
                memcpy(inplace, all, sizeof all);
                memset(&b, 0, sizeof b);
                mp_convert(inplace, types[d], inplace, types[s], 65536, &b);
                mp_convert_portable(scratch, types[d], all, types[s], 65536, NULL);
                bad += memcmp(inplace, scratch, sizeof inplace) != 0;
                memset(&a, 0, sizeof a);
                mp_convert_portable(scratch, types[d], all, types[s], 65536, &a);
                bad += !same_stats(&a, &b);
            }
            cases++;
        }
    for (i = 0; i < 128; i++) {
        r ^= r << 13, r ^= r >> 17, r ^= r << 5;
        wide[i] = ldexpf((float)(r & 0xFFFFu) / 65536.0f + 0.5f, (int)(r >> 16) % 50 - 30) * (r & 1u ? -1.0f : 1.0f);
    }
    wide[5] = INFINITY, wide[17] = NAN, wide[30] = 0.0f, wide[41] = 1e-45f;
    bad += bulk_tails(wide, 48, 4, 1, &cases) + bulk_tails(wide, 100, 1, 32, &cases);
    CHECK(bad == 0);
    printf("  bulk vs portable: 16-bit stats, in place, tails %s  (%llu cases)\n", bad ? "FAILED" : "ok",
           (unsigned long long)cases);
}

/* Calls long enough to span several of the SIMD path's blocks (2^20
   elements with AVX-512), each filled with one value, so that every
   per-lane counter reaches its largest count, and with the tails' data
   tiled, in a call long enough for the rows' streaming stores (2^24
   elements and more), the destination 0 to 3 elements past an
   allocation's start (by call), so that those rows' heads before their
   first aligned store differ: stats and results as the portable path's.
   --quick leaves out the tiled call. */
static void test_bulk_long(void) {
    static const mp_dtype types[3] = {MP_FLOAT32, MP_FLOAT16, MP_BFLOAT16};
    const float fills[] = {0.0f, -1e-30f, 1e-6f, 70000.0f, INFINITY, NAN, 1.5f, 0.0f /* tiled */};
    const size_t n_fill = (5u << 19) + 37, n_tiled = (17u << 20) + 37; /* 2.5 and 17 blocks, a tail */
    const size_t nfills = sizeof fills / sizeof fills[0], ncalls = nfills - (check_quick ? 1 : 0);
    float *x = (float *)malloc(n_tiled * 4);
    unsigned char *src = (unsigned char *)malloc(n_tiled * 4), *simd = (unsigned char *)malloc(n_tiled * 4 + 12),
                  *port = (unsigned char *)malloc(n_tiled * 4 + 12);
    uint64_t bad = 0, cases = 0;
    uint32_t r = 0x9E3779B9u;
    size_t f, i, n = 0;
    int s, d;
    CHECK(x && src && simd && port);
    for (f = 0; x && src && simd && port && f < ncalls; f++) {
        n = f + 1 < nfills ? n_fill : n_tiled;
        for (i = 0; i < n; i++) {
            r ^= r << 13, r ^= r >> 17, r ^= r << 5;
            x[i] = f + 1 < nfills ? fills[f] : ldexpf((float)(r & 0xFFFFu) / 65536.0f + 0.5f, (int)(r >> 16) % 52 - 31);
        }
        for (s = 0; s < 3; s++)
            for (d = 0; d < 3; d++) {
                mp_cast_stats a, b;
                size_t skip = (f + (size_t)s + (size_t)d) % 4 * mp_dtype_size(types[d]);
                unsigned char *out_simd = simd + skip, *out_port = port + skip;
                if (s == d) continue;
                mp_convert_portable(src, types[s], x, MP_FLOAT32, n, NULL);
                memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
                mp_convert(out_simd, types[d], src, types[s], n, &a);
                mp_convert_portable(out_port, types[d], src, types[s], n, &b);
                bad += memcmp(out_simd, out_port, n * mp_dtype_size(types[d])) != 0 || !same_stats(&a, &b);
                cases++;
            }
    }
    CHECK(bad == 0);
    printf("  bulk vs portable: calls of %zu", n_fill);
    if (ncalls == nfills) printf(" and %zu", n_tiled);
    printf(" elements %s  (%llu cases)\n", bad ? "FAILED" : "ok", (unsigned long long)cases);
    free(x), free(src), free(simd), free(port);
}

/* ---- arithmetic */
static const char *const op_kinds[8] = {"add", "mul", "sub", "div"};

static int same_result(uint16_t got, double exact, oracle_format f) {
    uint16_t inf = (uint16_t)(((1u << f.ebits) - 1u) << (f.p - 1));
    if (exact != exact) return (got & 0x7FFFu) > inf; /* any NaN */
    return got == oracle_round(exact, f);
}

/* every 16-bit value decoded once, before the threads start */
static double f16_values[65536], bf16_values[65536];
static void decode_all(void) {
    uint32_t i;
    for (i = 0; i < 65536; i++) {
        f16_values[i] = oracle_value((uint16_t)i, ORACLE_F16);
        bf16_values[i] = oracle_value((uint16_t)i, ORACLE_BF16);
    }
}
static double f16v(uint32_t h) { return f16_values[h & 0xFFFFu]; }
static double bf16v(uint32_t h) { return bf16_values[h & 0xFFFFu]; }

static void f16_pairs_chunk(uint64_t begin, const void *ctx, tally *t) {
    uint64_t i;
    (void)ctx; /* every pair: nothing to choose */
    for (i = begin; i < begin + CHUNK; i++) {
        mp_f16 a = mp_f16_from_bits((uint16_t)(i >> 16)), b = mp_f16_from_bits((uint16_t)i);
        double x = f16v(a.bits), y = f16v(b.bits);
        if (!same_result(mp_f16_add(a, b).bits, x + y, ORACLE_F16)) miss(t, 0, i); /* exact in double */
        if (!same_result(mp_f16_mul(a, b).bits, x * y, ORACLE_F16)) miss(t, 1, i); /* 22 bits: exact */
        if (!same_result(mp_f16_sub(a, b).bits, x - y, ORACLE_F16)) miss(t, 2, i); /* exact in double */
    }
}

/* Operands for the sampled tests: every boundary class of a format (zeros,
   smallest and largest subnormals, smallest normal, one and its neighbours,
   the largest finite, Inf, NaN) with both signs, and pseudo-random values. */
static size_t boundary_operands(uint16_t *out, size_t n, int f16) {
    static const uint16_t f16_edges[] = {0x0000, 0x0001, 0x0002, 0x03FF, 0x0400, 0x0401, 0x3BFF, 0x3C00,
                                         0x3C01, 0x4000, 0x5BFF, 0x7BFE, 0x7BFF, 0x7C00, 0x7C01, 0x7E00, 0x1400};
    static const uint16_t bf16_edges[] = {0x0000, 0x0001, 0x0002, 0x007F, 0x0080, 0x0081, 0x3F7F, 0x3F80,
                                          0x3F81, 0x4000, 0x7F7E, 0x7F7F, 0x7F80, 0x7F81, 0x7FC0, 0x3C00, 0x0100};
    const uint16_t *e = f16 ? f16_edges : bf16_edges;
    size_t k = 0, i;
    uint32_t r = 0x9E3779B9u;
    for (i = 0; i < 17; i++) {
        out[k++] = e[i];
        out[k++] = (uint16_t)(e[i] | 0x8000u);
    }
    while (k < n) {
        r ^= r << 13, r ^= r >> 17, r ^= r << 5;
        out[k++] = (uint16_t)r;
    }
    return k;
}

enum { NSAMPLE = 1024 };

/* ctx: the NSAMPLE second operands; chunk i pairs every value with one of them */
static void f16_div_chunk(uint64_t begin, const void *ctx, tally *t) {
    const uint16_t *operands = (const uint16_t *)ctx;
    uint64_t i;
    for (i = begin; i < begin + CHUNK && i < 65536ull * NSAMPLE; i++) {
        mp_f16 a = mp_f16_from_bits((uint16_t)(i % 65536)), b = mp_f16_from_bits(operands[i / 65536]);
        /* a/b in double is double-rounded: innocuous, 53 >= 2 * 11 + 2 */
        if (!same_result(mp_f16_div(a, b).bits, f16v(a.bits) / f16v(b.bits), ORACLE_F16)) miss(t, 3, i);
    }
}

static void bf16_ops_chunk(uint64_t begin, const void *ctx, tally *t) {
    const uint16_t *operands = (const uint16_t *)ctx;
    uint64_t i;
    for (i = begin; i < begin + CHUNK && i < 65536ull * NSAMPLE; i++) {
        mp_bf16 a = mp_bf16_from_bits((uint16_t)(i % 65536)), b = mp_bf16_from_bits(operands[i / 65536]);
        double x = bf16v(a.bits), y = bf16v(b.bits);
        /* sums may round in double (exponents up to 261 apart): innocuous, 53 >= 2 * 8 + 2 */
        if (!same_result(mp_bf16_add(a, b).bits, x + y, ORACLE_BF16)) miss(t, 0, i);
        if (!same_result(mp_bf16_mul(a, b).bits, x * y, ORACLE_BF16)) miss(t, 1, i);
        if (!same_result(mp_bf16_sub(a, b).bits, x - y, ORACLE_BF16)) miss(t, 2, i);
        if (!same_result(mp_bf16_div(a, b).bits, x / y, ORACLE_BF16)) miss(t, 3, i);
    }
}

/* The sampled sweeps' chunk j pairs every value with operand j: --quick
   takes the boundary operands (the first 34) and some random ones. The
   all-pairs sweep's chunk a pairs a with every value: --quick takes the
   float16 boundary values as a. */
static void test_arithmetic(void) {
    static uint16_t f16_operands[NSAMPLE], bf16_operands[NSAMPLE];
    uint64_t bad_sqrt = 0, edges[34];
    uint32_t i;
    boundary_operands(f16_operands, NSAMPLE, 1);
    for (i = 0; i < 34; i++) edges[i] = (uint64_t)f16_operands[i] << 16;
    sweep("float16 add, sub, mul: all 2^32 pairs", 1ull << 32, f16_pairs_chunk, NULL, op_kinds, edges, 34);
    for (i = 0; i < 34; i++) edges[i] = (uint64_t)i << 16;
    sweep("float16 div: 65536 x 1024 boundary/random", 65536ull * NSAMPLE, f16_div_chunk, f16_operands, op_kinds,
          edges, 34);
    boundary_operands(bf16_operands, NSAMPLE, 0);
    sweep("bfloat16 add/sub/mul/div: 65536 x 1024", 65536ull * NSAMPLE, bf16_ops_chunk, bf16_operands, op_kinds,
          edges, 34);
    for (i = 0; i < 65536; i++) { /* sqrt in double is correctly rounded, then innocuous */
        bad_sqrt += !same_result(mp_f16_sqrt(mp_f16_from_bits((uint16_t)i)).bits, sqrt(f16v(i)), ORACLE_F16);
        bad_sqrt += !same_result(mp_bf16_sqrt(mp_bf16_from_bits((uint16_t)i)).bits, sqrt(bf16v(i)), ORACLE_BF16);
    }
    CHECK(bad_sqrt == 0);
    printf("  float16, bfloat16 sqrt: all 65536 values    %s\n", bad_sqrt ? "FAILED" : "ok");
}

int main(int argc, char **argv) {
    check_args(argc, argv);
    setvbuf(stdout, NULL, _IOLBF, 0); /* each line as it is printed: the progress of make test */
    printf("%s numeric checks (%ld threads)\n", check_quick ? "sampled" : "exhaustive", sysconf(_SC_NPROCESSORS_ONLN));
    decode_all(); /* what every test reads, whichever run */
    lap();
    RUN(test_all_16bit());
    RUN(test_bulk_vs_portable());
    RUN(test_bulk_long());
    RUN(test_arithmetic());
    RUN(test_narrow_all_f32());
    return check_done("test_numerics");
}
