/* test_errors.c - every error path of the model API: NULL arguments, layers
   whose shapes do not fit, calls out of order, bad arguments and labels,
   NaN/Inf data, corrupt IDX buffers and files, and an allocation failure at
   every allocation of a whole training scenario (the call that meets it must
   return MP_ERR_ALLOC, leak nothing, and leave the model usable). Each error
   must come with its exact status, a message, and for a model an
   mp_model_error() that says what went wrong. mixprec allocates through a
   counting allocator here that can be told to fail at its Nth allocation.
   Set MP_TEST_VERBOSE=1 to print every model error message. */
#define _POSIX_C_SOURCE 200809L /* mkstemp, fdopen, close, unlink */
#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* >>the counting allocator: a size header in front of every block */
typedef union { long double ld; long long ll; void *p; double d; } t_align;
#define T_HDR sizeof(t_align)
#define T_CAP ((size_t)1 << 32) /* refuse bigger requests as a real malloc would (ASan aborts) */
static size_t t_live_bytes, t_live_blocks;
static size_t t_count;   /* allocations made while not suspended */
static size_t t_fail_at; /* this one (1-based) fails; 0 = none */
static int t_failed;     /* the failure was injected */
static int t_suspend;    /* the test's own snapshots: not counted, never failed */
static int t_cur_step = -1, t_fail_step = -1;

static void *t_malloc(size_t sz) {
    unsigned char *p;
    if (!t_suspend && ++t_count == t_fail_at) {
        t_failed = 1;
        t_fail_step = t_cur_step;
        return NULL;
    }
    if (sz > T_CAP) return NULL;
    p = (unsigned char *)malloc(T_HDR + sz);
    if (!p) return NULL;
    memcpy(p, &sz, sizeof sz);
    t_live_bytes += sz;
    t_live_blocks++;
    return p + T_HDR;
}

static void t_free(void *q) {
    unsigned char *p;
    size_t sz;
    if (!q) return;
    p = (unsigned char *)q - T_HDR;
    memcpy(&sz, p, sizeof sz);
    t_live_bytes -= sz;
    t_live_blocks--;
    free(p);
}

#define MIXPREC_MALLOC(sz) t_malloc(sz)
#define MIXPREC_FREE(p) t_free(p)
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#include "check.h"
#include "helpers.h"
#include "gzip_encode.h"

static int verbose;
#define NS 8 /* samples of the small classifier: 4 inputs, 3 classes */
static float cx[NS * 4];
static int32_t cl[NS];

/* >>helpers: status checks */

/* text mentions one of the '|'-separated words, case-insensitively */
static int mentions(const char *text, const char *words) {
    const char *s;
    size_t i, n;
    while (*words) {
        n = strcspn(words, "|");
        for (s = text; *s; s++) {
            for (i = 0; i < n && s[i] && tolower((unsigned char)s[i]) == tolower((unsigned char)words[i]); i++) {}
            if (i == n) return 1;
        }
        words += n;
        if (*words) words++;
    }
    return 0;
}

/* Before a call under test, a known error goes into the model, so that a
   call that fails without recording its own error is seen (the message
   would be the marker's). A negative batch, or for checks about the batch
   size, a layer of an unknown kind: errors that change nothing. */
static char stale_text[512];
static void stale_mark(mp_model *m, const char *words) {
    mp_layer_desc d = mp_flatten();
    d.kind = (mp_layer_kind)77;
    if (!m) return;
    mp_data bad = data_xy(cx, 4, NULL, 4);
    bad.x[0].rank = -31337;
    if (words && strstr(words, "batch")) mp_model_add(m, d);
    else mp_forward(m, &bad, 0);
    strncpy(stale_text, mp_model_error(m), sizeof stale_text - 1);
}

/* got == want, a message for it, and where m is given an mp_model_error()
   that is not empty, not the stale marker, and mentions one of words (any,
   if words is NULL) */
