"""Seeded random draws in training, compared with `keras.Model` on one
device: `CTLModel.compile(random_draws="as_one_device")` on R replicas
draws, for each example, the numbers one device draws.

Each case builds its model with `base` (`keras.Model` or
`keras_ctl.CTLModel`) under a strategy; `run` trains it and returns its
weights and losses. 50 examples in batches of 16: on 3 replicas the last
batch (2 examples) leaves a replica empty and two with one example.
"""

import keras
import numpy as np
import tensorflow as tf

EXAMPLES, BATCH, EPOCHS = 50, 16, 2


class PerBatchScale(keras.layers.Layer):
    """Scales its inputs by one random number a batch (a draw of shape
    `(1,)`, written as a number: not the batch's rows)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(21)

    def call(self, inputs, training=False):
        if not training:
            return inputs
        scale = 1.0 + 0.2 * keras.random.uniform((1,), seed=self.seed_generator)
        return inputs * keras.ops.cast(scale, inputs.dtype)


def _dense_layers(inputs):
    h = keras.layers.Dense(8, activation="relu")(inputs)
    h = keras.layers.Dropout(0.4, seed=1)(h)
    h = keras.layers.GaussianNoise(0.3, seed=2)(h)
    h = keras.layers.GaussianDropout(0.2, seed=3)(h)
    h = keras.layers.AlphaDropout(0.1, seed=4)(h)
    return PerBatchScale()(h)


def _augmentation(inputs):
    layers = keras.layers
    h = layers.RandomFlip(seed=5)(inputs)
    h = layers.RandomZoom(0.2, seed=6)(h)
    h = layers.RandomTranslation(0.1, 0.1, seed=7)(h)
    h = layers.RandomContrast(0.3, value_range=(0, 1), seed=8)(h)
    h = layers.RandomBrightness(0.2, value_range=(0, 1), seed=9)(h)
    h = layers.SpatialDropout2D(0.3, seed=10)(layers.Conv2D(2, 3)(h))
    return layers.Flatten()(h)


def noisy_step(base):
    """A model whose own `train_step` adds `keras.random.normal` noise
    (a `SeedGenerator` seed) to its inputs."""

    class NoisyInputs(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.noise_seed = keras.random.SeedGenerator(11)

        def train_step(self, data):
            x, y = data
            noise = keras.random.normal(tf.shape(x), stddev=0.2, seed=self.noise_seed)
            with tf.GradientTape() as tape:
                y_pred = self(x + keras.ops.cast(noise, x.dtype), training=True)
                loss = self.compute_loss(x, y, y_pred, training=True)
            variables = self.trainable_variables
            self.optimizer.apply(tape.gradient(loss, variables), variables)
            return self.compute_metrics(x, y, y_pred, None)

    return NoisyInputs


CASES = ("dense_layers", "augmentation", "own_step")


def data(case):
    rng = np.random.default_rng(0)
    shape = (8, 8, 3) if case == "augmentation" else (6,)
    x = rng.uniform(size=(EXAMPLES, *shape)).astype(keras.config.floatx())
    y = rng.normal(size=(EXAMPLES, 1)).astype(keras.config.floatx())
    return x, y


def build(case, base, strategy, **compile_kwargs):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        if case == "augmentation":
            inputs = keras.Input((8, 8, 3))
            hidden = _augmentation(inputs)
        else:
            inputs = keras.Input((6,))
            hidden = _dense_layers(inputs)
        if case == "own_step":
            base = noisy_step(base)
        model = base(inputs, keras.layers.Dense(1)(hidden))
        model.compile(keras.optimizers.Adam(1e-3), loss="mse", **compile_kwargs)
    return model


def run(case, base, strategy, **compile_kwargs):
    """`(weights, losses)` of training `case` for `EPOCHS` epochs."""
    model = build(case, base, strategy, **compile_kwargs)
    x, y = data(case)
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, shuffle=False)
    return [w.tolist() for w in model.get_weights()], history.history["loss"]


def largest_difference(got, want):
    weights = max(
        float(np.max(np.abs(np.asarray(g) - np.asarray(w))))
        for g, w in zip(got[0], want[0], strict=True)
    )
    losses = max(abs(g - w) for g, w in zip(got[1], want[1], strict=True))
    return max(weights, losses)
