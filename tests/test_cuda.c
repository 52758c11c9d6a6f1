/* test_cuda.c - the CUDA backend (cuda/) against the CPU backend. Every op
   of the table runs on the same inputs on both, and the results must agree
   element by element within |gpu - cpu| <= atol + rtol |cpu| (NaN matches
   NaN): zero tolerance where both compute the same float32 operations in
   the same order (casts, optimizers, loss scaling, im2col/col2im, pooling,
   dropout, column sums of up to 256 rows, batch and layer normalisation,
   whose sums both take in mixprec.h's order; the optimizers within 1e-6 when
   g++ fuses the CPU's a*b + c), a few float32 ulps where CUDA's
   expf/erff/tanhf/logf (2 ulp) replace glibc's, one ulp of the output dtype
   where a 16-bit result is rounded from such a float32, and for products
   the summation order's error (see `tol_*`). Then the models: a few training
   steps of an MLP and of a small conv net give the CPU's losses, the loss
   scale follows the CPU's trajectory exactly through injected Infs, a re-run
   is bit-identical, a graph (a residual block with BatchNormalization,
   Concatenate, the poolings, LayerNormalization) gives the CPU's losses and
   moving statistics, and device memory is accounted.

   Without a CUDA device it checks only that the backend refuses cleanly
   (MP_ERR_BACKEND, a reason, nothing leaked) and prints
   `test_cuda: skipped (no CUDA device: ...)`, with no tally line.

   Build (after `make cuda`):
       gcc -std=c99 -O2 tests/test_cuda.c -o test_cuda -Lbuild -lmixprec_cuda \
           -L/usr/local/cuda/lib64 -lcublasLt -lcudart -lstdc++ -lm */
#define _POSIX_C_SOURCE 200112L /* clock_gettime, for fit's epoch timer; setenv */
#ifndef TEST_LINKS_MIXPREC /* defined: the implementation is another object's (tests/header_only.c) */
#define MIXPREC_IMPLEMENTATION
#endif
#include "../mixprec.h"
#include "../cuda/mixprec_cuda.h"
#include "check.h"
#define TEST_SEED 0x2545F4914F6CDD1Dull
#include "helpers.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define COUNT(a) (sizeof a / sizeof a[0])

/* ======================================================================== */
/* Helpers */

static const mp_dtype F32 = MP_FLOAT32, F16 = MP_FLOAT16;
static const mp_dtype dtypes[] = {MP_FLOAT32, MP_FLOAT16, MP_BFLOAT16};

/* The two backends, each with its context. */
typedef struct side {
    const mp_backend *be;
    void *ctx;
} side;
static side cpu, gpu, gpu_tf32;

/* An operand both backends start from: the host bytes (the CPU's) and a
   device copy (the GPU's). An op runs on .host on the CPU and on .dev on
   the GPU; `agree` then compares what each left. */
typedef struct arg {
    void *host, *dev;
    size_t bytes;
} arg;
static arg *live_args[64];
static int n_live;

static void upload(arg *a) { gpu.be->copy(gpu.ctx, a->dev, a->host, a->bytes, MP_COPY_TO_BACKEND); }

static arg *new_arg(size_t bytes) {
    arg *a = (arg *)zalloc(sizeof *a);
    a->bytes = bytes;
    a->host = zalloc(bytes);
    a->dev = gpu.be->alloc(gpu.ctx, bytes);
    if (!a->dev || n_live == (int)COUNT(live_args)) {
        fprintf(stderr, "test_cuda: device allocation of %zu bytes failed\n", bytes);
        exit(2);
    }
    live_args[n_live++] = a;
    return a;
}

/* n values of dtype t, uniform in [lo, hi) and rounded to t, on both sides. */
static arg *rand_arg(mp_dtype t, size_t n, float lo, float hi) {
    arg *a = new_arg(n * dsize(t));
    size_t i;
    for (i = 0; i < n; i++) put(a->host, t, i, uniform(lo, hi));
    upload(a);
    return a;
}

static void free_args(void) {
    while (n_live > 0) {
        arg *a = live_args[--n_live];
        gpu.be->free(gpu.ctx, a->dev);
        free(a->host);
        free(a);
    }
}

/* The device's bytes of a, fetched (the caller frees). */
static void *fetch(const arg *a) {
    void *h = zalloc(a->bytes);
    gpu.be->copy(gpu.ctx, h, a->dev, a->bytes, MP_COPY_TO_HOST);
    return h;
}

typedef struct tol {
    float atol, rtol;
} tol;
static const tol EXACT = {0.0f, 0.0f};
/* The optimizers' a*b + c rounds twice on both sides (mixprec.h turns
   contraction off; nvcc builds with --fmad=false): the same bits. */
static const tol SAME_OPS = {0.0f, 0.0f};
/* one float32 result of expf/erff/tanhf/logf: a few ulps either side */
static const tol TRANSCENDENTAL = {2e-6f, 2e-6f};
/* a 16-bit result rounded from a float32 that differs by a few ulps: one
   ulp of the output (2^-10, 2^-7 relative), or a subnormal's worth */
static tol tol_rounded(mp_dtype t) {
    tol f32 = TRANSCENDENTAL, f16 = {1e-6f, (1.0f / 1024.0f)}, bf16 = {1e-6f, (1.0f / 128.0f)};
    return t == F32 ? f32 : t == F16 ? f16 : bf16;
}
/* products of values in [-1, 1] over k <= 256 terms, summed in another
   order: float32 errors of about sqrt(k) ulps of the largest partial sum;
   16-bit outputs one ulp of the result (or 2^-8 of one near zero) */
static tol tol_gemm(mp_dtype ct) {
    tol f32 = {1e-4f, 1e-5f}, f16 = {4e-3f, (1.0f / 1024.0f)}, bf16 = {3e-2f, (1.0f / 128.0f)};
    return ct == F32 ? f32 : ct == F16 ? f16 : bf16;
}

static int within(float got, float want, tol t) {
    if (got != got || want != want) return got != got && want != want;
    if (got == want) return 1; /* equal infinities too */
    return fabsf(got - want) <= t.atol + t.rtol * fabsf(want);
}

/* Whether the device's a (n values of dtype dt) matches the CPU's within t:
   one check; on failure the first few misses are printed. */
static int agree(const char *what, const arg *a, mp_dtype dt, size_t n, tol t) {
    void *got = fetch(a);
    size_t i, bad = 0;
    mp_status st = gpu.be->sync(gpu.ctx);
    if (st != MP_OK) fprintf(stderr, "  %s: the GPU failed: %s\n", what, gpu.be->last_error(gpu.ctx));
    for (i = 0; st == MP_OK && i < n; i++) {
        float g = get(got, dt, i), w = get(a->host, dt, i);
        if (within(g, w, t)) continue;
        if (++bad <= 3)
            fprintf(stderr, "  %s: [%zu] gpu %.9g, cpu %.9g (atol %g rtol %g)\n", what, i, (double)g, (double)w,
                    (double)t.atol, (double)t.rtol);
    }
    free(got);
    if (bad) fprintf(stderr, "  %s: %zu of %zu differ\n", what, bad, n);
    return CHECK(st == MP_OK && bad == 0);
}

/* Whether the device's bytes of a are the CPU's: one check. */
static int same_bytes(const char *what, const arg *a) {
    void *got = fetch(a);
    int same = gpu.be->sync(gpu.ctx) == MP_OK && memcmp(got, a->host, a->bytes) == 0;
    free(got);
    if (!same) fprintf(stderr, "  %s: the bytes differ (%s)\n", what, gpu.be->last_error(gpu.ctx));
    return CHECK(same);
}

/* ======================================================================== */
/* Op by op */

static void test_casts(void) {
    static const float specials[] = {65504.0f, 65520.0f, 70000.0f, -1e30f, 3e-6f, 1e-8f, -2.9e-8f, 1e-40f,
                                     INFINITY, -INFINITY, NAN, -NAN, 0.0f, -0.0f, 3.4e38f, 1.00048828125f};
    size_t n = 1000, i, s, d;
    for (s = 0; s < COUNT(dtypes); s++)
        for (d = 0; d < COUNT(dtypes); d++) {
            mp_dtype st = dtypes[s], dt = dtypes[d];
            arg *src = new_arg(n * dsize(st)), *dst = new_arg(n * dsize(dt));
            mp_cast_stats cs, gs;
            char what[64];
            for (i = 0; i < n; i++) put(src->host, st, i, i < COUNT(specials) ? specials[i] : uniform(-1e5f, 1e5f));
            upload(src);
            memset(&cs, 0, sizeof cs);
            memset(&gs, 0, sizeof gs);
            cpu.be->cast(cpu.ctx, dst->host, dt, src->host, st, n, &cs);
            gpu.be->cast(gpu.ctx, dst->dev, dt, src->dev, st, n, &gs);
            sprintf(what, "cast %s -> %s", dn(st), dn(dt));
            agree(what, dst, dt, n, EXACT);
            same_bytes(what, dst); /* NaN's sign and payload too: the library's rules on the device */
            CHECK(memcmp(&cs, &gs, sizeof cs) == 0); /* every count, max and min */
            CHECK(gs.count == n && gs.nan_in == 2);
            if (st == F32 && dt == F16) CHECK(gs.overflow > 0 && gs.underflow > 0 && gs.subnormal > 0);
            free_args();
        }
    for (d = 0; d < COUNT(dtypes); d++) { /* the batch in: host float32 to any dtype */
        float *x = (float *)zalloc(n * sizeof(float));
        arg *dst = new_arg(n * dsize(dtypes[d]));
        for (i = 0; i < n; i++) x[i] = uniform(-70000.0f, 70000.0f);
        cpu.be->cast_in(cpu.ctx, dst->host, dtypes[d], x, n, NULL);
        gpu.be->cast_in(gpu.ctx, dst->dev, dtypes[d], x, n, NULL);
        agree("cast_in", dst, dtypes[d], n, EXACT);
        same_bytes("cast_in", dst);
        free(x);
        free_args();
    }
}

/* One product on both backends from the same A, B (and C to add to).
   with_bias: 0 none, 1 a bias in C's dtype, 2 a float32 bias (as AMP
   hands a layer whose product and output dtypes differ), 3 a bias in C's
   dtype one element into its block (as inside a packed weight block: not
   16-byte aligned, which cuBLASLt's BIAS epilogue may fault on). */
static void gemm_case(const side *g_side, int ta, int tb, size_t m, size_t n, size_t k, mp_dtype at, mp_dtype bt,
                      mp_dtype ct, int accumulate, int with_bias, mp_activation act, tol t) {
    arg *a = rand_arg(at, m * k, -1.0f, 1.0f), *b = rand_arg(bt, k * n, -1.0f, 1.0f);
    mp_dtype biast = with_bias == 2 ? MP_FLOAT32 : ct;
    size_t skip = with_bias == 3 ? dsize(biast) : 0; /* bytes before the bias */
    arg *c = rand_arg(ct, m * n, -1.0f, 1.0f), *bias = with_bias ? rand_arg(biast, n + (skip != 0), -1.0f, 1.0f) : NULL;
    arg *z = act == MP_GELU ? new_arg(m * n * dsize(ct)) : NULL;
    mp_gemm_args g;
    char what[128];
    memset(&g, 0, sizeof g);
    g.trans_a = ta, g.trans_b = tb, g.m = m, g.n = n, g.k = k;
    g.at = at, g.bt = bt, g.ct = ct, g.accumulate = accumulate, g.act = act, g.biast = biast;
    g.a = a->host, g.b = b->host, g.c = c->host, g.bias = bias ? (char *)bias->host + skip : NULL, g.z = z ? z->host : NULL;
    CHECK(cpu.be->gemm_reserve(cpu.ctx, m, n, k) == MP_OK && g_side->be->gemm_reserve(g_side->ctx, m, n, k) == MP_OK);
    cpu.be->gemm(cpu.ctx, &g);
    g.a = a->dev, g.b = b->dev, g.c = c->dev, g.bias = bias ? (char *)bias->dev + skip : NULL, g.z = z ? z->dev : NULL;
    if (g_side != &gpu) CHECK(gpu.be->sync(gpu.ctx) == MP_OK); /* the operands went in on gpu's stream */
    g_side->be->gemm(g_side->ctx, &g);
    sprintf(what, "gemm %s%s %zux%zux%zu %s x %s -> %s%s%s act %d", ta ? "T" : "N", tb ? "T" : "N", m, n, k, dn(at),
            dn(bt), dn(ct), accumulate ? " +=" : "",
            with_bias == 2 ? " +float32 bias" : with_bias == 3 ? " +bias at 2/4 bytes" : with_bias ? " +bias" : "", (int)act);
    if (g_side != &gpu) CHECK(g_side->be->sync(g_side->ctx) == MP_OK); /* before gpu's stream reads c */
    agree(what, c, ct, m * n, t);
    if (z) agree("gemm z (pre-activation)", z, ct, m * n, tol_gemm(ct));
    free_args();
}

