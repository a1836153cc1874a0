"""Batch statistics a training step keeps in the model's variables, under
2 replicas (`compile(batch_statistics=...)`).

A small residual conv net with plain `BatchNormalization`, converted from
a `keras.Model` (`CTLModel.from_model`), with `"global"` equals
`keras.Model` on one device in float64 (17 rows in batches of 8: the last
batch leaves a replica empty), moving statistics included; the default
warns once and names the moving statistics; `"per_replica"` stays silent
and differs. A layer's own running mean of its batch (an EMA) is found
from the traced step whatever it is spelled as, is refused with
`"global"`, and is not found when its mean is summed across replicas;
BatchNorm with a mask (its moments are its own sums) is refused too."""

import functools
import warnings

import configurations
import devices
import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers
from keras import ops

import keras_ctl

ROWS, BATCH = 17, 8


def data():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(ROWS, 4, 4, 2)) * 3 + 1
    return x, rng.integers(0, 3, ROWS)


def residual_net():
    inputs = keras.Input((4, 4, 2))
    h = layers.Conv2D(4, 3, padding="same")(inputs)
    h = layers.BatchNormalization(momentum=0.5, name="norm_1")(h)
    h = layers.Activation("relu")(h)
    h = layers.Conv2D(4, 3, padding="same")(h)
    h = layers.Add()([h, layers.Conv2D(4, 1)(inputs)])
    h = layers.BatchNormalization(momentum=0.5, name="norm_2")(h)
    h = layers.GlobalAveragePooling2D()(layers.Activation("relu")(h))
    return keras.Model(inputs, layers.Dense(3)(h))


def trained(strategy, converted, run_eagerly=False, **options):
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = residual_net()
        if converted:
            model = keras_ctl.CTLModel.from_model(model)
        model.compile(
            keras.optimizers.Adam(0.05),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            run_eagerly=run_eagerly,
            **options,
        )
    x, y = data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    said = [str(w.message) for w in caught if "batch_statistics" in str(w.message)]
    return model.get_weights(), history.history["loss"], said


@functools.cache
def one_device():
    with configurations.computing_in("float64"):
        return trained(devices.get("default"), False)


def largest_difference(a, b):
    return max(float(np.max(np.abs(u - v))) for u, v in zip(a, b))


@pytest.mark.slow  # for the fast tier's time; the suite runs it
@pytest.mark.parametrize("run_eagerly", [False, True], ids=["traced", "run_eagerly"])
def test_global_batch_statistics_equal_one_device(run_eagerly):
    expected, expected_loss, _ = one_device()
    with configurations.computing_in("float64"):
        got, loss, said = trained(
            devices.get("mirrored"), True, run_eagerly, batch_statistics="global"
        )
    assert largest_difference(expected, got) < 1e-9  # moving statistics included
    assert np.allclose(expected_loss, loss, rtol=0, atol=1e-9)
    assert said == []


def test_the_default_warns_once_and_per_replica_is_silent_and_differs():
    expected = one_device()[0]
    with configurations.computing_in("float64"):
        default, _, said = trained(devices.get("mirrored"), True)
        per_replica, _, silent = trained(
            devices.get("mirrored"), True, batch_statistics="per_replica"
        )
    assert len(said) == 1
    for layer in ("norm_1", "norm_2"):
        for name in ("moving_mean", "moving_variance"):
            assert f"`{layer}/{name}`" in said[0]
    assert 'batch_statistics="global"' in said[0]
    assert silent == []
    assert largest_difference(default, per_replica) == 0.0
    assert largest_difference(expected, per_replica) > 1e-3


class RunningMean(layers.Layer):
    """Keeps an EMA of its inputs' mean over the batch, as written (`ops`,
    `tf` or a helper) or summed across replicas first."""

    def __init__(self, spelling, **kwargs):
        super().__init__(**kwargs)
        self.spelling = spelling
        self.mean = self.add_weight(
            shape=(3,), initializer="zeros", trainable=False, name="mean"
        )

    def call(self, x, training=False):
        if training:
            self.mean.assign(0.9 * self.mean + 0.1 * SPELLINGS[self.spelling](x))
        return x - self.mean


