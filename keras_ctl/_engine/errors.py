"""TensorFlow's run-time errors that bad data or a replica's share of the
batch causes, explained.

A label out of range, or a variable assigned a value of another shape,
fails deep inside a traced step, with a graph trace that names no
argument. The step functions re-raise it as a `ValueError` that says what
was received and what to do; the original error stays chained
(`raise ... from error`).
"""

import os
import re
import sysconfig
from collections.abc import Iterable

import keras
import tensorflow as tf

# `tf.nn.sparse_softmax_cross_entropy_with_logits` on CPU (TF 2.18-2.21);
# on GPU such a label gives NaN instead.
_LABEL_OUT_OF_RANGE = re.compile(
    r"Received a label value of (-?\d+) which is outside the valid range of "
    r"\[0, (\d+)\)"
)
# A resource variable's assign (TF 2.18-2.21). Keras checks static shapes
# itself; a value whose rows are known only when the step runs gets here.
_ASSIGNED_ANOTHER_SHAPE = re.compile(
    r"Trying to assign to variable with tensor with wrong shape\. "
    r"Expected \[([\d,]*)\] got \[([\d,]*)\]"
)
# A collective whose replicas hold values of different sizes (TF 2.18-2.21).
_COLLECTIVE_OF_SHAPES = re.compile(
    r"Shape mismatch in the collective instance \d+\. Op at device \S+ "
    r"expected shape \[(\d*)\] but another member in the group expected "
    r"shape \[(\d*)\]"
)
# A check keras_ctl puts in a step, whose message is the whole explanation.
_OWN_CHECK = re.compile(r"assertion failed: \[keras_ctl: (.*?)\]\s*\[\[", re.DOTALL)
# The node a root error names, on the line after its message.
_NODE = re.compile(r"\{\{node ([^}]+)\}\}")
# The replica of a node of a step traced under several replicas (replica 0's
# nodes have no prefix).
_REPLICA = re.compile(r"replica_(\d+)/")
# A frame of the "defined at" trace TensorFlow gives a node.
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
# Where the frames of libraries are, not of the user's code.
_LIBRARIES = tuple(
    os.path.dirname(os.path.abspath(module.__file__)) + os.sep for module in (keras, tf)
) + (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
    os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep,
)


def explained(
    error: Exception, replicas: int = 1, logs_not_scalar: Iterable[str] = ()
) -> ValueError | None:
    """Returns a `ValueError` explaining `error`, raised by a step on
    `replicas` replicas that logs `logs_not_scalar` (their names), or
    `None` if it is not one of the errors this module knows."""
    if not isinstance(error, tf.errors.InvalidArgumentError):
        return None
    message = error.message
    label = _LABEL_OUT_OF_RANGE.search(message)
    if label:
        value, classes = label.groups()
        return ValueError(
            f"The labels `y` hold class {value}, outside the range [0, {classes}) "
            f"of the model's {classes} outputs (a sparse categorical loss takes "
            f"class indices 0 to {int(classes) - 1}). Received: a label {value} "
            f"in `y`. Map the labels to 0 to {int(classes) - 1}, or give the "
            "model's last layer as many units as there are classes."
        )
    own = _OWN_CHECK.search(message)
    if own:
        return ValueError(re.sub(r"\\(['\"])", r"\1", own.group(1)))
    shapes = _ASSIGNED_ANOTHER_SHAPE.search(message)
    if shapes:
        node = _NODE.search(message, shapes.end())
        expected, got = shapes.group(1), shapes.group(2)
        node_name = node.group(1) if node else ""
        return _assigned_another_shape(message, node_name, expected, got, replicas)
    sizes = _COLLECTIVE_OF_SHAPES.search(message)
    if sizes:
        size, other = sizes.group(1), sizes.group(2)
        return _collective_of_other_sizes(size, other, logs_not_scalar)
    return None


def _assigned_another_shape(
    message: str, node: str, expected: str, got: str, replicas: int
) -> ValueError:
    """A variable assigned, in a step, a value of another shape: under
    several replicas, most often a value with a row per example of the
    replica's share of the batch (a queue of embeddings, a buffer), which
    has other rows than one device's batch, none on an empty replica."""
    expected, got = (f"[{shape.replace(',', ', ')}]" for shape in (expected, got))
    said = (
        f"The step assigned a value of shape {got} to a variable of shape "
        f"{expected}{_user_frame(message, node)}"
    )
    if replicas == 1:
        return ValueError(
            f"{said}. Received: a value of shape {got}. Give the value the "
            "variable's shape (a batch smaller than the others, the last one, "
            "has fewer rows)."
        )
    replica = _REPLICA.match(node)
    on = f"replica {replica.group(1)} of {replicas}" if replica else "a replica"
    return ValueError(
        f"{said}. Received: a value of shape {got} on {on}. Under "
        f"{replicas} replicas each replica's step sees its share of the global "
        "batch (none when a last batch is smaller than the replicas), so a "
        "value with a row per example has other rows than on one device. "
        "Gather the rows first, `keras_ctl.all_gather(rows)` (the global "
        "batch, the same on every replica, in one device's order: the guide "
        "'Losses over the global batch'), or assign a value whose shape does "
        "not follow the batch."
    )


def _collective_of_other_sizes(
    size: str, other: str, logs_not_scalar: Iterable[str]
) -> ValueError:
    """The replicas' values of one collective of the step (the logs' sum,
    or an all-reduce of the user's) have different sizes: a value that
    follows the replica's share of the batch (a value per example)."""
    names = ", ".join(f"`{name}`" for name in sorted(logs_not_scalar))
    logs = f" (the step's logs that are not scalars: {names})" if names else ""
    return ValueError(
        "The replicas summed values of different sizes in one collective of "
        f"the step. Received: {size} values on one replica and {other} on "
        "another. The step logs or all-reduces a value whose shape follows "
        f"the replica's share of the batch, such as a value per example{logs}: "
        "no sum of the replicas' values is one device's. Log a scalar (a mean "
        "over the examples, which keras_ctl makes the global batch's), or "
        "gather the rows first, `keras_ctl.all_gather(rows)`, to log or sum "
        "the global batch's."
    )


def _user_frame(message: str, node: str) -> str:
    """`" (file, line N, in function)"`: the last frame in the user's code
    of the trace of `node` in `message`, or `""` when it has none."""
    start = message.find(f"Detected at node {node} defined at")
    end = message.find("Detected at node", start + 1)
    trace = message[start : end if end > start else len(message)]
    frames = [
        frame
        for frame in _FRAME.findall(trace if start >= 0 else "")
        if not os.path.abspath(frame[0]).startswith(_LIBRARIES)
    ]
    if not frames:
        return ""
    path, line, function = frames[-1]
    return f" ({path}, line {line}, in {function})"
