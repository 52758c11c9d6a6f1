/* bench/train.c - training speed and activation memory of the guide's MLP.

   The TensorFlow mixed precision guide's model, 784-U-U-10 (Dense relu,
   Dense relu, Dense, a float32 softmax), sparse categorical crossentropy and
   RMSprop, trained with the custom-loop calls on synthetic data (random
   pixels and labels: only the speed matters), for U in {1024, 4096}, batch
   in {128, 8192}, policies float32, mixed_float16 and mixed_bfloat16, on 1
   and 2 threads (mp_model_desc.threads). One key=value line per run:
       bench=train ... ms_per_step= images_per_s= gflops= act_mib= workspace_mib= step_peak_mib=
   where act_mib is mp_model_memory_info's activations (the activations,
   their gradients and the batch buffers), workspace_mib the thread pool's
   GEMM panels, and step_peak_mib mp_get_memory_info's peak above the bytes
   in use after compile (the two together). Then, per shape and thread count:
       ratio=step_time_over_float32   a mixed policy's ms/step / float32's
       ratio=act_mem_over_float32     its act_mib / float32's
   PyTorch's side, measured in the same run when a python with torch is at
   hand (bench/torch_cpu.py, found as bench.h says: MIXPREC_TORCH_PYTHON):
   the same model, RMSprop, batch and data, float32 and bfloat16 autocast,
   on 1 and 2 threads, each under OpenMP's default wait policy and under
   OMP_WAIT_POLICY=PASSIVE, its lines passed on as they come. Each round
   runs 1 thread, then 2, mixprec and then PyTorch at each; 2 rounds (1
   when a step takes over half a second), each side keeping its best.
   Then per shape and thread count:
       bench=train impl=torch ... best_of=default|passive images_per_s=
       ratio=mixprec_over_torch   mixprec's images/s / PyTorch's best, for
                                  float32 and mixed_bfloat16 (autocast)
   Without torch: a bench=torch available=0 line, and no such ratios.
   And per shape and policy (without --threads), from the model on 1
   thread, on 2, and two 1-thread models at once, each in a thread of its
   own (what the host gives two cores that share no work), timed in turn
   (time_in_turn):
       bench=train ... in_turn=1 images_per_s_1= images_per_s_2= images_per_s_independent=
       ratio=threads_2_over_1        2 threads' images/s / 1 thread's
       ratio=independent_2_over_1    the two models' together / 1 thread's
       ratio=split_over_independent  2 threads' / the two models'
   Each run times whole steps for >= 1 s after 2 warm-up steps (1 when a
   step takes over a second), at least 2 steps.

   Build and run: `make bench` (`make bench-quick` for a reduced set), or
       gcc -std=c99 -O2 -march=native -pthread bench/train.c -o bench_train -lm
       MIXPREC_TORCH_PYTHON=/path/to/venv/bin/python ./bench_train [--quick] [--no-torch]
   One cell: --units U, --batch B and --threads T each keep only that value
   (a full run takes several minutes; a cell well under one). --options
   NAME adds the optimizer's options, what they cost beside none:
   decay (weight_decay 0.004, in the update's pass), clipvalue (1),
   clipnorm (1: a sum of squares per variable, then the factor in the
   update's pass), global_clipnorm (1: one over all the gradients).
   --update-pass times the passes those options run, alone, on the CPU
   backend's ops: the update of the 4096-unit model's 20 million weights
   (RMSprop, its bfloat16 gradients unscaled as read, the bfloat16 copy
   written) with each option, and the sum of squares of those gradients,
   on 1 and 2 threads, 5 interleaved rounds, each keeping its best:
       bench=train_update threads= pass= ms= gb_per_s=
   (gb_per_s: the bytes the pass must move, over its time). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#define BENCH_NAME "train"
#include "bench.h"

#define COUNT(a) (sizeof a / sizeof a[0])
#define INPUTS 784
#define CLASSES 10
/* Runs whose activations would need more than this are skipped. */
#define MEMORY_LIMIT ((double)8 * 1024 * 1024 * 1024)

