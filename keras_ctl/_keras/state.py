"""The seam's state inside a replica step.

`in_step` is this thread's record of the replica step it runs (replica
threads share the model): whether one is active, how many of its examples
are real, which optimizers apply summed gradients. Every behaviour that
replaces a Keras attribute (`behaviours`, the rows of `table.REPLACEMENTS`)
reads it, and does what Keras does unless a step of keras_ctl asked
otherwise.
"""

import threading

import tensorflow as tf

in_step = threading.local()


def record_write(variable: object, value: object = None) -> None:
    """Notes that this replica step assigns `variable` (see `replica_step`'s
    `written`), and the tensor `value` it assigns (its `assigned`)."""
    written = getattr(in_step, "written", None)
    if written is not None:
        written.add(id(variable))
    assigned = getattr(in_step, "assigned", None)
    if assigned is not None and tf.is_tensor(value):
        assigned.append((variable, value))


def count_only_real_examples(batch_size: tf.Tensor) -> None:
    """Tells synchronized BatchNorm in this replica step that only the first
    `batch_size` examples are real (the rest is a placeholder)."""
    in_step.real_examples = batch_size


def real_examples() -> tf.Tensor | None:
    """The number of real examples of this replica step's batch when it was
    padded with a placeholder (`count_only_real_examples`), else `None`."""
    return getattr(in_step, "real_examples", None)


def without_placeholder(values: tf.Tensor) -> tf.Tensor:
    """`values` (batch first) without the placeholder rows of an empty
    replica's batch: all of them when the batch has real examples, none
    when it had none. Rows are not sliced to `real_examples()`: a step may
    stack several batches (a GAN's real and generated images), so only
    "empty or not" is known of the rows it passes."""
    real = real_examples()
    if real is None:
        return values
    return values[: tf.where(real > 0, tf.shape(values)[0], 0)]
