/* test_graph.c - functional models and the layers they bring: graphs with
   fan-out and fan-in built with mp_model_call and every way to get them
   wrong; a residual block against the same block computed by hand, forward
   and gradients; finite-difference gradients of every new layer and merge
   (BatchNormalization, LayerNormalization, Add, Subtract, Multiply,
   Average, Concatenate, AveragePooling2D, GlobalAveragePooling2D, Reshape)
   in float32, and the same graphs' gradients under mixed_float16 and
   mixed_bfloat16 against float32's; BatchNormalization's training and
   inference passes and moving statistics, and LayerNormalization, against
   Keras's formulas; the liveness plan's memory; training a small residual
   net, bit-identical at 1 and 2 threads. */
#ifndef TEST_LINKS_MIXPREC /* defined: the implementation is another object's (tests/header_only.c) */
#define MIXPREC_IMPLEMENTATION
#endif
#include "../mixprec.h"
#include "check.h"
#include "helpers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void fill(float *p, size_t n, float lo, float hi) {
    size_t i;
    for (i = 0; i < n; i++) p[i] = uniform(lo, hi);
}


/* ======================================================================== */
/* Graphs, described as data: node i (id i + 1) is layer `layer` reading the
   ids in `in` (MP_MODEL_INPUT = 0), or the previous node when in[0] < 0. */
typedef struct node {
    mp_layer_desc layer;
    int in[4], n_in;
} node;

typedef struct graph {
    const char *what;
    int shape[4];  /* input per sample, zero-terminated */
    node nodes[12];
    int count;
    int batch;
    int positive; /* inputs in [0.5, 1.5] (a Multiply's factors away from 0) */
} graph;

static node seq(mp_layer_desc layer) {
    node n;
    memset(&n, 0, sizeof n);
    n.layer = layer;
    return n;
}
static node on1(mp_layer_desc layer, int a) {
    node n = seq(layer);
    n.in[0] = a;
    n.n_in = 1;
    return n;
}
static node on2(mp_layer_desc layer, int a, int b) {
    node n = on1(layer, a);
    n.in[1] = b;
    n.n_in = 2;
    return n;
}
static node on3(mp_layer_desc layer, int a, int b, int c) {
    node n = on2(layer, a, b);
    n.in[2] = c;
    n.n_in = 3;
    return n;
}

/* The graph under `policy` (the global policy float32 again after); NULL on
   failure (counted). */
static mp_model *build(const graph *g, const char *policy) {
    mp_model_desc md;
    mp_model *m = NULL;
    int i, ok;
    memset(&md, 0, sizeof md);
    for (i = 0; i < 3 && g->shape[i]; i++) md.input_shape[i] = g->shape[i];
    md.seed = 11;
    ok = OK(mp_set_global_policy_name(policy), NULL) && OK(mp_model_create(&m, &md), NULL);
    for (i = 0; ok && i < g->count; i++) {
        const node *n = &g->nodes[i];
        ok = OK(mp_model_call(m, n->layer, n->n_in ? n->in : NULL, n->n_in, NULL), m);
    }
    mp_set_global_policy_name("float32");
    if (!ok || !OK(mp_model_build(m), m)) {
        mp_model_destroy(m);
        return NULL;
    }
    return m;
}

static int compile_mse(mp_model *m) {
    mp_compile_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_MEAN_SQUARED_ERROR;
    cd.optimizer.kind = MP_SGD;
    cd.loss_scale = MP_LOSS_SCALE_NONE;
    return OK(mp_model_compile(m, &cd), m);
}

typedef struct batch {
    float *x, *y;
    int n;
} batch;

static batch make_batch(const mp_model *m, int n, int positive) {
    batch b;
    size_t in = mp_model_input_size(m), out = mp_model_output_size(m);
    b.n = n;
    b.x = floats((size_t)n * in);
    b.y = floats((size_t)n * out);
    fill(b.x, (size_t)n * in, positive ? 0.5f : -1.0f, positive ? 1.5f : 1.0f);
    fill(b.y, (size_t)n * out, -1.0f, 1.0f);
    return b;
}

static float loss_of(mp_model *m, const void *batch_) {
    const batch *b = (const batch *)batch_;
    float loss = NAN;
    if (forward_rows(m, b->x, (size_t)b->n, 1) != MP_OK) return NAN;
    if (loss_rows(m, NULL, b->y, (size_t)b->n, &loss, NULL) != MP_OK) return NAN;
    return loss;
}

static int gradients(mp_model *m, const void *batch_, float *g) {
    const batch *b = (const batch *)batch_;
    float loss;
    return OK(forward_rows(m, b->x, (size_t)b->n, 1), m) && OK(loss_rows(m, NULL, b->y, (size_t)b->n, &loss, NULL), m) &&
           OK(mp_compute_scaled_gradients(m), m) && OK(mp_get_unscaled_gradients(m), m) &&
           OK(mp_get_gradients(m, g, mp_model_trainable_param_count(m)), m);
}

/* The same weights and batch under a 16-bit policy: its float32 gradients
   within tol (relative L2) of float32's, which grad_check has checked. */
static void policy_check(const graph *gr, const char *policy, const float *w, const batch *b, const float *want,
                         double tol) {
    mp_model *m = build(gr, policy);
    size_t nt, i;
    float *g;
    double diff2 = 0.0, ref2 = 0.0;
    char msg[200];
    if (!m) return;
    nt = mp_model_trainable_param_count(m);
    g = floats(nt);
    if (compile_mse(m) && OK(mp_model_set_weights(m, w, mp_model_param_count(m)), m) && gradients(m, b, g)) {
        for (i = 0; i < nt; i++) {
            diff2 += ((double)g[i] - want[i]) * ((double)g[i] - want[i]);
            ref2 += (double)want[i] * want[i];
        }
        snprintf(msg, sizeof msg, "%s under %s: gradients within %g of float32's (relative L2)", gr->what, policy, tol);
        if (!check_report(sqrt(diff2) <= tol * sqrt(ref2), __FILE__, __LINE__, msg))
            fprintf(stderr, "    |g - g32| = %.4g, |g32| = %.4g\n", sqrt(diff2), sqrt(ref2));
    }
    free(g);
    mp_model_destroy(m);
}

static void run_graph(const graph *gr) {
    mp_model *m = build(gr, "float32");
    size_t n, nt;
    float *w, *g;
    batch b;
    if (!m) return;
    if (!compile_mse(m)) {
        mp_model_destroy(m);
        return;
    }
    n = mp_model_param_count(m);
    nt = mp_model_trainable_param_count(m);
    w = floats(n);
    g = floats(nt);
    b = make_batch(m, gr->batch ? gr->batch : 4, gr->positive);
    if (OK(mp_model_get_weights(m, w, n), m)) {
        grad_check(gr->what, m, loss_of, gradients, &b, 1e-2f);
        if (gradients(m, &b, g)) {
            policy_check(gr, "mixed_float16", w, &b, g, 1e-2);
            policy_check(gr, "mixed_bfloat16", w, &b, g, 6e-2);
        }
    }
    free(b.x);
    free(b.y);
    free(w);
    free(g);
    mp_model_destroy(m);
}

/* ======================================================================== */
/* 1. Every new layer and merge, by finite differences */

static void test_grad_normalizations(void) {
    graph g;
    memset(&g, 0, sizeof g);
    g.what = "Dense(5) -> BatchNormalization -> Dense(3, tanh)";
    g.shape[0] = 4;
    g.nodes[0] = seq(mp_dense(5, MP_LINEAR));
    g.nodes[1] = seq(mp_batch_normalization());
    g.nodes[2] = seq(mp_dense(3, MP_TANH));
    g.count = 3;
    g.batch = 6;
    run_graph(&g);

    memset(&g, 0, sizeof g);
    g.what = "Conv2D(3, 3x3 same) -> BatchNormalization -> GlobalAveragePooling2D -> Dense(2)";
    g.shape[0] = 5, g.shape[1] = 4, g.shape[2] = 2;
    g.nodes[0] = seq(mp_conv2d(3, 3, 3, MP_SAME, MP_LINEAR));
    g.nodes[1] = seq(mp_batch_normalization());
    g.nodes[2] = seq(mp_global_average_pooling2d());
    g.nodes[3] = seq(mp_dense(2, MP_LINEAR));
    g.count = 4;
    g.batch = 3;
    run_graph(&g);

    memset(&g, 0, sizeof g);
    g.what = "Dense(6) -> LayerNormalization -> Dense(3)";
    g.shape[0] = 4;
    g.nodes[0] = seq(mp_dense(6, MP_LINEAR));
    g.nodes[1] = seq(mp_layer_normalization());
    g.nodes[2] = seq(mp_dense(3, MP_LINEAR));
    g.count = 3;
    run_graph(&g);
}

