/* test_train.c - tests of mixprec's models: finite-difference gradients of
   every layer, activation and loss in float32 (strided convolutions after
   another layer, where the input gradient runs, too); a max-pool tie's
   gradient to the first maximum; crossentropy from logits spread past
   expf's range; each optimizer step by step against Keras's formulas;
   forward passes that follow Keras's layouts and formulas; mixed_float16 and mixed_bfloat16 forward
   passes against float32; policy semantics (per-layer policies, float32
   weights read as the compute dtype, integer labels never cast); the
   loss-scale state machine step by step; a skipped step that touches no
   weight and no optimizer slot; training to high accuracy with fit under
   each policy; memory accounting. Runs in a few seconds, also under
   ASan/UBSan.

   With a directory of uncompressed Fashion-MNIST IDX files as argv[1]
   (train-images-idx3-ubyte, ...), it also trains a 784-256-256-10 MLP on it
   under float32 and mixed_float16 (4 epochs each, about 15-30 s); without
   one, that part prints a `skip:` line. */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */
#ifndef TEST_LINKS_MIXPREC /* defined: the implementation is another object's (tests/header_only.c) */
#define MIXPREC_IMPLEMENTATION
#endif
#include "../mixprec.h"
#include "check.h"
#include "helpers.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ======================================================================== */
/* Helpers */

static void fill(float *p, size_t n, float lo, float hi) {
    size_t i;
    for (i = 0; i < n; i++) p[i] = uniform(lo, hi);
}
static float f32_of_bits(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}


/* |got - want| <= abs_tol + rel * |want|; NaN fails. */
static int near_report(double got, double want, double rel, double abs_tol, const char *file, int line,
                       const char *what) {
    int ok = fabs(got - want) <= abs_tol + rel * fabs(want);
    if (!check_report(ok, file, line, what)) fprintf(stderr, "    got %.9g, want %.9g\n", got, want);
    return ok;
}
#define CHECK_NEAR(got, want, rel, abs_tol) \
    near_report((got), (want), (rel), (abs_tol), __FILE__, __LINE__, #got " ~ " #want)


static int policy_is(mp_policy p, const char *name) {
    const char *n = mp_policy_name(p);
    return n && strcmp(n, name) == 0;
}

static mp_layer_desc with_dtype(mp_layer_desc d, const char *dtype) { d.dtype = dtype; return d; }
static mp_layer_desc with_strides(mp_layer_desc d, int sh, int sw) {
    d.strides[0] = sh, d.strides[1] = sw;
    return d;
}
static mp_layer_desc without_bias(mp_layer_desc d) { d.no_bias = 1; return d; }

/* new_model (helpers.h), built. */
static mp_model *make_model(const char *policy, const int *shape, const mp_layer_desc *layers, int count) {
    mp_model *m = new_model(policy, shape, layers, count);
    if (m && !OK(mp_model_build(m), m)) {
        mp_model_destroy(m);
        return NULL;
    }
    return m;
}

static int compile(mp_model *m, mp_loss loss, int from_logits, mp_optimizer_kind opt, float lr,
                   mp_loss_scale_mode mode) {
    mp_compile_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.loss = loss;
    cd.from_logits = from_logits;
    cd.optimizer.kind = opt;
    cd.optimizer.learning_rate = lr;
    cd.metrics = loss == MP_MEAN_SQUARED_ERROR ? MP_METRIC_NONE : MP_METRIC_ACCURACY;
    cd.loss_scale = mode;
    return OK(mp_model_compile(m, &cd), m);
}

/* The last forward's output as float32 into a new buffer; *count elements,
   *dtype its own dtype, shape its shape. NULL on failure. */
static float *output_f32(const mp_model *m, size_t *count, mp_tensor *shape) {
    mp_tensor t;
    float *out;
    memset(&t, 0, sizeof t);
    if (!OK(mp_output(m, &t), m)) return NULL;
    *count = mp_tensor_count(&t);
    out = floats(*count);
    if (!OK(mp_convert(out, MP_FLOAT32, t.data, t.dtype, *count, NULL), m)) {
        free(out);
        return NULL;
    }
    if (shape) *shape = t;
    return out;
}

/* A batch of inputs and targets for a compiled model and its loss. */
typedef struct batch {
    float *x;
    int32_t *labels; /* sparse crossentropy */
    float *y;        /* the other losses */
    int n;
    mp_loss loss;
} batch;

static batch make_batch(const mp_model *m, mp_loss loss, int n) {
    size_t in = mp_model_input_size(m), k = mp_model_output_size(m), i, j;
    batch b;
    b.n = n;
    b.loss = loss;
    b.x = floats((size_t)n * in);
    b.labels = (int32_t *)zalloc((size_t)n * sizeof(int32_t));
    b.y = floats((size_t)n * k);
    fill(b.x, (size_t)n * in, -1.0f, 1.0f);
    for (i = 0; i < (size_t)n; i++) {
        double sum = 0.0;
        b.labels[i] = (int32_t)(rng_next() % (k ? k : 1));
        for (j = 0; j < k; j++) {
            float *y = &b.y[i * k + j];
            if (loss == MP_CATEGORICAL_CROSSENTROPY) *y = uniform(0.1f, 1.0f), sum += *y;
            else if (loss == MP_BINARY_CROSSENTROPY) *y = uniform(0.0f, 1.0f);
            else *y = uniform(-1.0f, 1.0f);
        }
        for (j = 0; sum > 0.0 && j < k; j++) b.y[i * k + j] = (float)(b.y[i * k + j] / sum);
    }
    return b;
}

static void free_batch(batch *b) {
    free(b->x);
    free(b->labels);
    free(b->y);
}

static const int32_t *labels_of(const batch *b) {
    return b->loss == MP_SPARSE_CATEGORICAL_CROSSENTROPY ? b->labels : NULL;
}
static const float *targets_of(const batch *b) {
    return b->loss == MP_SPARSE_CATEGORICAL_CROSSENTROPY ? NULL : b->y;
}

/* The training-mode loss at the model's current weights; NaN on failure. */
static float loss_of(mp_model *m, const batch *b) {
    float loss = NAN;
    if (forward_rows(m, b->x, b->n, 1) != MP_OK) return NAN;
    if (loss_rows(m, labels_of(b), targets_of(b), b->n, &loss, NULL) != MP_OK) return NAN;
    return loss;
}

/* One custom-loop pass to the float32 gradients (the guide's train_step
   without apply_gradients). */
static int gradients(mp_model *m, const batch *b, float *g, size_t n, float *loss) {
    float l;
    return OK(forward_rows(m, b->x, b->n, 1), m) &&
           OK(loss_rows(m, labels_of(b), targets_of(b), b->n, loss ? loss : &l, NULL), m) &&
           OK(mp_compute_scaled_gradients(m), m) && OK(mp_get_unscaled_gradients(m), m) &&
           OK(mp_get_gradients(m, g, n), m);
}

/* ======================================================================== */
/* 1. Finite-difference gradient checks (float32, no loss scaling) */

/* The shared check (helpers.h grad_check) reads a batch through these. */
static float fd_loss(mp_model *m, const void *b) { return loss_of(m, (const batch *)b); }
static int fd_gradients(mp_model *m, const void *b, float *g) {
    return gradients(m, (const batch *)b, g, mp_model_trainable_param_count(m), NULL);
}

typedef struct fd_case {
    char what[96];
    int shape[4];             /* input per sample, zero-terminated */
    mp_layer_desc layers[6];
    int count;
    mp_loss loss;
    int from_logits;
    int batch;
    float wscale; /* weights uniform in [-wscale, wscale] */
    int kink;     /* > 0: layers[0..kink) (made linear) feed a relu: kept >= 0.05 from 0 */
    int pool;     /* > 0: layers[0..pool) feed a 2x2 max-pool: window gaps kept >= 0.03 */
    float eps;
} fd_case;

static fd_case fd_base(const char *what, int in0, int in1, int in2) {
    fd_case c;
    memset(&c, 0, sizeof c);
    snprintf(c.what, sizeof c.what, "%s", what);
    c.shape[0] = in0, c.shape[1] = in1, c.shape[2] = in2;
    c.loss = MP_MEAN_SQUARED_ERROR;
    c.batch = 5;
    c.wscale = 0.8f;
    c.eps = 1e-2f;
    return c;
}

/* The output of the model made of layers[0..k), the last one linear, with
   the first weights of w, on x: what a relu or a max-pool sees. Counts no
   check (it may run many times): a failure shows as keep_off_kinks's. */
static float *prefix_output(const fd_case *c, int k, const float *w, const float *x, size_t *count,
                            mp_tensor *shape) {
    mp_layer_desc layers[6];
    mp_model_desc md;
    mp_model *p = NULL;
    mp_tensor t;
    float *out = NULL;
    int i, ok;
    memcpy(layers, c->layers, sizeof layers);
    layers[k - 1].activation = MP_LINEAR;
    memset(&md, 0, sizeof md);
    memset(&t, 0, sizeof t);
    for (i = 0; i < 3 && c->shape[i]; i++) md.input_shape[i] = c->shape[i];
    ok = mp_model_create(&p, &md) == MP_OK;
    for (i = 0; ok && i < k; i++) ok = mp_model_add(p, layers[i]) == MP_OK;
    ok = ok && mp_model_set_weights(p, w, mp_model_param_count(p)) == MP_OK &&
         forward_rows(p, x, c->batch, 1) == MP_OK && mp_output(p, &t) == MP_OK;
    if (ok) {
        *count = mp_tensor_count(&t);
        *shape = t;
        out = floats(*count);
        ok = mp_convert(out, MP_FLOAT32, t.data, t.dtype, *count, NULL) == MP_OK;
    }
    if (!ok) {
        fprintf(stderr, "    prefix model: %s\n", p ? mp_model_error(p) : "not created");
        free(out);
        out = NULL;
    }
    mp_model_destroy(p);
    return out;
}

/* Smallest gap between the largest and second largest of each 2x2 window
   of an [n, h, w, c] output. */
static float pool_gap(const float *o, const mp_tensor *t) {
    int n = t->shape[0], h = t->shape[1], w = t->shape[2], c = t->shape[3], b, i, j, ch, di;
    float gap = INFINITY;
    for (b = 0; b < n; b++)
        for (i = 0; i + 1 < h; i += 2)
            for (j = 0; j + 1 < w; j += 2)
                for (ch = 0; ch < c; ch++) {
                    float v[4], top = -INFINITY, second = -INFINITY;
                    for (di = 0; di < 4; di++) {
                        v[di] = o[(((size_t)b * h + i + di / 2) * w + j + di % 2) * c + ch];
                        if (v[di] > top) second = top, top = v[di];
                        else if (v[di] > second) second = v[di];
                    }
                    if (top - second < gap) gap = top - second;
                }
    return gap;
}

/* Resamples the inputs until no relu pre-activation sits near its kink and
   no max-pool window has a near tie. */
static int keep_off_kinks(const fd_case *c, const float *w, batch *b, size_t in) {
    int tries;
    for (tries = 0; tries < 500; tries++) {
        int fine = 1;
        size_t count = 0, i;
        mp_tensor t;
        float *o;
        if (c->kink) {
            if (!(o = prefix_output(c, c->kink, w, b->x, &count, &t))) return 0;
            for (i = 0; i < count; i++) fine &= fabsf(o[i]) >= 0.05f;
            free(o);
        }
        if (c->pool && fine) {
            if (!(o = prefix_output(c, c->pool, w, b->x, &count, &t))) return 0;
            fine = t.rank == 4 && pool_gap(o, &t) >= 0.03f;
            free(o);
        }
        if (fine) return 1;
        fill(b->x, (size_t)b->n * in, -1.0f, 1.0f);
    }
    return 0;
}

static void run_fd(const fd_case *c) {
    mp_model *m = make_model("float32", c->shape, c->layers, c->count);
    size_t n;
    float *w;
    batch b;
    if (!m) return;
    if (!compile(m, c->loss, c->from_logits, MP_SGD, 0.0f, MP_LOSS_SCALE_NONE)) goto out;
    n = mp_model_param_count(m);
    w = floats(n);
    fill(w, n, -c->wscale, c->wscale);
    b = make_batch(m, c->loss, c->batch);
    if (!check_report(keep_off_kinks(c, w, &b, mp_model_input_size(m)), __FILE__, __LINE__, c->what))
        fprintf(stderr, "    no input kept off the relu kinks / max-pool ties\n");
    else if (OK(mp_model_set_weights(m, w, n), m))
        grad_check(c->what, m, fd_loss, fd_gradients, &b, c->eps);
    free_batch(&b);
    free(w);
out:
    mp_model_destroy(m);
}

static const mp_activation all_activations[] = {MP_LINEAR, MP_RELU, MP_SIGMOID, MP_TANH, MP_GELU, MP_SOFTMAX};
#define N_ACTIVATIONS (int)(sizeof all_activations / sizeof all_activations[0])

/* Dense with each activation (the activation is the model's output), MSE. */
static void test_grad_dense_activations(void) {
    int i;
    for (i = 0; i < N_ACTIVATIONS; i++) {
        char what[96];
        fd_case c;
        snprintf(what, sizeof what, "Dense(4, %s), MSE", mp_activation_name(all_activations[i]));
        c = fd_base(what, 3, 0, 0);
        c.layers[0] = mp_dense(4, all_activations[i]);
        c.count = 1;
        c.kink = all_activations[i] == MP_RELU;
        run_fd(&c);
    }
    {   /* use_bias=False, and a deeper chain of activations */
        fd_case c = fd_base("Dense(4, tanh, no bias), MSE", 3, 0, 0);
        c.layers[0] = without_bias(mp_dense(4, MP_TANH));
        c.count = 1;
        run_fd(&c);
        c = fd_base("Dense(6, gelu) -> Dense(5, sigmoid) -> Dense(4, softmax), sparse CE", 3, 0, 0);
        c.layers[0] = mp_dense(6, MP_GELU);
        c.layers[1] = mp_dense(5, MP_SIGMOID);
        c.layers[2] = mp_dense(4, MP_SOFTMAX);
        c.count = 3;
        c.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
        run_fd(&c);
    }
}

/* Activation layers between two Dense layers, MSE. */
static void test_grad_activation_layers(void) {
    int i;
    for (i = 0; i < N_ACTIVATIONS; i++) {
        char what[96];
        fd_case c;
        snprintf(what, sizeof what, "Dense(5) -> Activation(%s) -> Dense(3), MSE",
                 mp_activation_name(all_activations[i]));
        c = fd_base(what, 3, 0, 0);
        c.layers[0] = mp_dense(5, MP_LINEAR);
        c.layers[1] = mp_activation_layer(all_activations[i]);
        c.layers[2] = mp_dense(3, MP_LINEAR);
        c.count = 3;
        c.batch = 4;
        c.kink = all_activations[i] == MP_RELU ? 1 : 0;
        run_fd(&c);
    }
}

/* Conv2D valid and same, strides 1 and 2 (square and not), MaxPooling2D,
   Flatten: conv -> [pool] -> Flatten -> Dense(2), MSE. */
static void test_grad_conv(void) {
    static const struct {
        const char *what;
        int h, w, kh, kw, sh, sw;
        mp_padding pad;
        mp_activation act;
        int pool;
    } cases[] = {
        {"Conv2D 3x3 valid stride 1 tanh, 5x5x2", 5, 5, 3, 3, 1, 1, MP_VALID, MP_TANH, 0},
        {"Conv2D 3x3 same stride 1, 5x5x2", 5, 5, 3, 3, 1, 1, MP_SAME, MP_LINEAR, 0},
        {"Conv2D 3x3 valid stride 2, 5x5x2", 5, 5, 3, 3, 2, 2, MP_VALID, MP_LINEAR, 0},
        {"Conv2D 3x3 same stride 2 relu, 6x6x2 (uneven padding)", 6, 6, 3, 3, 2, 2, MP_SAME, MP_RELU, 0},
        {"Conv2D 2x3 same strides (1,2) sigmoid, 5x6x2", 5, 6, 2, 3, 1, 2, MP_SAME, MP_SIGMOID, 0},
        {"Conv2D 2x3 valid strides (2,1) gelu, 5x6x2", 5, 6, 2, 3, 2, 1, MP_VALID, MP_GELU, 0},
        {"Conv2D 3x3 valid -> MaxPooling2D 2x2, 6x6x2", 6, 6, 3, 3, 1, 1, MP_VALID, MP_LINEAR, 1},
        {"Conv2D 3x3 same -> MaxPooling2D 2x2 (odd size), 5x5x2", 5, 5, 3, 3, 1, 1, MP_SAME, MP_LINEAR, 1},
    };
    size_t i;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fd_case c = fd_base(cases[i].what, cases[i].h, cases[i].w, 2);
        int k = 0;
        c.layers[k++] = with_strides(mp_conv2d(3, cases[i].kh, cases[i].kw, cases[i].pad, cases[i].act),
                                     cases[i].sh, cases[i].sw);
        if (cases[i].pool) c.layers[k++] = mp_max_pooling2d(2, 2);
        c.layers[k++] = mp_flatten();
        c.layers[k++] = mp_dense(2, MP_LINEAR);
        c.count = k;
        c.batch = 2;
        c.wscale = 0.4f;
        c.kink = cases[i].act == MP_RELU;
        c.pool = cases[i].pool;
        if (cases[i].pool) c.eps = 5e-3f; /* a smaller step keeps each window's winner */
        run_fd(&c);
    }
}

/* A strided Conv2D after another layer, where the convolution's input
   gradient (col2im) runs (a first layer's is never needed): strides
   (1, 2), (2, 1), (2, 2) and (3, 2), valid and same, kernels not square,
   on inputs neither square nor a multiple of the strides; then a max-pool
   between two convolutions, whose gradient reaches the first. */
static void test_grad_conv_stack(void) {
    static const struct {
        const char *what;
        int h, w, kh, kw, sh, sw;
        mp_padding pad;
    } cases[] = {
        {"Conv2D 3x3 -> Conv2D 2x3 valid strides (1,2), 6x7x2", 6, 7, 2, 3, 1, 2, MP_VALID},
        {"Conv2D 3x3 -> Conv2D 3x2 valid strides (2,1), 7x6x2", 7, 6, 3, 2, 2, 1, MP_VALID},
        {"Conv2D 3x3 -> Conv2D 3x3 same strides (2,2), 7x5x2", 7, 5, 3, 3, 2, 2, MP_SAME},
        {"Conv2D 3x3 -> Conv2D 2x2 same strides (3,2), 7x6x2", 7, 6, 2, 2, 3, 2, MP_SAME},
        {"Conv2D 3x3 -> Conv2D 3x2 same (padding 1 top, 0 left), 6x5x2", 6, 5, 3, 2, 1, 1, MP_SAME},
        {"Conv2D 3x3 -> Conv2D 2x3 same (padding 0 top, 1 left), 5x6x2", 5, 6, 2, 3, 1, 1, MP_SAME},
    };
    size_t i;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fd_case c = fd_base(cases[i].what, cases[i].h, cases[i].w, 2);
        c.layers[0] = mp_conv2d(3, 3, 3, MP_SAME, MP_TANH);
        c.layers[1] = with_strides(mp_conv2d(2, cases[i].kh, cases[i].kw, cases[i].pad, MP_LINEAR), cases[i].sh,
                                   cases[i].sw);
        c.layers[2] = mp_flatten();
        c.layers[3] = mp_dense(2, MP_LINEAR);
        c.count = 4;
        c.batch = 2;
        c.wscale = 0.4f;
        run_fd(&c);
    }
    {
        fd_case c = fd_base("Conv2D 3x3 -> MaxPooling2D 2x2 -> Conv2D 2x2 strides (1,2), 6x6x2", 6, 6, 2);
        c.layers[0] = mp_conv2d(2, 3, 3, MP_SAME, MP_LINEAR);
        c.layers[1] = mp_max_pooling2d(2, 2);
        c.layers[2] = with_strides(mp_conv2d(2, 2, 2, MP_VALID, MP_LINEAR), 1, 2);
        c.layers[3] = mp_flatten();
        c.layers[4] = mp_dense(2, MP_LINEAR);
        c.count = 5;
        c.batch = 1; /* few windows: an input with no near tie is soon found */
        c.wscale = 0.4f;
        c.pool = 1;
        c.eps = 5e-3f;
        run_fd(&c);
    }
}

