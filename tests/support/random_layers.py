"""Every layer of `keras.layers` that takes a `seed`, in a model of its
own, trained with `keras.Model` on one device and with `CTLModel` on
replicas or workers, drawing one device's numbers (the default), in the
default training step or the keras.io guide's step of one's own: the
matrix of seeded random layers.

`BUILDERS` maps each layer's name to its input shape and a function that
applies it; `NOT_DRAWING` names the layers with a `seed` that draw nothing
in training, with why. `coverage()` lists the layers of the installed Keras
that are in neither, so a Keras that adds one fails the suite until it is
in the matrix. `outcome(name, dtype)` is what the matrix expects of a
layer: one device's weights within a tolerance, or a refusal by name.
"""

import inspect
import zlib

import keras
import numpy as np

L = keras.layers
IMAGE, SEQUENCE = (8, 8, 3), (5, 3)
_RANGE = {"value_range": (0, 1)}


def _image(make):
    return IMAGE, lambda inputs, seed: make(seed)(inputs)


def _sequence(make):
    return SEQUENCE, lambda inputs, seed: make(seed)(inputs)


def _attention(inputs, seed):
    return L.Attention(dropout=0.3, seed=seed)([inputs, inputs])


def _mha(make):
    return SEQUENCE, lambda inputs, seed: make(seed)(inputs, inputs)


