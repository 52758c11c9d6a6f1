/* test_gemm.c - tests of mp_matmul and the thread pool: products against a
   float64 reference for every dtype mix the layers use, every transpose case
   and odd sizes that leave partial register and cache tiles; products of
   small integers that float32 accumulates exactly, which must match to the
   bit; results that do not depend on the thread count, down to the bit, for
   products and for whole training runs; NaN, Inf and overflow; and the error
   statuses. Runs in a few seconds, also under ASan/UBSan. */
#define _POSIX_C_SOURCE 199309L /* clock_gettime, for fit's epoch timer */
#define _DEFAULT_SOURCE         /* MAP_ANONYMOUS, for the fenced operands */
/* MIXPREC_BF16_DOT as the build sets it, or the header's documented
   default: vdpbf16ps but on Intel's cores (AVX512_FP16) */
#if defined(MIXPREC_BF16_DOT)
#define BF16_DOT_WANTED MIXPREC_BF16_DOT
#elif defined(__AVX512FP16__)
#define BF16_DOT_WANTED 0
#else
#define BF16_DOT_WANTED 1
#endif
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#include "check.h"
#define TEST_SEED 0x2545F4914F6CDD1Dull
#include "helpers.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* bfloat16 x bfloat16 may use AVX512_BF16 dot products or AMX's tiles
   (where the compiler enables AMX-BF16 and Linux grants the tiles), which
   both read bfloat16 subnormals as zero and flush subnormal results: where
   the compiler enables them the tolerance allows for that, elsewhere it
   must not happen. A build for an Intel core without AMX's tiles widens
   the operands instead (MIXPREC_BF16_DOT 0: exact). */
#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__F16C__) && defined(__AVX2__) && \
    !defined(MIXPREC_NO_SIMD)
#define BF16_MAY_FLUSH 1
#else
#define BF16_MAY_FLUSH 0
#endif

/* ======================================================================== */
/* Helpers */


static void *xalloc(size_t bytes) { /* exactly `bytes`, so ASan sees any overrun */
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test_gemm: out of memory\n");
        exit(2);
    }
    return p;
}

static const mp_dtype F32 = MP_FLOAT32, F16 = MP_FLOAT16, BF16 = MP_BFLOAT16;
/* A double rounded once to dtype t, back as a double. */
static double round_to(double x, mp_dtype t) {
    if (t == MP_FLOAT32) return (double)(float)x;
    if (t == MP_FLOAT16) return (double)mp_f16_to_f32(mp_f16_from_f64(x));
    return (double)mp_bf16_to_f32(mp_bf16_from_f64(x));
}
/* The spacing of dtype t's values at |x| (the subnormal spacing below the
   normal range): one ulp. */
static double ulp_of(double x, mp_dtype t) {
    int p = t == MP_FLOAT32 ? 24 : t == MP_FLOAT16 ? 11 : 8;
    int emin = t == MP_FLOAT16 ? -14 : -126, e;
    x = fabs(x);
    if (x == 0.0 || !isfinite(x)) e = emin + 1;
    else (void)frexp(x, &e); /* x in [2^(e-1), 2^e) */
    if (e - 1 < emin) e = emin + 1;
    return ldexp(1.0, e - p);
}
static int is_bf16_subnormal(float v) { return v != 0.0f && fabsf(v) < 1.17549435e-38f; }

/* A C buffer with guard elements on both sides, all set to a NaN pattern:
   mp_matmul must overwrite exactly the m x n elements (a GEMM that added to
   C would give NaN). */
#define GUARD 24
typedef struct cbuf {
    unsigned char *base; /* GUARD + count + GUARD elements */
    void *c;             /* the first of count */
    size_t count;
    mp_dtype t;
} cbuf;

static void fill_pattern(void *p, mp_dtype t, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        if (t == MP_FLOAT32) {
            uint32_t u = 0x7FC0BEEFu;
            memcpy((char *)p + 4 * i, &u, 4);
        } else {
            uint16_t h = t == MP_FLOAT16 ? 0x7E5Au : 0x7FDAu;
            memcpy((char *)p + 2 * i, &h, 2);
        }
    }
}
static cbuf cbuf_new(mp_dtype t, size_t count) {
    cbuf b;
    b.t = t;
    b.count = count;
    b.base = (unsigned char *)xalloc((count + 2 * GUARD) * dsize(t));
    fill_pattern(b.base, t, count + 2 * GUARD);
    b.c = b.base + GUARD * dsize(t);
    return b;
}
/* 1 if the guards (and, when `all`, the whole buffer) still hold the pattern. */
static int cbuf_untouched(const cbuf *b, int all) {
    size_t s = dsize(b->t), n = b->count + 2 * GUARD, i;
    unsigned char *want = (unsigned char *)xalloc(n * s);
    int ok = 1;
    fill_pattern(want, b->t, n);
    if (all) {
        ok = memcmp(want, b->base, n * s) == 0;
    } else {
        for (i = 0; i < GUARD * s; i++) ok &= b->base[i] == want[i];
        for (i = (GUARD + b->count) * s; i < n * s; i++) ok &= b->base[i] == want[i];
    }
    free(want);
    return ok;
}
static void cbuf_free(cbuf *b) { free(b->base); }

/* op(A) as an m x k float32 matrix and op(B) as its transpose, n x k, both
   with contiguous rows: the reference's inner loop reads both in order. */
static float *op_a(const void *a, mp_dtype t, int trans, size_t m, size_t k) {
    float *o = (float *)xalloc(m * k * sizeof(float));
    size_t i, p;
    for (i = 0; i < m; i++)
        for (p = 0; p < k; p++) o[i * k + p] = get(a, t, trans ? p * m + i : i * k + p);
    return o;
}
static float *op_bt(const void *b, mp_dtype t, int trans, size_t n, size_t k) {
    return op_a(b, t, !trans, n, k); /* op(B)^T is B's transpose exactly when op(B) is B */
}

/* ======================================================================== */
/* 1. mp_matmul against a float64 reference

   ref = sum_p a_ip b_pj accumulated in double over the float32 values of the
   (already rounded) inputs; products of float32 values are exact in double
   and k < 2^18 terms of magnitude S = sum |a_ip b_pj| leave an error below
   2^-35 S, negligible next to the bound. mp_matmul accumulates in float32 in
   some order (tiles, FMA or not, k split into blocks, CBLAS's order): any
   such sum is within gamma_k S <= (k + 1) u S of the exact sum, u = 2^-24
   (Higham, Accuracy and Stability, 3.1; products rounded or not), plus at
   most 2^-149 per operation where float32 underflows gradually. Then it
   rounds once into C's dtype, half an ulp; the reference rounded once to
   C's dtype is within another half ulp of the exact sum. So, with
   ulp_C = the spacing of C's dtype at max(|c|, |ref_C|):

       |c - ref_C| <= E + ulp_C,     E = (k + 2) u S + k 2^-149

   which is the form atol + rtol |ref|: atol = E plus the subnormal spacing
   of C's dtype, rtol = 2^-23 (float32), 2^-10 (float16) or 2^-7
   (bfloat16), one ulp of the output. E grows with k times the unit
   roundoff of the float32 accumulation; for float32 C it is (k + 2) 6e-8 S
   with S <= k max|a||b|, far tighter than 1e-5 k max|a||b|, and rigorous:
   a correct GEMM cannot fail it, whatever its order of summation.

   bfloat16 x bfloat16 with AVX512_BF16 (vdpbf16ps) adds pairs in its own
   order (covered by gamma_k) but reads subnormal bfloat16 as zero and
   flushes subnormal products and partial sums: E then also takes
   sum |a b| over the terms with a subnormal operand, plus 2 k 2^-126 for
   flushed partial results. The random data here are normal, so these terms
   are zero and normal-range data must match to the plain bound;
   test_bf16_subnormals covers the flushing itself.

   Products of integers in [-8, 8] with k <= 140001 stay below 2^24 at every
   partial sum, so float32 accumulation is exact in any order: c must then
   equal ref_C exactly, in every dtype. */

enum { DATA_REAL = 0, DATA_INT = 1, DATA_BF16_SUB = 2 };

static void fill_data(void *p, mp_dtype t, size_t n, int kind) {
    size_t i;
    for (i = 0; i < n; i++) {
        float v;
        if (kind == DATA_INT) {
            v = (float)((int)(rng_next() % 17) - 8);
        } else if (kind == DATA_BF16_SUB && rng_next() % 3 == 0) {
            /* a bfloat16 subnormal: 2^-127 .. 2^-133 */
            v = ldexpf(uniform(0.5f, 1.0f), -126 - (int)(rng_next() % 7));
            if (rng_next() & 1) v = -v;
        } else {
            /* [-1, 1] over 7 binades, some exact zeros */
            v = uniform(-1.0f, 1.0f) * ldexpf(1.0f, (int)(rng_next() % 7) - 3);
            if (rng_next() % 64 == 0) v = 0.0f;
            if (kind == DATA_BF16_SUB) v = ldexpf(v, 20);
        }
        put(p, t, i, v);
    }
}

typedef struct gemm_case {
    int ta, tb;
    size_t m, n, k;
    mp_dtype at, bt, ct;
    int kind;
} gemm_case;

static double worst_ratio; /* max |c - ref_C| / tolerance over all cases (for the log) */

/* Runs one product and compares every element; one check each for the
   status, the guards around C, A and B left as they were, and the values. */
