/* peer.c - mixprec against the real Keras (Keras 3 and tf_keras), from the
   file tests/keras_peer/loss_from_logits.py writes (argv[1]): for each
   small model whose output is a softmax or sigmoid, mixprec's loss and
   weight gradients must equal Keras's, both taken from the logits, in
   float32 to 1e-5 of the loss and 1e-4 of the largest gradient; under
   mixed_float16 (the guide's float16 Dense, float32 softmax) to 1e-2,
   since Keras on the CPU rounds the float16 Dense twice (MatMul, then
   BiasAdd) and mixprec once. With a second file, from amp_paint.py, the
   colouring of automatic mixed precision against TensorFlow's (see
   test_amp). With a third, from layers.py, the graph layers
   (BatchNormalization, LayerNormalization, a residual Add) against Keras 3:
   see compare_graph. With a fourth, from optimizers.py, the options of
   Keras 3's optimizers: see compare_optimizer. tests/matrix.sh runs it when MIXPREC_KERAS_PYTHON
   names a python with tensorflow-cpu and tf-keras. */
#define MIXPREC_IMPLEMENTATION
#include "../../mixprec.h"
#include "../check.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { MAXV = 4096 };

typedef struct peer_case {
    char name[64], act[16], policy[32];
    int loss, layer, n, in, units;
    float x[MAXV], w[MAXV], y[MAXV];
    int32_t labels[MAXV];
} peer_case;

static int read_floats(FILE *f, float *v, size_t n) {
    size_t i;
    for (i = 0; i < n; i++)
        if (fscanf(f, "%f", &v[i]) != 1) return 0;
    return 1;
}

/* mixprec's loss and gradients of one case; 0 on failure (counted). */
static int run_mixprec(const peer_case *c, float *loss, float *g) {
    mp_model_desc md;
    mp_compile_desc cd;
    mp_layer_desc out = mp_activation_layer(strcmp(c->act, "softmax") == 0 ? MP_SOFTMAX : MP_SIGMOID);
    mp_model *m = NULL;
    size_t np = (size_t)(c->in + 1) * (size_t)c->units;
    mp_data d;
    int ok;
    memset(&d, 0, sizeof d);
    d.x[0] = mp_rows(c->x, (size_t)c->n, c->in);
    d.y = c->loss == 1 ? mp_labels(c->labels, (size_t)c->n) : mp_rows(c->y, (size_t)c->n, c->units);
    memset(&md, 0, sizeof md);
    md.input_shape[0] = c->in;
    memset(&cd, 0, sizeof cd);
    cd.loss = (mp_loss)c->loss;
    cd.optimizer.kind = MP_SGD;
    cd.loss_scale = MP_LOSS_SCALE_NONE;
    out.dtype = "float32"; /* the guide's float32 output */
    ok = mp_set_global_policy_name(c->policy) == MP_OK && mp_model_create(&m, &md) == MP_OK &&
         mp_model_add(m, mp_dense(c->units, c->layer ? MP_LINEAR : out.activation)) == MP_OK &&
         (!c->layer || mp_model_add(m, out) == MP_OK) && mp_model_compile(m, &cd) == MP_OK &&
         mp_model_set_weights(m, c->w, np) == MP_OK && mp_forward(m, &d, 1) == MP_OK &&
         mp_compute_loss(m, &d.y, loss, NULL) == MP_OK &&
         mp_compute_scaled_gradients(m) == MP_OK && mp_get_unscaled_gradients(m) == MP_OK &&
         mp_get_gradients(m, g, np) == MP_OK;
    if (!CHECK(ok)) fprintf(stderr, "    %s: %s\n", c->name, m ? mp_model_error(m) : "no model");
    mp_model_destroy(m);
    mp_set_global_policy_name("float32");
    return ok;
}

static void compare(const peer_case *c, const char *flavour, FILE *f) {
    size_t np = (size_t)(c->in + 1) * (size_t)c->units, i, bad = 0;
    float want_loss, want[MAXV], loss = NAN, g[MAXV], gmax = 0.0f;
    int mixed = strcmp(c->policy, "float32") != 0;
    double tol = mixed ? 1e-2 : 1e-5, gtol = mixed ? 1e-2 : 1e-4;
    char what[160];
    if (!CHECK(fscanf(f, "%*s %*s %f", &want_loss) == 1 && read_floats(f, want, np))) return;
    if (!run_mixprec(c, &loss, g)) return;
    for (i = 0; i < np; i++) gmax = fmaxf(gmax, fabsf(want[i]));
    for (i = 0; i < np; i++) bad += !(fabsf(g[i] - want[i]) <= gtol * gmax);
    snprintf(what, sizeof what, "%s, %s: loss %.7g, Keras's %.7g; %zu of %zu gradients off", c->name, flavour,
             (double)loss, (double)want_loss, bad, np);
    check_report(fabs(loss - want_loss) <= tol * want_loss && bad == 0 && gmax > 0.0f, __FILE__, __LINE__, what);
    printf("%s\n", what);
}

