"""The rows of docs/keras.md's "Where mixprec differs from Keras", checked against the
Keras in this python: run once for Keras 3 and once for tf_keras (each in its
own process), each fact compared with what docs/keras.md says of that Keras. Prints
`keras_differences: N passed, N failed` as the C tests do. tests/matrix.sh
runs it when MIXPREC_KERAS_PYTHON names a python with tensorflow-cpu and
tf-keras."""
import os
import subprocess
import sys


def facts(flavour):
    """What one Keras does, as `name value` lines."""
    os.environ["TF_USE_LEGACY_KERAS"] = "1" if flavour == "tf_keras" else "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf
    if flavour == "tf_keras":
        import tf_keras as keras
        tf.get_logger().setLevel("ERROR")  # the LossScaleOptimizer's advice about get_scaled_loss
    else:
        import keras
    mp = keras.mixed_precision
    out = {"repr": repr(mp.Policy("mixed_float16"))}
    for name in ("float64", "int32", "bool"):
        try:
            out["policy_" + name] = mp.Policy(name).compute_dtype
        except ValueError:
            out["policy_" + name] = "refused"
    dense = keras.layers.Dense(2, dtype=mp.Policy("mixed_float16"))
    out["dense_int32_input"] = dense(tf.constant([[1, 2]], dtype=tf.int32)).dtype.name

    def lso(steps, finite, **kw):
        """Adam at 1e-3 under the loss-scale optimizer, with a true gradient
        of 0.5 or Inf: scale, iterations, weight. Keras 3's apply_gradients
        takes scaled gradients and unscales them; tf_keras's takes them
        unscaled (get_unscaled_gradients)."""
        v = tf.Variable([1.0])
        opt = mp.LossScaleOptimizer(keras.optimizers.Adam(0.001), **kw)
        if flavour == "keras3":
            opt.build([v])  # makes its scale variable
        def scale():  # tf_keras's loss_scale is a fresh tensor each time
            return float((opt.dynamic_scale if flavour == "keras3" else opt.loss_scale).numpy())

        for s in range(steps):
            g = 0.5 * (scale() if flavour == "keras3" else 1.0) if finite(s) else float("inf")
            opt.apply_gradients([(tf.constant([g]), v)])
        return scale(), int(opt.iterations.numpy()), float(v.numpy()[0])

    scale, iterations, w = lso(2, lambda s: s >= 1)
    out["iterations_after_skip"] = iterations
    out["first_update_after_skip"] = "%.3g" % (1.0 - w)
    out["scale_after_200_overflows"] = lso(200, lambda s: False)[0]
    out["weight_after_200_overflows_then_a_step"] = lso(201, lambda s: s >= 200)[2]
    out["scale_grown_from_2^126"] = lso(3, lambda s: True, initial_scale=2.0 ** 126, dynamic_growth_steps=1)[0]
    rng = np.random.default_rng(0)  # a float16 Dense: rounded after the MatMul and again after the BiasAdd?
    x = rng.standard_normal((256, 64)).astype("float16")
    k = (rng.standard_normal((64, 32)) * 0.3).astype("float16")
    b = (rng.standard_normal(32) * 3).astype("float16")
    layer = keras.layers.Dense(32, dtype="float16")
    layer.build((None, 64))
    layer.set_weights([k, b])
    y = layer(tf.constant(x)).numpy().astype("float64")
    prod = x.astype("float64") @ k.astype("float64")
    twice = (prod.astype("float16").astype("float64") + b).astype("float16")
    once = (prod + b).astype("float16")
    out["float16_dense_twice"] = int((y == twice).sum())
    out["float16_dense_once"] = int((y == once).sum())
    for name, value in out.items():
        print(name, value)


# docs/keras.md's rows: for each Keras, what each fact must be (a callable tests the value)
EXPECTED = {
    "keras3": {
        "repr": '<DTypePolicy "mixed_float16">', "policy_float64": "float64", "policy_int32": "int32",
        "policy_bool": "bool", "dense_int32_input": "float16", "iterations_after_skip": "1",
        "first_update_after_skip": "0.001", "scale_after_200_overflows": "0.0",
        "weight_after_200_overflows_then_a_step": "nan", "scale_grown_from_2^126": "inf",
        "float16_dense_twice": lambda v: int(v) >= 8180, "float16_dense_once": lambda v: int(v) < 8000,
    },
    "tf_keras": {
        "repr": '<Policy "mixed_float16">', "policy_float64": "float64", "policy_int32": "int32",
        "policy_bool": "bool", "dense_int32_input": "float16", "iterations_after_skip": "2",
        "first_update_after_skip": "0.000744", "scale_after_200_overflows": "1.0",
        "weight_after_200_overflows_then_a_step": lambda v: v != "nan",
        "scale_grown_from_2^126": "1.7014118346046923e+38",
        "float16_dense_twice": lambda v: int(v) >= 8180, "float16_dense_once": lambda v: int(v) < 8000,
    },
}


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--keras":
        facts(sys.argv[2])
        return
    passed = failed = 0
    for flavour, want in EXPECTED.items():
        lines = subprocess.run([sys.executable, __file__, "--keras", flavour], check=True, capture_output=True,
                               text=True).stdout.splitlines()
        got = dict(line.split(" ", 1) for line in lines)
        for name, expected in want.items():
            value = got.get(name)
            ok = value is not None and (expected(value) if callable(expected) else value == expected)
            passed, failed = passed + ok, failed + (not ok)
            print("%-5s %s %s: %s" % ("ok" if ok else "FAIL", flavour, name, value))
    print("keras_differences: %d passed, %d failed" % (passed, failed))
    sys.exit(failed != 0)


if __name__ == "__main__":
    main()