static void test_gemm(void) {
    static const size_t shapes[][3] = {{37, 45, 29}, {64, 32, 128}, {1, 10, 256}};
    static const mp_activation acts[] = {MP_LINEAR, MP_RELU, MP_SIGMOID, MP_TANH, MP_GELU};
    size_t s, i, j, l, x;
    int ta, tb, acc;
    for (s = 0; s < COUNT(shapes); s++)
        for (i = 0; i < COUNT(dtypes); i++)
            for (j = 0; j < COUNT(dtypes); j++)
                for (l = 0; l < COUNT(dtypes); l++)
                    for (ta = 0; ta < 2; ta++)
                        for (tb = 0; tb < 2; tb++)
                            for (acc = 0; acc < 2; acc++)
                                gemm_case(&gpu, ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], dtypes[i],
                                          dtypes[j], dtypes[l], acc, 0, MP_LINEAR, tol_gemm(dtypes[l]));
    /* the layers' epilogues: bias, activation, gelu's pre-activation; and an
       empty sum (k = 0: bias and activation of zeros, or C itself) */
    for (i = 0; i < COUNT(dtypes); i++)
        for (x = 0; x < COUNT(acts); x++) {
            gemm_case(&gpu, 0, 0, 50, 24, 40, dtypes[i], dtypes[i], dtypes[i], 0, 1, acts[x], tol_gemm(dtypes[i]));
            gemm_case(&gpu, 0, 1, 50, 24, 40, dtypes[i], dtypes[i], dtypes[i], 0, 0, acts[x], tol_gemm(dtypes[i]));
            gemm_case(&gpu, 0, 0, 50, 24, 40, dtypes[i], dtypes[i], dtypes[i], 0, 2, acts[x], tol_gemm(dtypes[i]));
            gemm_case(&gpu, 0, 0, 5, 7, 0, dtypes[i], dtypes[i], dtypes[i], x == 0, 1, acts[x], tol_rounded(dtypes[i]));
        }
    {   /* TF32 on request: within TF32's rounding of the inputs (2^-11), and
           not the true float32 result (so the switch works) */
        tol tf32 = {5e-2f, 1e-2f};
        size_t n = 256, differ = 0;
        arg *a = rand_arg(F32, n * n, -1.0f, 1.0f), *b = rand_arg(F32, n * n, -1.0f, 1.0f);
        arg *c = new_arg(n * n * 4), *c32 = new_arg(n * n * 4);
        float *fast, *exact;
        mp_gemm_args g;
        memset(&g, 0, sizeof g);
        g.m = g.n = g.k = n;
        g.at = g.bt = g.ct = F32;
        g.a = a->host, g.b = b->host, g.c = c->host;
        CHECK(cpu.be->gemm_reserve(cpu.ctx, n, n, n) == MP_OK);
        cpu.be->gemm(cpu.ctx, &g);
        g.a = a->dev, g.b = b->dev, g.c = c->dev;
        /* c was zeroed on gpu's stream: another context's stream must not
           run ahead of that (the emulation runs the zeroing late) */
        CHECK(gpu.be->sync(gpu.ctx) == MP_OK);
        gpu_tf32.be->gemm(gpu_tf32.ctx, &g);
        CHECK(gpu_tf32.be->sync(gpu_tf32.ctx) == MP_OK);
        agree("gemm float32 with TF32", c, F32, n * n, tf32);
        g.c = c32->dev;
        gpu.be->gemm(gpu.ctx, &g);
        fast = (float *)fetch(c);
        exact = (float *)fetch(c32);
        for (s = 0; s < n * n; s++) differ += fast[s] != exact[s];
        CHECK(differ > n * n / 10);
        free(fast);
        free(exact);
        free_args();
    }
}

static void test_activations(void) {
    static const mp_activation acts[] = {MP_LINEAR, MP_RELU, MP_SIGMOID, MP_TANH, MP_GELU, MP_SOFTMAX};
    static const size_t shapes[][2] = {{33, 70}, {4, 300}};
    size_t s, i, a, o;
    int with_bias;
    for (s = 0; s < COUNT(shapes); s++)
        for (i = 0; i < COUNT(dtypes); i++)
            for (a = 0; a < COUNT(acts); a++)
                for (with_bias = 0; with_bias < 2; with_bias++) {
                    size_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
                    mp_dtype dt = dtypes[i];
                    mp_activation act = acts[a];
                    arg *x = rand_arg(dt, n, -4.0f, 4.0f), *b = with_bias ? rand_arg(dt, cols, -1.0f, 1.0f) : NULL;
                    arg *y = new_arg(n * dsize(dt)), *dy = rand_arg(dt, n, -1.0f, 1.0f);
                    tol t = act == MP_LINEAR || act == MP_RELU ? EXACT : tol_rounded(dt);
                    char what[64];
                    cpu.be->bias_act(cpu.ctx, y->host, x->host, b ? b->host : NULL, rows, cols, act, dt);
                    gpu.be->bias_act(gpu.ctx, y->dev, x->dev, b ? b->dev : NULL, rows, cols, act, dt);
                    sprintf(what, "bias_act %d %s", (int)act, dn(dt));
                    agree(what, y, dt, n, t);
                    upload(y); /* the backward passes read the CPU's y on both */
                    for (o = 0; o < COUNT(dtypes) && !with_bias; o++) {
                        mp_dtype dxt = dtypes[o];
                        arg *dx = new_arg(n * dsize(dxt));
                        cpu.be->act_backward(cpu.ctx, dx->host, dxt, dy->host, y->host, x->host, rows, cols, act, dt);
                        gpu.be->act_backward(gpu.ctx, dx->dev, dxt, dy->dev, y->dev, x->dev, rows, cols, act, dt);
                        sprintf(what, "act_backward %d %s -> %s", (int)act, dn(dt), dn(dxt));
                        agree(what, dx, dxt, n, act == MP_LINEAR || act == MP_RELU ? EXACT : tol_rounded(dxt));
                    }
                    if (!with_bias) { /* in place, dx = dy (the layers' use) */
                        cpu.be->act_backward(cpu.ctx, dy->host, dt, dy->host, y->host, x->host, rows, cols, act, dt);
                        gpu.be->act_backward(gpu.ctx, dy->dev, dt, dy->dev, y->dev, x->dev, rows, cols, act, dt);
                        agree("act_backward in place", dy, dt, n, act == MP_LINEAR || act == MP_RELU ? EXACT : tol_rounded(dt));
                    }
                    cpu.be->bias_act(cpu.ctx, x->host, x->host, NULL, rows, cols, act, dt); /* in place */
                    gpu.be->bias_act(gpu.ctx, x->dev, x->dev, NULL, rows, cols, act, dt);
                    agree("bias_act in place", x, dt, n, t);
                    free_args();
                }
}

static void test_bias_grad(void) {
    static const size_t rows[] = {1, 100, 256, 1000};
    size_t r, i;
    for (r = 0; r < COUNT(rows); r++)
        for (i = 0; i < COUNT(dtypes); i++) {
            size_t cols = 70;
            mp_dtype dt = dtypes[i];
            arg *dy = rand_arg(dt, rows[r] * cols, -1.0f, 1.0f), *db = new_arg(cols * dsize(dt));
            /* past 256 rows the device adds parts in another order: 1000 values in [-1, 1] whose partial
               sums reach about 30, each addition rounding by up to 2^-24 of them */
            tol more = {1e-4f, 1e-5f}, t = rows[r] <= 256 ? EXACT : dt == F32 ? more : tol_rounded(dt);
            cpu.be->bias_grad(cpu.ctx, db->host, dy->host, rows[r], cols, dt);
            gpu.be->bias_grad(gpu.ctx, db->dev, dy->dev, rows[r], cols, dt);
            agree(rows[r] <= 256 ? "bias_grad (one part: the CPU's order)" : "bias_grad (parts)", db, dt, cols, t);
            free_args();
        }
}

/* Whether a's device bytes and b's are the same (two runs of one op). */
static int same_runs(const char *what, const arg *a, const arg *b) {
    void *x = fetch(a), *y = fetch(b);
    int same = gpu.be->sync(gpu.ctx) == MP_OK && memcmp(x, y, a->bytes) == 0;
    free(x);
    free(y);
    if (!same) fprintf(stderr, "  %s: two runs differ\n", what);
    return CHECK(same);
}

/* The reductions (softmax and its backward, the column sums, the loss
   sum) twice on the device from the same data: the same bits (a fixed
   order, no float atomics), and the CPU's results within float32's
   reordering. Sizes that reach every level: rows of 300 columns (10 a
   lane), 5000 rows of bias gradient in 3 column groups (20 parts: the
   block's second level), 66000 loss rows (more parts than the sum's
   threads). */
static void test_reductions_rerun(void) {
    /* The bit-identical reruns on a loss of 11 parts; the 258 parts (more
       than the sum's 256 threads) once, against the CPU: every loss row is
       a warp, 32 fibers in the emulation, so 66000 rows twice took most of
       this program's time. */
    size_t rows = 33, cols = 300, n = rows * cols, grad_rows = 5000, grad_cols = 70, loss_rows = 2600, classes = 10, i;
    size_t big_rows = 66000;
    arg *x = rand_arg(F32, n, -4.0f, 4.0f), *dy = rand_arg(F32, n, -1.0f, 1.0f);
    arg *g = rand_arg(F32, grad_rows * grad_cols, -1.0f, 1.0f), *pred = rand_arg(F32, big_rows * classes, -6.0f, 6.0f);
    arg *labels = new_arg(big_rows * 4), *dpred = new_arg(big_rows * classes * 4), *y[2], *dx[2], *db[2], *metrics[3];
    tol sums = {1e-4f, 1e-4f};
    int run;
    for (i = 0; i < big_rows; i++) ((int32_t *)labels->host)[i] = (int32_t)(rng_next() % classes);
    upload(labels);
    for (run = 0; run < 2; run++) {
        y[run] = new_arg(n * 4), dx[run] = new_arg(n * 4), db[run] = new_arg(grad_cols * 4), metrics[run] = new_arg(8);
        gpu.be->bias_act(gpu.ctx, y[run]->dev, x->dev, NULL, rows, cols, MP_SOFTMAX, F32);
        gpu.be->act_backward(gpu.ctx, dx[run]->dev, F32, dy->dev, y[run]->dev, x->dev, rows, cols, MP_SOFTMAX, F32);
        gpu.be->bias_grad(gpu.ctx, db[run]->dev, g->dev, grad_rows, grad_cols, F32);
        gpu.be->loss(gpu.ctx, MP_SPARSE_CATEGORICAL_CROSSENTROPY, 1, pred->dev, F32, pred->dev, F32,
                     (const int32_t *)labels->dev, NULL, loss_rows, classes, (float *)dpred->dev, (float *)metrics[run]->dev);
    }
    metrics[2] = new_arg(8);
    gpu.be->loss(gpu.ctx, MP_SPARSE_CATEGORICAL_CROSSENTROPY, 1, pred->dev, F32, pred->dev, F32,
                 (const int32_t *)labels->dev, NULL, big_rows, classes, (float *)dpred->dev, (float *)metrics[2]->dev);
    same_runs("softmax", y[0], y[1]);
    same_runs("softmax backward", dx[0], dx[1]);
    same_runs("bias_grad over 20 parts", db[0], db[1]);
    same_runs("loss sum over 11 parts", metrics[0], metrics[1]);
    cpu.be->bias_act(cpu.ctx, y[0]->host, x->host, NULL, rows, cols, MP_SOFTMAX, F32);
    cpu.be->act_backward(cpu.ctx, dx[0]->host, F32, dy->host, y[0]->host, x->host, rows, cols, MP_SOFTMAX, F32);
    cpu.be->bias_grad(cpu.ctx, db[0]->host, g->host, grad_rows, grad_cols, F32);
    cpu.be->loss(cpu.ctx, MP_SPARSE_CATEGORICAL_CROSSENTROPY, 1, pred->host, F32, pred->host, F32,
                 (const int32_t *)labels->host, NULL, big_rows, classes, (float *)dpred->host, (float *)metrics[2]->host);
    agree("softmax, 300 columns", y[0], F32, n, TRANSCENDENTAL);
    agree("softmax backward, 300 columns", dx[0], F32, n, TRANSCENDENTAL);
    agree("bias_grad over 20 parts", db[0], F32, grad_cols, sums);
    agree("loss sum and count over 258 parts", metrics[2], F32, 2, sums);
    free_args();
}

/* The loss rows a warp a row with more columns than lanes (70: 2 or 3 a
   lane): the argmax in the CPU's order across lanes (the first of equal
   maxima, -0 and +0 equal, NaN at index 0 before all, any other NaN never),
   so the accuracy count is exact; the gradient within float32 reordering. */
static void test_loss_rows_lanes(void) {
    enum { ROWS = 40, COLS = 70 };
    arg *pred = rand_arg(F32, ROWS * COLS, -6.0f, 6.0f), *labels = new_arg(ROWS * 4);
    arg *dpred = new_arg(ROWS * COLS * 4), *metrics = new_arg(8);
    float *p = (float *)pred->host, *got;
    int32_t *lab = (int32_t *)labels->host;
    size_t r, j;
    for (r = 0; r < ROWS; r++) lab[r] = (int32_t)(r % COLS);
    p[1 * COLS + 0] = NAN;                                     /* row 1: NaN first, the argmax 0 */
    lab[1] = 0;
    p[2 * COLS + 5] = NAN;                                     /* row 2: a NaN never the argmax */
    p[3 * COLS + 10] = p[3 * COLS + 50] = 100.0f, lab[3] = 10; /* a tie across lanes: the first */
    p[4 * COLS + 13] = p[4 * COLS + 45] = 100.0f, lab[4] = 45; /* the later one: not right */
    for (j = 0; j < COLS; j++) p[5 * COLS + j] = -1.0f;
    p[5 * COLS + 40] = 0.0f, p[5 * COLS + 7] = -0.0f, lab[5] = 7; /* -0 == +0: the first */
    p[0 * COLS + 0] = p[2 * COLS + 2] = -7.0f; /* rows 0 and 2: not right */
    for (r = 6; r < ROWS; r++) /* the rest: the label's column the maximum in the odd rows, the minimum in the even */
        p[r * COLS + (size_t)lab[r]] = r % 2 ? 7.0f : -7.0f;
    upload(pred);
    upload(labels);
    cpu.be->loss(cpu.ctx, MP_SPARSE_CATEGORICAL_CROSSENTROPY, 1, p, F32, p, F32, lab, NULL, ROWS, COLS,
                 (float *)dpred->host, (float *)metrics->host);
    gpu.be->loss(gpu.ctx, MP_SPARSE_CATEGORICAL_CROSSENTROPY, 1, pred->dev, F32, pred->dev, F32,
                 (const int32_t *)labels->dev, NULL, ROWS, COLS, (float *)dpred->dev, (float *)metrics->dev);
    got = (float *)fetch(metrics);
    CHECK(got[1] == ((float *)metrics->host)[1] && got[1] == (float)(3 + (ROWS - 6) / 2)); /* rows 1, 3, 5 and the odd ones */
    CHECK(got[0] != got[0]);                                                               /* NaN rows: a NaN sum */
    free(got);
    agree("loss rows across lanes: gradient", dpred, F32, ROWS * COLS, TRANSCENDENTAL);
    free_args();
}

