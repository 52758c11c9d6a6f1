/* test_amp.c - tests of automatic mixed precision (TensorFlow's graph
   rewrite on a float32 model): the colouring of the guide's MLP and of a
   conv net op by op, with TensorFlow's summary line and its numbers; deny
   spreading downstream; the TENSOR_CORES_ONLY and UNSAFE_FORCE_ALL levels;
   list edits from code and from the environment; the errors (an op on two
   lists, an unknown op, a model that is not float32); bfloat16 mode without
   loss scaling, float16 with it; the layers' compute and output dtypes and
   what they store; gradients against float32; recompiling a built model;
   and a short training run against the hand-written mixed_float16 policy.
   Runs in a second or two, also under ASan/UBSan. */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */
#ifndef TEST_LINKS_MIXPREC /* defined: the implementation is another object's (tests/header_only.c) */
#define MIXPREC_IMPLEMENTATION
#endif
#include "../mixprec.h"
#include "check.h"
#include "helpers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__unix__) || defined(__APPLE__)
#define HAVE_SETENV 1 /* POSIX */
#endif

/* ======================================================================== */
/* Helpers */



/* Two strings equal, both printed when not. */
static void streq_report(const char *got, const char *want, const char *file, int line) {
    if (!check_report(strcmp(got, want) == 0, file, line, "strings equal"))
        fprintf(stderr, "    got  '%s'\n    want '%s'\n", got, want);
}
#define CHECK_STR(got, want) streq_report((got), (want), __FILE__, __LINE__)

/* s contains each of the (NULL-terminated) words. */
static void contains_report(const char *s, const char *const *words, const char *file, int line) {
    int i, ok = 1;
    for (i = 0; words[i]; i++) ok &= strstr(s, words[i]) != NULL;
    if (!check_report(ok, file, line, "the message names what is wrong")) fprintf(stderr, "    '%s'\n", s);
}
#define CHECK_HAS(s, ...)                                      \
    do {                                                       \
        static const char *const words_[] = {__VA_ARGS__, NULL}; \
        contains_report((s), words_, __FILE__, __LINE__);      \
    } while (0)

static void unset_amp_environment(void) {
#ifdef HAVE_SETENV
    static const char *const names[] = {
        "MIXPREC_AUTO_MIXED_PRECISION", "MIXPREC_AMP_LEVEL", "MIXPREC_AMP_DTYPE",
        "MIXPREC_AMP_ALLOWLIST_ADD", "MIXPREC_AMP_ALLOWLIST_REMOVE", "MIXPREC_AMP_DENYLIST_ADD",
        "MIXPREC_AMP_DENYLIST_REMOVE", "MIXPREC_AMP_INFERLIST_ADD", "MIXPREC_AMP_INFERLIST_REMOVE",
        "MIXPREC_AMP_CLEARLIST_ADD", "MIXPREC_AMP_CLEARLIST_REMOVE"};
    size_t i;
    for (i = 0; i < sizeof names / sizeof names[0]; i++) unsetenv(names[i]);
#endif
}

static mp_compile_desc amp_desc(mp_loss loss, int from_logits) {
    mp_compile_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.loss = loss;
    cd.from_logits = from_logits;
    cd.metrics = MP_METRIC_ACCURACY;
    cd.amp.enabled = 1;
    return cd;
}

/* The guide's MLP, small: 784-Dense(64, relu)-Dense(64, relu)-Dense(10)-Activation(softmax). */
static mp_model *guide_mlp(const char *policy, int float32_softmax) {
    static const int shape[] = {784, 0};
    mp_layer_desc layers[4];
    layers[0] = mp_dense(64, MP_RELU);
    layers[1] = mp_dense(64, MP_RELU);
    layers[2] = mp_dense(10, MP_LINEAR);
    layers[3] = mp_activation_layer(MP_SOFTMAX);
    if (float32_softmax) layers[3].dtype = "float32";
    return new_model(policy, shape, layers, 4);
}

static mp_status compile_amp(mp_model *m, const mp_compile_desc *cd) { return mp_model_compile(m, cd); }

static const char *report(const mp_model *m) {
    static char buf[256];
    if (mp_model_amp_report(m, buf, sizeof buf) != MP_OK) return "(no report)";
    return buf;
}

/* One expected row of the colouring table. */
typedef struct row { const char *op, *layer, *list, *dtype; } row;

/* The table holds exactly the rows, in order, after its header. */
static void check_table(const mp_model *m, const row *rows, int n, int line) {
    static char buf[8192];
    char op[64], layer[64], list[16], dtype[16];
    const char *p = buf;
    int i, bad = -1;
    if (!OK(mp_model_amp_table(m, buf, sizeof buf), m)) return;
    CHECK(strncmp(buf, " Op ", 4) == 0);
    for (i = 0; i <= n && bad < 0; i++) { /* line 0 is the header */
        p = strchr(p, '\n');
        if (!p || (i < n && sscanf(p + 1, "%63s %63s %15s %15s", op, layer, list, dtype) != 4)) { bad = i; break; }
        p++;
        if (i < n && (strcmp(op, rows[i].op) || strcmp(layer, rows[i].layer) || strcmp(list, rows[i].list) ||
                      strcmp(dtype, rows[i].dtype)))
            bad = i;
    }
    if (bad < 0 && p && *p) bad = n; /* more rows than expected */
    if (!check_report(bad < 0, __FILE__, line, "the colouring table op by op"))
        fprintf(stderr, "    from row %d: %s\n%s", bad, bad < n ? rows[bad].op : "(extra rows)", buf);
}

/* Each layer's (compute, output) dtypes; dts holds 2 per layer. */
static void check_dtypes(const mp_model *m, const mp_dtype *dts, int line) {
    int i, bad = -1;
    for (i = 0; i < mp_model_layer_count(m) && bad < 0; i++) {
        mp_layer_info li;
        if (mp_model_layer_info(m, i, &li) != MP_OK || li.compute_dtype != dts[2 * i] ||
            li.output_dtype != dts[2 * i + 1])
            bad = i;
    }
    if (!check_report(bad < 0, __FILE__, line, "each layer's compute and output dtype"))
        fprintf(stderr, "    layer %d\n", bad);
}

/* Compiles m under cd and checks the summary line (its counts: "9/12
   nodes to float16 precision using 1"), the table's n rows (none: NULL) and
   the layers' dtypes. */
