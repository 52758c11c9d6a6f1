/* bench.h - what every benchmark shares: a monotonic clock, allocation that
   ends the run when memory is short (zeroed, so the pages are faulted in
   before anything is timed), and check(), which ends it when a mixprec call
   fails. Define BENCH_NAME (the program's name in messages) first, and
   BENCH_NO_MODEL_ERROR for what to print when a failing call has no model. */
#ifndef MIXPREC_BENCH_H
#define MIXPREC_BENCH_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifndef BENCH_NO_MODEL_ERROR
#define BENCH_NO_MODEL_ERROR ""
#endif

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* p, its bytes zeroed; NULL (a failed allocation) stops the program. */
static inline void *xzeroed(void *p, size_t bytes) {
    if (!p) {
        fprintf(stderr, "%s: cannot allocate %zu bytes\n", BENCH_NAME, bytes);
        exit(1);
    }
    memset(p, 0, bytes);
    return p;
}

static inline void *xmalloc(size_t bytes) { return xzeroed(malloc(bytes ? bytes : 1), bytes); }

static inline void check(mp_status s, const mp_model *m, const char *what) {
    if (s == MP_OK) return;
    fprintf(stderr, "%s: %s: %s: %s\n", BENCH_NAME, what, mp_status_message(s), m ? mp_model_error(m) : BENCH_NO_MODEL_ERROR);
    exit(1);
}

/* The guide's train_step, one call per line: batch rows of `inputs`
   values (x) and their int32 labels. */
static inline void bench_step(mp_model *m, const float *x, size_t inputs, const int32_t *labels, int batch) {
    float loss;
    int applied;
    mp_data b;
    memset(&b, 0, sizeof b);
    b.x[0] = mp_rows(x, (size_t)batch, inputs);
    b.y = mp_labels(labels, (size_t)batch);
    check(mp_forward(m, &b, 1), m, "mp_forward");
    check(mp_compute_loss(m, &b.y, &loss, NULL), m, "mp_compute_loss");
    (void)mp_get_scaled_loss(m, loss); /* the scaled loss itself is not needed */
    check(mp_compute_scaled_gradients(m), m, "mp_compute_scaled_gradients");
    check(mp_get_unscaled_gradients(m), m, "mp_get_unscaled_gradients");
    check(mp_apply_gradients(m, &applied), m, "mp_apply_gradients");
}

/* The next value of a xorshift64 stream (Marsaglia's 13, 7, 17): the
   benchmarks' synthetic data, the same every run. */
static inline unsigned long long xorshift64(unsigned long long *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

/* Synthetic data: batch rows of `inputs` pixels in [0, 1) and labels
   below `classes` (only the speed matters). */
static inline void bench_synthetic(float *x, size_t inputs, int32_t *labels, int classes, int batch) {
    unsigned long long s = 0x9E3779B97F4A7C15ull;
    size_t i;
    for (i = 0; i < (size_t)batch * inputs; i++) x[i] = (float)(xorshift64(&s) >> 40) * 0x1p-24f;
    for (i = 0; i < (size_t)batch; i++) labels[i] = (int32_t)(xorshift64(&s) % (unsigned long long)classes);
}

/* The machine, on one line: the CPU model and its AVX-512 and bfloat16
   flags (from /proc/cpuinfo, where there is one) and the 1-minute load
   average (timings taken beside other work mean little). */
static inline void print_machine(const char *bench) {
    char line[4096], model[128] = "unknown", load[32] = "unknown";
    int avx512f = 0, bf16 = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        if (strncmp(line, "model name", 10) == 0 && strcmp(model, "unknown") == 0) {
            snprintf(model, sizeof model, "%s", colon + 2);
            model[strcspn(model, "\n")] = 0;
        } else if (strncmp(line, "flags", 5) == 0) {
            avx512f |= strstr(colon, " avx512f ") != NULL;
            bf16 |= strstr(colon, " avx512_bf16 ") != NULL;
        }
    }
    if (f) fclose(f);
    if ((f = fopen("/proc/loadavg", "r"))) {
        if (fscanf(f, "%31s", load) != 1) snprintf(load, sizeof load, "unknown");
        fclose(f);
    }
    printf("bench=%s cpu=\"%s\" avx512f=%d avx512_bf16=%d loadavg_1m=%s\n", bench, model, avx512f, bf16, load);
    fflush(stdout);
}

/* ---- the PyTorch peer (bench/torch_cpu.py) ------------------------------
   Run through $MIXPREC_TORCH_PYTHON (a virtual environment's python with
   torch), else python3; the script is $MIXPREC_TORCH_SCRIPT, else
   bench/torch_cpu.py (make runs the benchmarks from the repository root).
   One job per process, OMP_WAIT_POLICY set for it or removed. */
typedef void (*peer_line_fn)(const char *line, void *ctx);
static int peer_enabled = 1; /* --no-torch clears it; peer_probe too, when torch is missing */

static inline const char *peer_env(const char *name, const char *fallback) {
    const char *v = getenv(name);
    return v && *v ? v : fallback;
}