/* Each loss from logits and from probabilities, predictions in each dtype. */
static void test_losses_of(size_t rows) {
    static const mp_loss kinds[] = {MP_SPARSE_CATEGORICAL_CROSSENTROPY, MP_CATEGORICAL_CROSSENTROPY,
                                    MP_BINARY_CROSSENTROPY, MP_MEAN_SQUARED_ERROR};
    size_t k, i, r, j;
    int logits;
    for (k = 0; k < COUNT(kinds); k++)
        for (logits = 0; logits < 2; logits++)
            for (i = 0; i < COUNT(dtypes); i++) {
                mp_loss kind = kinds[k];
                mp_dtype pt = dtypes[i];
                size_t cols = kind == MP_BINARY_CROSSENTROPY ? 3 : 10, n = rows * cols;
                int sparse = kind == MP_SPARSE_CATEGORICAL_CROSSENTROPY;
                arg *pred = new_arg(n * dsize(pt)), *labels = new_arg(rows * 4), *y = new_arg(n * 4);
                arg *dpred = new_arg(n * 4), *metrics = new_arg(2 * 4);
                tol sum = {1e-5f, 1e-5f};
                char what[64];
                for (r = 0; r < rows; r++) {
                    ((int32_t *)labels->host)[r] = (int32_t)(rng_next() % cols);
                    for (j = 0; j < cols; j++) {
                        /* probabilities with a few below the clip (1e-7), or logits */
                        float p = logits ? uniform(-6.0f, 6.0f) : j == r % cols ? 1e-9f : uniform(0.0f, 1.0f);
                        put(pred->host, pt, r * cols + j, p);
                        ((float *)y->host)[r * cols + j] =
                            kind == MP_CATEGORICAL_CROSSENTROPY ? (float)(j == (size_t)((int32_t *)labels->host)[r])
                                                                : uniform(0.0f, 1.0f);
                    }
                }
                upload(pred);
                upload(labels);
                upload(y);
                cpu.be->loss(cpu.ctx, kind, logits, pred->host, pt, pred->host, pt,
                             sparse ? (const int32_t *)labels->host : NULL, sparse ? NULL : (const float *)y->host,
                             rows, cols, (float *)dpred->host, (float *)metrics->host);
                gpu.be->loss(gpu.ctx, kind, logits, pred->dev, pt, pred->dev, pt,
                             sparse ? (const int32_t *)labels->dev : NULL, sparse ? NULL : (const float *)y->dev,
                             rows, cols, (float *)dpred->dev, (float *)metrics->dev);
                sprintf(what, "loss %d from_logits %d %s: gradient", (int)kind, logits, dn(pt));
                agree(what, dpred, F32, n, TRANSCENDENTAL);
                sprintf(what, "loss %d from_logits %d %s: sum", (int)kind, logits, dn(pt));
                agree(what, metrics, F32, 1, sum);
                { /* the accuracy count exactly */
                    float *got = (float *)fetch(metrics);
                    CHECK(got[1] == ((float *)metrics->host)[1] && (got[1] > 0.0f || kind == MP_MEAN_SQUARED_ERROR));
                    free(got);
                }
                free_args();
            }
}

/* 50 rows: the CPU's sum; 600: summed in parts of 256, then the parts */
static void test_losses(void) { test_losses_of(50); }
static void test_losses_in_parts(void) { test_losses_of(600); } /* last: the others' data stay as they were */

static void test_loss_scaling(void) {
    static const int flags[] = {0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0};
    size_t n = 1000, i, c;
    mp_loss_scale_desc descs[3];
    memset(descs, 0, sizeof descs);
    descs[1].growth_interval = 3, descs[1].max_scale = 65536.0f;
    descs[2].growth_interval = 2, descs[2].hysteresis = 2, descs[2].initial_scale = 4.0f, descs[2].min_scale = 2.0f;
    for (i = 0; i < COUNT(dtypes); i++) { /* scale_cast, and the fused unscale with its flag */
        arg *src = rand_arg(F32, n, -100.0f, 100.0f), *dst = new_arg(n * dsize(dtypes[i]));
        arg *scale = new_arg(4), *g32 = new_arg(n * 4), *flag = new_arg(sizeof(int));
        *(float *)scale->host = 32768.0f;
        upload(scale);
        cpu.be->scale_cast(cpu.ctx, dst->host, dtypes[i], (const float *)src->host, n, (const float *)scale->host);
        gpu.be->scale_cast(gpu.ctx, dst->dev, dtypes[i], (const float *)src->dev, n, (const float *)scale->dev);
        agree("scale_cast (overflowing float16 too)", dst, dtypes[i], n, EXACT);
        cpu.be->unscale_check(cpu.ctx, (float *)g32->host, dst->host, dtypes[i], n, (const float *)scale->host,
                              (int *)flag->host);
        gpu.be->unscale_check(gpu.ctx, (float *)g32->dev, dst->dev, dtypes[i], n, (const float *)scale->dev,
                              (int *)flag->dev);
        agree("unscale_check", g32, F32, n, EXACT);
        same_bytes("unscale_check: found_inf", flag);
        CHECK(*(int *)flag->host == (dtypes[i] == F16)); /* 100 * 32768 overflows float16 only */
        memset(flag->host, 0, sizeof(int));
        upload(flag);
        cpu.be->unscale_check(cpu.ctx, NULL, dst->host, dtypes[i], n, (const float *)scale->host, (int *)flag->host);
        gpu.be->unscale_check(gpu.ctx, NULL, dst->dev, dtypes[i], n, (const float *)scale->dev, (int *)flag->dev);
        same_bytes("unscale_check, the check alone: found_inf", flag);
        CHECK(*(int *)flag->host == (dtypes[i] == F16));
        free_args();
    }
    for (c = 0; c < COUNT(descs); c++) { /* the state machine on the device, step by step */
        arg *ls = new_arg(sizeof(mp_loss_scale)), *flag = new_arg(sizeof(int));
        CHECK(mp_loss_scale_init((mp_loss_scale *)ls->host, &descs[c]) == MP_OK);
        upload(ls);
        for (i = 0; i < COUNT(flags); i++) {
            *(int *)flag->host = flags[i];
            upload(flag);
            cpu.be->loss_scale_update(cpu.ctx, (mp_loss_scale *)ls->host, (const int *)flag->host);
            gpu.be->loss_scale_update(gpu.ctx, (mp_loss_scale *)ls->dev, (const int *)flag->dev);
            same_bytes("loss_scale_update", ls);
        }
        free_args();
    }
}

/* Every optimizer, with and without the compute-dtype copy and the skip
   flag, its gradients float32 or scaled in the copy's 16-bit dtype (fit's
   step unscales as it reads): the same bits as the CPU (the same
   operations, no contraction). */
static void test_optimizers(void) {
    mp_optimizer_desc descs[8];
    size_t n = 9001, d, i, f; /* past two blocks of the sum of squares */
    memset(descs, 0, sizeof descs);
    descs[0].kind = MP_SGD, descs[0].learning_rate = 0.01f;
    descs[1].kind = MP_SGD, descs[1].learning_rate = 0.01f, descs[1].momentum = 0.9f;
    descs[2].kind = MP_SGD, descs[2].learning_rate = 0.01f, descs[2].momentum = 0.9f, descs[2].nesterov = 1;
    descs[3].kind = MP_RMSPROP, descs[3].learning_rate = 0.001f, descs[3].rho = 0.9f, descs[3].epsilon = 1e-7f;
    descs[4].kind = MP_ADAM, descs[4].learning_rate = 0.001f, descs[4].beta_1 = 0.9f, descs[4].beta_2 = 0.999f;
    descs[4].epsilon = 1e-7f;
    descs[5] = descs[4], descs[5].kind = MP_ADAMW, descs[5].weight_decay = 0.004f; /* decay, then Adam */
    descs[6] = descs[1], descs[6].clipvalue = 2.0f, descs[6].weight_decay = 0.5f;
    descs[7] = descs[4], descs[7].global_clipnorm = 1.0f; /* by norm: the sum of squares, then the factor */
    for (d = 0; d < COUNT(descs); d++)
        for (i = 0; i < COUNT(dtypes); i++)
            for (f = 0; f < 3; f++) { /* found_inf: none, clear, set */
                arg *w = rand_arg(F32, n, -1.0f, 1.0f), *g = rand_arg(dtypes[i], n, -10.0f, 10.0f);
                arg *s1 = rand_arg(F32, n, 0.0f, 1e-4f), *s2 = rand_arg(F32, n, 0.0f, 1e-4f);
                arg *wc = i ? new_arg(n * dsize(dtypes[i])) : NULL, *flag = new_arg(sizeof(int));
                arg *scale = i ? new_arg(sizeof(float)) : NULL; /* float32 gradients come unscaled */
                arg *sum = new_arg(sizeof(float));
                mp_opt_step step, on_gpu;
                int it, norm = descs[d].global_clipnorm > 0.0f;
                *(int *)flag->host = f == 2;
                upload(flag);
                if (scale) *(float *)scale->host = 1024.0f, upload(scale);
                memset(&step, 0, sizeof step);
                step.cfg = descs[d];
                step.weight_decay = descs[d].weight_decay;
                for (it = 1; it <= 3; it++) {
                    step.iteration = (uint64_t)it;
                    step.sum_squares = norm ? (const float *)sum->host : NULL;
                    on_gpu = step;
                    on_gpu.sum_squares = norm ? (const float *)sum->dev : NULL;
                    if (norm) {
                        *(float *)sum->host = 0.0f;
                        upload(sum);
                        cpu.be->sum_squares(cpu.ctx, (float *)sum->host, g->host, dtypes[i],
                                            n, scale ? (const float *)scale->host : NULL);
                        gpu.be->sum_squares(gpu.ctx, (float *)sum->dev, g->dev, dtypes[i], n,
                                            scale ? (const float *)scale->dev : NULL);
                        same_bytes("sum_squares", sum);
                    }
                    cpu.be->optimizer_update(cpu.ctx, &step, (float *)w->host, g->host, dtypes[i],
                                             scale ? (const float *)scale->host : NULL, (float *)s1->host,
                                             (float *)s2->host, n, wc ? wc->host : NULL, dtypes[i],
                                             f ? (const int *)flag->host : NULL);
                    gpu.be->optimizer_update(gpu.ctx, &on_gpu, (float *)w->dev, g->dev, dtypes[i],
                                             scale ? (const float *)scale->dev : NULL, (float *)s1->dev,
                                             (float *)s2->dev, n, wc ? wc->dev : NULL, dtypes[i],
                                             f ? (const int *)flag->dev : NULL);
                }
                agree("optimizer: weights", w, F32, n, SAME_OPS);
                agree("optimizer: slot 1", s1, F32, n, SAME_OPS);
                agree("optimizer: slot 2", s2, F32, n, SAME_OPS);
                if (wc) agree("optimizer: the compute-dtype copy", wc, dtypes[i], n, SAME_OPS.rtol ? tol_rounded(dtypes[i]) : EXACT);
                free_args();
            }
}

