"""Variables that parameter servers shard: per-shard gradients and
updates, whole reads; and the record of a step's writes."""

from collections.abc import Iterable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from keras_ctl._keras import names
from keras_ctl._keras.behaviours import registered
from keras_ctl._keras.state import record_write


@registered
def write_records(original):
    """A Keras variable assigned in a replica step is noted there, with the
    value assigned (`record_write`): the logs re-read only the metrics a
    step updated, and a training step's batch statistics are found.

    Replaces `backend.tensorflow.core.Variable._direct_assign`, where every
    Keras `assign`, `assign_add` and `assign_sub` ends (checked on Keras
    3.15.1).
    """

    def direct_assign(self, value):
        record_write(self, value)
        return original(self, value)

    return direct_assign


def gradients(
    tape: tf.GradientTape, target: tf.Tensor, variables: Iterable[keras.Variable]
) -> list[tf.Tensor | tf.IndexedSlices | None]:
    """`tape.gradient(target, variables)`, for variables sharded across
    parameter servers too.

    A Keras variable gives the tape its TensorFlow variable's `handle`
    (`backend.tensorflow.core.Variable.handle`); a variable that a
    `variable_partitioner` split is a `ShardedVariable`, which has none. Its
    gradient is taken with respect to each shard and put back together
    (rows in shard order), so the optimizer updates the whole variable as
    Keras would (`ShardedVariable.assign_sub` and `scatter_sub` split the
    update again). Checked on Keras 3.12.0 and 3.15.1.
    """
    variables = list(variables)
    sources: list[Any] = []
    shards: list[list[Any]] = []
    for variable in variables:
        parts = _shards_of(variable)
        shards.append(parts)
        sources.extend(parts if parts else [variable])
    flat = iter(tape.gradient(target, sources))
    result = []
    for variable, parts in zip(variables, shards):
        if not parts:
            result.append(next(flat))
            continue
        result.append(_joined([next(flat) for _ in parts], parts, variable))
    return result


def _shards_of(variable):
    value = _tf_variable(variable)
    if getattr(value, "is_sharded_variable", False):
        return list(value.variables)
    return []


def _joined(parts, shards, variable):
    """One gradient for a sharded variable from its shards' gradients."""
    if all(g is None for g in parts):
        return None
    parts = [
        tf.zeros_like(shard) if g is None else g for g, shard in zip(parts, shards)
    ]
    if not any(isinstance(g, tf.IndexedSlices) for g in parts):
        return tf.concat(parts, axis=0)
    values, indices, offset = [], [], 0
    for g, shard in zip(parts, shards):
        if isinstance(g, tf.IndexedSlices):
            values.append(g.values)
            indices.append(tf.cast(g.indices, tf.int64) + offset)
        else:
            values.append(g)
            indices.append(tf.range(shard.shape[0], dtype=tf.int64) + offset)
        offset += shard.shape[0]
    shape = tf.constant([int(d) for d in variable.shape], tf.int64)
    return tf.IndexedSlices(tf.concat(values, 0), tf.concat(indices, 0), shape)


@registered
def sharded_updates(original):
    """The optimizer updates a variable sharded across parameter servers.

    `TFOptimizer._distributed_tf_update_step` wraps each update in
    `strategy.extended.update(variable, ...)`, which places it next to the
    variable and fails for a `ShardedVariable` ("doesn't support being used
    as a reference"). Its update runs as is instead: the `ShardedVariable`
    splits `assign_sub`/`scatter_sub` across its shards, each on its own
    server. Checked on Keras 3.12.0 and 3.15.1.
    """

    def update_step(self, distribution, grads_and_vars, learning_rate):
        grads_and_vars = list(grads_and_vars)
        if not any(_sharded(v) for _, v in grads_and_vars):
            return original(self, distribution, grads_and_vars, learning_rate)
        plain = []
        for grad, variable in grads_and_vars:
            if _sharded(variable):
                self.update_step(grad, variable, learning_rate)
            else:
                plain.append((grad, variable))
        return original(self, distribution, plain, learning_rate)

    return update_step


def _sharded(variable):
    return getattr(variable, "is_sharded_variable", False)


def _tf_variable(variable):
    """The TensorFlow variable behind a Keras one (`value` may cast it)."""
    return names.attribute(variable, "_value", None)


def _sharded_keras_variable(variable):
    return _sharded(_tf_variable(variable))


@registered
def whole_sharded_array(original):
    """A Keras variable sharded across parameter servers reads as its whole
    value in `np.asarray(variable)` (what `model.save()` and
    `get_weights()` use).

    `KerasVariable.__array__` calls the TensorFlow variable's `__array__`,
    which a `ShardedVariable` lacks; its `numpy()` joins the shards.
    Replaces `backend.tensorflow.core.Variable.__array__` (checked on Keras
    3.12.0 and 3.15.1).
    """

    def __array__(self, dtype=None):
        if _sharded_keras_variable(self):
            return np.asarray(_tf_variable(self).numpy(), dtype=dtype)
        return original(self, dtype)

    return __array__


@registered
def whole_sharded_checkpoint(original):
    """A Keras variable sharded across parameter servers is saved in a
    checkpoint as one tensor, which restores under any strategy (`assign`
    splits it again).

    `KerasVariable._serialize_to_tensors` gives the TensorFlow variable's,
    or the variable itself as a tensor with a device: a `ShardedVariable`
    has neither. Replaces `backend.tensorflow.core.Variable.
    _serialize_to_tensors` (checked on Keras 3.12.0 and 3.15.1).
    """

    def _serialize_to_tensors(self):
        if _sharded_keras_variable(self):
            return {"VARIABLE_VALUE": tf.convert_to_tensor(_tf_variable(self))}
        return original(self)

    return _serialize_to_tensors
