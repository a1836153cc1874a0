"""Which values of a replica step follow the replica's examples.

A value follows the examples when it may differ between replicas with the
examples each one has: it is computed from the input pipeline, or from a
value this step cannot see through (a function argument, a random or
stateful op, a branch). A shape follows what its tensor follows, but one
dimension of it other than 0 (the examples', keras_ctl's convention for
rows everywhere) is the same on every replica: a sequence's length. A
collective's result (a sum or a gather across replicas) is the same on
every replica too. Anything unknown counts as following the examples, and
so does a value read from the replica's own state as the step runs (a
metric's `result()`, whose variables each replica updates from its own
examples: `mark_follows`), which a variable read does not show.

It is read from what runs, never from how the code is spelled: a traced
step's graph, walked back from the value; in a step that runs eagerly,
which has no graph, the ops this thread runs, noted as they run
(`EagerNotes`, fed from TensorFlow's op callbacks: `eager_ops_noted`).
`_lookups` asks it of a sparse gradient's indices, the batch statistics
check of a value a step assigns to a layer's variable.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from keras import tree

from keras_ctl._keras import ops

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


def follows_the_examples(tensor: tf.Tensor) -> bool:
    """Whether `tensor` may differ between replicas with their examples:
    computed from the input pipeline, a random or stateful op, a function
    argument or a branch. Constants, variables, a dimension of a shape other
    than the examples' and a collective's result (the same on every
    replica) are not; in an eager step, what `EagerNotes` did not note."""
    if tf.executing_eagerly():
        notes = current_notes()
        return notes is None or notes.follows(tensor)
    marked = getattr(_eager, "marked", None) or {}
    seen: set[str] = set()
    pending = [tensor]
    while pending:
        tensor = pending.pop()
        op = tensor.op
        if tensor.name in seen or ops.is_collective(op.type):
            continue
        if (id(tensor.graph), tensor.name) in marked:
            return True
        seen.add(tensor.name)
        if op.type == "IdentityN":  # a custom gradient's: each output its input
            pending.append(op.inputs[tensor.value_index])
            continue
        if _reads_examples(op.type, op.op_def.is_stateful) or (
            op.type == "Placeholder" and op.outputs[0].dtype != tf.resource
        ):
            return True
        if op.type == "StridedSlice" and _one_dimension_not_examples(
            op.inputs[0] if op.inputs[0].op.type == "Shape" else None,
            op.inputs[1],
            op.get_attr("shrink_axis_mask"),
        ):
            continue
        pending.extend(op.inputs)
    return False


def marked_sources(tensor: tf.Tensor) -> list[str]:
    """The names given to `mark_follows` of the values `tensor` is computed
    from in this replica step, in no particular order."""
    if tf.executing_eagerly():
        notes = current_notes()
        return [] if notes is None else notes.sources(tensor)
    marked = getattr(_eager, "marked", None) or {}
    found: set[str] = set()
    seen: set[str] = set()
    pending = [tensor]
    while marked and pending:
        tensor = pending.pop()
        if tensor.name in seen or ops.is_collective(tensor.op.type):
            continue
        seen.add(tensor.name)
        name = marked.get((id(tensor.graph), tensor.name))
        if name is not None:
            found.add(name)
        pending.extend(tensor.op.inputs)
    return sorted(found)


def mark_follows(tensor: Any, name: str) -> None:
    """Notes that `tensor` follows the replica's examples in this replica
    step (`eager_ops_noted`), whatever computed it: a value of the
    replica's own state, such as a metric's `result()` read inside the
    step (each replica's metric variables hold its own examples' values,
    read by a `ReadVariableOp` that is the same for every replica in the
    graph). What is computed from it follows them too. `name` says what it
    is, in messages (`marked_sources`)."""
    if not tf.is_tensor(tensor):
        return
    if tf.executing_eagerly():
        notes = current_notes()
        if notes is not None:
            notes.mark(tensor, name)
        return
    marked = getattr(_eager, "marked", None)
    if marked is not None:
        marked[(id(tensor.graph), tensor.name)] = name


def current_notes() -> EagerNotes | None:
    """This thread's `EagerNotes` while an eager replica step runs."""
    return getattr(_eager, "notes", None)


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
        # {id: (tensor, names)}: what `mark` named, and what follows from it.
        self._sources: dict[int, tuple[tf.Tensor, frozenset[str]]] = {}

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
        if ops.is_collective(op_type):
            return
        if _reads_examples(op_type, stateful) or any(map(self.follows, inputs)):
            self._following.update((id(o), o) for o in outputs)
        names = frozenset().union(*(self.sources(t) for t in inputs))
        if names:
            self._sources.update((id(o), (o, names)) for o in outputs)

    def mark(self, tensor: tf.Tensor, name: str) -> None:
        """Notes `tensor` as following the examples (`mark_follows`)."""
        self._following[id(tensor)] = tensor
        self._sources[id(tensor)] = (tensor, frozenset({name}))

    def sources(self, tensor: tf.Tensor) -> list[str]:
        """The names of what `mark` noted that `tensor` is computed from."""
        entry = self._sources.get(id(tensor))
        return [] if entry is None else sorted(entry[1])

    def follows(self, tensor: tf.Tensor) -> bool:
        """Whether `tensor` was computed from the examples."""
        return id(tensor) in self._following

    def parts(self, tensor: tf.Tensor) -> list[tf.Tensor] | None:
        """The tensors `tensor` concatenates, or `None`."""
        entry = self._concatenated.get(id(tensor))
        return None if entry is None else entry[1]


@contextlib.contextmanager
def noting(notes: EagerNotes) -> Iterator[None]:
    """Within it, `follows_the_examples` reads `notes` on this thread."""
    _eager.notes = notes
    try:
        yield
    finally:
        _eager.notes = None


@contextlib.contextmanager
def eager_ops_noted(examples: Any) -> Iterator[None]:
    """Within it, an eager step on several replicas notes which of its
    tensors follow `examples` (its data), op by op as they run: a traced
    step's graph says it, an eager step has none. In either, the values
    marked by `mark_follows` follow them too."""
    if tf.distribute.get_strategy().num_replicas_in_sync == 1:
        yield
        return
    if not tf.executing_eagerly():
        outer = getattr(_eager, "marked", None)
        _eager.marked = {}
        try:
            yield
        finally:
            _eager.marked = outer
        return
    notes = EagerNotes(tree.flatten(examples))
    with ops.eager_ops_of_this_thread(notes.note), noting(notes):
        yield