static void test_conv_kernels(void) {
    /* h w c kh kw sh sw pt pl oh ow: valid, same (padded), strided */
    static const mp_conv_geom geoms[] = {{7, 9, 3, 3, 2, 1, 1, 0, 0, 5, 8},
                                         {6, 5, 4, 3, 3, 1, 1, 1, 1, 6, 5},
                                         {9, 8, 2, 3, 2, 2, 3, 1, 0, 5, 3}};
    /* pools: windows tiling with a border left over, and overlapping ones */
    static const mp_conv_geom pools[] = {{7, 9, 5, 2, 2, 2, 2, 0, 0, 3, 4}, {7, 7, 3, 3, 3, 2, 2, 0, 0, 3, 3}};
    size_t i, d, o, imgs = 3;
    for (i = 0; i < COUNT(geoms); i++)
        for (d = 0; d < COUNT(dtypes); d++) {
            const mp_conv_geom *g = &geoms[i];
            size_t pixels = imgs * (size_t)g->h * (size_t)g->w * (size_t)g->c;
            size_t cols = imgs * (size_t)g->oh * (size_t)g->ow * (size_t)g->kh * (size_t)g->kw * (size_t)g->c;
            arg *img = rand_arg(dtypes[d], pixels, -1.0f, 1.0f), *col = new_arg(cols * dsize(dtypes[d]));
            arg *dcol = rand_arg(F32, cols, -1.0f, 1.0f), *back = rand_arg(F32, pixels, 5.0f, 6.0f); /* overwritten */
            cpu.be->im2col(cpu.ctx, col->host, img->host, imgs, g, dtypes[d]);
            gpu.be->im2col(gpu.ctx, col->dev, img->dev, imgs, g, dtypes[d]);
            agree("im2col", col, dtypes[d], cols, EXACT);
            cpu.be->col2im(cpu.ctx, (float *)back->host, (const float *)dcol->host, imgs, g);
            gpu.be->col2im(gpu.ctx, (float *)back->dev, (const float *)dcol->dev, imgs, g);
            agree("col2im (the CPU's order of sums)", back, F32, pixels, EXACT);
            {
                size_t filters = 5, kernel = (size_t)g->kh * (size_t)g->kw * (size_t)g->c * filters;
                arg *w = rand_arg(dtypes[d], kernel, -1.0f, 1.0f), *flip = new_arg(kernel * dsize(dtypes[d]));
                cpu.be->conv_flip(cpu.ctx, flip->host, w->host, g, filters, dtypes[d]);
                gpu.be->conv_flip(gpu.ctx, flip->dev, w->dev, g, filters, dtypes[d]);
                agree("conv_flip", flip, dtypes[d], kernel, EXACT);
            }
            free_args();
        }
    for (i = 0; i < COUNT(pools); i++)
        for (d = 0; d < COUNT(dtypes); d++) {
            const mp_conv_geom *g = &pools[i];
            size_t in = imgs * (size_t)g->h * (size_t)g->w * (size_t)g->c, out = imgs * (size_t)g->oh * (size_t)g->ow * (size_t)g->c;
            arg *x = new_arg(in * dsize(dtypes[d])), *y = new_arg(out * dsize(dtypes[d])), *dy = rand_arg(dtypes[d], out, -1.0f, 1.0f);
            size_t j;
            for (j = 0; j < in; j++) /* a coarse grid: ties in most windows; one NaN */
                put(x->host, dtypes[d], j, j == 17 ? NAN : (float)(rng_next() % 4));
            upload(x);
            cpu.be->max_pool(cpu.ctx, y->host, x->host, imgs, g, dtypes[d]);
            gpu.be->max_pool(gpu.ctx, y->dev, x->dev, imgs, g, dtypes[d]);
            agree("max_pool", y, dtypes[d], out, EXACT);
            for (o = 0; o < COUNT(dtypes); o++) {
                arg *dx = rand_arg(dtypes[o], in, 7.0f, 8.0f); /* overwritten, uncovered cells too */
                cpu.be->max_pool_backward(cpu.ctx, dx->host, dtypes[o], dy->host, x->host, imgs, g, dtypes[d]);
                gpu.be->max_pool_backward(gpu.ctx, dx->dev, dtypes[o], dy->dev, x->dev, imgs, g, dtypes[d]);
                agree("max_pool_backward (first maximum; the last window wins)", dx, dtypes[o], in, EXACT);
            }
            free_args();
        }
}

static void test_dropout(void) {
    size_t n = 5000, i, o, j, kept;
    for (i = 0; i < COUNT(dtypes); i++)
        for (o = 0; o < COUNT(dtypes); o++) {
            arg *mask = new_arg(n), *x = rand_arg(dtypes[i], n, -1.0f, 1.0f), *y = new_arg(n * dsize(dtypes[o]));
            uint64_t seed = rng_next();
            cpu.be->dropout_mask(cpu.ctx, (unsigned char *)mask->host, n, 0.3f, seed);
            gpu.be->dropout_mask(gpu.ctx, (unsigned char *)mask->dev, n, 0.3f, seed);
            same_bytes("dropout_mask", mask);
            for (j = 0, kept = 0; j < n; j++) kept += ((unsigned char *)mask->host)[j];
            CHECK(kept > n * 6 / 10 && kept < n * 8 / 10);
            cpu.be->dropout(cpu.ctx, y->host, dtypes[o], x->host, dtypes[i], (const unsigned char *)mask->host, n,
                            1.0f / 0.7f);
            gpu.be->dropout(gpu.ctx, y->dev, dtypes[o], x->dev, dtypes[i], (const unsigned char *)mask->dev, n,
                            1.0f / 0.7f);
            agree("dropout", y, dtypes[o], n, EXACT);
            free_args();
        }
}

/* The graph layers' ops: the CPU's bytes, as both compute the same float32
   operations in the same order (elementwise in place too; Concatenate's
   blocks both ways; average pooling's window sums and its gradient's sums
   over overlapping windows). */
static void test_graph_ops(void) {
    static const mp_elementwise ops[4] = {MP_EW_ADD, MP_EW_SUBTRACT, MP_EW_MULTIPLY, MP_EW_SCALE};
    /* h w c kh kw sh sw pt pl oh ow: tiling with a border, overlapping, global over 300 channels */
    static const mp_conv_geom pools[] = {{7, 9, 5, 2, 2, 2, 2, 0, 0, 3, 4}, {7, 7, 3, 3, 3, 2, 2, 0, 0, 3, 3},
                                         {7, 7, 300, 7, 7, 7, 7, 0, 0, 1, 1}};
    size_t n = 3001, rows = 211, ca = 13, cb = 6, imgs = 3, i, j, k, o;
    for (o = 0; o < COUNT(ops); o++)
        for (i = 0; i < COUNT(dtypes); i++)
            for (j = 0; j < COUNT(dtypes); j++)
                for (k = 0; k < COUNT(dtypes); k++) {
                    arg *a = rand_arg(dtypes[i], n, -300.0f, 300.0f), *b = rand_arg(dtypes[j], n, -300.0f, 300.0f);
                    arg *y = new_arg(n * dsize(dtypes[k]));
                    cpu.be->elementwise(cpu.ctx, ops[o], y->host, dtypes[k], a->host, dtypes[i], b->host, dtypes[j], 0.375f, n);
                    gpu.be->elementwise(gpu.ctx, ops[o], y->dev, dtypes[k], a->dev, dtypes[i], b->dev, dtypes[j], 0.375f, n);
                    same_bytes("elementwise", y);
                    cpu.be->elementwise(cpu.ctx, ops[o], a->host, dtypes[i], a->host, dtypes[i], b->host, dtypes[j], 0.375f, n);
                    gpu.be->elementwise(gpu.ctx, ops[o], a->dev, dtypes[i], a->dev, dtypes[i], b->dev, dtypes[j], 0.375f, n);
                    same_bytes("elementwise, y == a", a);
                    free_args();
                }
    for (i = 0; i < COUNT(dtypes); i++)
        for (j = 0; j < COUNT(dtypes); j++) {
            size_t si = dsize(dtypes[i]), sj = dsize(dtypes[j]);
            arg *a = rand_arg(dtypes[i], rows * ca, -1.0f, 1.0f), *b = rand_arg(dtypes[i], rows * cb, -1.0f, 1.0f);
            arg *y = new_arg(rows * (ca + cb) * sj), *back = new_arg(rows * (ca + cb) * si);
            const side *sides[2] = {&cpu, &gpu};
            for (k = 0; k < 2; k++) { /* Concatenate([a, b]) in dtypes[j], then its gradient split back */
                const side *at = sides[k];
                char *ya = (char *)(k ? y->dev : y->host), *ba = (char *)(k ? back->dev : back->host);
                at->be->copy_cols(at->ctx, ya, dtypes[j], ca + cb, k ? a->dev : a->host, dtypes[i], ca, rows, ca);
                at->be->copy_cols(at->ctx, ya + ca * sj, dtypes[j], ca + cb, k ? b->dev : b->host, dtypes[i], cb, rows, cb);
                at->be->copy_cols(at->ctx, ba, dtypes[i], ca, ya, dtypes[j], ca + cb, rows, ca);
                at->be->copy_cols(at->ctx, ba + rows * ca * si, dtypes[i], cb, ya + ca * sj, dtypes[j], ca + cb, rows, cb);
            }
            same_bytes("copy_cols: concatenate", y);
            same_bytes("copy_cols: its gradient split", back);
            free_args();
        }
    for (i = 0; i < COUNT(pools); i++)
        for (j = 0; j < COUNT(dtypes); j++) {
            const mp_conv_geom *g = &pools[i];
            size_t in = imgs * (size_t)g->h * (size_t)g->w * (size_t)g->c, out = imgs * (size_t)g->oh * (size_t)g->ow * (size_t)g->c;
            arg *x = rand_arg(dtypes[j], in, -1.0f, 1.0f), *y = new_arg(out * dsize(dtypes[j]));
            arg *dy = rand_arg(dtypes[j], out, -1.0f, 1.0f);
            cpu.be->avg_pool(cpu.ctx, y->host, x->host, imgs, g, dtypes[j]);
            gpu.be->avg_pool(gpu.ctx, y->dev, x->dev, imgs, g, dtypes[j]);
            same_bytes("avg_pool", y);
            for (o = 0; o < COUNT(dtypes); o++) {
                arg *dx = rand_arg(dtypes[o], in, 7.0f, 8.0f); /* overwritten, uncovered cells too */
                cpu.be->avg_pool_backward(cpu.ctx, dx->host, dtypes[o], dy->host, imgs, g, dtypes[j]);
                gpu.be->avg_pool_backward(gpu.ctx, dx->dev, dtypes[o], dy->dev, imgs, g, dtypes[j]);
                same_bytes("avg_pool_backward", dx);
            }
            free_args();
        }
}

/* BatchNormalization and LayerNormalization, forward (training and
   inference) and backward, dx NULL too: both backends sum in mixprec.h's
   order (>>rules: a column in parts of 256 rows, a row as a warp's lanes),
   so every result has the same bits, for every dtype in and out; rows past
   one part, columns past the CPU's tile of 256 and single rows and columns. */
static void test_norms(void) {
    static const size_t shapes[][2] = {{1, 1}, {1, 37}, {600, 70}, {40, 300}};
    size_t s, i, o;
    int training;
    for (s = 0; s < COUNT(shapes); s++)
        for (i = 0; i < COUNT(dtypes); i++)
            for (o = 0; o < COUNT(dtypes); o++) {
                size_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
                mp_dtype dt = dtypes[i], yt = dtypes[o];
                arg *x = rand_arg(dt, n, -2.0f, 3.0f), *dy = rand_arg(dt, n, -1.0f, 1.0f);
                arg *gb = rand_arg(F32, 2 * cols, 0.5f, 1.5f), *moving = rand_arg(F32, 2 * cols, 0.1f, 1.0f);
                arg *stats = rand_arg(F32, 2 * cols, 0.0f, 1.0f), *ln_stats = rand_arg(F32, 2 * rows, 0.0f, 1.0f);
                arg *y = rand_arg(yt, n, 0.0f, 1.0f), *dx = rand_arg(yt, n, 0.0f, 1.0f);
                arg *dgb = rand_arg(F32, 2 * cols, 0.0f, 1.0f);
                for (training = 0; training <= 1; training++) {
                    cpu.be->batch_norm(cpu.ctx, y->host, yt, x->host, dt, rows, cols, (const float *)gb->host,
                                       (float *)stats->host, (float *)moving->host, 0.9f, 1e-3f, training);
                    gpu.be->batch_norm(gpu.ctx, y->dev, yt, x->dev, dt, rows, cols, (const float *)gb->dev,
                                       (float *)stats->dev, (float *)moving->dev, 0.9f, 1e-3f, training);
                    same_bytes(training ? "batch_norm (training)" : "batch_norm (inference)", y);
                    same_bytes("batch_norm's statistics", stats);
                    same_bytes("batch_norm's moving statistics", moving);
                }
                cpu.be->batch_norm_backward(cpu.ctx, NULL, yt, dy->host, x->host, dt, rows, cols, (const float *)gb->host,
                                            (const float *)stats->host, 1e-3f, (float *)dgb->host);
                gpu.be->batch_norm_backward(gpu.ctx, NULL, yt, dy->dev, x->dev, dt, rows, cols, (const float *)gb->dev,
                                            (const float *)stats->dev, 1e-3f, (float *)dgb->dev);
                same_bytes("batch_norm_backward's dgamma, dbeta (dx NULL)", dgb);
                cpu.be->batch_norm_backward(cpu.ctx, dx->host, yt, dy->host, x->host, dt, rows, cols, (const float *)gb->host,
                                            (const float *)stats->host, 1e-3f, (float *)dgb->host);
                gpu.be->batch_norm_backward(gpu.ctx, dx->dev, yt, dy->dev, x->dev, dt, rows, cols, (const float *)gb->dev,
                                            (const float *)stats->dev, 1e-3f, (float *)dgb->dev);
                same_bytes("batch_norm_backward's dx", dx);
                same_bytes("batch_norm_backward's dgamma, dbeta", dgb);
                cpu.be->layer_norm(cpu.ctx, y->host, yt, x->host, dt, rows, cols, (const float *)gb->host, 1e-3f,
                                   (float *)ln_stats->host);
                gpu.be->layer_norm(gpu.ctx, y->dev, yt, x->dev, dt, rows, cols, (const float *)gb->dev, 1e-3f,
                                   (float *)ln_stats->dev);
                same_bytes("layer_norm", y);
                same_bytes("layer_norm's statistics", ln_stats);
                cpu.be->layer_norm_backward(cpu.ctx, dx->host, yt, dy->host, x->host, dt, rows, cols, (const float *)gb->host,
                                            (const float *)ln_stats->host, (float *)dgb->host);
                gpu.be->layer_norm_backward(gpu.ctx, dx->dev, yt, dy->dev, x->dev, dt, rows, cols, (const float *)gb->dev,
                                            (const float *)ln_stats->dev, (float *)dgb->dev);
                same_bytes("layer_norm_backward's dx", dx);
                same_bytes("layer_norm_backward's dgamma, dbeta", dgb);
                free_args();
            }
}

/* GELU's tanh form, the bits on both sides: it calls no library
   function (>>rules' mp__tanh_gelu is IEEE 754's +, -, *, / alone), and
   the CPU's vector rows give the scalar's bits. */
