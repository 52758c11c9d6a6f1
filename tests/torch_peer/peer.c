/* peer.c - mixprec's side of the PyTorch tests, which
   tests/torch_peer/interop.py and gpt.py run (see there for what is
   compared) as `torch_peer export|import|gpt DIR` (DIR with a '/'):

   export DIR   the guide's MLP (784 -> 256 relu -> 256 relu -> 10 softmax)
                and the ResNet of examples/resnet_model.h (width 8), under
                float32, their gamma, beta and moving statistics set off
                their defaults; their weights as safetensors in the
                PyTorch layout in F32 and BF16 (mlp_f32, mlp_bf16,
                resnet_f32, resnet_bf16) and the MLP's in the Keras layout
                (mlp_keras); N fixed inputs (x_mlp.f32, x_img.f32, NHWC);
                mixprec's predictions from the float32 weights
                (mlp_pred.f32, resnet_pred.f32) and from the BF16 file
                loaded back (mlp_bf16_pred.f32, resnet_bf16_pred.f32).
   import DIR   PyTorch's state dicts (torch_mlp.safetensors,
                torch_resnet.safetensors) loaded by name into the same
                networks, their predictions on the same inputs
                (mixprec_mlp_pred.f32, mixprec_resnet_pred.f32), and the
                loaded MLP saved again (mlp_again.safetensors), for the
                byte comparison.
   gpt DIR      the GPT of examples/gpt_model.h under float32 and ten
                AdamW steps on one batch (test_gpt says what it writes).

   The .f32 and .i32 files are the floats' and int32s' little-endian
   bytes, one after another. */
#define MIXPREC_IMPLEMENTATION
#include "../../mixprec.h"
#include "../check.h"
#include "../helpers.h"
#include "../../examples/resnet_model.h"
#include "../../examples/gpt_model.h"

enum { N = 16, UNITS = 256, WIDTH = 8, IMAGE = 28 * 28, CLASSES = 10 };
/* The GPT's: as tests/torch_peer/gpt.py */
enum { VOCAB = 64, CONTEXT = 16, LAYERS = 2, HEADS = 2, CHANNELS = 32, BATCH = 4, STEPS = 10 };

/* A call that must succeed: else the tally so far, and stop. */
static void need(mp_status st, const mp_model *m) {
    if (!OK(st, m)) exit(check_done("torch_peer"));
}

