/* bench/attention.c - the tiny GPT's two hottest CPU kernels alone:
   causal self-attention forward and backward (mp_backend.attention,
   attention_backward) and the tanh GELU forward and backward
   (bias_act, act_backward with MP_GELU_APPROXIMATE), in each dtype, on
   the CPU backend. One key=value line per measurement: the best of
   --reps runs, in milliseconds.

     bench_attention [--threads N] [--reps N] [--quick]
       --batch B --heads H --time T --dim D   attention's shape (16 4 64 16)
       --gelu N                                GELU's elements, rows of 1024 (1 << 20) */
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#define BENCH_NAME "bench_attention"
#include "bench.h"
#include <math.h>

static const char *const names[] = {"float32", "float16", "bfloat16"};

/* Values in [-2, 2) in dt, xorshift64 (the same every run). */
static void *rand_values(const mp_backend *be, void *ctx, mp_dtype dt, size_t n) {
    size_t es = dt == MP_FLOAT32 ? 4 : 2, i;
    unsigned long long s = 0x9E3779B97F4A7C15ull;
    float *f = (float *)xmalloc(n * sizeof(float));
    void *p = be->alloc(ctx, n * es);
    if (!p) { fprintf(stderr, "%s: cannot allocate %zu bytes\n", BENCH_NAME, n * es); exit(1); }
    for (i = 0; i < n; i++) f[i] = (float)(xorshift64(&s) >> 40) / (float)(1ull << 24) * 4.0f - 2.0f;
    check(mp_convert(p, dt, f, MP_FLOAT32, n, NULL), NULL, "mp_convert");
    free(f);
    return p;
}

static int arg_int(int argc, char **argv, const char *name, int def) {
    int i;
    for (i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0) return atoi(argv[i + 1]);
    return def;
}

int main(int argc, char **argv) {
    int quick = 0, i, d, r;
    const mp_backend *be = mp_cpu_backend();
    void *ctx = NULL;
    for (i = 1; i < argc; i++) quick |= strcmp(argv[i], "--quick") == 0;
    int threads = arg_int(argc, argv, "--threads", 1), reps = arg_int(argc, argv, "--reps", quick ? 2 : 5);
    size_t batch = (size_t)arg_int(argc, argv, "--batch", 16), heads = (size_t)arg_int(argc, argv, "--heads", 4);
    size_t t = (size_t)arg_int(argc, argv, "--time", 64), dim = (size_t)arg_int(argc, argv, "--dim", 16);
    size_t gelu = (size_t)arg_int(argc, argv, "--gelu", quick ? 1 << 16 : 1 << 20) / 1024 * 1024;
    size_t n = batch * t * heads * dim, tt = batch * heads * t * t;
    float scale = 1.0f / sqrtf((float)dim);
    check(be->create(&ctx, threads, NULL), NULL, "create");
    print_machine("attention");
    for (d = 0; d < 3; d++) {
        mp_dtype dt = (mp_dtype)d;
        void *q = rand_values(be, ctx, dt, n), *k = rand_values(be, ctx, dt, n), *v = rand_values(be, ctx, dt, n);
        void *datt = rand_values(be, ctx, dt, n), *att = rand_values(be, ctx, dt, n), *p = rand_values(be, ctx, dt, tt);
        void *dq = rand_values(be, ctx, dt, n), *dk = rand_values(be, ctx, dt, n), *dv = rand_values(be, ctx, dt, n);
        void *x = rand_values(be, ctx, dt, gelu), *y = rand_values(be, ctx, dt, gelu), *dy = rand_values(be, ctx, dt, gelu);
        float *s = (float *)rand_values(be, ctx, MP_FLOAT32, tt);
        double best[4] = {1e30, 1e30, 1e30, 1e30};
        for (r = 0; r < reps; r++) {
            double t0 = now_s(), t1, t2, t3, t4;
            be->attention(ctx, att, p, s, q, k, v, dt, batch, t, heads, dim, scale, 1);
            t1 = now_s();
            be->attention_backward(ctx, dq, dk, dv, s, datt, q, k, v, p, dt, batch, t, heads, dim, scale, 1);
            t2 = now_s();
            be->bias_act(ctx, y, x, NULL, gelu / 1024, 1024, MP_GELU_APPROXIMATE, dt);
            t3 = now_s();
            be->act_backward(ctx, dy, dt, dy, y, x, gelu / 1024, 1024, MP_GELU_APPROXIMATE, dt);
            t4 = now_s();
            best[0] = t1 - t0 < best[0] ? t1 - t0 : best[0];
            best[1] = t2 - t1 < best[1] ? t2 - t1 : best[1];
            best[2] = t3 - t2 < best[2] ? t3 - t2 : best[2];
            best[3] = t4 - t3 < best[3] ? t4 - t3 : best[3];
        }
        printf("bench=attention dtype=%s threads=%d batch=%zu heads=%zu time=%zu dim=%zu causal=1 forward_ms=%.3f "
               "backward_ms=%.3f\n",
               names[d], threads, batch, heads, t, dim, 1e3 * best[0], 1e3 * best[1]);
        printf("bench=gelu_tanh dtype=%s threads=%d n=%zu forward_ms=%.3f backward_ms=%.3f\n", names[d], threads, gelu,
               1e3 * best[2], 1e3 * best[3]);
        be->free(ctx, q), be->free(ctx, k), be->free(ctx, v), be->free(ctx, datt), be->free(ctx, att), be->free(ctx, p);
        be->free(ctx, dq), be->free(ctx, dk), be->free(ctx, dv), be->free(ctx, x), be->free(ctx, y), be->free(ctx, dy);
        be->free(ctx, s);
    }
    be->destroy(ctx);
    print_machine("attention"); /* the load at the end too */
    return 0;
}
