/* fuzz_safetensors.c - libFuzzer target for the safetensors reader
   (mp_safetensors_check, mp_model_load_safetensors_from_memory). Each input
   is checked, then loaded in the Keras and the PyTorch layout into two
   built models: an MLP with BatchNormalization (rank-1 and rank-2 weights,
   moving statistics) and a small convnet (Conv2D's rank-4 kernel, a Dense
   without bias). A load that fails must say MP_ERR_FORMAT, MP_ERR_SHAPE or
   MP_ERR_DTYPE and leave the weights as they were; MP_ERR_FORMAT when the
   checker refuses the buffer, and otherwise only for a negative moving
   variance. A load that succeeds must read back
   as the file's weights (saved again in the file's layout and dtype F32 and
   loaded once more, the weights do not move), and is undone.

       clang -fsanitize=fuzzer,address,undefined -g -O1 tests/fuzz_safetensors.c -o fuzz_safetensors -lm
       mkdir -p corpus && MP_FUZZ_SEEDS=corpus ./fuzz_safetensors corpus -max_total_time=60

   MP_FUZZ_SEEDS=dir writes valid files (the seeds) into dir at start: each
   model's export in each layout and dtype. */
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#include "forge.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct target {
    mp_model *m;
    float *w; /* its weights: the state to keep */
    size_t n;
} target;
static target mlp, convnet;

static mp_model *mlp_model(void) {
    mp_model_desc md;
    mp_model *m = NULL;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 5;
    md.threads = 1;
    if (mp_model_create(&m, &md) || mp_model_add(m, mp_dense(4, MP_RELU)) || mp_model_add(m, mp_batch_normalization()) ||
        mp_model_add(m, mp_dense(3, MP_LINEAR)) || mp_model_build(m))
        abort();
    return m;
}

static mp_model *conv_model(void) {
    mp_model_desc md;
    mp_layer_desc dense = mp_dense(2, MP_LINEAR);
    mp_model *m = NULL;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = md.input_shape[1] = 4;
    md.input_shape[2] = 2;
    md.threads = 1;
    dense.no_bias = 1;
    if (mp_model_create(&m, &md) || mp_model_add(m, mp_conv2d(3, 2, 3, MP_SAME, MP_RELU)) ||
        mp_model_add(m, mp_global_average_pooling2d()) || mp_model_add(m, dense) || mp_model_build(m))
        abort();
    return m;
}

static float *weights(mp_model *m, size_t *n) {
    float *w;
    *n = mp_model_param_count(m);
    if (!(w = (float *)malloc(*n * sizeof *w)) || mp_model_get_weights(m, w, *n)) abort();
    return w;
}

static unsigned char *saved(mp_model *m, const mp_safetensors_desc *d, size_t *len) {
    unsigned char *b;
    if (mp_model_save_safetensors_to_memory(m, d, NULL, 0, len) || !(b = (unsigned char *)malloc(*len)) ||
        mp_model_save_safetensors_to_memory(m, d, b, *len, len))
        abort();
    return b;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *dir = getenv("MP_FUZZ_SEEDS");
    (void)argc;
    (void)argv;
    mlp.m = mlp_model();
    mlp.w = weights(mlp.m, &mlp.n);
    convnet.m = conv_model();
    convnet.w = weights(convnet.m, &convnet.n);
    if (dir) {
        static const char *const layouts[2] = {"keras", "pytorch"};
        target *t[2] = {&mlp, &convnet};
        int i, layout, dt;
        for (i = 0; i < 2; i++)
            for (layout = 0; layout < 2; layout++)
                for (dt = 0; dt < MP_DTYPE_COUNT; dt++) {
                    mp_safetensors_desc d;
                    char name[64];
                    size_t len;
                    unsigned char *b;
                    memset(&d, 0, sizeof d);
                    d.layout = (mp_weights_layout)layout;
                    d.dtype = (mp_dtype)dt;
                    b = saved(t[i]->m, &d, &len);
                    snprintf(name, sizeof name, "seed_%s_%s_%s", i ? "convnet" : "mlp", layouts[layout],
                             mp_dtype_name(d.dtype));
                    write_seed(dir, name, b, len);
                    free(b);
                }
    }
    return 0;
}

static void fail(const char *what, mp_model *m) {
    fprintf(stderr, "fuzz_safetensors: %s: %s\n", what, mp_model_error(m));
    abort();
}

static void load_into(target *t, const uint8_t *data, size_t size, int layout, mp_status checked) {
    mp_safetensors_desc d;
    mp_status st;
    size_t n, len;
    float *now;
    memset(&d, 0, sizeof d);
    d.layout = (mp_weights_layout)layout;
    st = mp_model_load_safetensors_from_memory(t->m, &d, data, size);
    /* the checker's refusals are the loader's MP_ERR_FORMAT; the loader adds one, a valid file's bad state */
    if (checked != MP_OK ? st != MP_ERR_FORMAT
                         : st == MP_ERR_FORMAT && !strstr(mp_model_error(t->m), "moving variance is negative or NaN"))
        fail("the checker and the loader disagree", t->m);
    if (st == MP_OK) { /* a valid file of this model: it saves and loads again to the same weights */
        float *first = weights(t->m, &n);
        unsigned char *again = saved(t->m, &d, &len);
        if (mp_model_load_safetensors_from_memory(t->m, &d, again, len) != MP_OK) fail("its own save refused", t->m);
        now = weights(t->m, &n);
        if (memcmp(now, first, n * sizeof *now) != 0) fail("a float32 save and load moved the weights", t->m);
        free(first);
        free(again);
        free(now);
        if (mp_model_set_weights(t->m, t->w, t->n) != MP_OK) abort();
        return;
    }
    if (st != MP_ERR_FORMAT && st != MP_ERR_SHAPE && st != MP_ERR_DTYPE) {
        fprintf(stderr, "fuzz_safetensors: unexpected %s\n", mp_status_name(st));
        fail("status", t->m);
    }
    now = weights(t->m, &n);
    if (memcmp(now, t->w, n * sizeof *now) != 0) fail("a refused load changed the weights", t->m);
    free(now);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char why[256];
    mp_status checked = mp_safetensors_check(data, size, why, sizeof why);
    int layout;
    if (checked != MP_OK && checked != MP_ERR_FORMAT) {
        fprintf(stderr, "fuzz_safetensors: the checker said %s: %s\n", mp_status_name(checked), why);
        abort();
    }
    if ((checked == MP_OK) != (why[0] == '\0')) {
        fprintf(stderr, "fuzz_safetensors: the checker said %s with reason '%s'\n", mp_status_name(checked), why);
        abort();
    }
    for (layout = 0; layout < 2; layout++) {
        load_into(&mlp, data, size, layout, checked);
        load_into(&convnet, data, size, layout, checked);
    }
    return 0;
}
