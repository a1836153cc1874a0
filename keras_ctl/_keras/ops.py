"""TensorFlow's ops as keras_ctl reads them: the op types of
`tf.distribute`'s collectives, and the ops an eager step runs.

No public API names the ops a collective runs as (checked on TensorFlow
2.21), and none lists the ops an eager step runs: TensorFlow's op
callbacks do (a private module), in place only while the step runs.
"""

import contextlib
import threading
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

from keras_ctl._keras import names

# The op types `tf.distribute` runs its collectives as: its collective ops
# (`CollectiveReduceV2`, `CollectiveGatherV2`, ...) and NCCL's.
_COLLECTIVES = ("Collective", "Nccl")
_ALL_GATHER = "CollectiveGatherV2"


def is_collective(op_type: str) -> bool:
    """Whether `op_type` is a collective's: its result is the same on every
    replica (a sum, a gather), whatever each replica put in."""
    return op_type.startswith(_COLLECTIVES)


def is_all_gather(op_type: str) -> bool:
    """Whether `op_type` is an all-gather's, whose shape may change from
    step to step."""
    return op_type == _ALL_GATHER


# `note(op_type, inputs, attrs, outputs, stateful)`, as `EagerNotes.note`.
NoteOp = Callable[[str, list[Any], dict[str, Any], list[Any], bool], None]


@contextlib.contextmanager
def eager_ops_of_this_thread(note: NoteOp) -> Iterator[None]:
    """Within it, `note` is called for each op this thread runs eagerly (a
    function traced within is one op). `MirroredStrategy` hands its
    replica threads the caller's list of callbacks (one list for all of
    them), so the callback passes on only the ops of its own thread."""
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
        if graph is None and threading.get_ident() == thread:
            op_type = _text(op_type)
            op_def = registry.get(op_type)
            note(
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
        yield
    finally:
        names.member("tensorflow.python.framework.op_callbacks", "remove_op_callback")(
            callback
        )


def _text(name: str | bytes) -> str:
    return name.decode() if isinstance(name, bytes) else name
