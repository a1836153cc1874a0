"""Generated `compile()`/`fit()` configurations, run with `keras.Model` on
one device and with `CTLModel` under a strategy, for differential tests.

A configuration is a dict of plain values drawn from a seed (`draw(seed)`):
a model kind, a loss and its reduction, sample or class weights, metrics,
an optimizer and its options, `steps_per_execution`, `jit_compile`, arrays
or `tf.data`, a dataset size that leaves uneven (often empty) replicas, and
the dtype; every configuration validates and evaluates. `run(config, ...)`
trains from fixed initial weights and returns weights, `history`,
`evaluate()` and `predict()` as float64 arrays.

Reproduce one configuration from the command line (one device and two
replicas, float64):

    python tests/support/configurations.py SEED

or check a range of seeds under R replicas: `--replicas R --seeds A:B`.
"""

import contextlib
import json
import sys

import keras
import numpy as np
import tensorflow as tf
from keras import tree

import keras_ctl

BATCH = 8
EPOCHS = 2
# Sizes whose last batch leaves a replica of 2 or 3 without an example
# (17 = 2 x 8 + 1, 25 = 3 x 8 + 1, 33 = 4 x 8 + 1) or splits unevenly.
SIZES = (17, 25, 30, 33, 37)

KINDS = ("mlp", "conv", "two_outputs", "masked_embedding", "rnn", "add_loss")
REDUCTIONS = ("sum_over_batch_size", "sum", "mean_with_sample_weight")
OPTIMIZERS = ("sgd", "adam", "rmsprop", "adagrad", "adadelta", "adamw")
OPTIONS = (
    {},
    {},
    {"clipnorm": 0.05},
    {"global_clipnorm": 0.05},
    {"clipvalue": 0.01},
    {"use_ema": True, "ema_overwrite_frequency": 3},
    {"gradient_accumulation_steps": 2},
)
# Losses by the kind of label an output takes.
CLASS_LOSSES = ("sparse_ce", "sparse_ce_ignore", "categorical_ce", "scalar_loss")
REGRESSION_LOSSES = ("mse", "mae", "huber", "scalar_loss")
CLASSES = 4
# Keras's extension points, overridden as Keras's docs and keras.io do.
OVERRIDES = (
    "none",
    "none",
    "compute_loss",  # returns super().compute_loss(...)
    "compute_loss_extra",  # super() plus terms of its own
    "tracker_in_compute_loss",  # a tracker of its own, updated inside it
    "compute_metrics",  # returns super().compute_metrics(...)
    "steps_calling_super",  # train_step/test_step returning super()'s
    "keras_io_steps",  # steps of one's own updating self.metrics
)
# A seeded random layer after the hidden layer; CTLModel then draws as one
# device (`compile(random_draws="as_one_device")`).
RANDOM_LAYERS = ("none", "none", "dropout", "gaussian_noise", "gaussian_dropout")
RANDOM_KINDS = ("mlp", "conv", "two_outputs")
# A layer with state of its batch after the hidden layer: a position table
# looked up once a batch (`table(arange(5))`, its gradient sparse), a
# plain BatchNormalization, or a running mean of the batch assigned in
# `call()`. CTLModel then compiles with `batch_statistics="global"`.
STATE_LAYERS = ("none", "none", "none", "position_table", "batch_norm", "ema")
STATE_KINDS = ("mlp", "conv")
# The dtype Keras computes in: float64 tells logic from round-off; float32
# runs TensorFlow's oneDNN kernels and graph rewrites, which float64 never
# reaches (a `Pad` folded into a convolution lost an empty replica's
# placeholder row in float32 only).
FLOATX = ("float64", "float64", "float32")
# Kinds whose model is a chain of layers: a step of one's own can call them
# one by one (`"calls": "layers"`), and their hidden layers can be a nested
# encoder model (`"nested"`). Inputs of rank 2, 3 and 4 among them.
CHAIN_KINDS = ("mlp", "conv", "masked_embedding", "rnn")


