"""Sparse gradients of tables looked up once a batch.

A table looked up for the batch's examples (`Embedding(tokens)`) gets a
gradient with a slice a lookup: one device's slices are the replicas'
slices put together, which is how `tf.distribute` sums `IndexedSlices`. A
table looked up once a batch (a position embedding, `emb(arange(T))`)
gets one slice a position on one device but one a position and replica
summed that way; Keras's sparse optimizers (Adam squares each slice apart)
then differ from one device. Such a gradient's values are summed across
replicas instead, as a dense tensor: one slice a position, as on one device.

Which of the two a gradient is, is read from the traced graph: its indices
follow the batch when any op they come from reads the input pipeline (or a
value this step cannot see through: a function argument, a random or
stateful op, a branch). A shape follows what its tensor follows, but one
dimension of it other than 0 (the examples', keras_ctl's convention for
rows everywhere) is the same on every replica: a sequence's length.
Anything unknown counts as following the batch, which is how every sparse
gradient was summed before.

A step that runs eagerly has no graph: there, the ops this thread runs
are noted as they run (`EagerNotes`, which the seam feeds from
TensorFlow's op callbacks), under the same rules, and the replicas agree
on the decision before they sum (`agreed`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

# Ops whose outputs are the input pipeline's examples.
_EXAMPLES = frozenset(
    {
        "IteratorGetNext",
        "IteratorGetNextSync",
        "OptionalGetValue",
        "IteratorGetNextAsOptional",
    }
)
# Stateful ops that read a variable's value, the same on every replica.
_READS = frozenset({"ReadVariableOp", "VarHandleOp"})
# This thread's `EagerNotes` while an eager replica step runs.
_eager = threading.local()


def looked_up_once_a_batch(indices: tf.Tensor) -> bool:
    """Whether the gradient slices' `indices` are the same on every replica,
    whatever examples each replica has: computed from constants, variables
    and the batch's dimensions other than the number of examples."""
    if tf.executing_eagerly():
        notes = getattr(_eager, "notes", None)
        return notes is not None and not notes.follows(indices)
    seen: set[str] = set()
    pending = [indices]
    while pending:
        op = pending.pop().op
        if op.name in seen:
            continue
        seen.add(op.name)
        if _reads_examples(op.type, op.op_def.is_stateful) or (
            op.type == "Placeholder" and op.outputs[0].dtype != tf.resource
        ):
            return False
        if op.type == "StridedSlice" and _one_dimension_not_examples(
            op.inputs[0] if op.inputs[0].op.type == "Shape" else None,
            op.inputs[1],
            op.get_attr("shrink_axis_mask"),
        ):
            continue
        pending.extend(op.inputs)
    return True


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
        notes = getattr(_eager, "notes", None)
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


def _reads_examples(op_type: str, stateful: bool) -> bool:
    """Whether an op's outputs may differ between replicas whatever its
    inputs: the examples, a random draw (stateless ones too: their seeds
    may be the replica's), a stateful op other than a read, a branch."""
    return (
        op_type in _EXAMPLES
        or "Random" in op_type
        or op_type.startswith("Stateless")
        or (stateful and op_type not in _READS)
    )


def _one_dimension_not_examples(
    shape: tf.Tensor | None, begin: tf.Tensor, shrink_axis_mask: int
) -> bool:
    """Whether a `StridedSlice` of `shape` (a `Shape` op's output, else
    `None`) takes `shape[i]`, `i` a constant other than the examples' 0."""
    if shape is None or shrink_axis_mask != 1:
        return False
    begin = tf.get_static_value(begin)
    rank = shape.shape.num_elements()
    if begin is None or not rank or len(begin) != 1:
        return False
    return int(begin[0]) % rank != 0


class EagerNotes:
    """The tensors an eager replica step computed from its examples (or
    from another source `_reads_examples` names), noted op by op as they
    run; held until the step ends, so that their ids stay theirs."""

    def __init__(self, examples: Sequence[Any]) -> None:
        self._following = {id(t): t for t in examples if tf.is_tensor(t)}
        self._shapes: dict[int, tf.Tensor] = {}
        self._concatenated: dict[int, tuple[tf.Tensor, list[tf.Tensor]]] = {}

    def note(
        self,
        op_type: str,
        inputs: Sequence[tf.Tensor],
        attrs: dict[str, Any],
        outputs: Sequence[tf.Tensor],
        stateful: bool,
    ) -> None:
        """Notes one op that ran."""
        if op_type == "Shape":
            self._shapes.update((id(o), o) for o in outputs)
        if op_type == "ConcatV2" and int(inputs[-1]) == 0:
            self._concatenated[id(outputs[0])] = (outputs[0], list(inputs[:-1]))
        shape = self._shapes.get(id(inputs[0])) if inputs else None
        if op_type == "StridedSlice" and _one_dimension_not_examples(
            shape, inputs[1], attrs.get("shrink_axis_mask", 0)
        ):
            return
        if _reads_examples(op_type, stateful) or any(map(self.follows, inputs)):
            self._following.update((id(o), o) for o in outputs)

    def follows(self, tensor: tf.Tensor) -> bool:
        """Whether `tensor` was computed from the examples."""
        return id(tensor) in self._following

    def parts(self, tensor: tf.Tensor) -> list[tf.Tensor] | None:
        """The tensors `tensor` concatenates, or `None`."""
        entry = self._concatenated.get(id(tensor))
        return None if entry is None else entry[1]


@contextlib.contextmanager
def noting(notes: EagerNotes) -> Iterator[None]:
    """Within it, `looked_up_once_a_batch` reads `notes` on this thread."""
    _eager.notes = notes
    try:
        yield
    finally:
        _eager.notes = None


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