static void run_case(mp_pool *pool, gemm_case g) {
    size_t m = g.m, n = g.n, k = g.k, i, j, p, bad = 0;
    void *a = xalloc(m * k * dsize(g.at)), *b = xalloc(k * n * dsize(g.bt));
    cbuf c = cbuf_new(g.ct, m * n);
    float *oa, *ob;
    mp_status st;
    int flush = BF16_MAY_FLUSH && g.at == MP_BFLOAT16 && g.bt == MP_BFLOAT16;
    char what[200];
    void *a0 = xalloc(m * k * dsize(g.at)), *b0 = xalloc(k * n * dsize(g.bt));
    fill_data(a, g.at, m * k, g.kind);
    fill_data(b, g.bt, k * n, g.kind);
    memcpy(a0, a, m * k * dsize(g.at));
    memcpy(b0, b, k * n * dsize(g.bt));
    snprintf(what, sizeof what, "%s x %s -> %s, trans (%d,%d), m %zu n %zu k %zu, %s data", dn(g.at), dn(g.bt),
             dn(g.ct), g.ta, g.tb, m, n, k,
             g.kind == DATA_INT ? "integer" : g.kind == DATA_REAL ? "random" : "subnormal bf16");
    st = mp_matmul(pool, g.ta, g.tb, m, n, k, a, g.at, b, g.bt, c.c, g.ct);
    if (!check_report(st == MP_OK, __FILE__, __LINE__, what)) {
        fprintf(stderr, "    status %s\n", mp_status_name(st));
        goto out;
    }
    if (!check_report(cbuf_untouched(&c, 0), __FILE__, __LINE__, what))
        fprintf(stderr, "    an element outside C[m x n] was written\n");
    if (!check_report(memcmp(a, a0, m * k * dsize(g.at)) == 0 && memcmp(b, b0, k * n * dsize(g.bt)) == 0, __FILE__,
                      __LINE__, what))
        fprintf(stderr, "    A or B was changed\n");
    oa = op_a(a, g.at, g.ta, m, k);
    ob = op_bt(b, g.bt, g.tb, n, k);
    for (i = 0; i < m; i++) {
        for (j = 0; j < n; j++) {
            const float *x = oa + i * k, *y = ob + j * k;
            double ref = 0.0, mag = 0.0, sub = 0.0, got, ref_c, err, tol;
            int ok;
            for (p = 0; p < k; p++) {
                double t = (double)x[p] * (double)y[p];
                ref += t;
                mag += fabs(t);
                if (flush && (is_bf16_subnormal(x[p]) || is_bf16_subnormal(y[p]))) sub += fabs(t);
            }
            got = (double)get(c.c, g.ct, i * n + j);
            ref_c = round_to(ref, g.ct);
            err = fabs(got - ref_c);
            if (g.kind == DATA_INT) {
                tol = 0.0;
            } else {
                tol = (double)(k + 2) * ldexp(1.0, -24) * mag + (double)k * ldexp(1.0, -149) +
                      ulp_of(fabs(got) > fabs(ref_c) ? got : ref_c, g.ct);
                if (flush) tol += sub + 2.0 * (double)k * ldexp(1.0, -126);
            }
            ok = err <= tol; /* NaN fails */
            if (ok && tol > 0 && err / tol > worst_ratio) worst_ratio = err / tol;
            if (!ok && bad++ == 0)
                fprintf(stderr, "    %s: first bad element C[%zu][%zu]: got %.9g, want %.9g (exact %.12g), tol %.3g\n",
                        what, i, j, got, ref_c, ref, tol);
        }
    }
    if (!check_report(bad == 0, __FILE__, __LINE__, what))
        fprintf(stderr, "    %zu of %zu elements out of tolerance\n", bad, m * n);
    free(oa);
    free(ob);
out:
    free(a);
    free(b);
    free(a0);
    free(b0);
    cbuf_free(&c);
}

/* The dtype mixes the layers use: all float32, all float16, all bfloat16,
   and 16-bit operands into a float32 C. */
static const mp_dtype layer_mixes[][3] = {
    {MP_FLOAT32, MP_FLOAT32, MP_FLOAT32}, {MP_FLOAT16, MP_FLOAT16, MP_FLOAT16},
    {MP_BFLOAT16, MP_BFLOAT16, MP_BFLOAT16}, {MP_BFLOAT16, MP_BFLOAT16, MP_FLOAT32},
    {MP_FLOAT16, MP_FLOAT16, MP_FLOAT32},
};
#define N_MIXES (sizeof layer_mixes / sizeof layer_mixes[0])

/* Every mix and transpose case over shapes that leave partial tiles of
   every size: m, n, k from {1, 2, 3, 5, 7, 8, 15, 16, 17, 31, 33, 63, 65,
   100, 129, 257, 300} and k = 255, 256, 513 around a 256 block; and m, n
   exactly one register tile (12 x 32 with AVX-512, 6 x 16 with AVX2, 4 x 16
   portable), whose runs pack as a plain copy of the source. Each shape
   runs every mix in every transpose case, random and integer data
   alternating; the large shapes take one data kind each so the test stays
   fast. */
static void test_products(void) {
    static const size_t shapes[][3] = {
        {1, 1, 1},     {1, 1, 513},   {2, 3, 1},      {3, 2, 5},      {5, 7, 3},      {7, 5, 2},
        {8, 16, 16},   {16, 8, 7},    {15, 17, 31},   {17, 15, 33},   {31, 33, 8},    {33, 31, 1},
        {63, 65, 17},  {65, 63, 15},  {1, 300, 65},   {300, 1, 63},   {2, 129, 256},  {129, 2, 255},
        {100, 33, 129}, {17, 100, 257}, {7, 31, 513}, {31, 7, 300},   {65, 129, 63},  {129, 65, 16},
        {257, 17, 100}, {16, 257, 65}, {100, 100, 31}, {63, 31, 513}, {300, 63, 3},   {5, 300, 100},
        {12, 32, 300}, {6, 16, 300},  {4, 16, 300},
    };
    size_t s, x;
    int t;
    for (s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        size_t work = shapes[s][0] * shapes[s][1] * shapes[s][2];
        for (x = 0; x < N_MIXES; x++) {
            for (t = 0; t < 4; t++) {
                gemm_case g;
                g.ta = t >> 1, g.tb = t & 1;
                g.m = shapes[s][0], g.n = shapes[s][1], g.k = shapes[s][2];
                g.at = layer_mixes[x][0], g.bt = layer_mixes[x][1], g.ct = layer_mixes[x][2];
                if (work <= 100000) {
                    g.kind = DATA_REAL;
                    run_case(NULL, g);
                    g.kind = DATA_INT;
                    run_case(NULL, g);
                } else {
                    g.kind = (int)((s + x + (size_t)t) & 1);
                    run_case(NULL, g);
                }
            }
        }
    }
}

/* Long sums and wide products: k = 1025 crosses two 512-deep bfloat16 pair
   slices and four 256-deep float slices with an odd remainder; k = 140001
   makes a B panel of the usual width too large, so panels narrow to a
   single register tile; n = 2100 takes more than one 2048-wide panel, and
   with k = 3000 panels narrower than that. m = 200 and k = 1300: three
   blocks of rows whose float32 op(A), not transposed, is packed several
   slices at a time, 1024 columns then 276 (C in float16, so that the
   float32 sums stay in the blocks, not in C). */
static void test_long_k(void) {
    size_t x;
    int t;
    for (x = 0; x < N_MIXES; x++)
        for (t = 0; t < 4; t++) {
            gemm_case g;
            g.ta = t >> 1, g.tb = t & 1;
            g.m = 3, g.n = 33, g.k = 1025;
            g.at = layer_mixes[x][0], g.bt = layer_mixes[x][1], g.ct = layer_mixes[x][2];
            g.kind = t & 1;
            run_case(NULL, g);
            g.m = 3, g.n = 2100, g.k = 17;
            run_case(NULL, g);
            if (x == 0 && g.ta == 0) {
                gemm_case w = g;
                w.m = 200, w.n = 40, w.k = 1300, w.at = w.bt = MP_FLOAT32, w.ct = MP_FLOAT16, w.kind = DATA_REAL;
                run_case(NULL, w);
            }
            if (t == (int)(x % 4)) {
                g.m = 1, g.n = 2100, g.k = 3000, g.kind = DATA_REAL;
                run_case(NULL, g);
                g.m = 2, g.n = 35, g.k = 140001;
                g.kind = DATA_INT; /* partial sums stay below 8 * 8 * 140001 < 2^24: exact */
                run_case(NULL, g);
                g.m = 1, g.n = 1, g.kind = DATA_REAL;
                run_case(NULL, g);
            }
        }
}

/* A narrow product, A B with n <= 16 (a 10-class layer's forward), or up
   to 64 in bfloat16 (a convolution's filters), whose tiles may read A and
   B where they lie (mp__in_place: float32 operands in AVX-512 builds,
   bfloat16 ones on AMX or vdpbf16ps), against its transpose B^T A^T,
   which never does: every element must have the same bits, -0, subnormals
   and infinities included (any NaN matches any NaN: which NaN a sum of two
   keeps depends on the order of its operands). k crosses one, two and five
   256-deep slices and ends mid AMX step, m ends mid tile and mid group of
   AMX's four, n ends mid tile of 16 and of 32 (two tiles: 40, 64), and C
   takes each dtype (float16 through the separate epilogue). */
static int same_or_both_nan(float x, float y) { return x != x ? y != y : memcmp(&x, &y, sizeof x) == 0; }
static void test_narrow_in_place(void) {
    static const size_t shapes[][3] = {{1, 1, 1},      {13, 10, 257}, {100, 16, 784}, {25, 3, 1030},
                                       {12, 10, 256}, {70, 10, 64},  {16, 10, 33},
                                       {13, 32, 257}, {40, 64, 130}, {25, 40, 1031}};
    static const float special[] = {-0.0f, 0.0f, 1e-40f, -3e-45f};
    static const mp_dtype operands[] = {MP_FLOAT32, MP_BFLOAT16};
    size_t s, i, j, o;
    int ct;
    for (o = 0; o < 2; o++)
        for (s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (ct = 0; ct < 3; ct++) {
                size_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2], bad = 0;
                mp_dtype t = (mp_dtype)ct, ot = operands[o];
                void *a, *b, *c, *ct_;
                char what[120];
#ifdef MIXPREC_USE_CBLAS
                if (ot == MP_FLOAT32 && t == MP_FLOAT32) { /* cblas_sgemm's sums, in an order of its own */
                    if (s == 0) printf("info: narrow float32 products into float32 skipped (cblas_sgemm)\n");
                    continue;
                }
#endif
                a = xalloc(m * k * dsize(ot)), b = xalloc(k * n * dsize(ot));
                c = zalloc(m * n * dsize(t)), ct_ = zalloc(m * n * dsize(t));
                fill_data(a, ot, m * k, DATA_REAL);
                fill_data(b, ot, k * n, DATA_REAL);
                for (i = 0; i < m * k; i += 7) put(a, ot, i, special[i / 7 % 4]);
                for (i = 3; i < k * n; i += 11) put(b, ot, i, special[i / 11 % 4]);
                put(a, ot, k / 2, INFINITY); /* row 0's sums: Inf or NaN */
                if (m > 1) put(a, ot, k + 1, -INFINITY);
                snprintf(what, sizeof what, "%s x %s -> %s, m %zu n %zu k %zu: A B against (B^T A^T)^T", dn(ot), dn(ot),
                         dn(t), m, n, k);
                if (check_report(mp_matmul(NULL, 0, 0, m, n, k, a, ot, b, ot, c, t) == MP_OK &&
                                     mp_matmul(NULL, 1, 1, n, m, k, b, ot, a, ot, ct_, t) == MP_OK,
                                 __FILE__, __LINE__, what)) {
                    for (i = 0; i < m; i++)
                        for (j = 0; j < n; j++)
                            bad += !same_or_both_nan(get(c, t, i * n + j), get(ct_, t, j * m + i));
                    if (!check_report(bad == 0, __FILE__, __LINE__, what))
                        fprintf(stderr, "    %zu of %zu elements differ\n", bad, m * n);
                }
                free(a);
                free(b);
                free(c);
                free(ct_);
            }
}

