"""The global batch on every replica: rows gathered across replicas."""

from typing import Any

import tensorflow as tf
from keras import tree

from keras_ctl import _keras
from keras_ctl._replicas import gradient_weight
from keras_ctl._replicas import weighed_by_fraction
from keras_ctl.distribute import topology

UNEQUAL_ROWS_ON_TPU = (
    "Expected a strategy whose replicas may hold different numbers of rows "
    'for `keras_ctl.all_gather` and `compute_loss_over="global_batch"`. '
    "Received: a TPUStrategy, where XLA needs one shape on every replica and "
    "a replica without examples leaves its placeholder row out. Feed static "
    "batches (padded to whole global batches with sample weight 0, "
    "docs/guides/tpu.md), gather with "
    "`tf.distribute.get_replica_context().all_gather(values, axis=0)` and "
    "give the padded rows weight 0 in the loss."
)


def global_batch(structure: Any) -> Any:
    """`structure` with every tensor of rank >= 1 replaced by its rows of
    every replica, replica 0's first; other leaves (`None`, scalars) stay.
    A replica without examples adds no row (its placeholder is left out).
    The gradient is `ReplicaContext.all_gather`'s: what every replica's loss
    asks of a replica's rows, summed; in a step of one's own read as one
    device's code, each replica's ask weighed by its part of the global
    batch, as the step weighs its gradients (`_weighed_as_one_device`)."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return structure
    if topology.needs_equal_shapes(context.strategy):
        raise ValueError(UNEQUAL_ROWS_ON_TPU)
    fraction = gradient_weight()
    return tree.map_structure(
        lambda leaf: _rows_of_every_replica(context, leaf, fraction), structure
    )


def _rows_of_every_replica(
    context: tf.distribute.ReplicaContext, leaf: Any, fraction: tf.Tensor | None
) -> Any:
    if not tf.is_tensor(leaf) or leaf.shape.rank == 0:
        return leaf
    rows = _keras.without_placeholder(leaf)
    if fraction is not None:
        rows = _weighed_as_one_device(rows, fraction, divided=True)
    # One gather a tensor: TensorFlow's gradient of a gather of several
    # tensors stacks their gradients, which fails unless all shapes agree.
    gathered = context.all_gather(rows, axis=0)
    if fraction is not None:
        gathered = _weighed_as_one_device(gathered, fraction, divided=False)
    # The gather forgets the static shape past the rows; layers need it.
    gathered.set_shape([None, *leaf.shape[1:]])
    return gathered


def _weighed_as_one_device(
    value: tf.Tensor, fraction: tf.Tensor, divided: bool
) -> tf.Tensor:
    """`value`, whose gradient is weighed by `fraction` (the gathered rows:
    what this replica's loss asks of every replica's rows, weighed as the
    step weighs this replica's gradients) or divided by it (this replica's
    own rows, which the step multiplies back). So every replica's loss asks
    of a replica's rows with the weight it has in one device's loss, as
    `_replicas.sum_read_as_one_device` does for a sum."""

    @tf.custom_gradient  # type: ignore[untyped-decorator]
    def weighed(value: tf.Tensor) -> Any:
        def gradient(upstream: tf.Tensor) -> tf.Tensor:
            if divided:
                return tf.math.divide_no_nan(
                    upstream, tf.cast(fraction, upstream.dtype)
                )
            return weighed_by_fraction(upstream, fraction)

        return tf.identity(value), gradient

    return weighed(value)


def row_offset(values: tf.Tensor) -> tf.Tensor:
    """Where this replica's rows of `values` start in `global_batch`'s:
    the rows of the replicas before it (0 on one replica)."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return tf.constant(0, tf.int32)
    if topology.needs_equal_shapes(context.strategy):
        raise ValueError(UNEQUAL_ROWS_ON_TPU)
    rows = tf.shape(_keras.without_placeholder(values))[:1]
    counts = context.all_gather(rows, axis=0)
    before = tf.range(context.num_replicas_in_sync) < context.replica_id_in_sync_group
    return tf.reduce_sum(tf.where(before, counts, tf.zeros_like(counts)))


def first_replica() -> tf.Tensor:
    """1.0 on the first replica (and on one), 0.0 on the others."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return tf.constant(1.0)
    return tf.cast(tf.equal(context.replica_id_in_sync_group, 0), tf.float32)