static void check_painting(mp_model *m, const mp_compile_desc *cd, const char *counts, const row *rows, int n,
                           const mp_dtype *dts, int line) {
    const char *type = mp_dtype_name(cd->amp.dtype == MP_BFLOAT16 ? MP_BFLOAT16 : MP_FLOAT16);
    char want[256];
    if (!OK(compile_amp(m, cd), m)) return;
    snprintf(want, sizeof want, "Converted %s cast(s) to %s (excluding Const and Variable casts)", counts, type);
    if (!check_report(strcmp(report(m), want) == 0, __FILE__, line, "TensorFlow's summary line"))
        fprintf(stderr, "    got  '%s'\n    want '%s'\n", report(m), want);
    if (rows) check_table(m, rows, n, line);
    check_dtypes(m, dts, line);
}

#define F32 MP_FLOAT32
#define F16 MP_FLOAT16
#define BF16 MP_BFLOAT16

/* ======================================================================== */
/* Colouring */

/* The guide's MLP, as TensorFlow 2.21 paints its forward ops on the CPU:
   every op up to the last MatMul in float16 (BiasAdd and Relu lie between
   MatMuls), the last BiasAdd and the Softmax too (pass 4: each follows an
   allow op), the loss in float32; one cast (the input batch). The
   crossentropy reads the softmax's logits (as Keras does), so the loss is
   the fused deny op. Loss scaling is dynamic, as mixed_float16. */
static void test_guide_mlp(void) {
    static const row rows[] = {
        {"MatMul", "dense", "allow", "float16"},   {"BiasAdd", "dense", "infer", "float16"},
        {"Relu", "dense", "clear", "float16"},     {"MatMul", "dense_1", "allow", "float16"},
        {"BiasAdd", "dense_1", "infer", "float16"}, {"Relu", "dense_1", "clear", "float16"},
        {"MatMul", "dense_2", "allow", "float16"}, {"BiasAdd", "dense_2", "infer", "float16"},
        {"Softmax", "activation", "infer", "float16"},
        {"SparseSoftmaxCrossEntropyWithLogits", "(loss)", "deny", "float32"},
        {"Mean", "(loss)", "deny", "float32"}};
    static const row probs[] = {{"Log", "(loss)", "infer", "float16"}, {"Sum", "(loss)", "deny", "float32"},
                                {"Mean", "(loss)", "deny", "float32"}};
    static const mp_dtype dts[] = {F16, F16, F16, F16, F16, F16, F16, F16};
    static const int shape[] = {784, 0};
    mp_layer_desc layers[3];
    mp_compile_desc cd = amp_desc(MP_SPARSE_CATEGORICAL_CROSSENTROPY, 0);
    mp_model *m = guide_mlp("float32", 0);
    const mp_loss_scale *ls;
    char summary[2048];
    row all[11];
    if (!m) return;
    cd.amp.verbose = 1;
    if (OK(compile_amp(m, &cd), m)) {
        CHECK_STR(report(m), "Converted 9/11 nodes to float16 precision using 1 cast(s) to float16 "
                             "(excluding Const and Variable casts)");
        check_table(m, rows, 11, __LINE__);
        check_dtypes(m, dts, __LINE__);
        ls = mp_model_loss_scale(m);
        CHECK(ls && ls->scale == 32768.0f && !ls->config.fixed && ls->config.growth_interval == 2000);
        if (OK(mp_model_summary(m, summary, sizeof summary), m)) {
            CHECK(strstr(summary, "activation (Activation)") && strstr(summary, "amp_float16\n"));
            CHECK(strstr(summary, "amp_float32") == NULL && strstr(summary, "->") == NULL);
        }
    }
    mp_model_destroy(m);

    /* from logits said by the code: the same ops */
    m = guide_mlp("float32", 0);
    cd = amp_desc(MP_SPARSE_CATEGORICAL_CROSSENTROPY, 1);
    cd.loss_scale = MP_LOSS_SCALE_NONE; /* loss_scale still decides */
    if (m && OK(compile_amp(m, &cd), m)) {
        CHECK_STR(report(m), "Converted 9/11 nodes to float16 precision using 1 cast(s) to float16 "
                             "(excluding Const and Variable casts)");
        check_table(m, rows, 11, __LINE__);
        CHECK(mp_model_loss_scale(m) == NULL);
    }
    mp_model_destroy(m);

    /* without the softmax the loss reads the output as probabilities: Log
       (it follows the last BiasAdd, allow by then, so it converts), Sum */
    layers[0] = mp_dense(64, MP_RELU);
    layers[1] = mp_dense(64, MP_RELU);
    layers[2] = mp_dense(10, MP_LINEAR);
    m = new_model("float32", shape, layers, 3);
    cd = amp_desc(MP_SPARSE_CATEGORICAL_CROSSENTROPY, 0);
    if (m && OK(compile_amp(m, &cd), m)) {
        memcpy(all, rows, 8 * sizeof(row));
        memcpy(all + 8, probs, sizeof probs);
        CHECK_STR(report(m), "Converted 9/11 nodes to float16 precision using 1 cast(s) to float16 "
                             "(excluding Const and Variable casts)");
        check_table(m, all, 11, __LINE__);
    }
    mp_model_destroy(m);
}

/* Binary crossentropy's ops, as tf_keras writes them (from the logits:
   Exp, Log1p, Mean; from probabilities: Log, Mean; then the Mean over the
   batch): Exp is on the deny
   list and stays float32, and so does the Log1p after it (deny spreads
   through infer ops); Log, infer, follows an allow op and converts. */
static void test_binary_loss_ops(void) {
    static const int shape[] = {6, 0};
    static const row logits[] = {
        {"MatMul", "dense", "allow", "float16"}, {"BiasAdd", "dense", "infer", "float16"},
        {"Sigmoid", "dense", "infer", "float16"}, {"Exp", "(loss)", "deny", "float32"},
        {"Log1p", "(loss)", "infer", "float32"}, {"Mean", "(loss)", "deny", "float32"},
        {"Mean", "(loss)", "deny", "float32"}};
    static const row probs[] = {
        {"MatMul", "dense", "allow", "float16"}, {"BiasAdd", "dense", "infer", "float16"},
        {"Log", "(loss)", "infer", "float16"}, {"Mean", "(loss)", "deny", "float32"},
        {"Mean", "(loss)", "deny", "float32"}};
    mp_layer_desc d = mp_dense(3, MP_SIGMOID);
    mp_compile_desc cd = amp_desc(MP_BINARY_CROSSENTROPY, 0);
    mp_model *m = new_model("float32", shape, &d, 1);
    if (m && OK(compile_amp(m, &cd), m)) check_table(m, logits, 7, __LINE__);
    mp_model_destroy(m);
    d = mp_dense(3, MP_LINEAR);
    m = new_model("float32", shape, &d, 1);
    if (m && OK(compile_amp(m, &cd), m)) check_table(m, probs, 5, __LINE__);
    mp_model_destroy(m);
}

