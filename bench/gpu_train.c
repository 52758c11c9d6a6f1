/* bench/gpu_train.c - the CUDA backend on a GPU, and PyTorch as its peer.

   1. The TensorFlow guide's MLP (784-4096-4096-10, Dense relu, Dense relu,
      Dense, a float32 softmax; sparse categorical crossentropy; RMSprop),
      batch 8192, synthetic data, trained with the custom-loop calls:
      ms/step under float32 (true float32), float32 with TF32,
      mixed_float16 and mixed_bfloat16. A step includes sending the batch
      from host memory (h2d_ms: that copy alone) and reading the loss back.
      Then the same model trained by fit with its data on the device (fit's
      default: sent once, shuffled and batched there), FIT_BATCHES batches
      an epoch, ms per step over whole epochs.
   2. GEMM TFLOP/s through the backend's gemm op, n x n x n for n = 4096 and
      8192, per dtype, against the GPU's dense peak from NVIDIA's datasheet
      (H100 SXM and H200: 67 fp32, 495 tf32, 989 fp16/bf16; H100 PCIe: 51,
      378, 756; A100: 19.5, 156, 312; others: peak_tflops=unknown).
   3. The blog's conv net (256x256x3 images, Conv2D(128, 2) -> Conv2D(128,
      1) -> Conv2D(128, 1) -> Flatten -> Dense(1) -> sigmoid in float32,
      binary crossentropy, RMSprop, batch 50): ms/step and peak device
      memory (mp_model_memory_info) under the four policies, on one batch
      of random images sent from the host each step.
   4. With --fashion DIR (Fashion-MNIST's IDX files, as `make data` leaves
      them in build/fashion-mnist): the guide's whole fit (batch 8192, 5
      epochs, validation_split 0.2), its data on the device, timed from a
      new model to the end of the last epoch's validation, then the test
      accuracy; the median of FASHION_REPS fits.
   5. bench/gpu_train.py: the same MLP, conv net and fit in PyTorch
      (torch.autocast with GradScaler for float16), run through python3;
      its lines are passed on, and the ratios mixprec / PyTorch printed.
   One key=value line per measurement. Without a GPU it prints
   `bench=gpu_train available=0 reason=...` and exits 0.

   Build and run: `make bench-gpu` (nvcc and a GPU), or after `make cuda`
       gcc -std=c99 -O2 bench/gpu_train.c -o gpu_train -Lbuild -lmixprec_cuda \
           -L/usr/local/cuda/lib64 -lcublasLt -lcudart -lstdc++ -lm
       ./gpu_train [--quick] [--no-torch] [--torch-script PATH] [--fashion DIR] */
#define _POSIX_C_SOURCE 200809L /* popen, clock_gettime */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#include "../cuda/mixprec_cuda.h"
#define BENCH_NAME "gpu_train"
#define BENCH_NO_MODEL_ERROR mp_cuda_last_error()
#include "bench.h"

#define COUNT(a) (sizeof a / sizeof a[0])
#define INPUTS 784
#define CLASSES 10
#define MIB (1024.0 * 1024.0)
#define FIT_BATCHES 4 /* distinct batches of fit's data set on the device */
#define FASHION_REPS 3 /* whole fits over Fashion-MNIST, their median timed */

typedef struct settings {
    int units, batch;       /* the MLP */
    int gemm_sizes[2];
    int conv_size, conv_batch;
    double min_s;           /* timed MLP and GEMM runs last at least this long, conv runs half */
    int torch;
    const char *torch_script;
    const char *fashion_dir; /* NULL: no Fashion-MNIST fit */
    int fashion_epochs;
    size_t fashion_limit;    /* 0: every training image */
} settings;
static settings S = {4096, 8192, {4096, 8192}, 256, 50, 2.0, 1, "bench/gpu_train.py", NULL, 5, 0};

/* The four policies of each part: float32 twice, TF32 off and on. */
static const char *const policies[4] = {"float32", "float32_tf32", "mixed_float16", "mixed_bfloat16"};
static const char *policy_name(size_t p) { return p == 1 ? "float32" : policies[p]; }

