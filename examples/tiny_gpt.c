/* tiny_gpt.c - a character-level GPT (the block of llm.c's train_gpt2.c:
   LayerNormalization, causal MultiHeadAttention, a residual Add,
   LayerNormalization, Dense(4C, tanh gelu), Dense(C), a residual Add; a
   final LayerNormalization and the logits; examples/gpt_model.h) built
   with the functional API
   and trained with the custom loop under float32, mixed_float16 and
   mixed_bfloat16 from the same initial weights, on the text of Debian's
   fortunes package (`make data`) or, where it is missing, a synthetic text.

       make data && make build/tiny_gpt && ./build/tiny_gpt

   Trained as GPTs are (llm.c's train_gpt2.cu and train_gpt2.py, GPT-2's
   recipe): AdamW (weight_decay 0.1) decaying only the matrices of the
   matrix products, biases, LayerNormalization's gamma and beta and the
   embeddings excluded; global_clipnorm 1.0 on the unscaled gradients; the
   learning rate climbing linearly from 0 over the first tenth of the steps,
   then cosine decay to 0 (Keras 3's CosineDecay with warmup_target); and
   gradient accumulation (--accumulate N: each optimizer step averages N
   batches, an effective batch N times larger).

   Flags: --policy float32|mixed_float16|mixed_bfloat16|all (all)
          --steps N (optimizer steps, 1000; 0 with --load-weights: evaluate)
          --batch-size N (8)  --accumulate N (batches per step, 1)
          --context N (128)  --layers N (4)  --heads N (4)  --channels N (128)
          --learning-rate R (the peak, 3e-3)  --data FILE (build/fortunes.txt)
          --seed N (1337)  --sample N (characters generated, 200)
          --initial-scale S (mixed_float16's first loss scale: 2^24, not
          Keras's 2^15, so that the run shows the dynamic scale falling,
          skipping a few steps, to where the float16 gradients fit)
          --growth-interval N (finite steps before the scale doubles: 2000,
          Keras's dynamic_growth_steps)
          --save-weights PATH, --load-weights PATH, --weights-layout
          keras|pytorch, --weights-dtype float32|float16|bfloat16
          (examples/example.h)

   Each policy ends with one line (peak_bytes: what mixprec allocated for
   the model at most, its weights, optimizer slots and activations):
   result policy=NAME val_loss=L tokens_per_s=R peak_bytes=B loss_scale=S skipped_steps=K */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */
#define MIXPREC_IMPLEMENTATION
#include "../mixprec.h"
#include "example.h"
#include "gpt_model.h"

#include <math.h>
#include <time.h>

typedef struct config {
    ex_policies policies;
    int steps, batch, accumulate, context, layers, heads, channels, sample, growth_interval;
    float learning_rate, initial_scale;
    const char *data;
    uint64_t seed;
} config;

static void usage(const char *prog) {
    fprintf(stderr,
            "usage: %s [--policy float32|mixed_float16|mixed_bfloat16|all] [--steps N] [--batch-size N]\n"
            "       [--accumulate N] [--context N] [--layers N] [--heads N] [--channels N] [--learning-rate R]\n"
            "       [--data FILE] [--seed N] [--sample N] [--initial-scale S] [--growth-interval N]\n"
            "       [--save-weights PATH] [--load-weights PATH]\n"
            "       [--weights-layout keras|pytorch] [--weights-dtype float32|float16|bfloat16]\n",
            prog);
    exit(2);
}