static const char *const policies[] = {"float32", "mixed_float16", "mixed_bfloat16"};
#define N_POLICIES COUNT(policies)
#define N_THREADS 2

typedef struct settings {
    const int *units, *batches;
    size_t n_units, n_batches;
    double min_s; /* timed steps last at least this long */
} settings;

static const int full_units[] = {1024, 4096}, full_batches[] = {128, 8192};
static const int quick_units[] = {1024}, quick_batches[] = {128};
static settings S = {full_units, full_batches, COUNT(full_units), COUNT(full_batches), 1.0};
static int only_units, only_batch, only_threads; /* 0: all */
static mp_optimizer_desc options;                 /* --options: RMSprop with these */
static const char *options_name = "none";

typedef struct run {
    int units, batch, threads;
    const char *policy;
    double step_s;
    long steps;
    size_t act_bytes, ws_bytes, peak_bytes;
    unsigned long long skipped;
} run;

/* ---- the model --------------------------------------------------------- */
static mp_model *build_model(const run *r) {
    mp_model_desc md;
    mp_compile_desc cd;
    mp_layer_desc softmax = mp_activation_layer(MP_SOFTMAX);
    mp_model *m = NULL;
    memset(&md, 0, sizeof md);
    memset(&cd, 0, sizeof cd);
    md.input_shape[0] = INPUTS;
    md.threads = r->threads;
    check(mp_set_global_policy_name(r->policy), NULL, r->policy);
    check(mp_model_create(&m, &md), NULL, "mp_model_create");
    check(mp_model_add(m, mp_dense(r->units, MP_RELU)), m, "add");
    check(mp_model_add(m, mp_dense(r->units, MP_RELU)), m, "add");
    check(mp_model_add(m, mp_dense(CLASSES, MP_LINEAR)), m, "add");
    softmax.dtype = "float32"; /* the guide: Activation('softmax', dtype='float32') */
    check(mp_model_add(m, softmax), m, "add");
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY; /* RMSprop with Keras's defaults */
    cd.optimizer = options;
    check(mp_model_compile(m, &cd), m, "compile");
    return m;
}

/* Floating-point operations of one step: every Dense layer's forward
   product and weight gradient, and the input gradient of all but the first
   (the data need none): 2 flops per multiply-add. */
static double step_flops(int units, int batch) {
    double b = batch, u = units;
    double fwd = 2 * b * (INPUTS * u + u * u + u * CLASSES);
    return 2 * fwd + 2 * b * (u * u + u * CLASSES);
}

/* A generous guess at the bytes a run needs: every activation and its
   gradient in float32, three times over, and the weights six times
   (weights, gradients, slots, their compute-dtype copies). */
static double bytes_needed(int units, int batch) {
    double b = batch, u = units;
    double params = INPUTS * u + u * u + u * CLASSES;
    return b * (INPUTS + 2 * u + 2 * CLASSES) * 4 * 3 + params * 4 * 6;
}

/* ---- one run ----------------------------------------------------------- */
static void time_run(run *r, const float *x, const int32_t *labels) {
    mp_model *m = build_model(r);
    size_t baseline = mp_get_memory_info().current;
    double t0 = now_s(), first;
    const mp_loss_scale *ls;
    mp_model_memory mem;
    mp_reset_peak_memory();
    bench_step(m, x, INPUTS, labels, r->batch); /* allocates the activations */
    first = now_s() - t0;
    if (first < 1.0) bench_step(m, x, INPUTS, labels, r->batch);
    r->steps = 0;
    t0 = now_s();
    do {
        bench_step(m, x, INPUTS, labels, r->batch);
        r->steps++;
    } while (r->steps < 2 || now_s() - t0 < S.min_s);
    r->step_s = (now_s() - t0) / (double)r->steps;
    r->peak_bytes = mp_get_memory_info().peak - baseline;
    if (mp_model_memory_info(m, &mem) == MP_OK) {
        r->act_bytes = mem.activations;
        r->ws_bytes = mem.workspace;
    }
    ls = mp_model_loss_scale(m);
    r->skipped = ls ? (unsigned long long)ls->skipped_steps : 0;
    mp_model_destroy(m);
}

