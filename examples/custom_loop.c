/* custom_loop.c - the TensorFlow mixed precision guide's custom training
   loop with a LossScaleOptimizer, in C. Each line of the guide's train_step
   is one mixprec call (see train_step below). It trains a small MLP under
   mixed_float16 on Fashion-MNIST and shows the dynamic loss scale settling:
   it starts at 2^15, is halved (and the step skipped) whenever the float16
   gradients overflow, and doubles after 2000 good steps in a row.

       make && ./build/custom_loop --epochs 2

   Flags: --epochs N (5)  --units N (256)  --batch-size N (128)
          --data DIR (/usr/share/datasets/fashion-mnist)  --train-limit N (0 = all)
          --initial-scale S (32768, Keras's 2^15; a larger one, e.g. 2^24 as
          Apex's ceiling, shows the scale falling to a workable value) */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#include "fashion_mnist.h"

#include <time.h>

typedef struct config {
    int epochs, units, batch_size;
    long initial_scale; /* 0 = Keras's default */
    const char *data_dir;
    size_t train_limit;
} config;

static void usage(const char *prog) {
    fprintf(stderr,
            "usage: %s [--epochs N] [--units N] [--batch-size N] [--data DIR] [--train-limit N]\n"
            "       [--initial-scale S] [--backend cpu|cuda]\n",
            prog);
    exit(2);
}

static config parse_args(int argc, char **argv) {
    config c;
    int i;
    c.epochs = 5;
    c.units = 256;
    c.batch_size = 128;
    c.data_dir = FM_PACKAGE_DIR;
    c.train_limit = 0;
    c.initial_scale = 0;
    for (i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) usage(argv[0]);
        if (strcmp(argv[i], "--epochs") == 0) c.epochs = (int)flag_long(argc, argv, i, 1);
        else if (strcmp(argv[i], "--units") == 0) c.units = (int)flag_long(argc, argv, i, 1);
        else if (flag_backend(argc, argv, i)) {}
        else if (strcmp(argv[i], "--batch-size") == 0) c.batch_size = (int)flag_long(argc, argv, i, 1);
        else if (strcmp(argv[i], "--data") == 0) c.data_dir = argv[i + 1];
        else if (strcmp(argv[i], "--train-limit") == 0) c.train_limit = (size_t)flag_long(argc, argv, i, 0);
        else if (strcmp(argv[i], "--initial-scale") == 0) c.initial_scale = flag_long(argc, argv, i, 1);
        else usage(argv[0]);
    }
    return c;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The guide's get_model(): Dense-relu, Dense-relu, Dense, then a float32
   softmax, under mixed_float16. The guide wraps RMSprop in a
   LossScaleOptimizer by hand; MP_LOSS_SCALE_ON is that wrapper, dynamic,
   with Keras's defaults in the zero fields. */
static mp_model *build_model(const config *c) {
    mp_model_desc md;
    mp_compile_desc cd;
    mp_model *m = NULL;

    CHECK(mp_set_global_policy_name("mixed_float16"), NULL);
    memset(&md, 0, sizeof md);
    md.input_shape[0] = FM_PIXELS;
    md.backend = ex_backend;
    CHECK(mp_model_create(&m, &md), NULL);
    fm_add_guide_layers(m, c->units);

    memset(&cd, 0, sizeof cd);
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    cd.optimizer.kind = MP_RMSPROP;
    cd.metrics = MP_METRIC_ACCURACY; /* lets mp_compute_loss count correct answers */
    cd.loss_scale = MP_LOSS_SCALE_ON;
    cd.loss_scale_config.initial_scale = (float)c->initial_scale;
    CHECK(mp_model_compile(m, &cd), m);
    return m;
}

/* The guide's train_step, one call per line. Returns the (unscaled) loss
   and, through *scaled, the loss the gradients were taken of. */
static float train_step(mp_model *m, const float *x, const int32_t *y, int batch, float *scaled) {
    mp_data b = {.x = {mp_rows(x, (size_t)batch, FM_PIXELS)}, .y = mp_labels(y, (size_t)batch)};
    float loss;
    CHECK(mp_forward(m, &b, 1), m);                        /* predictions = model(x) */
    CHECK(mp_compute_loss(m, &b.y, &loss, NULL), m);       /* loss = loss_object(y, predictions) */
    *scaled = mp_get_scaled_loss(m, loss);                 /* optimizer.get_scaled_loss(loss) */
    CHECK(mp_compute_scaled_gradients(m), m);              /* tape.gradient(scaled_loss, vars) */
    CHECK(mp_get_unscaled_gradients(m), m);                /* optimizer.get_unscaled_gradients */
    CHECK(mp_apply_gradients(m, NULL), m);                 /* optimizer.apply_gradients */
    return loss;
}

