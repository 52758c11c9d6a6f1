/* resnet.c - a small ResNet (He et al., "Deep Residual Learning for Image
   Recognition", 2015: the CIFAR-10 network's shape) built with the
   functional API and trained on Fashion-MNIST under float32,
   mixed_float16 and mixed_bfloat16 from the same initial weights. The
   network is in resnet_model.h.

       make && ./build/resnet

   Flags: --policy float32|mixed_float16|mixed_bfloat16|all (all)
          --width N (16)  --epochs N (1)  --batch-size N (32)
          --learning-rate R (Adam's first; 0.002, twice Keras's default, for
          a one-epoch run; CosineDecay takes it to 0 over the run's steps)
          --bn-momentum M (BatchNormalization's; 0.99,
          Keras's; `make demo`'s short run takes 0.9, PyTorch's default)
          --data DIR (/usr/share/datasets/fashion-mnist)  --seed N (1337)
          --train-limit N (0 = every training image)  --backend cpu|cuda
          --save-weights PATH, --load-weights PATH (.safetensors; --epochs 0
          evaluates the loaded weights), --weights-layout keras|pytorch,
          --weights-dtype float32|float16|bfloat16 (examples/example.h) */
#define _POSIX_C_SOURCE 199309L /* clock_gettime, for the library's timings */
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#include "fashion_mnist.h"
#include "resnet_model.h"

typedef struct config {
    ex_policies policies;
    int width, epochs, batch_size;
    float learning_rate, momentum;
    const char *data_dir;
    uint64_t seed;
    size_t train_limit;
} config;

static void usage(const char *prog) {
    fprintf(stderr,
            "usage: %s [--policy float32|mixed_float16|mixed_bfloat16|all] [--width N] [--epochs N]\n"
            "       [--batch-size N] [--learning-rate R] [--bn-momentum M] [--data DIR] [--seed N]\n"
            "       [--train-limit N] [--backend cpu|cuda] [--save-weights PATH] [--load-weights PATH]\n"
            "       [--weights-layout keras|pytorch] [--weights-dtype float32|float16|bfloat16]\n",
            prog);
    exit(2);
}

static config parse_args(int argc, char **argv) {
    config c;
    int i;
    memset(&c, 0, sizeof c);
    ex_all_policies(&c.policies);
    c.width = 16;
    c.epochs = 1;
    c.batch_size = 32; /* Keras's default */
    c.learning_rate = 2e-3f;
    c.momentum = 0.99f; /* Keras's */
    c.data_dir = FM_PACKAGE_DIR;
    c.seed = 1337;
    for (i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) usage(argv[0]);
        if (flag_policy(argc, argv, i, &c.policies) || flag_backend(argc, argv, i) || flag_weights(argc, argv, i)) {
        } else if (strcmp(argv[i], "--width") == 0) c.width = (int)flag_long(argc, argv, i, 1);
        else if (strcmp(argv[i], "--epochs") == 0) c.epochs = (int)flag_long(argc, argv, i, 0);
        else if (strcmp(argv[i], "--batch-size") == 0) c.batch_size = (int)flag_long(argc, argv, i, 1);
        else if (strcmp(argv[i], "--learning-rate") == 0) c.learning_rate = (float)atof(argv[i + 1]);
        else if (strcmp(argv[i], "--bn-momentum") == 0) c.momentum = (float)atof(argv[i + 1]);
        else if (strcmp(argv[i], "--data") == 0) c.data_dir = argv[i + 1];
        else if (strcmp(argv[i], "--seed") == 0) c.seed = (uint64_t)flag_long(argc, argv, i, 0);
        else if (strcmp(argv[i], "--train-limit") == 0) c.train_limit = (size_t)flag_long(argc, argv, i, 0);
        else usage(argv[0]);
    }
    ex_check_weights_flags("--epochs", c.epochs, c.policies.count);
    return c;
}

static mp_model *build_resnet(const config *c) {
    mp_model_desc md;
    mp_model *m = NULL;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 28, md.input_shape[1] = 28, md.input_shape[2] = 1;
    md.backend = ex_backend;
    md.seed = c->seed;
    md.name = "resnet";
    CHECK(mp_model_create(&m, &md), NULL);
    CHECK(resnet_layers(m, c->width, c->momentum), m);
    CHECK(mp_model_build(m), m);
    return m;
}

