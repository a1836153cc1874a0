"""`compile(random_draws=...)` in this process: 2 replicas drawing as one
device equal `keras.Model` on one device (float32); the option is checked
and kept in the compile config (`random_draws.py`; 3 replicas, float64,
the GAN and 2 workers: `tests/end_to_end/random_draws_test.py`)."""

import warnings

import devices
import keras
import numpy as np
import pytest
import random_draws

import keras_ctl


@pytest.mark.slow  # for the fast tier's time; the suite runs it
@pytest.mark.parametrize("case", ["dense_layers", "own_step"])
def test_two_replicas_draw_as_one_device(case):
    reference = random_draws.run(case, keras.Model, devices.get("default"))
    mirrored = devices.get("mirrored")
    got = random_draws.run(
        case, keras_ctl.CTLModel, mirrored, random_draws="as_one_device"
    )
    assert random_draws.largest_difference(got, reference) <= 1e-5
    default = random_draws.run(case, keras_ctl.CTLModel, mirrored)
    assert random_draws.largest_difference(default, got) == 0
    own = random_draws.run(
        case, keras_ctl.CTLModel, mirrored, random_draws="per_replica"
    )
    assert random_draws.largest_difference(own, reference) > 1e-3


def test_an_unknown_random_draws_is_refused_by_name():
    model = random_draws.build(
        "dense_layers", keras_ctl.CTLModel, devices.get("default")
    )
    with pytest.raises(ValueError, match="random_draws.*'one_device'"):
        model.compile(loss="mse", random_draws="one_device")


def drawing_as_one_device(strategy_kind, **compile_kwargs):
    return random_draws.build(
        "dense_layers",
        keras_ctl.CTLModel,
        devices.get(strategy_kind),
        random_draws="as_one_device",
        **compile_kwargs,
    )


def test_the_option_is_kept_in_the_compile_config():
    model = drawing_as_one_device("default")
    assert model.get_compile_config()["random_draws"] == "as_one_device"


def test_drawing_as_one_device_with_xla_under_replicas_is_refused_by_name():
    model = drawing_as_one_device("mirrored", jit_compile=True)
    x, y = random_draws.data("dense_layers")
    with pytest.raises(ValueError, match="jit_compile=True under 2 replicas"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)


def _run_warned(**compile_kwargs):
    """`(result, messages)`: `random_draws.run` of the dense layers on 2
    replicas, and the messages of the per-replica draws warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = random_draws.run(
            "dense_layers",
            keras_ctl.CTLModel,
            devices.get("mirrored"),
            **compile_kwargs,
        )
    drawn = [str(w.message) for w in caught if "draws its own random" in str(w.message)]
    return result, drawn


@pytest.mark.slow  # for the fast tier's time; the suite runs it
def test_the_default_with_xla_under_replicas_draws_per_replica_and_warns_once():
    default, drawn = _run_warned(jit_compile=True)
    assert len(drawn) == 1
    assert "jit_compile=True under 2 replicas" in drawn[0]
    assert 'random_draws="per_replica"' in drawn[0]
    declared, silent = _run_warned(jit_compile=True, random_draws="per_replica")
    assert silent == []
    assert random_draws.largest_difference(default, declared) == 0


@pytest.mark.slow  # for the fast tier's time; the suite runs it
def test_a_layer_the_step_builds_seeds_its_dropout_as_on_one_device():
    # keras.io's speech transformer: its step builds MultiHeadAttention,
    # whose Dropout, made without a seed, draws one from Python's `random`
    # once, for every replica (a draw of the step would be refused).
    import configurations
    import numpy as np
    import tensorflow as tf

    def attending(base):
        class Attending(base):
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                self.attention = keras.layers.MultiHeadAttention(2, 4, dropout=0.3)
                self.head = keras.layers.Dense(1)

            def call(self, x):
                return self.head(x)

            def train_step(self, data):
                x, y = data
                with tf.GradientTape() as tape:
                    # Only the step calls the attention: it builds it.
                    attended = self.attention(x, x, training=True)
                    error = self(attended) - y
                    loss = keras.ops.mean(keras.ops.square(error))
                gradients = tape.gradient(loss, self.trainable_variables)
                self.optimizer.apply(gradients, self.trainable_variables)
                return {"loss": loss}

        return Attending

    def fitted(base, strategy):
        keras.utils.set_random_seed(3)
        with strategy.scope():
            model = attending(base)()
            model.compile(keras.optimizers.Adam(0.01))
        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(9, 3, 4)), rng.normal(size=(9, 3, 1))
        history = model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
        return model.get_weights(), history.history["loss"]

    with configurations.computing_in("float64"):
        expected, expected_loss = fitted(keras.Model, devices.get("default"))
        got, loss = fitted(keras_ctl.CTLModel, devices.get("mirrored"))
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-9)


@pytest.mark.parametrize("private_function", ["kept", "missing"])
def test_an_elastic_transform_is_refused_by_name_on_any_keras(
    private_function, monkeypatch
):
    # "missing": a Keras without the backend's `elastic_transform`, whose
    # row then wraps the public layer's `transform_images`.
    from keras_ctl._keras import names
    from keras_ctl._keras import replacements

    if private_function == "missing":
        rows = [
            r._replace(owner=lambda: names.module("keras.src.no_such_image"))
            if r.fallback
            else r
            for r in replacements.REPLACEMENTS
        ]
        monkeypatch.setattr(replacements, "REPLACEMENTS", tuple(rows))
    layer = keras.layers.RandomElasticTransform
    own = layer.transform_images
    with devices.get("mirrored").scope():
        inputs = keras.Input((8, 8, 1))
        h = layer(factor=1.0, scale=1.0, seed=1)(inputs)
        outputs = keras.layers.Dense(1)(keras.layers.Flatten()(h))
        model = keras_ctl.CTLModel(inputs, outputs)
        model.compile(optimizer="sgd", loss="mse")
    x = np.zeros((16, 8, 8, 1), "float32")
    with pytest.raises(ValueError, match="RandomElasticTransform`'s displacement"):
        model.fit(x, x[:, 0, 0], batch_size=8, epochs=1, verbose=0)
    assert layer.transform_images is own
