/* test_backend.c - the backend interface, on a CPU-only machine. A "remote"
   backend runs the CPU's kernels on memory the host must not touch: every
   pointer it hands out is shifted by a large offset (an address that is not
   mapped), and every op shifts it back before calling the CPU op. So any
   place in the model code that reads or writes a tensor directly instead of
   through the backend crashes here, as it would on a GPU. The backend also
   counts the bytes copied each way, which shows what a training step moves
   between host and device: the batch in, the step state out, nothing else.
   A model trained on it must end bit-identical to one on the CPU backend. */
#define _POSIX_C_SOURCE 200809L /* dup, dup2, mkstemp */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#include "check.h"
#include "helpers.h"

/* >>the remote backend */
#define OFFSET ((uintptr_t)1 << 46) /* far above any x86-64 user mapping */

static const mp_backend *cpu;
static size_t bytes_in, bytes_out, copies_in, copies_out, casts_in, cast_in_values, host_allocs, host_waits;

static void *real(const void *p) { return p ? (void *)((uintptr_t)p - OFFSET) : NULL; }
static void *fake(void *p) { return p ? (void *)((uintptr_t)p + OFFSET) : NULL; }

static mp_status r_create(void **ctx, int threads, const void *config) { return cpu->create(ctx, threads, config); }
static void r_destroy(void *ctx) { cpu->destroy(ctx); }
static int r_threads(void *ctx) { return cpu->threads(ctx); }
static void *r_alloc(void *ctx, size_t bytes) { return fake(cpu->alloc(ctx, bytes)); }
static void r_free(void *ctx, void *p) { cpu->free(ctx, real(p)); }
static void r_memory(void *ctx, mp_backend_memory *out) { cpu->memory(ctx, out); }
static void r_copy(void *ctx, void *dst, const void *src, size_t bytes, mp_copy_kind kind) {
    if (kind == MP_COPY_TO_BACKEND) { dst = real(dst); bytes_in += bytes; copies_in++; }
    else if (kind == MP_COPY_TO_HOST) { src = real(src); bytes_out += bytes; copies_out++; }
    else { dst = real(dst); src = real(src); }
    cpu->copy(ctx, dst, src, bytes, kind);
}
static void r_zero(void *ctx, void *p, size_t bytes) { cpu->zero(ctx, real(p), bytes); }
static mp_status r_sync(void *ctx) { return cpu->sync(ctx); }
static const char *r_last_error(void *ctx) { return cpu->last_error(ctx); }
static mp_status r_gemm_reserve(void *ctx, size_t m, size_t n, size_t k) { return cpu->gemm_reserve(ctx, m, n, k); }
static void r_cast_in(void *ctx, void *dst, mp_dtype dt, const float *host_src, size_t n, int *nonfinite) {
    casts_in++;
    cast_in_values += n;
    cpu->cast_in(ctx, real(dst), dt, host_src, n, (int *)real(nonfinite));
}
static void r_cast(void *ctx, void *dst, mp_dtype dt, const void *src, mp_dtype st, size_t n, mp_cast_stats *stats) {
    cpu->cast(ctx, real(dst), dt, real(src), st, n, stats);
}
static void r_gemm(void *ctx, const mp_gemm_args *g) {
    mp_gemm_args h = *g;
    h.a = real(g->a);
    h.b = real(g->b);
    h.c = real(g->c);
    h.bias = real(g->bias);
    h.z = real(g->z);
    h.relu_y = real(g->relu_y);
    cpu->gemm(ctx, &h);
}
static void r_bias_act(void *ctx, void *y, const void *x, const void *bias, size_t rows, size_t cols,
                       mp_activation act, mp_dtype dt) {
    cpu->bias_act(ctx, real(y), real(x), real(bias), rows, cols, act, dt);
}
static void r_act_backward(void *ctx, void *dx, mp_dtype dxt, const void *dy, const void *y, const void *x,
                           size_t rows, size_t cols, mp_activation act, mp_dtype dt) {
    cpu->act_backward(ctx, real(dx), dxt, real(dy), real(y), real(x), rows, cols, act, dt);
}
static void r_bias_grad(void *ctx, void *db, const void *dy, size_t rows, size_t cols, mp_dtype dt) {
    cpu->bias_grad(ctx, real(db), real(dy), rows, cols, dt);
}
static void r_loss(void *ctx, mp_loss kind, int from_logits, const void *pred, mp_dtype pt, const void *out,
                   mp_dtype ot, const int32_t *labels, const float *y, size_t rows, size_t cols, float *dpred,
                   float *metrics) {
    cpu->loss(ctx, kind, from_logits, real(pred), pt, real(out), ot, (const int32_t *)real(labels),
              (const float *)real(y), rows, cols, (float *)real(dpred), (float *)real(metrics));
}
static void r_scale_cast(void *ctx, void *dst, mp_dtype dt, const float *src, size_t n, const float *scale) {
    cpu->scale_cast(ctx, real(dst), dt, (const float *)real(src), n, (const float *)real(scale));
}
static void r_unscale_check(void *ctx, float *dst, const void *src, mp_dtype st, size_t n, const float *scale,
                            int *found_inf) {
    cpu->unscale_check(ctx, (float *)real(dst), real(src), st, n, (const float *)real(scale), (int *)real(found_inf));
}
static void r_loss_scale_update(void *ctx, mp_loss_scale *ls, const int *found_inf) {
    cpu->loss_scale_update(ctx, (mp_loss_scale *)real(ls), (const int *)real(found_inf));
}
static void r_optimizer_update(void *ctx, const mp_opt_step *step, float *w, const void *g, mp_dtype gt,
                               const float *scale, float *s1, float *s2, size_t n, void *wc, mp_dtype wt,
                               const int *found_inf) {
    mp_opt_step local = *step; /* its sum of squares is the backend's memory too */
    local.sum_squares = (const float *)real(step->sum_squares);
    cpu->optimizer_update(ctx, &local, (float *)real(w), real(g), gt, (const float *)real(scale), (float *)real(s1),
                          (float *)real(s2), n, real(wc), wt, (const int *)real(found_inf));
}
static void r_sum_squares(void *ctx, float *sum, const void *g, mp_dtype gt, size_t n, const float *scale) {
    cpu->sum_squares(ctx, (float *)real(sum), real(g), gt, n, (const float *)real(scale));
}
static void r_im2col(void *ctx, void *col, const void *img, size_t n, const mp_conv_geom *g, mp_dtype dt) {
    cpu->im2col(ctx, real(col), real(img), n, g, dt);
}
static void r_col2im(void *ctx, float *img, const float *col, size_t n, const mp_conv_geom *g) {
    cpu->col2im(ctx, (float *)real(img), (const float *)real(col), n, g);
}
static void r_conv_flip(void *ctx, void *dst, const void *src, const mp_conv_geom *g, size_t filters, mp_dtype dt) {
    cpu->conv_flip(ctx, real(dst), real(src), g, filters, dt);
}
static void r_max_pool(void *ctx, void *y, const void *x, size_t n, const mp_conv_geom *g, mp_dtype dt) {
    cpu->max_pool(ctx, real(y), real(x), n, g, dt);
}
static void r_max_pool_backward(void *ctx, void *dx, mp_dtype dxt, const void *dy, const void *x, size_t n,
                                const mp_conv_geom *g, mp_dtype dt) {
    cpu->max_pool_backward(ctx, real(dx), dxt, real(dy), real(x), n, g, dt);
}
static void r_dropout_mask(void *ctx, unsigned char *mask, size_t n, float rate, uint64_t seed) {
    cpu->dropout_mask(ctx, (unsigned char *)real(mask), n, rate, seed);
}
static void r_dropout(void *ctx, void *y, mp_dtype yt, const void *x, mp_dtype xt, const unsigned char *mask,
                      size_t n, float scale) {
    cpu->dropout(ctx, real(y), yt, real(x), xt, (const unsigned char *)real(mask), n, scale);
}

static void r_elementwise(void *ctx, mp_elementwise op, void *y, mp_dtype yt, const void *a, mp_dtype at,
                          const void *b, mp_dtype bt, float s, size_t n) {
    cpu->elementwise(ctx, op, real(y), yt, real(a), at, real(b), bt, s, n);
}
static void r_copy_cols(void *ctx, void *dst, mp_dtype dt, size_t dst_stride, const void *src, mp_dtype st,
                        size_t src_stride, size_t rows, size_t cols) {
    cpu->copy_cols(ctx, real(dst), dt, dst_stride, real(src), st, src_stride, rows, cols);
}
static void r_avg_pool(void *ctx, void *y, const void *x, size_t n, const mp_conv_geom *g, mp_dtype dt) {
    cpu->avg_pool(ctx, real(y), real(x), n, g, dt);
}
static void r_avg_pool_backward(void *ctx, void *dx, mp_dtype dxt, const void *dy, size_t n, const mp_conv_geom *g,
                                mp_dtype dt) {
    cpu->avg_pool_backward(ctx, real(dx), dxt, real(dy), n, g, dt);
}
static void r_batch_norm(void *ctx, void *y, mp_dtype yt, const void *x, mp_dtype dt, size_t rows, size_t cols,
                         const float *gamma_beta, float *stats, float *moving, float momentum, float epsilon,
                         int training) {
    cpu->batch_norm(ctx, real(y), yt, real(x), dt, rows, cols, (const float *)real(gamma_beta), (float *)real(stats),
                    (float *)real(moving), momentum, epsilon, training);
}
static void r_batch_norm_backward(void *ctx, void *dx, mp_dtype dxt, const void *dy, const void *x, mp_dtype dt,
                                  size_t rows, size_t cols, const float *gamma_beta, const float *stats, float epsilon,
                                  float *dgamma_beta) {
    cpu->batch_norm_backward(ctx, real(dx), dxt, real(dy), real(x), dt, rows, cols, (const float *)real(gamma_beta),
                             (const float *)real(stats), epsilon, (float *)real(dgamma_beta));
}
static void r_layer_norm(void *ctx, void *y, mp_dtype yt, const void *x, mp_dtype dt, size_t rows, size_t cols,
                         const float *gamma_beta, float epsilon, float *stats) {
    cpu->layer_norm(ctx, real(y), yt, real(x), dt, rows, cols, (const float *)real(gamma_beta), epsilon,
                    (float *)real(stats));
}
static void r_layer_norm_backward(void *ctx, void *dx, mp_dtype dxt, const void *dy, const void *x, mp_dtype dt,
                                  size_t rows, size_t cols, const float *gamma_beta, const float *stats,
                                  float *dgamma_beta) {
    cpu->layer_norm_backward(ctx, real(dx), dxt, real(dy), real(x), dt, rows, cols, (const float *)real(gamma_beta),
                             (const float *)real(stats), (float *)real(dgamma_beta));
}

static void r_embedding(void *ctx, void *y, mp_dtype yt, const float *table, size_t vocab, const float *ids, size_t period,
                        size_t rows, size_t cols) {
    cpu->embedding(ctx, real(y), yt, (const float *)real(table), vocab, (const float *)real(ids), period, rows, cols);
}
static void r_embedding_backward(void *ctx, float *dtable, size_t vocab, const void *dy, mp_dtype dt, const float *ids,
                                 size_t period, size_t rows, size_t cols) {
    cpu->embedding_backward(ctx, (float *)real(dtable), vocab, real(dy), dt, (const float *)real(ids), period, rows, cols);
}
static void r_attention(void *ctx, void *att, void *p, float *s, const void *q, const void *k, const void *v, mp_dtype dt,
                        size_t batch, size_t t, size_t heads, size_t d, float scale, int causal) {
    cpu->attention(ctx, real(att), real(p), (float *)real(s), real(q), real(k), real(v), dt, batch, t, heads, d, scale,
                   causal);
}
static void r_attention_backward(void *ctx, void *dq, void *dk, void *dv, float *s, const void *datt, const void *q,
                                 const void *k, const void *v, const void *p, mp_dtype dt, size_t batch, size_t t,
                                 size_t heads, size_t d, float scale, int causal) {
    cpu->attention_backward(ctx, real(dq), real(dk), real(dv), (float *)real(s), real(datt), real(q), real(k), real(v),
                            real(p), dt, batch, t, heads, d, scale, causal);
}

/* Staging memory: plain host memory here (copies run at once), counted. */
static void *r_host_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    host_allocs++;
    return malloc(bytes);
}
static void *r_host_alloc_none(void *ctx, size_t bytes) {
    (void)ctx;
    (void)bytes;
    return NULL; /* out of pinned memory */
}
static void r_host_free(void *ctx, void *p) {
    (void)ctx;
    free(p);
}
static void r_host_wait(void *ctx, const void *p) {
    (void)ctx;
    (void)p;
    host_waits++;
}

/* Data on the "device": plenty of room; the gather as a device would. */
static size_t r_free_memory(void *ctx) {
    (void)ctx;
    return (size_t)1 << 34;
}
static void r_gather(void *ctx, void *dst, const void *src, const uint32_t *idx, size_t rows, size_t row_bytes) {
    const uint32_t *at = (const uint32_t *)real(idx);
    size_t i;
    (void)ctx;
    for (i = 0; i < rows; i++) memcpy((char *)real(dst) + i * row_bytes, (const char *)real(src) + at[i] * row_bytes, row_bytes);
}

