"""CTLModel.fit vs keras.Model.fit on 1 and 2 replicas, XLA off and on, and
the cost of the exact all-reduce of the global count.

The guide's MLP (784-64-64-10), global batch 64, `MirroredStrategy` over 2
logical CPU devices for the 2-replica rows. Candidates are interleaved in
each round after a warm-up epoch; the tables quote median steps/s and the
median of per-round ratios.

The all-reduce cost compares two custom steps that differ only in the
denominator of the loss: `keras_ctl.global_mean` (the global count,
all-reduced every step: exact for every batch) and
`tf.nn.compute_average_loss(..., global_batch_size=64)` (a constant: no
collective, but wrong for a last batch of another size).

Usage:
    python benchmarks/replicas_and_xla.py [--rounds 5] [--steps 100] [--out results.md]
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from keras_ctl import strategies  # noqa: E402

MIRRORED = strategies.local_mirrored_strategy(2)  # before TensorFlow starts

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_ctl  # noqa: E402
from keras_ctl.bench import mlp  # noqa: E402

BATCH = 64


class ExactCount(keras_ctl.CTLModel):
    """Divides the loss by the all-reduced global count (exact)."""

    def mean_loss(self, per_example):
        return keras_ctl.global_mean(per_example)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            per_example = keras.losses.sparse_categorical_crossentropy(
                y, self(x, training=True), from_logits=True
            )
            loss = self.mean_loss(per_example)
        keras_ctl.minimize(loss, self.trainable_weights, self.optimizer, tape)
        return {"step_loss": keras_ctl.ReplicaSum(loss)}


class FixedBatch(ExactCount):
    """Divides by a constant global batch size: no collective."""

    def mean_loss(self, per_example):
        return tf.nn.compute_average_loss(per_example, global_batch_size=BATCH)


def candidate(model_class, strategy, data, spe, jit_compile):
    with strategy.scope():
        model = mlp(model_class)
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=spe,
            jit_compile=jit_compile,
        )
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(BATCH).cache()

    def run_epoch():
        model.fit(dataset, epochs=1, verbose=0)

    try:
        run_epoch()  # warm-up: trace and compile
    except Exception as error:  # stock Keras fails with XLA under 2 replicas
        return f"fails ({type(error).__name__})"
    return run_epoch


def race(candidates, steps, rounds):
    """Median steps/s of each runnable candidate; errors pass through."""
    runnable = {k: v for k, v in candidates.items() if callable(v)}
    rates = {name: [] for name in runnable}
    for _ in range(rounds):
        for name, run_epoch in runnable.items():
            start = time.perf_counter()
            run_epoch()
            rates[name].append(steps / (time.perf_counter() - start))
    return rates


def ratio(a, b):
    return statistics.median(x / y for x, y in zip(a, b))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", help="write the markdown tables here")
    parser.add_argument("--chart", help="write a PNG bar chart of the ratios here")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    data = (
        rng.random((args.steps * BATCH, 784), dtype=np.float32),
        rng.integers(0, 10, args.steps * BATCH).astype("int32"),
    )
    lines = [
        "| replicas | steps_per_execution | XLA | CTLModel.fit steps/s | "
        "keras.Model.fit steps/s | CTLModel / keras (median ratio) |",
        "|---|---|---|---|---|---|",
    ]
    chart = {}
    for replicas, strategy in ((1, tf.distribute.get_strategy()), (2, MIRRORED)):
        for spe in (1, 32):
            for jit in (False, True):
                candidates = {
                    "ctl": candidate(keras_ctl.CTLModel, strategy, data, spe, jit),
                    "keras": candidate(keras.Model, strategy, data, spe, jit),
                }
                rates = race(candidates, args.steps, args.rounds)
                keras_cell = (
                    f"{statistics.median(rates['keras']):.0f}"
                    if "keras" in rates
                    else candidates["keras"]
                )
                ratio_cell = (
                    f"{ratio(rates['ctl'], rates['keras']):.3f}"
                    if "keras" in rates
                    else "-"
                )
                if "keras" in rates:
                    chart[f"{replicas}r spe{spe}{' xla' if jit else ''}"] = ratio(
                        rates["ctl"], rates["keras"]
                    )
                ctl_cell = f"{statistics.median(rates['ctl']):.0f}"
                lines.append(
                    f"| {replicas} | {spe} | {'on' if jit else 'off'} | "
                    f"{ctl_cell} | {keras_cell} | {ratio_cell} |"
                )
                print(lines[-1], flush=True)
    lines += [
        "",
        "| replicas | steps_per_execution | exact count steps/s | fixed batch steps/s "
        "| all-reduce cost (1 - median ratio) |",
        "|---|---|---|---|---|",
    ]
    for spe in (1, 32):
        rates = race(
            {
                "exact": candidate(ExactCount, MIRRORED, data, spe, False),
                "fixed": candidate(FixedBatch, MIRRORED, data, spe, False),
            },
            args.steps,
            args.rounds,
        )
        cost = 1.0 - ratio(rates["exact"], rates["fixed"])
        lines.append(
            f"| 2 | {spe} | {statistics.median(rates['exact']):.0f} | "
            f"{statistics.median(rates['fixed']):.0f} | {100 * cost:.1f} % |"
        )
        print(lines[-1], flush=True)
    footer = (
        f"\n\nMLP, batch {BATCH}, {args.steps} steps per epoch, {args.rounds} "
        f"interleaved rounds, TensorFlow {tf.__version__}, Keras {keras.__version__}, "
        f"{os.cpu_count()} CPU cores.\n"
    )
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + footer)
    if args.chart and chart:
        from keras_ctl import plots

        plt = plots._pyplot()
        figure, axis = plt.subplots(figsize=(7, 3))
        axis.bar(list(chart), list(chart.values()))
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.set_ylabel("CTLModel / keras steps/s")
        figure.tight_layout()
        figure.savefig(args.chart, dpi=80)
        plt.close(figure)


if __name__ == "__main__":
    main()