/* A conv net: Conv2D, its BiasAdd and Relu, MaxPool and Reshape all lie
   between Conv2D and MatMul; the Dense's BiasAdd and Softmax follow it. */
static void test_conv_net(void) {
    static const int shape[] = {8, 8, 2, 0};
    static const row rows[] = {
        {"Conv2D", "conv2d", "allow", "float16"},   {"BiasAdd", "conv2d", "infer", "float16"},
        {"Relu", "conv2d", "clear", "float16"},     {"MaxPool", "max_pooling2d", "clear", "float16"},
        {"Reshape", "flatten", "clear", "float16"}, {"MatMul", "dense", "allow", "float16"},
        {"BiasAdd", "dense", "infer", "float16"},   {"Softmax", "dense", "infer", "float16"},
        {"SoftmaxCrossEntropyWithLogits", "(loss)", "deny", "float32"}, {"Mean", "(loss)", "deny", "float32"}};
    static const mp_dtype dts[] = {F16, F16, F16, F16, F16, F16, F16, F16};
    mp_layer_desc layers[4];
    mp_compile_desc cd = amp_desc(MP_CATEGORICAL_CROSSENTROPY, 1);
    mp_model *m;
    layers[0] = mp_conv2d(4, 3, 3, MP_SAME, MP_RELU);
    layers[1] = mp_max_pooling2d(2, 2);
    layers[2] = mp_flatten();
    layers[3] = mp_dense(5, MP_SOFTMAX);
    if (!(m = new_model("float32", shape, layers, 4))) return;
    if (OK(compile_amp(m, &cd), m)) {
        CHECK_STR(report(m), "Converted 8/10 nodes to float16 precision using 1 cast(s) to float16 "
                             "(excluding Const and Variable casts)");
        check_table(m, rows, 10, __LINE__);
        check_dtypes(m, dts, __LINE__);
    }
    mp_model_destroy(m);
}

/* Softmax moved to the deny list: it stays float32 and so does the Tanh
   after it (deny spreads through infer ops), though both lie between
   MatMuls; the BiasAdd before it no longer leads to a MatMul, but it follows
   one (pass 4), as the last BiasAdd does. Under bfloat16 the loss's
   SquaredDifference and Means are infer ops and follow it too. */
static void test_deny_spreads(void) {
    static const int shape[] = {6, 0};
    static const row plain[] = {
        {"MatMul", "dense", "allow", "float16"},      {"BiasAdd", "dense", "infer", "float16"},
        {"Softmax", "activation", "infer", "float16"}, {"Tanh", "activation_1", "infer", "float16"},
        {"MatMul", "dense_1", "allow", "float16"},    {"BiasAdd", "dense_1", "infer", "float16"},
        {"SquaredDifference", "(loss)", "-", "float32"}, {"Mean", "(loss)", "deny", "float32"},
        {"Mean", "(loss)", "deny", "float32"}};
    static const row denied[] = {
        {"MatMul", "dense", "allow", "float16"},     {"BiasAdd", "dense", "infer", "float16"},
        {"Softmax", "activation", "deny", "float32"}, {"Tanh", "activation_1", "infer", "float32"},
        {"MatMul", "dense_1", "allow", "float16"},   {"BiasAdd", "dense_1", "infer", "float16"},
        {"SquaredDifference", "(loss)", "-", "float32"}, {"Mean", "(loss)", "deny", "float32"},
        {"Mean", "(loss)", "deny", "float32"}};
    static const row bf16_tail[] = {{"SquaredDifference", "(loss)", "infer", "bfloat16"},
                                    {"Mean", "(loss)", "infer", "bfloat16"}, {"Mean", "(loss)", "infer", "bfloat16"}};
    static const mp_dtype dts_plain[] = {F16, F16, F16, F16, F16, F16, F16, F16};
    static const mp_dtype dts_denied[] = {F16, F16, F32, F32, F32, F32, F16, F16};
    row bf16[9];
    mp_layer_desc layers[4];
    mp_compile_desc cd = amp_desc(MP_MEAN_SQUARED_ERROR, 0);
    mp_model *m;
    layers[0] = mp_dense(16, MP_LINEAR);
    layers[1] = mp_activation_layer(MP_SOFTMAX);
    layers[2] = mp_activation_layer(MP_TANH);
    layers[3] = mp_dense(3, MP_LINEAR);
    if (!(m = new_model("float32", shape, layers, 4))) return;
    cd.metrics = MP_METRIC_NONE;
    if (OK(compile_amp(m, &cd), m)) {
        CHECK_STR(report(m), "Converted 6/9 nodes to float16 precision using 1 cast(s) to float16 "
                             "(excluding Const and Variable casts)");
        check_table(m, plain, 9, __LINE__);
        check_dtypes(m, dts_plain, __LINE__);
    }
    cd.amp.deny_add = "Softmax";
    cd.amp.infer_remove = "Softmax";
    if (OK(compile_amp(m, &cd), m)) { /* recompiled: the same model, retyped */
        CHECK_STR(report(m), "Converted 4/9 nodes to float16 precision using 2 cast(s) to float16 "
                             "(excluding Const and Variable casts)");
        check_table(m, denied, 9, __LINE__);
        check_dtypes(m, dts_denied, __LINE__);
    }
    cd.amp.dtype = MP_BFLOAT16;
    if (OK(compile_amp(m, &cd), m)) {
        size_t i;
        memcpy(bf16, denied, 6 * sizeof(row));
        memcpy(bf16 + 6, bf16_tail, sizeof bf16_tail);
        for (i = 0; i < 6; i++)
            if (strcmp(bf16[i].dtype, "float16") == 0) bf16[i].dtype = "bfloat16";
        CHECK_STR(report(m), "Converted 7/9 nodes to bfloat16 precision using 2 cast(s) to bfloat16 "
                             "(excluding Const and Variable casts)");
        check_table(m, bf16, 9, __LINE__);
    }
    mp_model_destroy(m);
}