def draw(seed):
    """The configuration of `seed` (the same on every machine)."""
    rng = np.random.default_rng(seed)

    def pick(options):
        return options[int(rng.integers(len(options)))]

    kind = pick(KINDS)
    regression = kind == "two_outputs" or bool(rng.integers(4) == 0)
    weights = pick(("none", "none", "sample", "class"))
    if regression and weights == "class":
        weights = "sample"
    loss = pick(REGRESSION_LOSSES if regression else CLASS_LOSSES)
    if loss == "scalar_loss":
        # Refused under several replicas (see `test_a_weighted_scalar_loss_*`).
        weights = "none"
    config = {
        "seed": seed,
        "kind": kind,
        "task": "regression" if regression else "classification",
        "loss": loss,
        "reduction": pick(REDUCTIONS),
        "weights": weights,
        "metrics": bool(rng.integers(2)),
        "optimizer": pick(OPTIMIZERS),
        "options": pick(OPTIONS),
        "steps_per_execution": pick((1, 1, 3)),
        "jit_compile": bool(rng.integers(4) == 0),
        "dataset": bool(rng.integers(2)),
        "size": pick(SIZES),
        "validation": bool(rng.integers(2)),
        "override": pick(OVERRIDES),
        # Drawn last: the keys above are what they were for every seed.
        "random": pick(RANDOM_LAYERS) if kind in RANDOM_KINDS else "none",
    }
    # Drawn after those, for the same reason: one configuration in 8 has a
    # loss whose own `__call__` skips Keras's reduction. It returns one
    # value for the batch, which weights cannot weigh (refused under
    # several replicas), so it trains without them.
    if rng.integers(8) == 0:
        config.update(loss="own_call_loss", weights="none")
    # Drawn last, for the same reason.
    state = pick(STATE_LAYERS)
    if kind in STATE_KINDS and (kind == "mlp" or state != "position_table"):
        config["state"] = state
    # Drawn last, for the same reason.
    config["floatx"] = pick(FLOATX)
    if kind in CHAIN_KINDS:
        config["nested"] = bool(rng.integers(3) == 0)
        if config["override"] == "keras_io_steps":
            config["calls"] = pick(("model", "layers"))
    return config


def with_axes(seed, **axes):
    """The configuration of `seed` with `axes` set (say, `kind="conv"` and
    `size=17`): the other keys drawn as `draw` draws them."""
    config = draw(seed)
    config.update(axes)
    if config["kind"] not in CHAIN_KINDS:
        config.pop("nested", None)
        config.pop("calls", None)
    if config["override"] != "keras_io_steps":
        config.pop("calls", None)
    if config["kind"] not in RANDOM_KINDS:
        config["random"] = "none"
    if config["kind"] not in STATE_KINDS or config["kind"] == "conv":
        if config.get("state") == "position_table":
            config["state"] = "none"
    if config["kind"] == "two_outputs":
        config["task"] = "regression"
        if config["loss"] not in REGRESSION_LOSSES:
            config["loss"] = "mse"
    return config


def describe(config):
    if config["kind"] == "add_loss":
        config = {**config, "layer_losses": layer_losses(config["seed"])}
    return json.dumps(config, sort_keys=True)


