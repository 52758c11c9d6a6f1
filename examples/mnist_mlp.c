/* mnist_mlp.c - the TensorFlow mixed precision guide's example, in C: the
   same MLP trained under float32, mixed_float16 and mixed_bfloat16 from the
   same initial weights, then compared (test accuracy, speed, memory, loss
   scale). The guide uses MNIST; Fashion-MNIST has the same format and is
   packaged by Debian. With --amp it is also trained as TensorFlow's
   automatic mixed precision would: float32 layers, the graph rewrite at
   compile (the run named amp_float16 or amp_bfloat16).

       make && ./build/mnist_mlp --units 256 --epochs 2 --batch-size 128

   Flags: --policy float32|mixed_float16|mixed_bfloat16|all (all)
          --units N (4096)  --epochs N (5)  --batch-size N (8192)
          --data DIR (/usr/share/datasets/fashion-mnist)  --seed N (1337)
          --train-limit N (0 = every training image)
          --csv PREFIX: a per-step CSV log per policy, PREFIX_POLICY.csv,
          for examples/plot_log.gp (loss and loss scale over steps)
          --amp float16|bfloat16: one more run, float32 with automatic mixed
          precision to that dtype (--policy none: that run alone)
          --save-weights PATH, --load-weights PATH (.safetensors; --epochs 0
          evaluates the loaded weights), --weights-layout keras|pytorch,
          --weights-dtype float32|float16|bfloat16 (examples/example.h) */
#define _POSIX_C_SOURCE 199309L /* clock_gettime, for the library's timings */
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#include "fashion_mnist.h"

#define MAX_POLICIES 3

typedef struct config {
    const char *policies[MAX_POLICIES + 1]; /* and the AMP run */
    int n_policies;
    int units, epochs, batch_size;
    const char *data_dir;
    uint64_t seed;
    size_t train_limit;
    const char *csv_prefix;
    const char *amp; /* "float16", "bfloat16" or NULL */
} config;

static void usage(const char *prog) {
    fprintf(stderr,
            "usage: %s [--policy float32|mixed_float16|mixed_bfloat16|all|none] [--units N]\n"
            "       [--epochs N] [--batch-size N] [--data DIR] [--seed N] [--train-limit N]\n"
            "       [--csv PREFIX] [--amp float16|bfloat16] [--backend cpu|cuda]\n"
            "       [--save-weights PATH] [--load-weights PATH] [--weights-layout keras|pytorch]\n"
            "       [--weights-dtype float32|float16|bfloat16]\n",
            prog);
    exit(2);
}

static void set_policies(config *c, const char *name) {
    static const char *const all[MAX_POLICIES] = {"float32", "mixed_float16", "mixed_bfloat16"};
    mp_policy p;
    int i;
    if (strcmp(name, "all") == 0) {
        for (i = 0; i < MAX_POLICIES; i++) c->policies[i] = all[i];
        c->n_policies = MAX_POLICIES;
        return;
    }
    if (strcmp(name, "none") == 0) { /* with --amp: the AMP run alone */
        c->n_policies = 0;
        return;
    }
    if (mp_policy_from_name(name, &p) != MP_OK) { /* any Keras policy name works */
        fprintf(stderr, "--policy %s: %s\n", name, mp_status_message(MP_ERR_UNKNOWN_POLICY));
        exit(2);
    }
    c->policies[0] = name;
    c->n_policies = 1;
}

static config parse_args(int argc, char **argv) {
    config c;
    int i;
    memset(&c, 0, sizeof c);
    set_policies(&c, "all");
    c.units = 4096; /* the guide's sizes */
    c.epochs = 5;
    c.batch_size = 8192;
    c.data_dir = FM_PACKAGE_DIR;
    c.seed = 1337;
    for (i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) usage(argv[0]);
        if (strcmp(argv[i], "--policy") == 0) set_policies(&c, argv[i + 1]);
        else if (strcmp(argv[i], "--units") == 0) c.units = (int)flag_long(argc, argv, i, 1);
        else if (flag_backend(argc, argv, i) || flag_weights(argc, argv, i)) {}
        else if (strcmp(argv[i], "--epochs") == 0) c.epochs = (int)flag_long(argc, argv, i, 0);
        else if (strcmp(argv[i], "--batch-size") == 0) c.batch_size = (int)flag_long(argc, argv, i, 1);
        else if (strcmp(argv[i], "--data") == 0) c.data_dir = argv[i + 1];
        else if (strcmp(argv[i], "--seed") == 0) c.seed = (uint64_t)flag_long(argc, argv, i, 0);
        else if (strcmp(argv[i], "--train-limit") == 0) c.train_limit = (size_t)flag_long(argc, argv, i, 0);
        else if (strcmp(argv[i], "--csv") == 0) c.csv_prefix = argv[i + 1];
        else if (strcmp(argv[i], "--amp") == 0) c.amp = argv[i + 1];
        else usage(argv[0]);
    }
    if (c.amp) { /* the run's name: amp_float16 or amp_bfloat16 */
        if (strcmp(c.amp, "float16") != 0 && strcmp(c.amp, "bfloat16") != 0) usage(argv[0]);
        c.policies[c.n_policies++] = strcmp(c.amp, "float16") == 0 ? "amp_float16" : "amp_bfloat16";
    }
    if (c.n_policies == 0) usage(argv[0]);
    ex_check_weights_flags("--epochs", c.epochs, c.n_policies);
    return c;
}

