"""The cost of a `compute_loss` over the global batch.

A retrieval model (MLP 64-128-64 embeddings, in-batch softmax over the
batch's candidates, global batch 256) trains three ways on `--replicas`
local replicas (MirroredStrategy over logical CPUs; 1: the default
strategy, where a gather is the identity):

- "replica_batch": `compile(compute_loss_over="replica_batch")`, each
  replica's own candidates (not one device's loss: the baseline);
- "global_batch": `compile(compute_loss_over="global_batch")`, which
  gathers `x`, `y` and `y_pred`;
- "all_gather": the `compute_loss` gathers only `y_pred` and `y`
  (`keras_ctl.all_gather`).

The candidates are interleaved within each of `--rounds` rounds of one
epoch of `--steps` steps, after an epoch that traces; it prints the median
steps/s of each and the median per-round ratio of each one's speed to
"replica_batch"'s.

    python benchmarks/global_batch.py --replicas 2 [--rounds 11] [--steps 256]
"""

import argparse
import os
import statistics
import time

CANDIDATES = ("replica_batch", "global_batch", "all_gather")
BATCH, FEATURES, WIDTH = 256, 64, 64


def retrieval(base, gather=False):
    import keras

    import keras_ctl

    class Retrieval(base):
        def compute_loss(self, x, y, y_pred, sample_weight=None, training=True):
            if gather:
                y_pred, y = keras_ctl.all_gather(y_pred), keras_ctl.all_gather(y)
            scores = keras.ops.matmul(y_pred, keras.ops.transpose(y))
            labels = keras.ops.eye(keras.ops.shape(scores)[0])
            return keras.ops.mean(
                keras.losses.categorical_crossentropy(labels, scores, from_logits=True)
            )

    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(128, activation="relu")(inputs)
    return Retrieval(inputs, keras.layers.Dense(WIDTH)(hidden))


def candidates(strategy, steps):
    """`{mode: run one epoch}`, each traced already."""
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_ctl

    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * BATCH, FEATURES)).astype("float32")
    y = rng.normal(size=(steps * BATCH, WIDTH)).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).cache()
    made = {}
    for name in CANDIDATES:
        over = "global_batch" if name == "global_batch" else "replica_batch"
        with strategy.scope():
            model = retrieval(keras_ctl.CTLModel, gather=name == "all_gather")
            model.compile(optimizer=keras.optimizers.Adam(), compute_loss_over=over)
        model.fit(dataset, epochs=1, verbose=0)  # traces
        made[name] = lambda model=model: model.fit(dataset, epochs=1, verbose=0)
    return made


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--steps", type=int, default=256)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import keras_ctl

    if args.replicas > 1:
        strategy = keras_ctl.strategies.local_mirrored_strategy(args.replicas)
    else:
        strategy = tf.distribute.get_strategy()
    runs = candidates(strategy, args.steps)
    speeds = {name: [] for name in CANDIDATES}
    for _ in range(args.rounds):
        for name, run_epoch in runs.items():
            start = time.perf_counter()
            run_epoch()
            speeds[name].append(args.steps / (time.perf_counter() - start))
    print(f"{args.replicas} replica(s), global batch {BATCH}, {args.rounds} rounds")
    for name in CANDIDATES:
        ratios = [a / b for a, b in zip(speeds[name], speeds["replica_batch"])]
        print(
            f"  {name}: {statistics.median(speeds[name]):.1f} steps/s (median), "
            f"{statistics.median(ratios):.3f} x replica_batch's speed"
        )


if __name__ == "__main__":
    main()
