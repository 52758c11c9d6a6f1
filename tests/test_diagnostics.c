/* test_diagnostics.c - tests of the numerics diagnostics and the Tensor
   Core advisor: tensor statistics of crafted values at float16's and
   bfloat16's thresholds from float32, float16 and bfloat16 sources, and
   against mp_convert's own stats and an frexp histogram on wide random
   data; the recommended loss scale of crafted gradients; per-layer
   statistics taken in a custom-loop step (equal to what mp_output,
   mp_get_weights and mp_get_gradients give) and every N steps of a fit,
   with the CSV file read back; check-numerics stopping a fit at a planted
   layer, forward and backward, with the exact message and the weights
   untouched; the advisor on 784-1000-10 and a conv net; errors. Runs in
   well under a second, also under ASan/UBSan. */
#define _POSIX_C_SOURCE 200112L /* getpid: a CSV path of its own per process */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* An allocator that can be told to fail its next call. */
static int fail_next_alloc;
static void *test_malloc(size_t n) {
    if (fail_next_alloc) { fail_next_alloc = 0; return NULL; }
    return malloc(n);
}
#define MIXPREC_MALLOC(sz) test_malloc(sz)
#define MIXPREC_FREE(p) free(p)
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#include "check.h"
#include "helpers.h"

/* ======================================================================== */
/* Helpers */


static float f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
static int bin_of(int e) { return e - MP_HIST_MIN_EXP + 1; } /* the bin of [2^e, 2^(e+1)) */


static mp_tensor_stats stats_of(const void *x, mp_dtype t, size_t n, mp_dtype target) {
    mp_tensor_stats s;
    memset(&s, 0, sizeof s);
    OK(mp_tensor_stats_compute(x, t, n, target, &s), NULL);
    return s;
}

static int same_stats(const mp_tensor_stats *a, const mp_tensor_stats *b) { return memcmp(a, b, sizeof *a) == 0; }

static uint64_t hist_total(const mp_tensor_stats *s) {
    uint64_t n = 0;
    int b;
    for (b = 0; b < MP_HIST_BINS; b++) n += s->hist[b];
    return n;
}


/* Three Gaussian-ish blobs in `features` dimensions, labels 0..2. */
enum { FEATURES = 20, SAMPLES = 256, CLASSES = 3, BATCH = 32 };
static float data_x[SAMPLES * FEATURES];
static int32_t data_y[SAMPLES];
static float data_t[SAMPLES * CLASSES]; /* huge MSE targets: their loss gradient overflows float16 */

static void make_data(void) {
    int i, j;
    for (i = 0; i < SAMPLES; i++) {
        data_y[i] = i % CLASSES;
        for (j = 0; j < FEATURES; j++)
            data_x[i * FEATURES + j] = uniform(-1.0f, 1.0f) + (j % CLASSES == data_y[i] ? 2.0f : 0.0f);
        for (j = 0; j < CLASSES; j++) data_t[i * CLASSES + j] = 1e7f;
    }
}

/* FEATURES -> 16 relu -> 16 relu -> CLASSES (-> a float32 softmax), added
   under `policy`; compiled with SGD and the given loss and loss scaling. */
static mp_model *make_mlp(const char *policy, mp_loss loss, mp_loss_scale_mode scaling) {
    mp_model_desc md;
    mp_compile_desc cd;
    mp_model *m = NULL;
    mp_layer_desc softmax = mp_activation_layer(MP_SOFTMAX);
    int ok;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = FEATURES;
    md.seed = 11;
    softmax.dtype = "float32";
    ok = OK(mp_set_global_policy_name(policy), NULL) && OK(mp_model_create(&m, &md), NULL) &&
         OK(mp_model_add(m, mp_dense(16, MP_RELU)), m) && OK(mp_model_add(m, mp_dense(16, MP_RELU)), m) &&
         OK(mp_model_add(m, mp_dense(CLASSES, MP_LINEAR)), m);
    if (ok && loss == MP_SPARSE_CATEGORICAL_CROSSENTROPY) ok = OK(mp_model_add(m, softmax), m);
    mp_set_global_policy_name("float32");
    memset(&cd, 0, sizeof cd);
    cd.loss = loss;
    cd.optimizer.kind = MP_SGD;
    cd.loss_scale = scaling;
    if (ok) ok = OK(mp_model_compile(m, &cd), m);
    if (!ok) {
        mp_model_destroy(m);
        return NULL;
    }
    return m;
}

static mp_fit_desc fit_desc(const float *targets) {
    mp_fit_desc fd;
    memset(&fd, 0, sizeof fd);
    fd.data = targets ? data_xt(data_x, FEATURES, targets, CLASSES, SAMPLES) : data_xy(data_x, FEATURES, data_y, SAMPLES);
    fd.batch_size = BATCH; /* 8 steps an epoch */
    fd.no_shuffle = 1;
    fd.verbose = MP_VERBOSE_SILENT;
    return fd;
}

/* ======================================================================== */
/* Tensor statistics */