/* Automatic mixed precision on the guide's MLP (784-64-64-10, softmax):
   every forward op of mixprec's colouring has TensorFlow's dtype, read
   from amp_paint.py's file (the ops it converted; the others stay float32). */
static void test_amp(FILE *f) {
    static const char *const dtypes[2] = {"float16", "bfloat16"};
    char line[256], table[4096], converted[32][3][32];
    int k, n = 0, tf_x = 0, tf_y = 0, tf_z = 0;
    while (n < 32 && fgets(line, sizeof line, f)) /* amp DTYPE LAYER OP DTYPE */
        if (sscanf(line, "amp %31s %31s %31s", converted[n][0], converted[n][1], converted[n][2]) == 3) n++;
    CHECK(n == 18);
    for (k = 0; k < 2; k++) {
        mp_model_desc md;
        mp_compile_desc cd;
        mp_layer_desc out = mp_activation_layer(MP_SOFTMAX);
        mp_model *m = NULL;
        const char *row;
        int rows = 0, bad = 0, x = 0, y = 0, z = 0;
        char what[200];
        memset(&md, 0, sizeof md);
        md.input_shape[0] = 784;
        memset(&cd, 0, sizeof cd);
        cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
        cd.amp.enabled = 1;
        cd.amp.dtype = k ? MP_BFLOAT16 : MP_FLOAT16;
        if (!CHECK(mp_model_create(&m, &md) == MP_OK && mp_model_add(m, mp_dense(64, MP_RELU)) == MP_OK &&
                   mp_model_add(m, mp_dense(64, MP_RELU)) == MP_OK &&
                   mp_model_add(m, mp_dense(10, MP_LINEAR)) == MP_OK && mp_model_add(m, out) == MP_OK &&
                   mp_model_compile(m, &cd) == MP_OK && mp_model_amp_table(m, table, sizeof table) == MP_OK)) {
            mp_model_destroy(m);
            continue;
        }
        for (row = strchr(table, '\n'); row && row[1]; row = strchr(row + 1, '\n')) { /* after the header */
            char op[64], layer[32], list[16], dtype[16];
            const char *want = "float32";
            int i;
            if (sscanf(row + 1, "%63s %31s %15s %15s", op, layer, list, dtype) != 4) { bad++; continue; }
            for (i = 0; i < n; i++)
                if (!strcmp(converted[i][0], dtypes[k]) && !strcmp(converted[i][1], layer) &&
                    !strcmp(converted[i][2], op))
                    want = dtypes[k];
            rows++;
            if (strcmp(dtype, want) != 0) {
                bad++;
                fprintf(stderr, "    %s: %s of %s is %s, TensorFlow's %s\n", dtypes[k], op, layer, dtype, want);
            }
        }
        rewind(f);
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "summary %15s %d %d %d", what, &tf_x, &tf_y, &tf_z) == 4 && !strcmp(what, dtypes[k]))
                break;
        if (mp_model_amp_report(m, line, sizeof line) != MP_OK ||
            sscanf(line, "Converted %d/%d nodes to %*s precision using %d", &x, &y, &z) != 3)
            bad++;
        snprintf(what, sizeof what, "%s: %d ops of mixprec's colouring, %d not TensorFlow's (converted %d/%d with %d "
                 "cast(s); TensorFlow's graph %d/%d with %d)", dtypes[k], rows, bad, x, y, z, tf_x, tf_y, tf_z);
        check_report(rows == 11 && bad == 0, __FILE__, __LINE__, what);
        printf("%s\n", what);
        mp_model_destroy(m);
    }
}

/* ---- The graph cases of layers.py's file: the new layers against Keras 3.
   Each case is the model (a layer a line), its weights' sizes, the inputs,
   targets and weights, then Keras's training steps and inference output;
   mixprec builds the model with mp_model_call and takes the same steps with
   the custom loop (mp_forward, mp_compute_loss, mp_compute_scaled_gradients,
   mp_get_unscaled_gradients, mp_get_gradients, SGD's mp_apply_gradients). */

