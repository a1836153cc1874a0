"""The seam's state inside a replica step.

`_in_step` is this thread's record of the replica step it runs (replica
threads share the model): whether one is active, how many of its examples
are real, which optimizers apply summed gradients. Every replacement in
`replacements.REPLACEMENTS` reads it, and does what Keras does unless a
step of keras_ctl asked otherwise.
"""

import threading

_in_step = threading.local()


def record_write(variable):
    """Notes that this replica step assigns `variable` (see `replica_step`'s
    `written`)."""
    written = getattr(_in_step, "written", None)
    if written is not None:
        written.add(id(variable))


def count_only_real_examples(batch_size):
    """Tells synchronized BatchNorm in this replica step that only the first
    `batch_size` examples are real (the rest is a placeholder)."""
    _in_step.real_examples = batch_size


def real_examples():
    """The number of real examples of this replica step's batch when it was
    padded with a placeholder (`count_only_real_examples`), else `None`."""
    return getattr(_in_step, "real_examples", None)