static void test_stats_float32(void) {
    /* float16's thresholds as float32 bit patterns (reference section 1) */
    const uint32_t bits[] = {
        0x00000000u, 0x80000000u,             /* +0, -0 */
        0x477FE000u, 0x477FEFFFu,             /* 65504, just below the midpoint: finite */
        0x477FF000u, 0xC77FF000u, 0x4E6E6B28u, /* 65520, -65520, 1e9: overflow */
        0x33800000u,                          /* 2^-24: the smallest subnormal */
        0x33000000u,                          /* 2^-25: a tie, goes to zero */
        0x33000001u,                          /* just above: 2^-24, subnormal */
        0x38800000u,                          /* 2^-14: the smallest normal */
        0x387FE000u,                          /* 2^-14 - 2^-25: a tie, rounds up to normal */
        0x387FDFFFu,                          /* just below: subnormal */
        0x0DA24260u,                          /* 1e-30: underflow */
        0x00000001u,                          /* float32's smallest subnormal: underflow */
        0x7FC00000u, 0xFFC00001u,             /* NaN, -NaN */
        0x7F800000u, 0xFF800000u,             /* Inf, -Inf */
        0x3F800000u, 0x40400000u};            /* 1, 3 */
    enum { N = sizeof bits / sizeof bits[0] };
    float x[N];
    mp_tensor_stats s, twice;
    size_t i;
    for (i = 0; i < N; i++) x[i] = f32(bits[i]);
    s = stats_of(x, MP_FLOAT32, N, MP_FLOAT16);
    CHECK_EQ(s.count, 21);
    CHECK_EQ(s.zeros, 2);
    CHECK_EQ(s.nan, 2);
    CHECK_EQ(s.inf, 2);
    CHECK_EQ(s.overflow, 3);
    CHECK_EQ(s.underflow, 3);
    CHECK_EQ(s.subnormal, 3);
    CHECK(s.min_abs == f32(1));
    CHECK(s.max_abs == 1e9f);
    CHECK_EQ(s.hist[bin_of(15)], 4);       /* 65504 .. 65520 */
    CHECK_EQ(s.hist[MP_HIST_BINS - 1], 1); /* 1e9 >= 2^20 */
    CHECK_EQ(s.hist[bin_of(-24)], 1);
    CHECK_EQ(s.hist[bin_of(-25)], 2);
    CHECK_EQ(s.hist[bin_of(-14)], 1);
    CHECK_EQ(s.hist[bin_of(-15)], 2);
    CHECK_EQ(s.hist[0], 2); /* 1e-30 and 2^-149 below 2^-50 */
    CHECK_EQ(s.hist[bin_of(0)], 1);
    CHECK_EQ(s.hist[bin_of(1)], 1);
    CHECK_EQ(hist_total(&s), 15);

    /* it adds: twice the counts, the same extremes */
    twice = s;
    OK(mp_tensor_stats_compute(x, MP_FLOAT32, N, MP_FLOAT16, &twice), NULL);
    CHECK_EQ(twice.count, 42);
    CHECK_EQ(twice.overflow, 6);
    CHECK_EQ(twice.hist[bin_of(15)], 8);
    CHECK(twice.min_abs == s.min_abs && twice.max_abs == s.max_abs);

    /* against bfloat16's range: 65520 and 1e9 fit, 2^-149 underflows */
    s = stats_of(x, MP_FLOAT32, N, MP_BFLOAT16);
    CHECK_EQ(s.overflow, 0);
    CHECK_EQ(s.underflow, 1);
    CHECK_EQ(s.subnormal, 0);
    x[0] = FLT_MAX; /* rounds to bfloat16 Inf */
    s = stats_of(x, MP_FLOAT32, N, MP_BFLOAT16);
    CHECK_EQ(s.overflow, 1);
    CHECK_EQ(s.zeros, 1);
}

static void test_stats_16bit_sources(void) {
    const uint16_t h[] = {0x0001, 0x03FF, 0x0400, 0x7BFF, 0x7C00, 0xFC00, 0x7E00, 0x0000, 0x8000, 0x3C00};
    const uint16_t b[] = {0x3F80, 0x4780, 0x0001, 0x7F80, 0x0000, 0x7FC1};
    mp_f16 hv[10];
    mp_bf16 bv[6];
    mp_tensor_stats s;
    size_t i;
    for (i = 0; i < 10; i++) hv[i] = mp_f16_from_bits(h[i]);
    for (i = 0; i < 6; i++) bv[i] = mp_bf16_from_bits(b[i]);
    s = stats_of(hv, MP_FLOAT16, 10, MP_FLOAT16);
    CHECK_EQ(s.count, 10);
    CHECK_EQ(s.zeros, 2);
    CHECK_EQ(s.inf, 2);
    CHECK_EQ(s.nan, 1);
    CHECK_EQ(s.overflow, 0);  /* a float16 fits float16 */
    CHECK_EQ(s.underflow, 0);
    CHECK_EQ(s.subnormal, 2); /* 0x0001 and 0x03FF */
    CHECK(s.min_abs == ldexpf(1.0f, -24));
    CHECK(s.max_abs == 65504.0f);
    CHECK_EQ(s.hist[bin_of(-24)], 1);
    CHECK_EQ(s.hist[bin_of(-15)], 1);
    CHECK_EQ(s.hist[bin_of(-14)], 1);
    CHECK_EQ(s.hist[bin_of(15)], 1);
    CHECK_EQ(s.hist[bin_of(0)], 1);
    CHECK_EQ(hist_total(&s), 5);

    /* bfloat16 1, 65536, 2^-133, Inf, 0, NaN against float16, then itself */
    s = stats_of(bv, MP_BFLOAT16, 6, MP_FLOAT16);
    CHECK_EQ(s.overflow, 1);
    CHECK_EQ(s.underflow, 1);
    CHECK_EQ(s.inf, 1);
    CHECK_EQ(s.nan, 1);
    CHECK_EQ(s.zeros, 1);
    CHECK_EQ(s.hist[0], 1);
    CHECK_EQ(s.hist[bin_of(16)], 1);
    CHECK(s.max_abs == 65536.0f);
    s = stats_of(bv, MP_BFLOAT16, 6, MP_BFLOAT16);
    CHECK_EQ(s.overflow, 0);
    CHECK_EQ(s.underflow, 0);
    CHECK_EQ(s.subnormal, 1);

    /* errors, and nothing to count */
    memset(&s, 0, sizeof s);
    CHECK_EQ(mp_tensor_stats_compute(hv, MP_FLOAT16, 10, MP_FLOAT16, NULL), MP_ERR_NULL);
    CHECK_EQ(mp_tensor_stats_compute(NULL, MP_FLOAT16, 10, MP_FLOAT16, &s), MP_ERR_NULL);
    CHECK_EQ(mp_tensor_stats_compute(hv, (mp_dtype)7, 10, MP_FLOAT16, &s), MP_ERR_DTYPE);
    CHECK_EQ(mp_tensor_stats_compute(hv, MP_FLOAT16, 10, MP_DTYPE_COUNT, &s), MP_ERR_DTYPE);
    CHECK_EQ(mp_tensor_stats_compute((const char *)hv + 1, MP_FLOAT16, 2, MP_FLOAT16, &s), MP_ERR_ALIGN);
    CHECK_EQ(mp_tensor_stats_compute(NULL, MP_FLOAT32, 0, MP_FLOAT16, &s), MP_OK);
    CHECK_EQ(s.count, 0);
}

