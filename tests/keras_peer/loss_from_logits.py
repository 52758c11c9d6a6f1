"""Keras's side of tests/keras_peer/peer.c: the loss and the weight
gradients of small models whose output is a softmax (or sigmoid), under
Keras 3 and under tf_keras, on inputs and weights drawn here. Writes one
text file (argv[1]) that peer.c reads; tests/matrix.sh runs both when
MIXPREC_KERAS_PYTHON names this python.

Needs tensorflow-cpu and tf-keras (pip install tensorflow-cpu; pip install
--no-deps tf-keras) in the python that runs it. The models are overconfident
on purpose: the right class's probability of many samples is below 1e-7,
where a crossentropy taken from clipped probabilities would be wrong."""
import os
import subprocess
import sys

# (name, loss, activation, activation as its own layer, policy, units, weight range)
CASES = [
    ("sparse_softmax_layer", "sparse_categorical_crossentropy", "softmax", 1, "float32", 4, 12.0),
    ("sparse_softmax_dense", "sparse_categorical_crossentropy", "softmax", 0, "float32", 4, 12.0),
    ("categorical_softmax_layer", "categorical_crossentropy", "softmax", 1, "float32", 4, 12.0),
    ("binary_sigmoid_layer", "binary_crossentropy", "sigmoid", 1, "float32", 3, 20.0),
    ("guide_mixed_float16", "sparse_categorical_crossentropy", "softmax", 1, "mixed_float16", 4, 12.0),
]
LOSS_IDS = {"sparse_categorical_crossentropy": 1, "categorical_crossentropy": 2, "binary_crossentropy": 3}
N, IN = 64, 3


def data(seed, loss, units, wrange):
    import numpy as np
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (N, IN)).astype("float32")
    w = rng.uniform(-wrange, wrange, (IN + 1) * units).astype("float32")
    labels = rng.integers(0, units, N).astype("int32")
    if loss == "binary_crossentropy":
        y = rng.integers(0, 2, (N, units)).astype("float32")
    else:
        y = np.eye(units, dtype="float32")[labels]
    return x, w, labels, y


def keras_side(flavour):
    """Loss and gradients of every case under one Keras, printed as lines."""
    os.environ["TF_USE_LEGACY_KERAS"] = "1" if flavour == "tf_keras" else "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    if flavour == "tf_keras":
        import tf_keras as keras
    else:
        import keras
    for seed, (name, loss, act, layer, policy, units, wrange) in enumerate(CASES):
        x, w, labels, y = data(seed, loss, units, wrange)
        keras.mixed_precision.set_global_policy(policy)
        inputs = keras.Input(shape=(IN,))
        if layer:
            h = keras.layers.Dense(units)(inputs)
            out = keras.layers.Activation(act, dtype="float32")(h)  # the guide's float32 output
        else:
            out = keras.layers.Dense(units, activation=act)(inputs)
        model = keras.Model(inputs, out)
        model.layers[1].set_weights([w[: IN * units].reshape(IN, units), w[IN * units:]])
        keras.mixed_precision.set_global_policy("float32")
        loss_fn = keras.losses.get(loss)
        target = tf.constant(labels if loss == "sparse_categorical_crossentropy" else y)

        @tf.function  # graph mode, as fit runs the loss
        def step():
            with tf.GradientTape() as tape:
                value = tf.reduce_mean(loss_fn(target, model(tf.constant(x), training=True)))
            return value, tape.gradient(value, model.trainable_variables)

        value, grads = step()
        g = tf.concat([tf.reshape(tf.cast(t, tf.float32), [-1]) for t in grads], 0).numpy()
        print(flavour, name, repr(float(value)), " ".join(repr(float(v)) for v in g))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--keras":
        keras_side(sys.argv[2])
        return
    out = open(sys.argv[1], "w")
    import numpy as np
    for seed, (name, loss, act, layer, policy, units, wrange) in enumerate(CASES):
        x, w, labels, y = data(seed, loss, units, wrange)
        print("case", name, LOSS_IDS[loss], act, layer, policy, N, IN, units, file=out)
        for arr in (x, w, labels, y):
            print(" ".join(repr(v.item()) for v in np.ravel(arr)), file=out)
    for flavour in ("keras3", "tf_keras"):  # each in its own process: one Keras per process
        lines = subprocess.run([sys.executable, __file__, "--keras", flavour], check=True, capture_output=True,
                               text=True).stdout
        out.write(lines)
    out.close()


if __name__ == "__main__":
    main()