/* A max-pool window with two equal maxima passes the gradient to the first
   in row-major order, as TensorFlow's MaxPoolGrad (the one its forward
   scan keeps, taking a value only when it is greater): a 1x1 Conv2D adds
   two channels, so that tied outputs come from different inputs and the
   kernel's gradient shows which one the pool chose. Sample 1 ties at (0, 1)
   and (1, 0), sample 2 at (0, 0) and (1, 1); MSE against 0. */
static void test_max_pool_tie(void) {
    static const int shape[] = {2, 2, 2, 0};
    static const float x[2 * 8] = {0.25f, 0.25f, 1, 0, 0, 1, 0.5f, 0, /* sums 0.5, 1, 1, 0.5 */
                                   0, 2, 0, 0, 0, 0, 2, 0};           /* sums 2, 0, 0, 2 */
    static const float y[2] = {0, 0};
    const float w[3] = {1, 1, 0}; /* kernel [1, 1, 2, 1], bias */
    float g[3] = {0, 0, 0}, loss = NAN;
    mp_layer_desc layers[3];
    batch b;
    mp_model *m;
    layers[0] = mp_conv2d(1, 1, 1, MP_VALID, MP_LINEAR);
    layers[1] = mp_max_pooling2d(2, 2);
    layers[2] = mp_flatten();
    if (!(m = make_model("float32", shape, layers, 3))) return;
    b.x = (float *)x, b.labels = NULL, b.y = (float *)y, b.n = 2, b.loss = MP_MEAN_SQUARED_ERROR;
    if (compile(m, MP_MEAN_SQUARED_ERROR, 0, MP_SGD, 0.0f, MP_LOSS_SCALE_NONE) && OK(mp_model_set_weights(m, w, 3), m) &&
        gradients(m, &b, g, 3, &loss)) {
        /* outputs 1 and 2: loss (1 + 4) / 2; d loss / d output 1 and 2, to the inputs (1, 0) and (0, 2) */
        CHECK(loss == 2.5f);
        if (!CHECK(g[0] == 1.0f && g[1] == 4.0f && g[2] == 3.0f))
            fprintf(stderr, "    kernel gradient (%g, %g), bias %g; want (1, 4), 3 (the last maxima: (4, 1))\n",
                    (double)g[0], (double)g[1], (double)g[2]);
    }
    mp_model_destroy(m);
}

/* Dropout with rate 0 in training is the identity. */
static void test_grad_dropout_zero(void) {
    fd_case c = fd_base("Dense(4, tanh) -> Dropout(0) -> Dense(2), training, MSE", 3, 0, 0);
    c.layers[0] = mp_dense(4, MP_TANH);
    c.layers[1] = mp_dropout(0.0f);
    c.layers[2] = mp_dense(2, MP_LINEAR);
    c.count = 3;
    run_fd(&c);
}

/* Every loss, from probabilities and from logits. */
static void test_grad_losses(void) {
    static const struct {
        const char *what;
        mp_loss loss;
        int from_logits, units;
        mp_activation act;
    } cases[] = {
        {"sparse categorical CE from softmax probs", MP_SPARSE_CATEGORICAL_CROSSENTROPY, 0, 4, MP_SOFTMAX},
        {"sparse categorical CE from logits", MP_SPARSE_CATEGORICAL_CROSSENTROPY, 1, 4, MP_LINEAR},
        {"categorical CE from softmax probs", MP_CATEGORICAL_CROSSENTROPY, 0, 4, MP_SOFTMAX},
        {"categorical CE from logits", MP_CATEGORICAL_CROSSENTROPY, 1, 4, MP_LINEAR},
        {"binary CE from sigmoid probs", MP_BINARY_CROSSENTROPY, 0, 3, MP_SIGMOID},
        {"binary CE from logits", MP_BINARY_CROSSENTROPY, 1, 3, MP_LINEAR},
        {"mean squared error", MP_MEAN_SQUARED_ERROR, 0, 3, MP_LINEAR},
    };
    size_t i;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fd_case c = fd_base(cases[i].what, 3, 0, 0);
        c.layers[0] = mp_dense(cases[i].units, cases[i].act);
        c.count = 1;
        c.loss = cases[i].loss;
        c.from_logits = cases[i].from_logits;
        c.batch = 6;
        run_fd(&c);
    }
}

/* Dropout(rate) in training: every output is 0 or 1 / (1 - rate) times its
   input (Keras's scaling), about a fraction rate are dropped, the backward
   pass uses the same mask and scale, each call draws a new mask, and
   inference is the identity. Dense(64) on one input feature: its kernel is
   [1, 64] whatever the layout, so the expected values are plain
   arithmetic. Rates other than 0.5 tell 1 / (1 - rate) from 1 / rate. */
static void test_dropout_mask(float rate) {
    enum { B = 8, U = 64 };
    static const int shape[] = {1, 0};
    mp_layer_desc layers[2];
    float w[2 * U], x[B], y[B * U], g[2 * U], pre[B * U], *out = NULL, *out2 = NULL, *out0 = NULL;
    double want_loss = 0.0, gw[U] = {0}, gb[U] = {0};
    float loss = NAN, scale = 1.0f / (1.0f - rate);
    int b, j, bad = 0, kept = 0, differ = 0, bad0 = 0;
    double expect_kept = B * U * (1.0 - rate), sigma = sqrt(B * U * rate * (1.0 - rate));
    char detail[160] = "";
    size_t count = 0, count2 = 0, count0 = 0;
    mp_model *m;
    layers[0] = mp_dense(U, MP_LINEAR);
    layers[1] = mp_dropout(rate);
    if (!(m = make_model("float32", shape, layers, 2))) return;
    if (!compile(m, MP_MEAN_SQUARED_ERROR, 0, MP_SGD, 0.0f, MP_LOSS_SCALE_NONE)) goto out;
    fill(w, 2 * U, 0.5f, 1.5f); /* kernel then bias: every pre-activation >= 0.75 */
    fill(x, B, 0.5f, 1.5f);
    fill(y, B * U, -1.0f, 1.0f);
    for (b = 0; b < B; b++)
        for (j = 0; j < U; j++) pre[b * U + j] = x[b] * w[j] + w[U + j];
    if (!OK(mp_model_set_weights(m, w, 2 * U), m) || !OK(forward_rows(m, x, B, 1), m) ||
        !(out = output_f32(m, &count, NULL)) || !CHECK(count == B * U))
        goto out;
    for (b = 0; b < B * U; b++) {
        int keep = out[b] != 0.0f;
        kept += keep;
        if (keep && !(fabsf(out[b] - scale * pre[b]) <= 1e-5f * pre[b]) && bad++ == 0)
            snprintf(detail, sizeof detail, "element %d: %.7g, input %.7g", b, (double)out[b], (double)pre[b]);
        want_loss += ((double)out[b] - y[b]) * ((double)out[b] - y[b]) / (B * U);
        /* d loss / d pre = 2 (out - y) / (B U) * mask * scale */
        if (keep) {
            double d = 2.0 * ((double)out[b] - y[b]) / (B * U) * scale;
            gw[b % U] += x[b / U] * d;
            gb[b % U] += d;
        }
    }
    check_all(bad, "Dropout: kept outputs are 1 / (1 - rate) times their input", detail, __FILE__, __LINE__);
    if (!CHECK(fabs(kept - expect_kept) <= 6.0 * sigma))
        fprintf(stderr, "    rate %g: %d of %d kept\n", (double)rate, kept, B * U);
    if (OK(loss_rows(m, NULL, y, B, &loss, NULL), m)) CHECK_NEAR(loss, want_loss, 1e-5, 1e-7);
    if (OK(mp_compute_scaled_gradients(m), m) && OK(mp_get_unscaled_gradients(m), m) &&
        OK(mp_get_gradients(m, g, 2 * U), m)) {
        bad = 0;
        for (j = 0; j < U; j++) {
            if (!(fabs(g[j] - gw[j]) <= 1e-5 * fabs(gw[j]) + 1e-7) && bad++ == 0)
                snprintf(detail, sizeof detail, "kernel %d: %.7g, want %.7g", j, (double)g[j], gw[j]);
            if (!(fabs(g[U + j] - gb[j]) <= 1e-5 * fabs(gb[j]) + 1e-7) && bad++ == 0)
                snprintf(detail, sizeof detail, "bias %d: %.7g, want %.7g", j, (double)g[U + j], gb[j]);
        }
        check_all(bad, "Dropout: backward applies the forward's mask and scale", detail, __FILE__, __LINE__);
    }
    if (OK(forward_rows(m, x, B, 1), m) && (out2 = output_f32(m, &count2, NULL)) && CHECK(count2 == B * U)) {
        for (b = 0; b < B * U; b++) differ += (out[b] == 0.0f) != (out2[b] == 0.0f);
        CHECK(differ > 0); /* a new mask every training call */
    }
    if (OK(forward_rows(m, x, B, 0), m) && (out0 = output_f32(m, &count0, NULL)) && CHECK(count0 == B * U)) {
        for (b = 0; b < B * U; b++) bad0 += !(fabsf(out0[b] - pre[b]) <= 1e-6f * pre[b]);
        check_all(bad0, "Dropout at inference is the identity", "an output differs from its input",
                  __FILE__, __LINE__);
    }
out:
    free(out);
    free(out2);
    free(out0);
    mp_model_destroy(m);
}

/* ======================================================================== */
/* Forward passes follow Keras's layouts and formulas (float32) */

/* Keras's loss formulas (tf_keras backend, epsilon 1e-7), in double, from
   the predictions p [n, k]; *correct gets the accuracy metric's count. */
static double keras_loss(mp_loss loss, int from_logits, const float *p, const int32_t *labels, const float *y,
                         int n, int k, size_t *correct) {
    const double eps = 1e-7;
    double total = 0.0;
    int b, j;
    *correct = 0;
    for (b = 0; b < n; b++) {
        const float *z = p + (size_t)b * k, *t = y + (size_t)b * k;
        double lse = 0.0, zmax = -INFINITY, sum = 0.0, l = 0.0;
        int arg = 0, targ = 0;
        for (j = 0; j < k; j++) {
            if (z[j] > z[arg]) arg = j;
            if (t[j] > t[targ]) targ = j;
            zmax = fmax(zmax, z[j]);
            sum += z[j];
        }
        for (j = 0; j < k; j++) lse += exp(z[j] - zmax);
        lse = zmax + log(lse);
        switch (loss) {
        case MP_SPARSE_CATEGORICAL_CROSSENTROPY:
            l = from_logits ? lse - z[labels[b]] : -log(fmin(fmax(z[labels[b]], eps), 1 - eps));
            *correct += arg == labels[b];
            break;
        case MP_CATEGORICAL_CROSSENTROPY:
            for (j = 0; j < k; j++)
                l -= t[j] * (from_logits ? z[j] - lse : log(fmin(fmax(z[j] / sum, eps), 1 - eps)));
            *correct += arg == targ;
            break;
        case MP_BINARY_CROSSENTROPY:
            for (j = 0; j < k; j++) {
                double q = fmin(fmax(z[j], eps), 1 - eps);
                l += from_logits ? fmax(z[j], 0.0) - z[j] * t[j] + log1p(exp(-fabs(z[j])))
                                 : -(t[j] * log(q + eps) + (1 - t[j]) * log(1 - q + eps));
                *correct += k == 1 && (z[j] > 0.5f) == (t[j] > 0.5f);
            }
            l /= k;
            break;
        default:
            for (j = 0; j < k; j++) l += ((double)z[j] - t[j]) * ((double)z[j] - t[j]);
            l /= k;
        }
        total += l;
    }
    return total / n;
}

/* mp_compute_loss and its accuracy count against Keras's formulas. */
static void test_loss_values(void) {
    static const struct {
        mp_loss loss;
        int from_logits, units;
        mp_activation act;
    } cases[] = {
        {MP_SPARSE_CATEGORICAL_CROSSENTROPY, 0, 5, MP_SOFTMAX}, {MP_SPARSE_CATEGORICAL_CROSSENTROPY, 1, 5, MP_LINEAR},
        {MP_CATEGORICAL_CROSSENTROPY, 0, 5, MP_SOFTMAX},        {MP_CATEGORICAL_CROSSENTROPY, 1, 5, MP_LINEAR},
        {MP_BINARY_CROSSENTROPY, 0, 1, MP_SIGMOID},             {MP_BINARY_CROSSENTROPY, 0, 3, MP_SIGMOID},
        {MP_BINARY_CROSSENTROPY, 1, 3, MP_LINEAR},              {MP_MEAN_SQUARED_ERROR, 0, 3, MP_LINEAR},
    };
    static const int shape[] = {4, 0};
    size_t i;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mp_layer_desc d = mp_dense(cases[i].units, cases[i].act);
        mp_model *m = make_model("float32", shape, &d, 1);
        batch b;
        float loss = NAN, *p = NULL;
        size_t count = 0, correct = 0, want_correct;
        int j;
        if (!m) continue;
        b = make_batch(m, cases[i].loss, 16);
        if (cases[i].loss == MP_BINARY_CROSSENTROPY && cases[i].units == 1) /* hard 0/1 targets */
            for (j = 0; j < 16; j++) b.y[j] = (float)(rng_next() & 1);
        if (compile(m, cases[i].loss, cases[i].from_logits, MP_SGD, 0.0f, MP_LOSS_SCALE_NONE) &&
            OK(forward_rows(m, b.x, b.n, 0), m) && (p = output_f32(m, &count, NULL)) &&
            OK(loss_rows(m, labels_of(&b), targets_of(&b), b.n, &loss, &correct), m)) {
            double want = keras_loss(cases[i].loss, cases[i].from_logits, p, b.labels, b.y, 16, cases[i].units,
                                     &want_correct);
            if (!CHECK_NEAR(loss, want, 1e-5, 1e-6)) fprintf(stderr, "    loss case %zu\n", i);
            if (cases[i].loss != MP_MEAN_SQUARED_ERROR && !(cases[i].loss == MP_BINARY_CROSSENTROPY && cases[i].units > 1))
                if (!CHECK(correct == want_correct)) fprintf(stderr, "    loss case %zu: %zu, want %zu\n", i, correct, want_correct);
        }
        free(p);
        free_batch(&b);
        mp_model_destroy(m);
    }
}

/* Keras computes a crossentropy after a softmax (sigmoid) output from the
   softmax's (sigmoid's) input, the logits. On an overconfident model, where
   the right class's probability of many samples is below the 1e-7 clip,
   the loss must be Keras's: the log-sum-exp of the logits, which the test
   computes in double from the weights (clipping gives a loss far off it),
   and the gradient the logits' (softmax - target) / B, which is not zero
   where the probability was clipped. For a Dense with the activation built
   in, an Activation layer after a linear Dense, and a sigmoid with binary
   crossentropy; the output (what predict gives) stays the probabilities. */
static void test_loss_from_logits(void) {
    enum { B = 64, IN = 3, K = 4 };
    static const struct {
        mp_loss loss;
        mp_activation act;
        int layer; /* the activation as its own layer */
    } cases[] = {
        {MP_SPARSE_CATEGORICAL_CROSSENTROPY, MP_SOFTMAX, 0}, {MP_SPARSE_CATEGORICAL_CROSSENTROPY, MP_SOFTMAX, 1},
        {MP_CATEGORICAL_CROSSENTROPY, MP_SOFTMAX, 1},        {MP_BINARY_CROSSENTROPY, MP_SIGMOID, 0},
        {MP_BINARY_CROSSENTROPY, MP_SIGMOID, 1},
    };
    static const int shape[] = {IN, 0};
    size_t c;
    rng_state = TEST_SEED; /* its own draws, whichever tests ran before: overconfident ones */
    for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int binary = cases[c].loss == MP_BINARY_CROSSENTROPY, b, i, k, clipped = 0, bad = 0;
        mp_layer_desc layers[2];
        double z[B][K], loss = 0.0, clip_loss = 0.0, gw[(IN + 1) * K] = {0}, gmax = 0.0;
        float w[(IN + 1) * K], g[(IN + 1) * K], got = NAN, *out = NULL;
        size_t count = 0;
        char what[96], detail[128] = "";
        batch bt;
        mp_model *m;
        layers[0] = mp_dense(K, cases[c].layer ? MP_LINEAR : cases[c].act);
        layers[1] = mp_activation_layer(cases[c].act);
        if (!(m = make_model("float32", shape, layers, 1 + cases[c].layer))) continue;
        snprintf(what, sizeof what, "loss %d from the logits of %s %s", (int)cases[c].loss,
                 cases[c].layer ? "an Activation" : "a Dense", binary ? "sigmoid" : "softmax");
        fill(w, (IN + 1) * K, -12.0f, 12.0f); /* logits up to about 50: overconfident */
        bt = make_batch(m, cases[c].loss, B);
        for (b = 0; b < B * K && binary; b++) bt.y[b] = (float)(rng_next() & 1); /* hard targets */
        for (b = 0; b < B; b++) { /* Keras's loss and d loss / d logits, in double */
            double mx = -INFINITY, lse = 0.0, dz[K];
            for (k = 0; k < K; k++) {
                z[b][k] = w[IN * K + k];
                for (i = 0; i < IN; i++) z[b][k] += (double)bt.x[b * IN + i] * w[i * K + k];
                mx = fmax(mx, z[b][k]);
            }
            for (k = 0; k < K; k++) lse += exp(z[b][k] - mx);
            lse = mx + log(lse);
            for (k = 0; k < K; k++) {
                double t = cases[c].loss == MP_SPARSE_CATEGORICAL_CROSSENTROPY ? (double)(bt.labels[b] == k)
                                                                                 : (double)bt.y[b * K + k];
                double p = binary ? 1.0 / (1.0 + exp(-z[b][k])) : exp(z[b][k] - lse);
                double q = fmin(fmax(p, 1e-7), 1.0 - 1e-7); /* what clipping would see */
                if (binary) {
                    loss += (fmax(z[b][k], 0.0) - z[b][k] * t + log1p(exp(-fabs(z[b][k])))) / K;
                    clip_loss -= (t * log(q) + (1.0 - t) * log(1.0 - q)) / K;
                    clipped += (t > 0.5 ? p : 1.0 - p) < 1e-7;
                    dz[k] = (p - t) / K / B;
                } else {
                    loss += t * (lse - z[b][k]);
                    clip_loss -= t * log(q);
                    clipped += t > 0.0 && p < 1e-7;
                    dz[k] = (p - t) / B;
                }
            }
            for (k = 0; k < K; k++) {
                for (i = 0; i < IN; i++) gw[i * K + k] += (double)bt.x[b * IN + i] * dz[k];
                gw[IN * K + k] += dz[k];
            }
        }
        loss /= B;
        clip_loss /= B;
        for (i = 0; i < (IN + 1) * K; i++) gmax = fmax(gmax, fabs(gw[i]));
        /* the case is one where clipping is wrong by 100x the tolerance */
        if (!check_report(clipped >= 2 && fabs(clip_loss - loss) > 1e-3 * loss, __FILE__, __LINE__, what))
            fprintf(stderr, "    %d clipped, clipped loss %.6g, loss %.6g\n", clipped, clip_loss, loss);
        if (compile(m, cases[c].loss, 0, MP_SGD, 0.0f, MP_LOSS_SCALE_NONE) &&
            OK(mp_model_set_weights(m, w, (IN + 1) * K), m) && gradients(m, &bt, g, (IN + 1) * K, &got) &&
            (out = output_f32(m, &count, NULL)) && CHECK(count == B * K)) {
            if (!check_report(fabs(got - loss) <= 1e-5 * loss, __FILE__, __LINE__, what))
                fprintf(stderr, "    loss %.8g, Keras's %.8g (clipped: %.8g)\n", (double)got, loss, clip_loss);
            for (i = 0; i < (IN + 1) * K; i++)
                if (!(fabs(g[i] - gw[i]) <= 1e-4 * gmax) && bad++ == 0)
                    snprintf(detail, sizeof detail, "weight %d: %.7g, want %.7g", i, (double)g[i], gw[i]);
            check_all(bad || !(gmax > 0.01), what, detail, __FILE__, __LINE__);
            for (b = 0, bad = 0; b < B; b++) { /* the output: probabilities */
                double sum = 0.0;
                for (k = 0; k < K; k++) sum += out[b * K + k];
                bad += !(out[b * K] >= 0.0f && out[b * K] <= 1.0f) || (!binary && fabs(sum - 1.0) > 1e-5);
            }
            check_all(bad, "the output stays the probabilities", "a row", __FILE__, __LINE__);
        }
        free(out);
        free_batch(&bt);
        mp_model_destroy(m);
    }
}