static void print_run(const run *r) {
    printf("bench=train model=mlp units=%d batch=%d policy=%s threads=%d steps=%ld ms_per_step=%.2f "
           "images_per_s=%.0f gflops=%.1f act_mib=%.1f workspace_mib=%.1f step_peak_mib=%.1f skipped_steps=%llu\n",
           r->units, r->batch, r->policy, r->threads, r->steps, r->step_s * 1e3, r->batch / r->step_s,
           step_flops(r->units, r->batch) / r->step_s * 1e-9, (double)r->act_bytes / (1024.0 * 1024.0),
           (double)r->ws_bytes / (1024.0 * 1024.0), (double)r->peak_bytes / (1024.0 * 1024.0), r->skipped);
    fflush(stdout);
}

/* runs[p]: the policies at one shape and thread count; runs[0] is float32. */
static void print_ratios(const run runs[N_POLICIES]) {
    size_t p;
    for (p = 1; p < N_POLICIES; p++) {
        const char *head = "bench=train model=mlp";
        printf("%s units=%d batch=%d threads=%d ratio=step_time_over_float32 policy=%s value=%.3f\n", head,
               runs[p].units, runs[p].batch, runs[p].threads, runs[p].policy, runs[p].step_s / runs[0].step_s);
        printf("%s units=%d batch=%d threads=%d ratio=act_mem_over_float32 policy=%s value=%.3f\n", head,
               runs[p].units, runs[p].batch, runs[p].threads, runs[p].policy,
               (double)runs[p].act_bytes / (double)runs[0].act_bytes);
    }
    fflush(stdout);
}

/* ---- the PyTorch peer --------------------------------------------------- */
/* PyTorch's best images/s per policy it runs (float32, mixed_bfloat16),
   and the wait policy that gave it. */
typedef struct peer_best {
    double images_per_s[2];
    const char *wait[2];
    const char *running; /* the wait policy of the job being read */
} peer_best;
static const char *const peer_policies[2] = {"float32", "mixed_bfloat16"};

static void peer_train_line(const char *line, void *ctx) {
    peer_best *b = (peer_best *)ctx;
    double v = peer_value(line, "images_per_s");
    int p;
    if (!strstr(line, "bench=train impl=torch") || v <= 0) return;
    for (p = 0; p < 2; p++) {
        char key[64];
        snprintf(key, sizeof key, " policy=%s ", peer_policies[p]);
        if (strstr(line, key) && v > b->images_per_s[p]) b->images_per_s[p] = v, b->wait[p] = b->running;
    }
}

static void peer_train(peer_best *b, int units, int batch, int threads) {
    static const char *const waits[2] = {NULL, "PASSIVE"};
    char args[160];
    int w;
    snprintf(args, sizeof args, "train --units %d --batch %d --threads %d --min-seconds %.2f", units, batch, threads,
             S.min_s);
    for (w = 0; w < 2; w++) {
        b->running = waits[w] ? "passive" : "default";
        peer_run(args, waits[w], peer_train_line, b);
    }
}

/* mixprec's best of each policy over PyTorch's: runs[0] float32, runs[2]
   mixed_bfloat16 (PyTorch's bfloat16 autocast). */
static void print_peer(const run runs[N_POLICIES], const peer_best *b) {
    int p;
    for (p = 0; p < 2; p++) {
        const run *r = &runs[p ? 2 : 0];
        if (b->images_per_s[p] <= 0) continue;
        printf("bench=train impl=torch model=mlp units=%d batch=%d policy=%s threads=%d best_of=%s images_per_s=%.0f\n",
               r->units, r->batch, peer_policies[p], r->threads, b->wait[p], b->images_per_s[p]);
        printf("bench=train model=mlp units=%d batch=%d threads=%d ratio=mixprec_over_torch policy=%s value=%.3f "
               "torch_best_of=%s\n",
               r->units, r->batch, r->threads, peer_policies[p], r->batch / r->step_s / b->images_per_s[p],
               b->wait[p]);
    }
    fflush(stdout);
}