static void check_status(mp_status got, mp_status want, const mp_model *m, const char *words,
                         const char *file, int line, const char *what) {
    char buf[320];
    const char *err;
    snprintf(buf, sizeof buf, "%s == %s", what, mp_status_name(want));
    if (!check_report(got == want, file, line, buf)) fprintf(stderr, "    got %s\n", mp_status_name(got));
    check_report(mp_status_message(got)[0] != '\0', file, line, "mp_status_message() is not empty");
    if (!m) return;
    err = mp_model_error(m);
    snprintf(buf, sizeof buf, "%s: mp_model_error() mentions %s", what, words ? words : "something");
    if (!check_report(err && err[0] && strcmp(err, stale_text) != 0 && (!words || mentions(err, words)), file, line, buf))
        fprintf(stderr, "    mp_model_error() = \"%s\"\n", err ? err : "(NULL)");
    else if (verbose)
        printf("  %-20s %s\n", mp_status_name(got), err);
}
#define CHECK_ST(expr, want) check_status((expr), (want), NULL, NULL, __FILE__, __LINE__, #expr)
#define CHECK_MST(m, expr, want, words) \
    (stale_mark((m), (words)), check_status((expr), (want), (m), (words), __FILE__, __LINE__, #expr))

/* >>helpers: models and data */

static void init_data(void) {
    int i;
    for (i = 0; i < NS * 4; i++) cx[i] = (float)((i * 7) % 11) / 10.0f;
    for (i = 0; i < NS; i++) cl[i] = i % 3;
}

static mp_model_desc model_desc(int a, int b, int c) {
    mp_model_desc md;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = a;
    md.input_shape[1] = b;
    md.input_shape[2] = c;
    md.seed = 7;
    return md;
}

static mp_model *model_new(int a, int b, int c) {
    mp_model_desc md = model_desc(a, b, c);
    mp_model *m = NULL;
    mp_status st = mp_model_create(&m, &md);
    if (!CHECK(st == MP_OK && m != NULL)) fprintf(stderr, "    mp_model_create: %s\n", mp_status_name(st));
    return st == MP_OK ? m : NULL;
}

static mp_compile_desc compile_desc(mp_loss loss, mp_optimizer_kind opt) {
    mp_compile_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.loss = loss;
    cd.optimizer.kind = opt;
    cd.metrics = MP_METRIC_ACCURACY;
    return cd;
}

/* input 4 -> Dense(8, relu) -> Dense(3) -> softmax, compiled */
static mp_model *classifier(mp_optimizer_kind opt) {
    mp_model *m = model_new(4, 0, 0);
    mp_compile_desc cd = compile_desc(MP_SPARSE_CATEGORICAL_CROSSENTROPY, opt);
    if (!m) return NULL;
    if (mp_model_add(m, mp_dense(8, MP_RELU)) || mp_model_add(m, mp_dense(3, MP_LINEAR)) ||
        mp_model_add(m, mp_activation_layer(MP_SOFTMAX)) || mp_model_compile(m, &cd)) {
        CHECK(!"building the classifier");
        fprintf(stderr, "    %s\n", mp_model_error(m));
        mp_model_destroy(m);
        return NULL;
    }
    return m;
}

static mp_data data_of(const float *x, const int32_t *labels, size_t n) { return data_xy(x, 4, labels, n); }

/* the weights (plain malloc, uncounted); NULL if get_weights fails */
static float *weights(mp_model *m) {
    size_t n = mp_model_param_count(m);
    float *w = (float *)malloc((n ? n : 1) * sizeof *w);
    t_suspend++;
    if (w && mp_model_get_weights(m, w, n) != MP_OK) free(w), w = NULL;
    t_suspend--;
    return w;
}

static int same_weights(mp_model *m, const float *w0) {
    float *w = weights(m);
    int same = w && w0 && memcmp(w, w0, mp_model_param_count(m) * sizeof *w) == 0;
    free(w);
    return same;
}

/* >>1. NULL everywhere */

static void test_null_tensors_layers(void) {
    mp_tensor t;
    int shape[2] = {2, 3};
    mp_activation a = MP_TANH;
    mp_loss_scale_desc lsd;
    memset(&t, 0, sizeof t);
    memset(&lsd, 0, sizeof lsd);
    CHECK_ST(mp_tensor_alloc(NULL, MP_FLOAT32, 2, shape), MP_ERR_NULL);
    CHECK_ST(mp_tensor_alloc(&t, MP_FLOAT32, 2, NULL), MP_ERR_NULL);
    CHECK(t.data == NULL);
    mp_tensor_free(NULL); /* documented NULL-safe */
    mp_tensor_free(&t);   /* and with no data */
    CHECK(mp_tensor_count(NULL) == 0 && mp_tensor_bytes(NULL) == 0);
    CHECK_ST(mp_activation_from_name(NULL, &a), MP_ERR_NULL);
    CHECK_ST(mp_activation_from_name("relu", NULL), MP_ERR_NULL);
    CHECK(a == MP_TANH);
    CHECK(mp_activation_name((mp_activation)99) == NULL && mp_activation_name((mp_activation)-1) == NULL);
    CHECK_ST(mp_loss_scale_init(NULL, &lsd), MP_ERR_NULL);
    CHECK(mp_loss_scale_update(NULL, 1) == 0); /* nothing to apply */
}

static void test_null_model(void) {
    mp_model_desc md = model_desc(4, 0, 0);
    mp_compile_desc cd = compile_desc(MP_SPARSE_CATEGORICAL_CROSSENTROPY, MP_SGD);
    mp_model *m = NULL;
    mp_layer_info info;
    char buf[64];
    float w[1] = {0};
    size_t n;
    CHECK_ST(mp_model_create(NULL, &md), MP_ERR_NULL);
    CHECK_ST(mp_model_create(&m, NULL), MP_ERR_NULL);
    CHECK(m == NULL);
    mp_model_destroy(NULL); /* documented NULL-safe */
    CHECK_ST(mp_model_add(NULL, mp_dense(2, MP_RELU)), MP_ERR_NULL);
    CHECK_ST(mp_model_build(NULL), MP_ERR_NULL);
    CHECK_ST(mp_model_compile(NULL, &cd), MP_ERR_NULL);
    CHECK(mp_model_error(NULL) != NULL && mp_model_error(NULL)[0] != '\0'); /* never NULL */
    CHECK(mp_model_layer_count(NULL) == 0);
    CHECK_ST(mp_model_layer_info(NULL, 0, &info), MP_ERR_NULL);
    (void)mp_model_policy(NULL);
    CHECK(mp_model_param_count(NULL) == 0 && mp_model_input_size(NULL) == 0 && mp_model_output_size(NULL) == 0);
    CHECK_ST(mp_model_summary(NULL, buf, sizeof buf), MP_ERR_NULL);
    CHECK_ST(mp_model_get_weights(NULL, w, 1), MP_ERR_NULL);
    CHECK_ST(mp_model_set_weights(NULL, w, 1), MP_ERR_NULL);
    mp_model_print_summary(NULL);
    if (!(m = classifier(MP_SGD))) return;
    n = mp_model_param_count(m);
    CHECK_MST(m, mp_model_compile(m, NULL), MP_ERR_NULL, "null");
    CHECK_ST(mp_model_layer_info(m, 0, NULL), MP_ERR_NULL); /* const functions: no model error */
    CHECK_ST(mp_model_summary(m, NULL, sizeof buf), MP_ERR_NULL);
    CHECK_MST(m, mp_model_get_weights(m, NULL, n), MP_ERR_NULL, "null");
    CHECK_MST(m, mp_model_set_weights(m, NULL, n), MP_ERR_NULL, "null");
    mp_model_destroy(m);
}

static void test_null_fit_evaluate_predict(void) {
    mp_model *m = classifier(MP_ADAM);
    mp_fit_desc fd = silent_fit(cx, 4, cl, NS, 4, 1);
    mp_data d = data_of(cx, cl, NS);
    mp_logs logs;
    float out[NS * 3];
    if (!m) return;
    CHECK_ST(mp_model_fit(NULL, &fd), MP_ERR_NULL);
    CHECK_MST(m, mp_model_fit(m, NULL), MP_ERR_NULL, "null");
    fd.data.x[0].data = NULL;
    CHECK_MST(m, mp_model_fit(m, &fd), MP_ERR_NULL, "null");
    fd = silent_fit(cx, 4, NULL, NS, 4, 1); /* sparse crossentropy needs labels */
    CHECK_MST(m, mp_model_fit(m, &fd), MP_ERR_NULL, "null");
    CHECK_ST(mp_model_evaluate(NULL, &d, 4, &logs), MP_ERR_NULL);
    CHECK_MST(m, mp_model_evaluate(m, NULL, 4, &logs), MP_ERR_NULL, "null");
    d.x[0].data = NULL;
    CHECK_MST(m, mp_model_evaluate(m, &d, 4, &logs), MP_ERR_NULL, "null");
    d = data_of(cx, NULL, NS);
    CHECK_MST(m, mp_model_evaluate(m, &d, 4, &logs), MP_ERR_NULL, "null");
    d = data_of(cx, NULL, NS);
    CHECK_ST(mp_model_predict(NULL, &d, 4, out, NS * 3), MP_ERR_NULL);
    CHECK_MST(m, mp_model_predict(m, NULL, 4, out, NS * 3), MP_ERR_NULL, "null");
    CHECK_MST(m, mp_model_predict(m, &d, 4, NULL, NS * 3), MP_ERR_NULL, "null");
    d.x[0].data = NULL;
    CHECK_MST(m, mp_model_predict(m, &d, 4, out, NS * 3), MP_ERR_NULL, "null");
    mp_model_destroy(m);
}

static void test_null_custom_loop(void) {
    mp_model *m = classifier(MP_ADAM);
    mp_tensor t;
    mp_data b = data_of(cx, cl, 4), none;
    float loss = 0, g[256];
    int applied = 0;
    size_t n, slots;
    memset(&none, 0, sizeof none);
    if (!m) return;
    n = mp_model_param_count(m);
    CHECK(n <= 256);
    CHECK_ST(mp_forward(NULL, &b, 1), MP_ERR_NULL);
    CHECK_MST(m, mp_forward(m, NULL, 1), MP_ERR_NULL, "null");
    CHECK_MST(m, mp_forward(m, &none, 1), MP_ERR_NULL, "null");
    CHECK_ST(mp_output(NULL, &t), MP_ERR_NULL);
    CHECK_ST(mp_output(m, NULL), MP_ERR_NULL);
    CHECK_ST(mp_forward(m, &b, 1), MP_OK);
    CHECK_ST(mp_compute_loss(NULL, &b.y, &loss, NULL), MP_ERR_NULL);
    CHECK_MST(m, mp_compute_loss(m, NULL, &loss, NULL), MP_ERR_NULL, "null");
    CHECK_MST(m, mp_compute_loss(m, &none.y, &loss, NULL), MP_ERR_NULL, "null");
    CHECK_MST(m, mp_compute_loss(m, &b.y, NULL, NULL), MP_ERR_NULL, "null");
    CHECK_ST(mp_compute_loss(m, &b.y, &loss, NULL), MP_OK); /* correct may be NULL */
    (void)mp_get_scaled_loss(NULL, loss);
    CHECK_ST(mp_compute_scaled_gradients(NULL), MP_ERR_NULL);
    CHECK_ST(mp_compute_scaled_gradients(m), MP_OK);
    CHECK_ST(mp_get_unscaled_gradients(NULL), MP_ERR_NULL);
    CHECK_ST(mp_get_unscaled_gradients(m), MP_OK);
    CHECK_ST(mp_apply_gradients(NULL, &applied), MP_ERR_NULL);
    CHECK_ST(mp_apply_gradients(m, NULL), MP_OK); /* applied may be NULL */
    CHECK_ST(mp_get_gradients(NULL, g, n), MP_ERR_NULL);
    CHECK_ST(mp_get_gradients(m, NULL, n), MP_ERR_NULL);
    CHECK(mp_optimizer_slot_count(NULL) == 0);
    slots = mp_optimizer_slot_count(m);
    CHECK(slots == 2 * n); /* Adam: m and v per weight */
    CHECK_ST(mp_get_optimizer_slots(NULL, g, slots), MP_ERR_NULL);
    CHECK_ST(mp_get_optimizer_slots(m, NULL, slots), MP_ERR_NULL);
    CHECK(mp_model_loss_scale(NULL) == NULL);
    (void)mp_current_loss_scale(NULL);
    mp_model_destroy(m);
}

/* >>4 (shared): hand-built IDX buffers */
static size_t put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
    return 4;
}

/* n images of rows x cols: pixel i is (i * 37 + 11) & 255, but the first two are 0 and 255 */
static size_t make_images(unsigned char *buf, uint32_t n, uint32_t rows, uint32_t cols) {
    size_t len = put_be32(buf, 0x00000803u), i, count = (size_t)n * rows * cols;
    len += put_be32(buf + len, n);
    len += put_be32(buf + len, rows);
    len += put_be32(buf + len, cols);
    for (i = 0; i < count; i++) buf[len + i] = (unsigned char)(i == 0 ? 0 : i == 1 ? 255 : (i * 37 + 11) & 255);
    return len + count;
}

static size_t make_labels(unsigned char *buf, uint32_t n, const unsigned char *values) {
    size_t len = put_be32(buf, 0x00000801u);
    len += put_be32(buf + len, n);
    memcpy(buf + len, values, n);
    return len + n;
}

static void test_null_data(void) {
    unsigned char img[64], lab[16];
    static const unsigned char values[3] = {1, 0, 2};
    size_t il = make_images(img, 3, 2, 2), ll = make_labels(lab, 3, values);
    mp_dataset ds;
    int rank = -1;
    uint32_t dims[3];
    const uint8_t *data = NULL;
    memset(&ds, 0, sizeof ds);
    CHECK_ST(mp_idx_parse(NULL, il, &rank, dims, &data), MP_ERR_NULL);
    CHECK_ST(mp_idx_parse(img, il, &rank, NULL, &data), MP_OK); /* dims may be NULL */
    CHECK(rank == 3 && data == img + 16);
    CHECK_ST(mp_dataset_from_idx(NULL, il, lab, ll, &ds), MP_ERR_NULL);
    CHECK_ST(mp_dataset_from_idx(img, il, NULL, ll, &ds), MP_ERR_NULL);
    CHECK_ST(mp_dataset_from_idx(img, il, lab, ll, NULL), MP_ERR_NULL);
    CHECK(ds.x == NULL && ds.labels == NULL);
    mp_dataset_free(NULL);
    mp_dataset_free(&ds); /* an empty one */
    CHECK_ST(mp_load_idx(NULL, "/tmp/x", &ds), MP_ERR_NULL);
    CHECK_ST(mp_load_idx("/tmp/x", NULL, &ds), MP_ERR_NULL);
    CHECK_ST(mp_load_idx("/tmp/x", "/tmp/y", NULL), MP_ERR_NULL);
    CHECK(ds.x == NULL && ds.labels == NULL);
}

/* >>2. layers that do not fit, calls out of order, bad descriptions */

static mp_layer_desc named(mp_layer_desc d, const char *name) {
    d.name = name;
    return d;
}

/* Dense on a rank-3 input acts on the last axis, as Keras's; a Dense of no
   units is refused, naming it, and changes nothing. */
static void test_shape_dense_after_rank3(void) {
    mp_model *m = model_new(4, 4, 1);
    if (!m) return;
    CHECK_MST(m, mp_model_add(m, named(mp_dense(0, MP_RELU), "my_dense")), MP_ERR_ARG, "my_dense");
    CHECK(mp_model_layer_count(m) == 0);
    CHECK_ST(mp_model_add(m, named(mp_dense(5, MP_RELU), "my_dense")), MP_OK); /* (4, 4, 5) */
    CHECK_ST(mp_model_add(m, mp_flatten()), MP_OK);
    CHECK_ST(mp_model_add(m, mp_dense(3, MP_RELU)), MP_OK);
    CHECK_ST(mp_model_build(m), MP_OK);
    CHECK(mp_model_layer_count(m) == 3 && mp_model_output_size(m) == 3);
    CHECK(mp_model_param_count(m) == (1 * 5 + 5) + (80 * 3 + 3));
    mp_model_destroy(m);
}

static void test_shape_conv_pool(void) {
    mp_model *m;
    if ((m = model_new(10, 0, 0))) { /* Conv2D and MaxPooling2D need (h, w, c) */
        CHECK_MST(m, mp_model_add(m, named(mp_conv2d(2, 3, 3, MP_VALID, MP_RELU), "my_conv")), MP_ERR_SHAPE, "my_conv");
        CHECK_MST(m, mp_model_add(m, named(mp_max_pooling2d(2, 2), "my_pool")), MP_ERR_SHAPE, "my_pool");
        CHECK(mp_model_layer_count(m) == 0);
        mp_model_destroy(m);
    }
    if ((m = model_new(4, 4, 0))) {
        CHECK_MST(m, mp_model_add(m, named(mp_conv2d(2, 3, 3, MP_VALID, MP_RELU), "my_conv")), MP_ERR_SHAPE, "my_conv");
        mp_model_destroy(m);
    }
    if ((m = model_new(3, 3, 1))) {
        CHECK_MST(m, mp_model_add(m, named(mp_max_pooling2d(4, 4), "my_pool")), MP_ERR_SHAPE, "my_pool");
        CHECK_MST(m, mp_model_add(m, named(mp_conv2d(1, 5, 5, MP_VALID, MP_RELU), "big_kernel")), MP_ERR_SHAPE, "big_kernel");
        CHECK_MST(m, mp_model_add(m, named(mp_conv2d(1, 4, 3, MP_VALID, MP_RELU), "tall_kernel")), MP_ERR_SHAPE, "tall_kernel");
        CHECK(mp_model_layer_count(m) == 0);
        CHECK_ST(mp_model_add(m, mp_conv2d(1, 5, 5, MP_SAME, MP_RELU)), MP_OK); /* same padding fits */
        CHECK_ST(mp_model_add(m, mp_max_pooling2d(3, 3)), MP_OK);                /* 3x3 -> 1x1 */
        CHECK_MST(m, mp_model_add(m, named(mp_max_pooling2d(2, 2), "pool_of_1x1")), MP_ERR_SHAPE, "pool_of_1x1");
        CHECK(mp_model_layer_count(m) == 2);
        mp_model_destroy(m);
    }
    if ((m = model_new(4, 4, 1))) { /* the previous layer's output, not the input, is what must fit */
        CHECK_ST(mp_model_add(m, mp_conv2d(2, 3, 3, MP_VALID, MP_RELU)), MP_OK); /* 2x2x2 */
        CHECK_MST(m, mp_model_add(m, named(mp_conv2d(2, 3, 3, MP_VALID, MP_RELU), "second_conv")), MP_ERR_SHAPE, "second_conv");
        CHECK_MST(m, mp_model_add(m, named(mp_max_pooling2d(3, 3), "second_pool")), MP_ERR_SHAPE, "second_pool");
        mp_model_destroy(m);
    }
}

static void test_bad_model_desc(void) {
    static const int shapes[][3] = {{0, 0, 0}, {-1, 0, 0}, {4, -2, 0}, {4, 4, -1}};
    size_t i;
    for (i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        mp_model_desc md = model_desc(shapes[i][0], shapes[i][1], shapes[i][2]);
        mp_model *m = NULL;
        CHECK_ST(mp_model_create(&m, &md), MP_ERR_ARG);
        CHECK(m == NULL);
    }
}

/* an add that must fail with want and leave the model without layers */
static void check_bad_add(mp_model *m, mp_layer_desc d, mp_status want, const char *words, int line) {
    char what[64];
    snprintf(what, sizeof what, "mp_model_add (case at line %d)", line);
    check_status(mp_model_add(m, d), want, m, words, __FILE__, line, what);
    check_report(mp_model_layer_count(m) == 0, __FILE__, line, "the failed add added nothing");
}
#define BAD_ADD(m, d, want, words) check_bad_add((m), (d), (want), (words), __LINE__)

static void test_bad_layer_args(void) {
    mp_model *m = model_new(6, 6, 1);
    mp_layer_desc d;
    mp_policy bad_policy = {MP_FLOAT32, MP_FLOAT16};
    if (!m) return;
    BAD_ADD(m, mp_conv2d(0, 3, 3, MP_SAME, MP_RELU), MP_ERR_ARG, "filters");
    BAD_ADD(m, mp_conv2d(-2, 3, 3, MP_SAME, MP_RELU), MP_ERR_ARG, "filters");
    BAD_ADD(m, mp_conv2d(2, 0, 3, MP_SAME, MP_RELU), MP_ERR_ARG, "kernel");
    BAD_ADD(m, mp_conv2d(2, 3, -1, MP_SAME, MP_RELU), MP_ERR_ARG, "kernel");
    d = mp_conv2d(2, 3, 3, MP_SAME, MP_RELU), d.strides[1] = -1;
    BAD_ADD(m, d, MP_ERR_ARG, "stride");
    d = mp_conv2d(2, 3, 3, (mp_padding)5, MP_RELU);
    BAD_ADD(m, d, MP_ERR_ARG, "padding");
    BAD_ADD(m, mp_conv2d(2, 3, 3, MP_SAME, (mp_activation)99), MP_ERR_ARG, "activation");
    BAD_ADD(m, mp_max_pooling2d(-1, 2), MP_ERR_ARG, "pool");
    BAD_ADD(m, mp_max_pooling2d(2, -3), MP_ERR_ARG, "pool");
    BAD_ADD(m, mp_dropout(-0.1f), MP_ERR_ARG, "rate|dropout");
    BAD_ADD(m, mp_dropout(1.0f), MP_ERR_ARG, "rate|dropout");
    BAD_ADD(m, mp_dropout(1.5f), MP_ERR_ARG, "rate|dropout");
    BAD_ADD(m, mp_dropout(NAN), MP_ERR_ARG, "rate|dropout");
    BAD_ADD(m, mp_activation_layer((mp_activation)MP_ACTIVATION_COUNT), MP_ERR_ARG, "activation");
    BAD_ADD(m, mp_activation_layer((mp_activation)-1), MP_ERR_ARG, "activation");
    d = mp_flatten(), d.kind = (mp_layer_kind)0;
    BAD_ADD(m, d, MP_ERR_ARG, NULL);
    d.kind = (mp_layer_kind)99;
    BAD_ADD(m, d, MP_ERR_ARG, NULL);
    d = mp_activation_layer(MP_SOFTMAX), d.dtype = "float64";
    BAD_ADD(m, d, MP_ERR_UNKNOWN_POLICY, "float64");
    d = mp_activation_layer(MP_SOFTMAX), d.policy = &bad_policy;
    BAD_ADD(m, d, MP_ERR_INVALID_POLICY, NULL);
    mp_model_destroy(m);
    if ((m = model_new(4, 0, 0))) {
        BAD_ADD(m, mp_dense(0, MP_RELU), MP_ERR_ARG, "units");
        BAD_ADD(m, mp_dense(-3, MP_RELU), MP_ERR_ARG, "units");
        BAD_ADD(m, mp_dense(3, (mp_activation)MP_ACTIVATION_COUNT), MP_ERR_ARG, "activation");
        mp_model_destroy(m);
    }
}

static void test_bad_loss_scale(void) {
    mp_loss_scale ls, keep;
    mp_loss_scale_desc d;
    int i;
    memset(&keep, 0x5A, sizeof keep);
    for (i = 0; i < 6; i++) {
        memset(&d, 0, sizeof d);
        if (i == 0) d.initial_scale = -2.0f;
        if (i == 1) d.initial_scale = NAN;
        if (i == 2) d.initial_scale = INFINITY;
        if (i == 3) d.growth_interval = -1;
        if (i == 4) d.min_scale = 8.0f, d.max_scale = 4.0f;
        if (i == 5) d.hysteresis = -1;
        ls = keep;
        CHECK_ST(mp_loss_scale_init(&ls, &d), MP_ERR_ARG);
        CHECK(memcmp(&ls, &keep, sizeof ls) == 0); /* nothing written */
    }
}

static void test_activation_names(void) {
    static const char *bad[] = {"swish", "", "Relu", "relu ", "softmax2", "elu"};
    mp_activation a;
    size_t i;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        a = MP_GELU;
        CHECK_ST(mp_activation_from_name(bad[i], &a), MP_ERR_UNKNOWN_NAME);
        CHECK(a == MP_GELU); /* nothing written */
    }
    CHECK_ST(mp_activation_from_name("tanh", &a), MP_OK);
    CHECK(a == MP_TANH);
}

