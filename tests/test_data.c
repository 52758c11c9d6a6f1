/* test_data.c - the data contract (>>data, docs/data.md): every entry point
   that reads data (fit, evaluate, predict, fit's validation_data, the custom
   loop's mp_forward and mp_compute_loss) refuses wrong widths, ranks, dtypes
   and counts before anything changes, with a message whose specific part
   comes first; int32 inputs; Keras's defaults (batch_size 0 is 32);
   validation_data against validation_split; mp_to_categorical;
   mp_dataset_data; int32 refused where data is not; the summary's columns;
   MP_ERR_IO's reason; the policy in a checkpoint's mismatch.

   The arrays are heap blocks of exactly the size they describe, so that a
   read past them is AddressSanitizer's heap-buffer-overflow: build with
   gcc -std=c99 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all
   -march=native -pthread tests/test_data.c -o build/td -lm (the matrix does). */
#define _POSIX_C_SOURCE 200112L /* getpid: a token file of its own per process */
#include <unistd.h>
#ifndef TEST_LINKS_MIXPREC /* defined: the implementation is another object's (tests/header_only.c) */
#define MIXPREC_IMPLEMENTATION
#endif
#include "../mixprec.h"
#include "check.h"
#include "helpers.h"
#include <errno.h>

enum { N = 256, F = 6, K = 3 };

/* n x width floats in [-1, 1), in a block of exactly that size */
static float *rows_of(size_t n, size_t width) {
    float *x = floats(n * width);
    size_t i;
    for (i = 0; i < n * width; i++) x[i] = uniform(-1.0f, 1.0f);
    return x;
}
static int32_t *labels_of(size_t n, int classes) {
    int32_t *y = (int32_t *)zalloc(n * sizeof(int32_t));
    size_t i;
    for (i = 0; i < n; i++) y[i] = (int32_t)(rng_next() % (uint64_t)classes);
    return y;
}

/* input (F,) -> Dense(8, relu) -> Dense(K, softmax), compiled with loss */
static mp_model *model6(mp_loss loss) {
    static const int shape[] = {F, 0};
    mp_layer_desc layers[2];
    mp_compile_desc cd;
    mp_model *m;
    layers[0] = mp_dense(8, MP_RELU);
    layers[1] = mp_dense(K, MP_SOFTMAX);
    if (!(m = new_model("float32", shape, layers, 2))) return NULL;
    memset(&cd, 0, sizeof cd);
    cd.loss = loss;
    cd.metrics = MP_METRIC_ACCURACY;
    if (OK(mp_model_compile(m, &cd), m)) return m;
    mp_model_destroy(m);
    return NULL;
}

/* got == want, and mp_model_error() is `prefix...` followed by the
   status's own sentence in parentheses, last */
static int refused(mp_status got, mp_status want, const mp_model *m, const char *prefix, const char *file, int line,
                   const char *what) {
    const char *err = mp_model_error(m), *general = mp_status_message(want);
    size_t n = strlen(err), g = strlen(general);
    int ok = got == want && strncmp(err, prefix, strlen(prefix)) == 0 && n > g + 3 && err[n - 1] == ')' &&
             strncmp(err + n - g - 1, general, g) == 0 && err[n - g - 2] == '(';
    if (!check_report(ok, file, line, what))
        fprintf(stderr, "    got %s: \"%s\"\n    want %s: \"%s...\"\n", mp_status_name(got), err, mp_status_name(want),
                prefix);
    return ok;
}
#define REFUSED(call, want, m, prefix) refused((call), (want), (m), (prefix), __FILE__, __LINE__, #call)

/* The entry points that read data, each given d: fit (batch 32), fit with
   d as validation_data (and valid training data), evaluate, predict (into a
   buffer of exactly the floats d's samples take), mp_forward. */
enum { FIT, VALIDATION, EVALUATE, PREDICT, FORWARD, ENTRIES };
static const char *const entry_names[ENTRIES] = {"fit", "validation_data", "evaluate", "predict", "mp_forward"};
static float *good_x, *good_t; /* 64 valid samples: labels, or their one-hot rows where */
static int32_t *good_y;
static int onehot;             /* the model under test takes categorical targets */

static mp_status call_entry(int entry, mp_model *m, const mp_data *d) {
    mp_fit_desc fd = silent_fit(good_x, F, good_y, 64, 32, 1);
    mp_logs logs;
    if (onehot) fd.data.y = mp_rows(good_t, 64, K);
    float *out;
    mp_status st;
    switch (entry) {
    case FIT: fd.data = *d; return mp_model_fit(m, &fd);
    case VALIDATION: fd.validation_data = *d; return mp_model_fit(m, &fd);
    case EVALUATE: return mp_model_evaluate(m, d, 32, &logs);
    case PREDICT: /* a count past the test's memory is refused before out is looked at */
        out = floats(d->x[0].n <= 4096 ? d->x[0].n * K + 1 : 1);
        st = mp_model_predict(m, d, 32, out, d->x[0].n <= 4096 ? d->x[0].n * K : SIZE_MAX);
        free(out);
        return st;
    default: return mp_forward(m, d, 1);
    }
}

/* d is refused by every entry point (mp_forward: xonly, it reads no y)
   with want and "<entry>: <says>...", and no weight moves. */