static const mp_backend remote = {
    MP_OP(name) "remote", MP_OP(device_memory) 1, MP_OP(tensor_cores) 0, MP_OP(relu_grad) 1,
    MP_OP(create) r_create,
    MP_OP(destroy) r_destroy,
    MP_OP(threads) r_threads,
    MP_OP(alloc) r_alloc,
    MP_OP(free) r_free,
    MP_OP(memory) r_memory,
    MP_OP(copy) r_copy,
    MP_OP(zero) r_zero,
    MP_OP(sync) r_sync,
    MP_OP(last_error) r_last_error,
    MP_OP(gemm_reserve) r_gemm_reserve,
    MP_OP(cast_in) r_cast_in,
    MP_OP(cast) r_cast,
    MP_OP(gemm) r_gemm,
    MP_OP(bias_act) r_bias_act,
    MP_OP(act_backward) r_act_backward,
    MP_OP(bias_grad) r_bias_grad,
    MP_OP(loss) r_loss,
    MP_OP(scale_cast) r_scale_cast,
    MP_OP(unscale_check) r_unscale_check,
    MP_OP(loss_scale_update) r_loss_scale_update,
    MP_OP(optimizer_update) r_optimizer_update,
    MP_OP(im2col) r_im2col,
    MP_OP(col2im) r_col2im,
    MP_OP(conv_flip) r_conv_flip,
    MP_OP(conv_gemm) NULL,
    MP_OP(max_pool) r_max_pool,
    MP_OP(max_pool_backward) r_max_pool_backward,
    MP_OP(dropout_mask) r_dropout_mask,
    MP_OP(dropout) r_dropout,
    MP_OP(elementwise) r_elementwise,
    MP_OP(copy_cols) r_copy_cols,
    MP_OP(avg_pool) r_avg_pool,
    MP_OP(avg_pool_backward) r_avg_pool_backward,
    MP_OP(batch_norm) r_batch_norm,
    MP_OP(batch_norm_backward) r_batch_norm_backward,
    MP_OP(layer_norm) r_layer_norm,
    MP_OP(layer_norm_backward) r_layer_norm_backward,
    MP_OP(embedding) r_embedding,
    MP_OP(embedding_backward) r_embedding_backward,
    MP_OP(attention) r_attention,
    MP_OP(attention_backward) r_attention_backward,
    MP_OP(host_alloc) r_host_alloc,
    MP_OP(host_free) r_host_free,
    MP_OP(host_wait) r_host_wait,
    MP_OP(free_memory) r_free_memory,
    MP_OP(gather) r_gather,
    MP_OP(sum_squares) r_sum_squares,
};

static void reset_counts(void) {
    bytes_in = bytes_out = copies_in = copies_out = casts_in = cast_in_values = host_allocs = host_waits = 0;
}

/* >>data and models */
#define N 96
#define CLASSES 4
static float xs[N * 8 * 8 * 2];
static int32_t labels[N];

static void make_data(void) {
    uint64_t s = 42;
    size_t i;
    for (i = 0; i < sizeof xs / sizeof xs[0]; i++) {
        s = s * 6364136223846793005u + 1442695040888963407u;
        xs[i] = (float)(s >> 40) / 16777216.0f - 0.5f;
    }
    for (i = 0; i < N; i++) labels[i] = (int32_t)(i * 7 % CLASSES);
}

/* A small conv net with every layer kind: the model code's every path.
   policy "amp": float32 with automatic mixed precision (float16).
   `options` (may be NULL) the optimizer's, its kind replaced by opt. */
static mp_model *conv_net_with(const mp_backend *be, const char *policy, mp_optimizer_kind opt,
                               const mp_optimizer_desc *options) {
    mp_model_desc md;
    mp_compile_desc cd;
    mp_model *m = NULL;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 8;
    md.input_shape[1] = 8;
    md.input_shape[2] = 2;
    md.seed = 7;
    md.backend = be;
    md.threads = 2;
    int amp = strcmp(policy, "amp") == 0;
    if (!CHECK(mp_set_global_policy_name(amp ? "float32" : policy) == MP_OK)) return NULL;
    if (!CHECK(mp_model_create(&m, &md) == MP_OK)) return NULL;
    mp_model_add(m, mp_conv2d(4, 3, 3, MP_SAME, MP_RELU));
    mp_model_add(m, mp_max_pooling2d(2, 2));
    mp_model_add(m, mp_conv2d(6, 2, 2, MP_VALID, MP_GELU));
    mp_model_add(m, mp_flatten());
    mp_model_add(m, mp_dropout(0.25f));
    mp_model_add(m, mp_dense(16, MP_TANH));
    mp_model_add(m, mp_dense(CLASSES, MP_LINEAR));
    mp_model_add(m, mp_activation_layer(MP_SOFTMAX));
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    if (options) cd.optimizer = *options;
    cd.optimizer.kind = opt;
    cd.metrics = MP_METRIC_ACCURACY;
    cd.amp.enabled = amp;
    if (amp) CHECK(mp_model_build(m) == MP_OK); /* built first: AMP lays the weight block out again */
    /* a scale that overflows float16 at first: skipped steps, halvings */
    cd.loss_scale_config.initial_scale = 1e30f;
    CHECK(mp_model_compile(m, &cd) == MP_OK);
    mp_set_global_policy_name("float32");
    return m;
}

/* Two models' float32 weights, bit for bit. */
static int same_weights(mp_model *a, mp_model *b) {
    float *wa = weights_of(a), *wb = weights_of(b);
    int same = wa && wb && mp_model_param_count(a) == mp_model_param_count(b) &&
               memcmp(wa, wb, mp_model_param_count(a) * sizeof(float)) == 0;
    free(wa);
    free(wb);
    return same;
}

/* >>tests */
static mp_model *conv_net(const mp_backend *be, const char *policy, mp_optimizer_kind opt) {
    return conv_net_with(be, policy, opt, NULL);
}

/* fit on the CPU and on the remote backend, the same bits; with `options`
   (may be NULL) the optimizer's. */
static void test_same_training_with(const char *policy, mp_optimizer_kind opt, const mp_optimizer_desc *options) {
    mp_model *a = conv_net_with(mp_cpu_backend(), policy, opt, options), *b = conv_net_with(&remote, policy, opt, options);
    mp_fit_desc fd;
    mp_logs ha[2], hb[2];
    if (!a || !b) { mp_model_destroy(a); mp_model_destroy(b); return; }
    memset(&fd, 0, sizeof fd);
    fd.data = data_xy(xs, 8 * 8 * 2, labels, N);
    fd.batch_size = 16;
    fd.epochs = 2;
    fd.validation_split = 0.25f;
    fd.verbose = MP_VERBOSE_SILENT;
    /* batches gathered on the device, or (two of the four) sent from the host */
    fd.host_data = !strcmp(policy, "mixed_bfloat16") || !strcmp(policy, "amp");
    fd.history = ha;
    CHECK(mp_model_fit(a, &fd) == MP_OK);
    fd.history = hb;
    if (!CHECK(mp_model_fit(b, &fd) == MP_OK)) fprintf(stderr, "    %s\n", mp_model_error(b));
    CHECK(memcmp(&ha[1].loss, &hb[1].loss, sizeof(float)) == 0);
    CHECK(memcmp(&ha[1].val_accuracy, &hb[1].val_accuracy, sizeof(float)) == 0);
    CHECK(ha[1].loss_scale == hb[1].loss_scale && ha[1].skipped_steps == hb[1].skipped_steps);
    if (!strcmp(policy, "mixed_float16")) CHECK(hb[1].skipped_steps > 0 && hb[1].loss_scale < 1e30f);
    CHECK(same_weights(a, b)); /* the same kernels: bit-identical */
    mp_model_destroy(a);
    mp_model_destroy(b);
}

static void test_same_training(const char *policy, mp_optimizer_kind opt) { test_same_training_with(policy, opt, NULL); }

/* Weight decay (the biases excluded) and each clip mode, through the
   backend's ops: the sums of squares in the backend's memory. */
static void test_same_training_options(void) {
    static const char *const biases[] = {"bias", NULL};
    mp_optimizer_desc o;
    memset(&o, 0, sizeof o);
    o.exclude_from_weight_decay = biases;
    o.global_clipnorm = 0.5f;
    test_same_training_with("mixed_float16", MP_ADAMW, &o);
    o.global_clipnorm = 0.0f;
    o.clipnorm = 0.25f;
    o.weight_decay = 0.01f;
    test_same_training_with("mixed_bfloat16", MP_SGD, &o);
    o.clipnorm = 0.0f;
    o.clipvalue = 0.01f;
    test_same_training_with("float32", MP_RMSPROP, &o);
}

/* A backend without sum_squares (an older table): compile refuses the
   clipping by norm, naming the backend; the other options train. */
static void test_no_sum_squares(void) {
    mp_backend older = remote;
    mp_compile_desc cd;
    mp_model *m;
    older.sum_squares = NULL;
    if (!(m = conv_net_with(&older, "float32", MP_SGD, NULL))) return;
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    cd.optimizer.global_clipnorm = 1.0f;
    if (!CHECK(mp_model_compile(m, &cd) == MP_ERR_ARG && strstr(mp_model_error(m), "cannot take norms")))
        fprintf(stderr, "    %s\n", mp_model_error(m));
    cd.optimizer.global_clipnorm = 0.0f;
    cd.optimizer.clipvalue = 1.0f;
    CHECK(mp_model_compile(m, &cd) == MP_OK);
    mp_model_destroy(m);
}

/* What one training step moves. With the data on the device (fit's
   default there): nothing; the data go in once per fit (inputs, labels)
   and the order once per epoch. With host_data: the batch (the input cast
   in once, the labels copied once, gathered in one of two staging sets
   after waiting for that set's last copies). Either way nothing comes out
   but the metrics and the step state, once, at the end of the epoch (fit
   prints nothing here). The weights, gradients, slots and loss scale never
   travel. */
static void test_step_traffic(void) {
    mp_model *m = conv_net(&remote, "mixed_float16", MP_ADAM);
    mp_fit_desc fd;
    mp_model_memory mem;
    size_t steps = 6, batch = 16, n = steps * batch, x_bytes = n * 8 * 8 * 2 * sizeof(float);
    if (!m) return;
    memset(&fd, 0, sizeof fd);
    fd.data = data_xy(xs, 8 * 8 * 2, labels, n);
    fd.batch_size = (int)batch;
    fd.verbose = MP_VERBOSE_SILENT;
    for (fd.host_data = 0; fd.host_data < 2; fd.host_data++) {
        CHECK(mp_model_fit(m, &fd) == MP_OK); /* the first fit sizes everything */
        reset_counts();
        CHECK(mp_model_fit(m, &fd) == MP_OK);
        if (!fd.host_data) {
            CHECK_EQ(casts_in, 0);
            CHECK_EQ(copies_in, 3); /* inputs, labels, the order */
            CHECK_EQ(bytes_in, x_bytes + n * sizeof(int32_t) + n * sizeof(uint32_t));
            CHECK_EQ(host_waits, 0);
        } else {
            CHECK_EQ(casts_in, steps);
            CHECK_EQ(cast_in_values, steps * batch * 8 * 8 * 2);
            CHECK_EQ(copies_in, steps); /* the labels */
            CHECK_EQ(bytes_in, steps * batch * sizeof(int32_t));
            CHECK_EQ(host_waits, steps);
            CHECK_EQ(host_allocs, 0); /* the staging sets of the first fit, kept */
        }
        CHECK_EQ(copies_out, 2); /* the metric log and the step state */
        CHECK(bytes_out <= steps * 2 * sizeof(float) + 128);
    }
    CHECK(mp_model_memory_info(m, &mem) == MP_OK);
    CHECK(!strcmp(mem.backend, "remote") && mem.current > 0 && mem.peak >= mem.current);
    CHECK(mem.current >= mem.weights + mem.optimizer + mem.activations);
    mp_model_destroy(m);
}

/* A fit of n samples in batches of 16. */
static mp_fit_desc batches_of_16(size_t n, mp_verbose verbose) {
    mp_fit_desc fd;
    memset(&fd, 0, sizeof fd);
    fd.data = data_xy(xs, 8 * 8 * 2, labels, n);
    fd.batch_size = 16;
    fd.verbose = verbose;
    return fd;
}

/* No pinned memory to be had: the staging sets are the host's, nothing
   waits for them (the copies took the bytes), and it trains the same. */
static void test_no_pinned_memory(void) {
    mp_backend nopin = remote;
    mp_model *a, *b;
    mp_fit_desc fd = batches_of_16(48, MP_VERBOSE_SILENT);
    nopin.host_alloc = r_host_alloc_none;
    a = conv_net(&remote, "mixed_float16", MP_SGD), b = conv_net(&nopin, "mixed_float16", MP_SGD);
    fd.host_data = 1;
    if (a && b) {
        CHECK(mp_model_fit(a, &fd) == MP_OK);
        reset_counts();
        CHECK(mp_model_fit(b, &fd) == MP_OK);
        CHECK_EQ(host_waits, 0);
        CHECK(same_weights(a, b));
    }
    mp_model_destroy(a);
    mp_model_destroy(b);
}

/* The custom loop, predict and get_weights read through the backend. */
static void test_reads(void) {
    mp_model *a = conv_net(mp_cpu_backend(), "mixed_bfloat16", MP_SGD), *b = conv_net(&remote, "mixed_bfloat16", MP_SGD);
    float la = 1.0f, lb = 2.0f, pa[8 * CLASSES], pb[8 * CLASSES];
    float *ga, *gb;
    mp_tensor ta, tb;
    int applied_a = -1, applied_b = -2;
    mp_data d;
    size_t n;
    if (!a || !b) { mp_model_destroy(a); mp_model_destroy(b); return; }
    n = mp_model_param_count(a);
    CHECK(forward_rows(a, xs, 8, 1) == MP_OK && forward_rows(b, xs, 8, 1) == MP_OK);
    CHECK(mp_output(a, &ta) == MP_OK && mp_output(b, &tb) == MP_OK);
    CHECK(tb.dtype == ta.dtype && memcmp(ta.data, tb.data, mp_tensor_bytes(&ta)) == 0);
    CHECK(loss_rows(a, labels, NULL, 8, &la, NULL) == MP_OK && loss_rows(b, labels, NULL, 8, &lb, NULL) == MP_OK);
    CHECK(la == lb);
    CHECK(mp_compute_scaled_gradients(a) == MP_OK && mp_compute_scaled_gradients(b) == MP_OK);
    CHECK(mp_get_unscaled_gradients(a) == MP_OK && mp_get_unscaled_gradients(b) == MP_OK);
    CHECK(mp_apply_gradients(a, &applied_a) == MP_OK && mp_apply_gradients(b, &applied_b) == MP_OK);
    CHECK(applied_a == applied_b);
    ga = (float *)malloc(n * sizeof(float));
    gb = (float *)malloc(n * sizeof(float));
    CHECK(ga && gb && mp_get_gradients(a, ga, n) == MP_OK && mp_get_gradients(b, gb, n) == MP_OK &&
          memcmp(ga, gb, n * sizeof(float)) == 0);
    free(ga);
    free(gb);
    d = data_xy(xs, 8 * 8 * 2, NULL, 8);
    CHECK(mp_model_predict(a, &d, 3, pa, sizeof pa / sizeof pa[0]) == MP_OK &&
          mp_model_predict(b, &d, 3, pb, sizeof pb / sizeof pb[0]) == MP_OK);
    CHECK(memcmp(pa, pb, sizeof pa) == 0);
    mp_model_destroy(a);
    mp_model_destroy(b);
}