def summed_across_replicas(x):
    total = keras_ctl.all_reduce_sum(ops.sum(x, axis=0))
    count = keras_ctl.all_reduce_sum(ops.cast(ops.shape(x)[0], x.dtype))
    return total / count


SPELLINGS = {
    "ops_mean": lambda x: ops.mean(x, axis=0),
    "tf_reduce": lambda x: tf.reduce_sum(x, 0) / tf.cast(tf.shape(x)[0], x.dtype),
    "helper": lambda x: keras.ops.divide(
        keras.ops.sum(x, 0), keras.ops.cast(keras.ops.shape(x)[0], x.dtype)
    ),
    "summed_across_replicas": summed_across_replicas,
}


def running_mean_model(spelling, base=keras_ctl.CTLModel, kind="mirrored", **options):
    keras.utils.set_random_seed(2)
    with devices.get(kind).scope():
        inputs = keras.Input((3,))
        hidden = RunningMean(spelling, name="running")(layers.Dense(3)(inputs))
        model = base(inputs, layers.Dense(1)(hidden))
        model.compile("sgd", "mse", **options)
    return model


@pytest.mark.parametrize("spelling", ["ops_mean", "tf_reduce", "helper"])
def test_a_running_mean_of_the_replicas_batch_is_refused_with_global(spelling):
    model = running_mean_model(spelling, batch_statistics="global")
    x = np.arange(24.0).reshape(8, 3)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(ValueError) as raised:
        model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0)
    message = str(raised.value)
    assert "`running/mean`" in message
    assert 'batch_statistics="per_replica"' in message
    assert "keras_ctl.all_reduce_sum" in message
    assert largest_difference(before, model.get_weights()) == 0.0


def test_a_running_mean_summed_across_replicas_equals_one_device():
    x = np.linspace(-2.0, 3.0, 30).reshape(10, 3)  # batches of 4: the last 1/1
    weights = []
    with configurations.computing_in("float64"):
        for base, kind in ((keras.Model, "default"), (keras_ctl.CTLModel, "mirrored")):
            model = running_mean_model("summed_across_replicas", base, kind)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # nothing to warn of
                model.fit(x, x[:, :1], batch_size=4, epochs=2, shuffle=False, verbose=0)
            weights.append(model.get_weights())
    assert np.any(weights[0][2] != 0)  # the running mean moved
    assert largest_difference(*weights) < 1e-12


def test_batch_norm_with_a_mask_is_refused_with_global():
    with devices.get("mirrored").scope():
        inputs = keras.Input((4,), dtype="int32")
        hidden = layers.Embedding(5, 3, mask_zero=True)(inputs)
        hidden = layers.BatchNormalization(name="masked_norm")(hidden)
        outputs = layers.Dense(1)(layers.GlobalAveragePooling1D()(hidden))
        model = keras_ctl.CTLModel(inputs, outputs)
        model.compile("sgd", "mse", batch_statistics="global")
    x = np.arange(32).reshape(8, 4) % 5
    with pytest.raises(ValueError, match="`masked_norm/moving_mean`"):
        model.fit(x, np.ones((8, 1)), batch_size=4, epochs=1, verbose=0)


def test_global_statistics_with_xla_under_replicas_are_refused_by_name():
    with devices.get("mirrored").scope():
        model = keras_ctl.CTLModel.from_model(residual_net())
        model.compile("sgd", "mse", jit_compile=True, batch_statistics="global")
    x, _ = data()
    with pytest.raises(ValueError) as raised:
        model.fit(x, np.zeros((ROWS, 3)), batch_size=BATCH, epochs=1, verbose=0)
    assert "Received: jit_compile=True under 2 replicas" in str(raised.value)
    assert "jit_compile=False" in str(raised.value)


def test_synchronized_batch_norm_is_global_already_and_not_warned_of():
    with devices.get("mirrored").scope():
        inputs = keras.Input((3,))
        hidden = layers.BatchNormalization(synchronized=True)(inputs)
        model = keras_ctl.CTLModel(inputs, layers.Dense(1)(hidden))
        model.compile("sgd", "mse")
    x = np.arange(27.0).reshape(9, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0)
    assert model.optimizer.iterations.numpy() == 3