static void refused_everywhere(mp_model *m, const mp_data *d, mp_status want, const char *says, int xonly,
                               const char *file, int line) {
    float *w0 = weights_of(m);
    char prefix[256], what[320];
    int e;
    for (e = 0; e < ENTRIES; e++) {
        if (!xonly && (e == PREDICT || e == FORWARD)) continue;
        snprintf(prefix, sizeof prefix, "%s: %s", entry_names[e], says);
        snprintf(what, sizeof what, "%s refuses: %s", entry_names[e], says);
        refused(call_entry(e, m, d), want, m, prefix, file, line, what);
    }
    check_report(weights_equal(m, w0), file, line, "no weight moved");
    free(w0);
}
#define REFUSED_EVERYWHERE(m, d, want, says, xonly) refused_everywhere((m), (d), (want), (says), (xonly), __FILE__, __LINE__)

/* The mistake: a 6-feature model fit on x of 4 features. Keras:
   "expected shape=(None, 6), found shape=(None, 4)". */
static void test_deliberate_mistake(void) {
    mp_model *m = model6(MP_SPARSE_CATEGORICAL_CROSSENTROPY);
    float *x = rows_of(N, 4), *w0;
    int32_t *y = labels_of(N, K);
    mp_fit_desc fd = silent_fit(x, 4, y, N, 32, 1);
    if (!m) return;
    w0 = weights_of(m);
    REFUSED(mp_model_fit(m, &fd), MP_ERR_SHAPE, m,
            "fit: x has 4 values per sample, the model's input takes 6 (input_shape (6,)); expected shape=(None, 6), "
            "found shape=(None, 4) (");
    CHECK(weights_equal(m, w0));
    free(w0), free(x), free(y);
    mp_model_destroy(m);
}

static void test_wrong_widths(void) {
    static const int widths[] = {4, 5, 7, 12};
    mp_model *m = model6(MP_SPARSE_CATEGORICAL_CROSSENTROPY);
    size_t i;
    if (!m) return;
    for (i = 0; i < sizeof widths / sizeof widths[0]; i++) {
        float *x = rows_of(40, (size_t)widths[i]);
        int32_t *y = labels_of(40, K);
        mp_data d = data_xy(x, widths[i], y, 40);
        char says[64];
        snprintf(says, sizeof says, "x has %d values per sample, the model's input takes 6", widths[i]);
        REFUSED_EVERYWHERE(m, &d, MP_ERR_SHAPE, says, 1);
        free(x), free(y);
    }
    mp_model_destroy(m);
}

/* A sample of another shape with the model's count is a reshape: taken,
   and read as the rows it is in memory. */
static void test_reshape_accepted(void) {
    static const int shape[2] = {2, 3};
    mp_model *m = model6(MP_SPARSE_CATEGORICAL_CROSSENTROPY);
    float *x = rows_of(40, F), *a = floats(40 * K), *b = floats(40 * K);
    int32_t *y = labels_of(40, K);
    mp_data rows = data_xy(x, F, y, 40), grid = rows;
    mp_logs la, lb;
    if (!m) return;
    grid.x[0] = mp_array_f32(x, 40, 2, shape);
    OK(mp_model_predict(m, &rows, 16, a, 40 * K), m);
    OK(mp_model_predict(m, &grid, 16, b, 40 * K), m);
    CHECK(memcmp(a, b, 40 * K * sizeof(float)) == 0);
    OK(mp_model_evaluate(m, &rows, 16, &la), m);
    OK(mp_model_evaluate(m, &grid, 16, &lb), m);
    CHECK(la.loss == lb.loss && la.accuracy == lb.accuracy);
    free(x), free(y), free(a), free(b);
    mp_model_destroy(m);
}

static void test_wrong_ranks(void) {
    static const int bad_rank[] = {-1, MP_MAX_RANK + 1, 1000};
    mp_model *m = model6(MP_SPARSE_CATEGORICAL_CROSSENTROPY);
    float *x = rows_of(40, F);
    int32_t *y = labels_of(40, K);
    mp_data d;
    size_t i;
    char says[64];
    if (!m) return;
    for (i = 0; i < sizeof bad_rank / sizeof bad_rank[0]; i++) {
        d = data_xy(x, F, y, 40);
        d.x[0].rank = bad_rank[i];
        snprintf(says, sizeof says, "x's samples have rank %d", bad_rank[i]);
        REFUSED_EVERYWHERE(m, &d, MP_ERR_SHAPE, says, 1);
        d = data_xy(x, F, y, 40);
        d.y.rank = bad_rank[i];
        snprintf(says, sizeof says, "y's samples have rank %d", bad_rank[i]);
        REFUSED_EVERYWHERE(m, &d, MP_ERR_SHAPE, says, 0);
    }
    d = data_xy(x, F, y, 40);
    d.x[0] = mp_array_f32(x, 40, 2, NULL); /* no shape: axes of size 0 */
    REFUSED_EVERYWHERE(m, &d, MP_ERR_SHAPE, "x's sample shape has size 0 on axis 0", 1);
    d.x[0].shape[0] = 2, d.x[0].shape[1] = -3;
    REFUSED_EVERYWHERE(m, &d, MP_ERR_SHAPE, "x's sample shape has size -3 on axis 1", 1);
    d = data_xy(x, F, y, 40);
    d.y.rank = 1, d.y.shape[0] = 2; /* two labels a sample: sequence labels, not this model's */
    REFUSED_EVERYWHERE(m, &d, MP_ERR_SHAPE, "y has 2 values per sample; sparse_categorical_crossentropy takes one", 0);
    d.y.shape[0] = 1; /* (n, 1): Keras's other layout of class indices */
    {
        mp_logs logs;
        OK(mp_model_evaluate(m, &d, 8, &logs), m);
    }
    free(x), free(y);
    mp_model_destroy(m);
}

