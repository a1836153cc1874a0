"""Steps of one's own written for one device (keras.io's way) equal one
device on several replicas, empty replicas included: read as one device's
code, each replica's gradients and logs weighed by its part of the global
batch (`keras_ctl._engine.own_step`); steps written in replica shares run
as written."""

import json

import children
import configurations
import devices
import generated_steps
import keras
import numpy as np
import own_steps
import pytest
import tensorflow as tf

import keras_ctl
from keras_ctl._engine.build import _reads_as_one_device as reads_as_one_device
from keras_ctl.testing import known_to_differ

TOLERANCE = 1e-9  # float64


def test_a_step_of_ones_own_equals_one_device_on_2_replicas():
    # A layer singular at zero, a replica without examples (its NaN weighs
    # 0), local means, and a metric's result logged under another key. The
    # other steps run on 3 replicas below.
    case = "singular_layer"
    got = own_steps.run(case, keras_ctl.CTLModel, devices.get("mirrored"))
    expected = own_steps.run(case, keras.Model, devices.get("default"))
    assert all(np.isfinite(w).all() for w in got["weights"])
    assert generated_steps.largest_difference(got, expected) <= TOLERANCE


@pytest.mark.slow
def test_steps_of_ones_own_equal_one_device_on_3_replicas(tmp_path):
    # The last batch (1 example) leaves two of 3 replicas empty.
    out = tmp_path / "3.json"
    result = children.run([children.PYTHON, "own_steps_child.py", 3, out], timeout=900)
    assert result.returncode == 0, children.output(result)
    found = json.loads(out.read_text())
    assert set(found) == set(own_steps.CASES)
    assert max(found.values()) <= TOLERANCE, found


class _Shares(keras_ctl.CTLModel):
    @keras_ctl.written_in_shares
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            per_example = keras.losses.mean_squared_error(y, self(x))
            loss = keras_ctl.global_mean(per_example)
        keras_ctl.minimize(loss, self.trainable_variables, self.optimizer, tape)
        return {"loss": keras_ctl.ReplicaSum(loss)}


class _TensorFlowShares(keras_ctl.CTLModel):
    @keras_ctl.written_in_shares
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            per_example = keras.losses.mean_squared_error(y, self(x))

            def share():
                return tf.nn.compute_average_loss(per_example)

            loss = share()
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables))
        return {"loss": loss}


class _OneDevice(keras_ctl.CTLModel):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self(x) - y))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables))
        return {"loss": loss}


class _CallsSuper(_Shares):
    @keras_ctl.written_in_shares
    def train_step(self, data):
        return super().train_step(data)


class _Overrides(_Shares):
    def train_step(self, data):
        return _OneDevice.train_step(self, data)


class _CallsAHelper(keras_ctl.CTLModel):
    @keras_ctl.written_in_shares
    def train_step(self, data):
        return {"loss": self.shared_loss(*data)}

    def shared_loss(self, x, y):
        return keras_ctl.global_mean(tf.square(self(x) - y))


class _Marked(keras_ctl.CTLModel):
    @keras_ctl.written_in_shares
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(self(x) - y))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables))
        return {"loss": loss}


class _SetOnTheInstance(keras_ctl.CTLModel):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.train_step = self.train_step_tf  # keras.io's dual encoder

    def train_step_tf(self, data):
        x, y = data
        return {"loss": tf.reduce_mean(tf.square(self(x) - y))}


def test_which_steps_start_as_one_devices_code():
    # A step of one's own starts as one device's code whatever it calls
    # (what it calls is seen as it runs: `step_reading_test.py`); the
    # function `written_in_shares` returned, on the step or through
    # `super()`, starts in shares.
    assert reads_as_one_device(_OneDevice, "train_step")
    for declared in (_Shares, _TensorFlowShares, _CallsSuper, _CallsAHelper, _Marked):
        assert not reads_as_one_device(declared, "train_step")
    assert reads_as_one_device(_Overrides, "train_step")
    assert "written_in_shares" in dict(known_to_differ(_Marked()))["_Marked.train_step"]
    # A step set on the instance is the model's step.
    inputs = keras.Input((2,))
    instance = _SetOnTheInstance(inputs, keras.layers.Dense(1)(inputs))
    assert reads_as_one_device(instance, "train_step")
    # keras_ctl's own steps and Keras's are exact as written.
    assert not reads_as_one_device(keras_ctl.CTLModel, "train_step")
    assert not reads_as_one_device(keras_ctl.GAN, "train_step")
    assert not reads_as_one_device(_OneDevice, "test_step")


