"""What `compile(random_draws="as_one_device")` costs per training step.

Two `CTLModel`s that differ only in `random_draws` ("per_replica" and
"as_one_device", the default) train the Keras guide's MLP (784-64-64-10)
with `Dropout(0.2)` after each hidden layer and `GaussianNoise(0.1)` on
the inputs, Adam, global batch `--batch` (default 64), on `--replicas`
local replicas (MirroredStrategy; logical CPU devices here). The
candidates are interleaved within each of `--rounds` rounds (one `fit()`
call of `--epochs` + 1 epochs of `--steps` steps each, after a call that
traces); the median time per step of each (timed over the epochs after
the first of each call, so a cost of the call, such as distributing the
data, is not counted in it: it is reported apart, as the median time of
a call outside its epochs) and the median of the per-round ratios are
reported, in wall and in CPU seconds (the process's, every thread's:
less moved by other load), with the collectives per step each traced
training step holds (counted as `collectives.py` counts them:
deterministic). A third candidate runs `"per_replica"` again: its ratio
is the noise floor of the machine.

    python benchmarks/random_draws.py [--replicas 2] [--rounds 9]
        [--steps 64] [--epochs 2] [--batch 64] [--out FILE.json]
"""

import argparse
import json
import os
import statistics
import sys
import time

# The candidates: each option, and the first again (an A/A control: how far
# two identical runs differ on this machine).
CANDIDATES = {
    "per_replica": "per_replica",
    "as_one_device": "as_one_device",
    "per_replica_again": "per_replica",
}


def parse():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
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


class EpochTimer:
    """A callback noting each epoch's wall and CPU seconds (`wall`, `cpu`)."""

    def __new__(cls):
        import keras

        class Timer(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.wall, self.cpu = [], []

            def on_epoch_begin(self, epoch, logs=None):
                self._started = time.perf_counter(), time.process_time()

            def on_epoch_end(self, epoch, logs=None):
                self.wall.append(time.perf_counter() - self._started[0])
                self.cpu.append(time.process_time() - self._started[1])

        return Timer()


def main():
    args = parse()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np

    import keras_ctl

    strategy = keras_ctl.strategies.local_mirrored_strategy(args.replicas)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.steps * args.batch, 784)).astype("float32")
    y = rng.integers(0, 10, size=len(x))
    models = {name: build(option, strategy) for name, option in CANDIDATES.items()}
    for model in models.values():  # traces
        model.fit(x, y, batch_size=args.batch, epochs=1, verbose=0)
    measured = {name: {"wall": [], "cpu": [], "call": []} for name in CANDIDATES}
    for round_index in range(args.rounds):
        order = list(CANDIDATES)[:: 1 if round_index % 2 == 0 else -1]
        for name in order:
            timer = EpochTimer()
            start = time.perf_counter()
            models[name].fit(
                x,
                y,
                batch_size=args.batch,
                epochs=args.epochs + 1,
                verbose=0,
                callbacks=[timer],
            )
            total = time.perf_counter() - start
            # The epochs after the first: the steps alone.
            steps = args.steps * args.epochs
            measured[name]["wall"].append(sum(timer.wall[1:]) / steps)
            measured[name]["cpu"].append(sum(timer.cpu[1:]) / steps)
            measured[name]["call"].append(total - sum(timer.wall))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from collectives import weighted

    def ratio(name, kind):
        got, base = measured[name][kind], measured["per_replica"][kind]
        return round(statistics.median(a / b for a, b in zip(got, base)), 3)

    def median(name, kind, scale):
        return round(statistics.median(measured[name][kind]) * scale, 1)

    result = {
        "replicas": args.replicas,
        "batch": args.batch,
        "timed_epochs_per_call": args.epochs,
        "rounds": args.rounds,
        "collectives_per_step": {
            name: weighted(models[name].train_function.graphs()[0], 1, args.replicas)
            for name in CANDIDATES
        },
    }
    for name in CANDIDATES:
        result[name] = {
            "us_per_step": median(name, "wall", 1e6),
            "cpu_us_per_step": median(name, "cpu", 1e6),
            "ratio_to_per_replica": ratio(name, "wall"),
            "cpu_ratio_to_per_replica": ratio(name, "cpu"),
            "ms_per_call_outside_its_epochs": median(name, "call", 1e3),
        }
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