/* Crossentropy from logits spread wider than expf's range (88): logits
   such as {-50, 0, 50} in every order, Keras's loss from the log-sum-exp
   shifted by the largest logit (label 0: 100, not NaN or Inf), and the
   logits' gradient softmax - target, for each crossentropy: sparse and
   categorical from_logits, a softmax output read as logits, and binary
   from_logits (logits -100 ... 100, where exp(-z) overflows). The model is
   a Dense whose kernel is the identity: its output is its input, exactly,
   and its weights' gradients are the logits' gradients times the logits. */
static void test_loss_wide_logits(void) {
    enum { B = 6, K = 3 };
    static const float logits[B][K] = {{-50, 0, 50}, {50, -50, 0}, {0, 50, -50}, {-80, 10, 20}, {100, -100, 3}, {-1, -90, 0}};
    static const int32_t labels[B] = {0, 1, 2, 0, 1, 2};
    static const float soft[K] = {0.2f, 0.3f, 0.5f};
    static const int shape[] = {K, 0};
    static const struct {
        mp_loss loss;
        int from_logits;
        mp_activation act;
    } cases[] = {
        {MP_SPARSE_CATEGORICAL_CROSSENTROPY, 1, MP_LINEAR}, {MP_SPARSE_CATEGORICAL_CROSSENTROPY, 0, MP_SOFTMAX},
        {MP_CATEGORICAL_CROSSENTROPY, 1, MP_LINEAR},        {MP_CATEGORICAL_CROSSENTROPY, 0, MP_SOFTMAX},
        {MP_BINARY_CROSSENTROPY, 1, MP_LINEAR},             {MP_BINARY_CROSSENTROPY, 0, MP_SIGMOID},
    };
    size_t c;
    for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        mp_layer_desc d = mp_dense(K, cases[c].act);
        mp_model *m = make_model("float32", shape, &d, 1);
        float w[K * K + K] = {0}, g[K * K + K], x[B * K], y[B * K], got = NAN;
        double want = 0.0, gw[K * K + K] = {0}, gmax = 0.0;
        int b, i, j, binary = cases[c].loss == MP_BINARY_CROSSENTROPY, bad = 0;
        char what[96], detail[128] = "";
        batch bt;
        if (!m) continue;
        for (i = 0; i < K; i++) w[i * K + i] = 1.0f; /* the identity kernel, zero bias */
        for (b = 0; b < B; b++)
            for (j = 0; j < K; j++) {
                x[b * K + j] = logits[b][j];
                y[b * K + j] = binary ? (float)((b + j) % 2) : cases[c].loss == MP_CATEGORICAL_CROSSENTROPY
                                                                   ? soft[(j + (size_t)b) % K] : 0.0f;
            }
        for (b = 0; b < B; b++) { /* Keras's loss and d loss / d logits, in double */
            double mx = -INFINITY, lse = 0.0, dz[K];
            for (j = 0; j < K; j++) mx = fmax(mx, logits[b][j]);
            for (j = 0; j < K; j++) lse += exp(logits[b][j] - mx);
            lse = mx + log(lse);
            for (j = 0; j < K; j++) {
                double z = logits[b][j], t = cases[c].loss == MP_SPARSE_CATEGORICAL_CROSSENTROPY ? (double)(labels[b] == j)
                                                                                               : (double)y[b * K + j];
                if (binary) {
                    want += (fmax(z, 0.0) - z * t + log1p(exp(-fabs(z)))) / K / B;
                    dz[j] = (1.0 / (1.0 + exp(-z)) - t) / K / B;
                } else {
                    want += t * (lse - z) / B;
                    dz[j] = (exp(z - lse) - t) / B;
                }
            }
            for (j = 0; j < K; j++) {
                for (i = 0; i < K; i++) gw[i * K + j] += logits[b][i] * dz[j];
                gw[K * K + j] += dz[j];
            }
        }
        for (i = 0; i < K * K + K; i++) gmax = fmax(gmax, fabs(gw[i]));
        snprintf(what, sizeof what, "loss %d %s, logits from -100 to 100", (int)cases[c].loss,
                 cases[c].from_logits ? "from_logits" : "after its activation");
        bt.x = x, bt.labels = (int32_t *)labels, bt.y = y, bt.n = B, bt.loss = cases[c].loss;
        if (compile(m, cases[c].loss, cases[c].from_logits, MP_SGD, 0.0f, MP_LOSS_SCALE_NONE) &&
            OK(mp_model_set_weights(m, w, K * K + K), m) && gradients(m, &bt, g, K * K + K, &got)) {
            if (!check_report(fabs(got - want) <= 1e-6 * want, __FILE__, __LINE__, what))
                fprintf(stderr, "    loss %.9g, Keras's %.9g\n", (double)got, want);
            for (i = 0; i < K * K + K; i++)
                if (!(fabs(g[i] - gw[i]) <= 1e-5 * gmax) && bad++ == 0)
                    snprintf(detail, sizeof detail, "weight %d: %.7g, want %.7g", i, (double)g[i], gw[i]);
            check_all(bad, what, detail, __FILE__, __LINE__);
        }
        mp_model_destroy(m);
    }
}

/* Accuracy on tied outputs: the prediction is the first of equal maxima,
   as tf.math.argmax, which Keras's sparse_categorical_accuracy and
   categorical_accuracy take (and the target's too). An identity Dense, so
   the outputs are the inputs: rows {1, 1, 0} with label 0 count, label 1
   does not; {0, 2, 2} with 1 counts, 2 does not; one-hot and tied targets
   likewise. */
static void test_accuracy_ties(void) {
    enum { B = 4, K = 3 };
    static const float x[B * K] = {1, 1, 0, 1, 1, 0, 0, 2, 2, 0, 2, 2};
    static const int32_t labels[B] = {0, 1, 1, 2};
    static const float targets[B * K] = {1, 0, 0, 0, 1, 0, 0, 0.5f, 0.5f, 0, 0, 1}; /* argmax 0, 1, 1, 2 */
    static const int shape[] = {K, 0};
    float w[K * K + K] = {0}, loss = NAN;
    int i, sparse;
    for (i = 0; i < K; i++) w[i * K + i] = 1.0f;
    for (sparse = 1; sparse >= 0; sparse--) {
        mp_layer_desc d = mp_dense(K, MP_LINEAR);
        mp_model *m = make_model("float32", shape, &d, 1);
        size_t correct = 0;
        mp_loss kind = sparse ? MP_SPARSE_CATEGORICAL_CROSSENTROPY : MP_CATEGORICAL_CROSSENTROPY;
        if (!m) continue;
        if (compile(m, kind, 1, MP_SGD, 0.0f, MP_LOSS_SCALE_NONE) && OK(mp_model_set_weights(m, w, K * K + K), m) &&
            OK(forward_rows(m, x, B, 0), m) &&
            OK(loss_rows(m, sparse ? labels : NULL, sparse ? NULL : targets, B, &loss, &correct), m))
            if (!CHECK(correct == 2)) /* rows 0 and 2 */
                fprintf(stderr, "    %s: %zu correct, want 2\n", sparse ? "sparse" : "categorical", correct);
        mp_model_destroy(m);
    }
}

/* Each activation's forward against its formula (GELU exact, with erf). */
static void test_activation_values(void) {
    static const float in[7] = {-3.0f, -1.0f, -0.3f, 0.0f, 0.4f, 1.2f, 2.5f};
    static const int shape[] = {7, 0};
    int a, j;
    for (a = 0; a < N_ACTIVATIONS; a++) {
        mp_activation act = all_activations[a];
        mp_layer_desc d = mp_activation_layer(act);
        mp_model *m = make_model("float32", shape, &d, 1);
        float *out = NULL;
        size_t count = 0;
        double sum = 0.0;
        int bad = 0;
        char detail[96] = "";
        if (!m) continue;
        for (j = 0; j < 7; j++) sum += exp(in[j]);
        if (OK(forward_rows(m, in, 1, 0), m) && (out = output_f32(m, &count, NULL)) && CHECK(count == 7)) {
            for (j = 0; j < 7; j++) {
                double x = in[j], want = act == MP_RELU      ? fmax(x, 0.0)
                                         : act == MP_SIGMOID ? 1.0 / (1.0 + exp(-x))
                                         : act == MP_TANH    ? tanh(x)
                                         : act == MP_GELU    ? 0.5 * x * (1.0 + erf(x / sqrt(2.0)))
                                         : act == MP_SOFTMAX ? exp(x) / sum
                                                             : x;
                /* 3e-7: float32's 1 + erf(x / sqrt 2) cancels near x = -3 (Keras's formula too) */
                if (!(fabs(out[j] - want) <= 2e-6 * fabs(want) + 3e-7) && bad++ == 0)
                    snprintf(detail, sizeof detail, "%s(%g) = %.9g, want %.9g", mp_activation_name(act), x,
                             (double)out[j], want);
            }
            check_all(bad, "activation values", detail, __FILE__, __LINE__);
        }
        free(out);
        mp_model_destroy(m);
    }
}

/* TensorFlow's convolution: NHWC input, kernel [kh][kw][cin][cout] then the
   bias; SAME pads max((out - 1) s + k - in, 0) in total, the smaller half
   before (top/left). */
static void conv_reference(const float *x, int n, int h, int w, int c, const float *k, int kh, int kw, int f,
                           int sh, int sw, mp_padding pad, float *out, int *oh, int *ow) {
    int ph, pw, b, i, j, o, di, dj, ci;
    *oh = pad == MP_SAME ? (h + sh - 1) / sh : (h - kh) / sh + 1;
    *ow = pad == MP_SAME ? (w + sw - 1) / sw : (w - kw) / sw + 1;
    ph = pad == MP_SAME ? ((*oh - 1) * sh + kh - h > 0 ? (*oh - 1) * sh + kh - h : 0) / 2 : 0;
    pw = pad == MP_SAME ? ((*ow - 1) * sw + kw - w > 0 ? (*ow - 1) * sw + kw - w : 0) / 2 : 0;
    for (b = 0; b < n; b++)
        for (i = 0; i < *oh; i++)
            for (j = 0; j < *ow; j++)
                for (o = 0; o < f; o++) {
                    double s = k[kh * kw * c * f + o];
                    for (di = 0; di < kh; di++)
                        for (dj = 0; dj < kw; dj++)
                            for (ci = 0; ci < c; ci++) {
                                int r = i * sh + di - ph, q = j * sw + dj - pw;
                                if (r < 0 || r >= h || q < 0 || q >= w) continue;
                                s += (double)x[(((size_t)b * h + r) * w + q) * c + ci] *
                                     k[((di * kw + dj) * c + ci) * f + o];
                            }
                    out[(((size_t)b * *oh + i) * *ow + j) * f + o] = (float)s;
                }
}

/* Compares a model's output with want[0..count). */
static void check_output(mp_model *m, const float *want, size_t count, const char *what) {
    size_t got_count = 0, i;
    float *got = output_f32(m, &got_count, NULL);
    int bad = 0;
    char detail[128] = "";
    if (!got) return;
    if (CHECK(got_count == count)) {
        for (i = 0; i < count; i++)
            if (!(fabsf(got[i] - want[i]) <= 1e-5f * fabsf(want[i]) + 1e-6f) && bad++ == 0)
                snprintf(detail, sizeof detail, "element %zu: %.7g, want %.7g", i, (double)got[i], (double)want[i]);
        check_all(bad, what, detail, __FILE__, __LINE__);
    }
    free(got);
}

/* Dense is x K + b with K [in, out]; Conv2D as TensorFlow (odd SAME
   padding included) and its output shape in the layer info; MaxPooling2D
   2x2 drops the odd last row and column; Flatten keeps the row-major order. */
static void test_layer_values(void) {
    static const struct { int h, w, kh, kw, sh, sw; mp_padding pad; } convs[] = {
        {6, 6, 3, 3, 2, 2, MP_SAME}, {5, 6, 2, 3, 1, 2, MP_SAME}, {5, 6, 2, 3, 2, 1, MP_VALID}, {5, 5, 3, 3, 1, 1, MP_VALID},
        {6, 5, 3, 2, 1, 1, MP_SAME},  /* same padding 1 at the top, 0 at the left */
        {5, 6, 2, 3, 1, 1, MP_SAME}}; /* 0 at the top, 1 at the left */
    enum { B = 2, C = 2, F = 3 };
    static const int dense_shape[] = {3, 0}, pool_shape[] = {5, 5, 2, 0}, flat_shape[] = {2, 3, 2, 0};
    float x[B * 6 * 6 * C], k[3 * 3 * C * F + F], want[B * 6 * 6 * F];
    mp_layer_desc d = mp_dense(4, MP_LINEAR);
    mp_model *m = make_model("float32", dense_shape, &d, 1);
    mp_layer_info info;
    size_t i;
    int b, j, oh = 0, ow = 0;
    fill(x, sizeof x / sizeof x[0], -1.0f, 1.0f);
    fill(k, sizeof k / sizeof k[0], -0.5f, 0.5f);
    if (m && OK(mp_model_set_weights(m, k, 16), m) && OK(forward_rows(m, x, B, 0), m)) {
        for (b = 0; b < B; b++)
            for (j = 0; j < 4; j++)
                want[b * 4 + j] = x[b * 3] * k[j] + x[b * 3 + 1] * k[4 + j] + x[b * 3 + 2] * k[8 + j] + k[12 + j];
        check_output(m, want, B * 4, "Dense: x K + b, K is [in, out]");
    }
    mp_model_destroy(m);
    for (i = 0; i < sizeof convs / sizeof convs[0]; i++) {
        int shape[4] = {convs[i].h, convs[i].w, C, 0};
        d = with_strides(mp_conv2d(F, convs[i].kh, convs[i].kw, convs[i].pad, MP_LINEAR), convs[i].sh, convs[i].sw);
        if (!(m = make_model("float32", shape, &d, 1))) continue;
        conv_reference(x, B, convs[i].h, convs[i].w, C, k, convs[i].kh, convs[i].kw, F, convs[i].sh, convs[i].sw,
                       convs[i].pad, want, &oh, &ow);
        if (OK(mp_model_layer_info(m, 0, &info), m) &&
            !CHECK(info.rank == 3 && info.output_shape[0] == oh && info.output_shape[1] == ow && info.output_shape[2] == F))
            fprintf(stderr, "    conv %zu: output shape %dx%dx%d, want %dx%dx%d\n", i, info.output_shape[0],
                    info.output_shape[1], info.output_shape[2], oh, ow, F);
        CHECK(mp_model_param_count(m) == (size_t)(convs[i].kh * convs[i].kw * C * F + F));
        if (OK(mp_model_set_weights(m, k, (size_t)(convs[i].kh * convs[i].kw * C * F + F)), m) &&
            OK(forward_rows(m, x, B, 0), m))
            check_output(m, want, (size_t)(B * oh * ow * F), "Conv2D as TensorFlow (NHWC, [kh, kw, cin, cout])");
        mp_model_destroy(m);
    }
    d = mp_max_pooling2d(2, 2);
    if ((m = make_model("float32", pool_shape, &d, 1)) && OK(forward_rows(m, x, B, 0), m)) {
        for (b = 0; b < B; b++)
            for (j = 0; j < 2 * 2 * C; j++) {
                int i0 = j / (2 * C) * 2, j0 = j / C % 2 * 2, c = j % C, di;
                float best = -INFINITY;
                for (di = 0; di < 4; di++) best = fmaxf(best, x[((b * 5 + i0 + di / 2) * 5 + j0 + di % 2) * C + c]);
                want[b * 8 + j] = best;
            }
        check_output(m, want, B * 8, "MaxPooling2D 2x2 on 5x5 (valid: the last row and column drop)");
    }
    mp_model_destroy(m);
    d = mp_flatten();
    if ((m = make_model("float32", flat_shape, &d, 1)) && OK(forward_rows(m, x, B, 0), m)) {
        CHECK(OK(mp_model_layer_info(m, 0, &info), m) && info.rank == 1 && info.output_shape[0] == 12);
        check_output(m, x, B * 12, "Flatten keeps the row-major order");
    }
    mp_model_destroy(m);
}

/* ======================================================================== */
/* 2. Mixed forward passes within a stated tolerance of float32 */

/* The same weights and inputs under `policy` and under float32, inference
   mode: |mixed - float32| <= tol (1 + |float32|) elementwise. */
static void compare_forward(const char *policy, const char *what, const int *shape, const mp_layer_desc *layers,
                            int count, double tol) {
    enum { B = 6 };
    mp_model *m32 = make_model("float32", shape, layers, count), *m16 = make_model(policy, shape, layers, count);
    float *w = NULL, *x = NULL, *a = NULL, *o = NULL;
    size_t n, na = 0, no = 0, i;
    int bad = 0;
    char msg[160], detail[128] = "";
    if (!m32 || !m16) goto out;
    n = mp_model_param_count(m32);
    w = floats(n);
    x = floats(B * mp_model_input_size(m32));
    fill(x, B * mp_model_input_size(m32), -1.0f, 1.0f);
    if (!OK(mp_model_get_weights(m32, w, n), m32) || !OK(mp_model_set_weights(m16, w, n), m16) ||
        !OK(forward_rows(m32, x, B, 0), m32) || !OK(forward_rows(m16, x, B, 0), m16) ||
        !(a = output_f32(m16, &na, NULL)) || !(o = output_f32(m32, &no, NULL)) || !CHECK(na == no))
        goto out;
    for (i = 0; i < na; i++)
        if (!(fabs((double)a[i] - o[i]) <= tol * (1.0 + fabs(o[i]))) && bad++ == 0)
            snprintf(detail, sizeof detail, "element %zu: %.7g, float32 %.7g", i, (double)a[i], (double)o[i]);
    snprintf(msg, sizeof msg, "%s %s forward within %g (1 + |float32|) of float32", policy, what, tol);
    check_all(bad, msg, detail, __FILE__, __LINE__);
out:
    free(w), free(x), free(a), free(o);
    mp_model_destroy(m32);
    mp_model_destroy(m16);
}

/* Tolerances: float16 keeps 11 significant bits (rounding error up to
   2^-11 ~ 4.9e-4 per value); inputs, weights and each layer's output are
   rounded, and sums of up to 36 products carry it through three or four
   layers: 3e-3 (1 + |y|), about 8x what is seen. bfloat16 keeps 8 bits, 8x
   coarser: 2.4e-2 (1 + |y|). */
static void test_mixed_forward(void) {
    static const int mlp_shape[] = {12, 0}, conv_shape[] = {6, 6, 2, 0};
    mp_layer_desc mlp[5], conv[5];
    mlp[0] = mp_dense(16, MP_RELU);
    mlp[1] = mp_dense(16, MP_GELU);
    mlp[2] = mp_dense(8, MP_TANH);
    mlp[3] = mp_dense(5, MP_LINEAR);
    mlp[4] = with_dtype(mp_activation_layer(MP_SOFTMAX), "float32");
    conv[0] = mp_conv2d(4, 3, 3, MP_SAME, MP_RELU);
    conv[1] = mp_max_pooling2d(2, 2);
    conv[2] = with_strides(mp_conv2d(4, 2, 2, MP_VALID, MP_TANH), 1, 1);
    conv[3] = mp_flatten();
    conv[4] = mp_dense(3, MP_SIGMOID);
    compare_forward("mixed_float16", "MLP", mlp_shape, mlp, 5, 3e-3);
    compare_forward("mixed_float16", "MLP logits (16-bit output)", mlp_shape, mlp, 4, 3e-3);
    compare_forward("mixed_float16", "conv net", conv_shape, conv, 5, 3e-3);
    compare_forward("mixed_bfloat16", "MLP", mlp_shape, mlp, 5, 2.4e-2);
    compare_forward("mixed_bfloat16", "MLP logits (16-bit output)", mlp_shape, mlp, 4, 2.4e-2);
    compare_forward("mixed_bfloat16", "conv net", conv_shape, conv, 5, 2.4e-2);
}

/* The custom loop's gradients under `policy` (loss scale as compile gives
   it: 2^15 for mixed_float16) against float32's on the same weights and
   batch: relative L2 error <= tol. The scaled loss is loss * scale. */
