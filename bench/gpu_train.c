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
      memory (mp_model_memory_info) under float32 and mixed_float16, on one
      batch of random images trained for a few steps.
   4. bench/gpu_train.py: the same MLP in PyTorch (torch.autocast with
      GradScaler for float16), run through python3; its lines are passed
      on, and the ratios mixprec / PyTorch printed.
   One key=value line per measurement. Without a GPU it prints
   `bench=gpu_train available=0 reason=...` and exits 0.

   Build and run: `make bench-gpu` (nvcc and a GPU), or after `make cuda`
       gcc -std=c99 -O2 bench/gpu_train.c -o gpu_train -Lbuild -lmixprec_cuda \
           -L/usr/local/cuda/lib64 -lcublasLt -lcudart -lstdc++ -lm
       ./gpu_train [--quick] [--no-torch] [--torch-script PATH] */
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

typedef struct settings {
    int units, batch;       /* the MLP */
    int gemm_sizes[2];
    int conv_size, conv_batch, conv_steps;
    double min_s;           /* timed MLP and GEMM runs last at least this long */
    int torch;
    const char *torch_script;
} settings;
static settings S = {4096, 8192, {4096, 8192}, 256, 50, 3, 2.0, 1, "bench/gpu_train.py"};

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
    check(mp_forward(m, x, batch, 1), m, "mp_forward");
    check(mp_compute_loss(m, labels, y, &loss, NULL), m, "mp_compute_loss");
    check(mp_compute_scaled_gradients(m), m, "mp_compute_scaled_gradients");
    check(mp_get_unscaled_gradients(m), m, "mp_get_unscaled_gradients");
    check(mp_apply_gradients(m, &applied), m, "mp_apply_gradients");
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
    double t0;
    memset(&cfg, 0, sizeof cfg);
    cfg.tf32 = r->tf32;
    m = build_mlp(r->policy, &cfg);
    train_step(m, x, labels, NULL, S.batch); /* allocates the activations and scratch */
    train_step(m, x, labels, NULL, S.batch);
    r->steps = 0;
    mp_cuda_get_stats(&r->before);
    t0 = now_s();
    do {
        train_step(m, x, labels, NULL, S.batch);
        r->steps++;
    } while (r->steps < 5 || now_s() - t0 < S.min_s);
    r->step_s = (now_s() - t0) / (double)r->steps;
    mp_cuda_get_stats(&r->after);
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
    memset(&cfg, 0, sizeof cfg);
    cfg.tf32 = r->tf32;
    m = build_mlp(r->policy, &cfg);
    memset(&fd, 0, sizeof fd);
    fd.data.x = xs;
    fd.data.labels = ls;
    fd.data.n = n;
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
    memset(&cfg, 0, sizeof cfg);
    cfg.tf32 = tf32;
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
    const char *policy;
    double step_s;
    size_t peak;
} conv_run;

static void time_conv(conv_run *r) {
    mp_model_desc md;
    mp_compile_desc cd;
    mp_layer_desc sigmoid = mp_activation_layer(MP_SIGMOID);
    mp_model_memory mem;
    mp_cuda_stats before, after;
    size_t features = (size_t)S.conv_size * (size_t)S.conv_size * 3, i;
    float *x = (float *)xmalloc((size_t)S.conv_batch * features * sizeof(float));
    float *y = (float *)xmalloc((size_t)S.conv_batch * sizeof(float));
    mp_model *m = NULL;
    double t0 = 0;
    int s;
    random_fill(x, (size_t)S.conv_batch * features, 3);
    for (i = 0; i < (size_t)S.conv_batch; i++) y[i] = (float)(i % 2);
    memset(&md, 0, sizeof md);
    memset(&cd, 0, sizeof cd);
    md.input_shape[0] = md.input_shape[1] = S.conv_size, md.input_shape[2] = 3;
    md.backend = mp_cuda_backend();
    check(mp_set_global_policy_name(r->policy), NULL, r->policy);
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
    for (s = -1; s < S.conv_steps; s++) { /* one warm-up step */
        if (s == 0) t0 = now_s(), mp_cuda_get_stats(&before);
        train_step(m, x, NULL, y, S.conv_batch);
    }
    r->step_s = (now_s() - t0) / S.conv_steps;
    mp_cuda_get_stats(&after);
    check(mp_model_memory_info(m, &mem), m, "memory info");
    r->peak = mem.peak;
    printf("bench=gpu_train impl=mixprec what=conv image=%dx%dx3 batch=%d policy=%s steps=%d ms_per_step=%.1f "
           "peak_mib=%.0f weights_mib=%.1f activations_mib=%.0f workspace_mib=%.0f",
           S.conv_size, S.conv_size, S.conv_batch, r->policy, S.conv_steps, r->step_s * 1e3, (double)r->peak / MIB,
           (double)mem.weights / MIB, (double)mem.activations / MIB, (double)mem.workspace / MIB);
    print_step_counts(&before, &after, S.conv_steps);
    fflush(stdout);
    mp_model_destroy(m);
    free(x);
    free(y);
}