/* Adam (Keras's defaults but the learning rate) under Keras's
   CosineDecay from learning_rate to 0 over the run's `steps` (0: no
   training, the rate unused), sparse categorical crossentropy, accuracy;
   compile wraps the optimizer in a LossScaleOptimizer under
   mixed_float16, as Keras does. The decay lets the weights settle at the
   end of a short run, where BatchNormalization's moving statistics (at
   momentum 0.99, about the last hundred batches), which evaluation reads,
   can follow them: at a constant rate one epoch's test accuracy moved by
   a point from one seed to another. */
static void compile_model(mp_model *m, float learning_rate, uint64_t steps) {
    mp_compile_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    cd.optimizer.kind = MP_ADAM;
    cd.optimizer.learning_rate = learning_rate;
    if (steps) {
        cd.optimizer.schedule.kind = MP_COSINE_DECAY;
        cd.optimizer.schedule.initial_learning_rate = learning_rate;
        cd.optimizer.schedule.decay_steps = steps;
    }
    cd.metrics = MP_METRIC_ACCURACY;
    CHECK(mp_model_compile(m, &cd), m);
}

/* The optimizer steps of the run: fit's batches an epoch (the last may be
   short), times the epochs. */
static uint64_t run_steps(const config *c, const fm_data *d) {
    size_t batch = (size_t)c->batch_size;
    return (uint64_t)((d->train.x[0].n + batch - 1) / batch) * (uint64_t)c->epochs;
}

static fm_result run_policy(const config *c, const fm_data *d, const char *policy, float **initial, size_t *n) {
    mp_logs *history = calloc(c->epochs ? (size_t)c->epochs : 1, sizeof *history); /* zeros without training */
    mp_logs test;
    mp_fit_desc fd;
    mp_model *m;
    size_t baseline;
    fm_result r;
    if (!history) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    printf("\n=== policy %s ===\n", policy);
    CHECK(mp_set_global_policy_name(policy), NULL);
    mp_reset_peak_memory();
    baseline = mp_get_memory_info().current;
    m = build_resnet(c);
    if (!*initial) mp_model_print_summary(m); /* once */
    fm_share_initial_weights(m, initial, n);
    ex_load_weights(m);
    compile_model(m, c->learning_rate, run_steps(c, d));
    memset(&fd, 0, sizeof fd);
    fd.data = d->train;
    fd.batch_size = c->batch_size;
    fd.epochs = c->epochs;
    fd.history = history;
    if (c->epochs) CHECK(mp_model_fit(m, &fd), m);
    CHECK(mp_model_evaluate(m, &d->test, c->batch_size, &test), m);
    ex_save_weights(m);
    r = fm_result_of(m, policy, &test, &history[c->epochs ? c->epochs - 1 : 0], baseline);
    mp_model_destroy(m);
    free(history);
    return r;
}

/* The images as the network reads them: (28, 28, 1), channels last. */
static void as_images(mp_data *d) {
    d->x[0].rank = 3;
    d->x[0].shape[0] = 28, d->x[0].shape[1] = 28, d->x[0].shape[2] = 1;
}

int main(int argc, char **argv) {
    config c = parse_args(argc, argv);
    fm_result results[EX_POLICIES];
    char accuracies[256];
    float *initial = NULL;
    size_t n_initial = 0, len = 0;
    fm_data d;
    int i;
    fm_load(&d, c.data_dir, c.train_limit, c.seed);
    as_images(&d.train);
    as_images(&d.test);
    printf("training on %zu images, testing on %zu; width %d, batch %d, %d epoch(s)\n", d.train.x[0].n,
           d.test.x[0].n, c.width, c.batch_size, c.epochs);
    for (i = 0; i < c.policies.count; i++) results[i] = run_policy(&c, &d, c.policies.name[i], &initial, &n_initial);
    fm_print_table(results, c.policies.count);
    accuracies[0] = '\0';
    for (i = 0; i < c.policies.count && len < sizeof accuracies; i++)
        len += (size_t)snprintf(accuracies + len, sizeof accuracies - len, "%s%s %.4f", i ? ", " : "",
                                results[i].policy, (double)results[i].test_accuracy);
    ex_summary("resnet", "a ResNet with BatchNormalization and residual Adds, test accuracy on %s: %s",
               d.synthetic ? "the synthetic stand-in" : "Fashion-MNIST", accuracies);
    free(initial);
    fm_free(&d);
    return 0;
}