/* A device backend does not scan mp_forward's batch on the host: its
   cast_in finds the NaN, and mp_compute_loss (which reads the step state)
   reports it, so no gradient or update can follow; the CPU refuses at once.
   The weights stay the CPU's, and the next clean batch gives the same loss. */
static void test_device_nonfinite(void) {
    mp_model *a = conv_net(mp_cpu_backend(), "mixed_float16", MP_SGD), *b = conv_net(&remote, "mixed_float16", MP_SGD);
    float bad[8 * 8 * 8 * 2], la = 0.0f, lb = 0.0f;
    if (!a || !b) { mp_model_destroy(a); mp_model_destroy(b); return; }
    memcpy(bad, xs, sizeof bad);
    bad[77] = NAN;
    CHECK(forward_rows(a, bad, 8, 1) == MP_ERR_NONFINITE);
    CHECK(forward_rows(b, bad, 8, 1) == MP_OK); /* not scanned on the host */
    CHECK(loss_rows(b, labels, NULL, 8, &lb, NULL) == MP_ERR_NONFINITE);
    CHECK(strstr(mp_model_error(b), "Inf or NaN") != NULL);
    CHECK(mp_compute_scaled_gradients(b) == MP_ERR_STATE);
    CHECK(same_weights(a, b));
    /* (inference: b's training forward drew a dropout mask, a's did not) */
    CHECK(forward_rows(a, xs, 8, 0) == MP_OK && forward_rows(b, xs, 8, 0) == MP_OK);
    CHECK(loss_rows(a, labels, NULL, 8, &la, NULL) == MP_OK && loss_rows(b, labels, NULL, 8, &lb, NULL) == MP_OK);
    CHECK(la == lb);
    mp_model_destroy(a);
    mp_model_destroy(b);
}

/* unscale_check with no destination (fit's check before an update that
   unscales as it reads) reads the bits alone: it flags Inf and NaN of
   either sign, at any place and length, on 1 and 2 threads, exactly when
   the full pass does, and never the largest finite value. */
static void test_check_alone(void) {
    static const size_t lengths[] = {1, 15, 16, 17, 31, 32, 33, 64, 1000, 4099};
    static const float specials[] = {INFINITY, -INFINITY, NAN, -NAN, FLT_MAX};
    float src32[4099], dst[4099], scale = 1024.0f;
    uint16_t src16[4099];
    int threads, d, wrong = 0;
    for (threads = 1; threads <= 2; threads++) {
        void *ctx = NULL;
        if (!CHECK(cpu->create(&ctx, threads, NULL) == MP_OK)) return;
        for (d = 0; d < 3; d++) {
            mp_dtype dt = (mp_dtype)d;
            void *src = dt == MP_FLOAT32 ? (void *)src32 : (void *)src16;
            size_t l, at, v;
            for (l = 0; l < sizeof lengths / sizeof *lengths; l++)
                for (at = 0; at < lengths[l]; at += 1 + at / 3)
                    for (v = 0; v < sizeof specials / sizeof *specials; v++) {
                        size_t n = lengths[l], i;
                        int alone = 0, full = 0, want;
                        for (i = 0; i < n; i++) src32[i] = (float)(i % 7) - 3.0f;
                        src32[at] = specials[v];
                        if (dt != MP_FLOAT32) mp_convert(src16, dt, src32, MP_FLOAT32, n, NULL);
                        if (dt != MP_FLOAT32 && v == 4) src16[at] = dt == MP_FLOAT16 ? 0x7BFFu : 0x7F7Fu; /* their largest */
                        want = !isfinite(specials[v]);
                        cpu->unscale_check(ctx, NULL, src, dt, n, &scale, &alone);
                        cpu->unscale_check(ctx, dst, src, dt, n, &scale, &full);
                        wrong += alone != want || full != want;
                    }
        }
        cpu->destroy(ctx);
    }
    CHECK_EQ(wrong, 0); /* the test alone flags Inf and NaN as the full pass does */
}

/* v32[0, n) as a kernel reading dt sees it: rounded to dt (written to
   v16 as well) and widened back; float32 as it is. */
static void read_as(mp_dtype dt, float *v32, uint16_t *v16, size_t n) {
    if (dt == MP_FLOAT32) return;
    mp_convert(v16, dt, v32, MP_FLOAT32, n, NULL);
    mp_convert(v32, MP_FLOAT32, v16, dt, n, NULL);
}

/* unscale_check's full pass writes each value widened and multiplied by
   1 / scale, at lengths around its runs of 1024 and past the size that
   splits it between 2 threads, from each dtype and in place in float32. */
static void test_unscale_values(void) {
    static const size_t lengths[] = {1, 1023, 1024, 1025, 4099, 70001};
    static float src32[70001], dst[70001];
    static uint16_t src16[70001];
    float scale = 3.0f, inv = 1.0f / scale;
    int threads, d, in_place, wrong = 0;
    for (threads = 1; threads <= 2; threads++) {
        void *ctx = NULL;
        if (!CHECK(cpu->create(&ctx, threads, NULL) == MP_OK)) return;
        for (d = 0; d < 3; d++)
            for (in_place = 0; in_place <= (d == MP_FLOAT32); in_place++) {
                mp_dtype dt = (mp_dtype)d;
                size_t l, i;
                for (l = 0; l < sizeof lengths / sizeof *lengths; l++) {
                    size_t n = lengths[l];
                    const void *from = in_place           ? (const void *)dst
                                       : dt == MP_FLOAT32 ? (const void *)src32
                                                          : (const void *)src16;
                    int flag = 0;
                    for (i = 0; i < n; i++) /* finite in float16 */
                        src32[i] = ldexpf((float)(i % 1999) - 999.0f, (int)(i % 16) - 12);
                    read_as(dt, src32, src16, n);
                    if (in_place) memcpy(dst, src32, n * sizeof(float));
                    else memset(dst, 0xFF, n * sizeof(float)); /* NaN where nothing is written */
                    cpu->unscale_check(ctx, dst, from, dt, n, &scale, &flag);
                    for (i = 0; i < n; i++) {
                        float want = src32[i] * inv;
                        wrong += memcmp(&want, &dst[i], sizeof want) != 0;
                    }
                    wrong += flag != 0;
                }
            }
        cpu->destroy(ctx);
    }
    CHECK_EQ(wrong, 0);
}

/* bias_grad is each column's sum over the rows, in row order in float32,
   rounded once into dt: from each dtype, on 1 and 2 threads, at column
   counts around its runs of 1024, over gradients big enough (512 KiB
   and more) that it fetches the rows ahead as it goes, and over columns
   the threads split in whole cache lines of a row, or not at all. */
static void test_bias_grad_values(void) {
    static const size_t shapes[][2] = {{61, 1100}, {3, 1025}, {700, 300}, {1100, 300}, {130, 1030}, {7000, 10}, {7000, 40}};
    static float dy32[1100 * 1100], want32[1100], got32[1100];
    static uint16_t dy16[1100 * 1100], got16[1100];
    int threads, d, wrong = 0;
    for (threads = 1; threads <= 2; threads++) {
        void *ctx = NULL;
        if (!CHECK(cpu->create(&ctx, threads, NULL) == MP_OK)) return;
        for (d = 0; d < 3; d++) {
            mp_dtype dt = (mp_dtype)d;
            size_t s, r, c;
            for (s = 0; s < sizeof shapes / sizeof *shapes; s++) {
                size_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
                void *got = dt == MP_FLOAT32 ? (void *)got32 : (void *)got16;
                for (r = 0; r < n; r++) /* sums that round at every addition */
                    dy32[r] = ldexpf((float)(r * 2654435761u % 4093) - 2046.0f, (int)(r % 7) - 9);
                read_as(dt, dy32, dy16, n);
                for (c = 0; c < cols; c++) {
                    float sum = 0.0f;
                    for (r = 0; r < rows; r++) sum += dy32[r * cols + c];
                    want32[c] = sum;
                }
                cpu->bias_grad(ctx, got, dt == MP_FLOAT32 ? (const void *)dy32 : (const void *)dy16, rows, cols, dt);
                read_as(dt, want32, dy16, cols); /* rounded once, as the kernel */
                if (dt != MP_FLOAT32) mp_convert(got32, MP_FLOAT32, got16, dt, cols, NULL);
                for (c = 0; c < cols; c++) wrong += memcmp(&want32[c], &got32[c], sizeof(float)) != 0;
            }
        }
        cpu->destroy(ctx);
    }
    CHECK_EQ(wrong, 0);
}

/* loss is each row's loss by the rules (>>rules), added in row order in
   float32, and each row's gradient of the mean: on 1 to 3 threads, for
   every loss, over batches the pool splits (2^16 elements' worth and
   more) and across its chunks of rows (2048 a pass). pred and out are the
   logits and probabilities from the model's softmax or sigmoid. */
static void test_loss_values(void) {
    enum { ROWS = 4500, COLS = 10 };
    static const size_t row_counts[] = {7, 300, 2049, ROWS};
    static const struct { mp_loss kind; int from_logits; } losses[] = {
        {MP_SPARSE_CATEGORICAL_CROSSENTROPY, 1}, {MP_CATEGORICAL_CROSSENTROPY, 0},
        {MP_BINARY_CROSSENTROPY, 1}, {MP_BINARY_CROSSENTROPY, 0}, {MP_MEAN_SQUARED_ERROR, 0}};
    static float logits[ROWS * COLS], probs[ROWS * COLS], y[ROWS * COLS], want[ROWS * COLS], got[ROWS * COLS];
    static int32_t labels[ROWS];
    int threads, wrong = 0;
    size_t i, j;
    for (i = 0; i < ROWS; i++) {
        float sum = 0.0f;
        labels[i] = (int32_t)(i * 7 % COLS);
        for (j = 0; j < COLS; j++) {
            logits[i * COLS + j] = ldexpf((float)((i * COLS + j) * 2654435761u % 2001) - 1000.0f, -8);
            probs[i * COLS + j] = expf(logits[i * COLS + j]), sum += probs[i * COLS + j];
            y[i * COLS + j] = (float)((size_t)labels[i] == j);
        }
        for (j = 0; j < COLS; j++) probs[i * COLS + j] /= sum;
    }
    for (threads = 1; threads <= 3; threads++) {
        void *ctx = NULL;
        size_t l, n;
        if (!CHECK(cpu->create(&ctx, threads, NULL) == MP_OK)) return;
        for (l = 0; l < sizeof losses / sizeof *losses; l++)
            for (n = 0; n < sizeof row_counts / sizeof *row_counts; n++) {
                mp_loss kind = losses[l].kind;
                int logits_in = losses[l].from_logits, sparse = kind == MP_SPARSE_CATEGORICAL_CROSSENTROPY;
                size_t rows = row_counts[n], correct = 0;
                const float *pred = logits_in ? logits : probs, *t = sparse ? NULL : y;
                float sum = 0.0f, metrics[2];
                for (i = 0; i < rows; i++) {
                    float *p = want + i * COLS, row_loss;
                    correct += (size_t)mp__row_correct(kind, probs + i * COLS, t ? t + i * COLS : NULL, labels[i], COLS);
                    memcpy(p, pred + i * COLS, COLS * sizeof(float));
                    if (kind == MP_BINARY_CROSSENTROPY) row_loss = mp__binary_crossentropy_row(p, y + i * COLS, COLS, logits_in);
                    else if (kind == MP_MEAN_SQUARED_ERROR) row_loss = mp__mean_squared_error_row(p, y + i * COLS, COLS);
                    else row_loss = mp__crossentropy_row(p, t ? t + i * COLS : NULL, labels[i], COLS, logits_in);
                    for (j = 0; j < COLS; j++) p[j] *= 1.0f / (float)rows;
                    sum += row_loss;
                }
                cpu->loss(ctx, kind, logits_in, pred, MP_FLOAT32, probs, MP_FLOAT32, sparse ? labels : NULL,
                          sparse ? NULL : y, rows, COLS, got, metrics);
                wrong += memcmp(&metrics[0], &sum, sizeof sum) != 0 || metrics[1] != (float)correct;
                wrong += memcmp(want, got, rows * COLS * sizeof(float)) != 0;
            }
        cpu->destroy(ctx);
    }
    CHECK_EQ(wrong, 0);
}

/* scale_cast is dst = src * scale rounded once into dt (scale NULL: 1),
   element by element as the scalar rules give it, at lengths around its
   tiles: overflow to Inf, subnormals, NaN's sign and payload (a signalling
   NaN quieted by the multiply, as a device's kernel does). */