/* The bfloat16 kernels' packed pairs, word by word, where they are built:
   both source layouts, panels of op(B) (32 wide) and op(A) (12), a last
   group of panels and a last panel cut short, an odd K, and depth beyond
   the pairs (AMX's whole 16-pair steps, zeros), which products on a CPU
   without AMX never ask for. */
static void test_pack_pairs_layout(void) {
#ifdef MP__BF16_DOT
    static const size_t widths[] = {MP__NR, MP__MR};
    const size_t ld = 310, r0 = 3, rc = 300, q0 = 2, qc = 37, pairs = (qc + 1) / 2, depth = pairs + 5;
    uint16_t *x = (uint16_t *)xalloc(ld * ld * sizeof(uint16_t));
    size_t w, runs, g, p, r, i, bad, all_bad = 0;
    for (i = 0; i < ld * ld; i++) x[i] = (uint16_t)(i * 2654435761u >> 7);
    for (w = 0; w < 2; w++)
        for (runs = 0; runs < 2; runs++) {
            size_t width = widths[w], panels = (rc + width - 1) / width;
            uint32_t *out = (uint32_t *)xalloc(panels * width * depth * sizeof(uint32_t));
            memset(out, 0xA5, panels * width * depth * sizeof(uint32_t));
            mp__pack_pairs(out, width, !runs, x, ld, r0, rc, q0, qc, depth);
            for (bad = 0, g = 0; g < panels; g++)
                for (p = 0; p < depth; p++)
                    for (r = 0; r < width; r++) {
                        size_t col = r0 + g * width + r, q = q0 + 2 * p; /* X(q, col) */
                        uint32_t want = 0;
                        if (g * width + r < rc && 2 * p < qc) {
                            uint32_t lo = runs ? x[q * ld + col] : x[col * ld + q];
                            uint32_t hi = 2 * p + 1 >= qc ? 0u : runs ? x[(q + 1) * ld + col] : x[col * ld + q + 1];
                            want = lo | hi << 16;
                        }
                        bad += out[(g * depth + p) * width + r] != want;
                    }
            if (bad)
                fprintf(stderr, "    pairs packed from %s, width %zu: %zu words differ\n", runs ? "runs" : "rows", width,
                        bad);
            all_bad += bad;
            free(out);
        }
    CHECK(all_bad == 0);
    free(x);
#else
    /* one check either way, as the huge-pages test does, so that the count does not depend on the machine */
    printf("skip: bfloat16 pair packing (no AVX512_BF16 kernels in this build)\n");
    CHECK(1);
#endif
}

/* Any mix of the three dtypes for A, B and C (27), in two transpose cases. */
static void test_all_mixes(void) {
    int at, bt, ct, t;
    for (at = 0; at < 3; at++)
        for (bt = 0; bt < 3; bt++)
            for (ct = 0; ct < 3; ct++)
                for (t = 0; t < 4; t += 3) {
                    gemm_case g;
                    g.ta = t >> 1, g.tb = t & 1;
                    g.m = 19, g.n = 35, g.k = 41;
                    g.at = (mp_dtype)at, g.bt = (mp_dtype)bt, g.ct = (mp_dtype)ct;
                    g.kind = DATA_REAL;
                    run_case(NULL, g);
                    g.kind = DATA_INT;
                    run_case(NULL, g);
                }
}

/* With a pool, for a few shapes (the values; invariance is test_threads).
   The last two are deep and wide enough (a K block of 512 rows of 520)
   that the bfloat16 pack prefetches the rows ahead: op(B) in the first,
   op(A) transposed in the second. */
static void test_products_pooled(void) {
    static const size_t shapes[][3] = {{3, 257, 100}, {257, 3, 129}, {65, 100, 300}, {1, 1, 2},
                                       {9, 520, 1030}, {520, 9, 1030}};
    mp_pool *pool = NULL;
    size_t s, x;
    if (!CHECK(mp_pool_create(&pool, 3) == MP_OK)) return;
    for (s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (x = 0; x < N_MIXES; x++) {
            gemm_case g;
            g.ta = (int)(s & 1), g.tb = (int)((s >> 1) & 1);
            g.m = shapes[s][0], g.n = shapes[s][1], g.k = shapes[s][2];
            g.at = layer_mixes[x][0], g.bt = layer_mixes[x][1], g.ct = layer_mixes[x][2];
            g.kind = (int)(x & 1);
            run_case(pool, g);
        }
    mp_pool_destroy(pool);
}

/* bfloat16 subnormals: A's entries are partly subnormal (2^-127..2^-133),
   B's are scaled by 2^20 so that subnormal x normal products are normal
   float32 values. Without AVX512_BF16 the subnormals must be read as they
   are (the plain bound); with it, the bound allows them to read as zero.
   bfloat16 x float16 never goes through the dot products. */
static void test_bf16_subnormals(void) {
    int t;
    for (t = 0; t < 4; t++) {
        gemm_case g;
        g.ta = t >> 1, g.tb = t & 1;
        g.m = 13, g.n = 37, g.k = 70;
        g.at = BF16, g.bt = BF16, g.ct = F32;
        g.kind = DATA_BF16_SUB;
        run_case(NULL, g);
        g.ct = BF16;
        run_case(NULL, g);
    }
    {   /* float32 x bfloat16: widening keeps the subnormals, always */
        gemm_case g;
        g.ta = 0, g.tb = 1, g.m = 9, g.n = 20, g.k = 33;
        g.at = F32, g.bt = BF16, g.ct = F32, g.kind = DATA_BF16_SUB;
        run_case(NULL, g);
    }
    {   /* one exact case: A = 2^-130 (subnormal), B = 2^100: C = 2^-30 k, or
           0 where the dot products flush it */
        size_t k = 6, p;
        uint16_t a[6], b[6];
        float c = -1.0f;
        for (p = 0; p < k; p++) a[p] = mp_bf16_from_f32(ldexpf(1.0f, -130)).bits;
        for (p = 0; p < k; p++) b[p] = mp_bf16_from_f32(ldexpf(1.0f, 100)).bits;
        CHECK(a[0] == 0x0008u);
        if (CHECK(mp_matmul(NULL, 0, 0, 1, 1, k, a, BF16, b, BF16, &c, F32) == MP_OK)) {
            CHECK(MIXPREC_BF16_DOT == BF16_DOT_WANTED);
            if (BF16_MAY_FLUSH && (MIXPREC_BF16_DOT || mp__amx_usable())) CHECK(c == ldexpf(6.0f, -30) || c == 0.0f);
            else CHECK(c == ldexpf(6.0f, -30));
            printf("info: bfloat16 subnormal x bfloat16 (k = 6): %s\n",
                   c != 0.0f ? "read exactly" : mp__amx_usable() ? "read as zero (AMX tiles)" : "read as zero (AVX512_BF16)");
        }
    }
}

/* ======================================================================== */
/* 2. Thread-count invariance: pools of 1, 2, 3, 4 threads, and none, give
   the same bits; a pool used twice gives the same bits again. */

static void test_threads(void) {
    static const size_t shapes[][5] = {
        /* m, n, k, trans_a, trans_b */
        {2, 1500, 300, 0, 0}, {1500, 2, 300, 1, 0}, {3, 777, 65, 0, 1}, {777, 3, 65, 1, 1},
        {129, 257, 520, 1, 1}, {517, 41, 280, 0, 0}, {33, 700, 33, 0, 1}, {1, 1, 1, 0, 0},
        {3, 17, 3000, 1, 0}, /* fewer tiles than threads */
        {2, 2500, 60, 0, 1}, /* more than one 2048-wide panel */
        /* B panels of more than 1 MiB of bfloat16 pairs (4 MiB here): AMX's taller blocks */
        {197, 530, 4100, 0, 1}, {197, 530, 4100, 1, 0},
        {36, 200, 128, 1, 0}, /* bfloat16 on AMX splits this along M (op(B) small) */
        {128, 300, 10, 0, 1}, /* the 10-class input gradient: rows split mid-tile, op(B) transposed in one part block */
        {301, 10, 1030, 0, 0}, /* the 10-class forward: A read in place (mp__in_place), rows split mid-tile */
        {13, 10, 300, 0, 0},   /* in place, thread shares of fewer than 12 rows */
        {40, 10, 300, 0, 0},   /* in place on AMX, thread shares of fewer than 16 rows */
    };
    static const mp_dtype mixes[][3] = {
        {MP_FLOAT32, MP_FLOAT32, MP_FLOAT32}, {MP_FLOAT16, MP_FLOAT16, MP_FLOAT16},
        {MP_BFLOAT16, MP_BFLOAT16, MP_BFLOAT16}, {MP_BFLOAT16, MP_BFLOAT16, MP_FLOAT32},
        {MP_FLOAT16, MP_FLOAT16, MP_FLOAT32},
    };
    mp_pool *pools[5] = {NULL, NULL, NULL, NULL, NULL};
    int p, ok = 1;
    size_t s, x;
    for (p = 1; p <= 4; p++) {
        ok &= CHECK(mp_pool_create(&pools[p], p) == MP_OK && pools[p] != NULL);
#ifndef MIXPREC_NO_THREADS
        if (pools[p]) CHECK(mp_pool_threads(pools[p]) == p);
#else
        if (pools[p]) CHECK(mp_pool_threads(pools[p]) == 1 || mp_pool_threads(pools[p]) == p);
#endif
    }
    if (!ok) goto out;
    for (s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        size_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        int ta = (int)shapes[s][3], tb = (int)shapes[s][4];
        /* the big ones in two mixes only, to stay fast */
        size_t nmix = m * n * k > 1000000 ? 2 : sizeof mixes / sizeof mixes[0];
        for (x = 0; x < nmix; x++) {
            mp_dtype at = mixes[(x + s) % 5][0], bt = mixes[(x + s) % 5][1], ct = mixes[(x + s) % 5][2];
            void *a = xalloc(m * k * dsize(at)), *b = xalloc(k * n * dsize(bt));
            void *c0 = xalloc(m * n * dsize(ct)), *c = xalloc(m * n * dsize(ct));
            char what[160];
            fill_data(a, at, m * k, DATA_REAL);
            fill_data(b, bt, k * n, DATA_REAL);
            snprintf(what, sizeof what, "%s x %s -> %s, trans (%d,%d), m %zu n %zu k %zu", dn(at), dn(bt), dn(ct),
                     ta, tb, m, n, k);
            if (check_report(mp_matmul(NULL, ta, tb, m, n, k, a, at, b, bt, c0, ct) == MP_OK, __FILE__, __LINE__,
                             what)) {
                for (p = 1; p <= 5; p++) {
                    mp_pool *pool = pools[p == 5 ? 4 : p]; /* 5: the 4-thread pool again */
                    int same;
                    memset(c, 0xA5, m * n * dsize(ct));
                    same = mp_matmul(pool, ta, tb, m, n, k, a, at, b, bt, c, ct) == MP_OK &&
                           memcmp(c, c0, m * n * dsize(ct)) == 0;
                    if (!check_report(same, __FILE__, __LINE__, what))
                        fprintf(stderr, "    %d threads: C differs from the product without a pool\n",
                                mp_pool_threads(pool));
                }
            }
            free(a);
            free(b);
            free(c0);
            free(c);
        }
    }
out:
    for (p = 1; p <= 4; p++) mp_pool_destroy(pools[p]);
}

/* A float32 product longer than one K slice, with a small C, keeps its sums
   in C itself; split between threads it does so only where each thread's
   part is whole cache lines of C (C on a 64-byte line, rows a multiple of
   16 floats), else it takes the blocked order. Both, on 1 to 4 threads, the
   bits of the product without a pool; the bytes after C untouched. The
   shapes split N, M, and have fewer tiles than threads; edge tiles in M.
   The last two are shallow (k <= 64): with C on a line they split along
   N (the 10-class input gradient at batch 128), else along M. */
static void test_sums_in_c_threads(void) {
    static const size_t shapes[][5] = {
        /* m, n, k, trans_a, trans_b */
        {100, 320, 600, 1, 0}, {250, 64, 1030, 0, 0}, {13, 128, 2000, 1, 0}, {601, 32, 700, 0, 1},
        {128, 1024, 10, 0, 1}, {200, 80, 30, 0, 0},
    };
    enum { SLACK = 64 + 48 };
    mp_pool *pools[5] = {NULL, NULL, NULL, NULL, NULL};
    size_t s;
    int p, shift;
    for (p = 2; p <= 4; p++)
        if (!CHECK(mp_pool_create(&pools[p], p) == MP_OK)) goto out;
    for (s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        size_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2], bytes = m * n * sizeof(float), i;
        int ta = (int)shapes[s][3], tb = (int)shapes[s][4];
        float *a = (float *)xalloc(m * k * sizeof(float)), *b = (float *)xalloc(k * n * sizeof(float));
        float *c0 = (float *)xalloc(bytes);
        unsigned char *raw = (unsigned char *)xalloc(bytes + SLACK);
        fill_data(a, F32, m * k, DATA_REAL);
        fill_data(b, F32, k * n, DATA_REAL);
        if (!CHECK(mp_matmul(NULL, ta, tb, m, n, k, a, F32, b, F32, c0, F32) == MP_OK)) continue;
        for (shift = 0; shift <= 16; shift += 16) /* C on a line, then 16 bytes past one */
            for (p = 2; p <= 4; p++) {
                unsigned char *c = raw + (64 - (uintptr_t)raw % 64) % 64 + (size_t)shift;
                int same, untouched = 1;
                memset(raw, 0x7F, bytes + SLACK); /* 3.4e38 a float: sums that did not start from 0 show */
                same = mp_matmul(pools[p], ta, tb, m, n, k, a, F32, b, F32, c, F32) == MP_OK &&
                       memcmp(c, c0, bytes) == 0;
                for (i = (size_t)(c - raw) + bytes; i < bytes + SLACK; i++) untouched &= raw[i] == 0x7F;
                if (!CHECK(same && untouched))
                    fprintf(stderr, "    m %zu n %zu k %zu, %d threads, C %d bytes past a line: %s\n", m, n, k, p,
                            shift, same ? "bytes after C written" : "C differs from the product without a pool");
            }
        free(a), free(b), free(c0), free(raw);
    }
out:
    for (p = 2; p <= 4; p++) mp_pool_destroy(pools[p]);
}

