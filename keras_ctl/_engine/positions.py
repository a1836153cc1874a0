"""Each example's position in its global batch, carried by `fit()`'s
batches.

A training step that draws one device's random numbers needs to know where
each replica's examples sit in the global batch; its data can carry that,
computed where the global batch is whole (`with_positions`), so no replica
asks the others for their batch sizes.
"""

from typing import Any
from typing import NamedTuple

import tensorflow as tf

from keras_ctl.distribute import topology


class PositionedBatch(NamedTuple):
    """A batch, and each example's position in its global batch (`int32`,
    a row per example), which the strategy splits with the batch."""

    batch: Any
    positions: tf.Tensor


def with_positions(dataset: tf.data.Dataset, strategy: tf.distribute.Strategy) -> Any:
    """`dataset` (`keras_dataset`'s) distributed by `strategy`, each batch a
    `PositionedBatch`; `None` where a position in the dataset's global
    batch is not a position in the global batch the replicas train on:
    on several workers, data that is not sharded by its examples (a
    `tf.data` pipeline the strategy may shard by files, each worker
    batching its own). Costs one more distribution of the dataset a
    `fit()` call (Keras distributed it before its batches could carry
    positions)."""
    if topology.of(strategy).workers > 1 and not _sharded_by_examples(dataset):
        return None
    spec = dataset.element_spec
    first = tf.nest.flatten(spec)[0]
    if not isinstance(first, tf.TensorSpec) or first.shape.rank in (None, 0):
        return None

    def positioned(*element: Any) -> PositionedBatch:
        batch = _rebuilt(spec, element)
        rows = tf.shape(tf.nest.flatten(batch)[0])[0]
        return PositionedBatch(batch, tf.range(rows, dtype=tf.int32))

    return strategy.experimental_distribute_dataset(dataset.map(positioned))


def _rebuilt(spec: Any, element: tuple[Any, ...]) -> Any:
    """The element `dataset.map` passed as `element` (a tuple it unpacks
    into arguments), in the structure of `spec`."""
    if not isinstance(spec, tuple):
        return element[0]
    return type(spec)(*element) if hasattr(spec, "_fields") else tuple(element)


def _sharded_by_examples(dataset: tf.data.Dataset) -> bool:
    """Whether the strategy shards `dataset` among workers by its examples:
    its options say `AutoShardPolicy.DATA` (Keras's pipeline of arrays
    does)."""
    policy = dataset.options().experimental_distribute.auto_shard_policy
    return bool(policy == tf.data.experimental.AutoShardPolicy.DATA)


def without_positions(data: Any) -> tuple[Any, tf.Tensor | None]:
    """`(batch, positions)` of a replica's `data`: positions `None` when
    its data does not carry them."""
    if isinstance(data, PositionedBatch):
        return data.batch, data.positions
    return data, None
