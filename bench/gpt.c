/* bench/gpt.c - training speed of a small GPT beside PyTorch's: the model
   of examples/gpt_model.h (llm.c's GPT-2 block: pre-LayerNormalization,
   causal multi-head attention, tanh GELU MLP) at 4 layers, 4 heads, 128
   channels, context 128, a byte vocabulary (256), batch 8, sparse
   categorical crossentropy on the logits and AdamW (Keras's defaults:
   learning rate 1e-3, weight decay 0.004, epsilon 1e-7), trained by the
   custom loop's calls on synthetic tokens (only the speed matters), under
   float32 and mixed_bfloat16, on 1 and 2 threads (mp_model_desc.threads).
   PyTorch's side (bench/torch_cpu.py gpt, found as bench.h says:
   MIXPREC_TORCH_PYTHON) is the same model (nn.Embedding, causal
   scaled_dot_product_attention, GELU tanh, LayerNorm epsilon 1e-5, AdamW
   with the same settings) in float32 and under torch.autocast("cpu",
   bfloat16), on as many threads.
   llm.c (github.com/karpathy/llm.c), the C program a user compares with,
   is not packaged: where MIXPREC_LLMC_DIR names a checkout, its
   train_gpt2.c is built there (gcc -O3 -march=native -fopenmp, as its
   Makefile) and run as it is (GPT-2 124M, batch 4, context 64, its CPU
   default, float32; it needs the files its README's quick start writes:
   gpt2_124M.bin and the tinyshakespeare tokens), and its mean step time
   is printed; without it, a named skip.
   Each round runs 1 thread and then 2; at each, mixprec's two policies and
   then PyTorch's (one process), seconds apart. Each side times a run as
   the best of 3 timings of at least a third of --min-seconds each, after
   2 warm-up steps. One key=value line per run and ratio:
       bench=gpt impl=mixprec|torch round=R policy=P threads=T ms_per_step= tokens_per_s=
       bench=gpt round=R policy=P threads=T ratio=mixprec_over_torch value=
   and after the rounds each side's best over them:
       bench=gpt impl=I policy=P threads=T best_of_rounds=N tokens_per_s=
       bench=gpt policy=P threads=T ratio=mixprec_over_torch_best value=
       bench=gpt impl=mixprec model=gpt2_124M policy=P batch=4 context=64 threads=T ms_per_step= peak_bytes=
         (with --gpt2 or MIXPREC_LLMC_DIR: mixprec at GPT-2 124M's shape, llm.c's CPU setting)
       bench=gpt impl=llmc available=1 model=gpt2_124M batch=4 context=64 ms_per_step=
         (or available=0 reason=...)
   Without torch: a bench=torch available=0 line, and mixprec's lines alone.

   Build and run: `make bench` (`make bench-quick`: 1 round, shorter timings), or
       gcc -std=c99 -O2 -march=native -pthread bench/gpt.c -o bench_gpt -lm
       MIXPREC_TORCH_PYTHON=/path/to/venv/bin/python MIXPREC_LLMC_DIR=/path/to/llm.c ./bench_gpt
           [--rounds R] [--min-seconds S] [--threads T] [--no-torch] [--gpt2] */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#define BENCH_NAME "gpt"
#include "bench.h"
#include "../examples/gpt_model.h"

#define VOCAB 256
#define CONTEXT 128
#define LAYERS 4
#define HEADS 4
#define CHANNELS 128
#define BATCH 8
#define N_THREADS PEER_THREADS
#define MAX_ROUNDS 20

static const char *const policies[2] = {"float32", "mixed_bfloat16"};
static double min_s = 1.0;
static int only_threads; /* 0: both */

/* A GPT's shape: the benchmark's small one, or GPT-2 124M's at llm.c's CPU
   batch and context (its vocabulary unpadded, the logits' Dense its own
   weights where GPT-2 ties them to the token embedding). */
typedef struct shape {
    int vocab, context, layers, heads, channels, batch;
} shape;
static const shape small = {VOCAB, CONTEXT, LAYERS, HEADS, CHANNELS, BATCH};
static const shape gpt2 = {50257, 64, 12, 12, 768, 4};

static mp_model *build_model(const shape *g, const char *policy, int threads) {
    mp_model_desc md;
    mp_compile_desc cd;
    mp_model *m = NULL;
    memset(&md, 0, sizeof md);
    memset(&cd, 0, sizeof cd);
    md.input_shape[0] = g->context;
    md.threads = threads;
    check(mp_set_global_policy_name(policy), NULL, policy);
    check(mp_model_create(&m, &md), NULL, "mp_model_create");
    check(gpt_layers(m, g->vocab, g->context, g->layers, g->heads, g->channels), m, "gpt_layers");
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    cd.from_logits = 1;
    cd.optimizer.kind = MP_ADAMW; /* Keras's defaults */
    check(mp_model_compile(m, &cd), m, "compile");
    return m;
}

