/* peer.c - mixprec against the real Keras (Keras 3 and tf_keras), from the
   file tests/keras_peer/loss_from_logits.py writes (argv[1]): for each
   small model whose output is a softmax or sigmoid, mixprec's loss and
   weight gradients must equal Keras's, both taken from the logits, in
   float32 to 1e-5 of the loss and 1e-4 of the largest gradient; under
   mixed_float16 (the guide's float16 Dense, float32 softmax) to 1e-2,
   since Keras on the CPU rounds the float16 Dense twice (MatMul, then
   BiasAdd) and mixprec once. With a second file, from amp_paint.py, the
   colouring of automatic mixed precision against TensorFlow's (see
   compare_amp). tests/matrix.sh runs it when MIXPREC_KERAS_PYTHON
   names a python with tensorflow-cpu and tf-keras. */
#define MIXPREC_IMPLEMENTATION
#include "../../mixprec.h"
#include "../check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { MAXV = 4096 };

typedef struct peer_case {
    char name[64], act[16], policy[32];
    int loss, layer, n, in, units;
    float x[MAXV], w[MAXV], y[MAXV];
    int32_t labels[MAXV];
} peer_case;

static int read_floats(FILE *f, float *v, size_t n) {
    size_t i;
    for (i = 0; i < n; i++)
        if (fscanf(f, "%f", &v[i]) != 1) return 0;
    return 1;
}

/* mixprec's loss and gradients of one case; 0 on failure (counted). */
static int run_mixprec(const peer_case *c, float *loss, float *g) {
    mp_model_desc md;
    mp_compile_desc cd;
    mp_layer_desc out = mp_activation_layer(strcmp(c->act, "softmax") == 0 ? MP_SOFTMAX : MP_SIGMOID);
    mp_model *m = NULL;
    size_t np = (size_t)(c->in + 1) * (size_t)c->units;
    mp_data d;
    int ok;
    memset(&d, 0, sizeof d);
    d.x[0] = mp_rows(c->x, (size_t)c->n, c->in);
    d.y = c->loss == 1 ? mp_labels(c->labels, (size_t)c->n) : mp_rows(c->y, (size_t)c->n, c->units);
    memset(&md, 0, sizeof md);
    md.input_shape[0] = c->in;
    memset(&cd, 0, sizeof cd);
    cd.loss = (mp_loss)c->loss;
    cd.optimizer.kind = MP_SGD;
    cd.loss_scale = MP_LOSS_SCALE_NONE;
    out.dtype = "float32"; /* the guide's float32 output */
    ok = mp_set_global_policy_name(c->policy) == MP_OK && mp_model_create(&m, &md) == MP_OK &&
         mp_model_add(m, mp_dense(c->units, c->layer ? MP_LINEAR : out.activation)) == MP_OK &&
         (!c->layer || mp_model_add(m, out) == MP_OK) && mp_model_compile(m, &cd) == MP_OK &&
         mp_model_set_weights(m, c->w, np) == MP_OK && mp_forward(m, &d, 1) == MP_OK &&
         mp_compute_loss(m, &d.y, loss, NULL) == MP_OK &&
         mp_compute_scaled_gradients(m) == MP_OK && mp_get_unscaled_gradients(m) == MP_OK &&
         mp_get_gradients(m, g, np) == MP_OK;
    if (!CHECK(ok)) fprintf(stderr, "    %s: %s\n", c->name, m ? mp_model_error(m) : "no model");
    mp_model_destroy(m);
    mp_set_global_policy_name("float32");
    return ok;
}

static void compare(const peer_case *c, const char *flavour, FILE *f) {
    size_t np = (size_t)(c->in + 1) * (size_t)c->units, i, bad = 0;
    float want_loss, want[MAXV], loss = NAN, g[MAXV], gmax = 0.0f;
    int mixed = strcmp(c->policy, "float32") != 0;
    double tol = mixed ? 1e-2 : 1e-5, gtol = mixed ? 1e-2 : 1e-4;
    char what[160];
    if (!CHECK(fscanf(f, "%*s %*s %f", &want_loss) == 1 && read_floats(f, want, np))) return;
    if (!run_mixprec(c, &loss, g)) return;
    for (i = 0; i < np; i++) gmax = fmaxf(gmax, fabsf(want[i]));
    for (i = 0; i < np; i++) bad += !(fabsf(g[i] - want[i]) <= gtol * gmax);
    snprintf(what, sizeof what, "%s, %s: loss %.7g, Keras's %.7g; %zu of %zu gradients off", c->name, flavour,
             (double)loss, (double)want_loss, bad, np);
    check_report(fabs(loss - want_loss) <= tol * want_loss && bad == 0 && gmax > 0.0f, __FILE__, __LINE__, what);
    printf("%s\n", what);
}

/* Automatic mixed precision on the guide's MLP (784-64-64-10, softmax):
   every forward op of mixprec's colouring has TensorFlow's dtype, read
   from amp_paint.py's file (the ops it converted; the others stay float32). */
