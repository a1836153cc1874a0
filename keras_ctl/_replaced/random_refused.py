"""Random draws refused inside a replica step drawing as one device: the
draws no replica can make one device's, each refused by name with what to
do instead (the behaviours of the seam's rows of `shuffle`, Python's
`random`, `elastic_transform` and `Mosaic`)."""

import inspect

import tensorflow as tf

from keras_ctl._keras import random as keras_random
from keras_ctl._keras.behaviours import registered
from keras_ctl._keras.state import in_step
from keras_ctl._replaced.random_rows import static_value


@registered
def shuffle_refused_as_one_device(original):
    """Keras's TensorFlow `shuffle`, refused for the replica's rows in a
    step drawing as one device: one device's permutation of the global
    batch takes each replica's rows from every replica. Another shuffle (of
    a tensor without a row per example) is one device's already. Replaces
    the TensorFlow backend's `random.shuffle`."""

    def shuffle(x, axis=0, seed=None):
        random_rows = getattr(in_step, "random_rows", None)
        if random_rows is None:
            return original(x, axis=axis, seed=seed)
        x = tf.convert_to_tensor(x)
        length = static_value(x.shape[axis])
        rows, _, static_rows = random_rows
        if length is not None and static_rows is not None:
            if length == static_rows:
                raise ValueError(_SHUFFLE_REFUSED)
            return original(x, axis=axis, seed=seed)
        length = tf.shape(x)[axis] if length is None else length
        check = tf.debugging.Assert(
            tf.not_equal(tf.cast(length, rows.dtype), rows),
            [f"keras_ctl: {_SHUFFLE_REFUSED}"],
        )
        with tf.control_dependencies([check]):
            return original(tf.identity(x), axis=axis, seed=seed)

    return shuffle


@registered
def python_draw_refused_as_one_device(original):
    """A draw of Python's `random` in a replica step drawing as one device
    is refused: each replica thread runs (and traces) the step, so each
    draws its own numbers, which no replica can make one device's
    (`keras.layers.AugMix` picks its augmentations with `random.choice`).
    Replaces the function of Python's `random` module, for the replica
    steps' threads only. Not refused: the seed Keras draws for a seed
    generator made without one (`seed_generator.make_default_seed`, checked
    on Keras 3.12.0 and 3.15.1), as a layer the step builds makes it
    (`MultiHeadAttention`'s `Dropout`): the layer is built once, for every
    replica, so its seed is one number, as on one device."""

    def draw(*args, **kwargs):
        caller = inspect.currentframe().f_back  # type: ignore[union-attr]
        as_one_device = getattr(in_step, "random_rows", None) is not None
        if not as_one_device or keras_random.is_making_a_seed(
            caller.f_code  # type: ignore[union-attr]
        ):
            return original(*args, **kwargs)
        raise ValueError(
            'compile(random_draws="as_one_device") cannot draw Python\'s '
            f"`random.{original.__name__}` as one device. Received: a call to "
            f"`random.{original.__name__}` in the training step (keras.layers."
            "AugMix picks its augmentations so): each replica runs the step "
            "and draws its own. Draw with `keras.random` and a "
            "`keras.random.SeedGenerator` instead, or compile with "
            'random_draws="per_replica" for each replica\'s own draws.'
        )

    return draw


@registered
def image_draw_refused_as_one_device(original):
    """Keras's TensorFlow `image.elastic_transform` is refused in a replica
    step drawing as one device: it draws its displacement fields with
    TensorFlow's own random ops, for a batch whose size it reads from the
    static shape (1 when unknown), which no replica can make one device's
    (`keras.layers.RandomElasticTransform`). Replaces
    the TensorFlow backend's `image.elastic_transform`, or, in a Keras
    without it, the layer's `transform_images`."""

    def elastic_transform(*args, **kwargs):
        if getattr(in_step, "random_rows", None) is None:
            return original(*args, **kwargs)
        raise ValueError(
            'compile(random_draws="as_one_device") cannot draw '
            "`keras.layers.RandomElasticTransform`'s displacement fields as "
            "one device. Received: a call to Keras's `image.elastic_transform` "
            "in the training step, which draws with TensorFlow's own random "
            "ops for a batch of its static size. Apply it in the input "
            "pipeline (`dataset.map`) instead, or compile with "
            'random_draws="per_replica" for each replica\'s own fields.'
        )

    return elastic_transform


@registered
def batch_mixing_refused_as_one_device(original):
    """`keras.layers.Mosaic` (Keras 3.16) is refused in a replica step
    drawing as one device: it picks each example's other tiles among the
    batch's rows (a `randint` up to the batch's size), which a replica
    cannot draw from the global batch. Replaces its
    `get_random_transformation`."""

    def get_random_transformation(self, data, training=True, seed=None):
        if getattr(in_step, "random_rows", None) is None or not training:
            return original(self, data, training=training, seed=seed)
        raise ValueError(
            'compile(random_draws="as_one_device") cannot draw '
            f"`keras.layers.{type(self).__name__}`'s tiles as one device. "
            "Received: the layer in the training step, which picks each "
            "example's tiles among the batch's rows: a replica holds only "
            "its part of the batch. Apply it in the input pipeline "
            "(`dataset.map` on batches) instead, or compile with "
            'random_draws="per_replica" to mix each replica\'s own rows.'
        )

    return get_random_transformation


_SHUFFLE_REFUSED = (
    'compile(random_draws="as_one_device") cannot shuffle the '
    "replica's rows as one device does. Received: `keras.random.shuffle` of "
    "a tensor with a row per example of the replica's share of the batch. "
    "One device's permutation of the global batch takes each replica's rows "
    "from every replica: shuffle `keras_ctl.all_gather(rows)` (the global "
    "batch, the same on every replica) and keep the replica's rows "
    "(from `keras_ctl.row_offset(rows)`), or compile with "
    'random_draws="per_replica" for each replica\'s own permutation.'
)