static void test_wrong_dtypes(void) {
    static const mp_dtype not_data[] = {MP_FLOAT16, MP_BFLOAT16, MP_DTYPE_COUNT, (mp_dtype)99};
    mp_model *m = model6(MP_SPARSE_CATEGORICAL_CROSSENTROPY), *c = model6(MP_CATEGORICAL_CROSSENTROPY);
    float *x = rows_of(40, F), *t = floats(40 * K);
    int32_t *y = labels_of(40, K);
    mp_data d;
    size_t i;
    char says[64];
    if (!m || !c) { mp_model_destroy(m); mp_model_destroy(c); return; }
    for (i = 0; i < sizeof not_data / sizeof not_data[0]; i++) {
        d = data_xy(x, F, y, 40);
        d.x[0].dtype = not_data[i];
        snprintf(says, sizeof says, "x has dtype %s", mp_dtype_name(not_data[i]) ? mp_dtype_name(not_data[i]) : "(not a dtype)");
        REFUSED_EVERYWHERE(m, &d, MP_ERR_DTYPE, says, 1);
    }
    d = data_xy(x, F, NULL, 40);
    d.y = mp_rows(t, 40, 1); /* float class indices */
    REFUSED_EVERYWHERE(m, &d, MP_ERR_DTYPE, "y is float32; sparse_categorical_crossentropy takes int32", 0);
    d = data_xy(x, F, y, 40); /* class indices where one-hot rows are due */
    onehot = 1;
    REFUSED_EVERYWHERE(c, &d, MP_ERR_DTYPE, "y is int32; categorical_crossentropy takes float32 targets, 3", 0);
    OK(mp_to_categorical(y, 40, K, t, 40 * K), NULL);
    d = data_xt(x, F, t, K, 40);
    {
        mp_logs logs;
        OK(mp_model_evaluate(c, &d, 8, &logs), c);
        d.y.shape[0] = K + 1, d.y.n = 30; /* (30, 4) of 120 floats: inside t */
        d.x[0].n = 30;
        REFUSED_EVERYWHERE(c, &d, MP_ERR_SHAPE, "y has 4 values per sample, the model's output has 3 (layer dense_1)", 0);
    }
    onehot = 0;
    free(x), free(y), free(t);
    mp_model_destroy(m);
    mp_model_destroy(c);
}

static void test_wrong_counts(void) {
    mp_model *m = model6(MP_SPARSE_CATEGORICAL_CROSSENTROPY);
    float *x = rows_of(40, F), *x2 = rows_of(40, F);
    int32_t *y = labels_of(40, K);
    mp_data d;
    if (!m) return;
    d = data_xy(x, F, y, 40);
    d.y.n = 39; /* Keras: Data cardinality is ambiguous */
    REFUSED_EVERYWHERE(m, &d, MP_ERR_SHAPE, "x has 40 samples and y 39; Data cardinality is ambiguous", 0);
    d = data_xy(x, F, y, 39);
    d.y.n = 40;
    REFUSED_EVERYWHERE(m, &d, MP_ERR_SHAPE, "x has 39 samples and y 40", 0);
    d = data_xy(x, F, y, 40);
    d.x[1] = mp_rows(x2, 40, F); /* a second input for a one-input model */
    REFUSED_EVERYWHERE(m, &d, MP_ERR_SHAPE, "2 inputs given (x[0] and 1 more); Layer \"sequential\" expects 1 input(s)", 1);
    d.x[0].data = NULL; /* x[1] alone */
    REFUSED_EVERYWHERE(m, &d, MP_ERR_NULL, "x[0].data is NULL", 1);
    d = data_xy(x, F, NULL, 40);
    REFUSED_EVERYWHERE(m, &d, MP_ERR_NULL, "y is absent", 0);
    d = data_xy(x, F, y, 0);
    REFUSED_EVERYWHERE(m, &d, MP_ERR_ARG, "x has no samples", 1);
    d = data_xy(x, F, y, SIZE_MAX / F); /* n x 6 floats' bytes past SIZE_MAX: refused before a read */
    REFUSED_EVERYWHERE(m, &d, MP_ERR_SIZE, "x's", 1);
    free(x), free(x2), free(y);
    mp_model_destroy(m);
}

