"""The cost of a `compute_loss` over the global batch.

A retrieval model (MLP 64-128-64 embeddings, in-batch softmax over the
batch's candidates, global batch 256) trains with
`compile(compute_loss_over="replica_batch")` (each replica's own
candidates) and `"global_batch"` (every replica's, `keras_ctl.all_gather`)
on `--replicas` local replicas (MirroredStrategy over logical CPUs; 1: the
default strategy, where the gather is the identity). The two candidates
are interleaved within each of `--rounds` rounds of one epoch of
`--steps` steps, after an epoch that traces; it prints the median steps/s
of each and the median per-round ratio of "global_batch"'s speed to
"replica_batch"'s.

    python benchmarks/global_batch.py --replicas 2 [--rounds 9] [--steps 32]
"""

import argparse
import os
import statistics
import time

MODES = ("replica_batch", "global_batch")
BATCH, FEATURES, WIDTH = 256, 64, 64


def retrieval(base):
    import keras

    class Retrieval(base):
        def compute_loss(self, x, y, y_pred, sample_weight=None, training=True):
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
    for mode in MODES:
        with strategy.scope():
            model = retrieval(keras_ctl.CTLModel)
            model.compile(optimizer=keras.optimizers.Adam(), compute_loss_over=mode)
        model.fit(dataset, epochs=1, verbose=0)  # traces
        made[mode] = lambda model=model: model.fit(dataset, epochs=1, verbose=0)
    return made


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import keras_ctl

    if args.replicas > 1:
        strategy = keras_ctl.strategies.local_mirrored_strategy(args.replicas)
    else:
        strategy = tf.distribute.get_strategy()
    runs = candidates(strategy, args.steps)
    speeds = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode, run_epoch in runs.items():
            start = time.perf_counter()
            run_epoch()
            speeds[mode].append(args.steps / (time.perf_counter() - start))
    ratios = [g / r for g, r in zip(speeds["global_batch"], speeds["replica_batch"])]
    print(f"{args.replicas} replica(s), global batch {BATCH}, {args.rounds} rounds")
    for mode in MODES:
        print(f"  {mode}: {statistics.median(speeds[mode]):.1f} steps/s (median)")
    print(f"  global_batch / replica_batch speed: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