static void test_scale_cast(void) {
    static const size_t lengths[] = {1, 255, 256, 257, 600};
    static const uint32_t specials[] = {0x7F800000u, 0xFF800000u, 0x7FC01234u, 0xFFA00001u, 0x7F7FFFFFu, 0x33800000u};
    float src[600], scale = 4096.0f, *scales[2] = {NULL, &scale};
    volatile float one = 1.0f; /* a multiply by 1 that the compiler keeps: it quiets a signalling NaN */
    uint16_t dst[600];
    float dst32[600];
    int d, s, wrong = 0;
    void *ctx = NULL;
    if (!CHECK(cpu->create(&ctx, 1, NULL) == MP_OK)) return;
    for (d = 0; d < 3; d++)
        for (s = 0; s < 2; s++) {
            size_t l, i;
            mp_dtype dt = (mp_dtype)d;
            for (l = 0; l < sizeof lengths / sizeof *lengths; l++) {
                size_t n = lengths[l];
                for (i = 0; i < n; i++) {
                    uint32_t bits = specials[i % 6];
                    if (i % 3) src[i] = ldexpf((float)i - 300.0f, (int)(i % 40) - 30); /* around float16's edges */
                    else memcpy(&src[i], &bits, 4);
                }
                cpu->scale_cast(ctx, dt == MP_FLOAT32 ? (void *)dst32 : (void *)dst, dt, src, n, scales[s]);
                for (i = 0; i < n; i++) {
                    float want = src[i] * (scales[s] ? scale : one);
                    uint32_t w32, g32;
                    if (dt == MP_FLOAT32) {
                        memcpy(&w32, &want, 4), memcpy(&g32, &dst32[i], 4);
                        wrong += w32 != g32;
                    } else if (dt == MP_FLOAT16) {
                        wrong += mp_f16_from_f32(want).bits != dst[i];
                    } else {
                        wrong += mp_bf16_from_f32(want).bits != dst[i];
                    }
                }
            }
        }
    cpu->destroy(ctx);
    CHECK_EQ(wrong, 0);
}

/* >>the graph layers' ops: elementwise, copy_cols, avg_pool and its gradient,
   on the CPU backend against double-precision references, and the same
   bytes on 1, 2 and 3 threads (the sizes are above the one-thread limit). */
static const mp_dtype float_types[3] = {MP_FLOAT32, MP_FLOAT16, MP_BFLOAT16};

/* v rounded once into t. */
static void put_rounded(void *p, mp_dtype t, size_t i, double v) {
    uint16_t h;
    float f = (float)v;
    if (t == MP_FLOAT32) { memcpy((char *)p + 4 * i, &f, 4); return; }
    h = t == MP_FLOAT16 ? mp_f16_from_f64(v).bits : mp_bf16_from_f64(v).bits;
    memcpy((char *)p + 2 * i, &h, 2);
}

/* n values of t: magnitudes from 2^-14 to 2^9 (float16's subnormals to
   its sums' overflow), either sign, some zeros; every 7th value of b is a
   (exact differences, -0 sums). */
static float operand(size_t i) { return i % 11 == 0 ? 0.0f : ldexpf(uniform(-1.0f, 1.0f), (int)(rng_next() % 24) - 14); }

static void fill_operands(void *a, mp_dtype at, void *b, mp_dtype bt, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        put(a, at, i, operand(i));
        put(b, bt, i, i % 7 == 0 ? get(a, at, i) : operand(i + 1));
    }
}

/* The CPU backend on `threads` threads (NULL: counted as failed). */
static void *cpu_ctx(int threads) {
    void *ctx = NULL;
    return CHECK(cpu->create(&ctx, threads, NULL) == MP_OK) ? ctx : NULL;
}

/* Each op and dtype triple: y = the float32 result (from the exact one in
   double: a sum of these operands is exact in double, a product too)
   rounded once into yt; where a, b and y share a 16-bit dtype that is also
   the correctly rounded exact result (float32 keeps 2p + 2 bits). */
static void test_elementwise_values(void) {
    enum { n = 100003 };
    static const mp_elementwise ops[4] = {MP_EW_ADD, MP_EW_SUBTRACT, MP_EW_MULTIPLY, MP_EW_SCALE};
    float *a = floats(n), *b = floats(n), *y = floats(n), *want = floats(n), *direct = floats(n);
    void *ctx = cpu_ctx(3);
    int o, i, j, k, wrong = 0, wrong_direct = 0;
    size_t e;
    for (o = 0; ctx && o < 4; o++)
        for (i = 0; i < 3; i++)
            for (j = 0; j < 3; j++)
                for (k = 0; k < 3; k++) {
                    mp_dtype at = float_types[i], bt = float_types[j], yt = float_types[k];
                    float s = 0.375f;
                    fill_operands(a, at, b, bt, n);
                    cpu->elementwise(ctx, ops[o], y, yt, a, at, b, bt, s, n);
                    for (e = 0; e < n; e++) {
                        double x = get(a, at, e), z = ops[o] == MP_EW_SCALE ? s : get(b, bt, e);
                        double exact = ops[o] == MP_EW_ADD ? x + z : ops[o] == MP_EW_SUBTRACT ? x - z : x * z;
                        put_rounded(want, yt, e, (double)(float)exact);
                        put_rounded(direct, yt, e, exact);
                    }
                    wrong += memcmp(y, want, n * dsize(yt)) != 0;
                    if (at == yt && (bt == yt || ops[o] == MP_EW_SCALE))
                        wrong_direct += memcmp(y, direct, n * dsize(yt)) != 0;
                }
    CHECK_EQ(wrong, 0);
    CHECK_EQ(wrong_direct, 0);
    if (ctx) cpu->destroy(ctx);
    free(a), free(b), free(y), free(want), free(direct);
}

/* y == a and y == b (the gradients' sums accumulate in place), the same
   bytes as into another buffer; 1, 2 and 3 threads give the same bytes; n
   = 0 writes nothing, n = 1 one value. */
static void test_elementwise_in_place(void) {
    enum { n = 70001 };
    uint16_t *a = (uint16_t *)zalloc(2 * n), *b = (uint16_t *)zalloc(2 * n), *y = (uint16_t *)zalloc(2 * n);
    uint16_t *first = (uint16_t *)zalloc(2 * n), *c = (uint16_t *)zalloc(2 * n);
    int t, d;
    for (d = 1; d < 3; d++) {
        mp_dtype dt = float_types[d];
        fill_operands(a, dt, b, dt, n);
        for (t = 1; t <= 3; t++) {
            void *ctx = cpu_ctx(t);
            if (!ctx) continue;
            cpu->elementwise(ctx, MP_EW_ADD, y, dt, a, dt, b, dt, 0.0f, n);
            if (t == 1) memcpy(first, y, 2 * n);
            CHECK(memcmp(y, first, 2 * n) == 0);
            memcpy(c, a, 2 * n);
            cpu->elementwise(ctx, MP_EW_ADD, c, dt, c, dt, b, dt, 0.0f, n); /* y == a */
            CHECK(memcmp(c, first, 2 * n) == 0);
            memcpy(c, b, 2 * n);
            cpu->elementwise(ctx, MP_EW_ADD, c, dt, a, dt, c, dt, 0.0f, n); /* y == b */
            CHECK(memcmp(c, first, 2 * n) == 0);
            memcpy(c, a, 2 * n);
            cpu->elementwise(ctx, MP_EW_SCALE, c, dt, c, dt, NULL, dt, 0.5f, n); /* b unused */
            cpu->elementwise(ctx, MP_EW_SCALE, y, dt, a, dt, NULL, dt, 0.5f, n);
            CHECK(memcmp(c, y, 2 * n) == 0);
            memcpy(c, first, 2 * n);
            cpu->elementwise(ctx, MP_EW_MULTIPLY, c, dt, a, dt, b, dt, 0.0f, 0); /* nothing */
            CHECK(memcmp(c, first, 2 * n) == 0);
            cpu->elementwise(ctx, MP_EW_SUBTRACT, c, dt, a, dt, b, dt, 0.0f, 1);
            CHECK(get(c, dt, 0) == (dt == MP_FLOAT16 ? mp_f16_to_f32(mp_f16_from_f64((double)get(a, dt, 0) - get(b, dt, 0)))
                                                   : mp_bf16_to_f32(mp_bf16_from_f64((double)get(a, dt, 0) - get(b, dt, 0)))));
            CHECK(memcmp(c + 1, first + 1, 2 * (n - 1)) == 0);
            cpu->destroy(ctx);
        }
    }
    free(a), free(b), free(y), free(first), free(c);
}

/* Concatenate on the last axis: A [rows, ca] and B [rows, cb] into Y
   [rows, ca + cb] (forward), and Y's gradient split back (backward), every
   dtype pair: each value cast once (widened exactly, rounded once), a plain
   copy where the dtypes agree; the same bytes on 1, 2 and 3 threads. */
static void test_copy_cols(void) {
    enum { rows = 3001, ca = 37, cb = 19, cy = ca + cb };
    float *a = floats(rows * ca), *b = floats(rows * cb), *y = floats(rows * cy), *back = floats(rows * cy);
    float *want = floats(rows * cy), *first = floats(rows * cy);
    int s, d, t, wrong = 0, differs = 0;
    size_t r, j;
    for (s = 0; s < 3; s++)
        for (d = 0; d < 3; d++) {
            mp_dtype st = float_types[s], dt = float_types[d];
            size_t es = dsize(st), ed = dsize(dt);
            for (j = 0; j < rows * ca; j++) put(a, st, j, operand(j));
            for (j = 0; j < rows * cb; j++) put(b, st, j, operand(j + 1));
            for (r = 0; r < rows; r++)
                for (j = 0; j < cy; j++)
                    put_rounded(want, dt, r * cy + j, j < ca ? get(a, st, r * ca + j) : get(b, st, r * cb + j - ca));
            for (t = 1; t <= 3; t++) {
                void *ctx = cpu_ctx(t);
                if (!ctx) continue;
                memset(y, 0xA5, rows * cy * sizeof(float));
                cpu->copy_cols(ctx, y, dt, cy, a, st, ca, rows, ca);
                cpu->copy_cols(ctx, (char *)y + ca * ed, dt, cy, b, st, cb, rows, cb);
                wrong += memcmp(y, want, rows * cy * ed) != 0;
                if (t == 1) memcpy(first, y, rows * cy * ed);
                differs += memcmp(y, first, rows * cy * ed) != 0;
                /* backward: Y's columns [0, ca) and [ca, cy) back into A's and B's shapes, in st */
                memset(back, 0xA5, rows * cy * sizeof(float));
                cpu->copy_cols(ctx, back, st, ca, y, dt, cy, rows, ca);
                cpu->copy_cols(ctx, (char *)back + rows * ca * es, st, cb, (char *)y + ca * ed, dt, cy, rows, cb);
                for (r = 0; r < rows; r++)
                    for (j = 0; j < cy; j++) {
                        float got = j < ca ? get(back, st, r * ca + j) : get(back, st, rows * ca + r * cb + j - ca);
                        float w = get(y, dt, r * cy + j);
                        uint32_t gb, wb;
                        put_rounded(&w, st, 0, w); /* y's value rounded into st */
                        w = get(&w, st, 0);
                        memcpy(&gb, &got, 4), memcpy(&wb, &w, 4);
                        wrong += gb != wb;
                    }
                cpu->copy_cols(ctx, y, dt, cy, a, st, ca, 0, ca); /* no rows, no columns: nothing */
                cpu->copy_cols(ctx, y, dt, cy, a, st, ca, rows, 0);
                differs += memcmp(y, first, rows * cy * ed) != 0;
                cpu->destroy(ctx);
            }
        }
    CHECK_EQ(wrong, 0);
    CHECK_EQ(differs, 0);
    free(a), free(b), free(y), free(back), free(want), free(first);
}

/* Pooling geometries (h w c kh kw sh sw pt pl oh ow): windows tiling with a
   border no window reaches, overlapping ones, stride 1, and a global
   average over more channels than a tile. */
static const mp_conv_geom avg_geoms[] = {{7, 9, 5, 2, 2, 2, 2, 0, 0, 3, 4},
                                         {7, 7, 3, 3, 3, 2, 2, 0, 0, 3, 3},
                                         {6, 5, 4, 3, 3, 1, 1, 0, 0, 4, 3},
                                         {7, 7, 300, 7, 7, 7, 7, 0, 0, 1, 1}};

static size_t geom_in(const mp_conv_geom *g, size_t n) { return n * (size_t)g->h * (size_t)g->w * (size_t)g->c; }
static size_t geom_out(const mp_conv_geom *g, size_t n) { return n * (size_t)g->oh * (size_t)g->ow * (size_t)g->c; }

/* The reference: y = the window's mean, and dx = sum over the windows
   holding a cell of dy / size, in double. */
static void avg_pool_ref(double *y, const void *x, double *dx, const void *dy, mp_dtype dt, size_t n, const mp_conv_geom *g) {
    size_t img, ch, size = (size_t)(g->kh * g->kw);
    int oy, ox, ky, kx;
    memset(dx, 0, geom_in(g, n) * sizeof(double));
    for (img = 0; img < n; img++)
        for (oy = 0; oy < g->oh; oy++)
            for (ox = 0; ox < g->ow; ox++)
                for (ch = 0; ch < (size_t)g->c; ch++) {
                    size_t o = (((img * (size_t)g->oh + (size_t)oy) * (size_t)g->ow + (size_t)ox) * (size_t)g->c) + ch;
                    double sum = 0.0;
                    for (ky = 0; ky < g->kh; ky++)
                        for (kx = 0; kx < g->kw; kx++) {
                            size_t i = ((img * (size_t)g->h + (size_t)(oy * g->sh + ky)) * (size_t)g->w +
                                        (size_t)(ox * g->sw + kx)) * (size_t)g->c + ch;
                            sum += get(x, dt, i);
                            dx[i] += get(dy, dt, o) / (double)size;
                        }
                    y[o] = sum / (double)size;
                }
}

/* One ulp of t at v's magnitude (one rounding into t) plus err (the
   float32 sum's: each add rounds by at most 2^-24 of a partial sum). */
static double tol_of(mp_dtype t, double v, double err) {
    int e;
    (void)frexp(v, &e);
    if (t == MP_FLOAT32) return ldexp(1.0, e - 24) + err;
    return (t == MP_FLOAT16 ? ldexp(1.0, (e < -13 ? -13 : e) - 11) : ldexp(1.0, e - 8)) + err;
}

/* Every geometry, input and gradient dtype, 1 and 3 images: within a
   rounding of the output (and a float32 sum's few ulps) of the double
   reference; where windows do not overlap dx is dy / size rounded once,
   exactly; cells no window reaches get 0. */