/* Two Dense branches from the input (fan-out) merged (fan-in), then Dense. */
static void test_grad_merges(void) {
    static const struct {
        const char *what;
        mp_layer_kind kind;
    } cases[] = {{"Add", MP_ADD}, {"Subtract", MP_SUBTRACT}, {"Multiply", MP_MULTIPLY}, {"Average", MP_AVERAGE}};
    size_t i;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char what[120];
        graph g;
        mp_layer_desc merge;
        memset(&g, 0, sizeof g);
        memset(&merge, 0, sizeof merge);
        merge.kind = cases[i].kind;
        snprintf(what, sizeof what, "input -> Dense(4, tanh), Dense(4, sigmoid) -> %s -> Dense(2)", cases[i].what);
        g.what = what;
        g.shape[0] = 3;
        g.nodes[0] = on1(mp_dense(4, MP_TANH), MP_MODEL_INPUT);
        g.nodes[1] = on1(mp_dense(4, MP_SIGMOID), MP_MODEL_INPUT);
        g.nodes[2] = on2(merge, 1, 2);
        g.nodes[3] = seq(mp_dense(2, MP_LINEAR));
        g.count = 4;
        run_graph(&g);
    }
    {   /* three inputs, one of them the model's input; and a tensor twice */
        graph g;
        memset(&g, 0, sizeof g);
        g.what = "Add(input, Dense(3), Dense(3)) and Multiply(x, x) -> Dense(2)";
        g.shape[0] = 3;
        g.nodes[0] = on1(mp_dense(3, MP_TANH), MP_MODEL_INPUT);
        g.nodes[1] = on1(mp_dense(3, MP_LINEAR), 1);
        g.nodes[2] = on3(mp_add(), MP_MODEL_INPUT, 1, 2);
        g.nodes[3] = on2(mp_multiply(), 3, 3);
        g.nodes[4] = seq(mp_dense(2, MP_LINEAR));
        g.count = 5;
        g.positive = 1;
        run_graph(&g);
        memset(&g, 0, sizeof g);
        g.what = "Average of three branches, one read twice";
        g.shape[0] = 3;
        g.nodes[0] = on1(mp_dense(4, MP_TANH), MP_MODEL_INPUT);
        g.nodes[1] = on1(mp_dense(4, MP_LINEAR), MP_MODEL_INPUT);
        g.nodes[2] = on3(mp_average(), 1, 2, 1);
        g.nodes[3] = seq(mp_dense(2, MP_LINEAR));
        g.count = 4;
        run_graph(&g);
    }
}

static void test_grad_concatenate(void) {
    graph g;
    memset(&g, 0, sizeof g);
    g.what = "Concatenate(Dense(3), Dense(5), input) -> Dense(2)";
    g.shape[0] = 2;
    g.nodes[0] = on1(mp_dense(3, MP_TANH), MP_MODEL_INPUT);
    g.nodes[1] = on1(mp_dense(5, MP_LINEAR), MP_MODEL_INPUT);
    g.nodes[2] = on3(mp_concatenate(0), 1, 2, MP_MODEL_INPUT);
    g.nodes[3] = seq(mp_dense(2, MP_LINEAR));
    g.count = 4;
    run_graph(&g);

    memset(&g, 0, sizeof g); /* along the channels, then along the rows (axis 1) */
    g.what = "Concatenate(Conv2D(2), Conv2D(3)) on channels, then with itself on rows -> Flatten -> Dense(2)";
    g.shape[0] = 4, g.shape[1] = 3, g.shape[2] = 2;
    g.nodes[0] = on1(mp_conv2d(2, 3, 3, MP_SAME, MP_TANH), MP_MODEL_INPUT);
    g.nodes[1] = on1(mp_conv2d(3, 2, 2, MP_SAME, MP_LINEAR), MP_MODEL_INPUT);
    g.nodes[2] = on2(mp_concatenate(-1), 1, 2);
    g.nodes[3] = on2(mp_concatenate(1), 3, 3);
    g.nodes[4] = seq(mp_flatten());
    g.nodes[5] = seq(mp_dense(2, MP_LINEAR));
    g.count = 6;
    g.batch = 2;
    run_graph(&g);
}

static void test_grad_pooling_reshape(void) {
    graph g;
    int target[] = {2, -1, 0};
    memset(&g, 0, sizeof g);
    g.what = "Conv2D(3) -> AveragePooling2D(2x2) -> Flatten -> Dense(2)";
    g.shape[0] = 5, g.shape[1] = 6, g.shape[2] = 2;
    g.nodes[0] = seq(mp_conv2d(3, 3, 3, MP_SAME, MP_TANH));
    g.nodes[1] = seq(mp_average_pooling2d(2, 2));
    g.nodes[2] = seq(mp_flatten());
    g.nodes[3] = seq(mp_dense(2, MP_LINEAR));
    g.count = 4;
    g.batch = 2;
    run_graph(&g);

    memset(&g, 0, sizeof g);
    g.what = "Dense(6) -> Reshape((2, -1)) -> LayerNormalization -> Flatten -> Dense(2)";
    g.shape[0] = 3;
    g.nodes[0] = seq(mp_dense(6, MP_LINEAR));
    g.nodes[1] = seq(mp_reshape(target));
    g.nodes[2] = seq(mp_layer_normalization());
    g.nodes[3] = seq(mp_flatten());
    g.nodes[4] = seq(mp_dense(2, MP_LINEAR));
    g.count = 5;
    run_graph(&g);
}

/* ======================================================================== */
/* 2. A residual block against the same block by hand: y = x + W2 relu(W1 x
   + b1) + b2, MSE; forward and every gradient in double. */
static void test_residual_by_hand(void) {
    enum { B = 3, D = 4, H = 5 };
    graph g;
    mp_model *m;
    float w[D * H + H + H * D + D], grad[D * H + H + H * D + D], x[B * D], t[B * D];
    double z[B][H], h[B][H], y[B][D], dy[B][D], dh[B][H], want[D * H + H + H * D + D];
    mp_tensor out;
    float loss = 0.0f;
    double want_loss = 0.0;
    int i, j, k, bad = 0;
    char detail[160] = "";
    memset(&g, 0, sizeof g);
    g.what = "residual";
    g.shape[0] = D;
    g.nodes[0] = on1(mp_dense(H, MP_RELU), MP_MODEL_INPUT);
    g.nodes[1] = on1(mp_dense(D, MP_LINEAR), 1);
    g.nodes[2] = on2(mp_add(), 2, MP_MODEL_INPUT);
    g.count = 3;
    if (!(m = build(&g, "float32"))) return;
    fill(w, sizeof w / sizeof w[0], -0.7f, 0.7f);
    fill(x, B * D, -1.0f, 1.0f);
    fill(t, B * D, -1.0f, 1.0f);
    /* by hand: W1 [D, H] (Keras's kernel layout), b1, W2 [H, D], b2 */
    for (i = 0; i < B; i++) {
        for (j = 0; j < H; j++) {
            z[i][j] = w[D * H + j];
            for (k = 0; k < D; k++) z[i][j] += (double)x[i * D + k] * w[k * H + j];
            h[i][j] = z[i][j] > 0 ? z[i][j] : 0.0;
        }
        for (j = 0; j < D; j++) {
            y[i][j] = x[i * D + j] + (double)w[D * H + H + H * D + j];
            for (k = 0; k < H; k++) y[i][j] += h[i][k] * w[D * H + H + k * D + j];
            dy[i][j] = 2.0 * (y[i][j] - t[i * D + j]) / (B * D);
            want_loss += (y[i][j] - t[i * D + j]) * (y[i][j] - t[i * D + j]) / (B * D);
        }
    }
    memset(want, 0, sizeof want);
    for (i = 0; i < B; i++) {
        for (k = 0; k < H; k++) {
            dh[i][k] = 0.0;
            for (j = 0; j < D; j++) {
                want[D * H + H + k * D + j] += h[i][k] * dy[i][j]; /* dW2 */
                dh[i][k] += dy[i][j] * w[D * H + H + k * D + j];
            }
            dh[i][k] *= z[i][k] > 0;
        }
        for (j = 0; j < D; j++) want[D * H + H + H * D + j] += dy[i][j]; /* db2 */
        for (k = 0; k < H; k++) {
            want[D * H + k] += dh[i][k]; /* db1 */
            for (j = 0; j < D; j++) want[j * H + k] += (double)x[i * D + j] * dh[i][k]; /* dW1 */
        }
    }
    if (compile_mse(m) && OK(mp_model_set_weights(m, w, sizeof w / sizeof w[0]), m) &&
        OK(forward_rows(m, x, B, 1), m) && OK(mp_output(m, &out), m)) {
        for (i = 0; i < B; i++)
            for (j = 0; j < D; j++) {
                double got = get(out.data, out.dtype, (size_t)(i * D + j));
                if (!(fabs(got - y[i][j]) <= 1e-5 * (1.0 + fabs(y[i][j]))) && bad++ == 0)
                    snprintf(detail, sizeof detail, "y[%d][%d] = %.7g, by hand %.7g", i, j, got, y[i][j]);
            }
        check_all(bad, "residual block: forward equals x + Dense(Dense(x)) by hand", detail, __FILE__, __LINE__);
        if (OK(loss_rows(m, NULL, t, B, &loss, NULL), m) && OK(mp_compute_scaled_gradients(m), m) &&
            OK(mp_get_unscaled_gradients(m), m) && OK(mp_get_gradients(m, grad, sizeof grad / sizeof grad[0]), m)) {
            CHECK(fabs(loss - want_loss) <= 1e-5 * (1.0 + want_loss));
            for (bad = 0, i = 0; i < (int)(sizeof grad / sizeof grad[0]); i++)
                if (!(fabs(grad[i] - want[i]) <= 1e-5 * (1.0 + fabs(want[i]))) && bad++ == 0)
                    snprintf(detail, sizeof detail, "weight %d: %.7g, by hand %.7g", i, (double)grad[i], want[i]);
            check_all(bad, "residual block: every gradient equals the one by hand (the skip's share summed)", detail,
                      __FILE__, __LINE__);
        }
    }
    mp_model_destroy(m);
}