/* ======================================================================== */
/* Graphs: TensorFlow's passes follow every edge (fan-out and fan-in), and
   a cast goes in once per float32 output that allow ops read (TensorFlow's
   InsertCastNodeAtFanout shares one Cast among an output's readers). */

/* A residual block, input -> Dense -> BatchNormalization -> relu -> Dense,
   added to the input, then a Dense; mean squared error. Its ops:
     0 MatMul  dense (reads the input)    6 AddV2   add (reads 5 and the input)
     1 BiasAdd dense                      7 MatMul  dense_2
     2 FusedBatchNormV3 batch_normalization   8 BiasAdd dense_2
     3 Relu    activation                 9 SquaredDifference, 10 Mean, 11 Mean (loss)
     4 MatMul  dense_1, 5 BiasAdd dense_1
   Pass 2: no deny op but the loss's Means. Pass 3: 1-6 are infer or clear
   and downstream of MatMul 0 (AddV2 through its input 5), and upstream of
   MatMul 4 or 7, so 0-7 are allow; pass 4: BiasAdd 8 follows MatMul 7.
   9/12 converted; one cast: the input batch, read by MatMul 0 and AddV2 6
   (one output, one Cast). Then FusedBatchNormV3 moved to the deny list:
   it stays float32 and Relu 3 after it is not downstream of an allow op
   through infer/clear ops, so pass 3 paints only 4-7; pass 4 paints BiasAdd
   1 (it reads MatMul 0 and no deny op) and 8; pass 5 paints Relu 3, a clear
   op read by the allow MatMul 4 (the search walks the edge backward).
   8/12, two casts: the input batch and FusedBatchNormV3's output. */
static void test_residual_graph(void) {
    static const int shape[] = {16, 0};
    static const int wiring[6][MP_MAX_LAYER_INPUTS + 1] = {{1, 0}, {1, 1}, {1, 2}, {1, 3}, {2, 4, 0}, {1, 5}};
    static const row rows[] = {
        {"MatMul", "dense", "allow", "float16"},       {"BiasAdd", "dense", "infer", "float16"},
        {"FusedBatchNormV3", "batch_normalization", "infer", "float16"},
        {"Relu", "activation", "clear", "float16"},    {"MatMul", "dense_1", "allow", "float16"},
        {"BiasAdd", "dense_1", "infer", "float16"},    {"AddV2", "add", "infer", "float16"},
        {"MatMul", "dense_2", "allow", "float16"},     {"BiasAdd", "dense_2", "infer", "float16"},
        {"SquaredDifference", "(loss)", "-", "float32"}, {"Mean", "(loss)", "deny", "float32"},
        {"Mean", "(loss)", "deny", "float32"}};
    static const mp_dtype dts[] = {F16, F16, F16, F16, F16, F16, F16, F16, F16, F16, F16, F16};
    static const mp_dtype dts_denied[] = {F16, F16, F32, F32, F16, F16, F16, F16, F16, F16, F16, F16};
    row denied[12];
    mp_layer_desc layers[6];
    mp_compile_desc cd = amp_desc(MP_MEAN_SQUARED_ERROR, 0);
    mp_model *m;
    layers[0] = mp_dense(16, MP_LINEAR);
    layers[1] = mp_batch_normalization();
    layers[2] = mp_activation_layer(MP_RELU);
    layers[3] = mp_dense(16, MP_LINEAR);
    layers[4] = mp_add();
    layers[5] = mp_dense(4, MP_LINEAR);
    cd.metrics = MP_METRIC_NONE;
    if (!(m = new_graph_model("float32", shape, layers, wiring, 6))) return;
    check_painting(m, &cd, "9/12 nodes to float16 precision using 1", rows, 12, dts, __LINE__);
    memcpy(denied, rows, sizeof rows);
    denied[2].list = "deny";
    denied[2].dtype = "float32";
    cd.amp.deny_add = "FusedBatchNormV3";
    cd.amp.infer_remove = "FusedBatchNormV3";
    check_painting(m, &cd, "8/12 nodes to float16 precision using 2", denied, 12, dts_denied, __LINE__);
    mp_model_destroy(m);
}

/* Three branches from the input, concatenated, then a Dense:
     0 MatMul dense, 1 BiasAdd, 2 Relu      (reads the input)
     3 Tanh    activation                   (reads the input)
     4 Reshape reshape                      (reads the input)
     5 ConcatV2 concatenate (reads 2, 3, 4), 6 MatMul dense_1, 7 BiasAdd
     8 SquaredDifference, 9 Mean, 10 Mean (loss)
   Pass 3: ConcatV2 is downstream of MatMul 0 (through its input 2) and
   upstream of MatMul 6, so 0-2, 5 and 6 are allow; Tanh and Reshape read
   only the input: not downstream of an allow op. Pass 4: BiasAdd 7; Tanh
   reads no allow op and stays float32. Pass 5: Reshape is a clear op read
   by the allow ConcatV2: allow. 7/11; two casts: the input batch (read by
   MatMul 0 and Reshape 4: one Cast) and Tanh's output. */
static void test_concat_graph(void) {
    static const int shape[] = {8, 0}, flat[] = {8, 0};
    static const int wiring[5][MP_MAX_LAYER_INPUTS + 1] = {{1, 0}, {1, 0}, {1, 0}, {3, 1, 2, 3}, {1, 4}};
    static const row rows[] = {
        {"MatMul", "dense", "allow", "float16"},      {"BiasAdd", "dense", "infer", "float16"},
        {"Relu", "dense", "clear", "float16"},        {"Tanh", "activation", "infer", "float32"},
        {"Reshape", "reshape", "clear", "float16"},   {"ConcatV2", "concatenate", "clear", "float16"},
        {"MatMul", "dense_1", "allow", "float16"},    {"BiasAdd", "dense_1", "infer", "float16"},
        {"SquaredDifference", "(loss)", "-", "float32"}, {"Mean", "(loss)", "deny", "float32"},
        {"Mean", "(loss)", "deny", "float32"}};
    static const mp_dtype dts[] = {F16, F16, F32, F32, F16, F16, F16, F16, F16, F16};
    mp_layer_desc layers[5];
    mp_compile_desc cd = amp_desc(MP_MEAN_SQUARED_ERROR, 0);
    mp_model *m;
    layers[0] = mp_dense(8, MP_RELU);
    layers[1] = mp_activation_layer(MP_TANH);
    layers[2] = mp_reshape(flat);
    layers[3] = mp_concatenate(0);
    layers[4] = mp_dense(3, MP_LINEAR);
    cd.metrics = MP_METRIC_NONE;
    if (!(m = new_graph_model("float32", shape, layers, wiring, 5))) return;
    check_painting(m, &cd, "7/11 nodes to float16 precision using 2", rows, 11, dts, __LINE__);
    mp_model_destroy(m);
}