static void test_avg_pool_values(void) {
    static const size_t images[2] = {1, 3};
    void *ctx = cpu_ctx(2);
    size_t gi, d, o, ni, i;
    int wrong = 0;
    for (gi = 0; ctx && gi < sizeof avg_geoms / sizeof *avg_geoms; gi++)
        for (ni = 0; ni < 2; ni++)
            for (d = 0; d < 3; d++) {
                const mp_conv_geom *g = &avg_geoms[gi];
                size_t n = images[ni], in = geom_in(g, n), out = geom_out(g, n);
                int tiles = g->kh <= g->sh && g->kw <= g->sw;
                mp_dtype dt = float_types[d];
                float *x = floats(in), *y = floats(out), *dy = floats(out), *dx = floats(in);
                double *ry = (double *)zalloc(out * sizeof(double)), *rdx = (double *)zalloc(in * sizeof(double));
                for (i = 0; i < in; i++) put(x, dt, i, uniform(-1.0f, 1.0f));
                for (i = 0; i < out; i++) put(dy, dt, i, uniform(-1.0f, 1.0f));
                avg_pool_ref(ry, x, rdx, dy, dt, n, g);
                cpu->avg_pool(ctx, y, x, n, g, dt);
                /* |x| <= 1: partial sums up to size, each add off by 2^-24 of one, then / size */
                for (i = 0; i < out; i++) wrong += fabs(get(y, dt, i) - ry[i]) > tol_of(dt, ry[i], ldexp(g->kh * g->kw, -24));
                for (o = 0; o < 3; o++) {
                    mp_dtype dxt = float_types[o];
                    for (i = 0; i < in; i++) put(dx, dxt, i, 7.0f); /* overwritten, uncovered cells too */
                    cpu->avg_pool_backward(ctx, dx, dxt, dy, n, g, dt);
                    for (i = 0; i < in; i++) {
                        float got = get(dx, dxt, i);
                        size_t ch = i % (size_t)g->c, q = i / (size_t)g->c, ix = q % (size_t)g->w;
                        size_t iy = q / (size_t)g->w % (size_t)g->h, img = q / (size_t)g->w / (size_t)g->h;
                        size_t oy = iy / (size_t)g->sh, ox = ix / (size_t)g->sw;
                        wrong += fabs(got - rdx[i]) > tol_of(dxt, rdx[i], ldexp(1.0, -20)) || (rdx[i] == 0.0 && got != 0.0f);
                        if (tiles && oy < (size_t)g->oh && ox < (size_t)g->ow) { /* one window: dy / size in float32, rounded once */
                            float w, dyv = get(dy, dt, ((img * (size_t)g->oh + oy) * (size_t)g->ow + ox) * (size_t)g->c + ch);
                            put_rounded(&w, dxt, 0, (double)(dyv / (float)(g->kh * g->kw)));
                            wrong += got != get(&w, dxt, 0);
                        }
                    }
                }
                free(x), free(y), free(dy), free(dx), free(ry), free(rdx);
            }
    CHECK_EQ(wrong, 0);
    if (ctx) cpu->destroy(ctx);
}

/* The gradient by finite differences (float32; avg_pool is linear, so the
   central difference of L = sum w y is exact but for float32 roundings):
   overlapping windows add, cells no window reaches get 0. */
static void test_avg_pool_gradient(void) {
    void *ctx = cpu_ctx(1);
    size_t gi, i, j;
    int wrong = 0;
    for (gi = 0; ctx && gi < 3; gi++) {
        const mp_conv_geom *g = &avg_geoms[gi];
        size_t n = 2, in = geom_in(g, n), out = geom_out(g, n);
        float *x = floats(in), *y = floats(out), *w = floats(out), *dx = floats(in), h = 1.0f / 64.0f;
        for (i = 0; i < in; i++) x[i] = uniform(-1.0f, 1.0f);
        for (i = 0; i < out; i++) w[i] = uniform(-1.0f, 1.0f);
        cpu->avg_pool_backward(ctx, dx, MP_FLOAT32, w, n, g, MP_FLOAT32);
        for (i = 0; i < in; i++) {
            double up = 0.0, down = 0.0, fd;
            float keep = x[i];
            x[i] = keep + h;
            cpu->avg_pool(ctx, y, x, n, g, MP_FLOAT32);
            for (j = 0; j < out; j++) up += (double)w[j] * y[j];
            x[i] = keep - h;
            cpu->avg_pool(ctx, y, x, n, g, MP_FLOAT32);
            for (j = 0; j < out; j++) down += (double)w[j] * y[j];
            x[i] = keep;
            fd = (up - down) / (2.0 * h);
            wrong += fabs(fd - dx[i]) > 1e-4 + 1e-3 * fabs(fd);
        }
        free(x), free(y), free(w), free(dx);
    }
    CHECK_EQ(wrong, 0);
    if (ctx) cpu->destroy(ctx);
}

/* 1, 2 and 3 threads give the same bytes (a batch large enough to split);
   n = 0 writes nothing. */
static void test_avg_pool_threads(void) {
    static const mp_conv_geom g = {16, 16, 64, 3, 3, 2, 2, 0, 0, 7, 7};
    size_t n = 8, in = geom_in(&g, n), out = geom_out(&g, n), i;
    uint16_t *x = (uint16_t *)zalloc(2 * in), *dy = (uint16_t *)zalloc(2 * out);
    uint16_t *y = (uint16_t *)zalloc(2 * out), *dx = (uint16_t *)zalloc(2 * in);
    uint16_t *y1 = (uint16_t *)zalloc(2 * out), *dx1 = (uint16_t *)zalloc(2 * in);
    int t, d;
    for (d = 1; d < 3; d++) {
        mp_dtype dt = float_types[d], dxt = float_types[3 - d]; /* the gradient in the other 16-bit dtype */
        for (i = 0; i < in; i++) put(x, dt, i, uniform(-1.0f, 1.0f));
        for (i = 0; i < out; i++) put(dy, dt, i, uniform(-1.0f, 1.0f));
        for (t = 1; t <= 3; t++) {
            void *ctx = cpu_ctx(t);
            if (!ctx) continue;
            cpu->avg_pool(ctx, y, x, n, &g, dt);
            cpu->avg_pool_backward(ctx, dx, dxt, dy, n, &g, dt);
            if (t == 1) memcpy(y1, y, 2 * out), memcpy(dx1, dx, 2 * in);
            CHECK(memcmp(y, y1, 2 * out) == 0 && memcmp(dx, dx1, 2 * in) == 0);
            cpu->avg_pool(ctx, y, x, 0, &g, dt);
            cpu->avg_pool_backward(ctx, dx, dxt, dy, 0, &g, dt);
            CHECK(memcmp(y, y1, 2 * out) == 0 && memcmp(dx, dx1, 2 * in) == 0);
            cpu->destroy(ctx);
        }
    }
    free(x), free(dy), free(y), free(dx), free(y1), free(dx1);
}

/* The four through the remote backend (its pointers unreadable by the
   host): the CPU's bytes, so its table hands each op its real operands. */
/* conv_flip puts each value where its rule says, in every dtype, the
   remote table too: a 3x2 kernel of 3 channels and 4 filters. */
static void test_conv_flip(void) {
    static const mp_conv_geom g = {5, 5, 3, 3, 2, 1, 1, 1, 0, 5, 4};
    enum { taps = 6, c = 3, f = 4, n = taps * c * f };
    float src[n], dst[n], got[n];
    void *ctx = cpu_ctx(1), *rctx = NULL, *rs, *rd;
    size_t t, ci, fi, i;
    int k, wrong = 0;
    if (!ctx) return;
    for (k = 0; k < 3; k++) {
        mp_dtype dt = float_types[k];
        for (i = 0; i < n; i++) put(src, dt, i, (float)i); /* exact in every dtype */
        cpu->conv_flip(ctx, dst, src, &g, f, dt);
        for (t = 0; t < taps; t++)
            for (fi = 0; fi < f; fi++)
                for (ci = 0; ci < c; ci++)
                    wrong += get(dst, dt, (t * f + fi) * c + ci) != get(src, dt, ((taps - 1 - t) * c + ci) * f + fi);
    }
    CHECK(wrong == 0);
    if (CHECK(remote.create(&rctx, 1, NULL) == MP_OK)) {
        rs = remote.alloc(rctx, sizeof src), rd = remote.alloc(rctx, sizeof dst);
        remote.copy(rctx, rs, src, sizeof src, MP_COPY_TO_BACKEND);
        remote.conv_flip(rctx, rd, rs, &g, f, MP_BFLOAT16);
        remote.copy(rctx, got, rd, n * 2, MP_COPY_TO_HOST);
        cpu->conv_flip(ctx, dst, src, &g, f, MP_BFLOAT16);
        CHECK(memcmp(got, dst, n * 2) == 0);
        remote.free(rctx, rs), remote.free(rctx, rd);
        remote.destroy(rctx);
    }
    cpu->destroy(ctx);
}

static void test_remote_graph_ops(void) {
    static const mp_conv_geom g = {7, 7, 3, 3, 3, 2, 2, 0, 0, 3, 3};
    enum { n = 2 * 7 * 7 * 3 }; /* 2 images; also the elementwise length and Concatenate's rows x 2 columns */
    float x[n], z[n], y[n], got[n];
    void *ctx = NULL, *cctx = cpu_ctx(2), *rx, *rz, *ry;
    size_t i;
    if (!cctx) return;
    if (!CHECK(remote.create(&ctx, 2, NULL) == MP_OK)) { cpu->destroy(cctx); return; }
    rx = remote.alloc(ctx, sizeof x), rz = remote.alloc(ctx, sizeof z), ry = remote.alloc(ctx, sizeof y);
    for (i = 0; i < n; i++) x[i] = uniform(-1.0f, 1.0f), z[i] = uniform(-1.0f, 1.0f);
    remote.copy(ctx, rx, x, sizeof x, MP_COPY_TO_BACKEND);
    remote.copy(ctx, rz, z, sizeof z, MP_COPY_TO_BACKEND);
    cpu->elementwise(cctx, MP_EW_MULTIPLY, y, MP_FLOAT32, x, MP_FLOAT32, z, MP_FLOAT32, 0.0f, n);
    remote.elementwise(ctx, MP_EW_MULTIPLY, ry, MP_FLOAT32, rx, MP_FLOAT32, rz, MP_FLOAT32, 0.0f, n);
    remote.copy(ctx, got, ry, sizeof got, MP_COPY_TO_HOST);
    CHECK(memcmp(got, y, sizeof y) == 0);
    cpu->copy_cols(cctx, y, MP_FLOAT16, 2, x, MP_FLOAT32, 1, n / 2, 1); /* every other value of the first half */
    remote.copy_cols(ctx, ry, MP_FLOAT16, 2, rx, MP_FLOAT32, 1, n / 2, 1);
    remote.copy(ctx, got, ry, sizeof got, MP_COPY_TO_HOST);
    CHECK(memcmp(got, y, sizeof y) == 0);
    cpu->avg_pool(cctx, y, x, 2, &g, MP_FLOAT32);
    remote.avg_pool(ctx, ry, rx, 2, &g, MP_FLOAT32);
    remote.copy(ctx, got, ry, sizeof got, MP_COPY_TO_HOST);
    CHECK(memcmp(got, y, 2 * 3 * 3 * 3 * sizeof(float)) == 0);
    cpu->avg_pool_backward(cctx, y, MP_FLOAT32, z, 2, &g, MP_FLOAT32);
    remote.avg_pool_backward(ctx, ry, MP_FLOAT32, rz, 2, &g, MP_FLOAT32);
    remote.copy(ctx, got, ry, sizeof got, MP_COPY_TO_HOST);
    CHECK(memcmp(got, y, sizeof y) == 0);
    remote.free(ctx, rx), remote.free(ctx, rz), remote.free(ctx, ry);
    remote.destroy(ctx);
    cpu->destroy(cctx);
}

/* Numerics diagnostics see a device's tensors through copies: the same
   statistics as on the CPU, for every layer and kind. */
static void test_diagnostics(void) {
    mp_model *a = conv_net(mp_cpu_backend(), "mixed_float16", MP_SGD), *b = conv_net(&remote, "mixed_float16", MP_SGD);
    mp_numerics_desc nd;
    mp_fit_desc fd;
    int i, k, same = 1;
    if (!a || !b) { mp_model_destroy(a); mp_model_destroy(b); return; }
    memset(&nd, 0, sizeof nd);
    nd.every = 2;
    CHECK(mp_model_set_numerics(a, &nd) == MP_OK && mp_model_set_numerics(b, &nd) == MP_OK);
    fd = batches_of_16(32, MP_VERBOSE_SILENT);
    CHECK(mp_model_fit(a, &fd) == MP_OK && mp_model_fit(b, &fd) == MP_OK);
    CHECK(mp_model_numerics_step(b) == 2 && mp_model_numerics_step(a) == 2);
    for (i = 0; i < mp_model_layer_count(a); i++)
        for (k = 0; k < MP_NUMERICS_KIND_COUNT; k++) {
            mp_tensor_stats sa, sb;
            if (mp_model_numerics(a, i, (mp_numerics_kind)k, &sa) != MP_OK ||
                mp_model_numerics(b, i, (mp_numerics_kind)k, &sb) != MP_OK || memcmp(&sa, &sb, sizeof sa) != 0)
                same = 0;
        }
    CHECK(same);
    mp_model_destroy(a);
    mp_model_destroy(b);
}

/* A checkpoint of a device model is the same bytes as the CPU's, and
   loads back onto a device model whole (weights, slots, loss scale). */