static void test_gelu_tanh(void) {
    size_t i, o, rows = 33, cols = 70, n = rows * cols;
    for (i = 0; i < COUNT(dtypes); i++) {
        mp_dtype dt = dtypes[i];
        arg *x = rand_arg(dt, n, -6.0f, 6.0f), *b = rand_arg(dt, cols, -1.0f, 1.0f), *y = new_arg(n * dsize(dt));
        arg *dy = rand_arg(dt, n, -1.0f, 1.0f);
        cpu.be->bias_act(cpu.ctx, y->host, x->host, b->host, rows, cols, MP_GELU_APPROXIMATE, dt);
        gpu.be->bias_act(gpu.ctx, y->dev, x->dev, b->dev, rows, cols, MP_GELU_APPROXIMATE, dt);
        same_bytes("bias_act, GELU's tanh form", y);
        for (o = 0; o < COUNT(dtypes); o++) {
            arg *dx = new_arg(n * dsize(dtypes[o]));
            cpu.be->act_backward(cpu.ctx, dx->host, dtypes[o], dy->host, y->host, x->host, rows, cols,
                                 MP_GELU_APPROXIMATE, dt);
            gpu.be->act_backward(gpu.ctx, dx->dev, dtypes[o], dy->dev, y->dev, x->dev, rows, cols, MP_GELU_APPROXIMATE,
                                 dt);
            same_bytes("act_backward, GELU's tanh form", dx);
        }
        free_args();
    }
}

/* Attention on the CPU (widened rows, blocked products) against the
   device's >>rules rows: the same bits, at widths on both sides of the
   CPU's blocks of 16 and causal or not. */
static void test_attention(void) {
    static const size_t shapes[][2] = {{1, 4}, {5, 16}, {37, 17}, {20, 3}, {66, 32}}; /* t, d */
    size_t s, i;
    int causal;
    for (s = 0; s < COUNT(shapes); s++)
        for (i = 0; i < COUNT(dtypes); i++)
            for (causal = 0; causal <= 1; causal++) {
                size_t t = shapes[s][0], d = shapes[s][1], batch = 2, heads = 3, n = batch * t * heads * d;
                size_t tt = batch * heads * t * t;
                mp_dtype dt = dtypes[i];
                float scale = 1.0f / sqrtf((float)d);
                arg *q = rand_arg(dt, n, -2.0f, 2.0f), *k = rand_arg(dt, n, -2.0f, 2.0f), *v = rand_arg(dt, n, -1.0f, 1.0f);
                arg *datt = rand_arg(dt, n, -1.0f, 1.0f), *att = rand_arg(dt, n, 0.0f, 1.0f), *p = rand_arg(dt, tt, 0.0f, 1.0f);
                arg *sc = rand_arg(F32, tt, 0.0f, 1.0f), *dq = rand_arg(dt, n, 0.0f, 1.0f), *dk = rand_arg(dt, n, 0.0f, 1.0f);
                arg *dv = rand_arg(dt, n, 0.0f, 1.0f);
                cpu.be->attention(cpu.ctx, att->host, p->host, (float *)sc->host, q->host, k->host, v->host, dt, batch, t,
                                  heads, d, scale, causal);
                gpu.be->attention(gpu.ctx, att->dev, p->dev, (float *)sc->dev, q->dev, k->dev, v->dev, dt, batch, t, heads, d,
                                  scale, causal);
                same_bytes("attention", att);
                same_bytes("attention's probabilities", p);
                cpu.be->attention_backward(cpu.ctx, dq->host, dk->host, dv->host, (float *)sc->host, datt->host, q->host,
                                           k->host, v->host, p->host, dt, batch, t, heads, d, scale, causal);
                gpu.be->attention_backward(gpu.ctx, dq->dev, dk->dev, dv->dev, (float *)sc->dev, datt->dev, q->dev, k->dev,
                                           v->dev, p->dev, dt, batch, t, heads, d, scale, causal);
                same_bytes("attention_backward's dq", dq);
                same_bytes("attention_backward's dk", dk);
                same_bytes("attention_backward's dv", dv);
                free_args();
            }
}

/* The context's own accounting: blocks come and go, the peak stays. */
static void test_memory(void) {
    mp_backend_memory a, b, c;
    void *p;
    gpu.be->memory(gpu.ctx, &a);
    p = gpu.be->alloc(gpu.ctx, 1000000);
    CHECK(p != NULL && (uintptr_t)p % 256 == 0);
    gpu.be->memory(gpu.ctx, &b);
    CHECK(b.current == a.current + 1000000 && b.peak >= b.current);
    gpu.be->free(gpu.ctx, p);
    gpu.be->memory(gpu.ctx, &c);
    CHECK(c.current == a.current && c.peak == b.peak);
    CHECK(a.workspace >= 32u << 20 && a.current >= a.workspace);
    { /* the block is zeroed */
        arg *z = new_arg(4096);
        unsigned char *h = (unsigned char *)fetch(z);
        size_t i, nonzero = 0;
        for (i = 0; i < 4096; i++) nonzero += h[i] != 0;
        CHECK(nonzero == 0);
        free(h);
        free_args();
    }
}

/* ======================================================================== */
/* Models */

#define INPUTS 64
#define CLASSES 10
#define BATCH 64

static void synthetic(float *x, int32_t *labels, size_t n, size_t features) {
    size_t i;
    for (i = 0; i < n * features; i++) x[i] = uniform(0.0f, 1.0f);
    for (i = 0; i < n; i++) labels[i] = (int32_t)(rng_next() % CLASSES);
}

/* policy "amp": float32 layers and automatic mixed precision (float16) */
static mp_model *mlp(const mp_backend *be, const char *policy, const mp_loss_scale_desc *ls) {
    mp_model_desc md;
    mp_compile_desc cd;
    mp_layer_desc softmax = mp_activation_layer(MP_SOFTMAX);
    mp_model *m = NULL;
    int amp = strcmp(policy, "amp") == 0;
    memset(&md, 0, sizeof md);
    memset(&cd, 0, sizeof cd);
    md.input_shape[0] = INPUTS;
    md.backend = be;
    md.threads = 1;
    if (mp_set_global_policy_name(amp ? "float32" : policy) != MP_OK || mp_model_create(&m, &md) != MP_OK) return NULL;
    softmax.dtype = "float32";
    CHECK(mp_model_add(m, mp_dense(48, MP_RELU)) == MP_OK);
    CHECK(mp_model_add(m, mp_dense(32, MP_GELU)) == MP_OK);
    CHECK(mp_model_add(m, mp_dense(CLASSES, MP_LINEAR)) == MP_OK);
    CHECK(mp_model_add(m, softmax) == MP_OK);
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    cd.metrics = MP_METRIC_ACCURACY;
    cd.optimizer.kind = MP_SGD; /* linear in the gradients: differences stay small */
    cd.optimizer.learning_rate = 0.05f;
    cd.optimizer.momentum = 0.9f;
    cd.amp.enabled = amp;
    /* BiasAdd off the lists: the Dense layers after the first multiply in
       float16 and add a float32 bias into a float32 output */
    cd.amp.infer_remove = "BiasAdd";
    if (ls) {
        cd.loss_scale = MP_LOSS_SCALE_ON;
        cd.loss_scale_config = *ls;
    }
    CHECK(mp_model_compile(m, &cd) == MP_OK);
    return m;
}

/* The guide's train_step; returns the loss (NaN on a failure, also checked). */
static float train_step(mp_model *m, const float *x, const int32_t *labels, int batch, int *applied) {
    float loss = NAN;
    size_t right;
    int ok = forward_rows(m, x, batch, 1) == MP_OK && loss_rows(m, labels, NULL, batch, &loss, &right) == MP_OK &&
             mp_compute_scaled_gradients(m) == MP_OK && mp_get_unscaled_gradients(m) == MP_OK &&
             mp_apply_gradients(m, applied) == MP_OK;
    if (!CHECK(ok)) fprintf(stderr, "  train_step: %s\n", mp_model_error(m));
    return loss;
}

/* How many of two models' weights differ by more than atol. */
static size_t weights_apart(mp_model *a, mp_model *b, float atol) {
    size_t n = mp_model_param_count(a), i, bad = 0;
    float *wa = (float *)zalloc(n * sizeof(float)), *wb = (float *)zalloc(n * sizeof(float));
    tol t = {atol, 0.0f};
    CHECK(mp_model_get_weights(a, wa, n) == MP_OK && mp_model_get_weights(b, wb, n) == MP_OK);
    for (i = 0; i < n; i++) bad += !within(wb[i], wa[i], t);
    free(wa);
    free(wb);
    return bad;
}

/* The optimizer's options in a model on both backends: SGD with momentum,
   weight decay with the biases excluded and clipping by the global norm
   (0.5, below the first steps' norms), then clipnorm: the same weights
   within mixed_float16's rounding, as for the plain optimizer. */
static void test_options_match_cpu(void) {
    static const char *const biases[] = {"bias", NULL};
    float *x = (float *)zalloc(BATCH * INPUTS * sizeof(float));
    int32_t *labels = (int32_t *)zalloc(BATCH * sizeof(int32_t));
    int mode;
    synthetic(x, labels, BATCH, INPUTS);
    for (mode = 0; mode < 2; mode++) {
        mp_model *mc = mlp(NULL, "mixed_float16", NULL), *mg = mlp(mp_cuda_backend(), "mixed_float16", NULL);
        mp_compile_desc cd;
        size_t bad;
        int step, applied;
        if (!CHECK(mc && mg)) return;
        memset(&cd, 0, sizeof cd);
        cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
        cd.optimizer.kind = MP_SGD;
        cd.optimizer.learning_rate = 0.05f;
        cd.optimizer.momentum = 0.9f;
        cd.optimizer.weight_decay = 0.01f;
        cd.optimizer.exclude_from_weight_decay = biases;
        if (mode) cd.optimizer.clipnorm = 0.25f;
        else cd.optimizer.global_clipnorm = 0.5f;
        CHECK(mp_model_compile(mc, &cd) == MP_OK && mp_model_compile(mg, &cd) == MP_OK);
        for (step = 0; step < 6; step++) {
            (void)train_step(mc, x, labels, BATCH, &applied);
            (void)train_step(mg, x, labels, BATCH, &applied);
        }
        if (!CHECK((bad = weights_apart(mc, mg, 1e-3f)) == 0))
            fprintf(stderr, "  %s: %zu weights differ\n", mode ? "clipnorm" : "global_clipnorm", bad);
        mp_model_destroy(mc);
        mp_model_destroy(mg);
    }
    free(x);
    free(labels);
}

/* A few steps on both backends from the same seed: the same losses, and
   weights, within what the policy's rounding lets differ. */
static void test_mlp_matches_cpu(void) {
    static const char *policies[] = {"float32", "mixed_float16", "mixed_bfloat16", "amp"};
    /* GEMMs summed in another order, 16-bit values one ulp apart, grown over 6 steps */
    static const float loss_rtol[] = {1e-4f, 1e-2f, 3e-2f, 1e-2f}, weight_atol[] = {1e-4f, 1e-3f, 1e-2f, 1e-3f};
    float *x = (float *)zalloc(4 * BATCH * INPUTS * sizeof(float));
    int32_t *labels = (int32_t *)zalloc(4 * BATCH * sizeof(int32_t));
    size_t p, i;
    synthetic(x, labels, 4 * BATCH, INPUTS);
    for (p = 0; p < COUNT(policies); p++) {
        mp_model *mc = mlp(NULL, policies[p], NULL), *mg = mlp(mp_cuda_backend(), policies[p], NULL);
        size_t n = mp_model_param_count(mc), bad = 0;
        mp_tensor oc, og;
        int step, applied;
        if (!CHECK(mc && mg)) return;
        for (step = 0; step < 6; step++) {
            const float *xb = x + (size_t)(step % 4) * BATCH * INPUTS;
            const int32_t *lb = labels + (step % 4) * BATCH;
            float lc = train_step(mc, xb, lb, BATCH, &applied), lg = train_step(mg, xb, lb, BATCH, &applied);
            tol t = {0.0f, loss_rtol[p]};
            if (!CHECK(within(lg, lc, t)))
                fprintf(stderr, "  %s step %d: loss gpu %.9g cpu %.9g\n", policies[p], step, (double)lg, (double)lc);
        }
        if (!CHECK((bad = weights_apart(mc, mg, weight_atol[p])) == 0))
            fprintf(stderr, "  %s: %zu of %zu weights differ\n", policies[p], bad, n);
        /* the output, read back from the device (inference) */
        CHECK(forward_rows(mc, x, BATCH, 0) == MP_OK && forward_rows(mg, x, BATCH, 0) == MP_OK);
        CHECK(mp_output(mc, &oc) == MP_OK && mp_output(mg, &og) == MP_OK);
        CHECK(og.dtype == F32 && og.shape[0] == BATCH && og.shape[1] == CLASSES);
        for (i = 0, bad = 0; i < (size_t)BATCH * CLASSES; i++) {
            tol t = {weight_atol[p], loss_rtol[p]};
            bad += !within(((float *)og.data)[i], ((float *)oc.data)[i], t);
        }
        CHECK(bad == 0);
        mp_model_destroy(mc);
        mp_model_destroy(mg);
    }
    free(x);
    free(labels);
}

/* Injected Infs: a pixel of 1e30 is finite in float32 and Inf in float16,
   so under mixed_float16 those steps' gradients are not finite. The scale
   must follow the CPU's trajectory exactly: halved and the step skipped
   there, doubled every 2 good steps, up to the cap (reached at step 15). */