/* A weight gradient with a small C and a long K splits along K on more
   than one thread (mp__split_k): thread 0 sums the first slices, the
   others each slice apart, added in K's order before the epilogue. On 2,
   3 and 4 threads, the bits of 1 thread, through every epilogue the
   merge runs (C += the product, bias and ReLU, ReLU's gradient; two of
   them a dtype mix), every C dtype, operands of each dtype, C wider than
   one NC block, rows that
   are not whole lines; and on 2 threads the split is taken, AMX's tiles
   summing each slice apart (3 and 4 threads split where the slices share
   out evenly enough). */
static void test_split_k(void) {
    /* m, n, k (16 slices, 8 pairs), and how many of the mixes (the wide C in two, to stay fast) */
    static const size_t shapes[][4] = {{12, 128, 4000, 6}, {13, 33, 4000, 6}, {5, 2100, 4000, 2}};
    static const mp_dtype mixes[][2] = {{F32, F32}, {BF16, BF16}, {F16, F32}, {F16, F16}, {BF16, F32}, {F32, BF16}};
    static const float gates[] = {0.0f, -0.0f, INFINITY, NAN, 1.0f, -1.0f};
    const mp_backend *cpu = mp_cpu_backend();
    void *ctx[5] = {NULL, NULL, NULL, NULL, NULL};
    size_t s, x, i;
    int t, e;
    for (t = 1; t <= 4; t++)
        if (!CHECK(cpu->create(&ctx[t], t, NULL) == MP_OK)) goto out;
    for (s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (x = 0; x < shapes[s][3]; x++)
            for (e = (int)(x % 2); e < 4; e += 2) { /* plain, C +=, bias and ReLU, ReLU's gradient: two a mix */
                size_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2], mn = m * n;
                mp_dtype ab = mixes[x][0], ct = mixes[x][1];
                void *a = xalloc(k * m * dsize(ab)), *b = xalloc(k * n * dsize(ab)), *y = xalloc(mn * dsize(ct));
                void *c0 = xalloc(mn * dsize(ct)), *c = xalloc(mn * dsize(ct)), *bias = xalloc(n * dsize(ct));
                void *before = xalloc(mn * dsize(ct));
                mp_gemm_args g;
                char what[160];
                fill_data(a, ab, k * m, DATA_REAL);
                fill_data(b, ab, k * n, DATA_REAL);
                fill_data(bias, ct, n, DATA_REAL);
                fill_data(before, ct, mn, DATA_REAL);
                for (i = 0; i < mn; i++) put(y, ct, i, gates[rng_next() % 6]);
                memset(&g, 0, sizeof g);
                g.trans_a = 1, g.m = m, g.n = n, g.k = k, g.a = a, g.b = b, g.at = g.bt = ab, g.ct = ct;
                g.accumulate = e == 1;
                g.bias = e >= 2 ? bias : NULL, g.biast = ct, g.act = e == 2 ? MP_RELU : MP_LINEAR;
                g.relu_y = e == 3 ? y : NULL;
                snprintf(what, sizeof what, "split along K: %s -> %s, m %zu n %zu k %zu, epilogue %d", dn(ab),
                         dn(ct), m, n, k, e);
                for (t = 1; t <= 4; t++) {
                    mp__k_split split;
                    g.c = t == 1 ? c0 : c;
                    memcpy(g.c, before, mn * dsize(ct));
                    cpu->gemm(ctx[t], &g);
                    if (t == 2 && /* 3: 16 slices not even enough; a build without threads has 1 */
                        !check_report(mp__pool_of(ctx[t])->threads < 2 || mp__split_k(&g, mp__pool_of(ctx[t]), &split),
                                      __FILE__, __LINE__, what))
                        fprintf(stderr, "    %d threads: not split along K\n", t);
                    if (t > 1 && !check_report(cpu->sync(ctx[t]) == MP_OK && memcmp(c, c0, mn * dsize(ct)) == 0,
                                               __FILE__, __LINE__, what))
                        fprintf(stderr, "    %d threads: C differs from 1 thread's\n", t);
                }
                free(a), free(b), free(y), free(c0), free(c), free(bias), free(before);
            }
out:
    for (t = 1; t <= 4; t++)
        if (ctx[t]) cpu->destroy(ctx[t]);
}

/* ReLU's gradient in the product's epilogue (mp_gemm_args's relu_y, the
   Dense layer's input gradient where the layer below ends in ReLU): the
   bits of the same product followed by the backend's act_backward, for
   every C dtype (the fused AVX-512 and AMX epilogues take float32 and
   bfloat16, the row epilogue float16), a product computed as its
   transpose (10 columns), bias and ReLU of its own, k = 0, 1 and 2
   threads, and a gate of +-0, +-Inf, NaN, subnormals and 1 (NaN is not > 0). */
