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
   is not packaged: where MIXPREC_LLMC_DIR names its source (a checkout:
   train_gpt2.c and llmc/), train_gpt2.c is built into build/llmc with the
   flags of llm.c's Makefile and run unchanged (GPT-2 124M, batch 4,
   context 64, its CPU default, float32) on the same threads, after
   mixprec's steps at that shape. It runs in the checkout where that holds
   the inputs its README's quick start downloads (gpt2_124M.bin and the
   tinyshakespeare tokens), else in build/llmc on stand-ins written there
   (random weights, byte tokens; llmc() says how). Its step time and the
   ratio of the two are printed; without MIXPREC_LLMC_DIR, a named skip.
   Each round runs 1 thread and then 2; at each, mixprec's two policies and
   then PyTorch's (one process), seconds apart. Each side times a run as
   the best of 3 timings of at least a third of --min-seconds each, after
   2 warm-up steps. One key=value line per run and ratio:
       bench=gpt impl=mixprec|torch round=R policy=P threads=T ms_per_step= tokens_per_s=
       bench=gpt impl=mixprec policy=P activation_bytes=    (after a step, each policy)
       bench=gpt ratio=activations_bf16_over_f32 value=
       bench=gpt round=R policy=P threads=T ratio=mixprec_over_torch value=
   and after the rounds each side's best over them:
       bench=gpt impl=I policy=P threads=T best_of_rounds=N tokens_per_s=
       bench=gpt policy=P threads=T ratio=mixprec_over_torch_best value=
       bench=gpt impl=mixprec model=gpt2_124M policy=P batch=4 context=64 threads=T ms_per_step= peak_bytes=
       bench=gpt model=gpt2_124M impl=mixprec policy=P activation_bytes=, and their ratio as above
         (with --gpt2 or MIXPREC_LLMC_DIR: mixprec at GPT-2 124M's shape, llm.c's CPU setting)
       bench=gpt impl=llmc available=1 model=gpt2_124M policy=float32 batch=4 context=64 threads=T
           inputs=checkout|random ms_per_step=
       bench=gpt model=gpt2_124M policy=float32 threads=T ratio=mixprec_over_llmc value=
         (llm.c's step time over mixprec's: above 1, mixprec is faster; or impl=llmc available=0 reason=...)
   Without torch: a bench=torch available=0 line, and mixprec's lines alone.

   Build and run from the repository root (llm.c's build and stand-ins go
   to build/llmc): `make bench` (`make bench-quick`: 1 round, shorter timings), or
       gcc -std=c99 -O2 -march=native -pthread bench/gpt.c -o bench_gpt -lm
       MIXPREC_TORCH_PYTHON=/path/to/venv/bin/python MIXPREC_LLMC_DIR=/path/to/llm.c ./bench_gpt
           [--rounds R] [--min-seconds S] [--threads T] [--no-torch] [--gpt2] */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <math.h>
