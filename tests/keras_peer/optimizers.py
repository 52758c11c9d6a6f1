"""Keras 3's side of peer.c's optimizer cases: the options of Keras 3's base
optimizer (keras/src/optimizers/base_optimizer.py) on one Dense(3) with
bias, mean squared error, a batch of 4 samples of 2 inputs per step:
AdamW with the bias excluded from its decay (exclude_from_weight_decay),
each clip mode (clipnorm, clipvalue, global_clipnorm), accumulation over 4
steps (gradient_accumulation_steps), and under mixed_float16 the
LossScaleOptimizer with global_clipnorm: a step whose input overflows
float16 (skipped: the inner optimizer is not called) and finite ones after;
and CosineDecay with a warmup, alone and under accumulation (the schedule
reads Keras's count of steps, not of updates).
Each step is model.train_on_batch. For each case it writes a header line
(name, policy, optimizer, learning_rate, weight_decay, clipnorm, clipvalue,
global_clipnorm, accumulation steps, steps, then the schedule's
initial_learning_rate, warmup_target, warmup_steps, decay_steps, alpha, all
0 without one), the schedule's rate at steps 0 to 19 (with one), the
initial weights (kernel, then bias), then per step its inputs, targets and
the weights after it.

Needs tensorflow-cpu (Keras 3); argv[1] is the file to write."""
import os
import sys

N, IN, UNITS = 4, 2, 3

# name, policy, optimizer, learning_rate, weight_decay, clipnorm, clipvalue, global_clipnorm, accumulation, steps,
# schedule (initial_learning_rate, warmup_target, warmup_steps, decay_steps, alpha) or None
WARMUP_COSINE = (0.0, 0.05, 3, 10, 0.1)
CASES = [
    ("adamw_bias_excluded", "float32", "adamw", 0.05, 0.1, 0, 0, 0, 0, 4, None),
    ("sgd_clipnorm", "float32", "sgd", 0.1, 0, 0.5, 0, 0, 0, 4, None),
    ("sgd_clipvalue", "float32", "sgd", 0.1, 0, 0, 0.05, 0, 0, 4, None),
    ("adam_global_clipnorm", "float32", "adam", 0.05, 0, 0, 0, 0.3, 0, 4, None),
    ("adam_accumulate_4", "float32", "adam", 0.05, 0, 0, 0, 0, 4, 8, None),
    ("lso_sgd_global_clipnorm", "mixed_float16", "sgd", 0.1, 0, 0, 0, 0.5, 0, 4, None),
    ("adamw_warmup_cosine", "float32", "adamw", 0, 0.1, 0, 0, 1.0, 0, 8, WARMUP_COSINE),
    ("adam_warmup_cosine_accumulate_2", "float32", "adam", 0, 0, 0, 0, 0, 2, 8, WARMUP_COSINE),
]


def optimizer(keras, kind, lr, wd, clipnorm, clipvalue, global_clipnorm, accumulate, schedule):
    kw = {"learning_rate": lr}
    if schedule:
        init, target, warmup, decay, alpha = schedule
        kw["learning_rate"] = keras.optimizers.schedules.CosineDecay(
            init, decay, alpha=alpha, warmup_target=target, warmup_steps=warmup)
    for name, value in (("clipnorm", clipnorm), ("clipvalue", clipvalue), ("global_clipnorm", global_clipnorm),
                        ("gradient_accumulation_steps", accumulate)):
        if value:
            kw[name] = value
    if kind == "adamw":
        opt = keras.optimizers.AdamW(weight_decay=wd, **kw)
        opt.exclude_from_weight_decay(var_names=["bias"])
        return opt
    return (keras.optimizers.Adam if kind == "adam" else keras.optimizers.SGD)(**kw)


def schedule_rate(opt, step):
    """The optimizer's schedule (its learning_rate argument) at a step."""
    return float(opt._learning_rate(step))


def main(path):
    os.environ["TF_USE_LEGACY_KERAS"] = "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import keras
    rng = np.random.default_rng(54)
    with open(path, "w") as out:
        out.write("optimizers %d\n" % len(CASES))
        for name, policy, kind, lr, wd, cn, cv, gcn, acc, steps, schedule in CASES:
            keras.mixed_precision.set_global_policy(policy)
            inputs = keras.Input((IN,))
            y = keras.layers.Dense(UNITS)(inputs)
            if policy != "float32":
                y = keras.layers.Activation("linear", dtype="float32")(y)
            model = keras.Model(inputs, y)
            opt = optimizer(keras, kind, lr, wd, cn, cv, gcn, acc, schedule)
            model.compile(optimizer=opt, loss="mean_squared_error")
            kernel = rng.uniform(-1, 1, (IN, UNITS)).astype("float32")
            bias = rng.uniform(-1, 1, UNITS).astype("float32")
            model.layers[1].set_weights([kernel, bias])
            out.write("%s %s %s %.9g %.9g %.9g %.9g %.9g %d %d " % (name, policy, kind, lr, wd, cn, cv, gcn, acc, steps))
            out.write("%.9g %.9g %d %d %.9g\n" % (schedule or (0, 0, 0, 0, 0)))
            if schedule:
                out.write(" ".join("%.9g" % schedule_rate(opt, step) for step in range(20)) + "\n")
            out.write(" ".join("%.9g" % v for v in np.concatenate([kernel.ravel(), bias])) + "\n")
            for step in range(steps):
                x = rng.uniform(-2, 2, (N, IN)).astype("float32")
                if policy != "float32" and step == 0:
                    x[0, 0] = 1e30  # Inf in float16: the LossScaleOptimizer skips the step
                t = rng.uniform(-1, 1, (N, UNITS)).astype("float32")
                model.train_on_batch(x, t)
                k, b = model.layers[1].get_weights()
                out.write(" ".join("%.9g" % v for v in x.ravel()) + "\n")
                out.write(" ".join("%.9g" % v for v in t.ravel()) + "\n")
                out.write(" ".join("%.9g" % v for v in np.concatenate([k.ravel(), b])) + "\n")
            keras.mixed_precision.set_global_policy("float32")


if __name__ == "__main__":
    main(sys.argv[1])