def _overridden(model_class, override, calls="model"):
    """`model_class` with `override` (one of `OVERRIDES`): only the methods
    that override names, written the same way for `keras.Model` and
    `CTLModel`. A step of one's own calls the model, or its layers one by
    one (`calls="layers"`, as NNCLR calls its encoder and head)."""
    if override == "none":
        return model_class

    def forward(self, x, training):
        if calls == "model":
            return self(x, training=training)
        for layer in self.layers:
            if not isinstance(layer, keras.layers.InputLayer):
                x = layer(x, training=training)
        return x

    def compile(self, *args, **kwargs):
        model_class.compile(self, *args, **kwargs)
        # A tracker of one's own, past Keras's tracking (the model is
        # built): listed in `metrics`, so `fit()` resets and logs it.
        object.__setattr__(self, "seen", keras.metrics.Mean(name="seen"))

    def metrics(self):
        return model_class.metrics.fget(self) + [self.seen]

    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        loss = model_class.compute_loss(
            self, x, y, y_pred, sample_weight, training=training
        )
        if override == "compute_loss_extra":
            first = tree.flatten(y_pred)[0]
            zeros = keras.ops.zeros_like(first)
            penalty = keras.losses.MeanSquaredError()(zeros, first)
            # and one written as for one device: a mean over the batch.
            penalty = penalty + keras.ops.mean(keras.ops.square(first))
            loss = loss + 0.01 * keras.ops.cast(penalty, loss.dtype)
        if override == "tracker_in_compute_loss":
            self.seen.update_state(loss)
        return loss

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        return model_class.compute_metrics(self, x, y, y_pred, sample_weight)

    def super_train_step(self, data):
        return model_class.train_step(self, data)

    def super_test_step(self, data):
        return model_class.test_step(self, data)

    def own_train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = forward(self, x, training=True)
            loss = self.compute_loss(x, y, y_pred, sample_weight)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        return keras_io_metrics(self, y, y_pred, sample_weight, loss)

    def own_test_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred = forward(self, x, training=False)
        loss = self.compute_loss(x, y, y_pred, sample_weight, training=False)
        return keras_io_metrics(self, y, y_pred, sample_weight, loss)

    def keras_io_metrics(self, y, y_pred, sample_weight, loss):
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            elif not metric.name.endswith("_loss"):  # per-output: Keras's
                metric.update_state(y, y_pred, sample_weight)
        return {m.name: m.result() for m in self.metrics}

    methods = {
        "compute_loss": {"compute_loss": compute_loss},
        "compute_loss_extra": {"compute_loss": compute_loss},
        "tracker_in_compute_loss": {
            "compute_loss": compute_loss,
            "compile": compile,
            "metrics": property(metrics),
        },
        "compute_metrics": {"compute_metrics": compute_metrics},
        "steps_calling_super": {
            "train_step": super_train_step,
            "test_step": super_test_step,
        },
        "keras_io_steps": {"train_step": own_train_step, "test_step": own_test_step},
    }[override]
    return type(f"{override.title().replace('_', '')}Model", (model_class,), methods)


def _model(config, model_class):
    model_class = _overridden(
        model_class, config.get("override", "none"), config.get("calls", "model")
    )
    kind = config["kind"]
    units = 1 if config["task"] == "regression" else CLASSES
    init = keras.initializers.GlorotUniform(seed=config["seed"])

    def dense(n, **kwargs):
        return keras.layers.Dense(n, kernel_initializer=init, **kwargs)

    if kind == "add_loss":
        return _with_add_loss(model_class, units, init, layer_losses(config["seed"]))
    if kind == "masked_embedding":
        inputs = keras.Input((6,), dtype="int32")
        h = keras.layers.Embedding(13, 4, mask_zero=True, embeddings_initializer=init)(
            inputs
        )
        h = keras.layers.GlobalAveragePooling1D()(h)
    elif kind == "rnn":
        inputs = keras.Input((5, 3))
        h = keras.layers.LSTM(4, kernel_initializer=init, seed=1)(inputs)
    elif kind == "conv":
        inputs = keras.Input((6, 6, 1))
        h = keras.layers.Conv2D(3, 3, activation="relu", kernel_initializer=init)(
            inputs
        )
        h = keras.layers.Flatten()(h)
    elif config.get("state") == "position_table":
        inputs = keras.Input((5,))
        h = PositionTable(6, init)(inputs)
    else:
        inputs = keras.Input((5,))
        h = dense(6, activation="tanh", kernel_regularizer=keras.regularizers.l2(1e-3))(
            inputs
        )
    if config.get("nested"):
        # The layers so far as an encoder model of their own, called by the
        # model (a backbone, a tower).
        encoder = keras.Model(inputs, h, name="encoder")
        inputs = keras.Input(inputs.shape[1:], dtype=inputs.dtype)
        h = encoder(inputs)
    h = _state_layer(config.get("state", "none"))(h)
    h = _random_layer(config.get("random", "none"))(h)
    if kind == "two_outputs":
        outputs = {
            "a": dense(1, name="a")(h),
            "b": dense(2, name="b")(h),
        }
    else:
        outputs = dense(units)(h)
    return model_class(inputs, outputs)


