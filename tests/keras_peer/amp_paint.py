"""TensorFlow's side of the automatic mixed precision comparison in
tests/keras_peer/peer.c: trains the guide's MLP (tf_keras, its layer names
are mixprec's) for one step with TensorFlow's CPU graph rewrite on
(auto_mixed_precision_cpu with its float16 emulation off; the oneDNN
bfloat16 rewrite for bfloat16), reads the rewrite's log, and writes
(argv[1]) one line per forward op it converted, `amp DTYPE LAYER OP`, plus
its summary line, `summary DTYPE X Y Z`. Forward ops not listed stayed
float32."""
import os
import re
import subprocess
import sys


def tensorflow_side(dtype):
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras
    from tensorflow.core.protobuf import rewriter_config_pb2
    from tensorflow.python.eager import context

    if dtype == "float16":  # the rewriter option Python does not expose: set it in the context's config
        config = context.Context.config.fget

        def with_amp_cpu(self):
            c = config(self)
            c.graph_options.rewrite_options.auto_mixed_precision_cpu = rewriter_config_pb2.RewriterConfig.ON
            return c

        context.Context.config = property(with_amp_cpu)
    else:
        tf.config.optimizer.set_experimental_options({"auto_mixed_precision_onednn_bfloat16": True})
    inputs = keras.Input(shape=(784,))
    x = keras.layers.Dense(64, activation="relu")(inputs)
    x = keras.layers.Dense(64, activation="relu")(x)
    x = keras.layers.Dense(10)(x)
    out = keras.layers.Activation("softmax")(x)
    model = keras.Model(inputs, out)
    model.compile(loss="sparse_categorical_crossentropy", optimizer="rmsprop", metrics=["accuracy"])
    rng = np.random.default_rng(0)
    model.fit(rng.random((32, 784), dtype="float32"), rng.integers(0, 10, 32), batch_size=32, epochs=1, verbose=0)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--tensorflow":
        tensorflow_side(sys.argv[2])
        return
    out = open(sys.argv[1], "w")
    for dtype, tf_name in (("float16", "half"), ("bfloat16", "bfloat16")):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="auto_mixed_precision=2",
                   TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16="0")
        log = subprocess.run([sys.executable, __file__, "--tensorflow", dtype], env=env, check=True,
                             capture_output=True, text=True).stderr
        summary = re.search(r"Converted (\d+)/(\d+) nodes to \w+ precision using (\d+) cast", log)
        print("summary", dtype, *summary.groups(), file=out)
        changed = r"Changing type T of (\w+) node (?:StatefulPartitionedCall/)?model/(\w+)/\w+ to " + tf_name
        for op, layer in sorted(set(re.findall(changed, log))):
            print("amp", dtype, layer, op, dtype, file=out)
    out.close()


if __name__ == "__main__":
    main()