/* LayerNormalization is its moments and the normalisation:
     0 MatMul, 1 BiasAdd (dense)
     2 Mean, 3 SquaredDifference (reads 2 and 1), 4 Mean, 5 Rsqrt,
     6 Mul (reads 5 and 1), 7 AddV2 (layer_normalization)
     8 MatMul, 9 BiasAdd (dense_1); 10 SquaredDifference, 11 Mean, 12 Mean
   float16: the Means are deny, SquaredDifference and Rsqrt on no list, so
   deny stops at them; Mul reads BiasAdd 1 (downstream of MatMul 0) and
   leads to MatMul 8: 0, 1, 6, 7, 8 allow, then BiasAdd 9 (pass 4). 6/13;
   two casts: the input batch and Rsqrt's output (read by Mul). The layer
   reads its input in float32 (its first op, Mean) and writes float16 (its
   last, AddV2). bfloat16: every op is allow or infer, none deny: 13/13,
   one cast. */
static void test_layer_norm_ops(void) {
    static const int shape[] = {8, 0};
    static const row rows[] = {
        {"MatMul", "dense", "allow", "float16"},    {"BiasAdd", "dense", "infer", "float16"},
        {"Mean", "layer_normalization", "deny", "float32"},
        {"SquaredDifference", "layer_normalization", "-", "float32"},
        {"Mean", "layer_normalization", "deny", "float32"},
        {"Rsqrt", "layer_normalization", "-", "float32"},
        {"Mul", "layer_normalization", "infer", "float16"},
        {"AddV2", "layer_normalization", "infer", "float16"},
        {"MatMul", "dense_1", "allow", "float16"},  {"BiasAdd", "dense_1", "infer", "float16"},
        {"SquaredDifference", "(loss)", "-", "float32"}, {"Mean", "(loss)", "deny", "float32"},
        {"Mean", "(loss)", "deny", "float32"}};
    static const mp_dtype dts[] = {F16, F16, F32, F16, F16, F16};
    static const mp_dtype dts_bf16[] = {BF16, BF16, BF16, BF16, BF16, BF16};
    mp_layer_desc layers[3];
    mp_compile_desc cd = amp_desc(MP_MEAN_SQUARED_ERROR, 0);
    mp_model *m;
    layers[0] = mp_dense(8, MP_LINEAR);
    layers[1] = mp_layer_normalization();
    layers[2] = mp_dense(3, MP_LINEAR);
    cd.metrics = MP_METRIC_NONE;
    if (!(m = new_model("float32", shape, layers, 3))) return;
    check_painting(m, &cd, "6/13 nodes to float16 precision using 2", rows, 13, dts, __LINE__);
    cd.amp.dtype = MP_BFLOAT16;
    check_painting(m, &cd, "13/13 nodes to bfloat16 precision using 1", NULL, 0, dts_bf16, __LINE__);
    mp_model_destroy(m);
}

/* TENSOR_CORES_ONLY: the MatMuls alone, each behind a cast, and the other
   lists empty; UNSAFE_FORCE_ALL: every op, the loss's deny ops included. */
static void test_levels(void) {
    static const mp_dtype only[] = {F16, F32, F16, F32, F16, F32, F32, F32};
    static const mp_dtype all[] = {F16, F16, F16, F16, F16, F16, F16, F16};
    static const row rows[] = {
        {"MatMul", "dense", "allow", "float16"},   {"BiasAdd", "dense", "-", "float32"},
        {"Relu", "dense", "-", "float32"},         {"MatMul", "dense_1", "allow", "float16"},
        {"BiasAdd", "dense_1", "-", "float32"},    {"Relu", "dense_1", "-", "float32"},
        {"MatMul", "dense_2", "allow", "float16"}, {"BiasAdd", "dense_2", "-", "float32"},
        {"Softmax", "activation", "-", "float32"},
        {"SparseSoftmaxCrossEntropyWithLogits", "(loss)", "-", "float32"}, {"Mean", "(loss)", "-", "float32"}};
    mp_compile_desc cd = amp_desc(MP_SPARSE_CATEGORICAL_CROSSENTROPY, 0);
    mp_model *m = guide_mlp("float32", 0);
    mp_tensor out;
    float x[784];
    size_t i;
    if (!m) return;
    for (i = 0; i < 784; i++) x[i] = uniform(0.0f, 1.0f);
    cd.amp.level = MP_AMP_TENSOR_CORES_ONLY;
    cd.amp.deny_add = "MatMul"; /* emptied with the deny list: no conflict */
    if (OK(compile_amp(m, &cd), m)) {
        CHECK_STR(report(m), "Converted 3/11 nodes to float16 precision using 3 cast(s) to float16 "
                             "(excluding Const and Variable casts)");
        check_dtypes(m, only, __LINE__);
        check_table(m, rows, 11, __LINE__);
    }
    cd.amp.level = MP_AMP_UNSAFE_FORCE_ALL;
    cd.amp.deny_add = NULL;
    if (OK(compile_amp(m, &cd), m)) {
        CHECK_STR(report(m), "Converted 11/11 nodes to float16 precision using 1 cast(s) to float16 "
                             "(excluding Const and Variable casts)");
        check_dtypes(m, all, __LINE__);
        if (OK(forward_rows(m, x, 1, 0), m) && OK(mp_output(m, &out), m)) CHECK(out.dtype == MP_FLOAT16);
    }
    mp_model_destroy(m);
}

/* ======================================================================== */
/* Lists, settings and errors */

/* BiasAdd moved from infer to clear (spaces and empty names are fine): the
   last Dense's BiasAdd touches the MatMul, so it converts too, but only in
   pass 5, after the Softmax was left float32 in pass 4. */