class PositionTable(keras.layers.Layer):
    """The inputs' features as a sequence: each position's value times a
    learned vector plus the position's row of a table looked up once a
    batch (`table(arange(positions))`, as a transformer's position
    embedding), averaged over positions."""

    def __init__(self, units, init, **kwargs):
        super().__init__(**kwargs)
        self.units, self.init = units, init

    def build(self, shape):
        self.table = keras.layers.Embedding(
            shape[-1], self.units, embeddings_initializer=self.init
        )
        self.table.build((shape[-1],))
        self.scale = self.add_weight(shape=(self.units,), initializer=self.init)

    def call(self, x):
        positions = self.table(keras.ops.arange(keras.ops.shape(x)[-1]))
        sequence = x[..., None] * self.scale + positions[None]
        return keras.ops.tanh(keras.ops.mean(sequence, axis=1))


class RunningMean(keras.layers.Layer):
    """Subtracts an exponential moving average of the batch's mean, which
    it updates in `call()` while training (a state of the batch, as an EMA
    codebook keeps)."""

    def build(self, shape):
        self.mean = self.add_weight(
            shape=shape[1:], initializer="zeros", trainable=False
        )

    def call(self, h, training=False):
        if training:
            self.mean.assign(0.9 * self.mean + 0.1 * keras.ops.mean(h, axis=0))
        return h - self.mean


def _state_layer(name):
    layers = {
        "none": lambda h: h,
        "position_table": lambda h: h,  # the first layer (`_model`)
        "batch_norm": keras.layers.BatchNormalization(),
        "ema": RunningMean(),
    }
    return layers[name]


def _random_layer(name):
    layers = {
        "none": lambda h: h,
        "dropout": keras.layers.Dropout(0.3, seed=1),
        "gaussian_noise": keras.layers.GaussianNoise(0.2, seed=2),
        "gaussian_dropout": keras.layers.GaussianDropout(0.2, seed=3),
    }
    return layers[name]


# What an `add_loss` model's layers add: a penalty on a weight; the mean over
# the batch of its activations, raw or through a Keras `Loss` object
# (keras.io's endpoint layer).
LAYER_LOSSES = ("weight", "activations_mean", "activations_loss_object")


def layer_losses(seed):
    """The non-empty subset of `LAYER_LOSSES` an `add_loss` model of `seed`
    adds, drawn apart from `draw` (whose stream stays as it was)."""
    rng = np.random.default_rng([seed, 1])
    chosen = [name for name in LAYER_LOSSES if rng.integers(2)]
    return tuple(chosen) or LAYER_LOSSES[:1]


def _with_add_loss(model_class, units, init, losses):
    class AddLoss(model_class):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(
                6, activation="tanh", kernel_initializer=init
            )
            self.out = keras.layers.Dense(units, kernel_initializer=init)
            self.activity = keras.losses.MeanSquaredError()

        def call(self, x):
            h = self.hidden(x)
            if "weight" in losses:
                self.add_loss(
                    1e-2 * keras.ops.mean(keras.ops.square(self.hidden.kernel))
                )
            if "activations_mean" in losses:
                self.add_loss(1e-1 * keras.ops.mean(keras.ops.square(h - 0.3)))
            if "activations_loss_object" in losses:
                self.add_loss(0.5 * self.activity(keras.ops.ones_like(h), h))
            return self.out(h)

    model = AddLoss()
    model(np.zeros((1, 5), keras.config.floatx()))
    return model