/* mp_compute_loss takes y of the last forward's samples, as the loss takes them. */
static void test_compute_loss(void) {
    mp_model *m = model6(MP_SPARSE_CATEGORICAL_CROSSENTROPY);
    float *x = rows_of(8, F), loss = -1.0f, f[8] = {0};
    int32_t *y = labels_of(8, K);
    mp_data b = data_xy(x, F, y, 8);
    mp_array a;
    const int one = 1;
    if (!m) return;
    REFUSED(mp_compute_loss(m, &b.y, &loss, NULL), MP_ERR_STATE, m, "mp_compute_loss: run mp_forward first");
    OK(mp_forward(m, &b, 1), m);
    a = mp_labels(y, 7);
    REFUSED(mp_compute_loss(m, &a, &loss, NULL), MP_ERR_SHAPE, m, "mp_compute_loss: x has 8 samples and y 7");
    a = mp_rows(f, 8, 1);
    REFUSED(mp_compute_loss(m, &a, &loss, NULL), MP_ERR_DTYPE, m, "mp_compute_loss: y is float32");
    a = mp_labels(NULL, 8);
    REFUSED(mp_compute_loss(m, &a, &loss, NULL), MP_ERR_NULL, m, "mp_compute_loss: y is absent");
    CHECK(loss == -1.0f); /* untouched */
    a = mp_array_i32(y, 8, 1, &one); /* (8, 1) */
    OK(mp_compute_loss(m, &a, &loss, NULL), m);
    CHECK(loss > 0.0f && isfinite(loss));
    OK(mp_compute_scaled_gradients(m), m);
    free(x), free(y);
    mp_model_destroy(m);
}

/* int32 x: converted to float32 as Keras converts an int array fed to a
   float Input (exact to 2^24, then rounded to nearest even): the same
   predictions and the same training as the float32 array of those values. */
static void test_int32_inputs(void) {
    static const int shape[1] = {F};
    mp_model *a = model6(MP_SPARSE_CATEGORICAL_CROSSENTROPY), *b = model6(MP_SPARSE_CATEGORICAL_CROSSENTROPY);
    int32_t *ix = (int32_t *)zalloc(40 * F * sizeof(int32_t)), *y = labels_of(40, K);
    float *fx = floats(40 * F), *pa = floats(40 * K), *pb = floats(40 * K), *wa, *wb;
    mp_data di, df;
    mp_fit_desc fd;
    size_t i;
    if (!a || !b) { mp_model_destroy(a); mp_model_destroy(b); return; }
    for (i = 0; i < 40 * F; i++) ix[i] = (int32_t)(rng_next() % 11) - 5, fx[i] = (float)ix[i];
    memset(&di, 0, sizeof di);
    di.x[0] = mp_array_i32(ix, 40, 1, shape);
    di.y = mp_labels(y, 40);
    df = data_xy(fx, F, y, 40);
    OK(mp_model_predict(a, &di, 7, pa, 40 * K), a); /* 7: a batch that ends mid-sample block */
    OK(mp_model_predict(a, &df, 7, pb, 40 * K), a);
    CHECK(memcmp(pa, pb, 40 * K * sizeof(float)) == 0);
    fd = silent_fit(fx, F, y, 40, 8, 2);
    fd.data = di;
    OK(mp_model_fit(a, &fd), a);
    fd.data = df;
    OK(mp_model_fit(b, &fd), b);
    wa = weights_of(a), wb = weights_of(b);
    CHECK(memcmp(wa, wb, mp_model_param_count(a) * sizeof(float)) == 0);
    OK(mp_forward(a, &di, 0), a);
    /* past 2^24: 16777217 is no float32; it becomes 16777216 (ties to even), as (float) does */
    ix[0] = 16777217, fx[0] = 16777216.0f, ix[1] = -2147483647 - 1, fx[1] = -2147483648.0f;
    OK(mp_model_predict(a, &di, 0, pa, 40 * K), a);
    OK(mp_model_predict(a, &df, 0, pb, 40 * K), a);
    CHECK(memcmp(pa, pb, 40 * K * sizeof(float)) == 0);
    free(ix), free(y), free(fx), free(pa), free(pb), free(wa), free(wb);
    mp_model_destroy(a);
    mp_model_destroy(b);
}

/* batch_size 0 is Keras's 32 in fit, evaluate and predict. */
static void test_batch_size_default(void) {
    mp_model *a = model6(MP_SPARSE_CATEGORICAL_CROSSENTROPY), *b = model6(MP_SPARSE_CATEGORICAL_CROSSENTROPY);
    float *x = rows_of(100, F), *pa = floats(100 * K), *pb = floats(100 * K), *wa, *wb;
    int32_t *y = labels_of(100, K);
    mp_fit_desc fd = silent_fit(x, F, y, 100, 0, 1);
    mp_logs ha[1], hb[1], ea, eb;
    if (!a || !b) { mp_model_destroy(a); mp_model_destroy(b); return; }
    fd.history = ha;
    OK(mp_model_fit(a, &fd), a);
    CHECK(ha[0].steps == 4); /* ceil(100 / 32) */
    fd.batch_size = 32, fd.history = hb;
    OK(mp_model_fit(b, &fd), b);
    wa = weights_of(a), wb = weights_of(b);
    CHECK(memcmp(wa, wb, mp_model_param_count(a) * sizeof(float)) == 0 && ha[0].loss == hb[0].loss);
    OK(mp_model_evaluate(a, &fd.data, 0, &ea), a);
    OK(mp_model_evaluate(a, &fd.data, 32, &eb), a);
    CHECK(ea.loss == eb.loss && ea.accuracy == eb.accuracy);
    OK(mp_model_predict(a, &fd.data, 0, pa, 100 * K), a);
    OK(mp_model_predict(a, &fd.data, 32, pb, 100 * K), a);
    CHECK(memcmp(pa, pb, 100 * K * sizeof(float)) == 0);
    REFUSED(mp_model_predict(a, &fd.data, -1, pa, 100 * K), MP_ERR_ARG, a, "predict: batch_size must be positive");
    REFUSED(mp_model_evaluate(a, &fd.data, -5, &ea), MP_ERR_ARG, a, "evaluate: batch_size must be positive");
    fd.batch_size = -2;
    REFUSED(mp_model_fit(a, &fd), MP_ERR_ARG, a, "fit: batch_size must be positive");
    free(x), free(y), free(pa), free(pb), free(wa), free(wb);
    mp_model_destroy(a);
    mp_model_destroy(b);
}

