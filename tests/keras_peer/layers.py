"""Keras 3's side of peer.c's graph cases: BatchNormalization after a Dense
and after a Conv2D (channels last), LayerNormalization after a Dense, and a
residual block (Dense, Dense, Add of the input, softmax), on weights and
inputs drawn here. For each case it writes the model (one line per layer:
its kind, its arguments and the ids of the layers it reads, 0 being the
model's input), each layer's compute dtype, the sizes of its weights in
get_weights order, the inputs,
targets and weights, then what Keras 3 computes with tf.GradientTape: at
each training step the training-mode output, the loss, the gradients of the
trainable weights and every weight after SGD's update (the moving
statistics included), then the inference-mode output. Before the steps it
writes the first step's output and gradients of the same model in float64,
what both sides approximate. peer.c builds the same model with
mp_model_call and takes the same steps with the custom loop.

Needs tensorflow-cpu and tf-keras, as loss_from_logits.py; argv[1] is the
file to write."""
import os
import sys

N, LR = 16, 0.1
# The guide's float32 output under the mixed policies: a float32 Activation
# last, which only casts (linear) or takes the softmax in float32.
F32_LINEAR = ("activation", ["linear", "float32"])
F32_SOFTMAX = ("activation", ["softmax", "float32"])


def f32_output(policy):
    return [F32_LINEAR] if policy != "float32" else []


def bn_dense(policy):
    return [("dense", [8, "linear"]), ("batch_normalization", [0.99, 1e-3])] + f32_output(policy)


def bn_conv(policy):
    return [("conv2d", [4, 3, 3, "same", "linear"]), ("batch_normalization", [0.99, 1e-3])] + f32_output(policy)


def ln_dense(epsilon, policy):
    """The Dense's weights are drawn small (WEIGHT_SCALE) so that each row's
    variance is near epsilon and the two epsilons give other results."""
    return [("dense", [8, "linear"]), ("layer_normalization", [epsilon])] + f32_output(policy)


def residual(policy):
    """x -> Dense(relu) -> Dense -> Add(x) -> Dense(softmax); under the
    mixed policies the last Dense is linear and the softmax a float32 layer."""
    if policy == "float32":
        head = [("dense", [5, "softmax"])]
    else:
        head = [("dense", [5, "linear"]), F32_SOFTMAX]
    return [("dense", [6, "relu"]), ("dense", [6, "linear"]), ("add", [], [2, 0])] + head


def attention(policy):
    """Token ids (5,) -> Embedding(7, 8) -> LayerNormalization(1e-5) ->
    MultiHeadAttention(2 heads, key_dim 4, causal) -> Add -> Dense(6, the
    tanh gelu) -> Dense(3): the sequence layers of a GPT block."""
    return [("embedding", [7, 8]), ("layer_normalization", [1e-5]), ("multi_head_attention", [2, 4, 1]),
            ("add", [], [3, 1]), ("dense", [6, "gelu_approximate"]), ("dense", [3, "linear"])] + f32_output(policy)


# (name, policy, loss, training steps, input shape, layers: (kind, args[, inputs]))
TAGS = {"float32": "f32", "mixed_float16": "f16", "mixed_bfloat16": "bf16"}
CASES = [("%s_%s" % (kind, TAGS[policy]), policy, "mean_squared_error", 2, shape, layers(policy))
         for policy in TAGS for kind, shape, layers in (("bn_dense", (6,), bn_dense), ("bn_conv", (5, 5, 3), bn_conv))]
CASES += [("ln_dense_eps%g_%s" % (eps, TAGS[policy]), policy, "mean_squared_error", 1, (6,), ln_dense(eps, policy))
          for policy in TAGS for eps in (1e-3, 1e-5)]
CASES += [("residual_" + TAGS[policy], policy, "sparse_categorical_crossentropy", 1, (6,), residual(policy))
          for policy in TAGS]