/* One training step on (batch, context) tokens and their targets. */
static void step(const shape *g, mp_model *m, int32_t *x, int32_t *y) {
    int applied;
    float loss;
    mp_data d;
    mp_array labels = mp_array_i32(y, (size_t)g->batch, 1, &g->context);
    memset(&d, 0, sizeof d);
    d.x[0] = mp_array_i32(x, (size_t)g->batch, 1, &g->context);
    check(mp_forward(m, &d, 1), m, "mp_forward");
    check(mp_compute_loss(m, &labels, &loss, NULL), m, "mp_compute_loss");
    check(mp_compute_scaled_gradients(m), m, "mp_compute_scaled_gradients");
    check(mp_get_unscaled_gradients(m), m, "mp_get_unscaled_gradients");
    check(mp_apply_gradients(m, &applied), m, "mp_apply_gradients");
}

/* One step of the small GPT, as best_step_seconds times it. */
typedef struct timed {
    mp_model *m;
    int32_t *x, *y;
} timed;
static void timed_step(void *ctx) {
    timed *t = (timed *)ctx;
    step(&small, t->m, t->x, t->y);
}

static void peer_line(const char *line, void *ctx) {
    double *rate = (double *)ctx, v = peer_value(line, "tokens_per_s");
    int p;
    if (!strstr(line, "bench=gpt impl=torch") || v <= 0) return;
    for (p = 0; p < 2; p++) {
        char key[64];
        snprintf(key, sizeof key, " policy=%s ", policies[p]);
        if (strstr(line, key)) rate[p] = v;
    }
}

static void round_at(int round, int threads, int32_t *x, int32_t *y, peer_rates r) {
    double *mine = r[0][threads], *torch = r[1][threads];
    char args[160];
    int p;
    for (p = 0; p < 2; p++) {
        timed t;
        double s;
        t.m = build_model(&small, policies[p], threads), t.x = x, t.y = y;
        s = best_step_seconds(timed_step, &t, min_s);
        mp_model_destroy(t.m);
        mine[p] = BATCH * CONTEXT / s;
        printf("bench=gpt impl=mixprec round=%d policy=%s threads=%d ms_per_step=%.2f tokens_per_s=%.0f\n", round,
               policies[p], threads, s * 1e3, mine[p]);
        fflush(stdout);
    }
    if (!peer_enabled) return;
    snprintf(args, sizeof args,
             "gpt --batch %d --context %d --layers %d --heads %d --channels %d --vocab %d --threads %d "
             "--min-seconds %.2f --round %d",
             BATCH, CONTEXT, LAYERS, HEADS, CHANNELS, VOCAB, threads, min_s, round);
    peer_run(args, NULL, peer_line, torch);
    for (p = 0; p < 2; p++)
        if (torch[p] > 0)
            printf("bench=gpt round=%d policy=%s threads=%d ratio=mixprec_over_torch value=%.3f\n", round, policies[p],
                   threads, mine[p] / torch[p]);
    fflush(stdout);
}

/* mixprec at GPT-2 124M's shape, llm.c's CPU setting: each policy's step
   time (the best of 3 steps after 1 warm-up) and the model's peak bytes. */
static void gpt2_steps(int32_t *x, int32_t *y) {
    int p, threads = only_threads ? only_threads : N_THREADS;
    for (p = 0; p < 2; p++) {
        mp_model *m;
        double best = 1e30;
        int k;
        mp_reset_peak_memory();
        m = build_model(&gpt2, policies[p], threads);
        step(&gpt2, m, x, y);
        for (k = 0; k < 3; k++) {
            double t0 = now_s();
            step(&gpt2, m, x, y);
            if (now_s() - t0 < best) best = now_s() - t0;
        }
        mp_model_destroy(m);
        printf("bench=gpt impl=mixprec model=gpt2_124M policy=%s batch=%d context=%d threads=%d ms_per_step=%.1f "
               "peak_bytes=%zu\n",
               policies[p], gpt2.batch, gpt2.context, threads, best * 1e3, mp_get_memory_info().peak);
        fflush(stdout);
    }
}

/* llm.c's train_gpt2.c from $MIXPREC_LLMC_DIR, built and run there as it
   is (its own 124M model, data and step count); its "step N: train loss L
   (took T ms)" lines averaged, the first (warm-up) left out. */