static void test_code_edits(void) {
    static const mp_dtype dts[] = {F16, F16, F16, F16, F16, F16, F32, F32};
    mp_compile_desc cd = amp_desc(MP_SPARSE_CATEGORICAL_CROSSENTROPY, 0);
    mp_model *m = guide_mlp("float32", 0);
    if (!m) return;
    cd.amp.clear_add = " BiasAdd ,, Identity";
    cd.amp.infer_remove = "BiasAdd";
    if (OK(compile_amp(m, &cd), m)) {
        CHECK_STR(report(m), "Converted 8/11 nodes to float16 precision using 1 cast(s) to float16 "
                             "(excluding Const and Variable casts)");
        check_dtypes(m, dts, __LINE__);
    }
    mp_model_destroy(m);
}

/* An op on two lists names the op and both lists; an unknown op is named;
   a failed compile leaves the model as it was. */
static void test_list_errors(void) {
    mp_compile_desc cd = amp_desc(MP_SPARSE_CATEGORICAL_CROSSENTROPY, 0);
    mp_model *m = guide_mlp("float32", 0);
    char buf[64];
    if (!m) return;
    CHECK(mp_model_amp_report(m, buf, sizeof buf) == MP_ERR_STATE); /* not compiled */
    cd.amp.deny_add = "Tanh,MatMul";
    CHECK(compile_amp(m, &cd) == MP_ERR_ARG);
    CHECK_HAS(mp_model_error(m), "MatMul", "allow", "deny");
    CHECK(mp_model_amp_report(m, buf, sizeof buf) == MP_ERR_STATE);
    cd.amp.deny_add = NULL;
    cd.amp.infer_add = "Matmul";
    CHECK(compile_amp(m, &cd) == MP_ERR_UNKNOWN_NAME);
    CHECK_HAS(mp_model_error(m), "'Matmul'", "amp.infer_add");
    cd.amp.infer_add = NULL;
    cd.amp.dtype = MP_DTYPE_COUNT;
    CHECK(compile_amp(m, &cd) == MP_ERR_ARG);
    cd.amp.dtype = MP_FLOAT16;
    cd.amp.level = (mp_amp_level)7;
    CHECK(compile_amp(m, &cd) == MP_ERR_ARG);
    cd.amp.level = MP_AMP_DEFAULT;
    if (OK(compile_amp(m, &cd), m)) {
        CHECK(mp_model_amp_report(m, buf, 10) == MP_ERR_SIZE && strlen(buf) == 9); /* cut, terminated */
        CHECK(mp_model_amp_report(NULL, buf, sizeof buf) == MP_ERR_NULL);
        CHECK(mp_model_amp_report(m, buf, 0) == MP_ERR_SIZE);
        cd.amp.clear_add = "MatMul"; /* fails: the last compile's colouring stays */
        CHECK(compile_amp(m, &cd) == MP_ERR_ARG);
        CHECK(strncmp(report(m), "Converted 9/11 ", 15) == 0);
    }
    mp_model_destroy(m);
}

/* The pass rewrites float32 models only, as TensorFlow refuses the rewrite
   under a mixed policy. */
static void test_not_float32(void) {
    mp_compile_desc cd = amp_desc(MP_SPARSE_CATEGORICAL_CROSSENTROPY, 0);
    mp_layer_desc d = mp_dense(3, MP_LINEAR);
    mp_model *m = guide_mlp("mixed_float16", 1);
    if (m) {
        CHECK(compile_amp(m, &cd) == MP_ERR_ARG);
        CHECK_HAS(mp_model_error(m), "dense", "mixed_float16");
        mp_model_destroy(m);
    }
    d.dtype = "bfloat16"; /* one layer by its own dtype */
    if ((m = guide_mlp("float32", 0)) && OK(mp_model_add(m, d), m)) {
        CHECK(compile_amp(m, &cd) == MP_ERR_ARG);
        CHECK_HAS(mp_model_error(m), "dense_3", "bfloat16");
    }
    mp_model_destroy(m);
}

/* bfloat16 says so in the summary line and gets no loss scale; the loss's
   Mean (infer on the oneDNN lists) follows a deny op, so deny spreads to
   it. The oneDNN lists ignore TENSOR_CORES_ONLY and TensorFlow refuses
   UNSAFE_FORCE_ALL with them. */
static void test_bfloat16(void) {
    static const mp_dtype dts[] = {BF16, BF16, BF16, BF16, BF16, BF16, BF16, BF16};
    mp_compile_desc cd = amp_desc(MP_SPARSE_CATEGORICAL_CROSSENTROPY, 0);
    mp_model *m = guide_mlp("float32", 0);
    if (!m) return;
    cd.amp.dtype = MP_BFLOAT16;
    if (OK(compile_amp(m, &cd), m)) {
        CHECK_STR(report(m), "Converted 9/11 nodes to bfloat16 precision using 1 cast(s) to bfloat16 "
                             "(excluding Const and Variable casts)");
        check_dtypes(m, dts, __LINE__);
        CHECK(mp_model_loss_scale(m) == NULL && mp_current_loss_scale(m) == 1.0f);
    }
    cd.amp.level = MP_AMP_TENSOR_CORES_ONLY;
    if (OK(compile_amp(m, &cd), m))
        CHECK_STR(report(m), "Converted 9/11 nodes to bfloat16 precision using 1 cast(s) to bfloat16 "
                             "(excluding Const and Variable casts)");
    cd.amp.level = MP_AMP_UNSAFE_FORCE_ALL;
    CHECK(compile_amp(m, &cd) == MP_ERR_ARG);
    CHECK_HAS(mp_model_error(m), "UNSAFE_FORCE_ALL", "oneDNN");
    mp_model_destroy(m);
}

/* The environment: enables the pass, edits lists after the code, sets the
   level and dtype; bad values are errors naming the variable. */