/* Wide random data: the counts agree with mp_convert's stats (the same
   scan), the histogram with frexpf, for every source dtype. */
static void test_stats_wide(void) {
    enum { N = 10007 }; /* odd: SIMD tails */
    float *x = floats(N);
    mp_f16 *h = (mp_f16 *)zalloc(N * sizeof(mp_f16));
    mp_bf16 *b = (mp_bf16 *)zalloc(N * sizeof(mp_bf16));
    float *back = floats(N);
    int t, bad = 0;
    size_t i;
    for (i = 0; i < N; i++) {
        uint64_t r = rng_next();
        x[i] = (r & 1 ? -1.0f : 1.0f) * ldexpf(uniform(1.0f, 2.0f), (int)(r >> 8) % 140 - 90);
        if (r % 97 == 0) x[i] = 0.0f;
        if (r % 89 == 0) x[i] = f32(0x7F800000u);
        if (r % 83 == 0) x[i] = f32(0x7FC00000u);
    }
    mp_convert(h, MP_FLOAT16, x, MP_FLOAT32, N, NULL);
    mp_convert(b, MP_BFLOAT16, x, MP_FLOAT32, N, NULL);
    for (t = 0; t < 3; t++) {
        const void *src = t == 0 ? (const void *)x : t == 1 ? (const void *)h : (const void *)b;
        mp_dtype st = t == 0 ? MP_FLOAT32 : t == 1 ? MP_FLOAT16 : MP_BFLOAT16;
        mp_dtype target;
        for (target = MP_FLOAT16; target <= MP_BFLOAT16; target = (mp_dtype)(target + 1)) {
            mp_cast_stats c;
            mp_tensor_stats s = stats_of(src, st, N, target);
            uint64_t want[MP_HIST_BINS], zeros = 0;
            void *dst = zalloc(N * 2);
            memset(&c, 0, sizeof c);
            memset(want, 0, sizeof want);
            mp_convert(dst, target, src, st, N, &c);
            free(dst);
            CHECK(s.count == c.count && s.nan == c.nan_in && s.inf == c.inf_in && s.overflow == c.overflow &&
                  s.underflow == c.underflow && s.subnormal == c.subnormal && s.min_abs == c.min_abs &&
                  s.max_abs == c.max_abs);
            mp_convert(back, MP_FLOAT32, src, st, N, NULL);
            for (i = 0; i < N; i++) {
                int e;
                if (back[i] == 0.0f) { zeros++; continue; }
                if (back[i] != back[i] || fabsf(back[i]) > FLT_MAX) continue;
                frexpf(back[i], &e); /* |x| in [2^(e-1), 2^e) */
                e = bin_of(e - 1);
                want[e < 0 ? 0 : e >= MP_HIST_BINS ? MP_HIST_BINS - 1 : e]++;
            }
            bad += memcmp(want, s.hist, sizeof want) != 0;
            CHECK_EQ(s.zeros, zeros);
        }
    }
    CHECK_EQ(bad, 0);
    free(x);
    free(h);
    free(b);
    free(back);
}

/* ======================================================================== */
/* The recommended loss scale */

static mp_loss_scale_advice advice_of(const float *g, size_t n) {
    mp_tensor_stats s = stats_of(g, MP_FLOAT32, n, MP_FLOAT16);
    mp_loss_scale_advice a;
    memset(&a, 0, sizeof a);
    OK(mp_recommend_loss_scale(&s, 1, &a), NULL);
    return a;
}

