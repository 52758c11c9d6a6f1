/* conv_memory.c - the blog post's measurement: a small conv net trained on
   random images, in float32, mixed_float16 and mixed_bfloat16, comparing
   wall time and peak memory. Under the mixed policies the activations (the
   bulk of the memory here) and their gradients are 16-bit, half the bytes;
   the float32 master weights stay. On a CPU with AVX512_BF16 the bfloat16
   products run on vdpbf16ps, so mixed_bfloat16 is where the time falls.

   The blog used 800 images of 256x256x3 and 10 epochs on a GPU (float32
   8.55 GB, 79.7 s; mixed_float16 3.57 GB, 42.2 s). The defaults here are
   sized for a CPU.

       ./build/conv_memory --image-size 32 --images 200

   Flags: --image-size N (32)  --images N (200)  --epochs N (1)
          --batch-size N (50)  --filters N (128) */
#define _POSIX_C_SOURCE 199309L /* clock_gettime, for the library's timings */
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#include "example.h"

typedef struct config {
    int image_size, images, epochs, batch_size, filters;
} config;

typedef struct result {
    double seconds;
    float ms_per_step;
    size_t peak_bytes;
} result;


static void usage(const char *prog) {
    fprintf(stderr,
            "usage: %s [--image-size N] [--images N] [--epochs N] [--batch-size N] [--filters N]\n"
            "       [--backend cpu|cuda]\n",
            prog);
    exit(2);
}

static config parse_args(int argc, char **argv) {
    config c = {32, 200, 1, 50, 128};
    int i;
    for (i = 1; i < argc; i += 2) {
        int v = flag_backend(argc, argv, i) ? 0 : (int)flag_long(argc, argv, i, 1);
        if (!v) continue; /* --backend */
        if (strcmp(argv[i], "--image-size") == 0) c.image_size = v;
        else if (strcmp(argv[i], "--images") == 0) c.images = v;
        else if (strcmp(argv[i], "--epochs") == 0) c.epochs = v;
        else if (strcmp(argv[i], "--batch-size") == 0) c.batch_size = v;
        else if (strcmp(argv[i], "--filters") == 0) c.filters = v;
        else usage(argv[0]);
    }
    if (c.image_size < 2) usage(argv[0]); /* the first kernel is 2x2, padding valid */
    return c;
}

/* The blog's data: uniform random pixels and coin-flip labels. There is
   nothing to learn; the point is the cost of one training pass. The arrays
   are malloc'ed here, so they are not in mixprec's memory counts. */
static void make_data(const config *c, float **x, float **y) {
    size_t pixels = (size_t)c->images * (size_t)c->image_size * (size_t)c->image_size * 3u, i;
    uint64_t rng = 2024;
    *x = malloc(pixels * sizeof **x);
    *y = malloc((size_t)c->images * sizeof **y);
    if (!*x || !*y) {
        fprintf(stderr, "out of memory for %zu pixels\n", pixels);
        exit(1);
    }
    for (i = 0; i < pixels; i++) (*x)[i] = ex_uniform(&rng);
    for (i = 0; i < (size_t)c->images; i++) (*y)[i] = (float)(ex_next(&rng) & 1u);
}

/* The blog's model: three convolutions, a single logit and a float32
   sigmoid (the output feeds the loss, which stays float32). */
