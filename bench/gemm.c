/* bench/gemm.c - GFLOP/s of mp_matmul beside OpenBLAS and the machine's peak.

   One key=value line per measurement:
       bench=peak      what the cores can do: independent AVX-512 FMAs (float32),
                       vdpbf16ps (bfloat16) and, where the build runs bfloat16
                       products on Intel AMX, tdpbf16ps on four tiles, on 1
                       and 2 threads; these are the denominators of every
                       peak_fraction below (bfloat16: AMX's where it runs).
       bench=gemm impl=mixprec
                       mp_matmul with A, B and C all in one dtype, on a pool of
                       1 or 2 threads: square sizes, then every product of a
                       training step of the guide's MLP (784-U-U-10) at
                       batch 128 and 8192, and of examples/conv_memory at
                       image sizes 32 and 64 (its products take a group of
                       images that fits 1 MiB of columns: the same at any
                       batch from 22 images up).
       bench=gemm impl=openblas
                       cblas_sgemm at the square sizes, once per
                       OPENBLAS_CORETYPE setting (see run_openblas).
       bench=gemm ratio=...
                       2 threads over 1 (threads_2_over_1, per dtype), and
                       beside it two 1-thread products at once over one
                       alone (independent_2_over_1: what the host gives two
                       cores that share no work, timed in turn with the
                       split) and the one over the other
                       (split_over_independent),
                       mixprec float32 / the best OpenBLAS, and bfloat16 and
                       float16 / float32, per shape and thread count.
       bench=gemm impl=torch
                       PyTorch's torch.mm on the same shapes, float32 and
                       bfloat16, 1 and 2 threads, under OpenMP's default wait
                       policy and OMP_WAIT_POLICY=PASSIVE, run right after
                       mixprec's runs of the shape when a python with torch is
                       at hand (bench/torch_cpu.py; bench.h says how it is
                       found); then ratio=mixprec_over_torch per dtype and
                       thread count against PyTorch's best (torch_best_of=).
                       Without torch: bench=torch available=0, no ratios.
       bench=reference source=issue
                       the reference figures the targets were set against
                       (the development machine class's peaks, OpenBLAS's
                       sgemm), not measured here: for comparison only.
   A time is the best of several timings after a warm-up, 1 thread's and 2
   threads' in turn; each timing repeats the call for >= 0.2 s so that the
   clock and the pool's wake-up vanish in it.
   Every product is spot-checked against a float64 dot product (check=ok).

   Build and run: `make bench` (`make bench-quick` for a reduced set), or
       gcc -std=c99 -O2 -march=native -pthread [-DBENCH_OPENBLAS] bench/gemm.c \
           -o bench_gemm [-lopenblas] -lm
       MIXPREC_TORCH_PYTHON=/path/to/venv/bin/python ./bench_gemm [--quick] [--no-torch] */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <assert.h>
#include <math.h>
#include <time.h>
#include <pthread.h>
#include <spawn.h>
#include <unistd.h>
#include <sys/wait.h>

#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#define BENCH_NAME "gemm"
#include "bench.h"

#if defined(__AVX512F__) && defined(__FMA__)
#include <immintrin.h>
#define HAVE_FMA_PROBE 1
#endif
#if defined(BENCH_OPENBLAS)
#include <cblas.h>
#endif

extern char **environ; /* passed on to the OpenBLAS child, edited */

#define N_THREADS 2 /* thread counts 1 and 2: the machine's two cores */

/* ---- settings ---------------------------------------------------------- */
static const size_t full_squares[] = {256, 512, 1024, 2048};
static const size_t quick_squares[] = {256, 1024};
static const int full_batches[] = {128, 8192}, full_units[] = {1024, 4096};
static const int quick_batches[] = {128}, quick_units[] = {1024};
static const int full_images[] = {32, 64}, quick_images[] = {32}; /* conv_memory's image sizes */
#define COUNT(a) (sizeof a / sizeof a[0])
#define MAX_SQUARES COUNT(full_squares)

typedef struct settings {
    const size_t *squares;
    size_t n_squares;
    const int *batches, *units, *images;
    size_t n_batches, n_units, n_images;
    double min_s; /* the length of one timing */
    int reps;     /* timings per measurement; the best counts */
    int quick;
} settings;

static settings S;

static void set_mode(int quick) {
    S.quick = quick;
    S.squares = quick ? quick_squares : full_squares;
    S.n_squares = quick ? COUNT(quick_squares) : COUNT(full_squares);
    S.batches = quick ? quick_batches : full_batches;
    S.n_batches = quick ? COUNT(quick_batches) : COUNT(full_batches);
    S.units = quick ? quick_units : full_units;
    S.n_units = quick ? COUNT(quick_units) : COUNT(full_units);
    S.images = quick ? quick_images : full_images;
    S.n_images = quick ? COUNT(quick_images) : COUNT(full_images);
    S.min_s = quick ? 0.05 : 0.2;
    S.reps = quick ? 2 : 3;
}