static void test_recommend(void) {
    float g[4] = {0.5f, -1e-3f, 0.0f, 0.0f};
    mp_tensor_stats two[2];
    mp_loss_scale_advice a;
    g[2] = ldexpf(1.0f, -30);
    g[3] = -ldexpf(1.0f, -41);
    a = advice_of(g, 4); /* 0.5 * 2^15 = 16384 <= 32752 < 32768 */
    CHECK(a.scale == 32768.0f);
    CHECK(a.max_abs == 0.5f);
    CHECK(a.underflow_unscaled == 0.5f);  /* 2^-30 and 2^-41 are below 2^-25 */
    CHECK(a.underflow_scaled == 0.25f);   /* 2^-41 * 2^15 = 2^-26 still is */
    g[0] = 1.0f;
    CHECK(advice_of(g, 4).scale == 16384.0f);
    g[0] = 65504.0f; /* too large already: a scale below 1 */
    a = advice_of(g, 4);
    CHECK(a.scale == 0.5f);
    CHECK(a.underflow_scaled == 0.5f);
    g[0] = 32752.0f; /* exactly the limit */
    CHECK(advice_of(g, 4).scale == 1.0f);
    g[0] = 1e-9f; /* tiny gradients: Apex's ceiling of 2^24 */
    g[1] = 0.0f;
    CHECK(advice_of(g, 4).scale == 16777216.0f);
    a = advice_of(g, 0);
    CHECK(a.scale == 1.0f && a.max_abs == 0.0f && a.underflow_unscaled == 0.0f);

    /* several tensors: the largest magnitude decides */
    g[0] = 0.5f;
    two[0] = stats_of(g, MP_FLOAT32, 1, MP_FLOAT16);
    g[0] = 2.0f;
    two[1] = stats_of(g, MP_FLOAT32, 1, MP_FLOAT16);
    OK(mp_recommend_loss_scale(two, 2, &a), NULL);
    CHECK(a.scale == 8192.0f);
    CHECK_EQ(mp_recommend_loss_scale(NULL, 2, &a), MP_ERR_NULL);
    CHECK_EQ(mp_recommend_loss_scale(two, 2, NULL), MP_ERR_NULL);
    CHECK_EQ(mp_recommend_loss_scale(two, -1, &a), MP_ERR_ARG);
}

/* ======================================================================== */
/* Per-layer statistics */

/* One custom-loop step taking statistics: each kind equals the statistics
   of what the public calls give for the same tensors. */
static void test_custom_loop_step(void) {
    mp_model *m = make_mlp("mixed_float16", MP_SPARSE_CATEGORICAL_CROSSENTROPY, MP_LOSS_SCALE_AUTO);
    mp_numerics_desc nd;
    mp_tensor_stats got, want;
    mp_tensor out;
    mp_memory_info before;
    size_t n, off = 0;
    float *w, *g, loss, scale;
    int i, layers;
    if (!m) return;
    n = mp_model_param_count(m);
    w = floats(n);
    g = floats(n);
    memset(&nd, 0, sizeof nd);
    nd.every = 1;
    OK(mp_model_set_numerics(m, &nd), m);
    CHECK_EQ(mp_model_numerics_step(m), 0);
    CHECK_EQ(mp_model_numerics(m, 0, MP_NUMERICS_WEIGHTS, &got), MP_ERR_STATE);
    OK(mp_model_get_weights(m, w, n), m);
    OK(forward_rows(m, data_x, BATCH, 1), m);
    before = mp_get_memory_info();
    OK(loss_rows(m, data_y, NULL, BATCH, &loss, NULL), m);
    OK(mp_compute_scaled_gradients(m), m);
    OK(mp_get_unscaled_gradients(m), m);
    CHECK_EQ(mp_get_memory_info().current, before.current); /* a step allocates nothing */
    CHECK_EQ(mp_model_numerics_step(m), 1);
    OK(mp_get_gradients(m, g, n), m);
    scale = mp_current_loss_scale(m);
    CHECK(scale == 32768.0f);
    layers = mp_model_layer_count(m);
    for (i = 0; i < layers; i++) {
        mp_layer_info info;
        OK(mp_model_layer_info(m, i, &info), m);
        OK(mp_model_numerics(m, i, MP_NUMERICS_WEIGHTS, &got), m);
        want = stats_of(w + off, MP_FLOAT32, info.params, MP_FLOAT16);
        CHECK(same_stats(&got, &want));
        OK(mp_model_numerics(m, i, MP_NUMERICS_GRADIENTS, &got), m);
        want = stats_of(g + off, MP_FLOAT32, info.params, MP_FLOAT16);
        CHECK(same_stats(&got, &want));
        CHECK_EQ(got.count, info.params);
        if (info.params) { /* float16 gradients times 2^-15 are exact: scale them back */
            float *scaled = floats(info.params);
            mp_f16 *h = (mp_f16 *)zalloc(info.params * sizeof(mp_f16));
            size_t j;
            for (j = 0; j < info.params; j++) scaled[j] = g[off + j] * scale;
            mp_convert(h, MP_FLOAT16, scaled, MP_FLOAT32, info.params, NULL);
            OK(mp_model_numerics(m, i, MP_NUMERICS_SCALED_GRADIENTS, &got), m);
            want = stats_of(h, MP_FLOAT16, info.params, MP_FLOAT16);
            CHECK(same_stats(&got, &want));
            CHECK(got.hist[bin_of(10)] + got.hist[bin_of(-10)] != hist_total(&got)); /* a real spread */
            free(scaled);
            free(h);
        }
        off += info.params;
    }
    /* input gradients: the first layer has none, the others one per input */
    OK(mp_model_numerics(m, 0, MP_NUMERICS_INPUT_GRADIENTS, &got), m);
    CHECK_EQ(got.count, 0);
    OK(mp_model_numerics(m, 1, MP_NUMERICS_INPUT_GRADIENTS, &got), m);
    CHECK_EQ(got.count, BATCH * 16);
    /* as they are before layer 0's ReLU, which a step without diagnostics
       folds into this product (mp_gemm_args's relu_y): not zero wherever
       that ReLU's output is */
    OK(mp_model_numerics(m, 0, MP_NUMERICS_ACTIVATIONS, &want), m);
    CHECK(want.zeros > 0 && got.zeros < want.zeros);
    OK(mp_model_numerics(m, 3, MP_NUMERICS_INPUT_GRADIENTS, &got), m);
    CHECK_EQ(got.count, BATCH * CLASSES);
    CHECK(got.nan == 0 && got.inf == 0 && got.max_abs > 0.0f);
    OK(mp_model_numerics(m, 3, MP_NUMERICS_WEIGHTS, &got), m);
    CHECK_EQ(got.count, 0); /* the softmax has no weights */
    /* the output: the last layer's activations */
    OK(mp_output(m, &out), m);
    OK(mp_model_numerics(m, 3, MP_NUMERICS_ACTIVATIONS, &got), m);
    want = stats_of(out.data, out.dtype, mp_tensor_count(&out), MP_FLOAT16);
    CHECK(same_stats(&got, &want));
    CHECK_EQ(got.count, BATCH * CLASSES);
    OK(mp_model_numerics(m, 0, MP_NUMERICS_ACTIVATIONS, &got), m);
    CHECK_EQ(got.count, BATCH * 16);
    CHECK(got.zeros > 0 && got.zeros < got.count); /* relu */

    /* an inference pass takes none */
    OK(mp_model_numerics(m, 0, MP_NUMERICS_ACTIVATIONS, &want), m);
    OK(forward_rows(m, data_x + 7 * FEATURES, BATCH, 0), m);
    OK(mp_model_numerics(m, 0, MP_NUMERICS_ACTIVATIONS, &got), m);
    CHECK(same_stats(&got, &want));

    /* bad queries */
    CHECK_EQ(mp_model_numerics(m, 4, MP_NUMERICS_WEIGHTS, &got), MP_ERR_ARG);
    CHECK_EQ(mp_model_numerics(m, -1, MP_NUMERICS_WEIGHTS, &got), MP_ERR_ARG);
    CHECK_EQ(mp_model_numerics(m, 0, MP_NUMERICS_KIND_COUNT, &got), MP_ERR_ARG);
    CHECK_EQ(mp_model_numerics(m, 0, MP_NUMERICS_WEIGHTS, NULL), MP_ERR_NULL);
    CHECK(strcmp(mp_numerics_kind_name(MP_NUMERICS_INPUT_GRADIENTS), "input_grads") == 0);
    CHECK(mp_numerics_kind_name(MP_NUMERICS_KIND_COUNT) == NULL);

    /* off again: queries have nothing */
    OK(mp_model_set_numerics(m, NULL), m);
    CHECK_EQ(mp_model_numerics(m, 0, MP_NUMERICS_WEIGHTS, &got), MP_ERR_STATE);
    CHECK_EQ(mp_model_numerics_step(m), 0);
    free(w);
    free(g);
    mp_model_destroy(m);
}