static void test_bad_compile(void) {
    mp_model *m = model_new(4, 0, 0);
    mp_compile_desc cd;
    if (!m) return;
    CHECK_ST(mp_model_add(m, mp_dense(3, MP_LINEAR)), MP_OK);
    cd = compile_desc(MP_LOSS_NONE, MP_SGD); /* the loss is required */
    CHECK_MST(m, mp_model_compile(m, &cd), MP_ERR_ARG, "loss");
    cd = compile_desc((mp_loss)MP_LOSS_COUNT, MP_SGD);
    CHECK_MST(m, mp_model_compile(m, &cd), MP_ERR_ARG, "loss");
    cd = compile_desc(MP_MEAN_SQUARED_ERROR, (mp_optimizer_kind)MP_OPTIMIZER_COUNT);
    CHECK_MST(m, mp_model_compile(m, &cd), MP_ERR_ARG, "optimizer");
    cd = compile_desc(MP_MEAN_SQUARED_ERROR, MP_SGD), cd.optimizer.learning_rate = -0.1f;
    CHECK_MST(m, mp_model_compile(m, &cd), MP_ERR_ARG, "learning|optimizer");
    cd = compile_desc(MP_MEAN_SQUARED_ERROR, MP_SGD), cd.loss_scale = (mp_loss_scale_mode)7;
    CHECK_MST(m, mp_model_compile(m, &cd), MP_ERR_ARG, "scale");
    cd = compile_desc(MP_MEAN_SQUARED_ERROR, MP_SGD);
    CHECK_ST(mp_model_compile(m, &cd), MP_OK);
    mp_model_destroy(m);
}

static void test_state(void) {
    mp_model *m;
    mp_compile_desc cd = compile_desc(MP_SPARSE_CATEGORICAL_CROSSENTROPY, MP_SGD);
    mp_fit_desc fd = silent_fit(cx, 4, cl, NS, 4, 1);
    mp_data d = data_of(cx, cl, NS);
    mp_logs logs;
    float w[128];
    if ((m = model_new(4, 0, 0))) { /* build, then add */
        CHECK_ST(mp_model_add(m, mp_dense(3, MP_LINEAR)), MP_OK);
        CHECK_MST(m, mp_model_fit(m, &fd), MP_ERR_STATE, "compile");
        CHECK_MST(m, mp_model_evaluate(m, &d, 4, &logs), MP_ERR_STATE, "compile");
        CHECK_ST(mp_model_build(m), MP_OK);
        CHECK_MST(m, mp_model_add(m, mp_dense(3, MP_LINEAR)), MP_ERR_STATE, "built|build|compile");
        CHECK_MST(m, mp_model_fit(m, &fd), MP_ERR_STATE, "compile");
        CHECK(mp_model_layer_count(m) == 1);
        mp_model_destroy(m);
    }
    if ((m = model_new(4, 0, 0))) { /* get_weights builds implicitly */
        CHECK_ST(mp_model_add(m, mp_dense(3, MP_LINEAR)), MP_OK);
        CHECK_ST(mp_model_get_weights(m, w, 15), MP_OK);
        CHECK_MST(m, mp_model_add(m, mp_dense(3, MP_LINEAR)), MP_ERR_STATE, "built|build|compile");
        CHECK_ST(mp_model_compile(m, &cd), MP_OK);
        CHECK_MST(m, mp_model_add(m, mp_flatten()), MP_ERR_STATE, "built|build|compile");
        mp_model_destroy(m);
    }
    if ((m = classifier(MP_SGD))) { /* compile, then add; the custom loop out of order */
        mp_tensor t;
        CHECK_ST(mp_output(m, &t), MP_ERR_STATE); /* no forward yet */
        CHECK_MST(m, mp_model_add(m, mp_dense(3, MP_LINEAR)), MP_ERR_STATE, "built|build|compile");
        CHECK_MST(m, mp_compute_loss(m, &d.y, &logs.loss, NULL), MP_ERR_STATE, "forward");
        CHECK_MST(m, mp_compute_scaled_gradients(m), MP_ERR_STATE, "forward|loss");
        CHECK_MST(m, mp_get_unscaled_gradients(m), MP_ERR_STATE, "gradient");
        CHECK_MST(m, mp_apply_gradients(m, NULL), MP_ERR_STATE, "gradient");
        CHECK_ST(mp_get_gradients(m, w, mp_model_param_count(m)), MP_ERR_STATE); /* none computed yet */
        d = data_of(cx, cl, 4);
        CHECK_ST(mp_forward(m, &d, 1), MP_OK);
        CHECK_MST(m, mp_compute_scaled_gradients(m), MP_ERR_STATE, "loss"); /* no loss yet */
        CHECK_ST(mp_compute_loss(m, &d.y, &logs.loss, NULL), MP_OK);
        CHECK_MST(m, mp_apply_gradients(m, NULL), MP_ERR_STATE, "gradient"); /* no gradients yet */
        mp_model_destroy(m);
    }
}

static void test_sizes_that_do_not_fit(void) {
    mp_model *m = classifier(MP_ADAM);
    float w[128], *w0;
    mp_layer_info info;
    mp_data b = data_of(cx, cl, 4);
    char small[8];
    size_t n;
    if (!m) return;
    n = mp_model_param_count(m);
    CHECK(n == 4 * 8 + 8 + 8 * 3 + 3 && n < 128);
    w0 = weights(m);
    memset(w, 0, sizeof w);
    /* a count of weights that is not the model's: the data does not fit the model */
    CHECK_MST(m, mp_model_set_weights(m, w, n - 1), MP_ERR_SHAPE, "weight");
    CHECK_MST(m, mp_model_set_weights(m, w, n + 1), MP_ERR_SHAPE, "weight");
    CHECK_MST(m, mp_model_set_weights(m, w, 0), MP_ERR_SHAPE, "weight");
    CHECK(same_weights(m, w0));
    CHECK_MST(m, mp_model_get_weights(m, w, n - 1), MP_ERR_SHAPE, "weight");
    CHECK_MST(m, mp_model_get_weights(m, w, n + 1), MP_ERR_SHAPE, "weight");
    memset(small, 'x', sizeof small);
    CHECK_ST(mp_model_summary(m, small, sizeof small), MP_ERR_SIZE); /* as mp_policy_repr */
    CHECK_ST(mp_forward(m, &b, 1), MP_OK);
    CHECK_ST(mp_compute_loss(m, &b.y, &w[0], NULL), MP_OK);
    CHECK_ST(mp_compute_scaled_gradients(m), MP_OK);
    CHECK_ST(mp_get_unscaled_gradients(m), MP_OK);
    CHECK_ST(mp_get_gradients(m, w, n - 1), MP_ERR_SHAPE);
    CHECK_ST(mp_apply_gradients(m, NULL), MP_OK);
    CHECK_ST(mp_get_optimizer_slots(m, w, 1), MP_ERR_SHAPE);
    CHECK_ST(mp_model_layer_info(m, -1, &info), MP_ERR_ARG);
    CHECK_ST(mp_model_layer_info(m, mp_model_layer_count(m), &info), MP_ERR_ARG);
    free(w0);
    mp_model_destroy(m);
}