static void llmc(void) {
    const char *dir = getenv("MIXPREC_LLMC_DIR");
    char cmd[2048], line[512];
    double sum = 0.0, ms;
    int n = 0, k;
    FILE *f;
    if (!dir || !*dir) {
        printf("bench=gpt impl=llmc available=0 reason=MIXPREC_LLMC_DIR_unset\n");
        return;
    }
    snprintf(cmd, sizeof cmd,
             "cd '%s' && test -f train_gpt2.c && test -f gpt2_124M.bin && "
             "gcc -O3 -march=native -fopenmp train_gpt2.c -o train_gpt2_mixprec_bench -lm >&2 && "
             "OMP_NUM_THREADS=%d ./train_gpt2_mixprec_bench 2>&1",
             dir, only_threads ? only_threads : N_THREADS);
    fflush(stdout);
    if (!(f = popen(cmd, "r"))) {
        printf("bench=gpt impl=llmc available=0 reason=popen_failed\n");
        return;
    }
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "step %d: train loss %*f (took %lf ms)", &k, &ms) == 2 && k > 0) sum += ms, n++;
    if (pclose(f) != 0 && n == 0) {
        printf("bench=gpt impl=llmc available=0 reason=\"build or run failed in MIXPREC_LLMC_DIR (train_gpt2.c and "
               "gpt2_124M.bin needed)\"\n");
        return;
    }
    if (n == 0) printf("bench=gpt impl=llmc available=0 reason=no_step_lines\n");
    else
        printf("bench=gpt impl=llmc available=1 model=gpt2_124M policy=float32 batch=4 context=64 threads=%d steps=%d "
               "ms_per_step=%.1f\n",
               only_threads ? only_threads : N_THREADS, n, sum / n);
}

int main(int argc, char **argv) {
    int32_t *x = (int32_t *)xmalloc((size_t)BATCH * CONTEXT * sizeof(int32_t));
    int32_t *y = (int32_t *)xmalloc((size_t)BATCH * CONTEXT * sizeof(int32_t));
    unsigned long long s = 0x9E3779B97F4A7C15ull;
    static peer_rates r[MAX_ROUNDS];
    int a, rounds = 3, round, t, i, with_gpt2 = 0;
    for (a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--no-torch") == 0) peer_enabled = 0;
        else if (strcmp(argv[a], "--quick") == 0) rounds = 1, min_s = 0.3;
        else if (strcmp(argv[a], "--gpt2") == 0) with_gpt2 = 1;
        else if (a + 1 < argc && strcmp(argv[a], "--rounds") == 0) rounds = atoi(argv[++a]);
        else if (a + 1 < argc && strcmp(argv[a], "--min-seconds") == 0) min_s = atof(argv[++a]);
        else if (a + 1 < argc && strcmp(argv[a], "--threads") == 0) only_threads = atoi(argv[++a]);
        else {
            fprintf(stderr, "usage: %s [--quick] [--rounds R] [--min-seconds S] [--threads T] [--no-torch] [--gpt2]\n",
                    argv[0]);
            return 2;
        }
    }
    if (rounds < 1 || rounds > MAX_ROUNDS || !(min_s > 0) || only_threads < 0 || only_threads > N_THREADS) {
        fprintf(stderr, "%s: --rounds 1 to %d, --min-seconds above 0, --threads 1 or 2\n", argv[0], MAX_ROUNDS);
        return 2;
    }
    printf("bench=gpt cores=%d vocab=%d context=%d layers=%d heads=%d channels=%d batch=%d rounds=%d min_timing_s=%.2f\n",
           mp_available_cores(), VOCAB, CONTEXT, LAYERS, HEADS, CHANNELS, BATCH, rounds, min_s);
    print_machine("gpt");
    peer_probe();
    for (i = 0; i < BATCH * CONTEXT; i++) { /* xorshift64 tokens (below every vocabulary here; --gpt2 reads the
                                                first 4 x 64): the speed does not depend on them */
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = (int32_t)(s % VOCAB);
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        y[i] = (int32_t)(s % VOCAB);
    }
    for (round = 0; round < rounds; round++)
        for (t = 1; t <= N_THREADS; t++)
            if (!only_threads || t == only_threads) round_at(round, t, x, y, r[round]);
    peer_print_best("gpt", "tokens_per_s", policies, r, rounds); /* each side's best over the rounds */
    if (with_gpt2 || (getenv("MIXPREC_LLMC_DIR") && *getenv("MIXPREC_LLMC_DIR"))) gpt2_steps(x, y); /* llm.c's peer */
    llmc();
    print_machine("gpt"); /* the load at the end too */
    free(x);
    free(y);
    return 0;
}