/* Counts the CSV file's lines; checks every row of `step` against the
   model's statistics of that step. */
static int read_csv(const char *path, const mp_model *m, uint64_t step, int *rows_of_step, int *columns) {
    FILE *f = fopen(path, "r");
    static char line[4096];
    int lines = 0;
    *rows_of_step = 0;
    *columns = 0;
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) {
        char *field[12 + MP_HIST_BINS], *p = line;
        int n = 0, i, layer = -1, k;
        if (lines++ == 0) { /* the header */
            for (p = line, n = 1; *p; p++) n += *p == ',';
            *columns = n;
            static const char head[] = "step,layer,tensor,count,zeros,nan,inf,overflow,underflow,subnormal,"
                                       "min_abs,max_abs,lt-50,e-50,e-49,";
            CHECK(strncmp(line, head, sizeof head - 1) == 0);
            CHECK(strstr(line, ",e19,ge20\n") != NULL);
            continue;
        }
        while (n < 12 + MP_HIST_BINS) {
            field[n++] = p;
            p = strpbrk(p, ",\n");
            if (!p) break;
            *p++ = '\0';
        }
        CHECK_EQ(n, 12 + MP_HIST_BINS);
        if (n != 12 + MP_HIST_BINS || strtoull(field[0], NULL, 10) != step) continue;
        for (i = 0; i < mp_model_layer_count(m); i++) {
            mp_layer_info info;
            mp_model_layer_info(m, i, &info);
            if (strcmp(info.name, field[1]) == 0) layer = i;
        }
        for (k = 0; k < MP_NUMERICS_KIND_COUNT; k++)
            if (strcmp(mp_numerics_kind_name((mp_numerics_kind)k), field[2]) == 0) break;
        CHECK(layer >= 0 && k < MP_NUMERICS_KIND_COUNT);
        if (layer >= 0 && k < MP_NUMERICS_KIND_COUNT) {
            mp_tensor_stats s;
            int bad = 0, b;
            double lo = strtod(field[10], NULL), hi = strtod(field[11], NULL);
            OK(mp_model_numerics(m, layer, (mp_numerics_kind)k, &s), m);
            (*rows_of_step)++;
            CHECK(strtoull(field[3], NULL, 10) == s.count && strtoull(field[4], NULL, 10) == s.zeros &&
                  strtoull(field[5], NULL, 10) == s.nan && strtoull(field[6], NULL, 10) == s.inf &&
                  strtoull(field[7], NULL, 10) == s.overflow && strtoull(field[8], NULL, 10) == s.underflow &&
                  strtoull(field[9], NULL, 10) == s.subnormal);
            CHECK(fabs(lo - s.min_abs) <= 1e-6 * s.min_abs && fabs(hi - s.max_abs) <= 1e-6 * s.max_abs);
            for (b = 0; b < MP_HIST_BINS; b++) bad += strtoull(field[12 + b], NULL, 10) != s.hist[b];
            CHECK_EQ(bad, 0);
        }
    }
    fclose(f);
    return lines;
}