/* >>3. labels, batch sizes, epochs, validation_split, NaN/Inf */

static void test_labels(void) {
    static const int32_t bad_values[2] = {-1, 3}; /* 3 == classes */
    mp_model *m = classifier(MP_SGD);
    int32_t lab[NS];
    float *w0, loss = 0;
    mp_fit_desc fd;
    mp_data d;
    mp_logs logs;
    int i;
    if (!m) return;
    w0 = weights(m);
    for (i = 0; i < 2; i++) {
        memcpy(lab, cl, sizeof lab);
        lab[NS - 1] = bad_values[i]; /* the last sample: found before any step */
        fd = silent_fit(cx, 4, lab, NS, 4, 1);
        CHECK_MST(m, mp_model_fit(m, &fd), MP_ERR_LABEL, "label");
        CHECK(same_weights(m, w0));
        d = data_of(cx, lab, NS);
        CHECK_MST(m, mp_model_evaluate(m, &d, 4, &logs), MP_ERR_LABEL, "label");
        d = data_of(cx + 4 * 4, lab + 4, 4);
        CHECK_ST(mp_forward(m, &d, 0), MP_OK);
        CHECK_MST(m, mp_compute_loss(m, &d.y, &loss, NULL), MP_ERR_LABEL, "label");
    }
    lab[NS - 1] = 2; /* all fine again */
    fd = silent_fit(cx, 4, lab, NS, 4, 1);
    CHECK_ST(mp_model_fit(m, &fd), MP_OK);
    free(w0);
    mp_model_destroy(m);
}

static void test_batch_epochs_split(void) {
    static const int bad_batch[2] = {-1, -4};
    static const float bad_split[4] = {-0.1f, 1.0f, 1.5f, NAN};
    mp_model *m = classifier(MP_SGD);
    mp_fit_desc fd;
    mp_data d = data_of(cx, cl, NS);
    mp_logs logs;
    float out[NS * 3];
    int i;
    if (!m) return;
    for (i = 0; i < 2; i++) {
        fd = silent_fit(cx, 4, cl, NS, bad_batch[i], 1);
        CHECK_MST(m, mp_model_fit(m, &fd), MP_ERR_ARG, "batch");
        CHECK_MST(m, mp_model_evaluate(m, &d, bad_batch[i], &logs), MP_ERR_ARG, "batch");
        CHECK_MST(m, mp_model_predict(m, &d, bad_batch[i], out, NS * 3), MP_ERR_ARG, "batch");
    }
    fd = silent_fit(cx, 4, cl, NS, 4, 1), fd.epochs = -1;
    CHECK_MST(m, mp_model_fit(m, &fd), MP_ERR_ARG, "epoch");
    for (i = 0; i < 4; i++) {
        fd = silent_fit(cx, 4, cl, NS, 4, 1), fd.validation_split = bad_split[i];
        CHECK_MST(m, mp_model_fit(m, &fd), MP_ERR_ARG, "validation");
    }
    fd = silent_fit(cx, 4, cl, 0, 4, 1); /* no samples */
    CHECK_MST(m, mp_model_fit(m, &fd), MP_ERR_ARG, "empty|sample|data");
    fd = silent_fit(cx, 4, cl, NS, 4, 1), fd.validation_split = 0.25f;
    CHECK_ST(mp_model_fit(m, &fd), MP_OK);
    mp_model_destroy(m);
}

static void test_nonfinite_x(void) {
    static const size_t where[3] = {NS * 4 - 1, 0, 13};
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    mp_model *m = classifier(MP_ADAM);
    float x[NS * 4], *w0;
    mp_fit_desc fd;
    int i;
    if (!m) return;
    w0 = weights(m);
    for (i = 0; i < 3; i++) {
        memcpy(x, cx, sizeof x);
        x[where[i]] = bad[i];
        fd = silent_fit(x, 4, cl, NS, 4, 1);
        CHECK_MST(m, mp_model_fit(m, &fd), MP_ERR_NONFINITE, "nan|inf|finite");
        CHECK(same_weights(m, w0));
    }
    fd.validation_split = 0.25f; /* a NaN in the validation part only */
    x[NS * 4 - 1] = NAN, x[13] = 0.5f;
    CHECK_MST(m, mp_model_fit(m, &fd), MP_ERR_NONFINITE, "nan|inf|finite");
    CHECK(same_weights(m, w0));
    free(w0);
    mp_model_destroy(m);
}

/* >>4. IDX buffers and files */

static void test_idx_valid(void) {
    unsigned char img[64], lab[16];
    static const unsigned char values[3] = {1, 12, 2}; /* > 9 is fine: classes = 13 */
    size_t il = make_images(img, 3, 2, 2), ll = make_labels(lab, 3, values), i;
    int rank = 0;
    uint32_t dims[3] = {0, 0, 0};
    const uint8_t *data = NULL;
    mp_dataset ds;
    memset(&ds, 0, sizeof ds);
    CHECK_ST(mp_idx_parse(img, il, &rank, dims, &data), MP_OK);
    CHECK(rank == 3 && dims[0] == 3 && dims[1] == 2 && dims[2] == 2 && data == img + 16);
    CHECK_ST(mp_idx_parse(lab, ll, &rank, dims, &data), MP_OK);
    CHECK(rank == 1 && dims[0] == 3 && data == lab + 8);
    img[3] = 2, put_be32(img + 8, 4); /* rank 2, 3 x 4: the same bytes, one dim fewer */
    CHECK_ST(mp_idx_parse(img, il - 4, &rank, dims, &data), MP_OK);
    CHECK(rank == 2 && dims[0] == 3 && dims[1] == 4 && data == img + 12);
    il = make_images(img, 3, 2, 2);
    CHECK_ST(mp_dataset_from_idx(img, il, lab, ll, &ds), MP_OK);
    CHECK(ds.n == 3 && ds.rows == 2 && ds.cols == 2 && ds.classes == 13);
    CHECK(ds.x && ds.labels && ds.labels[0] == 1 && ds.labels[1] == 12 && ds.labels[2] == 2);
    if (ds.x) {
        CHECK(ds.x[0] == 0.0f && ds.x[1] == 1.0f); /* 0 -> 0, 255 -> 1 exactly */
        for (i = 2; i < 12; i++) {
            float want = (float)img[16 + i] / 255.0f;
            CHECK(ds.x[i] >= 0.0f && ds.x[i] <= 1.0f && fabsf(ds.x[i] - want) <= 6e-8f);
        }
    }
    mp_dataset_free(&ds);
    memset(&ds, 0, sizeof ds);
    memset(lab + 8, 0, 3); /* all labels 0: one class */
    CHECK_ST(mp_dataset_from_idx(img, il, lab, ll, &ds), MP_OK);
    CHECK(ds.classes == 1);
    mp_dataset_free(&ds);
}

/* parse must fail with MP_ERR_FORMAT and write nothing */
static void check_bad_parse(const unsigned char *buf, size_t len, int line) {
    int rank = -7;
    uint32_t dims[3] = {7, 7, 7};
    static const uint8_t sentinel[1] = {0};
    const uint8_t *data = sentinel;
    mp_status st = mp_idx_parse(buf, len, &rank, dims, &data);
    if (!check_report(st == MP_ERR_FORMAT, __FILE__, line, "mp_idx_parse == MP_ERR_FORMAT"))
        fprintf(stderr, "    got %s (len %lu)\n", mp_status_name(st), (unsigned long)len);
    check_report(rank == -7 && dims[0] == 7 && data == sentinel, __FILE__, line, "a failed mp_idx_parse writes nothing");
}
#define BAD_PARSE(buf, len) check_bad_parse((buf), (len), __LINE__)

static void test_idx_bad_headers(void) {
    unsigned char b[64];
    size_t len = make_images(b, 3, 2, 2);
    b[0] = 1, BAD_PARSE(b, len), b[0] = 0;    /* magic must start 00 00 */
    b[1] = 8, BAD_PARSE(b, len), b[1] = 0;
    b[2] = 0x0D, BAD_PARSE(b, len), b[2] = 8; /* float data: not unsigned bytes */
    b[2] = 0x09, BAD_PARSE(b, len), b[2] = 8; /* signed bytes */
    b[3] = 0, BAD_PARSE(b, 4), BAD_PARSE(b, len);
    b[3] = 4, BAD_PARSE(b, len), b[3] = 0xFF, BAD_PARSE(b, len), b[3] = 3;
    put_be32(b + 8, 0), BAD_PARSE(b, len), BAD_PARSE(b, 16), put_be32(b + 8, 2); /* a zero dim */
    put_be32(b + 4, 0), BAD_PARSE(b, 16), put_be32(b + 4, 3);
    BAD_PARSE(b, len - 1);                    /* truncated data */
    b[len] = 0, BAD_PARSE(b, len + 1);        /* a trailing byte */
    put_be32(b + 4, 0xFFFFFFFFu), put_be32(b + 8, 0xFFFFFFFFu), put_be32(b + 12, 0xFFFFFFFFu);
    BAD_PARSE(b, len);                        /* 2^96: the product overflows size_t */
    put_be32(b + 4, 0x00010000u), put_be32(b + 8, 0x00010000u), put_be32(b + 12, 0x00010001u);
    BAD_PARSE(b, len);                        /* 2^64 + 2^32: overflows by a little */
    put_be32(b + 4, 0x80000000u), put_be32(b + 8, 2), put_be32(b + 12, 1);
    BAD_PARSE(b, len);                        /* 2^32 exactly, more than the buffer */
    BAD_PARSE(b, 0);
}

static void test_idx_prefixes(void) {
    unsigned char img[64], lab[16];
    static const unsigned char values[3] = {1, 0, 2};
    size_t il = make_images(img, 3, 2, 2), ll = make_labels(lab, 3, values), k;
    mp_dataset ds;
    mp_status st;
    memset(&ds, 0, sizeof ds);
    for (k = 0; k < il; k++) {
        BAD_PARSE(img, k);
        st = mp_dataset_from_idx(img, k, lab, ll, &ds);
        if (!CHECK(st == MP_ERR_FORMAT)) fprintf(stderr, "    images cut at %lu: %s\n", (unsigned long)k, mp_status_name(st));
        if (st == MP_OK) mp_dataset_free(&ds), memset(&ds, 0, sizeof ds);
    }
    for (k = 0; k < ll; k++) {
        BAD_PARSE(lab, k);
        st = mp_dataset_from_idx(img, il, lab, k, &ds);
        if (!CHECK(st == MP_ERR_FORMAT)) fprintf(stderr, "    labels cut at %lu: %s\n", (unsigned long)k, mp_status_name(st));
        if (st == MP_OK) mp_dataset_free(&ds), memset(&ds, 0, sizeof ds);
    }
    CHECK(ds.x == NULL && ds.labels == NULL);
}