static void random_fill(float *x, size_t n, unsigned long long seed) {
    size_t i;
    for (i = 0; i < n; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        x[i] = (float)(seed >> 40) * 0x1p-24f; /* [0, 1) */
    }
}

/* ---- the GPU and its peaks ---------------------------------------------- */
typedef struct peaks {
    double fp32, tf32, half; /* dense TFLOP/s; 0 = unknown */
} peaks;

static peaks device_peaks(const char *name) {
    peaks p = {0, 0, 0};
    if (strstr(name, "H100") && strstr(name, "PCIe")) p.fp32 = 51, p.tf32 = 378, p.half = 756;
    else if (strstr(name, "H100") || strstr(name, "H200")) p.fp32 = 67, p.tf32 = 495, p.half = 989;
    else if (strstr(name, "A100")) p.fp32 = 19.5, p.tf32 = 156, p.half = 312;
    return p;
}

/* ---- 1. the guide's MLP ------------------------------------------------- */
typedef struct mlp_run {
    const char *policy;
    int tf32;
    double step_s;
    long steps;
    size_t peak;
    mp_cuda_stats before, after; /* the backend's counts around the timed steps */
    double fit_step_s;           /* fit with the data on the device */
} mlp_run;

/* The backend's configuration: its defaults, TF32 on or off. */
static mp_cuda_config tf32_config(int tf32) {
    mp_cuda_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.tf32 = tf32;
    return cfg;
}

static mp_model *build_mlp(const char *policy, const mp_cuda_config *cfg) {
    mp_model_desc md;
    mp_compile_desc cd;
    mp_layer_desc softmax = mp_activation_layer(MP_SOFTMAX);
    mp_model *m = NULL;
    memset(&md, 0, sizeof md);
    memset(&cd, 0, sizeof cd);
    md.input_shape[0] = INPUTS;
    md.backend = mp_cuda_backend();
    md.backend_config = cfg;
    check(mp_set_global_policy_name(policy), NULL, policy);
    check(mp_model_create(&m, &md), NULL, "mp_model_create");
    check(mp_model_add(m, mp_dense(S.units, MP_RELU)), m, "add");
    check(mp_model_add(m, mp_dense(S.units, MP_RELU)), m, "add");
    check(mp_model_add(m, mp_dense(CLASSES, MP_LINEAR)), m, "add");
    softmax.dtype = "float32";
    check(mp_model_add(m, softmax), m, "add");
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY; /* RMSprop with Keras's defaults */
    cd.metrics = MP_METRIC_ACCURACY;
    check(mp_model_compile(m, &cd), m, "compile");
    return m;
}

/* The guide's train_step, one call per line (the loss comes back each
   step); labels, or targets y. */
static void train_step(mp_model *m, const float *x, const int32_t *labels, const float *y, int batch) {
    float loss;
    int applied;
    mp_data b;
    memset(&b, 0, sizeof b);
    b.x[0] = mp_rows(x, (size_t)batch, (int)mp_model_input_size(m)); /* an MLP's rows, or images as rows */
    b.y = labels ? mp_labels(labels, (size_t)batch) : mp_rows(y, (size_t)batch, (int)mp_model_output_size(m));
    check(mp_forward(m, &b, 1), m, "mp_forward");
    check(mp_compute_loss(m, &b.y, &loss, NULL), m, "mp_compute_loss");
    check(mp_compute_scaled_gradients(m), m, "mp_compute_scaled_gradients");
    check(mp_get_unscaled_gradients(m), m, "mp_get_unscaled_gradients");
    check(mp_apply_gradients(m, &applied), m, "mp_apply_gradients");
}

/* Seconds per step of at least 5 steps and min_s seconds, the backend's
   counts around them in before and after, the step count in *steps. */