static void test_relu_grad(void) {
    static const size_t shapes[][5] = {
        /* m, n, k, trans_a, trans_b */
        {37, 75, 40, 0, 1}, {200, 10, 64, 0, 1}, {13, 33, 0, 0, 0}, {130, 300, 700, 0, 1}, {70, 1030, 96, 1, 0},
    };
    static const mp_dtype mixes[][2] = {{F32, F32}, {BF16, BF16}, {BF16, F32}, {F16, F16}, {F16, F32}};
    static const float gates[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-45f, -1e-45f, 1.0f, -1.0f};
    const mp_backend *cpu = mp_cpu_backend();
    size_t s, x, i;
    int threads;
    for (threads = 1; threads <= 2; threads++) {
        void *ctx = NULL;
        if (!CHECK(cpu->create(&ctx, threads, NULL) == MP_OK)) return;
        for (s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (x = 0; x < sizeof mixes / sizeof mixes[0]; x++) {
                size_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2], mn = m * n;
                mp_dtype ab = mixes[x][0], ct = mixes[x][1];
                void *a = xalloc(m * k * dsize(ab) + 1), *b = xalloc(k * n * dsize(ab) + 1), *y = xalloc(mn * dsize(ct));
                void *c0 = xalloc(mn * dsize(ct)), *c1 = xalloc(mn * dsize(ct)), *bias = xalloc(n * dsize(ct));
                mp_gemm_args g;
                char what[160];
                fill_data(a, ab, m * k, DATA_REAL);
                fill_data(b, ab, k * n, DATA_REAL);
                fill_data(bias, ct, n, DATA_REAL);
                for (i = 0; i < mn; i++) put(y, ct, i, rng_next() % 3 ? gates[rng_next() % 9] : uniform(-1.0f, 1.0f));
                memset(&g, 0, sizeof g);
                g.trans_a = (int)shapes[s][3], g.trans_b = (int)shapes[s][4];
                g.m = m, g.n = n, g.k = k, g.a = a, g.b = b, g.at = g.bt = ab, g.c = c0, g.ct = ct;
                g.bias = s % 2 ? bias : NULL, g.biast = ct, g.act = s % 3 == 1 ? MP_RELU : MP_LINEAR;
                cpu->gemm(ctx, &g); /* the product, then ReLU's gradient as a layer's own step */
                cpu->act_backward(ctx, c0, ct, c0, y, NULL, m, n, MP_RELU, ct);
                g.c = c1, g.relu_y = y;
                memset(c1, 0xA5, mn * dsize(ct));
                cpu->gemm(ctx, &g);
                snprintf(what, sizeof what, "ReLU's gradient fused: %s -> %s, trans (%d,%d), m %zu n %zu k %zu, %d threads",
                         dn(ab), dn(ct), g.trans_a, g.trans_b, m, n, k, threads);
                check_report(cpu->sync(ctx) == MP_OK && memcmp(c0, c1, mn * dsize(ct)) == 0, __FILE__, __LINE__, what);
                free(a), free(b), free(y), free(c0), free(c1), free(bias);
            }
        cpu->destroy(ctx);
    }
}

/* Operands that end where their mapping does, an unreadable page after
   them: the packs read whole vectors, masked at a run's end (16-bit runs,
   AMX's tiles), and ASan does not see masked vector loads; a read past an
   operand's last element faults here. Each product must give the bits of
   the same product from ordinary buffers (on 2 threads there, 1 here). */
#ifdef __linux__
#include <sys/mman.h>
#include <unistd.h>

typedef struct fenced {
    char *base;
    size_t span;
    void *p; /* the operand: its last byte is the last readable one */
} fenced;

static int fence(fenced *f, const void *src, size_t bytes) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE), span = (bytes + page - 1) / page * page + page;
    void *b = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED) return 0;
    f->base = (char *)b, f->span = span, f->p = f->base + span - page - bytes;
    memcpy(f->p, src, bytes);
    if (mprotect(f->base + span - page, page, PROT_NONE) == 0) return 1;
    munmap(b, span);
    return 0;
}

static void test_fenced_operands(void) {
    /* m, n, k off every tile: AMX's 16 rows and 32 values of K, the 12 x 32
       and 6 x 16 register tiles, 16-lane vectors; the last two narrow, A
       read in place (mp__in_place) */
    static const size_t shapes[][3] = {{13, 37, 70}, {33, 45, 61}, {97, 50, 95}, {1, 33, 31}, {130, 70, 129},
                                       {37, 10, 70}, {13, 10, 95}};
    static const mp_dtype dts[] = {MP_FLOAT32, MP_FLOAT16, MP_BFLOAT16};
    mp_pool *pool = NULL;
    size_t s, d;
    int t;
    if (!CHECK(mp_pool_create(&pool, 2) == MP_OK)) return;
    for (s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (d = 0; d < sizeof dts / sizeof dts[0]; d++)
            for (t = 0; t < 4; t++) {
                size_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2], es = dsize(dts[d]);
                void *a = xalloc(m * k * es), *b = xalloc(k * n * es), *c0 = xalloc(m * n * es), *c = xalloc(m * n * es);
                fenced fa, fb;
                char what[120];
                snprintf(what, sizeof what, "%s, trans (%d,%d), m %zu n %zu k %zu, operands against unreadable pages",
                         dn(dts[d]), t >> 1, t & 1, m, n, k);
                fill_data(a, dts[d], m * k, DATA_REAL);
                fill_data(b, dts[d], k * n, DATA_REAL);
                if (check_report(fence(&fa, a, m * k * es), __FILE__, __LINE__, what)) {
                    if (check_report(fence(&fb, b, k * n * es), __FILE__, __LINE__, what)) {
                        check_report(mp_matmul(pool, t >> 1, t & 1, m, n, k, a, dts[d], b, dts[d], c0, dts[d]) == MP_OK &&
                                         mp_matmul(NULL, t >> 1, t & 1, m, n, k, fa.p, dts[d], fb.p, dts[d], c, dts[d]) ==
                                             MP_OK &&
                                         memcmp(c, c0, m * n * es) == 0,
                                     __FILE__, __LINE__, what);
                        munmap(fb.base, fb.span);
                    }
                    munmap(fa.base, fa.span);
                }
                free(a), free(b), free(c0), free(c);
            }
    mp_pool_destroy(pool);
}
#else
static void test_fenced_operands(void) { printf("info: fenced operands skipped (no Linux mmap here)\n"); }
#endif

/* ======================================================================== */
/* 3. Special values */

/* op(A) m x k and op(B) k x n with finite random entries and C's dtype;
   the caller sets op entries with set_op, then runs. */
typedef struct special {
    int ta, tb;
    size_t m, n, k;
    mp_dtype at, bt, ct;
    void *a, *b, *c;
} special;

static special special_new(int ta, int tb, size_t m, size_t n, size_t k, mp_dtype at, mp_dtype bt, mp_dtype ct) {
    special s;
    size_t i;
    s.ta = ta, s.tb = tb, s.m = m, s.n = n, s.k = k, s.at = at, s.bt = bt, s.ct = ct;
    s.a = xalloc(m * k * dsize(at));
    s.b = xalloc(k * n * dsize(bt));
    s.c = xalloc(m * n * dsize(ct));
    for (i = 0; i < m * k; i++) put(s.a, at, i, uniform(0.5f, 1.0f)); /* positive: no Inf - Inf */
    for (i = 0; i < k * n; i++) put(s.b, bt, i, uniform(0.5f, 1.0f));
    return s;
}
static void set_a(special *s, size_t i, size_t p, float v) { put(s->a, s->at, s->ta ? p * s->m + i : i * s->k + p, v); }
static void set_b(special *s, size_t p, size_t j, float v) { put(s->b, s->bt, s->tb ? j * s->k + p : p * s->n + j, v); }
static int special_run(special *s) {
    return mp_matmul(NULL, s->ta, s->tb, s->m, s->n, s->k, s->a, s->at, s->b, s->bt, s->c, s->ct) == MP_OK;
}
static float cat(const special *s, size_t i, size_t j) { return get(s->c, s->ct, i * s->n + j); }
static void special_free(special *s) {
    free(s->a);
    free(s->b);
    free(s->c);
}

/* Row i0 (and row i1) of C all `want` (NaN or +Inf), every other element finite. */
static int rows_are(const special *s, size_t i0, size_t i1, int want_nan) {
    size_t i, j;
    for (i = 0; i < s->m; i++)
        for (j = 0; j < s->n; j++) {
            float v = cat(s, i, j);
            int in_row = i == i0 || i == i1;
            if (in_row && (want_nan ? !isnan(v) : !(isinf(v) && v > 0))) return 0;
            if (!in_row && !isfinite(v)) return 0;
        }
    return 1;
}
static int cols_nan(const special *s, size_t j0) {
    size_t i, j;
    for (i = 0; i < s->m; i++)
        for (j = 0; j < s->n; j++) {
            float v = cat(s, i, j);
            if (j == j0 ? !isnan(v) : !isfinite(v)) return 0;
        }
    return 1;
}

static void test_nan_inf(void) {
    size_t x;
    int t;
    for (x = 0; x < N_MIXES; x++)
        for (t = 0; t < 4; t++) {
            mp_dtype at = layer_mixes[x][0], bt = layer_mixes[x][1], ct = layer_mixes[x][2];
            size_t m = 19, n = 37, k = 45;
            char what[120];
            special s;
            snprintf(what, sizeof what, "%s x %s -> %s, trans (%d,%d)", dn(at), dn(bt), dn(ct), t >> 1, t & 1);

            /* NaN in A (one in the last row and last column of op(A), one
               at the start of row 3) makes its rows NaN, and no other */
            s = special_new(t >> 1, t & 1, m, n, k, at, bt, ct);
            set_a(&s, m - 1, k - 1, NAN);
            set_a(&s, 3, 0, NAN);
            if (!check_report(special_run(&s) && rows_are(&s, m - 1, 3, 1), __FILE__, __LINE__, what))
                fprintf(stderr, "    NaN in op(A)[%zu][%zu] and op(A)[3][0]: rows %zu and 3 of C must be NaN, "
                                "the others finite\n", m - 1, k - 1, m - 1);
            special_free(&s);

            /* NaN in B: its column */
            s = special_new(t >> 1, t & 1, m, n, k, at, bt, ct);
            set_b(&s, k / 2, n - 1, NAN);
            if (!check_report(special_run(&s) && cols_nan(&s, n - 1), __FILE__, __LINE__, what))
                fprintf(stderr, "    NaN in op(B)[%zu][%zu]: column %zu of C must be NaN\n", k / 2, n - 1, n - 1);
            special_free(&s);

            /* Inf x 0 is NaN: op(A)[5][p] = Inf against a zero row of op(B) */
            s = special_new(t >> 1, t & 1, m, n, k, at, bt, ct);
            {
                size_t p = 33, j;
                set_a(&s, 5, p, INFINITY);
                for (j = 0; j < n; j++) set_b(&s, p, j, 0.0f);
                if (!check_report(special_run(&s) && rows_are(&s, 5, 5, 1), __FILE__, __LINE__, what))
                    fprintf(stderr, "    Inf in op(A)[5][33] times a zero row of op(B): row 5 of C must be NaN\n");
            }
            special_free(&s);

            /* -Inf in B times zeros in A: NaN column; here op(A)[:][0] = 0 */
            s = special_new(t >> 1, t & 1, m, n, k, at, bt, ct);
            {
                size_t i;
                set_b(&s, 0, 0, -INFINITY);
                for (i = 0; i < m; i++) set_a(&s, i, 0, 0.0f);
                if (!check_report(special_run(&s) && cols_nan(&s, 0), __FILE__, __LINE__, what))
                    fprintf(stderr, "    -Inf in op(B)[0][0] times a zero column of op(A): column 0 of C must be NaN\n");
            }
            special_free(&s);

            /* Inf times positive values: +Inf rows */
            s = special_new(t >> 1, t & 1, m, n, k, at, bt, ct);
            set_a(&s, 0, k - 1, INFINITY);
            if (!check_report(special_run(&s) && rows_are(&s, 0, 0, 0), __FILE__, __LINE__, what))
                fprintf(stderr, "    +Inf in op(A)[0][%zu], all else positive: row 0 of C must be +Inf\n", k - 1);
            special_free(&s);
        }
}

