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
import named_errors
import numpy as np
import pytest
import random_layers
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


class DrawsWithParameters:
    """A step of one's own scaling its inputs by `keras.random` draws whose
    parameters hold a value per row (`gamma`, `binomial`, `beta`) or whose
    logits are a row per example (`categorical`)."""

    draw = "gamma"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.draw_seed = keras.random.SeedGenerator(5)

    def train_step(self, data):
        x, y = data
        ops, shape, seed = keras.ops, keras.ops.shape(x), self.draw_seed
        per_row = 1 + ops.square(x)
        if self.draw == "gamma":
            scale = keras.random.gamma(shape, alpha=per_row, seed=seed)
        elif self.draw == "binomial":
            p = ops.sigmoid(x)
            scale = keras.random.binomial(shape, counts=3.0, probabilities=p, seed=seed)
        elif self.draw == "beta":
            scale = keras.random.beta(shape, alpha=per_row, beta=2.0, seed=seed)
        else:
            logits = ops.reshape(x, (-1, 192))[:, :4] * 3
            picked = keras.random.categorical(logits, 2, seed=seed)[:, 0]
            scale = ops.reshape(ops.one_hot(picked, 4, dtype=x.dtype), (-1, 1, 1, 4))
            scale = ops.repeat(scale, 48, axis=-1)[..., :3]
        with tf.GradientTape() as tape:
            loss = ops.mean(ops.square(self(x * scale, training=True) - y))
        self.optimizer.apply(
            tape.gradient(loss, self.trainable_weights), self.trainable_weights
        )
        return {"loss": loss}


DRAWS_WITH_PARAMETERS = ("gamma", "binomial", "beta", "categorical")


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


def trained(case, base, strategy, examples, distributed=False):
    """The weights after an epoch; with `distributed`, of data the user
    distributed (no positions come with it: the replicas exchange their
    batch sizes)."""
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
            if case in DRAWS_WITH_PARAMETERS:
                parts = (DrawsWithParameters, base)
                model_class = type("Drawing", parts, {"draw": case})
            model = model_class(inputs, L.Dense(2)(h))
            options = {} if base is keras.Model else {"random_draws": "as_one_device"}
            model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", **options)
        if distributed:
            batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
            model.fit(strategy.experimental_distribute_dataset(batches), verbose=0)
        else:
            model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        return model.get_weights()


def largest_difference(case, examples, distributed=False):
    expected = trained(case, keras.Model, tf.distribute.get_strategy(), examples)
    strategy = devices.get("mirrored")
    got = trained(case, keras_ctl.CTLModel, strategy, examples, distributed)
    return max(float(np.max(np.abs(a - b))) for a, b in zip(got, expected, strict=True))


@pytest.mark.slow  # for the fast tier's time; the suite runs it
@pytest.mark.parametrize("examples", [48, 49])
@pytest.mark.parametrize(
    "case", ["noise_layers", "masked_step", *DRAWS_WITH_PARAMETERS]
)
def test_draws_follow_the_examples_on_static_and_dynamic_batches(case, examples):
    assert largest_difference(case, examples) <= 1e-12


@pytest.mark.slow  # for the fast tier's time; the suite runs it
@pytest.mark.parametrize("examples", [48, 49])
@pytest.mark.parametrize("case", ["noise_layers", "masked_step"])
def test_draws_follow_the_examples_of_data_distributed_by_the_user(case, examples):
    assert largest_difference(case, examples, distributed=True) <= 1e-12


@pytest.mark.slow
@pytest.mark.parametrize("layer", sorted(AUGMENTATIONS))
def test_augmentation_layers_draw_as_one_device_on_static_batches(layer):
    # 48 examples: every batch static; the dynamic case is the one above.
    assert largest_difference(layer, 48) <= 1e-12


def test_a_shuffle_of_the_replicas_rows_is_refused_by_name():
    """Refused as the step is traced for static batches (48 examples as
    arrays); as it runs, for batches of any size, in
    tests/end_to_end/named_errors_test.py."""
    strategy = devices.get("mirrored")
    message = named_errors.message("shuffled_rows", strategy, 48)
    # (Keras's `ops.cond` puts a line of its own before an error raised in it.)
    assert named_errors.SHUFFLE_REFUSED in message
    assert 'random_draws="per_replica"' in message
    # A shuffle of anything else is one device's: the same on every replica.
    model = named_errors.fitted("shuffled_other", strategy, 48)
    assert model.optimizer.iterations.numpy() == 6


def test_every_layer_of_keras_that_takes_a_seed_is_in_the_matrix():
    """A Keras that adds a seeded layer fails here until the matrix
    (tests/support/random_layers.py) has it."""
    assert random_layers.coverage() == []
    assert len(random_layers.BUILDERS) >= 44