/* What each policy's results must agree to with Keras's: the loss as a
   fraction of Keras's, every other value as a fraction of the largest of
   its kind (output, gradients; the moving statistics: see moving_off_by).
   float32: each side rounds every operation once, in its own order of
   sums: a few float32 ulps of the largest value, well under 1e-5.
   The mixed policies: both sides round the Dense/Conv2D output, the
   normalised output and each activation gradient to the compute dtype
   (Keras's MatMul then BiasAdd twice, where mixprec rounds once), and sum
   in their own orders; float32 differences that straddle a rounding move
   an element by one ulp of the 16-bit dtype (ulp16). mixprec's first step
   must be within 4 of those ulps of the float64 step (float64_tolerance);
   Keras's may be as far on the other side (its float16 filter gradient of
   a Conv2D on the CPU comes close), so the two agree within 8. */
static double ulp16(const char *policy) { /* of values in [1, 2) */
    return strcmp(policy, "mixed_bfloat16") == 0 ? 0x1p-7 : 0x1p-10;
}
static double graph_tolerance(const char *policy) {
    return strcmp(policy, "float32") == 0 ? 1e-5 : 8.0 * ulp16(policy);
}
static double float64_tolerance(const char *policy) {
    return strcmp(policy, "float32") == 0 ? 1e-5 : 4.0 * ulp16(policy);
}

/* One "TAG COUNT values" line into a new array (the caller frees it), or
   NULL when the tag is another or the count is not want. */
static float *read_tagged(FILE *f, const char *tag, size_t want) {
    char got[32];
    size_t count;
    float *v;
    if (fscanf(f, "%31s %zu", got, &count) != 2 || strcmp(got, tag) != 0 || count != want || !count)
        return NULL;
    v = malloc(count * sizeof *v);
    if (v && !read_floats(f, v, count)) {
        free(v);
        v = NULL;
    }
    return v;
}

/* One layer line ("dense 8 linear 1 0": the kind, its arguments, how many
   layers it reads and their ids), added with mp_model_call. */
static int add_graph_layer(FILE *f, mp_model *m) {
    char kind[32], act[24] = "linear", pad[16], dtype[16];
    int units = 0, kh = 0, kw = 0, n_in = 0, in[MP_MAX_LAYER_INPUTS], i, args, causal = 0;
    float momentum = 0.0f, epsilon = 0.0f;
    mp_activation a = MP_LINEAR;
    mp_layer_desc d;
    if (fscanf(f, "%31s", kind) != 1) return 0;
    if (!strcmp(kind, "dense")) {
        args = fscanf(f, "%d %23s", &units, act) == 2;
        d = mp_dense(units, a);
    } else if (!strcmp(kind, "embedding")) { /* input_dim, output_dim */
        args = fscanf(f, "%d %d", &units, &kh) == 2;
        d = mp_embedding(units, kh);
    } else if (!strcmp(kind, "multi_head_attention")) { /* num_heads, key_dim, use_causal_mask */
        args = fscanf(f, "%d %d %d", &units, &kh, &causal) == 3;
        d = mp_multi_head_attention(units, kh, causal);
    } else if (!strcmp(kind, "conv2d")) {
        args = fscanf(f, "%d %d %d %15s %15s", &units, &kh, &kw, pad, act) == 5;
        d = mp_conv2d(units, kh, kw, strcmp(pad, "same") == 0 ? MP_SAME : MP_VALID, a);
    } else if (!strcmp(kind, "batch_normalization")) {
        args = fscanf(f, "%f %f", &momentum, &epsilon) == 2;
        d = mp_batch_normalization();
    } else if (!strcmp(kind, "layer_normalization")) {
        args = fscanf(f, "%f", &epsilon) == 1;
        d = mp_layer_normalization();
    } else if (!strcmp(kind, "add")) {
        args = 1;
        d = mp_add();
    } else if (!strcmp(kind, "activation")) { /* the guide's float32 output */
        args = fscanf(f, "%15s %15s", act, dtype) == 2 && strcmp(dtype, "float32") == 0;
        d = mp_activation_layer(a);
        d.dtype = "float32";
    } else {
        return 0;
    }
    if (!args || mp_activation_from_name(act, &a) != MP_OK || fscanf(f, "%d", &n_in) != 1 || n_in < 1 ||
        n_in > MP_MAX_LAYER_INPUTS)
        return 0;
    for (i = 0; i < n_in; i++)
        if (fscanf(f, "%d", &in[i]) != 1) return 0;
    d.activation = a;
    d.momentum = momentum;
    d.epsilon = epsilon;
    return mp_model_call(m, d, in, n_in, NULL) == MP_OK;
}