static void die(const char *what, const char *why) {
    fprintf(stderr, "gemm: %s: %s\n", what, why);
    exit(1);
}

/* ---- timing ------------------------------------------------------------ */
typedef void (*call_fn)(void *ctx);

/* Seconds per call of each of n calls (one product on 1 and on 2
   threads, and the pair of measure_shape), their timings alternating so
   that a ratio between them sees the same host: a guest of a shared host
   runs faster and slower for seconds at a time, so 1 thread timed and then
   2 gives a ratio that says more about the host than about the split
   (docs/performance.md, "Measuring it"). The warm-up
   (>= 0.1 s, at least one call, each context) faults the pages in, wakes
   the pool and the clocks, and sizes the timings. A call over a second
   gets 2 timings, not S.reps: the largest MLP shapes would otherwise take
   most of the run. */
typedef struct timed {
    call_fn f;
    void *ctx;
} timed;

static void time_calls(const timed *calls, int n, double best[]) {
    long iters[N_THREADS + 1], i;
    int reps = S.reps, r, c;
    assert(n > 0 && n <= N_THREADS + 1);
    for (c = 0; c < n; c++) {
        double t0 = now_s(), once;
        long count = 0;
        do {
            calls[c].f(calls[c].ctx);
            count++;
        } while (now_s() - t0 < 0.1);
        once = (now_s() - t0) / (double)count;
        iters[c] = once >= S.min_s ? 1 : (long)ceil(S.min_s / once);
        if (once > 1.0) reps = 2;
        best[c] = INFINITY;
    }
    for (r = 0; r < reps; r++)
        for (c = 0; c < n; c++) {
            double t0 = now_s(), t;
            for (i = 0; i < iters[c]; i++) calls[c].f(calls[c].ctx);
            t = (now_s() - t0) / (double)iters[c];
            if (t < best[c]) best[c] = t;
        }
}

/* ---- the peak probe ---------------------------------------------------- */
/* 24 independent accumulators: more than latency (4) x issue width (2) needs,
   so the loop runs at the FMA ports' throughput. Each is spelled out, as a
   compiler keeps an array of vectors in memory. */
#define ACC24(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) \
    X(12) X(13) X(14) X(15) X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23)
#define PROBE_DECL(i) __m512 c##i = _mm512_set1_ps((float)(i));
#define PROBE_SUM(i) s = _mm512_add_ps(s, c##i);

typedef struct probe {
    const char *kind;
    float (*run)(long iters);
    double flops_per_iter;
} probe;

#if defined(HAVE_FMA_PROBE)
/* c = c * 0.999 + 0.001 stays near 1: no overflow, no subnormals. */
static float probe_fma(long iters) {
    const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(0.001f);
    __m512 s = _mm512_setzero_ps();
    long it;
#define PROBE_FMA(i) c##i = _mm512_fmadd_ps(c##i, x, y);
    ACC24(PROBE_DECL)
    for (it = 0; it < iters; it++) { ACC24(PROBE_FMA) }
    ACC24(PROBE_SUM)
    return _mm512_reduce_add_ps(s);
}
#endif

#if defined(HAVE_FMA_PROBE) && defined(__AVX512BF16__)
/* Each vdpbf16ps adds 2 products of 2^-10 per lane: far from overflow. */
static float probe_dpbf16(long iters) {
    const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0x1p-10f), _mm512_set1_ps(0x1p-10f));
    __m512 s = _mm512_setzero_ps();
    long it;
#define PROBE_DOT(i) c##i = _mm512_dpbf16_ps(c##i, x, x);
    ACC24(PROBE_DECL)
    for (it = 0; it < iters; it++) { ACC24(PROBE_DOT) }
    ACC24(PROBE_SUM)
    return _mm512_reduce_add_ps(s);
}
#endif

#if defined(MP__AMX)
/* Four tiles of sums, tdpbf16ps from two A and two B tiles of 2^-10 (each
   instruction adds 32 products of 2^-20 per element: far from overflow).
   The tiles are the library's (mp__amx_begin), in this thread; measure_peaks
   runs it only where Linux granted them. */
static float probe_amx(long iters) {
    static uint16_t ones[16 * 32];
    float out[16 * 16];
    long it;
    int i;
    for (i = 0; i < 16 * 32; i++) ones[i] = 0x3A80; /* 2^-10 in bfloat16 */
    mp__amx_begin();
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, ones, 64);
    _tile_loadd(5, ones, 64);
    _tile_loadd(6, ones, 64);
    _tile_loadd(7, ones, 64);
    for (it = 0; it < iters; it++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out, 64);
    _tile_release();
    return out[0];
}
#endif