/* ======================================================================== */
/* 3. BatchNormalization and LayerNormalization against Keras's formulas */

/* Input(3) -> BatchNormalization: the training pass normalises by the
   batch's mean and biased variance; moving = moving * 0.99 + batch * 0.01
   after each training pass (from 0 and 1); inference uses the moving
   statistics; gamma and beta as set. */
static void test_batch_norm_formulas(void) {
    enum { B = 5, C = 3 };
    graph g;
    mp_model *m;
    float w[4 * C], x[B * C], after[4 * C];
    double mean[C], var[C], mm[C], mv[C];
    mp_tensor out;
    int i, c, step, bad = 0;
    char detail[160] = "";
    memset(&g, 0, sizeof g);
    g.what = "bn";
    g.shape[0] = C;
    g.nodes[0] = seq(mp_batch_normalization());
    g.count = 1;
    if (!(m = build(&g, "float32"))) return;
    CHECK_EQ(mp_model_param_count(m), 4 * C);
    CHECK_EQ(mp_model_trainable_param_count(m), 2 * C);
    if (!OK(mp_model_get_weights(m, w, 4 * C), m)) goto out;
    for (c = 0; c < C; c++) /* Keras's initial values: gamma 1, beta 0, moving mean 0, moving variance 1 */
        bad += w[c] != 1.0f || w[C + c] != 0.0f || w[2 * C + c] != 0.0f || w[3 * C + c] != 1.0f;
    CHECK(bad == 0);
    for (c = 0; c < C; c++) {
        w[c] = 0.5f + (float)c, w[C + c] = -0.25f * (float)c; /* gamma, beta */
        mm[c] = 0.0, mv[c] = 1.0;
    }
    if (!OK(mp_model_set_weights(m, w, 4 * C), m)) goto out;
    for (step = 0; step < 2; step++) {
        fill(x, B * C, -2.0f, 3.0f);
        if (!OK(forward_rows(m, x, B, 1), m) || !OK(mp_output(m, &out), m)) goto out;
        for (c = 0; c < C; c++) {
            mean[c] = var[c] = 0.0;
            for (i = 0; i < B; i++) mean[c] += x[i * C + c] / (double)B;
            for (i = 0; i < B; i++) var[c] += (x[i * C + c] - mean[c]) * (x[i * C + c] - mean[c]) / (double)B;
            mm[c] = mm[c] * 0.99 + mean[c] * 0.01;
            mv[c] = mv[c] * 0.99 + var[c] * 0.01;
            for (i = 0; i < B; i++) {
                double want = (x[i * C + c] - mean[c]) / sqrt(var[c] + 1e-3) * w[c] + w[C + c];
                double got = get(out.data, out.dtype, (size_t)(i * C + c));
                if (!(fabs(got - want) <= 2e-6 * (1.0 + fabs(want))) && bad++ == 0)
                    snprintf(detail, sizeof detail, "step %d, y[%d][%d] = %.7g, want %.7g", step, i, c, got, want);
            }
        }
    }
    check_all(bad, "BatchNormalization training: (x - mean) / sqrt(var + 1e-3) gamma + beta, the batch's statistics",
              detail, __FILE__, __LINE__);
    if (OK(mp_model_get_weights(m, after, 4 * C), m)) {
        for (bad = 0, c = 0; c < C; c++)
            if (!(fabs(after[2 * C + c] - mm[c]) <= 1e-6 && fabs(after[3 * C + c] - mv[c]) <= 1e-6) && bad++ == 0)
                snprintf(detail, sizeof detail, "channel %d: moving %.7g, %.7g; want %.7g, %.7g", c,
                         (double)after[2 * C + c], (double)after[3 * C + c], mm[c], mv[c]);
        check_all(bad, "BatchNormalization: moving = moving * 0.99 + batch * 0.01, each training pass", detail,
                  __FILE__, __LINE__);
    }
    /* inference: the moving statistics, and they stay */
    if (OK(forward_rows(m, x, B, 0), m) && OK(mp_output(m, &out), m)) {
        for (bad = 0, i = 0; i < B; i++)
            for (c = 0; c < C; c++) {
                double want = (x[i * C + c] - mm[c]) / sqrt(mv[c] + 1e-3) * w[c] + w[C + c];
                double got = get(out.data, out.dtype, (size_t)(i * C + c));
                if (!(fabs(got - want) <= 2e-6 * (1.0 + fabs(want))) && bad++ == 0)
                    snprintf(detail, sizeof detail, "y[%d][%d] = %.7g, want %.7g", i, c, got, want);
            }
        check_all(bad, "BatchNormalization inference: the moving statistics", detail, __FILE__, __LINE__);
        CHECK(weights_equal(m, after));
    }
out:
    mp_model_destroy(m);
}

/* Input(4, 6) -> LayerNormalization(epsilon 1e-5): each row of 6 by its
   own mean and biased variance; float32 statistics under mixed_bfloat16
   too (the output then rounded once to bfloat16). */
static void test_layer_norm_formulas(void) {
    enum { B = 3, R = 4, C = 6 };
    const char *policies[] = {"float32", "mixed_bfloat16"};
    int p;
    for (p = 0; p < 2; p++) {
        graph g;
        mp_model *m;
        float w[2 * C], x[B * R * C];
        mp_tensor out;
        int r, c, bad = 0;
        char detail[160] = "", what[160];
        memset(&g, 0, sizeof g);
        g.what = "ln";
        g.shape[0] = R, g.shape[1] = C;
        g.nodes[0] = seq(mp_layer_normalization());
        g.nodes[0].layer.epsilon = 1e-5f;
        g.count = 1;
        if (!(m = build(&g, policies[p]))) continue;
        for (c = 0; c < C; c++) w[c] = 1.0f + 0.125f * (float)c, w[C + c] = 0.0625f * (float)c;
        fill(x, B * R * C, -4.0f, 4.0f);
        for (c = 0; p && c < B * R * C; c++) x[c] = mp_bf16_to_f32(mp_bf16_from_f32(x[c])); /* exact in bfloat16 */
        if (OK(mp_model_set_weights(m, w, 2 * C), m) && OK(forward_rows(m, x, B, 0), m) && OK(mp_output(m, &out), m)) {
            for (r = 0; r < B * R; r++) {
                double mean = 0.0, var = 0.0;
                for (c = 0; c < C; c++) mean += x[r * C + c] / (double)C;
                for (c = 0; c < C; c++) var += (x[r * C + c] - mean) * (x[r * C + c] - mean) / (double)C;
                for (c = 0; c < C; c++) {
                    double want = (x[r * C + c] - mean) / sqrt(var + 1e-5) * w[c] + w[C + c];
                    double got = get(out.data, out.dtype, (size_t)(r * C + c));
                    double tol = p ? 1.0 / 128 * fabs(want) + 1e-6 : 2e-6 * (1.0 + fabs(want));
                    if (!(fabs(got - want) <= tol) && bad++ == 0)
                        snprintf(detail, sizeof detail, "row %d col %d: %.7g, want %.7g", r, c, got, want);
                }
            }
            snprintf(what, sizeof what, "LayerNormalization under %s: each row by its own statistics", policies[p]);
            check_all(bad, what, detail, __FILE__, __LINE__);
            CHECK(out.dtype == (p ? MP_BFLOAT16 : MP_FLOAT32));
        }
        mp_model_destroy(m);
    }
}