static void test_environment(void) {
#ifdef HAVE_SETENV
    static const mp_dtype dts[] = {F16, F32, F16, F32, F16, F16, F16, F16};
    mp_compile_desc cd = amp_desc(MP_SPARSE_CATEGORICAL_CROSSENTROPY, 0);
    mp_model *m = guide_mlp("float32", 0);
    if (!m) return;
    cd.amp.enabled = 0;
    setenv("MIXPREC_AUTO_MIXED_PRECISION", "1", 1);
    /* Relu denied: each BiasAdd still follows its MatMul, but the Relus stay float32 */
    setenv("MIXPREC_AMP_DENYLIST_ADD", "Relu", 1);
    setenv("MIXPREC_AMP_CLEARLIST_REMOVE", "Relu", 1);
    cd.amp.clear_add = "Relu"; /* the code's edit comes first, the environment's after */
    if (OK(compile_amp(m, &cd), m)) {
        CHECK_STR(report(m), "Converted 7/11 nodes to float16 precision using 3 cast(s) to float16 "
                             "(excluding Const and Variable casts)");
        check_dtypes(m, dts, __LINE__);
    }
    unset_amp_environment();
    cd.amp.clear_add = NULL;
    if (OK(compile_amp(m, &cd), m)) { /* off again, the layers float32 */
        static const mp_dtype f32[] = {F32, F32, F32, F32, F32, F32, F32, F32};
        char buf[8];
        CHECK(mp_model_amp_table(m, buf, sizeof buf) == MP_ERR_STATE && mp_model_loss_scale(m) == NULL);
        check_dtypes(m, f32, __LINE__);
    }
    cd.amp.enabled = 1;
    setenv("MIXPREC_AMP_LEVEL", "UNSAFE_FORCE_ALL", 1);
    setenv("MIXPREC_AMP_DTYPE", "bfloat16", 1);
    cd.amp.level = MP_AMP_TENSOR_CORES_ONLY;
    CHECK(compile_amp(m, &cd) == MP_ERR_ARG); /* not with the oneDNN lists */
    CHECK_HAS(mp_model_error(m), "UNSAFE_FORCE_ALL");
    setenv("MIXPREC_AMP_DTYPE", "float16", 1);
    cd.amp.dtype = MP_BFLOAT16;
    if (OK(compile_amp(m, &cd), m))
        CHECK_STR(report(m), "Converted 11/11 nodes to float16 precision using 1 cast(s) to float16 "
                             "(excluding Const and Variable casts)");
    cd.amp.dtype = MP_FLOAT16;
    setenv("MIXPREC_AMP_LEVEL", "FAST", 1);
    CHECK(compile_amp(m, &cd) == MP_ERR_ARG);
    CHECK_HAS(mp_model_error(m), "MIXPREC_AMP_LEVEL=FAST");
    unsetenv("MIXPREC_AMP_LEVEL");
    setenv("MIXPREC_AMP_DTYPE", "float32", 1);
    CHECK(compile_amp(m, &cd) == MP_ERR_ARG);
    CHECK_HAS(mp_model_error(m), "MIXPREC_AMP_DTYPE=float32");
    unsetenv("MIXPREC_AMP_DTYPE");
    setenv("MIXPREC_AMP_INFERLIST_ADD", "Softmax,Swish", 1);
    CHECK(compile_amp(m, &cd) == MP_ERR_UNKNOWN_NAME);
    CHECK_HAS(mp_model_error(m), "'Swish'", "MIXPREC_AMP_INFERLIST_ADD");
    setenv("MIXPREC_AMP_INFERLIST_ADD", "Relu", 1); /* Relu on infer and clear */
    cd.amp.level = MP_AMP_DEFAULT;                  /* TENSOR_CORES_ONLY would empty both */
    CHECK(compile_amp(m, &cd) == MP_ERR_ARG);
    CHECK_HAS(mp_model_error(m), "Relu", "infer", "clear");
    unset_amp_environment();
    mp_model_destroy(m);
#else
    printf("skip: the environment part needs POSIX setenv\n");
#endif
}

/* ======================================================================== */
/* Numerics and training */