/* 1 x 1 products of k terms: c = sum a[p] b[p]. */
static float dot1(mp_dtype at, mp_dtype bt, mp_dtype ct, const float *av, const float *bv, size_t k, uint32_t *bits) {
    void *a = xalloc(k * dsize(at)), *b = xalloc(k * dsize(bt));
    unsigned char c[4] = {0xA5, 0xA5, 0xA5, 0xA5};
    size_t p;
    float r = -1.0f;
    for (p = 0; p < k; p++) put(a, at, p, av[p]);
    for (p = 0; p < k; p++) put(b, bt, p, bv[p]);
    *bits = 0xDEADu;
    if (mp_matmul(NULL, 0, 0, 1, 1, k, a, at, b, bt, c, ct) == MP_OK) {
        r = get(c, ct, 0);
        if (ct == MP_FLOAT32) memcpy(bits, c, 4);
        else {
            uint16_t h;
            memcpy(&h, c, 2);
            *bits = h;
        }
    }
    free(a);
    free(b);
    return r;
}

static void test_overflow(void) {
    static const float v200[3] = {200, 200, 200}, v150[3] = {150, 150, 150};
    static const float one[2] = {1, 1}, b19[2] = {65504, 15}, b20[2] = {65504, 16};
    static const float top[2] = {256, 0}, n255[2] = {255.875f, 0};
    uint32_t bits;
    float c;
    /* float16 C: 200 * 200 * 2 = 80000 and 150 * 150 * 3 = 67500 are past
       65504 (each product fits): Inf; 65504 + 15 rounds down to 65504,
       65504 + 16 = 65520 is the midpoint, which rounds to Inf */
    dot1(F16, F16, F16, v200, v200, 2, &bits);
    CHECK_EQ(bits, 0x7C00u);
    dot1(F16, F16, F16, v150, v150, 3, &bits);
    CHECK_EQ(bits, 0x7C00u);
    dot1(F32, F32, F16, v150, v150, 3, &bits);
    CHECK_EQ(bits, 0x7C00u);
    dot1(F16, F16, F16, one, b19, 2, &bits);
    CHECK_EQ(bits, 0x7BFFu);
    dot1(F16, F16, F16, one, b20, 2, &bits);
    CHECK_EQ(bits, 0x7C00u);
    dot1(F16, F16, F16, top, n255, 2, &bits); /* 256 * 255.875 = 65504 exactly */
    CHECK_EQ(bits, 0x7BFFu);
    /* the same sums into float32 C are exact: accumulation is float32 */
    c = dot1(F16, F16, F32, v200, v200, 2, &bits);
    CHECK(c == 80000.0f);
    c = dot1(F16, F16, F32, v150, v150, 3, &bits);
    CHECK(c == 67500.0f);
    c = dot1(F16, F16, F32, one, b20, 2, &bits);
    CHECK(c == 65520.0f);
    /* bfloat16 C overflows past 0x7F7F8000 */
    {
        static const float big[2] = {1e38f, 1e38f}, ten[2] = {10, 10};
        dot1(BF16, BF16, BF16, big, ten, 2, &bits);
        CHECK_EQ(bits, 0x7F80u);
    }
}

/* float32 C with huge terms: every product is +-1e38 and any partial sum of
   them stays below FLT_MAX (3.4e38), so any summation order is finite and
   the exact result, 1e38 (or 3e38), must come out finite and close. */
static void test_huge_finite(void) {
    static const float a5[5] = {1e19f, 1e19f, 1e19f, -1e19f, -1e19f}, b5[5] = {1e19f, 1e19f, 1e19f, 1e19f, 1e19f};
    static const mp_dtype ops[3] = {MP_FLOAT32, MP_BFLOAT16, MP_FLOAT32};
    int i;
    for (i = 0; i < 3; i++) {
        uint32_t bits;
        mp_dtype at = ops[i], bt = i == 2 ? MP_BFLOAT16 : ops[i];
        double ref = 0.0, c;
        int p;
        for (p = 0; p < 5; p++) {
            float x = at == MP_FLOAT32 ? a5[p] : mp_bf16_to_f32(mp_bf16_from_f32(a5[p]));
            float y = bt == MP_FLOAT32 ? b5[p] : mp_bf16_to_f32(mp_bf16_from_f32(b5[p]));
            ref += (double)x * (double)y;
        }
        c = (double)dot1(at, bt, F32, a5, b5, 5, &bits);
        if (!CHECK(isfinite(c) && fabs(c - ref) <= 1e-6 * fabs(ref)))
            fprintf(stderr, "    %s x %s -> f32: got %g, want %g\n", dn(at), dn(bt), c, ref);
        c = (double)dot1(at, bt, F32, b5, b5, 3, &bits); /* 3e38 */
        CHECK(isfinite(c) && c > 2.9e38);
    }
    {   /* a whole matrix of them, through the tiled path: A 40 x 5 rows of
           a5, B 5 x 50 all 1e19 */
        size_t m = 40, n = 50, k = 5, i2, bad = 0;
        float *a = (float *)xalloc(m * k * 4), *b = (float *)xalloc(k * n * 4), *c = (float *)xalloc(m * n * 4);
        for (i2 = 0; i2 < m * k; i2++) a[i2] = a5[i2 % k];
        for (i2 = 0; i2 < k * n; i2++) b[i2] = 1e19f;
        if (CHECK(mp_matmul(NULL, 0, 0, m, n, k, a, F32, b, F32, c, F32) == MP_OK)) {
            double ref = (double)1e19f * (double)1e19f; /* three products less two */
            for (i2 = 0; i2 < m * n; i2++) bad += !(isfinite(c[i2]) && fabs((double)c[i2] - ref) <= 1e-6 * ref);
            CHECK(bad == 0);
        }
        free(a);
        free(b);
        free(c);
    }
}

/* ======================================================================== */
/* 4. Bad input */

static void test_bad_input(void) {
    float a[16], b[16];
    cbuf c = cbuf_new(F32, 4);
    mp_status st;
    mp_pool *pool;
    int x, t;
    for (x = 0; x < 16; x++) a[x] = (float)x, b[x] = (float)(x % 5);
    /* NULLs */
    CHECK(mp_matmul(NULL, 0, 0, 2, 2, 3, NULL, F32, b, F32, c.c, F32) == MP_ERR_NULL);
    CHECK(mp_matmul(NULL, 0, 0, 2, 2, 3, a, F32, NULL, F32, c.c, F32) == MP_ERR_NULL);
    CHECK(mp_matmul(NULL, 0, 0, 2, 2, 3, a, F32, b, F32, NULL, F32) == MP_ERR_NULL);
    CHECK(mp_matmul(NULL, 1, 1, 2, 2, 3, a, F16, b, BF16, NULL, F16) == MP_ERR_NULL);
    /* dtypes out of range, each position */
    CHECK(mp_matmul(NULL, 0, 0, 2, 2, 3, a, MP_DTYPE_COUNT, b, F32, c.c, F32) == MP_ERR_DTYPE);
    CHECK(mp_matmul(NULL, 0, 0, 2, 2, 3, a, F32, b, MP_DTYPE_COUNT, c.c, F32) == MP_ERR_DTYPE);
    CHECK(mp_matmul(NULL, 0, 0, 2, 2, 3, a, F32, b, F32, c.c, MP_DTYPE_COUNT) == MP_ERR_DTYPE);
    CHECK(mp_matmul(NULL, 0, 0, 2, 2, 3, a, (mp_dtype)77, b, F16, c.c, F16) == MP_ERR_DTYPE);
    CHECK(cbuf_untouched(&c, 1));
    cbuf_free(&c);
    {   /* C over A or B, wholly or by one element, at either end: the kernels
           write C while they read them. A and B untouched. */
        float buf[24], keep[24];
        for (x = 0; x < 24; x++) buf[x] = keep[x] = (float)x;
        CHECK(mp_matmul(NULL, 0, 0, 2, 2, 3, buf, F32, b, F32, buf, F32) == MP_ERR_OVERLAP);
        CHECK(mp_matmul(NULL, 0, 0, 2, 2, 3, a, F32, buf + 4, F32, buf + 1, F32) == MP_ERR_OVERLAP);
        CHECK(mp_matmul(NULL, 0, 0, 2, 2, 3, buf + 3, F32, b, F32, buf, F32) == MP_ERR_OVERLAP); /* C's last, A's first */
        CHECK(mp_matmul(NULL, 1, 0, 2, 2, 3, buf + 4, BF16, buf + 10, F16, buf + 8, F32) == MP_ERR_OVERLAP);
        CHECK(memcmp(buf, keep, sizeof buf) == 0);
        /* touching but apart: C right after A, right before B */
        CHECK(mp_matmul(NULL, 0, 0, 2, 2, 3, buf, F32, buf + 10, F32, buf + 6, F32) == MP_OK);
    }
    {   /* any nonzero trans flag means transposed, as in C */
        float c1[6], c2[6];
        memset(c2, 0xA5, sizeof c2);
        CHECK(mp_matmul(NULL, 1, 1, 2, 3, 4, a, F32, b, F32, c1, F32) == MP_OK &&
              mp_matmul(NULL, 2, -1, 2, 3, 4, a, F32, b, F32, c2, F32) == MP_OK && memcmp(c1, c2, sizeof c1) == 0);
    }

    /* m, n or k of 0. An empty C is nothing to do: MP_OK (MP_ERR_ARG would
       be defensible; which one is reported). k = 0 is an empty sum: C = +0. */
    for (x = 0; x < 3; x++) {
        size_t m = x == 0 ? 0 : 3, n = x == 1 ? 0 : 3, k = x == 2 ? 0 : 3;
        for (t = 0; t < 3; t++) {
            mp_dtype ct = (mp_dtype)t;
            c = cbuf_new(ct, 9);
            st = mp_matmul(NULL, x & 1, 0, m, n, k, a, t == 2 ? BF16 : F32, b, t == 2 ? BF16 : F32, c.c, ct);
            if (k) {
                if (!CHECK(st == MP_OK || st == MP_ERR_ARG))
                    fprintf(stderr, "    m %zu n %zu: %s\n", m, n, mp_status_name(st));
                CHECK(cbuf_untouched(&c, 1));
                if (t == 0) printf("info: mp_matmul with %s = 0 returns %s\n", m ? "n" : "m", mp_status_name(st));
            } else {
                size_t i;
                int zero = 1;
                CHECK(st == MP_OK);
                for (i = 0; i < 9; i++) zero &= get(c.c, ct, i) == 0.0f && !signbit(get(c.c, ct, i));
                if (!CHECK(zero)) fprintf(stderr, "    k = 0 into %s C: C must be +0\n", dn(ct));
                CHECK(cbuf_untouched(&c, 0));
            }
            cbuf_free(&c);
        }
    }
    {   /* k = 0 with every transpose case and a pool */
        mp_pool *p2 = NULL;
        CHECK(mp_pool_create(&p2, 2) == MP_OK);
        for (t = 0; t < 4; t++) {
            size_t i;
            int zero = 1;
            c = cbuf_new(F32, 40 * 33);
            CHECK(mp_matmul(p2, t >> 1, t & 1, 40, 33, 0, a, F32, b, F32, c.c, F32) == MP_OK);
            for (i = 0; i < 40 * 33; i++) zero &= get(c.c, F32, i) == 0.0f && !signbit(get(c.c, F32, i));
            CHECK(zero && cbuf_untouched(&c, 0));
            cbuf_free(&c);
        }
        mp_pool_destroy(p2);
    }

    /* the pool */
    pool = (mp_pool *)(void *)&x; /* a sentinel that must stay */
    CHECK(mp_pool_create(&pool, -1) == MP_ERR_ARG);
    CHECK(pool == (mp_pool *)(void *)&x);
    CHECK(mp_pool_create(&pool, -1000) == MP_ERR_ARG);
    CHECK(mp_pool_create(NULL, 2) == MP_ERR_NULL);
    CHECK(mp_pool_threads(NULL) == 1);
    CHECK(mp_available_cores() >= 1);
#ifdef MIXPREC_NO_THREADS
    CHECK(mp_available_cores() == 1);
#endif
    mp_pool_destroy(NULL);
    pool = NULL;
    if (CHECK(mp_pool_create(&pool, 0) == MP_OK && pool != NULL)) {
        CHECK(mp_pool_threads(pool) == mp_available_cores());
        mp_pool_destroy(pool);
    }
    printf("info: mp_available_cores() = %d\n", mp_available_cores());
}

