"""Keras's extension points as Keras defines them: a `compute_loss`
override calling `super()` (with a term and a tracker of its own) logs
every key `keras.Model` logs on one device, per-output losses and `val_`
keys included, and trains to its weights, with no strategy, on one device
and on 2 replicas with an empty one (float64); so do Keras's documented
`compute_loss` example (a mean, `self.losses`, a tracker) and Keras's
`Distiller`, whose losses are means over the batch; a loss of shape
`(1,)` and a model whose `call()` raises train as on one device."""

import configurations
import devices
import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.distillation import Distiller
from keras.distillation import FeatureDistillation
from keras.distillation import LogitsDistillation

import keras_ctl

STRATEGIES = ["default", "onedevice", "mirrored"]
# 17 rows in batches of 8: the last batch leaves one of 2 replicas empty.
ROWS, BATCH = 17, 8


def overriding(base):
    class WithOverride(base):
        def compile(self, *args, **kwargs):
            super().compile(*args, **kwargs)
            object.__setattr__(self, "seen", keras.metrics.Mean(name="seen"))

        @property
        def metrics(self):
            return super().metrics + [self.seen]

        def compute_loss(
            self, x=None, y=None, y_pred=None, sample_weight=None, training=True
        ):
            loss = super().compute_loss(x, y, y_pred, sample_weight, training=training)
            penalty = keras.losses.MeanSquaredError()(
                keras.ops.zeros_like(y_pred["b"]), y_pred["b"]
            )
            loss = loss + 0.1 * penalty
            self.seen.update_state(loss)
            return loss

    return WithOverride


def two_outputs(base, strategy):
    keras.utils.set_random_seed(3)
    with strategy.scope():
        inputs = keras.Input((4,))
        hidden = keras.layers.Dense(5, activation="tanh", kernel_regularizer="l2")(
            inputs
        )
        outputs = {
            "a": keras.layers.Dense(1, name="a")(hidden),
            "b": keras.layers.Dense(2, name="b")(hidden),
        }
        model = overriding(base)(inputs, outputs)
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss={"a": "mse", "b": keras.losses.Huber()},
            loss_weights={"a": 0.7, "b": 1.3},
            metrics={"a": ["mae"], "b": ["mse"]},
            # Keras 3.16 traces one step per call at `steps_per_execution=1`
            # with the batch's static size, by which it then weighs the
            # per-output losses; with more steps a call, as in 3.15, each
            # step weighs 1. keras_ctl weighs each step 1.
            steps_per_execution=2,
        )
    return model


def trained(base, strategy):
    rng = np.random.default_rng(0)
    x = rng.random((ROWS, 4))
    y = {"a": x[:, :1] * 2, "b": x[:, :2] - 1}
    model = two_outputs(base, strategy)
    history = model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=2,
        verbose=0,
        shuffle=False,
        validation_data=(x[:9], {"a": y["a"][:9], "b": y["b"][:9]}),
    ).history
    return {
        "history": history,
        "evaluate": model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True),
        "as_list": model.evaluate(x, y, batch_size=BATCH, verbose=0),
        "names": model.metrics_names,
        "weights": [np.asarray(w) for w in model.get_weights()],
    }


