"""Under several workers, only the chief writes to the user's paths.

A script written for one machine passes the same paths on every worker:
Keras's `TensorBoard` and `CSVLogger`, and `model.save()` (which
`ModelCheckpoint` calls). Every worker still writes (saving may read
variables through collectives), the chief to the user's path and the others
into a private temporary folder that is removed after, as tf.keras did.
"""

import contextlib
import os
import tempfile

import keras

from keras_ctl.distribute import topology

# Callbacks that write files of their own, and the attribute naming where.
_PATH_ATTRIBUTES = (
    (keras.callbacks.TensorBoard, "log_dir"),
    (keras.callbacks.CSVLogger, "filename"),
)


def writes_aside(strategy):
    """Whether this process writes aside: a worker other than the chief."""
    here = topology.of(strategy)
    return here.workers > 1 and not here.chief


@contextlib.contextmanager
def path_for_this_worker(path, strategy):
    """Yields `path` on the chief, or a path of the same name in a
    temporary folder on the other workers, removed at the end."""
    if not writes_aside(strategy):
        yield path
        return
    with _private_folder() as folder:
        yield os.path.join(folder, os.path.basename(os.path.normpath(str(path))))


def with_chief_only_backups(callbacks, strategy, chief_only_backup):
    """`callbacks`, with each `keras.callbacks.BackupAndRestore` replaced
    under several workers by `chief_only_backup` (keras_ctl's
    `BackupAndRestore`) with the same arguments: it reads and writes the
    same files, every worker restores from `backup_dir` and only the chief
    writes there (Keras's own would have every worker write the same files
    at once)."""
    if callbacks is None or topology.of(strategy).workers == 1:
        return callbacks
    return [
        chief_only_backup(
            c.backup_dir,
            save_freq=c.save_freq,
            double_checkpoint=c.double_checkpoint,
            delete_checkpoint=c.delete_checkpoint,
            save_on_signals=(),  # Keras's callback leaves signals alone
        )
        if type(c) is keras.callbacks.BackupAndRestore
        else c
        for c in callbacks
    ]


@contextlib.contextmanager
def callbacks_write_aside(callbacks, strategy):
    """Within it, on workers other than the chief, each of `callbacks` that
    writes files writes them into a temporary folder, removed at the end.
    The callbacks are the user's objects, given their paths back after."""
    if not writes_aside(strategy):
        yield
        return
    changed = []
    with _private_folder() as folder:
        for index, callback in enumerate(callbacks or ()):
            for kind, attribute in _PATH_ATTRIBUTES:
                if isinstance(callback, kind):
                    path = getattr(callback, attribute)
                    changed.append((callback, attribute, path))
                    name = os.path.basename(os.path.normpath(str(path)))
                    os.makedirs(os.path.join(folder, str(index)), exist_ok=True)
                    setattr(callback, attribute, os.path.join(folder, str(index), name))
        try:
            yield
        finally:
            for callback, attribute, path in changed:
                setattr(callback, attribute, path)


def _private_folder():
    """A temporary folder of this worker's own, removed at the end."""
    return tempfile.TemporaryDirectory(
        prefix="keras_ctl_worker_", ignore_cleanup_errors=True
    )