enum { PEAK_F32, PEAK_BF16, PEAK_AMX, N_PEAKS };
static const probe probes[N_PEAKS] = {
#if defined(HAVE_FMA_PROBE)
    {"f32_fma", probe_fma, 24.0 * 16 * 2}, /* 16 lanes, multiply + add */
#else
    {"f32_fma", NULL, 0},
#endif
#if defined(HAVE_FMA_PROBE) && defined(__AVX512BF16__)
    {"bf16_dot", probe_dpbf16, 24.0 * 32 * 2}, /* 32 bfloat16 products per zmm */
#else
    {"bf16_dot", NULL, 0},
#endif
#if defined(MP__AMX)
    {"bf16_amx", probe_amx, 4.0 * 16 * 16 * 32 * 2}, /* four 16 x 16 tiles, 32 products each */
#else
    {"bf16_amx", NULL, 0},
#endif
};

static double peak_gflops[N_PEAKS][N_THREADS + 1]; /* [kind][threads]; 0 = unknown */
static volatile float sink; /* keeps the probes' results observable */

typedef struct probe_job {
    const probe *p;
    long iters;
    float result;
} probe_job;

static void *probe_thread(void *arg) {
    probe_job *j = (probe_job *)arg;
    j->result = j->p->run(j->iters);
    return NULL;
}

/* Wall seconds for `threads` threads each running iters of the probe. */
static double run_probe(const probe *p, long iters, int threads) {
    pthread_t tid[N_THREADS];
    probe_job jobs[N_THREADS];
    double t0 = now_s();
    int i;
    for (i = 0; i < threads; i++) {
        jobs[i].p = p;
        jobs[i].iters = iters;
        if (i > 0 && pthread_create(&tid[i], NULL, probe_thread, &jobs[i]) != 0) die("peak", "pthread_create");
    }
    probe_thread(&jobs[0]);
    for (i = 1; i < threads; i++) pthread_join(tid[i], NULL);
    for (i = 0; i < threads; i++) sink += jobs[i].result;
    return now_s() - t0;
}

static void measure_peaks(void) {
    int k, t, r;
    for (k = 0; k < N_PEAKS; k++) {
        const probe *p = &probes[k];
        long iters;
        if (!p->run || (k == PEAK_AMX && !mp__amx_usable())) {
            printf("bench=peak kind=%s available=0\n", p->kind);
            continue;
        }
        iters = (long)(100000 * (0.25 / run_probe(p, 100000, 1))); /* ~0.25 s per timing */
        for (t = 1; t <= N_THREADS; t++) {
            double best = INFINITY;
            for (r = 0; r < 5; r++) {
                double s = run_probe(p, iters, t);
                if (s < best) best = s;
            }
            peak_gflops[k][t] = (double)t * (double)iters * p->flops_per_iter / best * 1e-9;
            printf("bench=peak kind=%s threads=%d gflops=%.1f\n", p->kind, t, peak_gflops[k][t]);
        }
    }
    fflush(stdout);
}

/* bfloat16 products run on AMX's tiles where the build targets them and
   Linux grants them, else on vdpbf16ps where the compiler enables it;
   float16 is widened to float32 and runs on the FMAs. */
static double peak_for(mp_dtype dt, int threads) {
    int k = dt != MP_BFLOAT16                        ? PEAK_F32
            : peak_gflops[PEAK_AMX][threads] > 0  ? PEAK_AMX
            : peak_gflops[PEAK_BF16][threads] > 0 ? PEAK_BF16
                                                  : PEAK_F32;
    return peak_gflops[k][threads];
}

static void print_gflops(double gflops, double peak) {
    printf(" gflops=%.1f", gflops);
    if (peak > 0) printf(" peak_fraction=%.3f", gflops / peak);
}

/* ---- matrices ---------------------------------------------------------- */
static unsigned long long rng_state = 0x9E3779B97F4A7C15ull;

static float uniform_pm1(void) { /* xorshift64, [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)(rng_state >> 40) * 0x1p-23f - 1.0f;
}

static size_t random_index(size_t n) { /* [0, n) */
    return (size_t)((double)(uniform_pm1() + 1.0f) * 0.5 * (double)n) % n;
}

/* Operands on 64-byte lines, as a model's tensors are (mixprec.h's
   allocator): a product split between threads keeps its float32 sums in C
   only where each thread's part of C is whole lines (mp__sums_in_c). */
static void *xmalloc_lines(size_t bytes) {
    void *p = NULL;
    return xzeroed(posix_memalign(&p, 64, bytes ? bytes : 1) == 0 ? p : NULL, bytes);
}

static float *random_f32(size_t count) {
    float *x = (float *)xmalloc_lines(count * sizeof(float));
    size_t i;
    for (i = 0; i < count; i++) x[i] = uniform_pm1();
    return x;
}