class _ScalarLoss(keras.losses.Loss):
    """A loss that returns one value for the batch."""

    def call(self, y_true, y_pred):
        return keras.ops.mean(keras.ops.square(y_pred - y_true))


class _OwnCallLoss(keras.losses.Loss):
    """A loss whose own `__call__` skips Keras's reduction."""

    def __call__(self, y_true, y_pred, sample_weight=None):
        return keras.ops.mean(keras.ops.square(y_pred - y_true))


def _loss(config, name):
    reduction = config["reduction"]
    loss = config["loss"]
    if loss == "sparse_ce":
        return keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=reduction
        )
    if loss == "sparse_ce_ignore":
        return keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, ignore_class=0, reduction=reduction
        )
    if loss == "categorical_ce":
        return keras.losses.CategoricalCrossentropy(
            from_logits=True, reduction=reduction
        )
    if loss == "scalar_loss":
        if reduction == "sum":
            reduction = "sum_over_batch_size"  # a sum is refused for a scalar
        return _ScalarLoss(reduction=reduction, name="scalar_loss")
    if loss == "own_call_loss":
        return _OwnCallLoss(name="own_call_loss")
    return {
        "mse": keras.losses.MeanSquaredError,
        "mae": keras.losses.MeanAbsoluteError,
        "huber": keras.losses.Huber,
    }[loss](reduction=reduction, name=name)