static float largest(const float *v, size_t n) {
    float big = 0.0f;
    size_t i;
    for (i = 0; i < n; i++) big = fmaxf(big, fabsf(v[i]));
    return big;
}

/* The largest |got - want| as a fraction of scale; infinite for a NaN. */
static double off_by(const float *got, const float *want, size_t n, double scale) {
    double worst = 0.0, d;
    size_t i;
    for (i = 0; i < n; i++) {
        d = fabs((double)got[i] - (double)want[i]);
        if (d != d) return INFINITY;
        worst = fmax(worst, d);
    }
    return worst == 0.0 ? 0.0 : worst / scale;
}

/* Each layer's compute dtype against Keras's (the "dtypes" line), so that a
   policy mixprec did not apply cannot pass for a rounding difference. */
static int same_dtypes(FILE *f, const mp_model *m, int layers) {
    char want[16];
    mp_layer_info info;
    int n = 0, i, ok;
    ok = fscanf(f, " dtypes %d", &n) == 1 && n == layers && n == mp_model_layer_count(m);
    for (i = 0; ok && i < n; i++) {
        ok = fscanf(f, "%15s", want) == 1 && mp_model_layer_info(m, i, &info) == MP_OK;
        if (ok && strcmp(mp_dtype_name(info.compute_dtype), want) != 0) {
            fprintf(stderr, "    %s: %s, Keras's %s\n", info.name, mp_dtype_name(info.compute_dtype), want);
            ok = 0;
        }
    }
    return ok;
}

/* What layers.py says of each weight array: a moving statistic (no
   gradient), a trainable weight, or one whose gradient is zero in exact
   arithmetic (a bias that only a BatchNormalization reads), whose rounding
   noise is compared against the model's largest gradient instead of its own. */
enum { ARRAY_MOVING, ARRAY_TRAINABLE, ARRAY_ZERO_GRADIENT };
static const char *const array_roles[] = {"moving", "trainable", "zero_gradient"};

typedef struct graph_case {
    char name[64], policy[32];
    int loss, steps, n, rank, layers, arrays;
    float lr;
    size_t sizes[16];
    int role[16]; /* ARRAY_MOVING, ... */
} graph_case;

/* How far each side's step moved the moving statistics, mixprec's move
   against Keras's, as a fraction of Keras's largest move in that array:
   momentum 0.99 moves them by a hundredth of the batch's statistics, which
   a fraction of the statistics themselves would hardly see. Each side
   rounds the stored statistic twice (moving * momentum, then + batch *
   (1 - momentum)), so two of its float32 ulps are allowed beyond the
   tolerance: the result is the worst excess past them, *raw the worst
   difference before that allowance. */
static double moving_off_by(const graph_case *c, const float *got, const float *got_before, const float *want,
                            const float *want_before, double *raw) {
    double worst = 0.0, moved, d;
    size_t at = 0, i;
    int k;
    for (k = 0; k < c->arrays; at += c->sizes[k++]) {
        if (c->role[k] != ARRAY_MOVING) continue;
        for (moved = FLT_MIN, i = at; i < at + c->sizes[k]; i++)
            moved = fmax(moved, fabs((double)want[i] - want_before[i]));
        for (i = at; i < at + c->sizes[k]; i++) {
            d = fabs(((double)got[i] - got_before[i]) - ((double)want[i] - want_before[i]));
            if (d != d) return *raw = INFINITY;
            *raw = fmax(*raw, d / moved);
            worst = fmax(worst, (d - 2.0 * FLT_EPSILON * fabs(want[i])) / moved);
        }
    }
    return worst;
}

/* The gradients, each array as a fraction of its own largest (see
   ARRAY_ZERO_GRADIENT), the worst of them. */
static double gradients_off_by(const graph_case *c, const float *got, const float *want, size_t n) {
    double worst = 0.0, scale;
    size_t at = 0;
    int k;
    for (k = 0; k < c->arrays; k++) {
        if (c->role[k] == ARRAY_MOVING) continue;
        scale = largest(c->role[k] == ARRAY_ZERO_GRADIENT ? want : want + at,
                        c->role[k] == ARRAY_ZERO_GRADIENT ? n : c->sizes[k]);
        worst = fmax(worst, off_by(got + at, want + at, c->sizes[k], scale));
        at += c->sizes[k];
    }
    return worst;
}

/* The last mp_forward's output (n floats), or NULL (counted). */
static const float *mixprec_output(mp_model *m, size_t n) {
    mp_tensor out;
    if (!CHECK(mp_output(m, &out) == MP_OK && out.dtype == MP_FLOAT32 && mp_tensor_count(&out) == n)) return NULL;
    return out.data;
}

