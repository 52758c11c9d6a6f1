/* gpt_model.h - the GPT of examples/tiny_gpt.c, for it and for bench/gpt.c,
   built with the functional API as llm.c's train_gpt2.c lays it out:

       input (context) token ids
       Embedding(vocab, channels) + a learned position embedding
       layers blocks, pre-LayerNormalization (epsilon 1e-5, GPT-2's):
           x -> LayerNormalization -> causal MultiHeadAttention (heads,
                channels / heads each) -> Add(x) = r
           r -> LayerNormalization -> Dense(4 channels, tanh gelu)
                -> Dense(channels) -> Add(r)
       LayerNormalization - Dense(vocab) logits, in the compute dtype

   The logits stay in the compute dtype, as llm.c's bfloat16 build keeps
   them: the loss (from_logits) widens them and takes the softmax and the
   crossentropy in float32, as Keras's losses cast y_pred to float32. A
   float32 output layer (the mixed precision guide's advice for a softmax
   output) would hold float32 copies of the largest tensors of a GPT, the
   (batch, time, vocabulary) logits and their gradient.

   Include after mixprec.h. Its calls return statuses; the first failure
   stops the build and is returned (mp_model_error says which layer). */
#ifndef GPT_MODEL_H
#define GPT_MODEL_H
#include <string.h>

/* A layer called on n inputs (the functional API's ids; in NULL: the
   previous layer's output), its output id in *out; nothing once *st is an
   error. */
static inline void gpt_call(mp_model *m, mp_layer_desc layer, const int *in, int n, int *out, mp_status *st) {
    if (*st == MP_OK) *st = mp_model_call(m, layer, in, n, out);
}

/* The GPT's layers into m (created with input_shape[0] = context). */
static inline mp_status gpt_layers(mp_model *m, int vocab, int context, int layers, int heads, int channels) {
    mp_layer_desc ln = mp_layer_normalization();
    mp_status st = MP_OK;
    int tok = 0, pos = 0, x = 0, a = 0, r = 0, f = 0, in[2], l;
    ln.epsilon = 1e-5f;
    gpt_call(m, mp_embedding(vocab, channels), NULL, 0, &tok, &st);
    gpt_call(m, mp_position_embedding(context), &tok, 1, &pos, &st);
    in[0] = tok, in[1] = pos;
    gpt_call(m, mp_add(), in, 2, &x, &st);
    for (l = 0; l < layers; l++) {
        gpt_call(m, ln, &x, 1, NULL, &st);
        gpt_call(m, mp_multi_head_attention(heads, channels / heads, 1), NULL, 0, &a, &st);
        in[0] = x, in[1] = a;
        gpt_call(m, mp_add(), in, 2, &r, &st);
        gpt_call(m, ln, &r, 1, NULL, &st);
        gpt_call(m, mp_dense(4 * channels, MP_GELU_APPROXIMATE), NULL, 0, NULL, &st);
        gpt_call(m, mp_dense(channels, MP_LINEAR), NULL, 0, &f, &st);
        in[0] = r, in[1] = f;
        gpt_call(m, mp_add(), in, 2, &x, &st);
    }
    gpt_call(m, ln, NULL, 0, NULL, &st);
    gpt_call(m, mp_dense(vocab, MP_LINEAR), NULL, 0, NULL, &st);
    return st;
}

/* GPT-2's training recipe as llm.c's train_gpt2.py has it, in compile
   settings: sparse categorical crossentropy on the logits; AdamW with
   weight_decay 0.1 on the matrices of the products alone (the weights
   whose "LAYER/NAME" paths hold these names are excluded: Dense's and
   MultiHeadAttention's biases, LayerNormalization's gamma and beta, both
   embeddings); the global norm clipped to 1 (on the unscaled gradients).
   The caller sets the learning rate or its schedule. */
static inline mp_compile_desc gpt_recipe(void) {
    static const char *const no_decay[] = {"bias", "gamma", "beta", "embeddings", NULL};
    mp_compile_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.loss = MP_SPARSE_CATEGORICAL_CROSSENTROPY;
    cd.from_logits = 1;
    cd.optimizer.kind = MP_ADAMW;
    cd.optimizer.weight_decay = 0.1f;
    cd.optimizer.exclude_from_weight_decay = no_decay;
    cd.optimizer.global_clipnorm = 1.0f;
    return cd;
}

#endif /* GPT_MODEL_H */