/* ======================================================================== */
/* 3b. Sequences: Dense over the last axis, the tanh gelu, Dropout,
   LayerNormalization and Add on (time, features); MultiHeadAttention
   (causal and not); a small GPT from token ids with sparse crossentropy
   over (batch, time) labels, under every policy. */

static void test_grad_sequences(void) {
    graph g;
    memset(&g, 0, sizeof g);
    g.what = "(3, 4) -> Dense(5, gelu_approximate) -> Dropout(0) -> LayerNormalization -> Dense(4), Add(input)";
    g.shape[0] = 3, g.shape[1] = 4;
    g.nodes[0] = seq(mp_dense(5, MP_GELU_APPROXIMATE));
    g.nodes[1] = seq(mp_dropout(0.0f));
    g.nodes[2] = seq(mp_layer_normalization());
    g.nodes[3] = seq(mp_dense(4, MP_LINEAR));
    g.nodes[4] = on2(mp_add(), MP_MODEL_INPUT, 4);
    g.count = 5;
    g.batch = 3;
    run_graph(&g);

    memset(&g, 0, sizeof g);
    g.what = "(5, 6) -> MultiHeadAttention(2 heads, key_dim 3, causal) -> Dense(2)";
    g.shape[0] = 5, g.shape[1] = 6;
    g.nodes[0] = seq(mp_multi_head_attention(2, 3, 1));
    g.nodes[1] = seq(mp_dense(2, MP_LINEAR));
    g.count = 2;
    g.batch = 2;
    run_graph(&g);

    memset(&g, 0, sizeof g);
    g.what = "(4, 4) -> Dense(4) -> MultiHeadAttention(3 heads, key_dim 2, no mask, no bias) + skip";
    g.shape[0] = 4, g.shape[1] = 4;
    g.nodes[0] = seq(mp_dense(4, MP_TANH));
    g.nodes[1] = seq(mp_multi_head_attention(3, 2, 0));
    g.nodes[1].layer.no_bias = 1;
    g.nodes[2] = on2(mp_add(), 1, 2);
    g.count = 3;
    g.batch = 2;
    run_graph(&g);
}

/* MultiHeadAttention's output against a float64 evaluation of Keras's
   formula from the same weights: projections, softmax(q k^T / sqrt(D))
   with the causal mask, p v, the output projection. */
static void test_attention_reference(void) {
    enum { B = 2, T = 5, C = 6, H = 2, D = 4, HD = H * D };
    const char *policies[] = {"float32", "mixed_bfloat16"};
    int p;
    for (p = 0; p < 2; p++) {
        graph g;
        mp_model *m;
        float x[B * T * C], *w;
        mp_tensor out;
        int b, i, j, c, h, bad = 0;
        char detail[160] = "", what[160];
        memset(&g, 0, sizeof g);
        g.what = "mha";
        g.shape[0] = T, g.shape[1] = C;
        g.nodes[0] = seq(mp_multi_head_attention(H, D, 1));
        g.count = 1;
        if (!(m = build(&g, policies[p]))) continue;
        CHECK(mp_model_param_count(m) == 4 * C * HD + 3 * HD + C);
        w = weights_of(m);
        for (i = 0; i < 3 * (C * HD + HD); i += C * HD + HD) /* nonzero biases too */
            for (j = 0; j < HD; j++) w[i + C * HD + j] = uniform(-0.5f, 0.5f);
        fill(x, B * T * C, -1.0f, 1.0f);
        for (i = 0; p && i < B * T * C; i++) x[i] = mp_bf16_to_f32(mp_bf16_from_f32(x[i]));
        if (OK(mp_model_set_weights(m, w, mp_model_param_count(m)), m) && OK(forward_rows(m, x, B, 0), m) &&
            OK(mp_output(m, &out), m)) {
            for (b = 0; b < B; b++) {
                double q[T][HD], k[T][HD], v[T][HD], att[T][HD];
                const float *wq = w, *wk = w + C * HD + HD, *wv = w + 2 * (C * HD + HD), *wo = w + 3 * (C * HD + HD);
                for (i = 0; i < T; i++)
                    for (j = 0; j < HD; j++) {
                        q[i][j] = wq[C * HD + j], k[i][j] = wk[C * HD + j], v[i][j] = wv[C * HD + j];
                        for (c = 0; c < C; c++) {
                            double xv = x[(b * T + i) * C + c];
                            q[i][j] += xv * wq[c * HD + j], k[i][j] += xv * wk[c * HD + j], v[i][j] += xv * wv[c * HD + j];
                        }
                    }
                for (h = 0; h < H; h++)
                    for (i = 0; i < T; i++) {
                        double s[T], mx = -1e300, sum = 0.0;
                        for (j = 0; j <= i; j++) {
                            s[j] = 0.0;
                            for (c = 0; c < D; c++) s[j] += q[i][h * D + c] * k[j][h * D + c] / sqrt((double)D);
                            mx = fmax(mx, s[j]);
                        }
                        for (j = 0; j <= i; j++) sum += exp(s[j] - mx);
                        for (c = 0; c < D; c++) {
                            att[i][h * D + c] = 0.0;
                            for (j = 0; j <= i; j++) att[i][h * D + c] += exp(s[j] - mx) / sum * v[j][h * D + c];
                        }
                    }
                for (i = 0; i < T; i++)
                    for (c = 0; c < C; c++) {
                        double want = wo[HD * C + c], got;
                        for (j = 0; j < HD; j++) want += att[i][j] * wo[j * C + c];
                        got = get(out.data, out.dtype, (size_t)((b * T + i) * C + c));
                        if (!(fabs(got - want) <= (p ? 3e-2 : 1e-5) * (1.0 + fabs(want))) && bad++ == 0)
                            snprintf(detail, sizeof detail, "sample %d row %d col %d: %.7g, want %.7g", b, i, c, got,
                                     want);
                    }
            }
            snprintf(what, sizeof what, "MultiHeadAttention (causal) under %s: Keras's formula in float64", policies[p]);
            check_all(bad, what, detail, __FILE__, __LINE__);
        }
        free(w);
        mp_model_destroy(m);
    }
}

/* A small GPT (llm.c's block): ids (T,) -> Embedding + PositionEmbedding
   -> [LayerNormalization -> MultiHeadAttention(causal) -> Add ->
   LayerNormalization -> Dense(4C, gelu_approximate) -> Dense(C) -> Add]
   -> LayerNormalization -> Dense(V), sparse crossentropy from the logits
   over (batch, T) labels. */