/* count elements of src in dtype dt (src itself for float32). */
static void *as_dtype(const float *src, size_t count, mp_dtype dt) {
    void *dst;
    if (dt == MP_FLOAT32) return (void *)src;
    dst = xmalloc_lines(count * mp_dtype_size(dt));
    if (mp_convert(dst, dt, src, MP_FLOAT32, count, NULL) != MP_OK) die("mp_convert", "failed");
    return dst;
}

static const char *dtype_name(mp_dtype dt) {
    const char *s = mp_dtype_name(dt);
    return s ? s : "unknown";
}

static float elem(const void *p, mp_dtype dt, size_t i) {
    if (dt == MP_FLOAT16) return mp_f16_to_f32(((const mp_f16 *)p)[i]);
    if (dt == MP_BFLOAT16) return mp_bf16_to_f32(((const mp_bf16 *)p)[i]);
    return ((const float *)p)[i];
}

/* ---- one product ------------------------------------------------------- */
typedef struct gemm_job {
    mp_pool *pool;
    int trans_a, trans_b;
    size_t m, n, k;
    mp_dtype dt;
    const void *a, *b;
    void *c;
} gemm_job;

static double gemm_flops(const gemm_job *j) { return 2.0 * (double)j->m * (double)j->n * (double)j->k; }

static void call_mixprec(void *ctx) {
    const gemm_job *j = (const gemm_job *)ctx;
    mp_status s = mp_matmul(j->pool, j->trans_a, j->trans_b, j->m, j->n, j->k, j->a, j->dt, j->b, j->dt,
                            j->c, j->dt);
    if (s != MP_OK) die("mp_matmul", mp_status_message(s));
}

/* op(A)(i, p) and op(B)(p, q) as stored. */
static float op_a(const gemm_job *j, size_t i, size_t p) {
    return elem(j->a, j->dt, j->trans_a ? p * j->m + i : i * j->k + p);
}
static float op_b(const gemm_job *j, size_t p, size_t q) {
    return elem(j->b, j->dt, j->trans_b ? q * j->k + p : p * j->n + q);
}

/* A few entries of C against a float64 dot product. Allowed: float32
   accumulation's worst case (k ulps of the sum of |products|) plus the
   final rounding into C's dtype. It catches a wrong tile or a lost K block,
   not a last-bit difference. */
static int spot_check(const gemm_job *j) {
    static const double unit[MP_DTYPE_COUNT] = {0x1p-24, 0x1p-11, 0x1p-8}; /* by mp_dtype */
    int s;
    for (s = 0; s < 8; s++) {
        size_t i = s == 0 ? 0 : s == 1 ? j->m - 1 : random_index(j->m);
        size_t q = s == 0 ? 0 : s == 1 ? j->n - 1 : random_index(j->n), p;
        double ref = 0, mag = 0, got = elem(j->c, j->dt, i * j->n + q);
        for (p = 0; p < j->k; p++) {
            double prod = (double)op_a(j, i, p) * (double)op_b(j, p, q);
            ref += prod;
            mag += fabs(prod);
        }
        if (fabs(got - ref) > (double)j->k * 0x1p-24 * mag + unit[j->dt] * fabs(ref) + 1e-30) {
            fprintf(stderr, "gemm: check failed: %s m=%zu n=%zu k=%zu ta=%d tb=%d C[%zu][%zu]=%g, want %g\n",
                    dtype_name(j->dt), j->m, j->n, j->k, j->trans_a, j->trans_b, i, q, got, ref);
            return 0;
        }
    }
    return 1;
}

/* ---- OpenBLAS ---------------------------------------------------------- */
/* The best OpenBLAS GFLOP/s per square size and thread count, over the
   coretype settings, and which setting gave it. */
static double blas_best[MAX_SQUARES][N_THREADS + 1];
static const char *blas_best_setting[MAX_SQUARES][N_THREADS + 1];

#if defined(BENCH_OPENBLAS)
static void call_openblas(void *ctx) {
    const gemm_job *j = (const gemm_job *)ctx;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)j->m, (blasint)j->n, (blasint)j->k, 1.0f,
                (const float *)j->a, (blasint)j->k, (const float *)j->b, (blasint)j->n, 0.0f, (float *)j->c,
                (blasint)j->n);
}

/* The child's side: a private protocol of "corename NAME" and
   "result SIZE THREADS GFLOPS" lines, which the parent turns into rows. */
