"""A `tf.function` of the user's own, called inside a replica step (the
behaviour of the seam's `Function.__call__` row)."""

import contextlib
from collections.abc import Iterator

import tensorflow as tf

from keras_ctl._keras import access
from keras_ctl._keras.behaviours import registered
from keras_ctl._keras.state import in_step
from keras_ctl._own_code import is_users_function
from keras_ctl._replicas import num_replicas


@registered
def inlined_in_replica_steps(original):
    """A `tf.function` of the user's own called inside a replica step under
    several replicas runs as part of the step's own trace.

    A `train_step` decorated with `@tf.function` (or a helper it calls) is
    a nested function there, and TensorFlow refuses a collective inside it
    ("`merge_call` called while defining a new graph"): the sum of
    gradients in `optimizer.apply`, the global counts of a `Loss`. Its
    Python function is called instead, converted by AutoGraph as the
    `tf.function` would have (`Function._autograph`), in the step's trace,
    which is a `tf.function` already. keras_ctl's, Keras's and TensorFlow's
    own functions (an XLA-compiled replica pass) are left alone. So are
    they within `users_functions_inlined` (one device's run of a step that
    is measured, whose applied gradients must be the trace's own). Replaces
    `tf.function`'s `Function.__call__` (checked on TensorFlow 2.21).
    """

    def __call__(self, *args, **kwargs):
        python_function = self.python_function
        in_replica_step = (
            getattr(in_step, "active", False)
            and num_replicas() > 1
            and tf.distribute.get_replica_context() is not None
        )
        if not (
            in_replica_step or getattr(in_step, "inlining", False)
        ) or not is_users_function(python_function):
            return original(self, *args, **kwargs)
        if access.converts_with_autograph(self):
            python_function = tf.autograph.to_graph(python_function)
        return python_function(*args, **kwargs)

    return __call__


@contextlib.contextmanager
def users_functions_inlined() -> Iterator[None]:
    """Within it (this thread), a `tf.function` of the user's own runs as
    part of the caller's trace, as in a replica step."""
    previous = getattr(in_step, "inlining", False)
    in_step.inlining = True
    try:
        yield
    finally:
        in_step.inlining = previous