BUILDERS = {
    # The dropout family.
    "Dropout": _sequence(lambda s: L.Dropout(0.3, seed=s)),
    "AlphaDropout": _sequence(lambda s: L.AlphaDropout(0.2, seed=s)),
    "GaussianDropout": _sequence(lambda s: L.GaussianDropout(0.2, seed=s)),
    "GaussianNoise": _sequence(lambda s: L.GaussianNoise(0.3, seed=s)),
    "SpatialDropout1D": _sequence(lambda s: L.SpatialDropout1D(0.3, seed=s)),
    "SpatialDropout2D": _image(lambda s: L.SpatialDropout2D(0.3, seed=s)),
    "SpatialDropout3D": (
        (4, 4, 4, 2),
        lambda inputs, seed: L.SpatialDropout3D(0.3, seed=seed)(inputs),
    ),
    # Layers with dropout of their own.
    "Attention": (SEQUENCE, _attention),
    "MultiHeadAttention": _mha(
        lambda s: L.MultiHeadAttention(2, 4, dropout=0.3, seed=s)
    ),
    "GroupQueryAttention": _mha(
        lambda s: L.GroupQueryAttention(4, 2, 1, dropout=0.3, seed=s)
    ),
    # Keras 3.16's name for it.
    "GroupedQueryAttention": _mha(
        lambda s: L.GroupedQueryAttention(4, 2, 1, dropout=0.3, seed=s)
    ),
    "LSTM": _sequence(lambda s: L.LSTM(4, dropout=0.3, recurrent_dropout=0.3, seed=s)),
    "GRU": _sequence(lambda s: L.GRU(4, dropout=0.3, recurrent_dropout=0.3, seed=s)),
    "SimpleRNN": _sequence(
        lambda s: L.SimpleRNN(4, dropout=0.3, recurrent_dropout=0.3, seed=s)
    ),
    "LSTMCell": _sequence(
        lambda s: L.RNN(L.LSTMCell(4, dropout=0.3, recurrent_dropout=0.3, seed=s))
    ),
    "GRUCell": _sequence(
        lambda s: L.RNN(L.GRUCell(4, dropout=0.3, recurrent_dropout=0.3, seed=s))
    ),
    "SimpleRNNCell": _sequence(
        lambda s: L.RNN(L.SimpleRNNCell(4, dropout=0.3, recurrent_dropout=0.3, seed=s))
    ),
    "ConvLSTM1D": (
        (3, 6, 2),
        lambda inputs, seed: L.ConvLSTM1D(
            2, 3, dropout=0.3, recurrent_dropout=0.3, seed=seed
        )(inputs),
    ),
    "ConvLSTM2D": (
        (3, 5, 5, 2),
        lambda inputs, seed: L.ConvLSTM2D(
            2, 3, dropout=0.3, recurrent_dropout=0.3, seed=seed
        )(inputs),
    ),
    "ConvLSTM3D": (
        (2, 4, 4, 4, 1),
        lambda inputs, seed: L.ConvLSTM3D(
            2, 3, dropout=0.3, recurrent_dropout=0.3, seed=seed
        )(inputs),
    ),
    # Image augmentation.
    "AugMix": _image(lambda s: L.AugMix(**_RANGE, seed=s)),
    "CutMix": _image(lambda s: L.CutMix(seed=s)),
    "Mosaic": _image(lambda s: L.Mosaic(seed=s)),  # Keras 3.16
    "MixUp": _image(lambda s: L.MixUp(seed=s)),
    "RandAugment": _image(lambda s: L.RandAugment(**_RANGE, seed=s)),
    "RandomBrightness": _image(lambda s: L.RandomBrightness(0.2, **_RANGE, seed=s)),
    "RandomColorDegeneration": _image(
        lambda s: L.RandomColorDegeneration(0.5, **_RANGE, seed=s)
    ),
    "RandomColorJitter": _image(
        lambda s: L.RandomColorJitter(
            **_RANGE,
            brightness_factor=0.2,
            contrast_factor=0.2,
            saturation_factor=0.2,
            hue_factor=0.1,
            seed=s,
        )
    ),
    "RandomContrast": _image(lambda s: L.RandomContrast(0.3, **_RANGE, seed=s)),
    # Keras's RandomCrop returns its input uncropped in inference, which a
    # model built under a strategy runs once: a head that takes any size.
    "RandomCrop": (
        IMAGE,
        lambda inputs, seed: L.GlobalAveragePooling2D()(
            L.RandomCrop(6, 6, seed=seed)(inputs)
        ),
    ),
    "RandomElasticTransform": _image(
        lambda s: L.RandomElasticTransform(**_RANGE, seed=s)
    ),
    "RandomErasing": _image(lambda s: L.RandomErasing(**_RANGE, seed=s)),
    "RandomFlip": _image(lambda s: L.RandomFlip(seed=s)),
    "RandomGaussianBlur": _image(lambda s: L.RandomGaussianBlur(**_RANGE, seed=s)),
    "RandomGrayscale": _image(lambda s: L.RandomGrayscale(0.5, seed=s)),
    "RandomHue": _image(lambda s: L.RandomHue(0.2, **_RANGE, seed=s)),
    "RandomInvert": _image(lambda s: L.RandomInvert(**_RANGE, seed=s)),
    "RandomPerspective": _image(lambda s: L.RandomPerspective(seed=s)),
    "RandomPosterization": _image(lambda s: L.RandomPosterization(4, **_RANGE, seed=s)),
    "RandomRotation": _image(lambda s: L.RandomRotation(0.2, seed=s)),
    "RandomSaturation": _image(lambda s: L.RandomSaturation(0.5, **_RANGE, seed=s)),
    "RandomSharpness": _image(lambda s: L.RandomSharpness(0.5, **_RANGE, seed=s)),
    "RandomShear": _image(lambda s: L.RandomShear(0.2, 0.2, seed=s)),
    "RandomTranslation": _image(lambda s: L.RandomTranslation(0.1, 0.1, seed=s)),
    "RandomZoom": _image(lambda s: L.RandomZoom(0.2, seed=s)),
    "Solarization": _image(lambda s: L.Solarization(0.2, 0.2, **_RANGE, seed=s)),
}
# The layers of the installed Keras (a later one adds some).
BUILDERS = {name: built for name, built in BUILDERS.items() if hasattr(L, name)}
# Layers that take a `seed` and draw nothing in training: why.
NOT_DRAWING = {
    "JaxLayer": "wraps a JAX function; not a layer of the TensorFlow backend",
}


# Layers refused under `random_draws="as_one_device"`, and the start of
# the message: one device's draws mix the global batch's examples (MixUp and
# CutMix shuffle the batch), or are each replica thread's own (AugMix's
# Python `random.choice`), or TensorFlow's own ops for a static batch size
# (RandomElasticTransform).
_SHUFFLE = 'compile(random_draws="as_one_device") cannot shuffle the replica\'s rows'
REFUSED = {
    "AugMix": 'compile(random_draws="as_one_device") cannot draw Python\'s '
    "`random.choice`",
    "CutMix": _SHUFFLE,
    "MixUp": _SHUFFLE,
    "RandomElasticTransform": 'compile(random_draws="as_one_device") cannot draw '
    "`keras.layers.RandomElasticTransform`'s",
    "Mosaic": 'compile(random_draws="as_one_device") cannot draw '
    "`keras.layers.Mosaic`'s",
}
REFUSED = {name: start for name, start in REFUSED.items() if name in BUILDERS}
# The refusals that come as the step runs (a shuffle of a batch whose size
# is known only then), which abort the process's collectives.
REFUSED_AS_IT_RUNS = (("CutMix", 49), ("MixUp", 49))
# Layers that differ from one device for a reason other than their draws.
DIFFER = {
    "RandAugment": "its Equalization equalizes with the histogram of the "
    "whole batch (a statistic of the batch, not a draw): 1.4e-2 alone, 2e-3 "
    "to 4e-3 in RandAugment, float32, 2 and 3 replicas",
}
# Layers that fail in float64 in Keras itself, on one device too.
KERAS_FAILS_IN_FLOAT64 = ("RandAugment", "RandomRotation")
TOLERANCE = {"float64": 1e-9, "float32": 1e-5}
# float64 within 6e-14 (the logic one device's); float32 round-off through
# the RGB-HSV conversion reaches 6e-5.
FLOAT32_TOLERANCE = {"RandomColorJitter": 1e-4, "RandomSaturation": 1e-4}


