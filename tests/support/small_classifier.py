"""A small functional classifier and its data, shared by the model tests
and the parameter-server child."""

import keras
import numpy as np

import keras_ctl

ATOL = 1e-5


def small_data(n=37, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.random((n, 4), dtype=np.float32)
    y = (x.sum(axis=1) > 2).astype("int32")
    return x, y


def functional(model_class=keras_ctl.CTLModel, seed=1):
    inputs = keras.Input((4,))
    h = keras.layers.Dense(
        8,
        activation="relu",
        kernel_initializer=keras.initializers.GlorotUniform(seed),
        name="hidden",
    )(inputs)
    outputs = keras.layers.Dense(
        2, kernel_initializer=keras.initializers.GlorotUniform(seed + 1), name="out"
    )(h)
    return model_class(inputs, outputs)


def compile_classifier(model, optimizer=None, **compile_kwargs):
    model.compile(
        optimizer=optimizer or keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        **compile_kwargs,
    )
    return model


def assert_weights_equal(a, b):
    for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_allclose(wa, wb, atol=ATOL, rtol=0)