/* Runs `torch_cpu.py args`, echoing each line and handing it to on_line.
   wait: "PASSIVE", or NULL for OpenMP's default. */
static inline void peer_run(const char *args, const char *wait, peer_line_fn on_line, void *ctx) {
    char cmd[1024], line[512];
    FILE *f;
    snprintf(cmd, sizeof cmd, "env -u OMP_WAIT_POLICY %s%s '%s' '%s' %s 2>&1", wait ? "OMP_WAIT_POLICY=" : "",
             wait ? wait : "", peer_env("MIXPREC_TORCH_PYTHON", "python3"),
             peer_env("MIXPREC_TORCH_SCRIPT", "bench/torch_cpu.py"), args);
    fflush(stdout);
    if (!(f = popen(cmd, "r"))) {
        printf("bench=torch available=0 reason=popen_failed\n");
        return;
    }
    while (fgets(line, sizeof line, f)) {
        if (!strchr(line, '\n')) strcat(line, "\n"); /* lines are short; a long one is cut */
        fputs(line, stdout);
        if (on_line) on_line(line, ctx);
    }
    fflush(stdout);
    (void)pclose(f);
}

static inline void peer_probe_line(const char *line, void *ctx) { *(int *)ctx |= strstr(line, "available=1") != NULL; }

/* Says whether torch imports (the script's line, or why not). */
static inline void peer_probe(void) {
    int found = 0;
    if (!peer_enabled) {
        printf("bench=torch available=0 reason=--no-torch\n");
        return;
    }
    peer_run("probe", NULL, peer_probe_line, &found);
    if (!found) {
        printf("bench=torch available=0 note=\"set MIXPREC_TORCH_PYTHON to a python with torch (docs/performance.md: the PyTorch peer)\"\n");
        peer_enabled = 0;
    }
}

/* Seconds a training step takes: the best of 3 timings of at least
   min_s / 3 each, after 2 warm-up steps (the first allocates the
   activations), as torch_cpu.py's timed(). */
static inline double best_step_seconds(void (*step)(void *ctx), void *ctx, double min_s) {
    double best = 1e30;
    int rep;
    step(ctx);
    step(ctx);
    for (rep = 0; rep < 3; rep++) {
        double t0 = now_s(), s;
        long steps = 0;
        do {
            step(ctx);
            steps++;
        } while (steps < 2 || now_s() - t0 < min_s / 3);
        s = (now_s() - t0) / (double)steps;
        if (s < best) best = s;
    }
    return best;
}

/* The activation block's bytes of policies[p]'s model after a step, and
   (p 1) mixed_bfloat16's over float32's (policies {"float32",
   "mixed_bfloat16"}):
       bench=B impl=mixprec policy=P activation_bytes=
       bench=B ratio=activations_bf16_over_f32 value= */
static inline void activation_lines(const char *bench, const char *const policies[2], const mp_model *m, int p) {
    static size_t bytes[2];
    mp_model_memory mm;
    check(mp_model_memory_info(m, &mm), m, "mp_model_memory_info");
    bytes[p] = mm.activations;
    printf("bench=%s impl=mixprec policy=%s activation_bytes=%zu\n", bench, policies[p], bytes[p]);
    if (p == 1 && bytes[0])
        printf("bench=%s ratio=activations_bf16_over_f32 value=%.3f\n", bench, (double)bytes[1] / (double)bytes[0]);
}

/* The benchmarks beside PyTorch (convnet, gpt) time both sides on 1 and 2
   threads under two policies: a round's rates[impl: mixprec, torch]
   [threads][policy], per second. After the rounds, each side's best over
   them and their ratio, a line each. */
enum { PEER_THREADS = 2 };
typedef double peer_rates[2][PEER_THREADS + 1][2];
static inline void peer_print_best(const char *bench, const char *unit, const char *const policies[2],
                                   peer_rates *r, int rounds) {
    static const char *const impls[2] = {"mixprec", "torch"};
    int t, p, i, round;
    for (t = 1; t <= PEER_THREADS; t++)
        for (p = 0; p < 2; p++) {
            double best[2] = {0, 0};
            for (i = 0; i < 2; i++) {
                for (round = 0; round < rounds; round++)
                    if (r[round][i][t][p] > best[i]) best[i] = r[round][i][t][p];
                if (best[i] > 0)
                    printf("bench=%s impl=%s policy=%s threads=%d best_of_rounds=%d %s=%.0f\n", bench, impls[i],
                           policies[p], t, rounds, unit, best[i]);
            }
            if (best[1] > 0)
                printf("bench=%s policy=%s threads=%d ratio=mixprec_over_torch_best value=%.3f\n", bench, policies[p],
                       t, best[0] / best[1]);
        }
}

/* The value of `key=` in line, or -1. */
static inline double peer_value(const char *line, const char *key) {
    char pat[64];
    const char *at;
    double v;
    snprintf(pat, sizeof pat, " %s=", key);
    return (at = strstr(line, pat)) && sscanf(at + strlen(pat), "%lf", &v) == 1 ? v : -1.0;
}
#endif