/* A fit with statistics every 3 steps (8 steps: 3 and 6), logged to CSV. */
static void test_fit_every(void) {
    mp_model *m = make_mlp("mixed_float16", MP_SPARSE_CATEGORICAL_CROSSENTROPY, MP_LOSS_SCALE_AUTO);
    mp_numerics_desc nd;
    mp_fit_desc fd = fit_desc(NULL);
    mp_tensor_stats s, again;
    mp_loss_scale_advice adv;
    mp_logs logs;
    char path[256], report[8192], small[64];
    int rows, columns, lines;
    if (!m) return;
    snprintf(path, sizeof path, "%s/mixprec_diag_%ld.csv", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (long)getpid());
    memset(&nd, 0, sizeof nd);
    nd.every = 3;
    nd.csv_path = path;
    CHECK_EQ(mp_numerics_report(m, report, sizeof report), MP_ERR_STATE);
    OK(mp_model_set_numerics(m, &nd), m);
    CHECK_EQ(mp_numerics_report(m, report, sizeof report), MP_ERR_STATE);
    CHECK_EQ(mp_model_recommend_loss_scale(m, &adv), MP_ERR_STATE);
    OK(mp_model_fit(m, &fd), m);
    CHECK_EQ(mp_model_numerics_step(m), 6);
    OK(mp_model_numerics(m, 2, MP_NUMERICS_GRADIENTS, &s), m);
    CHECK_EQ(s.count, 16 * CLASSES + CLASSES);
    CHECK(s.max_abs > 0.0f && s.nan == 0 && s.inf == 0);
    /* 16 rows a step: 4 activations, 3 weights, 3 scaled and 3 unscaled gradients, 3 input gradients */
    lines = read_csv(path, m, 6, &rows, &columns);
    CHECK_EQ(lines, 1 + 2 * 16);
    CHECK_EQ(rows, 16);
    CHECK_EQ(columns, 12 + MP_HIST_BINS);

    /* evaluate takes no statistics */
    OK(mp_model_evaluate(m, &fd.data, BATCH, &logs), m);
    OK(mp_model_numerics(m, 2, MP_NUMERICS_GRADIENTS, &again), m);
    CHECK(same_stats(&s, &again));
    CHECK_EQ(mp_model_numerics_step(m), 6);

    /* the report and the advice */
    OK(mp_numerics_report(m, report, sizeof report), m);
    CHECK(strncmp(report, "Numerics at step 6 ", 19) == 0);
    CHECK(strstr(report, "\nlayer            tensor        min|x|     max|x|     zero%   over%   under%  sub%    "
                         "inf     nan\n") != NULL);
    CHECK(strstr(report, "\ndense_2          grads         ") != NULL);
    CHECK(strstr(report, "\nfloat16                        00000000000000000000000000sssssssssss"
                         "------------------------------IIIII\n") != NULL);
    CHECK(strstr(report, "Recommended loss scale: 2^") != NULL);
    OK(mp_model_recommend_loss_scale(m, &adv), m);
    CHECK(adv.scale >= 1.0f && adv.max_abs * adv.scale <= 32752.0f && adv.max_abs * adv.scale * 2.0f > 32752.0f);
    CHECK_EQ(mp_numerics_report(m, small, sizeof small), MP_ERR_SIZE);
    CHECK(strlen(small) == sizeof small - 1);
    remove(path);

    /* a step count not a multiple: 8 more steps, statistics at 9, 12, 15 */
    nd.csv_path = NULL;
    nd.target = MP_BFLOAT16;
    OK(mp_model_set_numerics(m, &nd), m);
    OK(mp_model_fit(m, &fd), m);
    CHECK_EQ(mp_model_numerics_step(m), 15);
    OK(mp_numerics_report(m, report, sizeof report), m);
    CHECK(strstr(report, "bfloat16 keeps float32's exponent range") != NULL);
    CHECK(strstr(report, "\nbfloat16                       -----") != NULL);
    mp_model_destroy(m);
}

/* ======================================================================== */
/* check-numerics */