enum { GPT_V = 11, GPT_T = 6, GPT_C = 8 };
static mp_model *tiny_gpt(const char *policy, int threads) {
    mp_model_desc md;
    mp_model *m = NULL;
    int tok = 0, pos = 0, x = 0, a = 0, r1 = 0, f = 0, ok, in[2];
    mp_layer_desc ln = mp_layer_normalization();
    mp_compile_desc cd;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = GPT_T;
    md.threads = threads;
    md.seed = 3;
    ln.epsilon = 1e-5f;
    ok = OK(mp_set_global_policy_name(policy), NULL) && OK(mp_model_create(&m, &md), m);
    ok = ok && OK(mp_model_call(m, mp_embedding(GPT_V, GPT_C), NULL, 0, &tok), m);
    ok = ok && OK(mp_model_call(m, mp_position_embedding(GPT_T + 2), &tok, 1, &pos), m);
    in[0] = tok, in[1] = pos;
    ok = ok && OK(mp_model_call(m, mp_add(), in, 2, &x), m);
    ok = ok && OK(mp_model_call(m, ln, &x, 1, NULL), m);
    ok = ok && OK(mp_model_call(m, mp_multi_head_attention(2, GPT_C / 2, 1), NULL, 0, &a), m);
    in[0] = x, in[1] = a;
    ok = ok && OK(mp_model_call(m, mp_add(), in, 2, &r1), m);
    ok = ok && OK(mp_model_call(m, ln, &r1, 1, NULL), m);
    ok = ok && OK(mp_model_add(m, mp_dense(4 * GPT_C, MP_GELU_APPROXIMATE)), m);
    ok = ok && OK(mp_model_call(m, mp_dense(GPT_C, MP_LINEAR), NULL, 0, &f), m);
    in[0] = r1, in[1] = f;
    ok = ok && OK(mp_model_call(m, mp_add(), in, 2, NULL), m);
    ok = ok && OK(mp_model_add(m, ln), m) && OK(mp_model_add(m, mp_dense(GPT_V, MP_LINEAR)), m);
    mp_set_global_policy_name("float32");
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    cd.from_logits = 1;
    cd.metrics = MP_METRIC_ACCURACY;
    cd.optimizer.kind = MP_ADAM;
    cd.optimizer.learning_rate = 0.01f;
    cd.loss_scale = MP_LOSS_SCALE_NONE;
    ok = ok && OK(mp_model_compile(m, &cd), m);
    if (!ok) {
        mp_model_destroy(m);
        return NULL;
    }
    return m;
}

typedef struct token_batch {
    int32_t ids[4 * GPT_T], labels[4 * GPT_T];
    int n;
} token_batch;

static mp_status token_forward(mp_model *m, const token_batch *b) {
    mp_data d;
    int t = GPT_T;
    memset(&d, 0, sizeof d);
    d.x[0] = mp_array_i32(b->ids, (size_t)b->n, 1, &t);
    return mp_forward(m, &d, 1);
}
static float token_loss(mp_model *m, const void *batch_) {
    const token_batch *b = (const token_batch *)batch_;
    int t = GPT_T;
    mp_array y = mp_array_i32(b->labels, (size_t)b->n, 1, &t);
    float loss = NAN;
    if (token_forward(m, b) != MP_OK || mp_compute_loss(m, &y, &loss, NULL) != MP_OK) return NAN;
    return loss;
}
static int token_gradients(mp_model *m, const void *batch_, float *g) {
    return !isnan(token_loss(m, batch_)) && OK(mp_compute_scaled_gradients(m), m) &&
           OK(mp_get_unscaled_gradients(m), m) && OK(mp_get_gradients(m, g, mp_model_trainable_param_count(m)), m);
}

static void test_tiny_gpt(void) {
    token_batch b;
    mp_model *m = tiny_gpt("float32", 1);
    size_t n, i;
    float *w, *g32, loss;
    const char *policies[] = {"mixed_float16", "mixed_bfloat16"};
    double tols[] = {2e-2, 8e-2};
    int p;
    if (!m) return;
    b.n = 3;
    for (i = 0; i < (size_t)(b.n * GPT_T); i++) {
        b.ids[i] = (int32_t)(rng_next() % GPT_V);
        b.labels[i] = (int32_t)(rng_next() % GPT_V);
    }
    grad_check("tiny GPT (Embedding, PositionEmbedding, causal MultiHeadAttention, tanh gelu), float32", m, token_loss,
               token_gradients, &b, 1e-2f);
    n = mp_model_param_count(m);
    w = weights_of(m);
    g32 = floats(n);
    loss = token_loss(m, &b); /* about ln(V) from the start: every token's loss averaged */
    if (!CHECK(loss > 0.5f * logf((float)GPT_V) && loss < 2.0f * logf((float)GPT_V)))
        fprintf(stderr, "    loss %.4f, ln V %.4f\n", (double)loss, log((double)GPT_V));
    token_gradients(m, &b, g32);
    mp_model_destroy(m);
    for (p = 0; p < 2; p++) { /* the same weights under the mixed policies: gradients near float32's */
        mp_model *q = tiny_gpt(policies[p], 1);
        float *g = floats(n);
        double d2 = 0.0, r2 = 0.0;
        char what[120];
        if (q && OK(mp_model_set_weights(q, w, n), q) && token_gradients(q, &b, g)) {
            for (i = 0; i < mp_model_trainable_param_count(q); i++) {
                d2 += ((double)g[i] - g32[i]) * ((double)g[i] - g32[i]);
                r2 += (double)g32[i] * g32[i];
            }
            snprintf(what, sizeof what, "tiny GPT under %s: gradients within %g of float32's", policies[p], tols[p]);
            if (!check_report(sqrt(d2) <= tols[p] * sqrt(r2), __FILE__, __LINE__, what))
                fprintf(stderr, "    |g - g32| %.4g, |g32| %.4g\n", sqrt(d2), sqrt(r2));
        }
        free(g);
        mp_model_destroy(q);
    }
    free(w);
    free(g32);
}

/* Training the tiny GPT with fit on (batch, time) labels: the loss falls,
   and 1 and 2 threads give the same weights bit for bit (the embedding's
   scatter-add and attention in a fixed order). */
static void test_tiny_gpt_training(void) {
    enum { N = 64 };
    int32_t ids[N * GPT_T], labels[N * GPT_T];
    float *w[2] = {NULL, NULL}, first = 0.0f, last = 0.0f;
    int i, t, shape = GPT_T;
    for (i = 0; i < N * GPT_T; i++) { /* a counting sequence: the next id is id + 1 mod V */
        ids[i] = (int32_t)((i / GPT_T * 3 + i % GPT_T) % GPT_V);
        labels[i] = (ids[i] + 1) % GPT_V;
    }
    for (t = 0; t < 2; t++) {
        mp_model *m = tiny_gpt("mixed_bfloat16", t + 1);
        mp_fit_desc fd;
        mp_logs ev;
        if (!m) break;
        memset(&fd, 0, sizeof fd);
        fd.data.x[0] = mp_array_i32(ids, N, 1, &shape);
        fd.data.y = mp_array_i32(labels, N, 1, &shape);
        fd.batch_size = 16;
        fd.epochs = 1;
        fd.verbose = MP_VERBOSE_SILENT;
        if (OK(mp_model_evaluate(m, &fd.data, 16, &ev), m)) first = ev.loss;
        fd.epochs = 12;
        if (OK(mp_model_fit(m, &fd), m) && OK(mp_model_evaluate(m, &fd.data, 16, &ev), m)) {
            last = ev.loss;
            w[t] = weights_of(m);
        }
        mp_model_destroy(m);
    }
    if (!CHECK(last < 0.5f * first)) fprintf(stderr, "    loss %.4f -> %.4f\n", (double)first, (double)last);
    if (w[0] && w[1]) {
        mp_model *m = tiny_gpt("float32", 1);
        CHECK(m && memcmp(w[0], w[1], mp_model_param_count(m) * sizeof(float)) == 0);
        mp_model_destroy(m);
    }
    free(w[0]);
    free(w[1]);
}

static int message_has(const mp_model *m, const char *a, const char *b);

/* Token ids out of range or not integers: the error names the sample,
   the position and the layer; an Embedding not on the model's input, a
   MultiHeadAttention on a flat input: refused with the layer's name. */
static void test_sequence_errors(void) {
    mp_model *m = tiny_gpt("float32", 1);
    mp_model_desc md;
    token_batch b;
    float fx[GPT_T];
    mp_data d;
    int i, t = GPT_T;
    if (!m) return;
    memset(&b, 0, sizeof b);
    b.n = 2;
    b.ids[GPT_T + 4] = GPT_V; /* sample 1, position 4 */
    CHECK(token_forward(m, &b) == MP_ERR_ARG);
    CHECK(message_has(m, "sample 1, position 4", "embedding"));
    b.ids[GPT_T + 4] = -1;
    CHECK(token_forward(m, &b) == MP_ERR_ARG);
    for (i = 0; i < GPT_T; i++) fx[i] = (float)i;
    fx[2] = 1.5f;
    memset(&d, 0, sizeof d);
    d.x[0] = mp_array_f32(fx, 1, 1, &t);
    CHECK(mp_forward(m, &d, 0) == MP_ERR_ARG);
    CHECK(message_has(m, "sample 0, position 2", "not an integer"));
    fx[2] = 2.0f;
    CHECK(OK(mp_forward(m, &d, 0), m));
    {   /* labels: one per position */
        int32_t y[GPT_T] = {0, 1, 2, 3, 4, GPT_V};
        mp_array a = mp_array_i32(y, 1, 1, &t);
        float loss;
        CHECK(mp_compute_loss(m, &a, &loss, NULL) == MP_ERR_LABEL);
        CHECK(message_has(m, "sample 0, position 5", NULL));
        a = mp_labels(y, 1);
        CHECK(mp_compute_loss(m, &a, &loss, NULL) == MP_ERR_SHAPE);
    }
    mp_model_destroy(m);
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 4;
    m = NULL;
    if (OK(mp_model_create(&m, &md), m)) {
        int dense = 0;
        CHECK(OK(mp_model_call(m, mp_dense(3, MP_LINEAR), NULL, 0, &dense), m));
        CHECK(mp_model_add(m, mp_embedding(5, 2)) == MP_ERR_ARG && message_has(m, "embedding", "model's input"));
        CHECK(mp_model_add(m, mp_multi_head_attention(2, 2, 1)) == MP_ERR_SHAPE &&
              message_has(m, "multi_head_attention", "(time, features)"));
        CHECK(mp_model_add(m, mp_position_embedding(8)) == MP_ERR_SHAPE);
    }
    mp_model_destroy(m);
}