/* ---- 2 threads over 1, in turn ------------------------------------------ */
/* A model's steps in slices: each slice runs steps for slice_s (at least
   one). */
typedef struct stepper {
    mp_model *m;
    const float *x;
    const int32_t *labels;
    int batch;
    double slice_s;
    long steps;     /* timed, over all slices */
    double seconds; /* their time */
} stepper;

static void run_slice(stepper *s) {
    double t0 = now_s();
    do {
        bench_step(s->m, s->x, INPUTS, s->labels, s->batch);
        s->steps++;
    } while (now_s() - t0 < s->slice_s);
    s->seconds += now_s() - t0;
}

/* A slice of each of two 1-thread models at once, one on each thread of a
   runner pool (as bench/gemm's pair_task). */
static void pair_slice(void *ctx, int thread, int threads) {
    (void)threads;
    run_slice((stepper *)ctx + thread);
}

static double images_per_s(const stepper *s) { return s->batch * (double)s->steps / s->seconds; }

/* Timed enough: S.min_s and 2 steps, as time_run's runs. */
static int timed_enough(const stepper *s) { return s->steps >= 2 && s->seconds >= S.min_s; }

/* The model on 1 thread (st[0]), on 2 (st[1]), and two 1-thread models at
   once (st[2] and st[3], pair_slice), all built first
   (build_model sets the global policy) and then run a slice each in turn,
   until each has had S.min_s and 2 steps: the ratios between them see the
   same host, where runs one after the other, a second or more apart, saw
   different ones (a guest here runs faster and slower for seconds at a
   time; bench/gemm's time_calls). rate: images/s of 1 thread, 2 threads,
   and the two models together. */
static void time_in_turn(int units, int batch, const char *policy, const float *x, const int32_t *labels,
                         double rate[3]) {
    stepper st[4];
    mp_pool *runner;
    int i;
    check(mp_pool_create(&runner, 2), NULL, "mp_pool_create");
    for (i = 0; i < 4; i++) {
        run r;
        memset(&r, 0, sizeof r);
        r.units = units, r.batch = batch, r.policy = policy, r.threads = i == 1 ? 2 : 1;
        memset(&st[i], 0, sizeof st[i]);
        st[i].m = build_model(&r), st[i].x = x, st[i].labels = labels, st[i].batch = batch;
        st[i].slice_s = S.min_s / 4;
        bench_step(st[i].m, x, INPUTS, labels, batch); /* allocates the activations */
    }
    while (!timed_enough(&st[0]) || !timed_enough(&st[1]) || !timed_enough(&st[2])) {
        run_slice(&st[0]);
        run_slice(&st[1]);
        mp__pool_run(runner, pair_slice, &st[2], 2);
    }
    rate[0] = images_per_s(&st[0]), rate[1] = images_per_s(&st[1]);
    rate[2] = images_per_s(&st[2]) + images_per_s(&st[3]);
    for (i = 0; i < 4; i++) mp_model_destroy(st[i].m);
    mp_pool_destroy(runner);
}

static void print_thread_ratios(int units, int batch, const char *policy, const double rate[3]) {
    const char *head = "bench=train model=mlp";
    printf("%s units=%d batch=%d policy=%s in_turn=1 images_per_s_1=%.0f images_per_s_2=%.0f "
           "images_per_s_independent=%.0f\n", head, units, batch, policy, rate[0], rate[1], rate[2]);
    printf("%s units=%d batch=%d ratio=threads_2_over_1 policy=%s value=%.3f\n", head, units, batch, policy,
           rate[1] / rate[0]);
    printf("%s units=%d batch=%d ratio=independent_2_over_1 policy=%s value=%.3f\n", head, units, batch, policy,
           rate[2] / rate[0]);
    printf("%s units=%d batch=%d ratio=split_over_independent policy=%s value=%.3f\n", head, units, batch, policy,
           rate[1] / rate[2]);
    fflush(stdout);
}

