/* peer.c - mixprec's side of the PyTorch interop test, which
   tests/torch_peer/interop.py runs (see there for what is compared) as
   `torch_peer export|import DIR` (DIR with a '/'):

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

   The .f32 files are the floats' little-endian bytes, one after another. */
#define MIXPREC_IMPLEMENTATION
#include "../../mixprec.h"
#include "../check.h"
#include "../helpers.h"
#include "../../examples/resnet_model.h"

enum { N = 16, UNITS = 256, WIDTH = 8, IMAGE = 28 * 28, CLASSES = 10 };

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

static void write_floats(const char *name, const float *x, size_t n) {
    unsigned char b[4];
    FILE *f = fopen(in_dir(name), "wb");
    size_t i;
    int k;
    uint32_t u;
    for (i = 0; f && i < n; i++) {
        memcpy(&u, &x[i], 4);
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

/* BatchNormalization's four weights off their defaults: gamma in [0.5,
   1.5), beta and the moving mean in [-0.5, 0.5), the variance in [0.5,
   1.5). */
static void perturb(mp_model *m) {
    size_t n = mp_model_param_count(m), k;
    float *w = malloc(n * sizeof *w);
    int i;
    if (!w) exit(1);
    need(mp_model_get_weights(m, w, n), m);
    for (i = 0; i < mp_model_weight_count(m); i++) {
        mp_weight_info wi;
        need(mp_model_weight_info(m, i, &wi), m);
        if (strcmp(wi.name, "kernel") == 0 || strcmp(wi.name, "bias") == 0) continue;
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
    write_floats(name, out, N * CLASSES);
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
    write_floats("x.f32", x, N * IMAGE);
    for (r = 0; r < 2; r++) {
        mp_model *m = network(r);
        perturb(m);
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

/* torch_peer export|import DIR (DIR with a '/': ./dir) */
int main(int argc, char **argv) {
    size_t i;
    check_args(argc, argv);
    if (!check_path()) {
        fprintf(stderr, "usage: %s export|import DIR (a path with a '/')\n", argv[0]);
        return 2;
    }
    snprintf(dir, sizeof dir, "%s", check_path());
    for (i = 0; i < N * IMAGE; i++) x[i] = uniform(0.0f, 1.0f);
    RUN(test_export());
    RUN(test_import());
    return check_done("torch_peer");
}
