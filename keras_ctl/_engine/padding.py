"""A placeholder example for a replica whose part of the batch is empty."""

from typing import Any

import tensorflow as tf
from keras import tree

from keras_ctl import _keras
from keras_ctl._replicas import num_replicas
from keras_ctl._replicas import static_rows
from keras_ctl._replicas import with_placeholder_rows


def pad_empty_batch(data: Any) -> tuple[Any, tf.Tensor]:
    """Gives a replica without examples one placeholder example of zeros.

    With several replicas the last global batch can leave a replica empty;
    gradients of some layers crash on an empty batch, yet the replica must
    join every collective. The caller zeroes the placeholder's loss and
    counts (`batch_size` is 0 for it); synchronized BatchNorm leaves it out.

    A batch whose size the trace knows (the data's batches split evenly) is
    never empty: it is returned as it is, its size a constant, and what
    guards an empty replica (`only_if_real`) is not traced.

    Returns:
        `(data, batch_size)` where `batch_size` counts the real examples.
    """
    flat = [t for t in tree.flatten(data) if t is not None]
    static = static_rows(flat[0])
    if static:
        return data, tf.constant(static, tf.int32)
    batch_size = tf.shape(flat[0])[0]
    if num_replicas() == 1:
        return data, batch_size
    missing = tf.cast(tf.equal(batch_size, 0), tf.int32)
    _keras.count_only_real_examples(batch_size)

    def pad(t: tf.Tensor | None) -> tf.Tensor | None:
        return None if t is None else with_placeholder_rows(t, missing)

    return tree.map_structure(pad, data), batch_size