static double timed_steps(mp_model *m, const float *x, const int32_t *labels, const float *y, int batch, double min_s,
                          mp_cuda_stats *before, mp_cuda_stats *after, long *steps) {
    double t0, s;
    *steps = 0;
    mp_cuda_get_stats(before);
    t0 = now_s();
    do {
        train_step(m, x, labels, y, batch);
        ++*steps;
    } while (*steps < 5 || now_s() - t0 < min_s);
    s = (now_s() - t0) / (double)*steps;
    mp_cuda_get_stats(after);
    return s;
}

/* Flops of one step: each Dense layer's forward product and weight
   gradient, and the input gradient of all but the first. */
static double mlp_step_flops(void) {
    double b = S.batch, u = S.units;
    double fwd = 2 * b * (INPUTS * u + u * u + u * CLASSES);
    return 2 * fwd + 2 * b * (u * u + u * CLASSES);
}

/* The per-step counters of `steps` steps (mp_cuda_get_stats before and
   after), the end of a figure's line. */
static void print_step_counts(const mp_cuda_stats *before, const mp_cuda_stats *after, double steps) {
    printf(" host_waits_per_step=%.1f bytes_in_per_step=%.0f launches_per_step=%.1f fallbacks=%llu compute_32f=%llu\n",
           (double)(after->host_waits - before->host_waits) / steps, (double)(after->bytes_in - before->bytes_in) / steps,
           (double)(after->launches - before->launches) / steps, after->fallbacks - before->fallbacks,
           after->compute_32f - before->compute_32f);
}

static void time_mlp(mlp_run *r, const float *x, const int32_t *labels) {
    mp_cuda_config cfg;
    mp_model_memory mem;
    mp_model *m;
    cfg = tf32_config(r->tf32);
    m = build_mlp(r->policy, &cfg);
    train_step(m, x, labels, NULL, S.batch); /* allocates the activations and scratch */
    train_step(m, x, labels, NULL, S.batch);
    r->step_s = timed_steps(m, x, labels, NULL, S.batch, S.min_s, &r->before, &r->after, &r->steps);
    check(mp_model_memory_info(m, &mem), m, "memory info");
    r->peak = mem.peak;
    mp_model_destroy(m);
    printf("bench=gpu_train impl=mixprec what=mlp units=%d batch=%d policy=%s tf32=%d steps=%ld ms_per_step=%.2f "
           "images_per_s=%.0f tflops=%.1f peak_mib=%.0f",
           S.units, S.batch, r->policy, r->tf32, r->steps, r->step_s * 1e3, S.batch / r->step_s,
           mlp_step_flops() / r->step_s * 1e-12, (double)r->peak / MIB);
    print_step_counts(&r->before, &r->after, (double)r->steps);
    fflush(stdout);
}

/* fit with its data on the device: FIT_BATCHES copies of the batch (x
   and labels), one epoch to warm up (allocations, the upload), then enough
   epochs for S.min_s by the custom loop's step time. The data go up once
   per fit call, so the timed fit's upload is spread over its steps. */
static void time_fit(mlp_run *r, const float *x, const int32_t *labels) {
    size_t n = (size_t)FIT_BATCHES * S.batch, i;
    float *xs = (float *)xmalloc(n * INPUTS * sizeof(float));
    int32_t *ls = (int32_t *)xmalloc(n * sizeof(int32_t));
    mp_cuda_config cfg;
    mp_cuda_stats before, after;
    mp_fit_desc fd;
    mp_model *m;
    double t0, steps;
    for (i = 0; i < FIT_BATCHES; i++) {
        memcpy(xs + i * (size_t)S.batch * INPUTS, x, (size_t)S.batch * INPUTS * sizeof(float));
        memcpy(ls + i * (size_t)S.batch, labels, (size_t)S.batch * sizeof(int32_t));
    }
    cfg = tf32_config(r->tf32);
    m = build_mlp(r->policy, &cfg);
    memset(&fd, 0, sizeof fd);
    fd.data.x[0] = mp_rows(xs, n, INPUTS);
    fd.data.y = mp_labels(ls, n);
    fd.batch_size = S.batch;
    fd.verbose = MP_VERBOSE_SILENT;
    check(mp_model_fit(m, &fd), m, "mp_model_fit (warm-up)");
    fd.epochs = (int)(S.min_s / (r->step_s * FIT_BATCHES)) + 1;
    steps = (double)fd.epochs * FIT_BATCHES;
    mp_cuda_get_stats(&before);
    t0 = now_s();
    check(mp_model_fit(m, &fd), m, "mp_model_fit");
    r->fit_step_s = (now_s() - t0) / steps;
    mp_cuda_get_stats(&after);
    mp_model_destroy(m);
    free(xs);
    free(ls);
    printf("bench=gpu_train impl=mixprec what=mlp_fit data=device units=%d batch=%d policy=%s tf32=%d steps=%.0f "
           "ms_per_step=%.2f images_per_s=%.0f",
           S.units, S.batch, r->policy, r->tf32, steps, r->fit_step_s * 1e3, S.batch / r->fit_step_s);
    print_step_counts(&before, &after, steps);
    fflush(stdout);
}