def outcome(name, dtype):
    """`("exact", tolerance)`, `("refused", message start)`, or
    `("differs", why)` / `("keras fails", why)`: what layer `name` gives
    in `dtype` under replicas drawing as one device."""
    if name in REFUSED:
        return "refused", REFUSED[name]
    if dtype == "float64" and name in KERAS_FAILS_IN_FLOAT64:
        return "keras fails", "a float32 constant meets a float64 tensor in Keras"
    if name in DIFFER:
        return "differs", DIFFER[name]
    if dtype == "float32":
        return "exact", FLOAT32_TOLERANCE.get(name, TOLERANCE["float32"])
    return "exact", TOLERANCE[dtype]


def in_suite(name):
    """The `(dtype, examples)` the suite runs layer `name` with, from a hash
    of its name, or `None` (a third of the layers; `.ci/random_layers.py`
    runs all of them, in both dtypes, on static and dynamic batches)."""
    hashed = zlib.crc32(name.encode())
    if hashed % 3:
        return None
    dtype = "float32" if name in KERAS_FAILS_IN_FLOAT64 else "float64"
    return dtype, 48 + (hashed // 3) % 2


def check(name, dtype, examples, strategy, own_step=False):
    """`(outcome, found)`: `outcome(name, dtype)` and what `strategy`'s
    replicas gave against one device: the largest difference of the
    weights, or the start of the error's message; with `own_step`, both
    models train with the keras.io guide's `train_step`."""
    from configurations import computing_in

    import keras_ctl

    expected = outcome(name, dtype)
    if expected[0] == "keras fails":
        return expected, None
    with computing_in(dtype):
        want = trained(name, keras.Model, _one_device(), examples, own_step)
        try:
            got = trained(name, keras_ctl.CTLModel, strategy, examples, own_step)
        except ValueError as error:
            return expected, str(error)
    return expected, max(
        float(np.max(np.abs(a - b))) for a, b in zip(got, want, strict=True)
    )


def passed(expected, found):
    """Whether `found` (`check`'s) is what `expected` says."""
    kind, detail = expected
    if kind == "exact":
        return isinstance(found, float) and found <= detail
    if kind == "refused":
        return isinstance(found, str) and detail in found
    return True  # "differs" and "keras fails": reported, not asserted


def _one_device():
    import tensorflow as tf

    return tf.distribute.get_strategy()


def coverage():
    """The layers of `keras.layers` that take a `seed` and are neither in
    `BUILDERS` nor in `NOT_DRAWING`."""
    missing = []
    for name in dir(keras.layers):
        layer = getattr(keras.layers, name)
        if not (inspect.isclass(layer) and issubclass(layer, keras.layers.Layer)):
            continue
        if "seed" in inspect.signature(layer.__init__).parameters:
            if name not in BUILDERS and name not in NOT_DRAWING:
                missing.append(name)
    return missing


def trained(name, base, strategy, examples, own_step=False, batch=8, seed=1):
    """The weights of a model applying layer `name` (then a Dense head),
    `base` on `strategy` (with the keras.io guide's `train_step` when
    `own_step`), fitted one epoch on `examples` examples in the current
    dtype; `CTLModel` with its default `random_draws`."""
    from cases import keras_io_guide_model

    shape, apply = BUILDERS[name]
    if own_step:
        base = keras_io_guide_model(base, "train_step")
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(examples, *shape)).astype(keras.config.floatx())
    y = rng.normal(size=(examples, 2)).astype(keras.config.floatx())
    with strategy.scope():
        inputs = keras.Input(shape)
        outputs = L.Dense(2)(L.Flatten()(apply(inputs, seed)))
        model = base(inputs, outputs)
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    return [np.asarray(w) for w in model.get_weights()]