/* out_count: the floats out holds; too few is MP_ERR_SIZE naming both, and nothing is written. */
static void test_predict_out_count(void) {
    mp_model *m = model6(MP_SPARSE_CATEGORICAL_CROSSENTROPY);
    float *x = rows_of(50, F), *out = floats(50 * K);
    mp_data d = data_xy(x, F, NULL, 50);
    size_t i;
    int untouched = 1;
    if (!m) return;
    for (i = 0; i < 50 * K; i++) out[i] = 7.0f;
    REFUSED(mp_model_predict(m, &d, 16, out, 50 * K - 1), MP_ERR_SIZE, m,
            "predict: out holds 149 floats, the predictions of 50 samples take 50 x 3");
    for (i = 0; i < 50 * K; i++) untouched &= out[i] == 7.0f;
    CHECK(untouched);
    OK(mp_model_predict(m, &d, 16, out, 50 * K), m);
    free(x), free(out);
    mp_model_destroy(m);
}

/* validation_data beside validation_split: the last 20 of 100 samples given
   either way give the same numbers, and validation_data wins where both are
   given (Keras's precedence). */
static void test_validation_data(void) {
    mp_model *m[3];
    float *x = rows_of(100, F), *w[3];
    int32_t *y = labels_of(100, K);
    mp_logs h[3][2];
    mp_fit_desc fd;
    int k;
    for (k = 0; k < 3; k++) {
        m[k] = model6(MP_SPARSE_CATEGORICAL_CROSSENTROPY);
        if (!m[k]) return;
        fd = silent_fit(x, F, y, 80, 16, 2);
        if (k == 1) fd.data = data_xy(x, F, y, 100), fd.validation_split = 0.2f;
        else fd.validation_data = data_xy(x + 80 * F, F, y + 80, 20);
        if (k == 2) fd.validation_split = 0.5f; /* not used: validation_data is given */
        fd.history = h[k];
        OK(mp_model_fit(m[k], &fd), m[k]);
        w[k] = weights_of(m[k]);
    }
    for (k = 1; k < 3; k++) {
        CHECK(h[k][0].loss == h[0][0].loss && h[k][1].loss == h[0][1].loss);
        CHECK(h[k][0].val_loss == h[0][0].val_loss && h[k][1].val_loss == h[0][1].val_loss);
        CHECK(h[k][1].val_accuracy == h[0][1].val_accuracy && h[k][1].steps == 5);
        CHECK(memcmp(w[0], w[k], mp_model_param_count(m[0]) * sizeof(float)) == 0);
    }
    CHECK(h[0][1].val_loss > 0.0f);
    /* validation_data is checked as fit's data is, and refused the same way */
    fd = silent_fit(x, F, y, 80, 16, 1);
    fd.validation_data = data_xy(x, 4, y, 20);
    REFUSED(mp_model_fit(m[0], &fd), MP_ERR_SHAPE, m[0], "validation_data: x has 4 values per sample");
    fd.validation_data = data_xy(x, F, NULL, 20);
    REFUSED(mp_model_fit(m[0], &fd), MP_ERR_NULL, m[0], "validation_data: y is absent");
    CHECK(weights_equal(m[0], w[0]));
    for (k = 0; k < 3; k++) free(w[k]), mp_model_destroy(m[k]);
    free(x), free(y);
}

/* Keras's to_categorical. */
static void test_to_categorical(void) {
    static const int32_t labels[4] = {0, 2, 1, 2}, bad[2] = {1, -1};
    static const float want3[12] = {1, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1};
    float out[16];
    size_t i;
    int untouched = 1;
    CHECK_EQ(mp_to_categorical(labels, 4, 0, out, 12), MP_OK); /* 1 + the largest label */
    CHECK(memcmp(out, want3, sizeof want3) == 0);
    CHECK_EQ(mp_to_categorical(labels, 4, 4, out, 16), MP_OK);
    CHECK(out[0] == 1.0f && out[3] == 0.0f && out[4 + 2] == 1.0f && out[12 + 2] == 1.0f && out[15] == 0.0f);
    for (i = 0; i < 16; i++) out[i] = 5.0f;
    CHECK_EQ(mp_to_categorical(labels, 4, 2, out, 16), MP_ERR_LABEL); /* 2 is not below 2 */
    CHECK_EQ(mp_to_categorical(bad, 2, 3, out, 16), MP_ERR_LABEL);
    CHECK_EQ(mp_to_categorical(bad, 2, 0, out, 16), MP_ERR_LABEL);
    CHECK_EQ(mp_to_categorical(labels, 4, 0, out, 11), MP_ERR_SIZE);
    CHECK_EQ(mp_to_categorical(labels, 4, -1, out, 16), MP_ERR_ARG);
    CHECK_EQ(mp_to_categorical(NULL, 4, 3, out, 16), MP_ERR_NULL);
    CHECK_EQ(mp_to_categorical(labels, 4, 3, NULL, 16), MP_ERR_NULL);
    for (i = 0; i < 16; i++) untouched &= out[i] == 5.0f;
    CHECK(untouched);
    CHECK_EQ(mp_to_categorical(NULL, 0, 0, NULL, 0), MP_OK); /* nothing to write */
}