static void test_check_forward(void) {
    mp_model *m = make_mlp("mixed_float16", MP_SPARSE_CATEGORICAL_CROSSENTROPY, MP_LOSS_SCALE_AUTO);
    mp_numerics_desc nd;
    mp_fit_desc fd = fit_desc(NULL);
    mp_tensor_stats s;
    char want[256], report[4096];
    const char *detail;
    size_t n, i;
    float *w, *after;
    if (!m) return;
    memset(&nd, 0, sizeof nd);
    nd.check = 1;
    nd.history = 2;
    OK(mp_model_set_numerics(m, &nd), m);
    OK(mp_model_fit(m, &fd), m); /* 8 clean steps */
    CHECK_EQ(mp_model_numerics_step(m), 8);
    n = mp_model_param_count(m);
    w = floats(n);
    after = floats(n);
    OK(mp_model_get_weights(m, w, n), m);
    for (i = FEATURES * 16 + 16; i < FEATURES * 16 + 16 + 16 * 16; i++) w[i] *= 1e5f; /* dense_1's kernel */
    OK(mp_model_set_weights(m, w, n), m);
    CHECK_EQ(mp_model_fit(m, &fd), MP_ERR_NONFINITE);
    CHECK_EQ(mp_model_numerics_step(m), 9);
    OK(mp_model_numerics(m, 1, MP_NUMERICS_ACTIVATIONS, &s), m);
    CHECK(s.inf > 0 && s.nan == 0);
    snprintf(want, sizeof want, "check-numerics: layer dense_1 (Dense) produced %llu Inf and 0 NaN in its forward "
             "pass at step 9 (%s)", (unsigned long long)s.inf, mp_status_message(MP_ERR_NONFINITE));
    CHECK(strcmp(mp_model_error(m), want) == 0);
    if (strcmp(mp_model_error(m), want) != 0) fprintf(stderr, "    got: %s\n", mp_model_error(m));
    OK(mp_model_get_weights(m, after, n), m);
    CHECK(memcmp(w, after, n * sizeof(float)) == 0); /* the step stopped before any update */
    OK(mp_model_numerics(m, 2, MP_NUMERICS_ACTIVATIONS, &s), m);
    CHECK_EQ(s.count, 0); /* the layers after it took nothing */
    /* the report: the stop and the last 2 layers that ran */
    OK(mp_numerics_report(m, report, sizeof report), m);
    detail = strstr(want, " ("); /* the report starts with the sentence before the status's */
    CHECK(detail && strncmp(report, want, (size_t)(detail - want)) == 0);
    CHECK(strstr(report, "\ndense            activations") != NULL);
    CHECK(strstr(report, "\ndense_1          activations") != NULL);
    CHECK(strstr(report, "\ndense_1          weights") != NULL);
    CHECK(strstr(report, "dense_2") == NULL);
    /* again: the same step, as nothing was applied */
    CHECK_EQ(mp_model_fit(m, &fd), MP_ERR_NONFINITE);
    CHECK(strcmp(mp_model_error(m), want) == 0);
    /* the custom loop stops the same way */
    CHECK_EQ(forward_rows(m, data_x, BATCH, 1), MP_ERR_NONFINITE);
    CHECK(strstr(mp_model_error(m), "layer dense_1 (Dense) produced") != NULL);
    /* without check-numerics, nothing stops */
    nd.check = 0;
    nd.every = 1;
    OK(mp_model_set_numerics(m, &nd), m);
    OK(forward_rows(m, data_x, BATCH, 1), m);
    free(w);
    free(after);
    mp_model_destroy(m);
}

/* A loss gradient past 65504: without loss scaling the last Dense layer's
   backward pass stops the step; with it, the steps are skipped as usual. */
static void test_check_backward(void) {
    mp_model *m = make_mlp("mixed_float16", MP_MEAN_SQUARED_ERROR, MP_LOSS_SCALE_NONE);
    mp_numerics_desc nd;
    mp_fit_desc fd = fit_desc(data_t);
    mp_tensor_stats s;
    const mp_loss_scale *ls;
    size_t n;
    float *w, *after;
    if (!m) return;
    n = mp_model_param_count(m);
    w = floats(n);
    after = floats(n);
    memset(&nd, 0, sizeof nd);
    nd.check = 1;
    OK(mp_model_set_numerics(m, &nd), m);
    OK(mp_model_get_weights(m, w, n), m);
    CHECK_EQ(mp_model_fit(m, &fd), MP_ERR_NONFINITE);
    CHECK(strncmp(mp_model_error(m), "check-numerics: layer dense_2 (Dense) produced ", 47) == 0);
    CHECK(strstr(mp_model_error(m), " NaN in its backward pass at step 1") != NULL);
    OK(mp_model_numerics(m, 2, MP_NUMERICS_SCALED_GRADIENTS, &s), m);
    CHECK(s.inf + s.nan > 0);
    OK(mp_model_get_weights(m, after, n), m);
    CHECK(memcmp(w, after, n * sizeof(float)) == 0);
    mp_model_destroy(m);

    m = make_mlp("mixed_float16", MP_MEAN_SQUARED_ERROR, MP_LOSS_SCALE_ON);
    if (!m) { free(w); free(after); return; }
    OK(mp_model_set_numerics(m, &nd), m);
    OK(mp_model_fit(m, &fd), m);
    ls = mp_model_loss_scale(m);
    CHECK(ls && ls->skipped_steps == 8);
    CHECK_EQ(mp_model_numerics_step(m), 8);
    OK(mp_model_numerics(m, 2, MP_NUMERICS_SCALED_GRADIENTS, &s), m);
    CHECK(s.inf + s.nan > 0); /* counted, not stopped at */
    free(w);
    free(after);
    mp_model_destroy(m);
}

static void test_set_errors(void) {
    mp_model *m = make_mlp("float32", MP_SPARSE_CATEGORICAL_CROSSENTROPY, MP_LOSS_SCALE_AUTO);
    mp_numerics_desc nd;
    mp_memory_info before;
    if (!m) return;
    memset(&nd, 0, sizeof nd);
    CHECK_EQ(mp_model_set_numerics(NULL, &nd), MP_ERR_NULL);
    nd.every = -1;
    CHECK_EQ(mp_model_set_numerics(m, &nd), MP_ERR_ARG);
    CHECK(strstr(mp_model_error(m), "every") != NULL);
    nd.every = 1;
    nd.history = -2;
    CHECK_EQ(mp_model_set_numerics(m, &nd), MP_ERR_ARG);
    nd.history = 0;
    nd.target = MP_DTYPE_COUNT;
    CHECK_EQ(mp_model_set_numerics(m, &nd), MP_ERR_ARG);
    nd.target = MP_FLOAT16;
    nd.csv_path = "/nonexistent-dir/for/numerics.csv";
    before = mp_get_memory_info();
    CHECK_EQ(mp_model_set_numerics(m, &nd), MP_ERR_IO);
    CHECK(strstr(mp_model_error(m), "/nonexistent-dir/for/numerics.csv") != NULL);
    CHECK_EQ(mp_get_memory_info().current, before.current); /* nothing kept */
    CHECK_EQ(mp_model_numerics_step(m), 0);
    /* no memory: the diagnostics stay as they were (here: every step) */
    nd.csv_path = NULL;
    OK(mp_model_set_numerics(m, &nd), m);
    fail_next_alloc = 1;
    nd.every = 5;
    CHECK_EQ(mp_model_set_numerics(m, &nd), MP_ERR_ALLOC);
    CHECK(strstr(mp_model_error(m), "numerics statistics") != NULL);
    OK(forward_rows(m, data_x, BATCH, 1), m);
    CHECK_EQ(mp_model_numerics_step(m), 1);
    mp_model_destroy(m);
}