static double rel_diff(const float *a, const float *b, size_t n) {
    double d = 0.0, s = 0.0;
    size_t i;
    for (i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return sqrt(d / (s > 0.0 ? s : 1.0));
}

/* One step's float32 gradients of model m on a batch. */
static int gradients(mp_model *m, const float *x, const int32_t *labels, int n, float *g) {
    float loss;
    return OK(forward_rows(m, x, n, 1), m) && OK(loss_rows(m, labels, NULL, n, &loss, NULL), m) &&
           OK(mp_compute_scaled_gradients(m), m) && OK(mp_get_unscaled_gradients(m), m) &&
           OK(mp_get_gradients(m, g, mp_model_param_count(m)), m);
}

/* The AMP models' gradients agree with float32's to float16's rounding of
   the activations and weights (2^-11 relative each: about 4e-4 in all, so
   4e-3 leaves a 10x margin and still fails a wrong dtype): the guide's
   MLP (float16 to its softmax; the loss reads the float16 logits), and a
   conv net with Conv2D off the allow list, whose conv then computes in
   float32 and outputs float16 (its Relu touches the MaxPool, Reshape and
   MatMul chain of clear ops). The weights survive retyping a built model. */
static void test_gradients(void) {
    static const int shape[] = {6, 6, 2, 0};
    static const mp_dtype conv_dts[] = {F32, F16, F16, F16, F16, F16, F16, F16};
    enum { N = 16 };
    mp_layer_desc layers[4];
    mp_compile_desc cd = amp_desc(MP_SPARSE_CATEGORICAL_CROSSENTROPY, 0);
    int32_t labels[N];
    int pass, i;
    for (i = 0; i < N; i++) labels[i] = (int32_t)(rng_next() % 5);
    layers[0] = mp_conv2d(3, 3, 3, MP_SAME, MP_RELU);
    layers[1] = mp_max_pooling2d(2, 2);
    layers[2] = mp_flatten();
    layers[3] = mp_dense(5, MP_SOFTMAX);
    for (pass = 0; pass < 2; pass++) {
        mp_model *ref = pass ? new_model("float32", shape, layers, 4) : guide_mlp("float32", 0);
        mp_model *m = pass ? new_model("float32", shape, layers, 4) : guide_mlp("float32", 0);
        size_t np = ref ? mp_model_param_count(ref) : 0, in = ref ? mp_model_input_size(ref) : 0;
        float *x = floats(N * in), *g0 = floats(np), *g1 = floats(np), *w0 = floats(np), *w1 = floats(np);
        mp_compile_desc fd = cd;
        for (i = 0; i < (int)(N * in); i++) x[i] = uniform(0.0f, 1.0f);
        fd.amp.enabled = 0;
        cd.amp.allow_remove = pass ? "Conv2D" : NULL;
        if (ref && m && OK(mp_model_compile(ref, &fd), ref) && OK(mp_model_get_weights(m, w0, np), m) &&
            OK(compile_amp(m, &cd), m) && OK(mp_model_get_weights(m, w1, np), m) &&
            gradients(ref, x, labels, N, g0) && gradients(m, x, labels, N, g1)) {
            char msg[96];
            double d = rel_diff(g1, g0, np);
            CHECK(memcmp(w0, w1, np * sizeof(float)) == 0); /* built before: retyped, weights kept */
            if (pass) check_dtypes(m, conv_dts, __LINE__);
            snprintf(msg, sizeof msg, "AMP gradients within 4e-3 of float32's (%.2e), %s", d, pass ? "conv" : "MLP");
            check_report(d < 4e-3 && d > 0.0, __FILE__, __LINE__, msg);
        }
        mp_model_destroy(ref);
        mp_model_destroy(m);
        free(x), free(g0), free(g1), free(w0), free(w1);
    }
}

/* Eight overlapping Gaussian blobs in 16 dimensions (class k centred at
   2 e_k: the best accuracy, argmax of x, is 71%), so that rounding shows. */
static void blobs(float *x, int32_t *labels, size_t n) {
    size_t i, j;
    for (i = 0; i < n; i++) {
        int k = (int)(rng_next() % 8);
        labels[i] = k;
        for (j = 0; j < 16; j++) x[i * 16 + j] = normal() + (j == (size_t)k ? 2.0f : 0.0f);
    }
}

typedef struct run { float loss, accuracy; size_t activations; } run;

/* The MLP 16-64-64-8 trained 4 epochs under a policy or AMP, then evaluated. */
static run train(const char *policy, int amp, const mp_data *data, const mp_data *test) {
    static const int shape[] = {16, 0};
    mp_layer_desc layers[4];
    mp_compile_desc cd = amp_desc(MP_SPARSE_CATEGORICAL_CROSSENTROPY, 0);
    mp_fit_desc fd;
    mp_model_memory mem;
    mp_logs ev;
    mp_model *m;
    run r = {NAN, NAN, 0};
    layers[0] = mp_dense(64, MP_RELU);
    layers[1] = mp_dense(64, MP_RELU);
    layers[2] = mp_dense(8, MP_LINEAR);
    layers[3] = mp_activation_layer(MP_SOFTMAX);
    layers[3].dtype = "float32"; /* the guide's float32 output; under AMP the pass decides */
    if (amp) layers[3].dtype = NULL;
    if (!(m = new_model(policy, shape, layers, 4))) return r;
    cd.amp.enabled = amp;
    cd.optimizer.kind = MP_ADAM;
    memset(&fd, 0, sizeof fd);
    fd.data = *data;
    fd.batch_size = 64, fd.epochs = 4, fd.verbose = MP_VERBOSE_SILENT;
    if (OK(compile_amp(m, &cd), m) && OK(mp_model_fit(m, &fd), m) && OK(mp_model_evaluate(m, test, 256, &ev), m) &&
        OK(mp_model_memory_info(m, &mem), m)) {
        r.loss = ev.loss;
        r.accuracy = ev.accuracy;
        r.activations = mem.activations;
        if (amp) CHECK(mp_model_loss_scale(m) && mp_model_loss_scale(m)->steps == 4 * 63); /* wrapped */
    }
    mp_model_destroy(m);
    return r;
}

/* AMP float16 trains as the hand-written mixed_float16 policy does: both
   read the float16 logits into the float32 loss and send back the
   gradient rounded once to float16, so the training steps agree; the two
   differ only in the softmax (float16 under AMP, float32 under the guide's
   override), which only the accuracy reads. So the test accuracy must
   match within 1 point (10 samples) and the loss within 1%, room for every
   build's roundings. Its activations are float16 as mixed_float16's: the
   block is about 0.5x float32's (the input batch and the float32 logits'
   copy keep it a little above). */
static void test_training(void) {
    enum { N = 4000, NT = 1000 };
    float *x = floats(N * 16), *xt = floats(NT * 16);
    int32_t *labels = (int32_t *)calloc(N, sizeof(int32_t)), *lt = (int32_t *)calloc(NT, sizeof(int32_t));
    mp_data data, test;
    run f32, mixed, amp;
    char msg[200];
    if (!labels || !lt) exit(2);
    blobs(x, labels, N);
    blobs(xt, lt, NT);
    data = data_xy(x, 16, labels, N);
    test = data_xy(xt, 16, lt, NT);
    f32 = train("float32", 0, &data, &test);
    mixed = train("mixed_float16", 0, &data, &test);
    amp = train("float32", 1, &data, &test);
    snprintf(msg, sizeof msg, "AMP float16 (accuracy %.4f, loss %.4f) ~ mixed_float16 (%.4f, %.4f); float32 (%.4f, %.4f)",
             (double)amp.accuracy, (double)amp.loss, (double)mixed.accuracy, (double)mixed.loss,
             (double)f32.accuracy, (double)f32.loss);
    check_report(fabsf(amp.accuracy - mixed.accuracy) <= 0.01f && fabsf(amp.loss - mixed.loss) <= 0.01f * mixed.loss &&
                 amp.accuracy >= 0.65f, __FILE__, __LINE__, msg);
    printf("%s\n", msg);
    snprintf(msg, sizeof msg, "AMP activations %zu bytes, mixed_float16 %zu, float32 %zu", amp.activations,
             mixed.activations, f32.activations);
    check_report(amp.activations <= mixed.activations + mixed.activations / 20 &&
                 amp.activations < f32.activations * 6 / 10, __FILE__, __LINE__, msg);
    free(x), free(xt), free(labels), free(lt);
}

int main(int argc, char **argv) {
    check_args(argc, argv);
    unset_amp_environment(); /* the tests set what they need */
    RUN(test_guide_mlp());
    RUN(test_conv_net());
    RUN(test_binary_loss_ops());
    RUN(test_deny_spreads());
    RUN(test_residual_graph());
    RUN(test_concat_graph());
    RUN(test_layer_norm_ops());
    RUN(test_levels());
    RUN(test_code_edits());
    RUN(test_list_errors());
    RUN(test_not_float32());
    RUN(test_bfloat16());
    RUN(test_environment());
    RUN(test_gradients());
    RUN(test_training());
    return check_done("test_amp");
}