static config parse_args(int argc, char **argv) {
    config c;
    int i;
    memset(&c, 0, sizeof c);
    ex_all_policies(&c.policies);
    c.steps = 1000, c.batch = 8, c.accumulate = 1, c.context = 128, c.layers = 4, c.heads = 4, c.channels = 128;
    c.initial_scale = 16777216.0f; /* 2^24: above where this GPT's float16 gradients fit, so the scale settles */
    c.sample = 200;
    c.learning_rate = 3e-3f;
    c.data = "build/fortunes.txt";
    c.seed = 1337;
    for (i = 1; i < argc; i += 2) {
        const char *f = argv[i];
        if (i + 1 >= argc) usage(argv[0]);
        if (flag_policy(argc, argv, i, &c.policies)) continue;
        if (strcmp(f, "--steps") == 0) c.steps = (int)flag_long(argc, argv, i, 0);
        else if (strcmp(f, "--batch-size") == 0) c.batch = (int)flag_long(argc, argv, i, 1);
        else if (strcmp(f, "--accumulate") == 0) c.accumulate = (int)flag_long(argc, argv, i, 1);
        else if (strcmp(f, "--context") == 0) c.context = (int)flag_long(argc, argv, i, 2);
        else if (strcmp(f, "--layers") == 0) c.layers = (int)flag_long(argc, argv, i, 1);
        else if (strcmp(f, "--heads") == 0) c.heads = (int)flag_long(argc, argv, i, 1);
        else if (strcmp(f, "--channels") == 0) c.channels = (int)flag_long(argc, argv, i, 1);
        else if (strcmp(f, "--sample") == 0) c.sample = (int)flag_long(argc, argv, i, 0);
        else if (strcmp(f, "--seed") == 0) c.seed = (uint64_t)flag_long(argc, argv, i, 0);
        else if (strcmp(f, "--data") == 0) c.data = argv[i + 1];
        else if (strcmp(f, "--learning-rate") == 0) c.learning_rate = (float)atof(argv[i + 1]);
        else if (strcmp(f, "--initial-scale") == 0) c.initial_scale = (float)flag_long(argc, argv, i, 1);
        else if (strcmp(f, "--growth-interval") == 0) c.growth_interval = (int)flag_long(argc, argv, i, 1);
        else if (!flag_weights(argc, argv, i)) usage(argv[0]);
    }
    ex_check_weights_flags("--steps", c.steps, c.policies.count);
    if (c.channels % c.heads != 0) {
        fprintf(stderr, "--channels %d is not a multiple of --heads %d\n", c.channels, c.heads);
        exit(2);
    }
    return c;
}

/* The text: the file, or (missing) a synthetic one of counting phrases,
   which a model can learn within a few hundred steps. */
static void load_text(const config *c, mp_tokens *t, int *synthetic) {
    char why[512];
    *synthetic = mp_load_text_tokens(c->data, t, why, sizeof why) != MP_OK;
    if (*synthetic) {
        static const char *const words[] = {"one", "two", "three", "four", "five", "six", "seven", "eight"};
        size_t cap = 1 << 18, len = 0;
        char *text = malloc(cap);
        uint64_t rng = c->seed;
        if (!text) exit(1);
        printf("%s; training on a synthetic text instead (make data writes the fortunes text)\n", why);
        while (len + 64 < cap) {
            int k = (int)(ex_next(&rng) % 8), n = 2 + (int)(ex_next(&rng) % 5), j;
            for (j = 0; j < n; j++) len += (size_t)sprintf(text + len, "%s%s", words[(k + j) % 8], j + 1 < n ? " " : ".\n");
        }
        CHECK(mp_tokens_from_text(text, len, t), NULL);
        free(text);
    }
}