/* One step's comparison with Keras's, printed and counted. */
static void report_step(const graph_case *c, int step, float loss, float want_loss, double out_off, double grad_off,
                        double moving_off, double moving_raw, int has_moving) {
    double tol = graph_tolerance(c->policy);
    double off = fmax(fmax(out_off, grad_off), fmax(moving_off, fabs((double)loss - want_loss) / fabs(want_loss)));
    char what[320];
    int at = snprintf(what, sizeof what, "%s, step %d: loss %.7g, Keras's %.7g; off by output %.2g, gradients %.2g",
                      c->name, step, (double)loss, (double)want_loss, out_off, grad_off);
    if (has_moving && at > 0 && (size_t)at < sizeof what)
        at += snprintf(what + at, sizeof what - (size_t)at, ", moving statistics' move %.2g", moving_raw);
    if (at > 0 && (size_t)at < sizeof what) snprintf(what + at, sizeof what - (size_t)at, " (tolerance %g)", tol);
    check_report(off <= tol, __FILE__, __LINE__, what);
    printf("%s\n", what);
}

/* mixprec's first step (output, gradients) against the float64 one both
   sides approximate, within float64_tolerance; Keras's distance from it is
   printed beside. */
static void report_float64(const graph_case *c, const float *out, const float *want_out, const float *exact_out,
                           size_t nout, const float *g, const float *want_g, const float *exact_g, size_t ng) {
    double tol = float64_tolerance(c->policy), scale = largest(exact_out, nout);
    double out_off = off_by(out, exact_out, nout, scale), keras_out_off = off_by(want_out, exact_out, nout, scale);
    double grad_off = gradients_off_by(c, g, exact_g, ng), keras_grad_off = gradients_off_by(c, want_g, exact_g, ng);
    char what[320];
    snprintf(what, sizeof what, "%s, step 1 against float64: output off by %.2g (Keras %.2g), gradients %.2g "
             "(Keras %.2g) (tolerance %g)", c->name, out_off, keras_out_off, grad_off, keras_grad_off, tol);
    check_report(fmax(out_off, grad_off) <= tol, __FILE__, __LINE__, what);
    printf("%s\n", what);
}

/* The case's training steps and inference output against Keras's; m is
   compiled and holds the case's weights w (nw of them), d is its batch. */
static void compare_steps(FILE *f, const graph_case *c, mp_model *m, const mp_data *d, float *w, size_t nw) {
    size_t ng = mp_model_trainable_param_count(m), nout = (size_t)c->n * mp_model_output_size(m);
    double out_off = INFINITY, moving_off, moving_raw;
    float *g = malloc(ng * sizeof *g), *w_after = malloc(nw * sizeof *w_after), *w_before = malloc(nw * sizeof *w);
    float *exact_out = NULL, *exact_g = NULL, *out_1 = malloc(nout * sizeof *out_1), *want_out = NULL,
          *want_g = NULL, *want_w = NULL;
    float loss = NAN, want_loss = NAN;
    const float *out = NULL;
    int step, got_step = 0, ok = g && w_after && w_before && out_1;
    char what[320];
    ok = ok && (exact_out = read_tagged(f, "float64_output", nout)) &&
         (exact_g = read_tagged(f, "float64_gradients", ng));
    if (ok) memcpy(w_before, w, nw * sizeof *w);
    for (step = 1; ok && step <= c->steps; step++) {
        ok = fscanf(f, " step %d %f", &got_step, &want_loss) == 2 && got_step == step && mp_forward(m, d, 1) == MP_OK &&
             (out = mixprec_output(m, nout)) && (want_out = read_tagged(f, "output", nout)) &&
             (want_g = read_tagged(f, "gradients", ng)) && (want_w = read_tagged(f, "weights", nw));
        if (ok) {
            out_off = off_by(out, want_out, nout, largest(want_out, nout));
            memcpy(out_1, out, nout * sizeof *out); /* the loss and the backward pass may reuse its bytes */
        }
        ok = ok && mp_compute_loss(m, &d->y, &loss, NULL) == MP_OK && mp_compute_scaled_gradients(m) == MP_OK &&
             mp_get_unscaled_gradients(m) == MP_OK && mp_get_gradients(m, g, ng) == MP_OK &&
             mp_apply_gradients(m, NULL) == MP_OK && mp_model_get_weights(m, w_after, nw) == MP_OK;
        if (!CHECK(ok)) {
            fprintf(stderr, "    %s step %d: %s\n", c->name, step, mp_model_error(m));
            break;
        }
        moving_raw = 0.0;
        moving_off = moving_off_by(c, w_after, w_before, want_w, w, &moving_raw);
        report_step(c, step, loss, want_loss, out_off, gradients_off_by(c, g, want_g, ng), moving_off, moving_raw,
                    ng < nw);
        if (step == 1) report_float64(c, out_1, want_out, exact_out, nout, g, want_g, exact_g, ng);
        memcpy(w_before, w_after, nw * sizeof *w); /* each side's weights before the next step */
        memcpy(w, want_w, nw * sizeof *w);
        free(want_out);
        free(want_g);
        free(want_w);
        want_out = want_g = want_w = NULL;
    }
    free(exact_out);
    free(exact_g);
    free(out_1);
    free(want_out);
    free(want_g);
    free(want_w);
    free(g);
    free(w_after);
    free(w_before);
    if (!CHECK(ok && mp_forward(m, d, 0) == MP_OK && (out = mixprec_output(m, nout)) &&
               (want_out = read_tagged(f, "inference", nout))))
        return;
    out_off = off_by(out, want_out, nout, largest(want_out, nout));
    snprintf(what, sizeof what, "%s, inference: output off by %.2g (tolerance %g)", c->name, out_off,
             graph_tolerance(c->policy));
    check_report(out_off <= graph_tolerance(c->policy), __FILE__, __LINE__, what);
    printf("%s\n", what);
    free(want_out);
}