static void test_checkpoint(void) {
    mp_model *a = conv_net(mp_cpu_backend(), "mixed_float16", MP_ADAM), *b = conv_net(&remote, "mixed_float16", MP_ADAM);
    mp_model *c = conv_net(&remote, "mixed_float16", MP_ADAM);
    mp_fit_desc fd;
    size_t la = 0, lb = 0;
    unsigned char *ca, *cb;
    if (!a || !b || !c) { mp_model_destroy(a); mp_model_destroy(b); mp_model_destroy(c); return; }
    fd = batches_of_16(48, MP_VERBOSE_SILENT);
    CHECK(mp_model_fit(a, &fd) == MP_OK && mp_model_fit(b, &fd) == MP_OK);
    CHECK(mp_model_save_to_memory(a, NULL, 0, &la) == MP_OK && mp_model_save_to_memory(b, NULL, 0, &lb) == MP_OK);
    ca = (unsigned char *)malloc(la);
    cb = (unsigned char *)malloc(lb);
    if (CHECK(ca && cb && la == lb) && CHECK(mp_model_save_to_memory(a, ca, la, &la) == MP_OK) &&
        CHECK(mp_model_save_to_memory(b, cb, lb, &lb) == MP_OK)) {
        CHECK(memcmp(ca, cb, la) == 0);
        CHECK(mp_model_load_from_memory(c, ca, la) == MP_OK);
        CHECK(same_weights(a, c));
        CHECK(mp_model_loss_scale(c)->scale == mp_model_loss_scale(a)->scale &&
              mp_model_loss_scale(c)->skipped_steps == mp_model_loss_scale(a)->skipped_steps);
        /* and c trains on from there as a does */
        CHECK(mp_model_fit(a, &fd) == MP_OK && mp_model_fit(c, &fd) == MP_OK);
        CHECK(same_weights(a, c));
    }
    free(ca);
    free(cb);
    mp_model_destroy(a);
    mp_model_destroy(b);
    mp_model_destroy(c);
}

/* AMP with BiasAdd taken off the infer list makes a last Dense multiply in
   float16 and output float32 (its bias add stays float32): its output is
   read back, and its statistics taken, in the output dtype. */
static void test_amp_output(void) {
    mp_model *m[2] = {NULL, NULL};
    const mp_backend *be[2] = {NULL, &remote};
    mp_model_desc md;
    mp_compile_desc cd;
    mp_numerics_desc nd;
    mp_tensor t[2];
    mp_tensor_stats st;
    float most = 0.0f;
    size_t i;
    int k;
    be[0] = mp_cpu_backend();
    for (k = 0; k < 2; k++) {
        memset(&md, 0, sizeof md);
        md.input_shape[0] = 8 * 8 * 2;
        md.backend = be[k];
        if (!CHECK(mp_model_create(&m[k], &md) == MP_OK)) break;
        mp_model_add(m[k], mp_dense(16, MP_RELU));
        mp_model_add(m[k], mp_dense(CLASSES, MP_LINEAR));
        memset(&cd, 0, sizeof cd);
        cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
        cd.from_logits = 1;
        cd.amp.enabled = 1;
        cd.amp.infer_remove = "BiasAdd";
        memset(&nd, 0, sizeof nd);
        nd.every = 1;
        CHECK(mp_model_compile(m[k], &cd) == MP_OK && mp_model_set_numerics(m[k], &nd) == MP_OK);
        CHECK(forward_rows(m[k], xs, 8, 1) == MP_OK && mp_output(m[k], &t[k]) == MP_OK);
    }
    if (m[0] && m[1]) {
        CHECK(t[0].dtype == MP_FLOAT32 && t[1].dtype == MP_FLOAT32);
        CHECK(memcmp(t[0].data, t[1].data, mp_tensor_bytes(&t[0])) == 0);
        for (i = 0; i < mp_tensor_count(&t[0]); i++)
            if (fabsf(((const float *)t[0].data)[i]) > most) most = fabsf(((const float *)t[0].data)[i]);
        CHECK(mp_model_numerics(m[1], 1, MP_NUMERICS_ACTIVATIONS, &st) == MP_OK && st.max_abs == most);
    }
    mp_model_destroy(m[0]);
    mp_model_destroy(m[1]);
}

/* A backend with Tensor Cores warns once per model, naming each layer whose
   sizes are not multiples of 8 and the padding that fixes it. */
/* What run(arg) writes to file descriptor out (1 or 2), into text. */
static void capture(int out, char *text, size_t cap, void (*run)(void *), void *arg) {
    char path[] = "/tmp/mixprec_outXXXXXX";
    int fd = mkstemp(path), saved = dup(out);
    FILE *f;
    size_t len = 0;
    text[0] = 0;
    if (!CHECK(fd >= 0 && saved >= 0)) return;
    fflush(out == 1 ? stdout : stderr);
    dup2(fd, out);
    run(arg);
    fflush(out == 1 ? stdout : stderr);
    dup2(saved, out);
    close(saved);
    f = fdopen(fd, "r");
    rewind(f);
    len = fread(text, 1, cap - 1, f);
    text[len] = 0;
    fclose(f);
    unlink(path);
}

static void two_forwards(void *arg) {
    mp_model *m = (mp_model *)arg;
    if (!m) return;
    CHECK(forward_rows(m, xs, 5, 0) == MP_OK);
    CHECK(forward_rows(m, xs, 9, 0) == MP_OK); /* a larger batch: no second warning */
}

static void test_tensor_core_warning(void) {
    mp_backend tc = remote;
    mp_model *m;
    char text[4096];
    const char *first;
    tc.tensor_cores = 1;
    m = conv_net(&tc, "mixed_float16", MP_SGD);
    capture(2, text, sizeof text, two_forwards, m); /* the warning comes as a batch is first sized */
    mp_model_destroy(m);
    first = strstr(text, "WARNING: mixprec: the remote backend");
    CHECK(first && !strstr(first + 1, "WARNING"));
    CHECK(strstr(text, "conv2d_1 (Conv2D, 16-bit compute): filters 6 -> pad to 8") != NULL);
    CHECK(strstr(text, "units 4 -> pad to 8") != NULL && strstr(text, "batch size 5 -> pad to 8") != NULL);
}

static void verbose_fit(void *arg) {
    mp_fit_desc fd = batches_of_16(32, MP_VERBOSE_LINES);
    CHECK(mp_model_fit((mp_model *)arg, &fd) == MP_OK);
}

/* fit's first line names the policy; the next says that the data stay on the device. */
static void test_data_on_device_line(void) {
    mp_model *m = conv_net(&remote, "float32", MP_SGD);
    char text[4096];
    if (!m) return;
    capture(1, text, sizeof text, verbose_fit, m);
    CHECK(strncmp(text, "fit: policy float32 (compute float32, variables float32)\nfit: the data (", 72) == 0);
    CHECK(strstr(text, "stays on the remote backend") != NULL);
    mp_model_destroy(m);
}

/* int32 inputs on a device backend: converted on the host as the batch is
   gathered into the staging buffer, shuffled (fit) or in order (predict);
   the same numbers as the float32 array of those values on the CPU. */
static void test_int32_inputs(void) {
    static int32_t ix[N * 8 * 8 * 2];
    static float fx[N * 8 * 8 * 2], pa[N * CLASSES], pb[N * CLASSES];
    static const int shape[3] = {8, 8, 2};
    mp_model *a = conv_net(&remote, "mixed_float16", MP_ADAM), *b = conv_net(mp_cpu_backend(), "mixed_float16", MP_ADAM);
    mp_fit_desc fd;
    float *wa, *wb;
    size_t i;
    if (!a || !b) { mp_model_destroy(a); mp_model_destroy(b); return; }
    for (i = 0; i < N * 8 * 8 * 2; i++) ix[i] = (int32_t)(i * 13 % 9) - 4, fx[i] = (float)ix[i];
    fd = silent_fit(fx, 8 * 8 * 2, labels, N, 16, 2);
    fd.validation_split = 0.25f; /* the validation batches too, in order */
    OK(mp_model_fit(b, &fd), b);
    fd.data.x[0] = mp_array_i32(ix, N, 3, shape); /* never uploaded: batches go from the host */
    OK(mp_model_fit(a, &fd), a);
    wa = weights_of(a), wb = weights_of(b);
    CHECK(memcmp(wa, wb, mp_model_param_count(a) * sizeof(float)) == 0);
    OK(mp_model_predict(a, &fd.data, 7, pa, N * CLASSES), a);
    fd.data = data_xy(fx, 8 * 8 * 2, NULL, N);
    OK(mp_model_predict(b, &fd.data, 7, pb, N * CLASSES), b);
    CHECK(memcmp(pa, pb, sizeof pa) == 0);
    free(wa), free(wb);
    mp_model_destroy(a);
    mp_model_destroy(b);
}

/* A small causal transformer on token ids with (batch, time) labels,
   trained by fit on the remote backend (float32 ids uploaded once, the
   labels gathered by rows of time; int32 ids sent from the host) and on
   the CPU: the same weights, bit for bit. */
enum { SEQ_T = 5, SEQ_V = 7, SEQ_C = 4, SEQ_N = 40 };
static mp_model *sequence_net(const mp_backend *be, const char *policy) {
    mp_model_desc md;
    mp_model *m = NULL;
    mp_compile_desc cd;
    int tok = 0, pos = 0, x = 0, a = 0, in[2], ok;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = SEQ_T;
    md.backend = be;
    md.seed = 9;
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    cd.metrics = MP_METRIC_ACCURACY;
    cd.optimizer.kind = MP_ADAM;
    ok = OK(mp_set_global_policy_name(policy), NULL) && OK(mp_model_create(&m, &md), m);
    ok = ok && OK(mp_model_call(m, mp_embedding(SEQ_V, SEQ_C), NULL, 0, &tok), m);
    ok = ok && OK(mp_model_call(m, mp_position_embedding(SEQ_T), &tok, 1, &pos), m);
    in[0] = tok, in[1] = pos;
    ok = ok && OK(mp_model_call(m, mp_add(), in, 2, &x), m) && OK(mp_model_add(m, mp_layer_normalization()), m);
    ok = ok && OK(mp_model_call(m, mp_multi_head_attention(2, 2, 1), NULL, 0, &a), m);
    in[0] = x, in[1] = a;
    ok = ok && OK(mp_model_call(m, mp_add(), in, 2, NULL), m) && OK(mp_model_add(m, mp_dense(SEQ_V, MP_SOFTMAX)), m);
    mp_set_global_policy_name("float32");
    if (!(ok && OK(mp_model_compile(m, &cd), m))) {
        mp_model_destroy(m);
        return NULL;
    }
    return m;
}

static void test_sequences(void) {
    static int32_t ids[SEQ_N * SEQ_T], next[SEQ_N * SEQ_T];
    static float fids[SEQ_N * SEQ_T];
    int shape = SEQ_T, i, pass;
    for (i = 0; i < SEQ_N * SEQ_T; i++) {
        ids[i] = (int32_t)((i * 5 + i / SEQ_T) % SEQ_V), fids[i] = (float)ids[i];
        next[i] = (ids[i] + 2) % SEQ_V;
    }
    for (pass = 0; pass < 2; pass++) {
        mp_model *a = sequence_net(&remote, "mixed_float16"), *b = sequence_net(mp_cpu_backend(), "mixed_float16");
        mp_fit_desc fd;
        float *wa, *wb;
        if (!a || !b) { mp_model_destroy(a); mp_model_destroy(b); return; }
        memset(&fd, 0, sizeof fd);
        fd.data.x[0] = pass ? mp_array_i32(ids, SEQ_N, 1, &shape) : mp_array_f32(fids, SEQ_N, 1, &shape);
        fd.data.y = mp_array_i32(next, SEQ_N, 1, &shape);
        fd.batch_size = 8;
        fd.epochs = 2;
        fd.validation_split = 0.25f;
        fd.verbose = MP_VERBOSE_SILENT;
        OK(mp_model_fit(a, &fd), a);
        OK(mp_model_fit(b, &fd), b);
        wa = weights_of(a), wb = weights_of(b);
        CHECK(memcmp(wa, wb, mp_model_param_count(a) * sizeof(float)) == 0);
        free(wa), free(wb);
        mp_model_destroy(a);
        mp_model_destroy(b);
    }
}

/* validation_data on a device backend that holds fit's data: read from the
   host, even where its x is fit's own array (here with other labels), and
   the same numbers as on the CPU. */
static void test_validation_data_on_device(void) {
    static int32_t other[24];
    mp_model *a = conv_net(&remote, "float32", MP_SGD), *b = conv_net(mp_cpu_backend(), "float32", MP_SGD);
    mp_logs ha[2], hb[2];
    mp_fit_desc fd;
    size_t i;
    if (!a || !b) { mp_model_destroy(a); mp_model_destroy(b); return; }
    for (i = 0; i < 24; i++) other[i] = (int32_t)((labels[i] + 1) % CLASSES);
    fd = silent_fit(xs, 8 * 8 * 2, labels, N, 16, 2);
    fd.validation_data = data_xy(xs, 8 * 8 * 2, other, 24);
    fd.history = ha;
    OK(mp_model_fit(a, &fd), a);
    fd.history = hb;
    OK(mp_model_fit(b, &fd), b);
    CHECK(ha[1].val_loss == hb[1].val_loss && ha[1].val_accuracy == hb[1].val_accuracy && ha[1].loss == hb[1].loss);
    mp_model_destroy(a);
    mp_model_destroy(b);
}

/* >>normalization ops: batch_norm, layer_norm and their backward passes
   against plain double-precision references (Keras 3's formulas), by
   finite differences, across thread counts and through the remote table. */
typedef struct norm_in {
    size_t rows, cols;
    mp_dtype dt;
    void *x, *dy;     /* in dt */
    double *xd, *dyd; /* as the ops read them */
    float *gb;        /* gamma[cols] then beta[cols] */
    float *moving0;   /* moving mean[cols] then variance[cols] */
} norm_in;

static norm_in norm_make(size_t rows, size_t cols, mp_dtype dt) {
    norm_in in;
    size_t i, n = rows * cols;
    in.rows = rows, in.cols = cols, in.dt = dt;
    in.x = zalloc(n * 4), in.dy = zalloc(n * 4), in.xd = (double *)zalloc(n * sizeof(double));
    in.dyd = (double *)zalloc(n * sizeof(double)), in.gb = floats(2 * cols), in.moving0 = floats(2 * cols);
    for (i = 0; i < n; i++) { /* each column its own offset and spread: means far from 0 */
        size_t c = i % cols;
        put(in.x, dt, i, uniform(-2.0f, 3.0f) * (float)(1 + c % 3) + (float)(c % 5));
        put(in.dy, dt, i, uniform(-1.0f, 1.0f));
        in.xd[i] = get(in.x, dt, i), in.dyd[i] = get(in.dy, dt, i);
    }
    for (i = 0; i < cols; i++) {
        in.gb[i] = uniform(0.5f, 1.5f), in.gb[cols + i] = uniform(-0.5f, 0.5f);
        in.moving0[i] = uniform(-1.0f, 1.0f), in.moving0[cols + i] = uniform(0.5f, 2.0f);
    }
    return in;
}