static int openblas_child(void) {
    size_t s;
    int t;
    printf("corename %s\n", openblas_get_corename());
    for (s = 0; s < S.n_squares; s++) {
        size_t n = S.squares[s];
        gemm_job j;
        memset(&j, 0, sizeof j);
        j.m = j.n = j.k = n;
        j.a = random_f32(n * n);
        j.b = random_f32(n * n);
        j.c = xmalloc_lines(n * n * sizeof(float));
        for (t = 1; t <= N_THREADS; t++) {
            timed call;
            double seconds;
            call.f = call_openblas, call.ctx = &j;
            openblas_set_num_threads(t);
            time_calls(&call, 1, &seconds);
            printf("result %zu %d %.3f\n", s, t, gemm_flops(&j) / seconds * 1e-9);
            fflush(stdout);
        }
        if (!spot_check(&j)) return 1;
        free((void *)j.a);
        free((void *)j.b);
        free(j.c);
    }
    return 0;
}

/* environ without OPENBLAS_CORETYPE, plus OPENBLAS_CORETYPE=value unless
   value is NULL. The caller frees the array (not the strings). */
static char **child_env(const char *value, char *slot, size_t slot_size) {
    size_t n = 0, out = 0, i;
    char **env;
    while (environ[n]) n++;
    env = (char **)xmalloc((n + 2) * sizeof *env);
    for (i = 0; i < n; i++)
        if (strncmp(environ[i], "OPENBLAS_CORETYPE=", 18) != 0) env[out++] = environ[i];
    if (value) {
        snprintf(slot, slot_size, "OPENBLAS_CORETYPE=%s", value);
        env[out++] = slot;
    }
    env[out] = NULL;
    return env;
}

/* Turns one line of the child's protocol into a row; the rows give
   peak_fraction against the parent's float32 peak. */
static void child_line(const char *line, const char *setting, const char *coretype, char *corename) {
    size_t s;
    int t;
    double g;
    if (sscanf(line, "corename %63s", corename) == 1) return;
    if (sscanf(line, "result %zu %d %lf", &s, &t, &g) != 3 || s >= S.n_squares || t < 1 || t > N_THREADS) {
        fprintf(stderr, "gemm: unexpected line from the OpenBLAS child: %s", line);
        return;
    }
    printf("bench=gemm impl=openblas setting=%s coretype=%s corename=%s shape=square dtype=float32 "
           "m=%zu n=%zu k=%zu threads=%d",
           setting, coretype, corename, S.squares[s], S.squares[s], S.squares[s], t);
    print_gflops(g, peak_gflops[PEAK_F32][t]);
    printf("\n");
    fflush(stdout);
    if (g > blas_best[s][t]) {
        blas_best[s][t] = g;
        blas_best_setting[s][t] = setting;
    }
}

/* OpenBLAS reads OPENBLAS_CORETYPE once, when the library loads: each
   setting needs a fresh process. This binary runs itself with
   --openblas-child, its stdout on a pipe. */
static void run_openblas(const char *self, const char *setting, const char *value) {
    char slot[128], line[256], corename[64] = "?";
    char *argv[4];
    char **env = child_env(value, slot, sizeof slot);
    posix_spawn_file_actions_t fa;
    int fds[2], status, argc = 0;
    pid_t pid;
    FILE *in;
    argv[argc++] = (char *)self;
    argv[argc++] = (char *)"--openblas-child";
    if (S.quick) argv[argc++] = (char *)"--quick";
    argv[argc] = NULL;
    if (pipe(fds) != 0) die("openblas", "pipe");
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    posix_spawn_file_actions_addclose(&fa, fds[1]);
    if (posix_spawnp(&pid, self, &fa, NULL, argv, env) != 0) die("openblas", "cannot run the child");
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (!(in = fdopen(fds[0], "r"))) die("openblas", "fdopen");
    while (fgets(line, sizeof line, in)) child_line(line, setting, value ? value : "unset", corename);
    fclose(in);
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        printf("bench=gemm impl=openblas setting=%s error=child_failed\n", setting);
    free(env);
}

/* The environment's setting and unset; if the environment leaves it unset,
   Haswell instead, the setting of the reference figures (print_references). */
static void openblas_all(const char *self) {
    const char *env = getenv("OPENBLAS_CORETYPE");
    printf("bench=gemm impl=openblas available=1 coretype_env=%s\n", env ? env : "unset");
    fflush(stdout);
    run_openblas(self, "env", env);
    if (env) run_openblas(self, "unset", NULL);
    if (!env || strcasecmp(env, "Haswell") != 0) run_openblas(self, "haswell", "Haswell");
}
#else
static int openblas_child(void) { return 1; }
static void openblas_all(const char *self) {
    (void)self;
    printf("bench=gemm impl=openblas available=0\n");
}
#endif

/* ---- mixprec ----------------------------------------------------------- */
static const mp_dtype dtypes[] = {MP_FLOAT32, MP_FLOAT16, MP_BFLOAT16};
#define N_DTYPES COUNT(dtypes)

/* A shape and where it comes from: "square", a product of the MLP or of
   the conv example. */