/* Sizes whose element or byte counts overflow size_t: no buffer can be that
   large, so they are MP_ERR_SIZE, and nothing is read or written. Last in
   main: an implementation that goes on to read A or B crashes here. */
static void test_sizes(void) {
    float a[16] = {0}, b[16] = {0};
    const size_t big = SIZE_MAX / 2 + 1;
    cbuf c = cbuf_new(F32, 4);
    CHECK(mp_matmul(NULL, 0, 0, big, 1, 2, a, F32, b, F32, c.c, F32) == MP_ERR_SIZE); /* m k */
    CHECK(mp_matmul(NULL, 0, 0, 1, big, 2, a, F32, b, F32, c.c, F32) == MP_ERR_SIZE); /* k n */
    CHECK(mp_matmul(NULL, 0, 0, SIZE_MAX / 4, SIZE_MAX / 4, 1, a, F32, b, F32, c.c, F32) == MP_ERR_SIZE); /* m n */
    CHECK(mp_matmul(NULL, 1, 1, 3, 2, SIZE_MAX / 3 + 1, a, F16, b, F16, c.c, F16) == MP_ERR_SIZE);
    /* elements fit, bytes do not: C of SIZE_MAX / 4 + 1 floats */
    CHECK(mp_matmul(NULL, 0, 0, SIZE_MAX / 4 + 1, 1, 1, a, F32, b, F32, c.c, F32) == MP_ERR_SIZE);
    CHECK(mp_matmul(NULL, 0, 0, 1, 1, big, a, F16, b, F16, c.c, F32) == MP_ERR_SIZE);
    CHECK(cbuf_untouched(&c, 1));
    /* A's or B's elements fit in size_t, their bytes do not, while C's do:
       A = (SIZE_MAX / 8) x 4 float32 (2^63 elements, 2^65 bytes), A =
       (SIZE_MAX / 4) x 3 float16, B = 4 x (SIZE_MAX / 8) float32 */
    CHECK(mp_matmul(NULL, 0, 0, SIZE_MAX / 8, 1, 4, a, F32, b, F32, c.c, F16) == MP_ERR_SIZE);
    CHECK(mp_matmul(NULL, 1, 0, SIZE_MAX / 4, 1, 3, a, F16, b, F16, c.c, F16) == MP_ERR_SIZE);
    CHECK(mp_matmul(NULL, 0, 1, 1, SIZE_MAX / 8, 4, a, F32, b, F32, c.c, F16) == MP_ERR_SIZE);
    CHECK(cbuf_untouched(&c, 1));
    cbuf_free(&c);
}

/* ======================================================================== */
/* 5. Models: threads = 1 and threads = 2 train to the same bits */

static float *xs;
static int32_t *labels;
/* The dense model's inputs are 1030 wide, so its first product sums more
   than four 256-deep slices: a thread count that changed the order of the
   sum would show. The larger conv model (kind 2: 18 x 18 x 3 images, 972
   values, within a dense row) has enough values a batch of 33 that its
   im2col, col2im (padded and not), max pooling (windows that leave cells
   uncovered too) and dropout split their images or values between the
   threads (MP__RANGE_PARALLEL). */
enum { NS = 96, IN_FLAT = 1030, IMG = 9, IMG_C = 2, BIG = 18, BIG_C = 3, CLASSES = 5, X_FLOATS = NS * IN_FLAT };

/* kind 0: dense, 1: a small conv model, 2: the larger one */
static mp_model *model_for(const char *policy, int threads, int conv) {
    mp_model_desc md;
    mp_compile_desc cd;
    mp_model *m = NULL;
    mp_layer_desc sm = mp_activation_layer(MP_SOFTMAX);
    int ok;
    memset(&md, 0, sizeof md);
    if (conv == 1) md.input_shape[0] = IMG, md.input_shape[1] = IMG, md.input_shape[2] = IMG_C;
    else if (conv == 2) md.input_shape[0] = BIG, md.input_shape[1] = BIG, md.input_shape[2] = BIG_C;
    else md.input_shape[0] = IN_FLAT;
    md.seed = 11;
    md.threads = threads;
    sm.dtype = "float32";
    ok = CHECK(mp_set_global_policy_name(policy) == MP_OK) && CHECK(mp_model_create(&m, &md) == MP_OK);
    if (ok && conv == 2) {
        ok = CHECK(mp_model_add(m, mp_conv2d(16, 3, 3, MP_VALID, MP_RELU)) == MP_OK) &&
             CHECK(mp_model_add(m, mp_dropout(0.25f)) == MP_OK) &&
             CHECK(mp_model_add(m, mp_max_pooling2d(2, 2)) == MP_OK) &&
             CHECK(mp_model_add(m, mp_conv2d(32, 3, 3, MP_SAME, MP_RELU)) == MP_OK) &&
             CHECK(mp_model_add(m, mp_max_pooling2d(3, 3)) == MP_OK) && CHECK(mp_model_add(m, mp_flatten()) == MP_OK);
    } else if (ok && conv) {
        ok = CHECK(mp_model_add(m, mp_conv2d(6, 3, 3, MP_SAME, MP_RELU)) == MP_OK) &&
             CHECK(mp_model_add(m, mp_max_pooling2d(2, 2)) == MP_OK) &&
             CHECK(mp_model_add(m, mp_flatten()) == MP_OK) &&
             CHECK(mp_model_add(m, mp_dense(17, MP_TANH)) == MP_OK);
    } else if (ok) {
        ok = CHECK(mp_model_add(m, mp_dense(200, MP_RELU)) == MP_OK) &&
             CHECK(mp_model_add(m, mp_dense(65, MP_GELU)) == MP_OK);
    }
    ok = ok && CHECK(mp_model_add(m, mp_dense(CLASSES, MP_LINEAR)) == MP_OK) && CHECK(mp_model_add(m, sm) == MP_OK);
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    cd.metrics = MP_METRIC_ACCURACY;
    cd.optimizer.kind = MP_ADAM;
    cd.optimizer.learning_rate = 0.01f;
    ok = ok && CHECK(mp_model_compile(m, &cd) == MP_OK);
    mp_set_global_policy_name("float32");
    if (!ok) {
        if (m) fprintf(stderr, "    %s\n", mp_model_error(m));
        mp_model_destroy(m);
        return NULL;
    }
    return m;
}

/* Three custom-loop steps on batches of 33 and 31, then one epoch of fit
   (shuffled, batch 16): the weights after, or NULL. The weights must have
   moved, so that comparing them is not vacuous. */