/* The guide's test_step over the whole test set: model(x, training=False)
   batch by batch, counting the right answers. */
static float test_accuracy(mp_model *m, const mp_data *test, int batch_size) {
    const float *x = (const float *)test->x[0].data;
    const int32_t *y = (const int32_t *)test->y.data;
    size_t correct = 0, start, n = test->x[0].n;
    float loss; /* not reported: the guide's test_step only counts accuracy */
    for (start = 0; start < n; start += (size_t)batch_size) {
        size_t right = 0, left = n - start, batch = left < (size_t)batch_size ? left : (size_t)batch_size;
        mp_data b = {.x = {mp_rows(x + start * FM_PIXELS, batch, FM_PIXELS)}, .y = mp_labels(y + start, batch)};
        CHECK(mp_forward(m, &b, 0), m);
        CHECK(mp_compute_loss(m, &b.y, &loss, &right), m);
        correct += right;
    }
    return (float)correct / (float)n;
}

/* The guide's .shuffle(): a new order of the training set every epoch. */
static void shuffle(size_t *order, size_t n, uint64_t *rng) {
    size_t i;
    for (i = n; i > 1; i--) {
        size_t j = (size_t)(ex_next(rng) % i), t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
}

/* Copies the samples order[0..batch) into one contiguous batch. */
static void gather(const mp_data *d, const size_t *order, int batch, float *x, int32_t *y) {
    int i;
    for (i = 0; i < batch; i++) {
        memcpy(x + (size_t)i * FM_PIXELS, (const float *)d->x[0].data + order[i] * FM_PIXELS, FM_PIXELS * sizeof *x);
        y[i] = ((const int32_t *)d->y.data)[order[i]];
    }
}

/* Prints the loss scale each time it changes: how it settles at the start,
   and each later overflow or growth. */
static void watch_loss_scale(const mp_model *m, size_t step, float scaled_loss, float *last) {
    const mp_loss_scale *ls = mp_model_loss_scale(m);
    if (!ls || ls->scale == *last) return;
    printf("  step %5zu: loss scale %.0f -> %.0f (scaled loss %g, skipped steps %llu)\n", step,
           (double)*last, (double)ls->scale, (double)scaled_loss,
           (unsigned long long)ls->skipped_steps);
    *last = ls->scale;
}

static void train(mp_model *m, const fm_data *d, const config *c) {
    size_t n = d->train.x[0].n, step = 0, i;
    size_t *order = malloc(n * sizeof *order);
    float *xb = malloc((size_t)c->batch_size * FM_PIXELS * sizeof *xb);
    int32_t *yb = malloc((size_t)c->batch_size * sizeof *yb);
    float last_scale = mp_current_loss_scale(m);
    uint64_t rng = 42;
    int epoch;

    if (!order || !xb || !yb) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (i = 0; i < n; i++) order[i] = i;
    printf("loss scale starts at %.0f\n", (double)last_scale);
    for (epoch = 0; epoch < c->epochs; epoch++) {
        double t0 = now_seconds(), loss_sum = 0.0;
        size_t steps = 0, start;
        shuffle(order, n, &rng);
        for (start = 0; start < n; start += (size_t)c->batch_size, steps++) {
            int batch = n - start < (size_t)c->batch_size ? (int)(n - start) : c->batch_size;
            float scaled;
            gather(&d->train, order + start, batch, xb, yb);
            loss_sum += train_step(m, xb, yb, batch, &scaled);
            watch_loss_scale(m, ++step, scaled, &last_scale);
        }
        printf("Epoch %d: loss=%.4f, test accuracy=%.4f (%.1f s, loss scale %.0f, skipped steps %llu)\n",
               epoch, loss_sum / (double)steps, (double)test_accuracy(m, &d->test, c->batch_size),
               now_seconds() - t0, (double)mp_current_loss_scale(m),
               (unsigned long long)mp_model_loss_scale(m)->skipped_steps);
    }
    ex_summary("custom_loop", "the guide's train_step: the loss scale fell from %ld to %.0f, skipping the %llu "
               "steps whose float16 gradients overflowed", c->initial_scale ? c->initial_scale : 32768L,
               (double)mp_current_loss_scale(m), (unsigned long long)mp_model_loss_scale(m)->skipped_steps);
    free(order);
    free(xb);
    free(yb);
}

int main(int argc, char **argv) {
    config c = parse_args(argc, argv);
    fm_data d;
    mp_model *m;

    fm_load(&d, c.data_dir, c.train_limit, 1337);
    printf("custom training loop, mixed_float16: %zu training images, units %d, batch %d\n",
           d.train.x[0].n, c.units, c.batch_size);
    m = build_model(&c);
    mp_model_print_summary(m);
    train(m, &d, &c);
    mp_model_destroy(m);
    fm_free(&d);
    return 0;
}