/* The batch's copy alone, through the backend's copy op. */
static double time_h2d(const float *x) {
    const mp_backend *be = mp_cuda_backend();
    size_t bytes = (size_t)S.batch * INPUTS * sizeof(float);
    void *ctx, *dev;
    double t0;
    int i, reps = 10;
    check(be->create(&ctx, 1, NULL), NULL, "create");
    if (!(dev = be->alloc(ctx, bytes))) check(MP_ERR_ALLOC, NULL, "alloc");
    be->copy(ctx, dev, x, bytes, MP_COPY_TO_BACKEND);
    t0 = now_s();
    for (i = 0; i < reps; i++) be->copy(ctx, dev, x, bytes, MP_COPY_TO_BACKEND);
    t0 = (now_s() - t0) / reps;
    check(be->sync(ctx), NULL, be->last_error(ctx));
    be->free(ctx, dev);
    be->destroy(ctx);
    printf("bench=gpu_train impl=mixprec what=h2d batch=%d mib=%.1f ms=%.2f gb_per_s=%.1f\n", S.batch,
           (double)bytes / MIB, t0 * 1e3, (double)bytes / t0 * 1e-9);
    return t0;
}

/* ---- 2. GEMM through the backend ----------------------------------------- */
static void time_gemm(mp_dtype dt, int tf32, int n, peaks pk) {
    const mp_backend *be = mp_cuda_backend();
    mp_cuda_config cfg;
    mp_gemm_args g;
    size_t count = (size_t)n * (size_t)n, bytes = count * mp_dtype_size(dt);
    float *host = (float *)xmalloc(count * sizeof(float));
    void *ctx, *a, *b, *c;
    double t0, t, tflops, peak = dt != MP_FLOAT32 ? pk.half : tf32 ? pk.tf32 : pk.fp32;
    long reps = 0;
    cfg = tf32_config(tf32);
    check(be->create(&ctx, 1, &cfg), NULL, "create");
    a = be->alloc(ctx, bytes), b = be->alloc(ctx, bytes), c = be->alloc(ctx, bytes);
    if (!a || !b || !c) check(MP_ERR_ALLOC, NULL, "GEMM operands");
    random_fill(host, count, 1);
    be->cast_in(ctx, a, dt, host, count, NULL);
    random_fill(host, count, 2);
    be->cast_in(ctx, b, dt, host, count, NULL);
    memset(&g, 0, sizeof g);
    g.m = g.n = g.k = (size_t)n;
    g.a = a, g.b = b, g.c = c;
    g.at = g.bt = g.ct = dt;
    check(be->gemm_reserve(ctx, g.m, g.n, g.k), NULL, "gemm_reserve");
    be->gemm(ctx, &g); /* the plan, cached */
    check(be->sync(ctx), NULL, be->last_error(ctx));
    t0 = now_s();
    do {
        be->gemm(ctx, &g);
        reps++;
        if (reps % 5 == 0) check(be->sync(ctx), NULL, be->last_error(ctx));
    } while (reps < 5 || now_s() - t0 < S.min_s / 2);
    check(be->sync(ctx), NULL, be->last_error(ctx));
    t = (now_s() - t0) / (double)reps;
    tflops = 2.0 * n * (double)n * n / t * 1e-12;
    printf("bench=gpu_train impl=mixprec what=gemm n=%d dtype=%s tf32=%d reps=%ld ms=%.3f tflops=%.1f", n,
           mp_dtype_name(dt), tf32, reps, t * 1e3, tflops);
    if (peak > 0) printf(" peak_tflops=%.1f fraction_of_peak=%.2f\n", peak, tflops / peak);
    else printf(" peak_tflops=unknown\n");
    fflush(stdout);
    be->free(ctx, a), be->free(ctx, b), be->free(ctx, c);
    be->destroy(ctx);
    free(host);
}

