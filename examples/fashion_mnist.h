/* fashion_mnist.h - what mnist_mlp.c and custom_loop.c share: Fashion-MNIST
   with a synthetic stand-in, so that the examples run on a machine without
   the data set too, and the guide's model.

   Include after mixprec.h (the example defines MIXPREC_IMPLEMENTATION). */
#ifndef FASHION_MNIST_H
#define FASHION_MNIST_H

#include "example.h"

/* ------------------------------------------------------------------------ */
/* Data. The IDX loader gives [n, 28, 28] pixels in [0, 1], which is already
   the flat [n, 784] row a Dense model reads. */

#define FM_PIXELS 784
#define FM_CLASSES 10
/* The synthetic stand-in's size: large enough to learn from, small enough
   to generate in a blink. */
#define FM_SYNTH_TRAIN 12000
#define FM_SYNTH_TEST 2000

typedef struct fm_data {
    mp_data train, test;      /* what the examples read: x[0] and y, n samples each */
    mp_dataset idx_train;     /* the IDX files, owned by mixprec ... */
    mp_dataset idx_test;
    float *synth_x;           /* ... or the synthetic set, owned here */
    int32_t *synth_labels;
    int synthetic;
} fm_data;

/* Ten random 784-pixel "garments", and samples that are half their class's
   prototype and half noise: learnable to high accuracy, but not by copying. */
static void fm_synthesize(fm_data *d, uint64_t seed) {
    static float proto[FM_CLASSES][FM_PIXELS];
    size_t n = FM_SYNTH_TRAIN + FM_SYNTH_TEST, i;
    uint64_t rng = seed;
    int c, p;
    for (c = 0; c < FM_CLASSES; c++)
        for (p = 0; p < FM_PIXELS; p++) proto[c][p] = ex_uniform(&rng);
    d->synth_x = malloc(n * FM_PIXELS * sizeof *d->synth_x);
    d->synth_labels = malloc(n * sizeof *d->synth_labels);
    if (!d->synth_x || !d->synth_labels) {
        fprintf(stderr, "out of memory for the synthetic data set\n");
        exit(1);
    }
    for (i = 0; i < n; i++) {
        c = (int)(ex_next(&rng) % FM_CLASSES);
        d->synth_labels[i] = c;
        for (p = 0; p < FM_PIXELS; p++)
            d->synth_x[i * FM_PIXELS + p] = 0.5f * proto[c][p] + 0.5f * ex_uniform(&rng);
    }
    d->train.x[0] = mp_rows(d->synth_x, FM_SYNTH_TRAIN, FM_PIXELS);
    d->train.y = mp_labels(d->synth_labels, FM_SYNTH_TRAIN);
    d->test.x[0] = mp_rows(d->synth_x + (size_t)FM_SYNTH_TRAIN * FM_PIXELS, FM_SYNTH_TEST, FM_PIXELS);
    d->test.y = mp_labels(d->synth_labels + FM_SYNTH_TRAIN, FM_SYNTH_TEST);
    d->synthetic = 1;
}

/* Where Debian's dataset-fashion-mnist package puts the files, gzipped as
   they ship: the examples' default --data. */
#define FM_PACKAGE_DIR "/usr/share/datasets/fashion-mnist"

/* dir/name, or dir/name.gz where that is what there is (the package's way);
   mp_load_idx reads either. */
static void fm_path(char *out, size_t cap, const char *dir, const char *name) {
    FILE *f;
    snprintf(out, cap, "%s/%s", dir, name);
    if ((f = fopen(out, "rb")) != NULL) {
        fclose(f);
        return;
    }
    snprintf(out, cap, "%s/%s.gz", dir, name);
}

/* Loads one split of dir (prefix "train" or "t10k"); on failure why says
   which file and what is wrong (MP_ERR_IO: it cannot be read). */
static mp_status fm_load_split(const char *dir, const char *prefix, mp_dataset *out, char *why, size_t cap) {
    char images[1024], labels[1024], name[64];
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", prefix);
    fm_path(images, sizeof images, dir, name);
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", prefix);
    fm_path(labels, sizeof labels, dir, name);
    return mp_load_idx_why(images, labels, out, why, cap);
}

/* Fashion-MNIST from dir, or the synthetic set (saying why) when the files
   cannot be read; files that are there but corrupt end the program.
   train_limit > 0 keeps only the first train_limit training images. */