@pytest.fixture(scope="module")
def keras_run():
    with configurations.computing_in("float64"):
        return trained(keras.Model, tf.distribute.get_strategy())


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_compute_loss_override_logs_every_key_keras_logs(keras_run, strategy):
    with configurations.computing_in("float64"):
        found = trained(keras_ctl.CTLModel, devices.get(strategy))
    expected = keras_run
    assert set(found["history"]) == set(expected["history"])
    assert {"a_loss", "b_loss", "val_a_loss", "val_b_loss", "seen"} <= set(
        found["history"]
    )
    for key, values in expected["history"].items():
        np.testing.assert_allclose(
            found["history"][key], values, rtol=1e-9, err_msg=key
        )
    assert found["names"] == expected["names"]
    for key, value in expected["evaluate"].items():
        np.testing.assert_allclose(
            found["evaluate"][key], value, rtol=1e-9, err_msg=key
        )
    np.testing.assert_allclose(found["as_list"], expected["as_list"], rtol=1e-9)
    for got, want in zip(found["weights"], expected["weights"], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def shaped_loss_history(base):
    class ShapedLoss(base):  # keras-hub's RQVAEBackbone returns shape (1,)
        def compute_loss(self, *args, **kwargs):
            return keras.ops.reshape(super().compute_loss(*args, **kwargs), (1,))

    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    model = ShapedLoss(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).random((ROWS, 4)).astype("float32")
    return model.fit(x, x[:, :1], batch_size=BATCH, epochs=2, verbose=0).history


def test_a_loss_of_shape_one_trains_as_keras():
    expected = shaped_loss_history(keras.Model)
    found = shaped_loss_history(keras_ctl.CTLModel)
    np.testing.assert_allclose(found["loss"], expected["loss"], rtol=1e-6)


def trainer(base, strategy):
    """A trainer that holds an encoder and a head and never calls itself."""

    class Trainer(base):
        def __init__(self):
            super().__init__()
            self.encoder = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
            self.head = keras.layers.Dense(1)
            self.tracker = keras.metrics.Mean(name="loss")

        def call(self, x):
            raise NotImplementedError

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = keras.losses.MeanSquaredError()(y, self.head(self.encoder(x)))
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(gradients, self.trainable_variables)
            self.tracker.update_state(loss)
            return {"loss": self.tracker.result()}

        @property
        def metrics(self):
            return [self.tracker]

    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = Trainer()
        model.compile(optimizer=keras.optimizers.SGD(0.1))
    x = np.random.default_rng(0).random((16, 4)).astype("float32")
    history = model.fit(
        x, x[:, :1], batch_size=BATCH, epochs=2, verbose=0, shuffle=False
    ).history
    return history, [np.asarray(w) for w in model.weights]


@pytest.mark.parametrize("strategy", ["onedevice", "mirrored"])
def test_a_model_whose_call_raises_trains_under_every_strategy(strategy):
    expected = trainer(keras.Model, tf.distribute.get_strategy())
    found = trainer(keras_ctl.CTLModel, devices.get(strategy))
    np.testing.assert_allclose(found[0]["loss"], expected[0]["loss"], rtol=1e-5)
    for got, want in zip(found[1], expected[1], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def fitted(model, x, y):
    """`(history, evaluate() dict)` of 2 epochs on `x`, `y`."""
    history = model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=2,
        verbose=0,
        shuffle=False,
        validation_data=(x[:9], y[:9]),
    ).history
    return history, model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)