/* The GPT of gpt_model.h, from the seed. */
static mp_model *build_gpt(const config *c, int vocab) {
    mp_model_desc md;
    mp_model *m = NULL;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = c->context;
    md.seed = c->seed;
    CHECK(mp_model_create(&m, &md), NULL);
    CHECK(gpt_layers(m, vocab, c->context, c->layers, c->heads, c->channels), m);
    return m;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A batch of windows from tokens [lo, hi): random starts (train) or the
   validation part's first windows in order. */
static void take_batch(const config *c, const mp_tokens *t, size_t lo, size_t hi, uint64_t *rng, int32_t *x,
                       int32_t *y, size_t first) {
    size_t starts[1024], i, span = hi - lo - (size_t)c->context - 1;
    for (i = 0; i < (size_t)c->batch; i++)
        starts[i] = rng ? lo + ex_next(rng) % span : lo + ((first + i) * (size_t)c->context) % span;
    CHECK(mp_tokens_windows(t, starts, (size_t)c->batch, c->context, x, y), NULL);
}

typedef struct result {
    const char *policy;
    float val_loss, tokens_per_s, loss_scale;
    size_t peak_bytes;
    uint64_t skipped;
} result;

/* The mean loss over `batches` validation batches. */
static float validation_loss(const config *c, mp_model *m, const mp_tokens *t, size_t split, int32_t *x, int32_t *y,
                             int batches) {
    float sum = 0.0f, loss;
    int b, shape = c->context;
    for (b = 0; b < batches; b++) {
        mp_data d;
        mp_array labels = mp_array_i32(y, (size_t)c->batch, 1, &shape);
        memset(&d, 0, sizeof d);
        take_batch(c, t, split, t->count, NULL, x, y, (size_t)b * (size_t)c->batch);
        d.x[0] = mp_array_i32(x, (size_t)c->batch, 1, &shape);
        CHECK(mp_forward(m, &d, 0), m);
        CHECK(mp_compute_loss(m, &labels, &loss, NULL), m);
        sum += loss;
    }
    return sum / (float)batches;
}

/* n characters after the validation text's first window, each drawn from
   the softmax of the last position's logits (temperature 1). */
static void print_sample(const config *c, mp_model *m, const mp_tokens *t, size_t split, uint64_t *rng) {
    int32_t *window = malloc((size_t)c->context * sizeof(int32_t));
    float *p = malloc((size_t)t->vocab_size * sizeof(float));
    int shape = c->context, i, j, v = t->vocab_size;
    if (!window || !p) exit(1);
    memcpy(window, t->ids + split, (size_t)c->context * sizeof(int32_t));
    printf("--- sample ---\n");
    for (i = 0; i < c->context; i++) putchar(t->bytes[window[i]]);
    printf("[...]");
    for (i = 0; i < c->sample; i++) {
        mp_data d;
        mp_tensor out;
        const char *last;
        float mx = -INFINITY, sum = 0.0f, u;
        memset(&d, 0, sizeof d);
        d.x[0] = mp_array_i32(window, 1, 1, &shape);
        CHECK(mp_forward(m, &d, 0), m);
        CHECK(mp_output(m, &out), m); /* the logits (1, T, V) in the compute dtype */
        last = (const char *)out.data + (size_t)(c->context - 1) * (size_t)v * mp_dtype_size(out.dtype);
        CHECK(mp_convert(p, MP_FLOAT32, last, out.dtype, (size_t)v, NULL), m); /* the last position's, widened */
        for (j = 0; j < v; j++) mx = fmaxf(mx, p[j]);
        for (j = 0; j < v; j++) sum += p[j] = expf(p[j] - mx);
        for (u = ex_uniform(rng) * sum, j = 0; j + 1 < v && (u -= p[j]) > 0.0f; j++) {}
        putchar(t->bytes[j]);
        memmove(window, window + 1, (size_t)(c->context - 1) * sizeof(int32_t));
        window[c->context - 1] = j;
    }
    printf("\n--------------\n");
    free(window);
    free(p);
}

/* GPT's optimizer (see the top): gpt_model.h's recipe (AdamW decaying
   the matrices alone, the global norm clipped to 1), then warmup and
   cosine decay, accumulation and the loss scale's settings. The schedule
   counts Keras's steps, batches, so its lengths are in batches:
   `accumulate` per optimizer step. */
static void compile_gpt(const config *c, mp_model *m) {
    mp_compile_desc cd = gpt_recipe();
    uint64_t batches = (uint64_t)c->steps * (uint64_t)c->accumulate, warmup = batches / 10;
    cd.optimizer.gradient_accumulation_steps = c->accumulate > 1 ? c->accumulate : 0;
    cd.optimizer.schedule.kind = MP_COSINE_DECAY;
    cd.optimizer.schedule.initial_learning_rate = 0.0f;
    cd.optimizer.schedule.warmup_target = c->learning_rate;
    cd.optimizer.schedule.warmup_steps = warmup;
    cd.optimizer.schedule.decay_steps = batches > warmup ? batches - warmup : 1;
    cd.loss_scale_config.initial_scale = c->initial_scale;
    cd.loss_scale_config.growth_interval = c->growth_interval;
    CHECK(mp_model_compile(m, &cd), m);
}

static result run_policy(const config *c, const mp_tokens *t, size_t split, const char *policy, float **initial) {
    int32_t *x = malloc((size_t)c->batch * (size_t)c->context * sizeof(int32_t));
    int32_t *y = malloc((size_t)c->batch * (size_t)c->context * sizeof(int32_t));
    mp_model *m;
    result r;
    uint64_t rng = c->seed;
    double start, trained = 0.0;
    float loss = 0.0f, running = 0.0f;
    int step = 0, batch = 0, shape = c->context, every = c->steps < 10 ? 1 : c->steps / 10;
    size_t n, baseline;
    if (!x || !y) exit(1);
    printf("\n=== policy %s ===\n", policy);
    CHECK(mp_set_global_policy_name(policy), NULL);
    mp_reset_peak_memory();
    baseline = mp_get_memory_info().current; /* the text's tokens: not the model's */
    m = build_gpt(c, t->vocab_size);
    CHECK(mp_set_global_policy_name("float32"), NULL);
    n = mp_model_param_count(m);
    if (!*initial) { /* the first policy's weights start every one */
        mp_model_print_summary(m);
        if (!(*initial = malloc(n * sizeof(float)))) exit(1);
        CHECK(mp_model_get_weights(m, *initial, n), m);
    }
    CHECK(mp_model_set_weights(m, *initial, n), m);
    ex_load_weights(m);
    compile_gpt(c, m);
    /* Optimizer steps of `accumulate` batches each; a batch whose float16
       gradients overflow is dropped and another taken. Only the step itself
       is timed: not the batch's preparation nor the progress line. */
    while (step < c->steps) {
        mp_data d;
        mp_array labels = mp_array_i32(y, (size_t)c->batch, 1, &shape);
        int applied;
        memset(&d, 0, sizeof d);
        take_batch(c, t, 0, split, &rng, x, y, 0);
        d.x[0] = mp_array_i32(x, (size_t)c->batch, 1, &shape);
        start = now();
        CHECK(mp_forward(m, &d, 1), m);
        CHECK(mp_compute_loss(m, &labels, &loss, NULL), m);
        CHECK(mp_compute_scaled_gradients(m), m);
        CHECK(mp_get_unscaled_gradients(m), m);
        CHECK(mp_apply_gradients(m, &applied), m);
        trained += now() - start;
        running = batch++ == 0 ? loss : 0.95f * running + 0.05f * loss;
        if (!applied) continue;
        step++;
        if (step % every == 0 || step == c->steps)
            printf("%d/%d - %.0fs %.0fms/step - loss: %.4f - learning_rate: %.2e - loss_scale: %g\n", step,
                   c->steps, trained, 1e3 * trained / step, (double)running, (double)mp_model_learning_rate(m),
                   (double)mp_current_loss_scale(m));
    }
    r.policy = policy;
    r.val_loss = validation_loss(c, m, t, split, x, y, 8);
    r.tokens_per_s = trained > 0.0 ? (float)((double)batch * c->batch * c->context / trained) : 0.0f;
    r.peak_bytes = mp_get_memory_info().peak - baseline;
    r.loss_scale = mp_current_loss_scale(m);
    r.skipped = mp_model_loss_scale(m) ? mp_model_loss_scale(m)->skipped_steps : 0;
    print_sample(c, m, t, split, &rng);
    ex_save_weights(m);
    printf("result policy=%s val_loss=%.4f tokens_per_s=%.0f peak_bytes=%zu loss_scale=%g skipped_steps=%llu\n", policy,
           (double)r.val_loss, (double)r.tokens_per_s, r.peak_bytes, (double)r.loss_scale,
           (unsigned long long)r.skipped);
    mp_model_destroy(m);
    free(x);
    free(y);
    return r;
}

int main(int argc, char **argv) {
    config c = parse_args(argc, argv);
    result results[EX_POLICIES];
    float *initial = NULL;
    mp_tokens t;
    char line[256];
    size_t split, len = 0;
    int synthetic, i;
    load_text(&c, &t, &synthetic);
    split = t.count / 10 * 9; /* the last tenth validates */
    if (c.batch > 1024 || split - 0 < (size_t)c.context + 2 || t.count - split < (size_t)c.context + 2) {
        fprintf(stderr, "the text (%zu tokens) is too short for context %d, or the batch is over 1024\n", t.count,
                c.context);
        return 2;
    }
    printf("%zu characters (%s), vocabulary %d, ln(vocabulary) %.3f; context %d, batch %d, %d layers, %d heads, "
           "%d channels\n",
           t.count, synthetic ? "synthetic" : c.data, t.vocab_size, log((double)t.vocab_size), c.context, c.batch,
           c.layers, c.heads, c.channels);
    for (i = 0; i < c.policies.count; i++) results[i] = run_policy(&c, &t, split, c.policies.name[i], &initial);
    line[0] = '\0';
    for (i = 0; i < c.policies.count && len < sizeof line; i++)
        len += (size_t)snprintf(line + len, sizeof line - len, "%s%s %.3f", i ? ", " : "", results[i].policy,
                                (double)results[i].val_loss);
    ex_summary("tiny_gpt", "a character-level GPT on %s, validation loss (ln V = %.3f): %s",
               synthetic ? "a synthetic text" : "the fortunes text", log((double)t.vocab_size), line);
    free(initial);
    mp_tokens_free(&t);
    return 0;
}
