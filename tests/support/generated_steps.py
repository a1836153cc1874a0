"""Generated steps of one's own, written for one device.

A seed draws a `train_step` (and maybe a `test_step`) as users write them:
a loss composed of Keras `Loss` objects, `self.compute_loss`, raw means
(`tf.reduce_mean`, `ops.mean`, `sum / count`) and the layer losses
(weight or activity regularizers, `add_loss` of a mean), sample weights,
trackers and a metric logged under another key, one or two tapes and
optimizers, a `tf.function` of its own, data that leaves replicas uneven
or empty. `run` trains it in float64 with `base` (`keras.Model` on one
device is the reference); `check` compares the two.

    python generated_steps.py --replicas R --seeds A:B

prints one JSON line per seed that differs by more than 1e-9 and a last
line with the counts (`.ci/differential` runs it).
"""

import argparse
import json
import sys

import keras
import numpy as np
import tensorflow as tf
from configurations import computing_in
from keras import ops

TERMS = ("loss_object", "compute_loss", "reduce_mean", "ops_mean", "sum_over_count")
LAYER_LOSSES = ("none", "kernel_regularizer", "activity_regularizer", "add_loss")
OPTIMIZERS = ("sgd", "adam", "sgd_clipnorm", "rmsprop")


def draw(seed):
    """The configuration of `seed` (the same on every machine)."""
    rng = np.random.default_rng(seed)

    def pick(options):
        return options[int(rng.integers(len(options)))]

    count = int(rng.integers(1, 4))
    terms = [str(t) for t in rng.choice(TERMS, size=count, replace=False)]
    return {
        "seed": seed,
        "task": pick(("classification", "regression")),
        "terms": sorted(terms),
        "layer_losses": pick(LAYER_LOSSES),
        "add_layer_losses": bool(rng.integers(2)),
        "sample_weight": bool(rng.integers(2)),
        "tracker": bool(rng.integers(2)),
        "probe": bool(rng.integers(2)),
        "two_tapes": bool(rng.integers(2)),
        "optimizer": pick(OPTIMIZERS),
        "tf_function": bool(rng.integers(4) == 0),
        "own_test_step": bool(rng.integers(2)),
        "size": pick((13, 17, 21)),
        "batch_size": pick((4, 5, 8)),
    }


class MeanActivity(keras.layers.Layer):
    """`add_loss` of a mean over the batch's activations."""

    def call(self, x):
        self.add_loss(0.01 * ops.mean(ops.square(x)))
        return x


def _optimizer(name):
    return {
        "sgd": lambda: keras.optimizers.SGD(0.1),
        "adam": lambda: keras.optimizers.Adam(0.01),
        "sgd_clipnorm": lambda: keras.optimizers.SGD(0.1, clipnorm=0.05),
        "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
    }[name]()


def _network(config):
    init = keras.initializers.GlorotUniform(seed=config["seed"])
    inputs = keras.Input((4,))
    source = config["layer_losses"]
    h = keras.layers.Dense(
        5,
        activation="tanh",
        kernel_initializer=init,
        kernel_regularizer="l2" if source == "kernel_regularizer" else None,
        activity_regularizer="l2" if source == "activity_regularizer" else None,
        name="body",
    )(inputs)
    if source == "add_loss":
        h = MeanActivity()(h)
    units = 3 if config["task"] == "classification" else 1
    outputs = keras.layers.Dense(units, kernel_initializer=init, name="head")(h)
    return inputs, outputs