/* An IDX data set as fit reads it: x (n, rows, cols), y (n,) int32. */
static void test_dataset_data(void) {
    static const unsigned char images[4 + 12 + 2 * 2 * 3] = {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3,
                                                             0, 255, 0, 255, 0, 255, 1, 2, 3, 4, 5, 6};
    static const unsigned char labels[4 + 4 + 2] = {0, 0, 8, 1, 0, 0, 0, 2, 4, 1};
    mp_dataset ds;
    mp_data d;
    if (!CHECK(mp_dataset_from_idx(images, sizeof images, labels, sizeof labels, &ds) == MP_OK)) return;
    d = mp_dataset_data(&ds);
    CHECK(d.x[0].data == ds.x && d.x[0].dtype == MP_FLOAT32 && d.x[0].n == 2 && d.x[0].rank == 2);
    CHECK(d.x[0].shape[0] == 2 && d.x[0].shape[1] == 3 && d.x[1].data == NULL);
    CHECK(d.y.data == ds.labels && d.y.dtype == MP_INT32 && d.y.n == 2 && d.y.rank == 0);
    mp_dataset_free(&ds);
    d = mp_dataset_data(NULL);
    CHECK(d.x[0].data == NULL && d.y.data == NULL);
}

/* int32 is a dtype of data only: casts, tensors, products, statistics,
   policies, weights and the gradients' sum refuse it. */
static void test_int32_refused_elsewhere(void) {
    static const int shape[2] = {2, 2};
    mp_model *m = model6(MP_SPARSE_CATEGORICAL_CROSSENTROPY);
    mp_tensor t;
    mp_tensor_stats stats;
    mp_numerics_desc nd;
    mp_policy p;
    mp_dtype dt = MP_FLOAT32;
    float a[4] = {1, 2, 3, 4}, c[4];
    int32_t i32[4] = {1, 2, 3, 4};
    size_t len;
    CHECK(strcmp(mp_dtype_name(MP_INT32), "int32") == 0 && mp_dtype_size(MP_INT32) == 4);
    CHECK(mp_dtype_from_name("int32", &dt) == MP_OK && dt == MP_INT32);
    CHECK(mp_dtype_name(MP_DTYPE_COUNT) == NULL && mp_dtype_size(MP_DTYPE_COUNT) == 0);
    CHECK_EQ(mp_convert(c, MP_FLOAT32, i32, MP_INT32, 4, NULL), MP_ERR_DTYPE);
    CHECK_EQ(mp_convert(i32, MP_INT32, a, MP_FLOAT32, 4, NULL), MP_ERR_DTYPE);
    CHECK_EQ(mp_tensor_alloc(&t, MP_INT32, 2, shape), MP_ERR_DTYPE);
    t.dtype = MP_INT32, t.rank = 2, t.shape[0] = t.shape[1] = 2, t.data = i32;
    CHECK(mp_tensor_bytes(&t) == 0);
    CHECK_EQ(mp_matmul(NULL, 0, 0, 2, 2, 2, i32, MP_INT32, a, MP_FLOAT32, c, MP_FLOAT32), MP_ERR_DTYPE);
    memset(&stats, 0, sizeof stats);
    CHECK_EQ(mp_tensor_stats_compute(i32, MP_INT32, 4, MP_FLOAT16, &stats), MP_ERR_DTYPE);
    CHECK_EQ(mp_policy_from_name("int32", &p), MP_ERR_UNKNOWN_POLICY);
    p.compute_dtype = MP_INT32, p.variable_dtype = MP_FLOAT32;
    CHECK_EQ(mp_set_global_policy(p), MP_ERR_INVALID_POLICY);
    if (!m) return;
    CHECK_EQ(mp_model_export_weights_to_memory(m, MP_INT32, NULL, 0, &len), MP_ERR_DTYPE);
    memset(&nd, 0, sizeof nd);
    nd.every = 1;
    nd.target = MP_INT32;
    CHECK_EQ(mp_model_set_numerics(m, &nd), MP_ERR_ARG);
    mp_model_destroy(m);
}

/* Each entry point's messages put the specific part first. */
static void test_messages(void) {
    mp_model *m = model6(MP_SPARSE_CATEGORICAL_CROSSENTROPY);
    float *x = rows_of(40, F);
    int32_t *y = labels_of(40, K);
    mp_fit_desc fd = silent_fit(x, F, y, 40, 8, 1);
    mp_logs logs;
    if (!m) return;
    x[7 * F + 2] = NAN;
    REFUSED(mp_model_fit(m, &fd), MP_ERR_NONFINITE, m, "fit: x: sample 7, feature 2 is NaN (");
    REFUSED(mp_model_predict(m, &fd.data, 8, NULL, 0), MP_ERR_NULL, m, "predict() needs data and an output buffer (");
    x[7 * F + 2] = 0.5f;
    y[39] = K;
    REFUSED(mp_model_evaluate(m, &fd.data, 8, &logs), MP_ERR_LABEL, m, "evaluate: y: sample 39 has label 3; the model has 3 classes (");
    free(x), free(y);
    mp_model_destroy(m);
}

