/* data_parallel.h - what test_comm.c (forked ranks, a shared-memory
   communicator) and test_mpi.c (Open MPI) share: the data set, the model
   each rank builds, the state every rank must hold alike, a CRC of bytes
   and a relative difference. Include after
   mixprec.h and helpers.h. */
#ifndef MIXPREC_TEST_DATA_PARALLEL_H
#define MIXPREC_TEST_DATA_PARALLEL_H

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
