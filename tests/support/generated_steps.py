"""Generated steps of one's own, against `keras.Model` on one device.

A seed draws a `train_step` (and maybe a `test_step`) as users write them:
a loss composed of Keras `Loss` objects, `self.compute_loss`, raw means
(`tf.reduce_mean`, `ops.mean`, `sum / count`) and the layer losses
(weight or activity regularizers, `add_loss` of a mean), sample weights,
trackers and a metric logged under another key, one or two tapes and
optimizers, a `tf.function` of its own. Drawn after these, from a second
stream (the keys above stay each seed's):

- `reading`: the step is written for one device (`one_device`, 6 seeds in
  10), or is the global-batch guide's recipe written in replica shares (a
  loss over the gathered rows, of which each replica adds 1/R), declared
  with `keras_ctl.written_in_shares` (`shares_declared`) or not
  (`shares_undeclared`: under 2+ replicas `fit` must refuse it with a
  `ValueError` naming `written_in_shares`);
- `spelling`: where and how the step is written (`SPELLINGS`; the other
  modules are in `spellings/`), the declaration included; in a third of
  the one-device seeds spelled other than inline (`log_replicas`), the
  step logs the replica count read in `__init__` (one device's code may
  log it; read in the step it is refused), which must not change the
  update (its log is left out of the comparison);
- `shapes`: arrays whose last batch leaves replicas uneven (`dynamic`, the
  drawn size and batch), or one example (`empty_replica`: a replica
  without examples), or a `tf.data.Dataset` of whole batches of 6 or 12
  (`static`: every replica's batch has a static size on 2 or 3 replicas).

`run` trains it in float64 with `base` (`keras.Model` on one device is
the reference); `check` compares the two.

    python generated_steps.py --replicas R --seeds A:B

prints one JSON line per seed that differs by more than 1e-9, is not
refused as it should be, or raises, and a last line with the counts
(`.ci/differential` runs it).
"""

import argparse
import functools
import json
import math
import sys

import keras
import numpy as np
import tensorflow as tf
from configurations import computing_in
from keras import ops
from spellings import aliases
from spellings import decorators
from spellings import helpers
from spellings import library
from spellings import mixins

import keras_ctl

TERMS = ("loss_object", "compute_loss", "reduce_mean", "ops_mean", "sum_over_count")
LAYER_LOSSES = ("none", "kernel_regularizer", "activity_regularizer", "add_loss")
OPTIMIZERS = ("sgd", "adam", "sgd_clipnorm", "rmsprop")
SPELLINGS = (
    "inline",
    "helper_module",
    "alias_import",
    "decorator",
    "free_function",
    "partial_or_lambda",
    "mixin",
    "library_base",
    "instance",
)
READINGS = ("one_device", "shares_declared", "shares_undeclared")
SHAPES = ("dynamic", "static", "empty_replica")


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
        **_draw_writing(seed),
    }