static void bench_shape(int units, int batch) {
    run runs[N_THREADS + 1][N_POLICIES]; /* [threads][policy]: the best of the rounds */
    peer_best peer[N_THREADS + 1];
    float *x;
    int32_t *labels;
    size_t p;
    int t, round, rounds = 2, in_turn_fits;
    if (bytes_needed(units, batch) > MEMORY_LIMIT) {
        printf("bench=train model=mlp units=%d batch=%d skipped=1 reason=memory est_gib=%.1f\n", units, batch,
               bytes_needed(units, batch) / (1024.0 * 1024.0 * 1024.0));
        return;
    }
    x = (float *)xmalloc((size_t)batch * INPUTS * sizeof *x);
    labels = (int32_t *)xmalloc((size_t)batch * sizeof *labels);
    bench_synthetic(x, INPUTS, labels, CLASSES, batch);
    memset(peer, 0, sizeof peer);
    for (round = 0; round < rounds; round++) /* 1 thread, then 2; mixprec, then PyTorch, at each */
        for (t = 1; t <= N_THREADS; t++) {
            if (only_threads && t != only_threads) continue;
            for (p = 0; p < N_POLICIES; p++) {
                run r;
                memset(&r, 0, sizeof r);
                r.units = units, r.batch = batch, r.threads = t;
                r.policy = policies[p];
                time_run(&r, x, labels);
                print_run(&r);
                if (round == 0 || r.step_s < runs[t][p].step_s) runs[t][p] = r;
                if (r.step_s > 0.5) rounds = 1;
            }
            if (peer_enabled) peer_train(&peer[t], units, batch, t);
        }
    for (t = 1; t <= N_THREADS; t++) {
        if (only_threads && t != only_threads) continue;
        print_ratios(runs[t]);
        print_peer(runs[t], &peer[t]);
    }
    in_turn_fits = 4 * bytes_needed(units, batch) <= MEMORY_LIMIT; /* time_in_turn's four models at once */
    for (p = 0; !only_threads && p < N_POLICIES; p++) {
        double rate[3];
        if (!in_turn_fits) {
            printf("bench=train model=mlp units=%d batch=%d policy=%s in_turn=1 skipped=1 reason=memory\n", units,
                   batch, policies[p]);
            continue;
        }
        time_in_turn(units, batch, policies[p], x, labels, rate);
        print_thread_ratios(units, batch, policies[p], rate);
    }
    free(x);
    free(labels);
}

