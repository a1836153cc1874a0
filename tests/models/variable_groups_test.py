"""Variable groups: `keras.optimizers.MultiOptimizer` in CTLModel steps."""

import devices
import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_ctl

# The one test that can skip: the lowest supported Keras (see .ci/compat)
# predates `MultiOptimizer`; every Keras in CI's own install has it.
pytestmark = pytest.mark.skipif(
    not hasattr(keras.optimizers, "MultiOptimizer"),
    reason="keras.optimizers.MultiOptimizer is new in Keras 3.15",
)

ATOL = 1e-5


def trunk_and_head(model_class):
    init = keras.initializers.GlorotUniform
    inputs = keras.Input((6,))
    h = keras.layers.Dense(
        8, activation="relu", name="trunk", kernel_initializer=init(1)
    )(inputs)
    outputs = keras.layers.Dense(3, name="head", kernel_initializer=init(2))(h)
    return model_class(inputs, outputs)


class TwoOptimizers(keras_ctl.CTLModel):
    """Reference: the trunk and the head updated by two separate optimizers."""

    @keras_ctl.written_in_shares
    def train_step(self, data):
        x, y = data
        with tf.GradientTape(persistent=True) as tape:
            y_pred = self(x, training=True)
            loss = keras_ctl.global_mean(
                keras.losses.sparse_categorical_crossentropy(
                    y, y_pred, from_logits=True
                )
            )
        for optimizer, layer in (
            (self.trunk_optimizer, "trunk"),
            (self.head_optimizer, "head"),
        ):
            variables = self.get_layer(layer).trainable_weights
            optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return {"step_loss": keras_ctl.ReplicaSum(loss)}


def data(n=75):
    rng = np.random.default_rng(0)
    x = rng.random((n, 6), dtype=np.float32)
    return x, (x[:, :3].argmax(axis=1)).astype("int32")


def multi_optimizer():
    return keras.optimizers.MultiOptimizer(
        keras.optimizers.OptimizerMap(
            default_optimizer=keras.optimizers.SGD(0.1),
            optimizer_map={"head/.*": keras.optimizers.Adam(1e-2)},
        )
    )


@pytest.mark.parametrize("kind", ["default", "mirrored"])
def test_multi_optimizer_equals_two_separate_optimizers(kind):
    x, y = data()
    keras.utils.set_random_seed(0)
    reference = trunk_and_head(TwoOptimizers)
    reference.trunk_optimizer = keras.optimizers.SGD(0.1)
    reference.head_optimizer = keras.optimizers.Adam(1e-2)
    reference.compile(optimizer="sgd")
    for optimizer, layer in (
        (reference.trunk_optimizer, "trunk"),
        (reference.head_optimizer, "head"),
    ):
        optimizer.build(reference.get_layer(layer).trainable_weights)
    reference.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)

    keras.utils.set_random_seed(0)
    with devices.get(kind).scope():
        model = trunk_and_head(keras_ctl.CTLModel)
        model.compile(
            optimizer=multi_optimizer(),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)

    for got, want in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    assert np.all(np.diff(history.history["loss"]) < 0)
    sgd, adam = model.optimizer.optimizers
    # 2 epochs of ceil(75 / 8) steps, each optimizer on its own group.
    assert int(sgd.iterations.numpy()) == int(adam.iterations.numpy()) == 20
