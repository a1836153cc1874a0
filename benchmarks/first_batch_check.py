"""What measuring a loss of one's own on the first batch costs.

Under several replicas, `compile(compute_loss_over=None)` (the default)
compares, before the first step of a `fit()`, the gradient the replicas'
weighted losses sum to with one device's on the first batch
(`keras_ctl/_engine/loss_mean.py`); `"replica_batch"` trains the same
way without it. Both train the Keras guide's MLP (784-64-64-10, Adam,
global batch `--batch`, default 64) whose `compute_loss` adds a mean
penalty to `super().compute_loss` (`--model compute_loss`), or with the
Keras guide's `train_step` of its own (`--model train_step`: the model's
`compute_loss`, `optimizer.apply`, its metrics), on `--replicas` local
replicas
(MirroredStrategy; logical CPU devices here). Each of `--rounds` rounds
builds a new model of each candidate, interleaved, and times its first
`fit()` call (one epoch of `--steps` steps, traced in the call: what a
user waits for), in wall and in CPU seconds (the process's, every
thread's). Reported: the median time of each, the median per-round
difference and ratio against `"replica_batch"`, and a third candidate
that is `"replica_batch"` again (an A/A control: the noise floor).

    python benchmarks/first_batch_check.py [--replicas 2] [--rounds 7]
        [--steps 32] [--batch 64] [--model compute_loss] [--out FILE.json]
"""

import argparse
import json
import os
import statistics
import sys
import time

CANDIDATES = {
    "replica_batch": "replica_batch",
    "measured (default)": None,
    "replica_batch_again": "replica_batch",
}


def parse():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument(
        "--model", choices=("compute_loss", "train_step"), default="compute_loss"
    )
    parser.add_argument("--out")
    return parser.parse_args()


def build(option, strategy, kind):
    import keras
    import tensorflow as tf

    import keras_ctl

    class WithPenalty(keras_ctl.CTLModel):
        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
            loss = super().compute_loss(x, y, y_pred, sample_weight)
            return loss + 1e-3 * keras.ops.mean(keras.ops.square(y_pred))

    class OwnStep(keras_ctl.CTLModel):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(gradients, self.trainable_variables)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

    keras.utils.set_random_seed(0)
    with strategy.scope():
        inputs = keras.Input((784,))
        h = keras.layers.Dense(64, activation="relu")(inputs)
        h = keras.layers.Dense(64, activation="relu")(h)
        model_class = WithPenalty if kind == "compute_loss" else OwnStep
        model = model_class(inputs, keras.layers.Dense(10)(h))
        model.compile(
            keras.optimizers.Adam(1e-3),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"] if kind == "train_step" else None,
            compute_loss_over=option,
        )
    return model


def first_fit(option, strategy, x, y, batch, kind):
    """Wall and CPU seconds of a new model's first `fit()` call."""
    model = build(option, strategy, kind)
    wall, cpu = time.perf_counter(), time.process_time()
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    return time.perf_counter() - wall, time.process_time() - cpu


def main():
    args = parse()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas
    )
    devices = [f"/cpu:{i}" for i in range(args.replicas)]
    strategy = tf.distribute.MirroredStrategy(devices)
    rows = args.steps * args.batch
    rng = np.random.default_rng(0)
    x = rng.random((rows, 784), dtype="float32")
    y = rng.integers(0, 10, rows)
    times = {name: {"wall": [], "cpu": []} for name in CANDIDATES}
    for _ in range(args.rounds):
        for name, option in CANDIDATES.items():
            wall, cpu_s = first_fit(option, strategy, x, y, args.batch, args.model)
            times[name]["wall"].append(wall)
            times[name]["cpu"].append(cpu_s)
    base = times["replica_batch"]
    result = {"args": vars(args), "times": times, "summary": {}}
    print(
        f"{args.replicas} replicas, {args.rounds} rounds, "
        f"first fit() of {args.steps} steps, a {args.model} of its own"
    )
    for name in CANDIDATES:
        summary = {}
        for kind in ("wall", "cpu"):
            got, against = times[name][kind], base[kind]
            summary[f"{kind}_median_s"] = statistics.median(got)
            summary[f"{kind}_added_s"] = statistics.median(
                g - a for g, a in zip(got, against)
            )
            summary[f"{kind}_ratio"] = statistics.median(
                g / a for g, a in zip(got, against)
            )
        result["summary"][name] = summary
        print(
            f"{name:22} wall {summary['wall_median_s']:.2f} s "
            f"(+{summary['wall_added_s']:.2f} s, x{summary['wall_ratio']:.3f})  "
            f"cpu {summary['cpu_median_s']:.2f} s "
            f"(+{summary['cpu_added_s']:.2f} s, x{summary['cpu_ratio']:.3f})"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