/* One graph case of the file: builds, compiles and loads it, then compares
   its steps; 0 when the file cannot be read on (the rest is skipped). */
static int compare_graph(FILE *f) {
    graph_case c;
    mp_model_desc md;
    mp_compile_desc cd;
    mp_model *m = NULL;
    mp_data d;
    float *x = NULL, *y = NULL, *w = NULL;
    int32_t *labels = NULL;
    size_t nx, ny, nw = 0, ntrain = 0, i;
    int k, ok;
    memset(&c, 0, sizeof c);
    memset(&md, 0, sizeof md);
    if (fscanf(f, " graph %63s %31s %d %d %f %d %d", c.name, c.policy, &c.loss, &c.steps, &c.lr, &c.n, &c.rank) != 7 ||
        c.rank < 1 || c.rank > 3 || c.n < 1)
        return 0;
    for (k = 0; k < c.rank; k++)
        if (fscanf(f, "%d", &md.input_shape[k]) != 1 || md.input_shape[k] < 1) return 0;
    if (fscanf(f, "%d", &c.layers) != 1 || mp_set_global_policy_name(c.policy) != MP_OK ||
        mp_model_create(&m, &md) != MP_OK)
        return 0;
    for (ok = 1, k = 0; ok && k < c.layers; k++) ok = add_graph_layer(f, m);
    ok = ok && CHECK(same_dtypes(f, m, c.layers));
    ok = ok && fscanf(f, " arrays %d", &c.arrays) == 1 && c.arrays >= 0 && c.arrays <= 16;
    for (k = 0; ok && k < c.arrays; k++) {
        char role[16];
        ok = fscanf(f, "%zu %15s", &c.sizes[k], role) == 2;
        for (c.role[k] = 0; c.role[k] < 3 && strcmp(role, array_roles[c.role[k]]) != 0; c.role[k]++) continue;
        ok = ok && c.role[k] < 3;
        nw += c.sizes[k];
        ntrain += c.role[k] != ARRAY_MOVING ? c.sizes[k] : 0;
    }
    mp_set_global_policy_name("float32");
    memset(&cd, 0, sizeof cd);
    cd.loss = (mp_loss)c.loss;
    cd.optimizer.kind = MP_SGD;
    cd.optimizer.learning_rate = c.lr;
    cd.loss_scale = MP_LOSS_SCALE_NONE; /* Keras's side takes the gradients unscaled too */
    ok = ok && mp_model_compile(m, &cd) == MP_OK;
    nx = (size_t)c.n * mp_model_input_size(m);
    ny = c.loss == MP_SPARSE_CATEGORICAL_CROSSENTROPY ? (size_t)c.n : (size_t)c.n * mp_model_output_size(m);
    ok = ok && (x = read_tagged(f, "x", nx)) && (y = read_tagged(f, "y", ny)) && (w = read_tagged(f, "weights", nw)) &&
         (labels = malloc(ny * sizeof *labels));
    /* Keras's get_weights order and counts are mixprec's */
    ok = ok && CHECK(mp_model_param_count(m) == nw && mp_model_trainable_param_count(m) == ntrain) &&
         mp_model_set_weights(m, w, nw) == MP_OK;
    if (CHECK(ok)) {
        memset(&d, 0, sizeof d);
        for (i = 0; i < ny; i++) labels[i] = (int32_t)y[i];
        d.x[0] = mp_array_f32(x, (size_t)c.n, c.rank, md.input_shape);
        d.y = c.loss == MP_SPARSE_CATEGORICAL_CROSSENTROPY ? mp_labels(labels, ny)
                                                            : mp_rows(y, (size_t)c.n, (int)mp_model_output_size(m));
        compare_steps(f, &c, m, &d, w, nw);
    } else {
        fprintf(stderr, "    %s: %s\n", c.name, mp_model_error(m));
    }
    mp_model_destroy(m);
    free(x);
    free(y);
    free(w);
    free(labels);
    return ok;
}