static void compare_gradients(const char *policy, double tol) {
    enum { B = 16 };
    static const int shape[] = {10, 0};
    mp_layer_desc layers[3];
    mp_model *m32, *m16;
    size_t n, i;
    float *w = NULL, *g32 = NULL, *g16 = NULL, l32 = NAN, l16 = NAN;
    double diff2 = 0.0, ref2 = 0.0;
    batch b;
    char msg[128];
    layers[0] = mp_dense(16, MP_TANH);
    layers[1] = mp_dense(4, MP_LINEAR);
    layers[2] = with_dtype(mp_activation_layer(MP_SOFTMAX), "float32");
    m32 = make_model("float32", shape, layers, 3);
    m16 = make_model(policy, shape, layers, 3);
    if (!m32 || !m16 || !compile(m32, MP_SPARSE_CATEGORICAL_CROSSENTROPY, 0, MP_SGD, 0.0f, MP_LOSS_SCALE_NONE) ||
        !compile(m16, MP_SPARSE_CATEGORICAL_CROSSENTROPY, 0, MP_SGD, 0.0f, MP_LOSS_SCALE_AUTO))
        goto out;
    n = mp_model_param_count(m32);
    w = floats(n), g32 = floats(n), g16 = floats(n);
    b = make_batch(m32, MP_SPARSE_CATEGORICAL_CROSSENTROPY, B);
    if (OK(mp_model_get_weights(m32, w, n), m32) && OK(mp_model_set_weights(m16, w, n), m16) &&
        gradients(m32, &b, g32, n, &l32) && gradients(m16, &b, g16, n, &l16)) {
        for (i = 0; i < n; i++) {
            diff2 += ((double)g16[i] - g32[i]) * ((double)g16[i] - g32[i]);
            ref2 += (double)g32[i] * g32[i];
        }
        snprintf(msg, sizeof msg, "%s gradients within %g (relative L2) of float32", policy, tol);
        if (!check_report(sqrt(diff2) <= tol * sqrt(ref2), __FILE__, __LINE__, msg))
            fprintf(stderr, "    |g - g32| = %.4g, |g32| = %.4g\n", sqrt(diff2), sqrt(ref2));
        CHECK_NEAR(l16, l32, tol, 0.0);
        CHECK(mp_get_scaled_loss(m16, l16) == l16 * (strcmp(policy, "mixed_float16") == 0 ? 32768.0f : 1.0f));
        CHECK(ref2 > 1e-4);
    }
    free_batch(&b);
out:
    free(w), free(g32), free(g16);
    mp_model_destroy(m32);
    mp_model_destroy(m16);
}

/* Same tolerances' reasoning as above, for a backward pass as deep as the
   forward one: 3e-3 for float16 (with the loss scaled by 2^15 and the
   gradients unscaled), 2.4e-2 for bfloat16. */
static void test_mixed_gradients(void) {
    compare_gradients("mixed_float16", 3e-3);
    compare_gradients("mixed_bfloat16", 2.4e-2);
}

/* ======================================================================== */
/* 3. Policy semantics */

/* The guide's model under mixed_float16: the Dense layers are
   mixed_float16, the overridden softmax float32, a layer given a policy
   pointer has that one; the model reports the global policy at creation. */
static void test_layer_policies(void) {
    static const int shape[] = {6, 0};
    mp_policy bf;
    mp_layer_desc layers[4];
    mp_layer_info info[4];
    mp_model *m;
    int i, ok = 1;
    mp_policy_from_name("mixed_bfloat16", &bf);
    layers[0] = mp_dense(8, MP_RELU);
    layers[1] = mp_dense(4, MP_LINEAR);
    layers[2] = with_dtype(mp_activation_layer(MP_SOFTMAX), "float32");
    layers[3] = mp_dense(3, MP_LINEAR);
    layers[3].policy = &bf;
    if (!(m = make_model("mixed_float16", shape, layers, 4))) return;
    CHECK(mp_model_layer_count(m) == 4);
    for (i = 0; i < 4; i++) ok &= OK(mp_model_layer_info(m, i, &info[i]), m);
    if (ok) {
        CHECK(policy_is(info[0].policy, "mixed_float16") && policy_is(info[1].policy, "mixed_float16"));
        CHECK(policy_is(info[2].policy, "float32"));
        CHECK(policy_is(info[3].policy, "mixed_bfloat16"));
        CHECK(info[0].type && strcmp(info[0].type, "Dense") == 0);
        CHECK(info[2].type && strcmp(info[2].type, "Activation") == 0);
        CHECK(info[0].params == 6 * 8 + 8 && info[2].params == 0);
        CHECK(info[1].rank == 1 && info[1].output_shape[0] == 4);
    }
    CHECK(policy_is(mp_model_policy(m), "mixed_float16"));
    CHECK(policy_is(mp_global_policy(), "float32")); /* make_model restored it */
    mp_model_destroy(m);
}

/* A layer takes the global policy when it is added: one added before
   mp_set_global_policy keeps float32, one added after is mixed_float16. */
static void test_policy_at_add_time(void) {
    static const float x[4] = {0.5f, -0.25f, 1.0f, 0.75f};
    mp_model_desc md;
    mp_layer_info a, b;
    mp_tensor t;
    mp_model *m = NULL;
    mp_policy p;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 4;
    if (!OK(mp_set_global_policy_name("float32"), NULL) || !OK(mp_model_create(&m, &md), NULL)) return;
    OK(mp_model_add(m, mp_dense(3, MP_TANH)), m);
    OK(mp_policy_from_name("mixed_float16", &p), NULL);
    OK(mp_set_global_policy(p), NULL);
    OK(mp_model_add(m, mp_dense(2, MP_LINEAR)), m);
    mp_set_global_policy_name("float32");
    if (OK(mp_model_layer_info(m, 0, &a), m) && OK(mp_model_layer_info(m, 1, &b), m)) {
        CHECK(policy_is(a.policy, "float32"));
        CHECK(policy_is(b.policy, "mixed_float16"));
    }
    CHECK(policy_is(mp_model_policy(m), "float32"));
    memset(&t, 0, sizeof t);
    if (OK(forward_rows(m, x, 1, 0), m) && OK(mp_output(m, &t), m)) {
        CHECK(t.dtype == MP_FLOAT16);
        CHECK(t.rank == 2 && t.shape[0] == 1 && t.shape[1] == 2);
    }
    mp_model_destroy(m);
}

/* Weights live in float32 under mixed policies: get_weights returns the
   bits set_weights put, which 16 bits could not hold (1 + 2^-20, 1e-30). */
static void test_weights_stay_float32(void) {
    static const char *const policies[] = {"mixed_float16", "mixed_bfloat16", "float32"};
    static const int shape[] = {5, 0};
    mp_layer_desc d = mp_dense(4, MP_TANH);
    size_t p;
    for (p = 0; p < 3; p++) {
        mp_model *m = make_model(policies[p], shape, &d, 1);
        float w[24], back[24];
        int i;
        if (!m) continue;
        for (i = 0; i < 24; i++) w[i] = i % 3 == 0 ? 1.0f + f32_of_bits(0x35800000u) /* 2^-20 */
                                        : i % 3 == 1 ? -1e-30f : uniform(-1.0f, 1.0f);
        memset(back, 0, sizeof back);
        if (CHECK(mp_model_param_count(m) == 24) && OK(mp_model_set_weights(m, w, 24), m) &&
            OK(mp_model_get_weights(m, back, 24), m))
            if (!CHECK(memcmp(w, back, sizeof w) == 0)) fprintf(stderr, "    policy %s\n", policies[p]);
        mp_model_destroy(m);
    }
}

/* Inside a layer, inputs and float32 weights are read as the compute dtype
   (Keras's AutoCastVariable). Dense(1, no bias) on three features, v = 1 +
   0.625 * 2^-10: v casts to 1 + 2^-10 in float16, and the sum of three
   casts, 3 + 1.5 * 2^-9, is a tie that rounds to even, 3 + 2^-8 (0x4202);
   the uncast sum 3 + 0.9375 * 2^-9 would round to 3 + 2^-9 (0x4201). (Two
   equal terms would not tell: round(2v) = 2 round(v).) float32 keeps 3v
   exactly. The output tensor is float16 without an override and float32
   with one. */
static void test_compute_dtype_casts(void) {
    static const int shape[] = {3, 0};
    const float v = 1.0f + 5.0f / 8192.0f, one[3] = {1.0f, 1.0f, 1.0f}, vv[3] = {v, v, v};
    mp_layer_desc layers[2];
    mp_model *m16, *m32, *mo;
    mp_tensor t;
    layers[0] = without_bias(mp_dense(1, MP_LINEAR));
    layers[1] = with_dtype(mp_activation_layer(MP_LINEAR), "float32");
    m16 = make_model("mixed_float16", shape, layers, 1);
    m32 = make_model("float32", shape, layers, 1);
    mo = make_model("mixed_float16", shape, layers, 2);
    memset(&t, 0, sizeof t);
    if (m16 && OK(mp_model_set_weights(m16, vv, 3), m16)) { /* weights cast */
        if (OK(forward_rows(m16, one, 1, 0), m16) && OK(mp_output(m16, &t), m16) && CHECK(t.dtype == MP_FLOAT16))
            CHECK_EQ(((const mp_f16 *)t.data)[0].bits, 0x4202u);
    }
    if (m16 && OK(mp_model_set_weights(m16, one, 3), m16)) { /* inputs cast */
        if (OK(forward_rows(m16, vv, 1, 0), m16) && OK(mp_output(m16, &t), m16) && CHECK(t.dtype == MP_FLOAT16))
            CHECK_EQ(((const mp_f16 *)t.data)[0].bits, 0x4202u);
    }
    if (m32 && OK(mp_model_set_weights(m32, vv, 3), m32) && OK(forward_rows(m32, one, 1, 0), m32) &&
        OK(mp_output(m32, &t), m32) && CHECK(t.dtype == MP_FLOAT32))
        CHECK(((const float *)t.data)[0] == 3.0f + 15.0f / 8192.0f);
    if (mo && OK(mp_model_set_weights(mo, vv, 3), mo) && OK(forward_rows(mo, one, 1, 0), mo) &&
        OK(mp_output(mo, &t), mo) && CHECK(t.dtype == MP_FLOAT32))
        CHECK(((const float *)t.data)[0] == 3.0f + 1.0f / 256.0f); /* the float16 sum, then float32 */
    mp_model_destroy(m16);
    mp_model_destroy(m32);
    mp_model_destroy(mo);
}

/* Integer labels are never cast: 4096 classes, labels 2049 (not a float16
   number: it would round to 2048) and 4095. Logits from one input and a
   [1, 4096] kernel, exact in float16: 8 for class 2048, 4 for 2049, 0
   elsewhere. The mixed_float16 loss, accuracy count and gradients must be
   float32's. */
static void test_labels_not_cast(void) {
    enum { K = 4096 };
    static const int shape[] = {1, 0};
    static const float x[2] = {1.0f, 1.0f};
    static const int32_t labels[2] = {2049, 4095};
    static const char *const policies[] = {"float32", "mixed_float16"};
    float *w = floats(K), *g = floats(K);
    double z = (K - 2) + exp(8.0) + exp(4.0), p2048 = exp(8.0) / z, p2049 = exp(4.0) / z, p0 = 1.0 / z;
    double want = 0.5 * ((log(z) - 4.0) + log(z)); /* labels 2049 and 4095 */
    int p;
    w[2048] = 8.0f, w[2049] = 4.0f;
    for (p = 0; p < 2; p++) {
        mp_layer_desc d = without_bias(mp_dense(K, MP_LINEAR));
        mp_model *m = make_model(policies[p], shape, &d, 1);
        float loss = NAN;
        size_t correct = 99;
        if (!m) continue;
        if (compile(m, MP_SPARSE_CATEGORICAL_CROSSENTROPY, 1, MP_SGD, 0.0f, MP_LOSS_SCALE_NONE) &&
            OK(mp_model_set_weights(m, w, K), m) && OK(forward_rows(m, x, 2, 1), m) &&
            OK(loss_rows(m, labels, NULL, 2, &loss, &correct), m)) {
            if (!CHECK_NEAR(loss, want, 1e-5, 0.0)) fprintf(stderr, "    policy %s\n", policies[p]);
            CHECK(correct == 0); /* the argmax is 2048: right only if 2049 became 2048 */
            /* d loss / d w_j = mean over the batch of (softmax_j - onehot_j) x */
            if (OK(mp_compute_scaled_gradients(m), m) && OK(mp_get_unscaled_gradients(m), m) &&
                OK(mp_get_gradients(m, g, K), m)) {
                CHECK_NEAR(g[2049], p2049 - 0.5, 2e-3, 1e-4);
                CHECK_NEAR(g[2048], p2048, 2e-3, 1e-4);
                CHECK_NEAR(g[4095], p0 - 0.5, 2e-3, 1e-4);
                CHECK_NEAR(g[7], p0, 2e-2, 1e-5);
            }
        }
        mp_model_destroy(m);
    }
    free(w);
    free(g);
}

/* ======================================================================== */
/* 4. The loss-scale state machine */

static mp_loss_scale ls_make(float initial, int interval, float min_scale, float max_scale, int hysteresis,
                             int fixed) {
    mp_loss_scale_desc d;
    mp_loss_scale ls;
    memset(&d, 0, sizeof d);
    memset(&ls, 0, sizeof ls);
    d.initial_scale = initial, d.growth_interval = interval, d.min_scale = min_scale;
    d.max_scale = max_scale, d.hysteresis = hysteresis, d.fixed = fixed;
    OK(mp_loss_scale_init(&ls, &d), NULL);
    return ls;
}

/* n steps of the same kind; returns how many were applied. */
static int ls_steps(mp_loss_scale *ls, int n, int finite) {
    int applied = 0;
    while (n-- > 0) applied += mp_loss_scale_update(ls, finite);
    return applied;
}

/* Keras's defaults: 2^15; an Inf step is skipped, halves and resets the
   counter; 2000 finite steps in a row double. */
static void test_loss_scale_defaults(void) {
    mp_loss_scale ls = ls_make(0, 0, 0, 0, 0, 0);
    CHECK(ls.scale == 32768.0f && ls.config.initial_scale == 32768.0f);
    CHECK(ls.config.growth_interval == 2000 && ls.config.min_scale == 1.0f && !ls.config.fixed);
    CHECK(ls.good_steps == 0 && ls.skipped_steps == 0 && ls.steps == 0);
    CHECK(mp_loss_scale_update(&ls, 0) == 0);
    CHECK(ls.scale == 16384.0f && ls.skipped_steps == 1 && ls.steps == 1 && ls.good_steps == 0);
    CHECK(ls_steps(&ls, 1999, 1) == 1999);
    CHECK(ls.scale == 16384.0f && ls.good_steps == 1999);
    CHECK(mp_loss_scale_update(&ls, 1) == 1);
    CHECK(ls.scale == 32768.0f && ls.good_steps == 0 && ls.steps == 2001 && ls.skipped_steps == 1);
    /* an overflow in the middle of a run resets the count */
    ls_steps(&ls, 1000, 1);
    CHECK(ls.good_steps == 1000);
    CHECK(mp_loss_scale_update(&ls, 0) == 0);
    CHECK(ls.scale == 16384.0f && ls.good_steps == 0 && ls.skipped_steps == 2);
    ls_steps(&ls, 1999, 1);
    CHECK(ls.scale == 16384.0f);
    mp_loss_scale_update(&ls, 1);
    CHECK(ls.scale == 32768.0f && ls.steps == 2001 + 1001 + 2000);
    /* Inf at chosen steps: 3, 4 and 10 of 12 */
    ls = ls_make(0, 0, 0, 0, 0, 0);
    {
        int step, applied = 0, ok = 1;
        for (step = 1; step <= 12; step++) {
            int bad = step == 3 || step == 4 || step == 10;
            int r = mp_loss_scale_update(&ls, !bad);
            applied += r;
            ok &= r == !bad;
        }
        CHECK(ok && applied == 9);
        CHECK(ls.scale == 4096.0f && ls.skipped_steps == 3 && ls.good_steps == 2 && ls.steps == 12);
    }
}

/* The edges: no growth to Inf, the floor, fixed mode, hysteresis, the
   ceiling, a custom interval, and bad configurations. */
static void test_loss_scale_edges(void) {
    mp_loss_scale ls;
    mp_loss_scale_desc bad;
    float big = f32_of_bits(0x7F000000u); /* 2^127: doubling gives Inf */
    ls = ls_make(big, 0, 0, 0, 0, 0);
    ls_steps(&ls, 4000, 1);
    CHECK(ls.scale == big);
    ls = ls_make(FLT_MAX, 10, 0, 0, 0, 0);
    ls_steps(&ls, 25, 1);
    CHECK(ls.scale == FLT_MAX);
    /* the floor at min_scale (1 by default; 16 here) */
    ls = ls_make(4, 0, 0, 0, 0, 0);
    CHECK(ls_steps(&ls, 5, 0) == 0);
    CHECK(ls.scale == 1.0f && ls.skipped_steps == 5);
    ls = ls_make(64, 0, 16, 0, 0, 0);
    ls_steps(&ls, 3, 0);
    CHECK(ls.scale == 16.0f);
    /* fixed: never changes, but bad steps still skip */
    ls = ls_make(128, 0, 0, 0, 0, 1);
    CHECK(mp_loss_scale_update(&ls, 0) == 0);
    CHECK(ls.scale == 128.0f && ls.skipped_steps == 1);
    CHECK(ls_steps(&ls, 4001, 1) == 4001);
    CHECK(ls.scale == 128.0f);
    ls = ls_make(0, 0, 0, 0, 0, 1);
    CHECK(ls.scale == 32768.0f);
    /* hysteresis 2: the second overflow since the scale last changed halves */
    ls = ls_make(1024, 0, 0, 0, 2, 0);
    CHECK(mp_loss_scale_update(&ls, 0) == 0);
    CHECK(ls.scale == 1024.0f && ls.skipped_steps == 1 && ls.good_steps == 0);
    CHECK(ls_steps(&ls, 5, 1) == 5);
    CHECK(ls.scale == 1024.0f);
    CHECK(mp_loss_scale_update(&ls, 0) == 0);
    CHECK(ls.scale == 512.0f && ls.skipped_steps == 2);
    mp_loss_scale_update(&ls, 0);
    CHECK(ls.scale == 512.0f);
    mp_loss_scale_update(&ls, 0);
    CHECK(ls.scale == 256.0f && ls.skipped_steps == 4);
    /* the ceiling */
    ls = ls_make(1024, 10, 0, 2048, 0, 0);
    ls_steps(&ls, 10, 1);
    CHECK(ls.scale == 2048.0f);
    ls_steps(&ls, 30, 1);
    CHECK(ls.scale == 2048.0f);
    /* a custom growth interval */
    ls = ls_make(2, 3, 0, 0, 0, 0);
    ls_steps(&ls, 2, 1);
    CHECK(ls.scale == 2.0f);
    mp_loss_scale_update(&ls, 1);
    CHECK(ls.scale == 4.0f && ls.good_steps == 0);
    ls_steps(&ls, 2, 1);
    mp_loss_scale_update(&ls, 0);
    CHECK(ls.scale == 2.0f);
    ls_steps(&ls, 3, 1);
    CHECK(ls.scale == 4.0f);
    /* refused: NULL, a negative interval, a negative scale */
    memset(&bad, 0, sizeof bad);
    CHECK(mp_loss_scale_init(NULL, &bad) == MP_ERR_NULL);
    bad.growth_interval = -1;
    CHECK(mp_loss_scale_init(&ls, &bad) != MP_OK);
    bad.growth_interval = 0, bad.initial_scale = -2.0f;
    CHECK(mp_loss_scale_init(&ls, &bad) != MP_OK);
}

/* compile wraps the optimizer under mixed_float16 only, as Keras (TF >= 2.4
   tests the policy's name); MP_LOSS_SCALE_NONE does not wrap;
   MP_LOSS_SCALE_ON always does, with Keras's defaults for zero fields. */