static void test_idx_dataset_mismatch(void) {
    unsigned char img[64], lab[16], lab4[16];
    static const unsigned char values[4] = {1, 0, 2, 2};
    size_t il = make_images(img, 3, 2, 2), ll = make_labels(lab, 3, values), l4 = make_labels(lab4, 4, values);
    mp_dataset ds;
    memset(&ds, 0, sizeof ds);
    CHECK_ST(mp_dataset_from_idx(img, il, lab4, l4, &ds), MP_ERR_FORMAT); /* 3 images, 4 labels */
    CHECK_ST(mp_dataset_from_idx(lab, ll, img, il, &ds), MP_ERR_FORMAT);  /* swapped */
    CHECK_ST(mp_dataset_from_idx(img, il, img, il, &ds), MP_ERR_FORMAT);  /* labels of rank 3 */
    CHECK_ST(mp_dataset_from_idx(lab, ll, lab, ll, &ds), MP_ERR_FORMAT);  /* images of rank 1 */
    CHECK(ds.x == NULL && ds.labels == NULL);
}

static uint32_t xorshift_state = 0x2545F491u;
static uint32_t rng(void) { /* xorshift32 */
    xorshift_state ^= xorshift_state << 13;
    xorshift_state ^= xorshift_state >> 17;
    xorshift_state ^= xorshift_state << 5;
    return xorshift_state;
}

/* flip random bits of the headers: never a crash, only OK or MP_ERR_FORMAT */
static void test_idx_fuzz(void) {
    unsigned char img[64], lab[16], b[64], c[16];
    static const unsigned char values[3] = {1, 0, 2};
    size_t il = make_images(img, 3, 2, 2), ll = make_labels(lab, 3, values);
    unsigned ok = 0, bad = 0;
    int i, j, rank;
    uint32_t dims[3];
    const uint8_t *data;
    mp_dataset ds;
    mp_status s1, s2;
    memset(&ds, 0, sizeof ds);
    for (i = 0; i < 4000; i++) {
        memcpy(b, img, il), memcpy(c, lab, ll);
        for (j = 1 + (int)(rng() % 3); j > 0; j--) {
            uint32_t r = rng();
            if (r & 1) b[(r >> 1) % 16] ^= (unsigned char)(1u << ((r >> 8) & 7));
            else c[(r >> 1) % 8] ^= (unsigned char)(1u << ((r >> 8) & 7));
        }
        s1 = mp_idx_parse(b, il, &rank, dims, &data);
        s2 = mp_dataset_from_idx(b, il, c, ll, &ds);
        if (s1 != MP_OK && s1 != MP_ERR_FORMAT) bad++;
        if (s2 != MP_OK && s2 != MP_ERR_FORMAT) bad++;
        if (s2 == MP_OK) ok++, mp_dataset_free(&ds), memset(&ds, 0, sizeof ds);
    }
    CHECK(bad == 0);
    CHECK(ok < 4000);
}

static int write_temp(char *path, const unsigned char *buf, size_t len) {
    int fd;
    FILE *f;
    strcpy(path, "/tmp/mixprec_test_errors_XXXXXX");
    if ((fd = mkstemp(path)) < 0) return 0;
    if (!(f = fdopen(fd, "wb"))) return close(fd), unlink(path), 0;
    if (len && fwrite(buf, 1, len, f) != len) return fclose(f), unlink(path), 0;
    return fclose(f) == 0;
}

static void test_idx_files(void) {
    unsigned char img[64], lab[16];
    static const unsigned char values[3] = {1, 0, 2};
    size_t il = make_images(img, 3, 2, 2), ll = make_labels(lab, 3, values);
    char pi[64], pl[64], pt[64], pe[64];
    mp_dataset ds;
    memset(&ds, 0, sizeof ds);
    if (!CHECK(write_temp(pi, img, il) && write_temp(pl, lab, ll) && write_temp(pt, img, il - 3) &&
               write_temp(pe, img, 0)))
        return;
    CHECK_ST(mp_load_idx(pi, pl, &ds), MP_OK);
    CHECK(ds.n == 3 && ds.rows == 2 && ds.cols == 2 && ds.classes == 3 && ds.x && ds.x[1] == 1.0f);
    mp_dataset_free(&ds);
    memset(&ds, 0, sizeof ds);
    CHECK_ST(mp_load_idx("/nonexistent/mixprec/images.idx", pl, &ds), MP_ERR_IO);
    CHECK_ST(mp_load_idx(pi, "/nonexistent/mixprec/labels.idx", &ds), MP_ERR_IO);
    CHECK_ST(mp_load_idx("/tmp", pl, &ds), MP_ERR_IO); /* a directory opens but does not read */
    CHECK_ST(mp_load_idx(pt, pl, &ds), MP_ERR_FORMAT);  /* truncated */
    CHECK_ST(mp_load_idx(pe, pl, &ds), MP_ERR_FORMAT);  /* empty */
    CHECK_ST(mp_load_idx(pl, pi, &ds), MP_ERR_FORMAT);  /* swapped */
    CHECK(ds.x == NULL && ds.labels == NULL);
    unlink(pi), unlink(pl), unlink(pt), unlink(pe);
}

/* >>4b. gzip files: mp_gunzip, and mp_load_idx of `.gz` files. Valid input
   comes from gzip_encode.h: an encoder of our own and gzip -9's own bytes. */

static size_t seq_text(char *out) { /* `seq 1 120` */
    size_t len = 0;
    int i;
    for (i = 1; i <= 120; i++) len += (size_t)sprintf(out + len, "%d\n", i);
    return len;
}

/* mp_gunzip must give exactly want[want_len], and free what it allocated */
static void check_gunzip(const unsigned char *gz, size_t len, const void *want, size_t want_len, int line) {
    void *out = NULL;
    size_t out_len = 0, blocks = t_live_blocks;
    const char *why = NULL;
    mp_status st = mp_gunzip(gz, len, want_len, &out, &out_len, &why);
    if (!check_report(st == MP_OK && out_len == want_len && memcmp(out, want, want_len) == 0, __FILE__, line,
                      "mp_gunzip gives the data"))
        fprintf(stderr, "    %s: %s (%lu bytes)\n", mp_status_name(st), why ? why : "", (unsigned long)out_len);
    mp_gunzip_free(out);
    check_report(t_live_blocks == blocks, __FILE__, line, "mp_gunzip_free frees the output");
}
#define CHECK_GUNZIP(gz, len, want, want_len) check_gunzip((gz), (len), (want), (want_len), __LINE__)

/* mp_gunzip must fail with st, write nothing but why (whose text must hold
   `says`), and leak nothing */
static void check_gunzip_fails(const unsigned char *gz, size_t len, size_t max_out, mp_status want, const char *says,
                               int line) {
    static char sentinel;
    void *out = &sentinel;
    size_t out_len = 7, blocks = t_live_blocks;
    const char *why = NULL;
    mp_status st = mp_gunzip(gz, len, max_out, &out, &out_len, &why);
    if (!check_report(st == want && why && strstr(why, says), __FILE__, line, "mp_gunzip fails as it should"))
        fprintf(stderr, "    got %s \"%s\" (len %lu), want %s \"%s\"\n", mp_status_name(st), why ? why : "(none)",
                (unsigned long)len, mp_status_name(want), says);
    check_report(out == &sentinel && out_len == 7 && t_live_blocks == blocks, __FILE__, line,
                 "a failed mp_gunzip writes nothing and leaks nothing");
}
#define GUNZIP_FAILS(gz, len, max_out, st, says) check_gunzip_fails((gz), (len), (max_out), (st), (says), __LINE__)

static void test_gzip_valid(void) {
    static const int flag_sets[6] = {0, GZ_FTEXT, GZ_FNAME, GZ_FEXTRA | GZ_FCOMMENT, GZ_FHCRC,
                                     GZ_FTEXT | GZ_FHCRC | GZ_FEXTRA | GZ_FNAME | GZ_FCOMMENT};
    unsigned char img[64], d[3000], gz[4096];
    char text[512];
    size_t il = make_images(img, 3, 2, 2), n, len, i;
    int mode, f;
    for (i = 0; i < sizeof d; i++) d[i] = (unsigned char)(i < 1000 ? i * 7 : i < 2000 ? 0 : (i / 300) * 40); /* runs */
    for (mode = GZ_STORED; mode <= GZ_FIXED; mode++)
        for (f = 0; f < 6; f++) {
            len = gz_encode(gz, sizeof gz, img, il, mode, flag_sets[f]);
            CHECK_GUNZIP(gz, len, img, il);
            len = gz_encode(gz, sizeof gz, d, 0, mode, flag_sets[f]); /* empty */
            CHECK_GUNZIP(gz, len, d, 0);
            len = gz_encode(gz, sizeof gz, d, 1, mode, flag_sets[f]);
            CHECK_GUNZIP(gz, len, d, 1);
        }
    len = gz_encode(gz, sizeof gz, d, sizeof d, GZ_FIXED, 0);
    CHECK(len < 2000); /* the runs are matches */
    CHECK_GUNZIP(gz, len, d, sizeof d);
    CHECK_GUNZIP(gz_hello, sizeof gz_hello, "hello, hello, hello, hello!\n", 28);
    CHECK_GUNZIP(gz_images, sizeof gz_images, img, il);
    n = seq_text(text);
    CHECK_GUNZIP(gz_seq, sizeof gz_seq, text, n);
}

/* every prefix of a valid member is truncated; a byte after one is not a member */
static void test_gzip_truncated(void) {
    unsigned char img[64], gz[512];
    size_t il = make_images(img, 3, 2, 2), len, k;
    const unsigned char *members[5];
    size_t lens[5];
    int i;
    lens[0] = gz_encode(gz, 128, img, il, GZ_STORED, GZ_FHCRC | GZ_FEXTRA | GZ_FNAME | GZ_FCOMMENT), members[0] = gz;
    lens[1] = gz_encode(gz + 128, 128, img, il, GZ_FIXED, GZ_FEXTRA), members[1] = gz + 128;
    members[2] = gz_hello, lens[2] = sizeof gz_hello;
    members[3] = gz_images, lens[3] = sizeof gz_images;
    members[4] = gz_seq, lens[4] = sizeof gz_seq;
    for (i = 0; i < 5; i++) {
        check_fold_begin();
        for (k = 0; k < lens[i]; k++) {
            unsigned char *cut = (unsigned char *)malloc(k ? k : 1); /* its exact size: ASan sees a read past it */
            if (!cut) continue;
            memcpy(cut, members[i], k);
            GUNZIP_FAILS(cut, k, 1 << 20, MP_ERR_FORMAT, k >= 2 ? "truncated" : "gzip: ");
            free(cut);
        }
        CHECK_FOLD("every prefix of a member is MP_ERR_FORMAT, truncated");
    }
    len = lens[1];
    memcpy(gz + 256, members[1], len);
    gz[256 + len] = 0, gz[257 + len] = 0;
    CHECK_GUNZIP(gz + 256, len + 2, img, il); /* zero padding */
    gz[256 + len] = 0x1F;
    GUNZIP_FAILS(gz + 256, len + 1, 1 << 20, MP_ERR_FORMAT, "truncated"); /* half a magic */
    gz[256 + len + 1] = 0;
    GUNZIP_FAILS(gz + 256, len + 2, 1 << 20, MP_ERR_FORMAT, "no gzip magic");
    GUNZIP_FAILS(gz, 0, 1 << 20, MP_ERR_FORMAT, "truncated");
}

/* flipped bits: never a crash; what is accepted is the original data, and
   only a flip of the header's unchecked fields (FTEXT, mtime, XFL, OS, the
   name) or of the last block's padding bits is accepted */
