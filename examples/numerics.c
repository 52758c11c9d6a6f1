/* numerics.c - what the numbers do in float16, layer by layer. It trains
   the TensorFlow guide's MLP under mixed_float16 on Fashion-MNIST with
   numerics diagnostics on: at the last step a table of every layer's
   activations, weights and gradients (min and max |x|, the share that is
   zero, or would overflow, underflow or be subnormal in float16, Inf and
   NaN counts), a log2 histogram line per gradient against float16's
   ranges, and the loss scale the gradients call for. Then the Tensor Core
   advisor on the same model, and check-numerics catching a planted
   overflow: dense_1's kernel multiplied by 10^5 makes its float16 output
   Inf, and the next step stops there, naming the layer, the step and the
   pass, with the weights untouched.

       make && ./build/numerics

   Flags: --units N (64)  --batch-size N (100)  --train-limit N (3000)
          --every N (0 = the last step)  --data DIR (/usr/share/datasets/fashion-mnist)
          --csv FILE (also log the statistics as CSV) */
#define _POSIX_C_SOURCE 199309L /* clock_gettime: fit's epoch times */
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#include "fashion_mnist.h"

typedef struct config {
    int units, batch_size, every;
    size_t train_limit;
    const char *data_dir, *csv;
} config;

static void usage(const char *prog) {
    fprintf(stderr,
            "usage: %s [--units N] [--batch-size N] [--train-limit N] [--every N] [--data DIR]\n"
            "       [--csv FILE] [--backend cpu|cuda]\n",
            prog);
    exit(2);
}

static config parse_args(int argc, char **argv) {
    config c;
    int i;
    c.units = 64;
    c.batch_size = 100;
    c.every = 0;
    c.train_limit = 3000;
    c.data_dir = FM_PACKAGE_DIR;
    c.csv = NULL;
    for (i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) usage(argv[0]);
        if (strcmp(argv[i], "--units") == 0) c.units = (int)flag_long(argc, argv, i, 1);
        else if (strcmp(argv[i], "--batch-size") == 0) c.batch_size = (int)flag_long(argc, argv, i, 1);
        else if (flag_backend(argc, argv, i)) {}
        else if (strcmp(argv[i], "--train-limit") == 0) c.train_limit = (size_t)flag_long(argc, argv, i, 1);
        else if (strcmp(argv[i], "--every") == 0) c.every = (int)flag_long(argc, argv, i, 0);
        else if (strcmp(argv[i], "--data") == 0) c.data_dir = argv[i + 1];
        else if (strcmp(argv[i], "--csv") == 0) c.csv = argv[i + 1];
        else usage(argv[0]);
    }
    return c;
}

/* The guide's model under mixed_float16; compile() wraps RMSprop in a
   dynamic LossScaleOptimizer by itself. */
static mp_model *build_model(int units) {
    mp_compile_desc cd;
    mp_model *m = fm_guide_model("mixed_float16", units);
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    cd.metrics = MP_METRIC_ACCURACY;
    CHECK(mp_model_compile(m, &cd), m);
    return m;
}

int main(int argc, char **argv) {
    config c = parse_args(argc, argv);
    fm_data data;
    mp_model *m;
    mp_fit_desc fd;
    mp_numerics_desc nd;
    mp_loss_scale_advice advice;
    mp_status st;
    char text[4096];
    size_t n, i, first;
    float *w, *after;
    int issues, untouched;

    fm_load(&data, c.data_dir, c.train_limit, 1337);
    m = build_model(c.units);
    memset(&fd, 0, sizeof fd);
    fd.data = data.train;
    fd.batch_size = c.batch_size;
    fd.verbose = MP_VERBOSE_LINES;

    /* Statistics every N steps (by default at the epoch's last step),
       printed by the library as they are taken. */
    memset(&nd, 0, sizeof nd);
    nd.every = c.every ? c.every : (int)((fd.data.x[0].n + (size_t)c.batch_size - 1) / (size_t)c.batch_size);
    nd.print = 1;
    nd.csv_path = c.csv;
    CHECK(mp_model_set_numerics(m, &nd), m);
    printf("\n== One epoch under mixed_float16, statistics at step %d\n", nd.every);
    CHECK(mp_model_fit(m, &fd), m);
    CHECK(mp_model_recommend_loss_scale(m, &advice), m);
    printf("mp_model_recommend_loss_scale: %g; the loss scale now: %g\n", (double)advice.scale,
           (double)mp_current_loss_scale(m));
    if (c.csv) printf("The statistics are in %s.\n", c.csv);

    printf("\n== The Tensor Core advisor, at batch size %d\n", c.batch_size);
    CHECK(mp_model_tensor_core_advice(m, c.batch_size, text, sizeof text, &issues), m);
    fputs(text, stdout);

    /* Plant an overflow: dense_1's kernel (right after dense's kernel and
       bias) times 10^5. Each weight still fits float16; their products'
       sums do not. */
    printf("\n== check-numerics, after multiplying dense_1's kernel by 1e5\n");
    n = mp_model_param_count(m);
    w = malloc(n * sizeof *w);
    after = malloc(n * sizeof *after);
    if (!w || !after) return 1;
    CHECK(mp_model_get_weights(m, w, n), m);
    first = (size_t)FM_PIXELS * (size_t)c.units + (size_t)c.units;
    for (i = first; i < first + (size_t)c.units * (size_t)c.units; i++) w[i] *= 1e5f;
    CHECK(mp_model_set_weights(m, w, n), m);
    nd.every = 0;
    nd.check = 1;
    nd.csv_path = NULL;
    CHECK(mp_model_set_numerics(m, &nd), m);
    st = mp_model_fit(m, &fd); /* prints the stop and the last layers' statistics */
    printf("\nfit returned %s\nmp_model_error: %s\n", mp_status_name(st), mp_model_error(m));
    CHECK(mp_model_get_weights(m, after, n), m);
    untouched = memcmp(w, after, n * sizeof *w) == 0;
    printf("weights unchanged by the stopped step: %s\n", untouched ? "yes" : "NO");
    ex_summary("numerics", "per-layer ranges against float16, a recommended loss scale of %g, the Tensor Core "
               "advisor's %d findings;", (double)advice.scale, issues);
    ex_summary("", "the %s above is check-numerics stopping a planted overflow at its layer, as intended "
               "(the weights %s)", mp_status_name(st), untouched ? "untouched" : "CHANGED");

    free(w);
    free(after);
    mp_model_destroy(m);
    fm_free(&data);
    return st == MP_ERR_NONFINITE ? 0 : 1;
}
