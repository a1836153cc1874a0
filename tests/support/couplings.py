"""Generated couplings that a first batch does not show, against
`keras.Model` on one device.

A seed draws a `train_step` of one's own whose loss is a mean over
examples plus `size` times the variance of the batch's predictions (a
term that couples the batch's examples), switched on by one of:

- `after_step`: the step's own counter reaching `start` (a warm-up);
- `padding`: a padded label in the batch, first met in batch `start` of
  the epoch and in every later one (sequence data sorted by length);
- `class`: a class absent from the batches before `start`, in every
  later one.

In either, the marked rows are drawn at random among the batch's (one at
least). A coupling that shows only on batches no measurement reads (the
fifth to seventh of every epoch of eight, say) is not found: the
schedule measures steps 1, 2, 4, 8, ... and each call's first.

`size` is drawn log-uniformly from 1e-7 to 1e-2, the dtype from float32
and float64, the epochs from 1 and 2 (one `fit()` call each). `check`
trains it with `CTLModel` under a strategy and with `keras.Model` on one
device: it ends equal (1e-9 relative in float64, 1e-5 in float32), or
stopped by a `ValueError` naming a step no earlier than the first coupled
step (a coupling under the round-off of the first measurement after it
is found by a later one). In float32 a measurement cannot tell a coupling
of the gradients under about 1e-4 from round-off (`loss_mean._tolerance`):
a float32 run that ends off by up to 1e-3 unrefused is judged by the same
configuration in float64, which must end equal or stopped by name.

    python couplings.py --replicas R --seeds A:B

prints one JSON line per seed that ends off one device without a refusal,
or is refused before its coupling starts, and a last line with the counts
(`.ci/differential` runs it).
"""

import argparse
import json
import sys

import keras
import numpy as np
import refusals
import tensorflow as tf
from configurations import computing_in
from keras import ops

import keras_ctl

KINDS = ("after_step", "padding", "class")
ROWS, BATCH, STEPS = 64, 8, 8  # steps an epoch
TOLERANCE = {"float64": 1e-9, "float32": 1e-5}


def draw(seed):
    """The configuration of `seed` (the same on every machine)."""
    rng = np.random.default_rng(seed)
    kind = KINDS[int(rng.integers(len(KINDS)))]
    return {
        "seed": seed,
        "kind": kind,
        "start": int(rng.integers(2, STEPS + 1)),
        "size": float(10 ** rng.uniform(-7, -2)),
        "dtype": ("float32", "float64")[int(rng.integers(2))],
        "epochs": int(rng.integers(1, 3)),
    }


def model_class(base, config):
    size, start, kind = config["size"], config["start"], config["kind"]

    class Coupled(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.tracker = keras.metrics.Mean(name="loss")
            self.steps_done = keras.Variable(0.0, trainable=False)

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = ops.mean(ops.square(y_pred - y[:, :2]))
                if kind == "after_step":
                    on = ops.cast(self.steps_done >= start - 1, loss.dtype)
                else:  # a marker in the batch's rows
                    on = ops.cast(ops.any(ops.equal(y[:, 2], 1.0)), loss.dtype)
                spread = ops.var(ops.mean(y_pred, axis=-1))
                loss += size * on * spread
            gradients = tape.gradient(loss, self.trainable_weights)
            self.optimizer.apply_gradients(zip(gradients, self.trainable_weights))
            self.steps_done.assign_add(1.0)
            self.tracker.update_state(loss)
            return {"loss": self.tracker.result()}

        @property
        def metrics(self):
            return [self.tracker]

    return Coupled


def data(config):
    """`(x, y)`: `y`'s last column marks the rows that switch the coupling
    on (padding, or the class absent before batch `start`), set at random
    among the rows of batch `start` on."""
    rng = np.random.default_rng(config["seed"] + 1)
    dtype = keras.config.floatx()
    x = rng.normal(size=(ROWS, 3)).astype(dtype)
    y = np.concatenate([rng.normal(size=(ROWS, 2)), np.zeros((ROWS, 1))], axis=1)
    if config["kind"] != "after_step":
        first = (config["start"] - 1) * BATCH
        y[first:, 2] = rng.random(ROWS - first) < 0.3
        for batch in range(first, ROWS, BATCH):  # one in every batch at least
            y[batch + int(rng.integers(BATCH)), 2] = 1.0
    return x, y.astype(dtype)


def run(config, base, strategy):
    """`(weights, refusal)`: the weights after training, and the message of
    the `ValueError` that stopped it (or `None`)."""
    keras.utils.set_random_seed(config["seed"])
    with strategy.scope():
        inputs = keras.Input((3,))
        hidden = keras.layers.Dense(4, activation="tanh")(inputs)
        model = model_class(base, config)(inputs, keras.layers.Dense(2)(hidden))
        model.compile(keras.optimizers.SGD(0.1))
    x, y = data(config)
    try:
        for _ in range(config["epochs"]):
            model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    except ValueError as error:
        return model.get_weights(), str(error)
    return model.get_weights(), None


def check(seed, strategy):
    """`None` when seed's run equals one device or is stopped in time,
    else what went wrong."""
    config = draw(seed)
    problem = _checked(config, strategy)
    if (
        problem
        and config["dtype"] == "float32"
        and problem.get("silently_off", 1) <= 1e-3
    ):
        if _checked({**config, "dtype": "float64"}, strategy) is None:
            return None  # under float32's round-off
    return problem


def _checked(config, strategy):
    with computing_in(config["dtype"]):
        expected, _ = run(config, keras.Model, tf.distribute.get_strategy())
        got, refusal = run(config, keras_ctl.CTLModel, strategy)
    if refusal is not None:
        found = refusals.step_named(refusal)
        if found is not None and found >= config["start"]:
            return None
        return {**config, "refused_at": found, "message": refusal[:300]}
    off = max(
        float(np.max(np.abs(g - e) / np.maximum(1.0, np.abs(e))))
        for g, e in zip(got, expected)
    )
    if off <= TOLERANCE[config["dtype"]]:
        return None
    return {**config, "silently_off": off}


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--seeds", default="0:20")
    arguments = parser.parse_args(argv)
    import devices

    devices.configure_logical_cpus(max(arguments.replicas, 2))
    cpus = [f"/cpu:{i}" for i in range(arguments.replicas)]
    strategy = tf.distribute.MirroredStrategy(cpus)
    start, stop = map(int, arguments.seeds.split(":"))
    failures = 0
    for seed in range(start, stop):
        problem = check(seed, strategy)
        if problem is not None:
            failures += 1
            print(json.dumps(problem), flush=True)
    print(json.dumps({"checked": stop - start, "failures": failures}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