static void test_loss_scale_wrapping(void) {
    static const struct { const char *policy; mp_loss_scale_mode mode; float initial, want; } cases[] = {
        {"mixed_float16", MP_LOSS_SCALE_AUTO, 0, 32768.0f}, {"float16", MP_LOSS_SCALE_AUTO, 0, 0},
        {"mixed_bfloat16", MP_LOSS_SCALE_AUTO, 0, 0},       {"float32", MP_LOSS_SCALE_AUTO, 0, 0},
        {"bfloat16", MP_LOSS_SCALE_AUTO, 0, 0},             {"mixed_float16", MP_LOSS_SCALE_NONE, 0, 0},
        {"float32", MP_LOSS_SCALE_ON, 256.0f, 256.0f},      {"mixed_bfloat16", MP_LOSS_SCALE_ON, 0, 32768.0f},
    };
    static const int shape[] = {3, 0};
    size_t i;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mp_layer_desc d = mp_dense(2, MP_LINEAR);
        mp_model *m = make_model(cases[i].policy, shape, &d, 1);
        mp_compile_desc cd;
        const mp_loss_scale *ls;
        if (!m) continue;
        memset(&cd, 0, sizeof cd);
        cd.loss = MP_MEAN_SQUARED_ERROR;
        cd.loss_scale = cases[i].mode;
        cd.loss_scale_config.initial_scale = cases[i].initial;
        if (OK(mp_model_compile(m, &cd), m)) {
            ls = mp_model_loss_scale(m);
            if (cases[i].want > 0) {
                if (CHECK(ls != NULL)) CHECK(ls->scale == cases[i].want);
                CHECK(mp_current_loss_scale(m) == cases[i].want);
                CHECK(mp_get_scaled_loss(m, 0.75f) == 0.75f * cases[i].want);
            } else {
                if (!CHECK(ls == NULL)) fprintf(stderr, "    case %zu (%s) wrapped\n", i, cases[i].policy);
                CHECK(mp_current_loss_scale(m) == 1.0f);
                CHECK(mp_get_scaled_loss(m, 0.75f) == 0.75f);
            }
        }
        mp_model_destroy(m);
    }
}

/* ======================================================================== */
/* 5. A skipped step leaves every weight and optimizer slot bit-identical */

/* One custom-loop step; returns applied (0/1), or -1 on error. */
static int train_step(mp_model *m, const float *x, const float *y, int n) {
    float loss;
    int applied = -1;
    if (OK(forward_rows(m, x, n, 1), m) && OK(loss_rows(m, NULL, y, n, &loss, NULL), m) &&
        OK(mp_compute_scaled_gradients(m), m) && OK(mp_get_unscaled_gradients(m), m) &&
        OK(mp_apply_gradients(m, &applied), m))
        return applied;
    return -1;
}

/* mixed_float16, Adam, dynamic loss scale. After a few real steps (the
   slots are nonzero), inputs of +-200 make the scaled float16 gradients
   overflow (the forward pass itself stays finite): the step is skipped,
   weights and slots keep their bits, the scale halves, skipped_steps counts
   it. The next normal step applies again. */
static void test_skipped_step(void) {
    enum { B = 8, IN = 4 };
    static const int shape[] = {IN, 0};
    mp_layer_desc layers[2];
    mp_model *m;
    float x[B * IN], big[B * IN], y[B * 2], zero[B * 2] = {0};
    float *w0 = NULL, *w1 = NULL, *s0 = NULL, *s1 = NULL, *g = NULL;
    size_t n, ns, i;
    mp_loss_scale before;
    int applied = 0, tries, nonzero = 0, finite = 1;
    layers[0] = mp_dense(8, MP_RELU);
    layers[1] = mp_dense(2, MP_LINEAR);
    if (!(m = make_model("mixed_float16", shape, layers, 2))) return;
    if (!compile(m, MP_MEAN_SQUARED_ERROR, 0, MP_ADAM, 0.01f, MP_LOSS_SCALE_AUTO) || !CHECK(mp_model_loss_scale(m)))
        goto out;
    n = mp_model_param_count(m);
    ns = mp_optimizer_slot_count(m);
    CHECK(ns >= 2 * n); /* Adam: m and v for every weight */
    fill(x, B * IN, -0.5f, 0.5f);
    fill(y, B * 2, -0.5f, 0.5f);
    for (i = 0; i < B * IN; i++) big[i] = (i / IN) % 2 ? 200.0f : -200.0f; /* some relu is on */
    for (tries = 0; tries < 40 && applied < 3; tries++) {
        int r = train_step(m, x, y, B);
        if (r < 0) goto out;
        applied += r;
    }
    if (!CHECK(applied == 3)) goto out;
    w0 = floats(n), w1 = floats(n), s0 = floats(ns + 1), s1 = floats(ns + 1), g = floats(n);
    if (!OK(mp_model_get_weights(m, w0, n), m) || !OK(mp_get_optimizer_slots(m, s0, ns), m)) goto out;
    for (i = 0; i < ns; i++) nonzero += s0[i] != 0.0f;
    CHECK(nonzero > (int)n); /* both moments moved */
    before = *mp_model_loss_scale(m);
    CHECK(train_step(m, big, zero, B) == 0);
    if (OK(mp_model_get_weights(m, w1, n), m) && OK(mp_get_optimizer_slots(m, s1, ns), m)) {
        CHECK(memcmp(w0, w1, n * sizeof *w0) == 0);
        CHECK(memcmp(s0, s1, ns * sizeof *s0) == 0);
    }
    CHECK(mp_model_loss_scale(m)->scale == before.scale / 2);
    CHECK(mp_model_loss_scale(m)->skipped_steps == before.skipped_steps + 1);
    CHECK(mp_model_loss_scale(m)->steps == before.steps + 1);
    CHECK(mp_model_loss_scale(m)->good_steps == 0);
    if (OK(mp_get_gradients(m, g, n), m)) {
        for (i = 0; i < n; i++) finite &= isfinite(g[i]) != 0;
        CHECK(!finite); /* the unscaled gradients of that step carry its Inf/NaN */
    }
    CHECK(train_step(m, x, y, B) == 1);
    if (OK(mp_model_get_weights(m, w1, n), m)) CHECK(memcmp(w0, w1, n * sizeof *w0) != 0);
out:
    free(w0), free(w1), free(s0), free(s1), free(g);
    mp_model_destroy(m);
}

/* In one process a 16-bit layer's float32 gradients are deferred: the
   optimizer unscales them as it reads them, and mp_get_gradients writes
   them when asked. fit and the custom loop that way end with the same
   weights, slots, loss-scale state and gradients, to the bit, as a custom
   loop that writes them first (the diagnostics read them, so with
   diagnostics on they are written): with the scale growing after every
   good step (the update and the gradients asked for after it must use the
   step's scale, not the grown one) and a step whose float16 gradients
   overflow (skipped). */
static mp_model *deferral_model(const char *policy, mp_optimizer_kind opt, int write_first) {
    static const int shape[] = {4, 0};
    mp_layer_desc layers[2];
    mp_compile_desc cd;
    mp_numerics_desc nd;
    mp_model *m;
    layers[0] = mp_dense(8, MP_RELU);
    layers[1] = mp_dense(2, MP_LINEAR);
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_MEAN_SQUARED_ERROR;
    cd.optimizer.kind = opt;
    cd.optimizer.learning_rate = 0.01f;
    cd.optimizer.momentum = opt == MP_SGD ? 0.9f : 0.0f;
    cd.loss_scale = MP_LOSS_SCALE_AUTO;
    cd.loss_scale_config.growth_interval = 1;
    memset(&nd, 0, sizeof nd);
    nd.every = 1000; /* on, and no statistics taken in these steps */
    if (!(m = make_model(policy, shape, layers, 2))) return NULL;
    if (OK(mp_model_compile(m, &cd), m) && (!write_first || OK(mp_model_set_numerics(m, &nd), m))) return m;
    mp_model_destroy(m);
    return NULL;
}

/* weights, slots, then the last step's gradients */
static float *deferral_state(mp_model *m, size_t n, size_t ns) {
    float *v = floats(2 * n + ns);
    if (OK(mp_model_get_weights(m, v, n), m) && OK(mp_get_optimizer_slots(m, v + n, ns), m) &&
        OK(mp_get_gradients(m, v + n + ns, n), m))
        return v;
    free(v);
    return NULL;
}

static void deferred_like_written(const char *policy, mp_optimizer_kind opt) {
    enum { B = 8, IN = 4, OUT = 2, STEPS = 6, BIG = 3 };
    mp_model *m[3] = {NULL, NULL, NULL}; /* fit; the custom loop; the custom loop writing the copy first */
    float x[STEPS * B * IN], y[STEPS * B * OUT], loss, *v[3] = {NULL, NULL, NULL};
    mp_fit_desc fd;
    size_t n, ns, i;
    int step, k, applied;
    char what[128];
    fill(x, STEPS * B * IN, -0.5f, 0.5f);
    fill(y, STEPS * B * OUT, -0.5f, 0.5f);
    for (i = 0; i < B * IN; i++) x[BIG * B * IN + i] = (i / IN) % 2 ? 200.0f : -200.0f;
    for (i = 0; i < B * OUT; i++) y[BIG * B * OUT + i] = 0.0f;
    for (k = 0; k < 3; k++)
        if (!(m[k] = deferral_model(policy, opt, k == 2))) goto out;
    memset(&fd, 0, sizeof fd);
    fd.data = data_xt(x, IN, y, OUT, STEPS * B);
    fd.batch_size = B, fd.epochs = 1, fd.no_shuffle = 1, fd.verbose = MP_VERBOSE_SILENT;
    if (!OK(mp_model_fit(m[0], &fd), m[0])) goto out;
    for (k = 1; k < 3; k++)
        for (step = 0; step < STEPS; step++)
            if (!(OK(forward_rows(m[k], x + step * B * IN, B, 1), m[k]) &&
                  OK(loss_rows(m[k], NULL, y + step * B * OUT, B, &loss, NULL), m[k]) &&
                  OK(mp_compute_scaled_gradients(m[k]), m[k]) && OK(mp_get_unscaled_gradients(m[k]), m[k]) &&
                  OK(mp_apply_gradients(m[k], &applied), m[k])))
                goto out;
    n = mp_model_param_count(m[0]), ns = mp_optimizer_slot_count(m[0]);
    for (k = 0; k < 3; k++)
        if (!(v[k] = deferral_state(m[k], n, ns))) goto out;
    for (k = 0; k < 2; k++) {
        snprintf(what, sizeof what, "%s, optimizer %d, %s: the weights, slots and gradients of the written copy",
                 policy, (int)opt, k ? "custom loop" : "fit");
        check_report(memcmp(v[k], v[2], (2 * n + ns) * sizeof(float)) == 0, __FILE__, __LINE__, what);
        if (strcmp(policy, "mixed_float16") == 0) { /* the only policy Keras wraps */
            snprintf(what, sizeof what, "%s, optimizer %d: and its loss-scale state", policy, (int)opt);
            check_report(memcmp(mp_model_loss_scale(m[k]), mp_model_loss_scale(m[2]), sizeof(mp_loss_scale)) == 0,
                         __FILE__, __LINE__, what);
        }
    }
    if (strcmp(policy, "mixed_float16") == 0) /* three good steps (x 8), the skipped one (/ 2), two good ones (x 4) */
        CHECK(mp_model_loss_scale(m[0])->skipped_steps == 1 && mp_model_loss_scale(m[0])->scale == 32768.0f * 16);
out:
    for (k = 0; k < 3; k++) free(v[k]), mp_model_destroy(m[k]);
}

static void test_deferred_gradients(void) {
    static const char *const policies[] = {"float32", "mixed_float16", "mixed_bfloat16"};
    static const mp_optimizer_kind opts[] = {MP_SGD, MP_RMSPROP, MP_ADAM};
    size_t p, o;
    for (p = 0; p < sizeof policies / sizeof *policies; p++)
        for (o = 0; o < sizeof opts / sizeof *opts; o++) deferred_like_written(policies[p], opts[o]);
}

/* ======================================================================== */
/* 6. Training works: fit, evaluate and predict */

/* Four Gaussian blobs in 8 dimensions: class k centred at 4 e_k with unit
   variance (the best possible accuracy is about 99%). */
static void blobs(float *x, int32_t *labels, size_t n) {
    size_t i, j;
    for (i = 0; i < n; i++) {
        int k = (int)(rng_next() % 4);
        labels[i] = k;
        for (j = 0; j < 8; j++) x[i * 8 + j] = normal() + (j == (size_t)k ? 4.0f : 0.0f);
    }
}

static int is_power_of_two(float s) {
    int e;
    return s > 0 && isfinite(s) && frexpf(s, &e) == 0.5f;
}

/* A small MLP reaches >= 0.95 accuracy with fit (validation_split 0.2,
   shuffled, silent); the history is filled for every epoch; evaluate and
   predict agree on accuracy and loss. */
static void train_blobs(const char *policy) {
    enum { N = 2000, NT = 1000, EPOCHS = 5, BATCH = 32 };
    static const int shape[] = {8, 0};
    float *x = floats(N * 8), *xt = floats(NT * 8), *probs = floats(NT * 4);
    int32_t *labels = (int32_t *)zalloc(N * 4), *lt = (int32_t *)zalloc(NT * 4);
    mp_layer_desc layers[3];
    mp_logs hist[EPOCHS], ev;
    mp_fit_desc fd;
    mp_data test;
    mp_model *m;
    int e, bad = 0;
    char msg[128];
    blobs(x, labels, N);
    blobs(xt, lt, NT);
    layers[0] = mp_dense(32, MP_RELU);
    layers[1] = mp_dense(4, MP_LINEAR);
    layers[2] = with_dtype(mp_activation_layer(MP_SOFTMAX), "float32");
    if (!(m = make_model(policy, shape, layers, 3))) goto out;
    if (!compile(m, MP_SPARSE_CATEGORICAL_CROSSENTROPY, 0, MP_ADAM, 0.005f, MP_LOSS_SCALE_AUTO)) goto out;
    memset(hist, 0xFF, sizeof hist); /* NaN and all ones until fit fills them */
    memset(&fd, 0, sizeof fd);
    fd.data = data_xy(x, 8, labels, N);
    fd.batch_size = BATCH, fd.epochs = EPOCHS, fd.validation_split = 0.2f, fd.verbose = MP_VERBOSE_SILENT;
    fd.history = hist;
    if (!OK(mp_model_fit(m, &fd), m)) goto out;
    for (e = 0; e < EPOCHS; e++)
        bad += !(hist[e].steps == 50 && hist[e].loss > 0 && isfinite(hist[e].loss) && hist[e].accuracy >= 0 &&
                 hist[e].accuracy <= 1 && hist[e].val_loss > 0 && isfinite(hist[e].val_loss) &&
                 hist[e].val_accuracy >= 0 && hist[e].val_accuracy <= 1 && hist[e].seconds >= 0 &&
                 isfinite(hist[e].seconds) && hist[e].ms_per_step >= 0 && isfinite(hist[e].ms_per_step) &&
                 is_power_of_two(hist[e].loss_scale));
    snprintf(msg, sizeof msg, "%s: fit fills every history entry (50 steps of 1600 samples)", policy);
    check_all(bad, msg, "see the history", __FILE__, __LINE__);
    snprintf(msg, sizeof msg, "%s: fit reaches 0.95 (train %.3f, val %.3f; loss %.3f -> %.3f)", policy,
             (double)hist[EPOCHS - 1].accuracy, (double)hist[EPOCHS - 1].val_accuracy, (double)hist[0].loss,
             (double)hist[EPOCHS - 1].loss);
    check_report(hist[EPOCHS - 1].accuracy >= 0.95f && hist[EPOCHS - 1].val_accuracy >= 0.95f &&
                 hist[EPOCHS - 1].loss < hist[0].loss, __FILE__, __LINE__, msg);
    if (strcmp(policy, "mixed_float16") == 0) CHECK(hist[EPOCHS - 1].loss_scale <= 32768.0f);
    else CHECK(hist[EPOCHS - 1].loss_scale == 1.0f && hist[EPOCHS - 1].skipped_steps == 0);
    memset(&test, 0, sizeof test);
    test = data_xy(xt, 8, lt, NT);
    memset(&ev, 0, sizeof ev);
    if (OK(mp_model_evaluate(m, &test, 128, &ev), m) && OK(mp_model_predict(m, &test, 128, probs, NT * 4), m)) {
        size_t right = 0, i;
        int j;
        double loss = 0.0;
        for (i = 0; i < NT; i++) {
            int arg = 0;
            for (j = 1; j < 4; j++) arg = probs[i * 4 + j] > probs[i * 4 + arg] ? j : arg;
            right += arg == lt[i];
            loss -= log(fmin(fmax(probs[i * 4 + lt[i]], 1e-7), 1 - 1e-7)) / NT;
        }
        snprintf(msg, sizeof msg, "%s: evaluate's accuracy %.4f >= 0.95", policy, (double)ev.accuracy);
        check_report(ev.accuracy >= 0.95f, __FILE__, __LINE__, msg);
        CHECK_NEAR(ev.accuracy, (double)right / NT, 0.0, 0.5 / NT); /* predict's argmax accuracy */
        CHECK_NEAR(ev.loss, loss, 1e-3, 1e-6);                        /* the mean over all samples */
    }
out:
    mp_model_destroy(m);
    free(x), free(xt), free(probs), free(labels), free(lt);
}

static void test_training(void) {
    train_blobs("float32");
    train_blobs("mixed_float16");
    train_blobs("mixed_bfloat16");
}

/* The CSV log: the header, a step row per step (no validation columns) and
   an epoch row per epoch whose numbers are the history's; an unwritable
   path is MP_ERR_IO before any step. */
static void test_csv_log(void) {
    enum { N = 500, EPOCHS = 2, BATCH = 50, STEPS = 8 }; /* 400 training samples */
    static const char path[] = "/tmp/mixprec_test_train_log.csv";
    static const int shape[] = {8, 0};
    float *x = floats(N * 8), *w0, *w1;
    int32_t *labels = (int32_t *)zalloc(N * 4);
    mp_layer_desc layers[2];
    mp_logs hist[EPOCHS];
    mp_fit_desc fd;
    mp_model *m;
    char line[512];
    FILE *f;
    int steps = 0, epochs = 0, ordered = 1, fields_ok = 1;
    size_t last_step = 0, n;
    blobs(x, labels, N);
    layers[0] = mp_dense(16, MP_RELU);
    layers[1] = mp_dense(4, MP_SOFTMAX);
    if (!(m = make_model("mixed_float16", shape, layers, 2))) goto out;
    if (!compile(m, MP_SPARSE_CATEGORICAL_CROSSENTROPY, 0, MP_RMSPROP, 0.0f, MP_LOSS_SCALE_AUTO)) goto out;
    memset(&fd, 0, sizeof fd);
    fd.data = data_xy(x, 8, labels, N);
    fd.batch_size = BATCH, fd.epochs = EPOCHS, fd.validation_split = 0.2f, fd.verbose = MP_VERBOSE_SILENT;
    fd.history = hist;
    fd.csv_path = "/nonexistent-directory/log.csv";
    n = mp_model_param_count(m);
    w0 = floats(n), w1 = floats(n);
    mp_model_get_weights(m, w0, n);
    CHECK(mp_model_fit(m, &fd) == MP_ERR_IO);
    mp_model_get_weights(m, w1, n);
    CHECK(memcmp(w0, w1, n * sizeof *w0) == 0);
    free(w0), free(w1);
    fd.csv_path = path;
    fd.csv_per_step = 1;
    if (!OK(mp_model_fit(m, &fd), m) || !CHECK((f = fopen(path, "r")) != NULL)) goto out;
    CHECK(fgets(line, sizeof line, f) &&
          strcmp(line, "kind,epoch,step,loss,accuracy,val_loss,val_accuracy,loss_scale,skipped_steps\n") == 0);
    while (fgets(line, sizeof line, f)) {
        char kind[16];
        int epoch;
        unsigned long step, skipped;
        float loss, acc, vl = -1.0f, va = -1.0f, scale;
        int got = sscanf(line, "%15[a-z],%d,%lu,%f,%f,%f,%f,%f,%lu", kind, &epoch, &step, &loss, &acc, &vl, &va,
                         &scale, &skipped);
        ordered &= step >= last_step;
        last_step = step;
        if (strcmp(kind, "step") == 0) {
            steps++;
            fields_ok &= sscanf(line, "%15[a-z],%d,%lu,%f,%f,,,%f,%lu", kind, &epoch, &step, &loss, &acc, &scale,
                                &skipped) == 7 && step == (unsigned long)steps;
        } else if (got == 9 && epoch >= 1 && epoch <= EPOCHS) {
            const mp_logs *h = &hist[epoch - 1];
            epochs++;
            fields_ok &= step == (unsigned long)(epoch * STEPS) && fabsf(loss - h->loss) <= 1e-5f * (1 + h->loss) &&
                         fabsf(va - h->val_accuracy) <= 1e-5f && scale == h->loss_scale &&
                         skipped == h->skipped_steps;
        } else {
            fields_ok = 0;
        }
    }
    fclose(f);
    remove(path);
    CHECK(steps == EPOCHS * STEPS && epochs == EPOCHS && ordered && fields_ok);
out:
    mp_model_destroy(m);
    free(x), free(labels);
}