static void test_loss_scale_trajectory(void) {
    static const int poisoned[] = {0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    mp_loss_scale_desc lsd;
    float *x = (float *)zalloc(BATCH * INPUTS * sizeof(float)), *xp = (float *)zalloc(BATCH * INPUTS * sizeof(float));
    int32_t *labels = (int32_t *)zalloc(BATCH * sizeof(int32_t));
    mp_model *mc, *mg;
    size_t s;
    memset(&lsd, 0, sizeof lsd);
    lsd.initial_scale = 1024.0f, lsd.growth_interval = 2, lsd.max_scale = 8192.0f;
    synthetic(x, labels, BATCH, INPUTS);
    memcpy(xp, x, BATCH * INPUTS * sizeof(float));
    xp[5 * INPUTS + 7] = 1e30f;
    mc = mlp(NULL, "mixed_float16", &lsd);
    mg = mlp(mp_cuda_backend(), "mixed_float16", &lsd);
    if (!CHECK(mc && mg)) return;
    for (s = 0; s < COUNT(poisoned); s++) {
        int ac = -1, ag = -2;
        const mp_loss_scale *lc, *lg;
        (void)train_step(mc, poisoned[s] ? xp : x, labels, BATCH, &ac);
        (void)train_step(mg, poisoned[s] ? xp : x, labels, BATCH, &ag);
        lc = mp_model_loss_scale(mc);
        lg = mp_model_loss_scale(mg);
        CHECK(ac == !poisoned[s] && ag == ac);
        if (!CHECK(lc && lg && lg->scale == lc->scale && lg->good_steps == lc->good_steps &&
                   lg->skipped_steps == lc->skipped_steps && lg->steps == lc->steps))
            fprintf(stderr, "  step %zu: scale gpu %g cpu %g\n", s, lg ? (double)lg->scale : 0.0,
                    lc ? (double)lc->scale : 0.0);
    }
    CHECK(mp_model_loss_scale(mg)->skipped_steps == 3 && mp_current_loss_scale(mg) == 8192.0f);
    mp_model_destroy(mc);
    mp_model_destroy(mg);
    free(x);
    free(xp);
    free(labels);
}

/* Two runs from scratch on the GPU: the same bits, losses and weights. */
static void test_rerun_bit_identical(void) {
    float *x = (float *)zalloc(BATCH * INPUTS * sizeof(float));
    int32_t *labels = (int32_t *)zalloc(BATCH * sizeof(int32_t));
    float *w[2] = {NULL, NULL}, losses[2][5];
    size_t n = 0;
    int run, s, applied;
    synthetic(x, labels, BATCH, INPUTS);
    for (run = 0; run < 2; run++) {
        mp_model *m = mlp(mp_cuda_backend(), "mixed_float16", NULL);
        if (!CHECK(m != NULL)) return;
        n = mp_model_param_count(m);
        w[run] = (float *)zalloc(n * sizeof(float));
        for (s = 0; s < 5; s++) losses[run][s] = train_step(m, x, labels, BATCH, &applied);
        CHECK(mp_model_get_weights(m, w[run], n) == MP_OK);
        mp_model_destroy(m);
    }
    CHECK(memcmp(losses[0], losses[1], sizeof losses[0]) == 0);
    CHECK(memcmp(w[0], w[1], n * sizeof(float)) == 0);
    free(w[0]);
    free(w[1]);
    free(x);
    free(labels);
}

/* Under tests/cuda_emu.h (absent from the real library: weak, NULL) */
typedef struct cuda_emu_counts {
    unsigned long long launches, waits, drains, pageable, pinned, bytes_in, heuristics;
} cuda_emu_counts;
#ifdef __cplusplus
extern "C" {
#endif
void cuda_emu_counters(cuda_emu_counts *out) __attribute__((weak));
void cuda_emu_fault_after(long launches) __attribute__((weak));
#ifdef __cplusplus
}
#endif

/* Conv2D (im2col, col2im), MaxPooling2D, Flatten, Dropout and a
   categorical crossentropy from logits, trained on both backends. */
static void test_conv_model(void) {
    static const char *policies[] = {"float32", "mixed_float16"};
    static const float rtol[] = {1e-4f, 1e-2f};
    size_t p, i, features = 10 * 12 * 3, n = 20, outs = 4;
    float *x = (float *)zalloc(n * features * sizeof(float)), *y = (float *)zalloc(n * outs * sizeof(float));
    for (i = 0; i < n * features; i++) x[i] = uniform(0.0f, 1.0f);
    for (i = 0; i < n; i++) y[i * outs + rng_next() % outs] = 1.0f;
    for (p = 0; p < COUNT(policies); p++) {
        mp_model *m[2] = {NULL, NULL};
        float loss[2][3];
        int b, s;
        for (b = 0; b < 2; b++) {
            mp_model_desc md;
            mp_compile_desc cd;
            memset(&md, 0, sizeof md);
            memset(&cd, 0, sizeof cd);
            md.input_shape[0] = 10, md.input_shape[1] = 12, md.input_shape[2] = 3;
            md.backend = b ? mp_cuda_backend() : NULL;
            CHECK(mp_set_global_policy_name(policies[p]) == MP_OK && mp_model_create(&m[b], &md) == MP_OK);
            if (!m[b]) return;
            CHECK(mp_model_add(m[b], mp_conv2d(8, 3, 3, MP_SAME, MP_RELU)) == MP_OK);
            CHECK(mp_model_add(m[b], mp_max_pooling2d(2, 2)) == MP_OK);
            CHECK(mp_model_add(m[b], mp_conv2d(8, 2, 2, MP_VALID, MP_TANH)) == MP_OK);
            CHECK(mp_model_add(m[b], mp_flatten()) == MP_OK);
            CHECK(mp_model_add(m[b], mp_dropout(0.25f)) == MP_OK);
            CHECK(mp_model_add(m[b], mp_dense((int)outs, MP_LINEAR)) == MP_OK);
            cd.loss = MP_CATEGORICAL_CROSSENTROPY;
            cd.from_logits = 1;
            cd.optimizer.kind = MP_SGD;
            cd.optimizer.learning_rate = 0.05f;
            cd.loss_scale = MP_LOSS_SCALE_NONE; /* no step near the overflow edge */
            CHECK(mp_model_compile(m[b], &cd) == MP_OK);
            for (s = 0; s < 3; s++) {
                size_t right;
                int applied, ok = forward_rows(m[b], x, n, 1) == MP_OK &&
                                  loss_rows(m[b], NULL, y, n, &loss[b][s], &right) == MP_OK &&
                                  mp_compute_scaled_gradients(m[b]) == MP_OK &&
                                  mp_get_unscaled_gradients(m[b]) == MP_OK && mp_apply_gradients(m[b], &applied) == MP_OK;
                if (!CHECK(ok)) fprintf(stderr, "  conv model: %s\n", mp_model_error(m[b]));
            }
        }
        for (s = 0; s < 3; s++) {
            tol t = {0.0f, rtol[p]};
            if (!CHECK(within(loss[1][s], loss[0][s], t)))
                fprintf(stderr, "  conv %s step %d: loss gpu %.9g cpu %.9g\n", policies[p], s, (double)loss[1][s],
                        (double)loss[0][s]);
        }
        if (cuda_emu_counters) { /* the batch is one im2col and one product per layer and direction */
            cuda_emu_counts c0, c1, c2;
            cuda_emu_counters(&c0);
            CHECK(forward_rows(m[1], x, n / 2, 1) == MP_OK);
            cuda_emu_counters(&c1);
            CHECK(forward_rows(m[1], x, n, 1) == MP_OK);
            cuda_emu_counters(&c2);
            CHECK(c2.launches - c1.launches == c1.launches - c0.launches); /* whatever the batch */
        }
        mp_model_destroy(m[0]);
        mp_model_destroy(m[1]);
    }
    free(x);
    free(y);
}

/* Three training steps of model b (0 the CPU's, 1 the GPU's) on (d, y):
   each step's loss into loss[b], then its weights into w[b] (the caller
   frees them); the GPU's losses are compared with the CPU's, which ran
   first. */
static void three_steps(mp_model *m[2], int b, const mp_data *d, const mp_array *y, float loss[2][3], float *w[2],
                        float rtol, const char *what) {
    size_t nw = mp_model_param_count(m[b]);
    int s, ok, applied;
    w[b] = (float *)zalloc(nw * sizeof(float));
    for (s = 0; s < 3; s++) {
        ok = mp_forward(m[b], d, 1) == MP_OK && mp_compute_loss(m[b], y, &loss[b][s], NULL) == MP_OK &&
             mp_compute_scaled_gradients(m[b]) == MP_OK && mp_get_unscaled_gradients(m[b]) == MP_OK &&
             mp_apply_gradients(m[b], &applied) == MP_OK;
        if (!CHECK(ok)) fprintf(stderr, "  %s: %s\n", what, mp_model_error(m[b]));
    }
    CHECK(mp_model_get_weights(m[b], w[b], nw) == MP_OK);
    for (s = 0; b == 1 && s < 3; s++) {
        tol t = {0.0f, rtol};
        if (!CHECK(within(loss[1][s], loss[0][s], t)))
            fprintf(stderr, "  %s step %d: loss gpu %.9g cpu %.9g\n", what, s, (double)loss[1][s], (double)loss[0][s]);
    }
}

/* A graph on the device: a residual block with BatchNormalization, a
   Concatenate of two branches, AveragePooling2D, LayerNormalization,
   GlobalAveragePooling2D; three SGD steps' losses and the moving
   statistics match the CPU's (the normalizations and merges are the CPU's
   bits; the products are cuBLASLt's). */
static void test_graph_model(void) {
    static const char *policies[] = {"float32", "mixed_bfloat16"};
    static const float rtol[] = {1e-4f, 3e-2f};
    size_t p, i, features = 8 * 8 * 2, n = 16, outs = 3;
    float *x = (float *)zalloc(n * features * sizeof(float)), *y = (float *)zalloc(n * outs * sizeof(float));
    for (i = 0; i < n * features; i++) x[i] = uniform(0.0f, 1.0f);
    for (i = 0; i < n; i++) y[i * outs + rng_next() % outs] = 1.0f;
    for (p = 0; p < COUNT(policies); p++) {
        mp_model *m[2] = {NULL, NULL};
        float loss[2][3], *w[2] = {NULL, NULL};
        mp_data d = data_xy(x, (int)features, NULL, n);
        mp_array ys = mp_rows(y, n, (int)outs);
        int b;
        for (b = 0; b < 2; b++) {
            mp_model_desc md;
            mp_compile_desc cd;
            int stem = 0, a = 0, c = 0, pair[2], ok;
            memset(&md, 0, sizeof md);
            memset(&cd, 0, sizeof cd);
            md.input_shape[0] = 8, md.input_shape[1] = 8, md.input_shape[2] = 2;
            md.backend = b ? mp_cuda_backend() : NULL;
            CHECK(mp_set_global_policy_name(policies[p]) == MP_OK && mp_model_create(&m[b], &md) == MP_OK);
            if (!m[b]) return;
            ok = mp_model_call(m[b], mp_conv2d(4, 3, 3, MP_SAME, MP_RELU), NULL, 0, &stem) == MP_OK &&
                 mp_model_add(m[b], mp_conv2d(4, 3, 3, MP_SAME, MP_LINEAR)) == MP_OK &&
                 mp_model_call(m[b], mp_batch_normalization(), NULL, 0, &a) == MP_OK;
            pair[0] = a, pair[1] = stem;
            ok = ok && mp_model_call(m[b], mp_add(), pair, 2, &a) == MP_OK &&
                 mp_model_call(m[b], mp_conv2d(2, 1, 1, MP_VALID, MP_TANH), &stem, 1, &c) == MP_OK;
            pair[0] = a, pair[1] = c;
            ok = ok && mp_model_call(m[b], mp_concatenate(0), pair, 2, NULL) == MP_OK &&
                 mp_model_add(m[b], mp_average_pooling2d(2, 2)) == MP_OK &&
                 mp_model_add(m[b], mp_layer_normalization()) == MP_OK &&
                 mp_model_add(m[b], mp_global_average_pooling2d()) == MP_OK &&
                 mp_model_add(m[b], mp_dense((int)outs, MP_LINEAR)) == MP_OK;
            cd.loss = MP_CATEGORICAL_CROSSENTROPY;
            cd.from_logits = 1;
            cd.optimizer.kind = MP_SGD;
            cd.optimizer.learning_rate = 0.05f;
            if (!CHECK(ok && mp_model_compile(m[b], &cd) == MP_OK)) fprintf(stderr, "  graph: %s\n", mp_model_error(m[b]));
            three_steps(m, b, &d, &ys, loss, w, rtol[p], policies[p]); /* the same seed: the same initial weights */
        }
        { /* BatchNormalization's moving statistics (after the two convolutions' weights and gamma, beta) */
            size_t at = (3 * 3 * 2 * 4 + 4) + (3 * 3 * 4 * 4 + 4) + 8, k;
            tol t = {1e-6f, rtol[p]};
            for (k = at; k < at + 8; k++)
                if (!CHECK(within(w[1][k], w[0][k], t)))
                    fprintf(stderr, "  graph %s moving statistic %zu: gpu %.9g cpu %.9g\n", policies[p], k - at,
                            (double)w[1][k], (double)w[0][k]);
        }
        mp_model_destroy(m[0]);
        mp_model_destroy(m[1]);
        free(w[0]);
        free(w[1]);
    }
    free(x);
    free(y);
}

/* A small causal transformer on token ids, (batch, time) labels: Embedding,
   PositionEmbedding, LayerNormalization, MultiHeadAttention, Dense over
   the last axis with the tanh gelu; three steps on the GPU and the CPU
   from the same weights: the same losses and weights within rounding. */
static void test_sequence_model(void) {
    enum { T = 6, V = 9, C = 8, N = 4 };
    static const char *policies[] = {"float32", "mixed_float16"};
    static const float rtol[] = {1e-4f, 3e-2f};
    int32_t ids[N * T], next[N * T];
    size_t p, i;
    int shape = T;
    for (i = 0; i < N * T; i++) ids[i] = (int32_t)(rng_next() % V), next[i] = (int32_t)(rng_next() % V);
    for (p = 0; p < COUNT(policies); p++) {
        mp_model *m[2] = {NULL, NULL};
        float loss[2][3], *w[2] = {NULL, NULL};
        size_t nw = 0;
        int b;
        for (b = 0; b < 2; b++) {
            mp_model_desc md;
            mp_compile_desc cd;
            mp_data d;
            mp_array y = mp_array_i32(next, N, 1, &shape);
            int tok = 0, pos = 0, x = 0, a = 0, pair[2], ok;
            memset(&md, 0, sizeof md);
            memset(&cd, 0, sizeof cd);
            memset(&d, 0, sizeof d);
            d.x[0] = mp_array_i32(ids, N, 1, &shape);
            md.input_shape[0] = T;
            md.backend = b ? mp_cuda_backend() : NULL;
            CHECK(mp_set_global_policy_name(policies[p]) == MP_OK && mp_model_create(&m[b], &md) == MP_OK);
            if (!m[b]) return;
            ok = mp_model_call(m[b], mp_embedding(V, C), NULL, 0, &tok) == MP_OK &&
                 mp_model_call(m[b], mp_position_embedding(T), &tok, 1, &pos) == MP_OK;
            pair[0] = tok, pair[1] = pos;
            ok = ok && mp_model_call(m[b], mp_add(), pair, 2, &x) == MP_OK &&
                 mp_model_add(m[b], mp_layer_normalization()) == MP_OK &&
                 mp_model_call(m[b], mp_multi_head_attention(2, 4, 1), NULL, 0, &a) == MP_OK;
            pair[0] = x, pair[1] = a;
            ok = ok && mp_model_call(m[b], mp_add(), pair, 2, NULL) == MP_OK &&
                 mp_model_add(m[b], mp_dense(2 * C, MP_GELU_APPROXIMATE)) == MP_OK &&
                 mp_model_add(m[b], mp_dense(V, MP_LINEAR)) == MP_OK;
            mp_set_global_policy_name("float32");
            cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
            cd.from_logits = 1;
            cd.optimizer.kind = MP_SGD;
            cd.optimizer.learning_rate = 0.1f;
            if (!CHECK(ok && mp_model_compile(m[b], &cd) == MP_OK)) fprintf(stderr, "  sequence: %s\n", mp_model_error(m[b]));
            nw = mp_model_param_count(m[b]);
            three_steps(m, b, &d, &y, loss, w, rtol[p], policies[p]);
        }
        for (i = 0; i < nw; i++) {
            tol t = {1e-3f, rtol[p]};
            if (!within(w[1][i], w[0][i], t)) {
                CHECK(0);
                fprintf(stderr, "  sequence %s weight %zu: gpu %.9g cpu %.9g\n", policies[p], i, (double)w[1][i],
                        (double)w[0][i]);
                break;
            }
        }
        mp_model_destroy(m[0]);
        mp_model_destroy(m[1]);
        free(w[0]);
        free(w[1]);
    }
}

/* mp_model_memory_info reports device bytes, which add up. */
static void test_model_memory(void) {
    size_t host = mp_get_memory_info().current;
    mp_model *m = mlp(mp_cuda_backend(), "mixed_float16", NULL);
    float *x = (float *)zalloc(BATCH * INPUTS * sizeof(float));
    int32_t *labels = (int32_t *)zalloc(BATCH * sizeof(int32_t));
    mp_model_memory mem;
    int applied;
    if (!CHECK(m != NULL)) return;
    synthetic(x, labels, BATCH, INPUTS);
    (void)train_step(m, x, labels, BATCH, &applied);
    CHECK(mp_model_memory_info(m, &mem) == MP_OK);
    CHECK(strcmp(mem.backend, "cuda") == 0);
    CHECK(mem.weights > 0 && mem.optimizer > 0 && mem.activations > 0 && mem.workspace >= 32u << 20);
    CHECK(mem.current == mem.weights + mem.optimizer + mem.activations + mem.workspace);
    CHECK(mem.peak >= mem.current);
    mp_model_destroy(m);
    CHECK(mp_get_memory_info().current == host); /* the host's bytes back, too */
    free(x);
    free(labels);
}

/* fit's steady state: what `steps` more steps of a fit that prints nothing
   cost in host waits, drains (waits after which the device would idle) and
   copies. The emulation runs nothing before the host waits, so a wait here
   is one a GPU may make the host sit through. */
static cuda_emu_counts fit_counts(mp_model *m, const float *x, const int32_t *labels, size_t steps, int host_data,
                                  mp_cuda_stats *own) {
    mp_fit_desc fd;
    cuda_emu_counts before, after;
    mp_cuda_stats own_before;
    memset(&fd, 0, sizeof fd);
    fd.data = data_xy(x, INPUTS, labels, steps * BATCH);
    fd.batch_size = BATCH;
    fd.verbose = MP_VERBOSE_SILENT;
    fd.host_data = host_data;
    cuda_emu_counters(&before);
    mp_cuda_get_stats(&own_before);
    CHECK(mp_model_fit(m, &fd) == MP_OK);
    cuda_emu_counters(&after);
    mp_cuda_get_stats(own);
    own->launches -= own_before.launches, own->host_waits -= own_before.host_waits;
    own->bytes_in -= own_before.bytes_in, own->fallbacks -= own_before.fallbacks;
    after.launches -= before.launches, after.waits -= before.waits, after.drains -= before.drains;
    after.pageable -= before.pageable, after.pinned -= before.pinned, after.bytes_in -= before.bytes_in;
    return after;
}

/* A steady-state step blocks on nothing: no drain (the device never idles
   for the host). With the data on the device (fit's default): no wait and
   nothing copied in at all. With host_data: one wait, for the staging set
   it refills (the batch before last's copies: the device still has the
   last batch to work on), no pageable copy, and the batch in as one pinned
   copy of the inputs and one of the labels. */
static void test_steady_state(void) {
    size_t steps = 8, per_batch = BATCH * (INPUTS * sizeof(float) + sizeof(int32_t));
    float *x = (float *)zalloc(2 * steps * BATCH * INPUTS * sizeof(float));
    int32_t *labels = (int32_t *)zalloc(2 * steps * BATCH * sizeof(int32_t));
    mp_model *m = mlp(mp_cuda_backend(), "mixed_float16", NULL);
    cuda_emu_counts one, two;
    mp_cuda_stats own_one, own_two;
    int host;
    if (!cuda_emu_counters) { /* a real GPU: its counts are Nsight's to take */
        mp_model_destroy(m);
        free(x);
        free(labels);
        return;
    }
    synthetic(x, labels, 2 * steps * BATCH, INPUTS);
    if (!CHECK(m != NULL)) return;
    for (host = 0; host < 2; host++) {
        (void)fit_counts(m, x, labels, 2 * steps, host, &own_one); /* sizes everything */
        one = fit_counts(m, x, labels, steps, host, &own_one);
        two = fit_counts(m, x, labels, 2 * steps, host, &own_two);
        printf("test_cuda: a steady-state fit step (%s): %llu launches, %llu waits, %llu drains, %llu pageable and "
               "%llu pinned copies\n", host ? "host_data" : "data on the device", (two.launches - one.launches) / steps,
               (two.waits - one.waits) / steps, (two.drains - one.drains) / steps, (two.pageable - one.pageable) / steps,
               (two.pinned - one.pinned) / steps);
        if (!getenv("MIXPREC_CUDA_EMU_EAGER")) { /* the lazy order's counts */
            CHECK(two.drains == one.drains);
            CHECK(two.waits - one.waits == (host ? steps : 0));
        }
        CHECK(two.pinned - one.pinned == (host ? 2 * steps : 0));
        if (host) CHECK(two.pageable == one.pageable && two.bytes_in - one.bytes_in == steps * per_batch);
        else /* the data once per fit (more of it in the longer fit), the order once per epoch */
            CHECK(two.bytes_in - one.bytes_in == steps * (per_batch + BATCH * sizeof(uint32_t)));
        CHECK(two.heuristics == one.heuristics); /* every plan cached */
        /* the backend's own counts (mp_cuda_get_stats, as bench/gpu_train reports them) agree */
        CHECK(own_two.launches - own_one.launches == two.launches - one.launches);
        CHECK(own_two.bytes_in - own_one.bytes_in == two.bytes_in - one.bytes_in);
        CHECK(own_two.host_waits - own_one.host_waits == (host ? steps : 0) && own_two.fallbacks == 0);
    }
    {   /* aligned float16 products: no fallback */
        mp_model_memory mem;
        CHECK(mp_model_memory_info(m, &mem) == MP_OK && mem.fallbacks == 0);
    }
    mp_model_destroy(m);
    free(x);
    free(labels);
}

/* fit's validation with the data on the device is taken there: the same
   bits as with host_data (each batch sent from the host), and the only
   bytes in are the data, once, and each epoch's order; the validation part
   is not sent again each epoch. */
static void test_validation_on_device(void) {
    enum { N = 5 * BATCH, EPOCHS = 3 };
    size_t n_val = N / 4, n_train = N - n_val, per_sample = INPUTS * sizeof(float) + sizeof(int32_t), n = 0;
    float *x = (float *)zalloc(N * INPUTS * sizeof(float)), *w[2] = {NULL, NULL};
    int32_t *labels = (int32_t *)zalloc(N * sizeof(int32_t));
    mp_logs history[2][EPOCHS];
    mp_cuda_stats before, after;
    int host, e;
    synthetic(x, labels, N, INPUTS);
    for (host = 0; host < 2; host++) {
        mp_model *m = mlp(mp_cuda_backend(), "mixed_float16", NULL);
        mp_fit_desc fd = silent_fit(x, INPUTS, labels, N, BATCH, EPOCHS);
        if (!CHECK(m != NULL)) return;
        fd.validation_split = 0.25f;
        fd.history = history[host];
        fd.host_data = host;
        mp_cuda_get_stats(&before);
        CHECK(mp_model_fit(m, &fd) == MP_OK);
        mp_cuda_get_stats(&after);
        if (!host) CHECK(after.bytes_in - before.bytes_in == N * per_sample + EPOCHS * n_train * sizeof(uint32_t));
        n = mp_model_param_count(m);
        w[host] = (float *)zalloc(n * sizeof(float));
        CHECK(mp_model_get_weights(m, w[host], n) == MP_OK);
        mp_model_destroy(m);
    }
    for (e = 0; e < EPOCHS; e++) {
        CHECK(history[0][e].val_loss > 0 && history[0][e].val_accuracy >= 0);
        CHECK(memcmp(&history[0][e].loss, &history[1][e].loss, sizeof(float)) == 0);
        CHECK(memcmp(&history[0][e].val_loss, &history[1][e].val_loss, sizeof(float)) == 0);
        CHECK(memcmp(&history[0][e].val_accuracy, &history[1][e].val_accuracy, sizeof(float)) == 0);
    }
    CHECK(memcmp(w[0], w[1], n * sizeof(float)) == 0);
    free(w[0]);
    free(w[1]);
    free(x);
    free(labels);
}

/* A custom-loop batch with a NaN fails its step (the device's cast_in
   finds it); a fit after it, of clean data taken on the device, must not
   fail for it: the batches fit gathers there were scanned on the host. */
static void test_fit_after_bad_batch(void) {
    enum { N = 4 * BATCH };
    float *x = (float *)zalloc(N * INPUTS * sizeof(float)), loss;
    int32_t *labels = (int32_t *)zalloc(N * sizeof(int32_t));
    mp_model *m = mlp(mp_cuda_backend(), "mixed_float16", NULL);
    mp_fit_desc fd = silent_fit(x, INPUTS, labels, N, BATCH, 2);
    int host;
    if (!CHECK(m != NULL)) return;
    synthetic(x, labels, N, INPUTS);
    fd.validation_split = 0.25f;
    for (host = 0; host < 2; host++) {
        x[7] = NAN;
        CHECK(forward_rows(m, x, BATCH, 1) == MP_OK); /* a device does not scan the host's input */
        CHECK(loss_rows(m, labels, NULL, BATCH, &loss, NULL) == MP_ERR_NONFINITE);
        x[7] = 0.5f;
        fd.host_data = host;
        CHECK(mp_model_fit(m, &fd) == MP_OK);
    }
    mp_model_destroy(m);
    free(x);
    free(labels);
}

/* A bias not 16-byte aligned (one element into its block, as inside a
   packed weight block): cuBLASLt's BIAS epilogue may fault on it (a
   sticky misaligned address under the emulation), so the backend adds it
   in its own epilogue. Last of the op tests, so that the others' random
   data stay as they were. */
static void test_unaligned_bias(void) {
    static const mp_activation acts[] = {MP_LINEAR, MP_RELU};
    size_t i, x;
    mp_backend_memory before, after;
    gpu.be->memory(gpu.ctx, &before);
    for (i = 0; i < COUNT(dtypes); i++)
        for (x = 0; x < COUNT(acts); x++)
            gemm_case(&gpu, 0, 0, 50, 24, 40, dtypes[i], dtypes[i], dtypes[i], 0, 3, acts[x], tol_gemm(dtypes[i]));
    gpu.be->memory(gpu.ctx, &after);
    CHECK(after.fallbacks - before.fallbacks == COUNT(dtypes) * COUNT(acts)); /* each counted */
}

/* The example: Dense(10) on 33 inputs under mixed_float16, whose
   float16 bias would sit 660 bytes into the layer's weights. The model
   carves the compute-dtype copy's bias on a 256-byte boundary: no
   fallback, the same training as the CPU's, and the float32 weights (what
   get_weights and checkpoints see) packed as before. */
static void test_padded_bias(void) {
    enum { IN = 33, UNITS = 10, N = 32 };
    float x[N * IN], w[2][IN * UNITS + UNITS], back[IN * UNITS + UNITS];
    int32_t labels[N];
    mp_model *m[2] = {NULL, NULL};
    mp_model_memory mem;
    size_t i, bad = 0;
    int b, step, applied;
    synthetic(x, labels, N, IN);
    for (b = 0; b < 2; b++) {
        mp_model_desc md;
        mp_compile_desc cd;
        memset(&md, 0, sizeof md);
        memset(&cd, 0, sizeof cd);
        md.input_shape[0] = IN;
        md.backend = b ? mp_cuda_backend() : NULL;
        md.threads = 1;
        cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
        cd.optimizer.kind = MP_ADAM;
        cd.optimizer.learning_rate = 0.01f;
        if (!CHECK(mp_set_global_policy_name("mixed_float16") == MP_OK && mp_model_create(&m[b], &md) == MP_OK)) return;
        CHECK(mp_model_add(m[b], mp_dense(UNITS, MP_RELU)) == MP_OK && mp_model_compile(m[b], &cd) == MP_OK);
        for (step = 0; step < 3; step++) (void)train_step(m[b], x, labels, N, &applied);
        CHECK(mp_model_param_count(m[b]) == COUNT(back));
        CHECK(mp_model_get_weights(m[b], w[b], COUNT(back)) == MP_OK);
    }
    for (i = 0; i < COUNT(back); i++) {
        tol t = {1e-3f, 0.0f};
        bad += !within(w[1][i], w[0][i], t);
    }
    CHECK(bad == 0);
    CHECK(mp_model_memory_info(m[1], &mem) == MP_OK && mem.fallbacks == 0);
    /* set, then get: the packed float32 order; a step after it reads the new bias */
    for (i = 0; i < COUNT(back); i++) w[0][i] = i < IN * UNITS ? 0.0f : (float)i;
    CHECK(mp_model_set_weights(m[1], w[0], COUNT(back)) == MP_OK && mp_model_get_weights(m[1], back, COUNT(back)) == MP_OK);
    CHECK(memcmp(back, w[0], sizeof back) == 0);
    CHECK(forward_rows(m[1], x, N, 0) == MP_OK);
    {
        mp_tensor out;
        CHECK(mp_output(m[1], &out) == MP_OK && out.dtype == MP_FLOAT16);
        /* a zero kernel: each output its bias, IN * UNITS + j, in float16 */
        CHECK(mp_f16_to_f32(((const mp_f16 *)out.data)[UNITS + 3]) == (float)(IN * UNITS + 3));
    }
    CHECK(mp_model_memory_info(m[1], &mem) == MP_OK && mem.fallbacks == 0);
    mp_model_destroy(m[0]);
    mp_model_destroy(m[1]);
}

/* cuBLASLt's refusals (made by the emulation on request; on a GPU the
   variables do nothing and these are plain products): each product still
   right, on the slower path counted in memory's fallbacks unless it is
   not slower, and the refusal remembered (the heuristic asked once). */
static int refusals_forced; /* test_refusals ran: it forces one compute_32f product */

static void test_refusals(void) {
    side s;
    mp_backend_memory bm;
    mp_cuda_stats before, after;
    cuda_emu_counts c0, c1;
    s.be = mp_cuda_backend();
    /* PEDANTIC refused: CUBLAS_COMPUTE_32F, float32 all the same: no
       fallback, counted in compute_32f */
    setenv("MIXPREC_CUDA_EMU_NO_PEDANTIC", "1", 1);
    refusals_forced = 1;
    if (!CHECK(s.be->create(&s.ctx, 1, NULL) == MP_OK)) return;
    mp_cuda_get_stats(&before);
    gemm_case(&s, 0, 0, 37, 45, 29, F32, F32, F32, 0, 1, MP_LINEAR, tol_gemm(F32));
    mp_cuda_get_stats(&after);
    s.be->memory(s.ctx, &bm);
    CHECK(bm.fallbacks == 0 && (!cuda_emu_counters || after.compute_32f - before.compute_32f == 1));
    s.be->destroy(s.ctx);
    unsetenv("MIXPREC_CUDA_EMU_NO_PEDANTIC");
    /* cublasLtMatmul's own NOT_SUPPORTED: a refusal (not a sticky error),
       widened to float32, counted once per product */
    setenv("MIXPREC_CUDA_EMU_RUN_REFUSES", "1", 1);
    if (!CHECK(s.be->create(&s.ctx, 1, NULL) == MP_OK)) return;
    gemm_case(&s, 0, 0, 37, 45, 29, F16, F16, F16, 0, 1, MP_LINEAR, tol_gemm(F16));
    if (cuda_emu_counters) cuda_emu_counters(&c0);
    gemm_case(&s, 0, 0, 37, 45, 29, F16, F16, F16, 0, 1, MP_LINEAR, tol_gemm(F16));
    if (cuda_emu_counters) {
        cuda_emu_counters(&c1);
        CHECK(c1.heuristics == c0.heuristics); /* the refusal remembered */
    }
    s.be->memory(s.ctx, &bm);
    CHECK(bm.fallbacks == (cuda_emu_counters ? 2u : 0u));
    CHECK(s.be->sync(s.ctx) == MP_OK);
    s.be->destroy(s.ctx);
    unsetenv("MIXPREC_CUDA_EMU_RUN_REFUSES");
}

/* The plan cache keeps what is used: a product run between 70 others
   (more than the cache holds) keeps its plan (the heuristic is not asked
   again), where a first-in first-out cache would have dropped it. */
static void test_plan_cache(void) {
    cuda_emu_counts c0, c1;
    size_t i;
    if (!cuda_emu_counters) return;
    for (i = 0; i < 70; i++) {
        gemm_case(&gpu, 0, 0, 8, 8, 8, F16, F16, F16, 0, 0, MP_LINEAR, tol_gemm(F16));
        gemm_case(&gpu, 0, 0, 9 + i, 8, 8, F16, F16, F16, 0, 0, MP_LINEAR, tol_gemm(F16));
    }
    cuda_emu_counters(&c0);
    gemm_case(&gpu, 0, 0, 8, 8, 8, F16, F16, F16, 0, 0, MP_LINEAR, tol_gemm(F16));
    cuda_emu_counters(&c1);
    CHECK(c1.heuristics == c0.heuristics);
}

/* A device fault (an illegal address in a kernel, injected by the
   emulation) poisons the process's CUDA context: the error says so, every
   context fails, and no new one can be made. Last: it cannot be undone. */
static void test_device_fault(void) {
    arg *x;
    if (!cuda_emu_fault_after) return; /* not on a real GPU */
    x = new_arg(1024);
    cuda_emu_fault_after(0);
    gpu.be->zero(gpu.ctx, x->dev, 1024);
    gpu.be->cast(gpu.ctx, x->dev, F16, x->dev, F32, 256, NULL);
    CHECK(gpu.be->sync(gpu.ctx) == MP_ERR_BACKEND);
    CHECK(strstr(gpu.be->last_error(gpu.ctx), "poisons the CUDA context of the whole process") != NULL);
    CHECK(gpu_tf32.be->sync(gpu_tf32.ctx) == MP_ERR_BACKEND); /* another model's context too */
    CHECK(strstr(gpu_tf32.be->last_error(gpu_tf32.ctx), "whole process") != NULL);
    {
        void *ctx = NULL;
        CHECK(mp_cuda_backend()->create(&ctx, 1, NULL) == MP_ERR_BACKEND && ctx == NULL);
        CHECK(strstr(mp_cuda_last_error(), "poisoned") != NULL);
    }
    free_args();
}

/* A failure is recorded, reported by sync and last_error, and sticks: the
   context does nothing more (another context is not affected). Here a
   product whose float32 scratch (bfloat16 from float16 operands) cannot be
   allocated: 2^20 x 2^20 floats. */
static void test_sticky_error(void) {
    void *ctx = NULL;
    arg *small = new_arg(256);
    mp_gemm_args g;
    CHECK(gpu.be->create(&ctx, 1, NULL) == MP_OK);
    if (!ctx) return;
    memset(&g, 0, sizeof g);
    g.m = g.n = (size_t)1 << 20, g.k = 1;
    g.at = g.bt = F16, g.ct = MP_BFLOAT16;
    g.a = g.b = g.c = small->dev; /* never read: the scratch fails first */
    gpu.be->gemm(ctx, &g);
    CHECK(gpu.be->sync(ctx) == MP_ERR_BACKEND);
    CHECK(strstr(gpu.be->last_error(ctx), "cudaMalloc") != NULL);
    CHECK(gpu.be->alloc(ctx, 16) == NULL); /* it sticks */
    gpu.be->zero(gpu.ctx, small->dev, 256); /* the other context still works */
    CHECK(gpu.be->sync(gpu.ctx) == MP_OK);
    gpu.be->destroy(ctx);
    free_args();
}

static void test_bad_device(void) {
    mp_model_desc md;
    mp_cuda_config cfg;
    mp_model *m = NULL;
    size_t host = mp_get_memory_info().current;
    memset(&md, 0, sizeof md);
    memset(&cfg, 0, sizeof cfg);
    md.input_shape[0] = 4;
    md.backend = mp_cuda_backend();
    md.backend_config = &cfg;
    cfg.device = 999;
    CHECK(mp_model_create(&m, &md) == MP_ERR_ARG && m == NULL);
    CHECK(strstr(mp_cuda_last_error(), "999") != NULL);
    CHECK(mp_get_memory_info().current == host);
}

/* ======================================================================== */

/* No device: the backend must refuse, say why, and leave nothing behind. */
static int no_device(void) {
    mp_model_desc md;
    mp_model *m = (mp_model *)&md; /* must become NULL */
    void *ctx = &md;
    char name[64] = "x";
    char reason[256];
    size_t host = mp_get_memory_info().current;
    snprintf(reason, sizeof reason, "%s", mp_cuda_last_error());
    CHECK(reason[0] != '\0');
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 4;
    md.backend = mp_cuda_backend();
    CHECK(mp_model_create(&m, &md) == MP_ERR_BACKEND && m == NULL);
    CHECK(mp_get_memory_info().current == host);
    CHECK(mp_cuda_backend()->create(&ctx, 1, NULL) == MP_ERR_BACKEND && ctx == NULL);
    CHECK(mp_cuda_last_error()[0] != '\0');
    CHECK(mp_cuda_device_name(0, name, sizeof name) == MP_ERR_BACKEND && name[0] == '\0');
    CHECK(strcmp(mp_cuda_backend()->name, "cuda") == 0 && mp_cuda_backend()->device_memory &&
          mp_cuda_backend()->tensor_cores);
    if (check_failed) return check_done("test_cuda");
    printf("test_cuda: skipped (no CUDA device: %s); the no-device path passed %lu checks\n", reason, check_passed);
    return 0;
}

/* How many true float32 products ran on CUBLAS_COMPUTE_32F because the
   heuristic had no CUBLAS_COMPUTE_32F_PEDANTIC plan. The emulation always
   has one, but for test_refusals' forced refusal (when it ran: a run of
   chosen tests may leave it out); on a GPU the count is cuBLASLt's answer
   for test_cuda's shapes, reported. */
static void report_compute_32f(const mp_cuda_stats *start) {
    mp_cuda_stats end;
    mp_cuda_get_stats(&end);
    printf("test_cuda: %llu float32 products on CUBLAS_COMPUTE_32F for want of a PEDANTIC plan%s\n",
           end.compute_32f - start->compute_32f, !cuda_emu_counters ? "" : refusals_forced ? " (test_refusals forces 1)" : "");
    if (cuda_emu_counters) CHECK(end.compute_32f - start->compute_32f == (unsigned long long)refusals_forced);
}

int main(int argc, char **argv) {
    mp_cuda_config fast;
    mp_cuda_stats start;
    char name[128];
    check_args(argc, argv);
    if (mp_cuda_device_count() == 0) return no_device();
    memset(&fast, 0, sizeof fast);
    fast.tf32 = 1;
    cpu.be = mp_cpu_backend();
    gpu.be = gpu_tf32.be = mp_cuda_backend();
    if (cpu.be->create(&cpu.ctx, 1, NULL) != MP_OK || gpu.be->create(&gpu.ctx, 1, NULL) != MP_OK ||
        gpu_tf32.be->create(&gpu_tf32.ctx, 1, &fast) != MP_OK) {
        printf("test_cuda: cannot create the contexts: %s\n", mp_cuda_last_error());
        return 1;
    }
    if (mp_cuda_device_name(0, name, sizeof name) == MP_OK) printf("test_cuda: device 0 is %s\n", name);
    mp_cuda_get_stats(&start);
    RUN(test_casts());
    RUN(test_gemm());
    RUN(test_activations());
    RUN(test_bias_grad());
    RUN(test_losses());
    RUN(test_loss_scaling());
    RUN(test_optimizers());
    RUN(test_conv_kernels());
    RUN(test_dropout());
    RUN(test_graph_ops());
    RUN(test_norms());
    RUN(test_attention());
    RUN(test_gelu_tanh());
    RUN(test_memory());
    RUN(test_mlp_matches_cpu());
    RUN(test_options_match_cpu());
    RUN(test_loss_scale_trajectory());
    RUN(test_rerun_bit_identical());
    RUN(test_conv_model());
    RUN(test_graph_model());
    RUN(test_sequence_model());
    RUN(test_model_memory());
    RUN(test_steady_state());
    RUN(test_validation_on_device());
    RUN(test_fit_after_bad_batch());
    RUN(test_unaligned_bias());
    RUN(test_padded_bias());
    RUN(test_losses_in_parts());
    RUN(test_refusals());
    RUN(test_plan_cache());
    RUN(test_reductions_rerun());
    RUN(test_loss_rows_lanes());
    RUN(test_sticky_error());
    RUN(test_bad_device());
    report_compute_32f(&start);
    CHECK(gpu.be->sync(gpu.ctx) == MP_OK);
    test_device_fault();
    gpu_tf32.be->destroy(gpu_tf32.ctx);
    gpu.be->destroy(gpu.ctx);
    cpu.be->destroy(cpu.ctx);
    return check_done("test_cuda");
}
