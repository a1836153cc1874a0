"""Steps per second of CTLModel.fit, keras.Model.fit and a hand-written loop.

The hand-written loop is the Keras guide's `@tf.function` train step
(seed 002: forward, loss, gradients, `optimizer.apply`, an accuracy metric).
Models: the guide's MLP (784-64-64-10) and the TensorFlow tutorial's CNN
(28x28x1), batch 64, on one device, at `steps_per_execution` 1 and 32.

These machines are noisy, so the candidates are interleaved within each
round (one epoch each, after a warm-up epoch that traces and compiles), the
rounds are repeated, and the table quotes median steps/s and the median of
the per-round ratios.

Usage:
    keras-ctl bench [--rounds 5] [--steps 100] [--out FILE]
    python benchmarks/step_overhead.py [--rounds 5] [--steps 100] [--out FILE]
"""

import argparse
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_ctl.ctl_model import CTLModel  # noqa: E402

BATCH = 64


def mlp(model_class):
    inputs = keras.Input((784,))
    x = keras.layers.Dense(64, activation="relu")(inputs)
    x = keras.layers.Dense(64, activation="relu")(x)
    return model_class(inputs, keras.layers.Dense(10)(x))


def cnn(model_class):
    inputs = keras.Input((28, 28, 1))
    x = keras.layers.Conv2D(32, 3, activation="relu")(inputs)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(64, 3, activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(64, activation="relu")(x)
    return model_class(inputs, keras.layers.Dense(10)(x))


MODELS = {"mlp": (mlp, (784,)), "cnn": (cnn, (28, 28, 1))}


def make_data(shape, steps):
    rng = np.random.default_rng(0)
    x = rng.random((steps * BATCH, *shape), dtype=np.float32)
    y = rng.integers(0, 10, steps * BATCH).astype("int32")
    return x, y


def fit_candidate(model_class, build, data, steps_per_execution):
    model = build(model_class)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        steps_per_execution=steps_per_execution,
    )
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(BATCH).cache()

    def run_epoch():
        model.fit(dataset, epochs=1, verbose=0)

    return run_epoch


def loop_candidate(build, data):
    """The guide's hand-written loop ("Writing a training loop from scratch")."""
    model = build(keras.Model)
    optimizer = keras.optimizers.Adam(1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    train_acc_metric = keras.metrics.SparseCategoricalAccuracy()
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(BATCH).cache()

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss_value = loss_fn(y, logits)
        grads = tape.gradient(loss_value, model.trainable_weights)
        optimizer.apply(grads, model.trainable_weights)
        train_acc_metric.update_state(y, logits)
        return loss_value

    def run_epoch():
        for x, y in dataset:
            train_step(x, y)
        train_acc_metric.result()
        train_acc_metric.reset_state()

    return run_epoch


def measure(args):
    rows = []
    for model_name, (build, shape) in MODELS.items():
        data = make_data(shape, args.steps)
        for spe in (1, 32):
            candidates = {
                "CTLModel.fit": fit_candidate(CTLModel, build, data, spe),
                "keras.Model.fit": fit_candidate(keras.Model, build, data, spe),
                "hand loop": loop_candidate(build, data),
            }
            for run_epoch in candidates.values():
                run_epoch()  # warm-up: trace and compile
            rates = {name: [] for name in candidates}
            for _ in range(args.rounds):
                for name, run_epoch in candidates.items():
                    start = time.perf_counter()
                    run_epoch()
                    rates[name].append(args.steps / (time.perf_counter() - start))
            ctl = rates["CTLModel.fit"]
            rows.append(
                {
                    "model": model_name,
                    "spe": spe,
                    **{name: statistics.median(r) for name, r in rates.items()},
                    "ctl/keras": statistics.median(
                        c / k for c, k in zip(ctl, rates["keras.Model.fit"])
                    ),
                    "ctl/loop": statistics.median(
                        c / h for c, h in zip(ctl, rates["hand loop"])
                    ),
                }
            )
            print(format_row(rows[-1]), flush=True)
    return rows


HEADER = (
    "| model | steps_per_execution | CTLModel.fit steps/s | keras.Model.fit "
    "steps/s | hand loop steps/s | CTLModel / keras (median ratio) | "
    "CTLModel / hand loop (median ratio) |\n|---|---|---|---|---|---|---|"
)


def format_row(row):
    return (
        f"| {row['model']} | {row['spe']} | {row['CTLModel.fit']:.0f} | "
        f"{row['keras.Model.fit']:.0f} | {row['hand loop']:.0f} | "
        f"{row['ctl/keras']:.3f} | {row['ctl/loop']:.2f} |"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100, help="steps per epoch")
    parser.add_argument("--out", help="write the markdown table here")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.steps < 1:
        parser.error(
            "--rounds and --steps must be >= 1. Received: "
            f"--rounds {args.rounds} --steps {args.steps}"
        )
    print(HEADER)
    rows = measure(args)
    device = tf.config.list_physical_devices("GPU") and "GPU" or "CPU"
    table = "\n".join([HEADER] + [format_row(row) for row in rows])
    footer = (
        f"\n\n{device}, {os.cpu_count()} cores, {platform.python_version()}, "
        f"TensorFlow {tf.__version__}, Keras {keras.__version__}; batch {BATCH}, "
        f"{args.steps} steps per epoch, {args.rounds} interleaved rounds.\n"
    )
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + footer)
    return 0


if __name__ == "__main__":
    main()