CASES += [("attention_" + TAGS[policy], policy, "mean_squared_error", 1, (5,), attention(policy)) for policy in TAGS]
LOSS_IDS = {"sparse_categorical_crossentropy": 1, "mean_squared_error": 4}

# Where each weight is drawn: the BatchNormalization's moving statistics
# start away from Keras's zeros and ones, so that set_weights' order shows.
RANGES = {"kernel": (-1.0, 1.0), "bias": (-1.0, 1.0), "gamma": (0.5, 1.5), "beta": (-0.5, 0.5),
          "moving_mean": (-1.0, 1.0), "moving_variance": (0.5, 2.0), "embeddings": (-1.0, 1.0)}
# The ranges' multipliers in some cases: with kernel and bias within 0.05
# of 0, the variance of a row of ln_dense's Dense output is 1e-3 to 4e-3.
# attention's within 0.25 of 0: logits of a few units, where the softmax is
# not saturated (Keras rounds the logits to the compute dtype, mixprec keeps
# them float32: with logits of tens the two part by more than rounding).
WEIGHT_SCALE = {"ln_dense": {"kernel": 0.05, "bias": 0.05}, "attention": {"kernel": 0.25, "bias": 0.25}}


def with_inputs(layers):
    """Each layer with the ids it reads: by default the layer before it."""
    return [(kind, args, spec[0] if spec else [i]) for i, (kind, args, *spec) in enumerate(layers)]


def build(keras, policy, shape, layers):
    keras.mixed_precision.set_global_policy(policy)
    made = [keras.Input(shape=shape)]
    for kind, args, inputs in with_inputs(layers):
        if kind == "dense" and args[1] == "gelu_approximate":
            layer = keras.layers.Dense(args[0], activation=lambda v: keras.activations.gelu(v, approximate=True))
        elif kind == "dense":
            layer = keras.layers.Dense(args[0], activation=args[1])
        elif kind == "embedding":
            layer = keras.layers.Embedding(args[0], args[1])
        elif kind == "multi_head_attention":
            layer = keras.layers.MultiHeadAttention(args[0], args[1])
        elif kind == "conv2d":
            layer = keras.layers.Conv2D(args[0], (args[1], args[2]), padding=args[3], activation=args[4])
        elif kind == "batch_normalization":
            layer = keras.layers.BatchNormalization(momentum=args[0], epsilon=args[1])
        elif kind == "layer_normalization":
            layer = keras.layers.LayerNormalization(epsilon=args[0])
        elif kind == "add":
            layer = keras.layers.Add()
        else:
            layer = keras.layers.Activation(args[0], dtype=args[1])
        read = [made[i] for i in inputs]
        if kind == "multi_head_attention":  # self-attention: query = value = key
            made.append(layer(read[0], read[0], use_causal_mask=bool(args[2])))
        else:
            made.append(layer(read if len(read) > 1 else read[0]))
    model = keras.Model(made[0], made[-1])
    keras.mixed_precision.set_global_policy("float32")
    return model


def data(seed, name, loss, shape, model):
    """Inputs, targets and weights (get_weights' order) of one case."""
    import numpy as np
    rng = np.random.default_rng(100 + seed)
    if name.startswith("attention"):  # token ids, as float32 numbers
        x = rng.integers(0, 7, (N,) + shape).astype("float32")
    else:
        x = rng.uniform(-1, 1, (N,) + shape).astype("float32")
    out_shape = tuple(model.output.shape[1:])
    if loss == "sparse_categorical_crossentropy":
        y = rng.integers(0, out_shape[-1], N).astype("int32")
    else:
        y = rng.uniform(-1, 1, (N,) + out_shape).astype("float32")
    scale = WEIGHT_SCALE.get(name.split("_eps")[0].split("_")[0] if name.startswith("attention") else
                             name.split("_eps")[0], {})
    weights = [(scale.get(v.name, 1.0) * rng.uniform(*RANGES[v.name], tuple(v.shape))).astype("float32")
               for v in model.weights]
    return x, y, weights


