/* helpers.h - what the model tests share, included after mixprec.h and
   check.h: a seeded random stream (splitmix64; define TEST_SEED first for
   another stream), zeroed allocation that ends the test when memory runs
   out, typed element access, OK(call, model): one check that prints the
   status and the model's own message when the call fails, weights_of /
   weights_equal, new_model, new_graph_model,
   data_xy / data_xt (an mp_data of rows), forward_rows / loss_rows (the
   custom loop's first two calls on rows) and silent_fit. */
#ifndef MIXPREC_TEST_HELPERS_H
#define MIXPREC_TEST_HELPERS_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TEST_SEED
#define TEST_SEED 0x853C49E6748FEA9Bull
#endif
static uint64_t rng_state = TEST_SEED;

static inline uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline float uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)(rng_next() >> 40) * (1.0f / 16777216.0f);
}
static inline float normal(void) { /* Box-Muller */
    double u1 = ((double)(rng_next() >> 11) + 1.0) / 9007199254740993.0;
    double u2 = (double)(rng_next() >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
static inline void *zalloc(size_t bytes) {
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}
static inline float *floats(size_t n) { return (float *)zalloc(n * sizeof(float)); }

static inline int ok_report(mp_status st, const mp_model *m, const char *file, int line, const char *what) {
    if (check_report(st == MP_OK, file, line, what)) return 1;
    fprintf(stderr, "    %s%s%s\n", mp_status_name(st), m ? ": " : "", m ? mp_model_error(m) : "");
    return 0;
}
#define OK(call, m) ok_report((call), (m), __FILE__, __LINE__, #call)

/* Elements of a buffer of any dtype: its name, its size, element i as
   float32 (exact), v stored rounded once. */
static inline const char *dn(mp_dtype t) { return t == MP_FLOAT32 ? "f32" : t == MP_FLOAT16 ? "f16" : "bf16"; }
static inline size_t dsize(mp_dtype t) { return t == MP_FLOAT32 ? 4 : 2; }
static inline float get(const void *p, mp_dtype t, size_t i) {
    if (t == MP_FLOAT32) {
        float x;
        memcpy(&x, (const char *)p + 4 * i, 4);
        return x;
    } else {
        uint16_t h;
        memcpy(&h, (const char *)p + 2 * i, 2);
        return t == MP_FLOAT16 ? mp_f16_to_f32(mp_f16_from_bits(h)) : mp_bf16_to_f32(mp_bf16_from_bits(h));
    }
}
static inline void put(void *p, mp_dtype t, size_t i, float v) {
    if (t == MP_FLOAT32) {
        memcpy((char *)p + 4 * i, &v, 4);
    } else {
        uint16_t h = t == MP_FLOAT16 ? mp_f16_from_f32(v).bits : mp_bf16_from_f32(v).bits;
        memcpy((char *)p + 2 * i, &h, 2);
    }
}

/* A model (seed 7) of layers[0..count) added under the global policy
   `policy`; the global policy is float32 again after. NULL on failure
   (already counted). */
static inline mp_model *new_model(const char *policy, const int *shape, const mp_layer_desc *layers, int count) {
    mp_model_desc md;
    mp_model *m = NULL;
    int i, ok;
    memset(&md, 0, sizeof md);
    for (i = 0; i < MP_MAX_RANK - 1 && shape[i]; i++) md.input_shape[i] = shape[i];
    md.seed = 7;
    ok = OK(mp_set_global_policy_name(policy), NULL) && OK(mp_model_create(&m, &md), NULL);
    for (i = 0; ok && i < count; i++) ok = OK(mp_model_add(m, layers[i]), m);
    mp_set_global_policy_name("float32");
    if (!ok) {
        mp_model_destroy(m);
        return NULL;
    }
    return m;
}
/* A functional model: layer i reads wiring[i][1..wiring[i][0]], ids of
   earlier layers (from 1, as mp_model_call numbers them) or 0, the model's
   input. */
static inline mp_model *new_graph_model(const char *policy, const int *shape, const mp_layer_desc *layers,
                                        const int (*wiring)[MP_MAX_LAYER_INPUTS + 1], int count) {
    mp_model *m = new_model(policy, shape, layers, 0);
    int i, ok = m != NULL;
    if (ok) mp_set_global_policy_name(policy);
    for (i = 0; ok && i < count; i++) ok = OK(mp_model_call(m, layers[i], wiring[i] + 1, wiring[i][0], NULL), m);
    mp_set_global_policy_name("float32");
    if (!ok) {
        mp_model_destroy(m);
        return NULL;
    }
    return m;
}
/* The model's float32 weights (the caller frees them; a failed read is
   counted), and whether they are w's, bit for bit. */
static inline float *weights_of(mp_model *m) {
    size_t n = mp_model_param_count(m);
    float *w = floats(n);
    OK(mp_model_get_weights(m, w, n), m);
    return w;
}
static inline int weights_equal(mp_model *m, const float *w) {
    size_t n = mp_model_param_count(m);
    float *now = floats(n);
    int same = mp_model_get_weights(m, now, n) == MP_OK && memcmp(now, w, n * sizeof(float)) == 0;
    free(now);
    return same;
}

/* n samples of `width` floats with their labels (NULL: none), as fit,
   evaluate and mp_forward read them. */
static inline mp_data data_xy(const float *x, int width, const int32_t *labels, size_t n) {
    mp_data d;
    memset(&d, 0, sizeof d);
    d.x[0] = mp_rows(x, n, width);
    if (labels) d.y = mp_labels(labels, n);
    return d;
}
/* The same with float targets, `outs` a sample. */
static inline mp_data data_xt(const float *x, int width, const float *y, int outs, size_t n) {
    mp_data d = data_xy(x, width, NULL, n);
    if (y) d.y = mp_rows(y, n, outs);
    return d;
}
/* The custom loop's first two lines on rows of the model's input size (x)
   and of its output size (y, where labels is NULL), n samples. */
static inline mp_status forward_rows(mp_model *m, const float *x, size_t n, int training) {
    mp_data d = data_xy(x, (int)mp_model_input_size(m), NULL, n);
    return mp_forward(m, &d, training);
}
static inline mp_status loss_rows(mp_model *m, const int32_t *labels, const float *y, size_t n, float *loss,
                                  size_t *correct) {
    mp_array a = labels ? mp_labels(labels, n) : mp_rows(y, n, (int)mp_model_output_size(m));
    return mp_compute_loss(m, &a, loss, correct);
}
/* A quiet fit of n labelled samples of `width` floats: every other setting Keras's default. */
static inline mp_fit_desc silent_fit(const float *x, int width, const int32_t *labels, size_t n, int batch, int epochs) {
    mp_fit_desc fd;
    memset(&fd, 0, sizeof fd);
    fd.data = data_xy(x, width, labels, n);
    fd.batch_size = batch;
    fd.epochs = epochs;
    fd.verbose = MP_VERBOSE_SILENT;
    return fd;
}

/* A check over many values, reported once with the first bad one. */
static inline void check_all(int bad, const char *what, const char *detail, const char *file, int line) {
    if (!check_report(bad == 0, file, line, what)) fprintf(stderr, "    %d bad; first: %s\n", bad, detail);
}

/* Where each trainable weight lies in get_weights' vector (which puts each
   layer's state after its trainable weights); the caller frees it. */
static inline size_t *trainable_index(const mp_model *m) {
    size_t *at = (size_t *)zalloc(mp_model_trainable_param_count(m) * sizeof(size_t) + 1), w = 0, t = 0, j;
    int i;
    for (i = 0; i < mp_model_layer_count(m); i++) {
        mp_layer_info info;
        if (mp_model_layer_info(m, i, &info) != MP_OK) break;
        for (j = 0; j < info.trainable_params; j++) at[t++] = w + j;
        w += info.params;
    }
    return at;
}

/* A batch's training loss (NaN on failure) and its float32 gradients (0 on
   failure, counted), as the test at hand computes them. */
typedef float (*loss_fn)(mp_model *m, const void *batch);
typedef int (*gradients_fn)(mp_model *m, const void *batch, float *g);

/* The gradients against central differences of the loss, weight by
   weight: |g - fd| <= 2e-2 max(|g|, |fd|) + 3e-4 for every trainable
   weight; the whole vectors within 2e-2 in relative L2; and a gradient
   that is not zero (the check is not vacuous). The loss is float32, so the
   differences carry about 1e-7 |loss| / eps of rounding noise: 3e-4
   covers it. */
static inline void grad_check(const char *what, mp_model *m, loss_fn loss, gradients_fn gradients, const void *b,
                              float eps) {
    size_t n = mp_model_param_count(m), nt = mp_model_trainable_param_count(m), i;
    size_t *at = trainable_index(m);
    float *w = floats(n), *g = floats(nt);
    double diff2 = 0.0, fd2 = 0.0;
    int bad = 0;
    char msg[200], detail[160] = "";
    if (!OK(mp_model_get_weights(m, w, n), m) || !gradients(m, b, g)) goto done;
    for (i = 0; i < nt; i++) {
        float keep = w[at[i]], hi = keep + eps, lo = keep - eps, lp, lm;
        double fd, err, tol;
        w[at[i]] = hi;
        mp_model_set_weights(m, w, n);
        lp = loss(m, b);
        w[at[i]] = lo;
        mp_model_set_weights(m, w, n);
        lm = loss(m, b);
        w[at[i]] = keep;
        fd = ((double)lp - (double)lm) / ((double)hi - (double)lo);
        err = fabs((double)g[i] - fd);
        tol = 2e-2 * fmax(fabs((double)g[i]), fabs(fd)) + 3e-4;
        diff2 += ((double)g[i] - fd) * ((double)g[i] - fd);
        fd2 += fd * fd;
        if (!(err <= tol) && bad++ == 0)
            snprintf(detail, sizeof detail, "weight %zu of %zu: gradient %.7g, central difference %.7g", i, nt,
                     (double)g[i], fd);
    }
    mp_model_set_weights(m, w, n);
    snprintf(msg, sizeof msg, "%s: each gradient matches its central difference", what);
    check_all(bad, msg, detail, __FILE__, __LINE__);
    snprintf(msg, sizeof msg, "%s: gradient vector within 2e-2 (relative L2)", what);
    if (!check_report(sqrt(diff2) <= 2e-2 * sqrt(fd2), __FILE__, __LINE__, msg))
        fprintf(stderr, "    |g - fd| = %.4g, |fd| = %.4g\n", sqrt(diff2), sqrt(fd2));
    snprintf(msg, sizeof msg, "%s: the loss depends on the weights", what);
    if (!check_report(sqrt(fd2) > 1e-3, __FILE__, __LINE__, msg)) fprintf(stderr, "    |fd| = %.4g\n", sqrt(fd2));
done:
    free(at);
    free(w);
    free(g);
}

#endif
