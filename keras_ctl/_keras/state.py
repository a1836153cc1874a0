"""The seam's state inside a replica step, and the one way it patches Keras.

`_in_step` is this thread's record of the replica step it runs (replica
threads share the model): whether one is active, how many of its examples
are real, which optimizers apply summed gradients. `_patch_once` replaces a
Keras attribute once per process by a function that does what the original
does unless a step of keras_ctl asked otherwise.
"""

import threading

_patch_lock = threading.Lock()


def _patch_once(owner, name, replacement):
    """Replaces `owner.name` by `replacement(original)`, once per process.

    Each replacement does what the original does unless keras_ctl's step
    asked otherwise (a mark on the optimizer, a flag of the thread).
    """
    with _patch_lock:
        original = getattr(owner, name)
        if getattr(original, "_keras_ctl", False):
            return
        patched = replacement(original)
        patched._keras_ctl = True
        setattr(owner, name, patched)


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