static void fm_load(fm_data *d, const char *dir, size_t train_limit, uint64_t seed) {
    char why[1200];
    mp_status st;
    memset(d, 0, sizeof *d);
    st = fm_load_split(dir, "train", &d->idx_train, why, sizeof why);
    if (st == MP_OK) st = fm_load_split(dir, "t10k", &d->idx_test, why, sizeof why);
    if (st == MP_OK) {
        if (d->idx_train.rows * d->idx_train.cols != FM_PIXELS ||
            d->idx_test.rows * d->idx_test.cols != FM_PIXELS) {
            fprintf(stderr, "%s: the images are not 28x28\n", dir);
            exit(1);
        }
        d->train = mp_dataset_data(&d->idx_train); /* (n, 28, 28): the model's 784 values a sample */
        d->test = mp_dataset_data(&d->idx_test);
        printf("Fashion-MNIST from %s: %zu training, %zu test images\n", dir, d->train.x[0].n,
               d->test.x[0].n);
    } else if (st == MP_ERR_IO) {
        mp_dataset_free(&d->idx_train); /* the train split may have loaded */
        printf("Fashion-MNIST cannot be read: %s.\n"
               "To use it: apt-get install dataset-fashion-mnist (the examples read\n"
               "%s as it is; --data DIR: a folder of the same files, gzipped or not).\n"
               "Using a synthetic 10-class data set instead.\n", why, FM_PACKAGE_DIR);
        fm_synthesize(d, seed);
    } else {
        fprintf(stderr, "%s\n", why);
        exit(1);
    }
    if (train_limit > 0 && train_limit < d->train.x[0].n) d->train.x[0].n = d->train.y.n = train_limit;
}

/* The guide's layers: Dense(units, relu) x2, Dense(10), and a softmax kept
   in float32 because its output feeds the loss, which must stay float32. */
static void fm_add_guide_layers(mp_model *m, int units) {
    mp_layer_desc softmax = mp_activation_layer(MP_SOFTMAX);
    softmax.dtype = "float32";
    CHECK(mp_model_add(m, mp_dense(units, MP_RELU)), m);
    CHECK(mp_model_add(m, mp_dense(units, MP_RELU)), m);
    CHECK(mp_model_add(m, mp_dense(FM_CLASSES, MP_LINEAR)), m);
    CHECK(mp_model_add(m, softmax), m);
}

/* The guide's model under `policy` (which stays the global policy), not
   compiled. */
static inline mp_model *fm_guide_model(const char *policy, int units) {
    mp_model_desc md;
    mp_model *m = NULL;
    CHECK(mp_set_global_policy_name(policy), NULL);
    memset(&md, 0, sizeof md);
    md.input_shape[0] = FM_PIXELS;
    md.backend = ex_backend; /* --backend (example.h) */
    CHECK(mp_model_create(&m, &md), NULL);
    fm_add_guide_layers(m, units);
    return m;
}

/* ------------------------------------------------------------------------ */
/* Runs compared policy by policy (mnist_mlp, resnet): each starts from the
   same initial weights and ends in one `result` line and a table row. */

typedef struct fm_result {
    const char *policy;
    float test_accuracy, ms_per_step, loss_scale;
    size_t peak_bytes;
    uint64_t skipped_steps;
} fm_result;

/* The guide's reset: every policy starts from the first model's initial
   weights, so that the runs differ only in precision. The first call saves
   them (*initial is NULL), later calls restore them. */
static inline void fm_share_initial_weights(mp_model *m, float **initial, size_t *n) {
    if (!*initial) {
        *n = mp_model_param_count(m);
        *initial = malloc(*n * sizeof **initial);
        if (!*initial) {
            fprintf(stderr, "out of memory for %zu initial weights\n", *n);
            exit(1);
        }
        CHECK(mp_model_get_weights(m, *initial, *n), m);
    } else {
        CHECK(mp_model_set_weights(m, *initial, *n), m);
    }
}

/* A trained model's result, printed as its `result` line: the test
   metrics, the speed and skipped steps of `last` (an epoch's logs), the
   peak memory above `baseline` (what was in use before the model). */
static inline fm_result fm_result_of(const mp_model *m, const char *policy, const mp_logs *test, const mp_logs *last,
                              size_t baseline) {
    fm_result r;
    r.policy = policy;
    r.test_accuracy = test->accuracy;
    r.ms_per_step = last->ms_per_step;
    r.peak_bytes = ex_peak_bytes(m, mp_get_memory_info().peak - baseline);
    r.loss_scale = mp_current_loss_scale(m);
    r.skipped_steps = last->skipped_steps;
    printf("result policy=%s test_accuracy=%.4f ms_per_step=%.1f peak_bytes=%zu loss_scale=%g "
           "skipped_steps=%llu\n",
           r.policy, (double)r.test_accuracy, (double)r.ms_per_step, r.peak_bytes, (double)r.loss_scale,
           (unsigned long long)r.skipped_steps);
    return r;
}

static inline void fm_print_table(const fm_result *r, int n) {
    int i;
    printf("\n%-16s %13s %10s %10s %11s %8s\n", "policy", "test accuracy", "ms/step", "peak MiB",
           "loss scale", "skipped");
    for (i = 0; i < n; i++)
        printf("%-16s %13.4f %10.1f %10.1f %11g %8llu\n", r[i].policy, (double)r[i].test_accuracy,
               (double)r[i].ms_per_step, (double)r[i].peak_bytes / (1024.0 * 1024.0),
               (double)r[i].loss_scale, (unsigned long long)r[i].skipped_steps);
}

static void fm_free(fm_data *d) {
    mp_dataset_free(&d->idx_train);
    mp_dataset_free(&d->idx_test);
    free(d->synth_x);
    free(d->synth_labels);
    memset(d, 0, sizeof *d);
}

#endif /* FASHION_MNIST_H */
