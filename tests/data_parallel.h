/* data_parallel.h - what test_comm.c (forked ranks, a shared-memory
   communicator) and test_mpi.c (Open MPI) share: the data sets, the models
   each rank builds (an MLP, and examples/gpt_model.h's GPT), the state
   every rank must hold alike, a CRC of bytes and a relative difference.
   Include after mixprec.h and helpers.h. */
#ifndef MIXPREC_TEST_DATA_PARALLEL_H
#define MIXPREC_TEST_DATA_PARALLEL_H
#include "../examples/gpt_model.h"

#define NS 96 /* samples: NF features, 3 classes */
#define NF 6
static float xs[NS * NF];
static int32_t ys[NS];

/* The same stream in every process. */
static void make_data(void) {
    int i, f;
    for (i = 0; i < NS; i++) {
        ys[i] = (int32_t)(i % 3);
        for (f = 0; f < NF; f++) xs[i * NF + f] = normal() * 0.5f + (f % 3 == ys[i] ? 1.0f : 0.0f);
    }
}

#define MAXW 4096 /* weights, and slots, a snapshot holds */

/* What every rank must hold alike: the weights, the optimizer's slots, the
   loss scale and the steps it skipped. */
typedef struct model_state {
    size_t nw, ns;
    float w[MAXW], s[MAXW], scale;
    uint32_t skipped;
} model_state;

static void get_state(mp_model *m, model_state *st) {
    memset(st, 0, sizeof *st);
    st->nw = mp_model_param_count(m);
    st->ns = mp_optimizer_slot_count(m);
    if (st->nw <= MAXW) mp_model_get_weights(m, st->w, st->nw);
    if (st->ns <= MAXW) mp_get_optimizer_slots(m, st->s, st->ns);
    st->scale = mp_current_loss_scale(m);
    st->skipped = mp_model_loss_scale(m) ? mp_model_loss_scale(m)->skipped_steps : 0;
}

/* Rank `rank`'s seed: a different one on every rank. */
static uint64_t rank_seed(int rank) { return 1000u + (uint64_t)rank * 77u; }

static mp_dtype rank_allreduce_dtype; /* mp_model_desc.allreduce_dtype of the next models */
static mp_optimizer_desc rank_optimizer; /* the next models' optimizer options (Adam, lr 0.01, with these) */
static int rank_units = 16;           /* the hidden layer's units of the next models */
static mp_loss_scale_desc rank_loss_scale; /* their loss scale's configuration (zero: Keras's) */

/* NF-rank_units-3 with a float32 softmax, Adam, under `policy`; NULL on failure. */
static mp_model *rank_model(const mp_communicator *comm, uint64_t seed, const char *policy) {
    mp_model_desc md;
    mp_compile_desc cd;
    mp_layer_desc out = mp_activation_layer(MP_SOFTMAX);
    mp_model *m = NULL;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = NF;
    md.seed = seed;
    md.threads = 1;
    md.comm = comm;
    md.allreduce_dtype = rank_allreduce_dtype;
    mp_set_global_policy_name(policy);
    if (mp_model_create(&m, &md) != MP_OK) return NULL;
    mp_model_add(m, mp_dense(rank_units, MP_RELU));
    mp_model_add(m, mp_dense(3, MP_LINEAR));
    out.dtype = "float32";
    mp_model_add(m, out);
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    cd.metrics = MP_METRIC_ACCURACY;
    cd.optimizer = rank_optimizer;
    cd.optimizer.kind = rank_optimizer.kind == MP_ADAMW ? MP_ADAMW : MP_ADAM;
    cd.optimizer.learning_rate = 0.01f;
    cd.loss_scale_config = rank_loss_scale;
    if (mp_model_compile(m, &cd) != MP_OK) {
        mp_model_destroy(m);
        return NULL;
    }
    return m;
}

#define GV 11 /* vocabulary */
#define GT 6  /* context */
#define GN 32 /* sequences */
static int32_t gpt_ids[GN * GT], gpt_next[GN * GT];

/* Token ids and their successors (+2 mod GV): the same in every process. */
static void make_gpt_data(void) {
    int i;
    for (i = 0; i < GN * GT; i++) {
        gpt_ids[i] = (int32_t)((i * 5 + i / GT) % GV);
        gpt_next[i] = (gpt_ids[i] + 2) % GV;
    }
}

/* gpt_layers' GPT (1 block, 2 heads, 8 channels) under mixed_float16,
   compiled with gpt_model.h's recipe (logits, AdamW with the biases, norms
   and embeddings out of its decay, the global norm clipped). */
static mp_model *gpt_model(const mp_communicator *comm, uint64_t seed) {
    mp_model_desc md;
    mp_compile_desc cd = gpt_recipe();
    mp_model *m = NULL;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = GT;
    md.seed = seed;
    md.threads = 1;
    md.comm = comm;
    cd.metrics = MP_METRIC_ACCURACY;
    cd.optimizer.learning_rate = 0.01f;
    mp_set_global_policy_name("mixed_float16");
    if (mp_model_create(&m, &md) != MP_OK) return NULL;
    if (gpt_layers(m, GV, GT, 1, 2, 8) != MP_OK || mp_model_compile(m, &cd) != MP_OK) {
        mp_model_destroy(m);
        return NULL;
    }
    return m;
}

/* fit of the GPT: 3 epochs of the GN sequences at global batch 8, a
   quarter to validate, silent, cb called. */
static mp_fit_desc gpt_fit(mp_callback *cb) {
    mp_fit_desc fd;
    int shape = GT;
    memset(&fd, 0, sizeof fd);
    fd.data.x[0] = mp_array_i32(gpt_ids, GN, 1, &shape);
    fd.data.y = mp_array_i32(gpt_next, GN, 1, &shape);
    fd.batch_size = 8;
    fd.epochs = 3;
    fd.validation_split = 0.25f;
    fd.verbose = MP_VERBOSE_SILENT;
    fd.callbacks = cb;
    fd.callback_count = 1;
    return fd;
}

static uint32_t crc_of(const void *p, size_t bytes) { /* zlib's CRC-32 */
    const unsigned char *b = (const unsigned char *)p;
    uint32_t c = 0xFFFFFFFFu;
    size_t i;
    int k;
    for (i = 0; i < bytes; i++)
        for (c ^= b[i], k = 0; k < 8; k++) c = c & 1u ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    return ~c;
}

/* max |a - b| / (1 + max |b|) */
static float rel_diff(const float *a, const float *b, size_t n) {
    float d = 0.0f, top = 0.0f;
    size_t i;
    for (i = 0; i < n; i++) {
        if (fabsf(a[i] - b[i]) > d) d = fabsf(a[i] - b[i]);
        if (fabsf(b[i]) > top) top = fabsf(b[i]);
    }
    return d / (1.0f + top);
}
#endif