/* The guide's model under the current global policy. */
static mp_model *build_model(const config *c) {
    mp_model_desc md;
    mp_model *m = NULL;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = FM_PIXELS;
    md.backend = ex_backend;
    md.seed = c->seed;
    CHECK(mp_model_create(&m, &md), NULL);
    fm_add_guide_layers(m, c->units);
    CHECK(mp_model_build(m), m);
    return m;
}

/* Sparse categorical crossentropy, RMSprop with Keras's defaults (all zero
   fields), accuracy. Under mixed_float16 (and automatic mixed precision to
   float16) compile wraps the optimizer in a LossScaleOptimizer, as Keras
   does; amp names the dtype of automatic mixed precision, or is NULL. */
static void compile_model(mp_model *m, const char *amp) {
    mp_compile_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    cd.optimizer.kind = MP_RMSPROP;
    cd.metrics = MP_METRIC_ACCURACY;
    cd.loss_scale = MP_LOSS_SCALE_AUTO;
    if (amp) {
        cd.amp.enabled = 1; /* prints TensorFlow's "Converted X/Y nodes ..." line */
        CHECK(mp_dtype_from_name(amp, &cd.amp.dtype), m);
    }
    CHECK(mp_model_compile(m, &cd), m);
}

static fm_result run_policy(const config *c, const fm_data *d, const char *policy,
                         float **initial, size_t *n_initial) {
    mp_logs *history = calloc(c->epochs ? (size_t)c->epochs : 1, sizeof *history); /* zeros without training */
    mp_logs test;
    mp_fit_desc fd;
    char csv_path[1024];
    mp_model *m;
    size_t baseline;
    fm_result r;

    if (!history) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    printf("\n=== policy %s ===\n", policy);
    /* an AMP run's layers are float32: the rewrite decides their dtypes */
    CHECK(mp_set_global_policy_name(strncmp(policy, "amp_", 4) == 0 ? "float32" : policy), NULL);
    /* mixprec counts every byte it allocates, the loaded data set included;
       what the model adds (weights, activations, gradients, slots) is the
       peak above what is in use before it is built. */
    mp_reset_peak_memory();
    baseline = mp_get_memory_info().current;
    m = build_model(c);
    fm_share_initial_weights(m, initial, n_initial);
    ex_load_weights(m);
    compile_model(m, strncmp(policy, "amp_", 4) == 0 ? policy + 4 : NULL);
    mp_model_print_summary(m);

    memset(&fd, 0, sizeof fd);
    fd.data = d->train;
    fd.batch_size = c->batch_size;
    fd.epochs = c->epochs;
    fd.validation_split = 0.2f; /* the guide's: the last 20% validate */
    fd.history = history;
    if (c->csv_prefix) {
        snprintf(csv_path, sizeof csv_path, "%s_%s.csv", c->csv_prefix, policy);
        fd.csv_path = csv_path;
        fd.csv_per_step = 1;
    }
    if (c->epochs) CHECK(mp_model_fit(m, &fd), m);
    CHECK(mp_model_evaluate(m, &d->test, c->batch_size, &test), m);
    ex_save_weights(m);

    r = fm_result_of(m, policy, &test, &history[c->epochs ? c->epochs - 1 : 0], baseline); /* the first epoch warms up */
    mp_model_destroy(m);
    free(history);
    return r;
}

/* The demo's summary line: each policy's test accuracy. */
static void summarize(const fm_result *r, int n, int synthetic) {
    char accuracies[256];
    size_t len = 0;
    int i;
    accuracies[0] = '\0';
    for (i = 0; i < n && len < sizeof accuracies; i++)
        len += (size_t)snprintf(accuracies + len, sizeof accuracies - len, "%s%s %.4f", i ? ", " : "",
                                r[i].policy, (double)r[i].test_accuracy);
    ex_summary("mnist_mlp", "the guide's model from the same initial weights, test accuracy on %s: %s",
               synthetic ? "the synthetic stand-in (apt-get install dataset-fashion-mnist for the real one)"
                         : "Fashion-MNIST",
               accuracies);
}

int main(int argc, char **argv) {
    config c = parse_args(argc, argv);
    fm_result results[MAX_POLICIES + 1];
    float *initial = NULL;
    size_t n_initial = 0;
    fm_data d;
    int i;

    fm_load(&d, c.data_dir, c.train_limit, c.seed);
    printf("training on %zu images (the last 20%% validate), testing on %zu; units %d, batch %d, "
           "%d epochs\n",
           d.train.x[0].n, d.test.x[0].n, c.units, c.batch_size, c.epochs);
    for (i = 0; i < c.n_policies; i++)
        results[i] = run_policy(&c, &d, c.policies[i], &initial, &n_initial);
    fm_print_table(results, c.n_policies);
    summarize(results, c.n_policies, d.synthetic);
    free(initial);
    fm_free(&d);
    return 0;
}