/* The summary's first column fits Keras's longest layer names: no row runs
   into the shape's column, which starts at the same place on every row. */
static void test_summary_columns(void) {
    static const int shape[] = {8, 8, 2, 0};
    mp_layer_desc layers[5];
    mp_model *m;
    char text[4096], *line, *at;
    int col = -1, rows = 0, ok = 1;
    layers[0] = mp_conv2d(4, 3, 3, MP_SAME, MP_RELU);
    layers[1] = mp_max_pooling2d(2, 2);
    layers[2] = mp_max_pooling2d(2, 2);
    layers[2].name = "a_pooling_layer_named_at_length"; /* 31 characters, the longest a name keeps */
    layers[3] = mp_flatten();
    layers[4] = mp_dense(3, MP_SOFTMAX);
    if (!(m = new_model("float32", shape, layers, 5))) return;
    if (!OK(mp_model_summary(m, text, sizeof text), m)) { mp_model_destroy(m); return; }
    for (line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (!(at = strstr(line, "(None"))) continue;
        rows++;
        ok &= at > line && at[-1] == ' '; /* a gap after the name's ")" */
        if (col < 0) col = (int)(at - line);
        ok &= (int)(at - line) == col;
    }
    CHECK(rows == 5 && ok);
    mp_model_destroy(m);
}

/* MP_ERR_IO says the system's reason; a checkpoint of another policy says policy. */
static void test_io_and_policy_messages(void) {
    static const int shape[] = {F, 0};
    mp_layer_desc layers[1];
    mp_model *a = model6(MP_SPARSE_CATEGORICAL_CROSSENTROPY), *b;
    mp_compile_desc cd;
    size_t len = 0;
    unsigned char *buf;
    if (!a) return;
    REFUSED(mp_model_save(a, "/nonexistent-dir/for/a.ckpt"), MP_ERR_IO, a, "saving /nonexistent-dir/for/a.ckpt:");
    CHECK(strstr(mp_model_error(a), strerror(ENOENT)) != NULL);
    REFUSED(mp_model_load(a, "/nonexistent-dir/for/a.ckpt"), MP_ERR_IO, a, "cannot read /nonexistent-dir/for/a.ckpt: ");
    CHECK(strstr(mp_model_error(a), strerror(ENOENT)) != NULL);
    layers[0] = mp_dense(K, MP_SOFTMAX);
    b = new_model("mixed_float16", shape, layers, 1);
    mp_model_destroy(a);
    a = new_model("float32", shape, layers, 1);
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    if (a && b && OK(mp_model_compile(a, &cd), a) && OK(mp_model_compile(b, &cd), b) &&
        OK(mp_model_save_to_memory(a, NULL, 0, &len), a)) {
        buf = (unsigned char *)zalloc(len);
        OK(mp_model_save_to_memory(a, buf, len, &len), a);
        REFUSED(mp_model_load_from_memory(b, buf, len), MP_ERR_SHAPE, b,
                "layer 0 (dense): policy float32 in the file, mixed_float16 in the model");
        CHECK(strstr(mp_model_error(b), "shapes do not match") == NULL);
        free(buf);
    }
    mp_model_destroy(a);
    mp_model_destroy(b);
}

/* Token data (>>data: tokens): byte-level text and llm.c's token files,
   cut into windows of inputs and next-token targets; llm.c files with a
   wrong magic, version or count, truncated or too long, are refused with
   the file and the reason. */
static unsigned char *llmc_file(const uint16_t *tokens, uint32_t count, uint32_t magic, uint32_t version, size_t *len) {
    unsigned char *b;
    size_t i;
    *len = 1024 + 2 * (size_t)count;
    b = (unsigned char *)zalloc(*len);
    for (i = 0; i < 4; i++) {
        b[i] = (unsigned char)(magic >> (8 * i));
        b[4 + i] = (unsigned char)(version >> (8 * i));
        b[8 + i] = (unsigned char)(count >> (8 * i));
    }
    for (i = 0; i < count; i++) b[1024 + 2 * i] = (unsigned char)tokens[i], b[1025 + 2 * i] = (unsigned char)(tokens[i] >> 8);
    return b;
}

static int write_file(const char *path, const void *b, size_t len) {
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(b, 1, len, f) == len;
    if (f) ok = fclose(f) == 0 && ok;
    return ok;
}

