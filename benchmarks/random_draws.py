"""What `compile(random_draws="as_one_device")` costs per training step.

Two `CTLModel`s that differ only in `random_draws` ("per_replica" and
"as_one_device", the default) train the Keras guide's MLP (784-64-64-10)
with `Dropout(0.2)` after each hidden layer and `GaussianNoise(0.1)` on
the inputs, Adam, global batch `--batch` (default 64), on `--replicas`
local replicas (MirroredStrategy; logical CPU devices here). The
candidates are interleaved within each of `--rounds` rounds (one `fit()`
call of `--epochs` epochs of `--steps` steps each, after a call that
traces: a cost of each call, such as distributing the data, is spread
over its steps); the median time per
step of each and the median of the per-round ratios are reported, with
the collectives per step each traced training step holds (counted as
`collectives.py` counts them: deterministic).

    python benchmarks/random_draws.py [--replicas 2] [--rounds 9]
        [--steps 64] [--epochs 1] [--batch 64] [--out FILE.json]
"""

import argparse
import json
import os
import statistics
import sys
import time

OPTIONS = ("per_replica", "as_one_device")


def parse():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--out")
    return parser.parse_args()


def build(option, strategy):
    import keras

    import keras_ctl

    keras.utils.set_random_seed(0)
    with strategy.scope():
        inputs = keras.Input((784,))
        h = keras.layers.GaussianNoise(0.1, seed=1)(inputs)
        for index in range(2):
            h = keras.layers.Dense(64, activation="relu")(h)
            h = keras.layers.Dropout(0.2, seed=2 + index)(h)
        model = keras_ctl.CTLModel(inputs, keras.layers.Dense(10)(h))
        model.compile(
            optimizer="adam",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            random_draws=option,
        )
    return model


def main():
    args = parse()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np

    import keras_ctl

    strategy = keras_ctl.strategies.local_mirrored_strategy(args.replicas)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.steps * args.batch, 784)).astype("float32")
    y = rng.integers(0, 10, size=len(x))
    models = {option: build(option, strategy) for option in OPTIONS}
    for model in models.values():  # traces
        model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0)
    per_step = {option: [] for option in OPTIONS}
    ratios = []
    for round_index in range(args.rounds):
        order = OPTIONS if round_index % 2 == 0 else OPTIONS[::-1]
        for option in order:
            start = time.perf_counter()
            models[option].fit(
                x, y, batch_size=args.batch, epochs=args.epochs, verbose=0
            )
            steps = args.steps * args.epochs
            per_step[option].append((time.perf_counter() - start) / steps)
        ratios.append(per_step["as_one_device"][-1] / per_step["per_replica"][-1])
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from collectives import weighted

    result = {
        "replicas": args.replicas,
        "collectives_per_step": {
            option: weighted(model.train_function.graphs()[0], 1, args.replicas)
            for option, model in models.items()
        },
        "batch": args.batch,
        "epochs_per_call": args.epochs,
        "rounds": args.rounds,
        "median_us_per_step": {
            option: round(statistics.median(times) * 1e6, 1)
            for option, times in per_step.items()
        },
        "median_ratio_as_one_device_to_per_replica": round(
            statistics.median(ratios), 3
        ),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