static void norm_free(norm_in *in) {
    free(in->x), free(in->dy), free(in->xd), free(in->dyd), free(in->gb), free(in->moving0);
}

/* What the ops left: BatchNormalization trained (y, stats, moving), its
   backward (dx, dgamma_beta; again with dx NULL), in inference (y; stats
   and moving there must stay as they were), LayerNormalization likewise. */
typedef struct norm_out {
    void *bn_y, *bn_dx, *inf_y, *ln_y, *ln_dx; /* in yt */
    float *bn_stats, *moving, *bn_dgb, *bn_dgb_alone, *inf_stats, *inf_moving, *ln_stats, *ln_dgb, *ln_dgb_alone;
} norm_out;

static const float NORM_MOMENTUM = 0.9f, NORM_EPSILON = 1e-3f;

static void *as_is(void *p) { return p; }

/* Every op once on backend be (ctx); map turns host pointers into be's. */
static norm_out norm_run(const mp_backend *be, void *ctx, void *(*map)(void *), const norm_in *in, mp_dtype yt) {
    norm_out o;
    size_t rows = in->rows, cols = in->cols, n = rows * cols, i;
    mp_dtype dt = in->dt;
    void *x = map(in->x), *dy = map(in->dy);
    const float *gb = (const float *)map(in->gb);
    o.bn_y = zalloc(n * 4), o.bn_dx = zalloc(n * 4), o.inf_y = zalloc(n * 4), o.ln_y = zalloc(n * 4);
    o.ln_dx = zalloc(n * 4), o.bn_stats = floats(2 * cols), o.moving = floats(2 * cols), o.bn_dgb = floats(2 * cols);
    o.bn_dgb_alone = floats(2 * cols), o.inf_stats = floats(2 * cols), o.inf_moving = floats(2 * cols);
    o.ln_stats = floats(2 * rows), o.ln_dgb = floats(2 * cols), o.ln_dgb_alone = floats(2 * cols);
    memcpy(o.moving, in->moving0, 2 * cols * sizeof(float));
    memcpy(o.inf_moving, in->moving0, 2 * cols * sizeof(float));
    for (i = 0; i < 2 * cols; i++) o.inf_stats[i] = 12345.0f;
    be->batch_norm(ctx, map(o.bn_y), yt, x, dt, rows, cols, gb, (float *)map(o.bn_stats), (float *)map(o.moving),
                   NORM_MOMENTUM, NORM_EPSILON, 1);
    be->batch_norm_backward(ctx, map(o.bn_dx), yt, dy, x, dt, rows, cols, gb, (const float *)map(o.bn_stats),
                            NORM_EPSILON, (float *)map(o.bn_dgb));
    be->batch_norm_backward(ctx, NULL, yt, dy, x, dt, rows, cols, gb, (const float *)map(o.bn_stats), NORM_EPSILON,
                            (float *)map(o.bn_dgb_alone));
    be->batch_norm(ctx, map(o.inf_y), yt, x, dt, rows, cols, gb, (float *)map(o.inf_stats), (float *)map(o.inf_moving),
                   NORM_MOMENTUM, NORM_EPSILON, 0);
    be->layer_norm(ctx, map(o.ln_y), yt, x, dt, rows, cols, gb, NORM_EPSILON, (float *)map(o.ln_stats));
    be->layer_norm_backward(ctx, map(o.ln_dx), yt, dy, x, dt, rows, cols, gb, (const float *)map(o.ln_stats),
                            (float *)map(o.ln_dgb));
    be->layer_norm_backward(ctx, NULL, yt, dy, x, dt, rows, cols, gb, (const float *)map(o.ln_stats),
                            (float *)map(o.ln_dgb_alone));
    return o;
}

static void norm_out_free(norm_out *o) {
    free(o->bn_y), free(o->bn_dx), free(o->inf_y), free(o->ln_y), free(o->ln_dx), free(o->bn_stats), free(o->moving);
    free(o->bn_dgb), free(o->bn_dgb_alone), free(o->inf_stats), free(o->inf_moving), free(o->ln_stats);
    free(o->ln_dgb), free(o->ln_dgb_alone);
}

/* Whether two runs left the same bytes everywhere (one check). */
static int norm_same(const norm_in *in, mp_dtype yt, const norm_out *a, const norm_out *b) {
    size_t n = in->rows * in->cols * dsize(yt), c = 2 * in->cols * sizeof(float);
    return CHECK(memcmp(a->bn_y, b->bn_y, n) == 0 && memcmp(a->bn_dx, b->bn_dx, n) == 0 &&
                 memcmp(a->inf_y, b->inf_y, n) == 0 && memcmp(a->ln_y, b->ln_y, n) == 0 &&
                 memcmp(a->ln_dx, b->ln_dx, n) == 0 && memcmp(a->bn_stats, b->bn_stats, c) == 0 &&
                 memcmp(a->moving, b->moving, c) == 0 && memcmp(a->bn_dgb, b->bn_dgb, c) == 0 &&
                 memcmp(a->ln_dgb, b->ln_dgb, c) == 0 &&
                 memcmp(a->ln_stats, b->ln_stats, in->rows * 2 * sizeof(float)) == 0);
}

/* The element of group g (a column for BatchNormalization, a row for
   LayerNormalization), member m. */
static size_t norm_at(const norm_in *in, int per_row, size_t g, size_t m) {
    return per_row ? g * in->cols + m : m * in->cols + g;
}

/* Each group's mean and biased variance in double. */
static void ref_moments(const norm_in *in, int per_row, double *mean, double *var) {
    size_t groups = per_row ? in->rows : in->cols, count = per_row ? in->cols : in->rows, g, m;
    for (g = 0; g < groups; g++) {
        double s = 0.0, v = 0.0;
        for (m = 0; m < count; m++) s += in->xd[norm_at(in, per_row, g, m)];
        mean[g] = s / (double)count;
        for (m = 0; m < count; m++) v += (in->xd[norm_at(in, per_row, g, m)] - mean[g]) * (in->xd[norm_at(in, per_row, g, m)] - mean[g]);
        var[g] = v / (double)count;
    }
}

/* y = (x - mean) / sqrt(var + eps) gamma + beta, and the closed-form
   gradient of sum(dy y): dgamma = sum dy xhat, dbeta = sum dy over the
   rows; dx = k (g - mean(g) - xhat mean(g xhat)) over the group, with
   k = gamma rstd and g = dy (BatchNormalization), k = rstd and g = dy
   gamma (LayerNormalization). */
static void ref_norm(const norm_in *in, int per_row, const double *mean, const double *var, double *y, double *dx,
                     double *dgb) {
    size_t groups = per_row ? in->rows : in->cols, count = per_row ? in->cols : in->rows, g, m, cols = in->cols;
    memset(dgb, 0, 2 * cols * sizeof(double));
    for (g = 0; g < groups; g++) {
        double rstd = 1.0 / sqrt(var[g] + (double)NORM_EPSILON), mg = 0.0, mgx = 0.0;
        for (m = 0; m < count; m++) {
            size_t i = norm_at(in, per_row, g, m), c = i % cols;
            double xhat = (in->xd[i] - mean[g]) * rstd, gi = per_row ? in->dyd[i] * in->gb[c] : in->dyd[i];
            y[i] = xhat * in->gb[c] + in->gb[cols + c];
            dgb[c] += in->dyd[i] * xhat, dgb[cols + c] += in->dyd[i];
            mg += gi / (double)count, mgx += gi * xhat / (double)count;
        }
        for (m = 0; m < count; m++) {
            size_t i = norm_at(in, per_row, g, m), c = i % cols;
            double xhat = (in->xd[i] - mean[g]) * rstd, gi = per_row ? in->dyd[i] * in->gb[c] : in->dyd[i];
            dx[i] = (per_row ? rstd : in->gb[c] * rstd) * (gi - mg - xhat * mgx);
        }
    }
}

static int near(double got, double want, double atol, double rtol) { return fabs(got - want) <= atol + rtol * fabs(want); }
/* a result rounded once into t: half an ulp of t relative, with float32's own error */
static double norm_rtol(mp_dtype t) { return t == MP_FLOAT32 ? 1e-5 : t == MP_FLOAT16 ? 1.0 / 1024 : 1.0 / 128; }

/* How many of n values in t (or float32: t == MP_DTYPE_COUNT) miss the reference. */
static size_t norm_misses(const char *what, const void *got, mp_dtype t, const double *want, size_t n, double atol,
                          double rtol) {
    size_t i, bad = 0;
    for (i = 0; i < n; i++) {
        double g = t == MP_DTYPE_COUNT ? (double)((const float *)got)[i] : (double)get(got, t, i);
        if (near(g, want[i], atol, rtol)) continue;
        if (++bad <= 3) fprintf(stderr, "  %s[%zu]: %.9g, want %.9g\n", what, i, g, want[i]);
    }
    return bad;
}

/* The outputs against the references (mixed dtypes: x in in->dt, y in yt). */
static void norm_check(const norm_in *in, mp_dtype yt, const norm_out *o) {
    size_t rows = in->rows, cols = in->cols, n = rows * cols, c, r, bad = 0;
    double *mean = (double *)zalloc((rows + cols) * sizeof(double)), *var = (double *)zalloc((rows + cols) * sizeof(double));
    double *y = (double *)zalloc(n * sizeof(double)), *dx = (double *)zalloc(n * sizeof(double));
    double *dgb = (double *)zalloc(2 * cols * sizeof(double)), *want = (double *)zalloc(2 * (rows + cols) * sizeof(double));
    double out_tol = norm_rtol(yt), sum_atol = 1e-5 * (double)rows;
    /* BatchNormalization, training: the batch's moments, Keras's moving update */
    ref_moments(in, 0, mean, var);
    for (c = 0; c < cols; c++) want[c] = mean[c], want[cols + c] = var[c];
    bad += norm_misses("bn stats", o->bn_stats, MP_DTYPE_COUNT, want, 2 * cols, 1e-6, 1e-5);
    for (c = 0; c < 2 * cols; c++)
        want[c] = (double)in->moving0[c] * NORM_MOMENTUM + want[c] * (1.0 - (double)NORM_MOMENTUM);
    bad += norm_misses("moving", o->moving, MP_DTYPE_COUNT, want, 2 * cols, 1e-6, 1e-5);
    ref_norm(in, 0, mean, var, y, dx, dgb);
    bad += norm_misses("bn y", o->bn_y, yt, y, n, 1e-4, out_tol);
    bad += norm_misses("bn dx", o->bn_dx, yt, dx, n, 2e-4, out_tol);
    bad += norm_misses("bn dgamma, dbeta", o->bn_dgb, MP_DTYPE_COUNT, dgb, 2 * cols, sum_atol, 1e-5);
    CHECK(memcmp(o->bn_dgb, o->bn_dgb_alone, 2 * cols * sizeof(float)) == 0); /* dx NULL: the same sums */
    /* inference: y from the moving statistics, which stay, as stats */
    for (c = 0; c < cols; c++) mean[c] = in->moving0[c], var[c] = in->moving0[cols + c];
    ref_norm(in, 0, mean, var, y, dx, dgb);
    bad += norm_misses("inference y", o->inf_y, yt, y, n, 1e-4, out_tol);
    CHECK(memcmp(o->inf_moving, in->moving0, 2 * cols * sizeof(float)) == 0);
    for (c = 0; c < 2 * cols; c++) bad += o->inf_stats[c] != 12345.0f;
    /* LayerNormalization: each row's mean and rstd */
    ref_moments(in, 1, mean, var);
    for (r = 0; r < rows; r++) want[2 * r] = mean[r], want[2 * r + 1] = 1.0 / sqrt(var[r] + (double)NORM_EPSILON);
    bad += norm_misses("ln stats", o->ln_stats, MP_DTYPE_COUNT, want, 2 * rows, 1e-6, 1e-5);
    ref_norm(in, 1, mean, var, y, dx, dgb);
    bad += norm_misses("ln y", o->ln_y, yt, y, n, 1e-4, out_tol);
    bad += norm_misses("ln dx", o->ln_dx, yt, dx, n, 2e-4, out_tol);
    bad += norm_misses("ln dgamma, dbeta", o->ln_dgb, MP_DTYPE_COUNT, dgb, 2 * cols, sum_atol, 1e-5);
    CHECK(memcmp(o->ln_dgb, o->ln_dgb_alone, 2 * cols * sizeof(float)) == 0);
    if (bad) fprintf(stderr, "  %zux%zu, %s in, %s out: %zu misses\n", rows, cols, dn(in->dt), dn(yt), bad);
    CHECK_EQ(bad, 0);
    free(mean), free(var), free(y), free(dx), free(dgb), free(want);
}

/* Every op on every dtype in (the output in each dtype in turn) against
   the references; on 1, 2 and 3 threads and through the remote table the
   same bytes. Shapes: one row (BatchNormalization's variance 0: y = beta,
   dx = 0), one column (LayerNormalization's likewise), columns past the
   CPU's tile of 256, rows past a part of 256, batches the pool splits by
   columns and by rows. */