/* ======================================================================== */
/* 4. Wrong graphs: a clear status naming the layers, nothing changed */

static int message_has(const mp_model *m, const char *a, const char *b) {
    const char *e = mp_model_error(m);
    return strstr(e, a) && (!b || strstr(e, b));
}

static void test_graph_errors(void) {
    mp_model_desc md;
    mp_model *m = NULL;
    int id = -7, ids[3], target[4] = {5, 0, 0, 0}, bad_target[4] = {-1, -1, 0, 0};
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 4;
    if (!OK(mp_model_create(&m, &md), m)) return;
    CHECK(mp_model_call(m, mp_dense(3, MP_RELU), NULL, 0, &id) == MP_OK && id == 1);
    ids[0] = 2; /* not added yet */
    CHECK(mp_model_call(m, mp_dense(3, MP_RELU), ids, 1, &id) == MP_ERR_ARG && id == 1);
    CHECK(message_has(m, "dense_1", "added before"));
    ids[0] = -1;
    CHECK(mp_model_call(m, mp_dense(3, MP_RELU), ids, 1, NULL) == MP_ERR_ARG);
    CHECK(mp_model_call(m, mp_dense(3, MP_RELU), NULL, 1, NULL) == MP_ERR_NULL);
    CHECK(mp_model_add(m, mp_add()) == MP_ERR_ARG); /* a merge takes two inputs or more */
    CHECK(message_has(m, "Add", "2"));
    ids[0] = 1, ids[1] = MP_MODEL_INPUT; /* (None, 3) and (None, 4) */
    CHECK(mp_model_call(m, mp_add(), ids, 2, NULL) == MP_ERR_SHAPE);
    CHECK(message_has(m, "add", "(None, 4)") && message_has(m, "dense", "input_layer"));
    ids[2] = 1;
    CHECK(mp_model_call(m, mp_subtract(), ids, 3, NULL) == MP_ERR_ARG);
    CHECK(mp_model_call(m, mp_concatenate(2), ids, 2, NULL) == MP_ERR_ARG); /* axis 2 of rank-1 inputs */
    CHECK(mp_model_call(m, mp_reshape(target), ids, 1, NULL) == MP_ERR_SHAPE); /* 3 values into 5 */
    CHECK(mp_model_call(m, mp_reshape(bad_target), ids, 1, NULL) == MP_ERR_ARG); /* two -1 */
    CHECK(mp_model_call(m, mp_global_average_pooling2d(), ids, 1, NULL) == MP_ERR_SHAPE);
    {
        mp_layer_desc bn = mp_batch_normalization();
        bn.momentum = 1.5f;
        CHECK(mp_model_call(m, bn, ids, 1, NULL) == MP_ERR_ARG);
    }
    CHECK(mp_model_layer_count(m) == 1);
    /* the failed calls took no name: the next Dense is dense_1, the next Add add */
    CHECK(mp_model_call(m, mp_dense(4, MP_LINEAR), ids, 1, &id) == MP_OK && id == 2);
    CHECK(mp_model_call(m, mp_concatenate(0), ids, 2, &id) == MP_OK && id == 3); /* (None, 3 + 4) */
    {
        mp_layer_info info;
        CHECK(mp_model_layer_info(m, 1, &info) == MP_OK && strcmp(info.name, "dense_1") == 0);
        CHECK(mp_model_layer_info(m, 2, &info) == MP_OK && strcmp(info.name, "concatenate") == 0 &&
              info.rank == 1 && info.output_shape[0] == 7);
    }
    /* dense_1 feeds nothing: the model's one output is the last layer */
    CHECK(mp_model_build(m) == MP_ERR_ARG);
    CHECK(message_has(m, "dense_1", "feeds no layer"));
    ids[0] = 3, ids[1] = 2;
    CHECK(mp_model_call(m, mp_concatenate(-1), ids, 2, NULL) == MP_OK);
    CHECK(mp_model_build(m) == MP_OK);
    CHECK(mp_model_output_size(m) == 11);
    mp_model_destroy(m);
}

/* ======================================================================== */
/* 5. Memory: an output nothing reads in the backward pass is not kept. A
   chain of Add layers over a shared input keeps far less than a buffer per
   edge: each Add's output (read forward only) and each gradient share the
   same bytes. */
static void test_liveness(void) {
    enum { D = 256, DEPTH = 12, BATCH = 64 };
    graph g;
    mp_model *m;
    mp_model_memory mem;
    float *x, *t;
    int i;
    memset(&g, 0, sizeof g);
    g.what = "adds";
    g.shape[0] = D;
    g.nodes[0] = on1(mp_dense(D, MP_LINEAR), MP_MODEL_INPUT);
    for (i = 1; i < DEPTH; i++) g.nodes[i] = on2(mp_add(), i, MP_MODEL_INPUT);
    g.count = DEPTH;
    if (!(m = build(&g, "float32"))) return;
    x = floats((size_t)BATCH * D);
    t = floats((size_t)BATCH * D);
    fill(x, (size_t)BATCH * D, -1.0f, 1.0f);
    if (compile_mse(m) && OK(forward_rows(m, x, BATCH, 1), m) && OK(mp_model_memory_info(m, &mem), m)) {
        size_t edge = (size_t)BATCH * D * sizeof(float), per_edge = 2 * (size_t)DEPTH * edge;
        /* a buffer and a gradient per layer would be per_edge; live at once
           are the input copy, a few outputs and two gradients */
        if (!check_report(mem.activations < per_edge / 3, __FILE__, __LINE__,
                          "a chain of Adds keeps under a third of a buffer and a gradient per layer"))
            fprintf(stderr, "    activations %zu bytes, a buffer per edge %zu\n", mem.activations, per_edge);
    }
    free(x);
    free(t);
    mp_model_destroy(m);
}

/* ======================================================================== */
/* 6. A small residual net trains, the same bits at 1 and 2 threads */

/* BatchNormalization's momentum 0.9: the moving statistics settle within
   the few dozen steps the test trains (Keras's 0.99 needs hundreds, and
   evaluation reads them). */
static mp_layer_desc quick_batch_norm(void) {
    mp_layer_desc d = mp_batch_normalization();
    d.momentum = 0.9f;
    return d;
}

static mp_model *residual_net(int threads) {
    mp_model_desc md;
    mp_model *m = NULL;
    int stem = 0, a = 0, b = 0, sum = 0, ok;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 8, md.input_shape[1] = 8, md.input_shape[2] = 1;
    md.threads = threads;
    md.seed = 5;
    ok = OK(mp_model_create(&m, &md), m);
    ok = ok && OK(mp_model_call(m, mp_conv2d(8, 3, 3, MP_SAME, MP_LINEAR), NULL, 0, &stem), m);
    ok = ok && OK(mp_model_add(m, quick_batch_norm()), m) && OK(mp_model_add(m, mp_activation_layer(MP_RELU)), m);
    ok = ok && OK(mp_model_call(m, mp_conv2d(8, 3, 3, MP_SAME, MP_LINEAR), NULL, 0, &a), m);
    ok = ok && OK(mp_model_add(m, quick_batch_norm()), m);
    ok = ok && OK(mp_model_call(m, mp_activation_layer(MP_RELU), NULL, 0, &b), m);
    {
        int both[2];
        both[0] = b, both[1] = a - 1; /* the stem's relu: the skip */
        ok = ok && OK(mp_model_call(m, mp_add(), both, 2, &sum), m);
    }
    ok = ok && OK(mp_model_add(m, mp_global_average_pooling2d()), m) && OK(mp_model_add(m, mp_dense(2, MP_SOFTMAX)), m);
    if (!ok) {
        mp_model_destroy(m);
        return NULL;
    }
    (void)stem, (void)sum;
    return m;
}