/* ======================================================================== */
/* The Tensor Core advisor */

static void test_advisor(void) {
    mp_model_desc md;
    mp_model *m = NULL;
    char buf[2048], tiny[16];
    int issues = -1, policy;
    for (policy = 0; policy < 2; policy++) {
        memset(&md, 0, sizeof md);
        md.input_shape[0] = 784;
        OK(mp_set_global_policy_name(policy ? "mixed_float16" : "float32"), NULL);
        OK(mp_model_create(&m, &md), NULL);
        OK(mp_model_add(m, mp_dense(1000, MP_RELU)), m);
        OK(mp_model_add(m, mp_dense(10, MP_SOFTMAX)), m);
        mp_set_global_policy_name("float32");
        OK(mp_model_tensor_core_advice(m, 128, buf, sizeof buf, &issues), m);
        CHECK_EQ(issues, 1);
        CHECK(strstr(buf, policy ? "\n  dense_1 (Dense, 16-bit compute): units 10 -> pad to 16\n"
                                 : "\n  dense_1 (Dense, float32: for when it computes in 16 bits): units 10 -> pad to 16\n") != NULL);
        CHECK(strstr(buf, "784") == NULL && strstr(buf, "1000") == NULL);
        OK(mp_model_tensor_core_advice(m, 100, buf, sizeof buf, &issues), m);
        CHECK_EQ(issues, 2);
        CHECK(strstr(buf, "\n  batch size 100 -> pad to 104\n  2 findings.\n") != NULL);
        CHECK_EQ(mp_model_tensor_core_advice(m, 100, tiny, sizeof tiny, &issues), MP_ERR_SIZE);
        CHECK_EQ(issues, 2);
        CHECK_EQ(mp_model_tensor_core_advice(m, -1, buf, sizeof buf, &issues), MP_ERR_ARG);
        CHECK_EQ(mp_model_tensor_core_advice(m, 8, NULL, 4, &issues), MP_ERR_NULL);
        mp_model_destroy(m);
    }
    /* a conv net: 1 input channel, 6 filters; then a Dense of 16 on 5*5*16 = 400 features */
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 28, md.input_shape[1] = 28, md.input_shape[2] = 1;
    OK(mp_set_global_policy_name("mixed_bfloat16"), NULL);
    OK(mp_model_create(&m, &md), NULL);
    OK(mp_model_add(m, mp_conv2d(6, 5, 5, MP_VALID, MP_RELU)), m);
    OK(mp_model_add(m, mp_max_pooling2d(2, 2)), m);
    OK(mp_model_add(m, mp_conv2d(16, 5, 5, MP_VALID, MP_RELU)), m);
    OK(mp_model_add(m, mp_max_pooling2d(2, 2)), m);
    OK(mp_model_add(m, mp_flatten()), m);
    OK(mp_model_add(m, mp_dense(16, MP_RELU)), m);
    mp_set_global_policy_name("float32");
    OK(mp_model_tensor_core_advice(m, 0, buf, sizeof buf, NULL), m);
    OK(mp_model_tensor_core_advice(m, 0, buf, sizeof buf, &issues), m);
    CHECK_EQ(issues, 3);
    CHECK(strstr(buf, "\n  conv2d (Conv2D, 16-bit compute): input channels 1 -> pad to 8\n"
                      "  conv2d (Conv2D, 16-bit compute): filters 6 -> pad to 8\n"
                      "  conv2d_1 (Conv2D, 16-bit compute): input channels 6 -> pad to 8\n  3 findings.\n") != NULL);
    mp_model_destroy(m);
    /* nothing to pad */
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 64;
    OK(mp_model_create(&m, &md), NULL);
    OK(mp_model_add(m, mp_dense(32, MP_RELU)), m);
    OK(mp_model_tensor_core_advice(m, 256, buf, sizeof buf, &issues), m);
    CHECK_EQ(issues, 0);
    CHECK(strstr(buf, "nothing to pad") != NULL);
    mp_model_destroy(m);
}

int main(int argc, char **argv) {
    mp_memory_info start = mp_get_memory_info();
    check_args(argc, argv);
    make_data();
    RUN(test_stats_float32());
    RUN(test_stats_16bit_sources());
    RUN(test_stats_wide());
    RUN(test_recommend());
    RUN(test_custom_loop_step());
    RUN(test_fit_every());
    RUN(test_check_forward());
    RUN(test_check_backward());
    RUN(test_set_errors());
    RUN(test_advisor());
    CHECK_EQ(mp_get_memory_info().current, start.current); /* no leak */
    return check_done("test_diagnostics");
}
