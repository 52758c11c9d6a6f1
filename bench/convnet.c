/* bench/convnet.c - training speed of convolutional networks beside
   PyTorch's: Keras's MNIST convnet (--model convnet, the default) or the
   small ResNet of examples/resnet_model.h (--model resnet, base width 16:
   Conv2D-BatchNormalization-relu, residual Adds, GlobalAveragePooling2D).
   With resnet, also each policy's activation memory (mp_model_memory_info
   after a step) and mixed_bfloat16's over float32's:
       bench=resnet impl=mixprec policy=P activation_bytes=
       bench=resnet ratio=activations_bf16_over_f32 value=
   The lines below name the model where they say convnet.

   Keras's example model (keras.io/examples/vision/mnist_convnet): 28x28x1
   images, Conv2D(32, 3x3, relu), MaxPooling2D(2), Conv2D(64, 3x3, relu),
   MaxPooling2D(2), Flatten, Dropout(0.5), Dense(10) and its softmax as a
   float32 Activation (where the mixed precision guide puts it), sparse
   categorical crossentropy and Adam, batch 128, trained by the custom
   loop's calls on synthetic data (random pixels and labels: only the speed
   matters), under float32 and mixed_bfloat16, on 1 and 2 threads
   (mp_model_desc.threads). PyTorch's side (bench/torch_cpu.py convnet,
   found as bench.h says: MIXPREC_TORCH_PYTHON) is the same model (NCHW,
   its default layout), Adam with Keras's defaults and the same data, in
   float32 and under torch.autocast("cpu", bfloat16), on as many threads
   (torch.set_num_threads), OpenMP's default wait policy.
   Each round runs 1 thread and then 2; at each, mixprec's two policies and
   then PyTorch's (one process), so that the two sides compared in a line
   ran seconds apart. Each side times a run as the best of 3 timings of at
   least a third of a second each (--min-seconds), after 2 warm-up steps.
   One key=value line per run and ratio:
       bench=convnet impl=mixprec|torch round=R policy=P threads=T ms_per_step= images_per_s=
       bench=convnet round=R policy=P threads=T ratio=mixprec_over_torch value=
       bench=convnet impl=I round=R policy=P ratio=threads_2_over_1 value=
   and after the rounds each side's best over them:
       bench=convnet impl=I policy=P threads=T best_of_rounds=N images_per_s=
       bench=convnet policy=P threads=T ratio=mixprec_over_torch_best value=
   Without torch: a bench=torch available=0 line, and mixprec's lines alone.

   Build and run: `make bench` (`make bench-quick`: 1 round, shorter timings), or
       gcc -std=c99 -O2 -march=native -pthread bench/convnet.c -o bench_convnet -lm
       MIXPREC_TORCH_PYTHON=/path/to/venv/bin/python ./bench_convnet [--model resnet] [--rounds R]
           [--min-seconds S] [--no-torch]
   --threads T keeps only that thread count. PyTorch's resnet is the same
   network (bench/torch_cpu.py convnet --model resnet: BatchNorm2d with
   Keras's epsilon 1e-3 and momentum 0.9, 0.1 in PyTorch's convention). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#define BENCH_NAME "convnet"
#include "bench.h"
#include "../examples/resnet_model.h"

#define SIDE 28
#define INPUTS (SIDE * SIDE)
#define CLASSES 10
#define BATCH 128
#define N_THREADS PEER_THREADS
#define MAX_ROUNDS 20

static const char *const policies[2] = {"float32", "mixed_bfloat16"};
static const char *const impls[2] = {"mixprec", "torch"};
static double min_s = 1.0;
static const char *model_name = "convnet"; /* or "resnet" */
static int only_threads; /* 0: both */

/* Keras's MNIST convnet's layers */
static void convnet_layers(mp_model *m) {
    mp_layer_desc softmax = mp_activation_layer(MP_SOFTMAX);
    check(mp_model_add(m, mp_conv2d(32, 3, 3, MP_VALID, MP_RELU)), m, "add");
    check(mp_model_add(m, mp_max_pooling2d(2, 2)), m, "add");
    check(mp_model_add(m, mp_conv2d(64, 3, 3, MP_VALID, MP_RELU)), m, "add");
    check(mp_model_add(m, mp_max_pooling2d(2, 2)), m, "add");
    check(mp_model_add(m, mp_flatten()), m, "add");
    check(mp_model_add(m, mp_dropout(0.5f)), m, "add");
    check(mp_model_add(m, mp_dense(CLASSES, MP_LINEAR)), m, "add");
    softmax.dtype = "float32";
    check(mp_model_add(m, softmax), m, "add");
}

static mp_model *build_model(const char *policy, int threads) {
    mp_model_desc md;
    mp_compile_desc cd;
    mp_model *m = NULL;
    memset(&md, 0, sizeof md);
    memset(&cd, 0, sizeof cd);
    md.input_shape[0] = SIDE, md.input_shape[1] = SIDE, md.input_shape[2] = 1;
    md.threads = threads;
    check(mp_set_global_policy_name(policy), NULL, policy);
    check(mp_model_create(&m, &md), NULL, "mp_model_create");
    if (strcmp(model_name, "resnet") == 0) check(resnet_layers(m, 16, 0.9f), m, "resnet_layers");
    else convnet_layers(m);
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    cd.optimizer.kind = MP_ADAM; /* Keras's defaults */
    check(mp_model_compile(m, &cd), m, "compile");
    return m;
}