static void test_tokens(void) {
    static const char text[] = "abcab\ncab";
    static const uint16_t toks[6] = {50256, 11, 7, 0, 65535, 11};
    mp_tokens t;
    int32_t x[2 * 3], y[2 * 3];
    size_t starts[2] = {0, 5}, len;
    unsigned char *b;
    char why[256], path[256];
    int i;
    /* a temporary file of this process's own (the matrix runs builds side by side) */
    snprintf(path, sizeof path, "%s/mixprec_tokens_%ld.bin", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (long)getpid());
    /* text: the vocabulary is the distinct bytes, ascending: \n a b c */
    if (OK(mp_tokens_from_text(text, sizeof text - 1, &t), NULL)) {
        CHECK(t.count == 9 && t.vocab_size == 4 && t.byte_level == 1);
        CHECK(t.bytes[0] == '\n' && t.bytes[1] == 'a' && t.bytes[3] == 'c' && t.id_of['b'] == 2 && t.id_of['z'] == -1);
        CHECK(t.ids[0] == 1 && t.ids[5] == 0 && t.ids[8] == 2);
        CHECK(mp_tokens_window_count(&t, 3) == 2 && mp_tokens_window_count(&t, 8) == 1 && mp_tokens_window_count(&t, 9) == 0);
        CHECK(OK(mp_tokens_windows(&t, NULL, 2, 3, x, y), NULL)); /* windows 0..3 and 3..6 */
        CHECK(x[0] == 1 && x[1] == 2 && x[2] == 3 && y[0] == 2 && y[2] == 1 && x[3] == 1 && y[5] == 3);
        CHECK(OK(mp_tokens_windows(&t, starts, 2, 3, x, y), NULL));
        CHECK(x[3] == 0 && y[5] == 2); /* from token 5: \n c a b */
        starts[1] = 6; /* 6 + 3 + 1 > 9: refused, nothing written */
        x[3] = -7;
        CHECK(mp_tokens_windows(&t, starts, 2, 3, x, y) == MP_ERR_ARG && x[3] == -7);
        CHECK(mp_tokens_windows(&t, NULL, 3, 3, x, y) == MP_ERR_ARG && mp_tokens_windows(&t, NULL, 1, 0, x, y) == MP_ERR_ARG);
        mp_tokens_free(&t);
    }
    CHECK(mp_tokens_from_text(text, 0, &t) == MP_ERR_FORMAT);
    /* llm.c: uint16 ids, vocab_size 1 + the largest */
    b = llmc_file(toks, 6, 20240520u, 1, &len);
    if (OK(mp_tokens_from_llmc(b, len, &t), NULL)) {
        CHECK(t.count == 6 && t.ids[0] == 50256 && t.ids[4] == 65535 && t.vocab_size == 65536 && !t.byte_level);
        mp_tokens_free(&t);
    }
    CHECK(mp_tokens_from_llmc(b, len - 1, &t) == MP_ERR_FORMAT); /* truncated */
    if (CHECK(write_file(path, b, len - 2))) {
        CHECK(mp_load_llmc_tokens(path, &t, why, sizeof why) == MP_ERR_FORMAT);
        CHECK(strstr(why, path) == why && strstr(why, "truncated") != NULL);
    }
    if (CHECK(write_file(path, b, len))) {
        if (OK(mp_load_llmc_tokens(path, &t, why, sizeof why), NULL)) {
            CHECK(t.count == 6 && t.ids[5] == 11);
            mp_tokens_free(&t);
        }
    }
    free(b);
    b = llmc_file(toks, 6, 20240520u, 1, &len);
    b = (unsigned char *)realloc(b, len + 2);
    if (b && CHECK(write_file(path, b, len + 2))) { /* two more bytes than the header says */
        CHECK(mp_load_llmc_tokens(path, &t, why, sizeof why) == MP_ERR_FORMAT && strstr(why, "more bytes") != NULL);
    }
    free(b);
    for (i = 0; i < 3; i++) { /* magic, version, count */
        b = llmc_file(toks, i == 2 ? 0 : 6, i == 0 ? 20240326u : 20240520u, i == 1 ? 2 : 1, &len);
        if (CHECK(write_file(path, b, len))) {
            CHECK(mp_load_llmc_tokens(path, &t, why, sizeof why) == MP_ERR_FORMAT);
            CHECK(strstr(why, i == 0 ? "20240520" : i == 1 ? "version" : "count") != NULL);
        }
        free(b);
    }
    /* a text file, and a file that is not there */
    if (CHECK(write_file(path, text, sizeof text - 1)) && OK(mp_load_text_tokens(path, &t, why, sizeof why), NULL)) {
        CHECK(t.count == 9 && t.vocab_size == 4);
        mp_tokens_free(&t);
    }
    CHECK(mp_load_text_tokens("/nonexistent-dir/text.txt", &t, why, sizeof why) == MP_ERR_IO);
    CHECK(strstr(why, "/nonexistent-dir/text.txt: ") == why && strstr(why, strerror(ENOENT)) != NULL);
    remove(path);
}

int main(int argc, char **argv) {
    size_t start = mp_get_memory_info().current;
    check_args(argc, argv);
    good_x = rows_of(64, F);
    good_y = labels_of(64, K);
    good_t = floats(64 * K);
    mp_to_categorical(good_y, 64, K, good_t, 64 * K);
    RUN(test_deliberate_mistake());
    RUN(test_wrong_widths());
    RUN(test_reshape_accepted());
    RUN(test_wrong_ranks());
    RUN(test_wrong_dtypes());
    RUN(test_wrong_counts());
    RUN(test_compute_loss());
    RUN(test_int32_inputs());
    RUN(test_batch_size_default());
    RUN(test_predict_out_count());
    RUN(test_validation_data());
    RUN(test_to_categorical());
    RUN(test_dataset_data());
    RUN(test_int32_refused_elsewhere());
    RUN(test_messages());
    RUN(test_summary_columns());
    RUN(test_io_and_policy_messages());
    RUN(test_tokens());
    free(good_x), free(good_y), free(good_t);
    CHECK(mp_get_memory_info().current == start); /* every model gave back what it took */
    return check_done("test_data");
}