static void test_norm_values(void) {
    static const size_t shapes[][2] = {{1, 5}, {7, 1}, {300, 33}, {600, 300}, {7000, 10}};
    void *ctx[3] = {NULL, NULL, NULL};
    size_t s, t;
    int d;
    for (t = 0; t < 3; t++)
        if (!CHECK(cpu->create(&ctx[t], (int)t + 1, NULL) == MP_OK)) return;
    for (s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (d = 0; d < 3; d++) {
            mp_dtype dt = (mp_dtype)d, yt = (mp_dtype)((d + s) % 3);
            norm_in in = norm_make(shapes[s][0], shapes[s][1], dt);
            norm_out o[3], via_remote;
            for (t = 0; t < 3; t++) o[t] = norm_run(cpu, ctx[t], as_is, &in, yt);
            norm_check(&in, yt, &o[0]);
            norm_same(&in, yt, &o[0], &o[1]);
            norm_same(&in, yt, &o[0], &o[2]);
            via_remote = norm_run(&remote, ctx[0], fake, &in, yt);
            norm_same(&in, yt, &o[0], &via_remote);
            for (t = 0; t < 3; t++) norm_out_free(&o[t]);
            norm_out_free(&via_remote);
            norm_free(&in);
        }
    for (t = 0; t < 3; t++) cpu->destroy(ctx[t]);
}

/* The order of the sums that mixprec.h fixes for every backend (>>rules),
   written out here in float32: a batch's statistics summed a column at a
   time in parts of 256 rows (each part in row order from 0, then the
   parts in order from 0), a layer's statistics a row at a time as a warp
   sums it (lane l takes columns l, l + 32, ... in order, then the xor
   butterfly). The CPU's statistics must have exactly these bits, which
   the CUDA backend's kernels also give (test_cuda's norms). */
static float order_column(const norm_in *in, size_t c, float mean, int squares) {
    float total = 0.0f;
    size_t r0, r;
    for (r0 = 0; r0 < in->rows; r0 += 256) {
        float part = 0.0f;
        for (r = r0; r < in->rows && r < r0 + 256; r++) {
            float v = (float)in->xd[r * in->cols + c], d = v - mean, sq = d * d; /* one rounding each */
            part += squares ? sq : v;
        }
        total += part;
    }
    return total / (float)in->rows;
}
static float order_row(const norm_in *in, size_t r, float mean, int squares) {
    float lane[32], next[32];
    size_t j, m;
    memset(lane, 0, sizeof lane);
    for (j = 0; j < in->cols; j++) {
        float v = (float)in->xd[r * in->cols + j], d = v - mean, sq = d * d;
        lane[j % 32] += squares ? sq : v;
    }
    for (m = 16; m > 0; m /= 2) {
        for (j = 0; j < 32; j++) next[j] = lane[j] + lane[j ^ m];
        memcpy(lane, next, sizeof lane);
    }
    return lane[0] / (float)in->cols;
}
static void test_norm_order(void) {
    static const size_t shapes[][2] = {{600, 70}, {3, 300}, {1000, 1}};
    void *ctx = NULL;
    size_t s, i, wrong = 0;
    int d;
    if (!CHECK(cpu->create(&ctx, 2, NULL) == MP_OK)) return;
    for (s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (d = 0; d < 3; d++) {
            norm_in in = norm_make(shapes[s][0], shapes[s][1], (mp_dtype)d);
            norm_out o = norm_run(cpu, ctx, as_is, &in, MP_FLOAT32);
            float want[2];
            for (i = 0; i < in.cols; i++) {
                want[0] = order_column(&in, i, 0.0f, 0);
                want[1] = order_column(&in, i, want[0], 1);
                wrong += memcmp(&want[0], &o.bn_stats[i], 4) != 0 || memcmp(&want[1], &o.bn_stats[in.cols + i], 4) != 0;
            }
            for (i = 0; i < in.rows; i++) {
                want[0] = order_row(&in, i, 0.0f, 0);
                want[1] = 1.0f / sqrtf(order_row(&in, i, want[0], 1) + NORM_EPSILON);
                wrong += memcmp(want, &o.ln_stats[2 * i], 8) != 0;
            }
            norm_out_free(&o);
            norm_free(&in);
        }
    CHECK_EQ(wrong, 0);
    cpu->destroy(ctx);
}

/* sum(dy y) in double for BatchNormalization in training (bn) or
   LayerNormalization, x and y float32. */
static double norm_loss(void *ctx, const norm_in *in, int bn) {
    size_t n = in->rows * in->cols, i;
    float *y = floats(n), *stats = floats(2 * (in->rows + in->cols)), *moving = floats(2 * in->cols);
    double loss = 0.0;
    if (bn) cpu->batch_norm(ctx, y, MP_FLOAT32, in->x, MP_FLOAT32, in->rows, in->cols, in->gb, stats, moving,
                            NORM_MOMENTUM, NORM_EPSILON, 1);
    else cpu->layer_norm(ctx, y, MP_FLOAT32, in->x, MP_FLOAT32, in->rows, in->cols, in->gb, NORM_EPSILON, stats);
    for (i = 0; i < n; i++) loss += in->dyd[i] * (double)y[i];
    free(y), free(stats), free(moving);
    return loss;
}

/* The central difference of norm_loss in *v (h either side). */
static double norm_slope(void *ctx, const norm_in *in, int bn, float *v) {
    const float h = 1e-2f;
    float keep = *v;
    double up, down;
    *v = keep + h;
    up = norm_loss(ctx, in, bn);
    *v = keep - h;
    down = norm_loss(ctx, in, bn);
    *v = keep;
    return (up - down) / (double)(2.0f * h);
}

/* dx, dgamma and dbeta of both layers against central differences of the
   scalar loss sum(dy y), in float32, every element of small batches. */
static void test_norm_finite_differences(void) {
    static const size_t shapes[][2] = {{6, 3}, {1, 4}, {5, 1}, {4, 37}};
    void *ctx = NULL;
    size_t s, i;
    int bn;
    if (!CHECK(cpu->create(&ctx, 1, NULL) == MP_OK)) return;
    for (s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (bn = 0; bn <= 1; bn++) {
            norm_in in = norm_make(shapes[s][0], shapes[s][1], MP_FLOAT32);
            norm_out o = norm_run(cpu, ctx, as_is, &in, MP_FLOAT32);
            size_t n = in.rows * in.cols, bad = 0;
            const float *dx = (const float *)(bn ? o.bn_dx : o.ln_dx), *dgb = bn ? o.bn_dgb : o.ln_dgb;
            for (i = 0; i < n; i++) {
                double fd = norm_slope(ctx, &in, bn, (float *)in.x + i);
                if (!near(dx[i], fd, 2e-3, 1e-2) && ++bad <= 3)
                    fprintf(stderr, "  %s dx[%zu] %.7g, finite difference %.7g\n", bn ? "bn" : "ln", i, (double)dx[i], fd);
            }
            for (i = 0; i < 2 * in.cols; i++) {
                double fd = norm_slope(ctx, &in, bn, in.gb + i);
                if (!near(dgb[i], fd, 2e-3, 1e-2) && ++bad <= 3)
                    fprintf(stderr, "  %s dgamma_beta[%zu] %.7g, finite difference %.7g\n", bn ? "bn" : "ln", i,
                            (double)dgb[i], fd);
            }
            CHECK_EQ(bad, 0);
            norm_out_free(&o);
            norm_free(&in);
        }
    cpu->destroy(ctx);
}

/* GELU's tanh (>>rules' mp__tanh_gelu): within 2^-22 of tanh in float64
   over every 64th float32 from 2^-20 to 12 and their negatives (odd, 1
   past the clamp), the build's vector row (mp__tanh_gelu_run) giving the
   scalar's bits, and GELU's runs (mp__act_run, mp__act_grad_run) mp__act's and
   mp__act_grad's bits, tails included. */
/* The softmax's exponential (>>rules' mp__softmax_exp, mp__exp_taylor):
   within 2 ulp of e^x in float64 over [-87, 0] (every 2^12th float32),
   the build's vector row giving the scalar's bits at every length, and
   the ends: 0 below -87 and at -Inf, NaN kept, e^0 = 1. */
static void test_softmax_exp(void) {
    enum { RUN_LEN = 4099 };
    static const float specials[] = {0.0f, -0.0f, -87.5f, -1e30f, -INFINITY};
    static float x[RUN_LEN], e[RUN_LEN], v[RUN_LEN];
    uint32_t b = 0x80000000u; /* -0, then every 4096th float down to -87 */
    double worst = 0.0;
    size_t n, i, bad = 0;
    float nan = NAN;
    while (b < 0xC2AE0000u) { /* -87 */
        for (n = 0; n < RUN_LEN && b < 0xC2AE0000u; n++, b += 4096) memcpy(&x[n], &b, 4);
        for (i = 0; i < n; i++) {
            double want = exp((double)x[i]), ulp = ldexp(1.0, ilogb(want) - 23);
            double err = fabs((double)mp__softmax_exp(x[i]) - want) / ulp;
            worst = err > worst ? err : worst;
        }
        mp__softmax_exp_run_scalar(e, x, n);
        mp__softmax_exp_run(v, x, n);
        bad += memcmp(e, v, n * sizeof(float)) != 0;
    }
    if (!CHECK(worst <= 2.0 && bad == 0)) fprintf(stderr, "  softmax exp: worst %g ulp, %zu runs differ\n", worst, bad);
    for (i = 0; i < sizeof specials / sizeof specials[0]; i++)
        CHECK(mp__softmax_exp(specials[i]) == (specials[i] == 0.0f ? 1.0f : 0.0f));
    CHECK(mp__softmax_exp(nan) != mp__softmax_exp(nan));
    for (n = 1; n <= 40; n += 13) { /* the rows' tails and specials in vector lanes */
        for (i = 0; i < n; i++) x[i] = i % 5 == 0 ? -INFINITY : i % 7 == 0 ? nan : -0.37f * (float)i;
        mp__softmax_exp_run_scalar(e, x, n);
        mp__softmax_exp_run(v, x, n);
        for (i = 0; i < n; i++) bad += !(e[i] == v[i] || (e[i] != e[i] && v[i] != v[i]));
    }
    if (!CHECK(bad == 0)) fprintf(stderr, "  softmax exp rows: %zu values differ\n", bad);
}

static void test_gelu_tanh(void) {
    enum { RUN_LEN = 4096 };
    static const float specials[] = {0.0f, -0.0f, 9.5f, 10.0f, 11.0f, 1e30f, INFINITY, -INFINITY};
    static float u[RUN_LEN], t[RUN_LEN], g[RUN_LEN], v[RUN_LEN];
    uint32_t b = 0x35800000u; /* 2^-20 */
    double worst = 0.0;
    size_t n = 0, i, bad = 0;
    int done = 0;
    while (!done) {
        for (n = 0; n < RUN_LEN && !done; n += 2, b += 64) {
            memcpy(&u[n], &b, 4);
            done = u[n] > 12.0f;
            u[n + 1] = -u[n];
        }
        for (i = 0; i < n; i++) {
            double e = fabs((double)mp__tanh_gelu(u[i]) - tanh((double)u[i]));
            worst = e > worst ? e : worst;
        }
        mp__tanh_gelu_run_scalar(t, u, n);
        for (i = 0; i < n; i += 2) bad += t[i + 1] != -t[i] || (u[i] > 10.0f && t[i] != 1.0f);
        mp__tanh_gelu_run(g, u, n);
        bad += memcmp(g, t, n * sizeof(float)) != 0;
    }
    if (!CHECK(worst <= ldexp(1.0, -22) && bad == 0)) fprintf(stderr, "  tanh for GELU: worst %g, %zu bad\n", worst, bad);
    for (i = 0; i < sizeof specials / sizeof specials[0]; i++)
        CHECK(mp__tanh_gelu(specials[i]) == (specials[i] < 0.0f ? -1.0f : specials[i] > 9.0f ? 1.0f : 0.0f));
    for (n = 1; n <= 200; n += 33) { /* GELU's runs, lengths past and short of the rows' widths */
        for (i = 0; i < n; i++) v[i] = u[i] = (float)i / 8.0f - 12.0f, g[i] = t[i] = 1.0f - (float)i / 100.0f;
        mp__act_run(MP_GELU_APPROXIMATE, v, n);
        mp__act_grad_run(MP_GELU_APPROXIMATE, g, v, u, n);
        for (i = 0; i < n; i++) {
            bad += v[i] != mp__act(MP_GELU_APPROXIMATE, u[i]);
            bad += g[i] != t[i] * mp__act_grad(MP_GELU_APPROXIMATE, v[i], u[i]);
        }
    }
    if (!CHECK(bad == 0)) fprintf(stderr, "  GELU runs: %zu values differ from mp__act's\n", bad);
}

int main(int argc, char **argv) {
    size_t start = mp_get_memory_info().current;
    check_args(argc, argv);
    cpu = mp_cpu_backend();
    make_data();
    RUN(test_same_training("float32", MP_RMSPROP));
    RUN(test_same_training("mixed_float16", MP_ADAM));
    RUN(test_same_training("mixed_bfloat16", MP_SGD));
    RUN(test_same_training("amp", MP_ADAM)); /* layers whose output dtype differs from their compute dtype */
    RUN(test_same_training_options());
    RUN(test_no_sum_squares());
    RUN(test_step_traffic());
    RUN(test_no_pinned_memory());
    RUN(test_reads());
    RUN(test_device_nonfinite());
    RUN(test_check_alone());
    RUN(test_unscale_values());
    RUN(test_sequences());
    RUN(test_scale_cast());
    RUN(test_elementwise_values());
    RUN(test_elementwise_in_place());
    RUN(test_copy_cols());
    RUN(test_avg_pool_values());
    RUN(test_avg_pool_gradient());
    RUN(test_avg_pool_threads());
    RUN(test_conv_flip());
    RUN(test_remote_graph_ops());
    RUN(test_bias_grad_values());
    RUN(test_loss_values());
    RUN(test_norm_values());
    RUN(test_norm_finite_differences());
    RUN(test_norm_order());
    RUN(test_gelu_tanh());
    RUN(test_softmax_exp());
    RUN(test_diagnostics());
    RUN(test_checkpoint());
    RUN(test_amp_output());
    RUN(test_tensor_core_warning());
    RUN(test_data_on_device_line());
    RUN(test_int32_inputs());
    RUN(test_validation_data_on_device());
    CHECK(mp_get_memory_info().current == start); /* every model gave back every byte */
    return check_done("test_backend");
}