static void test_gzip_corrupt(void) {
    unsigned char img[64], gz[256], b[256];
    size_t il = make_images(img, 3, 2, 2), len, bit, at;
    unsigned ok = 0, other = 0, wrong = 0, misplaced = 0;
    const unsigned char *src[3];
    size_t lens[3], header[3] = {21, 18, 10}; /* 10 + the name and its zero */
    int s;
    lens[0] = gz_encode(gz, sizeof gz, img, il, GZ_FIXED, GZ_FNAME), src[0] = gz;
    src[1] = gz_images, lens[1] = sizeof gz_images;
    src[2] = gz_seq, lens[2] = sizeof gz_seq;
    for (s = 0; s < 3; s++) {
        len = lens[s];
        for (bit = 0; bit < 8 * len; bit++) {
            void *out = NULL;
            size_t out_len = 0;
            const char *why = NULL;
            mp_status st;
            memcpy(b, src[s], len);
            b[bit / 8] ^= (unsigned char)(1u << (bit % 8));
            st = mp_gunzip(b, len, 1 << 20, &out, &out_len, &why);
            if (st == MP_OK) {
                ok++, at = bit / 8;
                if (s != 2 ? out_len != il || memcmp(out, img, il) != 0 : out_len != 372) wrong++;
                if (at == 3 ? bit % 8 != 0 : at < 4 || (at >= header[s] && at != len - 9)) misplaced++;
                mp_gunzip_free(out);
            } else if (st != MP_ERR_FORMAT || !why || strncmp(why, "gzip: ", 6) != 0) {
                other++;
            }
        }
    }
    CHECK(other == 0 && wrong == 0 && misplaced == 0);
    CHECK(ok > 0);
}

static size_t with_trailer(unsigned char *gz, size_t len, uint32_t crc, uint32_t isize) {
    size_t i;
    for (i = 0; i < 4; i++) gz[len - 8 + i] = (unsigned char)(crc >> (8 * i)), gz[len - 4 + i] = (unsigned char)(isize >> (8 * i));
    return len;
}

static void test_gzip_checks(void) {
    unsigned char img[64], gz[256], b[256];
    size_t il = make_images(img, 3, 2, 2), len = gz_encode(gz, sizeof gz, img, il, GZ_STORED, GZ_FHCRC);
    uint32_t crc = crc32_bits(img, il);
    bitw w = {b, 0, sizeof b, 0, 0};
    memcpy(b, gz, len);
    GUNZIP_FAILS(b, with_trailer(b, len, crc ^ 1u, (uint32_t)il), 1 << 20, MP_ERR_FORMAT, "CRC-32 mismatch");
    GUNZIP_FAILS(b, with_trailer(b, len, crc, (uint32_t)il + 1), 1 << 20, MP_ERR_FORMAT, "ISIZE mismatch");
    mp_reset_peak_memory();
    GUNZIP_FAILS(b, with_trailer(b, len, crc, 0xFFFFFFF0u), 1 << 30, MP_ERR_FORMAT, "ISIZE mismatch");
    CHECK(mp_get_memory_info().peak < (1u << 20)); /* ISIZE is a hint, bounded by deflate's ratio */
    with_trailer(b, len, crc, (uint32_t)il);
    CHECK_GUNZIP(b, len, img, il);
    b[10] ^= 1, GUNZIP_FAILS(b, len, 1 << 20, MP_ERR_FORMAT, "CRC-16"), b[10] ^= 1;
    b[0] = 0x1E, GUNZIP_FAILS(b, len, 1 << 20, MP_ERR_FORMAT, "magic"), b[0] = 0x1F;
    b[2] = 7, GUNZIP_FAILS(b, len, 1 << 20, MP_ERR_FORMAT, "not deflate"), b[2] = 8;
    b[3] |= 0x20, GUNZIP_FAILS(b, len, 1 << 20, MP_ERR_FORMAT, "reserved flag"), b[3] &= 0x1F;
    b[14] ^= 1, GUNZIP_FAILS(b, len, 1 << 20, MP_ERR_FORMAT, "complement"), b[14] ^= 1; /* a stored LEN */
    b[12] |= 6, GUNZIP_FAILS(b, len, 1 << 20, MP_ERR_FORMAT, "reserved type 3"), b[12] &= 0xF9;
    /* the output limit: exactly the data fits, one byte less does not */
    CHECK_GUNZIP(b, len, img, il);
    GUNZIP_FAILS(b, len, il - 1, MP_ERR_SIZE, "output limit");
    /* a match before the first byte: literal 'a', then distance 2 */
    put_bits(&w, 0x1F, 8), put_bits(&w, 0x8B, 8), put_bits(&w, 8, 8), put_bits(&w, 0, 8);
    put_le32(&w, 0), put_bits(&w, 0, 16), put_bits(&w, 1, 1), put_bits(&w, 1, 2);
    fixed_symbol(&w, 'a'), fixed_match(&w, 3, 1), fixed_symbol(&w, 256), put_bits(&w, 0, (8 - w.n) & 7);
    put_le32(&w, 0), put_le32(&w, 4);
    GUNZIP_FAILS(b, w.len, 1 << 20, MP_ERR_FORMAT, "distance too far back");
    CHECK_ST(mp_gunzip(NULL, len, 1, (void **)&w.p, &w.len, NULL), MP_ERR_NULL);
    CHECK_ST(mp_gunzip(gz, len, 1, NULL, &w.len, NULL), MP_ERR_NULL);
    CHECK_ST(mp_gunzip(gz, len, 1, (void **)&w.p, NULL, NULL), MP_ERR_NULL);
    CHECK(w.p == b); /* untouched */
    mp_gunzip_free(NULL);
}

/* members are joined; one that fails fails the whole */
static void test_gzip_members(void) {
    unsigned char img[64], gz[512], want[128];
    size_t il = make_images(img, 3, 2, 2), len;
    len = gz_encode(gz, 128, img, 8, GZ_STORED, GZ_FNAME);
    len += gz_encode(gz + len, 128, img + 8, il - 8, GZ_FIXED, 0);
    CHECK_GUNZIP(gz, len, img, il);
    memcpy(gz + len, gz_hello, sizeof gz_hello);
    memcpy(want, img, il), memcpy(want + il, "hello, hello, hello, hello!\n", 28);
    CHECK_GUNZIP(gz, len + sizeof gz_hello, want, il + 28);
    memset(gz + len, 0, 3), memcpy(gz + len + 3, gz_hello, sizeof gz_hello); /* padding between members */
    CHECK_GUNZIP(gz, len + 3 + sizeof gz_hello, want, il + 28);
    gz[len + 3 + sizeof gz_hello - 5] ^= 1; /* the second member's CRC */
    GUNZIP_FAILS(gz, len + 3 + sizeof gz_hello, 1 << 20, MP_ERR_FORMAT, "CRC-32 mismatch");
    GUNZIP_FAILS(gz, len + 3 + sizeof gz_hello, il + 27, MP_ERR_SIZE, "output limit"); /* the limit is on the sum */
}

/* a gzip bomb: 1 GiB of zeros in about 6.5 MB (fixed codes: a literal, then
   matches of 258 at distance 1). header_len bytes of head go first. */
static unsigned char *make_bomb(size_t *len, const unsigned char *head, size_t header_len) {
    size_t total = (size_t)1 << 30, done, cap = 7u << 20;
    bitw w;
    w.p = (unsigned char *)malloc(cap), w.len = 0, w.cap = cap, w.acc = 0, w.n = 0;
    if (!w.p) return NULL;
    put_bits(&w, 0x1F, 8), put_bits(&w, 0x8B, 8), put_bits(&w, 8, 8), put_bits(&w, 0, 8);
    put_le32(&w, 0), put_bits(&w, 0, 16), put_bits(&w, 1, 1), put_bits(&w, 1, 2);
    for (done = 0; done < header_len; done++) fixed_symbol(&w, head[done]);
    fixed_symbol(&w, 0), done++;
    for (; total - done >= 258; done += 258) fixed_match(&w, 258, 0);
    for (; done < total; done++) fixed_symbol(&w, 0);
    fixed_symbol(&w, 256), put_bits(&w, 0, (8 - w.n) & 7);
    put_le32(&w, 0), put_le32(&w, (uint32_t)total);
    *len = w.len;
    return w.len <= cap ? w.p : (free(w.p), (unsigned char *)NULL);
}

static void test_gzip_bomb(void) {
    static const unsigned char labels_head[8] = {0, 0, 8, 1, 0, 1, 0x86, 0xA0}; /* 100000 labels */
    unsigned char *bomb;
    size_t len;
    char path[64], why[256];
    mp_dataset ds;
    memset(&ds, 0, sizeof ds);
    if (!CHECK((bomb = make_bomb(&len, NULL, 0)) != NULL)) return;
    mp_reset_peak_memory();
    GUNZIP_FAILS(bomb, len, (size_t)16 << 20, MP_ERR_SIZE, "output limit");
    CHECK(mp_get_memory_info().peak <= ((size_t)16 << 20) + 4096);
    if (CHECK(write_temp(path, bomb, len))) { /* as a file: no IDX header, so refused after 64 KiB */
        mp_reset_peak_memory();
        CHECK_ST(mp_load_idx_why(path, path, &ds, why, sizeof why), MP_ERR_FORMAT);
        CHECK(strstr(why, path) && strstr(why, "not an IDX file"));
        CHECK(mp_get_memory_info().peak <= len + (200u << 10));
        unlink(path);
    }
    free(bomb);
    if (!CHECK((bomb = make_bomb(&len, labels_head, 8)) != NULL)) return;
    if (CHECK(write_temp(path, bomb, len))) { /* an IDX header that says 100008 bytes */
        mp_reset_peak_memory();
        CHECK_ST(mp_load_idx_why(path, path, &ds, why, sizeof why), MP_ERR_FORMAT);
        CHECK(strstr(why, "more bytes than the dimensions say") != NULL);
        CHECK(mp_get_memory_info().peak <= len + (300u << 10));
        unlink(path);
    }
    free(bomb);
    CHECK(ds.x == NULL);
}

static int write_gz_temp(char *path, const unsigned char *d, size_t n, int mode) {
    unsigned char gz[512];
    size_t len = gz_encode(gz, sizeof gz, d, n, mode, GZ_FNAME);
    return len <= sizeof gz && write_temp(path, gz, len);
}

