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
    batch, as the step weighs its gradients (`_weighed_as_one_device`).

    The tensors travel in one gather where they can (`_Rows`): each
    replica's rows side by side, one row of all of them an example, so a
    step's `x`, `y` and predictions cost one collective (and one for their
    gradients), not one each."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return structure
    if topology.needs_equal_shapes(context.strategy):
        raise ValueError(UNEQUAL_ROWS_ON_TPU)
    fraction = gradient_weight()
    leaves = tree.flatten(structure)
    wanted = [i for i, leaf in enumerate(leaves) if _gathered(leaf)]
    rows = [_keras.without_placeholder(leaves[i]) for i in wanted]
    if fraction is not None:
        rows = [_weighed_as_one_device(r, fraction, divided=True) for r in rows]
    gathered = _Rows(rows).gathered(context)
    if fraction is not None:
        gathered = [
            _weighed_as_one_device(g, fraction, divided=False) for g in gathered
        ]
    for index, value in zip(wanted, gathered):
        # The gather forgets the static shape past the rows; layers need it.
        value.set_shape([None, *leaves[index].shape[1:]])
        leaves[index] = value
    return tree.pack_sequence_as(structure, leaves)


def _gathered(leaf: Any) -> bool:
    return tf.is_tensor(leaf) and leaf.shape.rank is not None and leaf.shape.rank > 0


class _Rows:
    """Tensors of one replica's rows (the same number of rows each), put
    side by side in one matrix per dtype to gather together.

    A tensor whose dtype has no gradient (integers: labels, token ids) and
    whose width is a multiple of the first float tensor's travels in that
    tensor's matrix, its bits reinterpreted (`tf.bitcast`): a gather copies
    bits, so it comes back exact. So a step's features, labels and
    predictions make one gather. Other dtypes make their own."""

    def __init__(self, tensors: list[tf.Tensor]) -> None:
        self.tensors = tensors
        floats = [t.dtype for t in tensors if t.dtype.is_floating]
        self.carrier = floats[0] if floats else None

    def _dtype_of(self, tensor: tf.Tensor) -> tf.DType:
        carrier = self.carrier
        if (
            carrier is not None
            and tensor.dtype.is_integer
            and tensor.dtype.size % carrier.size == 0
        ):
            return carrier
        return tensor.dtype

    def gathered(self, context: tf.distribute.ReplicaContext) -> list[tf.Tensor]:
        groups: dict[tf.DType, list[int]] = {}
        for index, tensor in enumerate(self.tensors):
            groups.setdefault(self._dtype_of(tensor), []).append(index)
        by_index: dict[int, tf.Tensor] = {}
        for dtype, indices in groups.items():
            columns = [self._columns(self.tensors[i], dtype) for i in indices]
            # One gather a group: TensorFlow's gradient of a gather of
            # several tensors stacks their gradients, which fails unless
            # all shapes agree; one matrix has one.
            whole = columns[0] if len(columns) == 1 else tf.concat(columns, 1)
            whole = context.all_gather(whole, axis=0)
            widths = [_width(self.tensors[i], dtype) for i in indices]
            parts = [whole] if len(indices) == 1 else _split_columns(whole, widths)
            for i, part in zip(indices, parts):
                by_index[i] = self._restored(part, self.tensors[i], dtype)
        return [by_index[i] for i in range(len(self.tensors))]

    @staticmethod
    def _columns(tensor: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
        """`tensor` as a matrix of `dtype`, a row an example."""
        if tensor.dtype != dtype:
            tensor = tf.bitcast(tensor, dtype)
        if tensor.shape.rank == 2:
            return tensor
        return tf.reshape(tensor, [tf.shape(tensor)[0], _width(tensor, dtype)])

    @staticmethod
    def _restored(part: tf.Tensor, tensor: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
        """The gathered `part` (`_columns`) in `tensor`'s shape and dtype."""
        per_element = tensor.dtype.size // dtype.size
        extra = [per_element] if tensor.dtype != dtype and per_element > 1 else []
        if tensor.shape.rank != 2 or extra:
            inner = tensor.shape[1:]
            if inner.is_fully_defined():
                shape: Any = [-1, *inner.as_list(), *extra]
            else:
                shape = tf.concat([[-1], tf.shape(tensor)[1:], extra], 0)
            part = tf.reshape(part, shape)
        return part if tensor.dtype == dtype else tf.bitcast(part, tensor.dtype)


def _width(tensor: tf.Tensor, dtype: tf.DType) -> int | tf.Tensor:
    """Elements of `dtype` in a row of `tensor` (a wider integer takes
    several)."""
    per_element = max(1, tensor.dtype.size // dtype.size)
    inner = tensor.shape[1:].num_elements()
    if inner is not None:
        return inner * per_element
    return tf.reduce_prod(tf.shape(tensor)[1:]) * per_element


def _split_columns(matrix: tf.Tensor, widths: list[Any]) -> list[tf.Tensor]:
    sizes: Any = widths
    if not all(isinstance(w, int) for w in widths):
        sizes = tf.stack([tf.cast(w, tf.int32) for w in widths])
    return list(tf.split(matrix, sizes, axis=1))


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