/* ======================================================================== */
/* 7. Memory accounting */

/* A tensor of n elements holds exactly n * size bytes, zeroed; freeing it
   returns the count; reset_peak sets peak to current. */
static void test_tensor_memory(void) {
    static const mp_dtype dtypes[] = {MP_FLOAT16, MP_BFLOAT16, MP_FLOAT32};
    static const int shape[3] = {4, 32, 32};
    size_t d;
    for (d = 0; d < 3; d++) {
        mp_tensor t;
        size_t start = mp_get_memory_info().current, i, nonzero = 0;
        memset(&t, 0, sizeof t);
        if (!OK(mp_tensor_alloc(&t, dtypes[d], 3, shape), NULL)) continue;
        CHECK(mp_tensor_count(&t) == 4096 && mp_tensor_bytes(&t) == 4096 * mp_dtype_size(dtypes[d]));
        CHECK(t.dtype == dtypes[d] && t.rank == 3 && t.shape[0] == 4 && t.shape[1] == 32 && t.shape[2] == 32);
        if (!CHECK(mp_get_memory_info().current - start == 4096 * mp_dtype_size(dtypes[d])))
            fprintf(stderr, "    %s: %zu bytes counted\n", mp_dtype_name(dtypes[d]), mp_get_memory_info().current - start);
        CHECK(mp_get_memory_info().peak >= mp_get_memory_info().current);
        for (i = 0; i < mp_tensor_bytes(&t); i++) nonzero += ((const unsigned char *)t.data)[i] != 0;
        CHECK(nonzero == 0);
        mp_tensor_free(&t);
        CHECK(t.data == NULL && mp_get_memory_info().current == start);
        mp_reset_peak_memory();
        CHECK(mp_get_memory_info().peak == start);
    }
}

/* The CPU backend's optimizer update on weights, gradients and state full
   of tiny and subnormal values (where the AVX-512 path multiplies and
   divides in float64, mp__opt_block_x) against the same update in scalar
   float32, an operation a statement (no fused multiply-add), to the bit:
   SGD, with momentum, Nesterov, RMSprop and Adam, a loss scale of 2^15. */
static float tiny_value(unsigned i) {
    static const int exponents[] = {0, -40, -62, -90, -120, -127, -140, -1000}; /* -1000: 0 */
    float v = (float)((i * 2654435761u) % 1000u + 1u) * 1e-3f * ldexpf(1.0f, exponents[(i / 3u) % 8u]);
    return i % 5u == 0 ? -v : v;
}
static void optimizer_reference(const mp_optimizer_desc *o, float alpha, float inv_scale, float *w, const float *g,
                                float *s1, float *s2, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        /* volatile: no fused multiply-add in any build (g++ contracts by default) */
        volatile float gv = g[i] * inv_scale, lr_g = o->learning_rate * gv, t, u;
        if (o->kind == MP_SGD && o->momentum == 0.0f) {
            w[i] = w[i] - lr_g;
        } else if (o->kind == MP_SGD) {
            t = o->momentum * s1[i];
            s1[i] = t - lr_g;
            if (o->nesterov) {
                t = o->momentum * s1[i];
                t = t - lr_g;
            } else {
                t = s1[i];
            }
            w[i] = w[i] + t;
        } else if (o->kind == MP_RMSPROP) {
            t = o->rho * s1[i];
            u = gv * gv;
            u = (1.0f - o->rho) * u;
            s1[i] = t + u;
            t = s1[i] + o->epsilon;
            t = sqrtf(t);
            t = lr_g / t;
            w[i] = w[i] - t;
        } else {
            t = gv - s1[i];
            t = t * (1.0f - o->beta_1);
            s1[i] = s1[i] + t;
            t = gv * gv;
            t = t - s2[i];
            t = t * (1.0f - o->beta_2);
            s2[i] = s2[i] + t;
            t = alpha * s1[i];
            u = sqrtf(s2[i]);
            u = u + o->epsilon;
            t = t / u;
            w[i] = w[i] - t;
        }
    }
}
/* A float32 model of the one layer d on inputs of one value, compiled
   for mean squared error with optimizer o, its weights w0[n]; NULL (and
   the failure reported) if any call fails. */
static mp_model *mse_model(mp_layer_desc d, const mp_optimizer_desc *o, const float *w0, size_t n) {
    static const int shape[] = {1, 0};
    mp_model *m = make_model("float32", shape, &d, 1);
    mp_compile_desc cd;
    if (!m) return NULL;
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_MEAN_SQUARED_ERROR;
    cd.optimizer = *o;
    if (OK(mp_model_compile(m, &cd), m) && OK(mp_model_set_weights(m, w0, n), m)) return m;
    mp_model_destroy(m);
    return NULL;
}

/* One weight's step by Keras 3's formula for the kind, in double, with
   Keras's defaults (rho 0.9, beta_1 0.9, beta_2 0.999, epsilon 1e-7); s1
   and s2 its slots, t the step (1 first). */
static double keras_step(mp_optimizer_kind kind, double w, double g, double lr, double mu, int nesterov, double *s1,
                         double *s2, int t) {
    const double rho = 0.9, beta_1 = 0.9, beta_2 = 0.999, eps = 1e-7;
    if (kind == MP_SGD && mu == 0.0) return w - lr * g;
    if (kind == MP_SGD) {
        *s1 = mu * *s1 - lr * g;
        return w + (nesterov ? mu * *s1 - lr * g : *s1);
    }
    if (kind == MP_RMSPROP) {
        *s1 = rho * *s1 + (1 - rho) * g * g;
        return w - lr * g / sqrt(*s1 + eps);
    }
    *s1 += (g - *s1) * (1 - beta_1);
    *s2 += (g * g - *s2) * (1 - beta_2);
    return w - lr * sqrt(1 - pow(beta_2, t)) / (1 - pow(beta_1, t)) * *s1 / (sqrt(*s2) + eps);
}

/* Each optimizer, six steps of a custom loop, against Keras 3's formulas
   applied one step at a time in double to the weights the step started
   from, the gradients mp_get_gradients gave and the reference's own slots
   (Keras's defaults where the description leaves zero):
     SGD:      m = momentum m - lr g; w += m, or with nesterov
               w += momentum m - lr g (plain SGD: w -= lr g);
     RMSprop:  v = rho v + (1 - rho) g^2; w -= lr g / sqrt(v + epsilon);
     Adam:     m += (g - m)(1 - beta_1); v += (g^2 - v)(1 - beta_2);
               w -= lr sqrt(1 - beta_2^t) / (1 - beta_1^t) m / (sqrt(v) + epsilon).
   The model's three weights are its outputs (Dense(3) without bias on the
   input 1), so MSE gives each its own gradient: large, small (1e-4, where
   RMSprop's and Adam's epsilon matters) and of the other sign. Each step
   must move each weight as the formula does, within 1e-3 of the step. */
static void test_optimizer_keras_steps(void) {
    enum { K = 3, STEPS = 6 };
    static const struct {
        const char *what;
        mp_optimizer_kind kind;
        float lr, momentum;
        int nesterov;
    } cases[] = {
        {"SGD", MP_SGD, 0.1f, 0.0f, 0},
        {"SGD momentum 0.9", MP_SGD, 0.1f, 0.9f, 0},
        {"SGD momentum 0.9 nesterov", MP_SGD, 0.1f, 0.9f, 1},
        {"SGD momentum 0.5 nesterov", MP_SGD, 0.1f, 0.5f, 1},
        {"RMSprop", MP_RMSPROP, 1e-3f, 0.0f, 0},
        {"Adam", MP_ADAM, 1e-3f, 0.0f, 0},
    };
    const float w0[K] = {0.5f, -0.25f, 1.0f};
    const float x[1] = {1.0f}, y[K] = {-0.625f, -0.25015f, 1.003f}; /* gradients 2/3 (w - y) */
    size_t c;
    for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        mp_optimizer_desc o;
        mp_model *m;
        double s1[K] = {0, 0, 0}, s2[K] = {0, 0, 0};
        int step, j, bad = 0, applied = 0;
        char detail[160] = "";
        batch b;
        memset(&o, 0, sizeof o);
        o.kind = cases[c].kind;
        o.learning_rate = cases[c].lr;
        o.momentum = cases[c].momentum;
        o.nesterov = cases[c].nesterov;
        b.x = (float *)x, b.labels = NULL, b.y = (float *)y, b.n = 1, b.loss = MP_MEAN_SQUARED_ERROR;
        if (!(m = mse_model(without_bias(mp_dense(K, MP_LINEAR)), &o, w0, K))) continue;
        for (step = 1; step <= STEPS; step++) {
            float before[K], g[K], after[K];
            double lr = cases[c].lr, mu = cases[c].momentum;
            if (!OK(mp_model_get_weights(m, before, K), m) || !gradients(m, &b, g, K, NULL) ||
                !OK(mp_apply_gradients(m, &applied), m) || !CHECK(applied) || !OK(mp_model_get_weights(m, after, K), m))
                goto next;
            for (j = 0; j < K; j++) {
                double w = before[j], gj = g[j];
                double want = keras_step(cases[c].kind, w, gj, lr, mu, cases[c].nesterov, &s1[j], &s2[j], step);
                if (!(fabs(after[j] - want) <= 1e-3 * fabs(want - w) + 2e-7) && bad++ == 0)
                    snprintf(detail, sizeof detail, "step %d, weight %d (gradient %.3g): %.9g -> %.9g, want %.9g",
                             step, j, gj, w, (double)after[j], want);
            }
        }
        check_all(bad, cases[c].what, detail, __FILE__, __LINE__);
    next:
        mp_model_destroy(m);
    }
}

static void test_optimizer_subnormals(void) {
    enum { N = 1003 };
    static const mp_optimizer_kind kinds[] = {MP_SGD, MP_SGD, MP_SGD, MP_RMSPROP, MP_ADAM};
    const mp_backend *cpu = mp_cpu_backend();
    float *w = floats(N), *g = floats(N), *s1 = floats(N), *s2 = floats(N);
    float *rw = floats(N), *r1 = floats(N), *r2 = floats(N), scale = 32768.0f;
    void *ctx = NULL;
    size_t k, i;
    if (!CHECK(cpu->create(&ctx, 2, NULL) == MP_OK)) goto out;
    for (k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        mp_opt_step step;
        float alpha;
        memset(&step, 0, sizeof step);
        step.cfg.kind = kinds[k];
        step.cfg.learning_rate = 1e-3f;
        step.cfg.momentum = k == 0 ? 0.0f : 0.9f;
        step.cfg.nesterov = k == 2;
        step.cfg.rho = 0.9f, step.cfg.beta_1 = 0.9f, step.cfg.beta_2 = 0.999f, step.cfg.epsilon = 1e-7f;
        step.iteration = 3;
        alpha = kinds[k] == MP_ADAM ? step.cfg.learning_rate * sqrtf(1.0f - powf(step.cfg.beta_2, 3.0f)) /
                                          (1.0f - powf(step.cfg.beta_1, 3.0f))
                                    : 0.0f;
        for (i = 0; i < N; i++) {
            w[i] = rw[i] = tiny_value((unsigned)i + 7u);
            g[i] = tiny_value((unsigned)i * 3u + 1u);
            s1[i] = r1[i] = kinds[k] == MP_ADAM ? tiny_value((unsigned)i + 11u) : fabsf(tiny_value((unsigned)i + 11u));
            s2[i] = r2[i] = fabsf(tiny_value((unsigned)i * 7u + 5u));
        }
        cpu->optimizer_update(ctx, &step, w, g, MP_FLOAT32, &scale, s1, s2, N, NULL, MP_FLOAT32, NULL);
        optimizer_reference(&step.cfg, alpha, 1.0f / scale, rw, g, r1, r2, N);
        if (!CHECK(memcmp(w, rw, N * sizeof(float)) == 0 && memcmp(s1, r1, N * sizeof(float)) == 0 &&
                   (kinds[k] != MP_ADAM || memcmp(s2, r2, N * sizeof(float)) == 0)))
            fprintf(stderr, "    optimizer %d (momentum %g, nesterov %d): not the scalar update's bits\n",
                    (int)kinds[k], (double)step.cfg.momentum, step.cfg.nesterov);
    }
    cpu->destroy(ctx);
out:
    free(w), free(g), free(s1), free(s2), free(rw), free(r1), free(r2);
}

/* The update reading 16-bit gradients and writing the copy in the
   compute dtype in its own pass (mp__opt_range): weights, slots and copy
   against the scalar update of the widened gradients and mp_convert of its
   weights, to the bit. Every mix of gradient and copy dtype; lengths that
   leave a tail, in the second thread's part too; weights that are normal,
   tiny and subnormal (the bfloat16 pair narrowing's fallback); and a
   variable of 2^24 + 45 weights, whose copy goes around the caches
   (mp__streams: mp_convert's MP__CAST_FAR), checked a chunk at a time. */
static float copy_test_value(size_t i, int slot) {
    unsigned u = (unsigned)(i * 2u + (unsigned)slot);
    float v = i % 7u == 3u ? tiny_value(u) : ((float)((u * 2654435761u) % 2001u) - 1000.0f) * 1e-3f;
    return slot ? fabsf(v) : v;
}
static void test_optimizer_copy(void) {
    enum { CHUNK = 4096 };
    static const size_t lengths[] = {1, 45, 1003, ((size_t)1 << 24) + 45};
    static const mp_dtype grads[] = {MP_FLOAT32, MP_FLOAT16, MP_BFLOAT16}, copies[] = {MP_FLOAT16, MP_BFLOAT16};
    static const mp_optimizer_kind kinds[] = {MP_RMSPROP, MP_ADAM};
    const mp_backend *cpu = mp_cpu_backend();
    void *ctx = NULL;
    size_t l, gi, ci, k;
    if (!CHECK(cpu->create(&ctx, 2, NULL) == MP_OK)) return;
    for (l = 0; l < sizeof lengths / sizeof lengths[0]; l++)
        for (gi = 0; gi < 3; gi++)
            for (ci = 0; ci < 2; ci++)
                for (k = 0; k < 2; k++) {
                    size_t n = lengths[l], i, j, bad = 0;
                    int big = n > (size_t)CHUNK;
                    mp_dtype gt = grads[gi], wt = copies[ci];
                    mp_opt_step step;
                    float scale = 1024.0f, alpha = 0.0f;
                    float *w, *s1, *s2, *gw, rw[CHUNK], r1[CHUNK], r2[CHUNK], rg[CHUNK];
                    unsigned char *g, *wc_block, *wc, rc[CHUNK * 2];
                    if (big && (gt != MP_BFLOAT16 || wt != MP_BFLOAT16 || kinds[k] != MP_RMSPROP)) continue;
                    memset(&step, 0, sizeof step);
                    step.cfg.kind = kinds[k];
                    step.cfg.learning_rate = 1e-3f;
                    step.cfg.rho = 0.9f, step.cfg.beta_1 = 0.9f, step.cfg.beta_2 = 0.999f, step.cfg.epsilon = 1e-7f;
                    step.iteration = 2;
                    if (kinds[k] == MP_ADAM)
                        alpha = step.cfg.learning_rate * sqrtf(1.0f - powf(step.cfg.beta_2, 2.0f)) /
                                (1.0f - powf(step.cfg.beta_1, 2.0f));
                    w = floats(n), s1 = floats(n), s2 = floats(n), gw = floats(n);
                    g = (unsigned char *)malloc(n * mp_dtype_size(gt));
                    wc_block = (unsigned char *)malloc(n * 2 + 64);
                    if (!CHECK(w && s1 && s2 && gw && g && wc_block)) goto next;
                    wc = wc_block + (64 - (uintptr_t)wc_block % 64) % 64; /* whole lines, as the model's copies */
                    for (i = 0; i < n; i++) w[i] = copy_test_value(i, 0), s1[i] = s2[i] = copy_test_value(i, 1);
                    for (i = 0; i < n; i++) gw[i] = copy_test_value(i + 5, 0) * 4096.0f;
                    CHECK(mp_convert(g, gt, gw, MP_FLOAT32, n, NULL) == MP_OK); /* gradients exact in gt */
                    cpu->optimizer_update(ctx, &step, w, g, gt, &scale, s1, s2, n, wc, wt, NULL);
                    for (i = 0; i < n; i += CHUNK) {
                        size_t len = n - i < (size_t)CHUNK ? n - i : (size_t)CHUNK;
                        for (j = 0; j < len; j++)
                            rw[j] = copy_test_value(i + j, 0), r1[j] = r2[j] = copy_test_value(i + j, 1);
                        mp_convert(rg, MP_FLOAT32, g + i * mp_dtype_size(gt), gt, len, NULL);
                        optimizer_reference(&step.cfg, alpha, 1.0f / scale, rw, rg, r1, r2, len);
                        mp_convert(rc, wt, rw, MP_FLOAT32, len, NULL);
                        bad += memcmp(w + i, rw, len * 4) != 0 || memcmp(s1 + i, r1, len * 4) != 0 ||
                               (kinds[k] == MP_ADAM && memcmp(s2 + i, r2, len * 4) != 0) ||
                               memcmp(wc + i * 2, rc, len * 2) != 0;
                    }
                    if (!CHECK(bad == 0))
                        fprintf(stderr, "    %zu weights, gradients %s, copy %s, optimizer %d: %zu chunks differ\n", n,
                                mp_dtype_name(gt), mp_dtype_name(wt), (int)kinds[k], bad);
                next:
                    free(w), free(s1), free(s2), free(gw), free(g), free(wc_block);
                }
    cpu->destroy(ctx);
}

/* The options of Keras 3's base optimizer, six steps of a custom loop
   against its formulas in double (keras/src/optimizers/base_optimizer.py,
   apply: clip, then weight decay, then the update): clipnorm scales each
   variable's gradient by c / max(|g|, c), clipvalue clamps it to
   [-c, c], global_clipnorm scales every gradient by min(1, c / |G|);
   decay is w -= w wd lr before the update, on the variables whose path
   contains none of the excluded strings. A Dense(3) with bias on the
   input 2: kernel and bias, two variables, their gradients apart. */