/* Past the rest of a case that could not be read to its end: to the next
   "graph" line, or the end. */
static void skip_to_graph(FILE *f) {
    int ch = '\n', prev;
    long at;
    for (;;) {
        prev = ch;
        at = ftell(f);
        if ((ch = getc(f)) == EOF) return;
        if (prev == '\n' && ch == 'g') {
            fseek(f, at, SEEK_SET);
            return;
        }
    }
}

/* loss_from_logits.py's cases, then Keras 3's lines and tf_keras's, in
   the cases' order. */
static void test_losses(FILE *f) {
    static peer_case cases[8];
    int n = 0, i, k;
    while (n < 8) {
        peer_case *c = &cases[n];
        long at = ftell(f);
        size_t nx, nw, ny;
        if (fscanf(f, " case %63s %d %15s %d %31s %d %d %d", c->name, &c->loss, c->act, &c->layer, c->policy, &c->n,
                   &c->in, &c->units) != 8) {
            fseek(f, at, SEEK_SET);
            break;
        }
        nx = (size_t)c->n * (size_t)c->in;
        nw = (size_t)(c->in + 1) * (size_t)c->units;
        ny = (size_t)c->n * (size_t)c->units;
        if (!CHECK(nx <= MAXV && nw <= MAXV && ny <= MAXV && read_floats(f, c->x, nx) && read_floats(f, c->w, nw)))
            return;
        for (i = 0; i < c->n; i++) CHECK(fscanf(f, "%d", &c->labels[i]) == 1);
        CHECK(read_floats(f, c->y, ny));
        n++;
    }
    for (k = 0; k < 2; k++)
        for (i = 0; i < n; i++) compare(&cases[i], k ? "tf_keras" : "Keras 3", f);
    CHECK(n == 5);
}

/* layers.py's cases, each read to its end even where one fails. */
static void test_graphs(FILE *f) {
    int graphs = 0, i, compared = 0;
    CHECK(fscanf(f, " graphs %d", &graphs) == 1 && graphs > 0);
    for (i = 0; i < graphs; i++) {
        compared += compare_graph(f);
        skip_to_graph(f);
    }
    CHECK(compared == graphs);
}

/* ---- optimizers.py's cases: the options of Keras 3's base optimizer on
   a Dense(3) with bias (mean squared error, a batch of 4 a step), each
   step mixprec's custom loop from the same weights and batches: the
   weights after every step against Keras's, as a fraction of the largest.
   float32: each side rounds every operation once in its own order (the
   decay and clip as Keras writes them or as one factor: a few ulps), so
   1e-5; mixed_float16 (its Inf step skipped on both sides) as the graph
   cases. A case with a schedule (CosineDecay with a warmup) also has
   Keras's rate at steps 0 to 19: mp_lr_schedule_value's to 1e-6. */