static char dir[4096];
static const char *in_dir(const char *name) {
    static char path[4096 + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return path;
}

/* n 4-byte values (float or int32_t), little-endian. */
static void write_words(const char *name, const void *x, size_t n) {
    unsigned char b[4];
    FILE *f = fopen(in_dir(name), "wb");
    size_t i;
    int k;
    uint32_t u;
    for (i = 0; f && i < n; i++) {
        memcpy(&u, (const unsigned char *)x + 4 * i, 4);
        for (k = 0; k < 4; k++) b[k] = (unsigned char)(u >> (8 * k));
        if (fwrite(b, 1, 4, f) != 4) break;
    }
    if (!f || i != n || fclose(f) != 0) {
        fprintf(stderr, "torch_peer: cannot write %s\n", in_dir(name));
        exit(1);
    }
}

static mp_model *network(int resnet) {
    mp_layer_desc softmax = mp_activation_layer(MP_SOFTMAX);
    mp_model_desc md;
    mp_model *m = NULL;
    memset(&md, 0, sizeof md);
    md.seed = 5;
    md.threads = 1;
    if (resnet) md.input_shape[0] = md.input_shape[1] = 28, md.input_shape[2] = 1;
    else md.input_shape[0] = IMAGE;
    softmax.dtype = "float32";
    need(mp_set_global_policy_name("float32"), NULL);
    need(mp_model_create(&m, &md), NULL);
    if (resnet) need(resnet_layers(m, WIDTH, 0.9f), m);
    else { /* the TensorFlow mixed precision guide's, narrower (it has 4096 units) */
        need(mp_model_add(m, mp_dense(UNITS, MP_RELU)), m);
        need(mp_model_add(m, mp_dense(UNITS, MP_RELU)), m);
        need(mp_model_add(m, mp_dense(CLASSES, MP_LINEAR)), m);
        need(mp_model_add(m, softmax), m);
    }
    need(mp_model_build(m), m);
    return m;
}

/* The weights other than the kernels off their defaults (the biases too
   where `biases`): gamma and the moving variance in [0.5, 1.5), the rest
   (beta, the moving mean, embeddings, biases) in [-0.5, 0.5). */
static void perturb(mp_model *m, int biases) {
    size_t n = mp_model_param_count(m), k;
    float *w = (float *)malloc(n * sizeof *w);
    int i;
    if (!w) exit(1);
    need(mp_model_get_weights(m, w, n), m);
    for (i = 0; i < mp_model_weight_count(m); i++) {
        mp_weight_info wi;
        need(mp_model_weight_info(m, i, &wi), m);
        if (strcmp(wi.name, "kernel") == 0 || (!biases && strcmp(wi.name, "bias") == 0)) continue;
        for (k = 0; k < wi.size; k++)
            w[wi.offset + k] = uniform(0.0f, 1.0f) + (strcmp(wi.name, "gamma") == 0 || strcmp(wi.name, "moving_variance") == 0 ? 0.5f : -0.5f);
    }
    need(mp_model_set_weights(m, w, n), m);
    free(w);
}

static void predict(mp_model *m, const float *x, int resnet, const char *name) {
    float out[N * CLASSES];
    mp_data d;
    memset(&d, 0, sizeof d);
    d.x[0] = mp_rows(x, N, IMAGE);
    if (resnet) d.x[0].rank = 3, d.x[0].shape[0] = d.x[0].shape[1] = 28, d.x[0].shape[2] = 1;
    need(mp_model_predict(m, &d, N, out, N * CLASSES), m);
    write_words(name, out, N * CLASSES);
}

static void save(mp_model *m, const char *name, mp_dtype dt, mp_weights_layout layout) {
    mp_safetensors_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = dt;
    d.layout = layout;
    need(mp_model_save_safetensors(m, in_dir(name), &d), m);
}

static void load(mp_model *m, const char *name) {
    mp_safetensors_desc d;
    memset(&d, 0, sizeof d);
    d.layout = MP_LAYOUT_PYTORCH;
    need(mp_model_load_safetensors(m, in_dir(name), &d), m);
}

static float x[N * IMAGE];
static const char *const names[2] = {"mlp", "resnet"};

static void test_export(void) {
    char file[64];
    int r;
    write_words("x.f32", x, N * IMAGE);
    for (r = 0; r < 2; r++) {
        mp_model *m = network(r);
        perturb(m, 0);
        snprintf(file, sizeof file, "%s_pred.f32", names[r]);
        predict(m, x, r, file);
        snprintf(file, sizeof file, "%s_f32.safetensors", names[r]);
        save(m, file, MP_FLOAT32, MP_LAYOUT_PYTORCH);
        if (!r) save(m, "mlp_keras.safetensors", MP_FLOAT32, MP_LAYOUT_KERAS);
        snprintf(file, sizeof file, "%s_bf16.safetensors", names[r]);
        save(m, file, MP_BFLOAT16, MP_LAYOUT_PYTORCH);
        load(m, file);
        snprintf(file, sizeof file, "%s_bf16_pred.f32", names[r]);
        predict(m, x, r, file);
        mp_model_destroy(m);
    }
}

static void test_import(void) {
    char file[64];
    int r;
    for (r = 0; r < 2; r++) {
        mp_model *m = network(r);
        snprintf(file, sizeof file, "torch_%s.safetensors", names[r]);
        load(m, file);
        snprintf(file, sizeof file, "mixprec_%s_pred.f32", names[r]);
        predict(m, x, r, file);
        if (!r) save(m, "mlp_again.safetensors", MP_FLOAT32, MP_LAYOUT_PYTORCH);
        mp_model_destroy(m);
    }
}

/* The GPT of examples/gpt_model.h under float32, seeded, its biases, gamma,
   beta and embeddings off their defaults; compiled as tiny_gpt's recipe
   with a constant learning rate (AdamW 1e-3, Keras's betas and epsilon,
   weight_decay 0.1 except on the biases, gamma, beta and embeddings,
   global_clipnorm 1). */
static mp_model *gpt(void) {
    mp_model_desc md;
    mp_compile_desc cd = gpt_recipe();
    mp_model *m = NULL;
    memset(&md, 0, sizeof md);
    md.seed = 7;
    md.threads = 1;
    md.input_shape[0] = CONTEXT;
    need(mp_set_global_policy_name("float32"), NULL);
    need(mp_model_create(&m, &md), NULL);
    need(gpt_layers(m, VOCAB, CONTEXT, LAYERS, HEADS, CHANNELS), m);
    need(mp_model_build(m), m);
    cd.optimizer.learning_rate = 1e-3f;
    need(mp_model_compile(m, &cd), m);
    return m;
}

/* The gradients of `m` as the weights of a GPT of the same layers (gpt()
   names them alike), saved in the PyTorch layout: each lands under its
   weight's name and shape, which gpt.py compares with torch's .grad. */
static void save_gradients(const mp_model *m, const char *name) {
    mp_model *g = gpt();
    size_t n = mp_model_param_count(g), t = mp_model_trainable_param_count(m);
    float *w = (float *)malloc(n * sizeof *w), *grad = (float *)malloc(t * sizeof *grad);
    int i;
    if (!w || !grad) exit(1);
    need(mp_get_gradients(m, grad, t), NULL);
    need(mp_model_get_weights(g, w, n), g);
    for (i = 0; i < mp_model_weight_count(g); i++) {
        mp_weight_info wi;
        need(mp_model_weight_info(g, i, &wi), g);
        if (wi.trainable) memcpy(w + wi.offset, grad + wi.gradient_offset, wi.size * sizeof *w);
    }
    need(mp_model_set_weights(g, w, n), g);
    save(g, name, MP_FLOAT32, MP_LAYOUT_PYTORCH);
    mp_model_destroy(g);
    free(w);
    free(grad);
}

/* gpt: the GPT's initial weights (gpt_f32.safetensors), BATCH windows of
   tokens and their targets (gpt_tokens.i32, gpt_targets.i32), then on that
   batch STEPS custom-loop steps: the first's logits (gpt_logits.f32, B x T
   x V) and unscaled gradients (gpt_grads.safetensors), each step's loss
   before its update (gpt_losses.f32) and the weights after the last
   (gpt_trained.safetensors). */
static void test_gpt(void) {
    int32_t tokens[BATCH * CONTEXT], targets[BATCH * CONTEXT];
    float losses[STEPS];
    int shape = CONTEXT, i, applied;
    mp_model *m = gpt();
    mp_array labels = mp_array_i32(targets, BATCH, 1, &shape);
    mp_data d;
    perturb(m, 1);
    save(m, "gpt_f32.safetensors", MP_FLOAT32, MP_LAYOUT_PYTORCH);
    for (i = 0; i < BATCH * CONTEXT; i++) tokens[i] = (int32_t)(rng_next() % VOCAB);
    for (i = 0; i < BATCH * CONTEXT; i++) targets[i] = (int32_t)(rng_next() % VOCAB);
    write_words("gpt_tokens.i32", tokens, BATCH * CONTEXT);
    write_words("gpt_targets.i32", targets, BATCH * CONTEXT);
    memset(&d, 0, sizeof d);
    d.x[0] = mp_array_i32(tokens, BATCH, 1, &shape);
    for (i = 0; i < STEPS; i++) {
        need(mp_forward(m, &d, 1), m);
        need(mp_compute_loss(m, &labels, &losses[i], NULL), m);
        need(mp_compute_scaled_gradients(m), m);
        need(mp_get_unscaled_gradients(m), m);
        if (i == 0) {
            mp_tensor out;
            need(mp_output(m, &out), m);
            CHECK(out.dtype == MP_FLOAT32 && out.rank == 3 && out.shape[0] == BATCH && out.shape[2] == VOCAB);
            write_words("gpt_logits.f32", out.data, BATCH * CONTEXT * VOCAB);
            save_gradients(m, "gpt_grads.safetensors");
        }
        need(mp_apply_gradients(m, &applied), m);
        CHECK(applied);
    }
    write_words("gpt_losses.f32", losses, STEPS);
    save(m, "gpt_trained.safetensors", MP_FLOAT32, MP_LAYOUT_PYTORCH);
    mp_model_destroy(m);
}

/* torch_peer export|import|gpt DIR (DIR with a '/': ./dir) */
int main(int argc, char **argv) {
    size_t i;
    check_args(argc, argv);
    if (!check_path()) {
        fprintf(stderr, "usage: %s export|import|gpt DIR (a path with a '/')\n", argv[0]);
        return 2;
    }
    snprintf(dir, sizeof dir, "%s", check_path());
    for (i = 0; i < N * IMAGE; i++) x[i] = uniform(0.0f, 1.0f);
    RUN(test_export());
    RUN(test_import());
    RUN(test_gpt());
    return check_done("torch_peer");
}