def roles(model, layers):
    """Each weight's role, in get_weights' order: "moving" (a moving
    statistic, no gradient), "zero_gradient" (the bias of a layer that only
    a BatchNormalization reads: the batch's mean removes it, so its gradient
    is zero in exact arithmetic and only rounding is left on both sides) or
    "trainable"."""
    readers = {}
    for i, (kind, _, inputs) in enumerate(with_inputs(layers)):
        for j in inputs:
            readers.setdefault(j, set()).add(kind)
    out = []
    for i, layer in enumerate(model.layers[1:]):
        for v in layer.weights:
            if not v.trainable:
                out.append("moving")
            elif v.name == "bias" and readers.get(i + 1) == {"batch_normalization"}:
                out.append("zero_gradient")
            elif v.path.endswith("key/bias"):  # q (k + b): the same shift of a row's logits, which softmax removes
                out.append("zero_gradient")
            else:
                out.append("trainable")
    return out


def flat(arrays):
    import numpy as np
    return np.concatenate([np.ravel(np.asarray(a, dtype="float32")) for a in arrays])


def line(tag, values):
    return tag + " " + str(len(values)) + " " + " ".join(repr(float(v)) for v in values)


def run_case(keras, tf, seed, case, out):
    name, policy, loss, steps, shape, layers = case
    model = build(keras, policy, shape, layers)
    x, y, weights = data(seed, name, loss, shape, model)
    model.set_weights(weights)
    print("graph", name, policy, LOSS_IDS[loss], steps, LR, N, len(shape), " ".join(map(str, shape)),
          len(layers), file=out)
    for kind, args, inputs in with_inputs(layers):
        print(kind, " ".join(map(str, args)), len(inputs), " ".join(map(str, inputs)), file=out)
    print("dtypes", len(layers), " ".join(layer.compute_dtype for layer in model.layers[1:]), file=out)
    print("arrays", len(model.weights), " ".join("%d %s" % (int(v.numpy().size), role)
                                                 for v, role in zip(model.weights, roles(model, layers))), file=out)
    print(line("x", x.ravel()), file=out)
    print(line("y", y.ravel()), file=out)
    print(line("weights", flat(weights)), file=out)
    # What every policy approximates: the first step in float64.
    output, _, grads = train_step(keras, tf, build(keras, "float64", shape, layers), loss, x, y, weights)
    print(line("float64_output", flat([output])), file=out)
    print(line("float64_gradients", flat(grads)), file=out)
    optimizer = keras.optimizers.SGD(learning_rate=LR)
    for step in range(steps):
        output, value, grads = train_step(keras, tf, model, loss, x, y, None)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        print("step", step + 1, repr(float(value)), file=out)
        print(line("output", flat([output])), file=out)
        print(line("gradients", flat(grads)), file=out)
        print(line("weights", flat(model.get_weights())), file=out)
    print(line("inference", flat([model(tf.constant(x), training=False)])), file=out)


def train_step(keras, tf, model, loss, x, y, weights):
    """The training-mode output, the loss and its gradients (tf.GradientTape
    in graph mode, as fit runs the step), from weights if given."""
    if weights is not None:
        model.set_weights(weights)
    loss_fn = keras.losses.get(loss)
    xt, yt = tf.constant(x), tf.constant(y)

    @tf.function
    def forward_backward():
        with tf.GradientTape() as tape:
            output = model(xt, training=True)
            value = tf.reduce_mean(loss_fn(yt, output))
        grads = tape.gradient(value, model.trainable_variables)
        return output, value, [tf.convert_to_tensor(g) for g in grads]  # an Embedding's: IndexedSlices

    return forward_backward()

def main():
    os.environ["TF_USE_LEGACY_KERAS"] = "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    import keras
    tf.get_logger().setLevel("ERROR")  # each case traces its own step
    with open(sys.argv[1], "w") as out:
        print("graphs", len(CASES), file=out)
        for seed, case in enumerate(CASES):
            run_case(keras, tf, seed, case, out)


if __name__ == "__main__":
    main()