static int compare_optimizer(FILE *f) {
    static const char *const biases[] = {"bias", NULL};
    char name[64], policy[32], kind[16];
    float lr, wd, cn, cv, gcn, w[12], x[8], t[12], want[12], got[12], init, target, alpha, rates[20];
    int acc, steps, step, ok, applied, mixed, warmup, decay;
    double worst = 0.0, tol;
    mp_model_desc md;
    mp_compile_desc cd;
    mp_layer_desc out = mp_activation_layer(MP_LINEAR);
    mp_model *m = NULL;
    if (fscanf(f, "%63s %31s %15s %f %f %f %f %f %d %d %f %f %d %d %f", name, policy, kind, &lr, &wd, &cn, &cv, &gcn,
               &acc, &steps, &init, &target, &warmup, &decay, &alpha) != 15 ||
        (decay && !read_floats(f, rates, 20)) || !read_floats(f, w, 9))
        return 0;
    mixed = strcmp(policy, "float32") != 0;
    tol = mixed ? graph_tolerance(policy) : 1e-5;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 2;
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_MEAN_SQUARED_ERROR;
    cd.optimizer.kind = !strcmp(kind, "adamw") ? MP_ADAMW : !strcmp(kind, "adam") ? MP_ADAM : MP_SGD;
    cd.optimizer.learning_rate = lr;
    cd.optimizer.weight_decay = wd;
    cd.optimizer.exclude_from_weight_decay = biases;
    cd.optimizer.clipnorm = cn;
    cd.optimizer.clipvalue = cv;
    cd.optimizer.global_clipnorm = gcn;
    cd.optimizer.gradient_accumulation_steps = acc;
    if (decay) {
        mp_lr_schedule *sc = &cd.optimizer.schedule;
        double off = 0.0;
        sc->kind = MP_COSINE_DECAY, sc->initial_learning_rate = init, sc->warmup_target = target;
        sc->warmup_steps = (uint64_t)warmup, sc->decay_steps = (uint64_t)decay, sc->alpha = alpha;
        for (step = 0; step < 20; step++)
            off = fmax(off, fabs(mp_lr_schedule_value(sc, (uint64_t)step) - rates[step]) / target);
        if (!check_report(off <= 1e-6, __FILE__, __LINE__, "CosineDecay with a warmup: Keras 3's rates"))
            fprintf(stderr, "    %s: off by %.3g of the target\n", name, off);
    }
    out.dtype = "float32";
    ok = mp_set_global_policy_name(policy) == MP_OK && mp_model_create(&m, &md) == MP_OK &&
         mp_model_add(m, mp_dense(3, MP_LINEAR)) == MP_OK && (!mixed || mp_model_add(m, out) == MP_OK) &&
         mp_model_compile(m, &cd) == MP_OK && mp_model_set_weights(m, w, 9) == MP_OK;
    mp_set_global_policy_name("float32");
    for (step = 0; step < steps && ok; step++) {
        mp_data d;
        float loss;
        ok = read_floats(f, x, 8) && read_floats(f, t, 12) && read_floats(f, want, 9);
        memset(&d, 0, sizeof d);
        d.x[0] = mp_rows(x, 4, 2);
        d.y = mp_rows(t, 4, 3);
        ok = ok && mp_forward(m, &d, 1) == MP_OK && mp_compute_loss(m, &d.y, &loss, NULL) == MP_OK &&
             mp_compute_scaled_gradients(m) == MP_OK && mp_get_unscaled_gradients(m) == MP_OK &&
             mp_apply_gradients(m, &applied) == MP_OK && mp_model_get_weights(m, got, 9) == MP_OK;
        if (ok) worst = fmax(worst, off_by(got, want, 9, largest(want, 9)));
    }
    if (!CHECK(ok)) fprintf(stderr, "    %s: %s\n", name, m ? mp_model_error(m) : "no model");
    else {
        char what[200];
        snprintf(what, sizeof what, "%s (%s, %d steps): weights within %.2g of Keras 3's (tolerance %.2g)", name, policy,
                 steps, worst, tol);
        check_report(worst <= tol, __FILE__, __LINE__, what);
        printf("%s\n", what);
    }
    mp_model_destroy(m);
    return ok;
}

static void test_optimizers(FILE *f) {
    int cases = 0, i, compared = 0;
    CHECK(fscanf(f, " optimizers %d", &cases) == 1 && cases > 0);
    for (i = 0; i < cases; i++) compared += compare_optimizer(f);
    CHECK(compared == cases);
}

int main(int argc, char **argv) {
    FILE *f, *amp = NULL, *layers = NULL, *opt = NULL;
    check_args(argc, argv);
    if (argc < 2 || argc > 5 || !(f = fopen(argv[1], "r")) || (argc >= 3 && !(amp = fopen(argv[2], "r"))) ||
        (argc >= 4 && !(layers = fopen(argv[3], "r"))) || (argc == 5 && !(opt = fopen(argv[4], "r")))) {
        fprintf(stderr, "usage: peer FILE [AMP_FILE [LAYERS_FILE [OPTIMIZERS_FILE]]] (paths with a /, from "
                        "tests/keras_peer/loss_from_logits.py, amp_paint.py, layers.py, optimizers.py)\n");
        return 2;
    }
    RUN(test_losses(f));
    fclose(f);
    if (amp) {
        RUN(test_amp(amp));
        fclose(amp);
    }
    if (layers) {
        RUN(test_graphs(layers));
        fclose(layers);
    }
    if (opt) {
        RUN(test_optimizers(opt));
        fclose(opt);
    }
    return check_done("keras_peer");
}