/* ---- 4. the PyTorch peer -------------------------------------------------- */
/* Runs the script, passes its lines on, and returns its ms/step for each
   policy, [0] with the batch from host memory (as the custom loop's steps),
   [1] with it on the device (as fit's); 0 if none. */
static void run_torch(double torch_ms[2][4], const char *const policies[4]) {
    char cmd[512], line[512];
    FILE *f;
    snprintf(cmd, sizeof cmd, "python3 %s --batch %d --units %d --min-seconds %.1f 2>&1", S.torch_script, S.batch,
             S.units, S.min_s);
    if (!(f = popen(cmd, "r"))) {
        printf("bench=gpu_train impl=torch available=0 reason=popen_failed\n");
        return;
    }
    while (fgets(line, sizeof line, f)) {
        size_t p, d;
        double ms;
        fputs(line, stdout);
        for (d = 0; d < 2; d++)
            for (p = 0; p < 4; p++) {
                char key[96];
                const char *at;
                snprintf(key, sizeof key, "what=mlp policy=%s data=%s ", policies[p], d ? "device" : "host");
                if (strstr(line, "impl=torch") && (at = strstr(line, key)) && (at = strstr(at, "ms_per_step=")) &&
                    sscanf(at, "ms_per_step=%lf", &ms) == 1)
                    torch_ms[d][p] = ms;
            }
    }
    fflush(stdout);
    (void)pclose(f);
}

int main(int argc, char **argv) {
    static const char *const policies[4] = {"float32", "float32_tf32", "mixed_float16", "mixed_bfloat16"};
    mlp_run mlps[4];
    conv_run convs[2];
    double torch_ms[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
    char name[128];
    peaks pk;
    float *x;
    int32_t *labels;
    size_t i, p;
    int a;
    for (a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--quick") == 0) { /* checks that everything runs */
            S.units = 1024, S.batch = 1024, S.gemm_sizes[0] = 1024, S.gemm_sizes[1] = 2048;
            S.conv_size = 64, S.conv_batch = 8, S.conv_steps = 2, S.min_s = 0.2;
        } else if (strcmp(argv[a], "--no-torch") == 0) {
            S.torch = 0;
        } else if (strcmp(argv[a], "--torch-script") == 0 && a + 1 < argc) {
            S.torch_script = argv[++a];
        } else {
            fprintf(stderr, "usage: %s [--quick] [--no-torch] [--torch-script PATH]\n", argv[0]);
            return 2;
        }
    }
    if (mp_cuda_device_count() == 0) {
        printf("bench=gpu_train available=0 reason=\"%s\"\n", mp_cuda_last_error());
        return 0;
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
        mlps[p].policy = p == 1 ? "float32" : policies[p];
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

    convs[0].policy = "float32", convs[1].policy = "mixed_float16";
    time_conv(&convs[0]);
    time_conv(&convs[1]);
    printf("bench=gpu_train impl=mixprec what=ratio name=conv_mixed_float16_over_float32 time=%.3f peak_memory=%.3f\n",
           convs[1].step_s / convs[0].step_s, (double)convs[1].peak / (double)convs[0].peak);

    if (S.torch) {
        run_torch(torch_ms, policies);
        for (p = 0; p < 4; p++) {
            if (torch_ms[0][p] > 0)
                printf("bench=gpu_train what=ratio name=mixprec_over_torch policy=%s data=host value=%.3f\n",
                       policies[p], mlps[p].step_s * 1e3 / torch_ms[0][p]);
            if (torch_ms[1][p] > 0) /* mixprec's fit against PyTorch's loop, each with its data on the device */
                printf("bench=gpu_train what=ratio name=mixprec_over_torch policy=%s data=device value=%.3f\n",
                       policies[p], mlps[p].fit_step_s * 1e3 / torch_ms[1][p]);
        }
    }
    free(x);
    free(labels);
    return 0;
}