/* ---- --update-pass ---------------------------------------------------- */
static void update_pass(void) {
    enum { PASSES = 5, ROUNDS = 5 };
    static const char *const names[PASSES] = {"update", "update_decay", "update_clipvalue", "update_clip_factor",
                                              "sum_squares"};
    const mp_backend *cpu = mp_cpu_backend();
    size_t n = (size_t)INPUTS * 4096 + (size_t)4096 * 4096 + 4096 * CLASSES, i;
    float *w = (float *)malloc(n * 4), *s1 = (float *)malloc(n * 4), scale = 1024.0f;
    mp_bf16 *g = (mp_bf16 *)malloc(n * 2), *wc = (mp_bf16 *)malloc(n * 2);
    double best[2][PASSES];
    float sum = 0.0f;
    int t, p, r;
    for (i = 0; i < n; i++) w[i] = (float)(i % 1000) * 1e-3f, s1[i] = 1e-6f, g[i] = mp_bf16_from_f32((float)(i % 77) - 38.0f);
    for (t = 0; t < 2; t++) {
        void *ctx = NULL;
        check(cpu->create(&ctx, t + 1, NULL), NULL, "cpu backend");
        for (p = 0; p < PASSES; p++) best[t][p] = 1e30;
        for (r = 0; r < ROUNDS; r++)
            for (p = 0; p < PASSES; p++) {
                mp_opt_step step;
                double t0;
                memset(&step, 0, sizeof step);
                step.cfg.kind = MP_RMSPROP, step.cfg.learning_rate = 1e-3f, step.cfg.rho = 0.9f;
                step.cfg.epsilon = 1e-7f, step.iteration = 1;
                if (p == 1) step.weight_decay = 0.004f;
                if (p == 2) step.cfg.clipvalue = 1.0f;
                if (p == 3) step.cfg.global_clipnorm = 1.0f, step.sum_squares = &sum;
                t0 = now_s();
                if (p == 4) cpu->sum_squares(ctx, &sum, g, MP_BFLOAT16, n, &scale);
                else cpu->optimizer_update(ctx, &step, w, g, MP_BFLOAT16, &scale, s1, NULL, n, wc, MP_BFLOAT16, NULL);
                t0 = now_s() - t0;
                best[t][p] = t0 < best[t][p] ? t0 : best[t][p];
            }
        cpu->destroy(ctx);
        for (p = 0; p < PASSES; p++) /* update: w, s1 read and written, g read, wc written; squares: g read */
            printf("bench=train_update threads=%d params=%zu pass=%s ms=%.2f gb_per_s=%.1f\n", t + 1, n, names[p],
                   best[t][p] * 1e3, (double)n * (p == 4 ? 2.0 : 20.0) / best[t][p] * 1e-9);
    }
    free(w), free(s1), free(g), free(wc);
}

int main(int argc, char **argv) {
    size_t u, b;
    int a, *only;
    for (a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--quick") == 0) {
            settings quick = {quick_units, quick_batches, COUNT(quick_units), COUNT(quick_batches), 0.2};
            S = quick;
        } else if (strcmp(argv[a], "--no-torch") == 0) {
            peer_enabled = 0;
        } else if (a + 1 < argc && (only = strcmp(argv[a], "--units") == 0     ? &only_units
                                          : strcmp(argv[a], "--batch") == 0   ? &only_batch
                                          : strcmp(argv[a], "--threads") == 0 ? &only_threads
                                                                              : NULL) != NULL) {
            *only = atoi(argv[++a]);
        } else if (strcmp(argv[a], "--update-pass") == 0) {
            update_pass();
            return 0;
        } else if (a + 1 < argc && strcmp(argv[a], "--options") == 0) {
            options_name = argv[++a];
            if (strcmp(options_name, "decay") == 0) options.weight_decay = 0.004f;
            else if (strcmp(options_name, "clipvalue") == 0) options.clipvalue = 1.0f;
            else if (strcmp(options_name, "clipnorm") == 0) options.clipnorm = 1.0f;
            else if (strcmp(options_name, "global_clipnorm") == 0) options.global_clipnorm = 1.0f;
            else if (strcmp(options_name, "none") != 0) a = argc; /* the usage line */
        } else {
            a = argc;
        }
        if (a >= argc) {
            fprintf(stderr, "usage: %s [--quick] [--no-torch] [--units U] [--batch B] [--threads T] "
                            "[--options none|decay|clipvalue|clipnorm|global_clipnorm] [--update-pass]\n", argv[0]);
            return 2;
        }
    }
    printf("bench=train cores=%d min_timing_s=%.2f options=%s\n", mp_available_cores(), S.min_s, options_name);
    print_machine("train");
    peer_probe();
    for (u = 0; u < S.n_units; u++)
        for (b = 0; b < S.n_batches; b++)
            if ((!only_units || S.units[u] == only_units) && (!only_batch || S.batches[b] == only_batch))
                bench_shape(S.units[u], S.batches[b]);
    print_machine("train"); /* the load at the end too */
    return 0;
}