/* ---- 3. the blog's conv net ---------------------------------------------- */
typedef struct conv_run {
    double step_s;
    size_t peak;
} conv_run;

static mp_model *build_conv(const char *policy, const mp_cuda_config *cfg) {
    mp_model_desc md;
    mp_compile_desc cd;
    mp_layer_desc sigmoid = mp_activation_layer(MP_SIGMOID);
    mp_model *m = NULL;
    memset(&md, 0, sizeof md);
    memset(&cd, 0, sizeof cd);
    md.input_shape[0] = md.input_shape[1] = S.conv_size, md.input_shape[2] = 3;
    md.backend = mp_cuda_backend();
    md.backend_config = cfg;
    check(mp_set_global_policy_name(policy), NULL, policy);
    check(mp_model_create(&m, &md), NULL, "mp_model_create");
    check(mp_model_add(m, mp_conv2d(128, 2, 2, MP_VALID, MP_LINEAR)), m, "add");
    check(mp_model_add(m, mp_conv2d(128, 1, 1, MP_VALID, MP_LINEAR)), m, "add");
    check(mp_model_add(m, mp_conv2d(128, 1, 1, MP_VALID, MP_LINEAR)), m, "add");
    check(mp_model_add(m, mp_flatten()), m, "add");
    check(mp_model_add(m, mp_dense(1, MP_LINEAR)), m, "add");
    sigmoid.dtype = "float32";
    check(mp_model_add(m, sigmoid), m, "add");
    cd.loss = MP_BINARY_CROSSENTROPY;
    check(mp_model_compile(m, &cd), m, "compile");
    return m;
}

/* One warm-up step, then at least 5 steps and S.min_s / 2 seconds. */
static void time_conv(conv_run *r, size_t p) {
    mp_cuda_config cfg;
    mp_model_memory mem;
    mp_cuda_stats before, after;
    size_t features = (size_t)S.conv_size * (size_t)S.conv_size * 3, i;
    float *x = (float *)xmalloc((size_t)S.conv_batch * features * sizeof(float));
    float *y = (float *)xmalloc((size_t)S.conv_batch * sizeof(float));
    mp_model *m;
    long steps;
    random_fill(x, (size_t)S.conv_batch * features, 3);
    for (i = 0; i < (size_t)S.conv_batch; i++) y[i] = (float)(i % 2);
    cfg = tf32_config(p == 1);
    m = build_conv(policy_name(p), &cfg);
    train_step(m, x, NULL, y, S.conv_batch); /* one warm-up step */
    r->step_s = timed_steps(m, x, NULL, y, S.conv_batch, S.min_s / 2, &before, &after, &steps);
    check(mp_model_memory_info(m, &mem), m, "memory info");
    r->peak = mem.peak;
    printf("bench=gpu_train impl=mixprec what=conv image=%dx%dx3 batch=%d policy=%s tf32=%d steps=%ld ms_per_step=%.1f "
           "peak_mib=%.0f weights_mib=%.1f activations_mib=%.0f workspace_mib=%.0f",
           S.conv_size, S.conv_size, S.conv_batch, policy_name(p), (int)cfg.tf32, steps, r->step_s * 1e3,
           (double)r->peak / MIB, (double)mem.weights / MIB, (double)mem.activations / MIB,
           (double)mem.workspace / MIB);
    print_step_counts(&before, &after, (double)steps);
    fflush(stdout);
    mp_model_destroy(m);
    free(x);
    free(y);
}

