"""The ops an eager replica step runs, noted as they run.

A traced step's graph says which tensors follow the batch's examples
(`keras_ctl._example_dependence`); an eager step has none, and no public hook lists
the ops it runs. TensorFlow's op callbacks do, in place only while the
step runs. `MirroredStrategy` hands its replica threads the caller's list
of callbacks (one list for all of them), so each replica's callback notes
only the ops of its own thread.
"""

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import tensorflow as tf
from keras import tree

from keras_ctl._example_dependence import EagerNotes
from keras_ctl._example_dependence import noting
from keras_ctl._keras import names


@contextlib.contextmanager
def eager_ops_noted(examples: Any) -> Iterator[None]:
    """Within it, an eager step on several replicas notes which of its
    tensors follow `examples` (its data), for `_example_dependence`."""
    if (
        not tf.executing_eagerly()
        or tf.distribute.get_strategy().num_replicas_in_sync == 1
    ):
        yield
        return
    notes = EagerNotes(tree.flatten(examples))
    thread = threading.get_ident()
    registry = names.module("tensorflow.python.framework.op_def_registry")

    def callback(
        op_type: str,
        inputs: Any,
        attrs: Any,
        outputs: Any,
        op_name: Any = None,
        graph: Any = None,
    ) -> None:
        # Ran eagerly (a function traced within is one op), by this replica.
        if graph is None and threading.get_ident() == thread:
            op_type = _text(op_type)
            op_def = registry.get(op_type)
            notes.note(
                op_type,
                list(inputs),
                {_text(k): v for k, v in zip(attrs[::2], attrs[1::2])} if attrs else {},
                list(outputs),
                bool(op_def is not None and op_def.is_stateful),
            )

    names.member("tensorflow.python.framework.op_callbacks", "add_op_callback")(
        callback
    )
    try:
        with noting(notes):
            yield
    finally:
        names.member("tensorflow.python.framework.op_callbacks", "remove_op_callback")(
            callback
        )


def _text(name: str | bytes) -> str:
    return name.decode() if isinstance(name, bytes) else name