static void test_optimizer_options(void) {
    enum { K = 6, STEPS = 6 };
    static const char *const bias_only[] = {"dense/bias", NULL}, *const every[] = {"", NULL};
    static const struct {
        const char *what;
        mp_optimizer_kind kind;
        float lr, wd;
        int no_wd;
        const char *const *exclude;
        float clipnorm, clipvalue, global_clipnorm;
    } cases[] = {
        {"AdamW (Keras's weight_decay 0.004)", MP_ADAMW, 0.05f, 0.0f, 0, NULL, 0, 0, 0},
        {"AdamW weight_decay 0.5, the bias excluded", MP_ADAMW, 0.05f, 0.5f, 0, bias_only, 0, 0, 0},
        {"AdamW no_weight_decay", MP_ADAMW, 0.05f, 0.0f, 1, NULL, 0, 0, 0},
        {"AdamW, every variable excluded", MP_ADAMW, 0.05f, 0.5f, 0, every, 0, 0, 0},
        {"SGD weight_decay 0.5", MP_SGD, 0.1f, 0.5f, 0, NULL, 0, 0, 0},
        {"RMSprop weight_decay 0.5", MP_RMSPROP, 1e-2f, 0.5f, 0, NULL, 0, 0, 0},
        {"SGD clipnorm 0.5", MP_SGD, 0.1f, 0.0f, 0, NULL, 0.5f, 0, 0},
        {"SGD clipvalue 0.1", MP_SGD, 0.1f, 0.0f, 0, NULL, 0, 0.1f, 0},
        {"SGD global_clipnorm 0.3", MP_SGD, 0.1f, 0.0f, 0, NULL, 0, 0, 0.3f},
        {"AdamW global_clipnorm 0.3, the bias excluded", MP_ADAMW, 0.05f, 0.5f, 0, bias_only, 0, 0, 0.3f},
    };
    const float w0[K] = {0.5f, -0.25f, 1.0f, 0.125f, -0.5f, 0.25f}; /* kernel (1, 3), then bias */
    const float x[1] = {2.0f}, y[3] = {-0.625f, -1.25015f, 3.003f};
    size_t c;
    for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        mp_optimizer_desc o;
        mp_model *m;
        double s1[K] = {0}, s2[K] = {0};
        double wd = cases[c].no_wd ? 0.0 : cases[c].wd != 0.0f ? cases[c].wd : cases[c].kind == MP_ADAMW ? 0.004 : 0.0;
        int step, j, bad = 0, applied = 0;
        char detail[200] = "";
        batch b;
        memset(&o, 0, sizeof o);
        o.kind = cases[c].kind;
        o.learning_rate = cases[c].lr;
        o.weight_decay = cases[c].wd;
        o.no_weight_decay = cases[c].no_wd;
        o.exclude_from_weight_decay = cases[c].exclude;
        o.clipnorm = cases[c].clipnorm;
        o.clipvalue = cases[c].clipvalue;
        o.global_clipnorm = cases[c].global_clipnorm;
        b.x = (float *)x, b.labels = NULL, b.y = (float *)y, b.n = 1, b.loss = MP_MEAN_SQUARED_ERROR;
        if (!(m = mse_model(mp_dense(3, MP_LINEAR), &o, w0, K))) continue;
        for (step = 1; step <= STEPS; step++) {
            float before[K], g[K], after[K];
            double lr = cases[c].lr, gc[K], norm[2] = {0, 0}, all;
            if (!OK(mp_model_get_weights(m, before, K), m) || !gradients(m, &b, g, K, NULL) ||
                !OK(mp_apply_gradients(m, &applied), m) || !CHECK(applied) || !OK(mp_model_get_weights(m, after, K), m))
                goto next;
            for (j = 0; j < K; j++) norm[j / 3] += (double)g[j] * g[j];
            all = sqrt(norm[0] + norm[1]);
            for (j = 0; j < K; j++) {
                double n = sqrt(norm[j / 3]), cn = cases[c].clipnorm, cv = cases[c].clipvalue;
                double cg = cases[c].global_clipnorm;
                gc[j] = g[j];
                if (cn > 0) gc[j] = gc[j] * cn / (n > cn ? n : cn);
                if (cv > 0) gc[j] = gc[j] < -cv ? -cv : gc[j] > cv ? cv : gc[j];
                if (cg > 0) gc[j] = gc[j] * (all > cg ? cg / all : 1.0);
            }
            for (j = 0; j < K; j++) {
                double w = before[j], gj = gc[j], want;
                int excluded = cases[c].exclude && (cases[c].exclude == every || j >= 3);
                if (!excluded) w -= w * wd * lr;
                want = keras_step(cases[c].kind, w, gj, lr, 0.0, 0, &s1[j], &s2[j], step);
                if (!(fabs(after[j] - want) <= 1e-3 * fabs(want - before[j]) + 2e-7) && bad++ == 0)
                    snprintf(detail, sizeof detail, "step %d, weight %d (gradient %.3g, clipped %.3g): %.9g -> %.9g, "
                             "want %.9g", step, j, (double)g[j], gj, (double)before[j], (double)after[j], want);
            }
        }
        check_all(bad, cases[c].what, detail, __FILE__, __LINE__);
    next:
        mp_model_destroy(m);
    }
}

/* Gradient accumulation over 4 steps (Keras 3's
   gradient_accumulation_steps, _backend_apply_gradients): the weights
   stay through the first three steps of a window, the fourth applies
   Adam to (g4 + g1 + g2 + g3) / 4 with t the window's number, with
   global_clipnorm on the average; each step's own batch (its own
   gradients). Under loss scaling a step whose gradients hold Inf (a huge
   input) is dropped from the window: the window then needs one more. */
static void test_gradient_accumulation(void) {
    enum { K = 6, N = 4 };
    const float w0[K] = {0.5f, -0.25f, 1.0f, 0.125f, -0.5f, 0.25f};
    const float xs[5] = {2.0f, -1.0f, 0.5f, 3.0f, 1e30f}, y[3] = {-0.625f, -1.25015f, 3.003f};
    int scaled;
    for (scaled = 0; scaled < 2; scaled++) {
        mp_optimizer_desc o;
        mp_model *m;
        double acc[K] = {0}, s1[K] = {0}, s2[K] = {0}, ref[K];
        int step, j, in_window = 0, windows = 0, bad = 0, applied;
        char detail[200] = "";
        batch b;
        memset(&o, 0, sizeof o);
        o.kind = MP_ADAM;
        o.learning_rate = 0.05f;
        o.global_clipnorm = 1.0f;
        o.gradient_accumulation_steps = N;
        b.labels = NULL, b.y = (float *)y, b.n = 1, b.loss = MP_MEAN_SQUARED_ERROR;
        if (!(m = mse_model(mp_dense(3, MP_LINEAR), &o, w0, K))) continue;
        if (scaled) {
            mp_compile_desc cd;
            memset(&cd, 0, sizeof cd);
            cd.loss = MP_MEAN_SQUARED_ERROR, cd.optimizer = o, cd.loss_scale = MP_LOSS_SCALE_ON;
            if (!OK(mp_model_compile(m, &cd), m) || !OK(mp_model_set_weights(m, w0, K), m)) goto next;
        }
        for (j = 0; j < K; j++) ref[j] = w0[j];
        for (step = 0; step < 2 * N + 1; step++) {
            float g[K], after[K];
            int inf = scaled && step == 2, last;
            double norm = 0.0;
            b.x = (float *)&xs[inf ? 4 : step % 4];
            if (!gradients(m, &b, g, K, NULL) || !OK(mp_apply_gradients(m, &applied), m) ||
                !OK(mp_model_get_weights(m, after, K), m))
                goto next;
            last = !inf && in_window == N - 1;
            if (!inf) in_window++;
            if (last) {
                windows++, in_window = 0;
                for (j = 0; j < K; j++) acc[j] = (g[j] + acc[j]) / N, norm += acc[j] * acc[j];
                for (j = 0; j < K; j++) {
                    double gj = acc[j] * (sqrt(norm) > 1.0 ? 1.0 / sqrt(norm) : 1.0);
                    ref[j] = keras_step(MP_ADAM, ref[j], gj, 0.05, 0.0, 0, &s1[j], &s2[j], windows);
                    acc[j] = 0.0;
                }
            } else if (!inf) {
                for (j = 0; j < K; j++) acc[j] += g[j];
            }
            if (applied != last && bad++ == 0) snprintf(detail, sizeof detail, "step %d: applied %d", step, applied);
            for (j = 0; j < K; j++)
                if (!(fabs(after[j] - ref[j]) <= 1e-5 * fabs(ref[j]) + 1e-7) && bad++ == 0)
                    snprintf(detail, sizeof detail, "step %d, weight %d: %.9g, want %.9g", step, j, (double)after[j], ref[j]);
        }
        if (!CHECK(windows == 2)) fprintf(stderr, "    %d windows\n", windows);
        check_all(bad, scaled ? "accumulation, a step with Inf dropped" : "accumulation over 4 steps", detail, __FILE__,
                  __LINE__);
    next:
        mp_model_destroy(m);
    }
}

/* mp_set_gradients between unscale and apply: SGD (lr 0.1, weight
   decay 0.5, clipvalue 0.3) applies the gradients set, not the model's:
   w -= w 0.5 0.1, then w -= 0.1 clip(g'); under loss scaling a NaN set
   skips the step, as the LossScaleOptimizer's check of what apply gets.
   Out of order or of the wrong length it is refused and changes nothing. */
static void test_set_gradients(void) {
    enum { K = 6 };
    const float w0[K] = {0.5f, -0.25f, 1.0f, 0.125f, -0.5f, 0.25f}, x[1] = {2.0f}, y[3] = {1.0f, 2.0f, 3.0f};
    int scaled;
    for (scaled = 0; scaled < 2; scaled++) {
        mp_compile_desc cd;
        mp_model *m;
        float g[K], mine[K], after[K], before[K], kept[K];
        int j, applied, bad = 0;
        batch b;
        memset(&cd, 0, sizeof cd);
        cd.loss = MP_MEAN_SQUARED_ERROR;
        cd.optimizer.kind = MP_SGD, cd.optimizer.learning_rate = 0.1f;
        cd.optimizer.weight_decay = 0.5f, cd.optimizer.clipvalue = 0.3f;
        cd.loss_scale = scaled ? MP_LOSS_SCALE_ON : MP_LOSS_SCALE_NONE;
        b.x = (float *)x, b.labels = NULL, b.y = (float *)y, b.n = 1, b.loss = MP_MEAN_SQUARED_ERROR;
        if (!(m = mse_model(mp_dense(3, MP_LINEAR), &cd.optimizer, w0, K))) continue;
        if (!OK(mp_model_compile(m, &cd), m) || !OK(mp_model_set_weights(m, w0, K), m)) goto next;
        CHECK(mp_set_gradients(m, mine, K) == MP_ERR_STATE); /* no gradients yet */
        if (!gradients(m, &b, g, K, NULL)) goto next;
        for (j = 0; j < K; j++) mine[j] = (float)(j - 2) * 0.125f;
        CHECK(mp_set_gradients(m, mine, K - 1) == MP_ERR_SHAPE);
        CHECK(mp_get_gradients(m, kept, K) == MP_OK && memcmp(kept, g, sizeof g) == 0); /* unchanged */
        if (!OK(mp_set_gradients(m, mine, K), m) || !OK(mp_get_gradients(m, kept, K), m) ||
            !CHECK(memcmp(kept, mine, sizeof mine) == 0) || !OK(mp_apply_gradients(m, &applied), m) ||
            !OK(mp_model_get_weights(m, after, K), m))
            goto next;
        for (j = 0; j < K; j++) {
            double w = w0[j], gj = mine[j] > 0.3f ? 0.3f : mine[j] < -0.3f ? -0.3f : mine[j];
            w -= w * 0.5 * 0.1;
            bad += !(fabs(after[j] - (w - 0.1 * gj)) <= 1e-6);
        }
        if (!check_report(applied && bad == 0, __FILE__, __LINE__, "mp_set_gradients: the step applies what was set"))
            fprintf(stderr, "    applied %d, %d weights off\n", applied, bad);
        if (scaled) { /* a NaN set: skipped */
            mine[1] = NAN;
            CHECK(mp_model_get_weights(m, before, K) == MP_OK && gradients(m, &b, g, K, NULL));
            CHECK(mp_set_gradients(m, mine, K) == MP_OK && mp_apply_gradients(m, &applied) == MP_OK && !applied);
            CHECK(mp_model_get_weights(m, after, K) == MP_OK && memcmp(before, after, sizeof after) == 0);
        }
    next:
        mp_model_destroy(m);
    }
}

/* A global norm that is Inf or NaN: without loss scaling every gradient
   becomes NaN (Keras's clip_by_global_norm: scale + (norm - norm)), so
   every weight does; under loss scaling the step is skipped first (the
   LossScaleOptimizer's check) and the finite steps after it clip as
   before. The Inf comes from a huge input: the kernel's gradient x dy
   overflows, the bias's does not. */
static void test_global_clipnorm_nonfinite(void) {
    static const int shape[] = {1, 0};
    const float x[1] = {1.0f}, huge_x[1] = {1e30f}, y[3] = {1.0f, 2.0f, 3.0f};
    int scaled;
    for (scaled = 0; scaled < 2; scaled++) {
        mp_layer_desc d = mp_dense(3, MP_LINEAR);
        mp_model *m = make_model("float32", shape, &d, 1);
        mp_compile_desc cd;
        float before[6], after[6], g[6];
        int j, nan = 0, same, applied = 1;
        batch b;
        if (!m) continue;
        memset(&cd, 0, sizeof cd);
        cd.loss = MP_MEAN_SQUARED_ERROR;
        cd.optimizer.kind = MP_SGD;
        cd.optimizer.global_clipnorm = 1.0f;
        cd.loss_scale = scaled ? MP_LOSS_SCALE_ON : MP_LOSS_SCALE_NONE;
        b.x = (float *)huge_x, b.labels = NULL, b.y = (float *)y, b.n = 1, b.loss = MP_MEAN_SQUARED_ERROR;
        if (OK(mp_model_compile(m, &cd), m) && OK(mp_model_get_weights(m, before, 6), m) && gradients(m, &b, g, 6, NULL) &&
            OK(mp_apply_gradients(m, &applied), m) && OK(mp_model_get_weights(m, after, 6), m)) {
            for (j = 0; j < 6; j++) nan += after[j] != after[j];
            same = memcmp(before, after, sizeof before) == 0;
            if (!check_report(scaled ? !applied && same : applied && nan == 6, __FILE__, __LINE__,
                              scaled ? "global_clipnorm: a step with Inf skipped under loss scaling"
                                     : "global_clipnorm: an Inf norm makes every weight NaN"))
                fprintf(stderr, "    applied %d, NaN weights %d, unchanged %d\n", applied, nan, same);
            if (scaled) { /* then finite steps: each clipped to norm 1 at most (SGD, lr 0.01) */
                int step, ok = 1;
                b.x = (float *)x;
                for (step = 0; step < 3 && ok; step++) {
                    double norm = 0, moved = 0;
                    ok = OK(mp_model_get_weights(m, before, 6), m) && gradients(m, &b, g, 6, NULL) &&
                         OK(mp_apply_gradients(m, &applied), m) && OK(mp_model_get_weights(m, after, 6), m) && applied;
                    for (j = 0; j < 6 && ok; j++) norm += (double)g[j] * g[j];
                    for (j = 0; j < 6 && ok; j++) {
                        double want = before[j] - 0.01 * g[j] * (sqrt(norm) > 1.0 ? 1.0 / sqrt(norm) : 1.0);
                        moved = fabs(after[j] - want) > moved ? fabs(after[j] - want) : moved;
                    }
                    ok = ok && moved <= 1e-6;
                }
                check_report(ok, __FILE__, __LINE__, "global_clipnorm: finite steps after a skipped one");
            }
        }
        mp_model_destroy(m);
    }
}

/* The settings compile refuses, each named, the model as it was: two clip
   modes, a negative or non-finite value, weight_decay with
   no_weight_decay, a warmup_target below 0. */
static void test_optimizer_options_refused(void) {
    static const int shape[] = {1, 0};
    static const struct { const char *field; float clipnorm, clipvalue, global_clipnorm, wd; int no_wd; float target; } bad[] = {
        {"only one of", 1.0f, 1.0f, 0, 0, 0, 0},
        {"only one of", 1.0f, 0, 1.0f, 0, 0, 0},
        {"gradient_accumulation_steps", 0, 0, 0, 0, 0, 0},
        {"clipnorm", -1.0f, 0, 0, 0, 0, 0},
        {"clipvalue", 0, NAN, 0, 0, 0, 0},
        {"global_clipnorm", 0, 0, INFINITY, 0, 0, 0},
        {"weight_decay", 0, 0, 0, -0.1f, 0, 0},
        {"weight_decay (0 with no_weight_decay)", 0, 0, 0, 0.1f, 1, 0},
        {"learning-rate schedule", 0, 0, 0, 0, 0, -1.0f},
    };
    mp_layer_desc d = mp_dense(3, MP_LINEAR);
    mp_model *m = make_model("float32", shape, &d, 1);
    mp_compile_desc cd;
    size_t i;
    if (!m) return;
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_MEAN_SQUARED_ERROR;
    cd.optimizer.kind = MP_SGD;
    cd.optimizer.learning_rate = 0.25f;
    if (!OK(mp_model_compile(m, &cd), m)) goto out;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mp_compile_desc e = cd;
        e.optimizer.kind = MP_ADAMW;
        e.optimizer.clipnorm = bad[i].clipnorm;
        e.optimizer.clipvalue = bad[i].clipvalue;
        e.optimizer.global_clipnorm = bad[i].global_clipnorm;
        e.optimizer.weight_decay = bad[i].wd;
        e.optimizer.no_weight_decay = bad[i].no_wd;
        e.optimizer.gradient_accumulation_steps = strcmp(bad[i].field, "gradient_accumulation_steps") ? 0 : 1;
        if (bad[i].target != 0.0f) {
            e.optimizer.schedule.kind = MP_COSINE_DECAY;
            e.optimizer.schedule.decay_steps = 10;
            e.optimizer.schedule.warmup_target = bad[i].target;
        }
        if (!CHECK(mp_model_compile(m, &e) == MP_ERR_ARG && strstr(mp_model_error(m), bad[i].field)))
            fprintf(stderr, "    case %zu: %s\n", i, mp_model_error(m));
        CHECK(mp_model_learning_rate(m) == 0.25f); /* still the SGD compile made */
    }
out:
    mp_model_destroy(m);
}

/* Keras 3's CosineDecay with warmup_target and warmup_steps
   (keras/src/optimizers/schedules/learning_rate_schedule.py): a line from
   initial_learning_rate to the target over the warmup, then the cosine
   from the target, floored at alpha; flat past warmup + decay. */
static void test_warmup_cosine(void) {
    mp_lr_schedule s;
    uint64_t step;
    int bad = 0;
    char detail[120] = "";
    memset(&s, 0, sizeof s);
    s.kind = MP_COSINE_DECAY;
    s.initial_learning_rate = 0.0f;
    s.warmup_target = 1e-3f;
    s.warmup_steps = 10;
    s.decay_steps = 100;
    s.alpha = 0.1f;
    for (step = 0; step < 130; step++) {
        double want, p;
        if (step < 10) {
            want = 1e-3 * (double)step / 10.0;
        } else {
            p = (double)(step - 10) / 100.0;
            p = p < 1.0 ? p : 1.0;
            want = 1e-3 * (0.9 * 0.5 * (1.0 + cos(3.14159265358979 * p)) + 0.1);
        }
        if (!(fabs(mp_lr_schedule_value(&s, step) - want) <= 1e-6 * want + 1e-12) && bad++ == 0)
            snprintf(detail, sizeof detail, "step %llu: %.9g, want %.9g", (unsigned long long)step,
                     (double)mp_lr_schedule_value(&s, step), want);
    }
    check_all(bad, "warmup then cosine decay", detail, __FILE__, __LINE__);
}

/* The sum of squares for clipping by norm: the same bits on 1 and 2
   threads, and the order the backend table documents, for a length past
   one round of blocks, in each gradient dtype, unscaled. */
static void test_sum_squares_order(void) {
    enum { BLOCK = 4096 };
    const size_t n = (size_t)256 * BLOCK * 2 + 77;
    const mp_backend *cpu = mp_cpu_backend();
    float *g32 = floats(n), scale = 8.0f;
    void *g = malloc(n * 4), *one = NULL, *two = NULL;
    size_t i, b, t;
    if (!CHECK(g32 && g && cpu->create(&one, 1, NULL) == MP_OK && cpu->create(&two, 2, NULL) == MP_OK)) goto out;
    for (i = 0; i < n; i++) g32[i] = copy_test_value(i, 0) * 64.0f;
    for (t = 0; t < 3; t++) {
        mp_dtype gt = t == 0 ? MP_FLOAT32 : t == 1 ? MP_FLOAT16 : MP_BFLOAT16;
        float a = 0.5f, c = 0.5f, want = 0.0f;
        float *w = floats(n);
        CHECK(mp_convert(g, gt, g32, MP_FLOAT32, n, NULL) == MP_OK);
        CHECK(mp_convert(w, MP_FLOAT32, g, gt, n, NULL) == MP_OK);
        cpu->sum_squares(one, &a, g, gt, n, &scale);
        cpu->sum_squares(two, &c, g, gt, n, &scale);
        for (b = 0; b < n; b += BLOCK) {
            float lane[8] = {0}, block;
            for (i = b; i < b + BLOCK && i < n; i++) {
                float u = w[i] * (1.0f / scale);
                lane[(i - b) % 8] += u * u;
            }
            block = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
            want += block;
        }
        want = 0.5f + want;
        if (!CHECK(memcmp(&a, &c, sizeof a) == 0 && memcmp(&a, &want, sizeof a) == 0))
            fprintf(stderr, "    %s: 1 thread %.17g, 2 threads %.17g, the order's %.17g\n", mp_dtype_name(gt), (double)a, (double)c, (double)want);
        free(w);
    }
out:
    if (one) cpu->destroy(one);
    if (two) cpu->destroy(two);
    free(g32), free(g);
}

/* A tensor of 16 MiB asks Linux for huge pages (mp__advise_huge): the
   kernel marks the pages inside it "hg" in /proc/self/smaps's VmFlags.
   Where the kernel has no transparent huge pages (no
   /sys/kernel/mm/transparent_hugepage) or the build does not ask (not
   x86-64 Linux, MIXPREC_MALLOC or MIXPREC_NO_HUGE_PAGES defined), it
   prints a skip line; the
   checks are as many either way, so that the count does not depend on
   the machine. */