/* ---- 4. the guide's fit over Fashion-MNIST --------------------------------- */
static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Split `prefix` ("train" or "t10k") of the IDX files in S.fashion_dir. */
static void load_fashion_split(const char *prefix, mp_dataset *out) {
    char images[1024], labels[1024];
    snprintf(images, sizeof images, "%s/%s-images-idx3-ubyte", S.fashion_dir, prefix);
    snprintf(labels, sizeof labels, "%s/%s-labels-idx1-ubyte", S.fashion_dir, prefix);
    check(mp_load_idx(images, labels, out), NULL, images);
}

/* The median of FASHION_REPS values. */
static double median_of(double *v) {
    qsort(v, FASHION_REPS, sizeof v[0], by_value);
    return v[FASHION_REPS / 2];
}

/* FASHION_REPS whole fits from a new model each: the medians of their
   times, of their first epoch's, of their later epochs' mean and of what
   came before the first epoch (fit's set-up: the data's upload, the
   activations' allocation); the last fit's final epoch and test accuracy.
   Returns the median seconds. */
static double time_fashion(size_t p, const mp_dataset *train, const mp_dataset *test) {
    mp_cuda_config cfg;
    mp_fit_desc fd;
    mp_logs *history = (mp_logs *)xmalloc((size_t)S.fashion_epochs * sizeof(mp_logs)), test_logs;
    mp_data test_data;
    double times[FASHION_REPS], first[FASHION_REPS], later[FASHION_REPS], setup[FASHION_REPS], t0, fit_s;
    mp_model *m;
    int r, e;
    cfg = tf32_config(p == 1);
    memset(&fd, 0, sizeof fd);
    fd.data = mp_dataset_data(train);
    if (S.fashion_limit && S.fashion_limit < train->n) fd.data.x[0].n = fd.data.y.n = S.fashion_limit;
    fd.batch_size = S.batch;
    fd.epochs = S.fashion_epochs;
    fd.validation_split = 0.2f; /* the guide's */
    fd.verbose = MP_VERBOSE_SILENT;
    fd.history = history;
    test_data = mp_dataset_data(test);
    for (r = 0; r < FASHION_REPS; r++) {
        m = build_mlp(policy_name(p), &cfg);
        t0 = now_s();
        check(mp_model_fit(m, &fd), m, "mp_model_fit (Fashion-MNIST)");
        times[r] = now_s() - t0;
        first[r] = history[0].seconds, later[r] = 0, setup[r] = times[r];
        for (e = 0; e < S.fashion_epochs; e++) setup[r] -= history[e].seconds;
        for (e = 1; e < S.fashion_epochs; e++) later[r] += history[e].seconds / (S.fashion_epochs - 1);
        check(mp_model_evaluate(m, &test_data, S.batch, &test_logs), m, "mp_model_evaluate");
        mp_model_destroy(m);
    }
    fit_s = median_of(times);
    printf("bench=gpu_train impl=mixprec what=fashion_fit policy=%s tf32=%d units=%d batch=%d epochs=%d steps=%zu "
           "reps=%d fit_s=%.3f before_epochs_s=%.4f first_epoch_s=%.4f later_epoch_s=%.4f loss=%.4f val_loss=%.4f "
           "val_accuracy=%.4f test_accuracy=%.4f\n",
           policy_name(p), (int)cfg.tf32, S.units, S.batch, S.fashion_epochs,
           (size_t)S.fashion_epochs * history[0].steps, FASHION_REPS, fit_s, median_of(setup), median_of(first),
           median_of(later), history[S.fashion_epochs - 1].loss, history[S.fashion_epochs - 1].val_loss,
           history[S.fashion_epochs - 1].val_accuracy, test_logs.accuracy);
    fflush(stdout);
    free(history);
    return fit_s;
}

/* ---- 5. the PyTorch peer -------------------------------------------------- */
/* PyTorch's figures, by policy (0 where it printed none). */
typedef struct torch_figures {
    double mlp_ms[2][4]; /* [0] the batch from host memory (as the custom loop's steps), [1] on the device (fit's) */
    double conv_ms[4], conv_peak_mib[4];
    double fashion_s[4];
} torch_figures;