/* One step of the model, as best_step_seconds times it. */
typedef struct timed {
    mp_model *m;
    const float *x;
    const int32_t *labels;
} timed;
static void timed_step(void *ctx) {
    timed *t = (timed *)ctx;
    bench_step(t->m, t->x, INPUTS, t->labels, BATCH);
}

static void peer_line(const char *line, void *ctx) {
    double *rate = (double *)ctx, v = peer_value(line, "images_per_s");
    int p;
    char key[64];
    snprintf(key, sizeof key, "bench=%s impl=torch", model_name);
    if (!strstr(line, key) || v <= 0) return;
    for (p = 0; p < 2; p++) {
        char key[64];
        snprintf(key, sizeof key, " policy=%s ", policies[p]);
        if (strstr(line, key)) rate[p] = v;
    }
}

static void round_at(int round, int threads, const float *x, const int32_t *labels, peer_rates r) {
    char args[128];
    int p;
    for (p = 0; p < 2; p++) {
        timed t;
        double s;
        t.m = build_model(policies[p], threads), t.x = x, t.labels = labels;
        s = best_step_seconds(timed_step, &t, min_s);
        if (round == 0 && threads == (only_threads ? only_threads : 1) && strcmp(model_name, "resnet") == 0)
            activation_lines(model_name, policies, t.m, p);
        mp_model_destroy(t.m);
        r[0][threads][p] = BATCH / s;
        printf("bench=%s impl=mixprec round=%d policy=%s threads=%d ms_per_step=%.2f images_per_s=%.0f\n", model_name, round,
               policies[p], threads, s * 1e3, BATCH / s);
        fflush(stdout);
    }
    if (!peer_enabled) return;
    snprintf(args, sizeof args, "convnet --model %s --batch %d --threads %d --min-seconds %.2f --round %d", model_name,
             BATCH, threads, min_s, round);
    peer_run(args, NULL, peer_line, r[1][threads]);
    for (p = 0; p < 2; p++)
        if (r[1][threads][p] > 0)
            printf("bench=%s round=%d policy=%s threads=%d ratio=mixprec_over_torch value=%.3f\n", model_name, round,
                   policies[p], threads, r[0][threads][p] / r[1][threads][p]);
    fflush(stdout);
}

int main(int argc, char **argv) {
    static peer_rates r[MAX_ROUNDS];
    float *x = (float *)xmalloc((size_t)BATCH * INPUTS * sizeof(float));
    int32_t *labels = (int32_t *)xmalloc(BATCH * sizeof(int32_t));
    int a, rounds = 3, round, t, p, i;
    for (a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--no-torch") == 0) peer_enabled = 0;
        else if (strcmp(argv[a], "--quick") == 0) rounds = 1, min_s = 0.3;
        else if (a + 1 < argc && strcmp(argv[a], "--rounds") == 0) rounds = atoi(argv[++a]);
        else if (a + 1 < argc && strcmp(argv[a], "--min-seconds") == 0) min_s = atof(argv[++a]);
        else if (a + 1 < argc && strcmp(argv[a], "--threads") == 0) only_threads = atoi(argv[++a]);
        else if (a + 1 < argc && strcmp(argv[a], "--model") == 0) model_name = argv[++a];
        else {
            fprintf(stderr, "usage: %s [--model convnet|resnet] [--quick] [--rounds R] [--min-seconds S] [--threads T] "
                            "[--no-torch]\n", argv[0]);
            return 2;
        }
    }
    if (rounds < 1 || rounds > MAX_ROUNDS || !(min_s > 0) || only_threads < 0 || only_threads > N_THREADS ||
        (strcmp(model_name, "convnet") != 0 && strcmp(model_name, "resnet") != 0)) {
        fprintf(stderr, "%s: --rounds 1 to %d, --min-seconds above 0, --threads 1 or 2, --model convnet or resnet\n",
                argv[0], MAX_ROUNDS);
        return 2;
    }
    printf("bench=%s cores=%d batch=%d rounds=%d min_timing_s=%.2f\n", model_name, mp_available_cores(), BATCH, rounds, min_s);
    print_machine(model_name);
    peer_probe();
    bench_synthetic(x, INPUTS, labels, CLASSES, BATCH);
    memset(r, 0, sizeof r);
    for (round = 0; round < rounds; round++) {
        for (t = 1; t <= N_THREADS; t++)
            if (!only_threads || t == only_threads) round_at(round, t, x, labels, r[round]);
        for (i = 0; i < (peer_enabled ? 2 : 1); i++)
            for (p = 0; p < 2; p++)
                if (r[round][i][1][p] > 0 && r[round][i][2][p] > 0)
                    printf("bench=%s impl=%s round=%d policy=%s ratio=threads_2_over_1 value=%.3f\n", model_name, impls[i],
                           round, policies[p], r[round][i][2][p] / r[round][i][1][p]);
    }
    peer_print_best(model_name, "images_per_s", policies, r, rounds); /* each side's best over the rounds */
    print_machine(model_name); /* the load at the end too */
    free(x);
    free(labels);
    return 0;
}
