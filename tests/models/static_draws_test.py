"""With `random_draws="as_one_device"`, a draw's rows follow the replica's
examples whether its batch size is static (every batch splits evenly: 48
examples in batches of 8) or not (49: an uneven last batch): `Dropout`,
`GaussianNoise` (which draws `ops.shape(x)`, numbers when the batch is
static), `keras.random.uniform(ops.shape(x))` in a step of one's own, and
the augmentation layers, each equal to `keras.Model` on one device (float64,
2 replicas). Before, a static batch gave every replica replica 0's numbers
(0.049 and 0.18 off)."""

import configurations
import devices
import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_ctl

L = keras.layers


class MaskedInputs:
    """A step of one's own masking its inputs with a seeded draw."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.mask_seed = keras.random.SeedGenerator(3)

    def train_step(self, data):
        x, y = data
        draw = keras.random.uniform(keras.ops.shape(x), seed=self.mask_seed)
        mask = keras.ops.cast(draw > 0.3, x.dtype)
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.ops.square(self(x * mask, training=True) - y))
        self.optimizer.apply(
            tape.gradient(loss, self.trainable_weights), self.trainable_weights
        )
        return {"loss": loss}


def _noisy(inputs):
    h = L.Dropout(0.3, seed=1)(L.Dense(8)(L.Flatten()(inputs)))
    return L.GaussianNoise(0.5, seed=2)(L.Dense(8)(h))


AUGMENTATIONS = {
    "RandomFlip": lambda: L.RandomFlip(seed=1),
    "RandomZoom": lambda: L.RandomZoom(0.2, seed=1),
    "RandomTranslation": lambda: L.RandomTranslation(0.2, 0.2, seed=1),
    "RandomContrast": lambda: L.RandomContrast(0.5, seed=1),
    "RandomBrightness": lambda: L.RandomBrightness(0.3, value_range=(0, 1), seed=1),
    "SpatialDropout2D": lambda: L.SpatialDropout2D(0.3, seed=1),
    "GaussianDropout": lambda: L.GaussianDropout(0.3, seed=1),
    "RandomGrayscale": lambda: L.RandomGrayscale(0.5, seed=1),
    "RandomShear": lambda: L.RandomShear(0.2, seed=1),
    "RandomCrop": lambda: L.RandomCrop(6, 6, seed=1),
}


def trained(case, base, strategy, examples):
    with configurations.computing_in("float64"):
        keras.utils.set_random_seed(0)
        rng = np.random.default_rng(0)
        x = rng.uniform(size=(examples, 8, 8, 3))
        y = rng.normal(size=(examples, 2))
        with strategy.scope():
            inputs = keras.Input((8, 8, 3))
            if case in AUGMENTATIONS:
                h = L.Conv2D(4, 3)(AUGMENTATIONS[case]()(inputs))
                h = L.GlobalAveragePooling2D()(h)
            else:
                h = _noisy(inputs) if case == "noise_layers" else L.Flatten()(inputs)
            model_class = base
            if case == "masked_step":
                model_class = type("Masked", (MaskedInputs, base), {})
            model = model_class(inputs, L.Dense(2)(h))
            options = {} if base is keras.Model else {"random_draws": "as_one_device"}
            model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", **options)
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        return model.get_weights()


def largest_difference(case, examples):
    expected = trained(case, keras.Model, tf.distribute.get_strategy(), examples)
    got = trained(case, keras_ctl.CTLModel, devices.get("mirrored"), examples)
    return max(float(np.max(np.abs(a - b))) for a, b in zip(got, expected, strict=True))


@pytest.mark.parametrize("examples", [48, 49])
@pytest.mark.parametrize("case", ["noise_layers", "masked_step"])
def test_draws_follow_the_examples_on_static_and_dynamic_batches(case, examples):
    assert largest_difference(case, examples) <= 1e-12


@pytest.mark.slow
@pytest.mark.parametrize("layer", sorted(AUGMENTATIONS))
def test_augmentation_layers_draw_as_one_device_on_static_batches(layer):
    # 48 examples: every batch static; the dynamic case is the one above.
    assert largest_difference(layer, 48) <= 1e-12