#include <unistd.h>
#include <sys/stat.h>

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
#define GPT2_TIMED_STEPS 3 /* at GPT-2 124M's shape, on both sides */

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
        if (round == 0 && threads == (only_threads ? only_threads : 1)) activation_lines("gpt", policies, t.m, p);
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
   time (the best of GPT2_TIMED_STEPS steps after 1 warm-up, as llmc()
   takes llm.c's), its activation bytes and the model's peak bytes.
   Returns float32's seconds. */
static double gpt2_steps(int32_t *x, int32_t *y) {
    int p, threads = only_threads ? only_threads : N_THREADS;
    double float32_s = 0.0;
    for (p = 0; p < 2; p++) {
        mp_model *m;
        double best = 1e30;
        int k;
        mp_reset_peak_memory();
        m = build_model(&gpt2, policies[p], threads);
        step(&gpt2, m, x, y);
        for (k = 0; k < GPT2_TIMED_STEPS; k++) {
            double t0 = now_s(), s;
            step(&gpt2, m, x, y);
            if ((s = now_s() - t0) < best) best = s;
        }
        activation_lines("gpt model=gpt2_124M", policies, m, p);
        mp_model_destroy(m);
        if (p == 0) float32_s = best;
        printf("bench=gpt impl=mixprec model=gpt2_124M policy=%s batch=%d context=%d threads=%d ms_per_step=%.1f "
               "peak_bytes=%zu\n",
               policies[p], gpt2.batch, gpt2.context, threads, best * 1e3, mp_get_memory_info().peak);
        fflush(stdout);
    }
    return float32_s;
}

/* ---- llm.c's train_gpt2.c (github.com/karpathy/llm.c) ------------------
   Its main() opens, relative to the directory it runs in, gpt2_124M.bin
   (the weights), dev/data/tinyshakespeare/tiny_shakespeare_{train,val}.bin
   (the tokens) and, optionally, gpt2_tokenizer.bin (without it, a warning).
   Where the checkout holds the first three (its README's quick start
   downloads them), it runs there; otherwise the benchmark writes stand-ins
   of the same formats into LLMC_WORK once and runs there: random weights
   (the step's time does not depend on their values) and byte tokens. */
#define LLMC_WORK "build/llmc"
#define LLMC_TOKENS 32768 /* each token file's: any count above B x T + 1 = 257 will do */

/* 24 bits of a xorshift64 as a float in (0, 1]. */
static float uniform01(unsigned long long *s) { return (float)((xorshift64(s) >> 40) + 1) * 0x1p-24f; }

/* A normal(0, std) draw (Box-Muller). */
static float normal(unsigned long long *s, float std) {
    float u = uniform01(s), v = uniform01(s);
    return std * sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* GPT-2 124M as train_gpt2.c's gpt2_build_from_checkpoint reads it: 256
   int32 (magic 20240326, version 3, then max_seq_len 1024, vocab_size
   50257, num_layers, num_heads, channels, padded_vocab_size Vp 50304), then
   the float32 parameters in fill_in_parameter_sizes' order and sizes,
   initialised as GPT-2's are: LayerNormalization's gammas 1 and every bias
   0, the rest normal(0, 0.02). Kept when a file of its size is there. */
static int write_llmc_checkpoint(const char *path) {
    enum { L = 12, C = 768, MAXT = 1024, VP = 50304 };
    static const struct {
        size_t count;
        char init; /* 'n' normal(0, 0.02), '1' ones, '0' zeros */
    } tensors[16] = {
        {(size_t)VP * C, 'n'},         {(size_t)MAXT * C, 'n'}, /* wte, wpe */
        {(size_t)L * C, '1'},          {(size_t)L * C, '0'},    /* ln1w, ln1b */
        {(size_t)L * 3 * C * C, 'n'},  {(size_t)L * 3 * C, '0'}, /* qkvw, qkvb */
        {(size_t)L * C * C, 'n'},      {(size_t)L * C, '0'},    /* attprojw, attprojb */
        {(size_t)L * C, '1'},          {(size_t)L * C, '0'},    /* ln2w, ln2b */
        {(size_t)L * 4 * C * C, 'n'},  {(size_t)L * 4 * C, '0'}, /* fcw, fcb */
        {(size_t)L * C * 4 * C, 'n'},  {(size_t)L * C, '0'},    /* fcprojw, fcprojb */
        {(size_t)C, '1'},              {(size_t)C, '0'},        /* lnfw, lnfb */
    };
    int32_t header[256] = {20240326, 3, MAXT, 50257, L, 12, C, VP};
    size_t total = 0, i, k, chunk = (size_t)1 << 16; /* every count is below 2^26: no sum overflows */
    unsigned long long s = 0x9E3779B97F4A7C15ull;
    struct stat st;
    float *buf;
    FILE *f;
    int ok;
    for (i = 0; i < 16; i++) total += tensors[i].count;
    if (stat(path, &st) == 0 && (unsigned long long)st.st_size == sizeof header + total * sizeof(float)) return 1;
    if (!(buf = (float *)malloc(chunk * sizeof(float))) || !(f = fopen(path, "wb"))) {
        free(buf);
        return 0;
    }
    ok = fwrite(header, sizeof header, 1, f) == 1;
    for (i = 0; ok && i < 16; i++)
        for (k = 0; ok && k < tensors[i].count; k += chunk) {
            size_t n = tensors[i].count - k < chunk ? tensors[i].count - k : chunk, j;
            for (j = 0; j < n; j++)
                buf[j] = tensors[i].init == 'n' ? normal(&s, 0.02f) : tensors[i].init == '1' ? 1.0f : 0.0f;
            ok = fwrite(buf, sizeof(float), n, f) == n;
        }
    free(buf);
    return (fclose(f) == 0) && ok;
}

/* A token file as llm.c's dataloader_load_shard_ reads it: 256 int32
   (magic 20240520, version 1, the token count), then the tokens as uint16. */
static int write_llmc_tokens(const char *path, const uint16_t *tokens, int32_t count) {
    int32_t header[256] = {20240520, 1};
    FILE *f = fopen(path, "wb");
    int ok;
    header[2] = count;
    ok = f && fwrite(header, sizeof header, 1, f) == 1 &&
         fwrite(tokens, sizeof(uint16_t), (size_t)count, f) == (size_t)count;
    return (f && fclose(f) == 0) && ok;
}

/* The stand-in inputs in LLMC_WORK: tokens from `make data`'s fortunes text
   (one byte a token), where it is long enough, else xorshift64 tokens below
   GPT-2's vocabulary. NULL, or what failed. */
static const char *write_llmc_inputs(void) {
    static uint16_t tokens[2 * LLMC_TOKENS]; /* train's, then val's */
    static const char *const dirs[] = {"build", LLMC_WORK, LLMC_WORK "/dev", LLMC_WORK "/dev/data",
                                       LLMC_WORK "/dev/data/tinyshakespeare"};
    unsigned char text[2 * LLMC_TOKENS];
    unsigned long long s = 0x9E3779B97F4A7C15ull;
    FILE *f = fopen("build/fortunes.txt", "rb");
    size_t n = f ? fread(text, 1, sizeof text, f) : 0, i;
    if (f) fclose(f);
    for (i = 0; i < 2 * LLMC_TOKENS; i++) tokens[i] = n == sizeof text ? text[i] : (uint16_t)(xorshift64(&s) % 50257);
    for (i = 0; i < sizeof dirs / sizeof dirs[0]; i++)
        if (mkdir(dirs[i], 0777) != 0 && errno != EEXIST) return "cannot_create_" LLMC_WORK;
    if (!write_llmc_tokens(LLMC_WORK "/dev/data/tinyshakespeare/tiny_shakespeare_train.bin", tokens, LLMC_TOKENS) ||
        !write_llmc_tokens(LLMC_WORK "/dev/data/tinyshakespeare/tiny_shakespeare_val.bin", tokens + LLMC_TOKENS,
                           LLMC_TOKENS))
        return "cannot_write_token_files";
    return write_llmc_checkpoint(LLMC_WORK "/gpt2_124M.bin") ? NULL : "cannot_write_gpt2_124M.bin";
}

/* Whether dir holds path (dir/path). */
static int has_file(const char *dir, const char *path) {
    char full[4096];
    return (size_t)snprintf(full, sizeof full, "%s/%s", dir, path) < sizeof full && access(full, R_OK) == 0;
}

/* llm.c's train_gpt2.c from the source in $MIXPREC_LLMC_DIR (train_gpt2.c
   and llmc/), built into LLMC_WORK with the flags of llm.c's Makefile on
   Linux (`cc -Ofast -Wno-unused-result -Wno-ignored-pragmas
   -Wno-unknown-attributes -march=native -fopenmp -DOMP train_gpt2.c -lm
   -lgomp`: make's CC is cc) and run on as many threads (OMP_NUM_THREADS),
   unchanged: GPT-2 124M, batch 4, context 64, float32, AdamW. Each of its
   steps prints "step N: train loss L (took T ms)"; the first (it allocates
   the gradients and AdamW's moments) is a warm-up, and the best of the next
   GPT2_TIMED_STEPS is its time, as gpt2_steps takes mixprec's. It would go
   on to 40 steps with validation and sampling; after those lines the pipe
   is closed, and it ends at its next line (SIGPIPE: stdbuf -oL makes its
   output line-buffered; without stdbuf, the lines come when it ends).
   mixprec_s: mixprec's float32 step at the same shape (0: none, no ratio). */
static void llmc(double mixprec_s) {
    const char *dir = getenv("MIXPREC_LLMC_DIR"), *run_dir = dir, *why;
    int threads = only_threads ? only_threads : N_THREADS, n = 0, k, checkout_inputs;
    char cmd[8192], line[512];
    double best = 1e30, ms;
    FILE *f;
    if (!dir || !*dir) {
        printf("bench=gpt impl=llmc available=0 reason=MIXPREC_LLMC_DIR_unset\n");
        return;
    }
    if (strchr(dir, '\'') || strlen(dir) > 2048) { /* it goes into a shell command, quoted */
        printf("bench=gpt impl=llmc available=0 reason=\"MIXPREC_LLMC_DIR has a quote or is too long\"\n");
        return;
    }
    if (!has_file(dir, "train_gpt2.c")) {
        printf("bench=gpt impl=llmc available=0 reason=\"no train_gpt2.c in MIXPREC_LLMC_DIR\"\n");
        return;
    }
    checkout_inputs = has_file(dir, "gpt2_124M.bin") &&
                      has_file(dir, "dev/data/tinyshakespeare/tiny_shakespeare_train.bin") &&
                      has_file(dir, "dev/data/tinyshakespeare/tiny_shakespeare_val.bin");
    if (!checkout_inputs) {
        if ((why = write_llmc_inputs())) {
            printf("bench=gpt impl=llmc available=0 reason=%s\n", why);
            return;
        }
        run_dir = LLMC_WORK;
    }
    snprintf(cmd, sizeof cmd,
             "mkdir -p " LLMC_WORK " && cc -Ofast -Wno-unused-result -Wno-ignored-pragmas -Wno-unknown-attributes "
             "-march=native -fopenmp -DOMP '%s/train_gpt2.c' -lm -lgomp -o " LLMC_WORK "/train_gpt2 >&2 && "
             "bin=\"$PWD/" LLMC_WORK "/train_gpt2\" && cd '%s' && "
             "exec env OMP_NUM_THREADS=%d $(command -v stdbuf >/dev/null && echo stdbuf -oL) \"$bin\" 2>&1",
             dir, run_dir, threads);
    fflush(stdout);
    if (!(f = popen(cmd, "r"))) {
        printf("bench=gpt impl=llmc available=0 reason=popen_failed\n");
        return;
    }
    while (n < 1 + GPT2_TIMED_STEPS && fgets(line, sizeof line, f)) {
        fprintf(stderr, "llm.c: %s", line); /* what it ran (its sizes, the loss) or why it stopped */
        if (sscanf(line, "step %d: train loss %*f (took %lf ms)", &k, &ms) == 2 && n++ > 0 && ms < best) best = ms;
    }
    (void)pclose(f); /* its status: killed by SIGPIPE when it had more to say */
    if (n < 1 + GPT2_TIMED_STEPS) {
        printf("bench=gpt impl=llmc available=0 reason=\"build or run failed (%d step lines; its output on stderr)\"\n",
               n);
        return;
    }
    printf("bench=gpt impl=llmc available=1 model=gpt2_124M policy=float32 batch=4 context=64 threads=%d inputs=%s "
           "ms_per_step=%.1f\n",
           threads, checkout_inputs ? "checkout" : "random", best);
    if (mixprec_s > 0)
        printf("bench=gpt model=gpt2_124M policy=float32 threads=%d ratio=mixprec_over_llmc value=%.3f\n", threads,
               best / (mixprec_s * 1e3));
    fflush(stdout);
}

int main(int argc, char **argv) {
    int32_t *x = (int32_t *)xmalloc((size_t)BATCH * CONTEXT * sizeof(int32_t));
    int32_t *y = (int32_t *)xmalloc((size_t)BATCH * CONTEXT * sizeof(int32_t));
    unsigned long long s = 0x9E3779B97F4A7C15ull;
    static peer_rates r[MAX_ROUNDS];
    int a, rounds = 3, round, t, i, with_gpt2 = 0;
    double gpt2_float32_s = 0.0;
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
        x[i] = (int32_t)(xorshift64(&s) % VOCAB);
        y[i] = (int32_t)(xorshift64(&s) % VOCAB);
    }
    for (round = 0; round < rounds; round++)
        for (t = 1; t <= N_THREADS; t++)
            if (!only_threads || t == only_threads) round_at(round, t, x, y, r[round]);
    peer_print_best("gpt", "tokens_per_s", policies, r, rounds); /* each side's best over the rounds */
    if (with_gpt2 || (getenv("MIXPREC_LLMC_DIR") && *getenv("MIXPREC_LLMC_DIR")))
        gpt2_float32_s = gpt2_steps(x, y); /* llm.c's peer */
    llmc(gpt2_float32_s);
    print_machine("gpt"); /* the load at the end too */
    free(x);
    free(y);
    return 0;
}