static void test_gzip_files(void) {
    unsigned char img[64], lab[16], bad[512];
    static const unsigned char values[3] = {1, 0, 2};
    size_t il = make_images(img, 3, 2, 2), ll = make_labels(lab, 3, values), k, blocks;
    char gi[64], gl[64], pl[64], gc[64], gw[64], why[256];
    mp_dataset ds;
    mp_status st;
    memset(&ds, 0, sizeof ds);
    if (!CHECK(write_gz_temp(gi, img, il, GZ_FIXED) && write_gz_temp(gl, lab, ll, GZ_STORED) && write_temp(pl, lab, ll) &&
               write_gz_temp(gw, lab, ll - 1, GZ_FIXED) && write_temp(gc, gz_images, sizeof gz_images - 5)))
        return;
    CHECK_ST(mp_load_idx(gi, gl, &ds), MP_OK);
    CHECK(ds.n == 3 && ds.rows == 2 && ds.cols == 2 && ds.classes == 3 && ds.x && ds.x[1] == 1.0f && ds.labels[0] == 1);
    mp_dataset_free(&ds);
    CHECK_ST(mp_load_idx_why(gi, pl, &ds, why, sizeof why), MP_OK); /* gzip images, plain labels */
    CHECK(why[0] == '\0' && ds.n == 3);
    mp_dataset_free(&ds);
    CHECK_ST(mp_load_idx_why(gc, gl, &ds, why, sizeof why), MP_ERR_FORMAT); /* a truncated .gz */
    CHECK(strncmp(why, gc, strlen(gc)) == 0 && strstr(why, ": gzip: truncated"));
    CHECK_ST(mp_load_idx_why(gi, gw, &ds, why, sizeof why), MP_ERR_FORMAT); /* a label short */
    CHECK(strstr(why, gw) && strstr(why, "IDX: truncated"));
    CHECK_ST(mp_load_idx_why(gl, gi, &ds, why, sizeof why), MP_ERR_FORMAT); /* swapped */
    CHECK(strstr(why, "3 dimensions") != NULL);
    CHECK_ST(mp_load_idx_why("/nonexistent/mixprec/a.gz", gl, &ds, why, sizeof why), MP_ERR_IO);
    CHECK(strstr(why, "/nonexistent/mixprec/a.gz: ") == why && strlen(why) > 28);
    CHECK_ST(mp_load_idx_why(gi, gl, &ds, why, 8), MP_OK);
    mp_dataset_free(&ds);
    CHECK_ST(mp_load_idx_why(gc, gl, &ds, why, 8), MP_ERR_FORMAT); /* cut to fit */
    CHECK(strlen(why) == 7);
    CHECK_ST(mp_load_idx_why(NULL, gl, &ds, why, sizeof why), MP_ERR_NULL);
    CHECK_ST(mp_load_idx_why(gc, gl, &ds, NULL, 0), MP_ERR_FORMAT);
    /* corrupt .gz files: each fails with a message, and leaks nothing */
    k = gz_encode(bad, sizeof bad, img, il, GZ_FIXED, 0);
    bad[k - 8] ^= 0x10;
    unlink(gc);
    if (CHECK(write_temp(gc, bad, k))) {
        CHECK_ST(mp_load_idx_why(gc, gl, &ds, why, sizeof why), MP_ERR_FORMAT);
        CHECK(strstr(why, "CRC-32 mismatch") != NULL);
    }
    /* an allocation failure at each allocation: MP_ERR_ALLOC, nothing leaked */
    blocks = t_live_blocks;
    check_fold_begin();
    for (k = 1; k < 64; k++) {
        t_count = 0, t_fail_at = k, t_failed = 0;
        st = mp_load_idx(gi, gl, &ds);
        t_fail_at = 0;
        CHECK(t_failed ? st == MP_ERR_ALLOC && ds.x == NULL : st == MP_OK);
        CHECK(t_live_blocks == blocks + (st == MP_OK ? 2 : 0));
        mp_dataset_free(&ds);
        if (!t_failed) break;
    }
    CHECK_FOLD("an allocation failure in loading .gz files is MP_ERR_ALLOC and leaks nothing");
    CHECK(k > 4 && k < 64);
    CHECK(ds.x == NULL);
    unlink(gi), unlink(gl), unlink(pl), unlink(gw), unlink(gc);
}

/* The Debian package's files as they ship (dataset-fashion-mnist), where
   installed: 60000 and 10000 images of 28x28, 6000 and 1000 of each class,
   the first of each split an ankle boot (9) as Keras's load_data gives. */
static void test_gzip_package(void) {
    static const char *const dir = "/usr/share/datasets/fashion-mnist";
    static const char *const split[2] = {"train", "t10k"};
    char pi[256], pl[256], why[512];
    size_t count[10], i;
    int s, c;
    mp_dataset ds;
    for (s = 0; s < 2; s++) {
        snprintf(pi, sizeof pi, "%s/%s-images-idx3-ubyte.gz", dir, split[s]);
        snprintf(pl, sizeof pl, "%s/%s-labels-idx1-ubyte.gz", dir, split[s]);
        if (access(pi, R_OK) != 0 || access(pl, R_OK) != 0) {
            printf("skip: gzip_package: %s not installed (apt-get install dataset-fashion-mnist)\n", pi);
            continue;
        }
        memset(&ds, 0, sizeof ds);
        if (!CHECK(mp_load_idx_why(pi, pl, &ds, why, sizeof why) == MP_OK)) {
            fprintf(stderr, "    %s\n", why);
            continue;
        }
        memset(count, 0, sizeof count);
        for (i = 0; i < ds.n; i++) count[ds.labels[i]]++;
        CHECK(ds.n == (s ? 10000u : 60000u) && ds.rows == 28 && ds.cols == 28 && ds.classes == 10 && ds.labels[0] == 9);
        for (c = 0; c < 10; c++) CHECK(count[c] == ds.n / 10);
        mp_dataset_free(&ds);
    }
}

/* >>6. tensors */

static void test_tensor_alloc(void) {
    static const int ok_shape[4] = {2, 3, 1, 5}, neg[4] = {2, -3, 1, 5};
    static const int over[4] = {65536, 65536, 65536, 65536};        /* 2^64 elements */
    static const int bytes_over[3] = {INT_MAX, INT_MAX, 4};         /* elements fit, bytes do not */
    static const int huge[2] = {1 << 20, 1 << 20};                  /* 4 TiB: fits, but no memory */
    mp_tensor t;
    size_t before = mp_get_memory_info().current;
    mp_memory_info mi;
    memset(&t, 0, sizeof t);
    CHECK_ST(mp_tensor_alloc(&t, MP_FLOAT32, 0, ok_shape), MP_ERR_ARG);
    CHECK_ST(mp_tensor_alloc(&t, MP_FLOAT32, 5, ok_shape), MP_ERR_ARG);
    CHECK_ST(mp_tensor_alloc(&t, MP_FLOAT32, -1, ok_shape), MP_ERR_ARG);
    CHECK_ST(mp_tensor_alloc(&t, MP_FLOAT32, 4, neg), MP_ERR_ARG);
    CHECK_ST(mp_tensor_alloc(&t, (mp_dtype)7, 4, ok_shape), MP_ERR_DTYPE);
    CHECK_ST(mp_tensor_alloc(&t, MP_FLOAT16, 4, over), MP_ERR_SIZE);
    CHECK_ST(mp_tensor_alloc(&t, MP_FLOAT32, 3, bytes_over), MP_ERR_SIZE);
    CHECK_ST(mp_tensor_alloc(&t, MP_BFLOAT16, 3, bytes_over), MP_ERR_SIZE);
    CHECK_ST(mp_tensor_alloc(&t, MP_FLOAT32, 2, huge), MP_ERR_ALLOC);
    CHECK(t.data == NULL && mp_get_memory_info().current == before);
    CHECK_ST(mp_tensor_alloc(&t, MP_FLOAT16, 4, ok_shape), MP_OK);
    CHECK(t.data && t.rank == 4 && t.shape[3] == 5 && mp_tensor_count(&t) == 30 && mp_tensor_bytes(&t) == 60);
    CHECK(mp_get_memory_info().current >= before + 60);
    mp_tensor_free(&t);
    CHECK(t.data == NULL && mp_get_memory_info().current == before);
    mp_reset_peak_memory();
    mi = mp_get_memory_info();
    CHECK(mi.peak == mi.current && mi.current == before);
}

/* >>5. an allocation failure at every allocation of a scenario */
#define SN 8 /* samples of 6x6x1, 3 classes */
static float sx[SN * 36];
static int32_t sl[SN];
static unsigned char simg[16 + SN * 4], slab[8 + SN];
static size_t simg_len, slab_len;
static char simg_path[64], slab_path[64]; /* the same as files */

typedef struct scen {
    mp_model *m;
    mp_dataset ds, loaded;
    mp_tensor t;
    float w[256], pred[SN * 3], loss;
    mp_logs hist[1], logs;
    size_t correct;
    int applied;
    char summary[4096];
} scen;

/* a graph: Conv2D - BatchNormalization - MaxPooling2D - Flatten - Dropout,
   which two Dense layers read and an Add sums, then Dense and softmax */
static const char *const step_names[] = {
    "create", "add Conv2D", "add BatchNormalization", "add MaxPooling2D", "add Flatten", "add Dropout",
    "add Dense 4", "call Dense 4 on Dropout", "call Add", "add Dense 3", "add Activation", "compile",
    "get_weights", "set_weights", "fit", "evaluate", "predict", "forward", "compute_loss",
    "compute_scaled_gradients", "get_unscaled_gradients", "apply_gradients", "summary", "dataset_from_idx",
    "tensor_alloc", "load_idx"};
#define NSTEPS ((int)(sizeof step_names / sizeof step_names[0]))
#define FIRST_BUILT 12 /* steps from here on have a built model */
#define FIT_STEP (FIRST_BUILT + 2)
#define DATA_STEP (FIRST_BUILT + 11) /* from here on, not the model's */

static mp_status build_step(scen *s, int i) {
    mp_model_desc md = model_desc(6, 6, 1);
    mp_layer_desc d;
    mp_compile_desc cd;
    static const int dropout = 5, branches[2] = {6, 7};
    switch (i) {
    case 0: md.seed = 11; return mp_model_create(&s->m, &md);
    case 1: return mp_model_add(s->m, mp_conv2d(2, 3, 3, MP_SAME, MP_RELU));
    case 2: return mp_model_add(s->m, mp_batch_normalization());
    case 3: return mp_model_add(s->m, mp_max_pooling2d(2, 2));
    case 4: return mp_model_add(s->m, mp_flatten());
    case 5: return mp_model_add(s->m, mp_dropout(0.25f));
    case 6: return mp_model_add(s->m, mp_dense(4, MP_RELU));
    case 7: return mp_model_call(s->m, mp_dense(4, MP_TANH), &dropout, 1, NULL);
    case 8: return mp_model_call(s->m, mp_add(), branches, 2, NULL);
    case 9: return mp_model_add(s->m, mp_dense(3, MP_LINEAR));
    case 10: d = mp_activation_layer(MP_SOFTMAX), d.dtype = "float32"; return mp_model_add(s->m, d);
    default: cd = compile_desc(MP_SPARSE_CATEGORICAL_CROSSENTROPY, MP_ADAM); return mp_model_compile(s->m, &cd);
    }
}

static mp_status run_step(scen *s, int i) {
    static const int tshape[3] = {3, 4, 5};
    size_t n = mp_model_param_count(s->m);
    mp_fit_desc fd;
    mp_data d = data_xy(sx, 36, sl, SN);
    if (i < FIRST_BUILT) return build_step(s, i);
    if (n > 256) return MP_ERR_SIZE; /* the test's buffer */
    switch (i - FIRST_BUILT) {
    case 0: return mp_model_get_weights(s->m, s->w, n);
    case 1: return mp_model_set_weights(s->m, s->w, n);
    case 2:
        fd = silent_fit(sx, 36, sl, SN, 3, 1), fd.validation_split = 0.25f, fd.history = s->hist;
        return mp_model_fit(s->m, &fd);
    case 3: return mp_model_evaluate(s->m, &d, 4, &s->logs);
    case 4: return mp_model_predict(s->m, &d, 3, s->pred, sizeof s->pred / sizeof s->pred[0]);
    case 5: d.x[0].n = d.y.n = 4; return mp_forward(s->m, &d, 1);
    case 6: d.x[0].n = d.y.n = 4; return mp_compute_loss(s->m, &d.y, &s->loss, &s->correct);
    case 7: return mp_compute_scaled_gradients(s->m);
    case 8: return mp_get_unscaled_gradients(s->m);
    case 9: return mp_apply_gradients(s->m, &s->applied);
    case 10: return mp_model_summary(s->m, s->summary, sizeof s->summary);
    case 11: return mp_dataset_from_idx(simg, simg_len, slab, slab_len, &s->ds);
    case 12: return mp_tensor_alloc(&s->t, MP_FLOAT16, 3, tshape);
    default: return mp_load_idx(simg_path, slab_path, &s->loaded);
    }
}

