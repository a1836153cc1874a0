"""Sparse gradients of tables looked up once a batch.

A table looked up for the batch's examples (`Embedding(tokens)`) gets a
gradient with a slice a lookup: one device's slices are the replicas'
slices put together, which is how `tf.distribute` sums `IndexedSlices`. A
table looked up once a batch (a position embedding, `emb(arange(T))`)
gets one slice a position on one device but one a position and replica
summed that way; Keras's sparse optimizers (Adam squares each slice apart)
then differ from one device. Such a gradient's values are summed across
replicas instead, as a dense tensor: one slice a position, as on one device.

Which of the two a lookup is, is whether its indices follow the examples
(`_example_dependence`, read from what runs). Anything unknown counts as
following them, which is how every sparse gradient was summed before. In
a step that runs eagerly each replica decides apart, so the replicas
agree on the decision before they sum (`agreed`).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from keras_ctl._example_dependence import current_notes
from keras_ctl._example_dependence import follows_the_examples


def looked_up_once_a_batch(indices: tf.Tensor) -> bool:
    """Whether the gradient slices' `indices` are the same on every replica,
    whatever examples each replica has: computed from constants, variables
    and the batch's dimensions other than the number of examples."""
    return not follows_the_examples(indices)


def lookups(indices: tf.Tensor) -> list[tuple[tf.Tensor, bool]]:
    """The indices of each lookup a sparse gradient holds, with whether it
    is once a batch: TensorFlow puts the slices of a table looked up
    several times together (a concatenation), and a table can be looked up
    for the examples and once a batch in one step."""
    if looked_up_once_a_batch(indices):
        return [(indices, True)]
    parts = _concatenated(indices)
    if parts is None:
        return [(indices, False)]
    return [found for part in parts for found in lookups(part)]


def _concatenated(tensor: tf.Tensor) -> list[tf.Tensor] | None:
    """The rows `tensor` concatenates (along axis 0), or `None`."""
    if tf.executing_eagerly():
        notes = current_notes()
        return None if notes is None else notes.parts(tensor)
    op = tensor.op
    if op.type != "ConcatV2" or tf.get_static_value(op.inputs[-1]) != 0:
        return None
    return list(op.inputs[:-1])


class SparseSum:
    """A gradient as the pieces its sum across replicas reduces (`pieces`,
    one all-reduce with the step's others) and put back (`assembled`): a
    dense gradient whole; a sparse one's lookups once a batch as their
    values, summed position by position; its other lookups as slices,
    which `tf.distribute` puts together across replicas."""

    def __init__(self, gradient: Any) -> None:
        self.gradient = gradient
        self.sparse = isinstance(gradient, tf.IndexedSlices)
        found = lookups(gradient.indices) if self.sparse else []
        self._indices = [indices for indices, _ in found]
        # Each lookup's decision, in order; the replicas agree on them.
        self.once = [once for _, once in found]

    def pieces(self) -> list[Any]:
        g = self.gradient
        if not any(self.once):
            return [g]
        if all(self.once):
            return [g.values]
        parts = list(zip(self._indices, self.once))
        values = tf.split(g.values, tf.stack([tf.shape(i)[0] for i in self._indices]))
        once = [v for v, (_, o) in zip(values, parts) if o]
        other = [(v, i) for v, (i, o) in zip(values, parts) if not o]
        return [
            tf.concat(once, 0),
            tf.IndexedSlices(
                tf.concat([v for v, _ in other], 0),
                tf.concat([i for _, i in other], 0),
                g.dense_shape,
            ),
        ]

    def assembled(self, reduced: list[Any]) -> Any:
        g = self.gradient
        if not any(self.once):
            return reduced[0]
        if all(self.once):
            return tf.IndexedSlices(reduced[0], g.indices, g.dense_shape)
        once_indices = [i for i, o in zip(self._indices, self.once) if o]
        summed, other = reduced
        return tf.IndexedSlices(
            tf.concat([summed, other.values], 0),
            tf.concat([*once_indices, other.indices], 0),
            g.dense_shape,
        )


def agreed(once: list[bool]) -> list[bool]:
    """`once`, true only where every replica found it true: an eager step
    decides on each replica apart (one collective; a traced step's
    replicas share one reading of the graph)."""
    if not tf.executing_eagerly() or not once:
        return once
    context = tf.distribute.get_replica_context()
    votes = context.all_reduce("SUM", tf.constant([float(o) for o in once]))
    replicas = float(context.num_replicas_in_sync)
    return [bool(v == replicas) for v in votes.numpy()]