def _data(config):
    rng = np.random.default_rng(1000 + config["seed"])
    n, kind = config["size"], config["kind"]
    if kind == "masked_embedding":
        x = rng.integers(0, 13, (n, 6)).astype("int32")
        x[: n // 3, 3:] = 0  # masked steps
    elif kind == "rnn":
        x = rng.normal(size=(n, 5, 3))
    elif kind == "conv":
        x = rng.random((n, 6, 6, 1))
    else:
        x = rng.normal(size=(n, 5))
    if not np.issubdtype(x.dtype, np.integer):
        x = x.astype(keras.config.floatx())
    classes = rng.integers(0, CLASSES, n).astype("int32")
    if config["kind"] == "two_outputs":
        y = {
            "a": rng.normal(size=(n, 1)).astype(keras.config.floatx()),
            "b": rng.normal(size=(n, 2)).astype(keras.config.floatx()),
        }
    elif config["task"] == "regression":
        y = rng.normal(size=(n, 1)).astype(keras.config.floatx())
    elif config["loss"] in ("categorical_ce", "scalar_loss", "own_call_loss"):
        y = np.eye(CLASSES, dtype=keras.config.floatx())[classes]
    else:
        y = classes
    sample_weight = None
    if config["weights"] == "sample":
        sample_weight = rng.uniform(0.2, 2.0, n).astype(keras.config.floatx())
    return x, y, sample_weight, classes


@contextlib.contextmanager
def computing_in(dtype):
    """Within it, Keras makes and computes in `dtype`."""
    previous = keras.config.floatx(), keras.config.dtype_policy()
    # Keras keeps the global dtype policy of the first layer made after
    # `set_floatx`: set both.
    keras.config.set_floatx(dtype)
    keras.config.set_dtype_policy(dtype)
    try:
        yield
    finally:
        keras.config.set_floatx(previous[0])
        keras.config.set_dtype_policy(previous[1])


def run(config, model_class, strategy=None, floatx=None):
    """Trains `config` in `floatx` (defaults to the configuration's own);
    returns `{"weights", "predict", "history", "evaluate"}`."""
    with computing_in(floatx or config.get("floatx", "float64")):
        return _run(config, model_class, strategy or tf.distribute.get_strategy())


def _run(config, model_class, strategy):
    keras.utils.set_random_seed(config["seed"])
    x, y, sample_weight, classes = _data(config)
    n = config["size"]
    with strategy.scope():
        model = _model(config, model_class)
        names = ["a", "b"] if config["kind"] == "two_outputs" else None
        loss = (
            {name: _loss(config, name) for name in names}
            if names
            else _loss(config, "loss")
        )
        metrics = None
        if config["metrics"]:
            metrics = {"a": ["mae"], "b": ["mae"]} if names else ["mae"]
            if not names and y.ndim == 1:
                metrics = ["sparse_categorical_accuracy"]
        optimizer = keras.optimizers.get(
            {"class_name": config["optimizer"], "config": dict(config["options"])}
        )
        model.compile(
            optimizer=optimizer,
            loss=loss,
            loss_weights={"a": 0.7, "b": 1.3} if names else None,
            metrics=metrics,
            steps_per_execution=config["steps_per_execution"],
            jit_compile=config["jit_compile"],
            **_random_draws(config, model),
        )
    fit_kwargs = {"epochs": EPOCHS, "verbose": 0, "shuffle": False}
    class_weight = None
    if config["weights"] == "class":
        class_weight = {c: 0.5 + 0.25 * c for c in range(CLASSES)}
    # Every configuration validates, on half the data and one example (17
    # and 33 leave the last validation batch one example, and replicas
    # without any); the drawn `validation` stays in the draw so that the
    # keys drawn after it are what they were.
    validation = (x[: n // 2 + 1], _head(y, n // 2 + 1))
    if config["dataset"]:
        parts = (x, y) if sample_weight is None else (x, y, sample_weight)
        data = tf.data.Dataset.from_tensor_slices(parts).batch(BATCH)
        history = model.fit(
            data, class_weight=class_weight, validation_data=validation, **fit_kwargs
        )
    else:
        history = model.fit(
            x,
            y,
            batch_size=BATCH,
            sample_weight=sample_weight,
            class_weight=class_weight,
            validation_data=validation,
            **fit_kwargs,
        )
    evaluation = model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    as_list = model.evaluate(x, y, batch_size=BATCH, verbose=0)
    predictions = model.predict(x, batch_size=BATCH, verbose=0)
    weights = [np.asarray(w, "float64") for w in model.get_weights()]
    return {
        "weights": weights,
        "predict": [np.asarray(p, "float64") for p in tree.flatten(predictions)],
        "history": {k: np.asarray(v, "float64") for k, v in history.history.items()},
        "evaluate": {k: np.float64(v) for k, v in _flat_logs(evaluation).items()},
        "evaluate_list": [np.asarray(_flat_values(as_list), "float64")],
        "metrics_names": list(model.metrics_names),
    }


def _flat_logs(logs):
    """`logs` with nested dicts flattened: a keras.io step returning
    `{m.name: m.result() for m in self.metrics}` gives Keras 3.12's compiled
    metrics as one dict of results, on one device too."""
    flat = {}
    for key, value in logs.items():
        flat.update(_flat_logs(value) if isinstance(value, dict) else {key: value})
    return flat


def _flat_values(values):
    """`evaluate()`'s list (or one value), a dict in it flattened (see
    `_flat_logs`)."""
    flat = []
    for value in values if isinstance(values, list) else [values]:
        flat += list(_flat_logs(value).values()) if isinstance(value, dict) else [value]
    return flat


def _random_draws(config, model):
    """One device's draws for a CTLModel with a random layer, and the global
    batch's statistics for one with a layer of state."""
    if not isinstance(model, keras_ctl.CTLModel):
        return {}
    options = {}
    if config.get("random", "none") != "none":
        options["random_draws"] = "as_one_device"
    if config.get("state", "none") != "none":
        options["batch_statistics"] = "global"
    return options


def _head(y, n):
    if isinstance(y, dict):
        return {k: v[:n] for k, v in y.items()}
    return y[:n]


def differences(expected, actual):
    """`{what: max relative difference}` between two `run` results."""

    def relative(a, b):
        a, b = np.asarray(a, "float64"), np.asarray(b, "float64")
        if a.shape != b.shape:
            return np.inf
        scale = np.maximum(1.0, np.abs(a))
        return float(np.max(np.abs(a - b) / scale)) if a.size else 0.0

    out = {
        part: max(
            relative(a, b) for a, b in zip(expected[part], actual[part], strict=True)
        )
        for part in ("weights", "predict", "evaluate_list")
    }
    if expected["metrics_names"] != actual["metrics_names"]:
        out["metrics_names"] = np.inf
    for part in ("history", "evaluate"):
        if set(expected[part]) != set(actual[part]):
            out[part] = np.inf
            continue
        out[part] = max(
            [relative(expected[part][k], actual[part][k]) for k in expected[part]]
            or [0.0]
        )
    return out


def _mask_count_has_epsilon():
    """Whether Keras weighs a masked loss's entries by `total / (valid +
    epsilon)` (Keras 3.12; 3.15 divides by `valid` exactly): keras_ctl's
    mean over the global batch's valid entries is then exact where one
    device's is not."""
    import inspect

    from keras.src.losses import loss

    return "epsilon" in inspect.getsource(loss.apply_mask)


def check(config, strategy=None, floatx=None, tolerance=None, expected=None):
    """Compares `config` under `strategy` with `keras.Model` on one device
    (`expected`, when already run), in `floatx` (defaults to the
    configuration's own); returns `(passed, differences)`."""
    floatx = floatx or config.get("floatx", "float64")
    tolerance = tolerance or tolerance_of(floatx, strategy)
    if config["loss"] == "sparse_ce_ignore" and _mask_count_has_epsilon():
        # One device's masked mean is off the exact one by about 1e-7 / valid.
        tolerance = max(tolerance, 1e-6)
    known = known_limit(config, strategy.num_replicas_in_sync if strategy else 1)
    if known == "refused":
        try:
            run(config, keras_ctl.CTLModel, strategy, floatx=floatx)
        except ValueError as error:
            if any(name in str(error) for name in REFUSED_OPTIONS):
                return True, {}
            raise
        return False, f"trained instead of refusing one of {REFUSED_OPTIONS}"
    if expected is None:
        expected = run(config, keras.Model, floatx=floatx)
    actual = run(config, keras_ctl.CTLModel, strategy, floatx=floatx)
    found = differences(expected, actual)
    passed = max(found.values()) <= tolerance
    if not passed and floatx == "float32" and max(found.values()) <= ROUND_OFF_BOUND:
        # Round-off that the updates amplify (Adam's normalized steps, an
        # absolute error's sign) or a logic error: float64 tells them apart.
        passed, in_float64 = check(config, strategy, "float64")
        found = {**found, "float64": max(in_float64.values() or [0.0])}
    return passed, found


# The options a refusal names (`known_limit`).
REFUSED_OPTIONS = ("gradient_accumulation_steps", "random_draws", "batch_statistics")


def known_limit(config, replicas):
    """A documented limit of CTLModel on `replicas` replicas for `config`,
    or `None`; with several replicas and a `train_step` of one's own:
    "refused", for `gradient_accumulation_steps`, for a random layer
    drawing as one device with XLA, and for the global batch's statistics
    with XLA or of a running mean of one's own (each a clear `ValueError`).
    """
    if replicas == 1:
        return None
    if config.get("random", "none") != "none" and config["jit_compile"]:
        return "refused"
    state = config.get("state", "none")
    if state == "ema" or (state != "none" and config["jit_compile"]):
        return "refused"
    override = config.get("override")
    if override not in ("keras_io_steps", "steps_calling_super"):
        return None
    if config["options"].get("gradient_accumulation_steps"):
        return "refused"
    return None


# float64 relative differences allowed on one device (Keras's arithmetic,
# in another order) and under several replicas; float32's round-off.
ONE_DEVICE_TOLERANCE, REPLICAS_TOLERANCE = 1e-12, 1e-9
FLOAT32_TOLERANCE = 1e-5
# A float32 difference up to this is judged by the same configuration in
# float64 (`check`); past it, it fails.
ROUND_OFF_BOUND = 1e-3


def tolerance_of(floatx, strategy=None):
    """The relative difference allowed in `floatx` under `strategy`."""
    if floatx == "float32":
        return FLOAT32_TOLERANCE
    replicas = strategy.num_replicas_in_sync if strategy else 1
    return REPLICAS_TOLERANCE if replicas > 1 else ONE_DEVICE_TOLERANCE


def sweep(seeds, replicas, floatx=None, one_device=True):
    """Checks each seed's configuration under `replicas` (and on one device,
    unless `one_device` is false, or only there when `replicas` is 1);
    yields `(seed, where, passed, differences or error)`."""
    devices = [f"/cpu:{i}" for i in range(replicas)]
    places = {}
    if one_device or replicas == 1:
        places["one device"] = None
    if replicas > 1:
        places[f"{replicas} replicas"] = tf.distribute.MirroredStrategy(devices)
    for seed in seeds:
        config = draw(seed)
        expected = run(config, keras.Model, floatx=floatx)
        for where, strategy in places.items():
            try:
                passed, found = check(config, strategy, floatx, expected=expected)
            except Exception as error:  # reported with its configuration
                passed, found = False, f"{type(error).__name__}: {error}"[:500]
            yield seed, where, passed, found


def alternate(seeds, ctl=True, strategy=None):
    """Runs each seed's configuration twice in this process, first with a
    plain `keras.Model`, then with `CTLModel` under `strategy` (with
    `keras.Model` again when not `ctl`: the control sequence); the first
    seed in float32, the others in float64. Returns the runs, in order."""
    runs = []
    for index, seed in enumerate(seeds):
        config = draw(seed)
        floatx = "float32" if index == 0 else "float64"
        runs.append(run(config, keras.Model, floatx=floatx))
        second = keras_ctl.CTLModel if ctl else keras.Model
        runs.append(run(config, second, strategy if ctl else None, floatx=floatx))
    return runs


def main(argv):
    """`SEED` (one configuration) or `--replicas R --seeds A:B`: prints one
    JSON line per failure and a last line with the counts."""
    import argparse

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    import devices

    devices.configure_logical_cpus()
    parser = argparse.ArgumentParser()
    parser.add_argument("seed", nargs="?", type=int)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--seeds", default=None)
    parser.add_argument("--no-one-device", dest="one_device", action="store_false")
    parser.add_argument("--alternate", metavar="FILE", default=None)
    parser.add_argument("--control", action="store_true")
    args = parser.parse_args(argv[1:])
    if args.alternate:
        # Plain keras.Model and CTLModel (or, with --control, keras.Model
        # only) alternating in this process; the runs go to FILE (.npz).
        first, last = (int(part) for part in args.seeds.split(":"))
        strategy = None
        if args.replicas > 1:
            replicas = [f"/cpu:{i}" for i in range(args.replicas)]
            strategy = tf.distribute.MirroredStrategy(replicas)
        runs = alternate(range(first, last), not args.control, strategy)
        arrays = {
            f"{i}/{part}/{key}": value
            for i, result in enumerate(runs)
            for part in ("weights", "predict")
            for key, value in enumerate(result[part])
        }
        arrays.update(
            {
                f"{i}/{part}/{key}": value
                for i, result in enumerate(runs)
                for part in ("history", "evaluate")
                for key, value in result[part].items()
            }
        )
        np.savez(args.alternate, **arrays)
        return
    if args.seed is not None:
        seeds = [args.seed]
    else:
        first, last = (int(part) for part in args.seeds.split(":"))
        seeds = range(first, last)
    checked = failed = 0
    largest = {}
    for seed, where, passed, found in sweep(
        seeds, args.replicas, one_device=args.one_device
    ):
        checked += 1
        if isinstance(found, dict):
            largest[where] = max([largest.get(where, 0.0), *found.values()])
        if not passed:
            failed += 1
            print(
                json.dumps(
                    {
                        "seed": seed,
                        "where": where,
                        "found": str(found),
                        "config": draw(seed),
                    }
                ),
                flush=True,
            )
    summary = {"checked": checked, "failed": failed, "largest": largest}
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main(sys.argv)