static void init_scenario_data(void) {
    static unsigned char values[SN];
    int i;
    for (i = 0; i < SN * 36; i++) sx[i] = (float)((i * 13) % 17) / 16.0f;
    for (i = 0; i < SN; i++) sl[i] = (i * 5) % 3, values[i] = (unsigned char)sl[i];
    simg_len = make_images(simg, SN, 2, 2);
    slab_len = make_labels(slab, SN, values);
    CHECK(write_temp(simg_path, simg, simg_len) && write_temp(slab_path, slab, slab_len));
}

static uint64_t train_steps(const mp_model *m) {
    const mp_loss_scale *ls = m ? mp_model_loss_scale(m) : NULL;
    return ls ? ls->steps : 0;
}

static float ref_final[256];   /* the final weights without a failure */
static size_t ref_allocs;      /* the allocations the scenario makes */

/* the failed call's status and its effects; then, with allocation working
   again, the failed step and all after it must succeed */
static void check_failure(scen *s, size_t k, int step, mp_status st, const float *w0, uint64_t steps0) {
    char what[160];
    int i;
    snprintf(what, sizeof what, "allocation %lu fails in step %d (%s): the call returns MP_ERR_ALLOC",
             (unsigned long)k, t_fail_step, t_fail_step >= 0 ? step_names[t_fail_step] : "?");
    if (!check_report(step == t_fail_step && st == MP_ERR_ALLOC, __FILE__, __LINE__, what))
        fprintf(stderr, "    got %s from step %d (%s)\n", mp_status_name(st), step, step >= 0 ? step_names[step] : "none");
    if (step < 0) return;
    if (verbose) printf("  allocation %2lu fails in %-16s %s\n", (unsigned long)k, step_names[step], s->m ? mp_model_error(s->m) : "");
    check_report(mp_status_message(st)[0] != '\0', __FILE__, __LINE__, "mp_status_message is not empty");
    if (step == 0) check_report(s->m == NULL, __FILE__, __LINE__, "a failed create leaves *out NULL");
    snprintf(what, sizeof what, "allocation %lu failed in %s: mp_model_error() mentions alloc or memory",
             (unsigned long)k, step_names[step]);
    if (s->m && step < DATA_STEP && !check_report(mentions(mp_model_error(s->m), "alloc|memory"), __FILE__, __LINE__, what))
        fprintf(stderr, "    mp_model_error() = \"%s\"\n", mp_model_error(s->m));
    if (step >= FIRST_BUILT && w0 && (step != FIT_STEP || train_steps(s->m) == steps0)) {
        snprintf(what, sizeof what, "allocation %lu: the failed %s left the weights unchanged", (unsigned long)k,
                 step_names[step]);
        check_report(same_weights(s->m, w0), __FILE__, __LINE__, what);
    }
    if (step == DATA_STEP) check_report(s->ds.x == NULL && s->ds.labels == NULL, __FILE__, __LINE__, "failed dataset: out untouched");
    if (step == DATA_STEP + 2) check_report(s->loaded.x == NULL && s->loaded.labels == NULL, __FILE__, __LINE__, "failed load: out untouched");
    if (step == DATA_STEP + 1) check_report(s->t.data == NULL, __FILE__, __LINE__, "failed tensor_alloc: data NULL");
    for (i = step; i < NSTEPS; i++) {
        mp_status r = run_step(s, i);
        snprintf(what, sizeof what, "allocation %lu failed in %s; then %s succeeds", (unsigned long)k, step_names[step],
                 step_names[i]);
        if (!check_report(r == MP_OK, __FILE__, __LINE__, what)) {
            fprintf(stderr, "    got %s: %s\n", mp_status_name(r), s->m ? mp_model_error(s->m) : "");
            break;
        }
    }
    if (i == NSTEPS && step < FIT_STEP && s->m) { /* nothing had trained: the same result as without failure */
        snprintf(what, sizeof what, "allocation %lu failed in %s; the final weights are as without failure",
                 (unsigned long)k, step_names[step]);
        check_report(same_weights(s->m, ref_final), __FILE__, __LINE__, what);
    }
}

/* one run with allocation k failing (0: none) */
static void run_scenario(size_t k) {
    scen *s = (scen *)calloc(1, sizeof *s);
    size_t start = mp_get_memory_info().current, blocks = t_live_blocks, bytes = t_live_bytes;
    float *w0 = NULL;
    uint64_t steps0 = 0;
    mp_status st = MP_OK;
    int i, failed_step = -1;
    char what[120];
    if (!CHECK(s != NULL)) return;
    t_count = 0, t_fail_at = k, t_failed = 0, t_fail_step = -1;
    for (i = 0; i < NSTEPS && st == MP_OK; i++) {
        if (i >= FIRST_BUILT) free(w0), w0 = weights(s->m), steps0 = train_steps(s->m);
        t_cur_step = i;
        if ((st = run_step(s, i)) != MP_OK) failed_step = i;
    }
    t_cur_step = -1, t_fail_at = 0;
    if (k == 0) {
        ref_allocs = t_count;
        if (!CHECK(st == MP_OK && mp_model_loss_scale(s->m) != NULL))
            fprintf(stderr, "    the scenario fails without allocation failures: step %d, %s: %s\n", failed_step,
                    mp_status_name(st), s->m ? mp_model_error(s->m) : "");
        if (st == MP_OK) t_suspend++, mp_model_get_weights(s->m, ref_final, mp_model_param_count(s->m)), t_suspend--;
    } else if (t_failed) {
        check_failure(s, k, failed_step, st, w0, steps0);
    } else {
        snprintf(what, sizeof what, "allocation %lu happens: the scenario allocates the same each run", (unsigned long)k);
        check_report(0, __FILE__, __LINE__, what);
    }
    free(w0);
    mp_model_destroy(s->m);
    if (k == 0) CHECK(s->loaded.n == SN && s->loaded.x && s->loaded.x[1] == 1.0f && s->loaded.classes == 3);
    mp_dataset_free(&s->ds);
    mp_dataset_free(&s->loaded);
    mp_tensor_free(&s->t);
    free(s);
    snprintf(what, sizeof what, "allocation %lu fails: nothing leaks", (unsigned long)k);
    if (!check_report(t_live_blocks == blocks && t_live_bytes == bytes && mp_get_memory_info().current == start,
                      __FILE__, __LINE__, what))
        fprintf(stderr, "    %lu blocks, %lu bytes leaked; mp_get_memory_info().current %lu, was %lu\n",
                (unsigned long)(t_live_blocks - blocks), (unsigned long)(t_live_bytes - bytes),
                (unsigned long)mp_get_memory_info().current, (unsigned long)start);
}

/* No allocation per step: once a model has seen its batch size, a fit
   allocates only its shuffle order, whatever the epochs and steps, and the
   custom loop allocates nothing (the activation block and the GEMM panels
   are sized up front). A conv net under each policy, 2 threads. */
static void test_no_allocation_per_step(void) {
    static const char *const policies[] = {"float32", "mixed_float16", "mixed_bfloat16"};
    enum { N = 24, H = 6 };
    static float img[N * H * H * 2];
    static int32_t lab[N];
    size_t p, i, before;
    for (i = 0; i < N * H * H * 2; i++) img[i] = (float)((i * 13) % 17) / 17.0f;
    for (i = 0; i < N; i++) lab[i] = (int32_t)(i % 3);
    for (p = 0; p < 3; p++) {
        mp_model_desc md = model_desc(H, H, 2);
        mp_compile_desc cd = compile_desc(MP_SPARSE_CATEGORICAL_CROSSENTROPY, MP_ADAM);
        mp_fit_desc fd = silent_fit(img, H * H * 2, lab, N, 4, 1);
        mp_model *m = NULL;
        float loss;
        int applied, step, ok;
        mp_data b = data_xy(img, H * H * 2, lab, 4);
        md.threads = 2;
        CHECK_ST(mp_set_global_policy_name(policies[p]), MP_OK);
        ok = mp_model_create(&m, &md) == MP_OK && mp_model_add(m, mp_conv2d(4, 3, 3, MP_SAME, MP_RELU)) == MP_OK &&
             mp_model_add(m, mp_max_pooling2d(2, 2)) == MP_OK && mp_model_add(m, mp_flatten()) == MP_OK &&
             mp_model_add(m, mp_dense(3, MP_SOFTMAX)) == MP_OK && mp_model_compile(m, &cd) == MP_OK &&
             mp_model_fit(m, &fd) == MP_OK;
        if (!CHECK(ok)) { mp_model_destroy(m); continue; }
        before = t_count;
        fd.epochs = 3; /* 18 steps */
        CHECK_ST(mp_model_fit(m, &fd), MP_OK);
        if (!CHECK(t_count - before == 1)) fprintf(stderr, "    %s: fit allocated %zu times\n", policies[p], t_count - before);
        before = t_count;
        for (step = 0; step < 5; step++) {
            mp_forward(m, &b, 1);
            mp_compute_loss(m, &b.y, &loss, NULL);
            mp_compute_scaled_gradients(m);
            mp_get_unscaled_gradients(m);
            mp_apply_gradients(m, &applied);
        }
        if (!CHECK(t_count == before)) fprintf(stderr, "    %s: the loop allocated %zu times\n", policies[p], t_count - before);
        mp_model_destroy(m);
    }
    CHECK_ST(mp_set_global_policy_name("float32"), MP_OK);
}

static void test_alloc_failures(void) {
    size_t k;
    CHECK_ST(mp_set_global_policy_name("mixed_float16"), MP_OK);
    run_scenario(0);
    CHECK(ref_allocs > 0);
    check_fold_begin(); /* how many allocations the scenario makes is the build's: one check */
    for (k = 1; k <= ref_allocs; k++) run_scenario(k);
    CHECK_FOLD("every allocation of the scenario failed once: a clear status, nothing leaked, nothing half-changed");
    CHECK_ST(mp_set_global_policy_name("float32"), MP_OK);
    unlink(simg_path), unlink(slab_path);
    if (verbose) printf("  the scenario makes %lu allocations; each failed once\n", (unsigned long)ref_allocs);
}

int main(int argc, char **argv) {
    check_args(argc, argv);
    verbose = getenv("MP_TEST_VERBOSE") && getenv("MP_TEST_VERBOSE")[0] == '1';
    init_data();
    init_scenario_data();
    RUN(test_null_tensors_layers());
    RUN(test_null_model());
    RUN(test_null_fit_evaluate_predict());
    RUN(test_null_custom_loop());
    RUN(test_null_data());
    RUN(test_shape_dense_after_rank3());
    RUN(test_shape_conv_pool());
    RUN(test_bad_model_desc());
    RUN(test_bad_layer_args());
    RUN(test_bad_loss_scale());
    RUN(test_activation_names());
    RUN(test_bad_compile());
    RUN(test_state());
    RUN(test_sizes_that_do_not_fit());
    RUN(test_labels());
    RUN(test_batch_epochs_split());
    RUN(test_nonfinite_x());
    RUN(test_idx_valid());
    RUN(test_idx_bad_headers());
    RUN(test_idx_prefixes());
    RUN(test_idx_dataset_mismatch());
    RUN(test_idx_fuzz());
    RUN(test_idx_files());
    RUN(test_gzip_valid());
    RUN(test_gzip_truncated());
    RUN(test_gzip_corrupt());
    RUN(test_gzip_checks());
    RUN(test_gzip_members());
    RUN(test_gzip_bomb());
    RUN(test_gzip_files());
    RUN(test_gzip_package());
    RUN(test_tensor_alloc());
    RUN(test_no_allocation_per_step());
    RUN(test_alloc_failures());
    CHECK(t_live_blocks == 0 && mp_get_memory_info().current == 0);
    return check_done("test_errors");
}
