/* resnet_model.h - the small ResNet of examples/resnet.c, for it and for
   bench/convnet.c (--model resnet), built with the functional API:

       input (28, 28, 1)
       Conv2D 3x3 (width) - BatchNormalization - relu
       3 stages of 2 residual blocks, width, 2 width, 4 width filters; the
         first block of stages 2 and 3 halves the image (strides 2) and its
         skip is a 1x1 Conv2D with strides 2 and BatchNormalization:
           x -> Conv2D 3x3 - BN - relu - Conv2D 3x3 - BN -> Add(skip) -> relu
       GlobalAveragePooling2D - Dense(10) - softmax (float32, as the mixed
       precision guide keeps the output)

   Include after mixprec.h. Its calls return statuses; the first failure
   stops the build and is returned (mp_model_error says which layer). */
#ifndef RESNET_MODEL_H
#define RESNET_MODEL_H

/* A layer call with the ids of the functional API (Keras: y = layer(x)):
   *x becomes the new layer's id; nothing once *st is an error. */
static inline void resnet_call(mp_model *m, mp_layer_desc layer, int *x, mp_status *st) {
    if (*st == MP_OK) *st = mp_model_call(m, layer, x, 1, x);
}

/* Conv2D without its bias (BatchNormalization's beta takes its place, as
   in Keras's ResNet), then BatchNormalization with momentum `momentum`,
   then relu unless last. */
static inline int resnet_conv_bn(mp_model *m, int x, int filters, int kernel, int stride, int relu, float momentum,
                                 mp_status *st) {
    mp_layer_desc conv = mp_conv2d(filters, kernel, kernel, MP_SAME, MP_LINEAR), batch_norm = mp_batch_normalization();
    conv.strides[0] = conv.strides[1] = stride;
    conv.no_bias = 1;
    batch_norm.momentum = momentum;
    resnet_call(m, conv, &x, st);
    resnet_call(m, batch_norm, &x, st);
    if (relu) resnet_call(m, mp_activation_layer(MP_RELU), &x, st);
    return x;
}

/* The basic block: two 3x3 convolutions, the input added back, relu. */
static inline int resnet_block(mp_model *m, int x, int filters, int stride, float momentum, mp_status *st) {
    int y = resnet_conv_bn(m, resnet_conv_bn(m, x, filters, 3, stride, 1, momentum, st), filters, 3, 1, 0, momentum, st);
    int skip = stride == 1 ? x : resnet_conv_bn(m, x, filters, 1, stride, 0, momentum, st), both[2];
    both[0] = y, both[1] = skip;
    if (*st == MP_OK) *st = mp_model_call(m, mp_add(), both, 2, &y);
    resnet_call(m, mp_activation_layer(MP_RELU), &y, st);
    return y;
}

/* The layers of the ResNet of base width `width` into m, created with
   input shape (28, 28, 1); `momentum`: BatchNormalization's (Keras's
   0.99; 0.9, PyTorch's BatchNorm2d default, for runs of a few dozen
   steps, whose moving statistics, which evaluation reads, must settle
   sooner). */
static inline mp_status resnet_layers(mp_model *m, int width, float momentum) {
    mp_layer_desc softmax = mp_activation_layer(MP_SOFTMAX);
    mp_status st = MP_OK;
    int x, stage, block;
    x = resnet_conv_bn(m, MP_MODEL_INPUT, width, 3, 1, 1, momentum, &st);
    for (stage = 0; stage < 3; stage++)
        for (block = 0; block < 2; block++)
            x = resnet_block(m, x, width << stage, stage > 0 && block == 0 ? 2 : 1, momentum, &st);
    resnet_call(m, mp_global_average_pooling2d(), &x, &st);
    resnet_call(m, mp_dense(10, MP_LINEAR), &x, &st);
    softmax.dtype = "float32";
    resnet_call(m, softmax, &x, &st);
    return st;
}

#endif /* RESNET_MODEL_H */
