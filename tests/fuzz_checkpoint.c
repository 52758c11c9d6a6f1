/* fuzz_checkpoint.c - libFuzzer target for the checkpoint and
   inference-weights readers (mp_model_load_from_memory,
   mp_model_import_weights_from_memory). Each input goes into a compiled
   mixed_float16 model (Adam, loss scaling, Dropout) that has trained a few
   steps, into one that is only built, and into a built functional model
   (BatchNormalization with its moving statistics, a residual Add, a
   Concatenate with the input: format version 3), each as a checkpoint and
   as a weights file, twice: as it is, and with its length field and CRC made
   right, so that the fuzzer also reaches the body behind the checksum. A
   load that fails must say MP_ERR_FORMAT, MP_ERR_SHAPE or MP_ERR_STATE and
   leave the model's bytes as they were; one that succeeds is undone.

       clang -fsanitize=fuzzer,address,undefined -g -O1 tests/fuzz_checkpoint.c -o fuzz_checkpoint -lm
       mkdir -p corpus && MP_FUZZ_SEEDS=corpus ./fuzz_checkpoint corpus -max_total_time=60

   MP_FUZZ_SEEDS=dir writes valid files (the seeds) into dir at start. */
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#include "forge.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct target {
    mp_model *m;
    unsigned char *bytes; /* its checkpoint: the state to keep */
    size_t len;
} target;
static target compiled, built, graph;

static unsigned char *saved(mp_model *m, int export_dtype, size_t *len) {
    unsigned char *b;
    mp_status st = export_dtype < 0 ? mp_model_save_to_memory(m, NULL, 0, len)
                                    : mp_model_export_weights_to_memory(m, (mp_dtype)export_dtype, NULL, 0, len);
    if (st != MP_OK || !(b = (unsigned char *)malloc(*len))) abort();
    st = export_dtype < 0 ? mp_model_save_to_memory(m, b, *len, len)
                          : mp_model_export_weights_to_memory(m, (mp_dtype)export_dtype, b, *len, len);
    if (st != MP_OK) abort();
    return b;
}

static mp_model *model(int compile) {
    static float x[16 * 5];
    static int32_t y[16];
    mp_model_desc md;
    mp_compile_desc cd;
    mp_fit_desc fd;
    mp_layer_desc out = mp_activation_layer(MP_SOFTMAX);
    mp_model *m = NULL;
    int i;
    for (i = 0; i < 16 * 5; i++) x[i] = (float)(i % 7) / 7.0f;
    for (i = 0; i < 16; i++) y[i] = i % 3;
    memset(&md, 0, sizeof md);
    memset(&cd, 0, sizeof cd);
    memset(&fd, 0, sizeof fd);
    md.input_shape[0] = 5;
    md.threads = 1;
    out.dtype = "float32";
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    cd.optimizer.kind = MP_ADAM;
    cd.loss_scale_config.initial_scale = 1048576.0f;
    cd.loss_scale_config.growth_interval = 3;
    fd.data.x[0] = mp_rows(x, 16, 5);
    fd.data.y = mp_labels(y, 16);
    fd.batch_size = 4;
    fd.verbose = MP_VERBOSE_SILENT;
    mp_set_global_policy_name("mixed_float16");
    if (mp_model_create(&m, &md) || mp_model_add(m, mp_dense(4, MP_RELU)) || mp_model_add(m, mp_dropout(0.5f)) ||
        mp_model_add(m, mp_dense(3, MP_LINEAR)) || mp_model_add(m, out) ||
        (compile ? mp_model_compile(m, &cd) || mp_model_fit(m, &fd) : mp_model_build(m)))
        abort();
    return m;
}

/* input(5) -> dense(4, relu) -> batch_normalization; add([it, dense]);
   concatenate([add, input]) -> dense(3); built, its moving statistics
   set off their defaults. */