def _bfloat16_run(base, strategy, own):
    class OwnStep(base):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = tf.cast(self(x, training=True), "float32")
                loss = tf.reduce_mean(tf.square(y_pred - y))
            variables = self.trainable_variables
            self.optimizer.apply(tape.gradient(loss, variables), variables)
            return {"loss": loss}

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        keras.utils.set_random_seed(1)
        rng = np.random.default_rng(0)
        x = rng.normal(size=(13, 3)).astype("float32")
        y = rng.normal(size=(13, 1)).astype("float32")
        with strategy.scope():
            inputs = keras.Input((3,))
            hidden = keras.layers.Dense(4, activation="tanh")(inputs)
            model = (OwnStep if own else base)(inputs, keras.layers.Dense(1)(hidden))
            model.compile(
                optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=True
            )
        model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
        return model.get_weights()
    finally:
        keras.config.set_dtype_policy(previous)


@pytest.mark.slow
@pytest.mark.parametrize("own", [False, True], ids=["default_step", "own_step"])
def test_mixed_bfloat16_with_xla_on_2_replicas_is_one_device_to_its_round_off(own):
    got = _bfloat16_run(keras_ctl.CTLModel, devices.get("mirrored"), own)
    expected = _bfloat16_run(keras.Model, devices.get("default"), own)
    # bfloat16 keeps 8 bits of mantissa: 2**-8 = 3.9e-3 relative.
    for g, e in zip(got, expected):
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, e, atol=2e-3, rtol=0)


def _noisy_run(base, strategy, scale):
    """A step of one's own adding unseeded `keras.random.normal` noise."""

    class Noisy(base):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                y_pred += scale * keras.random.normal(tf.shape(y_pred), dtype="float64")
                loss = tf.reduce_mean(tf.square(y_pred - y))
            variables = self.trainable_variables
            self.optimizer.apply(tape.gradient(loss, variables), variables)
            return {"loss": loss}

    with configurations.computing_in("float64"):
        keras.utils.set_random_seed(1)
        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(13, 3)), rng.normal(size=(13, 1))
        with strategy.scope():
            inputs = keras.Input((3,))
            model = Noisy(inputs, keras.layers.Dense(1)(inputs))
            model.compile(optimizer=keras.optimizers.SGD(0.1))
        history = model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
        return model.get_weights(), history.history["loss"]


@pytest.mark.slow
def test_unseeded_random_draws_in_a_step_of_ones_own_train_on_2_replicas():
    from keras.src.backend.common import global_state

    keras_generator = global_state.get_global_attribute("global_seed_generator")
    mirrored = devices.get("mirrored")
    # Each replica thread draws from a generator of its own, created in one
    # eager step (Keras's per-thread global generator failed in the trace).
    quiet, quiet_loss = _noisy_run(keras_ctl.CTLModel, mirrored, 0.0)
    expected, expected_loss = _noisy_run(keras.Model, devices.get("default"), 0.0)
    for got, want in zip(quiet, expected):
        np.testing.assert_allclose(got, want, atol=1e-9, rtol=0)
    np.testing.assert_allclose(quiet_loss, expected_loss, atol=1e-9, rtol=0)
    noisy, noisy_loss = _noisy_run(keras_ctl.CTLModel, mirrored, 0.5)
    assert all(np.isfinite(w).all() for w in noisy) and np.isfinite(noisy_loss).all()
    assert np.abs(noisy[0] - quiet[0]).max() > 1e-3  # the noise was drawn
    # This thread's Keras generator is Keras's, as it was.
    assert global_state.get_global_attribute("global_seed_generator") is keras_generator