typedef struct shape {
    const char *name;
    int trans_a, trans_b;
    size_t m, n, k;
    int batch, units;   /* the MLP's (units: the conv's filters), 0 for squares */
    int image, images;  /* the conv's image size and images per product, 0 for the rest */
} shape;

static void print_shape(const shape *s) {
    printf(" shape=%s", s->name);
    if (s->image) printf(" batch=%d image=%d filters=%d images_per_product=%d", s->batch, s->image, s->units, s->images);
    else if (s->batch) printf(" batch=%d units=%d", s->batch, s->units);
    printf(" m=%zu n=%zu k=%zu trans_a=%d trans_b=%d", s->m, s->n, s->k, s->trans_a, s->trans_b);
}

/* Two products at once, each on a 1-thread pool of its own into a C of
   its own (A and B shared), run by the two threads of a 2-thread pool:
   what the machine gives two cores that do not share the work, timed in
   turn with the product on 1 and on 2 threads. Beside threads_2_over_1,
   independent_2_over_1 says how far from 2x the host itself was, and
   split_over_independent how much of that the split kept. */
typedef struct pair_job {
    mp_pool *runner;
    gemm_job one[N_THREADS];
} pair_job;

static void pair_task(void *ctx, int thread, int threads) {
    (void)threads;
    call_mixprec(&((pair_job *)ctx)->one[thread]);
}

static void call_pair(void *ctx) {
    pair_job *p = (pair_job *)ctx;
    mp__pool_run(p->runner, pair_task, p, N_THREADS);
}

/* One shape's GFLOP/s per dtype and thread count, and two independent
   1-thread products' together (pair_job). */
typedef struct shape_gflops {
    double threads[N_DTYPES][N_THREADS + 1];
    double pair[N_DTYPES];
} shape_gflops;

static void new_job(gemm_job *j, const shape *s, mp_dtype dt, const void *a, const void *b, int threads) {
    mp_status st = mp_pool_create(&j->pool, threads); /* an idle pool's workers sleep after MP__SPINS polls */
    if (st != MP_OK) die("mp_pool_create", mp_status_message(st));
    j->trans_a = s->trans_a, j->trans_b = s->trans_b;
    j->m = s->m, j->n = s->n, j->k = s->k;
    j->dt = dt, j->a = a, j->b = b;
    j->c = xmalloc_lines(s->m * s->n * mp_dtype_size(dt));
}

static void free_job(gemm_job *j) {
    mp_pool_destroy(j->pool);
    free(j->c);
}

/* One shape in every dtype, rows printed as it goes: the product on 1 and
   on 2 threads and the pair timed in turn (time_calls), each product into
   a C of its own that the check reads. */
static void measure_shape(const shape *s, shape_gflops *out) {
    float *a32 = random_f32(s->m * s->k), *b32 = random_f32(s->k * s->n);
    size_t d;
    int t;
    for (d = 0; d < N_DTYPES; d++) {
        const void *a = as_dtype(a32, s->m * s->k, dtypes[d]), *b = as_dtype(b32, s->k * s->n, dtypes[d]);
        gemm_job j[N_THREADS];
        pair_job pair;
        timed calls[N_THREADS + 1];
        double seconds[N_THREADS + 1];
        mp_status st = mp_pool_create(&pair.runner, N_THREADS);
        if (st != MP_OK) die("mp_pool_create", mp_status_message(st));
        for (t = 0; t < N_THREADS; t++) {
            new_job(&j[t], s, dtypes[d], a, b, t + 1);
            new_job(&pair.one[t], s, dtypes[d], a, b, 1);
            calls[t].f = call_mixprec, calls[t].ctx = &j[t];
        }
        calls[N_THREADS].f = call_pair, calls[N_THREADS].ctx = &pair;
        time_calls(calls, N_THREADS + 1, seconds);
        for (t = 0; t < N_THREADS; t++) {
            out->threads[d][t + 1] = gemm_flops(&j[t]) / seconds[t] * 1e-9;
            printf("bench=gemm impl=mixprec dtype=%s", dtype_name(dtypes[d]));
            print_shape(s);
            printf(" threads=%d", t + 1);
            print_gflops(out->threads[d][t + 1], peak_for(dtypes[d], t + 1));
            printf(" check=%s\n", spot_check(&j[t]) && spot_check(&pair.one[t]) ? "ok" : "FAIL");
            fflush(stdout);
            free_job(&j[t]);
            free_job(&pair.one[t]);
        }
        out->pair[d] = N_THREADS * gemm_flops(&j[0]) / seconds[N_THREADS] * 1e-9;
        mp_pool_destroy(pair.runner);
        if (a != a32) free((void *)a);
        if (b != b32) free((void *)b);
    }
    free(a32);
    free(b32);
}

/* ---- the PyTorch peer --------------------------------------------------- */
/* PyTorch's best GFLOP/s per dtype (float32, bfloat16) and thread count,
   and the wait policy that gave it. */