/* The index of line's policy= in policies[], or -1. */
static int line_policy(const char *line) {
    char key[64];
    int p;
    for (p = 0; p < 4; p++) {
        snprintf(key, sizeof key, " policy=%s ", policies[p]);
        if (strstr(line, key)) return p;
    }
    return -1;
}

static void torch_line(const char *line, torch_figures *t) {
    int p = line_policy(line);
    if (!strstr(line, "impl=torch") || p < 0) return;
    if (strstr(line, " what=mlp ")) {
        t->mlp_ms[strstr(line, " data=device ") != NULL][p] = peer_value(line, "ms_per_step");
    } else if (strstr(line, " what=conv ")) {
        t->conv_ms[p] = peer_value(line, "ms_per_step");
        t->conv_peak_mib[p] = peer_value(line, "peak_mib");
    } else if (strstr(line, " what=fashion_fit ")) {
        t->fashion_s[p] = peer_value(line, "fit_s");
    }
}

/* Runs the script with this run's sizes, passes its lines on and keeps its
   figures. */
static void run_torch(torch_figures *t) {
    char cmd[1024], line[512];
    FILE *f;
    char fashion[640] = "";
    size_t fashion_len = S.fashion_dir ? (size_t)snprintf(fashion, sizeof fashion,
        " --fashion '%s' --fashion-epochs %d --fashion-reps %d --fashion-limit %zu", S.fashion_dir, S.fashion_epochs,
        FASHION_REPS, S.fashion_limit) : 0;
    if (fashion_len >= sizeof fashion ||
        (size_t)snprintf(cmd, sizeof cmd, "python3 %s --batch %d --units %d --min-seconds %.1f --conv-size %d --conv-batch %d%s 2>&1",
                         S.torch_script, S.batch, S.units, S.min_s, S.conv_size, S.conv_batch, fashion) >= sizeof cmd) {
        printf("bench=gpu_train impl=torch available=0 reason=command_too_long\n");
        return;
    }
    fflush(stdout);
    if (!(f = popen(cmd, "r"))) {
        printf("bench=gpu_train impl=torch available=0 reason=popen_failed\n");
        return;
    }
    while (fgets(line, sizeof line, f)) {
        fputs(line, stdout);
        torch_line(line, t);
    }
    fflush(stdout);
    (void)pclose(f);
}

/* mixprec / PyTorch, one line, where PyTorch gave the figure. */
static void print_ratio(const char *what, size_t p, const char *extra, double mixprec, double torch) {
    if (torch > 0)
        printf("bench=gpu_train what=ratio name=mixprec_over_torch of=%s policy=%s%s value=%.3f\n", what, policies[p],
               extra, mixprec / torch);
}