def model_class(base, config):
    classification = config["task"] == "classification"
    terms, weighted = config["terms"], config["sample_weight"]

    def per_example(y, y_pred):
        if classification:
            return keras.losses.sparse_categorical_crossentropy(
                y, y_pred, from_logits=True
            )
        return ops.mean(ops.square(y_pred - y), axis=-1)

    class Generated(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.tracker = keras.metrics.Mean(name="tracked")
            self.probe = (
                keras.metrics.SparseCategoricalAccuracy(name="probe")
                if classification
                else keras.metrics.MeanAbsoluteError(name="probe")
            )

        @property
        def metrics(self):
            return [self.tracker, self.probe]

        def loss_of(self, x, y, sample_weight, y_pred):
            weights = sample_weight if weighted else None
            total = 0.0
            for term in terms:
                if term == "loss_object":
                    total += self.loss_object(y, y_pred, sample_weight=weights)
                elif term == "compute_loss":
                    total += self.compute_loss(x, y, y_pred, weights)
                elif term == "reduce_mean":
                    total += tf.reduce_mean(per_example(y, y_pred))
                elif term == "ops_mean":
                    total += 0.5 * ops.mean(ops.abs(y_pred))
                else:  # sum_over_count
                    values = per_example(y, y_pred)
                    count = ops.cast(ops.shape(values)[0], values.dtype)
                    total += ops.sum(values) / count
            # Read after the terms' collectives (another replica's forward
            # pass may have run meanwhile).
            if config["add_layer_losses"] and self.losses:
                total += ops.sum(self.losses)
            return total

        def step(self, data):
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
            with tf.GradientTape(persistent=True) as tape:
                y_pred = self(x, training=True)
                loss = self.loss_of(x, y, sample_weight, y_pred)
                head_loss = loss + 0.1 * ops.mean(ops.square(y_pred))
            if config["two_tapes"]:
                body = self.get_layer("body").trainable_variables
                head = self.get_layer("head").trainable_variables
                self.optimizer.apply(tape.gradient(loss, body), body)
                self.head_optimizer.apply(tape.gradient(head_loss, head), head)
            else:
                variables = self.trainable_variables
                self.optimizer.apply(tape.gradient(loss, variables), variables)
            return self.logs(y, y_pred, loss)

        def logs(self, y, y_pred, loss):
            logs = {"batch_loss": loss}
            if config["tracker"]:
                self.tracker.update_state(loss)
                logs["loss"] = self.tracker.result()
            if config["probe"]:
                self.probe.update_state(y, y_pred)
                logs["probe_result"] = self.probe.result()
            return logs

        def train_step(self, data):
            return self.step(data)

        def test_step(self, data):
            if not config["own_test_step"]:
                return super().test_step(data)
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
            y_pred = self(x, training=False)
            loss = self.loss_of(x, y, sample_weight, y_pred)
            return self.logs(y, y_pred, loss)

    if config["tf_function"]:
        Generated.step = tf.function(Generated.step)
    return Generated


def data(config):
    rng = np.random.default_rng(config["seed"] + 1000)
    size = config["size"]
    x = rng.normal(size=(size, 4))
    if config["task"] == "classification":
        y = rng.integers(0, 3, size=(size,))
    else:
        y = rng.normal(size=(size, 1))
    sample_weight = rng.uniform(0.5, 2.0, size=(size,))
    return x, y, sample_weight


def run(config, base, strategy):
    """Trains `config`'s step; returns its weights, history and evaluation."""
    with computing_in("float64"):
        keras.utils.set_random_seed(config["seed"])
        x, y, sample_weight = data(config)
        with strategy.scope():
            model = model_class(base, config)(*_network(config))
            model.loss_object = (
                keras.losses.SparseCategoricalCrossentropy(from_logits=True)
                if config["task"] == "classification"
                else keras.losses.MeanSquaredError()
            )
            model.head_optimizer = _optimizer("adam")
            model.compile(
                optimizer=_optimizer(config["optimizer"]), loss=model.loss_object
            )
        fit = {"batch_size": config["batch_size"], "verbose": 0}
        history = model.fit(
            x, y, sample_weight=sample_weight, epochs=2, shuffle=False, **fit
        )
        evaluation = model.evaluate(
            x, y, sample_weight=sample_weight, return_dict=True, **fit
        )
        return {
            "weights": [w.tolist() for w in model.get_weights()],
            "history": {k: list(map(float, v)) for k, v in history.history.items()},
            "evaluation": {k: float(v) for k, v in evaluation.items()},
        }


TOLERANCE = 1e-9  # float64


def largest_difference(got, expected):
    """The largest absolute difference between two `run` results, every
    weight, logged value and evaluation included."""
    assert got["history"].keys() == expected["history"].keys()
    assert got["evaluation"].keys() == expected["evaluation"].keys()
    pairs = list(zip(got["weights"], expected["weights"]))
    for logs in ("history", "evaluation"):
        pairs += [(got[logs][k], expected[logs][k]) for k in expected[logs]]
    # `np.max`, not `max`: a NaN difference is the largest, in any order.
    return float(np.max([np.max(np.abs(np.subtract(a, b))) for a, b in pairs]))


def check(seed, strategy):
    """The largest difference of `seed`'s step under `strategy` from
    `keras.Model` on one device."""
    import keras_ctl

    config = draw(seed)
    expected = run(config, keras.Model, tf.distribute.get_strategy())
    return largest_difference(run(config, keras_ctl.CTLModel, strategy), expected)


def main(argv):
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    import devices

    parser = argparse.ArgumentParser()
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--seeds", default="0:10")
    args = parser.parse_args(argv[1:])
    devices.configure_logical_cpus(args.replicas)
    strategy = tf.distribute.MirroredStrategy(
        [f"/cpu:{i}" for i in range(args.replicas)]
    )
    first, last = (int(part) for part in args.seeds.split(":"))
    largest = 0.0
    for seed in range(first, last):
        difference = check(seed, strategy)
        largest = max(largest, difference)
        if not difference <= TOLERANCE:
            print(json.dumps({"seed": seed, "difference": difference, **draw(seed)}))
    print(json.dumps({"checked": last - first, "largest": largest}))


if __name__ == "__main__":
    main(sys.argv)