def assert_same_run(found, expected, found_weights, expected_weights):
    for got, want in zip(found, expected, strict=True):
        assert set(got) == set(want)
        for key, values in want.items():
            np.testing.assert_allclose(got[key], values, rtol=1e-9, err_msg=key)
    for got, want in zip(found_weights, expected_weights, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def regression_run(model_class, strategy):
    """`(fitted(...), weights)` of a regularized one-output regression of
    `model_class`, made under `strategy`."""
    keras.utils.set_random_seed(2)
    with strategy.scope():
        inputs = keras.Input((4,))
        hidden = keras.layers.Dense(5, activation="tanh", kernel_regularizer="l2")
        model = model_class(inputs, keras.layers.Dense(1)(hidden(inputs)))
        model.compile(optimizer=keras.optimizers.SGD(0.1))
    x = np.random.default_rng(0).random((ROWS, 4))
    return fitted(model, x, x[:, :1] * 2 - 1), model.get_weights()


def documented_example(base, strategy):
    """`Model.compute_loss`'s docstring example: a mean over the batch, the
    layer losses and a tracker updated inside it."""

    class MyModel(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.loss_tracker = keras.metrics.Mean(name="loss")

        def compute_loss(self, x, y, y_pred, sample_weight, training=True):
            loss = keras.ops.mean((y_pred - y) ** 2)
            loss += keras.ops.sum(self.losses)
            self.loss_tracker.update_state(loss)
            return loss

    return regression_run(MyModel, strategy)


@pytest.mark.parametrize("strategy", ["onedevice", "mirrored"])
def test_the_documented_compute_loss_example_equals_one_device(strategy):
    with configurations.computing_in("float64"):
        expected = documented_example(keras.Model, tf.distribute.get_strategy())
        found = documented_example(keras_ctl.CTLModel, devices.get(strategy))
    assert_same_run(found[0], expected[0], found[1], expected[1])


def distiller(ctl, strategy, loss, distillation):
    """Keras's `Distiller` of a student by a teacher (no training of its
    own), converted with `from_model` when `ctl`."""
    keras.utils.set_random_seed(1)
    with strategy.scope():

        def network(name):
            inputs = keras.Input((4,))
            hidden = keras.layers.Dense(5, activation="tanh", name=f"{name}_hidden")
            return keras.Model(inputs, keras.layers.Dense(3)(hidden(inputs)), name=name)

        teacher, student = network("teacher"), network("student")
        if distillation == "logits":
            distillation_loss = LogitsDistillation(temperature=2.0)
        else:
            distillation_loss = FeatureDistillation(
                loss="mse",
                teacher_layer_name="teacher_hidden",
                student_layer_name="student_hidden",
            )
        model = Distiller(
            teacher=teacher,
            student=student,
            distillation_losses=distillation_loss,
            student_loss_weight=0.5,
        )
        if ctl:
            model = keras_ctl.CTLModel.from_model(model)
        model.compile(
            optimizer=keras.optimizers.SGD(0.1), loss=loss, metrics=["accuracy"]
        )
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(ROWS, 4)), rng.integers(0, 3, size=(ROWS,))
    return fitted(model, x, y), student.get_weights()


# Made in float64 (a `Loss` takes the float type of its making).
LOSSES = {
    "string": lambda: "sparse_categorical_crossentropy",
    "Loss": lambda: keras.losses.SparseCategoricalCrossentropy(from_logits=True),
}


@pytest.mark.parametrize("distillation", ["logits", "feature"])
@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_keras_distiller_equals_one_device_on_2_replicas(loss, distillation):
    with configurations.computing_in("float64"):
        expected = distiller(
            False, tf.distribute.get_strategy(), LOSSES[loss](), distillation
        )
        found = distiller(True, devices.get("mirrored"), LOSSES[loss](), distillation)
    assert {"student_loss", "distillation_loss", "total_loss"} <= set(found[0][0])
    assert_same_run(found[0], expected[0], found[1], expected[1])


def with_blocks(base, strategy):
    """A `compute_loss` built from the blocks, as the guide recommended
    before the rule: `global_mean` and `scaled_regularization_loss` keep
    their one-device meaning inside it (on one device, their Keras
    equivalents)."""

    class WithBlocks(base):
        def compute_loss(self, x, y, y_pred, sample_weight, training=True):
            per_example = keras.ops.mean((y_pred - y) ** 2, axis=-1)
            # Two stacked copies of the batch, as a GAN's real and
            # generated images: every row counts.
            stacked = keras.ops.concatenate([per_example, 2.0 * per_example])
            if base is keras.Model:
                return keras.ops.mean(stacked) + keras.ops.sum(self.losses)
            # `self.losses` before any collective (the guide's rule).
            regularization = keras_ctl.scaled_regularization_loss(self.losses)
            return keras_ctl.global_mean(stacked) + regularization

    return regression_run(WithBlocks, strategy)


def test_a_compute_loss_of_blocks_equals_one_device_on_2_replicas():
    with configurations.computing_in("float64"):
        expected = with_blocks(keras.Model, tf.distribute.get_strategy())
        found = with_blocks(keras_ctl.CTLModel, devices.get("mirrored"))
    assert_same_run(found[0], expected[0], found[1], expected[1])