static mp_model *graph_model(void) {
    static const int wiring[5][3] = {{1, 0}, {1, 1}, {2, 2, 1}, {2, 3, 0}, {1, 4}};
    mp_layer_desc layers[5];
    mp_model_desc md;
    mp_model *m = NULL;
    float w[24 + 16 + 30];
    int i;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 5;
    md.threads = 1;
    layers[0] = mp_dense(4, MP_RELU);
    layers[1] = mp_batch_normalization();
    layers[2] = mp_add();
    layers[3] = mp_concatenate(0);
    layers[4] = mp_dense(3, MP_LINEAR);
    if (mp_model_create(&m, &md)) abort();
    for (i = 0; i < 5; i++)
        if (mp_model_call(m, layers[i], wiring[i] + 1, wiring[i][0], NULL)) abort();
    for (i = 0; i < (int)(sizeof w / sizeof w[0]); i++) w[i] = (float)(i % 5) / 4.0f; /* variances (36..39) >= 0 */
    if (mp_model_param_count(m) != sizeof w / sizeof w[0] || mp_model_set_weights(m, w, sizeof w / sizeof w[0]))
        abort();
    return m;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *dir = getenv("MP_FUZZ_SEEDS");
    (void)argc;
    (void)argv;
    compiled.m = model(1);
    compiled.bytes = saved(compiled.m, -1, &compiled.len);
    built.m = model(0);
    built.bytes = saved(built.m, -1, &built.len);
    graph.m = graph_model();
    graph.bytes = saved(graph.m, -1, &graph.len);
    if (dir) {
        size_t len;
        unsigned char *b;
        write_seed(dir, "seed_checkpoint", compiled.bytes, compiled.len);
        write_seed(dir, "seed_checkpoint_uncompiled", built.bytes, built.len);
        write_seed(dir, "seed_checkpoint_graph", graph.bytes, graph.len);
        b = saved(graph.m, MP_FLOAT16, &len);
        write_seed(dir, "seed_weights_graph_float16", b, len);
        free(b);
        b = saved(compiled.m, MP_FLOAT16, &len);
        write_seed(dir, "seed_weights_float16", b, len);
        free(b);
        b = saved(compiled.m, MP_BFLOAT16, &len);
        write_seed(dir, "seed_weights_bfloat16", b, len);
        free(b);
    }
    return 0;
}

static void load_into(target *t, const unsigned char *data, size_t size, int weights) {
    mp_status st = weights ? mp_model_import_weights_from_memory(t->m, data, size)
                           : mp_model_load_from_memory(t->m, data, size);
    size_t len;
    unsigned char *now;
    if (st == MP_OK) { /* a valid file (the fuzzer can forge one): back to the state kept */
        if (mp_model_load_from_memory(t->m, t->bytes, t->len) != MP_OK) abort();
        return;
    }
    if (st != MP_ERR_FORMAT && st != MP_ERR_SHAPE && st != MP_ERR_STATE) {
        fprintf(stderr, "fuzz_checkpoint: unexpected %s: %s\n", mp_status_name(st), mp_model_error(t->m));
        abort();
    }
    now = saved(t->m, -1, &len);
    if (len != t->len || memcmp(now, t->bytes, len) != 0) {
        fprintf(stderr, "fuzz_checkpoint: a failed load changed the model: %s\n", mp_model_error(t->m));
        abort();
    }
    free(now);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    unsigned char *fixed = (unsigned char *)malloc(size ? size : 1);
    int weights;
    if (!fixed) return 0;
    memcpy(fixed, data, size);
    if (size >= 24) { /* the length field and the CRC made right */
        put_le(fixed + 12, size, 8);
        fix_crc(fixed, size);
    }
    for (weights = 0; weights < 2; weights++) {
        load_into(&compiled, data, size, weights);
        load_into(&built, data, size, weights);
        load_into(&graph, data, size, weights);
        load_into(&compiled, fixed, size, weights);
        load_into(&built, fixed, size, weights);
        load_into(&graph, fixed, size, weights);
    }
    free(fixed);
    return 0;
}