def _draw_writing(seed):
    """How the step of `seed` is written and fed, from a stream of its own:
    adding these keys changed none of the keys drawn before them."""
    rng = np.random.default_rng([seed, 1])
    spelling = SPELLINGS[int(rng.integers(len(SPELLINGS)))]
    reading = str(rng.choice(READINGS, p=(0.6, 0.2, 0.2)))
    shapes = SHAPES[int(rng.integers(len(SHAPES)))]
    log_replicas = bool(rng.integers(3) == 0)
    return {
        "spelling": spelling,
        "reading": reading,
        "shapes": shapes,
        "log_replicas": log_replicas
        and reading == "one_device"
        and spelling != "inline",
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

    class Generated(*_bases(base, config)):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.tracker = keras.metrics.Mean(name="tracked")
            self.probe = (
                keras.metrics.SparseCategoricalAccuracy(name="probe")
                if classification
                else keras.metrics.MeanAbsoluteError(name="probe")
            )
            self.log_replicas = config["log_replicas"]
            # Read outside the step: one device's code has no replica count.
            self.replicas = keras_ctl.num_replicas()
            if hasattr(self, "instance_step"):
                self.train_step = self.instance_step()

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

        def coupled_loss(self, y, y_pred, sample_weight):
            """A loss that couples the examples of the batch it is given:
            the (weighted) mean loss, and each prediction against every
            other one as its negatives."""
            if not weighted:
                sample_weight = ops.ones_like(y_pred[:, 0])
            weights = ops.cast(sample_weight, y_pred.dtype)
            losses = per_example(y, y_pred) * weights
            scores = ops.matmul(y_pred, ops.transpose(y_pred))
            negatives = ops.logsumexp(scores, axis=1) - ops.diagonal(scores)
            return ops.sum(losses) / ops.sum(weights) + 0.1 * ops.mean(negatives)

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

        def step_in_shares(self, data):
            """The global-batch guide's recipe, written in the class."""
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                rows = [keras_ctl.all_gather(t) for t in (y, y_pred, sample_weight)]
                loss = self.coupled_loss(*rows)
                # Gradients are summed across replicas: each adds its 1/R.
                share = loss / keras_ctl.num_replicas()
            variables = self.trainable_variables
            self.optimizer.apply(tape.gradient(share, variables), variables)
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

        def test_step(self, data):
            if not config["own_test_step"]:
                return super().test_step(data)
            x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
            y_pred = self(x, training=False)
            loss = self.loss_of(x, y, sample_weight, y_pred)
            return self.logs(y, y_pred, loss)

    if config["tf_function"]:
        Generated.step = tf.function(Generated.step)
    _spell_train_step(Generated, config)
    return Generated


def _bases(base, config):
    """The generated class's bases: a mixin's or a library's class brings
    the `train_step` of those spellings."""
    if config["spelling"] == "mixin":
        return mixins.BY_READING[config["reading"]], base
    if config["spelling"] == "library_base":
        return (library.model_class(base, config["reading"]),)
    return (base,)


def _spell_train_step(cls, config):
    """Gives `cls` the `train_step` of `config`'s reading, spelled as its
    `spelling` says: on the class, or on the instance through
    `instance_step` (`instance`, and `partial_or_lambda` on odd seeds: a
    `functools.partial`; on even seeds, a lambda on the class)."""
    spelling, reading = config["spelling"], config["reading"]
    declared = reading == "shares_declared"
    # Each reading has its own method, so that a one-device step's code
    # names no replica arithmetic at all.
    if reading == "one_device":

        def body(self, data):
            return helpers.with_replicas(self, self.step(data))

    else:

        def body(self, data):
            return self.step_in_shares(data)

    declare = keras_ctl.written_in_shares if declared else (lambda step: step)
    helper = getattr(aliases if spelling == "alias_import" else helpers, reading)
    if spelling == "inline":
        cls.train_step = declare(body)
    elif spelling in ("helper_module", "alias_import"):

        def train_step(self, data):
            return helper(self, data)

        cls.train_step = train_step
    elif spelling == "decorator":
        cls.train_step = (decorators.in_shares if declared else decorators.traced)(body)
    elif spelling == "free_function":
        cls.train_step = helper  # `def shares_declared(model, data)`: a method
    elif spelling == "partial_or_lambda" and config["seed"] % 2:
        cls.instance_step = lambda self: functools.partial(helper, self)
    elif spelling == "partial_or_lambda":
        cls.train_step = lambda self, data: helper(self, data)
    elif spelling == "instance":
        cls._my_step = declare(body)
        cls.instance_step = lambda self: self._my_step
    # "mixin" and "library_base": inherited (`_bases`).


def data(config, size=None):
    rng = np.random.default_rng(config["seed"] + 1000)
    size = size or config["size"]
    x = rng.normal(size=(size, 4))
    if config["task"] == "classification":
        y = rng.integers(0, 3, size=(size,))
    else:
        y = rng.normal(size=(size, 1))
    sample_weight = rng.uniform(0.5, 2.0, size=(size,))
    return x, y, sample_weight


def fed(config):
    """`fit`'s and `evaluate`'s data arguments, shaped as `config["shapes"]`
    says: the same for the reference and under any replica count."""
    size, batch = config["size"], config["batch_size"]
    if config["shapes"] == "empty_replica":
        # The last batch holds one example: 2 or 3 replicas leave some empty.
        size = size // batch * batch + 1
    x, y, sample_weight = data(config, size)
    if config["shapes"] != "static":
        return {"x": x, "y": y, "sample_weight": sample_weight, "batch_size": batch}
    # Whole batches of 6 or 12 split evenly on 2 and 3 replicas: every
    # replica's batch has a static size.
    batch = 6 if batch < 8 else 12
    dataset = tf.data.Dataset.from_tensor_slices((x, y, sample_weight))
    return {"x": dataset.batch(batch, drop_remainder=True)}


def run(config, base, strategy):
    """Trains `config`'s step; returns its weights, history and evaluation."""
    with computing_in("float64"):
        keras.utils.set_random_seed(config["seed"])
        inputs = fed(config)
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
        history = model.fit(**inputs, epochs=2, shuffle=False, verbose=0)
        evaluation = model.evaluate(**inputs, return_dict=True, verbose=0)
        return {
            "weights": [w.tolist() for w in model.get_weights()],
            "history": {k: list(map(float, v)) for k, v in history.history.items()},
            "evaluation": {k: float(v) for k, v in evaluation.items()},
        }


TOLERANCE = 1e-9  # float64
# Logged information that differs from one device by design: the replica
# count (1 there, R under R replicas).
INFORMATION = ("replicas",)


def largest_difference(got, expected):
    """The largest absolute difference between two `run` results, every
    weight, logged value (but `INFORMATION`) and evaluation included."""
    assert got["history"].keys() == expected["history"].keys()
    assert got["evaluation"].keys() == expected["evaluation"].keys()
    pairs = list(zip(got["weights"], expected["weights"]))
    for logs in ("history", "evaluation"):
        keys = [k for k in expected[logs] if k not in INFORMATION]
        pairs += [(got[logs][k], expected[logs][k]) for k in keys]
    # `np.max`, not `max`: a NaN difference is the largest, in any order.
    return float(np.max([np.max(np.abs(np.subtract(a, b))) for a, b in pairs]))


def check(seed, strategy):
    """The largest difference of `seed`'s step under `strategy` from
    `keras.Model` on one device; for a step in shares left undeclared, 0
    when `fit` refuses it as it must under 2+ replicas, else infinity.

    Raises:
        ValueError: when `fit` refuses the undeclared step for another
            reason than the missing `written_in_shares`.
    """
    config = draw(seed)
    if config["reading"] == "shares_undeclared" and strategy.num_replicas_in_sync > 1:
        try:
            run(config, keras_ctl.CTLModel, strategy)
        except ValueError as error:
            if "written_in_shares" in str(error):
                return 0.0
            raise
        return math.inf
    expected = run(config, keras.Model, tf.distribute.get_strategy())
    return largest_difference(run(config, keras_ctl.CTLModel, strategy), expected)


def _checked(seed, strategy):
    """`(difference, {})`, or `(inf, {"error": ...})` for a seed that
    raises: reported like any failure, and the next seeds still run."""
    try:
        return check(seed, strategy), {}
    except Exception as error:
        return math.inf, {"error": f"{type(error).__name__}: {error}"[:600]}


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
        difference, failure = _checked(seed, strategy)
        largest = max(largest, difference)
        if not difference <= TOLERANCE:
            line = {"seed": seed, "difference": difference, **failure, **draw(seed)}
            print(json.dumps(line), flush=True)
    print(json.dumps({"checked": last - first, "largest": largest}))


if __name__ == "__main__":
    main(sys.argv)
