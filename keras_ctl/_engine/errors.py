"""TensorFlow's run-time errors that bad data causes, explained.

A label out of range fails deep inside a traced step, with a graph trace
that names no argument. The step functions re-raise it as a `ValueError`
that says what was received and what to do; the original error stays
chained (`raise ... from error`).
"""

import re

import tensorflow as tf

# `tf.nn.sparse_softmax_cross_entropy_with_logits` on CPU (TF 2.18-2.21);
# on GPU such a label gives NaN instead.
_LABEL_OUT_OF_RANGE = re.compile(
    r"Received a label value of (-?\d+) which is outside the valid range of "
    r"\[0, (\d+)\)"
)


def explained(error: Exception) -> ValueError | None:
    """Returns a `ValueError` explaining `error`, or `None` if it is not one
    of the errors this module knows."""
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
    return None
