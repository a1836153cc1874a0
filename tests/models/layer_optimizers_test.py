"""A step of one's own whose layers train themselves (keras.io's
Forward-Forward, small), under 2 replicas in float64.

Each layer holds an optimizer of its own, not the model's, and the step
has it take three updates a batch on the layer's mean loss: every
`apply` is summed across replicas as the model's is (the layer's
gradient of one device's mean), so the weights equal `keras.Model` on one
device, with a replica left without examples in the last batch. A
tracker's result read inside the step is the replica's own state: added
to a variable, that variable is a batch statistic, warned of by default
naming the variable and the metric, and refused with
`batch_statistics="global"`."""

import functools
import warnings

import configurations
import devices
import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

import keras_ctl

ROWS, BATCH = 17, 8


class SelfTrained(keras.layers.Layer):
    """A dense layer that trains itself with its own optimizer."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(units, activation="tanh")
        self.optimizer = keras.optimizers.Adam(0.05)
        self.tracker = keras.metrics.Mean(name=f"{self.name}_loss")

    def call(self, x):
        return self.dense(x)

    def train_locally(self, x, target):
        for _ in range(3):
            with tf.GradientTape() as tape:
                loss = ops.mean(ops.square(self.call(x) - target))
            self.tracker.update_state(loss)
            weights = self.dense.trainable_weights
            self.optimizer.apply_gradients(zip(tape.gradient(loss, weights), weights))
        return ops.stop_gradient(self.call(x)), self.tracker.result()


def model_class(base, keeps_loss):
    class LocallyTrained(base):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.blocks = [SelfTrained(3, name="first"), SelfTrained(3, name="second")]
            self.running = keras.Variable(0.0, trainable=False, name="running")

        def call(self, x):
            for block in self.blocks:
                x = block(x)
            return x

        @tf.function
        def train_step(self, data):
            x, y = data
            for block in self.blocks:
                x, loss = block.train_locally(x, y)
                if keeps_loss:
                    self.running.assign_add(loss)
            return {"loss": self.blocks[-1].tracker.result()}

    return LocallyTrained


def trained(base, strategy, keeps_loss=False, **options):
    keras.utils.set_random_seed(3)
    rng = np.random.default_rng(4)
    x = rng.normal(size=(ROWS, 4))
    y = np.tanh(x[:, :3] - x[:, 1:])
    with strategy.scope():
        model = model_class(base, keeps_loss)()
        model.compile(optimizer="sgd", **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    said = [str(w.message) for w in caught if "batch_statistics" in str(w.message)]
    layer_weights = [w.numpy() for b in model.blocks for w in b.trainable_weights]
    iterations = [int(b.optimizer.iterations.numpy()) for b in model.blocks]
    return layer_weights, history.history["loss"], iterations, said


@functools.cache
def one_device():
    """The layers' weights do not depend on the running loss: one run."""
    with configurations.computing_in("float64"):
        return trained(keras.Model, devices.get("default"), keeps_loss=True)


def largest_difference(a, b):
    return max(float(np.max(np.abs(np.subtract(u, v)))) for u, v in zip(a, b))


def test_layers_applying_their_own_optimizers_equal_one_device():
    expected = one_device()
    with configurations.computing_in("float64"):
        got = trained(keras_ctl.CTLModel, devices.get("mirrored"))
    assert got[2] == expected[2] == [18, 18]  # 3 updates a batch, 6 batches
    assert largest_difference(got[0], expected[0]) < 1e-12
    assert largest_difference([got[1]], [expected[1]]) < 1e-12
    assert got[3] == []


def test_a_tracker_result_added_to_a_variable_is_named():
    expected = one_device()
    with configurations.computing_in("float64"):
        got = trained(keras_ctl.CTLModel, devices.get("mirrored"), keeps_loss=True)
    # The layers' updates stay one device's; the running loss is warned of
    # (before the fix, silently each replica's: the first layer's tracker).
    assert largest_difference(got[0], expected[0]) < 1e-12
    assert len(got[3]) == 1
    assert "`running` (from the result of Mean `first_loss`" in got[3][0]
    assert "A metric's result read inside the step" in got[3][0]


def test_a_tracker_result_added_to_a_variable_is_refused_with_global():
    with devices.get("mirrored").scope():
        model = model_class(keras_ctl.CTLModel, True)()
        model.compile(optimizer="sgd", batch_statistics="global")
    x = np.ones((BATCH, 4))
    with pytest.raises(ValueError) as raised:
        model.fit(x, x[:, :3], batch_size=BATCH, epochs=1, verbose=0)
    message = str(raised.value)
    assert "`running` (from the result of Mean `first_loss`" in message
    assert "keras_ctl.all_reduce_sum" in message
    assert [int(b.optimizer.iterations.numpy()) for b in model.blocks] == [0, 0]
