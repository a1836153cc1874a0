"""A `tf.function` of the user's own, called inside a replica step."""

import tensorflow as tf

from keras_ctl._keras import names
from keras_ctl._keras.state import _in_step
from keras_ctl._own_code import is_users_function
from keras_ctl._replicas import num_replicas


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
    own functions (an XLA-compiled replica pass) are left alone. Replaces
    `tf.function`'s `Function.__call__` (checked on TensorFlow 2.21).
    """

    def __call__(self, *args, **kwargs):
        python_function = self.python_function
        if (
            not getattr(_in_step, "active", False)
            or num_replicas() == 1
            or tf.distribute.get_replica_context() is None
            or not is_users_function(python_function)
        ):
            return original(self, *args, **kwargs)
        if names.attribute(self, "_autograph", True):
            python_function = tf.autograph.to_graph(python_function)
        return python_function(*args, **kwargs)

    return __call__