static void test_residual_training(void) {
    enum { N = 96 };
    static const int image[3] = {8, 8, 1};
    float *x = floats((size_t)N * 64), *w[2] = {NULL, NULL};
    int32_t labels[N];
    float acc[2] = {0, 0};
    int i, t;
    for (i = 0; i < N; i++) { /* class 1: a bright left half */
        int j;
        labels[i] = (int32_t)(i & 1);
        for (j = 0; j < 64; j++) x[i * 64 + j] = uniform(0.0f, 0.5f) + (labels[i] && (j % 8) < 4 ? 0.5f : 0.0f);
    }
    for (t = 0; t < 2; t++) {
        mp_model *m = residual_net(t + 1);
        mp_compile_desc cd;
        mp_fit_desc fd = silent_fit(x, 64, labels, N, 16, 8);
        mp_logs ev;
        if (!m) break;
        memset(&cd, 0, sizeof cd);
        cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
        cd.metrics = MP_METRIC_ACCURACY;
        cd.optimizer.kind = MP_ADAM;
        cd.optimizer.learning_rate = 0.01f;
        fd.data.x[0] = mp_array_f32(x, N, 3, image);
        if (OK(mp_model_compile(m, &cd), m) && OK(mp_model_fit(m, &fd), m)) {
            if (OK(mp_model_evaluate(m, &fd.data, 0, &ev), m)) acc[t] = ev.accuracy;
            w[t] = weights_of(m);
        }
        mp_model_destroy(m);
    }
    if (!CHECK(acc[0] >= 0.9f)) fprintf(stderr, "    accuracy %.3f\n", (double)acc[0]);
    if (w[0] && w[1]) {
        mp_model *m = residual_net(1);
        CHECK(m && memcmp(w[0], w[1], mp_model_param_count(m) * sizeof(float)) == 0);
        mp_model_destroy(m);
    }
    free(w[0]);
    free(w[1]);
    free(x);
}

/* 7. Convolutions over several groups of images (columns past the group's
   cache: 32 x 32 images, groups of 3 images and of 1), their weight
   gradients in runs of groups (MP_CONV_PARTS, more groups than runs): the
   same weights bit for bit at 1, 2 and 3 threads, in float32 and
   mixed_bfloat16. Each kind of Conv2D: a 3x3 that halves the channels (its
   input gradient by the flipped kernel reads dy's columns, narrower than
   x's), strides 2 (folded back by col2im), 1x1. */
static mp_model *grouped_convs(const char *policy, int threads) {
    mp_model_desc md;
    mp_model *m = NULL;
    mp_layer_desc strided = mp_conv2d(8, 3, 3, MP_SAME, MP_RELU);
    int ok;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 32, md.input_shape[1] = 32, md.input_shape[2] = 8;
    md.threads = threads;
    md.seed = 9;
    strided.strides[0] = strided.strides[1] = 2;
    ok = OK(mp_set_global_policy_name(policy), NULL) && OK(mp_model_create(&m, &md), m);
    ok = ok && OK(mp_model_add(m, mp_conv2d(16, 3, 3, MP_SAME, MP_RELU)), m);
    ok = ok && OK(mp_model_add(m, mp_conv2d(4, 3, 3, MP_SAME, MP_TANH)), m);
    ok = ok && OK(mp_model_add(m, strided), m);
    ok = ok && OK(mp_model_add(m, mp_conv2d(6, 1, 1, MP_VALID, MP_RELU)), m);
    ok = ok && OK(mp_model_add(m, mp_global_average_pooling2d()), m) && OK(mp_model_add(m, mp_dense(2, MP_SOFTMAX)), m);
    mp_set_global_policy_name("float32");
    if (!ok) {
        mp_model_destroy(m);
        return NULL;
    }
    return m;
}

static void test_conv_groups_threads(void) {
    enum { N = 16, PIXELS = 32 * 32 * 8 };
    static const int image[3] = {32, 32, 8};
    static const char *const policies[2] = {"float32", "mixed_bfloat16"};
    float *x = floats((size_t)N * PIXELS);
    int32_t labels[N];
    int i, p, t;
    for (i = 0; i < N * PIXELS; i++) x[i] = uniform(-1.0f, 1.0f);
    for (i = 0; i < N; i++) labels[i] = (int32_t)(i % 2);
    for (p = 0; p < 2; p++) {
        float *w[3] = {NULL, NULL, NULL};
        size_t params = 0;
        for (t = 0; t < 3; t++) {
            mp_model *m = grouped_convs(policies[p], t + 1);
            mp_compile_desc cd;
            mp_fit_desc fd = silent_fit(x, PIXELS, labels, N, N, 2);
            if (!m) break;
            memset(&cd, 0, sizeof cd);
            cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
            cd.optimizer.kind = MP_ADAM;
            fd.data.x[0] = mp_array_f32(x, N, 3, image);
            if (OK(mp_model_compile(m, &cd), m) && OK(mp_model_fit(m, &fd), m)) w[t] = weights_of(m);
            params = mp_model_param_count(m);
            mp_model_destroy(m);
        }
        for (t = 1; t < 3; t++)
            if (!CHECK(w[0] && w[t] && memcmp(w[0], w[t], params * sizeof(float)) == 0))
                fprintf(stderr, "    %s: %d threads' weights differ from 1 thread's\n", policies[p], t + 1);
        for (t = 0; t < 3; t++) free(w[t]);
    }
    free(x);
}

/* A 3x3 convolution with more input channels than filters, alone: its
   forward columns (KH KW C a pixel) are wider than its output gradient's
   (KH KW F), and its scratch must hold both. Under the sanitizers a block
   sized for the narrower one is written past. */
static void test_conv_fewer_filters(void) {
    enum { N = 4, PIXELS = 32 * 32 * 16 };
    static const int image[3] = {32, 32, 16};
    float *x = floats((size_t)N * PIXELS);
    int32_t labels[N] = {0, 1, 0, 1};
    mp_model_desc md;
    mp_compile_desc cd;
    mp_model *m = NULL;
    mp_fit_desc fd = silent_fit(x, PIXELS, labels, N, N, 1);
    int i;
    for (i = 0; i < N * PIXELS; i++) x[i] = uniform(-1.0f, 1.0f);
    memset(&md, 0, sizeof md);
    memset(&cd, 0, sizeof cd);
    md.input_shape[0] = 32, md.input_shape[1] = 32, md.input_shape[2] = 16;
    md.threads = 1;
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    cd.optimizer.kind = MP_ADAM;
    fd.data.x[0] = mp_array_f32(x, N, 3, image);
    if (OK(mp_model_create(&m, &md), m) && OK(mp_model_add(m, mp_conv2d(4, 3, 3, MP_SAME, MP_RELU)), m) &&
        OK(mp_model_add(m, mp_global_average_pooling2d()), m) && OK(mp_model_add(m, mp_dense(2, MP_SOFTMAX)), m) &&
        OK(mp_model_compile(m, &cd), m))
        OK(mp_model_fit(m, &fd), m);
    mp_model_destroy(m);
    free(x);
}

/* mp_model_weight_info: Keras 3's model.weights, one entry per variable
   in get_weights' order, with its path parts, Keras shape and offsets
   (trainable offsets skip the moving statistics). */