static void compare_amp(FILE *f) {
    static const char *const dtypes[2] = {"float16", "bfloat16"};
    char line[256], table[4096], converted[32][3][32];
    int k, n = 0, tf_x = 0, tf_y = 0, tf_z = 0;
    while (n < 32 && fgets(line, sizeof line, f)) /* amp DTYPE LAYER OP DTYPE */
        if (sscanf(line, "amp %31s %31s %31s", converted[n][0], converted[n][1], converted[n][2]) == 3) n++;
    CHECK(n == 18);
    for (k = 0; k < 2; k++) {
        mp_model_desc md;
        mp_compile_desc cd;
        mp_layer_desc out = mp_activation_layer(MP_SOFTMAX);
        mp_model *m = NULL;
        const char *row;
        int rows = 0, bad = 0, x = 0, y = 0, z = 0;
        char what[200];
        memset(&md, 0, sizeof md);
        md.input_shape[0] = 784;
        memset(&cd, 0, sizeof cd);
        cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
        cd.amp.enabled = 1;
        cd.amp.dtype = k ? MP_BFLOAT16 : MP_FLOAT16;
        if (!CHECK(mp_model_create(&m, &md) == MP_OK && mp_model_add(m, mp_dense(64, MP_RELU)) == MP_OK &&
                   mp_model_add(m, mp_dense(64, MP_RELU)) == MP_OK &&
                   mp_model_add(m, mp_dense(10, MP_LINEAR)) == MP_OK && mp_model_add(m, out) == MP_OK &&
                   mp_model_compile(m, &cd) == MP_OK && mp_model_amp_table(m, table, sizeof table) == MP_OK)) {
            mp_model_destroy(m);
            continue;
        }
        for (row = strchr(table, '\n'); row && row[1]; row = strchr(row + 1, '\n')) { /* after the header */
            char op[64], layer[32], list[16], dtype[16];
            const char *want = "float32";
            int i;
            if (sscanf(row + 1, "%63s %31s %15s %15s", op, layer, list, dtype) != 4) { bad++; continue; }
            for (i = 0; i < n; i++)
                if (!strcmp(converted[i][0], dtypes[k]) && !strcmp(converted[i][1], layer) &&
                    !strcmp(converted[i][2], op))
                    want = dtypes[k];
            rows++;
            if (strcmp(dtype, want) != 0) {
                bad++;
                fprintf(stderr, "    %s: %s of %s is %s, TensorFlow's %s\n", dtypes[k], op, layer, dtype, want);
            }
        }
        rewind(f);
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "summary %15s %d %d %d", what, &tf_x, &tf_y, &tf_z) == 4 && !strcmp(what, dtypes[k]))
                break;
        if (mp_model_amp_report(m, line, sizeof line) != MP_OK ||
            sscanf(line, "Converted %d/%d nodes to %*s precision using %d", &x, &y, &z) != 3)
            bad++;
        snprintf(what, sizeof what, "%s: %d ops of mixprec's colouring, %d not TensorFlow's (converted %d/%d with %d "
                 "cast(s); TensorFlow's graph %d/%d with %d)", dtypes[k], rows, bad, x, y, z, tf_x, tf_y, tf_z);
        check_report(rows == 11 && bad == 0, __FILE__, __LINE__, what);
        printf("%s\n", what);
        mp_model_destroy(m);
    }
}

int main(int argc, char **argv) {
    static peer_case cases[8];
    int n = 0, i, k;
    FILE *f, *amp = NULL;
    if ((argc != 2 && argc != 3) || !(f = fopen(argv[1], "r")) || (argc == 3 && !(amp = fopen(argv[2], "r")))) {
        fprintf(stderr, "usage: peer FILE [AMP_FILE] (from tests/keras_peer/loss_from_logits.py, amp_paint.py)\n");
        return 2;
    }
    while (n < 8) {
        peer_case *c = &cases[n];
        long at = ftell(f);
        size_t nx, nw, ny;
        if (fscanf(f, " case %63s %d %15s %d %31s %d %d %d", c->name, &c->loss, c->act, &c->layer, c->policy, &c->n,
                   &c->in, &c->units) != 8) {
            fseek(f, at, SEEK_SET);
            break;
        }
        nx = (size_t)c->n * (size_t)c->in;
        nw = (size_t)(c->in + 1) * (size_t)c->units;
        ny = (size_t)c->n * (size_t)c->units;
        if (!CHECK(nx <= MAXV && nw <= MAXV && ny <= MAXV && read_floats(f, c->x, nx) && read_floats(f, c->w, nw)))
            return check_done("keras_peer");
        for (i = 0; i < c->n; i++) CHECK(fscanf(f, "%d", &c->labels[i]) == 1);
        CHECK(read_floats(f, c->y, ny));
        n++;
    }
    for (k = 0; k < 2; k++) /* Keras 3's lines, then tf_keras's, in the cases' order */
        for (i = 0; i < n; i++) compare(&cases[i], k ? "tf_keras" : "Keras 3", f);
    fclose(f);
    CHECK(n == 5);
    if (amp) {
        compare_amp(amp);
        fclose(amp);
    }
    return check_done("keras_peer");
}