static float *train(mp_model *m, size_t *count) {
    size_t in = mp_model_input_size(m), n = mp_model_param_count(m);
    float *w = (float *)xalloc(n * sizeof(float)), *w0 = (float *)xalloc(n * sizeof(float));
    mp_fit_desc fd;
    int step, ok = mp_model_get_weights(m, w0, n) == MP_OK;
    for (step = 0; ok && step < 3; step++) {
        size_t off = (size_t)step * 20;
        int batch = step == 1 ? 31 : 33, applied = 0;
        float loss = 0;
        ok = forward_rows(m, xs + off * in, batch, 1) == MP_OK &&
             loss_rows(m, labels + off, NULL, batch, &loss, NULL) == MP_OK &&
             mp_compute_scaled_gradients(m) == MP_OK && mp_get_unscaled_gradients(m) == MP_OK &&
             mp_apply_gradients(m, &applied) == MP_OK;
    }
    memset(&fd, 0, sizeof fd);
    fd.data = data_xy(xs, (int)in, labels, NS);
    fd.batch_size = 16, fd.epochs = 1, fd.verbose = MP_VERBOSE_SILENT;
    ok = ok && mp_model_fit(m, &fd) == MP_OK && mp_model_get_weights(m, w, n) == MP_OK;
    if (!CHECK(ok)) {
        fprintf(stderr, "    %s\n", mp_model_error(m));
        free(w);
        free(w0);
        return NULL;
    }
    CHECK(memcmp(w, w0, n * sizeof(float)) != 0);
    free(w0);
    *count = n;
    return w;
}

/* The row kernels (bias and activation, their gradient, the bias
   gradient) split a layer's rows, or columns, over the pool once it holds
   2^16 elements: batches of 64 and 61 through a 1100-unit GELU layer (an
   even split and an odd one) train to the same bits on 1 and 2 threads. */
static void test_row_kernels_threads(void) {
    static const char *policies[] = {"float32", "mixed_float16", "mixed_bfloat16"};
    size_t pi;
    for (pi = 0; pi < 3; pi++) {
        float *w[2] = {NULL, NULL};
        size_t n = 0;
        int t, ok = 1;
        for (t = 0; t < 2; t++) {
            mp_model_desc md;
            mp_compile_desc cd;
            mp_model *m = NULL;
            int step;
            memset(&md, 0, sizeof md);
            memset(&cd, 0, sizeof cd);
            md.input_shape[0] = IN_FLAT, md.seed = 5, md.threads = t + 1;
            cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
            ok = ok && CHECK(mp_set_global_policy_name(policies[pi]) == MP_OK) &&
                 CHECK(mp_model_create(&m, &md) == MP_OK) &&
                 CHECK(mp_model_add(m, mp_dense(1100, MP_GELU)) == MP_OK) &&
                 CHECK(mp_model_add(m, mp_dense(CLASSES, MP_LINEAR)) == MP_OK) &&
                 CHECK(mp_model_compile(m, &cd) == MP_OK);
            mp_set_global_policy_name("float32");
            for (step = 0; ok && step < 2; step++) {
                float loss;
                int applied;
                ok = CHECK(forward_rows(m, xs, step ? 61 : 64, 1) == MP_OK) &&
                     CHECK(loss_rows(m, labels, NULL, step ? 61 : 64, &loss, NULL) == MP_OK) &&
                     CHECK(mp_compute_scaled_gradients(m) == MP_OK) && CHECK(mp_get_unscaled_gradients(m) == MP_OK) &&
                     CHECK(mp_apply_gradients(m, &applied) == MP_OK);
            }
            if (ok) {
                n = mp_model_param_count(m);
                w[t] = (float *)xalloc(n * sizeof(float));
                ok = CHECK(mp_model_get_weights(m, w[t], n) == MP_OK);
            }
            mp_model_destroy(m);
        }
        if (ok)
            check_report(memcmp(w[0], w[1], n * sizeof(float)) == 0, __FILE__, __LINE__,
                         policies[pi]); /* 1 and 2 threads: the same weights */
        free(w[0]);
        free(w[1]);
    }
}

/* A Dense layer below a Dense one, ending in ReLU, gets its gradient from
   the upper layer's input-gradient product (mp_gemm_args's relu_y) where
   the backend says it honours relu_y; the same model on a table that does
   not say so, and the model with its ReLUs as Activation layers, take the
   separate act_backward. All three train to the same weights, under each
   policy. */
static int relu_y_products;
static void counting_gemm(void *ctx, const mp_gemm_args *g) {
    relu_y_products += g->relu_y != NULL;
    mp_cpu_backend()->gemm(ctx, g);
}

static void test_relu_fused_model(void) {
    static const char *policies[] = {"float32", "mixed_float16", "mixed_bfloat16"};
    static const char *variants[] = {"fused", "ReLUs as Activation layers", "a table without relu_grad"};
    mp_backend tables[2];
    size_t pi;
    int v;
    for (v = 0; v < 2; v++) {
        tables[v] = *mp_cpu_backend();
        tables[v].gemm = counting_gemm;
        tables[v].relu_grad = v == 0;
    }
    for (pi = 0; pi < 3; pi++) {
        float *w[3] = {NULL, NULL, NULL}, *init = NULL;
        size_t n[3] = {0, 0, 0};
        int ok = 1;
        for (v = 0; ok && v < 3; v++) {
            mp_model_desc md;
            mp_compile_desc cd;
            mp_model *m = NULL;
            int split = v == 1;
            mp_activation act = split ? MP_LINEAR : MP_RELU;
            memset(&md, 0, sizeof md);
            memset(&cd, 0, sizeof cd);
            md.input_shape[0] = IN_FLAT, md.seed = 7, md.threads = 2;
            md.backend = v == 1 ? NULL : &tables[v / 2];
            cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
            ok = CHECK(mp_set_global_policy_name(policies[pi]) == MP_OK) && CHECK(mp_model_create(&m, &md) == MP_OK) &&
                 CHECK(mp_model_add(m, mp_dense(150, act)) == MP_OK) &&
                 (!split || CHECK(mp_model_add(m, mp_activation_layer(MP_RELU)) == MP_OK)) &&
                 CHECK(mp_model_add(m, mp_dense(70, act)) == MP_OK) &&
                 (!split || CHECK(mp_model_add(m, mp_activation_layer(MP_RELU)) == MP_OK)) &&
                 CHECK(mp_model_add(m, mp_dense(CLASSES, MP_LINEAR)) == MP_OK) &&
                 CHECK(mp_model_compile(m, &cd) == MP_OK);
            mp_set_global_policy_name("float32");
            if (ok && v == 0) { /* the first model's starting weights, for all three */
                init = (float *)xalloc(mp_model_param_count(m) * sizeof(float));
                ok = CHECK(mp_model_get_weights(m, init, mp_model_param_count(m)) == MP_OK);
            }
            if (ok && v > 0)
                ok = CHECK(mp_model_param_count(m) == n[0]) && CHECK(mp_model_set_weights(m, init, n[0]) == MP_OK);
            relu_y_products = 0;
            ok = ok && (w[v] = train(m, &n[v])) != NULL;
            if (ok && v != 1) check_report(v == 0 ? relu_y_products > 0 : relu_y_products == 0, __FILE__, __LINE__,
                                           variants[v]);
            if (ok && v > 0)
                check_report(n[0] == n[v] && memcmp(w[0], w[v], n[0] * sizeof(float)) == 0, __FILE__, __LINE__,
                             variants[v]);
            mp_model_destroy(m);
        }
        free(w[0]);
        free(w[1]);
        free(w[2]);
        free(init);
    }
}

static void test_model_threads(void) {
    static const char *policies[] = {"float32", "mixed_float16", "mixed_bfloat16"};
    size_t i, pi;
    int conv;
    xs = (float *)xalloc(X_FLOATS * sizeof(float)); /* more than the conv model's 9 x 9 x 2 */
    labels = (int32_t *)xalloc(NS * sizeof(int32_t));
    for (i = 0; i < X_FLOATS; i++) xs[i] = uniform(-1.0f, 1.0f);
    for (i = 0; i < NS; i++) labels[i] = (int32_t)(rng_next() % CLASSES);
    for (pi = 0; pi < 3; pi++)
        for (conv = 0; conv < 3; conv++) {
            mp_model *m1 = model_for(policies[pi], 1, conv), *m2 = model_for(policies[pi], 2, conv);
            float *w1 = NULL, *w2 = NULL;
            size_t n1 = 0, n2 = 0;
            char what[120];
            if (m1) CHECK(mp_model_threads(m1) == 1);
#ifndef MIXPREC_NO_THREADS
            if (m2) CHECK(mp_model_threads(m2) == 2);
#else
            if (m2) CHECK(mp_model_threads(m2) == 1 || mp_model_threads(m2) == 2);
#endif
            if (m1 && m2 && (w1 = train(m1, &n1)) && (w2 = train(m2, &n2))) {
                snprintf(what, sizeof what, "%s, %s model: threads 1 and 2 train to the same weights", policies[pi],
                         conv == 2 ? "larger conv" : conv ? "conv" : "dense");
                check_report(n1 == n2 && memcmp(w1, w2, n1 * sizeof(float)) == 0, __FILE__, __LINE__, what);
                CHECK(mp_current_loss_scale(m1) == mp_current_loss_scale(m2));
            }
            free(w1);
            free(w2);
            mp_model_destroy(m1);
            mp_model_destroy(m2);
        }
    {   /* threads = 0: all the cores; a negative count is out of range */
        mp_model_desc md;
        mp_model *m = NULL;
        memset(&md, 0, sizeof md);
        md.input_shape[0] = 4;
        if (CHECK(mp_model_create(&m, &md) == MP_OK)) CHECK(mp_model_threads(m) == mp_available_cores());
        mp_model_destroy(m);
        m = NULL;
        md.threads = -1;
        CHECK(mp_model_create(&m, &md) == MP_ERR_ARG && m == NULL);
        mp_model_destroy(m);
    }
    test_row_kernels_threads(); /* on the same data */
    test_relu_fused_model();
    free(xs);
    free(labels);
}

int main(int argc, char **argv) {
    check_args(argc, argv);
    RUN(test_bad_input());
    RUN(test_products());
    RUN(test_long_k());
    RUN(test_narrow_in_place());
    RUN(test_pack_pairs_layout());
    RUN(test_all_mixes());
    RUN(test_products_pooled());
    RUN(test_bf16_subnormals());
    RUN(test_threads());
    RUN(test_sums_in_c_threads());
    RUN(test_split_k());
    RUN(test_relu_grad());
    RUN(test_fenced_operands());
    RUN(test_nan_inf());
    RUN(test_overflow());
    RUN(test_huge_finite());
    RUN(test_model_threads());
    printf("info: largest |c - ref| / tolerance over the random products: %.4f\n", worst_ratio);
    CHECK(mp_get_memory_info().current == 0); /* pools, workspaces and models all freed */
    printf("info: now sizes whose byte counts overflow (a crash here is a missing size check)\n");
    fflush(stdout);
    RUN(test_sizes());
    return check_done("test_gemm");
}
