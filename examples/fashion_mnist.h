/* fashion_mnist.h - what mnist_mlp.c and custom_loop.c share: error checks,
   flag parsing, and Fashion-MNIST with a synthetic stand-in, so that the
   examples run on a machine without the data set too.

   Include after mixprec.h (the example defines MIXPREC_IMPLEMENTATION). */
#ifndef FASHION_MNIST_H
#define FASHION_MNIST_H

#include "../mixprec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Errors: every mp_ call is checked; on failure say which call, the status
   and, when there is a model, its detailed message, then stop. */

static void check_status(mp_status st, const mp_model *m, const char *call, int line) {
    if (st == MP_OK) return;
    fprintf(stderr, "error at line %d: %s\n  %s: %s\n", line, call, mp_status_name(st),
            mp_status_message(st));
    if (m) fprintf(stderr, "  model: %s\n", mp_model_error(m));
    exit(1);
}
#define CHECK(call, model) check_status((call), (model), #call, __LINE__)

/* ------------------------------------------------------------------------ */
/* Flags: `--name value` pairs. */

/* The integer value of flag argv[i] (i + 1 must exist), at least min. */
static long flag_long(int argc, char **argv, int i, long min) {
    char *end;
    long v;
    if (i + 1 >= argc) {
        fprintf(stderr, "%s needs a value\n", argv[i]);
        exit(2);
    }
    v = strtol(argv[i + 1], &end, 10);
    if (*argv[i + 1] == '\0' || *end != '\0' || v < min) {
        fprintf(stderr, "%s: '%s' is not an integer >= %ld\n", argv[i], argv[i + 1], min);
        exit(2);
    }
    return v;
}

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
    mp_data train, test;      /* what the examples read: x, labels, n */
    mp_dataset idx_train;     /* the IDX files, owned by mixprec ... */
    mp_dataset idx_test;
    float *synth_x;           /* ... or the synthetic set, owned here */
    int32_t *synth_labels;
    int synthetic;
} fm_data;

/* splitmix64: a tiny deterministic generator, the same on every platform. */
static uint64_t fm_next(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float fm_uniform(uint64_t *state) { /* [0, 1) */
    return (float)(fm_next(state) >> 40) * (1.0f / 16777216.0f);
}

/* Ten random 784-pixel "garments", and samples that are half their class's
   prototype and half noise: learnable to high accuracy, but not by copying. */
static void fm_synthesize(fm_data *d, uint64_t seed) {
    static float proto[FM_CLASSES][FM_PIXELS];
    size_t n = FM_SYNTH_TRAIN + FM_SYNTH_TEST, i;
    uint64_t rng = seed;
    int c, p;
    for (c = 0; c < FM_CLASSES; c++)
        for (p = 0; p < FM_PIXELS; p++) proto[c][p] = fm_uniform(&rng);
    d->synth_x = malloc(n * FM_PIXELS * sizeof *d->synth_x);
    d->synth_labels = malloc(n * sizeof *d->synth_labels);
    if (!d->synth_x || !d->synth_labels) {
        fprintf(stderr, "out of memory for the synthetic data set\n");
        exit(1);
    }
    for (i = 0; i < n; i++) {
        c = (int)(fm_next(&rng) % FM_CLASSES);
        d->synth_labels[i] = c;
        for (p = 0; p < FM_PIXELS; p++)
            d->synth_x[i * FM_PIXELS + p] = 0.5f * proto[c][p] + 0.5f * fm_uniform(&rng);
    }
    d->train.x = d->synth_x;
    d->train.labels = d->synth_labels;
    d->train.n = FM_SYNTH_TRAIN;
    d->test.x = d->synth_x + (size_t)FM_SYNTH_TRAIN * FM_PIXELS;
    d->test.labels = d->synth_labels + FM_SYNTH_TRAIN;
    d->test.n = FM_SYNTH_TEST;
    d->synthetic = 1;
}

/* Loads one split of dir (prefix "train" or "t10k"). Returns MP_ERR_IO when
   the files are not there; any other failure is a real error. */
static mp_status fm_load_split(const char *dir, const char *prefix, mp_dataset *out) {
    char images[1024], labels[1024];
    snprintf(images, sizeof images, "%s/%s-images-idx3-ubyte", dir, prefix);
    snprintf(labels, sizeof labels, "%s/%s-labels-idx1-ubyte", dir, prefix);
    return mp_load_idx(images, labels, out);
}

static mp_data fm_view(const mp_dataset *s) {
    mp_data v;
    memset(&v, 0, sizeof v);
    v.x = s->x;
    v.labels = s->labels;
    v.n = s->n;
    return v;
}

/* Fashion-MNIST from dir, or the synthetic set when the files are missing.
   train_limit > 0 keeps only the first train_limit training images. */
static void fm_load(fm_data *d, const char *dir, size_t train_limit, uint64_t seed) {
    mp_status st;
    memset(d, 0, sizeof *d);
    st = fm_load_split(dir, "train", &d->idx_train);
    if (st == MP_OK) st = fm_load_split(dir, "t10k", &d->idx_test);
    if (st == MP_OK) {
        if (d->idx_train.rows * d->idx_train.cols != FM_PIXELS ||
            d->idx_test.rows * d->idx_test.cols != FM_PIXELS) {
            fprintf(stderr, "%s: the images are not 28x28\n", dir);
            exit(1);
        }
        d->train = fm_view(&d->idx_train);
        d->test = fm_view(&d->idx_test);
        printf("Fashion-MNIST from %s: %zu training, %zu test images\n", dir, d->train.n,
               d->test.n);
    } else if (st == MP_ERR_IO) {
        mp_dataset_free(&d->idx_train); /* the train split may have loaded */
        printf("Fashion-MNIST is not in %s. To use it:\n"
               "    apt-get install dataset-fashion-mnist\n"
               "    make data\n"
               "Using a synthetic 10-class data set instead.\n", dir);
        fm_synthesize(d, seed);
    } else {
        fprintf(stderr, "%s: %s\n", dir, mp_status_message(st));
        exit(1);
    }
    if (train_limit > 0 && train_limit < d->train.n) d->train.n = train_limit;
}

static void fm_free(fm_data *d) {
    mp_dataset_free(&d->idx_train);
    mp_dataset_free(&d->idx_test);
    free(d->synth_x);
    free(d->synth_labels);
    memset(d, 0, sizeof *d);
}

#endif /* FASHION_MNIST_H */