static void test_weight_info(void) {
    static const int shape[] = {5, 5, 2, 0};
    mp_layer_desc layers[5];
    mp_model *m;
    mp_weight_info w;
    static const struct { const char *layer, *name; int trainable, rank, shape[4]; size_t offset, grad; } want[] = {
        {"conv2d", "kernel", 1, 4, {3, 3, 2, 4}, 0, 0},
        {"conv2d", "bias", 1, 1, {4}, 72, 72},
        {"batch_normalization", "gamma", 1, 1, {4}, 76, 76},
        {"batch_normalization", "beta", 1, 1, {4}, 80, 80},
        {"batch_normalization", "moving_mean", 0, 1, {4}, 84, 0},
        {"batch_normalization", "moving_variance", 0, 1, {4}, 88, 0},
        {"dense", "kernel", 1, 2, {36, 3}, 92, 84},
    };
    int i, r, n, same, bad = 0;
    char detail[200] = "";
    layers[0] = mp_conv2d(4, 3, 3, MP_VALID, MP_LINEAR);
    layers[1] = mp_batch_normalization();
    layers[2] = mp_flatten();
    layers[3] = mp_dense(3, MP_LINEAR);
    layers[3].no_bias = 1;
    layers[4] = mp_activation_layer(MP_RELU);
    if (!(m = new_model("float32", shape, layers, 5))) return;
    n = mp_model_weight_count(m);
    CHECK_EQ(n, 7);
    for (i = 0; i < n && i < 7; i++) {
        if (!OK(mp_model_weight_info(m, i, &w), m)) break;
        same = !strcmp(w.layer, want[i].layer) && !strcmp(w.name, want[i].name) &&
                   w.trainable == want[i].trainable && w.rank == want[i].rank && w.offset == want[i].offset &&
                   w.gradient_offset == want[i].grad && w.layer_index == (i == 6 ? 3 : i / 2 ? 1 : 0);
        for (r = 0; r < w.rank; r++) same &= w.shape[r] == want[i].shape[r];
        if (!same && bad++ == 0)
            snprintf(detail, sizeof detail, "weight %d: %s/%s rank %d offset %d", i, w.layer, w.name, w.rank,
                     (int)w.offset);
    }
    check_all(bad, "weight_info: paths, Keras shapes and offsets of conv2d, batch_normalization and dense", detail,
              __FILE__, __LINE__);
    CHECK_EQ(w.offset + w.size, mp_model_param_count(m));
    CHECK_EQ(mp_model_weight_info(m, 7, &w), MP_ERR_ARG);
    CHECK_EQ(mp_model_weight_info(m, -1, &w), MP_ERR_ARG);
    CHECK_EQ(mp_model_weight_info(NULL, 0, &w), MP_ERR_NULL);
    CHECK_EQ(mp_model_weight_count(NULL), 0);
    mp_model_destroy(m);
}

/* The sequence layers' weights as Keras 3 names and shapes them: the
   embeddings, then MultiHeadAttention's eight (C 8, 2 heads, key_dim 4). */
static void test_weight_info_sequences(void) {
    static const struct { const char *layer, *name; int rank, shape[3]; } want[] = {
        {"embedding", "embeddings", 2, {GPT_V, GPT_C}},
        {"position_embedding", "embeddings", 2, {GPT_T + 2, GPT_C}},
        {"layer_normalization", "gamma", 1, {GPT_C}},
        {"layer_normalization", "beta", 1, {GPT_C}},
        {"multi_head_attention", "query/kernel", 3, {GPT_C, 2, 4}},
        {"multi_head_attention", "query/bias", 2, {2, 4}},
        {"multi_head_attention", "key/kernel", 3, {GPT_C, 2, 4}},
        {"multi_head_attention", "key/bias", 2, {2, 4}},
        {"multi_head_attention", "value/kernel", 3, {GPT_C, 2, 4}},
        {"multi_head_attention", "value/bias", 2, {2, 4}},
        {"multi_head_attention", "attention_output/kernel", 3, {2, 4, GPT_C}},
        {"multi_head_attention", "attention_output/bias", 1, {GPT_C}},
    };
    mp_model *m = tiny_gpt("float32", 1);
    mp_weight_info w;
    size_t at = 0;
    int i, r, same, bad = 0, n = (int)(sizeof want / sizeof want[0]);
    char detail[200] = "";
    if (!m) return;
    for (i = 0; i < n; i++) {
        if (!OK(mp_model_weight_info(m, i, &w), m)) break;
        same = !strcmp(w.layer, want[i].layer) && !strcmp(w.name, want[i].name) && w.rank == want[i].rank &&
               w.offset == at && w.trainable;
        for (r = 0; r < w.rank; r++) same &= w.shape[r] == want[i].shape[r];
        at += w.size;
        if (!same && bad++ == 0) snprintf(detail, sizeof detail, "weight %d: %s/%s rank %d", i, w.layer, w.name, w.rank);
    }
    check_all(bad, "weight_info: Embedding, PositionEmbedding and MultiHeadAttention as Keras 3 names them", detail,
              __FILE__, __LINE__);
    mp_model_destroy(m);
}

/* The optimizer's variables are Keras's, one per weight_info entry, so
   MultiHeadAttention's eight are clipped and excluded from weight decay
   one by one (its biases lie inside its kernel block). SGD, lr 0.1, weight
   decay 0.5 excluding "bias", clipnorm 1, every gradient set to 1: each
   kernel becomes w - w 0.5 0.1 - 0.1 / sqrt(size), each bias
   w - 0.1 / sqrt(size) (one norm over the layer would be sqrt(total)). */
static void test_attention_variables(void) {
    static const int shape[] = {4, 6, 0};
    static const char *const exclude[] = {"bias", NULL};
    mp_layer_desc layer = mp_multi_head_attention(2, 3, 1);
    mp_compile_desc cd;
    mp_model *m;
    mp_weight_info wi;
    float x[2 * 4 * 6], y[2 * 4 * 6], *w0 = NULL, *g = NULL, *w1 = NULL, loss;
    size_t n, nt, j;
    int i, applied = 0, bad = 0;
    char detail[200] = "";
    if (!(m = new_model("float32", shape, &layer, 1))) return;
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_MEAN_SQUARED_ERROR;
    cd.optimizer.kind = MP_SGD, cd.optimizer.learning_rate = 0.1f;
    cd.optimizer.weight_decay = 0.5f, cd.optimizer.clipnorm = 1.0f;
    cd.optimizer.exclude_from_weight_decay = exclude;
    n = mp_model_param_count(m), nt = mp_model_trainable_param_count(m);
    w0 = (float *)zalloc(n * sizeof *w0), g = (float *)zalloc(nt * sizeof *g), w1 = (float *)zalloc(n * sizeof *w1);
    fill(x, 48, -1.0f, 1.0f), fill(y, 48, -1.0f, 1.0f);
    for (j = 0; j < nt; j++) g[j] = 1.0f;
    if (!OK(mp_model_compile(m, &cd), m) || !OK(mp_model_get_weights(m, w0, n), m) || !OK(forward_rows(m, x, 2, 1), m) ||
        !OK(loss_rows(m, NULL, y, 2, &loss, NULL), m) || !OK(mp_compute_scaled_gradients(m), m) ||
        !OK(mp_get_unscaled_gradients(m), m) || !OK(mp_set_gradients(m, g, nt), m) ||
        !OK(mp_apply_gradients(m, &applied), m) || !CHECK(applied) || !OK(mp_model_get_weights(m, w1, n), m))
        goto out;
    CHECK_EQ(mp_model_weight_count(m), 8);
    for (i = 0; i < mp_model_weight_count(m) && OK(mp_model_weight_info(m, i, &wi), m); i++) {
        int is_bias = strstr(wi.name, "bias") != NULL;
        for (j = wi.offset; j < wi.offset + wi.size; j++) {
            float w = w0[j], want = is_bias ? w : w - w * 0.5f * 0.1f;
            want -= 0.1f * (float)(1.0 / sqrt((double)wi.size));
            if (!(fabsf(w1[j] - want) <= 1e-6f) && bad++ == 0)
                snprintf(detail, sizeof detail, "%s/%s[%d]: %.9g -> %.9g, want %.9g", wi.layer, wi.name,
                         (int)(j - wi.offset), (double)w, (double)w1[j], (double)want);
        }
    }
    check_all(bad, "MultiHeadAttention: clipnorm and the weight-decay exclusion per Keras variable", detail, __FILE__,
              __LINE__);
out:
    free(w0), free(g), free(w1);
    mp_model_destroy(m);
}

int main(int argc, char **argv) {
    check_args(argc, argv);
    RUN(test_graph_errors());
    RUN(test_residual_by_hand());
    RUN(test_grad_normalizations());
    RUN(test_grad_merges());
    RUN(test_grad_concatenate());
    RUN(test_grad_pooling_reshape());
    RUN(test_batch_norm_formulas());
    RUN(test_layer_norm_formulas());
    RUN(test_grad_sequences());
    RUN(test_attention_reference());
    RUN(test_tiny_gpt());
    RUN(test_tiny_gpt_training());
    RUN(test_sequence_errors());
    RUN(test_liveness());
    RUN(test_weight_info());
    RUN(test_attention_variables());
    RUN(test_weight_info_sequences());
    RUN(test_residual_training());
    RUN(test_conv_groups_threads());
    RUN(test_conv_fewer_filters());
    return check_done("test_graph");
}