static int huge_pages_advised(const void *p) {
#ifdef MP__HUGE_PAGES
    FILE *thp = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r"), *maps;
    char line[512];
    unsigned long lo = 0, hi = 0, a, b, at = (unsigned long)(uintptr_t)p;
    int found = 0, advised = 0;
    if (!thp) {
        printf("skip: huge pages (this kernel has no transparent huge pages)\n");
        return 1;
    }
    fclose(thp);
    if (!(maps = fopen("/proc/self/smaps", "r"))) return 0;
    while (fgets(line, sizeof line, maps)) {
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2) lo = a, hi = b;
        else if (strncmp(line, "VmFlags:", 8) == 0 && lo <= at && at < hi) found = 1, advised = strstr(line, " hg") != NULL;
    }
    fclose(maps);
    if (!(found && advised)) fprintf(stderr, "    the 16 MiB tensor's pages: found %d, hg %d\n", found, advised);
    return found && advised;
#else
    (void)p;
    printf("skip: huge pages (this build does not ask for them: not x86-64 Linux with malloc, or "
           "MIXPREC_NO_HUGE_PAGES)\n");
    return 1;
#endif
}

static void test_huge_pages(void) {
    static const int shape[1] = {4 << 20};
    mp_tensor t;
    memset(&t, 0, sizeof t);
    if (!OK(mp_tensor_alloc(&t, MP_FLOAT32, 1, shape), NULL)) return;
    CHECK(huge_pages_advised((const char *)t.data + mp_tensor_bytes(&t) / 2));
    mp_tensor_free(&t);
}

/* Bytes by which one training forward pass of a batch raises the peak,
   less the GEMM workspace it sizes (float32 panels, the same under every
   policy): the activations of a 16-512-512-16 MLP (wide hidden layers, so
   that the float32 copies of the input and targets weigh little). Checks
   that mp_model_memory_info's activations are that growth, and that the
   model gives back every byte it took. */
static size_t forward_growth(const char *policy, const float *x, int batch) {
    static const int shape[] = {16, 0};
    size_t start = mp_get_memory_info().current, before, growth = 0;
    mp_model_memory before_mem, after_mem;
    mp_layer_desc layers[3];
    mp_model *m;
    layers[0] = mp_dense(512, MP_RELU);
    layers[1] = mp_dense(512, MP_RELU);
    layers[2] = mp_dense(16, MP_LINEAR);
    if (!(m = make_model(policy, shape, layers, 3))) return 0;
    if (compile(m, MP_MEAN_SQUARED_ERROR, 0, MP_SGD, 0.0f, MP_LOSS_SCALE_NONE)) {
        mp_reset_peak_memory();
        before = mp_get_memory_info().current;
        CHECK(mp_model_memory_info(m, &before_mem) == MP_OK && before_mem.activations == 0);
        if (OK(forward_rows(m, x, batch, 1), m) && CHECK(mp_model_memory_info(m, &after_mem) == MP_OK)) {
            growth = mp_get_memory_info().peak - before - (after_mem.workspace - before_mem.workspace);
            CHECK(growth == after_mem.activations);
        }
    }
    mp_model_destroy(m);
    if (!CHECK(mp_get_memory_info().current == start)) fprintf(stderr, "    %s model leaked\n", policy);
    return growth;
}

/* float16 activations take about half the bytes of float32 ones: the
   growth ratio lies in [0.4, 0.6]; float32's growth holds at least the
   three layers' outputs. */
static void test_activation_memory(void) {
    enum { B = 1024 };
    float *x = floats((size_t)B * 16);
    size_t g32, g16, gbf;
    fill(x, (size_t)B * 16, -1.0f, 1.0f);
    g32 = forward_growth("float32", x, B);
    g16 = forward_growth("mixed_float16", x, B);
    gbf = forward_growth("mixed_bfloat16", x, B);
    if (!CHECK(g32 >= (size_t)B * (512 + 512 + 16) * 4)) fprintf(stderr, "    float32 forward: %zu bytes\n", g32);
    if (!CHECK(g16 >= 0.4 * g32 && g16 <= 0.6 * g32))
        fprintf(stderr, "    forward growth: float32 %zu bytes, mixed_float16 %zu\n", g32, g16);
    if (!CHECK(gbf >= 0.4 * g32 && gbf <= 0.6 * g32))
        fprintf(stderr, "    forward growth: float32 %zu bytes, mixed_bfloat16 %zu\n", g32, gbf);
    free(x);
}

/* The GEMM workspace a training step of Dense(1) over `inputs` values at
   batch 50 sizes (the conv net's last layer in examples/conv_memory). */
static size_t narrow_workspace(const char *policy, const float *x, const float *y, int inputs) {
    int shape[2];
    mp_layer_desc layer = mp_dense(1, MP_LINEAR);
    mp_model_memory mem;
    mp_model *m;
    float loss;
    size_t bytes = 0;
    shape[0] = inputs, shape[1] = 0;
    if (!(m = make_model(policy, shape, &layer, 1))) return 0;
    if (compile(m, MP_MEAN_SQUARED_ERROR, 0, MP_RMSPROP, 0.0f, MP_LOSS_SCALE_NONE) &&
        OK(forward_rows(m, x, 50, 1), m) && OK(loss_rows(m, NULL, y, 50, &loss, NULL), m) &&
        OK(mp_compute_scaled_gradients(m), m) && CHECK(mp_model_memory_info(m, &mem) == MP_OK))
        bytes = mem.workspace;
    mp_model_destroy(m);
    return bytes;
}

/* A layer of few units over many inputs keeps the GEMM workspace that its
   shape needs, whatever the inputs' count beyond a panel's: a B panel
   reserved for AMX's narrow product grew with K on every machine (4 MiB
   more a thread at 2^17 inputs), enough to lift the conv net's
   mixed_float16 peak past 0.55x float32's. Between 2^16 and 2^17 inputs
   each product's panels are the same (K slices of 256 at batch 50, 2048
   columns of the weight gradient), so the workspace must be too. */
static void test_narrow_layer_workspace(void) {
    enum { WIDE = 1 << 17, B = 50 };
    static const char *policies[] = {"float32", "mixed_bfloat16"};
    float *x = floats((size_t)B * WIDE), y[B];
    size_t i;
    fill(x, (size_t)B * WIDE, -1.0f, 1.0f);
    fill(y, B, 0.0f, 1.0f);
    for (i = 0; i < sizeof policies / sizeof *policies; i++) {
        size_t half = narrow_workspace(policies[i], x, y, WIDE / 2), whole = narrow_workspace(policies[i], x, y, WIDE);
        if (!CHECK(half > 0 && whole == half))
            fprintf(stderr, "    %s Dense(1) workspace: %zu bytes at 2^16 inputs, %zu at 2^17\n", policies[i], half,
                    whole);
    }
    free(x);
}

/* A model that was compiled, trained, evaluated and used to predict gives
   back every byte when destroyed. */
static void test_model_memory(void) {
    enum { N = 200 };
    static const int shape[] = {5, 5, 1, 0};
    size_t start = mp_get_memory_info().current;
    float *x = floats(N * 25), *p = floats(N * 3);
    int32_t *labels = (int32_t *)zalloc(N * 4);
    mp_layer_desc layers[5];
    mp_model *m;
    mp_fit_desc fd;
    mp_logs ev;
    int i;
    fill(x, N * 25, 0.0f, 1.0f);
    for (i = 0; i < N; i++) labels[i] = i % 3;
    layers[0] = mp_conv2d(4, 3, 3, MP_SAME, MP_RELU);
    layers[1] = mp_max_pooling2d(2, 2);
    layers[2] = mp_flatten();
    layers[3] = mp_dropout(0.25f);
    layers[4] = mp_dense(3, MP_SOFTMAX);
    if ((m = make_model("mixed_float16", shape, layers, 5)) &&
        compile(m, MP_SPARSE_CATEGORICAL_CROSSENTROPY, 0, MP_RMSPROP, 0.0f, MP_LOSS_SCALE_AUTO)) {
        memset(&fd, 0, sizeof fd);
        fd.data = data_xy(x, 25, labels, N); /* (5, 5, 1) images as rows of 25: a reshape */
        fd.batch_size = 32, fd.epochs = 2, fd.validation_split = 0.1f, fd.verbose = MP_VERBOSE_SILENT;
        OK(mp_model_fit(m, &fd), m);
        OK(mp_model_evaluate(m, &fd.data, 64, &ev), m);
        OK(mp_model_predict(m, &fd.data, 64, p, N * 3), m);
        CHECK(mp_get_memory_info().current > start);
    }
    mp_model_destroy(m);
    CHECK(mp_get_memory_info().current == start);
    free(x), free(p), free(labels);
}

/* ======================================================================== */
/* 8. Fashion-MNIST (optional: argv[1] names a directory of its IDX files) */

/* 784-256-256-10 with a float32 softmax, RMSprop (Keras defaults), batch
   128, EPOCHS epochs on the first TRAIN images; test accuracy. */
static double fashion_accuracy(const char *policy, const mp_dataset *train, const mp_dataset *test,
                               double *secs) {
    enum { EPOCHS = 4, TRAIN = 60000 };
    static const int shape[] = {784, 0};
    mp_layer_desc layers[4];
    mp_model *m;
    mp_fit_desc fd;
    mp_data td;
    mp_logs ev;
    double t0 = seconds_now(), acc = -1.0;
    layers[0] = mp_dense(256, MP_RELU);
    layers[1] = mp_dense(256, MP_RELU);
    layers[2] = mp_dense(10, MP_LINEAR);
    layers[3] = with_dtype(mp_activation_layer(MP_SOFTMAX), "float32");
    if (!(m = make_model(policy, shape, layers, 4))) return -1.0;
    if (compile(m, MP_SPARSE_CATEGORICAL_CROSSENTROPY, 0, MP_RMSPROP, 0.0f, MP_LOSS_SCALE_AUTO)) {
        memset(&fd, 0, sizeof fd);
        fd.data = mp_dataset_data(train);
        if (train->n > (size_t)TRAIN) fd.data.x[0].n = fd.data.y.n = (size_t)TRAIN;
        fd.batch_size = 128, fd.epochs = EPOCHS, fd.verbose = MP_VERBOSE_SILENT;
        td = mp_dataset_data(test);
        if (OK(mp_model_fit(m, &fd), m) && OK(mp_model_evaluate(m, &td, 1000, &ev), m)) acc = ev.accuracy;
    }
    mp_model_destroy(m);
    *secs = seconds_now() - t0;
    printf("Fashion-MNIST %-14s test accuracy %.4f (%.1f s)\n", policy, acc, *secs);
    return acc;
}

static void test_fashion_mnist(const char *dir) {
    char ti[1024], tl[1024], vi[1024], vl[1024];
    mp_dataset train, test;
    size_t start = mp_get_memory_info().current;
    double a32, a16, s32, s16;
    snprintf(ti, sizeof ti, "%s/train-images-idx3-ubyte", dir);
    snprintf(tl, sizeof tl, "%s/train-labels-idx1-ubyte", dir);
    snprintf(vi, sizeof vi, "%s/t10k-images-idx3-ubyte", dir);
    snprintf(vl, sizeof vl, "%s/t10k-labels-idx1-ubyte", dir);
    memset(&train, 0, sizeof train);
    memset(&test, 0, sizeof test);
    if (mp_load_idx(ti, tl, &train) != MP_OK || mp_load_idx(vi, vl, &test) != MP_OK) {
        printf("skip: Fashion-MNIST: no uncompressed IDX files in %s\n", dir);
        mp_dataset_free(&train);
        mp_dataset_free(&test);
        return;
    }
    CHECK(train.n == 60000 && test.n == 10000 && train.rows == 28 && train.cols == 28 && train.classes == 10);
    a32 = fashion_accuracy("float32", &train, &test, &s32);
    a16 = fashion_accuracy("mixed_float16", &train, &test, &s16);
    CHECK(a32 >= 0.85);
    CHECK(a16 >= 0.85);
    CHECK(fabs(a16 - a32) <= 0.01);
    mp_dataset_free(&train);
    mp_dataset_free(&test);
    CHECK(mp_get_memory_info().current == start);
}

/* ======================================================================== */
/* The summary: a Sequential chain as Keras prints one (with the Policy
   column), a functional model with Keras 3's functional columns (an
   input_layer row, "Connected to" after the Policy), and the counts:
   BatchNormalization's moving statistics are non-trainable weights. */

/* width characters of c, then a newline, into the text at *p. */
static void rule_into(char **p, char c, int width) {
    memset(*p, c, (size_t)width);
    (*p)[width] = '\n';
    *p += width + 1;
}

/* The text a summary should be: the lines (NULL-terminated), "_" and "="
   standing for rules of width characters. */
static void summary_text(char *out, const char *const *lines, int width) {
    char *p = out;
    int i;
    for (i = 0; lines[i]; i++) {
        if (!strcmp(lines[i], "_") || !strcmp(lines[i], "=")) {
            rule_into(&p, lines[i][0], width);
            continue;
        }
        strcpy(p, lines[i]);
        p += strlen(lines[i]);
        *p++ = '\n';
    }
    *p = '\0';
}

static void check_summary(mp_model *m, const char *const *lines, int width, int line) {
    static char got[8192], want[8192];
    summary_text(want, lines, width);
    if (!OK(mp_model_summary(m, got, sizeof got), m)) return;
    if (!check_report(strcmp(got, want) == 0, __FILE__, line, "the summary, character for character"))
        fprintf(stderr, "got:\n%swant:\n%s", got, want);
}

static void test_summary(void) {
    static const char *const chain[] = {
        "Model: \"sequential\"", "_",
        " Layer (type)                 Output Shape              Param #    Policy", "=",
        " conv2d (Conv2D)              (None, 8, 8, 4)           40         float32",
        " max_pooling2d (MaxPooling2D) (None, 4, 4, 4)           0          float32",
        " flatten (Flatten)            (None, 64)                0          float32",
        " dense (Dense)                (None, 10)                650        float32", "=",
        "Total params: 690", "Trainable params: 690", "Non-trainable params: 0", "_", NULL};
    static const char *const graph[] = {
        "Model: \"functional\"", "_",
        " Layer (type)                             Output Shape              Param #    Policy                 "
        "Connected to", "=",
        " input_layer (InputLayer)                 (None, 4)                 0          -                      -",
        " dense (Dense)                            (None, 4)                 20         float32                "
        "input_layer[0][0]",
        " batch_normalization (BatchNormalization) (None, 4)                 16         float32                "
        "dense[0][0]",
        " add (Add)                                (None, 4)                 0          float32                "
        "batch_normalization[0][0], input_layer[0][0]",
        " dense_1 (Dense)                          (None, 2)                 10         float32                "
        "add[0][0]", "=",
        "Total params: 46", "Trainable params: 38", "Non-trainable params: 8", "_", NULL};
    static const int image[] = {8, 8, 1, 0}, flat[] = {4, 0};
    static const int wiring[4][MP_MAX_LAYER_INPUTS + 1] = {{1, 0}, {1, 1}, {2, 2, 0}, {1, 3}};
    mp_layer_desc layers[4];
    mp_model *m;
    layers[0] = mp_conv2d(4, 3, 3, MP_SAME, MP_RELU);
    layers[1] = mp_max_pooling2d(2, 2);
    layers[2] = mp_flatten();
    layers[3] = mp_dense(10, MP_SOFTMAX);
    if ((m = new_model("float32", image, layers, 4))) {
        check_summary(m, chain, 81, __LINE__);
        CHECK(mp_model_param_count(m) == 690 && mp_model_trainable_param_count(m) == 690);
    }
    mp_model_destroy(m);
    /* a residual block: dense(4, relu) -> batch_normalization, added to
       the input; width 42 + 26 + 11 + 23 + the widest Connected to (44) */
    layers[0] = mp_dense(4, MP_RELU);
    layers[1] = mp_batch_normalization();
    layers[2] = mp_add();
    layers[3] = mp_dense(2, MP_LINEAR);
    if ((m = new_graph_model("float32", flat, layers, wiring, 4))) {
        check_summary(m, graph, 146, __LINE__);
        CHECK(mp_model_param_count(m) == 46 && mp_model_trainable_param_count(m) == 38);
    }
    mp_model_destroy(m);
}

/* Each new kind's Keras class name and automatic name, as the summary,
   the numerics report and check-numerics write them (the kinds table). */
static void test_kind_names(void) {
    static const char *const types[] = {"BatchNormalization", "LayerNormalization", "Add", "Subtract", "Multiply",
                                        "Average", "Concatenate", "AveragePooling2D", "GlobalAveragePooling2D",
                                        "Reshape"};
    static const char *const names[] = {"batch_normalization", "layer_normalization", "add", "subtract", "multiply",
                                        "average", "concatenate", "average_pooling2d", "global_average_pooling2d",
                                        "reshape"};
    static const int shape[] = {4, 4, 2, 0}, square[] = {2, 2, 0};
    static const int wiring[10][MP_MAX_LAYER_INPUTS + 1] = {{1, 0}, {1, 1}, {2, 2, 0}, {2, 3, 0}, {2, 4, 0},
                                                            {2, 5, 0}, {2, 6, 0}, {1, 7}, {1, 8}, {1, 9}};
    mp_layer_desc layers[10];
    mp_layer_info info;
    mp_model *m;
    int i, bad = -1;
    layers[0] = mp_batch_normalization();
    layers[1] = mp_layer_normalization();
    layers[2] = mp_add();
    layers[3] = mp_subtract();
    layers[4] = mp_multiply();
    layers[5] = mp_average();
    layers[6] = mp_concatenate(0);
    layers[7] = mp_average_pooling2d(2, 2);
    layers[8] = mp_global_average_pooling2d();
    layers[9] = mp_reshape(square);
    if (!(m = new_graph_model("float32", shape, layers, wiring, 10))) return;
    for (i = 0; i < 10 && bad < 0; i++)
        if (!OK(mp_model_layer_info(m, i, &info), m) || strcmp(info.type, types[i]) || strcmp(info.name, names[i]))
            bad = i;
    if (!check_report(bad < 0, __FILE__, __LINE__, "each kind's type and name")) fprintf(stderr, "    layer %d\n", bad);
    mp_model_destroy(m);
}

int main(int argc, char **argv) {
    size_t start = mp_get_memory_info().current;
    check_args(argc, argv);
    RUN(test_grad_dense_activations());
    RUN(test_grad_activation_layers());
    RUN(test_grad_conv());
    RUN(test_grad_conv_stack());
    RUN(test_max_pool_tie());
    RUN(test_grad_dropout_zero());
    RUN(test_grad_losses());
    RUN(test_dropout_mask(0.5f));
    RUN(test_dropout_mask(0.25f));
    RUN(test_dropout_mask(0.75f));
    RUN(test_loss_values());
    RUN(test_loss_from_logits());
    RUN(test_loss_wide_logits());
    RUN(test_accuracy_ties());
    RUN(test_activation_values());
    RUN(test_layer_values());
    RUN(test_mixed_forward());
    RUN(test_mixed_gradients());
    RUN(test_layer_policies());
    RUN(test_policy_at_add_time());
    RUN(test_weights_stay_float32());
    RUN(test_compute_dtype_casts());
    RUN(test_labels_not_cast());
    RUN(test_loss_scale_defaults());
    RUN(test_loss_scale_edges());
    RUN(test_loss_scale_wrapping());
    RUN(test_skipped_step());
    RUN(test_deferred_gradients());
    RUN(test_training());
    RUN(test_csv_log());
    RUN(test_tensor_memory());
    RUN(test_huge_pages());
    RUN(test_optimizer_subnormals());
    RUN(test_optimizer_keras_steps());
    RUN(test_optimizer_copy());
    RUN(test_optimizer_options());
    RUN(test_global_clipnorm_nonfinite());
    RUN(test_gradient_accumulation());
    RUN(test_set_gradients());
    RUN(test_optimizer_options_refused());
    RUN(test_warmup_cosine());
    RUN(test_sum_squares_order());
    RUN(test_activation_memory());
    RUN(test_narrow_layer_workspace());
    RUN(test_model_memory());
    RUN(test_summary());
    RUN(test_kind_names());
    if (check_path()) RUN(test_fashion_mnist(check_path()));
    else printf("skip: Fashion-MNIST (give a directory of its uncompressed IDX files, a path with a '/')\n");
    CHECK(policy_is(mp_global_policy(), "float32"));
    CHECK(mp_get_memory_info().current == start); /* nothing leaked */
    return check_done("test_train");
}