int main(int argc, char **argv) {
    mlp_run mlps[4];
    conv_run convs[4];
    double fashion_s[4] = {0, 0, 0, 0};
    torch_figures torch;
    mp_dataset fashion_train, fashion_test;
    char name[128];
    peaks pk;
    float *x;
    int32_t *labels;
    size_t i, p;
    int a;
    for (a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--quick") == 0) { /* checks that everything runs */
            S.units = 1024, S.batch = 1024, S.gemm_sizes[0] = 1024, S.gemm_sizes[1] = 2048;
            S.conv_size = 64, S.conv_batch = 8, S.min_s = 0.2;
            S.fashion_epochs = 1, S.fashion_limit = 2048;
        } else if (strcmp(argv[a], "--no-torch") == 0) {
            S.torch = 0;
        } else if (strcmp(argv[a], "--torch-script") == 0 && a + 1 < argc) {
            S.torch_script = argv[++a];
        } else if (strcmp(argv[a], "--fashion") == 0 && a + 1 < argc) {
            S.fashion_dir = argv[++a];
        } else {
            fprintf(stderr, "usage: %s [--quick] [--no-torch] [--torch-script PATH] [--fashion DIR]\n", argv[0]);
            return 2;
        }
    }
    if (mp_cuda_device_count() == 0) {
        printf("bench=gpu_train available=0 reason=\"%s\"\n", mp_cuda_last_error());
        return 0;
    }
    memset(&fashion_train, 0, sizeof fashion_train);
    memset(&fashion_test, 0, sizeof fashion_test);
    if (S.fashion_dir) { /* the files first: a wrong folder fails before the minutes of timing */
        load_fashion_split("train", &fashion_train);
        load_fashion_split("t10k", &fashion_test);
    }
    check(mp_cuda_device_name(0, name, sizeof name), NULL, "device name");
    pk = device_peaks(name);
    printf("bench=gpu_train available=1 device=\"%s\" min_timing_s=%.1f", name, S.min_s);
    if (pk.fp32 > 0)
        printf(" peak_fp32=%.1f peak_tf32=%.1f peak_fp16=%.1f peak_source=nvidia_datasheet_dense\n", pk.fp32, pk.tf32,
               pk.half);
    else
        printf(" peak=unknown\n");

    x = (float *)xmalloc((size_t)S.batch * INPUTS * sizeof(float));
    labels = (int32_t *)xmalloc((size_t)S.batch * sizeof(int32_t));
    random_fill(x, (size_t)S.batch * INPUTS, 4);
    for (i = 0; i < (size_t)S.batch; i++) labels[i] = (int32_t)(i * 7 % CLASSES);
    (void)time_h2d(x);
    for (p = 0; p < 4; p++) {
        memset(&mlps[p], 0, sizeof mlps[p]);
        mlps[p].policy = policy_name(p);
        mlps[p].tf32 = p == 1;
        time_mlp(&mlps[p], x, labels);
        time_fit(&mlps[p], x, labels);
    }
    for (p = 1; p < 4; p++)
        printf("bench=gpu_train impl=mixprec what=ratio name=mlp_step_time_over_float32 policy=%s value=%.3f\n",
               policies[p], mlps[p].step_s / mlps[0].step_s);

    for (i = 0; i < COUNT(S.gemm_sizes); i++) {
        time_gemm(MP_FLOAT32, 0, S.gemm_sizes[i], pk);
        time_gemm(MP_FLOAT32, 1, S.gemm_sizes[i], pk);
        time_gemm(MP_FLOAT16, 0, S.gemm_sizes[i], pk);
        time_gemm(MP_BFLOAT16, 0, S.gemm_sizes[i], pk);
    }

    for (p = 0; p < 4; p++) time_conv(&convs[p], p);
    for (p = 1; p < 4; p++)
        printf("bench=gpu_train impl=mixprec what=ratio name=conv_over_float32 policy=%s time=%.3f peak_memory=%.3f\n",
               policies[p], convs[p].step_s / convs[0].step_s, (double)convs[p].peak / (double)convs[0].peak);

    if (S.fashion_dir)
        for (p = 0; p < 4; p++) fashion_s[p] = time_fashion(p, &fashion_train, &fashion_test);

    memset(&torch, 0, sizeof torch);
    if (S.torch) {
        run_torch(&torch);
        for (p = 0; p < 4; p++) {
            print_ratio("mlp_step", p, " data=host", mlps[p].step_s * 1e3, torch.mlp_ms[0][p]);
            /* mixprec's fit against PyTorch's loop, each with its data on the device */
            print_ratio("mlp_step", p, " data=device", mlps[p].fit_step_s * 1e3, torch.mlp_ms[1][p]);
            print_ratio("conv_step", p, "", convs[p].step_s * 1e3, torch.conv_ms[p]);
            print_ratio("conv_peak_memory", p, "", (double)convs[p].peak / MIB, torch.conv_peak_mib[p]);
            if (S.fashion_dir) print_ratio("fashion_fit", p, "", fashion_s[p], torch.fashion_s[p]);
        }
    }
    mp_dataset_free(&fashion_train);
    mp_dataset_free(&fashion_test);
    free(x);
    free(labels);
    return 0;
}
