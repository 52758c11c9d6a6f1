/* peer.c - mixprec against the real Keras (Keras 3 and tf_keras), from the
   file tests/keras_peer/loss_from_logits.py writes (argv[1]): for each
   small model whose output is a softmax or sigmoid, mixprec's loss and
   weight gradients must equal Keras's, both taken from the logits, in
   float32 to 1e-5 of the loss and 1e-4 of the largest gradient; under
   mixed_float16 (the guide's float16 Dense, float32 softmax) to 1e-2,
   since Keras on the CPU rounds the float16 Dense twice (MatMul, then
   BiasAdd) and mixprec once. tests/matrix.sh runs it when MIXPREC_KERAS_PYTHON
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
    int ok;
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
         mp_model_set_weights(m, c->w, np) == MP_OK && mp_forward(m, c->x, c->n, 1) == MP_OK &&
         mp_compute_loss(m, c->loss == 1 ? c->labels : NULL, c->loss == 1 ? NULL : c->y, loss, NULL) == MP_OK &&
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

int main(int argc, char **argv) {
    static peer_case cases[8];
    int n = 0, i, k;
    FILE *f;
    if (argc != 2 || !(f = fopen(argv[1], "r"))) {
        fprintf(stderr, "usage: peer FILE (from tests/keras_peer/loss_from_logits.py)\n");
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
    return check_done("keras_peer");
}