static mp_model *build_model(const config *c) {
    mp_model_desc md;
    mp_layer_desc sigmoid = mp_activation_layer(MP_SIGMOID);
    mp_compile_desc cd;
    mp_model *m = NULL;

    memset(&md, 0, sizeof md);
    md.input_shape[0] = c->image_size;
    md.backend = ex_backend;
    md.input_shape[1] = c->image_size;
    md.input_shape[2] = 3;
    CHECK(mp_model_create(&m, &md), NULL);
    CHECK(mp_model_add(m, mp_conv2d(c->filters, 2, 2, MP_VALID, MP_LINEAR)), m);
    CHECK(mp_model_add(m, mp_conv2d(c->filters, 1, 1, MP_VALID, MP_LINEAR)), m);
    CHECK(mp_model_add(m, mp_conv2d(c->filters, 1, 1, MP_VALID, MP_LINEAR)), m);
    CHECK(mp_model_add(m, mp_flatten()), m);
    CHECK(mp_model_add(m, mp_dense(1, MP_LINEAR)), m);
    sigmoid.dtype = "float32";
    CHECK(mp_model_add(m, sigmoid), m);

    memset(&cd, 0, sizeof cd);
    cd.loss = MP_BINARY_CROSSENTROPY;
    cd.optimizer.kind = MP_RMSPROP; /* compile()'s default */
    cd.metrics = MP_METRIC_ACCURACY;
    CHECK(mp_model_compile(m, &cd), m); /* mixed_float16: loss scaling on */
    return m;
}

static result run_policy(const config *c, const char *policy, const float *x, const float *y) {
    mp_logs *history = calloc((size_t)c->epochs, sizeof *history);
    mp_fit_desc fd;
    mp_model *m;
    result r;
    int e;

    if (!history) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    printf("\n=== policy %s ===\n", policy);
    CHECK(mp_set_global_policy_name(policy), NULL);
    mp_reset_peak_memory(); /* count this model only: weights, activations, gradients */
    m = build_model(c);
    mp_model_print_summary(m);

    memset(&fd, 0, sizeof fd);
    {
        int shape[3];
        shape[0] = shape[1] = c->image_size;
        shape[2] = 3;
        fd.data.x[0] = mp_array_f32(x, (size_t)c->images, 3, shape); /* (images, size, size, 3) */
        fd.data.y = mp_rows(y, (size_t)c->images, 1);                 /* (images, 1): one logit's target */
    }
    fd.batch_size = c->batch_size;
    fd.epochs = c->epochs;
    fd.history = history;
    CHECK(mp_model_fit(m, &fd), m);

    r.seconds = 0.0;
    for (e = 0; e < c->epochs; e++) r.seconds += (double)history[e].seconds;
    r.ms_per_step = history[c->epochs - 1].ms_per_step;
    r.peak_bytes = ex_peak_bytes(m, mp_get_memory_info().peak);
    printf("result policy=%s seconds=%.2f ms_per_step=%.1f peak_bytes=%zu\n", policy, r.seconds,
           (double)r.ms_per_step, r.peak_bytes);
    mp_model_destroy(m);
    free(history);
    return r;
}

int main(int argc, char **argv) {
    config c = parse_args(argc, argv);
    result f32, f16, bf16;
    float *x, *y;

    printf("%d random %dx%dx3 images, Conv2D(%d, 2) -> Conv2D(%d, 1) -> Conv2D(%d, 1) -> "
           "Flatten -> Dense(1) -> sigmoid; batch %d, %d epoch(s)\n",
           c.images, c.image_size, c.image_size, c.filters, c.filters, c.filters, c.batch_size,
           c.epochs);
    make_data(&c, &x, &y);
    f32 = run_policy(&c, "float32", x, y);
    f16 = run_policy(&c, "mixed_float16", x, y);
    bf16 = run_policy(&c, "mixed_bfloat16", x, y);
    printf("\nratio peak_mixed_float16/float32=%.2f time=%.2f\n",
           (double)f16.peak_bytes / (double)f32.peak_bytes, f16.seconds / f32.seconds);
    printf("ratio peak_mixed_bfloat16/float32=%.2f time=%.2f\n",
           (double)bf16.peak_bytes / (double)f32.peak_bytes, bf16.seconds / f32.seconds);
    ex_summary("conv_memory", "the blog's conv net: mixed_float16's peak memory %.2fx float32's, its time %.2fx; "
               "mixed_bfloat16's time %.2fx",
               (double)f16.peak_bytes / (double)f32.peak_bytes, f16.seconds / f32.seconds, bf16.seconds / f32.seconds);
    free(x);
    free(y);
    return 0;
}