typedef struct peer_best {
    double gflops[2][N_THREADS + 1];
    const char *wait[2][N_THREADS + 1];
    const char *running;
    int threads;
} peer_best;

static void peer_gemm_line(const char *line, void *ctx) {
    peer_best *b = (peer_best *)ctx;
    double g = peer_value(line, "gflops");
    int d = strstr(line, " dtype=bfloat16 ") ? 1 : strstr(line, " dtype=float32 ") ? 0 : -1;
    if (!strstr(line, "bench=gemm impl=torch") || d < 0 || g <= 0) return;
    if (g > b->gflops[d][b->threads]) b->gflops[d][b->threads] = g, b->wait[d][b->threads] = b->running;
}

static void peer_gemm(peer_best *b, const shape *s) {
    static const char *const waits[2] = {NULL, "PASSIVE"};
    char args[200];
    int w;
    for (b->threads = 1; b->threads <= N_THREADS; b->threads++)
        for (w = 0; w < 2; w++) {
            snprintf(args, sizeof args, "gemm --m %zu --n %zu --k %zu --trans-a %d --trans-b %d --threads %d "
                     "--min-seconds %.2f", s->m, s->n, s->k, s->trans_a, s->trans_b, b->threads, 3 * S.min_s);
            b->running = waits[w] ? "passive" : "default";
            peer_run(args, waits[w], peer_gemm_line, b);
        }
}

static void print_ratio(const shape *s, int threads, const char *ratio, double value, const char *extra) {
    printf("bench=gemm ratio=%s", ratio);
    print_shape(s);
    printf(" threads=%d value=%.3f%s\n", threads, value, extra);
}

/* bfloat16 and float16 over float32 (the gain from narrow storage and
   vdpbf16ps), and for squares mixprec over the best OpenBLAS. */
static void print_ratios(const shape *s, size_t square, const shape_gflops *sg, int with_peer) {
    const double(*g)[N_THREADS + 1] = sg->threads;
    peer_best peer;
    int t;
    size_t d;
    char extra[64];
    memset(&peer, 0, sizeof peer);
    if (peer_enabled && with_peer) peer_gemm(&peer, s);
    for (d = 0; d < N_DTYPES; d++) {
        snprintf(extra, sizeof extra, " dtype=%s", dtype_name(dtypes[d]));
        print_ratio(s, N_THREADS, "threads_2_over_1", g[d][2] / g[d][1], extra);
        print_ratio(s, N_THREADS, "independent_2_over_1", sg->pair[d] / g[d][1], extra);
        print_ratio(s, N_THREADS, "split_over_independent", g[d][2] / sg->pair[d], extra);
    }
    for (t = 1; t <= N_THREADS; t++)
        for (d = 0; d < 2; d++) {
            if (peer.gflops[d][t] <= 0) continue;
            snprintf(extra, sizeof extra, " dtype=%s torch_best_of=%s", d ? "bfloat16" : "float32", peer.wait[d][t]);
            print_ratio(s, t, "mixprec_over_torch", g[d ? 2 : 0][t] / peer.gflops[d][t], extra);
        }
    for (t = 1; t <= N_THREADS; t++) {
        if (!s->batch && blas_best[square][t] > 0) {
            snprintf(extra, sizeof extra, " openblas_setting=%s", blas_best_setting[square][t]);
            print_ratio(s, t, "mixprec_f32_over_openblas_best", g[0][t] / blas_best[square][t], extra);
        }
        print_ratio(s, t, "bf16_over_f32", g[2][t] / g[0][t], "");
        print_ratio(s, t, "f16_over_f32", g[1][t] / g[0][t], "");
    }
    fflush(stdout);
}

static void squares(void) {
    size_t i;
    for (i = 0; i < S.n_squares; i++) {
        shape s = {"square", 0, 0, 0, 0, 0, 0, 0, 0, 0};
        shape_gflops g;
        s.m = s.n = s.k = S.squares[i];
        measure_shape(&s, &g);
        print_ratios(&s, i, &g, 1);
    }
}

/* Each shape measured and its ratios printed; the first with_peer also
   against PyTorch. */
static void measure_list(const shape *shapes, size_t n, size_t with_peer) {
    size_t i;
    for (i = 0; i < n; i++) {
        shape_gflops g;
        measure_shape(&shapes[i], &g);
        print_ratios(&shapes[i], 0, &g, i < with_peer);
    }
}

/* Every product of a training step of the guide's MLP (784-U-U-10), layer
   by layer: forward y = x W; backward dW = x^T dz (x transposed) and
   dx = dz W^T (W transposed), but for the first layer, whose input needs
   no gradient. The first four, the largest, are also PyTorch's. */
static void mlp_shapes(int batch, int units) {
    size_t b = (size_t)batch, u = (size_t)units;
    const shape shapes[] = {
        {"mlp_fwd_in", 0, 0, b, u, 784, batch, units, 0, 0},   {"mlp_fwd_hidden", 0, 0, b, u, u, batch, units, 0, 0},
        {"mlp_dw_hidden", 1, 0, u, u, b, batch, units, 0, 0},  {"mlp_dx_hidden", 0, 1, b, u, u, batch, units, 0, 0},
        {"mlp_dw_in", 1, 0, 784, u, b, batch, units, 0, 0},    {"mlp_fwd_out", 0, 0, b, 10, u, batch, units, 0, 0},
        {"mlp_dw_out", 1, 0, u, 10, b, batch, units, 0, 0},    {"mlp_dx_out", 0, 1, b, u, 10, batch, units, 0, 0},
    };
    measure_list(shapes, COUNT(shapes), 4);
}

/* Images per product in a host Conv2D: as many as keep their columns
   (pixels x patch floats) within mixprec.h's MP__CONV_CACHE (its
   mp__conv_group), and no more than the batch. */
static int conv_group(size_t pixels, size_t patch, int batch) {
    size_t per = pixels * patch * sizeof(float), g = MP__CONV_CACHE / per;
    return g < 1 ? 1 : g > (size_t)batch ? batch : (int)g;
}

/* Every product of a training step of examples/conv_memory (image x image
   x 3 -> Conv2D(F, 2x2) -> Conv2D(F, 1x1) x 2 -> ...): each layer's
   products over a group of images (conv_group), the same kernel as the
   MLP's on (images x pixels, filters, patch) shapes (dW's sums are
   float32 in the step; here every operand has the product's dtype):
   forward y = col W,
   dW = col^T dy, dx = dy W^T but for the first layer. */
static void conv_shapes(int batch, int image) {
    const int filters = 128;
    size_t f = filters, pixels = (size_t)(image - 1) * (size_t)(image - 1); /* 2x2 valid, then 1x1 */
    int g1 = conv_group(pixels, 12, batch), g2 = conv_group(pixels, f, batch);
    size_t r1 = (size_t)g1 * pixels, r2 = (size_t)g2 * pixels;
    const shape shapes[] = {
        {"conv_fwd_2x2", 0, 0, r1, f, 12, batch, filters, image, g1},
        {"conv_dw_2x2", 1, 0, 12, f, r1, batch, filters, image, g1},
        {"conv_fwd_1x1", 0, 0, r2, f, f, batch, filters, image, g2},
        {"conv_dw_1x1", 1, 0, f, f, r2, batch, filters, image, g2},
        {"conv_dx_1x1", 0, 1, r2, f, f, batch, filters, image, g2},
    };
    measure_list(shapes, COUNT(shapes), 0);
}

static void print_references(void) {
    static const char *const lines[] = {
        "what=peak_f32_fma threads=1 gflops=225", "what=peak_f32_fma threads=2 gflops=450",
        "what=peak_bf16_dot threads=1 gflops=455", "what=peak_bf16_dot threads=2 gflops=894",
        "what=openblas_0.3.21_sgemm coretype=Haswell m=2048 threads=1 gflops=108",
        "what=openblas_0.3.21_sgemm coretype=Haswell m=2048 threads=2 gflops=210",
        "what=openblas_0.3.21_sgemm coretype=unset m=2048 threads=1 gflops=208",
        "what=openblas_0.3.21_sgemm coretype=unset m=2048 threads=2 gflops=401",
    };
    size_t i;
    for (i = 0; i < COUNT(lines); i++) printf("bench=reference source=issue measured_here=0 %s\n", lines[i]);
}

int main(int argc, char **argv) {
    int i, child = 0;
    set_mode(0);
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) set_mode(1);
        else if (strcmp(argv[i], "--openblas-child") == 0) child = 1;
        else if (strcmp(argv[i], "--no-torch") == 0) peer_enabled = 0;
        else {
            fprintf(stderr, "usage: %s [--quick] [--no-torch]\n", argv[0]);
            return 2;
        }
    }
    if (child) return openblas_child();
    printf("bench=gemm cores=%d quick=%d min_timing_s=%.2f reps=%d\n", mp_available_cores(), S.quick, S.min_s,
           S.reps);
    print_machine("gemm");
    print_references();
    peer_probe();
    measure_peaks();
    openblas_all(argv[0]); /* before any pool exists: its children get the cores to themselves */
    squares();
    {
        size_t bi, ui;
        for (bi = 0; bi < S.n_batches; bi++)
            for (ui = 0; ui < S.n_units; ui++) mlp_shapes(S.batches[bi], S.units[ui]);
        for (ui = 0; ui < S.n_images; ui++) conv_shapes(S.batches[0], S.images[ui]);
    }
    return 0;
}
